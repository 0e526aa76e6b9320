/*
 * sock.c - TCP listen/connect (name resolution included) and blocking
 * full-length send/receive.
 *
 * Design: sockets made here are CLOEXEC and, for TCP, TCP_NODELAY: every
 * frame we send is a complete message, so Nagle only adds latency. errno is
 * converted to a status here, at the syscall boundary.
 *
 * Thread: any; the one global is $KVPOOL_TCP_CONGESTION, read once.
 */
#include "common/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"

static kvp_status_t resolve(const char *host, uint16_t port, int passive, struct addrinfo **res_p)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    if (passive)
        hints.ai_flags = AI_PASSIVE;
    char portstr[8];
    snprintf(portstr, sizeof(portstr), "%u", port);
    int rc = getaddrinfo(host, portstr, &hints, res_p);
    if (rc != 0) {
        KVP_LOG_WARN("cannot resolve %s: %s", host, gai_strerror(rc));
        return KVP_ERR_CONNECT;
    }
    return KVP_OK;
}

kvp_status_t kvp_tcp_listen(const char *host, uint16_t port, int backlog, int *fd_p,
                            uint16_t *bound_port_p)
{
    struct addrinfo *res;
    kvp_status_t status = resolve(host, port, 1, &res);
    if (status != KVP_OK)
        return status;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        status = kvp_status_from_errno(errno);
        goto err_free;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, backlog) != 0) {
        KVP_LOG_ERROR("cannot listen on %s:%u: %m", host, port);
        status = errno == EADDRINUSE ? KVP_ERR_SYSTEM : kvp_status_from_errno(errno);
        goto err_close;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        status = kvp_status_from_errno(errno);
        goto err_close;
    }
    *bound_port_p = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                   : ((struct sockaddr_in *)&ss)->sin_port);
    freeaddrinfo(res);
    *fd_p = fd;
    return KVP_OK;

err_close:
    close(fd);
err_free:
    freeaddrinfo(res);
    return status;
}

kvp_status_t kvp_tcp_connect(const char *host, uint16_t port, uint32_t timeout_ms, int *fd_p)
{
    struct addrinfo *res;
    kvp_status_t status = resolve(host, port, 0, &res);
    if (status != KVP_OK)
        return status;
    status = KVP_ERR_CONNECT;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            status = kvp_status_from_errno(errno);
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            do {
                rc = poll(&pfd, 1, timeout_ms ? (int)timeout_ms : -1);
            } while (rc < 0 && errno == EINTR);
            if (rc == 0) {
                errno = ETIMEDOUT;
                rc = -1;
            } else if (rc > 0) {
                int err = 0;
                socklen_t el = sizeof(err);
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
                errno = err;
                rc = err ? -1 : 0;
            }
        }
        if (rc != 0) {
            status = errno == ETIMEDOUT ? KVP_ERR_TIMEOUT : KVP_ERR_CONNECT;
            KVP_LOG_DEBUG("connect to %s:%u failed: %m", host, port);
            close(fd);
            continue;
        }
        int flags = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        freeaddrinfo(res);
        *fd_p = fd;
        return KVP_OK;
    }
    freeaddrinfo(res);
    return status;
}

/* The setting's default (unset, empty or "auto"): BBR left only on the same host. */
static bool congestion_auto(const char *want)
{
    return want == NULL || want[0] == '\0' || strcmp(want, "auto") == 0;
}

/* A BBR variant (bbr, bbr2, ...), the one the default leaves on the same host. */
static bool congestion_bbr(const char *current)
{
    return current != NULL && strncmp(current, "bbr", 3) == 0;
}

const char *kvp_sock_congestion_choice(const char *want, const char *current, bool same_host)
{
    if (congestion_auto(want))
        return same_host && congestion_bbr(current) ? "cubic" : NULL;
    if (strcmp(want, "system") == 0 || (current != NULL && strcmp(current, want) == 0))
        return NULL;
    return want;
}

/* Is a (v4, or v4 mapped into v6) address in 127/8, or ::1? */
static bool addr_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family != AF_INET6)
        return false;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

