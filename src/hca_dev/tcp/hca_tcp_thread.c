/*
 * hca_tcp_thread.c - the tcp fabric's thread, one per device context: it
 * accepts connections and checks their hello, completes our own connects,
 * reads every frame (so that WRITE, READ and atomics complete without the
 * target process calling the device), sends the answers, keeps idle
 * connections alive and finds silent or broken ones.
 */
#include "hca_tcp_fabric.h"
#include "hca_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <unistd.h>

static char hca_tcp_listen_tag, hca_tcp_wake_tag;

/* The events the thread waits for on conn: reading unless parked or out
 * of room for answers, writing while something waits to go out.  With
 * conn->tx_lock held (want_out is the senders' too). */
void hca_tcp_events(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn, int op)
{
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.ptr = conn};

    if (conn->fd < 0) {
        return; /* reaped */
    }

    /* while the process polls, it reads its connections itself: waking
     * this thread for each message would only take a core from it */
    if (conn->reading && (!tcp->user_polls ||
                          (atomic_load(&conn->state) != HCA_TCP_CONN_UP))) {
        ev.events |= EPOLLIN;
    }
    if (conn->want_out) {
        ev.events |= EPOLLOUT;
    }
    (void)epoll_ctl(tcp->epfd, op, conn->fd, &ev);
}

/* A new connection (tcp->lock held): watched for its connect's end or
 * its hello. */
void hca_tcp_watch(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    pthread_mutex_lock(&conn->tx_lock);
    conn->reading  = 1;
    conn->want_out = (atomic_load(&conn->state) == HCA_TCP_CONN_CONNECTING);
    hca_tcp_events(tcp, conn, EPOLL_CTL_ADD);
    pthread_mutex_unlock(&conn->tx_lock);
}

/* ---------------------------------------------------------------- hello */

static int hca_tcp_send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n <= 0) {
            if ((n < 0) && (errno == EINTR)) {
                continue;
            }
            return -1; /* a fresh socket takes 64 bytes, or is broken */
        }
        p   += n;
        len -= (size_t)n;
    }
    return 0;
}

/* A refusal, logged at most once per HCA_TCP_LOG_NS with the count of
 * those not logged since (the thread: a flood of bad hellos or
 * connections must not become a flood of lines). */
