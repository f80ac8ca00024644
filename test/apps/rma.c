/*
 * rma.c - MPI one-sided communication, every result verified exactly.
 *
 * For a window from MPI_Win_create (user memory) and one from
 * MPI_Win_allocate:
 *
 *   fence      MPI_Put / MPI_Get of 8 B .. 4 MiB to the neighbours, a strided
 *              put (vector datatype), Accumulate SUM on int and double
 *   lock       shared: concurrent Accumulate and Get; exclusive: a
 *              get-increment-put read-modify-write that is only exact if
 *              exclusive epochs never overlap, and a block every reader must
 *              see whole
 *   lock_all   Put + flush + Get back of a slot per origin in every target,
 *              MPI_Rput/MPI_Rget
 *   atomics    a contended counter: every rank MPI_Fetch_and_op(+1) on one
 *              counter; the final value is exact and the fetched values are
 *              exactly 0 .. N-1; MPI_Get_accumulate likewise;
 *              MPI_Compare_and_swap: one winner of a race, and a CAS-loop
 *              counter
 *   PSCW       post/start/complete/wait on a ring: Put, Get, Accumulate
 *
 * MPI_Win_create_dynamic is tested by rma_dynamic.c (Debian's OpenMPI 4.1.4
 * crashes when such a window is freed; see run-apps.sh).
 *
 * usage: rma [-q] [-t TESTS] [-w WINDOWS] [-T SECONDS] [-U FILE]
 *   -q          quick: fewer iterations
 *   -t TESTS    comma-separated subset of fence,lock,lock_all,atomics,pscw
 *   -w WINDOWS  comma-separated subset of create,allocate
 *   -T SECONDS  run every test again (new windows, every check again)
 *               until SECONDS have passed since the first round began
 *   -U FILE     ... or until FILE exists (rank 0 looks after each round;
 *               with -T too, until either): run-apps.sh's flap case keeps
 *               the job running while it takes links down
 */
#include "apps_common.h"

#include <unistd.h>

#define DATA_LEN   ((4u << 20) + 64)
#define NACC       512
#define SLOT_LEN   65536
#define BLK_LEN    4096

enum {
    OFF_DATA = 0,
    OFF_IACC = OFF_DATA + DATA_LEN,
    OFF_DACC = OFF_IACC + NACC * sizeof(int),
    OFF_CNT  = OFF_DACC + NACC * sizeof(double),   /* fetch_and_op counter */
    OFF_CAS  = OFF_CNT + 8,                        /* CAS race cell */
    OFF_CASC = OFF_CAS + 8,                        /* CAS-loop counter */
    OFF_EXC  = OFF_CASC + 8,                       /* exclusive-lock counter */
    OFF_GACC = OFF_EXC + 8,                        /* get_accumulate counter */
    OFF_BLK  = OFF_GACC + 8,                       /* consistency block */
    WIN_LEN  = OFF_BLK + BLK_LEN
};

static int quick;
static const char *windows = "create,allocate";   /* -w LIST */
static const char *flavor;
static int left, right;

static const char *only;      /* -t LIST: run only these tests */

static int selected(const char *name)
{
    size_t len = strlen(name);
    const char *p;

    if (only == NULL) {
        return 1;
    }
    for (p = only; (p = strstr(p, name)) != NULL; p += len) {
        if ((p == only || p[-1] == ',') && (p[len] == '\0' || p[len] == ',')) {
            return 1;
        }
    }
    return 0;
}

static uint64_t seed_of(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    return (((a * 1000003u + b) * 1000003u + c) * 1000003u + d) | 1u;
}

static int ival(int r, int i)
{
    return (r + 1) * 1000 + i * 3 - 700;
}

static double dval(int r, int i)
{
    return (double)ival(r, i) * 0.125 + 0.5;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
    return (x > y) - (x < y);
}

/* Rank 0 gathers n values from every rank and checks that together they
 * are exactly 0 .. n*size-1. */
