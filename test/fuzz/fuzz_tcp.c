/*
 * fuzz_tcp.c - libFuzzer harness: frames of the tcp fabric's wire
 * protocol (hca_tcp_wire.h) from a raw client socket, read and executed by
 * a device context's fabric thread (hca_tcp_rx.c -> hca_tcp_resp.c), the
 * handshake with its X25519 key exchange and its proofs (hca_tcp_conn.c,
 * hca_tcp_path.c: RESUME, JOIN), and the pure header and hello checks
 * (hca_tcp_hdr_check, hca_tcp_hello_check) called directly.
 *
 * The victim is a context opened in tcp mode on "lo" with a QP in RTR that
 * accepts any source (receives posted, for SENDs and WRITE_IMM), a QP in
 * RTS connected to it (what ACK and READ_RESP frames may name), and an MR
 * of FZ_TCP_MR bytes inside a buffer whose FZ_TCP_PAD bytes either side
 * must never change.  The client completes the handshake (its four
 * messages, the MACs keyed by the victim's secret, its own ephemeral
 * X25519 key) and keeps its connection across inputs; when the victim
 * closes it (a malformed header), the next input reconnects.  The harness
 * remembers its previous connection (the last whose handshake it
 * completed): the session key it derived, its claim (host, pid, ctx) and
 * incarnation, whether it proved the RTS QP's peer, and whether it was the
 * harness that closed it - the victim then keeps a connection with an
 * incarnation in LINKING for the retry timeout, which a RESUME proving
 * that key takes back, and a JOIN proving it shares its records.
 *
 * Input (little-endian; what runs short reads zeros):
 *
 *   u8 mode   bit 0: "shaped": every frame is made mostly well formed (see
 *             below); else the frames are raw bytes
 *             bit 1: the handshake of a new connection comes from the
 *             input: a HELLO section (below)
 *             bit 2: with bit 1, the HELLO's magic, version, step and
 *             destination are fixed, its status taken modulo the
 *             statuses, cont and reserved zeroed: it passes
 *             hca_tcp_hello_check
 *             bit 3: with bit 1, two HELLO sections: the connection of
 *             the first is made, its claim of the RTS QP's peer (if it
 *             makes one) checked by a zero-length WRITE to the RTS QP from
 *             the peer's QPN - served exactly when it proved that peer -
 *             and closed by the harness; then the second's, which the
 *             frames follow (a RESUME or JOIN of the first within one
 *             input)
 *             bit 4: with bit 3, the first connection stays open until
 *             the second's handshake is over (the victim still has it UP:
 *             a RESUME takes it over, as after a socket lost unseen)
 *             bit 5: with bit 3, three HELLO sections: two first
 *             connections, each made, checked and closed in turn (bit 4
 *             keeps the second of them open), then the third's: a
 *             continuation of a resumed session with the key before its
 *             last (sel 6, 7) within one input
 *             bit 6: with bit 3, the last first connection stops after
 *             its CHALLENGE (it is the previous connection: its key known,
 *             no session at the victim yet); the next one's handshake
 *             runs whole (a JOIN of that key: the victim groups the two
 *             when the first comes UP), stays open, and then the first's
 *             PROOF and VERDICT (as its section's sel says: a RESUME or
 *             JOIN of the previous connection now names the second),
 *             which the frames follow - as a connector that dials a
 *             pair's paths at once
 *   HELLO section (193 bytes):
 *     144 bytes  the HELLO (hca_tcp_hello_t), raw
 *     u8 sel     bit 0: the PROOF's mac is the section's (not the
 *                victim's secret's MAC: BAD_SECRET unless it is right)
 *                bit 1: its identity proof is the section's (else
 *                MAC(victim's secret; IDENTITY): valid)
 *                bit 2: the HELLO claims the victim's own identity - the
 *                peer of its RTS QP, whose requests pass the identity
 *                check only with a valid proof (src_qpn selector 2 names
 *                that peer's QPN)
 *                bit 3: the HELLO's kx is the section's (BAD_KEY exactly
 *                when it is a low-order point; the harness then knows no
 *                session key); else the harness's own ephemeral key
 *                bits 4-6: what the PROOF continues: 0 nothing; 1 RESUME,
 *                2 JOIN with the section's cont_mac; 3 RESUME, 4 JOIN with
 *                cont_mac = MAC(the previous connection's session key;
 *                RESUME or JOIN) (the section's if there is none); 5 a
 *                cont byte >= HCA_TCP_CONT_LAST (BAD_VERSION); 6 RESUME,
 *                7 JOIN with the MAC of the key before it (what the
 *                victim keeps of a resumed connection: the key its RESUME
 *                proved - a connector whose VERDICT was lost has only
 *                that one; else the key itself)
 *                bit 7: the HELLO takes the claim and the incarnation of
 *                the previous connection; with bit 2, the victim's
 *                identity and the victim's own incarnation (from its
 *                CHALLENGEs)
 *     16 bytes   mac, 16 bytes proof, 16 bytes cont_mac (for sel above)
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
 * status that matches what was wrong with it (the CHALLENGE: the HELLO's
 * check, host, context, key; the VERDICT: the PROOF's check, mac_c, and
 * for a RESUME whether it proves a session the victim still has - NO_CONTEXT
 * if not - and, if that session proved the RTS QP's peer, a valid proof
 * again: BAD_SECRET; a JOIN is always taken); a refusal names nobody (no
 * identity, nonce, incarnation, key or MAC) and closes; an accepted
 * CHALLENGE proves the victim knows its secret and brings a fresh key that
 * is not low-order, an OK VERDICT to a RESUME carries MAC(that session's
 * key; RESUMED); the RTS QP never answers SUCCESS to a connection
 * whose identity is not proven;
 * the victim answers a probe (a zero-length WRITE from a fresh requester
 * QPN, sent after the input's frames) within FZ_TCP_WAIT_MS, i.e. it has
 * consumed everything - or it closed the connection after a bad header.
 * Where time decides (a LINKING connection near the end of its retry
 * timeout, a claimed local pid that is gone), where the victim's caps of
 * established connections may have closed one right after its VERDICT OK
 * (it does so only when all it holds are proven: the harness counts its
 * own that may be, fz_admit_unsure), and for a RESUME of a
 * connection without an incarnation that is still UP (see
 * fz_resume_expect), either answer is taken, and the details of the one
 * that came are checked.
 *
 * HCA_FUZZ_VERBOSE=1 prints each handshake message and frame as sent and
 * what the victim answered; every run prints at exit how many handshakes
 * got which CHALLENGE and VERDICT, by what their PROOF continued.
 */
