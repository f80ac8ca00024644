#!/bin/bash
#
# hca-bench.sh - compare hca with UCX's built-in shared-memory transports,
# and (level hosts) with UCX's tcp transport between two hosts.
#
# usage: contrib/bench/hca-bench.sh [options]
#
#   --long           longer, steadier run: more runs per row, 4x the
#                    iterations, extra sizes 4 KiB and 16 MiB, NetPIPE up
#                    to 16 MiB (hosts: 4 MiB)
#   -o, --out DIR    output directory (default: ./bench-out)
#   --build DIR      hca build directory (default: <repo>/build, or
#                    $HCA_BUILD_DIR)
#   --levels LIST    comma-separated subset of uct,ucp,defaults,heap,mid,netpipe,sweep,
#                    hosts, the levels of contrib/bench/hca-bench.matrix
#                    (default: all six; hosts only as root where network
#                    namespaces can be made, else a "SKIPPED" line)
#   --reps N         runs per target row (default 5, --long 7); the other
#                    rows run once (--long: 3)
#   --no-install     do not install missing packages
#   --no-pin         let the scheduler place the ucx_perftest server and
#                    client (default: server on CPU 0, client on CPU 1 with
#                    taskset, when there are 2 CPUs or more)
#   --ab-old-build DIR
#                    A/B mode (contrib/bench/hca-ab.sh builds the old side
#                    and calls this): compare the hca build of --build (NEW)
#                    with the one in DIR (OLD) instead of hca with the
#                    built-in transports. Every uct/ucp row that involves
#                    hca runs OLD and NEW back to back, the order
#                    alternating each repetition (ABBA), --reps times each
#                    (every row, not only the target rows); the built-in
#                    transports are not run. Levels: uct and ucp only
#                    (default both). Before the runs, LD_DEBUG=libs proves
#                    that each side loads its own libuct_hca.so and
#                    libhcadev.so.0. The summary is the A/B table (old and
#                    new medians, new/old, each build's run-to-run
#                    spread, SLOWER flags); exit status 3 if a row is
#                    SLOWER.
#   --ab-old-label TEXT
#                    name of the old side in the A/B table (e.g. a git
#                    revision; default: DIR)
#   -h, --help       this text
#
# The UCX is the one the build was configured against: build/ the system's,
# a build of `HCA_UCX=PREFIX contrib/hca-setup.sh build` (build-ucx-<ver>)
# that prefix's, e.g. --build build-ucx-1.22.0 measures hca against UCX
# 1.22.0's own posix, cma and tcp.
#
# What it runs (hca and the built-in transports interleaved back to back:
# hca, built-in, hca, built-in, ...; the levels, sizes, rows, targets and
# transports are the records of contrib/bench/hca-bench.matrix):
#   uct      ucx_perftest UCT tests, hca0 against posix (short, bcopy,
#            atomics) or cma (zcopy), whichever `ucx_info -d` says supports
#            the operation and size
#   ucp      ucx_perftest UCP tests, UCX_TLS=hca,self against
#            UCX_TLS=posix,cma,self
#   mid      UCP at the mid sizes MPI users meet (1 KiB to 64 KiB, every
#            power of 2): ucp_put_lat, ucp_get, ucp_put_bw, tag_bw,
#            UCX_TLS=hca,self against posix,cma,self, UCP's automatic
#            thresholds (where its zero-copy registration costs show);
#            targets: latency <= 1.05, bandwidth >= 0.95; plots mid-*.png
#   netpipe  NetPIPE (NPopenmpi) over OpenMPI's pml ucx with both sets
#   sweep    size sweeps of UCP tag_lat/tag_bw and UCT put_bw zcopy (plots)
#   hosts    between two hosts: two network namespaces on a bridge
#            (contrib/hca-hosts.sh), one process per host, hca (its tcp
#            fabric) against UCX's tcp transport on the namespaces'
#            interface, interleaved:
#            - ucx_perftest (server on host a, client on host b): uct
#              am_lat short 8 B (UCX_TLS=hca -x hca -d hca0 vs -x tcp -d
#              <if>), put_bw zcopy -O16 1 MiB (tcp: zcopy or bcopy, per
#              ucx_info), get zcopy bw -O16 1 MiB (hca only: UCX's tcp has
#              no get); ucp tag_lat 8 B, tag_bw 1 MiB (UCX_TLS=hca,self vs
#              tcp,self)
#            - NetPIPE (NPopenmpi) and hca_osc_bench (contrib/bench: MPI_Put
#              and MPI_Get bandwidth 8 B..1 MiB, MPI_Fetch_and_op latency;
#              osc ucx) under build/contrib/hca-run mpirun, one rank per
#              host, UCX_TLS=hca,self vs UCX_TLS=tcp,self (UCX's tcp does
#              the one-sided operations with active messages)
#            Targets (issue 28): latency at 8 B (am_lat, tag_lat, NetPIPE)
#            hca/tcp <= 0.9; put_bw, tag_bw, NetPIPE peak, MPI_Put and
#            MPI_Get at 1 MiB hca/tcp >= 1.5.
#            CPU cost: the put_bw, get and tag_bw rows (the matrix's
#            hosts-cpu records) run both processes under GNU time
#            (/usr/bin/time): user+sys seconds of server and client per GB
#            through host a's interface (rx + tx bytes during the run),
#            target hca/tcp <= 0.7 for put_bw and tag_bw (OUT/hosts-cpu.tsv).
#            Ceiling: iperf3, one TCP stream from host b to host a, pinned
#            as ucx_perftest, 3 runs of 3 s (median; OUT/hosts-iperf.tsv);
#            every bandwidth row is shown as a fraction of it.
#            ucx_perftest rows: --reps runs each; NetPIPE and hca_osc_bench:
#            3 runs each (--long: 5). MPI ranks are pinned with a rankfile
#            (--no-pin: --bind-to none). The first MPI run of each set logs
#            UCX's endpoints (UCX_LOG_LEVEL=info): they must use hca/hca0 or
#            tcp/<if>. About 3.5 minutes; docs/BENCHMARKS.md "Between hosts".
# and a cache-line ping-pong (hca_pingpong_bench raw_shm) before each level
# and at the end, so a reader can see the machine's state.
#
# Output: tables on stdout (also OUT/summary.txt), PNG plots in OUT (hosts:
# hosts-netpipe-*.png, hosts-osc-bandwidth.png), raw logs in OUT/logs.
# Exit status 0 unless a benchmark failed to run.
#
# Environment: HCA_BUILD_DIR, HCA_BENCH_PORT (first TCP port of the
# ucx_perftest runs, default 23000).
#
set -uo pipefail

topdir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
benchdir=$topdir/contrib/bench
builddir=${HCA_BUILD_DIR:-$topdir/build}
outdir=$PWD/bench-out
long=no
levels=            # default: every level of the matrix
reps_target=
do_install=yes
pin=yes
port=${HCA_BENCH_PORT:-23000}
ab_old=            # A/B mode: the old build directory
ab_old_label=
levels_given=no
build_given=no     # --build: measure that build as it is, never build it

log() { echo "hca-bench: $*" >&2; }
die() { echo "hca-bench: error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case $1 in
    --long)        long=yes ;;
    -o|--out)      outdir=${2:?}; shift ;;
    --build)       builddir=${2:?}; build_given=yes; shift ;;
    --levels)      levels=${2:?}; levels_given=yes; shift ;;
    --reps)        reps_target=${2:?}; shift ;;
    --no-install)  do_install=no ;;
    --no-pin)      pin=no ;;
    --ab-old-build) ab_old=${2:?}; shift ;;
    --ab-old-label) ab_old_label=${2:?}; shift ;;
    -h|--help)     sed -n '3,/^# ucx_perftest runs, default/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *)             die "unknown option '$1' (see --help)" ;;
    esac
    shift
