/*
 * test_uct_params.cc - the edges of UCX's contract that UCX's own
 * transports keep and users rely on:
 *
 *  - zero-length put, get and AM in every form, with a NULL buffer and
 *    UCT_INVALID_RKEY, complete with UCS_OK (on InfiniBand a zero-length
 *    RDMA checks no R_Key; UCP sends such operations);
 *  - am_short / am_short_iov above cap.am.max_short (which counts the
 *    8-byte header, as in mm and rc) are UCS_ERR_INVALID_PARAM and deliver
 *    nothing;
 *  - iface open checks am_alignment / am_align_offset as mm does
 *    (uct_iface_param_am_alignment), and descriptors honour the alignment;
 *  - completions are counted: invalidating deregistrations sharing one
 *    completion of count N call it once, after the N-th.
 */
#include "uct_test_common.h"

#include <sys/mman.h>

#include <tuple>

using namespace hcat;

namespace {

/* ------------------------------------------------------------ zero length */

class UctZeroLength : public uct_test_base, public topo_sender,
                      public with_fabric<topology> {
protected:
    void SetUp() override
    {
        topo_fabric = GetFabric();
        ASSERT_NO_FATAL_FAILURE(open_topo(GetParam()));
    }

    void TearDown() override
    {
        close_topo();
        uct_test_base::TearDown();
    }

    /* OK at once, or INPROGRESS and then a completion with OK */
    void expect_done(const char *what, ucs_status_t st, test_comp &c)
    {
        if (st == UCS_INPROGRESS) {
            ASSERT_TRUE(wait_for([&] { return c.calls > 0; }, ents))
                << what << ": completion never called";
            EXPECT_EQ(1, c.calls) << what;
            EXPECT_EQ(UCS_OK, c.status) << what;
        } else {
            EXPECT_EQ(UCS_OK, st) << what;
            EXPECT_EQ(0, c.calls) << what << ": completion of an op that "
                                           "returned UCS_OK";
        }
    }

};

TEST_P(UctZeroLength, RmaWithNullBufferAndInvalidRkeyCompletes)
{
    const uct_rkey_t bad = UCT_INVALID_RKEY;
    test_comp c;
    int unpacked = 0;

    /* (NO_RESOURCE, as any post may answer - the tcp fabric's connection
     * is still coming up - is retried) */
    EXPECT_EQ(UCS_OK, retry_send([&] {
        return uct_ep_put_short(ep, NULL, 0, 0, bad);
    }, ents)) << "put_short";
    ssize_t n;
    EXPECT_EQ(UCS_OK, retry_send([&] {
        n = uct_ep_put_bcopy(ep, [](void*, void*) -> size_t {
            return 0;
        }, nullptr, 0, bad);
        return (n >= 0) ? UCS_OK : (ucs_status_t)n;
    }, ents)) << "put_bcopy";
    EXPECT_EQ(0, n) << "put_bcopy of 0 bytes";

    uct_iov_t iov = {NULL, 0, UCT_MEM_HANDLE_NULL, 0, 1};
    c.reset();
    ASSERT_NO_FATAL_FAILURE(expect_done(
        "put_zcopy (one empty iov)",
        uct_ep_put_zcopy(ep, &iov, 1, 0, bad, &c.uct), c));
    c.reset();
    ASSERT_NO_FATAL_FAILURE(expect_done(
        "put_zcopy (no iov)", uct_ep_put_zcopy(ep, NULL, 0, 0, bad, &c.uct),
        c));
    c.reset();
    ASSERT_NO_FATAL_FAILURE(expect_done(
        "get_bcopy",
        uct_ep_get_bcopy(ep, [](void *arg, const void*, size_t len) {
            EXPECT_EQ(0u, len);
            ++*(int*)arg;
        }, &unpacked, 0, 0, bad, &c.uct), c));
    EXPECT_LE(unpacked, 1);
    c.reset();
    ASSERT_NO_FATAL_FAILURE(expect_done(
        "get_zcopy (one empty iov)",
        uct_ep_get_zcopy(ep, &iov, 1, 0, bad, &c.uct), c));
    c.reset();
    ASSERT_NO_FATAL_FAILURE(expect_done(
        "get_zcopy (no iov)", uct_ep_get_zcopy(ep, NULL, 0, 0, bad, &c.uct),
        c));

    /* nothing failed: no error report, the ep still works */
    EXPECT_EQ(UCS_OK, flush_ep(ep, ents));
    for (int i = 0; i < 100; ++i) {
        sender.progress();
    }
    EXPECT_EQ(0u, sender.errors.size())
        << "a zero-length operation failed the ep: "
        << sender.last_error_for(ep);
    target::rbuf r = tgt->alloc(MEM_PLAIN, 64);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    uint64_t v = 0x1122334455667788ull;
    EXPECT_EQ(UCS_OK, retry_send([&] {
        return uct_ep_put_short(ep, &v, sizeof(v), r.addr, rk.rkey());
    }, ents));
    EXPECT_EQ(UCS_OK, flush_ep(ep, ents));
    EXPECT_EQ(v, tgt->read_u64(r.id, 0));
    rk.release();
    tgt->free(r.id);
}

INSTANTIATE_TEST_SUITE_P(
        hca, UctZeroLength,
        on_fabrics(::testing::Values(TOPO_LOCAL, TOPO_REMOTE,
                                     TOPO_REMOTE_NO_CMA)),
        fabric_param_name<topology>(topology_name_of));

/* Two ifaces in this process; the receiver records each AM's length */
class UctAmPair : public uct_test_base {
protected:
    void SetUp() override
    {
        ASSERT_NO_FATAL_FAILURE(open_pair(entity_config()));
    }

