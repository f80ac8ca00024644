/*
 * hca_tcp_conn.c - the tcp fabric's connections: one per pair of device
 * contexts, made on the first QP that needs it (nonblocking connect,
 * TCP_NODELAY), watched by the fabric's thread (its epoll events), the
 * four-message handshake (docs/TCP-WIRE.md "Connection set-up"), the
 * loss of its socket (LINKING: the side that dialled dials again, and the
 * acceptor resumes the connection on the new socket, whose handshake
 * proves the same connector comes back), and death (every QP on it then
 * fails).  Sending is hca_tcp_tx.c's, reading hca_tcp_rx.c's.
 */
#include "hca_tcp_fabric.h"
#include "hca_log.h"
#include "hca_mpt.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* What the frames being read and sent hold is given back: their regions,
 * the READs' answers never sent (the socket is gone). */
void hca_tcp_rx_abort(hca_tcp_conn_t *conn)
{
    if (conn->rx.pinned != NULL) {
        hca_mpt_release(conn->rx.pinned);
        conn->rx.pinned = NULL;
    }
    hca_tcp_rx_to(conn, HCA_TCP_RX_DISCARD);
    /* answers never sent: the READs' regions */
    while (conn->jobs_tail != conn->jobs_head) {
        hca_tcp_job_t *job = &conn->jobs[conn->jobs_tail++ % HCA_TCP_JOBS];
        if (job->entry != NULL) {
            hca_mpt_release(job->entry);
        }
    }
    if (conn->tx.pinned != NULL) {
        hca_mpt_release(conn->tx.pinned);
        conn->tx.pinned = NULL;
    }
    conn->tx.left = 0;
}

/* The receiver and the sender start again, on a new socket (both locks
 * held, or the connection not yet seen by anyone): nothing of the old
 * socket's stream is kept.  rx_state: HELLO for a handshake of its own,
 * HDR for a socket whose handshake another connection object did. */
void hca_tcp_conn_io_reset(hca_tcp_conn_t *conn, hca_tcp_rx_state_t rx_state)
{
    if (conn->rx.state != HCA_TCP_RX_DISCARD) {
        hca_tcp_rx_to(conn, HCA_TCP_RX_DISCARD); /* the old stream's end */
    }
    hca_tcp_rx_to(conn, rx_state);
    conn->rx.got      = 0;
    conn->rx.want     = (rx_state == HCA_TCP_RX_HELLO) ?
                        sizeof(hca_tcp_hello_t) : sizeof(hca_tcp_hdr_t);
    conn->rx.left     = 0;
    conn->rx.iovcnt   = 0;
    conn->rx.kind     = HCA_TCP_RXK_NONE;
    conn->rx.buf_head = conn->rx.buf_tail = 0;
    conn->rx.bulk     = 0;
    conn->rx.rqp      = NULL;
    conn->rx.dup      = 0;
    conn->tx.left     = 0;
    conn->tx.first    = 0;
    conn->tx.iovcnt   = 0;
    conn->tx.frames   = 0;
    conn->tx.owner_qpn = 0;
    conn->tx.cut      = 0;
    conn->tx.hold_ns  = 0;
    conn->tx_stuck_ns = 0;
    conn->answer_now  = 0;
    conn->answer_polls = 0;
    conn->hs_step     = 0;
    conn->hs_keyed    = 0;
    conn->want_out    = 0;
    conn->reading     = 1;
    /* what the old socket carried of READs' answers is not the new one's */
    memset(conn->answered, 0, sizeof(conn->answered));
    conn->answered_next = 0;
}

