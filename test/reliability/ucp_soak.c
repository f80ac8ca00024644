/*
 * ucp_soak.c - many senders, one receiver, senders killed at random.
 *
 * usage: ucp_soak recv DIR
 *        ucp_soak send DIR ID SECONDS
 *
 * The receiver maps a region (put slots and an atomic counter), writes its
 * worker address and rkey to DIR/recv.addr, and keeps NRECV wildcard tag
 * receives posted until DIR/stop appears.  A sender (ID unique per sender)
 * connects with UCP_ERR_HANDLING_MODE_PEER and, for SECONDS, keeps up to
 * DEPTH operations in flight: tagged messages (70%; 8 B - 128 KiB, eager
 * and rendezvous), puts into its slot of the region (20%) and fetch-adds
 * on the counter (10%).  Then it flushes, sends FIN carrying the number of
 * messages it sent, and exits 0.  Senders the script kills send no FIN.
 * A sender writes the step it is in to DIR/send.ID.stage (traffic,
 * complete, flush_fin, close), so that a hang is attributed to a step.
 *
 * Message tag: sender id << 40 | FIN bit << 39 | sequence number; payload:
 * words rel_word(msg_tag(id, seq), k).  The receiver checks messages in the
 * order its receives were matched (the order of posting), which for one
 * sender is the order it sent them:
 *
 *   lost        messages of a sender that sent FIN which never came (a
 *               killed sender may lose what was in flight: not counted)
 *   duplicated  a sequence number seen twice
 *   reordered   a sequence number seen after a later one
 *   corrupt     wrong length or data of a message, a word in the put area
 *               no sender wrote there
 *   aborted     receives completed with an error (a sender died in a
 *               rendezvous): reported, not a failure
 *   abandoned   receives given up (see below): reported, not a failure
 *
 * A killed sender can die between two fragments of an eager message (a
 * message above one segment and below the rendezvous threshold: 8 KiB with
 * hca).  UCP 1.13 then never completes the receive that matched the first
 * fragment, over any transport (ucp_frag_kill.c shows it with tcp too):
 * the receive waits in the worker's fragment hash, which neither the purge
 * of the failed endpoint (ucp_ep_reqs_purge: the endpoint's own requests)
 * nor ucp_request_cancel (the expected queue only) reaches.  A UCP 1.13
 * application can neither complete nor cancel such a receive; it must
 * leave it (and its buffer) to UCP and go on.  So the receiver gives up a
 * receive still incomplete while its buffer holds the start of a message
 * (it matched a first fragment) of a sender the script SIGKILLed at least
 * 1 s before (DIR/killed): all that sender sent has arrived by then.  A
 * receive stuck on a live or finished sender, or with no data, is never
 * given up: the script counts a hang, and the receiver reports it (STUCK,
 * with the sender its buffer names) after 5 s.
 *
 * At stop it writes its counts so far to DIR/recv.outcome, drains for
 * 200 ms, cancels its receives, checks the put area, unmaps the region and
 * destroys everything (writing each step to DIR/recv.stage), then writes
 * DIR/recv.result:
 *
 *   senders=S fin=F msgs=M lost=L duplicated=D reordered=R corrupt=C aborted=A
 *   abandoned=G
 *
 * and exits 0, or 3 if L, D, R or C is not zero.  A sender exits 0, or 1
 * if it saw an error (its receiver is alive: that is a false failure).
 */
#include "rel_common.h"

#include <stdbool.h>
#include <ucp/api/ucp.h>

const char *rel_prog = "ucp_soak";

#define NRECV      16
#define DEPTH      8
#define MSG_MAX    (128 * 1024)
#define SLOTS      64
#define SLOT_LEN   (16 * 1024)
#define R_AMO      (SLOTS * SLOT_LEN)
#define R_LEN      (R_AMO + 4096)
#define MAX_SEND   65536                 /* sender ids tracked */
#define TAG_FIN    (1ull << 39)
#define SEQ_MASK   (TAG_FIN - 1)

static const char *dir;
static ucp_context_h ctx;
static ucp_worker_h worker;

static void ucp_setup(void)
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
        (st = ucp_init(&params, config, &ctx)) != UCS_OK) {
        rel_die("ucp_init: %s", ucs_status_string(st));
    }
    ucp_config_release(config);
    if ((st = ucp_worker_create(ctx, &wparams, &worker)) != UCS_OK) {
        rel_die("ucp_worker_create: %s", ucs_status_string(st));
    }
}

