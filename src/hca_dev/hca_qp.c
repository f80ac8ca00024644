/*
 * hca_qp.c - reliable-connected queue pairs: creation, the state machine,
 * flush on error, completion of WQEs into CQEs.  Posting is hca_post.c,
 * execution the requester's (hca_req.c).
 */
#include "hca_util.h"
#include "hca_base.h"
#include "hca_registry.h"
#include "hca_obj.h"
#include "hca_queue.h"
#include "hca_counters.h"
#include "hca_state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

hca_qp_t *hca_qp_lookup(hca_device_t *dev, uint32_t qpn)
{
    uint32_t index = HCA_QPN_INDEX(qpn);
    hca_qp_t *qp;

    if ((index == 0) || (index >= HCA_MAX_QP)) {
        return NULL;
    }
    qp = dev->qps[index];
    return ((qp != NULL) && (qp->qpn == qpn)) ? qp : NULL;
}

/* After a change of what requesters check in our QP table entry: a
 * requester's cached check of it (hca_shm_target_cached) ends. */
static void hca_qp_pub_changed(hca_qp_t *qp)
{
    atomic_fetch_add_explicit(&qp->pub->gen, 1, memory_order_release);
}

static int hca_qp_init_check(hca_pd_t *pd, const hca_qp_init_attr_t *attr)
{
    (void)pd;
    if ((attr->send_cq == NULL) || (attr->recv_cq == NULL) ||
        (attr->send_cq->dev != pd->dev) || (attr->recv_cq->dev != pd->dev) ||
        (attr->max_send_wr == 0) || (attr->max_send_wr > HCA_MAX_QP_WR) ||
        (attr->max_send_sge > HCA_MAX_SGE) ||
        (attr->max_recv_sge > HCA_MAX_SGE) ||
        (attr->max_inline_data > HCA_SLOT_PAYLOAD) ||
        ((attr->srq == NULL) &&
         ((attr->max_recv_wr == 0) || (attr->max_recv_wr > HCA_MAX_QP_WR))) ||
        ((attr->srq != NULL) && (attr->srq->rq.pd != pd)) ||
        (attr->create_flags & ~(unsigned)HCA_QP_CREATE_RECV_INPLACE) ||
        ((attr->create_flags & HCA_QP_CREATE_RECV_INPLACE) &&
         (attr->srq != NULL))) {
        return -EINVAL;
    }
    return 0;
}

static int hca_qp_qobj_create(hca_qp_t *qp)
{
    hca_device_t *dev = qp->dev;
    uint32_t depth    = qp->sq_mask + 1;
    size_t cnt_off    = sizeof(hca_qobj_hdr_t);
    size_t resp_off   = (cnt_off + sizeof(hca_counters_t) + 63) & ~63ul;
    size_t bounce_off = (resp_off + sizeof(hca_resp_slot_t) * depth +
                         4095) & ~4095ul;
    hca_qobj_hdr_t *hdr;
    char name[HCA_OBJ_NAME_MAX];
    int rc;

    hca_obj_name(name, sizeof(name), dev->pidns, dev->pid, dev->ctx_id,
                 dev->name_nonce, "q", qp->qpn);
    rc = hca_memobj_create(&qp->qobj, name, bounce_off + HCA_BOUNCE_SIZE,
                        dev->numa_node);
    if (rc != 0) {
        return rc;
    }
    hdr                = qp->qobj.addr;
    hdr->magic         = HCA_WIRE_MAGIC;
    hdr->sq_depth      = depth;
    hdr->bounce_offset   = bounce_off;
    hdr->resp_offset     = resp_off;
    hdr->counters_offset = cnt_off;
    qp->cnt    = (hca_counters_t*)((uint8_t*)qp->qobj.addr + cnt_off);
    qp->resp   = (hca_resp_slot_t*)((uint8_t*)qp->qobj.addr + resp_off);
    qp->bounce = (uint8_t*)qp->qobj.addr + bounce_off;
    return 0;
}

