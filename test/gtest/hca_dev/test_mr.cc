/*
 * test_mr.cc - protection domains, memory regions and their keys, device
 * memory, rkey_ptr, and the MPT checks between two QPs of one process.
 */
#include "test_common.h"

#include <set>

using namespace hcat;

class Mr : public hca_test {
protected:
    ctx c;

    void SetUp() override
    {
        hca_test::SetUp();
        ASSERT_TRUE(c.open());
    }
};

TEST_F(Mr, PdAllocDealloc)
{
    hca_pd_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(0, hca_pd_alloc(c.dev, &a));
    ASSERT_EQ(0, hca_pd_alloc(c.dev, &b));
    EXPECT_NE(nullptr, a);
    EXPECT_NE(a, b);
    EXPECT_EQ(0, hca_pd_dealloc(a));
    EXPECT_EQ(0, hca_pd_dealloc(b));
}

TEST_F(Mr, PdBusyWhileUsed)
{
    hca_pd_t *pd = nullptr;
    ASSERT_EQ(0, hca_pd_alloc(c.dev, &pd));
    uint8_t buf[256];
    hca_mr_t *mr = nullptr;
    ASSERT_EQ(0, hca_mr_reg(pd, buf, sizeof(buf), ACCESS_ALL, &mr));
    EXPECT_EQ(-EBUSY, hca_pd_dealloc(pd)) << "an MR uses the PD";
    ASSERT_EQ(0, hca_mr_dereg(mr));

    cqw *cq      = c.new_cq(64);
    ASSERT_NE(nullptr, cq);
    hca_qp_t *qp = c.new_qp(pd, cq, cq);
    ASSERT_NE(nullptr, qp);
    EXPECT_EQ(-EBUSY, hca_pd_dealloc(pd)) << "a QP uses the PD";
    ASSERT_EQ(0, c.destroy_qp(qp));
    EXPECT_EQ(0, hca_pd_dealloc(pd));
}

TEST_F(Mr, RegDereg)
{
    hca_pd_t *pd = c.new_pd();
    ASSERT_NE(nullptr, pd);
    std::vector<uint8_t> mem(1 << 20);
    const unsigned acc[] = {0,
                            HCA_ACCESS_LOCAL_WRITE,
                            HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE,
                            HCA_ACCESS_REMOTE_READ,
                            HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_ATOMIC,
                            ACCESS_ALL};
    std::set<uint32_t> lkeys, rkeys;
    std::vector<hca_mr_t*> mrs;
    for (int i = 0; i < 64; ++i) {
        hca_mr_t *mr = nullptr;
        /* overlapping regions are allowed */
        ASSERT_EQ(0, hca_mr_reg(pd, mem.data() + i * 1000, 4096 + i,
                                acc[i % 6], &mr))
                << i;
        ASSERT_NE(nullptr, mr);
        EXPECT_TRUE(lkeys.insert(hca_mr_lkey(mr)).second)
                << "duplicate lkey among live MRs";
        EXPECT_TRUE(rkeys.insert(hca_mr_rkey(mr)).second)
                << "duplicate rkey among live MRs";
        mrs.push_back(mr);
    }
    for (auto *mr : mrs) {
        EXPECT_EQ(0, hca_mr_dereg(mr));
    }
}

TEST_F(Mr, RegZeroLength)
{
    hca_pd_t *pd = c.new_pd();
    ASSERT_NE(nullptr, pd);
    uint8_t b[8];
    hca_mr_t *mr = nullptr;
    ASSERT_EQ(0, hca_mr_reg(pd, b, 0, ACCESS_ALL, &mr));
    ASSERT_NE(nullptr, mr);
    hca_mr_t *mr2 = nullptr;
    ASSERT_EQ(0, hca_mr_reg(pd, b + 3, 0, ACCESS_ALL, &mr2));
    EXPECT_NE(hca_mr_rkey(mr), hca_mr_rkey(mr2));
    EXPECT_EQ(0, hca_mr_dereg(mr));
    EXPECT_EQ(0, hca_mr_dereg(mr2));
}

/* A deregistered MPT entry that is reused gets new keys: no key of a
 * deregistered MR is ever handed out again (within this test). */
