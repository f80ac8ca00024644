/*
 * hca_pingpong_bench.c - ping-pong latency of the hca software HCA.
 *
 * usage: hca_pingpong_bench [-n ITERS] [-w WARMUP] [-s SIZE] [-d DEV] [-C]
 *                           [-h]
 *
 * A benchmark, not a test: two processes (the parent and a forked child)
 * bounce a message back and forth and the parent reports half the round
 * trip ("one-way" latency), median and average, of:
 *
 *   raw_shm     two processes spinning on 64-bit flags in a MAP_SHARED page:
 *               the cache-line round trip, the floor for everything below
 *   send        SEND/RECV: each side polls its receive CQ, then replies
 *   rdma_write  inline RDMA WRITE of a sequence number into the peer's
 *               registered buffer; each side spins on its own memory
 *
 * Messages are sent inline when they fit max_inline_data.  The sequence
 * number is a message's last 8 bytes, so the write test sees a message
 * only once all of it should have landed.  -C opens the device without
 * single copy (CMA), to measure the ring / responder path instead.
 *
 * The child opens the device after fork (a device context belongs to one
 * process); addresses, QP numbers, rkeys and buffer addresses go over a
 * pipe pair.  Nothing is pinned: on a small machine (2 vCPUs) the two
 * spinning processes each get a CPU, which is what an application sees.
 * Every wait is bounded (10 s), so a broken library or a dead peer ends the
 * run with an error instead of a hang.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hca_dev.h"

#define PROG             "hca_pingpong_bench"
#define WAIT_TIMEOUT_NS  (10ull * 1000000000ull)
#define WAIT_TIMEOUT_MS  10000
/* Read the clock only every 1024 spins: the fast path must stay a load (or
 * a CQ poll), or the timeout itself would show in the latency. */
#define SPIN_CHECK_MASK  1023u
#define RECV_DEPTH       16     /* receives kept posted in the SEND test */
#define SQ_DEPTH         64
#define CQ_DEPTH         256
#define CACHE_LINE       64
#define POLL_BATCH       16

struct options {
    long        iters;
    long        warmup;
    size_t      size;
    const char *dev_name;
    unsigned    open_flags; /* -C: HCA_OPEN_NO_SINGLE_COPY */
};

/* One process's view of the benchmark. */
struct side {
    int         initiator;  /* the parent: starts each round, measures */
    int         rfd, wfd;   /* pipe from / to the peer */
};

/* Flags of the raw shared-memory test, on separate cache lines (and a line
 * apart, so the adjacent-line prefetcher does not couple them). */
struct shm_flags {
    volatile uint64_t ping;
    char              pad1[2 * CACHE_LINE - sizeof(uint64_t)];
    volatile uint64_t pong;
    char              pad2[2 * CACHE_LINE - sizeof(uint64_t)];
};

/* What one side tells the other to connect and write to it. */
struct ep_info {
    hca_port_addr_t addr;
    uint32_t        qpn;
    uint32_t        rkey;
    uint64_t        write_addr;  /* where the peer's RDMA WRITEs go */
};

/* Verbs resources of one side. */
struct endpoint {
    hca_device_t *dev;
    hca_pd_t     *pd;
    hca_cq_t     *send_cq;
    hca_cq_t     *recv_cq;
    hca_qp_t     *qp;
    hca_mr_t     *mr;
    uint8_t      *buf;          /* one registered buffer, laid out as: */
    size_t        buf_len;
    size_t        slot;         /*   slot = size rounded to a cache line */
    uint8_t      *recv_area;    /*   RECV_DEPTH receive slots */
    uint8_t      *write_area;   /*   one slot the peer writes into */
    uint8_t      *src;          /*   one slot we send / write from */
    size_t        size;         /* message size */
    size_t        seq_off;      /* where the sequence number sits */
    unsigned      send_flags;   /* SIGNALED, and INLINE when it fits */
    uint32_t      sq_depth;
    uint32_t      send_outstanding; /* posted, completion not yet polled */
    uint64_t      peer_write_addr;
    uint32_t      peer_rkey;
};

struct result {
    const char *name;
    double      median_ns;      /* one-way = round trip / 2 */
    double      avg_ns;
};