static void check_permutation(int64_t *vals, int n, const char *what)
{
    int64_t *all = NULL;

    if (app_rank == 0) {
        all = xmalloc(sizeof(int64_t) * n * app_size);
    }
    MPI_CHECK(MPI_Gather(vals, n, MPI_INT64_T, all, n, MPI_INT64_T, 0,
                         MPI_COMM_WORLD));
    if (app_rank == 0) {
        qsort(all, (size_t)n * app_size, sizeof(int64_t), cmp_i64);
        for (int i = 0; i < n * app_size; ++i) {
            CHECK(all[i] == i, "%s (%s): the fetched values are not 0..%d: "
                  "sorted[%d] = %lld", what, flavor, n * app_size - 1, i,
                  (long long)all[i]);
        }
        free(all);
    }
}

/* Read a 64-bit value of target's window (an atomic read). */
static int64_t read_i64(MPI_Win win, int target, MPI_Aint off)
{
    int64_t v = -1, dummy = 0;

    MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, target, 0, win));
    MPI_CHECK(MPI_Fetch_and_op(&dummy, &v, MPI_INT64_T, target, off,
                               MPI_NO_OP, win));
    MPI_CHECK(MPI_Win_unlock(target, win));
    return v;
}

/* ---------------------------------------------------------------- fence */

static void test_fence(MPI_Win win, char *base)
{
    static const size_t sizes[] = {8, 1, 4096, 65537, 1u << 20, 4u << 20};
    size_t nsizes = quick ? 5 : sizeof(sizes) / sizeof(sizes[0]);
    char *buf     = xmalloc(DATA_LEN);

    for (size_t k = 0; k < nsizes; ++k) {
        size_t size = sizes[k];

        /* Put my pattern into my right neighbour's data region. */
        memset(base + OFF_DATA, 0xee, DATA_LEN);
        pattern_fill(buf, size, seed_of(1, size, app_rank, 0));
        MPI_CHECK(MPI_Win_fence(0, win));
        MPI_CHECK(MPI_Put(buf, (int)size, MPI_BYTE, right, OFF_DATA + 16,
                          (int)size, MPI_BYTE, win));
        MPI_CHECK(MPI_Win_fence(0, win));
        CHECK_PATTERN(base + OFF_DATA + 16, size, seed_of(1, size, left, 0),
                      "fence put (%s) of %zu bytes from %d", flavor, size,
                      left);
        for (int i = 0; i < 16; ++i) {
            CHECK((uint8_t)base[OFF_DATA + i] == 0xee &&
                  (uint8_t)base[OFF_DATA + 16 + size + i] == 0xee,
                  "fence put (%s) of %zu bytes wrote outside its range",
                  flavor, size);
        }

        /* Get it back from the left neighbour: its region holds the
         * pattern of its own left neighbour. */
        memset(buf, 0xee, size);
        MPI_CHECK(MPI_Get(buf, (int)size, MPI_BYTE, left, OFF_DATA + 16,
                          (int)size, MPI_BYTE, win));
        MPI_CHECK(MPI_Win_fence(0, win));
        CHECK_PATTERN(buf, size, seed_of(1, size, (left + app_size - 1) %
                                         app_size, 0),
                      "fence get (%s) of %zu bytes from %d", flavor, size,
                      left);
    }

    /* Strided put: 100 blocks of 16 bytes, stride 48. */
    {
        MPI_Datatype vec;
        char *src = xmalloc(100 * 48);

        MPI_CHECK(MPI_Type_vector(100, 16, 48, MPI_BYTE, &vec));
        MPI_CHECK(MPI_Type_commit(&vec));
        pattern_fill(src, 100 * 48, seed_of(2, 0, app_rank, 0));
        memset(base + OFF_DATA, 0xee, 100 * 48);
        MPI_CHECK(MPI_Win_fence(0, win));
        MPI_CHECK(MPI_Put(src, 1, vec, right, OFF_DATA, 1, vec, win));
        MPI_CHECK(MPI_Win_fence(0, win));
        pattern_fill(src, 100 * 48, seed_of(2, 0, left, 0));
        for (int b = 0; b < 100; ++b) {
            CHECK(memcmp(base + OFF_DATA + b * 48, src + b * 48, 16) == 0,
                  "strided put (%s): block %d differs", flavor, b);
            for (int g = 16; g < 48; ++g) {
                CHECK((uint8_t)base[OFF_DATA + b * 48 + g] == 0xee,
                      "strided put (%s): gap byte %d of block %d written",
                      flavor, g, b);
            }
        }
        MPI_CHECK(MPI_Type_free(&vec));
        free(src);
    }

    /* Accumulate SUM int and double from every rank into every rank. */
    {
        int *isrc    = xmalloc(NACC * sizeof(int));
        double *dsrc = xmalloc(NACC * sizeof(double));
        int *iacc    = (int*)(base + OFF_IACC);
        double *dacc = (double*)(base + OFF_DACC);

        for (int i = 0; i < NACC; ++i) {
            isrc[i] = ival(app_rank, i);
            dsrc[i] = dval(app_rank, i);
            iacc[i] = i;
            dacc[i] = 0.25 * i;
        }
        MPI_CHECK(MPI_Win_fence(0, win));
        for (int t = 0; t < app_size; ++t) {
            MPI_CHECK(MPI_Accumulate(isrc, NACC, MPI_INT, t, OFF_IACC, NACC,
                                     MPI_INT, MPI_SUM, win));
            MPI_CHECK(MPI_Accumulate(dsrc, NACC, MPI_DOUBLE, t, OFF_DACC,
                                     NACC, MPI_DOUBLE, MPI_SUM, win));
        }
        MPI_CHECK(MPI_Win_fence(0, win));
        for (int i = 0; i < NACC; ++i) {
            int iexp    = i;
            double dexp = 0.25 * i;
            for (int r = 0; r < app_size; ++r) {
                iexp += ival(r, i);
                dexp += dval(r, i);
            }
            CHECK(iacc[i] == iexp, "fence accumulate SUM int (%s): [%d] = %d, "
                  "expected %d", flavor, i, iacc[i], iexp);
            CHECK(dacc[i] == dexp, "fence accumulate SUM double (%s): [%d] = "
                  "%.17g, expected %.17g", flavor, i, dacc[i], dexp);
        }
        free(isrc);
        free(dsrc);
    }
    /* End the fence epochs: passive-target epochs follow. */
    MPI_CHECK(MPI_Win_fence(MPI_MODE_NOSUCCEED, win));
    free(buf);
    app_log("fence (%s): put/get %zu sizes up to %zu bytes, strided put, "
            "accumulate SUM int and double", flavor, nsizes,
            sizes[nsizes - 1]);
}

