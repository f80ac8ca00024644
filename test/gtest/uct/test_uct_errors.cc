/*
 * test_uct_errors.cc - error handling: a bad or stale rkey and accesses
 * outside the registered range fail (error handler or error completion) and
 * write nothing; a peer killed with SIGKILL is detected from progress in
 * bounded time when sending with UCT_SEND_FLAG_PEER_CHECK or calling
 * uct_ep_check, the handler runs once, later operations fail and nothing
 * hangs.
 */
#include "uct_test_common.h"

#include <signal.h>
#include <sys/wait.h>

#include <tuple>

using namespace hcat;

namespace {

/* marks the entity as inside a send call while alive */
struct call_guard {
    explicit call_guard(entity &x) : e(x) { e.in_call = true; }
    ~call_guard() { e.in_call = false; }
    entity &e;
};

/* What an erroneous operation produced */
struct failure {
    ucs_status_t immediate;   /* what the call returned */
    ucs_status_t completion;  /* UCS_ERR_LAST: not called */
    int          handler;     /* error handler calls for the ep */
    ucs_status_t handler_status;

    bool failed() const
    {
        return UCS_STATUS_IS_ERR(immediate) ||
               ((completion != UCS_ERR_LAST) && (completion != UCS_OK)) ||
               (handler > 0);
    }
};

std::ostream &operator<<(std::ostream &os, const failure &f)
{
    return os << "returned " << f.immediate << ", completion "
              << ((f.completion == UCS_ERR_LAST) ? std::string("not called") :
                  std::string(ucs_status_string(f.completion)))
              << ", error handler called " << f.handler << " time(s)"
              << (f.handler ? std::string(" with ") +
                                  ucs_status_string(f.handler_status) :
                              std::string());
}

enum bad_op {
    BAD_PUT_SHORT = 0, BAD_PUT_BCOPY, BAD_PUT_ZCOPY, BAD_GET_BCOPY,
    BAD_GET_ZCOPY, BAD_ATOMIC_POST, BAD_ATOMIC_FETCH, BAD_OP_LAST
};

const char *bad_op_name(int op)
{
    static const char *names[] = {"put_short", "put_bcopy", "put_zcopy",
                                  "get_bcopy", "get_zcopy", "atomic64_post",
                                  "atomic64_fetch"};
    return names[op];
}

/* Issues `op` of `len` bytes to raddr/rkey on ep and waits (bounded) for
 * the outcome: an error return, an error completion or the handler. */
failure issue_bad(entity &e, uct_ep_h ep, int op, uint64_t raddr,
                  uct_rkey_t rkey, size_t len, buffer &local,
                  const std::vector<entity*> &ents)
{
    failure f = {UCS_OK, UCS_ERR_LAST, 0, UCS_OK};
    test_comp c;
    uint64_t result = 0;
    uct_iov_t iov = {local.data(), len, local.memh, 0, 1};

    f.immediate = retry_send([&] {
        c.reset();
        call_guard guard(e);
        switch (op) {
        case BAD_PUT_SHORT:
            return uct_ep_put_short(ep, local.data(), (unsigned)len, raddr,
                                    rkey);
        case BAD_PUT_BCOPY: {
            ssize_t n = uct_ep_put_bcopy(
                ep, [](void *dest, void *arg) -> size_t {
                    buffer *b = (buffer*)arg;
                    memcpy(dest, b->data(), 64);
                    return 64;
                }, &local, raddr, rkey);
            return (n < 0) ? (ucs_status_t)n : UCS_OK;
        }
        case BAD_PUT_ZCOPY:
            return uct_ep_put_zcopy(ep, &iov, 1, raddr, rkey, &c.uct);
        case BAD_GET_BCOPY:
            return uct_ep_get_bcopy(
                ep, [](void *arg, const void *data, size_t l) {
                    memcpy(arg, data, l);
                }, local.data(), len, raddr, rkey, &c.uct);
        case BAD_GET_ZCOPY:
            return uct_ep_get_zcopy(ep, &iov, 1, raddr, rkey, &c.uct);
        case BAD_ATOMIC_POST:
            return uct_ep_atomic64_post(ep, UCT_ATOMIC_OP_ADD, 1, raddr, rkey);
        default:
            return uct_ep_atomic64_fetch(ep, UCT_ATOMIC_OP_ADD, 1, &result,
                                         raddr, rkey, &c.uct);
        }
    }, ents);

    /* wait for the completion (if any) and for the error handler */
    deadline dl(5);
    while (!dl.expired()) {
        for (entity *x : ents) {
            if (x != nullptr) {
                x->progress();
            }
        }
        bool comp_done = (f.immediate != UCS_INPROGRESS) || (c.calls > 0);
        if (comp_done && (e.errors_for(ep) > 0)) {
            break;
        }
        if (comp_done && UCS_STATUS_IS_ERR(f.immediate)) {
            break;
        }
    }
    if (c.calls > 0) {
        f.completion = c.status;
        EXPECT_EQ(1, c.calls) << "completion calls";
        EXPECT_EQ(0, c.uct.count) << "completion invoked more than once";
    } else {
        EXPECT_NE(UCS_INPROGRESS, f.immediate)
            << bad_op_name(op) << ": the completion never came";
    }
    f.handler        = e.errors_for(ep);
    f.handler_status = e.last_error_for(ep);
    return f;
}

typedef std::tuple<topology, mem_kind> err_param;

class UctErrors : public uct_test_base,
                  public with_fabric<err_param> {
protected:
    void SetUp() override
    {
        topo = std::get<0>(GetParam());
        kind = std::get<1>(GetParam());
        ASSERT_NO_FATAL_FAILURE(make_target(topo, &tgt, target_config(),
                                            GetFabric()));
        ASSERT_NO_FATAL_FAILURE(
                sender.open(topology_config(topo, GetFabric())));
        if (topo != TOPO_LOCAL) {
            ((remote_target*)tgt.get())->set_local(&sender);
        }
        ents = {&sender, tgt->local_entity()};
        ASSERT_NO_FATAL_FAILURE(local.alloc(sender, MEM_PLAIN, 1 << 16));
        pat_fill(local.data(), 1 << 16, 99);
    }

    virtual entity_config target_config() const { return entity_config(); }

    void TearDown() override
    {
        if (tgt && (topo != TOPO_LOCAL)) {
            ((remote_target*)tgt.get())->set_local(nullptr);
        }
        local.free();
        sender.close();
        tgt.reset();
        uct_test_base::TearDown();
    }

    /* every op on a fresh ep against raddr/rkey must fail and leave the
     * target's [0, total) as filled (pattern bg) */
    /* [reg_lo, reg_hi): the registered range, where an access is legal
     * (an op whose bytes all fall inside it is skipped) */
    void expect_all_fail(const target::rbuf &r, size_t total, uint64_t bg,
                         uint64_t raddr, uct_rkey_t rkey, size_t len,
                         const std::string &what, uint64_t reg_lo = 0,
                         uint64_t reg_hi = 0)
    {
        for (int op = 0; op < BAD_OP_LAST; ++op) {
            SCOPED_TRACE(what + ", " + bad_op_name(op));
            size_t l = ((op == BAD_ATOMIC_POST) || (op == BAD_ATOMIC_FETCH)) ?
                       8 : ((op == BAD_PUT_BCOPY) ? 64 : len);
            if ((op == BAD_PUT_SHORT) && (l > sender.attr.cap.put.max_short)) {
                l = sender.attr.cap.put.max_short;
            }
            if ((raddr >= reg_lo) && (raddr + l <= reg_hi)) {
                continue; /* a legal access */
            }
            uct_ep_h ep = sender.create_ep(tgt->dev_addr, tgt->iface_addr);
            ASSERT_NE(nullptr, ep);
            failure f = issue_bad(sender, ep, op, raddr, rkey, l, local, ents);
            EXPECT_TRUE(f.failed()) << "the operation did not fail: " << f;
            if (f.handler > 0) {
                EXPECT_EQ(1, f.handler) << "handler called more than once";
                EXPECT_TRUE(UCS_STATUS_IS_ERR(f.handler_status));
            }
            EXPECT_EQ(0, sender.handler_in_call)
                << "the error handler ran inside the send call, not from "
                   "progress";
            /* later operations on the failed ep fail too */
            if (f.handler > 0) {
                ucs_status_t st = uct_ep_put_short(ep, local.data(), 8,
                                                   r.addr, rkey);
                EXPECT_TRUE(UCS_STATUS_IS_ERR(st) &&
                            (st != UCS_ERR_NO_RESOURCE))
                    << "put_short on a failed ep returned " << st;
            }
            sender.destroy_ep(ep);
            EXPECT_EQ(-1, tgt->check(r.id, 0, total, bg, 0))
                << "the failed " << bad_op_name(op)
                << " wrote into the target (first changed byte)";
            tgt->fill(r.id, 0, total, bg, 0);
        }
    }

    topology                topo;
    mem_kind                kind;
    std::unique_ptr<target> tgt;
    entity                  sender;
    buffer                  local;
    std::vector<entity*>    ents;
};

TEST_P(UctErrors, GarbageRkeyFailsAndWritesNothing)
{
    const size_t len = 4096;
    target::rbuf r = tgt->alloc(kind, len);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    tgt->fill(r.id, 0, len, 7, 0);
    const uct_rkey_t bad[] = {rk.rkey() ^ 0x00a5a500u, rk.rkey() + 1,
                              0xfffffff0u};
    for (uct_rkey_t b : bad) {
        ASSERT_NO_FATAL_FAILURE(expect_all_fail(r, len, 7, r.addr + 64, b, 256,
                                                "rkey " + std::to_string(b)));
    }
    /* a good ep with the right key still works afterwards */
    uct_ep_h ep = sender.create_ep(tgt->dev_addr, tgt->iface_addr);
    ASSERT_NE(nullptr, ep);
    EXPECT_EQ(UCS_OK, retry_send([&] {
        return uct_ep_put_short(ep, local.data(), 64, r.addr, rk.rkey());
    }, ents));
    EXPECT_EQ(UCS_OK, flush_ep(ep, ents));
    EXPECT_EQ(-1, tgt->check(r.id, 0, 64, 99, 0));
    EXPECT_EQ(0, sender.errors_for(ep));
    rk.release();
    tgt->free(r.id);
}

/* The target's md without its registration cache (UCX_HCA_RCACHE=n),
 * where uct_md_mem_dereg of plain memory ends the key.  With the cache, as
 * with UCX's IB md, uct_md_mem_dereg leaves the region registered until
 * a real deregistration (INVALIDATE, unmap, eviction): UctRcache.* test
 * those.  Device memory is deregistered by uct_mem_free either way. */
class UctErrorsUncached : public UctErrors {
protected:
    entity_config target_config() const override
    {
        entity_config c;
        c.md_cfg.push_back({"RCACHE", "n"});
        return c;
    }
};

TEST_P(UctErrorsUncached, StaleRkeyOfFreedMemoryFails)
{
    const size_t len = 4096;
    /* the live region, to see that nothing lands anywhere */
    target::rbuf live = tgt->alloc(kind, len);
    ASSERT_GT(live.id, 0);
    tgt->fill(live.id, 0, len, 8, 0);
    target::rbuf gone = tgt->alloc(kind, len);
    ASSERT_GT(gone.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, gone.rkey));
    uct_rkey_t stale = rk.rkey();
    uint64_t gone_addr = gone.addr;
    tgt->free(gone.id); /* deregistered (and freed) at the target */
    /* a new registration may reuse resources: it must not honour the old
     * key */
    target::rbuf fresh = tgt->alloc(kind, len);
    ASSERT_GT(fresh.id, 0);
    tgt->fill(fresh.id, 0, len, 9, 0);
    for (int op = 0; op < BAD_OP_LAST; ++op) {
        SCOPED_TRACE(bad_op_name(op));
        uct_ep_h ep = sender.create_ep(tgt->dev_addr, tgt->iface_addr);
        ASSERT_NE(nullptr, ep);
        /* aim at the fresh region's address if it was placed where the old
         * one was, else at the old address */
        failure f = issue_bad(sender, ep, op, gone_addr, stale,
                              (op >= BAD_ATOMIC_POST) ? 8 : 64, local, ents);
        EXPECT_TRUE(f.failed()) << "an rkey of deregistered memory worked: "
                                << f;
        sender.destroy_ep(ep);
        EXPECT_EQ(-1, tgt->check(live.id, 0, len, 8, 0));
        EXPECT_EQ(-1, tgt->check(fresh.id, 0, len, 9, 0));
    }
    rk.release();
    tgt->free(live.id);
    tgt->free(fresh.id);
}

