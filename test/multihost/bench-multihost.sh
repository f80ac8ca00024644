#!/bin/bash
#
# bench-multihost.sh - hca's tcp fabric against UCX's tcp transport, between
# two network namespaces joined by a veth pair (test/multihost/netns.sh).
#
# usage: test/multihost/bench-multihost.sh [BUILD_DIR] [ROUNDS]
#
#   BUILD_DIR  the hca build tree (default: $HCA_BUILD_DIR, else <repo>/build)
#   ROUNDS     rounds (default 3); each round runs every row once, hca and
#              tcp back to back; the table shows medians
#
# Rows (ucx_perftest, server in namespace a, client in namespace b):
#   uct am_lat short 8 B      hca (UCX_TLS=hca -x hca -d hca0) vs
#                             tcp (UCX_TLS=tcp -x tcp -d <veth>)
#   uct put_bw zcopy 1 MiB    hca vs tcp (zcopy; bcopy if tcp lacks it)
#   uct get zcopy 1 MiB       hca only (UCX's tcp has no get)
#   uct fadd 8 B              hca only (UCX's tcp has no atomics)
#   ucp tag_lat 8 B           UCX_TLS=hca,self vs UCX_TLS=tcp,self
#   ucp tag_bw 1 MiB          UCX_TLS=hca,self vs UCX_TLS=tcp,self
#
# Latencies are the median of the run (50th percentile, us), bandwidths
# the run's average (MB/s); a run that failed shows as nan and is left out
# of the median.  Pinned (the default), each process's threads share one
# CPU: hca's fabric thread (the responder, and the reader of every frame)
# competes with the busy-polling main thread; MH_BENCH_PIN=0 shows the
# other side of it (and the scheduler's millisecond stalls on a loaded
# machine).  hca/tcp < 1 is better for latency, > 1 for
# bandwidth.  Not root: a SKIPPED line and exit status 0.
#
# Environment: HCA_BUILD_DIR, MH_BENCH_PIN=0 (do not pin the server and
# the client to CPUs 0 and 1), MH_BENCH_SCALE (multiplies the iteration
# counts, default 1).
#
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
topsrc=$(cd "$here/../.." && pwd)
# shellcheck source=netns.sh
. "$here/netns.sh"

netns_check bench-multihost || exit 0
build=${1:-${HCA_BUILD_DIR:-$topsrc/build}}
rounds=${2:-3}
build=$(cd "$build" 2>/dev/null && pwd) || { echo "bench-multihost: error: no build directory" >&2; exit 2; }
module=$build/src/uct/hca/.libs/libuct_hca.so
[ -f "$module" ] || { echo "bench-multihost: error: $module not built" >&2; exit 2; }
command -v ucx_perftest >/dev/null ||
    { echo "bench-multihost: SKIPPED: ucx_perftest not installed"; exit 0; }

logdir=$(mktemp -d /tmp/hca-mhbench.XXXXXX)
cleanup() { netns_teardown; rm -rf "$logdir"; }
netns_setup 2 2>/dev/null || { echo "bench-multihost: error: cannot set up the namespaces" >&2; exit 1; }
trap cleanup EXIT
trap 'cleanup; trap - INT; kill -INT $$' INT
trap 'cleanup; trap - TERM; kill -TERM $$' TERM

