/*
 * hca_tcp_resp.c - what the tcp fabric's receiver does with a frame whose
 * header passed hca_tcp_hdr_check():
 *
 *   requests (we are the responder): the target QP is checked as on shm
 *   (hca_qp_pub_check against the connection's peer), the key in our MPT
 *   (hca_mpt_acquire, held while payload lands, so hca_mr_dereg waits for
 *   it); then
 *     WRITE      payload straight into the region; ACK after its LAST part
 *                (and, WITH_IMM, the notice in the receive ring)
 *     READ       READ_RESP frames straight from the region (a job)
 *     ATOMIC     executed on our memory, ACK with the old value
 *     SEND       each fragment into the QP's receive ring, as a shm
 *                sender would put it there (marked HCA_MSG_VIA_TCP); a
 *                full ring parks the connection until it has room; ACK
 *                after the LAST one
 *   A refused request gets an ACK with the error (a NAK) and its
 *   requester QP's record says so: its later frames are dropped, so
 *   nothing after an error touches memory.  Every request passes the
 *   sequence check first (hca_tcp_rel.c): executed once, in order; a
 *   duplicate is answered, not executed again.
 *
 *   answers (we are the requester): ACK and READ_RESP land in the QP's
 *   response slot and READ buffers, only while the WQE still waits for
 *   them (its stamp, state and QP are checked under tcp->lock).
 */
#include "hca_tcp_fabric.h"
#include "hca_mpt.h"
#include "hca_queue.h"
#include "hca_atomic.h"
#include "hca_log.h"

#include <errno.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers */

/* Answers a request: queues an ACK with its status (and fetched value). */
static void hca_tcp_answer(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                           const hca_tcp_hdr_t *req, hca_wc_status_t status,
                           uint64_t value)
{
    hca_tcp_job_t job;

    memset(&job, 0, sizeof(job));
    job.hdr.version    = HCA_TCP_VERSION;
    job.hdr.opcode     = HCA_TCP_OP_ACK;
    job.hdr.syndrome   = (uint8_t)status;
    job.hdr.src_qpn    = req->dst_qpn;
    job.hdr.dst_qpn    = req->src_qpn;
    job.hdr.psn        = req->psn;
    job.hdr.resp_idx   = req->resp_idx;
    job.hdr.resp_stamp = req->resp_stamp;
    job.hdr.operand    = value;
    if (status != HCA_WC_SUCCESS) {
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_NAKS + status, 1);
        hca_tcp_psn_refused(conn, req, status);
    }
    /* the answer of a SEND may wait for a frame of ours to go with (a
     * polling process that received a message often replies at once):
     * its requester waits for the reply, not for it.  A WRITE's (a flush
     * waits for it), an atomic's (its value) or a refusal are sent when
     * the read ends. */
    if ((req->opcode != HCA_TCP_OP_SEND) || (status != HCA_WC_SUCCESS)) {
        conn->answer_now = 1;
    }
    /* sent when the reader has read what the socket had (hca_tcp_read),
     * with the other answers and frames then queued: one sendmsg for all */
    pthread_mutex_lock(&conn->tx_lock);
    (void)hca_tcp_job_push(conn, &job); /* room: checked before reading */
    pthread_mutex_unlock(&conn->tx_lock);
}

/* A PSN_SEQ NAK: "I expect epsn" (a frame came ahead of it). */
static void hca_tcp_seq_nak(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                            const hca_tcp_hdr_t *req, uint32_t epsn)
{
    hca_tcp_job_t job;

    memset(&job, 0, sizeof(job));
    job.hdr.version  = HCA_TCP_VERSION;
    job.hdr.opcode   = HCA_TCP_OP_ACK;
    job.hdr.syndrome = HCA_TCP_SYN_PSN_SEQ;
    job.hdr.src_qpn  = req->dst_qpn;
    job.hdr.dst_qpn  = req->src_qpn;
    job.hdr.psn      = epsn;
    conn->answer_now = 1;
    HCA_TCP_COUNT(tcp, HCA_TCP_CNT_SEQ_NAKS, 1);
    pthread_mutex_lock(&conn->tx_lock);
    (void)hca_tcp_job_push(conn, &job); /* room: checked before reading */
    pthread_mutex_unlock(&conn->tx_lock);
}

/* The target QP of a request from this connection's peer. */
static hca_wc_status_t hca_tcp_target(hca_tcp_dev_t *tcp,
                                      hca_tcp_conn_t *conn,
                                      const hca_tcp_hdr_t *hdr,
                                      unsigned access, hca_qp_pub_t **pub_p)
{
    hca_device_t *dev = tcp->dev;
    uint32_t idx      = HCA_QPN_INDEX(hdr->dst_qpn);
    hca_wc_status_t status;
    hca_qp_pub_t *pub;

    if ((idx == 0) || (idx >= HCA_MAX_QP)) {
        return HCA_WC_REM_INV_REQ_ERR;
    }
    pub    = &dev->qp_pub[idx];
    /* the peer's host is the one its hello gave (the acceptor checked
     * it was the host it meant; the connector, the host it reached) */
    status = hca_qp_pub_check(pub, hdr->dst_qpn, conn->peer.host,
                              conn->peer.pid, conn->peer.ctx_id,
                              hdr->src_qpn);
    if (status != HCA_WC_SUCCESS) {
        return status;
    }
    /* a QP connected to one peer serves only a connection that proved it
     * is that peer (the identity in a hello is anyone's claim); a QP that
     * accepts any source, any connection that passed the handshake */
    if (HCA_UNLIKELY(!atomic_load_explicit(&conn->proven,
                                           memory_order_relaxed)) &&
        (atomic_load_explicit(&pub->dest_qpn, memory_order_relaxed) !=
         HCA_QPN_ANY)) {
        hca_qp_t *qp = __atomic_load_n(&dev->qps[idx], __ATOMIC_ACQUIRE);
        if ((qp == NULL) || (qp->qpn != hdr->dst_qpn) ||
            !hca_tcp_conn_proves(conn, qp->dest.secret)) {
            return HCA_WC_REM_INV_REQ_ERR;
        }
    }
    if ((pub->access & access) != access) {
        return HCA_WC_REM_ACCESS_ERR;
    }
    *pub_p = pub;
    return HCA_WC_SUCCESS;
}