done
case $outdir in /*) ;; *) outdir=$PWD/$outdir ;; esac
case $builddir in /*) ;; *) builddir=$PWD/$builddir ;; esac
if [ -n "$ab_old" ]; then
    case $ab_old in /*) ;; *) ab_old=$PWD/$ab_old ;; esac
    ab_old_label=${ab_old_label:-$ab_old}
fi

# ---------------------------------------------------------------- settings
# The matrix (levels, sizes, rows, targets, the other side's transports,
# the hosts level's commands) is contrib/bench/hca-bench.matrix, which the
# summary reads too; this script only sequences the runs it describes.
KiB=1024
MiB=$((1024 * 1024))
matrix=$benchdir/hca-bench.matrix
[ -r "$matrix" ] || die "cannot read $matrix"

# matrix_records TYPE: the TYPE records of the matrix without their type,
# one a line, columns trimmed and joined by "|" ("-" left as it is: `read`
# with IFS=| keeps empty columns, but a "-" makes a missing one visible).
matrix_records() {
    awk -F'|' -v type="$1" '
        /^[ \t]*(#|$)/ { next }
        { sub(/[ \t]+#.*$/, "") }
        {
            for (i = 1; i <= NF; i++) gsub(/^[ \t]+|[ \t]+$/, "", $i)
            if ($1 != type) next
            out = $2
            for (i = 3; i <= NF; i++) out = out "|" $i
            print out
        }' "$matrix"
}

# bytes_of LIST: sets $bytes to LIST ("8 64K 1M") in bytes ("8 65536 1048576")
bytes_of() {
    local s
    bytes=
    for s in $1; do
        case $s in
        *K) s=$((${s%K} * KiB)) ;;
        *M) s=$((${s%M} * MiB)) ;;
        esac
        bytes+="${bytes:+ }$s"
    done
}

# settings[NAME]: the "set" records, the column of this mode (default or
# --long); sizeset[NAME]: the "sizes" records in bytes, likewise.
declare -A settings sizeset
while IFS='|' read -r name v_default v_long; do
    if [ "$long" = yes ]; then v=$v_long; else v=$v_default; fi
    case $v in *[0-9][KM]) bytes_of "$v"; v=$bytes ;; esac
    settings[$name]=$v
done < <(matrix_records set)
# Every setting this script uses: a matrix without one stops the run here,
# not halfway through with an empty value.
for name in reps_target reps_other iter_scale run_timeout np_upper \
            np_repeats np_reps np_timeout hosts_mpi_reps hosts_np_upper \
            hosts_np_repeats hosts_lat_iters hosts_bw_iters osc_iters \
            hosts_iperf_reps hosts_iperf_secs hosts_iperf_len ab_levels; do
    [ -n "${settings[$name]:-}" ] || die "$matrix: no 'set | $name' record"
done
setting() { echo "${settings[$1]}"; }
while IFS='|' read -r name v_default v_long; do
    if [ "$long" = yes ]; then bytes_of "$v_long"; else bytes_of "$v_default"; fi
    sizeset[$name]=$bytes
done < <(matrix_records sizes)
# sizes_of COLUMN: sets $bytes to the sizes a SIZES column names ("-": none)
sizes_of() {
    case $1 in
    -)     bytes= ;;
    [0-9]*) bytes_of "$1" ;;
    *)     [ -n "${sizeset[$1]+set}" ] || die "$matrix: no sizes '$1'"
           bytes=${sizeset[$1]} ;;
    esac
}

reps_target=${reps_target:-$(setting reps_target)}
reps_other=$(setting reps_other)
iter_scale=$(setting iter_scale)
run_timeout=$(setting run_timeout)
np_upper=$(setting np_upper); np_repeats=$(setting np_repeats); np_reps=$(setting np_reps)
np_timeout=$(setting np_timeout)
hosts_mpi_reps=$(setting hosts_mpi_reps); hosts_np_upper=$(setting hosts_np_upper)
hosts_np_repeats=$(setting hosts_np_repeats)

# The levels, in run order: the matrix's "level" records.
all_levels=$(matrix_records level | cut -d'|' -f1 | paste -sd, -)
[ -n "$all_levels" ] || die "$matrix: no levels"
if [ -n "$ab_old" ]; then
    ab_levels=$(setting ab_levels)
    ab_allowed=$ab_levels,$(setting ab_levels_more)
    [ "$levels_given" = yes ] || levels=$ab_levels
    for l in ${levels//,/ }; do
        case ",$ab_allowed," in *",$l,"*) ;;
        *) die "A/B mode: level '$l' (only ${ab_allowed//,/, })" ;; esac
    done
fi
levels=${levels:-$all_levels}
for l in ${levels//,/ }; do
    case ",$all_levels," in *",$l,"*) ;; *) die "unknown level '$l'" ;; esac
done

module=$builddir/src/uct/hca/.libs/libuct_hca.so
pingpong=$builddir/contrib/hca_pingpong_bench
hca_env=(LD_PRELOAD="$module")
ucp_hca_env=(LD_PRELOAD="$module" "UCX_TLS=hca,self")
# The other side of the rows: the matrix's uct-builtin (TL, device) and
# ucp-builtin (name, environment words) records.
uct_builtins=(); uct_builtin_devs=(); ucp_builtins=(); ucp_builtin_envs=()
while IFS='|' read -r tl dev; do
    uct_builtins+=("$tl"); uct_builtin_devs+=("$dev")
done < <(matrix_records uct-builtin)
while IFS='|' read -r tl e; do
    ucp_builtins+=("$tl"); ucp_builtin_envs+=("$e")
done < <(matrix_records ucp-builtin)
# Levels with their own two sides (ucp-sides: the defaults, heap memory).
declare -A sides_hca_name sides_hca_env sides_other_name sides_other_env
while IFS='|' read -r lv hn he on oe; do
    [ "$he" = - ] && he=
    [ "$oe" = - ] && oe=
    sides_hca_name[$lv]=$hn; sides_hca_env[$lv]=$he
    sides_other_name[$lv]=$on; sides_other_env[$lv]=$oe
done < <(matrix_records ucp-sides)
if [ -n "$ab_old" ]; then
    # Every row runs as often as a target row.  Each side's libhcadev.so.0
    # is named explicitly: the module's RUNPATH points at its own build,
    # but an inherited LD_LIBRARY_PATH would take precedence.
    reps_other=$reps_target
    module_old=$ab_old/src/uct/hca/.libs/libuct_hca.so
    [ -f "$module_old" ] || die "A/B mode: $module_old missing"
    hca_env=(LD_PRELOAD="$module" LD_LIBRARY_PATH="$builddir/src/hca_dev/.libs")
    hca_env_old=(LD_PRELOAD="$module_old" LD_LIBRARY_PATH="$ab_old/src/hca_dev/.libs")
    ucp_hca_env=("${hca_env[@]}" "UCX_TLS=hca,self")
    ucp_hca_env_old=("${hca_env_old[@]}" "UCX_TLS=hca,self")
fi

# -------------------------------------------------------------- preparation
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root to run '$*'"
    fi
}

pkg_installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = \
      "install ok installed" ]
}

install_missing() {
    local missing=() p
    for p in "$@"; do
        pkg_installed "$p" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$do_install" = no ]; then
        log "warning: missing packages (not installing): ${missing[*]}"
        return 0
    fi
    log "installing: ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        "${missing[@]}" >&2 ||
    {
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            "${missing[@]}" >&2
    } || die "could not install ${missing[*]}"
}

has_level() { case ",$levels," in *",$1,"*) return 0 ;; esac; return 1; }

pkgs=(ucx-utils python3 iproute2)
[ -n "$ab_old" ] || pkgs+=(gnuplot-nox)    # A/B mode draws no plots
has_level netpipe && pkgs+=(netpipe-openmpi openmpi-bin)
has_level hosts && pkgs+=(netpipe-openmpi openmpi-bin libopenmpi-dev util-linux
                          iperf3 time)
install_missing "${pkgs[@]}"
for c in ucx_perftest ucx_info python3 ss timeout; do
    command -v $c >/dev/null 2>&1 || die "$c not found"
done
if has_level netpipe || has_level hosts; then
    for c in mpirun NPopenmpi; do
        command -v $c >/dev/null 2>&1 || die "$c not found"
    done
fi

if [ ! -f "$module" ]; then
    # a directory given with --build is measured as it is: building this
    # tree's sources into it would measure other code than the caller meant
    [ "$build_given" = no ] ||
        die "--build $builddir: no $module (not an hca build directory?)"
    log "$module missing: building (contrib/hca-setup.sh build)"
    HCA_BUILD_DIR=$builddir "$topdir/contrib/hca-setup.sh" build >&2 ||
        die "build failed"
fi
if [ ! -x "$pingpong" ]; then
    log "building $pingpong"
    make -C "$builddir/contrib" hca_pingpong_bench >&2 ||
        die "could not build hca_pingpong_bench"
fi

# ucx_info -v: "# Version 1.13.1" (1.13), "# Library version: 1.22.0" (1.22)
ucx_version() {
    ucx_info -v 2>/dev/null |
        sed -n 's/^# Version //p; s/^# Library version: //p' | head -n 1
}

# The UCX the build was configured against (configure --with-ucx=PREFIX,
# hca-setup.sh's HCA_UCX): hca-run --env says how that UCX loads hca (the
# preload, or its directory scan) and, for a prefix, its PATH and
# LD_LIBRARY_PATH, which every program here then uses: hca and UCX's own
# transports are measured with the same UCX.
if [ -z "$ab_old" ]; then
    make -s -C "$builddir/contrib" hca-run >&2 || die "cannot build hca-run"
    mapfile -t run_env < <("$builddir/contrib/hca-run" --env) ||
        die "hca-run --env failed"
    hca_env=()
    for e in "${run_env[@]}"; do
        case $e in
        PATH=*|LD_LIBRARY_PATH=*) export "${e?}" ;;
        *) hca_env+=("$e") ;;
        esac
    done
    ucp_hca_env=("${hca_env[@]}" "UCX_TLS=hca,self")
    log "UCX $(ucx_version) ($(command -v ucx_perftest)); hca loaded by ${hca_env[*]}"
fi

mkdir -p "$outdir/logs" || die "cannot create $outdir"
rm -f "$outdir"/logs/* "$outdir"/*.tsv "$outdir"/*.dat "$outdir"/*.png \
      "$outdir"/*.gp "$outdir"/summary.txt "$outdir"/hosts-rankfile \
      "$outdir"/hca-bench.matrix
# the matrix this run used, which the summary then reads (its netpipe and
# osc targets, the table titles) rather than a later edit of it
cp "$matrix" "$outdir/hca-bench.matrix" || die "cannot write $outdir"
results=$outdir/results.tsv     # level row kind tl rep value status note
rows=$outdir/rows.tsv           # level row label size metric target
machine=$outdir/machine.tsv     # when raw_shm_ns send_ns rdma_write_ns
netpipe_tsv=$outdir/netpipe.tsv # kind tl rep file status note
hosts_np_tsv=$outdir/hosts-netpipe.tsv  # kind tl rep file status note
hosts_osc_tsv=$outdir/hosts-osc.tsv     # kind tl rep test size value status note
hosts_tl_tsv=$outdir/hosts-transports.tsv  # kind tl what ep_cfg status
# row kind tl rep status size iters warmup, then wall user sys (seconds)
# of the server and of the client, then host a's interface rx and tx bytes
hosts_cpu_tsv=$outdir/hosts-cpu.tsv
# rep status receiver_bps sender_bps retransmits bytes seconds
# sender_cpu% receiver_cpu% note (iperf3 -J: end.sum_received, ...)
hosts_iperf_tsv=$outdir/hosts-iperf.tsv
: >"$results"; : >"$rows"; : >"$machine"; : >"$netpipe_tsv"
: >"$hosts_np_tsv"; : >"$hosts_osc_tsv"; : >"$hosts_tl_tsv"
: >"$hosts_cpu_tsv"; : >"$hosts_iperf_tsv"
# Two busy-polling processes on 2 vCPUs: left to the scheduler they
# sometimes share one CPU, and the 50th-percentile latency then hides the
# time slices (an atomic on a line nobody else touches meanwhile looks 3x
# faster, for posix and hca alike).  One CPU each gives one mode.
pin_srv=()
pin_cli=()
if [ "$pin" = yes ] && command -v taskset >/dev/null 2>&1 &&
   [ "$(nproc)" -ge 2 ]; then
    pin_srv=(taskset -c 0)
    pin_cli=(taskset -c 1)
fi
{
    echo "date	$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host	$(uname -n) $(uname -r), $(nproc) cpus"
    echo "mode	$([ "$long" = yes ] && echo long || echo default)"
    echo "ucx	$(ucx_version)"
    echo "module	$module"
    echo "loadavg	$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "pinning	$([ ${#pin_srv[@]} -gt 0 ] && echo "ucx_perftest server on CPU 0, client on CPU 1" || echo "none (scheduler)")"
    if [ -n "$ab_old" ]; then
        echo "ab_old	$ab_old"
        echo "ab_old_label	$ab_old_label"
        echo "ab_new	$builddir"
        echo "reps	$reps_target"
    fi
} >"$outdir/info.tsv"

# Processes started by this script, killed (by pid) on exit.
bg_pids=()
hosts_dir=         # level hosts: the hca-hosts.sh directory while it is up
# shellcheck disable=SC2317  # called from the EXIT trap
cleanup() {
    local p
    for p in "${bg_pids[@]}"; do
        kill "$p" 2>/dev/null
    done
    hosts_down
}
# Removes the namespace hosts (and kills what still runs in them).
hosts_down() {
    [ -n "$hosts_dir" ] || return 0
    "$topdir/contrib/hca-hosts.sh" down "$hosts_dir" >/dev/null 2>&1
    rm -rf "$hosts_dir"
    hosts_dir=
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

t_start=$(date +%s)
nfail=0

# --------------------------------------------------------------- machine
# raw_shm / send / rdma_write one-way medians (ns) of hca_pingpong_bench.
machine_state() {
    local when=$1 out
    out=$(timeout 60 "$pingpong" -n $((20000 * iter_scale)) -w 2000 2>&1)
    echo "$out" >"$outdir/logs/pingpong-$when.log"
    echo "$out" | awk -v when="$when" '
        $1 == "raw_shm" { r = $3 } $1 == "send" { s = $3 }
        $1 == "rdma_write" { w = $3 }
        END { printf "%s\t%s\t%s\t%s\n", when, r == "" ? "-" : r,
                     s == "" ? "-" : s, w == "" ? "-" : w }' >>"$machine"
    log "machine state ($when): cache-line ping-pong raw_shm $(tail -n 1 "$machine" | cut -f2) ns one-way"
}

# ------------------------------------------------------------ capabilities
# caps[KEY:op] / caps_min[KEY:op]: read_caps, read_caps_as and size_fits
# (contrib/bench/ucx-caps.sh; self-test: contrib/bench/test-ucx-caps.sh)
# shellcheck source=contrib/bench/ucx-caps.sh
. "$benchdir/ucx-caps.sh"

# op name of a UCT test + layout
uct_op() {
    case $1 in
    am_lat|am_bw)   echo "am_$2" ;;
    put_lat|put_bw) echo "put_$2" ;;
    get)            echo "get_$2" ;;
    fadd)           echo atomic_fadd ;;
    cswap)          echo atomic_cswap ;;
    *)              echo "$1_$2" ;;
    esac
}

# ------------------------------------------------------------- perftest
# iterations for a run: about 512 MiB of payload (x iter_scale), between
# 30 and 100000 (latency) / 200000 (bandwidth) iterations.
iters_for() {
    local metric=$1 size=$2 n cap
    cap=100000
    [ "$metric" = bw ] && cap=200000
    n=$((512 * MiB / size))
    [ $n -gt $cap ] && n=$cap
    [ $n -lt 30 ] && n=30
    echo $((n * iter_scale))
}

free_port() {
    while ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; do
        port=$((port + 1))
    done
}

runno=0
last_value=
last_note=
# level hosts: command prefixes that put the server and the client in their
# namespaces, and the server's address
pt_srv_ns=()
pt_cli_ns=()
pt_server=localhost
# level hosts, the hosts-cpu rows: pt_cpu=yes runs the server and the
# client under GNU time (user and sys seconds of each process, all its
# threads) and reads the interface pt_wire_if of host a (pt_srv_ns) before
# and after the pair; perftest() then sets last_cpu (the CPU columns of
# hosts-cpu.tsv, from "size"), which record() writes.
pt_cpu=no
pt_wire_if=
last_cpu=
# wire_bytes: "RX TX" bytes of pt_wire_if in host a, or "- -"
# (pt_wire_if: interfaces, blank-separated: their sums)
wire_bytes() {
    local i rx=0 tx=0 v
    for i in $pt_wire_if; do
        v=$("${pt_srv_ns[@]}" cat "/sys/class/net/$i/statistics/rx_bytes" \
            "/sys/class/net/$i/statistics/tx_bytes" 2>/dev/null | paste -sd' ' -)
        case $v in
        [0-9]*' '[0-9]*) rx=$((rx + ${v% *})); tx=$((tx + ${v#* })) ;;
        *) echo "- -"; return ;;
        esac
    done
    [ -n "$pt_wire_if" ] && echo "$rx $tx" || echo "- -"
}
# cpu_fields LOG "RX0 TX0" "RX1 TX1" ARGS...: the CPU columns of one run
# (size, -n, -w of ARGS; wall, user, sys of LOG.time-server and
# LOG.time-client, "-" where missing; the interface's deltas)
cpu_fields() {
    local log=$1 w0=$2 w1=$3 size=- n=- w=- f t r0 t0 r1 t1 out
    shift 3
    while [ $# -gt 0 ]; do
        case $1 in
        -s) size=${2:-}; shift ;;
        -n) n=${2:-}; shift ;;
        -w) w=${2:-}; shift ;;
        esac
        shift
    done
    out="$size	$n	$w"
    for f in server client; do
        # GNU time writes "Command exited with non-zero status N" (or
        # "terminated by signal") first: its last line has the figures
        t=$(tail -n 1 "$log.time-$f" 2>/dev/null)
        case $t in
        [0-9]*' '[0-9]*' '[0-9]*) out+="	${t// /	}" ;;
        *) out+="	-	-	-" ;;
        esac
    done
    read -r r0 t0 <<<"$w0"
    read -r r1 t1 <<<"$w1"
    if [ "$r0" != - ] && [ "$r1" != - ]; then
        out+="	$((r1 - r0))	$((t1 - t0))"
    else
        out+="	-	-"
    fi
    echo "$out"
}
# wait_listen PID: until the server PID (in pt_srv_ns) listens on $port,
# it exits, or 20 s pass.
wait_listen() {
    local i
    for ((i = 0; i < 400; i++)); do
        "${pt_srv_ns[@]}" ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && return 0
        kill -0 "$1" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# perftest ENVWORDS... -- ARGS... : run one server/client pair; sets
# last_value (usec 50%ile or MB/s overall, per $metric) or returns 1 with
# last_note = the error text.
perftest() {
    local envw=() args=() spid rc i line log tsrv=() tcli=() w0=
    while [ "$1" != -- ]; do envw+=("$1"); shift; done
    shift
    args=("$@")
    runno=$((runno + 1))
    port=$((port + 1))
    free_port
    log=$outdir/logs/perftest-$(printf %03d $runno)
    last_cpu=
    if [ "$pt_cpu" = yes ]; then
        tsrv=(/usr/bin/time -f '%e %U %S' -o "$log.time-server")
        tcli=(/usr/bin/time -f '%e %U %S' -o "$log.time-client")
        rm -f "$log.time-server" "$log.time-client"
        w0=$(wire_bytes)
    fi
    {
        echo "${pt_srv_ns[*]:+${pt_srv_ns[*]} }env ${envw[*]} ${pin_srv[*]} ${tsrv[*]} ucx_perftest ${args[*]} -p $port"
        [ ${#pt_cli_ns[@]} -eq 0 ] ||
            echo "${pt_cli_ns[*]} env ${envw[*]} ${pin_cli[*]} ${tcli[*]} ucx_perftest $pt_server ${args[*]} -p $port"
    } >"$log.cmd"
    "${pt_srv_ns[@]}" timeout -k 5 $((run_timeout + 20)) env "${envw[@]}" \
        "${pin_srv[@]}" "${tsrv[@]}" ucx_perftest "${args[@]}" -p "$port" \
        >"$log.server" 2>&1 &
    spid=$!
    bg_pids+=("$spid")
    wait_listen "$spid" || true  # the client reports what failed
    rc=1
    for ((i = 0; i < 3; i++)); do
        "${pt_cli_ns[@]}" timeout -k 5 "$run_timeout" env "${envw[@]}" \
            "${pin_cli[@]}" "${tcli[@]}" ucx_perftest "$pt_server" "${args[@]}" \
            -p "$port" >"$log.client" 2>&1
        rc=$?
        # retry only if the client could not connect
        grep -q "connect.*refused\|Connection refused" "$log.client" || break
        sleep 0.5
    done
    for ((i = 0; i < 100; i++)); do
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.05
    done
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    [ "$pt_cpu" = yes ] &&
        last_cpu=$(cpu_fields "$log" "$w0" "$(wire_bytes)" "${args[@]}")
    line=$(grep '^Final:' "$log.client" | tail -n 1)
    if [ -n "$line" ]; then
        if [ "$metric" = lat ]; then
            last_value=$(echo "$line" | awk '{print $3}')
        else
            last_value=$(echo "$line" | awk '{print $7}')
        fi
        return 0
    fi
    last_value=-
    last_note=$( (grep -ih 'error\|fail\|unsupported\|invalid\|abort' \
                      "$log.client" "$log.server" | head -n 1;
                  echo "(exit $rc)") | tr '\t\n' '  ')
    [ $rc -eq 124 ] && last_note="timeout after ${run_timeout}s; $last_note"
    last_note="$last_note [$log.*]"
    return 1
}

record() {   # level row kind tl rep (uses last_value/last_note and $1 status)
    local st=$1; shift
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" \
        "$last_value" "$st" "${last_note:-}" >>"$results"
    # a hosts-cpu row's run: its CPU times too
    [ -z "$last_cpu" ] ||
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$2" "$3" "$4" "$5" "$st" \
            "$last_cpu" >>"$hosts_cpu_tsv"
}

fmt_size() {
    local s=$1
    if [ $((s % MiB)) -eq 0 ]; then echo "$((s / MiB))M"
    elif [ $((s % KiB)) -eq 0 ]; then echo "$((s / KiB))K"
    else echo "$s"; fi
}

# One row: run hca and each built-in candidate, interleaved, reps times.
#   run_row LEVEL ROWID LABEL SIZE METRIC TARGET REPS
# with row_hca_name and arrays row_hca_env, row_hca_args (words),
# row_builtins (names), row_builtin_env, row_builtin_args (one string of
# blank-free words per built-in) set by the caller.
run_row() {
    local level=$1 row=$2 label=$3 size=$4 metric=$5 target=$6 reps=$7
    local r i unit st
    # perftest() reads $metric (bash locals are visible to callees)
    unit=us; [ "$metric" = bw ] && unit=MB/s
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$level" "$row" "$label" "$size" \
        "$metric" "$target" >>"$rows"
    if [ -n "$ab_old" ]; then
        run_row_ab "$level" "$row" "$label" "$size" "$reps"
        return
    fi
    for ((r = 1; r <= reps; r++)); do
        last_note=
        if perftest "${row_hca_env[@]}" -- "${row_hca_args[@]}"; then st=ok
        else st=FAIL; nfail=$((nfail + 1)); fi
        record "$st" "$level" "$row" hca "$row_hca_name" "$r"
        log "[$level] $label $(fmt_size "$size") $row_hca_name #$r: $last_value $unit $([ $st = ok ] || echo "FAIL: $last_note")"
        for ((i = 0; i < ${#row_builtins[@]}; i++)); do
            last_note=
            # shellcheck disable=SC2086  # words without blanks
            if perftest ${row_builtin_env[$i]} -- ${row_builtin_args[$i]}; then st=ok
            else st=FAIL; nfail=$((nfail + 1)); fi
            record "$st" "$level" "$row" builtin "${row_builtins[$i]}" "$r"
            log "[$level] $label $(fmt_size "$size") ${row_builtins[$i]} #$r: $last_value $unit $([ $st = ok ] || echo "FAIL: $last_note")"
        done
    done
}

# A/B mode: the row's hca run with the old build (row_old_env) and the new
# one (row_hca_env), back to back, old first in odd repetitions and new
# first in even ones (ABBA: a drift of the machine hits both alike).
#   run_row_ab LEVEL ROWID LABEL SIZE REPS   ($metric as in run_row)
run_row_ab() {
    local level=$1 row=$2 label=$3 size=$4 reps=$5 r side st unit
    local order=() envw=()
    unit=us; [ "$metric" = bw ] && unit=MB/s
    for ((r = 1; r <= reps; r++)); do
        if ((r % 2)); then order=(old new); else order=(new old); fi
        for side in "${order[@]}"; do
            last_note=
            if [ "$side" = old ]; then envw=("${row_old_env[@]}")
            else envw=("${row_hca_env[@]}"); fi
            if perftest "${envw[@]}" -- "${row_hca_args[@]}"; then st=ok
            else st=FAIL; nfail=$((nfail + 1)); fi
            record "$st" "$level" "$row" "$side" "$row_hca_name" "$r"
            log "[$level] $label $(fmt_size "$size") $side #$r: $last_value $unit $([ $st = ok ] || echo "FAIL: $last_note")"
        done
    done
}

is_in() { local x=$1; shift; for y in "$@"; do [ "$x" = "$y" ] && return 0; done; return 1; }

# Rows of the matrix that did not run, with why (level, row, reason):
# each is a FAIL line of the summary and counts as a failed run.
skipped=$outdir/skipped.tsv
: >"$skipped"
not_run() {
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$skipped"
    log "[$1] not run: $2 ($3)"
    nfail=$((nfail + 1))
}

# uct_rows LEVEL TEST LAYOUT METRIC OUTSTANDING ALLOC TARGET TARGETSIZES -- SIZES
#   ALLOC: "" (iface default) or "heap" (UCX_HCA_ALLOC=heap and, for the
#   built-in, UCX_<TL>_ALLOC=heap)
uct_rows() {
    local level=$1 test=$2 layout=$3 metric=$4 outst=$5 alloc=$6 target=$7
    local tsizes=$8 size op label reps tl dev n w i extra=() tgt
    shift 9
    op=$(uct_op "$test" "$layout")
    label="$test $layout"
    [ "$metric" = bw ] && [ "$test" = get ] && label="$label bw -O$outst"
    [ "$metric" = lat ] && [ "$test" = get ] && label="$label lat"
    [ -n "$alloc" ] && label="$label [$alloc]"
    for size in "$@"; do
        if ! size_fits hca "$op" "$size"; then
            not_run "$level" "$label $(fmt_size "$size")" "hca: $fit_why"
            continue
        fi
        if [ -n "$ab_old" ] && ! size_fits hca_old "$op" "$size"; then
            not_run "$level" "$label $(fmt_size "$size")" "old build: hca: $fit_why"
            continue
        fi
        tgt=
        # shellcheck disable=SC2086  # a list of sizes
        is_in "$size" $tsizes && tgt=$target
        reps=$reps_other
        [ -n "$tgt" ] && reps=$reps_target
        n=$(iters_for "$metric" "$size")
        w=$((n / 10)); [ $w -lt 5 ] && w=5
        extra=()
        [ "$outst" -gt 0 ] && extra=(-O "$outst")
        row_hca_name=hca
        row_hca_env=("${hca_env[@]}")
        [ -n "$alloc" ] && row_hca_env+=(UCX_HCA_ALLOC="$alloc")
        if [ -n "$ab_old" ]; then
            row_old_env=("${hca_env_old[@]}")
            [ -n "$alloc" ] && row_old_env+=(UCX_HCA_ALLOC="$alloc")
        fi
        row_hca_args=(-t "$test" -x hca -d hca0 -D "$layout" -s "$size"
                      -n "$n" -w "$w" "${extra[@]}")
        row_builtins=(); row_builtin_env=(); row_builtin_args=()
        for ((i = 0; i < ${#uct_builtins[@]}; i++)); do
            tl=${uct_builtins[$i]} dev=${uct_builtin_devs[$i]}
            # a built-in without the operation at this size: the row has
            # no ratio against it (the summary's 'none'), not a failure
            if size_fits "$tl" "$op" "$size"; then
                row_builtins+=("$tl")
                row_builtin_env+=("${alloc:+UCX_${tl^^}_ALLOC=$alloc}")
                row_builtin_args+=("-t $test -x $tl -d $dev -D $layout -s $size -n $n -w $w ${extra[*]}")
            fi
        done
        run_row "$level" "$level/$label/$size" "$label" "$size" "$metric" \
            "$tgt" "$reps"
    done
}

# ucp_rows LEVEL TEST METRIC OUTSTANDING TARGET TARGETSIZES -- SIZES
ucp_rows() {
    local level=$1 test=$2 metric=$3 outst=$4 target=$5 tsizes=$6
    local size reps n w extra=() tgt label=$2 i
    shift 7
    [ "$outst" -gt 0 ] && label="$label -O$outst"
    for size in "$@"; do
        tgt=
        # shellcheck disable=SC2086  # a list of sizes
        is_in "$size" $tsizes && tgt=$target
        reps=$reps_other
        [ -n "$tgt" ] && reps=$reps_target
        n=$(iters_for "$metric" "$size")
        # UCP ping-pongs of large messages are slow (rendezvous): fewer
        [ "$metric" = lat ] && [ "$size" -ge $MiB ] && n=$((n / 2))
        [ "$n" -lt 30 ] && n=30
        w=$((n / 10)); [ $w -lt 5 ] && w=5
        extra=()
        [ "$outst" -gt 0 ] && extra=(-O "$outst")
        row_hca_name=hca,self
        row_hca_env=("${ucp_hca_env[@]}")
        [ -n "$ab_old" ] && row_old_env=("${ucp_hca_env_old[@]}")
        row_hca_args=(-t "$test" -s "$size" -n "$n" -w "$w" "${extra[@]}")
        row_builtins=("${ucp_builtins[@]}")
        row_builtin_env=("${ucp_builtin_envs[@]}")
        if [ -n "${sides_hca_name[$level]:-}" ]; then
            local words=()
            read -r -a words <<<"${sides_hca_env[$level]}"
            row_hca_name=${sides_hca_name[$level]}
            row_hca_env=("${hca_env[@]}" "${words[@]}")
            [ -n "$ab_old" ] && row_old_env=("${hca_env_old[@]}" "${words[@]}")
            row_builtins=("${sides_other_name[$level]}")
            row_builtin_env=("${sides_other_env[$level]}")
        fi
        row_builtin_args=()
        for ((i = 0; i < ${#ucp_builtins[@]}; i++)); do
            row_builtin_args+=("${row_hca_args[*]}")
        done
        run_row "$level" "$level/$label/$size" "$label" "$size" "$metric" \
            "$tgt" "$reps"
    done
}

# A/B mode: prove, once per side, that the dynamic linker loads that
# side's libuct_hca.so and libhcadev.so.0 and no other copy (LD_DEBUG=libs
# lists every library it initializes, with the path it found).
#   check_loads SIDE BUILDDIR ENVWORDS...
check_loads() {
    local side=$1 bdir=$2 f want got=() real bad=0 lib p
    shift 2
    f=$outdir/logs/ld-debug-$side.log
    env "$@" LD_DEBUG=libs ucx_info -d -t hca >/dev/null 2>"$f"
    mapfile -t got < <(sed -n 's/.*calling init: //p' "$f" |
                       grep 'libuct_hca\.so\|libhcadev\.so' | sort -u)
    real=" "
    for p in "${got[@]}"; do real+="$(readlink -f "$p") "; done
    for lib in src/uct/hca/.libs/libuct_hca.so src/hca_dev/.libs/libhcadev.so.0; do
        want=$(readlink -f "$bdir/$lib")
        case $real in
        *" $want "*) ;;
        *) log "A/B: the $side side does not load $want"; bad=1 ;;
        esac
    done
    [ ${#got[@]} -eq 2 ] || { log "A/B: $side run loads ${got[*]:-no hca library}"; bad=1; }
    [ $bad -eq 0 ] || die "A/B: the $side side does not load its own build (see $f)"
    log "A/B: $side side loads ${got[*]}"
    echo "ab_loads_$side	${got[*]}" >>"$outdir/info.tsv"
}

# --------------------------------------------------------------- levels
if [ -n "$ab_old" ]; then
    check_loads new "$builddir" "${hca_env[@]}"
    check_loads old "$ab_old" "${hca_env_old[@]}"
fi
# Capabilities of hca and of the uct-builtin transports, read once, before
# the first UCT row (level uct: before anything, so that a module UCX does
# not list stops the run at once).
caps_read=no
need_caps() {
    local i
    [ "$caps_read" = no ] || return 0
    caps_read=yes
    read_caps hca hca0 "${hca_env[@]}"
    if [ -n "$ab_old" ]; then
        read_caps_as hca_old hca hca0 "${hca_env_old[@]}"
    else
        for ((i = 0; i < ${#uct_builtins[@]}; i++)); do
            read_caps "${uct_builtins[$i]}" "${uct_builtin_devs[$i]}"
        done
    fi
    [ -n "${caps[hca:am_bcopy]:-}" ] ||
        die "ucx_info does not list hca0 with LD_PRELOAD=$module"
}
has_level uct && need_caps

# perftest_level LEVEL: the matrix's uct and ucp records of LEVEL, in the
# matrix's order ("-" columns become empty arguments).
perftest_level() {
    local lv=$1 rec recs=() f=() tsizes i
    machine_state "$lv"
    # read all records first: ucx_perftest must not see them on its stdin
    mapfile -t recs < <(awk -F'|' -v lv="$lv" '
        /^[ \t]*(#|$)/ { next }
        { sub(/[ \t]+#.*$/, ""); for (i = 1; i <= NF; i++) gsub(/^[ \t]+|[ \t]+$/, "", $i) }
        ($1 == "uct" || $1 == "ucp") && $2 == lv {
            out = $1; for (i = 3; i <= NF; i++) out = out "|" $i; print out }' "$matrix")
    for rec in "${recs[@]}"; do
        IFS='|' read -r -a f <<<"$rec"
        for ((i = 0; i < ${#f[@]}; i++)); do [ "${f[i]}" = - ] && f[i]=; done
        if [ "${f[0]}" = uct ]; then
            # uct | TEST | LAYOUT | METRIC | -O | ALLOC | TARGET | TSIZES | SIZES
            [ ${#f[@]} -eq 9 ] || die "$matrix: uct record of $lv: $rec"
            need_caps
            sizes_of "${f[7]:--}"; tsizes=$bytes
            sizes_of "${f[8]}"
            # shellcheck disable=SC2086  # a list of sizes
            uct_rows "$lv" "${f[1]}" "${f[2]}" "${f[3]}" "${f[4]}" "${f[5]}" \
                "${f[6]}" "$tsizes" -- $bytes
        else
            # ucp | TEST | METRIC | -O | TARGET | TSIZES | SIZES
            [ ${#f[@]} -eq 7 ] || die "$matrix: ucp record of $lv: $rec"
            sizes_of "${f[5]:--}"; tsizes=$bytes
            sizes_of "${f[6]}"
            # shellcheck disable=SC2086  # a list of sizes
            ucp_rows "$lv" "${f[1]}" "${f[2]}" "${f[3]}" "${f[4]}" \
                "$tsizes" -- $bytes
        fi
    done
}

# NetPIPE over OpenMPI pml ucx.
netpipe_run() {   # kind tl rep ENV...
    local kind=$1 tl=$2 rep=$3 f log rc xs=() e note=
    shift 3
    for e in "$@"; do xs+=(-x "$e"); done
    f=$outdir/logs/netpipe-$kind-$rep.out
    log=$outdir/logs/netpipe-$kind-$rep.log
    timeout -k 10 "$np_timeout" mpirun --allow-run-as-root --oversubscribe \
        -np 2 --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
        "${xs[@]}" NPopenmpi -u "$np_upper" -p 0 -n "$np_repeats" -o "$f" \
        >"$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && [ -s "$f" ]; then
        printf '%s\t%s\t%s\t%s\tok\t\n' "$kind" "$tl" "$rep" "$f" >>"$netpipe_tsv"
        log "[netpipe] $tl #$rep: $(wc -l <"$f") sizes, $(tail -n 1 "$f" | awk '{printf "%.0f Mbps at %d B", $2, $1}')"
    else
        note="$(grep -i 'error\|fail\|abort' "$log" | head -n 1 | tr '\t' ' ') (exit $rc) [$log]"
        [ $rc -eq 124 ] && note="timeout after ${np_timeout}s; $note"
        printf '%s\t%s\t%s\t%s\tFAIL\t%s\n' "$kind" "$tl" "$rep" "$f" "$note" >>"$netpipe_tsv"
        log "[netpipe] $tl #$rep: FAIL: $note"
        nfail=$((nfail + 1))
    fi
}

# The netpipe level: the matrix's netpipe records (KIND | TL | ENV, {module}
# the hca module), interleaved np_reps times.
netpipe_level() {
    local r rec kind tl e sets=() envw=()
    mapfile -t sets < <(matrix_records netpipe)
    machine_state netpipe
    for ((r = 1; r <= np_reps; r++)); do
        for rec in "${sets[@]}"; do
            IFS='|' read -r kind tl e <<<"$rec"
            read -r -a envw <<<"${e//\{module\}/$module}"
            netpipe_run "$kind" "$tl" "$r" "${envw[@]}"
        done
    done
}

# ------------------------------------------------------------ hosts level
# Two namespace hosts (contrib/hca-hosts.sh up): host a runs the servers and
# MPI rank 0, host b the clients and rank 1.
hosts_ns=()
hosts_if=
hosts_if2=
hosts_addr_a=
hosts_map=()
hca_run=$builddir/contrib/hca-run
osc_bench=$builddir/contrib/hca_osc_bench

# hosts_setup: 0 when the hosts are up; 1 (with a SKIPPED line on stdout,
# or a failure counted) when not.
hosts_setup() {
    local out l
    # netns_check prints "<what>: SKIPPED: <reason>" when namespaces
    # cannot be made here (not root, no ip netns, a container)
    if ! out=$(. "$topdir/contrib/hca-netns.sh" && netns_check "hca-bench: hosts"); then
        echo "${out:-hca-bench: hosts: SKIPPED: network namespaces unavailable}"
        not_run hosts "all rows" "SKIPPED: ${out#*SKIPPED: }"
        return 1
    fi
    if [ ! -x "$hca_run" ]; then
        make -C "$builddir/contrib" hca-run >&2 || {
            log "[hosts] cannot build $hca_run"; nfail=$((nfail + 1)); return 1; }
    fi
    if [ ! -x "$osc_bench" ] || [ "$osc_bench" -ot "$benchdir/hca_osc_bench.c" ]; then
        log "building $osc_bench (mpicc)"
        mpicc -std=gnu11 -O2 -g -Wall -Wextra -o "$osc_bench" \
            "$benchdir/hca_osc_bench.c" >"$outdir/logs/build-hca_osc_bench.log" 2>&1 || {
            log "[hosts] mpicc failed: $(head -n 3 "$outdir/logs/build-hca_osc_bench.log" | tr '\n' ' ')"
            nfail=$((nfail + 1)); return 1; }
    fi
    hosts_dir=$(mktemp -d /tmp/hca-bench-hosts.XXXXXX) || return 1
    # a second link (hmveth1, its own subnet) for the two-path rows; the
    # other rows name the first link alone
    if ! "$topdir/contrib/hca-hosts.sh" up -n 2 --slots 2 --links 2 "$hosts_dir" \
            >"$outdir/logs/hosts-up.log" 2>&1; then
        log "[hosts] cannot make the namespace hosts: $(tail -n 1 "$outdir/logs/hosts-up.log")"
        rm -rf "$hosts_dir"; hosts_dir=
        nfail=$((nfail + 1))
        return 1
    fi
    # shellcheck disable=SC1091
    . "$hosts_dir/env"
    read -r -a hosts_ns <<<"$(sed -n 's/^names=//p' "$hosts_dir/state")"
    read -r hosts_if hosts_addr_a < <(ip -n "${hosts_ns[0]}" -4 -o addr show |
        awk '$2 != "lo" { sub(/\/.*/, "", $4); print $2, $4; exit }')
    [ -n "$hosts_addr_a" ] || { log "[hosts] no address on host a"; nfail=$((nfail + 1)); return 1; }
    hosts_if2=$(ip -n "${hosts_ns[0]}" -4 -o addr show |
        awk -v first="$hosts_if" '$2 != "lo" && $2 != first { print $2; exit }')
    read -r -a hosts <<<"$HCA_HOSTS"
    # one rank per host; pinned as ucx_perftest is (rank 0 on CPU 0, rank 1
    # on CPU 1): each host's daemon sees all the CPUs, and mpirun's default
    # binding would put both ranks on core 0
    if [ ${#pin_srv[@]} -gt 0 ]; then
        printf 'rank 0=%s slot=0\nrank 1=%s slot=1\n' "${hosts[0]}" "${hosts[1]}" \
            >"$outdir/hosts-rankfile"
        hosts_map=(--rankfile "$outdir/hosts-rankfile")
    else
        hosts_map=(--map-by node --bind-to none)
    fi
    l="hosts ${hosts[*]} (namespaces ${hosts_ns[*]}), $hosts_if, $HCA_HOSTS_SUBNET; second link ${hosts_if2:-none}; server/rank 0 on ${hosts[0]} ($hosts_addr_a)"
    log "[hosts] $l"
    echo "hosts	$l" >>"$outdir/info.tsv"
    return 0
}

# hosts_row LABEL SIZE METRIC TARGET REPS HCA_TL "HCA_ENV" "HCA_ARGS"
#           [TCP_TL "TCP_ENV" "TCP_ARGS"]   (blank-separated words)
hosts_row() {
    local label=$1 size=$2 metric=$3 target=$4 reps=$5
    row_hca_name=$6
    read -r -a row_hca_env <<<"${hca_env[*]} $7"
    [ -z "$ab_old" ] || read -r -a row_old_env <<<"${hca_env_old[*]} $7"
    read -r -a row_hca_args <<<"$8"
    row_builtins=(); row_builtin_env=(); row_builtin_args=()
    if [ $# -ge 11 ]; then
        row_builtins=("$9"); row_builtin_env=("${10}"); row_builtin_args=("${11}")
    fi
    run_row hosts "hosts/$label/$size" "$label" "$size" "$metric" "$target" "$reps"
}

# Which transport an MPI run's UCX used to reach the other host: the
# ep_cfg lines of UCX_LOG_LEVEL=info (one rank's, the remote endpoints),
# which must name hca/hca0 (hca runs) or tcp/<if> (tcp runs).
#   hosts_check_tl KIND TL WHAT LOG
hosts_check_tl() {
    local kind=$1 tl=$2 what=$3 f=$4 cfg want st=ok
    cfg=$(grep -o 'ep_cfg\[[0-9]*\]: .*' "$f" | sed 's/^ep_cfg\[[0-9]*\]: //' |
          grep -v 'self/memory' | sort -u | paste -sd';' -)
    if [ "$kind" = hca ]; then want=hca/hca0; else want=tcp/$hosts_if; fi
    case $cfg in
    *"$want"*) case $cfg in *tcp/lo*|*hca/*tcp/*|*tcp/*hca/*) st=MIXED ;; esac ;;
    *) st=WRONG ;;
    esac
    printf '%s\t%s\t%s\t%s\t%s\n' "$kind" "$tl" "$what" "${cfg:-none}" "$st" >>"$hosts_tl_tsv"
    log "[hosts] $what $tl: remote endpoints ${cfg:-none} ($st)"
    [ $st = ok ] || nfail=$((nfail + 1))
}

# hosts_mpirun KIND TL REP LOG PROG ARGS... : one mpirun across the hosts
# under hca-run, UCX_TLS=TL (hca-run's MCA settings: pml ucx, osc ucx).
# The first repetition also logs UCX's endpoint configurations.
hosts_mpirun() {
    local kind=$1 tl=$2 rep=$3 log=$4 xs=()
    shift 4
    # the first link alone: hca's path, or UCX tcp's interface (not for
    # hca: UCX_NET_DEVICES filters its device hca0 too)
    if [ "$kind" = hca ]; then
        xs=(-x "UCX_HCA_NET_DEVICES=$hosts_if")
    else
        xs=(-x "UCX_NET_DEVICES=$hosts_if")
    fi
    [ "$rep" = 1 ] && xs+=(-x UCX_LOG_LEVEL=info)
    # shellcheck disable=SC2086  # HCA_HOSTS_MPIRUN_ARGS: words without blanks
    echo "UCX_TLS=$tl $hca_run mpirun --oversubscribe -np 2 ${hosts_map[*]} $HCA_HOSTS_MPIRUN_ARGS ${xs[*]} $*" >"$log.cmd"
    # shellcheck disable=SC2086
    UCX_TLS=$tl timeout -k 10 "$np_timeout" "$hca_run" mpirun --oversubscribe \
        -np 2 "${hosts_map[@]}" $HCA_HOSTS_MPIRUN_ARGS "${xs[@]}" "$@" \
        >"$log" 2>&1
}

hosts_netpipe() {   # KIND TL REP
    local kind=$1 tl=$2 rep=$3 f log rc note
    f=$outdir/logs/hosts-netpipe-$kind-$rep.out
    log=$outdir/logs/hosts-netpipe-$kind-$rep.log
    hosts_mpirun "$kind" "$tl" "$rep" "$log" NPopenmpi -u "$hosts_np_upper" \
        -p 0 -n "$hosts_np_repeats" -o "$f"
    rc=$?
    if [ $rc -eq 0 ] && [ -s "$f" ]; then
        printf '%s\t%s\t%s\t%s\tok\t\n' "$kind" "$tl" "$rep" "$f" >>"$hosts_np_tsv"
        log "[hosts] NetPIPE $tl #$rep: $(wc -l <"$f") sizes, $(tail -n 1 "$f" | awk '{printf "%.0f Mbps at %d B", $2, $1}')"
        [ "$rep" = 1 ] && hosts_check_tl "$kind" "$tl" netpipe "$log"
    else
        note="$(grep -i 'error\|fail\|abort' "$log" | head -n 1 | tr '\t' ' ') (exit $rc) [$log]"
        [ $rc -eq 124 ] && note="timeout after ${np_timeout}s; $note"
        printf '%s\t%s\t%s\t%s\tFAIL\t%s\n' "$kind" "$tl" "$rep" "$f" "$note" >>"$hosts_np_tsv"
        log "[hosts] NetPIPE $tl #$rep: FAIL: $note"
        nfail=$((nfail + 1))
    fi
}

hosts_osc() {   # KIND TL REP
    local kind=$1 tl=$2 rep=$3 log rc note n
    log=$outdir/logs/hosts-osc-$kind-$rep.log
    hosts_mpirun "$kind" "$tl" "$rep" "$log" "$osc_bench" -m "$MiB" -W 64 \
        -n "$(setting osc_iters)"
    rc=$?
    n=$(awk -v k="$kind" -v t="$tl" -v r="$rep" '
        $1 ~ /^(put_bw|get_bw|fop_lat)$/ && NF >= 3 {
            printf "%s\t%s\t%s\t%s\t%s\t%s\tok\t\n", k, t, r, $1, $2, $3; n++ }
        END { exit n == 0 }' "$log" | tee -a "$hosts_osc_tsv" | wc -l)
    if [ $rc -eq 0 ] && [ "$n" -gt 0 ]; then
        log "[hosts] osc $tl #$rep: $(awk '$1 == "put_bw" && $2 == 1048576 { p = $3 }
            $1 == "get_bw" && $2 == 1048576 { g = $3 } $1 == "fop_lat" { f = $3 }
            END { printf "put 1M %s MB/s, get 1M %s MB/s, fetch_and_op %s us", p, g, f }' "$log")"
        [ "$rep" = 1 ] && hosts_check_tl "$kind" "$tl" osc "$log"
    else
        note="$(grep -i 'error\|fail\|abort' "$log" | head -n 1 | tr '\t' ' ') (exit $rc) [$log]"
        [ $rc -eq 124 ] && note="timeout after ${np_timeout}s; $note"
        printf '%s\t%s\t%s\t-\t-\t-\tFAIL\t%s\n' "$kind" "$tl" "$rep" "$note" >>"$hosts_osc_tsv"
        log "[hosts] osc $tl #$rep: FAIL: $note"
        nfail=$((nfail + 1))
    fi
}

# hosts_iperf REP: the kernel's ceiling, one iperf3 TCP stream from host b
# (the client, pinned as the ucx_perftest clients are) to host a (the
# server), hosts_iperf_secs seconds, hosts_iperf_len bytes per write; one
# line of hosts-iperf.tsv from its JSON report (the receiver's rate).
hosts_iperf() {
    local rep=$1 log spid rc i secs len vals note
    secs=$(setting hosts_iperf_secs); len=$(setting hosts_iperf_len)
    port=$((port + 1))
    free_port
    log=$outdir/logs/hosts-iperf-$rep
    {
        echo "${pt_srv_ns[*]} ${pin_srv[*]} iperf3 -s -1 -p $port"
        echo "${pt_cli_ns[*]} ${pin_cli[*]} iperf3 -c $pt_server -p $port -t $secs -l $len -J"
    } >"$log.cmd"
    "${pt_srv_ns[@]}" timeout -k 5 $((secs + 40)) "${pin_srv[@]}" \
        iperf3 -s -1 -p "$port" >"$log.server" 2>&1 &
    spid=$!
    bg_pids+=("$spid")
    wait_listen "$spid" || true  # the client reports what failed
    "${pt_cli_ns[@]}" timeout -k 5 $((secs + 30)) "${pin_cli[@]}" \
        iperf3 -c "$pt_server" -p "$port" -t "$secs" -l "$len" -J \
        >"$log.json" 2>"$log.client"
    rc=$?
    for ((i = 0; i < 100; i++)); do
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.05
    done
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    # receiver_bps sender_bps retransmits bytes seconds sender% receiver%
    vals=$(python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["end"]
r, s, c = e["sum_received"], e["sum_sent"], e.get("cpu_utilization_percent", {})
print("%.0f\t%.0f\t%s\t%d\t%.3f\t%.1f\t%.1f" % (
    r["bits_per_second"], s["bits_per_second"], s.get("retransmits", "-"),
    r["bytes"], r["seconds"], c.get("host_total", -1), c.get("remote_total", -1)))
' "$log.json" 2>/dev/null)
    if [ $rc -eq 0 ] && [ -n "$vals" ]; then
        printf '%s\tok\t%s\t\n' "$rep" "$vals" >>"$hosts_iperf_tsv"
        log "[hosts] iperf3 TCP #$rep: $(echo "$vals" | awk '{printf "%.3f GB/s (%.0f MB/s), %s retransmits", $1 / 8e9, $1 / 8e6, $3}')"
    else
        note="$( (grep -h -i 'error' "$log.json" "$log.client" "$log.server" | head -n 1
                  echo "(exit $rc)") | tr '\t\n' '  ')[$log.*]"
        [ $rc -eq 124 ] && note="timeout; $note"
        printf '%s\tFAIL\t-\t-\t-\t-\t-\t-\t-\t%s\n' "$rep" "$note" >>"$hosts_iperf_tsv"
        log "[hosts] iperf3 TCP #$rep: FAIL: $note"
        nfail=$((nfail + 1))
    fi
}

# The hosts level: the kernel's ceiling (iperf3), the matrix's hosts
# records (ucx_perftest between the hosts; those of its hosts-cpu records
# with their CPU time), then its hosts-mpi sets (NetPIPE, hca_osc_bench).
hosts_level() {
    local rec recs=() f=() a v r nl wl nb wb tcp_put mpi_sets=() kind tl
    local -A cpu_rows=()
    machine_state hosts
    pt_srv_ns=(ip netns exec "${hosts_ns[0]}")
    pt_cli_ns=(ip netns exec "${hosts_ns[1]}")
    pt_server=$hosts_addr_a
    caps_pre=("${pt_srv_ns[@]}")
    read_caps_as hosts_hca hca hca0 "${hca_env[@]}"
    read_caps_as hosts_tcp tcp "$hosts_if"
    caps_pre=()
    tcp_put=zcopy
    size_fits hosts_tcp put_zcopy "$MiB" || tcp_put=bcopy
    echo "hosts_tcp_put	$tcp_put" >>"$outdir/info.tsv"
    # the ceiling: iperf3 between the same hosts, pinned the same way (not
    # in A/B mode: its ucx_perftest rows only, old build against new)
    if [ -n "$ab_old" ]; then
        :
    elif command -v iperf3 >/dev/null 2>&1; then
        for ((r = 1; r <= $(setting hosts_iperf_reps); r++)); do
            hosts_iperf "$r"
        done
    else
        not_run hosts "iperf3 TCP ceiling" "iperf3 not installed (apt-get install iperf3)"
    fi
    # the rows whose CPU time is measured (GNU time: /usr/bin/time)
    [ -n "$ab_old" ] ||
        while IFS='|' read -r v _; do cpu_rows[$v]=1; done < <(matrix_records hosts-cpu)
    if [ ${#cpu_rows[@]} -gt 0 ] && [ ! -x /usr/bin/time ]; then
        not_run hosts "CPU/GB rows" "/usr/bin/time not installed (apt-get install time)"
        cpu_rows=()
    fi
    # both links: a two-path row's bytes take either
    pt_wire_if="$hosts_if${hosts_if2:+ $hosts_if2}"
    # ping-pongs of 8 B: hosts_lat_iters (UCX's tcp has millisecond
    # stalls, and 100000 would take long); 1 MiB streams: hosts_bw_iters
    nl=$(setting hosts_lat_iters); wl=$((nl / 10))
    nb=$(setting hosts_bw_iters); wb=$((nb / 10))
    mapfile -t recs < <(matrix_records hosts)
    for rec in "${recs[@]}"; do
        # LABEL SIZE METRIC TARGET HCA_TL HCA_ENV HCA_ARGS [TCP_TL TCP_ENV TCP_ARGS]
        IFS='|' read -r -a f <<<"$rec"
        [ ${#f[@]} -eq 7 ] || [ ${#f[@]} -eq 10 ] ||
            die "$matrix: hosts record: $rec"
        [ "${f[3]}" = - ] && f[3]=
        if [ -z "$hosts_if2" ] && [[ $rec == *'{if2}'* ]]; then
            not_run hosts "${f[0]}" "no second link"
            continue
        fi
        bytes_of "${f[1]}"; f[1]=$bytes
        for ((a = 4; a < ${#f[@]}; a++)); do
            v=${f[a]//\{size\}/${f[1]}}
            v=${v//\{nl\}/$nl}; v=${v//\{wl\}/$wl}
            v=${v//\{nb\}/$nb}; v=${v//\{wb\}/$wb}
            v=${v//\{if\}/$hosts_if}; v=${v//\{if2\}/$hosts_if2}
            v=${v//\{tcp_put\}/$tcp_put}
            f[a]=$v
        done
        pt_cpu=no
        [ -z "${cpu_rows[${f[0]}]:-}" ] || pt_cpu=yes
        hosts_row "${f[0]}" "${f[1]}" "${f[2]}" "${f[3]}" "$reps_target" \
            "${f[@]:4}"
    done
    pt_cpu=no; pt_wire_if=
    pt_srv_ns=(); pt_cli_ns=(); pt_server=localhost
    [ -n "$ab_old" ] || mapfile -t mpi_sets < <(matrix_records hosts-mpi)
    for ((r = 1; r <= hosts_mpi_reps; r++)); do
        for rec in "${mpi_sets[@]}"; do
            IFS='|' read -r kind tl <<<"$rec"
            hosts_netpipe "$kind" "$tl" "$r"
        done
    done
    for ((r = 1; r <= hosts_mpi_reps; r++)); do
        for rec in "${mpi_sets[@]}"; do
            IFS='|' read -r kind tl <<<"$rec"
            hosts_osc "$kind" "$tl" "$r"
        done
    done
    hosts_down
}

# ------------------------------------------------------------------ levels
# In the matrix's order; netpipe and hosts have records of their own.
for lv in ${all_levels//,/ }; do
    has_level "$lv" || continue
    case $lv in
    netpipe) netpipe_level ;;
    hosts)   if hosts_setup; then hosts_level; fi ;;
    *)       perftest_level "$lv" ;;
    esac
done

machine_state end
t_end=$(date +%s)
echo "elapsed	$((t_end - t_start))" >>"$outdir/info.tsv"
echo "failed_runs	$nfail" >>"$outdir/info.tsv"

python3 "$benchdir/hca-bench-summary.py" "$outdir" | tee "$outdir/summary.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || { log "summary failed"; nfail=$((nfail + 1)); }

log "done in $((t_end - t_start)) s; output in $outdir"
[ $nfail -eq 0 ] || { log "$nfail benchmark run(s) failed"; exit 1; }
if [ -n "$ab_old" ] && grep -q 'SLOWER$' "$outdir/ab.tsv" 2>/dev/null; then
    log "A/B: $(grep -c 'SLOWER$' "$outdir/ab.tsv") row(s) SLOWER than the old build beyond the noise"
    exit 3
fi
exit 0
