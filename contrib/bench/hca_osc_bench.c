/*
 * hca_osc_bench.c - OSU-style MPI one-sided benchmark (two ranks).
 *
 * usage: mpirun -np 2 hca_osc_bench [-m MAXSIZE] [-W WINDOW] [-b BYTES]
 *                                   [-n FOPITERS] [-t TESTS]
 *
 *   -m MAXSIZE   largest message of the bandwidth tests (default 1 MiB);
 *                sizes are 8, 32, 128, ... (x4) and MAXSIZE
 *   -W WINDOW    operations issued back to back before MPI_Win_flush
 *                (default 64)
 *   -b BYTES     payload of one size's timed loop (default 64 MiB): the
 *                loop runs BYTES / (size * WINDOW) windows, at least 4 and
 *                at most 500, plus a tenth of that (at least 1) untimed
 *   -n FOPITERS  MPI_Fetch_and_op iterations (default 2000, plus 200
 *                untimed)
 *   -t TESTS     comma-separated subset of put,get,fop (default all)
 *
 * Rank 0 drives, rank 1 is a passive target that waits in MPI_Barrier
 * (which progresses MPI, as a target process busy in other MPI calls
 * would).  The windows come from MPI_Win_allocate; the epoch is a passive
 * target MPI_Win_lock_all over the whole run.
 *
 *   put_bw   WINDOW x MPI_Put(size) to rank 1, then MPI_Win_flush(1);
 *            MB/s = size * WINDOW * windows / time (MB = 10^6 bytes)
 *   get_bw   the same with MPI_Get
 *   fop_lat  MPI_Fetch_and_op(MPI_SUM, MPI_UINT64_T) then MPI_Win_flush,
 *            one at a time; microseconds per operation, median (p50) and
 *            average of the timed iterations
 *
 * Before the timed loops, rank 0 checks the data path once: a put of a
 * pattern of MAXSIZE bytes, a get of it back, and (at the end) the sum
 * that the fetch-and-ops left at the target.  A mismatch is an error
 * (exit status 1): a benchmark of a transport that loses data means
 * nothing.
 *
 * Output (rank 0, stdout), one line per size:
 *   put_bw   <size> <MB/s> windows=<n>
 *   get_bw   <size> <MB/s> windows=<n>
 *   fop_lat  8 <p50 us> avg=<us> iters=<n>
 * Lines starting with '#' are comments.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROG "hca_osc_bench"

static int rank;

static void die(const char *msg)
{
    fprintf(stderr, PROG ": rank %d: error: %s\n", rank, msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static long parse_size(const char *s)
{
    char *end;
    long v = strtol(s, &end, 0);

    if (end == s || v <= 0)
        return -1;
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    default: break;
    }
    return *end ? -1 : v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* WINDOW operations (put or get) of SIZE bytes at rank 1, then a flush;
 * repeated WINDOWS times.  Offsets cycle through the buffer so that the
 * operations of a window touch different memory where it is large enough. */
static double bw_loop(int is_put, MPI_Win win, char *buf, long bufsize,
                      long size, int window, long windows)
{
    long slots = bufsize / size, i;
    int j;
    double t0;

    if (slots < 1)
        slots = 1;
    t0 = MPI_Wtime();
    for (i = 0; i < windows; i++) {
        for (j = 0; j < window; j++) {
            long off = (j % slots) * size;

            if (is_put)
                MPI_Put(buf + off, (int)size, MPI_CHAR, 1, off, (int)size,
                        MPI_CHAR, win);
            else
                MPI_Get(buf + off, (int)size, MPI_CHAR, 1, off, (int)size,
                        MPI_CHAR, win);
        }
        MPI_Win_flush(1, win);
    }
    return MPI_Wtime() - t0;
}

