/*
 * hca_notify.c - wakeups: every consumer that can sleep (a CQ, the
 * responder thread) owns an AF_UNIX datagram socket bound to an abstract
 * name of its context, and a producer of this host that finds it armed
 * sends it a byte.  The fast path never gets here: producers signal only
 * consumers that armed (flags in shared memory).
 */
#include "hca_base.h"
#include "hca_wire.h"
#include "hca_obj.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* The abstract socket address of consumer idx (a CQ, or HCA_NOTIFY_SVC)
 * of context (pidns, pid, ctx): with the context's random nonce, so that
 * no other process can bind it first and keep the context from opening
 * (abstract names carry no permissions). */
static socklen_t hca_notify_addr(struct sockaddr_un *sa, uint32_t pidns,
                                 uint32_t pid, uint32_t ctx, uint32_t nonce,
                                 uint32_t idx)
{
    int n;

    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    if (idx == HCA_NOTIFY_SVC) {
        n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1,
                     "hca.%u.%u.%u.%08x.svc", pidns, pid, ctx, nonce);
    } else {
        n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1,
                     "hca.%u.%u.%u.%08x.cq%u", pidns, pid, ctx, nonce, idx);
    }
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* Any thread: wakes consumer idx of context `to` of this host.  A full
 * socket buffer means a wakeup is already pending, so EAGAIN is fine. */
void hca_notify_signal(hca_device_t *dev, const hca_notify_ctx_t *to,
                       uint32_t idx)
{
    struct sockaddr_un sa;
    socklen_t len = hca_notify_addr(&sa, to->pidns, to->pid, to->ctx,
                                    to->nonce, idx);
    char byte     = 1;

    (void)sendto(dev->send_sock, &byte, 1, MSG_DONTWAIT,
                 (struct sockaddr*)&sa, len);
    __atomic_fetch_add(&dev->svc_cnt->wakeups_sent, 1, __ATOMIC_RELAXED);
}

/* Binds a datagram socket to the abstract name of consumer idx. */
int hca_notify_bind(hca_device_t *dev, uint32_t idx, int *fd_p)
{
    struct sockaddr_un sa;
    socklen_t len = hca_notify_addr(&sa, dev->pidns, dev->pid, dev->ctx_id,
                                    dev->name_nonce, idx);
    int fd, rc;

    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        return -errno;
    }
    if (bind(fd, (struct sockaddr*)&sa, len) != 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    *fd_p = fd;
    return 0;
}
