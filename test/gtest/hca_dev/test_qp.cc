/*
 * test_qp.cc - queue pairs: creation, the state machine, posting in the
 * wrong state, flushing on ERR, send queue full, SRQ shared by 16 QPs,
 * target-side refusals (state, source), malformed WRs.
 */
#include "test_common.h"

#include <map>

using namespace hcat;

/* Two device contexts, a (requester) and b (target).  The CQs of b are not
 * registered for progress_all(): b progresses only when a test polls it. */
class Qp : public hca_test {
protected:
    ctx       a, b;
    hca_pd_t *pa = nullptr, *pb = nullptr;

    void SetUp() override
    {
        hca_test::SetUp();
        ASSERT_TRUE(a.open());
        ASSERT_TRUE(b.open());
        pa = a.new_pd();
        pb = b.new_pd();
        ASSERT_NE(nullptr, pa);
        ASSERT_NE(nullptr, pb);
    }

    struct side {
        hca_qp_t *qp;
        cqw      *scq;
        cqw      *rcq;
    };

    side mk_a(uint32_t depth = 128)
    {
        side s;
        s.scq = a.new_cq(4 * depth + 16);
        s.rcq = a.new_cq(4 * depth + 16);
        s.qp  = (s.rcq != nullptr) ? a.new_qp(pa, s.scq, s.rcq, a.caps(depth))
                                   : nullptr;
        return s;
    }

    side mk_b(uint32_t depth = 128)
    {
        side s;
        s.scq = b.new_cq(4 * depth + 16, false);
        s.rcq = b.new_cq(4 * depth + 16, false);
        s.qp  = (s.rcq != nullptr) ? b.new_qp(pb, s.scq, s.rcq, b.caps(depth))
                                   : nullptr;
        return s;
    }

    /* connects x (in a) and y (in b) both ways */
    void connect(const side &x, const side &y)
    {
        ASSERT_EQ(0, connect_qp(y.qp, a.addr, hca_qp_num(x.qp)));
        ASSERT_EQ(0, connect_qp(x.qp, b.addr, hca_qp_num(y.qp)));
    }

    /* brings a fresh QP of a to state st */
    void bring_to(hca_qp_t *qp, hca_qp_state_t st)
    {
        ASSERT_EQ(HCA_QPS_RESET, hca_qp_state(qp));
        if (st == HCA_QPS_RESET) {
            return;
        }
        if (st == HCA_QPS_ERR) {
            ASSERT_EQ(0, qp_to_state(qp, HCA_QPS_ERR));
            ASSERT_EQ(HCA_QPS_ERR, hca_qp_state(qp));
            return;
        }
        ASSERT_EQ(0, qp_to_init(qp));
        if (st == HCA_QPS_INIT) {
            return;
        }
        ASSERT_EQ(0, qp_to_rtr(qp, b.addr, 1));
        if (st == HCA_QPS_RTR) {
            return;
        }
        ASSERT_EQ(0, qp_to_rts(qp));
    }
};

TEST_F(Qp, CreateDestroy)
{
    cqw *cq = a.new_cq(64);
    ASSERT_NE(nullptr, cq);
    std::vector<uint32_t> qpns;
    for (int i = 0; i < 8; ++i) {
        hca_qp_t *qp = a.new_qp(pa, cq, cq);
        ASSERT_NE(nullptr, qp);
        EXPECT_EQ(HCA_QPS_RESET, hca_qp_state(qp));
        EXPECT_EQ(0u, hca_qp_outstanding(qp));
        uint32_t n = hca_qp_num(qp);
        EXPECT_NE(HCA_QPN_ANY, n);
        EXPECT_EQ(qpns.end(), std::find(qpns.begin(), qpns.end(), n))
                << "duplicate QP number " << n;
        qpns.push_back(n);
    }
    while (!a.qps.empty()) {
        EXPECT_EQ(0, a.destroy_qp(a.qps.back()));
    }
}

TEST_F(Qp, CreateLimits)
{
    cqw *cq = a.new_cq(64);
    ASSERT_NE(nullptr, cq);
    hca_qp_init_attr_t ia;
    hca_qp_t *qp = nullptr;
    auto base    = [&]() {
        memset(&ia, 0, sizeof(ia));
        ia.send_cq      = cq->cq;
        ia.recv_cq      = cq->cq;
        ia.max_send_wr  = 16;
        ia.max_recv_wr  = 16;
        ia.max_send_sge = 1;
        ia.max_recv_sge = 1;
    };
    base();
    ASSERT_EQ(0, hca_qp_create(pa, &ia, &qp));
    EXPECT_EQ(0, hca_qp_destroy(qp));
    if (a.attr.max_qp_wr < UINT32_MAX) {
        base();
        ia.max_send_wr = a.attr.max_qp_wr + 1;
        EXPECT_LT(hca_qp_create(pa, &ia, &qp), 0) << "max_send_wr";
        base();
        ia.max_recv_wr = a.attr.max_qp_wr + 1;
        EXPECT_LT(hca_qp_create(pa, &ia, &qp), 0) << "max_recv_wr";
    }
    if (a.attr.max_sge < UINT32_MAX) {
        base();
        ia.max_send_sge = a.attr.max_sge + 1;
        EXPECT_LT(hca_qp_create(pa, &ia, &qp), 0) << "max_send_sge";
    }
    if (a.attr.max_inline_data < UINT32_MAX) {
        base();
        ia.max_inline_data = a.attr.max_inline_data + 1;
        EXPECT_LT(hca_qp_create(pa, &ia, &qp), 0) << "max_inline_data";
    }
    base();
    ia.send_cq = nullptr;
    EXPECT_LT(hca_qp_create(pa, &ia, &qp), 0) << "no send CQ";
}

