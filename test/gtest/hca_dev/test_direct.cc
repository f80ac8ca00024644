/*
 * test_direct.cc - direct RDMA WRITE and atomics (fast_write_direct,
 * fast_atomic_direct, and fast_direct_ptr) on a peer's device memory, on
 * the shm fabric: the tcp fabric maps no peer memory, and says so for
 * every one of these paths (test_ops.cc, FastPaths on both fabrics):
 *
 *  - data lands exactly (sizes 0..4096, aligned and not, at both ends of an
 *    MR, alternating between MRs so that the QP's cached MPT entry changes),
 *    nothing around it changes, the call returns 0, no CQE, no queue entry;
 *  - -EAGAIN and nothing written (no counter, QP state kept) for plain
 *    memory, a bad key, a range outside the MR, an MR or target QP without
 *    the right, the MR of another PD, a QP not in RTS or with sq_sig_all, a
 *    target QP that is gone / in ERR / connected to someone else, a busy
 *    send queue (an issued SEND; a WR queued behind one), a deregistered MR
 *    (cached or not), a QP reconnected elsewhere; the WR path then reports
 *    the error (REM_ACCESS_ERR / REM_INV_REQ_ERR);
 *  - every atomic opcode, 4 and 8 bytes: new value and old value exactly as
 *    computed locally, cmp_swp matching and not, a long random sequence;
 *    misaligned, no REMOTE_ATOMIC, non-atomic opcode, bad size: -EAGAIN;
 *  - fast_direct_ptr: the same checks, the mapping of exactly the range;
 *  - across processes: contention on one word (no lost update, no
 *    duplicate old value), deregistration while a peer writes, dead peer.
 *
 * Each body runs with the target in another device context of this
 * process ("ctx2"), in the requester's own context ("self") and in a forked
 * child ("proc").
 */
#include "test_common.h"

#include <atomic>
#include <random>
#include <thread>
#include <tuple>

using namespace hcat;

namespace {

enum where_t {
    WHERE_CTX2 = 0,  /* target: another device context of this process */
    WHERE_SELF,      /* target: the requester's own device context */
    WHERE_PROC       /* target: a forked child */
};

const char *where_name(where_t w)
{
    switch (w) {
    case WHERE_CTX2:
        return "ctx2";
    case WHERE_SELF:
        return "self";
    default:
        return "proc";
    }
}

const hca_wr_opcode_t all_atomic_ops[] = {
    HCA_WR_ATOMIC_FETCH_ADD, HCA_WR_ATOMIC_CMP_SWP,   HCA_WR_ATOMIC_SWAP,
    HCA_WR_ATOMIC_FETCH_AND, HCA_WR_ATOMIC_FETCH_OR,  HCA_WR_ATOMIC_FETCH_XOR,
    HCA_WR_ATOMIC_ADD,       HCA_WR_ATOMIC_AND,       HCA_WR_ATOMIC_OR,
    HCA_WR_ATOMIC_XOR};

const size_t   SRC_LEN  = 1 << 16;
const uint64_t SRC_SEED = 4242;
/* what the old value is preset to, to see that a refused call leaves it */
const uint64_t OLD_MARK = 0x1122334455667788ull;

/* A buffer of a target. */
struct tbuf {
    int      id   = -1;
    uint64_t addr = 0;
    size_t   len  = 0;
};

/* The requester's context and the target, for one where_t. */
class direct_env {
public:
    where_t                              where = WHERE_CTX2;
    std::unique_ptr<remote_target>       rt;
    std::unique_ptr<local_target>        lt;
    std::vector<std::unique_ptr<target>> extra;
    ctx                                  own;
    ctx                                 *c    = nullptr;
    target                              *t    = nullptr;
    hca_pd_t                            *pd   = nullptr; /* requester PD */
    int                                  tpd  = -1;      /* target PD */
    uint8_t                             *src  = nullptr; /* PAT(SRC_SEED) */
    hca_mr_t                            *smr  = nullptr; /* over src */
    unsigned                             flags = 0;

    ::testing::AssertionResult open(where_t w, unsigned fl = 0)
    {
        where = w;
        flags = fl;
        if (w == WHERE_PROC) {
            rt.reset(new remote_target);
            ::testing::AssertionResult r = rt->start(fl);
            if (!r) {
                return r;
            }
            t = rt.get();
            r = own.open(fl);
            if (!r) {
                return r;
            }
            c = &own;
        } else {
            lt.reset(new local_target);
            ::testing::AssertionResult r = lt->open(fl);
            if (!r) {
                return r;
            }
            t = lt.get();
            if (w == WHERE_SELF) {
                c = &lt->c;
            } else {
                r = own.open(fl);
                if (!r) {
                    return r;
                }
                c = &own;
            }
        }
        pd  = c->new_pd();
        tpd = t->pd();
        src = c->alloc(MEM_MALLOC, SRC_LEN);
        if ((pd == nullptr) || (tpd < 0) || (src == nullptr)) {
            return ::testing::AssertionFailure() << "PDs / source buffer";
        }
        fill_pattern(src, SRC_LEN, SRC_SEED);
        smr = c->reg(pd, src, SRC_LEN, ACCESS_ALL);
        if (smr == nullptr) {
            return ::testing::AssertionFailure() << "source MR";
        }
        return ::testing::AssertionSuccess();
    }

    /* Another target of the same kind (a new context, or a new child). */
    target *new_target()
    {
        if (where == WHERE_PROC) {
            remote_target *r = new remote_target;
            extra.emplace_back(r);
            return r->start(flags) ? r : nullptr;
        }
        local_target *l = new local_target;
        extra.emplace_back(l);
        return l->open(flags) ? l : nullptr;
    }

    /* The target in this process, or nullptr. */
    local_target *local() const
    {
        return lt.get();
    }

    /* A requester QP on pd connected to a new QP of t (on tpd). */
    ::testing::AssertionResult connect(conn *cn, unsigned t_access = REMOTE_ALL,
                                       int on_tpd = -1, target *to = nullptr)
    {
        to = to ? to : t;
        return make_conn(*c, *to, cn, (on_tpd >= 0) ? on_tpd : tpd, t_access,
                         pd, 64);
    }