static size_t msg_len(uint64_t id, uint64_t seq)
{
    return (size_t)8 << (rel_hash(id << 32 | seq) % 15);  /* 8 B-128 KiB */
}

/* The tag of a message's payload pattern: rel_word keeps 40 bits of a
 * tag, so 16 of the id (MAX_SEND) and 24 of the sequence number (a sender
 * sends far fewer than 16 M messages) */
static uint64_t msg_tag(uint64_t id, uint64_t seq)
{
    return id << 24 | (seq & 0xffffff);
}

static size_t put_len(uint64_t id, uint64_t n)
{
    return (size_t)8 << (rel_hash(id << 32 | n | 1ull << 31) % 12);
}

static void wait_request(ucs_status_ptr_t sp)
{
    if (UCS_PTR_IS_PTR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS) {
            ucp_worker_progress(worker);
        }
        ucp_request_free(sp);
    }
}

/* ------------------------------------------------------------ receiver */

typedef struct sender {
    uint64_t expect;    /* next sequence number */
    uint64_t received;  /* distinct messages */
    uint64_t fin_sent;  /* messages sent, from FIN */
    bool     seen_any, fin;
    uint8_t *bits;      /* sequence numbers received */
    size_t   nbits;
} sender_t;

/* One posted receive.  Heap objects: an abandoned one stays UCP's (its
 * buffer and the user data of its callback) and its slot gets a new one. */
typedef struct rslot {
    void        *req;
    bool         done;
    bool         abandoned;
    bool         reported;  /* STUCK printed */
    ucs_status_t status;
    ucp_tag_t    tag;
    size_t       len;
    uint64_t     post_ns;
    struct rslot *next;     /* abandoned list */
    uint8_t      buf[MSG_MAX];
} rslot_t;

static struct {
    sender_t *s;
    rslot_t  *recv[NRECV];
    rslot_t  *abandoned_list;
    unsigned  head;
    uint64_t  senders, fin, msgs, lost, dup, reorder, corrupt, aborted,
              abandoned, late;
} r;

static void rcorrupt(const char *fmt, ...)
{
    va_list ap;

    if (r.corrupt++ < 5) {
        fprintf(stderr, "ucp_soak recv: CORRUPTION: ");
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fprintf(stderr, "\n");
    }
}

static void recv_cb(void *request, ucs_status_t st,
                    const ucp_tag_recv_info_t *info, void *user_data)
{
    rslot_t *rs = user_data;

    if (rs->abandoned) {
        /* UCP did complete it after all: harmless, but worth knowing */
        ++r.late;
        ucp_request_free(request);
        return;
    }
    rs->status = st;
    if (st == UCS_OK) {
        rs->tag = info->sender_tag;
        rs->len = info->length;
    }
    rs->done = true;
    rs->req  = NULL;
    ucp_request_free(request);
}

static void post_recv(rslot_t *rs)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv      = recv_cb,
        .user_data    = rs
    };
    ucs_status_ptr_t sp;

    rs->done     = false;
    rs->reported = false;
    rs->post_ns  = rel_mono_ns();
    /* no message starts with all ones (rel_word_tag rejects it; 0 would
     * pass as a tag): a buffer that no longer does holds the start of the
     * message this receive matched */
    memset(rs->buf, 0xff, 8);
    sp           = ucp_tag_recv_nbx(worker, rs->buf, MSG_MAX, 0, 0, &p);
    if (UCS_PTR_IS_ERR(sp)) {
        rel_die("ucp_tag_recv_nbx: %s", ucs_status_string(UCS_PTR_STATUS(sp)));
    }
    if (!rs->done) {
        rs->req = sp;
    }
}

/* Test-and-set of sequence number seq of sender s. */
static bool mark_seen(sender_t *s, uint64_t seq)
{
    bool was;

    if (seq >= s->nbits) {
        size_t n = s->nbits ? s->nbits : 4096;

        while (n <= seq) {
            n *= 2;
        }
        s->bits = realloc(s->bits, n / 8);
        if (s->bits == NULL) {
            rel_die("out of memory");
        }
        memset(s->bits + s->nbits / 8, 0, (n - s->nbits) / 8);
        s->nbits = n;
    }
    was = s->bits[seq / 8] & (1u << (seq % 8));
    s->bits[seq / 8] |= (uint8_t)(1u << (seq % 8));
    return was;
}

