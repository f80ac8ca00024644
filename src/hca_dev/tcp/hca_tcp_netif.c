/*
 * hca_tcp_netif.c - the interfaces and addresses of a context's tcp
 * paths: the setting names interfaces or addresses (comma separated), and
 * each usable one is a path with its own listener (UCX's tcp makes each
 * an iface, a rail; here they are paths of one context, which a QP fails
 * over between).  Without a setting, one path: the first interface that
 * is up, not loopback and has an address (IPv4 before IPv6), else
 * loopback.
 */
#include "hca_tcp_fabric.h"
#include "hca_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

int hca_tcp_sockaddr(const hca_net_addr_t *addr, void *sa, uint32_t *len)
{
    if (addr->family == HCA_NET_IPV4) {
        struct sockaddr_in *in = sa;
        memset(in, 0, sizeof(*in));
        in->sin_family = AF_INET;
        in->sin_port   = htons(addr->port);
        memcpy(&in->sin_addr, addr->addr, 4);
        *len = sizeof(*in);
        return 0;
    }
    if (addr->family == HCA_NET_IPV6) {
        struct sockaddr_in6 *in6 = sa;
        memset(in6, 0, sizeof(*in6));
        in6->sin6_family = AF_INET6;
        in6->sin6_port   = htons(addr->port);
        memcpy(&in6->sin6_addr, addr->addr, 16);
        *len = sizeof(*in6);
        return 0;
    }
    return -EAFNOSUPPORT;
}

/* ifa as an address of ours (IPv4/IPv6, not link-local IPv6: a scope id
 * would have to travel with it). */
static int hca_netif_addr(const struct ifaddrs *ifa, hca_net_addr_t *addr)
{
    memset(addr, 0, sizeof(*addr));
    if ((ifa->ifa_addr == NULL) || !(ifa->ifa_flags & IFF_UP)) {
        return 0;
    }
    if (ifa->ifa_addr->sa_family == AF_INET) {
        addr->family = HCA_NET_IPV4;
        memcpy(addr->addr, &((struct sockaddr_in*)ifa->ifa_addr)->sin_addr, 4);
        return 1;
    }
    if (ifa->ifa_addr->sa_family == AF_INET6) {
        const struct in6_addr *a6 =
                &((struct sockaddr_in6*)ifa->ifa_addr)->sin6_addr;
        if (IN6_IS_ADDR_LINKLOCAL(a6)) {
            return 0;
        }
        addr->family = HCA_NET_IPV6;
        memcpy(addr->addr, a6, 16);
        return 1;
    }
    return 0;
}

/* The token names this interface, or is this address. */
static int hca_netif_match(const char *token, const struct ifaddrs *ifa,
                           const hca_net_addr_t *addr)
{
    uint8_t want[16];

    if (strcmp(token, ifa->ifa_name) == 0) {
        return 1;
    }
    if ((addr->family == HCA_NET_IPV4) &&
        (inet_pton(AF_INET, token, want) == 1)) {
        return memcmp(want, addr->addr, 4) == 0;
    }
    if ((addr->family == HCA_NET_IPV6) &&
        (inet_pton(AF_INET6, token, want) == 1)) {
        return memcmp(want, addr->addr, 16) == 0;
    }
    return 0;
}

/* The first address of the list that passes: family first (IPv4, then
 * IPv6), then the list's order. */
static int hca_netif_first(struct ifaddrs *list, const char *token,
                           int loopback, hca_net_addr_t *addr, char *ifname,
                           size_t ifname_len)
{
    static const uint8_t families[] = {HCA_NET_IPV4, HCA_NET_IPV6};

    for (size_t f = 0; f < sizeof(families); ++f) {
        for (struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
            hca_net_addr_t a;
            if (!hca_netif_addr(ifa, &a) || (a.family != families[f])) {
                continue;
            }
            if ((token != NULL) ? !hca_netif_match(token, ifa, &a) :
                (((ifa->ifa_flags & IFF_LOOPBACK) != 0) != loopback)) {
                continue;
            }
            *addr = a;
            snprintf(ifname, ifname_len, "%s", ifa->ifa_name);
            return 1;
        }
    }
    return 0;
}

/* A loopback address not configured on an interface (127.0.0.2): the
 * kernel takes all of 127.0.0.0/8 as ours, on the loopback interface, so
 * two paths can be had on one host. */
static int hca_netif_loopback(struct ifaddrs *list, const char *token,
                              hca_tcp_path_t *path)
{
    uint8_t a[4];

    if ((inet_pton(AF_INET, token, a) != 1) || (a[0] != 127)) {
        return 0;
    }
    for (struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
        if ((ifa->ifa_flags & IFF_LOOPBACK) && (ifa->ifa_flags & IFF_UP)) {
            memset(&path->addr, 0, sizeof(path->addr));
            path->addr.family = HCA_NET_IPV4;
            memcpy(path->addr.addr, a, 4);
            snprintf(path->ifname, sizeof(path->ifname), "%s", ifa->ifa_name);
            return 1;
        }
    }
    return 0;
}

