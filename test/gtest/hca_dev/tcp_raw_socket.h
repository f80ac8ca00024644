/*
 * tcp_raw_socket.h - the socket of a raw TCP client of a device context's
 * tcp listener, for the tests that play an attacker or a misbehaving peer
 * (test_tcp.cc, test_tcp_liveness.cc): connect, and send or receive
 * exactly so many bytes, every wait bounded.  What the client says is
 * theirs (tcp_forge.h encodes it).
 */
#ifndef HCAT_TCP_RAW_SOCKET_H
#define HCAT_TCP_RAW_SOCKET_H

#include "test_common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace hcat {

class tcp_raw_socket {
public:
    int fd = -1;
    const char *from = nullptr; /* the IPv4 address to connect from (NULL:
                                   the kernel's choice): another address of
                                   127.0.0.0/8 is another source host */

    tcp_raw_socket() = default;
    tcp_raw_socket(const tcp_raw_socket&) = delete;
    tcp_raw_socket &operator=(const tcp_raw_socket&) = delete;

    ~tcp_raw_socket()
    {
        close_fd();
    }

    void close_fd()
    {
        if (fd >= 0) {
            ::close(fd);
            fd = -1;
        }
    }

    /* Starts connecting to the listener of the context at a. */
    ::testing::AssertionResult start_connect(const hca_port_addr_t &a)
    {
        struct sockaddr_storage ss;
        socklen_t len;

        memset(&ss, 0, sizeof(ss));
        if (a.net.family == HCA_NET_IPV4) {
            auto *sin = (struct sockaddr_in*)&ss;
            sin->sin_family = AF_INET;
            sin->sin_port   = htons(a.net.port);
            memcpy(&sin->sin_addr, a.net.addr, 4);
            len = sizeof(*sin);
        } else if (a.net.family == HCA_NET_IPV6) {
            auto *sin6 = (struct sockaddr_in6*)&ss;
            sin6->sin6_family = AF_INET6;
            sin6->sin6_port   = htons(a.net.port);
            memcpy(&sin6->sin6_addr, a.net.addr, 16);
            len = sizeof(*sin6);
        } else {
            return ::testing::AssertionFailure() << "the context has no "
                                                    "tcp listener";
        }
        fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    0);
        if (fd < 0) {
            return ::testing::AssertionFailure() << "socket: "
                                                 << strerror(errno);
        }
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if ((from != nullptr) && (ss.ss_family == AF_INET)) {
            struct sockaddr_in src;
            memset(&src, 0, sizeof(src));
            src.sin_family = AF_INET;
            if ((inet_pton(AF_INET, from, &src.sin_addr) != 1) ||
                (bind(fd, (struct sockaddr*)&src, sizeof(src)) != 0)) {
                return ::testing::AssertionFailure() << "bind to " << from
                                                     << ": "
                                                     << strerror(errno);
            }
        }
        if ((connect(fd, (struct sockaddr*)&ss, len) != 0) &&
            (errno != EINPROGRESS)) {
            return ::testing::AssertionFailure() << "connect: "
                                                 << strerror(errno);
        }
        return ::testing::AssertionSuccess();
    }

    /* Connects to the listener of the context at a (bounded). */
    ::testing::AssertionResult connect_to(const hca_port_addr_t &a)
    {
        auto r = start_connect(a);
        if (!r) {
            return r;
        }
        struct pollfd pfd = {fd, POLLOUT, 0};
        int err           = 0;
        socklen_t elen    = sizeof(err);
        if ((poll(&pfd, 1, TIMEOUT_MS) != 1) ||
            (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) ||
            (err != 0)) {
            return ::testing::AssertionFailure() << "connect did not "
                                                    "complete: "
                                                 << strerror(err);
        }
        return ::testing::AssertionSuccess();
    }

    /* All of p, bounded; false if the other side closed or it timed out
     * (a context that refuses a frame may close while we send). */
    bool send_all(const void *p, size_t len, int timeout_ms = TIMEOUT_MS)
    {
        const uint8_t *b = (const uint8_t*)p;
        double end       = now_ms() + timeout_ms;

        while (len > 0) {
            ssize_t n = send(fd, b, len, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                b   += n;
                len -= (size_t)n;
                continue;
            }
            if ((n < 0) && (errno != EAGAIN) && (errno != EINTR)) {
                return false;
            }
            int left = (int)(end - now_ms());
            if (left <= 0) {
                return false;
            }
            struct pollfd pfd = {fd, POLLOUT, 0};
            (void)poll(&pfd, 1, left);
        }
        return true;
    }

    /* Exactly len bytes: 1, 0 if the connection closed (EOF or reset),
     * -1 after timeout_ms. */
    int recv_exact(void *p, size_t len, int timeout_ms)
    {
        uint8_t *b = (uint8_t*)p;
        double end = now_ms() + timeout_ms;

        while (len > 0) {
            ssize_t n = recv(fd, b, len, MSG_DONTWAIT);
            if (n > 0) {
                b   += n;
                len -= (size_t)n;
                continue;
            }
            if (n == 0) {
                return 0;
            }
            if ((errno != EAGAIN) && (errno != EINTR)) {
                return 0; /* reset: closed with our bytes unread */
            }
            int left = (int)(end - now_ms());
            if (left <= 0) {
                return -1;
            }
            struct pollfd pfd = {fd, POLLIN, 0};
            (void)poll(&pfd, 1, left);
        }
        return 1;
    }
};

} /* namespace hcat */

#endif
