/*
 * hca_tcp_rel.c - the tcp fabric's reliability, both sides of an RC QP
 * (docs/TCP-WIRE.md, "Sequence, duplicates, replay"):
 *
 *   requester (the QP's owner, under tx_lock): every request frame takes
 *   the next PSN of its QP; each WQE sent is recorded (hca_tcp_sent_t)
 *   until its answer came, so that its frames can be built again from the
 *   WQE alone; what the thread asks for (a connection resumed on a new
 *   socket, a PSN_SEQ NAK, a READ or atomic whose answer was lost) is sent
 *   again from that PSN, before any new frame: go-back-N (the sending is
 *   hca_tcp_exec.c's).
 *
 *   answers (the thread, under tcp->lock): an answer for psn p says every
 *   frame before p was executed, so it completes the plain WQEs before it
 *   too (a WRITE's or SEND's ACK lost is implied by a later one); a READ
 *   or an atomic passed that way lost its data or value: it is sent again.
 *
 *   responder (the thread, under rx_lock and tcp->lock): per requester
 *   QP a record (hca_tcp_rqp_t) with the PSN it expects.  A frame at it is
 *   executed and the PSN moves on; one before it is a duplicate: a WRITE
 *   or SEND is acknowledged and not placed again, a READ is answered again
 *   from the region as it is now, an atomic gets the value it had, from
 *   the replay table (as InfiniBand's responder resources); one after it
 *   is NAKed once (PSN_SEQ) and dropped.
 *
 * Over a live TCP stream nothing is lost or repeated: these rules act on
 * a reconnect and under injected faults, and cost a compare and a store
 * per frame otherwise.
 */
#include "hca_tcp_fabric.h"
#include "hca_mpt.h"
#include "hca_log.h"
#include "hca_queue.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ requester */

/* The payload of each frame of the WQE (0: one frame, no payload). */
static uint32_t hca_tcp_seg_of(const hca_wqe_t *wqe)
{
    switch ((hca_wr_opcode_t)wqe->opcode) {
    case HCA_WR_SEND:
    case HCA_WR_SEND_WITH_IMM:
        return HCA_TCP_SEND_MAX;
    case HCA_WR_RDMA_WRITE:
    case HCA_WR_RDMA_WRITE_WITH_IMM:
        return HCA_TCP_SEG_MAX;
    default:
        return 0; /* READ, atomics */
    }
}

static uint32_t hca_tcp_nframes(const hca_wqe_t *wqe)
{
    uint32_t seg = hca_tcp_seg_of(wqe);

    if ((seg == 0) || (wqe->length == 0)) {
        return 1;
    }
    return (uint32_t)((wqe->length + seg - 1) / seg);
}

int hca_tcp_sent_push(hca_qp_t *qp, hca_wqe_t *wqe)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    uint64_t head    = atomic_load_explicit(&tq->sent_head,
                                            memory_order_relaxed);
    hca_tcp_sent_t *e;
    uint8_t kind;

    if (wqe->opcode == HCA_WR_RDMA_READ) {
        kind = HCA_TCP_SENT_READ;
    } else if (hca_tcp_seg_of(wqe) == 0) {
        kind = HCA_TCP_SENT_ATOMIC;
        /* the responder keeps the last HCA_TCP_RD_ATOM atomics' values:
         * one that may still be sent again must be among them */
        if (atomic_load_explicit(&tq->atomics_out, memory_order_acquire) >=
            HCA_TCP_RD_ATOM) {
            return -EAGAIN;
        }
    } else {
        kind = HCA_TCP_SENT_PLAIN;
    }
    if (head - atomic_load_explicit(&tq->sent_tail, memory_order_acquire) >
        tq->sent_mask) {
        return -EAGAIN; /* cannot be: one entry per WQE not completed */
    }
    e           = &tq->sent[head & tq->sent_mask];
    e->psn      = tq->next_psn;
    e->npsn     = hca_tcp_nframes(wqe);
    e->sq_idx   = (uint32_t)(wqe - qp->sq);
    e->stamp    = wqe->resp_stamp;
    e->read_off  = 0;
    e->read_gap  = 0;
    e->read_done = 0;
    memset(e->read_got, 0, sizeof(e->read_got));
    e->kind     = kind;
    e->striped  = 0;
    if (kind == HCA_TCP_SENT_ATOMIC) {
        atomic_fetch_add(&tq->atomics_out, 1);
    }
    atomic_store_explicit(&tq->sent_head, head + 1, memory_order_release);
    return 0;
}

hca_tcp_sent_t *hca_tcp_sent_last(hca_qp_t *qp)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);

    return &tq->sent[(atomic_load_explicit(&tq->sent_head,
                                           memory_order_relaxed) - 1) &
                     tq->sent_mask];
}

