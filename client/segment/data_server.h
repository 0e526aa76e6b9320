/*
 * data_server.h - the tcp data server of a segment this client owns (data_server.c):
 * the data protocol (transport/wire.h, docs/protocol.md) with its grant checks, served
 * from a backend (data_backend.h): a DRAM segment's memory (segment_server.h) or an SSD
 * segment's file (ssd/ssd_server.h). A thread per connection (conn_server.c), within
 * the process's limits on connections (conn_server.h, kvp_conn_limits_t).
 */
#ifndef KVP_CLIENT_SEGMENT_DATA_SERVER_H
#define KVP_CLIENT_SEGMENT_DATA_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/segment/conn_server.h"
#include "client/segment/data_backend.h"
#include "client/segment/data_grant.h"
#include "client/transfer/xfer.h"
#include "common/status.h"

/* What a data server did to its segment: [dir], 0 a peer's put (WRITE), 1 its get (READ). */
typedef struct kvp_served_stats {
    kvp_count_stats_t dir[2];
} kvp_served_stats_t;

typedef struct kvp_data_server kvp_data_server_t;

typedef struct kvp_data_server_params {
    const kvp_data_backend_ops_t *ops;
    void *backend;       /* the ops' context: the server's from a successful create */
    uint64_t size;       /* the segment's bytes: every extent lies inside [0, size) */
    uint64_t segment_id; /* the id requests carry until kvp_data_server_set_id */
    /* Optional (NULL: none yet, kvp_data_server_set_versions): what the segment holds,
     * for the grants of ended puts (data_grant.h, kvp_data_ended_t) */
    void (*versions_at)(void *arg, const uint64_t *offsets, uint64_t *versions, size_t n);
    /* ... and where a read waits for its object's end to be recorded (or NULL) */
    bool (*wait_recorded)(void *arg, const uint64_t *offsets, const uint64_t *versions, size_t n);
    void *versions_arg;
    const char *host; /* listen on host:port (port 0: any) */
    uint16_t port;
    bool protected_mode; /* peers of this host only (conn_server.h) */
} kvp_data_server_params_t;

/* Listen and serve; the port bound in *bound_port_p. On failure the backend stays the
 * caller's. */
kvp_status_t kvp_data_server_create(const kvp_data_server_params_t *params,
                                    kvp_data_server_t **srv_p, uint16_t *bound_port_p);
/* Stop listening, end every connection, destroy the backend. NULL: nothing. */
void kvp_data_server_destroy(kvp_data_server_t *srv);
/* The backend's context (params->backend), for the backend's own functions. */
void *kvp_data_server_backend(const kvp_data_server_t *srv);

/* The segment's id, as the master assigned it at its mount. Thread: any. */
void kvp_data_server_set_id(kvp_data_server_t *srv, uint64_t segment_id);
/* The key and epoch of the mount's data grants (common/grant.h): from now on every request
 * must carry a grant sealed with that key; key NULL: grants off, any request is served.
 * Thread: any (connections pick it up at their next request). */
void kvp_data_server_set_grants(kvp_data_server_t *srv, const uint8_t *key, size_t key_len,
                                uint64_t epoch);
/* What the segment holds (as params->versions_at; NULL: nothing known): a write grant for a
 * put it shows ended is refused; wait_recorded (or NULL): a read waits there for its
 * object's end to be recorded (data_grant.h). Set once, before the first mount. */
void kvp_data_server_set_versions(kvp_data_server_t *srv,
                                  void (*versions_at)(void *arg, const uint64_t *offsets,
                                                      uint64_t *versions, size_t n),
                                  bool (*wait_recorded)(void *arg, const uint64_t *offsets,
                                                        const uint64_t *versions, size_t n),
                                  void *arg);
/* The puts whose writes were let in and are not yet where versions_at sees them
 * (data_grant.h); valid until destroy. */
kvp_data_pending_t *kvp_data_server_pending(kvp_data_server_t *srv);

/* A backend with KVP_DATA_FRAME_MAP: also serve MAP requests (transport/wire.h) on the
 * abstract Unix socket sock_name: a peer of this host, of our uid or root, with a MAP grant
 * for the principal it proved (grants on), is handed mem_fd, the segment's memory (the shm
 * transport maps it). Before the first mount. mem_fd stays the caller's. */
kvp_status_t kvp_data_server_share(kvp_data_server_t *srv, int mem_fd, const char *sock_name);
/* A backend with KVP_DATA_FRAME_WINDOWS: rdma memory windows (transport/wire.h BIND_READ,
 * BIND_WRITE, UNBIND): fn binds or invalidates them (transfer/transport.h's windows op),
 * and is told of every write let in (rkeys NULL), before its bytes land, so that windows
 * over the extent it writes go; set once, before the first mount, when the segment is
 * served through windows. */
typedef kvp_status_t (*kvp_data_windows_fn)(void *arg, uint32_t qp_num, uint64_t tag,
                                            const uint64_t *offs, const uint64_t *lens,
                                            size_t n_bind, bool write, uint64_t expiry_ms,
                                            uint32_t *rkeys, uint32_t *slots, size_t n_unbind);
void kvp_data_server_set_windows(kvp_data_server_t *srv, kvp_data_windows_fn fn, void *arg);

/* Mount proofs (common/grant.h): answer the master's PROVE for segment `name` from now on,
 * and copy the secret this server drew as it started into secret (for the Mount request;
 * never logged). Thread: any. */
void kvp_data_server_proof(kvp_data_server_t *srv, const char *name,
                           uint8_t secret[KVP_PROVE_SECRET_LEN]);
/* Its counters (live, updated by the connection threads); valid until destroy. */
const kvp_served_stats_t *kvp_data_server_stats(const kvp_data_server_t *srv);
/* Connections of other hosts refused in protected mode (conn_server.h). Thread: any. */
uint64_t kvp_data_server_refused(const kvp_data_server_t *srv);
/* Requests refused for a missing or bad grant (the connection was closed). Thread: any. */
uint64_t kvp_data_server_grants_refused(const kvp_data_server_t *srv);
/* MAP requests refused (the peer's user, its grant, the socket it came on). Thread: any. */
uint64_t kvp_data_server_map_refused(const kvp_data_server_t *srv);
/* Adds the connections its listeners (tcp and the shm socket) closed for their limits
 * (conn_server.h) to *sum, by reason. NULL srv: nothing. Thread: any. */
void kvp_data_server_admission(const kvp_data_server_t *srv, kvp_conn_refusals_t *sum);

#endif
