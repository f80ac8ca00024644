/*
 * test_cq.cc - completion queues: create/destroy, wrap-around, overflow,
 * arming, blocking wait woken by a peer process.
 */
#include "test_common.h"

#include <limits.h>

using namespace hcat;

class Cq : public hca_test {
};

TEST_F(Cq, CreateDestroy)
{
    ctx c;
    ASSERT_TRUE(c.open());
    const int sizes[] = {1, 2, 16, 1000};
    for (int s : sizes) {
        if ((uint32_t)s > c.attr.max_cqe) {
            continue;
        }
        hca_cq_t *cq = nullptr;
        ASSERT_EQ(0, hca_cq_create(c.dev, s, &cq)) << s;
        ASSERT_NE(nullptr, cq);
        EXPECT_GE(hca_cq_fd(cq), 0);
        EXPECT_EQ(0, hca_cq_destroy(cq));
    }
    hca_cq_t *cq = nullptr;
    EXPECT_EQ(0, hca_cq_create(c.dev, (int)std::min<uint32_t>(c.attr.max_cqe,
                                                              INT_MAX),
                               &cq))
            << "max_cqe entries";
    if (cq != nullptr) {
        EXPECT_EQ(0, hca_cq_destroy(cq));
    }
    cq = nullptr;
    EXPECT_LT(hca_cq_create(c.dev, 0, &cq), 0) << "0 entries";
    EXPECT_LT(hca_cq_create(c.dev, -1, &cq), 0) << "negative entries";
    if (c.attr.max_cqe < INT_MAX) {
        EXPECT_LT(hca_cq_create(c.dev, (int)c.attr.max_cqe + 1, &cq), 0)
                << "more than max_cqe";
    }
}

TEST_F(Cq, PollEmpty)
{
    ctx c;
    ASSERT_TRUE(c.open());
    cqw *cq = c.new_cq(16, false);
    ASSERT_NE(nullptr, cq);
    hca_wc_t wc[4];
    for (int i = 0; i < 100; ++i) {
        ASSERT_EQ(0, hca_cq_poll(cq->cq, 4, wc));
    }
    EXPECT_EQ(0, hca_cq_poll(cq->cq, 0, wc));
}

TEST_F(Cq, BusyWhileUsed)
{
    ctx c;
    ASSERT_TRUE(c.open());
    hca_pd_t *pd = c.new_pd();
    cqw *s       = c.new_cq(16);
    cqw *r       = c.new_cq(16);
    ASSERT_NE(nullptr, r);
    hca_qp_t *qp = c.new_qp(pd, s, r);
    ASSERT_NE(nullptr, qp);
    EXPECT_EQ(-EBUSY, hca_cq_destroy(s->cq)) << "send CQ of a QP";
    EXPECT_EQ(-EBUSY, hca_cq_destroy(r->cq)) << "recv CQ of a QP";
    ASSERT_EQ(0, c.destroy_qp(qp));
    EXPECT_EQ(0, c.destroy_cq(s));
    EXPECT_EQ(0, c.destroy_cq(r));
}

/* A CQ of 16 entries goes around its ring many times (batches that do not
 * divide its size, and a full one), completions in post order. */
