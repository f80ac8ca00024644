#!/bin/bash
#
# soak.sh - many-to-one UCP traffic for a while, senders killed at random.
#
# usage: test/reliability/soak.sh SECONDS
#
# One receiver (ucp_soak.c recv) runs for SECONDS; REL_SOAK_SENDERS
# (default 3) senders at a time send it tagged messages, puts and atomics,
# each for 0.3-2 s.  40% of the senders are SIGKILLed at a random moment
# of their run, the others end with FIN.  Then the receiver stops, checks
# and cleans up.  Counted: lost (messages of senders that sent FIN that
# never arrived), duplicated, reordered and corrupted messages; receives
# aborted by a dying sender and receives given up (both informational: a
# sender killed between two fragments of an eager message leaves a receive
# that UCP 1.13 never completes nor cancels, over any transport, so the
# receiver gives it up once this script has recorded that sender's kill in
# DIR/killed; see ucp_soak.c and ucp_frag_kill.c); hangs (a sender that
# outlives its run by REL_TIMEOUT seconds, a receiver that does not end
# within REL_TIMEOUT after the stop: the step it is in is printed),
# crashes, and errors (a sender that saw a failure although the receiver
# was alive, an unexpected exit status).  Prints details, then the summary
# line; exits 1 on anything but aborted or given-up receives.
# Environment: see common.sh.
#
set -u
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [ $# -ne 1 ]; then
    sed -n '3,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
secs=$1
conc=${REL_SOAK_SENDERS:-3}
rel_setup soak
rel_ucx_env
rel_new_run
d=$rel_run_dir
prog=$rel_bin/ucp_soak

"$prog" recv "$d" >"$d/recv.log" 2>&1 &
rpid=$!
rel_wait_files "$d" 30 recv.addr || { echo "the receiver did not start: $(cat "$d/recv.log")"; exit 2; }

declare -A sid=() kill_at=() deadline=() killed=()
nsend=0 finished=0 nkilled=0 hangs=0 crashes=0 errors=0
end=$(( ${EPOCHREALTIME/./} + secs * 1000000 ))

# reap PID: classifies a sender that ended.
reap() {
    local pid=$1 rc
    wait "$pid" 2>/dev/null
    rc=$?
    if [ -n "${killed[$pid]:-}" ]; then
        if [ $rc = 137 ]; then
            nkilled=$((nkilled + 1))
        elif [ $rc = 0 ]; then
            # it ended its run (FIN sent) just before its kill landed
            finished=$((finished + 1))
        else
            errors=$((errors + 1))
            echo "sender ${sid[$pid]}: exit status $rc before its kill"
        fi
    elif [ $rc = 0 ]; then
        finished=$((finished + 1))
    elif [ $rc -gt 128 ]; then
        crashes=$((crashes + 1))
        echo "sender ${sid[$pid]}: CRASH: signal $((rc - 128)) ($(tail -n 1 "$d/send.${sid[$pid]}.log"))"
    else
        errors=$((errors + 1))
        echo "sender ${sid[$pid]}: exit status $rc: $(tail -n 1 "$d/send.${sid[$pid]}.log")"
    fi
    unset "sid[$pid]" "kill_at[$pid]" "deadline[$pid]" "killed[$pid]"
}

# bash reports every sender it sees killed ("Killed ..."): to a log
exec 3>&2 2>>"$d/shell.log"
while :; do
    now=${EPOCHREALTIME/./}
    if ! rel_alive "$rpid"; then
        echo "the receiver died during the soak"
        break
    fi
    if [ "$now" -lt "$end" ]; then
        while [ ${#sid[@]} -lt "$conc" ]; do
            nsend=$((nsend + 1))
            dur_ms=$((300 + $(rel_rand 1700)))
            "$prog" send "$d" "$nsend" "$(printf '%d.%03d' $((dur_ms / 1000)) $((dur_ms % 1000)))" \
                >"$d/send.$nsend.log" 2>&1 &
            sid[$!]=$nsend
            deadline[$!]=$(( now + (dur_ms / 1000 + rel_timeout) * 1000000 ))
            # start-up takes a few hundred ms: the kill lands in the traffic
            if [ "$(rel_rand 100)" -lt 40 ]; then
                kill_at[$!]=$(( now + (200 + $(rel_rand dur_ms)) * 1000 ))
            fi
        done
    elif [ ${#sid[@]} = 0 ]; then
        break
    fi
    for pid in "${!sid[@]}"; do
        if ! rel_alive "$pid"; then
            reap "$pid"
        elif [ -n "${kill_at[$pid]:-}" ] && [ -z "${killed[$pid]:-}" ] &&
             [ "$now" -ge "${kill_at[$pid]}" ]; then
            kill -9 "$pid"
            killed[$pid]=1
            # after the kill: the receiver may give up a receive of it
            echo "${sid[$pid]} $(rel_now_us)" >>"$d/killed"
        elif [ "$now" -gt "${deadline[$pid]}" ]; then
            hangs=$((hangs + 1))
            rel_backtrace "$pid"
            echo "sender ${sid[$pid]}: HANG: still running ${rel_timeout}s after its end, in step '$(cat "$d/send.${sid[$pid]}.stage" 2>/dev/null)' ($(rel_hang_where "$pid"))"
            kill -9 "$pid"
            wait "$pid" 2>/dev/null
            unset "sid[$pid]" "kill_at[$pid]" "deadline[$pid]" "killed[$pid]"
        fi
    done
    sleep 0.02
done
exec 2>&3 3>&-

touch "$d/stop"
rel_wait "$rpid" "$rel_timeout"
res=$(cat "$d/recv.result" 2>/dev/null)
if [ $rel_hung = 1 ]; then
    hangs=$((hangs + 1))
    echo "receiver: HANG after the stop, in step '$(cat "$d/recv.stage" 2>/dev/null)' ($(rel_hang_where "$rpid")); before the stop: $(cat "$d/recv.outcome" 2>/dev/null)"
elif [ $rel_rc -gt 128 ]; then
    crashes=$((crashes + 1))
    echo "receiver: CRASH: signal $((rel_rc - 128))"
elif [ -z "$res" ]; then
    errors=$((errors + 1))
    echo "receiver: exit status $rel_rc without a result: $(tail -n 1 "$d/recv.log")"
fi
grep -m 5 CORRUPTION "$d/recv.log"
f() { local v; v=$(rel_field "$res" "$1"); echo "${v:--}"; }
lost=$(f lost) dup=$(f duplicated) reord=$(f reordered) corr=$(f corrupt)
bad=$((hangs + crashes + errors))
for v in "$lost" "$dup" "$reord" "$corr"; do
    [ "$v" = - ] || bad=$((bad + v))
done
[ -z "$res" ] && bad=$((bad + 1))
if [ $bad = 0 ]; then
    rel_drop_run
else
    echo "logs: $d"
    rel_keep_run
fi
echo "soak ${secs}s: senders=$nsend finished=$finished killed=$nkilled msgs=$(f msgs) lost=$lost duplicated=$dup reordered=$reord corruptions=$corr aborted=$(f aborted) abandoned=$(f abandoned) hangs=$hangs crashes=$crashes errors=$errors"
[ $bad = 0 ]
