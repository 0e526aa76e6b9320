/*
 * sock.h - TCP and Unix socket set-up and blocking full reads/writes with a deadline.
 *
 * Thread: all functions are thread-safe (kvp_sock_data_congestion reads its setting once).
 */
#ifndef KVP_COMMON_SOCK_H
#define KVP_COMMON_SOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/status.h"

/* Bind + listen on host:port (port 0: any); returns the fd and the bound port. */
kvp_status_t kvp_tcp_listen(const char *host, uint16_t port, int backlog, int *fd_p,
                            uint16_t *bound_port_p);

/* Connect with a timeout; the returned fd is blocking, TCP_NODELAY, CLOEXEC. */
kvp_status_t kvp_tcp_connect(const char *host, uint16_t port, uint32_t timeout_ms, int *fd_p);

/*
 * The congestion control of a connection that moves object bytes (a segment's data
 * connections at both ends, the transfer engine's): what $KVPOOL_TCP_CONGESTION says, read
 * once (docs/operations.md "TCP congestion control of data connections"). Unset or "auto":
 * the system's, except BBR between two ends on the same host (kvp_sock_same_host), which
 * becomes cubic: without the fq qdisc BBR paces a connection's bytes with the kernel's
 * timers at its estimate of the path's rate, and on loopback, where there is no path to
 * be gentle to, a batch's chain of requests waits on them; across hosts BBR stays.
 * "system": the system's; another name: that algorithm, on every data connection. Best
 * effort: one the kernel refuses (not loaded, or for a process without CAP_NET_ADMIN not
 * in net.ipv4.tcp_allowed_congestion_control) leaves the socket as it was, logged once.
 */
void kvp_sock_data_congestion(int fd);
/* Its choice for a socket whose algorithm is `current` under the setting `want` (NULL:
 * unset), its two ends on one host or not: the algorithm to set, or NULL to leave it. */
const char *kvp_sock_congestion_choice(const char *want, const char *current, bool same_host);
/* Are a connected TCP socket's two ends on this host: the peer a loopback address, or the
 * socket's own local address (one of this host's)? false: not connected, not IP. */
bool kvp_sock_same_host(int fd);

/*
 * Unix stream sockets in the abstract namespace (Linux): `name` is the socket's name with
 * no leading NUL ("kvpool-1234-..."): nothing on the file system, gone with its last fd,
 * reachable from this network namespace only. Listen: CLOEXEC. Connect: blocking, CLOEXEC,
 * with a timeout for each send/receive (0: none).
 */
kvp_status_t kvp_unix_listen(const char *name, int backlog, int *fd_p);
kvp_status_t kvp_unix_connect(const char *name, uint32_t timeout_ms, int *fd_p);
/* The peer's credentials on a connected Unix socket (SO_PEERCRED, taken at connect).
 * false: not a Unix socket, or unknown. */
bool kvp_unix_peer(int fd, int *pid_p, uint32_t *uid_p);
/* Send len bytes with a descriptor attached (SCM_RIGHTS); receive them, and the descriptor
 * if one came (*passed_fd_p, CLOEXEC; -1: none; any other control data is closed). */
kvp_status_t kvp_unix_send_fd(int fd, const void *buf, size_t len, int passed_fd);
kvp_status_t kvp_unix_recv_fd(int fd, void *buf, size_t len, int *passed_fd_p);
/* The same with up to KVP_UNIX_FDS_MAX descriptors: sent with the first byte (len > 0);
 * received into fds[0..*n_p) (CLOEXEC; past max, closed; none kept on a failure). */
#define KVP_UNIX_FDS_MAX 4
kvp_status_t kvp_unix_send_fds(int fd, const void *buf, size_t len, const int *fds, size_t nfds);
kvp_status_t kvp_unix_recv_fds(int fd, void *buf, size_t len, int *fds, size_t max, size_t *n_p);

/* Set SO_RCVTIMEO/SO_SNDTIMEO on a blocking socket (0: none). */
void kvp_sock_set_timeout(int fd, uint32_t timeout_ms);

/*
 * Send/receive exactly len bytes on a blocking socket, retrying on EINTR and
 * short transfers. A peer close gives KVP_ERR_IO, a socket timeout
 * KVP_ERR_TIMEOUT.
 */
/* Is the peer of a connected socket on this host? Loopback (127.0.0.0/8, ::1, and ::1's
 * v4-mapped forms), or the very address the connection arrived at (a host that connects to
 * one of its own addresses sends from it). A peer in another network namespace is another
 * host. Protected mode (docs/security.md) takes only these. */
bool kvp_sock_peer_local(int fd);
/* Has the peer's TCP acknowledged fewer than `sent` bytes of what was written on tcp
 * socket fd (TCP_INFO's bytes_acked)? false when it cannot tell (not tcp, an old kernel).
 * Exact for an accepted socket; a connecting one counts its SYN as one byte acknowledged. */
bool kvp_sock_unacked(int fd, uint64_t sent);
/* Bytes written on tcp socket fd that its peer has not acknowledged yet (SIOCOUTQ: unsent
 * and unacknowledged, what the kernel holds; 0 when it cannot tell). */
uint64_t kvp_sock_outq(int fd);
/* The peer's address as text ("10.0.0.2:41234", "[fe80::1]:80"), for logs; "?" if unknown. */
void kvp_sock_peer_name(int fd, char *buf, size_t len);
/*
 * The address of this host that its routes send from toward host:port (a name or a
 * number), as text with no port ("10.0.0.2", "fe80::1"; a v4-mapped one as v4): what a
 * peer reaching host from here would see. No packet is sent (a UDP socket is connected,
 * then asked its name). KVP_ERR_INVALID_ARG: host does not resolve; KVP_ERR_SYSTEM: no
 * route.
 */
kvp_status_t kvp_sock_route_addr(const char *host, uint16_t port, char *buf, size_t len);
/* Is host (a name or a number) a loopback address: 127.0.0.0/8, ::1, or "localhost"? */
bool kvp_host_is_loopback(const char *host);

kvp_status_t kvp_send_all(int fd, const void *buf, size_t len);
kvp_status_t kvp_recv_all(int fd, void *buf, size_t len);
/* Receive len bytes and drop them (a payload refused after its header was read, so that
 * the stream stays in frame). */
kvp_status_t kvp_recv_discard(int fd, uint64_t len);
/* Before closing a connection just answered (a refusal): shut its sending side and read and
 * drop what the peer sent behind the request (up to max bytes, for up to ms, or until the
 * peer closes), so that the close does not reset the connection under the reply: the peer
 * reads the answer, not an I/O error. fd's timeout is changed. */
void kvp_sock_drain_close(int fd, uint32_t ms, size_t max);
/* Scatter receive (MSG_WAITALL) until every byte of iov[0..iovcnt) is in (the array is
 * modified): one recvmsg when the bytes are already there. */
kvp_status_t kvp_recvv_all(int fd, struct iovec *iov, int iovcnt);
/* Gather send of a whole iovec array (the array is modified). */
kvp_status_t kvp_sendv_all(int fd, struct iovec *iov, int iovcnt);

#endif
