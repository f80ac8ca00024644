/*
 * hca_ring.h - the multi-producer single-consumer ring of the shm fabric
 * (receive rings and the service ring).  Layout in hca_wire.h.
 *
 * Every slot starts with a 64-bit stamp: a slot at ring index i is
 * published when its stamp equals i + 1.  This is the owner mark of the
 * slot for the wrap it belongs to, so a stale slot of an earlier wrap is
 * never mistaken for a new one.  Between its claim and its publish the
 * stamp names the producer: its claim mark (HCA_STAMP_CLAIMED, its pid
 * and the low bits of its start time, which tell it from a later process
 * with the same pid) | the low 16 bits of i + 1.  A producer killed while
 * it writes the slot would otherwise block the ring for good; its
 * consumer can tell it from a slow one (hca_ring_claim_at_tail).
 */
#ifndef HCA_RING_H
#define HCA_RING_H

#include "hca_wire.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* A consumer that is about to sleep sets this bit of head (only while
 * head == tail: nothing claimed and not consumed).  The producer whose
 * claim clears it wakes the consumer after publishing: the claim itself
 * tells it, so the send path needs no fence and no extra shared load. */
#define HCA_RING_ARMED (1ull << 63)

/* A local view of a ring; geometry copied from the validated header so a
 * peer cannot change it under us. */
typedef struct hca_ring {
    hca_ring_hdr_t  *hdr;
    uint8_t         *slots;       /* first slot */
    uint32_t         mask;        /* slots - 1 */
    uint32_t         slot_size;
    _Atomic uint64_t cached_tail; /* producers: a tail seen earlier; tail
                                     only grows, so while head stays below
                                     it + slots the consumer's tail line
                                     need not be read (mm's cached tail) */
    uint64_t         claim_mark;  /* ours (hca_claim_mark), 0: unnamed */
} hca_ring_t;

/* A claim mark: bit 63, pid in bits 41-62 (pid_max <= 2^22), the low 25
 * bits of its start time (clock ticks since boot) in bits 16-40. */
#define HCA_STAMP_CLAIMED (1ull << 63)

static inline uint64_t hca_claim_mark(uint32_t pid, uint64_t start_time)
{
    return HCA_STAMP_CLAIMED | ((uint64_t)(pid & 0x3fffffu) << 41) |
           ((start_time & 0x1ffffffull) << 16);
}

static inline void hca_ring_attach(hca_ring_t *ring, void *base,
                                   uint32_t slots, uint32_t slot_size)
{
    ring->hdr       = (hca_ring_hdr_t*)base;
    ring->slots     = (uint8_t*)base + sizeof(hca_ring_hdr_t);
    ring->mask      = slots - 1;
    ring->slot_size = slot_size;
    ring->claim_mark = 0;
    atomic_init(&ring->cached_tail, 0);
}

static inline size_t hca_ring_bytes(uint32_t slots, uint32_t slot_size)
{
    return sizeof(hca_ring_hdr_t) + (size_t)slots * slot_size;
}

/* Owner, once, before anyone maps it. */
static inline void hca_ring_init(hca_ring_t *ring, void *base,
                                 uint32_t slots, uint32_t slot_size,
                                 uint32_t notify_idx)
{
    hca_ring_attach(ring, base, slots, slot_size);
    ring->hdr->magic      = HCA_WIRE_MAGIC;
    ring->hdr->version    = HCA_WIRE_VERSION;
    ring->hdr->slots      = slots;
    ring->hdr->slot_size  = slot_size;
    atomic_init(&ring->hdr->notify_idx, notify_idx);
    atomic_init(&ring->hdr->head, 0);
    atomic_init(&ring->hdr->tail, 0);
}

static inline void *hca_ring_slot(const hca_ring_t *ring, uint64_t idx)
{
    return ring->slots + (size_t)(idx & ring->mask) * ring->slot_size;
}

/* Producer (any process): claims one slot.  Returns 0 with *idx_p, or
 * -EAGAIN when the ring is full; *wake_p is set when the consumer sleeps
 * and this producer must wake it after publishing.  The CAS orders
 * claims; the acquire load of tail pairs with the consumer's release in
 * hca_ring_release() (the cached copy is passed on with release/acquire
 * between threads of this process). */
static inline int hca_ring_claim(hca_ring_t *ring, uint64_t *idx_p,
                                 int *wake_p)
{
    uint64_t head = atomic_load_explicit(&ring->hdr->head,
                                         memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&ring->cached_tail,
                                         memory_order_acquire);
    unsigned reloads = 0;
    for (;;) {
        uint64_t h = head & ~HCA_RING_ARMED;
        if (h - tail > ring->mask) {
            /* looks full (or tail is stale): read the real one */
            tail = atomic_load_explicit(&ring->hdr->tail,
                                        memory_order_acquire);
            atomic_store_explicit(&ring->cached_tail, tail,
                                  memory_order_release);
            if ((int64_t)(h - tail) < 0) {
                /* our head is older than the tail others moved: reload
                 * (a bounded number of times: an owner that wrote a tail
                 * beyond head must not hang us) */
                if (++reloads > 64) {
                    return -EAGAIN;
                }
                head = atomic_load_explicit(&ring->hdr->head,
                                            memory_order_relaxed);
                continue;
            }
            if (h - tail > ring->mask) {
                return -EAGAIN;
            }
        }
        if (atomic_compare_exchange_weak_explicit(&ring->hdr->head, &head,
                                                  h + 1,
                                                  memory_order_seq_cst,
                                                  memory_order_relaxed)) {
            /* who writes it, until the publish (same line as the data) */
            if (ring->claim_mark != 0) {
                atomic_store_explicit(
                        (_Atomic uint64_t*)hca_ring_slot(ring, h),
                        ring->claim_mark | ((h + 1) & 0xffffu),
                        memory_order_relaxed);
            }
            *idx_p  = h;
            *wake_p = (head & HCA_RING_ARMED) != 0;
            return 0;
        }
    }
}