TEST_P(UctErrors, OutOfRangeFailsAndWritesNothingOutside)
{
    /* 3 pages; only the middle one is registered */
    const size_t pg = 4096, total = 3 * pg;
    target::rbuf r = tgt->alloc(kind, total, pg, pg);
    ASSERT_GT(r.id, 0);
    ASSERT_EQ(r.base + pg, r.addr);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    tgt->fill(r.id, 0, total, 11, 0);

    /* the registered page itself works */
    {
        uct_ep_h ep = sender.create_ep(tgt->dev_addr, tgt->iface_addr);
        ASSERT_NE(nullptr, ep);
        uint64_t v = 0x1122334455667788ull;
        ASSERT_EQ(UCS_OK, retry_send([&] {
            return uct_ep_put_short(ep, &v, 8, r.addr + pg - 8, rk.rkey());
        }, ents));
        ASSERT_EQ(UCS_OK, flush_ep(ep, ents));
        EXPECT_EQ(v, tgt->read_u64(r.id, 2 * pg - 8));
        EXPECT_EQ(0, sender.errors_for(ep));
        sender.destroy_ep(ep);
        tgt->fill(r.id, 0, total, 11, 0);
    }
    struct {
        int64_t     off;   /* from the registered start */
        size_t      len;
        const char *what;
    } cases[] = {
        {(int64_t)pg - 8, 64, "crossing the end"},
        {-8, 64, "crossing the start"},
        {(int64_t)pg, 8, "just past the end"},
        {(int64_t)pg + 512, 64, "entirely after"},
        {-(int64_t)pg, 64, "entirely before"},
        {0, pg + 1, "one byte too long"},
        /* above the inline size (put_short's bounce buffer path) */
        {(int64_t)pg - 1024, 2048, "a long access crossing the end"},
        {(int64_t)pg - 4000, 4001, "a long access one byte past the end"},
    };
    for (auto &c : cases) {
        ASSERT_NO_FATAL_FAILURE(expect_all_fail(
            r, total, 11, r.addr + c.off, rk.rkey(), c.len, c.what, r.addr,
            r.addr + pg));
    }
    rk.release();
    tgt->free(r.id);
}

