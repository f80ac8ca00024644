/*
 * test_ucp_semantics.cc - UCP as the user that breaks when a transport
 * departs from uct.h (issue 9).  Each test drives UCP to a state where
 * requests sit in a UCT endpoint's pending queue, or where an endpoint
 * failed, and asserts what UCP promises its own users then:
 *
 *  - UcpWorkerFlushSends, UcpWorkerFlushAtomics: a worker flush completes
 *    with UCS_OK while UCP requests are queued on a UCT ep (uct_iface_flush
 *    may answer only OK or INPROGRESS; UCP's ucp_worker_flush_check takes
 *    anything else as "flush failed"), and UCP's software atomics
 *    (UCX_ATOMIC_MODE=device, over AM) give exact results;
 *  - UcpEpFlush: an ep flush completes once the sends queued before it
 *    were sent (the flush goes through uct_ep_flush == NO_RESOURCE and
 *    uct_ep_pending_add, and is dispatched from the pending queue);
 *  - UcpFailedEp: a failed endpoint reports one status: the ep error
 *    callback's status is what the requests queued at the failure and
 *    every later operation complete with, each request exactly once;
 *  - UcpTagEpClose, UcpTagEpCloseDeadPeer: ucp_ep_close_nbx (flush and
 *    force) of a tag endpoint connected to a worker address completes
 *    while, or after, the peer does not progress, and when it died.
 *
 * The transport is a parameter: the same bodies run over UCX's own posix
 * (error mode NONE) and tcp (error mode PEER; UCP 1.13 has no peer
 * failure support on posix), so that the tests assert UCX's semantics,
 * not hca's.
 *
 * The active side runs in a forked process of its own (run_isolated):
 * a request stuck in a UCT pending queue can make ucp_worker_destroy abort
 * (ucs_bug in ucp_destroyed_ep_pending_purge), which must fail one test,
 * not end the gtest binary.  Every wait has a deadline.
 */
#include "ucp_test_common.h"

#include <algorithm>
#include <deque>
#include <map>
#include <signal.h>
#include <sys/wait.h>

using namespace hcat;

namespace {

const size_t PEER_MEM = 1ul << 20;

enum {
    SCMD_SLEEP = 1, SCMD_READ, SCMD_CHECK, SCMD_RECV, SCMD_DESTROY, SCMD_QUIT
};

/* How one request ended: completions seen, last status */
struct op_track {
    int          calls  = 0;
    ucs_status_t status = UCS_INPROGRESS;
    bool         queued = false; /* returned in progress */
};

void op_track_cb(void *req, ucs_status_t status, void *user_data)
{
    op_track *t = (op_track*)user_data;
    t->calls++;
    t->status = status;
    ucp_request_free(req);
}

/* Records what a non-blocking call returned: immediate completion, or a
 * request that op_track_cb completes. */
void track(op_track *t, ucs_status_ptr_t r)
{
    if (UCS_PTR_IS_PTR(r)) {
        t->queued = true;
        return;
    }
    t->calls++;
    t->status = UCS_PTR_STATUS(r);
}

ucp_request_param_t track_param(op_track *t)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                       UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send      = op_track_cb;
    prm.user_data    = t;
    return prm;
}

/* Sends n tagged messages of len bytes (tags tag0..tag0+n-1, payload the
 * pattern of the tag) without waiting; returns how many did not complete
 * in the call - with a peer that does not progress, the ones that wait
 * in the UCT ep's pending queue. */
unsigned send_tagged(ucp_ep_h ep, unsigned n, unsigned len, uint64_t tag0,
                     std::vector<op_track> *sends, std::vector<char> *bufs)
{
    unsigned queued = 0;

    sends->assign(n, op_track());
    bufs->resize((size_t)n * len);
    for (unsigned i = 0; i < n; ++i) {
        char *b = &(*bufs)[(size_t)i * len];
        pat_fill(b, len, tag0 + i);
        ucp_request_param_t prm = track_param(&(*sends)[i]);
        track(&(*sends)[i], ucp_tag_send_nbx(ep, b, len, tag0 + i, &prm));
    }
    for (const op_track &t : *sends) {
        queued += (t.calls == 0);
    }
    return queued;
}

std::string status_histogram(const std::vector<op_track> &ops)
{
    std::map<std::string, int> h;
    for (const op_track &t : ops) {
        std::string k = (t.calls == 0) ? "never completed" :
                        (t.calls > 1)  ? "completed more than once" :
                                         ucs_status_string(t.status);
        h[k]++;
    }
    std::string s;
    for (auto &kv : h) {
        s += (s.empty() ? "" : ", ") + kv.first + " x" +
             std::to_string(kv.second);
    }
    return s;
}

/* The settings of a test: the transport and what both sides configure */
struct sem_opts {
    std::string tls;          /* "hca", "posix", "tcp" (plus self) */
    cfg_list    cfg;          /* both sides */
    uint64_t    features = UCP_FEATURE_TAG;
    bool        err_peer = false;
    bool        peer_ep  = true;  /* the peer connects back */
    bool        peer_asleep_at_start = false; /* no progress before SLEEP */
    bool        user_mem = false; /* peer memory: malloc'ed, not ALLOCATE */
};

cfg_list full_config(const sem_opts &o)
{
    cfg_list all = {{"TLS", o.tls + ",self"}};
    all.insert(all.end(), o.cfg.begin(), o.cfg.end());
    return all;
}

void connect_ep(ucp_peer &p, const std::string &remote, bool err_peer,
                err_state *es)
{
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address    = (const ucp_address_t*)remote.data();
    if (err_peer) {
        ep.field_mask     |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                             UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_mode        = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb  = ep_err_cb;
        ep.err_handler.arg = es;
    }
    ASSERT_EQ(UCS_OK, ucp_ep_create(p.worker, &ep, &p.ep));
}

/* Closes an ep the way its error mode allows (force needs mode PEER);
 * the status of the close, UCS_ERR_TIMED_OUT if it did not complete. */
ucs_status_t close_ep(ucp_peer &p, bool force, double sec)
{
    if (p.ep == nullptr) {
        return UCS_OK;
    }
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags        = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_t st  = p.wait(ucp_ep_close_nbx(p.ep, &prm), sec);
    p.ep             = nullptr;
    return st;
}

/* ------------------------------------------------------------ the peer */

/* The passive side: owns mapped memory (RMA/AMO tests) and answers
 * commands, progressing its worker while it waits for the next one -
 * except in SLEEP, where it does not progress at all. */
