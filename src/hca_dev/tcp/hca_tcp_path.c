/*
 * hca_tcp_path.c - a context's paths and failover between them.
 *
 * A context has a path per interface it was given (hca_tcp_netif.c), each
 * with its listener, and its address carries every listener.  A pair of
 * contexts uses as many paths as both have: path i is dialled from our
 * path i's address to the peer's listener i, and is one connection (the
 * connection of hca_tcp_conn.c: its handshake, resume and liveness are
 * per path).  The connections of one peer context are siblings: they
 * share the responder records (conn->rq_lead), so a QP's PSN order and
 * its duplicates' answers do not depend on the path its frames took.
 *
 * A QP is given a home path at connect (the one with the fewest QPs).
 * When the connection it sends on loses its socket (reset, closed,
 * silent, its interface down), its owner moves it to a sibling that is
 * UP and sends again from the first unanswered PSN there, at once: the
 * go-back-N of issue 27, onto another socket.  The lost path is dialled
 * again in the background (hca_tcp_thread.c); it does not time out while
 * a sibling is UP, and a QP goes back home when the home path is UP
 * again and nothing of the QP is unanswered (so no frame of it can pass
 * another).  The QP fails only when every path is gone for the retry
 * timeout.
 *
 * Interfaces going down and up: hca_tcp_link.c.
 */
#include "hca_tcp_fabric.h"
#include "hca_log.h"
#include "hca_queue.h"

#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void hca_tcp_paths_close(hca_tcp_dev_t *tcp)
{
    for (int i = 0; i < HCA_NET_MAX_PATHS; ++i) {
        if ((i < tcp->n_paths) && (tcp->paths[i].listen_fd >= 0)) {
            close(tcp->paths[i].listen_fd);
            tcp->paths[i].listen_fd = -1;
        }
    }
    if (tcp->nl_fd >= 0) {
        close(tcp->nl_fd);
        tcp->nl_fd = -1;
    }
}

int hca_tcp_pair_paths(const hca_tcp_dev_t *tcp, const hca_port_addr_t *peer)
{
    int theirs = 1 + (int)((peer->n_net_more < HCA_NET_MAX_PATHS) ?
                           peer->n_net_more : HCA_NET_MAX_PATHS - 1);

    /* further paths of the peer that we cannot pair are not used */
    return (tcp->n_paths < theirs) ? tcp->n_paths : theirs;
}

int hca_tcp_path_socket(hca_tcp_dev_t *tcp, const hca_port_addr_t *peer,
                        int path, struct sockaddr_storage *ss, uint32_t *len)
{
    const hca_net_addr_t *to = hca_tcp_peer_net(peer, path);
    struct sockaddr_storage local;
    uint32_t local_len;
    int fd;

    if (hca_tcp_sockaddr(to, ss, len) != 0) {
        return -1;
    }
    fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -1;
    }
    /* with several paths, each leaves from its own address (one path:
     * the kernel picks, as it always did) */
    if ((tcp->n_paths > 1) && (path < tcp->n_paths) &&
        (tcp->paths[path].addr.family == to->family)) {
        hca_net_addr_t from = tcp->paths[path].addr;
        from.port = 0;
        (void)hca_tcp_sockaddr(&from, &local, &local_len);
        if (bind(fd, (struct sockaddr*)&local, local_len) != 0) {
            hca_log("tcp fabric: path %d: cannot bind to %s's address: %s",
                    path, tcp->paths[path].ifname, strerror(errno));
        }
    }
    return fd;
}

/* c claims the identity conn has (host, pid, context, incarnation) */
static int hca_tcp_same_claim(const hca_tcp_conn_t *c,
                              const hca_tcp_conn_t *conn)
{
    return (c->peer_incarn == conn->peer_incarn) &&
           (c->peer.host == conn->peer.host) &&
           (c->peer.pid == conn->peer.pid) &&
           (c->peer.ctx_id == conn->peer.ctx_id);
}

/* c and conn both prove they are the peer whose secret we hold (we
 * dialled that peer: an outbound connection with the same claim gives its
 * secret): then they are the same peer's, whoever dialled them. */
