/*
 * hca_shm_target.h - what every requester path of the shm fabric checks
 * before touching a peer (its target QP), and the CPU atomics; inline
 * because the direct paths (hca_shm_direct.c) run them on every call.
 */
#ifndef HCA_SHM_TARGET_H
#define HCA_SHM_TARGET_H

#include "hca_shm_fabric.h"
#include "hca_atomic.h"
#include "hca_mpt.h"

#include <string.h>


/* The target QP's table entry: the peer is there and alive, and the QP
 * number is inside its table.  On success *pub_p is the entry (not yet
 * checked: hca_qp_pub_check). */
HCA_INLINE hca_wc_status_t hca_shm_target_entry(hca_qp_t *qp,
                                                hca_qp_pub_t **pub_p)
{
    hca_peer_t *peer = hca_shm_qp(qp)->peer;
    uint32_t idx     = HCA_QPN_INDEX(qp->dest_qpn);

    if (HCA_UNLIKELY(peer == NULL)) {
        peer = hca_shm_qp(qp)->peer = hca_peer_get(qp->dev, &qp->dest);
        if (peer == NULL) {
            return HCA_WC_RETRY_EXC_ERR;
        }
    }
    if (HCA_UNLIKELY(atomic_load_explicit(&peer->dead,
                                          memory_order_relaxed))) {
        return HCA_WC_RETRY_EXC_ERR;
    }
    if (HCA_UNLIKELY((idx == 0) || (idx >= peer->hdr.max_qp))) {
        return HCA_WC_REM_INV_REQ_ERR;
    }
    *pub_p = &peer->qp_pub[idx];
    return HCA_WC_SUCCESS;
}

/* The target QP's entry checked: it exists, is in RTR or RTS and accepts
 * us. */
HCA_INLINE hca_wc_status_t hca_shm_target_check(hca_qp_t *qp,
                                                const hca_qp_pub_t *pub)
{
    return hca_qp_pub_check(pub, qp->dest_qpn, qp->dev->host_key,
                            qp->dev->pid, qp->dev->ctx_id, qp->qpn);
}

/* The connected target QP: the peer is there, the QP exists, is in RTR or
 * RTS and accepts us.  On success *pub_p is its public entry. */
HCA_INLINE hca_wc_status_t hca_shm_target(hca_qp_t *qp,
                                          hca_qp_pub_t **pub_p)
{
    hca_wc_status_t status;
    hca_qp_pub_t *pub;

    status = hca_shm_target_entry(qp, &pub);
    if (HCA_LIKELY(status == HCA_WC_SUCCESS)) {
        status = hca_shm_target_check(qp, pub);
    }
    if (HCA_UNLIKELY(status != HCA_WC_SUCCESS)) {
        return status;
    }
    *pub_p = pub;
    return HCA_WC_SUCCESS;
}

/* hca_shm_target for the fast paths: while the target QP's table entry
 * keeps the generation it had when it was last checked in full, that
 * check stands (one load); else the full check, with the generation read
 * before it (a change after that read shows as a new generation). */
HCA_INLINE hca_wc_status_t hca_shm_target_cached(hca_qp_t *qp,
                                                 hca_qp_pub_t **pub_p)
{
    hca_shm_qp_t *sq = hca_shm_qp(qp);
    hca_wc_status_t status;
    hca_qp_pub_t *pub;
    uint64_t gen;

    if (HCA_LIKELY(sq->tgt_pub != NULL) &&
        HCA_LIKELY(atomic_load_explicit(&sq->tgt_pub->gen,
                                        memory_order_acquire) ==
                   sq->tgt_gen) &&
        HCA_LIKELY(!atomic_load_explicit(&sq->peer->dead,
                                         memory_order_relaxed))) {
        *pub_p = sq->tgt_pub;
        return HCA_WC_SUCCESS;
    }
    sq->tgt_pub = NULL;
    status      = hca_shm_target_entry(qp, &pub);
    if (status != HCA_WC_SUCCESS) {
        return status;
    }
    gen    = atomic_load_explicit(&pub->gen, memory_order_acquire);
    status = hca_shm_target_check(qp, pub);
    if (status != HCA_WC_SUCCESS) {
        return status;
    }
    sq->tgt_pub = pub;
    sq->tgt_gen = gen;
    *pub_p      = pub;
    return HCA_WC_SUCCESS;
}

/* The target QP's receive ring (mapped on first use). */
HCA_INLINE hca_ring_t *hca_shm_target_ring(hca_qp_t *qp, hca_qp_pub_t *pub)
{
    uint32_t ring_id = pub->ring_id;

    if (HCA_UNLIKELY((hca_shm_qp(qp)->tgt_ring == NULL) ||
                     (hca_shm_qp(qp)->tgt_ring_id != ring_id))) {
        hca_shm_qp(qp)->tgt_ring = hca_peer_ring(qp->dev, hca_shm_qp(qp)->peer, ring_id);
        if (hca_shm_qp(qp)->tgt_ring == NULL) {
            return NULL;
        }
        hca_shm_qp(qp)->tgt_ring_id = ring_id;
    }
    return &hca_shm_qp(qp)->tgt_ring->ring;
}

/* Whom the QP's ring sends wake (hca_ring_send_post): its peer. */
HCA_INLINE const hca_notify_ctx_t *hca_shm_wake_to(hca_qp_t *qp)
{
    return &hca_shm_qp(qp)->peer->notify_to;
}

/* Writes everything of a ring message header but its stamp. */
HCA_INLINE void hca_msg_hdr_set(hca_msg_hdr_t *msg, const hca_qp_t *qp,
                                uint8_t op, uint8_t flags, uint32_t data_off,
                                uint32_t imm, uint32_t length,
                                uint32_t msg_len)
{
    msg->op       = op;
    msg->flags    = flags;
    msg->num_iov  = 0;
    msg->data_off = (uint8_t)data_off;
    msg->src_pid  = qp->dev->pid;
    msg->src_ctx  = qp->dev->ctx_id;
    msg->src_qpn  = qp->qpn;
    msg->dst_qpn  = qp->dest_qpn;
    msg->imm      = imm;
    msg->length   = length;
    msg->msg_len  = msg_len;
}

#endif
