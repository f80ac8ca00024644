/*
 * hca_wait_probe.c - how long does a busy-polling process take to see an
 * 8-byte TCP message, by the way it waits?  (issue 28: "am_lat, tag_lat
 * and NetPIPE latency at 8 B: <= 0.9x UCX tcp"; hca and UCX's tcp both
 * poll with epoll_wait(0) and then recv, so they cannot differ there)
 *
 * An 8-byte ping-pong over one TCP connection (TCP_NODELAY), both ends
 * waiting the same way:
 *   epoll  epoll_wait(timeout 0) until the socket is ready, then recv: what
 *          hca's tcp fabric and UCX's tcp do;
 *   recv   recv(MSG_DONTWAIT) until it returns the bytes: one socket only;
 *   uring  io_uring: the reply's SEND and the next RECV go in one
 *          io_uring_enter, then the completion ring is read in user
 *          memory until the RECV completes (no system call while waiting:
 *          the kernel does the recv when the data comes and posts it, in
 *          task work it interrupts the poller for);
 *   uring-flag  the same with IORING_SETUP_COOP_TASKRUN | TASKRUN_FLAG:
 *          the kernel only sets a flag in the SQ ring when data came, and
 *          the poller enters it once (io_uring_get_events) to take it.
 * Prints the one-way latency (round trip / 2): median, mean, 99th
 * percentile, and the system calls per round trip of the client.
 *
 *   hca_wait_probe -l MODE [-p PORT]               the echoing end
 *   hca_wait_probe -c ADDR MODE [-p PORT] [-n N]   the measuring end
 *
 * Build (not built by make; liburing from Debian: apt install
 * liburing-dev):
 *   gcc -O2 -o hca_wait_probe contrib/bench/hca_wait_probe.c -luring
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { MODE_EPOLL, MODE_RECV, MODE_URING, MODE_URING_FLAG };

typedef struct waiter {
    int             mode;
    int             fd;
    int             ep;
    struct io_uring ring;
    uint64_t        syscalls;
} waiter_t;

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int mode_of(const char *s)
{
    if (strcmp(s, "epoll") == 0) {
        return MODE_EPOLL;
    }
    if (strcmp(s, "recv") == 0) {
        return MODE_RECV;
    }
    if (strcmp(s, "uring") == 0) {
        return MODE_URING;
    }
    if (strcmp(s, "uring-flag") == 0) {
        return MODE_URING_FLAG;
    }
    fprintf(stderr, "mode: epoll, recv, uring or uring-flag\n");
    exit(2);
}

static void waiter_init(waiter_t *w, int mode, int fd)
{
    int one = 1;

    memset(w, 0, sizeof(*w));
    w->mode = mode;
    w->fd   = fd;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
        die("TCP_NODELAY");
    }
    if (mode == MODE_EPOLL) {
        struct epoll_event ev = {.events = EPOLLIN};
        w->ep = epoll_create1(0);
        if ((w->ep < 0) || (epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev) != 0)) {
            die("epoll");
        }
    } else {
        /* uring-flag: the kernel runs the RECV only when we enter it,
         * and says in the SQ ring's flags when to */
        unsigned flags = (mode == MODE_URING_FLAG) ?
                         (IORING_SETUP_COOP_TASKRUN |
                          IORING_SETUP_TASKRUN_FLAG) : 0;
        int rc = io_uring_queue_init(8, &w->ring, flags);
        if (rc != 0) {
            errno = -rc;
            die("io_uring_queue_init");
        }
    }
}

/* epoll and recv: send the 8 bytes out */
static void plain_send(waiter_t *w, const uint64_t *msg)
{
    w->syscalls++;
    if (send(w->fd, msg, sizeof(*msg), MSG_NOSIGNAL) != sizeof(*msg)) {
        die("send");
    }
}

/* epoll and recv: wait for the 8 bytes, busy */
static void plain_wait(waiter_t *w, uint64_t *msg)
{
    size_t got = 0;

    while (got < sizeof(*msg)) {
        ssize_t n;
        if (w->mode == MODE_EPOLL) {
            struct epoll_event ev;
            w->syscalls++;
            if (epoll_wait(w->ep, &ev, 1, 0) <= 0) {
                continue;
            }
        }
        w->syscalls++;
        n = recv(w->fd, (char*)msg + got, sizeof(*msg) - got, MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
        } else if ((n == 0) || ((errno != EAGAIN) && (errno != EINTR))) {
            die("recv");
        }
    }
}

/* uring: queue a RECV into msg (tag 2), and a SEND of out first (tag 1),
 * in one system call */
static void uring_post(waiter_t *w, const uint64_t *out, uint64_t *in)
{
    struct io_uring_sqe *sqe;

    if (out != NULL) {
        sqe = io_uring_get_sqe(&w->ring);
        io_uring_prep_send(sqe, w->fd, out, sizeof(*out), MSG_NOSIGNAL);
        io_uring_sqe_set_data64(sqe, 1);
    }
    sqe = io_uring_get_sqe(&w->ring);
    io_uring_prep_recv(sqe, w->fd, in, sizeof(*in), MSG_WAITALL);
    io_uring_sqe_set_data64(sqe, 2);
    w->syscalls++;
    if (io_uring_submit(&w->ring) < 1) {
        die("io_uring_submit");
    }
}