#include "fuzz_common.h"
#include "hca_tcp_fabric.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
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
/* a LINKING connection dies a retry timeout after the last byte the victim
 * read from it: within this much of that the harness is unsure */
#define FZ_TCP_EARLY_MS 1500
#define FZ_TCP_LATE_MS  3000
#define FZ_TCP_HELD     32768 /* closed connections counted (below) */

/* mode bits */
#define FZ_M_SHAPED     0x01
#define FZ_M_HELLO      0x02
#define FZ_M_HELLO_FIX  0x04
#define FZ_M_TWICE      0x08
#define FZ_M_KEEP       0x10
#define FZ_M_THRICE     0x20
#define FZ_M_INTERLEAVE 0x40
/* HELLO section sel bits */
#define FZ_H_RAW_MAC    0x01
#define FZ_H_RAW_PROOF  0x02
#define FZ_H_CLAIM_PEER 0x04
#define FZ_H_RAW_KX     0x08
#define FZ_H_CONT_SHIFT 4
#define FZ_H_CLAIM_PREV 0x80

/* what a PROOF continues (sel bits 4-6), as counted */
enum {
    FZ_C_NONE, FZ_C_RESUME_RAW, FZ_C_JOIN_RAW, FZ_C_RESUME, FZ_C_JOIN,
    FZ_C_BAD, FZ_C_RESUME_OLD, FZ_C_JOIN_OLD, FZ_C_KINDS
};
static const char *const fz_cont_name[FZ_C_KINDS] = {
    "none", "resume-raw", "join-raw", "resume", "join", "bad-cont",
    "resume-old", "join-old"
};
static const char *const fz_status_name[HCA_TCP_HELLO_LAST] = {
    "OK", "BAD_VERSION", "WRONG_HOST", "NO_CONTEXT", "BAD_SECRET", "BAD_KEY"
};

/* A HELLO section of the input (or the harness's own hello), and its
 * handshake once the CHALLENGE came. */
typedef struct fz_hs {
    hca_tcp_hello_t h;
    uint8_t         sel;
    uint8_t         mac[HCA_TCP_MAC_LEN];
    uint8_t         proof[HCA_TCP_MAC_LEN];
    uint8_t         cont_mac[HCA_TCP_MAC_LEN];
    int             own_kx;     /* h.kx is the harness's: key is known */
    hca_tcp_transcript_t t;
    uint8_t         key[HCA_TCP_KEY_LEN];
} fz_hs_t;

/* The last connection whose handshake the harness completed. */
typedef struct fz_prev {
    int      valid;
    int      has_key;    /* its session key is known (our own kx) */
    uint8_t  key[HCA_TCP_KEY_LEN];
    uint8_t  key_prev[HCA_TCP_KEY_LEN]; /* the one before, as the victim
                            keeps it: a resumed connection's, the key its
                            RESUME proved; else the key itself */
    uint64_t host;       /* its claim */
    uint32_t pid, ctx;
    uint64_t incarn;
    int      proven;     /* it proved the RTS QP's peer: claim and proof */
    int      verified;   /* the victim is known to have checked that (its
                            RTS QP served it, or refused a RESUME of it
                            without the proof) */
    int      linking;    /* the harness closed it, not the victim: with an
                            incarnation, the victim waits for its RESUME */
    int      open;       /* its socket is still open (mode bit 4): UP at
                            the victim */
    int      refusable;  /* closed before it was known to be admitted: the
                            victim may have closed it at its caps */
    int      pending;    /* its handshake waits after the CHALLENGE (mode
                            bit 6): the victim has its key, no session */
    double   last_tx_ms; /* the last bytes sent on it */
} fz_prev_t;

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
    int             keep_fd;    /* a first connection kept open, or -1 */
    int             up;         /* fd is prev's connection (handshake done) */
    uint32_t        probe;      /* probes sent */
    int             proven;     /* the connection proved it is the victim's
                                   RTS QP's peer (the victim itself) */
    uint32_t        id_psn;     /* the identity check's WRITE ... */
    int             id_answer;  /* ... and its ACK's syndrome (-1: none) */
    uint32_t        id_count;
    uint64_t        victim_incarn; /* from its CHALLENGEs (0: none yet) */
    uint8_t         last_kx_a[HCA_TCP_KX_LEN]; /* its last CHALLENGE's */
    fz_prev_t       prev;
    int             keep_proven; /* the kept connection proved the peer, */
    uint64_t        keep_incarn; /* with this incarnation, */
    int             keep_moved;  /* and a RESUME took its session over */
    /* the harness's closed connections the victim may still hold
     * established (LINKING) and proven, by when it surely dropped each (in
     * order): over a cap of established connections all proven, the
     * victim closes a newcomer right after its VERDICT OK */
    double          held_until[FZ_TCP_HELD];
    uint32_t        held_head, held_tail;
    int             admit_unsure; /* the connection may be closed so */
    /* the victim's frames, as they come: header, then its payload */
    uint8_t         out_hdr[sizeof(hca_tcp_hdr_t)];
    size_t          out_got;
    uint64_t        out_skip;
    /* what the handshakes got */
    unsigned long   challenges[HCA_TCP_HELLO_LAST];
    unsigned long   verdicts[FZ_C_KINDS][HCA_TCP_HELLO_LAST];
    unsigned long   joined_prev; /* JOINs of the previous connection's
                                    session with its claim: OK */
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

