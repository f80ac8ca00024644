/*
 * hca_shm_peer.c - the shm fabric's peers: the other device contexts of
 * this host we talk to, validated once, and our mappings of their objects
 * (receive rings, q objects, device memory); their liveness.
 */
#include "hca_shm_fence.h"
#include "hca_log.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
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
         length - hdr->busy_offset) ||
        (hdr->export_offset > length) ||
        (sizeof(hca_export_entry_t) * HCA_MAX_EXPORT >
         length - hdr->export_offset)) {
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
    char name[HCA_OBJ_NAME_MAX];
    uint8_t *base;

    pthread_mutex_lock(&dev->lock);
    for (peer = hca_shm_dev(dev)->peers; peer != NULL; peer = peer->next) {
        /* a peer found dead stays for the QPs that knew it, but a process
         * that reuses its pid is another peer: mapped anew */
        if ((peer->addr.pid == addr->pid) &&
            (peer->addr.ctx_id == addr->ctx_id) &&
            !atomic_load_explicit(&peer->dead, memory_order_relaxed)) {
            goto out;
        }
    }
    if (dev->host_key != addr->host) {
        goto out; /* NULL: not on this host */
    }
    peer = calloc(1, sizeof(*peer));
    if (peer == NULL) {
        goto out;
    }
    hca_ctx_name(name, sizeof(name), dev->pidns, addr->pid, addr->ctx_id);
    if ((hca_memobj_map(&peer->ctx, name, sizeof(hca_ctx_hdr_t)) != 0) ||
        (memcpy(&peer->hdr, peer->ctx.addr, sizeof(peer->hdr)),
         hca_peer_validate(&peer->hdr, peer->ctx.length, addr) != 0)) {
        hca_memobj_destroy(&peer->ctx);
        free(peer);
        peer = NULL;
        goto out;
    }
    base         = peer->ctx.addr;
    peer->addr   = *addr;
    peer->pidns  = dev->pidns; /* same host: same pid namespace */
    peer->notify_to.pidns = peer->pidns;
    peer->notify_to.pid   = addr->pid;
    peer->notify_to.ctx   = addr->ctx_id;
    peer->notify_to.nonce = peer->hdr.name_nonce;
    peer->self   = (addr->pid == dev->pid);
    peer->mpt    = (hca_mpt_entry_t*)(base + peer->hdr.mpt_offset);
    peer->qp_pub = (hca_qp_pub_t*)(base + peer->hdr.qp_offset);
    peer->notify = (hca_notify_t*)(base + peer->hdr.notify_offset);
    peer->mappers = (hca_mapper_t*)(base + peer->hdr.mappers_offset);
    peer->busy    = (hca_busy_t*)(base + peer->hdr.busy_offset);
    peer->exports = (hca_export_entry_t*)(base + peer->hdr.export_offset);
    hca_ring_attach(&peer->svc, base + peer->hdr.svc_offset, HCA_SVC_SLOTS,
                    sizeof(hca_svc_req_t));
    peer->svc.claim_mark = dev->claim_mark;
    peer->cma_ok = hca_peer_probe_cma(dev, peer);
    peer->mapper_slot = -1;
    peer->next   = hca_shm_dev(dev)->peers;
    hca_shm_dev(dev)->peers   = peer;
out:
    pthread_mutex_unlock(&dev->lock);
    return peer;
}

static void hca_map_list_destroy(_Atomic(hca_map_t*) *list)
{
    hca_map_t *map = atomic_load(list);

    while (map != NULL) {
        hca_map_t *next = map->next;
        hca_memobj_destroy(&map->obj);
        free(map);
        map = next;
    }
    atomic_store(list, NULL);
}

