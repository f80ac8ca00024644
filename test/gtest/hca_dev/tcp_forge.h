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
    TCPF_HELLO_LEN = 48,
    TCPF_HDR_LEN   = 72,

    TCPF_HELLO_OK = 0,
    TCPF_HELLO_BAD_VERSION,
    TCPF_HELLO_WRONG_HOST,
    TCPF_HELLO_NO_CONTEXT,
    TCPF_HELLO_BAD_SECRET,

    TCPF_OP_SEND = 1,
    TCPF_OP_WRITE,
    TCPF_OP_READ,
    TCPF_OP_ATOMIC,
    TCPF_OP_ACK,
    TCPF_OP_READ_RESP,
    TCPF_OP_KEEPALIVE,
    TCPF_OP_LAST,

    TCPF_F_FIRST    = 1 << 0,
    TCPF_F_LAST     = 1 << 1,
    TCPF_F_IMM      = 1 << 2,
    TCPF_F_ATOMIC32 = 1 << 3
};

extern const uint32_t tcpf_version;
extern const uint32_t tcpf_seg_max;   /* HCA_TCP_SEG_MAX */
extern const uint32_t tcpf_send_max;  /* HCA_TCP_SEND_MAX */
extern const uint32_t tcpf_max_msg;   /* HCA_MAX_MSG */

/* hca_tcp_hello_t's fields */
typedef struct tcpf_hello {
    uint32_t magic;   /* 0: HCA_TCP_MAGIC */
    uint16_t version; /* 0: HCA_TCP_VERSION */
    uint16_t status;
    uint64_t src_host;
    uint32_t src_pid, src_ctx;
    uint64_t dst_host;
    uint32_t dst_pid, dst_ctx;
    uint64_t secret;
} tcpf_hello_t;

/* hca_tcp_hdr_t's fields */
typedef struct tcpf_hdr {
    uint8_t  version, opcode, flags, syndrome;
    uint32_t length, src_qpn, dst_qpn, psn, rkey;
    uint64_t remote_addr;
    uint32_t resp_idx, resp_stamp, offset, total, imm;
    uint8_t  atomic_op;
    uint64_t operand, swap;
} tcpf_hdr_t;

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
