/*
 * hca_tcp_rx.c - the tcp fabric's receiving: the byte stream of a
 * connection, read by the fabric's thread or a polling user thread under
 * rx_lock, cut into handshake messages (to hca_tcp_conn.c) and frames
 * (headers checked by hca_tcp_frame.c, handled by hca_tcp_resp.c), with
 * payloads read straight into their memory; one step per receiver state
 * (hca_tcp_state.c).
 */
#include "hca_tcp_fabric.h"
#include "hca_log.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* The payload's next n bytes arrived: from src (the read buffer) into the
 * iovecs, or (src NULL) already there by readv; the iovecs advance. */
static void hca_tcp_iov_take(hca_tcp_rx_t *rx, const uint8_t *src, size_t n)
{
    rx->left -= n;
    while ((n > 0) && (rx->iovcnt > 0)) {
        size_t take = (n < rx->iov[0].iov_len) ? n : rx->iov[0].iov_len;
        if (src != NULL) {
            memcpy(rx->iov[0].iov_base, src, take);
            src += take;
        }
        n -= take;
        if (take < rx->iov[0].iov_len) {
            rx->iov[0].iov_base = (uint8_t*)rx->iov[0].iov_base + take;
            rx->iov[0].iov_len -= take;
        } else {
            memmove(&rx->iov[0], &rx->iov[1],
                    (size_t)(rx->iovcnt - 1) * sizeof(rx->iov[0]));
            rx->iovcnt--;
        }
    }
}

/* The header (or hello) being read is complete: 0 go on, -1 the
 * connection died. */
static int hca_tcp_rx_header(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    hca_tcp_rx_t *rx = &conn->rx;

    if (rx->state == HCA_TCP_RX_HELLO) {
        pthread_mutex_lock(&tcp->lock);
        hca_tcp_hello_in(tcp, conn);
        pthread_mutex_unlock(&tcp->lock);
        return 0;
    }
    rx->got  = 0;
    rx->bulk = (rx->in.hdr.length > HCA_TCP_RXBUF / 2); /* see rx.bulk */
    conn->rx_frames++; /* its payload's time is bounded (hca_tcp_timers) */
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_FRAMES_RX, 1);
    if (hca_tcp_hdr_check(&rx->in.hdr) != HCA_TCP_HDR_OK) {
        hca_log("tcp fabric: pid %u ctx %u sent a bad frame (%s): "
                "connection closed", conn->peer.pid, conn->peer.ctx_id,
                hca_tcp_hdr_err_name[hca_tcp_hdr_check(&rx->in.hdr)]);
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_BAD_FRAMES, 1);
        hca_tcp_conn_kill(tcp, conn, HCA_WC_REM_OP_ERR);
        return -1;
    }
    if (HCA_UNLIKELY(tcp->dev->fault.enabled) &&
        (rx->in.hdr.opcode != HCA_TCP_OP_KEEPALIVE) &&
        hca_fault(tcp->dev, HCA_FAULT_TCP_LOSS)) {
        /* injected loss: as if it was never sent */
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_FAULTS, 1);
        rx->pinned = NULL;
        rx->iovcnt = 0;
        if (rx->in.hdr.length > 0) {
            hca_tcp_rx_to(conn, HCA_TCP_RX_DISCARD);
            rx->left = rx->in.hdr.length;
            rx->want = sizeof(hca_tcp_hdr_t);
        } else {
            rx->want = sizeof(hca_tcp_hdr_t);
        }
        return 0;
    }
    pthread_mutex_lock(&tcp->lock);
    hca_tcp_rx_frame(tcp, conn);
    pthread_mutex_unlock(&tcp->lock);
    return 0;
}

/* The payload being read is complete (or discarded). */
static void hca_tcp_rx_end(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    pthread_mutex_lock(&tcp->lock);
    hca_tcp_rx_done(tcp, conn);
    pthread_mutex_unlock(&tcp->lock);
}

/* Reads what the socket has, frame by frame: headers and small payloads
 * come in bulk into the read buffer (one recv for many frames), a payload
 * the buffer does not hold goes straight to its memory (a readv that also
 * takes what follows it into the buffer).  A recv that returned less than
 * it asked for emptied the socket: no second one only to hear EAGAIN (the
 * thread's epoll is level-triggered, a poll reads again).  0: wait for
 * more data (or room), -1: the connection died. */
