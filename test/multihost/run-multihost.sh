#!/bin/bash
#
# run-multihost.sh - hca between two "hosts": two network namespaces joined
# by a veth pair, so that the peers' host identities differ and hca's tcp
# fabric carries the traffic.
#
# usage: test/multihost/run-multihost.sh [BUILD_DIR] [--matrix-only|--faults-only]
#
#   BUILD_DIR  the hca build tree (default: $HCA_BUILD_DIR, else <repo>/build);
#              nothing of hca is built here, only the small UCP helper
#              (test/reliability/ucp_peer.c, with the system's UCX)
#
# 1. The ucx_perftest matrix: server in namespace a, client in namespace b,
#    UCX_TLS=hca for the UCT tests, UCX_TLS=hca,self for the UCP tests,
#    small iteration counts, MH_TIMEOUT seconds per process.  A test that
#    fails between the namespaces runs again on one host (the shm fabric):
#    if it fails there too, it is not a multi-host failure and is shown as
#    "n/a (fails on shm too)"; otherwise it is a FAIL.
# 2. Fault cases (UCX_HCA_PEER_TIMEOUT=2s), each bounded by MH_FAULT_LIMIT
#    seconds; a hang or a crash (signal) is a FAIL:
#      kill-perftest  ucx_perftest ucp_put_bw -e 1 MiB, the client
#                     SIGKILLed mid-run: the server reports the failure
#                     (its error handler), no crash
#      kill-ucp       ucp_peer put: the requester SIGKILLed: the target
#                     reports the peer's failure (error callback)
#      kill-mixed     the same with every operation (put, get, atomics,
#                     am, tag) in flight
#      reset          ucp_peer put, 100,000 operations (MH_RESET_WL,
#                     MH_RESET_OPS, MH_RESET_KILLS): the TCP connections
#                     killed with `ss -K` in namespace a up to three times,
#                     200 ms apart, while it runs: the connections come
#                     back (issue 27: RC semantics over tcp), both sides
#                     end cleanly with every operation done and its data
#                     checked, no error seen.  Not yet `am` or `mixed`:
#                     after a reset a few AMs are delivered but never
#                     completed at the requester (docs/RELIABILITY.md)
#      link-down      ucp_peer put: the veth of b brought down: both sides
#                     report an error (the peer timeout)
#      stop           ucp_peer put: the requester SIGSTOPped for 3 x the
#                     peer timeout: the target reports the failure, then
#                     the requester is continued and must end too
#      stop-target    the same with the target stopped: the requester's
#                     operations fail, the target (continued) ends too
#    Every survivor must report the peer's failure (Endpoint timeout or
#    Connection reset), with no data corruption (ucp_peer's checks); but
#    in `reset` nobody fails.
# 3. Path failover (issue 28), also fault cases: the first of them adds a
#    second veth pair (link) between a and b, hmveth1 on a subnet of its
#    own (the matrix and the cases above run on one link), and runs
#    ucp_peer with UCX_HCA_NET_DEVICES=hmveth0,hmveth1 on both sides: a
#    listener on each link, one TCP connection per path; a QP whose path
#    fails moves to the other one and sends again there, with no error.
#    First, once, `path-baseline` (a line of its own): MH_PATH_BASE_OPS
#    (100,000) puts over the two paths, no fault: the rate that sizes the
#    cases' runs and gives their expected time.  Then ucp_peer put with
#    MH_PATH_OPS operations (default: for the geometric mean of the time
#    to the last fault step, 0.5 s + the fault's span, and that plus
#    MH_FAULT_LIMIT, at the baseline's rate: the requester must still run
#    at the last fault step, and end within the limit) while,
#    in namespace a:
#      path-down      hmveth0 down, MH_PATH_DOWN_MS (1000) ms, up again
#      path-kill      `ss -K` of the first path's TCP connections only
#                     (dst <b's hmveth0 address>: in a, the remote end of
#                     those either side dialled), up to three times
#                     200 ms apart
#      path-flap      hmveth0 down, MH_PATH_FLAP_MS (700) ms, up, 700 ms,
#                     hmveth1 down, 700 ms, up
#    Each must end as `reset` does: both sides exit 0, every operation
#    done and its data checked, no error; and the device must have
#    counted a failover: the row `failovers` under "tcp fabric:" of
#    `hca_devinfo -v` in a, after the run minus before (a missing row is
#    0; the counters are the host's totals: both processes, and anything
#    else using hca0 meanwhile), must not be 0 ("no failover counted").
#    The line shows what changed in the rows failovers, retries,
#    connections_lost and path<N>_* (frames_tx, bytes_tx, retransmits,
#    failovers), the longest stall after the first fault (the recovery
#    time: the longest time a's traffic, sampled every 50 ms, ran below a
#    quarter of its rate before the fault), the run's time against the
#    baseline's rate, and the MB each link carried.
#
# One line per run (name, result, seconds, what was measured), a summary
# line; exit status 1 if a run failed, 0 otherwise.  Not root, or no
# network namespaces: a SKIPPED line and exit status 0.
#
# Environment: HCA_BUILD_DIR, MH_TIMEOUT (default 20), MH_FAULT_LIMIT
# (default 15), MH_LOGDIR (default: a temporary directory, kept if a run
# failed), MH_FILTER (a regular expression: only the matrix tests whose
# name matches), MH_FAULTS (the fault cases to run, default all:
# "kill-perftest kill-ucp kill-mixed reset link-down stop stop-target
# path-down path-kill path-flap"), MH_PATH_BASE_OPS, MH_PATH_OPS,
# MH_PATH_DOWN_MS, MH_PATH_FLAP_MS (section 3),
# MH_PEER_ENV (extra VAR=VALUE words for the fault cases' processes, e.g.
# "UCX_LOG_LEVEL=debug HCA_TRACE=1"), MH_KEEP=1 (keep the logs of passed
# runs too).
#
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
topsrc=$(cd "$here/../.." && pwd)
# shellcheck source=netns.sh
. "$here/netns.sh"

mode=all
build=${HCA_BUILD_DIR:-}
for a in "$@"; do
    case $a in
    --matrix-only) mode=matrix ;;
    --faults-only) mode=faults ;;
    -h|--help) sed -n '3,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run-multihost: unknown option $a" >&2; exit 2 ;;
    *) build=$a ;;
    esac
done
netns_check multihost || exit 0

