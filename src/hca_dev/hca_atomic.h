/*
 * hca_atomic.h - the device's atomic operations on memory it may touch
 * (its own, or a mapping): what every fabric's responder executes, so
 * that each opcode has one meaning everywhere.
 */
#ifndef HCA_ATOMIC_H
#define HCA_ATOMIC_H

#include "hca_dev.h"

#include <stdint.h>
#include <string.h>

/* Applies an atomic opcode to addr (size 4 or 8); returns the old value. */
static inline __attribute__((always_inline)) uint64_t hca_atomic_apply(uint8_t opcode, void *addr, int size,
                                 uint64_t operand, uint64_t swap)
{
    if (size == 4) {
        uint32_t *p = addr, v = (uint32_t)operand, old = 0;
        switch (opcode) {
        case HCA_WR_ATOMIC_FETCH_ADD:
        case HCA_WR_ATOMIC_ADD:
            old = __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
            break;
        case HCA_WR_ATOMIC_FETCH_AND:
        case HCA_WR_ATOMIC_AND:
            old = __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST);
            break;
        case HCA_WR_ATOMIC_FETCH_OR:
        case HCA_WR_ATOMIC_OR:
            old = __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
            break;
        case HCA_WR_ATOMIC_FETCH_XOR:
        case HCA_WR_ATOMIC_XOR:
            old = __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST);
            break;
        case HCA_WR_ATOMIC_SWAP:
            old = __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
            break;
        case HCA_WR_ATOMIC_CMP_SWP:
            old = v;
            __atomic_compare_exchange_n(p, &old, (uint32_t)swap, 0,
                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
            break;
        }
        return old;
    } else {
        uint64_t *p = addr, old = 0;
        switch (opcode) {
        case HCA_WR_ATOMIC_FETCH_ADD:
        case HCA_WR_ATOMIC_ADD:
            old = __atomic_fetch_add(p, operand, __ATOMIC_SEQ_CST);
            break;
        case HCA_WR_ATOMIC_FETCH_AND:
        case HCA_WR_ATOMIC_AND:
            old = __atomic_fetch_and(p, operand, __ATOMIC_SEQ_CST);
            break;
        case HCA_WR_ATOMIC_FETCH_OR:
        case HCA_WR_ATOMIC_OR:
            old = __atomic_fetch_or(p, operand, __ATOMIC_SEQ_CST);
            break;
        case HCA_WR_ATOMIC_FETCH_XOR:
        case HCA_WR_ATOMIC_XOR:
            old = __atomic_fetch_xor(p, operand, __ATOMIC_SEQ_CST);
            break;
        case HCA_WR_ATOMIC_SWAP:
            old = __atomic_exchange_n(p, operand, __ATOMIC_SEQ_CST);
            break;
        case HCA_WR_ATOMIC_CMP_SWP:
            old = operand;
            __atomic_compare_exchange_n(p, &old, swap, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST);
            break;
        }
        return old;
    }
}

/* Stores an atomic's old value as its size says (4 or 8 bytes). */
static inline __attribute__((always_inline)) void hca_atomic_store_old(void *dst, int size, uint64_t old)
{
    if (size == 4) {
        uint32_t v = (uint32_t)old;
        memcpy(dst, &v, sizeof(v));
    } else {
        memcpy(dst, &old, sizeof(old));
    }
}

#endif
