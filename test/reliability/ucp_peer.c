/*
 * ucp_peer.c - one side of a UCP connection; the campaign kills one side.
 *
 * usage: ucp_peer ROLE WORKLOAD MEM DIR [OPS]
 *
 *   ROLE      target | requester
 *   WORKLOAD  put | get | amo | am | tag | mixed (the requester's operations
 *             on the target; the target serves them and checks the data)
 *   MEM       heap   (aligned_alloc, registered with ucp_mem_map) |
 *             mapped (allocated by ucp_mem_map, UCP_MEM_MAP_ALLOCATE);
 *             both sides' buffers, sources and destinations included
 *   DIR       run directory shared with the peer and the script
 *   OPS       0 (default): run until a failure is seen.  N: the requester
 *             ends cleanly after N operations and tells the target (used to
 *             test that a pair works at all)
 *
 * Both sides create an endpoint to the other (UCP_ERR_HANDLING_MODE_PEER
 * with an error callback) from worker addresses exchanged as files in DIR.
 * Neither knows which side will be killed: each runs until it sees the
 * failure (error callback or a failed request), then ends the way an
 * application must: force-close the endpoint, complete or cancel every
 * request, check the data it holds, ucp_mem_unmap, destroy the worker and
 * the context.  It writes "traffic" to DIR/ROLE.stage when it starts
 * its operations.  Before the cleanup steps it writes what it saw to
 * DIR/ROLE.outcome (failed=0|1 first_error=... detect_ns=T ops=N
 * outstanding=N), and
 * before each step the step's name to DIR/ROLE.stage, so that a hang is
 * attributed to a step.  At the end it writes DIR/ROLE.result, one line:
 *
 *   status=S detect_ns=T ops=N errors=E corrupt=C abandoned=A
 *   first_error=WHAT
 *
 * T is CLOCK_REALTIME at the first failure seen; the script subtracts the
 * time of its kill.  A passive target sees a dead requester through hca's
 * sweep of its peers (100 ms), or UCP's keepalive (UCX_KEEPALIVE_INTERVAL,
 * REL_KEEPALIVE of the script).
 *
 * Data checks (corruptions):
 *   put    the target's put area: every word is zero or was written there
 *          by some put (torn puts of a killed requester are legal)
 *   get    every successful get returns the target's pattern
 *   amo    every fetched value is below the number of adds posted and
 *          unique; the words around the counter stay zero
 *   am     each payload has the length and pattern of its sequence number
 *          (from the header), no sequence number twice
 *   tag    receives match the requester's messages in send order, each
 *          with its length and pattern
 *
 * A fetching atomic that UCP 1.13 held in a pending queue (behind the
 * wireup of an endpoint whose peer died before it answered, or behind a
 * full send queue) when the endpoint failed never completes, over any
 * transport (ucp_amo_purge.c shows it with tcp): the purge of the failed
 * endpoint marks it (UCP_REQUEST_FLAG_SYNC_REMOTE_COMPLETED, in the flags
 * ucp_request_query reports) but calls its completion only if its
 * completion counter is 0, and ucp_amo_init_fetch starts that counter at
 * 1 for the transport's completion that never comes.  An application can
 * neither complete nor cancel it; it must leave it to UCP.  So after the
 * force close, a fetch-add still incomplete 1 s later that carries that
 * mark is given up (counted in abandoned=, never freed); any other
 * incomplete request is waited for, and the script counts a hang.
 *
 * Exit status: 0 a failure was seen and everything cleaned up (or, with
 * OPS, a clean end), 3 corrupted data, 4 no failure seen within
 * REL_RUN_LIMIT seconds (default 12), 5 the peer never appeared (killed at
 * start-up), 6 an error with OPS (the pair does not work), 2 setup error.
 */
#include "rel_common.h"

#include <stdbool.h>
#include <ucp/api/ucp.h>

const char *rel_prog = "ucp_peer";

