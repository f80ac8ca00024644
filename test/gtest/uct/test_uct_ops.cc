/*
 * test_uct_ops.cc - every operation the hca iface advertises, in every form
 * (short / bcopy / zcopy / iov; 32/64-bit post and fetching atomics), at
 * the boundary sizes, with the data verified - between two workers of this
 * process and between two processes (single copy and through the target's
 * responder), on device memory (uct_iface_mem_alloc, uct_mem_alloc(MD)) and
 * on plain malloc'ed memory registered with uct_md_mem_reg.
 *
 * The issue requires every one of these operations: a test whose capability
 * flag is not advertised fails (it is not skipped).
 */
#include "uct_test_common.h"

/* UCS_MAX_LOG_LEVEL as the module is built with: the installed UCX's
 * config.h (ucx-config/, from `ucx_info -b`) */
#include <config.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <set>
#include <tuple>

using namespace hcat;

namespace {

constexpr size_t GUARD = 256;   /* bytes checked on both sides of a write */
constexpr size_t MIB   = 1ul << 20;

/* sorted, unique, within [0, max] */
std::vector<size_t> sizes_upto(std::vector<size_t> v, size_t max)
{
    std::set<size_t> s;
    for (size_t x : v) {
        if (x <= max) {
            s.insert(x);
        }
    }
    return std::vector<size_t>(s.begin(), s.end());
}

struct put_pack_arg {
    const void *src;
    size_t      len;
};

size_t put_pack_cb(void *dest, void *arg)
{
    put_pack_arg *a = (put_pack_arg*)arg;
    memcpy(dest, a->src, a->len);
    return a->len;
}

struct get_unpack_arg {
    void  *dst;
    size_t len;
    int    calls;
    size_t got;
};

void get_unpack_cb(void *arg, const void *data, size_t length)
{
    get_unpack_arg *a = (get_unpack_arg*)arg;
    a->calls++;
    a->got = length;
    memcpy(a->dst, data, std::min(length, a->len));
}

size_t fill_iov(uct_iov_t *iov, void *buf, size_t len, size_t cnt,
                uct_mem_h memh)
{
    size_t n = std::max<size_t>(1, std::min(cnt, std::max<size_t>(len, 1)));
    size_t piece = len / n, pos = 0;
    for (size_t i = 0; i < n; ++i) {
        size_t l      = (i == n - 1) ? (len - pos) : piece;
        iov[i].buffer = (char*)buf + pos;
        iov[i].length = l;
        iov[i].memh   = memh;
        iov[i].stride = 0;
        iov[i].count  = 1;
        pos          += l;
    }
    return n;
}

uint64_t apply_op(uct_atomic_op_t op, uint64_t old, uint64_t v, uint64_t cmp,
                  unsigned size)
{
    uint64_t mask = (size == 4) ? 0xffffffffull : ~0ull;
    uint64_t r;
    switch (op) {
    case UCT_ATOMIC_OP_ADD:   r = old + v; break;
    case UCT_ATOMIC_OP_AND:   r = old & v; break;
    case UCT_ATOMIC_OP_OR:    r = old | v; break;
    case UCT_ATOMIC_OP_XOR:   r = old ^ v; break;
    case UCT_ATOMIC_OP_SWAP:  r = v; break;
    case UCT_ATOMIC_OP_CSWAP: r = ((old & mask) == (cmp & mask)) ? v : old;
                              break;
    default:                  r = old; break;
    }
    return r & mask;
}

const char *atomic_op_name(uct_atomic_op_t op)
{
    switch (op) {
    case UCT_ATOMIC_OP_ADD:   return "add";
    case UCT_ATOMIC_OP_AND:   return "and";
    case UCT_ATOMIC_OP_OR:    return "or";
    case UCT_ATOMIC_OP_XOR:   return "xor";
    case UCT_ATOMIC_OP_SWAP:  return "swap";
    case UCT_ATOMIC_OP_CSWAP: return "cswap";
    default:                  return "?";
    }
}

} /* namespace */

/* ------------------------------------------------------------ capabilities */

class UctHcaCaps : public uct_test_base {};

TEST_F(UctHcaCaps, ComponentMdAndTlResources)
{
    uct_component_h c = find_hca_component();
    ASSERT_NE(nullptr, c) << "component 'hca' not registered "
                             "(LD_PRELOAD of libuct_hca.so missing?)";

    uct_component_attr_t cattr;
    cattr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    ASSERT_EQ(UCS_OK, uct_component_query(c, &cattr));
    ASSERT_GE(cattr.md_resource_count, 1u);
    std::vector<uct_md_resource_desc_t> mds(cattr.md_resource_count);
    cattr.field_mask   = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    cattr.md_resources = mds.data();
    ASSERT_EQ(UCS_OK, uct_component_query(c, &cattr));
    EXPECT_STREQ("hca", mds[0].md_name);

    entity e;
    ASSERT_NO_FATAL_FAILURE(e.open());
    uct_tl_resource_desc_t *tls;
    unsigned ntl;
    ASSERT_EQ(UCS_OK, uct_md_query_tl_resources(e.md, &tls, &ntl));
    bool found = false;
    for (unsigned i = 0; i < ntl; ++i) {
        if (!strcmp(tls[i].tl_name, "hca") &&
            !strcmp(tls[i].dev_name, "hca0")) {
            found = true;
        }
    }
    uct_release_tl_resource_list(tls);
    EXPECT_TRUE(found) << "no tl resource hca/hca0";

    uint64_t need_md = UCT_MD_FLAG_REG | UCT_MD_FLAG_ALLOC |
                       UCT_MD_FLAG_NEED_RKEY;
    EXPECT_EQ(need_md, e.md_attr.cap.flags & need_md)
        << "md flags 0x" << std::hex << e.md_attr.cap.flags;
    EXPECT_TRUE(e.md_attr.cap.reg_mem_types & UCS_BIT(UCS_MEMORY_TYPE_HOST));
    EXPECT_TRUE(e.md_attr.cap.alloc_mem_types & UCS_BIT(UCS_MEMORY_TYPE_HOST));
    EXPECT_GT(e.md_attr.rkey_packed_size, 0u);
}

