/*
 * p2p.c - point-to-point MPI test: every message is verified byte by byte.
 *
 *   pingpong     pairs (0,1), (2,3), ...: sizes 0 .. 16 MiB, powers of two
 *                and odd sizes around them (eager and rendezvous), blocking
 *                send/recv, MPI_Ssend and MPI_Sendrecv both ways at once
 *   outstanding  every rank to every other: many Isend/Irecv at once,
 *                receives pre-posted, then sends first (unexpected messages)
 *   wildcard     MPI_ANY_SOURCE + MPI_ANY_TAG: source, tag, length and the
 *                per-sender order (non-overtaking) are checked
 *   probe        MPI_Probe, MPI_Iprobe and MPI_Mprobe/MPI_Mrecv of messages
 *                whose length the receiver does not know
 *   ssend        MPI_Issend must not complete before the receive is posted
 *
 * usage: p2p [-q] [-T SECONDS] [-U FILE]
 *   -q          quick: fewer iterations and sizes up to 1 MiB
 *   -T SECONDS  run every test again until SECONDS have passed since the
 *               first round began
 *   -U FILE     ... or until FILE exists (rank 0 looks after each round;
 *               with -T too, until either): for run-apps.sh's flap case
 */
#include "apps_common.h"

#include <unistd.h>

#define MAX_SIZE      (16u << 20)
#define TAG_PINGPONG  100
#define TAG_PROBE_MAX 7

static int quick;

static uint64_t seed_of(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    return (((a * 1000003u + b) * 1000003u + c) * 1000003u + d) | 1u;
}

/* ------------------------------------------------------------ pingpong */

static size_t build_sizes(size_t *sizes)
{
    static const size_t odd[] = {
        3, 7, 31, 127, 255, 257, 1023, 1025, 4095, 4097, 8191, 8193,
        65535, 65537, 262143, 1000003, 4194305, 16777215
    };
    size_t max = quick ? (1u << 20) : MAX_SIZE;
    size_t n   = 0;

    sizes[n++] = 0;
    for (size_t s = 1; s <= max; s <<= 1) {
        sizes[n++] = s;
    }
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); ++i) {
        if (odd[i] <= max) {
            sizes[n++] = odd[i];
        }
    }
    return n;
}

static int iters_for(size_t size)
{
    if (quick) {
        return size <= 65536 ? 4 : 1;
    }
    return size <= 65536 ? 20 : (size <= (1u << 20) ? 4 : 2);
}

static void recv_check(void *buf, size_t size, int src, int tag,
                       uint64_t seed, const char *what)
{
    MPI_Status st;
    int count = -1;

    /* Receive into a larger buffer: the count must be the sent length. */
    memset(buf, 0xee, size + 16);
    MPI_CHECK(MPI_Recv(buf, (int)size + 16, MPI_BYTE, src, tag,
                       MPI_COMM_WORLD, &st));
    MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &count));
    CHECK(count == (int)size, "%s: size %zu from %d: count %d", what, size,
          src, count);
    CHECK(st.MPI_SOURCE == src && st.MPI_TAG == tag,
          "%s: status source %d tag %d, expected %d %d", what, st.MPI_SOURCE,
          st.MPI_TAG, src, tag);
    CHECK_PATTERN(buf, size, seed, "%s size %zu from %d", what, size, src);
}

