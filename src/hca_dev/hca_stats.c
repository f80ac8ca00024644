/*
 * hca_stats.c - counters per QP and per device context.
 */
#include "hca_priv.h"

#include <string.h>

void hca_counters_add(hca_counters_t *to, const hca_counters_t *from)
{
    const uint64_t *src = (const uint64_t*)from;
    uint64_t *dst       = (uint64_t*)to;

    _Static_assert(sizeof(hca_counters_t) % sizeof(uint64_t) == 0,
                   "counters are all uint64_t");
    for (size_t i = 0; i < sizeof(*to) / sizeof(uint64_t); ++i) {
        dst[i] += src[i];
    }
}

int hca_device_counters(hca_device_t *dev, hca_counters_t *cnt)
{
    pthread_mutex_lock(&dev->lock);
    *cnt = dev->retired;
    hca_counters_add(cnt, &dev->svc_cnt);
    for (uint32_t i = 1; i < HCA_MAX_QP; ++i) {
        if (dev->qps[i] != NULL) {
            hca_counters_add(cnt, &dev->qps[i]->cnt);
        }
    }
    pthread_mutex_unlock(&dev->lock);
    return 0;
}
