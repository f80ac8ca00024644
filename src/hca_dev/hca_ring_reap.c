/*
 * hca_ring_reap.c - a ring consumer's reaper: gives back the slot at its
 * tail when the producer that claimed it can never publish it, so that
 * one killed producer does not stop the ring for everyone behind it.
 *
 * Two cases (hca_ring.h): the slot names its producer and that producer
 * is gone; or the slot was claimed (head passed it) and never stamped,
 * which a producer killed between its head CAS and its stamp CAS leaves.
 * The second cannot be told from a producer that is merely not running
 * there, so it is reaped only after HCA_RING_UNSTAMPED_NS; a live
 * producer that then finds its slot reaped claims another, having
 * written nothing, so being wrong costs nothing but that wait.
 */
#include "hca_util.h"
#include "hca_base.h"
#include "hca_ring.h"

/* Long against the two instructions between a producer's CASes, short
 * against what the messages behind the slot may wait. */
#define HCA_RING_UNSTAMPED_NS (50ull * 1000000ull)

int hca_ring_reap_dead_claim(hca_ring_t *ring, hca_ring_watch_t *watch)
{
    uint64_t tail, mark;

    switch (hca_ring_claim_at_tail(ring, &mark)) {
    case HCA_RING_TAIL_NAMED:
        /* a dead producer stamps nothing more; the CAS fails only if the
         * stamp changed since we read it */
        return hca_claimer_gone(mark) && hca_ring_reap(ring, mark);
    case HCA_RING_TAIL_UNSTAMPED:
        tail = atomic_load_explicit(&ring->hdr->tail, memory_order_relaxed);
        return (hca_ring_unstamped_for(watch, tail, mark, hca_coarse_ns()) >=
                HCA_RING_UNSTAMPED_NS) &&
               hca_ring_reap(ring, mark);
    default:
        return 0;
    }
}
