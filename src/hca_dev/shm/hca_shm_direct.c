/*
 * hca_shm_direct.c - the shm fabric's direct paths: operations a
 * transport issues on an idle send queue that complete inside the call,
 * with no work request, no WQE and no CQE.
 *
 *   - direct send: the caller writes the payload straight into a claimed
 *     slot of the target's receive ring (fast ops send_reserve/commit);
 *   - direct RDMA WRITE and atomics on a peer's device memory or exported
 *     shared memory, which this process maps: a memcpy or one CPU atomic,
 *     through the checked access of hca_shm_access.c (the QP caches the
 *     last MPT entry it used, so the key check is two loads of a line
 *     that stays in our cache; deregistration is kept safe by the QP's
 *     busy word, hca_shm_fence.c).
 *
 * Anything else returns -EAGAIN and the caller posts a WR, whose path
 * checks everything again and reports the error, if any.
 */
#include "hca_shm_access.h"
#include "hca_shm_target.h"
#include "hca_queue.h"
#include "hca_counters.h"

#include <errno.h>
#include <string.h>

/* ---------------------------------------------------------------- reserve */

HCA_INLINE int hca_shm_reserve(hca_qp_t *qp, uint32_t length_hint,
                               hca_send_slot_t *slot)
{
    hca_ring_send_t s;
    hca_qp_pub_t *pub;
    hca_ring_t *ring;
    uint8_t *msg;
    uint32_t off;

    if (HCA_UNLIKELY(!hca_sq_idle(qp)) ||
        HCA_UNLIKELY(hca_shm_target_cached(qp, &pub) != HCA_WC_SUCCESS)) {
        return -EBUSY;
    }
    ring = hca_shm_target_ring(qp, pub);
    if (HCA_UNLIKELY(ring == NULL)) {
        return -EBUSY;
    }
    msg = hca_ring_send_claim(&s, ring);
    if (HCA_UNLIKELY(msg == NULL)) {
        /* the caller applies the ring-full rule (hca_qp_send_blocked) */
        qp->cnt->ring_full++;
        return -EAGAIN;
    }
    /* the ring had room: a full-ring timer (hca_qp_send_blocked) stops */
    hca_qp_progressed(qp);
    off              = hca_msg_data_off(length_hint);
    slot->data       = msg + off;
    slot->max_length = hca_msg_room(off);
    slot->data_off   = (uint8_t)off;
    slot->index      = s.idx;
    slot->ring       = ring;
    slot->wake       = (uint8_t)s.wake;
    return 0;
}

int hca_shm_send_reserve(hca_qp_t *qp, uint32_t length_hint,
                         hca_send_slot_t *slot)
{
    return hca_shm_reserve(qp, length_hint, slot);
}

HCA_INLINE void hca_send_slot_publish(hca_qp_t *qp, hca_send_slot_t *slot,
                                      uint8_t op, uint8_t flags,
                                      uint32_t length, uint32_t imm)
{
    hca_ring_send_t s  = {slot->ring, slot->index, slot->wake};
    hca_msg_hdr_t *msg = hca_ring_slot(s.ring, s.idx);

    hca_msg_hdr_set(msg, qp, op, flags, slot->data_off, imm, length,
                    length);
    hca_ring_send_post(qp->dev, &s, hca_shm_wake_to(qp));
}

/* The ring flags of a whole SEND in one slot. */
HCA_INLINE uint8_t hca_send_msg_flags(hca_wr_opcode_t opcode)
{
    return HCA_MSG_FIRST | HCA_MSG_LAST |
           ((opcode == HCA_WR_SEND_WITH_IMM) ? HCA_MSG_WITH_IMM : 0);
}

int hca_shm_send_commit(hca_qp_t *qp, hca_send_slot_t *slot, uint32_t length,
                        hca_wr_opcode_t opcode, uint32_t imm_data)
{
    if (HCA_UNLIKELY((length > slot->max_length) ||
                     ((opcode != HCA_WR_SEND) &&
                      (opcode != HCA_WR_SEND_WITH_IMM)))) {
        hca_shm_send_cancel(qp, slot);
        return -EINVAL;
    }
    hca_send_slot_publish(qp, slot, HCA_MSG_SEND,
                          hca_send_msg_flags(opcode),
                          length, imm_data);
    hca_count_tx(qp, opcode, length);
    return 0;
}

void hca_shm_send_cancel(hca_qp_t *qp, hca_send_slot_t *slot)
{
    hca_send_slot_publish(qp, slot, HCA_MSG_NOP, 0, 0, 0);
}

/* reserve + two copies + commit in one call: a transport's short send
 * (UCT am_short) costs one call into the device. */
