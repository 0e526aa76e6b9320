/*
 * object_index.c - key -> object hash table.
 *
 * Chained buckets (power of two), XXH3-64 of the key, the full hash kept in
 * the object so that a chain walk compares 8 bytes before the key and a
 * resize never rehashes a key. The hash is seeded (kvp_index_hash_seed: the master draws
 * one at start), so that a writer cannot pick keys that all land in one bucket and make
 * every lookup, and a List page's one bucket, walk them all; nothing outside the process
 * sees or keeps it. The table doubles when count > buckets.
 * Every object is also on one doubly linked list: PENDING objects on the
 * pending list (oldest first: put timeouts, a dead writer's puts, no scan),
 * COMPLETE objects on one of the eviction policy's lists (probation,
 * protected, soft and hard pins, being read; which one: obj->policy, see
 * eviction.c).
 *
 * Thread: master loop only.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "master/meta/object_index.h"

#include "master/meta/group.h"

kvp_status_t kvp_index_init(kvp_object_index_t *index)
{
    memset(index, 0, sizeof(*index));
    index->n_buckets = 1024;
    index->buckets = calloc(index->n_buckets, sizeof(*index->buckets));
    return index->buckets ? KVP_OK : KVP_ERR_NOMEM;
}

void kvp_index_cleanup(kvp_object_index_t *index)
{
    for (uint64_t b = 0; b < index->n_buckets; b++) {
        kvp_object_t *obj = index->buckets[b];
        while (obj != NULL) {
            kvp_object_t *next = obj->hnext;
            free(obj);
            obj = next;
        }
    }
    free(index->buckets);
    memset(index, 0, sizeof(*index));
}

static uint64_t index_seed;

void kvp_index_hash_seed(uint64_t seed)
{
    index_seed = seed;
}

uint64_t kvp_index_hash(const char *key, size_t len)
{
    return XXH3_64bits_withSeed(key, len, index_seed);
}

kvp_object_t *kvp_index_lookup(const kvp_object_index_t *index, const char *key, size_t len,
                               uint64_t hash)
{
    for (kvp_object_t *obj = index->buckets[hash & (index->n_buckets - 1)]; obj != NULL;
         obj = obj->hnext) {
        if (obj->hash == hash && obj->key_len == len && memcmp(kvp_object_key(obj), key, len) == 0)
            return obj;
    }
    return NULL;
}

static void grow(kvp_object_index_t *index)
{
    uint64_t n = index->n_buckets * 2;
    kvp_object_t **nb = calloc(n, sizeof(*nb));
    if (nb == NULL)
        return; /* keep the old table: longer chains, still correct */
    for (uint64_t b = 0; b < index->n_buckets; b++) {
        kvp_object_t *obj = index->buckets[b];
        while (obj != NULL) {
            kvp_object_t *next = obj->hnext;
            uint64_t nbk = obj->hash & (n - 1);
            obj->hnext = nb[nbk];
            nb[nbk] = obj;
            obj = next;
        }
    }
    free(index->buckets);
    index->buckets = nb;
    index->n_buckets = n;
}

void kvp_object_list_append(kvp_object_list_t *l, kvp_object_t *obj)
{
    l->n++;
    obj->lnext = NULL;
    obj->lprev = l->tail;
    if (l->tail)
        l->tail->lnext = obj;
    else
        l->head = obj;
    l->tail = obj;
}

void kvp_object_list_prepend(kvp_object_list_t *l, kvp_object_t *obj)
{
    l->n++;
    obj->lprev = NULL;
    obj->lnext = l->head;
    if (l->head)
        l->head->lprev = obj;
    else
        l->tail = obj;
    l->head = obj;
}

void kvp_object_list_remove(kvp_object_list_t *l, kvp_object_t *obj)
{
    l->n--;
    if (l->cursor == obj)
        l->cursor = obj->lnext;
    if (obj->lprev)
        obj->lprev->lnext = obj->lnext;
    else
        l->head = obj->lnext;
    if (obj->lnext)
        obj->lnext->lprev = obj->lprev;
    else
        l->tail = obj->lprev;
    obj->lprev = obj->lnext = NULL;
}

kvp_object_list_t *kvp_index_policy_list(kvp_object_index_t *index, const kvp_object_t *obj)
{
    switch (obj->policy & KVP_POLICY_LIST_MASK) {
    case KVP_POLICY_PROTECTED:
        return &index->protected;
    case KVP_POLICY_PINNED:
        return &index->pinned;
    case KVP_POLICY_SOFT:
        return &index->soft;
    case KVP_POLICY_READING:
        return &index->reading;
    case KVP_POLICY_SSD:
        return &index->ssd;
    case KVP_POLICY_OFFLOADING:
        return &index->offloading;
    default:
        return &index->probation;
    }
}

/* Every object is on exactly one list: pending, or a policy list (COMPLETE). */
static void lists_link(kvp_object_index_t *index, kvp_object_t *obj)
{
    if (obj->state == KVP_OBJ_PENDING) {
        kvp_object_list_append(&index->pending_list, obj);
        index->pending++;
        return;
    }
    /* a newly COMPLETE object: probation (the policy may move it), pins aside */
    obj->policy = obj->pin == KVP_PIN_HARD   ? KVP_POLICY_PINNED
                  : obj->pin == KVP_PIN_SOFT ? KVP_POLICY_SOFT
                                             : KVP_POLICY_PROBATION;
    kvp_object_list_append(kvp_index_policy_list(index, obj), obj);
}