int hca_qp_create(hca_pd_t *pd, const hca_qp_init_attr_t *attr,
                  hca_qp_t **qp_p)
{
    hca_device_t *dev = pd->dev;
    uint32_t depth, index = 0;
    hca_qp_pub_t *pub;
    hca_qp_t *qp;
    int rc;

    rc = hca_qp_init_check(pd, attr);
    if (rc != 0) {
        return rc;
    }
    /* the struct's alignment (its fabric part and tally start lines of
     * their own), which calloc does not give */
    qp = aligned_alloc(_Alignof(hca_qp_t), sizeof(*qp));
    if (qp == NULL) {
        return -ENOMEM;
    }
    memset(qp, 0, sizeof(*qp));
    depth            = hca_roundup_pow2(attr->max_send_wr);
    qp->dev          = dev;
    qp->pd           = pd;
    qp->send_cq      = attr->send_cq;
    qp->recv_cq      = attr->recv_cq;
    qp->srq          = attr->srq;
    qp->sq_sig_all   = attr->sq_sig_all;
    qp->quiet_flush  = attr->quiet_flush;
    qp->max_inline   = attr->max_inline_data;
    qp->max_send_sge = attr->max_send_sge ? attr->max_send_sge : 1;
    qp->sq_mask      = depth - 1;
    qp->state        = HCA_QPS_RESET;
    qp->fabric       = &hca_fabric_none;
    qp->sq           = calloc(depth, sizeof(*qp->sq));
    qp->inline_buf   = calloc(depth, qp->max_inline ? qp->max_inline : 1);
    if ((qp->sq == NULL) || (qp->inline_buf == NULL)) {
        rc = -ENOMEM;
        goto err_free;
    }

    pthread_mutex_lock(&dev->lock);
    for (uint32_t i = 1; i < HCA_MAX_QP; ++i) {
        if (dev->qps[i] == NULL) {
            index        = i;
            dev->qps[i]  = qp;
            break;
        }
    }
    if (index != 0) {
        dev->qp_gen[index] = (dev->qp_gen[index] + 1) & HCA_QPN_GEN_MASK;
        qp->qpn = (dev->qp_gen[index] << HCA_QPN_INDEX_BITS) | index;
        if (index > atomic_load(&dev->hdr->qp_hwm)) {
            atomic_store(&dev->hdr->qp_hwm, index); /* before its first
                                                        access */
        }
    }
    pthread_mutex_unlock(&dev->lock);
    if (index == 0) {
        rc = -ENOMEM;
        goto err_free;
    }
    qp->index = index;

    if (qp->srq != NULL) {
        qp->rq = &qp->srq->rq;
    } else {
        rc = hca_rq_init(&qp->own_rq, pd, attr->max_recv_wr,
                         attr->max_recv_sge, 0);
        if (rc != 0) {
            goto err_release;
        }
        qp->rq             = &qp->own_rq;
        qp->own_rq.owner   = qp;
        qp->own_rq.inplace = !!(attr->create_flags &
                                HCA_QP_CREATE_RECV_INPLACE);
    }

    rc = hca_qp_qobj_create(qp);
    if (rc != 0) {
        goto err_rq;
    }
    rc = hca_cq_attach_qp(qp->send_cq, qp);
    if (rc != 0) {
        goto err_qobj;
    }
    rc = hca_cq_attach_rq(qp->recv_cq, qp->rq);
    if (rc != 0) {
        goto err_detach_send;
    }

    pub              = &dev->qp_pub[index];
    qp->pub          = pub;
    atomic_store(&pub->state, HCA_QPS_RESET);
    pub->pd_handle   = pd->handle;
    pub->access      = 0;
    atomic_store(&pub->dest_pid, 0);
    atomic_store(&pub->dest_ctx, 0);
    atomic_store(&pub->dest_host, 0);
    atomic_store(&pub->dest_qpn, 0);
    pub->ring_id     = qp->rq->ring_id;
    pub->send_cq_idx = qp->send_cq->idx;
    pub->recv_cq_idx = qp->recv_cq->idx;
    pub->sq_depth    = depth;
    atomic_store(&pub->nak_qpn, 0);
    atomic_store_explicit(&pub->qpn, qp->qpn, memory_order_release);
    hca_qp_pub_changed(qp);

    if (qp->srq != NULL) {
        qp->srq->qps++;
    }
    atomic_fetch_add(&pd->refs, 1);
    *qp_p = qp;
    return 0;

err_detach_send:
    hca_cq_detach_qp(qp->send_cq, qp);
err_qobj:
    hca_memobj_destroy(&qp->qobj);
err_rq:
    if (qp->srq == NULL) {
        hca_rq_cleanup(&qp->own_rq);
    }
err_release:
    pthread_mutex_lock(&dev->lock);
    dev->qps[index] = NULL;
    pthread_mutex_unlock(&dev->lock);
err_free:
    free(qp->sq);
    free(qp->inline_buf);
    free(qp);
    return rc;
}

static void hca_qp_free_partials(hca_qp_t *qp)
{
    while (qp->partials != NULL) {
        hca_partial_t *p = qp->partials;
        qp->partials     = p->next;
        hca_partial_free(qp, p);
    }
}

