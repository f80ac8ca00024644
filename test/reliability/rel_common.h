/*
 * rel_common.h - helpers shared by the reliability campaign programs.
 *
 * The programs run as pairs (or groups) of processes started by the
 * campaign scripts, which kill some of them with SIGKILL.  They meet through
 * files in a run directory given on the command line: a file appears
 * atomically (written under a temporary name, then renamed), so a reader
 * never sees half of it, and a process killed while writing leaves nothing.
 *
 * Data patterns: every 8-byte word written by a test encodes who wrote it
 * (a "tag": a sequence number, a sender id) and its own index, so a reader
 * can tell a correct word from a corrupted one without knowing which of
 * several writers came last - a torn (partly placed) transfer of a killed
 * writer is legal, a word no writer wrote is not.
 */
#ifndef REL_COMMON_H
#define REL_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REL_MAGIC     0x5a17c0de00000000ull
#define REL_IDX_BITS  24                    /* word index: up to 128 MiB */
#define REL_IDX_MASK  ((1ull << REL_IDX_BITS) - 1)

static inline uint64_t rel_word(uint64_t tag, uint64_t idx)
{
    return REL_MAGIC ^ (tag << REL_IDX_BITS) ^ idx;
}

/* Tag of word w found at index idx, or -1 if no writer wrote it there. */
static inline int64_t rel_word_tag(uint64_t w, uint64_t idx)
{
    uint64_t x = w ^ REL_MAGIC;

    if ((x & REL_IDX_MASK) != (idx & REL_IDX_MASK)) {
        return -1;
    }
    return (int64_t)(x >> REL_IDX_BITS);
}

static inline void rel_fill(void *buf, size_t len, uint64_t tag,
                            uint64_t first_idx)
{
    uint64_t *w = (uint64_t*)buf;

    for (size_t k = 0; k < len / 8; ++k) {
        w[k] = rel_word(tag, first_idx + k);
    }
}

/* Words of buf that are not rel_word(tag, first_idx + k). */
static inline size_t rel_check(const void *buf, size_t len, uint64_t tag,
                               uint64_t first_idx)
{
    const uint64_t *w = (const uint64_t*)buf;
    size_t bad        = 0;

    for (size_t k = 0; k < len / 8; ++k) {
        bad += (w[k] != rel_word(tag, first_idx + k));
    }
    return bad;
}

/* A cheap mixing function: message lengths and choices derived from a
 * sequence number, so that the receiver knows what to expect. */
static inline uint64_t rel_hash(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* CLOCK_REALTIME in ns: comparable with the kill time the script takes
 * from $EPOCHREALTIME. */
static inline uint64_t rel_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t rel_mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void rel_sleep_us(unsigned us)
{
    struct timespec ts = {.tv_sec  = us / 1000000,
                          .tv_nsec = (long)(us % 1000000) * 1000};

    nanosleep(&ts, NULL);
}

#define rel_die(...) \
    do { \
        fprintf(stderr, "%s: ", rel_prog); \
        fprintf(stderr, __VA_ARGS__); \
        fprintf(stderr, "\n"); \
        exit(2); \
    } while (0)

extern const char *rel_prog;

/* Writes dir/name atomically (0644: a peer running as another user may
 * read it). Returns 0 or -errno. */
static inline int rel_put_file(const char *dir, const char *name,
                               const void *data, size_t len)
{
    char tmp[4096], path[4096];
    int fd, rc = 0;

    snprintf(tmp, sizeof(tmp), "%s/.%s.%d", dir, name, (int)getpid());
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        return -errno;
    }
    if (write(fd, data, len) != (ssize_t)len) {
        rc = -EIO;
    }
    if ((close(fd) != 0) && (rc == 0)) {
        rc = -errno;
    }
    if ((rc == 0) && (rename(tmp, path) != 0)) {
        rc = -errno;
    }
    if (rc != 0) {
        unlink(tmp);
    }
    return rc;
}

static inline int rel_put_text(const char *dir, const char *name,
                               const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return rel_put_file(dir, name, buf, (size_t)n);
}

/* Reads dir/name into a malloc'ed buffer, waiting up to timeout_ms for it
 * to appear.  Returns the length, or -1 on timeout. */
static inline ssize_t rel_get_file(const char *dir, const char *name,
                                   int timeout_ms, void **data_p)
{
    char path[4096];
    uint64_t deadline = rel_mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    ssize_t len;
    char *buf;
    int fd;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    while ((fd = open(path, O_RDONLY)) < 0) {
        if (rel_mono_ns() > deadline) {
            return -1;
        }
        rel_sleep_us(1000);
    }
    len = lseek(fd, 0, SEEK_END);
    buf = malloc((size_t)len + 1);
    if ((buf == NULL) || (pread(fd, buf, (size_t)len, 0) != len)) {
        rel_die("cannot read %s", path);
    }
    buf[len] = '\0';
    close(fd);
    *data_p = buf;
    return len;
}

static inline int rel_file_exists(const char *dir, const char *name)
{
    char path[4096];

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

#endif