TEST_F(Qp, LegalTransitions)
{
    cqw *cq      = a.new_cq(64);
    hca_qp_t *qp = a.new_qp(pa, cq, cq);
    ASSERT_NE(nullptr, qp);
    for (int round = 0; round < 3; ++round) {
        ASSERT_EQ(HCA_QPS_RESET, hca_qp_state(qp));
        ASSERT_EQ(0, qp_to_init(qp));
        ASSERT_EQ(HCA_QPS_INIT, hca_qp_state(qp));
        ASSERT_EQ(0, qp_to_rtr(qp, b.addr, 7));
        ASSERT_EQ(HCA_QPS_RTR, hca_qp_state(qp));
        ASSERT_EQ(0, qp_to_rts(qp));
        ASSERT_EQ(HCA_QPS_RTS, hca_qp_state(qp));
        if (round == 1) {
            ASSERT_EQ(0, qp_to_state(qp, HCA_QPS_ERR));
            ASSERT_EQ(HCA_QPS_ERR, hca_qp_state(qp));
        }
        /* any -> RESET: the QP can be used again */
        ASSERT_EQ(0, qp_to_state(qp, HCA_QPS_RESET));
    }
    /* any -> ERR, any -> RESET from every state */
    const hca_qp_state_t from[] = {HCA_QPS_RESET, HCA_QPS_INIT, HCA_QPS_RTR,
                                   HCA_QPS_RTS, HCA_QPS_ERR};
    for (hca_qp_state_t f : from) {
        for (hca_qp_state_t to : {HCA_QPS_ERR, HCA_QPS_RESET}) {
            ASSERT_NO_FATAL_FAILURE(bring_to(qp, f));
            EXPECT_EQ(0, qp_to_state(qp, to)) << f << " -> " << to;
            EXPECT_EQ(to, hca_qp_state(qp)) << f << " -> " << to;
            ASSERT_EQ(0, qp_to_state(qp, HCA_QPS_RESET));
        }
    }
}

/* Transitions outside RESET->INIT->RTR->RTS, any->ERR, any->RESET give
 * -EINVAL and change nothing (the attributes the target state takes are
 * given, so that only the transition itself is wrong). */
TEST_F(Qp, IllegalTransitions)
{
    cqw *cq      = a.new_cq(64);
    hca_qp_t *qp = a.new_qp(pa, cq, cq);
    ASSERT_NE(nullptr, qp);
    struct {
        hca_qp_state_t from, to;
    } bad[] = {
        {HCA_QPS_RESET, HCA_QPS_RTR}, {HCA_QPS_RESET, HCA_QPS_RTS},
        {HCA_QPS_INIT, HCA_QPS_RTS},  {HCA_QPS_RTR, HCA_QPS_INIT},
        {HCA_QPS_RTS, HCA_QPS_INIT},  {HCA_QPS_RTS, HCA_QPS_RTR},
        {HCA_QPS_ERR, HCA_QPS_INIT},  {HCA_QPS_ERR, HCA_QPS_RTR},
        {HCA_QPS_ERR, HCA_QPS_RTS},
    };
    for (auto &t : bad) {
        ASSERT_EQ(0, qp_to_state(qp, HCA_QPS_RESET));
        ASSERT_NO_FATAL_FAILURE(bring_to(qp, t.from));
        hca_qp_attr_t at;
        memset(&at, 0, sizeof(at));
        at.qp_state    = t.to;
        at.dest        = b.addr;
        at.dest_qp_num = 1;
        at.access      = REMOTE_ALL;
        unsigned mask  = HCA_QP_ATTR_STATE;
        if (t.to == HCA_QPS_INIT) {
            mask |= HCA_QP_ATTR_ACCESS;
        }
        if (t.to == HCA_QPS_RTR) {
            mask |= HCA_QP_ATTR_DEST;
        }
        EXPECT_EQ(-EINVAL, hca_qp_modify(qp, &at, mask))
                << t.from << " -> " << t.to;
        EXPECT_EQ(t.from, hca_qp_state(qp))
                << "state changed by a refused " << t.from << " -> " << t.to;
    }
    /* not a state */
    ASSERT_EQ(0, qp_to_state(qp, HCA_QPS_RESET));
    EXPECT_EQ(-EINVAL, qp_to_state(qp, HCA_QPS_LAST));
    EXPECT_EQ(-EINVAL, qp_to_state(qp, (hca_qp_state_t)77));
    EXPECT_EQ(HCA_QPS_RESET, hca_qp_state(qp));
}

/* The header lists the legal transitions; INIT->INIT, RTR->RTR and RTS->RTS
 * are not among them (unlike IB verbs), so they are refused. */
TEST_F(Qp, SelfTransitionsRefused)
{
    cqw *cq      = a.new_cq(64);
    hca_qp_t *qp = a.new_qp(pa, cq, cq);
    ASSERT_NE(nullptr, qp);
    for (hca_qp_state_t s : {HCA_QPS_INIT, HCA_QPS_RTR, HCA_QPS_RTS}) {
        ASSERT_EQ(0, qp_to_state(qp, HCA_QPS_RESET));
        ASSERT_NO_FATAL_FAILURE(bring_to(qp, s));
        hca_qp_attr_t at;
        memset(&at, 0, sizeof(at));
        at.qp_state    = s;
        at.dest        = b.addr;
        at.dest_qp_num = 1;
        EXPECT_EQ(-EINVAL, hca_qp_modify(qp, &at, HCA_QP_ATTR_STATE))
                << s << " -> " << s;
        EXPECT_EQ(s, hca_qp_state(qp));
    }
}

/* INIT->RTR takes the destination: without HCA_QP_ATTR_DEST it is refused. */
TEST_F(Qp, RtrNeedsDest)
{
    cqw *cq      = a.new_cq(64);
    hca_qp_t *qp = a.new_qp(pa, cq, cq);
    ASSERT_NE(nullptr, qp);
    ASSERT_EQ(0, qp_to_init(qp));
    EXPECT_EQ(-EINVAL, qp_to_state(qp, HCA_QPS_RTR));
    EXPECT_EQ(HCA_QPS_INIT, hca_qp_state(qp));
}

TEST_F(Qp, PostSendWrongState)
{
    side x = mk_a();
    ASSERT_NE(nullptr, x.qp);
    uint8_t *buf = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr = a.reg(pa, buf, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    for (hca_qp_state_t s : {HCA_QPS_RESET, HCA_QPS_INIT, HCA_QPS_RTR}) {
        ASSERT_EQ(0, qp_to_state(x.qp, HCA_QPS_RESET));
        ASSERT_NO_FATAL_FAILURE(bring_to(x.qp, s));
        hca_sge_t sg        = mk_sge(buf, 8, hca_mr_lkey(mr));
        hca_send_wr_t wr    = mk_wr(HCA_WR_SEND, &sg, 1, HCA_SEND_SIGNALED, 1);
        hca_send_wr_t *badw = nullptr;
        EXPECT_EQ(-EINVAL, hca_post_send(x.qp, &wr, &badw)) << "in " << s;
        EXPECT_EQ(&wr, badw);
        hca_send_wr_t w2 = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED,
                                 2, 0x1000, 1);
        EXPECT_EQ(-EINVAL, hca_post_send(x.qp, &w2, &badw)) << "in " << s;
        EXPECT_EQ(0u, hca_qp_outstanding(x.qp));
        EXPECT_EQ(s, hca_qp_state(x.qp));
    }
    EXPECT_TRUE(expect_no_wc(x.scq, 50));
}