hca_tcp_conn_t *hca_tcp_conn_new(hca_tcp_dev_t *tcp, int fd, int outbound)
{
    hca_tcp_conn_t *conn = calloc(1, sizeof(*conn));
    int one = 1;

    if (conn == NULL) {
        return NULL;
    }
    conn->rx.stage = malloc(HCA_TCP_SEND_MAX);
    conn->rx.buf   = malloc(HCA_TCP_RXBUF);
    if ((conn->rx.stage == NULL) || (conn->rx.buf == NULL)) {
        free(conn->rx.stage);
        free(conn->rx.buf);
        free(conn);
        return NULL;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    conn->fd       = fd;
    conn->tcp      = tcp;
    conn->outbound = outbound;
    conn->start_ns = hca_now_ns();
    atomic_store(&conn->last_rx_ns, conn->start_ns);
    atomic_store(&conn->last_tx_ns, conn->start_ns);
    pthread_mutex_init(&conn->tx_lock, NULL);
    pthread_mutex_init(&conn->rx_lock, NULL);
    conn->trace    = tcp->dev->trace;
    conn->rx.state = HCA_TCP_RX_HELLO; /* the receiver's first state */
    conn->rx.want  = sizeof(hca_tcp_hello_t);
    conn->next     = tcp->conns;
    tcp->conns     = conn;
    return conn;
}

void hca_tcp_conn_free(hca_tcp_conn_t *conn)
{
    if (conn->fd >= 0) {
        close(conn->fd);
    }
    hca_tcp_rqps_forget(conn);
    if ((conn->rq_lead != NULL) && (conn->rq_lead != conn)) {
        conn->rq_lead->lead_refs--;
    }
    hca_tcp_rqps_free(conn);
    /* the session's keys die with it */
    hca_tcp_wipe(conn->kx_sk, sizeof(conn->kx_sk));
    hca_tcp_wipe(conn->hs_key, sizeof(conn->hs_key));
    hca_tcp_wipe(conn->key, sizeof(conn->key));
    hca_tcp_wipe(conn->key_prev, sizeof(conn->key_prev));
    pthread_mutex_destroy(&conn->tx_lock);
    pthread_mutex_destroy(&conn->rx_lock);
    free(conn->rx.stage);
    free(conn->rx.buf);
    free(conn->tx.bounce);
    free(conn);
}

/* A connection to the peer's context (tcp->lock held): the one we have,
 * or a new one, connecting (the thread completes it).  An inbound one
 * carries our requests only if it proves it is that peer (its claim in
 * the hello alone is anyone's: docs/TCP-WIRE.md, "Connection set-up"). */
static void hca_tcp_dial(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                         const struct sockaddr_storage *ss, uint32_t len);

hca_tcp_conn_t *hca_tcp_conn_get(hca_tcp_dev_t *tcp,
                                 const hca_port_addr_t *peer, int path)
{
    struct sockaddr_storage ss;
    hca_tcp_conn_t *conn;
    uint32_t len;
    int fd;

    for (conn = tcp->conns; conn != NULL; conn = conn->next) {
        if ((atomic_load(&conn->state) != HCA_TCP_CONN_DEAD) &&
            (conn->path == path) &&
            (conn->peer.host == peer->host) && (conn->peer.pid == peer->pid) &&
            (conn->peer.ctx_id == peer->ctx_id) &&
            hca_tcp_conn_is_peer(conn, peer->secret)) {
            return conn;
        }
    }
    fd = hca_tcp_path_socket(tcp, peer, path, &ss, &len);
    if (fd < 0) {
        return NULL;
    }
    conn = hca_tcp_conn_new(tcp, fd, 1);
    if (conn == NULL) {
        close(fd);
        return NULL;
    }
    conn->peer = *peer;
    conn->path = path;
    hca_tcp_dial(tcp, conn, &ss, len);
    return conn; /* if it failed at once, its QPs fail at their first post */
}

/* connect() on conn->fd, then the thread completes it. */
static void hca_tcp_dial(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                         const struct sockaddr_storage *ss, uint32_t len)
{
    if ((connect(conn->fd, (const struct sockaddr*)ss, len) != 0) &&
        (errno != EINPROGRESS)) {
        char str[64];
        hca_net_addr_str(hca_tcp_peer_net(&conn->peer, conn->path), str,
                         sizeof(str));
        hca_log("tcp fabric: cannot connect to %s (pid %u ctx %u): %s", str,
                conn->peer.pid, conn->peer.ctx_id, strerror(errno));
        hca_tcp_conn_drop(tcp, conn);
        return;
    }
    if (hca_tcp_conn_to(conn, HCA_TCP_CONN_CONNECTING) < 0) {
        return;
    }
    hca_tcp_watch(tcp, conn);
}

int hca_tcp_redial(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    struct sockaddr_storage ss;
    uint32_t len;
    int fd, one = 1;

    fd = hca_tcp_path_socket(tcp, &conn->peer, conn->path, &ss, &len);
    if (fd < 0) {
        return -1; /* out of fds: the next attempt */
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    pthread_mutex_lock(&conn->rx_lock);
    pthread_mutex_lock(&conn->tx_lock);
    hca_tcp_conn_io_reset(conn, HCA_TCP_RX_HELLO);
    conn->fd = fd;
    pthread_mutex_unlock(&conn->tx_lock);
    pthread_mutex_unlock(&conn->rx_lock);
    conn->start_ns = hca_now_ns();
    hca_tcp_dial(tcp, conn, &ss, len);
    return 0;
}

/* The connection is closed; the QPs on it see `why` at their next
 * operation or liveness check.  Called by the thread (tcp->lock held) or
 * by a sender that found the socket broken. */
void hca_tcp_conn_kill_at(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                          hca_wc_status_t why, const char *where)
{
    int unset = 0, was;

    /* the first killer's reason is what every QP reports */
    (void)atomic_compare_exchange_strong(&conn->fail, &unset, (int)why);
    was = hca_tcp_conn_to_at(conn, HCA_TCP_CONN_DEAD, where);
    if (was < 0) {
        return; /* dead already */
    }
    if (HCA_UNLIKELY(tcp->dev->trace)) {
        hca_log("tcp fabric: connection to pid %u ctx %u closed: %s",
                conn->peer.pid, conn->peer.ctx_id, hca_wc_status_str(why));
    }
    /* wakes the thread through EPOLLHUP: it closes and frees (the fd is
     * closed only under tx_lock and rx_lock, which every caller of a kill
     * on a live fd holds or orders) */
    if (conn->fd >= 0) {
        (void)shutdown(conn->fd, SHUT_RDWR);
    }
    atomic_fetch_add(&tcp->conns_dead, 1);
    if (was == HCA_TCP_CONN_UP) {
        atomic_fetch_sub(&tcp->conns_up, 1);
    }
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_CONNS_LOST, 1);
    atomic_fetch_add(&tcp->dev->dead_peers, 1);
}

int hca_tcp_peer_gone(const hca_tcp_dev_t *tcp, const hca_tcp_conn_t *conn)
{
    uint64_t start;
    int rc;

    if (conn->peer.host != tcp->dev->host_key) {
        return 0; /* another host's: its link tells, or the retry timeout */
    }
    /* a zombie too (killed, not reaped): it never answers again */
    rc = hca_proc_start_time(conn->peer.pid, &start);
    return (rc == -ESRCH) || (rc == -ENOENT);
}

void hca_tcp_conn_drop_at(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                          const char *where)
{
    int was;

    if (!conn->was_up || (conn->peer_incarn == 0)) {
        /* never up (unreachable: fail fast), or a peer that cannot come
         * back (no incarnation: not a context of ours) */
        hca_tcp_conn_kill_at(tcp, conn, HCA_WC_RETRY_EXC_ERR, where);
        return;
    }
    if (atomic_load(&conn->state) == HCA_TCP_CONN_LINKING) {
        return;
    }
    was = hca_tcp_conn_to_at(conn, HCA_TCP_CONN_LINKING, where);
    if (was < 0) {
        return; /* dead meanwhile */
    }
    if (was == HCA_TCP_CONN_UP) {
        atomic_fetch_sub(&tcp->conns_up, 1);
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_CONNS_LOST, 1);
        if (HCA_UNLIKELY(tcp->dev->trace)) {
            hca_log("tcp fabric: connection %s pid %u ctx %u lost its "
                    "socket: %s", conn->outbound ? "to" : "from",
                    conn->peer.pid, conn->peer.ctx_id,
                    conn->outbound ? "dialling again" : "waiting for it");
        }
    }
    /* the thread closes the socket (EPOLLHUP) and, as the dialler,
     * dials again */
    if (conn->fd >= 0) {
        (void)shutdown(conn->fd, SHUT_RDWR);
    }
    /* meanwhile its QPs go on over another path, if one is up: the thread
     * asks them (it holds tcp->lock, which QP destroy takes) */
    atomic_store(&conn->ask_failover, 1);
    atomic_store(&tcp->linking, 1);
}