TEST_F(UctHcaCaps, EveryRequiredOperationIsAdvertised)
{
    entity e;
    ASSERT_NO_FATAL_FAILURE(e.open());
    const uct_iface_attr_t &a = e.attr;

    const std::pair<uint64_t, const char*> need[] = {
        {UCT_IFACE_FLAG_AM_SHORT, "AM_SHORT"},
        {UCT_IFACE_FLAG_AM_BCOPY, "AM_BCOPY"},
        {UCT_IFACE_FLAG_AM_ZCOPY, "AM_ZCOPY"},
        {UCT_IFACE_FLAG_PUT_SHORT, "PUT_SHORT"},
        {UCT_IFACE_FLAG_PUT_BCOPY, "PUT_BCOPY"},
        {UCT_IFACE_FLAG_PUT_ZCOPY, "PUT_ZCOPY"},
        {UCT_IFACE_FLAG_GET_BCOPY, "GET_BCOPY"},
        {UCT_IFACE_FLAG_GET_ZCOPY, "GET_ZCOPY"},
        {UCT_IFACE_FLAG_PENDING, "PENDING"},
        {UCT_IFACE_FLAG_CB_SYNC, "CB_SYNC"},
        {UCT_IFACE_FLAG_CONNECT_TO_IFACE, "CONNECT_TO_IFACE"},
        {UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE, "ERRHANDLE_PEER_FAILURE"},
        {UCT_IFACE_FLAG_EP_CHECK, "EP_CHECK"},
    };
    for (auto &n : need) {
        EXPECT_TRUE(a.cap.flags & n.first) << "not advertised: " << n.second;
    }
    EXPECT_TRUE(a.cap.flags &
                (UCT_IFACE_FLAG_ATOMIC_CPU | UCT_IFACE_FLAG_ATOMIC_DEVICE))
        << "no atomic domain advertised";

    uint64_t ops  = UCS_BIT(UCT_ATOMIC_OP_ADD) | UCS_BIT(UCT_ATOMIC_OP_AND) |
                    UCS_BIT(UCT_ATOMIC_OP_OR) | UCS_BIT(UCT_ATOMIC_OP_XOR);
    uint64_t fops = ops | UCS_BIT(UCT_ATOMIC_OP_SWAP) |
                    UCS_BIT(UCT_ATOMIC_OP_CSWAP);
    EXPECT_EQ(ops, a.cap.atomic32.op_flags & ops);
    EXPECT_EQ(ops, a.cap.atomic64.op_flags & ops);
    EXPECT_EQ(fops, a.cap.atomic32.fop_flags & fops);
    EXPECT_EQ(fops, a.cap.atomic64.fop_flags & fops);

    uint64_t ev = UCT_IFACE_FLAG_EVENT_SEND_COMP | UCT_IFACE_FLAG_EVENT_RECV |
                  UCT_IFACE_FLAG_EVENT_FD;
    EXPECT_EQ(ev, a.cap.event_flags & ev);

    /* what UCP needs of an AM lane, and sane size limits */
    EXPECT_GE(a.cap.am.max_bcopy, 64u);
    EXPECT_GE(a.cap.am.max_short, 8u);
    EXPECT_GE(a.cap.put.max_bcopy, a.cap.put.max_short);
    EXPECT_GE(a.cap.put.max_zcopy, a.cap.put.max_bcopy);
    EXPECT_GE(a.cap.get.max_zcopy, a.cap.get.max_bcopy);
    EXPECT_GE(a.cap.am.max_iov, 1u);
    EXPECT_GE(a.cap.put.max_iov, 1u);
    EXPECT_GE(a.cap.get.max_iov, 1u);
    EXPECT_LE(a.device_addr_len, 31u);
    EXPECT_LE(a.iface_addr_len, 63u);
    EXPECT_GT(a.iface_addr_len, 0u);
    EXPECT_EQ(0u, a.ep_addr_len);
}

TEST_F(UctHcaCaps, ReachabilityAndConfig)
{
    entity a, b;
    entity_config cfg;
    cfg.iface_cfg.push_back({"RX_QUEUE_LEN", "8"});
    cfg.iface_cfg.push_back({"SEG_SIZE", "4k"});
    ASSERT_NO_FATAL_FAILURE(a.open(cfg));
    ASSERT_NO_FATAL_FAILURE(b.open());
    EXPECT_EQ(4096u, a.attr.cap.am.max_bcopy) << "SEG_SIZE=4k not applied";
    /* put_short goes up to a bounce buffer (UCP sends puts up to it as
     * put_short); get zero-copy is offered from GET_MIN_ZCOPY (8k) */
    EXPECT_EQ(4096u, a.attr.cap.put.max_short) << "put max_short";
    EXPECT_EQ(8192u, b.attr.cap.put.max_short) << "put max_short";
    /* 8k where UCP plans with protocols v1 by default (< 1.16), else 0 */
    EXPECT_EQ((UCT_VERNO_MAJOR == 1) && (UCT_VERNO_MINOR < 16) ? 8192u : 0u,
              b.attr.cap.get.min_zcopy) << "GET_MIN_ZCOPY default";
    {
        entity c;
        entity_config cc;
        cc.iface_cfg.push_back({"GET_MIN_ZCOPY", "16k"});
        ASSERT_NO_FATAL_FAILURE(c.open(cc));
        EXPECT_EQ(16384u, c.attr.cap.get.min_zcopy) << "GET_MIN_ZCOPY=16k";
    }
    EXPECT_TRUE(uct_iface_is_reachable(
        a.iface, (const uct_device_addr_t*)b.dev_addr.data(),
        (const uct_iface_addr_t*)b.iface_addr.data()));

    /* a config key that does not exist is refused */
    uct_iface_config_t *ic;
    ASSERT_EQ(UCS_OK, uct_md_iface_config_read(a.md, "hca", NULL, NULL, &ic));
    EXPECT_NE(UCS_OK, uct_config_modify(ic, "NO_SUCH_KEY_XYZ", "1"));
    uct_config_release(ic);
}