build=${build:-$topsrc/build}
build=$(cd "$build" 2>/dev/null && pwd) || { echo "run-multihost: error: no build directory $build" >&2; exit 2; }
module=$build/src/uct/hca/.libs/libuct_hca.so
[ -f "$module" ] || { echo "run-multihost: error: $module not built" >&2; exit 2; }
command -v ucx_perftest >/dev/null ||
    { echo "multihost: SKIPPED: ucx_perftest not installed"; exit 0; }

T=${MH_TIMEOUT:-20}
FAULT_LIMIT=${MH_FAULT_LIMIT:-15}
logdir=${MH_LOGDIR:-}
own_logdir=0
if [ -z "$logdir" ]; then
    logdir=$(mktemp -d /tmp/hca-multihost.XXXXXX)
    own_logdir=1
fi
mkdir -p "$logdir"
chmod 0755 "$logdir"

pass=0 fail=0 na=0 total=0
t_start=$SECONDS
bg_pids=()

cleanup() {
    local p
    for p in "${bg_pids[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    netns_teardown
    if [ $own_logdir = 1 ] && [ $fail = 0 ] && [ "${MH_KEEP:-0}" != 1 ]; then
        rm -rf "$logdir"
    fi
}
trap cleanup EXIT
trap 'cleanup; trap - INT; kill -INT $$' INT
trap 'cleanup; trap - TERM; kill -TERM $$' TERM

netns_setup 2 2>>"$logdir/netns.log" || {
    echo "run-multihost: error: cannot set up the namespaces:" >&2
    cat "$logdir/netns.log" >&2
    exit 1
}
# netns_setup set its own traps: ours again
trap cleanup EXIT
trap 'cleanup; trap - INT; kill -INT $$' INT
trap 'cleanup; trap - TERM; kill -TERM $$' TERM

addr_a=$(netns_addr a)
addr_b=$(netns_addr b)
echo "multihost: namespaces ${netns_names[*]}, a=$addr_a b=$addr_b ($(netns_if a)/$(netns_if b)), logs in $logdir"

now_ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
secs() { awk -v ms="$1" 'BEGIN { printf "%.1f", ms / 1000 }'; }

# report NAME RESULT MS DETAIL
report() {
    printf '%-32s %-6s %6ss  %s\n' "$1" "$2" "$(secs "$3")" "$4"
    total=$((total + 1))
    case $2 in
    PASS) pass=$((pass + 1)) ;;
    FAIL) fail=$((fail + 1)) ;;
    *)    na=$((na + 1)) ;;
    esac
}

port=$((20000 + RANDOM % 20000))
next_port() { port=$((port + 1)); [ $port -gt 60000 ] && port=20000; }

# wait_listen NS PORT: until something listens on PORT in namespace NS
# (NS empty: the host), at most 5 s
wait_listen() {
    local i
    for i in $(seq 1 100); do
        if [ -n "$1" ]; then
            netns_exec "$1" ss -Hltn "sport = :$2" 2>/dev/null | grep -q . && return 0
        else
            ss -Hltn "sport = :$2" 2>/dev/null | grep -q . && return 0
        fi
        sleep 0.05
    done
    return 1
}

