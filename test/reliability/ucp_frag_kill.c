/*
 * ucp_frag_kill.c - a sender dies between two fragments of an eager tag
 * message: does UCP complete the receive that matched the first one?
 *
 * usage: ucp_frag_kill
 *
 * Shows a UCP 1.13 behaviour that any transport exposes (run it with
 * UCX_TLS=hca,self or tcp,self; UCP 1.13 has no peer failure mode over
 * posix or cma, so it refuses the endpoints there): the receiver posts a
 * receive, the sender sends a 64 KiB message eagerly (UCX_RNDV_THRESH=inf
 * on its side, so several fragments) with a generic datatype whose pack
 * callback SIGKILLs the sender as UCP asks for the second fragment.  The
 * first fragment (tag and total length) has arrived, so the receive is
 * matched; the rest never comes.  Both sides hold an endpoint to the other
 * with UCP_ERR_HANDLING_MODE_PEER.  The receiver waits for its endpoint's
 * error callback (REL_FRAG_WAIT seconds, default 30: a transport that does
 * not see the death itself leaves it to UCP's keepalive), then 3 s more
 * for the receive, then cancels it and waits 1 s.
 *
 * UCP 1.13 keeps a receive that matched the first fragment of a
 * multi-fragment eager message in its worker's fragment hash (keyed by the
 * message id, not by endpoint); the purge of a failed endpoint
 * (ucp_ep_reqs_purge) walks only the endpoint's own send requests, and
 * ucp_request_cancel removes only receives still in the expected queue.
 * So the receive never completes, whatever the transport.
 *
 * Prints one line:
 *
 *   frag-kill: tls=T ep_error=STATUS after=MS ms receive=STATE
 *
 * MS: from the post of the receive to the error callback (negative: the
 * failure was seen before, while the first fragment waited unexpected).
 *
 * STATE: "completed:<status>" or "in-progress" (also after the cancel).
 * Exit status: 0 the receive completed, 1 it stayed in progress after the
 * failure was reported, 2 setup error or no failure reported.
 */
#include "rel_common.h"

#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>

const char *rel_prog = "ucp_frag_kill";

#define MSG_LEN  (64 * 1024)
#define TAG_HI   1ull
#define TAG_MSG  2ull

static ucp_context_h ctx;
static ucp_worker_h worker;
static ucp_ep_h ep;
static ucs_status_t ep_status = UCS_OK;
static uint64_t ep_error_ns;

static void ep_err_cb(void *arg, ucp_ep_h e, ucs_status_t st)
{
    (void)arg;
    (void)e;
    if (ep_status == UCS_OK) {
        ep_status   = st;
        ep_error_ns = rel_mono_ns();
    }
}

static void setup(bool sender)
{
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features   = UCP_FEATURE_TAG
    };
    ucp_worker_params_t wparams = {
        .field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE
    };
    ucp_config_t *config;
    ucs_status_t st;

    if ((st = ucp_config_read(NULL, NULL, &config)) != UCS_OK) {
        rel_die("ucp_config_read: %s", ucs_status_string(st));
    }
    /* the sender fragments the message instead of a rendezvous */
    if (sender && ((st = ucp_config_modify(config, "RNDV_THRESH", "inf")) !=
                   UCS_OK)) {
        rel_die("RNDV_THRESH: %s", ucs_status_string(st));
    }
    if ((st = ucp_init(&params, config, &ctx)) != UCS_OK ||
        (st = ucp_worker_create(ctx, &wparams, &worker)) != UCS_OK) {
        rel_die("ucp setup: %s", ucs_status_string(st));
    }
    ucp_config_release(config);
}

static void connect_to(const void *addr)
{
    ucp_ep_params_t p = {
        .field_mask  = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                       UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                       UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address     = addr,
        .err_mode    = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ep_err_cb}
    };
    ucs_status_t st = ucp_ep_create(worker, &p, &ep);

    if (st != UCS_OK) {
        rel_die("ucp_ep_create: %s", ucs_status_string(st));
    }
}

static void wait_req(ucs_status_ptr_t sp, const char *what)
{
    ucs_status_t st = UCS_PTR_STATUS(sp);

    if (UCS_PTR_IS_PTR(sp)) {
        while ((st = ucp_request_check_status(sp)) == UCS_INPROGRESS) {
            ucp_worker_progress(worker);
        }
        ucp_request_free(sp);
    }
    if (st != UCS_OK) {
        rel_die("%s: %s", what, ucs_status_string(st));
    }
}

/* Address exchange over pipes: length, then bytes. */
static void put_addr(int fd, const void *a, size_t len)
{
    if ((write(fd, &len, sizeof(len)) != sizeof(len)) ||
        (write(fd, a, len) != (ssize_t)len)) {
        rel_die("address write");
    }
}

static void *get_addr(int fd)
{
    size_t len;
    void *a;

    if (read(fd, &len, sizeof(len)) != sizeof(len) ||
        (a = malloc(len)) == NULL || read(fd, a, len) != (ssize_t)len) {
        rel_die("address read");
    }
    return a;
}

/* ------------------------------------------------------------ sender */

static void *dt_start_pack(void *context, const void *buffer, size_t count)
{
    (void)context;
    (void)count;
    return (void*)buffer;
}

static size_t dt_packed_size(void *state)
{
    (void)state;
    return MSG_LEN;
}