/* ----------------------------------------------------------------- lock */

static void test_lock(MPI_Win win, char *base)
{
    int iters  = quick ? 10 : 40;
    int target = 1 % app_size;
    int *isrc  = xmalloc(NACC * sizeof(int));
    char *buf  = xmalloc(BLK_LEN);
    int64_t v;

    /* Shared: concurrent accumulates into every target (accumulates are
     * atomic per element), concurrent gets of the data region. */
    for (int i = 0; i < NACC; ++i) {
        ((int*)(base + OFF_IACC))[i] = 0;
        isrc[i] = ival(app_rank, i);
    }
    memset(base + OFF_DATA, 0, SLOT_LEN);
    pattern_fill(base + OFF_DATA, SLOT_LEN, seed_of(3, 0, app_rank, 0));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    for (int t = 0; t < app_size; ++t) {
        int dst = (app_rank + t) % app_size;
        char *got = xmalloc(SLOT_LEN);
        MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, dst, 0, win));
        for (int k = 0; k < 3; ++k) {
            MPI_CHECK(MPI_Accumulate(isrc, NACC, MPI_INT, dst, OFF_IACC, NACC,
                                     MPI_INT, MPI_SUM, win));
        }
        MPI_CHECK(MPI_Get(got, SLOT_LEN, MPI_BYTE, dst, OFF_DATA, SLOT_LEN,
                          MPI_BYTE, win));
        MPI_CHECK(MPI_Win_unlock(dst, win));
        CHECK_PATTERN(got, SLOT_LEN, seed_of(3, 0, dst, 0),
                      "lock shared get (%s) from %d", flavor, dst);
        free(got);
    }
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, app_rank, 0, win));
    MPI_CHECK(MPI_Win_sync(win));
    for (int i = 0; i < NACC; ++i) {
        int exp = 0;
        for (int r = 0; r < app_size; ++r) {
            exp += 3 * ival(r, i);
        }
        CHECK(((int*)(base + OFF_IACC))[i] == exp,
              "lock shared accumulate (%s): [%d] = %d, expected %d", flavor,
              i, ((int*)(base + OFF_IACC))[i], exp);
    }
    MPI_CHECK(MPI_Win_unlock(app_rank, win));

    /* Exclusive: read-modify-write of a counter with get + put, and a block
     * that must always be seen whole (the last writer's pattern). */
    for (int it = 0; it < iters; ++it) {
        int64_t cnt = -1;
        int32_t hdr[2];

        MPI_CHECK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, target, 0, win));
        MPI_CHECK(MPI_Get(&cnt, 1, MPI_INT64_T, target, OFF_EXC, 1,
                          MPI_INT64_T, win));
        MPI_CHECK(MPI_Get(buf, BLK_LEN, MPI_BYTE, target, OFF_BLK, BLK_LEN,
                          MPI_BYTE, win));
        MPI_CHECK(MPI_Win_flush(target, win));
        memcpy(hdr, buf, sizeof(hdr));
        if (cnt > 0) {
            CHECK_PATTERN(buf + 8, BLK_LEN - 8, seed_of(4, hdr[1], hdr[0], 0),
                          "exclusive lock (%s): block written by %d (round %d)"
                          " read by %d", flavor, hdr[0], hdr[1], app_rank);
        }
        ++cnt;
        hdr[0] = app_rank;
        hdr[1] = it;
        memcpy(buf, hdr, sizeof(hdr));
        pattern_fill(buf + 8, BLK_LEN - 8, seed_of(4, it, app_rank, 0));
        MPI_CHECK(MPI_Put(&cnt, 1, MPI_INT64_T, target, OFF_EXC, 1,
                          MPI_INT64_T, win));
        MPI_CHECK(MPI_Put(buf, BLK_LEN, MPI_BYTE, target, OFF_BLK, BLK_LEN,
                          MPI_BYTE, win));
        MPI_CHECK(MPI_Win_unlock(target, win));
    }
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    v = read_i64(win, target, OFF_EXC);
    CHECK(v == (int64_t)iters * app_size, "exclusive lock (%s): counter %lld, "
          "expected %lld", flavor, (long long)v,
          (long long)iters * app_size);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    free(isrc);
    free(buf);
    app_log("lock (%s): shared accumulate+get, exclusive get-increment-put "
            "x%d per rank exact", flavor, iters);
}

