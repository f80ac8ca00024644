/*
 * test_uct_flush.cc - flush (endpoint with a completion, interface),
 * flush with UCT_FLUSH_FLAG_CANCEL, and fence ordering (a put, a fence,
 * then a fetching atomic on the same address sees the put).
 */
#include "uct_test_common.h"

#include <algorithm>
#include <tuple>

using namespace hcat;

namespace {

/* One get_zcopy of len bytes into buf, sent again while the ep has no
 * resources and waited for: its final status. */
ucs_status_t get_and_wait(uct_ep_h ep, void *buf, size_t len, uct_mem_h memh,
                          uint64_t addr, uct_rkey_t rkey,
                          const std::vector<entity*> &ents)
{
    test_comp c;
    uct_iov_t iov = {buf, len, memh, 0, 1};
    ucs_status_t st = retry_send([&] {
        c.reset();
        return uct_ep_get_zcopy(ep, &iov, 1, addr, rkey, &c.uct);
    }, ents);
    return complete_op(st, c, ents);
}

typedef std::tuple<topology, mem_kind> flush_param;

class UctFlush : public uct_test_base, public topo_sender,
                 public with_fabric<flush_param> {
protected:
    void SetUp() override
    {
        kind        = std::get<1>(GetParam());
        topo_fabric = GetFabric();
        ASSERT_NO_FATAL_FAILURE(open_topo(std::get<0>(GetParam())));
    }

    void TearDown() override
    {
        close_topo();
        uct_test_base::TearDown();
    }

    /* posts n zcopy puts (or gets) of `chunk` bytes without waiting */
    void post_zcopy(bool get, size_t n, size_t chunk, buffer &local,
                    const target::rbuf &r, uct_rkey_t rkey,
                    std::vector<ordered_comp> &comps, int *done)
    {
        comps.resize(n);
        for (size_t i = 0; i < n; ++i) {
            uct_iov_t iov;
            iov.buffer = local.data() + i * chunk;
            iov.length = chunk;
            iov.memh   = local.memh;
            iov.stride = 0;
            iov.count  = 1;
            comps[i].reset(done);
            ucs_status_t st = retry_send([&] {
                return get ? uct_ep_get_zcopy(ep, &iov, 1, r.addr + i * chunk,
                                              rkey, &comps[i].uct) :
                             uct_ep_put_zcopy(ep, &iov, 1, r.addr + i * chunk,
                                              rkey, &comps[i].uct);
            }, ents);
            ASSERT_TRUE((st == UCS_OK) || (st == UCS_INPROGRESS))
                << "op " << i << ": " << st;
            if (st == UCS_OK) {
                /* completed at once: count it as done now */
                comps[i].calls  = 1;
                comps[i].seen   = (*done)++;
                comps[i].status = UCS_OK;
                comps[i].uct.count = 0;
            }
        }
    }

    mem_kind                kind;
};

TEST_P(UctFlush, EpFlushCompletesAfterEveryOperation)
{
    const size_t n = 32, chunk = 256 * 1024;
    target::rbuf r = tgt->alloc(kind, n * chunk);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    buffer src;
    ASSERT_NO_FATAL_FAILURE(src.alloc(sender, kind, n * chunk));
    pat_fill(src.data(), n * chunk, 77);
    tgt->fill(r.id, 0, n * chunk, 78, 0);

    int done = 0;
    std::vector<ordered_comp> comps;
    ASSERT_NO_FATAL_FAILURE(post_zcopy(false, n, chunk, src, r, rk.rkey(),
                                       comps, &done));
    ordered_comp fc;
    fc.reset(&done);
    ucs_status_t st = retry_send([&] {
        return uct_ep_flush(ep, 0, &fc.uct);
    }, ents);
    if (st == UCS_OK) {
        EXPECT_EQ((int)n, done)
            << "uct_ep_flush returned UCS_OK while " << (int)n - done
            << " of " << n << " put_zcopy completions were not yet called";
    } else {
        ASSERT_EQ(UCS_INPROGRESS, st);
        ASSERT_TRUE(wait_for([&] { return fc.calls > 0; }, ents))
            << "flush completion not called";
        EXPECT_EQ(UCS_OK, fc.status);
        EXPECT_EQ((int)n, fc.seen)
            << "the flush completed before " << (int)n - fc.seen
            << " of the operations issued before it";
        EXPECT_EQ(0, fc.uct.count);
    }
    wait_for([&] { return done >= (int)n + (st != UCS_OK); }, ents);
    for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(1, comps[i].calls) << "put " << i;
        EXPECT_EQ(0, comps[i].uct.count) << "put " << i;
        EXPECT_EQ(UCS_OK, comps[i].status) << "put " << i;
    }
    EXPECT_EQ(-1, tgt->check(r.id, 0, n * chunk, 77, 0));
    EXPECT_EQ(0u, sender.errors.size());