static void hca_tcp_refusal(hca_tcp_dev_t *tcp, const char *fmt, ...)
{
    uint64_t now = hca_now_ns();
    char line[256];
    va_list ap;

    if ((tcp->log_ns != 0) && (now - tcp->log_ns < HCA_TCP_LOG_NS)) {
        tcp->log_held++;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (tcp->log_held > 0) {
        hca_log("tcp fabric: %s (and %u refusals not logged)", line,
                tcp->log_held);
    } else {
        hca_log("tcp fabric: %s", line);
    }
    tcp->log_ns   = now;
    tcp->log_held = 0;
}

/* A handshake message; with our identity unless `anonymous` (a refusal
 * names nobody). */
static void hca_tcp_hello_fill(hca_tcp_dev_t *tcp, hca_tcp_hello_t *h,
                               hca_tcp_step_t step, int anonymous)
{
    memset(h, 0, sizeof(*h));
    h->magic   = HCA_TCP_MAGIC;
    h->version = HCA_TCP_VERSION;
    h->step    = (uint8_t)step;
    if (!anonymous) {
        h->src_host = tcp->dev->host_key;
        h->src_pid  = tcp->dev->pid;
        h->src_ctx  = tcp->dev->ctx_id;
    }
}

/* Our connect finished: says who we are and who we want, with a nonce. */
static void hca_tcp_connected(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    hca_tcp_hello_t h;
    int err = 0;
    socklen_t len = sizeof(err);

    if ((getsockopt(conn->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) ||
        (err != 0)) {
        if (tcp->dev->trace) {
            hca_log("tcp fabric: connect to pid %u ctx %u: %s",
                    conn->peer.pid, conn->peer.ctx_id, strerror(err));
        }
        hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
        return;
    }
    conn->hs.nonce_c   = hca_tcp_nonce();
    conn->hs.conn_host = tcp->dev->host_key;
    conn->hs.conn_pid  = tcp->dev->pid;
    conn->hs.conn_ctx  = tcp->dev->ctx_id;
    conn->hs.acc_host  = conn->peer.host;
    conn->hs.acc_pid   = conn->peer.pid;
    conn->hs.acc_ctx   = conn->peer.ctx_id;
    hca_tcp_hello_fill(tcp, &h, HCA_TCP_STEP_HELLO, 0);
    h.dst_host = conn->peer.host;
    h.dst_pid  = conn->peer.pid;
    h.dst_ctx  = conn->peer.ctx_id;
    h.nonce    = conn->hs.nonce_c;
    if (hca_tcp_send_all(conn->fd, &h, sizeof(h)) != 0) {
        if (tcp->dev->trace) {
            hca_log("tcp fabric: hello to pid %u ctx %u: %s",
                    conn->peer.pid, conn->peer.ctx_id, strerror(errno));
        }
        hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
        return;
    }
    conn->hs_step = HCA_TCP_STEP_HELLO;
    if (hca_tcp_conn_to(conn, HCA_TCP_CONN_HELLO) < 0) {
        return;
    }
    pthread_mutex_lock(&conn->tx_lock);
    conn->want_out = 0;
    hca_tcp_events(tcp, conn, EPOLL_CTL_MOD);
    pthread_mutex_unlock(&conn->tx_lock);
}

/* The connector's side of the handshake: the acceptor's CHALLENGE, then
 * its VERDICT.  0 go on, -1 the connection died. */
static int hca_tcp_hello_connector(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                                   const hca_tcp_hello_t *in)
{
    hca_tcp_hello_t out;
    int ok = hca_tcp_hello_check(in) && (in->step == conn->hs_step + 1);

    if (!ok || (in->status != HCA_TCP_HELLO_OK)) {
        hca_tcp_refusal(tcp, "pid %u ctx %u refused our connection "
                        "(status %u)", conn->peer.pid, conn->peer.ctx_id,
                        ok ? in->status : 0xffffu);
        hca_tcp_conn_kill(tcp, conn,
                          (ok && (in->status == HCA_TCP_HELLO_BAD_SECRET)) ?
                          HCA_WC_REM_ACCESS_ERR : HCA_WC_RETRY_EXC_ERR);
        return -1;
    }
    if (in->step == HCA_TCP_STEP_VERDICT) {
        atomic_store(&conn->proven, 1); /* it proved it in its CHALLENGE */
        return 0;
    }
    /* the CHALLENGE: the context we wanted, and it knows its secret */
    conn->hs.nonce_a = in->nonce;
    if ((in->src_host != conn->peer.host) || (in->src_pid != conn->peer.pid) ||
        (in->src_ctx != conn->peer.ctx_id) ||
        !hca_tcp_mac_equal(in->mac, hca_tcp_mac(conn->peer.secret,
                                                HCA_TCP_MAC_ACCEPTOR,
                                                &conn->hs))) {
        hca_tcp_refusal(tcp, "the listener of pid %u ctx %u did not prove "
                        "it is that context: connection closed",
                        conn->peer.pid, conn->peer.ctx_id);
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_REFUSED, 1);
        hca_tcp_conn_kill(tcp, conn, HCA_WC_REM_ACCESS_ERR);
        return -1;
    }
    hca_tcp_hello_fill(tcp, &out, HCA_TCP_STEP_PROOF, 0);
    out.mac   = hca_tcp_mac(conn->peer.secret, HCA_TCP_MAC_CONNECTOR,
                            &conn->hs);
    out.proof = hca_tcp_mac(tcp->secret, HCA_TCP_MAC_IDENTITY, &conn->hs);
    if (hca_tcp_send_all(conn->fd, &out, sizeof(out)) != 0) {
        hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
        return -1;
    }
    conn->hs_step = HCA_TCP_STEP_PROOF;
    return 1; /* more to read */
}

/* The acceptor's side: the connector's HELLO, then its PROOF. */
static int hca_tcp_hello_acceptor(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                                  const hca_tcp_hello_t *in)
{
    hca_device_t *dev = tcp->dev;
    hca_tcp_hello_t out;
    int status        = HCA_TCP_HELLO_OK;

    if (!hca_tcp_hello_check(in) || (in->step != conn->hs_step + 1)) {
        status = HCA_TCP_HELLO_BAD_VERSION;
    } else if (in->step == HCA_TCP_STEP_HELLO) {
        if (in->dst_host != dev->host_key) {
            status = HCA_TCP_HELLO_WRONG_HOST;
        } else if ((in->dst_pid != dev->pid) ||
                   (in->dst_ctx != dev->ctx_id)) {
            status = HCA_TCP_HELLO_NO_CONTEXT;
        }
    } else if (!hca_tcp_mac_equal(in->mac, hca_tcp_mac(tcp->secret,
                                                       HCA_TCP_MAC_CONNECTOR,
                                                       &conn->hs))) {
        status = HCA_TCP_HELLO_BAD_SECRET; /* not given our address */
    }
    if (status != HCA_TCP_HELLO_OK) {
        /* names nobody: whoever asked learns no identity of ours */
        hca_tcp_hello_fill(tcp, &out, (conn->hs_step == 0) ?
                           HCA_TCP_STEP_CHALLENGE : HCA_TCP_STEP_VERDICT, 1);
        out.status = (uint8_t)status;
        (void)hca_tcp_send_all(conn->fd, &out, sizeof(out));
        hca_tcp_refusal(tcp, "refused a connection (status %d, step %d)",
                        status, conn->hs_step + 1);
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_REFUSED, 1);
        hca_tcp_conn_kill(tcp, conn, HCA_WC_REM_ACCESS_ERR);
        return -1;
    }
    if (in->step == HCA_TCP_STEP_HELLO) {
        /* who it claims to be: proven only by in->proof, later */
        conn->peer.host    = in->src_host;
        conn->peer.pid     = in->src_pid;
        conn->peer.ctx_id  = in->src_ctx;
        conn->hs.nonce_c   = in->nonce;
        conn->hs.nonce_a   = hca_tcp_nonce();
        conn->hs.conn_host = in->src_host;
        conn->hs.conn_pid  = in->src_pid;
        conn->hs.conn_ctx  = in->src_ctx;
        conn->hs.acc_host  = dev->host_key;
        conn->hs.acc_pid   = dev->pid;
        conn->hs.acc_ctx   = dev->ctx_id;
        hca_tcp_hello_fill(tcp, &out, HCA_TCP_STEP_CHALLENGE, 0);
        out.nonce = conn->hs.nonce_a;
        out.mac   = hca_tcp_mac(tcp->secret, HCA_TCP_MAC_ACCEPTOR, &conn->hs);
        conn->hs_step = HCA_TCP_STEP_CHALLENGE;
    } else {
        conn->proof = in->proof;
        hca_tcp_hello_fill(tcp, &out, HCA_TCP_STEP_VERDICT, 0);
        conn->hs_step = HCA_TCP_STEP_VERDICT;
    }
    if (hca_tcp_send_all(conn->fd, &out, sizeof(out)) != 0) {
        hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
        return -1;
    }
    return (conn->hs_step == HCA_TCP_STEP_VERDICT) ? 0 : 1;
}