std::string err_param_name(const ::testing::TestParamInfo<err_param> &i)
{
    return std::string(topology_name(std::get<0>(i.param))) + "_" +
           mem_kind_name(std::get<1>(i.param));
}

INSTANTIATE_TEST_SUITE_P(
    hca, UctErrors,
    on_fabrics(::testing::Combine(::testing::Values(TOPO_LOCAL, TOPO_REMOTE,
                                                    TOPO_REMOTE_NO_CMA),
                                  ::testing::Values(MEM_IFACE_ALLOC,
                                                    MEM_PLAIN))),
    fabric_param_name<err_param>(err_param_name));

INSTANTIATE_TEST_SUITE_P(
    hca, UctErrorsUncached,
    on_fabrics(::testing::Combine(::testing::Values(TOPO_LOCAL, TOPO_REMOTE,
                                                    TOPO_REMOTE_NO_CMA),
                                  ::testing::Values(MEM_IFACE_ALLOC,
                                                    MEM_PLAIN))),
    fabric_param_name<err_param>(err_param_name));

/* ------------------------------------------------------------ dead peer */

/* The peer: an iface with device and plain memory; it answers nothing and
 * does not progress (one-sided operations still work) until killed. */
int passive_peer(channel &ch, entity_config cfg)
{
    target_server srv;
    srv.open(cfg);
    if (::testing::Test::HasFatalFailure()) {
        return 2;
    }
    int dev   = srv.alloc(MEM_IFACE_ALLOC, 1 << 20, 0, 0);
    int plain = srv.alloc(MEM_PLAIN, 1 << 20, 0, 0);
    if ((dev < 0) || (plain < 0)) {
        return 3;
    }
    wire w;
    w.blob(srv.ent.dev_addr).blob(srv.ent.iface_addr);
    w.u64(srv.get(dev)->addr()).blob(srv.get(dev)->rkey());
    w.u64(srv.get(plain)->addr()).blob(srv.get(plain)->rkey());
    ch.send(w.data);
    /* receive AMs while asked to, then sleep until killed */
    std::string msg;
    while (ch.recv(&msg, -1)) {
        if (msg == "progress") {
            deadline dl(0.2);
            while (!dl.expired()) {
                srv.ent.progress();
            }
            ch.send("done");
        }
    }
    return 0;
}

