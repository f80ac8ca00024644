/*
 * hca_counters.h - the device's counters: the requester's per-WR count, and
 * the shared stats objects they are published to (hca_stats.c).
 * Private to libhcadev (not installed).
 */
#ifndef HCA_COUNTERS_H
#define HCA_COUNTERS_H

#include "hca_obj.h"

/* The requester's counters of an executed WR: kept here only. */
HCA_INLINE void hca_count_tx(hca_qp_t *qp, unsigned opcode, uint64_t bytes)
{
    unsigned f = qp->fabric->type; /* a real fabric: only RTS QPs execute */

    qp->cnt->tx_ops[opcode]++;
    qp->cnt->tx_bytes[opcode] += bytes;
    if (HCA_LIKELY(f < HCA_FABRIC_LAST)) {
        qp->cnt->fabric_tx_ops[f][opcode]++;
        qp->cnt->fabric_tx_bytes[f][opcode] += bytes;
    }
}

void     hca_counters_add(hca_counters_t *to, const hca_counters_t *from);
void     hca_stats_open(hca_device_t *dev);
void     hca_stats_retire(hca_device_t *dev, const hca_counters_t *cnt);
void     hca_stats_close(hca_device_t *dev);

#endif
