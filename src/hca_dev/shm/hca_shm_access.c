/*
 * hca_shm_access.c - the one checked access to a peer's memory on the shm
 * fabric, which every route goes through: the fast ops and the doorbell
 * (hca_shm_direct.c) and the WQE executor (hca_shm_exec.c).  A peer
 * address is resolved once: the key, the PD, the rights, the bounds and
 * the registration's serial, against the peer's MPT entry, after the
 * access was announced in our busy word (hca_shm_fence.c), so that its
 * deregistration waits for us; then the route: our mapping of its device
 * memory or of an object it exported (hca_map_range, the one bounds check
 * of a mapping), single copy (CMA), or its responder.
 *
 * The per-QP cache of the last registration resolved (dcache) sits in
 * front: its hits are the inlines of hca_shm_access.h; what they miss
 * comes here.
 */
#include "hca_shm_access.h"
#include "hca_shm_target.h"
#include "hca_queue.h"
#include "hca_counters.h"
#include "hca_mpt.h"
#include "hca_atomic.h"

#include <errno.h>
#include <string.h>

/* ---------------------------------------------------------------- cache */

/* Looks rkey up in the peer's MPT for the full check that follows (in
 * hca_direct_target, after the access is announced and marked): only a
 * valid MR of the target QP's PD inside device memory we can map.  Plain
 * memory is remembered as such while its registration lives, so that the
 * next call with that key says "no" at once and the caller's WR path is
 * the only one that checks it. */
int hca_direct_fill(hca_qp_t *qp, hca_qp_pub_t *pub, uint32_t rkey)
{
    hca_peer_t *peer = hca_shm_qp(qp)->peer;
    uint32_t index   = hca_key_index(rkey);
    hca_mpt_entry_t *entry;
    uint64_t addr, length, dm_off, serial;
    uint32_t access, dm_id, pd;
    uint8_t *base;
    hca_map_t *map;

    hca_shm_qp(qp)->dcache.rkey = 0;
    if ((index == 0) || (index >= peer->hdr.max_mr)) {
        return -EINVAL;
    }
    entry  = &peer->mpt[index];
    /* the serial first: the checks below then vouch for it (a
     * registration after this load has another serial) */
    serial = atomic_load_explicit(&entry->serial, memory_order_acquire);
    if ((serial == 0) ||
        (atomic_load_explicit(&entry->state, memory_order_acquire) !=
         HCA_MPT_VALID) ||
        (atomic_load_explicit(&entry->key, memory_order_acquire) != rkey)) {
        return -EINVAL;
    }
    /* each field read once: the owner may change them under us */
    addr   = entry->addr;
    length = entry->length;
    dm_off = entry->dm_offset;
    access = entry->access;
    dm_id  = entry->dm_id;
    pd     = entry->pd_handle;
    map  = (dm_id != 0) ? hca_peer_dm(qp->dev, peer, dm_id) : NULL;
    base = hca_map_range(map, dm_off, length);
    if ((dm_id == 0) || ((base == NULL) && (dm_id & HCA_DM_EXPORT))) {
        /* plain memory, or a shared object we cannot map (or map short
         * of this MR): CMA or the responder (a WR) */
        hca_shm_qp(qp)->dcache.plain_rkey   = rkey;
        hca_shm_qp(qp)->dcache.plain_serial = serial;
        hca_shm_qp(qp)->dcache.plain_entry  = entry;
        return -EINVAL;
    }
    if (pd != pub->pd_handle) {
        return -EINVAL;
    }
    if (base == NULL) {
        return -EINVAL;
    }
    hca_shm_qp(qp)->dcache.mode = hca_access_mode(qp->dev, peer);
    if (hca_shm_qp(qp)->dcache.mode == HCA_ACCESS_RESPONDER) {
        return -EINVAL;
    }
    hca_shm_qp(qp)->dcache.base   = base;
    hca_shm_qp(qp)->dcache.entry  = entry;
    hca_shm_qp(qp)->dcache.addr   = addr;
    hca_shm_qp(qp)->dcache.length = length;
    hca_shm_qp(qp)->dcache.access = access;
    hca_shm_qp(qp)->dcache.dm_id  = dm_id;
    hca_shm_qp(qp)->dcache.serial = serial;
    return 0;
}

/* The full check of a freshly filled cache, after the access was
 * announced: mark the entry (its deregistration then waits for our busy
 * word), then check it is still the registration we read. */
