/*
 * shmem.c - OpenSHMEM over UCX (spml ucx), every result verified exactly:
 *
 *   put/get    shmem_putmem / shmem_getmem of 8 B .. 1 MiB into symmetric
 *              heap memory of the neighbours, shmem_long_p / shmem_long_g
 *   atomics    every PE shmem_long_atomic_fetch_add(+1) on PE 0's counter:
 *              the final value is exact and the fetched values are exactly
 *              0 .. N-1; shmem_long_atomic_compare_swap: one winner
 *   barrier    shmem_barrier_all between the phases
 *   collective shmem_broadcast64 and shmem_long_sum_to_all
 *
 * Exits non-zero (shmem_global_exit) on any mismatch.
 */
#include <shmem.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LEN  (1u << 20)
#define NFADD    100
#define NRED     64

static int me, npes;

static long counter;             /* symmetric (static) */
static long cas_cell;
static long red_src[NRED], red_dst[NRED];
static long bc_src[NRED], bc_dst[NRED];
static long pwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE > NRED / 2 + 1 ?
                 SHMEM_REDUCE_MIN_WRKDATA_SIZE : NRED / 2 + 1];
static long psync_red[SHMEM_REDUCE_SYNC_SIZE];
static long psync_bc[SHMEM_BCAST_SYNC_SIZE];

#define CHECK(cond, ...) \
    do { \
        if (!(cond)) { \
            fprintf(stderr, "shmem: PE %d: FAILED at %s:%d: ", me, __FILE__, \
                    __LINE__); \
            fprintf(stderr, __VA_ARGS__); \
            fputc('\n', stderr); \
            fflush(stderr); \
            shmem_global_exit(2); \
            exit(2); \
        } \
    } while (0)

static uint8_t pbyte(uint64_t seed, size_t i)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + i;
    x ^= x >> 29;
    return (uint8_t)(x * 0xbf58476d1ce4e5b9ull >> 56);
}

static void log0(const char *msg)
{
    if (me == 0) {
        printf("shmem: %s\n", msg);
        fflush(stdout);
    }
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long*)a, y = *(const long*)b;
    return (x > y) - (x < y);
}