    void close()
    {
        own.close();
        extra.clear();
        lt.reset();
        rt.reset();
        c = nullptr;
        t = nullptr;
    }
};

/* A buffer of len bytes of kind at target t, filled with SENTINEL. */
::testing::AssertionResult make_buf(target &t, mem_kind_t kind, size_t len,
                                    tbuf *b)
{
    b->len = len;
    b->id  = t.buf(kind, len, &b->addr);
    if (b->id < 0) {
        return ::testing::AssertionFailure()
               << "target buffer of " << len << " bytes ("
               << mem_kind_name(kind) << "): " << b->id;
    }
    int rc = t.fill(b->id, 0, len, BYTE(SENTINEL));
    if (rc != 0) {
        return ::testing::AssertionFailure() << "fill: " << rc;
    }
    return ::testing::AssertionSuccess();
}

/* An MR over [off, off+len) of b; returns its index (< 0 on failure). */
int make_mr(target &t, int tpd, const tbuf &b, size_t off, size_t len,
            unsigned access, uint32_t *rkey)
{
    int m = t.mr(tpd, b.id, off, len, access, rkey);
    EXPECT_GE(m, 0) << "target hca_mr_reg(+" << off << ", " << len
                    << ", 0x" << std::hex << access << ")";
    return m;
}

/* b holds SENTINEL except [off, off+len), which holds f. */
::testing::AssertionResult buf_is(target &t, const tbuf &b, size_t off,
                                  size_t len, fillspec f)
{
    int64_t r = t.check(b.id, 0, off, BYTE(SENTINEL));
    if (r != -1) {
        return ::testing::AssertionFailure()
               << "byte " << r << " (before +" << off << ") changed";
    }
    r = t.check(b.id, off, len, f);
    if (r != -1) {
        return ::testing::AssertionFailure()
               << "byte " << (off + r) << " of [+" << off << ", +"
               << (off + len) << ") is not what was written (" << r << ")";
    }
    r = t.check(b.id, off + len, b.len - off - len, BYTE(SENTINEL));
    if (r != -1) {
        return ::testing::AssertionFailure()
               << "byte " << (off + len + r) << " (after +" << (off + len)
               << ") changed";
    }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult untouched(target &t, const tbuf &b)
{
    int64_t r = t.check(b.id, 0, b.len, BYTE(SENTINEL));
    if (r != -1) {
        return ::testing::AssertionFailure()
               << "target byte " << r << " changed (" << r << ")";
    }
    return ::testing::AssertionSuccess();
}

struct tx_snap {
    uint64_t ops[HCA_WR_OPCODE_LAST];
    uint64_t bytes[HCA_WR_OPCODE_LAST];
    uint64_t mapped;
};

tx_snap snap(hca_qp_t *qp)
{
    hca_counters_t cnt;
    memset(&cnt, 0, sizeof(cnt));
    EXPECT_EQ(0, hca_qp_counters(qp, &cnt));
    tx_snap s;
    memcpy(s.ops, cnt.tx_ops, sizeof(s.ops));
    memcpy(s.bytes, cnt.tx_bytes, sizeof(s.bytes));
    s.mapped = cnt.mapped_ops;
    return s;
}

::testing::AssertionResult same_tx(const tx_snap &a, const tx_snap &b)
{
    for (int i = 0; i < HCA_WR_OPCODE_LAST; ++i) {
        if ((a.ops[i] != b.ops[i]) || (a.bytes[i] != b.bytes[i])) {
            return ::testing::AssertionFailure()
                   << "tx counters of " << (hca_wr_opcode_t)i << " changed: "
                   << a.ops[i] << "/" << a.bytes[i] << " -> " << b.ops[i]
                   << "/" << b.bytes[i];
        }
    }
    if (a.mapped != b.mapped) {
        return ::testing::AssertionFailure()
               << "mapped_ops changed: " << a.mapped << " -> " << b.mapped;
    }
    return ::testing::AssertionSuccess();
}

/* fast_write_direct must say -EAGAIN and do nothing: no counter, nothing
 * queued, the QP state kept (the caller then posts a WR). */
void expect_write_refused(hca_qp_t *qp, const void *p, size_t len,
                          uint64_t raddr, uint32_t rkey)
{
    tx_snap before          = snap(qp);
    hca_qp_state_t st       = hca_qp_state(qp);
    uint32_t outstanding    = hca_qp_outstanding(qp);
    EXPECT_EQ(-EAGAIN, fast_write_direct(qp, p, len, raddr, rkey))
            << "fast_write_direct(len " << len << ", raddr 0x" << std::hex
            << raddr << ", rkey 0x" << rkey << ")";
    EXPECT_TRUE(same_tx(before, snap(qp)));
    EXPECT_EQ(st, hca_qp_state(qp)) << "a refused call changed the QP state";
    EXPECT_EQ(outstanding, hca_qp_outstanding(qp));
}

void expect_atomic_refused(hca_qp_t *qp, hca_wr_opcode_t op, unsigned size,
                           uint64_t raddr, uint32_t rkey)
{
    tx_snap before       = snap(qp);
    hca_qp_state_t st    = hca_qp_state(qp);
    uint32_t outstanding = hca_qp_outstanding(qp);
    uint64_t old         = OLD_MARK;
    EXPECT_EQ(-EAGAIN, fast_atomic_direct(qp, op, size, raddr, rkey, 1, 2,
                                         &old))
            << "fast_atomic_direct(" << op << ", size " << size
            << ", raddr 0x" << std::hex << raddr << ", rkey 0x" << rkey
            << ")";
    EXPECT_EQ(OLD_MARK, old) << "a refused atomic wrote at result";
    EXPECT_TRUE(same_tx(before, snap(qp)));
    EXPECT_EQ(st, hca_qp_state(qp)) << "a refused call changed the QP state";
    EXPECT_EQ(outstanding, hca_qp_outstanding(qp));
}

/* Posts a signalled RDMA WRITE of len bytes of e.src and returns the status
 * of its completion (HCA_WC_STATUS_LAST, with a failure, if none came). */
hca_wc_status_t wr_write(direct_env &e, conn &cn, size_t len, uint64_t raddr,
                         uint32_t rkey, uint64_t wr_id)
{
    hca_sge_t sg     = mk_sge(e.src, len, hca_mr_lkey(e.smr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED,
                             wr_id, raddr, rkey);
    int rc           = post_retry(cn.qp, &wr);
    if (rc != 0) {
        ADD_FAILURE() << "hca_post_send = " << rc;
        return HCA_WC_STATUS_LAST;
    }
    hca_wc_t wc;
    ::testing::AssertionResult r = wait_wc(cn.scq, &wc);
    if (!r) {
        ADD_FAILURE() << r.message();
        return HCA_WC_STATUS_LAST;
    }
    EXPECT_EQ(wr_id, wc.wr_id) << wc_str(wc);
    return wc.status;
}

/* The same for a FETCH_ADD(1) of size bytes (its result goes to e.src + 8,
 * which is refilled afterwards). */
hca_wc_status_t wr_atomic(direct_env &e, conn &cn, unsigned size,
                          uint64_t raddr, uint32_t rkey, uint64_t wr_id)
{
    hca_sge_t sg     = mk_sge(e.src + 8, size, hca_mr_lkey(e.smr));
    hca_send_wr_t wr = mk_wr(HCA_WR_ATOMIC_FETCH_ADD, &sg, 1,
                             HCA_SEND_SIGNALED |
                                     ((size == 4) ? HCA_SEND_ATOMIC32 : 0),
                             wr_id, raddr, rkey);
    wr.compare_add   = 1;
    int rc           = post_retry(cn.qp, &wr);
    if (rc != 0) {
        ADD_FAILURE() << "hca_post_send = " << rc;
        return HCA_WC_STATUS_LAST;
    }
    hca_wc_t wc;
    ::testing::AssertionResult r = wait_wc(cn.scq, &wc);
    fill_pattern(e.src, SRC_LEN, SRC_SEED);
    if (!r) {
        ADD_FAILURE() << r.message();
        return HCA_WC_STATUS_LAST;
    }
    EXPECT_EQ(wr_id, wc.wr_id) << wc_str(wc);
    return wc.status;
}

/* The value of size bytes at off of b. */
uint64_t read_word(target &t, const tbuf &b, size_t off, unsigned size)
{
    uint64_t v = 0;
    EXPECT_EQ(0, t.read(b.id, off, &v, size));
    return v;
}

void write_word(target &t, const tbuf &b, size_t off, unsigned size,
                uint64_t v)
{
    EXPECT_EQ(0, t.write(b.id, off, &v, size));
}

uint64_t size_mask(unsigned size)
{
    return (size == 4) ? 0xffffffffull : ~0ull;
}

/* ------------------------------------------------------------ fixture */

class direct_test : public hca_test,
                    public ::testing::WithParamInterface<where_t> {
protected:
    direct_env e;

    void TearDown() override
    {
        e.close();
        hca_test::TearDown();
    }

    where_t where() const
    {
        return GetParam();
    }
};

std::string where_param_name(const ::testing::TestParamInfo<where_t> &i)
{
    return where_name(i.param);
}

} /* namespace */


/* ============================================================ WRITE */

class DirectWrite : public direct_test {
};

/* Sizes 0, 1, 8, 960 and 4096, aligned and not, into an MR that covers
 * exactly the written range (a new MR each time, so a new cache fill),
 * then at both ends of one larger MR (cached entry): exact data, nothing
 * around it, 0, no queue entry, no CQE; counted as mapped RDMA WRITEs. */
TEST_P(DirectWrite, SizesLandExactly)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    const size_t BUFSZ = 16384;
    tbuf b;
    ASSERT_TRUE(make_buf(t, MEM_DM, BUFSZ, &b));

    const size_t sizes[] = {0, 1, 8, 960, 4096};
    const tx_snap s0     = snap(cn.qp);
    uint64_t nops = 0, nbytes = 0;
    std::vector<uint8_t> lbuf(4096 + 2 * GUARD);

    for (size_t size : sizes) {
        for (size_t off : {(size_t)4096, (size_t)4096 + 3}) {
            SCOPED_TRACE("exact MR, size " + std::to_string(size) +
                         " at +" + std::to_string(off));
            uint64_t seed = size * 31 + off;
            memset(lbuf.data(), LSENTINEL, lbuf.size());
            fill_pattern(lbuf.data() + GUARD, size, seed);
            uint32_t rkey = 0;
            int m = make_mr(t, e.tpd, b, off, size, ACCESS_ALL, &rkey);
            ASSERT_GE(m, 0);
            EXPECT_EQ(0, fast_write_direct(cn.qp, lbuf.data() + GUARD, size,
                                          b.addr + off, rkey));
            EXPECT_EQ(0u, hca_qp_outstanding(cn.qp));
            ++nops;
            nbytes += size;
            EXPECT_TRUE(buf_is(t, b, off, size, PAT(seed)));
            EXPECT_EQ(-1, check_pattern(lbuf.data() + GUARD, size, seed))
                    << "the source changed";
            EXPECT_EQ(-1, check_byte(lbuf.data(), GUARD, LSENTINEL));
            EXPECT_EQ(-1, check_byte(lbuf.data() + GUARD + size, GUARD,
                                     LSENTINEL));
            ASSERT_EQ(0, t.dereg(m));
            ASSERT_EQ(0, t.fill(b.id, 0, BUFSZ, BYTE(SENTINEL)));
        }
    }

    /* one MR [5, 5 + 8192): every size at its start and at its end */
    const size_t MOFF = 5, MLEN = 8192;
    uint32_t rkey     = 0;
    ASSERT_GE(make_mr(t, e.tpd, b, MOFF, MLEN, ACCESS_ALL, &rkey), 0);
    for (size_t size : sizes) {
        for (size_t off : {MOFF, MOFF + MLEN - size}) {
            SCOPED_TRACE("cached MR, size " + std::to_string(size) +
                         " at +" + std::to_string(off));
            uint64_t seed = 7 + size + off;
            fill_pattern(lbuf.data(), size, seed);
            EXPECT_EQ(0, fast_write_direct(cn.qp, lbuf.data(), size,
                                          b.addr + off, rkey));
            ++nops;
            nbytes += size;
            EXPECT_TRUE(buf_is(t, b, off, size, PAT(seed)));
            ASSERT_EQ(0, t.fill(b.id, 0, BUFSZ, BYTE(SENTINEL)));
        }
    }

    const tx_snap s1 = snap(cn.qp);
    EXPECT_EQ(nops, s1.ops[HCA_WR_RDMA_WRITE] - s0.ops[HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(nbytes,
              s1.bytes[HCA_WR_RDMA_WRITE] - s0.bytes[HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(nops, s1.mapped - s0.mapped);
    EXPECT_TRUE(expect_no_wc(cn.scq, 20)) << "a direct write made a CQE";
    EXPECT_EQ(0u, hca_qp_outstanding(cn.qp));
    EXPECT_EQ(HCA_QPS_RTS, hca_qp_state(cn.qp));
}


/* Writes alternate between MRs of three device memory objects (two MRs in
 * one of them), so the MPT entry the QP cached keeps changing: each write
 * lands in its own MR only. */
TEST_P(DirectWrite, AlternatingMrs)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    tbuf b[3];
    for (auto &x : b) {
        ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &x));
    }
    struct region {
        int      buf;
        size_t   off, len;
        uint32_t rkey;
        uint64_t seed;   /* of the last write, 0: never written */
        size_t   wlen;   /* the last write covered the last wlen bytes */
    } r[4] = {{0, 100, 1000, 0, 0, 0}, {1, 0, 8192, 0, 0, 0},
              {2, 64, 512, 0, 0, 0},   {2, 4096, 2048, 0, 0, 0}};
    for (auto &x : r) {
        ASSERT_GE(make_mr(t, e.tpd, b[x.buf], x.off, x.len, ACCESS_ALL,
                          &x.rkey), 0);
    }
    std::vector<uint8_t> lbuf(8192);
    uint64_t seed = 1000;
    for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < 4; ++i) {
            region &x = r[(i * 3 + round) % 4];
            x.wlen    = x.len - 8 * round - i;
            x.seed    = ++seed;
            fill_pattern(lbuf.data(), x.wlen, x.seed);
            ASSERT_EQ(0, t.fill(b[x.buf].id, x.off, x.len, BYTE(SENTINEL)));
            ASSERT_EQ(0, fast_write_direct(cn.qp, lbuf.data(), x.wlen,
                                          b[x.buf].addr + x.off + x.len -
                                                  x.wlen,
                                          x.rkey));
            for (auto &y : r) {
                SCOPED_TRACE("round " + std::to_string(round) + ", write " +
                             std::to_string(i) + ", region +" +
                             std::to_string(y.off) + " of buffer " +
                             std::to_string(y.buf));
                EXPECT_EQ(-1, t.check(b[y.buf].id, y.off, y.len - y.wlen,
                                      BYTE(SENTINEL)));
                if (y.seed != 0) {
                    EXPECT_EQ(-1, t.check(b[y.buf].id, y.off + y.len - y.wlen,
                                          y.wlen, PAT(y.seed)));
                }
            }
        }
    }
    /* what lies outside the regions was never written */
    EXPECT_EQ(-1, t.check(b[0].id, 0, 100, BYTE(SENTINEL)));
    EXPECT_EQ(-1, t.check(b[0].id, 1100, 8192 - 1100, BYTE(SENTINEL)));
    EXPECT_EQ(-1, t.check(b[2].id, 0, 64, BYTE(SENTINEL)));
    EXPECT_EQ(-1, t.check(b[2].id, 576, 4096 - 576, BYTE(SENTINEL)));
    EXPECT_EQ(-1, t.check(b[2].id, 6144, 8192 - 6144, BYTE(SENTINEL)));
    EXPECT_TRUE(expect_no_wc(cn.scq, 10));
}

/* Plain (malloc) memory is not device memory: -EAGAIN, nothing written;
 * the WR path then does the write.  The QP still writes device memory
 * directly afterwards. */
TEST_P(DirectWrite, PlainMemoryRefused)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    tbuf m, d;
    ASSERT_TRUE(make_buf(t, MEM_MALLOC, 8192, &m));
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    uint32_t mkey = 0, dkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, m, 1024, 4096, ACCESS_ALL, &mkey), 0);
    ASSERT_GE(make_mr(t, e.tpd, d, 1024, 4096, ACCESS_ALL, &dkey), 0);

    for (size_t size : {(size_t)0, (size_t)1, (size_t)8, (size_t)4096}) {
        SCOPED_TRACE("size " + std::to_string(size));
        expect_write_refused(cn.qp, e.src, size, m.addr + 1024, mkey);
        EXPECT_TRUE(untouched(t, m));
    }
    /* after a successful direct write (cache filled with the DM MR) */
    EXPECT_EQ(0, fast_write_direct(cn.qp, e.src, 64, d.addr + 1024, dkey));
    expect_write_refused(cn.qp, e.src, 64, m.addr + 1024, mkey);
    EXPECT_TRUE(untouched(t, m));
    /* the WR path writes it */
    EXPECT_EQ(HCA_WC_SUCCESS, wr_write(e, cn, 4096, m.addr + 1024, mkey, 5));
    EXPECT_EQ(-1, t.check(m.id, 1024, 4096, PAT(SRC_SEED)));
    EXPECT_EQ(-1, t.check(m.id, 0, 1024, BYTE(SENTINEL)));
    EXPECT_EQ(-1, t.check(m.id, 5120, 8192 - 5120, BYTE(SENTINEL)));
    /* and device memory still goes direct */
    ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
    EXPECT_EQ(0, fast_write_direct(cn.qp, e.src, 4096, d.addr + 1024, dkey));
    EXPECT_TRUE(buf_is(t, d, 1024, 4096, PAT(SRC_SEED)));
    EXPECT_TRUE(expect_no_wc(cn.scq, 10));
}

/* Bad keys: unknown index, wrong tag, 0, out of the table, the key of an
 * MR of another PD.  Each with an empty cache (first call on the QP) and
 * with the good key cached; -EAGAIN and nothing written, then the WR path
 * fails with REM_ACCESS_ERR and writes nothing either. */
TEST_P(DirectWrite, BadKeyRefused)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    uint32_t rkey = 0, okey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 1024, 4096, ACCESS_ALL, &rkey), 0);
    int tpd2 = t.pd();
    ASSERT_GE(tpd2, 0);
    ASSERT_GE(make_mr(t, tpd2, d, 1024, 4096, ACCESS_ALL, &okey), 0);

    const uint32_t tag = rkey & 0xff;
    struct bad {
        const char *name;
        uint32_t    key;
    } cases[] = {
        {"wrong tag", (rkey & ~0xffu) | ((tag == 0xff) ? 1 : tag + 1)},
        {"unknown index", (0xfff0u << 8) | tag},
        {"zero", 0},
        {"inverted", ~rkey},
        {"other PD", okey},
    };
    uint64_t wr_id = 100;
    for (const bad &x : cases) {
        ASSERT_NE(rkey, x.key);
        for (bool warm : {false, true}) {
            SCOPED_TRACE(std::string(x.name) + (warm ? ", cached good key"
                                                     : ", empty cache"));
            conn cn;
            ASSERT_TRUE(e.connect(&cn));
            if (warm) {
                ASSERT_EQ(0, fast_write_direct(cn.qp, e.src, 16, d.addr + 2048,
                                              rkey));
                ASSERT_TRUE(buf_is(t, d, 2048, 16, PAT(SRC_SEED)));
                ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
            }
            for (size_t size : {(size_t)0, (size_t)8, (size_t)4096}) {
                expect_write_refused(cn.qp, e.src, size, d.addr + 1024, x.key);
            }
            EXPECT_TRUE(untouched(t, d));
            /* the good key still works on this QP */
            EXPECT_EQ(0, fast_write_direct(cn.qp, e.src, 8, d.addr + 1024,
                                          rkey));
            EXPECT_TRUE(buf_is(t, d, 1024, 8, PAT(SRC_SEED)));
            ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
            expect_write_refused(cn.qp, e.src, 8, d.addr + 1024, x.key);
            /* the WR path reports it */
            EXPECT_EQ(HCA_WC_REM_ACCESS_ERR,
                      wr_write(e, cn, 8, d.addr + 1024, x.key, ++wr_id));
            EXPECT_TRUE(untouched(t, d));
            EXPECT_EQ(HCA_QPS_ERR, hca_qp_state(cn.qp));
        }
    }
}

