/*
 * hca_mpt.h - the checks of a remote access: the request target check of a
 * published QP entry, the MPT entry's key/PD/rights/bounds check and its
 * pinning, and the local SGE check.
 * Private to libhcadev (not installed).
 */
#ifndef HCA_MPT_H
#define HCA_MPT_H

#include "hca_dev.h"
#include "hca_util.h"
#include "hca_wire.h"

#include <stdatomic.h>
#include <stdint.h>

/* ---------------------------------------------------------------- target */

/* Does the published QP entry `pub` (ours, or a peer's in its context)
 * take a request for QP qpn from the source (host, pid, ctx, src_qpn)?
 * The one target check of requests: SUCCESS; RETRY_EXC_ERR if that QP no
 * longer exists (it never answers, as on InfiniBand: gone, not refusing);
 * REM_INV_REQ_ERR if it is not in RTR/RTS or accepts another source (the
 * host included: a process of another host may have the peer's pid). */
HCA_INLINE hca_wc_status_t hca_qp_pub_check(const hca_qp_pub_t *pub,
                                            uint32_t qpn, uint64_t src_host,
                                            uint32_t src_pid,
                                            uint32_t src_ctx,
                                            uint32_t src_qpn)
{
    uint32_t state, dq;

    /* qpn first (acquire: it is published last), then what it guards */
    if (HCA_UNLIKELY(atomic_load_explicit(&pub->qpn, memory_order_acquire) !=
                     qpn)) {
        return HCA_WC_RETRY_EXC_ERR;
    }
    state = atomic_load_explicit(&pub->state, memory_order_acquire);
    dq    = atomic_load_explicit(&pub->dest_qpn, memory_order_relaxed);
    if (HCA_UNLIKELY(
            ((state != HCA_QPS_RTR) && (state != HCA_QPS_RTS)) ||
            ((dq != HCA_QPN_ANY) &&
             ((dq != src_qpn) ||
              (atomic_load(&pub->dest_pid) != src_pid) ||
              (atomic_load(&pub->dest_ctx) != src_ctx) ||
              (atomic_load(&pub->dest_host) != src_host))))) {
        return HCA_WC_REM_INV_REQ_ERR;
    }
    return HCA_WC_SUCCESS;
}

/* ---------------------------------------------------------------- MPT */

/* The checks of every access, after it was announced (pinned or busy
 * word): the entry is valid under key rkey, of the PD, grants access, and
 * holds [addr, addr+length) at the alignment.  Fields read once each. */
static inline int hca_mpt_entry_allows(const hca_mpt_entry_t *entry,
                                       uint32_t rkey, uint32_t pd_handle,
                                       unsigned access, uint64_t addr,
                                       uint64_t length, unsigned align)
{
    uint64_t start, len;

    if ((atomic_load(&entry->state) != HCA_MPT_VALID) ||
        (atomic_load(&entry->key) != rkey)) {
        return 0;
    }
    start = entry->addr;
    len   = entry->length;
    return (entry->pd_handle == pd_handle) &&
           ((entry->access & access) == access) && (addr >= start) &&
           (addr - start <= len) && (length <= len - (addr - start)) &&
           ((align <= 1) || ((addr % align) == 0));
}

static inline void hca_mpt_release(hca_mpt_entry_t *entry)
{
    atomic_fetch_sub_explicit(&entry->inflight, 1, memory_order_release);
}

/* One more pin of an entry the caller holds pinned (released on its own). */
static inline void hca_mpt_hold(hca_mpt_entry_t *entry)
{
    atomic_fetch_add_explicit(&entry->inflight, 1, memory_order_relaxed);
}

/* Checks and pins an entry of a (local or peer's) MPT: the one lookup of
 * a key.  HCA_WC_SUCCESS (release with hca_mpt_release()), else
 * HCA_WC_REM_ACCESS_ERR. */
static inline hca_wc_status_t hca_mpt_acquire(hca_mpt_entry_t *table,
                                              uint32_t max_mr, uint32_t rkey,
                                              uint32_t pd_handle,
                                              unsigned access, uint64_t addr,
                                              uint64_t length, unsigned align,
                                              hca_mpt_entry_t **entry_p)
{
    uint32_t index = hca_key_index(rkey);
    hca_mpt_entry_t *entry;

    if ((index == 0) || (index >= max_mr)) {
        return HCA_WC_REM_ACCESS_ERR;
    }
    entry = &table[index];
    atomic_fetch_add(&entry->inflight, 1);
    if (!hca_mpt_entry_allows(entry, rkey, pd_handle, access, addr, length,
                              align)) {
        hca_mpt_release(entry);
        return HCA_WC_REM_ACCESS_ERR;
    }
    *entry_p = entry;
    return HCA_WC_SUCCESS;
}
/* Local SGE check against our own MPT (no pinning: the owner of a local
 * buffer must not deregister it while a WR uses it). */
hca_wc_status_t hca_sge_check(hca_device_t *dev, uint32_t pd_handle,
                              const hca_sge_t *sge, int num_sge,
                              unsigned access);

#endif