/* Consumer: about to sleep.  0 when armed (the next claim wakes it),
 * -EAGAIN when something is claimed or published and not consumed.
 * stuck: the consumer cannot take the message at tail until its own
 * caller acts (no receive posted for it): then the published messages
 * behind it wait too, and it may sleep on them; not while a slot is
 * claimed and unpublished, whose producer read head before the armed bit
 * and would not wake it. */
static inline int hca_ring_arm(hca_ring_t *ring, int stuck)
{
    uint64_t tail   = atomic_load_explicit(&ring->hdr->tail,
                                           memory_order_relaxed);
    uint64_t head   = atomic_load(&ring->hdr->head);
    uint64_t h      = head & ~HCA_RING_ARMED;
    uint64_t expect = h;

    if (h != tail) {
        if (!stuck || (h - tail > (uint64_t)ring->mask + 1)) {
            return -EAGAIN;
        }
        for (uint64_t i = tail; i != h; ++i) {
            if (atomic_load_explicit(
                        (_Atomic uint64_t*)hca_ring_slot(ring, i),
                        memory_order_acquire) != i + 1) {
                return -EAGAIN;
            }
        }
    }
    /* a claim after the scan moved head: the CAS fails */
    if (atomic_compare_exchange_strong(&ring->hdr->head, &expect,
                                       h | HCA_RING_ARMED)) {
        return 0;
    }
    return (expect == (h | HCA_RING_ARMED)) ? 0 : -EAGAIN;
}

/* Consumer: awake again (a producer may have cleared the bit already). */
static inline void hca_ring_disarm(hca_ring_t *ring)
{
    uint64_t head = atomic_load(&ring->hdr->head);

    while ((head & HCA_RING_ARMED) &&
           !atomic_compare_exchange_weak(&ring->hdr->head, &head,
                                         head & ~HCA_RING_ARMED)) {
    }
}

/* Producer: makes slot idx visible (release: its contents first). */
static inline void hca_ring_publish(hca_ring_t *ring, uint64_t idx)
{
    _Atomic uint64_t *stamp = (_Atomic uint64_t*)hca_ring_slot(ring, idx);
    atomic_store_explicit(stamp, idx + 1, memory_order_release);
}

/* Consumer (the owner, one thread): the slot at tail if published, else
 * NULL.  Acquire pairs with hca_ring_publish(). */
static inline void *hca_ring_peek(hca_ring_t *ring, uint64_t *idx_p)
{
    uint64_t tail = atomic_load_explicit(&ring->hdr->tail,
                                         memory_order_relaxed);
    void *slot    = hca_ring_slot(ring, tail);
    if (atomic_load_explicit((_Atomic uint64_t*)slot,
                             memory_order_acquire) != tail + 1) {
        return NULL;
    }
    *idx_p = tail;
    return slot;
}

/* Consumer: done with the slot at idx (== tail); frees it for producers. */
static inline void hca_ring_release(hca_ring_t *ring, uint64_t idx)
{
    atomic_store_explicit(&ring->hdr->tail, idx + 1, memory_order_release);
}

/* Consumer, now and then while nothing is published at tail: 1 with
 * the claim mark of the slot at tail (*mark_p) if a producer claimed it
 * and has not published it.  If that producer is gone (hca_claimer_gone)
 * the consumer releases the slot unread.  A producer killed between its
 * claim and its stamp (two instructions) is not seen. */
static inline int hca_ring_claim_at_tail(hca_ring_t *ring, uint64_t *mark_p)
{
    uint64_t tail = atomic_load_explicit(&ring->hdr->tail,
                                         memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&ring->hdr->head,
                                         memory_order_relaxed);
    uint64_t s;

    if ((head & ~HCA_RING_ARMED) == tail) {
        return 0;
    }
    s = atomic_load_explicit((_Atomic uint64_t*)hca_ring_slot(ring, tail),
                             memory_order_acquire);
    if (!(s & HCA_STAMP_CLAIMED) || ((s & 0xffffu) != ((tail + 1) & 0xffffu))) {
        return 0; /* published, or not stamped yet */
    }
    *mark_p = s & ~0xffffull;
    return 1;
}

/* Anyone: nothing published at tail (may be stale by the time it returns). */
static inline int hca_ring_empty(hca_ring_t *ring)
{
    uint64_t idx;
    return hca_ring_peek(ring, &idx) == NULL;
}

#endif