TEST_F(Mr, KeysChangeOnReuse)
{
    hca_pd_t *pd = c.new_pd();
    ASSERT_NE(nullptr, pd);
    std::vector<uint8_t> mem(65536);
    std::set<uint32_t> old_l, old_r;

    hca_mr_t *keep = nullptr;   /* a live neighbour */
    ASSERT_EQ(0, hca_mr_reg(pd, mem.data(), 100, ACCESS_ALL, &keep));
    for (int i = 0; i < 200; ++i) {
        hca_mr_t *mr = nullptr;
        ASSERT_EQ(0, hca_mr_reg(pd, mem.data() + (i % 7), 4096, ACCESS_ALL,
                                &mr));
        uint32_t l = hca_mr_lkey(mr), r = hca_mr_rkey(mr);
        EXPECT_EQ(0u, old_l.count(l)) << "lkey 0x" << std::hex << l
                                      << " reused after deregistration";
        EXPECT_EQ(0u, old_r.count(r)) << "rkey 0x" << std::hex << r
                                      << " reused after deregistration";
        EXPECT_NE(hca_mr_rkey(keep), r);
        old_l.insert(l);
        old_r.insert(r);
        ASSERT_EQ(0, hca_mr_dereg(mr));
    }
    EXPECT_EQ(0, hca_mr_dereg(keep));
}

TEST_F(Mr, DmAllocFree)
{
    const size_t sizes[] = {1, 64, 4096, 65537, 1 << 20};
    for (size_t s : sizes) {
        if (s > c.attr.max_dm_size) {
            continue;
        }
        hca_dm_t *dm = nullptr;
        ASSERT_EQ(0, hca_dm_alloc(c.dev, s, &dm)) << s;
        ASSERT_NE(nullptr, dm);
        uint8_t *p = (uint8_t*)hca_dm_addr(dm);
        ASSERT_NE(nullptr, p);
        EXPECT_GE(hca_dm_length(dm), s);
        fill_pattern(p, s, s);
        EXPECT_EQ(-1, check_pattern(p, s, s));
        EXPECT_EQ(0, hca_dm_free(dm));
    }
}

/* Freed while an MR inside it is still registered (a registration cache
 * above holds a region of it): the memory stays mapped and its key valid
 * until that MR is deregistered, then goes (AddressSanitizer's leak check
 * sees it go). */
TEST_F(Mr, DmFreedWhileAnMrInsideIsHeldGoesWithIt)
{
    const size_t s = 1 << 16;
    hca_dm_t *dm = nullptr;
    ASSERT_EQ(0, hca_dm_alloc(c.dev, s, &dm));
    uint8_t *p = (uint8_t*)hca_dm_addr(dm);
    hca_pd_t *pd = nullptr;
    ASSERT_EQ(0, hca_pd_alloc(c.dev, &pd));
    hca_mr_t *mr = nullptr;
    ASSERT_EQ(0, hca_mr_reg(pd, p + 4096, 8192, ACCESS_ALL, &mr));
    EXPECT_EQ(0, hca_dm_free(dm)) << "refused with an MR inside";
    fill_pattern(p + 4096, 8192, 7); /* still mapped */
    EXPECT_EQ(-1, check_pattern(p + 4096, 8192, 7));
    EXPECT_NE(0u, hca_mr_rkey(mr));
    EXPECT_EQ(0, hca_mr_dereg(mr)); /* and now the memory goes */
    EXPECT_EQ(0, hca_pd_dealloc(pd));
}

TEST_F(Mr, DmTooLarge)
{
    if (c.attr.max_dm_size >= (1ull << 46)) {
        GTEST_SKIP() << "max_dm_size is unbounded";
    }
    hca_dm_t *dm = nullptr;
    EXPECT_LT(hca_dm_alloc(c.dev, c.attr.max_dm_size + 1, &dm), 0);
}

TEST_F(Mr, DmMany)
{
    uint32_t n = std::min<uint32_t>(c.attr.max_dm, 32);
    std::vector<hca_dm_t*> dms;
    std::set<void*> addrs;
    for (uint32_t i = 0; i < n; ++i) {
        hca_dm_t *dm = nullptr;
        ASSERT_EQ(0, hca_dm_alloc(c.dev, 4096, &dm)) << i;
        EXPECT_TRUE(addrs.insert(hca_dm_addr(dm)).second);
        memset(hca_dm_addr(dm), (int)i, 4096);
        dms.push_back(dm);
    }
    for (uint32_t i = 0; i < n; ++i) {
        EXPECT_EQ(-1, check_byte(hca_dm_addr(dms[i]), 4096, (uint8_t)i))
                << "device memory objects overlap";
    }
    for (auto *dm : dms) {
        EXPECT_EQ(0, hca_dm_free(dm));
    }
}

