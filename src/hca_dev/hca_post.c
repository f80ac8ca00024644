/*
 * hca_post.c - the verbs entry points of the send and receive queues:
 * posting work requests (the doorbell runs the requester at once when
 * nothing is queued), and the transport's fast paths, which go straight
 * to the fabric of the QP.
 */
#include "hca_util.h"
#include "hca_base.h"
#include "hca_obj.h"
#include "hca_queue.h"
#include "hca_mpt.h"
#include "hca_state.h"
#include "hca_engine.h"

#include <errno.h>
#include <string.h>

/* The doorbell's fast path may take a WR whose local SGEs pass the check
 * (inline data has nothing to check). */
HCA_INLINE int hca_wr_local_ok(hca_qp_t *qp, const hca_send_wr_t *wr)
{
    const hca_opcode_info_t *info = &hca_opcode[wr->opcode];

    return (wr->send_flags & HCA_SEND_INLINE) || (wr->num_sge == 0) ||
           (hca_sge_check(qp->dev, qp->pd->handle, wr->sg_list, wr->num_sge,
                          (info->flags & (HCA_OPF_READ | HCA_OPF_FETCH)) ?
                          HCA_ACCESS_LOCAL_WRITE : 0) == HCA_WC_SUCCESS);
}

/* Validates one WR against the QP; 0 or -EINVAL. */
static int hca_send_wr_check(const hca_qp_t *qp, const hca_send_wr_t *wr,
                             uint64_t *length_p)
{
    const hca_opcode_info_t *info;
    uint64_t length = 0;

    if ((unsigned)wr->opcode >= HCA_WR_OPCODE_LAST) {
        return -EINVAL;
    }
    info = &hca_opcode[wr->opcode];
    if ((wr->num_sge < 0) || ((uint32_t)wr->num_sge > qp->max_send_sge) ||
        ((wr->num_sge > 0) && (wr->sg_list == NULL))) {
        return -EINVAL;
    }
    for (int i = 0; i < wr->num_sge; ++i) {
        length += wr->sg_list[i].length;
    }
    if (info->flags & HCA_OPF_ATOMIC) {
        uint32_t size = (wr->send_flags & HCA_SEND_ATOMIC32) ? 4 : 8;
        if ((wr->send_flags & HCA_SEND_INLINE) ||
            ((info->flags & HCA_OPF_FETCH) &&
             ((wr->num_sge != 1) || (length != size))) ||
            (!(info->flags & HCA_OPF_FETCH) && (wr->num_sge != 0))) {
            return -EINVAL;
        }
    } else if (length > HCA_MAX_MSG) {
        return -EINVAL;
    }
    if ((wr->send_flags & HCA_SEND_INLINE) &&
        ((info->flags & HCA_OPF_READ) || (length > qp->max_inline))) {
        return -EINVAL;
    }
    *length_p = length;
    return 0;
}

static void hca_wqe_fill(hca_qp_t *qp, hca_wqe_t *wqe, uint64_t idx,
                         const hca_send_wr_t *wr, uint64_t length)
{
    wqe->wr_id       = wr->wr_id;
    wqe->opcode      = (uint8_t)wr->opcode;
    wqe->state       = HCA_WQE_POSTED;
    wqe->flags       = (uint16_t)(wr->send_flags |
                                  (qp->sq_sig_all ? HCA_SEND_SIGNALED : 0));
    if (wqe->flags & HCA_SEND_SIGNALED) {
        wqe->flags &= (uint16_t)~HCA_SEND_DEFER_SIGNAL; /* plain signalled */
    }
    wqe->status      = HCA_WC_SUCCESS;
    wqe->imm         = wr->imm_data;
    wqe->rkey        = wr->rdma.rkey;
    wqe->remote_addr = wr->rdma.remote_addr;
    wqe->compare_add = wr->compare_add;
    wqe->swap        = wr->swap;
    wqe->length      = length;
    wqe->done        = 0;
    wqe->chunk       = 0;

    if (wr->send_flags & HCA_SEND_INLINE) {
        uint8_t *buf = qp->inline_buf + (idx & qp->sq_mask) * qp->max_inline;
        uint8_t *p   = buf;
        for (int i = 0; i < wr->num_sge; ++i) {
            memcpy(p, (void*)(uintptr_t)wr->sg_list[i].addr,
                   wr->sg_list[i].length);
            p += wr->sg_list[i].length;
        }
        wqe->num_sge       = 1;
        wqe->sge[0].addr   = (uint64_t)(uintptr_t)buf;
        wqe->sge[0].length = (uint32_t)length;
        wqe->sge[0].lkey   = 0;
    } else {
        wqe->num_sge = (uint32_t)wr->num_sge;
        memcpy(wqe->sge, wr->sg_list, sizeof(hca_sge_t) * wr->num_sge);
    }
}

