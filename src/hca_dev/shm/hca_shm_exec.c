/*
 * hca_shm_exec.c - the shm fabric's requester side: the execution of each
 * opcode of a WQE, and the responses of issued ones.
 *
 * Paths, fastest first:
 *   - the target is this process: memcpy / CPU atomics on its memory;
 *   - the target MR is device memory: memcpy / CPU atomics on our mapping;
 *   - single copy (process_vm_writev/readv) into/out of the target;
 *   - otherwise the target's responder thread executes it (atomics on
 *     plain memory; WRITE/READ in bounce-buffer chunks without CMA).
 * SENDs go through the target's receive ring: inline up to one slot, else
 * a descriptor that the target pulls by single copy, else fragments.
 * The requester checks the target QP and MPT itself before any access.
 * A WQE that ends returns HCA_EXEC_DONE with its status: the requester
 * engine completes it.
 */
#include "hca_shm_access.h"
#include "hca_shm_target.h"
#include "hca_queue.h"

#include <errno.h>
#include <string.h>

/* ---------------------------------------------------------------- target */

static void hca_msg_fill(hca_qp_t *qp, hca_msg_hdr_t *msg, uint8_t op,
                         uint8_t flags, const hca_wqe_t *wqe)
{
    if ((wqe->opcode == HCA_WR_SEND_WITH_IMM) ||
        (wqe->opcode == HCA_WR_RDMA_WRITE_WITH_IMM)) {
        flags |= HCA_MSG_WITH_IMM;
    }
    hca_msg_hdr_set(msg, qp, op, flags, HCA_MSG_DATA_NEAR, wqe->imm, 0,
                    (uint32_t)wqe->length);
}

/* ---------------------------------------------------------------- SEND */

static hca_exec_t hca_shm_send(hca_qp_t *qp, hca_wqe_t *wqe,
                               hca_qp_pub_t *pub, hca_wc_status_t *status_p)
{
    hca_ring_t *ring = hca_shm_target_ring(qp, pub);
    hca_ring_send_t s;
    hca_msg_hdr_t *msg;
    int wake = 0;

    if (HCA_UNLIKELY(ring == NULL)) {
        *status_p = HCA_WC_RETRY_EXC_ERR;
        return HCA_EXEC_DONE;
    }

    if (HCA_LIKELY(wqe->length <= HCA_SLOT_PAYLOAD)) {
        msg = hca_ring_send_claim(&s, ring);
        if (msg == NULL) {
            return HCA_EXEC_BUSY;
        }
        hca_msg_fill(qp, msg, HCA_MSG_SEND, HCA_MSG_FIRST | HCA_MSG_LAST,
                     wqe);
        msg->length   = (uint32_t)wqe->length;
        msg->data_off = (uint8_t)hca_msg_data_off(wqe->length);
        hca_sge_gather(wqe->sge, wqe->num_sge, 0,
                       (uint8_t*)msg + msg->data_off, wqe->length);
        hca_ring_send_post(qp->dev, &s, hca_shm_wake_to(qp));
        *status_p = HCA_WC_SUCCESS;
        return HCA_EXEC_DONE;
    }

    if (hca_shm_qp(qp)->peer->cma_ok) {
        /* one slot describes the message; the target reads it from our
         * memory into the receive buffer and answers in our q object */
        hca_pull_hdr_t *pull;
        hca_wire_iov_t *iov;
        msg = hca_ring_send_claim(&s, ring);
        if (msg == NULL) {
            return HCA_EXEC_BUSY;
        }
        hca_msg_fill(qp, msg, HCA_MSG_SEND_PULL,
                     HCA_MSG_FIRST | HCA_MSG_LAST, wqe);
        pull = (hca_pull_hdr_t*)(msg + 1);
        iov  = (hca_wire_iov_t*)(pull + 1);
        for (uint32_t i = 0; i < wqe->num_sge; ++i) {
            iov[i].addr   = wqe->sge[i].addr;
            iov[i].length = wqe->sge[i].length;
        }
        msg->num_iov     = (uint8_t)wqe->num_sge;
        wqe->resp_stamp  = hca_qp_next_stamp(qp);
        pull->resp_idx   = (uint32_t)(wqe - qp->sq);
        pull->resp_stamp = wqe->resp_stamp;
        hca_ring_send_post(qp->dev, &s, hca_shm_wake_to(qp));
        return HCA_EXEC_ISSUED;
    }

    /* no single copy: fragments, one slot each, in order */
    while (wqe->done < wqe->length) {
        uint64_t n = wqe->length - wqe->done;
        uint8_t flags = 0;

        msg = hca_ring_send_claim(&s, ring);
        if (msg == NULL) {
            if (wqe->done == 0) {
                return HCA_EXEC_BUSY;
            }
            hca_ring_wake(qp->dev, ring, hca_shm_wake_to(qp), wake);
            return HCA_EXEC_PARTIAL;
        }
        n      = (n < HCA_SLOT_PAYLOAD) ? n : HCA_SLOT_PAYLOAD;
        flags |= (wqe->done == 0) ? HCA_MSG_FIRST : 0;
        flags |= (wqe->done + n == wqe->length) ? HCA_MSG_LAST : 0;
        hca_msg_fill(qp, msg, HCA_MSG_SEND, flags, wqe);
        msg->length   = (uint32_t)n;
        msg->data_off = (uint8_t)hca_msg_data_off(n);
        hca_sge_gather(wqe->sge, wqe->num_sge, wqe->done,
                       (uint8_t*)msg + msg->data_off, n);
        wake      |= hca_ring_send_publish(&s);
        wqe->done += n;
    }
    hca_ring_wake(qp->dev, ring, hca_shm_wake_to(qp), wake);
    *status_p = HCA_WC_SUCCESS;
    return HCA_EXEC_DONE;
}