/* Posting to a QP in ERR is accepted and completes with WR_FLUSH_ERR. */
TEST_F(Qp, PostInErrFlushes)
{
    side x = mk_a();
    ASSERT_NE(nullptr, x.qp);
    uint8_t *buf = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr = a.reg(pa, buf, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    ASSERT_NO_FATAL_FAILURE(bring_to(x.qp, HCA_QPS_RTS));
    ASSERT_EQ(0, qp_to_state(x.qp, HCA_QPS_ERR));
    memset(buf, 1, 64);
    hca_sge_t sg     = mk_sge(buf, 8, hca_mr_lkey(mr));
    hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &sg, 1, HCA_SEND_SIGNALED, 11);
    hca_send_wr_t *badw;
    ASSERT_EQ(0, hca_post_send(x.qp, &wr, &badw));
    EXPECT_TRUE(wait_status(x.scq, 11, HCA_WC_WR_FLUSH_ERR));
    /* unsignaled WRs complete (with error) too */
    wr.send_flags = 0;
    wr.wr_id      = 12;
    ASSERT_EQ(0, hca_post_send(x.qp, &wr, &badw));
    EXPECT_TRUE(wait_status(x.scq, 12, HCA_WC_WR_FLUSH_ERR));
    ASSERT_EQ(0, post_recv1(x.qp, buf, 64, hca_mr_lkey(mr), 13));
    EXPECT_TRUE(wait_status(x.rcq, 13, HCA_WC_WR_FLUSH_ERR));
    EXPECT_EQ(-1, check_byte(buf, 64, 1));
}

/* Moving to ERR flushes every outstanding send and receive WQE, in post
 * order, each exactly once. */
TEST_F(Qp, ErrFlushesOutstanding)
{
    side x = mk_a(), y = mk_b();
    ASSERT_NE(nullptr, x.qp);
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x, y));
    const size_t BIG = 1 << 20;
    uint8_t *buf     = a.alloc(MEM_MALLOC, BIG + 8 * 64);
    hca_mr_t *mr     = a.reg(pa, buf, BIG + 8 * 64, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    uint8_t *tb   = b.alloc(MEM_MALLOC, 4096);
    hca_mr_t *tmr = b.reg(pb, tb, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);

    /* receives of x: nobody sends to x */
    const int R = 8;
    for (int i = 0; i < R; ++i) {
        ASSERT_EQ(0, post_recv1(x.qp, buf + BIG + i * 64, 64,
                                hca_mr_lkey(mr), 1000 + i));
    }
    /* sends of x: y never posts a receive and is never polled, so the
     * 1 MiB SENDs cannot complete; the writes queue behind them */
    const int S  = 8;
    int nposted  = 0;
    for (int i = 0; i < S; ++i) {
        hca_sge_t sg     = mk_sge(buf, (i < 4) ? BIG : 64, hca_mr_lkey(mr));
        hca_send_wr_t wr = mk_wr((i < 4) ? HCA_WR_SEND : HCA_WR_RDMA_WRITE,
                                 &sg, 1, HCA_SEND_SIGNALED, i,
                                 (uint64_t)(uintptr_t)tb, hca_mr_rkey(tmr));
        hca_send_wr_t *badw;
        int rc = hca_post_send(x.qp, &wr, &badw);
        ASSERT_TRUE((rc == 0) || (rc == -EAGAIN)) << rc;
        if (rc == -EAGAIN) {
            break;   /* y's ring is full: enough outstanding */
        }
        ++nposted;
    }
    uint32_t out = hca_qp_outstanding(x.qp);
    EXPECT_GE(out, 1u) << "nothing outstanding to flush";
    ASSERT_EQ(0, qp_to_state(x.qp, HCA_QPS_ERR));
    EXPECT_EQ(HCA_QPS_ERR, hca_qp_state(x.qp));

    std::vector<hca_wc_t> sw, rw;
    /* every posted send WR completes once */
    double end = now_ms() + TIMEOUT_MS;
    for (;;) {
        progress_all();
        hca_wc_t wc;
        while (x.scq->pop(&wc)) {
            sw.push_back(wc);
        }
        while (x.rcq->pop(&wc)) {
            rw.push_back(wc);
        }
        if ((rw.size() >= (size_t)R) && (sw.size() >= (size_t)nposted)) {
            break;
        }
        ASSERT_LT(now_ms(), end) << "flush incomplete: " << sw.size()
                                 << " send and " << rw.size()
                                 << " recv completions";
    }
    EXPECT_TRUE(expect_no_wc(x.scq, 20));
    ASSERT_EQ((size_t)nposted, sw.size());
    EXPECT_LE(out, (uint32_t)nposted);
    size_t nflush = 0;
    for (size_t i = 0; i < sw.size(); ++i) {
        EXPECT_EQ(i, sw[i].wr_id) << "send completions out of order";
        if (sw[i].status == HCA_WC_WR_FLUSH_ERR) {
            ++nflush;
        } else {
            EXPECT_EQ(0u, nflush) << "a success after a flush";
            EXPECT_EQ(HCA_WC_SUCCESS, sw[i].status) << wc_str(sw[i]);
        }
    }
    EXPECT_EQ((size_t)out, nflush)
            << "every WR outstanding at the move to ERR is flushed";
    EXPECT_EQ(HCA_WC_WR_FLUSH_ERR, sw.empty() ? HCA_WC_SUCCESS : sw[0].status)
            << "a 1 MiB SEND without a receive cannot have completed";
    ASSERT_EQ((size_t)R, rw.size());
    for (int i = 0; i < R; ++i) {
        EXPECT_EQ((uint64_t)(1000 + i), rw[i].wr_id) << "recv flush order";
        EXPECT_EQ(HCA_WC_WR_FLUSH_ERR, rw[i].status) << wc_str(rw[i]);
    }
    EXPECT_EQ(0u, hca_qp_outstanding(x.qp));
}

/* A full send queue gives -ENOMEM (bad_wr: the refused WR); once the
 * completions are polled, posting works again. */
