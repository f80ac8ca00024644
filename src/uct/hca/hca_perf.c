/*
 * hca_perf.c - hca's performance model: what iface_query reports
 * (latency, bandwidth, overhead) and the per-operation figures of
 * uct_iface_estimate_perf, which UCP's protocols v2 (on by default from
 * 1.16, NEWS 1.16.0; UCX_PROTO_ENABLE=y before) compare between transports
 * and between the short, bcopy, zero-copy and rendezvous protocols of one
 * transport.
 *
 * The figures are in UCX's units, beside UCX's own transports' figures:
 * UCP compares them with posix's (uct/sm/mm/base/mm_iface.c: latency 80 ns,
 * overhead 10 ns, 15360 MB/s dedicated), cma's (uct/sm/scopy: 80 ns, 500 ns
 * per call in estimate_perf, 11145 MB/s) and tcp's (uct/tcp/tcp_iface.c:
 * 5.2 us + the link, 50 us overhead, the link's speed).  Those are constants
 * of a reference machine, not measurements of this one (on the 2-vCPU
 * machines here posix's 8-byte am_lat measures 0.30-0.46 us, not 100 ns), so
 * hca's shm figures are posix's or cma's figure for the same kind of work,
 * times hca's measured ratio to that transport (same run, pinned, medians;
 * docs/PERF.md, docs/BENCHMARKS.md and docs/UCP-PROTOCOLS.md name the
 * runs).  Where the ratio is near 1 hca reports the built-in's figure, and
 * where the general case (plain memory of the peer) is slower than the
 * special one (the peer's device memory, which hca writes in the call), the
 * general case is reported: never the better one.
 *
 * The tcp fabric's figures are absolute: hca's own measurements between
 * two network namespaces (docs/BENCHMARKS.md "Between hosts"), capped at a
 * 10 GbE link for bandwidth, which hca does not query.
 *
 * One iface serves both fabrics in the default auto mode (shm to peers on
 * this host, tcp to others), and UCP asks per iface, not per peer: UCP 1.22
 * fills only the memory types of uct_perf_attr_t (ucp/proto/proto_common.c,
 * ucp_proto_common_perf_attr_set_mem_type), never the remote system device,
 * and the figures packed into the worker address are iface_query's.  The
 * shm figures are reported unless UCX_HCA_FABRIC=tcp, where every peer is a
 * tcp peer: see docs/UCP-PROTOCOLS.md for why.
 */
#include "hca_uct.h"

#include <stdint.h>

/* The figures of one class of operations (uct_perf_attr_t's meaning):
 * seconds, and bytes per second. */
typedef struct uct_hca_op_perf {
    double send_pre;   /* in the call, before the data moves */
    double send_post;  /* after: a completion through the CQ */
    double recv;       /* the receiver's cost (AMs only) */
    double latency;    /* one-way, or the round trip of a get/fetch */
    double bandwidth;  /* of the data movement */
} uct_hca_op_perf_t;

typedef enum {
    UCT_HCA_PERF_IFACE,     /* no operation given: iface_query's figures */
    UCT_HCA_PERF_AM_SHORT,
    UCT_HCA_PERF_AM_BCOPY,
    UCT_HCA_PERF_AM_ZCOPY,
    UCT_HCA_PERF_PUT_SHORT,
    UCT_HCA_PERF_PUT_BCOPY,
    UCT_HCA_PERF_PUT_ZCOPY,
    UCT_HCA_PERF_GET_BCOPY,
    UCT_HCA_PERF_GET_ZCOPY,
    UCT_HCA_PERF_ATOMIC_POST,
    UCT_HCA_PERF_ATOMIC_FETCH,
    UCT_HCA_PERF_LAST
} uct_hca_perf_class_t;

#define UCT_HCA_MBS(_mb)  ((_mb) * UCS_MBYTE)

/*
 * shm fabric (and the auto mode).  Measured: UCX 1.22.0, ucx_perftest UCT
 * tests pinned (server CPU 0, client CPU 1), medians of 3 interleaved runs
 * (2026-12-01, docs/UCP-PROTOCOLS.md "Measurements"), and the UCX 1.13
 * tables of docs/PERF.md (medians of 5).
 */