/* A full target ring that stays full for long may belong to a dead peer
 * (a store into a dead peer's ring still succeeds until it fills): check
 * liveness at most every HCA_PEER_CHECK_NS.  -EAGAIN, or -ECONNRESET once
 * the peer is found gone (the QP is then in ERR). */
int hca_qp_ring_full(hca_qp_t *qp)
{
    return hca_qp_stalled(qp) ? -EAGAIN : -ECONNRESET;
}

int hca_post_send(hca_qp_t *qp, hca_send_wr_t *wr, hca_send_wr_t **bad_wr)
{
    int rc = 0;

    for (; wr != NULL; wr = wr->next) {
        uint64_t idx = qp->sq_head, length;
        hca_wqe_t *wqe;

        if (HCA_UNLIKELY(qp->state != HCA_QPS_RTS) &&
            (qp->state != HCA_QPS_ERR)) {
            rc = -EINVAL;
            break;
        }
        rc = hca_send_wr_check(qp, wr, &length);
        if (HCA_UNLIKELY(rc != 0)) {
            break;
        }
        if (hca_sq_idle(qp) &&
            !(wr->send_flags & (HCA_SEND_SIGNALED | HCA_SEND_FENCE)) &&
            hca_wr_local_ok(qp, wr) &&
            qp->fabric->post_direct(qp, wr, length)) {
            wr->send_flags &= ~(unsigned)HCA_SEND_DEFER_SIGNAL;
            continue; /* done: nothing to queue, nothing to report */
        }
        if (HCA_UNLIKELY(idx - qp->sq_tail + qp->sq_held > qp->sq_mask)) {
            hca_qp_report_sq(qp); /* reclaim what completed */
            if (idx - qp->sq_tail + qp->sq_held > qp->sq_mask) {
                rc = -ENOMEM;
                break;
            }
        }
        wqe = &qp->sq[idx & qp->sq_mask];
        hca_wqe_fill(qp, wqe, idx, wr, length);
        qp->sq_head = idx + 1;
        if (HCA_UNLIKELY(qp->state == HCA_QPS_ERR)) {
            /* as on verbs: accepted, and completed as flushed */
            wqe->state  = HCA_WQE_DONE;
            wqe->status = HCA_WC_WR_FLUSH_ERR;
            if (wqe->flags & HCA_SEND_DEFER_SIGNAL) {
                wqe->flags |= HCA_SEND_SIGNALED; /* its CQE must come */
            }
            qp->sq_exec = qp->sq_head;
            continue;
        }

        /* the doorbell: execute now if nothing is queued before it */
        if ((qp->sq_exec == idx) && (hca_req_progress(qp) == -EAGAIN) &&
            (qp->sq_exec == idx) && (wqe->state == HCA_WQE_POSTED)) {
            /* the target had no room: hand it back, nothing was sent */
            qp->sq_head = idx;
            qp->cnt->ring_full++;
            rc = hca_qp_ring_full(qp);
            break;
        }
        if (wqe->flags & HCA_SEND_DEFER_SIGNAL) {
            if ((qp->sq_tail > idx) && (wqe->status == HCA_WC_SUCCESS)) {
                /* done inside the call, reported without a CQE */
                wr->send_flags &= ~(unsigned)HCA_SEND_DEFER_SIGNAL;
            } else if (qp->sq_tail <= idx) {
                wqe->flags |= HCA_SEND_SIGNALED; /* a CQE will tell */
            }
        }
    }
    if (rc != 0) {
        *bad_wr = wr;
    } else if (qp->sq_exec == qp->sq_head) {
        hca_qp_progressed(qp); /* every WR went out: the ring had room */
    }
    hca_qp_report_sq(qp);
    hca_progress_mark_busy(qp); /* WRs queued behind others wait for a poll */
    return rc;
}

int hca_post_recv(hca_qp_t *qp, hca_recv_wr_t *wr, hca_recv_wr_t **bad_wr)
{
    int rc;

    if ((qp->srq != NULL) || (qp->state == HCA_QPS_RESET)) {
        *bad_wr = wr;
        return -EINVAL;
    }
    rc = hca_rq_post(qp->rq, wr, bad_wr);
    if (qp->state == HCA_QPS_ERR) {
        hca_qp_flush_recv(qp); /* as on verbs: completed as flushed */
    }
    return rc;
}


/* ---------------------------------------------------------------- fast */

const hca_fast_ops_t *hca_qp_fast_ops(const hca_qp_t *qp)
{
    return &qp->fabric->fast;
}

int hca_qp_send_blocked(hca_qp_t *qp)
{
    return hca_qp_ring_full(qp);
}

