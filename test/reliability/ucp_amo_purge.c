/*
 * ucp_amo_purge.c - fetching atomics queued in UCP when their endpoint
 * fails: does UCP complete them?
 *
 * usage: ucp_amo_purge
 *
 * Shows a UCP 1.13 behaviour that any transport exposes (run it with
 * UCX_TLS=hca,self or tcp,self).  A target process maps memory, hands its
 * worker address and rkey over, and never progresses its worker (as a
 * peer killed at start-up, before it answered the wireup).  The requester
 * connects (UCP_ERR_HANDLING_MODE_PEER, with an error callback), sends one
 * rendezvous tag message (which needs the target's endpoint id, so UCP
 * puts the wireup proxy in front of the lane and waits for the target's
 * reply), posts NAMO fetch-adds, which UCP queues behind it, and SIGKILLs
 * the target.  Once the error callback came it force-closes the endpoint
 * and waits 3 s for every request.
 *
 * UCP 1.13 sets a fetching atomic's completion counter to 1 when it
 * creates the request (ucp_amo_init_fetch), and the transport's completion
 * brings it to 0.  The purge of a failed endpoint's pending queue
 * (ucp_ep_err_pending_purge -> ucp_request_send_state_ff) marks the request
 * and calls the completion only if that counter is 0: for an atomic that
 * never reached the transport it is 1, so the request never completes.
 *
 * Prints one line:
 *
 *   amo-purge: tls=T ep_error=STATUS send=S amo_done=D/N amo_flags=F
 *
 * S: the rendezvous send's status ("in-progress" if none); D of the N
 * fetch-adds completed (any status); F: ucp_request_query()'s info of the
 * first incomplete one (flags 0x20, UCP_REQUEST_FLAG_SYNC_REMOTE_COMPLETED,
 * is the purge's mark).  Exit status: 0 all completed, 1 some stayed
 * incomplete, 2 setup error or no failure reported.
 */
#include "rel_common.h"

#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>

const char *rel_prog = "ucp_amo_purge";

#define NAMO     3
#define MSG_LEN  (1024 * 1024)    /* a rendezvous with any transport */

static ucp_context_h ctx;
static ucp_worker_h worker;
static ucs_status_t ep_status = UCS_OK;

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)arg;
    (void)ep;
    if (ep_status == UCS_OK) {
        ep_status = st;
    }
}

static void setup(void)
{
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features   = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AMO64
    };
    ucp_worker_params_t wparams = {
        .field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE
    };
    ucp_config_t *config;
    ucs_status_t st;

    if ((st = ucp_config_read(NULL, NULL, &config)) != UCS_OK ||
        (st = ucp_init(&params, config, &ctx)) != UCS_OK ||
        (st = ucp_worker_create(ctx, &wparams, &worker)) != UCS_OK) {
        rel_die("ucp setup: %s", ucs_status_string(st));
    }
    ucp_config_release(config);
}

/* Blob exchange over a pipe: length, then bytes. */
static void put_blob(int fd, const void *a, size_t len)
{
    if ((write(fd, &len, sizeof(len)) != sizeof(len)) ||
        (write(fd, a, len) != (ssize_t)len)) {
        rel_die("pipe write");
    }
}

static void *get_blob(int fd)
{
    size_t len;
    void *a;

    if (read(fd, &len, sizeof(len)) != sizeof(len) ||
        (a = malloc(len)) == NULL || read(fd, a, len) != (ssize_t)len) {
        rel_die("pipe read");
    }
    return a;
}

/* Hands over its address, rkey and memory address, then never
 * progresses: it waits to be killed. */
static int target(int wfd)
{
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .length     = 4096,
        .flags      = UCP_MEM_MAP_ALLOCATE
    };
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
    ucp_address_t *addr;
    size_t alen, rlen;
    void *rkey;
    ucp_mem_h memh;
    uint64_t raddr;

    setup();
    if ((ucp_mem_map(ctx, &mp, &memh) != UCS_OK) ||
        (ucp_mem_query(memh, &attr) != UCS_OK) ||
        (ucp_rkey_pack(ctx, memh, &rkey, &rlen) != UCS_OK) ||
        (ucp_worker_get_address(worker, &addr, &alen) != UCS_OK)) {
        rel_die("target setup");
    }
    raddr = (uintptr_t)attr.address;
    put_blob(wfd, addr, alen);
    put_blob(wfd, rkey, rlen);
    put_blob(wfd, &raddr, sizeof(raddr));
    for (;;) {
        pause();
    }
}

