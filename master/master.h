/*
 * master.h - internal types of kvpool-master.
 *
 * Everything here is owned by the master's single loop thread: no locks.
 *
 *   segment table   slot array of mounted segments; id = generation<<32 | slot
 *   object index    chained hash table key -> object (XXH3)
 *   placement       chooses segments for a new object's replicas
 *   service         RPC handlers over the three above
 *   server          epoll loop, connections, framing
 */
#ifndef KVP_MASTER_MASTER_H
#define KVP_MASTER_MASTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/offset_alloc.h"
#include "common/status.h"

typedef enum kvp_obj_state {
    KVP_OBJ_PENDING = 1,
    KVP_OBJ_COMPLETE = 2,
    /* removed (force remove, upsert) while reads were in flight: out of the index, its
     * extents kept by its lease until the last read ends (lease.c) */
    KVP_OBJ_RETIRED = 3,
} kvp_obj_state_t;

typedef enum kvp_pin {
    KVP_PIN_NONE = 0,
    KVP_PIN_SOFT = 1, /* evicted only when nothing else can be, until it expires */
    KVP_PIN_HARD = 2, /* never evicted */
} kvp_pin_t;

/* Master settings (flags of kvpool-master; defaults in kvp_master_config_init). */
typedef struct kvp_master_config {
    bool evict;              /* false: a full pool refuses puts (store, not cache) */
    double evict_high;       /* evict when used/capacity passes this (0.95) */
    double evict_low;        /* ... down to this (0.85) */
    uint32_t lease_ttl_ms;   /* read lease granted by GetReplicaList (5000) */
    uint32_t put_timeout_ms; /* a PENDING put not ended by then is revoked (30000) */
    uint32_t soft_pin_ttl_s; /* default soft pin lifetime (1800) */
    uint32_t client_ttl_ms;  /* a connection silent this long is dropped (10000; 0: never) */
    bool lease_on_exist;     /* Exist grants read leases too (false) */
} kvp_master_config_t;

void kvp_master_config_init(kvp_master_config_t *cfg);

#define KVP_MAX_REPLICAS 8
/* Extent granularity inside a segment (cache-line aligned extents). */
#define KVP_SEGMENT_ALIGN 64u
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
    uint64_t size;
    uint64_t owner_client_id;
    uint64_t owner_conn_id; /* connection that mounted it; its close unmounts it */
    uint64_t objects;       /* replicas stored here */
    bool draining;          /* no new replicas; the owner is asked to move objects away */
    kvp_offset_alloc_t *alloc;
} kvp_segment_t;

typedef struct kvp_replica {
    uint64_t segment_id;
    uint64_t offset;
    uint32_t handle; /* offset allocator handle */
} kvp_replica_t;

/*
 * One object. Replicas and the key are stored inline after the header:
 * data = kvp_replica_t[n_replicas] then key bytes (not NUL-terminated).
 */
typedef struct kvp_object {
    struct kvp_object *hnext; /* hash chain */
    struct kvp_object *lprev; /* PENDING: pending list; COMPLETE: LRU list */
    struct kvp_object *lnext;
    uint64_t hash;
    uint64_t size;
    union {
        uint64_t writer_conn_id; /* PENDING: connection that started the put */
        struct {
            uint32_t lease;  /* COMPLETE, RETIRED: lease slot + 1 (lease.c); 0: no read */
            uint32_t policy; /* COMPLETE: eviction policy state (eviction.c) */
        };
    };
    uint64_t deadline_ms;      /* PENDING: put timeout */
    uint32_t soft_pin_until_s; /* soft pin expiry (master clock, seconds); 0: none */
    uint32_t crc32c;
    uint8_t state;
    uint8_t n_replicas;
    uint16_t key_len;
    uint8_t pin;              /* kvp_pin_t */
    kvp_replica_t replicas[]; /* followed by key bytes */
} kvp_object_t;

static inline const char *kvp_object_key(const kvp_object_t *obj)
{
    return (const char *)&obj->replicas[obj->n_replicas];
}

/* Bytes obj's extents take in their segments (every replica, aligned). */
static inline uint64_t kvp_object_bytes(const kvp_object_t *obj)
{
    return (obj->size + KVP_SEGMENT_ALIGN - 1) / KVP_SEGMENT_ALIGN * KVP_SEGMENT_ALIGN *
           obj->n_replicas;
}