/* Ranges outside the MR [1024, 1024 + 4096): one byte past the end, the
 * first byte after it, one byte before the start, far below, longer than
 * the MR, lengths and addresses that wrap.  With the key cached and not;
 * the WR path reports REM_ACCESS_ERR for the first ones. */
TEST_P(DirectWrite, OutOfRangeRefused)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    const size_t MOFF = 1024, MLEN = 4096;
    uint32_t rkey     = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, MOFF, MLEN, ACCESS_ALL, &rkey), 0);
    const uint64_t start = d.addr + MOFF, end = start + MLEN;
    struct range {
        const char *name;
        uint64_t    raddr;
        size_t      len;
        bool        wr;   /* also check the WR path */
    } cases[] = {
        {"one byte past the end", end - 8 + 1, 8, true},
        {"whole MR shifted by one", start + 1, MLEN, true},
        {"first byte after the end", end, 1, true},
        {"one byte before the start", start - 1, 8, true},
        {"below the start", d.addr, 64, true},
        {"longer than the MR", start, MLEN + 1, true},
        {"far above", end + (1ull << 40), 8, false},
        {"address wraps", ~0ull - 3, 8, false},
        {"length wraps", start + 8, (size_t)0 - 8, false},
        {"huge length", start, (size_t)1 << 62, false},
    };
    uint64_t wr_id = 200;
    for (const range &x : cases) {
        for (bool warm : {false, true}) {
            SCOPED_TRACE(std::string(x.name) + (warm ? ", cached" : ", cold"));
            conn cn;
            ASSERT_TRUE(e.connect(&cn));
            if (warm) {
                ASSERT_EQ(0, fast_write_direct(cn.qp, e.src, MLEN, start,
                                              rkey));
                ASSERT_TRUE(buf_is(t, d, MOFF, MLEN, PAT(SRC_SEED)));
                ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
            }
            expect_write_refused(cn.qp, e.src, x.len, x.raddr, rkey);
            EXPECT_TRUE(untouched(t, d));
            if (warm && x.wr) {
                EXPECT_EQ(HCA_WC_REM_ACCESS_ERR,
                          wr_write(e, cn, x.len, x.raddr, rkey, ++wr_id));
                EXPECT_TRUE(untouched(t, d));
            }
        }
    }
    /* the exact bounds are accepted */
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    EXPECT_EQ(0, fast_write_direct(cn.qp, e.src, 1, end - 1, rkey));
    EXPECT_TRUE(buf_is(t, d, MOFF + MLEN - 1, 1, PAT(SRC_SEED)));
    ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
    EXPECT_EQ(0, fast_write_direct(cn.qp, e.src, 1, start, rkey));
    EXPECT_TRUE(buf_is(t, d, MOFF, 1, PAT(SRC_SEED)));
}

/* An MR without REMOTE_WRITE (but with the other rights): -EAGAIN, also
 * when an atomic just cached that MR; the WR path says REM_ACCESS_ERR. */
TEST_P(DirectWrite, MrWithoutRemoteWrite)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    uint32_t nkey = 0, rkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 4096,
                      HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_READ |
                              HCA_ACCESS_REMOTE_ATOMIC,
                      &nkey), 0);
    ASSERT_GE(make_mr(t, e.tpd, d, 4096, 4096, HCA_ACCESS_REMOTE_READ,
                      &rkey), 0);
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    expect_write_refused(cn.qp, e.src, 64, d.addr + 64, nkey);
    expect_write_refused(cn.qp, e.src, 64, d.addr + 4096 + 64, rkey);
    EXPECT_TRUE(untouched(t, d));
    /* the atomic right of that MR fills the cache */
    uint64_t old = 0;
    ASSERT_EQ(0, fast_atomic_direct(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                                   d.addr + 8, nkey, 1, 0, &old));
    EXPECT_EQ(0xa5a5a5a5a5a5a5a5ull, old);
    ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
    expect_write_refused(cn.qp, e.src, 8, d.addr + 8, nkey);
    expect_write_refused(cn.qp, e.src, 0, d.addr + 8, nkey);
    EXPECT_TRUE(untouched(t, d));
    EXPECT_EQ(HCA_WC_REM_ACCESS_ERR, wr_write(e, cn, 8, d.addr + 8, nkey, 1));
    EXPECT_TRUE(untouched(t, d));
}

/* A target QP whose INIT access lacks REMOTE_WRITE refuses, whatever the
 * MR allows. */
TEST_P(DirectWrite, QpWithoutRemoteWrite)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    uint32_t rkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 8192, ACCESS_ALL, &rkey), 0);
    conn cn;
    ASSERT_TRUE(e.connect(&cn, REMOTE_ALL & ~HCA_ACCESS_REMOTE_WRITE));
    for (size_t size : {(size_t)0, (size_t)8, (size_t)4096}) {
        expect_write_refused(cn.qp, e.src, size, d.addr + 64, rkey);
    }
    EXPECT_TRUE(untouched(t, d));
    /* atomics are allowed by that QP: they still go direct */
    uint64_t old = 0;
    ASSERT_EQ(0, fast_atomic_direct(cn.qp, HCA_WR_ATOMIC_SWAP, 8, d.addr + 64,
                                   rkey, 0x0123456789abcdefull, 0, &old));
    EXPECT_EQ(0x0123456789abcdefull, read_word(t, d, 64, 8));
    ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
    expect_write_refused(cn.qp, e.src, 8, d.addr + 64, rkey);
    EXPECT_TRUE(untouched(t, d));
    hca_wc_status_t st = wr_write(e, cn, 8, d.addr + 64, rkey, 1);
    EXPECT_TRUE((st == HCA_WC_REM_ACCESS_ERR) ||
                (st == HCA_WC_REM_INV_REQ_ERR)) << st;
    EXPECT_TRUE(untouched(t, d));
}

/* The requester QP must be in RTS: RESET, INIT, RTR, ERR and RESET again
 * refuse; RTS (also after a reconnect) writes. */
TEST_P(DirectWrite, QpNotInRts)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    ctx &c    = *e.c;
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    uint32_t rkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 8192, ACCESS_ALL, &rkey), 0);

    cqw *scq     = c.new_cq(64);
    cqw *rcq     = c.new_cq(64);
    hca_qp_t *qp = c.new_qp(e.pd, scq, rcq, c.caps(16));
    ASSERT_NE(nullptr, qp);
    uint32_t tqpn = 0;
    int tq        = t.qp(e.tpd, &tqpn, 16);
    ASSERT_GE(tq, 0);
    ASSERT_EQ(0, t.connect(tq, c.addr, hca_qp_num(qp)));

    auto refused = [&](const char *what) {
        SCOPED_TRACE(what);
        expect_write_refused(qp, e.src, 64, d.addr + 128, rkey);
        expect_atomic_refused(qp, HCA_WR_ATOMIC_FETCH_ADD, 8, d.addr + 256,
                              rkey);
        EXPECT_TRUE(untouched(t, d));
    };
    auto works = [&](const char *what, uint64_t seed) {
        SCOPED_TRACE(what);
        std::vector<uint8_t> p(64);
        fill_pattern(p.data(), 64, seed);
        EXPECT_EQ(0, fast_write_direct(qp, p.data(), 64, d.addr + 128, rkey));
        EXPECT_TRUE(buf_is(t, d, 128, 64, PAT(seed)));
        ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
    };

    ASSERT_EQ(HCA_QPS_RESET, hca_qp_state(qp));
    refused("RESET");
    ASSERT_EQ(0, qp_to_init(qp));
    refused("INIT");
    ASSERT_EQ(0, qp_to_rtr(qp, t.port_addr(), tqpn));
    refused("RTR");
    ASSERT_EQ(0, qp_to_rts(qp));
    works("RTS", 1);
    ASSERT_EQ(0, qp_to_state(qp, HCA_QPS_ERR));
    refused("ERR");
    ASSERT_EQ(0, qp_to_state(qp, HCA_QPS_RESET));
    refused("RESET after ERR");
    ASSERT_EQ(0, connect_qp(qp, t.port_addr(), tqpn));
    works("RTS again", 2);
    EXPECT_TRUE(expect_no_wc(scq, 10));
}

/* A QP created with sq_sig_all owes a CQE for everything: never direct. */
TEST_P(DirectWrite, SqSigAllRefused)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    ctx &c    = *e.c;
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    uint32_t rkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 8192, ACCESS_ALL, &rkey), 0);
    cqw *scq     = c.new_cq(64);
    cqw *rcq     = c.new_cq(64);
    qp_caps cp   = c.caps(16);
    cp.sig_all   = 1;
    hca_qp_t *qp = c.new_qp(e.pd, scq, rcq, cp);
    ASSERT_NE(nullptr, qp);
    uint32_t tqpn = 0;
    int tq        = t.qp(e.tpd, &tqpn, 16);
    ASSERT_GE(tq, 0);
    ASSERT_EQ(0, t.connect(tq, c.addr, hca_qp_num(qp)));
    ASSERT_EQ(0, connect_qp(qp, t.port_addr(), tqpn));
    expect_write_refused(qp, e.src, 64, d.addr, rkey);
    expect_atomic_refused(qp, HCA_WR_ATOMIC_ADD, 8, d.addr + 64, rkey);
    EXPECT_TRUE(untouched(t, d));
    EXPECT_TRUE(expect_no_wc(scq, 5));
}

/* The target QP must be there and accept us: connected to another QP, in
 * ERR (this process only): refused, and the WR path says REM_INV_REQ_ERR;
 * destroyed: the WR path says RETRY_EXC_ERR; a target QP in RTR
 * accepts. */
TEST_P(DirectWrite, TargetQpNotAccepting)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    ctx &c    = *e.c;
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    uint32_t rkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 8192, ACCESS_ALL, &rkey), 0);

    {
        SCOPED_TRACE("target QP connected to another QP");
        conn other, cn;
        ASSERT_TRUE(e.connect(&other));
        ASSERT_TRUE(e.connect(&cn));
        ASSERT_EQ(0, qp_to_state(cn.qp, HCA_QPS_RESET));
        ASSERT_EQ(0, connect_qp(cn.qp, t.port_addr(), other.tqpn));
        /* cn -> other.tqp, which accepts other.qp only */
        expect_write_refused(cn.qp, e.src, 64, d.addr, rkey);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                              d.addr + 64, rkey);
        EXPECT_TRUE(untouched(t, d));
        EXPECT_EQ(HCA_WC_REM_INV_REQ_ERR,
                  wr_write(e, cn, 64, d.addr, rkey, 1));
        EXPECT_TRUE(untouched(t, d));
        /* other itself still writes directly */
        EXPECT_EQ(0, fast_write_direct(other.qp, e.src, 64, d.addr, rkey));
        EXPECT_TRUE(buf_is(t, d, 0, 64, PAT(SRC_SEED)));
        ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
    }
    {
        SCOPED_TRACE("target QP destroyed");
        conn cn;
        ASSERT_TRUE(e.connect(&cn));
        ASSERT_EQ(0, fast_write_direct(cn.qp, e.src, 64, d.addr, rkey));
        ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
        ASSERT_EQ(0, t.destroy_qp(cn.tqp));
        expect_write_refused(cn.qp, e.src, 64, d.addr, rkey);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                              d.addr + 64, rkey);
        EXPECT_TRUE(untouched(t, d));
        /* a QP that no longer exists never answers: retry exceeded, as
         * on InfiniBand (the peer's endpoint is gone) */
        EXPECT_EQ(HCA_WC_RETRY_EXC_ERR,
                  wr_write(e, cn, 64, d.addr, rkey, 2));
        EXPECT_TRUE(untouched(t, d));
    }
    local_target *lt = e.local();
    if (lt != nullptr) {
        SCOPED_TRACE("target QP in ERR, then back in RTR");
        conn cn;
        ASSERT_TRUE(e.connect(&cn));
        hca_qp_t *tq = lt->qps[cn.tqp].qp;
        ASSERT_EQ(0, fast_write_direct(cn.qp, e.src, 64, d.addr, rkey));
        ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
        ASSERT_EQ(0, qp_to_state(tq, HCA_QPS_ERR));
        expect_write_refused(cn.qp, e.src, 64, d.addr, rkey);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                              d.addr + 64, rkey);
        EXPECT_TRUE(untouched(t, d));
        ASSERT_EQ(0, qp_to_state(tq, HCA_QPS_RESET));
        expect_write_refused(cn.qp, e.src, 64, d.addr, rkey);
        ASSERT_EQ(0, qp_to_init(tq));
        expect_write_refused(cn.qp, e.src, 64, d.addr, rkey);
        EXPECT_TRUE(untouched(t, d));
        ASSERT_EQ(0, qp_to_rtr(tq, c.addr, cn.qpn));
        EXPECT_EQ(0, fast_write_direct(cn.qp, e.src, 64, d.addr, rkey))
                << "a target QP in RTR accepts RDMA";
        EXPECT_TRUE(buf_is(t, d, 0, 64, PAT(SRC_SEED)));
    }
}

/* After the target MR is deregistered: refused whether the QP cached it
 * (used it just before) or never used it; the WR path says
 * REM_ACCESS_ERR.  A new MR (new key) over another part of the same
 * device memory: the old key stays refused, the new one writes there and
 * not where the old MR was; one without REMOTE_WRITE over the old range
 * is refused (no right taken from the stale cache). */