int hca_shm_send_short(hca_qp_t *qp, const void *hdr, uint32_t hdr_length,
                       const void *data, uint32_t length,
                       hca_wr_opcode_t opcode, uint32_t imm_data)
{
    uint32_t total = hdr_length + length;
    hca_send_slot_t slot;
    uint8_t *p;
    int rc;

    if (HCA_UNLIKELY((opcode != HCA_WR_SEND) &&
                     (opcode != HCA_WR_SEND_WITH_IMM))) {
        return -EINVAL;
    }
    rc = hca_shm_reserve(qp, total, &slot);
    if (HCA_UNLIKELY(rc != 0)) {
        return rc;
    }
    if (HCA_UNLIKELY(total > slot.max_length)) {
        hca_shm_send_cancel(qp, &slot);
        return -EBUSY; /* longer than a slot: post a WR */
    }
    p = slot.data;
    if (HCA_LIKELY(hdr_length == sizeof(uint64_t))) {
        memcpy(p, hdr, sizeof(uint64_t)); /* a transport's AM header: one
                                             store */
    } else if (hdr_length != 0) { /* NULL pointers are fine with 0 bytes */
        memcpy(p, hdr, hdr_length);
    }
    if (length != 0) {
        memcpy(p + hdr_length, data, length);
    }
    hca_send_slot_publish(qp, &slot, HCA_MSG_SEND,
                          hca_send_msg_flags(opcode),
                          total, imm_data);
    hca_count_tx(qp, opcode, total);
    return 0;
}

/* ---------------------------------------------------------------- RDMA */

void *hca_shm_direct_ptr(hca_qp_t *qp, uint64_t remote_addr, uint32_t rkey,
                     size_t length, unsigned access)
{
    hca_wr_opcode_t op = (access == HCA_ACCESS_REMOTE_READ) ?
                         HCA_WR_RDMA_READ : HCA_WR_RDMA_WRITE;
    hca_qp_pub_t *pub;
    uint8_t *p;

    if (HCA_UNLIKELY((access != HCA_ACCESS_REMOTE_READ) &&
                     (access != HCA_ACCESS_REMOTE_WRITE)) ||
        HCA_UNLIKELY(!hca_sq_idle(qp)) || hca_direct_is_plain(qp, rkey) ||
        HCA_UNLIKELY(hca_shm_target_cached(qp, &pub) != HCA_WC_SUCCESS) ||
        HCA_UNLIKELY(!(pub->access & access))) {
        return NULL;
    }
    p = hca_direct_target(qp, pub, rkey, remote_addr, length, access, 1);
    if (HCA_LIKELY(p != NULL)) {
        hca_shm_qp(qp)->dcache.open = 1;
        /* the caller moves the data now, then calls direct_done:
         * count it as that RDMA op */
        hca_count_tx_mapped(qp, op, length);
    }
    return p;
}