enum { W_PUT, W_GET, W_AMO, W_AM, W_TAG, W_MIXED, W_LAST };
static const char *const wl_names[] = {"put", "get", "amo", "am", "tag",
                                       "mixed"};

#define DEPTH      8                  /* requester: operations in flight */
#define MSG_MAX    (256 * 1024)
#define PUT_SLOTS  8
#define PUT_SLOT   (128 * 1024)
#define GET_LEN    (1024 * 1024)
#define NRECV      4                  /* target: tag receives posted */
/* the target's region */
#define T_PUT      0
#define T_GET      (T_PUT + PUT_SLOTS * PUT_SLOT)
#define T_AMO      (T_GET + GET_LEN)
#define T_AMO_LEN  4096
#define T_RECV     (T_AMO + T_AMO_LEN)
#define T_LEN      (T_RECV + NRECV * MSG_MAX)
/* the requester's region: one message buffer per operation in flight */
#define R_LEN      (DEPTH * MSG_MAX)
#define GET_TAG    0xabcdefull
#define AM_ID      7
#define TAG_DONE   (1ull << 63)       /* the requester ends (OPS mode) */
#define SEEN_BITS  (1u << 26)         /* amo values / am sequences tracked */

typedef struct op {
    int      type;
    bool     busy;
    uint64_t seq;
    uint64_t offset;   /* get: byte offset in the get area */
    size_t   len;
    uint64_t operand;  /* amo */
    uint64_t reply;    /* amo: fetched value */
    void    *req;      /* UCP's request while in flight, or NULL */
} op_t;

typedef struct recv_slot {
    void     *req;     /* NULL once completed */
    bool      done;
    ucs_status_t status;
    ucp_tag_t tag;
    size_t    len;
    void     *buf;
} recv_slot_t;

static struct {
    const char   *role, *dir;
    bool          is_target;
    int           workload;
    bool          mapped;
    uint64_t      ops_limit;
    ucp_context_h ctx;
    ucp_worker_h  worker;
    ucp_address_t *addr;
    size_t        addr_len;
    ucp_ep_h      ep;
    ucp_mem_h     memh;
    uint8_t      *mem;
    size_t        mem_len;
    ucp_rkey_h    rkey;
    uint64_t      raddr;
    /* outcome */
    bool          failed, done;
    uint64_t      detect_ns;
    char          first_error[160];
    uint64_t      ops, errors, corrupt, abandoned;
    /* requester */
    op_t          op[DEPTH];
    int           outstanding;
    uint64_t      posted, put_seq, get_seq, amo_seq, am_seq, tag_seq;
    /* target */
    recv_slot_t   recv[NRECV], done_recv;
    uint64_t      done_buf;
    unsigned      recv_head;
    uint64_t      tag_expect;
    int           am_pending;
    uint8_t      *seen;      /* amo values (requester), am seqs (target) */
} g;

static size_t put_len(uint64_t seq)
{
    return (size_t)8 << (rel_hash(seq) % 15);           /* 8 B .. 128 KiB */
}

static size_t msg_len(uint64_t seq)
{
    return (size_t)8 << (rel_hash(seq ^ 0x1234) % 16);  /* 8 B .. 256 KiB */
}

static void stage(const char *name)
{
    rel_put_text(g.dir, g.is_target ? "target.stage" : "requester.stage",
                 "%s\n", name);
}

static void corrupt(const char *fmt, ...)
{
    va_list ap;

    if (g.corrupt++ < 5) {
        fprintf(stderr, "%s %s: CORRUPTION: ", rel_prog, g.role);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fprintf(stderr, "\n");
    }
}

/* Test-and-set in the seen bitmap; values past it are not tracked. */
static bool seen_before(uint64_t v)
{
    bool was;

    if (v >= SEEN_BITS) {
        return false;
    }
    was = g.seen[v / 8] & (1u << (v % 8));
    g.seen[v / 8] |= (uint8_t)(1u << (v % 8));
    return was;
}

