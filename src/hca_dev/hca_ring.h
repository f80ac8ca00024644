/*
 * hca_ring.h - the multi-producer single-consumer ring of the shm fabric
 * (receive rings and the service ring).  Layout in hca_wire.h.
 *
 * Every slot starts with a 64-bit stamp: a slot at ring index i is
 * published when its stamp equals i + 1.  This is the owner mark of the
 * slot for the wrap it belongs to, so a stale slot of an earlier wrap is
 * never mistaken for a new one.
 *
 * Who writes a slot between its claim and its publish is kept apart from
 * it, in the ring's owner words (one per slot, after the slots): the
 * producer's claim mark (HCA_STAMP_CLAIMED, its pid and the low bits of
 * its start time, which tell it from a later process with the same pid)
 * | the low 16 bits of i + 1.  A producer killed while it writes the slot
 * would otherwise block the ring for good; its consumer can tell it from
 * a slow one (hca_ring_claim_at_tail) and frees the slot (hca_ring_reap).
 *
 * A producer names itself with a CAS on the owner word after its head
 * CAS, and writes the slot only if that CAS wins.  A slot claimed (head
 * moved past it) and never named is one whose producer was killed
 * between its two CASes, or is not running: its consumer takes it after
 * a while with a CAS of the owner word to the reaped mark.  A producer
 * that finds its slot reaped claims another; it wrote nothing yet, so
 * nothing is lost either way.  The owner words lie on lines the consumer
 * does not poll, so the CAS finds its line in the producer's cache (a
 * CAS on the slot's stamp, which the consumer spins on, cost 40 % of
 * small-message bandwidth).
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
    _Atomic uint64_t *owner;      /* a word per slot: who writes it */
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

/* The owner word of slot idx taken back by its consumer: claimed by pid
 * 0, which no producer has.  Only hca_ring_reap writes it, and the words
 * a slot held one wrap earlier differ in their low 16 bits. */
static inline uint64_t hca_ring_reaped_mark(uint64_t idx)
{
    return HCA_STAMP_CLAIMED | ((idx + 1) & 0xffffu);
}

/* A consumer's note of the unnamed claim at its tail
 * (hca_ring_unstamped_for): which slot, the owner word it held, since
 * when. */
typedef struct hca_ring_watch {
    uint64_t idx1;     /* ring index + 1; 0: none */
    uint64_t stamp;
    uint64_t since_ns;
} hca_ring_watch_t;

/* Where the owner words start: after the slots, on a line of their own. */
static inline size_t hca_ring_owner_offset(uint32_t slots, uint32_t slot_size)
{
    size_t end = sizeof(hca_ring_hdr_t) + (size_t)slots * slot_size;

    return (end + HCA_CACHE_LINE - 1) & ~(size_t)(HCA_CACHE_LINE - 1);
}

static inline void hca_ring_attach(hca_ring_t *ring, void *base,
                                   uint32_t slots, uint32_t slot_size)
{
    ring->hdr       = (hca_ring_hdr_t*)base;
    ring->slots     = (uint8_t*)base + sizeof(hca_ring_hdr_t);
    ring->mask      = slots - 1;
    ring->slot_size = slot_size;
    ring->owner     = (_Atomic uint64_t*)((uint8_t*)base +
                                          hca_ring_owner_offset(slots,
                                                                slot_size));
    ring->claim_mark = 0;
    atomic_init(&ring->cached_tail, 0);
}

static inline size_t hca_ring_bytes(uint32_t slots, uint32_t slot_size)
{
    return hca_ring_owner_offset(slots, slot_size) +
           (size_t)slots * sizeof(uint64_t);
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
    for (uint32_t i = 0; i < slots; ++i) {
        atomic_init(&ring->owner[i], 0);
    }
    atomic_init(&ring->hdr->head, 0);
    atomic_init(&ring->hdr->tail, 0);
}

static inline void *hca_ring_slot(const hca_ring_t *ring, uint64_t idx)
{
    return ring->slots + (size_t)(idx & ring->mask) * ring->slot_size;
}

/* Producer, right after its head CAS took slot idx: names itself in the
 * slot's owner word, by a CAS from what it held, so that it and the
 * consumer's reaper cannot both own the slot.  0: the slot is ours to
 * write; -1: its consumer reaped it first (unwritten). */
static inline int hca_ring_stamp_claim(hca_ring_t *ring, uint64_t idx)
{
    _Atomic uint64_t *owner = &ring->owner[idx & ring->mask];
    uint64_t seen = atomic_load_explicit(owner, memory_order_relaxed);
    uint64_t mine;

    if (__builtin_expect(seen == hca_ring_reaped_mark(idx), 0)) {
        return -1;
    }
    /* bit 63 even for a ring nobody named */
    mine = HCA_STAMP_CLAIMED | ring->claim_mark | ((idx + 1) & 0xffffu);
    return atomic_compare_exchange_strong_explicit(
                   owner, &seen, mine, memory_order_relaxed,
                   memory_order_relaxed) ? 0 : -1;
}

