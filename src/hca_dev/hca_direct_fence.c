/*
 * hca_direct_fence.c - keeping hca_mr_dereg's promise (no byte lands after
 * it returns) for the direct paths to device memory, without an atomic
 * read-modify-write on a shared line per access.
 *
 * A requester QP brackets an unpinned direct access with plain stores to
 * its busy word, in its own context (busy = 1; check the MPT entry; copy
 * or atomic; busy = 0).  Deregistering an MR in device memory marks the
 * entry invalid, runs membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED), under
 * which every running thread of every registered process executes a full
 * barrier, and then waits for the busy words of every context in its
 * mapper table.  For each access, either its busy store is visible after
 * the barrier (and is waited for), or its check comes after the barrier
 * and sees the entry invalid: the asymmetric fence of userspace RCU.
 *
 * Requesters register in the owner's mapper table before their first
 * unpinned access.  Where membarrier is not available (either side) or
 * the table is full they pin the MPT entry instead (an atomic increment
 * and decrement per access, which hca_mr_dereg already waits for).
 */
#include "hca_priv.h"

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

int hca_direct_fence_init(hca_device_t *dev)
{
    int mask = hca_membarrier(MEMBARRIER_CMD_QUERY);

    dev->mb_ok = !(dev->flags & HCA_OPEN_NO_MEMBARRIER) && (mask > 0) &&
                 (mask & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
                 (mask & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) &&
                 (hca_membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) ==
                  0);
    return dev->mb_ok;
}

static uint64_t hca_mapper_id(uint32_t pid, uint32_t ctx_id)
{
    return ((uint64_t)pid << 32) | ctx_id;
}

/* Registers us in the peer's mapper table; 1 on success. */
static int hca_mapper_register(hca_device_t *dev, hca_peer_t *peer)
{
    uint64_t id = hca_mapper_id(dev->pid, dev->ctx_id);

    for (int i = 0; i < HCA_MAX_MAPPERS; ++i) {
        if (atomic_load(&peer->mappers[i].id) == id) {
            return 1;
        }
    }
    for (int i = 0; i < HCA_MAX_MAPPERS; ++i) {
        uint64_t expect = 0;
        if (atomic_compare_exchange_strong(&peer->mappers[i].id, &expect,
                                           id)) {
            return 1;
        }
    }
    return 0;
}

int hca_direct_mode(hca_device_t *dev, hca_peer_t *peer)
{
    int mode = atomic_load(&peer->direct_mode);

    if (HCA_LIKELY(mode != HCA_DIRECT_UNKNOWN)) {
        return mode;
    }
    pthread_mutex_lock(&dev->lock);
    mode = atomic_load(&peer->direct_mode);
    if (mode == HCA_DIRECT_UNKNOWN) {
        mode = (dev->mb_ok && peer->hdr.direct_fence &&
                hca_mapper_register(dev, peer)) ? HCA_DIRECT_BUSY :
                                                  HCA_DIRECT_PIN;
        atomic_store(&peer->direct_mode, mode);
    }
    pthread_mutex_unlock(&dev->lock);
    return mode;
}

/* Waits until none of the QPs of the context whose header is hdr (mapped
 * in shm) is inside a direct access; stops early if its process dies. */
static void hca_direct_wait_busy(const hca_shm_t *shm, const hca_ctx_hdr_t *hdr)
{
    const hca_busy_t *busy = (const hca_busy_t*)((const uint8_t*)shm->addr +
                                                 hdr->busy_offset);
    uint64_t start;

    for (uint32_t q = 1; q <= hdr->max_qp; ++q) {
        unsigned spins = 0;
        while (atomic_load_explicit(&busy[q].busy, memory_order_acquire) !=
               0) {
            if (++spins < 1000) {
                continue;
            }
            if ((hca_proc_start_time(hdr->pid, &start) != 0) ||
                (start != hdr->start_time)) {
                return; /* killed inside an access: nothing more lands */
            }
            sched_yield();
            spins = 0;
        }
    }
}

/* One mapper: map its context by name now (never a cached peer: its pid
 * may belong to a new process by now, whose busy words are what count),
 * and wait for its busy words.  0 done, 1 the context is gone (its slot
 * can be freed), -1 not mappable right now (retry). */
static int hca_direct_wait_mapper(hca_device_t *dev, uint64_t id)
{
    uint32_t pid = (uint32_t)(id >> 32), ctx_id = (uint32_t)id;
    hca_ctx_hdr_t hdr;
    hca_shm_t shm;
    uint64_t start;
    char name[96];
    int rc;

    hca_obj_name(name, sizeof(name), dev->pidns, pid, ctx_id, "ctx", 0);
    rc = hca_shm_map(&shm, name, sizeof(hdr));
    if (rc == -ENOENT) {
        return 1; /* closed: its accesses are over */
    }
    if (rc != 0) {
        return -1;
    }
    memcpy(&hdr, shm.addr, sizeof(hdr)); /* once: the mapper may change it */
    if ((hdr.magic != HCA_WIRE_MAGIC) || (hdr.pid != pid) ||
        (hdr.ctx_id != ctx_id) || (hdr.max_qp == 0) ||
        (hdr.max_qp > HCA_MAX_QP) || (hdr.busy_offset > shm.length) ||
        (sizeof(hca_busy_t) * (hdr.max_qp + 1) >
         shm.length - hdr.busy_offset)) {
        hca_shm_destroy(&shm);
        return -1; /* being created, or not ours to read */
    }
    if ((hca_proc_start_time(pid, &start) != 0) ||
        (start != hdr.start_time)) {
        hca_shm_destroy(&shm);
        return 1; /* left behind by a dead process */
    }
    hca_direct_wait_busy(&shm, &hdr);
    hca_shm_destroy(&shm);
    return 0;
}

void hca_direct_fence_wait(hca_device_t *dev)
{
    if (!dev->mb_ok) {
        return; /* nobody accesses our memory unpinned */
    }
    if ((hca_membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0) &&
        (hca_membarrier(MEMBARRIER_CMD_GLOBAL) != 0)) {
        hca_log("membarrier failed (%s): a direct access that began just "
                "before this deregistration may still land", strerror(errno));
    }
    for (int i = 0; i < HCA_MAX_MAPPERS; ++i) {
        uint64_t id    = atomic_load(&dev->mappers[i].id);
        uint64_t until = hca_now_ns() + HCA_FENCE_RETRY_NS;
        int rc;

        if (id == 0) {
            continue;
        }
        while ((rc = hca_direct_wait_mapper(dev, id)) < 0) {
            if (hca_now_ns() > until) {
                hca_log("cannot map the context of mapper pid %u (ctx %u) "
                        "of device memory: not waiting for its accesses",
                        (uint32_t)(id >> 32), (uint32_t)id);
                break;
            }
            sched_yield();
        }
        if (rc == 1) {
            atomic_compare_exchange_strong(&dev->mappers[i].id, &id, 0);
        }
    }
}

void hca_direct_unregister(hca_device_t *dev, hca_peer_t *peer)
{
    uint64_t id = hca_mapper_id(dev->pid, dev->ctx_id);

    if (atomic_load(&peer->direct_mode) != HCA_DIRECT_BUSY) {
        return;
    }
    for (int i = 0; i < HCA_MAX_MAPPERS; ++i) {
        uint64_t expect = id;
        atomic_compare_exchange_strong(&peer->mappers[i].id, &expect, 0);
    }
}