/* The right a request needs of its target QP (a SEND: none). */
static unsigned hca_tcp_req_access(const hca_tcp_hdr_t *hdr)
{
    switch ((hca_tcp_op_t)hdr->opcode) {
    case HCA_TCP_OP_WRITE:
        return HCA_ACCESS_REMOTE_WRITE;
    case HCA_TCP_OP_READ:
        return HCA_ACCESS_REMOTE_READ;
    case HCA_TCP_OP_ATOMIC:
        return HCA_ACCESS_REMOTE_ATOMIC;
    default:
        return 0;
    }
}

/* Our QP qpn (tcp->lock held: destroy waits for it): NULL if gone. */
static hca_qp_t *hca_tcp_our_qp(hca_tcp_dev_t *tcp, uint32_t qpn)
{
    uint32_t idx = HCA_QPN_INDEX(qpn);
    hca_qp_t *qp;

    if ((idx == 0) || (idx >= HCA_MAX_QP) ||
        (atomic_load_explicit(&tcp->dev->qp_pub[idx].qpn,
                              memory_order_acquire) != qpn)) {
        return NULL;
    }
    qp = __atomic_load_n(&tcp->dev->qps[idx], __ATOMIC_ACQUIRE);
    return ((qp != NULL) && (qp->qpn == qpn)) ? qp : NULL;
}

/* An answer for qp may come on conn: the path it sends on, or another to
 * the same peer context that may carry its requests (the identity rule:
 * ours to its address, or one it dialled that proves it is that peer) -
 * the answers of frames it sent there before a failover. */
static int hca_tcp_answer_path(const hca_qp_t *qp, const hca_tcp_conn_t *conn)
{
    const hca_tcp_conn_t *on = hca_tcp_qp((hca_qp_t*)qp)->conn;

    if (HCA_LIKELY(conn == on)) {
        return 1;
    }
    return hca_tcp_conn_siblings(on, conn) &&
           hca_tcp_conn_is_peer((hca_tcp_conn_t*)conn, qp->dest.secret);
}

/* The WQE an answer is for, if it still waits for it: on a path to the
 * context its QP sends to (the one it sends on, or one it left: the
 * answers of frames sent there before a failover), from the QP it is
 * connected to. */
static hca_wqe_t *hca_tcp_waiting_wqe(hca_tcp_dev_t *tcp,
                                      const hca_tcp_conn_t *conn,
                                      const hca_tcp_hdr_t *hdr,
                                      hca_qp_t **qp_p)
{
    hca_qp_t *qp = hca_tcp_our_qp(tcp, hdr->dst_qpn);
    hca_wqe_t *wqe;

    if ((qp == NULL) || (qp->state != HCA_QPS_RTS) ||
        (qp->fabric->type != HCA_FABRIC_TCP) ||
        !hca_tcp_answer_path(qp, conn) ||
        (hdr->src_qpn != qp->dest_qpn) ||
        (hdr->resp_idx > qp->sq_mask)) {
        return NULL;
    }
    wqe = &qp->sq[hdr->resp_idx];
    /* the answer may come before the engine marked it ISSUED: its stamp,
     * set before its first frame was sent, is what tells */
    if ((__atomic_load_n(&wqe->state, __ATOMIC_ACQUIRE) == HCA_WQE_DONE) ||
        (wqe->resp_stamp != hdr->resp_stamp) || (hdr->resp_stamp == 0)) {
        return NULL;
    }
    *qp_p = qp;
    return wqe;
}

/* The WQE's response slot gets its status; the requester sleeping on its
 * send CQ is woken. */
static void hca_tcp_resolve(hca_tcp_dev_t *tcp, hca_qp_t *qp, uint32_t idx,
                            uint32_t stamp, hca_wc_status_t status,
                            uint64_t value)
{
    hca_device_t *dev = tcp->dev;
    uint32_t cq_idx   = qp->pub->send_cq_idx;

    hca_resp_slot_fill(&qp->resp[idx], stamp, status, value);
    if (cq_idx < HCA_MAX_CQ) {
        hca_cq_wake_armed(dev, &dev->notify[cq_idx], &dev->notify_self,
                          cq_idx);
    }
}

/* Puts a message (SEND fragment from the stage, or a WRITE_IMM notice)
 * into the receive ring of QP dst_qpn: 1 placed, 0 the ring is full,
 * -1 the QP is gone or refuses it (*status_p). */
