/*
 * hca_tcp_auth.c - the handshake's MACs, key exchange and randomness over
 * libsodium (see hca_tcp_auth.h).  The encodings below are the wire
 * contract: docs/TCP-WIRE.md, "The MACs", lays them out byte by byte.
 */
#include "hca_tcp_auth.h"

#include <sodium.h>
#include <string.h>

/* the second half of a secret-keyed MAC's key: BLAKE2b takes keys of 16
 * bytes or more, and a listener secret is 8 */
static const uint8_t hca_tcp_mac_salt[8] = {'h', 'c', 'a', '-',
                                            't', 'c', 'p', '5'};
/* the session key's domain: it is never another protocol's hash */
static const char hca_tcp_key_label[] = "hca tcp session key, wire 5";

#define HCA_TCP_TRANSCRIPT_LEN (8 * 2 + 16 * 2 + 8 * 2 + 2 * HCA_TCP_KX_LEN)

int hca_tcp_auth_init(void)
{
    return (sodium_init() < 0) ? -1 : 0; /* 1: initialised before */
}

static uint8_t *hca_tcp_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; ++i) {
        *p++ = (uint8_t)(v >> (8 * i));
    }
    return p;
}

static uint8_t *hca_tcp_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; ++i) {
        *p++ = (uint8_t)(v >> (8 * i));
    }
    return p;
}

/* kind (1 byte), then the transcript's fields in order, little endian:
 * the same bytes on every host, whatever the struct's padding */
static size_t hca_tcp_transcript_encode(uint8_t *out, hca_tcp_mac_kind_t kind,
                                        const hca_tcp_transcript_t *t)
{
    uint8_t *p = out;

    *p++ = (uint8_t)kind;
    p = hca_tcp_put64(p, t->nonce_c);
    p = hca_tcp_put64(p, t->nonce_a);
    p = hca_tcp_put64(p, t->conn_host);
    p = hca_tcp_put32(p, t->conn_pid);
    p = hca_tcp_put32(p, t->conn_ctx);
    p = hca_tcp_put64(p, t->acc_host);
    p = hca_tcp_put32(p, t->acc_pid);
    p = hca_tcp_put32(p, t->acc_ctx);
    p = hca_tcp_put64(p, t->conn_incarn);
    p = hca_tcp_put64(p, t->acc_incarn);
    memcpy(p, t->kx_c, HCA_TCP_KX_LEN);
    p += HCA_TCP_KX_LEN;
    memcpy(p, t->kx_a, HCA_TCP_KX_LEN);
    p += HCA_TCP_KX_LEN;
    return (size_t)(p - out);
}

static void hca_tcp_keyed(uint8_t out[HCA_TCP_MAC_LEN], const uint8_t *key,
                          size_t key_len, hca_tcp_mac_kind_t kind,
                          const hca_tcp_transcript_t *t)
{
    uint8_t msg[1 + HCA_TCP_TRANSCRIPT_LEN];
    size_t len = hca_tcp_transcript_encode(msg, kind, t);

    (void)crypto_generichash(out, HCA_TCP_MAC_LEN, msg, len, key, key_len);
}

void hca_tcp_mac(uint8_t out[HCA_TCP_MAC_LEN], uint64_t secret,
                 hca_tcp_mac_kind_t kind, const hca_tcp_transcript_t *t)
{
    uint8_t key[16];

    hca_tcp_put64(key, secret);
    memcpy(key + 8, hca_tcp_mac_salt, sizeof(hca_tcp_mac_salt));
    hca_tcp_keyed(out, key, sizeof(key), kind, t);
    sodium_memzero(key, sizeof(key));
}

void hca_tcp_key_mac(uint8_t out[HCA_TCP_MAC_LEN],
                     const uint8_t key[HCA_TCP_KEY_LEN],
                     hca_tcp_mac_kind_t kind, const hca_tcp_transcript_t *t)
{
    hca_tcp_keyed(out, key, HCA_TCP_KEY_LEN, kind, t);
}

int hca_tcp_mac_equal(const uint8_t a[HCA_TCP_MAC_LEN],
                      const uint8_t b[HCA_TCP_MAC_LEN])
{
    return crypto_verify_16(a, b) == 0;
}

void hca_tcp_kx_new(uint8_t pk[HCA_TCP_KX_LEN], uint8_t sk[HCA_TCP_KX_LEN])
{
    randombytes_buf(sk, HCA_TCP_KX_LEN);
    (void)crypto_scalarmult_base(pk, sk);
}

int hca_tcp_session_key(uint8_t key[HCA_TCP_KEY_LEN],
                        const uint8_t sk[HCA_TCP_KX_LEN],
                        const uint8_t peer_pk[HCA_TCP_KX_LEN],
                        const hca_tcp_transcript_t *t)
{
    uint8_t shared[crypto_scalarmult_BYTES];
    uint8_t msg[1 + HCA_TCP_TRANSCRIPT_LEN];
    crypto_generichash_state st;
    size_t len;

    if (crypto_scalarmult(shared, sk, peer_pk) != 0) {
        return -1; /* an all-zero result: a low-order point */
    }
    len = hca_tcp_transcript_encode(msg, 0, t);
    (void)crypto_generichash_init(&st, NULL, 0, HCA_TCP_KEY_LEN);
    (void)crypto_generichash_update(&st, (const uint8_t*)hca_tcp_key_label,
                                    sizeof(hca_tcp_key_label) - 1);
    (void)crypto_generichash_update(&st, shared, sizeof(shared));
    (void)crypto_generichash_update(&st, msg, len);
    (void)crypto_generichash_final(&st, key, HCA_TCP_KEY_LEN);
    sodium_memzero(shared, sizeof(shared));
    sodium_memzero(&st, sizeof(st));
    return 0;
}

void hca_tcp_wipe(void *p, size_t len)
{
    sodium_memzero(p, len);
}

uint64_t hca_tcp_nonce(void)
{
    uint64_t n;

    randombytes_buf(&n, sizeof(n));
    return n;
}