static int hca_tcp_both_proven(hca_tcp_dev_t *tcp, hca_tcp_conn_t *c,
                               hca_tcp_conn_t *conn)
{
    const uint64_t *secret = NULL;

    for (hca_tcp_conn_t *o = tcp->conns; o != NULL; o = o->next) {
        if (o->outbound && (atomic_load(&o->state) != HCA_TCP_CONN_DEAD) &&
            hca_tcp_same_claim(o, conn)) {
            secret = &o->peer.secret;
            break;
        }
    }
    if (secret == NULL) {
        return 0; /* a claim alone joins nothing */
    }
    return hca_tcp_conn_is_peer(c, *secret) &&
           hca_tcp_conn_is_peer(conn, *secret);
}

/* joiner's PROOF was a JOIN whose MAC proves key */
static int hca_tcp_join_proves(const hca_tcp_conn_t *joiner,
                               const uint8_t key[HCA_TCP_KEY_LEN])
{
    uint8_t mac[HCA_TCP_MAC_LEN];

    if (joiner->outbound || (joiner->cont != HCA_TCP_CONT_JOIN)) {
        return 0;
    }
    hca_tcp_key_mac(mac, key, HCA_TCP_MAC_JOIN, &joiner->hs);
    return hca_tcp_mac_equal(joiner->cont_mac, mac);
}

/* The connection UP whose session key conn's JOIN proves (its last key,
 * or the one before: its connector may be one handshake behind, our last
 * VERDICT to it lost), NULL if none. */
static hca_tcp_conn_t *hca_tcp_joined(hca_tcp_dev_t *tcp,
                                      const hca_tcp_conn_t *conn)
{
    for (hca_tcp_conn_t *m = tcp->conns; m != NULL; m = m->next) {
        if ((m != conn) && m->has_key && (m->rq_lead != NULL) &&
            (atomic_load(&m->state) != HCA_TCP_CONN_DEAD) &&
            hca_tcp_same_claim(m, conn) &&
            (hca_tcp_join_proves(conn, m->key) ||
             hca_tcp_join_proves(conn, m->key_prev))) {
            return m;
        }
    }
    return NULL;
}

/* A lead UP before conn whose JOIN proved conn's key while conn was still
 * in its handshake (the connector dials a pair's paths at once: the
 * second CHALLENGE it reads JOINs the first's key), NULL if none. */
static hca_tcp_conn_t *hca_tcp_joiner(hca_tcp_dev_t *tcp,
                                      const hca_tcp_conn_t *conn)
{
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        if ((c != conn) && (c->rq_lead == c) && hca_tcp_same_claim(c, conn) &&
            hca_tcp_join_proves(c, conn->key)) {
            return c;
        }
    }
    return NULL;
}

/* The session rule (docs/TCP-WIRE.md, "Who continues a session"): a new
 * connection shares the responder records of an existing one only if it
 * proves that session's key (a JOIN), or both prove, by the secret of an
 * address we hold, that they are that peer.  A connection that proves
 * neither has records of its own: what it claims never reaches a proven
 * peer's PSNs, replay table or errors. */
void hca_tcp_conn_lead(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    hca_tcp_conn_t *m;

    conn->rq_lead = conn;
    if (conn->peer_incarn == 0) {
        return; /* not a context of ours that could have siblings */
    }
    if (((m = hca_tcp_joined(tcp, conn)) != NULL) ||
        ((m = hca_tcp_joiner(tcp, conn)) != NULL)) {
        conn->rq_lead = m->rq_lead;
        conn->rq_lead->lead_refs++;
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_JOINS, 1);
        return;
    }
    if ((conn->cont == HCA_TCP_CONT_JOIN) && HCA_UNLIKELY(conn->trace)) {
        hca_log("tcp fabric: a JOIN from pid %u ctx %u proves no session "
                "here: records of its own", conn->peer.pid, conn->peer.ctx_id);
    }
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        if ((c != conn) && (c->rq_lead == c) && hca_tcp_same_claim(c, conn) &&
            hca_tcp_both_proven(tcp, c, conn)) {
            conn->rq_lead = c;
            c->lead_refs++;
            return;
        }
    }
}