static int hca_tcp_ring_put(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                            const hca_tcp_hdr_t *hdr, uint8_t op,
                            hca_wc_status_t *status_p)
{
    hca_device_t *dev = tcp->dev;
    hca_ring_send_t s;
    hca_qp_pub_t *pub;
    hca_msg_hdr_t *msg;
    hca_ring_t ring;
    hca_qp_t *qp;
    uint8_t flags;

    *status_p = hca_tcp_target(tcp, conn, hdr, 0, &pub);
    if (*status_p != HCA_WC_SUCCESS) {
        return -1;
    }
    qp = hca_tcp_our_qp(tcp, hdr->dst_qpn);
    if (qp == NULL) {
        *status_p = HCA_WC_RETRY_EXC_ERR;
        return -1;
    }
    ring            = qp->rq->ring; /* a producer's view of it */
    ring.claim_mark = dev->claim_mark;
    msg             = hca_ring_send_claim(&s, &ring);
    if (msg == NULL) {
        return 0;
    }
    flags = HCA_MSG_VIA_TCP;
    if (op == HCA_MSG_WRITE_IMM) {
        flags |= HCA_MSG_FIRST | HCA_MSG_LAST | HCA_MSG_WITH_IMM;
    } else {
        flags |= ((hdr->flags & HCA_TCP_F_FIRST) ? HCA_MSG_FIRST : 0) |
                 ((hdr->flags & HCA_TCP_F_LAST) ? HCA_MSG_LAST : 0) |
                 ((hdr->flags & HCA_TCP_F_IMM) ? HCA_MSG_WITH_IMM : 0);
    }
    msg->op       = op;
    msg->flags    = flags;
    msg->num_iov  = 0;
    msg->src_pid  = conn->peer.pid;
    msg->src_ctx  = conn->peer.ctx_id;
    msg->src_qpn  = hdr->src_qpn;
    msg->dst_qpn  = hdr->dst_qpn;
    msg->imm      = hdr->imm;
    msg->msg_len  = hdr->total;
    if (op == HCA_MSG_SEND) {
        msg->length   = hdr->length;
        msg->data_off = (uint8_t)hca_msg_data_off(hdr->length);
        memcpy((uint8_t*)msg + msg->data_off, conn->rx.stage, hdr->length);
    } else {
        msg->length   = 0;
        msg->data_off = HCA_MSG_DATA_NEAR;
    }
    hca_ring_send_post(dev, &s, &dev->notify_self);
    return 1;
}

static void hca_tcp_rx_next(hca_tcp_conn_t *conn)
{
    hca_tcp_rx_to(conn, HCA_TCP_RX_HDR);
    conn->rx.got    = 0;
    conn->rx.want   = sizeof(hca_tcp_hdr_t);
    conn->rx.iovcnt = 0;
    conn->rx.left   = 0;
}

static void hca_tcp_rx_discard(hca_tcp_conn_t *conn)
{
    hca_tcp_rx_to(conn, (conn->rx.in.hdr.length > 0) ? HCA_TCP_RX_DISCARD :
                                                       HCA_TCP_RX_HDR);
    conn->rx.left  = conn->rx.in.hdr.length;
    conn->rx.got   = 0;
    conn->rx.want  = sizeof(hca_tcp_hdr_t);
}

static void hca_tcp_rx_payload(hca_tcp_conn_t *conn, int kind)
{
    hca_tcp_rx_to(conn, HCA_TCP_RX_PAYLOAD);
    conn->rx.left  = conn->rx.in.hdr.length;
    conn->rx.kind  = kind;
}

/* ---------------------------------------------------------------- requests */

/* The key, rights and range of a request on our memory: SUCCESS with the
 * region pinned (*entry_p), else the NAK's status.  A range that wraps is
 * refused as any address outside the region (REM_ACCESS_ERR, the status
 * of shm's MPT check): a well-formed request with a bad address fails its
 * requester QP alone, the connection goes on. */
static hca_wc_status_t hca_tcp_access(hca_tcp_dev_t *tcp,
                                      const hca_qp_pub_t *pub, uint32_t rkey,
                                      unsigned access, uint64_t addr,
                                      uint64_t length, unsigned align,
                                      hca_mpt_entry_t **entry_p)
{
    if (addr + length < addr) {
        return HCA_WC_REM_ACCESS_ERR;
    }
    return hca_mpt_acquire(tcp->dev->mpt, HCA_MAX_MR, rkey, pub->pd_handle,
                           access, addr, length, align, entry_p);
}

static void hca_tcp_rx_write(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hdr_t *hdr = &conn->rx.in.hdr;
    hca_mpt_entry_t *entry   = NULL;
    hca_wc_status_t status;
    hca_qp_pub_t *pub;

    status = hca_tcp_target(tcp, conn, hdr, HCA_ACCESS_REMOTE_WRITE, &pub);
    if ((status == HCA_WC_SUCCESS) && (hdr->total > 0)) {
        /* as on InfiniBand: a zero-length WRITE checks no key */
        status = hca_tcp_access(tcp, pub, hdr->rkey, HCA_ACCESS_REMOTE_WRITE,
                                hdr->remote_addr, hdr->length, 1, &entry);
    }
    if (status != HCA_WC_SUCCESS) {
        hca_tcp_answer(tcp, conn, hdr, status, 0);
        hca_tcp_rx_discard(conn);
        return;
    }
    conn->rx.pinned = entry;
    if (hdr->length == 0) {
        hca_tcp_rx_done(tcp, conn);
        return;
    }
    conn->rx.iov[0].iov_base = (void*)(uintptr_t)hdr->remote_addr;
    conn->rx.iov[0].iov_len  = hdr->length;
    conn->rx.iovcnt          = 1;
    hca_tcp_rx_payload(conn, HCA_TCP_RXK_REGION);
}

