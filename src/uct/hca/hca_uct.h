/*
 * hca_uct.h - the UCT transport "hca": objects shared by the md, iface and
 * ep files, and the fast-path inlines.
 *
 * Model (connect-to-iface, like DC on InfiniBand):
 *   - the md opens the device context; MRs and device memory live there;
 *   - an iface owns one CQ, a target QP that accepts SENDs from any source
 *     (HCA_QPN_ANY) and reads the ones that fit a ring slot in place
 *     (HCA_QP_CREATE_RECV_INPLACE; receive descriptors take the larger
 *     ones), and an SRQ on a CQ of its own that its endpoint QPs attach
 *     to (they never receive);
 *   - an ep is a QP connected to the remote iface's target QP.
 * Active messages are SEND_WITH_IMM (imm = AM id), written straight into
 * the target's ring when the send queue is idle (its fast ops' send_reserve); puts
 * and gets are RDMA WRITE/READ and atomics the device's atomics, executed
 * in the call on a peer's mapped device memory (hca_*_direct).
 */
#ifndef UCT_HCA_H
#define UCT_HCA_H

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include <hca_dev.h>
#include "hca_rcache.h"

#include <uct/base/uct_iface.h>
#include <uct/base/uct_md.h>
#include <ucs/datastruct/arbiter.h>
#include <ucs/datastruct/list.h>
#include <ucs/datastruct/mpool.h>
#include <ucs/type/class.h>

#include "hca_compat.h"

#define UCT_HCA_NAME            "hca"
#define UCT_HCA_MAX_IOV         (HCA_MAX_SGE_UCT)
#define HCA_MAX_SGE_UCT         7   /* device max 8: one for the AM header */
#define UCT_HCA_MAX_EPS         (1u << HCA_QPN_INDEX_BITS) /* by QPN index */
#define UCT_HCA_MAX_INLINE      960 /* short ops; bcopy goes up to seg_size */

extern uct_component_t uct_hca_component;

/* ---------------------------------------------------------------- md */

typedef struct uct_hca_md_config {
    uct_md_config_t super;
    char           *device;       /* which hca_dev device to open */
    int             single_copy;  /* allow process_vm_* */
    int             fabric;       /* hca_fabric_mode_t */
    char           *net_devices;  /* tcp listener: interfaces/addresses */
    ucs_range_spec_t port_range;  /* tcp listener ports */
    double          retry_timeout; /* seconds: a tcp peer from which nothing
                                      arrives fails (UCX_HCA_RETRY_TIMEOUT) */
    double          peer_timeout;  /* its first name; 0: unset */
    int             stats;        /* print device counters at close */
    int             rcache;       /* registration cache on */
    unsigned        rcache_max_regions;
    size_t          rcache_max_size;
} uct_hca_md_config_t;

typedef struct uct_hca_md {
    uct_md_t       super;
    hca_device_t  *dev;
    hca_pd_t      *pd;
    hca_port_addr_t addr;
    uint64_t       host_hash;
    int            stats;
    int            tcp_only;     /* UCX_HCA_FABRIC=tcp: every peer is a
                                    network peer */
    uct_hca_rcache_t *rcache;    /* NULL: every registration is made and
                                    unmade around each use */
    double         reg_cost;     /* seconds, for md_query's reg_cost */
} uct_hca_md_t;

/* A registration (or allocation) */
typedef struct uct_hca_memh {
    hca_mr_t *mr;
    hca_dm_t *dm;        /* set when allocated by mem_alloc */
    uint32_t  lkey;
    /* its key was packed with an INVALIDATE flag (UCX >= 1.15): only
     * such a key may be deregistered with UCT_MD_MEM_DEREG_FLAG_INVALIDATE,
     * as UCX's IB md requires (ib_mlx5dv_md.c,
     * uct_ib_devx_dereg_invalidate_rkey_check) */
    uint8_t   inv_packed;
    struct uct_hca_rcache_entry *entry; /* set when it lives in the cache */
} uct_hca_memh_t;

