/*
 * hca_fabric_shm.c - the shm fabric, requester side: peers and their
 * mapped objects, and the execution of each opcode.
 *
 * Paths, fastest first:
 *   - the target is this process: memcpy / CPU atomics on its memory;
 *   - the target MR is device memory: memcpy / CPU atomics on our mapping;
 *   - single copy (process_vm_writev/readv) into/out of the target;
 *   - otherwise the target's responder thread executes it (atomics on
 *     plain memory; WRITE/READ in bounce-buffer chunks without CMA).
 * SENDs go through the target's receive ring: inline up to one slot, else
 * a descriptor that the target pulls by single copy, else fragments.
 * The requester checks the target QP and MPT itself before any access.
 */
#include "hca_access_fence.h"
#include "hca_shm_target.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---------------------------------------------------------------- peers */

static int hca_peer_validate(const hca_ctx_hdr_t *hdr, size_t length,
                             const hca_port_addr_t *addr)
{
    if ((hdr->magic != HCA_WIRE_MAGIC) || (hdr->version != HCA_WIRE_VERSION) ||
        (hdr->pid != addr->pid) || (hdr->ctx_id != addr->ctx_id) ||
        (hdr->max_mr == 0) || (hdr->max_mr > HCA_MAX_MR) ||
        (hdr->max_qp == 0) || (hdr->max_qp > HCA_MAX_QP) ||
        (hdr->max_cq == 0) || (hdr->max_cq > HCA_MAX_CQ)) {
        return -EPROTO;
    }
    /* off + n <= length, without overflow (the counts are bounded above) */
    if ((hdr->mpt_offset > length) ||
        (sizeof(hca_mpt_entry_t) * hdr->max_mr > length - hdr->mpt_offset) ||
        (hdr->qp_offset > length) ||
        (sizeof(hca_qp_pub_t) * (hdr->max_qp + 1) >
         length - hdr->qp_offset) ||
        (hdr->notify_offset > length) ||
        (sizeof(hca_notify_t) * hdr->max_cq > length - hdr->notify_offset) ||
        (hdr->svc_offset > length) ||
        (hca_ring_bytes(HCA_SVC_SLOTS, sizeof(hca_svc_req_t)) >
         length - hdr->svc_offset) ||
        (hdr->mappers_offset > length) ||
        (sizeof(hca_mapper_t) * HCA_MAX_MAPPERS >
         length - hdr->mappers_offset) ||
        (hdr->busy_offset > length) ||
        (sizeof(hca_busy_t) * (hdr->max_qp + 1) >
         length - hdr->busy_offset)) {
        return -EPROTO;
    }
    return 0;
}

/* Can we move data to/from the peer with process_vm_*?  We read a value
 * the peer published; EPERM means ptrace policy forbids it. */
static int hca_peer_probe_cma(hca_device_t *dev, hca_peer_t *peer)
{
    uint64_t value = 0;
    struct iovec local  = {.iov_base = &value, .iov_len = sizeof(value)};
    struct iovec remote = {.iov_base = (void*)(uintptr_t)peer->hdr.probe_addr,
                           .iov_len  = sizeof(value)};

    if (peer->self) {
        return 1;
    }
    if (!dev->single_copy || !peer->hdr.single_copy) {
        return 0;
    }
    if ((process_vm_readv((pid_t)peer->addr.pid, &local, 1, &remote, 1, 0)
         == (ssize_t)sizeof(value)) && (value == peer->hdr.probe_value)) {
        return 1;
    }
    hca_log("single copy to pid %u not permitted (%s): using the "
            "responder path", peer->addr.pid,
            (value == 0) ? strerror(errno) : "probe mismatch");
    return 0;
}

hca_peer_t *hca_peer_get(hca_device_t *dev, const hca_port_addr_t *addr)
{
    hca_peer_t *peer;
    char name[96];
    uint8_t *base;

    pthread_mutex_lock(&dev->lock);
    for (peer = dev->peers; peer != NULL; peer = peer->next) {
        if ((peer->addr.pid == addr->pid) &&
            (peer->addr.ctx_id == addr->ctx_id)) {
            goto out;
        }
    }
    if (!hca_host_id_equal(&dev->host, &addr->host)) {
        goto out; /* NULL: not on this host */
    }
    peer = calloc(1, sizeof(*peer));
    if (peer == NULL) {
        goto out;
    }
    hca_ctx_name(name, sizeof(name), addr->host.pid_ns, addr->pid,
                 addr->ctx_id);
    if ((hca_shm_map(&peer->ctx, name, sizeof(hca_ctx_hdr_t)) != 0) ||
        (memcpy(&peer->hdr, peer->ctx.addr, sizeof(peer->hdr)),
         hca_peer_validate(&peer->hdr, peer->ctx.length, addr) != 0)) {
        hca_shm_destroy(&peer->ctx);
        free(peer);
        peer = NULL;
        goto out;
    }
    base         = peer->ctx.addr;
    peer->addr   = *addr;
    peer->pidns  = addr->host.pid_ns;
    peer->self   = (addr->pid == dev->pid);
    peer->mpt    = (hca_mpt_entry_t*)(base + peer->hdr.mpt_offset);
    peer->qp_pub = (hca_qp_pub_t*)(base + peer->hdr.qp_offset);
    peer->notify = (hca_notify_t*)(base + peer->hdr.notify_offset);
    peer->mappers = (hca_mapper_t*)(base + peer->hdr.mappers_offset);
    peer->busy    = (hca_busy_t*)(base + peer->hdr.busy_offset);
    hca_ring_attach(&peer->svc, base + peer->hdr.svc_offset, HCA_SVC_SLOTS,
                    sizeof(hca_svc_req_t));
    peer->svc.claim_mark = dev->claim_mark;
    peer->cma_ok = hca_peer_probe_cma(dev, peer);
    peer->mapper_slot = -1;
    peer->next   = dev->peers;
    dev->peers   = peer;
out:
    pthread_mutex_unlock(&dev->lock);
    return peer;
}

