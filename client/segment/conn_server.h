/*
 * conn_server.h - a tcp (or Unix socket) listener with a thread per
 * connection: how connections to a data server (data_server.c) come and go,
 * apart from how each is served (see conn_server.c), and what one peer may
 * hold of it (kvp_conn_limits_t).
 */
#ifndef KVP_CLIENT_SEGMENT_CONN_SERVER_H
#define KVP_CLIENT_SEGMENT_CONN_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "client/transport/wire.h"
#include "common/sock.h"
#include "common/status.h"

typedef struct kvp_conn_server kvp_conn_server_t;
/* One connection, as its serve function sees it (valid during the call). */
typedef struct kvp_conn kvp_conn_t;

/*
 * What a server takes (docs/security.md, "Owner data servers"). A peer is an address (tcp;
 * a v4-mapped v6 one counts as v4) or a uid (the Unix socket, SO_PEERCRED). A connection
 * is unauthenticated until its serve function says otherwise (kvp_conn_admit: a HELLO
 * proven, or where there is nothing to prove a first request header in whole).
 *  - a connection past max_per_peer of its peer, or past max_unauth_per_peer of its
 *    peer's unauthenticated ones, is closed as it is accepted (nothing read);
 *  - past max_conns or max_unauth in all, the oldest unauthenticated connection is
 *    closed for the new one (none: the new one is closed);
 *  - an unauthenticated connection is closed handshake_ms after it was accepted, bytes
 *    or not; a frame (kvp_conn_recv_head ... kvp_conn_frame_end) is closed frame_ms after
 *    its first byte, plus a second per KVP_CONN_FRAME_RATE bytes it moves
 *    (kvp_conn_frame_extend); between frames an authenticated connection may stay idle.
 * 0 in a field: the default's (KVP_CONN_DEFAULT_*; max_unauth_per_peer: a quarter of
 * max_unauth). max_conns is lowered to what the process's descriptor limit leaves (a
 * quarter of RLIMIT_NOFILE for a tcp server, a sixteenth for a Unix socket), logged.
 *
 * The defaults are sized so that honest load never meets them (docs/security.md, "Owner
 * data servers"): a client process opens up to tcp_streams connections per transfer
 * thread to an owner (8 to an SSD owner) and keeps 64 idle, so one host of a hundred
 * threads opens some hundreds at once, every one unauthenticated for its first round trip;
 * hundreds of such hosts dial one owner. In all, like Redis's maxclients (10 000); one
 * address at most 4 096 of them; the caps before authentication only bound what strangers
 * hold for the handshake deadline.
 */
typedef struct kvp_conn_limits {
    uint32_t max_conns;
    uint32_t max_per_peer;
    uint32_t max_unauth;
    uint32_t max_unauth_per_peer;
    uint32_t handshake_ms;
    uint32_t frame_ms;
} kvp_conn_limits_t;

#define KVP_CONN_DEFAULT_MAX_CONNS 10000u
#define KVP_CONN_DEFAULT_MAX_PER_PEER 4096u
#define KVP_CONN_DEFAULT_MAX_UNAUTH 4096u
#define KVP_CONN_DEFAULT_HANDSHAKE_MS 10000u
#define KVP_CONN_DEFAULT_FRAME_MS 30000u
/* A Unix socket (the shm hand-off: one short connection per mapping) takes at most this
 * many at once, whatever max_conns says, one uid a quarter of them. */
#define KVP_CONN_UNIX_MAX_CONNS 1024u
/* A frame's allowance per byte moved: a second per MiB (a peer slower than that is cut). */
#define KVP_CONN_FRAME_RATE (1u << 20)

/*
 * The limits every server created from now on in this process takes (NULL: the defaults
 * again); max_unauth_per_peer 0: a quarter of max_unauth (at least 1). Process-wide, like
 * the log level: `kvpool serve` sets it from its flags before it creates its client.
 * Thread: any, but servers already listening keep theirs.
 */
void kvp_conn_limits_set_default(const kvp_conn_limits_t *limits);
/* Fields of the process's limits still 0 (not set by kvp_conn_limits_set_default) take
 * limits' nonzero ones: the library's environment (KVPOOL_DATA_*, client/env.c) under
 * `kvpool serve`'s flags. Thread: any. */
