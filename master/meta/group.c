/*
 * group.c - object groups: which indexed objects carry each (tenant, group id).
 *
 * Design (Mooncake's "Optional Object Groups", docs/architecture.md, "Object groups"):
 * a put may name a group per key; the group is a lifecycle hint (a read of one member
 * leases the group: one expiry, policy/lease.c; an eviction of one takes the others that
 * can go), never a transaction.
 * Group ids are interned: an object carries a 4-byte id after its key (KVP_OBJ_F_GROUPED;
 * ungrouped objects carry nothing), and the group keeps its name once and an array of its
 * members (8 bytes each). A group is scoped by its tenant: tenant A's "g" and tenant B's
 * "g" are two groups. A group lives while it has a member (or a hold: an upsert that
 * keeps its group across the removal of the old value); its slot is reused then.
 * Membership follows the index: an object joins when put (kvp_group_join, before it is
 * inserted), leaves when it leaves the index (object_index.c calls kvp_group_leave), and
 * its replacement takes its place (kvp_group_rebind). Each is O(1) whatever the group's
 * size: an object keeps its index in its group's member array after its group id
 * (meta/object.h), a leaving member's place goes to the last member (whose index is fixed
 * up), and a replacement takes the index of what it replaces.
 *
 * Thread: master loop only.
 */
#include "master/meta/group.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static uint64_t group_hash(uint16_t tenant, const char *name, size_t len)
{
    uint64_t h = XXH3_64bits_withSeed(name, len, tenant + 1u);
    return h != 0 ? h : 1;
}

kvp_status_t kvp_group_table_init(kvp_group_table_t *gt)
{
    memset(gt, 0, sizeof(*gt));
    gt->n_buckets = 256;
    gt->buckets = calloc(gt->n_buckets, sizeof(*gt->buckets));
    return gt->buckets != NULL ? KVP_OK : KVP_ERR_NOMEM;
}

void kvp_group_table_cleanup(kvp_group_table_t *gt)
{
    for (uint32_t i = 0; i < gt->n_slots; i++) {
        free(gt->g[i].name);
        free(gt->g[i].members);
    }
    free(gt->g);
    free(gt->buckets);
    memset(gt, 0, sizeof(*gt));
}

uint32_t kvp_group_find(const kvp_group_table_t *gt, uint16_t tenant, const char *name, size_t len)
{
    if (gt->buckets == NULL || len == 0)
        return 0;
    uint64_t h = group_hash(tenant, name, len);
    for (uint32_t id = gt->buckets[h & (gt->n_buckets - 1)]; id != 0; id = gt->g[id - 1].hnext) {
        const kvp_group_t *g = &gt->g[id - 1];
        if (g->hash == h && g->tenant == tenant && g->name_len == len &&
            memcmp(g->name, name, len) == 0)
            return id;
    }
    return 0;
}

static void grow_buckets(kvp_group_table_t *gt)
{
    uint32_t n = gt->n_buckets * 2;
    uint32_t *nb = calloc(n, sizeof(*nb));
    if (nb == NULL)
        return; /* longer chains, still correct */
    for (uint32_t i = 0; i < gt->n_slots; i++) {
        kvp_group_t *g = &gt->g[i];
        if (g->members == NULL)
            continue;
        g->hnext = nb[g->hash & (n - 1)];
        nb[g->hash & (n - 1)] = i + 1;
    }
    free(gt->buckets);
    gt->buckets = nb;
    gt->n_buckets = n;
}

/* A new group (tenant, name) with no member; 0: out of memory. */
static uint32_t group_new(kvp_group_table_t *gt, uint16_t tenant, const char *name, size_t len)
{
    uint32_t id = gt->free_head;
    if (id == 0) {
        if (gt->n_slots == gt->cap) {
            uint32_t cap = gt->cap ? gt->cap * 2 : 64;
            kvp_group_t *g = realloc(gt->g, cap * sizeof(*g));
            if (g == NULL)
                return 0;
            gt->g = g;
            gt->cap = cap;
        }
        memset(&gt->g[gt->n_slots], 0, sizeof(gt->g[0]));
        id = ++gt->n_slots;
    }
    kvp_group_t *g = &gt->g[id - 1];
    char *nm = malloc(len);
    kvp_object_t **m = malloc(4 * sizeof(*m));
    if (nm == NULL || m == NULL) {
        free(nm);
        free(m);
        if (id == gt->n_slots && gt->free_head != id)
            gt->n_slots--; /* (a fresh slot: not kept) */
        return 0;
    }
    if (gt->free_head == id)
        gt->free_head = g->hnext;
    memcpy(nm, name, len);
    *g = (kvp_group_t){.hash = group_hash(tenant, name, len),
                       .name = nm,
                       .name_len = (uint32_t)len,
                       .tenant = tenant,
                       .cap = 4,
                       .members = m};
    if (gt->live >= gt->n_buckets)
        grow_buckets(gt);
    uint32_t b = (uint32_t)(g->hash & (gt->n_buckets - 1));
    g->hnext = gt->buckets[b];
    gt->buckets[b] = id;
    gt->live++;
    return id;
}

