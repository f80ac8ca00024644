/*
 * test_tcp_stripe.cc - large WRITEs striped over two paths (the tcp
 * fabric's hca_tcp_stripe.c and the responder's out-of-order parts in
 * hca_tcp_rel.c) and large READs answered over two paths (hca_tcp_resp.c):
 * a striped WRITE lands exactly as the same WRITE over one path, a
 * striped answer fills the READ's buffer exactly, both complete in order
 * with what follows them, and stay exact under injected loss,
 * duplication and connection resets.
 *
 * Two contexts of this process, each with two paths on loopback
 * (127.0.0.1 and 127.0.0.2: the kernel takes all of 127/8 as local).
 */
#include "test_common.h"

#include <cstdlib>
#include <string>
#include <vector>

namespace hcat {
namespace {

const char *const TWO_PATHS = "127.0.0.1,127.0.0.2";
const char *const ONE_PATH  = "127.0.0.1";
/* larger than HCA_TCP_STRIPE_MIN (512 KiB), not a multiple of the 64 KiB
 * part: the last part is short */
const size_t BIG = (4u << 20) + (64u << 10) + 123;
const size_t PAD = 4096 + 7; /* the WRITE lands at this offset, unaligned */

/* Environment variables for the contexts opened while it lives. */
class env_scope {
public:
    void set(const char *name, const char *value)
    {
        const char *old = getenv(name);
        saved_.push_back({name, (old != nullptr) ? old : "", old != nullptr});
        if (value != nullptr) {
            setenv(name, value, 1);
        } else {
            unsetenv(name);
        }
    }

    ~env_scope()
    {
        for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
            if (it->had) {
                setenv(it->name.c_str(), it->value.c_str(), 1);
            } else {
                unsetenv(it->name.c_str());
            }
        }
    }

private:
    struct saved_t {
        std::string name, value;
        bool        had;
    };
    std::vector<saved_t> saved_;
};

/* Two tcp contexts with the paths given (and HCA_FAULT, if any), and a QP
 * pair between them that has made its first WRITE (a QP's first WQE never
 * stripes: its first frame makes the responder's record of the QP). */
struct pair_env {
    ctx     a, b;
    qp_pair p;

    ::testing::AssertionResult open(const char *paths, const char *fault,
                                    const char *stripe_min = nullptr)
    {
        env_scope env;
        env.set("HCA_NET_DEVICES", paths);
        env.set("HCA_FAULT", fault);
        env.set("HCA_TCP_STRIPE_MIN", stripe_min);
        if (!a.open(0, HCA_FABRIC_TCP) || !b.open(0, HCA_FABRIC_TCP)) {
            return ::testing::AssertionFailure() << "contexts on " << paths;
        }
        ::testing::AssertionResult r = make_qp_pair(a, b, &p);
        if (!r) {
            return r;
        }
        uint8_t *src  = a.alloc(MEM_MALLOC, 64);
        uint8_t *dst  = b.alloc(MEM_MALLOC, 64);
        hca_mr_t *smr = (src != nullptr) ? a.reg(p.pd1, src, 64, ACCESS_ALL)
                                         : nullptr;
        hca_mr_t *dmr = (dst != nullptr) ? b.reg(p.pd2, dst, 64, ACCESS_ALL)
                                         : nullptr;
        if ((smr == nullptr) || (dmr == nullptr)) {
            return ::testing::AssertionFailure() << "the first WRITE's regions";
        }
        hca_sge_t sg     = mk_sge(src, 64, hca_mr_lkey(smr));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED,
                                 ~0ull, (uint64_t)(uintptr_t)dst,
                                 hca_mr_rkey(dmr));
        return post_and_wait(p.q1, p.s1, &wr, HCA_WC_RDMA_WRITE);
    }
};

/* One WRITE of BIG bytes of pattern `seed` into dst at PAD, which holds
 * SENTINEL around it; what dst holds afterwards. */
