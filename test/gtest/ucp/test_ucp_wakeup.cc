/*
 * test_ucp_wakeup.cc - UCP wakeup over hca (UCX_TLS=hca,self): a worker
 * asleep in ucp_worker_wait(), or in poll() on ucp_worker_get_efd() after
 * ucp_worker_arm(), is woken by a peer process's tag message (eager and
 * rendezvous).
 */
#include "ucp_test_common.h"

using namespace hcat;

namespace {

const uint64_t FEATURES = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;

size_t round_size(unsigned r)
{
    return (r & 1) ? (1ul << 20) : 64;
}

int wakeup_sender(channel &ch)
{
    ucp_peer p;
    p.init({}, FEATURES);
    if (::testing::Test::HasFatalFailure()) {
        return 2;
    }
    ucp_exchange_and_connect(p, ch, false);
    if (::testing::Test::HasFatalFailure()) {
        return 3;
    }
    std::vector<char> buf(1 << 20);
    for (;;) {
        std::string msg;
        if (!ucp_recv_progress(p, ch, &msg, 60)) {
            return 4;
        }
        if (msg == "quit") {
            break;
        }
        unsigned r = (unsigned)std::stoul(msg);
        usleep(50000); /* the receiver is asleep by now */
        pat_fill(buf.data(), round_size(r), 900 + r);
        if (p.wait(ucp_tag_send(p, buf.data(), round_size(r), r), 20) !=
            UCS_OK) {
            return 5;
        }
        ch.send("sent");
    }
    p.close_ep();
    ch.send("closed");
    std::string msg;
    ucp_recv_progress(p, ch, &msg, 5);
    p.cleanup();
    return 0;
}

class UcpWakeup : public uct_test_base {
protected:
    void SetUp() override
    {
        kid = fork_child([](channel &ch) { return wakeup_sender(ch); }, 120);
        ASSERT_NO_FATAL_FAILURE(p.init({}, FEATURES));
        ASSERT_NO_FATAL_FAILURE(ucp_exchange_and_connect(p, kid.ch, true));
        buf.resize(1 << 20);
    }

    void TearDown() override
    {
        if (kid.pid > 0) {
            std::string msg;
            kid.ch.send("quit");
            ucp_recv_progress(p, kid.ch, &msg, 5);
            p.close_ep();
            kid.ch.send("bye");
            EXPECT_EQ(0, wait_child(kid.pid, 20)) << "peer exit status";
            kid.ch.close_fds();
        }
        p.cleanup();
        uct_test_base::TearDown();
    }

    /* progress until nothing is left to do */
    void drain()
    {
        for (int i = 0; i < 1000; ++i) {
            p.progress();
        }
    }

    /* the round's message arrived completely and correctly */
    void finish_round(unsigned r, ucs_status_ptr_t rreq)
    {
        ucp_tag_recv_info_t info;
        deadline dl;
        ucs_status_t st;
        while ((st = ucp_tag_recv_request_test(rreq, &info)) ==
               UCS_INPROGRESS) {
            ASSERT_FALSE(dl.expired()) << "woken, but the message never "
                                          "completed";
            p.progress();
        }
        ucp_request_free(rreq);
        ASSERT_EQ(UCS_OK, st);
        EXPECT_EQ(round_size(r), info.length);
        EXPECT_EQ(-1, pat_check(buf.data(), round_size(r), 900 + r));
        std::string msg;
        ASSERT_TRUE(ucp_recv_progress(p, kid.ch, &msg)) << "sender stuck";
    }

