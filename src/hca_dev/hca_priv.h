/*
 * hca_priv.h - internal objects of libhcadev.  Not installed.
 */
#ifndef HCA_PRIV_H
#define HCA_PRIV_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* process_vm_readv/writev */
#endif

#include "hca_dev.h"
#include "hca_ring.h"
#include "hca_wire.h"
#include "hca_fabric.h"
#include "hca_atomic.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define HCA_LIKELY(x)   __builtin_expect(!!(x), 1)
#define HCA_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HCA_INLINE      static inline __attribute__((always_inline))
#define HCA_NOINLINE    __attribute__((noinline))
#define HCA_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Device limits (per opened context) */
#define HCA_MAX_MR        65536
#define HCA_MAX_QP        ((1u << HCA_QPN_INDEX_BITS) - 1) /* index > 0 */
#define HCA_MAX_CQ        1024
#define HCA_MAX_DM        1024
#define HCA_MAX_PD        65536
#define HCA_MAX_SRQ       1024
#define HCA_MAX_QP_WR     16384
#define HCA_MAX_CQE       65536
#define HCA_MAX_MSG       (256ull << 20)
#define HCA_MAX_DM_SIZE   (1ull << 36)
#define HCA_PEER_CHECK_NS 50000000ull  /* liveness check while waiting */

