#!/bin/bash
#
# uid-isolation.sh - what an unprivileged user can do to the device's
# processes of other users, and whether users can talk to each other.
#
# usage: test/reliability/uid-isolation.sh [OPENS]
#
# (a) Squatting.  As nobody (setpriv --reuid=65534 --regid=65534
#     --clear-groups), squat.c claims the abstract socket names
#     (hca.<pidns>.<pid>.0.svc, .cq0-.cq3) and /dev/shm objects
#     (hca.<pidns>.<pid>.0.ctx0) of the next REL_SQUAT_PIDS (default 1500)
#     pids.  Then OPENS (default 20) processes as root and OPENS as daemon
#     (uid 1) open the device, a PD and four CQs (dev_open.c), which takes
#     one of those pids each.  Counted: failed opens, compared with the
#     same number of opens before the squatter started (the baseline).
# (b) Across users.  A root process and a nobody process run 2000 mixed
#     UCP operations (ucp_peer.c, UCX_TLS=hca,self), the root one as the
#     target and then as the requester.  Reported per direction: works,
#     or fails with its first error and after how long, or hangs.
#
# Prints details, then the summary line; exits 1 if the squatter made any
# open fail, or anything hung or crashed.  Environment: see common.sh.
#
set -u
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

opens=${1:-20}
squat_pids=${REL_SQUAT_PIDS:-1500}
nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
daemon=(setpriv --reuid=1 --regid=1 --clear-groups)
rel_setup uid-isolation
[ "$(id -u)" = 0 ] || { rel_say "error: must run as root"; exit 2; }
rel_new_run
# Other users run the helpers, the library and the module from a copy in
# a directory they can reach: the build tree may lie under a private one
# (a clone in a mktemp -d directory, mode 0700).
stage=$(mktemp -d /tmp/hca-uid.XXXXXX) || exit 2
trap 'cp -r "$stage/run/." "$rel_run_dir/" 2>/dev/null; rm -rf "$stage"' EXIT
chmod 0755 "$stage"
cp "$rel_bin/dev_open" "$rel_bin/squat" "$rel_bin/ucp_peer" \
   "$rel_build"/src/hca_dev/.libs/libhcadev.so* \
   "$rel_build/src/uct/hca/.libs/libuct_hca.so" "$stage/" || exit 2