int sem_peer(channel &ch, const sem_opts &o)
{
    ucp_peer p;
    err_state es;
    /* ucp_peer::init puts TLS=hca,self first; ours overrides it */
    p.init(full_config(o), o.features);
    if (::testing::Test::HasFatalFailure()) {
        return 2;
    }
    std::string remote;
    if (!ch.recv(&remote, 20000) || !ch.send(p.address)) {
        return 3;
    }
    if (o.peer_ep) {
        connect_ep(p, remote, o.err_peer, &es);
        if (::testing::Test::HasFatalFailure()) {
            return 4;
        }
    }

    ucp_mem_h memh = nullptr;
    uint8_t *base  = nullptr;
    void *user     = nullptr;
    wire hello;
    if (o.features & (UCP_FEATURE_RMA | UCP_FEATURE_AMO64)) {
        ucp_mem_map_params_t mp;
        memset(&mp, 0, sizeof(mp));
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                        UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        mp.address    = NULL;
        mp.length     = PEER_MEM;
        mp.flags      = UCP_MEM_MAP_ALLOCATE;
        if (o.user_mem) {
            if (posix_memalign(&user, 4096, PEER_MEM) != 0) {
                return 5;
            }
            mp.address = user;
            mp.flags   = 0;
        }
        if (ucp_mem_map(p.ctx, &mp, &memh) != UCS_OK) {
            return 5;
        }
        ucp_mem_attr_t ma;
        ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
        if (ucp_mem_query(memh, &ma) != UCS_OK) {
            return 6;
        }
        base = (uint8_t*)ma.address;
        memset(base, 0, PEER_MEM);
        void *rkb;
        size_t rks;
        if (ucp_rkey_pack(p.ctx, memh, &rkb, &rks) != UCS_OK) {
            return 7;
        }
        hello.u64((uint64_t)(uintptr_t)base)
             .blob(std::string((char*)rkb, rks));
        ucp_rkey_buffer_release(rkb);
    } else {
        hello.u64(0).blob("");
    }
    ch.send(hello.data);

    /* peer_asleep_at_start: no progress at all until the first SLEEP
     * ended (ucp_worker_progress would answer a wireup request) */
    bool progressing = !o.peer_asleep_at_start;
    int rc           = 0;
    for (;;) {
        std::string msg;
        bool got = (progressing && (p.worker != nullptr)) ?
                   ucp_recv_progress(p, ch, &msg, 60) :
                                 ch.recv(&msg, 60000);
        if (!got) {
            rc = 8;
            break;
        }
        wire req(msg), rep;
        uint64_t cmd = req.u64();
        if ((cmd == SCMD_QUIT) && (p.worker == nullptr)) {
            ch.send("bye");
            break;
        } else if (cmd == SCMD_QUIT) {
            /* drop what a force-closed or failed sender left unreceived
             * (UCP warns about unmatched descriptors at cleanup) */
            ucp_tag_recv_info_t info;
            ucp_tag_message_h msg_h;
            std::vector<char> scratch;
            while ((o.features & UCP_FEATURE_TAG) &&
                   ((msg_h = ucp_tag_probe_nb(p.worker, 0, 0, 1, &info)) !=
                    NULL)) {
                ucp_request_param_t prm;
                memset(&prm, 0, sizeof(prm));
                scratch.resize(info.length + 1);
                p.wait(ucp_tag_msg_recv_nbx(p.worker, scratch.data(),
                                            info.length, msg_h, &prm), 5);
            }
            ch.send("bye");
            break;
        }
        switch (cmd) {
        case SCMD_DESTROY: {
            /* the process lives on without UCP: its worker, iface and
             * target queue are gone */
            if (memh != nullptr) {
                ucp_mem_unmap(p.ctx, memh);
                memh = nullptr;
            }
            p.ep = nullptr; /* destroyed with the worker */
            p.cleanup();
            rep.blob("destroyed");
            break;
        }
        case SCMD_SLEEP: {
            /* asleep: no progress at all */
            uint64_t ms = req.u64();
            ch.send("asleep");
            usleep(ms * 1000);
            progressing = true;
            rep.blob("awake");
            break;
        }
        case SCMD_READ: {
            uint64_t off = req.u64(), len = req.u64();
            rep.blob(std::string((char*)base + off, len));
            break;
        }
        case SCMD_CHECK: {
            uint64_t off = req.u64(), len = req.u64(), seed = req.u64();
            rep.u64((uint64_t)(int64_t)pat_check(base + off, len, seed));
            break;
        }
        case SCMD_RECV: {
            /* n messages of len bytes, tags tag0.., pattern seed = tag */
            uint64_t n = req.u64(), len = req.u64(), tag0 = req.u64();
            std::vector<char> bufs(n * len + 1, 0);
            std::vector<ucs_status_ptr_t> reqs(n);
            for (uint64_t i = 0; i < n; ++i) {
                reqs[i] = ucp_tag_recv(p, &bufs[i * len], len, tag0 + i);
            }
            uint64_t ok = 0, bad = 0;
            for (uint64_t i = 0; i < n; ++i) {
                if (p.wait(reqs[i], 10) != UCS_OK) {
                    continue;
                }
                ++ok;
                if (pat_check(&bufs[i * len], len, tag0 + i) != -1) {
                    ++bad;
                }
            }
            rep.u64(ok).u64(bad);
            break;
        }
        }
        ch.send(rep.data);
    }
    if (memh != nullptr) {
        ucp_mem_unmap(p.ctx, memh);
    }
    free(user);
    /* progress while the active side closes its ep, then leave */
    std::string done;
    if (p.worker != nullptr) {
        ucp_recv_progress(p, ch, &done, 10);
    } else {
        ch.recv(&done, 10000);
    }
    if (p.ep != nullptr) {
        close_ep(p, o.err_peer, 2);
    }
    p.cleanup();
    return rc;
}

/* ------------------------------------------------------------ active side */

class sem_client {
public:
    ~sem_client()
    {
        if (::testing::Test::HasFailure()) {
            abandon();
        }
    }

    /* forks the peer, connects (and unpacks its rkey) */
    void start(const sem_opts &o)
    {
        opts = o;
        kid  = fork_child([o](channel &ch) { return sem_peer(ch, o); }, 60);
        ASSERT_NO_FATAL_FAILURE(p.init(full_config(o), o.features));
        ASSERT_TRUE(kid.ch.send(p.address));
        ASSERT_TRUE(kid.ch.recv(&remote, 20000)) << "no peer worker address";
        std::string msg;
        if (!o.peer_asleep_at_start) {
            ASSERT_NO_FATAL_FAILURE(connect());
            ASSERT_TRUE(ucp_recv_progress(p, kid.ch, &msg)) << "no hello";
        } else {
            ASSERT_TRUE(kid.ch.recv(&msg, 20000)) << "no hello";
        }
        wire w(msg);
        base            = w.u64();
        std::string rkb = w.blob();
        if (!rkb.empty()) {
            ASSERT_NE(nullptr, p.ep);
            ASSERT_EQ(UCS_OK, ucp_ep_rkey_unpack(p.ep, rkb.data(), &rkey));
        }
    }

    void connect()
    {
        ASSERT_NO_FATAL_FAILURE(connect_ep(p, remote, opts.err_peer, &es));
    }

    bool rpc(const wire &req, wire *rep, double sec = TIMEOUT_SEC)
    {
        std::string msg;
        if (!kid.ch.send(req.data) ||
            !ucp_recv_progress(p, kid.ch, &msg, sec)) {
            ADD_FAILURE() << "peer did not answer";
            return false;
        }
        *rep = wire(msg);
        return true;
    }

    /* The peer stops progressing for ms; returns once it is asleep.  Its
     * "awake" reply is left for wait_awake(). */
    void peer_sleep(unsigned ms)
    {
        wire req;
        req.u64(SCMD_SLEEP).u64(ms);
        ASSERT_TRUE(kid.ch.send(req.data));
        std::string msg;
        ASSERT_TRUE(kid.ch.recv(&msg, 10000));
        ASSERT_EQ("asleep", msg);
    }

    bool wait_awake(double sec)
    {
        std::string msg;
        return ucp_recv_progress(p, kid.ch, &msg, sec);
    }

    /* The peer receives n messages of len bytes (tags tag0..) and checks
     * their pattern; returns {received, corrupt}. */
    std::pair<uint64_t, uint64_t> peer_recv(uint64_t n, uint64_t len,
                                            uint64_t tag0)
    {
        wire req, rep;
        req.u64(SCMD_RECV).u64(n).u64(len).u64(tag0);
        if (!rpc(req, &rep, 30)) {
            return {0, 0};
        }
        uint64_t ok = rep.u64();
        return {ok, rep.u64()};
    }