TEST_F(Qp, SendQueueFull)
{
    const uint32_t D = 16;
    side x = mk_a(D), y = mk_b(256);
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x, y));
    uint8_t *buf = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr = a.reg(pa, buf, 64, ACCESS_ALL);
    uint8_t *tb   = b.alloc(MEM_MALLOC, 64 * 1024);
    hca_mr_t *tmr = b.reg(pb, tb, 64 * 1024, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);
    ASSERT_NE(nullptr, mr);

    /* y has no receive posted and is not polled; x is not polled: nothing
     * can free a send queue entry */
    uint32_t n = 0;
    int rc     = 0;
    hca_sge_t sg = mk_sge(buf, 64, hca_mr_lkey(mr));
    hca_send_wr_t wr;
    hca_send_wr_t *badw = nullptr;
    for (;;) {
        wr = mk_wr(HCA_WR_SEND, &sg, 1, HCA_SEND_SIGNALED, n);
        rc = hca_post_send(x.qp, &wr, &badw);
        if (rc != 0) {
            break;
        }
        ++n;
        ASSERT_LE(n, std::max<uint32_t>(a.attr.max_qp_wr, 1024))
                << "the send queue never fills";
    }
    EXPECT_EQ(-ENOMEM, rc) << "after " << n << " posts";
    EXPECT_EQ(&wr, badw);
    EXPECT_GE(n, D) << "fewer than max_send_wr WRs fit";
    EXPECT_EQ(n, hca_qp_outstanding(x.qp));
    ASSERT_LE(n, 1024u);

    for (uint32_t i = 0; i < n; ++i) {
        ASSERT_EQ(0, post_recv1(y.qp, tb + i * 64, 64, hca_mr_lkey(tmr), i));
    }
    uint32_t sdone = 0, rdone = 0;
    double end     = now_ms() + TIMEOUT_MS;
    while ((sdone < n) || (rdone < n)) {
        ASSERT_LT(now_ms(), end) << sdone << " sends, " << rdone
                                 << " receives of " << n;
        progress_all();
        y.rcq->poll_once();
        hca_wc_t wc;
        while (x.scq->pop(&wc)) {
            ASSERT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
            ASSERT_EQ(sdone, wc.wr_id);
            ++sdone;
        }
        while (y.rcq->pop(&wc)) {
            ASSERT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
            ASSERT_EQ(rdone, wc.wr_id);
            ++rdone;
        }
    }
    /* room again */
    wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED, 777,
               (uint64_t)(uintptr_t)tb, hca_mr_rkey(tmr));
    EXPECT_EQ(0, hca_post_send(x.qp, &wr, &badw));
    EXPECT_TRUE(wait_ok(x.scq, 777, HCA_WC_RDMA_WRITE));
}

/* A chain longer than the free send queue: the WRs before bad_wr are
 * posted (and complete), bad_wr and later are not. */
TEST_F(Qp, SendQueueFullChain)
{
    const uint32_t D = 16;
    side x = mk_a(D), y = mk_b(256);
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x, y));
    uint8_t *buf  = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr  = a.reg(pa, buf, 64, ACCESS_ALL);
    uint8_t *tb   = b.alloc(MEM_MALLOC, 64);
    hca_mr_t *tmr = b.reg(pb, tb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);
    ASSERT_NE(nullptr, mr);
    const uint32_t N = std::min<uint32_t>(4096, std::max<uint32_t>(
                                                        a.attr.max_qp_wr, 64) +
                                                        16);
    std::vector<hca_sge_t> sg(N);
    std::vector<hca_send_wr_t> wr(N);
    for (uint32_t i = 0; i < N; ++i) {
        sg[i] = mk_sge(buf, 8, hca_mr_lkey(mr));
        wr[i] = mk_wr(HCA_WR_RDMA_WRITE, &sg[i], 1, HCA_SEND_SIGNALED, i,
                      (uint64_t)(uintptr_t)tb, hca_mr_rkey(tmr));
        wr[i].next = (i + 1 < N) ? &wr[i + 1] : nullptr;
    }
    hca_send_wr_t *badw = nullptr;
    ASSERT_EQ(-ENOMEM, hca_post_send(x.qp, &wr[0], &badw));
    ASSERT_NE(nullptr, badw);
    size_t k = (size_t)(badw - &wr[0]);
    ASSERT_LT(k, (size_t)N) << "bad_wr is not in the chain";
    EXPECT_GE(k, (size_t)D);
    std::vector<hca_wc_t> w;
    ASSERT_TRUE(wait_wcs(x.scq, k, &w));
    for (size_t i = 0; i < k; ++i) {
        EXPECT_EQ(HCA_WC_SUCCESS, w[i].status);
        EXPECT_EQ(i, w[i].wr_id);
    }
    EXPECT_TRUE(expect_no_wc(x.scq, 50)) << "a WR from bad_wr on was posted";
}

/* One SRQ feeds 16 QPs: every message is received once, in order per
 * sender, with the right qp_num and src_qp; receives are reposted. */
