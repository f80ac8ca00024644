/*
 * hca_resp.c - the responder engine: what a message that arrived for one
 * of our QPs does.  The ingress router (hca_ingress.c) validated it and
 * checked that its QP accepts the source; here it is matched with a posted
 * receive WQE (the QP's own RQ or its SRQ), its data placed, and the
 * receive completion produced.  A handler that finds no receive posted
 * returns -EAGAIN and the message waits in its ring (an infinite RNR
 * retry): nothing is dropped.
 *
 * A message is a state machine (hca_rx_state_t); each handler is the step
 * from ARRIVED and returns the next state:
 *   ARRIVED --no receive posted-->       RNR      (stays in its ring)
 *   ARRIVED --first of several fragments--> PARTIAL (its receive is held
 *             in an hca_partial_t, bounded in time and by its source's
 *             liveness: hca_resp_sweep)
 *   PARTIAL --later fragments, the last--> COMPLETE
 *   ARRIVED --whole / pulled / notice-->  COMPLETE (receive CQE pushed)
 *   ARRIVED --forged, or its start lost--> DROPPED (counted)
 */
#include "hca_util.h"
#include "hca_registry.h"
#include "hca_obj.h"
#include "hca_queue.h"
#include "hca_state.h"
#include "hca_engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

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
    return !p->fabric->source_alive(dev, p->src_pid, p->src_ctx);
}

/* How long a partial may go without a fragment: its fabric's bound. */
static uint64_t hca_partial_timeout_ns(hca_device_t *dev,
                                       const hca_partial_t *p)
{
    const hca_fabric_ops_t *f = p->fabric;

    return (f->partial_timeout_ns != NULL) ? f->partial_timeout_ns(dev) :
                                             HCA_PARTIAL_TIMEOUT_NS;
}

/* At most every 100 ms while partials exist: ends those whose source died
 * or, with the ring read as far as it can be (`drained`: to its end, or
 * to a message that waits for a receive), sent nothing for their
 * fabric's timeout, so that first fragments whose rest never comes
 * cannot hold the posted receives for good.  Behind a head that waits
 * for a receive a fragment of theirs may wait unread: the time counts
 * from then, and a receive held that long by a message that cannot go
 * on while the ring waits for one is given back (the ring would
 * otherwise wait for good). */
void hca_resp_sweep(hca_rq_t *rq, int drained)
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
            uint64_t since = (p->last_ns > rq->rnr_ns) ? p->last_ns :
                                                         rq->rnr_ns;
            int stale      = drained && (now > since) &&
                             (now - since > hca_partial_timeout_ns(dev, p));
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

/* The source of hdr (its process and context, through its fabric) has
 * hca_partials_per_source() unfinished messages on qp: its oldest ends,
 * so that one more keeps it at the limit. */
static void hca_partial_limit(hca_qp_t *qp, const hca_msg_hdr_t *hdr)
{
    const hca_fabric_ops_t *fabric = hca_fabric_of_msg(qp->dev, hdr);
    hca_partial_t **oldest         = NULL;
    unsigned n                     = 0;

    for (hca_partial_t **pp = &qp->partials; *pp != NULL;
         pp = &(*pp)->next) {
        const hca_partial_t *p = *pp;
        if ((p->src_pid == hdr->src_pid) && (p->src_ctx == hdr->src_ctx) &&
            (p->fabric == fabric)) {
            oldest = pp; /* newest first: the last one found */
            ++n;
        }
    }
    if (n >= hca_partials_per_source(qp->rq)) {
        hca_partial_t *p = *oldest;
        *oldest          = p->next;
        hca_partial_abort(qp, p, HCA_WC_GENERAL_ERR);
        __atomic_fetch_add(&qp->dev->svc_cnt->errors[HCA_WC_GENERAL_ERR], 1,
                           __ATOMIC_RELAXED);
    }
}

/* Takes the next posted receive, or NULL (receiver not ready). */
static hca_rwqe_t *hca_resp_take_rwqe(hca_rq_t *rq)
{
    if (rq->tail == rq->head) {
        return NULL;
    }
    return &rq->wqes[rq->tail++ & rq->mask];
}

/* ---------------------------------------------------------------- handlers */

/* RDMA WRITE WITH IMM: its data is placed; the notice takes a receive. */
static hca_rx_state_t hca_resp_write_imm(hca_rq_t *rq, hca_qp_t *qp,
                              const hca_ingress_msg_t *m)
{
    hca_rwqe_t *rwqe = hca_resp_take_rwqe(rq);

    if (rwqe == NULL) {
        return HCA_RX_RNR;
    }
    hca_resp_complete(qp, rwqe, &m->hdr, HCA_WC_SUCCESS,
                      HCA_WC_RECV_RDMA_WITH_IMM);
    return HCA_RX_COMPLETE;
}

/* A SEND described by its source's iovs: pulled into the receive, and the
 * source answered. */
static hca_rx_state_t hca_resp_send_pull(hca_rq_t *rq, hca_qp_t *qp,
                              const hca_ingress_msg_t *m)
{
    hca_device_t *dev = rq->dev;
    const hca_msg_hdr_t *hdr = &m->hdr;
    hca_wc_status_t status;
    hca_rwqe_t *rwqe;

    if ((hdr->src_pid == dev->pid) && (hdr->src_ctx == dev->ctx_id) &&
        !hca_resp_pull_is_ours(dev, hdr, m->iov, &m->pull)) {
        /* names us as its source, but no QP of ours sent it: forged.
         * Dropped and counted; not answered (the answer slot it names
         * is one of ours) and no QP is moved to ERR (a forger could
         * name any) */
        __atomic_fetch_add(&dev->svc_cnt->errors[HCA_WC_GENERAL_ERR], 1,
                           __ATOMIC_RELAXED);
        return HCA_RX_DROPPED;
    }
    rwqe = hca_resp_take_rwqe(rq);
    if (rwqe == NULL) {
        return HCA_RX_RNR;
    }
    status = hca_fabric_of_msg(dev, hdr)->pull(dev, hdr, m->iov, rwqe);
    hca_resp_answer(dev, hdr, &m->pull, (status == HCA_WC_LOC_LEN_ERR) ?
                    HCA_WC_REM_INV_REQ_ERR : status);
    hca_resp_complete(qp, rwqe, hdr, status, HCA_WC_RECV);
    return HCA_RX_COMPLETE;
}

