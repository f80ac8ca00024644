/*
 * test_reliability.cc - waits bounded by the peer's liveness: a requester
 * killed inside a large copy into (or out of) a target's MR must not keep
 * the target's hca_mr_dereg waiting.
 *
 * Three processes: the target and the requester are forked children (the
 * target's watchdog turns a hang into a failure instead of hanging the
 * suite); this process relays their addresses, kills the requester while it copies and asks the
 * target to deregister.
 */
#include "test_common.h"

#include "forge.h"

#include <random>
#include <tuple>

using namespace hcat;

namespace {

const size_t KILL_LEN       = 64ul << 20;
const double DEREG_BOUND_MS = 2000; /* the liveness check runs every
                                       1000 spins: milliseconds at most */

typedef std::tuple<mem_kind_t, unsigned, hca_wr_opcode_t> kill_param;

std::string kill_param_name(const ::testing::TestParamInfo<kill_param> &i)
{
    unsigned fl = std::get<1>(i.param);
    return std::string(mem_kind_name(std::get<0>(i.param))) + "_" +
           ((fl & HCA_OPEN_NO_SINGLE_COPY) ? "nsc" :
            (fl & HCA_OPEN_NO_MEMBARRIER) ? "nomb" : "sc") + "_" +
           ((std::get<2>(i.param) == HCA_WR_RDMA_READ) ? "read" : "write");
}

/* A context with one QP (and its CQ): the two ends of the connection. */
struct kill_end {
    ctx       c;
    hca_pd_t *pd = nullptr;
    cqw      *cq = nullptr;
    hca_qp_t *qp = nullptr;

    void open(unsigned flags)
    {
        ASSERT_TRUE(c.open(flags));
        pd = c.new_pd();
        cq = c.new_cq(256);
        ASSERT_NE(nullptr, cq);
        qp = c.new_qp(pd, cq, cq);
        ASSERT_NE(nullptr, qp);
    }

