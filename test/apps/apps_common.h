/*
 * apps_common.h - helpers shared by the MPI test programs in test/apps.
 *
 * Every program validates what it received and ends with a non-zero exit
 * status on any mismatch: a failed CHECK prints where and why, and then
 * calls MPI_Abort (so that no rank is left waiting for the failed one).
 */
#ifndef HCA_APPS_COMMON_H
#define HCA_APPS_COMMON_H

#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int app_rank = -1;
static int app_size = 0;
static const char *app_name = "app";

static inline void app_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

static inline void app_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "%s: rank %d: FAILED at %s:%d: ", app_name, app_rank,
            file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

#define FAIL(...) app_fail(__FILE__, __LINE__, __VA_ARGS__)

#define CHECK(cond, ...) \
    do { \
        if (!(cond)) { \
            FAIL(__VA_ARGS__); \
        } \
    } while (0)

/* An MPI call that must return MPI_SUCCESS. */
#define MPI_CHECK(call) \
    do { \
        int mpi_rc_ = (call); \
        if (mpi_rc_ != MPI_SUCCESS) { \
            char msg_[MPI_MAX_ERROR_STRING]; \
            int len_ = 0; \
            MPI_Error_string(mpi_rc_, msg_, &len_); \
            FAIL("%s returned %d (%s)", #call, mpi_rc_, msg_); \
        } \
    } while (0)

static inline void app_init(int *argc, char ***argv, const char *name)
{
    app_name = name;
    MPI_Init(argc, argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &app_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &app_size);
}

/* Rank 0 prints a progress line (stdout, flushed). */
static inline void app_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void app_log(const char *fmt, ...)
{
    va_list ap;

    if (app_rank != 0) {
        return;
    }
    printf("%s: ", app_name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* Every rank confirms the test; rank 0 prints the total. */
static inline void app_finish(void)
{
    int ok = 1, all = 0;

    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    CHECK(all == app_size, "only %d of %d ranks finished", all, app_size);
    app_log("PASSED on %d ranks", app_size);
    MPI_Finalize();
}

/* Rounds (-T SECONDS, -U FILE): after round `round` (1, 2, ...) of a
 * program that began its first at t0 (MPI_Wtime), whether to run all its
 * tests again.  Rank 0 decides and tells the others: again while SECONDS
 * (if > 0) have not passed since t0 and FILE (if not NULL) does not exist
 * (the ranks of other hosts share this file system); neither given: one
 * round.  With either, rank 0 prints "round N done at S s". */
static inline int app_again(int round, double t0, double seconds,
                            const char *until)
{
    int more = 0;

    if (seconds <= 0 && until == NULL) {
        return 0;
    }
    if (app_rank == 0) {
        more = (seconds <= 0 || MPI_Wtime() - t0 < seconds) &&
               (until == NULL || access(until, F_OK) != 0);
    }
    MPI_CHECK(MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD));
    app_log("round %d done at %.1f s%s", round, MPI_Wtime() - t0,
            more ? "" : " (the last)");
    return more;
}

/* The byte at offset i of a message identified by seed: cheap, and a
 * misplaced, stale or foreign byte is caught. */
static inline uint8_t pattern_byte(uint64_t seed, size_t i)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + i;

    x ^= x >> 29;
    return (uint8_t)(x * 0xbf58476d1ce4e5b9ull >> 56);
}

static inline void pattern_fill(void *buf, size_t len, uint64_t seed)
{
    uint8_t *p = buf;

    for (size_t i = 0; i < len; ++i) {
        p[i] = pattern_byte(seed, i);
    }
}

/* Offset of the first wrong byte, or -1. */
static inline long pattern_find_error(const void *buf, size_t len, uint64_t seed)
{
    const uint8_t *p = buf;

    for (size_t i = 0; i < len; ++i) {
        if (p[i] != pattern_byte(seed, i)) {
            return (long)i;
        }
    }
    return -1;
}

/* Fail with a description of the first wrong byte. */
static inline void check_pattern_at(const char *file, int line, const void *buf,
                             size_t len, uint64_t seed, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static inline void check_pattern_at(const char *file, int line, const void *buf,
                             size_t len, uint64_t seed, const char *fmt, ...)
{
    long off = pattern_find_error(buf, len, seed);
    char what[256];
    va_list ap;

    if (off < 0) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    app_fail(file, line, "data mismatch in %s: byte %ld of %zu is 0x%02x, "
             "expected 0x%02x", what, off, len,
             ((const uint8_t*)buf)[off], pattern_byte(seed, (size_t)off));
}

#define CHECK_PATTERN(buf, len, seed, ...) \
    check_pattern_at(__FILE__, __LINE__, (buf), (len), (seed), __VA_ARGS__)

static inline void *xmalloc(size_t len)
{
    void *p = malloc(len ? len : 1);

    CHECK(p != NULL, "malloc(%zu) failed", len);
    return p;
}

static inline void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

#endif
