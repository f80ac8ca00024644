/*
 * coll.c - collectives, every result verified exactly:
 *
 *   bcast (every root), reduce (SUM int, SUM double with exactly
 *   representable values, MAX), allreduce, alltoall, alltoallv (uneven
 *   counts, some zero), allgather, barrier (a late rank holds the others),
 *   over several sizes, on MPI_COMM_WORLD and on a split communicator.
 *
 * usage: coll [-q]     (-q: quick, smaller sizes)
 */
#include "apps_common.h"

#include <unistd.h>

static int quick;

static uint64_t seed_of(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    return (((a * 1000003u + b) * 1000003u + c) * 1000003u + d) | 1u;
}

/* The int contributed by rank r at index i (small: sums do not overflow). */
static int ival(int r, size_t i)
{
    return (int)((i * 7 + (size_t)r * 1009) % 100003) - 50000;
}

/* A double exactly representable, whose sum over ranks is exact too. */
static double dval(int r, size_t i)
{
    return (double)ival(r, i) * 0.25 + (double)r * 1024.0;
}

static void test_bcast(MPI_Comm comm, const char *cname, size_t size)
{
    int rank, nranks;
    char *buf = xmalloc(size);

    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &nranks);
    for (int root = 0; root < nranks; ++root) {
        uint64_t seed = seed_of(1, size, root, nranks);
        if (rank == root) {
            pattern_fill(buf, size, seed);
        } else {
            memset(buf, 0xee, size);
        }
        MPI_CHECK(MPI_Bcast(buf, (int)size, MPI_BYTE, root, comm));
        CHECK_PATTERN(buf, size, seed, "bcast %s size %zu root %d", cname,
                      size, root);
    }
    free(buf);
}

static void test_reduce(MPI_Comm comm, const char *cname, size_t count)
{
    int rank, nranks;
    int *isend    = xmalloc(count * sizeof(int));
    int *irecv    = xmalloc(count * sizeof(int));
    double *dsend = xmalloc(count * sizeof(double));
    double *drecv = xmalloc(count * sizeof(double));

    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &nranks);
    for (size_t i = 0; i < count; ++i) {
        isend[i] = ival(rank, i);
        dsend[i] = dval(rank, i);
    }

    for (int root = 0; root < nranks; root += (nranks > 2 ? nranks - 1 : 1)) {
        memset(irecv, 0xee, count * sizeof(int));
        MPI_CHECK(MPI_Reduce(isend, irecv, (int)count, MPI_INT, MPI_SUM, root,
                             comm));
        if (rank == root) {
            for (size_t i = 0; i < count; ++i) {
                int exp = 0;
                for (int r = 0; r < nranks; ++r) {
                    exp += ival(r, i);
                }
                CHECK(irecv[i] == exp, "reduce SUM int %s count %zu root %d: "
                      "[%zu] = %d, expected %d", cname, count, root, i,
                      irecv[i], exp);
            }
        }
        memset(drecv, 0xee, count * sizeof(double));
        MPI_CHECK(MPI_Reduce(dsend, drecv, (int)count, MPI_DOUBLE, MPI_SUM,
                             root, comm));
        if (rank == root) {
            for (size_t i = 0; i < count; ++i) {
                double exp = 0;
                for (int r = 0; r < nranks; ++r) {
                    exp += dval(r, i);
                }
                CHECK(drecv[i] == exp, "reduce SUM double %s count %zu "
                      "root %d: [%zu] = %.17g, expected %.17g", cname, count,
                      root, i, drecv[i], exp);
            }
        }
        MPI_CHECK(MPI_Reduce(isend, irecv, (int)count, MPI_INT, MPI_MAX, root,
                             comm));
        if (rank == root) {
            for (size_t i = 0; i < count; ++i) {
                int exp = ival(0, i);
                for (int r = 1; r < nranks; ++r) {
                    exp = ival(r, i) > exp ? ival(r, i) : exp;
                }
                CHECK(irecv[i] == exp, "reduce MAX %s count %zu: [%zu] = %d, "
                      "expected %d", cname, count, i, irecv[i], exp);
            }
        }
    }

    memset(irecv, 0xee, count * sizeof(int));
    MPI_CHECK(MPI_Allreduce(isend, irecv, (int)count, MPI_INT, MPI_SUM, comm));
    memset(drecv, 0xee, count * sizeof(double));
    MPI_CHECK(MPI_Allreduce(dsend, drecv, (int)count, MPI_DOUBLE, MPI_SUM,
                            comm));
    for (size_t i = 0; i < count; ++i) {
        int iexp    = 0;
        double dexp = 0;
        for (int r = 0; r < nranks; ++r) {
            iexp += ival(r, i);
            dexp += dval(r, i);
        }
        CHECK(irecv[i] == iexp, "allreduce SUM int %s count %zu: [%zu] = %d, "
              "expected %d", cname, count, i, irecv[i], iexp);
        CHECK(drecv[i] == dexp, "allreduce SUM double %s count %zu: [%zu] = "
              "%.17g, expected %.17g", cname, count, i, drecv[i], dexp);
    }
    /* In place. */
    memcpy(irecv, isend, count * sizeof(int));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, irecv, (int)count, MPI_INT, MPI_MAX,
                            comm));
    for (size_t i = 0; i < count; ++i) {
        int exp = ival(0, i);
        for (int r = 1; r < nranks; ++r) {
            exp = ival(r, i) > exp ? ival(r, i) : exp;
        }
        CHECK(irecv[i] == exp, "allreduce MAX in place %s count %zu: [%zu] = "
              "%d, expected %d", cname, count, i, irecv[i], exp);
    }
    free(isend);
    free(irecv);
    free(dsend);
    free(drecv);
}

