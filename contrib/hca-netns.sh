# hca-netns.sh - network namespaces as "hosts" on one machine (sourced).
#
#   . contrib/hca-netns.sh
#   netns_check || exit 0         # prints "SKIPPED: <reason>" (stdout)
#   netns_setup 2                 # namespaces a and b, one veth pair
#   netns_setup 3 root            # a, b, c on a bridge in this namespace
#   netns_setup 2 "" 2            # a and b joined by two veth pairs (links)
#   netns_setup 2 root 2          # a and b on the bridge, and a veth pair
#   netns_add_link                # one more link between a and b, later
#   netns_exec a CMD...           # run CMD in namespace a
#   echo "$(netns_addr a)"        # its address, e.g. 10.231.17.1
#   echo "$(netns_addr a 1)"      # its address on the second link (also
#                                 # netns_addr2 a), e.g. 10.231.92.1
#
# Used by the multi-host tests (test/multihost) and by contrib/hca-hosts.sh
# (Open MPI jobs across namespace hosts).
#
# netns_setup N [root] [LINKS] creates N namespaces named hcamh-<pid>-a,
# -b, ... (pid of the sourcing script), each with lo up.
#   N = 2: one veth pair between them;
#   N > 2: a bridge in a third, hidden namespace (hcamh-<pid>-br) with one
#          veth per namespace;
#   root:  the bridge (hb<pid>) is in the calling namespace instead, with
#          the address 10.231.<x>.254, so that a process here (mpirun, and
#          the daemons' connections back to it) reaches every namespace.
# Addresses are 10.231.<x>.<i>/24, <x> chosen at random among the /24
# networks no interface of the host (nor of another namespace set up by
# this library) uses.  The interface is named $netns_ifname (hmveth0) in
# every namespace.
#
# Further links (opt-in, N = 2 only, with or without root): LINKS > 1
# (default 1), or netns_add_link after the setup, adds another veth pair
# between a and b per link: link k (1, 2, ...) is named hmveth<k> in both
# namespaces, on its own 10.231.<y>.0/24, picked like the first and never
# the same as another link's; a has .1, b has .2 there.  No route joins
# the links' subnets: a link that is down carries nothing, and nothing
# else carries its addresses (what path failover needs).  In root mode
# the first link is the bridge (hmveth0, which this namespace reaches);
# the further ones join a and b directly, this namespace has no address
# on them.  netns_addr LETTER [LINK] and netns_if LETTER [LINK] (LINK 0,
# the first, by default) name them; netns_addr2 and netns_if2 are LINK 1.
#
# Teardown (netns_teardown) runs on EXIT, INT and TERM, and when the setup
# fails half-way: it kills every process still running in the namespaces
# (ip netns pids), then deletes the namespaces (which deletes the veths)
# and the bridge.  A script with its own EXIT trap calls netns_teardown
# from it; one that keeps the namespaces after it exits (hca-hosts.sh up)
# clears the traps and records netns_names and netns_root_bridge.
#
# Variables after netns_setup: netns_names (array), netns_subnet
# ("10.231.<x>"), netns_ifs (array: interface name in each namespace),
# netns_root_bridge and netns_root_addr (root mode), netns_links (how many
# links join a and b: 1 unless more were asked for; 0 when N > 2),
# netns_subnets (array: each link's subnet; [0] is netns_subnet).
#
# shellcheck shell=bash

netns_names=()
netns_ifs=()
netns_subnet=
netns_bridge_ns=
netns_root_bridge=
netns_root_addr=
netns_root_fw=        # 1: an iptables ACCEPT rule for the bridge was added
netns_links=0         # links between a and b (N = 2; root: the bridge is the first)
netns_subnets=()      # the subnet of each link
netns_prefix=hcamh-$$
# the interface's name, the same in every namespace (ucx_perftest's server
# opens the device the client names: -d must exist on both sides)
netns_ifname=hmveth0

# netns_check: 0 if namespaces can be made here; otherwise prints a SKIPPED
# line with the reason and returns 1.
netns_check() {
    local what=${1:-multihost}
    if [ "$(id -u)" -ne 0 ]; then
        echo "$what: SKIPPED: not root (network namespaces need root)"
        return 1
    fi
    if ! command -v ip >/dev/null 2>&1; then
        echo "$what: SKIPPED: the ip command (iproute2) is not installed"
        return 1
    fi
    if ! ip netns list >/dev/null 2>&1; then
        echo "$what: SKIPPED: 'ip netns' is not available"
        return 1
    fi
    # a throw-away namespace proves that namespaces can be created (a
    # container may forbid it even to root)
    local probe=$netns_prefix-probe
    if ! ip netns add "$probe" >/dev/null 2>&1; then
        echo "$what: SKIPPED: cannot create a network namespace (ip netns add failed)"
        return 1
    fi
    if ! ip link add "hmp$$" netns "$probe" type veth peer name "hmq$$" \
            netns "$probe" >/dev/null 2>&1; then
        ip netns del "$probe" 2>/dev/null
        echo "$what: SKIPPED: cannot create a veth pair"
        return 1
    fi
    ip netns del "$probe" 2>/dev/null
    return 0
}