TEST_F(Mr, DmRegister)
{
    uint8_t *p = c.alloc(MEM_DM, 1 << 20);
    ASSERT_NE(nullptr, p) << c.alloc_err;
    hca_pd_t *pd = c.new_pd();
    ASSERT_NE(nullptr, pd);
    /* whole object, a part of it, and an unaligned part */
    EXPECT_NE(nullptr, c.reg(pd, p, 1 << 20, ACCESS_ALL));
    EXPECT_NE(nullptr, c.reg(pd, p + 4096, 8192, ACCESS_ALL));
    EXPECT_NE(nullptr, c.reg(pd, p + 3, 1001, HCA_ACCESS_REMOTE_READ));
}

/* rkey_ptr: a peer's MR in device memory gives a local pointer. */
TEST_F(Mr, RkeyPtr)
{
    local_target t;
    ASSERT_TRUE(t.open());
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    uint64_t da = 0, ma = 0;
    int db = t.buf(MEM_DM, 8192, &da);
    int mb = t.buf(MEM_MALLOC, 8192, &ma);
    ASSERT_GE(db, 0);
    ASSERT_GE(mb, 0);
    uint32_t dkey = 0, mkey = 0;
    ASSERT_GE(t.mr(cn.tpd, db, 1024, 4096, ACCESS_ALL, &dkey), 0);
    ASSERT_GE(t.mr(cn.tpd, mb, 1024, 4096, ACCESS_ALL, &mkey), 0);
    ASSERT_EQ(0, t.fill(db, 0, 8192, BYTE(SENTINEL)));

    void *p = nullptr;
    ASSERT_EQ(0, hca_qp_rkey_ptr(cn.qp, da + 1024 + 100, dkey, 1000, &p));
    ASSERT_NE(nullptr, p);
    fill_pattern(p, 1000, 42);
    EXPECT_EQ(-1, t.check(db, 1124, 1000, PAT(42)))
            << "a store through rkey_ptr is not visible to the owner";
    EXPECT_EQ(-1, t.check(db, 0, 1124, BYTE(SENTINEL)));
    EXPECT_EQ(-1, t.check(db, 2124, 8192 - 2124, BYTE(SENTINEL)));

    /* the whole MR */
    EXPECT_EQ(0, hca_qp_rkey_ptr(cn.qp, da + 1024, dkey, 4096, &p));
    /* plain memory is not device memory */
    EXPECT_EQ(-ENOENT, hca_qp_rkey_ptr(cn.qp, ma + 1024, mkey, 16, &p));
    /* key and range checks */
    EXPECT_EQ(-EACCES, hca_qp_rkey_ptr(cn.qp, da + 1024, ~dkey, 16, &p));
    EXPECT_EQ(-EACCES, hca_qp_rkey_ptr(cn.qp, da + 1023, dkey, 16, &p));
    EXPECT_EQ(-EACCES, hca_qp_rkey_ptr(cn.qp, da + 1024 + 4096 - 15, dkey, 16,
                                       &p));
    EXPECT_EQ(-EACCES, hca_qp_rkey_ptr(cn.qp, da + 1024, dkey, 4097, &p));
}

/* hca_mr_revoke (the registration cache's memory hook) and
 * hca_mr_invalidate (its INVALIDATE deregistration): after either, a
 * remote access with the key is refused and writes nothing, on the WR path
 * and the direct one, while the MR stays allocated; hca_mr_dereg then
 * frees it, and a new registration gets a new key. */