/* Packed rkey: the key, and what a peer on this host needs to map device
 * memory for rkey_ptr (dm_id 0: plain memory). */
typedef struct UCS_S_PACKED uct_hca_packed_rkey {
    uint32_t rkey;
    uint32_t dm_id;
    uint32_t pid;
    uint32_t ctx_id;
    uint64_t dm_base;    /* device memory base in the owner's space */
    uint64_t host_hash;  /* same host check before mapping */
} uct_hca_packed_rkey_t;


/* ---------------------------------------------------------------- iface */

typedef struct uct_hca_iface_config {
    uct_iface_config_t     super;
    size_t                 seg_size;     /* receive descriptor / bcopy size */
    unsigned               rx_queue_len; /* posted receives */
    unsigned               tx_queue_len; /* send queue per ep */
    unsigned               tx_cq_len;    /* signalled ops in flight */
    uct_iface_mpool_config_t mp;
    size_t                 get_min_zcopy; /* cap.get.min_zcopy */
} uct_hca_iface_config_t;

/* Device address: the host identity (what "same host" means) and the
 * address of its tcp fabric (family HCA_NET_NONE: none).  25 bytes:
 * UCP takes at most 31. */
typedef struct UCS_S_PACKED uct_hca_device_addr {
    uint64_t host;          /* hca_host_key() */
    uint8_t  net_family;    /* HCA_NET_* */
    uint8_t  net_addr[16];
} uct_hca_device_addr_t;

/* Iface address: the context, its target QP, the tcp port and the
 * context's secret (only a peer given this address can connect over
 * tcp), and the count of its further tcp paths, packed behind it: per
 * path its family (1 byte), port (2) and address (4 for IPv4, 16 for
 * IPv6).  23 bytes, and 7 per further IPv4 path (19 per IPv6 one), within
 * UCP's 63: the paths that do not fit are left out. */
typedef struct UCS_S_PACKED uct_hca_iface_addr {
    uint32_t pid;
    uint32_t ctx_id;
    uint32_t qpn;
    uint16_t net_port;
    uint64_t secret;
    uint8_t  n_paths_more;
} uct_hca_iface_addr_t;

#define UCT_HCA_IFACE_ADDR_MAX 63

_Static_assert(sizeof(uct_hca_device_addr_t) <= 31, "UCP: device address");
_Static_assert(sizeof(uct_hca_iface_addr_t) <= UCT_HCA_IFACE_ADDR_MAX,
               "UCP: iface address");

/* One further path's bytes in the iface address. */
static inline size_t uct_hca_path_packed_len(const hca_net_addr_t *net)
{
    return 3 + ((net->family == HCA_NET_IPV6) ? 16 : 4);
}

/* How many of the context's further paths its iface address carries. */
static inline unsigned uct_hca_paths_packed(const hca_port_addr_t *addr,
                                            size_t *len_p)
{
    size_t len = sizeof(uct_hca_iface_addr_t);
    unsigned n = 0;

    while ((n < addr->n_net_more) &&
           (len + uct_hca_path_packed_len(&addr->net_more[n]) <=
            UCT_HCA_IFACE_ADDR_MAX)) {
        len += uct_hca_path_packed_len(&addr->net_more[n]);
        ++n;
    }
    if (len_p != NULL) {
        *len_p = len;
    }
    return n;
}