static const uct_hca_op_perf_t uct_hca_perf_shm[UCT_HCA_PERF_LAST] = {
    /* The AM figures: wireup compares them with posix's to pick the AM
     * lane (ucp/wireup/select.c, ucp_wireup_am_score_func: latency + both
     * sides' overhead) */
    /* The overhead is the call's CPU time in posix's units: posix reports
     * 10 ns, and hca's calls execute 1.9x (put short: 34 ns a put
     * against 18 at put_bw 8 B on a shared segment, both mapped) to 2.9x
     * (am short: 229 instructions against 78) posix's work.  28 ns keeps
     * the AM lane on hca where its latency wins (40 + 2 x 28 = 96 ns
     * against posix's 80 + 2 x 10, UCX 1.13's ucp_wireup_am_score_func),
     * and lets UCX 1.13 put sysv or posix first among the RMA lanes for
     * the memory they allocated (ucp_wireup_rma_score_func, 4 KiB:
     * 40 + 28 + 350 ns against sysv's 80 + 10 + 321), where their
     * memcpy beats hca's checked store; hca stays the lane for every
     * other memory, and for atomics (40 + 28 against 80 + 10). */
    [UCT_HCA_PERF_IFACE] = {
        .send_pre  = 28e-9,
        .recv      = 10e-9,
        .latency   = 40e-9,
        /* the large-message path, zero-copy on plain memory (= cma) */
        .bandwidth = UCT_HCA_MBS(11145.0),
    },
    /* am_lat short 8 B: 0.34 us against posix's 0.45 (0.76; docs/PERF.md:
     * 0.62): 70 ns where posix's model says 100.  The send executes 229
     * instructions against posix's 78 (docs/PERF.md), 2x posix's 10 ns;
     * the receive reads the ring slot in place (35 instructions) as mm
     * does (10 ns); the message is one cache line up to 24 bytes, which is
     * the rest: 40 ns. */
    [UCT_HCA_PERF_AM_SHORT] = {
        .send_pre  = 20e-9,
        .recv      = 10e-9,
        .latency   = 40e-9,
        .bandwidth = UCT_HCA_MBS(15000.0),
    },
    /* packs into the target's ring slot (one copy, as posix): am_bw bcopy
     * 8 KiB 0.98 of posix (docs/PERF.md) -> 0.98 * 15360 MB/s.  am_lat
     * bcopy 4 KiB measures 0.47 us against 0.76 (0.63); the model says
     * 0.93, which under-states hca. */
    [UCT_HCA_PERF_AM_BCOPY] = {
        .send_pre  = 20e-9,
        .recv      = 10e-9,
        .latency   = 40e-9,
        .bandwidth = UCT_HCA_MBS(15000.0),
    },
    /* Not zero-copy on this fabric: the device copies the iov into the
     * target's ring slot, the same copy as bcopy's pack, and the send
     * completes through the CQ (an op descriptor and a CQE: send_post).
     * UCP charges bcopy's pack as a memcpy at its BCOPY_BW (7000 MB/s by
     * default, ucp/core/ucp_context.c UCP_CPU_EST_BCOPY_BW_DEFAULT) on top
     * of the transport's figure, so the same copy here is that memcpy plus
     * the delivery: 1 / (1/7000 + 1/15000 MB/s) = 4770 MB/s.  Measured
     * (UCX 1.22, hca,self, pinned, medians of 3): tag_lat eager bcopy
     * (UCX_ZCOPY_THRESH=inf) against zero-copy 1 KiB 0.87/0.93 us, 4 KiB
     * 1.20/1.18; tag_bw 4 KiB 0.51/0.53 us per message; UCX 1.13
     * (docs/PERF.md "Crossover"): bcopy ahead at every eager size but
     * 1 KiB tag_bw.  With it UCP goes from eager bcopy to the rendezvous
     * at 5.4 KiB: tag_lat 8000 B 0.68-0.82 us, eager bcopy
     * (UCX_RNDV_THRESH=inf) 1.33-1.42, posix,cma,self 4.2-4.7. */
    [UCT_HCA_PERF_AM_ZCOPY] = {
        .send_pre  = 20e-9,
        .send_post = 40e-9,
        .recv      = 10e-9,
        .latency   = 40e-9,
        .bandwidth = UCT_HCA_MBS(4770.0),
    },
    /* a store into the peer's mapped memory, as posix: put_lat short 8 B
     * 0.28 us against 0.27 (1.04; docs/PERF.md 1.03), so posix's 80 ns;
     * the call executes 160 instructions against 22 (20 ns; put_bw short
     * 8 B: 0.55 of posix's rate, docs/PERF.md) */
    [UCT_HCA_PERF_PUT_SHORT] = {
        .send_pre  = 20e-9,
        .latency   = 80e-9,
        .bandwidth = UCT_HCA_MBS(15000.0),
    },
    /* packed into a bounce buffer, then written into the peer's memory:
     * two copies where posix makes one (half of 15360 MB/s).  put_bw
     * bcopy 4 KiB: 0.09-0.27 us per put against posix's 0.04-0.05. */
    [UCT_HCA_PERF_PUT_BCOPY] = {
        .send_pre  = 20e-9,
        .latency   = 80e-9,
        .bandwidth = UCT_HCA_MBS(7680.0),
    },
    /* plain memory of the peer: one process_vm_writev by the device in the
     * call, as cma (its 500 ns per call, 11145 MB/s): put_bw zcopy 1 MiB
     * 41-45 us per put, cma 41-45.  The peer's device memory is a memcpy
     * (20-28 us, 1.6x cma) that UCP cannot tell apart (both are host
     * memory to it): the general case is reported. */
    [UCT_HCA_PERF_PUT_ZCOPY] = {
        .send_pre  = 500e-9,
        .send_post = 40e-9,
        .latency   = 80e-9,
        .bandwidth = UCT_HCA_MBS(11145.0),
    },
    /* unpacked straight from the peer's mapped memory in the call: get
     * bcopy 4 KiB 0.05 us against posix's 0.04 (1.25 of posix's model:
     * 12000 MB/s); plain memory goes through a WR and the responder */
    [UCT_HCA_PERF_GET_BCOPY] = {
        .send_pre  = 20e-9,
        .latency   = 80e-9,
        .bandwidth = UCT_HCA_MBS(12000.0),
    },
    /* as put zcopy: get zcopy 1 MiB 47-69 us per get, cma 51-54 (plain
     * memory; device memory 4 KiB: 0.05 us against cma's 2.3) */
    [UCT_HCA_PERF_GET_ZCOPY] = {
        .send_pre  = 500e-9,
        .send_post = 40e-9,
        .latency   = 80e-9,
        .bandwidth = UCT_HCA_MBS(11145.0),
    },
    /* a CPU atomic on the peer's mapped device memory in the call: fadd
     * 8 B 1.03 of posix (docs/PERF.md), 186 instructions against 13 */
    [UCT_HCA_PERF_ATOMIC_POST] = {
        .send_pre  = 20e-9,
        .latency   = 80e-9,
        .bandwidth = UCT_HCA_MBS(15000.0),
    },
    [UCT_HCA_PERF_ATOMIC_FETCH] = {
        .send_pre  = 20e-9,
        .latency   = 80e-9,
        .bandwidth = UCT_HCA_MBS(15000.0),
    },
};

