#!/bin/bash
#
# ucx-gtest.sh - UCX's own googletest suites, of a UCX release, over hca.
#
# usage: test/ucx-gtest/ucx-gtest.sh build SRC
#        test/ucx-gtest/ucx-gtest.sh run   SRC HCA_BUILD_DIR [SET]
#
#   build  makes UCX's test/gtest binary for the UCX release SRC (a tarball
#          or a tree, as contrib/ucx-build.sh takes it), with an "hca"
#          instance added the way UCX instantiates its built-in transports:
#          every UCT_INSTANTIATE_TEST_CASE, _NO_SELF_ and _NO_GPU_ suite
#          gets an instance "hca", as posix and tcp have theirs, and
#          UCP_INSTANTIATE_TEST_CASE gets an "hca" variant with the
#          transports "hca,self".  Everything happens in the UCX cache
#          (<cache>/ucx-<version>-<key>/gtest-hca): a copy of the build tree
#          that contrib/ucx-build.sh keeps, configured again with
#          --enable-gtest, and a patched copy of test/gtest.  The project's
#          tree and UCX's sources are never changed.  Only the sources of
#          the uct and ucp suites are compiled (GTEST_SOURCES below): the
#          ucs and ucm suites test no transport.  Built once per machine and
#          list of sources; prints the binary as its last line.
#   run    runs SET (default "ci") over the hca module of HCA_BUILD_DIR (an
#          hca build against the same UCX), on both fabrics, and prints one
#          line of counts per suite and fabric.  Exit status 1 when a test
#          failed, or a binary did not finish.
#
# Sets (googletest filters, hca instances only):
#   ci    the uct suites that run in CI's time: p2p RMA/AM/AMO, md, flush,
#         fence, pending, zero-copy completions, ep, iface, peer failure
#   uct   every uct suite built here
#   ucp   every ucp suite built here (UCX_TLS of the variant: hca,self)
#
# What does not apply to a transport like hca is listed, with UCX's file and
# line, in docs/UCT-SEMANTICS.md ("UCX's own suites"); those tests are left
# out of the sets by EXCLUDE_LIST (and EXCLUDE_LIST_<fabric>) below, each
# with its reason.
#
# Environment:
#   HCA_UCX_CACHE     as contrib/ucx-build.sh
#   HCA_MAKE_JOBS     parallel make jobs (default: number of CPUs)
#   HCA_UCX_GTEST_TIMEOUT  seconds per binary run (default 1500)
#
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
topdir=$(cd "$here/../.." && pwd)
jobs=${HCA_MAKE_JOBS:-$(nproc 2>/dev/null || echo 2)}
timeout_s=${HCA_UCX_GTEST_TIMEOUT:-1500}

log() { echo "ucx-gtest: $*" >&2; }
die() { echo "ucx-gtest: error: $*" >&2; exit 1; }

# The suites' sources (relative to test/gtest), and what they need.
GTEST_SOURCES="
common/main.cc common/mem_buffer.cc common/test.cc common/test_gtest_cmn.cc
common/test_helpers.cc common/test_perf.cc common/test_watchdog.cc
uct/uct_test.cc uct/uct_p2p_test.cc uct/test_p2p_am.cc uct/test_p2p_rma.cc
uct/test_p2p_err.cc uct/test_p2p_mix.cc uct/test_amo.cc
uct/test_amo_add_xor.cc uct/test_amo_and_or.cc uct/test_amo_cswap.cc
uct/test_amo_fadd_fxor.cc uct/test_amo_fand_for.cc uct/test_amo_swap.cc
uct/test_md.cc uct/test_mem.cc uct/test_fence.cc uct/test_flush.cc
uct/test_pending.cc uct/test_progress.cc uct/test_peer_failure.cc
uct/test_uct_ep.cc uct/test_uct_iface.cc uct/test_zcopy_comp.cc
uct/test_event.cc uct/test_many2one_am.cc
ucp/ucp_test.cc ucp/ucp_datatype.cc ucp/test_ucp_memheap.cc
ucp/test_ucp_am.cc ucp/test_ucp_atomic.cc ucp/test_ucp_rma.cc
ucp/test_ucp_mmap.cc ucp/test_ucp_peer_failure.cc ucp/test_ucp_tag.cc
ucp/test_ucp_tag_xfer.cc ucp/test_ucp_tag_match.cc ucp/test_ucp_tag_probe.cc
ucp/test_ucp_tag_cancel.cc ucp/test_ucp_fence.cc ucp/test_ucp_wireup.cc
ucp/test_ucp_worker.cc ucp/test_ucp_wakeup.cc ucp/test_ucp_stream.cc
ucp/test_ucp_fault_tolerance.cc ucp/test_ucp_ep.cc ucp/test_ucp_request.cc
"