int hca_qp_destroy(hca_qp_t *qp)
{
    hca_device_t *dev = qp->dev;

    atomic_store(&qp->pub->qpn, 0);
    atomic_store(&qp->pub->state, HCA_QPS_RESET);
    hca_qp_pub_changed(qp);
    /* a fabric's thread may be placing a message for this QP (any QP
     * receives from any fabric): after this none is inside it */
    hca_fabric_quiesce_all(qp);
    qp->fabric->disconnect(qp);
    hca_cq_detach_qp(qp->send_cq, qp);
    hca_cq_detach_rq(qp->recv_cq, qp->rq);
    if (qp->srq != NULL) {
        qp->srq->qps--;
    } else {
        hca_rq_cleanup(&qp->own_rq);
    }
    hca_qp_free_partials(qp);

    hca_tally_publish(qp);
    pthread_mutex_lock(&dev->lock);
    dev->qps[qp->index] = NULL;
    hca_counters_add(&dev->retired, qp->cnt);
    pthread_mutex_unlock(&dev->lock);
    hca_stats_retire(dev, qp->cnt);
    hca_memobj_destroy(&qp->qobj);
    atomic_fetch_sub(&qp->pd->refs, 1);
    free(qp->sq);
    free(qp->inline_buf);
    free(qp);
    return 0;
}

uint32_t hca_qp_num(const hca_qp_t *qp)
{
    return qp->qpn;
}

hca_qp_state_t hca_qp_state(const hca_qp_t *qp)
{
    return qp->state;
}

hca_wc_status_t hca_qp_error(const hca_qp_t *qp)
{
    return (qp->state == HCA_QPS_ERR) ? qp->err_cause : HCA_WC_SUCCESS;
}

/* Every change of access or accepted source is followed by one of state
 * (INIT, RTR, RESET), which ends the requesters' cached checks. */
static void hca_qp_set_state(hca_qp_t *qp, hca_qp_state_t state)
{
    qp->state = state;
    atomic_store(&qp->pub->state, state);
    hca_qp_pub_changed(qp);
}

/* Completes every posted receive of the QP's own RQ as flushed. */
void hca_qp_flush_recv(hca_qp_t *qp)
{
    hca_rq_t *rq = &qp->own_rq;

    if (qp->srq != NULL) {
        return;
    }
    for (; rq->tail != rq->head; rq->tail++) {
        hca_rwqe_t *rwqe = &rq->wqes[rq->tail & rq->mask];
        hca_wc_t wc      = {.wr_id  = rwqe->wr_id,
                            .status = HCA_WC_WR_FLUSH_ERR,
                            .opcode = HCA_WC_RECV,
                            .qp_num = qp->qpn};
        hca_cq_push(qp->recv_cq, &wc);
        qp->cnt->errors[HCA_WC_WR_FLUSH_ERR]++;
    }
}

void hca_wqe_done(hca_qp_t *qp, hca_wqe_t *wqe, hca_wc_status_t status)
{
    wqe->state  = HCA_WQE_DONE;
    wqe->status = status;
    if (HCA_UNLIKELY(status != HCA_WC_SUCCESS) &&
        (qp->state != HCA_QPS_ERR)) {
        hca_qp_to_err(qp, HCA_WC_WR_FLUSH_ERR);
        qp->err_cause = status; /* this WR, not the ones flushed after it */
    }
}

/* Done WQEs become CQEs, in post order (a CQE of a signalled WR also
 * completes every unsignalled WR before it, as on verbs). */
void hca_qp_report_sq(hca_qp_t *qp)
{
    while (qp->sq_tail != qp->sq_exec) {
        hca_wqe_t *wqe = &qp->sq[qp->sq_tail & qp->sq_mask];

        if (wqe->state != HCA_WQE_DONE) {
            break;
        }
        /* a deferred WR's caller waits for a CQE unless it succeeded inside
         * the post, so its failure is always reported */
        if ((wqe->flags & HCA_SEND_SIGNALED) ||
            ((wqe->status != HCA_WC_SUCCESS) &&
             (!((wqe->status == HCA_WC_WR_FLUSH_ERR) && qp->quiet_flush) ||
              (wqe->flags & HCA_SEND_DEFER_SIGNAL)))) {
            hca_wc_t wc = {
                .wr_id    = wqe->wr_id,
                .status   = (hca_wc_status_t)wqe->status,
                .opcode   = hca_opcode[wqe->opcode].wc_opcode,
                .byte_len = (uint32_t)wqe->length,
                .qp_num   = qp->qpn,
            };
            if (hca_cq_push(qp->send_cq, &wc) == 0) {
                qp->sq_held++;
            }
        }
        if (wqe->status != HCA_WC_SUCCESS) {
            qp->cnt->errors[wqe->status]++;
        }
        qp->sq_tail++;
    }
}