/* The device's port address of a peer, from its UCT addresses. */
static inline void uct_hca_port_addr(hca_port_addr_t *addr,
                                     const uct_hca_device_addr_t *dev_addr,
                                     const uct_hca_iface_addr_t *iface_addr)
{
    memset(addr, 0, sizeof(*addr));
    addr->host       = dev_addr->host;
    addr->pid        = iface_addr->pid;
    addr->ctx_id     = iface_addr->ctx_id;
    addr->net.family = dev_addr->net_family;
    addr->net.port   = iface_addr->net_port;
    memcpy(addr->net.addr, dev_addr->net_addr, sizeof(addr->net.addr));
    addr->secret     = iface_addr->secret;
    /* the further paths: as many as we can take, the rest ignored (a
     * peer with more paths than ours still connects, on fewer) */
    const uint8_t *p = (const uint8_t*)(iface_addr + 1);
    for (unsigned i = 0; (i < iface_addr->n_paths_more) &&
                         (i < HCA_NET_MAX_PATHS - 1); ++i) {
        hca_net_addr_t *net = &addr->net_more[i];
        if ((p[0] != HCA_NET_IPV4) && (p[0] != HCA_NET_IPV6)) {
            break; /* not an address of ours */
        }
        net->family = p[0];
        memcpy(&net->port, p + 1, 2);
        memcpy(net->addr, p + 3, (net->family == HCA_NET_IPV6) ? 16 : 4);
        p += uct_hca_path_packed_len(net);
        addr->n_net_more = i + 1;
    }
}

/* Receive descriptor: [lkey][uct_recv_desc_t*][rx_headroom][data] */
typedef struct uct_hca_rx_desc {
    uint32_t          lkey;
    uint32_t          reserved;
    uct_recv_desc_t  *release;   /* uct_recv_desc(): right before desc */
} uct_hca_rx_desc_t;

typedef enum {
    UCT_HCA_OP_COMP = 0,     /* call comp (zcopy, flush helpers) */
    UCT_HCA_OP_BUFFER,       /* release the bounce buffer */
    UCT_HCA_OP_GET_BCOPY,    /* unpack from the bounce buffer */
    UCT_HCA_OP_FETCH         /* copy the fetched value to the user */
} uct_hca_op_type_t;

/* A signalled operation: wr_id points to it.  Lives in tx_mp, whose
 * elements also carry a registered bounce buffer of seg_size bytes. */
typedef struct uct_hca_op {
    uint32_t                 type;
    uint32_t                 lkey;    /* of the bounce buffer */
    struct uct_hca_ep       *ep;      /* NULL: its ep was destroyed, and
                                         with it its completion called;
                                         the CQE only returns it */
    ucs_list_link_t          outstanding; /* in ep->ops while its CQE is
                                             awaited */
    uct_completion_t        *comp;
    void                    *result;  /* FETCH: user's result */
    uint32_t                 size;    /* FETCH: 4 or 8 */
    uint32_t                 length;  /* GET_BCOPY */
    uct_unpack_callback_t    unpack_cb;
    void                    *unpack_arg;
    uint64_t                 value;   /* FETCH lands here */
    /* bounce buffer follows */
} uct_hca_op_t;

typedef struct uct_hca_iface {
    uct_base_iface_t      super;
    uct_hca_md_t         *md;
    hca_cq_t             *cq;
    hca_srq_t            *ep_srq;
    hca_cq_t             *ep_rx_cq;   /* ep QPs' receive side: they never
                                         receive, so it is never polled */
    hca_qp_t             *tgt_qp;
    ucs_mpool_t           rx_mp;
    ucs_mpool_t           tx_mp;
    ucs_arbiter_t         arbiter;
    ucs_list_link_t       ep_list;
    ucs_list_link_t       flush_eps;   /* eps with flush waiters */
    uct_recv_desc_t       release_desc;
    struct uct_hca_ep   **ep_by_qp;    /* by QPN index: error routing */
    size_t                rx_headroom;
    unsigned              tx_credits;  /* signalled ops that fit the CQ */
    unsigned              failed_eps;  /* eps waiting for error report */
    unsigned              progress_calls;
    ucs_time_t            next_peer_check;
    uint64_t              dead_peers;  /* hca_device_check_peers() seen */
    struct {
        size_t            seg_size;
        unsigned          rx_queue_len;
        unsigned          tx_queue_len;
        unsigned          max_inline;
        size_t            max_zcopy;     /* device's largest message */
        int               bcopy_in_slot; /* seg_size fits a ring slot:
                                            bcopy packs straight into it */
        size_t            get_min_zcopy; /* cap.get.min_zcopy */
        int               get_bcopy;     /* UCT_IFACE_FLAG_GET_BCOPY */
    } config;
} uct_hca_iface_t;

