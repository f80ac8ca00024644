/*
 * hca_tcp_auth.c - SipHash-2-4 (Aumasson and Bernstein, 2012), written
 * here from the paper's definition and checked against its published
 * test vector (test_tcp.cc, TcpAuth), and the handshake's MACs built on
 * it.
 */
#include "hca_tcp_auth.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static inline uint64_t hca_sip_rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

static inline uint64_t hca_sip_le64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; --i) {
        v = (v << 8) | p[i];
    }
    return v;
}

#define HCA_SIPROUND(v0, v1, v2, v3) \
    do { \
        v0 += v1; v1 = hca_sip_rotl(v1, 13); v1 ^= v0; \
        v0 = hca_sip_rotl(v0, 32); \
        v2 += v3; v3 = hca_sip_rotl(v3, 16); v3 ^= v2; \
        v0 += v3; v3 = hca_sip_rotl(v3, 21); v3 ^= v0; \
        v2 += v1; v1 = hca_sip_rotl(v1, 17); v1 ^= v2; \
        v2 = hca_sip_rotl(v2, 32); \
    } while (0)

uint64_t hca_siphash24(const uint8_t k[16], const void *msg, size_t len)
{
    const uint8_t *in = msg;
    uint64_t k0 = hca_sip_le64(k), k1 = hca_sip_le64(k + 8);
    uint64_t v0 = 0x736f6d6570736575ull ^ k0;
    uint64_t v1 = 0x646f72616e646f6dull ^ k1;
    uint64_t v2 = 0x6c7967656e657261ull ^ k0;
    uint64_t v3 = 0x7465646279746573ull ^ k1;
    uint64_t b  = (uint64_t)len << 56, m;
    size_t left = len & 7;
    const uint8_t *end = in + (len - left);

    for (; in != end; in += 8) {
        m   = hca_sip_le64(in);
        v3 ^= m;
        HCA_SIPROUND(v0, v1, v2, v3);
        HCA_SIPROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    for (size_t i = 0; i < left; ++i) {
        b |= (uint64_t)in[i] << (8 * i);
    }
    v3 ^= b;
    HCA_SIPROUND(v0, v1, v2, v3);
    HCA_SIPROUND(v0, v1, v2, v3);
    v0 ^= b;
    v2 ^= 0xff;
    for (int i = 0; i < 4; ++i) {
        HCA_SIPROUND(v0, v1, v2, v3);
    }
    return v0 ^ v1 ^ v2 ^ v3;
}

static void hca_tcp_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; ++i) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

uint64_t hca_tcp_mac(uint64_t secret, hca_tcp_mac_kind_t kind,
                     const hca_tcp_transcript_t *t)
{
    uint8_t key[16], msg[72];

    /* the key: the secret and a fixed word (the secret is all the key's
     * entropy: 64 bits, as the address carries) */
    hca_tcp_put64(key, secret);
    hca_tcp_put64(key + 8, 0x6863612d74637032ull); /* "hca-tcp2" */
    hca_tcp_put64(msg, (uint64_t)kind);
    hca_tcp_put64(msg + 8, t->nonce_c);
    hca_tcp_put64(msg + 16, t->nonce_a);
    hca_tcp_put64(msg + 24, t->conn_host);
    hca_tcp_put64(msg + 32, ((uint64_t)t->conn_ctx << 32) | t->conn_pid);
    hca_tcp_put64(msg + 40, t->acc_host);
    hca_tcp_put64(msg + 48, ((uint64_t)t->acc_ctx << 32) | t->acc_pid);
    hca_tcp_put64(msg + 56, t->conn_incarn);
    hca_tcp_put64(msg + 64, t->acc_incarn);
    return hca_siphash24(key, msg, sizeof(msg));
}

int hca_tcp_mac_equal(uint64_t a, uint64_t b)
{
    volatile uint64_t d = a ^ b;

    return ((d | (0 - d)) >> 63) == 0;
}

uint64_t hca_tcp_nonce(void)
{
    uint64_t v = 0;
    struct timespec ts;

    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v)) {
        return v;
    }
    /* no entropy yet (early boot): unpredictable enough to be fresh, and
     * freshness is all a nonce must give (the secrets keep the MACs) */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^
        (uint64_t)(uintptr_t)&v;
    return v;
}