    child            kid = {-1, channel()};
    ucp_peer         p;
    std::vector<char> buf;
};

TEST_F(UcpWakeup, WorkerWaitWokenByPeerMessage)
{
    const unsigned rounds = 6;
    for (unsigned r = 0; r < rounds; ++r) {
        SCOPED_TRACE("round " + std::to_string(r) + ", " +
                     std::to_string(round_size(r)) + " bytes");
        ucs_status_ptr_t rreq = ucp_tag_recv(p, buf.data(), round_size(r), r);
        ASSERT_FALSE(UCS_PTR_IS_ERR(rreq));
        drain();
        ASSERT_TRUE(kid.ch.send(std::to_string(r)));
        double t0 = now_sec();
        unsigned waits = 0;
        ucp_tag_recv_info_t info;
        deadline dl;
        while (ucp_tag_recv_request_test(rreq, &info) == UCS_INPROGRESS) {
            ucs_status_t st = UCS_ERR_LAST;
            bool woke = run_with_watchdog([&] {
                st = ucp_worker_wait(p.worker);
            }, 15);
            ASSERT_TRUE(woke) << "ucp_worker_wait() was not woken within 15 s "
                                 "by the peer's message";
            ASSERT_EQ(UCS_OK, st) << "ucp_worker_wait";
            ++waits;
            drain();
            ASSERT_FALSE(dl.expired());
        }
        printf("[ INFO     ] round %u: %u wait(s), %.1f ms\n", r, waits,
               (now_sec() - t0) * 1e3);
        ASSERT_NO_FATAL_FAILURE(finish_round(r, rreq));
    }
}

TEST_F(UcpWakeup, ArmAndPollEventFd)
{
    int efd = -1;
    ASSERT_EQ(UCS_OK, ucp_worker_get_efd(p.worker, &efd));
    ASSERT_GE(efd, 0);
    const unsigned rounds = 4;
    for (unsigned r = 0; r < rounds; ++r) {
        SCOPED_TRACE("round " + std::to_string(r));
        ucs_status_ptr_t rreq = ucp_tag_recv(p, buf.data(), round_size(r), r);
        ASSERT_FALSE(UCS_PTR_IS_ERR(rreq));
        deadline dl;
        ucs_status_t st;
        while ((st = ucp_worker_arm(p.worker)) == UCS_ERR_BUSY) {
            ASSERT_FALSE(dl.expired()) << "worker never became armable";
            p.progress();
        }
        ASSERT_EQ(UCS_OK, st) << "ucp_worker_arm";
        ASSERT_TRUE(kid.ch.send(std::to_string(r)));
        struct pollfd pfd = {efd, POLLIN, 0};
        int rc = poll(&pfd, 1, 10000);
        ASSERT_EQ(1, rc) << "poll() on the worker's event fd was not woken";
        ASSERT_NO_FATAL_FAILURE(finish_round(r, rreq));
    }
}

/* As UCX's test_ucp_wakeup.efd: two workers of this process, on each
 * fabric; the message is sent (and its send completed) before the
 * receiver first progresses, then the receiver progresses, arms and
 * sleeps on its event fd until the message is there. */
class UcpWakeupInProcess : public uct_test_base,
                           public with_fabric<int> {};

TEST_P(UcpWakeupInProcess, MessageSentBeforeTheReceiverArmsWakesIt)
{
    setenv("UCX_HCA_FABRIC", fabric_name(GetFabric()), 1);
    ucp_peer a, b;
    ASSERT_NO_FATAL_FAILURE(a.init({}, UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP));
    ASSERT_NO_FATAL_FAILURE(b.init({}, UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP));
    unsetenv("UCX_HCA_FABRIC");
    ASSERT_NO_FATAL_FAILURE(a.connect(b.address));
    int efd = -1;
    ASSERT_EQ(UCS_OK, ucp_worker_get_efd(b.worker, &efd));
    uint64_t sdata = 0x12121212, rdata = 0;
    ucp_request_param_t sp;
    memset(&sp, 0, sizeof(sp));
    ucs_status_ptr_t sreq = ucp_tag_send_nbx(a.ep, &sdata, sizeof(sdata),
                                             0xdeadbeef, &sp);
    ASSERT_FALSE(UCS_PTR_IS_ERR(sreq));
    deadline dl(10);
    while ((sreq != NULL) &&
           (ucp_request_check_status(sreq) == UCS_INPROGRESS) &&
           !dl.expired()) {
        a.progress();
        b.progress();
    }
    if (sreq != NULL) {
        ASSERT_EQ(UCS_OK, ucp_request_check_status(sreq));
        ucp_request_free(sreq);
    }
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof(rp));
    ucs_status_ptr_t rreq = ucp_tag_recv_nbx(b.worker, &rdata, sizeof(rdata),
                                             0xdeadbeef, (ucp_tag_t)-1, &rp);
    ASSERT_FALSE(UCS_PTR_IS_ERR(rreq));
    deadline d2(20);
    int sleeps = 0;
    while ((rreq != NULL) &&
           (ucp_request_check_status(rreq) == UCS_INPROGRESS)) {
        ASSERT_FALSE(d2.expired()) << "the message never came";
        if (ucp_worker_progress(b.worker)) {
            continue;
        }
        ucs_status_t st = ucp_worker_arm(b.worker);
        if (st == UCS_ERR_BUSY) {
            continue;
        }
        ASSERT_EQ(UCS_OK, st);
        struct pollfd pfd = {efd, POLLIN, 0};
        int rc = poll(&pfd, 1, 5000);
        ASSERT_EQ(1, rc) << "armed with the message on its way, and no "
                            "event in 5 s (sleep " << sleeps << ")";
        ++sleeps;
    }
    if (rreq != NULL) {
        ucp_request_free(rreq);
    }
    EXPECT_EQ(sdata, rdata);
}

INSTANTIATE_TEST_SUITE_P(
        hca, UcpWakeupInProcess, on_fabrics(::testing::Values(0)),
        fabric_param_name<int>([](const ::testing::TestParamInfo<int> &) {
            return std::string("inproc");
        }));

} /* namespace */
