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

#include <linux/membarrier.h>
#include <string.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

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

/* Waits until none of the mapper's QPs is inside a direct access. */
static void hca_direct_wait_mapper(hca_peer_t *peer)
{
    for (uint32_t q = 1; q <= peer->hdr.max_qp; ++q) {
        unsigned spins = 0;
        while (atomic_load_explicit(&peer->busy[q].busy,
                                    memory_order_acquire) != 0) {
            if (++spins < 1000) {
                continue;
            }
            if (!peer->self && !hca_peer_alive(peer)) {
                return; /* killed inside an access: nothing more lands */
            }
            sched_yield();
            spins = 0;
        }
    }
}

void hca_direct_fence_wait(hca_device_t *dev)
{
    if (!dev->mb_ok) {
        return; /* nobody accesses our memory unpinned */
    }
    if (hca_membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0) {
        (void)hca_membarrier(MEMBARRIER_CMD_GLOBAL); /* slower, as good */
    }
    for (int i = 0; i < HCA_MAX_MAPPERS; ++i) {
        uint64_t id = atomic_load(&dev->mappers[i].id);
        hca_port_addr_t addr;
        hca_peer_t *peer;

        if (id == 0) {
            continue;
        }
        memset(&addr, 0, sizeof(addr));
        addr.host   = dev->host;
        addr.pid    = (uint32_t)(id >> 32);
        addr.ctx_id = (uint32_t)id;
        peer        = hca_peer_get(dev, &addr);
        if (peer == NULL) {
            /* its context is gone: so are its accesses; free the slot */
            atomic_compare_exchange_strong(&dev->mappers[i].id, &id, 0);
            continue;
        }
        hca_direct_wait_mapper(peer);
    }
}