# perftest_pair WHERE LOG ENV... -- ARGS...
#   WHERE: ns (server in a, client in b) or host (both here, shm fabric)
#   returns 0 if both ended with status 0; the client's CSV line in $csv
perftest_pair() {
    local where=$1 log=$2 envw=() args=() srv rc_s rc_c
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envw+=("$1"); shift; done
    shift
    args=("$@")
    next_port
    local sx=() cx=() dst=127.0.0.1
    if [ "$where" = ns ]; then
        sx=(ip netns exec "$(netns_name a)")
        cx=(ip netns exec "$(netns_name b)")
        dst=$addr_a
    fi
    # the server gets the transport and device of a UCT test too: UCX
    # 1.22's ucx_perftest checks the server's own parameters before it
    # takes the client's test
    local sargs=() i
    for ((i = 0; i + 1 < ${#args[@]}; i++)); do
        case ${args[i]} in -x|-d) sargs+=("${args[i]}" "${args[i + 1]}") ;; esac
    done
    echo "server: ${envw[*]} ucx_perftest -p $port ${sargs[*]}" >"$log.cmd"
    echo "client: ${envw[*]} ucx_perftest $dst -p $port ${args[*]}" >>"$log.cmd"
    "${sx[@]}" timeout -s KILL "$T" env LD_PRELOAD="$module" "${envw[@]}" \
        ucx_perftest -p "$port" "${sargs[@]}" >"$log.server" 2>&1 &
    srv=$!
    if ! wait_listen "$([ "$where" = ns ] && echo a)" "$port"; then
        kill -KILL $srv 2>/dev/null
        wait $srv 2>/dev/null
        echo "server did not listen" >>"$log.server"
        csv=
        return 1
    fi
    "${cx[@]}" timeout -s KILL "$T" env LD_PRELOAD="$module" "${envw[@]}" \
        ucx_perftest "$dst" -p "$port" "${args[@]}" -v >"$log.client" 2>&1
    rc_c=$?
    # the server ends by itself after a good run; give it a moment
    local i
    for i in $(seq 1 40); do
        kill -0 $srv 2>/dev/null || break
        sleep 0.05
    done
    kill -KILL $srv 2>/dev/null
    wait $srv
    rc_s=$?
    csv=$(grep -E '^ *[0-9]+,' "$log.client" | tail -n 1)
    echo "rc client=$rc_c server=$rc_s" >>"$log.cmd"
    [ $rc_c = 0 ] && [ $rc_s = 0 ] && [ -n "$csv" ]
}

# Why a run failed, from its logs: a timeout, a signal, or the first error.
why() {
    local log=$1 rc
    rc=$(sed -n 's/^rc //p' "$log.cmd")
    local e
    e=$(grep -h -m1 -iE 'error|fail|unsupported|not supported|assert' \
            "$log.client" "$log.server" 2>/dev/null | head -n 1 | cut -c1-120)
    echo "$rc${e:+; $e}"
}

# matrix_test NAME KIND ARGS...  (KIND uct or ucp)
matrix_test() {
    local name=$1 kind=$2 envw t0 ms detail metric
    shift 2
    if [ -n "${MH_FILTER:-}" ] && ! [[ $name =~ $MH_FILTER ]]; then
        return
    fi
    if [ "$kind" = uct ]; then envw=(UCX_TLS=hca); else envw=("UCX_TLS=hca,self"); fi
    envw+=("${mt_env[@]}")
    local log=$logdir/m-${name//[^A-Za-z0-9_.-]/_}
    t0=$(now_ms)
    if perftest_pair ns "$log" "${envw[@]}" -- "$@"; then
        ms=$(($(now_ms) - t0))
        # lat50 (usec) for latency tests, bandwidth (MB/s) otherwise
        case $name in
        *lat*|*fadd*|*swap*) metric=$(cut -d, -f2 <<<"$csv")" us" ;;
        *) metric=$(cut -d, -f6,8 <<<"$csv" | awk -F, '{printf "%s MB/s, %s msg/s", $1, $2}') ;;
        esac
        report "$name" PASS "$ms" "$metric"
        [ "${MH_KEEP:-0}" = 1 ] || rm -f "$log".*
        return
    fi
    ms=$(($(now_ms) - t0))
    detail=$(why "$log")
    # the same on one host (the shm fabric)
    if perftest_pair host "$log.shm" "${envw[@]}" -- "$@"; then
        report "$name" FAIL "$ms" "multi-host: $detail (passes on shm; logs $log.*)"
    else
        report "$name" n/a "$ms" "fails on shm too: $(why "$log.shm")"
    fi
}

mt_env=()  # extra environment of the matrix tests
run_matrix() {
    local lat=(-n 500 -w 50) bw=(-n 200 -w 20) big=(-n 50 -w 5) a s
    local d
    echo "--- ucx_perftest matrix (UCT: UCX_TLS=hca -x hca -d hca0; UCP: UCX_TLS=hca,self)"
    for d in short bcopy zcopy; do
        case $d in short) s=8 ;; *) s=4096 ;; esac
        matrix_test "uct am_lat $d $s"  uct -t am_lat -x hca -d hca0 -D $d -s $s "${lat[@]}"
        matrix_test "uct am_bw $d $s"   uct -t am_bw  -x hca -d hca0 -D $d -s $s "${bw[@]}"
    done
    matrix_test "uct put_lat short 8"      uct -t put_lat -x hca -d hca0 -D short -s 8 "${lat[@]}"
    matrix_test "uct put_lat bcopy 4096"   uct -t put_lat -x hca -d hca0 -D bcopy -s 4096 "${lat[@]}"
    matrix_test "uct put_lat zcopy 65536"  uct -t put_lat -x hca -d hca0 -D zcopy -s 65536 "${bw[@]}"
    matrix_test "uct put_bw short 8"       uct -t put_bw -x hca -d hca0 -D short -s 8 "${bw[@]}"
    matrix_test "uct put_bw bcopy 4096"    uct -t put_bw -x hca -d hca0 -D bcopy -s 4096 "${bw[@]}"
    matrix_test "uct put_bw zcopy 1M"      uct -t put_bw -x hca -d hca0 -D zcopy -s 1048576 "${big[@]}"
    matrix_test "uct get bcopy 4096"       uct -t get -x hca -d hca0 -D bcopy -s 4096 "${bw[@]}"
    matrix_test "uct get zcopy 1M"         uct -t get -x hca -d hca0 -D zcopy -s 1048576 "${big[@]}"
    for a in 8 4; do
        matrix_test "uct add_lat $a"   uct -t add_lat -x hca -d hca0 -s $a "${lat[@]}"
        matrix_test "uct add_mr $a"    uct -t add_mr  -x hca -d hca0 -s $a "${bw[@]}"
        matrix_test "uct fadd $a"      uct -t fadd    -x hca -d hca0 -s $a "${lat[@]}"
        matrix_test "uct swap $a"      uct -t swap    -x hca -d hca0 -s $a "${lat[@]}"
        matrix_test "uct cswap $a"     uct -t cswap   -x hca -d hca0 -s $a "${lat[@]}"
    done
    matrix_test "ucp tag_lat 8"        ucp -t tag_lat -s 8 "${lat[@]}"
    matrix_test "ucp tag_lat 64K"      ucp -t tag_lat -s 65536 "${bw[@]}"
    matrix_test "ucp tag_bw 8"         ucp -t tag_bw -s 8 "${bw[@]}"
    matrix_test "ucp tag_bw 1M"        ucp -t tag_bw -s 1048576 "${big[@]}"
    matrix_test "ucp tag_sync_lat 8"   ucp -t tag_sync_lat -s 8 "${lat[@]}"
    matrix_test "ucp stream_lat 8"     ucp -t stream_lat -s 8 "${lat[@]}"
    matrix_test "ucp stream_bw 64K"    ucp -t stream_bw -s 65536 "${bw[@]}"
    matrix_test "ucp am_lat 8"         ucp -t ucp_am_lat -s 8 "${lat[@]}"
    matrix_test "ucp am_bw 1M"         ucp -t ucp_am_bw -s 1048576 "${big[@]}"
    matrix_test "ucp put_lat 8"        ucp -t ucp_put_lat -s 8 "${lat[@]}"
    matrix_test "ucp put_bw 1M"        ucp -t ucp_put_bw -s 1048576 "${big[@]}"
    matrix_test "ucp get 1M"           ucp -t ucp_get -s 1048576 "${big[@]}"
    for a in 8 4; do
        matrix_test "ucp add $a"       ucp -t ucp_add -s $a "${bw[@]}"
        matrix_test "ucp fadd $a"      ucp -t ucp_fadd -s $a "${lat[@]}"
        matrix_test "ucp swap $a"      ucp -t ucp_swap -s $a "${lat[@]}"
        matrix_test "ucp cswap $a"     ucp -t ucp_cswap -s $a "${lat[@]}"
    done
    # the settings: the interface named, the fabric forced
    mt_env=("UCX_HCA_NET_DEVICES=$(netns_if a)")
    matrix_test "ucp tag_bw 1M NET_DEVICES=$(netns_if a)" ucp -t tag_bw -s 1048576 "${big[@]}"
    mt_env=(UCX_HCA_FABRIC=tcp)
    matrix_test "ucp tag_bw 1M FABRIC=tcp"  ucp -t tag_bw -s 1048576 "${big[@]}"
    mt_env=()
}

# ------------------------------------------------------------ faults

# shellcheck disable=SC2206 # MH_PEER_ENV is words
fault_env=(LD_PRELOAD="$module" UCX_HCA_PEER_TIMEOUT=2s ${MH_PEER_ENV:-})

# alive PID: running and not a zombie
alive() {
    local st
    st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}

