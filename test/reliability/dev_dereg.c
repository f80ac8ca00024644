/*
 * dev_dereg.c - deregister a memory region right after the requester that
 * was copying into and out of it was killed.
 *
 * usage: dev_dereg heap|dm DELAY_MS
 *
 * The target (this process) registers 64 MiB - heap memory, or device
 * memory from hca_dm_alloc - and forks a requester that runs 64 MiB RDMA
 * WRITEs and READs on it back to back (single copy into heap memory, loads
 * and stores through its mapping of device memory).  DELAY_MS after the
 * first one completed, the target kills the requester with SIGKILL, most
 * likely in the middle of a copy, and calls hca_mr_dereg, which must not
 * wait for the dead process.  Prints
 *
 *   dereg start
 *   dereg_ms=T rc=RC
 *
 * and exits 0 once everything is destroyed; the script's timeout catches a
 * dereg that never returns (the line "dereg start" without "dereg_ms").
 */
#include "rel_dev.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

const char *rel_prog = "dev_dereg";

#define LEN (64u << 20)

static void requester(int fd)
{
    rel_peer_info_t t, me;
    hca_mr_t *mr;
    rel_dev_t d;
    hca_qp_t *qp;
    void *buf;
    char go;
    int rc;

    rel_dev_open(&d, 0);
    qp  = rel_qp_create(&d);
    buf = aligned_alloc(4096, LEN);
    if (buf == NULL) {
        rel_die("out of memory");
    }
    memset(buf, 0x5a, LEN);
    if ((rc = hca_mr_reg(d.pd, buf, LEN, REL_ACCESS_ALL, &mr)) != 0) {
        rel_die("requester hca_mr_reg: %s", strerror(-rc));
    }
    memset(&me, 0, sizeof(me));
    me.addr = d.addr;
    me.qpn  = hca_qp_num(qp);
    if (rel_recv_all(fd, &t, sizeof(t)) != 0) {
        exit(2);
    }
    rel_send_all(fd, &me, sizeof(me));
    if ((rc = rel_qp_connect(qp, &t.addr, t.qpn)) != 0) {
        rel_die("requester connect: %s", strerror(-rc));
    }
    if (rel_recv_all(fd, &go, 1) != 0) {
        exit(2);
    }
    for (uint64_t i = 0;; ++i) {
        hca_sge_t sge = {(uintptr_t)buf, LEN, hca_mr_lkey(mr)};
        hca_send_wr_t wr = {
            .wr_id   = i,
            .sg_list = &sge,
            .num_sge = 1,
            .opcode  = (i % 2) ? HCA_WR_RDMA_READ : HCA_WR_RDMA_WRITE,
            .rdma    = {.remote_addr = t.raddr, .rkey = t.rkey}
        };

        rc = rel_post_wait(&d, qp, &wr, 10000);
        if (rc != HCA_WC_SUCCESS) {
            rel_die("requester RDMA #%llu: %d", (unsigned long long)i, rc);
        }
        if (i == 0) {
            rel_send_all(fd, "r", 1);
        }
    }
}

int main(int argc, char **argv)
{
    rel_peer_info_t me, r;
    hca_dm_t *dm = NULL;
    uint64_t t0, t1;
    int sv[2], rc, delay_ms;
    hca_mr_t *mr;
    rel_dev_t d;
    hca_qp_t *qp;
    void *mem;
    pid_t pid;
    char c;

    if ((argc != 3) || (strcmp(argv[1], "heap") && strcmp(argv[1], "dm"))) {
        fprintf(stderr, "usage: dev_dereg heap|dm DELAY_MS\n");
        return 2;
    }
    delay_ms = atoi(argv[2]);
    /* fork before the target opens the device: the child opens its own */
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        rel_die("socketpair: %s", strerror(errno));
    }
    pid = fork();
    if (pid < 0) {
        rel_die("fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(sv[0]);
        requester(sv[1]);
    }
    close(sv[1]);

    rel_dev_open(&d, 0);
    qp = rel_qp_create(&d);
    if (strcmp(argv[1], "dm") == 0) {
        if ((rc = hca_dm_alloc(d.dev, LEN, &dm)) != 0) {
            rel_die("hca_dm_alloc: %s", strerror(-rc));
        }
        mem = hca_dm_addr(dm);
    } else if ((mem = aligned_alloc(4096, LEN)) == NULL) {
        rel_die("out of memory");
    }
    memset(mem, 0, LEN);
    if ((rc = hca_mr_reg(d.pd, mem, LEN, REL_ACCESS_ALL, &mr)) != 0) {
        rel_die("hca_mr_reg: %s", strerror(-rc));
    }
    memset(&me, 0, sizeof(me));
    me.addr   = d.addr;
    me.qpn    = hca_qp_num(qp);
    me.rkey   = hca_mr_rkey(mr);
    me.raddr  = (uintptr_t)mem;
    me.length = LEN;
    rel_send_all(sv[0], &me, sizeof(me));
    if (rel_recv_all(sv[0], &r, sizeof(r)) != 0) {
        rel_die("the requester died during setup");
    }
    if ((rc = rel_qp_connect(qp, &r.addr, r.qpn)) != 0) {
        rel_die("connect: %s", strerror(-rc));
    }
    rel_send_all(sv[0], "g", 1);
    if (rel_recv_all(sv[0], &c, 1) != 0) {
        rel_die("the requester died before its first RDMA completed");
    }
    rel_sleep_us((unsigned)delay_ms * 1000u);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);

    printf("dereg start\n");
    fflush(stdout);
    t0 = rel_mono_ns();
    rc = hca_mr_dereg(mr);
    t1 = rel_mono_ns();
    printf("dereg_ms=%.3f rc=%d\n", (double)(t1 - t0) / 1e6, rc);
    fflush(stdout);

    hca_qp_destroy(qp);
    if (dm != NULL) {
        hca_dm_free(dm);
    } else {
        free(mem);
    }
    rel_dev_close(&d);
    return 0;
}
