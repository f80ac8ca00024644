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
#
# One line per run (name, result, seconds, what was measured), a summary
# line; exit status 1 if a run failed, 0 otherwise.  Not root, or no
# network namespaces: a SKIPPED line and exit status 0.
#
# Environment: HCA_BUILD_DIR, MH_TIMEOUT (default 20), MH_FAULT_LIMIT
# (default 15), MH_LOGDIR (default: a temporary directory, kept if a run
# failed), MH_FILTER (a regular expression: only the matrix tests whose
# name matches), MH_FAULTS (the fault cases to run, default all:
# "kill-perftest kill-ucp kill-mixed reset link-down stop stop-target"),
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

# ucp_pair_start NAME DIR WORKLOAD [OPS]: ucp_peer's target in a and
# requester in b, both with the fault environment; sets $tgt and $req and
# returns 0 once both say "traffic", else reports NAME failed, kills them
# and returns 1
ucp_pair_start() {
    local name=$1 dir=$2 wl=$3 ops=${4:-} t0 i
    mkdir -p "$dir"
    chmod 0777 "$dir"
    local penv=("${fault_env[@]}" "UCX_TLS=hca,self" REL_RUN_LIMIT=$((FAULT_LIMIT + 10)))
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
    local name="fault $1" action=$2 dir=$logdir/f-$1 tgt req tk detail=
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
    local name="fault $1" wl=$2 ops=$3 dir=$logdir/f-$1 tgt req tk k
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

run_faults() {
    echo "--- fault cases (UCX_HCA_PEER_TIMEOUT=2s, limit ${FAULT_LIMIT}s each)"
    local f faults=${MH_FAULTS:-kill-perftest kill-ucp kill-mixed reset link-down stop stop-target}
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