CI_SUITES="uct_p2p_rma_test uct_p2p_am_test uct_p2p_am_misc uct_p2p_am_alignment
uct_p2p_am_tx_bufs uct_p2p_err_test uct_p2p_mix_test test_md
uct_amo_add_xor_test uct_amo_and_or_test uct_amo_cswap_test
uct_amo_fadd_fxor_test uct_amo_fand_for_test uct_amo_swap_test
uct_flush_test uct_fence_test uct_cancel_test test_uct_pending
test_zcopy_comp test_uct_ep test_uct_iface test_uct_progress test_uct_event
test_uct_peer_failure test_uct_peer_failure_keepalive
test_uct_peer_failure_multiple"

# Tests that do not apply to hca, each with its reason (docs/UCT-SEMANTICS.md,
# "UCX's own suites"), as a googletest negative filter
EXCLUDE_LIST="
hca/test_md.invalidate/*
hca/test_ucp_tag_probe.send_rndv_msg_probe/*
"
# test_md.invalidate packs every key into a uint64_t (test_md.cc:889, 911,
# 921): hca's packed rkey is 32 bytes (md_attr.rkey_packed_size), so the
# test writes past its variable; it runs on IB mds, whose keys are 8 bytes.
# test_ucp_tag_probe.send_rndv_msg_probe leaves param.user_data unset
# (test_ucp_tag_probe.cc:169-176, no UCP_OP_ATTR_FIELD_USER_DATA) and its
# callback takes a non-NULL user_data for its request (test_ucp_tag.cc:114);
# UCP passes param->user_data whatever the field mask
# (ucp/core/ucp_request.inl:137-141, ucp_request_cb_param) when the request
# completed inside ucp_tag_msg_recv_nbx - which hca's single-copy rendezvous
# does, and UCX's own transports (cma defers: scopy_ep.c:96-108) do not.  The
# callback then reads stack garbage; hca completes the request once
# (UcpTagProbe.ProbedRendezvousCompletesOnce).
# and on the shm fabric only: UCX skips these for its own shared-memory
# RMA transports ("RMA transport does not support pending queue": cma,
# knem, xpmem, sysv, posix; test_ucp_request.cc:408-425).  They reset
# protocols of requests still in flight, and wait 10 s for one
# (test_ucp_request.cc:355-374): on that fabric hca's RMA completes in the
# call (single copy), as those transports' do, and none is ever in flight.
EXCLUDE_LIST_shm="
hca/test_proto_reset.get_offload_bcopy/*
hca/test_proto_reset.get_offload_zcopy/*
hca/test_proto_reset.put_offload_bcopy/*
hca/test_proto_reset.put_offload_zcopy/*
hca/test_proto_reset.rndv_put/*
"
EXCLUDE_LIST_tcp=""

joined() { (set -f; printf '%s:' $1) | sed 's/:$//'; }

ucx_build() { "$topdir/contrib/ucx-build.sh" "$@"; }

# The cache directory of SRC's UCX build (prefix's parent).
base_of() {  # src
    local prefix
    prefix=$(ucx_build prefix "$1")
    dirname "$prefix"
}

# The patch: an hca instance after those of UCX_TEST_TLS, _NO_SELF_ and
# _NO_GPU_ (UCS_PP_FOREACH takes no more entries than the lists have, so it
# follows the list rather than joining it), and a UCP variant.
patch_sources() {  # dir (a copy of test/gtest)
    local d=$1 l n
    for l in UCT_TEST_TLS UCT_TEST_NO_SELF_TLS UCT_TEST_NO_GPU_MEM_TYPE_TLS; do
        grep -q "^    UCS_PP_FOREACH(_UCT_INSTANTIATE_TEST_CASE, _test_case, $l)\$" \
            "$d/uct/uct_test.h" ||
            die "uct/uct_test.h: no instantiation over $l (another UCX layout)"
        sed -i "s/^\(    UCS_PP_FOREACH(_UCT_INSTANTIATE_TEST_CASE, _test_case, $l)\)\$/\1 \\\\\n    _UCT_INSTANTIATE_TEST_CASE(_test_case, hca)/" \
            "$d/uct/uct_test.h"
    done
    n=$(grep -c '^    _UCT_INSTANTIATE_TEST_CASE(_test_case, hca)$' "$d/uct/uct_test.h")
    [ "$n" = 3 ] || die "uct/uct_test.h: $n hca instances went in, not 3"
    # the md suites go by component: hca after rdmacm
    grep -q '^                   rdmacm \\$' "$d/uct/test_md.cc" ||
        die "uct/test_md.cc: no md list ending in rdmacm"
    sed -i 's/^\(                   rdmacm\) \\$/\1, \\\n                   hca \\/' \
        "$d/uct/test_md.cc"
    grep -q '^                   hca \\$' "$d/uct/test_md.cc" ||
        die "uct/test_md.cc: the hca md did not go in"
    grep -q '^#define UCP_INSTANTIATE_TEST_CASE(_test_case) \\$' "$d/ucp/ucp_test.h" ||
        die "ucp/ucp_test.h: no UCP_INSTANTIATE_TEST_CASE"
    sed -i '/^#define UCP_INSTANTIATE_TEST_CASE(_test_case) \\$/a\    UCP_INSTANTIATE_TEST_CASE_TLS(_test_case, hca,     "hca,self") \\' \
        "$d/ucp/ucp_test.h"
    grep -q '_test_case, hca, ' "$d/ucp/ucp_test.h" ||
        die "ucp/ucp_test.h: the hca variant did not go in"
    # and the host-memory variant of the GPU-aware list (test_ucp_mmap)
    grep -q '^#define UCP_INSTANTIATE_TEST_CASE_GPU_AWARE(_test_case) \\$' \
        "$d/ucp/ucp_test.h" ||
        die "ucp/ucp_test.h: no UCP_INSTANTIATE_TEST_CASE_GPU_AWARE"
    sed -i '/^#define UCP_INSTANTIATE_TEST_CASE_GPU_AWARE(_test_case) \\$/a\    UCP_INSTANTIATE_TEST_CASE_TLS_GPU_AWARE(_test_case, hca, "hca,self") \\' \
        "$d/ucp/ucp_test.h"
    [ "$(grep -c '_test_case, hca, ' "$d/ucp/ucp_test.h")" = 2 ] ||
        die "ucp/ucp_test.h: the GPU-aware hca variant did not go in"
}

# automake's object name of a source of the program "gtest"
obj_of() {  # common/main.cc -> common/gtest-main.o
    local dir=${1%/*} file=${1##*/}
    echo "$dir/gtest-${file%.cc}.o"
}

