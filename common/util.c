/*
 * util.c - time, addresses, blocking socket I/O, key validation, sizes.
 *
 * Thread-safe, no global state. Sockets made here are CLOEXEC and, for TCP,
 * TCP_NODELAY: every frame we send is a complete message, so Nagle only adds
 * latency.
 */
#include "common/util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

uint64_t kvp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvp_now_ms(void)
{
    return kvp_now_ns() / 1000000ull;
}

kvp_status_t kvp_parse_hostport(const char *text, char *host, size_t host_len, uint16_t *port_p)
{
    if (text == NULL || host_len == 0)
        return KVP_ERR_INVALID_ARG;
    const char *colon;
    const char *hstart = text;
    size_t hlen;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (close == NULL || close[1] != ':')
            return KVP_ERR_INVALID_ARG;
        hstart = text + 1;
        hlen = (size_t)(close - hstart);
        colon = close + 1;
    } else {
        colon = strrchr(text, ':');
        if (colon == NULL)
            return KVP_ERR_INVALID_ARG;
        hlen = (size_t)(colon - text);
    }
    if (hlen == 0 || hlen >= host_len)
        return KVP_ERR_INVALID_ARG;
    const char *ps = colon + 1;
    if (*ps == '\0' || strspn(ps, "0123456789") != strlen(ps) || strlen(ps) > 5)
        return KVP_ERR_INVALID_ARG; /* digits only: no sign, no blanks */
    unsigned long port = strtoul(ps, NULL, 10);
    if (port > 65535)
        return KVP_ERR_INVALID_ARG;
    memcpy(host, hstart, hlen);
    host[hlen] = '\0';
    *port_p = (uint16_t)port;
    return KVP_OK;
}

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

kvp_status_t kvp_recv_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_WAITALL);
        if (n == 0)
            return KVP_ERR_IO;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? KVP_ERR_TIMEOUT
                                                           : kvp_status_from_errno(errno);
        }
        p += n;
        len -= (size_t)n;
    }
    return KVP_OK;
}

bool kvp_key_valid(const char *key, size_t len)
{
    if (key == NULL || len == 0 || len > 4096)
        return false;
    const unsigned char *s = (const unsigned char *)key;
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c == 0)
            return false;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) {
            n = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + n >= len)
            return false;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        /* reject overlong forms, surrogates and values past U+10FFFF */
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            return false;
        i += n + 1;
    }
    return true;
}

bool kvp_parse_size(const char *text, uint64_t *bytes_p)
{
    if (text == NULL || !isdigit((unsigned char)text[0]))
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0)
        return false;
    uint64_t mult = 1;
    if (*end != '\0') {
        char u = (char)tolower((unsigned char)*end);
        switch (u) {
        case 'k':
            mult = 1ull << 10;
            break;
        case 'm':
            mult = 1ull << 20;
            break;
        case 'g':
            mult = 1ull << 30;
            break;
        case 't':
            mult = 1ull << 40;
            break;
        case 'b':
            mult = 1;
            break;
        default:
            return false;
        }
        end++;
        if (u != 'b') {
            if (strcasecmp(end, "ib") == 0 || strcasecmp(end, "b") == 0)
                end += strlen(end);
        }
        if (*end != '\0')
            return false;
    }
    if (v > UINT64_MAX / mult)
        return false;
    *bytes_p = v * mult;
    return true;
}

uint64_t kvp_random_u64(void)
{
    uint64_t v = 0;
    while (v == 0) {
        if (getrandom(&v, sizeof(v), 0) != sizeof(v))
            v = kvp_now_ns() ^ ((uint64_t)getpid() << 32);
    }
    return v;
}