/* At exit: what the handshakes got (how far a run reached into the key
 * exchange and the proofs). */
static void fz_summary(void)
{
    fprintf(stderr, "fuzz_tcp: CHALLENGEs:");
    for (int s = 0; s < HCA_TCP_HELLO_LAST; ++s) {
        fprintf(stderr, " %s %lu", fz_status_name[s], fz.challenges[s]);
    }
    fprintf(stderr, "\n");
    for (int c = 0; c < FZ_C_KINDS; ++c) {
        fprintf(stderr, "fuzz_tcp: VERDICTs to cont %-10s:", fz_cont_name[c]);
        for (int s = 0; s < HCA_TCP_HELLO_LAST; ++s) {
            fprintf(stderr, " %s %lu", fz_status_name[s], fz.verdicts[c][s]);
        }
        fprintf(stderr, "\n");
    }
    fprintf(stderr, "fuzz_tcp: JOINs of a session the victim has: %lu\n",
            fz.joined_prev);
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
    fz.fd      = -1;
    fz.keep_fd = -1;
    atexit(fz_summary);
    return 0;
}

/* ---------------------------------------------------------------- socket */

/* Closes the client socket; `by_victim`: the victim closed it first (a bad
 * header, a BYE: it killed the connection) - else the harness does, and
 * the victim sees a lost socket. */
/* A connection that may be proven at the victim was closed by the harness
 * (with an incarnation: it waits in LINKING, for the retry timeout). */
static void fz_held_add(void)
{
    fz.held_until[fz.held_tail++ % FZ_TCP_HELD] =
        fz_now_ms() + hca_tcp_dev(fz.dev)->timeout_ms + FZ_TCP_LATE_MS;
    if (fz.held_tail - fz.held_head > FZ_TCP_HELD) {
        fz.held_head = fz.held_tail - FZ_TCP_HELD;
    }
}

/* Whether the victim may refuse a newcomer at its cap of established
 * connections: it does so only when every one it holds is proven. */
static int fz_admit_unsure(void)
{
    const hca_tcp_dev_t *tcp = hca_tcp_dev(fz.dev);
    uint32_t cap = (tcp->conn_src_max < tcp->conn_max) ? tcp->conn_src_max :
                                                         tcp->conn_max;
    double now   = fz_now_ms();
    uint32_t n;

    while ((fz.held_head != fz.held_tail) &&
           (fz.held_until[fz.held_head % FZ_TCP_HELD] < now)) {
        fz.held_head++;
    }
    /* and the victim's own connection to itself, and one kept open */
    n = fz.held_tail - fz.held_head + 1 +
        (uint32_t)((fz.keep_fd >= 0) && fz.keep_proven && !fz.keep_moved);
    return n >= cap;
}

static void fz_close_fd(int by_victim)
{
    if (fz.fd >= 0) {
        close(fz.fd);
        fz.fd = -1;
    }
    if (fz.up) {
        fz.prev.linking   = !by_victim;
        fz.prev.open      = 0;
        fz.prev.refusable = fz.admit_unsure;
        if (!by_victim && fz.prev.proven && (fz.prev.incarn != 0)) {
            fz_held_add();
        }
    }
    fz.admit_unsure = 0;
    fz.up       = 0;
    fz.proven   = 0;
    fz.out_got  = 0;
    fz.out_skip = 0;
}

static void fz_close(void)
{
    fz_close_fd(0);
}

/* The first connection of a two-HELLO input stays open (mode bit 4): the
 * victim has it UP while the second's handshake runs. */
static void fz_keep(void)
{
    fz.keep_proven  = fz.prev.proven;
    fz.keep_incarn  = fz.prev.incarn;
    fz.keep_moved   = 0;
    fz.prev.refusable = fz.admit_unsure;
    fz.admit_unsure = 0;
    fz.keep_fd      = fz.fd;
    fz.fd           = -1;
    fz.up           = 0;
    fz.proven       = 0;
    fz.out_got      = 0;
    fz.out_skip     = 0;
    fz.prev.open    = 1;
    fz.prev.linking = 0;
}

/* ... and is closed once the second's handshake is over: if the previous
 * connection is still that one (the second did not complete), the victim
 * sees its socket lost now.  (A RESUME of it moved its session onto the
 * second's socket: the victim closed this one.) */
static void fz_keep_close(void)
{
    if (fz.keep_fd < 0) {
        return;
    }
    close(fz.keep_fd);
    fz.keep_fd = -1;
    if (fz.prev.open) {
        fz.prev.open    = 0;
        fz.prev.linking = 1;
    }
    if (!fz.keep_moved && fz.keep_proven && (fz.keep_incarn != 0)) {
        fz_held_add();
    }
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
                if (fz_verbose()) {
                    printf("  victim: op %u flags 0x%x syndrome 0x%x len %u "
                           "src 0x%x dst 0x%x psn %u\n", h.opcode, h.flags,
                           h.syndrome, h.length, h.src_qpn, h.dst_qpn,
                           h.psn);
                }
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
                    (h.src_qpn == hca_qp_num(fz.req)) &&
                    (h.dst_qpn == hca_qp_num(fz.target)) &&
                    (h.psn == fz.id_psn)) {
                    fz.id_answer = h.syndrome;
                }
                if ((h.opcode == HCA_TCP_OP_ACK) &&
                    (h.syndrome == HCA_WC_SUCCESS) &&
                    (h.src_qpn == hca_qp_num(fz.req))) {
                    if (!fz.proven) {
                        fz_fail("the connected QP served a connection that "
                                "did not prove it is its peer");
                    }
                    /* so the victim holds this connection proven: a
                     * RESUME of it must prove it again */
                    fz.prev.verified |= fz.up;
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
            if (fz.up) {
                fz.prev.last_tx_ms = fz_now_ms();
            }
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
    fz_close_fd(1);
}

/* ---------------------------------------------------------------- hello */