/* ---------------------------------------------------------------- events */

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
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = conn};

    pthread_mutex_lock(&conn->tx_lock);
    conn->reading  = 1;
    conn->want_out = (atomic_load(&conn->state) == HCA_TCP_CONN_CONNECTING);
    hca_tcp_events(tcp, conn, EPOLL_CTL_ADD);
    pthread_mutex_unlock(&conn->tx_lock);
    /* in the user polls' ready set for its life (its close takes it out;
     * a resumed connection's new socket came through here too) */
    (void)epoll_ctl(tcp->ready_epfd, EPOLL_CTL_ADD, conn->fd, &ev);
}

/* ---------------------------------------------------------------- handshake */

static int hca_tcp_send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n <= 0) {
            if ((n < 0) && (errno == EINTR)) {
                continue;
            }
            return -1; /* a fresh socket takes a hello, or is broken */
        }
        p   += n;
        len -= (size_t)n;
    }
    return 0;
}

/* An inbound connection completed its first handshake (tcp->lock held):
 * over the cap of its source address (conn_src_max) or of all
 * (conn_max), the oldest established one that never proved its identity
 * closes to make room; a proven one never does, for a newcomer that has
 * proved nothing yet: that newcomer is refused (0). */
int hca_tcp_conn_admit(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    hca_tcp_conn_t *oldest = NULL, *oldest_src = NULL, *victim;
    uint32_t n = 0, n_src = 0;

    /* established: UP, or LINKING (no socket, but its records and QPs
     * wait for the peer to come back) */
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        int state = atomic_load(&c->state);
        int same;
        if ((c == conn) || c->outbound ||
            ((state != HCA_TCP_CONN_UP) && (state != HCA_TCP_CONN_LINKING))) {
            continue;
        }
        same   = (memcmp(c->src_ip, conn->src_ip, 16) == 0);
        n     += 1;
        n_src += (uint32_t)same;
        if (atomic_load(&c->proven)) {
            continue; /* never closed for a newcomer */
        }
        if ((oldest == NULL) || (c->start_ns <= oldest->start_ns)) {
            oldest = c;
        }
        if (same &&
            ((oldest_src == NULL) || (c->start_ns <= oldest_src->start_ns))) {
            oldest_src = c;
        }
    }
    if (n_src >= tcp->conn_src_max) {
        victim = oldest_src;
    } else if (n >= tcp->conn_max) {
        victim = oldest;
    } else {
        return 1;
    }
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_REFUSED, 1);
    if (victim == NULL) {
        hca_tcp_refusal(tcp, "%u established connections (%u from one "
                        "address), all proven: a new one from pid %u ctx %u "
                        "refused", n, n_src, conn->peer.pid,
                        conn->peer.ctx_id);
        return 0;
    }
    /* an attacker's connections prove nothing: they age out behind the
     * peers that come after them (its socket is closed at the reap) */
    hca_tcp_refusal(tcp, "%u established connections (%u from one "
                    "address): the oldest unproven one (pid %u ctx %u) "
                    "closed", n, n_src, victim->peer.pid,
                    victim->peer.ctx_id);
    hca_tcp_conn_kill(tcp, victim, HCA_WC_RETRY_EXC_ERR);
    return 1;
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
void hca_tcp_connected(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
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
        hca_tcp_conn_drop(tcp, conn);
        return;
    }
    conn->hs.nonce_c   = hca_tcp_nonce();
    conn->hs.conn_incarn = tcp->incarn;
    conn->hs.conn_host = tcp->dev->host_key;
    conn->hs.conn_pid  = tcp->dev->pid;
    conn->hs.conn_ctx  = tcp->dev->ctx_id;
    conn->hs.acc_host  = conn->peer.host;
    conn->hs.acc_pid   = conn->peer.pid;
    conn->hs.acc_ctx   = conn->peer.ctx_id;
    /* a new ephemeral key for every handshake, a redial's too: what an
     * earlier one's key protected stays out of reach */
    hca_tcp_kx_new(conn->hs.kx_c, conn->kx_sk);
    hca_tcp_hello_fill(tcp, &h, HCA_TCP_STEP_HELLO, 0);
    h.dst_host = conn->peer.host;
    h.dst_pid  = conn->peer.pid;
    h.dst_ctx  = conn->peer.ctx_id;
    h.nonce    = conn->hs.nonce_c;
    h.incarn   = tcp->incarn;
    memcpy(h.kx, conn->hs.kx_c, sizeof(h.kx));
    if (hca_tcp_send_all(conn->fd, &h, sizeof(h)) != 0) {
        if (tcp->dev->trace) {
            hca_log("tcp fabric: hello to pid %u ctx %u: %s",
                    conn->peer.pid, conn->peer.ctx_id, strerror(errno));
        }
        hca_tcp_conn_drop(tcp, conn);
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
    uint8_t mac[HCA_TCP_MAC_LEN];
    const uint8_t *join_key;
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
        if (conn->cont == HCA_TCP_CONT_RESUME) {
            /* only the acceptor of our session can answer a RESUME: one
             * that merely holds its address (a relay) cannot */
            hca_tcp_key_mac(mac, conn->key, HCA_TCP_MAC_RESUMED, &conn->hs);
            if (!hca_tcp_mac_equal(in->mac, mac)) {
                hca_tcp_refusal(tcp, "pid %u ctx %u took our resume without "
                                "proving the session: dialling again",
                                conn->peer.pid, conn->peer.ctx_id);
                HCA_TCP_COUNT(tcp, HCA_TCP_CNT_REFUSED, 1);
                hca_tcp_conn_drop(tcp, conn);
                return -1;
            }
        }
        atomic_store(&conn->proven, 1); /* it proved it in its CHALLENGE */
        return 0;
    }
    /* the CHALLENGE: the context we wanted, and it knows its secret */
    conn->hs.nonce_a    = in->nonce;
    conn->hs.acc_incarn = in->incarn;
    memcpy(conn->hs.kx_a, in->kx, sizeof(conn->hs.kx_a));
    hca_tcp_mac(mac, conn->peer.secret, HCA_TCP_MAC_ACCEPTOR, &conn->hs);
    if ((in->src_host != conn->peer.host) || (in->src_pid != conn->peer.pid) ||
        (in->src_ctx != conn->peer.ctx_id) || !hca_tcp_mac_equal(in->mac, mac)) {
        hca_tcp_refusal(tcp, "the listener of pid %u ctx %u did not prove "
                        "it is that context: connection closed",
                        conn->peer.pid, conn->peer.ctx_id);
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_REFUSED, 1);
        hca_tcp_conn_kill(tcp, conn, HCA_WC_REM_ACCESS_ERR);
        return -1;
    }
    if (conn->was_up && (in->incarn != conn->peer_incarn)) {
        /* the peer restarted: what we would send again is not for it */
        hca_log("tcp fabric: pid %u ctx %u is another incarnation than "
                "the one our QPs talked to: they fail", conn->peer.pid,
                conn->peer.ctx_id);
        hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
        return -1;
    }
    ok = hca_tcp_session_key(conn->hs_key, conn->kx_sk, conn->hs.kx_a,
                             &conn->hs) == 0;
    conn->hs_keyed = ok;
    hca_tcp_wipe(conn->kx_sk, sizeof(conn->kx_sk));
    if (!ok) {
        hca_tcp_refusal(tcp, "the listener of pid %u ctx %u sent a "
                        "low-order key: connection closed", conn->peer.pid,
                        conn->peer.ctx_id);
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_REFUSED, 1);
        hca_tcp_conn_kill(tcp, conn, HCA_WC_REM_ACCESS_ERR);
        return -1;
    }
    conn->peer_incarn = in->incarn;
    hca_tcp_hello_fill(tcp, &out, HCA_TCP_STEP_PROOF, 0);
    hca_tcp_mac(out.mac, conn->peer.secret, HCA_TCP_MAC_CONNECTOR, &conn->hs);
    hca_tcp_mac(out.proof, tcp->secret, HCA_TCP_MAC_IDENTITY, &conn->hs);
    if (conn->was_up) {
        /* the same connection back: it knows the session's key */
        out.cont = HCA_TCP_CONT_RESUME;
        hca_tcp_key_mac(out.cont_mac, conn->key, HCA_TCP_MAC_RESUME,
                        &conn->hs);
    } else if ((join_key = hca_tcp_join_key(tcp, conn)) != NULL) {
        /* another path of a session that is UP: its records are ours */
        out.cont = HCA_TCP_CONT_JOIN;
        hca_tcp_key_mac(out.cont_mac, join_key, HCA_TCP_MAC_JOIN, &conn->hs);
    }
    conn->cont = out.cont;
    if (hca_tcp_send_all(conn->fd, &out, sizeof(out)) != 0) {
        hca_tcp_conn_drop(tcp, conn);
        return -1;
    }
    conn->hs_step = HCA_TCP_STEP_PROOF;
    return 1; /* more to read */
}

