/*
 * tcp_forge.c - see tcp_forge.h: the tcp fabric's wire structures, filled
 * from the test's plain ones (so that the test's frames are exactly what
 * hca_tcp_wire.h lays out, whatever its padding).
 */
#include "tcp_forge.h"

#include "hca_tcp_wire.h"
#include "hca_obj.h"

#include <string.h>

/* The header checks are not exported by libhcadev (hidden visibility):
 * the test compiles the library's own source of them, so that a case is
 * judged by exactly the code the context runs. */
#include "hca_tcp_frame.c"
#include "hca_tcp_auth.c"

_Static_assert(TCPF_HELLO_LEN == sizeof(hca_tcp_hello_t), "hello size");
_Static_assert(TCPF_HDR_LEN == sizeof(hca_tcp_hdr_t), "header size");
_Static_assert((int)TCPF_HELLO_BAD_VERSION == (int)HCA_TCP_HELLO_BAD_VERSION &&
               (int)TCPF_HELLO_WRONG_HOST == (int)HCA_TCP_HELLO_WRONG_HOST &&
               (int)TCPF_HELLO_NO_CONTEXT == (int)HCA_TCP_HELLO_NO_CONTEXT &&
               (int)TCPF_HELLO_BAD_SECRET == (int)HCA_TCP_HELLO_BAD_SECRET &&
               (int)TCPF_HELLO_BAD_KEY == (int)HCA_TCP_HELLO_BAD_KEY,
               "hello statuses");
_Static_assert((int)TCPF_STEP_HELLO == (int)HCA_TCP_STEP_HELLO &&
               (int)TCPF_STEP_CHALLENGE == (int)HCA_TCP_STEP_CHALLENGE &&
               (int)TCPF_STEP_PROOF == (int)HCA_TCP_STEP_PROOF &&
               (int)TCPF_STEP_VERDICT == (int)HCA_TCP_STEP_VERDICT &&
               (int)TCPF_MAC_ACCEPTOR == (int)HCA_TCP_MAC_ACCEPTOR &&
               (int)TCPF_MAC_CONNECTOR == (int)HCA_TCP_MAC_CONNECTOR &&
               (int)TCPF_MAC_IDENTITY == (int)HCA_TCP_MAC_IDENTITY &&
               (int)TCPF_MAC_RESUME == (int)HCA_TCP_MAC_RESUME &&
               (int)TCPF_MAC_JOIN == (int)HCA_TCP_MAC_JOIN &&
               (int)TCPF_MAC_RESUMED == (int)HCA_TCP_MAC_RESUMED &&
               (int)TCPF_CONT_RESUME == (int)HCA_TCP_CONT_RESUME &&
               (int)TCPF_CONT_JOIN == (int)HCA_TCP_CONT_JOIN &&
               (int)TCPF_MAC_LEN == HCA_TCP_MAC_LEN &&
               (int)TCPF_KX_LEN == HCA_TCP_KX_LEN &&
               (int)TCPF_KEY_LEN == HCA_TCP_KEY_LEN,
               "handshake steps and MACs");
_Static_assert((int)TCPF_OP_SEND == (int)HCA_TCP_OP_SEND &&
               (int)TCPF_OP_WRITE == (int)HCA_TCP_OP_WRITE &&
               (int)TCPF_OP_READ == (int)HCA_TCP_OP_READ &&
               (int)TCPF_OP_ATOMIC == (int)HCA_TCP_OP_ATOMIC &&
               (int)TCPF_OP_ACK == (int)HCA_TCP_OP_ACK &&
               (int)TCPF_OP_READ_RESP == (int)HCA_TCP_OP_READ_RESP &&
               (int)TCPF_OP_KEEPALIVE == (int)HCA_TCP_OP_KEEPALIVE &&
               (int)TCPF_OP_LAST == (int)HCA_TCP_OP_LAST, "opcodes");
_Static_assert((int)TCPF_F_FIRST == (int)HCA_TCP_F_FIRST &&
               (int)TCPF_F_LAST == (int)HCA_TCP_F_LAST && (int)TCPF_F_IMM == (int)HCA_TCP_F_IMM &&
               (int)TCPF_F_ATOMIC32 == (int)HCA_TCP_F_ATOMIC32 &&
               (int)TCPF_F_START == (int)HCA_TCP_F_START, "flags");

const uint32_t tcpf_version  = HCA_TCP_VERSION;
const uint32_t tcpf_seg_max  = HCA_TCP_SEG_MAX;
const uint32_t tcpf_send_max = HCA_TCP_SEND_MAX;
const uint32_t tcpf_max_msg  = HCA_MAX_MSG;