void write_once(const char *paths, uint64_t seed, std::vector<uint8_t> *out,
                uint64_t *striped, const char *stripe_min = nullptr,
                uint64_t *again = nullptr)
{
    pair_env e;
    ASSERT_TRUE(e.open(paths, nullptr, stripe_min));
    const size_t dlen = BIG + 2 * PAD;
    uint8_t *src      = e.a.alloc(MEM_MALLOC, BIG);
    uint8_t *dst      = e.b.alloc(MEM_MALLOC, dlen);
    ASSERT_NE(nullptr, src);
    ASSERT_NE(nullptr, dst);
    hca_mr_t *smr = e.a.reg(e.p.pd1, src, BIG, ACCESS_ALL);
    hca_mr_t *dmr = e.b.reg(e.p.pd2, dst, dlen, ACCESS_ALL);
    ASSERT_NE(nullptr, smr);
    ASSERT_NE(nullptr, dmr);
    fill_pattern(src, BIG, seed);
    memset(dst, SENTINEL, dlen);

    uint64_t before  = tcp_counter(e.a.dev, "striped_writes");
    uint64_t rtx0    = tcp_counter(e.a.dev, "retransmits");
    hca_sge_t sg     = mk_sge(src, BIG, hca_mr_lkey(smr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED, 1,
                             (uint64_t)(uintptr_t)(dst + PAD),
                             hca_mr_rkey(dmr));
    ASSERT_TRUE(post_and_wait(e.p.q1, e.p.s1, &wr, HCA_WC_RDMA_WRITE));
    *striped = tcp_counter(e.a.dev, "striped_writes") - before;
    if (again != nullptr) {
        *again = tcp_counter(e.a.dev, "retransmits") - rtx0;
    }
    out->assign(dst, dst + dlen);
}

/* The same WRITE over one path and over two lands the same bytes: every
 * part at its offset, nothing around it touched. */
TEST(TcpStripe, LandsAsOverOnePath)
{
    std::vector<uint8_t> one, two;
    uint64_t striped_one = 0, striped_two = 0;

    ASSERT_NO_FATAL_FAILURE(write_once(ONE_PATH, 31, &one, &striped_one));
    uint64_t again = 0;
    ASSERT_NO_FATAL_FAILURE(write_once(TWO_PATHS, 31, &two, &striped_two,
                                       nullptr, &again));
    EXPECT_EQ(0u, striped_one) << "one path: nothing to stripe over";
    EXPECT_EQ(1u, striped_two) << "two paths: the WRITE was not striped";
    /* both paths are one session (a JOIN by its key, or both ends proven:
     * each side dialled the other here): the part on the sibling finds
     * the QP's record, nothing is sent again */
    EXPECT_EQ(0u, again) << "parts sent again: the paths' records differ";
    ASSERT_EQ(one.size(), two.size());
    EXPECT_EQ(-1, check_byte(two.data(), PAD, SENTINEL));
    EXPECT_EQ(-1, check_pattern(two.data() + PAD, BIG, 31));
    EXPECT_EQ(-1, check_byte(two.data() + PAD + BIG, PAD, SENTINEL));
    EXPECT_TRUE(one == two) << "the striped WRITE landed otherwise";
}

/* HCA_TCP_STRIPE_MIN=0: two paths, and nothing stripes; a value above
 * the WRITE's size: neither.  The WRITE lands all the same. */
TEST(TcpStripe, SettingTurnsItOff)
{
    std::vector<uint8_t> out;
    uint64_t striped = 0;
    const std::string above = std::to_string(BIG + 1);

    ASSERT_NO_FATAL_FAILURE(write_once(TWO_PATHS, 5, &out, &striped, "0"));
    EXPECT_EQ(0u, striped) << "HCA_TCP_STRIPE_MIN=0 striped";
    EXPECT_EQ(-1, check_pattern(out.data() + PAD, BIG, 5));
    ASSERT_NO_FATAL_FAILURE(write_once(TWO_PATHS, 6, &out, &striped,
                                       above.c_str()));
    EXPECT_EQ(0u, striped) << "a WRITE below HCA_TCP_STRIPE_MIN striped";
    EXPECT_EQ(-1, check_pattern(out.data() + PAD, BIG, 6));
}

/* Order around striped WRITEs, posted at once: WRITE A, WRITE B over the
 * same bytes, a READ of them, a SEND.  They complete in that order, the
 * READ sees B (executed after both WRITEs landed whole), and the SEND
 * arrives.  Both paths carried parts.  Every post is taken at once. */
TEST(TcpStripe, CompletesInOrderWithWhatFollows)
{
    pair_env e;
    ASSERT_TRUE(e.open(TWO_PATHS, nullptr));
    uint8_t *a1   = e.a.alloc(MEM_MALLOC, BIG);
    uint8_t *a2   = e.a.alloc(MEM_MALLOC, BIG);
    uint8_t *back = e.a.alloc(MEM_MALLOC, BIG);
    uint8_t *msg  = e.a.alloc(MEM_MALLOC, 64);
    uint8_t *dst  = e.b.alloc(MEM_MALLOC, BIG);
    uint8_t *rbuf = e.b.alloc(MEM_MALLOC, 64);
    ASSERT_TRUE(a1 && a2 && back && msg && dst && rbuf);
    hca_mr_t *m1 = e.a.reg(e.p.pd1, a1, BIG, ACCESS_ALL);
    hca_mr_t *m2 = e.a.reg(e.p.pd1, a2, BIG, ACCESS_ALL);
    hca_mr_t *mb = e.a.reg(e.p.pd1, back, BIG, ACCESS_ALL);
    hca_mr_t *mm = e.a.reg(e.p.pd1, msg, 64, ACCESS_ALL);
    hca_mr_t *md = e.b.reg(e.p.pd2, dst, BIG, ACCESS_ALL);
    hca_mr_t *mr = e.b.reg(e.p.pd2, rbuf, 64, ACCESS_ALL);
    ASSERT_TRUE(m1 && m2 && mb && mm && md && mr);
    fill_pattern(a1, BIG, 1);
    fill_pattern(a2, BIG, 2);
    fill_pattern(msg, 64, 3);
    memset(back, 0, BIG);
    ASSERT_EQ(0, post_recv1(e.p.q2, rbuf, 64, hca_mr_lkey(mr), 9));

    uint64_t s0 = tcp_counter(e.a.dev, "striped_writes");
    uint64_t b0 = tcp_counter(e.a.dev, "path0_bytes_tx");
    uint64_t b1 = tcp_counter(e.a.dev, "path1_bytes_tx");
    uint64_t raddr = (uint64_t)(uintptr_t)dst;
    hca_sge_t g1 = mk_sge(a1, BIG, hca_mr_lkey(m1));
    hca_sge_t g2 = mk_sge(a2, BIG, hca_mr_lkey(m2));
    hca_sge_t gb = mk_sge(back, BIG, hca_mr_lkey(mb));
    hca_sge_t gm = mk_sge(msg, 64, hca_mr_lkey(mm));
    hca_send_wr_t wrs[4] = {
        mk_wr(HCA_WR_RDMA_WRITE, &g1, 1, HCA_SEND_SIGNALED, 1, raddr,
              hca_mr_rkey(md)),
        mk_wr(HCA_WR_RDMA_WRITE, &g2, 1, HCA_SEND_SIGNALED, 2, raddr,
              hca_mr_rkey(md)),
        mk_wr(HCA_WR_RDMA_READ, &gb, 1, HCA_SEND_SIGNALED, 3, raddr,
              hca_mr_rkey(md)),
        mk_wr(HCA_WR_SEND, &gm, 1, HCA_SEND_SIGNALED, 4, 0, 0)};
    /* taken at once, as a verbs SQ takes them: the ones behind a striped
     * WQE wait in the queue for its answer (they used to be handed back
     * with -EAGAIN) */
    for (auto &wr : wrs) {
        hca_send_wr_t *bad = nullptr;
        ASSERT_EQ(0, hca_post_send(e.p.q1, &wr, &bad)) << "wr " << wr.wr_id;
    }
    std::vector<hca_wc_t> wcs;
    ASSERT_TRUE(wait_wcs(e.p.s1, 4, &wcs));
    for (size_t i = 0; i < wcs.size(); ++i) {
        EXPECT_EQ(i + 1, wcs[i].wr_id) << "completion " << i;
        EXPECT_EQ(HCA_WC_SUCCESS, wcs[i].status) << wc_str(wcs[i]);
    }
    hca_wc_t wc;
    ASSERT_TRUE(wait_ok(e.p.r2, 9, HCA_WC_RECV, &wc));
    EXPECT_EQ(-1, check_pattern(rbuf, 64, 3));
    EXPECT_EQ(-1, check_pattern(dst, BIG, 2)) << "the later WRITE lost";
    EXPECT_EQ(-1, check_pattern(back, BIG, 2))
            << "the READ passed a WRITE before it";
    EXPECT_EQ(2u, tcp_counter(e.a.dev, "striped_writes") - s0);
    /* each WRITE's parts over both paths: at least a part on each */
    EXPECT_GE(tcp_counter(e.a.dev, "path0_bytes_tx") - b0, 2u * 65536);
    EXPECT_GE(tcp_counter(e.a.dev, "path1_bytes_tx") - b1, 2u * 65536);
}

/* A READ of BIG bytes (from an unaligned address, into an unaligned
 * buffer) answered over two paths: the buffer holds exactly the region's
 * bytes, nothing around it touched, and the responder striped it. */
TEST(TcpStripe, ReadAnswerFillsTheBuffer)
{
    pair_env e;
    ASSERT_TRUE(e.open(TWO_PATHS, nullptr));
    const size_t blen = BIG + 2 * PAD;
    uint8_t *back     = e.a.alloc(MEM_MALLOC, blen);
    uint8_t *src      = e.b.alloc(MEM_MALLOC, BIG + PAD);
    ASSERT_TRUE(back && src);
    hca_mr_t *mb = e.a.reg(e.p.pd1, back, blen, ACCESS_ALL);
    hca_mr_t *ms = e.b.reg(e.p.pd2, src, BIG + PAD, ACCESS_ALL);
    ASSERT_TRUE(mb && ms);
    fill_pattern(src + PAD, BIG, 77);
    memset(back, SENTINEL, blen);

    for (int round = 0; round < 3; ++round) {
        uint64_t before  = tcp_counter(e.b.dev, "striped_reads");
        hca_sge_t sg     = mk_sge(back + PAD, BIG, hca_mr_lkey(mb));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_READ, &sg, 1, HCA_SEND_SIGNALED,
                                 (uint64_t)round,
                                 (uint64_t)(uintptr_t)(src + PAD),
                                 hca_mr_rkey(ms));
        ASSERT_TRUE(post_and_wait(e.p.q1, e.p.s1, &wr, HCA_WC_RDMA_READ));
        EXPECT_EQ(-1, check_byte(back, PAD, SENTINEL));
        EXPECT_EQ(-1, check_pattern(back + PAD, BIG, 77)) << "round " << round;
        EXPECT_EQ(-1, check_byte(back + PAD + BIG, PAD, SENTINEL));
        EXPECT_EQ(1u, tcp_counter(e.b.dev, "striped_reads") - before)
                << "round " << round << ": the answer was not striped";
        memset(back + PAD, 0, BIG);
    }
}

