/*
 * hca_tcp_wire.h - the tcp fabric's wire protocol: the handshake and the
 * frame header, and the checks every header read from the network passes
 * before anything uses it (docs/TCP-WIRE.md has them as tables).
 *
 * A connection joins two device contexts and carries the frames of all
 * their QPs.  First the four messages of the handshake, each a
 * hca_tcp_hello_t (connector, acceptor, connector, acceptor: a
 * challenge-response that proves both sides' secrets without sending
 * them, and an X25519 exchange that gives the session a key only its two
 * ends know); then frames follow, each a hca_tcp_hdr_t and `length` bytes of
 * payload.  Fields are little
 * endian (the fabric is built for little-endian hosts only: see the
 * assertion below).
 */
#ifndef HCA_TCP_WIRE_H
#define HCA_TCP_WIRE_H

#include "hca_dev.h"
#include "hca_wire.h"

#include <stdint.h>

#if !defined(__BYTE_ORDER__) || (__BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__)
#error "the tcp fabric's wire format is little endian, as its hosts are"
#endif

#define HCA_TCP_MAGIC    0x50544348u       /* "HCTP" */
#define HCA_TCP_VERSION  5                 /* 2: the challenge-response
                                              handshake; 3: sequence
                                              numbers checked, duplicates,
                                              resume after a reconnect; 4:
                                              WRITEs striped over paths; 5:
                                              an X25519 session key in
                                              every handshake, RESUME and
                                              JOIN prove it */
#define HCA_TCP_SEG_MAX  (64u * 1024)      /* payload of a WRITE or
                                              READ_RESP frame: a large
                                              transfer is cut into these,
                                              so other QPs' frames pass */
#define HCA_TCP_SEND_MAX HCA_SLOT_PAYLOAD  /* payload of a SEND frame: one
                                              receive ring slot */

/* ------------------------------------------------------------ handshake */

typedef enum {
    HCA_TCP_HELLO_OK = 0,
    HCA_TCP_HELLO_BAD_VERSION,   /* not our protocol version */
    HCA_TCP_HELLO_WRONG_HOST,    /* the connector wanted another host */
    HCA_TCP_HELLO_NO_CONTEXT,    /* no such context here (pid, ctx), or
                                    no session to resume */
    HCA_TCP_HELLO_BAD_SECRET,    /* it did not get our address from the
                                    application */
    HCA_TCP_HELLO_BAD_KEY,       /* its ephemeral key is a low-order point */
    HCA_TCP_HELLO_LAST
} hca_tcp_hello_status_t;

/* The handshake's messages, in order (hca_tcp_hello_t.step). */
typedef enum {
    HCA_TCP_STEP_HELLO = 1, /* connector: who it is, who it wants, nonce_c,
                               its ephemeral key kx_c */
    HCA_TCP_STEP_CHALLENGE, /* acceptor: status; if OK its identity,
                               nonce_a, kx_a and mac = MAC(its secret;
                               ACCEPTOR) */
    HCA_TCP_STEP_PROOF,     /* connector: mac = MAC(acceptor's secret;
                               CONNECTOR), proof = MAC(its own secret;
                               IDENTITY), and for a continuation cont_mac =
                               MAC(the session's key; RESUME or JOIN) */
    HCA_TCP_STEP_VERDICT,   /* acceptor: status OK or a refusal; to a
                               RESUME, mac = MAC(the session's key;
                               RESUMED) */
    HCA_TCP_STEP_LAST
} hca_tcp_step_t;

/* What a PROOF continues (hca_tcp_hello_t.cont). */
typedef enum {
    HCA_TCP_CONT_NONE = 0, /* a session of its own */
    HCA_TCP_CONT_RESUME,   /* the connection whose socket was lost: the
                              same connection object goes on */
    HCA_TCP_CONT_JOIN,     /* another path of a session that is UP: it
                              shares that session's responder records */
    HCA_TCP_CONT_LAST
} hca_tcp_cont_t;

/* Every handshake message (docs/TCP-WIRE.md, "Connection set-up").  A
 * refusal carries the status only: no identity of the refuser, all other
 * fields 0.  No secret and no key is ever sent: only MACs keyed by them
 * (hca_tcp_auth.h) over the whole transcript, and the public halves of
 * the ephemeral keys. */
