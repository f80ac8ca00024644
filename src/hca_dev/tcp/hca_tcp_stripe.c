/*
 * hca_tcp_stripe.c - a large WRITE over two paths: the requester's side
 * (docs/TCP-PATHS.md, "Striping").
 *
 * A WRITE of HCA_TCP_STRIPE_MIN bytes or more, on a QP whose pair of
 * contexts has a second path UP, is sent in parts over both: its first
 * parts on the sibling, the rest (and its LAST) on the QP's own path.
 * The split follows what each socket has been delivering lately (the
 * kernel's estimate, TCP_INFO's delivery rate: hca_tcp_path.c), not a
 * fixed ratio.  A large READ's answer is striped by its responder
 * (hca_tcp_resp.c), if the READ allows it: sent by a QP with nothing else
 * unanswered, and followed by nothing until its answer is in, as a
 * striped WRITE.
 * Every part keeps its own PSN and says HCA_TCP_F_STRIPED: the responder
 * places the parts in whatever order they come and answers the WRITE
 * once every part landed (hca_tcp_rel.c).  Small messages never stripe:
 * they keep to the QP's path, in order.
 *
 * The QP sends nothing after a striped WRITE until it is answered: a
 * later frame on one path could otherwise come before the WRITE's parts
 * on the other, and be dropped as a gap.  That costs a round trip per
 * striped WRITE.
 *
 * A path lost before the answer: the WRITE goes again from its first
 * unanswered PSN on the QP's path, or on another if that was the one
 * lost (go-back-N, hca_tcp_exec.c).  The parts that landed are dropped
 * as landed, the others placed.
 */
#include "hca_tcp_fabric.h"
#include "hca_queue.h"

#include <string.h>

#define HCA_TCP_STRIPE_BURST 4 /* parts sent on one path before the other
                                  gets its turn: both sockets fill at once */

/* The parts of a WRITE (one PSN each). */
static uint32_t hca_tcp_stripe_parts(const hca_wqe_t *wqe)
{
    return (uint32_t)((wqe->length + HCA_TCP_SEG_MAX - 1) / HCA_TCP_SEG_MAX);
}

int hca_tcp_stripe_fits(const hca_tcp_dev_t *tcp, const hca_wqe_t *wqe)
{
    return (tcp->n_paths > 1) &&
           ((wqe->opcode == HCA_WR_RDMA_WRITE) ||
            (wqe->opcode == HCA_WR_RDMA_READ)) &&
           (wqe->length >= tcp->stripe_min) &&
           (hca_tcp_stripe_parts(wqe) <= HCA_TCP_STRIPE_PARTS);
}

void hca_tcp_stripe_read(hca_qp_t *qp, hca_tcp_sent_t *e)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);

    /* the READ says its answer may be striped (HCA_TCP_F_STRIPED): the
     * answer to a later request could pass the part on the other path.
     * A later READ's answer waits in its record (hca_tcp_acked); nothing
     * else goes after it until it is answered, whose ACK would be taken
     * for the READ's answer lost */
    e->striped       = 1;
    tq->stripe_end   = e->psn + 1;
    tq->stripe_reads = 1;
    atomic_store(&tq->stripe_open, 1);
}

int hca_tcp_stripe_blocks(hca_qp_t *qp, const hca_wqe_t *wqe)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);

    /* after striped READs, further READs go: their answers wait in their
     * records until those before them are in (hca_tcp_acked) */
    if (tq->stripe_reads && (wqe->opcode == HCA_WR_RDMA_READ)) {
        return 0;
    }
    return hca_tcp_stripe_waits(qp);
}

void hca_tcp_stripe_begin(hca_qp_t *qp, hca_wqe_t *wqe, hca_tcp_sent_t *e,
                          hca_tcp_conn_t *sibling)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    uint32_t n       = e->npsn;
    /* the sibling's share: the first parts; ours the rest, and the LAST */
    uint32_t split   = hca_tcp_stripe_split(n, hca_tcp_path_rate(sibling),
                                            hca_tcp_path_rate(tq->conn));

    e->striped         = 1;
    tq->stripe_reads   = 0;
    tq->stripe_split   = split;
    tq->stripe_next[0] = 0;
    tq->stripe_next[1] = split;
    tq->stripe_end     = e->psn + n;
    tq->next_psn       = tq->stripe_end; /* every part has its PSN now */
    tq->rtx_psn        = tq->next_psn;
    tq->wire_psn       = tq->next_psn; /* its parts go from here */
    tq->striping       = 1;
    wqe->done          = 0;
    /* before any part goes: a path lost from now on sends it again
     * (hca_tcp_rewind_conn, hca_tcp_failover_ask) */
    atomic_store(&tq->stripe_open, 1);
    HCA_TCP_COUNT(hca_tcp_dev(qp->dev), HCA_TCP_CNT_STRIPED, 1);
}

