/*
 * hca_tcp_netif.c - the interface and address of a context's tcp
 * listener, as UCX's tcp transport chooses them: the setting names
 * interfaces or addresses (comma separated, the first usable wins);
 * without one, the first interface that is up, not loopback and has an
 * address (IPv4 before IPv6), else loopback; and the listener bound to
 * it.
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

int hca_tcp_netif_pick(const char *setting, hca_net_addr_t *addr,
                       char *ifname, size_t ifname_len)
{
    struct ifaddrs *list;
    char buf[256], *save = NULL, *token;
    int found = 0;

    if (getifaddrs(&list) != 0) {
        return -errno;
    }
    if ((setting != NULL) && (*setting != '\0') && strcmp(setting, "all")) {
        snprintf(buf, sizeof(buf), "%s", setting);
        for (token = strtok_r(buf, ",", &save); (token != NULL) && !found;
             token = strtok_r(NULL, ",", &save)) {
            found = hca_netif_first(list, token, 0, addr, ifname, ifname_len);
        }
        if (!found) {
            hca_log("tcp fabric: no interface or address of '%s' is up "
                    "with an address", setting);
        }
    } else {
        found = hca_netif_first(list, NULL, 0, addr, ifname, ifname_len) ||
                hca_netif_first(list, NULL, 1, addr, ifname, ifname_len);
    }
    freeifaddrs(list);
    return found ? 0 : -ENODEV;
}

/* Binds the listener to the chosen address, on a port of [port_min,
 * port_max] or (0) an ephemeral one. */
int hca_tcp_listen(hca_tcp_dev_t *tcp, uint16_t port_min, uint16_t port_max)
{
    struct sockaddr_storage ss;
    uint32_t len;
    uint16_t port = port_min;
    int fd, rc, one = 1;

    fd = socket((tcp->addr.family == HCA_NET_IPV6) ? AF_INET6 : AF_INET,
                SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    for (;;) {
        tcp->addr.port = port;
        hca_tcp_sockaddr(&tcp->addr, &ss, &len);
        if (bind(fd, (struct sockaddr*)&ss, len) == 0) {
            break;
        }
        rc = -errno;
        if ((rc != -EADDRINUSE) || (port == 0) || (port >= port_max)) {
            close(fd);
            return rc;
        }
        ++port;
    }
    len = sizeof(ss);
    if ((listen(fd, 128) != 0) ||
        (getsockname(fd, (struct sockaddr*)&ss, &len) != 0)) {
        rc = -errno;
        close(fd);
        return rc;
    }
    tcp->addr.port = ntohs((ss.ss_family == AF_INET6) ?
                           ((struct sockaddr_in6*)&ss)->sin6_port :
                           ((struct sockaddr_in*)&ss)->sin_port);
    tcp->listen_fd = fd;
    return 0;
}