/* Dies when asked for anything past the first fragment. */
static size_t dt_pack(void *state, size_t offset, void *dest, size_t max)
{
    size_t len = (max < MSG_LEN - offset) ? max : MSG_LEN - offset;

    if (offset > 0) {
        kill(getpid(), SIGKILL);
    }
    memcpy(dest, (uint8_t*)state + offset, len);
    return len;
}

static void dt_finish(void *state)
{
    (void)state;
}

static int sender(int rfd, int wfd)
{
    ucp_generic_dt_ops_t ops = {
        .start_pack  = dt_start_pack,
        .packed_size = dt_packed_size,
        .pack        = dt_pack,
        .finish      = dt_finish
    };
    ucp_request_param_t plain = {.op_attr_mask = 0};
    ucp_request_param_t gp    = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE
    };
    static uint8_t msg[MSG_LEN];
    ucp_address_t *addr;
    size_t alen;
    uint64_t hi = 1;
    void *peer;

    setup(true);
    if (ucp_worker_get_address(worker, &addr, &alen) != UCS_OK) {
        rel_die("address");
    }
    put_addr(wfd, addr, alen);
    peer = get_addr(rfd);
    connect_to(peer);
    rel_fill(msg, MSG_LEN, 7, 0);
    /* connected both ways before the message */
    wait_req(ucp_tag_send_nbx(ep, &hi, sizeof(hi), TAG_HI, &plain), "hello");
    wait_req(ucp_ep_flush_nbx(ep, &plain), "flush");
    if (ucp_dt_create_generic(&ops, NULL, &gp.datatype) != UCS_OK) {
        rel_die("ucp_dt_create_generic");
    }
    wait_req(ucp_tag_send_nbx(ep, msg, 1, TAG_MSG, &gp), "message");
    rel_die("the message went out in one fragment");
    return 2;
}

/* ------------------------------------------------------------ receiver */

static ucs_status_t recv_status = UCS_INPROGRESS;

static void recv_cb(void *request, ucs_status_t st,
                    const ucp_tag_recv_info_t *info, void *user_data)
{
    (void)info;
    (void)user_data;
    recv_status = st;
    ucp_request_free(request);
}

static void progress_for(double seconds, bool until_error)
{
    uint64_t end = rel_mono_ns() + (uint64_t)(seconds * 1e9);

    while ((rel_mono_ns() < end) && (recv_status == UCS_INPROGRESS) &&
           (!until_error || (ep_status == UCS_OK))) {
        ucp_worker_progress(worker);
    }
}

static int receiver(int rfd, int wfd, pid_t child)
{
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv      = recv_cb
    };
    static uint8_t buf[MSG_LEN];
    const char *tls = getenv("UCX_TLS");
    const char *wait_s = getenv("REL_FRAG_WAIT");
    ucp_address_t *addr;
    ucs_status_ptr_t sp;
    uint64_t hi, t0;
    size_t alen;
    void *peer;
    int wst;

    setup(false);
    if (ucp_worker_get_address(worker, &addr, &alen) != UCS_OK) {
        rel_die("address");
    }
    put_addr(wfd, addr, alen);
    peer = get_addr(rfd);
    connect_to(peer);
    wait_req(ucp_tag_recv_nbx(worker, &hi, sizeof(hi), TAG_HI, ~0ull,
                              &(ucp_request_param_t){.op_attr_mask = 0}),
             "hello");
    sp = ucp_tag_recv_nbx(worker, buf, MSG_LEN, TAG_MSG, ~0ull, &rp);
    if (UCS_PTR_IS_ERR(sp)) {
        rel_die("ucp_tag_recv_nbx: %s", ucs_status_string(UCS_PTR_STATUS(sp)));
    }
    /* the sender is dead once waitpid returns; keep progressing meanwhile
     * (the error may be reported before) */
    t0 = rel_mono_ns();
    while (waitpid(child, &wst, WNOHANG) == 0) {
        ucp_worker_progress(worker);
    }
    if (!WIFSIGNALED(wst) || (WTERMSIG(wst) != SIGKILL)) {
        rel_die("the sender did not die in its pack callback");
    }
    progress_for(wait_s ? atof(wait_s) : 30.0, true);
    if (ep_status == UCS_OK) {
        printf("frag-kill: tls=%s ep_error=none receive=%s\n",
               tls ? tls : "default",
               (recv_status == UCS_INPROGRESS) ? "in-progress" :
                                                 ucs_status_string(recv_status));
        return 2;
    }
    progress_for(3.0, false);
    if (recv_status == UCS_INPROGRESS) {
        ucp_request_cancel(worker, sp);
        progress_for(1.0, false);
    }
    printf("frag-kill: tls=%s ep_error=%s after=%lld ms receive=%s%s\n",
           tls ? tls : "default", ucs_status_string(ep_status),
           ((long long)ep_error_ns - (long long)t0) / 1000000,
           (recv_status == UCS_INPROGRESS) ? "in-progress" : "completed:",
           (recv_status == UCS_INPROGRESS) ? "" :
                                             ucs_status_string(recv_status));
    /* the receive is UCP's for good: no ep close, worker destroy or
     * cleanup with it outstanding */
    return (recv_status == UCS_INPROGRESS) ? 1 : 0;
}

int main(void)
{
    int to_child[2], to_parent[2];
    pid_t pid;

    if ((pipe(to_child) != 0) || (pipe(to_parent) != 0)) {
        rel_die("pipe");
    }
    pid = fork();
    if (pid < 0) {
        rel_die("fork");
    }
    if (pid == 0) {
        return sender(to_child[0], to_parent[1]);
    }
    return receiver(to_parent[0], to_child[1], pid);
}