/* A handshake message of the other side is in conn->rx.in.hello. */
static void hca_tcp_hello_in(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hello_t *in = &conn->rx.in.hello;
    hca_device_t *dev         = tcp->dev;
    int rc = conn->outbound ? hca_tcp_hello_connector(tcp, conn, in) :
                              hca_tcp_hello_acceptor(tcp, conn, in);

    conn->rx.got = 0;
    if (rc != 0) {
        return; /* dead, or the next message of the handshake to read */
    }
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_CONNS, 1);
    if (atomic_fetch_add(&tcp->conns_up, 1) == 0) {
        /* user threads' polls read connections from now on */
        atomic_fetch_or(&dev->fabric_polls, 1u << HCA_FABRIC_TCP);
    }
    if (hca_tcp_conn_to(conn, HCA_TCP_CONN_UP) < 0) {
        return; /* killed meanwhile by a sender */
    }
    hca_tcp_rx_to(conn, HCA_TCP_RX_HDR);
    conn->rx.got   = 0;
    conn->rx.want  = sizeof(hca_tcp_hdr_t);
}

/* ---------------------------------------------------------------- reading */

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

/* Sends the answers queued (tx_lock not held).  Not the rest of a READ:
 * it waits for room in the socket (EPOLLOUT, or a poll), and trying
 * again before would only cost a sendmsg that says EAGAIN. */
static void hca_tcp_answers_out(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    if ((conn->jobs_tail != conn->jobs_head) &&
        (conn->jobs[conn->jobs_tail % HCA_TCP_JOBS].hdr.opcode !=
         HCA_TCP_OP_READ_RESP)) {
        pthread_mutex_lock(&conn->tx_lock);
        hca_tcp_jobs_pump(tcp, conn);
        pthread_mutex_unlock(&conn->tx_lock);
    }
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

        if (atomic_load(&conn->state) == HCA_TCP_CONN_DEAD) {
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
            hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR); /* closed */
            return -1;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
                return 0;
            }
            hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR); /* reset */
            return -1;
        }
        atomic_store_explicit(&conn->last_rx_ns, hca_now_ns(),
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

    conn->answer_now   = 0;
    conn->answer_polls = 0;
    hca_tcp_answers_out(tcp, conn);
    return rc;
}

/* How many more polls the answers of SENDs wait for a frame of ours to
 * carry them: a process replies to a message after the poll that gave it
 * (UCT delivers it at its next progress, whose own poll comes before the
 * reply), so two; then they go alone.  A process that stops polling has
 * them sent by the thread within 1 ms, as its reading is taken over by
 * the thread within 2 ms (HCA_TCP_POLLED_NS). */
#define HCA_TCP_ANSWER_POLLS 2