/* ---------------------------------------------------------------- READs */

/* The socket of conn carries job's part of a READ's answer (tx_lock held):
 * remembered, the oldest of HCA_TCP_READS forgotten. */
static void hca_tcp_answered_add(hca_tcp_conn_t *conn, const hca_tcp_job_t *job)
{
    hca_tcp_answered_t *a = &conn->answered[conn->answered_next++ %
                                            HCA_TCP_READS];

    a->qpn   = job->hdr.dst_qpn;
    a->psn   = job->hdr.psn;
    a->addr  = job->addr;
    a->total = job->hdr.total;
    a->lo    = job->hdr.offset;
    a->hi    = job->end;
    a->ns    = 0;
}

/* What conn's socket carried of the READ at (qpn, psn), the newest first;
 * NULL if nothing (it was answered on another path or socket, or more
 * than HCA_TCP_READS READs ago). */
static hca_tcp_answered_t *hca_tcp_answered_find(hca_tcp_conn_t *conn,
                                                 uint32_t qpn, uint32_t psn)
{
    for (uint32_t i = 1; i <= HCA_TCP_READS; ++i) {
        hca_tcp_answered_t *a = &conn->answered[(conn->answered_next - i) %
                                                HCA_TCP_READS];
        if ((a->qpn == qpn) && (a->psn == psn) && (a->hi != 0)) {
            return a;
        }
    }
    return NULL;
}

/* The answers of the READ still queued stop at their next part (tx_lock
 * held): another starts over. */
static void hca_tcp_read_stale(hca_tcp_conn_t *conn, uint32_t qpn,
                               uint32_t psn)
{
    for (uint32_t i = conn->jobs_tail; i != conn->jobs_head; ++i) {
        hca_tcp_job_t *old = &conn->jobs[i % HCA_TCP_JOBS];
        if ((old->hdr.opcode == HCA_TCP_OP_READ_RESP) &&
            (old->hdr.dst_qpn == qpn) && (old->hdr.psn == psn)) {
            old->stale = 1;
        }
    }
}

/* The READ in conn->rx, a duplicate (tx_lock held): what of its answer
 * from its offset goes out again, in *job (from job->hdr.offset to
 * job->end); 0 if nothing.  Its requester asks again when it takes parts
 * for lost: a path or socket lost (the question then comes on another,
 * which answers it from its offset), an answer it saw pass the READ.  On
 * one live socket nothing is lost: what it carried of this READ, or has
 * queued, is not sent again; only the bytes outside that go (a striped
 * READ's share that was the other path's, asked here after that path was
 * lost).  So a READ asked again, from any offsets and however often,
 * costs its answer once per socket.  Except under injected loss (HCA_FAULT
 * tcp_loss), which drops frames the socket delivered: there the answer
 * starts over from the offset asked, at most once per retransmission
 * interval (HCA_TCP_RTO_NS, the requester's own timer). */
static int hca_tcp_read_again(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                              const hca_tcp_hdr_t *hdr, hca_tcp_job_t *job)
{
    hca_tcp_answered_t *a = hca_tcp_answered_find(conn, hdr->src_qpn,
                                                  hdr->psn);
    hca_device_t *dev     = tcp->dev;

    if (a == NULL) {
        hca_tcp_read_stale(conn, hdr->src_qpn, hdr->psn);
        hca_tcp_answered_add(conn, job);
        return 1;
    }
    if ((a->addr != hdr->remote_addr) || (a->total != hdr->total)) {
        return 0; /* not the READ answered at that PSN: an honest requester
                     asks again for the same */
    }
    if (HCA_UNLIKELY(dev->fault.enabled) &&
        (dev->fault.prob[HCA_FAULT_TCP_LOSS] != 0)) {
        uint64_t now = hca_coarse_ns();
        if ((a->ns == 0) || (now - a->ns >= HCA_TCP_RTO_NS)) {
            hca_tcp_read_stale(conn, hdr->src_qpn, hdr->psn);
            a->lo = (hdr->offset < a->lo) ? hdr->offset : a->lo;
            a->hi = hdr->total;
            a->ns = now;
            return 1;
        }
    }
    if (hdr->offset < a->lo) {
        job->end = a->lo;
        a->lo    = hdr->offset;
        return 1;
    }
    if (a->hi < hdr->total) {
        job->hdr.offset = (hdr->offset > a->hi) ? hdr->offset : a->hi;
        a->hi           = hdr->total;
        return 1;
    }
    return 0;
}

/* A large READ's answer over two paths: its first parts go on a sibling
 * of conn, from a job of their own (the region pinned once more), the
 * rest stay in *job, for conn; every part says HCA_TCP_F_STRIPED, and the
 * requester places them in whatever order they come.  The split follows
 * the paths' recent delivery rates.  Only a READ that allows it (its
 * requester sends nothing after it until it is answered: no answer of a
 * later request can pass the parts).  Nothing changes if no sibling is UP,
 * proven, with room for the job, or the READ is not whole parts from
 * its offset on (tcp->lock held). */