TEST_P(DirectWrite, AfterDereg)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 16384, &d));

    {
        SCOPED_TRACE("deregistered after use (cached)");
        conn cn;
        ASSERT_TRUE(e.connect(&cn));
        uint32_t rkey = 0;
        int m = make_mr(t, e.tpd, d, 1024, 4096, ACCESS_ALL, &rkey);
        ASSERT_GE(m, 0);
        ASSERT_EQ(0, fast_write_direct(cn.qp, e.src, 4096, d.addr + 1024,
                                      rkey));
        ASSERT_TRUE(buf_is(t, d, 1024, 4096, PAT(SRC_SEED)));
        uint64_t old = 0;
        ASSERT_EQ(0, fast_atomic_direct(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                                       d.addr + 1024, rkey, 1, 0, &old));
        ASSERT_EQ(0, t.dereg(m));
        ASSERT_EQ(0, t.fill(d.id, 0, d.len, BYTE(SENTINEL)));
        for (size_t size : {(size_t)0, (size_t)1, (size_t)4096}) {
            expect_write_refused(cn.qp, e.src, size, d.addr + 1024, rkey);
        }
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                              d.addr + 1024, rkey);
        /* and again: the first refusal must not have re-cached it */
        expect_write_refused(cn.qp, e.src, 64, d.addr + 1024, rkey);
        EXPECT_TRUE(untouched(t, d));

        /* a new MR elsewhere in the same device memory */
        uint32_t nkey = 0;
        ASSERT_GE(make_mr(t, e.tpd, d, 8192, 4096, ACCESS_ALL, &nkey), 0);
        EXPECT_NE(rkey, nkey);
        expect_write_refused(cn.qp, e.src, 64, d.addr + 1024, rkey);
        expect_write_refused(cn.qp, e.src, 64, d.addr + 8192, rkey);
        EXPECT_TRUE(untouched(t, d));
        std::vector<uint8_t> p(4096);
        fill_pattern(p.data(), 4096, 77);
        EXPECT_EQ(0, fast_write_direct(cn.qp, p.data(), 4096, d.addr + 8192,
                                      nkey));
        EXPECT_TRUE(buf_is(t, d, 8192, 4096, PAT(77)));
        ASSERT_EQ(0, t.fill(d.id, 0, d.len, BYTE(SENTINEL)));
        /* and a read-only MR over the old range */
        uint32_t rokey = 0;
        ASSERT_GE(make_mr(t, e.tpd, d, 1024, 4096, HCA_ACCESS_REMOTE_READ,
                          &rokey), 0);
        expect_write_refused(cn.qp, e.src, 64, d.addr + 1024, rokey);
        expect_write_refused(cn.qp, e.src, 64, d.addr + 1024, rkey);
        EXPECT_TRUE(untouched(t, d));
        EXPECT_EQ(HCA_WC_REM_ACCESS_ERR,
                  wr_write(e, cn, 64, d.addr + 1024, rkey, 1));
        EXPECT_TRUE(untouched(t, d));
    }
    {
        SCOPED_TRACE("deregistered before any use");
        conn cn;
        ASSERT_TRUE(e.connect(&cn));
        uint32_t rkey = 0;
        int m = make_mr(t, e.tpd, d, 0, 16384, ACCESS_ALL, &rkey);
        ASSERT_GE(m, 0);
        ASSERT_EQ(0, t.dereg(m));
        expect_write_refused(cn.qp, e.src, 64, d.addr, rkey);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_CMP_SWP, 8, d.addr + 64,
                              rkey);
        EXPECT_TRUE(untouched(t, d));
        EXPECT_EQ(HCA_WC_REM_ACCESS_ERR, wr_write(e, cn, 64, d.addr, rkey, 2));
        EXPECT_TRUE(untouched(t, d));
    }
}

/* Reconnecting forgets the cached MR: (a) to a target QP of another PD of
 * the same context: the MR of the first PD is refused; (b) to another
 * context whose MR has (most likely) the same key value: the write lands
 * there, not in the first context's memory. */
TEST_P(DirectWrite, ReconnectForgetsCache)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    ctx &c    = *e.c;
    {
        SCOPED_TRACE("another PD of the same context");
        tbuf d;
        ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
        uint32_t rkey = 0;
        ASSERT_GE(make_mr(t, e.tpd, d, 0, 8192, ACCESS_ALL, &rkey), 0);
        conn cn;
        ASSERT_TRUE(e.connect(&cn));
        ASSERT_EQ(0, fast_write_direct(cn.qp, e.src, 64, d.addr, rkey));
        ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
        int tpd2 = t.pd();
        ASSERT_GE(tpd2, 0);
        uint32_t q2n = 0;
        int q2       = t.qp(tpd2, &q2n, 16);
        ASSERT_GE(q2, 0);
        ASSERT_EQ(0, t.connect(q2, c.addr, cn.qpn));
        ASSERT_EQ(0, qp_to_state(cn.qp, HCA_QPS_RESET));
        ASSERT_EQ(0, connect_qp(cn.qp, t.port_addr(), q2n));
        expect_write_refused(cn.qp, e.src, 64, d.addr, rkey);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8, d.addr + 64,
                              rkey);
        EXPECT_TRUE(untouched(t, d));
        EXPECT_EQ(HCA_WC_REM_ACCESS_ERR, wr_write(e, cn, 64, d.addr, rkey, 1));
        EXPECT_TRUE(untouched(t, d));
    }
    {
        SCOPED_TRACE("another context");
        target *t1 = e.new_target();
        target *t2 = e.new_target();
        ASSERT_NE(nullptr, t1);
        ASSERT_NE(nullptr, t2);
        int p1 = t1->pd(), p2 = t2->pd();
        ASSERT_GE(p1, 0);
        ASSERT_GE(p2, 0);
        tbuf d1, d2;
        ASSERT_TRUE(make_buf(*t1, MEM_DM, 8192, &d1));
        ASSERT_TRUE(make_buf(*t2, MEM_DM, 8192, &d2));
        uint32_t k1 = 0, k2 = 0;
        ASSERT_GE(make_mr(*t1, p1, d1, 0, 8192, ACCESS_ALL, &k1), 0);
        ASSERT_GE(make_mr(*t2, p2, d2, 0, 8192, ACCESS_ALL, &k2), 0);
        conn cn;
        ASSERT_TRUE(e.connect(&cn, REMOTE_ALL, p1, t1));
        ASSERT_EQ(0, fast_write_direct(cn.qp, e.src, 64, d1.addr, k1));
        ASSERT_TRUE(buf_is(*t1, d1, 0, 64, PAT(SRC_SEED)));
        ASSERT_EQ(0, t1->fill(d1.id, 0, 8192, BYTE(SENTINEL)));
        uint32_t q2n = 0;
        int q2       = t2->qp(p2, &q2n, 16);
        ASSERT_GE(q2, 0);
        ASSERT_EQ(0, t2->connect(q2, c.addr, cn.qpn));
        ASSERT_EQ(0, qp_to_state(cn.qp, HCA_QPS_RESET));
        ASSERT_EQ(0, connect_qp(cn.qp, t2->port_addr(), q2n));
        std::vector<uint8_t> p(64);
        fill_pattern(p.data(), 64, 99);
        /* same offset in both: the address of the other context's MR */
        EXPECT_EQ(0, fast_write_direct(cn.qp, p.data(), 64, d2.addr, k2));
        EXPECT_TRUE(buf_is(*t2, d2, 0, 64, PAT(99)));
        EXPECT_TRUE(untouched(*t1, d1))
                << "the write went to the previous context (keys 0x"
                << std::hex << k1 << " / 0x" << k2 << ")";
        if (k1 != k2) {
            expect_write_refused(cn.qp, e.src, 64, d1.addr, k1);
        }
        EXPECT_TRUE(untouched(*t1, d1));
    }
}

/* A signalled WR that completed inside hca_post_send but whose CQE is not
 * polled yet does not make the queue busy: direct writes go on, the WR's
 * CQE comes exactly once and the direct write makes none. */
TEST_P(DirectWrite, UnpolledCqeIsIdle)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    uint32_t rkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 8192, ACCESS_ALL, &rkey), 0);
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    hca_sge_t sg     = mk_sge(e.src, 256, hca_mr_lkey(e.smr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED,
                             0x77, d.addr + 1024, rkey);
    hca_send_wr_t *bad = nullptr;
    ASSERT_EQ(0, hca_post_send(cn.qp, &wr, &bad));
    std::vector<uint8_t> p(256);
    fill_pattern(p.data(), 256, 55);
    /* no poll in between (no RPC either: it would progress the CQs) */
    int rc = fast_write_direct(cn.qp, p.data(), 256, d.addr + 4096, rkey);
    EXPECT_EQ(0, rc) << "a completed WR whose CQE was not polled yet";
    ASSERT_TRUE(wait_ok(cn.scq, 0x77, HCA_WC_RDMA_WRITE));
    EXPECT_TRUE(expect_no_wc(cn.scq, 10));
    EXPECT_EQ(-1, t.check(d.id, 1024, 256, PAT(SRC_SEED)));
    if (rc == 0) {
        EXPECT_EQ(-1, t.check(d.id, 4096, 256, PAT(55)));
    }
}

INSTANTIATE_TEST_SUITE_P(Direct, DirectWrite,
                         ::testing::Values(WHERE_CTX2, WHERE_SELF,
                                           WHERE_PROC),
                         where_param_name);


/* ============================================================ busy queue */

typedef std::tuple<where_t, unsigned> busy_param;

class DirectBusy : public hca_test,
                   public ::testing::WithParamInterface<busy_param> {
protected:
    direct_env e;

    void TearDown() override
    {
        e.close();
        hca_test::TearDown();
    }

    ::testing::AssertionResult open()
    {
        return e.open(std::get<0>(GetParam()), std::get<1>(GetParam()));
    }
};

/* A large SEND without a posted receive waits (issued: the target pulls
 * it when a receive comes; without single copy: fragments, more than the
 * ring holds).  Meanwhile direct writes and atomics are refused and write
 * nothing; a FENCEd RDMA WRITE posted behind it is not executed either
 * (and still refused direct).  Once the receive is posted everything
 * completes in order and direct works again. */
TEST_P(DirectBusy, SendWaitingForReceive)
{
    ASSERT_TRUE(open());
    target &t = *e.t;
    ctx &c    = *e.c;
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    uint32_t rkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 8192, ACCESS_ALL, &rkey), 0);

    const size_t BIG = 3ul << 20;   /* more than a receive ring holds */
    uint8_t *big     = c.alloc(MEM_MALLOC, BIG);
    ASSERT_NE(nullptr, big);
    fill_pattern(big, BIG, 31);
    hca_mr_t *bmr = c.reg(e.pd, big, BIG, ACCESS_ALL);
    ASSERT_NE(nullptr, bmr);
    tbuf rb;
    ASSERT_TRUE(make_buf(t, MEM_MALLOC, BIG, &rb));
    uint32_t rbkey = 0;
    int rbm        = make_mr(t, cn.tpd, rb, 0, BIG, ACCESS_ALL, &rbkey);
    ASSERT_GE(rbm, 0);

    /* idle: direct */
    ASSERT_EQ(0, fast_write_direct(cn.qp, e.src, 64, d.addr, rkey));
    ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));

    hca_sge_t sg     = mk_sge(big, BIG, hca_mr_lkey(bmr));
    hca_send_wr_t wr = mk_wr(HCA_WR_SEND, &sg, 1, HCA_SEND_SIGNALED, 1);
    ASSERT_EQ(0, post_retry(cn.qp, &wr));
    for (int i = 0; i < 100; ++i) {
        progress_all();
    }
    ASSERT_NE(0u, hca_qp_outstanding(cn.qp))
            << "the SEND completed without a posted receive";
    {
        SCOPED_TRACE("SEND waiting for a receive");
        for (size_t size : {(size_t)0, (size_t)64, (size_t)4096}) {
            expect_write_refused(cn.qp, e.src, size, d.addr + 128, rkey);
        }
        for (hca_wr_opcode_t op : all_atomic_ops) {
            expect_atomic_refused(cn.qp, op, 8, d.addr + 4096, rkey);
            expect_atomic_refused(cn.qp, op, 4, d.addr + 4096, rkey);
        }
        EXPECT_TRUE(untouched(t, d));
    }

    hca_sge_t sg2     = mk_sge(e.src, 512, hca_mr_lkey(e.smr));
    hca_send_wr_t wr2 = mk_wr(HCA_WR_RDMA_WRITE, &sg2, 1,
                              HCA_SEND_SIGNALED | HCA_SEND_FENCE, 2,
                              d.addr + 1024, rkey);
    ASSERT_EQ(0, post_retry(cn.qp, &wr2));
    for (int i = 0; i < 100; ++i) {
        progress_all();
    }
    EXPECT_TRUE(untouched(t, d))
            << "the FENCEd WRITE ran before the SEND before it completed";
    {
        SCOPED_TRACE("FENCEd WRITE queued behind the SEND");
        std::vector<uint8_t> p(512);
        fill_pattern(p.data(), 512, 65);
        expect_write_refused(cn.qp, p.data(), 512, d.addr + 1024, rkey);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                              d.addr + 1024, rkey);
        EXPECT_TRUE(untouched(t, d));
    }

    ASSERT_EQ(0, t.post_recv(cn.tqp, rbm, rb.id, 0, BIG, 77, 1, 0));
    std::vector<hca_wc_t> wcs;
    ASSERT_EQ(1, t.poll_recv(cn.tqp, 1, &wcs, 2 * TIMEOUT_MS));
    EXPECT_EQ(HCA_WC_SUCCESS, wcs[0].status) << wc_str(wcs[0]);
    EXPECT_EQ((uint32_t)BIG, wcs[0].byte_len);
    ASSERT_TRUE(wait_ok(cn.scq, 1, HCA_WC_SEND));
    ASSERT_TRUE(wait_ok(cn.scq, 2, HCA_WC_RDMA_WRITE));
    EXPECT_EQ(-1, t.check(rb.id, 0, BIG, PAT(31)));
    EXPECT_TRUE(buf_is(t, d, 1024, 512, PAT(SRC_SEED)));

    /* idle again */
    ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));
    std::vector<uint8_t> p(512);
    fill_pattern(p.data(), 512, 66);
    EXPECT_EQ(0, fast_write_direct(cn.qp, p.data(), 512, d.addr + 1024, rkey));
    EXPECT_TRUE(buf_is(t, d, 1024, 512, PAT(66)));
    uint64_t old = 0;
    EXPECT_EQ(0, fast_atomic_direct(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                                   d.addr + 2048, rkey, 1, 0, &old));
    EXPECT_EQ(0xa5a5a5a5a5a5a5a5ull, old);
    EXPECT_TRUE(expect_no_wc(cn.scq, 10));
}