static int fz_zero(const void *p, size_t len)
{
    const uint8_t *b = p;

    for (size_t i = 0; i < len; ++i) {
        if (b[i] != 0) {
            return 0;
        }
    }
    return 1;
}

static void fz_hello_print(const char *what, const hca_tcp_hello_t *h)
{
    if (!fz_verbose()) {
        return;
    }
    printf("%s: magic 0x%x version %u step %u status %u src %#llx/%u/%u "
           "dst %#llx/%u/%u nonce %#llx incarn %#llx cont %u kx %02x%02x.. "
           "mac %02x%02x.. proof %02x%02x.. cont_mac %02x%02x..\n", what,
           h->magic, h->version, h->step, h->status,
           (unsigned long long)h->src_host, h->src_pid, h->src_ctx,
           (unsigned long long)h->dst_host, h->dst_pid, h->dst_ctx,
           (unsigned long long)h->nonce, (unsigned long long)h->incarn,
           h->cont, h->kx[0], h->kx[1], h->mac[0], h->mac[1], h->proof[0],
           h->proof[1], h->cont_mac[0], h->cont_mac[1]);
}

/* Reads one handshake message of the victim into *ans. */
static void fz_hello_recv(hca_tcp_hello_t *ans, unsigned accept)
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
                    "(expected statuses 0x%x)", accept);
        }
        if (fz_now_ms() > end) {
            fz_fail("no answer to the hello in %d ms", FZ_TCP_WAIT_MS);
        }
        (void)poll(&pfd, 1, 10);
    }
    fz_hello_print("  victim", ans);
}

/* The victim's answer: a status of the mask `accept`, and a refusal names
 * nobody.  Neither answer carries what only a connector sends. */
static void fz_hello_answer(const hca_tcp_hello_t *ans, unsigned accept,
                            unsigned step)
{
    if (!hca_tcp_hello_check(ans) || !((accept >> ans->status) & 1) ||
        (ans->step != step)) {
        fz_fail("hello answer: status %u step %u (expected statuses 0x%x, "
                "step %u)", ans->status, ans->step, accept, step);
    }
    if ((ans->dst_host | ans->dst_pid | ans->dst_ctx) != 0 ||
        !fz_zero(ans->proof, sizeof(ans->proof)) ||
        !fz_zero(ans->cont_mac, sizeof(ans->cont_mac))) {
        fz_fail("the victim's step %u names a destination, a proof or a "
                "cont_mac", step);
    }
    if ((ans->status != HCA_TCP_HELLO_OK) &&
        (((ans->src_host | ans->src_pid | ans->src_ctx | ans->nonce |
           ans->incarn) != 0) || !fz_zero(ans->kx, sizeof(ans->kx)) ||
         !fz_zero(ans->mac, sizeof(ans->mac)))) {
        fz_fail("a refusal (status %u) names pid %u ctx %u, or carries a "
                "nonce, incarnation, key or MAC", ans->status, ans->src_pid,
                ans->src_ctx);
    }
    if ((ans->status == HCA_TCP_HELLO_OK) &&
        ((ans->src_host != fz.addr.host) || (ans->src_pid != fz.addr.pid) ||
         (ans->src_ctx != fz.addr.ctx_id))) {
        fz_fail("the victim's step %u names pid %u ctx %u, not itself", step,
                ans->src_pid, ans->src_ctx);
    }
}

/* A low-order X25519 point: the shared secret with it is all zero,
 * whatever the other side's secret. */
static int fz_low_order(const uint8_t pk[HCA_TCP_KX_LEN])
{
    uint8_t sk[crypto_scalarmult_SCALARBYTES], out[crypto_scalarmult_BYTES];
    int rc;

    randombytes_buf(sk, sizeof(sk));
    rc = crypto_scalarmult(out, sk, pk);
    return rc != 0;
}

/* A claimed pid of this host that is gone: the victim kills a LINKING
 * connection from it at its next timer pass. */
static int fz_pid_gone(uint64_t host, uint32_t pid)
{
    uint64_t start;
    int rc;

    if (host != fz.addr.host) {
        return 0;
    }
    rc = hca_proc_start_time(pid, &start);
    return (rc == -ESRCH) || (rc == -ENOENT);
}

/* The VERDICTs the victim may give a RESUME whose mac_c is right (a mask
 * of statuses); *proved: the previous connection's key (its last, or the
 * one before) that its cont_mac proves, else NULL. */
static unsigned fz_resume_expect(const hca_tcp_hello_t *h,
                                 const hca_tcp_hello_t *p,
                                 const hca_tcp_transcript_t *t, int proof_ok,
                                 const uint8_t **proved)
{
    const fz_prev_t *pv = &fz.prev;
    uint8_t mac[HCA_TCP_MAC_LEN];
    unsigned ok = 1u << HCA_TCP_HELLO_OK;
    double age;

    *proved = NULL;
    if (!pv->valid || !pv->has_key || pv->pending) {
        return 1u << HCA_TCP_HELLO_NO_CONTEXT;
    }
    hca_tcp_key_mac(mac, pv->key, HCA_TCP_MAC_RESUME, t);
    if (hca_tcp_mac_equal(p->cont_mac, mac)) {
        *proved = pv->key;
    } else {
        hca_tcp_key_mac(mac, pv->key_prev, HCA_TCP_MAC_RESUME, t);
        if (hca_tcp_mac_equal(p->cont_mac, mac)) {
            *proved = pv->key_prev; /* as after a VERDICT lost */
        }
    }
    /* the victim has the connection if it is UP (its socket still open
     * here), or LINKING: it lost its socket (the harness closed it: a bad
     * header or a BYE kills it) and can resume (an incarnation); and only
     * for the same claim */
    if ((*proved == NULL) || (!pv->open && !pv->linking) ||
        (!pv->open && (pv->incarn == 0)) ||
        (h->src_host != pv->host) || (h->src_pid != pv->pid) ||
        (h->src_ctx != pv->ctx) || (h->incarn != pv->incarn)) {
        return 1u << HCA_TCP_HELLO_NO_CONTEXT;
    }
    if (pv->incarn == 0) {
        /* incarnation 0 is "a peer that cannot resume": its connection
         * dies when its socket is lost - but while it is UP the victim
         * takes a RESUME that proves its key (hca_tcp_resumed asks for
         * no incarnation).  Either, until that is settled (crashes/ has
         * no reproducer: corpus seed resume_up_incarn0) */
        ok |= 1u << HCA_TCP_HELLO_NO_CONTEXT;
    }
    if (pv->proven && !proof_ok) {
        /* a connection the victim holds proven stays so only by a proof
         * of this handshake too; whether it holds it proven (a check
         * made) the harness knows only when the RTS QP served it */
        ok = pv->verified ? (1u << HCA_TCP_HELLO_BAD_SECRET) :
                            (ok | (1u << HCA_TCP_HELLO_BAD_SECRET));
    }
    /* silent, an UP one loses its socket at half the retry timeout, and
     * a LINKING one dies at the whole, counted from the last bytes read */
    age = fz_now_ms() - pv->last_tx_ms;
    if (age > hca_tcp_dev(fz.dev)->timeout_ms + FZ_TCP_LATE_MS) {
        return 1u << HCA_TCP_HELLO_NO_CONTEXT; /* timed out */
    }
    if ((age > hca_tcp_dev(fz.dev)->timeout_ms - FZ_TCP_EARLY_MS) ||
        fz_pid_gone(pv->host, pv->pid) || pv->refusable) {
        ok |= 1u << HCA_TCP_HELLO_NO_CONTEXT; /* it may be gone */
    }
    return ok;
}

