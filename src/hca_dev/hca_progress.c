/*
 * hca_progress.c - progress and scheduling: what a poll of a CQ runs.
 *
 * Each CQ has a busy list, the QPs that feed it and have issued or queued
 * WQEs: only those are stepped by the requester, so an idle poll touches
 * the receive rings and the CQ and nothing else.  Then the responder
 * consumes the receive rings of the CQ.  Also the CQ's verbs that depend
 * on that work: poll, arm (nothing pending) and wait.
 */
#include "hca_util.h"
#include "hca_base.h"
#include "hca_registry.h"
#include "hca_obj.h"
#include "hca_queue.h"
#include "hca_state.h"
#include "hca_engine.h"

#include <errno.h>
#include <poll.h>
#include <unistd.h>

/* hca_cq_wait's longest sleep before it looks at its rings' claims */
#define HCA_CQ_WAIT_SLICE_MS 1000

static int hca_qp_busy(const hca_qp_t *qp)
{
    return (qp->n_issued != 0) || (qp->sq_exec != qp->sq_head);
}

void hca_progress_mark_busy(hca_qp_t *qp)
{
    hca_cq_t *cq = qp->send_cq;

    if (!qp->on_busy && hca_qp_busy(qp)) {
        /* room for every attached QP was made at attach */
        cq->busy_qps[cq->n_busy_qps++] = qp;
        qp->on_busy                    = 1;
    }
}

static void hca_cq_busy_del(hca_cq_t *cq, uint32_t i)
{
    cq->busy_qps[i]->on_busy = 0;
    cq->busy_qps[i]          = cq->busy_qps[--cq->n_busy_qps];
}

/* Every 16384 polls, and at each arm that a claimed slot refuses: a slot
 * claimed by a producer that was killed before it published would stop
 * its ring for good (hca_ring_reap.c).  A consumer that waits
 * polls about once per arm, so 16384 polls alone could take it many
 * seconds (each refused arm sleeps 1 ms in hca_cq_wait). */
static HCA_NOINLINE void hca_cq_reap_dead_claims(hca_cq_t *cq)
{
    for (uint32_t i = 0; i < cq->n_rqs; ++i) {
        hca_rq_t *rq = cq->rqs[i];
        while (hca_ring_empty(&rq->ring) &&
               hca_ring_reap_dead_claim(&rq->ring, &rq->unstamped)) {
            __atomic_fetch_add(&cq->dev->svc_cnt->errors[HCA_WC_GENERAL_ERR],
                               1, __ATOMIC_RELAXED);
        }
    }
}

/* The owner polls: counted for the responder thread, which then leaves
 * the service ring to these polls (docs/DEVICE.md); requests in it are
 * served here.  An empty ring costs one load of its tail slot. */
HCA_INLINE void hca_progress_owner_polls(hca_device_t *dev)
{
    atomic_store_explicit(&dev->owner_polls,
                          atomic_load_explicit(&dev->owner_polls,
                                               memory_order_relaxed) + 1,
                          memory_order_relaxed);
    if (HCA_UNLIKELY(atomic_load_explicit(&dev->owner_asleep,
                                          memory_order_relaxed))) {
        atomic_store_explicit(&dev->owner_asleep, 0, memory_order_relaxed);
    }
    /* (a forked child shares the context object, not the memory its
     * requests are for: only the owner itself serves them) */
    if (HCA_UNLIKELY(!hca_ring_empty(&dev->svc)) &&
        ((uint32_t)getpid() == dev->pid)) {
        (void)hca_fabric_serve(dev);
    }
}

/* Only QPs waiting for something are visited: an idle poll touches the
 * receive rings, the service ring's tail and the CQ and nothing else. */
static void hca_progress_cq(hca_cq_t *cq)
{
    hca_progress_owner_polls(cq->dev);
    if (HCA_UNLIKELY(atomic_load_explicit(&cq->dev->fabric_polls,
                                          memory_order_relaxed) != 0)) {
        hca_fabric_poll(cq->dev); /* e.g. tcp: read our sockets ourselves */
    }
    for (uint32_t i = 0; i < cq->n_busy_qps;) {
        hca_qp_t *qp = cq->busy_qps[i];
        hca_req_progress(qp);
        if (!hca_qp_busy(qp)) {
            hca_cq_busy_del(cq, i);
        } else {
            ++i;
        }
    }
    if (HCA_UNLIKELY(cq->dev->fault.ring_stall_ms != 0) &&
        hca_fault_ring_stalled(&cq->dev->fault)) {
        return;
    }
    if (HCA_UNLIKELY((++cq->idle_polls & 16383) == 0)) {
        hca_cq_reap_dead_claims(cq);
    }
    for (uint32_t i = 0; i < cq->n_rqs; ++i) {
        /* partials: their orphans end even when nothing else comes */
        if (!hca_ring_empty(&cq->rqs[i]->ring) ||
            HCA_UNLIKELY(cq->rqs[i]->n_partials > 0)) {
            hca_ingress_poll(cq->rqs[i], 64);
        }
    }
}

