/*
 * test_ucp_tag.cc - UCP tag send/recv over hca (UCX_TLS=hca,self) between
 * two processes: eager and rendezvous sizes up to 64 MiB, with
 * UCX_RNDV_SCHEME=put_zcopy and get_zcopy; the peer verifies every message
 * and echoes it back, and this side verifies the echo.  UcpNetOnlyAddress:
 * the network-only worker address that Open MPI gives ranks on other hosts
 * holds hca (and carries a message), unless hca serves this host only.
 */
#include "ucp_test_common.h"

using namespace hcat;

namespace {

const size_t tag_sizes[] = {0,       1,        8,         100,
                            1000,    4096,     8192,      16383,
                            16384,   65536,    262144,    1ul << 20,
                            4ul << 20, 16ul << 20, 64ul << 20};
const size_t n_sizes = sizeof(tag_sizes) / sizeof(tag_sizes[0]);
const size_t max_size = 64ul << 20;

cfg_list tag_config(const char *scheme)
{
    /* eager below 16k, rendezvous from 16k on */
    return {{"RNDV_SCHEME", scheme}, {"RNDV_THRESH", "16k"}};
}

/* receive a message: returns its status, *len the received length */
ucs_status_t recv_wait(ucp_peer &p, ucs_status_ptr_t req, size_t *len,
                       double sec = 60)
{
    if (UCS_PTR_IS_ERR(req)) {
        return UCS_PTR_STATUS(req);
    }
    if (req == NULL) {
        return UCS_ERR_NO_MESSAGE; /* recv_nbx always returns a request */
    }
    deadline dl(sec);
    ucp_tag_recv_info_t info;
    ucs_status_t st;
    while ((st = ucp_tag_recv_request_test(req, &info)) == UCS_INPROGRESS) {
        if (dl.expired()) {
            ucp_request_cancel(p.worker, req);
            deadline d2(2);
            while ((ucp_request_check_status(req) == UCS_INPROGRESS) &&
                   !d2.expired()) {
                p.progress();
            }
            ucp_request_free(req);
            return UCS_ERR_TIMED_OUT;
        }
        p.progress();
    }
    *len = info.length;
    ucp_request_free(req);
    return st;
}

int tag_echo_peer(channel &ch, cfg_list cfg)
{
    ucp_peer p;
    p.init(cfg, UCP_FEATURE_TAG);
    if (::testing::Test::HasFatalFailure()) {
        return 2;
    }
    ucp_exchange_and_connect(p, ch, false);
    if (::testing::Test::HasFatalFailure()) {
        return 3;
    }
    std::vector<char> buf(max_size);
    uint64_t errors = 0;
    std::string first_error;
    for (size_t i = 0; i < n_sizes; ++i) {
        size_t size = tag_sizes[i], got = ~0ul;
        ucs_status_t st = recv_wait(p, ucp_tag_recv(p, buf.data(), size, i),
                                    &got);
        if ((st != UCS_OK) || (got != size) ||
            (pat_check(buf.data(), size, 500 + i) != -1)) {
            if (first_error.empty()) {
                first_error = "size " + std::to_string(size) + ": " +
                              ucs_status_string(st) + ", got " +
                              std::to_string(got);
            }
            errors++;
        }
        st = p.wait(ucp_tag_send(p, buf.data(), size, 1000 + i), 60);
        if (st != UCS_OK) {
            errors++;
        }
    }
    wire w;
    w.u64(errors).blob(first_error);
    ch.send(w.data);
    std::string msg;
    ucp_recv_progress(p, ch, &msg, 30); /* "quit" */
    p.cleanup();
    return 0;
}

class UcpTag : public uct_test_base,
               public ::testing::WithParamInterface<const char*> {};

TEST_P(UcpTag, EagerAndRendezvousEchoBetweenProcesses)
{
    cfg_list cfg = tag_config(GetParam());
    child kid = fork_child([cfg](channel &ch) {
        return tag_echo_peer(ch, cfg);
    }, 150);
    ucp_peer p;
    ASSERT_NO_FATAL_FAILURE(p.init(cfg, UCP_FEATURE_TAG));
    ASSERT_NO_FATAL_FAILURE(ucp_exchange_and_connect(p, kid.ch, true));

    std::vector<char> sbuf(max_size), rbuf(max_size);
    for (size_t i = 0; i < n_sizes; ++i) {
        size_t size = tag_sizes[i], got = ~0ul;
        SCOPED_TRACE("size " + std::to_string(size));
        pat_fill(sbuf.data(), size, 500 + i);
        memset(rbuf.data(), 0, size);
        ucs_status_ptr_t rreq = ucp_tag_recv(p, rbuf.data(), size, 1000 + i);
        ASSERT_FALSE(UCS_PTR_IS_ERR(rreq));
        ASSERT_EQ(UCS_OK, p.wait(ucp_tag_send(p, sbuf.data(), size, i), 60))
            << "tag send";
        ASSERT_EQ(UCS_OK, recv_wait(p, rreq, &got)) << "echo receive";
        ASSERT_EQ(size, got);
        ASSERT_EQ(-1, pat_check(rbuf.data(), size, 500 + i))
            << "echoed data differs at this offset";
    }
    std::string msg;
    ASSERT_TRUE(ucp_recv_progress(p, kid.ch, &msg)) << "no report from peer";
    wire w(msg);
    EXPECT_EQ(0u, w.u64()) << "the peer received wrong data: " << w.blob();
    /* the lanes: one hca lane, with rendezvous (rma_bw) on it */
    std::string info = p.ep_info();
    EXPECT_NE(std::string::npos, info.find("hca/hca0")) << info;
    EXPECT_NE(std::string::npos, info.find("rma_bw")) << info;
    kid.ch.send("quit");
    p.close_ep();
    EXPECT_EQ(0, wait_child(kid.pid, 30)) << "peer exit status";
    kid.ch.close_fds();
    p.cleanup();
}

INSTANTIATE_TEST_SUITE_P(hca, UcpTag,
                         ::testing::Values("put_zcopy", "get_zcopy"),
                         [](const ::testing::TestParamInfo<const char*> &i) {
                             return std::string(i.param);
                         });

/* A probed rendezvous message received with ucp_tag_msg_recv_nbx and
 * UCP_OP_ATTR_FLAG_NO_IMM_CMPL, as UCX's test_ucp_tag_probe.
 * send_rndv_msg_probe does: hca may complete the rendezvous inside the call,
 * and the callback then runs once, from the call, with the caller's
 * user_data (UCP passes param->user_data whether or not the caller set
 * UCP_OP_ATTR_FIELD_USER_DATA: ucp_request.inl, ucp_request_cb_param).
 * Between two workers of this process. */
class UcpTagProbe : public uct_test_base,
                    public ::testing::WithParamInterface<bool> {};

struct probe_recv {
    int          calls  = 0;
    ucs_status_t status = UCS_ERR_LAST;
    size_t       length = 0;
};

TEST_P(UcpTagProbe, ProbedRendezvousCompletesOnce)
{
    const bool with_user_data = GetParam();
    ucp_peer a, b;
    ASSERT_NO_FATAL_FAILURE(a.init({{"RNDV_THRESH", "16k"}}, UCP_FEATURE_TAG));
    ASSERT_NO_FATAL_FAILURE(b.init({{"RNDV_THRESH", "16k"}}, UCP_FEATURE_TAG));
    ASSERT_NO_FATAL_FAILURE(a.connect(b.address));
    ASSERT_NO_FATAL_FAILURE(b.connect(a.address));
    const size_t size = 1148576;
    std::vector<char> sbuf(size), rbuf(size, 0);
    pat_fill(sbuf.data(), size, 31);

    ucp_request_param_t sp;
    memset(&sp, 0, sizeof(sp));
    ucs_status_ptr_t sreq = ucp_tag_send_nbx(a.ep, sbuf.data(), size, 0x111337,
                                             &sp);
    ASSERT_FALSE(UCS_PTR_IS_ERR(sreq));
    ucp_tag_recv_info_t info;
    ucp_tag_message_h msg = nullptr;
    deadline dl(10);
    while ((msg == nullptr) && !dl.expired()) {
        a.progress();
        b.progress();
        msg = ucp_tag_probe_nb(b.worker, 0x1337, 0xffff, 1, &info);
    }
    ASSERT_NE(nullptr, msg) << "the rendezvous message never arrived";
    EXPECT_EQ(size, info.length);

    probe_recv r;
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                      UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    rp.datatype     = ucp_dt_make_contig(1);
    rp.cb.recv      = [](void *, ucs_status_t status,
                         const ucp_tag_recv_info_t *ri, void *user_data) {
        probe_recv *pr = (probe_recv*)user_data;
        if (pr == nullptr) {
            return; /* counted below through the request's status */
        }
        pr->calls++;
        pr->status = status;
        pr->length = (status == UCS_OK) ? ri->length : 0;
    };
    if (with_user_data) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_USER_DATA;
        rp.user_data     = &r;
    }
    ucs_status_ptr_t rreq = ucp_tag_msg_recv_nbx(b.worker, rbuf.data(), size,
                                                 msg, &rp);
    ASSERT_FALSE(UCS_PTR_IS_ERR(rreq));
    ASSERT_NE(nullptr, rreq) << "NO_IMM_CMPL: a request is returned";
    deadline d2(10);
    while ((ucp_request_check_status(rreq) == UCS_INPROGRESS) &&
           !d2.expired()) {
        a.progress();
        b.progress();
    }
    EXPECT_EQ(UCS_OK, ucp_request_check_status(rreq));
    if (ucp_request_check_status(rreq) == UCS_INPROGRESS) {
        /* not freed (nor its buffer) while it may still write */
        ucp_request_cancel(b.worker, rreq);
        deadline d3(5);
        while ((ucp_request_check_status(rreq) == UCS_INPROGRESS) &&
               !d3.expired()) {
            a.progress();
            b.progress();
        }
        ASSERT_NE(UCS_INPROGRESS, ucp_request_check_status(rreq))
            << "the receive neither completed nor was cancelled";
    }
    for (int i = 0; i < 100; ++i) {
        a.progress();
        b.progress();
    }
    if (with_user_data) {
        EXPECT_EQ(1, r.calls) << "receive callback calls";
        EXPECT_EQ(UCS_OK, r.status);
        EXPECT_EQ(size, r.length);
    }
    ucp_request_free(rreq);
    EXPECT_EQ(-1, pat_check(rbuf.data(), size, 31)) << "received data";
    EXPECT_EQ(UCS_OK, a.wait(sreq));
}

