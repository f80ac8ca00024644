#!/bin/bash
#
# hca-hosts.sh - "hosts" made of network namespaces, for Open MPI and
# OpenSHMEM jobs across hosts on one machine.
#
# usage: contrib/hca-hosts.sh run [-n N] [--slots S] [--links L] [--dir DIR] -- COMMAND...
#        contrib/hca-hosts.sh up [-n N] [--slots S] [--links L] DIR
#        contrib/hca-hosts.sh down DIR
#        contrib/hca-hosts.sh exec DIR HOST COMMAND...
#
#   run   make N hosts (default 2), run COMMAND here (in the calling
#         namespace, where mpirun runs) with the variables below, then
#         remove the hosts, also when COMMAND fails or the script is
#         interrupted.  Exits with COMMAND's status.
#   up    make the hosts and keep them; DIR (created) holds what a job
#         needs; `down DIR` removes them.
#   exec  run COMMAND on HOST of DIR (in its namespace, with its hostname)
#
# Each host is a network namespace (hcamh-<pid>-a, -b, ...) with its own
# hostname (hcahost-a, hcahost-b, ...: the launcher gives each daemon a
# UTS namespace), lo, and one interface, hmveth0, with the address
# 10.231.<x>.<i>/24 on a bridge in the calling namespace (hb<pid>,
# 10.231.<x>.254), <x> a /24 that nothing here uses.  The hosts share the
# machine's file systems, IPC and PID namespaces, as containers with a
# shared /dev/shm would; hca tells them apart by their network namespace
# (its host identity), so ranks on different hosts use its tcp fabric.
#
# --links L (L > 1, two hosts only): L - 1 further links join the two
# hosts directly (veth pairs, hca-netns.sh's netns_add_link): hmveth1,
# hmveth2, ... in both, each on a 10.231.<y>.0/24 of its own (a .1, b .2)
# that the calling namespace has no address on: Open MPI's daemons stay
# on the bridge (hmveth0); hca's paths may use them
# (UCX_HCA_NET_DEVICES=hmveth0,hmveth1: path failover, issue 28).  hca's
# default (one path, the first interface that is up) stays hmveth0.
#
# DIR (run: a temporary one) holds:
#   hostfile      one line per host: "hcahost-a slots=S" (S default 2)
#   rsh-agent     Open MPI's plm_rsh_agent: "rsh-agent HOST COMMAND" runs
#                 COMMAND on HOST, as ssh would on a real cluster
#   mpirun-args   the mpirun options, one per line
#   env           the variables below, for `. DIR/env`
#   state         the namespaces and the bridge (for `down`)
# and COMMAND (run) gets, in its environment:
#   HCA_HOSTS_DIR          DIR
#   HCA_HOSTS              the host names, space-separated
#   HCA_HOSTFILE           DIR/hostfile
#   HCA_RSH_AGENT          DIR/rsh-agent
#   HCA_HOSTS_SUBNET       10.231.<x>.0/24
#   HCA_HOSTS_IFS          the links' interfaces in every host: "hmveth0"
#                          (--links 2: "hmveth0 hmveth1")
#   HCA_HOSTS_NS           the hosts' network namespaces, space-separated
#                          (ip netns exec NS ..., ip -n NS link ...)
#   HCA_HOSTS_MPIRUN_ARGS  --hostfile DIR/hostfile --mca plm_rsh_agent
#                          DIR/rsh-agent --mca oob_tcp_if_include SUBNET
#                          (words without spaces: use it unquoted)
#
# Example (two hosts, two ranks each, hca between them):
#   sudo contrib/hca-hosts.sh run -- sh -c \
#     'build/contrib/hca-run --verbose mpirun -np 4 $HCA_HOSTS_MPIRUN_ARGS ./prog'
#
# Needs root (network namespaces), iproute2 and unshare (util-linux).
#
set -u
prog=hca-hosts
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hca-netns.sh
. "$here/hca-netns.sh"

