/*
 * hca_resp.c - the responder for receive rings: validates each message
 * that arrived, matches it with a posted receive WQE (the QP's own RQ or
 * its SRQ), places the data and produces the receive completion.
 *
 * Runs in the owner's hca_cq_poll.  With no receive posted the ring waits
 * (an infinite RNR retry): nothing is dropped.  A message for a QP that is
 * gone or does not accept its source is dropped and, if the sender waits
 * for an answer, answered with an error.
 */
#include "hca_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

/* A local copy of the header: the slot is shared with other processes. */
typedef struct hca_resp_msg {
    hca_msg_hdr_t hdr;
    const uint8_t *payload;
} hca_resp_msg_t;

static int hca_resp_validate(const hca_msg_hdr_t *hdr)
{
    switch (hdr->op) {
    case HCA_MSG_SEND:
        return (hdr->length <= hca_msg_room(hdr->data_off)) &&
               (hdr->msg_len <= HCA_MAX_MSG) &&
               (hdr->length <= hdr->msg_len) &&
               /* a whole message in one slot is all there is of it */
               (((hdr->flags & (HCA_MSG_FIRST | HCA_MSG_LAST)) !=
                 (HCA_MSG_FIRST | HCA_MSG_LAST)) ||
                (hdr->length == hdr->msg_len));
    case HCA_MSG_SEND_PULL:
        return (hdr->num_iov <= HCA_MAX_SGE) &&
               (sizeof(hca_pull_hdr_t) +
                hdr->num_iov * sizeof(hca_wire_iov_t) <=
                hca_msg_room(hdr->data_off)) &&
               (hdr->msg_len <= HCA_MAX_MSG);
    case HCA_MSG_WRITE_IMM:
    case HCA_MSG_NOP:
        return 1;
    default:
        return 0;
    }
}

HCA_INLINE int hca_resp_source_ok(const hca_qp_t *qp, const hca_msg_hdr_t *hdr)
{
    if ((qp->state != HCA_QPS_RTR) && (qp->state != HCA_QPS_RTS)) {
        return 0;
    }
    return (qp->dest_qpn == HCA_QPN_ANY) ||
           ((qp->dest_qpn == hdr->src_qpn) && (qp->dest.pid == hdr->src_pid) &&
            (qp->dest.ctx_id == hdr->src_ctx));
}

/* Answers a SEND_PULL through the fabric it came from. */
static void hca_resp_answer(hca_device_t *dev, const hca_msg_hdr_t *hdr,
                            const hca_pull_hdr_t *pull, hca_wc_status_t status)
{
    hca_fabric_of_msg(dev, hdr)->answer(dev, hdr, pull, status);
}

/* 1 if a SEND_PULL that names one of our QPs as its source describes
 * that QP's issued SEND: the WQE its answer slot names, with the same
 * stamp and exactly its SGEs (checked against our MPT when posted). */
static int hca_resp_pull_is_ours(hca_device_t *dev, const hca_msg_hdr_t *hdr,
                                 const hca_wire_iov_t *wiov,
                                 const hca_pull_hdr_t *pull)
{
    hca_qp_t *src = hca_qp_lookup(dev, hdr->src_qpn);
    const hca_wqe_t *wqe;

    if ((src == NULL) || (pull->resp_idx > src->sq_mask)) {
        return 0;
    }
    wqe = &src->sq[pull->resp_idx];
    if ((wqe->state != HCA_WQE_ISSUED) ||
        (wqe->resp_stamp != pull->resp_stamp) ||
        ((wqe->opcode != HCA_WR_SEND) &&
         (wqe->opcode != HCA_WR_SEND_WITH_IMM)) ||
        (wqe->num_sge != hdr->num_iov) || (wqe->length != hdr->msg_len)) {
        return 0;
    }
    for (uint32_t i = 0; i < hdr->num_iov; ++i) {
        if ((wqe->sge[i].addr != wiov[i].addr) ||
            (wqe->sge[i].length != wiov[i].length)) {
            return 0;
        }
    }
    return 1;
}

