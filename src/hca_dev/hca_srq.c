/*
 * hca_srq.c - shared receive queues: one receive queue (hca_rq.c) used by
 * many QPs.
 */
#include "hca_state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int hca_srq_create(hca_pd_t *pd, const hca_srq_init_attr_t *attr,
                   hca_srq_t **srq_p)
{
    hca_srq_t *srq;
    int rc;

    srq = calloc(1, sizeof(*srq));
    if (srq == NULL) {
        return -ENOMEM;
    }
    rc = hca_rq_init(&srq->rq, pd, attr->max_wr, attr->max_sge, 1);
    if (rc != 0) {
        free(srq);
        return rc;
    }
    atomic_fetch_add(&pd->refs, 1);
    *srq_p = srq;
    return 0;
}

int hca_srq_destroy(hca_srq_t *srq)
{
    if (srq->qps != 0) {
        return -EBUSY;
    }
    atomic_fetch_sub(&srq->rq.pd->refs, 1);
    hca_rq_cleanup(&srq->rq);
    free(srq);
    return 0;
}

int hca_post_srq_recv(hca_srq_t *srq, hca_recv_wr_t *wr,
                      hca_recv_wr_t **bad_wr)
{
    return hca_rq_post(&srq->rq, wr, bad_wr);
}