void hca_tcp_frame_build(hca_qp_t *qp, const hca_wqe_t *wqe,
                         const hca_tcp_sent_t *e, uint32_t k,
                         hca_tcp_hdr_t *hdr, struct iovec *iov, int *iovcnt)
{
    uint32_t seg    = hca_tcp_seg_of(wqe);
    uint64_t offset = (uint64_t)k * seg;
    uint64_t left   = wqe->length - offset;
    uint32_t n      = 0;

    memset(hdr, 0, sizeof(*hdr));
    hdr->version    = HCA_TCP_VERSION;
    hdr->src_qpn    = qp->qpn;
    hdr->dst_qpn    = qp->dest_qpn;
    hdr->psn        = e->psn + k;
    hdr->resp_idx   = e->sq_idx;
    hdr->resp_stamp = e->stamp;
    hdr->rkey       = wqe->rkey;
    hdr->imm        = wqe->imm;
    hdr->offset     = (uint32_t)offset;
    hdr->total      = (uint32_t)wqe->length;

    switch ((hca_wr_opcode_t)wqe->opcode) {
    case HCA_WR_SEND:
    case HCA_WR_SEND_WITH_IMM:
        n = (uint32_t)((left < seg) ? left : seg);
        hdr->opcode = HCA_TCP_OP_SEND;
        hdr->flags  = ((offset == 0) ? HCA_TCP_F_FIRST : 0) |
                      ((n == left) ? HCA_TCP_F_LAST : 0) |
                      ((wqe->opcode == HCA_WR_SEND_WITH_IMM) ?
                       HCA_TCP_F_IMM : 0);
        hdr->rkey   = 0;
        break;
    case HCA_WR_RDMA_WRITE:
    case HCA_WR_RDMA_WRITE_WITH_IMM:
        n = (uint32_t)((left < seg) ? left : seg);
        hdr->opcode      = HCA_TCP_OP_WRITE;
        hdr->remote_addr = wqe->remote_addr + offset;
        hdr->flags       = ((n == left) ? HCA_TCP_F_LAST : 0) |
                           (e->striped ? HCA_TCP_F_STRIPED : 0);
        if ((n == left) && (wqe->opcode == HCA_WR_RDMA_WRITE_WITH_IMM)) {
            hdr->flags |= HCA_TCP_F_IMM;
        }
        break;
    case HCA_WR_RDMA_READ:
        hdr->opcode      = HCA_TCP_OP_READ;
        hdr->flags       = e->striped ? HCA_TCP_F_STRIPED : 0;
        hdr->remote_addr = wqe->remote_addr;
        /* sent again after its answer came in part: the rest only (the
         * parts before read_off landed in order), as an IB requester
         * retries a READ from its first missing response packet */
        hdr->offset      = e->read_off;
        break;
    default: /* atomics: hca_post checked the opcode */
        hdr->opcode      = HCA_TCP_OP_ATOMIC;
        hdr->atomic_op   = wqe->opcode;
        hdr->flags       = (wqe->flags & HCA_SEND_ATOMIC32) ?
                           HCA_TCP_F_ATOMIC32 : 0;
        hdr->remote_addr = wqe->remote_addr;
        hdr->operand     = wqe->compare_add;
        hdr->swap        = wqe->swap;
        hdr->offset      = 0;
        hdr->total       = 0;
        break;
    }
    if (hdr->psn == hca_tcp_qp(qp)->start_psn) {
        hdr->flags |= HCA_TCP_F_START; /* the responder starts afresh */
    }
    hdr->length = n;
    *iovcnt     = (n > 0) ? hca_tcp_sge_iov(wqe, offset, n, iov) : 0;
}

hca_tcp_sent_t *hca_tcp_sent_find(hca_qp_t *qp, uint32_t psn)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    uint64_t head    = atomic_load_explicit(&tq->sent_head,
                                            memory_order_acquire);

    for (uint64_t t = atomic_load_explicit(&tq->sent_tail,
                                           memory_order_acquire);
         t != head; ++t) {
        hca_tcp_sent_t *e = &tq->sent[t & tq->sent_mask];
        int32_t d         = hca_tcp_psn_diff(psn, e->psn);
        if (d < 0) {
            return NULL;
        }
        if ((uint32_t)d < e->npsn) {
            return e;
        }
    }
    return NULL;
}

/* The rewind the thread asked for, taken by the owner: rtx_psn moves back
 * to it if it lies in what was sent and is not answered. */
void hca_tcp_rewind_take(hca_qp_t *qp)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    uint64_t r       = atomic_exchange(&tq->rewind, 0);
    uint64_t tail, head;
    uint32_t psn, una;

    if (r == 0) {
        return;
    }
    tail = atomic_load_explicit(&tq->sent_tail, memory_order_acquire);
    head = atomic_load_explicit(&tq->sent_head, memory_order_relaxed);
    if (tail == head) {
        return; /* everything was answered meanwhile */
    }
    psn = (uint32_t)r;
    una = tq->sent[tail & tq->sent_mask].psn;
    if (hca_tcp_psn_diff(psn, una) < 0) {
        psn = una;
    }
    if ((hca_tcp_psn_diff(psn, tq->next_psn) < 0) &&
        ((tq->rtx_psn == tq->next_psn) ||
         (hca_tcp_psn_diff(psn, tq->rtx_psn) < 0))) {
        tq->rtx_psn = psn;
    }
}

