/*
 * hca_tcp_thread.c - the tcp fabric's thread, one per device context: it
 * accepts connections, completes our own connects, has every connection
 * read (hca_tcp_rx.c: so that WRITE, READ and atomics complete without
 * the target process calling the device) and its answers sent, keeps idle
 * connections alive and finds silent or broken ones; and a user thread's
 * poll, which reads while the process polls.
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

static char hca_tcp_wake_tag, hca_tcp_nl_tag;

/* The thread's wake while a process polls (every HCA_TCP_WATCH_MS):
 * answers a poll held and did not send are sent. */
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

static void hca_tcp_accept(hca_tcp_dev_t *tcp, hca_tcp_path_t *path)
{
    for (;;) {
        hca_tcp_conn_t *conn;
        struct sockaddr_storage ss;
        socklen_t sslen = sizeof(ss);
        uint8_t ip[16];
        int fd = accept4(path->listen_fd, (struct sockaddr*)&ss, &sslen,
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
                (void)epoll_ctl(tcp->epfd, EPOLL_CTL_DEL, path->listen_fd,
                                NULL);
                path->listen_paused = 1;
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
            conn->path = (int)(path - tcp->paths);
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
        int state            = atomic_load(&conn->state);
        if (state == HCA_TCP_CONN_LINKING) {
            /* its socket lost: closed now (the peer sees it), the
             * connection lives on (hca_tcp_timers dials again) */
            (void)hca_tcp_close_fd(tcp, conn);
        }
        if (state != HCA_TCP_CONN_DEAD) {
            pp = &conn->next;
            continue;
        }
        if (!conn->dead_woken) {
            /* the owners of its QPs may sleep on their send CQs, with WQEs
             * that will never be answered (or never sent: posted before
             * it was UP): woken, their next poll fails them, or moves
             * them to another path (hca_tcp_poll_response) */
            conn->dead_woken = 1;
            hca_tcp_rewind_conn(tcp, conn);
        }
        if (hca_tcp_close_fd(tcp, conn) != 0) {
            pp = &conn->next; /* a poll reads it: the next pass frees it */
            continue;
        }
        if ((conn->qp_refs == 0) && (conn->lead_refs == 0)) {
            for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
                hca_tcp_conn_t *to = conn;
                /* no connection names it as the one to move to */
                (void)atomic_compare_exchange_strong(&c->superseded, &to,
                                                     NULL);
            }
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

/* The socket of a connection that can resume is lost (it goes LINKING
 * and comes back), of one that cannot the connection dies: its QPs fail
 * (tcp->lock held). */
static void hca_tcp_lost(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                         const char *what)
{
    int resumable = conn->was_up && (conn->peer_incarn != 0);

    hca_log("tcp fabric: pid %u ctx %u %s for %u ms: %s", conn->peer.pid,
            conn->peer.ctx_id, what,
            resumable ? tcp->timeout_ms / 2 : tcp->timeout_ms,
            resumable ? "its socket is closed, the connection goes on" :
                        "its QPs fail");
    hca_tcp_conn_drop(tcp, conn);
}

/* A connection whose socket was lost (LINKING, or dialling again): the
 * retry timeout since the last byte from its peer fails it; the dialler
 * dials again, with a backoff.  1 if it died. */
static int hca_tcp_linking(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                           int state, uint64_t now, uint64_t limit)
{
    uint64_t attempt = limit / 4;

    if (atomic_load(&conn->ask_failover) &&
        atomic_exchange(&conn->ask_failover, 0)) {
        hca_tcp_failover_ask(tcp, conn);
    }

    if ((hca_tcp_age(now, atomic_load(&conn->last_rx_ns)) > limit) &&
        hca_tcp_path_keeps(tcp, conn)) {
        /* another path to the peer is up: this one is dialled again in
         * the background for as long as that lasts, and times out only
         * once every path is gone */
        atomic_store(&conn->last_rx_ns, now);
    }
    if (hca_tcp_age(now, atomic_load(&conn->last_rx_ns)) > limit) {
        hca_log("tcp fabric: nothing from pid %u ctx %u for %u ms (its "
                "connection lost and not back): its QPs fail",
                conn->peer.pid, conn->peer.ctx_id, tcp->timeout_ms);
        hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
        return 1;
    }
    if (hca_tcp_peer_gone(tcp, conn)) {
        /* a peer of this host that is gone is known at once */
        hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
        return 1;
    }
    if (state != HCA_TCP_CONN_LINKING) {
        /* an attempt (connect, handshake) gets a part of the timeout */
        attempt = (attempt < 200000000ull) ? 200000000ull : attempt;
        attempt = (attempt < HCA_TCP_CONNECT_MS * 1000000ull) ? attempt :
                  HCA_TCP_CONNECT_MS * 1000000ull;
        if (hca_tcp_age(now, conn->start_ns) > attempt) {
            hca_tcp_conn_drop(tcp, conn);
        }
        return 0;
    }
    if ((conn->fd >= 0) && (hca_tcp_close_fd(tcp, conn) != 0)) {
        return 0; /* a poll reads it: the next pass */
    }
    if (conn->outbound && (conn->redial_ms == 0) &&
        hca_tcp_path_keeps(tcp, conn)) {
        /* another path is up: the QPs move there (their owners, woken by
         * the loss) before this one is dialled again, in the background */
        conn->redial_ms = HCA_TCP_REDIAL_MAX_MS;
        conn->redial_ns = now + HCA_TCP_REDIAL_MAX_MS * 1000000ull;
    }
    if (conn->outbound && (now >= conn->redial_ns) &&
        !atomic_load(&tcp->paths[conn->path].down)) {
        conn->redial_ms = (conn->redial_ms == 0) ? 1 :
                          (conn->redial_ms * 2 < HCA_TCP_REDIAL_MAX_MS) ?
                          conn->redial_ms * 2 : HCA_TCP_REDIAL_MAX_MS;
        conn->redial_ns = now + conn->redial_ms * 1000000ull;
        (void)hca_tcp_redial(tcp, conn);
    }
    return 0;
}

/* Injected periodic resets (HCA_FAULT tcp_reset_ms): 1 if now. */
static int hca_tcp_reset_due(hca_tcp_dev_t *tcp, uint64_t now)
{
    const hca_fault_cfg_t *f = &tcp->dev->fault;

    if (HCA_LIKELY(!f->enabled) || (f->tcp_reset_ms == 0) ||
        ((f->tcp_reset_for_ms != 0) &&
         (now - tcp->open_ns > f->tcp_reset_for_ms * 1000000ull)) ||
        (now - tcp->reset_ns < f->tcp_reset_ms * 1000000ull)) {
        return 0;
    }
    tcp->reset_ns = now;
    return 1;
}

/* Injected listener restart (HCA_FAULT tcp_relisten_ms): the listener
 * and every connection closed once, the listener bound again on its port
 * 100 ms later, as a peer whose listener restarts (tcp->lock held). */
static void hca_tcp_relisten(hca_tcp_dev_t *tcp, uint64_t now)
{
    const hca_fault_cfg_t *f = &tcp->dev->fault;
    hca_tcp_path_t *path     = &tcp->paths[0];
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = path};

    if (HCA_LIKELY(!f->enabled) || (f->tcp_relisten_ms == 0)) {
        return;
    }
    if ((tcp->relisten == 0) &&
        (now - tcp->open_ns >= f->tcp_relisten_ms * 1000000ull)) {
        (void)epoll_ctl(tcp->epfd, EPOLL_CTL_DEL, path->listen_fd, NULL);
        close(path->listen_fd);
        path->listen_fd = -1;
        for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
            if (atomic_load(&c->state) == HCA_TCP_CONN_UP) {
                hca_tcp_conn_drop(tcp, c);
            }
        }
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_FAULTS, 1);
        hca_log("tcp fabric: injected: listener on port %u closed",
                path->addr.port);
        tcp->relisten    = 1;
        tcp->relisten_ns = now + 100000000ull;
        atomic_store(&tcp->linking, 1);
    } else if ((tcp->relisten == 1) && (now >= tcp->relisten_ns)) {
        if (hca_tcp_listen(path, path->addr.port, path->addr.port) != 0) {
            tcp->relisten_ns = now + 10000000ull; /* its port in use: again */
            return;
        }
        (void)epoll_ctl(tcp->epfd, EPOLL_CTL_ADD, path->listen_fd, &ev);
        hca_log("tcp fabric: injected: listener on port %u again",
                path->addr.port);
        tcp->relisten = 2;
    }
}

