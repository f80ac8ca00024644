/*
 * hca_rq.c - receive queues: a QP's own, or an SRQ's.  Each has one
 * receive ring in shared memory that requesters of any process write
 * into; the receive WQEs stay private.
 */
#include "hca_util.h"
#include "hca_base.h"
#include "hca_obj.h"
#include "hca_mpt.h"
#include "hca_state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int hca_rq_init(hca_rq_t *rq, hca_pd_t *pd, uint32_t depth,
                uint32_t max_sge, int is_srq)
{
    hca_device_t *dev = pd->dev;
    char name[HCA_OBJ_NAME_MAX];
    int rc;

    if ((depth == 0) || (depth > HCA_MAX_QP_WR) || (max_sge > HCA_MAX_SGE)) {
        return -EINVAL;
    }
    memset(rq, 0, sizeof(*rq));
    depth      = hca_roundup_pow2(depth);
    rq->dev    = dev;
    rq->pd     = pd;
    rq->mask   = depth - 1;
    rq->max_sge = max_sge ? max_sge : 1;
    rq->is_srq = is_srq;
    rq->wqes   = calloc(depth, sizeof(*rq->wqes));
    if (rq->wqes == NULL) {
        return -ENOMEM;
    }

    pthread_mutex_lock(&dev->lock);
    rq->ring_id = dev->next_ring_id++;  /* never reused: peers cache it */
    pthread_mutex_unlock(&dev->lock);
    hca_obj_name(name, sizeof(name), dev->pidns, dev->pid, dev->ctx_id,
                 dev->name_nonce, "r", rq->ring_id);
    rc = hca_memobj_create(&rq->obj, name,
                        hca_ring_bytes(HCA_RING_SLOTS, HCA_RING_SLOT_SIZE),
                        dev->numa_node);
    if (rc != 0) {
        free(rq->wqes);
        return rc;
    }
    hca_ring_init(&rq->ring, rq->obj.addr, HCA_RING_SLOTS,
                  HCA_RING_SLOT_SIZE, 0);
    return 0;
}

void hca_rq_cleanup(hca_rq_t *rq)
{
    rq->ring.hdr->magic = 0; /* requesters that still hold it see it gone */
    hca_memobj_destroy(&rq->obj);
    free(rq->wqes);
}

/* A message waited for this receive, and the CQ may have been armed on
 * it (hca_rq_waits_recv): wake its consumer, who will place it now, as a
 * NIC's retried SEND would complete after an RNR NAK.  Once per wait. */
static HCA_NOINLINE void hca_rq_recv_posted(hca_rq_t *rq)
{
    hca_device_t *dev = rq->dev;
    uint32_t idx      = atomic_load(&rq->ring.hdr->notify_idx);

    rq->rnr_at = 0;
    if ((idx < HCA_MAX_CQ) && atomic_load(&dev->notify[idx].armed)) {
        hca_notify_signal(dev, &dev->notify_self, idx);
    }
}

int hca_rq_post(hca_rq_t *rq, hca_recv_wr_t *wr, hca_recv_wr_t **bad_wr)
{
    for (; wr != NULL; wr = wr->next) {
        hca_rwqe_t *rwqe;
        uint64_t length = 0;

        if ((wr->num_sge < 0) || ((uint32_t)wr->num_sge > rq->max_sge) ||
            ((wr->num_sge > 0) && (wr->sg_list == NULL))) {
            *bad_wr = wr;
            return -EINVAL;
        }
        if (hca_sge_check(rq->dev, rq->pd->handle, wr->sg_list, wr->num_sge,
                          HCA_ACCESS_LOCAL_WRITE) != HCA_WC_SUCCESS) {
            *bad_wr = wr;
            return -EINVAL; /* the lkey does not cover the buffer */
        }
        if (rq->head - rq->tail > rq->mask) {
            *bad_wr = wr;
            return -ENOMEM;
        }
        rwqe          = &rq->wqes[rq->head & rq->mask];
        rwqe->wr_id   = wr->wr_id;
        rwqe->num_sge = (uint32_t)wr->num_sge;
        for (int i = 0; i < wr->num_sge; ++i) {
            rwqe->sge[i] = wr->sg_list[i];
            length      += wr->sg_list[i].length;
        }
        rwqe->length = (length > UINT32_MAX) ? UINT32_MAX : (uint32_t)length;
        rq->head++;
        if (HCA_UNLIKELY(rq->rnr_at != 0)) {
            hca_rq_recv_posted(rq);
        }
    }
    return 0;
}