/*
 * tcp fabric (UCX_HCA_FABRIC=tcp).  Measured between two network
 * namespaces, pinned (docs/BENCHMARKS.md "Between hosts", UCX 1.13.1,
 * after the tcp fabric's latency work): am_lat short 8 B 8.8 us one-way
 * (UCX's tcp 8.9), put_bw zcopy 1 MiB 2432 MB/s, get zcopy 1 MiB 1115 MB/s,
 * MPI_Fetch_and_op 43.8 us for three atomics (14.6 us each).  Every
 * operation is a frame through sendmsg (2 us) and the peer's fabric thread
 * (2 us); AMs, puts and posted atomics are one-way (5 us between), gets and
 * fetching atomics a round trip (12 us: two ways and the responder).
 * Bandwidth is the link's, shared by the processes of a host as UCX's
 * tcp's: hca does not query the link, so a 10 GbE one (UCX's tcp computes
 * 1186 MB/s for it, uct/tcp/tcp_net.c), below hca's own ceiling on veth
 * (put 2432 MB/s) and capped by it for gets (1115 MB/s).
 */
#define UCT_HCA_TCP_ONE_WAY(_bw) \
    {.send_pre = 2e-6, .recv = 2e-6, .latency = 5e-6, \
     .bandwidth = UCT_HCA_MBS(_bw)}