/* ------------------------------------------------------------ op matrix */

typedef std::tuple<topology, mem_kind> ops_param;

class UctOps : public uct_test_base, public topo_sender,
               public with_fabric<ops_param> {
protected:
    void SetUp() override
    {
        kind        = std::get<1>(GetParam());
        topo_fabric = GetFabric();
        ASSERT_NO_FATAL_FAILURE(open_topo(std::get<0>(GetParam())));
        seed = 0x1234 + (uint64_t)topo * 77 + (uint64_t)kind * 1001;
    }

    void TearDown() override
    {
        close_topo();
        uct_test_base::TearDown();
    }

    void require(uint64_t flag, const char *name)
    {
        ASSERT_TRUE(sender.attr.cap.flags & flag)
            << name << " is not advertised, and the issue requires it";
    }

    uint64_t next_seed() { return ++seed * 0x100000001b3ull; }

    /* an operation that may return NO_RESOURCE, then completes */
    ucs_status_t run_op(const std::function<ucs_status_t(test_comp&)> &op,
                        test_comp &comp)
    {
        ucs_status_t st = retry_send([&] {
            comp.reset();
            return op(comp);
        }, ents);
        if (st == UCS_OK) {
            /* completed at once: the completion must not be called */
            for (int i = 0; i < 10; ++i) {
                sender.progress();
            }
            EXPECT_EQ(0, comp.calls) << "completion called for an op that "
                                        "returned UCS_OK";
            return UCS_OK;
        }
        st = complete_op(st, comp, ents);
        EXPECT_EQ(1, comp.calls);
        EXPECT_EQ(0, comp.uct.count) << "completion invoked more than once";
        return st;
    }

    enum put_method { PUT_SHORT, PUT_BCOPY, PUT_ZCOPY };
    enum get_method { GET_BCOPY, GET_ZCOPY };

    void run_put(put_method m, const std::vector<size_t> &sizes,
                 size_t iovcnt = 1, mem_kind local_kind = MEM_KIND_LAST);
    void run_get(get_method m, const std::vector<size_t> &sizes,
                 size_t iovcnt = 1, mem_kind local_kind = MEM_KIND_LAST);
    void run_am(am_method m, const std::vector<size_t> &sizes,
                size_t iovcnt = 1, int repeat = 3);
    void run_atomic_post(unsigned size);
    void run_atomic_fetch(unsigned size);

    std::vector<size_t> zcopy_sizes(size_t max_short, size_t max_bcopy,
                                    size_t max_zcopy)
    {
        size_t top = std::min(max_zcopy, MAX_ZCOPY_CAP);
        return sizes_upto({0, 1, 8, max_short, max_short + 1, max_bcopy,
                           MIB, top}, top);
    }

    mem_kind                kind;
    uint64_t                seed;
    size_t                  roff = 0;  /* extra remote offset (alignment) */
    size_t                  loff = 0;  /* local buffer offset (alignment) */
};

void UctOps::run_put(put_method m, const std::vector<size_t> &sizes,
                     size_t iovcnt, mem_kind local_kind)
{
    size_t maxsz = *std::max_element(sizes.begin(), sizes.end());
    target::rbuf r = tgt->alloc(kind, maxsz + 2 * GUARD + 64);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    buffer src;
    ASSERT_NO_FATAL_FAILURE(src.alloc(sender, (local_kind == MEM_KIND_LAST) ?
                                              kind : local_kind,
                                      maxsz + GUARD + 64));

    for (size_t size : sizes) {
        SCOPED_TRACE("size " + std::to_string(size));
        const size_t G = GUARD + roff; /* remote offset of the data */
        uint64_t s = next_seed(), bg = next_seed();
        tgt->fill(r.id, 0, size + G + GUARD, bg, 0);
        pat_fill(src.data() + loff, size, s);
        uint64_t raddr = r.addr + G;
        test_comp comp;
        ucs_status_t st;

        switch (m) {
        case PUT_SHORT:
            st = retry_send([&] {
                return uct_ep_put_short(ep, src.data() + loff,
                                        (unsigned)size, raddr, rk.rkey());
            }, ents);
            break;
        case PUT_BCOPY:
            st = retry_send([&] {
                put_pack_arg a = {src.data() + loff, size};
                ssize_t n = uct_ep_put_bcopy(ep, put_pack_cb, &a, raddr,
                                             rk.rkey());
                if (n < 0) {
                    return (ucs_status_t)n;
                }
                EXPECT_EQ((ssize_t)size, n) << "put_bcopy length";
                return UCS_OK;
            }, ents);
            break;
        default:
            st = run_op([&](test_comp &c) {
                uct_iov_t iov[16];
                size_t n = fill_iov(iov, src.data() + loff, size, iovcnt,
                                    src.memh);
                return uct_ep_put_zcopy(ep, iov, n, raddr, rk.rkey(), &c.uct);
            }, comp);
            break;
        }
        ASSERT_EQ(UCS_OK, st) << "put";
        ASSERT_EQ(UCS_OK, flush_ep(ep, ents));
        ASSERT_EQ(-1, tgt->check(r.id, G, size, s, 0))
            << "put data differs at this offset";
        ASSERT_EQ(-1, tgt->check(r.id, 0, G, bg, 0))
            << "bytes before the put target changed";
        ASSERT_EQ(-1, tgt->check(r.id, G + size, GUARD, bg, G + size))
            << "bytes after the put target changed";
        EXPECT_EQ(0u, sender.errors.size());
    }
    rk.release();
    tgt->free(r.id);
}