/* The target's receive ring full (nobody posts receives): the send queue
 * is idle, so a direct write still goes (it needs no ring slot).  Then an
 * RDMA WRITE WITH IMM, whose notice finds no slot, stays at the head of
 * the queue and an RDMA WRITE posted behind it is queued, not executed:
 * direct writes and atomics are refused until both completed. */
TEST_P(DirectBusy, QueuedBehindFullRing)
{
    ASSERT_TRUE(open());
    target &t = *e.t;
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    uint32_t rkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 8192, ACCESS_ALL, &rkey), 0);

    int n = 0;
    for (;;) {
        hca_sge_t sg       = mk_sge(e.src, 8, hca_mr_lkey(e.smr));
        hca_send_wr_t wr   = mk_wr(HCA_WR_SEND, &sg, 1, 0, 1000 + n);
        hca_send_wr_t *bad = nullptr;
        int rc             = hca_post_send(cn.qp, &wr, &bad);
        if (rc == -EAGAIN) {
            break;
        }
        ASSERT_EQ(0, rc);
        ASSERT_LT(++n, 100000) << "the ring never filled";
    }
    ASSERT_GT(n, 0);
    EXPECT_EQ(0u, hca_qp_outstanding(cn.qp));

    /* full ring, idle queue: direct */
    EXPECT_EQ(0, fast_write_direct(cn.qp, e.src, 64, d.addr, rkey));
    EXPECT_TRUE(buf_is(t, d, 0, 64, PAT(SRC_SEED)));
    ASSERT_EQ(0, t.fill(d.id, 0, 8192, BYTE(SENTINEL)));

    hca_sge_t sg1     = mk_sge(e.src, 32, hca_mr_lkey(e.smr));
    hca_send_wr_t wr1 = mk_wr(HCA_WR_RDMA_WRITE_WITH_IMM, &sg1, 1,
                              HCA_SEND_SIGNALED, 10, d.addr + 1024, rkey);
    wr1.imm_data       = IMM_VALUE;
    hca_send_wr_t *bad = nullptr;
    ASSERT_EQ(0, hca_post_send(cn.qp, &wr1, &bad))
            << "RDMA WRITE WITH IMM to a full ring (data placed, notice "
               "pending)";
    ASSERT_NE(0u, hca_qp_outstanding(cn.qp));

    hca_sge_t sg2     = mk_sge(e.src, 256, hca_mr_lkey(e.smr));
    hca_send_wr_t wr2 = mk_wr(HCA_WR_RDMA_WRITE, &sg2, 1, HCA_SEND_SIGNALED,
                              11, d.addr + 2048, rkey);
    ASSERT_EQ(0, hca_post_send(cn.qp, &wr2, &bad));
    for (int i = 0; i < 100; ++i) {
        progress_all();
    }
    EXPECT_EQ(-1, t.check(d.id, 2048, 256, BYTE(SENTINEL)))
            << "the WRITE queued behind the pending WRITE WITH IMM ran";
    {
        SCOPED_TRACE("WRITE WITH IMM pending, WRITE queued");
        std::vector<uint8_t> p(256);
        fill_pattern(p.data(), 256, 67);
        expect_write_refused(cn.qp, p.data(), 256, d.addr + 2048, rkey);
        expect_write_refused(cn.qp, p.data(), 64, d.addr + 4096, rkey);
        for (hca_wr_opcode_t op : all_atomic_ops) {
            expect_atomic_refused(cn.qp, op, 8, d.addr + 4096, rkey);
        }
        EXPECT_EQ(-1, t.check(d.id, 2048, 8192 - 2048, BYTE(SENTINEL)));
    }

    /* drain the ring */
    tbuf rb;
    ASSERT_TRUE(make_buf(t, MEM_MALLOC, (size_t)(n + 1) * 64, &rb));
    uint32_t rbkey = 0;
    int rbm = make_mr(t, cn.tpd, rb, 0, rb.len, ACCESS_ALL, &rbkey);
    ASSERT_GE(rbm, 0);
    std::vector<hca_wc_t> wcs;
    for (int done = 0; done < n + 1;) {
        int k = std::min(n + 1 - done, 32);
        ASSERT_EQ(0, t.post_recv(cn.tqp, rbm, rb.id, (size_t)done * 64, 64,
                                 500 + done, k, 64));
        ASSERT_EQ(k, t.poll_recv(cn.tqp, k, &wcs, 2 * TIMEOUT_MS));
        done += k;
    }
    ASSERT_EQ((size_t)n + 1, wcs.size());
    for (int i = 0; i < n + 1; ++i) {
        ASSERT_EQ(HCA_WC_SUCCESS, wcs[i].status) << wc_str(wcs[i]);
    }
    EXPECT_EQ(HCA_WC_RECV_RDMA_WITH_IMM, wcs[n].opcode) << wc_str(wcs[n]);
    EXPECT_EQ(IMM_VALUE, wcs[n].imm_data);
    ASSERT_TRUE(wait_ok(cn.scq, 10, HCA_WC_RDMA_WRITE));
    ASSERT_TRUE(wait_ok(cn.scq, 11, HCA_WC_RDMA_WRITE));
    EXPECT_EQ(-1, t.check(d.id, 1024, 32, PAT(SRC_SEED)));
    EXPECT_EQ(-1, t.check(d.id, 2048, 256, PAT(SRC_SEED)));
    EXPECT_EQ(-1, t.check(d.id, 4096, 4096, BYTE(SENTINEL)));

    std::vector<uint8_t> p(512);
    fill_pattern(p.data(), 512, 88);
    EXPECT_EQ(0, fast_write_direct(cn.qp, p.data(), 512, d.addr + 4096, rkey));
    EXPECT_EQ(-1, t.check(d.id, 4096, 512, PAT(88)));
    EXPECT_TRUE(expect_no_wc(cn.scq, 10));
}

INSTANTIATE_TEST_SUITE_P(
        Direct, DirectBusy,
        ::testing::Values(busy_param(WHERE_CTX2, 0u),
                          busy_param(WHERE_SELF, 0u),
                          busy_param(WHERE_PROC, 0u),
                          busy_param(WHERE_PROC,
                                     (unsigned)HCA_OPEN_NO_SINGLE_COPY)),
        [](const ::testing::TestParamInfo<busy_param> &i) {
            return std::string(where_name(std::get<0>(i.param))) +
                   ((std::get<1>(i.param) & HCA_OPEN_NO_SINGLE_COPY) ? "_nsc"
                                                                     : "");
        });


/* ============================================================ atomics */

class DirectAtomic : public direct_test {
};

/* Every atomic opcode, 4 and 8 bytes, on its own word of device memory:
 * the new value and the fetched old value are what a local computation
 * gives; CMP_SWP first with a compare value that does not match (nothing
 * changes, the old value comes back), then with one that does.  32-bit
 * operations ignore the upper halves of the operands; the old value takes
 * exactly size bytes at result.  Neighbouring bytes never change. */
TEST_P(DirectAtomic, EveryOpExact)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 4096, &d));
    uint32_t rkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 4096, ACCESS_ALL, &rkey), 0);

    int slot = 0;
    for (unsigned size : {4u, 8u}) {
        const bool is32     = (size == 4);
        const uint64_t mask = size_mask(size);
        for (hca_wr_opcode_t op : all_atomic_ops) {
            SCOPED_TRACE(std::string(op_short_name(op)) + "/" +
                         std::to_string(size * 8));
            const size_t base = (size_t)slot++ * 64;
            const size_t voff = base + (is32 ? 20 : 16);
            atomic_vals v     = atomic_operands(op, is32);
            write_word(t, d, voff, size, v.init);
            const bool fetch = is_fetching_op(op);
            uint64_t cur     = v.init;
            int rounds       = (op == HCA_WR_ATOMIC_CMP_SWP) ? 2 : 1;
            for (int round = 0; round < rounds; ++round) {
                uint64_t a = v.a;
                if ((op == HCA_WR_ATOMIC_CMP_SWP) && (round == 0)) {
                    a = v.init ^ 0x100;   /* does not match */
                }
                /* garbage above a 32-bit operand */
                uint64_t a_arg = is32 ? (a | 0xdead000000000000ull) : a;
                uint64_t s_arg = is32 ? (v.swap | 0xbeef000000000000ull)
                                      : v.swap;
                tx_snap s0     = snap(cn.qp);
                uint8_t res[24];
                memset(res, LSENTINEL, sizeof(res));
                ASSERT_EQ(0, fast_atomic_direct(cn.qp, op, size,
                                               d.addr + voff, rkey, a_arg,
                                               s_arg,
                                               fetch ? res + 8 : nullptr));
                tx_snap s1 = snap(cn.qp);
                EXPECT_EQ(1u, s1.ops[op] - s0.ops[op]);
                EXPECT_EQ(size, s1.bytes[op] - s0.bytes[op]);
                EXPECT_EQ(1u, s1.mapped - s0.mapped);
                uint64_t expect = atomic_result(op, cur, a, v.swap, mask);
                if (fetch) {
                    uint64_t old = 0;
                    memcpy(&old, res + 8, size);
                    EXPECT_EQ(cur, old) << std::hex << "fetched value";
                    EXPECT_EQ(-1, check_byte(res, 8, LSENTINEL));
                    EXPECT_EQ(-1, check_byte(res + 8 + size, 16 - size,
                                             LSENTINEL))
                            << "the old value took more than " << size
                            << " bytes";
                }
                uint8_t rem[64];
                ASSERT_EQ(0, t.read(d.id, base, rem, 64));
                uint64_t now = 0;
                memcpy(&now, rem + (voff - base), size);
                EXPECT_EQ(expect, now)
                        << std::hex << "target value: old 0x" << cur
                        << " operand 0x" << a << " swap 0x" << v.swap;
                EXPECT_EQ(-1, check_byte(rem, voff - base, SENTINEL))
                        << "bytes before the word changed";
                EXPECT_EQ(-1, check_byte(rem + (voff - base) + size,
                                         64 - (voff - base) - size, SENTINEL))
                        << "bytes after the word changed";
                cur = expect;
            }
        }
    }
    EXPECT_EQ(-1, t.check(d.id, (size_t)slot * 64, 4096 - (size_t)slot * 64,
                          BYTE(SENTINEL)));
    EXPECT_TRUE(expect_no_wc(cn.scq, 20)) << "a direct atomic made a CQE";
    EXPECT_EQ(0u, hca_qp_outstanding(cn.qp));
}

/* A long random sequence of atomics (all opcodes, both sizes, adjacent
 * words) and direct writes over the same MR, checked op by op against a
 * local model of the memory. */