/* The connector of conn (outbound, its CHALLENGE verified): the key of
 * a session with the same peer context, which its PROOF's JOIN then
 * proves - one UP (or resuming), or one of ours whose CHALLENGE came
 * first (paths dialled at once: the acceptor's conn_lead groups them
 * when that one comes UP) - NULL if there is none. */
const uint8_t *hca_tcp_join_key(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const uint8_t *early = NULL;

    for (hca_tcp_conn_t *s = tcp->conns; s != NULL; s = s->next) {
        int state = atomic_load(&s->state);
        int up    = s->has_key && (state != HCA_TCP_CONN_DEAD);
        int hs    = s->outbound && s->hs_keyed && !s->was_up &&
                    (state == HCA_TCP_CONN_HELLO);
        if ((s == conn) || !(up || hs) ||
            (s->peer.host != conn->peer.host) ||
            (s->peer.pid != conn->peer.pid) ||
            (s->peer.ctx_id != conn->peer.ctx_id) ||
            (s->peer_incarn != conn->peer_incarn) ||
            !hca_tcp_conn_is_peer(s, conn->peer.secret)) {
            continue;
        }
        if (up) {
            return s->key; /* a session UP first */
        }
        early = (early != NULL) ? early : s->hs_key;
    }
    return early;
}

/* The identity rule (docs/TCP-WIRE.md, hca_tcp_fabric.h). */
int hca_tcp_conn_proves(hca_tcp_conn_t *conn, uint64_t secret)
{
    uint8_t mac[HCA_TCP_MAC_LEN];

    if (atomic_load(&conn->proven)) {
        return 1;
    }
    if (conn->outbound ||
        (atomic_load(&conn->state) != HCA_TCP_CONN_UP)) {
        return 0;
    }
    hca_tcp_mac(mac, secret, HCA_TCP_MAC_IDENTITY, &conn->hs);
    if (!hca_tcp_mac_equal(conn->proof, mac)) {
        return 0;
    }
    conn->proven_by = secret; /* what a resume of it must prove again */
    atomic_store(&conn->proven, 1);
    return 1;
}

int hca_tcp_conn_is_peer(hca_tcp_conn_t *conn, uint64_t secret)
{
    return conn->outbound ? (conn->peer.secret == secret) :
                            hca_tcp_conn_proves(conn, secret);
}

/* ---------------------------------------------------------------- QPs */

/* c is a path to conn's peer context: a sibling once conn was UP (the
 * handshake told the peer's incarnation); before, a connection we dialled
 * to the same address. */
static int hca_tcp_same_peer(const hca_tcp_conn_t *c,
                             const hca_tcp_conn_t *conn)
{
    if (conn->rq_lead != NULL) {
        return hca_tcp_conn_siblings(c, conn);
    }
    return conn->outbound && c->outbound && (c->rq_lead != NULL) &&
           (c->peer.host == conn->peer.host) &&
           (c->peer.pid == conn->peer.pid) &&
           (c->peer.ctx_id == conn->peer.ctx_id) &&
           (c->peer.secret == conn->peer.secret);
}

/* A sibling of conn that is UP, the one with the fewest QPs (tcp->lock
 * held); NULL if none.  With a secret (the QP's peer's), only one that
 * may carry our requests to that peer: dialled by us to it, or one it
 * dialled that proves it is that peer (the identity rule,
 * docs/TCP-WIRE.md). */
static hca_tcp_conn_t *hca_tcp_path_alive(hca_tcp_dev_t *tcp,
                                          const hca_tcp_conn_t *conn,
                                          const uint64_t *secret)
{
    hca_tcp_conn_t *best = NULL;

    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        if ((c != conn) && hca_tcp_same_peer(c, conn) &&
            ((secret == NULL) ||
             hca_tcp_conn_is_peer(c, *secret)) &&
            (atomic_load(&c->state) == HCA_TCP_CONN_UP) &&
            ((best == NULL) || (c->qp_refs < best->qp_refs))) {
            best = c;
        }
    }
    return best;
}