TEST_F(Qp, SrqShared16)
{
    const int NQ = 16, N = 40;
    const uint32_t MW = 128;
    const size_t MS   = 64;
    hca_srq_t *srq = b.new_srq(pb, MW);
    ASSERT_NE(nullptr, srq);
    cqw *brcq = b.new_cq(2048, false), *bscq = b.new_cq(64, false);
    cqw *ascq = a.new_cq(2048), *arcq = a.new_cq(64);
    ASSERT_NE(nullptr, arcq);
    ASSERT_NE(nullptr, bscq);
    std::vector<hca_qp_t*> aq(NQ), bq(NQ);
    std::map<uint32_t, int> aidx, bidx;
    for (int i = 0; i < NQ; ++i) {
        aq[i] = a.new_qp(pa, ascq, arcq, a.caps(64));
        bq[i] = b.new_qp(pb, bscq, brcq, b.caps(64), srq);
        ASSERT_NE(nullptr, aq[i]);
        ASSERT_NE(nullptr, bq[i]);
        ASSERT_EQ(0, connect_qp(bq[i], a.addr, hca_qp_num(aq[i])));
        ASSERT_EQ(0, connect_qp(aq[i], b.addr, hca_qp_num(bq[i])));
        aidx[hca_qp_num(aq[i])] = i;
        bidx[hca_qp_num(bq[i])] = i;
    }
    uint8_t *rb   = b.alloc(MEM_MALLOC, MW * MS);
    hca_mr_t *rmr = b.reg(pb, rb, MW * MS, ACCESS_ALL);
    uint8_t *sb   = a.alloc(MEM_MALLOC, NQ * 64 * MS);
    hca_mr_t *smr = a.reg(pa, sb, NQ * 64 * MS, ACCESS_ALL);
    ASSERT_NE(nullptr, rmr);
    ASSERT_NE(nullptr, smr);
    for (uint32_t s = 0; s < MW; ++s) {
        ASSERT_EQ(0, post_srq_recv1(srq, rb + s * MS, MS, hca_mr_lkey(rmr), s));
    }
    std::vector<int> sent(NQ, 0), compl_(NQ, 0), recvd(NQ, 0);
    int total_r = 0, total_c = 0;
    double end  = now_ms() + TIMEOUT_MS;
    while ((total_r < NQ * N) || (total_c < NQ * N)) {
        ASSERT_LT(now_ms(), end) << total_r << " received, " << total_c
                                 << " completed of " << NQ * N;
        for (int i = 0; i < NQ; ++i) {
            if ((sent[i] < N) && (sent[i] - compl_[i] < 32)) {
                uint8_t *p   = sb + (i * 64 + sent[i] % 64) * MS;
                uint32_t hdr[2] = {(uint32_t)i, (uint32_t)sent[i]};
                memcpy(p, hdr, 8);
                fill_pattern(p + 8, MS - 8, i * 1000 + sent[i]);
                hca_sge_t sg     = mk_sge(p, MS, hca_mr_lkey(smr));
                hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &sg, 1,
                                         HCA_SEND_SIGNALED,
                                         (uint64_t)i * 1000000 + sent[i]);
                hca_send_wr_t *badw;
                int rc = hca_post_send(aq[i], &wr, &badw);
                if (rc == 0) {
                    ++sent[i];
                } else {
                    ASSERT_TRUE((rc == -EAGAIN) || (rc == -ENOMEM)) << rc;
                }
            }
        }
        progress_all();
        brcq->poll_once();
        bscq->poll_once();
        ASSERT_EQ(0, brcq->err);
        hca_wc_t wc;
        while (ascq->pop(&wc)) {
            ASSERT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
            ASSERT_EQ(1u, aidx.count(wc.qp_num));
            int i = aidx[wc.qp_num];
            ASSERT_EQ((uint64_t)i * 1000000 + compl_[i], wc.wr_id);
            ++compl_[i];
            ++total_c;
        }
        while (brcq->pop(&wc)) {
            ASSERT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
            ASSERT_EQ(HCA_WC_RECV, wc.opcode);
            ASSERT_EQ(MS, wc.byte_len);
            ASSERT_LT(wc.wr_id, (uint64_t)MW);
            const uint8_t *p = rb + wc.wr_id * MS;
            uint32_t hdr[2];
            memcpy(hdr, p, 8);
            ASSERT_LT(hdr[0], (uint32_t)NQ);
            int i = (int)hdr[0];
            EXPECT_EQ(hca_qp_num(aq[i]), wc.src_qp) << "src_qp";
            EXPECT_EQ(hca_qp_num(bq[i]), wc.qp_num) << "qp_num";
            ASSERT_EQ((uint32_t)recvd[i], hdr[1])
                    << "out of order from sender " << i;
            ASSERT_EQ(-1, check_pattern(p + 8, MS - 8, i * 1000 + hdr[1]));
            ++recvd[i];
            ++total_r;
            ASSERT_EQ(0, post_srq_recv1(srq, rb + wc.wr_id * MS, MS,
                                        hca_mr_lkey(rmr), wc.wr_id));
        }
    }
    EXPECT_TRUE(expect_no_wc(brcq, 20));
}

TEST_F(Qp, SrqFull)
{
    const uint32_t MW = 16;
    hca_srq_t *srq = b.new_srq(pb, MW);
    ASSERT_NE(nullptr, srq);
    uint8_t *rb   = b.alloc(MEM_MALLOC, 64);
    hca_mr_t *rmr = b.reg(pb, rb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, rmr);
    uint32_t n = 0;
    int rc;
    while ((rc = post_srq_recv1(srq, rb, 64, hca_mr_lkey(rmr), n)) == 0) {
        ++n;
        ASSERT_LE(n, std::max<uint32_t>(b.attr.max_srq_wr, 4096))
                << "the SRQ never fills";
    }
    EXPECT_EQ(-ENOMEM, rc);
    EXPECT_GE(n, MW);
}

TEST_F(Qp, PostRecvOnSrqQpRefused)
{
    hca_srq_t *srq = b.new_srq(pb, 16);
    cqw *cq        = b.new_cq(64, false);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = b.new_qp(pb, cq, cq, b.caps(16), srq);
    ASSERT_NE(nullptr, qp);
    ASSERT_EQ(0, connect_qp(qp, a.addr, 1));
    uint8_t *rb   = b.alloc(MEM_MALLOC, 64);
    hca_mr_t *rmr = b.reg(pb, rb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, rmr);
    EXPECT_EQ(-EINVAL, post_recv1(qp, rb, 64, hca_mr_lkey(rmr), 1))
            << "a QP with an SRQ has no receive queue of its own";
}

/* Inline data is copied at post: changing the buffer afterwards does not
 * change what is received. */
TEST_F(Qp, InlineSend)
{
    if (a.attr.max_inline_data == 0) {
        GTEST_SKIP() << "no inline data";
    }
    side x = mk_a(), y = mk_b();
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x, y));
    const size_t L = std::min<uint32_t>(64, a.attr.max_inline_data);
    uint8_t *buf   = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr   = a.reg(pa, buf, 64, ACCESS_ALL);
    uint8_t *tb    = b.alloc(MEM_MALLOC, 2 * 64);
    hca_mr_t *tmr  = b.reg(pb, tb, 2 * 64, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);
    ASSERT_NE(nullptr, mr);
    memset(tb, SENTINEL, 128);
    ASSERT_EQ(0, post_recv1(y.qp, tb, 64, hca_mr_lkey(tmr), 1));

    fill_pattern(buf, L, 5);
    hca_sge_t sg     = mk_sge(buf, L, hca_mr_lkey(mr));
    hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &sg, 1,
                             HCA_SEND_SIGNALED | HCA_SEND_INLINE, 1);
    hca_send_wr_t *badw;
    ASSERT_EQ(0, hca_post_send(x.qp, &wr, &badw));
    memset(buf, 0, 64);   /* too late to matter */
    /* and an inline RDMA write */
    fill_pattern(buf, L, 6);
    hca_send_wr_t w2 = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1,
                             HCA_SEND_SIGNALED | HCA_SEND_INLINE, 2,
                             (uint64_t)(uintptr_t)(tb + 64),
                             hca_mr_rkey(tmr));
    ASSERT_EQ(0, hca_post_send(x.qp, &w2, &badw));
    memset(buf, 0, 64);

    double end = now_ms() + TIMEOUT_MS;
    std::vector<hca_wc_t> rw;
    while (rw.empty()) {
        ASSERT_LT(now_ms(), end);
        progress_all();
        y.rcq->poll_once();
        hca_wc_t wc;
        while (y.rcq->pop(&wc)) {
            rw.push_back(wc);
        }
    }
    EXPECT_EQ(HCA_WC_SUCCESS, rw[0].status) << wc_str(rw[0]);
    EXPECT_EQ(L, rw[0].byte_len);
    EXPECT_EQ(-1, check_pattern(tb, L, 5));
    ASSERT_TRUE(wait_ok(x.scq, 1, HCA_WC_SEND));
    ASSERT_TRUE(wait_ok(x.scq, 2, HCA_WC_RDMA_WRITE));
    EXPECT_EQ(-1, check_pattern(tb + 64, L, 6));
}