static void hca_resp_complete(hca_qp_t *qp, const hca_rwqe_t *rwqe,
                              const hca_msg_hdr_t *hdr,
                              hca_wc_status_t status, hca_wc_opcode_t opcode)
{
    hca_wc_t wc = {
        .wr_id    = rwqe->wr_id,
        .status   = status,
        .opcode   = opcode,
        .byte_len = (status == HCA_WC_SUCCESS) ? hdr->msg_len : 0,
        .imm_data = hdr->imm,
        .qp_num   = qp->qpn,
        .src_qp   = hdr->src_qpn,
        .wc_flags = (hdr->flags & HCA_MSG_WITH_IMM) ? HCA_WC_WITH_IMM : 0,
    };
    hca_wr_opcode_t op = (opcode == HCA_WC_RECV_RDMA_WITH_IMM) ?
                         HCA_WR_RDMA_WRITE_WITH_IMM : HCA_WR_SEND;

    hca_cq_push(qp->recv_cq, &wc);
    qp->cnt->rx_ops[op]++;
    qp->cnt->rx_bytes[op] += wc.byte_len;
    if (status != HCA_WC_SUCCESS) {
        qp->cnt->errors[status]++;
    }
}

void hca_partial_free(hca_qp_t *qp, hca_partial_t *p)
{
    qp->rq->n_partials--;
    free(p);
}

/* Ends an unfinished message: its receive completes with status (the
 * consumer gets it back), nothing of it is delivered. */
static void hca_partial_abort(hca_qp_t *qp, hca_partial_t *p,
                              hca_wc_status_t status)
{
    hca_msg_hdr_t hdr;

    memset(&hdr, 0, sizeof(hdr));
    hdr.src_qpn = p->src_qpn;
    hca_resp_complete(qp, &p->rwqe, &hdr, status, HCA_WC_RECV);
    hca_partial_free(qp, p);
}

/* The source of a partial is gone (or was never there: a forged one). */
static int hca_partial_source_dead(hca_device_t *dev, const hca_partial_t *p)
{
    /* partials come through the receive rings: the shm fabric's */
    return !dev->fabric_ops[HCA_FABRIC_SHM].source_alive(dev, p->src_pid,
                                                         p->src_ctx);
}

/* At most every 100 ms while partials exist: ends those whose source died
 * or sent nothing for HCA_PARTIAL_TIMEOUT_NS, so that first fragments
 * whose rest never comes cannot hold the posted receives for good. */
static void hca_resp_sweep(hca_rq_t *rq)
{
    hca_device_t *dev = rq->dev;
    uint64_t now      = hca_now_ns();

    if (now < rq->sweep_ns) {
        return;
    }
    rq->sweep_ns = now + 100000000ull;
    for (uint32_t i = 1; (i < HCA_MAX_QP) && (rq->n_partials > 0); ++i) {
        hca_qp_t *qp = dev->qps[i];
        if ((qp == NULL) || (qp->rq != rq)) {
            continue;
        }
        for (hca_partial_t **pp = &qp->partials; *pp != NULL;) {
            hca_partial_t *p = *pp;
            int stale = (now - p->last_ns > HCA_PARTIAL_TIMEOUT_NS);
            if (!stale && !hca_partial_source_dead(dev, p)) {
                pp = &p->next;
                continue;
            }
            *pp = p->next;
            hca_partial_abort(qp, p, stale ? HCA_WC_GENERAL_ERR :
                                             HCA_WC_RETRY_EXC_ERR);
            __atomic_fetch_add(&dev->svc_cnt->errors[HCA_WC_GENERAL_ERR], 1,
                               __ATOMIC_RELAXED);
        }
    }
}

static hca_partial_t *hca_partial_find(hca_qp_t *qp, const hca_msg_hdr_t *hdr,
                                       int unlink)
{
    for (hca_partial_t **pp = &qp->partials; *pp != NULL;
         pp = &(*pp)->next) {
        hca_partial_t *p = *pp;
        if ((p->src_pid == hdr->src_pid) && (p->src_ctx == hdr->src_ctx) &&
            (p->src_qpn == hdr->src_qpn)) {
            if (unlink) {
                *pp = p->next;
            }
            return p;
        }
    }
    return NULL;
}

/* Takes the next posted receive, or NULL (receiver not ready). */
static hca_rwqe_t *hca_resp_take_rwqe(hca_rq_t *rq)
{
    if (rq->tail == rq->head) {
        return NULL;
    }
    return &rq->wqes[rq->tail++ & rq->mask];
}

/* Handles one message.  Returns 0 when consumed, -EAGAIN to leave it in
 * the ring (no receive posted yet). */