/* A user poll's read of conn (rx_lock held). */
static void hca_tcp_poll_read(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    int had = (conn->jobs_tail != conn->jobs_head);

    if (conn->reading) {
        (void)hca_tcp_read_frames(tcp, conn, tcp->user_polls);
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
        /* held only while the thread wakes every 1 ms (user_polls): it
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

/* The thread's wake while a process polls: answers a poll held are sent. */
static void hca_tcp_answers_held(hca_tcp_dev_t *tcp)
{
    if (!atomic_load(&tcp->answers_held) ||
        !atomic_exchange(&tcp->answers_held, 0)) {
        return;
    }
    pthread_mutex_lock(&tcp->lock);
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        if ((c->jobs_tail != c->jobs_head) &&
            (atomic_load(&c->state) == HCA_TCP_CONN_UP)) {
            pthread_mutex_lock(&c->tx_lock);
            hca_tcp_jobs_pump(tcp, c);
            pthread_mutex_unlock(&c->tx_lock);
        }
    }
    pthread_mutex_unlock(&tcp->lock);
}

/* ---------------------------------------------------------------- events */

/* Closes the socket of a dead connection (tcp->lock held, the thread);
 * the connection is freed by hca_tcp_reap once no QP uses it.  0, or -1
 * if a poll reads it now (the next pass closes it). */
static int hca_tcp_close_fd(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    if (pthread_mutex_trylock(&conn->rx_lock) != 0) {
        return -1;
    }
    if (conn->fd >= 0) {
        /* closed under both locks: a sender (tx_lock) or a poll
         * (rx_lock) never uses the number after another file got it */
        (void)epoll_ctl(tcp->epfd, EPOLL_CTL_DEL, conn->fd, NULL);
        pthread_mutex_lock(&conn->tx_lock);
        hca_tcp_rx_abort(conn);
        close(conn->fd);
        conn->fd = -1;
        pthread_mutex_unlock(&conn->tx_lock);
    }
    pthread_mutex_unlock(&conn->rx_lock);
    return 0;
}

/* Where an accepted connection comes from, as 16 bytes (IPv4 mapped). */
static void hca_tcp_src_ip(const struct sockaddr_storage *ss, uint8_t ip[16])
{
    memset(ip, 0, 16);
    if (ss->ss_family == AF_INET) {
        ip[10] = ip[11] = 0xff;
        memcpy(ip + 12, &((const struct sockaddr_in*)ss)->sin_addr, 4);
    } else if (ss->ss_family == AF_INET6) {
        memcpy(ip, &((const struct sockaddr_in6*)ss)->sin6_addr, 16);
    }
}

/* Makes room for one more half-open connection (inbound, handshake not
 * done; tcp->lock held): over the cap of the listener, or of the source
 * ip (NULL: any), the oldest one goes first - an attacker's flood ages
 * out behind the peers that come after it.  `force`: one goes even under
 * the caps (out of file descriptors).  1 if one was closed. */
static int hca_tcp_half_open_trim(hca_tcp_dev_t *tcp, const uint8_t *ip,
                                  int force)
{
    hca_tcp_conn_t *oldest = NULL, *oldest_src = NULL, *victim;
    uint32_t n = 0, n_src = 0;

    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        if (c->outbound || (c->fd < 0) ||
            (atomic_load(&c->state) != HCA_TCP_CONN_HELLO)) {
            continue;
        }
        n++;
        if ((oldest == NULL) || (c->start_ns <= oldest->start_ns)) {
            oldest = c;
        }
        if ((ip != NULL) && (memcmp(c->src_ip, ip, 16) == 0)) {
            n_src++;
            if ((oldest_src == NULL) ||
                (c->start_ns <= oldest_src->start_ns)) {
                oldest_src = c;
            }
        }
    }
    if (n_src >= HCA_TCP_HALF_OPEN_SRC) {
        victim = oldest_src;
    } else if ((n >= tcp->half_open_max) || force) {
        victim = oldest;
    } else {
        return 0;
    }
    if (victim == NULL) {
        return 0;
    }
    hca_tcp_refusal(tcp, "%u connections wait for their handshake (%u from "
                    "one address): the oldest closed", n, n_src);
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_REFUSED, 1);
    hca_tcp_conn_kill(tcp, victim, HCA_WC_RETRY_EXC_ERR);
    return hca_tcp_close_fd(tcp, victim) == 0;
}