netns_say() { echo "netns: $*" >&2; }

# The 10.231.<x>.0/24 networks in use: on the host, in every namespace.
netns_used_subnets() {
    {
        ip -4 -o addr show 2>/dev/null
        local ns
        for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
            ip -n "$ns" -4 -o addr show 2>/dev/null
        done
        ip -4 route show 2>/dev/null
    } | grep -o '10\.231\.[0-9]*\.' | sort -u
}

# netns_pick_subnet [SUBNET...]: a free 10.231.<x>, none of SUBNET... (the
# links already picked, whose addresses may not be set yet)
netns_pick_subnet() {
    local used x i s
    used=$(netns_used_subnets)
    for s in "$@"; do
        used+=$'\n'"$s."
    done
    for i in $(seq 1 50); do
        x=$((1 + RANDOM % 254))
        if ! grep -qx "10\.231\.$x\." <<<"$used"; then
            echo "10.231.$x"
            return 0
        fi
    done
    return 1
}

# The letter of namespace i (0 -> a).
netns_letter() { printf "\\$(printf '%03o' $((97 + $1)))"; }

# netns_name LETTER -> hcamh-<pid>-LETTER
netns_name() { echo "$netns_prefix-$1"; }

# netns_index LETTER -> 0, 1, ...
netns_index() { echo $(($(printf '%d' "'$1") - 97)); }

# netns_addr LETTER [LINK], netns_if LETTER [LINK]: the address and the
# interface of namespace LETTER on link LINK (0, the first, by default;
# LINK > 0: the further links of netns_setup 2 "" LINKS / netns_add_link)
netns_addr() {
    local k=${2:-0}
    if [ "$k" = 0 ]; then
        echo "$netns_subnet.$(($(netns_index "$1") + 1))"
    else
        echo "${netns_subnets[$k]}.$(($(netns_index "$1") + 1))"
    fi
}
netns_if() {
    local k=${2:-0}
    if [ "$k" = 0 ]; then
        echo "${netns_ifs[$(netns_index "$1")]}"
    else
        echo "hmveth$k"
    fi
}
netns_addr2() { netns_addr "$1" 1; }
netns_if2() { netns_if "$1" 1; }

netns_exec() {
    local ns
    ns=$(netns_name "$1")
    shift
    ip netns exec "$ns" "$@"
}

netns_fail() {
    netns_say "error: $*"
    netns_teardown
    return 1
}

# netns_wait_up NS IF...: until every IF of NS has its carrier (5 s at most)
netns_wait_up() {
    local ns=$1 down f
    shift
    for _ in $(seq 1 50); do
        down=0
        for f in "$@"; do
            ip -n "$ns" -o link show "$f" 2>/dev/null | grep -q 'state UP' || down=1
        done
        [ $down = 0 ] && return 0
        sleep 0.1
    done
    return 1
}