int hca_cq_poll(hca_cq_t *cq, int num, hca_wc_t *wc)
{
    hca_progress_cq(cq);
    if (HCA_LIKELY(hca_cq_ring_idle(cq))) {
        return 0;
    }
    return hca_cq_ring_poll(cq, num, wc);
}

/* 1 if something would produce a completion without a peer's signal. */
static int hca_cq_pending(hca_cq_t *cq)
{
    if (cq->prod != cq->cons) {
        return 1;
    }
    for (uint32_t i = 0; i < cq->n_send_qps; ++i) {
        hca_qp_t *qp = cq->send_qps[i];
        /* queued work waits for ring space, which frees without a signal */
        if (qp->sq_exec != qp->sq_head) {
            return 1;
        }
        for (uint64_t s = qp->sq_tail; s != qp->sq_exec; ++s) {
            hca_wqe_t *wqe = &qp->sq[s & qp->sq_mask];
            if ((wqe->state == HCA_WQE_DONE) ||
                ((wqe->state == HCA_WQE_ISSUED) &&
                 qp->fabric->response_ready(qp, wqe))) {
                return 1;
            }
        }
    }
    for (uint32_t i = 0; i < cq->n_rqs; ++i) {
        /* a message that waits for the caller's next receive completes
         * when it is posted (hca_rq_post wakes the armed CQ), not now */
        if (!hca_ring_empty(&cq->rqs[i]->ring) &&
            !hca_rq_waits_recv(cq->rqs[i])) {
            return 1;
        }
    }
    return 0;
}

int hca_cq_arm(hca_cq_t *cq)
{
    /* arm first, then look: a producer that published before the arm is
     * seen here; one that claims a ring slot after it finds the armed bit
     * in the ring's head (and its CQE/response producers see the notify
     * flag: our store is seq_cst, they fence before loading it) */
    if ((hca_cq_set_armed(cq, 1) != 0) || hca_cq_pending(cq) ||
        cq->overflow) {
        hca_cq_set_armed(cq, 0);
        if (!hca_cq_pending(cq) && !cq->overflow) {
            /* only a claimed, unpublished slot refused it: is its
             * producer dead? */
            hca_cq_reap_dead_claims(cq);
        }
        return -EAGAIN;
    }
    if (HCA_UNLIKELY(atomic_load_explicit(&cq->dev->fabric_polls,
                                          memory_order_relaxed) != 0)) {
        hca_fabric_armed(cq->dev); /* e.g. tcp: its thread reads again */
    }
    /* the owner's polls stop: its service ring goes back to the thread */
    atomic_store(&cq->dev->owner_asleep, 1);
    hca_fabric_owner_armed(cq->dev);
    return 0;
}

/* 1 if a producer claimed a slot of one of our rings since the arm (its
 * claim cleared the ring's armed bit; it wakes us after its publish). */
static int hca_cq_claimed_since_arm(hca_cq_t *cq)
{
    for (uint32_t i = 0; i < cq->n_rqs; ++i) {
        if (!(atomic_load(&cq->rqs[i]->ring.hdr->head) & HCA_RING_ARMED)) {
            return 1;
        }
    }
    return 0;
}

int hca_cq_wait(hca_cq_t *cq, int timeout_ms)
{
    struct pollfd pfd = {.fd = cq->sock, .events = POLLIN};
    int rc;

    if (hca_cq_arm(cq) == -EAGAIN) {
        if (hca_cq_pending(cq) || cq->overflow) {
            return 1;
        }
        /* only ring slots claimed before the arm and not yet published:
         * their producers will not wake us, so look again soon */
        rc = poll(&pfd, 1, ((timeout_ms >= 0) && (timeout_ms < 1)) ?
                           timeout_ms : 1);
        hca_cq_ack_events(cq);
        return (rc > 0) ? 1 : hca_cq_pending(cq);
    }
    /* a producer killed between the claim that cleared an armed bit and
     * its wakeup never wakes us: a long sleep looks each second whether a
     * claim came and no wakeup; then the caller polls, and its next arm
     * finds the claim (and reaps it if its producer is gone) */
    for (;;) {
        int slice = ((timeout_ms < 0) || (timeout_ms > HCA_CQ_WAIT_SLICE_MS)) ?
                    HCA_CQ_WAIT_SLICE_MS : timeout_ms;
        rc = poll(&pfd, 1, slice);
        if (timeout_ms > 0) {
            timeout_ms -= slice;
        }
        if ((rc != 0) || (timeout_ms == 0)) {
            break;
        }
        if (hca_cq_claimed_since_arm(cq)) {
            rc = 1; /* not a timeout: the caller polls and waits again */
            break;
        }
    }
    hca_cq_set_armed(cq, 0);
    hca_cq_ack_events(cq);
    return (rc > 0) ? 1 : hca_cq_pending(cq);
}