static void check_message(const rslot_t *rs)
{
    uint64_t id  = rs->tag >> 40;
    uint64_t seq = rs->tag & SEQ_MASK;
    sender_t *s;

    if (id >= MAX_SEND) {
        rcorrupt("message with tag %#llx", (unsigned long long)rs->tag);
        return;
    }
    s = &r.s[id];
    if (!s->seen_any) {
        s->seen_any = true;
        ++r.senders;
    }
    if (rs->tag & TAG_FIN) {
        s->fin      = true;
        s->fin_sent = seq;
        ++r.fin;
        return;
    }
    ++r.msgs;
    if (rs->len != msg_len(id, seq)) {
        rcorrupt("sender %llu message %llu: %zu bytes, sent %zu",
                 (unsigned long long)id, (unsigned long long)seq, rs->len,
                 msg_len(id, seq));
    } else if (rel_check(rs->buf, rs->len, msg_tag(id, seq), 0) != 0) {
        rcorrupt("sender %llu message %llu: wrong data",
                 (unsigned long long)id, (unsigned long long)seq);
    }
    if (mark_seen(s, seq)) {
        ++r.dup;
        return;
    }
    ++s->received;
    if (seq >= s->expect) {
        s->expect = seq + 1;
    } else {
        ++r.reorder;
    }
}

/* Receives are drained in the order they were posted, which is the order
 * they matched: a sender's messages are checked in the order it sent them. */
static void drain(void)
{
    rslot_t *rs;

    while ((rs = r.recv[r.head % NRECV])->done) {
        if (rs->status == UCS_OK) {
            check_message(rs);
        } else if (rs->status != UCS_ERR_CANCELED) {
            ++r.aborted;    /* (cancelled: given up, counted there) */
        }
        post_recv(rs);
        ++r.head;
    }
}

/* The message (msg_tag) the incomplete receive rs matched, from
 * its start in the buffer; -1 if nothing arrived yet.  *arrived: the bytes
 * of it there, from the start. */
static int64_t matched_message(const rslot_t *rs, size_t *arrived)
{
    const uint64_t *w = (const uint64_t*)rs->buf;
    int64_t t         = rel_word_tag(w[0], 0);
    size_t k          = 0;

    while ((t >= 0) && (k < MSG_MAX / 8) && (w[k] == rel_word((uint64_t)t, k))) {
        ++k;
    }
    *arrived = k * 8;
    return t;
}

/* Microseconds (CLOCK_REALTIME) of the script's kill of sender id, or 0 if
 * it was not killed (DIR/killed: one "ID TIME_US" line per kill). */
static uint64_t killed_at(int64_t id)
{
    char path[4096];
    unsigned long long kid, us;
    uint64_t at = 0;
    FILE *f;

    snprintf(path, sizeof(path), "%s/killed", dir);
    f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    while (fscanf(f, "%llu %llu", &kid, &us) == 2) {
        if (kid == (uint64_t)id) {
            at = us;
        }
    }
    fclose(f);
    return at;
}

/* Gives up the incomplete receive in slot i if it matched a message of a
 * sender killed at least 1 s ago (see the header comment); reports a
 * receive stuck for 5 s otherwise.  Returns whether it gave it up. */
static bool abandon_if_dead(unsigned i)
{
    rslot_t *rs = r.recv[i], *fresh;
    uint64_t age = rel_mono_ns() - rs->post_ns, at;
    int64_t msg, id;
    size_t arrived;

    if (rs->done || (age < 1000000000ull)) {
        return false;
    }
    msg = matched_message(rs, &arrived);
    id  = (msg < 0) ? -1 : (msg >> 24);
    at  = (id < 0) ? 0 : killed_at(id);
    if ((at == 0) || (rel_now_ns() / 1000 < at + 1000000)) {
        /* matched: data arrived, or a later receive completed (wildcard
         * receives match in the order they were posted); an unmatched one
         * just waits for traffic */
        bool matched = id >= 0;

        for (unsigned k = 0; k < NRECV; ++k) {
            matched |= r.recv[k]->done;
        }
        if (matched && (age >= 5000000000ull) && !rs->reported) {
            rs->reported = true;
            fprintf(stderr, "ucp_soak recv: STUCK: receive %u incomplete "
                    "for %.1f s, matched to sender %lld (%s) message %lld "
                    "of %zu bytes, %zu arrived\n",
                    r.head + ((i - r.head % NRECV + NRECV) % NRECV),
                    age / 1e9, (long long)id,
                    (id < 0) ? "no data yet" : at ? "killed" : "not killed",
                    (msg < 0) ? -1ll : (long long)(msg & 0xffffff),
                    (msg < 0) ? 0 : msg_len((uint64_t)id,
                                            (uint64_t)msg & 0xffffff),
                    arrived);
        }
        return false;
    }
    fresh = calloc(1, sizeof(*fresh));
    if (fresh == NULL) {
        rel_die("out of memory");
    }
    rs->abandoned     = true;
    rs->next          = r.abandoned_list;
    r.abandoned_list  = rs;
    fresh->done       = true;
    fresh->status     = UCS_ERR_CANCELED;
    r.recv[i]         = fresh;
    ++r.abandoned;
    return true;
}