void UctOps::run_get(get_method m, const std::vector<size_t> &sizes,
                     size_t iovcnt, mem_kind local_kind)
{
    size_t maxsz = *std::max_element(sizes.begin(), sizes.end());
    target::rbuf r = tgt->alloc(kind, maxsz + 2 * GUARD + 64);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    buffer dst;
    ASSERT_NO_FATAL_FAILURE(dst.alloc(sender, (local_kind == MEM_KIND_LAST) ?
                                              kind : local_kind,
                                      maxsz + 2 * GUARD + 64));

    for (size_t size : sizes) {
        SCOPED_TRACE("size " + std::to_string(size));
        const size_t G = GUARD + roff; /* remote offset of the data */
        uint64_t s = next_seed(), bg = next_seed(), rbg = next_seed();
        tgt->fill(r.id, 0, size + G + GUARD, rbg, 0);
        tgt->fill(r.id, G, size, s, 0);
        uint8_t *ld = dst.data() + loff; /* local buffer */
        pat_fill(ld, size + 2 * GUARD, bg);
        uint64_t raddr = r.addr + G;
        test_comp comp;
        get_unpack_arg ua = {ld + GUARD, size, 0, 0};
        ucs_status_t st;

        if (m == GET_BCOPY) {
            st = run_op([&](test_comp &c) {
                return uct_ep_get_bcopy(ep, get_unpack_cb, &ua, size, raddr,
                                        rk.rkey(), &c.uct);
            }, comp);
            ASSERT_EQ(UCS_OK, st) << "get_bcopy";
            EXPECT_EQ(1, ua.calls) << "unpack callback calls";
            EXPECT_EQ(size, ua.got) << "unpack length";
        } else {
            st = run_op([&](test_comp &c) {
                uct_iov_t iov[16];
                size_t n = fill_iov(iov, ld + GUARD, size, iovcnt,
                                    dst.memh);
                return uct_ep_get_zcopy(ep, iov, n, raddr, rk.rkey(), &c.uct);
            }, comp);
            ASSERT_EQ(UCS_OK, st) << "get_zcopy";
        }
        ASSERT_EQ(-1, pat_check(ld + GUARD, size, s))
            << "get data differs at this offset";
        ASSERT_EQ(-1, pat_check(ld, GUARD, bg))
            << "bytes before the get destination changed";
        ASSERT_EQ(-1, pat_check(ld + GUARD + size, GUARD, bg,
                                GUARD + size))
            << "bytes after the get destination changed";
        ASSERT_EQ(-1, tgt->check(r.id, G, size, s, 0))
            << "the get changed the source";
        EXPECT_EQ(0u, sender.errors.size());
    }
    rk.release();
    tgt->free(r.id);
}

void UctOps::run_am(am_method m, const std::vector<size_t> &sizes,
                    size_t iovcnt, int repeat)
{
    size_t maxsz = *std::max_element(sizes.begin(), sizes.end());
    buffer src;
    ASSERT_NO_FATAL_FAILURE(src.alloc(sender, kind, maxsz + 64));
    tgt->reset_stats();
    uint64_t count = 0, bytes = 0;

    for (int rep = 0; rep < repeat; ++rep) {
        for (size_t size : sizes) {
            SCOPED_TRACE("payload " + std::to_string(size));
            am_hdr h;
            h.seed   = (uint32_t)next_seed();
            h.length = (uint16_t)size;
            h.stream = 0;
            h.flags  = 0;
            ASSERT_EQ(size, (size_t)h.length);
            pat_fill(src.data(), size, h.seed);
            test_comp comp;
            ucs_status_t st;
            if (m == AM_ZCOPY) {
                st = run_op([&](test_comp &c) {
                    return send_test_am(ep, m, h, src, iovcnt, &c);
                }, comp);
            } else {
                st = retry_send([&] {
                    return send_test_am(ep, m, h, src, iovcnt, nullptr);
                }, ents);
            }
            ASSERT_EQ(UCS_OK, st) << "am send";
            ++count;
            bytes += size;
        }
    }
    am_stats s = tgt->wait_am(count, &sender);
    EXPECT_EQ(count, s.count) << "messages received";
    EXPECT_EQ(bytes, s.bytes) << "payload bytes received";
    EXPECT_EQ(0u, s.bad) << s.first_error;
    EXPECT_EQ(0u, sender.errors.size());
}