/* ---- segment table (segment_table.c) ---- */
typedef struct kvp_segment_table {
    kvp_segment_t **slots;
    uint32_t *gens;
    uint32_t n_slots;
    uint32_t count;
    uint64_t capacity; /* sum of sizes */
} kvp_segment_table_t;

void kvp_segment_table_init(kvp_segment_table_t *table);
void kvp_segment_table_cleanup(kvp_segment_table_t *table);
/* Takes ownership of seg (allocated with calloc, strings strdup'd); assigns seg->id. */
kvp_status_t kvp_segment_table_add(kvp_segment_table_t *table, kvp_segment_t *seg);
kvp_segment_t *kvp_segment_table_get(const kvp_segment_table_t *table, uint64_t id);
kvp_segment_t *kvp_segment_table_find_name(const kvp_segment_table_t *table, const char *name);
/* Remove and destroy. */
void kvp_segment_table_remove(kvp_segment_table_t *table, kvp_segment_t *seg);
void kvp_segment_destroy(kvp_segment_t *seg);
uint64_t kvp_segment_used(const kvp_segment_t *seg);
/* Bytes of the segment extents can use (its size rounded down to KVP_SEGMENT_ALIGN). */
static inline uint64_t kvp_segment_usable(const kvp_segment_t *seg)
{
    return seg->size / KVP_SEGMENT_ALIGN * KVP_SEGMENT_ALIGN;
}

/* ---- object index (object_index.c) ---- */
typedef struct kvp_object_list {
    kvp_object_t *head; /* oldest (the evict end) */
    kvp_object_t *tail; /* newest */
    uint64_t n;
} kvp_object_list_t;

/* obj->policy of a COMPLETE object: the list it is on (eviction.c). */
#define KVP_POLICY_PROBATION 0u /* put, not read since */
#define KVP_POLICY_PROTECTED 1u /* read at least once (or back from the ghost) */
#define KVP_POLICY_PINNED 2u    /* hard-pinned: never a victim, never scanned */
#define KVP_POLICY_SOFT 3u      /* soft-pinned: victims only when nothing else is left */
#define KVP_POLICY_READING 4u   /* being read (a lease held): never a victim, never scanned */
#define KVP_POLICY_LIST_MASK 7u

typedef struct kvp_object_index {
    kvp_object_t **buckets;
    uint64_t n_buckets;             /* power of two */
    uint64_t count;                 /* all objects */
    uint64_t pending;               /* PENDING objects */
    kvp_object_list_t pending_list; /* PENDING objects, oldest first (put timeouts) */
    kvp_object_list_t probation;    /* COMPLETE: eviction policy lists (eviction.c) */
    kvp_object_list_t protected;
    kvp_object_list_t pinned;
    kvp_object_list_t soft;
    kvp_object_list_t reading;
} kvp_object_index_t;

kvp_status_t kvp_index_init(kvp_object_index_t *index);
/* Frees every object (not their extents: the caller frees allocators). */
void kvp_index_cleanup(kvp_object_index_t *index);
uint64_t kvp_index_hash(const char *key, size_t len);
kvp_object_t *kvp_index_lookup(const kvp_object_index_t *index, const char *key, size_t len,
                               uint64_t hash);
/* Insert a new object (key must not be present). */
void kvp_index_insert(kvp_object_index_t *index, kvp_object_t *obj);
/* Unlink from the table (and the pending list); does not free. */
void kvp_index_unlink(kvp_object_index_t *index, kvp_object_t *obj);
void kvp_index_set_state(kvp_object_index_t *index, kvp_object_t *obj, kvp_obj_state_t state);
/* The policy list a COMPLETE object is on. */
kvp_object_list_t *kvp_index_policy_list(kvp_object_index_t *index, const kvp_object_t *obj);
/* Doubly linked object lists (lprev/lnext): append at the tail or prepend at the head,
 * unlink anywhere. */
void kvp_object_list_append(kvp_object_list_t *list, kvp_object_t *obj);
void kvp_object_list_prepend(kvp_object_list_t *list, kvp_object_t *obj);
void kvp_object_list_remove(kvp_object_list_t *list, kvp_object_t *obj);
/* Allocate an object with room for n replicas and the key. */
kvp_object_t *kvp_object_create(const char *key, size_t len, uint64_t hash, unsigned n_replicas);

