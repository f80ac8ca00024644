/*
 * hca_req.c - the requester engine: runs the send queue in post order.
 *
 * Each WQE is a small state machine (hca_wqe_state_t):
 *
 *   POSTED  --exec: DONE-->    DONE     (completed inside the fabric)
 *           --exec: ISSUED-->  ISSUED   (the peer answers later: hca_comp.c)
 *           --exec: PARTIAL--> PARTIAL  (some data moved, more to come)
 *           --exec: BUSY-->    POSTED   (no room at the peer, nothing done)
 *   PARTIAL --exec-->          DONE | ISSUED | PARTIAL
 *   ISSUED  --response-->      DONE
 *
 * The WQE at sq_exec is stepped; DONE and ISSUED let execution move on, a
 * PARTIAL or BUSY one stays at the head so that SENDs keep their order.  A
 * FENCE'd WQE waits until nothing issued before it is outstanding.  The
 * local checks (SGEs against our MPT) run once, on POSTED; the counters of
 * an executed WR are kept here, whichever fabric ran it.
 */
#include "hca_util.h"
#include "hca_log.h"
#include "hca_base.h"
#include "hca_obj.h"
#include "hca_mpt.h"
#include "hca_queue.h"
#include "hca_counters.h"
#include "hca_state.h"
#include "hca_engine.h"

#include <errno.h>

const char *const hca_wqe_state_name[] = {
    [HCA_WQE_POSTED]  = "POSTED",
    [HCA_WQE_PARTIAL] = "PARTIAL",
    [HCA_WQE_ISSUED]  = "ISSUED",
    [HCA_WQE_DONE]    = "DONE",
};

/* HCA_TRACE=1: every transition on stderr (the engines' debug aid). */
static HCA_NOINLINE void hca_req_trace(const hca_qp_t *qp,
                                       const hca_wqe_t *wqe,
                                       hca_wqe_state_t from,
                                       hca_wqe_state_t to)
{
    hca_log("qp 0x%x wqe %u %s: %s -> %s (%s)", qp->qpn,
            (unsigned)(wqe - qp->sq), hca_opcode[wqe->opcode].name,
            hca_wqe_state_name[from], hca_wqe_state_name[to],
            hca_wc_status_str((hca_wc_status_t)wqe->status));
}

/* The send queue holds WQEs: if nothing moved and some wait for the
 * peer, the QP's liveness timer runs (a dead peer moves the QP to ERR). */
static void hca_req_check_stall(hca_qp_t *qp, int progressed)
{
    if (progressed || ((qp->n_issued == 0) && (qp->sq_exec == qp->sq_head))) {
        hca_qp_progressed(qp);
        return;
    }
    (void)hca_qp_stalled(qp);
}

static void hca_req_count(hca_qp_t *qp, const hca_wqe_t *wqe)
{
    if (hca_opcode[wqe->opcode].flags & HCA_OPF_ATOMIC) {
        hca_count_tx(qp, wqe->opcode,
                     (wqe->flags & HCA_SEND_ATOMIC32) ? 4 : 8);
    } else {
        hca_count_tx(qp, wqe->opcode, wqe->length);
    }
}

/* One step of the WQE at the head of execution: its next state; *res_p
 * what the fabric said. */
static hca_wqe_state_t hca_req_step(hca_qp_t *qp, hca_wqe_t *wqe,
                                    hca_exec_t *res_p)
{
    const hca_opcode_info_t *info = &hca_opcode[wqe->opcode];
    hca_wc_status_t status        = HCA_WC_SUCCESS;
    hca_exec_t res;

    if ((wqe->state == HCA_WQE_POSTED) && !(wqe->flags & HCA_SEND_INLINE)) {
        status = hca_sge_check(qp->dev, qp->pd->handle, wqe->sge,
                               (int)wqe->num_sge,
                               (info->flags & (HCA_OPF_READ | HCA_OPF_FETCH)) ?
                               HCA_ACCESS_LOCAL_WRITE : 0);
        if (HCA_UNLIKELY(status != HCA_WC_SUCCESS)) {
            hca_wqe_done(qp, wqe, status);
            return HCA_WQE_DONE;
        }
    }
    res    = qp->fabric->exec(qp, wqe, &status);
    *res_p = res;
    switch (res) {
    case HCA_EXEC_DONE:
        if ((status == HCA_WC_SUCCESS) &&
            ((wqe->done == 0) || (wqe->done == wqe->length))) {
            hca_req_count(qp, wqe);
        }
        hca_wqe_done(qp, wqe, status);
        return HCA_WQE_DONE;
    case HCA_EXEC_ISSUED:
        if ((wqe->done == 0) || (wqe->done == wqe->length)) {
            hca_req_count(qp, wqe);
        }
        return HCA_WQE_ISSUED;
    case HCA_EXEC_PARTIAL:
        return HCA_WQE_PARTIAL;
    case HCA_EXEC_BUSY:
    case HCA_EXEC_WAIT:
    default:
        return (hca_wqe_state_t)wqe->state; /* nothing done */
    }
}

int hca_req_progress(hca_qp_t *qp)
{
    uint64_t tail_before = qp->sq_tail, exec_before = qp->sq_exec;
    int rc = 0;

    if (qp->n_issued != 0) {
        hca_comp_poll_responses(qp);
    }
    while ((qp->sq_exec != qp->sq_head) && (qp->state == HCA_QPS_RTS)) {
        hca_wqe_t *wqe       = &qp->sq[qp->sq_exec & qp->sq_mask];
        hca_wqe_state_t from = (hca_wqe_state_t)wqe->state, to;
        hca_exec_t res       = HCA_EXEC_DONE;

        if ((from == HCA_WQE_POSTED) && (wqe->flags & HCA_SEND_FENCE) &&
            (qp->n_issued != 0)) {
            break;
        }
        to = hca_req_step(qp, wqe, &res);
        if (HCA_UNLIKELY(qp->dev->trace)) {
            hca_req_trace(qp, wqe, from, to);
        }
        if (to == HCA_WQE_ISSUED) {
            wqe->state = HCA_WQE_ISSUED;
            qp->n_issued++;
        } else if (to == HCA_WQE_PARTIAL) {
            wqe->state = HCA_WQE_PARTIAL;
            break;
        } else if (to != HCA_WQE_DONE) {
            /* BUSY: the caller may take it back; WAIT: it stays */
            rc = (res == HCA_EXEC_WAIT) ? 0 : -EAGAIN;
            break;
        }
        if (qp->state != HCA_QPS_RTS) {
            break; /* the WQE failed: everything was flushed */
        }
        qp->sq_exec++;
    }
    hca_qp_report_sq(qp);
    if (qp->sq_tail != qp->sq_head) {
        hca_req_check_stall(qp, (qp->sq_tail != tail_before) ||
                                (qp->sq_exec != exec_before));
    }
    return rc;
}