static void send_cb(void *request, ucs_status_t st, void *user_data)
{
    *(ucs_status_t*)user_data = st;
    ucp_request_free(request);
}

static void progress_for(double seconds)
{
    uint64_t end = rel_mono_ns() + (uint64_t)(seconds * 1e9);

    while (rel_mono_ns() < end) {
        ucp_worker_progress(worker);
    }
}

static int requester(int rfd, pid_t child)
{
    ucp_ep_params_t ep_params = {
        .field_mask  = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                       UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                       UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .err_mode    = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ep_err_cb}
    };
    ucp_request_param_t close_p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags        = UCP_EP_CLOSE_FLAG_FORCE
    };
    ucs_status_t send_st = UCS_INPROGRESS, amo_st[NAMO];
    ucs_status_ptr_t amo_req[NAMO], sp;
    uint64_t one = 1, reply[NAMO], raddr;
    const char *tls = getenv("UCX_TLS");
    char info[256] = "-";
    void *peer, *rkey_buf, *msg;
    ucp_rkey_h rkey;
    ucp_ep_h ep;
    int done = 0;

    setup();
    peer     = get_blob(rfd);
    rkey_buf = get_blob(rfd);
    memcpy(&raddr, get_blob(rfd), sizeof(raddr));
    ep_params.address = peer;
    if ((ucp_ep_create(worker, &ep_params, &ep) != UCS_OK) ||
        (ucp_ep_rkey_unpack(ep, rkey_buf, &rkey) != UCS_OK)) {
        rel_die("connect");
    }
    msg = calloc(1, MSG_LEN);
    sp  = ucp_tag_send_nbx(ep, msg, MSG_LEN, 1,
                           &(ucp_request_param_t){
                               .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send      = send_cb,
                               .user_data    = &send_st});
    if (!UCS_PTR_IS_PTR(sp)) {
        send_st = UCS_PTR_STATUS(sp);
    }
    for (int i = 0; i < NAMO; ++i) {
        ucp_request_param_t p = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                            UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_DATATYPE |
                            UCP_OP_ATTR_FIELD_REPLY_BUFFER,
            .cb.send      = send_cb,
            .user_data    = &amo_st[i],
            .datatype     = ucp_dt_make_contig(8),
            .reply_buffer = &reply[i]
        };

        amo_st[i]  = UCS_INPROGRESS;
        amo_req[i] = ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_ADD, &one, 1, raddr,
                                       rkey, &p);
        if (!UCS_PTR_IS_PTR(amo_req[i])) {
            amo_st[i] = UCS_PTR_STATUS(amo_req[i]);
        }
    }
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    for (uint64_t end = rel_mono_ns() + 30000000000ull;
         (ep_status == UCS_OK) && (rel_mono_ns() < end);) {
        ucp_worker_progress(worker);
    }
    if (ep_status == UCS_OK) {
        printf("amo-purge: tls=%s ep_error=none\n", tls ? tls : "default");
        return 2;
    }
    sp = ucp_ep_close_nbx(ep, &close_p);
    if (UCS_PTR_IS_PTR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS) {
            ucp_worker_progress(worker);
        }
        ucp_request_free(sp);
    }
    progress_for(3.0);
    for (int i = 0; i < NAMO; ++i) {
        if (amo_st[i] != UCS_INPROGRESS) {
            ++done;
        } else if (!strcmp(info, "-")) {
            ucp_request_attr_t a = {
                .field_mask        = UCP_REQUEST_ATTR_FIELD_INFO_STRING |
                                     UCP_REQUEST_ATTR_FIELD_INFO_STRING_SIZE,
                .debug_string      = info,
                .debug_string_size = sizeof(info)
            };

            ucp_request_query(amo_req[i], &a);
        }
    }
    printf("amo-purge: tls=%s ep_error=%s send=%s amo_done=%d/%d "
           "amo_flags=%s\n", tls ? tls : "default",
           ucs_status_string(ep_status),
           (send_st == UCS_INPROGRESS) ? "in-progress" :
                                         ucs_status_string(send_st),
           done, NAMO, info);
    /* incomplete requests are UCP's for good: no worker destroy */
    return (done == NAMO) ? 0 : 1;
}

int main(void)
{
    int fds[2];
    pid_t pid;

    if (pipe(fds) != 0) {
        rel_die("pipe");
    }
    pid = fork();
    if (pid < 0) {
        rel_die("fork");
    }
    if (pid == 0) {
        close(fds[0]);
        return target(fds[1]);
    }
    close(fds[1]);
    return requester(fds[0], pid);
}
