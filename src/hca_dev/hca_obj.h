/*
 * hca_obj.h - the device's objects: the device context, PD, MR, DM, CQ,
 * RQ/SRQ, QP and WQE structs, and the device limits. Data only (plus the one
 * inline that needs the device struct complete, hca_fault); the functions on
 * them are declared by the layer that implements them (hca_state.h,
 * hca_engine.h), their inlines by concern (hca_queue.h, hca_mpt.h,
 * hca_counters.h).
 * Private to libhcadev (not installed).
 */
#ifndef HCA_OBJ_H
#define HCA_OBJ_H

#include "hca_dev.h"
#include "hca_util.h"
#include "hca_base.h"
#include "hca_ring.h"
#include "hca_wire.h"
#include "hca_fabric.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* Device limits (per opened context) */
#define HCA_MAX_MR        65536
#define HCA_MAX_QP        ((1u << HCA_QPN_INDEX_BITS) - 1) /* index > 0 */
#define HCA_MAX_CQ        1024
#define HCA_MAX_DM        1024
#define HCA_MAX_PD        65536
#define HCA_MAX_SRQ       1024
#define HCA_MAX_QP_WR     16384
#define HCA_MAX_QP_RD_ATOM 16     /* atomics unanswered per QP (tcp) */
#define HCA_MAX_CQE       65536
#define HCA_MAX_MSG       (256ull << 20)
#define HCA_MAX_DM_SIZE   (1ull << 36)
#define HCA_PEER_CHECK_NS 50000000ull  /* liveness check while waiting */

/* ---------------------------------------------------------------- device */

struct hca_device {
    char               name[HCA_DEVNAME_MAX];
    unsigned           flags;
    int                numa_node;
    uint32_t           pid;
    uint32_t           pidns;
    uint32_t           ctx_id;
    uint32_t           name_nonce; /* hca_obj_name() of our objects */
    hca_notify_ctx_t   notify_self;/* our consumers' wakeup names */
    uint64_t           claim_mark; /* in the ring slots we claim */
    uint64_t           start_time;
    hca_host_id_t      host;
    uint64_t           host_key;   /* hca_host_key(&host) */
    pthread_mutex_t    lock;       /* tables, peers, counters */
    hca_memobj_t          ctx;
    hca_ctx_hdr_t     *hdr;
    hca_mpt_entry_t   *mpt;
    hca_qp_pub_t      *qp_pub;
    hca_notify_t      *notify;
    hca_ring_t         svc;
    hca_ring_watch_t   svc_unstamped; /* an unstamped claim at its tail */
    uint32_t           mpt_next;   /* search hint */
    uint8_t           *mpt_tag;    /* next tag per entry */
    uint64_t           mpt_serial; /* the last registration's serial */
    struct hca_mr    **mrs;
    struct hca_qp    **qps;        /* by QPN index */
    uint32_t          *qp_gen;
    struct hca_cq    **cqs;        /* by notify index */
    struct hca_dm     *dm_list;
    uint32_t           next_dm_id;
    hca_export_entry_t *exports;   /* in ctx: the export table */
    struct hca_export *export_list; /* dev->lock */
    uint32_t           next_export; /* ids are never reused */
    uint32_t           export_fds;  /* FILE exports: fds we hold */
    int                export_on;   /* $HCA_EXPORT (default 1) */
    /* the owner polls (hca_progress.c): its polls serve the service ring,
     * and the shm fabric's responder thread sleeps unarmed meanwhile */
    _Atomic uint64_t   owner_polls;  /* the owner's polls, counted */
    _Atomic int        owner_asleep; /* it armed a CQ since its last poll */
    uint32_t           next_ring_id;
    uint32_t           next_pd;
    uint32_t           n_pd;
    _Atomic uint64_t   dead_peers; /* found dead so far, all fabrics */
    hca_mapper_t      *mappers;    /* in ctx: who accesses our memory */
    hca_fault_cfg_t    fault;
    /* the fabrics (hca_fabric.c): ops with defaults, and their state */
    hca_fabric_ops_t   fabric_ops[HCA_FABRIC_LAST];
    int                fabric_open[HCA_FABRIC_LAST];
    void              *fabric_dev[HCA_FABRIC_LAST];
    hca_busy_t        *busy;       /* in ctx: our QPs' busy words */
    int                send_sock;  /* unbound, for wakeups */
    int                single_copy;
    hca_fabric_mode_t  fabric_mode;
    _Atomic uint32_t   fabric_polls; /* fabrics whose poll op a CQ poll
                                        calls (bit per hca_fabric_type_t) */
    hca_open_attr_t    open_attr;  /* as opened (net_devices copied) */
    char               net_devices[128];
    int                trace;      /* HCA_TRACE=1: engines log transitions */
    volatile uint64_t  probe_value;
    hca_counters_t     retired;    /* destroyed QPs */
    hca_counters_t    *svc_cnt;    /* in the ctx object; responder side */
    hca_memobj_t          host_stats; /* host-wide totals of closed objects */
};