/* A RESUME refused: an anonymous VERDICT with status, on conn's socket
 * (the caller logs and kills the connection). */
static void hca_tcp_verdict_refuse(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                                   hca_tcp_hello_t *verdict, int status)
{
    hca_tcp_hello_fill(tcp, verdict, HCA_TCP_STEP_VERDICT, 1);
    verdict->status = (uint8_t)status;
    (void)hca_tcp_send_all(conn->fd, verdict, sizeof(*verdict));
}

/* The connection from the same connector (identity and incarnation) that
 * lost its socket, whose session key (the last one, or the one before)
 * conn's RESUME MAC proves, into *key; NULL if there is none. */
static hca_tcp_conn_t *hca_tcp_resumed(hca_tcp_dev_t *tcp,
                                       const hca_tcp_conn_t *conn,
                                       const uint8_t **key)
{
    uint8_t mac[HCA_TCP_MAC_LEN];

    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        int state = atomic_load(&c->state);
        if ((c == conn) || c->outbound || !c->was_up || !c->has_key ||
            ((state != HCA_TCP_CONN_UP) && (state != HCA_TCP_CONN_LINKING)) ||
            (c->peer.host != conn->peer.host) ||
            (c->peer.pid != conn->peer.pid) ||
            (c->peer.ctx_id != conn->peer.ctx_id) ||
            (c->peer_incarn != conn->peer_incarn) ||
            (c->peer_incarn == 0)) {
            continue; /* incarnation 0: a peer that cannot resume */
        }
        hca_tcp_key_mac(mac, c->key, HCA_TCP_MAC_RESUME, &conn->hs);
        if (hca_tcp_mac_equal(conn->cont_mac, mac)) {
            *key = c->key;
            return c;
        }
        hca_tcp_key_mac(mac, c->key_prev, HCA_TCP_MAC_RESUME, &conn->hs);
        if (hca_tcp_mac_equal(conn->cont_mac, mac)) {
            *key = c->key_prev;
            return c;
        }
    }
    return NULL;
}