void hca_peers_destroy(hca_device_t *dev)
{
    pthread_mutex_lock(&dev->lock);
    while (hca_shm_dev(dev)->peers != NULL) {
        hca_peer_t *peer = hca_shm_dev(dev)->peers;
        hca_shm_dev(dev)->peers       = peer->next;
        hca_access_unregister(dev, peer);
        hca_map_list_destroy(&peer->rings);
        while (peer->qobjs != NULL) {
            hca_map_t *map = peer->qobjs;
            peer->qobjs    = map->next;
            hca_memobj_destroy(&map->obj);
            free(map);
        }
        hca_map_list_destroy(&peer->dms);
        hca_memobj_destroy(&peer->ctx);
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
    char name[HCA_OBJ_NAME_MAX];

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
    if ((hca_memobj_map(&map->obj, name, min_length) != 0) ||
        ((check != NULL) && (check(dev, map) != 0))) {
        hca_memobj_destroy(&map->obj);
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
    hca_ring_hdr_t *hdr = map->obj.addr;

    if ((hdr->magic != HCA_WIRE_MAGIC) || (hdr->slots != HCA_RING_SLOTS) ||
        (hdr->slot_size != HCA_RING_SLOT_SIZE) ||
        (map->obj.length < hca_ring_bytes(HCA_RING_SLOTS,
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

    memcpy(&hdr, map->obj.addr, sizeof(hdr)); /* one read: the peer may
                                                 change it under us */
    if ((hdr.magic != HCA_WIRE_MAGIC) || (hdr.sq_depth == 0) ||
        (hdr.sq_depth > HCA_MAX_QP_WR) ||
        (hdr.resp_offset < sizeof(hdr)) ||
        (hdr.bounce_offset > map->obj.length) ||
        (hdr.resp_offset > hdr.bounce_offset) ||
        (sizeof(hca_resp_slot_t) * hdr.sq_depth >
         hdr.bounce_offset - hdr.resp_offset) ||
        (HCA_BOUNCE_SIZE > map->obj.length - hdr.bounce_offset)) {
        return -EPROTO;
    }
    map->resp     = (hca_resp_slot_t*)((uint8_t*)map->obj.addr +
                                       hdr.resp_offset);
    map->bounce   = (uint8_t*)map->obj.addr + hdr.bounce_offset;
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
    char name[HCA_OBJ_NAME_MAX];

    if (map == NULL) {
        return NULL;
    }
    hca_obj_name(name, sizeof(name), peer->pidns, peer->addr.pid,
                 peer->addr.ctx_id, peer->hdr.name_nonce, "q", qpn);
    if ((hca_memobj_map(&map->obj, name, sizeof(hca_qobj_hdr_t)) != 0) ||
        (hca_qobj_map_check(map) != 0)) {
        hca_memobj_destroy(&map->obj);
        free(map);
        return NULL;
    }
    map->id = qpn;
    return map;
}

/* Export id of the peer: its slot, copied as the owner's seqlock says
 * (hca_wire.h): 0 if the slot holds that export, else -ENOENT (withdrawn;
 * ids are never reused). */
static int hca_peer_export_read(const hca_peer_t *peer, uint32_t id,
                                hca_export_entry_t *e)
{
    const hca_export_entry_t *slot = &peer->exports[id % HCA_MAX_EXPORT];

    if (atomic_load_explicit(&slot->id, memory_order_acquire) != id) {
        return -ENOENT;
    }
    e->kind   = slot->kind;
    e->handle = slot->handle;
    e->dev    = slot->dev;
    e->ino    = slot->ino;
    e->size   = slot->size;
    e->stamp  = slot->stamp;
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&slot->id, memory_order_relaxed) != id) {
        return -ENOENT;
    }
    return 0;
}

/* A peer's export mapped by us, once per id.  One we cannot map (another
 * user's object, a file we may not open, withdrawn) is remembered as
 * such (no mapping), so that accesses do not try again: they take
 * another route.  At most HCA_PEER_EXPORT_MAPS per peer: the objects stay
 * mapped while the peer lives, whatever the owner does with them. */
static hca_map_t *hca_peer_export(hca_device_t *dev, hca_peer_t *peer,
                                  uint32_t id)
{
    hca_map_t *map = hca_map_find(&peer->dms, id);
    hca_export_entry_t e;

    if (HCA_LIKELY(map != NULL)) {
        return (map->obj.addr != NULL) ? map : NULL;
    }
    pthread_mutex_lock(&dev->lock);
    map = hca_map_find(&peer->dms, id);
    if ((map != NULL) || (peer->n_export_maps >= HCA_PEER_EXPORT_MAPS)) {
        goto out;
    }
    map = hca_fault(dev, HCA_FAULT_MAP) ? NULL : calloc(1, sizeof(*map));
    if (map == NULL) {
        goto out;
    }
    if ((hca_peer_export_read(peer, id, &e) != 0) ||
        (hca_backing_map(&e, peer->addr.pid, &map->obj) != 0)) {
        memset(&map->obj, 0, sizeof(map->obj));
    }
    map->id   = id;
    map->next = atomic_load(&peer->dms);
    peer->n_export_maps++;
    atomic_store_explicit(&peer->dms, map, memory_order_release);
out:
    pthread_mutex_unlock(&dev->lock);
    return ((map != NULL) && (map->obj.addr != NULL)) ? map : NULL;
}

hca_map_t *hca_peer_dm(hca_device_t *dev, hca_peer_t *peer, uint32_t dm_id)
{
    if (dm_id & HCA_DM_EXPORT) {
        return hca_peer_export(dev, peer, dm_id);
    }
    return hca_peer_map(dev, peer, &peer->dms, "dm", dm_id, 1, NULL);
}

uint64_t hca_shm_check_peers(hca_device_t *dev)
{
    uint32_t n = 0, full;

    pthread_mutex_lock(&dev->lock);
    full = hca_shm_dev(dev)->sweep_turn++;
    for (hca_peer_t *peer = hca_shm_dev(dev)->peers; peer != NULL; peer = peer->next) {
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
        hca_shm_dev(dev)->sweep_turn = 0;
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