/* The QP sends on `to` from now on (tcp->lock held, the owner). */
static void hca_tcp_qp_move(hca_qp_t *qp, hca_tcp_conn_t *to)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);

    tq->conn->qp_refs--;
    to->qp_refs++;
    tq->conn = to;
}

int hca_tcp_failover_ok(const hca_tcp_conn_t *conn, int state)
{
    /* a path lost (LINKING, or dialled again), or one that never came up;
     * not one still making its first handshake (a round trip: what is
     * posted meanwhile waits for it, queued), nor one that died for good
     * once up (its peer closed or went away, a bad frame, a refusal: its
     * siblings go too) */
    if (state == HCA_TCP_CONN_DEAD) {
        return !conn->was_up;
    }
    return (state != HCA_TCP_CONN_UP) && conn->was_up;
}

hca_tcp_conn_t *hca_tcp_failover(hca_tcp_dev_t *tcp, hca_qp_t *qp)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    hca_tcp_conn_t *from, *to;
    uint64_t tail, head;

    pthread_mutex_lock(&tcp->lock);
    from = tq->conn;
    to   = hca_tcp_failover_ok(from, atomic_load(&from->state)) ?
           hca_tcp_path_alive(tcp, from, &qp->dest.secret) : NULL;
    if (to == NULL) {
        pthread_mutex_unlock(&tcp->lock);
        return NULL;
    }
    hca_tcp_qp_move(qp, to);
    /* everything unanswered goes again, on the new path, before any new
     * frame: the responder executes what it had not, and answers the
     * rest as duplicates (its records are the siblings' own) */
    tail = atomic_load_explicit(&tq->sent_tail, memory_order_acquire);
    head = atomic_load_explicit(&tq->sent_head, memory_order_relaxed);
    if (tail != head) {
        tq->rtx_psn = tq->sent[tail & tq->sent_mask].psn;
    }
    if (from->was_up) { /* a path lost (not one that never came up) */
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_FAILOVERS, 1);
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_PATH(from->path,
                                            HCA_TCP_PATH_FAILOVERS), 1);
    }
    pthread_mutex_unlock(&tcp->lock);
    if (HCA_UNLIKELY(qp->dev->trace)) {
        hca_log("tcp fabric: qp 0x%x fails over from path %d to path %d, "
                "from psn %u", qp->qpn, from->path, to->path,
                (tail != head) ? tq->rtx_psn : tq->next_psn);
    }
    return to;
}

hca_tcp_conn_t *hca_tcp_path_return(hca_tcp_dev_t *tcp, hca_qp_t *qp)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);

    /* only with nothing unanswered: no frame of the QP on the path it
     * leaves can then be passed by one on its home */
    if ((atomic_load_explicit(&tq->home->state, memory_order_acquire) !=
         HCA_TCP_CONN_UP) ||
        (atomic_load_explicit(&tq->sent_tail, memory_order_acquire) !=
         atomic_load_explicit(&tq->sent_head, memory_order_relaxed)) ||
        (tq->rtx_psn != tq->next_psn)) {
        return tq->conn;
    }
    pthread_mutex_lock(&tcp->lock);
    if (atomic_load(&tq->home->state) == HCA_TCP_CONN_UP) {
        hca_tcp_qp_move(qp, tq->home);
    }
    pthread_mutex_unlock(&tcp->lock);
    return tq->conn;
}

/* A READ's striped answer may have had parts on a path that was lost
 * (its responder chose it): the QP's first unanswered READ is asked
 * again, from its first part missing (the thread, tcp->lock held). */
static void hca_tcp_reads_again(hca_tcp_dev_t *tcp, hca_qp_t *qp)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    uint64_t head    = atomic_load_explicit(&tq->sent_head,
                                            memory_order_acquire);

    for (uint64_t t = atomic_load_explicit(&tq->sent_tail,
                                           memory_order_acquire);
         t != head; ++t) {
        const hca_tcp_sent_t *e = &tq->sent[t & tq->sent_mask];
        if (e->kind == HCA_TCP_SENT_READ) {
            hca_tcp_rewind(tcp, qp, e->psn);
            return;
        }
    }
}