static void hca_tcp_accept(hca_tcp_dev_t *tcp)
{
    for (;;) {
        hca_tcp_conn_t *conn;
        struct sockaddr_storage ss;
        socklen_t sslen = sizeof(ss);
        uint8_t ip[16];
        int fd = accept4(tcp->listen_fd, (struct sockaddr*)&ss, &sslen,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            if ((err == EMFILE) || (err == ENFILE)) {
                int freed;
                /* out of fds: a half-open connection gives its one to
                 * whoever waits (the connections that completed a
                 * handshake keep theirs) */
                pthread_mutex_lock(&tcp->lock);
                freed = hca_tcp_half_open_trim(tcp, NULL, 1);
                pthread_mutex_unlock(&tcp->lock);
                if (freed) {
                    continue;
                }
            }
            if ((err == EMFILE) || (err == ENFILE) || (err == ENOMEM) ||
                (err == ENOBUFS)) {
                /* the pending connection stays: stop watching the
                 * listener until the next timer pass, or we would spin */
                (void)epoll_ctl(tcp->epfd, EPOLL_CTL_DEL, tcp->listen_fd,
                                NULL);
                tcp->listen_paused = 1;
            }
            return;
        }
        hca_tcp_src_ip(&ss, ip);
        pthread_mutex_lock(&tcp->lock);
        (void)hca_tcp_half_open_trim(tcp, ip, 0);
        conn = hca_tcp_conn_new(tcp, fd, 0);
        if (conn == NULL) {
            close(fd);
        } else {
            memcpy(conn->src_ip, ip, 16);
            (void)hca_tcp_conn_to(conn, HCA_TCP_CONN_HELLO);
            hca_tcp_watch(tcp, conn);
        }
        pthread_mutex_unlock(&tcp->lock);
    }
}

/* The socket takes more: the frame in progress, then the answers. */
static void hca_tcp_writable(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    int done;

    pthread_mutex_lock(&conn->tx_lock);
    conn->want_out = 0;
    hca_tcp_jobs_pump(tcp, conn);
    done = !conn->want_out;
    if (done && !conn->reading && (conn->rx.state != HCA_TCP_RX_PARKED) &&
        (conn->jobs_head - conn->jobs_tail < HCA_TCP_JOBS / 2)) {
        conn->reading = 1;
    }
    hca_tcp_events(tcp, conn, EPOLL_CTL_MOD);
    pthread_mutex_unlock(&conn->tx_lock);
    if (conn->reading) {
        pthread_mutex_lock(&conn->rx_lock);
        (void)hca_tcp_read(tcp, conn); /* what arrived while we waited */
        pthread_mutex_unlock(&conn->rx_lock);
    }
}

/* Releases what a dead connection holds; frees it once no QP uses it. */
static void hca_tcp_reap(hca_tcp_dev_t *tcp)
{
    pthread_mutex_lock(&tcp->lock);
    for (hca_tcp_conn_t **pp = &tcp->conns; *pp != NULL;) {
        hca_tcp_conn_t *conn = *pp;
        if (atomic_load(&conn->state) != HCA_TCP_CONN_DEAD) {
            pp = &conn->next;
            continue;
        }
        if (hca_tcp_close_fd(tcp, conn) != 0) {
            pp = &conn->next; /* a poll reads it: the next pass frees it */
            continue;
        }
        if (conn->qp_refs == 0) {
            *pp = conn->next;
            hca_tcp_conn_free(conn);
        } else {
            pp = &conn->next;
        }
    }
    pthread_mutex_unlock(&tcp->lock);
}

/* Nanoseconds since t; 0 for a time after now (stamps of other threads are
 * taken without our lock: one may be newer than our `now`). */
static inline uint64_t hca_tcp_age(uint64_t now, uint64_t t)
{
    return (now > t) ? now - t : 0;
}

/* Our answers wait behind a frame (64 KiB of payload at most, and the
 * answers that go with it) that met a full socket a peer timeout ago and
 * is still not out (tx_lock taken): the peer does not drain them.  READ
 * answers pin their regions, and a peer that keeps them (stopped, frozen,
 * or on purpose: its reading stopped ours, once the answer queue filled)
 * would hold their deregistration for good.  Our own requests alone are
 * the peer's flow control (its ring full) and are not judged. */
static int hca_tcp_tx_stuck(hca_tcp_conn_t *conn, uint64_t now,
                            uint64_t limit)
{
    int stuck;

    pthread_mutex_lock(&conn->tx_lock);
    stuck = (conn->tx_stuck_ns != 0) &&
            (hca_tcp_age(now, conn->tx_stuck_ns) > limit) &&
            ((conn->jobs_tail != conn->jobs_head) || (conn->tx.pinned != NULL));
    pthread_mutex_unlock(&conn->tx_lock);
    return stuck;
}

/* The frame being read is still the one whose payload was being read a
 * peer timeout ago (rx_lock held): a 64 KiB segment at most, which never
 * takes that long from a live peer, while a trickle (a byte now and then
 * is traffic) would hold its region's deregistration.  Judged at the
 * timer passes: a payload gets the timeout and up to two periods. */
