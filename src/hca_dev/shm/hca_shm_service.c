/*
 * hca_shm_service.c - the responder thread of a device context.
 *
 * It executes what a requester in another process cannot do by itself:
 * atomics on plain (non device) memory, and RDMA WRITE/READ chunks when
 * single copy is not permitted.  It sleeps on the context's service
 * socket and is woken by requesters only when it armed, so one-sided
 * operations complete while the owner never calls the device - as on a
 * hardware HCA.  While the owner polls, its polls serve the ring instead
 * (hca_progress.c counts them; hca_svc_serve below).
 */
#include "hca_shm_target.h"
#include "hca_mpt.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>


static hca_wc_status_t hca_svc_execute(hca_device_t *dev,
                                       const hca_svc_req_t *req,
                                       uint8_t *bounce, uint64_t *value_p)
{
    uint32_t idx = HCA_QPN_INDEX(req->dst_qpn);
    const hca_opcode_info_t *info;
    hca_mpt_entry_t *entry;
    hca_wc_status_t status;
    hca_qp_pub_t *pub;
    unsigned align = 1;

    if ((req->opcode >= HCA_WR_OPCODE_LAST) || (idx == 0) ||
        (idx >= HCA_MAX_QP)) {
        return HCA_WC_REM_INV_REQ_ERR;
    }
    info  = &hca_opcode[req->opcode];
    pub    = &dev->qp_pub[idx];
    /* a request in our service ring comes from this host */
    status = hca_qp_pub_check(pub, req->dst_qpn, dev->host_key, req->src_pid,
                              req->src_ctx, req->src_qpn);
    if (status != HCA_WC_SUCCESS) {
        return status;
    }
    if ((info->flags & HCA_OPF_ATOMIC)) {
        if ((req->size != 4) && (req->size != 8)) {
            return HCA_WC_REM_INV_REQ_ERR;
        }
        align = req->size;
    } else if (((req->opcode != HCA_WR_RDMA_WRITE) &&
                (req->opcode != HCA_WR_RDMA_WRITE_WITH_IMM) &&
                (req->opcode != HCA_WR_RDMA_READ)) ||
               (req->length > HCA_BOUNCE_SIZE)) {
        return HCA_WC_REM_INV_REQ_ERR;
    }
    if ((pub->access & info->rem_access) != info->rem_access) {
        return HCA_WC_REM_ACCESS_ERR;
    }
    status = hca_mpt_acquire(dev->mpt, HCA_MAX_MR, req->rkey, pub->pd_handle,
                             info->rem_access, req->remote_addr,
                             (info->flags & HCA_OPF_ATOMIC) ? req->size :
                                                              req->length,
                             align, &entry);
    if (status != HCA_WC_SUCCESS) {
        return status;
    }
    if (info->flags & HCA_OPF_ATOMIC) {
        *value_p = hca_atomic_apply(req->opcode,
                                        (void*)(uintptr_t)req->remote_addr,
                                        req->size, req->operand, req->swap);
    } else if (info->flags & HCA_OPF_READ) {
        memcpy(bounce, (void*)(uintptr_t)req->remote_addr, req->length);
    } else {
        memcpy((void*)(uintptr_t)req->remote_addr, bounce, req->length);
    }
    hca_mpt_release(entry);
    return HCA_WC_SUCCESS;
}

static void hca_svc_handle(hca_device_t *dev, const hca_svc_req_t *req)
{
    hca_wc_status_t status;
    uint64_t value = 0;
    hca_answer_t a;

    if (hca_answer_begin(dev, req->src_pid, req->src_ctx, req->src_qpn,
                         req->resp_idx, &a) != 0) {
        return; /* counted there; the requester is told if it can be */
    }
    status = hca_svc_execute(dev, req, a.map->bounce, &value);
    __atomic_fetch_add(&dev->svc_cnt->responder_ops, 1, __ATOMIC_RELAXED);
    if (status == HCA_WC_SUCCESS) {
        __atomic_fetch_add(&dev->svc_cnt->rx_ops[req->opcode], 1,
                           __ATOMIC_RELAXED);
        __atomic_fetch_add(&dev->svc_cnt->rx_bytes[req->opcode],
                           (hca_opcode[req->opcode].flags & HCA_OPF_ATOMIC) ?
                           req->size : req->length, __ATOMIC_RELAXED);
    }
    hca_answer_end(dev, &a, req->resp_stamp, status, value);
}