void UctOps::run_atomic_post(unsigned size)
{
    const uct_atomic_op_t ops[] = {UCT_ATOMIC_OP_ADD, UCT_ATOMIC_OP_AND,
                                   UCT_ATOMIC_OP_OR, UCT_ATOMIC_OP_XOR};
    const uct_iface_attr_t &a = sender.attr;
    uint64_t flags = (size == 4) ? a.cap.atomic32.op_flags :
                                   a.cap.atomic64.op_flags;
    const size_t len = 4096;
    /* 32-bit words also at 4 (mod 8): the neighbours must not change */
    const size_t offs64[] = {0, 64, len - 8};
    const size_t offs32[] = {0, 68, len - 4};
    const size_t *offs    = (size == 4) ? offs32 : offs64;

    target::rbuf r = tgt->alloc(kind, len);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));

    for (uct_atomic_op_t op : ops) {
        ASSERT_TRUE(flags & UCS_BIT(op))
            << "atomic" << size * 8 << " " << atomic_op_name(op)
            << " (post) is not advertised";
        for (int k = 0; k < 3; ++k) {
            size_t off = offs[k];
            SCOPED_TRACE(std::string("atomic") + std::to_string(size * 8) +
                         "_post " + atomic_op_name(op) + " at offset " +
                         std::to_string(off));
            uint64_t bg   = next_seed();
            uint64_t init = pat_word(next_seed(), 0);
            uint64_t val  = pat_word(next_seed(), 1);
            tgt->fill(r.id, 0, len, bg, 0);
            if (size == 4) {
                tgt->write_u32(r.id, off, (uint32_t)init);
            } else {
                tgt->write_u64(r.id, off, init);
            }
            ucs_status_t st = retry_send([&] {
                return (size == 4) ?
                       uct_ep_atomic32_post(ep, op, (uint32_t)val,
                                            r.addr + off, rk.rkey()) :
                       uct_ep_atomic64_post(ep, op, val, r.addr + off,
                                            rk.rkey());
            }, ents);
            ASSERT_EQ(UCS_OK, st);
            ASSERT_EQ(UCS_OK, flush_ep(ep, ents));
            uint64_t got = (size == 4) ? tgt->read_u32(r.id, off) :
                                         tgt->read_u64(r.id, off);
            EXPECT_EQ(apply_op(op, init, val, 0, size), got);
            EXPECT_EQ(-1, tgt->check(r.id, 0, off, bg, 0))
                << "bytes before the word changed";
            EXPECT_EQ(-1, tgt->check(r.id, off + size, len - off - size, bg,
                                     off + size))
                << "bytes after the word changed";
        }
    }
    EXPECT_EQ(0u, sender.errors.size());
    rk.release();
    tgt->free(r.id);
}

void UctOps::run_atomic_fetch(unsigned size)
{
    const uct_atomic_op_t ops[] = {UCT_ATOMIC_OP_ADD, UCT_ATOMIC_OP_AND,
                                   UCT_ATOMIC_OP_OR, UCT_ATOMIC_OP_XOR,
                                   UCT_ATOMIC_OP_SWAP, UCT_ATOMIC_OP_CSWAP};
    const uct_iface_attr_t &a = sender.attr;
    uint64_t flags = (size == 4) ? a.cap.atomic32.fop_flags :
                                   a.cap.atomic64.fop_flags;
    const size_t len = 4096;
    const size_t offs64[] = {0, 64, len - 8};
    const size_t offs32[] = {0, 68, len - 4};
    const size_t *offs    = (size == 4) ? offs32 : offs64;

    target::rbuf r = tgt->alloc(kind, len);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));

    for (uct_atomic_op_t op : ops) {
        ASSERT_TRUE(flags & UCS_BIT(op))
            << "atomic" << size * 8 << " fetch " << atomic_op_name(op)
            << " is not advertised";
        /* cswap: k odd compares equal (swaps), k even does not */
        for (int k = 0; k < 6; ++k) {
            size_t off = offs[k % 3];
            SCOPED_TRACE(std::string("atomic") + std::to_string(size * 8) +
                         "_fetch " + atomic_op_name(op) + " at offset " +
                         std::to_string(off) + " round " + std::to_string(k));
            uint64_t bg   = next_seed();
            uint64_t init = pat_word(next_seed(), 0);
            uint64_t val  = pat_word(next_seed(), 1);
            uint64_t cmp  = (k & 1) ? init : ~init;
            tgt->fill(r.id, 0, len, bg, 0);
            if (size == 4) {
                tgt->write_u32(r.id, off, (uint32_t)init);
            } else {
                tgt->write_u64(r.id, off, init);
            }
            uint64_t res64 = 0xdeadbeefdeadbeefull;
            uint32_t res32 = 0xdeadbeef;
            test_comp comp;
            ucs_status_t st = run_op([&](test_comp &c) {
                uint64_t raddr = r.addr + off;
                if (op == UCT_ATOMIC_OP_CSWAP) {
                    return (size == 4) ?
                           uct_ep_atomic_cswap32(ep, (uint32_t)cmp,
                                                 (uint32_t)val, raddr,
                                                 rk.rkey(), &res32, &c.uct) :
                           uct_ep_atomic_cswap64(ep, cmp, val, raddr,
                                                 rk.rkey(), &res64, &c.uct);
                }
                return (size == 4) ?
                       uct_ep_atomic32_fetch(ep, op, (uint32_t)val, &res32,
                                             raddr, rk.rkey(), &c.uct) :
                       uct_ep_atomic64_fetch(ep, op, val, &res64, raddr,
                                             rk.rkey(), &c.uct);
            }, comp);
            ASSERT_EQ(UCS_OK, st);
            uint64_t fetched = (size == 4) ? res32 : res64;
            uint64_t mask    = (size == 4) ? 0xffffffffull : ~0ull;
            EXPECT_EQ(init & mask, fetched) << "fetched value";
            ASSERT_EQ(UCS_OK, flush_ep(ep, ents));
            uint64_t got = (size == 4) ? tgt->read_u32(r.id, off) :
                                         tgt->read_u64(r.id, off);
            EXPECT_EQ(apply_op(op, init, val, cmp, size), got)
                << "value after the operation";
            EXPECT_EQ(-1, tgt->check(r.id, 0, off, bg, 0))
                << "bytes before the word changed";
            EXPECT_EQ(-1, tgt->check(r.id, off + size, len - off - size, bg,
                                     off + size))
                << "bytes after the word changed";
        }
    }
    EXPECT_EQ(0u, sender.errors.size());
    rk.release();
    tgt->free(r.id);
}

TEST_P(UctOps, PutShort)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_PUT_SHORT, "PUT_SHORT"));
    size_t ms = sender.attr.cap.put.max_short;
    run_put(PUT_SHORT, sizes_upto({0, 1, 8, ms}, ms));
}

/* Above the inline size put_short writes straight into the peer's mapped
 * device memory, else through a bounce buffer and a WR: the sizes around
 * the inline limit (960) and up to max_short, on every memory kind. */