void tcpf_hello_encode(const tcpf_hello_t *h, uint8_t *out)
{
    hca_tcp_hello_t w;

    memset(&w, 0, sizeof(w));
    w.magic    = h->magic ? h->magic : HCA_TCP_MAGIC;
    w.version  = h->version ? h->version : HCA_TCP_VERSION;
    w.step     = h->step ? h->step : HCA_TCP_STEP_HELLO;
    w.status   = h->status;
    w.src_host = h->src_host;
    w.src_pid  = h->src_pid;
    w.src_ctx  = h->src_ctx;
    w.dst_host = h->dst_host;
    w.dst_pid  = h->dst_pid;
    w.dst_ctx  = h->dst_ctx;
    w.nonce    = h->nonce;
    w.incarn   = h->incarn;
    w.cont     = h->cont;
    memcpy(w.kx, h->kx, sizeof(w.kx));
    memcpy(w.mac, h->mac, sizeof(w.mac));
    memcpy(w.proof, h->proof, sizeof(w.proof));
    memcpy(w.cont_mac, h->cont_mac, sizeof(w.cont_mac));
    memcpy(out, &w, sizeof(w));
}

void tcpf_hello_decode(const uint8_t *in, tcpf_hello_t *h)
{
    hca_tcp_hello_t w;

    memcpy(&w, in, sizeof(w));
    memset(h, 0, sizeof(*h));
    h->magic    = w.magic;
    h->version  = w.version;
    h->step     = w.step;
    h->status   = w.status;
    h->src_host = w.src_host;
    h->src_pid  = w.src_pid;
    h->src_ctx  = w.src_ctx;
    h->dst_host = w.dst_host;
    h->dst_pid  = w.dst_pid;
    h->dst_ctx  = w.dst_ctx;
    h->nonce    = w.nonce;
    h->incarn   = w.incarn;
    h->cont     = w.cont;
    memcpy(h->kx, w.kx, sizeof(h->kx));
    memcpy(h->mac, w.mac, sizeof(h->mac));
    memcpy(h->proof, w.proof, sizeof(h->proof));
    memcpy(h->cont_mac, w.cont_mac, sizeof(h->cont_mac));
}

static void tcpf_transcript_to(const tcpf_transcript_t *t,
                               hca_tcp_transcript_t *w)
{
    memset(w, 0, sizeof(*w));
    w->nonce_c     = t->nonce_c;
    w->nonce_a     = t->nonce_a;
    w->conn_host   = t->conn_host;
    w->conn_pid    = t->conn_pid;
    w->conn_ctx    = t->conn_ctx;
    w->acc_host    = t->acc_host;
    w->acc_pid     = t->acc_pid;
    w->acc_ctx     = t->acc_ctx;
    w->conn_incarn = t->conn_incarn;
    w->acc_incarn  = t->acc_incarn;
    memcpy(w->kx_c, t->kx_c, sizeof(w->kx_c));
    memcpy(w->kx_a, t->kx_a, sizeof(w->kx_a));
}

void tcpf_mac(uint8_t out[TCPF_MAC_LEN], uint64_t secret, int kind,
              const tcpf_transcript_t *t)
{
    hca_tcp_transcript_t w;

    tcpf_transcript_to(t, &w);
    hca_tcp_mac(out, secret, (hca_tcp_mac_kind_t)kind, &w);
}

void tcpf_key_mac(uint8_t out[TCPF_MAC_LEN], const uint8_t key[TCPF_KEY_LEN],
                  int kind, const tcpf_transcript_t *t)
{
    hca_tcp_transcript_t w;

    tcpf_transcript_to(t, &w);
    hca_tcp_key_mac(out, key, (hca_tcp_mac_kind_t)kind, &w);
}

int tcpf_zero(const void *p, size_t n)
{
    const uint8_t *b = p;

    for (size_t i = 0; i < n; ++i) {
        if (b[i] != 0) {
            return 0;
        }
    }
    return 1;
}

void tcpf_kx_new(tcpf_hello_t *h)
{
    (void)hca_tcp_auth_init();
    hca_tcp_kx_new(h->kx, h->kx_sk);
}

static int tcpf_session_key(tcpf_session_t *s, const uint8_t sk[TCPF_KX_LEN],
                            const uint8_t peer_pk[TCPF_KX_LEN])
{
    hca_tcp_transcript_t w;

    tcpf_transcript_to(&s->t, &w);
    return hca_tcp_session_key(s->key, sk, peer_pk, &w);
}

static void tcpf_transcript_of(const tcpf_hello_t *h, const tcpf_hello_t *ch,
                               uint64_t acc_host, uint32_t acc_pid,
                               uint32_t acc_ctx, tcpf_transcript_t *t)
{
    memset(t, 0, sizeof(*t));
    t->nonce_c     = h->nonce;
    t->nonce_a     = ch->nonce;
    t->conn_host   = h->src_host;
    t->conn_pid    = h->src_pid;
    t->conn_ctx    = h->src_ctx;
    t->acc_host    = acc_host;
    t->acc_pid     = acc_pid;
    t->acc_ctx     = acc_ctx;
    t->conn_incarn = h->incarn;
    t->acc_incarn  = ch->incarn;
    memcpy(t->kx_c, h->kx, TCPF_KX_LEN);
    memcpy(t->kx_a, ch->kx, TCPF_KX_LEN);
}