# wait_gone PID LIMIT_S: waits up to LIMIT_S s for PID to end; sets
# $wait_rc (its status, or "hung") and $wait_ms
# The path cases' end: the requester, then the target, each bounded by
# FAULT_LIMIT (req_rc, tgt_rc: their exit status or "hung"; run_ms: the
# requester's run from t0), both killed if still there, the sampler
# (spid) reaped.
path_pair_end() {
    wait_gone "$req" "$FAULT_LIMIT"
    req_rc=$wait_rc run_ms=$(($(now_ms) - t0))
    wait_gone "$tgt" "$FAULT_LIMIT"
    tgt_rc=$wait_rc
    kill -KILL "$tgt" "$req" 2>/dev/null
    wait "$tgt" "$req" 2>/dev/null
    wait "$spid" 2>/dev/null
}

wait_gone() {
    local pid=$1 limit=$(($2 * 1000)) t0
    t0=$(now_ms)
    while alive "$pid" && [ $(($(now_ms) - t0)) -lt $limit ]; do
        sleep 0.05
    done
    wait_ms=$(($(now_ms) - t0))
    if alive "$pid"; then
        wait_rc=hung
        return 1
    fi
    wait "$pid" 2>/dev/null
    wait_rc=$?
    return 0
}

# A status that means a crash: killed by a signal other than our KILL of
# a hung process (timeout -s KILL makes 137 too, so timeouts are longer
# than the limits here)
crashed() { [ "$1" != hung ] && [ "$1" -gt 128 ]; }

# The pid of the process (not the `ip netns exec` wrapper: it execs, so
# it is the same pid) running COMM in namespace NS
ns_pid_of() {
    local ns=$1 comm=$2 p
    for p in $(ip netns pids "$(netns_name "$ns")" 2>/dev/null); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$comm" ] && { echo "$p"; return 0; }
    done
    return 1
}

# kill-perftest: ucx_perftest ucp_put_bw 1 MiB (put zcopy over hca) with
# error handling (-e), the client SIGKILLed mid-run: the server must report
# the peer's failure ("error handler called with status ...") within the
# limit, and not crash.  ucx_perftest's server does not end after that (it
# polls for the next put: UCX's own tcp transport behaves alike), so it is
# killed here once it has reported.  (The UCT form of this test cannot
# report anything: ucx_perftest's UCT passive side polls memory without
# error handling, with every transport.)
fault_kill_perftest() {
    local name="fault kill-perftest" log=$logdir/f-kill-perftest srv cli t0 tk
    local penv=("${fault_env[@]}" "UCX_TLS=hca,self")
    next_port
    t0=$(now_ms)
    ip netns exec "$(netns_name a)" env "${penv[@]}" \
        ucx_perftest -p "$port" >"$log.server" 2>&1 &
    srv=$!
    bg_pids+=("$srv")
    wait_listen a "$port" || { report "$name" FAIL $(($(now_ms) - t0)) "server did not listen"; return; }
    ip netns exec "$(netns_name b)" env "${penv[@]}" \
        ucx_perftest "$addr_a" -p "$port" -t ucp_put_bw -e -s 1048576 \
        -n 1000000 -w 10 >"$log.client" 2>&1 &
    cli=$!
    bg_pids+=("$cli")
    # mid-transfer: once the client reports its first progress line
    local i
    for i in $(seq 1 100); do
        grep -q '^\[thread 0\]' "$log.client" 2>/dev/null && break
        sleep 0.05
    done
    if ! alive $cli; then
        wait $cli; report "$name" FAIL $(($(now_ms) - t0)) "the client ended before the kill (status $?; log $log.client)"
        kill -KILL $srv 2>/dev/null; wait $srv 2>/dev/null
        return
    fi
    tk=$(now_ms)
    kill -KILL $cli
    wait $cli 2>/dev/null
    local seen=0 rc=
    while [ $(($(now_ms) - tk)) -lt $((FAULT_LIMIT * 1000)) ]; do
        grep -q 'error handler called' "$log.server" && { seen=1; break; }
        alive $srv || break
        sleep 0.05
    done
    local ms=$(($(now_ms) - tk))
    if ! alive $srv; then
        wait $srv
        rc=$?
    fi
    kill -KILL $srv 2>/dev/null
    wait $srv 2>/dev/null
    local err
    err=$(grep -m1 -o 'error handler called.*' "$log.server")
    if [ -n "$rc" ] && crashed "$rc"; then
        report "$name" FAIL "$ms" "server crashed: status $rc (log $log.server)"
    elif [ $seen = 1 ] || [ -n "$rc" ]; then
        report "$name" PASS "$ms" "server ${err:-ended with status $rc} $(secs $ms)s after the kill"
    else
        report "$name" FAIL "$ms" "server reported nothing within ${FAULT_LIMIT}s of the client's SIGKILL (log $log.server)"
    fi
}

peer_bin=
build_ucp_peer() {
    peer_bin=$build/test/multihost/ucp_peer
    make -s -C "$topsrc/test/reliability" -f helpers.mk HCA_BUILD="$build" \
        O="$build/test/multihost" "$peer_bin" >"$logdir/ucp_peer-build.log" 2>&1 || {
        cat "$logdir/ucp_peer-build.log" >&2
        peer_bin=
        return 1
    }
}

pair_env=()  # extra environment of the next ucp_pair_start's processes

# case_dir CASE: the run directory of a case, $logdir/f-CASE, or
# f-CASE.<n> if a case of that name ran before (MH_FAULTS="reset reset"
# with MH_KEEP=1: ucp_peer must not find the last run's address files)
case_dir() {
    local d=$logdir/f-$1 n=1
    while [ -e "$d" ]; do
        n=$((n + 1))
        d=$logdir/f-$1.$n
    done
    echo "$d"
}

# ucp_pair_start NAME DIR WORKLOAD [OPS]: ucp_peer's target in a and
# requester in b, both with the fault environment (and $pair_env); sets
# $tgt and $req and returns 0 once both say "traffic", else reports NAME
# failed, kills them and returns 1
ucp_pair_start() {
    local name=$1 dir=$2 wl=$3 ops=${4:-} t0 i
    mkdir -p "$dir"
    chmod 0777 "$dir"
    local penv=("${fault_env[@]}" "UCX_TLS=hca,self" REL_RUN_LIMIT=$((FAULT_LIMIT + 10))
                "${pair_env[@]}")
    t0=$(now_ms)
    ip netns exec "$(netns_name a)" env "${penv[@]}" \
        "$peer_bin" target "$wl" heap "$dir" $ops >"$dir/target.log" 2>&1 &
    tgt=$!
    ip netns exec "$(netns_name b)" env "${penv[@]}" \
        "$peer_bin" requester "$wl" heap "$dir" $ops >"$dir/requester.log" 2>&1 &
    req=$!
    bg_pids+=("$tgt" "$req")
    for i in $(seq 1 100); do
        grep -qs traffic "$dir/requester.stage" && grep -qs traffic "$dir/target.stage" && break
        sleep 0.05
    done
    if ! grep -qs traffic "$dir/requester.stage"; then
        report "$name" FAIL $(($(now_ms) - t0)) "no traffic started (logs $dir)"
        kill -KILL $tgt $req 2>/dev/null; wait $tgt $req 2>/dev/null
        return 1
    fi
    return 0
}

