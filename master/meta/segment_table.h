/*
 * segment_table.h - the mounted segments (see segment_table.c).
 */
#ifndef KVP_MASTER_META_SEGMENT_TABLE_H
#define KVP_MASTER_META_SEGMENT_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/offset_alloc.h"
#include "common/status.h"
#include "master/meta/object.h"

/* Smallest segment the master mounts. */
#define KVP_SEGMENT_MIN_SIZE 4096u
/* Largest segment (1 PiB) and largest pool (2^62 bytes): sums of sizes never wrap. */
#define KVP_SEGMENT_MAX_SIZE (1ull << 50)
#define KVP_POOL_MAX_CAPACITY (1ull << 62)

typedef struct kvp_segment {
    uint64_t id;
    char *name;
    char *medium;
    char *host_id;
    char *tcp_endpoint;
    char *shm_path;
    char *rdma_endpoint; /* "" when the owner serves no rdma */
    uint64_t rdma_addr;
    uint32_t rdma_rkey;
    bool rdma_windows; /* served through memory windows only (its owner said so at mount) */
    uint64_t size;
    /* with an ACL, the principal that mounted it (its tag, master/auth/acl.h) and that
     * principal's tenant: only it may subscribe to its record, take back what it held
     * when dropped (meta/limbo.c), or see its owner's client id; 0: no ACL */
    uint64_t owner_tag;
    uint16_t owner_tenant;
    uint64_t owner_client_id;
    uint64_t owner_conn_id; /* connection that mounted it; its close unmounts it */
    uint64_t objects;       /* replicas stored here */
    uint64_t held;          /* ... of which holds' (PUT_COMMIT: room placed ahead, no object) */
    uint64_t held_bytes;    /* the room those take (each extent rounded to KVP_SEGMENT_ALIGN) */
    /* mounted again (MountRequest.remount): no new replica before this (kvp_now_ms; 0: none) */
    uint64_t quiet_until_ms;
    bool draining; /* no new replicas; the owner is asked to move objects away */
    bool ssd;      /* medium "ssd": a file on its owner's disk (4 KiB extents) */
    bool dfs;      /* medium "dfs": a shard file in a shared directory (ssd is set too: a file tier;
                    * its own placement and capacity; docs/architecture.md "The DFS tier") */
    bool adopting; /* its owner is offering what it holds: no new replicas yet */
    bool orphan;   /* a DFS segment whose owner went silent: its objects kept (readers with the
                    * directory need no owner), no new replicas, until orphan_until_ms or a
                    * mount of its shard file takes it over (rpc/segment_calls.c) */
    uint64_t orphan_until_ms;
    struct kvp_limbo *limbo; /* what it held when dropped for silence: taken back when the
                              * offer ends (meta/limbo.c) */
    bool dedicated;          /* to one tenant (kvpool serve --tenant): only its objects */
    uint16_t tenant;         /* ... that tenant's id (meta/tenant.h) */
    /* its owner keeps a record of the objects on it (meta/record.c): changes queued here */
    bool record;
    bool record_broken;     /* the queue overflowed: the owner is to drop its record */
    void *record_stream;    /* the owner's SegRecord stream (server.c's) or NULL */
    uint64_t record_req_id; /* ... and the request id its frames carry */
    bool record_listed;     /* in the table's dirty list */
    bool record_ack;        /* a new stream: its first frame goes out at once */
    bool record_unwaited;   /* its stream kept replies past --record-wait: none wait for it again
                             * until it took all it was given (server.c, record gates) */
    uint64_t mounted_ms;    /* master clock at mount */
    uint64_t adopt_ok, adopt_refused; /* entries its owner offered back (ha/rebuild.c) */
    uint8_t *rec;
    size_t rec_len, rec_cap;
    kvp_offset_alloc_t *alloc;
    struct kvp_grant_mac *grant_mac; /* seals its grants (data grants on), or NULL */
    /* the last principal's keys and MAP grant an answer handed out for it (rpc/call.c:
     * every answer that names the segment hands them out again; derived once a principal) */
    struct {
        uint64_t tag; /* valid: K_p of this tag */
        bool valid, rdma, map;
        uint8_t kp[32], kr[32];
        uint8_t map_grant[80]; /* a kvp_grant_t (common/grant.h), map: sealed for tag */
    } keys;
} kvp_segment_t;

typedef struct kvp_segment_table {
    kvp_segment_t **slots;
    uint32_t *gens;
    uint32_t n_slots;
    uint32_t count;
    uint64_t capacity;     /* sum of sizes */
    uint64_t capacity_ssd; /* of which on SSD segments */
    uint64_t capacity_dfs; /* of which on DFS segments (not in capacity_ssd) */
    /* changes with every mount and unmount; starts random, so a client that knew
     * an earlier master's table never takes this one's for the same */
    uint64_t version;
    uint64_t quiet_until_ms; /* the latest of its segments' (kvp_now_ms) */
    /* segments whose record changed since the server last wrote their streams (record.c) */
    bool records_dirty;
    /* object groups (meta/group.h): a grouped object's record carries its group id */
    const struct kvp_group_table *groups;
    uint64_t *dirty_ids;
    size_t n_dirty, dirty_cap;
    /* segments dropped while objects on them were being read (kvp_segment_table_cut_lease) */
    struct kvp_cut_lease *cut;
    size_t n_cut;
} kvp_segment_table_t;