void kvp_conn_limits_fill(const kvp_conn_limits_t *limits);
/* The limits a server created now would take (the defaults filled in). */
void kvp_conn_limits_get_default(kvp_conn_limits_t *out);

/* Connections a server closed for its limits, by reason (kvp_conn_server_refusals). */
typedef struct kvp_conn_refusals {
    uint64_t conn_limit;        /* past max_conns, none unauthenticated to close for it */
    uint64_t peer_limit;        /* past max_per_peer */
    uint64_t unauth_limit;      /* past max_unauth_per_peer, or the oldest made way */
    uint64_t handshake_timeout; /* unauthenticated past handshake_ms */
    uint64_t frame_timeout;     /* a frame past its deadline */
    uint64_t resources;         /* accepted and closed: no descriptor or thread left */
} kvp_conn_refusals_t;

/* Serve one connection until it ends or breaks (then return). The connection's fd
 * (kvp_conn_fd) belongs to the server: it is shut down and closed after the call. */
typedef void (*kvp_conn_serve_fn)(void *arg, kvp_conn_t *conn);

/* Listen on host:port (0: any; the bound one in *bound_port_p) and serve each accepted
 * connection on a thread of its own with serve(arg, conn), within the process's limits
 * (kvp_conn_limits_set_default). `name` is for logs.
 * protected_mode: a peer of another host (kvp_sock_peer_local) is not served: its first
 * request header gets a KVP_ERR_DENIED reply (nothing more of it is read) and the
 * connection closes; kvp_conn_server_refused counts them. */
kvp_status_t kvp_conn_server_create(const char *name, const char *host, uint16_t port,
                                    bool protected_mode, kvp_conn_serve_fn serve, void *arg,
                                    kvp_conn_server_t **srv_p, uint16_t *bound_port_p);
/* The same on a Unix socket of the abstract namespace (sock.h, kvp_unix_listen): who
 * connects is on this host; its uid is its peer for the limits; serve() asks the peer's
 * credentials (kvp_unix_peer). */
kvp_status_t kvp_conn_server_create_unix(const char *name, const char *sock_name,
                                         kvp_conn_serve_fn serve, void *arg,
                                         kvp_conn_server_t **srv_p);
/* The limits it runs with (after the descriptor limit's cut). */
void kvp_conn_server_limits(const kvp_conn_server_t *srv, kvp_conn_limits_t *out);
/* Connections refused in protected mode so far. Thread: any. */
uint64_t kvp_conn_server_refused(const kvp_conn_server_t *srv);
/* Adds its refusals by reason to *sum. NULL srv: nothing. Thread: any. */
void kvp_conn_server_refusals(const kvp_conn_server_t *srv, kvp_conn_refusals_t *sum);
/* Stop accepting, shut every connection down, wait for their threads. NULL: nothing. */
void kvp_conn_server_destroy(kvp_conn_server_t *srv);

/* ---- for the serve function, on the connection's thread ---- */

int kvp_conn_fd(const kvp_conn_t *conn);
/* The connection proved its principal (or, with nothing to prove, sent a first request
 * header whole): it no longer counts as unauthenticated and has no handshake deadline. */
void kvp_conn_admit(kvp_conn_t *conn);
bool kvp_conn_admitted(const kvp_conn_t *conn);
/* Receive a frame's first len bytes (its header): waits for the first as long as the
 * connection may stay idle, then the frame's deadline runs (frame_ms). KVP_ERR_IO: closed,
 * broken, or cut at a deadline. */
kvp_status_t kvp_conn_recv_head(kvp_conn_t *conn, void *buf, size_t len);
/* The frame moves `bytes` more (its payload, or its reply's): its deadline grows by their
 * time at KVP_CONN_FRAME_RATE. */
void kvp_conn_frame_extend(kvp_conn_t *conn, uint64_t bytes);
/* The frame was served: no deadline until the next one's first byte (but the handshake's). */
void kvp_conn_frame_end(kvp_conn_t *conn);

/* A data-protocol reply header (docs/protocol.md): status and payload length. */
static inline kvp_status_t kvp_data_reply(int fd, int32_t status, uint64_t len)
{
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = status, .length = len};
    return kvp_send_all(fd, &r, sizeof(r));
}

#endif