static void fail(ucs_status_t status, const char *what)
{
    if (!g.failed) {
        g.failed    = true;
        g.detect_ns = rel_now_ns();
        snprintf(g.first_error, sizeof(g.first_error), "%s:%s", what,
                 ucs_status_string(status));
    }
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    fail(status, "ep_error_callback");
}

static void progress(void)
{
    ucp_worker_progress(g.worker);
}

static void wait_request(ucs_status_ptr_t sp)
{
    if (UCS_PTR_IS_PTR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS) {
            progress();
        }
        ucp_request_free(sp);
    }
}

/* ------------------------------------------------------------ setup */

static void ucp_setup(void)
{
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features   = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AMO64 |
                      UCP_FEATURE_AM
    };
    ucp_worker_params_t wparams = {
        .field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE
    };
    ucp_config_t *config;
    ucs_status_t st;

    if ((st = ucp_config_read(NULL, NULL, &config)) != UCS_OK ||
        (st = ucp_init(&params, config, &g.ctx)) != UCS_OK) {
        rel_die("ucp_init: %s", ucs_status_string(st));
    }
    ucp_config_release(config);
    if ((st = ucp_worker_create(g.ctx, &wparams, &g.worker)) != UCS_OK ||
        (st = ucp_worker_get_address(g.worker, &g.addr, &g.addr_len)) !=
                UCS_OK) {
        rel_die("ucp worker: %s", ucs_status_string(st));
    }
}

static void mem_setup(size_t len)
{
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                      UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .length     = len
    };
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
    ucs_status_t st;

    if (g.mapped) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        mp.flags       = UCP_MEM_MAP_ALLOCATE;
    } else {
        mp.address = aligned_alloc(4096, len);
        if (mp.address == NULL) {
            rel_die("out of memory");
        }
    }
    st = ucp_mem_map(g.ctx, &mp, &g.memh);
    if (st != UCS_OK) {
        rel_die("ucp_mem_map: %s", ucs_status_string(st));
    }
    if ((st = ucp_mem_query(g.memh, &attr)) != UCS_OK) {
        rel_die("ucp_mem_query: %s", ucs_status_string(st));
    }
    g.mem     = attr.address;
    g.mem_len = len;
    memset(g.mem, 0, len);
}

static bool ep_setup(const void *peer_addr)
{
    ucp_ep_params_t ep_params = {
        .field_mask      = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                           UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address         = peer_addr,
        .err_mode        = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler     = {.cb = ep_err_cb, .arg = NULL}
    };
    ucs_status_t st = ucp_ep_create(g.worker, &ep_params, &g.ep);

    if (st != UCS_OK) {
        g.ep = NULL;
        fail(st, "ucp_ep_create");
        return false;
    }
    return true;
}

/* ------------------------------------------------------------ requester */

static void op_done(op_t *op, ucs_status_t st)
{
    uint8_t *buf = g.mem + (size_t)(op - g.op) * MSG_MAX;
    size_t bad;

    op->busy = false;
    --g.outstanding;
    if (st != UCS_OK) {
        ++g.errors;
        fail(st, wl_names[op->type]);
        return;
    }
    ++g.ops;
    if (op->type == W_GET) {
        bad = rel_check(buf, op->len, GET_TAG, op->offset / 8);
        if (bad != 0) {
            corrupt("get of %zu bytes at %#llx: %zu bad words", op->len,
                    (unsigned long long)op->offset, bad);
        }
    } else if (op->type == W_AMO) {
        if ((op->reply >= g.amo_seq) || seen_before(op->reply)) {
            corrupt("fetch-add #%llu returned %llu (%llu adds posted)",
                    (unsigned long long)op->seq,
                    (unsigned long long)op->reply,
                    (unsigned long long)g.amo_seq);
        }
    }
}

static void send_cb(void *request, ucs_status_t st, void *user_data)
{
    ((op_t*)user_data)->req = NULL;
    op_done(user_data, st);
    ucp_request_free(request);
}