static void hca_map_list_destroy(_Atomic(hca_map_t*) *list)
{
    hca_map_t *map = atomic_load(list);

    while (map != NULL) {
        hca_map_t *next = map->next;
        hca_shm_destroy(&map->shm);
        free(map);
        map = next;
    }
    atomic_store(list, NULL);
}

void hca_peers_destroy(hca_device_t *dev)
{
    pthread_mutex_lock(&dev->lock);
    while (dev->peers != NULL) {
        hca_peer_t *peer = dev->peers;
        dev->peers       = peer->next;
        hca_access_unregister(dev, peer);
        hca_map_list_destroy(&peer->rings);
        while (peer->qobjs != NULL) {
            hca_map_t *map = peer->qobjs;
            peer->qobjs    = map->next;
            hca_shm_destroy(&map->shm);
            free(map);
        }
        hca_map_list_destroy(&peer->dms);
        hca_shm_destroy(&peer->ctx);
        free(peer);
    }
    pthread_mutex_unlock(&dev->lock);
}

static hca_map_t *hca_map_find(_Atomic(hca_map_t*) *list, uint64_t id)
{
    for (hca_map_t *map = atomic_load_explicit(list, memory_order_acquire);
         map != NULL; map = map->next) {
        if (map->id == id) {
            return map;
        }
    }
    return NULL;
}

typedef int (*hca_map_check_t)(hca_device_t *dev, hca_map_t *map);

/* Looks up (or maps and publishes) object `kind``id` of the peer. */
static hca_map_t *hca_peer_map(hca_device_t *dev, hca_peer_t *peer,
                               _Atomic(hca_map_t*) *list, const char *kind,
                               uint64_t id, size_t min_length,
                               hca_map_check_t check)
{
    hca_map_t *map = hca_map_find(list, id);
    char name[96];

    if (HCA_LIKELY(map != NULL)) {
        return map;
    }
    pthread_mutex_lock(&dev->lock);
    map = hca_map_find(list, id);
    if (map != NULL) {
        goto out;
    }
    map = hca_fault(dev, HCA_FAULT_MAP) ? NULL : calloc(1, sizeof(*map));
    if (map == NULL) {
        goto out;
    }
    hca_obj_name(name, sizeof(name), peer->pidns, peer->addr.pid,
                 peer->addr.ctx_id, peer->hdr.name_nonce, kind, id);
    if ((hca_shm_map(&map->shm, name, min_length) != 0) ||
        ((check != NULL) && (check(dev, map) != 0))) {
        hca_shm_destroy(&map->shm);
        free(map);
        map = NULL;
        goto out;
    }
    map->id   = id;
    map->next = atomic_load(list);
    atomic_store_explicit(list, map, memory_order_release);
out:
    pthread_mutex_unlock(&dev->lock);
    return map;
}

static int hca_ring_map_check(hca_device_t *dev, hca_map_t *map)
{
    hca_ring_hdr_t *hdr = map->shm.addr;

    if ((hdr->magic != HCA_WIRE_MAGIC) || (hdr->slots != HCA_RING_SLOTS) ||
        (hdr->slot_size != HCA_RING_SLOT_SIZE) ||
        (map->shm.length < hca_ring_bytes(HCA_RING_SLOTS,
                                          HCA_RING_SLOT_SIZE))) {
        return -EPROTO;
    }
    hca_ring_attach(&map->ring, hdr, HCA_RING_SLOTS, HCA_RING_SLOT_SIZE);
    map->ring.claim_mark = dev->claim_mark;
    return 0;
}

static int hca_qobj_map_check(hca_map_t *map)
{
    hca_qobj_hdr_t hdr;

    memcpy(&hdr, map->shm.addr, sizeof(hdr)); /* one read: the peer may
                                                 change it under us */
    if ((hdr.magic != HCA_WIRE_MAGIC) || (hdr.sq_depth == 0) ||
        (hdr.sq_depth > HCA_MAX_QP_WR) ||
        (hdr.resp_offset < sizeof(hdr)) ||
        (hdr.bounce_offset > map->shm.length) ||
        (hdr.resp_offset > hdr.bounce_offset) ||
        (sizeof(hca_resp_slot_t) * hdr.sq_depth >
         hdr.bounce_offset - hdr.resp_offset) ||
        (HCA_BOUNCE_SIZE > map->shm.length - hdr.bounce_offset)) {
        return -EPROTO;
    }
    map->resp     = (hca_resp_slot_t*)((uint8_t*)map->shm.addr +
                                       hdr.resp_offset);
    map->bounce   = (uint8_t*)map->shm.addr + hdr.bounce_offset;
    map->sq_depth = hdr.sq_depth;
    return 0;
}