static void test_pingpong(void)
{
    size_t sizes[64];
    size_t nsizes = build_sizes(sizes);
    int partner   = app_rank ^ 1;
    int initiator = !(app_rank & 1);
    char *sbuf    = xmalloc(MAX_SIZE + 16);
    char *rbuf    = xmalloc(MAX_SIZE + 16);
    size_t total  = 0;

    if (partner >= app_size) {
        partner = -1;   /* odd number of ranks: the last one sits out */
    }

    for (size_t k = 0; (partner >= 0) && (k < nsizes); ++k) {
        size_t size = sizes[k];
        int iters   = iters_for(size);

        for (int it = 0; it < iters; ++it) {
            uint64_t ping = seed_of(1, size, it, app_rank & ~1);
            uint64_t pong = seed_of(2, size, it, app_rank & ~1);
            /* Every fourth iteration sends synchronously. */
            int sync = (it % 4) == 3;

            if (initiator) {
                pattern_fill(sbuf, size, ping);
                if (sync) {
                    MPI_CHECK(MPI_Ssend(sbuf, (int)size, MPI_BYTE, partner,
                                        TAG_PINGPONG, MPI_COMM_WORLD));
                } else {
                    MPI_CHECK(MPI_Send(sbuf, (int)size, MPI_BYTE, partner,
                                       TAG_PINGPONG, MPI_COMM_WORLD));
                }
                recv_check(rbuf, size, partner, TAG_PINGPONG + 1, pong,
                           "pong");
            } else {
                recv_check(rbuf, size, partner, TAG_PINGPONG, ping, "ping");
                pattern_fill(sbuf, size, pong);
                MPI_CHECK(MPI_Send(sbuf, (int)size, MPI_BYTE, partner,
                                   TAG_PINGPONG + 1, MPI_COMM_WORLD));
            }
            total += 2 * size;
        }

        /* Both directions at once. */
        {
            uint64_t mine   = seed_of(3, size, app_rank, 0);
            uint64_t theirs = seed_of(3, size, partner, 0);
            MPI_Status st;
            int count = -1;

            pattern_fill(sbuf, size, mine);
            memset(rbuf, 0xee, size + 16);
            MPI_CHECK(MPI_Sendrecv(sbuf, (int)size, MPI_BYTE, partner, 7,
                                   rbuf, (int)size + 16, MPI_BYTE, partner, 7,
                                   MPI_COMM_WORLD, &st));
            MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &count));
            CHECK(count == (int)size, "sendrecv: count %d, expected %zu",
                  count, size);
            CHECK_PATTERN(rbuf, size, theirs, "sendrecv size %zu", size);
        }
    }
    free(sbuf);
    free(rbuf);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    app_log("pingpong: %zu sizes from 0 to %zu bytes, %.1f MiB verified "
            "per pair", nsizes, (size_t)(quick ? (1u << 20) : MAX_SIZE),
            total / 1048576.0);
}

/* --------------------------------------------------------- outstanding */

#define NMSG 32

static size_t out_len(int i)
{
    /* Mostly eager, every fourth a rendezvous-sized message. */
    return (i % 4 == 3) ? (size_t)(128 * 1024 + 8 * i + 1) : (size_t)(8 * i + 1);
}

static void test_outstanding(int unexpected)
{
    int npeers = app_size - 1;
    int nreq   = 2 * NMSG * npeers;
    MPI_Request *req = xmalloc(sizeof(*req) * nreq);
    char **sbuf = xmalloc(sizeof(char*) * NMSG * npeers);
    char **rbuf = xmalloc(sizeof(char*) * NMSG * npeers);
    int r = 0;

    for (int p = 0; p < npeers; ++p) {
        int peer = (app_rank + 1 + p) % app_size;
        for (int i = 0; i < NMSG; ++i) {
            size_t len = out_len(i);
            sbuf[p * NMSG + i] = xmalloc(len);
            rbuf[p * NMSG + i] = xmalloc(len);
            memset(rbuf[p * NMSG + i], 0xee, len);
            pattern_fill(sbuf[p * NMSG + i], len,
                         seed_of(4 + unexpected, app_rank, peer, i));
        }
    }

    if (!unexpected) {
        for (int p = 0; p < npeers; ++p) {
            int peer = (app_rank + app_size - 1 - p) % app_size;
            for (int i = 0; i < NMSG; ++i) {
                MPI_CHECK(MPI_Irecv(rbuf[p * NMSG + i], (int)out_len(i),
                                    MPI_BYTE, peer, i, MPI_COMM_WORLD,
                                    &req[r++]));
            }
        }
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    }
    for (int p = 0; p < npeers; ++p) {
        int peer = (app_rank + 1 + p) % app_size;
        for (int i = 0; i < NMSG; ++i) {
            MPI_CHECK(MPI_Isend(sbuf[p * NMSG + i], (int)out_len(i), MPI_BYTE,
                                peer, i, MPI_COMM_WORLD, &req[r++]));
        }
    }
    if (unexpected) {
        /* The sends are in flight (or waiting for a receive): post the
         * receives now, in reverse tag order. */
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        for (int p = 0; p < npeers; ++p) {
            int peer = (app_rank + app_size - 1 - p) % app_size;
            for (int i = NMSG - 1; i >= 0; --i) {
                MPI_CHECK(MPI_Irecv(rbuf[p * NMSG + i], (int)out_len(i),
                                    MPI_BYTE, peer, i, MPI_COMM_WORLD,
                                    &req[r++]));
            }
        }
    }
    CHECK(r == nreq, "posted %d requests, expected %d", r, nreq);
    MPI_CHECK(MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE));

    for (int p = 0; p < npeers; ++p) {
        int peer = (app_rank + app_size - 1 - p) % app_size;
        for (int i = 0; i < NMSG; ++i) {
            CHECK_PATTERN(rbuf[p * NMSG + i], out_len(i),
                          seed_of(4 + unexpected, peer, app_rank, i),
                          "outstanding%s message %d from %d",
                          unexpected ? " (unexpected)" : "", i, peer);
            free(rbuf[p * NMSG + i]);
            free(sbuf[p * NMSG + i]);
        }
    }
    free(sbuf);
    free(rbuf);
    free(req);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    app_log("outstanding: %d nonblocking requests per rank at once, "
            "receives %s", nreq, unexpected ? "posted after the sends" :
            "pre-posted");
}