# ucp_fault NAME ACTION: target in a, requester in b (workload put, 1 MiB
# areas), both with UCX_HCA_PEER_TIMEOUT=2s; ACTION once traffic runs:
#   kill   SIGKILL the requester; the target must see the failure
#   reset  ss -K the hca TCP connections in a; both must see it
#   down   the veth of b down; both must see it
#   stop   SIGSTOP the requester for 3 x the timeout; the target must see
#          it, the requester (continued) must end too
#   stopt  the same with the target stopped: the requester must see it
ucp_fault() {
    local name="fault $1" action=$2 dir tgt req tk detail=
    dir=$(case_dir "$1")
    local wl=${3:-put}
    [ -n "$peer_bin" ] || { report "$name" FAIL 0 "ucp_peer not built"; return; }
    ucp_pair_start "$name" "$dir" "$wl" || return
    sleep 0.5
    tk=$(now_ms)
    tk_ns=${EPOCHREALTIME/./}000
    case $action in
    kill)  kill -KILL $req; wait $req 2>/dev/null ;; # at once: quiet
    stop)  kill -STOP $req ;;
    stopt) kill -STOP $tgt ;;
    reset)
        # ss lists the sockets it closed: none means a kernel without
        # CONFIG_INET_DIAG_DESTROY (or no connection to close)
        ip netns exec "$(netns_name a)" ss -K -t dst "$addr_b" >"$dir/ss.log" 2>&1
        if ! grep -q ESTAB "$dir/ss.log"; then
            kill -KILL $tgt $req 2>/dev/null
            wait $tgt $req 2>/dev/null
            report "$name" n/a $(($(now_ms) - tk)) "ss -K closed no connection (kernel without CONFIG_INET_DIAG_DESTROY?): $(tr '\n' ' ' <"$dir/ss.log" | cut -c1-100)"
            return
        fi ;;
    down)  ip -n "$(netns_name b)" link set "$(netns_if b)" down ;;
    esac
    local ok=1 tgt_rc req_rc=- surv_ms wait_more
    case $action in
    stopt)
        # the requester (the survivor) must fail first; then the target,
        # continued past the timeout, finds its connection dead and ends
        wait_gone $req "$FAULT_LIMIT"
        req_rc=$wait_rc surv_ms=$wait_ms
        wait_more=$((6000 - ($(now_ms) - tk)))
        [ $wait_more -gt 0 ] && sleep "$(secs $wait_more)"
        kill -CONT $tgt
        wait_gone $tgt "$FAULT_LIMIT"
        tgt_rc=$wait_rc ;;
    *)
        wait_gone $tgt "$FAULT_LIMIT"
        tgt_rc=$wait_rc surv_ms=$wait_ms
        case $action in
        kill) ;;
        stop)
            wait_more=$((6000 - ($(now_ms) - tk)))
            [ $wait_more -gt 0 ] && sleep "$(secs $wait_more)"
            kill -CONT $req
            wait_gone $req "$FAULT_LIMIT"
            req_rc=$wait_rc ;;
        *)
            wait_gone $req "$FAULT_LIMIT"
            req_rc=$wait_rc ;;
        esac ;;
    esac
    [ "$action" = down ] && ip -n "$(netns_name b)" link set "$(netns_if b)" up
    # ucp_peer: 0 = failure seen and cleaned up; anything else is wrong
    # here, and so is an error other than the peer's failure
    [ "$tgt_rc" = 0 ] || ok=0
    [ "$req_rc" = - ] || [ "$req_rc" = 0 ] || ok=0
    local side res st
    for side in target requester; do
        [ $side = requester ] && [ "$req_rc" = - ] && continue
        res=$(cat "$dir/$side.result" 2>/dev/null)
        if [ $side = target ]; then st=$tgt_rc; else st=$req_rc; fi
        [ $side = requester ] && detail+="; "
        if [ -z "$res" ]; then
            ok=0
            detail+="$side: status $st, no result (stage $(cat "$dir/$side.stage" 2>/dev/null))"
            continue
        fi
        local dns err
        dns=$(sed -n 's/.*detect_ns=\([0-9]*\).*/\1/p' <<<"$res")
        err=$(sed -n 's/.*first_error=//p' <<<"$res")
        case $err in
        *"Endpoint timeout"*|*"Connection reset"*) ;;
        *) ok=0 ;;
        esac
        grep -q 'corrupt=0' <<<"$res" || ok=0
        detail+="$side: status $st, detected $(awk -v d="$dns" -v t="$tk_ns" 'BEGIN { printf "%.2f", (d - t) / 1e9 }')s after the ${action/stopt/stop}, $err"
    done
    kill -KILL $tgt $req 2>/dev/null
    kill -CONT $tgt $req 2>/dev/null
    wait $tgt $req 2>/dev/null
    if [ $ok = 1 ]; then
        report "$name" PASS "$surv_ms" "$detail"
        [ "${MH_KEEP:-0}" = 1 ] || rm -rf "$dir"
    else
        report "$name" FAIL "$surv_ms" "$detail (logs $dir)"
    fi
}