static int hca_resp_handle(hca_rq_t *rq, const hca_msg_hdr_t *hdr,
                           const uint8_t *payload)
{
    hca_device_t *dev = rq->dev;
    hca_qp_t *qp      = hca_qp_lookup(dev, hdr->dst_qpn);
    hca_wire_iov_t wiov[HCA_MAX_SGE];
    hca_wc_status_t status;
    hca_partial_t *partial;
    hca_pull_hdr_t pull;
    hca_rwqe_t *rwqe;

    if (hdr->op == HCA_MSG_NOP) {
        return 0; /* a cancelled direct send */
    }
    if (hdr->op == HCA_MSG_SEND_PULL) {
        memcpy(&pull, payload, sizeof(pull)); /* once: the sender's */
        memcpy(wiov, payload + sizeof(pull),
               sizeof(hca_wire_iov_t) * hdr->num_iov);
    }
    if ((qp == NULL) || (qp->rq != rq) || !hca_resp_source_ok(qp, hdr)) {
        if (hdr->op == HCA_MSG_SEND_PULL) {
            /* a QP destroyed meanwhile is gone, as if it never answered */
            hca_resp_answer(dev, hdr, &pull,
                            (qp == NULL) ? HCA_WC_RETRY_EXC_ERR :
                                           HCA_WC_REM_INV_REQ_ERR);
        }
        __atomic_fetch_add(&dev->svc_cnt->errors[HCA_WC_REM_INV_REQ_ERR], 1,
                           __ATOMIC_RELAXED);
        return 0;
    }

    switch (hdr->op) {
    case HCA_MSG_WRITE_IMM:
        rwqe = hca_resp_take_rwqe(rq);
        if (rwqe == NULL) {
            return -EAGAIN;
        }
        hca_resp_complete(qp, rwqe, hdr, HCA_WC_SUCCESS,
                          HCA_WC_RECV_RDMA_WITH_IMM);
        return 0;

    case HCA_MSG_SEND_PULL:
        if ((hdr->src_pid == dev->pid) && (hdr->src_ctx == dev->ctx_id) &&
            !hca_resp_pull_is_ours(dev, hdr, wiov, &pull)) {
            /* names us as its source, but no QP of ours sent it: forged.
             * Dropped and counted; not answered (the answer slot it names
             * is one of ours) and no QP is moved to ERR (a forger could
             * name any) */
            __atomic_fetch_add(&dev->svc_cnt->errors[HCA_WC_GENERAL_ERR], 1,
                               __ATOMIC_RELAXED);
            return 0;
        }
        rwqe = hca_resp_take_rwqe(rq);
        if (rwqe == NULL) {
            return -EAGAIN;
        }
        status = hca_fabric_of_msg(dev, hdr)->pull(dev, hdr, wiov, rwqe);
        hca_resp_answer(dev, hdr, &pull, (status == HCA_WC_LOC_LEN_ERR) ?
                        HCA_WC_REM_INV_REQ_ERR : status);
        hca_resp_complete(qp, rwqe, hdr, status, HCA_WC_RECV);
        return 0;

    case HCA_MSG_SEND:
        if (hdr->flags & HCA_MSG_FIRST) {
            rwqe = hca_resp_take_rwqe(rq);
            if (rwqe == NULL) {
                return -EAGAIN;
            }
            /* a source's SENDs arrive in order: a new message means its
             * unfinished one never ends */
            partial = hca_partial_find(qp, hdr, 1);
            if (partial != NULL) {
                hca_partial_abort(qp, partial, HCA_WC_GENERAL_ERR);
            }
            status = (hdr->msg_len > rwqe->length) ? HCA_WC_LOC_LEN_ERR :
                     hca_rwqe_place(rwqe, 0, payload, hdr->length);
            if (hdr->flags & HCA_MSG_LAST) {
                hca_resp_complete(qp, rwqe, hdr, status, HCA_WC_RECV);
                return 0;
            }
            partial = calloc(1, sizeof(*partial));
            if (partial == NULL) {
                hca_resp_complete(qp, rwqe, hdr, HCA_WC_GENERAL_ERR,
                                  HCA_WC_RECV);
                return 0;
            }
            partial->src_pid = hdr->src_pid;
            partial->src_ctx = hdr->src_ctx;
            partial->src_qpn = hdr->src_qpn;
            partial->offset  = hdr->length;
            partial->msg_len = hdr->msg_len;
            partial->error   = status;
            partial->last_ns = hca_now_ns();
            partial->rwqe    = *rwqe;
            partial->next    = qp->partials;
            qp->partials     = partial;
            rq->n_partials++;
            return 0;
        }
        partial = hca_partial_find(qp, hdr, (hdr->flags & HCA_MSG_LAST) != 0);
        if (partial == NULL) {
            return 0; /* its start was dropped (QP reset): drop the rest */
        }
        /* the message's length is its first fragment's: a fragment
         * that says otherwise, or runs past it, fails the message (which
         * completes with what was placed, never more) */
        if ((partial->error == HCA_WC_SUCCESS) &&
            ((hdr->msg_len != partial->msg_len) ||
             (hdr->length > partial->msg_len - partial->offset))) {
            partial->error = HCA_WC_REM_INV_REQ_ERR;
        }
        if (partial->error == HCA_WC_SUCCESS) {
            partial->error = hca_rwqe_place(&partial->rwqe, partial->offset,
                                            payload, hdr->length);
            partial->offset += hdr->length;
        }
        partial->last_ns = hca_now_ns();
        if (hdr->flags & HCA_MSG_LAST) {
            hca_msg_hdr_t whole = *hdr;
            whole.msg_len = partial->msg_len;
            if ((partial->error == HCA_WC_SUCCESS) &&
                (partial->offset != partial->msg_len)) {
                partial->error = HCA_WC_REM_INV_REQ_ERR; /* bytes missing */
            }
            hca_resp_complete(qp, &partial->rwqe, &whole,
                              (hca_wc_status_t)partial->error, HCA_WC_RECV);
            hca_partial_free(qp, partial);
        }
        return 0;
    }
    return 0;
}

