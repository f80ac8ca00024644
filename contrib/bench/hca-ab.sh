#!/bin/bash
#
# hca-ab.sh - A/B comparison of two hca builds: "is any row slower?"
#
# usage: contrib/bench/hca-ab.sh [--old-rev REV | --old-build DIR]
#                                [--new-build DIR] [--reps N]
#                                [--levels uct,ucp] [-o OUT] [--build-only]
#                                [-- HCA-BENCH-OPTIONS...]
#
#   --old-rev REV    the OLD side: a git revision of this repository
#                    (default HEAD~1), built once into the cache directory
#                    <repo>/build-ab/<commit>/ (sources from `git archive`,
#                    then autogen, configure with hca-setup.sh's flags,
#                    make); a later run with the same commit reuses it
#   --old-build DIR  the OLD side: an existing hca build directory instead
#   --new-build DIR  the NEW side (default: <repo>/build, or
#                    $HCA_BUILD_DIR); brought up to date with make (built
#                    by contrib/hca-setup.sh build if it does not exist)
#   --reps N         runs per row and side (default 6: an even number
#                    balances the ABBA order; at least 2, the
#                    noise column needs two runs of the old build)
#   --levels LIST    uct, ucp, hosts (as root: the ucx_perftest rows
#                    between two namespace hosts), comma-separated
#                    (default uct,ucp)
#   -o, --out DIR    output directory (default: ./ab-out)
#   --build-only     build the two sides and stop
#   -- OPTIONS       passed on to hca-bench.sh (--long, --no-pin,
#                    --no-install)
#   -h, --help       this text
#
# The runs are hca-bench.sh's (--ab-old-build): every uct/ucp row that
# involves hca (the built-in transports are not run), the old and the new
# build back to back, the order alternating from one repetition to the
# next (old new, new old, old new, ...: ABBA), N runs each. Each side's
# ucx_perftest gets LD_PRELOAD=<its build>/src/uct/hca/.libs/libuct_hca.so
# and LD_LIBRARY_PATH=<its build>/src/hca_dev/.libs, and hca-bench.sh
# checks once per side, with LD_DEBUG=libs, that the process really loads
# that build's libuct_hca.so and libhcadev.so.0.
#
# Output: the A/B table (OUT/summary.txt, OUT/ab.tsv): per row the old
# and new medians, new/old, "slower" (latency new/old - 1, bandwidth
# old/new - 1), each build's spread over its own runs (max/min - 1: old vs
# old, new vs new; from 5 runs on without the (n-1)/4 fastest and slowest
# runs), the noise (the larger spread, at least 0.001 us), and the
# verdict: SLOWER if slower > noise; slower? if slower exceeds only the old
# build's spread (re-run with more --reps); faster; = (within the noise).
# With identical builds on a steady machine about 2% of the rows are
# SLOWER by chance at --reps 6 (3% at 3, 7% at 5, 0.3% at 8). An A/A run
# (--old-build equal to the new build) measures the noise. See
# docs/PERF.md.
# Exit status: 0; 1 if a run failed; 3 if a row is SLOWER; 2 on a usage or
# build error.
#
# Environment: HCA_BUILD_DIR, HCA_MAKE_JOBS (default: number of CPUs; the
# builds run under nice), HCA_BENCH_PORT.
#
set -uo pipefail

topdir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
benchdir=$topdir/contrib/bench
old_rev=
old_build=
new_build=${HCA_BUILD_DIR:-$topdir/build}
reps=6
levels=            # default: the matrix's ab_levels (uct,ucp)
outdir=$PWD/ab-out
build_only=no
jobs=${HCA_MAKE_JOBS:-$(nproc 2>/dev/null || echo 2)}
bench_opts=()

log() { echo "hca-ab: $*" >&2; }
die() { echo "hca-ab: error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
    --old-rev)    old_rev=${2:?}; shift ;;
    --old-build)  old_build=${2:?}; shift ;;
    --new-build)  new_build=${2:?}; shift ;;
    --reps)       reps=${2:?}; shift ;;
    --levels)     levels=${2:?}; shift ;;
    -o|--out)     outdir=${2:?}; shift ;;
    --build-only) build_only=yes ;;
    --)           shift; bench_opts=("$@"); break ;;
    -h|--help)    sed -n '3,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *)            die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
[ -n "$old_rev" ] && [ -n "$old_build" ] &&
    die "give --old-rev or --old-build, not both"