TEST_F(Qp, InlineTooLarge)
{
    side x = mk_a(), y = mk_b();
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x, y));
    const size_t L = (size_t)a.attr.max_inline_data + 1;
    uint8_t *buf   = a.alloc(MEM_MALLOC, L);
    ASSERT_NE(nullptr, buf);
    hca_mr_t *mr   = a.reg(pa, buf, L, ACCESS_ALL);
    uint8_t *tb    = b.alloc(MEM_MALLOC, L);
    hca_mr_t *tmr  = b.reg(pb, tb, L, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);
    hca_sge_t sg     = mk_sge(buf, L, hca_mr_lkey(mr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1,
                             HCA_SEND_SIGNALED | HCA_SEND_INLINE, 1,
                             (uint64_t)(uintptr_t)tb, hca_mr_rkey(tmr));
    hca_send_wr_t *badw = nullptr;
    EXPECT_EQ(-EINVAL, hca_post_send(x.qp, &wr, &badw));
    EXPECT_EQ(&wr, badw);
    EXPECT_EQ(HCA_QPS_RTS, hca_qp_state(x.qp));
    EXPECT_TRUE(expect_no_wc(x.scq, 20));
}

/* Malformed WRs (too many SGEs, unknown opcode) are refused at post
 * (-EINVAL) or complete with LOC_QP_OP_ERR; either way nothing moves. */
TEST_F(Qp, MalformedWr)
{
    side x = mk_a(), y = mk_b();
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x, y));
    uint8_t *buf  = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr  = a.reg(pa, buf, 64, ACCESS_ALL);
    uint8_t *tb   = b.alloc(MEM_MALLOC, 64);
    hca_mr_t *tmr = b.reg(pb, tb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);
    memset(tb, SENTINEL, 64);
    memset(buf, 1, 64);
    const uint32_t nsge = a.caps().send_sge + 1;
    std::vector<hca_sge_t> sg(nsge, mk_sge(buf, 4, hca_mr_lkey(mr)));

    for (int k = 0; k < 2; ++k) {
        side z = mk_a();
        ASSERT_NE(nullptr, z.qp);
        side w = mk_b();
        ASSERT_NE(nullptr, w.qp);
        ASSERT_NO_FATAL_FAILURE(connect(z, w));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, sg.data(), 1,
                                 HCA_SEND_SIGNALED, 1,
                                 (uint64_t)(uintptr_t)tb, hca_mr_rkey(tmr));
        if (k == 0) {
            wr.num_sge = (int)nsge;   /* more than max_send_sge */
        } else {
            wr.opcode = HCA_WR_OPCODE_LAST;
        }
        hca_send_wr_t *badw = nullptr;
        int rc              = hca_post_send(z.qp, &wr, &badw);
        if (rc == 0) {
            hca_wc_t wc;
            ASSERT_TRUE(wait_wc(z.scq, &wc));
            EXPECT_EQ(HCA_WC_LOC_QP_OP_ERR, wc.status) << wc_str(wc);
        } else {
            EXPECT_EQ(-EINVAL, rc);
            EXPECT_EQ(&wr, badw);
        }
        EXPECT_EQ(-1, check_byte(tb, 64, SENTINEL)) << (k ? "opcode" : "sge");
    }
}

/* A receive buffer smaller than the message: LOC_LEN_ERR at the receiver;
 * the sender gets a completion (no hang). */
TEST_F(Qp, RecvTooSmall)
{
    side x = mk_a(), y = mk_b();
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x, y));
    uint8_t *buf  = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr  = a.reg(pa, buf, 64, ACCESS_ALL);
    uint8_t *tb   = b.alloc(MEM_MALLOC, 64);
    hca_mr_t *tmr = b.reg(pb, tb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);
    ASSERT_EQ(0, post_recv1(y.qp, tb, 16, hca_mr_lkey(tmr), 1));
    hca_sge_t sg     = mk_sge(buf, 64, hca_mr_lkey(mr));
    hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &sg, 1, HCA_SEND_SIGNALED, 2);
    hca_send_wr_t *badw;
    ASSERT_EQ(0, hca_post_send(x.qp, &wr, &badw));
    double end = now_ms() + TIMEOUT_MS;
    std::vector<hca_wc_t> rw, sw;
    while (rw.empty() || sw.empty()) {
        ASSERT_LT(now_ms(), end) << rw.size() << " recv, " << sw.size()
                                 << " send completions";
        progress_all();
        y.rcq->poll_once();
        hca_wc_t wc;
        while (y.rcq->pop(&wc)) {
            rw.push_back(wc);
        }
        while (x.scq->pop(&wc)) {
            sw.push_back(wc);
        }
    }
    EXPECT_EQ(HCA_WC_LOC_LEN_ERR, rw[0].status) << wc_str(rw[0]);
    EXPECT_EQ(1u, rw[0].wr_id);
    EXPECT_EQ(2u, sw[0].wr_id);
}

/* A target QP that is not ready (RESET, INIT) refuses: REM_INV_REQ_ERR. */
TEST_F(Qp, TargetNotReady)
{
    uint8_t *buf  = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr  = a.reg(pa, buf, 64, ACCESS_ALL);
    uint8_t *tb   = b.alloc(MEM_MALLOC, 64);
    hca_mr_t *tmr = b.reg(pb, tb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);
    ASSERT_NE(nullptr, mr);
    for (hca_qp_state_t st : {HCA_QPS_RESET, HCA_QPS_INIT}) {
        side x = mk_a(), y = mk_b();
        ASSERT_NE(nullptr, y.qp);
        if (st == HCA_QPS_INIT) {
            ASSERT_EQ(0, qp_to_init(y.qp));
        }
        ASSERT_EQ(0, connect_qp(x.qp, b.addr, hca_qp_num(y.qp)));
        memset(tb, SENTINEL, 64);
        memset(buf, 1, 64);
        hca_sge_t sg     = mk_sge(buf, 64, hca_mr_lkey(mr));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED,
                                 1, (uint64_t)(uintptr_t)tb, hca_mr_rkey(tmr));
        ASSERT_EQ(0, post_retry(x.qp, &wr));
        EXPECT_TRUE(wait_status(x.scq, 1, HCA_WC_REM_INV_REQ_ERR))
                << "target in " << st;
        EXPECT_EQ(-1, check_byte(tb, 64, SENTINEL)) << "target in " << st;
        EXPECT_EQ(HCA_QPS_ERR, hca_qp_state(x.qp));
    }
}