/* The PROOF asks to resume a connection (tcp->lock and conn->rx_lock
 * held): its socket moves into the old connection, which goes on with its
 * QPs and sequence state; conn, only the handshake's, ends quietly.  -1:
 * conn is dead (refused, or the old one is busy: the connector dials
 * again). */
static int hca_tcp_resume(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                          hca_tcp_hello_t *verdict)
{
    const uint8_t *key  = NULL;
    hca_tcp_conn_t *old = hca_tcp_resumed(tcp, conn, &key);
    struct epoll_event ready_ev = {.events = EPOLLIN};
    uint8_t mac[HCA_TCP_MAC_LEN];
    uint8_t *buf;
    int was;

    if ((old != NULL) && atomic_load(&old->proven)) {
        /* a connection proven to be its peer stays proven only by a
         * proof of that peer over this handshake too */
        hca_tcp_mac(mac, old->proven_by, HCA_TCP_MAC_IDENTITY, &conn->hs);
        if (!hca_tcp_mac_equal(conn->proof, mac)) {
            hca_tcp_verdict_refuse(tcp, conn, verdict, HCA_TCP_HELLO_BAD_SECRET);
            hca_tcp_refusal(tcp, "pid %u ctx %u asked to resume a proven "
                            "connection without proving its identity",
                            conn->peer.pid, conn->peer.ctx_id);
            HCA_TCP_COUNT(tcp, HCA_TCP_CNT_REFUSED, 1);
            hca_tcp_conn_kill(tcp, conn, HCA_WC_REM_ACCESS_ERR);
            return -1;
        }
    }
    if (old == NULL) {
        /* nothing to resume (it timed out here, or never was): its QPs
         * must fail, as the peer's state is gone */
        hca_tcp_verdict_refuse(tcp, conn, verdict, HCA_TCP_HELLO_NO_CONTEXT);
        hca_tcp_refusal(tcp, "pid %u ctx %u asked to resume a connection "
                        "we do not have", conn->peer.pid, conn->peer.ctx_id);
        hca_tcp_conn_kill(tcp, conn, HCA_WC_REM_ACCESS_ERR);
        return -1;
    }
    /* tcp->lock is held: the old receiver's lock is only tried (a poll
     * reading it now: the connector dials again in a moment) */
    if (pthread_mutex_trylock(&old->rx_lock) != 0) {
        hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
        return -1;
    }
    pthread_mutex_lock(&old->tx_lock);
    was = atomic_load(&old->state);
    if (was == HCA_TCP_CONN_UP) {
        /* we had not seen its socket die */
        if (hca_tcp_conn_to(old, HCA_TCP_CONN_LINKING) == HCA_TCP_CONN_UP) {
            atomic_fetch_sub(&tcp->conns_up, 1);
            HCA_TCP_COUNT(tcp, HCA_TCP_CNT_CONNS_LOST, 1);
        }
    }
    if (old->fd >= 0) {
        (void)epoll_ctl(tcp->epfd, EPOLL_CTL_DEL, old->fd, NULL);
        hca_tcp_rx_abort(old);
        close(old->fd);
    }
    hca_tcp_conn_io_reset(old, HCA_TCP_RX_HDR);
    old->fd  = conn->fd;
    conn->fd = -1;
    /* the socket's epoll entries name the old connection from now on
     * (conn is freed soon; a poll reads only the connections the ready
     * set names) */
    hca_tcp_events(tcp, old, EPOLL_CTL_MOD);
    ready_ev.data.ptr = old;
    (void)epoll_ctl(tcp->ready_epfd, EPOLL_CTL_MOD, old->fd, &ready_ev);
    /* what the new socket already read is the old connection's now */
    buf                = old->rx.buf;
    old->rx.buf        = conn->rx.buf;
    old->rx.buf_head   = conn->rx.buf_head;
    old->rx.buf_tail   = conn->rx.buf_tail;
    conn->rx.buf       = buf;
    conn->rx.buf_head  = conn->rx.buf_tail = 0;
    old->hs            = conn->hs;
    /* the connector knows the key it proved (it may be the one before
     * ours: our last VERDICT lost) and, once it reads this VERDICT, the
     * new one */
    hca_tcp_key_mac(verdict->mac, key, HCA_TCP_MAC_RESUMED, &conn->hs);
    memcpy(old->key_prev, key, sizeof(old->key_prev));
    memcpy(old->key, conn->hs_key, sizeof(old->key));
    memcpy(old->proof, conn->proof, sizeof(old->proof));
    old->start_ns      = hca_now_ns();
    atomic_store(&old->last_rx_ns, old->start_ns);
    if (hca_tcp_send_all(old->fd, verdict, sizeof(*verdict)) != 0) {
        pthread_mutex_unlock(&old->tx_lock);
        pthread_mutex_unlock(&old->rx_lock);
        hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
        /* the socket is the old connection's: it waits for the next */
        (void)shutdown(old->fd, SHUT_RDWR);
        return -1;
    }
    /* our own QPs on it send again what is unanswered, before the
     * connection is seen UP (their owners read the state first) */
    hca_tcp_rewind_conn(tcp, old);
    if (atomic_fetch_add(&tcp->conns_up, 1) == 0) {
        atomic_fetch_or(&tcp->dev->fabric_polls, 1u << HCA_FABRIC_TCP);
    }
    (void)hca_tcp_conn_to(old, HCA_TCP_CONN_UP);
    hca_tcp_path_up(tcp, old);
    hca_tcp_events(tcp, old, EPOLL_CTL_MOD); /* as UP: polls read it */
    pthread_mutex_unlock(&old->tx_lock);
    pthread_mutex_unlock(&old->rx_lock);
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_RECONNECTS, 1);
    if (HCA_UNLIKELY(tcp->dev->trace)) {
        hca_log("tcp fabric: connection from pid %u ctx %u resumed",
                old->peer.pid, old->peer.ctx_id);
    }
    /* only the handshake's: no QP, no counters of a loss */
    atomic_store(&conn->fail, HCA_WC_RETRY_EXC_ERR);
    conn->reading = 0;
    (void)hca_tcp_conn_to(conn, HCA_TCP_CONN_DEAD);
    return -1;
}