static const char *g_role = "parent";
static pid_t g_child_pid = -1;  /* the parent kills it when it dies */

/* ------------------------------------------------------------ errors */

static void die(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, PROG " (%s): ", g_role);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    /* The child would only notice after its own timeout; end it now. */
    if (g_child_pid > 0)
        kill(g_child_pid, SIGTERM);
    exit(1);
}

static void check_rc(int rc, const char *what)
{
    if (rc < 0)
        die("%s: %s", what, strerror(-rc));
}

static void check_wc(const hca_wc_t *wc, const char *cq_name)
{
    if (wc->status != HCA_WC_SUCCESS)
        die("%s completion error: %s (vendor_err %" PRIu32 ", wr_id %"
            PRIu64 ", qp %" PRIu32 ")", cq_name,
            hca_wc_status_str(wc->status), wc->vendor_err, wc->wr_id,
            wc->qp_num);
}

/* ------------------------------------------------------------ time, spin */

static inline uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Bounds a busy wait.  The deadline is set lazily at the first check, so
 * a wait that succeeds within 1024 spins never reads the clock. */
struct spin {
    uint64_t deadline;
    uint32_t count;
};

static inline void spin_start(struct spin *s)
{
    s->deadline = 0;
    s->count = 0;
}

/* The parent notices a dead child at once instead of after the timeout
 * (the child needs no such check: it dies with the parent). */
static int child_gone(void)
{
    int status;

    if (g_child_pid <= 0 || waitpid(g_child_pid, &status, WNOHANG) <= 0)
        return 0;
    g_child_pid = -1;
    return 1;
}

static inline void spin_check(struct spin *s, const char *what, long iter)
{
    uint64_t now;

    if ((++s->count & SPIN_CHECK_MASK) != 0)
        return;
    if (child_gone())
        die("the child exited while waiting for %s at iteration %ld",
            what, iter);
    now = now_ns();
    if (s->deadline == 0)
        s->deadline = now + WAIT_TIMEOUT_NS;
    else if (now > s->deadline)
        die("timeout (%llu s) waiting for %s at iteration %ld",
            WAIT_TIMEOUT_NS / 1000000000ull, what, iter);
}

/* ------------------------------------------------------------ pipe */

/* Waits (bounded) until fd is readable, so a stuck peer cannot hang us. */
static void wait_readable(int fd)
{
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    int rc;

    do {
        rc = poll(&pfd, 1, WAIT_TIMEOUT_MS);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0)
        die("poll on pipe: %s", strerror(errno));
    if (rc == 0)
        die("timeout waiting for the peer on the pipe");
}