TEST_F(Mr, RevokeAndInvalidateEndRemoteAccess)
{
    local_target t;
    ASSERT_TRUE(t.open());
    hca_pd_t *pd = c.new_pd();
    ASSERT_NE(nullptr, pd);
    int tpd = t.pd();
    ASSERT_GE(tpd, 0);
    uint8_t *lb = c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, lb);
    hca_mr_t *lmr = c.reg(pd, lb, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);
    fill_pattern(lb, 64, 5);
    for (int kind : {MEM_MALLOC, MEM_DM}) {
        for (int how = 0; how < 2; ++how) {
            SCOPED_TRACE(std::string(kind == MEM_DM ? "dm, " : "malloc, ") +
                         (how ? "invalidate" : "revoke"));
            uint64_t ra = 0;
            int rb = t.buf((mem_kind_t)kind, 4096, &ra);
            ASSERT_GE(rb, 0);
            uint32_t rkey = 0;
            int m = t.mr(tpd, rb, 0, 4096, ACCESS_ALL, &rkey);
            ASSERT_GE(m, 0);
            ASSERT_EQ(0, t.fill(rb, 0, 4096, BYTE(SENTINEL)));
            conn direct, wrc;
            ASSERT_TRUE(make_conn(c, t, &direct, tpd, REMOTE_ALL, pd));
            ASSERT_TRUE(make_conn(c, t, &wrc, tpd, REMOTE_ALL, pd));
            if (kind == MEM_DM) { /* the direct path works before */
                ASSERT_EQ(0, fast_write_direct(direct.qp, lb, 8, ra, rkey));
                ASSERT_EQ(0, t.fill(rb, 0, 4096, BYTE(SENTINEL)));
            }
            if (how) {
                hca_mr_invalidate(t.mrs[m]);
                hca_mr_invalidate(t.mrs[m]); /* idempotent */
            } else {
                hca_mr_revoke(t.mrs[m]);
            }
            EXPECT_NE(0, fast_write_direct(direct.qp, lb, 64, ra, rkey));
            hca_sge_t s      = mk_sge(lb, 64, hca_mr_lkey(lmr));
            hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &s, 1,
                                     HCA_SEND_SIGNALED, 1, ra, rkey);
            ASSERT_EQ(0, post_retry(wrc.qp, &wr));
            ASSERT_TRUE(wait_status(wrc.scq, 1, HCA_WC_REM_ACCESS_ERR));
            EXPECT_EQ(-1, t.check(rb, 0, 4096, BYTE(SENTINEL)));
            ASSERT_EQ(0, t.dereg(m));
            uint32_t nkey = 0;
            ASSERT_GE(t.mr(tpd, rb, 0, 4096, ACCESS_ALL, &nkey), 0);
            EXPECT_NE(rkey, nkey);
        }
    }
}

/* The MPT checks against a target in this process (and in another one, on
 * every fabric) are Ops/Mpt.Check in test_ops.cc. */

/* A key of one device context means nothing to another one: an rkey that
 * is valid in the requester's own context is unknown at the target. */
TEST_F(Mr, KeyOfOtherContext)
{
    local_target t;
    ASSERT_TRUE(t.open());
    conn cn;
    ASSERT_TRUE(make_conn(c, t, &cn));
    uint8_t *lb = c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, lb);
    hca_mr_t *lmr = c.reg(cn.pd, lb, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, lmr);
    uint64_t ra = 0;
    int rb = t.buf(MEM_MALLOC, 4096, &ra);
    ASSERT_GE(rb, 0);
    uint32_t rkey = 0;
    ASSERT_GE(t.mr(cn.tpd, rb, 0, 4096, ACCESS_ALL, &rkey), 0);
    ASSERT_EQ(0, t.fill(rb, 0, 4096, BYTE(SENTINEL)));
    /* the local MR's rkey used on the target's address */
    uint32_t k = hca_mr_rkey(lmr);
    if (k == rkey) {
        GTEST_SKIP() << "both contexts gave the same key value";
    }
    fill_pattern(lb, 64, 3);
    hca_sge_t s      = mk_sge(lb, 64, hca_mr_lkey(lmr));
    hca_send_wr_t wr = mk_wr(HCA_WR_RDMA_WRITE, &s, 1, HCA_SEND_SIGNALED, 1,
                             ra, k);
    ASSERT_EQ(0, post_retry(cn.qp, &wr));
    ASSERT_TRUE(wait_status(cn.scq, 1, HCA_WC_REM_ACCESS_ERR));
    EXPECT_EQ(-1, t.check(rb, 0, 4096, BYTE(SENTINEL)));
}

/* hca_mr_dm_id: the device memory id and owner base of an MR in device
 * memory; 0 for plain memory. */