class UctDeadPeer : public uct_test_base,
                    public with_fabric<topology> {
protected:
    void SetUp() override
    {
        entity_config cfg = topology_config(GetParam(), GetFabric());
        kid = fork_child([cfg](channel &ch) { return passive_peer(ch, cfg); });
        std::string msg;
        ASSERT_TRUE(kid.ch.recv(&msg, 20000)) << "peer did not start";
        wire w(msg);
        dev_addr   = w.blob();
        iface_addr = w.blob();
        dev_mem    = w.u64();
        dev_rkey   = w.blob();
        plain_mem  = w.u64();
        plain_rkey = w.blob();
        ASSERT_NO_FATAL_FAILURE(e.open(cfg));
        ASSERT_EQ(UCS_OK, rk_dev.unpack(e.component, dev_rkey));
        ASSERT_EQ(UCS_OK, rk_plain.unpack(e.component, plain_rkey));
        ASSERT_NO_FATAL_FAILURE(local.alloc(e, MEM_PLAIN, 1 << 20));
        ep = e.create_ep(dev_addr, iface_addr);
        ASSERT_NE(nullptr, ep);
        /* the connection works while the peer lives */
        ASSERT_NO_FATAL_FAILURE(check_alive());
    }

    void TearDown() override
    {
        rk_dev.release();
        rk_plain.release();
        local.free();
        e.close();
        kid.ch.close_fds();
        uct_test_base::TearDown();
    }

    void check_alive()
    {
        uint64_t v = 42;
        ASSERT_EQ(UCS_OK, retry_send([&] {
            return uct_ep_put_short(ep, &v, 8, plain_mem, rk_plain.rkey());
        }, {&e}));
        ASSERT_EQ(UCS_OK, retry_send([&] {
            return uct_ep_am_short(ep, AM_ID, 0, &v, 0);
        }, {&e}));
        test_comp c;
        uct_iov_t iov = {local.data(), 4096, local.memh, 0, 1};
        ucs_status_t st = retry_send([&] {
            c.reset();
            return uct_ep_get_zcopy(ep, &iov, 1, dev_mem, rk_dev.rkey(),
                                    &c.uct);
        }, {&e});
        ASSERT_EQ(UCS_OK, complete_op(st, c, {&e}));
        ASSERT_EQ(UCS_OK, flush_ep(ep, {&e}));
        ASSERT_TRUE(kid.ch.send("progress"));
        std::string msg;
        ASSERT_TRUE(kid.ch.recv(&msg, 10000));
        ASSERT_EQ(0u, e.errors.size());
    }

    void kill_peer(bool reap = true)
    {
        ASSERT_EQ(0, kill(kid.pid, SIGKILL));
        if (reap) {
            EXPECT_EQ(128 + SIGKILL, wait_child(kid.pid));
        }
    }

    /* after the failure: every operation fails (or completes with an error)
     * without hanging, the handler is not called again */
    void expect_ops_fail()
    {
        int calls_before = e.errors_for(ep);
        uint64_t v = 1, res;
        test_comp c;
        uct_iov_t iov = {local.data(), 4096, local.memh, 0, 1};
        auto check = [&](const char *what, ucs_status_t st) {
            if (st == UCS_INPROGRESS) {
                st = complete_op(st, c, {&e});
                EXPECT_TRUE(UCS_STATUS_IS_ERR(st) && (st != UCS_ERR_TIMED_OUT))
                    << what << " on the failed ep completed with " << st;
            } else {
                EXPECT_TRUE(UCS_STATUS_IS_ERR(st) &&
                            (st != UCS_ERR_NO_RESOURCE))
                    << what << " on the failed ep returned " << st;
            }
        };
        c.reset();
        check("am_short", uct_ep_am_short(ep, AM_ID, 0, &v, 8));
        c.reset();
        ssize_t n = uct_ep_am_bcopy(ep, AM_ID, [](void *d, void*) -> size_t {
            memset(d, 0, 16);
            return 16;
        }, nullptr, 0);
        check("am_bcopy", (n < 0) ? (ucs_status_t)n : UCS_OK);
        c.reset();
        check("put_short", uct_ep_put_short(ep, &v, 8, plain_mem,
                                            rk_plain.rkey()));
        c.reset();
        check("put_zcopy", uct_ep_put_zcopy(ep, &iov, 1, dev_mem,
                                            rk_dev.rkey(), &c.uct));
        c.reset();
        check("get_zcopy", uct_ep_get_zcopy(ep, &iov, 1, plain_mem,
                                            rk_plain.rkey(), &c.uct));
        c.reset();
        check("atomic64_fetch", uct_ep_atomic64_fetch(
                  ep, UCT_ATOMIC_OP_ADD, 1, &res, plain_mem,
                  rk_plain.rkey(), &c.uct));
        for (int i = 0; i < 1000; ++i) {
            e.progress();
        }
        EXPECT_EQ(calls_before, e.errors_for(ep))
            << "error handler called again for the same ep";
        /* flush and destroy do not hang */
        deadline dl(5);
        ucs_status_t st;
        test_comp fc;
        st = uct_ep_flush(ep, 0, &fc.uct);
        if (st == UCS_INPROGRESS) {
            EXPECT_TRUE(wait_for([&] { return fc.calls > 0; }, {&e}, 5))
                << "flush of the failed ep never completed";
        }
        e.destroy_ep(ep);
        ep = nullptr;
        EXPECT_EQ(UCS_OK, flush_iface(e, {&e})) << "iface flush after failure";
    }

    /* progress (running `kick` every 10 ms) until the handler ran */
    double wait_handler(const std::function<void()> &kick, double sec = 10)
    {
        double t0 = now_sec();
        deadline dl(sec);
        double last = 0;
        while ((e.errors_for(ep) == 0) && !dl.expired()) {
            if (now_sec() - last > 0.01) {
                call_guard guard(e);
                kick();
                last = now_sec();
            }
            uct_iface_progress(e.iface);
        }
        EXPECT_EQ(0, e.handler_in_call)
            << "the error handler ran inside a send/ep_check call, not from "
               "uct_iface_progress";
        return now_sec() - t0;
    }

    child       kid;
    entity      e;
    buffer      local;
    uct_ep_h    ep = nullptr;
    std::string dev_addr, iface_addr, dev_rkey, plain_rkey;
    uint64_t    dev_mem = 0, plain_mem = 0;
    rkey_holder rk_dev, rk_plain;
};

TEST_P(UctDeadPeer, AmBcopyWithPeerCheckDetectsKill)
{
    ASSERT_NO_FATAL_FAILURE(kill_peer());
    double t = wait_handler([&] {
        ssize_t r = uct_ep_am_bcopy(ep, AM_ID, [](void *d, void*) -> size_t {
            memset(d, 0, 8);
            return 8;
        }, nullptr, UCT_SEND_FLAG_PEER_CHECK);
        (void)r;
    });
    ASSERT_EQ(1, e.errors_for(ep))
        << "no error handler call in " << t << " s after the peer was killed "
           "(am_bcopy with UCT_SEND_FLAG_PEER_CHECK)";
    EXPECT_TRUE(UCS_STATUS_IS_ERR(e.last_error_for(ep)));
    printf("[ INFO     ] detected in %.3f s: %s\n", t,
           ucs_status_string(e.last_error_for(ep)));
    expect_ops_fail();
}

TEST_P(UctDeadPeer, EpCheckDetectsKill)
{
    ASSERT_NO_FATAL_FAILURE(kill_peer());
    double t = wait_handler([&] {
        ucs_status_t st = uct_ep_check(ep, 0, NULL);
        EXPECT_TRUE((st == UCS_OK) || (st == UCS_ERR_NO_RESOURCE)) << st;
    });
    ASSERT_EQ(1, e.errors_for(ep))
        << "no error handler call in " << t << " s after the peer was killed "
           "(uct_ep_check)";
    EXPECT_TRUE(UCS_STATUS_IS_ERR(e.last_error_for(ep)));
    printf("[ INFO     ] detected in %.3f s: %s\n", t,
           ucs_status_string(e.last_error_for(ep)));
    expect_ops_fail();
}