    void open_pair(const entity_config &cfg)
    {
        ASSERT_NO_FATAL_FAILURE(a.open(cfg));
        ASSERT_NO_FATAL_FAILURE(b.open(cfg));
        ASSERT_EQ(UCS_OK, uct_iface_set_am_handler(b.iface, AM_ID, am_cb,
                                                   this, 0));
        ep = a.connect_to(b);
        ASSERT_NE(nullptr, ep);
        ents = {&a, &b};
    }

    void TearDown() override
    {
        a.close();
        b.close();
        uct_test_base::TearDown();
    }

    static ucs_status_t am_cb(void *arg, void *data, size_t length,
                              unsigned flags)
    {
        UctAmPair *t = (UctAmPair*)arg;
        t->lengths.push_back(length);
        t->data_ptrs.push_back(data);
        t->desc_flags.push_back(flags & UCT_CB_PARAM_FLAG_DESC);
        return UCS_OK;
    }

    bool wait_count(size_t n, double sec = TIMEOUT_SEC)
    {
        return wait_for([&] { return lengths.size() >= n; }, ents, sec);
    }

    entity                a, b;
    uct_ep_h              ep = nullptr;
    std::vector<entity*>  ents;
    std::vector<size_t>   lengths;
    std::vector<void*>    data_ptrs;
    std::vector<unsigned> desc_flags;
};

class UctZeroLengthAm : public UctAmPair {};

TEST_F(UctZeroLengthAm, EveryAmFormWithNoPayloadIsDelivered)
{
    uint64_t hdr = 0x0102030405060708ull;
    EXPECT_EQ(UCS_OK, retry_send([&] {
        return uct_ep_am_short(ep, AM_ID, hdr, NULL, 0);
    }, ents)) << "am_short";
    uct_iov_t iov = {NULL, 0, UCT_MEM_HANDLE_NULL, 0, 1};
    EXPECT_EQ(UCS_OK, retry_send([&] {
        return uct_ep_am_short_iov(ep, AM_ID, &iov, 1);
    }, ents)) << "am_short_iov";
    ssize_t n;
    deadline dl;
    while ((n = uct_ep_am_bcopy(ep, AM_ID, [](void*, void*) -> size_t {
                return 0;
            }, nullptr, 0)) == UCS_ERR_NO_RESOURCE) {
        ASSERT_FALSE(dl.expired());
        a.progress();
        b.progress();
    }
    EXPECT_EQ(0, n) << "am_bcopy of 0 bytes";
    test_comp c;
    ucs_status_t st = retry_send([&] {
        return uct_ep_am_zcopy(ep, AM_ID, NULL, 0, NULL, 0, 0, &c.uct);
    }, ents);
    EXPECT_TRUE((st == UCS_OK) || (st == UCS_INPROGRESS)) << "am_zcopy";
    if (st == UCS_INPROGRESS) {
        EXPECT_TRUE(wait_for([&] { return c.calls > 0; }, ents));
        EXPECT_EQ(UCS_OK, c.status);
    }
    ASSERT_TRUE(wait_count(4)) << lengths.size() << " of 4 AMs arrived";
    EXPECT_EQ(8u, lengths[0]) << "am_short: the header only";
    EXPECT_EQ(0u, lengths[1]) << "am_short_iov";
    EXPECT_EQ(0u, lengths[2]) << "am_bcopy";
    EXPECT_EQ(0u, lengths[3]) << "am_zcopy";
    EXPECT_EQ(0u, a.errors.size());
}

/* ------------------------------------------------------------ am_short */

class UctAmShortLimit : public UctAmPair {};

TEST_F(UctAmShortLimit, AboveMaxShortIsInvalidParamAndDeliversNothing)
{
    const size_t ms = a.attr.cap.am.max_short; /* header included */
    ASSERT_GT(ms, 8u);
    std::vector<uint8_t> buf(ms + 64);
    pat_fill(buf.data(), buf.size(), 9);

    /* at the limit: delivered */
    EXPECT_EQ(UCS_OK, retry_send([&] {
        return uct_ep_am_short(ep, AM_ID, 1, buf.data(), ms - 8);
    }, ents));
    uct_iov_t iov[2] = {{buf.data(), 8, UCT_MEM_HANDLE_NULL, 0, 1},
                        {buf.data() + 8, ms - 8, UCT_MEM_HANDLE_NULL, 0, 1}};
    EXPECT_EQ(UCS_OK, retry_send([&] {
        return uct_ep_am_short_iov(ep, AM_ID, iov, 2);
    }, ents));
    ASSERT_TRUE(wait_count(2));
    EXPECT_EQ(ms, lengths[0]);
    EXPECT_EQ(ms, lengths[1]);

    /* one byte over, and more */
    for (size_t over : {(size_t)1, (size_t)8, (size_t)64}) {
        SCOPED_TRACE("max_short + " + std::to_string(over));
        EXPECT_EQ(UCS_ERR_INVALID_PARAM,
                  uct_ep_am_short(ep, AM_ID, 1, buf.data(), ms - 8 + over))
            << "am_short of " << ms + over << " bytes with the header "
               "(max_short " << ms << ")";
        iov[1].length = ms - 8 + over;
        EXPECT_EQ(UCS_ERR_INVALID_PARAM,
                  uct_ep_am_short_iov(ep, AM_ID, iov, 2))
            << "am_short_iov of " << ms + over << " bytes";
    }
    wait_count(3, 0.5);
    EXPECT_EQ(2u, lengths.size()) << "an oversized am_short was delivered";
    EXPECT_EQ(0u, a.errors.size());
}

/* ------------------------------------------------------------ zcopy limit */

/* A zero-copy put or get above cap.put/get.max_zcopy - also one whose iov
 * entry does not fit the device's 32-bit SGE length - is refused with
 * UCS_ERR_INVALID_PARAM before any byte moves; the ep stays usable. */
class UctZcopyLimit : public UctAmPair {};

TEST_F(UctZcopyLimit, AboveMaxZcopyIsInvalidParam)
{
    buffer dst;
    ASSERT_NO_FATAL_FAILURE(dst.alloc(b, MEM_PLAIN, 4096));
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(a.component, dst.rkey()));
    /* address space nobody may touch: a transfer that starts fails loudly */
    const size_t huge = (4ul << 30) + 8;
    void *none = mmap(NULL, huge, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(MAP_FAILED, none);
    for (size_t len : {a.attr.cap.put.max_zcopy + 1, huge}) {
        SCOPED_TRACE("length " + std::to_string(len));
        uct_iov_t iov = {none, len, UCT_MEM_HANDLE_NULL, 0, 1};
        test_comp c;
        EXPECT_EQ(UCS_ERR_INVALID_PARAM,
                  uct_ep_put_zcopy(ep, &iov, 1, dst.addr(), rk.rkey(),
                                   &c.uct));
        EXPECT_EQ(UCS_ERR_INVALID_PARAM,
                  uct_ep_get_zcopy(ep, &iov, 1, dst.addr(), rk.rkey(),
                                   &c.uct));
        EXPECT_EQ(0, c.calls);
    }
    munmap(none, huge);
    uint64_t v = 77;
    EXPECT_EQ(UCS_OK, retry_send([&] {
        return uct_ep_put_short(ep, &v, 8, dst.addr(), rk.rkey());
    }, ents));
    EXPECT_EQ(UCS_OK, flush_ep(ep, ents));
    EXPECT_EQ(77u, *(uint64_t*)dst.data());
    EXPECT_EQ(0u, a.errors.size());
    rk.release();
    dst.free();
}

/* ------------------------------------------------------------ iface params */

/* Opens an hca iface with the given alignment fields; returns the status
 * (the iface, if opened, is closed again unless iface_p is given). */
struct raw_iface {
    uct_component_h      component = nullptr;
    uct_md_h             md        = nullptr;
    ucs_async_context_t *async     = nullptr;
    uct_worker_h         worker    = nullptr;
    uct_iface_h          iface     = nullptr;