    /* nothing outstanding any more: a second flush is immediate */
    fc.reset(&done);
    EXPECT_EQ(UCS_OK, uct_ep_flush(ep, 0, &fc.uct));
    rk.release();
    tgt->free(r.id);
}

TEST_P(UctFlush, IfaceFlushCompletesAfterEveryOperation)
{
    const size_t n = 32, chunk = 256 * 1024;
    target::rbuf r = tgt->alloc(kind, n * chunk);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    buffer dst;
    ASSERT_NO_FATAL_FAILURE(dst.alloc(sender, kind, n * chunk));
    tgt->fill(r.id, 0, n * chunk, 91, 0);
    pat_fill(dst.data(), n * chunk, 92);

    int done = 0;
    std::vector<ordered_comp> comps;
    ASSERT_NO_FATAL_FAILURE(post_zcopy(true, n, chunk, dst, r, rk.rkey(),
                                       comps, &done));
    deadline dl;
    ucs_status_t st;
    while ((st = uct_iface_flush(sender.iface, 0, NULL)) != UCS_OK) {
        ASSERT_EQ(UCS_INPROGRESS, st) << "uct_iface_flush";
        ASSERT_FALSE(dl.expired()) << "iface flush never completed";
        sender.progress();
        if (tgt->local_entity()) {
            tgt->local_entity()->progress();
        }
    }
    EXPECT_EQ((int)n, done)
        << "uct_iface_flush returned UCS_OK while " << (int)n - done
        << " of " << n << " get_zcopy completions were not yet called";
    wait_for([&] { return done >= (int)n; }, ents);
    for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(1, comps[i].calls) << "get " << i;
        EXPECT_EQ(UCS_OK, comps[i].status) << "get " << i;
    }
    EXPECT_EQ(-1, pat_check(dst.data(), n * chunk, 91));
    EXPECT_EQ(0u, sender.errors.size());
    rk.release();
    tgt->free(r.id);
}

TEST_P(UctFlush, CancelCompletesEveryOperationOnce)
{
    const size_t n = 24, chunk = 4 << 20;
    target::rbuf r = tgt->alloc(kind, n * chunk);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    buffer dst;
    ASSERT_NO_FATAL_FAILURE(dst.alloc(sender, kind, n * chunk));
    tgt->fill(r.id, 0, n * chunk, 5, 0);
    memset(dst.data(), 0, n * chunk);

    int done = 0;
    std::vector<ordered_comp> comps;
    ASSERT_NO_FATAL_FAILURE(post_zcopy(true, n, chunk, dst, r, rk.rkey(),
                                       comps, &done));
    ordered_comp fc;
    fc.reset(&done);
    ucs_status_t st = uct_ep_flush(ep, UCT_FLUSH_FLAG_CANCEL, &fc.uct);
    ASSERT_TRUE((st == UCS_OK) || (st == UCS_INPROGRESS)) << st;
    if (st == UCS_OK) {
        EXPECT_EQ((int)n, done)
            << "uct_ep_flush(CANCEL) returned UCS_OK while " << (int)n - done
            << " of " << n << " get_zcopy completions were not yet called";
    } else {
        ASSERT_TRUE(wait_for([&] { return fc.calls > 0; }, ents))
            << "cancel flush completion not called";
        EXPECT_TRUE((fc.status == UCS_OK) || (fc.status == UCS_ERR_CANCELED))
            << fc.status;
    }
    /* every operation completes, once, with OK or CANCELED */
    wait_for([&] { return done >= (int)n + (st == UCS_INPROGRESS); }, ents);
    for (int i = 0; i < 200; ++i) {
        sender.progress();
    }
    size_t canceled = 0;
    for (size_t i = 0; i < n; ++i) {
        SCOPED_TRACE("get " + std::to_string(i));
        EXPECT_EQ(1, comps[i].calls);
        EXPECT_EQ(0, comps[i].uct.count) << "completion invoked twice";
        EXPECT_TRUE((comps[i].status == UCS_OK) ||
                    (comps[i].status == UCS_ERR_CANCELED)) << comps[i].status;
        if (comps[i].status == UCS_ERR_CANCELED) {
            ++canceled;
        } else if (comps[i].status == UCS_OK) {
            /* reported done: then the data is all there */
            EXPECT_EQ(-1, pat_check(dst.data() + i * chunk, chunk, 5,
                                    i * chunk));
        }
    }
    if (st == UCS_INPROGRESS) {
        EXPECT_EQ(1, fc.calls);
        EXPECT_EQ(0, fc.uct.count) << "flush completion invoked twice";
        EXPECT_EQ((int)n, fc.seen) << "cancel flush completed before the "
                                      "operations it cancelled";
    }
    EXPECT_EQ(0, sender.errors_for(ep))
        << "the error handler was called for a cancelled endpoint: "
        << sender.last_error_for(ep);
    printf("[ INFO     ] %zu of %zu outstanding gets cancelled\n", canceled,
           n);
    sender.destroy_ep(ep);
    ep = nullptr;

    /* the iface is still healthy */
    uct_ep_h ep2 = sender.create_ep(tgt->dev_addr, tgt->iface_addr);
    ASSERT_NE(nullptr, ep2);
    EXPECT_EQ(UCS_OK, get_and_wait(ep2, dst.data(), 4096, dst.memh, r.addr,
                                   rk.rkey(), ents));
    EXPECT_EQ(-1, pat_check(dst.data(), 4096, 5));
    EXPECT_EQ(UCS_OK, flush_ep(ep2, ents));
    rk.release();
    tgt->free(r.id);
}

