/*
 * hca_queue.h - the queue and ring inlines of the device's objects: CQ ring
 * phase and idleness, SGE walks and receive placement, the receive queue's
 * wait, the send queue's idleness, the receive side's target check, and the
 * response slot of an issued WQE (which every fabric's answers fill).
 * Private to libhcadev (not installed).
 */
#ifndef HCA_QUEUE_H
#define HCA_QUEUE_H

#include "hca_obj.h"
#include "hca_atomic.h"
#include "hca_base.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- ring send */

/* The one producer path of every ring (a QP's receive ring, whichever
 * fabric delivers into it, and a context's service ring): claim a slot,
 * fill it, post it.  Posting publishes the slot and, if the claim found
 * the consumer armed (and cleared its bit: hca_ring_claim), wakes it
 * through the notify index the ring's owner keeps in its header. */
typedef struct hca_ring_send {
    hca_ring_t *ring;
    uint64_t    idx;
    int         wake;      /* the claim cleared the consumer's armed bit */
} hca_ring_send_t;

/* The claimed slot to fill, or NULL if the ring is full. */
HCA_INLINE void *hca_ring_send_claim(hca_ring_send_t *s, hca_ring_t *ring)
{
    s->ring = ring;
    s->wake = 0;
    if (HCA_UNLIKELY(hca_ring_claim(ring, &s->idx, &s->wake) != 0)) {
        return NULL;
    }
    return hca_ring_slot(ring, s->idx);
}

/* Wakes the consumer of ring (in context `to`) if wake, after the
 * publishes it is for.  Several posts may share one wake (fragments). */
HCA_INLINE void hca_ring_wake(hca_device_t *dev, hca_ring_t *ring,
                              const hca_notify_ctx_t *to, int wake)
{
    if (HCA_UNLIKELY(wake)) {
        hca_notify_signal(dev, to, atomic_load(&ring->hdr->notify_idx));
    }
}

/* Publishes the filled slot; returns whether its consumer is owed a
 * wake (hca_ring_wake, after the last slot of a batch). */
HCA_INLINE int hca_ring_send_publish(hca_ring_send_t *s)
{
    hca_ring_publish(s->ring, s->idx);
    return s->wake;
}

/* Publishes the filled slot, then wakes its consumer if it was armed. */
HCA_INLINE void hca_ring_send_post(hca_device_t *dev, hca_ring_send_t *s,
                                   const hca_notify_ctx_t *to)
{
    hca_ring_wake(dev, s->ring, to, hca_ring_send_publish(s));
}

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

/* What every fast path requires: nothing queued or waiting for a
 * response (so nothing is overtaken and a fence is satisfied), no
 * sq_sig_all (no CQE owed), and the connection in RTS. */
HCA_INLINE int hca_sq_idle(const hca_qp_t *qp)
{
    return HCA_LIKELY(qp->state == HCA_QPS_RTS) &&
           (qp->sq_exec == qp->sq_head) && (qp->n_issued == 0) &&
           !qp->sq_sig_all;
}

/* Something moved on the QP (a WQE executed or completed, a send found
 * room): its liveness timer stops (hca_qp_stalled starts it again). */
HCA_INLINE void hca_qp_progressed(hca_qp_t *qp)
{
    qp->stall_since = 0;
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

/* The answering side of a response slot, on any fabric: the status and
 * the fetched value, then the stamp that makes them the WQE's (release:
 * hca_resp_slot_poll reads them after it). */
HCA_INLINE void hca_resp_slot_fill(hca_resp_slot_t *slot, uint32_t stamp,
                                   hca_wc_status_t status, uint64_t value)
{
    slot->status = status;
    slot->value  = value;
    atomic_store_explicit(&slot->stamp, stamp, memory_order_release);
}

/* After a response slot was filled: the requester's send CQ (notify
 * entry `notify`, consumer cq_idx of context `to`) is woken if it armed.
 * The producer half of CQ arming (hca_cq_set_armed is the consumer's):
 * the fence orders the stamp before the read of `armed`, against the
 * armer's fence between setting it and its last look at the slots; the
 * exchange lets one producer wake it once. */
HCA_INLINE void hca_cq_wake_armed(hca_device_t *dev, hca_notify_t *notify,
                                  const hca_notify_ctx_t *to,
                                  uint32_t cq_idx)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&notify->armed) && atomic_exchange(&notify->armed, 0)) {
        hca_notify_signal(dev, to, cq_idx);
    }
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
