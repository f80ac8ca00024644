/*
 * fuzz_tcp.c - libFuzzer harness: frames of the tcp fabric's wire
 * protocol (hca_tcp_wire.h) from a raw client socket, read and executed by
 * a device context's fabric thread (hca_tcp_rx.c -> hca_tcp_resp.c),
 * and the pure header and hello checks (hca_tcp_hdr_check,
 * hca_tcp_hello_check) called directly.
 *
 * The victim is a context opened in tcp mode on "lo" with a QP in RTR that
 * accepts any source (receives posted, for SENDs and WRITE_IMM), a QP in
 * RTS connected to it (what ACK and READ_RESP frames may name), and an MR
 * of FZ_TCP_MR bytes inside a buffer whose FZ_TCP_PAD bytes either side
 * must never change.  The client completes the handshake (its four
 * messages, the MACs keyed by the victim's secret) and keeps its
 * connection across inputs; when the victim closes it (a malformed
 * header), the next input reconnects.
 *
 * Input (little-endian; what runs short reads zeros):
 *
 *   u8 mode   bit 0: "shaped": every frame is made mostly well formed (see
 *             below); else the frames are raw bytes
 *             bit 1: the HELLO of a new connection comes from the input
 *             (64 raw bytes; with bit 2 its magic, version, step and
 *             destination are fixed), then u8 sel for the PROOF: bit 0
 *             its MAC from the input (u64: not the victim's secret's),
 *             bit 1 its identity proof from the input (u64), bit 2 the
 *             HELLO claims the victim's own identity - the peer of its
 *             RTS QP, whose requests pass the identity check only with
 *             a valid proof (src_qpn selector 2 names that peer's QPN)
 *   frames, up to FZ_TCP_FRAMES:
 *     raw:    72 header bytes; then, if the header passes
 *             hca_tcp_hdr_check, `length` payload bytes (the input's,
 *             padded with zeros: the stream stays in step)
 *     shaped: u8 sel, u8 sel2, 72 header bytes, then the payload as raw;
 *             version fixed, opcode modulo the opcodes, syndrome 0 but in
 *             an ACK, flags masked to the opcode's (unless sel bit 7),
 *             length clamped to the opcode's limit (8 KiB unless sel2 bit
 *             0), offset/total made to agree (sel bit 6), dst_qpn by sel
 *             bits 0-1 (0,1 the target, 2 the RTS QP, 3 raw), src_qpn by
 *             bits 2-3 (0-1 a small requester QPN, 2 the target's QPN: the
 *             RTS QP's peer, 3 raw), the MR's rkey
 *             unless bit 4, an address in or near the MR unless bit 5
 *             (8-aligned with sel2 bit 1), a valid atomic op unless sel2
 *             bit 2
 *
 * The first bytes of every input also go to hca_tcp_hdr_check and
 * hca_tcp_hello_check, whose verdicts are checked against the limits they
 * promise.  Checked after each input (a violation aborts with "==FUZZ==
 * invariant broken"): the bytes around the MR are unchanged; every frame
 * the victim sends passes hca_tcp_hdr_check; a hello is answered with a
 * status that matches what was wrong with it, a refusal names nobody (no
 * identity, nonce or MAC) and closes, an accepted one proves the victim
 * knows its secret; the RTS QP never answers SUCCESS to a connection
 * whose identity is not proven;
 * the victim answers a probe (a zero-length WRITE from a fresh requester
 * QPN, sent after the input's frames) within FZ_TCP_WAIT_MS, i.e. it has
 * consumed everything - or it closed the connection after a bad header.
 */
#include "fuzz_common.h"
#include "hca_tcp_fabric.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FZ_TCP_MR       8192
#define FZ_TCP_PAD      256
#define FZ_TCP_FRAMES   16
#define FZ_TCP_RECVS    8
#define FZ_TCP_RLEN     16384
#define FZ_TCP_WAIT_MS  10000
#define FZ_TCP_PROBE    0x00c00000u /* probe requester QPNs: this + n */
#define FZ_TCP_SENTINEL 0xa5

static struct {
    hca_device_t   *dev;
    hca_port_addr_t addr;
    hca_pd_t       *pd;
    hca_cq_t       *cq;
    hca_qp_t       *target;     /* RTR, any source */
    hca_qp_t       *req;        /* RTS, to the target */
    uint8_t        *buf;        /* PAD | MR | PAD */
    hca_mr_t       *mr, *rmr;
    uint8_t        *rbuf;       /* FZ_TCP_RECVS receive buffers */
    uint32_t        posted;     /* receives outstanding */
    int             fd;         /* the client, -1: reconnect */
    uint32_t        probe;      /* probes sent */
    int             proven;     /* the connection proved it is the victim's
                                   RTS QP's peer (the victim itself) */
    /* the victim's frames, as they come: header, then its payload */
    uint8_t         out_hdr[sizeof(hca_tcp_hdr_t)];
    size_t          out_got;
    uint64_t        out_skip;
} fz;