static int hca_tcp_read_frames(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                               int hold)
{
    hca_tcp_rx_t *rx = &conn->rx;
    int drained      = 0;
    size_t budget    = HCA_TCP_READ_BUDGET;

    for (;;) {
        size_t avail = rx->buf_tail - rx->buf_head, take, asked;
        const uint8_t *from = rx->buf + rx->buf_head;
        struct iovec iov[HCA_MAX_SGE + 1];
        int iovcnt = 0;
        ssize_t n;

        int state = atomic_load(&conn->state);
        if ((state == HCA_TCP_CONN_DEAD) || (state == HCA_TCP_CONN_LINKING)) {
            return -1;
        }
        /* first what the buffer holds */
        switch (rx->state) {
        case HCA_TCP_RX_HELLO:
        case HCA_TCP_RX_HDR:
            if ((rx->state == HCA_TCP_RX_HDR) &&
                (conn->jobs_head - conn->jobs_tail >= HCA_TCP_JOBS - 1)) {
                /* no room for the answer: read on when answers left */
                pthread_mutex_lock(&conn->tx_lock);
                conn->reading  = 0;
                conn->want_out = 1;
                hca_tcp_events(tcp, conn, EPOLL_CTL_MOD);
                pthread_mutex_unlock(&conn->tx_lock);
                return 0;
            }
            if (avail == 0) {
                break;
            }
            take = rx->want - rx->got;
            take = (avail < take) ? avail : take;
            memcpy(rx->in.bytes + rx->got, from, take);
            rx->buf_head += (uint32_t)take;
            rx->got      += take;
            if ((rx->got == rx->want) && (hca_tcp_rx_header(tcp, conn) < 0)) {
                return -1;
            }
            continue;
        case HCA_TCP_RX_PAYLOAD:
            if (avail == 0) {
                break;
            }
            take = (avail < rx->left) ? avail : rx->left;
            if (rx->pinned == NULL) {
                /* into a QP's buffers or our stage: under the lock that
                 * quiesce and destroy take */
                pthread_mutex_lock(&tcp->lock);
                if (!hca_tcp_rx_target_ok(tcp, conn)) {
                    pthread_mutex_unlock(&tcp->lock);
                    hca_tcp_rx_to(conn, HCA_TCP_RX_DISCARD);
                    continue;
                }
                hca_tcp_iov_take(rx, from, take);
                pthread_mutex_unlock(&tcp->lock);
            } else {
                hca_tcp_iov_take(rx, from, take);
            }
            rx->buf_head += (uint32_t)take;
            if (rx->left == 0) {
                hca_tcp_rx_end(tcp, conn);
            }
            continue;
        case HCA_TCP_RX_DISCARD:
            if (avail == 0) {
                break;
            }
            take = (avail < rx->left) ? avail : rx->left;
            rx->buf_head += (uint32_t)take;
            rx->left     -= take;
            if (rx->left == 0) {
                hca_tcp_rx_end(tcp, conn);
            }
            continue;
        case HCA_TCP_RX_PARKED:
        default:
            /* no reading until its ring has room (hca_tcp_timers): what
             * the buffer holds waits there */
            pthread_mutex_lock(&conn->tx_lock);
            conn->reading = 0;
            hca_tcp_events(tcp, conn, EPOLL_CTL_MOD);
            pthread_mutex_unlock(&conn->tx_lock);
            atomic_store(&tcp->parked, 1);
            return 0;
        }

        /* the buffer is used up: the answers it made go first, in one
         * sendmsg (a stream of frames must not hold them; a poll holds
         * the SENDs' only, see hca_tcp_poll_read), then the socket */
        if ((conn->jobs_tail != conn->jobs_head) &&
            (!hold || conn->answer_now)) {
            conn->answer_now = 0;
            hca_tcp_answers_out(tcp, conn);
        }
        if (drained || (budget == 0)) {
            return 0; /* level-triggered: the rest at the next turn */
        }
        rx->buf_head = rx->buf_tail = 0;
        if (rx->state == HCA_TCP_RX_PAYLOAD) {
            /* straight to its memory, then what follows into the buffer
             * (behind a region's or a READ's payload only the next
             * header: the next payload goes to its memory too) */
            memcpy(iov, rx->iov, (size_t)rx->iovcnt * sizeof(iov[0]));
            iovcnt              = rx->iovcnt;
            iov[iovcnt].iov_base = rx->buf;
            iov[iovcnt].iov_len  = (rx->kind == HCA_TCP_RXK_STAGE) ?
                                   HCA_TCP_RXBUF : HCA_TCP_RX_TRAIL;
            asked = rx->left + iov[iovcnt].iov_len;
            iovcnt++;
            if (rx->pinned == NULL) {
                pthread_mutex_lock(&tcp->lock);
                if (!hca_tcp_rx_target_ok(tcp, conn)) {
                    pthread_mutex_unlock(&tcp->lock);
                    hca_tcp_rx_to(conn, HCA_TCP_RX_DISCARD);
                    continue;
                }
                n = readv(conn->fd, iov, iovcnt);
                pthread_mutex_unlock(&tcp->lock);
            } else {
                n = readv(conn->fd, iov, iovcnt);
            }
        } else {
            /* a payload being dropped is read a whole buffer at a time
             * (bulk would take it 72 bytes a recv) */
            asked = (rx->bulk && (rx->state != HCA_TCP_RX_DISCARD)) ?
                    HCA_TCP_RX_TRAIL : HCA_TCP_RXBUF;
            n     = recv(conn->fd, rx->buf, asked, MSG_DONTWAIT);
        }

        if (n == 0) {
            hca_tcp_conn_drop(tcp, conn); /* closed */
            return -1;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
                return 0;
            }
            hca_tcp_conn_drop(tcp, conn); /* reset */
            return -1;
        }
        /* the coarse clock: a precise read per recv was 5 % of a
         * polling am_lat client (a clock read in vDSO here) */
        atomic_store_explicit(&conn->last_rx_ns, hca_coarse_ns(),
                              memory_order_relaxed);
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_BYTES_RX, n);
        /* a short read of headers: the socket had no more.  A payload
         * read on (until EAGAIN): the sender streams it, more has likely
         * come meanwhile */
        drained = ((size_t)n < asked) && (rx->state != HCA_TCP_RX_PAYLOAD);
        budget  = ((size_t)n < budget) ? budget - (size_t)n : 0;
        if (rx->state == HCA_TCP_RX_PAYLOAD) {
            size_t direct = ((size_t)n < rx->left) ? (size_t)n : rx->left;
            hca_tcp_iov_take(rx, NULL, direct);
            rx->buf_tail = (uint32_t)((size_t)n - direct);
            if (rx->left == 0) {
                hca_tcp_rx_end(tcp, conn);
            }
        } else {
            rx->buf_tail = (uint32_t)n;
        }
    }
}