TEST_P(DirectAtomic, RandomSequenceMatchesModel)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 128, &d));
    uint32_t rkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 128, ACCESS_ALL, &rkey), 0);

    uint8_t model[128];
    memset(model, SENTINEL, sizeof(model));
    struct word {
        size_t   off;
        unsigned size;
    } words[] = {{8, 8}, {16, 8}, {32, 4}, {36, 4}, {40, 4}, {120, 8}};
    std::mt19937_64 rng(12345);
    const int N = 3000;
    for (int i = 0; i < N; ++i) {
        const word &w       = words[rng() % 6];
        const uint64_t mask = size_mask(w.size);
        uint64_t cur        = 0;
        memcpy(&cur, model + w.off, w.size);
        unsigned pick = (unsigned)(rng() % 11);
        if (pick == 10) {
            uint64_t v = rng();
            ASSERT_EQ(0, fast_write_direct(cn.qp, &v, w.size, d.addr + w.off,
                                          rkey))
                    << "step " << i;
            memcpy(model + w.off, &v, w.size);
        } else {
            hca_wr_opcode_t op = all_atomic_ops[pick];
            uint64_t a         = rng();
            uint64_t s         = rng();
            if ((op == HCA_WR_ATOMIC_CMP_SWP) && (rng() % 2)) {
                a = cur | (rng() & ~mask);   /* matches */
            }
            uint64_t old = OLD_MARK;
            ASSERT_EQ(0, fast_atomic_direct(cn.qp, op, w.size, d.addr + w.off,
                                           rkey, a, s,
                                           is_fetching_op(op) ? &old
                                                              : nullptr))
                    << "step " << i << " " << op;
            if (is_fetching_op(op)) {
                /* size bytes stored: a 32-bit one keeps the upper half */
                uint64_t expect_old = (w.size == 4) ?
                        ((OLD_MARK & ~mask) | cur) : cur;
                ASSERT_EQ(expect_old, old)
                        << std::hex << "step " << std::dec << i << " " << op
                        << "/" << w.size * 8 << " at +" << w.off;
            }
            uint64_t nv = atomic_result(op, cur, a, s, mask);
            memcpy(model + w.off, &nv, w.size);
        }
        if ((i % 500 == 499) || (i == N - 1)) {
            uint8_t rem[64];
            for (size_t off = 0; off < 128; off += 64) {
                ASSERT_EQ(0, t.read(d.id, off, rem, 64));
                for (size_t k = 0; k < 64; ++k) {
                    ASSERT_EQ(model[off + k], rem[k])
                            << "byte " << (off + k) << " after step " << i;
                }
            }
        }
    }
    EXPECT_TRUE(expect_no_wc(cn.scq, 10));
}

/* A shm atomic has one route, whoever issues it: the fast op, the
 * doorbell's direct path (an unsignaled WR on an idle queue) and the WR's
 * execution (a signaled one) must agree.  A random sequence over device
 * memory (all three run in this process) and plain memory (the fast op
 * declines, the WRs reach the target: in this process, or by the peer's
 * responder), each op by a random route, checked op by op against a
 * local model: the fetched value, and every byte of both regions. */
TEST_P(DirectAtomic, EveryRouteSameResult)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    tbuf d, m;
    ASSERT_TRUE(make_buf(t, MEM_DM, 128, &d));
    ASSERT_TRUE(make_buf(t, MEM_MALLOC, 128, &m));
    uint32_t dkey = 0, mkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 128, ACCESS_ALL, &dkey), 0);
    ASSERT_GE(make_mr(t, e.tpd, m, 0, 128, ACCESS_ALL, &mkey), 0);
    ASSERT_EQ(0, t.fill(m.id, 0, 128, BYTE(SENTINEL)));
    alignas(8) static uint8_t res[16];
    hca_mr_t *lmr = e.c->reg(e.pd, res, sizeof(res), ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);

    uint8_t model[2][128];
    memset(model, SENTINEL, sizeof(model));
    const tbuf *bufs[2]    = {&d, &m};
    const uint32_t keys[2] = {dkey, mkey};
    struct word {
        size_t   off;
        unsigned size;
    } words[] = {{8, 8}, {16, 8}, {32, 4}, {36, 4}, {120, 8}};
    std::mt19937_64 rng(4242);
    const int N = 1500;
    int routes[2][3] = {};
    for (int i = 0; i < N; ++i) {
        const int which      = (int)(rng() % 2); /* 0 device, 1 plain */
        const word &w        = words[rng() % 5];
        const uint64_t mask  = size_mask(w.size);
        hca_wr_opcode_t op   = all_atomic_ops[rng() % 10];
        const int route      = (int)(rng() % 3);
        const bool fetch     = is_fetching_op(op);
        const uint64_t raddr = bufs[which]->addr + w.off;
        uint64_t cur = 0, a = rng(), s = rng();
        memcpy(&cur, model[which] + w.off, w.size);
        if ((op == HCA_WR_ATOMIC_CMP_SWP) && (rng() % 2)) {
            a = cur | (rng() & ~mask); /* matches */
        }
        SCOPED_TRACE("step " + std::to_string(i) + " route " +
                     std::to_string(route) + (which ? " plain " : " dm ") +
                     op_short_name(op) + "/" + std::to_string(w.size * 8));
        memset(res, LSENTINEL, sizeof(res));
        uint64_t old = 0;
        if (route == 0) {
            int rc = fast_atomic_direct(cn.qp, op, w.size, raddr,
                                        keys[which], a, s,
                                        fetch ? &old : nullptr);
            if (which == 1) {
                /* plain memory: not the fast op's, nothing done */
                ASSERT_EQ(-EAGAIN, rc);
                EXPECT_EQ(0u, old);
                continue;
            }
            ASSERT_EQ(0, rc);
        } else {
            hca_sge_t sg     = mk_sge(res, w.size, hca_mr_lkey(lmr));
            hca_send_wr_t wr = mk_wr(op, fetch ? &sg : nullptr,
                                     fetch ? 1 : 0,
                                     ((route == 2) ? HCA_SEND_SIGNALED : 0) |
                                     ((w.size == 4) ? HCA_SEND_ATOMIC32 : 0),
                                     0x5000 + i, raddr, keys[which]);
            wr.compare_add = a;
            wr.swap        = s;
            ASSERT_EQ(0, post_retry(cn.qp, &wr));
            if (route == 2) {
                ASSERT_TRUE(wait_ok(cn.scq, wr.wr_id, HCA_WC_ATOMIC));
            } else {
                /* done in the call, or queued for the peer's responder:
                 * then done when nothing is outstanding, with no CQE */
                for (int k = 0; (hca_qp_outstanding(cn.qp) != 0) &&
                                (k < TIMEOUT_MS * 10); ++k) {
                    progress_all();
                    usleep(100);
                }
                ASSERT_EQ(0u, hca_qp_outstanding(cn.qp));
            }
            memcpy(&old, res, w.size);
            EXPECT_EQ(-1, check_byte(res + w.size, sizeof(res) - w.size,
                                     LSENTINEL))
                    << "the old value took more than " << w.size << " bytes";
        }
        ++routes[which][route];
        if (fetch) {
            ASSERT_EQ(cur, old) << std::hex << "fetched value";
        }
        uint64_t nv = atomic_result(op, cur, a, s, mask);
        memcpy(model[which] + w.off, &nv, w.size);
        if ((i % 100 == 99) || (i == N - 1)) {
            for (int b = 0; b < 2; ++b) {
                uint8_t rem[128];
                ASSERT_EQ(0, t.read(bufs[b]->id, 0, rem, 64));
                ASSERT_EQ(0, t.read(bufs[b]->id, 64, rem + 64, 64));
                for (size_t k = 0; k < 128; ++k) {
                    ASSERT_EQ(model[b][k], rem[k])
                            << (b ? "plain" : "dm") << " byte " << k;
                }
            }
        }
    }
    for (int b = 0; b < 2; ++b) {
        for (int r = (b ? 1 : 0); r < 3; ++r) {
            EXPECT_GT(routes[b][r], 100) << "memory " << b << " route " << r;
        }
    }
    EXPECT_TRUE(expect_no_wc(cn.scq, 10)) << "an unsignaled atomic made a CQE";
}

/* -EAGAIN, nothing changed, *old_p untouched: misaligned addresses, every
 * non-atomic or invalid opcode, sizes other than 4 and 8, an MR without
 * REMOTE_ATOMIC, a target QP without it, plain memory, bad keys, words
 * partly outside the MR.  The QP keeps working; the WR path reports a
 * misaligned atomic with REM_ACCESS_ERR. */
TEST_P(DirectAtomic, Refused)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    tbuf d, m;
    ASSERT_TRUE(make_buf(t, MEM_DM, 4096, &d));
    ASSERT_TRUE(make_buf(t, MEM_MALLOC, 4096, &m));
    uint32_t rkey = 0, nakey = 0, smallkey = 0, mkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 1024, ACCESS_ALL, &rkey), 0);
    ASSERT_GE(make_mr(t, e.tpd, d, 1024, 1024,
                      ACCESS_ALL & ~HCA_ACCESS_REMOTE_ATOMIC, &nakey), 0);
    /* [2049, 2049 + 70): the words at 2048 and 2112 stick out by a byte */
    ASSERT_GE(make_mr(t, e.tpd, d, 2049, 70, ACCESS_ALL, &smallkey), 0);
    ASSERT_GE(make_mr(t, e.tpd, m, 0, 4096, ACCESS_ALL, &mkey), 0);
    conn cn;
    ASSERT_TRUE(e.connect(&cn));

    /* a valid one first, so that the key is cached */
    uint64_t old = 0;
    ASSERT_EQ(0, fast_atomic_direct(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                                   d.addr + 8, rkey, 0, 0, &old));
    EXPECT_EQ(0xa5a5a5a5a5a5a5a5ull, old);

    {
        SCOPED_TRACE("misaligned");
        for (hca_wr_opcode_t op : all_atomic_ops) {
            for (size_t k : {1, 2, 4, 7}) {
                expect_atomic_refused(cn.qp, op, 8, d.addr + 64 + k, rkey);
            }
            for (size_t k : {1, 2, 3}) {
                expect_atomic_refused(cn.qp, op, 4, d.addr + 64 + k, rkey);
            }
        }
    }
    {
        SCOPED_TRACE("not an atomic opcode");
        for (hca_wr_opcode_t op :
             {HCA_WR_SEND, HCA_WR_SEND_WITH_IMM, HCA_WR_RDMA_WRITE,
              HCA_WR_RDMA_WRITE_WITH_IMM, HCA_WR_RDMA_READ,
              HCA_WR_OPCODE_LAST, (hca_wr_opcode_t)1000,
              (hca_wr_opcode_t)-1}) {
            expect_atomic_refused(cn.qp, op, 8, d.addr + 64, rkey);
            expect_atomic_refused(cn.qp, op, 4, d.addr + 64, rkey);
        }
    }
    {
        SCOPED_TRACE("size");
        for (unsigned size : {0u, 1u, 2u, 3u, 5u, 6u, 7u, 16u, 32u}) {
            expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, size,
                                  d.addr + 64, rkey);
            expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_CMP_SWP, size,
                                  d.addr + 64, rkey);
        }
    }
    {
        SCOPED_TRACE("MR without REMOTE_ATOMIC");
        for (hca_wr_opcode_t op : all_atomic_ops) {
            expect_atomic_refused(cn.qp, op, 8, d.addr + 1024 + 64, nakey);
            expect_atomic_refused(cn.qp, op, 4, d.addr + 1024 + 64, nakey);
        }
        /* it does allow writes */
        uint64_t v = 0xa5a5a5a5a5a5a5a5ull;
        EXPECT_EQ(0, fast_write_direct(cn.qp, &v, 8, d.addr + 1024 + 64,
                                      nakey));
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                              d.addr + 1024 + 64, nakey);
    }
    {
        SCOPED_TRACE("word partly outside the MR");
        ASSERT_EQ(0, fast_atomic_direct(cn.qp, HCA_WR_ATOMIC_ADD, 8,
                                       d.addr + 2056, smallkey, 0, 0,
                                       nullptr));
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                              d.addr + 2048, smallkey);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 4,
                              d.addr + 2048, smallkey);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                              d.addr + 2112, smallkey);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 4,
                              d.addr + 2116, smallkey);
        ASSERT_EQ(0, fast_atomic_direct(cn.qp, HCA_WR_ATOMIC_ADD, 4,
                                       d.addr + 2112, smallkey, 0, 0,
                                       nullptr));
    }
    {
        SCOPED_TRACE("bad key, plain memory");
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8, d.addr + 64,
                              ~rkey);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8, d.addr + 64,
                              0);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8, d.addr + 64,
                              rkey ^ 0x100);
        expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8, m.addr + 64,
                              mkey);
        EXPECT_TRUE(untouched(t, m));
    }
    EXPECT_TRUE(untouched(t, d));
    {
        SCOPED_TRACE("target QP without REMOTE_ATOMIC");
        conn na;
        ASSERT_TRUE(e.connect(&na, REMOTE_ALL & ~HCA_ACCESS_REMOTE_ATOMIC));
        for (hca_wr_opcode_t op : all_atomic_ops) {
            expect_atomic_refused(na.qp, op, 8, d.addr + 64, rkey);
        }
        EXPECT_TRUE(untouched(t, d));
        /* writes are allowed by that QP */
        uint64_t v = 0xa5a5a5a5a5a5a5a5ull;
        EXPECT_EQ(0, fast_write_direct(na.qp, &v, 8, d.addr + 64, rkey));
    }
    /* the QP still works */
    old = 0;
    EXPECT_EQ(0, fast_atomic_direct(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8,
                                   d.addr + 64, rkey, 5, 0, &old));
    EXPECT_EQ(0xa5a5a5a5a5a5a5a5ull, old);
    EXPECT_EQ(0xa5a5a5a5a5a5a5aaull, read_word(t, d, 64, 8));
    write_word(t, d, 64, 8, 0xa5a5a5a5a5a5a5a5ull);
    EXPECT_EQ(HCA_QPS_RTS, hca_qp_state(cn.qp));
    EXPECT_TRUE(expect_no_wc(cn.scq, 10));
    /* the WR path reports what direct refused */
    EXPECT_EQ(HCA_WC_REM_ACCESS_ERR, wr_atomic(e, cn, 8, d.addr + 68, rkey, 9));
    EXPECT_TRUE(untouched(t, d));
}

