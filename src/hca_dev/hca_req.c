/*
 * hca_req.c - the requester engine: runs the send queue in post order.
 *
 * Each WQE at sq_exec is handed to the fabric's exec(): intra-host writes,
 * reads and atomics usually finish right there (DONE); what needs the
 * peer's help is ISSUED and execution moves on; a WQE that could move
 * only part of its data (PARTIAL) or found no room (BUSY) stays at the
 * head, so SENDs keep their order.  A FENCE'd WQE waits until nothing
 * issued before it is outstanding.
 */
#include "hca_priv.h"

#include <errno.h>

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

/* Nothing moved for a while: is the peer still there?  Checked at most
 * every HCA_PEER_CHECK_NS so the common path stays syscall-free. */
static void hca_req_check_stall(hca_qp_t *qp, int progressed)
{
    uint64_t now;

    if (progressed || ((qp->n_issued == 0) && (qp->sq_exec == qp->sq_head))) {
        qp->wait_start = 0;
        return;
    }
    now = hca_now_ns();
    if (qp->wait_start == 0) {
        qp->wait_start = now;
    } else if (now - qp->wait_start > HCA_PEER_CHECK_NS) {
        qp->wait_start = now;
        hca_qp_check_peer(qp);
    }
}

int hca_req_progress(hca_qp_t *qp)
{
    const hca_fabric_ops_t *fabric = &hca_fabric_shm;
    uint64_t tail_before = qp->sq_tail, exec_before = qp->sq_exec;
    int rc = 0;

    if (qp->n_issued != 0) {
        hca_comp_poll_responses(qp);
    }
    while ((qp->sq_exec != qp->sq_head) && (qp->state == HCA_QPS_RTS)) {
        hca_wqe_t *wqe = &qp->sq[qp->sq_exec & qp->sq_mask];
        hca_exec_t res;

        if ((wqe->state == HCA_WQE_POSTED) && (wqe->flags & HCA_SEND_FENCE) &&
            (qp->n_issued != 0)) {
            break;
        }
        res = fabric->exec(qp, wqe);
        if (res == HCA_EXEC_ISSUED) {
            wqe->state = HCA_WQE_ISSUED;
            qp->n_issued++;
        } else if (res == HCA_EXEC_PARTIAL) {
            break;
        } else if (res == HCA_EXEC_BUSY) {
            rc = -EAGAIN;
            break;
        }
        if (qp->state != HCA_QPS_RTS) {
            break; /* the WQE failed: everything was flushed */
        }
        qp->sq_exec++;
    }
    hca_comp_report(qp);
    hca_cq_mark_busy(qp);
    if (qp->sq_tail != qp->sq_head) {
        hca_req_check_stall(qp, (qp->sq_tail != tail_before) ||
                                (qp->sq_exec != exec_before));
    }
    return rc;
}