static void lists_unlink(kvp_object_index_t *index, kvp_object_t *obj)
{
    if (obj->state == KVP_OBJ_PENDING) {
        kvp_object_list_remove(&index->pending_list, obj);
        index->pending--;
    } else {
        kvp_object_list_remove(kvp_index_policy_list(index, obj), obj);
    }
}

void kvp_index_insert(kvp_object_index_t *index, kvp_object_t *obj)
{
    if (index->count >= index->n_buckets)
        grow(index);
    uint64_t b = obj->hash & (index->n_buckets - 1);
    obj->hnext = index->buckets[b];
    index->buckets[b] = obj;
    index->count++;
    lists_link(index, obj);
    kvp_index_charge(index, obj, +1);
}

void kvp_index_unlink(kvp_object_index_t *index, kvp_object_t *obj)
{
    kvp_object_t **pp = &index->buckets[obj->hash & (index->n_buckets - 1)];
    while (*pp != NULL && *pp != obj)
        pp = &(*pp)->hnext;
    if (*pp == NULL)
        return;
    *pp = obj->hnext;
    obj->hnext = NULL;
    index->count--;
    lists_unlink(index, obj);
    kvp_index_charge(index, obj, -1);
    if (index->groups != NULL && (obj->flags & KVP_OBJ_F_GROUPED))
        kvp_group_leave(index->groups, obj);
}

void kvp_index_set_state(kvp_object_index_t *index, kvp_object_t *obj, kvp_obj_state_t state)
{
    if (obj->state == state)
        return;
    lists_unlink(index, obj);
    kvp_index_charge_pending(index, obj, -1);
    obj->state = (uint8_t)state;
    kvp_index_charge_pending(index, obj, +1);
    lists_link(index, obj);
}

void kvp_index_replace(kvp_object_index_t *index, kvp_object_t *obj, kvp_object_t *repl)
{
    kvp_object_t **pp = &index->buckets[obj->hash & (index->n_buckets - 1)];
    while (*pp != NULL && *pp != obj)
        pp = &(*pp)->hnext;
    if (*pp == obj)
        *pp = repl;
    repl->hnext = obj->hnext;
    kvp_object_list_t *l =
        obj->state == KVP_OBJ_PENDING ? &index->pending_list : kvp_index_policy_list(index, obj);
    if (l->cursor == obj)
        l->cursor = repl;
    repl->lprev = obj->lprev;
    repl->lnext = obj->lnext;
    if (obj->lprev != NULL)
        obj->lprev->lnext = repl;
    else if (l->head == obj)
        l->head = repl;
    if (obj->lnext != NULL)
        obj->lnext->lprev = repl;
    else if (l->tail == obj)
        l->tail = repl;
    if (index->groups != NULL && (obj->flags & KVP_OBJ_F_GROUPED))
        kvp_group_rebind(index->groups, obj, repl);
}

static kvp_object_t *create(const char *key, size_t len, uint64_t hash, unsigned n_replicas,
                            size_t extra)
{
    kvp_object_t *obj = malloc(sizeof(*obj) + n_replicas * sizeof(kvp_replica_t) + len + extra);
    if (obj == NULL)
        return NULL;
    memset(obj, 0, sizeof(*obj));
    obj->hash = hash;
    obj->key_len = (uint16_t)len;
    obj->n_replicas = (uint8_t)n_replicas;
    memcpy((char *)&obj->replicas[n_replicas], key, len);
    return obj;
}

kvp_object_t *kvp_object_create(const char *key, size_t len, uint64_t hash, unsigned n_replicas)
{
    return create(key, len, hash, n_replicas, 0);
}

kvp_object_t *kvp_object_create_grouped(const char *key, size_t len, uint64_t hash,
                                        unsigned n_replicas)
{
    kvp_object_t *obj = create(key, len, hash, n_replicas, KVP_OBJ_GROUP_TAIL);
    if (obj != NULL) {
        obj->flags = KVP_OBJ_F_GROUPED;
        kvp_object_set_group(obj, 0);
        kvp_object_set_member_index(obj, 0);
    }
    return obj;
}

void kvp_index_foreach_remove(kvp_object_index_t *index, kvp_index_visit_cb_t cb, void *arg)
{
    for (uint64_t b = 0; b < index->n_buckets; b++) {
        kvp_object_t **pp = &index->buckets[b];
        while (*pp != NULL) {
            kvp_object_t *obj = *pp;
            if (cb(obj, arg)) {
                *pp = obj->hnext;
                obj->hnext = NULL;
                index->count--;
                lists_unlink(index, obj);
                kvp_index_charge(index, obj, -1);
                if (index->groups != NULL && (obj->flags & KVP_OBJ_F_GROUPED))
                    kvp_group_leave(index->groups, obj);
                free(obj);
                continue;
            }
            pp = &obj->hnext;
        }
    }
}