/* -------------------------------------------------- wildcard and probe */

typedef struct {
    int32_t src;
    int32_t seq;
    int32_t tag;
    int32_t len;
} msg_hdr_t;

static size_t wild_len(int src, int seq)
{
    size_t base = sizeof(msg_hdr_t);

    if (seq % 16 == 5) {
        return base + 70000 + src * 13 + seq;   /* rendezvous */
    }
    return base + (size_t)((src * 37 + seq * 11) % 2000);
}

static void fill_msg(char *buf, int src, int seq, int tag, size_t len)
{
    msg_hdr_t h = {src, seq, tag, (int32_t)len};

    memcpy(buf, &h, sizeof(h));
    pattern_fill(buf + sizeof(h), len - sizeof(h), seed_of(6, src, seq, tag));
}

/* Check a received wildcard message against its status and the expected
 * per-source sequence number. */
static void check_msg(const char *what, const char *buf, int count,
                      const MPI_Status *st, int *next_seq)
{
    msg_hdr_t h;

    CHECK(count >= (int)sizeof(h), "%s: short message (%d bytes)", what,
          count);
    memcpy(&h, buf, sizeof(h));
    CHECK(h.src == st->MPI_SOURCE, "%s: payload from %d, status source %d",
          what, h.src, st->MPI_SOURCE);
    CHECK(h.tag == st->MPI_TAG, "%s: payload tag %d, status tag %d", what,
          h.tag, st->MPI_TAG);
    CHECK(h.len == count, "%s: payload length %d, count %d", what, h.len,
          count);
    CHECK((size_t)count == wild_len(h.src, h.seq),
          "%s: length %d, expected %zu", what, count, wild_len(h.src, h.seq));
    CHECK(h.seq == next_seq[h.src],
          "%s: message %d from %d arrived, expected %d (order)", what, h.seq,
          h.src, next_seq[h.src]);
    next_seq[h.src]++;
    CHECK_PATTERN(buf + sizeof(h), count - sizeof(h),
                  seed_of(6, h.src, h.seq, h.tag), "%s message %d from %d",
                  what, h.seq, h.src);
}

