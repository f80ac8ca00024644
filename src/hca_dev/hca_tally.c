/*
 * hca_tally.c - a QP's requester tally (hca_counters.h) and its
 * publication to the shared counters in the QP's q object.
 *
 * The fast paths count in qp->tally, memory only this process writes; the
 * shared counters (qp->cnt), which hca_devinfo reads from other processes,
 * are written here only, off the fast path: by the QP's own thread every
 * HCA_TALLY_PUBLISH_OPS operations of an opcode, at the QP's reset and at
 * its destruction.  So a live process's figures, seen from outside, lag by
 * less than HCA_TALLY_PUBLISH_OPS operations per opcode, and none is lost
 * when a QP closes.  The process's own readers see every figure.
 */
#include "hca_obj.h"
#include "hca_counters.h"

#include <string.h>

/* The tally's figures not yet in the shared counters, added to *cnt:
 * plain, by opcode, and by the fabric the QP has now (it keeps one from
 * RTR to its reset, where the tally is published). */
static void hca_tally_add_delta(const hca_qp_t *qp, hca_counters_t *cnt,
                                const hca_tally_op_t *now,
                                const hca_tally_op_t *before)
{
    unsigned f = qp->fabric->type;

    for (unsigned op = 0; op < HCA_WR_OPCODE_LAST; ++op) {
        uint64_t ops   = now[op].ops - before[op].ops;
        uint64_t bytes = now[op].bytes - before[op].bytes;

        cnt->tx_ops[op]   += ops;
        cnt->tx_bytes[op] += bytes;
        cnt->mapped_ops   += now[op].mapped - before[op].mapped;
        if (f < HCA_FABRIC_LAST) {
            cnt->fabric_tx_ops[f][op]   += ops;
            cnt->fabric_tx_bytes[f][op] += bytes;
        }
    }
}

/* The QP's thread (the one that counts): its fast paths, reset, destroy. */
void hca_tally_publish(hca_qp_t *qp)
{
    hca_tally_t *t = &qp->tally;
    hca_tally_op_t now[HCA_WR_OPCODE_LAST];
    uint32_t seq   = atomic_load_explicit(&t->seq, memory_order_relaxed);

    atomic_store_explicit(&t->seq, seq + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    memcpy(now, t->tx, sizeof(now));
    hca_tally_add_delta(qp, qp->cnt, now, t->published);
    memcpy(t->published, now, sizeof(now));
    atomic_store_explicit(&t->seq, seq + 2, memory_order_release);
}

/* Any thread of the process.  The shared counters and the published part
 * are read under the sequence, so a publication never counts twice; the
 * tally after them, so that it is never behind the published part (it
 * only grows).  A count racing this read shows at the next one. */
void hca_tally_read(hca_qp_t *qp, hca_counters_t *cnt)
{
    hca_tally_t *t = &qp->tally;
    hca_tally_op_t now[HCA_WR_OPCODE_LAST], before[HCA_WR_OPCODE_LAST];
    uint32_t seq;

    for (;;) {
        seq = atomic_load_explicit(&t->seq, memory_order_acquire);
        if (seq & 1) {
            continue; /* a publication is a few hundred instructions */
        }
        *cnt = *qp->cnt;
        memcpy(before, t->published, sizeof(before));
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&t->seq, memory_order_relaxed) == seq) {
            break;
        }
    }
    memcpy(now, t->tx, sizeof(now));
    hca_tally_add_delta(qp, cnt, now, before);
}
