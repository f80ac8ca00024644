#!/bin/bash
#
# run-smoke.sh - a short check that hca works with the UCX a build tree was
# configured against (contrib/hca-setup.sh test runs it for each UCX version
# besides the system's).
#
# usage: test/smoke/run-smoke.sh [BUILD_DIR]
#
# 1. ucx_info -d of that UCX lists the hca memory domain and transport,
#    loaded the way configure found this UCX needs: with a UCX that scans
#    for modules (1.22+) through UCX_PLUGIN_PATH=<build>/src/uct/hca/modules
#    with LD_PRELOAD unset, and UCX's module log must show the build tree's
#    libuct_hca.so being loaded by the scan; otherwise through hca-run (the
#    preload).
# 2. ucx_perftest on this host, server and client each through hca-run
#    --verbose (so each prints its hca counters by fabric), for each fabric
#    (UCX_HCA_FABRIC=shm and =tcp): am_lat short 8 B, put_bw zcopy 1 MiB,
#    get zcopy 1 MiB, fadd 8 B (UCT: -x hca -d hca0).  A run passes when
#    both sides exit 0, the client prints its result line, and the counters
#    of both sides show operations over that fabric and none over the
#    other.
#
# One line per check, a summary; exit status 1 if any check failed.
#
# Environment: HCA_BUILD_DIR (default: <repo>/build), SMOKE_TIMEOUT seconds
# per process (default 60), SMOKE_LOGDIR (default: a temporary directory,
# kept when a check failed).
#
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
topsrc=$(cd "$here/../.." && pwd)
build=${1:-${HCA_BUILD_DIR:-$topsrc/build}}
build=$(cd "$build" && pwd) || { echo "run-smoke: no build directory $build" >&2; exit 2; }
hcarun=$build/contrib/hca-run
T=${SMOKE_TIMEOUT:-60}
[ -x "$hcarun" ] || { echo "run-smoke: $hcarun not built" >&2; exit 2; }

# What configure found (the build tree's Makefile).
mkvar() { sed -n "s/^$1 = //p" "$build/Makefile" | head -n 1; }
ucx_version=$(mkvar UCX_VERSION)
ucx_info=$(mkvar UCX_INFO)
ucx_perftest=$(mkvar UCX_PERFTEST)
ucx_load=$(mkvar UCX_MODULE_LOAD)
ucx_module_file=$(mkvar UCX_MODULE_FILE)