/* 1 if the message at the head of rq is for hca_recv_peek(): the
 * responder leaves it in the ring. */
HCA_INLINE int hca_resp_inplace(const hca_rq_t *rq, const hca_msg_hdr_t *hdr)
{
    const hca_qp_t *qp = rq->owner;

    /* exactly the messages the responder would place whole into one
     * receive: the reader and the responder never disagree, or the head
     * of the ring would wait forever */
    return (hdr->op == HCA_MSG_SEND) &&
           ((hdr->flags & (HCA_MSG_FIRST | HCA_MSG_LAST)) ==
            (HCA_MSG_FIRST | HCA_MSG_LAST)) &&
           (hdr->length == hdr->msg_len) &&
           (hdr->length <= hca_msg_room(hdr->data_off)) && (qp != NULL) &&
           (hdr->dst_qpn == qp->qpn) && hca_resp_source_ok(qp, hdr);
}

int hca_resp_progress(hca_rq_t *rq, int budget)
{
    int count = 0;

    if (HCA_UNLIKELY(rq->n_partials > 0)) {
        hca_resp_sweep(rq);
    }

    while (count < budget) {
        hca_msg_hdr_t hdr;
        uint64_t idx;
        uint8_t *slot = hca_ring_peek(&rq->ring, &idx);

        if (slot == NULL) {
            break;
        }
        memcpy(&hdr, slot, sizeof(hdr));
        if (rq->inplace && hca_resp_inplace(rq, &hdr)) {
            break; /* hca_recv_peek() delivers it, in order */
        }
        if (!hca_resp_validate(&hdr)) {
            __atomic_fetch_add(&rq->dev->svc_cnt->errors[HCA_WC_GENERAL_ERR],
                               1, __ATOMIC_RELAXED);
        } else if (hca_resp_handle(rq, &hdr, slot + hdr.data_off) != 0) {
            break; /* RNR: keep it until a receive is posted */
        }
        hca_ring_release(&rq->ring, idx);
        ++count;
    }
    return count;
}

/* ---------------------------------------------------------------- in place */

int hca_recv_peek(hca_qp_t *qp, hca_recv_msg_t *msg)
{
    hca_rq_t *rq = qp->rq;
    hca_msg_hdr_t hdr;
    uint64_t idx;
    uint8_t *slot;

    if (HCA_UNLIKELY(!rq->inplace)) {
        return 0;
    }
    for (;;) {
        slot = hca_ring_peek(&rq->ring, &idx);
        if (slot == NULL) {
            return 0;
        }
        /* one read of the header: the slot is shared with the sender */
        memcpy(&hdr, slot, sizeof(hdr));
        if (hdr.op != HCA_MSG_NOP) {
            break;
        }
        hca_ring_release(&rq->ring, idx); /* a cancelled direct send */
    }
    if ((rq->cqes != 0) || !hca_resp_inplace(rq, &hdr)) {
        return 0; /* its CQEs first, or the responder's (hca_cq_poll) */
    }
    msg->data     = slot + hdr.data_off;
    msg->byte_len = hdr.length;
    msg->imm_data = hdr.imm;
    msg->wc_flags = (hdr.flags & HCA_MSG_WITH_IMM) ? HCA_WC_WITH_IMM : 0;
    msg->src_qp   = hdr.src_qpn;
    msg->index    = idx;
    return 1;
}

void hca_recv_release(hca_qp_t *qp, const hca_recv_msg_t *msg)
{
    qp->cnt->rx_ops[HCA_WR_SEND]++;
    qp->cnt->rx_bytes[HCA_WR_SEND] += msg->byte_len;
    hca_ring_release(&qp->rq->ring, msg->index);
}
