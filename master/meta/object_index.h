/*
 * object_index.h - key -> object hash table and the object lists (see
 * object_index.c).
 */
#ifndef KVP_MASTER_META_OBJECT_INDEX_H
#define KVP_MASTER_META_OBJECT_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "master/meta/object.h"

typedef struct kvp_object_list {
    kvp_object_t *head; /* oldest (the evict end) */
    kvp_object_t *tail; /* newest */
    uint64_t n;
    /* a walk continued over loop turns stands here (the next object it visits): an object
     * unlinked or replaced there moves it on (NULL: none, or the walk's end) */
    kvp_object_t *cursor;
} kvp_object_list_t;

/* obj->policy of a COMPLETE object: the list it is on (policy/lists.c). */
#define KVP_POLICY_PROBATION 0u  /* put, not read since */
#define KVP_POLICY_PROTECTED 1u  /* read at least once (or back from the ghost) */
#define KVP_POLICY_PINNED 2u     /* hard-pinned: never a victim, never scanned */
#define KVP_POLICY_SOFT 3u       /* soft-pinned: victims only when nothing else is left */
#define KVP_POLICY_READING 4u    /* being read (a lease held): never a victim, never scanned */
#define KVP_POLICY_SSD 5u        /* on the SSD tier only: the SSD tier's LRU (policy/tier.c) */
#define KVP_POLICY_OFFLOADING 6u /* being offloaded to SSD: never a victim, never scanned */
#define KVP_POLICY_LIST_MASK 7u

typedef struct kvp_object_index {
    kvp_object_t **buckets;
    uint64_t n_buckets;             /* power of two */
    uint64_t count;                 /* all objects */
    uint64_t pending;               /* PENDING objects */
    uint64_t pending_bytes;         /* the bytes their extents take (kvp_object_bytes) */
    kvp_object_list_t pending_list; /* PENDING objects, oldest first (put timeouts) */
    kvp_object_list_t probation;    /* COMPLETE: eviction policy lists (policy/lists.c) */
    kvp_object_list_t protected;
    kvp_object_list_t pinned;
    kvp_object_list_t soft;
    kvp_object_list_t reading;
    kvp_object_list_t ssd;
    kvp_object_list_t offloading;
    /* what an object in the index is charged to its tenant: called with +1 when one is
     * inserted, -1 when one leaves (master/core/state.c sets it; NULL: nothing is charged).
     * Who changes an indexed object's replicas in place calls kvp_index_charge around. */
    void (*charge)(void *arg, const kvp_object_t *obj, int sign);
    void *charge_arg;
    /* object groups (meta/group.h; NULL: none): a grouped object leaves its group when it
     * leaves the index, and its replacement (kvp_index_replace) takes its place there */
    struct kvp_group_table *groups;
} kvp_object_index_t;

/* index->pending_bytes, for a PENDING obj coming (+1) or going (-1) */
static inline void kvp_index_charge_pending(kvp_object_index_t *index, const kvp_object_t *obj,
                                            int sign)
{
    if (obj->state == KVP_OBJ_PENDING)
        index->pending_bytes += (uint64_t)(int64_t)sign * kvp_object_bytes(obj);
}

static inline void kvp_index_charge(kvp_object_index_t *index, const kvp_object_t *obj, int sign)
{
    kvp_index_charge_pending(index, obj, sign);
    if (index->charge != NULL)
        index->charge(index->charge_arg, obj, sign);
}

kvp_status_t kvp_index_init(kvp_object_index_t *index);
/* Frees every object (not their extents: the caller frees allocators). */
void kvp_index_cleanup(kvp_object_index_t *index);
/* The seed of kvp_index_hash: set once, before any key is hashed (the master: a random one
 * at start; 0 until then). */
void kvp_index_hash_seed(uint64_t seed);
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
/* Put `repl` (a new allocation, same key) where `obj` is: hash chain and list. Does not
 * free obj. */
void kvp_index_replace(kvp_object_index_t *index, kvp_object_t *obj, kvp_object_t *repl);
/* Allocate an object with room for n replicas and the key. */
kvp_object_t *kvp_object_create(const char *key, size_t len, uint64_t hash, unsigned n_replicas);
/* The same with room for a group id after the key (KVP_OBJ_F_GROUPED; group 0 until it
 * joins one, kvp_group_join). */
kvp_object_t *kvp_object_create_grouped(const char *key, size_t len, uint64_t hash,
                                        unsigned n_replicas);

/*
 * Visit every object. When cb returns true the object is unlinked and its
 * memory freed; cb must already have released whatever extents it still holds.
 */
typedef bool (*kvp_index_visit_cb_t)(kvp_object_t *obj, void *arg);
void kvp_index_foreach_remove(kvp_object_index_t *index, kvp_index_visit_cb_t cb, void *arg);

#endif
