/*
 * hca_shm_access.h - the shm fabric's one checked access to a peer's
 * memory (hca_shm_access.c): the inline hits of the per-QP cache of the
 * last registration resolved, and the resolver behind them.  Private to
 * the shm fabric.
 */
#ifndef HCA_SHM_ACCESS_H
#define HCA_SHM_ACCESS_H

#include "hca_shm_fence.h"
#include "hca_atomic.h"
#include "hca_counters.h"

/* Our mapping of [off, off+len) of a peer's object (its device memory or
 * an export), or NULL if map is NULL or the range is not inside it: the
 * one bounds check of a mapping. */
HCA_INLINE uint8_t *hca_map_range(const hca_map_t *map, uint64_t off,
                                  uint64_t len)
{
    if ((map == NULL) || (off > map->obj.length) ||
        (len > map->obj.length - off)) {
        return NULL;
    }
    return (uint8_t*)map->obj.addr + off;
}

/* The cache's misses (hca_shm_access.c). */
int hca_direct_fill(hca_qp_t *qp, hca_qp_pub_t *pub, uint32_t rkey);
HCA_NOINLINE int hca_direct_check_marked(hca_qp_t *qp, uint32_t rkey);

/* rkey is plain memory of the peer, as found for this registration: the
 * direct path does not apply, and nothing else needs checking here. */
HCA_INLINE int hca_direct_is_plain(hca_qp_t *qp, uint32_t rkey)
{
    return HCA_UNLIKELY(rkey == hca_shm_qp(qp)->dcache.plain_rkey) &&
           (rkey != 0) &&
           (atomic_load_explicit(&hca_shm_qp(qp)->dcache.plain_entry->serial,
                                 memory_order_relaxed) ==
            hca_shm_qp(qp)->dcache.plain_serial);
}

/* Begins a direct access: our mapping of [raddr, raddr+length) of the MR
 * rkey, or NULL.  Until hca_access_end() a deregistration of that MR
 * waits for us (see hca_shm_fence.c).
 *
 * The cached registration (same key, checked in full and marked by us
 * before) costs one load after the announce: its serial, which the owner
 * zeroes before it looks at busy words (hca_mr_revoke), so either our
 * access is waited for or it sees the zero and fails. */
HCA_INLINE uint8_t *hca_direct_target(hca_qp_t *qp, hca_qp_pub_t *pub,
                                      uint32_t rkey, uint64_t raddr,
                                      uint64_t length, unsigned access,
                                      unsigned align)
{
    uint64_t off;

    if (HCA_LIKELY((hca_shm_qp(qp)->dcache.rkey == rkey) && (rkey != 0))) {
        hca_access_announce(qp, hca_shm_qp(qp)->dcache.mode);
        if (HCA_UNLIKELY(atomic_load_explicit(
                                 &hca_shm_qp(qp)->dcache.entry->serial,
                                 memory_order_seq_cst) !=
                         hca_shm_qp(qp)->dcache.serial)) {
            hca_access_end(qp);
            hca_shm_qp(qp)->dcache.rkey = 0; /* revoked: check it again */
            return NULL;
        }
    } else {
        if (hca_direct_fill(qp, pub, rkey) != 0) {
            return NULL;
        }
        hca_access_announce(qp, hca_shm_qp(qp)->dcache.mode);
        if (hca_direct_check_marked(qp, rkey) != 0) {
            hca_access_end(qp);
            return NULL;
        }
    }
    off = raddr - hca_shm_qp(qp)->dcache.addr;
    if (HCA_UNLIKELY(((hca_shm_qp(qp)->dcache.access & access) != access) ||
                     (raddr < hca_shm_qp(qp)->dcache.addr) ||
                     (off > hca_shm_qp(qp)->dcache.length) ||
                     (length > hca_shm_qp(qp)->dcache.length - off) ||
                     (raddr & (align - 1)))) {
        hca_access_end(qp);
        return NULL;
    }
    return hca_shm_qp(qp)->dcache.base + off;
}

/* Step 1: 1 if done (*old_p is the target's old value), 0 if not. */
HCA_INLINE int hca_shm_atomic_cached(hca_qp_t *qp, hca_qp_pub_t *pub,
                                     unsigned opcode, unsigned size,
                                     uint32_t rkey, uint64_t raddr,
                                     uint64_t compare_add, uint64_t swap,
                                     uint64_t *old_p)
{
    uint8_t *target;

    if (hca_direct_is_plain(qp, rkey)) {
        return 0;
    }
    target = hca_direct_target(qp, pub, rkey, raddr, size,
                               HCA_ACCESS_REMOTE_ATOMIC, size);
    if (HCA_UNLIKELY(target == NULL)) {
        return 0;
    }
    *old_p = hca_atomic_apply((uint8_t)opcode, target, (int)size,
                              compare_add, swap);
    hca_access_end(qp);
    qp->tally.tx[opcode].mapped++;
    return 1;
}


/* Begins an access to [addr, addr+length) of the peer's MR rkey: the
 * checks of hca_mpt_acquire under the fence.  HCA_WC_SUCCESS (end it with
 * hca_access_finish), the error status, or HCA_WC_STATUS_LAST when only
 * the peer's responder may access it. */
hca_wc_status_t hca_access_begin(hca_qp_t *qp, uint32_t rkey,
                                 uint32_t pd_handle, unsigned access,
                                 uint64_t addr, uint64_t length,
                                 unsigned align, hca_mpt_entry_t **entry_p);
void hca_access_finish(hca_qp_t *qp, hca_mpt_entry_t *entry);

/* What an RDMA WRITE/READ moves: local SGEs and the remote range. */
typedef struct hca_xfer {
    const hca_sge_t *sge;
    uint32_t         num_sge;
    uint32_t         rkey;
    uint64_t         raddr;
    uint64_t         length;
} hca_xfer_t;
/* Direct RDMA paths: 0 with the status, or 1 if the responder must. */
int hca_shm_rdma_direct(hca_qp_t *qp, const hca_xfer_t *x, hca_qp_pub_t *pub,
                        int write, hca_wc_status_t *status_p);
/* The one route of a shm atomic: HCA_WC_SUCCESS when done here (*old_p),
 * HCA_WC_STATUS_LAST when only the target's responder can (plain memory
 * of another process), or the error. */
hca_wc_status_t hca_shm_atomic_exec(hca_qp_t *qp, hca_qp_pub_t *pub,
                                    unsigned opcode, unsigned size,
                                    uint32_t rkey, uint64_t raddr,
                                    uint64_t compare_add, uint64_t swap,
                                    uint64_t *old_p);

#endif