static double fz_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---------------------------------------------------------------- victim */

static void fz_qp_to(hca_qp_t *qp, hca_qp_state_t state, uint32_t dest_qpn)
{
    hca_qp_attr_t a;
    unsigned mask = HCA_QP_ATTR_STATE;
    int rc;

    memset(&a, 0, sizeof(a));
    a.qp_state = state;
    if (state == HCA_QPS_INIT) {
        a.access = HCA_ACCESS_REMOTE_WRITE | HCA_ACCESS_REMOTE_READ |
                   HCA_ACCESS_REMOTE_ATOMIC;
        mask    |= HCA_QP_ATTR_ACCESS;
    } else if (state == HCA_QPS_RTR) {
        a.dest        = fz.addr;
        a.dest_qp_num = dest_qpn;
        mask         |= HCA_QP_ATTR_DEST;
    }
    rc = hca_qp_modify(qp, &a, mask);
    if (rc != 0) {
        fz_fail("set-up: QP %u to state %d: %d", hca_qp_num(qp), state, rc);
    }
}

/* The receive CQ drained (it runs the victim's receive path); the target
 * QP back in RTR with its receives if a SEND failed it. */
static void fz_victim_poll_tcp(void)
{
    hca_wc_t wc[16];
    int n;

    while ((n = hca_cq_poll(fz.cq, 16, wc)) > 0) {
        for (int i = 0; i < n; ++i) {
            if ((wc[i].qp_num == hca_qp_num(fz.target)) &&
                ((wc[i].opcode == HCA_WC_RECV) ||
                 (wc[i].opcode == HCA_WC_RECV_RDMA_WITH_IMM) ||
                 (wc[i].status != HCA_WC_SUCCESS)) && (fz.posted > 0)) {
                fz.posted--;
            }
        }
    }
    if (fz.target->state == HCA_QPS_ERR) {
        fz_qp_to(fz.target, HCA_QPS_RESET, 0);
        fz.posted = 0;
        fz_qp_to(fz.target, HCA_QPS_INIT, 0);
        fz_qp_to(fz.target, HCA_QPS_RTR, HCA_QPN_ANY);
    }
    while (fz.posted < FZ_TCP_RECVS) {
        uint32_t k = fz.posted;
        hca_sge_t sge = {
            .addr   = (uint64_t)(uintptr_t)(fz.rbuf + k * FZ_TCP_RLEN),
            .length = FZ_TCP_RLEN,
            .lkey   = hca_mr_lkey(fz.rmr)
        };
        hca_recv_wr_t wr = {.wr_id = k, .sg_list = &sge, .num_sge = 1};
        hca_recv_wr_t *bad;
        if (hca_post_recv(fz.target, &wr, &bad) != 0) {
            break;
        }
        fz.posted++;
    }
}