/* The ring's consumer: svc_lock held.  At most max requests. */
static int hca_svc_drain(hca_device_t *dev, int max)
{
    int count = 0;
    uint64_t idx;
    void *slot;

    while ((count < max) && ((slot = hca_ring_peek(&dev->svc, &idx)) != NULL)) {
        hca_svc_req_t req;
        memcpy(&req, slot, sizeof(req)); /* a peer may scribble on it */
        hca_ring_release(&dev->svc, idx);
        hca_svc_handle(dev, &req);
        ++count;
    }
    return count;
}

static int hca_svc_drain_locked(hca_device_t *dev)
{
    int count;

    pthread_mutex_lock(&hca_shm_dev(dev)->svc_lock);
    count = hca_svc_drain(dev, INT32_MAX);
    pthread_mutex_unlock(&hca_shm_dev(dev)->svc_lock);
    return count;
}

/*
 * While the owner polls, it serves the ring itself, in its poll: a
 * request is answered within one poll (hca_progress.c looks at the ring
 * and calls hca_svc_serve), with no thread switch on either
 * side and no wake-up for the requester to send (on a VM an IPI costs
 * more than the whole request).  While the owner's polls serve requests,
 * the thread sleeps unarmed, and looks every HCA_SVC_NAP_MS whether the
 * owner still polls; once it does not (or it armed a CQ to sleep:
 * hca_svc_owner_armed wakes the thread at once), or a nap passed in which
 * its polls served none, the thread arms the ring and requesters wake it
 * as before.  A request posted just
 * as the owner stopped polling waits at most one nap.
 */
#define HCA_SVC_NAP_MS 1

/* Before it sleeps armed, the thread looks at the ring for this long after
 * its last request: a requester that issues one atomic after the other
 * (a fetch-and-add loop) then never waits for a wake-up, which costs tens
 * of microseconds on a virtual machine, the CPU's return from idle
 * included.  Only after requests, so an idle context spins never. */
#define HCA_SVC_SPIN_NS 50000ull

int hca_svc_serve(hca_device_t *dev)
{
    hca_shm_dev_t *sd = hca_shm_dev(dev);
    int count;

    /* the thread, or another poller, is at it: they answer it */
    if (pthread_mutex_trylock(&sd->svc_lock) != 0) {
        return 0;
    }
    /* a ring's worth at most: requesters that keep it full must not hold
     * the owner's poll; the rest waits for the next one */
    count = hca_svc_drain(dev, HCA_SVC_SLOTS);
    pthread_mutex_unlock(&sd->svc_lock);
    if (count != 0) {
        atomic_fetch_add_explicit(&sd->svc_owner_served, (uint64_t)count,
                                  memory_order_relaxed);
    }
    return count;
}

void hca_svc_owner_armed(hca_device_t *dev)
{
    hca_shm_dev_t *sd = hca_shm_dev(dev);

    if (atomic_load(&sd->svc_napping)) {
        hca_notify_signal(dev, &dev->notify_self, HCA_NOTIFY_SVC);
    }
}

static void hca_svc_flush_wakeups(hca_device_t *dev)
{
    char buf[64];

    while (recv(hca_shm_dev(dev)->svc_sock, buf, sizeof(buf),
                MSG_DONTWAIT) > 0) {
    }
}