/* ------------------------------------------------------------- lock_all */

static void test_lock_all(MPI_Win win, char *base)
{
    char *buf = xmalloc(SLOT_LEN);
    char *got = xmalloc(SLOT_LEN);

    memset(base + OFF_DATA, 0xee, (size_t)SLOT_LEN * app_size);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    MPI_CHECK(MPI_Win_lock_all(0, win));
    for (int k = 0; k < app_size; ++k) {
        int t = (app_rank + k) % app_size;
        MPI_Aint off = OFF_DATA + (MPI_Aint)app_rank * SLOT_LEN;
        MPI_Request req[2];

        pattern_fill(buf, SLOT_LEN, seed_of(5, t, app_rank, 0));
        MPI_CHECK(MPI_Put(buf, SLOT_LEN / 2, MPI_BYTE, t, off, SLOT_LEN / 2,
                          MPI_BYTE, win));
        MPI_CHECK(MPI_Rput(buf + SLOT_LEN / 2, SLOT_LEN / 2, MPI_BYTE, t,
                           off + SLOT_LEN / 2, SLOT_LEN / 2, MPI_BYTE, win,
                           &req[0]));
        MPI_CHECK(MPI_Wait(&req[0], MPI_STATUS_IGNORE));
        MPI_CHECK(MPI_Win_flush(t, win));
        /* After the flush, a get of the same bytes must see them. */
        memset(got, 0, SLOT_LEN);
        MPI_CHECK(MPI_Rget(got, SLOT_LEN, MPI_BYTE, t, off, SLOT_LEN,
                           MPI_BYTE, win, &req[1]));
        MPI_CHECK(MPI_Wait(&req[1], MPI_STATUS_IGNORE));
        CHECK_PATTERN(got, SLOT_LEN, seed_of(5, t, app_rank, 0),
                      "lock_all put+flush+get (%s) at %d", flavor, t);
    }
    MPI_CHECK(MPI_Win_flush_all(win));
    MPI_CHECK(MPI_Win_unlock_all(win));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));

    /* Every origin's slot in my window holds its pattern. */
    MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, app_rank, 0, win));
    MPI_CHECK(MPI_Win_sync(win));
    for (int o = 0; o < app_size; ++o) {
        CHECK_PATTERN(base + OFF_DATA + (size_t)o * SLOT_LEN, SLOT_LEN,
                      seed_of(5, app_rank, o, 0),
                      "lock_all (%s): slot of origin %d", flavor, o);
    }
    MPI_CHECK(MPI_Win_unlock(app_rank, win));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    free(buf);
    free(got);
    app_log("lock_all (%s): put, rput, flush, rget to every rank", flavor);
}

