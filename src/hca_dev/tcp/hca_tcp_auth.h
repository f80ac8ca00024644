/*
 * hca_tcp_auth.h - the tcp fabric's handshake proofs: SipHash-2-4 (a MAC
 * keyed by a context's 64-bit listener secret) over the handshake's
 * transcript, and their constant-time comparison (docs/TCP-WIRE.md,
 * "Connection set-up").  A secret never goes on the wire: only MACs of it.
 */
#ifndef HCA_TCP_AUTH_H
#define HCA_TCP_AUTH_H

#include <stddef.h>
#include <stdint.h>

/* SipHash-2-4 of msg under the 128-bit key k (16 bytes, little endian). */
uint64_t hca_siphash24(const uint8_t k[16], const void *msg, size_t len);

/* What a MAC says in a handshake: the purpose of each proof, so that one
 * cannot be replayed as another. */
typedef enum {
    HCA_TCP_MAC_ACCEPTOR  = 1, /* the acceptor knows its own secret */
    HCA_TCP_MAC_CONNECTOR = 2, /* the connector was given the acceptor's
                                  address (its secret) */
    HCA_TCP_MAC_IDENTITY  = 3, /* the connector knows its own secret: it is
                                  the context it claims to be */
    HCA_TCP_MAC_RESUME    = 4  /* the connector of a connection whose
                                  socket was lost, over that connection's
                                  last handshake: the acceptor's secret and
                                  those nonces together prove the same
                                  connector comes back */
} hca_tcp_mac_kind_t;

/* The handshake's transcript: both nonces, both identities and both
 * incarnations. */
typedef struct hca_tcp_transcript {
    uint64_t nonce_c, nonce_a;
    uint64_t conn_host;         /* the connector */
    uint32_t conn_pid, conn_ctx;
    uint64_t acc_host;          /* the acceptor */
    uint32_t acc_pid, acc_ctx;
    uint64_t conn_incarn, acc_incarn;
} hca_tcp_transcript_t;

/* MAC(secret; kind, transcript). */
uint64_t hca_tcp_mac(uint64_t secret, hca_tcp_mac_kind_t kind,
                     const hca_tcp_transcript_t *t);

/* a == b, in a time that does not depend on where they differ */
int hca_tcp_mac_equal(uint64_t a, uint64_t b);

/* A random 64-bit nonce (getrandom). */
uint64_t hca_tcp_nonce(void);

#endif
