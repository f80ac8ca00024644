/*
 * test_ucp_rma.cc - UCP RMA and atomics over hca (UCX_TLS=hca,self) to a
 * peer process's ucp_mem_map'd memory (allocated by UCP, and user memory):
 * ucp_put_nbx / ucp_get_nbx at several sizes, ucp_atomic_op_nbx (add, and,
 * or, xor posted and fetching, swap, cswap; 32 and 64 bit).  Then checks
 * that UCP really put RMA and AMO on the hca lane: ucp_ep_print_info names
 * hca for the rma_bw and amo lanes, and the operations complete while the
 * peer does not progress at all (AM emulation would need its progress).
 */
#include "ucp_test_common.h"

#include <sstream>

using namespace hcat;

namespace {

const size_t RMA_LEN = 16ul << 20;

enum {
    RCMD_FILL = 1, RCMD_CHECK, RCMD_READ, RCMD_WRITE, RCMD_SLEEP, RCMD_QUIT
};

int rma_target_peer(channel &ch, bool ucp_alloc)
{
    ucp_peer p;
    p.init({}, UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AMO32 |
               UCP_FEATURE_AMO64);
    if (::testing::Test::HasFatalFailure()) {
        return 2;
    }
    ucp_exchange_and_connect(p, ch, false);
    if (::testing::Test::HasFatalFailure()) {
        return 3;
    }

    void *user = nullptr;
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                    UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.length     = RMA_LEN;
    if (ucp_alloc) {
        mp.address = NULL;
        mp.flags   = UCP_MEM_MAP_ALLOCATE;
    } else {
        if (posix_memalign(&user, 4096, RMA_LEN) != 0) {
            return 4;
        }
        mp.address = user;
        mp.flags   = 0;
    }
    ucp_mem_h memh;
    if (ucp_mem_map(p.ctx, &mp, &memh) != UCS_OK) {
        return 5;
    }
    ucp_mem_attr_t ma;
    ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    if (ucp_mem_query(memh, &ma) != UCS_OK) {
        return 6;
    }
    uint8_t *base = (uint8_t*)ma.address;
    memset(base, 0, RMA_LEN);
    void *rkb;
    size_t rks;
    if (ucp_rkey_pack(p.ctx, memh, &rkb, &rks) != UCS_OK) {
        return 7;
    }
    wire hello;
    hello.u64((uint64_t)(uintptr_t)base).blob(std::string((char*)rkb, rks));
    ucp_rkey_buffer_release(rkb);
    ch.send(hello.data);

    int rc = 0;
    for (;;) {
        std::string msg;
        if (!ucp_recv_progress(p, ch, &msg, 120)) {
            rc = 8;
            break;
        }
        wire req(msg), rep;
        uint64_t cmd = req.u64();
        if (cmd == RCMD_QUIT) {
            ch.send("bye");
            break;
        }
        switch (cmd) {
        case RCMD_FILL: {
            uint64_t off = req.u64(), len = req.u64(), seed = req.u64();
            pat_fill(base + off, len, seed);
            break;
        }
        case RCMD_CHECK: {
            uint64_t off = req.u64(), len = req.u64(), seed = req.u64();
            rep.u64((uint64_t)(int64_t)pat_check(base + off, len, seed));
            break;
        }
        case RCMD_READ: {
            uint64_t off = req.u64(), len = req.u64();
            rep.blob(std::string((char*)base + off, len));
            break;
        }
        case RCMD_WRITE: {
            uint64_t off  = req.u64();
            std::string d = req.blob();
            memcpy(base + off, d.data(), d.size());
            break;
        }
        case RCMD_SLEEP: {
            /* asleep: no progress at all */
            uint64_t ms = req.u64();
            ch.send("asleep");
            usleep(ms * 1000);
            rep.blob("awake");
            break;
        }
        }
        ch.send(rep.data);
    }
    ucp_mem_unmap(p.ctx, memh);
    free(user);
    std::string done;
    ucp_recv_progress(p, ch, &done, 5); /* the parent closed its ep */
    p.cleanup();
    return rc;
}

class UcpRma : public uct_test_base,
               public ::testing::WithParamInterface<bool> {
protected:
    void SetUp() override
    {
        bool ucp_alloc = GetParam();
        kid = fork_child([ucp_alloc](channel &ch) {
            return rma_target_peer(ch, ucp_alloc);
        }, 150);
        ASSERT_NO_FATAL_FAILURE(p.init({}, UCP_FEATURE_TAG | UCP_FEATURE_RMA |
                                               UCP_FEATURE_AMO32 |
                                               UCP_FEATURE_AMO64));
        ASSERT_NO_FATAL_FAILURE(ucp_exchange_and_connect(p, kid.ch, true));
        std::string msg;
        ASSERT_TRUE(ucp_recv_progress(p, kid.ch, &msg)) << "no rkey";
        wire w(msg);
        base = w.u64();
        std::string rkb = w.blob();
        ASSERT_EQ(UCS_OK, ucp_ep_rkey_unpack(p.ep, rkb.data(), &rkey));
    }

    void TearDown() override
    {
        if (rkey != nullptr) {
            ucp_rkey_destroy(rkey);
        }
        if (kid.pid > 0) {
            wire q;
            q.u64(RCMD_QUIT);
            std::string msg;
            if (kid.ch.send(q.data)) {
                ucp_recv_progress(p, kid.ch, &msg, 5);
            }
            p.close_ep();
            kid.ch.send("done");
            EXPECT_EQ(0, wait_child(kid.pid, 20)) << "peer exit status";
            kid.ch.close_fds();
        }
        p.cleanup();
        uct_test_base::TearDown();
    }

    bool rpc(const wire &req, wire *rep, double sec = TIMEOUT_SEC)
    {
        std::string msg;
        if (!kid.ch.send(req.data) || !ucp_recv_progress(p, kid.ch, &msg, sec)) {
            ADD_FAILURE() << "peer did not answer";
            return false;
        }
        *rep = wire(msg);
        return true;
    }

    uint64_t read_u64(uint64_t off, unsigned size = 8)
    {
        wire req, rep;
        req.u64(RCMD_READ).u64(off).u64(size);
        uint64_t v = 0;
        if (rpc(req, &rep)) {
            std::string d = rep.blob();
            memcpy(&v, d.data(), std::min<size_t>(size, d.size()));
        }
        return v;
    }

    void write_u64(uint64_t off, uint64_t v, unsigned size = 8)
    {
        wire req, rep;
        req.u64(RCMD_WRITE).u64(off).blob(std::string((char*)&v, size));
        rpc(req, &rep);
    }

    ucs_status_t put(const void *buf, size_t len, uint64_t off)
    {
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        return p.wait(ucp_put_nbx(p.ep, buf, len, base + off, rkey, &prm));
    }

    ucs_status_t get(void *buf, size_t len, uint64_t off, double sec = 15)
    {
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        return p.wait(ucp_get_nbx(p.ep, buf, len, base + off, rkey, &prm),
                      sec);
    }

    /* reply == nullptr: posted (no result) */
    ucs_status_t amo(ucp_atomic_op_t op, uint64_t value, uint64_t *reply,
                     uint64_t off, unsigned size, double sec = 15)
    {
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
        prm.datatype     = ucp_dt_make_contig(size);
        if (reply != nullptr) {
            prm.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
            prm.reply_buffer  = reply;
        }
        return p.wait(ucp_atomic_op_nbx(p.ep, op, &value, 1, base + off, rkey,
                                        &prm), sec);
    }

    void iov_put_and_get();

    child      kid = {-1, channel()};
    ucp_peer   p;
    uint64_t   base = 0;
    ucp_rkey_h rkey = nullptr;
};

TEST_P(UcpRma, PutGetSizes)
{
    /* 961, 8192, 8193: hca's put_short above the inline size, the last
     * put_short and get bcopy/zcopy (cap.get.min_zcopy) boundaries */
    const size_t sizes[] = {1,    8,     100,   961,       4096,
                            8191, 8192,  8193,  65536,     1ul << 20,
                            8ul << 20};
    std::vector<char> src(8ul << 20), dst(8ul << 20);
    /* a ucp_mem_map'd local buffer too */
    ucp_mem_map_params_t mp;
    memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                    UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.length     = 8ul << 20;
    mp.flags      = UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h lmemh;
    ASSERT_EQ(UCS_OK, ucp_mem_map(p.ctx, &mp, &lmemh));
    ucp_mem_attr_t ma;
    ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    ASSERT_EQ(UCS_OK, ucp_mem_query(lmemh, &ma));
    char *mapped = (char*)ma.address;

    for (size_t k = 0; k < 2; ++k) {
        char *s = k ? mapped : src.data();
        for (size_t size : sizes) {
            SCOPED_TRACE(std::string(k ? "mapped" : "user") +
                         " local buffer, size " + std::to_string(size));
            uint64_t seed = size * 3 + k, off = 4096 + 8 * k;
            pat_fill(s, size, seed);
            ASSERT_EQ(UCS_OK, put(s, size, off)) << "ucp_put_nbx";
            ASSERT_EQ(UCS_OK, p.flush_ep()) << "ucp_ep_flush_nbx";
            wire req, rep;
            req.u64(RCMD_CHECK).u64(off).u64(size).u64(seed);
            ASSERT_TRUE(rpc(req, &rep));
            ASSERT_EQ(-1, (int64_t)rep.u64()) << "put data at the peer";

            wire f, frep;
            f.u64(RCMD_FILL).u64(off).u64(size).u64(seed + 1000);
            ASSERT_TRUE(rpc(f, &frep));
            char *d = k ? mapped : dst.data();
            memset(d, 0, size);
            ASSERT_EQ(UCS_OK, get(d, size, off)) << "ucp_get_nbx";
            ASSERT_EQ(-1, pat_check(d, size, seed + 1000)) << "get data";
        }
    }
    EXPECT_EQ(UCS_OK, ucp_mem_unmap(p.ctx, lmemh));
}

/* Puts and gets of a UCP_DATATYPE_IOV buffer (three pieces) at the sizes
 * around hca's thresholds (run by UcpRmaProtoV2 below, with protocols v2:
 * UCP's RMA takes an iov only there): every datatype must reach a protocol
 * that takes it.  (UCX 1.13 with v2 aborted in ucp_get_nbx: "dt_iter->
 * dt_class == UCP_DATATYPE_CONTIG".) */
void UcpRma::iov_put_and_get()
{
    const size_t sizes[] = {3, 24, 961, 8192, 8193, 65536, 1ul << 20};
    /* the pieces 64 bytes apart */
    std::vector<char> src((1ul << 20) + 256), dst((1ul << 20) + 256);
    for (size_t size : sizes) {
        SCOPED_TRACE("size " + std::to_string(size));
        size_t a = size / 3, b = size / 3, c = size - a - b;
        ucp_dt_iov_t siov[3] = {{src.data(), a}, {src.data() + a + 64, b},
                                {src.data() + a + b + 128, c}};
        ucp_dt_iov_t diov[3] = {{dst.data(), a}, {dst.data() + a + 64, b},
                                {dst.data() + a + b + 128, c}};
        std::vector<char> flat(size);
        pat_fill(flat.data(), size, size + 5);
        memcpy(siov[0].buffer, flat.data(), a);
        memcpy(siov[1].buffer, flat.data() + a, b);
        memcpy(siov[2].buffer, flat.data() + a + b, c);
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
        prm.datatype     = ucp_dt_make_iov();
        const uint64_t off = 8192;
        ASSERT_EQ(UCS_OK, p.wait(ucp_put_nbx(p.ep, siov, 3, base + off, rkey,
                                             &prm))) << "iov put";
        ASSERT_EQ(UCS_OK, p.flush_ep());
        wire req, rep;
        req.u64(RCMD_CHECK).u64(off).u64(size).u64(size + 5);
        ASSERT_TRUE(rpc(req, &rep));
        ASSERT_EQ(-1, (int64_t)rep.u64()) << "iov put data at the peer";

        wire f, frep;
        f.u64(RCMD_FILL).u64(off).u64(size).u64(size + 77);
        ASSERT_TRUE(rpc(f, &frep));
        memset(dst.data(), 0, dst.size());
        ASSERT_EQ(UCS_OK, p.wait(ucp_get_nbx(p.ep, diov, 3, base + off, rkey,
                                             &prm))) << "iov get";
        std::vector<char> got(size);
        memcpy(got.data(), diov[0].buffer, a);
        memcpy(got.data() + a, diov[1].buffer, b);
        memcpy(got.data() + a + b, diov[2].buffer, c);
        ASSERT_EQ(-1, pat_check(got.data(), size, size + 77)) << "iov get data";
    }
}

/* Protocols v2 (the default from UCX 1.16 on; UCP's RMA takes an iov
 * datatype only there), zero-copy from the first byte as UCX's
 * test_ucp_rma.*_iov_zcopy run them: UCP must find a protocol that takes
 * the iov at every size, whatever hca's caps say of the mid sizes. */
class UcpRmaProtoV2 : public UcpRma {
protected:
    void SetUp() override
    {
        /* this process and the peer it forks */
        set("UCX_PROTO_ENABLE", "y", &saved_proto);
        set("UCX_ZCOPY_THRESH", "0", &saved_thresh);
        UcpRma::SetUp();
    }