INSTANTIATE_TEST_SUITE_P(hca, UcpTagProbe, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool> &i) {
                             return std::string(i.param ? "user_data" :
                                                          "no_user_data");
                         });

/* Open MPI gives the ranks on other hosts a network-only worker address
 * (ucp_worker_query with UCP_WORKER_ADDRESS_FLAG_NET_ONLY; pml ucx's modex
 * for remote peers).  hca reaches other hosts, so it must be in that
 * address as a network device; without it those ranks find no transport
 * (ucp_ep_create: "Destination is unreachable", which is how Open MPI
 * jobs across hosts failed).  With UCX_HCA_FABRIC=shm hca reaches this
 * host only and stays out of it, as UCX's shared-memory transports do. */
class UcpNetOnlyAddress : public uct_test_base,
                          public ::testing::WithParamInterface<const char*> {
protected:
    void TearDown() override
    {
        unsetenv("UCX_HCA_FABRIC");
        uct_test_base::TearDown();
    }
};

TEST_P(UcpNetOnlyAddress, HoldsHcaWhenItReachesOtherHosts)
{
    const bool reaches_hosts = !strcmp(GetParam(), "auto");
    ASSERT_EQ(0, setenv("UCX_HCA_FABRIC", GetParam(), 1));
    ucp_peer a, b;
    ASSERT_NO_FATAL_FAILURE(a.init({}, UCP_FEATURE_TAG));
    ASSERT_NO_FATAL_FAILURE(b.init({}, UCP_FEATURE_TAG));

    ucp_worker_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask    = UCP_WORKER_ATTR_FIELD_ADDRESS |
                         UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
    attr.address_flags = UCP_WORKER_ADDRESS_FLAG_NET_ONLY;
    ASSERT_EQ(UCS_OK, ucp_worker_query(a.worker, &attr));
    std::string net_addr((const char*)attr.address, attr.address_length);
    ucp_worker_release_address(a.worker, attr.address);

    ucp_ep_params_t ep_params;
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep_params.address    = (const ucp_address_t*)net_addr.data();
    ucs_status_t st      = ucp_ep_create(b.worker, &ep_params, &b.ep);
    if (!reaches_hosts) {
        EXPECT_EQ(UCS_ERR_UNREACHABLE, st)
                << "hca without a listener in a network-only address";
        if (st == UCS_OK) {
            b.close_ep();
        }
        return;
    }
    ASSERT_EQ(UCS_OK, st) << "no transport in the network-only address";
    std::string info = b.ep_info();
    EXPECT_NE(std::string::npos, info.find("hca/hca0")) << info;

    /* and it carries a message */
    char sbuf[64], rbuf[64] = {0};
    size_t got = 0;
    pat_fill(sbuf, sizeof(sbuf), 77);
    ucs_status_ptr_t rreq = ucp_tag_recv(a, rbuf, sizeof(rbuf), 5);
    ASSERT_FALSE(UCS_PTR_IS_ERR(rreq));
    ucs_status_ptr_t sreq = ucp_tag_send(b, sbuf, sizeof(sbuf), 5);
    deadline dl(TIMEOUT_SEC);
    while (UCS_PTR_IS_PTR(sreq) &&
           (ucp_request_check_status(sreq) == UCS_INPROGRESS) &&
           !dl.expired()) {
        a.progress();
        b.progress();
    }
    ASSERT_FALSE(UCS_PTR_IS_ERR(sreq));
    if (UCS_PTR_IS_PTR(sreq)) {
        EXPECT_EQ(UCS_OK, ucp_request_check_status(sreq));
        ucp_request_free(sreq);
    }
    while ((ucp_request_check_status(rreq) == UCS_INPROGRESS) &&
           !dl.expired()) {
        a.progress();
        b.progress();
    }
    ASSERT_EQ(UCS_OK, recv_wait(a, rreq, &got, 5));
    EXPECT_EQ(sizeof(sbuf), got);
    EXPECT_EQ(-1, pat_check(rbuf, sizeof(rbuf), 77));
    b.close_ep();
}

INSTANTIATE_TEST_SUITE_P(hca, UcpNetOnlyAddress,
                         ::testing::Values("auto", "shm"),
                         [](const ::testing::TestParamInfo<const char*> &i) {
                             return std::string(i.param);
                         });

} /* namespace */