TEST_F(Cq, WrapAround)
{
    const int CQE = 16;
    ctx c;
    local_target t;
    ASSERT_TRUE(c.open());
    ASSERT_TRUE(t.open());
    hca_pd_t *pd = c.new_pd();
    cqw *scq     = c.new_cq(CQE, false);
    cqw *rcq     = c.new_cq(CQE, false);
    ASSERT_NE(nullptr, rcq);
    hca_qp_t *qp = c.new_qp(pd, scq, rcq, c.caps(CQE));
    ASSERT_NE(nullptr, qp);
    int tpd = t.pd();
    uint32_t tqpn = 0;
    int tqp = t.qp(tpd, &tqpn, 16);
    ASSERT_GE(tqp, 0);
    ASSERT_EQ(0, t.connect(tqp, c.addr, hca_qp_num(qp), REMOTE_ALL));
    ASSERT_EQ(0, connect_qp(qp, t.port_addr(), tqpn));
    uint8_t *lb = c.alloc(MEM_MALLOC, 64);
    hca_mr_t *lmr = c.reg(pd, lb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);
    uint64_t ra = 0;
    int rb = t.buf(MEM_MALLOC, 64, &ra);
    uint32_t rkey = 0;
    ASSERT_GE(t.mr(tpd, rb, 0, 64, ACCESS_ALL, &rkey), 0);

    const int batches[] = {7, 16, 1, 9, 15, 3};
    uint64_t next = 0, done = 0;
    int total     = CQE * 60;
    int b         = 0;
    double end    = now_ms() + TIMEOUT_MS;
    while ((int)done < total) {
        int n = std::min<int>(batches[b++ % 6], total - (int)next);
        for (int i = 0; i < n; ++i) {
            hca_sge_t s      = mk_sge(lb, 8, hca_mr_lkey(lmr));
            hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &s, 1,
                                     HCA_SEND_SIGNALED, next, ra, rkey);
            hca_send_wr_t *bad;
            ASSERT_EQ(0, hca_post_send(qp, &wr, &bad)) << "post " << next;
            ++next;
        }
        while (done < next) {
            hca_wc_t wc[5];
            int got = hca_cq_poll(scq->cq, 1 + (int)(done % 5), wc);
            ASSERT_GE(got, 0) << "hca_cq_poll after " << done;
            for (int i = 0; i < got; ++i) {
                ASSERT_EQ(HCA_WC_SUCCESS, wc[i].status) << wc_str(wc[i]);
                ASSERT_EQ(HCA_WC_RDMA_WRITE, wc[i].opcode);
                ASSERT_EQ(done, wc[i].wr_id) << "out of order";
                ++done;
            }
            ASSERT_LE(done, next) << "more completions than posts";
            ASSERT_LT(now_ms(), end) << "completed " << done << " of " << total;
        }
    }
    hca_wc_t wc;
    EXPECT_EQ(0, hca_cq_poll(scq->cq, 1, &wc));
}

/* Posts many more signaled WRs (over 8 QPs) than a 16-entry CQ holds,
 * without polling; *qps_out gets the QPs. */
static void overflow_setup(ctx &c, local_target &t, cqw **scq_out,
                           std::vector<hca_qp_t*> *qps_out, int *posted_out)
{
    const int CQE = 16;
    ASSERT_TRUE(c.open());
    ASSERT_TRUE(t.open());
    hca_pd_t *pd = c.new_pd();
    cqw *scq     = c.new_cq(CQE, false);
    cqw *rcq     = c.new_cq(64);
    ASSERT_NE(nullptr, rcq);
    uint8_t *lb   = c.alloc(MEM_MALLOC, 64);
    hca_mr_t *lmr = c.reg(pd, lb, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);
    uint64_t ra = 0;
    int tpd     = t.pd();
    int rb      = t.buf(MEM_MALLOC, 64, &ra);
    uint32_t rkey = 0;
    ASSERT_GE(t.mr(tpd, rb, 0, 64, ACCESS_ALL, &rkey), 0);

    const int NQP    = 8;
    const uint32_t D = std::min<uint32_t>(128, c.attr.max_qp_wr);
    int posted       = 0;
    for (int q = 0; q < NQP; ++q) {
        hca_qp_t *qp = c.new_qp(pd, scq, rcq, c.caps(D));
        ASSERT_NE(nullptr, qp);
        uint32_t tqpn = 0;
        int tqp       = t.qp(tpd, &tqpn, 16);
        ASSERT_GE(tqp, 0);
        ASSERT_EQ(0, t.connect(tqp, c.addr, hca_qp_num(qp), REMOTE_ALL));
        ASSERT_EQ(0, connect_qp(qp, t.port_addr(), tqpn));
        qps_out->push_back(qp);
        for (uint32_t i = 0; i < D; ++i) {
            hca_sge_t s      = mk_sge(lb, 8, hca_mr_lkey(lmr));
            hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &s, 1,
                                     HCA_SEND_SIGNALED, posted, ra, rkey);
            hca_send_wr_t *bad;
            ASSERT_EQ(0, hca_post_send(qp, &wr, &bad));
            ++posted;
        }
    }
    *scq_out    = scq;
    *posted_out = posted;
}