/* uring: read the completion ring until the RECV is done */
static void uring_wait(waiter_t *w)
{
    for (;;) {
        struct io_uring_cqe *cqe;
        uint64_t tag;
        int res;
        if (io_uring_peek_cqe(&w->ring, &cqe) != 0) {
            if ((w->mode == MODE_URING_FLAG) &&
                (IO_URING_READ_ONCE(*w->ring.sq.kflags) & IORING_SQ_TASKRUN)) {
                w->syscalls++;
                io_uring_get_events(&w->ring);
            }
            continue;
        }
        tag = io_uring_cqe_get_data64(cqe);
        res = cqe->res;
        io_uring_cqe_seen(&w->ring, cqe);
        if (res < 0) {
            errno = -res;
            die(tag == 1 ? "uring send" : "uring recv");
        }
        if (tag == 2) {
            if (res != 8) {
                fprintf(stderr, "uring recv: %d bytes\n", res);
                exit(1);
            }
            return;
        }
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
    return (x > y) - (x < y);
}

static void serve(waiter_t *w)
{
    uint64_t msg = 0;

    if (w->mode >= MODE_URING) {
        uring_post(w, NULL, &msg);
        for (;;) {
            uint64_t out;
            uring_wait(w);
            if (msg == UINT64_MAX) {
                return;
            }
            out = msg;
            uring_post(w, &out, &msg);
        }
    }
    for (;;) {
        plain_wait(w, &msg);
        if (msg == UINT64_MAX) {
            return;
        }
        plain_send(w, &msg);
    }
}

static void measure(waiter_t *w, long n)
{
    const long warm = 2000;
    uint64_t *rtt   = malloc(sizeof(*rtt) * (size_t)n);
    uint64_t out, in = 0, sys0 = 0, sum = 0;

    if (rtt == NULL) {
        die("malloc");
    }
    for (long i = -warm; i < n; ++i) {
        uint64_t t0;
        if (i == 0) {
            sys0 = w->syscalls;
        }
        out = (uint64_t)(i + warm); /* never UINT64_MAX, the end */
        t0  = now_ns();
        if (w->mode >= MODE_URING) {
            uring_post(w, &out, &in);
            uring_wait(w);
        } else {
            plain_send(w, &out);
            plain_wait(w, &in);
        }
        if (in != out) {
            fprintf(stderr, "echo %llu for %llu\n", (unsigned long long)in,
                    (unsigned long long)out);
            exit(1);
        }
        if (i >= 0) {
            rtt[i] = now_ns() - t0;
            sum   += rtt[i];
        }
    }
    out = UINT64_MAX;
    if (w->mode >= MODE_URING) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
        io_uring_prep_send(sqe, w->fd, &out, sizeof(out), MSG_NOSIGNAL);
        io_uring_submit_and_wait(&w->ring, 1);
    } else {
        plain_send(w, &out);
    }
    qsort(rtt, (size_t)n, sizeof(*rtt), cmp_u64);
    printf("%s: one-way median %.3f us, mean %.3f us, p99 %.3f us; "
           "%.2f system calls per round trip (client)\n",
           w->mode == MODE_EPOLL ? "epoll" : w->mode == MODE_RECV ? "recv" :
           w->mode == MODE_URING ? "uring" : "uring-flag",
           rtt[n / 2] / 2000.0, (double)sum / n / 2000.0,
           rtt[n * 99 / 100] / 2000.0,
           (double)(w->syscalls - sys0) / (double)n);
    free(rtt);
}

int main(int argc, char **argv)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(23300)};
    const char *addr = NULL;
    long n           = 100000;
    int listen_mode = 0, opt, fd, one = 1;
    waiter_t w;

    while ((opt = getopt(argc, argv, "lc:p:n:")) != -1) {
        switch (opt) {
        case 'l': listen_mode = 1; break;
        case 'c': addr = optarg; break;
        case 'p': sa.sin_port = htons((uint16_t)atoi(optarg)); break;
        case 'n': n = atol(optarg); break;
        default:  return 2;
        }
    }
    if ((optind >= argc) || (listen_mode == (addr != NULL)) || (n < 100)) {
        fprintf(stderr, "usage: %s -l MODE [-p PORT] | -c ADDR MODE "
                        "[-p PORT] [-n N]\n", argv[0]);
        return 2;
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        die("socket");
    }
    if (listen_mode) {
        int lfd = fd;
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if ((bind(lfd, (struct sockaddr*)&sa, sizeof(sa)) != 0) ||
            (listen(lfd, 1) != 0)) {
            die("listen");
        }
        fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            die("accept");
        }
        close(lfd);
        waiter_init(&w, mode_of(argv[optind]), fd);
        serve(&w);
        return 0;
    }
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        die("address");
    }
    for (int tries = 0; connect(fd, (struct sockaddr*)&sa, sizeof(sa)) != 0;
         ++tries) {
        if (tries > 100) {
            die("connect");
        }
        usleep(20000);
    }
    waiter_init(&w, mode_of(argv[optind]), fd);
    measure(&w, n);
    return 0;
}