int hca_tcp_rtx_wanted(hca_tcp_dev_t *tcp, hca_qp_t *qp)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    uint64_t now;

    if (atomic_load_explicit(&tq->rewind, memory_order_relaxed) ||
        (tq->rtx_psn != tq->next_psn)) {
        return 1;
    }
    if (HCA_LIKELY(!tcp->dev->fault.enabled) ||
        (tcp->dev->fault.prob[HCA_FAULT_TCP_LOSS] == 0) ||
        (atomic_load_explicit(&tq->sent_head, memory_order_relaxed) ==
         atomic_load_explicit(&tq->sent_tail, memory_order_relaxed))) {
        return 0;
    }
    /* injected loss: a frame or its answer may be gone with no later
     * frame to show the gap; a live stream needs no such timer */
    now = hca_now_ns();
    if ((now - atomic_load(&tq->answered_ns) < HCA_TCP_RTO_NS) ||
        (now - tq->rto_ns < HCA_TCP_RTO_NS)) {
        return 0;
    }
    tq->rto_ns = now;
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_RTOS, 1);
    /* from the first frame not answered (we are the owner) */
    tq->rtx_psn = tq->sent[atomic_load_explicit(&tq->sent_tail,
                                                memory_order_acquire) &
                           tq->sent_mask].psn;
    return 1;
}

void hca_tcp_rewind(hca_tcp_dev_t *tcp, hca_qp_t *qp, uint32_t psn)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    uint64_t want    = (1ull << 32) | psn;
    uint64_t cur     = atomic_load(&tq->rewind);
    hca_device_t *dev = tcp->dev;
    uint32_t cq_idx   = qp->pub->send_cq_idx;

    /* the earliest asked for wins */
    while (((cur == 0) || (hca_tcp_psn_diff(psn, (uint32_t)cur) < 0)) &&
           !atomic_compare_exchange_weak(&tq->rewind, &cur, want)) {
    }
    /* its owner may sleep on its send CQ */
    if (cq_idx < HCA_MAX_CQ) {
        hca_cq_wake_armed(dev, &dev->notify[cq_idx], &dev->notify_self,
                          cq_idx);
    }
}

void hca_tcp_rewind_conn(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    hca_device_t *dev = tcp->dev;

    if (conn->qp_refs == 0) {
        return; /* no QP's path, nor one a striped WRITE took (inbound) */
    }
    for (uint32_t i = 1; i < HCA_MAX_QP; ++i) {
        hca_qp_t *qp = __atomic_load_n(&dev->qps[i], __ATOMIC_ACQUIRE);
        hca_tcp_qp_t *tq;
        uint64_t tail, head;

        if ((qp == NULL) || (qp->fabric->type != HCA_FABRIC_TCP) ||
            (qp->state != HCA_QPS_RTS)) {
            continue;
        }
        tq = hca_tcp_qp(qp);
        if (((tq->conn != conn) && !hca_tcp_stripe_uses(tq, conn)) ||
            (tq->sent == NULL)) {
            continue; /* neither its path nor one its striped WRITE took */
        }
        tail = atomic_load_explicit(&tq->sent_tail, memory_order_acquire);
        head = atomic_load_explicit(&tq->sent_head, memory_order_acquire);
        if (tail == head) {
            continue;
        }
        hca_tcp_rewind(tcp, qp, tq->sent[tail & tq->sent_mask].psn);
    }
}

void hca_tcp_sent_clear(hca_qp_t *qp)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);

    atomic_store(&tq->sent_tail, atomic_load(&tq->sent_head));
    atomic_store(&tq->rewind, 0);
    atomic_store(&tq->atomics_out, 0);
    atomic_store(&tq->stripe_open, 0);
    tq->striping = 0;
    tq->rtx_psn  = tq->next_psn;
}

/* The WQE of an entry gets its answer (the thread), then the entry goes. */
static void hca_tcp_sent_resolve(hca_tcp_dev_t *tcp, hca_qp_t *qp,
                                 hca_tcp_sent_t *e, hca_wc_status_t status,
                                 uint64_t value)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    hca_wqe_t *wqe   = &qp->sq[e->sq_idx];
    hca_device_t *dev = tcp->dev;
    uint32_t cq_idx   = qp->pub->send_cq_idx;

    if ((wqe->resp_stamp == e->stamp) &&
        (__atomic_load_n(&wqe->state, __ATOMIC_ACQUIRE) != HCA_WQE_DONE)) {
        hca_resp_slot_fill(&qp->resp[e->sq_idx], e->stamp, status, value);
        if (cq_idx < HCA_MAX_CQ) {
            hca_cq_wake_armed(dev, &dev->notify[cq_idx], &dev->notify_self,
                              cq_idx);
        }
    }
    if (e->kind == HCA_TCP_SENT_ATOMIC) {
        atomic_fetch_sub(&tq->atomics_out, 1);
    }
    atomic_fetch_add_explicit(&tq->sent_tail, 1, memory_order_release);
}