int main(void)
{
    static const size_t sizes[] = {8, 1, 4096, 65537, MAX_LEN};
    uint8_t *heap, *local;
    long *fetched, *all_fetched;
    int right, left;

    shmem_init();
    me    = shmem_my_pe();
    npes  = shmem_n_pes();
    right = (me + 1) % npes;
    left  = (me + npes - 1) % npes;
    CHECK(npes >= 2, "needs at least 2 PEs");

    heap        = shmem_malloc(MAX_LEN);
    all_fetched = shmem_malloc(sizeof(long) * NFADD * npes);
    local       = malloc(MAX_LEN);
    fetched     = malloc(sizeof(long) * NFADD);
    CHECK(heap != NULL && all_fetched != NULL && local != NULL &&
          fetched != NULL, "allocation failed");
    for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; ++i) {
        psync_red[i] = SHMEM_SYNC_VALUE;
    }
    for (int i = 0; i < SHMEM_BCAST_SYNC_SIZE; ++i) {
        psync_bc[i] = SHMEM_SYNC_VALUE;
    }

    /* put / get */
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); ++k) {
        size_t len = sizes[k];

        memset(heap, 0xee, MAX_LEN);
        for (size_t i = 0; i < len; ++i) {
            local[i] = pbyte(k * 1000 + me, i);
        }
        shmem_barrier_all();
        shmem_putmem(heap, local, len, right);
        shmem_barrier_all();   /* completes the puts */
        for (size_t i = 0; i < len; ++i) {
            CHECK(heap[i] == pbyte(k * 1000 + left, i),
                  "put of %zu bytes from PE %d: byte %zu is 0x%02x", len,
                  left, i, heap[i]);
        }
        CHECK(len == MAX_LEN || heap[len] == 0xee,
              "put of %zu bytes wrote past its end", len);
        memset(local, 0, len);
        shmem_getmem(local, heap, len, right);
        for (size_t i = 0; i < len; ++i) {
            CHECK(local[i] == pbyte(k * 1000 + me, i),
                  "get of %zu bytes from PE %d: byte %zu is 0x%02x", len,
                  right, i, local[i]);
        }
        shmem_barrier_all();   /* nobody rewrites heap before the gets */
    }
    shmem_barrier_all();
    shmem_long_p((long*)heap + me, 1000 + me, 0);
    shmem_barrier_all();
    for (int p = 0; p < npes; ++p) {
        long v = shmem_long_g((long*)heap + p, 0);
        CHECK(v == 1000 + p, "shmem_long_g from PE 0 slot %d: %ld", p, v);
    }
    shmem_barrier_all();
    log0("put/get: 5 sizes up to 1 MiB, long p/g: verified");

    /* atomics: contended fetch-add on PE 0 */
    for (int i = 0; i < NFADD; ++i) {
        fetched[i] = shmem_long_atomic_fetch_add(&counter, 1, 0);
    }
    shmem_barrier_all();
    {
        long v = shmem_long_atomic_fetch(&counter, 0);
        CHECK(v == (long)NFADD * npes, "fetch_add counter %ld, expected %ld",
              v, (long)NFADD * npes);
    }
    shmem_putmem(all_fetched + me * NFADD, fetched, sizeof(long) * NFADD, 0);
    shmem_barrier_all();
    if (me == 0) {
        qsort(all_fetched, (size_t)NFADD * npes, sizeof(long), cmp_long);
        for (int i = 0; i < NFADD * npes; ++i) {
            CHECK(all_fetched[i] == i, "fetch_add: the fetched values are "
                  "not 0..%d (sorted[%d] = %ld)", NFADD * npes - 1, i,
                  all_fetched[i]);
        }
    }
    /* compare-and-swap race on the last PE */
    {
        long old = shmem_long_atomic_compare_swap(&cas_cell, 0, me + 1,
                                                  npes - 1);
        long fin, *olds = shmem_malloc(sizeof(long) * npes);
        int winners = 0;

        shmem_barrier_all();
        fin = shmem_long_atomic_fetch(&cas_cell, npes - 1);
        shmem_long_p(olds + me, old, 0);
        shmem_barrier_all();
        if (me == 0) {
            for (int p = 0; p < npes; ++p) {
                if (olds[p] == 0) {
                    ++winners;
                    CHECK(fin == p + 1, "cswap: PE %d won, cell holds %ld", p,
                          fin);
                } else {
                    CHECK(olds[p] == fin, "cswap: PE %d saw %ld, winner wrote "
                          "%ld", p, olds[p], fin);
                }
            }
            CHECK(winners == 1, "cswap: %d winners", winners);
        }
        shmem_barrier_all();
        shmem_free(olds);
    }
    log0("atomics: fetch_add counter exact, fetched values 0..N-1, "
         "compare_swap one winner");

    /* collectives */
    for (int i = 0; i < NRED; ++i) {
        red_src[i] = (long)(me + 1) * (i + 1);
        bc_src[i]  = (npes - 1 == me) ? 7000 + i : -1;
        bc_dst[i]  = -2;
    }
    shmem_barrier_all();
    shmem_long_sum_to_all(red_dst, red_src, NRED, 0, 0, npes, pwrk, psync_red);
    for (int i = 0; i < NRED; ++i) {
        long exp = (long)npes * (npes + 1) / 2 * (i + 1);
        CHECK(red_dst[i] == exp, "sum_to_all [%d] = %ld, expected %ld", i,
              red_dst[i], exp);
    }
    shmem_barrier_all();
    shmem_broadcast64(bc_dst, bc_src, NRED, npes - 1, 0, 0, npes, psync_bc);
    shmem_barrier_all();
    for (int i = 0; i < NRED; ++i) {
        /* the root's destination is not written */
        long exp = (me == npes - 1) ? -2 : 7000 + i;
        CHECK(bc_dst[i] == exp, "broadcast64 [%d] = %ld, expected %ld", i,
              bc_dst[i], exp);
    }
    shmem_barrier_all();
    log0("collectives: sum_to_all, broadcast64: verified");

    shmem_free(heap);
    shmem_free(all_fetched);
    free(local);
    free(fetched);
    if (me == 0) {
        printf("shmem: PASSED on %d PEs\n", npes);
    }
    shmem_finalize();
    return 0;
}