/* A target connected to another source QP refuses: REM_INV_REQ_ERR. */
TEST_F(Qp, WrongSourceRefused)
{
    side x1 = mk_a(), x2 = mk_a(), y = mk_b();
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NE(nullptr, x2.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x1, y));
    ASSERT_EQ(0, connect_qp(x2.qp, b.addr, hca_qp_num(y.qp)));
    uint8_t *buf  = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr  = a.reg(pa, buf, 64, ACCESS_ALL);
    uint8_t *tb   = b.alloc(MEM_MALLOC, 64);
    hca_mr_t *tmr = b.reg(pb, tb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);
    memset(tb, SENTINEL, 64);
    fill_pattern(buf, 64, 1);
    hca_sge_t sg     = mk_sge(buf, 64, hca_mr_lkey(mr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED, 1,
                             (uint64_t)(uintptr_t)tb, hca_mr_rkey(tmr));
    ASSERT_EQ(0, post_retry(x2.qp, &wr));
    EXPECT_TRUE(wait_status(x2.scq, 1, HCA_WC_REM_INV_REQ_ERR));
    EXPECT_EQ(-1, check_byte(tb, 64, SENTINEL));
    /* the connected source works */
    ASSERT_EQ(0, post_retry(x1.qp, &wr));
    EXPECT_TRUE(wait_ok(x1.scq, 1, HCA_WC_RDMA_WRITE));
    EXPECT_EQ(-1, check_pattern(tb, 64, 1));
}

/* HCA_QPN_ANY: a target (in RTR: a target needs no more) that accepts any
 * source QP. */
TEST_F(Qp, AnySource)
{
    side x1 = mk_a(), x2 = mk_a(), y = mk_b();
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NE(nullptr, x2.qp);
    ASSERT_EQ(0, qp_to_init(y.qp));
    ASSERT_EQ(0, qp_to_rtr(y.qp, a.addr, HCA_QPN_ANY));
    ASSERT_EQ(0, connect_qp(x1.qp, b.addr, hca_qp_num(y.qp)));
    ASSERT_EQ(0, connect_qp(x2.qp, b.addr, hca_qp_num(y.qp)));
    uint8_t *buf  = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr  = a.reg(pa, buf, 64, ACCESS_ALL);
    uint8_t *tb   = b.alloc(MEM_MALLOC, 256);
    hca_mr_t *tmr = b.reg(pb, tb, 256, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);
    ASSERT_NE(nullptr, mr);
    fill_pattern(buf, 64, 2);
    ASSERT_EQ(0, post_recv1(y.qp, tb + 128, 64, hca_mr_lkey(tmr), 10));
    ASSERT_EQ(0, post_recv1(y.qp, tb + 192, 64, hca_mr_lkey(tmr), 11));
    side *xs[2] = {&x1, &x2};
    for (int i = 0; i < 2; ++i) {
        hca_sge_t sg     = mk_sge(buf, 64, hca_mr_lkey(mr));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED,
                                 1, (uint64_t)(uintptr_t)(tb + 64 * i),
                                 hca_mr_rkey(tmr));
        ASSERT_EQ(0, post_retry(xs[i]->qp, &wr));
        EXPECT_TRUE(wait_ok(xs[i]->scq, 1, HCA_WC_RDMA_WRITE)) << i;
        EXPECT_EQ(-1, check_pattern(tb + 64 * i, 64, 2));
        hca_send_wr_t s = mk_wr(HCA_WR_SEND, &sg, 1, HCA_SEND_SIGNALED, 2);
        ASSERT_EQ(0, post_retry(xs[i]->qp, &s));
        std::vector<hca_wc_t> rw;
        double end = now_ms() + TIMEOUT_MS;
        while (rw.empty()) {
            ASSERT_LT(now_ms(), end);
            progress_all();
            y.rcq->poll_once();
            hca_wc_t wc;
            while (y.rcq->pop(&wc)) {
                rw.push_back(wc);
            }
        }
        EXPECT_EQ(HCA_WC_SUCCESS, rw[0].status);
        EXPECT_EQ(hca_qp_num(xs[i]->qp), rw[0].src_qp);
        EXPECT_TRUE(wait_ok(xs[i]->scq, 2, HCA_WC_SEND)) << i;
    }
}

TEST_F(Qp, CheckPeerAlive)
{
    side x = mk_a(), y = mk_b();
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x, y));
    EXPECT_EQ(1, hca_qp_check_peer(x.qp));
    EXPECT_EQ(1, hca_qp_check_peer(y.qp));
    EXPECT_EQ(HCA_QPS_RTS, hca_qp_state(x.qp));
}

/* Unsignaled WRs count as outstanding until a later signaled one
 * completes; sq_sig_all makes every WR signaled. */
TEST_F(Qp, OutstandingAndSignaling)
{
    side x = mk_a(), y = mk_b();
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x, y));
    uint8_t *buf  = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr  = a.reg(pa, buf, 64, ACCESS_ALL);
    uint8_t *tb   = b.alloc(MEM_MALLOC, 64);
    hca_mr_t *tmr = b.reg(pb, tb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);
    ASSERT_NE(nullptr, mr);
    hca_sge_t sg = mk_sge(buf, 8, hca_mr_lkey(mr));
    for (int i = 0; i < 6; ++i) {
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1,
                                 (i == 5) ? HCA_SEND_SIGNALED : 0, i,
                                 (uint64_t)(uintptr_t)tb, hca_mr_rkey(tmr));
        ASSERT_EQ(0, post_retry(x.qp, &wr));
    }
    EXPECT_LE(hca_qp_outstanding(x.qp), 6u);
    ASSERT_TRUE(wait_ok(x.scq, 5, HCA_WC_RDMA_WRITE))
            << "only the signaled WR gives a completion";
    EXPECT_EQ(0u, hca_qp_outstanding(x.qp));
    EXPECT_TRUE(expect_no_wc(x.scq, 20));

    /* sq_sig_all */
    cqw *s2      = a.new_cq(64);
    qp_caps cp   = a.caps(16);
    cp.sig_all   = 1;
    hca_qp_t *q2 = a.new_qp(pa, s2, s2, cp);
    side y2      = mk_b();
    ASSERT_NE(nullptr, q2);
    ASSERT_NE(nullptr, y2.qp);
    ASSERT_EQ(0, connect_qp(y2.qp, a.addr, hca_qp_num(q2)));
    ASSERT_EQ(0, connect_qp(q2, b.addr, hca_qp_num(y2.qp)));
    for (int i = 0; i < 3; ++i) {
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, 0, 20 + i,
                                 (uint64_t)(uintptr_t)tb, hca_mr_rkey(tmr));
        ASSERT_EQ(0, post_retry(q2, &wr));
    }
    for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(wait_ok(s2, 20 + i, HCA_WC_RDMA_WRITE)) << "sq_sig_all";
    }
}