#define UCT_HCA_TCP_ROUND_TRIP(_bw) \
    {.send_pre = 2e-6, .latency = 12e-6, .bandwidth = UCT_HCA_MBS(_bw)}

static const uct_hca_op_perf_t uct_hca_perf_tcp[UCT_HCA_PERF_LAST] = {
    [UCT_HCA_PERF_IFACE]        = UCT_HCA_TCP_ONE_WAY(1186.0),
    [UCT_HCA_PERF_AM_SHORT]     = UCT_HCA_TCP_ONE_WAY(1186.0),
    [UCT_HCA_PERF_AM_BCOPY]     = UCT_HCA_TCP_ONE_WAY(1186.0),
    [UCT_HCA_PERF_AM_ZCOPY]     = UCT_HCA_TCP_ONE_WAY(1186.0),
    [UCT_HCA_PERF_PUT_SHORT]    = UCT_HCA_TCP_ONE_WAY(1186.0),
    [UCT_HCA_PERF_PUT_BCOPY]    = UCT_HCA_TCP_ONE_WAY(1186.0),
    [UCT_HCA_PERF_PUT_ZCOPY]    = UCT_HCA_TCP_ONE_WAY(1186.0),
    /* a get bcopy is at most a bounce buffer (seg_size) per round trip,
     * and UCP's fragments of a large one wait for each other: ucp_get
     * 64 KiB took 77-98 us with bcopy against 24-27 us with zero-copy
     * (UCX 1.22, UCX_HCA_FABRIC=tcp on one host, pinned, 3 runs each;
     * 64 KiB / 85 us = 770 MB/s) */
    [UCT_HCA_PERF_GET_BCOPY]    = UCT_HCA_TCP_ROUND_TRIP(700.0),
    [UCT_HCA_PERF_GET_ZCOPY]    = UCT_HCA_TCP_ROUND_TRIP(1115.0),
    [UCT_HCA_PERF_ATOMIC_POST]  = UCT_HCA_TCP_ONE_WAY(1186.0),
    [UCT_HCA_PERF_ATOMIC_FETCH] = UCT_HCA_TCP_ROUND_TRIP(1115.0),
};

static const uct_hca_op_perf_t *
uct_hca_perf_of(const uct_hca_iface_t *iface, uct_hca_perf_class_t cls)
{
    return iface->md->tcp_only ? &uct_hca_perf_tcp[cls] :
                                 &uct_hca_perf_shm[cls];
}

/* UCT_EP_OP_* -> our class.  Operations hca does not have (get short, tag
 * offload) get the iface's figures, as uct_base_iface_estimate_perf gives
 * every operation. */
static uct_hca_perf_class_t uct_hca_perf_class(uct_ep_operation_t op)
{
    switch (op) {
    case UCT_EP_OP_AM_SHORT:     return UCT_HCA_PERF_AM_SHORT;
    case UCT_EP_OP_AM_BCOPY:     return UCT_HCA_PERF_AM_BCOPY;
    case UCT_EP_OP_AM_ZCOPY:     return UCT_HCA_PERF_AM_ZCOPY;
    case UCT_EP_OP_PUT_SHORT:    return UCT_HCA_PERF_PUT_SHORT;
    case UCT_EP_OP_PUT_BCOPY:    return UCT_HCA_PERF_PUT_BCOPY;
    case UCT_EP_OP_PUT_ZCOPY:    return UCT_HCA_PERF_PUT_ZCOPY;
    case UCT_EP_OP_GET_BCOPY:    return UCT_HCA_PERF_GET_BCOPY;
    case UCT_EP_OP_GET_ZCOPY:    return UCT_HCA_PERF_GET_ZCOPY;
    case UCT_EP_OP_ATOMIC_POST:  return UCT_HCA_PERF_ATOMIC_POST;
    case UCT_EP_OP_ATOMIC_FETCH: return UCT_HCA_PERF_ATOMIC_FETCH;
    default:                     return UCT_HCA_PERF_IFACE;
    }
}