static int pick_type(void)
{
    return (g.workload == W_MIXED) ? (int)(rel_hash(g.posted) % W_MIXED) :
                                     g.workload;
}

static void post_op(void)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send      = send_cb
    };
    ucs_status_ptr_t sp = NULL;
    op_t *op            = NULL;
    uint8_t *buf;
    uint64_t h;

    for (int i = 0; i < DEPTH; ++i) {
        if (!g.op[i].busy) {
            op = &g.op[i];
            break;
        }
    }
    buf         = g.mem + (size_t)(op - g.op) * MSG_MAX;
    op->busy    = true;
    op->type    = pick_type();
    p.user_data = op;
    ++g.outstanding;
    ++g.posted;
    switch (op->type) {
    case W_PUT:
        op->seq = g.put_seq++;
        op->len = put_len(op->seq);
        rel_fill(buf, op->len, op->seq, 0);
        sp = ucp_put_nbx(g.ep, buf, op->len,
                         g.raddr + T_PUT + (op->seq % PUT_SLOTS) * PUT_SLOT,
                         g.rkey, &p);
        break;
    case W_GET:
        h          = rel_hash(g.get_seq++ ^ 0x9e3779b9ull);
        op->len    = (size_t)8 << (h % 15);
        op->offset = ((h >> 8) % ((GET_LEN - op->len) / 8 + 1)) * 8;
        memset(buf, 0, op->len);
        sp = ucp_get_nbx(g.ep, buf, op->len, g.raddr + T_GET + op->offset,
                         g.rkey, &p);
        break;
    case W_AMO:
        op->seq     = g.amo_seq++;
        op->operand = 1;
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE |
                          UCP_OP_ATTR_FIELD_REPLY_BUFFER;
        p.datatype      = ucp_dt_make_contig(8);
        p.reply_buffer  = &op->reply;
        sp = ucp_atomic_op_nbx(g.ep, UCP_ATOMIC_OP_ADD, &op->operand, 1,
                               g.raddr + T_AMO, g.rkey, &p);
        break;
    case W_AM:
        op->seq = g.am_seq++;
        op->len = msg_len(op->seq);
        rel_fill(buf, op->len, op->seq, 0);
        sp = ucp_am_send_nbx(g.ep, AM_ID, &op->seq, sizeof(op->seq), buf,
                             op->len, &p);
        break;
    case W_TAG:
        op->seq = g.tag_seq++;
        op->len = msg_len(op->seq);
        rel_fill(buf, op->len, op->seq, 0);
        sp = ucp_tag_send_nbx(g.ep, buf, op->len, op->seq, &p);
        break;
    }
    op->req = UCS_PTR_IS_PTR(sp) ? sp : NULL;
    if (sp == NULL) {
        op_done(op, UCS_OK);
    } else if (UCS_PTR_IS_ERR(sp)) {
        op_done(op, UCS_PTR_STATUS(sp));
    }
}

/* OPS mode: everything placed at the target, then DONE. */
static void requester_end(void)
{
    ucp_request_param_t p = {.op_attr_mask = 0};
    uint64_t done = 0;
    ucs_status_ptr_t sp;

    sp = ucp_ep_flush_nbx(g.ep, &p);
    if (UCS_PTR_IS_ERR(sp)) {
        fail(UCS_PTR_STATUS(sp), "flush");
        return;
    }
    wait_request(sp);
    sp = ucp_tag_send_nbx(g.ep, &done, sizeof(done), TAG_DONE, &p);
    if (UCS_PTR_IS_ERR(sp)) {
        fail(UCS_PTR_STATUS(sp), "send DONE");
        return;
    }
    wait_request(sp);
    g.done = true;
}