# netns_add_link: one more veth pair (link) between a and b, after
# netns_setup 2 [root]: hmveth<k> in both, on a subnet of its own
netns_add_link() {
    local k=$netns_links sub a b
    if [ ${#netns_names[@]} != 2 ] || [ "$k" -lt 1 ]; then
        netns_say "error: further links need netns_setup 2"
        return 1
    fi
    [ "$k" -lt 10 ] || { netns_say "error: at most 10 links"; return 1; }
    sub=$(netns_pick_subnet "${netns_subnets[@]}") ||
        { netns_say "error: no free 10.231.x.0/24 for link $k"; return 1; }
    a=${netns_names[0]} b=${netns_names[1]}
    ip link add "hmveth$k" netns "$a" type veth peer name "hmveth$k" netns "$b" &&
        ip -n "$a" addr add "$sub.1/24" dev "hmveth$k" &&
        ip -n "$b" addr add "$sub.2/24" dev "hmveth$k" &&
        ip -n "$a" link set "hmveth$k" up &&
        ip -n "$b" link set "hmveth$k" up ||
        { netns_say "error: link $k (hmveth$k)"; return 1; }
    netns_subnets+=("$sub")
    netns_links=$((k + 1))
    netns_wait_up "$a" "hmveth$k"
    netns_wait_up "$b" "hmveth$k"
    netns_say "link $k: hmveth$k on $sub.0/24"
    return 0
}

# netns_setup N [root] [LINKS]
netns_setup() {
    local n=${1:-2} mode=${2:-} links=${3:-1} i l ns
    [ "$n" -ge 2 ] && [ "$n" -le 20 ] || { netns_say "error: 2..20 namespaces"; return 1; }
    if [ "$links" != 1 ] && [ "$n" != 2 ]; then
        netns_say "error: further links need 2 namespaces"
        return 1
    fi
    trap 'netns_teardown' EXIT
    trap 'netns_teardown; trap - INT; kill -INT $$' INT
    trap 'netns_teardown; trap - TERM; kill -TERM $$' TERM
    netns_subnet=$(netns_pick_subnet) || { netns_say "error: no free 10.231.x.0/24"; return 1; }
    for i in $(seq 0 $((n - 1))); do
        l=$(netns_letter "$i")
        ns=$(netns_name "$l")
        ip netns add "$ns" || { netns_fail "ip netns add $ns"; return 1; }
        netns_names+=("$ns")
        ip -n "$ns" link set lo up || { netns_fail "lo up in $ns"; return 1; }
    done
    if [ "$mode" = root ]; then
        # root-side names are at most 15 characters: hb<pid> and hb<pid><l>
        netns_root_bridge=hb$$
        netns_root_addr=$netns_subnet.254
        ip link add "$netns_root_bridge" type bridge &&
            ip addr add "$netns_root_addr/24" dev "$netns_root_bridge" &&
            ip link set "$netns_root_bridge" up ||
            { netns_fail "bridge $netns_root_bridge"; return 1; }
        for i in $(seq 0 $((n - 1))); do
            l=$(netns_letter "$i")
            ip link add "hb$$$l" type veth peer name "$netns_ifname" \
                netns "${netns_names[$i]}" &&
                ip link set "hb$$$l" master "$netns_root_bridge" &&
                ip link set "hb$$$l" up ||
                { netns_fail "veth of $l"; return 1; }
            netns_ifs+=("$netns_ifname")
        done
        [ "$n" = 2 ] && netns_links=1   # a and b: further links may follow
        # With br_netfilter, bridged frames go through iptables' FORWARD
        # chain, whose policy is DROP on hosts with Docker: let the hosts'
        # traffic through this bridge (removed with it).
        if [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] &&
           command -v iptables >/dev/null 2>&1 &&
           iptables -I FORWARD -i "$netns_root_bridge" -o "$netns_root_bridge" \
               -j ACCEPT 2>/dev/null; then
            netns_root_fw=1
        fi
    elif [ "$n" = 2 ]; then
        ip link add "$netns_ifname" netns "${netns_names[0]}" type veth \
            peer name "$netns_ifname" netns "${netns_names[1]}" ||
            { netns_fail "veth pair"; return 1; }
        netns_ifs=("$netns_ifname" "$netns_ifname")
        netns_links=1
    else
        netns_bridge_ns=$netns_prefix-br
        ip netns add "$netns_bridge_ns" || { netns_fail "bridge namespace"; return 1; }
        ip -n "$netns_bridge_ns" link add hmbr type bridge &&
            ip -n "$netns_bridge_ns" link set hmbr up ||
            { netns_fail "bridge"; return 1; }
        for i in $(seq 0 $((n - 1))); do
            l=$(netns_letter "$i")
            ip link add "$netns_ifname" netns "${netns_names[$i]}" type veth \
                peer name "p$l" netns "$netns_bridge_ns" &&
                ip -n "$netns_bridge_ns" link set "p$l" master hmbr &&
                ip -n "$netns_bridge_ns" link set "p$l" up ||
                { netns_fail "veth of $l"; return 1; }
            netns_ifs+=("$netns_ifname")
        done
    fi
    for i in $(seq 0 $((n - 1))); do
        ip -n "${netns_names[$i]}" addr add "$netns_subnet.$((i + 1))/24" \
            dev "${netns_ifs[$i]}" &&
            ip -n "${netns_names[$i]}" link set "${netns_ifs[$i]}" up ||
            { netns_fail "address of ${netns_names[$i]}"; return 1; }
    done
    netns_subnets=("$netns_subnet")
    # wait for the links (veth carrier) to come up
    for i in $(seq 0 $((n - 1))); do
        netns_wait_up "${netns_names[$i]}" "${netns_ifs[$i]}"
    done
    netns_say "namespaces ${netns_names[*]} on $netns_subnet.0/24"
    for i in $(seq 2 "$links"); do
        netns_add_link || { netns_fail "link $((i - 1))"; return 1; }
    done
    return 0
}

# Kills what runs in the namespaces, deletes them.  Idempotent.
netns_teardown() {
    local ns pids
    for ns in "${netns_names[@]}" $netns_bridge_ns; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        if [ -n "$pids" ]; then
            # a stopped process must be continued to die of SIGKILL
            # promptly in all kernels; SIGKILL works on stopped ones too
            # shellcheck disable=SC2086
            kill -KILL $pids 2>/dev/null
        fi
    done
    for ns in "${netns_names[@]}" $netns_bridge_ns; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
            sleep 0.1
        done
        ip netns del "$ns" 2>/dev/null
    done
    if [ -n "$netns_root_bridge" ]; then
        ip link del "$netns_root_bridge" 2>/dev/null
        if [ "$netns_root_fw" = 1 ]; then
            iptables -D FORWARD -i "$netns_root_bridge" -o "$netns_root_bridge" \
                -j ACCEPT 2>/dev/null
        fi
    fi
    netns_names=()
    netns_ifs=()
    netns_links=0
    netns_subnets=()
    netns_bridge_ns=
    netns_root_bridge=
    netns_root_addr=
    netns_root_fw=
}