# ucp_survive NAME WORKLOAD OPS: target in a, requester in b, OPS
# operations of WORKLOAD; once traffic runs, ss -K of the hca TCP
# connections in a, up to three times 200 ms apart while the requester
# runs (the first must find it running: else OPS is too small and the
# case proves nothing).  Both
# must end cleanly: exit 0, no error, no corruption.
ucp_survive() {
    local name="fault $1" wl=$2 ops=$3 dir tgt req tk k
    dir=$(case_dir "$1")
    local detail= ok=1 killed=0
    [ -n "$peer_bin" ] || { report "$name" FAIL 0 "ucp_peer not built"; return; }
    ucp_pair_start "$name" "$dir" "$wl" "$ops" || return
    sleep 0.2
    tk=$(now_ms)
    for k in $(seq 1 "${MH_RESET_KILLS:-3}"); do
        if ! alive $req; then
            # the first reset must find it running (else OPS is too small
            # and the case proves nothing); later ones may find it done
            if [ $k = 1 ]; then
                ok=0
                detail+="the requester ended before the first reset: too few operations; "
            fi
            break
        fi
        ip netns exec "$(netns_name a)" ss -K -t dst "$addr_b" >"$dir/ss-$k.log" 2>&1
        if grep -q ESTAB "$dir/ss-$k.log"; then
            killed=$((killed + $(grep -c ESTAB "$dir/ss-$k.log")))
        fi
        sleep 0.2
    done
    if [ $ok = 1 ] && [ $killed = 0 ]; then
        kill -KILL $tgt $req 2>/dev/null
        wait $tgt $req 2>/dev/null
        report "$name" n/a $(($(now_ms) - tk)) "ss -K closed no connection (kernel without CONFIG_INET_DIAG_DESTROY?): $(tr '\n' ' ' <"$dir/ss-1.log" | cut -c1-100)"
        return
    fi
    wait_gone $req "$FAULT_LIMIT"
    local req_rc=$wait_rc surv_ms=$wait_ms
    wait_gone $tgt "$FAULT_LIMIT"
    local tgt_rc=$wait_rc side res st
    for side in target requester; do
        res=$(cat "$dir/$side.result" 2>/dev/null)
        if [ $side = target ]; then st=$tgt_rc; else st=$req_rc; fi
        [ "$st" = 0 ] || ok=0
        grep -q 'errors=0 ' <<<"$res" || ok=0
        grep -q 'corrupt=0' <<<"$res" || ok=0
        grep -q 'first_error=-' <<<"$res" || ok=0
        detail+="$side: status $st, $(sed -n 's/.*\(ops=[0-9]*\).*/\1/p' <<<"$res") $(sed -n 's/.*\(errors=[0-9]*\).*/\1/p' <<<"$res") $(sed -n 's/.*\(first_error=.*\)/\1/p' <<<"$res"); "
    done
    detail+="$killed connections killed"
    kill -KILL $tgt $req 2>/dev/null
    wait $tgt $req 2>/dev/null
    if [ $ok = 1 ]; then
        report "$name" PASS "$surv_ms" "$detail"
        [ "${MH_KEEP:-0}" = 1 ] || rm -rf "$dir"
    else
        report "$name" FAIL "$surv_ms" "$detail (logs $dir)"
    fi
}

# ------------------------------------------------------------ paths

# hca_devinfo: the build's, else an installed one
devinfo_bin=$build/src/tools/hca_devinfo
[ -x "$devinfo_bin" ] || devinfo_bin=$(command -v hca_devinfo 2>/dev/null)

# tcp_rows FILE: the rows under "tcp fabric:" of `hca_devinfo -v -d hca0`
# in namespace a, "name value" a line, into FILE (hca_devinfo prints no
# row that is 0); its whole output in FILE.full; 1 if it is missing or
# failed
tcp_rows() {
    : >"$1"
    [ -n "$devinfo_bin" ] || return 1
    ip netns exec "$(netns_name a)" timeout -s KILL 10 \
        "$devinfo_bin" -v -d hca0 >"$1.full" 2>&1 || return 1
    awk '/^[ \t]*tcp fabric:/ { f = 1; next }
         f && /^\t\t\t[a-z]/ { print $1, $2; next }
         { f = 0 }' "$1.full" >"$1"
}

# tcp_delta BEFORE AFTER: "name=+N ..." for the rows failovers, retries,
# connections_lost and path<N>_* that changed (a missing row is 0)
tcp_delta() {
    awk 'FNR == NR { b[$1] = $2; seen[$1] = 1; next }
         { a[$1] = $2; seen[$1] = 1 }
         END {
             n = split("failovers retries connections_lost", k, " ")
             for (r in seen) if (r ~ /^path[0-9]+_/) k[++n] = r
             for (i = 4; i <= n; i++)     # the path rows in name order
                 for (j = i + 1; j <= n; j++)
                     if (k[j] < k[i]) { t = k[i]; k[i] = k[j]; k[j] = t }
             for (i = 1; i <= n; i++) {
                 d = a[k[i]] - b[k[i]]
                 if (d != 0) printf "%s%s=%+.0f", (out++ ? " " : ""), k[i], d
             }
         }' "$1" "$2"
}

# row FILE NAME: the row's value, 0 when missing
row() { awk -v n="$2" '$1 == n { v = $2 } END { printf "%.0f\n", v }' "$1"; }

# path_sampler PID FILE: every 50 ms while PID (a process in namespace a)
# lives, "ms rx0 tx0 rx1 tx1" (bytes of a's hmveth0 and hmveth1, from
# /proc/PID/net/dev: PID's namespace) into FILE; forks only sleep; 60 s at
# most
path_sampler() {
    local pid=$1 n=0 line st f r0 t0 r1 t1
    while [ $n -lt 1200 ]; do
        read -r st 2>/dev/null <"/proc/$pid/stat" || break
        st=${st##*) }
        [ "${st%% *}" = Z ] && break
        r0=0 t0=0 r1=0 t1=0
        while IFS= read -r line; do
            read -r -a f <<<"${line/:/ }"
            case ${f[0]} in
            hmveth0) r0=${f[1]} t0=${f[9]} ;;
            hmveth1) r1=${f[1]} t1=${f[9]} ;;
            esac
        done 2>/dev/null <"/proc/$pid/net/dev"
        echo "$(now_ms) $r0 $t0 $r1 $t1"
        sleep 0.05
        n=$((n + 1))
    done >"$2"
}