    uint64_t read_u64(uint64_t off)
    {
        wire req, rep;
        req.u64(SCMD_READ).u64(off).u64(8);
        uint64_t v = ~0ull;
        if (rpc(req, &rep)) {
            std::string d = rep.blob();
            memcpy(&v, d.data(), std::min<size_t>(8, d.size()));
        }
        return v;
    }

    int64_t check(uint64_t off, uint64_t len, uint64_t seed)
    {
        wire req, rep;
        req.u64(SCMD_CHECK).u64(off).u64(len).u64(seed);
        return rpc(req, &rep) ? (int64_t)rep.u64() : -2;
    }

    /* progress until cond() or the deadline */
    bool progress_until(const std::function<bool()> &cond, double sec)
    {
        deadline dl(sec);
        while (!cond()) {
            if (dl.expired()) {
                return false;
            }
            p.progress();
        }
        return true;
    }

    /* A clean end: the peer quits, our ep closes, the peer exits 0 */
    void finish()
    {
        if (rkey != nullptr) {
            ucp_rkey_destroy(rkey);
            rkey = nullptr;
        }
        if (kid.pid > 0) {
            wire q, rep;
            q.u64(SCMD_QUIT);
            rpc(q, &rep, 10);
            EXPECT_EQ(UCS_OK, close_ep(p, opts.err_peer, 5))
                << "closing the ep at the end of the test";
            kid.ch.send("done");
            EXPECT_EQ(0, wait_child(kid.pid, 20)) << "peer exit status";
            kid.ch.close_fds();
            kid.pid = -1;
        }
        if (::testing::Test::HasFailure()) {
            abandon();
        }
        p.cleanup();
    }

    /* After a failure: the peer is killed and the UCP objects are left
     * alone.  A request still queued on a UCT ep makes ucp_worker_destroy
     * abort (ucs_bug), and this process ends right after. */
    void abandon()
    {
        if (kid.pid > 0) {
            kill(kid.pid, SIGKILL);
            wait_child(kid.pid, 5);
            kid.pid = -1;
        }
        p.ep     = nullptr;
        p.worker = nullptr;
        p.ctx    = nullptr;
    }

    sem_opts    opts;
    ucp_peer    p;
    child       kid = {-1, channel()};
    err_state   es;
    std::string remote;
    uint64_t    base = 0;
    ucp_rkey_h  rkey = nullptr;
};

std::string exit_meaning(int rc)
{
    switch (rc) {
    case 0:
        return "passed";
    case 1:
        return "a check failed (its failures are printed above)";
    case 128 + SIGALRM:
        return "hung: killed by its watchdog";
    case 128 + SIGABRT:
        return "aborted (see above: a UCX assertion or ucs_bug)";
    case 128 + SIGSEGV:
        return "crashed (SIGSEGV)";
    case -1:
        return "did not end in time";
    default:
        return "exit status " + std::to_string(rc);
    }
}

/* Runs body in a process of its own with a watchdog of sec seconds, and
 * fails the test if it failed, hung or crashed there. */
void run_isolated(const std::function<void()> &body, int sec)
{
    child c = fork_child([&body](channel&) {
        body();
        return 0;
    }, sec);
    int rc = wait_child(c.pid, sec + 10);
    c.ch.close_fds();
    EXPECT_EQ(0, rc) << "the test's process: " << exit_meaning(rc);
}

std::string tls_name(const ::testing::TestParamInfo<std::string> &i)
{
    return i.param;
}

/* ------------------------------------------------------------ item 1 */

/* Small hca queues on both sides: the peer's receive ring and our send
 * queue fill after a few requests, and the rest wait in the UCT ep's
 * pending queue (posix's FIFO has 64 or 256 entries).  UCP hands cached
 * keys to uct_config_modify, which matches "RX_QUEUE_LEN" in UCX 1.13 and
 * "HCA_RX_QUEUE_LEN" later (hca_config_key); no other transport here has
 * these fields. */
cfg_list small_queues(const std::string &tls)
{
    if (tls != "hca") {
        return {};
    }
    return {{hca_config_key("RX_QUEUE_LEN"), "16"},
            {hca_config_key("TX_QUEUE_LEN"), "16"},
            {hca_config_key("TX_CQ_LEN"), "16"}};
}

class UcpWorkerFlushSends : public uct_test_base,
                            public ::testing::WithParamInterface<std::string> {
};

/* The peer does not progress: its ring fills and the tag sends after
 * that wait in the UCT ep's pending queue, which UCP owns - no iface
 * operation is outstanding.  ucp_worker_flush_nbx: ucp_worker_flush_check
 * calls uct_iface_flush on every iface (ucp/rma/flush.c); any error,
 * NO_RESOURCE included, completes the flush with that error ("flush
 * failed"), before the ep flushes start.  It must complete with UCS_OK
 * (at the latest once the peer progresses), and every send must arrive. */
TEST_P(UcpWorkerFlushSends, SucceedsWithSendsInPendingQueue)
{
    /* more than posix's receive FIFO holds: 64 entries in UCX 1.13, 256
     * in 1.22 (uct/sm/mm/base/mm_iface.c, FIFO_SIZE) */
    const unsigned N = 600, LEN = 1024;
    const uint64_t TAG0 = 3000;

    run_isolated([&]() {
        sem_client c;
        sem_opts o;
        o.tls = GetParam();
        o.cfg = small_queues(o.tls);
        ASSERT_NO_FATAL_FAILURE(c.start(o));
        ASSERT_NO_FATAL_FAILURE(c.peer_sleep(2000));

        std::vector<op_track> sends;
        std::vector<char> bufs;
        unsigned queued = send_tagged(c.p.ep, N, LEN, TAG0, &sends, &bufs);
        ASSERT_GT(queued, 0u) << "no send waited: the test does not "
                                 "exercise the pending queue";

        op_track flush;
        ucp_request_param_t fprm = track_param(&flush);
        double t0 = now_sec();
        track(&flush, ucp_worker_flush_nbx(c.p.worker, &fprm));
        bool early = c.progress_until([&]() { return flush.calls > 0; }, 1);
        double t_early = now_sec() - t0;
        ASSERT_TRUE(c.wait_awake(10)) << "the peer did not wake up";
        bool done = c.progress_until([&]() { return flush.calls > 0; }, 5);
        printf("[ INFO     ] %u of %u sends queued; worker flush %s while "
               "the peer slept (%.3f s): %s\n", queued, N,
               early ? "completed" : "pending", t_early,
               status_histogram({flush}).c_str());
        EXPECT_TRUE(done) << "ucp_worker_flush_nbx did not complete within "
                             "5 s of the peer's progress";
        EXPECT_EQ(1, flush.calls);
        EXPECT_EQ(UCS_OK, flush.status) << "ucp_worker_flush_nbx with "
                                        << queued << " sends queued";
        EXPECT_TRUE(c.progress_until([&]() {
            for (const op_track &t : sends) {
                if (t.calls == 0) {
                    return false;
                }
            }
            return true;
        }, 5)) << "sends: " << status_histogram(sends);
        EXPECT_EQ("Success x" + std::to_string(N), status_histogram(sends));
        auto got = c.peer_recv(N, LEN, TAG0);
        EXPECT_EQ((uint64_t)N, got.first) << "messages received";
        EXPECT_EQ(0u, got.second) << "corrupt messages";
        c.finish();
    }, 40);
}

INSTANTIATE_TEST_SUITE_P(UcpSemantics, UcpWorkerFlushSends,
                         ::testing::Values("hca", "posix"), tls_name);

/* transport x UCX_FLUSH_WORKER_EPS */
struct wflush_case {
    std::string tls;
    bool        flush_eps;
};

