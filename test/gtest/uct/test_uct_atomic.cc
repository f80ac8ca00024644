/*
 * test_uct_atomic.cc - atomics under contention: two peer processes post
 * and fetch 32/64-bit adds and run compare-and-swap increment loops on the
 * same words while the target process's own CPU does __atomic_fetch_add and
 * CAS loops on them; the final values must be exact, and every fetched
 * value of a sequential fetch-add stream must increase.  On device memory
 * (CPU atomics through the peers' mappings) and on plain registered memory
 * (executed by the target's responder).
 */
#include "uct_test_common.h"

#include <sched.h>
#include <time.h>

using namespace hcat;

namespace {

enum {
    OFF_ADD64  = 0,
    OFF_ADD32  = 64,
    OFF_CSWAP  = 128,
    OFF_CSWAP32 = 192,
    OFF_OR64   = 256,
    AREA       = 4096
};

struct peer_report {
    uint64_t iters, cswap_tries, fetch_not_increasing, errors;
};

/* child: at least n rounds (and 0.4 s) of post-add, fetch-add (64 and 32 bit), cswap increments
 * and or-ing its own bits */
int atomic_peer(channel &ch, unsigned id, unsigned n, uct_fabric f)
{
    entity e;
    std::string msg;

    e.open(fabric_config(f));
    if (::testing::Test::HasFatalFailure()) {
        return 2;
    }
    if (!ch.recv(&msg, 20000)) {
        return 3;
    }
    wire w(msg);
    std::string dev = w.blob(), ifa = w.blob(), rkb = w.blob();
    uint64_t base = w.u64();
    uct_ep_h ep = e.create_ep(dev, ifa);
    rkey_holder rk;
    if ((ep == nullptr) || (rk.unpack(e.component, rkb) != UCS_OK)) {
        return 4;
    }
    std::vector<entity*> ents = {&e};
    ch.send("ready");
    if (!ch.recv(&msg, 20000)) {
        return 5;
    }

    peer_report rep = {0, 0, 0, 0};
    uint64_t prev64 = 0, cur = 0;
    uint32_t prev32 = 0, cur32 = 0;
    auto fetch64 = [&](uct_atomic_op_t op, uint64_t v, uint64_t off,
                       uint64_t *res) {
        test_comp c;
        ucs_status_t st = retry_send([&] {
            c.reset();
            return uct_ep_atomic64_fetch(ep, op, v, res, base + off,
                                         rk.rkey(), &c.uct);
        }, ents);
        return complete_op(st, c, ents);
    };
    /* at least n rounds, and long enough to overlap with the others */
    double t_end = now_sec() + 0.4;
    for (unsigned i = 0; (i < n) || (now_sec() < t_end); ++i) {
        ucs_status_t st = retry_send([&] {
            return uct_ep_atomic64_post(ep, UCT_ATOMIC_OP_ADD, 1,
                                        base + OFF_ADD64, rk.rkey());
        }, ents);
        rep.errors += (st != UCS_OK);
        uint64_t r64 = 0;
        rep.errors += (fetch64(UCT_ATOMIC_OP_ADD, 1, OFF_ADD64, &r64) !=
                       UCS_OK);
        rep.fetch_not_increasing += (i > 0) && (r64 <= prev64);
        prev64 = r64;

        st = retry_send([&] {
            return uct_ep_atomic32_post(ep, UCT_ATOMIC_OP_ADD, 1,
                                        base + OFF_ADD32, rk.rkey());
        }, ents);
        rep.errors += (st != UCS_OK);
        uint32_t r32 = 0;
        test_comp c;
        st = retry_send([&] {
            c.reset();
            return uct_ep_atomic32_fetch(ep, UCT_ATOMIC_OP_ADD, 1, &r32,
                                         base + OFF_ADD32, rk.rkey(), &c.uct);
        }, ents);
        rep.errors += (complete_op(st, c, ents) != UCS_OK);
        rep.fetch_not_increasing += (i > 0) && (r32 <= prev32);
        prev32 = r32;

        /* cswap increment loops, 64 and 32 bit */
        for (;;) {
            uint64_t res = 0;
            rep.cswap_tries++;
            st = retry_send([&] {
                c.reset();
                return uct_ep_atomic_cswap64(ep, cur, cur + 1,
                                             base + OFF_CSWAP, rk.rkey(), &res,
                                             &c.uct);
            }, ents);
            if (complete_op(st, c, ents) != UCS_OK) {
                rep.errors++;
                break;
            }
            if (res == cur) {
                cur++;
                break;
            }
            cur = res;
        }
        for (;;) {
            uint32_t res = 0;
            rep.cswap_tries++;
            st = retry_send([&] {
                c.reset();
                return uct_ep_atomic_cswap32(ep, cur32, cur32 + 1,
                                             base + OFF_CSWAP32, rk.rkey(),
                                             &res, &c.uct);
            }, ents);
            if (complete_op(st, c, ents) != UCS_OK) {
                rep.errors++;
                break;
            }
            if (res == cur32) {
                cur32++;
                break;
            }
            cur32 = res;
        }
        /* or in one bit of our own byte */
        if (i < 8) {
            st = retry_send([&] {
                return uct_ep_atomic64_post(ep, UCT_ATOMIC_OP_OR,
                                            1ull << (id * 8 + i),
                                            base + OFF_OR64, rk.rkey());
            }, ents);
            rep.errors += (st != UCS_OK);
        }
        rep.iters++;
    }
    if (flush_ep(ep, ents) != UCS_OK) {
        rep.errors++;
    }
    rep.errors += e.errors.size();
    wire out;
    out.u64(rep.iters).u64(rep.cswap_tries).u64(rep.fetch_not_increasing)
       .u64(rep.errors);
    ch.send(out.data);
    ch.recv(&msg, 30000);
    rk.release();
    return 0;
}

class UctAtomicContention : public uct_test_base,
                            public with_fabric<mem_kind> {};

TEST_P(UctAtomicContention, TwoPeersAndLocalCpuExact)
{
    const unsigned npeers = 2, n = 500;
    std::vector<child> kids;
    for (unsigned i = 0; i < npeers; ++i) {
        const uct_fabric f = GetFabric();
        kids.push_back(fork_child([i, n, f](channel &ch) {
            return atomic_peer(ch, i, n, f);
        }, 120));
    }
    entity tgt;
    ASSERT_NO_FATAL_FAILURE(tgt.open(fabric_config(GetFabric())));
    buffer mem;
    ASSERT_NO_FATAL_FAILURE(mem.alloc(tgt, GetParam(), AREA));
    memset(mem.data(), 0, AREA);
    uint64_t *add64   = (uint64_t*)(mem.data() + OFF_ADD64);
    uint32_t *add32   = (uint32_t*)(mem.data() + OFF_ADD32);
    uint64_t *cswap64 = (uint64_t*)(mem.data() + OFF_CSWAP);
    uint32_t *cswap32 = (uint32_t*)(mem.data() + OFF_CSWAP32);
    uint64_t *or64    = (uint64_t*)(mem.data() + OFF_OR64);

    wire w;
    w.blob(tgt.dev_addr).blob(tgt.iface_addr).blob(mem.rkey()).u64(mem.addr());
    for (auto &k : kids) {
        ASSERT_TRUE(k.ch.send(w.data));
    }
    for (auto &k : kids) {
        std::string msg;
        ASSERT_TRUE(k.ch.recv(&msg, 20000)) << "peer not ready";
    }
    for (auto &k : kids) {
        ASSERT_TRUE(k.ch.send("go"));
    }

    /* contend from this CPU until both peers report */
    uint64_t mine = 0;
    std::vector<std::string> reports(npeers);
    std::vector<bool> got(npeers, false);
    unsigned ngot = 0;
    deadline dl(90);
    while ((ngot < npeers) && !dl.expired()) {
        for (int j = 0; j < 64; ++j) {
            __atomic_fetch_add(add64, 1, __ATOMIC_SEQ_CST);
            __atomic_fetch_add(add32, 1, __ATOMIC_SEQ_CST);
            uint64_t c = __atomic_load_n(cswap64, __ATOMIC_SEQ_CST);
            while (!__atomic_compare_exchange_n(cswap64, &c, c + 1, false,
                                                __ATOMIC_SEQ_CST,
                                                __ATOMIC_SEQ_CST)) {
            }
            uint32_t c32 = __atomic_load_n(cswap32, __ATOMIC_SEQ_CST);
            while (!__atomic_compare_exchange_n(cswap32, &c32, c32 + 1, false,
                                                __ATOMIC_SEQ_CST,
                                                __ATOMIC_SEQ_CST)) {
            }
            ++mine;
        }
        if (mine == 64) {
            __atomic_fetch_or(or64, 1ull << 63, __ATOMIC_SEQ_CST);
        }
        /* A compare-and-swap loop succeeds only in a window in which the
         * word stays put for one round trip of its own.  A CPU that
         * hammers the word without a pause starves every remote CAS loop,
         * on any HCA (whether it ever finishes is then up to the
         * scheduler: seconds or never on 2 cores).  So this CPU contends in
         * bursts, and gives the CPU away between them: during a burst its
         * atomics interleave with the peers', between bursts their CAS
         * loops get the windows they need. */
        struct timespec gap = {0, 20000};
        nanosleep(&gap, nullptr);
        for (unsigned i = 0; i < npeers; ++i) {
            if (!got[i] && kids[i].ch.readable(0)) {
                ASSERT_TRUE(kids[i].ch.recv(&reports[i], 1000));
                got[i] = true;
                ++ngot;
            }
        }
    }
    ASSERT_EQ(npeers, ngot) << "peers did not finish in time";

    uint64_t iters = 0;
    for (unsigned i = 0; i < npeers; ++i) {
        wire r(reports[i]);
        uint64_t it = r.u64(), tries = r.u64(), notinc = r.u64(),
                 errs = r.u64();
        EXPECT_GE(it, n) << "peer " << i;
        EXPECT_EQ(0u, notinc) << "peer " << i << ": a fetched value did not "
                                 "increase over the previous fetch-add";
        EXPECT_EQ(0u, errs) << "peer " << i << " operation errors";
        printf("[ INFO     ] peer %u: %lu cswap attempts for %lu increments\n",
               i, (unsigned long)tries, (unsigned long)(2 * it));
        iters += it;
    }
    printf("[ INFO     ] target CPU: %lu increments of each word\n",
           (unsigned long)mine);
    EXPECT_EQ(2 * iters + mine, __atomic_load_n(add64, __ATOMIC_SEQ_CST))
        << "64-bit add/fetch-add total";
    EXPECT_EQ((uint32_t)(2 * iters + mine),
              __atomic_load_n(add32, __ATOMIC_SEQ_CST))
        << "32-bit add/fetch-add total";
    EXPECT_EQ(iters + mine, __atomic_load_n(cswap64, __ATOMIC_SEQ_CST))
        << "64-bit cswap increments";
    EXPECT_EQ((uint32_t)(iters + mine),
              __atomic_load_n(cswap32, __ATOMIC_SEQ_CST))
        << "32-bit cswap increments";
    EXPECT_EQ(0x800000000000ffffull, __atomic_load_n(or64, __ATOMIC_SEQ_CST))
        << "or bits";
    /* the neighbours of the 32-bit words are untouched */
    EXPECT_EQ(0u, *(uint32_t*)(mem.data() + OFF_ADD32 + 4));
    EXPECT_EQ(0u, *(uint32_t*)(mem.data() + OFF_CSWAP32 + 4));

    for (auto &k : kids) {
        k.ch.send("quit");
    }
    for (auto &k : kids) {
        EXPECT_EQ(0, wait_child(k.pid)) << "peer exit status";
        k.ch.close_fds();
    }
    mem.free();
}

INSTANTIATE_TEST_SUITE_P(
        hca, UctAtomicContention,
        on_fabrics(::testing::Values(MEM_IFACE_ALLOC, MEM_MD_ALLOC,
                                     MEM_PLAIN)),
        fabric_param_name<mem_kind>(
                [](const ::testing::TestParamInfo<mem_kind> &i) {
                    return std::string(mem_kind_name(i.param));
                }));

} /* namespace */