# Copies the files of tree $1 into $2 that differ (or are new): make then
# rebuilds what a changed patch touched, not the whole binary.
sync_changed() {  # from to
    local f
    (cd "$1" && find . -type f) | while read -r f; do
        if ! cmp -s "$1/$f" "$2/$f"; then
            mkdir -p "$(dirname "$2/$f")"
            cp -p "$1/$f" "$2/$f"
            touch "$2/$f"
        fi
    done
}

do_build() {  # src
    local src=$1 base prefix tree gdir key stamp objs="" s t0
    ucx_build build "$src" >/dev/null
    prefix=$(ucx_build prefix "$src")
    base=$(dirname "$prefix")
    tree=$(readlink -f "$base/src-tree")
    [ -d "$base/obj" ] || die "$base/obj: UCX's build tree is gone (rebuild the prefix)"
    gdir=$base/gtest-hca
    key=$( { echo "$GTEST_SOURCES"; declare -f patch_sources; } | sha256sum |
           cut -c1-12)
    stamp=$gdir/.built-$key
    if [ -f "$stamp" ] && [ -x "$gdir/obj/test/gtest/gtest" ]; then
        log "built already: $gdir/obj/test/gtest/gtest"
        echo "$gdir/obj/test/gtest/gtest"
        return 0
    fi
    mkdir -p "$gdir"
    exec 8>"$gdir/.lock"
    flock 8
    if [ -f "$stamp" ] && [ -x "$gdir/obj/test/gtest/gtest" ]; then
        echo "$gdir/obj/test/gtest/gtest" # another one built it meanwhile
        return 0
    fi
    t0=$(date +%s)
    rm -f "$gdir"/.built-*
    if [ ! -f "$gdir/.configured" ]; then
        rm -rf "$gdir/obj" "$gdir/src-gtest"
        log "copying UCX's build tree"
        cp -a "$base/obj" "$gdir/obj"
        # the same flags as the prefix, and the suites; config.h comes out
        # the same, so the copied libraries stay current
        log "configure --enable-gtest (log: $gdir/configure.log)"
        export GIT_CEILING_DIRECTORIES=$base
        (cd "$gdir/obj" &&
            eval "set -- $(sed -n "s/^ac_cs_config='\(.*\)'\$/\1/p" config.status)" &&
            "$tree/configure" "$@" --enable-gtest) >"$gdir/configure.log" 2>&1 ||
            { tail -n 30 "$gdir/configure.log" >&2; die "configure failed"; }
        grep -q '^noinst_PROGRAMS = gtest' "$gdir/obj/test/gtest/Makefile" ||
            die "configure --enable-gtest did not enable the suites"
        touch "$gdir/.configured"
    fi
    # the patched suites: only the files that changed are replaced
    rm -rf "$gdir/src-gtest.new"
    cp -a "$tree/test/gtest" "$gdir/src-gtest.new"
    patch_sources "$gdir/src-gtest.new"
    mkdir -p "$gdir/src-gtest"
    sync_changed "$gdir/src-gtest.new" "$gdir/src-gtest"
    rm -rf "$gdir/src-gtest.new"
    for s in $GTEST_SOURCES; do
        objs="$objs $(obj_of "$s")"
    done
    log "make libgtest, then the suites' binary (-j$jobs; log: $gdir/make.log)"
    make -C "$gdir/obj/test/gtest/common/googletest" -j"$jobs" \
        >"$gdir/make.log" 2>&1 ||
        { tail -n 30 "$gdir/make.log" >&2; die "make libgtest failed"; }
    make -C "$gdir/obj/test/gtest" -j"$jobs" gtest \
        srcdir="$gdir/src-gtest" VPATH="$gdir/src-gtest" \
        am_gtest_OBJECTS="$objs" >>"$gdir/make.log" 2>&1 ||
        { grep -E 'error|Error' "$gdir/make.log" | head -n 30 >&2;
          die "make gtest failed"; }
    touch "$stamp"
    log "built in $(( $(date +%s) - t0 )) s: $gdir/obj/test/gtest/gtest"
    echo "$gdir/obj/test/gtest/gtest"
}