HCA_NOINLINE int hca_direct_check_marked(hca_qp_t *qp, uint32_t rkey)
{
    hca_mpt_entry_t *entry = hca_shm_qp(qp)->dcache.entry;

    /* the mark is made once per registration (a new one starts unmarked,
     * with a new serial, and comes here again) */
    hca_access_mark(entry, (uint32_t)hca_shm_qp(qp)->peer->mapper_slot,
                    hca_shm_qp(qp)->dcache.mode == HCA_ACCESS_BUSY);
    if (HCA_UNLIKELY((atomic_load_explicit(&entry->serial,
                                           memory_order_seq_cst) !=
                      hca_shm_qp(qp)->dcache.serial) ||
                     (atomic_load_explicit(&entry->state,
                                           memory_order_relaxed) !=
                      HCA_MPT_VALID) ||
                     (atomic_load_explicit(&entry->key,
                                           memory_order_relaxed) != rkey) ||
                     (entry->addr != hca_shm_qp(qp)->dcache.addr) ||
                     (entry->length != hca_shm_qp(qp)->dcache.length) ||
                     (entry->dm_id != hca_shm_qp(qp)->dcache.dm_id))) {
        hca_shm_qp(qp)->dcache.rkey = 0; /* deregistered (or reused) */
        return -EINVAL;
    }
    hca_shm_qp(qp)->dcache.rkey = rkey;
    return 0;
}


/* ---------------------------------------------------------------- atomics */


/* A shm atomic has one route, whoever issues it (the fast op
 * atomic_direct, the doorbell's direct path, the WR's execution):
 *
 *   1. the cached registration of the peer's device memory
 *      (hca_direct_target: busy word, serial, range, rights, alignment);
 *   2. otherwise, unless the fast op stops at 1, the full check
 *      (hca_access_begin: key, PD, rights, bounds, alignment), and the
 *      target where this process reaches it: its own memory, or the
 *      peer's device memory through our mapping;
 *   3. otherwise (plain memory of another process) the target's
 *      responder, which only a WR can ask (it needs a response slot).
 *
 * The target QP's rights are checked before (pub->access). */

/* Step 2: the full check, then the target in this process.  On success
 * *entry_p is pinned and *target_p is the target, or NULL: plain memory of
 * another process (step 3).  HCA_WC_STATUS_LAST: the responder only. */
static hca_wc_status_t hca_shm_atomic_target(hca_qp_t *qp, hca_qp_pub_t *pub,
                                             uint32_t rkey, uint64_t raddr,
                                             unsigned size,
                                             hca_mpt_entry_t **entry_p,
                                             void **target_p)
{
    hca_mpt_entry_t *entry;
    hca_wc_status_t status;

    *target_p = NULL;
    status = hca_access_begin(qp, rkey, pub->pd_handle,
                              HCA_ACCESS_REMOTE_ATOMIC, raddr, (uint64_t)size,
                              size, &entry);
    if (status != HCA_WC_SUCCESS) {
        return status;
    }
    if (hca_shm_qp(qp)->peer->self) {
        *target_p = (void*)(uintptr_t)raddr;
    } else if (entry->dm_id != 0) {
        *target_p = hca_map_range(hca_peer_dm(qp->dev, hca_shm_qp(qp)->peer,
                                              entry->dm_id),
                                  entry->dm_offset + (raddr - entry->addr),
                                  size);
    }
    *entry_p = entry;
    return HCA_WC_SUCCESS;
}

hca_wc_status_t hca_shm_atomic_exec(hca_qp_t *qp, hca_qp_pub_t *pub,
                                    unsigned opcode, unsigned size,
                                    uint32_t rkey, uint64_t raddr,
                                    uint64_t compare_add, uint64_t swap,
                                    uint64_t *old_p)
{
    hca_mpt_entry_t *entry;
    hca_wc_status_t status;
    void *target;

    if (!(pub->access & HCA_ACCESS_REMOTE_ATOMIC)) {
        return HCA_WC_REM_ACCESS_ERR;
    }
    if (hca_shm_atomic_cached(qp, pub, opcode, size, rkey, raddr,
                              compare_add, swap, old_p)) {
        return HCA_WC_SUCCESS;
    }
    status = hca_shm_atomic_target(qp, pub, rkey, raddr, size, &entry,
                                   &target);
    if (status != HCA_WC_SUCCESS) {
        return status;
    }
    if (target == NULL) {
        hca_access_finish(qp, entry);
        return HCA_WC_STATUS_LAST;
    }
    *old_p = hca_atomic_apply((uint8_t)opcode, target, (int)size,
                              compare_add, swap);
    hca_access_finish(qp, entry);
    qp->tally.tx[opcode].mapped++;
    return HCA_WC_SUCCESS;
}

/* ---------------------------------------------------------------- RDMA */