void hca_tcp_acked(hca_tcp_dev_t *tcp, hca_qp_t *qp, const hca_tcp_hdr_t *hdr)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    uint64_t head    = atomic_load_explicit(&tq->sent_head,
                                            memory_order_acquire);
    uint32_t p       = hdr->psn;
    int seq          = (hdr->opcode == HCA_TCP_OP_ACK) &&
                       (hdr->syndrome == HCA_TCP_SYN_PSN_SEQ);

    atomic_store_explicit(&tq->answered_ns, hca_coarse_ns(),
                          memory_order_relaxed);
    while (atomic_load_explicit(&tq->sent_tail, memory_order_relaxed) !=
           head) {
        uint64_t tail     = atomic_load_explicit(&tq->sent_tail,
                                                 memory_order_relaxed);
        hca_tcp_sent_t *e = &tq->sent[tail & tq->sent_mask];
        int32_t d         = hca_tcp_psn_diff(p, e->psn);

        if (d < 0) {
            return; /* an answer to what was answered already */
        }
        if ((uint32_t)d >= e->npsn) {
            /* executed before p: a plain WQE is done; a READ's data or
             * an atomic's value did not come, it goes again.  Except a
             * READ whose answer is in already (it passed a striped one),
             * and a striped READ's answer: its parts on the other path
             * may come after this (only READs follow a striped READ, and
             * their answers wait in their records: hca_tcp_stripe.c) */
            if ((e->kind == HCA_TCP_SENT_READ) && e->read_done) {
                hca_tcp_sent_resolve(tcp, qp, e, HCA_WC_SUCCESS, 0);
                continue;
            }
            if ((e->kind == HCA_TCP_SENT_READ) && e->striped) {
                return;
            }
            if (e->kind != HCA_TCP_SENT_PLAIN) {
                hca_tcp_rewind(tcp, qp, e->psn); /* a READ: from read_off */
                return;
            }
            hca_tcp_sent_resolve(tcp, qp, e, HCA_WC_SUCCESS, 0);
            continue;
        }
        /* p is one of e's frames */
        if (seq) {
            if (HCA_UNLIKELY(qp->dev->trace)) {
                hca_log("tcp fabric: qp 0x%x: PSN_SEQ NAK, send again from "
                        "psn %u (first unanswered %u, next %u)", qp->qpn, p,
                        e->psn, tq->next_psn);
            }
            hca_tcp_rewind(tcp, qp, p); /* from the frame expected */
        } else if (hdr->opcode == HCA_TCP_OP_READ_RESP) {
            if (e->kind == HCA_TCP_SENT_READ) {
                hca_tcp_sent_resolve(tcp, qp, e, HCA_WC_SUCCESS, 0);
                /* READs after it whose answers came first */
                while (atomic_load_explicit(&tq->sent_tail,
                                            memory_order_relaxed) != head) {
                    hca_tcp_sent_t *n = &tq->sent[atomic_load_explicit(
                            &tq->sent_tail, memory_order_relaxed) &
                                                  tq->sent_mask];
                    if ((n->kind != HCA_TCP_SENT_READ) || !n->read_done) {
                        break;
                    }
                    hca_tcp_sent_resolve(tcp, qp, n, HCA_WC_SUCCESS, 0);
                }
            }
        } else if (hdr->syndrome != HCA_WC_SUCCESS) {
            hca_tcp_sent_resolve(tcp, qp, e, (hca_wc_status_t)hdr->syndrome,
                                 0);
        } else if (e->kind == HCA_TCP_SENT_ATOMIC) {
            hca_tcp_sent_resolve(tcp, qp, e, HCA_WC_SUCCESS, hdr->operand);
        } else if ((e->kind == HCA_TCP_SENT_PLAIN) &&
                   ((uint32_t)d == e->npsn - 1)) {
            hca_tcp_sent_resolve(tcp, qp, e, HCA_WC_SUCCESS, 0);
        }
        return;
    }
}

/* ================================================================ responder */

/* The records a connection uses: its lead's (shared by every path to the
 * peer context). */
static hca_tcp_conn_t *hca_tcp_rq_table(hca_tcp_conn_t *conn)
{
    return (conn->rq_lead != NULL) ? conn->rq_lead : conn;
}

/* The records' hash: by the requester QPN's index, so that a QPN of
 * another generation of the same index finds its predecessor's record
 * (hca_tcp_rqp_new). */