static int hca_tcp_rx_stalled(hca_tcp_conn_t *conn, uint64_t now,
                              uint64_t limit)
{
    if ((conn->rx.state != HCA_TCP_RX_PAYLOAD) &&
        (conn->rx.state != HCA_TCP_RX_DISCARD)) {
        return 0;
    }
    if (conn->rx_judged_frames != conn->rx_frames) {
        conn->rx_judged_frames = conn->rx_frames;
        conn->rx_judged_ns     = now;
        return 0;
    }
    return hca_tcp_age(now, conn->rx_judged_ns) > limit;
}

/* Keepalives on quiet connections; silent, stuck and parked ones. */
static int hca_tcp_timers(hca_tcp_dev_t *tcp)
{
    uint64_t now, limit = tcp->timeout_ms * 1000000ull;
    int dead = 0, parked = 0, n_resumed = 0;
    hca_tcp_conn_t *resumed[HCA_TCP_POLL_MAX];

    pthread_mutex_lock(&tcp->lock);
    now = hca_now_ns();
    for (hca_tcp_conn_t *conn = tcp->conns; conn != NULL; conn = conn->next) {
        int state = atomic_load(&conn->state);

        if (state == HCA_TCP_CONN_DEAD) {
            dead = 1;
            continue;
        }
        if (state != HCA_TCP_CONN_UP) {
            if (hca_tcp_age(now, conn->start_ns) >
                HCA_TCP_CONNECT_MS * 1000000ull) {
                hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
                dead = 1;
            }
            continue;
        }
        if (!conn->reading || (conn->rx.state == HCA_TCP_RX_PARKED)) {
            /* we do not read it (a full ring or answer queue of ours):
             * its keepalives wait behind what we left there.  A full
             * answer queue is the peer's to drain: hca_tcp_tx_stuck
             * judges that (a peer that drains it slowly, a large READ's
             * answers on a slow link, is alive) */
            atomic_store(&conn->last_rx_ns, now);
        } else if (hca_tcp_age(now, atomic_load(&conn->last_rx_ns)) > limit) {
            hca_log("tcp fabric: pid %u ctx %u silent for %u ms: its QPs "
                    "fail", conn->peer.pid, conn->peer.ctx_id,
                    tcp->timeout_ms);
            hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
            dead = 1;
            continue;
        }
        if (hca_tcp_tx_stuck(conn, now, limit)) {
            hca_log("tcp fabric: pid %u ctx %u took none of our answers for "
                    "%u ms: its QPs fail", conn->peer.pid, conn->peer.ctx_id,
                    tcp->timeout_ms);
            hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
            dead = 1;
            continue;
        }
        if (pthread_mutex_trylock(&conn->rx_lock) == 0) {
            if (hca_tcp_rx_stalled(conn, now, limit)) {
                pthread_mutex_unlock(&conn->rx_lock);
                hca_log("tcp fabric: pid %u ctx %u sent no more of a frame's "
                        "payload for %u ms: its QPs fail", conn->peer.pid,
                        conn->peer.ctx_id, tcp->timeout_ms);
                hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
                dead = 1;
                continue;
            }
            if (conn->rx.state == HCA_TCP_RX_PARKED) {
                int placed = hca_tcp_rx_unpark(tcp, conn);
                hca_tcp_answers_out(tcp, conn); /* its ACK, if the last */
                if (placed) {
                    pthread_mutex_lock(&conn->tx_lock);
                    conn->reading = 1;
                    hca_tcp_events(tcp, conn, EPOLL_CTL_MOD);
                    pthread_mutex_unlock(&conn->tx_lock);
                } else {
                    parked = 1;
                }
            }
            /* frames its read buffer holds since it stopped (parked, or
             * out of room for answers) are read below: the socket may
             * have nothing left to wake anyone for them */
            if (conn->reading && (conn->rx.state != HCA_TCP_RX_PARKED) &&
                (conn->rx.buf_tail != conn->rx.buf_head)) {
                if (n_resumed < HCA_TCP_POLL_MAX) {
                    resumed[n_resumed++] = conn;
                } else {
                    parked = 1; /* the next pass, in 1 ms */
                }
            }
            pthread_mutex_unlock(&conn->rx_lock);
        }
        if (hca_tcp_age(now, atomic_load(&conn->last_tx_ns)) > limit / 4) {
            hca_tcp_job_t job;
            memset(&job, 0, sizeof(job));
            job.hdr.version = HCA_TCP_VERSION;
            job.hdr.opcode  = HCA_TCP_OP_KEEPALIVE;
            pthread_mutex_lock(&conn->tx_lock);
            /* never in the last half of the queue: the answers a reader
             * promised (one per frame it read) keep their room */
            if ((conn->jobs_head - conn->jobs_tail < HCA_TCP_JOBS / 2) &&
                (hca_tcp_job_push(conn, &job) == 0)) {
                hca_tcp_jobs_pump(tcp, conn);
            }
            pthread_mutex_unlock(&conn->tx_lock);
            atomic_store(&conn->last_tx_ns, now); /* one per period */
        }
    }
    pthread_mutex_unlock(&tcp->lock);
    /* only this thread frees connections: those stay valid */
    for (int i = 0; i < n_resumed; ++i) {
        pthread_mutex_lock(&resumed[i]->rx_lock);
        if (resumed[i]->reading &&
            (resumed[i]->rx.buf_tail != resumed[i]->rx.buf_head)) {
            dead |= (hca_tcp_read(tcp, resumed[i]) < 0);
        }
        pthread_mutex_unlock(&resumed[i]->rx_lock);
    }
    if (tcp->listen_paused) {
        struct epoll_event ev = {.events   = EPOLLIN,
                                 .data.ptr = &hca_tcp_listen_tag};
        tcp->listen_paused = 0;
        (void)epoll_ctl(tcp->epfd, EPOLL_CTL_ADD, tcp->listen_fd, &ev);
    }
    if (dead) {
        hca_tcp_reap(tcp);
    }
    return parked;
}