static void stage(const char *name)
{
    rel_put_text(dir, "recv.stage", "%s\n", name);
}

static int receiver(void)
{
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                      UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .length     = R_LEN,
        .flags      = UCP_MEM_MAP_ALLOCATE
    };
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
    size_t alen, rlen, info_len;
    ucp_address_t *addr;
    void *rkey_buf;
    ucp_mem_h memh;
    uint8_t *mem, *info;
    ucs_status_t st;
    uint64_t end;
    bool cancelled = false;
    rslot_t *rs;

    r.s = calloc(MAX_SEND, sizeof(*r.s));
    if (r.s == NULL) {
        rel_die("out of memory");
    }
    for (int i = 0; i < NRECV; ++i) {
        if ((r.recv[i] = calloc(1, sizeof(*r.recv[i]))) == NULL) {
            rel_die("out of memory");
        }
    }
    ucp_setup();
    if ((st = ucp_mem_map(ctx, &mp, &memh)) != UCS_OK ||
        (st = ucp_mem_query(memh, &attr)) != UCS_OK ||
        (st = ucp_rkey_pack(ctx, memh, &rkey_buf, &rlen)) != UCS_OK ||
        (st = ucp_worker_get_address(worker, &addr, &alen)) != UCS_OK) {
        rel_die("receiver setup: %s", ucs_status_string(st));
    }
    mem = attr.address;
    memset(mem, 0, R_LEN);
    /* raddr, address length, address, rkey */
    info_len = 16 + alen + rlen;
    info     = malloc(info_len);
    memcpy(info, &(uint64_t){(uintptr_t)mem}, 8);
    memcpy(info + 8, &(uint64_t){alen}, 8);
    memcpy(info + 16, addr, alen);
    memcpy(info + 16 + alen, rkey_buf, rlen);
    ucp_rkey_buffer_release(rkey_buf);
    for (int i = 0; i < NRECV; ++i) {
        post_recv(r.recv[i]);
    }
    rel_put_file(dir, "recv.addr", info, info_len);
    free(info);

    for (unsigned n = 0; (++n % 4096) || !rel_file_exists(dir, "stop");) {
        ucp_worker_progress(worker);
        drain();
        if ((n % 4096) == 0) {
            /* only the oldest receive holds the others back */
            abandon_if_dead(r.head % NRECV);
        }
    }
    /* the counts so far, in case the end hangs */
    rel_put_text(dir, "recv.outcome",
                 "senders=%llu fin=%llu msgs=%llu duplicated=%llu "
                 "reordered=%llu corrupt=%llu aborted=%llu abandoned=%llu\n",
                 (unsigned long long)r.senders, (unsigned long long)r.fin,
                 (unsigned long long)r.msgs, (unsigned long long)r.dup,
                 (unsigned long long)r.reorder,
                 (unsigned long long)r.corrupt,
                 (unsigned long long)r.aborted,
                 (unsigned long long)r.abandoned);
    stage("drain");
    for (end = rel_mono_ns() + 200000000ull; rel_mono_ns() < end;) {
        ucp_worker_progress(worker);
        drain();
    }
    /* messages still matched to posted receives are counted as they
     * complete; the rest are cancelled (a matched receive is not: UCP
     * cancels only unmatched ones), or given up as during the soak */
    stage("cancel");
    for (int i = 0; i < NRECV; ++i) {
        if (!r.recv[i]->done) {
            ucp_request_cancel(worker, r.recv[i]->req);
        }
    }
    for (unsigned n = 0; !cancelled; ++n) {
        ucp_worker_progress(worker);
        cancelled = true;
        for (unsigned i = 0; i < NRECV; ++i) {
            if (((n % 4096) == 0) && !r.recv[i]->done) {
                abandon_if_dead(i);
            }
            cancelled &= r.recv[i]->done;
        }
    }
    for (int i = 0; i < NRECV; ++i) {
        rslot_t *rs = r.recv[(r.head + (unsigned)i) % NRECV];

        if (rs->status == UCS_OK) {
            check_message(rs);
        } else if (rs->status != UCS_ERR_CANCELED) {
            ++r.aborted;
        }
    }

    stage("verify");
    for (uint64_t s = 0; s < SLOTS; ++s) {
        const uint64_t *w = (const uint64_t*)(mem + s * SLOT_LEN);

        for (uint64_t k = 0; k < SLOT_LEN / 8; ++k) {
            int64_t t = rel_word_tag(w[k], k);

            if ((w[k] != 0) && ((t < 0) || ((uint64_t)t % SLOTS != s))) {
                rcorrupt("put slot %llu word %llu: %#llx",
                         (unsigned long long)s, (unsigned long long)k,
                         (unsigned long long)w[k]);
            }
        }
    }
    for (uint64_t id = 0; id < MAX_SEND; ++id) {
        sender_t *s = &r.s[id];

        /* a killed sender may lose what was in flight; one that sent
         * FIN must have delivered everything */
        if (s->fin && (s->fin_sent > s->received)) {
            r.lost += s->fin_sent - s->received;
        }
        free(s->bits);
    }
    stage("mem_unmap");
    ucp_mem_unmap(ctx, memh);
    stage("worker_destroy");
    ucp_worker_release_address(worker, addr);
    ucp_worker_destroy(worker);
    stage("ucp_cleanup");
    ucp_cleanup(ctx);
    /* UCP no longer holds the receives given up */
    while ((rs = r.abandoned_list) != NULL) {
        r.abandoned_list = rs->next;
        free(rs);
    }
    for (int i = 0; i < NRECV; ++i) {
        free(r.recv[i]);
    }
    stage("exit");
    if (r.late != 0) {
        fprintf(stderr, "ucp_soak recv: %llu receives given up completed "
                "later\n", (unsigned long long)r.late);
    }
    rel_put_text(dir, "recv.result",
                 "senders=%llu fin=%llu msgs=%llu lost=%llu duplicated=%llu "
                 "reordered=%llu corrupt=%llu aborted=%llu abandoned=%llu\n",
                 (unsigned long long)r.senders, (unsigned long long)r.fin,
                 (unsigned long long)r.msgs, (unsigned long long)r.lost,
                 (unsigned long long)r.dup, (unsigned long long)r.reorder,
                 (unsigned long long)r.corrupt,
                 (unsigned long long)r.aborted,
                 (unsigned long long)r.abandoned);
    return (r.lost || r.dup || r.reorder || r.corrupt) ? 3 : 0;
}