INSTANTIATE_TEST_SUITE_P(Direct, DirectAtomic,
                         ::testing::Values(WHERE_CTX2, WHERE_SELF,
                                           WHERE_PROC),
                         where_param_name);


/* ============================================================ direct_ptr */

class DirectPtr : public direct_test {
};

/* fast_direct_ptr: our mapping of the range (reads see the target's data,
 * stores land exactly there), counted as the RDMA op; NULL and nothing
 * counted for what fast_write_direct refuses and for the right the MR or
 * the target QP lacks, or an access that is neither READ nor WRITE. */
TEST_P(DirectPtr, MapsOnlyWhatIsAllowed)
{
    ASSERT_TRUE(e.open(where()));
    target &t = *e.t;
    tbuf d, m;
    ASSERT_TRUE(make_buf(t, MEM_DM, 16384, &d));
    ASSERT_TRUE(make_buf(t, MEM_MALLOC, 4096, &m));
    uint32_t rwkey = 0, rokey = 0, wokey = 0, mkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 1024, 4096, ACCESS_ALL, &rwkey), 0);
    ASSERT_GE(make_mr(t, e.tpd, d, 8192, 1024, HCA_ACCESS_REMOTE_READ,
                      &rokey), 0);
    ASSERT_GE(make_mr(t, e.tpd, d, 12288, 1024,
                      HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE,
                      &wokey), 0);
    ASSERT_GE(make_mr(t, e.tpd, m, 0, 4096, ACCESS_ALL, &mkey), 0);
    ASSERT_EQ(0, t.fill(d.id, 1024, 4096, PAT(5)));
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    const unsigned R = HCA_ACCESS_REMOTE_READ, W = HCA_ACCESS_REMOTE_WRITE;

    tx_snap s0 = snap(cn.qp);
    uint8_t *p = (uint8_t*)fast_direct_ptr(cn.qp, d.addr + 1024, rwkey, 4096,
                                          R);
    ASSERT_NE(nullptr, p);
    EXPECT_EQ(-1, check_pattern(p, 4096, 5)) << "reads through the pointer";
    tx_snap s1 = snap(cn.qp);
    EXPECT_EQ(1u, s1.ops[HCA_WR_RDMA_READ] - s0.ops[HCA_WR_RDMA_READ]);
    EXPECT_EQ(4096u, s1.bytes[HCA_WR_RDMA_READ] - s0.bytes[HCA_WR_RDMA_READ]);
    EXPECT_EQ(1u, s1.mapped - s0.mapped);
    fast_direct_done(cn.qp);
    uint8_t *w = (uint8_t*)fast_direct_ptr(cn.qp, d.addr + 1124, rwkey, 64, W);
    ASSERT_NE(nullptr, w);
    EXPECT_EQ(p + 100, w);
    tx_snap s2 = snap(cn.qp);
    EXPECT_EQ(1u, s2.ops[HCA_WR_RDMA_WRITE] - s1.ops[HCA_WR_RDMA_WRITE]);
    EXPECT_EQ(64u, s2.bytes[HCA_WR_RDMA_WRITE] - s1.bytes[HCA_WR_RDMA_WRITE]);
    fill_pattern(w, 64, 9);
    fast_direct_done(cn.qp);
    EXPECT_EQ(-1, t.check(d.id, 1124, 64, PAT(9)));
    EXPECT_EQ(-1, t.check(d.id, 0, 1024, BYTE(SENTINEL)));
    EXPECT_EQ(-1, t.check(d.id, 5120, 16384 - 5120, BYTE(SENTINEL)));
    /* the exact bounds (each access ended before the next begins) */
    EXPECT_NE(nullptr, fast_direct_ptr(cn.qp, d.addr + 5119, rwkey, 1, W));
    fast_direct_done(cn.qp);
    EXPECT_NE(nullptr, fast_direct_ptr(cn.qp, d.addr + 8192, rokey, 1024, R));
    fast_direct_done(cn.qp);
    EXPECT_NE(nullptr, fast_direct_ptr(cn.qp, d.addr + 12288, wokey, 1024, W));
    fast_direct_done(cn.qp);

    struct nope {
        const char *name;
        uint64_t    raddr;
        uint32_t    rkey;
        size_t      len;
        unsigned    access;
    } cases[] = {
        {"read-only MR, WRITE", d.addr + 8192, rokey, 8, W},
        {"write-only MR, READ", d.addr + 12288, wokey, 8, R},
        {"one byte past the end", d.addr + 5120 - 7, rwkey, 8, R},
        {"one byte before", d.addr + 1023, rwkey, 8, W},
        {"longer than the MR", d.addr + 1024, rwkey, 4097, R},
        {"bad key", d.addr + 1024, ~rwkey, 8, R},
        {"zero key", d.addr + 1024, 0, 8, W},
        {"plain memory", m.addr, mkey, 8, R},
        {"atomic access", d.addr + 1024, rwkey, 8, HCA_ACCESS_REMOTE_ATOMIC},
        {"read and write", d.addr + 1024, rwkey, 8, R | W},
        {"no access", d.addr + 1024, rwkey, 8, 0},
    };
    for (const nope &x : cases) {
        SCOPED_TRACE(x.name);
        tx_snap a = snap(cn.qp);
        EXPECT_EQ(nullptr, fast_direct_ptr(cn.qp, x.raddr, x.rkey, x.len,
                                          x.access));
        EXPECT_TRUE(same_tx(a, snap(cn.qp)));
        EXPECT_EQ(HCA_QPS_RTS, hca_qp_state(cn.qp));
    }
    {
        SCOPED_TRACE("target QP without REMOTE_READ");
        conn nr;
        ASSERT_TRUE(e.connect(&nr, REMOTE_ALL & ~HCA_ACCESS_REMOTE_READ));
        EXPECT_EQ(nullptr, fast_direct_ptr(nr.qp, d.addr + 1024, rwkey, 8, R));
        EXPECT_NE(nullptr, fast_direct_ptr(nr.qp, d.addr + 1024, rwkey, 8, W));
        fast_direct_done(nr.qp);
    }
    {
        SCOPED_TRACE("QP in ERR");
        ASSERT_EQ(0, qp_to_state(cn.qp, HCA_QPS_ERR));
        EXPECT_EQ(nullptr, fast_direct_ptr(cn.qp, d.addr + 1024, rwkey, 8, R));
    }
    EXPECT_TRUE(untouched(t, m));
}

/* An access begun with fast_direct_ptr holds a deregistration of its MR
 * until fast_direct_done(); a later one is refused.  Both ways of marking
 * the access: the busy word, and (no membarrier) the pinned entry. */
TEST_P(DirectPtr, DeregWaitsForDone)
{
    for (unsigned fl : {0u, (unsigned)HCA_OPEN_NO_MEMBARRIER}) {
        SCOPED_TRACE(fl ? "pinned" : "busy word");
        direct_env e2;
        ASSERT_TRUE(e2.open(where(), fl));
        target &t = *e2.t;
        tbuf d;
        ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
        uint32_t rkey = 0;
        int m         = make_mr(t, e2.tpd, d, 0, 8192, ACCESS_ALL, &rkey);
        ASSERT_GE(m, 0);
        conn cn;
        ASSERT_TRUE(e2.connect(&cn));
        uint8_t *p = (uint8_t*)fast_direct_ptr(cn.qp, d.addr + 64, rkey, 64,
                                              HCA_ACCESS_REMOTE_WRITE);
        ASSERT_NE(nullptr, p);
        std::atomic<int> done{0};
        std::atomic<int> rc{1};
        std::thread th([&] {
            rc   = t.dereg(m);
            done = 1;
        });
        sleep_ms(50);
        EXPECT_EQ(0, done.load()) << "hca_mr_dereg returned during an access";
        fill_pattern(p, 64, 77);           /* the access itself */
        fast_direct_done(cn.qp);
        double end = now_ms() + TIMEOUT_MS;
        while (!done.load() && (now_ms() < end)) {
            sleep_ms(1);
        }
        EXPECT_EQ(1, done.load()) << "hca_mr_dereg still waits after done";
        th.join();
        EXPECT_EQ(0, rc.load());
        EXPECT_TRUE(buf_is(t, d, 64, 64, PAT(77)));
        EXPECT_EQ(nullptr, fast_direct_ptr(cn.qp, d.addr + 64, rkey, 64,
                                          HCA_ACCESS_REMOTE_WRITE));
        e2.close();
    }
}

INSTANTIATE_TEST_SUITE_P(Direct, DirectPtr,
                         ::testing::Values(WHERE_CTX2, WHERE_SELF,
                                           WHERE_PROC),
                         where_param_name);


/* ============================================================ processes */

class DirectProcs : public hca_test {
};

/* The child owns device memory and deregisters its MR while the parent
 * writes large blocks into it with fast_write_direct in a loop (each write
 * changes the block).  hca_mr_dereg promises that no byte lands after it
 * returns: the child samples the end of every block right after it
 * returned, and again later; then it fills the memory with a sentinel and
 * watches it.  The parent's next direct write is refused, and the WR path
 * reports REM_ACCESS_ERR. */