TEST_P(UctFlush, CancelWithPendingRequests)
{
    /* a full send queue: requests wait in the pending queue; cancel + purge
     * (what UCP does when it closes an endpoint) leaves nothing behind */
    entity_config small;
    small.iface_cfg.push_back({"TX_QUEUE_LEN", "4"});
    entity s2;
    entity_config cfg = topology_config(topo, topo_fabric);
    cfg.iface_cfg     = small.iface_cfg;
    ASSERT_NO_FATAL_FAILURE(s2.open(cfg));
    if (topo != TOPO_LOCAL) {
        ((remote_target*)tgt.get())->set_local(&s2);
    }
    uct_ep_h ep2 = s2.create_ep(tgt->dev_addr, tgt->iface_addr);
    ASSERT_NE(nullptr, ep2);
    std::vector<entity*> e2 = {&s2, tgt->local_entity()};

    const size_t n = 16, chunk = 1 << 20;
    target::rbuf r = tgt->alloc(kind, n * chunk);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(s2.component, r.rkey));
    buffer src;
    ASSERT_NO_FATAL_FAILURE(src.alloc(s2, kind, n * chunk));

    int done = 0;
    std::vector<ordered_comp> comps(n);
    struct preq {
        uct_pending_req_t uct;
        int               calls;
        int               purged;
    };
    std::vector<preq> preqs(n);
    enum { POSTED, PENDED, SKIPPED };
    std::vector<int> state(n, SKIPPED);
    size_t posted = 0, pended = 0;
    for (size_t i = 0; i < n; ++i) {
        uct_iov_t iov = {src.data() + i * chunk, chunk, src.memh, 0, 1};
        comps[i].reset(&done);
        preqs[i].calls  = 0;
        preqs[i].purged = 0;
        ucs_status_t st = uct_ep_put_zcopy(ep2, &iov, 1, r.addr + i * chunk,
                                           rk.rkey(), &comps[i].uct);
        if ((st == UCS_OK) || (st == UCS_INPROGRESS)) {
            if (st == UCS_OK) {
                /* completed inside the call: no callback comes */
                comps[i].calls     = 1;
                comps[i].uct.count = 0;
                comps[i].status    = UCS_OK;
                done++;
            }
            state[i] = POSTED;
            posted++;
            continue;
        }
        ASSERT_EQ(UCS_ERR_NO_RESOURCE, st);
        preqs[i].uct.func = [](uct_pending_req_t *self) {
            ((preq*)self)->calls++;
            return UCS_ERR_NO_RESOURCE; /* never gets anywhere */
        };
        ucs_status_t pst = uct_ep_pending_add(ep2, &preqs[i].uct, 0);
        if (pst == UCS_OK) {
            state[i] = PENDED;
            pended++;
        } else {
            ASSERT_EQ(UCS_ERR_BUSY, pst);
        }
    }
    printf("[ INFO     ] %zu posted, %zu pending\n", posted, pended);
    ordered_comp fc;
    fc.reset(&done);
    ucs_status_t st = uct_ep_flush(ep2, UCT_FLUSH_FLAG_CANCEL, &fc.uct);
    ASSERT_TRUE((st == UCS_OK) || (st == UCS_INPROGRESS)) << st;
    size_t purged = 0;
    uct_ep_pending_purge(ep2, [](uct_pending_req_t *self, void *arg) {
        ((preq*)self)->purged++;
        ++*(size_t*)arg;
    }, &purged);
    EXPECT_EQ(pended, purged) << "pending requests purged";
    if (st == UCS_INPROGRESS) {
        EXPECT_TRUE(wait_for([&] { return fc.calls > 0; }, e2));
    }
    wait_for([&] { return done >= (int)posted + (st == UCS_INPROGRESS); },
             e2, 5.0);
    for (size_t i = 0; i < n; ++i) {
        if (state[i] == PENDED) {
            EXPECT_EQ(1, preqs[i].purged) << "pending request " << i;
        } else if (state[i] == POSTED) {
            EXPECT_EQ(1, comps[i].calls) << "put " << i;
            EXPECT_EQ(0, comps[i].uct.count) << "put " << i;
            EXPECT_TRUE((comps[i].status == UCS_OK) ||
                        (comps[i].status == UCS_ERR_CANCELED))
                << "put " << i << ": " << comps[i].status;
        }
    }
    EXPECT_EQ(0, s2.errors_for(ep2));
    s2.destroy_ep(ep2);
    /* A cancelled put completes with UCS_ERR_CANCELED, but on tcp the part
     * of its frame already started goes on from a copy and is placed (no
     * promise is made about the target's memory after a cancel).  A get on
     * a new ep of the same context travels the same ordered connection:
     * once it is answered, nothing of the cancelled puts is still coming,
     * and the target may free its memory (it deregisters without
     * INVALIDATE: a cached registration stays valid until the memory is
     * unmapped, which a freed heap block need not be). */
    uct_ep_h ep3 = s2.create_ep(tgt->dev_addr, tgt->iface_addr);
    ASSERT_NE(nullptr, ep3);
    EXPECT_EQ(UCS_OK, get_and_wait(ep3, src.data(), 4096, src.memh, r.addr,
                                   rk.rkey(), e2)) << "the draining get";
    s2.destroy_ep(ep3);
    rk.release();
    src.free();
    if (topo != TOPO_LOCAL) {
        ((remote_target*)tgt.get())->set_local(&sender);
    }
    s2.close();
    tgt->free(r.id);
}