/* mode 0: ANY_SOURCE/ANY_TAG receive; 1: Probe; 2: Iprobe; 3: Mprobe */
static void test_wildcard(int root, int mode, int nmsg)
{
    static const char *names[] = {"wildcard", "probe", "iprobe", "mprobe"};
    const char *what = names[mode];
    size_t maxlen    = wild_len(app_size, 5) + 4096;

    if (app_rank != root) {
        MPI_Request *req = xmalloc(sizeof(*req) * nmsg);
        char **buf       = xmalloc(sizeof(char*) * nmsg);
        for (int s = 0; s < nmsg; ++s) {
            size_t len = wild_len(app_rank, s);
            int tag    = (s * 3 + app_rank) % TAG_PROBE_MAX;
            buf[s]     = xmalloc(len);
            fill_msg(buf[s], app_rank, s, tag, len);
            MPI_CHECK(MPI_Isend(buf[s], (int)len, MPI_BYTE, root, tag,
                                MPI_COMM_WORLD, &req[s]));
        }
        MPI_CHECK(MPI_Waitall(nmsg, req, MPI_STATUSES_IGNORE));
        for (int s = 0; s < nmsg; ++s) {
            free(buf[s]);
        }
        free(buf);
        free(req);
    } else {
        int *next_seq = calloc(app_size, sizeof(int));
        char *buf     = xmalloc(maxlen);
        int total     = nmsg * (app_size - 1);

        for (int m = 0; m < total; ++m) {
            MPI_Status st;
            int count = -1;

            memset(buf, 0xee, sizeof(msg_hdr_t));
            if (mode == 0) {
                MPI_CHECK(MPI_Recv(buf, (int)maxlen, MPI_BYTE, MPI_ANY_SOURCE,
                                   MPI_ANY_TAG, MPI_COMM_WORLD, &st));
                MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &count));
            } else if (mode == 3) {
                MPI_Message msg;
                MPI_Status st2;
                MPI_CHECK(MPI_Mprobe(MPI_ANY_SOURCE, MPI_ANY_TAG,
                                     MPI_COMM_WORLD, &msg, &st));
                MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &count));
                CHECK(count >= 0 && (size_t)count <= maxlen,
                      "mprobe: count %d", count);
                MPI_CHECK(MPI_Mrecv(buf, count, MPI_BYTE, &msg, &st2));
                CHECK(st2.MPI_SOURCE == st.MPI_SOURCE &&
                      st2.MPI_TAG == st.MPI_TAG,
                      "mprobe: probed %d/%d, received %d/%d", st.MPI_SOURCE,
                      st.MPI_TAG, st2.MPI_SOURCE, st2.MPI_TAG);
            } else {
                MPI_Status st2;
                int count2 = -1;
                if (mode == 1) {
                    MPI_CHECK(MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG,
                                        MPI_COMM_WORLD, &st));
                } else {
                    int flag = 0;
                    while (!flag) {
                        MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG,
                                             MPI_COMM_WORLD, &flag, &st));
                    }
                }
                MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &count));
                CHECK(count >= 0 && (size_t)count <= maxlen,
                      "%s: count %d", what, count);
                /* Exactly the probed length: a longer message would be a
                 * truncation error. */
                MPI_CHECK(MPI_Recv(buf, count, MPI_BYTE, st.MPI_SOURCE,
                                   st.MPI_TAG, MPI_COMM_WORLD, &st2));
                MPI_CHECK(MPI_Get_count(&st2, MPI_BYTE, &count2));
                CHECK(count2 == count, "%s: probed %d bytes, received %d",
                      what, count, count2);
            }
            check_msg(what, buf, count, &st, next_seq);
        }
        for (int s = 0; s < app_size; ++s) {
            CHECK(s == root || next_seq[s] == nmsg,
                  "%s: %d messages from %d, expected %d", what, next_seq[s], s,
                  nmsg);
        }
        free(buf);
        free(next_seq);
    }
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    app_log("%s: root %d received %d messages from each of %d ranks", what,
            root, nmsg, app_size - 1);
}

/* ---------------------------------------------------------------- ssend */

static void test_issend(size_t size)
{
    int partner = app_rank ^ 1;
    char *buf   = xmalloc(size + 16);
    int go      = 1;

    if (partner < app_size) {
        if (!(app_rank & 1)) {
            MPI_Request req;
            int flag = 0, early = 0;

            pattern_fill(buf, size, seed_of(8, size, app_rank, 0));
            MPI_CHECK(MPI_Issend(buf, (int)size, MPI_BYTE, partner, 11,
                                 MPI_COMM_WORLD, &req));
            /* The partner has not posted the receive: must not complete. */
            for (int i = 0; i < 50 && !early; ++i) {
                MPI_CHECK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
                early = flag;
                sleep_ms(2);
            }
            CHECK(!early, "MPI_Issend of %zu bytes completed before the "
                  "receive was posted", size);
            MPI_CHECK(MPI_Send(&go, 1, MPI_INT, partner, 12, MPI_COMM_WORLD));
            MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
        } else {
            MPI_CHECK(MPI_Recv(&go, 1, MPI_INT, partner, 12, MPI_COMM_WORLD,
                               MPI_STATUS_IGNORE));
            recv_check(buf, size, partner, 11,
                       seed_of(8, size, partner, 0), "issend");
        }
    }
    free(buf);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    app_log("ssend: MPI_Issend of %zu bytes completes only after the match",
            size);
}

int main(int argc, char **argv)
{
    int opt, round = 0;
    double seconds = 0, t0;
    const char *until = NULL;

    app_init(&argc, &argv, "p2p");
    while ((opt = getopt(argc, argv, "qT:U:")) != -1) {
        if (opt == 'q') {
            quick = 1;
        } else if (opt == 'T') {
            seconds = atof(optarg);
        } else if (opt == 'U') {
            until = optarg;
        }
    }
    CHECK(app_size >= 2, "needs at least 2 ranks");

    t0 = MPI_Wtime();
    do {
        test_pingpong();
        test_outstanding(0);
        test_outstanding(1);
        for (int mode = 0; mode < 4; ++mode) {
            test_wildcard(0, mode, quick ? 40 : 150);
            test_wildcard(app_size - 1, mode, quick ? 20 : 60);
        }
        test_issend(8);
        test_issend(1u << 20);
    } while (app_again(++round, t0, seconds, until));
    app_finish();
    return 0;
}