chmod -R a+rX "$stage"
export LD_LIBRARY_PATH=$stage${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
rel_bin=$stage
d=$stage/run
mkdir -p "$d" && chmod 0777 "$d"
hangs=0 crashes=0

# open_batch LABEL CMD...: runs dev_open $opens times as CMD; sets
# batch_fail and prints the first error.
open_batch() {
    local label=$1 k rc first=""
    shift
    batch_fail=0
    for ((k = 0; k < opens; k++)); do
        timeout -s KILL "$rel_timeout" "$@" "$rel_bin/dev_open" 2>>"$d/open-$label.log"
        rc=$?
        if [ $rc = 137 ] || [ $rc = 124 ]; then
            hangs=$((hangs + 1))
            echo "$label: dev_open HANG" >>"$d/open-$label.log"
        elif [ $rc -gt 128 ]; then
            crashes=$((crashes + 1))
            echo "$label: dev_open died of signal $((rc - 128))" >>"$d/open-$label.log"
        fi
        [ $rc != 0 ] && batch_fail=$((batch_fail + 1))
    done
    first=$(head -n 1 "$d/open-$label.log" 2>/dev/null)
    [ -n "$first" ] && echo "  $label: $batch_fail/$opens opens failed, first: $first"
}

echo "(a) squatting"
open_batch base-root
base_root=$batch_fail
open_batch base-daemon "${daemon[@]}"
base_daemon=$batch_fail

"${nobody[@]}" "$rel_bin/squat" "$squat_pids" "$d" >"$d/squat.log" 2>&1 &
squat_pid=$!
if ! rel_wait_files "$d" 60 squat.ready; then
    echo "  the squatter did not start: $(cat "$d/squat.log")"
    kill -9 "$squat_pid" 2>/dev/null
    exit 2
fi
read -r sq_first sq_last sq_sockets sq_shm <"$d/squat.ready"
echo "  nobody holds $sq_sockets socket names and $sq_shm shm objects for pids $sq_first..$sq_last"
open_batch squat-root
sq_root=$batch_fail
open_batch squat-daemon "${daemon[@]}"
sq_daemon=$batch_fail
kill -TERM "$squat_pid"
rel_wait "$squat_pid" 30

echo "(b) UCP between root and nobody"
rel_ucx_env
export LD_PRELOAD=$stage/libuct_hca.so
# outcome ROLE: what ROLE saw before its cleanup, with the time of its
# first error since the pair started ($t0, $sub of cross).
outcome() {
    local o det
    o=$(cat "$sub/$1.outcome" 2>/dev/null) || { echo "(no outcome)"; return; }
    det=$(rel_field "$o" detect_ns)
    if [ "${det:-0}" != 0 ]; then
        o+=" (first error $(( (det / 1000 - t0) / 1000 )) ms after start)"
    fi
    echo "$o"
}

# cross TARGET_USER REQUESTER_USER: sets cross_result
cross() {
    local tcmd=() rcmd=() t1 tpid rpid rrc res
    sub=$d/$1-to-$2
    [ "$1" = nobody ] && tcmd=("${nobody[@]}")
    [ "$2" = nobody ] && rcmd=("${nobody[@]}")
    mkdir -p "$sub" && chmod 0777 "$sub"
    t0=$(rel_now_us)
    ${tcmd[@]+"${tcmd[@]}"} "$rel_bin/ucp_peer" target mixed heap "$sub" 2000 \
        >"$sub/target.log" 2>&1 &
    tpid=$!
    ${rcmd[@]+"${rcmd[@]}"} "$rel_bin/ucp_peer" requester mixed heap "$sub" 2000 \
        >"$sub/requester.log" 2>&1 &
    rpid=$!
    rel_wait "$rpid" "$rel_timeout"
    rrc=$rel_rc
    local rhung=$rel_hung
    t1=$(rel_now_us)
    rel_wait "$tpid" 15
    res=$(cat "$sub/requester.result" 2>/dev/null)
    local ms=$(( (t1 - t0) / 1000 ))
    if [ "$rhung" = 1 ] || [ "$rel_hung" = 1 ]; then
        hangs=$((hangs + 1))
        cross_result="HANG(requester stage: $(cat "$sub/requester.stage" 2>/dev/null), target stage: $(cat "$sub/target.stage" 2>/dev/null))"
        echo "  $1 target, $2 requester: HANG; requester $(outcome requester); target $(outcome target)"
    elif [ "$rrc" -gt 128 ] || [ "$rel_rc" -gt 128 ]; then
        crashes=$((crashes + 1))
        cross_result="CRASH(requester $rrc, target $rel_rc)"
    elif [ "$rrc" = 0 ] && [ "$rel_rc" = 0 ]; then
        cross_result="works(${ms}ms)"
    else
        cross_result="fails(${ms}ms,$(rel_field "$res" first_error))"
        echo "  $1 target, $2 requester: requester exit $rrc, target exit $rel_rc; requester: $res; $(outcome requester)"
        grep -m 3 -i 'error\|fail' "$sub/requester.log" "$sub/target.log" | sed 's/^/    /'
    fi
}
cross root nobody
root_nobody=$cross_result
cross nobody root
nobody_root=$cross_result

echo "uid-isolation: squat(nobody, $sq_sockets sockets, $sq_shm shm): root_open_fail=$sq_root/$opens (baseline $base_root) uid1_open_fail=$sq_daemon/$opens (baseline $base_daemon) ucp root-target/nobody-requester=$root_nobody nobody-target/root-requester=$nobody_root hangs=$hangs crashes=$crashes"
if [ $((sq_root - base_root + sq_daemon - base_daemon + hangs + crashes)) -gt 0 ]; then
    rel_keep_run
    exit 1
fi
rel_drop_run
exit 0
