/*
 * fuzz_common.c - set-up of the victim and sender contexts, the input
 * reader, the selectors, and the victim's consumer loop with the checks
 * every receive completion must pass.  See fuzz_common.h.
 */
#include "fuzz_common.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

uint8_t fz_pull_src[FZ_PULL_SRC];

static fz_world_t fz_w;
static int        fz_ready;

void fz_fail(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "==FUZZ== invariant broken: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort(); /* libFuzzer reports it as a crash and saves the input */
}

#define FZ_CHECK(_expr) \
    do { \
        int _rc = (_expr); \
        if (_rc != 0) { \
            fz_fail("set-up: %s = %d (%s)", #_expr, _rc, strerror(-_rc)); \
        } \
    } while (0)

int fz_verbose(void)
{
    static int verbose = -1;

    if (verbose < 0) {
        const char *v = getenv("HCA_FUZZ_VERBOSE");
        verbose       = (v != NULL) && (v[0] != '\0') && (v[0] != '0');
    }
    return verbose;
}

int fz_masked(const char *name)
{
    const char *mask = getenv("HCA_FUZZ_MASK");
    size_t len       = strlen(name);

    for (const char *p = mask; (p != NULL) && (*p != '\0');) {
        const char *end = strchr(p, ',');
        size_t n        = (end != NULL) ? (size_t)(end - p) : strlen(p);
        if ((n == len) && (memcmp(p, name, n) == 0)) {
            return 1;
        }
        p = (end != NULL) ? end + 1 : NULL;
    }
    return 0;
}

/* ---------------------------------------------------------------- input */

uint8_t fz_u8(fz_in_t *in)
{
    uint8_t v = 0;

    if (in->n > 0) {
        v = in->p[0];
        in->p++;
        in->n--;
    }
    return v;
}

uint16_t fz_u16(fz_in_t *in)
{
    uint16_t v = fz_u8(in);
    return v | (uint16_t)(fz_u8(in) << 8);
}

uint32_t fz_u32(fz_in_t *in)
{
    uint32_t v = fz_u16(in);
    return v | ((uint32_t)fz_u16(in) << 16);
}

uint64_t fz_u64(fz_in_t *in)
{
    uint64_t v = fz_u32(in);
    return v | ((uint64_t)fz_u32(in) << 32);
}

/* ---------------------------------------------------------------- selectors */

uint32_t fz_pick_pid(const fz_world_t *w, uint8_t sel)
{
    switch (sel & 3) {
    case 1:
        return (uint32_t)w->child;
    case 2:
        return w->dead_pid;
    default:
        return w->vaddr.pid; /* this process: victim and sender alike */
    }
}

uint32_t fz_pick_ctx(const fz_world_t *w, uint8_t sel, uint32_t raw)
{
    switch (sel & 3) {
    case 1:
        return w->vaddr.ctx_id; /* the victim names itself */
    case 2:
        return raw;
    default:
        return w->saddr.ctx_id;
    }
}

/* A QPN of the same index and another generation: a destroyed QP's. */
static uint32_t fz_stale_qpn(uint32_t qpn)
{
    return qpn + (1u << HCA_QPN_INDEX_BITS);
}

uint32_t fz_pick_src_qpn(const fz_world_t *w, int qp, uint8_t sel,
                         uint32_t raw)
{
    switch (sel & 7) {
    case 1:
        return hca_qp_num(w->sqp[(qp + 1) % FZ_NUM_QP]);
    case 2:
        return hca_qp_num(w->vqp[qp]); /* the target QP itself */
    case 3:
        return hca_qp_num(w->vqp[(qp + 1) % FZ_NUM_QP]);
    case 4:
        return raw;
    case 5:
        return fz_stale_qpn(hca_qp_num(w->sqp[qp]));
    default:
        return hca_qp_num(w->sqp[qp]); /* the connected peer */
    }
}

uint32_t fz_pick_dst_qpn(const fz_world_t *w, int qp, uint8_t sel,
                         uint32_t raw)
{
    switch (sel & 7) {
    case 1:
        /* a QP of another ring */
        return hca_qp_num(w->vqp[(qp + 1) % FZ_NUM_QP]);
    case 2:
        return hca_qp_num(w->sqp[qp]);
    case 3:
        return raw;
    case 4:
        return fz_stale_qpn(hca_qp_num(w->vqp[qp]));
    default:
        return hca_qp_num(w->vqp[qp]);
    }
}

/* ---------------------------------------------------------------- set-up */

/* RESET -> INIT -> RTR (-> RTS but for an any-source target). */
static void fz_connect(hca_qp_t *qp, const hca_port_addr_t *dest,
                       uint32_t dest_qpn, unsigned access)
{
    hca_qp_attr_t a;

    memset(&a, 0, sizeof(a));
    a.qp_state = HCA_QPS_INIT;
    a.access   = access;
    FZ_CHECK(hca_qp_modify(qp, &a, HCA_QP_ATTR_STATE | HCA_QP_ATTR_ACCESS));
    a.qp_state    = HCA_QPS_RTR;
    a.dest        = *dest;
    a.dest_qp_num = dest_qpn;
    FZ_CHECK(hca_qp_modify(qp, &a, HCA_QP_ATTR_STATE | HCA_QP_ATTR_DEST));
    if (dest_qpn == HCA_QPN_ANY) {
        return;
    }
    a.qp_state = HCA_QPS_RTS;
    FZ_CHECK(hca_qp_modify(qp, &a, HCA_QP_ATTR_STATE));
}

unsigned fz_victim_access(int qp)
{
    /* the others allow less, so the service harness meets QPs whose
     * access refuses what an MR would allow */
    switch (qp) {
    case FZ_QP_RQ:
        return HCA_ACCESS_REMOTE_WRITE | HCA_ACCESS_REMOTE_READ |
               HCA_ACCESS_REMOTE_ATOMIC;
    case FZ_QP_INPLACE:
        return HCA_ACCESS_REMOTE_WRITE;
    default:
        return HCA_ACCESS_REMOTE_READ | HCA_ACCESS_REMOTE_ATOMIC;
    }
}

/* The source a victim QP accepts (RTR's dest_qp_num). */
static uint32_t fz_victim_dest(const fz_world_t *w, int qp)
{
    return (qp == FZ_QP_ANY) ? HCA_QPN_ANY : hca_qp_num(w->sqp[qp]);
}

static hca_qp_t *fz_qp_create(hca_pd_t *pd, hca_cq_t *cq, unsigned flags)
{
    hca_qp_init_attr_t ia;
    hca_qp_t *qp = NULL;

    memset(&ia, 0, sizeof(ia));
    ia.send_cq      = cq;
    ia.recv_cq      = cq;
    ia.max_send_wr  = 16;
    ia.max_recv_wr  = 4 * FZ_RECV_DEPTH;
    ia.max_send_sge = 1;
    ia.max_recv_sge = FZ_RECV_SGE;
    ia.create_flags = flags;
    FZ_CHECK(hca_qp_create(pd, &ia, &qp));
    return qp;
}

static hca_mr_t *fz_mr(hca_pd_t *pd, void *addr, size_t len, unsigned access)
{
    hca_mr_t *mr = NULL;

    FZ_CHECK(hca_mr_reg(pd, addr, len, access, &mr));
    return mr;
}

static uint8_t *fz_alloc(size_t len)
{
    uint8_t *p = malloc(len);

    if (p == NULL) {
        fz_fail("set-up: out of memory");
    }
    memset(p, 0x5a, len);
    return p;
}

/* The forked child: a process whose memory single copy can read (it has
 * fz_pull_src where we have it) and which has no device context. */
static pid_t fz_child_start(void)
{
    pid_t parent = getpid();
    pid_t pid    = fork();

    if (pid < 0) {
        fz_fail("set-up: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(0);
        }
        for (;;) {
            pause();
        }
    }
    return pid;
}

static void fz_world_fini(void)
{
    fz_world_t *w = &fz_w;

    if (!fz_ready) {
        return;
    }
    fz_ready = 0;
    /* every object, so that the contexts leave nothing in /dev/shm */
    for (int i = 0; i < FZ_NUM_QP; ++i) {
        hca_qp_destroy(w->vqp[i]);
        hca_qp_destroy(w->sqp[i]);
    }
    for (int i = 0; i < FZ_RECV_SGE; ++i) {
        hca_mr_dereg(w->rmr[i]);
    }
    hca_mr_dereg(w->mr_rw);
    hca_mr_dereg(w->mr_ro);
    hca_mr_dereg(w->mr_dm);
    hca_mr_dereg(w->mr_pd2);
    hca_dm_free(w->dm);
    hca_cq_destroy(w->vcq);
    hca_cq_destroy(w->scq);
    hca_pd_dealloc(w->vpd);
    hca_pd_dealloc(w->vpd2);
    hca_pd_dealloc(w->spd);
    hca_device_close(w->victim);
    hca_device_close(w->sender);
    close(w->wake_sock);
    kill(w->child, SIGKILL);
    waitpid(w->child, NULL, 0);
}

fz_world_t *fz_world_get(void)
{
    return &fz_w;
}

fz_world_t *fz_world_init(void)
{
    static const uint32_t rlen[FZ_RECV_SGE] = {256, 4096, 12288};
    const unsigned all = HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE |
                         HCA_ACCESS_REMOTE_READ | HCA_ACCESS_REMOTE_ATOMIC;
    fz_world_t *w = &fz_w;
    hca_mr_t *mr;

    if (fz_ready) {
        return w;
    }
    memset(w, 0, sizeof(*w));
    for (size_t i = 0; i < sizeof(fz_pull_src); ++i) {
        fz_pull_src[i] = (uint8_t)(i * 131 + 7);
    }
    /* before any thread exists (the service threads start at open) */
    w->child    = fz_child_start();
    w->dead_pid = 0x7ffffff0u; /* > PID_MAX_LIMIT (4M) */

    FZ_CHECK(hca_device_open("hca0", 0, &w->victim));
    FZ_CHECK(hca_device_open("hca0", 0, &w->sender));
    hca_port_address(w->victim, &w->vaddr);
    hca_port_address(w->sender, &w->saddr);
    FZ_CHECK(hca_pd_alloc(w->victim, &w->vpd));
    FZ_CHECK(hca_pd_alloc(w->victim, &w->vpd2));
    FZ_CHECK(hca_pd_alloc(w->sender, &w->spd));
    FZ_CHECK(hca_cq_create(w->victim, 1024, &w->vcq));
    FZ_CHECK(hca_cq_create(w->sender, 256, &w->scq));

    w->vqp[FZ_QP_RQ]      = fz_qp_create(w->vpd, w->vcq, 0);
    w->vqp[FZ_QP_INPLACE] = fz_qp_create(w->vpd, w->vcq,
                                         HCA_QP_CREATE_RECV_INPLACE);
    w->vqp[FZ_QP_ANY]     = fz_qp_create(w->vpd, w->vcq, 0);
    for (int i = 0; i < FZ_NUM_QP; ++i) {
        w->sqp[i] = fz_qp_create(w->spd, w->scq, 0);
    }
    for (int i = 0; i < FZ_NUM_QP; ++i) {
        fz_connect(w->vqp[i], &w->saddr, fz_victim_dest(w, i),
                   fz_victim_access(i));
        fz_connect(w->sqp[i], &w->vaddr, hca_qp_num(w->vqp[i]), 0);
    }

    for (int i = 0; i < FZ_RECV_SGE; ++i) {
        w->rlen[i] = rlen[i];
        w->rbuf[i] = fz_alloc(rlen[i]);
        w->rmr[i]  = fz_mr(w->vpd, w->rbuf[i], rlen[i],
                           HCA_ACCESS_LOCAL_WRITE);
    }

    /* a key that was valid once: registered and deregistered first, so
     * that the MRs below may reuse its entry with another tag */
    w->mem_rw    = fz_alloc(FZ_MR_LEN);
    mr           = fz_mr(w->vpd, w->mem_rw, FZ_MR_LEN, all);
    w->stale_key = hca_mr_rkey(mr);
    FZ_CHECK(hca_mr_dereg(mr));

    w->mr_rw   = fz_mr(w->vpd, w->mem_rw, FZ_MR_LEN, all);
    w->mem_ro  = fz_alloc(FZ_MR_LEN);
    w->mr_ro   = fz_mr(w->vpd, w->mem_ro, FZ_MR_LEN, HCA_ACCESS_REMOTE_READ);
    w->mem_pd2 = fz_alloc(FZ_MR_LEN);
    w->mr_pd2  = fz_mr(w->vpd2, w->mem_pd2, FZ_MR_LEN, all);
    FZ_CHECK(hca_dm_alloc(w->victim, FZ_MR_LEN, &w->dm));
    w->mr_dm   = fz_mr(w->vpd, hca_dm_addr(w->dm), FZ_MR_LEN, all);

    /* the victim's objects as a peer maps them */
    w->vpeer = hca_peer_get(w->sender, &w->vaddr);
    if (w->vpeer == NULL) {
        fz_fail("set-up: the sender cannot map the victim's context");
    }
    for (int i = 0; i < FZ_NUM_QP; ++i) {
        w->ring[i] = hca_peer_ring(w->sender, w->vpeer,
                                   w->vqp[i]->rq->ring_id);
        if (w->ring[i] == NULL) {
            fz_fail("set-up: the sender cannot map ring %u",
                    w->vqp[i]->rq->ring_id);
        }
    }
    /* the address its service thread sleeps on, from the socket itself:
     * the harness needs no knowledge of how the library names it */
    w->svc_addr_len = sizeof(w->svc_addr);
    if (getsockname(hca_shm_dev(w->victim)->svc_sock,
                    (struct sockaddr*)&w->svc_addr,
                    &w->svc_addr_len) != 0) {
        fz_fail("set-up: getsockname(service socket): %s", strerror(errno));
    }
    w->wake_sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (w->wake_sock < 0) {
        fz_fail("set-up: socket: %s", strerror(errno));
    }
    fz_ready = 1;
    atexit(fz_world_fini);
    return w;
}

/* ---------------------------------------------------------------- victim */

void fz_wake_svc(fz_world_t *w)
{
    char byte = 0;

    /* a full socket buffer means a wake-up is pending already */
    (void)sendto(w->wake_sock, &byte, 1, MSG_DONTWAIT,
                 (const struct sockaddr*)&w->svc_addr, w->svc_addr_len);
}

void fz_qp_restart(fz_world_t *w, int qp)
{
    hca_qp_attr_t a;

    memset(&a, 0, sizeof(a));
    a.qp_state = HCA_QPS_RESET;
    FZ_CHECK(hca_qp_modify(w->vqp[qp], &a, HCA_QP_ATTR_STATE));
    fz_connect(w->vqp[qp], &w->saddr, fz_victim_dest(w, qp),
               fz_victim_access(qp));
    w->posted[qp]    = 0;
    w->completed[qp] = 0;
}

void fz_recv_fill(fz_world_t *w, int qp)
{
    hca_rq_t *rq = w->vqp[qp]->rq;

    /* head - tail: posted and not taken by a message (a first fragment
     * takes one without completing it) */
    while (rq->head - rq->tail < FZ_RECV_DEPTH) {
        hca_sge_t sge[FZ_RECV_SGE];
        hca_recv_wr_t wr;
        hca_recv_wr_t *bad = NULL;
        int rc;

        for (int i = 0; i < FZ_RECV_SGE; ++i) {
            sge[i].addr   = (uint64_t)(uintptr_t)w->rbuf[i];
            sge[i].length = w->rlen[i];
            sge[i].lkey   = hca_mr_lkey(w->rmr[i]);
        }
        memset(&wr, 0, sizeof(wr));
        wr.wr_id   = ((uint64_t)FZ_WRID_MAGIC << 48) | ((uint64_t)qp << 40) |
                     (w->wr_seq++ & 0xffffffffffull);
        wr.sg_list = sge;
        wr.num_sge = FZ_RECV_SGE;
        rc         = hca_post_recv(w->vqp[qp], &wr, &bad);
        if (rc != 0) {
            fz_fail("hca_post_recv on victim QP %d = %d (state %s)", qp, rc,
                    hca_qp_state_str(hca_qp_state(w->vqp[qp])));
        }
        w->posted[qp]++;
    }
}

static uint32_t fz_recv_len(const fz_world_t *w)
{
    uint32_t len = 0;

    for (int i = 0; i < FZ_RECV_SGE; ++i) {
        len += w->rlen[i];
    }
    return len;
}

/* What a consumer relies on in a receive completion. */
static void fz_check_wc(fz_world_t *w, const hca_wc_t *wc)
{
    int qp = -1;

    for (int i = 0; i < FZ_NUM_QP; ++i) {
        if (wc->qp_num == hca_qp_num(w->vqp[i])) {
            qp = i;
        }
    }
    if (fz_verbose()) {
        fprintf(stderr, "  CQE qp 0x%x status %s opcode %d byte_len %u "
                "imm 0x%x src_qp 0x%x flags 0x%x\n", wc->qp_num,
                hca_wc_status_str(wc->status), wc->opcode, wc->byte_len,
                wc->imm_data, wc->src_qp, wc->wc_flags);
    }
    if (qp < 0) {
        fz_fail("CQE of unknown QP 0x%x", wc->qp_num);
    }
    if (((wc->wr_id >> 48) != FZ_WRID_MAGIC) ||
        (((wc->wr_id >> 40) & 0xff) != (uint64_t)qp)) {
        fz_fail("CQE wr_id 0x%llx was not posted to QP 0x%x",
                (unsigned long long)wc->wr_id, wc->qp_num);
    }
    if (((unsigned)wc->status >= HCA_WC_STATUS_LAST) ||
        ((wc->opcode != HCA_WC_RECV) &&
         (wc->opcode != HCA_WC_RECV_RDMA_WITH_IMM))) {
        fz_fail("CQE status %d opcode %d", wc->status, wc->opcode);
    }
    if (++w->completed[qp] > w->posted[qp]) {
        fz_fail("QP %d: %llu receive completions, %llu receives posted", qp,
                (unsigned long long)w->completed[qp],
                (unsigned long long)w->posted[qp]);
    }
    /* byte_len of a received SEND is what the consumer reads from its
     * buffer: never more than the buffer (an RDMA WRITE's byte_len is the
     * write's length, not bounded by the receive) */
    if ((wc->status == HCA_WC_SUCCESS) && (wc->opcode == HCA_WC_RECV) &&
        (wc->byte_len > fz_recv_len(w)) && !fz_masked("byte-len")) {
        fz_fail("QP %d: successful receive with byte_len %u > receive "
                "buffer %u (src_qp 0x%x)", qp, wc->byte_len,
                fz_recv_len(w), wc->src_qp);
    }
}

/* What a consumer relies on in an in-place message: its bytes lie in its
 * slot, after the header.  (An empty message may point anywhere in the
 * slot: with length 0 the responder accepts any data_off.) */
static void fz_check_peek(fz_world_t *w, const hca_recv_msg_t *msg)
{
    const hca_ring_t *ring = &w->vqp[FZ_QP_INPLACE]->rq->ring;
    const uint8_t *slot    = hca_ring_slot(ring, msg->index);
    const uint8_t *data    = msg->data;

    if (msg->byte_len == 0) {
        return;
    }
    if ((data < slot + sizeof(hca_msg_hdr_t)) ||
        (data > slot + ring->slot_size) ||
        (msg->byte_len > (size_t)(slot + ring->slot_size - data))) {
        fz_fail("in-place message outside its slot: data at +%td, %u bytes",
                data - slot, msg->byte_len);
    }
}

void fz_victim_poll(fz_world_t *w)
{
    hca_recv_msg_t msg;
    hca_wc_t wc[32];
    int n;

    /* bounded: each call consumes at most 64 messages of each ring */
    for (int round = 0; round < 16; ++round) {
        n = hca_cq_poll(w->vcq, 32, wc);
        if (n < 0) {
            fz_fail("hca_cq_poll = %d", n);
        }
        for (int i = 0; i < n; ++i) {
            fz_check_wc(w, &wc[i]);
        }
        if (n == 0) {
            break;
        }
    }
    for (int k = 0; (k < HCA_RING_SLOTS) &&
                    hca_recv_peek(w->vqp[FZ_QP_INPLACE], &msg); ++k) {
        if (fz_verbose()) {
            fprintf(stderr, "  in place: %u bytes imm 0x%x src_qp 0x%x "
                    "flags 0x%x\n", msg.byte_len, msg.imm_data, msg.src_qp,
                    msg.wc_flags);
        }
        fz_check_peek(w, &msg);
        hca_recv_release(w->vqp[FZ_QP_INPLACE], &msg);
    }
}

static int fz_ring_empty(const fz_world_t *w, int qp)
{
    hca_ring_hdr_t *hdr = w->vqp[qp]->rq->ring.hdr;

    return atomic_load(&hdr->tail) ==
           (atomic_load(&hdr->head) & ~HCA_RING_ARMED);
}

void fz_drain(fz_world_t *w)
{
    for (int round = 0; round < 64; ++round) {
        for (int qp = 0; qp < FZ_NUM_QP; ++qp) {
            fz_recv_fill(w, qp);
        }
        fz_victim_poll(w);
        int empty = 1;
        for (int qp = 0; qp < FZ_NUM_QP; ++qp) {
            empty &= fz_ring_empty(w, qp);
        }
        if (empty) {
            return;
        }
    }
    for (int qp = 0; qp < FZ_NUM_QP; ++qp) {
        hca_ring_t *ring = &w->vqp[qp]->rq->ring;
        uint64_t tail    = atomic_load(&ring->hdr->tail);
        hca_msg_hdr_t hdr;

        if (fz_ring_empty(w, qp)) {
            continue;
        }
        memcpy(&hdr, hca_ring_slot(ring, tail), sizeof(hdr));
        fz_fail("QP %d: the ring stalls at index %llu (head %llu): op %u "
                "flags 0x%x data_off %u length %u msg_len %u dst_qpn 0x%x "
                "src_qpn 0x%x (receives posted %llu, available %llu)", qp,
                (unsigned long long)tail,
                (unsigned long long)(atomic_load(&ring->hdr->head) &
                                     ~HCA_RING_ARMED),
                hdr.op, hdr.flags, hdr.data_off, hdr.length, hdr.msg_len,
                hdr.dst_qpn, hdr.src_qpn,
                (unsigned long long)w->posted[qp],
                (unsigned long long)(w->vqp[qp]->rq->head -
                                     w->vqp[qp]->rq->tail));
    }
}
