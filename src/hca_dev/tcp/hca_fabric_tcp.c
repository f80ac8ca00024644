/*
 * hca_fabric_tcp.c - the tcp fabric: peers on other hosts, through one
 * TCP connection per pair of device contexts.  Its ops table, the device
 * open and close of its listener and thread, connect, and liveness.  The
 * rest is in the hca_tcp_*.c files (see hca_tcp_fabric.h).
 */
#include "hca_tcp_fabric.h"
#include "hca_log.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdio.h>

/* ---------------------------------------------------------------- device */

/* The retry timeout: nothing received from a peer for this long (its
 * connection lost and not back, or silent) fails its QPs. */
static uint32_t hca_tcp_timeout_ms(const hca_device_t *dev)
{
    const char *env = getenv("HCA_TCP_RETRY_TIMEOUT_MS");

    if (dev->open_attr.peer_timeout_ms != 0) {
        return dev->open_attr.peer_timeout_ms;
    }
    if ((env == NULL) || (atoi(env) <= 0)) {
        env = getenv("HCA_TCP_TIMEOUT_MS"); /* its first name */
    }
    if ((env != NULL) && (atoi(env) > 0)) {
        return (uint32_t)atoi(env);
    }
    return HCA_TCP_TIMEOUT_MS;
}

/* The size from which a WRITE or READ may stripe over two paths
 * (HCA_TCP_STRIPE_MIN; the environment's HCA_TCP_STRIPE_MIN, in bytes:
 * 0 never; it is raised to HCA_TCP_STRIPE_MIN at least). */
static uint64_t hca_tcp_stripe_min(void)
{
    const char *env = getenv("HCA_TCP_STRIPE_MIN");
    char *end;
    unsigned long long v;

    if ((env == NULL) || (*env == '\0')) {
        return HCA_TCP_STRIPE_MIN;
    }
    v = strtoull(env, &end, 0);
    if (*end != '\0') {
        hca_log("HCA_TCP_STRIPE_MIN=%s: not a number of bytes, %u used",
                env, HCA_TCP_STRIPE_MIN);
        return HCA_TCP_STRIPE_MIN;
    }
    if (v == 0) {
        return UINT64_MAX; /* never */
    }
    return (v < HCA_TCP_STRIPE_MIN) ? HCA_TCP_STRIPE_MIN : v;
}

/* A cap on established inbound connections (HCA_TCP_CONN_SRC,
 * HCA_TCP_CONN_MAX): the environment's variable of that name, a count of
 * 1 or more, else dflt. */
static uint32_t hca_tcp_conn_cap(const char *name, uint32_t dflt)
{
    const char *env = getenv(name);
    char *end;
    unsigned long long v;

    if ((env == NULL) || (*env == '\0')) {
        return dflt;
    }
    v = strtoull(env, &end, 0);
    if ((*end != '\0') || (v == 0) || (v > UINT32_MAX)) {
        hca_log("%s=%s: not a count of connections, %u used", name, env,
                dflt);
        return dflt;
    }
    return (uint32_t)v;
}