#define hca_log(_fmt, ...) \
    fprintf(stderr, "hca: " _fmt "\n", ## __VA_ARGS__)

/* ---------------------------------------------------------------- shm */

#define HCA_OBJ_NAME_MAX 96 /* "/hca.<pidns>.<pid>.<ctx>.<nonce>.<kind><id>" */

typedef struct hca_memobj {
    void   *addr;
    size_t  length;
    char    name[HCA_OBJ_NAME_MAX];
    int     owner;          /* created by us: unlink on close */
} hca_memobj_t;

int  hca_memobj_create(hca_memobj_t *shm, const char *name, size_t length,
                    int numa_node);
int  hca_memobj_map(hca_memobj_t *shm, const char *name, size_t min_length);
void hca_memobj_destroy(hca_memobj_t *shm);
void hca_memobj_reclaim(uint32_t pidns, uint32_t self_pid, int first_open);
void hca_ctx_name(char *buf, size_t len, uint32_t pidns, uint32_t pid,
                  uint32_t ctx);
void hca_obj_name(char *buf, size_t len, uint32_t pidns, uint32_t pid,
                  uint32_t ctx, uint32_t nonce, const char *kind, uint64_t id);

/* ---------------------------------------------------------------- host */

int      hca_proc_start_time(uint32_t pid, uint64_t *start_p);
/* 1 if the producer of a claim mark (hca_ring.h) is gone. */
int      hca_claimer_gone(uint64_t mark);
uint32_t hca_ns_inode(const char *kind);

/* Fault injection (hca_fault.c): HCA_FAULT="map=P,reg=P,answer_delay_us=N,
 * ring_stall_ms=N" (P a probability in [0,1]); off by default. */
typedef enum {
    HCA_FAULT_MAP = 0,     /* a peer's object cannot be mapped */
    HCA_FAULT_REG,         /* a registration fails (-ENOMEM) */
    HCA_FAULT_LAST
} hca_fault_kind_t;

typedef struct hca_fault_cfg {
    int              enabled;
    uint32_t         prob[HCA_FAULT_LAST];  /* of 2^32 */
    uint32_t         answer_delay_us;       /* before each answer */
    uint32_t         ring_stall_ms;         /* the owner stops consuming
                                               its receive rings */
    _Atomic uint64_t seq;
} hca_fault_cfg_t;

/* ---------------------------------------------------------------- fabrics */

/* The registry (hca_fabric.c). */
/* Opens every fabric on a new device context (their defaults filled in
 * dev->fabric_ops); closes them in reverse. */
int  hca_fabric_open(hca_device_t *dev);
void hca_fabric_close(hca_device_t *dev);
/* Every open fabric lets go of the QP (destroy, reset): none of their
 * threads is inside it after this. */
void hca_fabric_quiesce_all(hca_qp_t *qp);
/* A user thread's poll of the fabrics that asked for it (dev->fabric_polls). */
void hca_fabric_poll(hca_device_t *dev);
/* The fabric that reaches addr from dev, or NULL (unreachable). */
const hca_fabric_ops_t *hca_fabric_for_addr(hca_device_t *dev,
                                            const hca_port_addr_t *addr);
/* The fabric of a received ring message (today: shm). */
const hca_fabric_ops_t *hca_fabric_of_msg(hca_device_t *dev,
                                          const hca_msg_hdr_t *hdr);
/* A fabric that is not connected: every op fails or is unsupported
 * (a QP before RTR, or a receive-only target). */
extern const hca_fabric_ops_t hca_fabric_none;

/* ---------------------------------------------------------------- device */

struct hca_device {
    char               name[HCA_DEVNAME_MAX];
    unsigned           flags;
    int                numa_node;
    uint32_t           pid;
    uint32_t           pidns;
    uint32_t           ctx_id;
    uint32_t           name_nonce; /* hca_obj_name() of our objects */
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
    uint32_t           mpt_next;   /* search hint */
    uint8_t           *mpt_tag;    /* next tag per entry */
    struct hca_mr    **mrs;
    struct hca_qp    **qps;        /* by QPN index */
    uint32_t          *qp_gen;
    struct hca_cq    **cqs;        /* by notify index */
    struct hca_dm     *dm_list;
    uint32_t           next_dm_id;
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
    uint32_t  index;
    uint32_t  key;
    void     *addr;
    size_t    length;
};

/* The device memory holding [addr, addr+length), or NULL (dev->lock). */
struct hca_dm *hca_dm_find(hca_device_t *dev, uintptr_t addr, size_t length);

struct hca_dm {
    struct hca_dm *next;
    hca_device_t  *dev;
    uint32_t       id;
    hca_memobj_t      obj;
    size_t         length;
    uint32_t       mrs;      /* MRs inside it (dev->lock) */
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

/* Phase the entry at index i carries when valid: 1 on the first wrap, so a
 * zeroed ring holds no valid entry. */
static inline uint32_t hca_cq_phase(const hca_cq_t *cq, uint64_t i)
{
    return (uint32_t)((i >> cq->log_size) & 1) ^ 1;
}

/* Nothing to poll: no new CQE and no overflow to report (inline: what an
 * idle poll asks). */
static inline int hca_cq_ring_idle(const hca_cq_t *cq)
{
    const hca_cqe_t *cqe = &cq->ring[cq->cons & cq->mask];

    return (__atomic_load_n(&cqe->owner, __ATOMIC_ACQUIRE) !=
            hca_cq_phase(cq, cq->cons)) && !cq->overflow;
}

/* Producer (engine code of the owner): never overwrites. */
int hca_cq_push(hca_cq_t *cq, const hca_wc_t *wc);
/* Consumer: up to num CQEs, or -EOVERFLOW (then its QPs are in ERR). */
int hca_cq_ring_poll(hca_cq_t *cq, int num, hca_wc_t *wc);
/* Arms (1) or disarms (0) the CQ and its receive rings; -EAGAIN if a
 * ring already holds something. */
int hca_cq_set_armed(hca_cq_t *cq, uint32_t armed);
void hca_cq_overflow_error(hca_cq_t *cq);
int hca_cq_attach_qp(hca_cq_t *cq, struct hca_qp *qp);
void hca_cq_detach_qp(hca_cq_t *cq, struct hca_qp *qp);
int hca_cq_attach_rq(hca_cq_t *cq, struct hca_rq *rq);
void hca_cq_detach_rq(hca_cq_t *cq, struct hca_rq *rq);

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
    uint32_t            msg_flags;  /* of its first fragment (the fabric
                                       that carried it) */
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

/* Unfinished messages one source (process and context, through one
 * fabric) may have on a QP at a time: a quarter of its receive queue's
 * depth, at least 1.  Its QPs' messages each hold a receive, and a source
 * with many QPs (or a forger naming many) must not hold them all.  A new
 * first fragment over the limit ends the source's oldest one. */
HCA_INLINE uint32_t hca_partials_per_source(const hca_rq_t *rq)
{
    uint32_t n = (uint32_t)((rq->mask + 1) / 4);

    return (n > 0) ? n : 1;
}

struct hca_srq {
    hca_rq_t rq;
    int      qps;
};

/* The one walk of an SGE list: copies len bytes between buf and the
 * list, starting at byte `offset` of the list - into the SGEs (to_sge) or
 * out of them.  Stops at the list's end. */
HCA_INLINE void hca_sge_copy(const hca_sge_t *sge, uint32_t num_sge,
                             uint64_t offset, void *buf, uint64_t len,
                             int to_sge)
{
    uint8_t *p = buf;

    for (uint32_t i = 0; (i < num_sge) && (len > 0); ++i) {
        uint8_t *at;
        uint64_t n;
        if (offset >= sge[i].length) {
            offset -= sge[i].length;
            continue;
        }
        n  = sge[i].length - offset;
        n  = (n < len) ? n : len;
        at = (uint8_t*)(uintptr_t)sge[i].addr + offset;
        if (to_sge) {
            memcpy(at, p, n);
        } else {
            memcpy(p, at, n);
        }
        p     += n;
        len   -= n;
        offset = 0;
    }
}

/* Copies into the receive buffer at offset; LOC_LEN_ERR if it does not
 * fit (nothing beyond the buffer is touched). */
static inline hca_wc_status_t hca_rwqe_place(const hca_rwqe_t *rwqe,
                                             uint64_t offset,
                                             const uint8_t *src,
                                             uint64_t len)
{
    if ((offset > rwqe->length) || (len > rwqe->length - offset)) {
        return HCA_WC_LOC_LEN_ERR;
    }
    hca_sge_copy(rwqe->sge, rwqe->num_sge, offset, (void*)(uintptr_t)src,
                 len, 1);
    return HCA_WC_SUCCESS;
}

/* A message taken from a receive ring: one copy of its header (the slot
 * is shared with its sender), and for a SEND_PULL its descriptor. */
typedef struct hca_ingress_msg {
    hca_msg_hdr_t   hdr;
    const uint8_t  *payload;
    hca_pull_hdr_t  pull;
    hca_wire_iov_t  iov[HCA_MAX_SGE];
} hca_ingress_msg_t;

/* Responder (hca_resp.c): the states of a received message, and a
 * handler per message op - the step from ARRIVED to the next state. */
typedef enum {
    HCA_RX_ARRIVED = 0, /* taken from its ring, routed */
    HCA_RX_RNR,         /* no receive posted: it stays in its ring */
    HCA_RX_PARTIAL,     /* a fragment placed, the message goes on */
    HCA_RX_COMPLETE,    /* placed, its receive completed */
    HCA_RX_DROPPED,     /* refused, forged or orphaned: counted */
    HCA_RX_LAST
} hca_rx_state_t;

extern const char *const hca_rx_state_name[HCA_RX_LAST];
typedef hca_rx_state_t (*hca_resp_handler_t)(hca_rq_t *rq, struct hca_qp *qp,
                                             const hca_ingress_msg_t *m);
extern const hca_resp_handler_t hca_resp_handlers[HCA_MSG_OP_LAST];
void hca_resp_refuse(hca_device_t *dev, const hca_ingress_msg_t *m,
                     int qp_gone);
/* Ends partials whose source died or, the ring drained, went quiet (every
 * 100 ms at most). */
void hca_resp_sweep(hca_rq_t *rq, int drained);

/* Ingress router (hca_ingress.c): consumes up to budget messages of the
 * ring, each handed to its responder handler. */
int  hca_ingress_poll(hca_rq_t *rq, int budget);

int  hca_rq_init(hca_rq_t *rq, hca_pd_t *pd, uint32_t depth,
                 uint32_t max_sge, int is_srq);
void hca_rq_cleanup(hca_rq_t *rq);
int  hca_rq_post(hca_rq_t *rq, hca_recv_wr_t *wr, hca_recv_wr_t **bad_wr);

/* 1 if the message at the tail of rq's ring waits for a receive the
 * caller has not posted: it, and every message behind it, cannot complete
 * without the caller (no partial message either, whose timeout would
 * complete something).  Arm may sleep on such a ring. */
static inline int hca_rq_waits_recv(const hca_rq_t *rq)
{
    return HCA_UNLIKELY(rq->rnr_at != 0) && (rq->tail == rq->head) &&
           (rq->n_partials == 0) &&
           (rq->rnr_at == atomic_load_explicit(&rq->ring.hdr->tail,
                                               memory_order_relaxed) + 1);
}


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
    uint64_t          wait_start; /* ns, first poll that found no news */
    uint64_t          full_since; /* ns, first -EAGAIN in a row */
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
};

/* What every fast path requires: nothing queued or waiting for a
 * response (so nothing is overtaken and a fence is satisfied), no
 * sq_sig_all (no CQE owed), and the connection in RTS. */
HCA_INLINE int hca_sq_idle(const hca_qp_t *qp)
{
    return HCA_LIKELY(qp->state == HCA_QPS_RTS) &&
           (qp->sq_exec == qp->sq_head) && (qp->n_issued == 0) &&
           !qp->sq_sig_all;
}

/* Unlinked by the caller: frees a partial of qp. */
static inline void hca_partial_free(hca_qp_t *qp, hca_partial_t *p)
{
    qp->rq->n_partials--;
    free(p);
}

/* Does the QP accept a message from that source (state, and the
 * connected peer unless it accepts any)?  The one target check of the
 * receive side.  The host counts too: pids of another host collide with
 * ours. */
HCA_INLINE int hca_qp_accepts(const hca_qp_t *qp, uint64_t src_host,
                              uint32_t src_pid, uint32_t src_ctx,
                              uint32_t src_qpn)
{
    if ((qp->state != HCA_QPS_RTR) && (qp->state != HCA_QPS_RTS)) {
        return 0;
    }
    return (qp->dest_qpn == HCA_QPN_ANY) ||
           ((qp->dest_qpn == src_qpn) && (qp->dest.pid == src_pid) &&
            (qp->dest.ctx_id == src_ctx) && (qp->dest.host == src_host));
}

int  hca_qp_to_err(hca_qp_t *qp, hca_wc_status_t first);
/* A WQE ends with status (a failure moves the QP to ERR). */
void hca_wqe_done(hca_qp_t *qp, hca_wqe_t *wqe, hca_wc_status_t status);
/* Done WQEs at the tail become CQEs, in post order. */
void hca_qp_report_sq(hca_qp_t *qp);
/* Completes every posted receive of the QP's own RQ as flushed. */
void hca_qp_flush_recv(hca_qp_t *qp);
/* The target ring was full: -EAGAIN, or -ECONNRESET once it stayed full
 * and its owner is gone (the QP is then in ERR). */
int  hca_qp_ring_full(hca_qp_t *qp);
hca_qp_t *hca_qp_lookup(hca_device_t *dev, uint32_t qpn);

/* Engines: requester (hca_req.c) and completer (hca_comp.c) */
extern const char *const hca_wqe_state_name[];
int  hca_req_progress(hca_qp_t *qp);
void hca_comp_poll_responses(hca_qp_t *qp);

/* Progress (hca_progress.c): after the requester ran, put qp on its CQ's
 * busy list if it has issued or queued WQEs (owner thread). */
void hca_progress_mark_busy(hca_qp_t *qp);

/* The requester's counters of an executed WR: kept here only. */
HCA_INLINE void hca_count_tx(hca_qp_t *qp, unsigned opcode, uint64_t bytes)
{
    unsigned f = qp->fabric->type; /* a real fabric: only RTS QPs execute */

    qp->cnt->tx_ops[opcode]++;
    qp->cnt->tx_bytes[opcode] += bytes;
    if (HCA_LIKELY(f < HCA_FABRIC_LAST)) {
        qp->cnt->fabric_tx_ops[f][opcode]++;
        qp->cnt->fabric_tx_bytes[f][opcode] += bytes;
    }
}

/* ---------------------------------------------------------------- target */

/* Does the published QP entry `pub` (ours, or a peer's in its context)
 * take a request for QP qpn from the source (host, pid, ctx, src_qpn)?
 * The one target check of requests: SUCCESS; RETRY_EXC_ERR if that QP no
 * longer exists (it never answers, as on InfiniBand: gone, not refusing);
 * REM_INV_REQ_ERR if it is not in RTR/RTS or accepts another source (the
 * host included: a process of another host may have the peer's pid). */
HCA_INLINE hca_wc_status_t hca_qp_pub_check(const hca_qp_pub_t *pub,
                                            uint32_t qpn, uint64_t src_host,
                                            uint32_t src_pid,
                                            uint32_t src_ctx,
                                            uint32_t src_qpn)
{
    uint32_t state, dq;

    /* qpn first (acquire: it is published last), then what it guards */
    if (HCA_UNLIKELY(atomic_load_explicit(&pub->qpn, memory_order_acquire) !=
                     qpn)) {
        return HCA_WC_RETRY_EXC_ERR;
    }
    state = atomic_load_explicit(&pub->state, memory_order_acquire);
    dq    = atomic_load_explicit(&pub->dest_qpn, memory_order_relaxed);
    if (HCA_UNLIKELY(
            ((state != HCA_QPS_RTR) && (state != HCA_QPS_RTS)) ||
            ((dq != HCA_QPN_ANY) &&
             ((dq != src_qpn) ||
              (atomic_load(&pub->dest_pid) != src_pid) ||
              (atomic_load(&pub->dest_ctx) != src_ctx) ||
              (atomic_load(&pub->dest_host) != src_host))))) {
        return HCA_WC_REM_INV_REQ_ERR;
    }
    return HCA_WC_SUCCESS;
}

/* ---------------------------------------------------------------- MPT */

/* The checks of every access, after it was announced (pinned or busy
 * word): the entry is valid under key rkey, of the PD, grants access, and
 * holds [addr, addr+length) at the alignment.  Fields read once each. */
static inline int hca_mpt_entry_allows(const hca_mpt_entry_t *entry,
                                       uint32_t rkey, uint32_t pd_handle,
                                       unsigned access, uint64_t addr,
                                       uint64_t length, unsigned align)
{
    uint64_t start, len;

    if ((atomic_load(&entry->state) != HCA_MPT_VALID) ||
        (atomic_load(&entry->key) != rkey)) {
        return 0;
    }
    start = entry->addr;
    len   = entry->length;
    return (entry->pd_handle == pd_handle) &&
           ((entry->access & access) == access) && (addr >= start) &&
           (addr - start <= len) && (length <= len - (addr - start)) &&
           ((align <= 1) || ((addr % align) == 0));
}

static inline void hca_mpt_release(hca_mpt_entry_t *entry)
{
    atomic_fetch_sub_explicit(&entry->inflight, 1, memory_order_release);
}

/* Checks and pins an entry of a (local or peer's) MPT: the one lookup of
 * a key.  HCA_WC_SUCCESS (release with hca_mpt_release()), else
 * HCA_WC_REM_ACCESS_ERR. */
static inline hca_wc_status_t hca_mpt_acquire(hca_mpt_entry_t *table,
                                              uint32_t max_mr, uint32_t rkey,
                                              uint32_t pd_handle,
                                              unsigned access, uint64_t addr,
                                              uint64_t length, unsigned align,
                                              hca_mpt_entry_t **entry_p)
{
    uint32_t index = hca_key_index(rkey);
    hca_mpt_entry_t *entry;

    if ((index == 0) || (index >= max_mr)) {
        return HCA_WC_REM_ACCESS_ERR;
    }
    entry = &table[index];
    atomic_fetch_add(&entry->inflight, 1);
    if (!hca_mpt_entry_allows(entry, rkey, pd_handle, access, addr, length,
                              align)) {
        hca_mpt_release(entry);
        return HCA_WC_REM_ACCESS_ERR;
    }
    *entry_p = entry;
    return HCA_WC_SUCCESS;
}
/* Local SGE check against our own MPT (no pinning: the owner of a local
 * buffer must not deregister it while a WR uses it). */
hca_wc_status_t hca_sge_check(hca_device_t *dev, uint32_t pd_handle,
                              const hca_sge_t *sge, int num_sge,
                              unsigned access);

/* ---------------------------------------------------------------- faults */

void hca_fault_init(hca_fault_cfg_t *cfg);
int  hca_fault_hit(hca_fault_cfg_t *cfg, hca_fault_kind_t kind);
/* ring_stall_ms: 1 in the first half of every 2 * ring_stall_ms. */
int  hca_fault_ring_stalled(const hca_fault_cfg_t *cfg);
/* 1 if an injected fault of this kind happens now. */
static inline int hca_fault(hca_device_t *dev, hca_fault_kind_t kind)
{
    return HCA_UNLIKELY(dev->fault.enabled) && hca_fault_hit(&dev->fault, kind);
}


/* ---------------------------------------------------------------- opcodes */

enum {
    HCA_OPF_SEND   = 1u << 0,  /* consumes a receive at the target */
    HCA_OPF_WRITE  = 1u << 1,  /* moves local data to remote memory */
    HCA_OPF_READ   = 1u << 2,  /* moves remote data to local memory */
    HCA_OPF_ATOMIC = 1u << 3,
    HCA_OPF_FETCH  = 1u << 4,  /* atomic returns the old value */
    HCA_OPF_IMM    = 1u << 5   /* carries immediate data */
};

typedef struct hca_opcode_info {
    const char      *name;
    unsigned         flags;        /* HCA_OPF_* */
    unsigned         rem_access;   /* MR and QP right needed at target */
    hca_wc_opcode_t  wc_opcode;
} hca_opcode_info_t;

extern const hca_opcode_info_t hca_opcode[HCA_WR_OPCODE_LAST];

/* ---------------------------------------------------------------- misc */

uint64_t hca_now_ns(void);
void     hca_counters_add(hca_counters_t *to, const hca_counters_t *from);
void     hca_stats_open(hca_device_t *dev);
void     hca_stats_retire(hca_device_t *dev, const hca_counters_t *cnt);
void     hca_stats_close(hca_device_t *dev);
int      hca_notify_bind(hca_device_t *dev, uint32_t idx, int *fd_p);
void     hca_notify_signal(hca_device_t *dev, uint32_t pidns, uint32_t pid,
                           uint32_t ctx, uint32_t nonce, uint32_t idx);

static inline uint32_t hca_roundup_pow2(uint32_t v)
{
    uint32_t p = 1;
    while (p < v) {
        p <<= 1;
    }
    return p;
}

/* ---------------------------------------------------------------- responses */

/* An issued WQE's response slot (qp->resp, one per send WQE; written by
 * whoever answers it, on any fabric): DONE with the status once it bears
 * the WQE's stamp, the fetched value stored for a fetching atomic; else
 * ISSUED. */
HCA_INLINE hca_exec_t hca_resp_slot_poll(hca_qp_t *qp, hca_wqe_t *wqe,
                                         hca_wc_status_t *status_p)
{
    hca_resp_slot_t *resp = &qp->resp[wqe - qp->sq];
    uint32_t status;

    if (atomic_load_explicit(&resp->stamp, memory_order_acquire) !=
        wqe->resp_stamp) {
        return HCA_EXEC_ISSUED;
    }
    status = resp->status;
    if (status >= HCA_WC_STATUS_LAST) {
        status = HCA_WC_REM_OP_ERR;
    }
    if ((status == HCA_WC_SUCCESS) &&
        ((hca_opcode[wqe->opcode].flags & (HCA_OPF_ATOMIC | HCA_OPF_FETCH)) ==
         (HCA_OPF_ATOMIC | HCA_OPF_FETCH))) {
        hca_atomic_store_old((void*)(uintptr_t)wqe->sge[0].addr,
                             (wqe->flags & HCA_SEND_ATOMIC32) ? 4 : 8,
                             resp->value);
    }
    *status_p = (hca_wc_status_t)status;
    return HCA_EXEC_DONE;
}

/* 1 if the issued WQE's response is in its slot (no side effect: what a
 * fabric's response_ready answers, for arming a CQ). */
HCA_INLINE int hca_resp_slot_ready(const hca_qp_t *qp, const hca_wqe_t *wqe)
{
    return atomic_load_explicit(&qp->resp[wqe - qp->sq].stamp,
                                memory_order_acquire) == wqe->resp_stamp;
}

/* A new stamp for an issued WQE's response (never 0: a fresh slot). */
static inline uint32_t hca_qp_next_stamp(hca_qp_t *qp)
{
    if (++qp->stamp_seq == 0) {
        ++qp->stamp_seq;
    }
    return qp->stamp_seq;
}

#endif
