/*
 * hca_tcp_exec.c - the tcp fabric's requester side: a WQE becomes frames
 * on its QP's connection, sent by the QP's owner under tx_lock, straight
 * from the WQE's buffers (sendmsg with an iovec: no copy).  SENDs go in
 * fragments of one receive-ring slot, WRITEs in HCA_TCP_SEG_MAX parts, so
 * that other QPs' frames pass between them.  Every WQE ends with the
 * responder's answer in its response slot (hca_tcp_resp.c): completion
 * means the responder executed it.  Each frame takes its QP's next PSN,
 * and each WQE is recorded until answered (hca_tcp_rel.c): what the
 * thread asks to be sent again goes before any new frame.
 */
#include "hca_tcp_fabric.h"
#include "hca_queue.h"
#include "hca_log.h"

#include <string.h>

/* A remote range that wraps (its end past the last address): no region
 * holds it, and the responder would refuse it.  The requester knows that
 * much before sending. */
static int hca_tcp_range_wraps(const hca_wqe_t *wqe)
{
    uint64_t len;

    switch ((hca_wr_opcode_t)wqe->opcode) {
    case HCA_WR_SEND:
    case HCA_WR_SEND_WITH_IMM:
        return 0;
    case HCA_WR_RDMA_WRITE:
    case HCA_WR_RDMA_WRITE_WITH_IMM:
    case HCA_WR_RDMA_READ:
        len = wqe->length;
        break;
    default: /* atomics */
        len = (wqe->flags & HCA_SEND_ATOMIC32) ? 4 : 8;
        break;
    }
    return wqe->remote_addr + len < wqe->remote_addr;
}

/* Sends again from rtx_psn what the thread asked for, and for the first
 * time what was recorded while the connection was not UP (tx_lock held):
 * 1 done (or left to the thread: the socket is full with the last), 0 the
 * socket is full, -1 the connection is down. */
static int hca_tcp_rtx(hca_tcp_dev_t *tcp, hca_qp_t *qp, hca_tcp_conn_t *conn)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    int rc;

    hca_tcp_rewind_take(qp);
    if (HCA_UNLIKELY(qp->dev->trace)) {
        hca_log("tcp fabric: qp 0x%x sends again psn %u to %u", qp->qpn,
                tq->rtx_psn, tq->next_psn);
    }
    while (tq->rtx_psn != tq->next_psn) {
        struct iovec iov[HCA_MAX_SGE];
        hca_tcp_sent_t *e = hca_tcp_sent_find(qp, tq->rtx_psn);
        const hca_wqe_t *wqe;
        hca_tcp_hdr_t hdr;
        int iovcnt;

        if (e == NULL) {
            uint64_t tail = atomic_load_explicit(&tq->sent_tail,
                                                 memory_order_acquire);
            /* answered meanwhile: on from the first unanswered frame */
            if ((tail != atomic_load_explicit(&tq->sent_head,
                                              memory_order_relaxed)) &&
                (hca_tcp_psn_diff(tq->sent[tail & tq->sent_mask].psn,
                                  tq->rtx_psn) > 0)) {
                tq->rtx_psn = tq->sent[tail & tq->sent_mask].psn;
                continue;
            }
            tq->rtx_psn = tq->next_psn;
            break;
        }
        wqe = &qp->sq[e->sq_idx];
        rc  = hca_tcp_tx_flush(tcp, conn);
        if (rc <= 0) {
            if (rc == 0) {
                hca_tcp_want_out(tcp, conn);
            }
            return rc;
        }
        hca_tcp_frame_build(qp, wqe, e, tq->rtx_psn - e->psn, &hdr, iov,
                            &iovcnt);
        hca_tcp_tx_start(conn, &hdr, iov, iovcnt, qp->qpn);
        if (hca_tcp_psn_diff(tq->rtx_psn, tq->wire_psn) >= 0) {
            /* its first time out: posted while the connection was not UP */
            tq->wire_psn = tq->rtx_psn + 1;
        } else {
            HCA_TCP_COUNT(tcp, HCA_TCP_CNT_RETRANSMITS, 1);
            HCA_TCP_COUNT(tcp, HCA_TCP_CNT_PATH(conn->path,
                                                HCA_TCP_PATH_RETRANSMITS), 1);
        }
        tq->rtx_psn++;
    }
    rc = hca_tcp_tx_flush(tcp, conn);
    if (rc == 0) {
        hca_tcp_want_out(tcp, conn);
        return 1; /* the thread finishes it: new frames may follow */
    }
    return rc;
}

