/*
 * test_procs.cc - what needs the target to be another process: one-sided
 * operations while the target sleeps, deregistration while a peer copies,
 * atomics under contention, receive ring full, shared-memory object cleanup
 * and reclaim, blocking wait woken by a peer, dead peers, rkey_ptr and
 * dm_view on another process's memory, fork after open, host counters.
 * (Every opcode, the MPT checks, FENCE, placement and ordering against a
 * target in another process are the OtherProcess half of test_ops.cc.)
 *
 * Every suite here is a seam_test (test_common.h) instantiated for the
 * OtherProcess target kind on every fabric of test_fabrics(): its
 * parameter names start with <Fabric>_OtherProcess, e.g.
 * Procs/Procs.RecvRingFull/Shm_OtherProcess.  Each test opens the device
 * (parent and children) for fabric().
 *
 * Children are forked before the parent opens the device (except in
 * ForkAfterOpen) and open it themselves.
 */
#include "test_common.h"

#include <tuple>

using namespace hcat;

static const char *flags_name(unsigned f)
{
    return (f & HCA_OPEN_NO_SINGLE_COPY) ? "nsc" : "sc";
}

/* A device context with one PD and one connected-to-be QP. */
struct endpoint {
    ctx               c;
    hca_fabric_type_t fabric;
    hca_pd_t         *pd  = nullptr;
    cqw              *scq = nullptr;
    cqw              *rcq = nullptr;
    hca_qp_t         *qp  = nullptr;

    explicit endpoint(hca_fabric_type_t fab) : fabric(fab)
    {
    }

    ::testing::AssertionResult open(unsigned flags, uint32_t depth = 128,
                                    int cqe = 1024)
    {
        ::testing::AssertionResult r = c.open(flags, fabric);
        if (!r) {
            return r;
        }
        pd  = c.new_pd();
        scq = c.new_cq(cqe);
        rcq = c.new_cq(cqe);
        if ((pd == nullptr) || (scq == nullptr) || (rcq == nullptr)) {
            return ::testing::AssertionFailure() << "endpoint resources";
        }
        qp = c.new_qp(pd, scq, rcq, c.caps(depth));
        if (qp == nullptr) {
            return ::testing::AssertionFailure() << "endpoint QP";
        }
        return ::testing::AssertionSuccess();
    }

    peer_info info() const
    {
        peer_info pi;
        memset(&pi, 0, sizeof(pi));
        pi.addr   = c.addr;
        pi.qpn[0] = hca_qp_num(qp);
        return pi;
    }

    /* The parent's half of the usual exchange with a child: sends info(),
     * receives the child's peer_info and connects qp to its first QP. */
    ::testing::AssertionResult connect_to(child_t *ch, peer_info *pi)
    {
        return connect_to(ch, info(), qp, pi);
    }

    /* The same, sending me and connecting q. */
    static ::testing::AssertionResult connect_to(child_t *ch,
                                                 const peer_info &me,
                                                 hca_qp_t *q, peer_info *pi)
    {
        if (!send_msg(ch->wfd, me)) {
            return ::testing::AssertionFailure() << "send to the child";
        }
        if (!recv_msg(ch->rfd, pi)) {
            return ::testing::AssertionFailure() << "nothing from the child";
        }
        int rc = connect_qp(q, pi->addr, pi->qpn[0]);
        if (rc != 0) {
            return ::testing::AssertionFailure() << "connect_qp = " << rc;
        }
        return ::testing::AssertionSuccess();
    }

    /* A QP with a deep send queue (as deep as the device allows, up to
     * 16384) on a send CQ of its own, and the rcq: so that the peer's
     * receive ring fills before the send queue. */
    ::testing::AssertionResult deep_qp(hca_qp_t **q, cqw **q_scq,
                                       uint32_t *depth_p = nullptr)
    {
        uint32_t depth = std::min<uint32_t>(c.attr.max_qp_wr, 16384);
        if (depth_p != nullptr) {
            *depth_p = depth;
        }
        *q_scq = c.new_cq((int)std::min<uint32_t>(c.attr.max_cqe,
                                                 depth + 16));
        if (*q_scq == nullptr) {
            return ::testing::AssertionFailure() << "deep QP's CQ";
        }
        *q = c.new_qp(pd, *q_scq, rcq, c.caps(depth));
        if (*q == nullptr) {
            return ::testing::AssertionFailure() << "deep QP";
        }
        return ::testing::AssertionSuccess();
    }
};

/* Main-thread state of process pid ('S' sleeping, 'R' running...). */
static char proc_state(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    if (f == nullptr) {
        return '?';
    }
    char buf[512];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n]  = '\0';
    char *p = strrchr(buf, ')');
    return (p && p[1] && p[2]) ? p[2] : '?';
}

/* ------------------------------------------------------------ semantics */

typedef std::tuple<mem_kind_t, unsigned> pmode_param;

class ProcsMode : public seam_test<pmode_param> {
protected:
    mem_kind_t kind() const
    {
        return std::get<0>(param());
    }

    unsigned flags() const
    {
        return std::get<1>(param());
    }
};


/* RDMA writes, reads and atomics complete while the target process sleeps
 * in read(2) on a pipe; then the target checks its memory. */