/* Flushes every WR not reported yet; the first one not done gets
 * `first`, as the error that moved the QP to ERR. */
int hca_qp_to_err(hca_qp_t *qp, hca_wc_status_t first)
{
    int first_done = 0;

    if (qp->state != HCA_QPS_ERR) {
        qp->err_cause = first;
    }
    hca_qp_set_state(qp, HCA_QPS_ERR);
    qp->fabric->quiesce(qp); /* nothing lands in the buffers flushed below */
    for (uint64_t s = qp->sq_tail; s != qp->sq_head; ++s) {
        hca_wqe_t *wqe = &qp->sq[s & qp->sq_mask];
        if (wqe->state != HCA_WQE_DONE) {
            wqe->state  = HCA_WQE_DONE;
            wqe->status = first_done ? HCA_WC_WR_FLUSH_ERR : first;
            first_done  = 1;
        } else if (wqe->status == HCA_WC_SUCCESS) {
            /* executed, but after the error: IB reports it flushed */
            if (first_done) {
                wqe->status = HCA_WC_WR_FLUSH_ERR;
            }
        } else {
            first_done = 1;
        }
    }
    qp->sq_exec     = qp->sq_head;
    qp->n_issued    = 0;
    hca_qp_report_sq(qp);

    hca_qp_flush_recv(qp);
    /* receives already matched to half-arrived messages: flushed too */
    while (qp->partials != NULL) {
        hca_partial_t *p = qp->partials;
        hca_wc_t wc      = {.wr_id  = p->rwqe.wr_id,
                            .status = HCA_WC_WR_FLUSH_ERR,
                            .opcode = HCA_WC_RECV,
                            .qp_num = qp->qpn};
        qp->partials = p->next;
        hca_cq_push(qp->recv_cq, &wc);
        hca_partial_free(qp, p);
    }
    return 0;
}

static void hca_qp_reset(hca_qp_t *qp)
{
    /* the WQEs of before are given up: no answer that comes late may
     * find one waiting (its buffers are the application's again), then
     * every fabric lets go of the QP */
    for (uint32_t i = 0; i <= qp->sq_mask; ++i) {
        qp->sq[i].resp_stamp = 0;
        __atomic_store_n(&qp->sq[i].state, HCA_WQE_DONE, __ATOMIC_RELEASE);
    }
    hca_fabric_quiesce_all(qp);
    /* sq_held stays: CQEs of before the reset may still be unpolled */
    qp->sq_head = qp->sq_exec = qp->sq_tail = 0;
    qp->n_issued    = 0;
    if (qp->srq == NULL) {
        qp->own_rq.tail = qp->own_rq.head;
    }
    hca_qp_free_partials(qp);
    qp->fabric->disconnect(qp);
    hca_tally_publish(qp); /* counted for the fabric it leaves */
    qp->fabric = &hca_fabric_none;
    atomic_store(&qp->pub->dest_qpn, 0);
    hca_qp_set_state(qp, HCA_QPS_RESET);
}

