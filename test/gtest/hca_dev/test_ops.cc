/*
 * test_ops.cc - every opcode between a requester and a target that is
 * either on another device context of this process (SameProcess) or in a
 * forked process (OtherProcess), on every fabric of test_fabrics(): sizes
 * x opcodes, aligned and unaligned, malloc'd and device memory, with and
 * without single copy (CMA); atomics; MPT checks; SEND ordering under
 * load; FENCE; completion means placement; scatter/gather.  Tests that need
 * both ends in this process (two contexts of one process, one context
 * talking to itself) run for SameProcess only; those that need the other
 * process itself (it sleeps, dies, forks, deregisters...) are in
 * test_procs.cc.
 *
 * Every suite here is a seam_test (test_common.h): its parameter is
 * (fabric x target kind, what the suite varies), named
 * <Fabric>_<TargetKind>_<rest>, e.g.
 * Ops/DataOps.Transfer/Shm_OtherProcess_send_4096_aligned_malloc_sc.
 */
#include "test_common.h"

#include <atomic>
#include <thread>
#include <tuple>

using namespace hcat;

static const hca_wr_opcode_t data_ops[] = {
    HCA_WR_SEND, HCA_WR_SEND_WITH_IMM, HCA_WR_RDMA_WRITE,
    HCA_WR_RDMA_WRITE_WITH_IMM, HCA_WR_RDMA_READ};

static const size_t data_sizes[] = {0,    1,     7,         8,
                                    63,   64,    4095,      4096,
                                    65537, 1 << 20, SIZE_MAX_MSG};

/* Against another process, every transfer forks a target: fewer sizes. */
static const size_t proc_sizes[] = {0, 1, 4096, 65537, 1 << 20,
                                    SIZE_MAX_MSG};

static const hca_wr_opcode_t atomic_ops[] = {
    HCA_WR_ATOMIC_FETCH_ADD, HCA_WR_ATOMIC_CMP_SWP,   HCA_WR_ATOMIC_SWAP,
    HCA_WR_ATOMIC_FETCH_AND, HCA_WR_ATOMIC_FETCH_OR,  HCA_WR_ATOMIC_FETCH_XOR,
    HCA_WR_ATOMIC_ADD,       HCA_WR_ATOMIC_AND,       HCA_WR_ATOMIC_OR,
    HCA_WR_ATOMIC_XOR};

static const unsigned open_flags[] = {0u, (unsigned)HCA_OPEN_NO_SINGLE_COPY};

static const mem_kind_t mem_kinds[] = {MEM_MALLOC, MEM_DM};

static const char *flags_name(unsigned f)
{
    return (f & HCA_OPEN_NO_SINGLE_COPY) ? "nsc" : "sc";
}

/* ------------------------------------------------------------ data ops */

/* opcode, size, unaligned (local +1, remote +3), memory, open flags */
typedef std::tuple<hca_wr_opcode_t, size_t, bool, mem_kind_t, unsigned>
        data_param;

class DataOps : public seam_test<data_param> {
};

TEST_P(DataOps, Transfer)
{
    hca_wr_opcode_t op = std::get<0>(param());
    size_t size        = std::get<1>(param());
    bool unaligned     = std::get<2>(param());
    mem_kind_t kind    = std::get<3>(param());
    ASSERT_TRUE(open_pair(std::get<4>(param())));
    size = resolve_size(size, c.attr);
    /* (the pattern seeds each kind had before the seam) */
    run_data_op(c, t(), op, size, unaligned ? 1 : 0, unaligned ? 3 : 0, kind,
                size + op + ((where() == OTHER_PROCESS) ? 100 : 0));
}

static std::vector<DataOps::param_type> data_params()
{
    std::vector<DataOps::param_type> v;
    for (const seam_t &s : seams()) {
        std::vector<size_t> sizes;
        if (s.where == SAME_PROCESS) {
            sizes.assign(std::begin(data_sizes), std::end(data_sizes));
        } else {
            sizes.assign(std::begin(proc_sizes), std::end(proc_sizes));
        }
        for (hca_wr_opcode_t op : data_ops) {
            for (size_t size : sizes) {
                for (bool unaligned : {false, true}) {
                    for (mem_kind_t k : mem_kinds) {
                        for (unsigned f : open_flags) {
                            v.emplace_back(s, data_param(op, size, unaligned,
                                                         k, f));
                        }
                    }
                }
            }
        }
    }
    return v;
}

static std::string
data_param_name(const ::testing::TestParamInfo<DataOps::param_type> &i)
{
    const data_param &p = std::get<1>(i.param);
    return seam_param_name(i.param,
                           std::string(op_short_name(std::get<0>(p))) + "_" +
                                   size_name(std::get<1>(p)) + "_" +
                                   (std::get<2>(p) ? "unaligned" : "aligned") +
                                   "_" + mem_kind_name(std::get<3>(p)) + "_" +
                                   flags_name(std::get<4>(p)));
}

INSTANTIATE_TEST_SUITE_P(Ops, DataOps, ::testing::ValuesIn(data_params()),
                         data_param_name);

/* 0-byte operations without any SGE */
class ZeroSge : public seam_test<hca_wr_opcode_t> {
};