/* The first fragment of a SEND (or all of it). */
static hca_rx_state_t hca_resp_send_first(hca_rq_t *rq, hca_qp_t *qp,
                               const hca_ingress_msg_t *m)
{
    const hca_msg_hdr_t *hdr = &m->hdr;
    hca_wc_status_t status;
    hca_partial_t *partial;
    hca_rwqe_t *rwqe;

    rwqe = hca_resp_take_rwqe(rq);
    if (rwqe == NULL) {
        return HCA_RX_RNR;
    }
    /* a source's SENDs arrive in order: a new message means its
     * unfinished one never ends */
    partial = hca_partial_find(qp, hdr, 1);
    if (partial != NULL) {
        hca_partial_abort(qp, partial, HCA_WC_GENERAL_ERR);
    }
    hca_partial_limit(qp, hdr);
    status = (hdr->msg_len > rwqe->length) ? HCA_WC_LOC_LEN_ERR :
             hca_rwqe_place(rwqe, 0, m->payload, hdr->length);
    if (hdr->flags & HCA_MSG_LAST) {
        hca_resp_complete(qp, rwqe, hdr, status, HCA_WC_RECV);
        return HCA_RX_COMPLETE;
    }
    partial = calloc(1, sizeof(*partial));
    if (partial == NULL) {
        hca_resp_complete(qp, rwqe, hdr, HCA_WC_GENERAL_ERR, HCA_WC_RECV);
        return HCA_RX_COMPLETE;
    }
    partial->src_pid = hdr->src_pid;
    partial->src_ctx = hdr->src_ctx;
    partial->src_qpn = hdr->src_qpn;
    partial->fabric  = hca_fabric_of_msg(qp->dev, hdr);
    partial->offset  = hdr->length;
    partial->msg_len = hdr->msg_len;
    partial->error   = status;
    partial->last_ns = hca_now_ns();
    partial->rwqe    = *rwqe;
    partial->next    = qp->partials;
    qp->partials     = partial;
    rq->n_partials++;
    return HCA_RX_PARTIAL;
}

/* A later fragment of a SEND: placed after the earlier ones. */
static hca_rx_state_t hca_resp_send_next(hca_qp_t *qp, const hca_ingress_msg_t *m)
{
    const hca_msg_hdr_t *hdr = &m->hdr;
    hca_partial_t *partial;

    partial = hca_partial_find(qp, hdr, (hdr->flags & HCA_MSG_LAST) != 0);
    if (partial == NULL) {
        return HCA_RX_DROPPED; /* its start was dropped (QP reset) */
    }
    /* the message's length is its first fragment's: a fragment that says
     * otherwise, or runs past it, fails the message (which completes with
     * what was placed, never more) */
    if ((partial->error == HCA_WC_SUCCESS) &&
        ((hdr->msg_len != partial->msg_len) ||
         (hdr->length > partial->msg_len - partial->offset))) {
        partial->error = HCA_WC_REM_INV_REQ_ERR;
    }
    if (partial->error == HCA_WC_SUCCESS) {
        partial->error = hca_rwqe_place(&partial->rwqe, partial->offset,
                                        m->payload, hdr->length);
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
        return HCA_RX_COMPLETE;
    }
    return HCA_RX_PARTIAL;
}

static hca_rx_state_t hca_resp_send(hca_rq_t *rq, hca_qp_t *qp,
                         const hca_ingress_msg_t *m)
{
    return (m->hdr.flags & HCA_MSG_FIRST) ? hca_resp_send_first(rq, qp, m) :
                                            hca_resp_send_next(qp, m);
}

const char *const hca_rx_state_name[HCA_RX_LAST] = {
    [HCA_RX_ARRIVED]  = "ARRIVED",
    [HCA_RX_RNR]      = "RNR",
    [HCA_RX_PARTIAL]  = "PARTIAL",
    [HCA_RX_COMPLETE] = "COMPLETE",
    [HCA_RX_DROPPED]  = "DROPPED",
};

/* The responder's handler of each message op (the router's table). */
const hca_resp_handler_t hca_resp_handlers[HCA_MSG_OP_LAST] = {
    [HCA_MSG_SEND]      = hca_resp_send,
    [HCA_MSG_SEND_PULL] = hca_resp_send_pull,
    [HCA_MSG_WRITE_IMM] = hca_resp_write_imm,
};

/* A message the router could not deliver: its QP is gone or refuses the
 * source.  A waiting sender is answered. */
void hca_resp_refuse(hca_device_t *dev, const hca_ingress_msg_t *m,
                     int qp_gone)
{
    if (m->hdr.op == HCA_MSG_SEND_PULL) {
        /* a QP destroyed meanwhile is gone, as if it never answered */
        hca_resp_answer(dev, &m->hdr, &m->pull,
                        qp_gone ? HCA_WC_RETRY_EXC_ERR :
                                  HCA_WC_REM_INV_REQ_ERR);
    }
    __atomic_fetch_add(&dev->svc_cnt->errors[HCA_WC_REM_INV_REQ_ERR], 1,
                       __ATOMIC_RELAXED);
}
