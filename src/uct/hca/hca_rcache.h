/*
 * hca_rcache.h - the md's registration cache: a registration of the same
 * buffer is reused instead of made and unmade around every UCP operation.
 *
 * Why our own and not ucs_rcache: this device does not pin pages, so a
 * key that outlives its mapping reaches whatever is mapped at that address
 * later.  ucs_rcache's memory hook only queues an unmapped region; the
 * region is deregistered at the cache's next get.  Here the hook revokes
 * the key before munmap goes on (hca_mr_revoke: one atomic store, no lock,
 * no allocation).  A hit is a hash probe under a spinlock; docs/PERF.md
 * compares its cost with ucs_rcache's.
 *
 * Semantics, as with UCX's IB md and its rcache:
 *   - uct_md_mem_dereg of a cached registration keeps the key valid (the
 *     memory stays registered) until the region is evicted (LRU, over the
 *     size or count limit), unmapped, freed with uct_md_mem_free, or
 *     deregistered with UCT_MD_MEM_DEREG_FLAG_INVALIDATE;
 *   - those are the real deregistrations: after them no remote access
 *     passes the key check.  An unmap revokes the key in the memory hook,
 *     before the memory leaves the address space; accesses that passed the
 *     check just before may still finish while munmap runs, and the full
 *     fence (hca_mr_dereg) runs at the cache's next call.
 *   - UCT_MD_MEM_DEREG_FLAG_INVALIDATE, as uct_ib_mem_rcache_dereg with
 *     ucs_rcache_region_invalidate: the region leaves the cache (no new
 *     hits); the users that still hold it keep its key; at the last
 *     holder's deregistration (with or without the flag) the region is
 *     deregistered - its key fenced - and then each invalidating
 *     deregistration's completion is invoked once (uct_invoke_completion:
 *     comp->count drops by one per such call, all at that moment).
 *   - a region in use is shared only by registrations of the same range
 *     (an idle one serves any range it covers): its holders wait for each
 *     other's deregistration.  Built against UCX 1.14 or later not even
 *     that: UCP's own rcache holds each registration once and wants the
 *     INVALIDATE completion in the call (UCT_HCA_RCACHE_SHARE_IN_USE).
 *     UCP 1.13's purge of a failed endpoint invalidates a rendezvous request's registration and completes the
 *     request when the completion comes; when that registration was a hit
 *     on the application's ucp_mem_map region around the buffer (held by
 *     UCP until ucp_mem_unmap, which the application calls after its
 *     requests completed), the request waited for itself
 *     (test/reliability peer-death am/tag heap hung).
 */
#ifndef UCT_HCA_RCACHE_H
#define UCT_HCA_RCACHE_H

#include <hca_dev.h>

#include <uct/api/uct.h>

#include <stddef.h>
#include <stdint.h>

typedef struct uct_hca_rcache       uct_hca_rcache_t;
typedef struct uct_hca_rcache_entry uct_hca_rcache_entry_t;
struct uct_hca_memh;

typedef struct uct_hca_rcache_stats {
    uint64_t hits;
    uint64_t misses;
    uint64_t evictions;     /* idle regions deregistered over a limit */
    uint64_t unmapped;      /* regions revoked by the memory hook */
    uint64_t full;          /* misses not cached: every entry in use */
    unsigned regions;       /* registered regions held now */
    size_t   bytes;         /* their total length */
} uct_hca_rcache_stats_t;

/* Creates the cache of pd's registrations: at most max_regions regions of
 * max_bytes in all (SIZE_MAX: no size limit), access rights `access` on
 * every one.  Installs the memory hook; fails (UCS_ERR_UNSUPPORTED) where
 * UCX's memory events are unavailable (UCX_MEM_EVENTS=no): without them a
 * cached key could outlive its memory. */
ucs_status_t uct_hca_rcache_create(hca_pd_t *pd, unsigned access,
                                   unsigned max_regions, size_t max_bytes,
                                   uct_hca_rcache_t **rcache_p);

/* Deregisters every region and removes the hook. */
void uct_hca_rcache_destroy(uct_hca_rcache_t *rcache);

/* A registration covering [address, address + length) (length > 0): a
 * cached one (an idle region that starts there and covers it, or with
 * UCX 1.13 one in use of exactly that range), or a new one that is cached.
 * *memh_p lives in the cache.
 * UCS_ERR_NO_RESOURCE: every entry is in use (register uncached);
 * UCS_ERR_IO_ERROR / UCS_ERR_NO_MEMORY: the device refused (*rc_p). */
ucs_status_t uct_hca_rcache_get(uct_hca_rcache_t *rcache, void *address,
                                size_t length, struct uct_hca_memh **memh_p,
                                int *rc_p);

/* Gives back a registration from uct_hca_rcache_get.  invalidate
 * (UCT_MD_MEM_DEREG_FLAG_INVALIDATE): the region leaves the cache (no new
 * hits); it is deregistered - its key fenced - at its last put, and comp
 * (if not NULL) is invoked then, once, maybe in this call. */
void uct_hca_rcache_put(uct_hca_rcache_t *rcache, struct uct_hca_memh *memh,
                        int invalidate, uct_completion_t *comp);

/* Deregisters the cached regions that overlap [address, address + length)
 * (uct_md_mem_free of device memory: its MRs must go first).  Regions in
 * use are revoked and go at their last put. */
void uct_hca_rcache_flush_range(uct_hca_rcache_t *rcache, void *address,
                                size_t length);

void uct_hca_rcache_get_stats(uct_hca_rcache_t *rcache,
                              uct_hca_rcache_stats_t *stats);

#endif