/* The path is one we have already (two names of one address). */
static int hca_netif_known(const hca_tcp_path_t *paths, int n,
                           const hca_net_addr_t *addr)
{
    for (int i = 0; i < n; ++i) {
        if ((paths[i].addr.family == addr->family) &&
            !memcmp(paths[i].addr.addr, addr->addr, sizeof(addr->addr))) {
            return 1;
        }
    }
    return 0;
}

int hca_tcp_netif_pick(const char *setting, hca_tcp_path_t *paths, int max)
{
    struct ifaddrs *list;
    char buf[256], *save = NULL, *token;
    int n = 0;

    if (getifaddrs(&list) != 0) {
        return -errno;
    }
    memset(paths, 0, sizeof(*paths) * (size_t)max);
    if ((setting != NULL) && (*setting != '\0') && strcmp(setting, "all")) {
        snprintf(buf, sizeof(buf), "%s", setting);
        for (token = strtok_r(buf, ",", &save); token != NULL;
             token = strtok_r(NULL, ",", &save)) {
            hca_tcp_path_t *p = &paths[n];
            if (!hca_netif_first(list, token, 0, &p->addr, p->ifname,
                                 sizeof(p->ifname)) &&
                !hca_netif_loopback(list, token, p)) {
                hca_log("tcp fabric: '%s' of '%s' is not up with an "
                        "address: no path on it", token, setting);
                memset(p, 0, sizeof(*p));
                continue;
            }
            if (hca_netif_known(paths, n, &p->addr)) {
                memset(p, 0, sizeof(*p));
                continue;
            }
            if (++n == max) {
                if (strtok_r(NULL, ",", &save) != NULL) {
                    hca_log("tcp fabric: '%s' names more than %d paths: "
                            "the first %d are used", setting, max, max);
                }
                break;
            }
        }
        if (n == 0) {
            hca_log("tcp fabric: no interface or address of '%s' is up "
                    "with an address", setting);
        }
    } else {
        /* one path: the first interface that is up, loopback last */
        n = hca_netif_first(list, NULL, 0, &paths[0].addr, paths[0].ifname,
                            sizeof(paths[0].ifname)) ||
            hca_netif_first(list, NULL, 1, &paths[0].addr, paths[0].ifname,
                            sizeof(paths[0].ifname));
    }
    freeifaddrs(list);
    for (int i = 0; i < n; ++i) {
        paths[i].ifindex   = if_nametoindex(paths[i].ifname);
        paths[i].listen_fd = -1;
    }
    return (n > 0) ? n : -ENODEV;
}

int hca_tcp_netif_up(const hca_tcp_path_t *path)
{
    struct ifreq ifr;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int up = 0;

    if (fd < 0) {
        return 1; /* cannot tell: taken as up */
    }
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%.*s",
             (int)sizeof(ifr.ifr_name) - 1, path->ifname);
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
        up = (ifr.ifr_flags & IFF_UP) && (ifr.ifr_flags & IFF_RUNNING);
    }
    close(fd);
    return up;
}

/* Binds the path's listener to its address, on a port of [port_min,
 * port_max] or (0) an ephemeral one. */
int hca_tcp_listen(hca_tcp_path_t *path, uint16_t port_min, uint16_t port_max)
{
    struct sockaddr_storage ss;
    uint32_t len;
    uint16_t port = port_min;
    int fd, rc, one = 1;

    /* a port is ours once listen() succeeds: with SO_REUSEADDR two
     * processes may both bind one port and only the first listens (two
     * ranks of a host starting together on a port range), so the next
     * port is tried after either call fails with EADDRINUSE */
    for (;;) {
        fd = socket((path->addr.family == HCA_NET_IPV6) ? AF_INET6 : AF_INET,
                    SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            return -errno;
        }
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        path->addr.port = port;
        hca_tcp_sockaddr(&path->addr, &ss, &len);
        if ((bind(fd, (struct sockaddr*)&ss, len) == 0) &&
            (listen(fd, 128) == 0)) {
            break;
        }
        rc = -errno;
        close(fd);
        if ((rc != -EADDRINUSE) || (port == 0) || (port >= port_max)) {
            return rc;
        }
        ++port;
    }
    len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr*)&ss, &len) != 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    path->addr.port = ntohs((ss.ss_family == AF_INET6) ?
                           ((struct sockaddr_in6*)&ss)->sin6_port :
                           ((struct sockaddr_in*)&ss)->sin_port);
    path->listen_fd = fd;
    return 0;
}