[ -z "$old_build" ] && old_rev=${old_rev:-HEAD~1}
case $reps in ''|*[!0-9]*) die "--reps wants a number" ;; esac
[ "$reps" -ge 2 ] || die "--reps must be 2 or more (the noise needs two old runs)"
# The A/B levels are the "set | ab_levels" record of the matrix that
# hca-bench.sh reads; checked here too, so that a wrong level stops the
# run before the builds rather than after them.
ab_setting() {
    awk -F'|' -v n="$1" '{ for (i = 1; i <= NF; i++) gsub(/^[ \t]+|[ \t]+$/, "", $i) }
        $1 == "set" && $2 == n { print $3 }' "$benchdir/hca-bench.matrix"
}
ab_levels=$(ab_setting ab_levels)
[ -n "$ab_levels" ] || die "no ab_levels in $benchdir/hca-bench.matrix"
ab_allowed=$ab_levels,$(ab_setting ab_levels_more)  # hosts: only when asked
levels=${levels:-$ab_levels}
for l in ${levels//,/ }; do
    case ",$ab_allowed," in *",$l,"*) ;;
    *) die "A/B level '$l': only ${ab_allowed//,/, }" ;; esac
done
abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
new_build=$(abspath "$new_build")
outdir=$(abspath "$outdir")
[ -n "$old_build" ] && old_build=$(abspath "$old_build")

# The UCX source tree hca builds against: <repo>/contrib/ucx-src/ucx-<ver>
# (gitignored; in a worktree often a symlink to the main tree's copy).
ucx_src() {
    local debver upver d
    debver=$(dpkg-query -W -f='${Version}' libucx0 2>/dev/null) ||
        die "libucx0 is not installed (run contrib/hca-setup.sh deps)"
    upver=${debver#*:}; upver=${upver%-*}; upver=${upver%%[+~]*}
    d=$topdir/contrib/ucx-src/ucx-$upver
    [ -f "$d/src/uct/base/uct_iface.h" ] ||
        die "$d missing (run contrib/hca-setup.sh deps, or symlink contrib/ucx-src to a tree that has it)"
    readlink -f "$d"
}

module_of() { echo "$1/src/uct/hca/.libs/libuct_hca.so"; }

# build_rev REV: build the revision into build-ab/<commit>/build (sources
# in build-ab/<commit>/src), unless already done; prints the build dir.
build_rev() {
    local rev=$1 commit base src bld flags
    commit=$(git -C "$topdir" rev-parse --verify -q "$rev^{commit}") ||
        die "unknown revision '$rev'"
    base=$topdir/build-ab/$commit
    src=$base/src
    bld=$base/build
    if [ -f "$base/.built" ] && [ -f "$(module_of "$bld")" ]; then
        log "old build of $rev ($commit) cached: $bld"
        echo "$bld"
        return
    fi
    flags="--enable-werror --with-ucx-src=$(ucx_src)"
    log "building $rev ($commit) in $base (configure $flags)"
    rm -rf "$base"
    mkdir -p "$src" "$bld" || die "cannot create $base"
    git -C "$topdir" archive "$commit" | tar -x -C "$src" ||
        die "git archive $commit failed"
    ln -s "$(dirname "$(ucx_src)")" "$src/contrib/ucx-src"
    (cd "$src" && nice ./autogen.sh) >"$base/build.log" 2>&1 &&
    (cd "$bld" && nice "$src/configure" $flags) >>"$base/build.log" 2>&1 &&
    nice make -C "$bld" -j"$jobs" >>"$base/build.log" 2>&1 ||
        die "build of $rev failed, see $base/build.log"
    [ -f "$(module_of "$bld")" ] || die "no $(module_of "$bld") after the build"
    echo "$commit" >"$base/.built"
    echo "$bld"
}

if [ -n "$old_build" ]; then
    [ -f "$(module_of "$old_build")" ] ||
        die "$(module_of "$old_build") missing (--old-build wants a built tree)"
else
    old_build=$(build_rev "$old_rev") || exit 2
fi

if [ -f "$(module_of "$new_build")" ]; then
    log "new build $new_build: make"
    nice make -C "$new_build" -j"$jobs" -s >&2 || die "make in $new_build failed"
else
    log "new build $new_build missing: contrib/hca-setup.sh build"
    HCA_BUILD_DIR=$new_build HCA_MAKE_JOBS=$jobs \
        nice "$topdir/contrib/hca-setup.sh" build >&2 || die "build failed"
fi
[ "$(readlink -f "$old_build")" = "$(readlink -f "$new_build")" ] &&
    log "note: old and new are the same build (an A/A run: a noise check)"

log "old: $old_build${old_rev:+ ($old_rev = $(git -C "$topdir" rev-parse --short "$old_rev^{commit}"))}"
log "new: $new_build"
[ "$build_only" = yes ] && exit 0

exec "$benchdir/hca-bench.sh" --build "$new_build" --ab-old-build "$old_build" \
    --ab-old-label "${old_rev:-$old_build}" --levels "$levels" \
    --reps "$reps" -o "$outdir" ${bench_opts[@]+"${bench_opts[@]}"}