    ucs_status_t open(uint64_t extra_fields, size_t align, size_t offset,
                      const cfg_list &iface_cfg = cfg_list())
    {
        uct_md_config_t *mdc;
        uct_iface_config_t *ic;
        uct_iface_params_t p;

        component = find_hca_component();
        EXPECT_NE(nullptr, component);
        if ((component == nullptr) ||
            (uct_md_config_read(component, NULL, NULL, &mdc) != UCS_OK)) {
            return UCS_ERR_NO_DEVICE;
        }
        ucs_status_t st = uct_md_open(component, "hca", mdc, &md);
        uct_config_release(mdc);
        EXPECT_EQ(UCS_OK, st);
        if (st != UCS_OK) {
            return st;
        }
        EXPECT_EQ(UCS_OK,
                  ucs_async_context_create(UCS_ASYNC_MODE_POLL, &async));
        EXPECT_EQ(UCS_OK, uct_worker_create(async, UCS_THREAD_MODE_SINGLE,
                                            &worker));
        EXPECT_EQ(UCS_OK, uct_md_iface_config_read(md, "hca", NULL, NULL,
                                                   &ic));
        for (auto &kv : iface_cfg) {
            EXPECT_EQ(UCS_OK, hca_config_modify(ic, kv.first, kv.second));
        }
        memset(&p, 0, sizeof(p));
        p.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE |
                       UCT_IFACE_PARAM_FIELD_DEVICE | extra_fields;
        p.open_mode            = UCT_IFACE_OPEN_MODE_DEVICE;
        p.mode.device.tl_name  = "hca";
        p.mode.device.dev_name = "hca0";
        p.am_alignment         = align;
        p.am_align_offset      = offset;
        st = uct_iface_open(md, worker, &p, ic, &iface);
        uct_config_release(ic);
        if (st != UCS_OK) {
            iface = nullptr;
        }
        return st;
    }