/* The handshake: the HELLO of hs goes out (with the harness's own
 * ephemeral key unless FZ_H_RAW_KX), the CHALLENGE must say what is wrong
 * with it (or OK, proving the victim knows its secret, with a fresh key):
 * 1 if it is OK (the transcript and the session key in hs) ... */
static int fz_hello_start(fz_hs_t *hs)
{
    hca_tcp_hello_t *h = &hs->h;
    hca_tcp_hello_t ans;
    hca_tcp_transcript_t *t = &hs->t;
    uint8_t sk[HCA_TCP_KX_LEN], mac[HCA_TCP_MAC_LEN];
    int own_kx = !(hs->sel & FZ_H_RAW_KX);
    unsigned expect;

    fz.proven = 0;
    if (own_kx) {
        hca_tcp_kx_new(h->kx, sk);
    }
    if (!hca_tcp_hello_check(h) || (h->step != HCA_TCP_STEP_HELLO)) {
        expect = HCA_TCP_HELLO_BAD_VERSION;
    } else if (h->dst_host != fz.addr.host) {
        expect = HCA_TCP_HELLO_WRONG_HOST;
    } else if ((h->dst_pid != fz.addr.pid) ||
               (h->dst_ctx != fz.addr.ctx_id)) {
        expect = HCA_TCP_HELLO_NO_CONTEXT;
    } else if (!own_kx && fz_low_order(h->kx)) {
        expect = HCA_TCP_HELLO_BAD_KEY;
    } else {
        expect = HCA_TCP_HELLO_OK;
    }
    fz_hello_print("hello", h);
    if (fz_send(h, sizeof(*h)) != 0) {
        fz_fail("the victim closed before the hello's answer");
    }
    fz_hello_recv(&ans, 1u << expect);
    fz_hello_answer(&ans, 1u << expect, HCA_TCP_STEP_CHALLENGE);
    fz.challenges[ans.status]++;
    if (expect != HCA_TCP_HELLO_OK) {
        fz_wait_closed("a refused hello");
        return 0;
    }

    /* the CHALLENGE: the victim's incarnation, a fresh key, its MAC */
    if ((ans.incarn == 0) ||
        ((fz.victim_incarn != 0) && (ans.incarn != fz.victim_incarn))) {
        fz_fail("the victim's CHALLENGE has incarnation %#llx (before: "
                "%#llx)", (unsigned long long)ans.incarn,
                (unsigned long long)fz.victim_incarn);
    }
    fz.victim_incarn = ans.incarn;
    if (memcmp(ans.kx, fz.last_kx_a, sizeof(ans.kx)) == 0) {
        fz_fail("the victim's CHALLENGE brings the key of its last one");
    }
    memcpy(fz.last_kx_a, ans.kx, sizeof(ans.kx));
    memset(t, 0, sizeof(*t));
    t->nonce_c     = h->nonce;
    t->nonce_a     = ans.nonce;
    t->conn_host   = h->src_host;
    t->conn_pid    = h->src_pid;
    t->conn_ctx    = h->src_ctx;
    t->acc_host    = fz.addr.host;
    t->acc_pid     = fz.addr.pid;
    t->acc_ctx     = fz.addr.ctx_id;
    t->conn_incarn = h->incarn;
    t->acc_incarn  = ans.incarn;
    memcpy(t->kx_c, h->kx, sizeof(t->kx_c));
    memcpy(t->kx_a, ans.kx, sizeof(t->kx_a));
    hca_tcp_mac(mac, fz.addr.secret, HCA_TCP_MAC_ACCEPTOR, t);
    if (!hca_tcp_mac_equal(ans.mac, mac)) {
        fz_fail("the challenge does not prove the victim's identity");
    }
    if (fz_low_order(ans.kx)) {
        fz_fail("the victim's ephemeral key is a low-order point");
    }
    memset(hs->key, 0, sizeof(hs->key));
    if (own_kx && (hca_tcp_session_key(hs->key, sk, ans.kx, t) != 0)) {
        fz_fail("no session key with the victim's ephemeral key");
    }
    hca_tcp_wipe(sk, sizeof(sk));
    hs->own_kx = own_kx;
    return 1;
}

/* ... then the PROOF as hs->sel says, whose VERDICT must match.  1 if the
 * connection is up. */
