# common.sh - sourced by the reliability campaign scripts.
#
# Environment (all optional):
#   HCA_BUILD_DIR  build tree with libhcadev and libuct_hca.so
#                  (default: <source>/build-rel)
#   REL_BIN        where the helper programs are built
#                  (default: $HCA_BUILD_DIR/test/reliability)
#   REL_LOGDIR     logs of failed runs (default: $REL_BIN/logs/<campaign>)
#   REL_TIMEOUT    seconds a process may take before it counts as hung and
#                  is killed with SIGKILL (default: 20)
#   REL_BACKTRACE  0: no gdb backtrace of hung processes (default: one,
#                  in the run directory as hang-PID.bt, if gdb is there)
#   REL_SEED       seed of the random choices (default: from the clock);
#                  printed, so a failing campaign can be replayed
#   REL_KEEPALIVE  UCX_KEEPALIVE_INTERVAL for the UCP programs (default:
#                  UCX's own, 20s; hca's device finds a dead peer within
#                  100 ms by itself, so a passive side needs no busier
#                  keepalive)
#   UCX_TLS        default hca,self
#
# shellcheck shell=bash
# shellcheck disable=SC2034 # rel_rc, rel_hung... are read by the scripts

rel_srcdir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rel_topsrc=$(cd "$rel_srcdir/../.." && pwd)
rel_build=${HCA_BUILD_DIR:-$rel_topsrc/build-rel}
rel_bin=${REL_BIN:-$rel_build/test/reliability}
rel_timeout=${REL_TIMEOUT:-20}
rel_seed=${REL_SEED:-$(( ${EPOCHREALTIME/./} % 1000000 ))}
RANDOM=$rel_seed

rel_say() { echo "$rel_name: $*" >&2; }

# rel_setup NAME: names the campaign, builds the helpers, makes the log
# directory.  Exits 2 if that fails.
rel_setup() {
    rel_name=$1
    rel_logdir=${REL_LOGDIR:-$rel_bin/logs/$1}
    mkdir -p "$rel_logdir" || exit 2
    make -s -C "$rel_srcdir" -f helpers.mk HCA_BUILD="$rel_build" O="$rel_bin" \
        >"$rel_logdir/build.log" 2>&1 || {
        cat "$rel_logdir/build.log" >&2
        rel_say "error: cannot build the helpers (is $rel_build built?)"
        exit 2
    }
    rel_say "seed $rel_seed (REL_SEED), timeout ${rel_timeout}s per process, logs of failed runs in $rel_logdir"
}

# Exports what UCP programs need to run over hca (as contrib/hca-run does).
rel_ucx_env() {
    local mod=$rel_build/src/uct/hca/.libs/libuct_hca.so
    [ -f "$mod" ] || { rel_say "error: $mod not built"; exit 2; }
    export LD_PRELOAD=$mod${LD_PRELOAD:+:$LD_PRELOAD}
    export UCX_TLS=${UCX_TLS:-hca,self}
    if [ -n "${REL_KEEPALIVE:-}" ]; then
        export UCX_KEEPALIVE_INTERVAL=$REL_KEEPALIVE
    fi
}

# A fresh run directory (kept only if rel_keep_run is called).
rel_new_run() {
    rel_run_dir=$(mktemp -d "$rel_logdir/run.XXXXXX") || exit 2
    chmod 0755 "$rel_run_dir"
}

rel_keep_run() { rel_kept=$((${rel_kept:-0} + 1)); }
rel_drop_run() { rm -rf "$rel_run_dir"; }

rel_now_us() { echo "${EPOCHREALTIME/./}"; }

# Random integer in [0, $1).
rel_rand() { echo $(( (RANDOM * 32768 + RANDOM) % $1 )); }

# Sleeps $1 milliseconds.
rel_sleep_ms() { sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"; }

# Is process $1 running (a zombie is not)?
rel_alive() {
    local stat
    read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
    stat=${stat##*) }
    [ "${stat:0:1}" != Z ]
}

# rel_backtrace PID: every thread's stack of a hung process, into
# $rel_run_dir/hang-PID.bt (if gdb is installed and REL_BACKTRACE != 0).
rel_backtrace() {
    [ "${REL_BACKTRACE:-1}" != 0 ] && command -v gdb >/dev/null || return 0
    timeout -s KILL 30 gdb -p "$1" -batch -ex 'thread apply all bt' \
        >"$rel_run_dir/hang-$1.bt" 2>&1
}

# The innermost hca function on the main thread's stack of hung process
# $1, if any ("hca_mr_dereg"); gdb lists the main thread as "Thread 1".
rel_hang_where() {
    awk '/^Thread / {main = ($2 == 1)}
         main && match($0, / in [A-Za-z0-9_]*hca[A-Za-z0-9_]* /) {
             print substr($0, RSTART + 4, RLENGTH - 5); exit }' \
        "$rel_run_dir/hang-$1.bt" 2>/dev/null
}

# rel_wait PID SECONDS: waits for child PID; if it still runs after
# SECONDS, takes its backtrace and kills it with SIGKILL.  Sets rel_rc (its
# exit status) and rel_hung (1 if it was killed here).
rel_wait() {
    local pid=$1 end=$(( $(rel_now_us) + $2 * 1000000 ))
    rel_hung=0
    while rel_alive "$pid"; do
        if [ "$(rel_now_us)" -gt "$end" ]; then
            rel_backtrace "$pid"
            kill -9 "$pid" 2>/dev/null
            rel_hung=1
            break
        fi
        sleep 0.01
    done
    wait "$pid" 2>/dev/null
    rel_rc=$?
}

# rel_wait_files DIR SECONDS FILE...: 0 once every FILE exists in DIR.
rel_wait_files() {
    local dir=$1 end=$(( $(rel_now_us) + $2 * 1000000 )) f missing
    shift 2
    while :; do
        missing=0
        for f in "$@"; do
            [ -e "$dir/$f" ] || missing=1
        done
        [ $missing = 0 ] && return 0
        [ "$(rel_now_us)" -gt "$end" ] && return 1
        sleep 0.005
    done
}

# "median/max" of the numbers on stdin, "-/-" if none.
rel_median_max() {
    sort -n | awk '{v[NR] = $1} END {
        if (NR == 0) { print "-/-"; exit }
        printf "%d/%d\n", v[int((NR + 1) / 2)], v[NR] }'
}

# Value of key $2 in a "k=v k=v" line $1.
rel_field() { sed -n "s/.*\\b$2=\\([^ ]*\\).*/\\1/p" <<<"$1"; }