int hca_tcp_stripe_waits(hca_qp_t *qp)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    uint64_t tail    = atomic_load_explicit(&tq->sent_tail,
                                            memory_order_acquire);

    if ((tail == atomic_load_explicit(&tq->sent_head,
                                      memory_order_relaxed)) ||
        (hca_tcp_psn_diff(tq->sent[tail & tq->sent_mask].psn,
                          tq->stripe_end) >= 0)) {
        atomic_store(&tq->stripe_open, 0); /* answered */
        return 0;
    }
    return 1;
}

void hca_tcp_stripe_cancel(hca_qp_t *qp, hca_wqe_t *wqe)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    uint64_t tail    = atomic_load_explicit(&tq->sent_tail,
                                            memory_order_acquire);

    tq->striping = 0;
    wqe->done    = wqe->length; /* every PSN is taken: what is not sent
                                   goes with the retransmission */
    if (tail != atomic_load_explicit(&tq->sent_head, memory_order_relaxed)) {
        uint32_t una = tq->sent[tail & tq->sent_mask].psn;
        if ((tq->rtx_psn == tq->next_psn) ||
            (hca_tcp_psn_diff(una, tq->rtx_psn) < 0)) {
            tq->rtx_psn = una;
        }
    }
}

hca_exec_t hca_tcp_stripe_send(hca_tcp_dev_t *tcp, hca_qp_t *qp,
                               hca_wqe_t *wqe)
{
    hca_tcp_qp_t *tq         = hca_tcp_qp(qp);
    hca_tcp_sent_t *e        = hca_tcp_sent_last(qp);
    hca_tcp_conn_t *conns[2] = {tq->stripe_conn, tq->conn};
    uint32_t ends[2]         = {tq->stripe_split, e->npsn};

    for (;;) {
        int moved = 0;

        for (int side = 0; side < 2; ++side) {
            hca_tcp_conn_t *c = conns[side];
            int rc            = 1;

            if (tq->stripe_next[side] == ends[side]) {
                continue;
            }
            pthread_mutex_lock(&c->tx_lock);
            for (int b = 0; (b < HCA_TCP_STRIPE_BURST) &&
                            (tq->stripe_next[side] < ends[side]); ++b) {
                struct iovec iov[HCA_MAX_SGE];
                hca_tcp_hdr_t hdr;
                int iovcnt;

                rc = hca_tcp_tx_flush(tcp, c);
                if (rc <= 0) {
                    break;
                }
                hca_tcp_frame_build(qp, wqe, e, tq->stripe_next[side], &hdr,
                                    iov, &iovcnt);
                hca_tcp_tx_start(c, &hdr, iov, iovcnt, qp->qpn);
                tq->stripe_next[side]++;
                wqe->done += hdr.length;
                moved      = 1;
            }
            if ((rc > 0) && (tq->stripe_next[side] == ends[side])) {
                rc = hca_tcp_tx_flush(tcp, c); /* its last part */
            }
            if (rc == 0) {
                hca_tcp_want_out(tcp, c); /* the thread ends it */
            }
            pthread_mutex_unlock(&c->tx_lock);
            if (rc < 0) {
                /* a path lost its socket: the WRITE goes again, whole,
                 * from its first unanswered PSN, at the next progress
                 * (hca_tcp_exec, which fails over if the lost path was
                 * the QP's own, or reports it dead) */
                hca_tcp_stripe_cancel(qp, wqe);
                wqe->state = HCA_WQE_PARTIAL;
                return HCA_EXEC_PARTIAL;
            }
        }
        if ((tq->stripe_next[0] == ends[0]) &&
            (tq->stripe_next[1] == ends[1])) {
            tq->striping = 0;
            return HCA_EXEC_ISSUED;
        }
        if (!moved) {
            wqe->state = HCA_WQE_PARTIAL; /* both sockets full: on at the
                                             next progress */
            return HCA_EXEC_PARTIAL;
        }
    }
}
