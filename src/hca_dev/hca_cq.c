/*
 * hca_cq.c - completion queues: a ring of CQEs with push, poll and arm.
 *
 * A power-of-two ring of CQEs with an owner (phase) bit: the producer
 * writes the entry, then stores the owner bit of the current wrap
 * (release); the consumer compares it with the phase it expects (acquire).
 * Producers never overwrite: a full CQ sets the overflow error instead.
 * The QPs and receive rings that feed a CQ are attached to it; running
 * them is progress's job (hca_progress.c).
 *
 * Blocking: each CQ owns a notify socket (hca_notify.c); peers in other
 * processes send a byte to it, but only after the consumer armed (flags
 * in shared memory), so the fast path has no syscall.
 */
#include "hca_util.h"
#include "hca_log.h"
#include "hca_base.h"
#include "hca_obj.h"
#include "hca_queue.h"
#include "hca_state.h"

#include <errno.h>
#include <numa.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void *hca_node_alloc(hca_device_t *dev, size_t size)
{
    void *p;

    if ((dev->numa_node >= 0) && (numa_available() >= 0)) {
        p = numa_alloc_onnode(size, dev->numa_node);
        if (p != NULL) {
            memset(p, 0, size);
        }
        return p;
    }
    return calloc(1, size);
}

static void hca_node_free(hca_device_t *dev, void *p, size_t size)
{
    if ((dev->numa_node >= 0) && (numa_available() >= 0)) {
        numa_free(p, size);
    } else {
        free(p);
    }
}

int hca_cq_create(hca_device_t *dev, int cqe, hca_cq_t **cq_p)
{
    uint32_t size, idx = HCA_MAX_CQ;
    hca_cq_t *cq;
    int rc;

    if ((cqe <= 0) || (cqe > HCA_MAX_CQE)) {
        return -EINVAL;
    }
    size = hca_roundup_pow2((uint32_t)cqe);

    cq = calloc(1, sizeof(*cq));
    if (cq == NULL) {
        return -ENOMEM;
    }
    pthread_mutex_lock(&dev->lock);
    for (uint32_t i = 0; i < HCA_MAX_CQ; ++i) {
        if (dev->cqs[i] == NULL) {
            idx          = i;
            dev->cqs[i]  = cq;
            break;
        }
    }
    pthread_mutex_unlock(&dev->lock);
    if (idx == HCA_MAX_CQ) {
        free(cq);
        return -ENOMEM;
    }

    cq->dev      = dev;
    cq->idx      = idx;
    cq->mask     = size - 1;
    cq->log_size = (uint32_t)__builtin_ctz(size);
    cq->ring     = hca_node_alloc(dev, sizeof(hca_cqe_t) * size);
    if (cq->ring == NULL) {
        rc = -ENOMEM;
        goto err_release;
    }
    atomic_store(&dev->notify[idx].armed, 0);
    rc = hca_notify_bind(dev, idx, &cq->sock);
    if (rc != 0) {
        goto err_free_ring;
    }
    *cq_p = cq;
    return 0;

err_free_ring:
    hca_node_free(dev, cq->ring, sizeof(hca_cqe_t) * (cq->mask + 1));
err_release:
    pthread_mutex_lock(&dev->lock);
    dev->cqs[idx] = NULL;
    pthread_mutex_unlock(&dev->lock);
    free(cq);
    return rc;
}

int hca_cq_destroy(hca_cq_t *cq)
{
    hca_device_t *dev = cq->dev;

    if (cq->refs != 0) {
        return -EBUSY;
    }
    close(cq->sock);
    hca_node_free(dev, cq->ring, sizeof(hca_cqe_t) * (cq->mask + 1));
    free(cq->send_qps);
    free(cq->busy_qps);
    free(cq->rqs);
    free(cq->rq_refs);
    pthread_mutex_lock(&dev->lock);
    dev->cqs[cq->idx] = NULL;
    pthread_mutex_unlock(&dev->lock);
    free(cq);
    return 0;
}

int hca_cq_push(hca_cq_t *cq, const hca_wc_t *wc)
{
    hca_cqe_t *cqe;

    if (HCA_UNLIKELY((cq->prod - cq->cons > cq->mask) || cq->overflow)) {
        if (!cq->overflow) {
            hca_log("CQ %u of %s overflowed (%u entries)", cq->idx,
                    cq->dev->name, cq->mask + 1);
        }
        cq->overflow = 1;
        __atomic_fetch_add(&cq->dev->svc_cnt->cq_overflows, 1,
                           __ATOMIC_RELAXED);
        return -EOVERFLOW;
    }
    if (wc->opcode >= HCA_WC_RECV) {
        hca_qp_t *qp = hca_qp_lookup(cq->dev, wc->qp_num);
        if (qp != NULL) {
            qp->rq->cqes++;
        }
    }
    cqe     = &cq->ring[cq->prod & cq->mask];
    cqe->wc = *wc;
    __atomic_store_n(&cqe->owner, hca_cq_phase(cq, cq->prod),
                     __ATOMIC_RELEASE);
    cq->prod++;
    return 0;
}

/* Entries were lost: like an HCA's CQ error, every QP that reports to
 * this CQ goes to ERR (once; outside the engines, so no re-entry). */
void hca_cq_overflow_error(hca_cq_t *cq)
{
    if (cq->overflow_handled) {
        return;
    }
    cq->overflow_handled = 1;
    for (uint32_t i = 0; i < cq->n_send_qps; ++i) {
        if (cq->send_qps[i]->state != HCA_QPS_ERR) {
            hca_qp_to_err(cq->send_qps[i], HCA_WC_WR_FLUSH_ERR);
        }
    }
    for (uint32_t i = 0; i < cq->n_rqs; ++i) {
        hca_qp_t *owner = cq->rqs[i]->owner;
        if ((owner != NULL) && (owner->state != HCA_QPS_ERR)) {
            hca_qp_to_err(owner, HCA_WC_WR_FLUSH_ERR);
        }
    }
}