bool kvp_sock_same_host(int fd)
{
    struct sockaddr_storage local, peer;
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(fd, (struct sockaddr *)&local, &ll) != 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) != 0 || local.ss_family != peer.ss_family)
        return false;
    if (addr_loopback(&peer))
        return true;
    /* to one of this host's own addresses: the kernel answers from that same address */
    if (peer.ss_family == AF_INET)
        return ((struct sockaddr_in *)&local)->sin_addr.s_addr ==
               ((struct sockaddr_in *)&peer)->sin_addr.s_addr;
    if (peer.ss_family == AF_INET6)
        return memcmp(&((struct sockaddr_in6 *)&local)->sin6_addr,
                      &((struct sockaddr_in6 *)&peer)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return false;
}

static const char *g_congestion; /* $KVPOOL_TCP_CONGESTION, read once (NULL: unset) */
static pthread_once_t g_congestion_once = PTHREAD_ONCE_INIT;
static atomic_bool g_congestion_warned;

static void congestion_read(void)
{
    g_congestion = getenv("KVPOOL_TCP_CONGESTION");
}

void kvp_sock_data_congestion(int fd)
{
    pthread_once(&g_congestion_once, congestion_read);
    char cur[32] = {0}; /* TCP_CA_NAME_MAX is 16 */
    socklen_t len = sizeof(cur) - 1;
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cur, &len) != 0)
        return; /* not TCP */
    /* the ends' addresses are asked only where the answer can change the choice: the
     * default, on a BBR socket */
    bool same_host = congestion_auto(g_congestion) && congestion_bbr(cur) && kvp_sock_same_host(fd);
    const char *to = kvp_sock_congestion_choice(g_congestion, cur, same_host);
    if (to == NULL || setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, to, (socklen_t)strlen(to)) == 0)
        return;
    if (!atomic_exchange(&g_congestion_warned, true))
        KVP_LOG_WARN("data connections: the kernel refused congestion control \"%.32s\" (%m; "
                     "KVPOOL_TCP_CONGESTION, net.ipv4.tcp_allowed_congestion_control): they "
                     "keep \"%s\"",
                     to, cur);
}

/*
 * A Unix stream socket and the abstract address of name. bind: bind it and listen
 * (backlog), else connect it (each send/receive with timeout_ms).
 */
static kvp_status_t unix_socket(const char *name, bool bind_it, int backlog, uint32_t timeout_ms,
                                int *fd_p)
{
    struct sockaddr_un sa;
    size_t n = strlen(name);
    memset(&sa, 0, sizeof(sa));
    if (n == 0 || n >= sizeof(sa.sun_path))
        return KVP_ERR_INVALID_ARG;
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path + 1, name, n); /* sun_path[0] == 0: abstract */
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kvp_status_from_errno(errno);
    int rc;
    if (bind_it) {
        rc = bind(fd, (struct sockaddr *)&sa, sl) == 0 ? listen(fd, backlog) : -1;
    } else {
        kvp_sock_set_timeout(fd, timeout_ms);
        do
            rc = connect(fd, (struct sockaddr *)&sa, sl);
        while (rc != 0 && errno == EINTR);
    }
    if (rc != 0) {
        kvp_status_t st = bind_it ? kvp_status_from_errno(errno) : KVP_ERR_CONNECT;
        close(fd);
        return st;
    }
    *fd_p = fd;
    return KVP_OK;
}

kvp_status_t kvp_unix_listen(const char *name, int backlog, int *fd_p)
{
    return unix_socket(name, true, backlog, 0, fd_p);
}

kvp_status_t kvp_unix_connect(const char *name, uint32_t timeout_ms, int *fd_p)
{
    return unix_socket(name, false, 0, timeout_ms, fd_p);
}

bool kvp_unix_peer(int fd, int *pid_p, uint32_t *uid_p)
{
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    struct sockaddr_storage self;
    socklen_t sl = sizeof(self);
    if (getsockname(fd, (struct sockaddr *)&self, &sl) != 0 || self.ss_family != AF_UNIX ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cl != sizeof(cred))
        return false;
    *pid_p = cred.pid;
    *uid_p = cred.uid;
    return true;
}

