/*
 * conn_server.h - a tcp (or Unix socket) listener with a thread per
 * connection: how connections to a data server (data_server.c) come and go,
 * apart from how each is served (see conn_server.c).
 */
#ifndef KVP_CLIENT_SEGMENT_CONN_SERVER_H
#define KVP_CLIENT_SEGMENT_CONN_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "client/transport/wire.h"
#include "common/sock.h"
#include "common/status.h"

typedef struct kvp_conn_server kvp_conn_server_t;

/* Serve one connection until it ends or breaks (then return). The fd belongs to the
 * server: it is shut down and closed after the call. */
typedef void (*kvp_conn_serve_fn)(void *arg, int fd);

/* Listen on host:port (0: any; the bound one in *bound_port_p) and serve each accepted
 * connection on a thread of its own with serve(arg, fd). `name` is for logs.
 * protected_mode: a peer of another host (kvp_sock_peer_local) is not served: its first
 * request header gets a KVP_ERR_DENIED reply (nothing more of it is read) and the
 * connection closes; kvp_conn_server_refused counts them. */
kvp_status_t kvp_conn_server_create(const char *name, const char *host, uint16_t port,
                                    bool protected_mode, kvp_conn_serve_fn serve, void *arg,
                                    kvp_conn_server_t **srv_p, uint16_t *bound_port_p);
/* The same on a Unix socket of the abstract namespace (sock.h, kvp_unix_listen): who
 * connects is on this host; serve() asks the peer's credentials (kvp_unix_peer). */
kvp_status_t kvp_conn_server_create_unix(const char *name, const char *sock_name,
                                         kvp_conn_serve_fn serve, void *arg,
                                         kvp_conn_server_t **srv_p);
/* Connections refused in protected mode so far. Thread: any. */
uint64_t kvp_conn_server_refused(const kvp_conn_server_t *srv);
/* Stop accepting, shut every connection down, wait for their threads. NULL: nothing. */
void kvp_conn_server_destroy(kvp_conn_server_t *srv);

/* A data-protocol reply header (docs/protocol.md): status and payload length. */
static inline kvp_status_t kvp_data_reply(int fd, int32_t status, uint64_t len)
{
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = status, .length = len};
    return kvp_send_all(fd, &r, sizeof(r));
}

#endif