static void hca_tcp_read_stripe(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn,
                                hca_tcp_job_t *job)
{
    uint32_t start = job->hdr.offset;
    uint32_t n     = (job->end - start + HCA_TCP_SEG_MAX - 1) /
                     HCA_TCP_SEG_MAX;
    hca_tcp_conn_t *sib;
    hca_tcp_job_t part;
    uint32_t split;

    if ((start % HCA_TCP_SEG_MAX != 0) ||
        ((job->end + HCA_TCP_SEG_MAX - 1) / HCA_TCP_SEG_MAX >
         HCA_TCP_STRIPE_PARTS) ||
        ((sib = hca_tcp_answer_sibling(tcp, conn)) == NULL)) {
        return;
    }
    split        = hca_tcp_stripe_split(n, hca_tcp_path_rate(sib),
                                        hca_tcp_path_rate(conn));
    part         = *job;
    part.end     = start + split * HCA_TCP_SEG_MAX;
    part.striped = 1;
    pthread_mutex_lock(&sib->tx_lock);
    if ((sib->jobs_head - sib->jobs_tail < HCA_TCP_JOBS / 2) &&
        (atomic_load(&sib->state) == HCA_TCP_CONN_UP)) {
        hca_mpt_hold(part.entry); /* each job releases its own */
        (void)hca_tcp_job_push(sib, &part);
        hca_tcp_answered_add(sib, &part);
        hca_tcp_jobs_pump(tcp, sib);
        job->hdr.offset = part.end;
        job->striped    = 1;
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_STRIPED_READS, 1);
    }
    pthread_mutex_unlock(&sib->tx_lock);
}

static void hca_tcp_rx_read(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hdr_t *hdr = &conn->rx.in.hdr;
    hca_mpt_entry_t *entry   = NULL;
    hca_wc_status_t status;
    hca_qp_pub_t *pub;
    hca_tcp_job_t job;

    status = hca_tcp_target(tcp, conn, hdr, HCA_ACCESS_REMOTE_READ, &pub);
    if ((status == HCA_WC_SUCCESS) && (hdr->total > HCA_MAX_MSG)) {
        /* more than a message may be (the parts' offsets are 32 bits): an
         * invalid request, as InfiniBand's NAK for a length */
        status = HCA_WC_REM_INV_REQ_ERR;
    } else if ((status == HCA_WC_SUCCESS) && (hdr->total > 0)) {
        status = hca_tcp_access(tcp, pub, hdr->rkey, HCA_ACCESS_REMOTE_READ,
                                hdr->remote_addr, hdr->total, 1, &entry);
    }
    if (status != HCA_WC_SUCCESS) {
        hca_tcp_answer(tcp, conn, hdr, status, 0);
        hca_tcp_rx_next(conn);
        return;
    }
    memset(&job, 0, sizeof(job));
    job.hdr.version    = HCA_TCP_VERSION;
    job.hdr.opcode     = HCA_TCP_OP_READ_RESP;
    job.hdr.src_qpn    = hdr->dst_qpn;
    job.hdr.dst_qpn    = hdr->src_qpn;
    job.hdr.psn        = hdr->psn;
    job.hdr.resp_idx   = hdr->resp_idx;
    job.hdr.resp_stamp = hdr->resp_stamp;
    job.hdr.total      = hdr->total;
    job.hdr.offset     = hdr->offset; /* the answer goes from there */
    job.entry          = entry; /* released after the last part is out */
    job.addr           = hdr->remote_addr;
    job.end            = hdr->total;
    if (HCA_UNLIKELY(hdr->flags & HCA_TCP_F_STRIPED) &&
        (hdr->total - hdr->offset >= HCA_TCP_STRIPE_MIN) &&
        (tcp->n_paths > 1) && !conn->rx.dup) {
        hca_tcp_read_stripe(tcp, conn, &job);
    }
    pthread_mutex_lock(&conn->tx_lock);
    if (!conn->rx.dup) {
        hca_tcp_answered_add(conn, &job);
    } else if (!hca_tcp_read_again(tcp, conn, hdr, &job)) {
        /* its socket carried all it asks for */
        pthread_mutex_unlock(&conn->tx_lock);
        if (entry != NULL) {
            hca_mpt_release(entry);
        }
        hca_tcp_rx_next(conn);
        return;
    }
    if (hca_tcp_job_push(conn, &job) != 0) {
        /* cannot happen: room was checked before reading the header */
        if (entry != NULL) {
            hca_mpt_release(entry);
        }
    }
    hca_tcp_jobs_pump(tcp, conn);
    pthread_mutex_unlock(&conn->tx_lock);
    hca_tcp_psn_done(conn, hdr);
    hca_tcp_rx_next(conn);
}

static void hca_tcp_rx_atomic(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hdr_t *hdr = &conn->rx.in.hdr;
    int size = (hdr->flags & HCA_TCP_F_ATOMIC32) ? 4 : 8;
    hca_mpt_entry_t *entry;
    hca_wc_status_t status;
    hca_qp_pub_t *pub;
    uint64_t old = 0;

    status = hca_tcp_target(tcp, conn, hdr, HCA_ACCESS_REMOTE_ATOMIC, &pub);
    if (status == HCA_WC_SUCCESS) {
        status = hca_tcp_access(tcp, pub, hdr->rkey, HCA_ACCESS_REMOTE_ATOMIC,
                                hdr->remote_addr, (uint64_t)size,
                                (unsigned)size, &entry);
    }
    if (status == HCA_WC_SUCCESS) {
        old = hca_atomic_apply(hdr->atomic_op,
                               (void*)(uintptr_t)hdr->remote_addr, size,
                               hdr->operand, hdr->swap);
        hca_mpt_release(entry);
        /* its answer may be lost: a duplicate gets this value, never a
         * second execution */
        hca_tcp_atom_save(conn, hdr, status, old);
        hca_tcp_psn_done(conn, hdr);
    }
    hca_tcp_answer(tcp, conn, hdr, status, old);
    hca_tcp_rx_next(conn);
}