std::string wflush_name(const ::testing::TestParamInfo<wflush_case> &i)
{
    return i.param.tls + (i.param.flush_eps ? "_flush_eps" : "_no_flush_eps");
}

void PrintTo(const wflush_case &c, std::ostream *os)
{
    *os << c.tls << ", FLUSH_WORKER_EPS=" << (c.flush_eps ? "y" : "n");
}

const wflush_case wflush_cases[] = {
    {"hca", true}, {"hca", false}, {"posix", true}, {"posix", false}
};

class UcpWorkerFlushAtomics
    : public uct_test_base,
      public ::testing::WithParamInterface<wflush_case> {};

/* What ucx_perftest -t ucp_add does with UCX_ATOMIC_MODE=device.  On a
 * transport without device atomics UCP emulates them with active
 * messages (UCP_AM_ID_ATOMIC_REQ/REP) that the peer executes from its
 * progress.  Many fetch-adds and puts in flight fill the pending queues
 * (the wireup ep's, while UCP resolves the remote ep id, then the UCT
 * ep's); the worker flush must still complete with UCS_OK, and the
 * atomics must be exact.
 *
 * With UCX_FLUSH_WORKER_EPS=y (the default) the worker flush also flushes
 * every ep, through the pending queue as in UcpEpFlush; =n leaves only
 * ucp_worker_flush_check (uct_iface_flush of every iface once UCP counts
 * no outstanding operation), which hits a non-empty pending queue only
 * by timing here (UcpWorkerFlushSends hits it every time). */
TEST_P(UcpWorkerFlushAtomics, SoftwareAtomicsCompleteAndFlushSucceeds)
{
    const unsigned N_AMO = 2000, N_PUT = 400, PUT_LEN = 256;
    const uint64_t AMO_OFF = 0, PUT_OFF = 4096;
    const wflush_case wc = GetParam();

    run_isolated([&]() {
        sem_client c;
        sem_opts o;
        o.tls      = wc.tls;
        o.cfg      = small_queues(o.tls);
        o.cfg.push_back({"ATOMIC_MODE", "device"});
        o.cfg.push_back({"FLUSH_WORKER_EPS", wc.flush_eps ? "y" : "n"});
        o.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64;
        ASSERT_NO_FATAL_FAILURE(c.start(o));

        /* precondition: no device-atomic lane, i.e. software atomics */
        std::string info = c.p.ep_info();
        ASSERT_EQ(std::string::npos, info.find("amo#"))
            << "atomics are not emulated over AM:\n" << info;

        std::vector<op_track> amo(N_AMO), put(N_PUT);
        std::vector<uint64_t> fetched(N_AMO, ~0ull);
        std::vector<char> src(N_PUT * PUT_LEN);
        uint64_t one = 1;
        for (unsigned i = 0, k = 0; i < N_AMO; ++i) {
            ucp_request_param_t prm = track_param(&amo[i]);
            prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE |
                                UCP_OP_ATTR_FIELD_REPLY_BUFFER;
            prm.datatype      = ucp_dt_make_contig(8);
            prm.reply_buffer  = &fetched[i];
            track(&amo[i], ucp_atomic_op_nbx(c.p.ep, UCP_ATOMIC_OP_ADD, &one,
                                             1, c.base + AMO_OFF, c.rkey,
                                             &prm));
            if ((i % (N_AMO / N_PUT)) == 0 && (k < N_PUT)) {
                char *s = &src[k * PUT_LEN];
                pat_fill(s, PUT_LEN, 100 + k);
                prm = track_param(&put[k]);
                track(&put[k], ucp_put_nbx(c.p.ep, s, PUT_LEN,
                                           c.base + PUT_OFF + k * PUT_LEN,
                                           c.rkey, &prm));
                ++k;
            }
        }
        unsigned in_flight = 0;
        for (const op_track &t : amo) {
            in_flight += (t.calls == 0);
        }
        ASSERT_GT(in_flight, 0u) << "every atomic completed at once: the "
                                    "test does not exercise a queue";

        ucp_request_param_t fprm;
        memset(&fprm, 0, sizeof(fprm));
        double t0       = now_sec();
        ucs_status_t st = c.p.wait(ucp_worker_flush_nbx(c.p.worker, &fprm),
                                   5);
        printf("[ INFO     ] %u of %u fetch-adds in flight; worker flush: "
               "%s after %.3f s\n", in_flight, N_AMO, ucs_status_string(st),
               now_sec() - t0);
        EXPECT_EQ(UCS_OK, st) << "ucp_worker_flush_nbx with " << in_flight
                              << " of " << N_AMO << " fetch-adds in flight";

        /* every request completes, once, with OK */
        auto all_done = [&]() {
            for (const op_track &t : amo) {
                if (t.calls == 0) {
                    return false;
                }
            }
            for (const op_track &t : put) {
                if (t.calls == 0) {
                    return false;
                }
            }
            return true;
        };
        bool done = c.progress_until(all_done, 5);
        EXPECT_TRUE(done) << "fetch-adds: " << status_histogram(amo)
                          << "; puts: " << status_histogram(put);
        ASSERT_EQ("Success x" + std::to_string(N_AMO), status_histogram(amo));
        ASSERT_EQ("Success x" + std::to_string(N_PUT), status_histogram(put));

        /* N fetch-adds of 1: the fetched values are 0..N-1, each once */
        std::vector<uint64_t> sorted = fetched;
        std::sort(sorted.begin(), sorted.end());
        unsigned wrong = 0;
        for (unsigned i = 0; i < N_AMO; ++i) {
            wrong += (sorted[i] != i);
        }
        EXPECT_EQ(0u, wrong) << "fetched values are not 0.." << N_AMO - 1
                             << " each once (smallest " << sorted.front()
                             << ", largest " << sorted.back() << ")";
        EXPECT_EQ((uint64_t)N_AMO, c.read_u64(AMO_OFF)) << "final value";
        for (unsigned k = 0; k < N_PUT; ++k) {
            ASSERT_EQ(-1, c.check(PUT_OFF + k * PUT_LEN, PUT_LEN, 100 + k))
                << "put " << k;
        }
        c.finish();
    }, 40);
}

INSTANTIATE_TEST_SUITE_P(UcpSemantics, UcpWorkerFlushAtomics,
                         ::testing::ValuesIn(wflush_cases), wflush_name);

/* ------------------------------------------------------------ item 2 */

class UcpEpFlush : public uct_test_base,
                   public ::testing::WithParamInterface<std::string> {};

/* While the peer does not progress, its receive ring fills and the
 * sends after that wait in the UCT ep's pending queue; the ep flush
 * posted behind them goes there too (uct_ep_flush answers NO_RESOURCE,
 * UCP adds its flush request with uct_ep_pending_add).  Once the peer
 * progresses, the sends go out and the flush must complete. */