TEST_P(UctDeadPeer, OutstandingGetCompletesWithError)
{
    ASSERT_NO_FATAL_FAILURE(kill_peer());
    /* a get of the dead peer's plain memory, then keep-alive checks */
    test_comp c;
    uct_iov_t iov = {local.data(), 1 << 20, local.memh, 0, 1};
    ucs_status_t st = retry_send([&] {
        c.reset();
        return uct_ep_get_zcopy(ep, &iov, 1, plain_mem, rk_plain.rkey(),
                                &c.uct);
    }, {&e});
    if (st == UCS_INPROGRESS) {
        double t = wait_handler([&] { uct_ep_check(ep, 0, NULL); });
        ASSERT_TRUE(wait_for([&] { return c.calls > 0; }, {&e}, 5))
            << "the get to a dead peer never completed (" << t << " s)";
        EXPECT_TRUE(UCS_STATUS_IS_ERR(c.status))
            << "a get from a dead peer completed with " << c.status;
    } else {
        EXPECT_TRUE(UCS_STATUS_IS_ERR(st)) << st;
        wait_handler([&] { uct_ep_check(ep, 0, NULL); });
    }
    EXPECT_EQ(1, e.errors_for(ep)) << "error handler calls";
    expect_ops_fail();
}

TEST_P(UctDeadPeer, AmShortsIntoDeadPeerDoNotHang)
{
    /* no peer check: sending fills the dead peer's ring; the transport must
     * notice in bounded time rather than returning NO_RESOURCE forever */
    ASSERT_NO_FATAL_FAILURE(kill_peer());
    deadline dl(15);
    uint64_t v = 0;
    unsigned sent = 0;
    ucs_status_t last = UCS_OK;
    double t0 = now_sec();
    while ((e.errors_for(ep) == 0) && !dl.expired()) {
        {
            call_guard guard(e);
            last = uct_ep_am_short(ep, AM_ID, 0, &v, 8);
        }
        if (last == UCS_OK) {
            ++sent;
        } else if (last != UCS_ERR_NO_RESOURCE) {
            /* failed: the handler follows from progress */
            for (int i = 0; i < 100; ++i) {
                e.progress();
            }
            break;
        }
        e.progress();
    }
    EXPECT_EQ(1, e.errors_for(ep))
        << "no error report after " << now_sec() - t0 << " s of sending "
        << "into a dead peer (" << sent << " accepted, last status " << last
        << ")";
    EXPECT_EQ(0, e.handler_in_call)
        << "the error handler ran inside uct_ep_am_short, not from progress";
    printf("[ INFO     ] %u messages accepted, error after %.3f s\n", sent,
           now_sec() - t0);
    if (e.errors_for(ep) > 0) {
        expect_ops_fail();
    }
}

TEST_P(UctDeadPeer, KilledButNotYetReapedPeerIsDead)
{
    /* SIGKILL without waitpid(): the peer is a zombie - dead, it will never
     * answer - and must be reported like any dead peer */
    ASSERT_NO_FATAL_FAILURE(kill_peer(false));
    usleep(50000); /* the kill has taken effect (the process is a zombie) */
    double t = wait_handler([&] {
        ucs_status_t st = uct_ep_check(ep, 0, NULL);
        (void)st;
    }, 5);
    EXPECT_EQ(1, e.errors_for(ep))
        << "a killed (zombie, not yet reaped) peer is still seen as alive "
           "after " << t << " s of uct_ep_check";
    EXPECT_EQ(128 + SIGKILL, wait_child(kid.pid));
    if (e.errors_for(ep) == 0) {
        /* once reaped it must be found */
        wait_handler([&] { uct_ep_check(ep, 0, NULL); });
        EXPECT_EQ(1, e.errors_for(ep)) << "not detected even after reaping";
    }
}

/* Every operation of every form on a failed ep returns the status that
 * was reported to the error handler: a dead peer is
 * UCS_ERR_ENDPOINT_TIMEOUT, as UCX's tcp and rc report it and as UCP's
 * failed lanes answer afterwards. */
TEST_P(UctDeadPeer, FailedEpReturnsReportedStatusForEveryOperation)
{
    ASSERT_NO_FATAL_FAILURE(kill_peer());
    wait_handler([&] { uct_ep_check(ep, 0, NULL); });
    ASSERT_EQ(1, e.errors_for(ep));
    const ucs_status_t rep = e.last_error_for(ep);
    EXPECT_EQ(UCS_ERR_ENDPOINT_TIMEOUT, rep) << "status of a dead peer";

    uint64_t v = 1, r64 = 0;
    uint32_t r32 = 0;
    test_comp c;
    uct_iov_t iov = {local.data(), 4096, local.memh, 0, 1};
    auto pack8 = [](void *d, void*) -> size_t {
        memset(d, 0, 8);
        return 8;
    };
    auto unpack = [](void*, const void*, size_t) {};
    for (int mem = 0; mem < 2; ++mem) {
        uint64_t addr   = mem ? dev_mem : plain_mem;
        uct_rkey_t rkey = mem ? rk_dev.rkey() : rk_plain.rkey();
        SCOPED_TRACE(mem ? "device memory" : "plain memory");
        std::vector<std::pair<const char*, ucs_status_t>> res;
        res.push_back({"am_short", uct_ep_am_short(ep, AM_ID, 0, &v, 8)});
        uct_iov_t small = {local.data(), 8, local.memh, 0, 1};
        res.push_back({"am_short_iov",
                       uct_ep_am_short_iov(ep, AM_ID, &small, 1)});
        res.push_back({"am_bcopy", (ucs_status_t)uct_ep_am_bcopy(
                                       ep, AM_ID, pack8, nullptr, 0)});
        res.push_back({"am_zcopy", uct_ep_am_zcopy(ep, AM_ID, &v, 8, &iov,
                                                   1, 0, &c.uct)});
        res.push_back({"put_short",
                       uct_ep_put_short(ep, &v, 8, addr, rkey)});
        res.push_back({"put_bcopy", (ucs_status_t)uct_ep_put_bcopy(
                                        ep, pack8, nullptr, addr, rkey)});
        res.push_back({"put_zcopy",
                       uct_ep_put_zcopy(ep, &iov, 1, addr, rkey, &c.uct)});
        res.push_back({"get_bcopy", uct_ep_get_bcopy(ep, unpack, nullptr,
                                                     64, addr, rkey,
                                                     &c.uct)});
        res.push_back({"get_zcopy",
                       uct_ep_get_zcopy(ep, &iov, 1, addr, rkey, &c.uct)});
        res.push_back({"atomic32_post",
                       uct_ep_atomic32_post(ep, UCT_ATOMIC_OP_ADD, 1, addr,
                                            rkey)});
        res.push_back({"atomic64_post",
                       uct_ep_atomic64_post(ep, UCT_ATOMIC_OP_ADD, 1, addr,
                                            rkey)});
        res.push_back({"atomic32_fetch",
                       uct_ep_atomic32_fetch(ep, UCT_ATOMIC_OP_ADD, 1, &r32,
                                             addr, rkey, &c.uct)});
        res.push_back({"atomic64_fetch",
                       uct_ep_atomic64_fetch(ep, UCT_ATOMIC_OP_ADD, 1, &r64,
                                             addr, rkey, &c.uct)});
        res.push_back({"atomic_cswap32",
                       uct_ep_atomic_cswap32(ep, 0, 1, addr, rkey, &r32,
                                             &c.uct)});
        res.push_back({"atomic_cswap64",
                       uct_ep_atomic_cswap64(ep, 0, 1, addr, rkey, &r64,
                                             &c.uct)});
        res.push_back({"ep_fence", uct_ep_fence(ep, 0)});
        res.push_back({"ep_flush", uct_ep_flush(ep, 0, NULL)});
        res.push_back({"ep_flush(comp)", uct_ep_flush(ep, 0, &c.uct)});
        for (auto &r : res) {
            EXPECT_EQ(rep, r.second) << r.first << " on the failed ep";
        }
    }
    for (int i = 0; i < 100; ++i) {
        e.progress();
    }
    EXPECT_EQ(0, c.calls) << "a completion of an operation that was refused";
    EXPECT_EQ(1, e.errors_for(ep)) << "error handler called again";

    /* a pending request is never dispatched on it: pending_add answers
     * BUSY (the caller retries and gets the status), or queues it for a
     * purge that hands it back once */
    struct preq {
        uct_pending_req_t uct;
        int calls  = 0;
        int purged = 0;
    } pr;
    pr.uct.func = [](uct_pending_req_t *self) {
        ((preq*)self)->calls++;
        return UCS_ERR_NO_RESOURCE;
    };
    ucs_status_t pst = uct_ep_pending_add(ep, &pr.uct, 0);
    EXPECT_TRUE((pst == UCS_OK) || (pst == UCS_ERR_BUSY)) << pst;
    for (int i = 0; i < 100; ++i) {
        e.progress();
    }
    EXPECT_EQ(0, pr.calls) << "a pending request dispatched on a failed ep";
    uct_ep_pending_purge(ep, [](uct_pending_req_t *self, void*) {
        ((preq*)self)->purged++;
    }, nullptr);
    EXPECT_EQ((pst == UCS_OK) ? 1 : 0, pr.purged);
    EXPECT_EQ(UCS_OK, flush_iface(e, {&e})) << "iface flush after failure";
}

