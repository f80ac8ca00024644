/*
 * hca_tcp_tx.c - the tcp fabric's sending: a frame (header and payload
 * iovecs) written under the connection's tx_lock in as many sendmsg calls
 * as the socket takes, with the answers queued before it in the same
 * call; the answers the fabric's thread owes a peer (ACKs, READ
 * responses) as jobs, pumped when the socket has room.
 */
#include "hca_tcp_fabric.h"
#include "hca_log.h"
#include "hca_mpt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---------------------------------------------------------------- tx */

/* A queued job that is one header and nothing else (it may go out with
 * others in one sendmsg); a READ's answer is sent part by part. */
static inline int hca_tcp_job_is_answer(const hca_tcp_job_t *job)
{
    return job->hdr.opcode != HCA_TCP_OP_READ_RESP;
}

void hca_tcp_tx_start(hca_tcp_conn_t *conn, const hca_tcp_hdr_t *hdr,
                      const struct iovec *iov, int iovcnt,
                      uint32_t owner_qpn)
{
    hca_tcp_tx_t *tx = &conn->tx;
    int n            = 0;

    tx->iovcnt = 0;
    tx->left   = 0;
    /* the answers at the head of the queue go first (in queue order) */
    while ((n < HCA_TCP_TX_ANSWERS) && (conn->jobs_tail != conn->jobs_head) &&
           hca_tcp_job_is_answer(&conn->jobs[conn->jobs_tail %
                                             HCA_TCP_JOBS])) {
        tx->answers[n] = conn->jobs[conn->jobs_tail++ % HCA_TCP_JOBS].hdr;
        tx->iov[tx->iovcnt].iov_base = &tx->answers[n];
        tx->iov[tx->iovcnt].iov_len  = sizeof(tx->answers[n]);
        tx->iovcnt++;
        tx->left += sizeof(tx->answers[n]);
        ++n;
    }
    tx->frames = n;
    if (hdr != NULL) {
        /* injected duplication: the frame twice, as a network that
         * repeats a packet (TCP never does: a resent frame does) */
        int copies = (HCA_UNLIKELY(conn->tcp->dev->fault.enabled) &&
                      hca_fault(conn->tcp->dev, HCA_FAULT_TCP_DUP)) ? 2 : 1;
        tx->hdr = *hdr;
        for (int c = 0; c < copies; ++c) {
            tx->iov[tx->iovcnt].iov_base = &tx->hdr;
            tx->iov[tx->iovcnt].iov_len  = sizeof(tx->hdr);
            tx->iovcnt++;
            tx->left += sizeof(tx->hdr);
            tx->frames++;
            for (int i = 0; i < iovcnt; ++i) {
                if (iov[i].iov_len == 0) {
                    continue;
                }
                tx->iov[tx->iovcnt++] = iov[i];
                tx->left             += iov[i].iov_len;
            }
        }
        if (copies > 1) {
            HCA_TCP_COUNT(conn->tcp, HCA_TCP_CNT_FAULTS, 1);
        }
        /* injected reset: the connection is cut in the middle of it */
        tx->cut = HCA_UNLIKELY(conn->tcp->dev->fault.enabled) &&
                  hca_fault(conn->tcp->dev, HCA_FAULT_TCP_RESET);
        /* injected delay: it waits, as on a congested link (the frames
         * behind it wait too) */
        if (HCA_UNLIKELY(conn->tcp->dev->fault.enabled) &&
            hca_fault(conn->tcp->dev, HCA_FAULT_TCP_DELAY)) {
            uint32_t us = conn->tcp->dev->fault.tcp_delay_us;
            tx->hold_ns = hca_now_ns() + 1000ull * (us ? us : 2000);
            HCA_TCP_COUNT(conn->tcp, HCA_TCP_CNT_FAULTS, 1);
        }
    }
    tx->first     = 0;
    tx->owner_qpn = owner_qpn;
    tx->pinned    = NULL;
}

/* The injected reset of the frame in tx: half of it goes out, then the
 * socket is dropped (a reset in the middle of a header or payload). */