static inline uint32_t hca_tcp_rqp_bucket(uint32_t qpn)
{
    return HCA_QPN_INDEX(qpn) % HCA_TCP_RQP_BUCKETS;
}

static hca_tcp_rqp_t *hca_tcp_rqp_find(hca_tcp_conn_t *conn, uint32_t qpn)
{
    hca_tcp_rqp_t *r = conn->rx.rqp;

    if ((r != NULL) && (r->src_qpn == qpn)) {
        return r; /* the one before: one compare per frame */
    }
    for (r = hca_tcp_rq_table(conn)->rqps[hca_tcp_rqp_bucket(qpn)];
         r != NULL; r = r->next) {
        if (r->src_qpn == qpn) {
            return r;
        }
    }
    return NULL;
}

/* The frame expected is being executed by another path's reader (r->busy:
 * its header was read, its payload is coming), and a copy of it came on
 * this one: the QP failed over, and sent again what was unanswered.  Only
 * one may execute it, and nothing of the old one may land after the
 * frames that follow it.  If the other reader is not running (its lock
 * can be had) and its frame is still in progress, the frame is taken from
 * it: the rest of its payload is read and dropped there (what it wrote is
 * a prefix of the same bytes, written again here).  A parked SEND stays
 * its own (it is placed when its ring has room: this copy is then a
 * duplicate).  1: this path executes it. */
static int hca_tcp_rqp_take(hca_tcp_rqp_t *r)
{
    hca_tcp_conn_t *other = r->busy;
    int taken = 1;

    if (pthread_mutex_trylock(&other->rx_lock) != 0) {
        return 0; /* reading now: its frame ends soon, or the copy again */
    }
    if ((other->rx_frames == r->busy_frame) &&
        (other->rx.rqp == r) && !other->rx.dup) {
        if (other->rx.state == HCA_TCP_RX_PAYLOAD) {
            if (other->rx.pinned != NULL) {
                hca_mpt_release(other->rx.pinned);
                other->rx.pinned = NULL;
            }
            other->rx.dup = 1;
            hca_tcp_rx_to(other, HCA_TCP_RX_DISCARD);
        } else if (other->rx.state == HCA_TCP_RX_PARKED) {
            taken = 0;
        }
    }
    pthread_mutex_unlock(&other->rx_lock);
    if (taken) {
        r->busy = NULL;
    }
    return taken;
}

static void hca_tcp_rqp_start(hca_tcp_rqp_t *r, const hca_tcp_hdr_t *hdr)
{
    uint32_t psn = hdr->psn;

    r->dst_qpn   = hdr->dst_qpn;
    r->start_psn = psn;
    r->epsn      = psn;
    r->nak_sent  = 0;
    r->err       = 0;
    r->atom_next = 0;
    r->stripe_on = 0;
    r->last_held = 0;
    memset(r->atom, 0, sizeof(r->atom));
}

/* A striped WRITE's part ahead of epsn, in the WRITE epsn is in (its
 * first PSN at or before epsn): it may land now, as the parts before it
 * come on the other path.  Anything else ahead is a gap. */
static int hca_tcp_stripe_ahead(hca_tcp_rqp_t *r, const hca_tcp_hdr_t *hdr)
{
    uint32_t k  = hdr->offset / HCA_TCP_SEG_MAX; /* exact: hdr_check */
    uint32_t p0 = hdr->psn - k;

    if (!(hdr->flags & HCA_TCP_F_STRIPED) ||
        (hdr->opcode != HCA_TCP_OP_WRITE) || (k >= HCA_TCP_STRIPE_PARTS) ||
        (hca_tcp_psn_diff(p0, r->epsn) > 0)) {
        return 0;
    }
    if (!r->stripe_on || (r->stripe_psn != p0)) {
        /* a new striped WRITE: what the last one held is behind epsn */
        memset(r->ahead, 0, sizeof(r->ahead));
        r->stripe_psn = p0;
        r->stripe_on  = 1;
        r->last_held  = 0;
    }
    return 1;
}

static int hca_tcp_stripe_landed(const hca_tcp_rqp_t *r, uint32_t psn)
{
    uint32_t k = psn - r->stripe_psn;

    return r->stripe_on && (k < HCA_TCP_STRIPE_PARTS) &&
           ((r->ahead[k / 64] >> (k % 64)) & 1);
}