static void test_alltoall(MPI_Comm comm, const char *cname, size_t blk)
{
    int rank, nranks;
    char *sbuf, *rbuf;

    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &nranks);
    sbuf = xmalloc(blk * nranks);
    rbuf = xmalloc(blk * nranks);
    for (int d = 0; d < nranks; ++d) {
        pattern_fill(sbuf + d * blk, blk, seed_of(2, blk, rank, d));
    }
    memset(rbuf, 0xee, blk * nranks);
    MPI_CHECK(MPI_Alltoall(sbuf, (int)blk, MPI_BYTE, rbuf, (int)blk, MPI_BYTE,
                           comm));
    for (int s = 0; s < nranks; ++s) {
        CHECK_PATTERN(rbuf + s * blk, blk, seed_of(2, blk, s, rank),
                      "alltoall %s block %zu from %d", cname, blk, s);
    }
    free(sbuf);
    free(rbuf);
}

/* Bytes rank s sends to rank d in alltoallv: uneven, some zero. */
static int v_count(int s, int d, size_t base)
{
    int k = (s * 3 + d * 5) % 4;
    return k == 0 ? 0 : (int)(base * k + (size_t)s + (size_t)d);
}

static void test_alltoallv(MPI_Comm comm, const char *cname, size_t base)
{
    int rank, nranks;
    int *scnt, *sdsp, *rcnt, *rdsp;
    size_t stot = 0, rtot = 0;
    char *sbuf, *rbuf;

    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &nranks);
    scnt = xmalloc(sizeof(int) * nranks);
    sdsp = xmalloc(sizeof(int) * nranks);
    rcnt = xmalloc(sizeof(int) * nranks);
    rdsp = xmalloc(sizeof(int) * nranks);
    /* Receive blocks in reverse order with gaps: displacements matter. */
    for (int p = 0; p < nranks; ++p) {
        scnt[p] = v_count(rank, p, base);
        sdsp[p] = (int)stot;
        stot += scnt[p];
    }
    for (int p = nranks - 1; p >= 0; --p) {
        rcnt[p] = v_count(p, rank, base);
        rdsp[p] = (int)rtot;
        rtot += rcnt[p] + 3;
    }
    sbuf = xmalloc(stot);
    rbuf = xmalloc(rtot);
    for (int p = 0; p < nranks; ++p) {
        pattern_fill(sbuf + sdsp[p], scnt[p], seed_of(3, base, rank, p));
    }
    memset(rbuf, 0xee, rtot);
    MPI_CHECK(MPI_Alltoallv(sbuf, scnt, sdsp, MPI_BYTE, rbuf, rcnt, rdsp,
                            MPI_BYTE, comm));
    for (int p = 0; p < nranks; ++p) {
        CHECK_PATTERN(rbuf + rdsp[p], rcnt[p], seed_of(3, base, p, rank),
                      "alltoallv %s base %zu from %d", cname, base, p);
        for (int g = 0; g < 3; ++g) {
            CHECK((uint8_t)rbuf[rdsp[p] + rcnt[p] + g] == 0xee,
                  "alltoallv %s base %zu: gap after block %d overwritten",
                  cname, base, p);
        }
    }
    free(sbuf);
    free(rbuf);
    free(scnt);
    free(sdsp);
    free(rcnt);
    free(rdsp);
}