/* Polls (1 at a time) until hca_cq_poll fails; the result. */
static int poll_until_error(cqw *scq, int posted, int *good_out)
{
    int good = 0, rc = 0;
    double end = now_ms() + TIMEOUT_MS;
    for (;;) {
        hca_wc_t wc;
        rc = hca_cq_poll(scq->cq, 1, &wc);
        if (rc < 0) {
            break;
        }
        good += rc;
        if ((good >= posted) || (now_ms() > end)) {
            break;
        }
    }
    *good_out = good;
    return rc;
}

/* More completions than entries: hca_cq_poll reports -EOVERFLOW, and keeps
 * doing so. */
TEST_F(Cq, Overflow)
{
    ctx c;
    local_target t;
    cqw *scq = nullptr;
    std::vector<hca_qp_t*> qps;
    int posted = 0, good = 0;
    ASSERT_NO_FATAL_FAILURE(overflow_setup(c, t, &scq, &qps, &posted));
    int rc = poll_until_error(scq, posted, &good);
    ASSERT_EQ(-EOVERFLOW, rc) << good << " of " << posted
                              << " completions polled from a CQ of 16";
    EXPECT_LT(good, posted);
    hca_wc_t wc[8];
    EXPECT_EQ(-EOVERFLOW, hca_cq_poll(scq->cq, 8, wc)) << "sticky overflow";
    EXPECT_EQ(-EOVERFLOW, hca_cq_poll(scq->cq, 1, wc)) << "sticky overflow";
    hca_counters_t cnt;
    ASSERT_EQ(0, hca_device_counters(c.dev, &cnt));
    EXPECT_GE(cnt.cq_overflows, 1u);
}

/* "entries were lost: the CQ and its QPs are in error" */
TEST_F(Cq, OverflowQpsInError)
{
    ctx c;
    local_target t;
    cqw *scq = nullptr;
    std::vector<hca_qp_t*> qps;
    int posted = 0, good = 0;
    ASSERT_NO_FATAL_FAILURE(overflow_setup(c, t, &scq, &qps, &posted));
    ASSERT_EQ(-EOVERFLOW, poll_until_error(scq, posted, &good));
    for (size_t i = 0; i < qps.size(); ++i) {
        EXPECT_EQ(HCA_QPS_ERR, hca_qp_state(qps[i]))
                << "QP " << i << " of an overflowed CQ";
    }
}

TEST_F(Cq, WaitTimeout)
{
    ctx c;
    ASSERT_TRUE(c.open());
    cqw *cq = c.new_cq(16, false);
    ASSERT_NE(nullptr, cq);
    double t0 = now_ms();
    EXPECT_EQ(0, hca_cq_wait(cq->cq, 200));
    double el = now_ms() - t0;
    EXPECT_GE(el, 180) << "returned early";
    EXPECT_LT(el, 2000);
    EXPECT_EQ(0, hca_cq_wait(cq->cq, 0));
    /* the fd is not readable: nothing happened */
    struct pollfd pfd = {hca_cq_fd(cq->cq), POLLIN, 0};
    EXPECT_EQ(0, poll(&pfd, 1, 0));
}