static void requester_run(uint64_t deadline)
{
    bool ready = false;
    void *tinfo;
    uint64_t raddr;
    uint32_t alen, rlen;
    ucs_status_t st;
    ssize_t n;

    mem_setup(R_LEN);
    rel_put_file(g.dir, "requester.addr", g.addr, g.addr_len);
    n = rel_get_file(g.dir, "target.addr", 5000, &tinfo);
    if (n < 0) {
        return;  /* no peer */
    }
    memcpy(&raddr, tinfo, 8);
    memcpy(&alen, (char*)tinfo + 8, 4);
    memcpy(&rlen, (char*)tinfo + 12, 4);
    if ((size_t)n != 16u + alen + rlen) {
        rel_die("bad target.addr (%zd bytes)", n);
    }
    g.raddr = raddr;
    if (!ep_setup((char*)tinfo + 16)) {
        free(tinfo);
        return;
    }
    st = ucp_ep_rkey_unpack(g.ep, (char*)tinfo + 16 + alen, &g.rkey);
    free(tinfo);
    if (st != UCS_OK) {
        fail(st, "ucp_ep_rkey_unpack");
        return;
    }
    stage("traffic");
    while (!g.failed && (rel_mono_ns() < deadline)) {
        /* at most DEPTH posts between progress calls: operations that
         * complete at once would otherwise never let us out */
        for (int i = 0; (i < DEPTH) && (g.outstanding < DEPTH) &&
                        !g.failed &&
                        ((g.ops_limit == 0) || (g.posted < g.ops_limit));
             ++i) {
            post_op();
        }
        progress();
        if (!ready && (g.ops > 0)) {
            rel_put_text(g.dir, "requester.ready", "1\n");
            ready = true;
        }
        if ((g.ops_limit != 0) && (g.posted >= g.ops_limit) &&
            (g.outstanding == 0)) {
            if (!g.failed) {
                requester_end();
            }
            break;
        }
    }
}

/* ------------------------------------------------------------ target */

static void recv_cb(void *request, ucs_status_t st,
                    const ucp_tag_recv_info_t *info, void *user_data)
{
    recv_slot_t *r = user_data;

    r->status = st;
    if (st == UCS_OK) {
        r->tag = info->sender_tag;
        r->len = info->length;
    }
    r->done = true;
    r->req  = NULL;
    ucp_request_free(request);
}

static void post_recv(recv_slot_t *r, size_t len, ucp_tag_t tag,
                      ucp_tag_t mask)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv      = recv_cb,
        .user_data    = r
    };
    ucs_status_ptr_t sp;

    r->done = false;
    sp      = ucp_tag_recv_nbx(g.worker, r->buf, len, tag, mask, &p);
    if (UCS_PTR_IS_ERR(sp)) {
        r->done   = true;
        r->status = UCS_PTR_STATUS(sp);
        r->req    = NULL;
    } else if (!r->done) {
        r->req = sp;
    }
}

/* Receives are matched in the order they were posted, and the requester's
 * messages in the order it sent them: the k-th receive holds message k. */
static void target_check_recvs(void)
{
    recv_slot_t *r;

    while ((r = &g.recv[g.recv_head % NRECV])->done && !g.failed) {
        if (r->status != UCS_OK) {
            fail(r->status, "tag receive");
            return;
        }
        ++g.ops;
        if (r->tag != g.tag_expect) {
            corrupt("tag receive #%llu got message %llu",
                    (unsigned long long)g.tag_expect,
                    (unsigned long long)r->tag);
        } else if (r->len != msg_len(r->tag)) {
            corrupt("tag message %llu: %zu bytes, sent %zu",
                    (unsigned long long)r->tag, r->len, msg_len(r->tag));
        } else if (rel_check(r->buf, r->len, r->tag, 0) != 0) {
            corrupt("tag message %llu: wrong data",
                    (unsigned long long)r->tag);
        }
        g.tag_expect = r->tag + 1;
        post_recv(r, MSG_MAX, 0, TAG_DONE);
        ++g.recv_head;
    }
}