/* Polled by the process (a user poll in the last HCA_TCP_POLLED_NS), the
 * thread stops waiting for its connections' data; not polled, it reads
 * them again.  The switch re-registers every live connection. */
#define HCA_TCP_POLLED_NS 2000000ull

static void hca_tcp_poll_mode(hca_tcp_dev_t *tcp, uint64_t now)
{
    uint64_t last = atomic_load_explicit(&tcp->last_user_poll_ns,
                                         memory_order_relaxed);
    /* a poll reads at most HCA_TCP_POLL_MAX connections: with more the
     * thread keeps reading them all */
    int polled    = (last != 0) && (now < last + HCA_TCP_POLLED_NS) &&
                    (atomic_load(&tcp->conns_up) <= HCA_TCP_POLL_MAX);

    if (polled == tcp->user_polls) {
        return;
    }
    pthread_mutex_lock(&tcp->lock);
    tcp->user_polls = polled;
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        if ((c->fd >= 0) && (atomic_load(&c->state) == HCA_TCP_CONN_UP)) {
            pthread_mutex_lock(&c->tx_lock);
            hca_tcp_events(tcp, c, EPOLL_CTL_MOD);
            pthread_mutex_unlock(&c->tx_lock);
        }
    }
    pthread_mutex_unlock(&tcp->lock);
}

/* The timer pass's period: keepalives and the silent check at an eighth
 * of the peer timeout, the connect limit at a quarter of its own. */
static uint64_t hca_tcp_period_ns(const hca_tcp_dev_t *tcp)
{
    uint64_t ms = tcp->timeout_ms / 8;

    ms = (ms < HCA_TCP_CONNECT_MS / 4) ? ms : HCA_TCP_CONNECT_MS / 4;
    return ((ms > 0) ? ms : 1) * 1000000ull;
}

static void *hca_tcp_thread(void *arg)
{
    hca_tcp_dev_t *tcp = arg;
    struct epoll_event ev[32];
    uint64_t next_timer = 0;
    int reap;

    while (tcp->running) {
        uint64_t now;
        int n = epoll_wait(tcp->epfd, ev, 32,
                           (atomic_load(&tcp->parked) || tcp->user_polls) ?
                           1 : (int)(hca_tcp_period_ns(tcp) / 1000000ull));

        reap = 0; /* after the batch: a freed connection may be in it */
        for (int i = 0; i < n; ++i) {
            hca_tcp_conn_t *conn = ev[i].data.ptr;

            if (ev[i].data.ptr == &hca_tcp_wake_tag) {
                uint64_t v;
                (void)read(tcp->wake_fd, &v, sizeof(v));
                continue;
            }
            if (ev[i].data.ptr == &hca_tcp_listen_tag) {
                hca_tcp_accept(tcp);
                continue;
            }
            if (ev[i].events & (EPOLLERR | EPOLLHUP)) {
                if (atomic_load(&conn->state) == HCA_TCP_CONN_CONNECTING) {
                    hca_tcp_connected(tcp, conn); /* finds the error */
                } else {
                    pthread_mutex_lock(&conn->rx_lock);
                    (void)hca_tcp_read(tcp, conn); /* then the close */
                    pthread_mutex_unlock(&conn->rx_lock);
                    hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
                }
                reap = 1;
                continue;
            }
            if (atomic_load(&conn->state) == HCA_TCP_CONN_CONNECTING) {
                if (ev[i].events & EPOLLOUT) {
                    hca_tcp_connected(tcp, conn);
                }
                continue;
            }
            if ((ev[i].events & (EPOLLIN | EPOLLRDHUP)) && conn->reading) {
                int rc;
                pthread_mutex_lock(&conn->rx_lock);
                rc = hca_tcp_read(tcp, conn);
                pthread_mutex_unlock(&conn->rx_lock);
                if (rc < 0) {
                    reap = 1;
                    continue;
                }
            }
            if ((ev[i].events & EPOLLRDHUP) && !conn->reading) {
                /* the peer closed while we read nothing (parked, or out of
                 * room for answers): it is gone */
                hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
                reap = 1;
                continue;
            }
            if (ev[i].events & EPOLLOUT) {
                hca_tcp_writable(tcp, conn);
            }
            reap |= (atomic_load(&conn->state) == HCA_TCP_CONN_DEAD);
        }
        if (reap) {
            hca_tcp_reap(tcp);
        }
        now = hca_now_ns();
        hca_tcp_poll_mode(tcp, now);
        hca_tcp_answers_held(tcp); /* after: see hca_tcp_poll_read */
        if (atomic_load(&tcp->parked) || (now >= next_timer)) {
            /* cleared before the pass: a poll that parks meanwhile sets it
             * again */
            atomic_store(&tcp->parked, 0);
            if (hca_tcp_timers(tcp)) {
                atomic_store(&tcp->parked, 1);
            }
            next_timer = now + hca_tcp_period_ns(tcp);
        }
    }
    return NULL;
}