/* Producer (any process): claims one slot.  Returns 0 with *idx_p, or
 * -EAGAIN when the ring is full; *wake_p is set (never cleared: callers
 * start it at 0) when the consumer sleeps and this producer must wake it
 * after publishing.  The CAS orders claims; the acquire load of tail pairs with the consumer's release in
 * hca_ring_release() (the cached copy is passed on with release/acquire
 * between threads of this process). */
static inline int hca_ring_claim(hca_ring_t *ring, uint64_t *idx_p,
                                 int *wake_p)
{
    uint64_t head = atomic_load_explicit(&ring->hdr->head,
                                         memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&ring->cached_tail,
                                         memory_order_acquire);
    unsigned reloads = 0, lost = 0;
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
            /* a claim that cleared the armed bit owes the wake, even if
             * its slot is then lost to the reaper */
            *wake_p |= (head & HCA_RING_ARMED) != 0;
            if (__builtin_expect(hca_ring_stamp_claim(ring, h) == 0, 1)) {
                *idx_p = h;
                return 0;
            }
            /* reaped while we were away between the two CASes: that slot
             * is its consumer's now, take the next.  A consumer reaps one
             * slot per 50 ms at most (hca_ring_reap.c): more than a ring of
             * lost slots in one call is an owner that marks them ahead
             * (and moves tail on), which must not keep us here */
            if (++lost > ring->mask) {
                return -EAGAIN;
            }
            head = atomic_load_explicit(&ring->hdr->head,
                                        memory_order_relaxed);
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

/* What hca_ring_claim_at_tail found at tail. */
enum {
    HCA_RING_TAIL_NONE      = 0, /* nothing claimed, or published */
    HCA_RING_TAIL_NAMED     = 1, /* named by a producer: *mark_p is its
                                    owner word, its claim mark */
    HCA_RING_TAIL_UNSTAMPED = 2  /* claimed, not named: *mark_p is the
                                    owner word it still holds */
};

/* Consumer, now and then while nothing is published at tail: whether a
 * producer claimed the slot at tail and has not published it, and who.
 * A named producer that is gone (hca_claimer_gone), or an unnamed claim
 * that stays so (hca_ring_unstamped_for), is reaped (hca_ring_reap). */
static inline int hca_ring_claim_at_tail(hca_ring_t *ring, uint64_t *mark_p)
{
    uint64_t tail = atomic_load_explicit(&ring->hdr->tail,
                                         memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&ring->hdr->head,
                                         memory_order_relaxed);
    uint64_t s;

    if ((head & ~HCA_RING_ARMED) == tail) {
        return HCA_RING_TAIL_NONE;
    }
    if (atomic_load_explicit((_Atomic uint64_t*)hca_ring_slot(ring, tail),
                             memory_order_acquire) == tail + 1) {
        return HCA_RING_TAIL_NONE;
    }
    s = atomic_load_explicit(&ring->owner[tail & ring->mask],
                             memory_order_acquire);
    *mark_p = s;
    if ((s & HCA_STAMP_CLAIMED) && ((s & 0xffffu) == ((tail + 1) & 0xffffu))) {
        return HCA_RING_TAIL_NAMED;
    }
    return HCA_RING_TAIL_UNSTAMPED;
}

/* Consumer: how long (ns) the slot at tail has held the same unstamped
 * claim (stamp), by its watch w; 0 when first seen. */
static inline uint64_t hca_ring_unstamped_for(hca_ring_watch_t *w,
                                              uint64_t tail, uint64_t stamp,
                                              uint64_t now_ns)
{
    if ((w->idx1 != tail + 1) || (w->stamp != stamp)) {
        w->idx1     = tail + 1;
        w->stamp    = stamp;
        w->since_ns = now_ns;
        return 0;
    }
    return now_ns - w->since_ns;
}

/* Consumer: takes the slot at tail, whose owner word still holds owner
 * (a dead producer's claim mark, or what it held before an unnamed
 * claim), and frees it unread.  1 if taken; 0 if its producer named
 * itself meanwhile (the CAS pairs with hca_ring_stamp_claim's). */
static inline int hca_ring_reap(hca_ring_t *ring, uint64_t owner)
{
    uint64_t tail = atomic_load_explicit(&ring->hdr->tail,
                                         memory_order_relaxed);

    if (!atomic_compare_exchange_strong(&ring->owner[tail & ring->mask],
                                        &owner, hca_ring_reaped_mark(tail))) {
        return 0;
    }
    hca_ring_release(ring, tail);
    return 1;
}

/* Anyone: nothing published at tail (may be stale by the time it returns). */
static inline int hca_ring_empty(hca_ring_t *ring)
{
    uint64_t idx;
    return hca_ring_peek(ring, &idx) == NULL;
}

#endif