static void am_check(uint64_t seq, const void *data, size_t len)
{
    ++g.ops;
    if (len != msg_len(seq)) {
        corrupt("am %llu: %zu bytes, sent %zu", (unsigned long long)seq,
                len, msg_len(seq));
    } else if (rel_check(data, len, seq, 0) != 0) {
        corrupt("am %llu: wrong data", (unsigned long long)seq);
    }
}

typedef struct am_rx {
    uint64_t seq;
    size_t   len;
    uint8_t  data[];
} am_rx_t;

static void am_data_cb(void *request, ucs_status_t st, size_t length,
                       void *user_data)
{
    am_rx_t *rx = user_data;

    (void)length;
    --g.am_pending;
    if (st == UCS_OK) {
        am_check(rx->seq, rx->data, rx->len);
    } else {
        fail(st, "am rendezvous data");
    }
    free(rx);
    ucp_request_free(request);
}

static ucs_status_t am_cb(void *arg, const void *header, size_t header_len,
                          void *data, size_t len,
                          const ucp_am_recv_param_t *param)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv_am   = am_data_cb
    };
    ucs_status_ptr_t sp;
    uint64_t seq;
    am_rx_t *rx;

    (void)arg;
    if (header_len != sizeof(seq)) {
        corrupt("am header of %zu bytes", header_len);
        return UCS_OK;
    }
    memcpy(&seq, header, sizeof(seq));
    if (seen_before(seq)) {
        corrupt("am %llu received twice", (unsigned long long)seq);
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        am_check(seq, data, len);
        return UCS_OK;
    }
    rx = malloc(sizeof(*rx) + len);
    if (rx == NULL) {
        rel_die("out of memory");
    }
    rx->seq     = seq;
    rx->len     = len;
    p.user_data = rx;
    ++g.am_pending;
    sp = ucp_am_recv_data_nbx(g.worker, data, rx->data, len, &p);
    if (UCS_PTR_IS_ERR(sp)) {
        --g.am_pending;
        fail(UCS_PTR_STATUS(sp), "ucp_am_recv_data_nbx");
        free(rx);
    }
    return UCS_OK;
}

/* The data the requester placed in our memory (see the header comment). */
static void target_check_memory(void)
{
    const uint64_t *w;
    int64_t t;

    for (uint64_t s = 0; s < PUT_SLOTS; ++s) {
        w = (const uint64_t*)(g.mem + T_PUT + s * PUT_SLOT);
        for (uint64_t k = 0; k < PUT_SLOT / 8; ++k) {
            if (w[k] == 0) {
                continue;
            }
            t = rel_word_tag(w[k], k);
            if ((t < 0) || ((uint64_t)t % PUT_SLOTS != s) ||
                (k >= put_len((uint64_t)t) / 8)) {
                corrupt("put slot %llu word %llu: %#llx",
                        (unsigned long long)s, (unsigned long long)k,
                        (unsigned long long)w[k]);
            }
        }
    }
    if (rel_check(g.mem + T_GET, GET_LEN, GET_TAG, 0) != 0) {
        corrupt("the get area (never written) changed");
    }
    w = (const uint64_t*)(g.mem + T_AMO);
    for (size_t k = 1; k < T_AMO_LEN / 8; ++k) {
        if (w[k] != 0) {
            corrupt("amo area word %zu: %#llx", k,
                    (unsigned long long)w[k]);
        }
    }
}