int hca_tcp_psn_landed(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr,
                       hca_tcp_hdr_t *ack)
{
    hca_tcp_rqp_t *r = conn->rx.rqp;
    int last         = (hdr->flags & HCA_TCP_F_LAST) != 0;
    int32_t d;

    if ((r == NULL) || conn->rx.dup || (r->src_qpn != hdr->src_qpn)) {
        if (last) {
            *ack = *hdr; /* as an unstriped LAST: answered */
        }
        return last;
    }
    d = hca_tcp_psn_diff(hdr->psn, r->epsn);
    if (d > 0) {
        uint32_t k = hdr->psn - r->stripe_psn;
        if (r->stripe_on && (k < HCA_TCP_STRIPE_PARTS)) {
            r->ahead[k / 64] |= 1ull << (k % 64);
            if (last) {
                r->last_hdr  = *hdr; /* answered when epsn passes it */
                r->last_held = 1;
            }
        }
        return 0;
    }
    if (d < 0) {
        return 0; /* a copy on another path executed it meanwhile, and
                     answered it */
    }
    r->epsn++;
    r->busy = NULL;
    while (hca_tcp_stripe_landed(r, r->epsn)) {
        r->epsn++;
    }
    if (last) {
        *ack = *hdr;
        return 1;
    }
    if (r->last_held && (hca_tcp_psn_diff(r->epsn, r->last_hdr.psn) > 0)) {
        r->last_held = 0;
        *ack         = r->last_hdr;
        return 1;
    }
    return 0;
}

/* How many records the peer context whose records lead holds may have:
 * as many as there are of its QPs that may address ours - one per QP of
 * ours connected to it (that QP's one source), HCA_TCP_RQP_ANY per QP of
 * ours that accepts any source (UCX's iface: an endpoint of each of the
 * peer's workers, per lane, addresses it); our QPs in RTR or RTS, and
 * HCA_MAX_QP at most (a peer has no more).  Memory in proportion to what
 * exists here, not to the QPN space.  (tcp->lock held; a look at our QPs'
 * public entries, up to the highest index used: only when a record is
 * about to pass the limit computed last.) */
static uint32_t hca_tcp_rqp_limit(const hca_tcp_dev_t *tcp,
                                  const hca_tcp_conn_t *lead)
{
    hca_device_t *dev = tcp->dev;
    uint32_t hwm      = atomic_load_explicit(&dev->hdr->qp_hwm,
                                             memory_order_relaxed);
    uint32_t n        = 0;

    for (uint32_t i = 1; (i <= hwm) && (i < HCA_MAX_QP) && (n < HCA_MAX_QP);
         ++i) {
        const hca_qp_pub_t *pub = &dev->qp_pub[i];
        uint32_t state = atomic_load_explicit(&pub->state,
                                              memory_order_relaxed);
        uint32_t dq;
        if ((state != HCA_QPS_RTR) && (state != HCA_QPS_RTS)) {
            continue;
        }
        dq = atomic_load_explicit(&pub->dest_qpn, memory_order_relaxed);
        if (dq == HCA_QPN_ANY) {
            n += HCA_TCP_RQP_ANY;
        } else if ((atomic_load(&pub->dest_host) == lead->peer.host) &&
                   (atomic_load(&pub->dest_pid) == lead->peer.pid) &&
                   (atomic_load(&pub->dest_ctx) == lead->peer.ctx_id)) {
            n += 1;
        }
    }
    return (n < HCA_MAX_QP) ? n : HCA_MAX_QP;
}

/* The record is freed (tcp->lock held): no connection of the peer context
 * keeps it as the one it checked last. */
static void hca_tcp_rqp_free(hca_tcp_dev_t *tcp, hca_tcp_conn_t *lead,
                             hca_tcp_rqp_t *r)
{
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        if (c->rx.rqp == r) {
            c->rx.rqp = NULL;
        }
    }
    lead->n_rqps--;
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_RECORDS, -1);
    free(r);
}

/* The records of sources that can no longer address us are freed: the QP
 * of ours each one's frames went to is gone, or no longer accepts that
 * source (reset, connected again to another).  Any later frame of theirs
 * is refused by the target check before it needs a record (tcp->lock
 * held; at most once per HCA_TCP_RQP_SWEEP_NS, as a flood at the limit
 * would make it run for each of its frames). */
static void hca_tcp_rqps_sweep(hca_tcp_dev_t *tcp, hca_tcp_conn_t *lead)
{
    hca_device_t *dev = tcp->dev;
    uint64_t now      = hca_coarse_ns();

    if (now - lead->rqp_swept_ns < HCA_TCP_RQP_SWEEP_NS) {
        return;
    }
    lead->rqp_swept_ns = now;
    for (int b = 0; b < HCA_TCP_RQP_BUCKETS; ++b) {
        for (hca_tcp_rqp_t **pp = &lead->rqps[b]; *pp != NULL;) {
            hca_tcp_rqp_t *r = *pp;
            uint32_t idx     = HCA_QPN_INDEX(r->dst_qpn);
            if ((idx != 0) && (idx < HCA_MAX_QP) &&
                (hca_qp_pub_check(&dev->qp_pub[idx], r->dst_qpn,
                                  lead->peer.host, lead->peer.pid,
                                  lead->peer.ctx_id, r->src_qpn) ==
                 HCA_WC_SUCCESS)) {
                pp = &r->next;
                continue;
            }
            *pp = r->next;
            hca_tcp_rqp_free(tcp, lead, r);
        }
    }
}