    peer_info info() const
    {
        peer_info pi;
        memset(&pi, 0, sizeof(pi));
        pi.addr   = c.addr;
        pi.qpn[0] = hca_qp_num(qp);
        return pi;
    }
};

class DeregAfterKill : public hca_test,
                       public ::testing::WithParamInterface<kill_param> {
};

/* The target: registers KILL_LEN bytes, then on token 1 deregisters and
 * sends back how long it took (ms, as a double). */
void target_body(mem_kind_t kind, unsigned flags, int rfd, int wfd)
{
    kill_end t;
    ASSERT_NO_FATAL_FAILURE(t.open(flags));
    uint8_t *buf = t.c.alloc(kind, KILL_LEN);
    ASSERT_NE(nullptr, buf);
    hca_mr_t *mr = t.c.reg(t.pd, buf, KILL_LEN, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    peer_info me = t.info();
    me.raddr[0]  = (uint64_t)(uintptr_t)buf;
    me.rkey[0]   = hca_mr_rkey(mr);
    ASSERT_TRUE(send_msg(wfd, me));
    peer_info req;
    ASSERT_TRUE(recv_msg(rfd, &req));
    ASSERT_EQ(0, connect_qp(t.qp, req.addr, req.qpn[0]));
    ASSERT_TRUE(send_token(wfd, 2));              /* ready for requests */
    ASSERT_TRUE(expect_token(rfd, 1, 120000));
    double t0 = now_ms();
    ASSERT_EQ(0, t.c.dereg(mr));
    double ms = now_ms() - t0;
    ASSERT_TRUE(send_msg(wfd, ms));
}

/* The requester: copies KILL_LEN bytes to or from the target, one WR
 * after the other, until it is killed; token 1 after the first one. */
void requester_body(unsigned flags, hca_wr_opcode_t op, int rfd, int wfd)
{
    kill_end r;
    ASSERT_NO_FATAL_FAILURE(r.open(flags));
    peer_info tgt;
    ASSERT_TRUE(recv_msg(rfd, &tgt));
    ASSERT_EQ(0, connect_qp(r.qp, tgt.addr, tgt.qpn[0]));
    ASSERT_TRUE(send_msg(wfd, r.info()));
    ASSERT_TRUE(expect_token(rfd, 2));            /* the target is ready */
    uint8_t *lb = r.c.alloc(MEM_MALLOC, KILL_LEN);
    ASSERT_NE(nullptr, lb);
    hca_mr_t *lmr = r.c.reg(r.pd, lb, KILL_LEN, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);
    for (uint64_t n = 0;; ++n) {
        hca_sge_t s      = mk_sge(lb, KILL_LEN, hca_mr_lkey(lmr));
        hca_send_wr_t wr = mk_wr(op, &s, 1, HCA_SEND_SIGNALED, n,
                                 tgt.raddr[0], tgt.rkey[0]);
        ASSERT_EQ(0, post_retry(r.qp, &wr));
        ASSERT_TRUE(wait_status(r.cq, n, HCA_WC_SUCCESS));
        if (n == 0) {
            ASSERT_TRUE(send_token(wfd, 1));
        }
    }
}

} // namespace

/* Killed at a random moment inside its copies, the requester leaves the
 * target's deregistration nothing to wait for: it returns within
 * DEREG_BOUND_MS, on plain and device memory, with single copy, without
 * it (the target's responder copies) and without membarrier (the
 * requester's busy word is fenced by itself). */
TEST_P(DeregAfterKill, ReturnsBounded)
{
    const mem_kind_t kind  = std::get<0>(GetParam());
    const unsigned flags   = std::get<1>(GetParam());
    const hca_wr_opcode_t op = std::get<2>(GetParam());
    std::mt19937 rng(std::random_device{}());
    double worst = 0;

    for (int round = 0; round < 3; ++round) {
        child_t *tgt = fork_child([=](int rfd, int wfd) {
            target_body(kind, flags, rfd, wfd);
        }, 30);
        ASSERT_NE(nullptr, tgt);
        child_t *req = fork_child([=](int rfd, int wfd) {
            requester_body(flags, op, rfd, wfd);
        }, 30);
        ASSERT_NE(nullptr, req);

        peer_info ti, ri;
        ASSERT_TRUE(recv_msg(tgt->rfd, &ti));
        ASSERT_TRUE(send_msg(req->wfd, ti));
        ASSERT_TRUE(recv_msg(req->rfd, &ri));
        ASSERT_TRUE(send_msg(tgt->wfd, ri));
        ASSERT_TRUE(expect_token(tgt->rfd, 2));
        ASSERT_TRUE(send_token(req->wfd, 2));
        ASSERT_TRUE(expect_token(req->rfd, 1));   /* copies are flowing */
        sleep_ms(std::uniform_int_distribution<int>(0, 15)(rng));
        kill_child(req);

        ASSERT_TRUE(send_token(tgt->wfd, 1));
        double ms = -1;
        ASSERT_TRUE(recv_msg(tgt->rfd, &ms, 20000))
                << "hca_mr_dereg did not return within 20 s of the kill";
        EXPECT_LT(ms, DEREG_BOUND_MS) << "round " << round;
        worst = std::max(worst, ms);
        EXPECT_TRUE(wait_child(tgt));
    }
    RecordProperty("dereg_ms_max", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(
        Reliability, DeregAfterKill,
        ::testing::Combine(::testing::Values(MEM_MALLOC, MEM_DM),
                           ::testing::Values(0u, (unsigned)
                                             HCA_OPEN_NO_SINGLE_COPY,
                                             (unsigned)
                                             HCA_OPEN_NO_MEMBARRIER),
                           ::testing::Values(HCA_WR_RDMA_WRITE,
                                             HCA_WR_RDMA_READ)),
        kill_param_name);

/* ------------------------------------------------------------ forgery */

namespace {

/* What the victim saw: receive completions by status. */
struct victim_report {
    uint64_t ok;
    uint64_t errors;
    uint64_t real_ok;    /* successful receives of the real message */
};

const uint32_t REAL_IMM = 0x5ea1;
const size_t   RX_LEN   = 64 * 1024;
const int      RX_DEPTH = 16;

/* The victim: a QP that accepts any source, RX_DEPTH receives posted and
 * reposted as they complete, until token 1; then it reports. */
void victim_body(int rfd, int wfd)
{
    ctx c;
    ASSERT_TRUE(c.open(0));
    hca_pd_t *pd = c.new_pd();
    cqw *cq      = c.new_cq(1024);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = c.new_qp(pd, cq, cq);
    ASSERT_NE(nullptr, qp);
    ASSERT_EQ(0, qp_to_init(qp, REMOTE_ALL));
    ASSERT_EQ(0, qp_to_rtr(qp, c.addr, HCA_QPN_ANY)); /* a DC target */
    uint8_t *buf = c.alloc(MEM_MALLOC, RX_LEN * RX_DEPTH);
    ASSERT_NE(nullptr, buf);
    hca_mr_t *mr = c.reg(pd, buf, RX_LEN * RX_DEPTH, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    for (int i = 0; i < RX_DEPTH; ++i) {
        ASSERT_EQ(0, post_recv1(qp, buf + i * RX_LEN, RX_LEN,
                                hca_mr_lkey(mr), i));
    }
    peer_info me;
    memset(&me, 0, sizeof(me));
    me.addr   = c.addr;
    me.qpn[0] = hca_qp_num(qp);
    ASSERT_TRUE(send_msg(wfd, me));

    victim_report rep = {0, 0, 0};
    while (!fd_readable(rfd, 0)) {
        progress_all();
        hca_wc_t wc;
        while (cq->pop(&wc)) {
            if (wc.status == HCA_WC_SUCCESS) {
                ++rep.ok;
                rep.real_ok += (wc.imm_data == REAL_IMM);
            } else {
                ++rep.errors;
            }
            ASSERT_EQ(0, post_recv1(qp, buf + wc.wr_id * RX_LEN, RX_LEN,
                                    hca_mr_lkey(mr), wc.wr_id));
        }
    }
    ASSERT_TRUE(expect_token(rfd, 1));
    ASSERT_TRUE(send_msg(wfd, rep));
}

forge_msg_t forged_hdr(uint8_t op, uint8_t flags, uint32_t src_pid,
                       uint32_t src_ctx, uint32_t src_qpn, uint32_t dst_qpn,
                       uint32_t length, uint32_t msg_len)
{
    forge_msg_t h;
    memset(&h, 0, sizeof(h));
    h.op       = op;
    h.flags    = flags;
    h.data_off = 64;
    h.src_pid  = src_pid;
    h.src_ctx  = src_ctx;
    h.src_qpn  = src_qpn;
    h.dst_qpn  = dst_qpn;
    h.length   = length;
    h.msg_len  = msg_len;
    return h;
}

/* Wire constants a forger knows (hca_wire.h, which is C only). */
const uint8_t  MSG_SEND = 1, MSG_SEND_PULL = 2, MSG_FIRST = 1, MSG_LAST = 2;
const uint32_t SLOT_PAYLOAD = 8192;

} // namespace

/* Forged slots written into a receiver's ring by another process of its
 * user: SEND_PULLs that name the receiver itself as their source (it used
 * to memcpy from the address in the slot: SIGSEGV), and first fragments
 * whose rest never comes (each used to hold a posted receive forever:
 * after RX_DEPTH of them nothing was received again).  The receiver
 * survives, gives the orphans' receives back (from dead sources at once,
 * from a live one after HCA_PARTIAL_TIMEOUT_NS or at its next message),
 * and receives a real message. */
TEST_F(hca_test, ForgedRingMessages)
{
    child_t *v = fork_child(victim_body, 60);
    ASSERT_NE(nullptr, v);
    peer_info vi;
    ASSERT_TRUE(recv_msg(v->rfd, &vi));
    forge_t *fr = nullptr;
    ASSERT_EQ(0, forge_open(&vi.addr, vi.qpn[0], &fr));

    ctx c;
    ASSERT_TRUE(c.open(0));
    const uint32_t vqpn = vi.qpn[0];
    hca_pd_t *pd = c.new_pd();
    cqw *cq      = c.new_cq(64);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = c.new_qp(pd, cq, cq);
    ASSERT_NE(nullptr, qp);
    ASSERT_EQ(0, connect_qp(qp, vi.addr, vqpn));

    /* SEND_PULLs from "the victim itself", iovs anywhere: a pull header
     * (answer slot, stamp) and one iov (address, length) */
    for (uint32_t i = 0; i < 8; ++i) {
        uint32_t pull[2] = {i, 1 + i};
        uint64_t iov[2]  = {0x1000ull * (i + 1), 20000};
        uint8_t payload[sizeof(pull) + sizeof(iov)];
        memcpy(payload, pull, sizeof(pull));
        memcpy(payload + sizeof(pull), iov, sizeof(iov));
        forge_msg_t h = forged_hdr(MSG_SEND_PULL, MSG_FIRST | MSG_LAST,
                                   vi.addr.pid, vi.addr.ctx_id, vqpn, vqpn,
                                   0, 20000);
        h.num_iov = 1;
        ASSERT_EQ(0, forge_put(fr, &h, payload, sizeof(payload),
                               TIMEOUT_MS));
    }
    /* orphan first fragments: 2 * RX_DEPTH from sources that do not
     * exist, RX_DEPTH / 2 from a live one (this process), the first of
     * those from the QP whose real SEND follows (which ends it: a
     * source's messages arrive in order) */
    static uint8_t frag[SLOT_PAYLOAD];
    for (int i = 0; i < 2 * RX_DEPTH; ++i) {
        forge_msg_t h = forged_hdr(MSG_SEND, MSG_FIRST, 0x3ffff000u + i, 7,
                                   4097, vqpn, SLOT_PAYLOAD,
                                   4 * SLOT_PAYLOAD);
        ASSERT_EQ(0, forge_put(fr, &h, frag, sizeof(frag), TIMEOUT_MS));
    }
    for (int i = 0; i < RX_DEPTH / 2; ++i) {
        forge_msg_t h = forged_hdr(MSG_SEND, MSG_FIRST, c.addr.pid,
                                   c.addr.ctx_id,
                                   (i == 0) ? hca_qp_num(qp) : 0x100000u + i,
                                   vqpn,
                                   SLOT_PAYLOAD, 4 * SLOT_PAYLOAD);
        ASSERT_EQ(0, forge_put(fr, &h, frag, sizeof(frag), TIMEOUT_MS));
    }
    forge_close(fr);

    /* then a real SEND, which must arrive */
    char msg[64] = "real";
    hca_sge_t s      = mk_sge(msg, sizeof(msg), 0);
    hca_send_wr_t wr = mk_wr(HCA_WR_SEND_WITH_IMM, &s, 1,
                             HCA_SEND_SIGNALED | HCA_SEND_INLINE, 1, 0, 0);
    wr.imm_data = REAL_IMM;
    ASSERT_EQ(0, post_retry(qp, &wr));
    EXPECT_TRUE(wait_status(cq, 1, HCA_WC_SUCCESS))
            << "the real SEND did not get into the victim's ring";
    sleep_ms(3000); /* past HCA_PARTIAL_TIMEOUT_NS: the live orphans end */

    ASSERT_TRUE(send_token(v->wfd, 1));
    victim_report rep;
    ASSERT_TRUE(recv_msg(v->rfd, &rep)) << "the victim died";
    EXPECT_EQ(1u, rep.real_ok) << "the real message was not received";
    EXPECT_EQ((uint64_t)(2 * RX_DEPTH + RX_DEPTH / 2), rep.errors)
            << "each orphan gives its receive back with an error";
    EXPECT_TRUE(wait_child(v));
}

/* A receiver that stops polling in the middle of a fragmented SEND (no
 * single copy), for longer than HCA_PARTIAL_TIMEOUT_NS, while the rest of
 * the message waits in its ring: an application computing between polls.
 * Its source is alive and the fragments are there, so the message must
 * complete, byte for byte.  (The orphan sweep used to run before the ring
 * was read and judged the partial by the last fragment consumed: the
 * message ended with a general error.) */
static void receiver_paused_mid_message(hca_fabric_type_t fabric)
{
    /* another process: its SENDs come as fragments through the ring (in
     * one process the receiver copies the whole message at once); it
     * makes progress only inside its poll_recv calls */
    remote_target t;
    ASSERT_TRUE(t.start(HCA_OPEN_NO_SINGLE_COPY, fabric));
    ctx c;
    ASSERT_TRUE(c.open(HCA_OPEN_NO_SINGLE_COPY, fabric));
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    /* far more than its ring holds, or 1 ms of copying moves */
    const size_t size = 64ul << 20;
    uint8_t *lb = c.alloc(MEM_MALLOC, size);
    ASSERT_NE(nullptr, lb);
    hca_mr_t *mr = c.reg(cn.pd, lb, size, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    uint64_t ra = 0;
    int rb = t.buf(MEM_MALLOC, size, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    int rmr = t.mr(cn.tpd, rb, 0, size, ACCESS_ALL, &rkey);
    ASSERT_GE(rmr, 0);
    ASSERT_EQ(0, t.fill(rb, 0, size, BYTE(SENTINEL)));
    ASSERT_EQ(0, t.post_recv(cn.tqp, rmr, rb, 0, size, 9, 1, 0));
    fill_pattern(lb, size, 4242);
    hca_sge_t s      = mk_sge(lb, size, hca_mr_lkey(mr));
    hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &s, 1, HCA_SEND_SIGNALED, 1, 0, 0);
    ASSERT_EQ(0, post_retry(cn.qp, &wr));

    /* the requester fills the ring; the receiver reads it (the first
     * fragments: a partial holds the receive); the requester refills it */
    std::vector<hca_wc_t> w;
    for (int i = 0; i < 100; ++i) {
        cn.scq->poll_once();
    }
    ASSERT_EQ(0, t.poll_recv(cn.tqp, 1, &w, 1))
            << "the message ended early: " << wc_str(w[0]);
    for (int i = 0; i < 100; ++i) {
        cn.scq->poll_once();
    }
    sleep_ms(2500); /* past HCA_PARTIAL_TIMEOUT_NS (2 s) */

    /* then both go on, taking turns */
    const double end = now_ms() + 60000;
    while (w.empty() && (now_ms() < end)) {
        ASSERT_GE(t.poll_recv(cn.tqp, 1, &w, 1), 0);
        for (int i = 0; i < 100; ++i) {
            cn.scq->poll_once();
        }
    }
    ASSERT_EQ(1u, w.size()) << "no receive completion";
    EXPECT_EQ(HCA_WC_SUCCESS, w[0].status) << wc_str(w[0]);
    EXPECT_EQ(size, (size_t)w[0].byte_len);
    EXPECT_EQ(-1, t.check(rb, 0, size, PAT(4242)));
    EXPECT_TRUE(wait_ok(cn.scq, 1, HCA_WC_SEND));
}

TEST_F(hca_test, ReceiverPausedMidMessageKeepsIt)
{
    for (hca_fabric_type_t f : test_fabrics()) {
        SCOPED_TRACE(fabric_name(f));
        receiver_paused_mid_message(f);
    }
}

/* A producer killed between its claim of a ring slot and its publish (a
 * window as long as its copy, or a UCT pack callback): the slot names it,
 * and the consumer gives the slot back once it finds the producer gone;
 * a real SEND behind it arrives.  It used to block the ring for good, and
 * every later sender with it. */
TEST_F(hca_test, DeadProducerDoesNotBlockRing)
{
    child_t *v = fork_child(victim_body, 60);
    ASSERT_NE(nullptr, v);
    peer_info vi;
    ASSERT_TRUE(recv_msg(v->rfd, &vi));
    child_t *p = fork_child([vi](int rfd, int wfd) {
        forge_t *f = nullptr;
        ASSERT_EQ(0, forge_open(&vi.addr, vi.qpn[0], &f));
        ASSERT_EQ(0, forge_claim(f, TIMEOUT_MS));
        ASSERT_TRUE(send_token(wfd, 1));
        (void)expect_token(rfd, 2, 60000); /* killed while it waits */
    }, 60);
    ASSERT_NE(nullptr, p);
    ASSERT_TRUE(expect_token(p->rfd, 1));
    kill_child(p);

    ctx c;
    ASSERT_TRUE(c.open(0));
    hca_pd_t *pd = c.new_pd();
    cqw *cq      = c.new_cq(64);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = c.new_qp(pd, cq, cq);
    ASSERT_NE(nullptr, qp);
    ASSERT_EQ(0, connect_qp(qp, vi.addr, vi.qpn[0]));
    char msg[64] = "real";
    hca_sge_t s      = mk_sge(msg, sizeof(msg), 0);
    hca_send_wr_t wr = mk_wr(HCA_WR_SEND_WITH_IMM, &s, 1,
                             HCA_SEND_SIGNALED | HCA_SEND_INLINE, 1, 0, 0);
    wr.imm_data = REAL_IMM;
    ASSERT_EQ(0, post_retry(qp, &wr));
    EXPECT_TRUE(wait_status(cq, 1, HCA_WC_SUCCESS));
    sleep_ms(500);

    ASSERT_TRUE(send_token(v->wfd, 1));
    victim_report rep;
    ASSERT_TRUE(recv_msg(v->rfd, &rep)) << "the victim died";
    EXPECT_EQ(1u, rep.real_ok)
            << "the SEND behind the dead producer's slot was not received";
    EXPECT_TRUE(wait_child(v));
}

/* ------------------------------------- a producer killed, a consumer waits */

namespace {

const uint32_t KR_BUSY_IMM = 0xb0000000u, KR_SURV_IMM = 0x50000000u;
const uint32_t KR_LEN      = 8192; /* a slot's payload: the copy the kill
                                      lands in */
const int      KR_BATCH    = 16;   /* the survivor's SENDs before and after
                                      the kill */
const int      KR_RX       = 64;

/* A producer into the consumer's ring.  busy: direct sends of KR_LEN bytes
 * written into the claimed slot a byte at a time, 8 times over (as a slow
 * UCT pack callback would), until killed.  Else, on each token 1: KR_BATCH SENDs with
 * immediate, and token 2 once they completed; token 0 ends it. */
void ring_producer(const peer_info &pi, bool busy, int rfd, int wfd)
{
    ctx c;
    ASSERT_TRUE(c.open(0));
    hca_pd_t *pd = c.new_pd();
    cqw *cq      = c.new_cq(256);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = c.new_qp(pd, cq, cq);
    ASSERT_NE(nullptr, qp);
    ASSERT_EQ(0, connect_qp(qp, pi.addr, pi.qpn[0]));
    uint8_t *buf = c.alloc(MEM_MALLOC, 64);
    ASSERT_NE(nullptr, buf);
    hca_mr_t *mr = c.reg(pd, buf, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    ASSERT_TRUE(send_token(wfd, 1));
    if (busy) {
        for (uint32_t seq = 0;; ++seq) {
            hca_send_slot_t sl;
            int rc = fast_send_reserve(qp, KR_LEN, &sl);
            if (rc == -EAGAIN) {
                continue; /* the ring is full */
            }
            ASSERT_EQ(0, rc);
            /* slowly (tens of microseconds): the consumer keeps up, and
             * the kill most likely lands between the claim and the
             * publish */
            volatile uint8_t *d = (volatile uint8_t*)sl.data;
            for (uint32_t pass = 0; pass < 8; ++pass) {
                for (uint32_t i = 0; i < KR_LEN; ++i) {
                    d[i] = (uint8_t)(seq + i + pass);
                }
            }
            ASSERT_EQ(0, fast_send_commit(qp, &sl, KR_LEN,
                                         HCA_WR_SEND_WITH_IMM,
                                         KR_BUSY_IMM | (seq & 0xffffff)));
        }
    }
    uint32_t seq = 0;
    for (;;) {
        uint32_t tok = 0;
        if (!recv_msg(rfd, &tok, 60000) || (tok == 0)) {
            return;
        }
        for (int i = 0; i < KR_BATCH; ++i, ++seq) {
            hca_sge_t s      = mk_sge(buf, 8, hca_mr_lkey(mr));
            hca_send_wr_t wr = mk_wr(HCA_WR_SEND_WITH_IMM, &s, 1,
                                     HCA_SEND_SIGNALED, seq);
            wr.imm_data      = KR_SURV_IMM | seq;
            ASSERT_EQ(0, post_retry(qp, &wr));
        }
        for (int done = 0; done < KR_BATCH;) {
            hca_wc_t wc;
            ASSERT_TRUE(wait_wc(cq, &wc, 30000)) << "SEND " << done;
            ASSERT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
            ++done;
        }
        ASSERT_TRUE(send_token(wfd, 2));
    }
}

} // namespace

/* Two producers into one ring of a consumer that waits (hca_cq_wait); the
 * busy one is killed at a random moment, most likely between the claim
 * of a slot and its publish.  The survivor's SENDs, before and after the
 * kill, all arrive within 2.5 s.  They used to stay behind the dead claim
 * for 16384 polls of the waiting consumer, one per refused arm and 1 ms
 * sleep (17 s and more); and a consumer asleep when the claim cleared
 * its armed bit slept on, as no one else wakes it.  Repeated KR_REPS
 * times. */
TEST_F(hca_test, KilledProducerDoesNotBlockWaitingConsumer)
{
    const int KR_REPS         = 60;
    const double KR_BOUND_MS  = 2500;
    ctx c;
    ASSERT_TRUE(c.open(0));
    hca_pd_t *pd = c.new_pd();
    cqw *cq      = c.new_cq(1024);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = c.new_qp(pd, cq, cq);
    ASSERT_NE(nullptr, qp);
    ASSERT_EQ(0, qp_to_init(qp, REMOTE_ALL));
    ASSERT_EQ(0, qp_to_rtr(qp, c.addr, HCA_QPN_ANY)); /* any source */
    uint8_t *rx = c.alloc(MEM_MALLOC, (size_t)KR_LEN * KR_RX);
    ASSERT_NE(nullptr, rx);
    hca_mr_t *mr = c.reg(pd, rx, (size_t)KR_LEN * KR_RX, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    for (int i = 0; i < KR_RX; ++i) {
        ASSERT_EQ(0, post_recv1(qp, rx + (size_t)i * KR_LEN, KR_LEN,
                                hca_mr_lkey(mr), (uint64_t)i));
    }
    peer_info me;
    memset(&me, 0, sizeof(me));
    me.addr   = c.addr;
    me.qpn[0] = hca_qp_num(qp);

    const unsigned seed = (unsigned)time(nullptr);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> kill_at(1, 30);
    int surv_got = 0, busy_got = 0;
    uint32_t surv_next = 0;
    /* one wait and what it brings: receives reposted, the survivor's
     * SENDs counted (in order) */
    auto consume = [&](int wait_ms) {
        (void)hca_cq_wait(cq->cq, wait_ms);
        cq->poll_once();
        hca_wc_t wc;
        while (cq->pop(&wc)) {
            ASSERT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
            if ((wc.imm_data & 0xf0000000u) == KR_SURV_IMM) {
                EXPECT_EQ(surv_next, wc.imm_data & 0xffffffu);
                surv_next = (wc.imm_data & 0xffffffu) + 1;
                ++surv_got;
            } else {
                ++busy_got;
            }
            ASSERT_EQ(0, post_recv1(qp, rx + wc.wr_id * KR_LEN, KR_LEN,
                                    hca_mr_lkey(mr), wc.wr_id));
        }
    };

    hca_counters_t cnt0;
    ASSERT_EQ(0, hca_device_counters(c.dev, &cnt0));
    double worst_ms = 0;
    for (int rep = 0; rep < KR_REPS; ++rep) {
        SCOPED_TRACE(::testing::Message() << "rep " << rep << " seed "
                                          << seed);
        child_t *busy = fork_child([me](int rfd, int wfd) {
            ring_producer(me, true, rfd, wfd);
        }, 60);
        ASSERT_NE(nullptr, busy);
        child_t *surv = fork_child([me](int rfd, int wfd) {
            ring_producer(me, false, rfd, wfd);
        }, 60);
        ASSERT_NE(nullptr, surv);
        ASSERT_TRUE(expect_token(surv->rfd, 1));
        surv_got  = 0;
        surv_next = 0;
        busy_got  = 0;
        /* the busy one runs once its token came; the survivor's first
         * batch goes with it */
        double end = now_ms() + TIMEOUT_MS;
        while (!fd_readable(busy->rfd, 0)) {
            ASSERT_LT(now_ms(), end) << "the busy producer did not start";
            consume(10);
        }
        ASSERT_TRUE(expect_token(busy->rfd, 1));
        ASSERT_TRUE(send_token(surv->wfd, 1));
        const double kill_t = now_ms() + kill_at(rng);
        while (now_ms() < kill_t) {
            consume(5);
        }
        kill_child(busy);
        const double t0 = now_ms();
        ASSERT_TRUE(send_token(surv->wfd, 1));
        while ((surv_got < 2 * KR_BATCH) && (now_ms() - t0 < KR_BOUND_MS)) {
            consume(3000); /* no timeout of ours ends the sleep early */
        }
        const double el = now_ms() - t0;
        worst_ms        = std::max(worst_ms, el);
        ASSERT_EQ(2 * KR_BATCH, surv_got)
                << "the ring stayed blocked after its busy producer was "
                   "killed (" << busy_got << " of its SENDs received)";
        ASSERT_TRUE(send_token(surv->wfd, 0));
        /* its second token 2 (and the first, if not read yet) */
        EXPECT_TRUE(wait_child(surv));
        close_child_fds(surv);
        close_child_fds(busy);
    }
    hca_counters_t cnt1;
    ASSERT_EQ(0, hca_device_counters(c.dev, &cnt1));
    /* a dead claim released, or a message refused: counted as errors */
    printf("[ INFO ] %d kills (%llu dropped slots): the survivor's SENDs all "
           "arrived, the last within %.1f ms of a kill at worst\n", KR_REPS,
           (unsigned long long)(cnt1.errors[HCA_WC_GENERAL_ERR] -
                                cnt0.errors[HCA_WC_GENERAL_ERR]),
           worst_ms);
}

namespace {

/* A receiver in c: a QP that accepts SENDs from any source (with its own
 * CQ, no event channel), n receives of len bytes posted (wr_id 0..n-1);
 * *me says where to send. */
void any_source_receiver(ctx *c, int n, uint32_t len, cqw **cq_p,
                         peer_info *me)
{
    ASSERT_TRUE(c->open(0));
    hca_pd_t *pd = c->new_pd();
    cqw *cq      = c->new_cq(64, false);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = c->new_qp(pd, cq, cq);
    ASSERT_NE(nullptr, qp);
    ASSERT_EQ(0, qp_to_init(qp, REMOTE_ALL));
    ASSERT_EQ(0, qp_to_rtr(qp, c->addr, HCA_QPN_ANY)); /* any source */
    uint8_t *rx = c->alloc(MEM_MALLOC, (size_t)n * len);
    ASSERT_NE(nullptr, rx);
    hca_mr_t *mr = c->reg(pd, rx, (size_t)n * len, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(0, post_recv1(qp, rx + (size_t)i * len, len,
                                hca_mr_lkey(mr), (uint64_t)i));
    }
    memset(me, 0, sizeof(*me));
    me->addr   = c->addr;
    me->qpn[0] = hca_qp_num(qp);
    *cq_p      = cq;
}

} // namespace

/* A consumer asleep in hca_cq_wait (armed); a producer's claim clears
 * the ring's armed bit, and the producer dies before it publishes and
 * wakes anyone.  A SEND of another process comes behind it: its claim
 * finds no armed bit and wakes no one.  The sleeper looks again within a
 * second and gets the SEND; it used to sleep until its timeout (5 s here,
 * for good with none). */
TEST_F(hca_test, DeadClaimerDoesNotLeaveWaiterAsleep)
{
    ctx c;
    cqw *cq = nullptr;
    peer_info me;
    ASSERT_NO_FATAL_FAILURE(any_source_receiver(&c, 1, 4096, &cq, &me));

    /* 100 ms after its token: claims a slot and dies (SIGKILL) */
    child_t *p = fork_child([me](int rfd, int wfd) {
        forge_t *f = nullptr;
        ASSERT_EQ(0, forge_open(&me.addr, me.qpn[0], &f));
        ASSERT_TRUE(send_token(wfd, 1));
        ASSERT_TRUE(expect_token(rfd, 1));
        sleep_ms(100);
        ASSERT_EQ(0, forge_claim(f, TIMEOUT_MS));
        raise(SIGKILL);
    }, 60);
    ASSERT_NE(nullptr, p);
    /* 400 ms after its token: one SEND with immediate */
    child_t *s = fork_child([me](int rfd, int wfd) {
        ctx sc;
        ASSERT_TRUE(sc.open(0));
        hca_pd_t *spd = sc.new_pd();
        cqw *scq      = sc.new_cq(64);
        ASSERT_NE(nullptr, scq);
        hca_qp_t *sqp = sc.new_qp(spd, scq, scq);
        ASSERT_NE(nullptr, sqp);
        ASSERT_EQ(0, connect_qp(sqp, me.addr, me.qpn[0]));
        ASSERT_TRUE(send_token(wfd, 1));
        ASSERT_TRUE(expect_token(rfd, 1));
        sleep_ms(400);
        char msg[64]     = "real";
        hca_sge_t sg     = mk_sge(msg, sizeof(msg), 0);
        hca_send_wr_t wr = mk_wr(HCA_WR_SEND_WITH_IMM, &sg, 1,
                                 HCA_SEND_SIGNALED | HCA_SEND_INLINE, 1);
        wr.imm_data      = REAL_IMM;
        ASSERT_EQ(0, post_retry(sqp, &wr));
        EXPECT_TRUE(wait_status(scq, 1, HCA_WC_SUCCESS));
        ASSERT_TRUE(expect_token(rfd, 2));
    }, 60);
    ASSERT_NE(nullptr, s);
    ASSERT_TRUE(expect_token(p->rfd, 1));
    ASSERT_TRUE(expect_token(s->rfd, 1));

    ASSERT_EQ(0, cq->poll_once());
    ASSERT_TRUE(send_token(p->wfd, 1));
    ASSERT_TRUE(send_token(s->wfd, 1));
    const double t0 = now_ms();
    hca_wc_t wc;
    bool got = false;
    while (!got && (now_ms() - t0 < 6000)) {
        (void)hca_cq_wait(cq->cq, 5000);
        cq->poll_once();
        got = cq->pop(&wc);
    }
    const double el = now_ms() - t0;
    ASSERT_TRUE(got) << "the SEND behind the dead claim never came";
    EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
    EXPECT_EQ((uint32_t)REAL_IMM, wc.imm_data);
    EXPECT_LT(el, 2500.0) << "the waiter slept on after the dead claim";
    printf("[ INFO ] the SEND behind the dead claim arrived after %.0f ms "
           "(sent at 400 ms)\n", el);
    ASSERT_TRUE(send_token(s->wfd, 2));
    EXPECT_TRUE(wait_child(s));
    kill_child(p); /* reaps it: it killed itself */
}

/* A producer stopped between its two CASes: it moved the ring's head past
 * a slot and has not stamped it (a process killed there, or one not
 * running).  Its consumer cannot name it, so it used to wait behind the
 * slot for good, and every SEND of another process behind it with it
 * (KilledProducerDoesNotBlockWaitingConsumer hit it in 1 run of 12).
 * Now the consumer takes the slot after 50 ms: a SEND behind it arrives
 * within a second, the slot is counted as dropped, and the stopped
 * producer, when it goes on, finds the slot reaped and writes nothing
 * into it (its stamp CAS fails); a SEND after that arrives too. */
TEST_F(hca_test, UnstampedClaimDoesNotBlockRing)
{
    ctx c;
    cqw *cq = nullptr;
    peer_info me;
    ASSERT_NO_FATAL_FAILURE(any_source_receiver(&c, 4, 1024, &cq, &me));

    /* token 1: takes the head of a slot (token 1 back); token 2: stamps
     * it, and answers 3 if it found the slot reaped, 4 if it got it */
    child_t *p = fork_child([me](int rfd, int wfd) {
        forge_t *f = nullptr;
        uint64_t idx;
        ASSERT_EQ(0, forge_open(&me.addr, me.qpn[0], &f));
        ASSERT_TRUE(send_token(wfd, 1));
        ASSERT_TRUE(expect_token(rfd, 1));
        ASSERT_EQ(0, forge_take_head(f, &idx));
        ASSERT_TRUE(send_token(wfd, 1));
        ASSERT_TRUE(expect_token(rfd, 2));
        ASSERT_TRUE(send_token(wfd, (forge_stamp(f, idx) == 0) ? 4 : 3));
        forge_close(f);
    }, 60);
    ASSERT_NE(nullptr, p);
    /* on token k (1, 2): one SEND with immediate REAL_IMM + k; 0 ends */
    child_t *s = fork_child([me](int rfd, int wfd) {
        ctx sc;
        ASSERT_TRUE(sc.open(0));
        hca_pd_t *spd = sc.new_pd();
        cqw *scq      = sc.new_cq(64);
        ASSERT_NE(nullptr, scq);
        hca_qp_t *sqp = sc.new_qp(spd, scq, scq);
        ASSERT_NE(nullptr, sqp);
        ASSERT_EQ(0, connect_qp(sqp, me.addr, me.qpn[0]));
        ASSERT_TRUE(send_token(wfd, 1));
        for (;;) {
            uint32_t tok = 0;
            if (!recv_msg(rfd, &tok, 60000) || (tok == 0)) {
                return;
            }
            char msg[64]     = "real";
            hca_sge_t sg     = mk_sge(msg, sizeof(msg), 0);
            hca_send_wr_t wr = mk_wr(HCA_WR_SEND_WITH_IMM, &sg, 1,
                                     HCA_SEND_SIGNALED | HCA_SEND_INLINE,
                                     tok);
            wr.imm_data      = REAL_IMM + tok;
            ASSERT_EQ(0, post_retry(sqp, &wr));
            EXPECT_TRUE(wait_status(scq, tok, HCA_WC_SUCCESS));
        }
    }, 60);
    ASSERT_NE(nullptr, s);
    ASSERT_TRUE(expect_token(p->rfd, 1));
    ASSERT_TRUE(expect_token(s->rfd, 1));
    hca_counters_t cnt0;
    ASSERT_EQ(0, hca_device_counters(c.dev, &cnt0));

    /* waits (as a sleeping consumer does) for the SEND with imm */
    auto wait_send = [&](uint32_t imm, double *el_ms) {
        const double t0 = now_ms();
        hca_wc_t wc;
        bool got = false;
        while (!got && (now_ms() - t0 < 5000)) {
            (void)hca_cq_wait(cq->cq, 3000);
            cq->poll_once();
            got = cq->pop(&wc);
        }
        *el_ms = now_ms() - t0;
        ASSERT_TRUE(got) << "no SEND came past the unstamped claim";
        EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
        EXPECT_EQ(imm, wc.imm_data);
    };
    ASSERT_TRUE(send_token(p->wfd, 1));
    ASSERT_TRUE(expect_token(p->rfd, 1)); /* head taken, nothing stamped */
    ASSERT_TRUE(send_token(s->wfd, 1));
    double el1 = 0, el2 = 0;
    wait_send(REAL_IMM + 1, &el1);
    EXPECT_LT(el1, 1000.0) << "the SEND waited long behind the claim";

    /* the stopped producer goes on: its slot is gone, it must not write */
    ASSERT_TRUE(send_token(p->wfd, 2));
    EXPECT_TRUE(expect_token(p->rfd, 3))
            << "the producer still owned the slot its consumer freed";
    EXPECT_TRUE(wait_child(p));
    ASSERT_TRUE(send_token(s->wfd, 2));
    wait_send(REAL_IMM + 2, &el2);
    hca_counters_t cnt1;
    ASSERT_EQ(0, hca_device_counters(c.dev, &cnt1));
    EXPECT_EQ(1u, cnt1.errors[HCA_WC_GENERAL_ERR] -
                          cnt0.errors[HCA_WC_GENERAL_ERR])
            << "the reaped slot was not counted once";
    printf("[ INFO ] the SEND behind the unstamped claim arrived after "
           "%.0f ms; the next after %.1f ms\n", el1, el2);
    ASSERT_TRUE(send_token(s->wfd, 0));
    EXPECT_TRUE(wait_child(s));
}

/* ------------------------------------------------------------ answers */

namespace {

/* Lines of /proc/self/maps: this process's mappings. */
int maps_count()
{
    FILE *f = fopen("/proc/self/maps", "r");
    int n   = 0;
    if (f == nullptr) {
        return -1;
    }
    for (int c; (c = fgetc(f)) != EOF;) {
        n += (c == '\n');
    }
    fclose(f);
    return n;
}

/* A target that answers through its responder thread: a QP that accepts
 * any source and one MR of plain memory (atomics on it are executed by
 * the responder).  Sends its info, then on token 1 its mapping count
 * before and now, then exits on token 2. */
void answering_target(int rfd, int wfd)
{
    ctx c;
    ASSERT_TRUE(c.open(0));
    hca_pd_t *pd = c.new_pd();
    cqw *cq      = c.new_cq(64);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = c.new_qp(pd, cq, cq);
    ASSERT_NE(nullptr, qp);
    ASSERT_EQ(0, qp_to_init(qp, REMOTE_ALL));
    ASSERT_EQ(0, qp_to_rtr(qp, c.addr, HCA_QPN_ANY));
    uint8_t *buf = c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, buf);
    memset(buf, 0, 4096);
    hca_mr_t *mr = c.reg(pd, buf, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    peer_info me;
    memset(&me, 0, sizeof(me));
    me.addr     = c.addr;
    me.qpn[0]   = hca_qp_num(qp);
    me.raddr[0] = (uint64_t)(uintptr_t)buf;
    me.rkey[0]  = hca_mr_rkey(mr);
    int before  = maps_count();
    ASSERT_TRUE(send_msg(wfd, me));
    ASSERT_TRUE(expect_token(rfd, 1, 300000));
    int counts[2] = {before, maps_count()};
    ASSERT_TRUE(send_msg(wfd, counts));
    ASSERT_TRUE(expect_token(rfd, 2));
}

/* One QP of this process: connect to the target, fetch-add 1 on its
 * plain memory (its responder answers), wait for the completion. */
hca_wc_status_t churn_fetch_add(ctx &c, hca_pd_t *pd, cqw *cq,
                                const peer_info &t, uint64_t *result,
                                uint32_t lkey)
{
    hca_qp_t *qp = c.new_qp(pd, cq, cq);
    if (qp == nullptr) {
        return HCA_WC_GENERAL_ERR;
    }
    hca_wc_status_t st = HCA_WC_GENERAL_ERR;
    if (connect_qp(qp, t.addr, t.qpn[0]) == 0) {
        hca_sge_t s      = mk_sge(result, 8, lkey);
        hca_send_wr_t wr = mk_wr(HCA_WR_ATOMIC_FETCH_ADD, &s, 1,
                                 HCA_SEND_SIGNALED, 7, t.raddr[0], t.rkey[0]);
        wr.compare_add = 1;
        hca_wc_t wc;
        if ((post_retry(qp, &wr) == 0) && wait_wc(cq, &wc, TIMEOUT_MS)) {
            st = wc.status;
        }
    }
    c.destroy_qp(qp);
    return st;
}

} // namespace

/* Many QPs, one after the other, each answered once by the target's
 * responder: the target's mappings of their q objects stay bounded (it
 * kept every one, and at vm.max_map_count it dropped requests without an
 * answer), and every operation completes with the right value. */
TEST_F(hca_test, QpChurnBoundedMappings)
{
    const int QPS = 800; /* > 3 x the target's cache of q objects */
    child_t *tch  = fork_child(answering_target, 300);
    ASSERT_NE(nullptr, tch);
    peer_info t;
    ASSERT_TRUE(recv_msg(tch->rfd, &t));

    ctx c;
    ASSERT_TRUE(c.open(0));
    hca_pd_t *pd = c.new_pd();
    cqw *cq      = c.new_cq(64);
    ASSERT_NE(nullptr, cq);
    uint64_t *result = (uint64_t*)c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, result);
    hca_mr_t *mr = c.reg(pd, result, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    for (int i = 0; i < QPS; ++i) {
        *result = ~0ull;
        ASSERT_EQ(HCA_WC_SUCCESS,
                  churn_fetch_add(c, pd, cq, t, result, hca_mr_lkey(mr)))
                << "QP " << i;
        ASSERT_EQ((uint64_t)i, *result) << "QP " << i;
    }
    ASSERT_TRUE(send_token(tch->wfd, 1));
    int counts[2];
    ASSERT_TRUE(recv_msg(tch->rfd, &counts));
    EXPECT_LT(counts[1] - counts[0], 300)
            << "the target maps " << counts[1] - counts[0]
            << " more objects after answering " << QPS << " QPs";
    ASSERT_TRUE(send_token(tch->wfd, 2));
    EXPECT_TRUE(wait_child(tch));
}

/* A target that cannot map the requester's q object (injected: every
 * mapping fails) cannot answer; the requester is told, and its WR fails
 * with REM_OP_ERR at its next liveness check instead of waiting
 * forever. */
TEST_F(hca_test, UnanswerableRequestFails)
{
    child_t *tch = fork_child([](int rfd, int wfd) {
        setenv("HCA_FAULT", "map=1", 1);
        answering_target(rfd, wfd);
    }, 60);
    ASSERT_NE(nullptr, tch);
    peer_info t;
    ASSERT_TRUE(recv_msg(tch->rfd, &t));

    ctx c;
    ASSERT_TRUE(c.open(0));
    hca_pd_t *pd = c.new_pd();
    cqw *cq      = c.new_cq(64);
    ASSERT_NE(nullptr, cq);
    uint64_t *result = (uint64_t*)c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, result);
    hca_mr_t *mr = c.reg(pd, result, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    double t0 = now_ms();
    EXPECT_EQ(HCA_WC_REM_OP_ERR,
              churn_fetch_add(c, pd, cq, t, result, hca_mr_lkey(mr)));
    EXPECT_LT(now_ms() - t0, 1000.0);
    ASSERT_TRUE(send_token(tch->wfd, 1));
    int counts[2];
    ASSERT_TRUE(recv_msg(tch->rfd, &counts));
    ASSERT_TRUE(send_token(tch->wfd, 2));
    EXPECT_TRUE(wait_child(tch));
}

/* ------------------------------------------------------------ faults */

/* Injected delays lose nothing: a target whose responder answers 2 ms
 * late and that stops consuming its receive ring for 50 ms out of every
 * 100 still executes every fetch-add exactly once and receives every
 * SEND, in order (senders meet a full ring and retry). */
TEST_F(hca_test, InjectedDelaysLoseNothing)
{
    const int ADDS = 100, SENDS = 300;
    child_t *tch   = fork_child([](int rfd, int wfd) {
        setenv("HCA_FAULT", "answer_delay_us=2000,ring_stall_ms=50", 1);
        ctx c;
        ASSERT_TRUE(c.open(0));
        hca_pd_t *pd = c.new_pd();
        cqw *cq      = c.new_cq(1024);
        ASSERT_NE(nullptr, cq);
        hca_qp_t *qp = c.new_qp(pd, cq, cq);
        ASSERT_NE(nullptr, qp);
        ASSERT_EQ(0, qp_to_init(qp, REMOTE_ALL));
        ASSERT_EQ(0, qp_to_rtr(qp, c.addr, HCA_QPN_ANY));
        uint8_t *buf = c.alloc(MEM_MALLOC, 4096 + 64 * 64);
        ASSERT_NE(nullptr, buf);
        memset(buf, 0, 4096);
        hca_mr_t *mr = c.reg(pd, buf, 4096 + 64 * 64, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        for (int i = 0; i < 64; ++i) {
            ASSERT_EQ(0, post_recv1(qp, buf + 4096 + i * 64, 64,
                                    hca_mr_lkey(mr), i));
        }
        peer_info me;
        memset(&me, 0, sizeof(me));
        me.addr     = c.addr;
        me.qpn[0]   = hca_qp_num(qp);
        me.raddr[0] = (uint64_t)(uintptr_t)buf;
        me.rkey[0]  = hca_mr_rkey(mr);
        ASSERT_TRUE(send_msg(wfd, me));
        uint32_t next = 0;
        double end    = now_ms() + 60000;
        while ((next < (uint32_t)SENDS) && (now_ms() < end)) {
            progress_all();
            hca_wc_t wc;
            while (cq->pop(&wc)) {
                ASSERT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
                EXPECT_EQ(next, wc.imm_data) << "out of order";
                ++next;
                ASSERT_EQ(0, post_recv1(qp, buf + 4096 + wc.wr_id * 64, 64,
                                        hca_mr_lkey(mr), wc.wr_id));
            }
        }
        EXPECT_EQ((uint32_t)SENDS, next) << "SENDs received";
        ASSERT_TRUE(expect_token(rfd, 1));
        uint64_t total;
        memcpy(&total, buf, 8);
        ASSERT_TRUE(send_msg(wfd, total));
    }, 120);
    ASSERT_NE(nullptr, tch);
    peer_info t;
    ASSERT_TRUE(recv_msg(tch->rfd, &t));

    ctx c;
    ASSERT_TRUE(c.open(0));
    hca_pd_t *pd = c.new_pd();
    cqw *cq      = c.new_cq(1024);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = c.new_qp(pd, cq, cq);
    ASSERT_NE(nullptr, qp);
    ASSERT_EQ(0, connect_qp(qp, t.addr, t.qpn[0]));
    uint64_t *result = (uint64_t*)c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, result);
    hca_mr_t *mr = c.reg(pd, result, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    for (int i = 0; i < ADDS; ++i) {
        hca_sge_t s      = mk_sge(result, 8, hca_mr_lkey(mr));
        hca_send_wr_t wr = mk_wr(HCA_WR_ATOMIC_FETCH_ADD, &s, 1,
                                 HCA_SEND_SIGNALED, i, t.raddr[0], t.rkey[0]);
        wr.compare_add = 1;
        ASSERT_EQ(0, post_retry(qp, &wr));
        ASSERT_TRUE(wait_status(cq, i, HCA_WC_SUCCESS));
        ASSERT_EQ((uint64_t)i, *result);
    }
    for (int i = 0; i < SENDS; ++i) {
        char msg[64] = {0};
        hca_sge_t s      = mk_sge(msg, sizeof(msg), 0);
        hca_send_wr_t wr = mk_wr(HCA_WR_SEND_WITH_IMM, &s, 1,
                                 HCA_SEND_SIGNALED | HCA_SEND_INLINE,
                                 1000 + i, 0, 0);
        wr.imm_data = (uint32_t)i;
        ASSERT_EQ(0, post_retry(qp, &wr));
        ASSERT_TRUE(wait_status(cq, 1000 + i, HCA_WC_SUCCESS));
    }
    ASSERT_TRUE(send_token(tch->wfd, 1));
    uint64_t total = 0;
    ASSERT_TRUE(recv_msg(tch->rfd, &total));
    EXPECT_EQ((uint64_t)ADDS, total) << "fetch-adds executed";
    EXPECT_TRUE(wait_child(tch));
}

/* Injected registration failures: each fails with -ENOMEM and leaves no
 * trace; the others work and deregister. */
TEST_F(hca_test, InjectedRegistrationFailures)
{
    child_t *ch = fork_child([](int, int) {
        setenv("HCA_FAULT", "reg=0.5", 1);
        ctx c;
        ASSERT_TRUE(c.open(0));
        hca_pd_t *pd = nullptr;
        ASSERT_EQ(0, hca_pd_alloc(c.dev, &pd));
        static uint8_t buf[4096];
        std::vector<hca_mr_t*> ok;
        int failed = 0;
        for (int i = 0; i < 200; ++i) {
            hca_mr_t *mr = nullptr;
            int rc = hca_mr_reg(pd, buf, sizeof(buf), ACCESS_ALL, &mr);
            if (rc == 0) {
                ok.push_back(mr);
            } else {
                ASSERT_EQ(-ENOMEM, rc);
                ++failed;
            }
        }
        EXPECT_GT(failed, 50);
        EXPECT_GT((int)ok.size(), 50);
        for (hca_mr_t *mr : ok) {
            ASSERT_EQ(0, hca_mr_dereg(mr));
        }
        EXPECT_EQ(0, hca_pd_dealloc(pd)) << "a failed registration kept a "
                                            "reference";
    }, 60);
    ASSERT_NE(nullptr, ch);
    EXPECT_TRUE(wait_child(ch));
}