TEST_P(UcpEpFlush, CompletesWithSendsInPendingQueue)
{
    const unsigned N = 500, LEN = 1024;
    const uint64_t TAG0 = 1000;

    run_isolated([&]() {
        sem_client c;
        sem_opts o;
        o.tls = GetParam();
        o.cfg = small_queues(o.tls);
        ASSERT_NO_FATAL_FAILURE(c.start(o));
        ASSERT_NO_FATAL_FAILURE(c.peer_sleep(2000));

        std::vector<op_track> sends;
        std::vector<char> bufs;
        unsigned queued = send_tagged(c.p.ep, N, LEN, TAG0, &sends, &bufs);
        ASSERT_GT(queued, 0u) << "no send waited: the test does not "
                                 "exercise the pending queue";

        op_track flush;
        ucp_request_param_t fprm = track_param(&flush);
        track(&flush, ucp_ep_flush_nbx(c.p.ep, &fprm));
        EXPECT_TRUE(flush.queued) << "the ep flush completed at once ("
                                  << flush.status << ") with " << queued
                                  << " sends queued";

        ASSERT_TRUE(c.wait_awake(10)) << "the peer did not wake up";
        double t0  = now_sec();
        bool done  = c.progress_until([&]() { return flush.calls > 0; }, 8);
        EXPECT_TRUE(done) << "ucp_ep_flush_nbx did not complete within 8 s "
                             "of the peer's progress (" << queued << " of "
                          << N << " sends were queued; sends now: "
                          << status_histogram(sends) << ")";
        if (done) {
            EXPECT_EQ(1, flush.calls);
            EXPECT_EQ(UCS_OK, flush.status);
            printf("[ INFO     ] %u of %u sends queued; the flush completed "
                   "%.3f s after the peer woke\n", queued, N, now_sec() - t0);
        }
        /* the flush covers every send posted before it */
        EXPECT_EQ("Success x" + std::to_string(N), status_histogram(sends));
        ASSERT_TRUE(done);
        auto got = c.peer_recv(N, LEN, TAG0);
        EXPECT_EQ((uint64_t)N, got.first) << "messages received";
        EXPECT_EQ(0u, got.second) << "corrupt messages";
        c.finish();
    }, 40);
}

INSTANTIATE_TEST_SUITE_P(UcpSemantics, UcpEpFlush,
                         ::testing::Values("hca", "posix"), tls_name);

/* ------------------------------------------------------------ item 3 */

class UcpFailedEp : public uct_test_base,
                    public ::testing::WithParamInterface<std::string> {};


/* After a failure was reported with `reported`: a tag send and a put of
 * len bytes and an ep flush on the failed ep complete with that status;
 * then the ep is closed (force), which must not hang. */
void expect_later_ops_fail(sem_client &c, ucs_status_t reported, void *buf,
                           size_t len)
{
    ucp_request_param_t prm;

    EXPECT_EQ(reported, c.p.wait(ucp_tag_send(c.p, buf, len, 7), 5))
        << "ucp_tag_send_nbx on the failed ep";
    memset(&prm, 0, sizeof(prm));
    EXPECT_EQ(reported, c.p.wait(ucp_put_nbx(c.p.ep, buf, len, c.base,
                                             c.rkey, &prm), 5))
        << "ucp_put_nbx on the failed ep";
    EXPECT_EQ(reported, c.p.flush_ep(5))
        << "ucp_ep_flush_nbx on the failed ep";
    ucp_rkey_destroy(c.rkey);
    c.rkey = nullptr;
    EXPECT_NE(UCS_ERR_TIMED_OUT, close_ep(c.p, true, 5))
        << "closing the failed ep";
}

/* UCP_ERR_HANDLING_MODE_PEER, keepalive 100 ms.  The peer stops
 * progressing, sends fill its ring and the pending queue (an ep flush
 * waits behind them), then the peer is SIGKILLed.  The error callback
 * runs once; every request queued at that moment completes once, with
 * the callback's status (UCP's purge hands it to them:
 * ucp_ep_discard_lanes -> ucp_ep_err_pending_purge / ucp_ep_reqs_purge);
 * later tag sends, puts and ep flushes fail with the same status (UCP
 * sends them to ucp_failed_tl_iface, whose operations answer
 * UCS_ERR_ENDPOINT_TIMEOUT). */
TEST_P(UcpFailedEp, ReportsOneStatus)
{
    /* sends until WANT_QUEUED of them wait (tcp's socket buffers take
     * megabytes first) */
    const unsigned MAX_SENDS = 20000, WANT_QUEUED = 100, LEN = 4096;
    const uint64_t TAG0 = 5000;

    run_isolated([&]() {
        sem_client c;
        sem_opts o;
        o.tls      = GetParam();
        o.cfg      = small_queues(o.tls);
        o.cfg.push_back({"KEEPALIVE_INTERVAL", "100ms"});
        o.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
        o.err_peer = true;
        ASSERT_NO_FATAL_FAILURE(c.start(o));

        /* a round trip: the endpoints are wired up and in use */
        std::vector<char> buf(LEN);
        pat_fill(buf.data(), LEN, 1);
        ASSERT_EQ(UCS_OK, c.p.wait(ucp_tag_send(c.p, buf.data(), LEN, 1)));
        auto got = c.peer_recv(1, LEN, 1);
        ASSERT_EQ(1u, got.first);
        ASSERT_EQ(0, c.es.calls);

        /* the peer stops; it is killed before it would wake */
        ASSERT_NO_FATAL_FAILURE(c.peer_sleep(60000));
        std::vector<op_track> sends(MAX_SENDS); /* never reallocated */
        unsigned n = 0, waiting = 0;
        while ((n < MAX_SENDS) && (waiting < WANT_QUEUED)) {
            ucp_request_param_t prm = track_param(&sends[n]);
            track(&sends[n], ucp_tag_send_nbx(c.p.ep, buf.data(), LEN,
                                              TAG0 + n, &prm));
            waiting += (sends[n].calls == 0);
            ++n;
        }
        sends.resize(n);
        op_track flush;
        ucp_request_param_t fprm = track_param(&flush);
        track(&flush, ucp_ep_flush_nbx(c.p.ep, &fprm));
        unsigned queued = 0;
        for (const op_track &t : sends) {
            queued += (t.calls == 0);
        }
        ASSERT_GT(queued, 0u) << "no send was queued at the peer's death";
        ASSERT_EQ(0, flush.calls) << "the ep flush completed with "
                                  << queued << " sends queued";

        ASSERT_EQ(0, kill(c.kid.pid, SIGKILL));
        EXPECT_EQ(128 + SIGKILL, wait_child(c.kid.pid));
        c.kid.pid = -1;
        double t0 = now_sec();
        auto all_done = [&]() {
            if ((c.es.calls == 0) || (flush.calls == 0)) {
                return false;
            }
            for (const op_track &t : sends) {
                if (t.calls == 0) {
                    return false;
                }
            }
            return true;
        };
        bool done = c.progress_until(all_done, 10);
        ASSERT_EQ(1, c.es.calls) << "ep error callback calls within 10 s "
                                    "of the peer's death";
        ucs_status_t reported = c.es.status;
        EXPECT_TRUE(UCS_STATUS_IS_ERR(reported)) << reported;

        /* the queued requests: each completed once, with that status */
        std::vector<op_track> queued_ops;
        for (const op_track &t : sends) {
            if (t.queued) {
                queued_ops.push_back(t);
            }
        }
        printf("[ INFO     ] %s: error callback after %.3f s: %s; %u "
               "queued sends: %s; ep flush: %s\n", o.tls.c_str(),
               now_sec() - t0, ucs_status_string(reported),
               (unsigned)queued_ops.size(),
               status_histogram(queued_ops).c_str(),
               status_histogram({flush}).c_str());
        EXPECT_TRUE(done) << "requests queued at the failure hang";
        /* sends may have gone out before the peer stopped reading: those
         * completed with OK; the others with the reported status */
        std::string hist = status_histogram(queued_ops);
        EXPECT_TRUE((hist.find("never") == std::string::npos) &&
                    (hist.find("more than once") == std::string::npos))
            << hist;
        unsigned other = 0;
        for (const op_track &t : queued_ops) {
            other += (t.calls == 1) && (t.status != UCS_OK) &&
                     (t.status != reported);
        }
        EXPECT_EQ(0u, other) << "queued sends completed with another status "
                                "than the error callback's: " << hist;
        EXPECT_EQ(1, flush.calls);
        EXPECT_EQ(reported, flush.status) << "the ep flush queued at the "
                                             "failure";

        expect_later_ops_fail(c, reported, buf.data(), LEN);
        c.kid.ch.close_fds();
        if (!::testing::Test::HasFailure()) {
            c.p.cleanup();
        }
    }, 40);
}

