/*
 * hca_mr.c - memory regions and the memory protection table (MPT).
 *
 * The MPT lives in the context object, so requesters on the same host check
 * it themselves (hca_access_begin); the protocol that keeps deregistration
 * safe is described at hca_mpt_entry_t in hca_wire.h and in
 * hca_shm_fence.c.
 */
#include "hca_base.h"
#include "hca_obj.h"
#include "hca_mpt.h"
#include "hca_state.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

int hca_mr_reg(hca_pd_t *pd, void *addr, size_t length, unsigned access,
               hca_mr_t **mr_p)
{
    hca_device_t *dev = pd->dev;
    hca_mpt_entry_t *entry;
    struct hca_export *ex = NULL;
    uint64_t ex_offset    = 0;
    uint32_t index = 0;
    hca_dm_t *dm;
    hca_mr_t *mr;

    if ((access & ~(HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE |
                    HCA_ACCESS_REMOTE_READ | HCA_ACCESS_REMOTE_ATOMIC)) ||
        ((addr == NULL) && (length != 0)) ||
        ((uintptr_t)addr + length < (uintptr_t)addr)) {
        return -EINVAL;
    }
    /* as on verbs: remote write/atomic need local write */
    if ((access & (HCA_ACCESS_REMOTE_WRITE | HCA_ACCESS_REMOTE_ATOMIC)) &&
        !(access & HCA_ACCESS_LOCAL_WRITE)) {
        return -EINVAL;
    }

    mr = hca_fault(dev, HCA_FAULT_REG) ? NULL : calloc(1, sizeof(*mr));
    if (mr == NULL) {
        return -ENOMEM;
    }
    /* memory that peers reach: if a shared object backs it (and it is
     * not our device memory), peers map that object themselves */
    if (access & (HCA_ACCESS_REMOTE_WRITE | HCA_ACCESS_REMOTE_READ |
                  HCA_ACCESS_REMOTE_ATOMIC)) {
        pthread_mutex_lock(&dev->lock);
        dm = hca_dm_find(dev, (uintptr_t)addr, length);
        pthread_mutex_unlock(&dev->lock);
        if (dm == NULL) {
            ex = hca_export_get(dev, (uintptr_t)addr, length, &ex_offset);
        }
    }

    pthread_mutex_lock(&dev->lock);
    for (uint32_t n = 1; n < HCA_MAX_MR; ++n) {
        uint32_t i = 1 + (dev->mpt_next + n - 1) % (HCA_MAX_MR - 1);
        if (dev->mrs[i] == NULL) {
            index = i;
            break;
        }
    }
    if (index == 0) {
        if (ex != NULL) {
            hca_export_put(dev, ex);
        }
        pthread_mutex_unlock(&dev->lock);
        free(mr);
        return -ENOMEM;
    }
    dev->mpt_next = index;

    entry            = &dev->mpt[index];
    /* a new tag on every reuse: keys of earlier registrations never match
     * again (for 255 reuses) */
    dev->mpt_tag[index] = (uint8_t)(dev->mpt_tag[index] + 1);
    if (dev->mpt_tag[index] == 0) {
        dev->mpt_tag[index] = 1;
    }
    mr->pd     = pd;
    mr->index  = index;
    mr->key    = hca_key_make(index, dev->mpt_tag[index]);
    mr->addr   = addr;
    mr->length = length;

    dm               = hca_dm_find(dev, (uintptr_t)addr, length);
    entry->pd_handle = pd->handle;
    entry->access    = access;
    entry->addr      = (uint64_t)(uintptr_t)addr;
    entry->length    = length;
    if (dm != NULL) {
        entry->dm_id     = dm->id;
        entry->dm_offset = (uint64_t)((uintptr_t)addr -
                                      (uintptr_t)dm->obj.addr);
    } else if (ex != NULL) {
        entry->dm_id     = ex->id;
        entry->dm_offset = ex_offset;
    } else {
        entry->dm_id     = 0;
        entry->dm_offset = 0;
    }
    atomic_store_explicit(&entry->accessors, 0, memory_order_relaxed);
    atomic_store_explicit(&entry->unfenced, 0, memory_order_relaxed);
    atomic_store_explicit(&entry->key, mr->key, memory_order_relaxed);
    atomic_store_explicit(&entry->serial, ++dev->mpt_serial,
                          memory_order_relaxed);
    atomic_store_explicit(&entry->state, HCA_MPT_VALID,
                          memory_order_release);
    dev->mrs[index] = mr;
    mr->dm          = dm;
    mr->export      = ex;
    if (dm != NULL) {
        dm->mrs++;
    }
    pthread_mutex_unlock(&dev->lock);

    atomic_fetch_add(&pd->refs, 1);
    *mr_p = mr;
    return 0;
}