/*
 * Visit every object. When cb returns true the object is unlinked and its
 * memory freed; cb must already have released whatever extents it still holds.
 */
typedef bool (*kvp_index_visit_cb_t)(kvp_object_t *obj, void *arg);
void kvp_index_foreach_remove(kvp_object_index_t *index, kvp_index_visit_cb_t cb, void *arg);

/*
 * A copy in flight during a drain (MoveStart .. MoveEnd): a new extent `dest`
 * for an object whose only replica is on segment `from`. The key is stored
 * inline after the struct.
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

/* ---- placement (placement.c) ---- */
typedef struct kvp_placement_req {
    uint64_t size;
    unsigned replica_num;
    const kvp_segment_t *preferred; /* may be NULL */
    unsigned pin;                   /* kvp_pin_t for the new object */
    uint32_t soft_pin_ttl_s;        /* 0: the master's default */
    bool upsert;                    /* replace an existing object (PutStart only) */
} kvp_placement_req_t;

/*
 * Allocate up to replica_num extents for one object on distinct segments
 * (distinct hosts first). Writes *n_p >= 1 replicas on success. Errors:
 * KVP_ERR_NO_SEGMENT, KVP_ERR_TOO_LARGE (bigger than every segment),
 * KVP_ERR_POOL_FULL.
 */
kvp_status_t kvp_placement_alloc(kvp_segment_table_t *table, const kvp_placement_req_t *req,
                                 uint64_t *rng_state, kvp_replica_t *out, unsigned *n_p);

/* ---- read leases (lease.c) ---- */
/*
 * One slot per object being read: how many reads are in flight (grants not
 * yet released) and when the lease ends if nobody releases it (the safety
 * net for a reader that dies). A lease id names a slot and its generation,
 * so a release that comes after its lease ended (TTL) never ends a later
 * one; readers of one object share the id and a release is trusted (see
 * lease.c).
 */
typedef struct kvp_lease {
    kvp_object_t *obj;   /* NULL: free slot */
    uint64_t expires_ms; /* TTL after the last grant */
    uint64_t bytes;      /* extent bytes the lease holds (all replicas) */
    uint32_t gen;        /* bumped at every allocation of the slot */
    uint32_t readers;    /* grants not released */
    uint32_t prev, next; /* live slots in expiry order / free list (next); UINT32_MAX: none */
} kvp_lease_t;

typedef struct kvp_lease_table {
    kvp_lease_t *slots;
    uint32_t n_slots;
    uint32_t free_head;
    uint32_t head, tail; /* live slots, earliest expiry first */
    uint32_t live;
    uint64_t bytes;             /* sum of live slots' bytes */
    uint64_t released, expired; /* leases ended by release / by the TTL */
} kvp_lease_table_t;

/* ---- the whole metadata state + handlers (service.c) ---- */
typedef struct kvp_master_stats {
    uint64_t evicted_objects;
    uint64_t evicted_bytes;
    uint64_t evictions;    /* eviction runs */
    uint64_t put_timeouts; /* PENDING puts revoked by --put-timeout */
    uint64_t moved;        /* objects moved off draining segments */
} kvp_master_stats_t;

/*
 * Keys evicted lately (eviction.c): two Bloom filters, inserts go to the
 * current one, lookups ask both; when the current one has taken `cap`
 * keys the older one is cleared and becomes current. So the ghost
 * remembers the last cap..2*cap evictions, at about 10 bits per key.
 */
typedef struct kvp_ghost {
    uint64_t *bits[2];
    uint64_t mask[2]; /* bits per filter - 1 (a power of two - 1) */
    uint64_t n_cur;   /* keys in bits[cur] */
    uint64_t cap;
    unsigned cur;
} kvp_ghost_t;

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

kvp_status_t kvp_master_state_init(kvp_master_state_t *st);
void kvp_master_state_cleanup(kvp_master_state_t *st);

/*
 * Handle one request body for `method` from connection conn_id. On KVP_OK
 * *resp_p is a malloc'd packed response (caller frees). A non-OK return is a
 * frame-level error (undecodable body, unknown method): the caller replies
 * with the status and `errmsg`.
 */