/* -------------------------------------------------------------- atomics */

static void test_atomics(MPI_Win win)
{
    int n        = quick ? 50 : 200;
    int64_t *old = xmalloc(sizeof(int64_t) * n);
    int64_t one  = 1, v, res, cmp, val;
    int cas_target = app_size - 1;

    /* Contended counter with Fetch_and_op, lock_all + flush. */
    MPI_CHECK(MPI_Win_lock_all(0, win));
    for (int i = 0; i < n; ++i) {
        MPI_CHECK(MPI_Fetch_and_op(&one, &old[i], MPI_INT64_T, 0, OFF_CNT,
                                   MPI_SUM, win));
        MPI_CHECK(MPI_Win_flush(0, win));
    }
    MPI_CHECK(MPI_Win_unlock_all(win));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    v = read_i64(win, 0, OFF_CNT);
    CHECK(v == (int64_t)n * app_size, "fetch_and_op counter (%s): %lld, "
          "expected %lld", flavor, (long long)v, (long long)n * app_size);
    check_permutation(old, n, "fetch_and_op counter");

    /* Get_accumulate SUM under a shared lock. */
    MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win));
    for (int i = 0; i < n; ++i) {
        MPI_CHECK(MPI_Get_accumulate(&one, 1, MPI_INT64_T, &old[i], 1,
                                     MPI_INT64_T, 0, OFF_GACC, 1, MPI_INT64_T,
                                     MPI_SUM, win));
        MPI_CHECK(MPI_Win_flush(0, win));
    }
    MPI_CHECK(MPI_Win_unlock(0, win));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win));
    MPI_CHECK(MPI_Get_accumulate(&one, 1, MPI_INT64_T, &v, 1, MPI_INT64_T, 0,
                                 OFF_GACC, 1, MPI_INT64_T, MPI_NO_OP, win));
    MPI_CHECK(MPI_Win_unlock(0, win));
    CHECK(v == (int64_t)n * app_size, "get_accumulate counter (%s): %lld, "
          "expected %lld", flavor, (long long)v, (long long)n * app_size);
    check_permutation(old, n, "get_accumulate counter");

    /* Compare_and_swap race: one winner. */
    cmp = 0;
    val = app_rank + 1;
    MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, cas_target, 0, win));
    MPI_CHECK(MPI_Compare_and_swap(&val, &cmp, &res, MPI_INT64_T, cas_target,
                                   OFF_CAS, win));
    MPI_CHECK(MPI_Win_unlock(cas_target, win));
    {
        int64_t *all = xmalloc(sizeof(int64_t) * app_size);
        int winners  = 0;
        int64_t fin;

        MPI_CHECK(MPI_Allgather(&res, 1, MPI_INT64_T, all, 1, MPI_INT64_T,
                                MPI_COMM_WORLD));
        fin = read_i64(win, cas_target, OFF_CAS);
        for (int r = 0; r < app_size; ++r) {
            if (all[r] == 0) {
                ++winners;
                CHECK(fin == r + 1, "compare_and_swap race (%s): rank %d won "
                      "but the cell holds %lld", flavor, r, (long long)fin);
            } else {
                CHECK(all[r] == fin, "compare_and_swap race (%s): rank %d saw "
                      "%lld, the winner wrote %lld", flavor, r,
                      (long long)all[r], (long long)fin);
            }
        }
        CHECK(winners == 1, "compare_and_swap race (%s): %d winners", flavor,
              winners);
        free(all);
    }
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));

    /* A counter incremented with a compare-and-swap loop. */
    MPI_CHECK(MPI_Win_lock_all(0, win));
    for (int i = 0; i < n / 2; ++i) {
        int64_t dummy = 0;
        MPI_CHECK(MPI_Fetch_and_op(&dummy, &cmp, MPI_INT64_T, 0, OFF_CASC,
                                   MPI_NO_OP, win));
        MPI_CHECK(MPI_Win_flush(0, win));
        for (;;) {
            val = cmp + 1;
            MPI_CHECK(MPI_Compare_and_swap(&val, &cmp, &res, MPI_INT64_T, 0,
                                           OFF_CASC, win));
            MPI_CHECK(MPI_Win_flush(0, win));
            if (res == cmp) {
                break;
            }
            CHECK(res > cmp, "compare_and_swap loop (%s): counter went back "
                  "from %lld to %lld", flavor, (long long)cmp,
                  (long long)res);
            cmp = res;
        }
        old[i] = cmp;
    }
    MPI_CHECK(MPI_Win_unlock_all(win));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    v = read_i64(win, 0, OFF_CASC);
    CHECK(v == (int64_t)(n / 2) * app_size, "compare_and_swap counter (%s): "
          "%lld, expected %lld", flavor, (long long)v,
          (long long)(n / 2) * app_size);
    check_permutation(old, n / 2, "compare_and_swap counter");
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    free(old);
    app_log("atomics (%s): fetch_and_op and get_accumulate counters x%d per "
            "rank exact, compare_and_swap race and loop", flavor, n);
}

