/*
 * hca_shm_answer.c - the responder's answers to requesters of other
 * processes: the response slot in the requester QP's q object (and its
 * bounce area, for the responder thread's chunks), the wakeup of its send
 * CQ, and what happens when no answer can be written.
 *
 * Mappings of requesters' q objects are a cache of at most
 * HCA_QOBJ_CACHE_MAX, under one lock held while a mapping is used: a
 * target answers many QPs over its life (65,486 QP creations against one
 * target once exhausted vm.max_map_count, and every later request was
 * dropped without an answer).  Mappings of QPs that are gone go first,
 * then the least recently used.  If a q object still cannot be mapped,
 * the requester QP is told in its published entry (nak_qpn), and it
 * fails at its next liveness check instead of waiting forever.
 */
#include "hca_shm_fabric.h"
#include "hca_queue.h"
#include "hca_log.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HCA_QOBJ_CACHE_MAX 256


/* A mapping whose QP is gone (or whose process is) will not be answered
 * again: its QPN is never reused with the same generation soon. */
static int hca_qobj_stale(const hca_peer_t *peer, const hca_map_t *map)
{
    uint32_t idx = HCA_QPN_INDEX((uint32_t)map->id);

    return atomic_load(&peer->dead) || (idx == 0) ||
           (idx >= peer->hdr.max_qp) ||
           (atomic_load(&peer->qp_pub[idx].qpn) != (uint32_t)map->id);
}

/* Unmaps stale mappings, or (all == 1, or none was stale and the cache
 * is full) the least recently used one.  Caller holds qobj_lock. */
static void hca_qobj_evict(hca_device_t *dev, int all)
{
    hca_map_t **lru_link = NULL;
    hca_map_t *lru       = NULL;
    int freed            = 0;

    for (hca_peer_t *peer = hca_shm_dev(dev)->peers; peer != NULL; peer = peer->next) {
        hca_map_t **link = &peer->qobjs;
        hca_map_t *map;
        while ((map = *link) != NULL) {
            if (all || hca_qobj_stale(peer, map)) {
                *link = map->next;
                hca_memobj_destroy(&map->obj);
                free(map);
                hca_shm_dev(dev)->n_qobjs--;
                ++freed;
                continue;
            }
            if ((lru == NULL) || (map->used < lru->used)) {
                lru      = map;
                lru_link = link;
            }
            link = &map->next;
        }
    }
    if (!freed && (lru != NULL) && (hca_shm_dev(dev)->n_qobjs >= HCA_QOBJ_CACHE_MAX)) {
        *lru_link = lru->next;
        hca_memobj_destroy(&lru->obj);
        free(lru);
        hca_shm_dev(dev)->n_qobjs--;
    }
}

/* The mapping of the requester's q object, or NULL.  Caller holds
 * qobj_lock. */
static hca_map_t *hca_qobj_map(hca_device_t *dev, hca_peer_t *peer,
                               uint32_t qpn)
{
    hca_map_t *map;

    for (map = peer->qobjs; map != NULL; map = map->next) {
        if (map->id == qpn) {
            map->used = ++hca_shm_dev(dev)->qobj_tick;
            return map;
        }
    }
    if (hca_shm_dev(dev)->n_qobjs >= HCA_QOBJ_CACHE_MAX) {
        hca_qobj_evict(dev, 0);
    }
    map = hca_peer_qobj_map(dev, peer, qpn);
    if (map == NULL) {
        /* out of mappings or descriptors: give back all ours, once */
        hca_qobj_evict(dev, 1);
        map = hca_peer_qobj_map(dev, peer, qpn);
    }
    if (map == NULL) {
        return NULL;
    }
    map->used   = ++hca_shm_dev(dev)->qobj_tick;
    map->next   = peer->qobjs;
    peer->qobjs = map;
    hca_shm_dev(dev)->n_qobjs++;
    return map;
}

int hca_answer_begin(hca_device_t *dev, uint32_t src_pid, uint32_t src_ctx,
                     uint32_t src_qpn, uint32_t resp_idx, hca_answer_t *a)
{
    uint32_t src_idx = HCA_QPN_INDEX(src_qpn);
    hca_port_addr_t addr;

    memset(a, 0, sizeof(*a));
    memset(&addr, 0, sizeof(addr));
    addr.host   = dev->host_key;
    addr.pid    = src_pid;
    addr.ctx_id = src_ctx;
    a->peer     = hca_peer_get(dev, &addr);
    if ((a->peer == NULL) || (src_idx == 0) ||
        (src_idx >= a->peer->hdr.max_qp)) {
        return -1; /* nobody to answer (gone, or forged) */
    }
    a->src_qpn = src_qpn;
    if (HCA_UNLIKELY(dev->fault.answer_delay_us != 0)) {
        usleep(dev->fault.answer_delay_us);
    }
    pthread_mutex_lock(&hca_shm_dev(dev)->qobj_lock);
    a->map = hca_qobj_map(dev, a->peer, src_qpn);
    if (a->map == NULL) {
        pthread_mutex_unlock(&hca_shm_dev(dev)->qobj_lock);
        if (atomic_exchange(&a->peer->qp_pub[src_idx].nak_qpn, src_qpn) !=
            src_qpn) { /* once per QP */
            hca_log("cannot map the q object of QP 0x%x of pid %u to "
                    "answer it: that QP fails", src_qpn, src_pid);
        }
        __atomic_fetch_add(&dev->svc_cnt->errors[HCA_WC_REM_OP_ERR], 1,
                           __ATOMIC_RELAXED);
        return -1;
    }
    if (resp_idx >= a->map->sq_depth) {
        pthread_mutex_unlock(&hca_shm_dev(dev)->qobj_lock);
        return -1; /* forged: no such slot */
    }
    a->resp_idx = resp_idx;
    return 0;
}

void hca_answer_end(hca_device_t *dev, hca_answer_t *a, uint32_t stamp,
                    hca_wc_status_t status, uint64_t value)
{
    hca_peer_t *peer = a->peer;
    uint32_t cq_idx;

    hca_resp_slot_fill(&a->map->resp[a->resp_idx], stamp, status, value);
    pthread_mutex_unlock(&hca_shm_dev(dev)->qobj_lock);
    cq_idx = peer->qp_pub[HCA_QPN_INDEX(a->src_qpn)].send_cq_idx;
    if (cq_idx < peer->hdr.max_cq) {
        hca_cq_wake_armed(dev, &peer->notify[cq_idx], &peer->notify_to,
                          cq_idx);
    }
}

/* The fabric's answer op: a SEND_PULL's sender learns how it ended. */
void hca_shm_answer(hca_device_t *dev, const hca_msg_hdr_t *hdr,
                    const hca_pull_hdr_t *pull, hca_wc_status_t status)
{
    hca_answer_t a;

    if (hca_answer_begin(dev, hdr->src_pid, hdr->src_ctx, hdr->src_qpn,
                         pull->resp_idx, &a) == 0) {
        hca_answer_end(dev, &a, pull->resp_stamp, status, 0);
    }
}
