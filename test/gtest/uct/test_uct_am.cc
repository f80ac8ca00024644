/*
 * test_uct_am.cc - active messages beyond single sends: ordering per
 * endpoint, handlers that keep the descriptor (UCS_INPROGRESS +
 * uct_iface_release_desc), many senders into a small receive queue through
 * the pending queue, and event-fd wakeups by a peer process.
 */
#include "uct_test_common.h"

#include <algorithm>

using namespace hcat;

namespace {

/* ------------------------------------------------------------ ordering */

class UctAmOrder : public uct_test_base,
                   public with_fabric<topology> {
protected:
    void TearDown() override
    {
        if (tgt && (GetParam() != TOPO_LOCAL)) {
            ((remote_target*)tgt.get())->set_local(nullptr);
        }
        sender.close();
        tgt.reset();
        uct_test_base::TearDown();
    }

    std::unique_ptr<target> tgt;
    entity                  sender;
};

TEST_P(UctAmOrder, SequencePerEndpoint)
{
    const int neps = 3, per_ep = 2000;
    ASSERT_NO_FATAL_FAILURE(make_target(GetParam(), &tgt, entity_config(),
                                        GetFabric()));
    ASSERT_NO_FATAL_FAILURE(
            sender.open(topology_config(GetParam(), GetFabric())));
    if (GetParam() != TOPO_LOCAL) {
        ((remote_target*)tgt.get())->set_local(&sender);
    }
    std::vector<entity*> ents = {&sender, tgt->local_entity()};
    std::vector<uct_ep_h> eps;
    for (int i = 0; i < neps; ++i) {
        eps.push_back(sender.create_ep(tgt->dev_addr, tgt->iface_addr));
        ASSERT_NE(nullptr, eps.back());
    }
    size_t ms = sender.attr.cap.am.max_short - 8;
    size_t mb = sender.attr.cap.am.max_bcopy - 8;
    size_t mz = sender.attr.cap.am.max_zcopy - 8;
    buffer src;
    ASSERT_NO_FATAL_FAILURE(src.alloc(sender, MEM_PLAIN,
                                      std::max(mb, mz) + 64));
    tgt->reset_stats();

    uint64_t total = 0, rnd = 12345;
    std::vector<uint32_t> seq(neps, 0);
    std::vector<test_comp> comps(neps);
    while (total < (uint64_t)neps * per_ep) {
        rnd = rnd * 6364136223846793005ull + 1442695040888963407ull;
        int e = (int)((rnd >> 33) % neps);
        if (seq[e] >= (uint32_t)per_ep) {
            continue;
        }
        am_method m = (am_method)((rnd >> 20) % 4);
        size_t cap  = (m == AM_SHORT || m == AM_SHORT_IOV) ? ms :
                      (m == AM_BCOPY) ? mb : mz;
        size_t len  = ((rnd >> 40) % 4 == 0) ? cap : (size_t)((rnd >> 44) % 200);
        len         = std::min(len, cap);
        am_hdr h    = {seq[e], (uint16_t)len, (uint8_t)e, AM_HDR_ORDERED};
        pat_fill(src.data(), len, h.seed);
        ucs_status_t st;
        if (m == AM_ZCOPY) {
            comps[e].reset();
            st = retry_send([&] {
                return send_test_am(eps[e], m, h, src, 3, &comps[e]);
            }, ents);
            /* the source buffer is reused: wait for this one */
            st = complete_op(st, comps[e], ents);
        } else {
            st = retry_send([&] {
                return send_test_am(eps[e], m, h, src, 3, nullptr);
            }, ents);
        }
        ASSERT_EQ(UCS_OK, st) << "ep " << e << " seq " << seq[e];
        seq[e]++;
        total++;
    }
    am_stats s = tgt->wait_am(total, &sender);
    EXPECT_EQ(total, s.count);
    EXPECT_EQ(0u, s.bad) << s.first_error;
    EXPECT_EQ(0u, s.order_bad) << s.first_error;
    /* nothing more arrives (no duplicates) */
    for (auto ep : eps) {
        ASSERT_EQ(UCS_OK, flush_ep(ep, ents));
    }
    usleep(50000);
    for (int i = 0; i < 1000; ++i) {
        tgt->progress();
    }
    s = tgt->stats();
    EXPECT_EQ(total, s.count) << "duplicated messages";
}

INSTANTIATE_TEST_SUITE_P(
        hca, UctAmOrder,
        on_fabrics(::testing::Values(TOPO_LOCAL, TOPO_REMOTE)),
        fabric_param_name<topology>(topology_name_of));

/* ------------------------------------------------------------ keep desc */

struct kept_desc {
    void    *data;
    size_t   length;
    uint8_t  mark;
};

struct keeper {
    size_t                 headroom;
    unsigned               count = 0;
    unsigned               bad = 0;
    unsigned               no_desc_flag = 0;
    std::vector<kept_desc> kept;
    unsigned               keep_every = 7;
    size_t                 max_kept = 400;
    std::string            first_error;
};

ucs_status_t keeper_cb(void *arg, void *data, size_t length, unsigned flags)
{
    keeper *k = (keeper*)arg;
    am_hdr h;

    k->count++;
    memcpy(&h, data, sizeof(h));
    if ((length != 8u + h.length) ||
        (pat_check((char*)data + 8, h.length, h.seed) != -1)) {
        k->bad++;
        if (k->first_error.empty()) {
            k->first_error = "message " + std::to_string(k->count) + " bad";
        }
    }
    if (!(flags & UCT_CB_PARAM_FLAG_DESC)) {
        k->no_desc_flag++;
        return UCS_OK;
    }
    if ((k->count % k->keep_every == 0) && (k->kept.size() < k->max_kept)) {
        uint8_t mark = (uint8_t)(k->count * 31 + 7);
        /* the headroom in front of the data is ours too */
        memset((char*)data - k->headroom, mark, k->headroom);
        k->kept.push_back({data, length, mark});
        return UCS_INPROGRESS;
    }
    return UCS_OK;
}

class UctAmDesc : public uct_test_base {};

TEST_F(UctAmDesc, KeepDescriptorsAcrossManyMessages)
{
    const size_t headroom = 32;
    entity snd, rcv;
    entity_config rcfg;
    rcfg.rx_headroom = headroom;
    rcfg.iface_cfg.push_back({"RX_QUEUE_LEN", "16"});
    /* segments above a ring slot, so that the larger messages need
     * receive descriptors */
    rcfg.iface_cfg.push_back({"SEG_SIZE", "16k"});
    entity_config scfg;
    scfg.iface_cfg.push_back({"SEG_SIZE", "16k"});
    ASSERT_NO_FATAL_FAILURE(rcv.open(rcfg));
    ASSERT_NO_FATAL_FAILURE(snd.open(scfg));
    keeper k;
    k.headroom = headroom;
    ASSERT_EQ(UCS_OK, uct_iface_set_am_handler(rcv.iface, AM_ID, keeper_cb,
                                               &k, 0));
    uct_ep_h ep = snd.connect_to(rcv);
    ASSERT_NE(nullptr, ep);
    std::vector<entity*> ents = {&snd, &rcv};

    size_t ms = snd.attr.cap.am.max_short - 8;
    size_t mb = snd.attr.cap.am.max_bcopy - 8;
    size_t mz = snd.attr.cap.am.max_zcopy - 8;
    buffer src;
    ASSERT_NO_FATAL_FAILURE(src.alloc(snd, MEM_PLAIN, std::max(mb, mz)));

    auto send_n = [&](unsigned n, uint32_t first_seed) {
        for (unsigned i = 0; i < n; ++i) {
            am_method m = (am_method)(i % 4);
            size_t cap  = (m == AM_SHORT || m == AM_SHORT_IOV) ? ms :
                          (m == AM_BCOPY) ? mb : mz;
            size_t len  = (i * 977) % (cap + 1);
            am_hdr h    = {first_seed + i, (uint16_t)len, 0, 0};
            pat_fill(src.data(), len, h.seed);
            test_comp comp;
            ucs_status_t st = retry_send([&] {
                comp.reset();
                return send_test_am(ep, m, h, src, 2, &comp);
            }, ents);
            ASSERT_EQ(UCS_OK, complete_op(st, comp, ents)) << "message " << i;
        }
    };

    const unsigned n1 = 3000;
    ASSERT_NO_FATAL_FAILURE(send_n(n1, 1000));
    ASSERT_TRUE(wait_for([&] { return k.count >= n1; }, ents))
        << "received " << k.count << " of " << n1;
    EXPECT_EQ(0u, k.bad) << k.first_error;
    /* messages that fit a ring slot (8 KiB) are handed over in place (no
     * UCT_CB_PARAM_FLAG_DESC, like mm's inline FIFO elements); larger
     * ones arrive in receive descriptors */
    EXPECT_GT(k.no_desc_flag, 100u) << "messages delivered in place";
    EXPECT_GT(k.count - k.no_desc_flag, 100u)
        << "messages delivered in receive descriptors";
    ASSERT_GT(k.kept.size(), 16u) << "more kept than receive descriptors";

    /* every kept descriptor still holds its message and our headroom */
    for (size_t i = 0; i < k.kept.size(); ++i) {
        const kept_desc &d = k.kept[i];
        am_hdr h;
        memcpy(&h, d.data, sizeof(h));
        EXPECT_EQ(d.length, 8u + h.length) << "kept descriptor " << i;
        EXPECT_EQ(-1, pat_check((char*)d.data + 8, h.length, h.seed))
            << "kept descriptor " << i << " was overwritten";
        std::string mark(headroom, (char)d.mark);
        EXPECT_EQ(0, memcmp((char*)d.data - headroom, mark.data(), headroom))
            << "headroom of kept descriptor " << i << " was overwritten";
    }
    for (const kept_desc &d : k.kept) {
        uct_iface_release_desc((char*)d.data - headroom);
    }
    k.kept.clear();

    /* the released descriptors are reused correctly */
    k.max_kept = 0;
    ASSERT_NO_FATAL_FAILURE(send_n(1000, 50000));
    ASSERT_TRUE(wait_for([&] { return k.count >= n1 + 1000; }, ents));
    EXPECT_EQ(0u, k.bad) << k.first_error;
    EXPECT_EQ(0u, snd.errors.size());
    src.free();
}

/* ------------------------------------------------------------ many to one */

struct sender_ctx {
    uct_pending_req_t req;       /* first: container of */
    entity           *ent;
    uct_ep_h          ep;
    buffer           *src;
    unsigned          id;
    uint32_t          next = 0;
    bool              pending = false;
    uint64_t          pending_adds = 0, busy = 0, no_resource = 0;
    ucs_status_t      last_error = UCS_OK;