/* ----------------------------------------------------------------- PSCW */

static void test_pscw(MPI_Win win, char *base)
{
    static const size_t sizes[] = {8, 4096, 1u << 20};
    MPI_Group world, g_left, g_right;
    char *buf = xmalloc(1u << 20);
    int *isrc = xmalloc(NACC * sizeof(int));
    int *iacc = (int*)(base + OFF_IACC);

    MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
    MPI_CHECK(MPI_Group_incl(world, 1, &left, &g_left));
    MPI_CHECK(MPI_Group_incl(world, 1, &right, &g_right));

    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); ++k) {
        size_t size = sizes[k];

        memset(base + OFF_DATA, 0xee, size);
        for (int i = 0; i < NACC; ++i) {
            iacc[i]  = 1;
            isrc[i]  = ival(app_rank, i);
        }
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        pattern_fill(buf, size, seed_of(6, size, app_rank, 0));
        /* Exposed to the left neighbour, accessing the right one. */
        MPI_CHECK(MPI_Win_post(g_left, 0, win));
        MPI_CHECK(MPI_Win_start(g_right, 0, win));
        MPI_CHECK(MPI_Put(buf, (int)size, MPI_BYTE, right, OFF_DATA,
                          (int)size, MPI_BYTE, win));
        MPI_CHECK(MPI_Accumulate(isrc, NACC, MPI_INT, right, OFF_IACC, NACC,
                                 MPI_INT, MPI_SUM, win));
        MPI_CHECK(MPI_Win_complete(win));
        MPI_CHECK(MPI_Win_wait(win));
        CHECK_PATTERN(base + OFF_DATA, size, seed_of(6, size, left, 0),
                      "PSCW put (%s) of %zu bytes from %d", flavor, size,
                      left);
        for (int i = 0; i < NACC; ++i) {
            CHECK(iacc[i] == 1 + ival(left, i), "PSCW accumulate (%s): [%d] ="
                  " %d, expected %d", flavor, i, iacc[i], 1 + ival(left, i));
        }

        /* Second epoch: get back what the right neighbour now holds (my
         * own pattern). */
        MPI_CHECK(MPI_Win_post(g_left, 0, win));
        MPI_CHECK(MPI_Win_start(g_right, 0, win));
        memset(buf, 0, size);
        MPI_CHECK(MPI_Get(buf, (int)size, MPI_BYTE, right, OFF_DATA,
                          (int)size, MPI_BYTE, win));
        MPI_CHECK(MPI_Win_complete(win));
        MPI_CHECK(MPI_Win_wait(win));
        CHECK_PATTERN(buf, size, seed_of(6, size, app_rank, 0),
                      "PSCW get (%s) of %zu bytes from %d", flavor, size,
                      right);
    }
    MPI_CHECK(MPI_Group_free(&g_left));
    MPI_CHECK(MPI_Group_free(&g_right));
    MPI_CHECK(MPI_Group_free(&world));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    free(buf);
    free(isrc);
    app_log("PSCW (%s): post/start/complete/wait ring, put, get, accumulate",
            flavor);
}