/* hca_cq_arm reports -EAGAIN when an arrival is already pending. */
TEST_F(Cq, ArmWithPendingWork)
{
    ctx ca, cb;
    ASSERT_TRUE(ca.open());
    ASSERT_TRUE(cb.open());
    hca_pd_t *pa = ca.new_pd(), *pb = cb.new_pd();
    cqw *sa = ca.new_cq(64, false), *ra = ca.new_cq(64, false);
    cqw *sb = cb.new_cq(64, false), *rb = cb.new_cq(64, false);
    ASSERT_NE(nullptr, rb);
    hca_qp_t *a = ca.new_qp(pa, sa, ra), *b = cb.new_qp(pb, sb, rb);
    ASSERT_NE(nullptr, b);
    ASSERT_EQ(0, connect_qp(b, ca.addr, hca_qp_num(a)));
    ASSERT_EQ(0, connect_qp(a, cb.addr, hca_qp_num(b)));
    uint8_t *abuf = ca.alloc(MEM_MALLOC, 64), *bbuf = cb.alloc(MEM_MALLOC, 64);
    hca_mr_t *amr = ca.reg(pa, abuf, 64, ACCESS_ALL);
    hca_mr_t *bmr = cb.reg(pb, bbuf, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, bmr);

    /* armed with nothing pending: fine */
    EXPECT_EQ(0, hca_cq_arm(rb->cq));
    ASSERT_EQ(0, post_recv1(b, bbuf, 64, hca_mr_lkey(bmr), 1));
    hca_sge_t s      = mk_sge(abuf, 16, hca_mr_lkey(amr));
    hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &s, 1, HCA_SEND_SIGNALED, 2);
    hca_send_wr_t *bad;
    ASSERT_EQ(0, hca_post_send(a, &wr, &bad));
    /* progress the sender only (not the receiver) for a while */
    double end = now_ms() + 200;
    while (now_ms() < end) {
        sa->poll_once();
    }
    /* the fd of the armed CQ was signalled by the arrival */
    struct pollfd pfd = {hca_cq_fd(rb->cq), POLLIN, 0};
    EXPECT_EQ(1, poll(&pfd, 1, 1000)) << "armed CQ not signalled";
    hca_cq_ack_events(rb->cq);
    EXPECT_EQ(-EAGAIN, hca_cq_arm(rb->cq))
            << "a SEND is waiting to be received: work is pending";
    EXPECT_EQ(1, hca_cq_wait(rb->cq, 1000)) << "work pending: no sleep";
    std::vector<hca_wc_t> w;
    double e2 = now_ms() + TIMEOUT_MS;
    while (w.empty() && (now_ms() < e2)) {
        sa->poll_once();
        rb->poll_once();
        hca_wc_t wc;
        while (rb->pop(&wc)) {
            w.push_back(wc);
        }
    }
    ASSERT_EQ(1u, w.size());
    EXPECT_EQ(HCA_WC_SUCCESS, w[0].status);
    EXPECT_EQ(HCA_WC_RECV, w[0].opcode);
    EXPECT_EQ(16u, w[0].byte_len);
    /* drained: arming works again and nothing is signalled */
    EXPECT_EQ(0, hca_cq_arm(rb->cq));
    pfd.revents = 0;
    EXPECT_EQ(0, poll(&pfd, 1, 50)) << "spurious signal";
}

/* A SEND that arrived while no receive was posted waits in the ring for
 * one: nothing can complete until the caller posts it, so hca_cq_arm
 * succeeds (it used to say -EAGAIN for as long as the message waited, and
 * a process that waits polled hundreds of times a second).  The receive
 * posted then wakes the armed CQ (as a NIC's retried SEND would complete),
 * and the message lands in it. */
/* Polls both CQs until rcq has a completion (bounded). */
static bool poll_recv(cqw *scq, cqw *rcq, hca_wc_t *wc)
{
    const double end = now_ms() + TIMEOUT_MS;
    while (now_ms() < end) {
        scq->poll_once();
        rcq->poll_once();
        if (rcq->pop(wc)) {
            return true;
        }
    }
    return false;
}