kvp_status_t kvp_unix_send_fds(int fd, const void *buf, size_t len, const int *fds, size_t nfds)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int) * KVP_UNIX_FDS_MAX)];
    } ctl;
    if (len == 0 || nfds == 0 || nfds > KVP_UNIX_FDS_MAX)
        return KVP_ERR_INVALID_ARG;
    memset(&ctl, 0, sizeof(ctl));
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.b,
                         .msg_controllen = CMSG_SPACE(sizeof(int) * nfds)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    ssize_t n;
    do {
        n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return kvp_status_from_errno(errno);
    /* the descriptors went with the first byte; the rest (if any) is plain */
    return (size_t)n == len ? KVP_OK : kvp_send_all(fd, (const char *)buf + n, len - (size_t)n);
}

kvp_status_t kvp_unix_send_fd(int fd, const void *buf, size_t len, int passed_fd)
{
    return kvp_unix_send_fds(fd, buf, len, &passed_fd, 1);
}

kvp_status_t kvp_unix_recv_fds(int fd, void *buf, size_t len, int *fds, size_t max, size_t *n_p)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int) * (KVP_UNIX_FDS_MAX + 2))];
    } ctl;
    *n_p = 0;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
    ssize_t n;
    do {
        n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? KVP_ERR_TIMEOUT
                                                       : kvp_status_from_errno(errno);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int got;
            memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (*n_p < max)
                fds[(*n_p)++] = got;
            else
                close(got); /* more than were asked for */
        }
    }
    kvp_status_t st = n == 0 ? KVP_ERR_IO : KVP_OK;
    if (st == KVP_OK && (size_t)n < len)
        st = kvp_recv_all(fd, (char *)buf + n, len - (size_t)n);
    if (st != KVP_OK) {
        for (size_t i = 0; i < *n_p; i++)
            close(fds[i]);
        *n_p = 0;
    }
    return st;
}

kvp_status_t kvp_unix_recv_fd(int fd, void *buf, size_t len, int *passed_fd_p)
{
    size_t n;
    *passed_fd_p = -1;
    kvp_status_t st = kvp_unix_recv_fds(fd, buf, len, passed_fd_p, 1, &n);
    if (n == 0)
        *passed_fd_p = -1;
    return st;
}

void kvp_sock_set_timeout(int fd, uint32_t timeout_ms)
{
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

kvp_status_t kvp_send_all(int fd, const void *buf, size_t len)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return kvp_sendv_all(fd, &iov, 1);
}

kvp_status_t kvp_sendv_all(int fd, struct iovec *iov, int iovcnt)
{
    while (iovcnt > 0) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? KVP_ERR_TIMEOUT
                                                           : kvp_status_from_errno(errno);
        }
        size_t left = (size_t)n;
        while (iovcnt > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return KVP_OK;
}