# path_stats SAMPLES FIRST_FAULT_MS END_MS: "pre_rate stall_ms mb0 mb1":
# the median rate (bytes/ms, both links) of the samples before the first
# fault (of all of them if fewer than 3), the longest time after it and
# before END_MS that the rate stayed below a quarter of that, and the MB
# each link carried (rx + tx in a)
path_stats() {
    awk -v first="$2" -v end="$3" '
    { t[NR] = $1; b[NR] = $2 + $3 + $4 + $5; b0[NR] = $2 + $3; b1[NR] = $4 + $5 }
    function median(m,    i, j, x) {
        for (i = 2; i <= m; i++)
            for (j = i; j > 1 && r[j - 1] > r[j]; j--) { x = r[j]; r[j] = r[j - 1]; r[j - 1] = x }
        return r[int((m + 1) / 2)]
    }
    END {
        n = NR
        if (n < 3) { print "0 0 0 0"; exit }
        m = 0
        for (i = 2; i <= n; i++)
            if (t[i] <= first && t[i] > t[i - 1]) r[++m] = (b[i] - b[i - 1]) / (t[i] - t[i - 1])
        if (m < 3) {
            m = 0
            for (i = 2; i <= n; i++)
                if (t[i] <= end && t[i] > t[i - 1]) r[++m] = (b[i] - b[i - 1]) / (t[i] - t[i - 1])
        }
        pre = (m > 0) ? median(m) : 0
        stall = 0; cur = 0
        for (i = 2; i <= n; i++) {
            if (t[i] <= first || t[i - 1] >= end || t[i] <= t[i - 1]) continue
            if ((b[i] - b[i - 1]) / (t[i] - t[i - 1]) < pre / 4) {
                cur += t[i] - t[i - 1]
                if (cur > stall) stall = cur
            } else {
                cur = 0
            }
        }
        printf "%.0f %d %.1f %.1f\n", pre, stall, (b0[n] - b0[1]) / 1e6, (b1[n] - b1[1]) / 1e6
    }' "$1"
}

# links_up: both links up again after a case, whatever happened in it
links_up() {
    ip -n "$(netns_name a)" link set hmveth0 up 2>/dev/null
    ip -n "$(netns_name a)" link set hmveth1 up 2>/dev/null
    netns_wait_up "$(netns_name a)" hmveth0 hmveth1
    netns_wait_up "$(netns_name b)" hmveth0 hmveth1
}

# path_result DIR: both sides' results checked as in `reset`: exit 0,
# done, no error, no corruption; clears $res_ok on a failure and appends
# to $detail (uses the caller's $req_rc and $tgt_rc)
path_result() {
    local dir=$1 side res st
    for side in requester target; do
        res=$(cat "$dir/$side.result" 2>/dev/null)
        if [ $side = target ]; then st=$tgt_rc; else st=$req_rc; fi
        [ "$st" = 0 ] || res_ok=0
        if [ -z "$res" ]; then
            res_ok=0
            detail+="$side: status $st, no result (stage $(cat "$dir/$side.stage" 2>/dev/null)); "
            continue
        fi
        grep -q 'status=done' <<<"$res" || res_ok=0
        grep -q 'errors=0 ' <<<"$res" || res_ok=0
        grep -q 'corrupt=0' <<<"$res" || res_ok=0
        grep -q 'first_error=-' <<<"$res" || res_ok=0
        detail+="$side: status $st, $(grep -o 'ops=[0-9]*' <<<"$res") $(grep -o 'errors=[0-9]*' <<<"$res") $(grep -o 'corrupt=[0-9]*' <<<"$res") $(sed -n 's/.*\(first_error=.*\)/\1/p' <<<"$res"); "
    done
}

path_ready=     # ok, or why the path cases cannot run
path_rate=0     # the baseline's puts per second

# path_prepare: the second link and the baseline, once; 0 if ready
path_prepare() {
    if [ -z "$path_ready" ]; then
        path_ready=ok
        if [ -z "$peer_bin" ]; then
            path_ready="ucp_peer not built"
        elif [ "$netns_links" -lt 2 ] && ! netns_add_link 2>>"$logdir/netns.log"; then
            path_ready="cannot add the second link (hmveth1): $(tail -n 1 "$logdir/netns.log")"
        else
            echo "multihost: second link hmveth1: a=$(netns_addr a 1) b=$(netns_addr b 1); UCX_HCA_NET_DEVICES=hmveth0,hmveth1"
            path_baseline
        fi
    fi
    [ "$path_ready" = ok ]
}

# path-baseline: MH_PATH_BASE_OPS puts over the two paths, no fault
path_baseline() {
    local name="fault path-baseline" dir=$logdir/f-path-baseline
    local ops=${MH_PATH_BASE_OPS:-100000} tgt req t0 spid run_ms detail="" res_ok=1
    local req_rc tgt_rc mb0 mb1
    pair_env=("UCX_HCA_NET_DEVICES=hmveth0,hmveth1")
    if ! ucp_pair_start "$name" "$dir" put "$ops"; then
        pair_env=()
        path_ready="the two-path baseline failed (no traffic; logs $dir)"
        return 1
    fi
    pair_env=()
    t0=$(now_ms)
    path_sampler "$tgt" "$dir/samples" &
    spid=$!
    bg_pids+=("$spid")
    path_pair_end
    path_result "$dir"
    read -r _ _ mb0 mb1 <<<"$(path_stats "$dir/samples" 0 $((t0 + run_ms)))"
    detail+="links hmveth0 $mb0 MB, hmveth1 $mb1 MB"
    [ "$run_ms" -gt 0 ] || run_ms=1
    path_rate=$((ops * 1000 / run_ms))
    if [ $res_ok = 1 ]; then
        report "$name" PASS "$run_ms" "$detail; $path_rate puts/s"
        [ "${MH_KEEP:-0}" = 1 ] || rm -rf "$dir"
    else
        path_ready="the two-path baseline failed (logs $dir)"
        report "$name" FAIL "$run_ms" "$detail (logs $dir)"
    fi
}

# path_step WHAT: the time of one fault step into DIR/events; 1 if the
# requester has ended already (uses the caller's $dir, $t0, $req)
path_step() {
    echo "$(($(now_ms) - t0)) $1" >>"$dir/events"
    alive "$req"
}