TEST_P(ProcsMode, OneSidedWhileTargetSleeps)
{
    const hca_fabric_type_t fab = fabric();
    const size_t R     = 1 << 20;
    const mem_kind_t k = kind();
    const unsigned fl  = flags();
    child_t *ch = fork_child([k, fl, R, fab](int rfd, int wfd) {
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        endpoint e(fab);
        ASSERT_TRUE(e.open(fl));
        uint8_t *b = e.c.alloc(k, 2 * R + 64);
        ASSERT_NE(nullptr, b);
        hca_mr_t *mr = e.c.reg(e.pd, b, 2 * R + 64, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        memset(b, SENTINEL, R);
        fill_pattern(b + R, R, 2);
        uint64_t c64 = 100, sw = 5;
        uint32_t c32 = 7;
        memcpy(b + 2 * R, &c64, 8);
        memcpy(b + 2 * R + 8, &sw, 8);
        memcpy(b + 2 * R + 16, &c32, 4);
        ASSERT_EQ(0, connect_qp(e.qp, pp.addr, pp.qpn[0]));
        peer_info me = e.info();
        me.raddr[0]  = (uint64_t)(uintptr_t)b;
        me.rkey[0]   = hca_mr_rkey(mr);
        ASSERT_TRUE(send_msg(wfd, me));
        /* sleep in a blocking read (the watchdog bounds it) */
        uint32_t tok = 0;
        ssize_t n;
        do {
            n = read(rfd, &tok, sizeof(tok));
        } while ((n < 0) && (errno == EINTR));
        ASSERT_EQ((ssize_t)sizeof(tok), n);
        ASSERT_EQ(1u, tok);
        EXPECT_EQ(-1, check_pattern(b, R, 1)) << "RDMA WRITE data";
        EXPECT_EQ(-1, check_pattern(b + R, R, 2)) << "RDMA READ source";
        memcpy(&c64, b + 2 * R, 8);
        memcpy(&sw, b + 2 * R + 8, 8);
        memcpy(&c32, b + 2 * R + 16, 4);
        EXPECT_EQ(110u, c64) << "10 fetch-adds";
        EXPECT_EQ(6u, sw) << "cmp-swap";
        if (e.c.attr.atomic_caps & HCA_ATOMIC_CAP_32) {
            EXPECT_EQ(12u, c32) << "32-bit fetch-add";
        }
        ASSERT_TRUE(send_token(wfd, 2));
    });
    ASSERT_NE(nullptr, ch);

    endpoint e(fab);
    ASSERT_TRUE(e.open(fl));
    peer_info pi;
    ASSERT_TRUE(e.connect_to(ch, &pi));
    uint8_t *lb = e.c.alloc(k, 2 * R + 64);
    ASSERT_NE(nullptr, lb);
    hca_mr_t *lmr = e.c.reg(e.pd, lb, 2 * R + 64, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);
    const uint64_t ra = pi.raddr[0];
    const uint32_t rk = pi.rkey[0];
    sleep_ms(20);
    EXPECT_EQ('S', proc_state(ch->pid)) << "the target is not asleep";

    fill_pattern(lb, R, 1);
    memset(lb + R, LSENTINEL, R);
    hca_sge_t s1      = mk_sge(lb, R, hca_mr_lkey(lmr));
    hca_sge_t s2      = mk_sge(lb + R, R, hca_mr_lkey(lmr));
    hca_send_wr_t w1  = mk_wr(HCA_WR_RDMA_WRITE, &s1, 1, HCA_SEND_SIGNALED, 1,
                              ra, rk);
    hca_send_wr_t w2  = mk_wr(HCA_WR_RDMA_READ, &s2, 1, HCA_SEND_SIGNALED, 2,
                              ra + R, rk);
    ASSERT_EQ(0, post_retry(e.qp, &w1));
    ASSERT_EQ(0, post_retry(e.qp, &w2));
    ASSERT_TRUE(wait_ok(e.scq, 1, HCA_WC_RDMA_WRITE));
    ASSERT_TRUE(wait_ok(e.scq, 2, HCA_WC_RDMA_READ));
    EXPECT_EQ(-1, check_pattern(lb + R, R, 2)) << "RDMA READ data";
    for (int i = 0; i < 10; ++i) {
        hca_sge_t r      = mk_sge(lb + 2 * R, 8, hca_mr_lkey(lmr));
        hca_send_wr_t wr = mk_wr(HCA_WR_ATOMIC_FETCH_ADD, &r, 1,
                                 HCA_SEND_SIGNALED, 10 + i, ra + 2 * R, rk);
        wr.compare_add   = 1;
        ASSERT_TRUE(post_and_wait(e.qp, e.scq, &wr, HCA_WC_ATOMIC));
        uint64_t old;
        memcpy(&old, lb + 2 * R, 8);
        EXPECT_EQ(100u + i, old);
    }
    {
        hca_sge_t r      = mk_sge(lb + 2 * R + 8, 8, hca_mr_lkey(lmr));
        hca_send_wr_t wr = mk_wr(HCA_WR_ATOMIC_CMP_SWP, &r, 1,
                                 HCA_SEND_SIGNALED, 30, ra + 2 * R + 8, rk);
        wr.compare_add   = 5;
        wr.swap          = 6;
        ASSERT_TRUE(post_and_wait(e.qp, e.scq, &wr, HCA_WC_ATOMIC));
        uint64_t old;
        memcpy(&old, lb + 2 * R + 8, 8);
        EXPECT_EQ(5u, old);
    }
    if (e.c.attr.atomic_caps & HCA_ATOMIC_CAP_32) {
        hca_sge_t r      = mk_sge(lb + 2 * R + 16, 4, hca_mr_lkey(lmr));
        hca_send_wr_t wr = mk_wr(HCA_WR_ATOMIC_FETCH_ADD, &r, 1,
                                 HCA_SEND_SIGNALED | HCA_SEND_ATOMIC32, 31,
                                 ra + 2 * R + 16, rk);
        wr.compare_add   = 5;
        ASSERT_TRUE(post_and_wait(e.qp, e.scq, &wr, HCA_WC_ATOMIC));
        uint32_t old;
        memcpy(&old, lb + 2 * R + 16, 4);
        EXPECT_EQ(7u, old);
    }
    EXPECT_EQ('S', proc_state(ch->pid))
            << "the target woke up during the one-sided operations";
    ASSERT_TRUE(send_token(ch->wfd, 1));
    EXPECT_TRUE(expect_token(ch->rfd, 2));
    EXPECT_TRUE(wait_child(ch));
}

/* The parent writes large blocks into the child's MR in a loop; the child
 * deregisters it mid-way.  Once hca_mr_dereg returns no byte changes (the
 * child fills a sentinel and watches it for 200 ms), and later writes fail
 * with REM_ACCESS_ERR. */
TEST_P(ProcsMode, DeregWhileCopying)
{
    const hca_fabric_type_t fab = fabric();
    const size_t LEN   = 32ul << 20;
    const size_t BLK   = 8ul << 20;
    const mem_kind_t k = kind();
    const unsigned fl  = flags();
    child_t *ch = fork_child([k, fl, LEN, fab](int rfd, int wfd) {
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        ctx c;
        ASSERT_TRUE(c.open(fl, fab));
        hca_pd_t *pd = c.new_pd();
        cqw *cq      = c.new_cq(256);
        ASSERT_NE(nullptr, cq);
        hca_qp_t *q1 = c.new_qp(pd, cq, cq), *q2 = c.new_qp(pd, cq, cq);
        ASSERT_NE(nullptr, q2);
        uint8_t *b = c.alloc(k, LEN);
        ASSERT_NE(nullptr, b);
        memset(b, 0, LEN);
        hca_mr_t *mr = c.reg(pd, b, LEN, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        ASSERT_EQ(0, connect_qp(q1, pp.addr, pp.qpn[0]));
        ASSERT_EQ(0, connect_qp(q2, pp.addr, pp.qpn[1]));
        peer_info me;
        memset(&me, 0, sizeof(me));
        me.addr     = c.addr;
        me.qpn[0]   = hca_qp_num(q1);
        me.qpn[1]   = hca_qp_num(q2);
        me.raddr[0] = (uint64_t)(uintptr_t)b;
        me.rkey[0]  = hca_mr_rkey(mr);
        ASSERT_TRUE(send_msg(wfd, me));
        ASSERT_TRUE(expect_token(rfd, 1));   /* writes are flowing */
        sleep_ms(20);
        ASSERT_EQ(0, c.dereg(mr));
        memset(b, SENTINEL, LEN);
        ASSERT_TRUE(send_token(wfd, 2));
        double end = now_ms() + 200;
        int64_t bad = -1;
        while ((now_ms() < end) && (bad < 0)) {
            bad = check_byte(b, LEN, SENTINEL);
        }
        EXPECT_EQ(-1, bad) << "a byte changed after hca_mr_dereg returned";
        ASSERT_TRUE(expect_token(rfd, 3));   /* the parent is done */
        EXPECT_EQ(-1, check_byte(b, LEN, SENTINEL))
                << "a byte changed after hca_mr_dereg returned";
        ASSERT_TRUE(send_token(wfd, 4));
    });
    ASSERT_NE(nullptr, ch);

    ASSERT_TRUE(c.open(fl, fab));
    hca_pd_t *pd = c.new_pd();
    cqw *s1 = c.new_cq(256), *s2 = c.new_cq(256), *r = c.new_cq(256);
    ASSERT_NE(nullptr, r);
    hca_qp_t *q1 = c.new_qp(pd, s1, r), *q2 = c.new_qp(pd, s2, r);
    ASSERT_NE(nullptr, q2);
    uint8_t *lb = c.alloc(k, BLK);
    ASSERT_NE(nullptr, lb);
    fill_pattern(lb, BLK, 3);
    hca_mr_t *lmr = c.reg(pd, lb, BLK, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);
    peer_info me;
    memset(&me, 0, sizeof(me));
    me.addr   = c.addr;
    me.qpn[0] = hca_qp_num(q1);
    me.qpn[1] = hca_qp_num(q2);
    ASSERT_TRUE(send_msg(ch->wfd, me));
    peer_info pi;
    ASSERT_TRUE(recv_msg(ch->rfd, &pi));
    ASSERT_EQ(0, connect_qp(q1, pi.addr, pi.qpn[0]));
    ASSERT_EQ(0, connect_qp(q2, pi.addr, pi.qpn[1]));

    uint64_t posted = 0, done = 0, ok = 0, acc_err = 0, flushed = 0;
    bool told = false, dereg_done = false, failed = false;
    double end = now_ms() + TIMEOUT_MS;
    while (!dereg_done || (done < posted)) {
        ASSERT_LT(now_ms(), end) << "posted " << posted << " done " << done
                                 << " ok " << ok << " dereg_done "
                                 << dereg_done;
        if (!dereg_done && !failed && (posted - done < 4)) {
            hca_sge_t s      = mk_sge(lb, BLK, hca_mr_lkey(lmr));
            hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &s, 1,
                                     HCA_SEND_SIGNALED, posted,
                                     pi.raddr[0] + (posted % 4) * BLK,
                                     pi.rkey[0]);
            hca_send_wr_t *bad;
            int rc = hca_post_send(q1, &wr, &bad);
            if (rc == 0) {
                ++posted;
            } else {
                ASSERT_TRUE((rc == -EAGAIN) || (rc == -ENOMEM)) << rc;
            }
        }
        progress_all();
        hca_wc_t wc;
        while (s1->pop(&wc)) {
            ASSERT_EQ(done, wc.wr_id);
            ++done;
            if (wc.status == HCA_WC_SUCCESS) {
                ASSERT_EQ(0u, acc_err + flushed) << "success after an error";
                ++ok;
            } else if (wc.status == HCA_WC_REM_ACCESS_ERR) {
                ASSERT_EQ(0u, acc_err + flushed) << wc_str(wc);
                ++acc_err;
                failed = true;
            } else {
                ASSERT_EQ(HCA_WC_WR_FLUSH_ERR, wc.status) << wc_str(wc);
                ASSERT_EQ(1u, acc_err) << "flush without a first error";
                ++flushed;
            }
        }
        if (!told && (ok > 0)) {
            ASSERT_TRUE(send_token(ch->wfd, 1));
            told = true;
        }
        if (told && !dereg_done && fd_readable(ch->rfd)) {
            ASSERT_TRUE(expect_token(ch->rfd, 2));
            dereg_done = true;
        }
    }
    EXPECT_GE(ok, 1u);
    /* after dereg: the old key fails (fresh QP, so not a flush) */
    hca_sge_t s      = mk_sge(lb, BLK, hca_mr_lkey(lmr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &s, 1, HCA_SEND_SIGNALED, 99,
                             pi.raddr[0], pi.rkey[0]);
    ASSERT_EQ(0, post_retry(q2, &wr));
    EXPECT_TRUE(wait_status(s2, 99, HCA_WC_REM_ACCESS_ERR));
    ASSERT_TRUE(send_token(ch->wfd, 3));
    EXPECT_TRUE(expect_token(ch->rfd, 4));
    EXPECT_TRUE(wait_child(ch));
}

INSTANTIATE_TEST_SUITE_P(
        Procs, ProcsMode,
        ::testing::Combine(
                ::testing::ValuesIn(seams({OTHER_PROCESS})),
                ::testing::Combine(::testing::Values(MEM_MALLOC, MEM_DM),
                                   ::testing::Values(0u, (unsigned)
                                                     HCA_OPEN_NO_SINGLE_COPY))),
        [](const ::testing::TestParamInfo<ProcsMode::param_type> &i) {
            const pmode_param &p = std::get<1>(i.param);
            return seam_param_name(i.param,
                                   std::string(mem_kind_name(std::get<0>(p))) +
                                           "_" + flags_name(std::get<1>(p)));
        });

class ProcsFlags : public seam_test<unsigned> {
};

/* A READ from a dead process does not hang: it completes with an error.
 * (No hca_qp_check_peer: the engine finds out by itself.) */
TEST_P(ProcsFlags, DeadPeerNoCheck)
{
    const hca_fabric_type_t fab = fabric();
    const unsigned fl = param();
    child_t *ch = fork_child([fl, fab](int rfd, int wfd) {
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        endpoint e(fab);
        ASSERT_TRUE(e.open(fl));
        uint8_t *b   = e.c.alloc(MEM_MALLOC, 1 << 20);
        hca_mr_t *mr = e.c.reg(e.pd, b, 1 << 20, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        ASSERT_EQ(0, connect_qp(e.qp, pp.addr, pp.qpn[0]));
        peer_info me = e.info();
        me.raddr[0]  = (uint64_t)(uintptr_t)b;
        me.rkey[0]   = hca_mr_rkey(mr);
        ASSERT_TRUE(send_msg(wfd, me));
        pause();
    });
    ASSERT_NE(nullptr, ch);
    endpoint e(fab);
    ASSERT_TRUE(e.open(fl));
    peer_info pi;
    ASSERT_TRUE(e.connect_to(ch, &pi));
    uint8_t *lb   = e.c.alloc(MEM_MALLOC, 1 << 20);
    hca_mr_t *lmr = e.c.reg(e.pd, lb, 1 << 20, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);
    hca_sge_t s      = mk_sge(lb, 1 << 20, hca_mr_lkey(lmr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_READ, &s, 1, HCA_SEND_SIGNALED, 1,
                             pi.raddr[0], pi.rkey[0]);
    ASSERT_EQ(0, post_retry(e.qp, &wr));
    ASSERT_TRUE(wait_ok(e.scq, 1, HCA_WC_RDMA_READ)) << "while alive";

    kill_child(ch);
    wr.wr_id = 2;
    int rc   = post_retry(e.qp, &wr);
    if (rc == 0) {
        hca_wc_t wc;
        ASSERT_TRUE(wait_wc(e.scq, &wc)) << "a READ from a dead peer hangs";
        EXPECT_EQ(2u, wc.wr_id);
        EXPECT_TRUE(dead_peer_status(wc.status)) << wc_str(wc);
    } else {
        EXPECT_LT(rc, 0);
    }
    EXPECT_EQ(HCA_QPS_ERR, hca_qp_state(e.qp));
}

INSTANTIATE_TEST_SUITE_P(
        Procs, ProcsFlags,
        ::testing::Combine(::testing::ValuesIn(seams({OTHER_PROCESS})),
                           ::testing::Values(0u, (unsigned)
                                             HCA_OPEN_NO_SINGLE_COPY)),
        [](const ::testing::TestParamInfo<ProcsFlags::param_type> &i) {
            return seam_param_name(i.param, flags_name(std::get<1>(i.param)));
        });

/* ------------------------------------------------------------ contention */

typedef std::tuple<mem_kind_t, bool> contention_param;

class ProcsContention : public seam_test<contention_param> {
};

/* Two children do remote fetch-adds and adds on a counter of the parent
 * while the parent's CPU does __atomic_fetch_add on it: the final value is
 * exact; each child sees its fetched values strictly increase. */
TEST_P(ProcsContention, AtomicsExact)
{
    const hca_fabric_type_t fab = fabric();
    const mem_kind_t k = std::get<0>(param());
    const bool is32    = std::get<1>(param());
    const int K        = 20000;        /* remote ops per child */
    const size_t VOFF  = 8;
    const size_t width = is32 ? 4 : 8;
    const uint64_t init = is32 ? 0xffff0000ull : 0x00000000fffff000ull;

    struct done_msg {
        uint64_t ops;
        int32_t  ok;
        int32_t  pad;
    };
    auto body = [is32, K, width, fab](int rfd, int wfd) {
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        endpoint e(fab);
        ASSERT_TRUE(e.open(0, 64, 256));
        std::string why;
        if (!atomic_supported(e.c.attr, HCA_WR_ATOMIC_FETCH_ADD, is32,
                              &why)) {
            done_msg d = {0, 1, 0};
            send_msg(wfd, e.info());
            send_msg(wfd, d);
            return;
        }
        uint8_t *res  = e.c.alloc(MEM_MALLOC, 16 * 8);
        hca_mr_t *mr  = e.c.reg(e.pd, res, 16 * 8, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        ASSERT_EQ(0, connect_qp(e.qp, pp.addr, pp.qpn[0]));
        ASSERT_TRUE(send_msg(wfd, e.info()));
        ASSERT_TRUE(expect_token(rfd, 1));
        uint64_t posted = 0, done = 0, last = 0;
        bool have_last = false;
        double end     = now_ms() + 4 * TIMEOUT_MS;
        while (done < (uint64_t)K) {
            ASSERT_LT(now_ms(), end) << done << " of " << K << " done";
            if ((posted < (uint64_t)K) && (posted - done < 16)) {
                bool fetch       = (posted % 2) == 0;
                hca_sge_t s      = mk_sge(res + (posted % 16) * 8, width,
                                          hca_mr_lkey(mr));
                hca_send_wr_t wr = mk_wr(fetch ? HCA_WR_ATOMIC_FETCH_ADD
                                               : HCA_WR_ATOMIC_ADD,
                                         fetch ? &s : nullptr, fetch ? 1 : 0,
                                         HCA_SEND_SIGNALED |
                                                 (is32 ? HCA_SEND_ATOMIC32
                                                       : 0),
                                         posted, pp.raddr[0], pp.rkey[0]);
                wr.compare_add   = 1;
                hca_send_wr_t *bad;
                int rc = hca_post_send(e.qp, &wr, &bad);
                if (rc == 0) {
                    ++posted;
                } else {
                    ASSERT_TRUE((rc == -EAGAIN) || (rc == -ENOMEM)) << rc;
                }
            }
            progress_all();
            hca_wc_t wc;
            while (e.scq->pop(&wc)) {
                ASSERT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
                ASSERT_EQ(done, wc.wr_id);
                if (done % 2 == 0) {
                    uint64_t v = 0;
                    memcpy(&v, res + (done % 16) * 8, width);
                    if (have_last) {
                        int64_t d = is32 ? (int64_t)(int32_t)(uint32_t)(v -
                                                                        last)
                                         : (int64_t)(v - last);
                        ASSERT_GT(d, 0) << "fetched values went back";
                    }
                    last      = v;
                    have_last = true;
                }
                ++done;
            }
        }
        done_msg d = {done, 1, 0};
        ASSERT_TRUE(send_msg(wfd, d));
    };
    child_t *c1 = fork_child(body);
    child_t *c2 = fork_child(body);
    ASSERT_NE(nullptr, c1);
    ASSERT_NE(nullptr, c2);

    ASSERT_TRUE(c.open(0, fab));
    std::string why;
    bool supported = atomic_supported(c.attr, HCA_WR_ATOMIC_FETCH_ADD, is32,
                                      &why);
    hca_pd_t *pd = c.new_pd();
    uint8_t *b   = c.alloc(k, 64);
    ASSERT_NE(nullptr, b);
    memset(b, SENTINEL, 64);
    memcpy(b + VOFF, &init, width);
    hca_mr_t *mr = c.reg(pd, b, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    child_t *ch[2] = {c1, c2};
    for (int i = 0; i < 2; ++i) {
        cqw *cq      = c.new_cq(64);
        hca_qp_t *qp = c.new_qp(pd, cq, cq);
        ASSERT_NE(nullptr, qp);
        peer_info me;
        memset(&me, 0, sizeof(me));
        me.addr     = c.addr;
        me.qpn[0]   = hca_qp_num(qp);
        me.raddr[0] = (uint64_t)(uintptr_t)(b + VOFF);
        me.rkey[0]  = hca_mr_rkey(mr);
        ASSERT_TRUE(send_msg(ch[i]->wfd, me));
        peer_info pi;
        ASSERT_TRUE(recv_msg(ch[i]->rfd, &pi));
        ASSERT_EQ(0, connect_qp(qp, pi.addr, pi.qpn[0]));
    }
    if (!supported) {
        for (auto *x : ch) {
            done_msg d;
            recv_msg(x->rfd, &d);
            EXPECT_TRUE(wait_child(x));
        }
        GTEST_SKIP() << why;
    }
    ASSERT_TRUE(send_token(c1->wfd, 1));
    ASSERT_TRUE(send_token(c2->wfd, 1));

    /* the target CPU adds while both children run */
    uint64_t mine = 0;
    int finished  = 0;
    done_msg d[2];
    bool got[2]   = {false, false};
    double end    = now_ms() + 5 * TIMEOUT_MS;
    while (finished < 2) {
        for (int j = 0; j < 64; ++j) {
            if (is32) {
                __atomic_fetch_add((uint32_t*)(b + VOFF), 1, __ATOMIC_SEQ_CST);
            } else {
                __atomic_fetch_add((uint64_t*)(b + VOFF), 1, __ATOMIC_SEQ_CST);
            }
            ++mine;
        }
        for (int i = 0; i < 2; ++i) {
            if (!got[i] && fd_readable(ch[i]->rfd)) {
                ASSERT_TRUE(recv_msg(ch[i]->rfd, &d[i]));
                got[i] = true;
                ++finished;
            }
        }
        ASSERT_LT(now_ms(), end) << "children did not finish";
    }
    EXPECT_TRUE(wait_child(c1));
    EXPECT_TRUE(wait_child(c2));
    ASSERT_EQ((uint64_t)K, d[0].ops);
    ASSERT_EQ((uint64_t)K, d[1].ops);
    uint64_t mask   = is32 ? 0xffffffffull : ~0ull;
    uint64_t expect = (init + 2 * (uint64_t)K + mine) & mask;
    uint64_t now    = 0;
    memcpy(&now, b + VOFF, width);
    EXPECT_EQ(expect, now) << "lost updates: remote " << 2 * K << " local "
                           << mine;
    EXPECT_EQ(-1, check_byte(b, VOFF, SENTINEL));
    EXPECT_EQ(-1, check_byte(b + VOFF + width, 64 - VOFF - width, SENTINEL))
            << "an atomic spilled into the next bytes";
}

INSTANTIATE_TEST_SUITE_P(
        Procs, ProcsContention,
        ::testing::Combine(
                ::testing::ValuesIn(seams({OTHER_PROCESS})),
                ::testing::Combine(::testing::Values(MEM_MALLOC, MEM_DM),
                                   ::testing::Bool())),
        [](const ::testing::TestParamInfo<ProcsContention::param_type> &i) {
            const contention_param &p = std::get<1>(i.param);
            return seam_param_name(i.param,
                                   std::string(mem_kind_name(std::get<0>(p))) +
                                           "_" + (std::get<1>(p) ? "32" : "64"));
        });

/* ------------------------------------------------------------ plain tests */

class Procs : public seam_test<no_param> {
};

/* The target neither posts nor polls receives: the sender keeps sending
 * until hca_post_send returns -EAGAIN (ring full, nothing of that WR
 * delivered); then the target drains and every message arrives once, in
 * order. */
TEST_P(Procs, RecvRingFull)
{
    const hca_fabric_type_t fab = fabric();
    const size_t MS   = 64;
    const uint32_t RW = 256;   /* receives posted by the child at a time */
    const uint64_t MORE = 300; /* messages after the first -EAGAIN */
    child_t *ch = fork_child([MS, RW, fab](int rfd, int wfd) {
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        endpoint e(fab);
        ASSERT_TRUE(e.open(0, RW, 4 * RW));
        uint8_t *b   = e.c.alloc(MEM_MALLOC, RW * MS);
        hca_mr_t *mr = e.c.reg(e.pd, b, RW * MS, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        ASSERT_EQ(0, connect_qp(e.qp, pp.addr, pp.qpn[0]));
        ASSERT_TRUE(send_msg(wfd, e.info()));
        uint64_t total = 0;
        ASSERT_TRUE(recv_msg(rfd, &total, 3 * TIMEOUT_MS));
        ASSERT_GT(total, 0u);
        for (uint32_t s = 0; s < RW; ++s) {
            ASSERT_EQ(0, post_recv1(e.qp, b + s * MS, MS, hca_mr_lkey(mr), s));
        }
        uint64_t got = 0;
        double end   = now_ms() + 3 * TIMEOUT_MS;
        while (got < total) {
            ASSERT_LT(now_ms(), end) << "received " << got << " of " << total;
            progress_all();
            hca_wc_t wc;
            while (e.rcq->pop(&wc)) {
                ASSERT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
                ASSERT_EQ(MS, wc.byte_len);
                uint64_t seq;
                memcpy(&seq, b + wc.wr_id * MS, 8);
                ASSERT_EQ(got, seq) << "lost, duplicated or reordered";
                ASSERT_EQ(-1, check_pattern(b + wc.wr_id * MS + 8, MS - 8,
                                            seq));
                ++got;
                ASSERT_EQ(0, post_recv1(e.qp, b + wc.wr_id * MS, MS,
                                        hca_mr_lkey(mr), wc.wr_id));
            }
            ASSERT_EQ(0, e.rcq->err);
        }
        EXPECT_TRUE(expect_no_wc(e.rcq, 100)) << "more than " << total;
        ASSERT_TRUE(send_msg(wfd, got));
    });
    ASSERT_NE(nullptr, ch);

    endpoint e(fab);
    ASSERT_TRUE(e.open(0, 128, 4096));
    /* a deep send queue, so that the ring fills before the send queue */
    hca_qp_t *qp   = nullptr;
    cqw *scq       = nullptr;
    uint32_t depth = 0;
    ASSERT_TRUE(e.deep_qp(&qp, &scq, &depth));
    peer_info me = e.info();
    me.qpn[0]    = hca_qp_num(qp);
    peer_info pi;
    ASSERT_TRUE(endpoint::connect_to(ch, me, qp, &pi));
    /* a source slot per send queue entry, and one more: a WR's buffer is
     * not reused before its completion (as verbs require: on tcp a queued
     * SEND is read when it goes, not when it is posted), and at most
     * depth WRs are outstanding */
    const uint64_t nslot = (uint64_t)depth + 1;
    uint8_t *src  = e.c.alloc(MEM_MALLOC, MS * nslot);
    hca_mr_t *smr = e.c.reg(e.pd, src, MS * nslot, ACCESS_ALL);
    ASSERT_NE(nullptr, smr);

    auto post_seq = [&](uint64_t seq) {
        uint8_t *p = src + (seq % nslot) * MS;
        seq_msg_fill(p, seq, MS);
        hca_sge_t s      = mk_sge(p, MS, hca_mr_lkey(smr));
        hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &s, 1,
                                 (seq % 64 == 63) ? HCA_SEND_SIGNALED : 0,
                                 seq);
        hca_send_wr_t *bad;
        return hca_post_send(qp, &wr, &bad);
    };
    auto reap = [&]() {
        scq->poll_once();
        hca_wc_t wc;
        while (scq->pop(&wc)) {
            EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
        }
    };

    uint64_t seq = 0;
    int rc       = 0;
    double end   = now_ms() + TIMEOUT_MS;
    double stuck = 0;
    for (;;) {
        ASSERT_LT(now_ms(), end) << "no -EAGAIN after " << seq << " messages";
        rc = post_seq(seq);
        if (rc == 0) {
            ++seq;
            stuck = 0;
            if (seq % 64 == 0) {
                reap();
            }
            continue;
        }
        if (rc == -EAGAIN) {
            break;
        }
        ASSERT_EQ(-ENOMEM, rc);
        /* send queue full: completions may free it (if SENDs complete
         * before they are received) */
        reap();
        if (stuck == 0) {
            stuck = now_ms();
        }
        if ((fab == HCA_FABRIC_TCP) && (now_ms() - stuck > 1000.0)) {
            /* tcp: the target's thread holds one message it has no room
             * for and reads no more; the connection and then our send
             * queue fill - nothing is dropped or buffered without bound */
            break;
        }
        ASSERT_LT(now_ms() - stuck, 2000.0)
                << "the send queue (" << depth << ") filled before the "
                << "target's receive ring, after " << seq << " messages";
    }
    /* still full: retrying the refused message is refused again (shm: the
     * ring, tcp: the send queue behind the full connection) */
    EXPECT_EQ((fab == HCA_FABRIC_TCP) ? -ENOMEM : -EAGAIN, post_seq(seq));
    if (fab == HCA_FABRIC_SHM) {
        hca_counters_t cnt;
        ASSERT_EQ(0, hca_device_counters(e.c.dev, &cnt));
        EXPECT_GE(cnt.ring_full, 1u);
    }

    const uint64_t total = seq + MORE;
    ASSERT_TRUE(send_msg(ch->wfd, total));
    while (seq < total) {
        rc = post_seq(seq);
        if (rc == 0) {
            ++seq;
        } else {
            ASSERT_TRUE((rc == -EAGAIN) || (rc == -ENOMEM)) << rc;
            ASSERT_LT(now_ms(), end + 3 * TIMEOUT_MS);
        }
        reap();
    }
    uint64_t got = 0;
    double e2    = now_ms() + 3 * TIMEOUT_MS;
    while (!fd_readable(ch->rfd)) {
        reap();
        ASSERT_LT(now_ms(), e2) << "the target did not get everything";
    }
    ASSERT_TRUE(recv_msg(ch->rfd, &got));
    EXPECT_EQ(total, got);
    EXPECT_TRUE(wait_child(ch));
}

/* A child that has the device open with QPs, MRs, an SRQ and device memory
 * owns /dev/shm objects named after its pid; after it closes the device and
 * exits cleanly none is left. */
TEST_P(Procs, ShmCleanExit)
{
    const hca_fabric_type_t fab = fabric();
    child_t *ch = fork_child([fab](int rfd, int wfd) {
        endpoint e(fab);
        ASSERT_TRUE(e.open(0));
        uint8_t *d = e.c.alloc(MEM_DM, 1 << 20);
        ASSERT_NE(nullptr, d);
        ASSERT_NE(nullptr, e.c.reg(e.pd, d, 1 << 20, ACCESS_ALL));
        uint8_t *m = e.c.alloc(MEM_MALLOC, 1 << 20);
        ASSERT_NE(nullptr, e.c.reg(e.pd, m, 1 << 20, ACCESS_ALL));
        ASSERT_NE(nullptr, e.c.new_srq(e.pd, 64));
        ASSERT_EQ(0, connect_qp(e.qp, e.c.addr, hca_qp_num(e.qp)));
        ASSERT_TRUE(send_token(wfd, 1));
        ASSERT_TRUE(expect_token(rfd, 2));
        e.c.close();
        ASSERT_TRUE(send_token(wfd, 3));
        ASSERT_TRUE(expect_token(rfd, 4));
    });
    ASSERT_NE(nullptr, ch);
    ASSERT_TRUE(expect_token(ch->rfd, 1));
    std::vector<std::string> v = shm_entries_of(ch->pid);
    EXPECT_FALSE(v.empty()) << "no /dev/shm/hca.*." << ch->pid
                            << ".* object while the device is open "
                            << "(naming convention?)";
    ASSERT_TRUE(send_token(ch->wfd, 2));
    ASSERT_TRUE(expect_token(ch->rfd, 3));
    v = shm_entries_of(ch->pid);
    EXPECT_TRUE(v.empty()) << "left after hca_device_close: " << join(v);
    ASSERT_TRUE(send_token(ch->wfd, 4));
    EXPECT_TRUE(wait_child(ch));
    v = shm_entries_of(ch->pid);
    EXPECT_TRUE(v.empty()) << "left after a clean exit: " << join(v);
}

/* A child killed with SIGKILL leaves its objects; the next
 * hca_device_open (of the parent, or of a new process) reclaims them. */
static void reclaim_after_kill(hca_fabric_type_t fab, bool by_new_process)
{
    child_t *ch = fork_child([fab](int rfd, int wfd) {
        (void)rfd;
        endpoint e(fab);
        ASSERT_TRUE(e.open(0));
        uint8_t *d = e.c.alloc(MEM_DM, 1 << 20);
        ASSERT_NE(nullptr, d);
        ASSERT_NE(nullptr, e.c.reg(e.pd, d, 1 << 20, ACCESS_ALL));
        uint8_t *m = e.c.alloc(MEM_MALLOC, 1 << 20);
        ASSERT_NE(nullptr, e.c.reg(e.pd, m, 1 << 20, ACCESS_ALL));
        ASSERT_EQ(0, connect_qp(e.qp, e.c.addr, hca_qp_num(e.qp)));
        ctx c2;   /* a second context */
        ASSERT_TRUE(c2.open(HCA_OPEN_NO_SINGLE_COPY, fab));
        ASSERT_NE(nullptr, c2.alloc(MEM_DM, 4096));
        ASSERT_TRUE(send_token(wfd, 1));
        pause();
    });
    ASSERT_NE(nullptr, ch);
    ASSERT_TRUE(expect_token(ch->rfd, 1));
    pid_t pid                  = ch->pid;
    std::vector<std::string> v = shm_entries_of(pid);
    ASSERT_FALSE(v.empty()) << "no /dev/shm/hca.*." << pid << ".* object";
    kill_child(ch);
    std::vector<std::string> after = shm_entries_of(pid);
    EXPECT_EQ(v, after) << "objects of a killed process must stay until "
                           "reclaimed";

    if (by_new_process) {
        child_t *c2 = fork_child([fab](int, int) {
            ctx c;
            ASSERT_TRUE(c.open(0, fab));
        });
        ASSERT_NE(nullptr, c2);
        EXPECT_TRUE(wait_child(c2));
    } else {
        ctx c;
        ASSERT_TRUE(c.open(0, fab));
    }
    after = shm_entries_of(pid);
    EXPECT_TRUE(after.empty()) << "not reclaimed by hca_device_open: "
                               << join(after);
    if (!after.empty()) {
        sleep_ms(2000);
        after = shm_entries_of(pid);
        EXPECT_TRUE(after.empty()) << "still there 2 s later: " << join(after);
    }
}

TEST_P(Procs, ShmReclaimAfterKill)
{
    reclaim_after_kill(fabric(), false);
}

TEST_P(Procs, ShmReclaimByNewProcess)
{
    reclaim_after_kill(fabric(), true);
}

/* The child sleeps in hca_cq_wait on its receive CQ; the parent's SEND
 * wakes it. */
TEST_P(Procs, BlockingWaitInChild)
{
    const hca_fabric_type_t fab = fabric();
    const int DELAY_MS = 300;
    child_t *ch = fork_child([fab](int rfd, int wfd) {
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        endpoint e(fab);
        ASSERT_TRUE(e.open(0));
        cq_unregister(e.rcq);
        uint8_t *b   = e.c.alloc(MEM_MALLOC, 4096);
        hca_mr_t *mr = e.c.reg(e.pd, b, 4096, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        memset(b, 0, 4096);
        ASSERT_EQ(0, connect_qp(e.qp, pp.addr, pp.qpn[0]));
        ASSERT_EQ(0, post_recv1(e.qp, b, 4096, hca_mr_lkey(mr), 77));
        ASSERT_TRUE(send_msg(wfd, e.info()));
        double t0   = now_ms();
        double cpu0 = thread_cpu_ms();
        int wakeups = 0;
        hca_wc_t wc;
        int got = 0;
        for (;;) {
            ASSERT_LT(now_ms() - t0, (double)TIMEOUT_MS) << "never woken";
            got = hca_cq_poll(e.rcq->cq, 1, &wc);
            ASSERT_GE(got, 0);
            if (got > 0) {
                break;
            }
            hca_cq_wait(e.rcq->cq, TIMEOUT_MS);
            ++wakeups;
        }
        double el  = now_ms() - t0;
        double cpu = thread_cpu_ms() - cpu0;
        EXPECT_EQ(HCA_WC_SUCCESS, wc.status) << wc_str(wc);
        EXPECT_EQ(HCA_WC_RECV, wc.opcode);
        EXPECT_EQ(77u, wc.wr_id);
        EXPECT_EQ(1000u, wc.byte_len);
        EXPECT_EQ(-1, check_pattern(b, 1000, 8));
        EXPECT_LE(wakeups, 20) << "hca_cq_wait does not sleep";
        EXPECT_LT(cpu, 0.5 * el) << "the waiting thread used " << cpu
                                 << " ms of CPU in " << el << " ms";
        ASSERT_TRUE(send_token(wfd, 1));
        ASSERT_TRUE(expect_token(rfd, 2));
    });
    ASSERT_NE(nullptr, ch);
    endpoint e(fab);
    ASSERT_TRUE(e.open(0));
    peer_info pi;
    ASSERT_TRUE(e.connect_to(ch, &pi));
    uint8_t *b   = e.c.alloc(MEM_MALLOC, 1000);
    hca_mr_t *mr = e.c.reg(e.pd, b, 1000, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    fill_pattern(b, 1000, 8);
    sleep_ms(DELAY_MS);
    EXPECT_EQ('S', proc_state(ch->pid)) << "the child is not asleep";
    hca_sge_t s      = mk_sge(b, 1000, hca_mr_lkey(mr));
    hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &s, 1, HCA_SEND_SIGNALED, 1);
    ASSERT_TRUE(post_and_wait(e.qp, e.scq, &wr, HCA_WC_SEND));
    EXPECT_TRUE(expect_token(ch->rfd, 1));
    ASSERT_TRUE(send_token(ch->wfd, 2));
    EXPECT_TRUE(wait_child(ch));
}

/* A dead peer: hca_qp_check_peer returns 0 and moves the QP to ERR;
 * outstanding and later WRs complete with RETRY_EXC_ERR or WR_FLUSH_ERR;
 * nothing hangs. */
TEST_P(Procs, DeadPeerCheck)
{
    const hca_fabric_type_t fab = fabric();
    child_t *ch = fork_child([fab](int rfd, int wfd) {
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        endpoint e(fab);
        ASSERT_TRUE(e.open(0));
        uint8_t *b   = e.c.alloc(MEM_MALLOC, 4096);
        hca_mr_t *mr = e.c.reg(e.pd, b, 4096, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        ASSERT_EQ(0, connect_qp(e.qp, pp.addr, pp.qpn[0]));
        peer_info me = e.info();
        me.raddr[0]  = (uint64_t)(uintptr_t)b;
        me.rkey[0]   = hca_mr_rkey(mr);
        ASSERT_TRUE(send_msg(wfd, me));
        pause();
    });
    ASSERT_NE(nullptr, ch);
    endpoint e(fab);
    ASSERT_TRUE(e.open(0));
    peer_info pi;
    ASSERT_TRUE(e.connect_to(ch, &pi));
    uint8_t *b   = e.c.alloc(MEM_MALLOC, 4096);
    hca_mr_t *mr = e.c.reg(e.pd, b, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    hca_sge_t s      = mk_sge(b, 64, hca_mr_lkey(mr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &s, 1, HCA_SEND_SIGNALED, 1,
                             pi.raddr[0], pi.rkey[0]);
    ASSERT_TRUE(post_and_wait(e.qp, e.scq, &wr, HCA_WC_RDMA_WRITE));
    EXPECT_EQ(1, hca_qp_check_peer(e.qp));
    EXPECT_EQ(1, hca_port_addr_alive(&pi.addr));

    /* a SEND the child will never receive: 1 MiB is more than its ring
     * holds, and the child neither posts a receive nor polls, so it stays
     * outstanding */
    uint8_t *big   = e.c.alloc(MEM_MALLOC, 1 << 20);
    hca_mr_t *bmr  = e.c.reg(e.pd, big, 1 << 20, ACCESS_ALL);
    ASSERT_NE(nullptr, bmr);
    hca_sge_t bs     = mk_sge(big, 1 << 20, hca_mr_lkey(bmr));
    hca_send_wr_t sw = mk_wr(HCA_WR_SEND, &bs, 1, HCA_SEND_SIGNALED, 2);
    ASSERT_EQ(0, post_retry(e.qp, &sw));
    sleep_ms(20);
    EXPECT_EQ(1u, hca_qp_outstanding(e.qp));
    kill_child(ch);
    EXPECT_EQ(0, hca_port_addr_alive(&pi.addr));
    EXPECT_EQ(0, hca_qp_check_peer(e.qp));
    EXPECT_EQ(HCA_QPS_ERR, hca_qp_state(e.qp));
    hca_wc_t wc;
    ASSERT_TRUE(wait_wc(e.scq, &wc)) << "the outstanding SEND hangs";
    EXPECT_EQ(2u, wc.wr_id);
    EXPECT_TRUE(dead_peer_status(wc.status)) << wc_str(wc);
    /* a later post is refused (QP in ERR) or completes with an error;
     * whether posting in ERR is accepted is Qp.PostInErrFlushes' business */
    wr.wr_id = 3;
    hca_send_wr_t *bad;
    int rc = hca_post_send(e.qp, &wr, &bad);
    if (rc == 0) {
        ASSERT_TRUE(wait_wc(e.scq, &wc)) << "a WR to a dead peer hangs";
        EXPECT_EQ(3u, wc.wr_id);
        EXPECT_TRUE(dead_peer_status(wc.status)) << wc_str(wc);
    } else {
        EXPECT_EQ(-EINVAL, rc);
    }
    EXPECT_EQ(0u, hca_qp_outstanding(e.qp));
}

/* rkey_ptr on the device memory of another process. */
TEST_P(Procs, RkeyPtr)
{
    const hca_fabric_type_t fab = fabric();
    child_t *ch = fork_child([fab](int rfd, int wfd) {
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        endpoint e(fab);
        ASSERT_TRUE(e.open(0));
        uint8_t *d    = e.c.alloc(MEM_DM, 65536);
        uint8_t *m    = e.c.alloc(MEM_MALLOC, 65536);
        ASSERT_NE(nullptr, d);
        hca_mr_t *dmr = e.c.reg(e.pd, d, 65536, ACCESS_ALL);
        hca_mr_t *mmr = e.c.reg(e.pd, m, 65536, ACCESS_ALL);
        ASSERT_NE(nullptr, mmr);
        memset(d, SENTINEL, 65536);
        uint64_t ctr = 1000;
        memcpy(d + 4096, &ctr, 8);
        ASSERT_EQ(0, connect_qp(e.qp, pp.addr, pp.qpn[0]));
        peer_info me = e.info();
        me.raddr[0]  = (uint64_t)(uintptr_t)d;
        me.rkey[0]   = hca_mr_rkey(dmr);
        me.raddr[1]  = (uint64_t)(uintptr_t)m;
        me.rkey[1]   = hca_mr_rkey(mmr);
        ASSERT_TRUE(send_msg(wfd, me));
        ASSERT_TRUE(expect_token(rfd, 1));
        if (fab == HCA_FABRIC_TCP) {
            /* another host's memory is never mapped: nothing changed */
            EXPECT_EQ(-1, check_byte(d, 4096, SENTINEL));
            memcpy(&ctr, d + 4096, 8);
            EXPECT_EQ(1000u, ctr);
            ASSERT_TRUE(send_token(wfd, 2));
            return;
        }
        EXPECT_EQ(-1, check_pattern(d + 100, 1000, 21))
                << "stores through rkey_ptr not visible";
        EXPECT_EQ(-1, check_byte(d, 100, SENTINEL));
        EXPECT_EQ(-1, check_byte(d + 1100, 4096 - 1100, SENTINEL));
        memcpy(&ctr, d + 4096, 8);
        EXPECT_EQ(1005u, ctr);
        ASSERT_TRUE(send_token(wfd, 2));
    });
    ASSERT_NE(nullptr, ch);
    endpoint e(fab);
    ASSERT_TRUE(e.open(0));
    peer_info pi;
    ASSERT_TRUE(e.connect_to(ch, &pi));
    void *p = nullptr;
    if (fab == HCA_FABRIC_TCP) {
        /* a peer reached over tcp is on another host: no pointer, even
         * with a right key */
        EXPECT_EQ(-ENOENT, hca_qp_rkey_ptr(e.qp, pi.raddr[0] + 100,
                                           pi.rkey[0], 1000, &p));
        EXPECT_EQ(nullptr, p);
        ASSERT_TRUE(send_token(ch->wfd, 1));
        EXPECT_TRUE(expect_token(ch->rfd, 2));
        EXPECT_TRUE(wait_child(ch));
        return;
    }
    ASSERT_EQ(0, hca_qp_rkey_ptr(e.qp, pi.raddr[0] + 100, pi.rkey[0], 1000,
                                 &p));
    ASSERT_NE(nullptr, p);
    fill_pattern(p, 1000, 21);
    void *q = nullptr;
    ASSERT_EQ(0, hca_qp_rkey_ptr(e.qp, pi.raddr[0] + 4096, pi.rkey[0], 8, &q));
    for (int i = 0; i < 5; ++i) {
        __atomic_fetch_add((uint64_t*)q, 1, __ATOMIC_SEQ_CST);
    }
    EXPECT_EQ(-ENOENT, hca_qp_rkey_ptr(e.qp, pi.raddr[1], pi.rkey[1], 8, &q));
    EXPECT_EQ(-EACCES, hca_qp_rkey_ptr(e.qp, pi.raddr[0], ~pi.rkey[0], 8, &q));
    EXPECT_EQ(-EACCES, hca_qp_rkey_ptr(e.qp, pi.raddr[0] + 65536 - 4,
                                       pi.rkey[0], 8, &q));
    ASSERT_TRUE(send_token(ch->wfd, 1));
    EXPECT_TRUE(expect_token(ch->rfd, 2));
    EXPECT_TRUE(wait_child(ch));
}

/* hca_dm_view on the device memory of another process: stores through the
 * pointer land in its MR and nowhere else; after it deregistered the MR,
 * the key gives no pointer. */
TEST_P(Procs, DmView)
{
    const hca_fabric_type_t fab = fabric();
    child_t *ch = fork_child([fab](int rfd, int wfd) {
        ctx c;
        ASSERT_TRUE(c.open(0, fab));
        hca_pd_t *pd = c.new_pd();
        uint8_t *d   = c.alloc(MEM_DM, 1 << 20);
        ASSERT_NE(nullptr, d);
        hca_mr_t *mr = c.reg(pd, d + 4096, 8192, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        memset(d, SENTINEL, 1 << 20);
        peer_info me;
        memset(&me, 0, sizeof(me));
        me.addr    = c.addr;
        uint64_t b = 0;
        me.qpn[0]  = hca_mr_dm_id(mr, &b);   /* the dm id */
        me.raddr[0] = b;
        me.rkey[0]  = hca_mr_rkey(mr);
        ASSERT_NE(0u, me.qpn[0]);
        EXPECT_EQ((uint64_t)(uintptr_t)d, b);
        ASSERT_TRUE(send_msg(wfd, me));
        ASSERT_TRUE(expect_token(rfd, 1));
        EXPECT_EQ(-1, check_pattern(d + 4096, 8192, 17));
        EXPECT_EQ(-1, check_byte(d, 4096, SENTINEL));
        EXPECT_EQ(-1, check_byte(d + 4096 + 8192, (1 << 20) - 4096 - 8192,
                                 SENTINEL));
        ASSERT_EQ(0, c.dereg(mr));
        ASSERT_TRUE(send_token(wfd, 2));
        ASSERT_TRUE(expect_token(rfd, 3));
    });
    ASSERT_NE(nullptr, ch);
    peer_info pi;
    ASSERT_TRUE(recv_msg(ch->rfd, &pi));
    hca_dm_view_t *v = nullptr;
    ASSERT_EQ(0, hca_dm_view_open(&pi.addr, pi.qpn[0], &v));
    void *p = nullptr;
    ASSERT_EQ(0, hca_dm_view_ptr(v, pi.rkey[0], pi.raddr[0] + 4096, &p));
    EXPECT_EQ(-1, check_byte(p, 8192, SENTINEL));
    fill_pattern(p, 8192, 17);
    ASSERT_TRUE(send_token(ch->wfd, 1));
    ASSERT_TRUE(expect_token(ch->rfd, 2));
    EXPECT_EQ(-EACCES, hca_dm_view_ptr(v, pi.rkey[0], pi.raddr[0] + 4096, &p))
            << "a pointer for a deregistered MR";
    hca_dm_view_close(v);
    ASSERT_TRUE(send_token(ch->wfd, 3));
    EXPECT_TRUE(wait_child(ch));
}

/* The parent has the device open (its responder running) when it forks;
 * the child opens its own context and talks to the parent. */
TEST_P(Procs, ForkAfterOpen)
{
    const hca_fabric_type_t fab = fabric();
    endpoint e(fab);
    ASSERT_TRUE(e.open(0));
    uint8_t *b   = e.c.alloc(MEM_MALLOC, 65536);
    hca_mr_t *mr = e.c.reg(e.pd, b, 65536, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    memset(b, SENTINEL, 65536);
    peer_info me = e.info();
    me.raddr[0]  = (uint64_t)(uintptr_t)b;
    me.rkey[0]   = hca_mr_rkey(mr);

    child_t *ch = fork_child([me, fab](int rfd, int wfd) {
        (void)rfd;
        endpoint c(fab);
        ASSERT_TRUE(c.open(0));
        uint8_t *s   = c.c.alloc(MEM_MALLOC, 32768);
        hca_mr_t *sm = c.c.reg(c.pd, s, 32768, ACCESS_ALL);
        ASSERT_NE(nullptr, sm);
        ASSERT_TRUE(send_msg(wfd, c.info()));
        ASSERT_TRUE(expect_token(rfd, 1));
        ASSERT_EQ(0, connect_qp(c.qp, me.addr, me.qpn[0]));
        fill_pattern(s, 32768, 31);
        hca_sge_t sg     = mk_sge(s, 32768, hca_mr_lkey(sm));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED,
                                 1, me.raddr[0], me.rkey[0]);
        ASSERT_TRUE(post_and_wait(c.qp, c.scq, &wr, HCA_WC_RDMA_WRITE));
        fill_pattern(s, 32768, 32);
        wr = mk_wr(HCA_WR_SEND, &sg, 1, HCA_SEND_SIGNALED, 2);
        ASSERT_TRUE(post_and_wait(c.qp, c.scq, &wr, HCA_WC_SEND, nullptr,
                                  2 * TIMEOUT_MS));
    });
    ASSERT_NE(nullptr, ch);
    peer_info pi;
    ASSERT_TRUE(recv_msg(ch->rfd, &pi));
    ASSERT_EQ(0, connect_qp(e.qp, pi.addr, pi.qpn[0]));
    ASSERT_EQ(0, post_recv1(e.qp, b + 32768, 32768, hca_mr_lkey(mr), 5));
    ASSERT_TRUE(send_token(ch->wfd, 1));
    hca_wc_t wc;
    ASSERT_TRUE(wait_ok(e.rcq, 5, HCA_WC_RECV, &wc, 2 * TIMEOUT_MS));
    EXPECT_EQ(32768u, wc.byte_len);
    EXPECT_EQ(-1, check_pattern(b, 32768, 31)) << "RDMA WRITE from the child";
    EXPECT_EQ(-1, check_pattern(b + 32768, 32768, 32)) << "SEND from the child";
    EXPECT_TRUE(wait_child(ch));
}

/* Port addresses across processes: reachable, alive, then gone. */
TEST_P(Procs, AddressOfOtherProcess)
{
    const hca_fabric_type_t fab = fabric();
    child_t *ch = fork_child([fab](int rfd, int wfd) {
        ctx c;
        ASSERT_TRUE(c.open(0, fab));
        ASSERT_TRUE(send_msg(wfd, c.addr));
        ASSERT_TRUE(expect_token(rfd, 1));
    });
    ASSERT_NE(nullptr, ch);
    hca_port_addr_t a;
    ASSERT_TRUE(recv_msg(ch->rfd, &a));
    ASSERT_TRUE(c.open(0, fab));
    EXPECT_EQ((uint32_t)ch->pid, a.pid);
    EXPECT_EQ(a.host, c.addr.host);
    EXPECT_TRUE(hca_port_addr_reachable(c.dev, &a));
    EXPECT_EQ(1, hca_port_addr_alive(&a));
    ASSERT_TRUE(send_token(ch->wfd, 1));
    EXPECT_TRUE(wait_child(ch));
    EXPECT_EQ(0, hca_port_addr_alive(&a));
}

/* The target's ring is full and its owner dies: posting gives -EAGAIN
 * for a while, then either -ECONNRESET (the ring stayed full and the owner
 * is gone) or the WR is accepted and completes with RETRY_EXC_ERR; the QP
 * ends in ERR, outstanding WRs complete; nothing hangs. */
TEST_P(Procs, DeadPeerRingFull)
{
    const hca_fabric_type_t fab = fabric();
    const size_t MS = 64;
    child_t *ch = fork_child([fab](int rfd, int wfd) {
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        endpoint e(fab);
        ASSERT_TRUE(e.open(0));
        ASSERT_EQ(0, connect_qp(e.qp, pp.addr, pp.qpn[0]));
        ASSERT_TRUE(send_msg(wfd, e.info()));
        pause();
    });
    ASSERT_NE(nullptr, ch);
    endpoint e(fab);
    ASSERT_TRUE(e.open(0, 128, 4096));
    hca_qp_t *qp = nullptr;
    cqw *scq     = nullptr;
    ASSERT_TRUE(e.deep_qp(&qp, &scq));
    peer_info me = e.info();
    me.qpn[0]    = hca_qp_num(qp);
    peer_info pi;
    ASSERT_TRUE(endpoint::connect_to(ch, me, qp, &pi));
    uint8_t *src  = e.c.alloc(MEM_MALLOC, MS);
    hca_mr_t *smr = e.c.reg(e.pd, src, MS, ACCESS_ALL);
    ASSERT_NE(nullptr, smr);
    hca_sge_t s = mk_sge(src, MS, hca_mr_lkey(smr));

    uint64_t n   = 0;
    int rc       = 0;
    double end   = now_ms() + TIMEOUT_MS;
    double stuck = 0;
    for (;;) {
        ASSERT_LT(now_ms(), end) << "no -EAGAIN after " << n << " messages";
        hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &s, 1,
                                 (n % 64 == 63) ? HCA_SEND_SIGNALED : 0, n);
        hca_send_wr_t *bad;
        rc = hca_post_send(qp, &wr, &bad);
        if (rc == 0) {
            ++n;
            stuck = 0;
            scq->poll_once();
            continue;
        }
        if (rc == -EAGAIN) {
            break;
        }
        ASSERT_EQ(-ENOMEM, rc);
        scq->poll_once();
        if (stuck == 0) {
            stuck = now_ms();
        } else if ((fab == HCA_FABRIC_TCP) && (now_ms() - stuck > 1000.0)) {
            break; /* tcp: full means the send queue behind the connection */
        }
    }
    kill_child(ch);
    end = now_ms() + 2 * TIMEOUT_MS;
    for (;;) {
        ASSERT_LT(now_ms(), end) << "still " << rc
                                 << " long after the target died";
        hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &s, 1, HCA_SEND_SIGNALED, n);
        hca_send_wr_t *bad;
        rc = hca_post_send(qp, &wr, &bad);
        if ((rc != -EAGAIN) && !((fab == HCA_FABRIC_TCP) && (rc == -ENOMEM))) {
            break;
        }
        scq->poll_once();
        sleep_ms(1);
    }
    if (rc == 0) {
        /* accepted: it must fail (the peer is gone), not succeed */
        hca_wc_t wc;
        bool found = false;
        double e2  = now_ms() + TIMEOUT_MS;
        while (!found) {
            ASSERT_LT(now_ms(), e2) << "the WR to the dead peer hangs";
            scq->poll_once();
            while (scq->pop(&wc)) {
                if (wc.wr_id == n) {
                    found = true;
                    EXPECT_TRUE(dead_peer_status(wc.status)) << wc_str(wc);
                }
            }
        }
    } else {
        EXPECT_EQ(-ECONNRESET, rc);
    }
    EXPECT_EQ(HCA_QPS_ERR, hca_qp_state(qp));
    /* whatever was outstanding completes */
    end = now_ms() + TIMEOUT_MS;
    while (hca_qp_outstanding(qp) != 0) {
        ASSERT_LT(now_ms(), end) << hca_qp_outstanding(qp)
                                 << " WRs never complete";
        scq->poll_once();
    }
}

/* hca_host_counters: every process's QPs, the closed ones included. */
TEST_P(Procs, HostCounters)
{
    const hca_fabric_type_t fab = fabric();
    hca_counters_t h0, h1;
    ASSERT_EQ(0, hca_host_counters(dev_name().c_str(), &h0));
    child_t *ch = fork_child([fab](int, int) {
        ctx c;
        ASSERT_TRUE(c.open(0, fab));
        qp_pair p;
        ASSERT_TRUE(make_qp_pair(c, c, &p));
        uint8_t *b   = c.alloc(MEM_MALLOC, 4096);
        hca_mr_t *mr = c.reg(p.pd1, b, 4096, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        for (int i = 0; i < 3; ++i) {
            hca_sge_t s      = mk_sge(b, 100, hca_mr_lkey(mr));
            hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &s, 1,
                                     HCA_SEND_SIGNALED, i,
                                     (uint64_t)(uintptr_t)(b + 2048),
                                     hca_mr_rkey(mr));
            ASSERT_TRUE(post_and_wait(p.q1, p.s1, &wr, HCA_WC_RDMA_WRITE));
        }
        c.close();
    });
    ASSERT_NE(nullptr, ch);
    ASSERT_TRUE(wait_child(ch));
    ASSERT_EQ(0, hca_host_counters(dev_name().c_str(), &h1));
    /* other processes of the host may add to it: at least ours */
    EXPECT_GE(h1.tx_ops[HCA_WR_RDMA_WRITE], h0.tx_ops[HCA_WR_RDMA_WRITE] + 3)
            << "a closed context's counters are kept";
    EXPECT_GE(h1.tx_bytes[HCA_WR_RDMA_WRITE],
              h0.tx_bytes[HCA_WR_RDMA_WRITE] + 300);
}

INSTANTIATE_TEST_SUITE_P(
        Procs, Procs,
        ::testing::Combine(::testing::ValuesIn(seams({OTHER_PROCESS})),
                           ::testing::Values(no_param())),
        [](const ::testing::TestParamInfo<Procs::param_type> &i) {
            return seam_param_name(i.param, "");
        });