static void test_allgather(MPI_Comm comm, const char *cname, size_t blk)
{
    int rank, nranks;
    char *sbuf = xmalloc(blk), *rbuf;

    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &nranks);
    rbuf = xmalloc(blk * nranks);
    pattern_fill(sbuf, blk, seed_of(4, blk, rank, 0));
    memset(rbuf, 0xee, blk * nranks);
    MPI_CHECK(MPI_Allgather(sbuf, (int)blk, MPI_BYTE, rbuf, (int)blk, MPI_BYTE,
                            comm));
    for (int s = 0; s < nranks; ++s) {
        CHECK_PATTERN(rbuf + s * blk, blk, seed_of(4, blk, s, 0),
                      "allgather %s block %zu from %d", cname, blk, s);
    }
    free(sbuf);
    free(rbuf);
}

/* A barrier must hold every rank until the last one arrives: the late
 * rank sleeps, the others measure how long the barrier kept them. */
static void test_barrier(MPI_Comm comm, const char *cname)
{
    const double delay = 0.3;
    int rank, nranks;

    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &nranks);
    for (int i = 0; i < 200; ++i) {
        MPI_CHECK(MPI_Barrier(comm));
    }
    for (int late = 0; late < nranks; late += (nranks > 1 ? nranks - 1 : 1)) {
        double t0;
        MPI_CHECK(MPI_Barrier(comm));
        t0 = MPI_Wtime();
        if (rank == late) {
            sleep_ms((unsigned)(delay * 1000));
        }
        MPI_CHECK(MPI_Barrier(comm));
        CHECK(MPI_Wtime() - t0 >= delay * 0.9,
              "barrier %s: rank %d left after %.3f s, rank %d arrived after "
              "%.1f s", cname, rank, MPI_Wtime() - t0, late, delay);
        if (late == nranks - 1) {
            break;
        }
    }
}

static void run_all(MPI_Comm comm, const char *cname)
{
    static const size_t bsizes[] = {0, 1, 8, 1000, 65536, 1 << 20,
                                    (4 << 20) + 3};
    static const size_t counts[] = {1, 7, 1000, 65536, 1 << 20};
    static const size_t blks[]   = {1, 8, 1000, 65536, 1 << 19};
    size_t nb = quick ? 5 : sizeof(bsizes) / sizeof(bsizes[0]);
    size_t nc = quick ? 4 : sizeof(counts) / sizeof(counts[0]);
    size_t nk = quick ? 4 : sizeof(blks) / sizeof(blks[0]);

    for (size_t i = 0; i < nb; ++i) {
        test_bcast(comm, cname, bsizes[i]);
    }
    app_log("bcast %s: %zu sizes up to %zu bytes, every root", cname, nb,
            bsizes[nb - 1]);
    for (size_t i = 0; i < nc; ++i) {
        test_reduce(comm, cname, counts[i]);
    }
    app_log("reduce/allreduce %s: SUM int, SUM double, MAX, %zu counts up to "
            "%zu", cname, nc, counts[nc - 1]);
    for (size_t i = 0; i < nk; ++i) {
        test_alltoall(comm, cname, blks[i]);
        test_alltoallv(comm, cname, blks[i]);
        test_allgather(comm, cname, blks[i]);
    }
    app_log("alltoall/alltoallv/allgather %s: %zu block sizes up to %zu bytes",
            cname, nk, blks[nk - 1]);
    test_barrier(comm, cname);
    app_log("barrier %s: 200 barriers, a late rank holds the others", cname);
}

int main(int argc, char **argv)
{
    MPI_Comm half;
    int opt;

    app_init(&argc, &argv, "coll");
    while ((opt = getopt(argc, argv, "q")) != -1) {
        if (opt == 'q') {
            quick = 1;
        }
    }
    run_all(MPI_COMM_WORLD, "world");
    /* Even and odd ranks, in reverse order. */
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, app_rank % 2, -app_rank, &half));
    MPI_Comm_set_errhandler(half, MPI_ERRORS_RETURN);
    run_all(half, "split");
    MPI_CHECK(MPI_Comm_free(&half));
    app_finish();
    return 0;
}