/* The acceptor's side: the connector's HELLO, then its PROOF. */
static int hca_tcp_hello_acceptor(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                                  const hca_tcp_hello_t *in)
{
    hca_device_t *dev = tcp->dev;
    hca_tcp_hello_t out;
    uint8_t mac[HCA_TCP_MAC_LEN];
    int status        = HCA_TCP_HELLO_OK;

    if (hca_tcp_hello_check(in) && (in->step == HCA_TCP_STEP_PROOF)) {
        hca_tcp_mac(mac, tcp->secret, HCA_TCP_MAC_CONNECTOR, &conn->hs);
    }
    if (!hca_tcp_hello_check(in) || (in->step != conn->hs_step + 1)) {
        status = HCA_TCP_HELLO_BAD_VERSION;
    } else if (in->step == HCA_TCP_STEP_HELLO) {
        if (in->dst_host != dev->host_key) {
            status = HCA_TCP_HELLO_WRONG_HOST;
        } else if ((in->dst_pid != dev->pid) ||
                   (in->dst_ctx != dev->ctx_id)) {
            status = HCA_TCP_HELLO_NO_CONTEXT;
        }
    } else if (!hca_tcp_mac_equal(in->mac, mac)) {
        status = HCA_TCP_HELLO_BAD_SECRET; /* not given our address */
    }
    if ((status == HCA_TCP_HELLO_OK) && (in->step == HCA_TCP_STEP_HELLO)) {
        /* our ephemeral key and the session key, before the CHALLENGE
         * commits to them */
        conn->hs.nonce_c     = in->nonce;
        conn->hs.nonce_a     = hca_tcp_nonce();
        conn->hs.conn_host   = in->src_host;
        conn->hs.conn_pid    = in->src_pid;
        conn->hs.conn_ctx    = in->src_ctx;
        conn->hs.acc_host    = dev->host_key;
        conn->hs.acc_pid     = dev->pid;
        conn->hs.acc_ctx     = dev->ctx_id;
        conn->hs.conn_incarn = in->incarn;
        conn->hs.acc_incarn  = tcp->incarn;
        memcpy(conn->hs.kx_c, in->kx, sizeof(conn->hs.kx_c));
        hca_tcp_kx_new(conn->hs.kx_a, conn->kx_sk);
        if (hca_tcp_session_key(conn->hs_key, conn->kx_sk, conn->hs.kx_c,
                                &conn->hs) != 0) {
            status = HCA_TCP_HELLO_BAD_KEY;
        } else {
            conn->hs_keyed = 1;
        }
        hca_tcp_wipe(conn->kx_sk, sizeof(conn->kx_sk));
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
        /* who it claims to be: proven only by in->proof, later, or
         * (its records) by a JOIN */
        conn->peer_incarn  = in->incarn;
        conn->peer.host    = in->src_host;
        conn->peer.pid     = in->src_pid;
        conn->peer.ctx_id  = in->src_ctx;
        hca_tcp_hello_fill(tcp, &out, HCA_TCP_STEP_CHALLENGE, 0);
        out.nonce  = conn->hs.nonce_a;
        out.incarn = tcp->incarn;
        memcpy(out.kx, conn->hs.kx_a, sizeof(out.kx));
        hca_tcp_mac(out.mac, tcp->secret, HCA_TCP_MAC_ACCEPTOR, &conn->hs);
        conn->hs_step = HCA_TCP_STEP_CHALLENGE;
    } else {
        memcpy(conn->proof, in->proof, sizeof(conn->proof));
        conn->cont = in->cont;
        memcpy(conn->cont_mac, in->cont_mac, sizeof(conn->cont_mac));
        hca_tcp_hello_fill(tcp, &out, HCA_TCP_STEP_VERDICT, 0);
        conn->hs_step = HCA_TCP_STEP_VERDICT;
        if (conn->cont == HCA_TCP_CONT_RESUME) {
            return hca_tcp_resume(tcp, conn, &out);
        }
    }
    if (hca_tcp_send_all(conn->fd, &out, sizeof(out)) != 0) {
        hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
        return -1;
    }
    return (conn->hs_step == HCA_TCP_STEP_VERDICT) ? 0 : 1;
}

