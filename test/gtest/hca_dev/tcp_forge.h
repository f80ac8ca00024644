/*
 * tcp_forge.h - what a raw TCP client of a device's tcp listener writes:
 * the hello and frame headers of hca_tcp_wire.h, encoded by C code that
 * includes the wire header itself (its structures use C11 features the
 * C++ suite cannot include).  The constants below mirror the wire header;
 * tcp_forge.c asserts at compile time that they match.
 */
#ifndef HCA_TEST_TCP_FORGE_H
#define HCA_TEST_TCP_FORGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    TCPF_HELLO_LEN = 64,
    TCPF_HDR_LEN   = 72,

    TCPF_HELLO_OK = 0,
    TCPF_HELLO_BAD_VERSION,
    TCPF_HELLO_WRONG_HOST,
    TCPF_HELLO_NO_CONTEXT,
    TCPF_HELLO_BAD_SECRET,

    TCPF_STEP_HELLO = 1,   /* the handshake's messages */
    TCPF_STEP_CHALLENGE,
    TCPF_STEP_PROOF,
    TCPF_STEP_VERDICT,

    TCPF_MAC_ACCEPTOR = 1, /* what a MAC proves (hca_tcp_auth.h) */
    TCPF_MAC_CONNECTOR,
    TCPF_MAC_IDENTITY,

    TCPF_OP_SEND = 1,
    TCPF_OP_WRITE,
    TCPF_OP_READ,
    TCPF_OP_ATOMIC,
    TCPF_OP_ACK,
    TCPF_OP_READ_RESP,
    TCPF_OP_KEEPALIVE,
    TCPF_OP_BYE,
    TCPF_OP_LAST,

    TCPF_F_FIRST    = 1 << 0,
    TCPF_F_LAST     = 1 << 1,
    TCPF_F_IMM      = 1 << 2,
    TCPF_F_ATOMIC32 = 1 << 3,
    TCPF_F_START    = 1 << 4  /* the requester QP's first frame (its start PSN) */
};

extern const uint32_t tcpf_version;
extern const uint32_t tcpf_seg_max;   /* HCA_TCP_SEG_MAX */
extern const uint32_t tcpf_send_max;  /* HCA_TCP_SEND_MAX */
extern const uint32_t tcpf_max_msg;   /* HCA_MAX_MSG */

/* hca_tcp_hello_t's fields */
typedef struct tcpf_hello {
    uint32_t magic;   /* 0: HCA_TCP_MAGIC */
    uint16_t version; /* 0: HCA_TCP_VERSION */
    uint8_t  step;    /* TCPF_STEP_* */
    uint8_t  status;
    uint64_t src_host;
    uint32_t src_pid, src_ctx;
    uint64_t dst_host;
    uint32_t dst_pid, dst_ctx;
    uint64_t nonce, mac, proof;
} tcpf_hello_t;

/* hca_tcp_transcript_t's fields */
typedef struct tcpf_transcript {
    uint64_t nonce_c, nonce_a;
    uint64_t conn_host;
    uint32_t conn_pid, conn_ctx;
    uint64_t acc_host;
    uint32_t acc_pid, acc_ctx;
    uint64_t conn_incarn, acc_incarn; /* the HELLO's and the CHALLENGE's
                                         `proof` field (its incarnation) */
} tcpf_transcript_t;

/* hca_tcp_mac and hca_siphash24 (the library's own code) */
uint64_t tcpf_mac(uint64_t secret, int kind, const tcpf_transcript_t *t);
uint64_t tcpf_siphash24(const uint8_t k[16], const void *msg, size_t len);

/* The connector's next step after its HELLO h got the CHALLENGE ch from
 * the context at (acc_host, acc_pid, acc_ctx) whose secret is acc_secret:
 * 1 and the PROOF in *proof if ch is an OK challenge from that context
 * and proves its secret, else 0.  The PROOF's MAC is keyed by mac_secret
 * (acc_secret, or a wrong one to be refused), its identity proof by
 * own_secret. */
int tcpf_prove(const tcpf_hello_t *h, const tcpf_hello_t *ch,
               uint64_t acc_host, uint32_t acc_pid, uint32_t acc_ctx,
               uint64_t acc_secret, uint64_t mac_secret, uint64_t own_secret,
               tcpf_hello_t *proof);

/* hca_tcp_hdr_t's fields */
typedef struct tcpf_hdr {
    uint8_t  version, opcode, flags, syndrome;
    uint32_t length, src_qpn, dst_qpn, psn, rkey;
    uint64_t remote_addr;
    uint32_t resp_idx, resp_stamp, offset, total, imm;
    uint8_t  atomic_op;
    uint64_t operand, swap;
} tcpf_hdr_t;

/* The test's attacker: the context claims identity ctx_id (on its host and
 * pid) from now on, in the hellos it sends - what a forged hello says. */
struct hca_device;
void tcpf_claim_ctx(struct hca_device *dev, uint32_t ctx_id);

/* To and from the wire: TCPF_HELLO_LEN / TCPF_HDR_LEN bytes. */
void tcpf_hello_encode(const tcpf_hello_t *h, uint8_t *out);
void tcpf_hello_decode(const uint8_t *in, tcpf_hello_t *h);
void tcpf_hdr_encode(const tcpf_hdr_t *h, uint8_t *out);
void tcpf_hdr_decode(const uint8_t *in, tcpf_hdr_t *h);
/* hca_tcp_hdr_check / hca_tcp_hello_check of the encoded bytes */
int  tcpf_hdr_check(const uint8_t *in);
int  tcpf_hello_check(const uint8_t *in);

#ifdef __cplusplus
}
#endif

#endif