TEST_P(ZeroSge, Transfer)
{
    hca_wr_opcode_t op = param();
    ASSERT_TRUE(open_pair(0));
    target &t = this->t();
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    uint64_t ra = 0;
    int rb = t.buf(MEM_MALLOC, 64, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    int rmr = t.mr(cn.tpd, rb, 0, 64, ACCESS_ALL, &rkey);
    ASSERT_GE(rmr, 0);
    ASSERT_EQ(0, t.fill(rb, 0, 64, BYTE(SENTINEL)));
    bool two_sided = (op == HCA_WR_SEND) || (op == HCA_WR_SEND_WITH_IMM) ||
                     (op == HCA_WR_RDMA_WRITE_WITH_IMM);
    if (two_sided) {
        ASSERT_EQ(0, t.post_recv(cn.tqp, rmr, rb, 0, 64, 3, 1, 0));
    }
    hca_send_wr_t wr = mk_wr(op, nullptr, 0, HCA_SEND_SIGNALED, 4, ra, rkey);
    wr.imm_data      = IMM_VALUE;
    ASSERT_EQ(0, post_retry(cn.qp, &wr));
    if (two_sided) {
        std::vector<hca_wc_t> w;
        ASSERT_EQ(1, t.poll_recv(cn.tqp, 1, &w, TIMEOUT_MS));
        EXPECT_EQ(HCA_WC_SUCCESS, w[0].status) << wc_str(w[0]);
        EXPECT_EQ(0u, w[0].byte_len);
        if (op != HCA_WR_SEND) {
            EXPECT_EQ(IMM_VALUE, w[0].imm_data);
        }
    }
    ASSERT_TRUE(wait_ok(cn.scq, 4, wc_opcode_of(op)));
    EXPECT_EQ(-1, t.check(rb, 0, 64, BYTE(SENTINEL)));
}

INSTANTIATE_TEST_SUITE_P(
        Ops, ZeroSge,
        ::testing::Combine(::testing::ValuesIn(seams()),
                           ::testing::ValuesIn(data_ops)),
        [](const ::testing::TestParamInfo<ZeroSge::param_type> &i) {
            return seam_param_name(i.param,
                                   op_short_name(std::get<1>(i.param)));
        });

/* ------------------------------------------------------------ counters */

/* The counters by fabric split the same WRs as tx_ops, under the fabric
 * that carried them (hca-run --verbose shows which ranks were on other
 * hosts by them). */
class FabricCounters : public seam_test<no_param> {
};

TEST_P(FabricCounters, CountUnderTheFabricThatCarried)
{
    ASSERT_TRUE(open_pair(0));
    target &t = this->t();
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    uint8_t *lb = c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, lb);
    hca_mr_t *mr = c.reg(cn.pd, lb, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    uint64_t ra = 0;
    int rb = t.buf(MEM_MALLOC, 4096, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    ASSERT_GE(t.mr(cn.tpd, rb, 0, 4096, ACCESS_ALL, &rkey), 0);
    const hca_wr_opcode_t ops[] = {HCA_WR_RDMA_WRITE, HCA_WR_RDMA_WRITE,
                                   HCA_WR_RDMA_READ};
    for (unsigned i = 0; i < 3; ++i) {
        hca_sge_t s      = mk_sge(lb, 100 + i, hca_mr_lkey(mr));
        hca_send_wr_t wr = mk_wr(ops[i], &s, 1, HCA_SEND_SIGNALED, i, ra,
                                 rkey);
        ASSERT_EQ(0, post_retry(cn.qp, &wr));
        ASSERT_TRUE(wait_ok(cn.scq, i, wc_opcode_of(ops[i])));
    }
    hca_counters_t q;
    ASSERT_EQ(0, hca_qp_counters(cn.qp, &q));
    const unsigned f     = fabric();
    const unsigned other = (f == HCA_FABRIC_SHM) ? HCA_FABRIC_TCP :
                                                   HCA_FABRIC_SHM;
    EXPECT_EQ(2u, q.fabric_tx_ops[f][HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(201u, q.fabric_tx_bytes[f][HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(1u, q.fabric_tx_ops[f][HCA_WR_RDMA_READ]);
    EXPECT_EQ(102u, q.fabric_tx_bytes[f][HCA_WR_RDMA_READ]);
    for (int op = 0; op < HCA_WR_OPCODE_LAST; ++op) {
        EXPECT_EQ(q.tx_ops[op], q.fabric_tx_ops[f][op])
                << hca_wr_opcode_str((hca_wr_opcode_t)op);
        EXPECT_EQ(q.tx_bytes[op], q.fabric_tx_bytes[f][op])
                << hca_wr_opcode_str((hca_wr_opcode_t)op);
        EXPECT_EQ(0u, q.fabric_tx_ops[other][op])
                << hca_wr_opcode_str((hca_wr_opcode_t)op);
    }
    EXPECT_STREQ((f == HCA_FABRIC_SHM) ? "shm" : "tcp",
                 hca_fabric_type_str((hca_fabric_type_t)f));
}

INSTANTIATE_TEST_SUITE_P(
        Ops, FabricCounters,
        ::testing::Combine(::testing::ValuesIn(seams()),
                           ::testing::Values(no_param())),
        [](const ::testing::TestParamInfo<FabricCounters::param_type> &i) {
            return seam_param_name(i.param, "");
        });

/* ------------------------------------------------------------ fast paths */

/* The fast paths (hca_qp_fast_ops: what the UCT caches per endpoint) on
 * the fabric axis.  On shm each applies: executed inside the call, the
 * data where it belongs.  On tcp none does, and each says so in its own
 * words (caps 0; -EBUSY, -EAGAIN or NULL: "post a WR"), and the same
 * operation posted as a WR is carried.  The shm paths themselves are
 * tested in depth by test_direct.cc and test_inplace.cc (shm only: the
 * tcp fabric reaches no peer memory). */
class FastPaths : public seam_test<no_param> {
};

/* The requester counts in the process and publishes every
 * HCA_COUNTERS_PUBLISH_OPS operations (hca_tally.c): the process's own
 * readers see every operation, by opcode, by fabric and as mapped (shm's
 * direct write), while a reader thread polls the device's counters (never
 * going back, never ahead: a publication racing a read must not count
 * twice); another process's view (hca_host_counters reads the shared
 * objects) is less than HCA_COUNTERS_PUBLISH_OPS behind, and exact once
 * the QP is destroyed. */
TEST_P(FastPaths, CountsAreExactInProcessAndPublished)
{
    ASSERT_TRUE(open_pair(0));
    target &t = this->t();
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    const bool shm = (fabric() == HCA_FABRIC_SHM);
    const uint64_t n = shm ? 5000 : 1000, len = 8;
    uint64_t ra = 0;
    int rb = t.buf(MEM_DM, 4096, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    ASSERT_GE(t.mr(cn.tpd, rb, 0, 4096, ACCESS_ALL, &rkey), 0);
    uint8_t *lb = c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, lb);
    hca_mr_t *mr = c.reg(cn.pd, lb, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    const hca_fast_ops_t *f = hca_qp_fast_ops(cn.qp);
    ASSERT_NE(nullptr, f);

    hca_counters_t d0, h0;
    ASSERT_EQ(0, hca_device_counters(c.dev, &d0));
    ASSERT_EQ(0, hca_host_counters(dev_name().c_str(), &h0));
    const uint64_t w0 = d0.tx_ops[HCA_WR_RDMA_WRITE];

    std::atomic<bool> stop{false};
    std::atomic<uint64_t> reads{0}, back{0}, ahead{0};
    std::atomic<uint64_t> done{0};
    std::thread reader([&] {
        uint64_t last = w0;
        while (!stop.load()) {
            hca_counters_t x;
            if (hca_device_counters(c.dev, &x) != 0) {
                break;
            }
            const uint64_t w = x.tx_ops[HCA_WR_RDMA_WRITE];
            back  += (w < last);
            ahead += (w > w0 + done.load() + 1);
            last   = w;
            ++reads;
        }
    });
    for (uint64_t i = 0; i < n; ++i) {
        if (shm) {
            ASSERT_EQ(0, f->write_direct(cn.qp, lb, len, ra, rkey))
                    << "write " << i;
        } else {
            hca_sge_t sg     = mk_sge(lb, len, hca_mr_lkey(mr));
            hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1,
                                     HCA_SEND_SIGNALED, i, ra, rkey);
            ASSERT_TRUE(post_and_wait(cn.qp, cn.scq, &wr, HCA_WC_RDMA_WRITE))
                    << "write " << i;
        }
        done.store(i + 1);
        if ((i % 500) == 499) {
            /* let the reader in (2 cores, a tight loop of writes) */
            const uint64_t r = reads.load(), end = now_ms() + TIMEOUT_MS;
            while ((reads.load() == r) && (now_ms() < end)) {
                sched_yield();
            }
        }
    }
    stop = true;
    reader.join();
    EXPECT_GT(reads.load(), 0u);
    EXPECT_EQ(0u, back.load()) << "a device count went back";
    EXPECT_EQ(0u, ahead.load()) << "a device count ran ahead of the writes";

    hca_counters_t q;
    ASSERT_EQ(0, hca_qp_counters(cn.qp, &q));
    EXPECT_EQ(n, q.tx_ops[HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(n * len, q.tx_bytes[HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(n, q.fabric_tx_ops[fabric()][HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(n * len, q.fabric_tx_bytes[fabric()][HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(shm ? n : 0u, q.mapped_ops) << "shm writes device memory "
                                             "straight; tcp never maps";

    /* what another process sees of this live QP */
    hca_counters_t h1;
    ASSERT_EQ(0, hca_host_counters(dev_name().c_str(), &h1));
    const uint64_t seen = h1.tx_ops[HCA_WR_RDMA_WRITE] -
                          h0.tx_ops[HCA_WR_RDMA_WRITE];
    EXPECT_GE(seen + HCA_COUNTERS_PUBLISH_OPS - 1, n)
            << "the shared counters lag by " << (n - seen);

    /* destroyed: every operation published and retired */
    ASSERT_EQ(0, c.destroy_qp(cn.qp));
    hca_counters_t d1, h2;
    ASSERT_EQ(0, hca_device_counters(c.dev, &d1));
    EXPECT_EQ(w0 + n, d1.tx_ops[HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(d0.fabric_tx_ops[fabric()][HCA_WR_RDMA_WRITE] + n,
              d1.fabric_tx_ops[fabric()][HCA_WR_RDMA_WRITE]);
    ASSERT_EQ(0, hca_host_counters(dev_name().c_str(), &h2));
    EXPECT_GE(h2.tx_ops[HCA_WR_RDMA_WRITE], h0.tx_ops[HCA_WR_RDMA_WRITE] + n)
            << "a closed QP's counts are all kept";
}

TEST_P(FastPaths, ApplyOnShmSayNotOnTcp)
{
    ASSERT_TRUE(open_pair(0));
    target &t = this->t();
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    const bool shm = (fabric() == HCA_FABRIC_SHM);
    /* device memory at the target: what write_direct, direct_ptr and
     * atomic_direct serve on shm */
    uint64_t ra = 0;
    int rb = t.buf(MEM_DM, 4096, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    int rmr = t.mr(cn.tpd, rb, 0, 4096, ACCESS_ALL, &rkey);
    ASSERT_GE(rmr, 0);
    ASSERT_EQ(0, t.fill(rb, 0, 4096, BYTE(0)));
    uint8_t *lb = c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, lb);
    hca_mr_t *mr = c.reg(cn.pd, lb, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    const uint32_t lkey = hca_mr_lkey(mr);

    const hca_fast_ops_t *f = hca_qp_fast_ops(cn.qp);
    ASSERT_NE(nullptr, f);
    EXPECT_EQ(shm ? (unsigned)(HCA_FAST_SEND | HCA_FAST_WRITE | HCA_FAST_PTR |
                               HCA_FAST_ATOMIC)
                  : 0u,
              f->caps);

    /* RDMA WRITE of 256 bytes at offset 0 */
    fill_pattern(lb, 256, 11);
    int rc = f->write_direct(cn.qp, lb, 256, ra, rkey);
    if (shm) {
        EXPECT_EQ(0, rc);
    } else {
        EXPECT_EQ(-EAGAIN, rc) << "tcp: no direct write";
        hca_sge_t sg     = mk_sge(lb, 256, lkey);
        hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1,
                                 HCA_SEND_SIGNALED, 1, ra, rkey);
        ASSERT_TRUE(post_and_wait(cn.qp, cn.scq, &wr, HCA_WC_RDMA_WRITE));
    }
    EXPECT_EQ(-1, t.check(rb, 0, 256, PAT(11)));

    /* a pointer to write 64 bytes at offset 512 through */
    void *p = f->direct_ptr(cn.qp, ra + 512, rkey, 64,
                            HCA_ACCESS_REMOTE_WRITE);
    if (shm) {
        ASSERT_NE(nullptr, p);
        fill_pattern(p, 64, 12);
        f->direct_done(cn.qp);
        EXPECT_EQ(-1, t.check(rb, 512, 64, PAT(12)));
    } else {
        EXPECT_EQ(nullptr, p) << "tcp: no pointer to peer memory";
    }

    /* fetch-and-add 5 on the 8 bytes at offset 1024 (0 before) */
    uint64_t *res = reinterpret_cast<uint64_t*>(lb + 2048);
    *res = ~0ull;
    rc   = f->atomic_direct(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8, ra + 1024,
                            rkey, 5, 0, res);
    if (shm) {
        EXPECT_EQ(0, rc);
    } else {
        EXPECT_EQ(-EAGAIN, rc) << "tcp: no direct atomic";
        EXPECT_EQ(~0ull, *res) << "a refused atomic stores no result";
        hca_sge_t sg     = mk_sge(res, 8, lkey);
        hca_send_wr_t wr = mk_wr(HCA_WR_ATOMIC_FETCH_ADD, &sg, 1,
                                 HCA_SEND_SIGNALED, 2, ra + 1024, rkey);
        wr.compare_add   = 5;
        ASSERT_TRUE(post_and_wait(cn.qp, cn.scq, &wr, HCA_WC_ATOMIC));
    }
    EXPECT_EQ(0u, *res) << "the old value";
    uint64_t now = 0;
    ASSERT_EQ(0, t.read(rb, 1024, &now, 8));
    EXPECT_EQ(5u, now);

    /* a SEND with immediate data of 8 + 24 bytes into a posted receive
     * (the target's buffer at offset 3072) */
    ASSERT_EQ(0, t.post_recv(cn.tqp, rmr, rb, 3072, 64, 77));
    uint64_t hdr = 0x1122334455667788ull;
    fill_pattern(lb + 256, 24, 13);
    rc = f->send_short(cn.qp, &hdr, 8, lb + 256, 24, HCA_WR_SEND_WITH_IMM,
                       99);
    if (shm) {
        EXPECT_EQ(0, rc);
    } else {
        EXPECT_EQ(-EBUSY, rc) << "tcp: no send into the peer's ring";
        hca_send_slot_t sl;
        memset(&sl, 0, sizeof(sl));
        EXPECT_EQ(-EBUSY, f->send_reserve(cn.qp, 32, &sl));
        memcpy(lb + 512, &hdr, 8);
        memcpy(lb + 520, lb + 256, 24);
        hca_sge_t sg     = mk_sge(lb + 512, 32, lkey);
        hca_send_wr_t wr = mk_wr(HCA_WR_SEND_WITH_IMM, &sg, 1,
                                 HCA_SEND_SIGNALED, 3);
        wr.imm_data      = 99;
        ASSERT_TRUE(post_and_wait(cn.qp, cn.scq, &wr, HCA_WC_SEND));
    }
    std::vector<hca_wc_t> wcs;
    ASSERT_EQ(1, t.poll_recv(cn.tqp, 1, &wcs, TIMEOUT_MS));
    EXPECT_EQ(HCA_WC_SUCCESS, wcs[0].status);
    EXPECT_EQ(77u, wcs[0].wr_id);
    EXPECT_EQ(32u, wcs[0].byte_len);
    EXPECT_EQ(99u, wcs[0].imm_data);
    uint64_t got = 0;
    ASSERT_EQ(0, t.read(rb, 3072, &got, 8));
    EXPECT_EQ(hdr, got);
    EXPECT_EQ(-1, t.check(rb, 3080, 24, PAT(13)));
}

INSTANTIATE_TEST_SUITE_P(
        Ops, FastPaths,
        ::testing::Combine(::testing::ValuesIn(seams()),
                           ::testing::Values(no_param())),
        [](const ::testing::TestParamInfo<FastPaths::param_type> &i) {
            return seam_param_name(i.param, "");
        });

/* ------------------------------------------------------------ atomics */

/* opcode, 32-bit, memory, open flags */
typedef std::tuple<hca_wr_opcode_t, bool, mem_kind_t, unsigned> atomic_param;

class AtomicOps : public seam_test<atomic_param> {
};

TEST_P(AtomicOps, Execute)
{
    ASSERT_TRUE(open_pair(std::get<3>(param())));
    run_atomic(c, t(), std::get<0>(param()), std::get<1>(param()),
               std::get<2>(param()));
}

INSTANTIATE_TEST_SUITE_P(
        Ops, AtomicOps,
        ::testing::Combine(
                ::testing::ValuesIn(seams()),
                ::testing::Combine(::testing::ValuesIn(atomic_ops),
                                   ::testing::Bool(),
                                   ::testing::ValuesIn(mem_kinds),
                                   ::testing::ValuesIn(open_flags))),
        [](const ::testing::TestParamInfo<AtomicOps::param_type> &i) {
            const atomic_param &p = std::get<1>(i.param);
            return seam_param_name(
                    i.param, std::string(op_short_name(std::get<0>(p))) +
                                     "_" + (std::get<1>(p) ? "32" : "64") +
                                     "_" + mem_kind_name(std::get<2>(p)) +
                                     "_" + flags_name(std::get<3>(p)));
        });

/* ------------------------------------------------------------ MPT */

/* The MPT checks of an MR of the target (open flags 0). */
class Mpt : public seam_test<mpt_param> {
};

TEST_P(Mpt, Check)
{
    const mpt_param &p = param();
    ASSERT_TRUE(open_pair(0));
    run_mpt_check(c, t(), p.cs, p.op, p.kind);
}

static std::string
mpt_seam_name(const ::testing::TestParamInfo<std::tuple<seam_t, mpt_param>> &i)
{
    const mpt_param &p = std::get<1>(i.param);
    return seam_param_name(i.param, std::string(mpt_case_name(p.cs)) + "_" +
                                            mpt_op_name(p.op) + "_" +
                                            mem_kind_name(p.kind));
}

INSTANTIATE_TEST_SUITE_P(Ops, Mpt,
                         ::testing::Combine(::testing::ValuesIn(seams()),
                                            ::testing::ValuesIn(mpt_params())),
                         mpt_seam_name);

/* The MPT checks again, with the data path through the rings (no CMA). */
class MptNsc : public seam_test<mpt_param> {
};

TEST_P(MptNsc, Check)
{
    const mpt_param &p = param();
    ASSERT_TRUE(open_pair(HCA_OPEN_NO_SINGLE_COPY));
    run_mpt_check(c, t(), p.cs, p.op, p.kind);
}

static std::vector<mpt_param> mpt_nsc_params()
{
    /* the remote-side checks of the data ops (the local checks and the
     * atomics do not depend on the copy path) */
    std::vector<mpt_param> v;
    for (const mpt_param &p : mpt_params()) {
        if (((p.op == MOP_WRITE) || (p.op == MOP_READ)) &&
            (p.cs != MPT_BAD_LKEY) && (p.cs != MPT_LOCAL_RANGE) &&
            (p.cs != MPT_LOCAL_NO_WRITE)) {
            v.push_back(p);
        }
    }
    return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, MptNsc,
                         ::testing::Combine(::testing::ValuesIn(seams()),
                                            ::testing::ValuesIn(
                                                    mpt_nsc_params())),
                         mpt_seam_name);

/* ------------------------------------------------------------ semantics */

typedef std::tuple<mem_kind_t, unsigned> mode_param;

class OpsMode : public seam_test<mode_param> {
protected:
    void SetUp() override
    {
        seam_test<mode_param>::SetUp();
        ASSERT_TRUE(open_pair(std::get<1>(param())));
    }
};

TEST_P(OpsMode, Fence)
{
    run_fence(c, t(), std::get<0>(param()));
}

/* Right after the completion of a WRITE, the target's memory (read by the
 * target itself: in another process, after a pipe message) holds the
 * data. */
TEST_P(OpsMode, CompletionMeansPlacement)
{
    run_placement(c, t(), std::get<0>(param()));
}

INSTANTIATE_TEST_SUITE_P(
        Ops, OpsMode,
        ::testing::Combine(
                ::testing::ValuesIn(seams()),
                ::testing::Combine(::testing::ValuesIn(mem_kinds),
                                   ::testing::ValuesIn(open_flags))),
        [](const ::testing::TestParamInfo<OpsMode::param_type> &i) {
            const mode_param &p = std::get<1>(i.param);
            return seam_param_name(i.param,
                                   std::string(mem_kind_name(std::get<0>(p))) +
                                           "_" + flags_name(std::get<1>(p)));
        });

static std::string
flags_seam_name(const ::testing::TestParamInfo<std::tuple<seam_t, unsigned>> &i)
{
    return seam_param_name(i.param, flags_name(std::get<1>(i.param)));
}

class OpsFlags : public seam_test<unsigned> {
};

/* 10000 SENDs of varying sizes (some larger than a ring slot) arrive in
 * post order, exactly once. */
TEST_P(OpsFlags, SendOrdering)
{
    ASSERT_TRUE(open_pair(param()));
    run_ordering(c, t(), 10000);
}

/* Gather on send, scatter on receive and on READ. */
TEST_P(OpsFlags, ScatterGather)
{
    ASSERT_TRUE(open_pair(param()));
    target &t = this->t();
    if (c.attr.max_sge < 3) {
        GTEST_SKIP() << "max_sge " << c.attr.max_sge;
    }
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    const size_t N = 3 * 5000 + 7;
    uint8_t *lb    = c.alloc(MEM_MALLOC, 2 * N + 256);
    ASSERT_NE(nullptr, lb);
    hca_mr_t *lmr = c.reg(cn.pd, lb, 2 * N + 256, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);
    uint64_t ra = 0;
    int rb = t.buf(MEM_MALLOC, N + 64, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    int rmr = t.mr(cn.tpd, rb, 0, N + 64, ACCESS_ALL, &rkey);
    ASSERT_GE(rmr, 0);

    /* the message: pattern(11) over N bytes, gathered from 3 pieces that
     * are not contiguous locally */
    const size_t p0 = 5000, p1 = 7, p2 = N - p0 - p1;
    uint8_t *m = lb + N + 128;   /* the message, contiguous, for reference */
    fill_pattern(m, N, 11);
    memcpy(lb, m, p0);
    memcpy(lb + p0 + 32, m + p0, p1);
    memcpy(lb + p0 + 64 + p1, m + p0 + p1, p2);
    hca_sge_t g[3] = {mk_sge(lb, p0, hca_mr_lkey(lmr)),
                      mk_sge(lb + p0 + 32, p1, hca_mr_lkey(lmr)),
                      mk_sge(lb + p0 + 64 + p1, p2, hca_mr_lkey(lmr))};

    /* gather WRITE */
    ASSERT_EQ(0, t.fill(rb, 0, N + 64, BYTE(SENTINEL)));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, g, 3, HCA_SEND_SIGNALED, 1, ra,
                             rkey);
    ASSERT_TRUE(post_and_wait(cn.qp, cn.scq, &wr, HCA_WC_RDMA_WRITE));
    EXPECT_EQ(-1, t.check(rb, 0, N, PAT(11)));
    EXPECT_EQ(-1, t.check(rb, N, 64, BYTE(SENTINEL)));

    /* gather SEND into a single receive */
    ASSERT_EQ(0, t.fill(rb, 0, N + 64, BYTE(SENTINEL)));
    ASSERT_EQ(0, t.post_recv(cn.tqp, rmr, rb, 0, N + 64, 2, 1, 0));
    wr = mk_wr(HCA_WR_SEND, g, 3, HCA_SEND_SIGNALED, 2);
    ASSERT_EQ(0, post_retry(cn.qp, &wr));
    std::vector<hca_wc_t> w;
    ASSERT_EQ(1, t.poll_recv(cn.tqp, 1, &w, TIMEOUT_MS));
    EXPECT_EQ(HCA_WC_SUCCESS, w[0].status);
    EXPECT_EQ(N, w[0].byte_len);
    ASSERT_TRUE(wait_ok(cn.scq, 2, HCA_WC_SEND));
    EXPECT_EQ(-1, t.check(rb, 0, N, PAT(11)));
    EXPECT_EQ(-1, t.check(rb, N, 64, BYTE(SENTINEL)));

    /* scatter READ: into 3 local pieces */
    memset(lb, LSENTINEL, N + 128);
    wr = mk_wr(HCA_WR_RDMA_READ, g, 3, HCA_SEND_SIGNALED, 3, ra, rkey);
    ASSERT_TRUE(post_and_wait(cn.qp, cn.scq, &wr, HCA_WC_RDMA_READ));
    EXPECT_EQ(0, memcmp(lb, m, p0));
    EXPECT_EQ(0, memcmp(lb + p0 + 32, m + p0, p1));
    EXPECT_EQ(0, memcmp(lb + p0 + 64 + p1, m + p0 + p1, p2));
    EXPECT_EQ(-1, check_byte(lb + p0, 32, LSENTINEL)) << "gap written";
    EXPECT_EQ(-1, check_byte(lb + p0 + 32 + p1, 32, LSENTINEL))
            << "gap written";
    EXPECT_EQ(-1, check_byte(lb + N + 64, 64, LSENTINEL))
            << "wrote past the last piece";
}

INSTANTIATE_TEST_SUITE_P(
        Ops, OpsFlags,
        ::testing::Combine(::testing::ValuesIn(seams()),
                           ::testing::ValuesIn(open_flags)),
        flags_seam_name);

class OpsPlain : public seam_test<no_param> {
};

/* Many WRs in one chain, mixing opcodes: completions in post order. */
TEST_P(OpsPlain, MixedChain)
{
    ASSERT_TRUE(open_pair(0));
    target &t = this->t();
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    const size_t N = 4096;
    uint8_t *lb    = c.alloc(MEM_MALLOC, 64 * N);
    hca_mr_t *lmr  = c.reg(cn.pd, lb, 64 * N, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);
    uint64_t ra = 0;
    int rb = t.buf(MEM_MALLOC, 64 * N, &ra);
    uint32_t rkey = 0;
    int rmr = t.mr(cn.tpd, rb, 0, 64 * N, ACCESS_ALL, &rkey);
    ASSERT_GE(rmr, 0);
    ASSERT_EQ(0, t.post_recv(cn.tqp, rmr, rb, 48 * N, N / 16, 100, 16,
                             N / 16));
    const int K = 48;
    std::vector<hca_sge_t> sg(K);
    std::vector<hca_send_wr_t> wr(K);
    int nsend = 0;
    for (int i = 0; i < K; ++i) {
        hca_wr_opcode_t op;
        switch (i % 4) {
        case 0:
            op = HCA_WR_RDMA_WRITE;
            break;
        case 1:
            op = HCA_WR_RDMA_READ;
            break;
        case 2:
            op = HCA_WR_SEND;
            break;
        default:
            op = HCA_WR_RDMA_WRITE;
            break;
        }
        size_t L = (op == HCA_WR_SEND) ? N / 16 : N;
        if (op == HCA_WR_SEND) {
            ++nsend;
        }
        fill_pattern(lb + i * N, L, 300 + i);
        sg[i] = mk_sge(lb + i * N, L, hca_mr_lkey(lmr));
        wr[i] = mk_wr(op, &sg[i], 1, HCA_SEND_SIGNALED, i, ra + i * N, rkey);
        wr[i].next = (i + 1 < K) ? &wr[i + 1] : nullptr;
    }
    ASSERT_LE(nsend, 16);
    ASSERT_EQ(0, t.fill(rb, 0, 48 * N, BYTE(SENTINEL)));
    for (int i = 0; i < K; ++i) {
        if (wr[i].opcode == HCA_WR_RDMA_READ) {
            ASSERT_EQ(0, t.fill(rb, i * N, N, PAT(500 + i)));
        }
    }
    ASSERT_EQ(0, post_retry(cn.qp, &wr[0]));
    std::vector<hca_wc_t> rw;
    ASSERT_EQ(nsend, t.poll_recv(cn.tqp, nsend, &rw, TIMEOUT_MS));
    std::vector<hca_wc_t> w;
    ASSERT_TRUE(wait_wcs(cn.scq, K, &w));
    for (int i = 0; i < K; ++i) {
        EXPECT_EQ(HCA_WC_SUCCESS, w[i].status) << wc_str(w[i]);
        EXPECT_EQ((uint64_t)i, w[i].wr_id) << "out of order";
        EXPECT_EQ(wc_opcode_of(wr[i].opcode), w[i].opcode);
        if (wr[i].opcode == HCA_WR_RDMA_WRITE) {
            EXPECT_EQ(-1, t.check(rb, i * N, N, PAT(300 + i))) << i;
        }
        if (wr[i].opcode == HCA_WR_RDMA_READ) {
            EXPECT_EQ(-1, check_pattern(lb + i * N, N, 500 + i)) << i;
        }
    }
    for (size_t j = 0; j < rw.size(); ++j) {
        EXPECT_EQ(HCA_WC_SUCCESS, rw[j].status);
        EXPECT_EQ(100 + j, rw[j].wr_id) << "receives consumed out of order";
        EXPECT_EQ(N / 16, rw[j].byte_len);
        /* the j-th SEND of the chain is WR 4j+2 */
        EXPECT_EQ(-1, t.check(rb, 48 * N + j * (N / 16), N / 16,
                              PAT(300 + 4 * j + 2)))
                << "receive " << j;
    }
}

INSTANTIATE_TEST_SUITE_P(
        Ops, OpsPlain,
        ::testing::Combine(::testing::ValuesIn(seams()),
                           ::testing::Values(no_param())),
        [](const ::testing::TestParamInfo<OpsPlain::param_type> &i) {
            return seam_param_name(i.param, "");
        });

/* ---------------------------------------------- both ends in this process */

/* A SEND scattered into a receive of 3 SGEs (the receive is posted
 * directly, with 3 SGEs: two contexts of this process). */
class OpsLocalFlags : public seam_test<unsigned> {
};

TEST_P(OpsLocalFlags, ScatterReceive)
{
    ASSERT_TRUE(c.open(param(), fabric()));
    ctx d;
    ASSERT_TRUE(d.open(param(), fabric()));
    if (d.attr.max_sge < 3) {
        GTEST_SKIP() << "max_sge " << d.attr.max_sge;
    }
    qp_pair p;
    ASSERT_TRUE(make_qp_pair(c, d, &p));
    const size_t N = 10000;
    uint8_t *src   = c.alloc(MEM_MALLOC, N);
    hca_mr_t *smr  = c.reg(p.pd1, src, N, ACCESS_ALL);
    uint8_t *dst   = d.alloc(MEM_MALLOC, N + 300);
    hca_mr_t *dmr  = d.reg(p.pd2, dst, N + 300, ACCESS_ALL);
    ASSERT_NE(nullptr, smr);
    ASSERT_NE(nullptr, dmr);
    fill_pattern(src, N, 12);
    memset(dst, SENTINEL, N + 300);
    const size_t a0 = 1, a1 = 4999, a2 = N - a0 - a1 + 50;   /* room left */
    hca_sge_t s[3] = {mk_sge(dst, a0, hca_mr_lkey(dmr)),
                      mk_sge(dst + 100, a1, hca_mr_lkey(dmr)),
                      mk_sge(dst + 200 + a1, a2, hca_mr_lkey(dmr))};
    hca_recv_wr_t rw;
    memset(&rw, 0, sizeof(rw));
    rw.wr_id   = 5;
    rw.sg_list = s;
    rw.num_sge = 3;
    hca_recv_wr_t *badr;
    ASSERT_EQ(0, hca_post_recv(p.q2, &rw, &badr));
    hca_sge_t g      = mk_sge(src, N, hca_mr_lkey(smr));
    hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &g, 1, HCA_SEND_SIGNALED, 6);
    ASSERT_EQ(0, post_retry(p.q1, &wr));
    hca_wc_t wc;
    ASSERT_TRUE(wait_ok(p.r2, 5, HCA_WC_RECV, &wc));
    EXPECT_EQ(N, wc.byte_len);
    ASSERT_TRUE(wait_ok(p.s1, 6, HCA_WC_SEND));
    EXPECT_EQ(0, memcmp(dst, src, a0));
    EXPECT_EQ(0, memcmp(dst + 100, src + a0, a1));
    EXPECT_EQ(0, memcmp(dst + 200 + a1, src + a0 + a1, N - a0 - a1));
    EXPECT_EQ(-1, check_byte(dst + a0, 100 - a0, SENTINEL));
    EXPECT_EQ(-1, check_byte(dst + 100 + a1, 100, SENTINEL));
    EXPECT_EQ(-1, check_byte(dst + 200 + a1 + (N - a0 - a1), 50 + 50,
                             SENTINEL))
            << "wrote past the message";
}

INSTANTIATE_TEST_SUITE_P(
        Ops, OpsLocalFlags,
        ::testing::Combine(::testing::ValuesIn(seams({SAME_PROCESS})),
                           ::testing::ValuesIn(open_flags)),
        flags_seam_name);

class OpsLocal : public seam_test<no_param> {
};

/* Two QPs of one device context connected to each other. */
TEST_P(OpsLocal, SameContextLoopback)
{
    ASSERT_TRUE(c.open(0, fabric()));
    qp_pair p;
    ASSERT_TRUE(make_qp_pair(c, c, &p));
    const size_t N = 100000;
    uint8_t *a     = c.alloc(MEM_MALLOC, N);
    uint8_t *b     = c.alloc(MEM_DM, N);
    ASSERT_NE(nullptr, a);
    ASSERT_NE(nullptr, b);
    hca_mr_t *ma = c.reg(p.pd1, a, N, ACCESS_ALL);
    hca_mr_t *mb = c.reg(p.pd1, b, N, ACCESS_ALL);
    ASSERT_NE(nullptr, mb);

    fill_pattern(a, N, 1);
    memset(b, SENTINEL, N);
    hca_sge_t sa     = mk_sge(a, N, hca_mr_lkey(ma));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sa, 1, HCA_SEND_SIGNALED, 1,
                             (uint64_t)(uintptr_t)b, hca_mr_rkey(mb));
    ASSERT_TRUE(post_and_wait(p.q1, p.s1, &wr, HCA_WC_RDMA_WRITE));
    EXPECT_EQ(-1, check_pattern(b, N, 1));

    fill_pattern(b, N, 2);
    wr = mk_wr(HCA_WR_RDMA_READ, &sa, 1, HCA_SEND_SIGNALED, 2,
               (uint64_t)(uintptr_t)b, hca_mr_rkey(mb));
    ASSERT_TRUE(post_and_wait(p.q1, p.s1, &wr, HCA_WC_RDMA_READ));
    EXPECT_EQ(-1, check_pattern(a, N, 2));

    memset(b, SENTINEL, N);
    fill_pattern(a, N, 3);
    ASSERT_EQ(0, post_recv1(p.q2, b, N, hca_mr_lkey(mb), 7));
    wr = mk_wr(HCA_WR_SEND, &sa, 1, HCA_SEND_SIGNALED, 3);
    ASSERT_EQ(0, post_retry(p.q1, &wr));
    hca_wc_t wc;
    ASSERT_TRUE(wait_ok(p.r2, 7, HCA_WC_RECV, &wc));
    EXPECT_EQ(N, wc.byte_len);
    EXPECT_EQ(hca_qp_num(p.q1), wc.src_qp);
    ASSERT_TRUE(wait_ok(p.s1, 3, HCA_WC_SEND));
    EXPECT_EQ(-1, check_pattern(b, N, 3));

    if (c.attr.atomic_caps & HCA_ATOMIC_CAP_64) {
        uint64_t v = 41;
        memcpy(b + 8, &v, 8);
        hca_sge_t r      = mk_sge(a, 8, hca_mr_lkey(ma));
        wr               = mk_wr(HCA_WR_ATOMIC_FETCH_ADD, &r, 1,
                                 HCA_SEND_SIGNALED, 4,
                                 (uint64_t)(uintptr_t)(b + 8), hca_mr_rkey(mb));
        wr.compare_add   = 1;
        ASSERT_TRUE(post_and_wait(p.q2, p.s2, &wr, HCA_WC_ATOMIC));
        uint64_t old, now;
        memcpy(&old, a, 8);
        memcpy(&now, b + 8, 8);
        EXPECT_EQ(41u, old);
        EXPECT_EQ(42u, now);
    }
}

INSTANTIATE_TEST_SUITE_P(
        Ops, OpsLocal,
        ::testing::Combine(::testing::ValuesIn(seams({SAME_PROCESS})),
                           ::testing::Values(no_param())),
        [](const ::testing::TestParamInfo<OpsLocal::param_type> &i) {
            return seam_param_name(i.param, "");
        });
