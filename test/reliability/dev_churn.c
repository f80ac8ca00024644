/*
 * dev_churn.c - many short-lived QPs against one long-lived target.
 *
 * usage: dev_churn N sc|nsc
 *
 * The requester (this process) forks a target and then, N times: creates
 * a QP, has the target create and connect its side (over a socketpair),
 * runs a fetch-add on the target's plain (non device) memory - executed by
 * the target's service thread - and an RDMA READ of a random size (single
 * copy, or with nsc = HCA_OPEN_NO_SINGLE_COPY on both sides, chunks
 * through the target's service thread), checks the results, and destroys
 * both QPs.  An operation that does not complete within 5 s is "stuck"
 * (its QP is moved to ERR and destroyed anyway).  The target's main thread
 * only serves the control channel: everything on the data path is the
 * library's.  Prints one line:
 *
 *   qps=N ok=K stuck=S errors=E corrupt=C target_maps=A/B requester_maps=A/B
 *
 * (mappings, lines of /proc/PID/maps, after setup / after the last QP) and
 * exits 0 if every operation completed correctly, 1 otherwise.
 */
#include "rel_dev.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

const char *rel_prog = "dev_churn";

#define LEN     (1u << 20)  /* target memory: counter, then a read pattern */
#define PAT_OFF 4096
#define PAT_TAG 0x77
#define OP_MS   5000

enum { CMD_CONNECT = 1, CMD_DESTROY, CMD_QUIT };

typedef struct cmd {
    int             cmd;
    hca_port_addr_t addr;
    uint32_t        qpn;
} cmd_t;

static void target(int fd, unsigned flags)
{
    hca_qp_t *qps[64] = {NULL};
    rel_peer_info_t me;
    hca_mr_t *mr;
    rel_dev_t d;
    uint8_t *mem;
    cmd_t c;
    int rc;

    rel_dev_open(&d, flags);
    mem = aligned_alloc(4096, LEN);
    if (mem == NULL) {
        rel_die("out of memory");
    }
    memset(mem, 0, PAT_OFF);
    rel_fill(mem + PAT_OFF, LEN - PAT_OFF, PAT_TAG, 0);
    if ((rc = hca_mr_reg(d.pd, mem, LEN, REL_ACCESS_ALL, &mr)) != 0) {
        rel_die("target hca_mr_reg: %s", strerror(-rc));
    }
    memset(&me, 0, sizeof(me));
    me.addr   = d.addr;
    me.rkey   = hca_mr_rkey(mr);
    me.raddr  = (uintptr_t)mem;
    me.length = LEN;
    rel_send_all(fd, &me, sizeof(me));
    while (rel_recv_all(fd, &c, sizeof(c)) == 0) {
        if (c.cmd == CMD_CONNECT) {
            hca_qp_t *qp = rel_qp_create(&d);
            uint32_t qpn = hca_qp_num(qp);

            if ((rc = rel_qp_connect(qp, &c.addr, c.qpn)) != 0) {
                rel_die("target connect: %s", strerror(-rc));
            }
            qps[qpn % 64] = qp;
            rel_send_all(fd, &qpn, sizeof(qpn));
        } else if (c.cmd == CMD_DESTROY) {
            hca_qp_destroy(qps[c.qpn % 64]);
            qps[c.qpn % 64] = NULL;
            rel_send_all(fd, &c.qpn, sizeof(c.qpn));
        } else {
            break;
        }
    }
    hca_mr_dereg(mr);
    free(mem);
    rel_dev_close(&d);
    exit(0);
}

/* Drops what a destroyed QP left in the CQ (flushed WRs of a stuck op). */
static void drain_cq(rel_dev_t *d)
{
    hca_wc_t wc[16];

    while (hca_cq_poll(d->cq, 16, wc) > 0) {
    }
}

