/*
 * hca_rcache.c - the md's registration cache (see hca_rcache.h for its
 * semantics and why it is not ucs_rcache).
 *
 * Entries come from one array made at creation: a hit or a put allocates
 * nothing (a put with INVALIDATE allocates its completion's record).  A
 * region is LIVE (in the hash: found by its start address), INVALIDATED
 * (out of the hash by UCT_MD_MEM_DEREG_FLAG_INVALIDATE, its key still
 * valid for the users that hold it) or REVOKED (out of the hash, its key
 * revoked: unmapped, but still held by a user or not yet deregistered).
 * Idle LIVE regions wait in the LRU list; idle INVALIDATED and REVOKED
 * ones in the dead list, which any later call deregisters (the memory hook
 * may not: hca_mr_dereg takes the device's lock and frees).
 *
 * The lock is a spinlock: the memory hook runs in whichever thread unmaps,
 * and nothing under the lock allocates, frees, maps or unmaps (so a hook
 * cannot fire inside it on the same thread).
 */
#include "hca_uct.h"

#include <ucm/api/ucm.h>
#include <ucs/debug/log.h>
#include <ucs/sys/math.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

/* What UCX's IB md uses: after the allocator's own handlers */
#define UCT_HCA_RCACHE_EVENT_PRIO 1000

/* Whether a region in use takes more users (registrations of its range).
 * UCP 1.13 registers each request's buffer with the md itself: requests of
 * one buffer share a region here, and an INVALIDATE completion waits for
 * the last of them (ucp_request_dt_invalidate gives the request's own
 * completion and waits for it).  Later UCPs put their own rcache in front
 * (one registration per UCP region) and give INVALIDATE a completion on
 * the stack that must have been invoked when uct_md_mem_dereg_v2 returns
 * (ucp_memh_dereg in 1.18 and 1.22: "ucs_assert(comp.count == 1)"); a
 * second user of a region - UCP's new region over the same range while
 * the invalidated one is still held - would defer it into a dead frame.
 * There, a region in use has one user, so INVALIDATE completes in the
 * call.  1.14 to 1.17 were not checked: they get the safe side. */
#define UCT_HCA_RCACHE_SHARE_IN_USE (!UCT_HCA_UCX_AT_LEAST(1, 14))

enum {
    UCT_HCA_RCACHE_FREE,        /* on the free list, no MR */
    UCT_HCA_RCACHE_LIVE,        /* hashed; idle ones on the LRU list */
    UCT_HCA_RCACHE_INVALIDATED, /* unhashed by INVALIDATE, key still valid
                                   for its holders; goes at the last put */
    UCT_HCA_RCACHE_REVOKED      /* unhashed, key revoked; idle: dead list */
};

/* A completion of a deregistration with UCT_MD_MEM_DEREG_FLAG_INVALIDATE,
 * invoked once the region is deregistered (as ucs_rcache's comp_list). */
typedef struct uct_hca_rcache_comp {
    struct uct_hca_rcache_comp *next;
    uct_completion_t           *comp;
} uct_hca_rcache_comp_t;

struct uct_hca_rcache_entry {
    uct_hca_memh_t          memh;   /* UCP's handle: memh.entry == this */
    uintptr_t               start;
    uintptr_t               end;
    unsigned                refs;   /* users (uct_md_mem_reg) holding it */
    int                     state;
    uct_hca_rcache_entry_t *next;   /* hash chain, or free/reap list */
    ucs_list_link_t         list;   /* LRU or dead list, while idle */
    uct_hca_rcache_comp_t  *comps;  /* INVALIDATE completions, in order */
};

struct uct_hca_rcache {
    pthread_spinlock_t       lock;
    hca_pd_t                *pd;
    unsigned                 access;
    unsigned                 max_regions;
    size_t                   max_bytes;
    uct_hca_rcache_entry_t  *entries;   /* max_regions of them */
    uct_hca_rcache_entry_t  *free;
    uct_hca_rcache_entry_t **hash;
    unsigned                 hash_mask;
    ucs_list_link_t          lru;       /* idle LIVE, oldest first */
    ucs_list_link_t          dead;      /* idle REVOKED */
    _Atomic uintptr_t        lo, hi;    /* covers every LIVE region */
    unsigned                 fork_gen;  /* uct_hca_rcache_forks at creation */
    uct_hca_rcache_stats_t   stats;     /* regions/bytes: with an MR */
};

/* Counts forks in this process's line: a cache made before the last fork
 * belongs to the parent. */