int hca_shm_write_direct(hca_qp_t *qp, const void *buf, size_t length,
                     uint64_t remote_addr, uint32_t rkey)
{
    hca_qp_pub_t *pub;
    uint8_t *dst;

    if (HCA_UNLIKELY(!hca_sq_idle(qp)) || hca_direct_is_plain(qp, rkey) ||
        HCA_UNLIKELY(hca_shm_target_cached(qp, &pub) != HCA_WC_SUCCESS) ||
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
    hca_count_tx_mapped(qp, HCA_WR_RDMA_WRITE, length);
    return 0;
}

/* ---------------------------------------------------------------- atomics */

/* The fast op: step 1 only.  The WR that follows a -EAGAIN takes steps 2
 * and 3, and reports an error. */
int hca_shm_atomic_direct(hca_qp_t *qp, hca_wr_opcode_t opcode, unsigned size,
                          uint64_t remote_addr, uint32_t rkey,
                          uint64_t compare_add, uint64_t swap, void *result)
{
    hca_qp_pub_t *pub;
    uint64_t old;

    if (HCA_UNLIKELY(!hca_sq_idle(qp)) ||
        HCA_UNLIKELY((unsigned)opcode >= HCA_WR_OPCODE_LAST) ||
        HCA_UNLIKELY(!(hca_opcode[opcode].flags & HCA_OPF_ATOMIC)) ||
        HCA_UNLIKELY((size != 4) && (size != 8)) ||
        HCA_UNLIKELY(hca_shm_target_cached(qp, &pub) != HCA_WC_SUCCESS) ||
        HCA_UNLIKELY(!(pub->access & HCA_ACCESS_REMOTE_ATOMIC)) ||
        !hca_shm_atomic_cached(qp, pub, opcode, size, rkey, remote_addr,
                               compare_add, swap, &old)) {
        return -EAGAIN;
    }
    if (result != NULL) {
        hca_atomic_store_old(result, (int)size, old);
    }
    hca_count_tx(qp, opcode, size);
    return 0;
}

void hca_shm_direct_done(hca_qp_t *qp)
{
    hca_shm_qp(qp)->dcache.open = 0;
    hca_access_end(qp);
}

void hca_direct_close(hca_qp_t *qp)
{
    if (hca_shm_qp(qp)->dcache.open) {
        hca_shm_direct_done(qp);
    }
}

/* ---------------------------------------------------------------- direct */

/* The doorbell's fast path: a WR that needs no CQE, posted on an idle send
 * queue (the caller checked that, and its local SGEs), executed right here
 * from the caller's WR - no WQE, no inline copy, no queue walk.  Every
 * check runs before any side effect; if one fails, or the WR needs the
 * peer's help, 0 sends it down the queue, which does the same checks again
 * and reports the error (an error costs two checks; plain memory of
 * another process, which only its responder serves, goes down the queue
 * before any check). */
int hca_shm_post_direct(hca_qp_t *qp, hca_send_wr_t *wr, uint64_t length)
{
    const hca_opcode_info_t *info = &hca_opcode[wr->opcode];
    int size = (wr->send_flags & HCA_SEND_ATOMIC32) ? 4 : 8;
    hca_wc_status_t status;
    hca_ring_send_t s;
    hca_msg_hdr_t *msg;
    hca_qp_pub_t *pub;
    hca_ring_t *ring;
    uint64_t old;

    if (HCA_UNLIKELY(hca_shm_target_cached(qp, &pub) != HCA_WC_SUCCESS)) {
        return 0;
    }

    switch (wr->opcode) {
    case HCA_WR_SEND:
    case HCA_WR_SEND_WITH_IMM:
        if (length > HCA_SLOT_PAYLOAD) {
            return 0;
        }
        ring = hca_shm_target_ring(qp, pub);
        if ((ring == NULL) || ((msg = hca_ring_send_claim(&s, ring)) == NULL)) {
            return 0;
        }
        hca_msg_hdr_set(msg, qp, HCA_MSG_SEND,
                        HCA_MSG_FIRST | HCA_MSG_LAST |
                        ((wr->opcode == HCA_WR_SEND_WITH_IMM) ?
                         HCA_MSG_WITH_IMM : 0),
                        hca_msg_data_off(length), wr->imm_data,
                        (uint32_t)length, (uint32_t)length);
        hca_sge_gather(wr->sg_list, (uint32_t)wr->num_sge, 0,
                       (uint8_t*)msg + msg->data_off, length);
        hca_ring_send_post(qp->dev, &s, hca_shm_wake_to(qp));
        break;
    case HCA_WR_RDMA_WRITE:
    case HCA_WR_RDMA_READ: {
        hca_xfer_t x = {wr->sg_list, (uint32_t)wr->num_sge, wr->rdma.rkey,
                        wr->rdma.remote_addr, length};
        if ((hca_shm_rdma_direct(qp, &x, pub,
                                 wr->opcode == HCA_WR_RDMA_WRITE,
                                 &status) != 0) ||
            (status != HCA_WC_SUCCESS)) {
            return 0;
        }
        break;
    }
    default:
        /* plain memory of another process: only a WR can ask its
         * responder, and that WR's execution checks it */
        if (!(info->flags & HCA_OPF_ATOMIC) ||
            (hca_direct_is_plain(qp, wr->rdma.rkey) &&
             !hca_shm_qp(qp)->peer->self) ||
            (hca_shm_atomic_exec(qp, pub, wr->opcode, (unsigned)size,
                                 wr->rdma.rkey, wr->rdma.remote_addr,
                                 wr->compare_add, wr->swap, &old) !=
             HCA_WC_SUCCESS)) {
            return 0;
        }
        if (info->flags & HCA_OPF_FETCH) {
            hca_atomic_store_old((void*)(uintptr_t)wr->sg_list[0].addr,
                                 size, old);
        }
        length = (uint64_t)size;
        break;
    }
    hca_count_tx(qp, wr->opcode, length);
    return 1;
}


/* ---------------------------------------------------------------- rkey_ptr */

int hca_shm_rkey_ptr(hca_qp_t *qp, uint64_t remote_addr, uint32_t rkey,
                     size_t length, void **ptr_p)
{
    hca_mpt_entry_t *entry;
    hca_wc_status_t status;
    hca_qp_pub_t *pub;
    hca_map_t *map;
    uint64_t offset;
    uint32_t dm_id;

    if (hca_shm_qp(qp)->peer == NULL) {
        return -ENOTCONN;
    }
    if (hca_shm_target(qp, &pub) != HCA_WC_SUCCESS) {
        return -ENOTCONN;
    }
    /* a pointer reads and writes: both rights, of the MR and the QP */
    if ((pub->access & HCA_RKEY_PTR_ACCESS) != HCA_RKEY_PTR_ACCESS) {
        return -EACCES;
    }
    status = hca_access_begin(qp, rkey, pub->pd_handle, HCA_RKEY_PTR_ACCESS,
                              remote_addr, length, 1, &entry);
    if (status == HCA_WC_STATUS_LAST) {
        return -ENOENT; /* not ours to map: its responder only */
    }
    if (status != HCA_WC_SUCCESS) {
        return -EACCES;
    }
    dm_id  = entry->dm_id;
    offset = entry->dm_offset + (remote_addr - entry->addr);
    hca_access_finish(qp, entry);
    if ((dm_id == 0) || (dm_id & HCA_DM_EXPORT)) {
        /* device memory only: a pointer into an export would outlive
         * the registration (the access ends here), and the owner may
         * reuse that memory once it deregistered */
        return -ENOENT;
    }
    map = hca_peer_dm(qp->dev, hca_shm_qp(qp)->peer, dm_id);
    *ptr_p = hca_map_range(map, offset, length);
    return (*ptr_p != NULL) ? 0 : -EACCES;
}