/* READs posted at once may each be striped (their answers wait in their
 * records for those before them), and a WRITE after them waits for all of
 * them: the READ of the bytes it overwrites sees the old ones.  Everything
 * completes in order. */
TEST(TcpStripe, ReadsInARowThenAWrite)
{
    const int NR      = 6;
    const size_t LEN  = (1u << 20) + 4096;
    pair_env e;
    ASSERT_TRUE(e.open(TWO_PATHS, nullptr));
    uint8_t *back = e.a.alloc(MEM_MALLOC, LEN * NR);
    uint8_t *nsrc = e.a.alloc(MEM_MALLOC, LEN);
    uint8_t *src  = e.b.alloc(MEM_MALLOC, LEN * NR);
    ASSERT_TRUE(back && nsrc && src);
    hca_mr_t *mb = e.a.reg(e.p.pd1, back, LEN * NR, ACCESS_ALL);
    hca_mr_t *mn = e.a.reg(e.p.pd1, nsrc, LEN, ACCESS_ALL);
    hca_mr_t *ms = e.b.reg(e.p.pd2, src, LEN * NR, ACCESS_ALL);
    ASSERT_TRUE(mb && mn && ms);
    for (int i = 0; i < NR; ++i) {
        fill_pattern(src + i * LEN, LEN, 200 + i);
    }
    fill_pattern(nsrc, LEN, 999);
    memset(back, 0, LEN * NR);

    uint64_t r0 = tcp_counter(e.b.dev, "striped_reads");
    uint64_t t0 = tcp_counter(e.a.dev, "retransmits");
    std::vector<hca_sge_t> sg(NR + 1);
    for (int i = 0; i < NR; ++i) {
        sg[i] = mk_sge(back + i * LEN, LEN, hca_mr_lkey(mb));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_READ, &sg[i], 1,
                                 HCA_SEND_SIGNALED, (uint64_t)i,
                                 (uint64_t)(uintptr_t)(src + i * LEN),
                                 hca_mr_rkey(ms));
        ASSERT_EQ(0, post_retry(e.p.q1, &wr));
    }
    /* over the bytes the first READ read */
    sg[NR] = mk_sge(nsrc, LEN, hca_mr_lkey(mn));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg[NR], 1,
                             HCA_SEND_SIGNALED, (uint64_t)NR,
                             (uint64_t)(uintptr_t)src, hca_mr_rkey(ms));
    ASSERT_EQ(0, post_retry(e.p.q1, &wr));
    std::vector<hca_wc_t> wcs;
    ASSERT_TRUE(wait_wcs(e.p.s1, NR + 1, &wcs));
    for (int i = 0; i <= NR; ++i) {
        EXPECT_EQ((uint64_t)i, wcs[i].wr_id) << "completion " << i;
        EXPECT_EQ(HCA_WC_SUCCESS, wcs[i].status) << wc_str(wcs[i]);
    }
    for (int i = 0; i < NR; ++i) {
        EXPECT_EQ(-1, check_pattern(back + i * LEN, LEN, 200 + i))
                << "READ " << i;
    }
    EXPECT_EQ(-1, check_pattern(src, LEN, 999)) << "the WRITE";
    uint64_t striped = tcp_counter(e.b.dev, "striped_reads") - r0;
    printf("# %llu of %d READs striped\n", (unsigned long long)striped, NR);
    EXPECT_GE(striped, 2u) << "READs in a row were not striped";
    /* an answer that passed a striped READ's parts is no sign of a loss */
    EXPECT_EQ(0u, tcp_counter(e.a.dev, "retransmits") - t0)
            << "a READ was asked again";
}