static _Atomic unsigned uct_hca_rcache_forks;
static pthread_once_t   uct_hca_rcache_atfork_once = PTHREAD_ONCE_INIT;

static void uct_hca_rcache_atfork_child(void)
{
    atomic_fetch_add(&uct_hca_rcache_forks, 1);
}

static void uct_hca_rcache_atfork_init(void)
{
    pthread_atfork(NULL, NULL, uct_hca_rcache_atfork_child);
}

static inline unsigned uct_hca_rcache_hash(const uct_hca_rcache_t *rc,
                                           uintptr_t start)
{
    return (unsigned)(((uint64_t)start * 0x9e3779b97f4a7c15ull) >> 40) &
           rc->hash_mask;
}

/* A region whose key still passes the check: in the cache, or invalidated
 * while other users hold it. */
static inline int uct_hca_rcache_key_valid(const uct_hca_rcache_entry_t *e)
{
    return (e->state == UCT_HCA_RCACHE_LIVE) ||
           (e->state == UCT_HCA_RCACHE_INVALIDATED);
}

/* Lock held. */
static void uct_hca_rcache_unhash(uct_hca_rcache_t *rc,
                                  uct_hca_rcache_entry_t *e)
{
    uct_hca_rcache_entry_t **pp = &rc->hash[uct_hca_rcache_hash(rc, e->start)];

    while (*pp != e) {
        pp = &(*pp)->next;
    }
    *pp     = e->next;
    e->next = NULL;
}

/* Lock held: a LIVE or INVALIDATED region loses its key now (and a LIVE
 * one leaves the hash); an idle one moves to the dead list. */
static void uct_hca_rcache_revoke(uct_hca_rcache_t *rc,
                                  uct_hca_rcache_entry_t *e)
{
    if (e->state == UCT_HCA_RCACHE_LIVE) {
        uct_hca_rcache_unhash(rc, e);
    }
    e->state = UCT_HCA_RCACHE_REVOKED;
    hca_mr_revoke(e->memh.mr);
    if (e->refs == 0) {
        ucs_list_del(&e->list);
        ucs_list_add_tail(&rc->dead, &e->list);
    }
}

/* Lock held: an idle region (LIVE in the LRU or REVOKED in the dead list)
 * leaves the cache; its entry goes on *reap for uct_hca_rcache_reap. */
static void uct_hca_rcache_detach(uct_hca_rcache_t *rc,
                                  uct_hca_rcache_entry_t *e,
                                  uct_hca_rcache_entry_t **reap)
{
    if (e->state == UCT_HCA_RCACHE_LIVE) {
        uct_hca_rcache_unhash(rc, e);
    }
    ucs_list_del(&e->list);
    e->state = UCT_HCA_RCACHE_FREE;
    e->next  = *reap;
    *reap    = e;
}

/* Lock held: every dead region onto *reap. */
static void uct_hca_rcache_take_dead(uct_hca_rcache_t *rc,
                                     uct_hca_rcache_entry_t **reap)
{
    uct_hca_rcache_entry_t *e, *tmp;

    ucs_list_for_each_safe(e, tmp, &rc->dead, list) {
        uct_hca_rcache_detach(rc, e, reap);
    }
}

/* Lock held: idle regions, oldest first, while over the size limit. */
static void uct_hca_rcache_evict(uct_hca_rcache_t *rc,
                                 uct_hca_rcache_entry_t **reap)
{
    uct_hca_rcache_entry_t *e;

    while ((rc->stats.bytes > rc->max_bytes) && !ucs_list_is_empty(&rc->lru)) {
        e = ucs_list_head(&rc->lru, uct_hca_rcache_entry_t, list);
        rc->stats.evictions++;
        uct_hca_rcache_detach(rc, e, reap);
    }
}

/* Not locked: deregister the reaped regions, then free their entries. */
static void uct_hca_rcache_reap(uct_hca_rcache_t *rc,
                                uct_hca_rcache_entry_t *reap)
{
    uct_hca_rcache_entry_t *e, *next;
    unsigned n = 0;
    size_t bytes = 0;

    if (reap == NULL) {
        return;
    }
    for (e = reap; e != NULL; e = e->next) {
        hca_mr_dereg(e->memh.mr);
        e->memh.mr = NULL;
        bytes     += e->end - e->start;
        ++n;
        /* the key is dead: the INVALIDATE completions are due, one
         * uct_invoke_completion per such deregistration (as ucs_rcache
         * does in ucs_mem_region_destroy_internal) */
        while (e->comps != NULL) {
            uct_hca_rcache_comp_t *c = e->comps;

            e->comps = c->next;
            uct_invoke_completion(c->comp, UCS_OK);
            ucs_free(c);
        }
    }
    pthread_spin_lock(&rc->lock);
    for (e = reap; e != NULL; e = next) {
        next     = e->next;
        e->next  = rc->free;
        rc->free = e;
    }
    rc->stats.regions -= n;
    rc->stats.bytes   -= bytes;
    if (rc->stats.regions == 0) {
        rc->lo = UINTPTR_MAX; /* the hook's quick test starts afresh */
        rc->hi = 0;
    }
    pthread_spin_unlock(&rc->lock);
}