static int fz_hello_finish(fz_hs_t *hs)
{
    hca_tcp_hello_t *h = &hs->h;
    hca_tcp_hello_t ans, p;
    const hca_tcp_transcript_t *t = &hs->t;
    uint8_t right_mac[HCA_TCP_MAC_LEN], right_proof[HCA_TCP_MAC_LEN];
    uint8_t mac[HCA_TCP_MAC_LEN];
    int own_kx = hs->own_kx;
    int kind   = (hs->sel >> FZ_H_CONT_SHIFT) & 7;
    const uint8_t *proved = NULL;
    uint8_t proved_key[HCA_TCP_KEY_LEN] = {0};
    int proof_ok, claim_peer;
    unsigned accept;

    fz.proven = 0;
    /* the PROOF */
    hca_tcp_mac(right_mac, fz.addr.secret, HCA_TCP_MAC_CONNECTOR, t);
    hca_tcp_mac(right_proof, fz.addr.secret, HCA_TCP_MAC_IDENTITY, t);
    memset(&p, 0, sizeof(p));
    p.magic    = HCA_TCP_MAGIC;
    p.version  = HCA_TCP_VERSION;
    p.step     = HCA_TCP_STEP_PROOF;
    p.src_host = h->src_host;
    p.src_pid  = h->src_pid;
    p.src_ctx  = h->src_ctx;
    memcpy(p.mac, (hs->sel & FZ_H_RAW_MAC) ? hs->mac : right_mac,
           sizeof(p.mac));
    memcpy(p.proof, (hs->sel & FZ_H_RAW_PROOF) ? hs->proof : right_proof,
           sizeof(p.proof));
    memcpy(p.cont_mac, hs->cont_mac, sizeof(p.cont_mac));
    if (((kind == FZ_C_RESUME) || (kind == FZ_C_JOIN) ||
         (kind == FZ_C_RESUME_OLD) || (kind == FZ_C_JOIN_OLD)) &&
        !(fz.prev.valid && fz.prev.has_key)) {
        /* no key: the raw MAC */
        kind = ((kind == FZ_C_RESUME) || (kind == FZ_C_RESUME_OLD)) ?
               FZ_C_RESUME_RAW : FZ_C_JOIN_RAW;
    }
    switch (kind) {
    case FZ_C_RESUME_RAW:
        p.cont = HCA_TCP_CONT_RESUME;
        break;
    case FZ_C_JOIN_RAW:
        p.cont = HCA_TCP_CONT_JOIN;
        break;
    case FZ_C_RESUME:
        p.cont = HCA_TCP_CONT_RESUME;
        hca_tcp_key_mac(p.cont_mac, fz.prev.key, HCA_TCP_MAC_RESUME, t);
        break;
    case FZ_C_JOIN:
        p.cont = HCA_TCP_CONT_JOIN;
        hca_tcp_key_mac(p.cont_mac, fz.prev.key, HCA_TCP_MAC_JOIN, t);
        break;
    case FZ_C_RESUME_OLD:
        p.cont = HCA_TCP_CONT_RESUME;
        hca_tcp_key_mac(p.cont_mac, fz.prev.key_prev, HCA_TCP_MAC_RESUME, t);
        break;
    case FZ_C_JOIN_OLD:
        p.cont = HCA_TCP_CONT_JOIN;
        hca_tcp_key_mac(p.cont_mac, fz.prev.key_prev, HCA_TCP_MAC_JOIN, t);
        break;
    case FZ_C_BAD:
        p.cont = (uint8_t)(HCA_TCP_CONT_LAST +
                           hs->cont_mac[0] % (256 - HCA_TCP_CONT_LAST));
        break;
    default:
        memset(p.cont_mac, 0, sizeof(p.cont_mac));
        break;
    }
    proof_ok   = hca_tcp_mac_equal(p.proof, right_proof);
    claim_peer = (h->src_host == fz.addr.host) &&
                 (h->src_pid == fz.addr.pid) && (h->src_ctx == fz.addr.ctx_id);
    if (!hca_tcp_hello_check(&p)) {
        accept = 1u << HCA_TCP_HELLO_BAD_VERSION;
    } else if (!hca_tcp_mac_equal(p.mac, right_mac)) {
        accept = 1u << HCA_TCP_HELLO_BAD_SECRET;
    } else if (p.cont == HCA_TCP_CONT_RESUME) {
        accept = fz_resume_expect(h, &p, t, proof_ok, &proved);
        if (proved != NULL) {
            memcpy(proved_key, proved, sizeof(proved_key));
        }
    } else {
        accept = 1u << HCA_TCP_HELLO_OK; /* a JOIN too: records its own */
    }
    fz_hello_print("proof", &p);
    if (fz_send(&p, sizeof(p)) != 0) {
        fz_fail("the victim closed before the proof's answer");
    }
    fz_hello_recv(&ans, accept);
    fz_hello_answer(&ans, accept, HCA_TCP_STEP_VERDICT);
    fz.verdicts[kind][ans.status]++;
    if (ans.status != HCA_TCP_HELLO_OK) {
        if ((proved != NULL) && (ans.status == HCA_TCP_HELLO_NO_CONTEXT)) {
            fz.prev.linking = 0; /* it timed out meanwhile */
        }
        if ((proved != NULL) && (ans.status == HCA_TCP_HELLO_BAD_SECRET)) {
            fz.prev.verified = 1; /* the victim holds it proven */
        }
        fz_wait_closed("a refused proof");
        return 0;
    }
    if (p.cont == HCA_TCP_CONT_RESUME) {
        /* only the acceptor of that session can prove it back: with the
         * key the RESUME proved (OK only if it proved one) */
        hca_tcp_key_mac(mac, proved_key, HCA_TCP_MAC_RESUMED, t);
        if (!hca_tcp_mac_equal(ans.mac, mac)) {
            fz_fail("the VERDICT to a RESUME does not prove the session's "
                    "key");
        }
    } else if (!fz_zero(ans.mac, sizeof(ans.mac))) {
        fz_fail("a VERDICT that answers no RESUME carries a MAC");
    }
    if (((kind == FZ_C_JOIN) || (kind == FZ_C_JOIN_OLD)) &&
        (fz.prev.incarn != 0) &&
        (h->src_host == fz.prev.host) && (h->src_pid == fz.prev.pid) &&
        (h->src_ctx == fz.prev.ctx) && (h->incarn == fz.prev.incarn)) {
        fz.joined_prev++;
    }
    if ((p.cont == HCA_TCP_CONT_RESUME) && fz.prev.open) {
        fz.keep_moved = 1; /* the kept socket's session is this one's */
    }
    /* a first handshake of an inbound connection passes the victim's caps
     * of established ones (after its VERDICT: a refusal closes it then) */
    fz.admit_unsure = (p.cont != HCA_TCP_CONT_RESUME) && fz_admit_unsure();
    /* the connection is up: the previous one from now on.  A resumed one
     * is the victim's connection that was proven (or not) before: it
     * stays so only with this proof */
    fz.prev.verified = (p.cont == HCA_TCP_CONT_RESUME) &&
                       fz.prev.verified && proof_ok;
    fz.prev.valid    = 1;
    fz.prev.has_key  = own_kx;
    /* the victim's connection keeps the key a RESUME proved as the one
     * before; any other starts with its own */
    memcpy(fz.prev.key_prev, (p.cont == HCA_TCP_CONT_RESUME) ? proved_key :
                             hs->key, sizeof(hs->key));
    memcpy(fz.prev.key, hs->key, sizeof(hs->key));
    fz.prev.host     = h->src_host;
    fz.prev.pid      = h->src_pid;
    fz.prev.ctx      = h->src_ctx;
    fz.prev.incarn   = h->incarn;
    /* the RTS QP's peer is the victim itself: its secret proves it */
    fz.prev.proven   = claim_peer && proof_ok;
    fz.prev.linking  = 0;
    fz.prev.open     = 0;
    fz.prev.refusable = 0;
    fz.prev.pending  = 0;
    fz.prev.last_tx_ms = fz_now_ms();
    fz.up     = 1;
    fz.proven = fz.prev.proven;
    hca_tcp_wipe(hs->key, sizeof(hs->key));
    hca_tcp_wipe(proved_key, sizeof(proved_key));
    return 1;
}

