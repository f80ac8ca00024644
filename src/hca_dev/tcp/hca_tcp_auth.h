/*
 * hca_tcp_auth.h - the tcp fabric's handshake cryptography, all of it
 * libsodium's (docs/TCP-WIRE.md, "Connection set-up"):
 *   - MACs keyed by a context's 64-bit listener secret (the address is the
 *     credential): keyed BLAKE2b (crypto_generichash), 16 bytes;
 *   - an ephemeral X25519 key exchange (crypto_scalarmult) in every
 *     handshake, whose shared secret and transcript give the session key
 *     that only the two ends know: an eavesdropper who holds both
 *     addresses cannot compute it;
 *   - MACs keyed by a session key: what a RESUME or a JOIN proves;
 *   - random nonces and secrets (randombytes_buf).
 * A secret or a key never goes on the wire: only MACs of them and the
 * public halves of the ephemeral keys.
 */
#ifndef HCA_TCP_AUTH_H
#define HCA_TCP_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define HCA_TCP_MAC_LEN 16 /* every MAC on the wire */
#define HCA_TCP_KX_LEN  32 /* an X25519 public or secret key */
#define HCA_TCP_KEY_LEN 32 /* a session key */

/* libsodium's initialisation (idempotent, thread-safe): 0, or -1 if the
 * library cannot run here (no entropy source). */
int hca_tcp_auth_init(void);

/* What a MAC says in a handshake: the purpose of each proof, so that one
 * cannot be replayed as another. */
typedef enum {
    HCA_TCP_MAC_ACCEPTOR  = 1, /* secret-keyed: the acceptor knows its own
                                  secret, and these are its key and nonce */
    HCA_TCP_MAC_CONNECTOR = 2, /* secret-keyed (the acceptor's): the
                                  connector was given the acceptor's
                                  address */
    HCA_TCP_MAC_IDENTITY  = 3, /* secret-keyed (the connector's own): the
                                  connector is the context it claims */
    HCA_TCP_MAC_RESUME    = 4, /* session-keyed: the connector of a session
                                  whose socket was lost comes back */
    HCA_TCP_MAC_JOIN      = 5, /* session-keyed: a new connection (another
                                  path) is of the same session as one UP */
    HCA_TCP_MAC_RESUMED   = 6  /* session-keyed, the acceptor's VERDICT to a
                                  RESUME: the same acceptor takes it back */
} hca_tcp_mac_kind_t;

/* The handshake's transcript: both nonces, identities, incarnations and
 * ephemeral public keys.  Every MAC and the session key are over all of
 * it, so none is valid in another handshake. */
typedef struct hca_tcp_transcript {
    uint64_t nonce_c, nonce_a;
    uint64_t conn_host;         /* the connector */
    uint32_t conn_pid, conn_ctx;
    uint64_t acc_host;          /* the acceptor */
    uint32_t acc_pid, acc_ctx;
    uint64_t conn_incarn, acc_incarn;
    uint8_t  kx_c[HCA_TCP_KX_LEN], kx_a[HCA_TCP_KX_LEN];
} hca_tcp_transcript_t;

/* MAC(secret; kind, t): keyed by a listener secret. */
void hca_tcp_mac(uint8_t out[HCA_TCP_MAC_LEN], uint64_t secret,
                 hca_tcp_mac_kind_t kind, const hca_tcp_transcript_t *t);

/* MAC(key; kind, t): keyed by a session key. */
void hca_tcp_key_mac(uint8_t out[HCA_TCP_MAC_LEN],
                     const uint8_t key[HCA_TCP_KEY_LEN],
                     hca_tcp_mac_kind_t kind, const hca_tcp_transcript_t *t);

/* a == b (MACs), in a time that does not depend on where they differ */
int hca_tcp_mac_equal(const uint8_t a[HCA_TCP_MAC_LEN],
                      const uint8_t b[HCA_TCP_MAC_LEN]);

/* A new ephemeral X25519 key pair. */
void hca_tcp_kx_new(uint8_t pk[HCA_TCP_KX_LEN], uint8_t sk[HCA_TCP_KX_LEN]);

/* The session key of transcript t from our ephemeral secret sk and the
 * peer's public key in t (the connector's kx_a, the acceptor's kx_c):
 * BLAKE2b over the X25519 shared secret and t.  0, or -1 if the peer's
 * key is a low-order point (the shared secret would be known to anyone). */
int hca_tcp_session_key(uint8_t key[HCA_TCP_KEY_LEN],
                        const uint8_t sk[HCA_TCP_KX_LEN],
                        const uint8_t peer_pk[HCA_TCP_KX_LEN],
                        const hca_tcp_transcript_t *t);

/* Forgets a key or secret (not optimised away). */
void hca_tcp_wipe(void *p, size_t len);

/* A random 64-bit nonce. */
uint64_t hca_tcp_nonce(void);

#endif