static void hca_tcp_rx_send(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hdr_t *hdr = &conn->rx.in.hdr;

    if (hdr->length == 0) {
        hca_tcp_rx_done(tcp, conn);
        return;
    }
    conn->rx.iov[0].iov_base = conn->rx.stage;
    conn->rx.iov[0].iov_len  = hdr->length;
    conn->rx.iovcnt          = 1;
    hca_tcp_rx_payload(conn, HCA_TCP_RXK_STAGE);
}

/* ---------------------------------------------------------------- answers */

/* Our QP an answer is for, sending on a path of this connection's
 * context to its sender. */
static hca_qp_t *hca_tcp_answered_qp(hca_tcp_dev_t *tcp,
                                     const hca_tcp_conn_t *conn,
                                     const hca_tcp_hdr_t *hdr)
{
    hca_qp_t *qp = hca_tcp_our_qp(tcp, hdr->dst_qpn);

    if ((qp == NULL) || (qp->state != HCA_QPS_RTS) ||
        (qp->fabric->type != HCA_FABRIC_TCP) ||
        !hca_tcp_answer_path(qp, conn) ||
        (hdr->src_qpn != qp->dest_qpn) ||
        (hca_tcp_qp(qp)->sent == NULL)) {
        return NULL;
    }
    return qp;
}

static void hca_tcp_rx_ack(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hdr_t *hdr = &conn->rx.in.hdr;
    hca_qp_t *qp             = hca_tcp_answered_qp(tcp, conn, hdr);

    if (qp != NULL) {
        hca_tcp_acked(tcp, qp, hdr);
    }
    hca_tcp_rx_next(conn);
}

/* A duplicate request: answered as it was, not executed again. */
static void hca_tcp_rx_dup(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hdr_t *hdr = &conn->rx.in.hdr;
    const hca_tcp_atom_t *a;
    hca_wc_status_t status;
    hca_qp_pub_t *pub;

    /* answered as it was only if it is still a request this connection
     * may make of that QP (the same checks as a new one: a duplicate
     * vouches for nothing) */
    status = hca_tcp_target(tcp, conn, hdr, hca_tcp_req_access(hdr), &pub);
    if (status != HCA_WC_SUCCESS) {
        hca_tcp_answer(tcp, conn, hdr, status, 0);
        hca_tcp_rx_discard(conn);
        return;
    }
    switch ((hca_tcp_op_t)hdr->opcode) {
    case HCA_TCP_OP_SEND:
    case HCA_TCP_OP_WRITE:
        /* placed before: its payload is dropped, its end acknowledged
         * again with its own PSN (an ACK up to the PSN expected could
         * pass a READ or atomic sent again before its answer) */
        if (hdr->flags & HCA_TCP_F_LAST) {
            hca_tcp_answer(tcp, conn, hdr, HCA_WC_SUCCESS, 0);
        }
        hca_tcp_rx_discard(conn);
        break;
    case HCA_TCP_OP_READ:
        /* answered again from the region as it is now (IB allows it) */
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_REPLAYS, 1);
        hca_tcp_rx_read(tcp, conn);
        break;
    case HCA_TCP_OP_ATOMIC:
    default:
        a = hca_tcp_atom_find(conn, hdr);
        HCA_TCP_COUNT(tcp, HCA_TCP_CNT_REPLAYS, 1);
        /* not in the table: older than HCA_TCP_RD_ATOM atomics, which an
         * honest requester never sends again */
        hca_tcp_answer(tcp, conn, hdr,
                       (a != NULL) ? (hca_wc_status_t)a->status :
                       HCA_WC_REM_OP_ERR, (a != NULL) ? a->value : 0);
        hca_tcp_rx_next(conn);
        break;
    }
}

static void hca_tcp_rx_read_resp(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hdr_t *hdr = &conn->rx.in.hdr;
    hca_wqe_t *wqe;
    hca_qp_t *qp;
    int n;

    wqe = hca_tcp_waiting_wqe(tcp, conn, hdr, &qp);
    if ((wqe == NULL) || (wqe->opcode != HCA_WR_RDMA_READ) ||
        (hca_tcp_answered_qp(tcp, conn, hdr) == NULL) ||
        (hca_tcp_sent_find(qp, hdr->psn) == NULL)) {
        /* nobody waits for it any more (an answer again, to a READ sent
         * again, after the first one completed it) */
        hca_tcp_rx_discard(conn);
        return;
    }
    n = hca_tcp_sge_iov(wqe, hdr->offset, hdr->length, conn->rx.iov);
    if ((n < 0) || (hdr->total != wqe->length)) {
        /* more than was asked for: the QP fails, nothing is written */
        hca_tcp_resolve(tcp, qp, hdr->resp_idx, hdr->resp_stamp,
                        HCA_WC_REM_OP_ERR, 0);
        hca_tcp_rx_discard(conn);
        return;
    }
    conn->rx.iovcnt = n;
    if (hdr->length == 0) {
        hca_tcp_rx_done(tcp, conn);
        return;
    }
    hca_tcp_rx_payload(conn, HCA_TCP_RXK_READ);
}

