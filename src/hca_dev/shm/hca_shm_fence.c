/*
 * hca_shm_fence.c - keeping hca_mr_dereg's promise (no byte lands after
 * it returns) against requesters in other processes, with a bound: a
 * requester that dies inside an access is not waited for.
 *
 * A requester QP brackets every access to another process's memory (CPU
 * copy or atomic on its device memory, single copy, the key check of
 * rkey_ptr) with stores to its busy word, in its own context: busy = 1;
 * mark the MPT entry with its mapper slot; check the entry; access;
 * busy = 0.  Deregistration marks the entry invalid and, if the entry
 * names an accessor, waits for the busy words of that mapper (or of all,
 * if several accessed it).  Each access either made its busy store
 * visible before the owner looked (and is waited for), or checks after
 * the invalidation and fails: a store-buffering pattern that needs a full
 * barrier on both sides.  When the owner runs
 * membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) in its deregistration, the
 * requester's side of the barrier is executed by the kernel in every
 * running thread, and the requester needs none: the asymmetric fence of
 * userspace RCU.  Otherwise the requester executes a full fence.
 *
 * Why not an in-flight count in the MPT entry, as before: a requester
 * killed between its increment and its decrement left the count raised
 * for good, and the deregistration then waited forever.  A busy word
 * belongs to one context, whose liveness (pid and start time) is checked
 * while waiting.  A requester that finds the owner's mapper table full
 * leaves the access to the owner's responder thread instead.
 */
#include "hca_shm_fence.h"
#include "hca_log.h"
#include "hca_mpt.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <string.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

/* How long a deregistration retries a mapper whose context exists but
 * cannot be mapped (out of descriptors, memory) before giving up on it. */
#define HCA_FENCE_RETRY_NS (10ull * 1000000000ull)

static int hca_membarrier(int cmd)
{
    return (int)syscall(__NR_membarrier, cmd, 0, 0);
}

int hca_access_fence_init(hca_device_t *dev)
{
    int mask = hca_membarrier(MEMBARRIER_CMD_QUERY);

    hca_shm_dev(dev)->mb_ok = !(dev->flags & HCA_OPEN_NO_MEMBARRIER) && (mask > 0) &&
                 (mask & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
                 (mask & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) &&
                 (hca_membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) ==
                  0);
    return hca_shm_dev(dev)->mb_ok;
}

static uint64_t hca_mapper_id(uint32_t pid, uint32_t ctx_id)
{
    return ((uint64_t)pid << 32) | ctx_id;
}

/* ---------------------------------------------------------------- requester */

/* Claims our slot in the peer's mapper table: its index, or -1 if full.
 * A slot with our id but another start time is a dead predecessor with
 * our pid: it is freed, not reused, so that its owner's scans never mix
 * the two of us.  Caller holds dev->lock. */
static int hca_mapper_register(hca_device_t *dev, hca_peer_t *peer)
{
    uint64_t id = hca_mapper_id(dev->pid, dev->ctx_id);

    for (int i = 0; i < HCA_MAX_MAPPERS; ++i) {
        uint64_t expect = id;
        if (atomic_load(&peer->mappers[i].id) != id) {
            continue;
        }
        if (atomic_load(&peer->mappers[i].start_time) == dev->start_time) {
            return i;
        }
        atomic_compare_exchange_strong(&peer->mappers[i].id, &expect, 0);
    }
    for (int i = 0; i < HCA_MAX_MAPPERS; ++i) {
        uint64_t expect = 0;
        if (atomic_compare_exchange_strong(&peer->mappers[i].id, &expect,
                                           HCA_MAPPER_CLAIMING)) {
            atomic_store(&peer->mappers[i].start_time, dev->start_time);
            atomic_store(&peer->mappers[i].id, id);
            return i;
        }
    }
    return -1;
}

int hca_access_mode_slow(hca_device_t *dev, hca_peer_t *peer)
{
    int mode;

    pthread_mutex_lock(&dev->lock);
    mode = atomic_load(&peer->access_mode);
    if (mode == HCA_ACCESS_UNKNOWN) {
        peer->mapper_slot = hca_mapper_register(dev, peer);
        if (peer->mapper_slot < 0) {
            hca_log("the mapper table of pid %u (ctx %u) is full: its "
                    "responder thread serves our accesses",
                    peer->addr.pid, peer->addr.ctx_id);
            mode = HCA_ACCESS_RESPONDER;
        } else {
            mode = (hca_shm_dev(dev)->mb_ok && peer->hdr.direct_fence) ?
                   HCA_ACCESS_BUSY : HCA_ACCESS_BUSY_FENCED;
        }
        atomic_store(&peer->access_mode, mode);
    }
    pthread_mutex_unlock(&dev->lock);
    return mode;
}

void hca_access_unregister(hca_device_t *dev, hca_peer_t *peer)
{
    uint64_t id = hca_mapper_id(dev->pid, dev->ctx_id);

    if (peer->mapper_slot >= 0) {
        atomic_compare_exchange_strong(&peer->mappers[peer->mapper_slot].id,
                                       &id, 0);
    }
}

/* ---------------------------------------------------------------- owner */

/* Our mapping of a mapper's context, kept between deregistrations (UCP
 * deregisters a buffer per rendezvous; mapping by name each time cost
 * ~15 us).  It is valid for as long as the slot names the same (id,
 * start time). */
struct hca_mapper_view {
    uint64_t         id;
    uint64_t         start_time;
    hca_memobj_t        obj;
    const hca_busy_t *busy;
    const _Atomic uint32_t *qp_hwm;
    uint32_t         max_qp;
};

size_t hca_mapper_view_size(void)
{
    return sizeof(hca_mapper_view_t);
}

