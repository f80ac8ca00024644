/*
 * rel_dev.h - libhcadev helpers of the device-level campaign programs:
 * an endpoint (device, PD, CQ, QP), connecting it, polling with a
 * deadline, and a control channel (a socketpair to a forked peer).
 */
#ifndef REL_DEV_H
#define REL_DEV_H

#include "rel_common.h"

#include <hca_dev/hca_dev.h>
#include <sched.h>

#define REL_ACCESS_ALL (HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE | \
                        HCA_ACCESS_REMOTE_READ | HCA_ACCESS_REMOTE_ATOMIC)

typedef struct rel_dev {
    hca_device_t   *dev;
    hca_pd_t       *pd;
    hca_cq_t       *cq;
    hca_port_addr_t addr;
} rel_dev_t;

/* What a peer needs to reach a QP and a memory region. */
typedef struct rel_peer_info {
    hca_port_addr_t addr;
    uint32_t        qpn;
    uint32_t        rkey;
    uint64_t        raddr;
    uint64_t        length;
} rel_peer_info_t;

static inline void rel_dev_open(rel_dev_t *d, unsigned flags)
{
    int rc;

    if ((rc = hca_device_open("hca0", flags, &d->dev)) != 0 ||
        (rc = hca_pd_alloc(d->dev, &d->pd)) != 0 ||
        (rc = hca_cq_create(d->dev, 256, &d->cq)) != 0) {
        rel_die("device setup: %s", strerror(-rc));
    }
    hca_port_address(d->dev, &d->addr);
}

static inline void rel_dev_close(rel_dev_t *d)
{
    hca_cq_destroy(d->cq);
    hca_pd_dealloc(d->pd);
    hca_device_close(d->dev);
}

static inline hca_qp_t *rel_qp_create(rel_dev_t *d)
{
    hca_qp_init_attr_t a = {
        .send_cq      = d->cq,
        .recv_cq      = d->cq,
        .max_send_wr  = 16,
        .max_recv_wr  = 16,
        .max_send_sge = 1,
        .max_recv_sge = 1
    };
    hca_qp_t *qp;
    int rc = hca_qp_create(d->pd, &a, &qp);

    if (rc != 0) {
        rel_die("hca_qp_create: %s", strerror(-rc));
    }
    return qp;
}

/* RESET -> INIT -> RTR -> RTS. */
static inline int rel_qp_connect(hca_qp_t *qp, const hca_port_addr_t *dest,
                                 uint32_t dest_qpn)
{
    hca_qp_attr_t a = {.qp_state = HCA_QPS_INIT, .access = REL_ACCESS_ALL};
    int rc = hca_qp_modify(qp, &a, HCA_QP_ATTR_STATE | HCA_QP_ATTR_ACCESS);

    if (rc == 0) {
        a.qp_state    = HCA_QPS_RTR;
        a.dest        = *dest;
        a.dest_qp_num = dest_qpn;
        rc = hca_qp_modify(qp, &a, HCA_QP_ATTR_STATE | HCA_QP_ATTR_DEST);
    }
    if (rc == 0) {
        a.qp_state = HCA_QPS_RTS;
        rc = hca_qp_modify(qp, &a, HCA_QP_ATTR_STATE);
    }
    return rc;
}

/* Posts one signalled WR and waits up to timeout_ms for its completion.
 * Returns its status, or -ETIMEDOUT / a negative post error. */
static inline int rel_post_wait(rel_dev_t *d, hca_qp_t *qp, hca_send_wr_t *wr,
                                int timeout_ms)
{
    uint64_t deadline = rel_mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    hca_send_wr_t *bad;
    hca_wc_t wc;
    int rc, n;

    wr->send_flags |= HCA_SEND_SIGNALED;
    while ((rc = hca_post_send(qp, wr, &bad)) == -EAGAIN) {
        if (rel_mono_ns() > deadline) {
            return -ETIMEDOUT;
        }
        sched_yield();
    }
    if (rc != 0) {
        return rc;
    }
    for (;;) {
        n = hca_cq_poll(d->cq, 1, &wc);
        if (n < 0) {
            return n;
        }
        if ((n == 1) && (wc.wr_id == wr->wr_id)) {
            return (int)wc.status;
        }
        if (rel_mono_ns() > deadline) {
            return -ETIMEDOUT;
        }
        if (n == 0) {
            sched_yield();
        }
    }
}

/* The control channel: whole records or death. */
static inline void rel_send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n <= 0) {
            rel_die("control channel write: %s", strerror(errno));
        }
        p   += n;
        len -= (size_t)n;
    }
}

/* 0, or -1 when the peer closed the channel. */
static inline int rel_recv_all(int fd, void *buf, size_t len)
{
    char *p = buf;

    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n == 0) {
            return -1;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            rel_die("control channel read: %s", strerror(errno));
        }
        p   += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Lines of /proc/PID/maps: the mappings a process holds. */
static inline int rel_map_count(pid_t pid)
{
    char path[64], buf[65536];
    int fd, lines = 0;
    ssize_t n;

    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    fd = open(path, O_RDONLY);
    if (fd < 0) {
        return -1;
    }
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
        for (ssize_t i = 0; i < n; ++i) {
            lines += (buf[i] == '\n');
        }
    }
    close(fd);
    return lines;
}

#endif