/* Keepalives on quiet connections; silent, stuck and parked ones; lost
 * ones dial again or time out. */
static int hca_tcp_timers(hca_tcp_dev_t *tcp)
{
    uint64_t now, limit = tcp->timeout_ms * 1000000ull;
    int dead = 0, parked = 0, n_resumed = 0, linking = 0, reset;
    hca_tcp_conn_t *resumed[HCA_TCP_POLL_MAX];

    pthread_mutex_lock(&tcp->lock);
    now   = hca_now_ns();
    reset = hca_tcp_reset_due(tcp, now);
    hca_tcp_relisten(tcp, now);
    for (hca_tcp_conn_t *conn = tcp->conns; conn != NULL; conn = conn->next) {
        int state = atomic_load(&conn->state);
        /* a connection that can resume gives up its socket at half the
         * retry timeout of silence, and fails at the whole */
        int resumable = conn->was_up && (conn->peer_incarn != 0);
        uint64_t silent = resumable ? limit / 2 : limit;

        if (state == HCA_TCP_CONN_DEAD) {
            dead = 1;
            continue;
        }
        if (conn->was_up && (state != HCA_TCP_CONN_UP)) {
            linking = 1;
            dead   |= hca_tcp_linking(tcp, conn, state, now, limit);
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
        if (reset && resumable) {
            HCA_TCP_COUNT(tcp, HCA_TCP_CNT_FAULTS, 1);
            hca_tcp_conn_drop(tcp, conn);
            linking = 1;
            continue;
        }
        if (!conn->reading || (conn->rx.state == HCA_TCP_RX_PARKED)) {
            /* we do not read it (a full ring or answer queue of ours):
             * its keepalives wait behind what we left there.  A full
             * answer queue is the peer's to drain: hca_tcp_tx_stuck
             * judges that (a peer that drains it slowly, a large READ's
             * answers on a slow link, is alive) */
            atomic_store(&conn->last_rx_ns, now);
        } else if (hca_tcp_age(now, atomic_load(&conn->last_rx_ns)) >
                   silent) {
            hca_tcp_lost(tcp, conn, "silent");
            dead = 1;
            continue;
        }
        if (hca_tcp_tx_stuck(conn, now, silent)) {
            hca_tcp_lost(tcp, conn, "took none of our answers");
            dead = 1;
            continue;
        }
        if (pthread_mutex_trylock(&conn->rx_lock) == 0) {
            if (hca_tcp_rx_stalled(conn, now, silent)) {
                pthread_mutex_unlock(&conn->rx_lock);
                hca_tcp_lost(tcp, conn, "sent no more of a frame's payload");
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
        if (hca_tcp_age(now, atomic_load(&conn->last_tx_ns)) > limit / 8) {
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
    for (int i = 0; i < tcp->n_paths; ++i) {
        hca_tcp_path_t *path = &tcp->paths[i];
        if (path->listen_paused && (path->listen_fd >= 0)) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = path};
            path->listen_paused = 0;
            (void)epoll_ctl(tcp->epfd, EPOLL_CTL_ADD, path->listen_fd, &ev);
        }
    }
    atomic_store(&tcp->linking, linking || (tcp->relisten == 1));
    if (dead) {
        hca_tcp_reap(tcp);
    }
    return parked;
}

/* Polled by the process (a user poll in the last HCA_TCP_POLLED_NS, as the
 * thread sees the polls' count change), the thread stops waiting for its
 * connections' data; not polled, it reads them again.  The switch
 * re-registers every live connection.
 *
 * While the process polls, the thread looks every HCA_TCP_WATCH_MS only:
 * it shares a CPU with the poller when the process is pinned, and every
 * wake preempts it, at worst while the thread holds a lock the poller
 * then waits for until the thread runs again.  Woken every 1 ms, as
 * before, it cost the pinned hosts level (docs/PERF.md) 40 % of tag_bw
 * and of a 1 MiB get's bandwidth.  The price: a process that stops
 * polling has its reading taken over, and the answers its last polls
 * held sent, within 2 watches. */
#define HCA_TCP_WATCH_MS  10
#define HCA_TCP_POLLED_NS (2 * HCA_TCP_WATCH_MS * 1000000ull)

static void hca_tcp_poll_mode(hca_tcp_dev_t *tcp, uint64_t now)
{
    for (;;) {
        uint64_t seq = atomic_load_explicit(&tcp->user_poll_seq,
                                            memory_order_relaxed);
        int polled;

        if (atomic_load_explicit(&tcp->poller_armed, memory_order_relaxed) &&
            atomic_exchange(&tcp->poller_armed, 0)) {
            /* the process sleeps: its polls so far do not count */
            tcp->poll_seq_seen = seq;
            tcp->poll_seen_ns  = 0;
        } else if (seq != tcp->poll_seq_seen) {
            tcp->poll_seq_seen = seq;
            tcp->poll_seen_ns  = now; /* within a watch of the poll */
        }
        /* a poll reads at most HCA_TCP_POLL_MAX connections: with more
         * the thread keeps reading them all */
        polled = (tcp->poll_seen_ns != 0) &&
                 (now < tcp->poll_seen_ns + HCA_TCP_POLLED_NS) &&
                 (atomic_load(&tcp->conns_up) <= HCA_TCP_POLL_MAX);
        if (polled != tcp->user_polls) {
            pthread_mutex_lock(&tcp->lock);
            tcp->user_polls = polled; /* seq_cst: see below */
            for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
                if ((c->fd >= 0) &&
                    (atomic_load(&c->state) == HCA_TCP_CONN_UP)) {
                    pthread_mutex_lock(&c->tx_lock);
                    hca_tcp_events(tcp, c, EPOLL_CTL_MOD);
                    pthread_mutex_unlock(&c->tx_lock);
                }
            }
            pthread_mutex_unlock(&tcp->lock);
        }
        /* an arm meanwhile: the process stored poller_armed, then loaded
         * user_polls; we stored user_polls, now load poller_armed (all
         * seq_cst): if it saw 0 and did not wake us, we see its arm */
        if (!polled || !atomic_load(&tcp->poller_armed)) {
            return;
        }
    }
}

/* The timer pass's period: keepalives (an eighth of the retry timeout)
 * and the silent check at a sixteenth, the connect limit at a quarter of
 * its own; injected periodic resets at theirs. */
static uint64_t hca_tcp_period_ns(const hca_tcp_dev_t *tcp)
{
    uint64_t ms = tcp->timeout_ms / 16;

    ms = (ms < HCA_TCP_CONNECT_MS / 4) ? ms : HCA_TCP_CONNECT_MS / 4;
    if (HCA_UNLIKELY(tcp->dev->fault.enabled) &&
        (tcp->dev->fault.tcp_reset_ms != 0) &&
        (tcp->dev->fault.tcp_reset_ms < ms)) {
        ms = tcp->dev->fault.tcp_reset_ms;
    }
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
        int ms = (int)(hca_tcp_period_ns(tcp) / 1000000ull);
        int n;

        if (atomic_load(&tcp->parked) || atomic_load(&tcp->linking)) {
            ms = 1;
        } else if (tcp->user_polls && (ms > HCA_TCP_WATCH_MS)) {
            ms = HCA_TCP_WATCH_MS;
        }
        n = epoll_wait(tcp->epfd, ev, 32, ms);

        reap = 0; /* after the batch: a freed connection may be in it */
        for (int i = 0; i < n; ++i) {
            hca_tcp_conn_t *conn = ev[i].data.ptr;

            if (ev[i].data.ptr == &hca_tcp_wake_tag) {
                uint64_t v;
                (void)read(tcp->wake_fd, &v, sizeof(v));
                continue;
            }
            if ((ev[i].data.ptr >= (void*)tcp->paths) &&
                (ev[i].data.ptr < (void*)(tcp->paths + tcp->n_paths))) {
                hca_tcp_accept(tcp, ev[i].data.ptr);
                continue;
            }
            if (ev[i].data.ptr == &hca_tcp_nl_tag) {
                hca_tcp_links_changed(tcp);
                continue;
            }
            if (ev[i].events & (EPOLLERR | EPOLLHUP)) {
                if (atomic_load(&conn->state) == HCA_TCP_CONN_CONNECTING) {
                    hca_tcp_connected(tcp, conn); /* finds the error */
                } else {
                    pthread_mutex_lock(&conn->rx_lock);
                    (void)hca_tcp_read(tcp, conn); /* then the close */
                    pthread_mutex_unlock(&conn->rx_lock);
                    hca_tcp_conn_drop(tcp, conn);
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
                 * room for answers): the socket is gone */
                hca_tcp_conn_drop(tcp, conn);
                reap = 1;
                continue;
            }
            if (ev[i].events & EPOLLOUT) {
                hca_tcp_writable(tcp, conn);
            }
            reap |= (atomic_load(&conn->state) == HCA_TCP_CONN_DEAD) ||
                    (atomic_load(&conn->state) == HCA_TCP_CONN_LINKING);
        }
        if (reap) {
            hca_tcp_reap(tcp);
        }
        now = hca_now_ns();
        hca_tcp_poll_mode(tcp, now);
        hca_tcp_answers_held(tcp); /* after: see hca_tcp_poll_read */
        if (atomic_load(&tcp->parked) || atomic_load(&tcp->linking) ||
            (now >= next_timer)) {
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

/* A user poll happened: counted without a locked instruction (two
 * pollers may lose a count; the thread only asks whether it moved). */
static inline void hca_tcp_polled(hca_tcp_dev_t *tcp)
{
    atomic_store_explicit(&tcp->user_poll_seq,
                          atomic_load_explicit(&tcp->user_poll_seq,
                                               memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

/* 1 if a live connection still holds answers for a frame of ours to carry
 * (or the list is busy: then as if it did).  The flag is cleared before
 * the look and set again if one does, so a poll that holds an answer
 * meanwhile (it sets the flag after its push) is never lost.  A reply
 * that carried the answers leaves nothing held: the poll after it goes
 * back to asking the ready set, not to a recv that hears EAGAIN. */
static int hca_tcp_holds_answers(hca_tcp_dev_t *tcp)
{
    int held = 0;

    if (pthread_mutex_trylock(&tcp->lock) != 0) {
        return 1;
    }
    atomic_store(&tcp->answers_held, 0);
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        if ((__atomic_load_n(&c->jobs_tail, __ATOMIC_ACQUIRE) !=
             __atomic_load_n(&c->jobs_head, __ATOMIC_ACQUIRE)) &&
            (atomic_load(&c->state) == HCA_TCP_CONN_UP)) {
            held = 1;
            break;
        }
    }
    if (held) {
        atomic_store(&tcp->answers_held, 1);
    }
    pthread_mutex_unlock(&tcp->lock);
    return held;
}

/* How many ready sockets a poll asks the ready set for: with fewer it
 * reads only those, with as many (more may be ready) every one. */
#define HCA_TCP_READY_ASK 8

static int hca_tcp_is_ready(hca_tcp_conn_t *c, const struct epoll_event *ev,
                            int n_ready)
{
    for (int i = 0; i < n_ready; ++i) {
        if (ev[i].data.ptr == c) {
            return 1;
        }
    }
    return 0;
}

int hca_tcp_poll(hca_device_t *dev)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(dev);
    hca_tcp_conn_t *mine[HCA_TCP_POLL_MAX];
    struct epoll_event ready[HCA_TCP_READY_ASK];
    int n = 0, all = 1, holding = 0, n_ready = -1;

    if ((tcp == NULL) || (atomic_load_explicit(&tcp->conns_up,
                                               memory_order_relaxed) == 0)) {
        return 0;
    }
    if (!atomic_load_explicit(&tcp->rx_buffered, memory_order_relaxed) &&
        (!atomic_load_explicit(&tcp->answers_held, memory_order_relaxed) ||
         !hca_tcp_holds_answers(tcp))) {
        /* nothing read and kept, no answer held: a socket with input is
         * all there can be, and the ready set tells without taking any
         * socket's lock (a recv on each would, against the sender's
         * softirq delivering into it); then only those are read (a
         * superseded connection or an idle peer's costs no recv that
         * hears EAGAIN, before the message is delivered) */
        n_ready = epoll_wait(tcp->ready_epfd, ready, HCA_TCP_READY_ASK, 0);
        if (n_ready <= 0) {
            hca_tcp_polled(tcp);
            return 0;
        }
        if (n_ready == HCA_TCP_READY_ASK) {
            n_ready = -1; /* maybe more: all */
        }
    }
    if (pthread_mutex_trylock(&tcp->lock) != 0) {
        return 0; /* the thread is at it */
    }
    atomic_store_explicit(&tcp->rx_buffered, 0, memory_order_relaxed);
    /* the connections we can take now (a locked one is being read) */
    for (hca_tcp_conn_t *c = tcp->conns; (c != NULL) && (n < HCA_TCP_POLL_MAX);
         c = c->next) {
        if ((atomic_load(&c->state) == HCA_TCP_CONN_UP) && c->reading) {
            if ((n_ready > 0) && !hca_tcp_is_ready(c, ready, n_ready)) {
                /* compared, not followed: an event may name a connection
                 * freed since (its address reused, it is read: no harm) */
                all = 0;
                continue;
            }
            if (pthread_mutex_trylock(&c->rx_lock) == 0) {
                mine[n++] = c;
            } else {
                all = 0;
            }
        }
    }
    all = all && (n < HCA_TCP_POLL_MAX);
    pthread_mutex_unlock(&tcp->lock);
    if (n > 0) {
        hca_tcp_polled(tcp);
    }
    for (int i = 0; i < n; ++i) {
        /* rx_lock held: reap cannot free it; -1 leaves it to the thread,
         * which sees its hangup */
        hca_tcp_conn_t *c = mine[i];
        hca_tcp_poll_read(tcp, c);
        holding |= (c->jobs_tail != c->jobs_head);
        pthread_mutex_unlock(&c->rx_lock);
    }
    if (all && !holding &&
        atomic_load_explicit(&tcp->answers_held, memory_order_relaxed)) {
        /* every live connection was read and none holds an answer: the
         * polls go back to asking the ready set only */
        atomic_store(&tcp->answers_held, 0);
    }
    return n;
}

void hca_tcp_armed(hca_device_t *dev)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(dev);
    uint64_t one       = 1;

    /* a process that polled, and now waits for an event: without this the
     * thread would read its sockets only after its watch noticed the
     * polls stopped (up to HCA_TCP_POLLED_NS), and a message that came
     * meanwhile would wake the process that late.  One write when a
     * polling process arms; none when the thread already reads. */
    if (tcp == NULL) {
        return;
    }
    atomic_store(&tcp->poller_armed, 1);
    if (atomic_load(&tcp->user_polls)) { /* else see hca_tcp_poll_mode */
        (void)write(tcp->wake_fd, &one, sizeof(one));
    }
}

int hca_tcp_thread_start(hca_tcp_dev_t *tcp)
{
    struct epoll_event ev = {.events = EPOLLIN};
    struct rlimit rl;
    int rc;

    /* half-open connections take at most a quarter of the fds, the
     * established inbound ones at most half (a cap below the fd limit:
     * the oldest unproven one closes before accept runs out of fds); the
     * rest is for our own dialled connections and the process */
    tcp->half_open_max = HCA_TCP_HALF_OPEN_MAX;
    if ((getrlimit(RLIMIT_NOFILE, &rl) == 0) &&
        (rl.rlim_cur != RLIM_INFINITY)) {
        if (rl.rlim_cur / 4 < tcp->half_open_max) {
            tcp->half_open_max = (rl.rlim_cur / 4 > 4) ?
                                 (uint32_t)(rl.rlim_cur / 4) : 4;
        }
        if (rl.rlim_cur / 2 < tcp->conn_max) {
            tcp->conn_max = (rl.rlim_cur / 2 > 4) ?
                            (uint32_t)(rl.rlim_cur / 2) : 4;
        }
    }
    tcp->epfd       = epoll_create1(EPOLL_CLOEXEC);
    tcp->ready_epfd = epoll_create1(EPOLL_CLOEXEC);
    tcp->wake_fd    = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if ((tcp->epfd < 0) || (tcp->ready_epfd < 0) || (tcp->wake_fd < 0)) {
        rc = -errno;
        goto err;
    }
    for (int i = 0; i < tcp->n_paths; ++i) {
        ev.data.ptr = &tcp->paths[i];
        if (epoll_ctl(tcp->epfd, EPOLL_CTL_ADD, tcp->paths[i].listen_fd,
                      &ev) != 0) {
            rc = -errno;
            goto err;
        }
    }
    /* our interfaces going down and up: their paths' connections fail
     * over at once (without it, at the silence limit) */
    tcp->nl_fd = hca_tcp_links_watch();
    if (tcp->nl_fd >= 0) {
        ev.data.ptr = &hca_tcp_nl_tag;
        (void)epoll_ctl(tcp->epfd, EPOLL_CTL_ADD, tcp->nl_fd, &ev);
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
    if (tcp->ready_epfd >= 0) {
        close(tcp->ready_epfd);
    }
    tcp->epfd = tcp->wake_fd = tcp->ready_epfd = -1;
    return rc;
}

void hca_tcp_thread_stop(hca_tcp_dev_t *tcp)
{
    uint64_t one = 1;

    tcp->running = 0;
    (void)write(tcp->wake_fd, &one, sizeof(one));
    pthread_join(tcp->thread, NULL);
    close(tcp->epfd);
    close(tcp->ready_epfd);
    close(tcp->wake_fd);
}