struct hca_pd {
    hca_device_t *dev;
    uint32_t      handle;
    _Atomic int   refs;        /* MRs, QPs, SRQs */
};

struct hca_mr {
    hca_pd_t *pd;
    struct hca_dm *dm;       /* device memory it lies in, or NULL */
    struct hca_export *export; /* shared object it lies in, or NULL */
    uint32_t  index;
    uint32_t  key;
    void     *addr;
    size_t    length;
};

struct hca_dm {
    struct hca_dm *next;
    hca_device_t  *dev;
    uint32_t       id;
    hca_memobj_t      obj;
    size_t         length;
    uint32_t       mrs;      /* MRs inside it (dev->lock) */
    int            freed;    /* its user freed it while MRs inside were
                                held: it goes with the last of them */
};

/* A shared object outside hca that backs registered memory, published in
 * the ctx's export table for peers to map (hca_export.c). */
struct hca_export {
    struct hca_export *next;
    uint32_t           id;       /* HCA_DM_EXPORT | n */
    uint32_t           refs;     /* MRs in it (dev->lock) */
    uint32_t           kind;
    uint64_t           handle, dev, ino, stamp;
    uint64_t           size;     /* as published: what peers map */
    int                fd;       /* FILE: held open for peers, else -1 */
};

/* ---------------------------------------------------------------- CQ */

typedef struct hca_cqe {
    hca_wc_t wc;
    uint32_t owner;            /* phase of the wrap that wrote it */
    uint32_t reserved;
} hca_cqe_t;

struct hca_cq {
    hca_device_t    *dev;
    uint32_t         idx;         /* notify index, socket name */
    hca_cqe_t       *ring;
    uint32_t         mask;
    uint32_t         log_size;
    uint64_t         prod;
    uint64_t         cons;
    int              overflow;
    int              overflow_handled; /* its QPs were moved to ERR */
    uint32_t         idle_polls;  /* when to look for dead claimers */
    int              sock;        /* bound AF_UNIX datagram socket */
    int              refs;
    struct hca_qp  **send_qps;    /* every QP sending to this CQ */
    uint32_t         n_send_qps;
    struct hca_qp  **busy_qps;    /* those with issued or queued WQEs:
                                     the only ones poll must progress */
    uint32_t         n_busy_qps;
    struct hca_rq  **rqs;
    uint32_t        *rq_refs;     /* QPs of this CQ on each ring */
    uint32_t         n_rqs;
};

/* ---------------------------------------------------------------- RQ/SRQ */

typedef struct hca_rwqe {
    uint64_t  wr_id;
    uint32_t  num_sge;
    uint32_t  length;          /* sum of SGEs */
    hca_sge_t sge[HCA_MAX_SGE];
} hca_rwqe_t;