die() { echo "$prog: error: $*" >&2; exit 2; }
usage() { sed -n '3,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

host_name() { echo "hcahost-$1"; }

# Writes DIR's files for the namespaces just made ($1: DIR, $2: slots).
write_dir() {
    local dir=$1 slots=$2 i l hosts="" cases="" ifs=hmveth0
    for i in "${!netns_names[@]}"; do
        l=$(netns_letter "$i")
        hosts+="${hosts:+ }$(host_name "$l")"
        cases+="    $(host_name "$l")) ns=${netns_names[$i]} ;;"$'\n'
    done
    : >"$dir/hostfile"
    for h in $hosts; do
        echo "$h slots=$slots" >>"$dir/hostfile"
    done
    cat >"$dir/rsh-agent" <<EOF
#!/bin/bash
# Open MPI's plm_rsh_agent for the namespace hosts of $dir (hca-hosts.sh):
#   rsh-agent [ssh options] HOST COMMAND...
# runs COMMAND with /bin/sh in HOST's network namespace, with HOST as its
# hostname (a UTS namespace of its own), as ssh would run it on HOST.
while [ \$# -gt 0 ]; do
    case \$1 in
    -[lpioFJ]) shift 2 ;;
    -*) shift ;;
    *) break ;;
    esac
done
[ \$# -ge 2 ] || { echo "rsh-agent: usage: rsh-agent HOST COMMAND..." >&2; exit 255; }
host=\$1
shift
case \$host in
$cases    *) echo "rsh-agent: unknown host '\$host' (hosts: $hosts)" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c \\
    'echo "\$0" >/proc/sys/kernel/hostname && exec /bin/sh -c "\$1"' "\$host" "\$*"
EOF
    chmod +x "$dir/rsh-agent"
    for i in $(seq 1 $((netns_links - 1))); do
        ifs+=" $(netns_if a "$i")"
    done
    printf '%s\n' --hostfile "$dir/hostfile" --mca plm_rsh_agent "$dir/rsh-agent" \
        --mca oob_tcp_if_include "$netns_subnet.0/24" >"$dir/mpirun-args"
    {
        echo "HCA_HOSTS_DIR='$dir'"
        echo "HCA_HOSTS='$hosts'"
        echo "HCA_HOSTFILE='$dir/hostfile'"
        echo "HCA_RSH_AGENT='$dir/rsh-agent'"
        echo "HCA_HOSTS_SUBNET='$netns_subnet.0/24'"
        echo "HCA_HOSTS_IFS='$ifs'"
        echo "HCA_HOSTS_NS='${netns_names[*]}'"
        echo "HCA_HOSTS_MPIRUN_ARGS='$(paste -sd' ' "$dir/mpirun-args")'"
        echo "export HCA_HOSTS_DIR HCA_HOSTS HCA_HOSTFILE HCA_RSH_AGENT HCA_HOSTS_SUBNET HCA_HOSTS_IFS HCA_HOSTS_NS HCA_HOSTS_MPIRUN_ARGS"
    } >"$dir/env"
    {
        echo "names=${netns_names[*]}"
        echo "bridge=$netns_root_bridge"
        echo "fw=$netns_root_fw"
    } >"$dir/state"
}

# "; further links: hmveth1 on 10.231.<y>.0/24 ..." (--links), else ""
links_note() {
    local i out=""
    for i in $(seq 1 $((netns_links - 1))); do
        out+="${out:+, }$(netns_if a "$i") on ${netns_subnets[$i]}.0/24"
    done
    [ -n "$out" ] && echo "; further links: $out"
}

check_tools() {
    netns_check "$prog" || exit 3
    command -v unshare >/dev/null || die "unshare (util-linux) is not installed"
}

# ------------------------------------------------------------ options

