#!/bin/bash
#
# run-all.sh - every reliability campaign, with small or large sizes.
#
# usage: test/reliability/run-all.sh [--short|--long]
#
#   --short (default)  a few runs of each (a few minutes on 2 cores;
#                      REL_TIMEOUT 10 s, survivors give up after 8 s), a
#                      20-second soak
#   --long             100 runs per peer-death workload and memory kind,
#                      100 dereg runs, 2000 QPs, a 10-minute soak
#
# Prints each campaign's summary line as it ends (its details go to
# $REL_BIN/logs/run-all.log), then a total; exits 1 if any campaign
# failed.  Environment: see common.sh (REL_SEED applies to every campaign).
#
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/common.sh"

mode=${1:---short}
case $mode in
--short)
    export REL_TIMEOUT=${REL_TIMEOUT:-10} REL_RUN_LIMIT=${REL_RUN_LIMIT:-8}
    pd_runs=2 pd_combos="put:heap get:heap amo:heap am:heap tag:heap mixed:heap put:mapped mixed:mapped"
    dereg_runs=4 churn_qps=100 opens=10 soak_secs=20 ;;
--long)
    pd_runs=100 pd_combos=""
    for wl in put get amo am tag mixed; do
        pd_combos+=" $wl:heap $wl:mapped"
    done
    dereg_runs=100 churn_qps=2000 opens=50 soak_secs=600 ;;
*)  sed -n '3,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
export REL_SEED=$rel_seed
log=$rel_bin/logs/run-all.log
mkdir -p "$(dirname "$log")"
: >"$log"

failed=0 total=0
t0=$SECONDS
# campaign SCRIPT ARGS...: runs it, prints its summary line (the last line
# of its output).
campaign() {
    local out rc
    echo "=== $*" >>"$log"
    # both streams append to the log (O_APPEND): nothing reads it here
    # shellcheck disable=SC2094
    out=$("$here/$1" "${@:2}" 2>>"$log" | tee -a "$log" | tail -n 1;
          exit "${PIPESTATUS[0]}")
    rc=$?
    total=$((total + 1))
    if [ $rc != 0 ]; then
        failed=$((failed + 1))
    fi
    echo "$out"
}

echo "run-all $mode: seed $rel_seed, details in $log"
for c in $pd_combos; do
    campaign peer-death.sh "$pd_runs" "${c%:*}" "${c#*:}"
done
campaign dereg-after-kill.sh "$dereg_runs"
campaign qp-churn.sh "$churn_qps" sc
campaign qp-churn.sh "$churn_qps" nsc
campaign uid-isolation.sh "$opens"
campaign soak.sh "$soak_secs"
echo "run-all $mode: $total campaigns, $failed failed, $((SECONDS - t0)) s"
[ $failed = 0 ]