/* ---------------------------------------------------------------- ep */

typedef struct uct_hca_flush_req {
    ucs_queue_elem_t  queue;
    uct_completion_t *comp;
    uint64_t          sq_pos;  /* WRs posted before the flush: done when
                                  that many are retired */
    ucs_status_t      status;  /* set when due */
} uct_hca_flush_req_t;

typedef struct uct_hca_ep {
    uct_base_ep_t        super;
    hca_qp_t            *qp;
    const hca_fast_ops_t *fast;        /* the QP's fabric's fast paths */
    ucs_arbiter_group_t  arb_group;
    ucs_list_link_t      list;         /* in iface->ep_list */
    ucs_list_link_t      flush_list;   /* in iface->flush_eps */
    ucs_queue_head_t     flush_q;
    ucs_list_link_t      ops;          /* signalled ops awaiting their CQE,
                                          in post order: destroy completes
                                          them */
    unsigned             send_flags;   /* HCA_SEND_FENCE once after fence */
    ucs_status_t         status;       /* != OK: failed */
    int                  err_reported;
    int                  err_pending;  /* report from progress */
    int                  no_resource;  /* last send found no room */
    unsigned             lost_posts;   /* accepted after it failed, before
                                          the report (uct_hca_ep_failed_post) */
    int                  in_pending;   /* dispatching its pending queue */
    hca_port_addr_t      peer;         /* the remote iface's port ... */
    uint32_t             peer_qpn;     /* ... and target QP */
} uct_hca_ep_t;

/* Fails the ep (reported from progress) if its peer is gone. */
void uct_hca_ep_peer_check(uct_hca_ep_t *ep);

UCS_CLASS_DECLARE(uct_hca_ep_t, const uct_ep_params_t*);
UCS_CLASS_DECLARE_NEW_FUNC(uct_hca_ep_t, uct_ep_t, const uct_ep_params_t*);
UCS_CLASS_DECLARE_DELETE_FUNC(uct_hca_ep_t, uct_ep_t);

/* device errors -> UCS statuses, in one place (hca_status.c) */
ucs_status_t uct_hca_status(hca_wc_status_t status);   /* completions */
ucs_status_t uct_hca_errno_status(int rc);              /* -errno of calls */

/* iface helpers used by ep */
void uct_hca_iface_schedule_err(uct_hca_iface_t *iface, uct_hca_ep_t *ep,
                                ucs_status_t status);
unsigned uct_hca_iface_progress(uct_iface_h tl_iface);

/* the performance model (hca_perf.c): iface_query's latency, bandwidth,
 * overhead and priority, and the per-operation figures of
 * uct_iface_estimate_perf */
void uct_hca_iface_query_perf(const uct_hca_iface_t *iface,
                              uct_iface_attr_t *attr);
ucs_status_t uct_hca_iface_estimate_perf(uct_iface_h tl_iface,
                                         uct_perf_attr_t *perf_attr);

/* ep operations (hca_ep.c) */
ucs_status_t uct_hca_ep_am_short(uct_ep_h tl_ep, uint8_t id, uint64_t header,
                                 const void *payload, unsigned length);
ucs_status_t uct_hca_ep_am_short_iov(uct_ep_h tl_ep, uint8_t id,
                                     const uct_iov_t *iov, size_t iovcnt);
ssize_t uct_hca_ep_am_bcopy(uct_ep_h tl_ep, uint8_t id,
                            uct_pack_callback_t pack_cb, void *arg,
                            unsigned flags);
ucs_status_t uct_hca_ep_am_zcopy(uct_ep_h tl_ep, uint8_t id,
                                 const void *header, unsigned header_length,
                                 const uct_iov_t *iov, size_t iovcnt,
                                 unsigned flags, uct_completion_t *comp);
ucs_status_t uct_hca_ep_put_short(uct_ep_h tl_ep, const void *buffer,
                                  unsigned length, uint64_t remote_addr,
                                  uct_rkey_t rkey);