/* A partially received fragmented SEND (no single copy).  It holds a
 * posted receive, so it is bounded: a new first fragment from the same
 * source QP, more than hca_partials_per_source() of its source process, the
 * source's death, or its fabric's timeout (HCA_PARTIAL_TIMEOUT_NS; tcp:
 * the peer timeout if longer) without a fragment while the ring is read
 * as far as it can be ends it with an error CQE, which gives the receive
 * back. */
typedef struct hca_partial {
    struct hca_partial *next;
    uint32_t            src_pid, src_ctx, src_qpn;
    const hca_fabric_ops_t *fabric; /* that carried its first fragment
                                       (hca_fabric_of_msg) */
    uint32_t            offset;     /* bytes placed */
    uint32_t            msg_len;    /* as its first fragment said */
    int                 error;      /* hca_wc_status_t */
    uint64_t            last_ns;    /* its latest fragment */
    hca_rwqe_t          rwqe;
} hca_partial_t;

#define HCA_PARTIAL_TIMEOUT_NS (2ull * 1000000000ull)

/* A receive queue with its ring: a QP's own, or an SRQ's. */
typedef struct hca_rq {
    hca_device_t *dev;
    hca_pd_t     *pd;
    uint32_t      ring_id;
    hca_memobj_t     obj;
    hca_ring_t    ring;
    hca_ring_watch_t unstamped;   /* an unstamped claim at its tail */
    hca_rwqe_t   *wqes;
    uint32_t      mask;
    uint32_t      max_sge;
    uint64_t      head;           /* posted */
    uint64_t      tail;           /* consumed */
    int           is_srq;
    int           inplace;        /* HCA_QP_CREATE_RECV_INPLACE */
    uint32_t      cqes;           /* its receive CQEs not yet polled: an
                                     in-place message must not pass them */
    uint32_t      n_partials;     /* of its QPs (hca_partial_t) */
    uint64_t      rnr_at;         /* ring index + 1 of the message that
                                     found no posted receive (0: none);
                                     hca_rq_post wakes an armed CQ */
    uint64_t      sweep_ns;       /* next look for orphan partials */
    uint64_t      rnr_ns;         /* since when the ring's head waits for
                                     a receive (0: it does not) */
    struct hca_qp *owner;         /* own RQ: its QP */
} hca_rq_t;

struct hca_srq {
    hca_rq_t rq;
    int      qps;
};

/* A message taken from a receive ring: one copy of its header (the slot
 * is shared with its sender), and for a SEND_PULL its descriptor. */
typedef struct hca_ingress_msg {
    hca_msg_hdr_t   hdr;
    const uint8_t  *payload;
    hca_pull_hdr_t  pull;
    hca_wire_iov_t  iov[HCA_MAX_SGE];
} hca_ingress_msg_t;

/* ---------------------------------------------------------------- QP */

typedef enum {
    HCA_WQE_POSTED = 0,  /* not yet executed */
    HCA_WQE_PARTIAL,     /* started, more to move (fragments, chunks) */
    HCA_WQE_ISSUED,      /* waiting for a response from the peer */
    HCA_WQE_DONE         /* status final */
} hca_wqe_state_t;

typedef struct hca_wqe {
    uint64_t        wr_id;
    uint8_t         opcode;       /* hca_wr_opcode_t */
    uint8_t         state;        /* hca_wqe_state_t */
    uint16_t        flags;        /* HCA_SEND_* */
    uint32_t        num_sge;
    uint32_t        status;       /* hca_wc_status_t */
    uint32_t        imm;
    uint32_t        rkey;
    uint32_t        resp_stamp;   /* fabric: the stamp its response bears
                                     in the QP's response slot */
    uint64_t        remote_addr;
    uint64_t        compare_add;
    uint64_t        swap;
    uint64_t        length;       /* total bytes */
    uint64_t        done;         /* fabric: bytes moved (PARTIAL) */
    uint64_t        chunk;        /* fabric: bytes of the chunk in flight */
    hca_sge_t       sge[HCA_MAX_SGE];
} hca_wqe_t;