# ucp_path NAME ACTION: ucp_peer put over the two paths while ACTION
# (down, kill, flap) runs in namespace a; see the header, section 3
ucp_path() {
    local name="fault $1" action=$2 dir tgt req t0 tf tl k spid
    dir=$(case_dir "$1")
    local detail="" res_ok=1 ok=1 killed=0 span ops req_rc tgt_rc run_ms A
    local down_ms=${MH_PATH_DOWN_MS:-1000} flap_ms=${MH_PATH_FLAP_MS:-700}
    if ! path_prepare; then
        report "$name" FAIL 0 "not run: $path_ready"
        return
    fi
    case $action in
    down) span=$down_ms ;;
    kill) span=600 ;;
    flap) span=$((3 * flap_ms + 300)) ;;
    esac
    # The requester must still run at the last fault step (0.5 s + span)
    # and end within the limit after it: the run's time at the baseline's
    # rate is the geometric mean of the two, as the rate of the same run
    # varies by 3 to 5 x on 2 busy cores (4.2 s for path-kill, 5 s for
    # path-down, 7.2 s for path-flap: a rate 3.3, 3.3, 2.5 x off either
    # way still fits)
    local target_ms
    target_ms=$(awk -v a=$((500 + span)) -v l="$FAULT_LIMIT" \
        'BEGIN { printf "%d", sqrt(a * (a + l * 1000)) }')
    ops=${MH_PATH_OPS:-$((path_rate * target_ms / 1000))}
    [ "$ops" -ge 20000 ] || ops=20000
    [ "$ops" -le 5000000 ] || ops=5000000
    mkdir -p "$dir"
    if ! tcp_rows "$dir/devinfo-before"; then
        report "$name" FAIL 0 "cannot count failovers: hca_devinfo -v failed or is missing (${devinfo_bin:-none}; $dir/devinfo-before.full)"
        return
    fi
    pair_env=("UCX_HCA_NET_DEVICES=hmveth0,hmveth1")
    if ! ucp_pair_start "$name" "$dir" put "$ops"; then
        pair_env=()
        return
    fi
    pair_env=()
    t0=$(now_ms)
    path_sampler "$tgt" "$dir/samples" &
    spid=$!
    bg_pids+=("$spid")
    A=$(netns_name a)
    sleep 0.5
    tf=$(now_ms)
    case $action in
    down)
        path_step "hmveth0 down" || ok=0
        ip -n "$A" link set hmveth0 down
        sleep "$(secs "$down_ms")"
        path_step "hmveth0 up" || ok=0
        ip -n "$A" link set hmveth0 up ;;
    flap)
        path_step "hmveth0 down" || ok=0
        ip -n "$A" link set hmveth0 down
        sleep "$(secs "$flap_ms")"
        path_step "hmveth0 up" || ok=0
        ip -n "$A" link set hmveth0 up
        sleep "$(secs "$flap_ms")"
        path_step "hmveth1 down" || ok=0
        ip -n "$A" link set hmveth1 down
        sleep "$(secs "$flap_ms")"
        path_step "hmveth1 up" || ok=0
        ip -n "$A" link set hmveth1 up ;;
    kill)
        # dst <b's hmveth0 address>: in a, the remote end of the first
        # path's connections, whichever side dialled them
        for k in 1 2 3; do
            if ! path_step "ss -K dst $(netns_addr b 0)"; then
                # the first must find it running; later ones may not
                [ $k = 1 ] && ok=0
                break
            fi
            ip netns exec "$A" ss -K -t dst "$(netns_addr b 0)" >"$dir/ss-$k.log" 2>&1
            killed=$((killed + $(grep -c ESTAB "$dir/ss-$k.log")))
            sleep 0.2
        done ;;
    esac
    tl=$(now_ms)
    [ $ok = 1 ] || detail+="the requester ended before the last fault step: too few operations (MH_PATH_OPS); "
    path_pair_end
    links_up
    if [ "$action" = kill ] && [ $ok = 1 ] && [ $killed = 0 ]; then
        report "$name" n/a $((tl - tf)) "ss -K closed no connection of the first path (kernel without CONFIG_INET_DIAG_DESTROY?): $(tr '\n' ' ' <"$dir/ss-1.log" | cut -c1-100)"
        return
    fi
    path_result "$dir"
    [ $res_ok = 1 ] || ok=0
    # the failovers the device counted (the host's totals: both sides)
    local fo delta pre stall mb0 mb1 expect
    if tcp_rows "$dir/devinfo-after"; then
        fo=$(($(row "$dir/devinfo-after" failovers) - $(row "$dir/devinfo-before" failovers)))
        delta=$(tcp_delta "$dir/devinfo-before" "$dir/devinfo-after")
        if [ "$fo" -gt 0 ]; then
            detail+="$fo failovers counted"
        else
            ok=0
            detail+="no failover counted"
        fi
        detail+=" (tcp fabric: ${delta:-no row changed})"
    else
        ok=0
        detail+="no failover counted: hca_devinfo -v failed after the run ($dir/devinfo-after.full)"
    fi
    [ "$action" = kill ] && detail+="; $killed connections killed"
    read -r pre stall mb0 mb1 <<<"$(path_stats "$dir/samples" "$tf" $((t0 + run_ms - 100)))"
    expect=$((ops * 1000 / (path_rate > 0 ? path_rate : 1)))
    detail+="; recovery: longest stall after the first fault $(secs "$stall")s (< 1/4 of $((pre / 1000)) MB/s)"
    detail+="; run $(secs "$run_ms")s for $ops puts, $(secs "$expect")s at the baseline's rate"
    detail+="; links hmveth0 $mb0 MB, hmveth1 $mb1 MB"
    if [ $ok = 1 ]; then
        report "$name" PASS "$run_ms" "$detail"
        [ "${MH_KEEP:-0}" = 1 ] || rm -rf "$dir"
    else
        report "$name" FAIL "$run_ms" "$detail (logs $dir)"
    fi
}

run_faults() {
    echo "--- fault cases (UCX_HCA_PEER_TIMEOUT=2s, limit ${FAULT_LIMIT}s each)"
    local f faults=${MH_FAULTS:-kill-perftest kill-ucp kill-mixed reset link-down stop stop-target path-down path-kill path-flap}
    if [ "$faults" != kill-perftest ] && ! build_ucp_peer; then
        report "fault ucp_peer build" FAIL 0 "cannot build test/reliability/ucp_peer.c"
        return
    fi
    for f in $faults; do
        case $f in
        kill-perftest) fault_kill_perftest ;;
        kill-ucp)  ucp_fault kill-ucp kill ;;
        kill-mixed) ucp_fault kill-mixed kill mixed ;;
        reset)     ucp_survive reset "${MH_RESET_WL:-put}" "${MH_RESET_OPS:-100000}" ;;
        link-down) ucp_fault link-down down ;;
        stop)      ucp_fault stop stop ;;
        stop-target) ucp_fault stop-target stopt ;;
        path-down) ucp_path path-down down ;;
        path-kill) ucp_path path-kill kill ;;
        path-flap) ucp_path path-flap flap ;;
        *) echo "run-multihost: unknown fault case $f" >&2 ;;
        esac
    done
}

[ $mode = faults ] || run_matrix
[ $mode = matrix ] || run_faults
# reap what was killed here (quietly)
wait 2>/dev/null

echo "multihost: $total runs, $pass passed, $fail failed, $na n/a, $((SECONDS - t_start)) s"
[ $fail = 0 ]