int main(int argc, char **argv)
{
    uint64_t ok = 0, stuck = 0, errors = 0, corrupt = 0, last = 0;
    int tmaps0, tmaps1, rmaps0, rmaps1, sv[2], n, rc;
    unsigned flags;
    rel_peer_info_t t;
    uint8_t *buf;
    hca_mr_t *mr;
    rel_dev_t d;
    pid_t pid;

    if ((argc != 3) || (strcmp(argv[2], "sc") && strcmp(argv[2], "nsc"))) {
        fprintf(stderr, "usage: dev_churn N sc|nsc\n");
        return 2;
    }
    n     = atoi(argv[1]);
    flags = strcmp(argv[2], "nsc") ? 0 : HCA_OPEN_NO_SINGLE_COPY;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        rel_die("socketpair: %s", strerror(errno));
    }
    pid = fork();
    if (pid < 0) {
        rel_die("fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(sv[0]);
        target(sv[1], flags);
    }
    close(sv[1]);

    rel_dev_open(&d, flags);
    buf = aligned_alloc(4096, LEN);
    if ((buf == NULL) ||
        ((rc = hca_mr_reg(d.pd, buf, LEN, REL_ACCESS_ALL, &mr)) != 0)) {
        rel_die("requester memory");
    }
    if (rel_recv_all(sv[0], &t, sizeof(t)) != 0) {
        rel_die("the target died during setup");
    }
    tmaps0 = rel_map_count(pid);
    rmaps0 = rel_map_count(getpid());

    for (int i = 0; i < n; ++i) {
        hca_qp_t *qp = rel_qp_create(&d);
        cmd_t c      = {.cmd = CMD_CONNECT, .addr = d.addr,
                        .qpn = hca_qp_num(qp)};
        uint64_t h   = rel_hash((uint64_t)i);
        size_t len   = (size_t)8 << (h % 17);           /* 8 B .. 512 KiB */
        size_t off   = ((h >> 8) % ((LEN - PAT_OFF - len) / 8 + 1)) * 8;
        uint32_t tqpn;
        hca_sge_t sge;
        hca_send_wr_t wr;
        int st_add, st_read;

        rel_send_all(sv[0], &c, sizeof(c));
        if (rel_recv_all(sv[0], &tqpn, sizeof(tqpn)) != 0) {
            rel_die("the target died (QP %d)", i);
        }
        if ((rc = rel_qp_connect(qp, &t.addr, tqpn)) != 0) {
            rel_die("connect: %s", strerror(-rc));
        }

        sge = (hca_sge_t){(uintptr_t)buf, 8, hca_mr_lkey(mr)};
        wr  = (hca_send_wr_t){.wr_id = 2 * (uint64_t)i, .sg_list = &sge,
                              .num_sge = 1,
                              .opcode = HCA_WR_ATOMIC_FETCH_ADD,
                              .rdma = {t.raddr, t.rkey}, .compare_add = 1};
        st_add = rel_post_wait(&d, qp, &wr, OP_MS);
        if (st_add == HCA_WC_SUCCESS) {
            uint64_t v;

            memcpy(&v, buf, 8);
            /* only we add, one at a time: the counter moves by one per
             * add that completed (a stuck add may still land later) */
            if ((v < last) || (v > (uint64_t)i)) {
                ++corrupt;
                fprintf(stderr, "dev_churn: QP %d: fetch-add returned %llu "
                        "(previous %llu)\n", i, (unsigned long long)v,
                        (unsigned long long)last);
            }
            last = v + 1;
        }

        memset(buf, 0, len);
        sge = (hca_sge_t){(uintptr_t)buf, (uint32_t)len, hca_mr_lkey(mr)};
        wr  = (hca_send_wr_t){.wr_id = 2 * (uint64_t)i + 1, .sg_list = &sge,
                              .num_sge = 1, .opcode = HCA_WR_RDMA_READ,
                              .rdma = {t.raddr + PAT_OFF + off, t.rkey}};
        st_read = (st_add == HCA_WC_SUCCESS) ?
                  rel_post_wait(&d, qp, &wr, OP_MS) : st_add;
        if ((st_read == HCA_WC_SUCCESS) &&
            (rel_check(buf, len, PAT_TAG, off / 8) != 0)) {
            ++corrupt;
            fprintf(stderr, "dev_churn: QP %d: read of %zu bytes at %zu: "
                    "wrong data\n", i, len, off);
        }

        if ((st_add == -ETIMEDOUT) || (st_read == -ETIMEDOUT)) {
            ++stuck;
            fprintf(stderr, "dev_churn: QP %d: %s did not complete in "
                    "%d ms\n", i, (st_add == -ETIMEDOUT) ? "fetch-add" :
                    "RDMA READ", OP_MS);
        } else if (st_read != HCA_WC_SUCCESS) {
            ++errors;
            fprintf(stderr, "dev_churn: QP %d: %s failed: %d (%s)\n", i,
                    (st_add != HCA_WC_SUCCESS) ? "fetch-add" : "RDMA READ",
                    st_read, (st_read > 0) ?
                    hca_wc_status_str((hca_wc_status_t)st_read) :
                    strerror(-st_read));
        } else {
            ++ok;
        }
        if (hca_qp_state(qp) != HCA_QPS_RTS) {
            /* a stuck or failed WR: ERR flushes it before the destroy */
            hca_qp_attr_t a = {.qp_state = HCA_QPS_ERR};
            hca_qp_modify(qp, &a, HCA_QP_ATTR_STATE);
        }
        hca_qp_destroy(qp);
        drain_cq(&d);
        c.cmd = CMD_DESTROY;
        c.qpn = tqpn;
        rel_send_all(sv[0], &c, sizeof(c));
        if (rel_recv_all(sv[0], &tqpn, sizeof(tqpn)) != 0) {
            rel_die("the target died (QP %d)", i);
        }
    }
    tmaps1 = rel_map_count(pid);
    rmaps1 = rel_map_count(getpid());

    rel_send_all(sv[0], &(cmd_t){.cmd = CMD_QUIT}, sizeof(cmd_t));
    waitpid(pid, NULL, 0);
    hca_mr_dereg(mr);
    free(buf);
    rel_dev_close(&d);
    printf("qps=%d ok=%llu stuck=%llu errors=%llu corrupt=%llu "
           "target_maps=%d/%d requester_maps=%d/%d\n", n,
           (unsigned long long)ok, (unsigned long long)stuck,
           (unsigned long long)errors, (unsigned long long)corrupt, tmaps0,
           tmaps1, rmaps0, rmaps1);
    return (ok == (uint64_t)n) ? 0 : 1;
}
