/*
 * test_uct_pending.cc - flush while requests wait in an endpoint's pending
 * queue, the way UCP drives a transport:
 *
 *  - uct_iface_flush returns only UCS_OK or UCS_INPROGRESS (uct.h; UCP's
 *    ucp_worker_flush_check treats anything else, NO_RESOURCE included,
 *    as "flush failed").  Pending requests belong to the user, they are
 *    not outstanding iface work;
 *  - uct_ep_flush with a completion, retried from a pending request when
 *    it answered UCS_ERR_NO_RESOURCE (UCP's ucp_ep_flush_progress), fires
 *    once every operation issued before it was dispatched and completed.
 *
 * Two ways to fill the pending queue, both deterministic:
 *  - put_zcopy: a sender with a 4-entry send queue posts 1 MiB zero-copy
 *    puts of plain memory to a peer process without single-copy, whose
 *    responder executes them (they stay outstanding);
 *  - am_bcopy: active messages to a target in this process that is not
 *    progressed until the test waits, so its receive ring fills.
 * The operations that find no room go to the pending queue as requests that
 * issue them when dispatched, the way UCP queues its sends.
 */
#include "uct_test_common.h"

#include <tuple>

using namespace hcat;

namespace {

constexpr size_t N_PUTS  = 16;
constexpr size_t CHUNK   = 1 << 20;
constexpr size_t N_AMS   = 256;
constexpr size_t AM_LEN  = 1000;    /* payload after the 8-byte header */
constexpr uint8_t STREAM = 3;       /* ordered stream of the test AMs */

enum pending_op { OP_PUT_ZCOPY, OP_AM_BCOPY };

struct am_pack_src {
    uint64_t    hdr;
    const void *payload;
};

size_t am_pack(void *dest, void *arg)
{
    am_pack_src *a = (am_pack_src*)arg;
    memcpy(dest, &a->hdr, sizeof(a->hdr));
    memcpy((char*)dest + sizeof(a->hdr), a->payload, AM_LEN);
    return sizeof(a->hdr) + AM_LEN;
}

/* An operation that may wait in the pending queue: issued when dispatched */
struct op_req {
    uct_pending_req_t uct;        /* first: the request is found by cast */
    pending_op        op;
    uct_ep_h          ep;
    uct_iov_t         iov;        /* put: source */
    uint64_t          addr;       /* put: destination */
    uct_rkey_t        rkey;
    am_pack_src       am;         /* am: header and payload */
    ordered_comp         *comp;
    int               dispatched; /* calls of func from the arbiter */
    int               issued;     /* the operation was accepted */

    ucs_status_t issue()
    {
        if (op == OP_AM_BCOPY) {
            ssize_t n = uct_ep_am_bcopy(ep, AM_ID, am_pack, &am, 0);
            if (n < 0) {
                return (ucs_status_t)n;
            }
            return (n == (ssize_t)(sizeof(am.hdr) + AM_LEN)) ?
                   UCS_OK : UCS_ERR_IO_ERROR;
        }
        return uct_ep_put_zcopy(ep, &iov, 1, addr, rkey, &comp->uct);
    }

    static ucs_status_t func(uct_pending_req_t *self)
    {
        op_req *r = (op_req*)self;
        r->dispatched++;
        ucs_status_t st = r->issue();
        if (st == UCS_ERR_NO_RESOURCE) {
            return st;                 /* stays queued */
        }
        r->issued++;
        if (st == UCS_OK) {
            r->comp->done_now();
        } else if (st != UCS_INPROGRESS) {
            r->comp->calls  = 1;       /* failed: record, request done */
            r->comp->status = st;
        }
        return UCS_OK;
    }
};

/* UCP's flush request: uct_ep_flush again when dispatched */
struct flush_req {
    uct_pending_req_t uct;        /* first */
    uct_ep_h          ep;
    ordered_comp         *comp;
    int               dispatched;
    ucs_status_t      last;       /* what the dispatched flush returned */