TEST_P(UctFlush, DestroyEpWithOutstandingOperations)
{
    /* destroying an ep with operations in flight: each completes exactly
     * once (UCS_ERR_CANCELED unless it finished first, as rc completes
     * them), no error report, and the iface keeps working */
    const size_t n = 16, chunk = 1 << 20;
    target::rbuf r = tgt->alloc(kind, n * chunk);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    buffer dst;
    ASSERT_NO_FATAL_FAILURE(dst.alloc(sender, kind, n * chunk));
    tgt->fill(r.id, 0, n * chunk, 61, 0);

    int done = 0;
    std::vector<ordered_comp> comps;
    ASSERT_NO_FATAL_FAILURE(post_zcopy(true, n, chunk, dst, r, rk.rkey(),
                                       comps, &done));
    sender.destroy_ep(ep);
    ep = nullptr;
    deadline dl(0.3);
    while (!dl.expired()) {
        sender.progress();
    }
    for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(1, comps[i].calls) << "get " << i;
        EXPECT_EQ(0, comps[i].uct.count) << "get " << i;
        if (comps[i].calls) {
            EXPECT_TRUE((comps[i].status == UCS_OK) ||
                        (comps[i].status == UCS_ERR_CANCELED))
                << "get " << i << ": " << comps[i].status;
        }
        if (comps[i].status == UCS_OK) {
            EXPECT_EQ(-1, pat_check(dst.data() + i * chunk, chunk, 61,
                                    i * chunk)) << "get " << i;
        }
    }
    EXPECT_EQ(0u, sender.errors.size()) << "error reported for a destroyed ep";

    uct_ep_h ep2 = sender.create_ep(tgt->dev_addr, tgt->iface_addr);
    ASSERT_NE(nullptr, ep2);
    memset(dst.data(), 0, 4096);
    EXPECT_EQ(UCS_OK, get_and_wait(ep2, dst.data(), 4096, dst.memh, r.addr,
                                   rk.rkey(), ents));
    EXPECT_EQ(-1, pat_check(dst.data(), 4096, 61));
    EXPECT_EQ(UCS_OK, flush_iface(sender, ents));
    rk.release();
    tgt->free(r.id);
}