static void hca_view_drop(hca_mapper_view_t *view)
{
    hca_memobj_destroy(&view->obj);
    memset(view, 0, sizeof(*view));
}

/* (Re)maps the context of slot (id, start_time).  0 ready, 1 the
 * registrant is gone (its context closed, or replaced by a newer process
 * with its pid), -1 not mappable now. */
static int hca_view_get(hca_device_t *dev, hca_mapper_view_t *view,
                        uint64_t id, uint64_t start_time)
{
    uint32_t pid = (uint32_t)(id >> 32), ctx_id = (uint32_t)id;
    hca_ctx_hdr_t hdr;
    char name[HCA_OBJ_NAME_MAX];
    int rc;

    if ((view->id == id) && (view->start_time == start_time) &&
        (view->busy != NULL)) {
        return 0;
    }
    hca_view_drop(view);
    hca_ctx_name(name, sizeof(name), dev->pidns, pid, ctx_id);
    rc = hca_memobj_map(&view->obj, name, sizeof(hdr));
    if (rc == -ENOENT) {
        return 1; /* closed: its accesses are over */
    }
    if (rc != 0) {
        return -1;
    }
    memcpy(&hdr, view->obj.addr, sizeof(hdr)); /* once: it may change */
    if ((hdr.magic != HCA_WIRE_MAGIC) || (hdr.pid != pid) ||
        (hdr.ctx_id != ctx_id) || (hdr.max_qp == 0) ||
        (hdr.max_qp > HCA_MAX_QP) || (hdr.busy_offset > view->obj.length) ||
        (sizeof(hca_busy_t) * (hdr.max_qp + 1) >
         view->obj.length - hdr.busy_offset)) {
        hca_view_drop(view);
        return -1; /* being created, or not ours to read */
    }
    if (hdr.start_time != start_time) {
        hca_view_drop(view);
        return 1; /* a newer process's context: the registrant died */
    }
    view->id         = id;
    view->start_time = start_time;
    view->busy       = (const hca_busy_t*)((const uint8_t*)view->obj.addr +
                                           hdr.busy_offset);
    view->qp_hwm     = &((hca_ctx_hdr_t*)view->obj.addr)->qp_hwm;
    view->max_qp     = hdr.max_qp;
    return 0;
}

/* Waits until none of the mapper's QPs is inside an access; 1 if its
 * process died meanwhile (killed inside an access: nothing more lands). */
static int hca_view_wait(const hca_mapper_view_t *view)
{
    uint32_t hwm = atomic_load(view->qp_hwm);
    uint32_t pid = (uint32_t)(view->id >> 32);
    uint64_t start;

    hwm = (hwm < view->max_qp) ? hwm : view->max_qp;
    for (uint32_t q = 1; q <= hwm; ++q) {
        unsigned spins = 0;
        while (atomic_load(&view->busy[q].busy) != 0) {
            if (++spins < 1000) {
                continue;
            }
            if ((hca_proc_start_time(pid, &start) != 0) ||
                (start != view->start_time)) {
                return 1;
            }
            sched_yield();
            spins = 0;
        }
    }
    return 0;
}

/* One slot: wait for its registrant, or free the slot if it is gone. */
static void hca_fence_slot(hca_device_t *dev, int i)
{
    hca_mapper_view_t *view = &hca_shm_dev(dev)->mapper_views[i];
    uint64_t until          = hca_now_ns() + HCA_FENCE_RETRY_NS;
    uint64_t id             = atomic_load(&dev->mappers[i].id);
    uint64_t start;
    int rc;

    if ((id == 0) || (id == HCA_MAPPER_CLAIMING)) {
        return; /* nobody, or one that has not accessed yet */
    }
    start = atomic_load(&dev->mappers[i].start_time);
    while ((rc = hca_view_get(dev, view, id, start)) < 0) {
        if (hca_now_ns() > until) {
            hca_log("cannot map the context of pid %u (ctx %u), which "
                    "accesses our memory: not waiting for its accesses",
                    (uint32_t)(id >> 32), (uint32_t)id);
            return;
        }
        sched_yield();
    }
    if ((rc == 0) && (hca_view_wait(view) == 0)) {
        return;
    }
    hca_view_drop(view);
    atomic_compare_exchange_strong(&dev->mappers[i].id, &id, 0);
}

void hca_access_fence_wait(hca_device_t *dev, uint32_t accessors,
                           int unfenced)
{
    /* a membarrier interrupts every CPU running a registered process
     * (tens of us on a VM): only for entries whose accessors rely on it */
    if (unfenced && hca_shm_dev(dev)->mb_ok &&
        (hca_membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0) &&
        (hca_membarrier(MEMBARRIER_CMD_GLOBAL) != 0)) {
        hca_log("membarrier failed (%s): an access that began just before "
                "this deregistration may still land", strerror(errno));
    }
    pthread_mutex_lock(&hca_shm_dev(dev)->fence_lock);
    if (accessors == HCA_MPT_ACCESSORS_MANY) {
        for (int i = 0; i < HCA_MAX_MAPPERS; ++i) {
            hca_fence_slot(dev, i);
        }
    } else if ((accessors >= 1) && (accessors <= HCA_MAX_MAPPERS)) {
        hca_fence_slot(dev, (int)accessors - 1);
    }
    pthread_mutex_unlock(&hca_shm_dev(dev)->fence_lock);
}

void hca_access_fence_close(hca_device_t *dev)
{
    if (hca_shm_dev(dev)->mapper_views == NULL) {
        return;
    }
    for (int i = 0; i < HCA_MAX_MAPPERS; ++i) {
        hca_view_drop(&hca_shm_dev(dev)->mapper_views[i]);
    }
}