typedef struct hca_tcp_hello {
    uint32_t magic;
    uint16_t version;
    uint8_t  step;        /* hca_tcp_step_t */
    uint8_t  status;      /* answers: hca_tcp_hello_status_t */
    uint64_t src_host;    /* hca_host_key() of the sender */
    uint32_t src_pid;
    uint32_t src_ctx;
    uint64_t dst_host;    /* HELLO: who the connector wants (from the
                             address); else 0 */
    uint32_t dst_pid;
    uint32_t dst_ctx;
    uint64_t nonce;       /* HELLO: nonce_c; CHALLENGE: nonce_a */
    uint64_t incarn;      /* HELLO, CHALLENGE: the sender's incarnation
                             (random per device open; 0: a peer that
                             cannot resume): a peer that restarted is
                             never fed a replay */
    uint8_t  cont;        /* PROOF: hca_tcp_cont_t */
    uint8_t  reserved[7]; /* 0 */
    uint8_t  kx[32];      /* HELLO, CHALLENGE: the sender's ephemeral
                             X25519 public key */
    uint8_t  mac[16];     /* CHALLENGE: mac_a; PROOF: mac_c; VERDICT of a
                             RESUME: MAC(key; RESUMED) */
    uint8_t  proof[16];   /* PROOF: proof of the connector's identity */
    uint8_t  cont_mac[16];/* PROOF with cont: MAC(key; RESUME or JOIN) */
} hca_tcp_hello_t;

/* ------------------------------------------------------------ frames */

typedef enum {
    HCA_TCP_OP_SEND = 1,   /* a fragment of a SEND: [offset, +length) of
                              a total-byte message */
    HCA_TCP_OP_WRITE,      /* bytes for [remote_addr, +length): the part at
                              offset of a total-byte RDMA WRITE */
    HCA_TCP_OP_READ,       /* read total bytes at remote_addr; answered
                              from offset (0, or where an answer that
                              came in part is to go on) */
    HCA_TCP_OP_ATOMIC,     /* atomic_op on remote_addr */
    HCA_TCP_OP_ACK,        /* the end of a request: syndrome, value */
    HCA_TCP_OP_READ_RESP,  /* bytes [offset, +length) of a READ */
    HCA_TCP_OP_KEEPALIVE,  /* nothing: its sender lives */
    HCA_TCP_OP_BYE,        /* its sender closes its context: the
                              connection ends, it is not to be resumed */
    HCA_TCP_OP_LAST
} hca_tcp_op_t;

enum {
    HCA_TCP_F_FIRST    = 1u << 0, /* SEND: first fragment */
    HCA_TCP_F_LAST     = 1u << 1, /* SEND, WRITE, READ_RESP: last part:
                                     the request is answered after it */
    HCA_TCP_F_IMM      = 1u << 2, /* SEND, WRITE: carries imm (a WRITE's
                                     last part consumes a receive) */
    HCA_TCP_F_ATOMIC32 = 1u << 3, /* ATOMIC: 4-byte operands */
    HCA_TCP_F_START    = 1u << 4, /* SEND, WRITE, READ, ATOMIC: the frame
                                     at the requester QP's start PSN (its
                                     first since it was connected) */
    HCA_TCP_F_STRIPED  = 1u << 5, /* WRITE, READ_RESP: its parts go over
                                     two paths, so a part may come ahead
                                     of those before it: placed at its
                                     offset (WRITE: hca_tcp_rel.c;
                                     READ_RESP: hca_tcp_resp.c).  READ:
                                     its answer may be striped (nothing
                                     else of the QP is unanswered) */
    HCA_TCP_F_ALL      = (1u << 6) - 1
};

/* An ACK's syndrome beyond the statuses: "a request frame came ahead of
 * the PSN expected, which the ACK's psn names": the requester sends again
 * from there (docs/TCP-WIRE.md, "Sequence, duplicates, replay"). */
#define HCA_TCP_SYN_PSN_SEQ 0x80