static void fz_guard_check(void)
{
    for (size_t i = 0; i < FZ_TCP_PAD; ++i) {
        if ((fz.buf[i] != FZ_TCP_SENTINEL) ||
            (fz.buf[FZ_TCP_PAD + FZ_TCP_MR + i] != FZ_TCP_SENTINEL)) {
            fz_fail("a byte around the MR changed (%s, offset %zu)",
                    (fz.buf[i] != FZ_TCP_SENTINEL) ? "before" : "after", i);
        }
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    hca_open_attr_t attr;
    hca_qp_init_attr_t ia;
    int rc;

    (void)argc;
    (void)argv;
    memset(&attr, 0, sizeof(attr));
    attr.fabric      = HCA_FABRIC_MODE_TCP;
    attr.net_devices = "lo";
    rc = hca_device_open_attr("hca0", &attr, &fz.dev);
    if (rc != 0) {
        fz_fail("set-up: hca_device_open_attr(tcp, lo) = %d", rc);
    }
    hca_port_address(fz.dev, &fz.addr);
    if ((hca_pd_alloc(fz.dev, &fz.pd) != 0) ||
        (hca_cq_create(fz.dev, 1024, &fz.cq) != 0)) {
        fz_fail("set-up: PD / CQ");
    }
    memset(&ia, 0, sizeof(ia));
    ia.send_cq      = fz.cq;
    ia.recv_cq      = fz.cq;
    ia.max_send_wr  = 16;
    ia.max_recv_wr  = 2 * FZ_TCP_RECVS;
    ia.max_send_sge = 1;
    ia.max_recv_sge = 1;
    if ((hca_qp_create(fz.pd, &ia, &fz.target) != 0) ||
        (hca_qp_create(fz.pd, &ia, &fz.req) != 0)) {
        fz_fail("set-up: QPs");
    }
    fz_qp_to(fz.target, HCA_QPS_INIT, 0);
    fz_qp_to(fz.target, HCA_QPS_RTR, HCA_QPN_ANY);
    fz_qp_to(fz.req, HCA_QPS_INIT, 0);
    fz_qp_to(fz.req, HCA_QPS_RTR, hca_qp_num(fz.target));
    fz_qp_to(fz.req, HCA_QPS_RTS, 0);

    fz.buf  = malloc(FZ_TCP_PAD + FZ_TCP_MR + FZ_TCP_PAD);
    fz.rbuf = malloc((size_t)FZ_TCP_RECVS * FZ_TCP_RLEN);
    if ((fz.buf == NULL) || (fz.rbuf == NULL)) {
        fz_fail("set-up: out of memory");
    }
    memset(fz.buf, FZ_TCP_SENTINEL, FZ_TCP_PAD + FZ_TCP_MR + FZ_TCP_PAD);
    if ((hca_mr_reg(fz.pd, fz.buf + FZ_TCP_PAD, FZ_TCP_MR,
                    HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE |
                    HCA_ACCESS_REMOTE_READ | HCA_ACCESS_REMOTE_ATOMIC,
                    &fz.mr) != 0) ||
        (hca_mr_reg(fz.pd, fz.rbuf, (size_t)FZ_TCP_RECVS * FZ_TCP_RLEN,
                    HCA_ACCESS_LOCAL_WRITE, &fz.rmr) != 0)) {
        fz_fail("set-up: MRs");
    }
    fz_victim_poll_tcp();
    fz.fd = -1;
    return 0;
}

/* ---------------------------------------------------------------- socket */

static void fz_close(void)
{
    if (fz.fd >= 0) {
        close(fz.fd);
        fz.fd = -1;
    }
    fz.out_got  = 0;
    fz.out_skip = 0;
}

static void fz_connect(void)
{
    struct sockaddr_in sin;
    struct pollfd pfd;
    int one = 1;

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port   = htons(fz.addr.net.port);
    memcpy(&sin.sin_addr, fz.addr.net.addr, 4);
    fz.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fz.fd < 0) {
        fz_fail("socket: %s", strerror(errno));
    }
    (void)setsockopt(fz.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if ((connect(fz.fd, (struct sockaddr*)&sin, sizeof(sin)) != 0) &&
        (errno != EINPROGRESS)) {
        fz_fail("connect: %s", strerror(errno));
    }
    pfd.fd     = fz.fd;
    pfd.events = POLLOUT;
    if (poll(&pfd, 1, FZ_TCP_WAIT_MS) != 1) {
        fz_fail("connect to the victim did not complete");
    }
}

/* Consumes what the victim sent: every header must pass its checks; an
 * ACK for requester QPN probe_qpn sets *answered.  0, or -1 if the victim
 * closed the connection. */
static int fz_drain_out(uint32_t probe_qpn, int *answered)
{
    uint8_t tmp[65536];

    for (;;) {
        ssize_t n = recv(fz.fd, tmp, sizeof(tmp), MSG_DONTWAIT);
        size_t off = 0;

        if (n == 0) {
            return -1;
        }
        if (n < 0) {
            if ((errno == EAGAIN) || (errno == EINTR)) {
                return 0;
            }
            return -1; /* reset */
        }
        while (off < (size_t)n) {
            size_t take;
            if (fz.out_skip > 0) {
                take = ((size_t)n - off < fz.out_skip) ? (size_t)n - off :
                                                        (size_t)fz.out_skip;
                fz.out_skip -= take;
                off         += take;
                continue;
            }
            take = sizeof(fz.out_hdr) - fz.out_got;
            take = ((size_t)n - off < take) ? (size_t)n - off : take;
            memcpy(fz.out_hdr + fz.out_got, tmp + off, take);
            fz.out_got += take;
            off        += take;
            if (fz.out_got == sizeof(fz.out_hdr)) {
                hca_tcp_hdr_t h;
                hca_tcp_hdr_err_t err;
                memcpy(&h, fz.out_hdr, sizeof(h));
                err = hca_tcp_hdr_check(&h);
                if (err != HCA_TCP_HDR_OK) {
                    fz_fail("the victim sent a frame that fails its own "
                            "check (%s): opcode %u length %u",
                            hca_tcp_hdr_err_name[err], h.opcode, h.length);
                }
                if ((h.opcode == HCA_TCP_OP_ACK) &&
                    (h.dst_qpn == probe_qpn)) {
                    *answered = 1;
                }
                if ((h.opcode == HCA_TCP_OP_ACK) &&
                    (h.syndrome == HCA_WC_SUCCESS) &&
                    (h.src_qpn == hca_qp_num(fz.req)) && !fz.proven) {
                    fz_fail("the connected QP served a connection that did "
                            "not prove it is its peer");
                }
                fz.out_got  = 0;
                fz.out_skip = h.length;
            }
        }
    }
}

/* Writes len bytes, draining the victim's answers meanwhile (it stops
 * reading when it cannot send them).  0, or -1 if it closed. */
static int fz_send(const void *p, size_t len)
{
    const uint8_t *b = p;
    double end       = fz_now_ms() + FZ_TCP_WAIT_MS;
    int dummy        = 0;

    while (len > 0) {
        ssize_t n = send(fz.fd, b, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        struct pollfd pfd;

        if (n > 0) {
            b   += n;
            len -= (size_t)n;
            continue;
        }
        if ((n < 0) && (errno != EAGAIN) && (errno != EINTR)) {
            return -1;
        }
        if (fz_drain_out(0, &dummy) < 0) {
            return -1;
        }
        fz_victim_poll_tcp(); /* a parked SEND waits for its ring */
        if (fz_now_ms() > end) {
            fz_fail("the victim took no bytes for %d ms", FZ_TCP_WAIT_MS);
        }
        pfd.fd     = fz.fd;
        pfd.events = POLLOUT | POLLIN;
        (void)poll(&pfd, 1, 1);
    }
    return 0;
}

/* Waits until the victim closes the connection (after a bad header or a
 * refused hello). */
static void fz_wait_closed(const char *why)
{
    double end = fz_now_ms() + FZ_TCP_WAIT_MS;
    int dummy  = 0;

    while (fz_drain_out(0, &dummy) == 0) {
        struct pollfd pfd = {.fd = fz.fd, .events = POLLIN};
        if (fz_now_ms() > end) {
            fz_fail("the victim did not close the connection after %s", why);
        }
        fz_victim_poll_tcp();
        (void)poll(&pfd, 1, 1);
    }
    fz_close();
}

/* Reads one handshake message of the victim into *ans. */
static void fz_hello_recv(hca_tcp_hello_t *ans, unsigned expect)
{
    size_t got = 0;
    double end = fz_now_ms() + FZ_TCP_WAIT_MS;

    while (got < sizeof(*ans)) {
        struct pollfd pfd = {.fd = fz.fd, .events = POLLIN};
        ssize_t n = recv(fz.fd, (uint8_t*)ans + got, sizeof(*ans) - got,
                         MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if ((n == 0) || ((errno != EAGAIN) && (errno != EINTR))) {
            fz_fail("the victim closed without answering the hello "
                    "(expected status %u)", expect);
        }
        if (fz_now_ms() > end) {
            fz_fail("no answer to the hello in %d ms", FZ_TCP_WAIT_MS);
        }
        (void)poll(&pfd, 1, 10);
    }
}

/* The victim's answer: the expected status, and a refusal names nobody. */
static void fz_hello_answer(const hca_tcp_hello_t *ans, unsigned expect,
                            unsigned step)
{
    if (!hca_tcp_hello_check(ans) || (ans->status != expect) ||
        (ans->step != step)) {
        fz_fail("hello answer: status %u step %u (expected %u, %u)",
                ans->status, ans->step, expect, step);
    }
    if ((expect != HCA_TCP_HELLO_OK) &&
        ((ans->src_host | ans->src_pid | ans->src_ctx | ans->dst_host |
          ans->dst_pid | ans->dst_ctx | ans->nonce | ans->mac |
          ans->proof) != 0)) {
        fz_fail("a refusal names pid %u ctx %u", ans->src_pid, ans->src_ctx);
    }
}

/* The handshake: HELLO h goes out, the CHALLENGE must say what is wrong
 * with it (or OK, proving the victim knows its secret); then the PROOF
 * (its MAC right unless raw_mac, its identity proof right unless
 * raw_proof), whose VERDICT must match.  1 if the connection is up. */
static int fz_hello(const hca_tcp_hello_t *h, int raw_mac, uint64_t mac,
                    int raw_proof, uint64_t proof)
{
    hca_tcp_hello_t ans, p;
    hca_tcp_transcript_t t;
    unsigned expect;

    fz.proven = 0;
    if (!hca_tcp_hello_check(h) || (h->step != HCA_TCP_STEP_HELLO)) {
        expect = HCA_TCP_HELLO_BAD_VERSION;
    } else if (h->dst_host != fz.addr.host) {
        expect = HCA_TCP_HELLO_WRONG_HOST;
    } else if ((h->dst_pid != fz.addr.pid) ||
               (h->dst_ctx != fz.addr.ctx_id)) {
        expect = HCA_TCP_HELLO_NO_CONTEXT;
    } else {
        expect = HCA_TCP_HELLO_OK;
    }
    if (fz_send(h, sizeof(*h)) != 0) {
        fz_fail("the victim closed before the hello's answer");
    }
    fz_hello_recv(&ans, expect);
    fz_hello_answer(&ans, expect, HCA_TCP_STEP_CHALLENGE);
    if (expect != HCA_TCP_HELLO_OK) {
        fz_wait_closed("a refused hello");
        return 0;
    }
    memset(&t, 0, sizeof(t));
    t.nonce_c   = h->nonce;
    t.nonce_a   = ans.nonce;
    t.conn_host = h->src_host;
    t.conn_pid  = h->src_pid;
    t.conn_ctx  = h->src_ctx;
    t.acc_host  = fz.addr.host;
    t.acc_pid   = fz.addr.pid;
    t.acc_ctx   = fz.addr.ctx_id;
    t.conn_incarn = h->incarn;
    t.acc_incarn  = ans.incarn;
    if ((ans.src_host != fz.addr.host) || (ans.src_pid != fz.addr.pid) ||
        (ans.src_ctx != fz.addr.ctx_id) ||
        (ans.mac != hca_tcp_mac(fz.addr.secret, HCA_TCP_MAC_ACCEPTOR, &t))) {
        fz_fail("the challenge does not prove the victim's identity");
    }
    memset(&p, 0, sizeof(p));
    p.magic    = HCA_TCP_MAGIC;
    p.version  = HCA_TCP_VERSION;
    p.step     = HCA_TCP_STEP_PROOF;
    p.src_host = h->src_host;
    p.src_pid  = h->src_pid;
    p.src_ctx  = h->src_ctx;
    p.mac      = raw_mac ? mac : hca_tcp_mac(fz.addr.secret,
                                             HCA_TCP_MAC_CONNECTOR, &t);
    p.proof    = raw_proof ? proof : hca_tcp_mac(fz.addr.secret,
                                                 HCA_TCP_MAC_IDENTITY, &t);
    expect = (p.mac == hca_tcp_mac(fz.addr.secret, HCA_TCP_MAC_CONNECTOR,
                                   &t)) ? HCA_TCP_HELLO_OK :
                                          HCA_TCP_HELLO_BAD_SECRET;
    if (fz_send(&p, sizeof(p)) != 0) {
        fz_fail("the victim closed before the proof's answer");
    }
    fz_hello_recv(&ans, expect);
    fz_hello_answer(&ans, expect, HCA_TCP_STEP_VERDICT);
    if (expect != HCA_TCP_HELLO_OK) {
        fz_wait_closed("a refused proof");
        return 0;
    }
    /* the RTS QP's peer is the victim itself: its secret proves it */
    fz.proven = (h->src_host == fz.addr.host) && (h->src_pid == fz.addr.pid) &&
                (h->src_ctx == fz.addr.ctx_id) &&
                (p.proof == hca_tcp_mac(fz.addr.secret, HCA_TCP_MAC_IDENTITY,
                                        &t));
    return 1;
}

static void fz_good_hello(hca_tcp_hello_t *h)
{
    memset(h, 0, sizeof(*h));
    h->magic    = HCA_TCP_MAGIC;
    h->version  = HCA_TCP_VERSION;
    h->step     = HCA_TCP_STEP_HELLO;
    h->src_host = 0xf022f022ull;
    h->src_pid  = (uint32_t)getpid();
    h->src_ctx  = 0xf022;
    h->dst_host = fz.addr.host;
    h->dst_pid  = fz.addr.pid;
    h->dst_ctx  = fz.addr.ctx_id;
    h->nonce    = 0x6e6f6e63650000ull + fz.probe;
}

/* ---------------------------------------------------------------- checks */

/* The promises of a header that passes hca_tcp_hdr_check: what the
 * responder relies on without checking again. */
static void fz_hdr_promises(const hca_tcp_hdr_t *h)
{
    static const uint8_t allowed[HCA_TCP_OP_LAST] = {
        [HCA_TCP_OP_SEND]      = HCA_TCP_F_FIRST | HCA_TCP_F_LAST |
                                 HCA_TCP_F_IMM | HCA_TCP_F_START,
        [HCA_TCP_OP_WRITE]     = HCA_TCP_F_LAST | HCA_TCP_F_IMM |
                                 HCA_TCP_F_START | HCA_TCP_F_STRIPED,
        [HCA_TCP_OP_READ]      = HCA_TCP_F_START | HCA_TCP_F_STRIPED,
        [HCA_TCP_OP_ATOMIC]    = HCA_TCP_F_ATOMIC32 | HCA_TCP_F_START,
        [HCA_TCP_OP_READ_RESP] = HCA_TCP_F_LAST | HCA_TCP_F_STRIPED,
    };
    uint64_t end = (uint64_t)h->offset + h->length;
    int part     = (h->opcode == HCA_TCP_OP_SEND) ||
                   (h->opcode == HCA_TCP_OP_WRITE) ||
                   (h->opcode == HCA_TCP_OP_READ_RESP);

    if ((h->version != HCA_TCP_VERSION) || (h->opcode == 0) ||
        (h->opcode >= HCA_TCP_OP_LAST) ||
        (h->flags & ~allowed[h->opcode]) ||
        ((h->opcode != HCA_TCP_OP_ACK) && (h->syndrome != 0)) ||
        ((h->syndrome >= HCA_WC_STATUS_LAST) &&
         (h->syndrome != HCA_TCP_SYN_PSN_SEQ))) {
        fz_fail("hdr_check passed a bad version, opcode, flags or syndrome");
    }
    if ((h->opcode == HCA_TCP_OP_WRITE) && (h->flags & HCA_TCP_F_STRIPED) &&
        ((h->flags & HCA_TCP_F_IMM) || (h->offset % HCA_TCP_SEG_MAX != 0))) {
        /* a striped part is placed out of order: whole parts, no notice */
        fz_fail("hdr_check passed a striped WRITE part with a notice or "
                "cut mid-part");
    }
    if ((h->length > HCA_TCP_SEG_MAX) ||
        ((h->opcode == HCA_TCP_OP_SEND) && (h->length > HCA_TCP_SEND_MAX)) ||
        (!part && (h->length != 0))) {
        fz_fail("hdr_check passed length %u for opcode %u", h->length,
                h->opcode);
    }
    if (part && ((end > h->total) || (h->total > HCA_MAX_MSG) ||
                 (((h->flags & HCA_TCP_F_LAST) != 0) != (end == h->total)))) {
        fz_fail("hdr_check passed a part [%u, +%u) of %u", h->offset,
                h->length, h->total);
    }
    /* a WRITE's or READ's remote range, and the size a READ asks for,
     * are the request's: the responder checks them (a NAK), not this */
    if ((h->opcode == HCA_TCP_OP_WRITE) &&
        (h->flags & HCA_TCP_F_IMM) && !(h->flags & HCA_TCP_F_LAST)) {
        fz_fail("hdr_check passed a WRITE that has IMM early");
    }
    if ((h->opcode == HCA_TCP_OP_SEND) &&
        (((h->flags & HCA_TCP_F_FIRST) != 0) != (h->offset == 0))) {
        fz_fail("hdr_check passed a SEND whose FIRST and offset disagree");
    }
    if ((h->opcode == HCA_TCP_OP_READ) && (h->offset > h->total)) {
        fz_fail("hdr_check passed a READ at offset %u of %u", h->offset,
                h->total);
    }
}

static void fz_check_pure(const uint8_t *data, size_t size)
{
    hca_tcp_hdr_t h;
    hca_tcp_hello_t hello;
    int ok;

    memset(&h, 0, sizeof(h));
    memcpy(&h, data, (size < sizeof(h)) ? size : sizeof(h));
    if (hca_tcp_hdr_check(&h) == HCA_TCP_HDR_OK) {
        fz_hdr_promises(&h);
    }
    /* and shifted by one: the frame bytes after the mode byte */
    if (size > 1) {
        memset(&h, 0, sizeof(h));
        memcpy(&h, data + 1, (size - 1 < sizeof(h)) ? size - 1 : sizeof(h));
        if (hca_tcp_hdr_check(&h) == HCA_TCP_HDR_OK) {
            fz_hdr_promises(&h);
        }
    }
    memset(&hello, 0, sizeof(hello));
    memcpy(&hello, data, (size < sizeof(hello)) ? size : sizeof(hello));
    ok = hca_tcp_hello_check(&hello);
    if (ok != ((hello.magic == HCA_TCP_MAGIC) &&
               (hello.version == HCA_TCP_VERSION) &&
               (hello.status < HCA_TCP_HELLO_LAST) &&
               (hello.step >= HCA_TCP_STEP_HELLO) &&
               (hello.step < HCA_TCP_STEP_LAST))) {
        fz_fail("hello_check says %d of magic %x version %u status %u", ok,
                hello.magic, hello.version, hello.status);
    }
}

/* ---------------------------------------------------------------- frames */

static void fz_shape(hca_tcp_hdr_t *h, uint8_t sel, uint8_t sel2)
{
    static const uint8_t allowed[HCA_TCP_OP_LAST] = {
        [HCA_TCP_OP_SEND]      = HCA_TCP_F_FIRST | HCA_TCP_F_LAST |
                                 HCA_TCP_F_IMM | HCA_TCP_F_START,
        [HCA_TCP_OP_WRITE]     = HCA_TCP_F_LAST | HCA_TCP_F_IMM |
                                 HCA_TCP_F_START | HCA_TCP_F_STRIPED,
        [HCA_TCP_OP_READ]      = HCA_TCP_F_START | HCA_TCP_F_STRIPED,
        [HCA_TCP_OP_ATOMIC]    = HCA_TCP_F_ATOMIC32 | HCA_TCP_F_START,
        [HCA_TCP_OP_READ_RESP] = HCA_TCP_F_LAST | HCA_TCP_F_STRIPED,
    };
    static const uint8_t atomics[] = {
        HCA_WR_ATOMIC_CMP_SWP, HCA_WR_ATOMIC_FETCH_ADD, HCA_WR_ATOMIC_ADD,
        HCA_WR_ATOMIC_FETCH_AND, HCA_WR_ATOMIC_AND, HCA_WR_ATOMIC_FETCH_OR,
        HCA_WR_ATOMIC_OR, HCA_WR_ATOMIC_FETCH_XOR, HCA_WR_ATOMIC_XOR,
        HCA_WR_ATOMIC_SWAP
    };
    uint32_t limit = (sel2 & 1) ? HCA_TCP_SEG_MAX : 8192;
    uint64_t mr    = (uint64_t)(uintptr_t)(fz.buf + FZ_TCP_PAD);

    h->version = HCA_TCP_VERSION;
    h->opcode  = (uint8_t)(1 + h->opcode % (HCA_TCP_OP_LAST - 1));
    if (h->opcode == HCA_TCP_OP_ACK) {
        /* a status, or (bit 7) "expected psn": go back to it */
        h->syndrome = (h->syndrome & 0x80) ? HCA_TCP_SYN_PSN_SEQ :
                      h->syndrome % HCA_WC_STATUS_LAST;
    } else {
        h->syndrome = 0;
    }
    if (!(sel & 0x80)) {
        h->flags &= allowed[h->opcode];
    }
    switch (h->opcode) {
    case HCA_TCP_OP_SEND:
        h->length %= HCA_TCP_SEND_MAX + 1;
        break;
    case HCA_TCP_OP_WRITE:
    case HCA_TCP_OP_READ_RESP:
        h->length %= limit + 1;
        break;
    default:
        h->length = 0;
        break;
    }
    if (sel & 0x40) {
        if (h->opcode == HCA_TCP_OP_READ) {
            h->total %= FZ_TCP_MR + 64;
            h->offset %= h->total + 1; /* an answer from there on */
        } else {
            h->offset %= 65536;
            if (h->opcode == HCA_TCP_OP_SEND) {
                if (h->flags & HCA_TCP_F_FIRST) {
                    h->offset = 0;
                } else if (h->offset == 0) {
                    h->offset = 1;
                }
            }
            h->total = h->offset + h->length +
                       ((h->flags & HCA_TCP_F_LAST) ? 0 : 1 + h->total % 4096);
        }
    }
    switch (sel & 3) {
    case 2:
        h->dst_qpn = hca_qp_num(fz.req);
        break;
    case 3:
        break;
    default:
        h->dst_qpn = hca_qp_num(fz.target);
        break;
    }
    if (((sel >> 2) & 3) == 2) {
        h->src_qpn = hca_qp_num(fz.target); /* the RTS QP's peer */
    } else if (((sel >> 2) & 3) != 3) {
        h->src_qpn = 1 + ((sel >> 2) & 3);
    } else if ((h->src_qpn & 0xfff00000u) == FZ_TCP_PROBE) {
        h->src_qpn ^= 0x00100000u; /* never a probe's */
    }
    if (!(sel & 0x10)) {
        h->rkey = hca_mr_rkey(fz.mr);
    }
    if (!(sel & 0x20)) {
        h->remote_addr = mr + h->remote_addr % (FZ_TCP_MR + 64) - 32;
        if (sel2 & 2) {
            h->remote_addr &= ~7ull;
        }
    }
    if (!(sel2 & 4)) {
        h->atomic_op = atomics[h->atomic_op % sizeof(atomics)];
    }
}

/* Sends a probe: a zero-length WRITE from a fresh requester QPN, which
 * the victim answers once it has consumed everything before it. */
static uint32_t fz_probe_send(void)
{
    hca_tcp_hdr_t h;

    memset(&h, 0, sizeof(h));
    h.version = HCA_TCP_VERSION;
    h.opcode  = HCA_TCP_OP_WRITE;
    h.flags   = HCA_TCP_F_LAST | HCA_TCP_F_START; /* its only frame */
    h.src_qpn = FZ_TCP_PROBE + (++fz.probe & 0xfffff);
    h.dst_qpn = hca_qp_num(fz.target);
    if (fz_send(&h, sizeof(h)) != 0) {
        return 0;
    }
    return h.src_qpn;
}

/* 1 once the victim answered a probe, 0 if it closed the connection. */
static int fz_wait_probe(void)
{
    double start = fz_now_ms(), next = start + 1000;
    uint32_t probe = fz_probe_send();
    int answered   = 0;

    while (probe != 0) {
        struct pollfd pfd = {.fd = fz.fd, .events = POLLIN};
        if (fz_drain_out(probe, &answered) < 0) {
            return 0;
        }
        if (answered) {
            return 1;
        }
        fz_victim_poll_tcp();
        if (fz_now_ms() > start + FZ_TCP_WAIT_MS) {
            fz_fail("the victim answered no probe in %d ms: it stalls",
                    FZ_TCP_WAIT_MS);
        }
        if (fz_now_ms() > next) {
            /* a frame of the input may have taken the probe's QPN: its
             * requester was refused and its frames are dropped */
            probe = fz_probe_send();
            next  = fz_now_ms() + 1000;
        }
        (void)poll(&pfd, 1, 1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t payload[HCA_TCP_SEG_MAX];
    fz_in_t in = {data, size};
    uint8_t mode;
    int closed = 0;

    fz_check_pure(data, size);
    mode = fz_u8(&in);

    if ((mode & 2) && (fz.fd >= 0)) {
        fz_close(); /* this input's hello opens a new connection */
    }
    if (fz.fd < 0) {
        hca_tcp_hello_t h;
        uint8_t sel     = 0;
        uint64_t mac    = 0, proof = 0;
        fz_good_hello(&h);
        fz_connect();
        if (mode & 2) {
            hca_tcp_hello_t raw;
            for (size_t i = 0; i < sizeof(raw); ++i) {
                ((uint8_t*)&raw)[i] = fz_u8(&in);
            }
            sel = fz_u8(&in);
            if (mode & 4) {
                raw.magic    = h.magic;
                raw.version  = h.version;
                raw.step     = h.step;
                raw.dst_host = h.dst_host;
                raw.dst_pid  = h.dst_pid;
                raw.dst_ctx  = h.dst_ctx;
                raw.status  %= HCA_TCP_HELLO_LAST;
            }
            if (sel & 4) {
                raw.src_host = fz.addr.host; /* the RTS QP's peer */
                raw.src_pid  = fz.addr.pid;
                raw.src_ctx  = fz.addr.ctx_id;
            }
            for (int i = 0; i < 8; ++i) {
                mac |= (uint64_t)fz_u8(&in) << (8 * i);
            }
            for (int i = 0; i < 8; ++i) {
                proof |= (uint64_t)fz_u8(&in) << (8 * i);
            }
            h = raw;
        }
        if (!fz_hello(&h, sel & 1, mac, sel & 2, proof)) {
            return 0;
        }
    }

    for (int f = 0; (f < FZ_TCP_FRAMES) && (in.n > 0) && !closed; ++f) {
        hca_tcp_hdr_t h;
        uint8_t sel = 0, sel2 = 0;
        size_t len;

        if (mode & 1) {
            sel  = fz_u8(&in);
            sel2 = fz_u8(&in);
        }
        for (size_t i = 0; i < sizeof(h); ++i) {
            ((uint8_t*)&h)[i] = fz_u8(&in);
        }
        if (mode & 1) {
            fz_shape(&h, sel, sel2);
        }
        if (fz_send(&h, sizeof(h)) != 0) {
            closed = 1;
            break;
        }
        if (hca_tcp_hdr_check(&h) != HCA_TCP_HDR_OK) {
            fz_wait_closed("a bad header");
            return 0;
        }
        if (h.opcode == HCA_TCP_OP_BYE) {
            fz_wait_closed("a BYE"); /* "we close our context" */
            return 0;
        }
        len = (h.length < in.n) ? h.length : in.n;
        memcpy(payload, in.p, len);
        memset(payload + len, 0, h.length - len);
        in.p += len;
        in.n -= len;
        if (fz_send(payload, h.length) != 0) {
            closed = 1;
        }
    }
    if (closed || !fz_wait_probe()) {
        /* only a bad header closes: every header sent here passed */
        fz_fail("the victim closed a connection whose headers passed "
                "hca_tcp_hdr_check");
    }
    fz_victim_poll_tcp();
    fz_guard_check();
    return 0;
}