/* -EAGAIN if a ring already holds something (claimed or published) that
 * does not wait for the caller's next receive (hca_rq_waits_recv). */
int hca_cq_set_armed(hca_cq_t *cq, uint32_t armed)
{
    int rc = 0;

    atomic_store(&cq->dev->notify[cq->idx].armed, armed);
    for (uint32_t i = 0; i < cq->n_rqs; ++i) {
        hca_ring_t *ring = &cq->rqs[i]->ring;
        if (armed) {
            atomic_store(&ring->hdr->notify_idx, cq->idx);
            if (hca_ring_arm(ring, hca_rq_waits_recv(cq->rqs[i])) != 0) {
                rc = -EAGAIN;
            }
        } else {
            hca_ring_disarm(ring);
        }
    }
    return rc;
}

int hca_cq_ring_poll(hca_cq_t *cq, int num, hca_wc_t *wc)
{
    int n = 0;

    while (n < num) {
        hca_cqe_t *cqe = &cq->ring[cq->cons & cq->mask];
        hca_qp_t *qp;
        if (__atomic_load_n(&cqe->owner, __ATOMIC_ACQUIRE) !=
            hca_cq_phase(cq, cq->cons)) {
            break;
        }
        wc[n] = cqe->wc;
        cq->cons++;
        qp = hca_qp_lookup(cq->dev, wc[n].qp_num); /* NULL: destroyed */
        if ((qp != NULL) && (wc[n].opcode < HCA_WC_RECV)) {
            /* the send queue slot of this completion is free now */
            if ((qp->send_cq == cq) && (qp->sq_held > 0)) {
                qp->sq_held--;
            }
        } else if ((qp != NULL) && (qp->rq->cqes > 0)) {
            qp->rq->cqes--; /* in-place receive may pass it now */
        }
        ++n;
    }
    if ((n == 0) && cq->overflow) {
        hca_cq_overflow_error(cq);
        return -EOVERFLOW;
    }
    return n;
}

int hca_cq_fd(hca_cq_t *cq)
{
    return cq->sock;
}

void hca_cq_ack_events(hca_cq_t *cq)
{
    char buf[64];

    while (recv(cq->sock, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
}

static int hca_ptr_array_add(void ***array, uint32_t *n, void *item)
{
    void **grown;

    for (uint32_t i = 0; i < *n; ++i) {
        if ((*array)[i] == item) {
            return 0;
        }
    }
    grown = realloc(*array, sizeof(void*) * (*n + 1));
    if (grown == NULL) {
        return -ENOMEM;
    }
    grown[(*n)++] = item;
    *array        = grown;
    return 0;
}

static void hca_ptr_array_del(void **array, uint32_t *n, void *item)
{
    for (uint32_t i = 0; i < *n; ++i) {
        if (array[i] == item) {
            array[i] = array[--(*n)];
            return;
        }
    }
}

int hca_cq_attach_qp(hca_cq_t *cq, hca_qp_t *qp)
{
    hca_qp_t **busy = realloc(cq->busy_qps,
                              sizeof(*busy) * (cq->n_send_qps + 1));
    int rc;

    if (busy == NULL) {
        return -ENOMEM;
    }
    cq->busy_qps = busy;
    rc = hca_ptr_array_add((void***)&cq->send_qps, &cq->n_send_qps, qp);
    if (rc == 0) {
        cq->refs++;
    }
    return rc;
}

void hca_cq_detach_qp(hca_cq_t *cq, hca_qp_t *qp)
{
    for (uint32_t i = 0; i < cq->n_busy_qps; ++i) {
        if (cq->busy_qps[i] == qp) {
            qp->on_busy     = 0;
            cq->busy_qps[i] = cq->busy_qps[--cq->n_busy_qps];
            break;
        }
    }
    hca_ptr_array_del((void**)cq->send_qps, &cq->n_send_qps, qp);
    cq->refs--;
}

int hca_cq_attach_rq(hca_cq_t *cq, hca_rq_t *rq)
{
    uint32_t *refs;
    int rc;

    for (uint32_t i = 0; i < cq->n_rqs; ++i) {
        if (cq->rqs[i] == rq) {
            cq->rq_refs[i]++;
            cq->refs++;
            return 0;
        }
    }
    refs = realloc(cq->rq_refs, sizeof(*refs) * (cq->n_rqs + 1));
    if (refs == NULL) {
        return -ENOMEM;
    }
    cq->rq_refs = refs;
    rc = hca_ptr_array_add((void***)&cq->rqs, &cq->n_rqs, rq);
    if (rc != 0) {
        return rc;
    }
    cq->rq_refs[cq->n_rqs - 1] = 1;
    cq->refs++;
    return 0;
}

/* Last QP of this CQ on rq gone: poll no longer progresses it. */
void hca_cq_detach_rq(hca_cq_t *cq, hca_rq_t *rq)
{
    for (uint32_t i = 0; i < cq->n_rqs; ++i) {
        if (cq->rqs[i] != rq) {
            continue;
        }
        cq->refs--;
        if (--cq->rq_refs[i] == 0) {
            cq->n_rqs--;
            cq->rqs[i]     = cq->rqs[cq->n_rqs];
            cq->rq_refs[i] = cq->rq_refs[cq->n_rqs];
        }
        return;
    }
}
