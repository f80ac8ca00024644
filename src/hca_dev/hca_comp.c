/*
 * hca_comp.c - the completer: turns responses into done WQEs and done WQEs
 * into CQEs, in post order (a CQE of a signalled WR also completes every
 * unsignalled WR before it, as on verbs).
 */
#include "hca_priv.h"

void hca_comp_poll_responses(hca_qp_t *qp)
{
    for (uint64_t s = qp->sq_tail; (s != qp->sq_exec) && qp->n_issued; ++s) {
        hca_wqe_t *wqe = &qp->sq[s & qp->sq_mask];

        if ((wqe->state == HCA_WQE_ISSUED) &&
            (hca_fabric_shm.poll_response(qp, wqe) == HCA_EXEC_DONE)) {
            qp->n_issued--;
        }
        if (qp->state == HCA_QPS_ERR) {
            return;
        }
    }
}

void hca_comp_report(hca_qp_t *qp)
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