logdir=${SMOKE_LOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/hca-smoke.XXXXXX")}
mkdir -p "$logdir"
failed=0
pass=0
say() { echo "smoke: $*"; }
result() {  # PASS|FAIL name detail
    printf 'smoke: %-4s %-28s %s\n' "$1" "$2" "$3"
    if [ "$1" = PASS ]; then pass=$((pass + 1)); else failed=$((failed + 1)); fi
}

say "UCX $ucx_version ($ucx_info), hca loaded by $ucx_load; logs in $logdir"

# ------------------------------------------------------------ ucx_info -d

check_ucx_info() {
    local log=$logdir/ucx_info moddir
    if [ "$ucx_load" = scan ]; then
        moddir=$build/src/uct/hca/modules
        if [ ! -e "$moddir/$ucx_module_file" ]; then
            result FAIL "ucx_info -d, no preload" "$moddir/$ucx_module_file missing (make)"
            return
        fi
        # UCX's module loader logs, at debug level, every module it
        # dlopened ("loaded <realpath>"): that proves the scan found the
        # build tree's module (and no other copy of hca)
        env -u LD_PRELOAD UCX_PLUGIN_PATH="$moddir" UCX_TLS=hca,self \
            UCX_LOG_LEVEL=debug \
            timeout "$T" "$ucx_info" -d >"$log" 2>&1 || true
        local want loaded
        want=$(readlink -f "$moddir/$ucx_module_file")
        loaded=$(grep -o 'loaded [^ ]*libuct_hca[^ ]*' "$log" | sort -u | cut -d' ' -f2 || true)
        awk '/^# *Memory domain: hca/ { show = 1 } /^# *Transport:/ && show { print; exit } show' "$log"
        if ! grep -q '^# *Memory domain: hca$' "$log" ||
           ! grep -q '^# *Transport: hca$' "$log"; then
            result FAIL "ucx_info -d, no preload" "no hca memory domain/transport with UCX_PLUGIN_PATH=$moddir (log $log)"
        elif [ -z "$loaded" ] && ! grep -q ' DEBUG ' "$log"; then
            # a UCX built without debug logging cannot say which file
            result PASS "ucx_info -d, no preload" "hca0 listed; UCX_PLUGIN_PATH=$moddir, LD_PRELOAD unset (this UCX logs no debug messages: the file loaded is not shown)"
        elif [ "$loaded" != "$want" ]; then
            result FAIL "ucx_info -d, no preload" "hca listed, but the module loaded was '${loaded:-not logged}', not $want"
        else
            result PASS "ucx_info -d, no preload" "hca0 listed; UCX_PLUGIN_PATH=$moddir, LD_PRELOAD unset; loaded $loaded"
        fi
    else
        timeout "$T" "$hcarun" --verbose "$ucx_info" -d >"$log" 2>&1 || true
        if grep -q '^# *Memory domain: hca$' "$log" && grep -q '^# *Transport: hca$' "$log"; then
            result PASS "ucx_info -d (preload)" "hca0 listed; $(grep -o 'hca loaded by .*' "$log" | head -n 1)"
        else
            result FAIL "ucx_info -d (preload)" "no hca memory domain/transport (log $log)"
        fi
    fi
}

# ------------------------------------------------------------ ucx_perftest

# The sum of one counter field ("shm_ops", "tcp_ops") over the hca-run
# summary lines of the given logs; absent = 0.
counter() {  # field log...
    local f=$1
    shift
    grep -ho 'hca-run: hca traffic: .*' "$@" 2>/dev/null |
        awk -v f="$f" '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == f) s += kv[2] } }
                       END { printf "%d\n", s }'
}

listening() {  # port
    ss -ltn 2>/dev/null | awk '{print $4}' | grep -q ":$1\$"
}

perftest_run() {  # fabric name args...
    local fabric=$1 name=$2 other port srv rc_c rc_s log csv metric ops oops
    shift 2
    log=$logdir/${fabric}-${name//[^A-Za-z0-9_.-]/_}
    [ "$fabric" = shm ] && other=tcp || other=shm
    port=$((20000 + RANDOM % 20000))
    # the server takes the test from the client, but 1.22's checks its own
    # parameters first: a UCT test needs the transport and device there too
    UCX_HCA_FABRIC=$fabric timeout -s KILL "$T" "$hcarun" --verbose \
        "$ucx_perftest" -p "$port" -x hca -d hca0 >"$log.server" 2>&1 &
    srv=$!
    for _ in $(seq 1 100); do
        listening "$port" && break
        kill -0 "$srv" 2>/dev/null || break
        sleep 0.1
    done
    UCX_HCA_FABRIC=$fabric timeout -s KILL "$T" "$hcarun" --verbose \
        "$ucx_perftest" 127.0.0.1 -p "$port" "$@" -v >"$log.client" 2>&1 &&
        rc_c=0 || rc_c=$?
    # the server ends by itself after a good run
    for _ in $(seq 1 50); do
        kill -0 "$srv" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$srv" 2>/dev/null || true
    wait "$srv" && rc_s=0 || rc_s=$?
    csv=$(grep -E '^ *[0-9]+,' "$log.client" | tail -n 1 | tr -d ' ' || true)
    ops=$(counter "${fabric}_ops" "$log.server" "$log.client")
    oops=$(counter "${other}_ops" "$log.server" "$log.client")
    case $name in
    *lat*|fadd*) metric="$(cut -d, -f2 <<<"$csv") us" ;;
    *) metric="$(cut -d, -f6 <<<"$csv") MB/s" ;;
    esac
    if [ "$rc_c" != 0 ] || [ "$rc_s" != 0 ] || [ -z "$csv" ]; then
        result FAIL "$fabric $name" "exit status client $rc_c server $rc_s$([ -z "$csv" ] && echo ', no result line') (logs $log.*)"
    elif [ "$ops" -le 0 ]; then
        result FAIL "$fabric $name" "$metric, but no hca operations over $fabric in the counters (logs $log.*)"
    elif [ "$oops" -ne 0 ]; then
        result FAIL "$fabric $name" "$metric, but $oops hca operations over $other (UCX_HCA_FABRIC=$fabric) (logs $log.*)"
    else
        result PASS "$fabric $name" "$metric; hca ops over $fabric: $ops, over $other: 0"
    fi
}

check_ucx_info
if [ -z "$ucx_perftest" ] || [ ! -x "$ucx_perftest" ]; then
    result FAIL "ucx_perftest" "not found (configure: UCX_PERFTEST empty)"
else
    for fabric in shm tcp; do
        perftest_run "$fabric" "am_lat short 8"    -t am_lat -x hca -d hca0 -D short -s 8 -n 2000 -w 200
        perftest_run "$fabric" "put_bw zcopy 1M"   -t put_bw -x hca -d hca0 -D zcopy -s 1048576 -n 200 -w 20
        perftest_run "$fabric" "get zcopy 1M"      -t get -x hca -d hca0 -D zcopy -s 1048576 -n 200 -w 20
        perftest_run "$fabric" "fadd 8"            -t fadd -x hca -d hca0 -s 8 -n 2000 -w 200
    done
fi

say "UCX $ucx_version: $pass passed, $failed failed"
if [ $failed -ne 0 ]; then
    say "logs kept in $logdir"
    exit 1
fi
[ -n "${SMOKE_LOGDIR:-}" ] || rm -rf "$logdir"
exit 0