/* The notice of an RDMA WRITE WITH IMM, after its data was placed. */
static hca_exec_t hca_shm_write_imm_notice(hca_qp_t *qp, hca_wqe_t *wqe,
                                           hca_qp_pub_t *pub,
                                           hca_wc_status_t *status_p)
{
    hca_ring_t *ring = hca_shm_target_ring(qp, pub);
    hca_ring_send_t s;
    hca_msg_hdr_t *msg;

    if (ring == NULL) {
        *status_p = HCA_WC_RETRY_EXC_ERR;
        return HCA_EXEC_DONE;
    }
    msg = hca_ring_send_claim(&s, ring);
    if (msg == NULL) {
        return HCA_EXEC_PARTIAL; /* data is placed: not "nothing done" */
    }
    hca_msg_fill(qp, msg, HCA_MSG_WRITE_IMM, HCA_MSG_FIRST | HCA_MSG_LAST,
                 wqe);
    hca_ring_send_post(qp->dev, &s, hca_shm_wake_to(qp));
    *status_p = HCA_WC_SUCCESS;
    return HCA_EXEC_DONE;
}

/* ---------------------------------------------------------------- atomics */

static void hca_atomic_result(hca_wqe_t *wqe, uint64_t old)
{
    if (hca_opcode[wqe->opcode].flags & HCA_OPF_FETCH) {
        hca_atomic_store_old((void*)(uintptr_t)wqe->sge[0].addr,
                             (wqe->flags & HCA_SEND_ATOMIC32) ? 4 : 8, old);
    }
}

/* Queues a request for the target's responder thread.  BUSY when its
 * ring is full. */
static hca_exec_t hca_shm_svc_post(hca_qp_t *qp, hca_wqe_t *wqe,
                                   uint64_t raddr, uint64_t length)
{
    hca_peer_t *peer = hca_shm_qp(qp)->peer;
    hca_ring_send_t s;
    hca_svc_req_t *req;

    req = hca_ring_send_claim(&s, &peer->svc);
    if (req == NULL) {
        return HCA_EXEC_BUSY;
    }
    req->opcode      = wqe->opcode;
    req->size        = (wqe->flags & HCA_SEND_ATOMIC32) ? 4 : 8;
    req->src_pid     = qp->dev->pid;
    req->src_ctx     = qp->dev->ctx_id;
    req->src_qpn     = qp->qpn;
    req->dst_qpn     = qp->dest_qpn;
    req->rkey        = wqe->rkey;
    wqe->resp_stamp  = hca_qp_next_stamp(qp);
    req->resp_idx    = (uint32_t)(wqe - qp->sq);
    req->resp_stamp  = wqe->resp_stamp;
    req->remote_addr = raddr;
    req->length      = length;
    req->operand     = wqe->compare_add;
    req->swap        = wqe->swap;
    /* the service ring's header names HCA_NOTIFY_SVC (hca_ring_init) */
    hca_ring_send_post(qp->dev, &s, &peer->notify_to);
    qp->cnt->responder_ops++;
    return HCA_EXEC_ISSUED;
}