int hca_tcp_poll(hca_device_t *dev)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(dev);
    hca_tcp_conn_t *mine[HCA_TCP_POLL_MAX];
    int n = 0;

    if ((tcp == NULL) || (atomic_load_explicit(&tcp->conns_up,
                                               memory_order_relaxed) == 0) ||
        (pthread_mutex_trylock(&tcp->lock) != 0)) {
        return 0; /* the thread is at it */
    }
    /* the connections we can take now (a locked one is being read) */
    for (hca_tcp_conn_t *c = tcp->conns; (c != NULL) && (n < HCA_TCP_POLL_MAX);
         c = c->next) {
        if ((atomic_load(&c->state) == HCA_TCP_CONN_UP) && c->reading &&
            (pthread_mutex_trylock(&c->rx_lock) == 0)) {
            mine[n++] = c;
        }
    }
    pthread_mutex_unlock(&tcp->lock);
    if (n > 0) {
        atomic_store_explicit(&tcp->last_user_poll_ns, hca_now_ns(),
                              memory_order_relaxed);
    }
    for (int i = 0; i < n; ++i) {
        /* rx_lock held: reap cannot free it; -1 leaves it to the thread,
         * which sees its hangup */
        hca_tcp_conn_t *c = mine[i];
        hca_tcp_poll_read(tcp, c);
        pthread_mutex_unlock(&c->rx_lock);
    }
    return n;
}

int hca_tcp_thread_start(hca_tcp_dev_t *tcp)
{
    struct epoll_event ev = {.events = EPOLLIN};
    struct rlimit rl;
    int rc;

    /* half-open connections take at most a quarter of the fds: the rest
     * is for the connections that completed a handshake */
    tcp->half_open_max = HCA_TCP_HALF_OPEN_MAX;
    if ((getrlimit(RLIMIT_NOFILE, &rl) == 0) && (rl.rlim_cur != RLIM_INFINITY) &&
        (rl.rlim_cur / 4 < tcp->half_open_max)) {
        tcp->half_open_max = (rl.rlim_cur / 4 > 4) ? (uint32_t)(rl.rlim_cur / 4) :
                             4;
    }
    tcp->epfd    = epoll_create1(EPOLL_CLOEXEC);
    tcp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if ((tcp->epfd < 0) || (tcp->wake_fd < 0)) {
        rc = -errno;
        goto err;
    }
    ev.data.ptr = &hca_tcp_listen_tag;
    if (epoll_ctl(tcp->epfd, EPOLL_CTL_ADD, tcp->listen_fd, &ev) != 0) {
        rc = -errno;
        goto err;
    }
    ev.data.ptr = &hca_tcp_wake_tag;
    if (epoll_ctl(tcp->epfd, EPOLL_CTL_ADD, tcp->wake_fd, &ev) != 0) {
        rc = -errno;
        goto err;
    }
    tcp->running = 1;
    rc = -pthread_create(&tcp->thread, NULL, hca_tcp_thread, tcp);
    if (rc == 0) {
        return 0;
    }
    tcp->running = 0;
err:
    if (tcp->epfd >= 0) {
        close(tcp->epfd);
    }
    if (tcp->wake_fd >= 0) {
        close(tcp->wake_fd);
    }
    tcp->epfd = tcp->wake_fd = -1;
    return rc;
}

void hca_tcp_thread_stop(hca_tcp_dev_t *tcp)
{
    uint64_t one = 1;

    tcp->running = 0;
    (void)write(tcp->wake_fd, &one, sizeof(one));
    pthread_join(tcp->thread, NULL);
    close(tcp->epfd);
    close(tcp->wake_fd);
}