/* UCM_EVENT_VM_UNMAPPED (before the memory leaves the address space; any
 * thread): revoke every cached key over it. */
static void uct_hca_rcache_unmapped(ucm_event_type_t event_type,
                                    ucm_event_t *event, void *arg)
{
    uct_hca_rcache_t *rc = arg;
    uintptr_t start      = (uintptr_t)event->vm_unmapped.address;
    uintptr_t end        = start + event->vm_unmapped.size;
    uct_hca_rcache_entry_t *e;

    /* A forked child inherits the hook and a copy of the cache, but the
     * MPT it would revoke is the parent's (shared memory), and the lock may
     * have been held by a thread the child does not have: leave it. */
    if (rc->fork_gen != atomic_load_explicit(&uct_hca_rcache_forks,
                                             memory_order_relaxed)) {
        return;
    }
    /* most unmaps are of other memory: a racy look first (a region
     * registered while its memory is unmapped is the caller's race) */
    if ((start >= rc->hi) || (end <= rc->lo)) {
        return;
    }
    pthread_spin_lock(&rc->lock);
    if ((start < rc->hi) && (end > rc->lo)) {
        for (unsigned i = 0; i < rc->max_regions; ++i) {
            e = &rc->entries[i];
            if (uct_hca_rcache_key_valid(e) && (e->start < end) &&
                (e->end > start)) {
                rc->stats.unmapped++;
                uct_hca_rcache_revoke(rc, e);
            }
        }
    }
    pthread_spin_unlock(&rc->lock);
}

ucs_status_t uct_hca_rcache_create(hca_pd_t *pd, unsigned access,
                                   unsigned max_regions, size_t max_bytes,
                                   uct_hca_rcache_t **rcache_p)
{
    uct_hca_rcache_t *rc;
    unsigned hash_size;
    ucs_status_t status;

    if ((max_regions == 0) || (max_regions > (1u << 22))) {
        return UCS_ERR_INVALID_PARAM; /* the hash takes 24 bits */
    }
    rc = ucs_calloc(1, sizeof(*rc), "hca_rcache");
    if (rc == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    hash_size       = ucs_roundup_pow2(ucs_max(2 * max_regions, 64u));
    rc->pd          = pd;
    rc->access      = access;
    rc->max_regions = max_regions;
    rc->max_bytes   = max_bytes;
    rc->hash_mask   = hash_size - 1;
    rc->entries     = ucs_calloc(max_regions, sizeof(*rc->entries),
                                 "hca_rcache_entries");
    rc->hash        = ucs_calloc(hash_size, sizeof(*rc->hash),
                                 "hca_rcache_hash");
    if ((rc->entries == NULL) || (rc->hash == NULL)) {
        status = UCS_ERR_NO_MEMORY;
        goto err_free;
    }
    for (unsigned i = max_regions; i-- > 0;) {
        rc->entries[i].memh.entry = &rc->entries[i];
        rc->entries[i].next       = rc->free;
        rc->free                  = &rc->entries[i];
    }
    ucs_list_head_init(&rc->lru);
    ucs_list_head_init(&rc->dead);
    rc->lo = UINTPTR_MAX;
    rc->hi = 0;
    pthread_once(&uct_hca_rcache_atfork_once, uct_hca_rcache_atfork_init);
    rc->fork_gen = atomic_load(&uct_hca_rcache_forks);
    if (pthread_spin_init(&rc->lock, PTHREAD_PROCESS_PRIVATE) != 0) {
        status = UCS_ERR_NO_RESOURCE;
        goto err_free;
    }
    status = ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED,
                                   UCT_HCA_RCACHE_EVENT_PRIO,
                                   uct_hca_rcache_unmapped, rc);
    if (status != UCS_OK) {
        pthread_spin_destroy(&rc->lock);
        goto err_free;
    }
    *rcache_p = rc;
    return UCS_OK;

err_free:
    ucs_free(rc->hash);
    ucs_free(rc->entries);
    ucs_free(rc);
    return status;
}