static void read_full(int fd, void *p, size_t len)
{
    uint8_t *b = p;
    ssize_t n;

    while (len > 0) {
        wait_readable(fd);
        n = read(fd, b, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die("read from pipe: %s", strerror(errno));
        if (n == 0)
            die("peer closed the pipe (it failed?)");
        b += n;
        len -= (size_t)n;
    }
}

static void write_full(int fd, const void *p, size_t len)
{
    const uint8_t *b = p;
    ssize_t n;

    while (len > 0) {
        n = write(fd, b, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die("write to pipe: %s%s", strerror(errno),
                errno == EPIPE ? " (the peer exited)" : "");
        b += n;
        len -= (size_t)n;
    }
}

/* Both sides reach this point before either goes on: each test starts
 * with the peer ready (receives posted, previous test drained). */
static void barrier(const struct side *sd)
{
    char c = 'b';

    write_full(sd->wfd, &c, 1);
    read_full(sd->rfd, &c, 1);
}

/* ------------------------------------------------------------ statistics */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

/* samples are round trips; the result is one-way (half of them). */
static void summarize(uint64_t *samples, long n, struct result *res)
{
    double sum = 0.0;
    long i;

    qsort(samples, (size_t)n, sizeof(*samples), cmp_u64);
    for (i = 0; i < n; i++)
        sum += (double)samples[i];
    if (n % 2)
        res->median_ns = (double)samples[n / 2] / 2.0;
    else
        res->median_ns = ((double)samples[n / 2 - 1] +
                          (double)samples[n / 2]) / 4.0;
    res->avg_ns = sum / (double)n / 2.0;
}

/* One timestamp per round: the round trip is the distance between two
 * consecutive ones, which halves the clock overhead in the numbers. */
struct timing {
    uint64_t *samples;
    long      warmup;
    uint64_t  prev;
};

static inline void timing_start(struct timing *t)
{
    t->prev = now_ns();
}

static inline void timing_round(struct timing *t, long i)
{
    uint64_t now;

    if (!t->samples)   /* the responder does not measure */
        return;
    now = now_ns();
    if (i >= t->warmup)
        t->samples[i - t->warmup] = now - t->prev;
    t->prev = now;
}

/* ------------------------------------------------------------ raw shm */

static void shm_round(volatile uint64_t *out, volatile uint64_t *in,
                      uint64_t seq, int send_first, long iter)
{
    struct spin s;

    if (send_first)
        __atomic_store_n(out, seq, __ATOMIC_RELEASE);
    spin_start(&s);
    while (__atomic_load_n(in, __ATOMIC_ACQUIRE) != seq)
        spin_check(&s, "the shm flag", iter);
    if (!send_first)
        __atomic_store_n(out, seq, __ATOMIC_RELEASE);
}

static void run_shm(const struct side *sd, struct shm_flags *fl,
                    const struct options *opt, struct timing *t)
{
    long total = opt->warmup + opt->iters, i;
    volatile uint64_t *out = sd->initiator ? &fl->ping : &fl->pong;
    volatile uint64_t *in = sd->initiator ? &fl->pong : &fl->ping;

    timing_start(t);
    for (i = 0; i < total; i++) {
        shm_round(out, in, (uint64_t)i + 1, sd->initiator, i);
        timing_round(t, i);
    }
}

/* ------------------------------------------------------------ endpoint */

static uint32_t min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

/* Lays out and registers the one buffer used by all tests. */
static void ep_alloc_buffer(struct endpoint *ep, size_t size)
{
    long page = sysconf(_SC_PAGESIZE);
    int rc;

    ep->size = size;
    ep->seq_off = size - sizeof(uint64_t);  /* the last bytes land last */
    ep->slot = (size + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE;
    ep->buf_len = (RECV_DEPTH + 2) * ep->slot;
    ep->buf_len = (ep->buf_len + (size_t)page - 1) / (size_t)page *
                  (size_t)page;
    rc = posix_memalign((void **)&ep->buf, (size_t)page, ep->buf_len);
    if (rc != 0)
        die("posix_memalign(%zu): %s", ep->buf_len, strerror(rc));
    memset(ep->buf, 0, ep->buf_len);
    ep->recv_area = ep->buf;
    ep->write_area = ep->buf + RECV_DEPTH * ep->slot;
    ep->src = ep->write_area + ep->slot;
    check_rc(hca_mr_reg(ep->pd, ep->buf, ep->buf_len,
                        HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE,
                        &ep->mr), "hca_mr_reg");
}

static void ep_open(struct endpoint *ep, const struct options *opt)
{
    hca_device_attr_t attr;
    hca_qp_init_attr_t qpa;
    int cqe;

    memset(ep, 0, sizeof(*ep));
    check_rc(hca_device_open(opt->dev_name, opt->open_flags, &ep->dev),
             "hca_device_open");
    check_rc(hca_device_query(ep->dev, &attr), "hca_device_query");
    if (opt->size > attr.max_msg_size)
        die("size %zu is above max_msg_size %" PRIu64, opt->size,
            attr.max_msg_size);
    /* Inline when it fits, as a latency test on real HCAs does; larger
     * messages are sent from the registered buffer. */
    ep->send_flags = HCA_SEND_SIGNALED;
    if (opt->size <= attr.max_inline_data)
        ep->send_flags |= HCA_SEND_INLINE;

    check_rc(hca_pd_alloc(ep->dev, &ep->pd), "hca_pd_alloc");
    ep_alloc_buffer(ep, opt->size);
    cqe = (int)min_u32(CQ_DEPTH, attr.max_cqe);
    check_rc(hca_cq_create(ep->dev, cqe, &ep->send_cq), "hca_cq_create");
    check_rc(hca_cq_create(ep->dev, cqe, &ep->recv_cq), "hca_cq_create");

    memset(&qpa, 0, sizeof(qpa));
    qpa.send_cq = ep->send_cq;
    qpa.recv_cq = ep->recv_cq;
    qpa.max_send_wr = min_u32(SQ_DEPTH, attr.max_qp_wr);
    qpa.max_recv_wr = min_u32(RECV_DEPTH, attr.max_qp_wr);
    qpa.max_send_sge = 1;
    qpa.max_recv_sge = 1;
    if (ep->send_flags & HCA_SEND_INLINE)
        qpa.max_inline_data = (uint32_t)opt->size;
    check_rc(hca_qp_create(ep->pd, &qpa, &ep->qp), "hca_qp_create");
    ep->sq_depth = qpa.max_send_wr;
    if (qpa.max_recv_wr < RECV_DEPTH)
        die("max_qp_wr %" PRIu32 " is below %d", attr.max_qp_wr, RECV_DEPTH);
}

static void ep_local_info(struct endpoint *ep, struct ep_info *info)
{
    memset(info, 0, sizeof(*info));
    hca_port_address(ep->dev, &info->addr);
    info->qpn = hca_qp_num(ep->qp);
    info->rkey = hca_mr_rkey(ep->mr);
    info->write_addr = (uint64_t)(uintptr_t)ep->write_area;
}

/* RESET -> INIT -> RTR -> RTS against the peer's QP. */
static void ep_connect(struct endpoint *ep, const struct ep_info *peer)
{
    hca_qp_attr_t qa;

    if (hca_port_addr_reachable(ep->dev, &peer->addr) != 1)
        die("the peer's port address is not reachable from %s",
            hca_device_name(ep->dev));
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = HCA_QPS_INIT;
    qa.access = HCA_ACCESS_REMOTE_WRITE;
    check_rc(hca_qp_modify(ep->qp, &qa,
                           HCA_QP_ATTR_STATE | HCA_QP_ATTR_ACCESS),
             "hca_qp_modify(INIT)");
    qa.qp_state = HCA_QPS_RTR;
    qa.dest = peer->addr;
    qa.dest_qp_num = peer->qpn;
    check_rc(hca_qp_modify(ep->qp, &qa, HCA_QP_ATTR_STATE | HCA_QP_ATTR_DEST),
             "hca_qp_modify(RTR)");
    qa.qp_state = HCA_QPS_RTS;
    check_rc(hca_qp_modify(ep->qp, &qa, HCA_QP_ATTR_STATE),
             "hca_qp_modify(RTS)");
    ep->peer_write_addr = peer->write_addr;
    ep->peer_rkey = peer->rkey;
}

static void ep_close(struct endpoint *ep)
{
    check_rc(hca_qp_destroy(ep->qp), "hca_qp_destroy");
    check_rc(hca_cq_destroy(ep->send_cq), "hca_cq_destroy");
    check_rc(hca_cq_destroy(ep->recv_cq), "hca_cq_destroy");
    check_rc(hca_mr_dereg(ep->mr), "hca_mr_dereg");
    check_rc(hca_pd_dealloc(ep->pd), "hca_pd_dealloc");
    check_rc(hca_device_close(ep->dev), "hca_device_close");
    free(ep->buf);
}

/* ------------------------------------------------------------ verbs I/O */

/* Reaps send completions so the send queue and CQ never fill up. */
static void reap_send(struct endpoint *ep)
{
    hca_wc_t wc[POLL_BATCH];
    int n, i;

    n = hca_cq_poll(ep->send_cq, POLL_BATCH, wc);
    check_rc(n, "hca_cq_poll(send)");
    for (i = 0; i < n; i++)
        check_wc(&wc[i], "send");
    ep->send_outstanding -= (uint32_t)n;
}

/* Polls the receive CQ for at most one completion; returns 0 or 1. */
static int poll_recv(struct endpoint *ep, hca_wc_t *wc)
{
    int n = hca_cq_poll(ep->recv_cq, 1, wc);

    check_rc(n, "hca_cq_poll(recv)");
    if (n == 1)
        check_wc(wc, "recv");
    return n;
}

static void post_recv_slot(struct endpoint *ep, uint64_t slot)
{
    hca_sge_t sge = {
        .addr = (uint64_t)(uintptr_t)(ep->recv_area + slot * ep->slot),
        .length = (uint32_t)ep->size,
        .lkey = hca_mr_lkey(ep->mr),
    };
    hca_recv_wr_t wr = { .wr_id = slot, .next = NULL, .sg_list = &sge,
                         .num_sge = 1 };
    hca_recv_wr_t *bad = NULL;

    check_rc(hca_post_recv(ep->qp, &wr, &bad), "hca_post_recv");
}

/* Posts one send WR, retrying while the send queue or the target's ring
 * is full (both drain as completions are polled). */
static void post_send_retry(struct endpoint *ep, hca_send_wr_t *wr, long iter)
{
    hca_send_wr_t *bad = NULL;
    hca_wc_t wc;
    struct spin s;
    int rc;

    spin_start(&s);
    while (ep->send_outstanding >= ep->sq_depth) {
        reap_send(ep);
        spin_check(&s, "send queue space", iter);
    }
    for (;;) {
        rc = hca_post_send(ep->qp, wr, &bad);
        if (rc == 0)
            break;
        if (rc != -EAGAIN && rc != -ENOMEM)
            die("hca_post_send(%s) at iteration %ld: %s",
                hca_wr_opcode_str(wr->opcode), iter, strerror(-rc));
        reap_send(ep);
        if (poll_recv(ep, &wc))  /* nothing may arrive before we sent */
            die("unexpected receive while posting at iteration %ld", iter);
        spin_check(&s, "hca_post_send to succeed", iter);
    }
    ep->send_outstanding++;
}

/* Sends (or RDMA-writes) size bytes from src ending in seq. */
static void post_seq(struct endpoint *ep, hca_wr_opcode_t opcode,
                     uint64_t seq, long iter)
{
    hca_sge_t sge = {
        .addr = (uint64_t)(uintptr_t)ep->src,
        .length = (uint32_t)ep->size,
        .lkey = hca_mr_lkey(ep->mr),
    };
    hca_send_wr_t wr;

    /* Reusing src without waiting for the previous completion is safe:
     * the peer has already seen that message (it replied to it). */
    memcpy(ep->src + ep->seq_off, &seq, sizeof(seq));
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = seq;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.send_flags = ep->send_flags;
    if (opcode == HCA_WR_RDMA_WRITE) {
        wr.rdma.remote_addr = ep->peer_write_addr;
        wr.rdma.rkey = ep->peer_rkey;
    }
    post_send_retry(ep, &wr, iter);
}

/* Waits until all posted sends have completed, so a test leaves nothing
 * behind for the next one. */
static void drain_sends(struct endpoint *ep)
{
    struct spin s;

    spin_start(&s);
    while (ep->send_outstanding > 0) {
        reap_send(ep);
        spin_check(&s, "the last send completions", -1);
    }
}

/* ------------------------------------------------------------ SEND test */

static void check_recv(struct endpoint *ep, const hca_wc_t *wc, uint64_t seq,
                       long iter)
{
    uint64_t got;

    if (wc->opcode != HCA_WC_RECV || wc->byte_len != ep->size ||
        wc->wr_id >= RECV_DEPTH)
        die("bad receive at iteration %ld: opcode %d byte_len %" PRIu32
            " wr_id %" PRIu64, iter, (int)wc->opcode, wc->byte_len,
            wc->wr_id);
    memcpy(&got, ep->recv_area + wc->wr_id * ep->slot + ep->seq_off,
           sizeof(got));
    if (got != seq)
        die("receive at iteration %ld carries %" PRIu64 ", expected %"
            PRIu64, iter, got, seq);
}

/* Poll-driven: the send CQ is reaped while waiting, as a UCX worker's
 * progress would do, and the receive is re-posted at once. */
static void wait_recv(struct endpoint *ep, uint64_t seq, long iter)
{
    hca_wc_t wc;
    struct spin s;

    spin_start(&s);
    while (!poll_recv(ep, &wc)) {
        reap_send(ep);
        spin_check(&s, "a receive completion", iter);
    }
    check_recv(ep, &wc, seq, iter);
    post_recv_slot(ep, wc.wr_id);
}

static void run_send(const struct side *sd, struct endpoint *ep,
                     const struct options *opt, struct timing *t)
{
    long total = opt->warmup + opt->iters, i;

    timing_start(t);
    for (i = 0; i < total; i++) {
        uint64_t seq = (uint64_t)i + 1;

        if (sd->initiator) {
            post_seq(ep, HCA_WR_SEND, seq, i);
            wait_recv(ep, seq, i);
        } else {
            wait_recv(ep, seq, i);
            post_seq(ep, HCA_WR_SEND, seq, i);
        }
        timing_round(t, i);
    }
    drain_sends(ep);
}

/* ------------------------------------------------------------ WRITE test */

/* Spins on our own memory for the peer's write.  The CQs are polled too:
 * a software HCA may need the target to progress its engines, and that
 * is the cost a real consumer pays as well. */
static void wait_write(struct endpoint *ep, uint64_t seq, long iter)
{
    volatile uint64_t *p = (volatile uint64_t *)(ep->write_area + ep->seq_off);
    hca_wc_t wc;
    struct spin s;

    spin_start(&s);
    while (__atomic_load_n(p, __ATOMIC_ACQUIRE) != seq) {
        reap_send(ep);
        if (poll_recv(ep, &wc))
            die("unexpected receive in the write test at iteration %ld",
                iter);
        spin_check(&s, "the peer's RDMA WRITE", iter);
    }
}

static void run_write(const struct side *sd, struct endpoint *ep,
                      const struct options *opt, struct timing *t)
{
    long total = opt->warmup + opt->iters, i;

    timing_start(t);
    for (i = 0; i < total; i++) {
        uint64_t seq = (uint64_t)i + 1;

        if (sd->initiator) {
            post_seq(ep, HCA_WR_RDMA_WRITE, seq, i);
            wait_write(ep, seq, i);
        } else {
            wait_write(ep, seq, i);
            post_seq(ep, HCA_WR_RDMA_WRITE, seq, i);
        }
        timing_round(t, i);
    }
    drain_sends(ep);
}

/* ------------------------------------------------------------ driver */

static void print_results(const struct result *res, int n, size_t size)
{
    double base = res[0].median_ns;  /* raw_shm comes first */
    int i;

    printf("%-12s %8s %12s %12s %10s\n", "test", "size", "median_ns",
           "avg_ns", "vs_shm");
    for (i = 0; i < n; i++)
        printf("%-12s %8zu %12.1f %12.1f %9.1fx\n", res[i].name,
               i == 0 ? sizeof(uint64_t) : size, res[i].median_ns,
               res[i].avg_ns, base > 0 ? res[i].median_ns / base : 0.0);
}

/* A device test: both sides run it, the initiator's timing measures. */
typedef void (*test_fn)(const struct side *, struct endpoint *,
                        const struct options *, struct timing *);

/* Everything both processes do; returns the process exit code. */
static int run_side(const struct side *sd, struct shm_flags *fl,
                    const struct options *opt)
{
    static const struct { const char *name; test_fn fn; } tests[] = {
        { "send",       run_send },
        { "rdma_write", run_write },
    };
    struct result res[3];
    struct endpoint ep;
    struct ep_info mine, peer;
    struct timing t = { .samples = NULL, .warmup = opt->warmup, .prev = 0 };
    size_t i;

    if (sd->initiator) {
        t.samples = calloc((size_t)opt->iters, sizeof(uint64_t));
        if (!t.samples)
            die("out of memory for %ld samples", opt->iters);
    }

    ep_open(&ep, opt);
    ep_local_info(&ep, &mine);
    write_full(sd->wfd, &mine, sizeof(mine));
    read_full(sd->rfd, &peer, sizeof(peer));
    ep_connect(&ep, &peer);
    for (i = 0; i < RECV_DEPTH; i++)
        post_recv_slot(&ep, i);

    barrier(sd);
    run_shm(sd, fl, opt, &t);
    if (sd->initiator) {
        res[0].name = "raw_shm";
        summarize(t.samples, opt->iters, &res[0]);
    }
    for (i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        barrier(sd);
        tests[i].fn(sd, &ep, opt, &t);
        if (sd->initiator) {
            res[i + 1].name = tests[i].name;
            summarize(t.samples, opt->iters, &res[i + 1]);
        }
    }
    /* neither side tears down while the other may still poll */
    barrier(sd);
    ep_close(&ep);
    if (sd->initiator) {
        print_results(res, 3, opt->size);
        free(t.samples);
    }
    return 0;
}

static long parse_long(const char *s, char opt, long min)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 0);
    if (errno || end == s || *end || v < min) {
        fprintf(stderr, PROG ": -%c needs an integer >= %ld, not '%s'\n",
                opt, min, s);
        exit(1);
    }
    return v;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: " PROG
            " [-n ITERS] [-w WARMUP] [-s SIZE] [-d DEV] [-C] [-h]\n"
            "  -n ITERS   measured round trips per test (default 100000)\n"
            "  -w WARMUP  round trips before measuring (default 10000)\n"
            "  -s SIZE    message size, a multiple of 8 (default 8)\n"
            "  -d DEV     device (default hca0)\n"
            "  -C         no single copy (CMA): measure the ring and\n"
            "             responder path instead\n");
}

