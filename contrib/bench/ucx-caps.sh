# ucx-caps.sh: the operation sizes that `ucx_info -d` reports, for
# hca-bench.sh (sourced; bash).  Self-test: contrib/bench/test-ucx-caps.sh.
#
# caps[KEY:op] = largest size of operation op (am_short, put_zcopy,
# atomic_fadd, ...), caps_min[KEY:op] the smallest, in bytes, from
# ucx-info-caps.awk, which reads every form ucx_info prints ("<= N",
# "MIN..MAX", "unlimited"); "-" marks a form it does not know.
#   read_caps TL DEV ENVWORDS...         stores them as caps[TL:op]
#   read_caps_as KEY TL DEV ENVWORDS...  as caps[KEY:op] (A/B mode: the old
#                                        build's hca is hca_old)
#   read_caps_file KEY DEV FILE          from a saved `ucx_info -d` output
# caps_pre: a command prefix of ucx_info (level hosts: ip netns exec NS).
declare -A caps caps_min
caps_pre=()
caps_awk=$(dirname "${BASH_SOURCE[0]}")/ucx-info-caps.awk

caps_store() {
    local key=$1 op min max
    while read -r op min max; do
        caps_min[$key:$op]=$min
        caps[$key:$op]=$max
    done
}
read_caps() { read_caps_as "$1" "$@"; }
read_caps_as() {
    local key=$1 tl=$2 dev=$3
    shift 3
    caps_store "$key" < <("${caps_pre[@]}" env "$@" ucx_info -d -t "$tl" 2>/dev/null |
                          awk -v dev="$dev" -f "$caps_awk")
}
read_caps_file() {
    caps_store "$1" < <(awk -v dev="$2" -f "$caps_awk" "$3")
}

# caps_size N: N bytes as ucx_info writes them (8K, 256M, 1G; else bytes)
caps_size() {
    local n=$1 u
    for u in "" K M G T P; do
        if [ "$n" -lt 1024 ] || [ $((n % 1024)) -ne 0 ] || [ "$u" = P ]; then
            echo "$n$u"; return
        fi
        n=$((n / 1024))
    done
}

# size_fits KEY OP SIZE: 0 when operation OP of KEY takes SIZE bytes;
# otherwise 1, with fit_why = why not: no such operation, below its
# minimum, above its maximum, or a size ucx_info printed in a form not
# understood.
fit_why=
size_fits() {
    local key=$1 op=$2 size=$3 lo hi
    lo=${caps_min[$key:$op]:-} hi=${caps[$key:$op]:-}
    fit_why=
    if [ -z "$hi" ]; then
        fit_why="no $op"
    elif [ "$hi" = - ] || [ "$lo" = - ]; then
        fit_why="ucx_info prints $op in a form not understood"
    elif [ "$size" -lt "$lo" ]; then
        fit_why="$(caps_size "$size") is below its $op minimum $(caps_size "$lo")"
    elif [ "$size" -gt "$hi" ]; then
        fit_why="$(caps_size "$size") is above its $op maximum $(caps_size "$hi")"
    fi
    [ -z "$fit_why" ]
}