void uct_hca_rcache_destroy(uct_hca_rcache_t *rc)
{
    uct_hca_rcache_entry_t *reap = NULL, *e;
    unsigned leaked = 0;

    ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, uct_hca_rcache_unmapped,
                            rc);
    if (rc->fork_gen != atomic_load(&uct_hca_rcache_forks)) {
        /* a forked child closing the md it inherited: the MRs are the
         * parent's (its MPT is shared memory), only our copy goes */
        goto out_free;
    }
    pthread_spin_lock(&rc->lock);
    for (unsigned i = 0; i < rc->max_regions; ++i) {
        e = &rc->entries[i];
        if (e->state == UCT_HCA_RCACHE_FREE) {
            continue;
        }
        if (e->refs != 0) {
            /* a registration never given back: its memh dies with us */
            ++leaked;
            e->refs = 0;
            ucs_list_add_tail(&rc->lru, &e->list);
        }
        uct_hca_rcache_detach(rc, e, &reap);
    }
    pthread_spin_unlock(&rc->lock);
    if (leaked != 0) {
        ucs_warn("hca: %u cached registration(s) still in use at md close",
                 leaked);
    }
    uct_hca_rcache_reap(rc, reap);
    pthread_spin_destroy(&rc->lock);
out_free:
    ucs_free(rc->hash);
    ucs_free(rc->entries);
    ucs_free(rc);
}

ucs_status_t uct_hca_rcache_get(uct_hca_rcache_t *rc, void *address,
                                size_t length, uct_hca_memh_t **memh_p,
                                int *rc_p)
{
    uintptr_t start = (uintptr_t)address;
    uintptr_t end   = start + length;
    uct_hca_rcache_entry_t *reap = NULL, *e;
    hca_mr_t *mr;
    int tries = 0, err;

    pthread_spin_lock(&rc->lock);
    for (e = rc->hash[uct_hca_rcache_hash(rc, start)]; e != NULL; e = e->next) {
        /* An idle region serves any range it covers; one in use only the
         * same range (and only where UCT_HCA_RCACHE_SHARE_IN_USE).  Its
         * users share one key, and so the completion of an INVALIDATE,
         * which comes at the last one's put: a request's buffer inside an
         * application's ucp_mem_map region (held until ucp_mem_unmap,
         * which waits for the request) must not join it, or UCP's purge of
         * a failed endpoint waits for itself. */
        if ((e->start == start) && (e->end >= end) &&
            ((e->refs == 0) ||
             (UCT_HCA_RCACHE_SHARE_IN_USE && (e->end == end)))) {
            if (e->refs++ == 0) {
                ucs_list_del(&e->list);
            }
            rc->stats.hits++;
            pthread_spin_unlock(&rc->lock);
            *memh_p = &e->memh;
            return UCS_OK;
        }
    }
    rc->stats.misses++;
    uct_hca_rcache_take_dead(rc, &reap);
    pthread_spin_unlock(&rc->lock);
    uct_hca_rcache_reap(rc, reap);

    /* register outside the lock: it takes the device's lock and allocates.
     * (A thread that unmaps this memory meanwhile would leave the new entry
     * valid over it; registering memory while unmapping it is the
     * caller's race, as with ucs_rcache.) */
    while ((err = hca_mr_reg(rc->pd, address, length, rc->access, &mr)) ==
           -ENOMEM) {
        if (tries++ > 0) {
            break;
        }
        /* the device's table is full: give back every idle region */
        reap = NULL;
        pthread_spin_lock(&rc->lock);
        while (!ucs_list_is_empty(&rc->lru)) {
            rc->stats.evictions++;
            uct_hca_rcache_detach(rc, ucs_list_head(&rc->lru,
                                                    uct_hca_rcache_entry_t,
                                                    list), &reap);
        }
        pthread_spin_unlock(&rc->lock);
        if (reap == NULL) {
            break;
        }
        uct_hca_rcache_reap(rc, reap);
    }
    if (err != 0) {
        *rc_p = err;
        return (err == -ENOMEM) ? UCS_ERR_NO_MEMORY : UCS_ERR_IO_ERROR;
    }

    pthread_spin_lock(&rc->lock);
    e = rc->free;
    if (e != NULL) {
        rc->free = e->next;
    } else if (!ucs_list_is_empty(&rc->lru)) {
        /* every entry holds a region: the oldest idle one makes room (its
         * entry stays ours, off the free list, while its MR goes) */
        reap = NULL;
        rc->stats.evictions++;
        uct_hca_rcache_detach(rc, ucs_list_head(&rc->lru,
                                                uct_hca_rcache_entry_t, list),
                              &reap);
        e = reap;
        pthread_spin_unlock(&rc->lock);
        hca_mr_dereg(e->memh.mr);
        pthread_spin_lock(&rc->lock);
        rc->stats.regions--;
        rc->stats.bytes -= e->end - e->start;
    } else {
        rc->stats.full++;
        pthread_spin_unlock(&rc->lock);
        hca_mr_dereg(mr);
        return UCS_ERR_NO_RESOURCE;
    }
    reap = NULL;
    e->start     = start;
    e->end       = end;
    e->refs      = 1;
    e->state     = UCT_HCA_RCACHE_LIVE;
    e->memh.mr   = mr;
    e->memh.dm   = NULL;
    e->memh.lkey = hca_mr_lkey(mr);
    e->memh.inv_packed = 0;
    e->next      = rc->hash[uct_hca_rcache_hash(rc, start)];
    rc->hash[uct_hca_rcache_hash(rc, start)] = e;
    rc->lo       = ucs_min(rc->lo, start);
    rc->hi       = ucs_max(rc->hi, end);
    rc->stats.regions++;
    rc->stats.bytes += length;
    uct_hca_rcache_evict(rc, &reap);
    pthread_spin_unlock(&rc->lock);
    uct_hca_rcache_reap(rc, reap);
    *memh_p = &e->memh;
    return UCS_OK;
}