/* The same when an RMA operation, not keepalive (30 s here), finds the
 * peer dead: the peer is killed, then a 1 MiB put into its malloc'ed,
 * registered memory (zero-copy: a work request on hca, which the device
 * fails) and an ep flush behind it.  The error callback's status is what
 * the put, the flush and every later operation complete with. */
TEST_P(UcpFailedEp, FailureFoundByPutReportsOneStatus)
{
    const size_t PUT_LEN = PEER_MEM;

    run_isolated([&]() {
        sem_client c;
        sem_opts o;
        o.tls      = GetParam();
        o.cfg      = {{"KEEPALIVE_INTERVAL", "30s"}};
        o.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
        o.err_peer = true;
        o.user_mem = true;
        ASSERT_NO_FATAL_FAILURE(c.start(o));

        /* a round trip and a put: wired up, and the put lane works */
        std::vector<char> big(PUT_LEN);
        pat_fill(big.data(), 64, 1);
        ASSERT_EQ(UCS_OK, c.p.wait(ucp_tag_send(c.p, big.data(), 64, 1)));
        ASSERT_EQ(1u, c.peer_recv(1, 64, 1).first);
        pat_fill(big.data(), PUT_LEN, 2);
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        ASSERT_EQ(UCS_OK, c.p.wait(ucp_put_nbx(c.p.ep, big.data(), PUT_LEN,
                                               c.base, c.rkey, &prm)));
        ASSERT_EQ(UCS_OK, c.p.flush_ep());
        ASSERT_EQ(-1, c.check(0, PUT_LEN, 2));

        ASSERT_EQ(0, kill(c.kid.pid, SIGKILL));
        EXPECT_EQ(128 + SIGKILL, wait_child(c.kid.pid));
        c.kid.pid = -1;
        double t0 = now_sec();
        op_track put, flush;
        prm = track_param(&put);
        track(&put, ucp_put_nbx(c.p.ep, big.data(), PUT_LEN, c.base, c.rkey,
                                &prm));
        prm = track_param(&flush);
        track(&flush, ucp_ep_flush_nbx(c.p.ep, &prm));
        bool done = c.progress_until([&]() {
            return (c.es.calls > 0) && (put.calls > 0) && (flush.calls > 0);
        }, 10);
        printf("[ INFO     ] %s: error callback (%d) after %.3f s: %s; "
               "put: %s; ep flush: %s\n", o.tls.c_str(), c.es.calls,
               now_sec() - t0, ucs_status_string(c.es.status),
               status_histogram({put}).c_str(),
               status_histogram({flush}).c_str());
        ASSERT_EQ(1, c.es.calls) << "ep error callback calls within 10 s "
                                    "of the peer's death";
        ucs_status_t reported = c.es.status;
        EXPECT_TRUE(UCS_STATUS_IS_ERR(reported)) << reported;
        EXPECT_TRUE(done) << "the put or the flush hang";
        EXPECT_EQ(1, put.calls);
        if ((o.tls == "tcp") && (put.status == UCS_ERR_ENDPOINT_TIMEOUT)) {
            /* UCX's tcp returns ENDPOINT_TIMEOUT from the send that finds
             * the connection reset, whatever the error callback reports
             * (uct/tcp/tcp_ep.c, uct_tcp_ep_handle_send_err: "Translate the
             * error to EP timeout error"); UCP 1.22 reports the reset to
             * the callback first.  hca gives the put the reported status. */
            printf("[ INFO     ] tcp: the put has UCX's tcp translated "
                   "status\n");
        } else {
            EXPECT_EQ(reported, put.status) << "the put that found the "
                                               "failure";
        }
        EXPECT_EQ(1, flush.calls);
        EXPECT_EQ(reported, flush.status) << "the ep flush behind it";

        expect_later_ops_fail(c, reported, big.data(), 64);
        c.kid.ch.close_fds();
        if (!::testing::Test::HasFailure()) {
            c.p.cleanup();
        }
    }, 40);
}

/* The peer's process lives, but it destroyed its UCP worker (its iface
 * and receive queue are gone; keepalive 30 s): sends to it fail.  The
 * error callback's status is what the sends, the flush and every later
 * operation complete with - a refusal by the target reported as another
 * status than UCP's failed lanes answer (UCS_ERR_ENDPOINT_TIMEOUT) breaks
 * that. */
TEST_P(UcpFailedEp, PeerWorkerGoneReportsOneStatus)
{
    const unsigned N = 8, LEN = 64;

    run_isolated([&]() {
        sem_client c;
        sem_opts o;
        o.tls      = GetParam();
        o.cfg      = {{"KEEPALIVE_INTERVAL", "30s"}};
        o.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
        o.err_peer = true;
        ASSERT_NO_FATAL_FAILURE(c.start(o));
        std::vector<char> buf(LEN);
        pat_fill(buf.data(), LEN, 1);
        ASSERT_EQ(UCS_OK, c.p.wait(ucp_tag_send(c.p, buf.data(), LEN, 1)));
        ASSERT_EQ(1u, c.peer_recv(1, LEN, 1).first);

        wire req, rep;
        req.u64(SCMD_DESTROY);
        ASSERT_TRUE(c.rpc(req, &rep));
        ASSERT_EQ("destroyed", rep.blob());
        double t0 = now_sec();
        std::vector<op_track> sends(N);
        for (unsigned i = 0; i < N; ++i) {
            ucp_request_param_t prm = track_param(&sends[i]);
            track(&sends[i], ucp_tag_send_nbx(c.p.ep, buf.data(), LEN, 10 + i,
                                              &prm));
        }
        op_track flush;
        ucp_request_param_t fprm = track_param(&flush);
        track(&flush, ucp_ep_flush_nbx(c.p.ep, &fprm));
        bool done = c.progress_until([&]() {
            return (c.es.calls > 0) && (flush.calls > 0);
        }, 10);
        printf("[ INFO     ] %s: error callback (%d) after %.3f s: %s; "
               "sends: %s; ep flush: %s\n", o.tls.c_str(), c.es.calls,
               now_sec() - t0, ucs_status_string(c.es.status),
               status_histogram(sends).c_str(),
               status_histogram({flush}).c_str());
        ASSERT_EQ(1, c.es.calls) << "ep error callback calls within 10 s "
                                    "of the peer's worker destruction";
        ucs_status_t reported = c.es.status;
        EXPECT_TRUE(done) << "the ep flush hangs";
        unsigned other = 0;
        for (const op_track &t : sends) {
            other += (t.calls != 1) ||
                     ((t.status != UCS_OK) && (t.status != reported));
        }
        EXPECT_EQ(0u, other) << "sends that did not complete once with OK "
                                "or the reported status: "
                             << status_histogram(sends);
        EXPECT_EQ(reported, flush.status) << "the ep flush";
        expect_later_ops_fail(c, reported, buf.data(), LEN);
        c.opts.err_peer = false; /* closed already */
        c.finish();
    }, 40);
}

/* posix is no reference here: UCP 1.13 finds no peer failure support on
 * it (select.c: "posix/memory - no peer failure handler") */
INSTANTIATE_TEST_SUITE_P(UcpSemantics, UcpFailedEp,
                         ::testing::Values("hca", "tcp"), tls_name);