/* A completion that records when it was called: before uct_ep_destroy,
 * inside it, or after it returned. */
enum destroy_phase { BEFORE_DESTROY = 0, IN_DESTROY, AFTER_DESTROY };

struct phase_comp {
    uct_completion_t uct;     /* first: the completion is found by cast */
    const int       *phase;   /* the test's phase now */
    int              calls;
    int              when;    /* phase of the last call */
    ucs_status_t     status;

    void reset(const int *now)
    {
        uct.func   = cb;
        uct.count  = 1;
        uct.status = UCS_OK;
        phase      = now;
        calls      = 0;
        when       = -1;
        status     = UCS_ERR_LAST;
    }
    static void cb(uct_completion_t *self)
    {
        phase_comp *c = (phase_comp*)self;
        c->calls++;
        c->when   = *c->phase;
        c->status = self->status;
    }
};

enum zcopy_kind { ZC_AM = 0, ZC_PUT, ZC_GET, ZC_LAST };

/* uct_ep_destroy with zero-copy operations outstanding completes every one
 * of them inside the call, as UCX's rc and tcp do and UCX's own test
 * (test_uct_ep destroy_entity_after_send) asks: operations until
 * NO_RESOURCE, a flush (INPROGRESS), then the destroy without any progress
 * in between; once it returned, no completion is left uncalled.  Each is
 * called once, with UCS_ERR_CANCELED (UCS_OK if it had finished), the
 * flush too; none is called after the destroy (its completion may be gone
 * by then), and the buffers may be freed at once: nothing touches them
 * afterwards (AddressSanitizer sees the device's reads and writes). */
