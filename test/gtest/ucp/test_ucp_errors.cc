/*
 * test_ucp_errors.cc - UCP error handling over hca (UCX_TLS=hca,self):
 * endpoints in UCP_ERR_HANDLING_MODE_PEER work (eager and rendezvous), and
 * a peer killed with SIGKILL is reported to the ep's error callback by
 * UCP's keepalive (UCT_SEND_FLAG_PEER_CHECK on hca) in bounded time; sends
 * to it then fail instead of hanging.
 */
#include "ucp_test_common.h"

#include <signal.h>

using namespace hcat;

namespace {

const cfg_list err_config = {{"KEEPALIVE_INTERVAL", "100ms"},
                             {"RNDV_THRESH", "16k"}};

void connect_peer_mode(ucp_peer &p, const std::string &remote, err_state *es)
{
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof(ep));
    ep.field_mask      = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                         UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                         UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address         = (const ucp_address_t*)remote.data();
    ep.err_mode        = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb  = ep_err_cb;
    ep.err_handler.arg = es;
    ASSERT_EQ(UCS_OK, ucp_ep_create(p.worker, &ep, &p.ep));
}

int echo_until_killed(channel &ch)
{
    ucp_peer p;
    err_state es;
    p.init(err_config, UCP_FEATURE_TAG);
    if (::testing::Test::HasFatalFailure()) {
        return 2;
    }
    std::string remote;
    if (!ch.recv(&remote, 20000) || !ch.send(p.address)) {
        return 3;
    }
    connect_peer_mode(p, remote, &es);
    if (::testing::Test::HasFatalFailure()) {
        return 4;
    }
    std::vector<char> buf(1 << 20);
    for (uint64_t t = 0; t < 2; ++t) {
        size_t len = t ? (1 << 20) : 100;
        ucs_status_ptr_t r = ucp_tag_recv(p, buf.data(), len, t);
        if (p.wait(r, 20) != UCS_OK) {
            return 5;
        }
        if (p.wait(ucp_tag_send(p, buf.data(), len, 100 + t), 20) != UCS_OK) {
            return 6;
        }
    }
    ch.send("echoed");
    /* progress until killed */
    for (;;) {
        p.progress();
    }
    return 0;
}

class UcpPeerFailure : public uct_test_base {};

TEST_F(UcpPeerFailure, KilledPeerReachesEpErrorCallback)
{
    child kid = fork_child([](channel &ch) { return echo_until_killed(ch); },
                           60);
    ucp_peer p;
    err_state es;
    ASSERT_NO_FATAL_FAILURE(p.init(err_config, UCP_FEATURE_TAG));
    ASSERT_TRUE(kid.ch.send(p.address));
    std::string remote;
    ASSERT_TRUE(kid.ch.recv(&remote, 20000));
    ASSERT_NO_FATAL_FAILURE(connect_peer_mode(p, remote, &es));

    /* error mode PEER still carries eager and rendezvous traffic */
    std::vector<char> sbuf(1 << 20), rbuf(1 << 20);
    for (uint64_t t = 0; t < 2; ++t) {
        size_t len = t ? (1 << 20) : 100;
        SCOPED_TRACE("size " + std::to_string(len));
        pat_fill(sbuf.data(), len, 70 + t);
        ucs_status_ptr_t r = ucp_tag_recv(p, rbuf.data(), len, 100 + t);
        ASSERT_EQ(UCS_OK, p.wait(ucp_tag_send(p, sbuf.data(), len, t)));
        ASSERT_EQ(UCS_OK, p.wait(r));
        ASSERT_EQ(-1, pat_check(rbuf.data(), len, 70 + t));
    }
    std::string msg;
    ASSERT_TRUE(ucp_recv_progress(p, kid.ch, &msg));
    std::string info = p.ep_info();
    EXPECT_NE(std::string::npos, info.find("hca/hca0")) << info;
    ASSERT_EQ(0, es.calls) << "error callback while the peer lives: "
                           << es.status;

    /* kill it: keepalive (100 ms) must report it */
    ASSERT_EQ(0, kill(kid.pid, SIGKILL));
    EXPECT_EQ(128 + SIGKILL, wait_child(kid.pid));
    double t0 = now_sec();
    deadline dl(10);
    while ((es.calls == 0) && !dl.expired()) {
        p.progress();
    }
    ASSERT_EQ(1, es.calls) << "UCP's ep error callback was not called within "
                              "10 s of the peer's death (keepalive 100 ms)";
    EXPECT_TRUE(UCS_STATUS_IS_ERR(es.status));
    printf("[ INFO     ] peer failure reported after %.3f s: %s\n",
           now_sec() - t0, ucs_status_string(es.status));

    /* a send to the dead peer fails, and does not hang */
    ucs_status_ptr_t r = ucp_tag_send(p, sbuf.data(), 1 << 20, 5);
    ucs_status_t st = p.wait(r, 5);
    EXPECT_NE(UCS_OK, st) << "a send to a failed ep succeeded";
    EXPECT_NE(UCS_ERR_TIMED_OUT, st) << "a send to a failed ep hung";
    p.close_ep();
    kid.ch.close_fds();
    p.cleanup();
}

} /* namespace */