/* Reads the frames the socket has, then sends the answers they made, all
 * in one sendmsg (or with a frame of ours that went first). */
int hca_tcp_read(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    int rc = hca_tcp_read_frames(tcp, conn, 0);

    if ((rc == 0) && (conn->rx.buf_tail != conn->rx.buf_head)) {
        atomic_store(&tcp->rx_buffered, 1);
    }
    conn->answer_now   = 0;
    conn->answer_polls = 0;
    hca_tcp_answers_out(tcp, conn);
    return rc;
}

/* How many more polls the answers of SENDs wait for a frame of ours to
 * carry them: a process replies to a message after the poll that gave it
 * (UCT delivers it in the progress that read it, and the reply may come
 * one progress later, from UCP), so two; then they go alone.  A process
 * that stops polling has them sent by the thread within its watch, as its
 * reading is taken over within two (HCA_TCP_WATCH_MS, hca_tcp_thread.c). */
#define HCA_TCP_ANSWER_POLLS 2

/* A user poll's read of conn (rx_lock held). */
void hca_tcp_poll_read(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    int had = (conn->jobs_tail != conn->jobs_head);

    if (conn->reading) {
        (void)hca_tcp_read_frames(tcp, conn, tcp->user_polls);
    }
    if (conn->rx.buf_tail != conn->rx.buf_head) {
        atomic_store(&tcp->rx_buffered, 1); /* the next poll reads it */
    }
    if (conn->jobs_tail == conn->jobs_head) {
        conn->answer_polls = 0; /* none, or a frame of ours took them */
        conn->answer_now   = 0;
        return;
    }
    if (!had) {
        conn->answer_polls = HCA_TCP_ANSWER_POLLS;
    }
    if (!conn->answer_now &&
        (conn->jobs[conn->jobs_tail % HCA_TCP_JOBS].hdr.opcode ==
         HCA_TCP_OP_ACK) && (conn->answer_polls-- > 0)) {
        /* held only while the thread watches the polls (user_polls): it
         * stores user_polls, then loads answers_held; we the reverse
         * (both seq_cst), so one of us sees the other */
        atomic_store(&tcp->answers_held, 1);
        if (atomic_load(&tcp->user_polls)) {
            return;
        }
    }
    conn->answer_now   = 0;
    conn->answer_polls = 0;
    if (pthread_mutex_trylock(&conn->tx_lock) == 0) {
        hca_tcp_jobs_pump(tcp, conn);
        pthread_mutex_unlock(&conn->tx_lock);
    }
}