void hca_mr_revoke(hca_mr_t *mr)
{
    hca_mpt_entry_t *entry = &mr->pd->dev->mpt[mr->index];
    unsigned spins         = 0;

    /* 1. no new access passes the check (seq_cst: pairs with the
     *    accessors' announce-then-check, hca_shm_fence.c): neither the
     *    full one (state) nor a cached one (serial, hca_shm_direct.c) */
    atomic_store(&entry->serial, 0);
    atomic_store(&entry->state, HCA_MPT_INVALID);
    /* 2. our own threads (responder, tcp fabric thread, a QP to
     *    ourselves) that passed it: they copy into this process's memory,
     *    which the caller may be about to unmap */
    while (atomic_load(&entry->inflight) != 0) {
        if (++spins > 1000) {
            sched_yield();
        }
    }
}

void hca_mr_invalidate(hca_mr_t *mr)
{
    hca_device_t *dev      = mr->pd->dev;
    hca_mpt_entry_t *entry = &dev->mpt[mr->index];
    uint32_t accessors;

    hca_mr_revoke(mr);
    /* 3. other processes that accessed it: each is waited for while it
     *    lives (a killed one is not).  An entry that no other process
     *    accessed skips this. */
    accessors = atomic_load(&entry->accessors);
    if (accessors != 0) {
        for (int t = 0; t < HCA_FABRIC_LAST; ++t) {
            if (dev->fabric_open[t]) {
                dev->fabric_ops[t].mr_fence(dev, entry, accessors,
                                            atomic_load(&entry->unfenced) != 0);
            }
        }
    }
}

int hca_mr_dereg(hca_mr_t *mr)
{
    hca_device_t *dev      = mr->pd->dev;
    hca_mpt_entry_t *entry = &dev->mpt[mr->index];
    hca_dm_t *gone         = NULL;

    hca_mr_invalidate(mr);
    pthread_mutex_lock(&dev->lock);
    atomic_store(&entry->key, 0);
    atomic_store(&entry->state, HCA_MPT_FREE);
    dev->mrs[mr->index] = NULL;
    if (mr->dm != NULL) {
        mr->dm->mrs--;
        if (hca_dm_last_mr_locked(mr->dm)) {
            gone = mr->dm; /* freed by its user before: it goes now */
        }
    }
    if (mr->export != NULL) {
        hca_export_put(dev, mr->export);
    }
    pthread_mutex_unlock(&dev->lock);
    if (gone != NULL) {
        hca_dm_destroy(gone);
    }
    atomic_fetch_sub(&mr->pd->refs, 1);
    free(mr);
    return 0;
}

uint32_t hca_mr_lkey(const hca_mr_t *mr)
{
    return mr->key;
}

uint32_t hca_mr_rkey(const hca_mr_t *mr)
{
    return mr->key;
}

hca_wc_status_t hca_sge_check(hca_device_t *dev, uint32_t pd_handle,
                              const hca_sge_t *sge, int num_sge,
                              unsigned access)
{
    for (int i = 0; i < num_sge; ++i) {
        uint32_t index = hca_key_index(sge[i].lkey);

        if ((index == 0) || (index >= HCA_MAX_MR) ||
            !hca_mpt_entry_allows(&dev->mpt[index], sge[i].lkey, pd_handle,
                                  access, sge[i].addr, sge[i].length, 1)) {
            return HCA_WC_LOC_PROT_ERR;
        }
    }
    return HCA_WC_SUCCESS;
}

uint32_t hca_mr_dm_id(const hca_mr_t *mr, uint64_t *dm_base_p)
{
    const hca_mpt_entry_t *entry = &mr->pd->dev->mpt[mr->index];

    if ((entry->dm_id == 0) || (entry->dm_id & HCA_DM_EXPORT)) {
        return 0; /* device memory only: what rkey_ptr maps */
    }
    *dm_base_p = entry->addr - entry->dm_offset;
    return entry->dm_id;
}
