/*
 * group.h - object groups (Mooncake's ReplicateConfig.group_ids): the current members of
 * each (tenant, group id) pair, so a read of one member leases them all and an eviction
 * of one takes the others (see group.c).
 */
#ifndef KVP_MASTER_META_GROUP_H
#define KVP_MASTER_META_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "master/meta/object.h"

/* A group id's bytes at most (a longer one: KVP_ERR_INVALID_ARG). */
#define KVP_GROUP_ID_MAX 1024u

typedef struct kvp_group {
    uint64_t hash; /* of (tenant, name); 0 with members == NULL: a free slot */
    char *name;    /* name_len bytes, not NUL-terminated */
    uint32_t name_len;
    uint16_t tenant;       /* its tenant's id (meta/tenant.h) */
    uint32_t hnext;        /* hash chain: the next slot + 1; 0: none */
    uint32_t n, cap;       /* members[n] */
    uint32_t holds;        /* kvp_group_hold()s not yet dropped: kept while empty */
    bool stale;            /* a member joined since the last lease refresh */
    uint64_t refreshed_ms; /* when the group lease was last counted as refreshed */
    /* members with a read lease slot (KVP_OBJ_F_GROUP_LEASED): eviction passes the group
     * over while any, O(1) (policy/lease.c keeps it) */
    uint32_t leased;
    /* the group lease (a read or lookup of a member): eviction passes every member over
     * until then, no member touched (policy/lease.c) */
    uint64_t lease_until_ms;
    kvp_object_t **members; /* the indexed objects that carry this group; each knows its
                             * index here (kvp_object_member_index) */
} kvp_group_t;

typedef struct kvp_group_table {
    kvp_group_t *g; /* [n_slots]; an object's group id is its slot + 1 */
    uint32_t n_slots, cap;
    uint32_t free_head; /* a free slot + 1; 0: none (free slots chain through hnext) */
    uint32_t *buckets;  /* [n_buckets] slot + 1; 0: none */
    uint32_t n_buckets; /* power of two */
    uint32_t live;      /* groups with members (or held) */
    uint64_t members;   /* objects in groups */
} kvp_group_table_t;

kvp_status_t kvp_group_table_init(kvp_group_table_t *gt);
void kvp_group_table_cleanup(kvp_group_table_t *gt);

/* The group (tenant, name), 0: none. */
uint32_t kvp_group_find(const kvp_group_table_t *gt, uint16_t tenant, const char *name, size_t len);
static inline kvp_group_t *kvp_group_get(kvp_group_table_t *gt, uint32_t id)
{
    return id != 0 && id <= gt->n_slots && gt->g[id - 1].members != NULL ? &gt->g[id - 1] : NULL;
}
/* Keep group id (0: nothing) even while it has no member, until kvp_group_drop. */
void kvp_group_hold(kvp_group_table_t *gt, uint32_t id);
void kvp_group_drop(kvp_group_table_t *gt, uint32_t id);

/*
 * obj (made with kvp_object_create_grouped, not in a group yet) joins (tenant, name), made
 * when new; or group id `id` when name is NULL. Sets obj's group. KVP_ERR_NOMEM,
 * KVP_ERR_INVALID_ARG (an empty or too long name).
 */
kvp_status_t kvp_group_join(kvp_group_table_t *gt, uint16_t tenant, const char *name, size_t len,
                            uint32_t id, kvp_object_t *obj);
/* obj leaves its group (a group left with no member and no hold goes). O(1): obj's index
 * in the member array (meta/object.h) names its place, which the last member takes; an
 * object that is not a member there is left alone. */
void kvp_group_leave(kvp_group_table_t *gt, kvp_object_t *obj);
/* obj was replaced by repl (a new allocation, same group): repl takes obj's place and
 * index. O(1). */
void kvp_group_rebind(kvp_group_table_t *gt, const kvp_object_t *obj, kvp_object_t *repl);

#endif
