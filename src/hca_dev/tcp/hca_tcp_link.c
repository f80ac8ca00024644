/*
 * hca_tcp_link.c - our interfaces' links going down and up, seen through
 * a netlink socket of the fabric's thread: a path whose interface goes
 * down drops its connections at once, so that their QPs fail over
 * (hca_tcp_path.c) without waiting for the silence limit, and a path that
 * is up again dials its lost connections at once.
 */
#include "hca_tcp_fabric.h"
#include "hca_log.h"

#include <errno.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int hca_tcp_links_watch(void)
{
    struct sockaddr_nl sa;
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    NETLINK_ROUTE);

    if (fd < 0) {
        return -1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.nl_family = AF_NETLINK;
    sa.nl_groups = RTMGRP_LINK;
    if (bind(fd, (struct sockaddr*)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Path p's interface went down (its connections are dropped: their QPs
 * fail over) or came up (its lost connections dial again now). */
static void hca_tcp_path_link(hca_tcp_dev_t *tcp, int p, int up)
{
    hca_tcp_path_t *path = &tcp->paths[p];

    if (up == !atomic_load(&path->down)) {
        return; /* no change */
    }
    atomic_store(&path->down, !up);
    hca_log("tcp fabric: path %d (%s) %s", p, path->ifname,
            up ? "is up again" : "is down: its QPs fail over");
    pthread_mutex_lock(&tcp->lock);
    for (hca_tcp_conn_t *c = tcp->conns; c != NULL; c = c->next) {
        int state = atomic_load(&c->state);
        if ((c->path != p) || (state == HCA_TCP_CONN_DEAD)) {
            continue;
        }
        if (!up && (state != HCA_TCP_CONN_LINKING)) {
            hca_tcp_conn_drop(tcp, c);
        } else if (up && (state == HCA_TCP_CONN_LINKING) && c->outbound) {
            c->redial_ms = 1; /* now, and not held back for its siblings */
            c->redial_ns = 0;
        }
    }
    atomic_store(&tcp->linking, 1);
    pthread_mutex_unlock(&tcp->lock);
}

void hca_tcp_links_changed(hca_tcp_dev_t *tcp)
{
    union {
        struct nlmsghdr nh;
        char            bytes[8192];
    } buf;

    for (;;) {
        ssize_t n = recv(tcp->nl_fd, &buf, sizeof(buf), 0);
        struct nlmsghdr *nh;

        if (n < 0) {
            if (errno == ENOBUFS) {
                /* events were lost: ask each path's interface */
                for (int p = 0; p < tcp->n_paths; ++p) {
                    hca_tcp_path_link(tcp, p,
                                      hca_tcp_netif_up(&tcp->paths[p]));
                }
                continue;
            }
            return; /* EAGAIN: all read */
        }
        for (nh = &buf.nh; NLMSG_OK(nh, (size_t)n); nh = NLMSG_NEXT(nh, n)) {
            const struct ifinfomsg *ifi;
            int up;
            if (((nh->nlmsg_type != RTM_NEWLINK) &&
                 (nh->nlmsg_type != RTM_DELLINK)) ||
                (nh->nlmsg_len < NLMSG_LENGTH(sizeof(*ifi)))) {
                continue;
            }
            ifi = NLMSG_DATA(nh);
            up  = (nh->nlmsg_type == RTM_NEWLINK) &&
                  (ifi->ifi_flags & IFF_UP) && (ifi->ifi_flags & IFF_RUNNING);
            for (int p = 0; p < tcp->n_paths; ++p) {
                if (tcp->paths[p].ifindex == (unsigned)ifi->ifi_index) {
                    hca_tcp_path_link(tcp, p, up);
                }
            }
        }
    }
}
