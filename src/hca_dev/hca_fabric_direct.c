/*
 * hca_fabric_direct.c - the shm fabric's direct paths: operations a
 * transport issues on an idle send queue that complete inside the call,
 * with no work request, no WQE and no CQE.
 *
 *   - direct send: the caller writes the payload straight into a claimed
 *     slot of the target's receive ring (hca_send_reserve/commit);
 *   - direct RDMA WRITE and atomics on a peer's device memory, which this
 *     process maps: a memcpy or one CPU atomic.  The QP caches the last
 *     MPT entry it used, so the key check is two loads of a line that
 *     stays in our cache; deregistration is kept safe by the QP's busy
 *     word (hca_access_fence.c).
 *
 * Anything else returns -EAGAIN and the caller posts a WR, whose path
 * checks everything again and reports the error, if any.
 */
#include "hca_access_fence.h"
#include "hca_shm_target.h"

#include <errno.h>
#include <string.h>

/* What every direct path requires: nothing queued or waiting for a
 * response (so nothing is overtaken and a fence is satisfied), no
 * sq_sig_all (no CQE owed), and the connection in RTS. */
HCA_INLINE int hca_direct_idle(const hca_qp_t *qp)
{
    return HCA_LIKELY(qp->state == HCA_QPS_RTS) &&
           (qp->sq_exec == qp->sq_head) && (qp->n_issued == 0) &&
           !qp->sq_sig_all;
}

/* ---------------------------------------------------------------- reserve */

int hca_send_reserve(hca_qp_t *qp, uint32_t length_hint,
                     hca_send_slot_t *slot)
{
    hca_qp_pub_t *pub;
    hca_ring_t *ring;
    uint32_t off;
    uint64_t idx;
    int wake = 0;

    if (HCA_UNLIKELY(!hca_direct_idle(qp)) ||
        HCA_UNLIKELY(hca_shm_target(qp, &pub) != HCA_WC_SUCCESS)) {
        return -EBUSY;
    }
    ring = hca_shm_target_ring(qp, pub);
    if (HCA_UNLIKELY(ring == NULL)) {
        return -EBUSY;
    }
    if (HCA_UNLIKELY(hca_ring_claim(ring, &idx, &wake) != 0)) {
        /* as hca_post_send would answer, without building a WR first */
        qp->cnt->ring_full++;
        return hca_qp_ring_full(qp);
    }
    qp->full_since = 0;
    off              = hca_msg_data_off(length_hint);
    slot->data       = (uint8_t*)hca_ring_slot(ring, idx) + off;
    slot->max_length = hca_msg_room(off);
    slot->data_off   = (uint8_t)off;
    slot->index      = idx;
    slot->ring       = ring;
    slot->wake       = (uint32_t)wake;
    return 0;
}

HCA_INLINE void hca_send_slot_publish(hca_qp_t *qp, hca_send_slot_t *slot,
                                      uint8_t op, uint8_t flags,
                                      uint32_t length, uint32_t imm)
{
    hca_ring_t *ring   = slot->ring;
    hca_msg_hdr_t *msg = hca_ring_slot(ring, slot->index);

    hca_msg_hdr_set(msg, qp, op, flags, slot->data_off, imm, length,
                    length);
    hca_ring_publish(ring, slot->index);
    hca_shm_ring_wake(qp, ring, (int)slot->wake);
}

int hca_send_commit(hca_qp_t *qp, hca_send_slot_t *slot, uint32_t length,
                    hca_wr_opcode_t opcode, uint32_t imm_data)
{
    if (HCA_UNLIKELY((length > slot->max_length) ||
                     ((opcode != HCA_WR_SEND) &&
                      (opcode != HCA_WR_SEND_WITH_IMM)))) {
        hca_send_cancel(qp, slot);
        return -EINVAL;
    }
    hca_send_slot_publish(qp, slot, HCA_MSG_SEND,
                          HCA_MSG_FIRST | HCA_MSG_LAST |
                          ((opcode == HCA_WR_SEND_WITH_IMM) ?
                           HCA_MSG_WITH_IMM : 0),
                          length, imm_data);
    qp->cnt->tx_ops[opcode]++;
    qp->cnt->tx_bytes[opcode] += length;
    return 0;
}

