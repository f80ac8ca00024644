/*
 * hca_shm_fence.h - the requester's side of the access fence
 * (hca_shm_fence.c): announce an access in the QP's busy word, mark
 * the MPT entry, check, access, end.  Inline: the direct paths run it on
 * every call.
 */
#ifndef HCA_ACCESS_FENCE_H
#define HCA_ACCESS_FENCE_H

#include "hca_shm_fabric.h"

/* How this context's accesses to a peer's memory are fenced against its
 * deregistrations (peer->access_mode). */
enum {
    HCA_ACCESS_UNKNOWN = 0,
    HCA_ACCESS_BUSY,           /* busy word; the owner runs membarrier */
    HCA_ACCESS_BUSY_FENCED,    /* busy word + a full fence of our own */
    HCA_ACCESS_RESPONDER       /* its mapper table is full: its responder
                                  thread accesses for us */
};

int hca_access_mode_slow(hca_device_t *dev, hca_peer_t *peer);

HCA_INLINE int hca_access_mode(hca_device_t *dev, hca_peer_t *peer)
{
    int mode = atomic_load_explicit(&peer->access_mode,
                                    memory_order_acquire);

    return HCA_LIKELY(mode != HCA_ACCESS_UNKNOWN) ? mode :
           hca_access_mode_slow(dev, peer);
}

/* busy = 1, ordered before the entry's check that follows. */
HCA_INLINE void hca_access_announce(hca_qp_t *qp, int mode)
{
    atomic_store_explicit(&qp->dev->busy[qp->index].busy, 1,
                          memory_order_relaxed);
    if (HCA_LIKELY(mode == HCA_ACCESS_BUSY)) {
        atomic_signal_fence(memory_order_seq_cst); /* the owner's
                                                      membarrier fences */
    } else {
        atomic_thread_fence(memory_order_seq_cst);
    }
}

HCA_INLINE void hca_access_end(hca_qp_t *qp)
{
    atomic_store_explicit(&qp->dev->busy[qp->index].busy, 0,
                          memory_order_release);
}

/* Names our mapper slot in the entry, so that its deregistration waits for
 * us, and (unfenced) that our busy store relies on its membarrier.
 * Stores only the first time: later accesses find them there. */
HCA_INLINE void hca_access_mark(hca_mpt_entry_t *entry, uint32_t slot,
                                int unfenced)
{
    uint32_t mine = slot + 1;
    uint32_t seen = atomic_load(&entry->accessors);

    if (HCA_UNLIKELY((seen != mine) && (seen != HCA_MPT_ACCESSORS_MANY)) &&
        ((seen != 0) ||
         !atomic_compare_exchange_strong(&entry->accessors, &seen, mine))) {
        atomic_store(&entry->accessors, HCA_MPT_ACCESSORS_MANY);
    }
    if (unfenced && HCA_UNLIKELY(!atomic_load(&entry->unfenced))) {
        atomic_store(&entry->unfenced, 1);
    }
}


#endif
