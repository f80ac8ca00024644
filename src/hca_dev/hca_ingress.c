/*
 * hca_ingress.c - the ingress router of the receive rings: takes each
 * message that arrived, validates its header against the slot and the
 * limits, finds the QP it is for and checks that the QP accepts its
 * source, and hands it to the responder's handler for its op
 * (hca_resp.c).  A message that fails validation is counted and dropped;
 * one for a QP that is gone or refuses it is refused (its sender answered
 * if it waits).  Also the in-place receive, which reads a ring's head
 * message where it lies.
 *
 * Runs in the owner's hca_cq_poll (hca_progress.c).
 */
#include "hca_util.h"
#include "hca_log.h"
#include "hca_registry.h"
#include "hca_obj.h"
#include "hca_queue.h"
#include "hca_state.h"
#include "hca_engine.h"

#include <errno.h>
#include <string.h>

/* The header's fields against the slot and the limits, before anything
 * reads what they describe. */
static int hca_ingress_valid(const hca_msg_hdr_t *hdr)
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

/* The host a message comes from, as the fabric that placed it vouches:
 * this host, or the QP's accepted peer's (hca_fabric_ops_t
 * msg_from_qp_peer). */
HCA_INLINE uint64_t hca_ingress_src_host(hca_device_t *dev,
                                         const hca_qp_t *qp,
                                         const hca_msg_hdr_t *hdr)
{
    return hca_fabric_of_msg(dev, hdr)->msg_from_qp_peer ? qp->dest.host :
                                                          dev->host_key;
}

/* 1 if the message at the head of rq is for hca_recv_peek(): the
 * responder leaves it in the ring. */
HCA_INLINE int hca_ingress_inplace(const hca_rq_t *rq, const hca_msg_hdr_t *hdr)
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
           (hdr->dst_qpn == qp->qpn) &&
           hca_qp_accepts(qp, hca_ingress_src_host(rq->dev, qp, hdr),
                          hdr->src_pid, hdr->src_ctx, hdr->src_qpn);
}

/* HCA_TRACE=1: every message's transition on stderr. */
static HCA_NOINLINE void hca_ingress_trace(const hca_rq_t *rq,
                                           const hca_msg_hdr_t *hdr,
                                           hca_rx_state_t to)
{
    hca_log("ring %u msg op %u from pid %u qp 0x%x to qp 0x%x: ARRIVED -> %s",
            rq->ring_id, hdr->op, hdr->src_pid, hdr->src_qpn, hdr->dst_qpn,
            hca_rx_state_name[to]);
}

/* Hands one message to its responder handler: its next state. */
static hca_rx_state_t hca_ingress_route(hca_rq_t *rq, hca_ingress_msg_t *m)
{
    hca_device_t *dev = rq->dev;
    const hca_msg_hdr_t *hdr = &m->hdr;
    hca_qp_t *qp;

    if (hdr->op == HCA_MSG_NOP) {
        return HCA_RX_DROPPED; /* a cancelled direct send */
    }
    if (hdr->op == HCA_MSG_SEND_PULL) {
        memcpy(&m->pull, m->payload, sizeof(m->pull)); /* once: the
                                                          sender's */
        memcpy(m->iov, m->payload + sizeof(m->pull),
               sizeof(hca_wire_iov_t) * hdr->num_iov);
    }
    qp = hca_qp_lookup(dev, hdr->dst_qpn);
    if ((qp == NULL) || (qp->rq != rq) ||
        !hca_qp_accepts(qp, hca_ingress_src_host(dev, qp, hdr), hdr->src_pid,
                        hdr->src_ctx, hdr->src_qpn)) {
        hca_resp_refuse(dev, m, qp == NULL);
        return HCA_RX_DROPPED;
    }
    return hca_resp_handlers[hdr->op](rq, qp, m);
}

int hca_ingress_poll(hca_rq_t *rq, int budget)
{
    int count = 0, drained = 0;

    while (count < budget) {
        hca_ingress_msg_t m;
        uint64_t idx;
        uint8_t *slot = hca_ring_peek(&rq->ring, &idx);

        if (slot == NULL) {
            drained = 1;
            break;
        }
        memcpy(&m.hdr, slot, sizeof(m.hdr));
        if (rq->inplace && hca_ingress_inplace(rq, &m.hdr)) {
            break; /* hca_recv_peek() delivers it, in order */
        }
        if (!hca_ingress_valid(&m.hdr)) {
            __atomic_fetch_add(&rq->dev->svc_cnt->errors[HCA_WC_GENERAL_ERR],
                               1, __ATOMIC_RELAXED);
        } else {
            hca_rx_state_t to;
            m.payload = slot + m.hdr.data_off;
            to        = hca_ingress_route(rq, &m);
            if (HCA_UNLIKELY(rq->dev->trace)) {
                hca_ingress_trace(rq, &m.hdr, to);
            }
            if (to == HCA_RX_RNR) {
                /* keep it until a receive is posted: until then nothing
                 * in this ring can complete (hca_rq_waits_recv); read as
                 * far as it can be (see hca_resp_sweep) */
                rq->rnr_at = idx + 1;
                if (HCA_UNLIKELY(rq->rnr_ns == 0)) {
                    rq->rnr_ns = hca_now_ns();
                }
                drained = 1;
                break;
            }
        }
        hca_ring_release(&rq->ring, idx);
        ++count;
        if (HCA_UNLIKELY(rq->rnr_ns != 0)) {
            rq->rnr_ns = 0; /* its head got a receive */
        }
    }
    /* after the messages that waited: one of them may be a partial's next
     * fragment, however long we did not poll */
    if (HCA_UNLIKELY(rq->n_partials > 0)) {
        hca_resp_sweep(rq, drained);
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
    if ((rq->cqes != 0) || !hca_ingress_inplace(rq, &hdr)) {
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