TEST_P(UctOps, PutShortAboveInline)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_PUT_SHORT, "PUT_SHORT"));
    size_t ms = sender.attr.cap.put.max_short;
    ASSERT_GE(ms, 4097u) << "put_short should reach beyond the inline size";
    run_put(PUT_SHORT, sizes_upto({959, 960, 961, 1024, 4095, 4097, ms - 1,
                                   ms}, ms));
}

/* A put_short one byte above max_short is refused, nothing written. */
TEST_P(UctOps, PutShortAboveMaxShortIsRefused)
{
    size_t ms = sender.attr.cap.put.max_short;
    target::rbuf r = tgt->alloc(kind, ms + 2 * GUARD);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    buffer src;
    ASSERT_NO_FATAL_FAILURE(src.alloc(sender, kind, ms + 64));
    pat_fill(src.data(), ms + 1, 5);
    uint64_t bg = next_seed();
    tgt->fill(r.id, 0, ms + 2 * GUARD, bg, 0);
    EXPECT_EQ(UCS_ERR_INVALID_PARAM,
              uct_ep_put_short(ep, src.data(), (unsigned)(ms + 1),
                               r.addr + GUARD, rk.rkey()));
    ASSERT_EQ(UCS_OK, flush_ep(ep, ents));
    EXPECT_EQ(-1, tgt->check(r.id, 0, ms + 2 * GUARD, bg, 0))
        << "the refused put_short wrote (first changed byte)";
    rk.release();
    tgt->free(r.id);
}

TEST_P(UctOps, PutBcopy)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_PUT_BCOPY, "PUT_BCOPY"));
    size_t ms = sender.attr.cap.put.max_short;
    size_t mb = sender.attr.cap.put.max_bcopy;
    run_put(PUT_BCOPY, sizes_upto({0, 1, 8, ms, ms + 1, mb}, mb));
}

TEST_P(UctOps, PutZcopy)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_PUT_ZCOPY, "PUT_ZCOPY"));
    auto &c = sender.attr.cap.put;
    run_put(PUT_ZCOPY, zcopy_sizes(c.max_short, c.max_bcopy, c.max_zcopy));
}

TEST_P(UctOps, PutZcopyIov)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_PUT_ZCOPY, "PUT_ZCOPY"));
    auto &c = sender.attr.cap.put;
    ASSERT_GE(c.max_iov, 1u);
    run_put(PUT_ZCOPY, sizes_upto({1, 8, 100, c.max_bcopy + 3, MIB + 5},
                                  c.max_zcopy),
            c.max_iov);
}

TEST_P(UctOps, PutZcopyFromOtherMemoryKind)
{
    /* device <-> plain: the local buffer is of another kind */
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_PUT_ZCOPY, "PUT_ZCOPY"));
    auto &c = sender.attr.cap.put;
    run_put(PUT_ZCOPY, sizes_upto({8, c.max_bcopy + 1, MIB}, c.max_zcopy), 1,
            (kind == MEM_PLAIN) ? MEM_IFACE_ALLOC : MEM_PLAIN);
}

TEST_P(UctOps, GetBcopy)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_GET_BCOPY, "GET_BCOPY"));
    size_t ms = sender.attr.cap.put.max_short; /* get has no short form */
    size_t mb = sender.attr.cap.get.max_bcopy;
    run_get(GET_BCOPY, sizes_upto({0, 1, 8, ms, ms + 1, mb}, mb));
}

TEST_P(UctOps, GetZcopy)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_GET_ZCOPY, "GET_ZCOPY"));
    auto &c = sender.attr.cap.get;
    run_get(GET_ZCOPY, zcopy_sizes(sender.attr.cap.put.max_short, c.max_bcopy,
                                   c.max_zcopy));
}

TEST_P(UctOps, GetZcopyIov)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_GET_ZCOPY, "GET_ZCOPY"));
    auto &c = sender.attr.cap.get;
    ASSERT_GE(c.max_iov, 1u);
    run_get(GET_ZCOPY, sizes_upto({1, 8, 100, c.max_bcopy + 3, MIB + 5},
                                  c.max_zcopy),
            c.max_iov);
}

TEST_P(UctOps, GetZcopyToOtherMemoryKind)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_GET_ZCOPY, "GET_ZCOPY"));
    auto &c = sender.attr.cap.get;
    run_get(GET_ZCOPY, sizes_upto({8, c.max_bcopy + 1, MIB}, c.max_zcopy), 1,
            (kind == MEM_PLAIN) ? MEM_MD_ALLOC : MEM_PLAIN);
}

TEST_P(UctOps, PutUnalignedAddresses)
{
    /* odd local and remote addresses, odd lengths */
    auto &c = sender.attr.cap.put;
    roff = 5;
    loff = 3;
    run_put(PUT_SHORT, sizes_upto({1, 7, 13, c.max_short}, c.max_short));
    run_put(PUT_BCOPY, sizes_upto({1, 7, c.max_short + 3, c.max_bcopy},
                                  c.max_bcopy));
    run_put(PUT_ZCOPY, sizes_upto({1, 7, c.max_bcopy + 9, MIB + 11},
                                  c.max_zcopy), 3);
}

TEST_P(UctOps, GetUnalignedAddresses)
{
    auto &c = sender.attr.cap.get;
    roff = 7;
    loff = 1;
    run_get(GET_BCOPY, sizes_upto({1, 7, 13, c.max_bcopy}, c.max_bcopy));
    run_get(GET_ZCOPY, sizes_upto({1, 7, c.max_bcopy + 9, MIB + 11},
                                  c.max_zcopy), 3);
}

TEST_P(UctOps, AmShort)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_AM_SHORT, "AM_SHORT"));
    /* am.max_short counts the 8-byte header */
    size_t ms = sender.attr.cap.am.max_short;
    ASSERT_GE(ms, 8u);
    run_am(AM_SHORT, sizes_upto({0, 1, 8, ms - 8}, ms - 8));
}