static void parse_options(int argc, char **argv, struct options *opt)
{
    int c;

    opt->iters = 100000;
    opt->warmup = 10000;
    opt->size = 8;
    opt->dev_name = "hca0";
    opt->open_flags = 0;
    while ((c = getopt(argc, argv, "n:w:s:d:Ch")) != -1) {
        switch (c) {
        case 'n':
            opt->iters = parse_long(optarg, 'n', 1);
            break;
        case 'w':
            opt->warmup = parse_long(optarg, 'w', 0);
            break;
        case 's':
            opt->size = (size_t)parse_long(optarg, 's', 8);
            break;
        case 'd':
            opt->dev_name = optarg;
            break;
        case 'C':
            opt->open_flags = HCA_OPEN_NO_SINGLE_COPY;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(1);
        }
    }
    /* the sequence number is the message's last aligned 8 bytes, polled
     * in place by the write test */
    if (opt->size % sizeof(uint64_t) || opt->size > UINT32_MAX) {
        fprintf(stderr, PROG ": -s must be a multiple of 8 below 4 GiB\n");
        exit(1);
    }
}

/* The child dies with the parent, so an aborted run leaves nothing
 * spinning behind. */
static void child_setup(pid_t parent)
{
    g_role = "child";
    g_child_pid = -1;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
        die("prctl(PR_SET_PDEATHSIG): %s", strerror(errno));
    if (getppid() != parent)
        exit(1);
}