/* ------------------------------------------------------------ sender */

static struct {
    uint64_t id, seq, puts, amos, errors;
    int      outstanding;
    uint64_t reply[DEPTH];
    bool     busy[DEPTH];
    char     first_error[128];
} s;

static void send_err(ucs_status_t st, const char *what)
{
    if (s.errors++ == 0) {
        snprintf(s.first_error, sizeof(s.first_error), "%s:%s", what,
                 ucs_status_string(st));
    }
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)arg;
    (void)ep;
    send_err(st, "ep_error_callback");
}

static void send_done(int slot, ucs_status_t st)
{
    s.busy[slot] = false;
    --s.outstanding;
    if (st != UCS_OK) {
        send_err(st, "request");
    }
}

static void send_cb(void *request, ucs_status_t st, void *user_data)
{
    send_done((int)(uintptr_t)user_data, st);
    ucp_request_free(request);
}

static void send_stage(const char *name)
{
    char file[64];

    snprintf(file, sizeof(file), "send.%llu.stage", (unsigned long long)s.id);
    rel_put_text(dir, file, "%s\n", name);
}

static int sender(uint64_t id, double seconds)
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
    ucp_request_param_t plain = {.op_attr_mask = 0};
    uint64_t raddr, alen, end, one = 1;
    uint8_t *bufs, *info;
    ucp_rkey_h rkey;
    ucp_ep_h ep;
    ucs_status_t st;
    ssize_t n;

    s.id = id;
    ucp_setup();
    n = rel_get_file(dir, "recv.addr", 10000, (void**)&info);
    if (n < 16) {
        rel_die("no receiver");
    }
    memcpy(&raddr, info, 8);
    memcpy(&alen, info + 8, 8);
    ep_params.address = (ucp_address_t*)(info + 16);
    if ((st = ucp_ep_create(worker, &ep_params, &ep)) != UCS_OK ||
        (st = ucp_ep_rkey_unpack(ep, info + 16 + alen, &rkey)) != UCS_OK) {
        rel_die("sender connect: %s", ucs_status_string(st));
    }
    free(info);
    bufs = aligned_alloc(4096, (size_t)DEPTH * MSG_MAX);
    if (bufs == NULL) {
        rel_die("out of memory");
    }

    send_stage("traffic");
    end = rel_mono_ns() + (uint64_t)(seconds * 1e9);
    while ((rel_mono_ns() < end) && (s.errors == 0)) {
        for (int slot = 0; (slot < DEPTH) && (s.errors == 0); ++slot) {
            ucp_request_param_t p = {
                .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                UCP_OP_ATTR_FIELD_USER_DATA,
                .cb.send      = send_cb,
                .user_data    = (void*)(uintptr_t)slot
            };
            uint8_t *buf = bufs + (size_t)slot * MSG_MAX;
            uint64_t kind = rel_hash(id << 32 | (s.seq + s.puts + s.amos)) % 10;
            ucs_status_ptr_t sp;
            size_t len;

            if (s.busy[slot]) {
                continue;
            }
            s.busy[slot] = true;
            ++s.outstanding;
            if (kind < 7) {
                len = msg_len(id, s.seq);
                rel_fill(buf, len, msg_tag(id, s.seq), 0);
                sp = ucp_tag_send_nbx(ep, buf, len, id << 40 | s.seq, &p);
                ++s.seq;
            } else if (kind < 9) {
                len = put_len(id, s.puts++);
                rel_fill(buf, len, id, 0);
                sp = ucp_put_nbx(ep, buf, len, raddr + (id % SLOTS) * SLOT_LEN,
                                 rkey, &p);
            } else {
                p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE |
                                  UCP_OP_ATTR_FIELD_REPLY_BUFFER;
                p.datatype      = ucp_dt_make_contig(8);
                p.reply_buffer  = &s.reply[slot];
                sp = ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_ADD, &one, 1,
                                       raddr + R_AMO, rkey, &p);
                ++s.amos;
            }
            if (sp == NULL) {
                send_done(slot, UCS_OK);
            } else if (UCS_PTR_IS_ERR(sp)) {
                send_done(slot, UCS_PTR_STATUS(sp));
            }
        }
        ucp_worker_progress(worker);
    }
    send_stage("complete");
    while (s.outstanding > 0) {
        ucp_worker_progress(worker);
    }
    send_stage("flush_fin");
    if (s.errors == 0) {
        ucs_status_ptr_t sp = ucp_ep_flush_nbx(ep, &plain);

        if (UCS_PTR_IS_ERR(sp)) {
            send_err(UCS_PTR_STATUS(sp), "flush");
        } else {
            wait_request(sp);
            sp = ucp_tag_send_nbx(ep, &one, sizeof(one),
                                  id << 40 | TAG_FIN | s.seq, &plain);
            if (UCS_PTR_IS_ERR(sp)) {
                send_err(UCS_PTR_STATUS(sp), "FIN");
            } else {
                wait_request(sp);
                /* FIN must be at the receiver before the close */
                wait_request(ucp_ep_flush_nbx(ep, &plain));
            }
        }
    }
    send_stage("close");
    ucp_rkey_destroy(rkey);
    wait_request(ucp_ep_close_nbx(ep, &close_p));
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
    free(bufs);
    if (s.errors != 0) {
        fprintf(stderr, "ucp_soak sender %llu: %llu errors, first %s\n",
                (unsigned long long)id, (unsigned long long)s.errors,
                s.first_error);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if ((argc == 3) && !strcmp(argv[1], "recv")) {
        dir = argv[2];
        return receiver();
    }
    if ((argc == 5) && !strcmp(argv[1], "send")) {
        dir = argv[2];
        return sender(strtoull(argv[3], NULL, 0) % MAX_SEND,
                      atof(argv[4]));
    }
    fprintf(stderr, "usage: ucp_soak recv DIR | send DIR ID SECONDS\n");
    return 2;
}
