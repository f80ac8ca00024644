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
