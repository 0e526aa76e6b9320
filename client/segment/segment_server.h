/*
 * segment_server.h - the tcp data server of this client's own DRAM segment
 * (segment_server.c): READ/WRITE requests (transport/wire.h) against the
 * segment's memory, a thread per connection (conn_server.c).
 */
#ifndef KVP_CLIENT_SEGMENT_SEGMENT_SERVER_H
#define KVP_CLIENT_SEGMENT_SEGMENT_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "client/transfer/xfer.h"
#include "common/status.h"

/* What a data server did to our segment: [dir], 0 a peer's put (WRITE), 1 its get (READ). */
typedef struct kvp_served_stats {
    kvp_count_stats_t dir[2];
} kvp_served_stats_t;

typedef struct kvp_segment_server kvp_segment_server_t;

/*
 * Start serving [base, base+size) as segment `segment_id` (set later with
 * kvp_segment_server_set_id once the master assigned it) on host:port.
 */
kvp_status_t kvp_segment_server_create(void *base, uint64_t size, const char *host, uint16_t port,
                                       bool protected_mode, kvp_segment_server_t **srv_p,
                                       uint16_t *bound_port_p);
void kvp_segment_server_set_id(kvp_segment_server_t *srv, uint64_t segment_id);
/* Also serve MAP requests (transport/wire.h) on the abstract Unix socket sock_name: a peer of
 * this host, of our uid or root, with a MAP grant for the principal it proved (grants on),
 * is handed mem_fd, the segment's memory (the shm transport maps it). Before the first
 * mount. mem_fd stays the caller's. */
kvp_status_t kvp_segment_server_share(kvp_segment_server_t *srv, int mem_fd, const char *sock_name);
/* MAP requests refused (the peer's user, its grant, the socket it came on). Thread: any. */
uint64_t kvp_segment_server_shm_refused(const kvp_segment_server_t *srv);

/* The key and epoch of the mount's data grants (common/grant.h): from now on every request
 * must carry a grant sealed with that key; key NULL: grants off, any request is served.
 * Thread: any (connections pick it up at their next request). */
void kvp_segment_server_set_grants(kvp_segment_server_t *srv, const uint8_t *key, size_t key_len,
                                   uint64_t epoch);
/* The segment's record (segment/seg_record.h): a write grant for a put it shows ended is
 * refused. Set once, before the first mount. */
struct kvp_seg_record;
void kvp_segment_server_set_record(kvp_segment_server_t *srv, struct kvp_seg_record *record);
/* rdma memory windows (transport/wire.h BIND_READ, BIND_WRITE, UNBIND): fn binds or
 * invalidates them (transfer/transport.h's windows op); set once, before the first mount,
 * when the segment is served through windows. */
typedef kvp_status_t (*kvp_segment_windows_fn)(void *arg, uint32_t qp_num, uint64_t tag,
                                               const uint64_t *offs, const uint64_t *lens,
                                               size_t n_bind, bool write, uint64_t expiry_ms,
                                               uint32_t *rkeys, uint32_t *slots, size_t n_unbind);
void kvp_segment_server_set_windows(kvp_segment_server_t *srv, kvp_segment_windows_fn fn,
                                    void *arg);
/* Requests refused for a missing or bad grant (the connection was closed). Thread: any. */
uint64_t kvp_segment_server_grants_refused(const kvp_segment_server_t *srv);
void kvp_segment_server_destroy(kvp_segment_server_t *srv);
/* Connections of other hosts refused in protected mode (conn_server.h). Thread: any. */
uint64_t kvp_segment_server_refused(const kvp_segment_server_t *srv);
/* Its counters (live, updated by the connection threads); valid until destroy. */
const kvp_served_stats_t *kvp_segment_server_stats(const kvp_segment_server_t *srv);

#endif