/* The route of every shm atomic (hca_shm_direct.c); what it cannot do
 * here, the target's responder does. */
static hca_exec_t hca_shm_atomic(hca_qp_t *qp, hca_wqe_t *wqe,
                                 hca_qp_pub_t *pub, hca_wc_status_t *status_p)
{
    unsigned size = (wqe->flags & HCA_SEND_ATOMIC32) ? 4 : 8;
    hca_wc_status_t status;
    uint64_t old;

    status = hca_shm_atomic_exec(qp, pub, wqe->opcode, size, wqe->rkey,
                                 wqe->remote_addr, wqe->compare_add,
                                 wqe->swap, &old);
    if (status == HCA_WC_STATUS_LAST) {
        return hca_shm_svc_post(qp, wqe, wqe->remote_addr, (uint64_t)size);
    }
    if (status == HCA_WC_SUCCESS) {
        hca_atomic_result(wqe, old);
    }
    *status_p = status;
    return HCA_EXEC_DONE;
}

/* ---------------------------------------------------------------- RDMA */

/* WRITE/READ through the responder, one bounce-buffer chunk at a time.
 * The chunk in flight is wqe->chunk bytes at wqe->done. */
static hca_exec_t hca_shm_rdma_chunked(hca_qp_t *qp, hca_wqe_t *wqe,
                                       int write, hca_wc_status_t *status_p)
{
    uint32_t slot = (uint32_t)(wqe - qp->sq);
    hca_exec_t res;
    uint64_t n;

    if (wqe->chunk != 0) {
        hca_resp_slot_t *resp = &qp->resp[slot];
        if (atomic_load_explicit(&resp->stamp, memory_order_acquire) !=
            wqe->resp_stamp) {
            return HCA_EXEC_PARTIAL;
        }
        if (resp->status != HCA_WC_SUCCESS) {
            *status_p = (resp->status < HCA_WC_STATUS_LAST) ?
                         (hca_wc_status_t)resp->status : HCA_WC_REM_OP_ERR;
            return HCA_EXEC_DONE;
        }
        if (!write) {
            hca_sge_scatter(wqe->sge, wqe->num_sge, wqe->done, qp->bounce,
                            wqe->chunk);
        }
        wqe->done += wqe->chunk;
        wqe->chunk = 0;
        if (wqe->done == wqe->length) {
            *status_p = HCA_WC_SUCCESS; /* the caller sends an imm notice */
            return HCA_EXEC_DONE;
        }
    }
    n = wqe->length - wqe->done;
    n = (n < HCA_BOUNCE_SIZE) ? n : HCA_BOUNCE_SIZE;
    if (write) {
        hca_sge_gather(wqe->sge, wqe->num_sge, wqe->done, qp->bounce, n);
    }
    res = hca_shm_svc_post(qp, wqe, wqe->remote_addr + wqe->done, n);
    if (res == HCA_EXEC_BUSY) {
        if (wqe->done != 0) {
            return HCA_EXEC_PARTIAL;
        }
        return HCA_EXEC_BUSY;
    }
    wqe->chunk = n;
    return HCA_EXEC_PARTIAL;
}

static hca_xfer_t hca_wqe_xfer(const hca_wqe_t *wqe)
{
    hca_xfer_t x = {wqe->sge, wqe->num_sge, wqe->rkey, wqe->remote_addr,
                    wqe->length};
    return x;
}