/* ---------------------------------------------------------------- frames */

void hca_tcp_rx_frame(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hdr_t *hdr = &conn->rx.in.hdr;
    hca_tcp_psn_verdict_t verdict;

    conn->rx.pinned = NULL;
    conn->rx.iovcnt = 0;
    switch ((hca_tcp_op_t)hdr->opcode) {
    case HCA_TCP_OP_SEND:
    case HCA_TCP_OP_WRITE:
    case HCA_TCP_OP_READ:
    case HCA_TCP_OP_ATOMIC:
        verdict = hca_tcp_psn_check(tcp, conn, hdr);
        if (HCA_UNLIKELY(verdict == HCA_TCP_PSN_NO_RECORD)) {
            /* a requester QP we have no record of: a record is made only
             * for one that may address the QP it names (a stranger's
             * flood of new QPNs costs a NAK each, not a record each) */
            hca_qp_pub_t *pub;
            hca_wc_status_t status = hca_tcp_target(tcp, conn, hdr,
                                                    hca_tcp_req_access(hdr),
                                                    &pub);
            if (status != HCA_WC_SUCCESS) {
                hca_tcp_answer(tcp, conn, hdr, status, 0);
                hca_tcp_rx_discard(conn);
                return;
            }
            verdict = hca_tcp_psn_first(tcp, conn, hdr);
        }
        if (HCA_UNLIKELY(tcp->dev->trace) && (verdict != HCA_TCP_PSN_NEW) &&
            (verdict != HCA_TCP_PSN_DUP)) {
            hca_log("tcp fabric: path %d: qp 0x%x psn %u (flags 0x%x) "
                    "not executed: %s, expected %u", conn->path,
                    hdr->src_qpn, hdr->psn, hdr->flags,
                    (verdict == HCA_TCP_PSN_GAP) ? "gap" :
                    (verdict == HCA_TCP_PSN_BUSY) ? "busy" :
                    (verdict == HCA_TCP_PSN_UNKNOWN) ? "no record" :
                    (verdict == HCA_TCP_PSN_FULL) ? "no room for its record" :
                    "dropped",
                    (conn->rx.rqp != NULL) ? conn->rx.rqp->epsn : 0);
        }
        switch (verdict) {
        case HCA_TCP_PSN_NEW:
            break;
        case HCA_TCP_PSN_DUP:
            hca_tcp_rx_dup(tcp, conn);
            return;
        case HCA_TCP_PSN_GAP:
        case HCA_TCP_PSN_BUSY:
            hca_tcp_seq_nak(tcp, conn, hdr, conn->rx.rqp->epsn);
            hca_tcp_rx_discard(conn);
            return;
        case HCA_TCP_PSN_UNKNOWN:
            hca_tcp_seq_nak(tcp, conn, hdr, hdr->psn);
            hca_tcp_rx_discard(conn);
            return;
        case HCA_TCP_PSN_FULL:
            /* refused, as a responder out of resources: its requester QP
             * fails rather than wait for an answer that never comes */
            hca_tcp_answer(tcp, conn, hdr, HCA_WC_REM_OP_ERR, 0);
            hca_tcp_rx_discard(conn);
            return;
        case HCA_TCP_PSN_DROP:
        default: {
            hca_wc_status_t status;
            if (hca_tcp_psn_refusal(conn, hdr, &status)) {
                /* the refused request sent again: its NAK again */
                hca_tcp_answer(tcp, conn, hdr, status, 0);
            }
            hca_tcp_rx_discard(conn); /* after its error, or a gap */
            return;
        }
        }
        break;
    default:
        break;
    }
    switch ((hca_tcp_op_t)hdr->opcode) {
    case HCA_TCP_OP_SEND:
        hca_tcp_rx_send(tcp, conn);
        break;
    case HCA_TCP_OP_WRITE:
        hca_tcp_rx_write(tcp, conn);
        break;
    case HCA_TCP_OP_READ:
        hca_tcp_rx_read(tcp, conn);
        break;
    case HCA_TCP_OP_ATOMIC:
        hca_tcp_rx_atomic(tcp, conn);
        break;
    case HCA_TCP_OP_ACK:
        hca_tcp_rx_ack(tcp, conn);
        break;
    case HCA_TCP_OP_READ_RESP:
        hca_tcp_rx_read_resp(tcp, conn);
        break;
    case HCA_TCP_OP_BYE:
        /* a context that closed does not come back: its QPs fail now, not
         * after the retry timeout */
        hca_tcp_rx_next(conn);
        hca_tcp_conn_kill(tcp, conn, HCA_WC_RETRY_EXC_ERR);
        break;
    case HCA_TCP_OP_KEEPALIVE:
    default:
        hca_tcp_rx_next(conn);
        break;
    }
}

int hca_tcp_rx_target_ok(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    hca_qp_t *qp;

    if (conn->rx.kind != HCA_TCP_RXK_READ) {
        return 1; /* the stage is ours; a region is pinned */
    }
    return hca_tcp_waiting_wqe(tcp, conn, &conn->rx.in.hdr, &qp) != NULL;
}

