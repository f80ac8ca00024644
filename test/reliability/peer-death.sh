#!/bin/bash
#
# peer-death.sh - a UCP peer is SIGKILLed; the survivor must notice and end
# cleanly.
#
# usage: test/reliability/peer-death.sh N WORKLOAD MEM
#
#   N         runs
#   WORKLOAD  put | get | amo | am | tag | mixed
#   MEM       heap | mapped
#
# Each run starts a target and a requester (ucp_peer.c: endpoints with
# UCP_ERR_HANDLING_MODE_PEER both ways over UCX_TLS=hca,self) and kills one
# of them, chosen at random, with SIGKILL: in 85% of the runs 0-300 ms
# after both are running traffic, in 15% 0-50 ms after start-up (before or
# during the address exchange).  The survivor must see the failure, close
# and clean up (force close, requests, ucp_mem_unmap, worker, context) and
# exit 0 within REL_TIMEOUT seconds.  Counted per run:
#
#   ok           the survivor ended cleanly (noticed the failure, or never
#                met its peer when that died at start-up)
#   hangs        the survivor did not exit in time (killed; the step it was
#                in is printed: ep_close, requests, mem_unmap, ...)
#   crashes      a process died of a signal it was not sent
#   corruptions  the survivor found data no peer wrote (see ucp_peer.c)
#   undetected   the survivor saw no failure within REL_RUN_LIMIT (12 s)
#   errors       anything else (setup failed, a failure seen before the
#                kill, an unexpected exit status)
#
# abandoned (informational) is the number of fetch-adds the survivors gave
# up: UCP 1.13 never completes a fetching atomic it held in a pending
# queue when the endpoint failed, over any transport (see ucp_peer.c and
# ucp_amo_purge.c).  detect_ms is the time from the kill to the survivor's
# first error callback or failed request.  Prints one line per failed run,
# then the summary line; exits 1 if any run failed.  Environment: see
# common.sh.
#
set -u
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [ $# -ne 3 ]; then
    sed -n '3,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
runs=$1 wl=$2 mem=$3
case $wl in put|get|amo|am|tag|mixed) ;; *) echo "bad WORKLOAD $wl" >&2; exit 2 ;; esac
case $mem in heap|mapped) ;; *) echo "bad MEM $mem" >&2; exit 2 ;; esac

rel_setup "peer-death-$wl-$mem"
rel_ucx_env
prog=$rel_bin/ucp_peer

ok=0 hangs=0 crashes=0 corrupt=0 undetected=0 errors=0 abandoned=0
detect=()

# Prints why run $1 failed and keeps its directory.
run_failed() {
    echo "run $1: victim=$victim kill=$when: $2 (logs: $rel_run_dir)"
    rel_keep_run
}

for ((i = 1; i <= runs; i++)); do
    rel_new_run
    d=$rel_run_dir
    if [ $((RANDOM % 2)) = 0 ]; then
        victim=target survivor=requester
    else
        victim=requester survivor=target
    fi
    "$prog" target "$wl" "$mem" "$d" >"$d/target.log" 2>&1 &
    pid_target=$!
    "$prog" requester "$wl" "$mem" "$d" >"$d/requester.log" 2>&1 &
    pid_requester=$!
    if [ "$(rel_rand 100)" -lt 15 ]; then
        delay=$(rel_rand 50)
        when="start+${delay}ms"
    else
        delay=$(rel_rand 300)
        when="traffic+${delay}ms"
        if ! rel_wait_files "$d" 10 target.ready requester.ready; then
            kill -9 "$pid_target" "$pid_requester" 2>/dev/null
            wait "$pid_target" "$pid_requester" 2>/dev/null
            errors=$((errors + 1))
            run_failed "$i" "the pair did not start traffic within 10 s"
            continue
        fi
    fi
    rel_sleep_ms "$delay"
    if [ $victim = target ]; then vpid=$pid_target spid=$pid_requester
    else vpid=$pid_requester spid=$pid_target; fi
    kill_us=$(rel_now_us)
    kill -9 "$vpid"

    rel_wait "$vpid" 5
    vrc=$rel_rc
    rel_wait "$spid" "$rel_timeout"
    src=$rel_rc
    result=$(cat "$d/$survivor.result" 2>/dev/null)
    status=$(rel_field "$result" status)
    a=$(rel_field "$result" abandoned)
    abandoned=$((abandoned + ${a:-0}))
    if [ $rel_hung = 1 ]; then
        hangs=$((hangs + 1))
        run_failed "$i" "HANG: the $survivor did not exit within ${rel_timeout}s, in step '$(cat "$d/$survivor.stage" 2>/dev/null || echo setup)' ($(rel_hang_where "$spid")) after: $(cat "$d/$survivor.outcome" 2>/dev/null || echo -)"
    elif [ "$src" -gt 128 ]; then
        crashes=$((crashes + 1))
        run_failed "$i" "CRASH: the $survivor died of signal $((src - 128))"
    elif [ "$vrc" -ne 137 ]; then
        if [ "$vrc" -gt 128 ]; then
            crashes=$((crashes + 1))
            run_failed "$i" "CRASH: the $victim died of signal $((vrc - 128)) before the kill"
        else
            errors=$((errors + 1))
            run_failed "$i" "the $victim exited with status $vrc before the kill"
        fi
    elif [ "$src" = 3 ]; then
        corrupt=$((corrupt + 1))
        run_failed "$i" "CORRUPTION seen by the $survivor: $result"
    elif [ "$src" = 4 ]; then
        undetected=$((undetected + 1))
        run_failed "$i" "the $survivor never saw its peer fail: $result"
    elif [ "$src" = 0 ] && [ "$status" = detected ]; then
        ms=$(( ($(rel_field "$result" detect_ns) / 1000 - kill_us) / 1000 ))
        if [ "$ms" -lt 0 ]; then
            errors=$((errors + 1))
            run_failed "$i" "the $survivor saw a failure ${ms#-} ms before the kill: $result"
        else
            ok=$((ok + 1))
            detect+=("$ms")
            rel_drop_run
        fi
    elif [ "$src" = 5 ]; then
        ok=$((ok + 1))     # killed before the address exchange: nothing to see
        rel_drop_run
    else
        errors=$((errors + 1))
        run_failed "$i" "the $survivor exited with status $src: ${result:-no result}"
    fi
done

dms=$(printf '%s\n' ${detect[@]+"${detect[@]}"} | grep . | rel_median_max)
echo "peer-death $wl $mem: runs=$runs ok=$ok hangs=$hangs crashes=$crashes corruptions=$corrupt undetected=$undetected errors=$errors abandoned=$abandoned detect_ms(median/max)=$dms"
[ $((hangs + crashes + corrupt + undetected + errors)) = 0 ]