hca_map_t *hca_peer_ring(hca_device_t *dev, hca_peer_t *peer,
                         uint32_t ring_id)
{
    return hca_peer_map(dev, peer, &peer->rings, "r", ring_id,
                        sizeof(hca_ring_hdr_t), hca_ring_map_check);
}

hca_map_t *hca_peer_qobj_map(hca_device_t *dev, hca_peer_t *peer,
                             uint32_t qpn)
{
    hca_map_t *map = hca_fault(dev, HCA_FAULT_MAP) ? NULL :
                     calloc(1, sizeof(*map));
    char name[96];

    if (map == NULL) {
        return NULL;
    }
    hca_obj_name(name, sizeof(name), peer->pidns, peer->addr.pid,
                 peer->addr.ctx_id, peer->hdr.name_nonce, "q", qpn);
    if ((hca_shm_map(&map->shm, name, sizeof(hca_qobj_hdr_t)) != 0) ||
        (hca_qobj_map_check(map) != 0)) {
        hca_shm_destroy(&map->shm);
        free(map);
        return NULL;
    }
    map->id = qpn;
    return map;
}

hca_map_t *hca_peer_dm(hca_device_t *dev, hca_peer_t *peer, uint32_t dm_id)
{
    return hca_peer_map(dev, peer, &peer->dms, "dm", dm_id, 1, NULL);
}

uint64_t hca_device_check_peers(hca_device_t *dev)
{
    uint32_t n = 0, full;

    pthread_mutex_lock(&dev->lock);
    full = dev->sweep_turn++;
    for (hca_peer_t *peer = dev->peers; peer != NULL; peer = peer->next) {
        if (peer->self || peer->counted_dead) {
            continue;
        }
        /* kill(pid, 0) for all; the start time (which also tells a
         * zombie, and a pid taken by a new process) for one, in turn */
        if ((kill((pid_t)peer->addr.pid, 0) != 0) && (errno == ESRCH)) {
            atomic_store(&peer->dead, 1);
        } else if (n++ == full) {
            (void)hca_peer_alive(peer);
        }
        if (atomic_load(&peer->dead)) { /* here, or by a liveness check */
            peer->counted_dead = 1;
            atomic_fetch_add(&dev->dead_peers, 1);
        }
    }
    if (full >= n) {
        dev->sweep_turn = 0;
    }
    pthread_mutex_unlock(&dev->lock);
    return atomic_load(&dev->dead_peers);
}