TEST_P(UctOps, AmShortIov)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_AM_SHORT, "AM_SHORT"));
    size_t ms = sender.attr.cap.am.max_short;
    ASSERT_GE(ms, 8u);
    run_am(AM_SHORT_IOV, sizes_upto({0, 1, 8, 100, ms - 8}, ms - 8),
           sender.attr.cap.am.max_iov);
}

TEST_P(UctOps, AmBcopy)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_AM_BCOPY, "AM_BCOPY"));
    size_t ms = sender.attr.cap.am.max_short;
    size_t mb = sender.attr.cap.am.max_bcopy;
    run_am(AM_BCOPY, sizes_upto({0, 1, 8, ms - 8, ms, ms + 1, mb - 8},
                                mb - 8));
}

TEST_P(UctOps, AmZcopy)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_AM_ZCOPY, "AM_ZCOPY"));
    size_t ms = sender.attr.cap.am.max_short;
    size_t mz = sender.attr.cap.am.max_zcopy;
    ASSERT_GE(sender.attr.cap.am.max_hdr, 8u);
    run_am(AM_ZCOPY, sizes_upto({0, 1, 8, ms - 8, ms, ms + 1, mz - 8},
                                mz - 8));
}

TEST_P(UctOps, AmZcopyIov)
{
    ASSERT_NO_FATAL_FAILURE(require(UCT_IFACE_FLAG_AM_ZCOPY, "AM_ZCOPY"));
    size_t mz = sender.attr.cap.am.max_zcopy;
    run_am(AM_ZCOPY, sizes_upto({1, 8, 100, 1000, mz - 8}, mz - 8),
           sender.attr.cap.am.max_iov);
}

TEST_P(UctOps, Atomic32Post)
{
    run_atomic_post(4);
}

TEST_P(UctOps, Atomic64Post)
{
    run_atomic_post(8);
}

TEST_P(UctOps, Atomic32Fetch)
{
    run_atomic_fetch(4);
}

TEST_P(UctOps, Atomic64Fetch)
{
    run_atomic_fetch(8);
}

TEST_P(UctOps, MixedBurstThenFlush)
{
    /* many operations of every kind in flight, one flush, all data right */
    const size_t n = 64, chunk = 16384;
    target::rbuf r = tgt->alloc(kind, n * chunk + 4096);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    buffer src;
    ASSERT_NO_FATAL_FAILURE(src.alloc(sender, kind, n * chunk));
    uint64_t s = next_seed();
    pat_fill(src.data(), n * chunk, s);
    tgt->fill(r.id, 0, n * chunk + 4096, next_seed(), 0);
    tgt->write_u64(r.id, n * chunk, 0);

    std::vector<test_comp> comps(n);
    for (size_t i = 0; i < n; ++i) {
        uct_iov_t iov;
        fill_iov(&iov, src.data() + i * chunk, chunk, 1, src.memh);
        comps[i].reset();
        ucs_status_t st = retry_send([&] {
            return uct_ep_put_zcopy(ep, &iov, 1, r.addr + i * chunk,
                                    rk.rkey(), &comps[i].uct);
        }, ents);
        ASSERT_TRUE((st == UCS_OK) || (st == UCS_INPROGRESS)) << st;
        if (st == UCS_OK) {
            comps[i].calls = 1; /* done at once */
            comps[i].uct.count = 0;
        }
        st = retry_send([&] {
            return uct_ep_atomic64_post(ep, UCT_ATOMIC_OP_ADD, i + 1,
                                        r.addr + n * chunk, rk.rkey());
        }, ents);
        ASSERT_EQ(UCS_OK, st);
    }
    ASSERT_EQ(UCS_OK, flush_ep(ep, ents));
    for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(1, comps[i].calls) << "put " << i;
        EXPECT_EQ(0, comps[i].uct.count) << "put " << i;
    }
    EXPECT_EQ(-1, tgt->check(r.id, 0, n * chunk, s, 0));
    EXPECT_EQ(n * (n + 1) / 2, tgt->read_u64(r.id, n * chunk));
    rk.release();
    tgt->free(r.id);
}

/* ------------------------------------------------------------ data trace */

/* UCX_LOG_LEVEL=data prints every operation, as UCX's own transports do
 * (UCX's uct_p2p_test counts the lines).  Each one is a line at
 * UCS_LOG_LEVEL_TRACE_DATA naming it, caught here by a log handler that
 * keeps them from stderr. */
namespace {
std::vector<std::string> *trace_lines;
ucs_log_level_t           trace_saved_level;

ucs_log_func_rc_t catch_data_lines(const char *, unsigned, const char *,
                                   ucs_log_level_t level,
                                   const ucs_log_component_config_t *,
                                   const char *message, va_list ap)
{
    if (level != UCS_LOG_LEVEL_TRACE_DATA) {
        /* what the level raised here lets through: not printed */
        return (level <= trace_saved_level) ? UCS_LOG_FUNC_RC_CONTINUE :
                                              UCS_LOG_FUNC_RC_STOP;
    }
    char line[512];
    vsnprintf(line, sizeof(line), message, ap);
    trace_lines->push_back(line);
    return UCS_LOG_FUNC_RC_STOP;
}
} /* namespace */