static hca_exec_t hca_shm_rdma(hca_qp_t *qp, hca_wqe_t *wqe,
                               hca_qp_pub_t *pub, int write,
                               hca_wc_status_t *status_p)
{
    int imm = (wqe->opcode == HCA_WR_RDMA_WRITE_WITH_IMM);
    hca_exec_t res;

    if (wqe->state == HCA_WQE_POSTED) {
        hca_xfer_t x = hca_wqe_xfer(wqe);
        if (hca_shm_rdma_direct(qp, &x, pub, write, status_p) == 0) {
            if ((*status_p != HCA_WC_SUCCESS) || !imm) {
                return HCA_EXEC_DONE;
            }
            wqe->done = wqe->length;
            return hca_shm_write_imm_notice(qp, wqe, pub, status_p);
        }
    } else if (imm && (wqe->chunk == 0) && (wqe->done == wqe->length)) {
        return hca_shm_write_imm_notice(qp, wqe, pub, status_p);
    }
    res = hca_shm_rdma_chunked(qp, wqe, write, status_p);
    if ((res == HCA_EXEC_DONE) && (*status_p == HCA_WC_SUCCESS) && imm) {
        return hca_shm_write_imm_notice(qp, wqe, pub, status_p);
    }
    return res;
}

/* ---------------------------------------------------------------- exec */

static hca_exec_t hca_shm_rdma_read(hca_qp_t *qp, hca_wqe_t *wqe,
                                    hca_qp_pub_t *pub,
                                    hca_wc_status_t *status_p)
{
    return hca_shm_rdma(qp, wqe, pub, 0, status_p);
}

static hca_exec_t hca_shm_rdma_write(hca_qp_t *qp, hca_wqe_t *wqe,
                                     hca_qp_pub_t *pub,
                                     hca_wc_status_t *status_p)
{
    return hca_shm_rdma(qp, wqe, pub, 1, status_p);
}

typedef hca_exec_t (*hca_shm_exec_fn_t)(hca_qp_t *qp, hca_wqe_t *wqe,
                                        hca_qp_pub_t *pub,
                                        hca_wc_status_t *status_p);

/* How each opcode executes on the shm fabric. */
static const hca_shm_exec_fn_t hca_shm_exec_op[HCA_WR_OPCODE_LAST] = {
    [HCA_WR_SEND]                = hca_shm_send,
    [HCA_WR_SEND_WITH_IMM]       = hca_shm_send,
    [HCA_WR_RDMA_WRITE]          = hca_shm_rdma_write,
    [HCA_WR_RDMA_WRITE_WITH_IMM] = hca_shm_rdma_write,
    [HCA_WR_RDMA_READ]           = hca_shm_rdma_read,
    [HCA_WR_ATOMIC_FETCH_ADD]    = hca_shm_atomic,
    [HCA_WR_ATOMIC_CMP_SWP]      = hca_shm_atomic,
    [HCA_WR_ATOMIC_SWAP]         = hca_shm_atomic,
    [HCA_WR_ATOMIC_FETCH_AND]    = hca_shm_atomic,
    [HCA_WR_ATOMIC_FETCH_OR]     = hca_shm_atomic,
    [HCA_WR_ATOMIC_FETCH_XOR]    = hca_shm_atomic,
    [HCA_WR_ATOMIC_ADD]          = hca_shm_atomic,
    [HCA_WR_ATOMIC_AND]          = hca_shm_atomic,
    [HCA_WR_ATOMIC_OR]           = hca_shm_atomic,
    [HCA_WR_ATOMIC_XOR]          = hca_shm_atomic,
};

hca_exec_t hca_shm_exec(hca_qp_t *qp, hca_wqe_t *wqe,
                        hca_wc_status_t *status_p)
{
    hca_qp_pub_t *pub;

    *status_p = hca_shm_target(qp, &pub);
    if (HCA_UNLIKELY(*status_p != HCA_WC_SUCCESS)) {
        return HCA_EXEC_DONE;
    }
    return hca_shm_exec_op[wqe->opcode](qp, wqe, pub, status_p);
}

hca_exec_t hca_shm_poll_response(hca_qp_t *qp, hca_wqe_t *wqe,
                                 hca_wc_status_t *status_p)
{
    return hca_resp_slot_poll(qp, wqe, status_p);
}

int hca_shm_response_ready(const hca_qp_t *qp, const hca_wqe_t *wqe)
{
    return hca_resp_slot_ready(qp, wqe);
}