TEST_P(UctFlush, DestroyEpCompletesOutstandingInside)
{
    const size_t chunk = 16 * 1024, max_ops = 4096;
    static const char *const names[ZC_LAST] = {"am_zcopy", "put_zcopy",
                                               "get_zcopy"};
    static const uint64_t need[ZC_LAST] = {UCT_IFACE_FLAG_AM_ZCOPY,
                                           UCT_IFACE_FLAG_PUT_ZCOPY,
                                           UCT_IFACE_FLAG_GET_ZCOPY};
    target::rbuf r = tgt->alloc(kind, chunk);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));

    for (int k = 0; k < ZC_LAST; ++k) {
        SCOPED_TRACE(names[k]);
        if (!(sender.attr.cap.flags & need[k])) {
            continue;
        }
        size_t len = chunk;
        if (k == ZC_AM) {
            /* the largest: what a descriptor of its own carries */
            len = std::min<size_t>(sender.attr.cap.am.max_zcopy,
                                   chunk + sizeof(am_hdr)) - sizeof(am_hdr);
        }
        std::unique_ptr<buffer> local(new buffer());
        ASSERT_NO_FATAL_FAILURE(local->alloc(sender, kind, len));
        pat_fill(local->data(), len, 300 + k);
        uct_ep_h x = sender.create_ep(tgt->dev_addr, tgt->iface_addr);
        ASSERT_NE(nullptr, x);

        int phase = BEFORE_DESTROY;
        std::vector<phase_comp> comps(max_ops);
        std::vector<bool> outstanding(max_ops, false);
        size_t posted = 0, in_flight = 0;
        uint64_t h    = am_hdr_pack({(uint32_t)(300 + k), (uint16_t)len, 0,
                                     0});
        uct_iov_t iov = {local->data(), len, local->memh, 0, 1};
        deadline dl;
        while ((posted < max_ops) && !dl.expired()) {
            phase_comp &c = comps[posted];
            c.reset(&phase);
            ucs_status_t st;
            switch (k) {
            case ZC_AM:
                st = uct_ep_am_zcopy(x, AM_ID, &h, sizeof(h), &iov, 1, 0,
                                     &c.uct);
                break;
            case ZC_PUT:
                st = uct_ep_put_zcopy(x, &iov, 1, r.addr, rk.rkey(), &c.uct);
                break;
            default:
                st = uct_ep_get_zcopy(x, &iov, 1, r.addr, rk.rkey(), &c.uct);
                break;
            }
            if (st == UCS_ERR_NO_RESOURCE) {
                if (posted > 0) {
                    break; /* full: what is out stays out */
                }
                sender.progress();
                continue;
            }
            ASSERT_TRUE((st == UCS_OK) || (st == UCS_INPROGRESS))
                << "op " << posted << ": " << st;
            if (st == UCS_INPROGRESS) {
                outstanding[posted] = true;
                ++in_flight;
            }
            ++posted;
        }
        ASSERT_GT(posted, 0u) << "no operation was accepted";

        phase_comp fc;
        fc.reset(&phase);
        ucs_status_t fst = uct_ep_flush(x, UCT_FLUSH_FLAG_LOCAL, &fc.uct);
        if (in_flight > 0) {
            EXPECT_EQ(UCS_INPROGRESS, fst);
        } else {
            EXPECT_EQ(UCS_OK, fst);
        }
        printf("[ INFO     ] %s: %zu of %zu operations outstanding at "
               "uct_ep_destroy\n", names[k], in_flight, posted);
        if (topo_fabric == FABRIC_TCP) {
            /* tcp completes nothing inside the call: the case is there */
            EXPECT_GT(in_flight, 0u) << "nothing outstanding: the test "
                                        "tests nothing";
        }

        /* no progress between the flush and the destroy */
        phase = IN_DESTROY;
        sender.destroy_ep(x);
        phase = AFTER_DESTROY;

        size_t uncalled = 0;
        for (size_t i = 0; i < posted; ++i) {
            if (outstanding[i] && (comps[i].calls == 0)) {
                ++uncalled;
            }
        }
        EXPECT_EQ(0u, uncalled) << "of " << in_flight << " outstanding "
                                << names[k] << " completions, not called by "
                                   "the time uct_ep_destroy returned";
        if (fst == UCS_INPROGRESS) {
            EXPECT_EQ(1, fc.calls) << "the flush's completion";
            EXPECT_EQ(IN_DESTROY, fc.when) << "the flush's completion";
            EXPECT_TRUE((fc.status == UCS_ERR_CANCELED) ||
                        (fc.status == UCS_OK)) << fc.status;
        }

        /* the user may free the buffers now: nothing may read or write
         * them any more, nor call a completion */
        local.reset();
        deadline settle(0.3);
        while (!settle.expired()) {
            sender.progress();
            tgt->progress();
        }
        for (size_t i = 0; i < posted; ++i) {
            if (!outstanding[i]) {
                EXPECT_EQ(0, comps[i].calls) << "op " << i << " completed "
                                                "in its call, then called";
                continue;
            }
            EXPECT_EQ(1, comps[i].calls) << "op " << i;
            EXPECT_NE(AFTER_DESTROY, comps[i].when)
                << "op " << i << ": completed after uct_ep_destroy returned";
            EXPECT_TRUE((comps[i].status == UCS_ERR_CANCELED) ||
                        (comps[i].status == UCS_OK))
                << "op " << i << ": " << comps[i].status;
        }
        if (fst == UCS_INPROGRESS) {
            EXPECT_EQ(1, fc.calls) << "the flush's completion, again";
        }
        EXPECT_EQ(0u, sender.errors.size()) << "error reported for a "
                                               "destroyed ep";
    }

    /* the iface goes on: its credits came back, a new ep's get works */
    buffer dst;
    ASSERT_NO_FATAL_FAILURE(dst.alloc(sender, kind, 4096));
    uct_ep_h y = sender.create_ep(tgt->dev_addr, tgt->iface_addr);
    ASSERT_NE(nullptr, y);
    /* a first get on the new ep: on tcp a WRITE frame that a destroyed ep
     * had started goes on from a copy and is placed at the target (the
     * initiator's buffers are free); the connection is one ordered stream,
     * so once this get's answer is here, the target has placed everything
     * sent before it, and the fill below is not overwritten */
    EXPECT_EQ(UCS_OK, get_and_wait(y, dst.data(), 4096, dst.memh, r.addr,
                                   rk.rkey(), ents));
    tgt->fill(r.id, 0, 4096, 63, 0);
    EXPECT_EQ(UCS_OK, get_and_wait(y, dst.data(), 4096, dst.memh, r.addr,
                                   rk.rkey(), ents));
    EXPECT_EQ(-1, pat_check(dst.data(), 4096, 63));
    sender.destroy_ep(y);
    rk.release();
    tgt->free(r.id);
}