/* A handshake message of the other side is in conn->rx.in.hello. */
void hca_tcp_hello_in(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hello_t *in = &conn->rx.in.hello;
    hca_device_t *dev         = tcp->dev;
    int rc = conn->outbound ? hca_tcp_hello_connector(tcp, conn, in) :
                              hca_tcp_hello_acceptor(tcp, conn, in);
    int first;

    conn->rx.got = 0;
    if (rc != 0) {
        return; /* dead, or the next message of the handshake to read */
    }
    if (!conn->outbound && !conn->was_up && !hca_tcp_conn_admit(tcp, conn)) {
        /* at a cap of established connections, all of them proven */
        hca_tcp_conn_kill(tcp, conn, HCA_WC_REM_ACCESS_ERR);
        return;
    }
    hca_tcp_rx_to(conn, HCA_TCP_RX_HDR);
    conn->rx.got   = 0;
    conn->rx.want  = sizeof(hca_tcp_hdr_t);
    /* the session's key from now on (at the first handshake both are it:
     * never a zero key) */
    memcpy(conn->key_prev, conn->was_up ? conn->key : conn->hs_key,
           sizeof(conn->key_prev));
    memcpy(conn->key, conn->hs_key, sizeof(conn->key));
    hca_tcp_wipe(conn->hs_key, sizeof(conn->hs_key));
    conn->hs_keyed = 0;
    conn->has_key  = 1;
    /* up at last, or back on a new socket (we dialled): our QPs send what
     * was posted meanwhile and what is unanswered, woken for it if they
     * sleep, before they see it UP (a post never waited for it) */
    hca_tcp_rewind_conn(tcp, conn);
    first = !conn->was_up;
    if (conn->was_up) {
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_RECONNECTS, 1);
        if (HCA_UNLIKELY(dev->trace)) {
            hca_log("tcp fabric: connection to pid %u ctx %u resumed",
                    conn->peer.pid, conn->peer.ctx_id);
        }
    } else {
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_CONNS, 1);
    }
    conn->was_up    = 1;
    conn->redial_ms = 0;
    if (atomic_fetch_add(&tcp->conns_up, 1) == 0) {
        /* user threads' polls read connections from now on */
        atomic_fetch_or(&dev->fabric_polls, 1u << HCA_FABRIC_TCP);
    }
    if (hca_tcp_conn_to(conn, HCA_TCP_CONN_UP) < 0) {
        return; /* killed meanwhile by a sender */
    }
    if (conn->rq_lead == NULL) {
        /* UP first: an inbound one proves its identity only then */
        hca_tcp_conn_lead(tcp, conn);
    }
    hca_tcp_path_up(tcp, conn);
    if (first) {
        hca_tcp_send_unsent(tcp, conn);
    }
}