int hca_qp_modify(hca_qp_t *qp, const hca_qp_attr_t *attr, unsigned mask)
{
    hca_qp_state_t cur = qp->state, next;
    int rc;

    if (!(mask & HCA_QP_ATTR_STATE) ||
        (mask & ~(HCA_QP_ATTR_STATE | HCA_QP_ATTR_DEST |
                  HCA_QP_ATTR_ACCESS)) ||
        ((unsigned)attr->qp_state >= HCA_QPS_LAST)) {
        return -EINVAL;
    }
    next = attr->qp_state;

    /* validate everything first: a refused transition changes nothing */
    switch (next) {
    case HCA_QPS_RESET:
    case HCA_QPS_ERR:
        if (mask != HCA_QP_ATTR_STATE) {
            return -EINVAL;
        }
        break;
    case HCA_QPS_INIT:
        if ((cur != HCA_QPS_RESET) || (mask & HCA_QP_ATTR_DEST) ||
            ((mask & HCA_QP_ATTR_ACCESS) &&
             (attr->access & ~(HCA_ACCESS_REMOTE_WRITE |
                               HCA_ACCESS_REMOTE_READ |
                               HCA_ACCESS_REMOTE_ATOMIC |
                               HCA_ACCESS_LOCAL_WRITE)))) {
            return -EINVAL;
        }
        break;
    case HCA_QPS_RTR:
        if ((cur != HCA_QPS_INIT) || !(mask & HCA_QP_ATTR_DEST) ||
            (mask & HCA_QP_ATTR_ACCESS) || (attr->dest_qp_num == 0)) {
            return -EINVAL;
        }
        break;
    case HCA_QPS_RTS:
        if ((cur != HCA_QPS_RTR) || (mask != HCA_QP_ATTR_STATE) ||
            (qp->dest_qpn == HCA_QPN_ANY)) {
            return -EINVAL;
        }
        break;
    default:
        return -EINVAL;
    }

    switch (next) {
    case HCA_QPS_RESET:
        hca_qp_reset(qp);
        break;
    case HCA_QPS_ERR:
        if (cur != HCA_QPS_ERR) {
            hca_qp_to_err(qp, HCA_WC_WR_FLUSH_ERR);
        }
        break;
    case HCA_QPS_INIT:
        qp->pub->access = (mask & HCA_QP_ATTR_ACCESS) ? attr->access : 0;
        hca_qp_set_state(qp, HCA_QPS_INIT);
        break;
    case HCA_QPS_RTR:
        qp->dest     = attr->dest;
        qp->dest_qpn = attr->dest_qp_num;
        if (qp->dest_qpn != HCA_QPN_ANY) {
            const hca_fabric_ops_t *fabric = hca_fabric_for_addr(qp->dev,
                                                                 &qp->dest);
            rc = (fabric != NULL) ? fabric->connect(qp) : -EHOSTUNREACH;
            if (rc != 0) {
                /* refused: nothing changes */
                memset(&qp->dest, 0, sizeof(qp->dest));
                qp->dest_qpn = 0;
                return rc;
            }
            qp->fabric = fabric;
        }
        atomic_store(&qp->pub->dest_pid, attr->dest.pid);
        atomic_store(&qp->pub->dest_ctx, attr->dest.ctx_id);
        atomic_store(&qp->pub->dest_host, attr->dest.host);
        atomic_store(&qp->pub->dest_qpn, attr->dest_qp_num);
        hca_qp_set_state(qp, HCA_QPS_RTR);
        break;
    case HCA_QPS_RTS:
        hca_qp_set_state(qp, HCA_QPS_RTS);
        break;
    default:
        break;
    }
    return 0;
}

int hca_qp_check_peer(hca_qp_t *qp)
{
    hca_wc_status_t status;

    if ((qp->dest_qpn == 0) || (qp->dest_qpn == HCA_QPN_ANY)) {
        return 1;
    }
    status = qp->fabric->peer_status(qp);
    if (status == HCA_WC_SUCCESS) {
        return 1;
    }
    if (qp->state != HCA_QPS_ERR) {
        hca_qp_to_err(qp, status);
    }
    return 0;
}

/* The first stalled call starts the timer; the peer is checked at most
 * every HCA_PEER_CHECK_NS after it, so that a QP that waits makes one
 * syscall per period and one that moves none (hca_qp_progressed stops
 * the timer). */
int hca_qp_stalled(hca_qp_t *qp)
{
    /* the coarse clock (a tick behind at most, against a 50 ms period):
     * a QP that waits for an answer comes here at every poll, and a
     * precise read was 3 % of a polling am_lat client over tcp */
    uint64_t now = hca_coarse_ns();

    if (qp->stall_since == 0) {
        qp->stall_since = now;
        return 1;
    }
    if (now - qp->stall_since <= HCA_PEER_CHECK_NS) {
        return 1;
    }
    qp->stall_since = now;
    return hca_qp_check_peer(qp);
}

uint32_t hca_qp_outstanding(const hca_qp_t *qp)
{
    return (uint32_t)(qp->sq_head - qp->sq_tail) + qp->sq_held;
}

uint64_t hca_qp_sq_posted(const hca_qp_t *qp)
{
    return qp->sq_head;
}

uint64_t hca_qp_sq_retired(const hca_qp_t *qp)
{
    return qp->sq_tail - qp->sq_held;
}

int hca_qp_counters(hca_qp_t *qp, hca_counters_t *cnt)
{
    hca_tally_read(qp, cnt);
    return 0;
}

int hca_qp_rkey_ptr(hca_qp_t *qp, uint64_t remote_addr, uint32_t rkey,
                    size_t length, void **ptr_p)
{
    if ((qp->dest_qpn == 0) || (qp->dest_qpn == HCA_QPN_ANY)) {
        return -ENOTCONN;
    }
    return qp->fabric->rkey_ptr(qp, remote_addr, rkey, length, ptr_p);
}