/* A record for the frame's requester QP, whose first frame it is (its
 * target accepted it; tcp->lock held): NULL if the peer context holds as
 * many as it may (hca_tcp_rqp_limit).  A record of the same QP index, of
 * another generation, becomes this one's: a context has one QP per index,
 * so its owner is gone (a peer that makes and destroys QPs for good keeps
 * as many records as it has QPs at once).  A frame of the old QP still
 * being read on another path is taken from it as any copy on a failover
 * is (busy, hca_tcp_rqp_take). */
static hca_tcp_rqp_t *hca_tcp_rqp_new(hca_tcp_dev_t *tcp,
                                      hca_tcp_conn_t *conn,
                                      const hca_tcp_hdr_t *hdr)
{
    hca_tcp_conn_t *lead = hca_tcp_rq_table(conn);
    uint32_t b           = hca_tcp_rqp_bucket(hdr->src_qpn);
    hca_tcp_rqp_t *r;

    for (r = lead->rqps[b]; r != NULL; r = r->next) {
        if (HCA_QPN_INDEX(r->src_qpn) == HCA_QPN_INDEX(hdr->src_qpn)) {
            /* the old QP's later frames on another path find no record:
             * dropped (src_qpn is no longer theirs) */
            r->src_qpn = hdr->src_qpn;
            hca_tcp_rqp_start(r, hdr);
            return r;
        }
    }
    if (lead->n_rqps >= lead->rqp_limit) {
        /* the limit again, our QPs as they are now; the records of
         * sources that cannot address us any more go */
        lead->rqp_limit = hca_tcp_rqp_limit(tcp, lead);
        if (lead->n_rqps >= lead->rqp_limit) {
            hca_tcp_rqps_sweep(tcp, lead);
        }
        if (lead->n_rqps >= lead->rqp_limit) {
            hca_tcp_refusal(tcp, "pid %u ctx %u: no room for the record of "
                            "its QP 0x%x (%u records for the %u of its QPs "
                            "that may address ours): refused",
                            lead->peer.pid, lead->peer.ctx_id, hdr->src_qpn,
                            lead->n_rqps, lead->rqp_limit);
            return NULL;
        }
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return NULL;
    }
    r->src_qpn    = hdr->src_qpn;
    r->next       = lead->rqps[b];
    lead->rqps[b] = r;
    lead->n_rqps++;
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_RECORDS, 1);
    hca_tcp_rqp_start(r, hdr);
    return r;
}

hca_tcp_psn_verdict_t hca_tcp_psn_first(hca_tcp_dev_t *tcp,
                                        hca_tcp_conn_t *conn,
                                        const hca_tcp_hdr_t *hdr)
{
    if (!(hdr->flags & HCA_TCP_F_START)) {
        /* not its first frame, so an earlier one was lost (injected
         * loss): dropped, and its requester sends again from its start,
         * which carries F_START */
        if ((hdr->flags & HCA_TCP_F_STRIPED) && (hdr->offset == 0) &&
            (hdr->opcode == HCA_TCP_OP_WRITE)) {
            /* a striped WRITE whose first part came on a path that does
             * not share its QP's record (the paths' records are joined by
             * proven identity): it is asked again, whole, on the QP's own
             * path */
            return HCA_TCP_PSN_UNKNOWN;
        }
        return HCA_TCP_PSN_DROP;
    }
    if (hca_tcp_rqp_new(tcp, conn, hdr) == NULL) {
        return HCA_TCP_PSN_FULL;
    }
    return hca_tcp_psn_check(tcp, conn, hdr);
}