static void *hca_svc_thread(void *arg)
{
    hca_device_t *dev = arg;
    hca_shm_dev_t *sd = hca_shm_dev(dev);
    struct pollfd pfd = {.fd = hca_shm_dev(dev)->svc_sock, .events = POLLIN};
    uint64_t polls_seen  = atomic_load(&dev->owner_polls);
    uint64_t served_seen = atomic_load(&sd->svc_owner_served);

    uint64_t last_work   = 0;

    while (!atomic_load(&hca_shm_dev(dev)->svc_stop)) {
        uint64_t polls, served;

        if (hca_svc_drain_locked(dev) > 0) {
            last_work = hca_now_ns();
            continue;
        }
        polls  = atomic_load_explicit(&dev->owner_polls, memory_order_relaxed);
        served = atomic_load_explicit(&sd->svc_owner_served,
                                      memory_order_relaxed);
        if ((polls != polls_seen) && (served != served_seen) &&
            !atomic_load(&dev->owner_asleep)) {
            /* the owner polls and its polls answer requests: look again
             * after a nap.  Once a nap passes in which the owner served
             * none, the thread sleeps armed: an owner that polls with
             * nothing to serve costs no wake-ups, and one that polls
             * rarely leaves its requests to the thread. */
            polls_seen  = polls;
            served_seen = served;
            atomic_store(&sd->svc_napping, 1);
            (void)poll(&pfd, 1, HCA_SVC_NAP_MS);
            atomic_store(&sd->svc_napping, 0);
            hca_svc_flush_wakeups(dev);
            continue;
        }
        if ((last_work != 0) && (hca_now_ns() - last_work < HCA_SVC_SPIN_NS)) {
            sched_yield(); /* the owner's threads first, if they want the CPU */
            continue;
        }
        /* arm only while nothing is claimed: a request claimed after the
         * arm finds the bit in head and wakes us */
        if (hca_ring_arm(&dev->svc, 0) != 0) {
            if (hca_ring_empty(&dev->svc)) {
                /* a slot claimed before the arm and not yet published:
                 * its producer will not wake us, so look again soon;
                 * unless it was killed before it published */
                int reaped;

                pthread_mutex_lock(&sd->svc_lock);
                reaped = hca_ring_reap_dead_claim(&dev->svc,
                                                  &dev->svc_unstamped);
                pthread_mutex_unlock(&sd->svc_lock);
                if (reaped) {
                    continue;
                }
                (void)poll(&pfd, 1, 1);
            }
            continue;
        }
        (void)poll(&pfd, 1, 1000);
        hca_svc_flush_wakeups(dev);
        hca_ring_disarm(&dev->svc);
        /* whatever the owner did while we slept armed: a fresh look */
        polls_seen  = atomic_load(&dev->owner_polls);
        served_seen = atomic_load(&sd->svc_owner_served);
    }
    return NULL;
}

int hca_svc_start(hca_device_t *dev)
{
    int rc;

    rc = hca_notify_bind(dev, HCA_NOTIFY_SVC, &hca_shm_dev(dev)->svc_sock);
    if (rc != 0) {
        return rc;
    }
    rc = pthread_create(&hca_shm_dev(dev)->svc_thread, NULL, hca_svc_thread, dev);
    if (rc != 0) {
        close(hca_shm_dev(dev)->svc_sock);
        return -rc;
    }
    hca_shm_dev(dev)->svc_started = 1;
    return 0;
}

void hca_svc_stop(hca_device_t *dev)
{
    if (!hca_shm_dev(dev)->svc_started) {
        return;
    }
    atomic_store(&hca_shm_dev(dev)->svc_stop, 1);
    hca_notify_signal(dev, &dev->notify_self, HCA_NOTIFY_SVC);
    pthread_join(hca_shm_dev(dev)->svc_thread, NULL);
    close(hca_shm_dev(dev)->svc_sock);
    hca_shm_dev(dev)->svc_started = 0;
}