void hca_send_cancel(hca_qp_t *qp, hca_send_slot_t *slot)
{
    hca_send_slot_publish(qp, slot, HCA_MSG_NOP, 0, 0, 0);
}

/* ---------------------------------------------------------------- RDMA */

void hca_direct_forget(hca_qp_t *qp)
{
    memset(&qp->dcache, 0, sizeof(qp->dcache));
}

/* Looks rkey up in the peer's MPT and caches it: only a valid MR of the
 * target QP's PD inside device memory we can map. */
static int hca_direct_fill(hca_qp_t *qp, hca_qp_pub_t *pub, uint32_t rkey)
{
    hca_peer_t *peer = qp->peer;
    uint32_t index   = rkey >> 8;
    hca_mpt_entry_t *entry;
    uint64_t addr, length, dm_off;
    uint32_t access, dm_id, pd;
    hca_map_t *map;

    hca_direct_forget(qp);
    if ((index == 0) || (index >= peer->hdr.max_mr)) {
        return -EINVAL;
    }
    entry = &peer->mpt[index];
    if ((atomic_load_explicit(&entry->state, memory_order_acquire) !=
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
    if ((dm_id == 0) || (pd != pub->pd_handle)) {
        return -EINVAL; /* plain memory: CMA or the responder */
    }
    map = hca_peer_dm(qp->dev, peer, dm_id);
    if ((map == NULL) || (dm_off > map->shm.length) ||
        (length > map->shm.length - dm_off)) {
        return -EINVAL;
    }
    qp->dcache.mode = hca_access_mode(qp->dev, peer);
    if (qp->dcache.mode == HCA_ACCESS_RESPONDER) {
        return -EINVAL;
    }
    qp->dcache.base   = (uint8_t*)map->shm.addr + dm_off;
    qp->dcache.entry  = entry;
    qp->dcache.addr   = addr;
    qp->dcache.length = length;
    qp->dcache.access = access;
    qp->dcache.dm_id  = dm_id;
    qp->dcache.rkey   = rkey;
    return 0;
}

/* Begins a direct access: our mapping of [raddr, raddr+length) of the MR
 * rkey, or NULL.  Until hca_access_end() a deregistration of that MR
 * waits for us (see hca_access_fence.c). */
HCA_INLINE uint8_t *hca_direct_target(hca_qp_t *qp, hca_qp_pub_t *pub,
                                      uint32_t rkey, uint64_t raddr,
                                      uint64_t length, unsigned access,
                                      unsigned align)
{
    hca_mpt_entry_t *entry;
    uint64_t off;

    if (HCA_UNLIKELY((qp->dcache.rkey != rkey) || (rkey == 0)) &&
        (hca_direct_fill(qp, pub, rkey) != 0)) {
        return NULL;
    }
    entry = qp->dcache.entry;
    /* announce, mark, then check: the owner invalidates, then looks (see
     * hca_access_fence.c); the mark is renewed on every access because a
     * new registration under the same key starts unmarked */
    hca_access_announce(qp, qp->dcache.mode);
    hca_access_mark(entry, (uint32_t)qp->peer->mapper_slot,
                    qp->dcache.mode == HCA_ACCESS_BUSY);
    if (HCA_UNLIKELY((atomic_load_explicit(&entry->state,
                                           memory_order_seq_cst) !=
                      HCA_MPT_VALID) ||
                     (atomic_load_explicit(&entry->key,
                                           memory_order_relaxed) != rkey) ||
                     /* the same key after its tag wrapped: another MR */
                     (entry->addr != qp->dcache.addr) ||
                     (entry->length != qp->dcache.length) ||
                     (entry->dm_id != qp->dcache.dm_id))) {
        hca_access_end(qp);
        hca_direct_forget(qp); /* deregistered (or reused) */
        return NULL;
    }
    off = raddr - qp->dcache.addr;
    if (HCA_UNLIKELY(((qp->dcache.access & access) != access) ||
                     (raddr < qp->dcache.addr) ||
                     (off > qp->dcache.length) ||
                     (length > qp->dcache.length - off) ||
                     (raddr & (align - 1)))) {
        hca_access_end(qp);
        return NULL;
    }
    return qp->dcache.base + off;
}

void *hca_direct_ptr(hca_qp_t *qp, uint64_t remote_addr, uint32_t rkey,
                     size_t length, unsigned access)
{
    hca_wr_opcode_t op = (access == HCA_ACCESS_REMOTE_READ) ?
                         HCA_WR_RDMA_READ : HCA_WR_RDMA_WRITE;
    hca_qp_pub_t *pub;
    uint8_t *p;

    if (HCA_UNLIKELY((access != HCA_ACCESS_REMOTE_READ) &&
                     (access != HCA_ACCESS_REMOTE_WRITE)) ||
        HCA_UNLIKELY(!hca_direct_idle(qp)) ||
        HCA_UNLIKELY(hca_shm_target(qp, &pub) != HCA_WC_SUCCESS) ||
        HCA_UNLIKELY(!(pub->access & access))) {
        return NULL;
    }
    p = hca_direct_target(qp, pub, rkey, remote_addr, length, access, 1);
    if (HCA_LIKELY(p != NULL)) {
        qp->dcache.open = 1;
        /* the caller moves the data now, then calls hca_direct_done():
         * count it as that RDMA op */
        qp->cnt->tx_ops[op]++;
        qp->cnt->tx_bytes[op] += length;
        qp->cnt->mapped_ops++;
    }
    return p;
}

int hca_write_direct(hca_qp_t *qp, const void *buf, size_t length,
                     uint64_t remote_addr, uint32_t rkey)
{
    hca_qp_pub_t *pub;
    uint8_t *dst;

    if (HCA_UNLIKELY(!hca_direct_idle(qp)) ||
        HCA_UNLIKELY(hca_shm_target(qp, &pub) != HCA_WC_SUCCESS) ||
        HCA_UNLIKELY(!(pub->access & HCA_ACCESS_REMOTE_WRITE))) {
        return -EAGAIN;
    }
    dst = hca_direct_target(qp, pub, rkey, remote_addr, length,
                            HCA_ACCESS_REMOTE_WRITE, 1);
    if (HCA_UNLIKELY(dst == NULL)) {
        return -EAGAIN;
    }
    if (length != 0) { /* buf may be NULL then */
        memcpy(dst, buf, length);
    }
    hca_access_end(qp);
    qp->cnt->tx_ops[HCA_WR_RDMA_WRITE]++;
    qp->cnt->tx_bytes[HCA_WR_RDMA_WRITE] += length;
    qp->cnt->mapped_ops++;
    return 0;
}

int hca_atomic_direct(hca_qp_t *qp, hca_wr_opcode_t opcode, unsigned size,
                      uint64_t remote_addr, uint32_t rkey,
                      uint64_t compare_add, uint64_t swap, void *result)
{
    hca_qp_pub_t *pub;
    uint8_t *target;
    uint64_t old;

    if (HCA_UNLIKELY(!hca_direct_idle(qp)) ||
        HCA_UNLIKELY((unsigned)opcode >= HCA_WR_OPCODE_LAST) ||
        HCA_UNLIKELY(!(hca_opcode[opcode].flags & HCA_OPF_ATOMIC)) ||
        HCA_UNLIKELY((size != 4) && (size != 8)) ||
        HCA_UNLIKELY(hca_shm_target(qp, &pub) != HCA_WC_SUCCESS) ||
        HCA_UNLIKELY(!(pub->access & HCA_ACCESS_REMOTE_ATOMIC))) {
        return -EAGAIN;
    }
    target = hca_direct_target(qp, pub, rkey, remote_addr, size,
                               HCA_ACCESS_REMOTE_ATOMIC, size);
    if (HCA_UNLIKELY(target == NULL)) {
        return -EAGAIN;
    }
    old = hca_atomic_apply((uint8_t)opcode, target, (int)size, compare_add,
                           swap);
    hca_access_end(qp);
    if (result != NULL) {
        hca_atomic_store_old(result, (int)size, old);
    }
    qp->cnt->tx_ops[opcode]++;
    qp->cnt->tx_bytes[opcode] += size;
    qp->cnt->mapped_ops++;
    return 0;
}

void hca_direct_done(hca_qp_t *qp)
{
    qp->dcache.open = 0;
    hca_access_end(qp);
}

void hca_direct_close(hca_qp_t *qp)
{
    if (qp->dcache.open) {
        hca_direct_done(qp);
    }
}