/* A connection's first handshake is done (the thread; the connection is
 * UP): what its QPs posted meanwhile (hca_tcp_exec_unsent) goes out now,
 * from here, as a NIC sends its queue whether or not its host polls.  Its
 * sender may never poll again: it posted a message, whose post completed,
 * and then waits for the answer on another worker (UCX's
 * test_ucp_wakeup.efd); the rewind only wakes an owner that sleeps armed.
 * Under the connection's tx_lock, as the owner's own sends: its next exec
 * finds nothing left to send (rtx_psn == next_psn).  A connection made
 * again keeps its go-back-N in its owners' polls (issue 27). */
void hca_tcp_send_unsent(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    hca_device_t *dev = tcp->dev;

    if (conn->qp_refs == 0) {
        return;
    }
    for (uint32_t i = 1; i < HCA_MAX_QP; ++i) {
        hca_qp_t *qp = __atomic_load_n(&dev->qps[i], __ATOMIC_ACQUIRE);
        hca_tcp_qp_t *tq;

        if ((qp == NULL) || (qp->fabric->type != HCA_FABRIC_TCP) ||
            (qp->state != HCA_QPS_RTS)) {
            continue;
        }
        tq = hca_tcp_qp(qp);
        if ((tq->conn != conn) || (tq->sent == NULL)) {
            continue;
        }
        pthread_mutex_lock(&conn->tx_lock);
        if ((atomic_load(&conn->state) == HCA_TCP_CONN_UP) &&
            (tq->conn == conn) && !tq->striping &&
            (tq->rtx_psn != tq->next_psn)) {
            (void)hca_tcp_rtx(tcp, qp, conn);
        }
        pthread_mutex_unlock(&conn->tx_lock);
    }
}

/* The connection is down for now (LINKING: the WQE's frames go out, or
 * again, once it is back), or for good (*status_p). */
static hca_exec_t hca_tcp_exec_down(hca_tcp_conn_t *conn, hca_exec_t busy,
                                    hca_wc_status_t *status_p)
{
    if (atomic_load(&conn->state) == HCA_TCP_CONN_DEAD) {
        *status_p = (hca_wc_status_t)atomic_load(&conn->fail);
        return HCA_EXEC_DONE;
    }
    return busy;
}

/* A new WQE while the connection is being made (its first handshake) or
 * made again (LINKING, or the dialler dialling again): it takes its PSNs
 * and is recorded as if its frames were lost, so that the go-back-N of
 * the connection once UP sends it (hca_tcp_rtx, from rtx_psn: the thread
 * wakes the owner for it, hca_tcp_rewind_conn).  The post is accepted and
 * returns, as a verbs QP in RTS accepts one while its link comes up or
 * retries: a post never waits for the network.  What is kept stays
 * bounded by the send queue; a connection that dies instead fails it
 * (hca_tcp_poll_response), or hands it to another path.  BUSY if the
 * connection is UP meanwhile (the caller sends it) or HCA_TCP_RD_ATOM
 * atomics are unanswered. */
static hca_exec_t hca_tcp_exec_unsent(hca_qp_t *qp, hca_wqe_t *wqe,
                                      hca_tcp_conn_t *conn)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    hca_exec_t res   = HCA_EXEC_BUSY;

    pthread_mutex_lock(&conn->tx_lock);
    if (atomic_load_explicit(&conn->state, memory_order_acquire) !=
        HCA_TCP_CONN_UP) {
        wqe->done       = 0;
        wqe->resp_stamp = hca_qp_next_stamp(qp);
        if (hca_tcp_sent_push(qp, wqe) == 0) {
            /* rtx_psn stays: at the first of these frames, or before */
            tq->next_psn += hca_tcp_sent_last(qp)->npsn;
            wqe->done     = wqe->length;
            res           = HCA_EXEC_ISSUED;
        }
    }
    pthread_mutex_unlock(&conn->tx_lock);
    return res;
}