static int hca_tcp_dev_open(hca_device_t *dev)
{
    const char *setting = dev->open_attr.net_devices;
    hca_tcp_dev_t *tcp;
    int rc;

    if (setting == NULL) {
        setting = getenv("HCA_NET_DEVICES");
    }
    tcp = calloc(1, sizeof(*tcp));
    if (tcp == NULL) {
        return -ENOMEM;
    }
    tcp->dev        = dev;
    tcp->nl_fd      = -1;
    tcp->epfd       = -1;
    tcp->ready_epfd = -1;
    tcp->wake_fd    = -1;
    tcp->timeout_ms = hca_tcp_timeout_ms(dev);
    tcp->stripe_min = hca_tcp_stripe_min();
    tcp->conn_src_max = hca_tcp_conn_cap("HCA_TCP_CONN_SRC",
                                         HCA_TCP_CONN_SRC);
    tcp->conn_max     = hca_tcp_conn_cap("HCA_TCP_CONN_MAX",
                                         HCA_TCP_CONN_MAX);
    tcp->open_ns    = hca_now_ns();
    pthread_mutex_init(&tcp->lock, NULL);
    if (hca_tcp_auth_init() != 0) {
        rc = -EIO; /* no libsodium: no handshake, no nonce */
        goto err;
    }
    do {
        tcp->incarn = hca_tcp_nonce(); /* 0 says "cannot resume" */
    } while (tcp->incarn == 0);
    tcp->scratch = malloc(HCA_TCP_SEG_MAX);
    if (tcp->scratch == NULL) {
        rc = -ENOMEM;
        goto err;
    }
    do {
        tcp->secret = hca_tcp_nonce(); /* the listener's: in its address */
    } while (tcp->secret == 0);
    rc = hca_tcp_netif_pick(setting, tcp->paths, HCA_NET_MAX_PATHS);
    if (rc > 0) {
        tcp->n_paths = rc;
        rc           = 0;
        for (int i = 0; (i < tcp->n_paths) && (rc == 0); ++i) {
            rc = hca_tcp_listen(&tcp->paths[i], dev->open_attr.port_min,
                                dev->open_attr.port_max);
        }
    }
    if (rc != 0) {
        hca_log("tcp fabric: no listener (%s): peers on other hosts are "
                "unreachable", strerror(-rc));
        if (dev->fabric_mode == HCA_FABRIC_MODE_TCP) {
            goto err; /* forced: the open fails */
        }
        hca_tcp_paths_close(tcp);
        pthread_mutex_destroy(&tcp->lock);
        free(tcp->scratch);
        free(tcp);
        return 0; /* shm alone */
    }
    dev->fabric_dev[HCA_FABRIC_TCP] = tcp;
    rc = hca_tcp_thread_start(tcp);
    if (rc != 0) {
        dev->fabric_dev[HCA_FABRIC_TCP] = NULL;
        goto err;
    }
    return 0;

err:
    hca_tcp_paths_close(tcp);
    pthread_mutex_destroy(&tcp->lock);
    free(tcp->scratch);
    free(tcp);
    return rc;
}

static void hca_tcp_dev_close(hca_device_t *dev)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(dev);
    hca_tcp_conn_t *conn;

    if (tcp == NULL) {
        return;
    }
    /* peers are told (best effort: a socket that takes it now): their
     * QPs with us fail at once, rather than wait for us to come back */
    pthread_mutex_lock(&tcp->lock);
    for (conn = tcp->conns; conn != NULL; conn = conn->next) {
        hca_tcp_job_t job;
        if (atomic_load(&conn->state) != HCA_TCP_CONN_UP) {
            continue;
        }
        memset(&job, 0, sizeof(job));
        job.hdr.version = HCA_TCP_VERSION;
        job.hdr.opcode  = HCA_TCP_OP_BYE;
        pthread_mutex_lock(&conn->tx_lock);
        if (hca_tcp_job_push(conn, &job) == 0) {
            hca_tcp_jobs_pump(tcp, conn);
        }
        pthread_mutex_unlock(&conn->tx_lock);
    }
    pthread_mutex_unlock(&tcp->lock);
    hca_tcp_thread_stop(tcp);
    /* each frees its own records: none uses another's (freed in any
     * order) */
    for (conn = tcp->conns; conn != NULL; conn = conn->next) {
        conn->rq_lead = NULL;
    }
    while ((conn = tcp->conns) != NULL) {
        tcp->conns = conn->next;
        hca_tcp_rx_abort(conn);
        hca_tcp_conn_free(conn);
    }
    hca_tcp_paths_close(tcp);
    pthread_mutex_destroy(&tcp->lock);
    free(tcp->scratch);
    free(tcp);
    dev->fabric_dev[HCA_FABRIC_TCP] = NULL;
}

/* ---------------------------------------------------------------- address */

/* A listener one of our paths can dial: an IPv4 or IPv6 address of a
 * family we have, a port and an address that are not zero (an address
 * that is none of these - corrupted, or of another kind - is refused here,
 * not by a connect that times out later). */
static int hca_tcp_reachable(hca_device_t *dev, const hca_port_addr_t *addr)
{
    static const uint8_t zero[16];
    hca_tcp_dev_t *tcp = hca_tcp_dev(dev);
    const hca_net_addr_t *net = &addr->net;
    size_t len;

    if ((tcp == NULL) || (net->port == 0)) {
        return 0;
    }
    if (net->family == HCA_NET_IPV4) {
        len = 4;
    } else if (net->family == HCA_NET_IPV6) {
        len = 16;
    } else {
        return 0;
    }
    if (!memcmp(net->addr, zero, len)) {
        return 0;
    }
    for (int i = 0; i < tcp->n_paths; ++i) {
        if (tcp->paths[i].addr.family == net->family) {
            return 1;
        }
    }
    return 0;
}