/* Group id goes when it has no member and no hold: out of the hash, its slot free. */
static void maybe_free(kvp_group_table_t *gt, uint32_t id)
{
    kvp_group_t *g = &gt->g[id - 1];
    if (g->n != 0 || g->holds != 0)
        return;
    uint32_t *pp = &gt->buckets[g->hash & (gt->n_buckets - 1)];
    while (*pp != 0 && *pp != id)
        pp = &gt->g[*pp - 1].hnext;
    if (*pp == id)
        *pp = g->hnext;
    free(g->name);
    free(g->members);
    memset(g, 0, sizeof(*g));
    g->hnext = gt->free_head;
    gt->free_head = id;
    gt->live--;
}

void kvp_group_hold(kvp_group_table_t *gt, uint32_t id)
{
    kvp_group_t *g = kvp_group_get(gt, id);
    if (g != NULL)
        g->holds++;
}

void kvp_group_drop(kvp_group_table_t *gt, uint32_t id)
{
    kvp_group_t *g = kvp_group_get(gt, id);
    if (g != NULL && g->holds > 0) {
        g->holds--;
        maybe_free(gt, id);
    }
}

kvp_status_t kvp_group_join(kvp_group_table_t *gt, uint16_t tenant, const char *name, size_t len,
                            uint32_t id, kvp_object_t *obj)
{
    if (!(obj->flags & KVP_OBJ_F_GROUPED))
        return KVP_ERR_INVALID_ARG;
    if (name != NULL) {
        if (len == 0 || len > KVP_GROUP_ID_MAX)
            return KVP_ERR_INVALID_ARG;
        id = kvp_group_find(gt, tenant, name, len);
        if (id == 0 && (id = group_new(gt, tenant, name, len)) == 0)
            return KVP_ERR_NOMEM;
    }
    kvp_group_t *g = kvp_group_get(gt, id);
    if (g == NULL)
        return KVP_ERR_INVALID_ARG;
    if (g->n == g->cap) {
        kvp_object_t **m =
            g->cap < UINT32_MAX / 2 ? realloc(g->members, g->cap * 2 * sizeof(*m)) : NULL;
        if (m == NULL) {
            maybe_free(gt, id);
            return KVP_ERR_NOMEM;
        }
        g->members = m;
        g->cap *= 2;
    }
    kvp_object_set_member_index(obj, g->n);
    g->members[g->n++] = obj;
    g->stale = true;
    gt->members++;
    kvp_object_set_group(obj, id);
    return KVP_OK;
}

void kvp_group_leave(kvp_group_table_t *gt, kvp_object_t *obj)
{
    uint32_t id = kvp_object_group(obj);
    kvp_group_t *g = kvp_group_get(gt, id);
    if (g == NULL)
        return;
    /* O(1): obj knows its place; the last member takes it */
    uint32_t i = kvp_object_member_index(obj);
    if (i >= g->n || g->members[i] != obj)
        return; /* not a member (never joined): nothing to take out */
    if (obj->flags & KVP_OBJ_F_GROUP_LEASED) { /* its lease no longer holds the group */
        obj->flags &= (uint8_t)~KVP_OBJ_F_GROUP_LEASED;
        if (g->leased > 0)
            g->leased--;
    }
    kvp_object_t *last = g->members[--g->n];
    g->members[i] = last;
    kvp_object_set_member_index(last, i);
    gt->members--;
    kvp_object_set_group(obj, 0);
    kvp_object_set_member_index(obj, 0);
    if (g->n > 0 && g->n <= g->cap / 4 && g->cap > 4) { /* give back what a big group took */
        kvp_object_t **m = realloc(g->members, g->cap / 2 * sizeof(*m));
        if (m != NULL) {
            g->members = m;
            g->cap /= 2;
        }
    }
    maybe_free(gt, id);
}

void kvp_group_rebind(kvp_group_table_t *gt, const kvp_object_t *obj, kvp_object_t *repl)
{
    kvp_group_t *g = kvp_group_get(gt, kvp_object_group(obj));
    if (g == NULL)
        return;
    uint32_t i = kvp_object_member_index(obj);
    if (i < g->n && g->members[i] == obj) {
        g->members[i] = repl;
        kvp_object_set_group(repl, kvp_object_group(obj));
        kvp_object_set_member_index(repl, i);
    }
}