kvp_status_t kvp_service_handle(kvp_master_state_t *st, uint64_t conn_id, uint16_t method,
                                const uint8_t *body, size_t body_len, uint8_t **resp_p,
                                size_t *resp_len_p, char *errmsg, size_t errmsg_len);

/* A connection closed: revoke its PENDING puts and unmount its segments. */
void kvp_service_conn_closed(kvp_master_state_t *st, uint64_t conn_id);

/* Free every extent of obj and destroy it (obj must be unlinked). */
void kvp_object_release(kvp_master_state_t *st, kvp_object_t *obj);

/*
 * Release an unlinked object now or, while reads of it are in flight, keep
 * its extents (state RETIRED, held by its lease) until the last read ends:
 * a leased extent is never freed or reused.
 */
void kvp_object_retire(kvp_master_state_t *st, kvp_object_t *obj);

/* ---- read leases (lease.c) ---- */
void kvp_lease_table_init(kvp_lease_table_t *t);
/* Frees the RETIRED objects leases still hold. */
void kvp_lease_table_cleanup(kvp_lease_table_t *t);
/*
 * A read of obj (COMPLETE) starts: one more reader, expiry pushed to now +
 * TTL. Returns the lease id to release, 0 when out of memory (the read then
 * goes unleased: still CRC-checked).
 */
uint64_t kvp_lease_grant(kvp_master_state_t *st, kvp_object_t *obj);
/* A read is over. Stale or unknown ids are ignored (false). */
bool kvp_lease_release(kvp_master_state_t *st, uint64_t lease_id);
/* End leases whose TTL passed (readers that died). Returns how many. */
unsigned kvp_lease_expire(kvp_master_state_t *st);
/* obj is going away (evicted, its last segment unmounted, ...): forget its lease, if any. */
void kvp_lease_forget(kvp_master_state_t *st, kvp_object_t *obj);
/* Is a read of obj in flight (a lease granted, not released, its TTL not over)? */
static inline bool kvp_leased(const kvp_master_state_t *st, const kvp_object_t *obj)
{
    return obj->state != KVP_OBJ_PENDING && obj->lease != 0 &&
           st->leases.slots[obj->lease - 1].expires_ms > st->now_ms;
}
/* Milliseconds left on obj's lease (0: none). */
uint64_t kvp_lease_left_ms(const kvp_master_state_t *st, const kvp_object_t *obj);

/* ---- eviction and timers (eviction.c) ---- */
/* Bytes allocated over all segments. */
uint64_t kvp_master_used(const kvp_master_state_t *st);
/*
 * The policy's hooks. kvp_policy_put: obj just became COMPLETE (PutEnd);
 * `deepest`: it was the last key of a batch of several (batches are
 * handled last key first, so a chain's first block ends up the newest).
 * kvp_policy_read_start: a read lease on obj begins (the object leaves the
 * lists eviction walks); kvp_policy_read_end: it ended (obj back, as the
 * most recently read). kvp_policy_read: a read with no lease (--lease-ttl 0).
 */
void kvp_policy_put(kvp_master_state_t *st, kvp_object_t *obj, bool deepest);
void kvp_policy_read_start(kvp_master_state_t *st, kvp_object_t *obj);
void kvp_policy_read_end(kvp_master_state_t *st, kvp_object_t *obj);
void kvp_policy_read(kvp_master_state_t *st, kvp_object_t *obj);
/* Is obj's key among the recently evicted ones? */
bool kvp_ghost_has(const kvp_ghost_t *g, uint64_t hash);
void kvp_ghost_cleanup(kvp_ghost_t *g);
/*
 * Evict COMPLETE objects in the policy's order, skipping leased ones, hard
 * pins, objects on draining segments and (first pass) soft pins, until used
 * bytes are at most `target`. Returns the bytes freed.
 */
uint64_t kvp_evict_to(kvp_master_state_t *st, uint64_t target);
/* Evict down to the low watermark if usage is above the high one. */
void kvp_evict_if_needed(kvp_master_state_t *st);
/* Revoke PENDING puts past their deadline. Returns how many. */
unsigned kvp_expire_puts(kvp_master_state_t *st);

#endif