kvp_status_t kvp_recvv_all(int fd, struct iovec *iov, int iovcnt)
{
    for (;;) {
        while (iovcnt > 0 && iov->iov_len == 0) {
            iov++;
            iovcnt--;
        }
        if (iovcnt == 0)
            break;
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t n = recvmsg(fd, &msg, MSG_WAITALL);
        if (n == 0)
            return KVP_ERR_IO;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? KVP_ERR_TIMEOUT
                                                           : kvp_status_from_errno(errno);
        }
        while (iovcnt > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return KVP_OK;
}

kvp_status_t kvp_recv_all(int fd, void *buf, size_t len)
{
    struct iovec iov = {buf, len};
    return kvp_recvv_all(fd, &iov, 1);
}

kvp_status_t kvp_recv_discard(int fd, uint64_t len)
{
    uint8_t sink[16384];
    while (len > 0) {
        size_t k = len < sizeof(sink) ? (size_t)len : sizeof(sink);
        kvp_status_t st = kvp_recv_all(fd, sink, k);
        if (st != KVP_OK)
            return st;
        len -= k;
    }
    return KVP_OK;
}

void kvp_sock_drain_close(int fd, uint32_t ms, size_t max)
{
    shutdown(fd, SHUT_WR);
    kvp_sock_set_timeout(fd, ms);
    uint8_t sink[4096];
    uint64_t until = kvp_now_ms() + ms;
    for (size_t drained = 0; drained < max && kvp_now_ms() < until;) {
        ssize_t n = recv(fd, sink, sizeof(sink), 0);
        if (n <= 0)
            break;
        drained += (size_t)n;
    }
}

/* An IPv6 address as the IPv4 one it maps, if it is v4-mapped. */
static bool v4_of(const struct sockaddr_storage *ss, struct in_addr *a)
{
    if (ss->ss_family == AF_INET) {
        *a = ((const struct sockaddr_in *)ss)->sin_addr;
        return true;
    }
    const struct in6_addr *a6 = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    if (ss->ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(a6)) {
        memcpy(&a->s_addr, &a6->s6_addr[12], 4);
        return true;
    }
    return false;
}

/* glibc's struct tcp_info stops before the kernel's bytes_acked, which follows it */
typedef struct {
    struct tcp_info base;
    uint64_t pacing_rate, max_pacing_rate, bytes_acked;
} tcp_info_acked_t;
_Static_assert(offsetof(tcp_info_acked_t, bytes_acked) == 120, "the kernel's tcp_info layout");

uint64_t kvp_sock_outq(int fd)
{
    int n = 0;
    return ioctl(fd, SIOCOUTQ, &n) == 0 && n > 0 ? (uint64_t)n : 0;
}

bool kvp_sock_unacked(int fd, uint64_t sent)
{
    tcp_info_acked_t ti;
    memset(&ti, 0, sizeof(ti));
    socklen_t len = sizeof(ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(tcp_info_acked_t, bytes_acked) + sizeof(ti.bytes_acked))
        return false;
    return ti.bytes_acked < sent;
}

bool kvp_sock_peer_local(int fd)
{
    struct sockaddr_storage peer, self;
    socklen_t pl = sizeof(peer), sl = sizeof(self);
    if (getpeername(fd, (struct sockaddr *)&peer, &pl) != 0 ||
        getsockname(fd, (struct sockaddr *)&self, &sl) != 0)
        return false;
    if (peer.ss_family == AF_UNIX)
        return true;
    struct in_addr p4, s4;
    if (v4_of(&peer, &p4)) {
        if ((ntohl(p4.s_addr) >> 24) == 127)
            return true;
        return v4_of(&self, &s4) && p4.s_addr == s4.s_addr;
    }
    if (peer.ss_family != AF_INET6 || self.ss_family != AF_INET6)
        return false;
    const struct in6_addr *p6 = &((const struct sockaddr_in6 *)&peer)->sin6_addr;
    const struct in6_addr *s6 = &((const struct sockaddr_in6 *)&self)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(p6) || memcmp(p6, s6, sizeof(*p6)) == 0;
}

kvp_status_t kvp_sock_route_addr(const char *host, uint16_t port, char *buf, size_t len)
{
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
    char ps[8];
    snprintf(ps, sizeof(ps), "%u", port ? port : 9);
    if (getaddrinfo(host, ps, &hints, &res) != 0 || res == NULL)
        return KVP_ERR_INVALID_ARG;
    kvp_status_t st = KVP_ERR_SYSTEM;
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage self;
    socklen_t sl = sizeof(self);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&self, &sl) == 0) {
        struct in_addr a4;
        const void *a = v4_of(&self, &a4)
                            ? (const void *)&a4
                            : (const void *)&((struct sockaddr_in6 *)&self)->sin6_addr;
        int fam = v4_of(&self, &a4) ? AF_INET : AF_INET6;
        if (inet_ntop(fam, a, buf, (socklen_t)len) != NULL)
            st = KVP_OK;
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return st;
}

bool kvp_host_is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (strcmp(host, "localhost") == 0)
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return false;
}

void kvp_sock_peer_name(int fd, char *buf, size_t len)
{
    struct sockaddr_storage peer;
    socklen_t pl = sizeof(peer);
    char host[INET6_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&peer, &pl) != 0) {
        snprintf(buf, len, "?");
        return;
    }
    if (peer.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&peer;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%u", host, (unsigned)ntohs(a->sin_port));
    } else if (peer.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&peer;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        snprintf(buf, len, "[%s]:%u", host, (unsigned)ntohs(a->sin6_port));
    } else {
        snprintf(buf, len, "local");
    }
}
