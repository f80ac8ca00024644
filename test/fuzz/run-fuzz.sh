#!/bin/sh
#
# run-fuzz.sh [SECONDS] - builds the libFuzzer harnesses of test/fuzz/
# (libhcadev's sources compiled in, with ASan and UBSan) and runs each for
# SECONDS (default 30).  One line per harness: time, executions, result.
# Exits 1 if any harness found a crash (input saved under the build dir's
# artifacts/), 2 if the build failed, 0 otherwise - also when clang's
# libFuzzer runtime is missing (after a SKIPPED line).
#
# Environment:
#   HCA_FUZZ_BUILD   build dir (default: build-fuzz/ at the top of the repo)
#   HCA_FUZZ_SRC     library sources (default: src/hca_dev of the repo)
#   HCA_FUZZ_ONLY    harnesses to run (default: "fuzz_ring fuzz_svc fuzz_tcp")
#   HCA_FUZZ_FLAGS   extra libFuzzer flags, e.g. "-seed=1"
#   CC_FUZZ          compiler (default: clang)
#
# Flags and object lists are split on purpose (SC2086); artifact names are
# libFuzzer's crash-<sha1> (SC2012).
# shellcheck disable=SC2086,SC2012
set -u

secs=${1:-30}
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=${HCA_FUZZ_BUILD:-$top/build-fuzz}
src=${HCA_FUZZ_SRC:-$top/src/hca_dev}
harnesses=${HCA_FUZZ_ONLY:-"fuzz_ring fuzz_svc fuzz_tcp"}
cc=${CC_FUZZ:-clang}

case $secs in
    ''|*[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;;
esac

mkdir -p "$build/obj" || exit 2

# libFuzzer ships with Debian's clang in libclang-rt-<N>-dev: probe for it
# by linking a trivial fuzzer rather than guessing its path.
probe=$build/probe
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n)'\
'{ (void)d; (void)n; return 0; }\n' > "$probe.c"
if ! command -v "$cc" > /dev/null 2>&1 ||
   ! "$cc" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" \
        > "$probe.log" 2>&1; then
    echo "SKIPPED: clang/libFuzzer not installed ($cc -fsanitize=fuzzer" \
         "failed; on Debian 12: apt-get install clang libclang-rt-14-dev)"
    exit 0
fi

# The library's sources, as src/hca_dev/Makefile.am lists them.  The
# library needs no config.h; -std=gnu11 as configure's BASE_CFLAGS.
sources=$(sed -n '/^libhcadev_la_SOURCES[ 	]*=/,/[^\\]$/p' \
              "$src/Makefile.am" | sed 's/^libhcadev_la_SOURCES[ 	]*=//' |
          tr -d '\\')
if [ -z "$sources" ]; then
    echo "cannot read libhcadev_la_SOURCES from $src/Makefile.am" >&2
    exit 2
fi

cflags="-std=gnu11 -g -O1 -fno-omit-frame-pointer -Wall -Wextra
        -fno-sanitize-recover=undefined -D_GNU_SOURCE -I$src -I$src/shm
        -I$src/tcp"
objs=""
for s in $sources; do
    o=$build/obj/${s%.c}.o
    mkdir -p "$(dirname "$o")"
    # the library needs coverage but no main: fuzzer-no-link
    "$cc" $cflags -fsanitize=fuzzer-no-link,address,undefined \
        -c "$src/$s" -o "$o" || exit 2
    objs="$objs $o"
done
"$cc" $cflags -fsanitize=fuzzer-no-link,address,undefined \
    -c "$here/fuzz_common.c" -o "$build/obj/fuzz_common.o" || exit 2

status=0
for h in $harnesses; do
    "$cc" $cflags -fsanitize=fuzzer,address,undefined "$here/$h.c" \
        "$build/obj/fuzz_common.o" $objs -lnuma -lsodium -lpthread -lrt \
        -o "$build/$h" || exit 2

    # the inputs that once broke it (crashes/<ring|svc|tcp>-*) first: each
    # must pass now
    regress=$(ls "$here/crashes/${h#fuzz_}-"* 2>/dev/null)
    if [ -n "$regress" ] &&
       ! "$build/$h" $regress > "$build/$h.regress.log" 2>&1; then
        status=1
        printf '%-10s a reproducer of crashes/ fails again: see %s\n' \
            "$h:" "$build/$h.regress.log"
    fi

    # new inputs go to the build dir's corpus (the first directory); the
    # seeds of the repo are only read
    mkdir -p "$build/corpus/$h" "$build/artifacts/$h"
    log=$build/$h.log
    before=$(ls "$build/artifacts/$h" | wc -l)
    start=$(date +%s)
    "$build/$h" -max_total_time="$secs" -print_final_stats=1 -timeout=30 \
        -artifact_prefix="$build/artifacts/$h/" ${HCA_FUZZ_FLAGS:-} \
        "$build/corpus/$h" "$here/corpus/$h" > "$log" 2>&1
    rc=$?
    elapsed=$(( $(date +%s) - start ))

    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" |
            tail -n 1)
    if [ -z "$execs" ]; then
        # no final stats (killed): the last progress line has the count
        execs=$(sed -n 's/^#\([0-9][0-9]*\).*/\1/p' "$log" | tail -n 1)
    fi
    # with -fork=N -ignore_crashes=1 in HCA_FUZZ_FLAGS a run exits 0
    # after crashes: count the inputs it saved
    found=$(( $(ls "$build/artifacts/$h" | wc -l) - before ))
    if [ $rc -eq 0 ] && [ $found -eq 0 ]; then
        result="ok"
    else
        status=1
        what=$(grep -m 1 -E '^SUMMARY: |==FUZZ== |ERROR: libFuzzer' "$log")
        unit=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" |
               tail -n 1)
        result="CRASH (exit $rc, $found new in $build/artifacts/$h):"
        result="$result ${what:-see $log}; input: ${unit:-none}"
    fi
    printf '%-10s %4s s  %10s execs  %s\n' "$h:" "$elapsed" \
        "${execs:-?}" "$result"
done
exit $status
