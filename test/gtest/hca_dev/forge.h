/*
 * forge.h - what a forger of the same user can do to a receiver: map its
 * receive ring by the names its address gives, and publish slots of its
 * own making.  C (the wire structures use C11 atomics), called from the
 * googletest suites.
 */
#ifndef HCA_TEST_FORGE_H
#define HCA_TEST_FORGE_H

#include "hca_dev.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct forge forge_t;

/* A message header's fields, all of them the forger's choice. */
typedef struct forge_msg {
    uint8_t  op, flags, num_iov, data_off;
    uint32_t src_pid, src_ctx, src_qpn, dst_qpn, imm, length, msg_len;
} forge_msg_t;

/* Maps the receive ring of QP qpn of the context at addr. */
int  forge_open(const hca_port_addr_t *addr, uint32_t qpn, forge_t **f_p);
/* Publishes one slot (waits while the ring is full, up to timeout_ms):
 * the header, then n payload bytes at data_off.  0, or -ETIMEDOUT. */
int  forge_put(forge_t *f, const forge_msg_t *m, const void *payload,
               size_t n, int timeout_ms);
/* Claims one slot and never publishes it (as a producer killed while it
 * writes); 0, or -ETIMEDOUT. */
int  forge_claim(forge_t *f, int timeout_ms);
/* The first half of a claim: moves the ring's head past one slot and
 * stamps nothing (as a producer stopped between its head CAS and its
 * stamp); *idx_p is the slot.  0, or -EAGAIN when the ring is full. */
int  forge_take_head(forge_t *f, uint64_t *idx_p);
/* The second half (hca_ring_stamp_claim): 0 if the slot is still ours,
 * -1 if its consumer reaped it meanwhile. */
int  forge_stamp(forge_t *f, uint64_t idx);
void forge_close(forge_t *f);

#ifdef __cplusplus
}
#endif

#endif