int hca_peer_alive(hca_peer_t *peer)
{
    uint64_t start = 0;
    int rc;

    if (atomic_load(&peer->dead)) {
        return 0;
    }
    /* gone, a zombie, a reused pid, or its context closed */
    rc = hca_proc_start_time(peer->addr.pid, &start);
    if ((rc == -ESRCH) || (rc == -ENOENT) ||
        ((rc == 0) && (start != peer->hdr.start_time)) ||
        (((hca_ctx_hdr_t*)peer->ctx.addr)->magic != HCA_WIRE_MAGIC)) {
        atomic_store(&peer->dead, 1);
        return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- copies */

/* Copies len bytes starting at byte `offset` of the SGE list into dst. */
static void hca_sge_gather(const hca_sge_t *sge, uint32_t num_sge,
                           uint64_t offset, void *dst, uint64_t len)
{
    uint8_t *out = dst;

    for (uint32_t i = 0; (i < num_sge) && (len > 0); ++i) {
        uint64_t n;
        if (offset >= sge[i].length) {
            offset -= sge[i].length;
            continue;
        }
        n = sge[i].length - offset;
        n = (n < len) ? n : len;
        memcpy(out, (uint8_t*)(uintptr_t)sge[i].addr + offset, n);
        out   += n;
        len   -= n;
        offset = 0;
    }
}

/* Copies len bytes of src into the SGE list starting at byte `offset`. */
static void hca_sge_scatter(const hca_sge_t *sge, uint32_t num_sge,
                            uint64_t offset, const void *src, uint64_t len)
{
    const uint8_t *in = src;

    for (uint32_t i = 0; (i < num_sge) && (len > 0); ++i) {
        uint64_t n;
        if (offset >= sge[i].length) {
            offset -= sge[i].length;
            continue;
        }
        n = sge[i].length - offset;
        n = (n < len) ? n : len;
        memcpy((uint8_t*)(uintptr_t)sge[i].addr + offset, in, n);
        in    += n;
        len   -= n;
        offset = 0;
    }
}

/* Single copy between our SGEs and [raddr, raddr+len) of pid.
 * 0, or the completion status. */
static hca_wc_status_t hca_cma_xfer(uint32_t pid, int write,
                                    const hca_sge_t *sge, uint32_t num_sge,
                                    uint64_t raddr)
{
    for (uint32_t i = 0; i < num_sge; ++i) {
        uint64_t done = 0;
        while (done < sge[i].length) {
            struct iovec local  = {
                .iov_base = (uint8_t*)(uintptr_t)sge[i].addr + done,
                .iov_len  = sge[i].length - done};
            struct iovec remote = {.iov_base = (void*)(uintptr_t)raddr,
                                   .iov_len  = local.iov_len};
            ssize_t n = write ?
                process_vm_writev((pid_t)pid, &local, 1, &remote, 1, 0) :
                process_vm_readv((pid_t)pid, &local, 1, &remote, 1, 0);
            if (n <= 0) {
                return (errno == ESRCH) ? HCA_WC_RETRY_EXC_ERR :
                                          HCA_WC_REM_OP_ERR;
            }
            done  += (uint64_t)n;
            raddr += (uint64_t)n;
        }
    }
    return HCA_WC_SUCCESS;
}

/* ---------------------------------------------------------------- target */

static void hca_msg_fill(hca_qp_t *qp, hca_msg_hdr_t *msg, uint8_t op,
                         uint8_t flags, const hca_wqe_t *wqe)
{
    if ((wqe->opcode == HCA_WR_SEND_WITH_IMM) ||
        (wqe->opcode == HCA_WR_RDMA_WRITE_WITH_IMM)) {
        flags |= HCA_MSG_WITH_IMM;
    }
    hca_msg_hdr_set(msg, qp, op, flags, HCA_MSG_DATA_NEAR, wqe->imm, 0,
                    (uint32_t)wqe->length);
}

static uint32_t hca_next_stamp(hca_qp_t *qp)
{
    if (++qp->stamp_seq == 0) {
        ++qp->stamp_seq;
    }
    return qp->stamp_seq;
}

/* ---------------------------------------------------------------- SEND */

static hca_exec_t hca_shm_send(hca_qp_t *qp, hca_wqe_t *wqe,
                               hca_qp_pub_t *pub)
{
    hca_ring_t *ring = hca_shm_target_ring(qp, pub);
    hca_msg_hdr_t *msg;
    uint64_t idx;
    int wake = 0;

    if (HCA_UNLIKELY(ring == NULL)) {
        hca_wqe_done(qp, wqe, HCA_WC_RETRY_EXC_ERR);
        return HCA_EXEC_DONE;
    }

    if (HCA_LIKELY(wqe->length <= HCA_SLOT_PAYLOAD)) {
        if (hca_ring_claim(ring, &idx, &wake) != 0) {
            return HCA_EXEC_BUSY;
        }
        msg = hca_ring_slot(ring, idx);
        hca_msg_fill(qp, msg, HCA_MSG_SEND, HCA_MSG_FIRST | HCA_MSG_LAST,
                     wqe);
        msg->length   = (uint32_t)wqe->length;
        msg->data_off = (uint8_t)hca_msg_data_off(wqe->length);
        hca_sge_gather(wqe->sge, wqe->num_sge, 0,
                       (uint8_t*)msg + msg->data_off, wqe->length);
        hca_ring_publish(ring, idx);
        hca_shm_ring_wake(qp, ring, wake);
        hca_wqe_done(qp, wqe, HCA_WC_SUCCESS);
        return HCA_EXEC_DONE;
    }

    if (qp->peer->cma_ok) {
        /* one slot describes the message; the target reads it from our
         * memory into the receive buffer and answers in our q object */
        hca_pull_hdr_t *pull;
        hca_wire_iov_t *iov;
        if (hca_ring_claim(ring, &idx, &wake) != 0) {
            return HCA_EXEC_BUSY;
        }
        msg = hca_ring_slot(ring, idx);
        hca_msg_fill(qp, msg, HCA_MSG_SEND_PULL,
                     HCA_MSG_FIRST | HCA_MSG_LAST, wqe);
        pull = (hca_pull_hdr_t*)(msg + 1);
        iov  = (hca_wire_iov_t*)(pull + 1);
        for (uint32_t i = 0; i < wqe->num_sge; ++i) {
            iov[i].addr   = wqe->sge[i].addr;
            iov[i].length = wqe->sge[i].length;
        }
        msg->num_iov     = (uint8_t)wqe->num_sge;
        wqe->resp_stamp  = hca_next_stamp(qp);
        pull->resp_idx   = (uint32_t)(wqe - qp->sq);
        pull->resp_stamp = wqe->resp_stamp;
        hca_ring_publish(ring, idx);
        hca_shm_ring_wake(qp, ring, wake);
        return HCA_EXEC_ISSUED;
    }

    /* no single copy: fragments, one slot each, in order */
    while (wqe->done < wqe->length) {
        uint64_t n = wqe->length - wqe->done;
        uint8_t flags = 0;
        int w;

        if (hca_ring_claim(ring, &idx, &w) != 0) {
            if (wqe->done == 0) {
                return HCA_EXEC_BUSY;
            }
            hca_shm_ring_wake(qp, ring, wake);
            wqe->state = HCA_WQE_PARTIAL;
            return HCA_EXEC_PARTIAL;
        }
        n      = (n < HCA_SLOT_PAYLOAD) ? n : HCA_SLOT_PAYLOAD;
        flags |= (wqe->done == 0) ? HCA_MSG_FIRST : 0;
        flags |= (wqe->done + n == wqe->length) ? HCA_MSG_LAST : 0;
        msg    = hca_ring_slot(ring, idx);
        hca_msg_fill(qp, msg, HCA_MSG_SEND, flags, wqe);
        msg->length   = (uint32_t)n;
        msg->data_off = (uint8_t)hca_msg_data_off(n);
        hca_sge_gather(wqe->sge, wqe->num_sge, wqe->done,
                       (uint8_t*)msg + msg->data_off, n);
        hca_ring_publish(ring, idx);
        wqe->done += n;
        wake      |= w;
    }
    hca_shm_ring_wake(qp, ring, wake);
    hca_wqe_done(qp, wqe, HCA_WC_SUCCESS);
    return HCA_EXEC_DONE;
}

/* The notice of an RDMA WRITE WITH IMM, after its data was placed. */
static hca_exec_t hca_shm_write_imm_notice(hca_qp_t *qp, hca_wqe_t *wqe,
                                           hca_qp_pub_t *pub)
{
    hca_ring_t *ring = hca_shm_target_ring(qp, pub);
    hca_msg_hdr_t *msg;
    uint64_t idx;
    int wake = 0;

    if (ring == NULL) {
        hca_wqe_done(qp, wqe, HCA_WC_RETRY_EXC_ERR);
        return HCA_EXEC_DONE;
    }
    if (hca_ring_claim(ring, &idx, &wake) != 0) {
        wqe->state = HCA_WQE_PARTIAL;
        return HCA_EXEC_PARTIAL; /* data is placed: not "nothing done" */
    }
    msg = hca_ring_slot(ring, idx);
    hca_msg_fill(qp, msg, HCA_MSG_WRITE_IMM, HCA_MSG_FIRST | HCA_MSG_LAST,
                 wqe);
    hca_ring_publish(ring, idx);
    hca_shm_ring_wake(qp, ring, wake);
    hca_wqe_done(qp, wqe, HCA_WC_SUCCESS);
    return HCA_EXEC_DONE;
}

/* ---------------------------------------------------------------- atomics */

/* Shared with the responder thread (hca_service.c). */
uint64_t hca_shm_atomic_apply(uint8_t opcode, void *addr, int size,
                              uint64_t operand, uint64_t swap)
{
    return hca_atomic_apply(opcode, addr, size, operand, swap);
}

static void hca_atomic_result(hca_wqe_t *wqe, uint64_t old)
{
    if (hca_opcode[wqe->opcode].flags & HCA_OPF_FETCH) {
        hca_atomic_store_old((void*)(uintptr_t)wqe->sge[0].addr,
                             (wqe->flags & HCA_SEND_ATOMIC32) ? 4 : 8, old);
    }
}

/* Queues a request for the target's responder thread.  BUSY when its
 * ring is full. */
static hca_exec_t hca_shm_svc_post(hca_qp_t *qp, hca_wqe_t *wqe,
                                   uint64_t raddr, uint64_t length)
{
    hca_peer_t *peer = qp->peer;
    hca_svc_req_t *req;
    uint64_t idx;
    int wake = 0;

    if (hca_ring_claim(&peer->svc, &idx, &wake) != 0) {
        return HCA_EXEC_BUSY;
    }
    req              = hca_ring_slot(&peer->svc, idx);
    req->opcode      = wqe->opcode;
    req->size        = (wqe->flags & HCA_SEND_ATOMIC32) ? 4 : 8;
    req->src_pid     = qp->dev->pid;
    req->src_ctx     = qp->dev->ctx_id;
    req->src_qpn     = qp->qpn;
    req->dst_qpn     = qp->dest_qpn;
    req->rkey        = wqe->rkey;
    wqe->resp_stamp  = hca_next_stamp(qp);
    req->resp_idx    = (uint32_t)(wqe - qp->sq);
    req->resp_stamp  = wqe->resp_stamp;
    req->remote_addr = raddr;
    req->length      = length;
    req->operand     = wqe->compare_add;
    req->swap        = wqe->swap;
    hca_ring_publish(&peer->svc, idx);
    if (HCA_UNLIKELY(wake)) {
        hca_notify_signal(qp->dev, peer->pidns, peer->addr.pid,
                          peer->addr.ctx_id, peer->hdr.name_nonce,
                          HCA_NOTIFY_SVC);
    }
    qp->cnt->responder_ops++;
    return HCA_EXEC_ISSUED;
}

/* Checks an atomic's target and finds where it lands in this process:
 * *target_p NULL means plain memory of another process (its responder
 * executes it).  On success the MPT entry is pinned (*entry_p). */
static hca_wc_status_t hca_shm_atomic_target(hca_qp_t *qp, hca_qp_pub_t *pub,
                                             uint32_t rkey, uint64_t raddr,
                                             int size,
                                             hca_mpt_entry_t **entry_p,
                                             void **target_p)
{
    hca_mpt_entry_t *entry;
    hca_wc_status_t status;

    *target_p = NULL;
    if (!(pub->access & HCA_ACCESS_REMOTE_ATOMIC)) {
        return HCA_WC_REM_ACCESS_ERR;
    }
    status = hca_access_begin(qp, rkey, pub->pd_handle,
                              HCA_ACCESS_REMOTE_ATOMIC, raddr, (uint64_t)size,
                              (unsigned)size, &entry);
    if (status == HCA_WC_STATUS_LAST) {
        *entry_p = NULL; /* only its responder may: it checks again */
        return HCA_WC_SUCCESS;
    }
    if (status != HCA_WC_SUCCESS) {
        return status;
    }
    if (qp->peer->self) {
        *target_p = (void*)(uintptr_t)raddr;
    } else if (entry->dm_id != 0) {
        hca_map_t *map = hca_peer_dm(qp->dev, qp->peer, entry->dm_id);
        uint64_t off   = entry->dm_offset + (raddr - entry->addr);
        if ((map != NULL) && (off <= map->shm.length) &&
            ((uint64_t)size <= map->shm.length - off)) {
            *target_p = (uint8_t*)map->shm.addr + off;
        }
    }
    *entry_p = entry;
    return HCA_WC_SUCCESS;
}

static hca_exec_t hca_shm_atomic(hca_qp_t *qp, hca_wqe_t *wqe,
                                 hca_qp_pub_t *pub)
{
    int size = (wqe->flags & HCA_SEND_ATOMIC32) ? 4 : 8;
    hca_mpt_entry_t *entry;
    hca_wc_status_t status;
    void *target;
    uint64_t old;

    status = hca_shm_atomic_target(qp, pub, wqe->rkey, wqe->remote_addr, size,
                                   &entry, &target);
    if (status != HCA_WC_SUCCESS) {
        hca_wqe_done(qp, wqe, status);
        return HCA_EXEC_DONE;
    }
    if (target == NULL) {
        /* plain memory of another process: its responder executes it */
        if (entry != NULL) {
            hca_access_finish(qp, entry);
        }
        return hca_shm_svc_post(qp, wqe, wqe->remote_addr, (uint64_t)size);
    }
    old = hca_atomic_apply(wqe->opcode, target, size, wqe->compare_add,
                           wqe->swap);
    hca_access_finish(qp, entry);
    hca_atomic_result(wqe, old);
    qp->cnt->mapped_ops++;
    hca_wqe_done(qp, wqe, HCA_WC_SUCCESS);
    return HCA_EXEC_DONE;
}

/* ---------------------------------------------------------------- RDMA */

/* WRITE/READ through the responder, one bounce-buffer chunk at a time.
 * The chunk in flight is wqe->chunk bytes at wqe->done. */
static hca_exec_t hca_shm_rdma_chunked(hca_qp_t *qp, hca_wqe_t *wqe,
                                       int write)
{
    uint32_t slot = (uint32_t)(wqe - qp->sq);
    hca_exec_t res;
    uint64_t n;

    if (wqe->chunk != 0) {
        hca_resp_slot_t *resp = &qp->resp[slot];
        if (atomic_load_explicit(&resp->stamp, memory_order_acquire) !=
            wqe->resp_stamp) {
            return HCA_EXEC_PARTIAL;
        }
        if (resp->status != HCA_WC_SUCCESS) {
            hca_wqe_done(qp, wqe, (resp->status < HCA_WC_STATUS_LAST) ?
                         (hca_wc_status_t)resp->status : HCA_WC_REM_OP_ERR);
            return HCA_EXEC_DONE;
        }
        if (!write) {
            hca_sge_scatter(wqe->sge, wqe->num_sge, wqe->done, qp->bounce,
                            wqe->chunk);
        }
        wqe->done += wqe->chunk;
        wqe->chunk = 0;
        if (wqe->done == wqe->length) {
            return HCA_EXEC_DONE; /* caller finishes (imm notice) */
        }
    }
    n = wqe->length - wqe->done;
    n = (n < HCA_BOUNCE_SIZE) ? n : HCA_BOUNCE_SIZE;
    if (write) {
        hca_sge_gather(wqe->sge, wqe->num_sge, wqe->done, qp->bounce, n);
    }
    res = hca_shm_svc_post(qp, wqe, wqe->remote_addr + wqe->done, n);
    if (res == HCA_EXEC_BUSY) {
        if (wqe->done != 0) {
            wqe->state = HCA_WQE_PARTIAL;
            return HCA_EXEC_PARTIAL;
        }
        return HCA_EXEC_BUSY;
    }
    wqe->chunk = n;
    wqe->state = HCA_WQE_PARTIAL;
    return HCA_EXEC_PARTIAL;
}

/* What an RDMA WRITE/READ moves: local SGEs and the remote range. */
typedef struct hca_xfer {
    const hca_sge_t *sge;
    uint32_t         num_sge;
    uint32_t         rkey;
    uint64_t         raddr;
    uint64_t         length;
} hca_xfer_t;

static hca_xfer_t hca_wqe_xfer(const hca_wqe_t *wqe)
{
    hca_xfer_t x = {wqe->sge, wqe->num_sge, wqe->rkey, wqe->remote_addr,
                    wqe->length};
    return x;
}

/* Direct paths: 0 with the status, or 1 if the responder must do it. */
static int hca_shm_rdma_direct(hca_qp_t *qp, const hca_xfer_t *x,
                               hca_qp_pub_t *pub, int write,
                               hca_wc_status_t *status_p)
{
    unsigned need = write ? HCA_ACCESS_REMOTE_WRITE : HCA_ACCESS_REMOTE_READ;
    hca_peer_t *peer = qp->peer;
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
    } else if (entry->dm_id != 0) {
        hca_map_t *map = hca_peer_dm(qp->dev, peer, entry->dm_id);
        uint64_t off   = entry->dm_offset + (x->raddr - entry->addr);
        if ((map == NULL) || (off > map->shm.length) ||
            (x->length > map->shm.length - off)) {
            status = HCA_WC_REM_OP_ERR;
        } else if (write) {
            hca_sge_gather(x->sge, x->num_sge, 0,
                           (uint8_t*)map->shm.addr + off, x->length);
        } else {
            hca_sge_scatter(x->sge, x->num_sge, 0,
                            (uint8_t*)map->shm.addr + off, x->length);
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

static hca_exec_t hca_shm_rdma(hca_qp_t *qp, hca_wqe_t *wqe,
                               hca_qp_pub_t *pub, int write)
{
    int imm = (wqe->opcode == HCA_WR_RDMA_WRITE_WITH_IMM);
    hca_wc_status_t status;
    hca_exec_t res;

    if (wqe->state == HCA_WQE_POSTED) {
        hca_xfer_t x = hca_wqe_xfer(wqe);
        if (hca_shm_rdma_direct(qp, &x, pub, write, &status) == 0) {
            if ((status != HCA_WC_SUCCESS) || !imm) {
                hca_wqe_done(qp, wqe, status);
                return HCA_EXEC_DONE;
            }
            wqe->done = wqe->length;
            return hca_shm_write_imm_notice(qp, wqe, pub);
        }
    } else if (imm && (wqe->chunk == 0) && (wqe->done == wqe->length)) {
        return hca_shm_write_imm_notice(qp, wqe, pub);
    }
    res = hca_shm_rdma_chunked(qp, wqe, write);
    if ((res == HCA_EXEC_DONE) && (wqe->state != HCA_WQE_DONE)) {
        if (imm) {
            return hca_shm_write_imm_notice(qp, wqe, pub);
        }
        hca_wqe_done(qp, wqe, HCA_WC_SUCCESS);
    }
    return res;
}

/* ---------------------------------------------------------------- direct */

/* The doorbell's fast path: a WR that needs no CQE, posted on an idle send
 * queue, executed right here from the caller's WR - no WQE, no inline
 * copy, no queue walk.  Every check runs before any side effect; if one
 * fails, or the WR needs the peer's help, 0 sends it down the queue, which
 * does the same checks again and reports the error. */
int hca_shm_post_direct(hca_qp_t *qp, hca_send_wr_t *wr, uint64_t length)
{
    const hca_opcode_info_t *info = &hca_opcode[wr->opcode];
    int size = (wr->send_flags & HCA_SEND_ATOMIC32) ? 4 : 8;
    hca_mpt_entry_t *entry;
    hca_wc_status_t status;
    hca_msg_hdr_t *msg;
    hca_qp_pub_t *pub;
    hca_ring_t *ring;
    void *target;
    uint64_t idx, old;
    int wake = 0;

    if (HCA_UNLIKELY(hca_shm_target(qp, &pub) != HCA_WC_SUCCESS)) {
        return 0;
    }
    if (!(wr->send_flags & HCA_SEND_INLINE) && (wr->num_sge > 0) &&
        (hca_sge_check(qp->dev, qp->pd->handle, wr->sg_list, wr->num_sge,
                       (info->flags & (HCA_OPF_READ | HCA_OPF_FETCH)) ?
                       HCA_ACCESS_LOCAL_WRITE : 0) != HCA_WC_SUCCESS)) {
        return 0;
    }

    switch (wr->opcode) {
    case HCA_WR_SEND:
    case HCA_WR_SEND_WITH_IMM:
        if (length > HCA_SLOT_PAYLOAD) {
            return 0;
        }
        ring = hca_shm_target_ring(qp, pub);
        if ((ring == NULL) || (hca_ring_claim(ring, &idx, &wake) != 0)) {
            return 0;
        }
        msg = hca_ring_slot(ring, idx);
        hca_msg_hdr_set(msg, qp, HCA_MSG_SEND,
                        HCA_MSG_FIRST | HCA_MSG_LAST |
                        ((wr->opcode == HCA_WR_SEND_WITH_IMM) ?
                         HCA_MSG_WITH_IMM : 0),
                        hca_msg_data_off(length), wr->imm_data,
                        (uint32_t)length, (uint32_t)length);
        hca_sge_gather(wr->sg_list, (uint32_t)wr->num_sge, 0,
                       (uint8_t*)msg + msg->data_off, length);
        hca_ring_publish(ring, idx);
        hca_shm_ring_wake(qp, ring, wake);
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
        if (!(info->flags & HCA_OPF_ATOMIC) ||
            (hca_shm_atomic_target(qp, pub, wr->rdma.rkey,
                                   wr->rdma.remote_addr, size, &entry,
                                   &target) != HCA_WC_SUCCESS)) {
            return 0;
        }
        if (target == NULL) {
            if (entry != NULL) {
                hca_access_finish(qp, entry);
            }
            return 0;
        }
        old = hca_atomic_apply((uint8_t)wr->opcode, target, size,
                               wr->compare_add, wr->swap);
        hca_access_finish(qp, entry);
        if (info->flags & HCA_OPF_FETCH) {
            hca_atomic_store_old((void*)(uintptr_t)wr->sg_list[0].addr,
                                 size, old);
        }
        qp->cnt->mapped_ops++;
        length = (uint64_t)size;
        break;
    }
    qp->cnt->tx_ops[wr->opcode]++;
    qp->cnt->tx_bytes[wr->opcode] += length;
    return 1;
}

/* ---------------------------------------------------------------- ops */

/* Another user's process: its objects are private to its user (0600)
 * and ours to ours, so neither side could answer the other.  Refused at
 * connect, both ways (root too), with a line that says why. */
static int hca_shm_other_user(uint32_t pid)
{
    char path[32];
    struct stat st;

    snprintf(path, sizeof(path), "/proc/%u", pid);
    if ((stat(path, &st) != 0) || (st.st_uid == geteuid())) {
        return 0; /* ours, or not there yet (looked up again later) */
    }
    hca_log("pid %u belongs to uid %u, and we are uid %u: hca connects "
            "processes of one user only", pid, (unsigned)st.st_uid,
            (unsigned)geteuid());
    return 1;
}

static int hca_shm_connect(hca_qp_t *qp)
{
    /* resolve now if we can; a peer that is not there yet is looked up
     * again on the first post (and then fails with RETRY_EXC) */
    if (!hca_port_addr_reachable(qp->dev, &qp->dest)) {
        return -EHOSTUNREACH;
    }
    if (hca_shm_other_user(qp->dest.pid)) {
        return -EACCES;
    }
    qp->peer     = hca_peer_get(qp->dev, &qp->dest);
    qp->tgt_ring = NULL;
    hca_direct_forget(qp);
    return 0;
}

static hca_exec_t hca_shm_exec(hca_qp_t *qp, hca_wqe_t *wqe)
{
    const hca_opcode_info_t *info = &hca_opcode[wqe->opcode];
    hca_wc_status_t status;
    hca_qp_pub_t *pub;
    hca_exec_t res;

    status = hca_shm_target(qp, &pub);
    if (HCA_UNLIKELY(status != HCA_WC_SUCCESS)) {
        hca_wqe_done(qp, wqe, status);
        return HCA_EXEC_DONE;
    }
    if ((wqe->state == HCA_WQE_POSTED) && !(wqe->flags & HCA_SEND_INLINE)) {
        unsigned local = (info->flags & (HCA_OPF_READ | HCA_OPF_FETCH)) ?
                         HCA_ACCESS_LOCAL_WRITE : 0;
        status = hca_sge_check(qp->dev, qp->pd->handle, wqe->sge,
                               (int)wqe->num_sge, local);
        if (HCA_UNLIKELY(status != HCA_WC_SUCCESS)) {
            hca_wqe_done(qp, wqe, status);
            return HCA_EXEC_DONE;
        }
    }

    if (info->flags & HCA_OPF_ATOMIC) {
        res = hca_shm_atomic(qp, wqe, pub);
    } else if (info->flags & HCA_OPF_READ) {
        res = hca_shm_rdma(qp, wqe, pub, 0);
    } else if (wqe->opcode == HCA_WR_RDMA_WRITE ||
               wqe->opcode == HCA_WR_RDMA_WRITE_WITH_IMM) {
        res = hca_shm_rdma(qp, wqe, pub, 1);
    } else {
        res = hca_shm_send(qp, wqe, pub);
    }
    if ((res == HCA_EXEC_DONE || res == HCA_EXEC_ISSUED) &&
        (wqe->status == HCA_WC_SUCCESS) && (wqe->done == 0 ||
                                            wqe->done == wqe->length)) {
        qp->cnt->tx_ops[wqe->opcode]++;
        qp->cnt->tx_bytes[wqe->opcode] += (info->flags & HCA_OPF_ATOMIC) ?
            ((wqe->flags & HCA_SEND_ATOMIC32) ? 4 : 8) : wqe->length;
    }
    return res;
}

static hca_exec_t hca_shm_poll_response(hca_qp_t *qp, hca_wqe_t *wqe)
{
    hca_resp_slot_t *resp = &qp->resp[wqe - qp->sq];
    uint32_t status;

    if (atomic_load_explicit(&resp->stamp, memory_order_acquire) !=
        wqe->resp_stamp) {
        return HCA_EXEC_ISSUED;
    }
    status = resp->status;
    if (status >= HCA_WC_STATUS_LAST) {
        status = HCA_WC_REM_OP_ERR;
    }
    if ((status == HCA_WC_SUCCESS) &&
        (hca_opcode[wqe->opcode].flags & HCA_OPF_ATOMIC)) {
        hca_atomic_result(wqe, resp->value);
    }
    hca_wqe_done(qp, wqe, (hca_wc_status_t)status);
    return HCA_EXEC_DONE;
}

/* The peer process and its target QP: a QP destroyed under us (its ring
 * discarded with our messages in it) would otherwise be waited for
 * forever; and a peer that could not answer us says so in our QP's
 * published entry (hca_answer.c). */
static hca_wc_status_t hca_shm_peer_status(hca_qp_t *qp)
{
    uint32_t idx = HCA_QPN_INDEX(qp->dest_qpn);

    if (HCA_UNLIKELY(atomic_load(&qp->pub->nak_qpn) == qp->qpn)) {
        return HCA_WC_REM_OP_ERR;
    }
    if (qp->peer == NULL) {
        qp->peer = hca_peer_get(qp->dev, &qp->dest);
        if (qp->peer == NULL) {
            return HCA_WC_RETRY_EXC_ERR;
        }
    }
    if (!hca_peer_alive(qp->peer) || (idx == 0) ||
        (idx >= qp->peer->hdr.max_qp) ||
        (atomic_load(&qp->peer->qp_pub[idx].qpn) != qp->dest_qpn)) {
        return HCA_WC_RETRY_EXC_ERR;
    }
    return HCA_WC_SUCCESS;
}

const hca_fabric_ops_t hca_fabric_shm = {
    .name          = "shm",
    .connect       = hca_shm_connect,
    .exec          = hca_shm_exec,
    .poll_response = hca_shm_poll_response,
    .peer_status   = hca_shm_peer_status,
};