cmd=${1:-}
[ -n "$cmd" ] || { usage >&2; exit 2; }
shift
n=2 slots=2 links=1 dir=
case $cmd in
-h|--help) usage; exit 0 ;;
run|up)
    while [ $# -gt 0 ]; do
        case $1 in
        -n) n=${2:?}; shift 2 ;;
        --slots) slots=${2:?}; shift 2 ;;
        --links) links=${2:?}; shift 2 ;;
        --dir) dir=${2:?}; shift 2 ;;
        --) shift; break ;;
        -*) die "unknown option '$1'" ;;
        *) [ "$cmd" = up ] && [ -z "$dir" ] && { dir=$1; shift; continue; }
           break ;;
        esac
    done ;;
down|exec)
    dir=${1:?"$cmd needs DIR"}; shift ;;
*) die "unknown command '$cmd' (run, up, down, exec)" ;;
esac
case $links in
1) ;;
[2-9]) [ "$n" = 2 ] || die "--links $links: two hosts only (-n 2)" ;;
*) die "--links: 1 to 9" ;;
esac

case $cmd in
run)
    [ $# -gt 0 ] || die "run: no command (run [-n N] -- COMMAND...)"
    check_tools
    own_dir=0
    if [ -z "$dir" ]; then
        dir=$(mktemp -d /tmp/hca-hosts.XXXXXX) || die "mktemp"
        own_dir=1
    fi
    mkdir -p "$dir" || die "cannot make $dir"
    dir=$(cd "$dir" && pwd)
    cleanup() {
        netns_teardown
        [ $own_dir = 1 ] && rm -rf "$dir"
    }
    netns_setup "$n" root "$links" || die "cannot make the hosts"
    trap cleanup EXIT
    trap 'cleanup; trap - INT; kill -INT $$' INT
    trap 'cleanup; trap - TERM; kill -TERM $$' TERM
    write_dir "$dir" "$slots"
    echo "$prog: hosts $(. "$dir/env"; echo "$HCA_HOSTS") on $netns_subnet.0/24 (this namespace: $netns_root_addr)$(links_note)" >&2
    (
        # shellcheck disable=SC1091
        . "$dir/env"
        "$@"
    )
    exit $?
    ;;
up)
    [ -n "$dir" ] || die "up: no DIR"
    check_tools
    mkdir -p "$dir" || die "cannot make $dir"
    dir=$(cd "$dir" && pwd)
    netns_setup "$n" root "$links" || die "cannot make the hosts"
    write_dir "$dir" "$slots"
    trap - EXIT INT TERM   # they stay until `down`
    echo "$prog: hosts $(. "$dir/env"; echo "$HCA_HOSTS") on $netns_subnet.0/24; '. $dir/env', then mpirun \$HCA_HOSTS_MPIRUN_ARGS ...; '$0 down $dir' removes them" >&2
    ;;
down)
    [ -f "$dir/state" ] || die "$dir/state: not a directory made by '$prog up'"
    names=$(sed -n 's/^names=//p' "$dir/state")
    bridge=$(sed -n 's/^bridge=//p' "$dir/state")
    read -r -a netns_names <<<"$names"
    netns_root_bridge=$bridge
    netns_root_fw=$(sed -n 's/^fw=//p' "$dir/state")
    netns_teardown
    rm -f "$dir/state" "$dir/env" "$dir/hostfile" "$dir/rsh-agent" "$dir/mpirun-args"
    rmdir "$dir" 2>/dev/null
    echo "$prog: removed $names${bridge:+ and $bridge}" >&2
    ;;
exec)
    host=${1:?"exec DIR HOST COMMAND..."}; shift
    [ -x "$dir/rsh-agent" ] || die "$dir/rsh-agent: not a directory made by '$prog up'"
    [ $# -gt 0 ] || die "exec: no command"
    q=$(printf '%q ' "$@")
    exec "$dir/rsh-agent" "$host" "$q"
    ;;
esac