typedef struct hca_tcp_hdr {
    uint8_t  version;     /* HCA_TCP_VERSION */
    uint8_t  opcode;      /* hca_tcp_op_t */
    uint8_t  flags;       /* HCA_TCP_F_* */
    uint8_t  syndrome;    /* ACK: hca_wc_status_t (0: success) */
    uint32_t length;      /* payload bytes after the header */
    uint32_t src_qpn;     /* the sender's QP */
    uint32_t dst_qpn;     /* the receiver's QP */
    uint32_t psn;         /* requests: the frame's sequence number in its
                             requester QP; ACK, READ_RESP: the psn of the
                             request answered (every frame before it was
                             executed); PSN_SEQ NAK: the psn expected */
    uint32_t rkey;        /* WRITE, READ, ATOMIC */
    uint64_t remote_addr; /* WRITE: of this frame's bytes; READ, ATOMIC:
                             of the operation */
    uint32_t resp_idx;    /* the requester's response slot ... */
    uint32_t resp_stamp;  /* ... and the stamp its answer bears */
    uint32_t offset;      /* SEND, WRITE, READ_RESP: of this payload */
    uint32_t total;       /* SEND, WRITE: message bytes; READ, READ_RESP:
                             bytes read */
    uint32_t imm;
    uint8_t  atomic_op;   /* ATOMIC: hca_wr_opcode_t */
    uint8_t  reserved[3];
    uint64_t operand;     /* ATOMIC: add / compare / bitwise / swap value;
                             ACK of an ATOMIC: the old value */
    uint64_t swap;        /* ATOMIC CMP_SWP: the new value */
} hca_tcp_hdr_t;

_Static_assert(sizeof(hca_tcp_hello_t) == 144, "tcp hello layout");
_Static_assert(__builtin_offsetof(hca_tcp_hello_t, src_host) == 8 &&
               __builtin_offsetof(hca_tcp_hello_t, dst_host) == 24 &&
               __builtin_offsetof(hca_tcp_hello_t, nonce) == 40 &&
               __builtin_offsetof(hca_tcp_hello_t, incarn) == 48 &&
               __builtin_offsetof(hca_tcp_hello_t, cont) == 56 &&
               __builtin_offsetof(hca_tcp_hello_t, kx) == 64 &&
               __builtin_offsetof(hca_tcp_hello_t, mac) == 96 &&
               __builtin_offsetof(hca_tcp_hello_t, proof) == 112 &&
               __builtin_offsetof(hca_tcp_hello_t, cont_mac) == 128,
               "tcp hello layout");
_Static_assert(sizeof(hca_tcp_hdr_t) == 72, "tcp frame header layout");

/* Why a header was refused (0: it is well formed). */
typedef enum {
    HCA_TCP_HDR_OK = 0,
    HCA_TCP_HDR_VERSION,   /* another protocol version */
    HCA_TCP_HDR_OPCODE,    /* no such opcode */
    HCA_TCP_HDR_FLAGS,     /* flags the opcode does not take */
    HCA_TCP_HDR_LENGTH,    /* payload over the opcode's limit */
    HCA_TCP_HDR_RANGE,     /* offset, length and total disagree */
    HCA_TCP_HDR_ATOMIC,    /* not an atomic opcode, or misaligned */
    HCA_TCP_HDR_SYNDROME,  /* an ACK's status that does not exist */
    HCA_TCP_HDR_LAST
} hca_tcp_hdr_err_t;

/* The checks of a header read from the network, against itself and the
 * limits (hca_tcp_frame.c): it is our protocol, and what it says of the
 * stream (its payload, the parts of a message) fits what it carries.  A
 * header that fails them closes the connection: what follows it cannot
 * be found.  What describes only the request - the QPN, key, rights, the
 * remote range and the size read - is the responder's check after it,
 * and a refusal is a NAK to that request alone (hca_tcp_rx.c). */
hca_tcp_hdr_err_t hca_tcp_hdr_check(const hca_tcp_hdr_t *hdr);
extern const char *const hca_tcp_hdr_err_name[HCA_TCP_HDR_LAST];

/* The checks of the other side's hello. */
int hca_tcp_hello_check(const hca_tcp_hello_t *hello);

#endif