static void hca_tcp_address(hca_device_t *dev, hca_port_addr_t *addr)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(dev);

    if (tcp != NULL) {
        addr->net        = tcp->paths[0].addr;
        addr->secret     = tcp->secret;
        addr->n_net_more = (uint32_t)tcp->n_paths - 1;
        for (int i = 1; i < tcp->n_paths; ++i) {
            addr->net_more[i - 1] = tcp->paths[i].addr;
        }
    }
}

static void hca_tcp_port_query(hca_device_t *dev, hca_port_attr_t *attr)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(dev);

    if (tcp != NULL) {
        attr->net = tcp->paths[0].addr;
        snprintf(attr->net_dev, sizeof(attr->net_dev), "%s",
                 tcp->paths[0].ifname);
        attr->n_paths = (uint32_t)tcp->n_paths;
        for (int i = 0; i < tcp->n_paths; ++i) {
            hca_path_attr_t *pa = &attr->paths[i];
            pa->net = tcp->paths[i].addr;
            snprintf(pa->dev, sizeof(pa->dev), "%s", tcp->paths[i].ifname);
            pa->up  = hca_tcp_netif_up(&tcp->paths[i]);
        }
    }
}

/* ---------------------------------------------------------------- QPs */

static int hca_tcp_connect(hca_qp_t *qp)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(qp->dev);
    hca_tcp_conn_t *conn, *home = NULL;

    hca_tcp_qp_t *tq = hca_tcp_qp(qp);
    hca_tcp_sent_t *sent;
    uint32_t psn;

    /* one record per WQE that may be unanswered: the send queue's depth */
    sent = calloc((size_t)qp->sq_mask + 1, sizeof(*sent));
    if (sent == NULL) {
        return -ENOMEM;
    }
    pthread_mutex_lock(&tcp->lock);
    conn = hca_tcp_home_pick(tcp, &qp->dest, &home);
    if (conn != NULL) {
        conn->qp_refs++; /* the path it sends on ... */
        home->qp_refs++; /* ... and its home */
    }
    pthread_mutex_unlock(&tcp->lock);
    if (conn == NULL) {
        free(sent);
        return -ENOMEM;
    }
    memset(tq, 0, sizeof(hca_tcp_qp_t));
    /* a random start: a QP connected again (after a reset) is a new
     * incarnation to the responder, whose record of it starts afresh */
    psn            = (uint32_t)hca_tcp_nonce();
    tq->sent       = sent;
    tq->sent_mask  = qp->sq_mask;
    tq->start_psn  = psn;
    tq->next_psn   = psn;
    tq->rtx_psn    = psn;
    tq->wire_psn   = psn;
    atomic_store(&tq->answered_ns, hca_now_ns());
    tq->home       = home;
    tq->conn       = conn; /* last: the thread reads the QP by it */
    return 0;
}

/* No frame of the QP's is read into its buffers, or sent from them, after
 * this: the thread is not inside it (tcp->lock), and what it still had to
 * send of a frame already started goes out from a copy. */
static void hca_tcp_quiesce(hca_qp_t *qp)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(qp->dev);

    if (tcp == NULL) {
        return;
    }
    pthread_mutex_lock(&tcp->lock);
    for (hca_tcp_conn_t *conn = tcp->conns; conn != NULL; conn = conn->next) {
        pthread_mutex_lock(&conn->tx_lock);
        hca_tcp_tx_orphan(tcp, conn, qp->qpn);
        pthread_mutex_unlock(&conn->tx_lock);
    }
    /* its WQEs are flushed: nothing of them is sent again, and answers
     * find no record */
    if (hca_tcp_qp(qp)->sent != NULL) {
        hca_tcp_sent_clear(qp);
    }
    pthread_mutex_unlock(&tcp->lock);
}

static void hca_tcp_disconnect(hca_qp_t *qp)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(qp->dev);
    hca_tcp_conn_t *conn;

    if (tcp == NULL) {
        return;
    }
    hca_tcp_quiesce(qp);
    conn = hca_tcp_qp(qp)->conn;
    pthread_mutex_lock(&tcp->lock);
    if (conn != NULL) {
        conn->qp_refs--;
        hca_tcp_qp(qp)->home->qp_refs--;
    }
    if (hca_tcp_qp(qp)->stripe_conn != NULL) {
        hca_tcp_qp(qp)->stripe_conn->qp_refs--;
    }
    free(hca_tcp_qp(qp)->sent);
    memset(hca_tcp_qp(qp), 0, sizeof(hca_tcp_qp_t));
    pthread_mutex_unlock(&tcp->lock);
}