void hca_tcp_failover_ask(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    hca_device_t *dev = tcp->dev;

    if (tcp->n_paths < 2) {
        return;
    }
    /* the QPs with frames unanswered on it: their owners move them at
     * their next poll (hca_tcp_poll_response), woken if asleep.  Idle
     * ones move at their next post. */
    for (uint32_t i = 1; i < HCA_MAX_QP; ++i) {
        hca_qp_t *qp = __atomic_load_n(&dev->qps[i], __ATOMIC_ACQUIRE);
        hca_tcp_qp_t *tq;
        uint32_t cq_idx;

        if ((qp == NULL) || (qp->fabric->type != HCA_FABRIC_TCP) ||
            (qp->state != HCA_QPS_RTS)) {
            continue;
        }
        tq = hca_tcp_qp(qp);
        if ((tq->sent == NULL) ||
            (atomic_load_explicit(&tq->sent_tail, memory_order_acquire) ==
             atomic_load_explicit(&tq->sent_head, memory_order_acquire))) {
            continue;
        }
        if (tq->conn != conn) {
            if (hca_tcp_stripe_uses(tq, conn)) {
                /* parts of its striped WRITE were on it: the WRITE goes
                 * again on the QP's own path, from its first unanswered
                 * PSN */
                hca_tcp_rewind(tcp, qp,
                               tq->sent[atomic_load(&tq->sent_tail) &
                                        tq->sent_mask].psn);
            } else if (hca_tcp_conn_siblings(tq->conn, conn)) {
                hca_tcp_reads_again(tcp, qp);
            }
            continue;
        }
        atomic_store(&tq->move, 1);
        cq_idx = qp->pub->send_cq_idx;
        if (cq_idx < HCA_MAX_CQ) {
            hca_cq_wake_armed(dev, &dev->notify[cq_idx], &dev->notify_self,
                              cq_idx);
        }
    }
}

int hca_tcp_theirs_wins(const hca_tcp_dev_t *tcp,
                        const hca_port_addr_t *peer)
{
    const hca_device_t *dev = tcp->dev;

    if (peer->host != dev->host_key) {
        return peer->host < dev->host_key;
    }
    if (peer->pid != dev->pid) {
        return peer->pid < dev->pid;
    }
    return peer->ctx_id < dev->ctx_id;
}

hca_tcp_conn_t *hca_tcp_path_uncross(hca_tcp_dev_t *tcp, hca_qp_t *qp)
{
    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    hca_tcp_conn_t *to;

    /* only with nothing unanswered: no frame of the QP on the connection
     * it leaves can then be passed by one on the other */
    if ((atomic_load_explicit(&tq->sent_tail, memory_order_acquire) !=
         atomic_load_explicit(&tq->sent_head, memory_order_relaxed)) ||
        (tq->rtx_psn != tq->next_psn)) {
        return tq->conn;
    }
    pthread_mutex_lock(&tcp->lock);
    to = atomic_load(&tq->conn->superseded);
    if ((to != NULL) && (atomic_load(&to->state) == HCA_TCP_CONN_UP)) {
        if (tq->home == tq->conn) {
            tq->home->qp_refs--;
            to->qp_refs++;
            tq->home = to;
        }
        hca_tcp_qp_move(qp, to);
    }
    pthread_mutex_unlock(&tcp->lock);
    return tq->conn;
}

/* Both contexts dialled each other on one path at once: two connections
 * where one does, and a message's answer would not ride on the reply
 * (it goes back on the connection the message came on).  The larger
 * context's QPs move to the smaller's connection. */
static void hca_tcp_path_crossed(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    if (!hca_tcp_theirs_wins(tcp, &conn->peer)) {
        return;
    }
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        hca_tcp_conn_t *ours = conn->outbound ? conn : c;
        hca_tcp_conn_t *theirs = conn->outbound ? c : conn;
        if ((c == conn) || (c->outbound == conn->outbound) ||
            (c->path != conn->path) || !hca_tcp_conn_siblings(c, conn) ||
            (atomic_load(&c->state) != HCA_TCP_CONN_UP)) {
            continue;
        }
        /* theirs carries our requests only if it proves it is the peer
         * we dialled (the identity rule) */
        if (hca_tcp_conn_proves(theirs, ours->peer.secret)) {
            atomic_store(&ours->superseded, theirs);
        }
    }
}