hca_tcp_psn_verdict_t hca_tcp_psn_check(hca_tcp_dev_t *tcp,
                                        hca_tcp_conn_t *conn,
                                        const hca_tcp_hdr_t *hdr)
{
    hca_tcp_rqp_t *r = hca_tcp_rqp_find(conn, hdr->src_qpn);
    int32_t d;

    conn->rx.dup = 0;
    if (r == NULL) {
        /* its target is checked before a record is made for it
         * (hca_tcp_psn_first) */
        conn->rx.rqp = NULL;
        return HCA_TCP_PSN_NO_RECORD;
    }
    if ((hdr->flags & HCA_TCP_F_START) && (hdr->psn != r->start_psn)) {
        /* the requester QP was connected again (a new incarnation of the
         * QPN): it starts afresh, an earlier refusal forgotten, as on IB */
        hca_tcp_rqp_start(r, hdr);
    }
    conn->rx.rqp = r;
    if (r->err) {
        d = hca_tcp_psn_diff(hdr->psn, r->err_psn);
        if (d >= 0) {
            return HCA_TCP_PSN_DROP; /* the refused one again (its NAK is
                                        sent again by the caller), or a
                                        later one: nothing after an error
                                        touches memory */
        }
    }
    d = hca_tcp_psn_diff(hdr->psn, r->epsn);
    if (HCA_LIKELY(d == 0)) {
        if (HCA_UNLIKELY((r->busy != NULL) && (r->busy != conn)) &&
            !hca_tcp_rqp_take(r)) {
            r->nak_sent = 1; /* the frames behind it: dropped, not NAKed */
            return HCA_TCP_PSN_BUSY;
        }
        r->nak_sent   = 0;
        r->busy       = conn;
        r->busy_frame = conn->rx_frames;
        return HCA_TCP_PSN_NEW;
    }
    if (d < 0) {
        conn->rx.dup = 1;
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_DUP_REQUESTS, 1);
        return HCA_TCP_PSN_DUP;
    }
    if (hca_tcp_stripe_ahead(r, hdr)) {
        if (hca_tcp_stripe_landed(r, hdr->psn)) {
            /* landed before: dropped, not answered (its LAST is answered
             * once, when epsn passes it) */
            HCA_TCP_COUNT(tcp, HCA_TCP_CNT_DUP_REQUESTS, 1);
            return HCA_TCP_PSN_DROP;
        }
        return HCA_TCP_PSN_NEW; /* placed now; epsn passes it later */
    }
    if (!r->nak_sent) {
        r->nak_sent = 1; /* one NAK per gap, as rxe's sent_psn_nak */
        return HCA_TCP_PSN_GAP;
    }
    return HCA_TCP_PSN_DROP;
}

void hca_tcp_psn_done(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr)
{
    hca_tcp_rqp_t *r = conn->rx.rqp;

    if ((r != NULL) && !conn->rx.dup && (r->src_qpn == hdr->src_qpn) &&
        (r->epsn == hdr->psn)) {
        r->epsn++;
        r->busy = NULL;
    }
}

void hca_tcp_psn_refused(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr,
                         hca_wc_status_t status)
{
    hca_tcp_rqp_t *r = conn->rx.rqp;

    if ((r != NULL) && (r->src_qpn == hdr->src_qpn) && !r->err) {
        r->busy       = NULL;
        r->err        = 1;
        r->err_psn    = hdr->psn;
        r->err_status = (uint8_t)status;
    }
}

int hca_tcp_psn_refusal(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr,
                        hca_wc_status_t *status_p)
{
    hca_tcp_rqp_t *r = conn->rx.rqp;

    if ((r == NULL) || !r->err || (r->err_psn != hdr->psn)) {
        return 0;
    }
    *status_p = (hca_wc_status_t)r->err_status;
    return 1;
}

void hca_tcp_atom_save(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr,
                       hca_wc_status_t status, uint64_t value)
{
    hca_tcp_rqp_t *r = conn->rx.rqp;
    hca_tcp_atom_t *a;

    if ((r == NULL) || (r->src_qpn != hdr->src_qpn)) {
        return;
    }
    a         = &r->atom[r->atom_next++ % HCA_TCP_RD_ATOM];
    a->psn    = hdr->psn;
    a->status = (uint8_t)status;
    a->value  = value;
    a->valid  = 1;
}

const hca_tcp_atom_t *hca_tcp_atom_find(hca_tcp_conn_t *conn,
                                        const hca_tcp_hdr_t *hdr)
{
    hca_tcp_rqp_t *r = conn->rx.rqp;

    if ((r == NULL) || (r->src_qpn != hdr->src_qpn)) {
        return NULL;
    }
    for (int i = 0; i < HCA_TCP_RD_ATOM; ++i) {
        if (r->atom[i].valid && (r->atom[i].psn == hdr->psn)) {
            return &r->atom[i];
        }
    }
    return NULL;
}

void hca_tcp_rqps_forget(hca_tcp_conn_t *conn)
{
    hca_tcp_conn_t *lead = hca_tcp_rq_table(conn);

    for (int b = 0; b < HCA_TCP_RQP_BUCKETS; ++b) {
        for (hca_tcp_rqp_t *r = lead->rqps[b]; r != NULL; r = r->next) {
            if (r->busy == conn) {
                r->busy = NULL;
            }
        }
    }
}

void hca_tcp_rqps_free(hca_tcp_conn_t *conn)
{
    if (conn->n_rqps > 0) {
        HCA_TCP_COUNT(conn->tcp, HCA_TCP_CNT_RECORDS, -(int64_t)conn->n_rqps);
    }
    for (int b = 0; b < HCA_TCP_RQP_BUCKETS; ++b) {
        while (conn->rqps[b] != NULL) {
            hca_tcp_rqp_t *r = conn->rqps[b];
            conn->rqps[b]    = r->next;
            free(r);
        }
    }
    conn->n_rqps = 0;
    conn->rx.rqp = NULL;
}