hca_exec_t hca_tcp_exec(hca_qp_t *qp, hca_wqe_t *wqe,
                        hca_wc_status_t *status_p)
{
    hca_tcp_dev_t *tcp   = hca_tcp_dev(qp->dev);
    hca_tcp_qp_t *tq     = hca_tcp_qp(qp);
    hca_tcp_conn_t *conn = tq->conn;
    int state            = atomic_load_explicit(&conn->state,
                                                memory_order_acquire);
    hca_exec_t busy      = (wqe->state == HCA_WQE_PARTIAL) ?
                           HCA_EXEC_PARTIAL : HCA_EXEC_BUSY;
    hca_exec_t res       = HCA_EXEC_ISSUED;
    hca_tcp_conn_t *sibling = NULL;
    hca_tcp_sent_t *e;

    if (HCA_UNLIKELY(atomic_load_explicit(&tq->stripe_open,
                                          memory_order_relaxed))) {
        if ((wqe->state == HCA_WQE_POSTED) && hca_tcp_stripe_blocks(qp, wqe)) {
            return HCA_EXEC_WAIT; /* after a striped WQE: its answer */
        }
        if (tq->striping) {
            if ((state == HCA_TCP_CONN_UP) && !hca_tcp_rtx_wanted(tcp, qp)) {
                return hca_tcp_stripe_send(tcp, qp, wqe); /* its parts */
            }
            hca_tcp_stripe_cancel(qp, wqe); /* all again, on one path */
        }
    }
    if (HCA_UNLIKELY(conn != tq->home) && (state == HCA_TCP_CONN_UP) &&
        (wqe->state == HCA_WQE_POSTED)) {
        conn  = hca_tcp_path_return(tcp, qp); /* failed over before */
        state = atomic_load_explicit(&conn->state, memory_order_acquire);
    }
    if (HCA_UNLIKELY(atomic_load_explicit(&conn->superseded,
                                          memory_order_relaxed) != NULL) &&
        (wqe->state == HCA_WQE_POSTED)) {
        conn  = hca_tcp_path_uncross(tcp, qp); /* the pair's one, if idle */
        state = atomic_load_explicit(&conn->state, memory_order_acquire);
    }
    if (HCA_UNLIKELY(state != HCA_TCP_CONN_UP) && (tcp->n_paths > 1) &&
        hca_tcp_failover_ok(conn, state)) {
        hca_tcp_conn_t *to = hca_tcp_failover(tcp, qp);
        if (to != NULL) {
            conn  = to;
            state = atomic_load_explicit(&conn->state, memory_order_acquire);
        }
    }

    if (HCA_UNLIKELY((wqe->state == HCA_WQE_POSTED) &&
                     hca_tcp_range_wraps(wqe))) {
        /* the status shm's MPT check gives it, and nothing is sent: the
         * connection, which other QPs share, never carries it */
        *status_p = HCA_WC_REM_ACCESS_ERR;
        return HCA_EXEC_DONE;
    }
    if (HCA_UNLIKELY(state != HCA_TCP_CONN_UP)) {
        if (state == HCA_TCP_CONN_DEAD) {
            *status_p = (hca_wc_status_t)atomic_load(&conn->fail);
            return HCA_EXEC_DONE;
        }
        if (wqe->state == HCA_WQE_POSTED) {
            res = hca_tcp_exec_unsent(qp, wqe, conn);
            if (res == HCA_EXEC_ISSUED) {
                return res;
            }
            state = atomic_load_explicit(&conn->state,
                                         memory_order_acquire);
        }
        if (state != HCA_TCP_CONN_UP) {
            return busy; /* connecting, or again (LINKING) */
        }
        res = HCA_EXEC_ISSUED;
    }

    if (HCA_UNLIKELY(wqe->length >= HCA_TCP_STRIPE_MIN) &&
        (wqe->state == HCA_WQE_POSTED) && hca_tcp_stripe_fits(tcp, wqe) &&
        (conn == tq->home) && (tq->next_psn != tq->start_psn) &&
        ((atomic_load_explicit(&tq->sent_tail, memory_order_acquire) ==
          atomic_load_explicit(&tq->sent_head, memory_order_relaxed)) ||
         ((wqe->opcode == HCA_WR_RDMA_READ) && tq->stripe_reads &&
          atomic_load_explicit(&tq->stripe_open, memory_order_relaxed)))) {
        /* only with nothing unanswered: a part on the sibling could
         * otherwise pass the frames before it on this path, which the
         * responder executes first (a READ of the same bytes); a READ
         * after striped READs only (all READs: nothing passes them).  Not the
         * QP's first WQE: its first frame (F_START) makes the responder's
         * record of the QP, which a part on the other path must find. */
        sibling = hca_tcp_stripe_sibling(tcp, qp); /* a second path UP */
    }

    pthread_mutex_lock(&conn->tx_lock);
    if (HCA_UNLIKELY(hca_tcp_rtx_wanted(tcp, qp))) {
        /* what the thread asked to be sent again goes first */
        int rc = hca_tcp_rtx(tcp, qp, conn);
        if (rc <= 0) {
            pthread_mutex_unlock(&conn->tx_lock);
            return (rc < 0) ? hca_tcp_exec_down(conn, busy, status_p) :
                              busy;
        }
    }
    if (wqe->state == HCA_WQE_POSTED) {
        wqe->done       = 0;
        wqe->resp_stamp = hca_qp_next_stamp(qp);
        if (hca_tcp_sent_push(qp, wqe) != 0) {
            pthread_mutex_unlock(&conn->tx_lock);
            return HCA_EXEC_BUSY; /* HCA_TCP_RD_ATOM atomics unanswered */
        }
        if (HCA_UNLIKELY(sibling != NULL)) {
            if (wqe->opcode == HCA_WR_RDMA_READ) {
                hca_tcp_stripe_read(qp, hca_tcp_sent_last(qp));
            } else {
                hca_tcp_stripe_begin(qp, wqe, hca_tcp_sent_last(qp),
                                     sibling);
                pthread_mutex_unlock(&conn->tx_lock);
                return hca_tcp_stripe_send(tcp, qp, wqe);
            }
        }
    } else if (HCA_UNLIKELY(hca_tcp_sent_last(qp)->striped) &&
               (wqe->opcode != HCA_WR_RDMA_READ)) {
        /* a striped WRITE cancelled: every part of it went with the
         * retransmission above */
        pthread_mutex_unlock(&conn->tx_lock);
        return HCA_EXEC_ISSUED;
    }
    e = hca_tcp_sent_last(qp);
    for (;;) {
        struct iovec iov[HCA_MAX_SGE];
        hca_tcp_hdr_t hdr;
        int iovcnt, rc, last;
        uint32_t k;

        rc = hca_tcp_tx_flush(tcp, conn);
        if (rc <= 0) {
            if ((rc < 0) &&
                (atomic_load(&conn->state) == HCA_TCP_CONN_DEAD)) {
                *status_p = (hca_wc_status_t)atomic_load(&conn->fail);
                res       = HCA_EXEC_DONE;
                break;
            }
            if (rc == 0) {
                /* someone's frame is still going out: the thread ends
                 * it */
                hca_tcp_want_out(tcp, conn);
                HCA_TCP_COUNT(tcp, HCA_TCP_CNT_RETRIES, 1);
            }
            /* recorded, so not to be recorded again: the rest of its
             * frames go when the socket takes them (or the connection
             * is back: LINKING) */
            wqe->state = HCA_WQE_PARTIAL;
            res        = HCA_EXEC_PARTIAL;
            break;
        }
        k = hca_tcp_qp(qp)->next_psn - e->psn;
        hca_tcp_frame_build(qp, wqe, e, k, &hdr, iov, &iovcnt);
        hca_tcp_tx_start(conn, &hdr, iov, iovcnt, qp->qpn);
        tq->next_psn++;
        tq->rtx_psn  = tq->next_psn;
        tq->wire_psn = tq->next_psn;
        wqe->done   += hdr.length;
        last         = (k + 1 == e->npsn);
        if (!last) {
            wqe->state = HCA_WQE_PARTIAL; /* the engine's, but the frame
                                             is on the wire */
            continue;
        }
        rc = hca_tcp_tx_flush(tcp, conn);
        if (rc < 0) {
            /* every frame has its PSN: a lost one goes again when the
             * connection is back, or the QP fails with it */
            if (atomic_load(&conn->state) == HCA_TCP_CONN_DEAD) {
                *status_p = (hca_wc_status_t)atomic_load(&conn->fail);
                res       = HCA_EXEC_DONE;
            }
        } else if (rc == 0) {
            hca_tcp_want_out(tcp, conn);
        }
        break;
    }
    pthread_mutex_unlock(&conn->tx_lock);
    return res;
}