TEST_P(UctOps, EveryOperationIsPrintedAtDataLevel)
{
    std::vector<std::string> lines;
    ucs_log_level_t saved = ucs_global_opts.log_component.log_level;
    trace_saved_level     = saved;
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_TRACE_DATA;
    if (!ucs_log_is_enabled(UCS_LOG_LEVEL_TRACE_DATA)) {
        ucs_global_opts.log_component.log_level = saved;
        GTEST_SKIP() << "this UCX is built with a maximum log level below "
                        "data (UCS_MAX_LOG_LEVEL): nothing can print there";
    }
    trace_lines = &lines;
    ucs_log_push_handler(catch_data_lines);
    struct restore {
        ucs_log_level_t level;
        ~restore() {
            ucs_global_opts.log_component.log_level = level;
            ucs_log_pop_handler();
        }
    } r{saved};

    /* the name each operation's line carries */
    auto printed = [&](const char *what, const std::function<void()> &run) {
        size_t before = lines.size();
        run();
        bool found = false;
        for (size_t i = before; i < lines.size(); ++i) {
            found = found || (lines[i].find(what) != std::string::npos);
        }
        EXPECT_TRUE(found) << what << ": no line at data level among "
                           << (lines.size() - before);
    };
    printed("PUT_SHORT", [&] { run_put(PUT_SHORT, {8}); });
    printed("PUT_BCOPY", [&] { run_put(PUT_BCOPY, {8}); });
    printed("PUT_ZCOPY", [&] { run_put(PUT_ZCOPY, {4096}); });
    printed("GET_BCOPY", [&] { run_get(GET_BCOPY, {8}); });
    printed("GET_ZCOPY", [&] { run_get(GET_ZCOPY, {4096}); });
    /* an AM is traced whole, header and payload, as its receiver gets it:
     * what an AM tracer (UCP's) decodes */
    std::vector<std::string> traced;
    uct_iface_set_am_tracer(sender.iface,
                            [](void *arg, uct_am_trace_type_t type, uint8_t,
                               const void *data, size_t length, char *buf,
                               size_t) {
                                if (type == UCT_AM_TRACE_TYPE_SEND) {
                                    ((std::vector<std::string>*)arg)->push_back(
                                            std::string((const char*)data,
                                                        length));
                                }
                                buf[0] = '\0';
                            }, &traced);
    /* the 8-byte header (am_hdr of an 8-byte payload), then the payload */
    auto traced_whole = [&](const char *what) {
        bool found = false;
        for (auto &t : traced) {
            am_hdr h;
            if (t.size() != 16) {
                continue;
            }
            memcpy(&h, t.data(), sizeof(h));
            found = found || ((h.length == 8) &&
                              (pat_check(&t[8], 8, h.seed) == -1));
        }
        EXPECT_TRUE(found) << what << ": no send traced as its 8-byte header "
                                      "and 8 bytes of payload";
        traced.clear();
    };
    printed("TX: AM_SHORT ", [&] { run_am(AM_SHORT, {8}, 1, 1); });
    traced_whole("am_short");
    printed("TX: AM_SHORT_IOV", [&] { run_am(AM_SHORT_IOV, {8}, 2, 1); });
    traced_whole("am_short_iov");
    printed("TX: AM_BCOPY", [&] { run_am(AM_BCOPY, {8}, 1, 1); });
    traced_whole("am_bcopy");
    uct_iface_set_am_tracer(sender.iface, nullptr, nullptr);
    printed("TX: AM_ZCOPY", [&] { run_am(AM_ZCOPY, {4096}, 1, 1); });
    printed("ATOMIC64", [&] { run_atomic_post(8); });
    printed("ATOMIC32", [&] { run_atomic_fetch(4); });
    if (topo == TOPO_LOCAL) {
        printed("RX am_id", [&] { run_am(AM_BCOPY, {8}, 1, 1); });
    }
}

static std::string ops_param_name(
        const ::testing::TestParamInfo<ops_param> &info)
{
    return std::string(topology_name(std::get<0>(info.param))) + "_" +
           mem_kind_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    hca, UctOps,
    on_fabrics(::testing::Combine(::testing::Values(TOPO_LOCAL, TOPO_REMOTE,
                                                    TOPO_REMOTE_NO_CMA),
                                  ::testing::Values(MEM_IFACE_ALLOC,
                                                    MEM_MD_ALLOC, MEM_PLAIN))),
    fabric_param_name<ops_param>(ops_param_name));

/* ------------------------------------------------------------ shared md */

TEST_F(UctHcaCaps, TwoIfacesOnOneMd)
{
    entity a, b;
    ASSERT_NO_FATAL_FAILURE(a.open());
    ASSERT_NO_FATAL_FAILURE(b.open_on_md(a));
    size_t got = 0;
    ASSERT_EQ(UCS_OK, uct_iface_set_am_handler(
                      b.iface, AM_ID,
                      [](void *arg, void *, size_t len, unsigned) {
                          *(size_t*)arg += len;
                          return UCS_OK;
                      }, &got, 0));
    uct_ep_h ep = a.connect_to(b);
    ASSERT_NE(nullptr, ep);
    std::vector<entity*> ents = {&a, &b};
    (void)ents;

    buffer mem, src;
    ASSERT_NO_FATAL_FAILURE(mem.alloc(b, MEM_IFACE_ALLOC, 65536));
    ASSERT_NO_FATAL_FAILURE(src.alloc(a, MEM_PLAIN, 65536));
    pat_fill(src.data(), 65536, 42);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(a.component, mem.rkey()));
    uct_iov_t iov;
    fill_iov(&iov, src.data(), 65536, 1, src.memh);
    test_comp comp;
    ASSERT_EQ(UCS_OK, complete_op(retry_send([&] {
        return uct_ep_put_zcopy(ep, &iov, 1, mem.addr(), rk.rkey(), &comp.uct);
    }, ents), comp, ents));
    ASSERT_EQ(UCS_OK, flush_ep(ep, ents));
    EXPECT_EQ(-1, pat_check(mem.data(), 65536, 42));

    ASSERT_EQ(UCS_OK, retry_send([&] {
        return uct_ep_am_short(ep, AM_ID, 1, src.data(), 100);
    }, ents));
    EXPECT_TRUE(wait_for([&] { return got == 108; }, ents)) << got;
    rk.release();
    mem.free();
    src.free();
    b.close(); /* before the md it shares with a */
    a.close();
}