static void hca_tcp_tx_cut(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    hca_tcp_tx_t *tx = &conn->tx;
    struct iovec iov[HCA_TCP_TX_ANSWERS + 2 * (1 + HCA_MAX_SGE)];
    size_t want      = tx->left / 2;
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 0};

    for (int i = tx->first; (i < tx->iovcnt) && (want > 0); ++i) {
        iov[msg.msg_iovlen]         = tx->iov[i];
        if (iov[msg.msg_iovlen].iov_len > want) {
            iov[msg.msg_iovlen].iov_len = want;
        }
        want -= iov[msg.msg_iovlen].iov_len;
        msg.msg_iovlen++;
    }
    (void)sendmsg(conn->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    tx->cut = 0;
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_FAULTS, 1);
    hca_tcp_conn_drop(tcp, conn);
}

int hca_tcp_tx_flush(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    hca_tcp_tx_t *tx = &conn->tx;

    if (HCA_UNLIKELY((conn->fd < 0) ||
                     (atomic_load(&conn->state) != HCA_TCP_CONN_UP))) {
        return -1; /* closed, or its socket lost: nothing more goes out on
                      it (the frames that did not go are sent again on
                      the next socket) */
    }
    if (HCA_UNLIKELY(tx->cut) && (tx->left > 0)) {
        hca_tcp_tx_cut(tcp, conn);
        return -1;
    }
    if (HCA_UNLIKELY(tx->hold_ns != 0)) {
        if ((tx->left > 0) && (hca_now_ns() < tx->hold_ns)) {
            atomic_store(&tcp->parked, 1); /* the thread looks every 1 ms */
            return 0; /* as a full socket: the thread sends it later */
        }
        tx->hold_ns = 0;
    }

    while (tx->left > 0) {
        struct msghdr msg = {.msg_iov    = &tx->iov[tx->first],
                             .msg_iovlen = (size_t)(tx->iovcnt - tx->first)};
        ssize_t n = sendmsg(conn->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n < 0) {
            if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
                if (conn->tx_stuck_ns == 0) {
                    /* the peer must take this frame within the peer
                     * timeout (hca_tcp_timers) */
                    conn->tx_stuck_ns = hca_now_ns();
                }
                return 0;
            }
            if (errno == EINTR) {
                continue;
            }
            hca_tcp_conn_drop(tcp, conn);
            return -1;
        }
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_BYTES_TX, n);
        if (tcp->n_paths > 1) {
            HCA_TCP_COUNT(tcp, HCA_TCP_CNT_PATH(conn->path,
                                                HCA_TCP_PATH_BYTES_TX), n);
        }
        tx->left -= (size_t)n;
        while ((n > 0) && (tx->first < tx->iovcnt)) {
            struct iovec *v = &tx->iov[tx->first];
            if ((size_t)n < v->iov_len) {
                v->iov_base = (uint8_t*)v->iov_base + n;
                v->iov_len -= (size_t)n;
                n = 0;
            } else {
                n -= (ssize_t)v->iov_len;
                tx->first++;
            }
        }
    }
    if (tx->pinned != NULL) {
        hca_mpt_release(tx->pinned);
        tx->pinned = NULL;
    }
    tx->owner_qpn     = 0;
    conn->tx_stuck_ns = 0;
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_FRAMES_TX, tx->frames);
    if (tcp->n_paths > 1) {
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_PATH(conn->path,
                                            HCA_TCP_PATH_FRAMES_TX),
                      tx->frames);
    }
    tx->frames = 0;
    atomic_store_explicit(&conn->last_tx_ns, hca_coarse_ns(),
                          memory_order_relaxed);
    return 1;
}

void hca_tcp_tx_orphan(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                       uint32_t qpn)
{
    hca_tcp_tx_t *tx = &conn->tx;
    size_t copied    = 0;

    if ((tx->left == 0) || (tx->owner_qpn != qpn)) {
        return;
    }
    /* The rest of the frame cannot be taken back (its header is out, the
     * stream must go on), and the QP's buffers may be freed once its
     * WQEs complete: its payload goes out from a copy, taken now.  Not
     * zeros: the frame may be a SEND's last part or a WRITE, which the
     * responder would deliver or place as if they were the data. */
    if (tx->bounce == NULL) {
        tx->bounce = malloc(HCA_TCP_SEG_MAX);
        if (tx->bounce == NULL) {
            /* no copy: the frame must not go on, and neither can the
             * stream without it */
            hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
            tx->owner_qpn = 0;
            return;
        }
    }
    /* the headers are ours; payload iovecs point into the QP's buffers */
    for (int i = tx->first; i < tx->iovcnt; ++i) {
        const uint8_t *p = tx->iov[i].iov_base;
        if (((p >= (const uint8_t*)&tx->hdr) &&
             (p < (const uint8_t*)(&tx->hdr + 1))) ||
            ((p >= (const uint8_t*)tx->answers) &&
             (p < (const uint8_t*)(tx->answers + HCA_TCP_TX_ANSWERS)))) {
            continue;
        }
        if (HCA_UNLIKELY(copied + tx->iov[i].iov_len > HCA_TCP_SEG_MAX)) {
            /* cannot be: a frame's payload is at most one segment */
            hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
            break;
        }
        memcpy(tx->bounce + copied, p, tx->iov[i].iov_len);
        tx->iov[i].iov_base = tx->bounce + copied;
        copied             += tx->iov[i].iov_len;
    }
    tx->owner_qpn = 0;
}