    ucs_status_t send_current()
    {
        size_t ms  = ent->attr.cap.am.max_short - 8;
        size_t mb  = ent->attr.cap.am.max_bcopy - 8;
        bool small = (next % 3) != 0;
        size_t len = small ? (next * 13) % (ms + 1) : (next * 101) % (mb + 1);
        am_hdr h   = {next, (uint16_t)len, (uint8_t)id, AM_HDR_ORDERED};
        pat_fill(src->data(), len, h.seed);
        return send_test_am(ep, small ? AM_SHORT : AM_BCOPY, h, *src, 1,
                            nullptr);
    }

    static ucs_status_t pending_cb(uct_pending_req_t *self)
    {
        sender_ctx *s   = (sender_ctx*)self;
        ucs_status_t st = s->send_current();
        if (st == UCS_OK) {
            s->pending = false;
            s->next++;
            return UCS_OK;
        }
        if (st != UCS_ERR_NO_RESOURCE) {
            s->last_error = st;
            s->pending    = false;
            return UCS_OK; /* drop it: the loop reports the error */
        }
        return UCS_ERR_NO_RESOURCE;
    }
};

/* child: connect, wait for "go", send n messages through the pending queue
 * when the receiver is full, report counters */
int many2one_sender(channel &ch, unsigned id, uint32_t n)
{
    entity e;
    std::string msg;

    e.open();
    if (::testing::Test::HasFatalFailure()) {
        return 2;
    }
    if (!ch.recv(&msg, 20000)) {
        return 3;
    }
    wire w(msg);
    std::string dev = w.blob(), ifa = w.blob();
    uct_ep_h ep = e.create_ep(dev, ifa);
    if (ep == nullptr) {
        return 4;
    }
    buffer src;
    src.alloc(e, MEM_PLAIN, e.attr.cap.am.max_bcopy);
    if (::testing::Test::HasFatalFailure()) {
        return 5;
    }
    sender_ctx s;
    s.req.func = sender_ctx::pending_cb;
    s.ent      = &e;
    s.ep       = ep;
    s.src      = &src;
    s.id       = id;
    ch.send("ready");
    if (!ch.recv(&msg, 20000)) {
        return 6;
    }

    deadline dl(40);
    while ((s.next < n) && !dl.expired()) {
        ucs_status_t st = s.send_current();
        if (st == UCS_OK) {
            s.next++;
            continue;
        }
        if (st != UCS_ERR_NO_RESOURCE) {
            fprintf(stderr, "sender %u: send failed: %s\n", id,
                    ucs_status_string(st));
            return 7;
        }
        s.no_resource++;
        ucs_status_t pst = uct_ep_pending_add(ep, &s.req, 0);
        if (pst == UCS_ERR_BUSY) {
            s.busy++;
            continue;
        }
        if (pst != UCS_OK) {
            fprintf(stderr, "sender %u: pending_add: %s\n", id,
                    ucs_status_string(pst));
            return 8;
        }
        s.pending_adds++;
        s.pending = true;
        while (s.pending && !dl.expired()) {
            e.progress();
        }
        if (s.last_error != UCS_OK) {
            fprintf(stderr, "sender %u: pending send failed: %s\n", id,
                    ucs_status_string(s.last_error));
            return 9;
        }
    }
    if (s.next < n) {
        fprintf(stderr, "sender %u: sent %u of %u in time\n", id, s.next, n);
        return 10;
    }
    if (flush_ep(ep, {&e}) != UCS_OK) {
        return 11;
    }
    wire rep;
    rep.u64(s.next).u64(s.pending_adds).u64(s.busy).u64(s.no_resource)
       .u64(e.errors.size());
    ch.send(rep.data);
    ch.recv(&msg, 30000); /* "quit" */
    src.free();
    return 0;
}

class UctAmManyToOne : public uct_test_base {};

TEST_F(UctAmManyToOne, SmallRxQueueThreeSendersPending)
{
    const unsigned nsenders = 3;
    const uint32_t n        = 2000;
    std::vector<child> kids;

    for (unsigned i = 0; i < nsenders; ++i) {
        kids.push_back(fork_child([i, n](channel &ch) {
            return many2one_sender(ch, i, n);
        }));
    }
    local_target rcv;
    entity_config cfg;
    cfg.iface_cfg.push_back({"RX_QUEUE_LEN", "8"});
    ASSERT_NO_FATAL_FAILURE(rcv.open(cfg));
    wire addr;
    addr.blob(rcv.dev_addr).blob(rcv.iface_addr);
    for (auto &k : kids) {
        ASSERT_TRUE(k.ch.send(addr.data));
    }
    for (auto &k : kids) {
        std::string msg;
        ASSERT_TRUE(k.ch.recv(&msg, 20000)) << "sender not ready";
    }
    for (auto &k : kids) {
        ASSERT_TRUE(k.ch.send("go"));
    }
    /* let the 8-entry queue fill up before receiving anything */
    usleep(100000);

    deadline dl(40);
    while ((rcv.srv.st.count < nsenders * n) && !dl.expired()) {
        rcv.progress();
    }
    EXPECT_EQ(nsenders * n, rcv.srv.st.count) << "messages received";
    uint64_t adds = 0, busy = 0, nores = 0;
    for (unsigned i = 0; i < nsenders; ++i) {
        std::string msg;
        /* the receiver keeps receiving while waiting for the report */
        deadline rd(20);
        while (!kids[i].ch.readable(0) && !rd.expired()) {
            rcv.progress();
        }
        ASSERT_TRUE(kids[i].ch.recv(&msg, 1000)) << "no report from sender "
                                                 << i;
        wire w(msg);
        EXPECT_EQ(n, w.u64()) << "sender " << i << " messages sent";
        adds  += w.u64();
        busy  += w.u64();
        nores += w.u64();
        EXPECT_EQ(0u, w.u64()) << "sender " << i << " ep errors";
    }
    /* nothing late or duplicated */
    for (int i = 0; i < 1000; ++i) {
        rcv.progress();
    }
    EXPECT_EQ(nsenders * n, rcv.srv.st.count) << "duplicated messages";
    EXPECT_EQ(0u, rcv.srv.st.bad) << rcv.srv.st.first_error;
    EXPECT_EQ(0u, rcv.srv.st.order_bad) << rcv.srv.st.first_error;
    for (unsigned i = 0; i < nsenders; ++i) {
        EXPECT_EQ(n, rcv.srv.next_seq[i]) << "last sequence of sender " << i;
    }
    EXPECT_GT(nores, 0u) << "no send found the 8-entry queue full";
    EXPECT_GT(adds, 0u) << "the pending path was never used";
    printf("[ INFO     ] NO_RESOURCE %lu, pending_add OK %lu, BUSY %lu\n",
           (unsigned long)nores, (unsigned long)adds, (unsigned long)busy);
    for (auto &k : kids) {
        k.ch.send("quit");
    }
    for (auto &k : kids) {
        EXPECT_EQ(0, wait_child(k.pid)) << "sender exit status";
        k.ch.close_fds();
    }
}

/* ------------------------------------------------------------ event fd */

int event_sender(channel &ch, unsigned burst)
{
    entity e;
    std::string msg;

    e.open();
    if (::testing::Test::HasFatalFailure()) {
        return 2;
    }
    if (!ch.recv(&msg, 20000)) {
        return 3;
    }
    wire w(msg);
    std::string dev = w.blob(), ifa = w.blob();
    uct_ep_h ep = e.create_ep(dev, ifa);
    if (ep == nullptr) {
        return 4;
    }
    buffer src;
    src.alloc(e, MEM_PLAIN, 4096);
    ch.send("ready");
    uint32_t seq = 0;
    for (;;) {
        if (!ch.recv(&msg, 30000)) {
            return 5;
        }
        if (msg == "quit") {
            break;
        }
        usleep(30000); /* the receiver is asleep in poll() by now */
        for (unsigned i = 0; i < burst; ++i) {
            am_hdr h = {seq, 100, 0, AM_HDR_ORDERED};
            pat_fill(src.data(), 100, seq);
            ucs_status_t st = retry_send([&] {
                return send_test_am(ep, (i & 1) ? AM_BCOPY : AM_SHORT, h, src,
                                    1, nullptr);
            }, {&e});
            if (st != UCS_OK) {
                return 6;
            }
            seq++;
        }
        flush_ep(ep, {&e});
        ch.send("sent");
    }
    src.free();
    return 0;
}

class UctEvent : public uct_test_base {
protected:
    /* arms the iface: progress until arm says OK */
    void arm(entity &e, unsigned events)
    {
        deadline dl;
        for (;;) {
            e.progress();
            ucs_status_t st = uct_iface_event_arm(e.iface, events);
            if (st == UCS_OK) {
                return;
            }
            ASSERT_EQ(UCS_ERR_BUSY, st) << "uct_iface_event_arm";
            ASSERT_FALSE(dl.expired()) << "the iface never became armable";
        }
    }
};

TEST_F(UctEvent, PeerProcessAmWakesPoll)
{
    const unsigned rounds = 5;
    child kid = fork_child([](channel &ch) { return event_sender(ch, 1); });
    local_target rcv;
    ASSERT_NO_FATAL_FAILURE(rcv.open(entity_config()));
    entity &e = rcv.srv.ent;
    ASSERT_TRUE(e.attr.cap.event_flags & UCT_IFACE_FLAG_EVENT_FD);
    ASSERT_TRUE(e.attr.cap.event_flags & UCT_IFACE_FLAG_EVENT_RECV);
    int fd = -1;
    ASSERT_EQ(UCS_OK, uct_iface_event_fd_get(e.iface, &fd));
    ASSERT_GE(fd, 0);

    wire addr;
    addr.blob(rcv.dev_addr).blob(rcv.iface_addr);
    ASSERT_TRUE(kid.ch.send(addr.data));
    std::string msg;
    ASSERT_TRUE(kid.ch.recv(&msg, 20000));

    for (unsigned r = 0; r < rounds; ++r) {
        SCOPED_TRACE("round " + std::to_string(r));
        ASSERT_NO_FATAL_FAILURE(arm(e, UCT_EVENT_RECV));
        if (r == 0) {
            /* armed and idle: no event */
            struct pollfd pfd = {fd, POLLIN, 0};
            EXPECT_EQ(0, poll(&pfd, 1, 200)) << "wakeup without traffic";
            ASSERT_NO_FATAL_FAILURE(arm(e, UCT_EVENT_RECV));
        }
        ASSERT_TRUE(kid.ch.send("send"));
        double t0 = now_sec();
        struct pollfd pfd = {fd, POLLIN, 0};
        int rc = poll(&pfd, 1, 10000);
        ASSERT_EQ(1, rc) << "poll() on the event fd was not woken by the "
                            "peer's active message";
        EXPECT_TRUE(pfd.revents & POLLIN);
        EXPECT_LT(now_sec() - t0, 5.0);
        ASSERT_TRUE(wait_for([&] { return rcv.srv.st.count >= r + 1; }, {&e}))
            << "woken, but the message did not arrive";
        ASSERT_TRUE(kid.ch.recv(&msg, 20000));
    }
    EXPECT_EQ(rounds, rcv.srv.st.count);
    EXPECT_EQ(0u, rcv.srv.st.bad) << rcv.srv.st.first_error;
    EXPECT_EQ(0u, rcv.srv.st.order_bad) << rcv.srv.st.first_error;
    kid.ch.send("quit");
    EXPECT_EQ(0, wait_child(kid.pid));
    kid.ch.close_fds();
}

TEST_F(UctEvent, ArmIsBusyWhileMessagesWait)
{
    entity snd, rcv;
    ASSERT_NO_FATAL_FAILURE(rcv.open());
    ASSERT_NO_FATAL_FAILURE(snd.open());
    unsigned got = 0;
    ASSERT_EQ(UCS_OK, uct_iface_set_am_handler(
                      rcv.iface, AM_ID,
                      [](void *arg, void*, size_t, unsigned) {
                          ++*(unsigned*)arg;
                          return UCS_OK;
                      }, &got, 0));
    uct_ep_h ep = snd.connect_to(rcv);
    ASSERT_NE(nullptr, ep);
    int fd;
    ASSERT_EQ(UCS_OK, uct_iface_event_fd_get(rcv.iface, &fd));
    ASSERT_NO_FATAL_FAILURE(arm(rcv, UCT_EVENT_RECV));

    uint64_t v = 1;
    ASSERT_EQ(UCS_OK, retry_send([&] {
        return uct_ep_am_short(ep, AM_ID, 0, &v, sizeof(v));
    }, {&snd}));
    struct pollfd pfd = {fd, POLLIN, 0};
    ASSERT_EQ(1, poll(&pfd, 1, 10000)) << "in-process sender did not wake";
    /* a message is waiting: arming again must refuse until it is taken */
    EXPECT_EQ(UCS_ERR_BUSY, uct_iface_event_arm(rcv.iface, UCT_EVENT_RECV));
    ASSERT_TRUE(wait_for([&] { return got == 1; }, {&rcv}));
    ASSERT_NO_FATAL_FAILURE(arm(rcv, UCT_EVENT_RECV));
}

} /* namespace */