    void TearDown() override
    {
        UcpRma::TearDown();
        restore("UCX_PROTO_ENABLE", saved_proto);
        restore("UCX_ZCOPY_THRESH", saved_thresh);
    }

    static void set(const char *name, const char *value, std::string *saved)
    {
        const char *v = getenv(name);
        *saved = (v != nullptr) ? std::string("=") + v : "";
        setenv(name, value, 1);
    }

    /* the user's own setting back ("=value"), or none */
    static void restore(const char *name, const std::string &saved)
    {
        if (saved.empty()) {
            unsetenv(name);
        } else {
            setenv(name, saved.c_str() + 1, 1);
        }
    }

    std::string saved_proto, saved_thresh;
};

TEST_P(UcpRmaProtoV2, IovPutAndGet)
{
    iov_put_and_get();
}

INSTANTIATE_TEST_SUITE_P(hca, UcpRmaProtoV2, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool> &i) {
                             return std::string(i.param ? "ucp_alloc" :
                                                          "user_memory");
                         });

TEST_P(UcpRma, Atomics)
{
    const ucp_atomic_op_t ops[] = {UCP_ATOMIC_OP_ADD, UCP_ATOMIC_OP_AND,
                                   UCP_ATOMIC_OP_OR, UCP_ATOMIC_OP_XOR};
    for (unsigned size : {4u, 8u}) {
        uint64_t mask = (size == 4) ? 0xffffffffull : ~0ull;
        uint64_t off  = (size == 4) ? 68 : 128;
        for (ucp_atomic_op_t op : ops) {
            for (int fetch = 0; fetch < 2; ++fetch) {
                SCOPED_TRACE("atomic" + std::to_string(size * 8) + " op " +
                             std::to_string(op) + (fetch ? " fetch" : " post"));
                uint64_t init = pat_word(op * 10 + fetch, size) & mask;
                uint64_t val  = pat_word(op * 10 + fetch, 99) & mask;
                write_u64(off, init, size);
                uint64_t reply = 0xdeadbeefdeadbeefull & mask;
                ASSERT_EQ(UCS_OK, amo(op, val, fetch ? &reply : nullptr, off,
                                      size));
                ASSERT_EQ(UCS_OK, p.flush_ep());
                uint64_t expect = (op == UCP_ATOMIC_OP_ADD) ? init + val :
                                  (op == UCP_ATOMIC_OP_AND) ? init & val :
                                  (op == UCP_ATOMIC_OP_OR)  ? init | val :
                                                              init ^ val;
                EXPECT_EQ(expect & mask, read_u64(off, size));
                if (fetch) {
                    EXPECT_EQ(init, reply & mask) << "fetched value";
                }
            }
        }
        /* swap */
        uint64_t init = 0x1111222233334444ull & mask, val = 0x5555ull;
        write_u64(off, init, size);
        uint64_t reply = 0;
        ASSERT_EQ(UCS_OK, amo(UCP_ATOMIC_OP_SWAP, val, &reply, off, size));
        EXPECT_EQ(init, reply & mask) << "swap result";
        EXPECT_EQ(val, read_u64(off, size)) << "after swap";
        /* cswap: buffer holds the compare value, reply_buffer the new value
         * (and receives the old one) */
        reply = 0x7777;
        ASSERT_EQ(UCS_OK, amo(UCP_ATOMIC_OP_CSWAP, val, &reply, off, size));
        EXPECT_EQ(val, reply & mask) << "cswap (equal) result";
        EXPECT_EQ(0x7777u, read_u64(off, size)) << "after successful cswap";
        reply = 0x9999;
        ASSERT_EQ(UCS_OK, amo(UCP_ATOMIC_OP_CSWAP, 0x1234 /* not equal */,
                              &reply, off, size));
        EXPECT_EQ(0x7777u, reply & mask) << "cswap (unequal) result";
        EXPECT_EQ(0x7777u, read_u64(off, size)) << "after failed cswap";
        /* the neighbour of a 32-bit word is untouched */
        if (size == 4) {
            EXPECT_EQ(0u, read_u64(off + 4, 4));
        }
    }
}