/* What a QP's requester counts of one opcode, in the QP's own memory.
 * 32 bytes, 32-aligned: the per-operation count touches one cache line
 * (hca_count_tx), and nothing another process maps. */
typedef struct hca_tally_op {
    uint64_t ops;
    uint64_t bytes;
    uint64_t mapped;   /* of them, done straight in mapped device memory */
    uint64_t pad;
} hca_tally_op_t;

/* The tally and what of it the shared counters (qp->cnt) already have:
 * hca_tally.c publishes the difference, under seq (odd while it writes)
 * for the process's other threads that read counters. */
typedef struct hca_tally {
    _Alignas(64) hca_tally_op_t tx[HCA_WR_OPCODE_LAST];
    hca_tally_op_t published[HCA_WR_OPCODE_LAST];
    _Atomic uint32_t seq;
} hca_tally_t;

struct hca_qp {
    hca_device_t     *dev;
    hca_pd_t         *pd;
    hca_cq_t         *send_cq;
    hca_cq_t         *recv_cq;
    hca_srq_t        *srq;
    hca_rq_t         *rq;         /* own RQ or &srq->rq */
    hca_rq_t          own_rq;
    uint32_t          qpn;
    uint32_t          index;
    hca_qp_state_t    state;
    hca_wc_status_t   err_cause;  /* what moved it to ERR (hca_qp_error) */
    hca_qp_pub_t     *pub;
    int               sq_sig_all;
    int               quiet_flush;
    uint32_t          max_inline;
    uint32_t          max_send_sge;
    /* send queue */
    hca_wqe_t        *sq;
    uint8_t          *inline_buf; /* max_inline bytes per WQE */
    uint32_t          sq_mask;
    uint64_t          sq_head;    /* next to post */
    uint64_t          sq_exec;    /* next to execute */
    uint64_t          sq_tail;    /* oldest not reported */
    uint32_t          n_issued;   /* WQEs waiting for a response */
    int               on_busy;    /* in send_cq->busy_qps */
    uint32_t          sq_held;    /* reported CQEs not yet polled: their
                                     slots stay taken, so a CQ as deep as
                                     the send queue cannot overflow */
    uint32_t          stamp_seq;
    uint64_t          stall_since;/* ns: the liveness timer, running
                                     while nothing moves (hca_qp_stalled);
                                     0: stopped */
    uint64_t          reserved;   /* keeps fabric_priv on the cache line
                                     it had with two timers: one line
                                     earlier, ucp_put_bw 8 B over shm ran
                                     8% slower (A/B, 10 of 12 pairs) */
    hca_memobj_t         qobj;       /* response slots + bounce area */
    hca_resp_slot_t  *resp;
    uint8_t          *bounce;
    /* connection */
    hca_port_addr_t   dest;
    uint32_t          dest_qpn;
    const hca_fabric_ops_t *fabric; /* chosen at RTR; hca_fabric_none
                                       before (hca_fabric.h) */
    hca_partial_t    *partials;   /* fragmented SENDs being received */
    hca_counters_t   *cnt;        /* in the q object: hca_devinfo reads it */
    /* the fabric's per-QP state (its own struct, private to it) */
    _Alignas(64) unsigned char fabric_priv[HCA_FABRIC_QP_PRIV];
    /* the requester's counts, in memory only this process writes (after
     * fabric_priv, so that no hot field moved); hca_counters.h */
    hca_tally_t       tally;
};

/* ---------------------------------------------------------------- faults */

/* 1 if an injected fault of this kind happens now. */
static inline int hca_fault(hca_device_t *dev, hca_fault_kind_t kind)
{
    return HCA_UNLIKELY(dev->fault.enabled) && hca_fault_hit(&dev->fault, kind);
}

#endif