/* Operations outstanding when their ep is destroyed give their resources
 * back: more of them than the iface has completion credits (TX_CQ_LEN)
 * leave later operations working. */
TEST_P(UctFlush, DestroyedEpsReturnTheirCredits)
{
    const unsigned credits = 8;
    entity s2;
    entity_config cfg = topology_config(topo, topo_fabric);
    cfg.iface_cfg.push_back({"TX_CQ_LEN", std::to_string(credits)});
    ASSERT_NO_FATAL_FAILURE(s2.open(cfg));
    if (topo != TOPO_LOCAL) {
        ((remote_target*)tgt.get())->set_local(&s2);
    }
    std::vector<entity*> e2 = {&s2, tgt->local_entity()};
    const size_t chunk = 1 << 20, per_ep = 4;
    target::rbuf r = tgt->alloc(kind, per_ep * chunk);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(s2.component, r.rkey));
    buffer dst;
    ASSERT_NO_FATAL_FAILURE(dst.alloc(s2, kind, per_ep * chunk));
    tgt->fill(r.id, 0, per_ep * chunk, 62, 0);

    unsigned outstanding = 0;
    std::vector<test_comp> comps(4 * credits * per_ep);
    size_t next = 0;
    for (unsigned round = 0; round < 4 * credits; ++round) {
        uct_ep_h x = s2.create_ep(tgt->dev_addr, tgt->iface_addr);
        ASSERT_NE(nullptr, x);
        for (size_t i = 0; i < per_ep; ++i) {
            test_comp &c = comps[next++];
            uct_iov_t iov = {dst.data() + i * chunk, chunk, dst.memh, 0, 1};
            ucs_status_t st = retry_send([&] {
                c.reset();
                return uct_ep_get_zcopy(x, &iov, 1, r.addr + i * chunk,
                                        rk.rkey(), &c.uct);
            }, e2);
            ASSERT_TRUE((st == UCS_OK) || (st == UCS_INPROGRESS))
                << "round " << round << " get " << i << ": " << st;
            if (st == UCS_OK) {
                c.calls = 1;
            } else {
                ++outstanding;
            }
        }
        s2.destroy_ep(x);
    }
    printf("[ INFO     ] %u gets outstanding at ep destruction\n",
           outstanding);
    EXPECT_TRUE(wait_for([&] {
        for (auto &c : comps) {
            if (c.calls == 0) {
                return false;
            }
        }
        return true;
    }, e2)) << "an operation of a destroyed ep never completed";
    for (size_t i = 0; i < comps.size(); ++i) {
        EXPECT_EQ(1, comps[i].calls) << "get " << i;
    }
    /* the credits came back: a signalled operation still goes out */
    uct_ep_h y = s2.create_ep(tgt->dev_addr, tgt->iface_addr);
    ASSERT_NE(nullptr, y);
    memset(dst.data(), 0, 4096);
    EXPECT_EQ(UCS_OK, get_and_wait(y, dst.data(), 4096, dst.memh, r.addr,
                                   rk.rkey(), e2));
    EXPECT_EQ(-1, pat_check(dst.data(), 4096, 62));
    EXPECT_EQ(0u, s2.errors.size());
    s2.destroy_ep(y);
    rk.release();
    dst.free();
    if (topo != TOPO_LOCAL) {
        ((remote_target*)tgt.get())->set_local(&sender);
    }
    s2.close();
    tgt->free(r.id);
}

/* ------------------------------------------------------------ fence */

