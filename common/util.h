/*
 * util.h - small helpers shared by everything: time, host:port parsing,
 * socket set-up, blocking full reads/writes with a deadline, key validation.
 *
 * Thread: all functions are thread-safe (no shared state).
 */
#ifndef KVP_COMMON_UTIL_H
#define KVP_COMMON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/status.h"

#define KVP_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define KVP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVP_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Monotonic clock. */
uint64_t kvp_now_ns(void);
uint64_t kvp_now_ms(void);

/*
 * Split "host:port" into host (NUL-terminated, at most host_len-1 bytes) and
 * port. Accepts "[v6]:port". KVP_ERR_INVALID_ARG on anything else.
 */
kvp_status_t kvp_parse_hostport(const char *text, char *host, size_t host_len, uint16_t *port_p);

/* Bind + listen on host:port (port 0: any); returns the fd and the bound port. */
kvp_status_t kvp_tcp_listen(const char *host, uint16_t port, int backlog, int *fd_p,
                            uint16_t *bound_port_p);

/* Connect with a timeout; the returned fd is blocking, TCP_NODELAY, CLOEXEC. */
kvp_status_t kvp_tcp_connect(const char *host, uint16_t port, uint32_t timeout_ms, int *fd_p);

/* Set SO_RCVTIMEO/SO_SNDTIMEO on a blocking socket (0: none). */
void kvp_sock_set_timeout(int fd, uint32_t timeout_ms);

/*
 * Send/receive exactly len bytes on a blocking socket, retrying on EINTR and
 * short transfers. A peer close gives KVP_ERR_IO, a socket timeout
 * KVP_ERR_TIMEOUT.
 */
kvp_status_t kvp_send_all(int fd, const void *buf, size_t len);
kvp_status_t kvp_recv_all(int fd, void *buf, size_t len);
/* Gather send of a whole iovec array (the array is modified). */
kvp_status_t kvp_sendv_all(int fd, struct iovec *iov, int iovcnt);

/* A key is 1..4096 bytes of valid UTF-8 with no NUL. */
bool kvp_key_valid(const char *key, size_t len);

/* Parse "64MiB", "1g", "4096" ... into bytes. false on garbage or overflow. */
bool kvp_parse_size(const char *text, uint64_t *bytes_p);

/* A random 64-bit value from getrandom(2) (never 0). */
uint64_t kvp_random_u64(void);

/*
 * xorshift64*: a fast deterministic generator (placement draws, benchmarks).
 * *state must not be 0.
 */
static inline uint64_t kvp_rng_next(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

#endif
