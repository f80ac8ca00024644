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
               (int)TCPF_HELLO_BAD_SECRET == (int)HCA_TCP_HELLO_BAD_SECRET,
               "hello statuses");
_Static_assert((int)TCPF_STEP_HELLO == (int)HCA_TCP_STEP_HELLO &&
               (int)TCPF_STEP_CHALLENGE == (int)HCA_TCP_STEP_CHALLENGE &&
               (int)TCPF_STEP_PROOF == (int)HCA_TCP_STEP_PROOF &&
               (int)TCPF_STEP_VERDICT == (int)HCA_TCP_STEP_VERDICT &&
               (int)TCPF_MAC_ACCEPTOR == (int)HCA_TCP_MAC_ACCEPTOR &&
               (int)TCPF_MAC_CONNECTOR == (int)HCA_TCP_MAC_CONNECTOR &&
               (int)TCPF_MAC_IDENTITY == (int)HCA_TCP_MAC_IDENTITY,
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
    w.mac      = h->mac;
    w.proof    = h->proof;
    memcpy(out, &w, sizeof(w));
}

void tcpf_hello_decode(const uint8_t *in, tcpf_hello_t *h)
{
    hca_tcp_hello_t w;

    memcpy(&w, in, sizeof(w));
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
    h->mac      = w.mac;
    h->proof    = w.proof;
}

uint64_t tcpf_mac(uint64_t secret, int kind, const tcpf_transcript_t *t)
{
    hca_tcp_transcript_t w = {
        .nonce_c   = t->nonce_c,   .nonce_a  = t->nonce_a,
        .conn_host = t->conn_host, .conn_pid = t->conn_pid,
        .conn_ctx  = t->conn_ctx,  .acc_host = t->acc_host,
        .acc_pid   = t->acc_pid,   .acc_ctx  = t->acc_ctx,
        .conn_incarn = t->conn_incarn, .acc_incarn = t->acc_incarn
    };
    return hca_tcp_mac(secret, (hca_tcp_mac_kind_t)kind, &w);
}

int tcpf_prove(const tcpf_hello_t *h, const tcpf_hello_t *ch,
               uint64_t acc_host, uint32_t acc_pid, uint32_t acc_ctx,
               uint64_t acc_secret, uint64_t mac_secret, uint64_t own_secret,
               tcpf_hello_t *proof)
{
    tcpf_transcript_t t = {h->nonce,  ch->nonce, h->src_host, h->src_pid,
                           h->src_ctx, acc_host, acc_pid,     acc_ctx,
                           h->proof,   ch->proof};

    if ((ch->step != TCPF_STEP_CHALLENGE) || (ch->status != 0) ||
        (ch->src_host != acc_host) || (ch->src_pid != acc_pid) ||
        (ch->src_ctx != acc_ctx) ||
        (ch->mac != tcpf_mac(acc_secret, TCPF_MAC_ACCEPTOR, &t))) {
        return 0;
    }
    memset(proof, 0, sizeof(*proof));
    proof->step     = TCPF_STEP_PROOF;
    proof->src_host = h->src_host;
    proof->src_pid  = h->src_pid;
    proof->src_ctx  = h->src_ctx;
    proof->mac      = tcpf_mac(mac_secret, TCPF_MAC_CONNECTOR, &t);
    proof->proof    = tcpf_mac(own_secret, TCPF_MAC_IDENTITY, &t);
    return 1;
}

uint64_t tcpf_siphash24(const uint8_t k[16], const void *msg, size_t len)
{
    return hca_siphash24(k, msg, len);
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
