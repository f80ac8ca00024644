#!/bin/bash
#
# qp-churn.sh - create, connect, use and destroy many QPs against one
# target process (device level, libhcadev).
#
# usage: test/reliability/qp-churn.sh N [sc|nsc]
#
# Runs dev_churn.c: N QPs one after the other, each with a fetch-add on
# the target's plain memory (the target's service thread executes it) and
# an RDMA READ of 8 B - 512 KiB, checked.  sc (default): single copy (CMA)
# for the reads; nsc: both sides open the device with
# HCA_OPEN_NO_SINGLE_COPY (what UCX_HCA_SINGLE_COPY=n does), so the reads
# go through the target's service thread too.  An operation that does not
# complete within 5 s is stuck.  The whole program may take 60 s + N/2 s
# before it counts as hung.  The summary gives the mappings of the target
# and of the requester (lines of /proc/PID/maps) after setup and after the
# last QP: growth means each QP left a mapping behind (reported, not
# judged).  Exits 1 on stuck operations, errors, corruption, a hang or a
# crash.  Environment: see common.sh.
#
set -u
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    sed -n '3,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
n=$1 mode=${2:-sc}
case $mode in sc|nsc) ;; *) echo "bad mode $mode" >&2; exit 2 ;; esac
rel_setup "qp-churn-$mode"
rel_new_run
d=$rel_run_dir

"$rel_bin/dev_churn" "$n" "$mode" >"$d/out.log" 2>"$d/err.log" &
pid=$!
rel_wait "$pid" $((60 + n / 2))
line=$(grep '^qps=' "$d/out.log")
hang=0 crash=0
if [ $rel_hung = 1 ]; then
    hang=1
    echo "HANG: dev_churn did not finish ($(rel_hang_where "$pid"); last: $(tail -n 1 "$d/err.log")) (logs: $d)"
elif [ $rel_rc -gt 128 ]; then
    crash=1
    echo "CRASH: dev_churn died of signal $((rel_rc - 128)) (logs: $d)"
fi
if [ -n "$line" ]; then
    head -n 5 "$d/err.log"
    ok=$(rel_field "$line" ok) stuck=$(rel_field "$line" stuck)
    errors=$(rel_field "$line" errors) corrupt=$(rel_field "$line" corrupt)
    tmaps=$(rel_field "$line" target_maps) rmaps=$(rel_field "$line" requester_maps)
else
    ok=- stuck=- errors=- corrupt=- tmaps=-/- rmaps=-/-
fi
echo "qp-churn $mode: qps=$n ok=$ok stuck=$stuck errors=$errors corruptions=$corrupt hangs=$hang crashes=$crash target_maps(start/end)=$tmaps requester_maps(start/end)=$rmaps"
if [ $rel_rc = 0 ] && [ $hang = 0 ]; then
    rel_drop_run
    exit 0
fi
rel_keep_run
exit 1
