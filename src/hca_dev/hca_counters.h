/*
 * hca_counters.h - the device's counters: the requester's per-operation
 * tally (hca_tally.c), and the shared stats objects (hca_stats.c).
 * Private to libhcadev (not installed).
 */
#ifndef HCA_COUNTERS_H
#define HCA_COUNTERS_H

#include "hca_obj.h"

/* hca_tally.c: the tally's publication; the QP's counters with what is
 * not published yet (any thread of the process). */
void     hca_tally_publish(hca_qp_t *qp);
void     hca_tally_read(hca_qp_t *qp, hca_counters_t *cnt);

/* Every this many operations of one opcode the tally is published. */
#define HCA_TALLY_PUBLISH_OPS HCA_COUNTERS_PUBLISH_OPS

/* The requester's counts: one cache line of the QP's own memory per
 * operation, nothing shared written.  The shared counters (qp->cnt, in the
 * q object that hca_devinfo maps) get the tally every
 * HCA_TALLY_PUBLISH_OPS operations of an opcode, when the QP leaves its
 * fabric (reset) and when it is destroyed; the process's own readers
 * (hca_qp_counters, hca_device_counters) read both (hca_tally_read).
 * The per-fabric figures are derived at publication from the QP's fabric,
 * which a QP keeps from RTR to its reset.  Slow-path counts (a ring full,
 * errors, an operation executed from a WR by mapping or CMA) go to qp->cnt
 * directly: a WR writes shared lines anyway. */
HCA_INLINE void hca_count_tx(hca_qp_t *qp, unsigned opcode, uint64_t bytes)
{
    hca_tally_op_t *t = &qp->tally.tx[opcode];

    t->bytes += bytes;
    if (HCA_UNLIKELY((++t->ops % HCA_TALLY_PUBLISH_OPS) == 0)) {
        hca_tally_publish(qp);
    }
}

/* An operation done straight in the peer's mapped device memory. */
HCA_INLINE void hca_count_tx_mapped(hca_qp_t *qp, unsigned opcode,
                                    uint64_t bytes)
{
    qp->tally.tx[opcode].mapped++;
    hca_count_tx(qp, opcode, bytes);
}

void     hca_counters_add(hca_counters_t *to, const hca_counters_t *from);
void     hca_stats_open(hca_device_t *dev);
void     hca_stats_retire(hca_device_t *dev, const hca_counters_t *cnt);
void     hca_stats_close(hca_device_t *dev);

#endif