filter_of() {  # set fabric-excludes
    local f="" s
    case $1 in
    ci)  for s in $CI_SUITES; do f="$f:hca/$s.*"; done ;;
    uct) f=":hca/*" ;;
    ucp) f=":hca/test_ucp*:hca/test_proto*" ;;
    *)   die "unknown set '$1' (ci, uct or ucp)" ;;
    esac
    f=${f#:}
    if [ "$1" = uct ]; then
        f="$f-hca/test_ucp*:hca/test_proto*" # (UCP's suites)
    fi
    for x in "$(joined "$EXCLUDE_LIST")" "$(joined "$2")"; do
        if [ -n "$x" ]; then
            case $f in *-*) f="$f:$x" ;; *) f="$f-$x" ;; esac
        fi
    done
    echo "$f"
}

do_run() {  # src hca_build_dir [set]
    local src=$1 bdir set=${3:-ci} bin mdir fabric rc=0 out filter
    bdir=$(cd "$2" && pwd)
    bin=$(do_build "$src" | tail -n 1)
    mdir=$bdir/src/uct/hca/modules
    [ -e "$mdir" ] || die "$mdir: no hca module there (build $bdir first)"
    for fabric in shm tcp; do
        local ex_var=EXCLUDE_LIST_$fabric
        filter=$(filter_of "$set" "${!ex_var}")
        out=$(mktemp)
        log "set $set, fabric $fabric (output: $out)"
        (cd "$(dirname "$bin")" &&
            env -u LD_PRELOAD UCX_PLUGIN_PATH="$mdir" UCX_HCA_FABRIC=$fabric \
                UCX_HANDLE_ERRORS=bt UCX_LOG_LEVEL=warn \
                timeout -k 10 "$timeout_s" ./gtest --gtest_filter="$filter" \
                    --gtest_color=no) >"$out" 2>&1 || rc=1
        summarize "$set" "$fabric" "$out" || rc=1
    done
    return $rc
}

# One line per run: passed, failed, skipped; the failed tests after it.
summarize() {  # set fabric file
    local p f s done_line
    p=$(grep -c '^\[       OK \]' "$3" || true)
    f=$(grep -E '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$3" | sort -u | wc -l)
    # UCX's skips print "[     SKIP ]" (and pass in googletest's count)
    s=$(grep -c '^\[     SKIP \]' "$3" || true)
    done_line=$(grep -c '^\[==========\] .* ran\.' "$3" || true)
    echo "ucx-gtest: $1 on $2: $p passed (of which $s skipped), $f failed$( \
        [ "$done_line" -gt 0 ] || echo ', DID NOT FINISH')"
    grep -E '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$3" | sort -u |
        sed 's/^/    /' || true
    if [ "$done_line" -eq 0 ]; then
        tail -n 15 "$3" | sed 's/^/    | /'
    fi
    [ "$f" -eq 0 ] && [ "$done_line" -gt 0 ]
}

[ $# -ge 2 ] || die "usage: $0 build SRC | run SRC HCA_BUILD_DIR [SET]"
case $1 in
build) do_build "$2" ;;
run)   [ $# -ge 3 ] || die "usage: $0 run SRC HCA_BUILD_DIR [SET]"
       do_run "$2" "$3" "${4:-ci}" ;;
*)     die "unknown command '$1' (build or run)" ;;
esac