/* Several eps fail at once and the handler of the first destroys the
 * others (UCP discards eps from its handler): no report for a destroyed
 * ep, no access to it. */
TEST_P(UctDeadPeer, HandlerDestroyingOtherFailedEps)
{
    std::vector<uct_ep_h> more;
    for (int i = 0; i < 3; ++i) {
        more.push_back(e.create_ep(dev_addr, iface_addr));
        ASSERT_NE(nullptr, more.back());
    }
    int calls = 0;
    e.on_error = [&](uct_ep_h failed, ucs_status_t) {
        ++calls;
        for (uct_ep_h x : more) {
            if (x != failed) {
                e.destroy_ep(x);
            }
        }
        if (failed != ep) {
            e.destroy_ep(ep);
            ep = nullptr;
        }
        more.clear();
    };
    ASSERT_NO_FATAL_FAILURE(kill_peer());
    {
        call_guard guard(e);
        /* all four are found dead before progress reports any */
        EXPECT_EQ(UCS_OK, uct_ep_check(ep, 0, NULL));
        for (uct_ep_h x : more) {
            EXPECT_EQ(UCS_OK, uct_ep_check(x, 0, NULL));
        }
    }
    deadline dl(5);
    while ((calls == 0) && !dl.expired()) {
        e.progress();
    }
    for (int i = 0; i < 100; ++i) {
        e.progress();
    }
    e.on_error = nullptr;
    EXPECT_EQ(1, calls) << "handler calls: a destroyed ep was reported";
    EXPECT_EQ(0, e.handler_in_call);
    EXPECT_EQ(1u, e.errors.size());
}

/* Operations in flight when the ep fails complete with the status that
 * was reported, not some with it and the rest "cancelled" (rc and tcp
 * complete every outstanding operation of a failed ep with its error). */
TEST_P(UctDeadPeer, OutstandingOperationsCompleteWithTheReportedStatus)
{
    /* reaped: gone before the first get (a signalled process may still
     * run for a moment and answer it) */
    ASSERT_NO_FATAL_FAILURE(kill_peer());
    const int n = 4;
    std::vector<test_comp> c(n);
    std::vector<ucs_status_t> st(n);
    for (int i = 0; i < n; ++i) {
        uct_iov_t iov = {local.data() + i * 4096, 4096, local.memh, 0, 1};
        st[i] = uct_ep_get_zcopy(ep, &iov, 1, plain_mem + i * 4096,
                                 rk_plain.rkey(), &c[i].uct);
        EXPECT_NE(UCS_OK, st[i]) << "get " << i << " from a dead process";
    }
    wait_handler([&] { uct_ep_check(ep, 0, NULL); });
    ASSERT_EQ(1, e.errors_for(ep));
    const ucs_status_t rep = e.last_error_for(ep);
    int inflight = 0;
    for (int i = 0; i < n; ++i) {
        SCOPED_TRACE("get " + std::to_string(i));
        if (st[i] == UCS_INPROGRESS) {
            ++inflight;
            ASSERT_TRUE(wait_for([&] { return c[i].calls > 0; }, {&e}, 5));
            EXPECT_EQ(1, c[i].calls);
            EXPECT_EQ(rep, c[i].status);
        } else {
            EXPECT_EQ(rep, st[i]);
        }
    }
    printf("[ INFO     ] %d of %d gets were in flight when the ep failed\n",
           inflight, n);
}

/* An ep the user cancelled (flush with UCT_FLUSH_FLAG_CANCEL, as UCP does
 * when it closes one) is not reported when its peer dies: rc neither. */
TEST_P(UctDeadPeer, CancelledEpIsNotReportedWhenPeerDies)
{
    test_comp fc;
    ucs_status_t st = uct_ep_flush(ep, UCT_FLUSH_FLAG_CANCEL, &fc.uct);
    ASSERT_TRUE((st == UCS_OK) || (st == UCS_INPROGRESS)) << st;
    ASSERT_NO_FATAL_FAILURE(kill_peer());
    deadline dl(0.5);
    while (!dl.expired()) {
        uct_ep_check(ep, 0, NULL);
        e.progress();
    }
    EXPECT_EQ(0, e.errors_for(ep))
        << "error handler called for a cancelled ep: "
        << e.last_error_for(ep);
}