static void dereg_while_writing(unsigned writer_flags)
{
    const size_t BLK = 4ul << 20;
    const int NBLK   = 2;
    const size_t LEN = BLK * NBLK;
    child_t *ch = fork_child([BLK, NBLK, LEN](int rfd, int wfd) {
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        ctx c;
        ASSERT_TRUE(c.open());
        hca_pd_t *pd = c.new_pd();
        cqw *cq      = c.new_cq(64);
        ASSERT_NE(nullptr, cq);
        hca_qp_t *qp = c.new_qp(pd, cq, cq, c.caps(16));
        ASSERT_NE(nullptr, qp);
        uint8_t *b = c.alloc(MEM_DM, LEN);
        ASSERT_NE(nullptr, b);
        memset(b, 0, LEN);
        hca_mr_t *mr = c.reg(pd, b, LEN, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        ASSERT_EQ(0, connect_qp(qp, pp.addr, pp.qpn[0]));
        peer_info me;
        memset(&me, 0, sizeof(me));
        me.addr     = c.addr;
        me.qpn[0]   = hca_qp_num(qp);
        me.raddr[0] = (uint64_t)(uintptr_t)b;
        me.rkey[0]  = hca_mr_rkey(mr);
        ASSERT_TRUE(send_msg(wfd, me));
        ASSERT_TRUE(expect_token(rfd, 1));   /* writes are flowing */
        sleep_ms(5);
        ASSERT_EQ(0, c.dereg(mr));
        /* the last 64 bytes of every block, right after dereg returned */
        uint8_t s1[NBLK][64], s2[NBLK][64];
        for (int i = 0; i < NBLK; ++i) {
            memcpy(s1[i], b + (i + 1) * BLK - 64, 64);
        }
        sleep_ms(30);
        int changed = -1;
        for (int i = 0; i < NBLK; ++i) {
            memcpy(s2[i], b + (i + 1) * BLK - 64, 64);
            if ((changed < 0) && memcmp(s1[i], s2[i], 64)) {
                changed = i;
            }
        }
        EXPECT_EQ(-1, changed)
                << "block " << changed
                << " changed after hca_mr_dereg returned (a direct write "
                   "that passed the key check before the deregistration "
                   "was still copying)";
        memset(b, SENTINEL, LEN);
        ASSERT_TRUE(send_token(wfd, 2));
        double end  = now_ms() + 50;
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

    ctx c;
    ASSERT_TRUE(c.open(writer_flags));
    hca_pd_t *pd = c.new_pd();
    cqw *scq     = c.new_cq(64);
    ASSERT_NE(nullptr, scq);
    hca_qp_t *qp = c.new_qp(pd, scq, scq, c.caps(16));
    ASSERT_NE(nullptr, qp);
    uint8_t *src = c.alloc(MEM_MALLOC, 2 * BLK);
    ASSERT_NE(nullptr, src);
    fill_pattern(src, BLK, 1);
    fill_pattern(src + BLK, BLK, 2);
    hca_mr_t *smr = c.reg(pd, src, 2 * BLK, ACCESS_ALL);
    ASSERT_NE(nullptr, smr);
    peer_info me;
    memset(&me, 0, sizeof(me));
    me.addr   = c.addr;
    me.qpn[0] = hca_qp_num(qp);
    ASSERT_TRUE(send_msg(ch->wfd, me));
    peer_info pi;
    ASSERT_TRUE(recv_msg(ch->rfd, &pi));
    ASSERT_EQ(0, connect_qp(qp, pi.addr, pi.qpn[0]));

    uint64_t k = 0, ok = 0;
    int rc     = 0;
    double end = now_ms() + TIMEOUT_MS;
    for (;; ++k) {
        ASSERT_LT(now_ms(), end) << "the child never deregistered";
        /* block k % NBLK alternately gets the two patterns */
        rc = fast_write_direct(qp, src + ((k / NBLK) % 2) * BLK, BLK,
                              pi.raddr[0] + (k % NBLK) * BLK, pi.rkey[0]);
        if (rc != 0) {
            break;
        }
        if (++ok == 1) {
            ASSERT_TRUE(send_token(ch->wfd, 1));
        }
    }
    EXPECT_EQ(-EAGAIN, rc);
    EXPECT_GE(ok, 1u);
    ASSERT_TRUE(expect_token(ch->rfd, 2));
    expect_write_refused(qp, src, 64, pi.raddr[0], pi.rkey[0]);
    hca_sge_t sg     = mk_sge(src, 64, hca_mr_lkey(smr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &sg, 1, HCA_SEND_SIGNALED, 9,
                             pi.raddr[0], pi.rkey[0]);
    ASSERT_EQ(0, post_retry(qp, &wr));
    EXPECT_TRUE(wait_status(scq, 9, HCA_WC_REM_ACCESS_ERR));
    ASSERT_TRUE(send_token(ch->wfd, 3));
    EXPECT_TRUE(expect_token(ch->rfd, 4));
    EXPECT_TRUE(wait_child(ch));
}

/* The writer marks its accesses with its busy word (the owner's dereg
 * runs membarrier and waits for it) ... */
TEST_F(DirectProcs, DeregWhileWriting)
{
    dereg_while_writing(0);
}

/* ... or, without membarrier, pins the MPT entry. */
TEST_F(DirectProcs, DeregWhileWritingPinned)
{
    dereg_while_writing(HCA_OPEN_NO_MEMBARRIER);
}

/* The target process dies: once hca_qp_check_peer found it gone (QP in
 * ERR) direct operations are refused; nothing crashes. */
TEST_F(DirectProcs, DeadPeer)
{
    direct_env e;
    ASSERT_TRUE(e.open(WHERE_PROC));
    target &t = *e.t;
    conn cn;
    ASSERT_TRUE(e.connect(&cn));
    tbuf d;
    ASSERT_TRUE(make_buf(t, MEM_DM, 8192, &d));
    uint32_t rkey = 0;
    ASSERT_GE(make_mr(t, e.tpd, d, 0, 8192, ACCESS_ALL, &rkey), 0);
    ASSERT_EQ(0, fast_write_direct(cn.qp, e.src, 64, d.addr, rkey));
    EXPECT_TRUE(buf_is(t, d, 0, 64, PAT(SRC_SEED)));
    kill_child(e.rt->child);
    e.rt->dead = true;
    EXPECT_EQ(0, hca_qp_check_peer(cn.qp));
    EXPECT_EQ(HCA_QPS_ERR, hca_qp_state(cn.qp));
    expect_write_refused(cn.qp, e.src, 64, d.addr, rkey);
    expect_atomic_refused(cn.qp, HCA_WR_ATOMIC_FETCH_ADD, 8, d.addr + 64,
                          rkey);
    e.close();
}


/* ============================================================ contention */

typedef std::tuple<bool, bool> contention_param;   /* 32-bit, owner joins */

class DirectContention
    : public hca_test,
      public ::testing::WithParamInterface<contention_param> {
};

/* Two children do N direct FETCH_ADD(1) each on one word of the parent's
 * device memory (with "owner joins", the parent does N more through a QP
 * connected to itself, and every 8th op of the children goes through the
 * WR path).  They start together (spinning on a "go" word) and a child
 * goes on past N until the other's ops interleaved with its own 1000 times
 * (at most 200 ms), so that the operations really contend.  The final
 * value is exact and the old values returned are exactly
 * init .. init + total - 1, each once. */
TEST_P(DirectContention, FetchAddExact)
{
    const bool is32        = std::get<0>(GetParam());
    const bool owner_joins = std::get<1>(GetParam());
    const unsigned size    = is32 ? 4 : 8;
    const int N            = 20000;
    const size_t GOFF      = 0;    /* the go word (8 bytes) */
    const size_t VOFF      = 16;   /* the counter */
    const uint64_t init    = is32 ? 0xffffb000ull : 0x00000000ffffb000ull;
    const uint64_t mask    = size_mask(size);

    struct result_hdr {
        int32_t n;
        int32_t failed;
    };
    auto body = [size, N, owner_joins, mask](int rfd, int wfd) {
        peer_info pp;
        ASSERT_TRUE(recv_msg(rfd, &pp));
        ctx c;
        ASSERT_TRUE(c.open());
        hca_pd_t *pd = c.new_pd();
        cqw *cq      = c.new_cq(64);
        ASSERT_NE(nullptr, cq);
        hca_qp_t *qp = c.new_qp(pd, cq, cq, c.caps(16));
        ASSERT_NE(nullptr, qp);
        uint8_t *res = c.alloc(MEM_MALLOC, 64);
        ASSERT_NE(nullptr, res);
        hca_mr_t *mr = c.reg(pd, res, 64, ACCESS_ALL);
        ASSERT_NE(nullptr, mr);
        ASSERT_EQ(0, connect_qp(qp, pp.addr, pp.qpn[0]));
        peer_info me;
        memset(&me, 0, sizeof(me));
        me.addr   = c.addr;
        me.qpn[0] = hca_qp_num(qp);
        ASSERT_TRUE(send_msg(wfd, me));
        ASSERT_TRUE(expect_token(rfd, 1));
        std::vector<uint64_t> olds;
        olds.reserve(4 * (size_t)N);
        /* wait for go (a plain load through our mapping) */
        void *gp = nullptr;
        ASSERT_EQ(0, hca_qp_rkey_ptr(qp, pp.raddr[1], pp.rkey[0], 8, &gp));
        double end = now_ms() + TIMEOUT_MS;
        while (__atomic_load_n((uint64_t*)gp, __ATOMIC_ACQUIRE) == 0) {
            ASSERT_LT(now_ms(), end) << "no go";
        }
        int failed   = 0;
        int jumps    = 0;
        double stop  = now_ms() + 200;
        for (int i = 0; (i < N) || ((jumps < 1000) && (now_ms() < stop));
             ++i) {
            uint64_t old = 0;
            if (owner_joins && (i % 8 == 7)) {
                hca_sge_t sg     = mk_sge(res, size, hca_mr_lkey(mr));
                hca_send_wr_t wr = mk_wr(HCA_WR_ATOMIC_FETCH_ADD, &sg, 1,
                                         HCA_SEND_SIGNALED |
                                                 ((size == 4)
                                                          ? HCA_SEND_ATOMIC32
                                                          : 0),
                                         (uint64_t)i, pp.raddr[0],
                                         pp.rkey[0]);
                wr.compare_add   = 1;
                memset(res, 0, 8);
                if ((post_retry(qp, &wr) != 0) ||
                    !wait_ok(cq, (uint64_t)i, HCA_WC_ATOMIC)) {
                    ++failed;
                    continue;
                }
                memcpy(&old, res, size);
            } else if (fast_atomic_direct(qp, HCA_WR_ATOMIC_FETCH_ADD, size,
                                         pp.raddr[0], pp.rkey[0], 1, 0,
                                         &old) != 0) {
                ++failed;
                continue;
            }
            if (!olds.empty() && (((old - olds.back()) & mask) != 1)) {
                ++jumps;
            }
            olds.push_back(old);
        }
        EXPECT_EQ(0, failed) << "fetch-adds that failed";
        result_hdr h = {(int32_t)olds.size(), failed};
        ASSERT_TRUE(send_msg(wfd, h));
        ASSERT_TRUE(write_all(wfd, olds.data(), olds.size() * 8));
        ASSERT_TRUE(expect_token(rfd, 2));
    };
    child_t *c1 = fork_child(body);
    child_t *c2 = fork_child(body);
    ASSERT_NE(nullptr, c1);
    ASSERT_NE(nullptr, c2);

    ctx c;
    ASSERT_TRUE(c.open());
    hca_pd_t *pd = c.new_pd();
    uint8_t *b   = c.alloc(MEM_DM, 64);
    ASSERT_NE(nullptr, b) << c.alloc_err;
    memset(b, SENTINEL, 64);
    memset(b + GOFF, 0, 8);
    memcpy(b + VOFF, &init, size);
    hca_mr_t *mr = c.reg(pd, b, 64, ACCESS_ALL);
    ASSERT_NE(nullptr, mr);
    child_t *ch[2] = {c1, c2};
    for (int i = 0; i < 2; ++i) {
        cqw *cq      = c.new_cq(64);
        hca_qp_t *qp = c.new_qp(pd, cq, cq, c.caps(16));
        ASSERT_NE(nullptr, qp);
        peer_info me;
        memset(&me, 0, sizeof(me));
        me.addr     = c.addr;
        me.qpn[0]   = hca_qp_num(qp);
        me.raddr[0] = (uint64_t)(uintptr_t)(b + VOFF);
        me.raddr[1] = (uint64_t)(uintptr_t)(b + GOFF);
        me.rkey[0]  = hca_mr_rkey(mr);
        ASSERT_TRUE(send_msg(ch[i]->wfd, me));
        peer_info pi;
        ASSERT_TRUE(recv_msg(ch[i]->rfd, &pi));
        ASSERT_EQ(0, connect_qp(qp, pi.addr, pi.qpn[0]));
    }
    /* the owner's own requester: a QP connected to a QP of its context */
    hca_qp_t *lq = nullptr;
    if (owner_joins) {
        cqw *cq      = c.new_cq(64);
        lq           = c.new_qp(pd, cq, cq, c.caps(16));
        hca_qp_t *tq = c.new_qp(pd, cq, cq, c.caps(16));
        ASSERT_NE(nullptr, tq);
        ASSERT_EQ(0, connect_qp(lq, c.addr, hca_qp_num(tq)));
        ASSERT_EQ(0, connect_qp(tq, c.addr, hca_qp_num(lq)));
    }
    ASSERT_TRUE(send_token(c1->wfd, 1));
    ASSERT_TRUE(send_token(c2->wfd, 1));
    sleep_ms(2);   /* both spinning on go */
    __atomic_store_n((uint64_t*)(b + GOFF), 1, __ATOMIC_SEQ_CST);

    std::vector<uint64_t> all;
    if (owner_joins) {
        int failed = 0;
        for (int i = 0; i < N; ++i) {
            uint64_t old = 0;
            if (fast_atomic_direct(lq, HCA_WR_ATOMIC_FETCH_ADD, size,
                                  (uint64_t)(uintptr_t)(b + VOFF),
                                  hca_mr_rkey(mr), 1, 0, &old) != 0) {
                ++failed;
                continue;
            }
            all.push_back(old);
        }
        EXPECT_EQ(0, failed) << "the owner's direct fetch-adds that failed";
    }
    size_t jumps = 0;
    for (int i = 0; i < 2; ++i) {
        result_hdr h = {0, 0};
        ASSERT_TRUE(recv_msg(ch[i]->rfd, &h, 4 * TIMEOUT_MS))
                << "child " << i << " did not finish";
        ASSERT_GE(h.n, N);
        EXPECT_EQ(0, h.failed);
        std::vector<uint64_t> v((size_t)h.n);
        ASSERT_TRUE(read_all(ch[i]->rfd, v.data(), v.size() * 8));
        /* each child's own values increase */
        for (size_t j = 1; j < v.size(); ++j) {
            uint64_t step = (v[j] - v[j - 1]) & mask;
            ASSERT_NE(0u, step) << "child " << i << ": the same old value "
                                   "twice in a row at op " << j;
            ASSERT_LT(step, (uint64_t)1 << 30)
                    << "child " << i << ": fetched values went back at op "
                    << j;
            jumps += (step != 1);
        }
        all.insert(all.end(), v.begin(), v.end());
        ASSERT_TRUE(send_token(ch[i]->wfd, 2));
    }
    EXPECT_TRUE(wait_child(c1));
    EXPECT_TRUE(wait_child(c2));
    EXPECT_GT(jumps, 0u) << "the children's operations never interleaved: "
                            "nothing contended";

    const uint64_t total = all.size();
    ASSERT_GE(total, owner_joins ? 3ull * N : 2ull * N);
    uint64_t now = 0;
    memcpy(&now, b + VOFF, size);
    EXPECT_EQ((init + total) & mask, now)
            << "lost or extra updates (" << total << " fetch-adds)";
    EXPECT_EQ(-1, check_byte(b + 8, VOFF - 8, SENTINEL));
    EXPECT_EQ(-1, check_byte(b + VOFF + size, 64 - VOFF - size, SENTINEL))
            << "an atomic spilled into the next bytes";
    /* the old values are exactly init .. init + total - 1, once each */
    std::vector<uint64_t> rel(all.size());
    for (size_t i = 0; i < all.size(); ++i) {
        rel[i] = (all[i] - init) & mask;
    }
    std::sort(rel.begin(), rel.end());
    size_t dups = 0, out = 0;
    for (size_t i = 0; i < rel.size(); ++i) {
        if ((i > 0) && (rel[i] == rel[i - 1])) {
            ++dups;
        }
        if (rel[i] >= total) {
            ++out;
        }
    }
    EXPECT_EQ(0u, dups) << "old values returned twice";
    EXPECT_EQ(0u, out) << "old values outside [init, init + total)";
}

INSTANTIATE_TEST_SUITE_P(
        Direct, DirectContention,
        ::testing::Combine(::testing::Bool(), ::testing::Bool()),
        [](const ::testing::TestParamInfo<contention_param> &i) {
            return std::string(std::get<0>(i.param) ? "32" : "64") +
                   (std::get<1>(i.param) ? "_owner_joins" : "");
        });