/* A new QP's home path (*home) and the connection it sends on first (the
 * return value): the pair's connection with the fewest QPs, and, while
 * that one is still connecting, the UP one with the fewest QPs (the QP
 * goes home once home is UP and nothing of it is unanswered:
 * hca_tcp_path_return).  Each path is dialled if it is not yet
 * (hca_tcp_path.c); their handshakes JOIN one session (docs/TCP-WIRE.md,
 * "Who continues a session"). */
hca_tcp_conn_t *hca_tcp_home_pick(hca_tcp_dev_t *tcp,
                                  const hca_port_addr_t *peer,
                                  hca_tcp_conn_t **home)
{
    int n = hca_tcp_pair_paths(tcp, peer);
    hca_tcp_conn_t *best = NULL, *least = NULL;

    for (int p = 0; p < n; ++p) {
        hca_tcp_conn_t *c = hca_tcp_conn_get(tcp, peer, p);
        int state;
        if (c == NULL) {
            continue;
        }
        state = atomic_load(&c->state);
        if (state == HCA_TCP_CONN_DEAD) {
            continue;
        }
        if ((least == NULL) || (c->qp_refs < least->qp_refs)) {
            least = c;
        }
        if ((state == HCA_TCP_CONN_UP) &&
            ((best == NULL) || (c->qp_refs < best->qp_refs))) {
            best = c;
        }
    }
    if (least == NULL) {
        least = hca_tcp_conn_get(tcp, peer, 0); /* dead: fails at its post */
    }
    *home = least;
    if ((least == NULL) ||
        (atomic_load(&least->state) == HCA_TCP_CONN_UP) || (best == NULL)) {
        return least;
    }
    return best; /* a path UP now, not one still connecting */
}