/* The QP fails inside the device (a write into a dead process) before any
 * error completion was polled: a caller that sends until the send stops
 * returning UCS_OK - what a pending callback does - must stop, not spin on
 * posts that the device accepts and flushes. */
TEST_P(UctDeadPeer, SendingUntilNotOkStopsOnFailedQp)
{
    ASSERT_NO_FATAL_FAILURE(kill_peer());
    test_comp c;
    uct_iov_t iov = {local.data(), 4096, local.memh, 0, 1};
    ucs_status_t st = uct_ep_put_zcopy(ep, &iov, 1, plain_mem,
                                       rk_plain.rkey(), &c.uct);
    EXPECT_NE(UCS_OK, st) << "a put into a dead process completed";
    const int cap = 100000;
    int sent = 0;
    uint64_t v = 0;
    deadline dl(10);
    do {
        st = uct_ep_am_short(ep, AM_ID, 0, &v, 8);
    } while ((st == UCS_OK) && (++sent < cap) && !dl.expired());
    EXPECT_LT(sent, cap) << "am_short returned UCS_OK " << sent
                         << " times on a QP whose peer is dead (no "
                            "progress in between)";
    printf("[ INFO     ] %d sends accepted, then %s\n", sent,
           ucs_status_string(st));
    /* the failure is reported once from progress, with the status that
     * the refused sends return from then on */
    wait_handler([&] { uct_ep_check(ep, 0, NULL); });
    ASSERT_EQ(1, e.errors_for(ep));
    EXPECT_EQ(e.last_error_for(ep), uct_ep_am_short(ep, AM_ID, 0, &v, 8));
    if (UCS_STATUS_IS_ERR(st) && (st != UCS_ERR_NO_RESOURCE)) {
        EXPECT_EQ(e.last_error_for(ep), st)
            << "the send that stopped returned another status than the "
               "one reported";
    }
    if (c.calls == 0) {
        EXPECT_TRUE(wait_for([&] { return c.calls > 0; }, {&e}, 5));
    }
    EXPECT_TRUE(UCS_STATUS_IS_ERR(c.status)) << c.status;
}

/* Requests queued when the peer dies: each ends exactly once - finished by
 * its callback (with the ep's status) or handed back by the purge - and a
 * callback that sends until the send stops returning UCS_OK terminates. */
TEST_P(UctDeadPeer, PendingRequestsOfFailedEpEndOnce)
{
    /* the peer does not progress: its ring fills */
    uint64_t v = 0;
    ucs_status_t st;
    int n = 0;
    while (((st = uct_ep_am_short(ep, AM_ID, 0, &v, 8)) == UCS_OK) &&
           (++n < 100000)) {
    }
    ASSERT_EQ(UCS_ERR_NO_RESOURCE, st) << "after " << n << " sends";
    struct preq {
        uct_pending_req_t uct;
        uct_ep_h     ep;
        int          calls    = 0;
        int          finished = 0;
        int          purged   = 0;
        int          spun     = 0;
        int          after_finish = 0;
        ucs_status_t status   = UCS_OK;
    };
    const int k = 4;
    std::vector<preq> reqs(k);
    int queued = 0;
    for (auto &r : reqs) {
        r.ep       = ep;
        r.uct.func = [](uct_pending_req_t *self) {
            preq *q = (preq*)self;
            q->calls++;
            if (q->finished) {
                q->after_finish++;
            }
            uint64_t x = 0;
            ucs_status_t s;
            int sent = 0;
            while ((s = uct_ep_am_short(q->ep, AM_ID, 0, &x, 8)) == UCS_OK) {
                if (++sent >= 100000) {
                    q->spun = 1;
                    q->finished++;
                    return UCS_OK;
                }
            }
            if (s == UCS_ERR_NO_RESOURCE) {
                return s;
            }
            q->status = s;    /* as UCP: the request completes with it */
            q->finished++;
            return UCS_OK;
        };
        st = uct_ep_pending_add(ep, &r.uct, 0);
        ASSERT_EQ(UCS_OK, st) << "the ring is full";
        ++queued;
    }
    ASSERT_NO_FATAL_FAILURE(kill_peer());
    wait_handler([&] { uct_ep_check(ep, 0, NULL); });
    ASSERT_EQ(1, e.errors_for(ep));
    for (int i = 0; i < 1000; ++i) {
        e.progress();
    }
    uct_ep_pending_purge(ep, [](uct_pending_req_t *self, void*) {
        ((preq*)self)->purged++;
    }, nullptr);
    for (int i = 0; i < 100; ++i) {
        e.progress();
    }
    for (int i = 0; i < k; ++i) {
        SCOPED_TRACE("request " + std::to_string(i));
        EXPECT_EQ(0, reqs[i].spun) << "its callback sent without end";
        EXPECT_EQ(1, reqs[i].finished + reqs[i].purged)
            << "finished " << reqs[i].finished << ", purged "
            << reqs[i].purged;
        EXPECT_EQ(0, reqs[i].after_finish) << "dispatched after it ended";
        if (reqs[i].finished) {
            EXPECT_EQ(e.last_error_for(ep), reqs[i].status);
        }
    }
    EXPECT_EQ(1, e.errors_for(ep));
}

INSTANTIATE_TEST_SUITE_P(
        hca, UctDeadPeer,
        on_fabrics(::testing::Values(TOPO_REMOTE, TOPO_REMOTE_NO_CMA)),
        fabric_param_name<topology>(topology_name_of));

/* ------------------------------------------------------------ closed peer */

/* The peer's iface is closed in this process, so the sender's QP finds its
 * peer gone inside the next post.  Until the error callback has run, a
 * post without a completion is accepted (as into a dead peer's ring or
 * socket: mm, tcp), and the failure comes from progress, not from the send
 * (UCX's test_uct_peer_failure_keepalive.killed_post_am); after the report
 * every post returns the reported status. */
class UctClosedPeer : public uct_test_base, public with_fabric<int> {
protected:
    /* a sender connected to a receiver of this process, on the fabric */
    void open_pair()
    {
        entity_config cfg = fabric_config(GetFabric());
        rcv.reset(new entity);
        ASSERT_NO_FATAL_FAILURE(snd.open(cfg));
        ASSERT_NO_FATAL_FAILURE(rcv->open(cfg));
        ep = snd.connect_to(*rcv);
        ASSERT_NE(nullptr, ep);
    }