/* Direct paths: 0 with the status, or 1 if the responder must do it. */
int hca_shm_rdma_direct(hca_qp_t *qp, const hca_xfer_t *x,
                               hca_qp_pub_t *pub, int write,
                               hca_wc_status_t *status_p)
{
    unsigned need = write ? HCA_ACCESS_REMOTE_WRITE : HCA_ACCESS_REMOTE_READ;
    hca_peer_t *peer = hca_shm_qp(qp)->peer;
    uint8_t *p       = NULL;
    hca_mpt_entry_t *entry;
    hca_wc_status_t status;

    if (!(pub->access & need)) {
        *status_p = HCA_WC_REM_ACCESS_ERR;
        return 0;
    }
    if (x->length == 0) {
        /* as on InfiniBand: a zero-length RDMA checks no R_Key and touches
         * no memory (UCX sends UCT_INVALID_RKEY for it) */
        *status_p = HCA_WC_SUCCESS;
        return 0;
    }
    status = hca_access_begin(qp, x->rkey, pub->pd_handle, need, x->raddr,
                              x->length, 1, &entry);
    if (status == HCA_WC_STATUS_LAST) {
        return 1;
    }
    if (status != HCA_WC_SUCCESS) {
        *status_p = status;
        return 0;
    }
    if (peer->self) {
        /* our own memory */
        if (write) {
            hca_sge_gather(x->sge, x->num_sge, 0,
                           (void*)(uintptr_t)x->raddr, x->length);
        } else {
            hca_sge_scatter(x->sge, x->num_sge, 0,
                            (void*)(uintptr_t)x->raddr, x->length);
        }
        qp->cnt->mapped_ops++;
    } else if ((entry->dm_id != 0) &&
               (((p = hca_map_range(hca_peer_dm(qp->dev, peer, entry->dm_id),
                                    entry->dm_offset +
                                    (x->raddr - entry->addr),
                                    x->length)) != NULL) ||
                !(entry->dm_id & HCA_DM_EXPORT))) {
        /* its device memory, or a shared object of it that we mapped (one
         * we cannot map, or map short of the range, goes the way of plain
         * memory) */
        if (p == NULL) {
            status = HCA_WC_REM_OP_ERR;
        } else if (write) {
            hca_sge_gather(x->sge, x->num_sge, 0, p, x->length);
        } else {
            hca_sge_scatter(x->sge, x->num_sge, 0, p, x->length);
        }
        qp->cnt->mapped_ops++;
    } else if (peer->cma_ok) {
        status = hca_cma_xfer(peer->addr.pid, write, x->sge, x->num_sge,
                              x->raddr);
        qp->cnt->single_copy_ops++;
    } else {
        hca_access_finish(qp, entry);
        return 1;
    }
    hca_access_finish(qp, entry);
    *status_p = status;
    return 0;
}

/* ------------------------------------------------------ the full check */

hca_wc_status_t hca_access_begin(hca_qp_t *qp, uint32_t rkey,
                                 uint32_t pd_handle, unsigned access,
                                 uint64_t addr, uint64_t length,
                                 unsigned align, hca_mpt_entry_t **entry_p)
{
    hca_peer_t *peer = hca_shm_qp(qp)->peer;
    uint32_t index   = hca_key_index(rkey);
    hca_mpt_entry_t *entry;
    int mode;

    if (peer->self) {
        /* our own threads: the entry's count, waited for as it is */
        return hca_mpt_acquire(peer->mpt, peer->hdr.max_mr, rkey, pd_handle,
                               access, addr, length, align, entry_p);
    }
    if ((index == 0) || (index >= peer->hdr.max_mr)) {
        return HCA_WC_REM_ACCESS_ERR;
    }
    mode = hca_access_mode(qp->dev, peer);
    if (mode == HCA_ACCESS_RESPONDER) {
        return HCA_WC_STATUS_LAST;
    }
    entry = &peer->mpt[index];
    /* fenced here, always: these accesses cost a copy or a system call,
     * against which a fence is nothing, and the owner's deregistration
     * then needs no membarrier (UCP deregisters a rendezvous buffer per
     * message) */
    hca_access_announce(qp, HCA_ACCESS_BUSY_FENCED);
    hca_access_mark(entry, (uint32_t)peer->mapper_slot, 0);
    if (!hca_mpt_entry_allows(entry, rkey, pd_handle, access, addr, length,
                              align)) {
        goto err;
    }
    *entry_p = entry;
    return HCA_WC_SUCCESS;

err:
    hca_access_end(qp);
    return HCA_WC_REM_ACCESS_ERR;
}

void hca_access_finish(hca_qp_t *qp, hca_mpt_entry_t *entry)
{
    if (hca_shm_qp(qp)->peer->self) {
        hca_mpt_release(entry);
    } else {
        hca_access_end(qp);
    }
}