    static ucs_status_t func(uct_pending_req_t *self)
    {
        flush_req *r = (flush_req*)self;
        r->dispatched++;
        r->last = uct_ep_flush(r->ep, 0, &r->comp->uct);
        if (r->last == UCS_ERR_NO_RESOURCE) {
            return UCS_ERR_NO_RESOURCE;
        }
        if (r->last == UCS_OK) {
            r->comp->done_now();
        }
        return UCS_OK;
    }
};

typedef std::tuple<topology, mem_kind, pending_op> pending_param;

class UctPendingFlush : public uct_test_base, public topo_sender,
                        public with_fabric<pending_param> {
protected:
    void SetUp() override
    {
        entity_config small_sq;
        kind = std::get<1>(GetParam());
        op   = std::get<2>(GetParam());
        n    = (op == OP_AM_BCOPY) ? N_AMS : N_PUTS;
        small_sq.iface_cfg.push_back({"TX_QUEUE_LEN", "4"});
        topo_fabric = GetFabric();
        ASSERT_NO_FATAL_FAILURE(open_topo(std::get<0>(GetParam()), small_sq));

        if (op == OP_PUT_ZCOPY) {
            r = tgt->alloc(kind, N_PUTS * CHUNK);
            ASSERT_GT(r.id, 0);
            ASSERT_EQ(UCS_OK, rk.unpack(sender.component, r.rkey));
            ASSERT_NO_FATAL_FAILURE(src.alloc(sender, kind, N_PUTS * CHUNK));
            pat_fill(src.data(), N_PUTS * CHUNK, 501);
            tgt->fill(r.id, 0, N_PUTS * CHUNK, 502, 0);
        } else {
            tgt->reset_stats();
            payloads.resize(N_AMS);
            for (size_t i = 0; i < N_AMS; ++i) {
                payloads[i].resize(AM_LEN);
                pat_fill(payloads[i].data(), AM_LEN, i);
            }
        }
    }

    void TearDown() override
    {
        if (ep != nullptr) {
            /* a failed test may leave requests queued (they live here) and
             * operations in flight on the buffers below */
            uct_ep_pending_purge(ep, NULL, NULL);
            sender.destroy_ep(ep);
            ep = nullptr;
            /* destroyed: what was in flight completes (cancelled) */
            wait_for([&] {
                return uct_iface_flush(sender.iface, 0, NULL) == UCS_OK;
            }, ents, 5);
        }
        rk.release();
        src.free();
        if (tgt && (r.id > 0)) {
            tgt->free(r.id);
        }
        close_topo();
        uct_test_base::TearDown();
    }

    /* Issues the n operations; those that find no room become pending
     * requests.  Returns how many went to the pending queue. */
    size_t issue_or_queue()
    {
        comps.resize(n);
        reqs.resize(n);
        size_t queued = 0;
        for (size_t i = 0; i < n; ++i) {
            op_req &q = reqs[i];
            comps[i].reset(&done);
            q.uct.func   = op_req::func;
            q.op         = op;
            q.ep         = ep;
            q.comp       = &comps[i];
            q.dispatched = 0;
            q.issued     = 0;
            if (op == OP_PUT_ZCOPY) {
                q.iov  = {src.data() + i * CHUNK, CHUNK, src.memh, 0, 1};
                q.addr = r.addr + i * CHUNK;
                q.rkey = rk.rkey();
            } else {
                am_hdr h;
                h.seed       = (uint32_t)i;
                h.length     = AM_LEN;
                h.stream     = STREAM;
                h.flags      = AM_HDR_ORDERED;
                q.am.hdr     = am_hdr_pack(h);
                q.am.payload = payloads[i].data();
            }
            for (;;) {
                /* UCP's order: the operation, then pending_add, whose
                 * UCS_ERR_BUSY means "resources are back: try again" */
                if (queued == 0) {
                    ucs_status_t st = op_req::func(&q.uct);
                    q.dispatched    = 0;
                    if (st == UCS_OK) {
                        break;
                    }
                }
                ucs_status_t pst = uct_ep_pending_add(ep, &q.uct, 0);
                if (pst == UCS_OK) {
                    ++queued;
                    break;
                }
                EXPECT_EQ(UCS_ERR_BUSY, pst);
                if (pst != UCS_ERR_BUSY) {
                    return queued;
                }
                if (queued != 0) {
                    ADD_FAILURE() << "pending_add returned UCS_ERR_BUSY "
                                     "with requests still queued";
                    return queued;
                }
            }
        }
        return queued;
    }

    void progress_all()
    {
        for (entity *e : ents) {
            if (e != nullptr) {
                e->progress();
            }
        }
    }

    /* Every operation completed once with OK and its data arrived */
    void check_ops()
    {
        for (size_t i = 0; i < n; ++i) {
            EXPECT_EQ(1, comps[i].calls) << "operation " << i;
            EXPECT_EQ(UCS_OK, comps[i].status) << "operation " << i;
            EXPECT_EQ(0, comps[i].uct.count) << "operation " << i;
            EXPECT_EQ(1, reqs[i].issued) << "operation " << i;
        }
        if (op == OP_PUT_ZCOPY) {
            EXPECT_EQ(-1, tgt->check(r.id, 0, N_PUTS * CHUNK, 501, 0));
        } else {
            am_stats st = tgt->wait_am(N_AMS, &sender);
            EXPECT_EQ(N_AMS, st.count);
            EXPECT_EQ(0u, st.bad) << st.first_error;
            EXPECT_EQ(0u, st.order_bad) << st.first_error;
        }
        EXPECT_EQ(0u, sender.errors.size());
    }

    mem_kind                kind;
    pending_op              op;
    size_t                  n;
    target::rbuf            r = {};
    rkey_holder             rk;
    buffer                  src;
    std::vector<std::vector<uint8_t>> payloads;
    int                     done = 0;
    std::vector<ordered_comp>   comps;
    std::vector<op_req>     reqs;
    ordered_comp                fc;
    flush_req               fr = {};
};

TEST_P(UctPendingFlush, IfaceFlushIsInProgressNotNoResource)
{
    size_t queued = issue_or_queue();
    printf("[ INFO     ] %zu of %zu operations queued as pending requests\n",
           queued, n);
    ASSERT_GT(queued, 0u) << "the test needs requests in the pending queue";

    /* while requests wait, and until everything completed: OK or
     * INPROGRESS, never UCS_ERR_NO_RESOURCE */
    deadline dl;
    ucs_status_t st;
    unsigned calls = 0;
    while ((st = uct_iface_flush(sender.iface, 0, NULL)) != UCS_OK) {
        ++calls;
        ASSERT_EQ(UCS_INPROGRESS, st)
            << "uct_iface_flush call " << calls << " with " << n - done
            << " operations not completed";
        ASSERT_FALSE(dl.expired()) << "iface flush never completed";
        progress_all();
    }
    EXPECT_GT(calls, 0u) << "iface flush was OK with requests pending";
    EXPECT_EQ((int)n, done)
        << "uct_iface_flush returned UCS_OK before every operation "
           "completed";
    check_ops();
}

TEST_P(UctPendingFlush, EpFlushThroughPendingQueueCompletesAfterEveryOp)
{
    size_t queued = issue_or_queue();
    printf("[ INFO     ] %zu of %zu operations queued as pending requests\n",
           queued, n);
    ASSERT_GT(queued, 0u) << "the test needs requests in the pending queue";

    /* UCP's ep flush: flush; on NO_RESOURCE a flush request goes to the
     * pending queue behind the operations and flushes again when
     * dispatched */
    fc.reset(&done);
    fr.uct.func   = flush_req::func;
    fr.ep         = ep;
    fr.comp       = &fc;
    fr.dispatched = 0;
    fr.last       = UCS_ERR_LAST;
    ucs_status_t st = uct_ep_flush(ep, 0, &fc.uct);
    ASSERT_TRUE((st == UCS_ERR_NO_RESOURCE) || (st == UCS_INPROGRESS))
        << "flush with " << queued << " requests pending returned " << st;
    if (st == UCS_ERR_NO_RESOURCE) {
        ucs_status_t pst = uct_ep_pending_add(ep, &fr.uct, 0);
        ASSERT_EQ(UCS_OK, pst) << "the flush request joins the queue";
    }
    ASSERT_TRUE(wait_for([&] { return fc.calls > 0; }, ents))
        << "flush completion not called; flush request dispatched "
        << fr.dispatched << " times, last flush status " << fr.last << ", "
        << done << " of " << n << " operations completed";
    EXPECT_EQ(1, fc.calls);
    EXPECT_EQ(UCS_OK, fc.status);
    EXPECT_EQ((int)n, fc.seen)
        << "the flush completed before " << (int)n - fc.seen
        << " of the operations issued before it";
    if (st == UCS_ERR_NO_RESOURCE) {
        EXPECT_GE(fr.dispatched, 1);
        EXPECT_LT(fr.dispatched, 100)
            << "the flush request was dispatched again and again";
    }
    check_ops();
    /* nothing left: a second flush is immediate */
    fc.reset(&done);
    EXPECT_EQ(UCS_OK, uct_ep_flush(ep, 0, &fc.uct));
}

TEST_P(UctPendingFlush, PurgeHandsBackEveryQueuedRequestOnce)
{
    size_t queued = issue_or_queue();
    ASSERT_GT(queued, 0u) << "the test needs requests in the pending queue";
    struct ctx {
        std::vector<int>     seen;
        size_t               calls = 0;
        std::vector<op_req> *reqs;
    } c;
    c.seen.assign(n, 0);
    c.reqs = &reqs;
    uct_ep_pending_purge(ep, [](uct_pending_req_t *self, void *arg) {
        ctx *x = (ctx*)arg;
        x->calls++;
        x->seen[(op_req*)self - x->reqs->data()]++;
    }, &c);
    size_t handed = 0, issued = 0;
    for (size_t i = 0; i < n; ++i) {
        EXPECT_LE(c.seen[i], 1) << "request " << i << " purged twice";
        if (c.seen[i]) {
            EXPECT_EQ(0, reqs[i].issued) << "request " << i
                                         << " issued and purged";
            ++handed;
        }
        issued += reqs[i].issued;
    }
    EXPECT_EQ(queued, handed);
    EXPECT_EQ(c.calls, handed);
    EXPECT_EQ(n, issued + handed) << "requests lost";
    /* the issued ones complete; a purged request is never dispatched */
    EXPECT_EQ(UCS_OK, flush_iface(sender, ents));
    for (size_t i = 0; i < n; ++i) {
        if (c.seen[i]) {
            EXPECT_EQ(0, reqs[i].dispatched) << "purged request " << i
                                             << " dispatched";
            EXPECT_EQ(0, comps[i].calls);
        } else {
            EXPECT_EQ(1, comps[i].calls) << "operation " << i;
            EXPECT_EQ(UCS_OK, comps[i].status) << "operation " << i;
        }
    }
}

std::string pending_param_name(
        const ::testing::TestParamInfo<pending_param> &i)
{
    return std::string(topology_name(std::get<0>(i.param))) + "_" +
           mem_kind_name(std::get<1>(i.param)) +
           ((std::get<2>(i.param) == OP_AM_BCOPY) ? "_am_bcopy" :
                                                    "_put_zcopy");
}

/* the combinations where operations stay queued: puts executed by the
 * peer's responder (no single copy, plain memory), AMs into a target that
 * only progresses while the test waits */
INSTANTIATE_TEST_SUITE_P(
    hca, UctPendingFlush,
    on_fabrics(::testing::Values(pending_param(TOPO_REMOTE_NO_CMA, MEM_PLAIN,
                                               OP_PUT_ZCOPY),
                                 pending_param(TOPO_LOCAL, MEM_PLAIN,
                                               OP_AM_BCOPY),
                                 pending_param(TOPO_LOCAL, MEM_IFACE_ALLOC,
                                               OP_AM_BCOPY))),
    fabric_param_name<pending_param>(pending_param_name));

} /* namespace */