static void target_run(uint64_t deadline)
{
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                      UCP_AM_HANDLER_PARAM_FIELD_CB,
        .id         = AM_ID,
        .cb         = am_cb
    };
    size_t rkey_len, info_len;
    void *rkey_buf, *peer;
    uint32_t alen;
    uint8_t *info;
    ucs_status_t st;

    mem_setup(T_LEN);
    rel_fill(g.mem + T_GET, GET_LEN, GET_TAG, 0);
    if ((st = ucp_worker_set_am_recv_handler(g.worker, &ap)) != UCS_OK ||
        (st = ucp_rkey_pack(g.ctx, g.memh, &rkey_buf, &rkey_len)) !=
                UCS_OK) {
        rel_die("target setup: %s", ucs_status_string(st));
    }
    /* raddr, address length, rkey length, address, rkey */
    info_len = 16 + g.addr_len + rkey_len;
    info     = malloc(info_len);
    if (info == NULL) {
        rel_die("out of memory");
    }
    alen     = (uint32_t)g.addr_len;
    memcpy(info, &(uint64_t){(uintptr_t)g.mem}, 8);
    memcpy(info + 8, &alen, 4);
    memcpy(info + 12, &(uint32_t){(uint32_t)rkey_len}, 4);
    memcpy(info + 16, g.addr, g.addr_len);
    memcpy(info + 16 + g.addr_len, rkey_buf, rkey_len);
    ucp_rkey_buffer_release(rkey_buf);
    rel_put_file(g.dir, "target.addr", info, info_len);
    free(info);

    for (int i = 0; i < NRECV; ++i) {
        g.recv[i].buf = g.mem + T_RECV + (size_t)i * MSG_MAX;
        post_recv(&g.recv[i], MSG_MAX, 0, TAG_DONE);
    }
    g.done_recv.buf = &g.done_buf;
    post_recv(&g.done_recv, sizeof(uint64_t), TAG_DONE, ~(ucp_tag_t)0);

    if (rel_get_file(g.dir, "requester.addr", 5000, &peer) < 0) {
        return;  /* no peer */
    }
    if (ep_setup(peer)) {
        rel_put_text(g.dir, "target.ready", "1\n");
    }
    free(peer);
    stage("traffic");
    while (!g.failed && (rel_mono_ns() < deadline)) {
        progress();
        target_check_recvs();
        if (g.done_recv.done) {
            g.done = true;
            break;
        }
    }
}

/* ------------------------------------------------------------ the end */

static void cancel_recv(recv_slot_t *r)
{
    if (!r->done && (r->req != NULL)) {
        ucp_request_cancel(g.worker, r->req);
    }
}

/* Gives up the fetch-adds that UCP's purge of the failed endpoint marked
 * but will never complete (see the header comment). */
static void abandon_purged_amos(void)
{
    char info[128];
    ucp_request_attr_t attr = {
        .field_mask        = UCP_REQUEST_ATTR_FIELD_INFO_STRING |
                             UCP_REQUEST_ATTR_FIELD_INFO_STRING_SIZE,
        .debug_string      = info,
        .debug_string_size = sizeof(info)
    };
    unsigned flags;

    for (int i = 0; i < DEPTH; ++i) {
        op_t *op = &g.op[i];

        if (!op->busy || (op->type != W_AMO) || (op->req == NULL)) {
            continue;
        }
        info[0] = '\0';
        if ((ucp_request_query(op->req, &attr) != UCS_OK) ||
            (sscanf(info, "flags:%x", &flags) != 1) ||
            !(flags & (1u << 5))) { /* UCP_REQUEST_FLAG_SYNC_REMOTE_COMPLETED */
            continue;
        }
        if (g.abandoned++ == 0) {
            fprintf(stderr, "%s %s: fetch-add #%llu given up: purged by "
                    "UCP but never completed (%s)\n", rel_prog, g.role,
                    (unsigned long long)op->seq, info);
        }
        op->busy = false;
        op->req  = NULL;
        --g.outstanding;
    }
}

static bool recvs_pending(void)
{
    bool pending = !g.done_recv.done && (g.done_recv.buf != NULL);

    for (int i = 0; i < NRECV; ++i) {
        pending |= !g.recv[i].done && (g.recv[i].buf != NULL);
    }
    return pending;
}