/* Striped WRITEs and READs under a fault: N WRITEs of distinct patterns
 * into distinct slots, posted at once, then N READs of them back; every
 * one is exact, and the fault happened. */
class TcpStripeFault : public ::testing::TestWithParam<const char*> {
};

TEST_P(TcpStripeFault, WritesLandExact)
{
    const int N      = 24;
    const size_t LEN = (2u << 20) + 4567;
    pair_env e;
    ASSERT_TRUE(e.open(TWO_PATHS, GetParam()));
    uint8_t *src  = e.a.alloc(MEM_MALLOC, LEN * N);
    uint8_t *back = e.a.alloc(MEM_MALLOC, LEN * N);
    uint8_t *dst  = e.b.alloc(MEM_MALLOC, LEN * N);
    ASSERT_TRUE(src && back && dst);
    hca_mr_t *smr = e.a.reg(e.p.pd1, src, LEN * N, ACCESS_ALL);
    hca_mr_t *bmr = e.a.reg(e.p.pd1, back, LEN * N, ACCESS_ALL);
    hca_mr_t *dmr = e.b.reg(e.p.pd2, dst, LEN * N, ACCESS_ALL);
    ASSERT_TRUE(smr && bmr && dmr);
    memset(back, 0, LEN * N);
    for (int i = 0; i < N; ++i) {
        fill_pattern(src + i * LEN, LEN, 100 + i);
    }
    memset(dst, SENTINEL, LEN * N);

    /* a WRITE stripes when its QP has nothing unanswered: the first goes
     * alone, the rest at once (each waits for the striped one before it:
     * hca_tcp_stripe.c), as long as no fault sends the QP to another
     * path meanwhile */
    std::vector<hca_sge_t> sg(N);
    std::vector<hca_wc_t> wcs;
    for (int i = 0; i < N; ++i) {
        sg[i] = mk_sge(src + i * LEN, LEN, hca_mr_lkey(smr));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg[i], 1,
                                 HCA_SEND_SIGNALED, (uint64_t)i,
                                 (uint64_t)(uintptr_t)(dst + i * LEN),
                                 hca_mr_rkey(dmr));
        ASSERT_EQ(0, post_retry(e.p.q1, &wr));
        if (i == 0) {
            ASSERT_TRUE(wait_wcs(e.p.s1, 1, &wcs, 60000));
        }
    }
    std::vector<hca_wc_t> more;
    ASSERT_TRUE(wait_wcs(e.p.s1, N - 1, &more, 60000));
    wcs.insert(wcs.end(), more.begin(), more.end());
    for (int i = 0; i < N; ++i) {
        EXPECT_EQ((uint64_t)i, wcs[i].wr_id);
        EXPECT_EQ(HCA_WC_SUCCESS, wcs[i].status) << wc_str(wcs[i]);
        EXPECT_EQ(-1, check_pattern(dst + i * LEN, LEN, 100 + i))
                << "WRITE " << i;
    }
    std::vector<hca_sge_t> bg(N);
    for (int i = 0; i < N; ++i) {
        bg[i] = mk_sge(back + i * LEN, LEN, hca_mr_lkey(bmr));
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_READ, &bg[i], 1,
                                 HCA_SEND_SIGNALED, (uint64_t)(N + i),
                                 (uint64_t)(uintptr_t)(dst + i * LEN),
                                 hca_mr_rkey(dmr));
        ASSERT_EQ(0, post_retry(e.p.q1, &wr));
    }
    wcs.clear();
    ASSERT_TRUE(wait_wcs(e.p.s1, N, &wcs, 60000));
    for (int i = 0; i < N; ++i) {
        EXPECT_EQ((uint64_t)(N + i), wcs[i].wr_id);
        EXPECT_EQ(HCA_WC_SUCCESS, wcs[i].status) << wc_str(wcs[i]);
        EXPECT_EQ(-1, check_pattern(back + i * LEN, LEN, 100 + i))
                << "READ " << i;
    }
    uint64_t faults = tcp_counter(e.a.dev, "faults_injected") +
                      tcp_counter(e.b.dev, "faults_injected");
    printf("# %s: %llu WRITEs and %llu READs striped, %llu faults, %llu "
           "retransmits, %llu dup_requests\n", GetParam(),
           (unsigned long long)tcp_counter(e.a.dev, "striped_writes"),
           (unsigned long long)tcp_counter(e.b.dev, "striped_reads"),
           (unsigned long long)faults,
           (unsigned long long)tcp_counter(e.a.dev, "retransmits"),
           (unsigned long long)tcp_counter(e.b.dev, "dup_requests"));
    EXPECT_GT(tcp_counter(e.a.dev, "striped_writes"), 0u);
    EXPECT_GT(faults, 0u) << "the fault was never injected";
}

INSTANTIATE_TEST_SUITE_P(Faults, TcpStripeFault,
                         ::testing::Values("tcp_loss=0.01", "tcp_dup=0.02",
                                           "tcp_reset=0.002"),
                         [](const ::testing::TestParamInfo<const char*> &i) {
                             std::string s = i.param;
                             return s.substr(4, s.find('=') - 4);
                         });

} // namespace
} // namespace hcat