static void arm_while_send_waits_for_recv(hca_fabric_type_t f)
{
    ctx ca, cb;
    ASSERT_TRUE(ca.open(0, f));
    ASSERT_TRUE(cb.open(0, f));
    hca_pd_t *pa = ca.new_pd(), *pb = cb.new_pd();
    cqw *sa = ca.new_cq(64, false), *ra = ca.new_cq(64, false);
    cqw *sb = cb.new_cq(64, false), *rb = cb.new_cq(64, false);
    ASSERT_NE(nullptr, rb);
    hca_qp_t *a = ca.new_qp(pa, sa, ra), *b = cb.new_qp(pb, sb, rb);
    ASSERT_NE(nullptr, a);
    ASSERT_NE(nullptr, b);
    ASSERT_EQ(0, connect_qp(b, ca.addr, hca_qp_num(a)));
    ASSERT_EQ(0, connect_qp(a, cb.addr, hca_qp_num(b)));
    uint8_t *abuf = ca.alloc(MEM_MALLOC, 64), *bbuf = cb.alloc(MEM_MALLOC, 64);
    hca_mr_t *amr = ca.reg(pa, abuf, 64, ACCESS_ALL);
    hca_mr_t *bmr = cb.reg(pb, bbuf, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, amr);
    ASSERT_NE(nullptr, bmr);
    memset(abuf, 0x5a, 64);

    /* no receive posted at b: the SEND arrives and waits for one */
    hca_sge_t s      = mk_sge(abuf, 16, hca_mr_lkey(amr));
    hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &s, 1, HCA_SEND_SIGNALED, 2);
    hca_send_wr_t *bad;
    ASSERT_EQ(0, hca_post_send(a, &wr, &bad));
    double end = now_ms() + 300;
    while (now_ms() < end) {
        sa->poll_once();
        rb->poll_once();
    }
    ASSERT_TRUE(rb->q.empty()) << "received without a posted receive";
    ASSERT_EQ(0, rb->err);

    EXPECT_EQ(0, hca_cq_arm(rb->cq))
            << "only the caller's next receive can complete the SEND";

    /* a process that waits (arm, then sleep up to 1 s) for 1 s */
    int spins       = 0;
    const double t0 = now_ms();
    for (int left = 1000; left > 0; left = (int)(1000 - (now_ms() - t0))) {
        (void)hca_cq_wait(rb->cq, left);
        rb->poll_once();
        sa->poll_once();
        ++spins;
    }
    EXPECT_LE(spins, 3) << "a waiter spun " << spins
                        << " times in 1 s while the SEND waited";
    EXPECT_TRUE(rb->q.empty());

    /* armed; the receive posted now wakes the CQ and the SEND completes */
    ASSERT_EQ(0, hca_cq_arm(rb->cq));
    ASSERT_EQ(0, post_recv1(b, bbuf, 64, hca_mr_lkey(bmr), 7));
    struct pollfd pfd = {hca_cq_fd(rb->cq), POLLIN, 0};
    const double t1   = now_ms();
    EXPECT_EQ(1, poll(&pfd, 1, 2000))
            << "the armed CQ was not woken by the receive the SEND waited for";
    EXPECT_LT(now_ms() - t1, 1000.0);
    hca_cq_ack_events(rb->cq);
    hca_wc_t wc;
    ASSERT_TRUE(poll_recv(sa, rb, &wc)) << "the SEND was not received";
    EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
    EXPECT_EQ(HCA_WC_RECV, wc.opcode);
    EXPECT_EQ(7u, wc.wr_id);
    EXPECT_EQ(16u, wc.byte_len);
    EXPECT_EQ(-1, check_byte(bbuf, 16, 0x5a));

    /* a second SEND with no receive for it: arm succeeds again */
    ASSERT_EQ(0, hca_post_send(a, &wr, &bad));
    end = now_ms() + 300;
    while (now_ms() < end) {
        sa->poll_once();
        rb->poll_once();
    }
    EXPECT_EQ(0, hca_cq_arm(rb->cq)) << "a SEND waits for a receive";
    ASSERT_EQ(0, post_recv1(b, bbuf, 64, hca_mr_lkey(bmr), 8));
    pfd.revents = 0;
    EXPECT_EQ(1, poll(&pfd, 1, 2000)) << "not woken by the posted receive";
    hca_cq_ack_events(rb->cq);
    ASSERT_TRUE(poll_recv(sa, rb, &wc)) << "the SEND was not received";
    EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
    EXPECT_EQ(8u, wc.wr_id);
    /* drained: arm works and nothing is signalled */
    EXPECT_EQ(0, hca_cq_arm(rb->cq));
    pfd.revents = 0;
    EXPECT_EQ(0, poll(&pfd, 1, 50)) << "spurious signal";
}

TEST_F(Cq, ArmWhileSendWaitsForRecv)
{
    for (hca_fabric_type_t f : test_fabrics()) {
        SCOPED_TRACE(fabric_name(f));
        arm_while_send_waits_for_recv(f);
    }
}

/* A parent process sleeping in hca_cq_wait on its receive CQ is woken by a
 * SEND of a child process; it really sleeps (little CPU while waiting).
 * use_fd: arm + poll(2) on hca_cq_fd + hca_cq_ack_events instead. */
