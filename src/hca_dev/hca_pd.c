/*
 * hca_pd.c - protection domains: a handle that MRs, QPs and SRQs are
 * created in; an access passes only if the MR's and the target QP's PDs
 * are the same.
 */
#include "hca_obj.h"

#include <errno.h>
#include <stdlib.h>

int hca_pd_alloc(hca_device_t *dev, hca_pd_t **pd_p)
{
    hca_pd_t *pd;

    pthread_mutex_lock(&dev->lock);
    if (dev->n_pd >= HCA_MAX_PD) {
        pthread_mutex_unlock(&dev->lock);
        return -ENOMEM;
    }
    pd = calloc(1, sizeof(*pd));
    if (pd == NULL) {
        pthread_mutex_unlock(&dev->lock);
        return -ENOMEM;
    }
    pd->dev    = dev;
    pd->handle = dev->next_pd++;
    dev->n_pd++;
    pthread_mutex_unlock(&dev->lock);
    *pd_p = pd;
    return 0;
}

int hca_pd_dealloc(hca_pd_t *pd)
{
    hca_device_t *dev = pd->dev;

    if (atomic_load(&pd->refs) != 0) {
        return -EBUSY;
    }
    pthread_mutex_lock(&dev->lock);
    dev->n_pd--;
    pthread_mutex_unlock(&dev->lock);
    free(pd);
    return 0;
}

/* The device memory object holding [addr, addr+length), if any.
 * Caller holds dev->lock. */