static int finish(bool contacted)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags        = UCP_EP_CLOSE_FLAG_FORCE
    };
    const char *status;
    int rc;

    /* what was seen before the cleanup, in case the cleanup hangs */
    rel_put_text(g.dir, g.is_target ? "target.outcome" : "requester.outcome",
                 "failed=%d first_error=%s detect_ns=%llu ops=%llu "
                 "outstanding=%d\n",
                 g.failed, g.first_error[0] ? g.first_error : "-",
                 (unsigned long long)g.detect_ns, (unsigned long long)g.ops,
                 g.outstanding);
    if (g.ep != NULL) {
        stage("ep_close");
        wait_request(ucp_ep_close_nbx(g.ep, &p));
    }
    stage("requests");
    for (int i = 0; i < NRECV; ++i) {
        cancel_recv(&g.recv[i]);
    }
    cancel_recv(&g.done_recv);
    for (uint64_t end = rel_mono_ns() + 1000000000ull, n = 0;
         (g.outstanding > 0) || (g.am_pending > 0) || recvs_pending(); ++n) {
        progress();
        if (((n % 4096) == 0) && (g.outstanding > 0) &&
            (rel_mono_ns() > end)) {
            abandon_purged_amos();
        }
    }
    if (g.is_target && contacted) {
        stage("verify");
        target_check_memory();
    }
    if (g.rkey != NULL) {
        stage("rkey_destroy");
        ucp_rkey_destroy(g.rkey);
    }
    stage("mem_unmap");
    ucp_mem_unmap(g.ctx, g.memh);
    if (!g.mapped) {
        free(g.mem);
    }
    stage("worker_destroy");
    ucp_worker_release_address(g.worker, g.addr);
    ucp_worker_destroy(g.worker);
    stage("ucp_cleanup");
    ucp_cleanup(g.ctx);
    stage("exit");

    if (g.done && !g.failed) {
        status = "done";
        rc     = 0;
    } else if (g.failed) {
        status = "detected";
        rc     = (g.ops_limit != 0) ? 6 : 0;
    } else if (!contacted) {
        status = "noconn";
        rc     = 5;
    } else {
        status = "undetected";
        rc     = (g.ops_limit != 0) ? 6 : 4;
    }
    if (g.corrupt != 0) {
        rc = 3;
    }
    rel_put_text(g.dir, g.is_target ? "target.result" : "requester.result",
                 "status=%s detect_ns=%llu ops=%llu errors=%llu corrupt=%llu "
                 "abandoned=%llu first_error=%s\n",
                 status, (unsigned long long)g.detect_ns,
                 (unsigned long long)g.ops, (unsigned long long)g.errors,
                 (unsigned long long)g.corrupt,
                 (unsigned long long)g.abandoned,
                 g.first_error[0] ? g.first_error : "-");
    return rc;
}

int main(int argc, char **argv)
{
    const char *limit = getenv("REL_RUN_LIMIT");
    uint64_t deadline;
    int w;

    if ((argc < 5) || (argc > 6)) {
        fprintf(stderr, "usage: ucp_peer target|requester "
                "put|get|amo|am|tag|mixed heap|mapped DIR [OPS]\n");
        return 2;
    }
    g.role      = argv[1];
    g.is_target = strcmp(argv[1], "target") == 0;
    for (w = 0; (w < W_LAST) && strcmp(argv[2], wl_names[w]); ++w) {
    }
    g.workload  = w;
    g.mapped    = strcmp(argv[3], "mapped") == 0;
    g.dir       = argv[4];
    g.ops_limit = (argc > 5) ? strtoull(argv[5], NULL, 0) : 0;
    if ((!g.is_target && strcmp(argv[1], "requester")) || (w == W_LAST) ||
        (!g.mapped && strcmp(argv[3], "heap"))) {
        rel_die("bad arguments");
    }
    g.seen = calloc(SEEN_BITS / 8, 1);
    if (g.seen == NULL) {
        rel_die("out of memory");
    }
    deadline = rel_mono_ns() +
               (uint64_t)((limit ? atof(limit) : 12.0) * 1e9);

    ucp_setup();
    if (g.is_target) {
        target_run(deadline);
    } else {
        requester_run(deadline);
    }
    return finish(g.ep != NULL || g.failed);
}