static void wait_woken_by_peer(bool use_fd)
{
    const int DELAY_MS = 300;
    child_t *ch = fork_child([](int rfd, int wfd) {
        peer_info pi;
        ASSERT_TRUE(recv_msg(rfd, &pi));
        ctx c;
        ASSERT_TRUE(c.open());
        hca_pd_t *pd = c.new_pd();
        cqw *s = c.new_cq(64), *r = c.new_cq(64);
        ASSERT_NE(nullptr, r);
        hca_qp_t *qp = c.new_qp(pd, s, r);
        ASSERT_NE(nullptr, qp);
        ASSERT_EQ(0, connect_qp(qp, pi.addr, pi.qpn[0]));
        uint8_t *b = c.alloc(MEM_MALLOC, 64);
        hca_mr_t *mr = c.reg(pd, b, 64, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        memset(b, 0x33, 64);
        peer_info me;
        memset(&me, 0, sizeof(me));
        me.addr   = c.addr;
        me.qpn[0] = hca_qp_num(qp);
        ASSERT_TRUE(send_msg(wfd, me));
        ASSERT_TRUE(expect_token(rfd, 1));
        sleep_ms(DELAY_MS);
        hca_sge_t sg     = mk_sge(b, 64, hca_mr_lkey(mr));
        hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &sg, 1, HCA_SEND_SIGNALED, 9);
        ASSERT_EQ(0, post_retry(qp, &wr));
        ASSERT_TRUE(wait_ok(s, 9, HCA_WC_SEND));
        /* stay until the parent is done with us */
        ASSERT_TRUE(expect_token(rfd, 2));
    });
    ASSERT_NE(nullptr, ch);

    ctx c;
    ASSERT_TRUE(c.open());
    hca_pd_t *pd = c.new_pd();
    cqw *s = c.new_cq(64, false), *r = c.new_cq(64, false);
    ASSERT_NE(nullptr, r);
    hca_qp_t *qp = c.new_qp(pd, s, r);
    ASSERT_NE(nullptr, qp);
    uint8_t *b   = c.alloc(MEM_MALLOC, 64);
    hca_mr_t *mr = c.reg(pd, b, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    peer_info me;
    memset(&me, 0, sizeof(me));
    me.addr   = c.addr;
    me.qpn[0] = hca_qp_num(qp);
    ASSERT_TRUE(send_msg(ch->wfd, me));
    peer_info pi;
    ASSERT_TRUE(recv_msg(ch->rfd, &pi));
    ASSERT_EQ(0, connect_qp(qp, pi.addr, pi.qpn[0]));
    ASSERT_EQ(0, post_recv1(qp, b, 64, hca_mr_lkey(mr), 5));

    double cpu0 = thread_cpu_ms();
    double t0   = now_ms();
    ASSERT_TRUE(send_token(ch->wfd, 1));
    int wakeups = 0;
    hca_wc_t wc;
    int got     = 0;
    while (got == 0) {
        ASSERT_LT(now_ms() - t0, (double)TIMEOUT_MS) << "never woken";
        got = hca_cq_poll(r->cq, 1, &wc);
        ASSERT_GE(got, 0);
        if (got > 0) {
            break;
        }
        if (use_fd) {
            int rc = hca_cq_arm(r->cq);
            if (rc == -EAGAIN) {
                ++wakeups;
                continue;
            }
            ASSERT_EQ(0, rc);
            struct pollfd pfd = {hca_cq_fd(r->cq), POLLIN, 0};
            int pr            = poll(&pfd, 1, TIMEOUT_MS);
            ASSERT_GE(pr, 0);
            if (pr > 0) {
                hca_cq_ack_events(r->cq);
            }
        } else {
            hca_cq_wait(r->cq, TIMEOUT_MS);
        }
        ++wakeups;
    }
    double el  = now_ms() - t0;
    double cpu = thread_cpu_ms() - cpu0;
    EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
    EXPECT_EQ(HCA_WC_RECV, wc.opcode);
    EXPECT_EQ(5u, wc.wr_id);
    EXPECT_EQ(-1, check_byte(b, 64, 0x33));
    EXPECT_GE(el, DELAY_MS - 50) << "received before it was sent?";
    EXPECT_LE(wakeups, 20) << "hca_cq_wait does not sleep (busy loop)";
    EXPECT_LT(cpu, 0.5 * el) << "the waiting thread used " << cpu
                             << " ms of CPU in " << el << " ms";
    ASSERT_TRUE(send_token(ch->wfd, 2));
    EXPECT_TRUE(wait_child(ch));
}

TEST_F(Cq, WaitWokenByPeerProcess)
{
    wait_woken_by_peer(false);
}

TEST_F(Cq, FdWokenByPeerProcess)
{
    wait_woken_by_peer(true);
}