void kvp_segment_table_init(kvp_segment_table_t *table);
void kvp_segment_table_cleanup(kvp_segment_table_t *table);
/* Takes ownership of seg (allocated with calloc, strings strdup'd); assigns seg->id. */
kvp_status_t kvp_segment_table_add(kvp_segment_table_t *table, kvp_segment_t *seg);
kvp_segment_t *kvp_segment_table_get(const kvp_segment_table_t *table, uint64_t id);
kvp_segment_t *kvp_segment_table_find_name(const kvp_segment_table_t *table, const char *name);
/* Remove and destroy. */
void kvp_segment_table_remove(kvp_segment_table_t *table, kvp_segment_t *seg);
/*
 * A segment dropped (its owner silent) while objects on it were being read: their leases
 * ended with it, but a reader on the owner's host may still be copying from the memory it
 * mapped (shm), which the owner keeps. When the owner mounts that memory again (a new
 * segment under the same name, its room free), nothing new may be placed there before
 * those reads are over: kvp_segment_table_cut_until gives, for a name, the end of the
 * latest lease the drop cut short (until_ms, kvp_now_ms; 0: none that is not over).
 * Bounded: past KVP_CUT_LEASES_MAX names, the one that ends first makes room.
 */
#define KVP_CUT_LEASES_MAX 1024u
void kvp_segment_table_cut_lease(kvp_segment_table_t *table, const char *name, uint64_t until_ms,
                                 uint64_t now_ms);
uint64_t kvp_segment_table_cut_until(kvp_segment_table_t *table, const char *name, uint64_t now_ms);
void kvp_segment_destroy(kvp_segment_t *seg);
uint64_t kvp_segment_used(const kvp_segment_t *seg);
/* Bytes allocated over all segments. O(slots). */
uint64_t kvp_segment_table_used(const kvp_segment_table_t *table);
/* What the views call used and objects: allocated to objects, holds left out. */
static inline uint64_t kvp_segment_stored(const kvp_segment_t *seg)
{
    uint64_t u = kvp_segment_used(seg);
    return u > seg->held_bytes ? u - seg->held_bytes : 0;
}
static inline uint64_t kvp_segment_objects(const kvp_segment_t *seg)
{
    return seg->objects > seg->held ? seg->objects - seg->held : 0;
}
/* Bytes of the segment extents can use (its size rounded down to KVP_SEGMENT_ALIGN). */
static inline uint64_t kvp_segment_usable(const kvp_segment_t *seg)
{
    return seg->size / KVP_SEGMENT_ALIGN * KVP_SEGMENT_ALIGN;
}
/* Bytes allocated over the segments of one tier (ssd or dram; DFS segments in neither).
 * O(slots). */
uint64_t kvp_segment_table_used_tier(const kvp_segment_table_t *table, bool ssd);
/* Bytes allocated over the DFS segments. O(slots). */
uint64_t kvp_segment_table_used_dfs(const kvp_segment_table_t *table);
/* Capacity of one tier (DFS segments in neither). */
static inline uint64_t kvp_segment_table_capacity_tier(const kvp_segment_table_t *table, bool ssd)
{
    return ssd ? table->capacity_ssd : table->capacity - table->capacity_ssd - table->capacity_dfs;
}
/* Is replica r of obj on a mounted segment of that tier (ssd: a file tier, SSD or DFS)? */
bool kvp_segment_table_replica_on(const kvp_segment_table_t *table, const kvp_replica_t *r,
                                  bool ssd);
/* Has obj a replica on a mounted segment of that tier? */
bool kvp_segment_table_has_tier(const kvp_segment_table_t *table, const kvp_object_t *obj,
                                bool ssd);
/* Freeing an extent: kvp_segment_table_free_extent (meta/record.h: it tells the owner's
 * record too). */
/* Does seg take new replicas? (Not while draining, nor while its owner offers what it
 * holds.) */
static inline bool kvp_segment_open(const kvp_segment_t *seg)
{
    return !seg->draining && !seg->adopting && !seg->orphan;
}
/*
 * A segment mounted again takes no new replica for this long (kvp_segment_t.quiet_until_ms):
 * a client uses room held ahead (PUT_COMMIT's holds) only while its master connection
 * answered within 200 ms (client/object.c HOLD_FRESH_MS), so a write under a hold of the
 * segment's earlier mount (a master that died, a hold revoked with a segment dropped) began
 * before this mount, and one that took less than the rest of this lands before any new
 * object is placed where it writes.
 */
#define KVP_REMOUNT_QUIET_MS 500u
/* Does seg take no new replica yet, mounted again (now: kvp_now_ms)? */
static inline bool kvp_segment_quiet(const kvp_segment_t *seg, uint64_t now)
{
    return seg->quiet_until_ms != 0 && now < seg->quiet_until_ms;
}
/* Has obj a replica on a draining segment? (No new bytes go there.) */
bool kvp_segment_table_on_draining(const kvp_segment_table_t *table, const kvp_object_t *obj);

#endif
