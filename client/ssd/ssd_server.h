/*
 * ssd_server.h - serves an SSD segment to tcp peers: the data protocol of
 * the DRAM segment server (READ, WRITE, READV, WRITEV; docs/protocol.md),
 * with the bytes read from and written to the segment's file through
 * io_uring (ssd_io.h) instead of memory.
 */
#ifndef KVP_CLIENT_SSD_SSD_SERVER_H
#define KVP_CLIENT_SSD_SSD_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "client/segment/segment_server.h"
#include "client/ssd/ssd_file.h"
#include "common/status.h"

typedef struct kvp_ssd_server kvp_ssd_server_t;

/* Listen on host:port (port 0: any; the bound one in *bound_port_p). f is borrowed
 * and must outlive the server. Requests carry segment_id; until set_id it is 0. */
kvp_status_t kvp_ssd_server_create(kvp_ssd_file_t *f, const char *host, uint16_t port,
                                   bool protected_mode, kvp_ssd_server_t **srv_p,
                                   uint16_t *bound_port_p);
/* Connections of other hosts refused in protected mode (segment/conn_server.h). */
uint64_t kvp_ssd_server_refused(const kvp_ssd_server_t *srv);
void kvp_ssd_server_set_id(kvp_ssd_server_t *srv, uint64_t segment_id);
/* The mount's data grants (as kvp_segment_server_set_grants) and the requests refused for
 * a missing or bad one. Thread: any. */
void kvp_ssd_server_set_grants(kvp_ssd_server_t *srv, const uint8_t *key, size_t key_len,
                               uint64_t epoch);
uint64_t kvp_ssd_server_grants_refused(const kvp_ssd_server_t *srv);
/* The file now records the object of this version at offset: the note of its put (data
 * grants: an older grant of the extent is refused from the put's first write) is done. */
void kvp_ssd_server_recorded(kvp_ssd_server_t *srv, uint64_t offset, uint64_t version);
/* Extents (their segment offsets) whose reads failed with an I/O error since the last
 * call, at most max (up to KVP_SSD_SERVER_BAD_MAX are kept): the owner reports them to
 * the master, which drops those copies. */
#define KVP_SSD_SERVER_BAD_MAX 64
size_t kvp_ssd_server_take_bad(kvp_ssd_server_t *srv, uint64_t *offsets, size_t max);
/* Extent reads or writes that failed with an I/O error since create. */
uint64_t kvp_ssd_server_io_errors(const kvp_ssd_server_t *srv);
/* Requests served (kvp_served_stats_t, segment/segment_server.h): live; valid until destroy. */
struct kvp_served_stats;
const struct kvp_served_stats *kvp_ssd_server_stats(const kvp_ssd_server_t *srv);
void kvp_ssd_server_destroy(kvp_ssd_server_t *srv);

#endif