void hca_tcp_path_up(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    hca_tcp_path_crossed(tcp, conn);
    if (tcp->n_paths < 2) {
        return;
    }
    /* the QPs waiting on a lost sibling (lost while no path was UP) move
     * to this one now, rather than wait for theirs */
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        int state = atomic_load(&c->state);
        if ((c != conn) && hca_tcp_conn_siblings(c, conn) &&
            (state != HCA_TCP_CONN_UP) && (state != HCA_TCP_CONN_DEAD)) {
            hca_tcp_failover_ask(tcp, c);
        }
    }
}

hca_tcp_conn_t *hca_tcp_stripe_sibling(hca_tcp_dev_t *tcp, hca_qp_t *qp)
{
    hca_tcp_qp_t *tq     = hca_tcp_qp(qp);
    hca_tcp_conn_t *best = NULL, *from;

    pthread_mutex_lock(&tcp->lock);
    from = tq->conn;
    for (hca_tcp_conn_t *c = tcp->conns; (c != NULL) && (from->rq_lead != NULL);
         c = c->next) {
        /* another path (not the crossed twin of ours), UP, not itself
         * crossed, and allowed to carry our requests (the identity
         * rule, as for a failover) */
        if ((c != from) && (c->path != from->path) &&
            hca_tcp_conn_siblings(c, from) &&
            (atomic_load(&c->superseded) == NULL) &&
            (atomic_load(&c->state) == HCA_TCP_CONN_UP) &&
            hca_tcp_conn_is_peer(c, qp->dest.secret) &&
            ((best == NULL) || (c->qp_refs < best->qp_refs))) {
            best = c;
        }
    }
    if ((best != NULL) && (best != tq->stripe_conn)) {
        if (tq->stripe_conn != NULL) {
            tq->stripe_conn->qp_refs--;
        }
        best->qp_refs++;
        tq->stripe_conn = best;
    }
    pthread_mutex_unlock(&tcp->lock);
    return best;
}

hca_tcp_conn_t *hca_tcp_answer_sibling(hca_tcp_dev_t *tcp,
                                       hca_tcp_conn_t *conn)
{
    hca_tcp_conn_t *best = NULL;

    /* the peer's identity on both proven, not claimed: a READ's data goes
     * only to the context that asked for it */
    if ((conn->rq_lead == NULL) || !atomic_load(&conn->proven)) {
        return NULL;
    }
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        if ((c != conn) && (c->path != conn->path) &&
            hca_tcp_conn_siblings(c, conn) && atomic_load(&c->proven) &&
            (atomic_load(&c->superseded) == NULL) &&
            (atomic_load(&c->state) == HCA_TCP_CONN_UP) &&
            ((best == NULL) || (c->qp_refs < best->qp_refs))) {
            best = c;
        }
    }
    return best;
}

uint64_t hca_tcp_path_rate(hca_tcp_conn_t *conn)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    int fd        = conn->fd;

    memset(&ti, 0, sizeof(ti));
    if ((fd < 0) ||
        (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) ||
        (len < offsetof(struct tcp_info, tcpi_delivery_rate) +
               sizeof(ti.tcpi_delivery_rate))) {
        return 0;
    }
    return ti.tcpi_delivery_rate;
}

uint32_t hca_tcp_stripe_split(uint32_t n, uint64_t first, uint64_t second)
{
    uint32_t split;

    if ((first == 0) || (second == 0)) {
        split = n / 2;
    } else {
        split = (uint32_t)(((__uint128_t)n * first) / (first + second));
    }
    return (split < 1) ? 1 : (split > n - 1) ? n - 1 : split;
}

int hca_tcp_path_keeps(hca_tcp_dev_t *tcp, const hca_tcp_conn_t *conn)
{
    return (tcp->n_paths > 1) && (hca_tcp_path_alive(tcp, conn, NULL) != NULL);
}