static void run_window(int allocate)
{
    MPI_Win win;
    char *base;

    flavor = allocate ? "Win_allocate" : "Win_create";
    if (allocate) {
        MPI_CHECK(MPI_Win_allocate(WIN_LEN, 1, MPI_INFO_NULL, MPI_COMM_WORLD,
                                   &base, &win));
    } else {
        base = xmalloc(WIN_LEN);
        memset(base, 0, WIN_LEN);
        MPI_CHECK(MPI_Win_create(base, WIN_LEN, 1, MPI_INFO_NULL,
                                 MPI_COMM_WORLD, &win));
    }
    MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN);
    memset(base, 0, WIN_LEN);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));

    if (selected("fence")) {
        test_fence(win, base);
    }
    if (selected("lock")) {
        test_lock(win, base);
    }
    if (selected("lock_all")) {
        test_lock_all(win, base);
    }
    if (selected("atomics")) {
        test_atomics(win);
    }
    if (selected("pscw")) {
        test_pscw(win, base);
    }

    MPI_CHECK(MPI_Win_free(&win));
    if (!allocate) {
        free(base);
    }
}

int main(int argc, char **argv)
{
    int opt, round = 0;
    double seconds = 0, t0;
    const char *until = NULL;

    app_init(&argc, &argv, "rma");
    while ((opt = getopt(argc, argv, "qt:w:T:U:")) != -1) {
        if (opt == 'q') {
            quick = 1;
        } else if (opt == 't') {
            only = optarg;
        } else if (opt == 'w') {
            windows = optarg;
        } else if (opt == 'T') {
            seconds = atof(optarg);
        } else if (opt == 'U') {
            until = optarg;
        }
    }
    CHECK(app_size >= 2, "needs at least 2 ranks");
    left  = (app_rank + app_size - 1) % app_size;
    right = (app_rank + 1) % app_size;

    t0 = MPI_Wtime();
    do {
        if (strstr(windows, "create") != NULL) {
            run_window(0);
        }
        if (strstr(windows, "allocate") != NULL) {
            run_window(1);
        }
    } while (app_again(++round, t0, seconds, until));
    app_finish();
    return 0;
}