/* UCP_ERR_HANDLING_MODE_PEER with UCX's default keepalive: the peer is
 * SIGKILLed while this side sends small tagged messages (eager: each is
 * complete once it is in the peer's ring, so no operation waits for the
 * dead peer), or while it only waits for a message from it.  On hca this
 * used to be noticed only by UCP's keepalive (18-20 s); the device's
 * sweep of its peers' processes notices it within 1 s, as tcp does. */
class UcpDeadPeerDetection : public uct_test_base,
                             public ::testing::WithParamInterface<std::string> {
protected:
    void detect(bool sending)
    {
        run_isolated([&]() {
            sem_client c;
            sem_opts o;
            o.tls      = GetParam();
            o.features = UCP_FEATURE_TAG;
            o.err_peer = true;
            ASSERT_NO_FATAL_FAILURE(c.start(o));
            std::vector<char> buf(64);
            ASSERT_EQ(UCS_OK, c.p.wait(ucp_tag_send(c.p, buf.data(), 64, 1)));
            ASSERT_EQ(1u, c.peer_recv(1, 64, 1).first);

            op_track recv;
            ucs_status_ptr_t rreq = nullptr;
            if (!sending) {
                ucp_request_param_t prm = track_param(&recv);
                prm.cb.recv = [](void *req, ucs_status_t st,
                                 const ucp_tag_recv_info_t*, void *arg) {
                    op_track_cb(req, st, arg);
                };
                rreq = ucp_tag_recv_nbx(c.p.worker, buf.data(), 64, 77,
                                        ~0ull, &prm);
                ASSERT_TRUE(UCS_PTR_IS_PTR(rreq));
                track(&recv, rreq);
            }
            ASSERT_EQ(0, kill(c.kid.pid, SIGKILL));
            EXPECT_EQ(128 + SIGKILL, wait_child(c.kid.pid));
            c.kid.pid = -1;
            double t0 = now_sec();
            std::deque<op_track> sends;
            uint64_t tag = 2;
            bool seen = c.progress_until([&]() {
                if (c.es.calls > 0) {
                    return true;
                }
                if (sending && (sends.size() < 100000)) {
                    sends.emplace_back();
                    ucp_request_param_t prm = track_param(&sends.back());
                    track(&sends.back(),
                          ucp_tag_send_nbx(c.p.ep, buf.data(), 64, tag++,
                                           &prm));
                }
                return false;
            }, 30);
            double dt = now_sec() - t0;
            printf("[ INFO     ] %s, %s: the error callback %.3f s after "
                   "the kill, %zu sends\n", o.tls.c_str(),
                   sending ? "sending" : "receiving", dt, sends.size());
            ASSERT_TRUE(seen) << "no error callback within 30 s";
            EXPECT_LT(dt, 1.0);
            if (!sending) {
                /* a receive is not the ep's: nothing from the dead peer
                 * will match it, so it is cancelled */
                ucp_request_cancel(c.p.worker, rreq);
            }
            EXPECT_TRUE(c.progress_until([&]() {
                for (const op_track &t : sends) {
                    if (t.queued && (t.calls == 0)) {
                        return false;
                    }
                }
                return sending || (recv.calls > 0);
            }, 5)) << "requests left after the failure";
            c.kid.ch.close_fds();
            if (!::testing::Test::HasFailure()) {
                c.p.cleanup();
            }
        }, 60);
    }
};

TEST_P(UcpDeadPeerDetection, TagSenderWithinASecond)
{
    detect(true);
}

TEST_P(UcpDeadPeerDetection, TagReceiverWithinASecond)
{
    detect(false);
}

INSTANTIATE_TEST_SUITE_P(UcpSemantics, UcpDeadPeerDetection,
                         ::testing::Values("hca", "tcp"), tls_name);

/* ------------------------------------------------------------ item 4 */

/* close mode x error mode x transport */
struct close_case {
    bool        force;
    bool        err_peer;
    std::string tls;
};

std::string close_case_name(const ::testing::TestParamInfo<close_case> &i)
{
    return std::string(i.param.force ? "force" : "flush") +
           (i.param.err_peer ? "_errpeer_" : "_errnone_") + i.param.tls;
}

void PrintTo(const close_case &c, std::ostream *os)
{
    *os << (c.force ? "force" : "flush") << " close, error mode "
        << (c.err_peer ? "PEER" : "NONE") << ", " << c.tls;
}

/* posix has no error mode PEER in UCP 1.13 (no peer failure handler) */
const close_case close_cases[] = {
    {false, false, "hca"}, {false, true, "hca"}, {true, true, "hca"},
    {false, false, "posix"}
};

class UcpTagEpClose : public uct_test_base,
                      public ::testing::WithParamInterface<close_case> {};

/* A tag ep created to the worker address of a peer that is not
 * progressing at that time (and has not progressed since we connected),
 * used for a few eager sends that fit its ring, then closed.  With a
 * connect-to-iface transport nothing needs the peer: the ep is connected
 * locally, and UCP sends no wireup message (UCX_RESOLVE_REMOTE_EP_ID is
 * "n" by default in 1.13, so not even error mode PEER asks the peer for
 * its ep id), so the close completes while the peer sleeps. */
TEST_P(UcpTagEpClose, CompletesWhilePeerDoesNotProgress)
{
    const close_case cc = GetParam();
    const unsigned N = 4, LEN = 64;

    run_isolated([&]() {
        sem_client c;
        sem_opts o;
        o.tls                  = cc.tls;
        o.cfg                  = {{"KEEPALIVE_INTERVAL", "100ms"}};
        o.err_peer             = cc.err_peer;
        o.peer_ep              = false;
        o.peer_asleep_at_start = true;
        ASSERT_NO_FATAL_FAILURE(c.start(o));
        ASSERT_NO_FATAL_FAILURE(c.peer_sleep(3000));
        ASSERT_NO_FATAL_FAILURE(c.connect());

        std::vector<op_track> sends(N);
        std::vector<char> bufs(N * LEN);
        for (unsigned i = 0; i < N; ++i) {
            pat_fill(&bufs[i * LEN], LEN, 10 + i);
            ucp_request_param_t prm = track_param(&sends[i]);
            track(&sends[i], ucp_tag_send_nbx(c.p.ep, &bufs[i * LEN], LEN,
                                              10 + i, &prm));
        }

        op_track close;
        ucp_request_param_t prm = track_param(&close);
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags         = cc.force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        double t0 = now_sec();
        track(&close, ucp_ep_close_nbx(c.p.ep, &prm));
        c.p.ep = nullptr;
        bool asleep_done = c.progress_until([&]() { return close.calls > 0; },
                                            1.5);
        double t_asleep = now_sec() - t0;
        ASSERT_TRUE(c.wait_awake(10)) << "the peer did not wake up";
        bool done = c.progress_until([&]() { return close.calls > 0; }, 5);
        printf("[ INFO     ] close %s while the peer slept (%.3f s): %s\n",
               asleep_done ? "completed" : "pending", t_asleep,
               status_histogram({close}).c_str());
        EXPECT_TRUE(asleep_done) << "ucp_ep_close_nbx did not complete "
                                    "while the peer was not progressing";
        EXPECT_TRUE(done) << "ucp_ep_close_nbx did not complete within 5 s "
                             "of the peer's progress";
        EXPECT_EQ(1, close.calls);
        /* a force close completes in the call (ucp_ep_close_nbx returns
         * NULL: UCS_OK); a flush close with the flush's status */
        EXPECT_EQ(UCS_OK, close.status) << "close status";
        /* the sends: each completed once */
        std::string hist = status_histogram(sends);
        EXPECT_TRUE((hist.find("never") == std::string::npos) &&
                    (hist.find("more than once") == std::string::npos))
            << hist;
        c.finish();
    }, 40);
}

