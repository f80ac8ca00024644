/*
 * hca_tcp_exec.c - the tcp fabric's requester side: a WQE becomes frames
 * on its QP's connection, sent by the QP's owner under tx_lock, straight
 * from the WQE's buffers (sendmsg with an iovec: no copy).  SENDs go in
 * fragments of one receive-ring slot, WRITEs in HCA_TCP_SEG_MAX parts, so
 * that other QPs' frames pass between them.  Every WQE ends with the
 * responder's answer in its response slot (hca_tcp_rx.c): completion
 * means the responder executed it.
 */
#include "hca_tcp_fabric.h"
#include "hca_queue.h"

#include <time.h>
#include <string.h>

/* The next frame of the WQE, whose first `wqe->done` bytes are out: its
 * header and payload.  Returns the payload bytes; *last_p: 1 if it is the
 * WQE's last frame (a READ or an atomic is one frame). */
static uint32_t hca_tcp_frame_of(hca_qp_t *qp, hca_wqe_t *wqe,
                                 hca_tcp_hdr_t *hdr, struct iovec *iov,
                                 int *iovcnt, int *last_p)
{
    uint64_t left = wqe->length - wqe->done;
    uint32_t n    = 0;

    memset(hdr, 0, sizeof(*hdr));
    hdr->version    = HCA_TCP_VERSION;
    hdr->src_qpn    = qp->qpn;
    hdr->dst_qpn    = qp->dest_qpn;
    hdr->psn        = hca_tcp_qp(qp)->psn++;
    hdr->resp_idx   = (uint32_t)(wqe - qp->sq);
    hdr->resp_stamp = wqe->resp_stamp;
    hdr->rkey       = wqe->rkey;
    hdr->imm        = wqe->imm;
    hdr->offset     = (uint32_t)wqe->done;
    hdr->total      = (uint32_t)wqe->length;

    switch ((hca_wr_opcode_t)wqe->opcode) {
    case HCA_WR_SEND:
    case HCA_WR_SEND_WITH_IMM:
        n = (uint32_t)((left < HCA_TCP_SEND_MAX) ? left : HCA_TCP_SEND_MAX);
        hdr->opcode = HCA_TCP_OP_SEND;
        hdr->flags  = ((wqe->done == 0) ? HCA_TCP_F_FIRST : 0) |
                      ((n == left) ? HCA_TCP_F_LAST : 0) |
                      ((wqe->opcode == HCA_WR_SEND_WITH_IMM) ?
                       HCA_TCP_F_IMM : 0);
        hdr->rkey   = 0;
        break;
    case HCA_WR_RDMA_WRITE:
    case HCA_WR_RDMA_WRITE_WITH_IMM:
        n = (uint32_t)((left < HCA_TCP_SEG_MAX) ? left : HCA_TCP_SEG_MAX);
        hdr->opcode      = HCA_TCP_OP_WRITE;
        hdr->remote_addr = wqe->remote_addr + wqe->done;
        hdr->flags       = (n == left) ? HCA_TCP_F_LAST : 0;
        if ((n == left) && (wqe->opcode == HCA_WR_RDMA_WRITE_WITH_IMM)) {
            hdr->flags |= HCA_TCP_F_IMM;
        }
        break;
    case HCA_WR_RDMA_READ:
        hdr->opcode      = HCA_TCP_OP_READ;
        hdr->remote_addr = wqe->remote_addr;
        hdr->offset      = 0;
        break;
    default: /* atomics: hca_post checked the opcode */
        hdr->opcode      = HCA_TCP_OP_ATOMIC;
        hdr->atomic_op   = wqe->opcode;
        hdr->flags       = (wqe->flags & HCA_SEND_ATOMIC32) ?
                           HCA_TCP_F_ATOMIC32 : 0;
        hdr->remote_addr = wqe->remote_addr;
        hdr->operand     = wqe->compare_add;
        hdr->swap        = wqe->swap;
        hdr->offset      = 0;
        hdr->total       = 0;
        break;
    }
    hdr->length = n;
    *iovcnt     = (n > 0) ? hca_tcp_sge_iov(wqe, wqe->done, n, iov) : 0;
    *last_p     = (hdr->opcode == HCA_TCP_OP_READ) ||
                  (hdr->opcode == HCA_TCP_OP_ATOMIC) || (n == left);
    return n;
}

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