/* Asks the thread to finish the frame (or the answers) when the socket
 * takes more: an epoll change only when it is full. */
void hca_tcp_want_out(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    if (!conn->want_out) {
        conn->want_out = 1;
        hca_tcp_events(tcp, conn, EPOLL_CTL_MOD);
    }
}

/* ---------------------------------------------------------------- jobs */

int hca_tcp_job_push(hca_tcp_conn_t *conn, const hca_tcp_job_t *job)
{
    if (conn->jobs_head - conn->jobs_tail >= HCA_TCP_JOBS) {
        return -EAGAIN;
    }
    conn->jobs[conn->jobs_head++ % HCA_TCP_JOBS] = *job;
    return 0;
}

void hca_tcp_jobs_pump(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    while (conn->jobs_tail != conn->jobs_head) {
        hca_tcp_job_t *job = &conn->jobs[conn->jobs_tail % HCA_TCP_JOBS];
        struct iovec iov;
        int rc;

        rc = hca_tcp_tx_flush(tcp, conn);
        if (rc <= 0) {
            if (rc == 0) {
                hca_tcp_want_out(tcp, conn);
            }
            return;
        }
        if (hca_tcp_job_is_answer(job)) {
            /* it and the answers behind it, in one sendmsg */
            hca_tcp_tx_start(conn, NULL, NULL, 0, 0);
            continue;
        }
        if (HCA_UNLIKELY(job->stale)) {
            /* superseded by an answer from an earlier offset (hca_tcp_rx_read):
             * none of its parts is in the socket's way now, so its pin goes */
            if (job->entry != NULL) {
                hca_mpt_release(job->entry);
            }
            conn->jobs_tail++;
            continue;
        }
        /* the next part of a READ, straight from the region (up to the
         * job's end: a striped answer's share, or the READ's) */
        job->hdr.length = job->end - job->hdr.offset;
        if (job->hdr.length > HCA_TCP_SEG_MAX) {
            job->hdr.length = HCA_TCP_SEG_MAX;
        }
        job->hdr.flags = ((job->hdr.offset + job->hdr.length ==
                           job->hdr.total) ? HCA_TCP_F_LAST : 0) |
                         (job->striped ? HCA_TCP_F_STRIPED : 0);
        iov.iov_base = (void*)(uintptr_t)(job->addr + job->hdr.offset);
        iov.iov_len  = job->hdr.length;
        hca_tcp_tx_start(conn, &job->hdr, &iov, 1, 0);
        job->hdr.offset += job->hdr.length;
        if (job->hdr.offset == job->end) {
            conn->tx.pinned = job->entry; /* released once it is out */
            conn->jobs_tail++;
        }
    }
    if (hca_tcp_tx_flush(tcp, conn) == 0) {
        hca_tcp_want_out(tcp, conn);
    }
}

/* Sends the answers queued (tx_lock not held).  Not the rest of a READ:
 * it waits for room in the socket (EPOLLOUT, or a poll), and trying
 * again before would only cost a sendmsg that says EAGAIN. */
void hca_tcp_answers_out(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    if ((conn->jobs_tail != conn->jobs_head) &&
        (conn->jobs[conn->jobs_tail % HCA_TCP_JOBS].hdr.opcode !=
         HCA_TCP_OP_READ_RESP)) {
        pthread_mutex_lock(&conn->tx_lock);
        hca_tcp_jobs_pump(tcp, conn);
        pthread_mutex_unlock(&conn->tx_lock);
    }
}