TEST_P(UctFlush, FencePutThenFetchAddSeesThePut)
{
    const size_t len = 64 * 1024;
    target::rbuf r = tgt->alloc(kind, len);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    buffer src;
    ASSERT_NO_FATAL_FAILURE(src.alloc(sender, kind, len));
    tgt->write_u64(r.id, 0, 0);

    const int rounds = 300;
    for (int i = 0; i < rounds; ++i) {
        SCOPED_TRACE("round " + std::to_string(i));
        uint64_t v = pat_word(1000 + i, 0) & ~0xffull; /* +1 never carries */
        int form   = i % 4;
        test_comp pc;
        ucs_status_t st;

        pat_fill(src.data(), len, 2000 + i);
        memcpy(src.data(), &v, 8);
        switch (form) {
        case 0:
            st = retry_send([&] {
                return uct_ep_put_short(ep, &v, 8, r.addr, rk.rkey());
            }, ents);
            break;
        case 1:
            st = retry_send([&] {
                ssize_t n = uct_ep_put_bcopy(
                    ep, [](void *dest, void *arg) -> size_t {
                        memcpy(dest, arg, 8);
                        return 8;
                    }, &v, r.addr, rk.rkey());
                return (n < 0) ? (ucs_status_t)n : UCS_OK;
            }, ents);
            break;
        default: {
            /* a large put whose first word is the value */
            uct_iov_t iov = {src.data(), (form == 2) ? len : 4096, src.memh,
                             0, 1};
            st = retry_send([&] {
                pc.reset();
                return uct_ep_put_zcopy(ep, &iov, 1, r.addr, rk.rkey(),
                                        &pc.uct);
            }, ents);
            break;
        }
        }
        ASSERT_TRUE((st == UCS_OK) || (st == UCS_INPROGRESS)) << st;
        if ((i / 4) % 2) {
            ASSERT_EQ(UCS_OK, uct_iface_fence(sender.iface, 0));
        } else {
            ASSERT_EQ(UCS_OK, uct_ep_fence(ep, 0));
        }
        uint64_t res = ~0ull;
        test_comp ac;
        ucs_status_t ast = retry_send([&] {
            ac.reset();
            return uct_ep_atomic64_fetch(ep, UCT_ATOMIC_OP_ADD, 1, &res,
                                         r.addr, rk.rkey(), &ac.uct);
        }, ents);
        ASSERT_EQ(UCS_OK, complete_op(ast, ac, ents));
        ASSERT_EQ(UCS_OK, complete_op(st, pc, ents));
        ASSERT_EQ(v, res) << "the fetching atomic after the fence did not "
                             "see the put (form " << form << ")";
    }
    ASSERT_EQ(UCS_OK, flush_ep(ep, ents));
    uint64_t last = pat_word(1000 + rounds - 1, 0) & ~0xffull;
    EXPECT_EQ(last + 1, tgt->read_u64(r.id, 0));
    EXPECT_EQ(0u, sender.errors.size());
    rk.release();
    tgt->free(r.id);
}

TEST_P(UctFlush, FenceAtomicThenGetSeesTheAtomic)
{
    const size_t len = 4096;
    target::rbuf r = tgt->alloc(kind, len);
    ASSERT_GT(r.id, 0);
    rkey_holder rk;
    ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
    buffer dst;
    ASSERT_NO_FATAL_FAILURE(dst.alloc(sender, kind, len));
    tgt->write_u64(r.id, 0, 0);

    for (int i = 1; i <= 200; ++i) {
        ASSERT_EQ(UCS_OK, retry_send([&] {
            return uct_ep_atomic64_post(ep, UCT_ATOMIC_OP_ADD, 1, r.addr,
                                        rk.rkey());
        }, ents));
        ASSERT_EQ(UCS_OK, uct_ep_fence(ep, 0));
        test_comp c;
        uct_iov_t iov = {dst.data(), 8, dst.memh, 0, 1};
        ucs_status_t st = retry_send([&] {
            c.reset();
            return uct_ep_get_zcopy(ep, &iov, 1, r.addr, rk.rkey(), &c.uct);
        }, ents);
        ASSERT_EQ(UCS_OK, complete_op(st, c, ents));
        uint64_t got;
        memcpy(&got, dst.data(), 8);
        ASSERT_EQ((uint64_t)i, got) << "get after fence missed the add";
    }
    rk.release();
    tgt->free(r.id);
}

std::string flush_param_name(const ::testing::TestParamInfo<flush_param> &i)
{
    return std::string(topology_name(std::get<0>(i.param))) + "_" +
           mem_kind_name(std::get<1>(i.param));
}

INSTANTIATE_TEST_SUITE_P(
    hca, UctFlush,
    on_fabrics(::testing::Combine(::testing::Values(TOPO_LOCAL, TOPO_REMOTE,
                                                    TOPO_REMOTE_NO_CMA),
                                  ::testing::Values(MEM_IFACE_ALLOC,
                                                    MEM_PLAIN))),
    fabric_param_name<flush_param>(flush_param_name));

} /* namespace */