/* shm copies run on the caller's CPU (per process, as mm's and cma's
 * bandwidth: dedicated); the tcp fabric's link is the host's (shared, as
 * UCX's tcp) */
static uct_ppn_bandwidth_t
uct_hca_perf_bandwidth(const uct_hca_iface_t *iface,
                       const uct_hca_op_perf_t *perf)
{
    uct_ppn_bandwidth_t bw;

    if (iface->md->tcp_only) {
        bw.dedicated = 0;
        bw.shared    = perf->bandwidth;
    } else {
        bw.dedicated = perf->bandwidth;
        bw.shared    = 0;
    }
    return bw;
}

void uct_hca_iface_query_perf(const uct_hca_iface_t *iface,
                              uct_iface_attr_t *attr)
{
    const uct_hca_op_perf_t *perf = uct_hca_perf_of(iface,
                                                    UCT_HCA_PERF_IFACE);

    attr->latency   = ucs_linear_func_make(perf->latency, 0);
    attr->bandwidth = uct_hca_perf_bandwidth(iface, perf);
    attr->overhead  = perf->send_pre;
    attr->priority  = 0;
}

ucs_status_t uct_hca_iface_estimate_perf(uct_iface_h tl_iface,
                                         uct_perf_attr_t *perf_attr)
{
    uct_hca_iface_t *iface = ucs_derived_of(tl_iface, uct_hca_iface_t);
    uct_ep_operation_t op  = UCT_ATTR_VALUE(PERF, perf_attr, operation,
                                            OPERATION, UCT_EP_OP_LAST);
    const uct_hca_op_perf_t *perf = uct_hca_perf_of(iface,
                                                    uct_hca_perf_class(op));
    uct_ppn_bandwidth_t bw        = uct_hca_perf_bandwidth(iface, perf);

    /* Memory types are not looked at: hca's md registers host memory
     * only, and UCP asks with other types only of lanes whose md has them
     * (as mm, uct/sm/mm/base/mm_iface.c, uct_mm_estimate_perf) */
    if (perf_attr->field_mask & UCT_PERF_ATTR_FIELD_SEND_PRE_OVERHEAD) {
        perf_attr->send_pre_overhead = perf->send_pre;
    }
    if (perf_attr->field_mask & UCT_PERF_ATTR_FIELD_SEND_POST_OVERHEAD) {
        perf_attr->send_post_overhead = perf->send_post;
    }
    if (perf_attr->field_mask & UCT_PERF_ATTR_FIELD_RECV_OVERHEAD) {
        perf_attr->recv_overhead = perf->recv;
    }
    if (perf_attr->field_mask & UCT_PERF_ATTR_FIELD_BANDWIDTH) {
        perf_attr->bandwidth = bw;
    }
    if (perf_attr->field_mask & UCT_PERF_ATTR_FIELD_LATENCY) {
        perf_attr->latency = ucs_linear_func_make(perf->latency, 0);
    }
    if (perf_attr->field_mask & UCT_PERF_ATTR_FIELD_MAX_INFLIGHT_EPS) {
        /* no limit: ep_check answers at once (no CQ entry), and direct
         * operations take none either; UCP scores keepalive lanes by it */
        perf_attr->max_inflight_eps = SIZE_MAX;
    }
    /* one path: the whole bandwidth; tx and rx share nothing UCP should
     * separate the AM lane for */
    UCT_HCA_PERF_ATTR_SET_PATH_BANDWIDTH(perf_attr, bw);
    UCT_HCA_PERF_ATTR_SET_FLAGS(perf_attr, 0);
    return UCS_OK;
}