/* The same ep, wired up and in use, with sends queued in the UCT pending
 * queue while the peer sleeps.  Force: the close completes at once and
 * each queued send completes once (with an error).  Flush: the queued
 * sends go out when the peer progresses, then the close completes. */
TEST_P(UcpTagEpClose, CompletesWithSendsInPendingQueue)
{
    const close_case cc = GetParam();
    const unsigned N = 500, LEN = 1024;
    const uint64_t TAG0 = 2000;

    run_isolated([&]() {
        sem_client c;
        sem_opts o;
        o.tls      = cc.tls;
        o.cfg      = small_queues(o.tls);
        o.cfg.push_back({"KEEPALIVE_INTERVAL", "100ms"});
        o.err_peer = cc.err_peer;
        ASSERT_NO_FATAL_FAILURE(c.start(o));
        std::vector<char> bufs(N * LEN);
        pat_fill(bufs.data(), LEN, 1);
        ASSERT_EQ(UCS_OK, c.p.wait(ucp_tag_send(c.p, bufs.data(), LEN, 1)));
        ASSERT_EQ(1u, c.peer_recv(1, LEN, 1).first);

        ASSERT_NO_FATAL_FAILURE(c.peer_sleep(3000));
        std::vector<op_track> sends;
        unsigned queued = send_tagged(c.p.ep, N, LEN, TAG0, &sends, &bufs);
        ASSERT_GT(queued, 0u) << "no send was queued";

        op_track close;
        ucp_request_param_t prm = track_param(&close);
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags         = cc.force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        double t0 = now_sec();
        track(&close, ucp_ep_close_nbx(c.p.ep, &prm));
        c.p.ep = nullptr;
        bool asleep_done = c.progress_until([&]() { return close.calls > 0; },
                                            1.5);
        double t_asleep = now_sec() - t0;
        ASSERT_TRUE(c.wait_awake(10)) << "the peer did not wake up";
        bool done = c.progress_until([&]() { return close.calls > 0; }, 5);
        printf("[ INFO     ] %u of %u sends queued; close %s while the peer "
               "slept (%.3f s): %s; sends: %s\n", queued, N,
               asleep_done ? "completed" : "pending", t_asleep,
               status_histogram({close}).c_str(),
               status_histogram(sends).c_str());
        if (cc.force) {
            EXPECT_TRUE(asleep_done) << "a force close waited for the peer";
        }
        EXPECT_TRUE(done) << "ucp_ep_close_nbx did not complete within 5 s "
                             "of the peer's progress";
        EXPECT_EQ(1, close.calls);
        /* a force close completes in the call (ucp_ep_close_nbx returns
         * NULL: UCS_OK); a flush close with the flush's status */
        EXPECT_EQ(UCS_OK, close.status) << "close status";
        std::string hist = status_histogram(sends);
        if (cc.force) {
            EXPECT_TRUE((hist.find("never") == std::string::npos) &&
                        (hist.find("more than once") == std::string::npos))
                << hist;
        } else {
            /* flush: everything was delivered */
            EXPECT_EQ("Success x" + std::to_string(N), hist);
            auto got = c.peer_recv(N, LEN, TAG0);
            EXPECT_EQ((uint64_t)N, got.first) << "messages received";
            EXPECT_EQ(0u, got.second) << "corrupt messages";
        }
        c.finish();
    }, 40);
}

INSTANTIATE_TEST_SUITE_P(UcpSemantics, UcpTagEpClose,
                         ::testing::ValuesIn(close_cases), close_case_name);

/* error mode PEER: the dead-peer variant, hca and tcp */
const close_case dead_close_cases[] = {
    {false, true, "hca"}, {true, true, "hca"},
    {false, true, "tcp"}, {true, true, "tcp"}
};

class UcpTagEpCloseDeadPeer : public uct_test_base,
                              public ::testing::WithParamInterface<close_case> {
};

/* Sends wait in the pending queue of a peer that stopped progressing;
 * the peer is SIGKILLed and the ep closed at once, before the failure was
 * reported (keepalive 100 ms).  The close completes in bounded time: a
 * flush close through the error (UCP promotes it to cancel, or purges the
 * flush request with the failure status), a force close in the call; and
 * every queued send completes once. */
TEST_P(UcpTagEpCloseDeadPeer, CompletesWithSendsInPendingQueue)
{
    const close_case cc = GetParam();
    const unsigned MAX_SENDS = 20000, WANT_QUEUED = 100, LEN = 4096;

    run_isolated([&]() {
        sem_client c;
        sem_opts o;
        o.tls      = cc.tls;
        o.cfg      = small_queues(o.tls);
        o.cfg.push_back({"KEEPALIVE_INTERVAL", "100ms"});
        o.err_peer = true;
        ASSERT_NO_FATAL_FAILURE(c.start(o));
        std::vector<char> buf(LEN);
        pat_fill(buf.data(), LEN, 1);
        ASSERT_EQ(UCS_OK, c.p.wait(ucp_tag_send(c.p, buf.data(), LEN, 1)));
        ASSERT_EQ(1u, c.peer_recv(1, LEN, 1).first);

        ASSERT_NO_FATAL_FAILURE(c.peer_sleep(60000));
        std::vector<op_track> sends(MAX_SENDS); /* never reallocated */
        unsigned n = 0, waiting = 0;
        while ((n < MAX_SENDS) && (waiting < WANT_QUEUED)) {
            ucp_request_param_t prm = track_param(&sends[n]);
            track(&sends[n], ucp_tag_send_nbx(c.p.ep, buf.data(), LEN,
                                              100 + n, &prm));
            waiting += (sends[n].calls == 0);
            ++n;
        }
        sends.resize(n);
        ASSERT_GT(waiting, 0u) << "no send was queued";
        ASSERT_EQ(0, kill(c.kid.pid, SIGKILL));
        EXPECT_EQ(128 + SIGKILL, wait_child(c.kid.pid));
        c.kid.pid = -1;

        op_track close;
        ucp_request_param_t prm = track_param(&close);
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags         = cc.force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        double t0 = now_sec();
        track(&close, ucp_ep_close_nbx(c.p.ep, &prm));
        c.p.ep    = nullptr;
        bool done = c.progress_until([&]() {
            if (close.calls == 0) {
                return false;
            }
            for (const op_track &t : sends) {
                if (t.calls == 0) {
                    return false;
                }
            }
            return true;
        }, 10);
        printf("[ INFO     ] %s: %u of %u sends queued; close after %.3f s: "
               "%s; error callback %d (%s); sends: %s\n", cc.tls.c_str(),
               waiting, n, now_sec() - t0,
               status_histogram({close}).c_str(), c.es.calls,
               ucs_status_string(c.es.status),
               status_histogram(sends).c_str());
        EXPECT_TRUE(done) << "the close or a queued send did not complete "
                             "within 10 s of the peer's death";
        EXPECT_EQ(1, close.calls);
        std::string hist = status_histogram(sends);
        EXPECT_TRUE((hist.find("never") == std::string::npos) &&
                    (hist.find("more than once") == std::string::npos))
            << hist;
        c.kid.ch.close_fds();
        if (!::testing::Test::HasFailure()) {
            c.p.cleanup();
        }
    }, 40);
}

INSTANTIATE_TEST_SUITE_P(UcpSemantics, UcpTagEpCloseDeadPeer,
                         ::testing::ValuesIn(dead_close_cases),
                         close_case_name);

} /* namespace */