ssize_t uct_hca_ep_put_bcopy(uct_ep_h tl_ep, uct_pack_callback_t pack_cb,
                             void *arg, uint64_t remote_addr,
                             uct_rkey_t rkey);
ucs_status_t uct_hca_ep_put_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                  size_t iovcnt, uint64_t remote_addr,
                                  uct_rkey_t rkey, uct_completion_t *comp);
ucs_status_t uct_hca_ep_get_bcopy(uct_ep_h tl_ep,
                                  uct_unpack_callback_t unpack_cb, void *arg,
                                  size_t length, uint64_t remote_addr,
                                  uct_rkey_t rkey, uct_completion_t *comp);
ucs_status_t uct_hca_ep_get_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov,
                                  size_t iovcnt, uint64_t remote_addr,
                                  uct_rkey_t rkey, uct_completion_t *comp);
ucs_status_t uct_hca_ep_atomic32_post(uct_ep_h tl_ep, unsigned opcode,
                                      uint32_t value, uint64_t remote_addr,
                                      uct_rkey_t rkey);
ucs_status_t uct_hca_ep_atomic64_post(uct_ep_h tl_ep, unsigned opcode,
                                      uint64_t value, uint64_t remote_addr,
                                      uct_rkey_t rkey);
ucs_status_t uct_hca_ep_atomic32_fetch(uct_ep_h tl_ep, uct_atomic_op_t opcode,
                                       uint32_t value, uint32_t *result,
                                       uint64_t remote_addr, uct_rkey_t rkey,
                                       uct_completion_t *comp);
ucs_status_t uct_hca_ep_atomic64_fetch(uct_ep_h tl_ep, uct_atomic_op_t opcode,
                                       uint64_t value, uint64_t *result,
                                       uint64_t remote_addr, uct_rkey_t rkey,
                                       uct_completion_t *comp);
ucs_status_t uct_hca_ep_atomic_cswap32(uct_ep_h tl_ep, uint32_t compare,
                                       uint32_t swap, uint64_t remote_addr,
                                       uct_rkey_t rkey, uint32_t *result,
                                       uct_completion_t *comp);
ucs_status_t uct_hca_ep_atomic_cswap64(uct_ep_h tl_ep, uint64_t compare,
                                       uint64_t swap, uint64_t remote_addr,
                                       uct_rkey_t rkey, uint64_t *result,
                                       uct_completion_t *comp);
ucs_status_t uct_hca_ep_flush(uct_ep_h tl_ep, unsigned flags,
                              uct_completion_t *comp);
ucs_status_t uct_hca_ep_fence(uct_ep_h tl_ep, unsigned flags);
ucs_status_t uct_hca_ep_check(uct_ep_h tl_ep, unsigned flags,
                              uct_completion_t *comp);
ucs_status_t uct_hca_ep_pending_add(uct_ep_h tl_ep, uct_pending_req_t *n,
                                    unsigned flags);
void uct_hca_ep_pending_purge(uct_ep_h tl_ep, uct_pending_purge_callback_t cb,
                              void *arg);
ucs_arbiter_cb_result_t uct_hca_ep_process_pending(ucs_arbiter_t *arbiter,
                                                   ucs_arbiter_group_t *group,
                                                   ucs_arbiter_elem_t *elem,
                                                   void *arg);
/* Moves ep's flush requests that are due to `due`; completing them is a
 * second step (uct_hca_ep_flush_complete), because a completion may
 * destroy any ep. */
void uct_hca_ep_flush_progress(uct_hca_ep_t *ep, ucs_queue_head_t *due);
void uct_hca_ep_flush_complete(ucs_queue_head_t *due);
void uct_hca_ep_complete_op(uct_hca_iface_t *iface, uct_hca_op_t *op,
                            ucs_status_t status);

static UCS_F_ALWAYS_INLINE void *uct_hca_op_buffer(uct_hca_op_t *op)
{
    return op + 1;
}

#endif