TEST_F(Mr, DmId)
{
    hca_pd_t *pd = c.new_pd();
    uint8_t *d1  = c.alloc(MEM_DM, 65536);
    uint8_t *d2  = c.alloc(MEM_DM, 4096);
    uint8_t *m   = c.alloc(MEM_MALLOC, 4096);
    ASSERT_NE(nullptr, d1);
    ASSERT_NE(nullptr, d2);
    hca_mr_t *r1 = c.reg(pd, d1 + 100, 1000, ACCESS_ALL);
    hca_mr_t *r2 = c.reg(pd, d2, 4096, ACCESS_ALL);
    hca_mr_t *rm = c.reg(pd, m, 4096, ACCESS_ALL);
    ASSERT_NE(nullptr, rm);
    uint64_t base1 = 0, base2 = 0, basem = 12345;
    uint32_t id1   = hca_mr_dm_id(r1, &base1);
    uint32_t id2   = hca_mr_dm_id(r2, &base2);
    EXPECT_NE(0u, id1);
    EXPECT_NE(0u, id2);
    EXPECT_NE(id1, id2);
    EXPECT_EQ((uint64_t)(uintptr_t)d1, base1) << "base of the dm, not the MR";
    EXPECT_EQ((uint64_t)(uintptr_t)d2, base2);
    EXPECT_EQ(0u, hca_mr_dm_id(rm, &basem));
}

/* hca_dm_view: another context's device memory mapped here, and every
 * pointer checked as any access is: key (index and tag), state, rights,
 * range.  A pointer handed out stays mapped after the MR is gone. */
TEST_F(Mr, DmView)
{
    ctx o;
    ASSERT_TRUE(o.open());
    hca_pd_t *pd = o.new_pd();
    uint8_t *d   = o.alloc(MEM_DM, 65536);
    ASSERT_NE(nullptr, d);
    memset(d, SENTINEL, 65536);
    hca_mr_t *mr = o.reg(pd, d + 4096, 8192, ACCESS_ALL);
    hca_mr_t *ro = o.reg(pd, d + 16384, 4096,
                         HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_READ);
    hca_mr_t *lo = o.reg(pd, d + 20480, 4096, HCA_ACCESS_LOCAL_WRITE);
    ASSERT_TRUE(mr && ro && lo);
    uint64_t base = 0;
    uint32_t id   = hca_mr_dm_id(mr, &base);
    ASSERT_NE(0u, id);
    const uint32_t key = hca_mr_rkey(mr);

    hca_dm_view_t *v = nullptr;
    ASSERT_EQ(0, hca_dm_view_open(&o.addr, id, &v));
    void *p = nullptr;
    ASSERT_EQ(0, hca_dm_view_ptr(v, key, base + 4096 + 10, &p));
    ASSERT_NE(nullptr, p);
    EXPECT_EQ(-1, check_byte(p, 8192 - 10, SENTINEL));
    fill_pattern(p, 1000, 4);
    EXPECT_EQ(-1, check_pattern(d + 4096 + 10, 1000, 4)) << "not the same memory";
    void *q = nullptr;
    EXPECT_EQ(0, hca_dm_view_ptr(v, key, base + 4096 + 8191, &q));

    /* outside the MR, though inside the device memory */
    EXPECT_EQ(-EACCES, hca_dm_view_ptr(v, key, base + 4095, &q));
    EXPECT_EQ(-EACCES, hca_dm_view_ptr(v, key, base + 4096 + 8192, &q));
    /* wrong keys: every single-bit change, and some others */
    int passed = 0;
    for (int bit = 0; bit < 32; ++bit) {
        passed += (hca_dm_view_ptr(v, key ^ (1u << bit), base + 4096, &q) == 0);
    }
    for (uint32_t k : {0u, ~0u, key + 256, key - 256, key + 1}) {
        passed += (hca_dm_view_ptr(v, k, base + 4096, &q) == 0);
    }
    EXPECT_EQ(0, passed) << "wrong keys gave pointers";
    /* no pointer without remote read and write */
    EXPECT_EQ(-EACCES, hca_dm_view_ptr(v, hca_mr_rkey(ro), base + 16384, &q));
    EXPECT_EQ(-EACCES, hca_dm_view_ptr(v, hca_mr_rkey(lo), base + 20480, &q));

    /* stale: after the deregistration the key gives nothing, and the
     * pointer handed out before stays mapped (its loads do not fault) */
    ASSERT_EQ(0, o.dereg(mr));
    EXPECT_EQ(-EACCES, hca_dm_view_ptr(v, key, base + 4096, &q));
    volatile uint8_t *old = (volatile uint8_t*)p;
    EXPECT_EQ(0u, (unsigned)(old[0] ^ old[0]));
    hca_dm_view_close(v);

    hca_dm_view_t *bad = nullptr;
    EXPECT_LT(hca_dm_view_open(&o.addr, id + 1000, &bad), 0)
            << "no such device memory";
}
