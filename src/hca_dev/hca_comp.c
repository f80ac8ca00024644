/*
 * hca_comp.c - the completer engine: the ISSUED -> DONE transition of the
 * requester's WQEs (hca_req.c), when the fabric has their response.  The
 * done WQEs become CQEs in post order (hca_qp_report_sq).
 */
#include "hca_obj.h"
#include "hca_state.h"
#include "hca_engine.h"

void hca_comp_poll_responses(hca_qp_t *qp)
{
    for (uint64_t s = qp->sq_tail; (s != qp->sq_exec) && qp->n_issued; ++s) {
        hca_wqe_t *wqe = &qp->sq[s & qp->sq_mask];
        hca_wc_status_t status;

        if ((wqe->state == HCA_WQE_ISSUED) &&
            (qp->fabric->poll_response(qp, wqe, &status) == HCA_EXEC_DONE)) {
            qp->n_issued--;
            hca_wqe_done(qp, wqe, status);
        }
        if (qp->state == HCA_QPS_ERR) {
            return;
        }
    }
}
