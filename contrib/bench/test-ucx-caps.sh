#!/bin/bash
# test-ucx-caps.sh: self-test of the benchmark's capability reader
# (ucx-info-caps.awk, ucx-caps.sh) over saved `ucx_info -d` outputs of
# hca, posix, cma and tcp on UCX 1.13.1 and 1.22.0, and a hand-written
# file with every form ucx_info prints for a size (caps-samples/).
#
#   caps-samples/SAMPLE.txt              a saved output
#   caps-samples/SAMPLE@DEVICE.expected  "OP MIN MAX" of DEVICE, by hand
#
# Then the decisions hca-bench.sh takes from them (size_fits).  Run by
# `make check` (contrib/Makefile.am); prints one PASS line, or each
# failed check and exits 1.
set -u
here=$(cd "$(dirname "$0")" && pwd)
samples=$here/caps-samples
# shellcheck source=contrib/bench/ucx-caps.sh
. "$here/ucx-caps.sh"

nchk=0 nbad=0
bad() { echo "FAIL test-ucx-caps: $*"; nbad=$((nbad + 1)); }

# 1. the reader against the hand-written expectations
nexp=0
for exp in "$samples"/*@*.expected; do
    name=$(basename "$exp" .expected)
    sample=$samples/${name%@*}.txt
    dev=${name#*@}
    nexp=$((nexp + 1)); nchk=$((nchk + 1))
    [ -f "$sample" ] || { bad "$name: no sample ${sample##*/}"; continue; }
    if ! out=$(diff <(awk -v dev="$dev" -f "$caps_awk" "$sample") "$exp"); then
        bad "$name: reader output (<) differs from the expectation (>):"
        echo "$out" | sed 's/^/    /'
    fi
done
# every saved output has its expectations (both UCX versions, all four)
for v in 1.13.1 1.22.0; do
    for tl in hca posix cma tcp; do
        nchk=$((nchk + 1))
        ls "$samples/ucx-$v-$tl@"*.expected >/dev/null 2>&1 ||
            bad "no expectation for UCX $v $tl (caps-samples/ucx-$v-$tl@DEV.expected)"
    done
done

# 2. the decisions: fits KEY OP SIZE yes|"why"
fits() {
    local key=$1 op=$2 size=$3 want=$4
    nchk=$((nchk + 1))
    if size_fits "$key" "$op" "$size"; then
        [ "$want" = yes ] || bad "$key $op $size: fits, expected: $want"
    else
        [ "$want" = "$fit_why" ] || bad "$key $op $size: '$fit_why', expected: $want"
    fi
}
for v in 1.13.1 1.22.0; do
    read_caps_file "hca-$v" hca0 "$samples/ucx-$v-hca.txt"
    read_caps_file "posix-$v" memory "$samples/ucx-$v-posix.txt"
    read_caps_file "cma-$v" memory "$samples/ucx-$v-cma.txt"
    read_caps_file "tcp-$v" lo "$samples/ucx-$v-tcp.txt"
    # hca's get zero-copy starts at 8 KiB ("8K..256M") under UCP's
    # protocols v1 (UCX 1.13), at 0 under v2 (1.22): issue 44
    if [ "$v" = 1.13.1 ]; then
        fits "hca-$v" get_zcopy 8 "8 is below its get_zcopy minimum 8K"
    else
        fits "hca-$v" get_zcopy 8 yes
    fi
    fits "hca-$v" get_zcopy 8192 yes
    fits "hca-$v" get_zcopy 1048576 yes
    fits "hca-$v" get_zcopy $((512 << 20)) "512M is above its get_zcopy maximum 256M"
    fits "hca-$v" put_zcopy 8 yes
    fits "hca-$v" am_short 8 yes
    fits "hca-$v" am_short 8192 "8K is above its am_short maximum 960"
    fits "hca-$v" atomic_fadd 8 yes
    fits "posix-$v" get_zcopy 65536 "no get_zcopy"
    fits "posix-$v" put_bcopy 1048576 yes
    fits "cma-$v" get_zcopy 8 yes
    fits "cma-$v" get_zcopy $((16 << 20)) yes
    fits "tcp-$v" put_zcopy 1048576 yes
    fits "tcp-$v" am_zcopy 1048576 "1M is above its am_zcopy maximum 64K"
done
read_caps_file forms d0 "$samples/forms.txt"
fits forms get_short 1 "ucx_info prints get_short in a form not understood"
fits forms get_zcopy $((1 << 40)) yes
fits forms get_zcopy 4095 "4095 is below its get_zcopy minimum 4K"

if [ $nbad -gt 0 ]; then
    echo "FAIL test-ucx-caps: $nbad of $nchk checks failed"
    exit 1
fi
echo "PASS test-ucx-caps: $nchk checks ($nexp expectations over $(ls "$samples"/*.txt | wc -l) ucx_info outputs)"
