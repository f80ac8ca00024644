/*
 * hca_zerocopy_probe.c - does MSG_ZEROCOPY pay on this link?  (issue 28:
 * "use MSG_ZEROCOPY above a measured threshold where the kernel gives it;
 * on veth and loopback it falls back: measure it, and say what happens")
 *
 * One TCP stream, a sender and a receiver; the sender sends `bytes` in
 * messages of `size`, once with plain send() and once with MSG_ZEROCOPY
 * (SO_ZEROCOPY), interleaved `reps` times.  For each it prints the rate,
 * the sender's CPU seconds per GB (user + sys, getrusage) and, for
 * MSG_ZEROCOPY, how many of the kernel's completion notices said it copied
 * after all (SO_EE_CODE_ZEROCOPY_COPIED: the route's device cannot send
 * from user pages - loopback and veth deliver locally, so their skbs are
 * copied when they reach the receiving socket).
 *
 *   hca_zerocopy_probe                      both ends here, over 127.0.0.1
 *   hca_zerocopy_probe -l [-p PORT]         the receiver (another namespace)
 *   hca_zerocopy_probe -c ADDR [-p PORT]    the sender, to that receiver
 *   options: -s size (default 1 MiB), -b bytes per run (2 GiB), -r reps (3)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
           ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* The receiver: reads each connection to its end, into one buffer. */
static void receive_all(int lfd, int conns)
{
    static char buf[1 << 20];

    for (int i = 0; i < conns; ++i) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            die("accept");
        }
        while (read(fd, buf, sizeof(buf)) > 0) {
        }
        close(fd);
    }
}

struct zc_count {
    uint64_t notices;   /* ranges of sends the kernel let go */
    uint64_t sends;     /* ... how many sends they covered */
    uint64_t copied;    /* ... of those, sends it copied after all */
};

/* Takes the completion notices queued on the socket's error queue. */
static void zc_reap(int fd, struct zc_count *c, int block)
{
    for (;;) {
        char ctrl[128];
        struct msghdr msg = {.msg_control = ctrl,
                             .msg_controllen = sizeof(ctrl)};
        struct cmsghdr *cm;

        if (block) {
            struct pollfd p = {.fd = fd, .events = 0};
            (void)poll(&p, 1, 100);
        }
        if (recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
            return;
        }
        for (cm = CMSG_FIRSTHDR(&msg); cm != NULL;
             cm = CMSG_NXTHDR(&msg, cm)) {
            struct sock_extended_err *ee = (void*)CMSG_DATA(cm);
            uint64_t n;
            if ((ee->ee_errno != 0) ||
                (ee->ee_origin != SO_EE_ORIGIN_ZEROCOPY)) {
                continue;
            }
            n = (uint64_t)(ee->ee_data - ee->ee_info) + 1;
            c->notices++;
            c->sends += n;
            if (ee->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) {
                c->copied += n;
            }
        }
        block = 0;
    }
}

/* One run: `bytes` in messages of `size`; prints its line. */
static void send_run(const struct sockaddr_in *to, int zc, size_t size,
                     uint64_t bytes, char *buf)
{
    struct zc_count c = {0, 0, 0};
    uint64_t sent = 0, nsend = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    double t0, c0, t, cpu;

    if (fd < 0) {
        die("socket");
    }
    if (connect(fd, (const struct sockaddr*)to, sizeof(*to)) != 0) {
        die("connect");
    }
    if (zc && (setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one,
                          sizeof(one)) != 0)) {
        die("setsockopt(SO_ZEROCOPY)");
    }
    t0 = now_s();
    c0 = cpu_s();
    while (sent < bytes) {
        ssize_t n = send(fd, buf, size, zc ? MSG_ZEROCOPY : 0);
        if (n < 0) {
            if ((errno == ENOBUFS) && zc) {
                zc_reap(fd, &c, 1); /* too many pages pinned: wait */
                continue;
            }
            die("send");
        }
        sent += (uint64_t)n;
        nsend++;
        if (zc) {
            zc_reap(fd, &c, 0);
        }
    }
    /* every notice, before the buffer could be reused */
    while (zc && (c.sends < nsend)) {
        zc_reap(fd, &c, 1);
    }
    shutdown(fd, SHUT_WR);
    t   = now_s() - t0;
    cpu = cpu_s() - c0;
    close(fd);
    printf("%-12s size %8zu  %6.2f GB/s  sender CPU %.3f s/GB", zc ?
           "MSG_ZEROCOPY" : "send", size, sent / t / 1e9, cpu / (sent / 1e9));
    if (zc) {
        printf("  notices %llu for %llu sends, copied %llu (%.0f %%)",
               (unsigned long long)c.notices, (unsigned long long)c.sends,
               (unsigned long long)c.copied,
               c.sends ? 100.0 * c.copied / c.sends : 0.0);
    }
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    size_t size = 1 << 20;
    uint64_t bytes = 2ull << 30;
    int reps = 3, listen_only = 0, port = 0, opt, lfd = -1;
    const char *peer = NULL;
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    pid_t child = -1;
    char *buf;

    while ((opt = getopt(argc, argv, "lc:p:s:b:r:")) != -1) {
        switch (opt) {
        case 'l': listen_only = 1; break;
        case 'c': peer = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 's': size = strtoull(optarg, NULL, 0); break;
        case 'b': bytes = strtoull(optarg, NULL, 0); break;
        case 'r': reps = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s [-l | -c ADDR] [-p PORT] [-s SIZE] "
                    "[-b BYTES] [-r REPS]\n", argv[0]);
            return 2;
        }
    }
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port   = htons((uint16_t)port);
    if (peer == NULL) {
        int one = 1;
        sa.sin_addr.s_addr = htonl(listen_only ? INADDR_ANY :
                                                 INADDR_LOOPBACK);
        lfd = socket(AF_INET, SOCK_STREAM, 0);
        if ((lfd < 0) ||
            (setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) ||
            (bind(lfd, (struct sockaddr*)&sa, sizeof(sa)) != 0) ||
            (listen(lfd, 4) != 0) ||
            (getsockname(lfd, (struct sockaddr*)&sa, &len) != 0)) {
            die("listen");
        }
        if (listen_only) {
            printf("listening on port %d\n", ntohs(sa.sin_port));
            fflush(stdout);
            receive_all(lfd, 2 * reps);
            return 0;
        }
        child = fork();
        if (child == 0) {
            receive_all(lfd, 2 * reps);
            _exit(0);
        }
        close(lfd);
    } else if (inet_pton(AF_INET, peer, &sa.sin_addr) != 1) {
        fprintf(stderr, "%s: not an IPv4 address\n", peer);
        return 2;
    }
    if (posix_memalign((void**)&buf, 4096, size) != 0) {
        die("posix_memalign");
    }
    memset(buf, 0x5a, size);
    for (int r = 0; r < reps; ++r) {
        send_run(&sa, 0, size, bytes, buf);
        send_run(&sa, 1, size, bytes, buf);
    }
    if (child > 0) {
        waitpid(child, NULL, 0);
    }
    free(buf);
    return 0;
}