TEST_P(UcpRma, RmaAndAmoUseHcaNotAmEmulation)
{
    /* 1. the endpoint's lanes: hca carries rma_bw and amo */
    std::string info = p.ep_info();
    bool rma_on_hca = false, amo_on_hca = false, amo_elsewhere = false;
    std::string hca_lane;
    std::istringstream is(info);
    std::string line;
    while (std::getline(is, line)) {
        size_t lp = line.find("lane[");
        if (lp == std::string::npos) {
            continue;
        }
        bool hca = line.find("hca/hca0") != std::string::npos;
        if (hca && hca_lane.empty()) {
            hca_lane = line.substr(lp + 5, line.find(']', lp) - lp - 5);
        }
        if (line.find("rma_bw#") != std::string::npos) {
            rma_on_hca |= hca;
        }
        if (line.find("amo#") != std::string::npos) {
            amo_on_hca    |= hca;
            amo_elsewhere |= !hca;
        }
    }
    EXPECT_TRUE(rma_on_hca) << "no rma_bw lane on hca:\n" << info;
    EXPECT_TRUE(amo_on_hca) << "no amo lane on hca:\n" << info;
    EXPECT_FALSE(amo_elsewhere) << "atomics on another transport:\n" << info;
    /* UCP's protocols v1 (UCX 1.13) list the put/get protocols of every
     * RMA lane: the hca lane has them (with RMA emulated over AM there
     * would be none).  Protocols v2 (the default since 1.16) choose them
     * per operation and print tables of the tagged ones only
     * (ucp/proto/proto_debug.c); part 2 proves for both that puts, gets
     * and atomics do not wait for the peer, as AM emulation would. */
    ASSERT_FALSE(hca_lane.empty()) << "no hca lane:\n" << info;
    bool proto_v2 = info.find("tagged message by") != std::string::npos;
    if (!proto_v2) {
        EXPECT_NE(std::string::npos, info.find("put[" + hca_lane + "]:"))
            << "no put protocol on hca lane " << hca_lane << ":\n" << info;
        EXPECT_NE(std::string::npos, info.find("get[" + hca_lane + "]:"))
            << "no get protocol on hca lane " << hca_lane << ":\n" << info;
    }

    /* 2. one-sided: everything completes while the peer sleeps */
    wire sreq;
    sreq.u64(RCMD_SLEEP).u64(4000);
    ASSERT_TRUE(kid.ch.send(sreq.data));
    std::string msg;
    ASSERT_TRUE(kid.ch.recv(&msg, 10000));
    ASSERT_EQ("asleep", msg);
    double t0 = now_sec();
    std::vector<char> buf(1 << 20);
    pat_fill(buf.data(), buf.size(), 4242);
    EXPECT_EQ(UCS_OK, put(buf.data(), buf.size(), 1 << 20));
    EXPECT_EQ(UCS_OK, p.flush_ep(2.5)) << "put did not complete while the "
                                          "peer was not progressing";
    std::vector<char> back(1 << 20);
    EXPECT_EQ(UCS_OK, get(back.data(), back.size(), 1 << 20, 2.5))
        << "get did not complete while the peer was not progressing";
    EXPECT_EQ(-1, pat_check(back.data(), back.size(), 4242));
    uint64_t reply = 0;
    EXPECT_EQ(UCS_OK, amo(UCP_ATOMIC_OP_ADD, 5, &reply, 0, 8, 2.5))
        << "fetch-add did not complete while the peer was not progressing";
    uint64_t nv = 77;
    EXPECT_EQ(UCS_OK, amo(UCP_ATOMIC_OP_CSWAP, reply + 5, &nv, 0, 8, 2.5))
        << "cswap did not complete while the peer was not progressing";
    EXPECT_EQ(reply + 5, nv);
    EXPECT_EQ(UCS_OK, amo(UCP_ATOMIC_OP_ADD, 1, nullptr, 0, 8, 2.5));
    EXPECT_EQ(UCS_OK, p.flush_ep(2.5));
    double dt = now_sec() - t0;
    EXPECT_LT(dt, 3.5) << "the operations waited for the peer to wake up";
    ASSERT_TRUE(ucp_recv_progress(p, kid.ch, &msg, 10)) << "peer did not wake";
    EXPECT_EQ(78u, read_u64(0));
}

INSTANTIATE_TEST_SUITE_P(hca, UcpRma, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool> &i) {
                             return std::string(i.param ? "ucp_alloc" :
                                                          "user_memory");
                         });

} /* namespace */
