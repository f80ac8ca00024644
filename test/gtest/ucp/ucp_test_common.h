/*
 * ucp_test_common.h - UCP over the hca transport (UCX_TLS=hca,self, set
 * with ucp_config_modify) between this process and a forked peer: context,
 * worker, address exchange over the uct tests' pipes, request waits with
 * deadlines, and the peer's command loop.
 */
#ifndef HCA_GTEST_UCP_TEST_COMMON_H
#define HCA_GTEST_UCP_TEST_COMMON_H

#include "uct_test_common.h"

#include <ucp/api/ucp.h>

#include <setjmp.h>
#include <signal.h>

namespace hcat {

class ucp_peer {
public:
    ucp_peer() : ctx(nullptr), worker(nullptr), ep(nullptr) {}
    ~ucp_peer() { cleanup(); }
    ucp_peer(const ucp_peer&) = delete;
    ucp_peer &operator=(const ucp_peer&) = delete;

    /* UCX_TLS=hca,self plus `extra` (e.g. {"RNDV_SCHEME", "get_zcopy"}) */
    void init(const cfg_list &extra, uint64_t features)
    {
        ucp_config_t *cfg;
        ASSERT_EQ(UCS_OK, ucp_config_read(NULL, NULL, &cfg));
        cfg_list all = {{"TLS", "hca,self"}};
        all.insert(all.end(), extra.begin(), extra.end());
        for (auto &kv : all) {
            ucs_status_t st = ucp_config_modify(cfg, kv.first.c_str(),
                                                kv.second.c_str());
            if (st != UCS_OK) {
                ucp_config_release(cfg);
                FAIL() << "ucp config " << kv.first << "=" << kv.second
                       << ": " << st;
            }
        }
        ucp_params_t p;
        memset(&p, 0, sizeof(p));
        p.field_mask = UCP_PARAM_FIELD_FEATURES;
        p.features   = features;
        ucs_status_t st = ucp_init(&p, cfg, &ctx);
        ucp_config_release(cfg);
        ASSERT_EQ(UCS_OK, st) << "ucp_init with UCX_TLS=hca,self";

        ucp_worker_params_t wp;
        memset(&wp, 0, sizeof(wp));
        wp.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        wp.thread_mode = UCS_THREAD_MODE_SINGLE;
        ASSERT_EQ(UCS_OK, ucp_worker_create(ctx, &wp, &worker));
        ucp_address_t *a;
        size_t len;
        ASSERT_EQ(UCS_OK, ucp_worker_get_address(worker, &a, &len));
        address.assign((const char*)a, len);
        ucp_worker_release_address(worker, a);
    }

    void connect(const std::string &remote)
    {
        ucp_ep_params_t p;
        memset(&p, 0, sizeof(p));
        p.field_mask      = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        p.address         = (const ucp_address_t*)remote.data();
        ASSERT_EQ(UCS_OK, ucp_ep_create(worker, &p, &ep));
    }

    unsigned progress() { return ucp_worker_progress(worker); }

    /* completes a request (or immediate status); frees it */
    ucs_status_t wait(ucs_status_ptr_t req, double sec = TIMEOUT_SEC)
    {
        if (req == NULL) {
            return UCS_OK;
        }
        if (UCS_PTR_IS_ERR(req)) {
            return UCS_PTR_STATUS(req);
        }
        deadline dl(sec);
        ucs_status_t st;
        while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
            if (dl.expired()) {
                ucp_request_cancel(worker, req);
                /* let the cancel complete it, then release */
                deadline d2(2);
                while ((ucp_request_check_status(req) == UCS_INPROGRESS) &&
                       !d2.expired()) {
                    progress();
                }
                ucp_request_free(req);
                return UCS_ERR_TIMED_OUT;
            }
            progress();
        }
        ucp_request_free(req);
        return st;
    }

    ucs_status_t flush_ep(double sec = TIMEOUT_SEC)
    {
        ucp_request_param_t p;
        memset(&p, 0, sizeof(p));
        return wait(ucp_ep_flush_nbx(ep, &p), sec);
    }