int main(int argc, char **argv)
{
    long maxsize = 1L << 20, budget = 64L << 20, fop_iters = 2000;
    int window = 64, do_put = 1, do_get = 1, do_fop = 1, nranks, opt;
    long bufsize, size, i;
    char *base, *lbuf, *tests = NULL;
    uint64_t *fbase, one = 1, result = 0;
    MPI_Win win, fwin;
    int errs = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    while ((opt = getopt(argc, argv, "m:W:b:n:t:h")) != -1) {
        switch (opt) {
        case 'm': maxsize = parse_size(optarg); break;
        case 'W': window = atoi(optarg); break;
        case 'b': budget = parse_size(optarg); break;
        case 'n': fop_iters = parse_size(optarg); break;
        case 't': tests = optarg; break;
        default:
            if (rank == 0)
                fprintf(stderr, "usage: mpirun -np 2 " PROG " [-m MAXSIZE] "
                        "[-W WINDOW] [-b BYTES] [-n FOPITERS] "
                        "[-t put,get,fop]\n");
            MPI_Finalize();
            return opt == 'h' ? 0 : 2;
        }
    }
    if (maxsize < 8 || window < 1 || budget < 1 || fop_iters < 1)
        die("bad option value");
    if (maxsize > (1L << 30))
        die("-m: at most 1 GiB");
    if (tests) {
        do_put = strstr(tests, "put") != NULL;
        do_get = strstr(tests, "get") != NULL;
        do_fop = strstr(tests, "fop") != NULL;
    }
    if (nranks != 2)
        die("needs exactly 2 ranks");

    /* The window holds up to WINDOW messages of the largest size, but not
     * more than 8 MiB (or one message if that is larger): bigger windows
     * only cost registration time. */
    bufsize = maxsize * window;
    if (bufsize > (8L << 20))
        bufsize = maxsize > (8L << 20) ? maxsize : (8L << 20);
    if (MPI_Win_allocate(bufsize, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base,
                         &win) != MPI_SUCCESS)
        die("MPI_Win_allocate");
    if (MPI_Win_allocate(sizeof(uint64_t), sizeof(uint64_t), MPI_INFO_NULL,
                         MPI_COMM_WORLD, &fbase, &fwin) != MPI_SUCCESS)
        die("MPI_Win_allocate (fetch-and-op)");
    lbuf = malloc(bufsize);
    if (!lbuf)
        die("out of memory");
    memset(base, 0, bufsize);
    *fbase = 0;
    MPI_Barrier(MPI_COMM_WORLD);

    MPI_Win_lock_all(0, win);
    MPI_Win_lock_all(0, fwin);
    if (rank == 0) {
        printf("# " PROG ": 2 ranks, rank 0 -> rank 1 (passive target, "
               "MPI_Win_allocate, lock_all), window %d ops then "
               "MPI_Win_flush, window buffer %ld B\n", window, bufsize);
        printf("# test     size  value  (put_bw/get_bw: MB/s, 10^6 B/s; "
               "fop_lat: p50 us per MPI_Fetch_and_op + flush)\n");
        fflush(stdout);

        /* data check: put a pattern, get it back */
        for (i = 0; i < maxsize; i++)
            lbuf[i] = (char)(i * 7 + 3);
        MPI_Put(lbuf, (int)maxsize, MPI_CHAR, 1, 0, (int)maxsize, MPI_CHAR,
                win);
        MPI_Win_flush(1, win);
        memset(lbuf, 0, maxsize);
        MPI_Get(lbuf, (int)maxsize, MPI_CHAR, 1, 0, (int)maxsize, MPI_CHAR,
                win);
        MPI_Win_flush(1, win);
        for (i = 0; i < maxsize; i++) {
            if (lbuf[i] != (char)(i * 7 + 3)) {
                fprintf(stderr, PROG ": data check failed at byte %ld of "
                        "%ld (put then get)\n", i, maxsize);
                errs++;
                break;
            }
        }

        for (int pass = 0; pass < 2 && !errs; pass++) {
            int is_put = pass == 0;

            if (is_put ? !do_put : !do_get)
                continue;
            for (size = 8;; size *= 4) {
                long windows, warm;
                double t;

                if (size > maxsize)
                    size = maxsize;
                windows = budget / (size * window);
                if (windows < 4)
                    windows = 4;
                if (windows > 500)
                    windows = 500;
                warm = windows / 10 > 1 ? windows / 10 : 1;
                bw_loop(is_put, win, lbuf, bufsize, size, window, warm);
                t = bw_loop(is_put, win, lbuf, bufsize, size, window,
                            windows);
                printf("%-8s %8ld %12.2f windows=%ld\n",
                       is_put ? "put_bw" : "get_bw", size,
                       (double)size * window * windows / t / 1e6, windows);
                fflush(stdout);
                if (size == maxsize)
                    break;
            }
        }

        if (do_fop && !errs) {
            long warm = fop_iters / 10, n = 0;
            double *lat = malloc(fop_iters * sizeof(*lat)), sum = 0;

            if (!lat)
                die("out of memory");
            for (i = 0; i < warm + fop_iters; i++) {
                double t0 = MPI_Wtime();

                MPI_Fetch_and_op(&one, &result, MPI_UINT64_T, 1, 0, MPI_SUM,
                                 fwin);
                MPI_Win_flush(1, fwin);
                if (i >= warm) {
                    lat[n] = (MPI_Wtime() - t0) * 1e6;
                    sum += lat[n++];
                }
                if (result != (uint64_t)i) {
                    fprintf(stderr, PROG ": fetch-and-op %ld fetched %llu, "
                            "expected %ld\n", i,
                            (unsigned long long)result, i);
                    errs++;
                    break;
                }
            }
            if (!errs) {
                qsort(lat, n, sizeof(*lat), cmp_double);
                printf("%-8s %8d %12.3f avg=%.3f iters=%ld\n", "fop_lat", 8,
                       lat[n / 2], sum / n, n);
            }
            free(lat);
        }
    }
    /* rank 1 waits here, progressing the one-sided operations */
    MPI_Allreduce(MPI_IN_PLACE, &errs, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 1 && do_fop && !errs) {
        MPI_Win_sync(fwin);
        /* warm + timed increments at the target */
        uint64_t want = (uint64_t)(fop_iters / 10 + fop_iters);

        if (*fbase != want) {
            fprintf(stderr, PROG ": target holds %llu after the "
                    "fetch-and-ops, expected %llu\n",
                    (unsigned long long)*fbase, (unsigned long long)want);
            errs = 1;
        }
    }
    MPI_Win_unlock_all(fwin);
    MPI_Win_unlock_all(win);
    MPI_Allreduce(MPI_IN_PLACE, &errs, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0 && errs)
        fprintf(stderr, PROG ": FAILED (%d error(s))\n", errs);
    free(lbuf);
    MPI_Win_free(&fwin);
    MPI_Win_free(&win);
    MPI_Finalize();
    return errs ? 1 : 0;
}