/* The parent reports the child's failure as its own. */
static int wait_child(pid_t pid)
{
    int status;

    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            die("waitpid: %s", strerror(errno));
    }
    g_child_pid = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFSIGNALED(status))
        fprintf(stderr, PROG ": child killed by signal %d\n",
                WTERMSIG(status));
    else
        fprintf(stderr, PROG ": child exited with %d\n", WEXITSTATUS(status));
    return 1;
}

int main(int argc, char **argv)
{
    struct options opt;
    struct shm_flags *fl;
    struct side sd;
    int p2c[2], c2p[2], rc;
    pid_t parent = getpid(), pid;

    parse_options(argc, argv, &opt);
    /* a peer that died must show as an EPIPE error, not kill us silently */
    signal(SIGPIPE, SIG_IGN);

    /* created before fork so both processes share the very same page */
    fl = mmap(NULL, sizeof(*fl), PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (fl == MAP_FAILED)
        die("mmap: %s", strerror(errno));
    if (pipe(p2c) < 0 || pipe(c2p) < 0)
        die("pipe: %s", strerror(errno));

    fflush(NULL);  /* nothing buffered may be printed twice */
    pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        child_setup(parent);
        close(p2c[1]);
        close(c2p[0]);
        sd = (struct side){ .initiator = 0, .rfd = p2c[0], .wfd = c2p[1] };
        return run_side(&sd, fl, &opt);
    }
    g_child_pid = pid;
    close(p2c[0]);
    close(c2p[1]);
    sd = (struct side){ .initiator = 1, .rfd = c2p[0], .wfd = p2c[1] };
    rc = run_side(&sd, fl, &opt);
    return wait_child(pid) || rc;
}