    ~raw_iface()
    {
        if (iface != nullptr) {
            uct_iface_close(iface);
        }
        if (worker != nullptr) {
            uct_worker_destroy(worker);
        }
        if (async != nullptr) {
            ucs_async_context_destroy(async);
        }
        if (md != nullptr) {
            uct_md_close(md);
        }
    }
};

class UctIfaceParams : public uct_test_base {};

TEST_F(UctIfaceParams, AlignOffsetWithoutAlignmentIsInvalidParam)
{
    raw_iface r;
    EXPECT_EQ(UCS_ERR_INVALID_PARAM,
              r.open(UCT_IFACE_PARAM_FIELD_AM_ALIGN_OFFSET, 0, 8));
}

TEST_F(UctIfaceParams, AlignmentNotAPowerOfTwoIsInvalidParam)
{
    for (size_t align : {(size_t)0, (size_t)3, (size_t)48}) {
        raw_iface r;
        EXPECT_EQ(UCS_ERR_INVALID_PARAM,
                  r.open(UCT_IFACE_PARAM_FIELD_AM_ALIGNMENT, align, 0))
            << "am_alignment " << align;
    }
}

TEST_F(UctIfaceParams, ValidAlignmentOpens)
{
    raw_iface r;
    EXPECT_EQ(UCS_OK, r.open(UCT_IFACE_PARAM_FIELD_AM_ALIGNMENT |
                             UCT_IFACE_PARAM_FIELD_AM_ALIGN_OFFSET, 256, 16));
}

/* AMs delivered in a descriptor (UCT_CB_PARAM_FLAG_DESC: the ones larger
 * than a ring slot) have data + am_align_offset on the alignment */
class UctAmAlignment : public UctAmPair {
protected:
    void SetUp() override {}
};

TEST_F(UctAmAlignment, DescriptorPayloadIsAligned)
{
    const size_t align = 512, offset = 24;
    entity_config cfg;
    cfg.iface_cfg.push_back({"SEG_SIZE", "64k"});
    cfg.am_alignment    = align;
    cfg.am_align_offset = offset;
    ASSERT_NO_FATAL_FAILURE(open_pair(cfg));
    const size_t len = 40000;  /* above a ring slot: a descriptor */
    buffer src;
    ASSERT_NO_FATAL_FAILURE(src.alloc(a, MEM_PLAIN, len));
    pat_fill(src.data(), len, 3);
    const int n = 8;
    for (int i = 0; i < n; ++i) {
        uct_iov_t iov = {src.data(), len - 8 * i, src.memh, 0, 1};
        test_comp c;
        ucs_status_t st = retry_send([&] {
            c.reset();
            return uct_ep_am_zcopy(ep, AM_ID, NULL, 0, &iov, 1, 0, &c.uct);
        }, ents);
        ASSERT_EQ(UCS_OK, complete_op(st, c, ents));
    }
    ASSERT_TRUE(wait_count(n));
    int with_desc = 0;
    for (int i = 0; i < n; ++i) {
        EXPECT_EQ(len - 8 * i, lengths[i]);
        if (desc_flags[i]) {
            ++with_desc;
            EXPECT_EQ(0u, ((uintptr_t)data_ptrs[i] + offset) % align)
                << "AM " << i << " at " << data_ptrs[i];
        }
    }
    EXPECT_EQ(n, with_desc) << "AMs above a ring slot come in descriptors";
    src.free();
}

/* ------------------------------------------------------------ md */

class UctMdInvalidate : public uct_test_base {};

TEST_F(UctMdInvalidate, SharedCompletionIsCalledOnceAfterTheLast)
{
    entity e;
    ASSERT_NO_FATAL_FAILURE(e.open());
    ASSERT_TRUE(e.md_attr.cap.flags & UCT_MD_FLAG_INVALIDATE);
    const int n = 4;
    std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(8192));
    std::vector<uct_mem_h> memh(n);
    std::vector<uint8_t> key(e.md_attr.rkey_packed_size);
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(UCS_OK, uct_md_mem_reg(e.md, bufs[i].data(), 8192,
                                         UCT_MD_MEM_ACCESS_ALL, &memh[i]));
        ASSERT_EQ(UCS_OK, pack_invalidatable(e.md, memh[i], bufs[i].data(),
                                             8192, key.data()));
    }
    test_comp c;
    c.reset(n);
    for (int i = 0; i < n; ++i) {
        hcat_md_mem_dereg_params_t p;
        p.field_mask = HCAT_MD_MEM_DEREG_FIELD_MEMH |
                       HCAT_MD_MEM_DEREG_FIELD_FLAGS |
                       HCAT_MD_MEM_DEREG_FIELD_COMPLETION;
        p.memh  = memh[i];
        p.flags = HCAT_MD_MEM_DEREG_FLAG_INVALIDATE;
        p.comp  = &c.uct;
        ASSERT_EQ(UCS_OK, uct_md_mem_dereg_v2(e.md, &p)) << "dereg " << i;
        for (int k = 0; k < 100; ++k) {
            e.progress();
        }
        if (i < n - 1) {
            EXPECT_EQ(0, c.calls) << "called after " << i + 1 << " of " << n;
            EXPECT_EQ(n - 1 - i, c.uct.count);
        }
    }
    EXPECT_EQ(1, c.calls);
    EXPECT_EQ(0, c.uct.count);
    EXPECT_EQ(UCS_OK, c.status);
}