/* The running send-queue counts that let a consumer wait for "every WR
 * posted so far" (UCT's ep flush) without waiting for later ones: a
 * signalled WR retires when its CQE is polled, not before. */
TEST_F(Qp, SqPostedAndRetiredCounts)
{
    side x = mk_a(), y = mk_b();
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x, y));
    uint8_t *buf  = a.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr  = a.reg(pa, buf, 64, ACCESS_ALL);
    uint8_t *tb   = b.alloc(MEM_MALLOC, 64);
    hca_mr_t *tmr = b.reg(pb, tb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, tmr);
    ASSERT_NE(nullptr, mr);
    EXPECT_EQ(0u, hca_qp_sq_posted(x.qp));
    EXPECT_EQ(0u, hca_qp_sq_retired(x.qp));
    hca_sge_t sg = mk_sge(buf, 8, hca_mr_lkey(mr));
    for (int i = 0; i < 3; ++i) {
        uint64_t posted = hca_qp_sq_posted(x.qp);
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1,
                                 HCA_SEND_SIGNALED, 40 + i,
                                 (uint64_t)(uintptr_t)tb, hca_mr_rkey(tmr));
        ASSERT_EQ(0, post_retry(x.qp, &wr));
        EXPECT_EQ(posted + 1, hca_qp_sq_posted(x.qp));
        EXPECT_LT(hca_qp_sq_retired(x.qp), hca_qp_sq_posted(x.qp))
            << "retired before its completion was polled";
        ASSERT_TRUE(wait_ok(x.scq, 40 + i, HCA_WC_RDMA_WRITE));
        EXPECT_EQ(hca_qp_sq_posted(x.qp), hca_qp_sq_retired(x.qp));
    }
    /* unsignalled WRs retire without a CQE */
    for (int i = 0; i < 4; ++i) {
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, 0, 50 + i,
                                 (uint64_t)(uintptr_t)tb, hca_mr_rkey(tmr));
        ASSERT_EQ(0, post_retry(x.qp, &wr));
    }
    EXPECT_TRUE(expect_no_wc(x.scq, 20));
    EXPECT_EQ(hca_qp_sq_posted(x.qp), hca_qp_sq_retired(x.qp));
    EXPECT_EQ(0u, hca_qp_outstanding(x.qp));
}

/* Destroying QPs with outstanding work neither hangs nor fails. */
TEST_F(Qp, DestroyWithOutstanding)
{
    side x = mk_a(), y = mk_b();
    ASSERT_NE(nullptr, y.qp);
    ASSERT_NO_FATAL_FAILURE(connect(x, y));
    const size_t BIG = 1 << 20;
    uint8_t *buf     = a.alloc(MEM_MALLOC, BIG);
    hca_mr_t *mr     = a.reg(pa, buf, BIG, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    for (int i = 0; i < 4; ++i) {
        hca_sge_t sg     = mk_sge(buf, BIG, hca_mr_lkey(mr));
        hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &sg, 1, HCA_SEND_SIGNALED, i);
        hca_send_wr_t *badw;
        int rc = hca_post_send(x.qp, &wr, &badw);
        ASSERT_TRUE((rc == 0) || (rc == -EAGAIN)) << rc;
    }
    ASSERT_EQ(0, post_recv1(x.qp, buf, 64, hca_mr_lkey(mr), 9));
    double t0 = now_ms();
    EXPECT_EQ(0, a.destroy_qp(x.qp));
    EXPECT_EQ(0, b.destroy_qp(y.qp));
    EXPECT_LT(now_ms() - t0, 5000.0);
}

/* quiet_flush: WRs outstanding when the QP moves to ERR are flushed; the
 * unsignaled ones make no completion, the signaled ones do.  Without
 * quiet_flush every flushed WR makes one. */
TEST_F(Qp, QuietFlush)
{
    for (int quiet = 0; quiet < 2; ++quiet) {
        cqw *s = a.new_cq(64);
        cqw *r = a.new_cq(64);
        ASSERT_NE(nullptr, r);
        qp_caps cp     = a.caps(32);
        cp.quiet_flush = quiet;
        hca_qp_t *qp   = a.new_qp(pa, s, r, cp);
        side y         = mk_b();
        ASSERT_NE(nullptr, qp);
        ASSERT_NE(nullptr, y.qp);
        ASSERT_EQ(0, connect_qp(y.qp, a.addr, hca_qp_num(qp)));
        ASSERT_EQ(0, connect_qp(qp, b.addr, hca_qp_num(y.qp)));
        const size_t BIG = 1 << 20;
        uint8_t *buf     = a.alloc(MEM_MALLOC, BIG);
        hca_mr_t *mr     = a.reg(pa, buf, BIG, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        /* 1 MiB SENDs to a peer that posts no receive and is never polled
         * cannot complete */
        hca_sge_t sg = mk_sge(buf, BIG, hca_mr_lkey(mr));
        int n        = 0;
        for (int i = 0; i < 4; ++i) {
            hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &sg, 1,
                                     (i == 3) ? HCA_SEND_SIGNALED : 0, i);
            hca_send_wr_t *badw;
            int rc = hca_post_send(qp, &wr, &badw);
            ASSERT_TRUE((rc == 0) || (rc == -EAGAIN)) << rc;
            if (rc != 0) {
                break;
            }
            ++n;
        }
        ASSERT_EQ(4, n) << "could not queue 4 SENDs";
        ASSERT_EQ(4u, hca_qp_outstanding(qp));
        ASSERT_EQ(0, qp_to_state(qp, HCA_QPS_ERR));
        if (!quiet) {
            for (int i = 0; i < 4; ++i) {
                EXPECT_TRUE(wait_status(s, i, HCA_WC_WR_FLUSH_ERR))
                        << "without quiet_flush every flushed WR completes";
            }
        } else {
            EXPECT_TRUE(wait_status(s, 3, HCA_WC_WR_FLUSH_ERR))
                    << "quiet_flush: only the signaled WR completes";
        }
        EXPECT_TRUE(expect_no_wc(s, 20));
        EXPECT_EQ(0u, hca_qp_outstanding(qp));
    }
}