int tcpf_prove(const tcpf_hello_t *h, const tcpf_hello_t *ch,
               uint64_t acc_host, uint32_t acc_pid, uint32_t acc_ctx,
               uint64_t acc_secret, uint64_t mac_secret, uint64_t own_secret,
               tcpf_hello_t *proof, tcpf_session_t *s)
{
    tcpf_session_t mine;
    uint8_t mac[TCPF_MAC_LEN];

    if (s == NULL) {
        s = &mine;
    }
    memset(s, 0, sizeof(*s));
    tcpf_transcript_of(h, ch, acc_host, acc_pid, acc_ctx, &s->t);
    tcpf_mac(mac, acc_secret, TCPF_MAC_ACCEPTOR, &s->t);
    if ((ch->step != TCPF_STEP_CHALLENGE) || (ch->status != 0) ||
        (ch->src_host != acc_host) || (ch->src_pid != acc_pid) ||
        (ch->src_ctx != acc_ctx) || (memcmp(ch->mac, mac, sizeof(mac)) != 0) ||
        (tcpf_session_key(s, h->kx_sk, ch->kx) != 0)) {
        return 0;
    }
    memset(proof, 0, sizeof(*proof));
    proof->step     = TCPF_STEP_PROOF;
    proof->src_host = h->src_host;
    proof->src_pid  = h->src_pid;
    proof->src_ctx  = h->src_ctx;
    tcpf_mac(proof->mac, mac_secret, TCPF_MAC_CONNECTOR, &s->t);
    tcpf_mac(proof->proof, own_secret, TCPF_MAC_IDENTITY, &s->t);
    return 1;
}

void tcpf_continue(tcpf_hello_t *proof, const tcpf_session_t *s, int cont,
                   const uint8_t key[TCPF_KEY_LEN])
{
    proof->cont = (uint8_t)cont;
    tcpf_key_mac(proof->cont_mac, key,
                 (cont == TCPF_CONT_RESUME) ? TCPF_MAC_RESUME : TCPF_MAC_JOIN,
                 &s->t);
}

int tcpf_challenge(const tcpf_hello_t *h, uint64_t acc_host, uint32_t acc_pid,
                   uint32_t acc_ctx, uint64_t acc_secret, uint64_t nonce_a,
                   uint64_t incarn, tcpf_hello_t *ch, tcpf_session_t *s)
{
    memset(ch, 0, sizeof(*ch));
    ch->step     = TCPF_STEP_CHALLENGE;
    ch->src_host = acc_host;
    ch->src_pid  = acc_pid;
    ch->src_ctx  = acc_ctx;
    ch->nonce    = nonce_a;
    ch->incarn   = incarn;
    tcpf_kx_new(ch);
    memset(s, 0, sizeof(*s));
    tcpf_transcript_of(h, ch, acc_host, acc_pid, acc_ctx, &s->t);
    tcpf_mac(ch->mac, acc_secret, TCPF_MAC_ACCEPTOR, &s->t);
    return tcpf_session_key(s, ch->kx_sk, h->kx);
}

void tcpf_hdr_encode(const tcpf_hdr_t *h, uint8_t *out)
{
    hca_tcp_hdr_t w;

    memset(&w, 0, sizeof(w));
    w.version     = h->version;
    w.opcode      = h->opcode;
    w.flags       = h->flags;
    w.syndrome    = h->syndrome;
    w.length      = h->length;
    w.src_qpn     = h->src_qpn;
    w.dst_qpn     = h->dst_qpn;
    w.psn         = h->psn;
    w.rkey        = h->rkey;
    w.remote_addr = h->remote_addr;
    w.resp_idx    = h->resp_idx;
    w.resp_stamp  = h->resp_stamp;
    w.offset      = h->offset;
    w.total       = h->total;
    w.imm         = h->imm;
    w.atomic_op   = h->atomic_op;
    w.operand     = h->operand;
    w.swap        = h->swap;
    memcpy(out, &w, sizeof(w));
}

void tcpf_hdr_decode(const uint8_t *in, tcpf_hdr_t *h)
{
    hca_tcp_hdr_t w;

    memcpy(&w, in, sizeof(w));
    h->version     = w.version;
    h->opcode      = w.opcode;
    h->flags       = w.flags;
    h->syndrome    = w.syndrome;
    h->length      = w.length;
    h->src_qpn     = w.src_qpn;
    h->dst_qpn     = w.dst_qpn;
    h->psn         = w.psn;
    h->rkey        = w.rkey;
    h->remote_addr = w.remote_addr;
    h->resp_idx    = w.resp_idx;
    h->resp_stamp  = w.resp_stamp;
    h->offset      = w.offset;
    h->total       = w.total;
    h->imm         = w.imm;
    h->atomic_op   = w.atomic_op;
    h->operand     = w.operand;
    h->swap        = w.swap;
}

int tcpf_hdr_check(const uint8_t *in)
{
    hca_tcp_hdr_t w;

    memcpy(&w, in, sizeof(w));
    return (int)hca_tcp_hdr_check(&w);
}

int tcpf_hello_check(const uint8_t *in)
{
    hca_tcp_hello_t w;

    memcpy(&w, in, sizeof(w));
    return hca_tcp_hello_check(&w);
}

void tcpf_claim_ctx(struct hca_device *dev, uint32_t ctx_id)
{
    dev->ctx_id = ctx_id;
}