/* The whole handshake. */
static int fz_hello(fz_hs_t *hs)
{
    return fz_hello_start(hs) && fz_hello_finish(hs);
}

/* A handshake that waits after its CHALLENGE is the previous connection
 * for the next one (whose JOIN may prove its key: the victim groups them
 * when this one comes UP). */
static void fz_prev_pending(const fz_hs_t *hs)
{
    memset(&fz.prev, 0, sizeof(fz.prev));
    fz.prev.valid   = 1;
    fz.prev.pending = 1;
    fz.prev.has_key = hs->own_kx;
    memcpy(fz.prev.key, hs->key, sizeof(fz.prev.key));
    memcpy(fz.prev.key_prev, hs->key, sizeof(fz.prev.key_prev));
    fz.prev.host    = hs->h.src_host;
    fz.prev.pid     = hs->h.src_pid;
    fz.prev.ctx     = hs->h.src_ctx;
    fz.prev.incarn  = hs->h.incarn;
}

/* The harness's own HELLO: right in every field, a claim of its own (no
 * incarnation: not resumable), and a PROOF that continues nothing. */
static void fz_good_hello(fz_hs_t *hs)
{
    hca_tcp_hello_t *h = &hs->h;

    memset(hs, 0, sizeof(*hs));
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

/* A HELLO section of the input into *hs (fix: mode bit 2). */
static void fz_hs_read(fz_in_t *in, fz_hs_t *hs, int fix)
{
    hca_tcp_hello_t *h = &hs->h;

    for (size_t i = 0; i < sizeof(*h); ++i) {
        ((uint8_t*)h)[i] = fz_u8(in);
    }
    hs->sel = fz_u8(in);
    for (size_t i = 0; i < HCA_TCP_MAC_LEN; ++i) {
        hs->mac[i] = fz_u8(in);
    }
    for (size_t i = 0; i < HCA_TCP_MAC_LEN; ++i) {
        hs->proof[i] = fz_u8(in);
    }
    for (size_t i = 0; i < HCA_TCP_MAC_LEN; ++i) {
        hs->cont_mac[i] = fz_u8(in);
    }
    if (fix) {
        h->magic    = HCA_TCP_MAGIC;
        h->version  = HCA_TCP_VERSION;
        h->step     = HCA_TCP_STEP_HELLO;
        h->dst_host = fz.addr.host;
        h->dst_pid  = fz.addr.pid;
        h->dst_ctx  = fz.addr.ctx_id;
        h->status  %= HCA_TCP_HELLO_LAST;
        h->cont     = HCA_TCP_CONT_NONE;
        memset(h->reserved, 0, sizeof(h->reserved));
    }
    if ((hs->sel & FZ_H_CLAIM_PREV) && (hs->sel & FZ_H_CLAIM_PEER)) {
        h->src_host = fz.addr.host; /* the victim, as its own connections */
        h->src_pid  = fz.addr.pid;
        h->src_ctx  = fz.addr.ctx_id;
        h->incarn   = fz.victim_incarn;
    } else if (hs->sel & FZ_H_CLAIM_PREV) {
        if (fz.prev.valid) {
            h->src_host = fz.prev.host;
            h->src_pid  = fz.prev.pid;
            h->src_ctx  = fz.prev.ctx;
            h->incarn   = fz.prev.incarn;
        }
    } else if (hs->sel & FZ_H_CLAIM_PEER) {
        h->src_host = fz.addr.host; /* the RTS QP's peer */
        h->src_pid  = fz.addr.pid;
        h->src_ctx  = fz.addr.ctx_id;
    }
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
               (hello.step < HCA_TCP_STEP_LAST) &&
               (hello.cont < HCA_TCP_CONT_LAST) &&
               ((hello.cont == HCA_TCP_CONT_NONE) ||
                (hello.step == HCA_TCP_STEP_PROOF)) &&
               fz_zero(hello.reserved, sizeof(hello.reserved)))) {
        fz_fail("hello_check says %d of magic %x version %u status %u step "
                "%u cont %u", ok, hello.magic, hello.version, hello.status,
                hello.step, hello.cont);
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

/* The first connection of a two-HELLO input, if it claims the RTS QP's
 * peer: a zero-length WRITE to the RTS QP from the peer's QPN (a fresh
 * start PSN), which the victim must serve exactly when the connection
 * proved that peer - it then holds it proven, and a RESUME of it must
 * prove it again - then a probe. */
static void fz_identity_check(void)
{
    hca_tcp_hdr_t h;

    if ((fz.prev.host != fz.addr.host) || (fz.prev.pid != fz.addr.pid) ||
        (fz.prev.ctx != fz.addr.ctx_id)) {
        return;
    }
    memset(&h, 0, sizeof(h));
    h.version     = HCA_TCP_VERSION;
    h.opcode      = HCA_TCP_OP_WRITE;
    h.flags       = HCA_TCP_F_LAST | HCA_TCP_F_START;
    h.src_qpn     = hca_qp_num(fz.target);
    h.dst_qpn     = hca_qp_num(fz.req);
    h.psn         = 0x1d000000u + ++fz.id_count * 2654435761u;
    h.rkey        = hca_mr_rkey(fz.mr);
    h.remote_addr = (uint64_t)(uintptr_t)(fz.buf + FZ_TCP_PAD);
    fz.id_psn     = h.psn;
    fz.id_answer  = -1;
    if ((fz_send(&h, sizeof(h)) != 0) || !fz_wait_probe()) {
        if (fz.admit_unsure) {
            fz_wait_closed("a newcomer over the caps");
            return;
        }
        fz_fail("the victim closed a connection whose headers passed "
                "hca_tcp_hdr_check");
    }
    fz.admit_unsure = 0; /* it was admitted */
    /* no answer: dropped behind a frame of another connection that shares
     * the requester's record (its answer is then that one's) */
    if ((fz.id_answer >= 0) && fz.proven &&
        (fz.id_answer != HCA_WC_SUCCESS)) {
        fz_fail("the connected QP refused (syndrome %d) a connection that "
                "proved it is its peer", fz.id_answer);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t payload[HCA_TCP_SEG_MAX];
    fz_in_t in = {data, size};
    fz_hs_t pend;
    int pend_fd = -1;
    uint8_t mode;
    int closed = 0;

    fz_check_pure(data, size);
    mode = fz_u8(&in);

    if ((mode & FZ_M_HELLO) && (fz.fd >= 0)) {
        fz_close(); /* this input's hello opens a new connection */
    }
    for (int i = 0, n = (mode & FZ_M_THRICE) ? 2 : 1;
         (mode & FZ_M_HELLO) && (mode & FZ_M_TWICE) && (i < n); ++i) {
        /* a first connection, closed at once: what the next continues */
        fz_hs_t hs;
        fz_hs_read(&in, &hs, mode & FZ_M_HELLO_FIX);
        fz_connect();
        if ((mode & FZ_M_INTERLEAVE) && (i == n - 1)) {
            /* its PROOF after the next one's handshake */
            if (fz_hello_start(&hs)) {
                pend     = hs;
                pend_fd  = fz.fd;
                fz.fd    = -1;
                fz_prev_pending(&pend);
            }
            continue;
        }
        if (fz_hello(&hs)) {
            fz_identity_check();
            if (fz.fd < 0) {
                continue; /* closed over the caps */
            }
            if ((mode & FZ_M_KEEP) && (i == n - 1)) {
                fz_keep();
            } else {
                fz_close();
            }
        }
    }
    if (fz.fd < 0) {
        fz_hs_t hs;
        int up;
        if (mode & FZ_M_HELLO) {
            fz_hs_read(&in, &hs, mode & FZ_M_HELLO_FIX);
        } else {
            fz_good_hello(&hs);
        }
        fz_connect();
        up = fz_hello(&hs);
        if (pend_fd >= 0) {
            /* the waiting one's PROOF now, the other still open: the
             * frames follow the waiting one */
            if (up) {
                fz_keep();
            }
            fz.fd   = pend_fd;
            pend_fd = -1;
            up      = fz_hello_finish(&pend);
        }
        fz_keep_close();
        if (!up) {
            return 0;
        }
    }

    for (int f = 0; (f < FZ_TCP_FRAMES) && (in.n > 0) && !closed; ++f) {
        hca_tcp_hdr_t h;
        uint8_t sel = 0, sel2 = 0;
        size_t len;

        if (mode & FZ_M_SHAPED) {
            sel  = fz_u8(&in);
            sel2 = fz_u8(&in);
        }
        for (size_t i = 0; i < sizeof(h); ++i) {
            ((uint8_t*)&h)[i] = fz_u8(&in);
        }
        if (mode & FZ_M_SHAPED) {
            fz_shape(&h, sel, sel2);
        }
        if (fz_verbose()) {
            printf("frame %d: version %u op %u flags 0x%x syndrome 0x%x len "
                   "%u src 0x%x dst 0x%x psn %u rkey 0x%x addr %#llx off %u "
                   "total %u%s\n", f, h.version, h.opcode, h.flags,
                   h.syndrome, h.length, h.src_qpn, h.dst_qpn, h.psn, h.rkey,
                   (unsigned long long)h.remote_addr, h.offset, h.total,
                   (hca_tcp_hdr_check(&h) != HCA_TCP_HDR_OK) ?
                   " (fails hdr_check)" : "");
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
        if (fz.admit_unsure) {
            fz_wait_closed("a newcomer over the caps");
            return 0;
        }
        /* only a bad header closes: every header sent here passed */
        fz_fail("the victim closed a connection whose headers passed "
                "hca_tcp_hdr_check");
    }
    fz.admit_unsure = 0; /* it was admitted */
    fz_victim_poll_tcp();
    fz_guard_check();
    return 0;
}
