/*
 * state.h - everything the master's loop owns: the metadata (segment table,
 * object index), the policy's tables (read leases, the ghost), the drain
 * copies in flight, settings, counters and the master clock.
 *
 * One loop thread owns a kvp_master_state_t: no locks. Layers, each
 * including only those below it:
 *
 *   main.c, server.c   flags, epoll loop, connections, framing
 *   dispatch.c         the method table: method id -> handler
 *   rpc/               handlers by concern (segment, object, drain, admin)
 *                      and what they share (rpc/call.c: the response packer)
 *   policy/            eviction -> lease -> lists: what stays, what goes
 *   state.c, config.c  this struct and the settings
 *   meta/              object, segment_table, object_index, placement,
 *                      lease_table, ghost: data structures that know no state
 */
#ifndef KVP_MASTER_STATE_H
#define KVP_MASTER_STATE_H

#include <stdint.h>

#include "common/status.h"
#include "master/config.h"
#include "master/meta/ghost.h"
#include "master/meta/lease_table.h"
#include "master/meta/object.h"
#include "master/meta/object_index.h"
#include "master/meta/segment_table.h"

typedef struct kvp_master_stats {
    uint64_t evicted_objects;
    uint64_t evicted_bytes;
    uint64_t evictions;    /* eviction runs */
    uint64_t put_timeouts; /* PENDING puts revoked by --put-timeout */
    uint64_t moved;        /* objects moved off draining segments */
} kvp_master_stats_t;

/*
 * A copy in flight during a drain (MoveStart .. MoveEnd, rpc/drain.c): a new
 * extent `dest` for an object whose only replica is on segment `from`. The
 * key is stored inline after the struct.
 */
typedef struct kvp_move {
    struct kvp_move *next;
    uint64_t conn_id; /* the draining owner's connection */
    uint64_t from_segment_id;
    uint64_t size;
    kvp_replica_t dest;
    uint32_t crc32c; /* the object's CRC when the move started */
    uint16_t key_len;
    char key[];
} kvp_move_t;

typedef struct kvp_master_state {
    kvp_segment_table_t segments;
    kvp_object_index_t index;
    kvp_master_config_t config;
    kvp_master_stats_t stats;
    uint64_t rng;
    uint64_t now_ms; /* the master clock: set by the loop before each event (tests set it) */
    kvp_lease_table_t leases;
    kvp_ghost_t ghost;
    kvp_move_t *moves; /* drain copies in flight */
} kvp_master_state_t;

/* Default settings, empty tables, the clock read, a random placement seed. */
kvp_status_t kvp_master_state_init(kvp_master_state_t *st);
/* Free every object, segment, lease slot and move. */
void kvp_master_state_cleanup(kvp_master_state_t *st);

/* Bytes allocated over all segments. */
static inline uint64_t kvp_master_used(const kvp_master_state_t *st)
{
    return kvp_segment_table_used(&st->segments);
}

#endif
