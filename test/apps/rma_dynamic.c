/*
 * rma_dynamic.c - MPI_Win_create_dynamic: attach, put, get, accumulate,
 * detach, every result verified exactly.
 *
 * Each rank attaches two regions (small and 1 MiB), publishes their
 * addresses, and every rank puts into and gets from its right neighbour's
 * regions under lock_all + flush, then accumulates into rank 0's counter.
 * The regions are detached before MPI_Win_free.
 *
 * Kept apart from rma.c: Debian's OpenMPI 4.1.4 (osc ucx) crashes in
 * MPI_Win_free of a dynamic window after detach, with every UCX transport.
 * Rank 0 prints "rma_dynamic: data verified" before MPI_Win_free, so that
 * run-apps.sh can tell a crash there (compared with a UCX_TLS=posix,self
 * control run) from a failure of the data checks.
 *
 * Leaving the window to MPI_Finalize does not avoid the crash (it frees
 * the window the same way), so a run over osc ucx never reaches
 * MPI_Finalize and UCX never closes its memory domains: the hca counters
 * (UCX_HCA_STATS) are not printed for this program.
 */
#include "apps_common.h"

#define SMALL_LEN 64
#define LARGE_LEN (1u << 20)

static uint64_t seed_of(uint64_t a, uint64_t b, uint64_t c)
{
    return ((a * 1000003u + b) * 1000003u + c) | 1u;
}

int main(int argc, char **argv)
{
    MPI_Aint addr[3], *all;
    int64_t *counter;
    char *small, *large, *buf;
    int left, right, rounds = 3;
    MPI_Win win;

    app_init(&argc, &argv, "rma_dynamic");
    CHECK(app_size >= 2, "needs at least 2 ranks");
    left  = (app_rank + app_size - 1) % app_size;
    right = (app_rank + 1) % app_size;

    small   = xmalloc(SMALL_LEN);
    large   = xmalloc(LARGE_LEN);
    counter = xmalloc(sizeof(*counter));
    buf     = xmalloc(LARGE_LEN);
    all     = xmalloc(sizeof(MPI_Aint) * 3 * app_size);
    memset(small, 0xee, SMALL_LEN);
    memset(large, 0xee, LARGE_LEN);
    *counter = 0;

    MPI_CHECK(MPI_Win_create_dynamic(MPI_INFO_NULL, MPI_COMM_WORLD, &win));
    MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN);
    MPI_CHECK(MPI_Win_attach(win, small, SMALL_LEN));
    MPI_CHECK(MPI_Win_attach(win, large, LARGE_LEN));
    MPI_CHECK(MPI_Win_attach(win, counter, sizeof(*counter)));
    MPI_CHECK(MPI_Get_address(small, &addr[0]));
    MPI_CHECK(MPI_Get_address(large, &addr[1]));
    MPI_CHECK(MPI_Get_address(counter, &addr[2]));
    MPI_CHECK(MPI_Allgather(addr, 3, MPI_AINT, all, 3, MPI_AINT,
                            MPI_COMM_WORLD));

    for (int round = 0; round < rounds; ++round) {
        MPI_Aint rsmall = all[3 * right], rlarge = all[3 * right + 1];
        int64_t one = 1, old = -1;

        /* Put into the right neighbour, read it back after a flush. */
        MPI_CHECK(MPI_Win_lock_all(0, win));
        pattern_fill(buf, SMALL_LEN, seed_of(1, round, app_rank));
        MPI_CHECK(MPI_Put(buf, SMALL_LEN, MPI_BYTE, right, rsmall, SMALL_LEN,
                          MPI_BYTE, win));
        pattern_fill(buf + SMALL_LEN, LARGE_LEN - SMALL_LEN,
                     seed_of(2, round, app_rank));
        MPI_CHECK(MPI_Put(buf + SMALL_LEN, LARGE_LEN - SMALL_LEN, MPI_BYTE,
                          right, rlarge + SMALL_LEN, LARGE_LEN - SMALL_LEN,
                          MPI_BYTE, win));
        MPI_CHECK(MPI_Win_flush(right, win));
        memset(buf, 0, LARGE_LEN);
        MPI_CHECK(MPI_Get(buf, SMALL_LEN, MPI_BYTE, right, rsmall, SMALL_LEN,
                          MPI_BYTE, win));
        MPI_CHECK(MPI_Get(buf + SMALL_LEN, LARGE_LEN - SMALL_LEN, MPI_BYTE,
                          right, rlarge + SMALL_LEN, LARGE_LEN - SMALL_LEN,
                          MPI_BYTE, win));
        MPI_CHECK(MPI_Win_flush(right, win));
        CHECK_PATTERN(buf, SMALL_LEN, seed_of(1, round, app_rank),
                      "dynamic get of the small region of %d (round %d)",
                      right, round);
        CHECK_PATTERN(buf + SMALL_LEN, LARGE_LEN - SMALL_LEN,
                      seed_of(2, round, app_rank),
                      "dynamic get of the large region of %d (round %d)",
                      right, round);
        /* A contended counter in rank 0's third region. */
        MPI_CHECK(MPI_Fetch_and_op(&one, &old, MPI_INT64_T, 0, all[2],
                                   MPI_SUM, win));
        MPI_CHECK(MPI_Win_flush(0, win));
        CHECK(old >= 0 && old < (int64_t)app_size * rounds,
              "dynamic fetch_and_op returned %lld", (long long)old);
        MPI_CHECK(MPI_Win_unlock_all(win));
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));

        /* My regions hold my left neighbour's data. */
        MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, app_rank, 0, win));
        MPI_CHECK(MPI_Win_sync(win));
        CHECK_PATTERN(small, SMALL_LEN, seed_of(1, round, left),
                      "dynamic small region put by %d (round %d)", left,
                      round);
        CHECK_PATTERN(large + SMALL_LEN, LARGE_LEN - SMALL_LEN,
                      seed_of(2, round, left),
                      "dynamic large region put by %d (round %d)", left,
                      round);
        MPI_CHECK(MPI_Win_unlock(app_rank, win));
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    }
    if (app_rank == 0) {
        MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win));
        MPI_CHECK(MPI_Win_sync(win));
        CHECK(*counter == (int64_t)app_size * rounds,
              "dynamic counter %lld, expected %lld", (long long)*counter,
              (long long)app_size * rounds);
        MPI_CHECK(MPI_Win_unlock(0, win));
    }
    app_log("attach, put, get, flush, fetch_and_op over %d rounds: exact",
            rounds);

    MPI_CHECK(MPI_Win_detach(win, small));
    MPI_CHECK(MPI_Win_detach(win, large));
    MPI_CHECK(MPI_Win_detach(win, counter));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    app_log("data verified, detached; calling MPI_Win_free");
    MPI_CHECK(MPI_Win_free(&win));
    free(small);
    free(large);
    free(counter);
    free(buf);
    free(all);
    app_finish();
    return 0;
}