void uct_hca_rcache_put(uct_hca_rcache_t *rc, uct_hca_memh_t *memh,
                        int invalidate, uct_completion_t *comp)
{
    uct_hca_rcache_entry_t *e    = memh->entry;
    uct_hca_rcache_entry_t *reap = NULL;
    uct_hca_rcache_comp_t *c     = NULL;
    uct_hca_rcache_comp_t **pp;

    if (invalidate && (comp != NULL)) {
        c = ucs_malloc(sizeof(*c), "hca_rcache_comp");
        if (c == NULL) {
            /* no room to wait for the other holders: fence the key for
             * all of them now (our reference keeps the MR), so that the
             * completion does not lie */
            hca_mr_invalidate(e->memh.mr);
            uct_invoke_completion(comp, UCS_OK);
        } else {
            c->next = NULL;
            c->comp = comp;
        }
    }
    pthread_spin_lock(&rc->lock);
    if (invalidate && (e->state == UCT_HCA_RCACHE_LIVE)) {
        /* no new hits; the users that hold it keep its key, as with
         * ucs_rcache: the region is deregistered at the last put */
        uct_hca_rcache_unhash(rc, e);
        e->state = UCT_HCA_RCACHE_INVALIDATED;
    }
    if (c != NULL) {
        for (pp = &e->comps; *pp != NULL; pp = &(*pp)->next) {
        }
        *pp = c;
    }
    if (--e->refs == 0) {
        if (e->state == UCT_HCA_RCACHE_LIVE) {
            ucs_list_add_tail(&rc->lru, &e->list);
            uct_hca_rcache_evict(rc, &reap);
        } else {
            ucs_list_add_tail(&rc->dead, &e->list);
        }
    }
    /* dead regions go now (with their completions): a hit-only workload
     * must not keep them */
    uct_hca_rcache_take_dead(rc, &reap);
    pthread_spin_unlock(&rc->lock);
    uct_hca_rcache_reap(rc, reap);
}

void uct_hca_rcache_flush_range(uct_hca_rcache_t *rc, void *address,
                                size_t length)
{
    uintptr_t start              = (uintptr_t)address;
    uintptr_t end                = start + length;
    uct_hca_rcache_entry_t *reap = NULL, *e;

    pthread_spin_lock(&rc->lock);
    for (unsigned i = 0; i < rc->max_regions; ++i) {
        e = &rc->entries[i];
        if (uct_hca_rcache_key_valid(e) && (e->start < end) &&
            (e->end > start)) {
            uct_hca_rcache_revoke(rc, e);
        }
    }
    uct_hca_rcache_take_dead(rc, &reap);
    pthread_spin_unlock(&rc->lock);
    uct_hca_rcache_reap(rc, reap);
}

void uct_hca_rcache_get_stats(uct_hca_rcache_t *rc,
                              uct_hca_rcache_stats_t *stats)
{
    pthread_spin_lock(&rc->lock);
    *stats = rc->stats;
    pthread_spin_unlock(&rc->lock);
}