/* ---------------------------------------------------------------- liveness */

static hca_wc_status_t hca_tcp_peer_status(hca_qp_t *qp)
{
    hca_tcp_conn_t *conn = hca_tcp_qp(qp)->conn;

    if (conn == NULL) {
        return HCA_WC_RETRY_EXC_ERR;
    }
    if (atomic_load(&conn->state) == HCA_TCP_CONN_DEAD) {
        hca_tcp_dev_t *tcp = hca_tcp_dev(qp->dev);
        int keeps;
        if (!hca_tcp_failover_ok(conn, HCA_TCP_CONN_DEAD)) {
            return (hca_wc_status_t)atomic_load(&conn->fail);
        }
        /* a path that never came up: the QP moves to another at its
         * next operation, if one is UP */
        pthread_mutex_lock(&tcp->lock);
        keeps = hca_tcp_path_keeps(tcp, conn);
        pthread_mutex_unlock(&tcp->lock);
        if (!keeps) {
            return (hca_wc_status_t)atomic_load(&conn->fail);
        }
    }
    /* a peer process of this host that is gone is known at once, not at
     * the retry timeout (its reset alone would only start a reconnect) */
    if (hca_tcp_peer_gone(hca_tcp_dev(qp->dev), conn)) {
        return HCA_WC_RETRY_EXC_ERR;
    }
    return HCA_WC_SUCCESS;
}

static uint64_t hca_tcp_check_peers(hca_device_t *dev)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(dev);

    /* the thread finds dead connections (resets, timeouts) and counts
     * them in dev->dead_peers as it does */
    return (tcp != NULL) ? atomic_load(&tcp->conns_dead) : 0;
}

static int hca_tcp_source_alive(hca_device_t *dev, uint32_t pid,
                                uint32_t ctx_id)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(dev);
    int alive = 0;

    if (tcp == NULL) {
        return 0;
    }
    pthread_mutex_lock(&tcp->lock);
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        if ((c->peer.pid == pid) && (c->peer.ctx_id == ctx_id) &&
            (atomic_load(&c->state) != HCA_TCP_CONN_DEAD)) {
            alive = 1;
            break;
        }
    }
    pthread_mutex_unlock(&tcp->lock);
    return alive;
}

/* A live peer's next fragment may be held by TCP (retransmissions, a
 * full socket) as long as the peer timeout allows any silence: an
 * unfinished message over tcp waits that long, and never less than shm's
 * bound. */
static uint64_t hca_tcp_partial_timeout_ns(hca_device_t *dev)
{
    hca_tcp_dev_t *tcp = hca_tcp_dev(dev);
    uint64_t ns        = (tcp != NULL) ? tcp->timeout_ms * 1000000ull : 0;

    return (ns > HCA_PARTIAL_TIMEOUT_NS) ? ns : HCA_PARTIAL_TIMEOUT_NS;
}

/* ---------------------------------------------------------------- counters */