/* The first WQE of a connection being made waits for its handshake (the
 * connection began at RTR, so this is at most one round trip more), as a
 * verbs post executes what it can at once: a requester that posts and
 * then only waits on another CQ must still see its WR go.  Bounded by the
 * thread's connect limit (HCA_TCP_CONNECT_MS), which kills it. */
static int hca_tcp_conn_wait(hca_tcp_conn_t *conn)
{
    int state;

    while (((state = atomic_load_explicit(&conn->state,
                                          memory_order_acquire)) ==
            HCA_TCP_CONN_CONNECTING) || (state == HCA_TCP_CONN_HELLO)) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 20000};
        nanosleep(&ts, NULL);
    }
    return state;
}

hca_exec_t hca_tcp_exec(hca_qp_t *qp, hca_wqe_t *wqe,
                        hca_wc_status_t *status_p)
{
    hca_tcp_dev_t *tcp   = hca_tcp_dev(qp->dev);
    hca_tcp_conn_t *conn = hca_tcp_qp(qp)->conn;
    int state            = atomic_load_explicit(&conn->state,
                                                memory_order_acquire);
    hca_exec_t res       = HCA_EXEC_ISSUED;

    if (HCA_UNLIKELY((wqe->state == HCA_WQE_POSTED) &&
                     hca_tcp_range_wraps(wqe))) {
        /* the status shm's MPT check gives it, and nothing is sent: the
         * connection, which other QPs share, never carries it */
        *status_p = HCA_WC_REM_ACCESS_ERR;
        return HCA_EXEC_DONE;
    }
    if (HCA_UNLIKELY(state != HCA_TCP_CONN_UP)) {
        state = hca_tcp_conn_wait(conn);
    }
    if (HCA_UNLIKELY(state == HCA_TCP_CONN_DEAD)) {
        *status_p = (hca_wc_status_t)atomic_load(&conn->fail);
        return HCA_EXEC_DONE;
    }
    if (HCA_UNLIKELY(state != HCA_TCP_CONN_UP)) {
        return HCA_EXEC_BUSY; /* still connecting: nothing sent yet */
    }

    pthread_mutex_lock(&conn->tx_lock);
    if (wqe->state == HCA_WQE_POSTED) {
        wqe->done       = 0;
        wqe->resp_stamp = hca_qp_next_stamp(qp);
    }
    for (;;) {
        struct iovec iov[HCA_MAX_SGE];
        hca_tcp_hdr_t hdr;
        int iovcnt, rc, last;
        uint32_t n;

        rc = hca_tcp_tx_flush(tcp, conn);
        if (rc < 0) {
            *status_p = (hca_wc_status_t)atomic_load(&conn->fail);
            res       = HCA_EXEC_DONE;
            break;
        }
        if (rc == 0) {
            /* someone's frame is still going out: the thread ends it */
            hca_tcp_want_out(tcp, conn);
            HCA_TCP_COUNT(tcp, HCA_TCP_CNT_RETRIES, 1);
            res = (wqe->state == HCA_WQE_PARTIAL) ? HCA_EXEC_PARTIAL :
                                                    HCA_EXEC_BUSY;
            break;
        }
        n = hca_tcp_frame_of(qp, wqe, &hdr, iov, &iovcnt, &last);
        hca_tcp_tx_start(conn, &hdr, iov, iovcnt, qp->qpn);
        wqe->done += n;
        if (!last) {
            wqe->state = HCA_WQE_PARTIAL; /* the engine's, but the frame
                                             is on the wire */
            continue;
        }
        rc = hca_tcp_tx_flush(tcp, conn);
        if (rc < 0) {
            *status_p = (hca_wc_status_t)atomic_load(&conn->fail);
            res       = HCA_EXEC_DONE;
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
    hca_tcp_conn_t *conn = hca_tcp_qp(qp)->conn;
    hca_exec_t res       = hca_resp_slot_poll(qp, wqe, status_p);

    if ((res == HCA_EXEC_ISSUED) && (conn != NULL) &&
        HCA_UNLIKELY(atomic_load_explicit(&conn->state,
                                          memory_order_relaxed) ==
                     HCA_TCP_CONN_DEAD)) {
        *status_p = (hca_wc_status_t)atomic_load(&conn->fail); /* its answer will never come */
        return HCA_EXEC_DONE;
    }
    return res;
}

int hca_tcp_response_ready(const hca_qp_t *qp, const hca_wqe_t *wqe)
{
    return hca_resp_slot_ready(qp, wqe);
}