/* uct_md_mem_dereg_v2's parameters, checked as UCX's test_md.dereg_bad_arg
 * checks them: no memh, or INVALIDATE without a completion, or INVALIDATE
 * of a key never packed invalidatable (UCX >= 1.15, as UCX's IB md) is
 * UCS_ERR_INVALID_PARAM, and the registration stays; then the right call
 * deregisters it and completes. */
TEST_F(UctMdInvalidate, DeregParametersAreChecked)
{
    entity e;
    ASSERT_NO_FATAL_FAILURE(e.open());
    std::vector<uint8_t> buf(1 << 20);
    uct_mem_h memh;
    ASSERT_EQ(UCS_OK, uct_md_mem_reg(e.md, buf.data(), buf.size(),
                                     UCT_MD_MEM_ACCESS_ALL, &memh));
    test_comp c;
    c.reset(1);
    hcat_md_mem_dereg_params_t p;
    p.memh  = memh;
    p.flags = HCAT_MD_MEM_DEREG_FLAG_INVALIDATE;
    p.comp  = &c.uct;
    const uint64_t bad[] = {
        HCAT_MD_MEM_DEREG_FIELD_COMPLETION,
        HCAT_MD_MEM_DEREG_FIELD_COMPLETION | HCAT_MD_MEM_DEREG_FIELD_FLAGS,
        HCAT_MD_MEM_DEREG_FIELD_MEMH | HCAT_MD_MEM_DEREG_FIELD_FLAGS,
    };
    for (uint64_t mask : bad) {
        p.field_mask = mask;
        EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_md_mem_dereg_v2(e.md, &p))
            << "field_mask 0x" << std::hex << mask;
    }
    p.field_mask = HCAT_MD_MEM_DEREG_FIELD_MEMH |
                   HCAT_MD_MEM_DEREG_FIELD_FLAGS |
                   HCAT_MD_MEM_DEREG_FIELD_COMPLETION;
#if HCAT_HAVE_INVALIDATE_PACK_FLAGS
    EXPECT_EQ(UCS_ERR_INVALID_PARAM, uct_md_mem_dereg_v2(e.md, &p))
        << "invalidated a key that was never packed with an INVALIDATE flag";
#endif
    EXPECT_EQ(0, c.calls);
    /* still registered: its key packs */
    std::vector<uint8_t> key(e.md_attr.rkey_packed_size);
    ASSERT_EQ(UCS_OK, pack_invalidatable(e.md, memh, buf.data(), buf.size(),
                                         key.data()));
    EXPECT_EQ(UCS_OK, uct_md_mem_dereg_v2(e.md, &p));
    EXPECT_EQ(1, c.calls);
    EXPECT_EQ(UCS_OK, c.status);
}

} /* namespace */