static const char *const hca_tcp_counter_names[HCA_TCP_CNT_LAST] = {
    [HCA_TCP_CNT_FRAMES_TX]  = "frames_tx",
    [HCA_TCP_CNT_FRAMES_RX]  = "frames_rx",
    [HCA_TCP_CNT_BYTES_TX]   = "bytes_tx",
    [HCA_TCP_CNT_BYTES_RX]   = "bytes_rx",
    [HCA_TCP_CNT_RETRIES]    = "retries",
    [HCA_TCP_CNT_CONNS]      = "connections",
    [HCA_TCP_CNT_CONNS_LOST] = "connections_lost",
    [HCA_TCP_CNT_BAD_FRAMES] = "bad_frames",
    [HCA_TCP_CNT_REFUSED]    = "refused_hellos",
    [HCA_TCP_CNT_RETRANSMITS]  = "retransmits",
    [HCA_TCP_CNT_DUP_REQUESTS] = "dup_requests",
    [HCA_TCP_CNT_REPLAYS]      = "replays",
    [HCA_TCP_CNT_SEQ_NAKS]     = "seq_naks",
    [HCA_TCP_CNT_RTOS]         = "rtos",
    [HCA_TCP_CNT_RECONNECTS]   = "reconnects",
    [HCA_TCP_CNT_FAULTS]       = "faults_injected",
    [HCA_TCP_CNT_FAILOVERS]    = "failovers",
    [HCA_TCP_CNT_STRIPED]      = "striped_writes",
    [HCA_TCP_CNT_STRIPED_READS] = "striped_reads",
    [HCA_TCP_CNT_RECORDS]      = "responder_records",
    [HCA_TCP_CNT_JOINS]        = "session_joins",
#define HCA_TCP_PATH_NAMES(_p) \
    [HCA_TCP_CNT_PATH(_p, HCA_TCP_PATH_FRAMES_TX)]   = "path" #_p "_frames_tx", \
    [HCA_TCP_CNT_PATH(_p, HCA_TCP_PATH_BYTES_TX)]    = "path" #_p "_bytes_tx", \
    [HCA_TCP_CNT_PATH(_p, HCA_TCP_PATH_RETRANSMITS)] = "path" #_p "_retransmits", \
    [HCA_TCP_CNT_PATH(_p, HCA_TCP_PATH_FAILOVERS)]   = "path" #_p "_failovers",
    HCA_TCP_PATH_NAMES(0) HCA_TCP_PATH_NAMES(1) HCA_TCP_PATH_NAMES(2)
    HCA_TCP_PATH_NAMES(3)
#undef HCA_TCP_PATH_NAMES
    [HCA_TCP_CNT_NAKS + HCA_WC_SUCCESS]         = "nak_success",
    [HCA_TCP_CNT_NAKS + HCA_WC_LOC_LEN_ERR]     = "nak_loc_len_err",
    [HCA_TCP_CNT_NAKS + HCA_WC_LOC_QP_OP_ERR]   = "nak_loc_qp_op_err",
    [HCA_TCP_CNT_NAKS + HCA_WC_LOC_PROT_ERR]    = "nak_loc_prot_err",
    [HCA_TCP_CNT_NAKS + HCA_WC_WR_FLUSH_ERR]    = "nak_wr_flush_err",
    [HCA_TCP_CNT_NAKS + HCA_WC_REM_INV_REQ_ERR] = "nak_rem_inv_req_err",
    [HCA_TCP_CNT_NAKS + HCA_WC_REM_ACCESS_ERR]  = "nak_rem_access_err",
    [HCA_TCP_CNT_NAKS + HCA_WC_REM_OP_ERR]      = "nak_rem_op_err",
    [HCA_TCP_CNT_NAKS + HCA_WC_RETRY_EXC_ERR]   = "nak_retry_exc_err",
    [HCA_TCP_CNT_NAKS + HCA_WC_RNR_RETRY_EXC_ERR] = "nak_rnr_retry_exc_err",
    [HCA_TCP_CNT_NAKS + HCA_WC_GENERAL_ERR]     = "nak_general_err",
};
/* a new status needs its NAK name above */
_Static_assert(HCA_WC_STATUS_LAST == 11, "name the new status's NAKs");
_Static_assert(HCA_NET_MAX_PATHS == 4, "name the new paths' counters");

static const char *hca_tcp_counter_name(unsigned i)
{
    return (i < HCA_TCP_CNT_LAST) ? hca_tcp_counter_names[i] : NULL;
}

const hca_fabric_ops_t hca_fabric_tcp_ops = {
    .name           = "tcp",
    .type           = HCA_FABRIC_TCP,
    .dev_open       = hca_tcp_dev_open,
    .dev_close      = hca_tcp_dev_close,
    .reachable      = hca_tcp_reachable,
    .address        = hca_tcp_address,
    .port_query     = hca_tcp_port_query,
    .connect        = hca_tcp_connect,
    .disconnect     = hca_tcp_disconnect,
    .quiesce        = hca_tcp_quiesce,
    .exec           = hca_tcp_exec,
    .poll_response  = hca_tcp_poll_response,
    .response_ready = hca_tcp_response_ready,
    .source_alive   = hca_tcp_source_alive,
    .partial_timeout_ns = hca_tcp_partial_timeout_ns,
    /* the receiver checked each message's source against the QP's
     * accepted peer (hca_tcp_target) before placing it */
    .msg_from_qp_peer = 1,
    .peer_status    = hca_tcp_peer_status,
    .check_peers    = hca_tcp_check_peers,
    .poll           = hca_tcp_poll,
    .armed          = hca_tcp_armed,
    .counter_name   = hca_tcp_counter_name,
};