    void close_ep()
    {
        if (ep == nullptr) {
            return;
        }
        ucp_request_param_t p;
        memset(&p, 0, sizeof(p));
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags        = UCP_EP_CLOSE_FLAG_FORCE;
        wait(ucp_ep_close_nbx(ep, &p), 5);
        ep = nullptr;
    }

    void cleanup()
    {
        close_ep();
        if (worker != nullptr) {
            ucp_worker_destroy(worker);
            worker = nullptr;
        }
        if (ctx != nullptr) {
            ucp_cleanup(ctx);
            ctx = nullptr;
        }
    }

    std::string ep_info()
    {
        return read_memstream([&](FILE *f) { ucp_ep_print_info(ep, f); });
    }

    ucp_context_h ctx;
    ucp_worker_h  worker;
    ucp_ep_h      ep;
    std::string   address;
};

/* Exchanges worker addresses with a peer over ch and connects; both sides
 * call it (the parent sends first). */
inline void ucp_exchange_and_connect(ucp_peer &p, channel &ch, bool first)
{
    std::string remote;
    if (first) {
        ASSERT_TRUE(ch.send(p.address));
        ASSERT_TRUE(ch.recv(&remote, 20000)) << "no peer worker address";
    } else {
        ASSERT_TRUE(ch.recv(&remote, 20000)) << "no peer worker address";
        ASSERT_TRUE(ch.send(p.address));
    }
    ASSERT_NO_FATAL_FAILURE(p.connect(remote));
}

/* Waits for a pipe message while progressing the worker */
inline bool ucp_recv_progress(ucp_peer &p, channel &ch, std::string *msg,
                              double sec = TIMEOUT_SEC)
{
    deadline dl(sec);
    while (!ch.readable(0)) {
        if (dl.expired()) {
            return false;
        }
        p.progress();
    }
    return ch.recv(msg, 10000);
}

/* What an ep error callback (ucp_err_handler_cb_t, arg = err_state*) saw */
struct err_state {
    int          calls  = 0;
    ucs_status_t status = UCS_OK;
};

inline void ep_err_cb(void *arg, ucp_ep_h, ucs_status_t status)
{
    err_state *s = (err_state*)arg;
    s->calls++;
    s->status = status;
}

inline ucs_status_ptr_t ucp_tag_send(ucp_peer &p, const void *buf, size_t len,
                                     ucp_tag_t tag)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    return ucp_tag_send_nbx(p.ep, buf, len, tag, &prm);
}

inline ucs_status_ptr_t ucp_tag_recv(ucp_peer &p, void *buf, size_t len,
                                     ucp_tag_t tag)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    /* always a request, which the tests read the received length from:
     * UCP 1.22 completes a receive in the call (NULL) when the message is
     * there already, e.g. a rendezvous whose get_zcopy hca executes in the
     * call (ucp/tag/tag_recv.c) */
    prm.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    return ucp_tag_recv_nbx(p.worker, buf, len, tag, (ucp_tag_t)-1, &prm);
}

namespace detail {
inline sigjmp_buf &watchdog_env()
{
    static sigjmp_buf env;
    return env;
}
inline void watchdog_handler(int)
{
    siglongjmp(watchdog_env(), 1);
}
} /* namespace detail */

/* Runs fn; if it does not return within sec seconds (SIGALRM), jumps out
 * of it and returns false.  For calls that block with no timeout of their
 * own (ucp_worker_wait, which restarts poll() on EINTR). */
inline bool run_with_watchdog(const std::function<void()> &fn, unsigned sec)
{
    struct sigaction sa, old;
    volatile bool ok = false;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = detail::watchdog_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, &old);
    if (sigsetjmp(detail::watchdog_env(), 1) == 0) {
        alarm(sec);
        fn();
        alarm(0);
        ok = true;
    }
    alarm(0);
    sigaction(SIGALRM, &old, NULL);
    return ok;
}

} /* namespace hcat */

#endif