    entity                  snd;
    std::unique_ptr<entity> rcv;
    uct_ep_h                ep = nullptr;
};

TEST_P(UctClosedPeer, PostsBeforeTheReportAreAcceptedAndTheErrorComesOnce)
{
    ASSERT_NO_FATAL_FAILURE(open_pair());
    uint64_t v = 7;
    ASSERT_EQ(UCS_OK, retry_send([&] {
        return uct_ep_am_short(ep, AM_ID, 0, &v, sizeof(v));
    }, {&snd, rcv.get()}));
    ASSERT_EQ(UCS_OK, flush_ep(ep, {&snd, rcv.get()}));
    rcv.reset(); /* its iface and QPs destroyed */

    EXPECT_EQ(UCS_OK, uct_ep_check(ep, 0, NULL));
    {
        call_guard guard(snd);
        EXPECT_EQ(0, snd.errors_for(ep));
        EXPECT_EQ(UCS_OK, uct_ep_am_short(ep, AM_ID, 0, &v, sizeof(v)))
            << "an AM posted after the peer closed, before the error was "
               "reported";
        EXPECT_EQ(UCS_OK, uct_ep_put_short(ep, &v, 0, 0, 0))
            << "a zero-length put_short";
    }
    deadline dl(10);
    while ((snd.errors_for(ep) == 0) && !dl.expired()) {
        uct_ep_check(ep, 0, NULL);
        snd.progress();
    }
    ASSERT_EQ(1, snd.errors_for(ep)) << "the closed peer was never reported";
    EXPECT_EQ(0, snd.handler_in_call) << "reported from inside a send";
    const ucs_status_t rep = snd.last_error_for(ep);
    EXPECT_TRUE(UCS_STATUS_IS_ERR(rep)) << rep;
    EXPECT_EQ(rep, uct_ep_am_short(ep, AM_ID, 0, &v, sizeof(v)))
        << "after the report: the reported status";
    for (int i = 0; i < 100; ++i) {
        snd.progress();
    }
    EXPECT_EQ(1, snd.errors_for(ep)) << "reported twice";
    snd.destroy_ep(ep);
}

/* The bound of that: bcopy sends on the failed, unreported ep return their
 * length until the send queue's worth is lost, then NO_RESOURCE; the
 * request the caller then queues is accepted (BUSY would have it post
 * again at once, and spin), never dispatched, and handed back once by the
 * purge after the report. */
TEST_P(UctClosedPeer, RefusedSendsQueueUntilTheReportAndThePurge)
{
    ASSERT_NO_FATAL_FAILURE(open_pair());
    ASSERT_EQ(UCS_OK, flush_ep(ep, {&snd, rcv.get()}));
    rcv.reset();
    EXPECT_EQ(UCS_OK, uct_ep_check(ep, 0, NULL));
    auto pack16 = [](void *d, void*) -> size_t {
        memset(d, 0x5a, 16);
        return 16;
    };
    ssize_t r = 0;
    unsigned accepted = 0;
    {
        call_guard guard(snd);
        while (((r = uct_ep_am_bcopy(ep, AM_ID, pack16, nullptr, 0)) == 16) &&
               (++accepted < 100000)) {
        }
    }
    EXPECT_EQ((ssize_t)UCS_ERR_NO_RESOURCE, r)
        << "after " << accepted << " lost sends";
    EXPECT_LT(accepted, 100000u) << "sends on a failed ep never refused";
    EXPECT_EQ(0, snd.errors_for(ep));
    struct preq {
        uct_pending_req_t uct;
        int calls  = 0;
        int purged = 0;
    } pr;
    pr.uct.func = [](uct_pending_req_t *self) {
        ((preq*)self)->calls++;
        return UCS_ERR_NO_RESOURCE;
    };
    EXPECT_EQ(UCS_OK, uct_ep_pending_add(ep, &pr.uct, 0))
        << "a request refused for NO_RESOURCE could not be queued";
    deadline dl(10);
    while ((snd.errors_for(ep) == 0) && !dl.expired()) {
        snd.progress();
    }
    ASSERT_EQ(1, snd.errors_for(ep));
    /* (the tcp fabric may learn of the failure only after the refusal: its
     * request is dispatched until then, and never after the report) */
    const int calls_at_report = pr.calls;
    for (int i = 0; i < 100; ++i) {
        snd.progress();
    }
    EXPECT_EQ(calls_at_report, pr.calls)
        << "a request of a reported ep was dispatched";
    uct_ep_pending_purge(ep, [](uct_pending_req_t *self, void*) {
        ((preq*)self)->purged++;
    }, nullptr);
    EXPECT_EQ(1, pr.purged);
    EXPECT_EQ(snd.last_error_for(ep),
              (ucs_status_t)uct_ep_am_bcopy(ep, AM_ID, pack16, nullptr, 0));
    snd.destroy_ep(ep);
}

/* Addresses that are not an hca context's (random bytes: corrupted, or
 * another transport's) are unreachable, as UCX's
 * test_uct_iface.is_reachable checks; the iface's own is reachable. */
TEST_P(UctClosedPeer, RandomAddressesAreUnreachable)
{
    entity e;
    ASSERT_NO_FATAL_FAILURE(e.open(fabric_config(GetFabric())));
    EXPECT_NE(0, uct_iface_is_reachable(
                         e.iface, (const uct_device_addr_t*)e.dev_addr.data(),
                         (const uct_iface_addr_t*)e.iface_addr.data()));
    std::string dev(std::max<size_t>(e.dev_addr.size(), 4096), '\0');
    std::string ifa(std::max<size_t>(e.iface_addr.size(), 4096), '\0');
    unsigned seed = 17, reachable = 0;
    for (int i = 0; i < 100; ++i) {
        for (auto &c : dev) {
            c = (char)rand_r(&seed);
        }
        for (auto &c : ifa) {
            c = (char)rand_r(&seed);
        }
        reachable += (uct_iface_is_reachable(
                              e.iface, (const uct_device_addr_t*)dev.data(),
                              (const uct_iface_addr_t*)ifa.data()) != 0);
    }
    EXPECT_LE(reachable, 5u) << "random addresses found reachable";
}

INSTANTIATE_TEST_SUITE_P(
        hca, UctClosedPeer, on_fabrics(::testing::Values(0)),
        fabric_param_name<int>([](const ::testing::TestParamInfo<int> &) {
            return std::string("inproc");
        }));

} /* namespace */
