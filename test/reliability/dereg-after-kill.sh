#!/bin/bash
#
# dereg-after-kill.sh - hca_mr_dereg after the requester that was copying
# into the region was SIGKILLed (device level, libhcadev).
#
# usage: test/reliability/dereg-after-kill.sh N
#
# Runs dev_dereg.c N times, alternating heap memory and device memory
# (hca_dm_alloc), with a random delay of 0-100 ms between the requester's
# first completed 64 MiB RDMA and its kill (a 64 MiB copy takes longer
# than that, so the kill lands mid-copy).  A dereg that takes more than
# REL_DEREG_LIMIT seconds (default 10) is a hang: the process is killed.
# Prints one line per failed run, then the summary line (hangs per memory
# kind, the longest dereg that returned); exits 1 if any run failed.
# Environment: see common.sh.
#
set -u
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [ $# -ne 1 ]; then
    sed -n '3,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
runs=$1
limit=${REL_DEREG_LIMIT:-10}
rel_setup dereg-after-kill

ok=0 hangs=0 hang_heap=0 hang_dm=0 crashes=0 errors=0
times=()
for ((i = 1; i <= runs; i++)); do
    rel_new_run
    d=$rel_run_dir
    mem=heap
    [ $((i % 2)) = 0 ] && mem=dm
    delay=$(rel_rand 100)
    "$rel_bin/dev_dereg" "$mem" "$delay" >"$d/out.log" 2>&1 &
    pid=$!
    # setup and the first 64 MiB copy take a few seconds at most
    rel_wait "$pid" $((limit + 5))
    out=$(cat "$d/out.log")
    t=$(sed -n 's/^dereg_ms=\([0-9.]*\).*/\1/p' <<<"$out")
    if [ $rel_hung = 1 ] && grep -q '^dereg start' <<<"$out" && [ -z "$t" ]; then
        hangs=$((hangs + 1))
        [ $mem = heap ] && hang_heap=$((hang_heap + 1)) || hang_dm=$((hang_dm + 1))
        echo "run $i: $mem, kill ${delay} ms into the copies: HANG: hca_mr_dereg did not return (logs: $d)"
        rel_keep_run
    elif [ $rel_hung = 1 ]; then
        hangs=$((hangs + 1))
        [ $mem = heap ] && hang_heap=$((hang_heap + 1)) || hang_dm=$((hang_dm + 1))
        echo "run $i: $mem: HANG outside dereg ($(rel_hang_where "$pid")): $(tail -n 1 <<<"$out") (logs: $d)"
        rel_keep_run
    elif [ $rel_rc -gt 128 ]; then
        crashes=$((crashes + 1))
        echo "run $i: $mem: CRASH: signal $((rel_rc - 128)) (logs: $d)"
        rel_keep_run
    elif [ $rel_rc != 0 ] || [ -z "$t" ] || ! grep -q 'rc=0$' <<<"$out"; then
        errors=$((errors + 1))
        echo "run $i: $mem: exit status $rel_rc: $(tail -n 1 <<<"$out") (logs: $d)"
        rel_keep_run
    elif awk -v t="$t" -v l="$limit" 'BEGIN {exit !(t > l * 1000)}'; then
        hangs=$((hangs + 1))
        [ $mem = heap ] && hang_heap=$((hang_heap + 1)) || hang_dm=$((hang_dm + 1))
        echo "run $i: $mem: hca_mr_dereg took $t ms (over ${limit}s) (logs: $d)"
        rel_keep_run
    else
        ok=$((ok + 1))
        times+=("$t")
        rel_drop_run
    fi
done

max_ms=$(printf '%s\n' ${times[@]+"${times[@]}"} | grep . | sort -g | tail -n 1)
echo "dereg-after-kill: runs=$runs ok=$ok hangs=$hangs (heap=$hang_heap dm=$hang_dm) crashes=$crashes errors=$errors dereg_ms(max)=${max_ms:--}"
[ $((hangs + crashes + errors)) = 0 ]
