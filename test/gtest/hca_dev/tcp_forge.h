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
    TCPF_HELLO_LEN = 144,
    TCPF_MAC_LEN   = 16,  /* a MAC on the wire */
    TCPF_KX_LEN    = 32,  /* an X25519 key */
    TCPF_KEY_LEN   = 32,  /* a session key */
    TCPF_HDR_LEN   = 72,

    TCPF_HELLO_OK = 0,
    TCPF_HELLO_BAD_VERSION,
    TCPF_HELLO_WRONG_HOST,
    TCPF_HELLO_NO_CONTEXT,
    TCPF_HELLO_BAD_SECRET,
    TCPF_HELLO_BAD_KEY,

    TCPF_STEP_HELLO = 1,   /* the handshake's messages */
    TCPF_STEP_CHALLENGE,
    TCPF_STEP_PROOF,
    TCPF_STEP_VERDICT,

    TCPF_MAC_ACCEPTOR = 1, /* what a MAC proves (hca_tcp_auth.h) */
    TCPF_MAC_CONNECTOR,
    TCPF_MAC_IDENTITY,
    TCPF_MAC_RESUME,
    TCPF_MAC_JOIN,
    TCPF_MAC_RESUMED,

    TCPF_CONT_NONE = 0,    /* what a PROOF continues (hca_tcp_cont_t) */
    TCPF_CONT_RESUME,
    TCPF_CONT_JOIN,

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
    uint64_t nonce;
    uint64_t incarn;  /* HELLO, CHALLENGE */
    uint8_t  cont;    /* PROOF: TCPF_CONT_* */
    uint8_t  kx[TCPF_KX_LEN];    /* HELLO, CHALLENGE: ephemeral public key */
    uint8_t  mac[TCPF_MAC_LEN];
    uint8_t  proof[TCPF_MAC_LEN];
    uint8_t  cont_mac[TCPF_MAC_LEN];
    /* not on the wire: the sender's ephemeral secret (tcpf_kx_new) */
    uint8_t  kx_sk[TCPF_KX_LEN];
} tcpf_hello_t;

/* hca_tcp_transcript_t's fields */
typedef struct tcpf_transcript {
    uint64_t nonce_c, nonce_a;
    uint64_t conn_host;
    uint32_t conn_pid, conn_ctx;
    uint64_t acc_host;
    uint32_t acc_pid, acc_ctx;
    uint64_t conn_incarn, acc_incarn;
    uint8_t  kx_c[TCPF_KX_LEN], kx_a[TCPF_KX_LEN];
} tcpf_transcript_t;

/* A handshake as one of its ends knows it: the transcript and the
 * session key (what a RESUME or JOIN of that session proves). */
typedef struct tcpf_session {
    tcpf_transcript_t t;
    uint8_t           key[TCPF_KEY_LEN];
} tcpf_session_t;

/* hca_tcp_mac, hca_tcp_key_mac (the library's own code, on the test's
 * transcript) */
void tcpf_mac(uint8_t out[TCPF_MAC_LEN], uint64_t secret, int kind,
              const tcpf_transcript_t *t);
void tcpf_key_mac(uint8_t out[TCPF_MAC_LEN], const uint8_t key[TCPF_KEY_LEN],
                  int kind, const tcpf_transcript_t *t);
/* n bytes at p are all 0 */
int tcpf_zero(const void *p, size_t n);

/* A new ephemeral key pair in h (kx and kx_sk): what a HELLO or a
 * CHALLENGE sends. */
void tcpf_kx_new(tcpf_hello_t *h);

/* The connector's next step after its HELLO h (with its key from
 * tcpf_kx_new) got the CHALLENGE ch from the context at (acc_host,
 * acc_pid, acc_ctx) whose secret is acc_secret: 1 and the PROOF in *proof
 * if ch is an OK challenge from that context and proves its secret, else
 * 0.  The PROOF's MAC is keyed by mac_secret (acc_secret, or a wrong one
 * to be refused), its identity proof by own_secret; it continues nothing
 * (tcpf_continue makes it a RESUME or JOIN).  *s (if not NULL): the
 * session, its key derived from h's secret and ch's key. */
int tcpf_prove(const tcpf_hello_t *h, const tcpf_hello_t *ch,
               uint64_t acc_host, uint32_t acc_pid, uint32_t acc_ctx,
               uint64_t acc_secret, uint64_t mac_secret, uint64_t own_secret,
               tcpf_hello_t *proof, tcpf_session_t *s);

/* The PROOF of session s continues (cont: TCPF_CONT_RESUME or JOIN) the
 * session whose key is key: cont_mac = MAC(key; RESUME or JOIN, s->t). */
void tcpf_continue(tcpf_hello_t *proof, const tcpf_session_t *s, int cont,
                   const uint8_t key[TCPF_KEY_LEN]);

/* The acceptor's side: the CHALLENGE *ch to HELLO h from the context at
 * (acc_host, acc_pid, acc_ctx) whose secret is acc_secret, with nonce_a
 * and incarnation incarn, and the session *s.  0, or -1 if h's key is a
 * low-order point. */
int tcpf_challenge(const tcpf_hello_t *h, uint64_t acc_host, uint32_t acc_pid,
                   uint32_t acc_ctx, uint64_t acc_secret, uint64_t nonce_a,
                   uint64_t incarn, tcpf_hello_t *ch, tcpf_session_t *s);

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