addr_a=$(netns_addr a)
ifname=$(netns_if a)
scale=${MH_BENCH_SCALE:-1}
pin_s=() pin_c=()
if [ "${MH_BENCH_PIN:-1}" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    pin_s=(taskset -c 0) pin_c=(taskset -c 1)
fi

# does UCX's tcp do put_zcopy on the veth?
tcp_put=zcopy
if ! ip netns exec "$(netns_name a)" ucx_info -d -t tcp 2>/dev/null | grep -q 'put_zcopy'; then
    tcp_put=bcopy
fi

port=$((20000 + RANDOM % 20000))
# run ENV... -- ARGS...: one server/client pair; prints the client's CSV
# field $field (2: 50th percentile latency, 5: average bandwidth) or nan
run() {
    local envw=() args=() srv out i
    while [ "$1" != -- ]; do envw+=("$1"); shift; done
    shift
    args=("$@")
    port=$((port + 1))
    ip netns exec "$(netns_name a)" timeout -s KILL 60 "${pin_s[@]}" \
        env LD_PRELOAD="$module" "${envw[@]}" ucx_perftest -p "$port" \
        >"$logdir/server" 2>&1 &
    srv=$!
    for i in $(seq 1 100); do
        ip netns exec "$(netns_name a)" ss -Hltn "sport = :$port" | grep -q . && break
        sleep 0.05
    done
    out=$(ip netns exec "$(netns_name b)" timeout -s KILL 60 "${pin_c[@]}" \
        env LD_PRELOAD="$module" "${envw[@]}" ucx_perftest "$addr_a" -p "$port" \
        "${args[@]}" -v 2>"$logdir/client.err" | grep -E '^ *[0-9]+,' | tail -n 1)
    for i in $(seq 1 40); do kill -0 $srv 2>/dev/null || break; sleep 0.05; done
    kill -KILL $srv 2>/dev/null
    wait $srv 2>/dev/null
    # a run without a result line, or with a zero, failed: nan (left out
    # of the median, shown in the runs)
    if [ -n "$out" ]; then
        cut -d, -f"$field" <<<"${out// /}" | awk '{ print ($1 + 0 > 0) ? $1 : "nan" }'
    else
        echo nan
    fi
}

median() {
    tr ' ' '\n' | grep -v '^$\|nan' | sort -g | awk '{v[NR] = $1} END {
        if (NR == 0) { print "nan"; exit }
        if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

n_lat=$((2000 * scale)) n_bw=$((200 * scale))
# label | field | hca env ; hca args | tcp env ; tcp args (empty: none)
rows=(
    "uct am_lat short 8 B|2|UCX_TLS=hca;-t am_lat -x hca -d hca0 -D short -s 8 -n $n_lat -w $((n_lat / 10))|UCX_TLS=tcp;-t am_lat -x tcp -d $ifname -D short -s 8 -n $n_lat -w $((n_lat / 10))"
    "uct put_bw zcopy 1 MiB|5|UCX_TLS=hca;-t put_bw -x hca -d hca0 -D zcopy -s 1048576 -n $n_bw -w $((n_bw / 10))|UCX_TLS=tcp;-t put_bw -x tcp -d $ifname -D $tcp_put -s 1048576 -n $n_bw -w $((n_bw / 10))"
    "uct get zcopy 1 MiB|5|UCX_TLS=hca;-t get -x hca -d hca0 -D zcopy -s 1048576 -n $n_bw -w $((n_bw / 10))|"
    "uct fadd 8 B|2|UCX_TLS=hca;-t fadd -x hca -d hca0 -s 8 -n $n_lat -w $((n_lat / 10))|"
    "ucp tag_lat 8 B|2|UCX_TLS=hca,self;-t tag_lat -s 8 -n $n_lat -w $((n_lat / 10))|UCX_TLS=tcp,self;-t tag_lat -s 8 -n $n_lat -w $((n_lat / 10))"
    "ucp tag_bw 1 MiB|5|UCX_TLS=hca,self;-t tag_bw -s 1048576 -n $n_bw -w $((n_bw / 10))|UCX_TLS=tcp,self;-t tag_bw -s 1048576 -n $n_bw -w $((n_bw / 10))"
)

echo "bench-multihost: namespaces ${netns_names[*]} over a veth pair ($ifname), $rounds rounds${pin_s[*]:+, server on CPU 0, client on CPU 1}"
echo "bench-multihost: load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
declare -A res=()
t0=$SECONDS
for r in $(seq 1 "$rounds"); do
    for i in "${!rows[@]}"; do
        IFS='|' read -r label field hca tcp <<<"${rows[$i]}"
        # alternate the order each round
        for side in $([ $((r % 2)) = 1 ] && echo "hca tcp" || echo "tcp hca"); do
            if [ "$side" = hca ]; then spec=$hca; else spec=$tcp; fi
            [ -n "$spec" ] || continue
            # shellcheck disable=SC2086 # words
            v=$(run ${spec%%;*} -- ${spec#*;})
            res[$i,$side]+="$v "
        done
    done
    printf '.' >&2
done
echo >&2

printf '%-24s %12s %12s %10s  %s\n' row hca tcp hca/tcp ""
for i in "${!rows[@]}"; do
    IFS='|' read -r label field hca tcp <<<"${rows[$i]}"
    h=$(median <<<"${res[$i,hca]:-}")
    if [ -n "$tcp" ]; then t=$(median <<<"${res[$i,tcp]:-}"); else t=-; fi
    if [ "$field" = 2 ]; then unit=us what="latency, lower is better"; else unit=MB/s what="bandwidth, higher is better"; fi
    ratio=$(awk -v h="$h" -v t="$t" 'BEGIN { if (h + 0 > 0 && t + 0 > 0) printf "%.2f", h / t; else print "-" }')
    note=$what
    [ -z "$tcp" ] && note="$what; UCX's tcp has no such operation"
    [ "$label" = "uct put_bw zcopy 1 MiB" ] && [ "$tcp_put" = bcopy ] && note="$what; tcp: put_bw bcopy"
    printf '%-24s %9s %-4s %7s %-4s %8s  (%s)\n' "$label" "$h" "$unit" "$t" "$([ "$t" = - ] || echo "$unit")" "$ratio" "$note"
    echo "  runs: hca ${res[$i,hca]:-}${tcp:+| tcp ${res[$i,tcp]:-}}"
done
echo "bench-multihost: $((SECONDS - t0)) s"