hca_exec_t hca_tcp_poll_response(hca_qp_t *qp, hca_wqe_t *wqe,
                                 hca_wc_status_t *status_p)
{
    hca_tcp_qp_t *tq     = hca_tcp_qp(qp);
    hca_tcp_conn_t *conn = tq->conn;
    hca_exec_t res       = hca_resp_slot_poll(qp, wqe, status_p);

    if ((res == HCA_EXEC_ISSUED) && (conn != NULL)) {
        int state = atomic_load_explicit(&conn->state, memory_order_acquire);
        hca_tcp_dev_t *tcp = hca_tcp_dev(qp->dev);

        if (HCA_UNLIKELY(atomic_load_explicit(&tq->move,
                                              memory_order_relaxed) ||
                         ((state == HCA_TCP_CONN_DEAD) && !conn->was_up &&
                          (tcp->n_paths > 1)))) {
            /* its path was lost: on to another, if one is UP */
            atomic_store(&tq->move, 0);
            if (hca_tcp_failover(tcp, qp) != NULL) {
                conn  = tq->conn;
                state = atomic_load_explicit(&conn->state,
                                             memory_order_acquire);
            }
        }

        if (HCA_UNLIKELY(atomic_load_explicit(&tq->stripe_open,
                                              memory_order_relaxed)) &&
            !tq->striping &&
            (atomic_load(&tq->stripe_conn->state) == HCA_TCP_CONN_DEAD)) {
            /* the sibling its striped WRITE took died for good (a lost
             * socket is the thread's: hca_tcp_failover_ask): the WRITE
             * goes again on the QP's path, in order with what follows */
            uint64_t tail = atomic_load_explicit(&tq->sent_tail,
                                                 memory_order_acquire);
            atomic_store(&tq->stripe_open, 0);
            if ((tail != atomic_load_explicit(&tq->sent_head,
                                              memory_order_relaxed)) &&
                (tq->rtx_psn == tq->next_psn)) {
                tq->rtx_psn = tq->sent[tail & tq->sent_mask].psn;
            }
        }
        if (HCA_UNLIKELY(state == HCA_TCP_CONN_DEAD)) {
            /* its answer will never come */
            *status_p = (hca_wc_status_t)atomic_load(&conn->fail);
            return HCA_EXEC_DONE;
        }
        if (HCA_UNLIKELY((state == HCA_TCP_CONN_UP) &&
                         hca_tcp_rtx_wanted(tcp, qp))) {
            pthread_mutex_lock(&conn->tx_lock);
            (void)hca_tcp_rtx(tcp, qp, conn);
            pthread_mutex_unlock(&conn->tx_lock);
        }
    }
    return res;
}

int hca_tcp_response_ready(const hca_qp_t *qp, const hca_wqe_t *wqe)
{
    const hca_tcp_qp_t *tq = (const hca_tcp_qp_t*)(const void*)qp->fabric_priv;

    /* a retransmission asked for, or one not finished, is the owner's to
     * do: not asleep (frames recorded while the connection is not UP wait
     * for it: its coming up or its resumption asks, and so does its
     * death, hca_tcp_rewind_conn) */
    return hca_resp_slot_ready(qp, wqe) ||
           atomic_load_explicit(&tq->rewind, memory_order_relaxed) ||
           atomic_load_explicit(&tq->move, memory_order_relaxed) ||
           ((tq->rtx_psn != tq->next_psn) && (tq->conn != NULL) &&
            (atomic_load_explicit(&tq->conn->state, memory_order_relaxed) ==
             HCA_TCP_CONN_UP));
}
