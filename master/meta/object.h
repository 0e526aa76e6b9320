/*
 * object.h - what the master knows of one object: its replicas (extents in
 * segments), its state and pin, and its place in the index and lists.
 *
 * Types and O(1) inline helpers only. Master loop thread only.
 */
#ifndef KVP_MASTER_META_OBJECT_H
#define KVP_MASTER_META_OBJECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_MAX_REPLICAS 8
/* Extent granularity inside a segment (cache-line aligned extents). */
#define KVP_SEGMENT_ALIGN 64u

typedef enum kvp_obj_state {
    KVP_OBJ_PENDING = 1,
    KVP_OBJ_COMPLETE = 2,
    /* removed (force remove, upsert) while reads were in flight: out of the index, its
     * extents kept by its lease until the last read ends (policy/lease.c) */
    KVP_OBJ_RETIRED = 3,
} kvp_obj_state_t;

/* obj->flags: a copy between tiers in flight (policy/tier.c) */
#define KVP_OBJ_F_OFFLOADING 1u /* DRAM replica being copied to SSD (a task holds the extent) */
#define KVP_OBJ_F_PROMOTING 2u  /* SSD replica being copied to DRAM */
#define KVP_OBJ_F_COPYING (KVP_OBJ_F_OFFLOADING | KVP_OBJ_F_PROMOTING)
/* in an object group (meta/group.h): its group id and its index in the group's member
 * array, two uint32_t, follow its key bytes (8 bytes more than an ungrouped object; none
 * for one without) */
#define KVP_OBJ_F_GROUPED 4u
#define KVP_OBJ_GROUP_TAIL (2 * sizeof(uint32_t))
/* a grouped object whose read lease slot is counted in its group's `leased` (policy/lease.c;
 * the count goes down when the slot ends or the object leaves its group, whichever first) */
#define KVP_OBJ_F_GROUP_LEASED 8u
/* a hold (PUT_COMMIT, rpc/object_calls.c): room placed ahead for one object of a
 * connection, PENDING under a key no request can name, not yet any key's */
#define KVP_OBJ_F_HOLD 16u

typedef enum kvp_pin {
    KVP_PIN_NONE = 0,
    KVP_PIN_SOFT = 1, /* evicted only when nothing else can be, until it expires */
    KVP_PIN_HARD = 2, /* never evicted */
} kvp_pin_t;

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
            uint32_t lease;  /* COMPLETE, RETIRED: lease slot + 1 (policy/lease.c); 0: no read */
            uint32_t policy; /* COMPLETE: eviction policy state (policy/lists.c) */
        };
    };
    union {
        uint64_t deadline_ms; /* PENDING: put timeout */
        uint64_t touched;     /* COMPLETE: the policy clock when last put or read (lists.c) */
    };
    uint64_t version;          /* this value's version: a later put has a larger one (tier.c) */
    uint32_t soft_pin_until_s; /* soft pin expiry (master clock, seconds); 0: none */
    uint32_t crc32c;
    uint8_t state;
    uint8_t n_replicas;
    uint16_t key_len;
    uint8_t pin;              /* kvp_pin_t */
    uint8_t flags;            /* KVP_OBJ_F_* */
    uint16_t tenant;          /* its tenant's id (meta/tenant.h); 0: the default tenant */
    kvp_replica_t replicas[]; /* followed by key bytes */
} kvp_object_t;
/* the tenant's id took padding: an object is no larger for it */
_Static_assert(sizeof(kvp_object_t) == 80, "kvp_object_t grew");

static inline const char *kvp_object_key(const kvp_object_t *obj)
{
    return (const char *)&obj->replicas[obj->n_replicas];
}

/* The bytes after the replicas: the key, and a grouped object's group id. */
static inline size_t kvp_object_tail_len(const kvp_object_t *obj)
{
    return obj->key_len + ((obj->flags & KVP_OBJ_F_GROUPED) ? KVP_OBJ_GROUP_TAIL : 0);
}

/* obj's group id (meta/group.h); 0: none. */
static inline uint32_t kvp_object_group(const kvp_object_t *obj)
{
    uint32_t g = 0;
    if (obj->flags & KVP_OBJ_F_GROUPED)
        __builtin_memcpy(&g, kvp_object_key(obj) + obj->key_len, sizeof(g));
    return g;
}

/* (an object made with kvp_object_create_grouped only) */
static inline void kvp_object_set_group(kvp_object_t *obj, uint32_t g)
{
    __builtin_memcpy((char *)kvp_object_key(obj) + obj->key_len, &g, sizeof(g));
}

/* A grouped object's index in its group's member array (meta/group.c keeps it). */
static inline uint32_t kvp_object_member_index(const kvp_object_t *obj)
{
    uint32_t i;
    __builtin_memcpy(&i, kvp_object_key(obj) + obj->key_len + sizeof(uint32_t), sizeof(i));
    return i;
}

static inline void kvp_object_set_member_index(kvp_object_t *obj, uint32_t i)
{
    __builtin_memcpy((char *)kvp_object_key(obj) + obj->key_len + sizeof(uint32_t), &i, sizeof(i));
}

/* Bytes obj's extents take in their segments (every replica, aligned). */
/* The index of obj's replica on segment_id, or -1. */
static inline int kvp_object_replica_on(const kvp_object_t *obj, uint64_t segment_id)
{
    for (unsigned r = 0; r < obj->n_replicas; r++)
        if (obj->replicas[r].segment_id == segment_id)
            return (int)r;
    return -1;
}

static inline uint64_t kvp_object_bytes(const kvp_object_t *obj)
{
    return (obj->size + KVP_SEGMENT_ALIGN - 1) / KVP_SEGMENT_ALIGN * KVP_SEGMENT_ALIGN *
           obj->n_replicas;
}

#endif