/* A SEND fragment or WRITE_IMM notice waits in the stage: into its ring,
 * then the answer.  0 if the ring is still full (parked). */
static int hca_tcp_rx_place(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hdr_t *hdr = &conn->rx.in.hdr;
    uint8_t op = (hdr->opcode == HCA_TCP_OP_SEND) ? HCA_MSG_SEND :
                                                    HCA_MSG_WRITE_IMM;
    hca_wc_status_t status;
    int rc;

    rc = hca_tcp_ring_put(tcp, conn, hdr, op, &status);
    if (rc == 0) {
        if (conn->rx.state != HCA_TCP_RX_PARKED) {
            hca_tcp_rx_to(conn, HCA_TCP_RX_PARKED);
            conn->rx.parked_ns = hca_now_ns();
            HCA_TCP_COUNT(tcp, HCA_TCP_CNT_RETRIES, 1);
        }
        return 0;
    }
    if (rc < 0) {
        hca_tcp_answer(tcp, conn, hdr, status, 0);
    } else {
        hca_tcp_psn_done(conn, hdr);
        if (hdr->flags & HCA_TCP_F_LAST) {
            hca_tcp_answer(tcp, conn, hdr, HCA_WC_SUCCESS, 0);
        }
    }
    hca_tcp_rx_next(conn);
    return 1;
}

void hca_tcp_rx_done(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    const hca_tcp_hdr_t *hdr = &conn->rx.in.hdr;
    hca_qp_t *qp;

    if (conn->rx.state == HCA_TCP_RX_DISCARD) {
        hca_tcp_rx_next(conn);
        return;
    }
    switch ((hca_tcp_op_t)hdr->opcode) {
    case HCA_TCP_OP_WRITE:
        if (conn->rx.pinned != NULL) {
            hca_mpt_release(conn->rx.pinned);
            conn->rx.pinned = NULL;
        }
        if (hdr->flags & HCA_TCP_F_STRIPED) {
            /* its parts land in any order: answered when the last of them
             * did (hca_tcp_rel.c) */
            hca_tcp_hdr_t ack;
            if (hca_tcp_psn_landed(conn, hdr, &ack)) {
                hca_tcp_answer(tcp, conn, &ack, HCA_WC_SUCCESS, 0);
            }
            hca_tcp_rx_next(conn);
        } else if (!(hdr->flags & HCA_TCP_F_LAST)) {
            hca_tcp_psn_done(conn, hdr);
            hca_tcp_rx_next(conn);
        } else if (hdr->flags & HCA_TCP_F_IMM) {
            (void)hca_tcp_rx_place(tcp, conn); /* the notice, then the ACK */
        } else {
            hca_tcp_psn_done(conn, hdr);
            hca_tcp_answer(tcp, conn, hdr, HCA_WC_SUCCESS, 0);
            hca_tcp_rx_next(conn);
        }
        break;
    case HCA_TCP_OP_SEND:
        (void)hca_tcp_rx_place(tcp, conn);
        break;
    case HCA_TCP_OP_READ_RESP:
        if ((hca_tcp_waiting_wqe(tcp, conn, hdr, &qp) != NULL) &&
            (hca_tcp_answered_qp(tcp, conn, hdr) != NULL)) {
            hca_tcp_sent_t *e = hca_tcp_sent_find(qp, hdr->psn);
            if ((e != NULL) && (e->psn == hdr->psn)) {
                /* its parts come in order: one missing (injected loss)
                 * shows at the next one, and the READ goes again for the
                 * rest, from the first part missing (once per gap: the
                 * parts already on their way do not ask again) */
                uint32_t before  = e->read_off;
                int last         = (hdr->flags & HCA_TCP_F_LAST) != 0;
                int striped      = (hdr->flags & HCA_TCP_F_STRIPED) != 0;
                uint32_t k       = hdr->offset / HCA_TCP_SEG_MAX;

                if (striped && (k < HCA_TCP_STRIPE_PARTS)) {
                    /* a striped answer's parts come over two paths, in
                     * any order: each is marked, read_off passes them */
                    e->read_got[k / 64] |= 1ull << (k % 64);
                }
                if (hdr->offset == before) {
                    e->read_off += hdr->length;
                }
                while ((e->read_off < hdr->total) &&
                       (e->read_off % HCA_TCP_SEG_MAX == 0) &&
                       ((k = e->read_off / HCA_TCP_SEG_MAX) <
                        HCA_TCP_STRIPE_PARTS) &&
                       ((e->read_got[k / 64] >> (k % 64)) & 1)) {
                    e->read_off += (hdr->total - e->read_off <
                                    HCA_TCP_SEG_MAX) ?
                                   hdr->total - e->read_off : HCA_TCP_SEG_MAX;
                }
                if (e->read_off == hdr->total) {
                    e->read_done = 1; /* its answer is in, whole */
                    hca_tcp_acked(tcp, qp, hdr);
                } else if (!striped && (last || (hdr->offset > before)) &&
                           (e->read_gap != e->read_off + 1)) {
                    e->read_gap = e->read_off + 1;
                    hca_tcp_rewind(tcp, qp, e->psn);
                }
            }
        }
        hca_tcp_rx_next(conn);
        break;
    default:
        hca_tcp_rx_next(conn);
        break;
    }
}

int hca_tcp_rx_unpark(hca_tcp_dev_t *tcp, hca_tcp_conn_t *conn)
{
    return hca_tcp_rx_place(tcp, conn);
}
