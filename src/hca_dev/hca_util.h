/*
 * hca_util.h - the compiler hints and small helpers every file of the device
 * may use.
 * Private to libhcadev (not installed).
 */
#ifndef HCA_UTIL_H
#define HCA_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* as the library builds (-D_GNU_SOURCE) */
#endif

#include <stdint.h>

#define HCA_LIKELY(x)   __builtin_expect(!!(x), 1)
#define HCA_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HCA_INLINE      static inline __attribute__((always_inline))
#define HCA_NOINLINE    __attribute__((noinline))
#define HCA_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Monotonic time in ns (hca_host.c). */
uint64_t hca_now_ns(void);
/* The same clock as of its last tick (CLOCK_MONOTONIC_COARSE: never ahead
 * of hca_now_ns, behind by a tick at most, a few ns to read): for stamps
 * that liveness and retry timers compare in milliseconds, taken per
 * frame sent or received. */
uint64_t hca_coarse_ns(void);

static inline uint32_t hca_roundup_pow2(uint32_t v)
{
    uint32_t p = 1;
    while (p < v) {
        p <<= 1;
    }
    return p;
}

#endif
