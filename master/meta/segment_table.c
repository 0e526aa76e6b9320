/*
 * segment_table.c - the mounted segments, in a slot array.
 *
 * A segment id is generation << 32 | slot: lookups are O(1), slots are
 * reused after an unmount, and a stale id (from a replica list handed out
 * before the unmount) never resolves to the segment now in its slot.
 *
 * Thread: master loop only.
 */
#include <stdlib.h>
#include <string.h>

#include "master/meta/segment_table.h"
#include "master/meta/limbo.h"
#include "common/grant.h"
#include "common/macros.h"
#include "common/rand.h"

void kvp_segment_table_init(kvp_segment_table_t *table)
{
    memset(table, 0, sizeof(*table));
    table->version = kvp_random_u64() | 1; /* never 0: a client's "knows none" */
}

void kvp_segment_destroy(kvp_segment_t *seg)
{
    if (seg == NULL)
        return;
    kvp_offset_alloc_destroy(seg->alloc);
    kvp_grant_mac_destroy(seg->grant_mac);
    explicit_bzero(&seg->keys, sizeof(seg->keys)); /* (principals' keys derived from its key) */
    kvp_limbo_free(seg->limbo);
    free(seg->rec);
    free(seg->name);
    free(seg->medium);
    free(seg->host_id);
    free(seg->tcp_endpoint);
    free(seg->shm_path);
    free(seg->rdma_endpoint);
    free(seg);
}

struct kvp_cut_lease {
    char *name;
    uint64_t until_ms;
};

void kvp_segment_table_cleanup(kvp_segment_table_t *table)
{
    for (uint32_t i = 0; i < table->n_slots; i++)
        kvp_segment_destroy(table->slots[i]);
    free(table->slots);
    free(table->gens);
    free(table->dirty_ids);
    for (size_t i = 0; i < table->n_cut; i++)
        free(table->cut[i].name);
    free(table->cut);
    memset(table, 0, sizeof(*table));
}

/* Forget the cut leases that are over. */
static void cut_prune(kvp_segment_table_t *table, uint64_t now_ms)
{
    size_t k = 0;
    for (size_t i = 0; i < table->n_cut; i++) {
        if (table->cut[i].until_ms > now_ms)
            table->cut[k++] = table->cut[i];
        else
            free(table->cut[i].name);
    }
    table->n_cut = k;
}

void kvp_segment_table_cut_lease(kvp_segment_table_t *table, const char *name, uint64_t until_ms,
                                 uint64_t now_ms)
{
    cut_prune(table, now_ms);
    if (until_ms <= now_ms)
        return;
    for (size_t i = 0; i < table->n_cut; i++)
        if (strcmp(table->cut[i].name, name) == 0) {
            table->cut[i].until_ms = KVP_MAX(table->cut[i].until_ms, until_ms);
            return;
        }
    char *copy = strdup(name);
    if (copy == NULL)
        return;
    if (table->cut == NULL &&
        (table->cut = calloc(KVP_CUT_LEASES_MAX, sizeof(*table->cut))) == NULL) {
        free(copy);
        return;
    }
    size_t at = table->n_cut;
    if (at == KVP_CUT_LEASES_MAX) { /* full: the one that ends first goes */
        at = 0;
        for (size_t i = 1; i < table->n_cut; i++)
            if (table->cut[i].until_ms < table->cut[at].until_ms)
                at = i;
        free(table->cut[at].name);
    } else {
        table->n_cut++;
    }
    table->cut[at] = (struct kvp_cut_lease){.name = copy, .until_ms = until_ms};
}

uint64_t kvp_segment_table_cut_until(kvp_segment_table_t *table, const char *name, uint64_t now_ms)
{
    cut_prune(table, now_ms);
    for (size_t i = 0; i < table->n_cut; i++)
        if (strcmp(table->cut[i].name, name) == 0)
            return table->cut[i].until_ms;
    return 0;
}

kvp_status_t kvp_segment_table_add(kvp_segment_table_t *table, kvp_segment_t *seg)
{
    /* bounded so that the pool's capacity (an eviction input) can never wrap */
    if (seg->size > KVP_SEGMENT_MAX_SIZE || table->capacity + seg->size > KVP_POOL_MAX_CAPACITY)
        return KVP_ERR_TOO_LARGE;
    if (seg->quiet_until_ms > table->quiet_until_ms)
        table->quiet_until_ms = seg->quiet_until_ms;
    uint32_t slot = 0;
    while (slot < table->n_slots && table->slots[slot] != NULL)
        slot++;
    if (slot == table->n_slots) {
        uint32_t n = table->n_slots ? table->n_slots * 2 : 16;
        kvp_segment_t **slots = realloc(table->slots, n * sizeof(*slots));
        if (slots == NULL)
            return KVP_ERR_NOMEM;
        table->slots = slots;
        uint32_t *gens = realloc(table->gens, n * sizeof(*gens));
        if (gens == NULL)
            return KVP_ERR_NOMEM;
        table->gens = gens;
        for (uint32_t i = table->n_slots; i < n; i++) {
            slots[i] = NULL;
            /* generations start where this table's random version says: a restarted
             * master, or a new leader, does not hand out its predecessor's ids, so an
             * owner's or reader's id from before never names another segment now */
            gens[i] = (uint32_t)(table->version >> 33);
        }
        table->n_slots = n;
    }
    table->gens[slot]++;
    seg->id = ((uint64_t)table->gens[slot] << 32) | slot;
    table->slots[slot] = seg;
    table->count++;
    table->capacity += seg->size;
    if (seg->dfs)
        table->capacity_dfs += seg->size;
    else if (seg->ssd)
        table->capacity_ssd += seg->size;
    table->version++;
    return KVP_OK;
}

kvp_segment_t *kvp_segment_table_get(const kvp_segment_table_t *table, uint64_t id)
{
    uint32_t slot = (uint32_t)id;
    if (slot >= table->n_slots)
        return NULL;
    kvp_segment_t *seg = table->slots[slot];
    return seg != NULL && seg->id == id ? seg : NULL;
}

kvp_segment_t *kvp_segment_table_find_name(const kvp_segment_table_t *table, const char *name)
{
    for (uint32_t i = 0; i < table->n_slots; i++) {
        kvp_segment_t *seg = table->slots[i];
        if (seg != NULL && strcmp(seg->name, name) == 0)
            return seg;
    }
    return NULL;
}

void kvp_segment_table_remove(kvp_segment_table_t *table, kvp_segment_t *seg)
{
    table->records_dirty = true; /* its owner's record poll, if held, is answered: gone */
    uint32_t slot = (uint32_t)seg->id;
    if (slot < table->n_slots && table->slots[slot] == seg) {
        table->slots[slot] = NULL;
        table->count--;
        table->capacity -= seg->size;
        if (seg->dfs)
            table->capacity_dfs -= seg->size;
        else if (seg->ssd)
            table->capacity_ssd -= seg->size;
        table->version++;
    }
    kvp_segment_destroy(seg);
}

uint64_t kvp_segment_used(const kvp_segment_t *seg)
{
    return kvp_offset_alloc_used(seg->alloc);
}

uint64_t kvp_segment_table_used(const kvp_segment_table_t *table)
{
    uint64_t used = 0;
    for (uint32_t i = 0; i < table->n_slots; i++)
        if (table->slots[i] != NULL)
            used += kvp_segment_used(table->slots[i]);
    return used;
}

uint64_t kvp_segment_table_used_tier(const kvp_segment_table_t *table, bool ssd)
{
    uint64_t used = 0;
    for (uint32_t i = 0; i < table->n_slots; i++)
        if (table->slots[i] != NULL && table->slots[i]->ssd == ssd && !table->slots[i]->dfs)
            used += kvp_segment_used(table->slots[i]);
    return used;
}

uint64_t kvp_segment_table_used_dfs(const kvp_segment_table_t *table)
{
    uint64_t used = 0;
    for (uint32_t i = 0; i < table->n_slots; i++)
        if (table->slots[i] != NULL && table->slots[i]->dfs)
            used += kvp_segment_used(table->slots[i]);
    return used;
}

bool kvp_segment_table_replica_on(const kvp_segment_table_t *table, const kvp_replica_t *r,
                                  bool ssd)
{
    const kvp_segment_t *seg = kvp_segment_table_get(table, r->segment_id);
    return seg != NULL && seg->ssd == ssd;
}

bool kvp_segment_table_has_tier(const kvp_segment_table_t *table, const kvp_object_t *obj, bool ssd)
{
    for (unsigned r = 0; r < obj->n_replicas; r++)
        if (kvp_segment_table_replica_on(table, &obj->replicas[r], ssd))
            return true;
    return false;
}

bool kvp_segment_table_on_draining(const kvp_segment_table_t *table, const kvp_object_t *obj)
{
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        const kvp_segment_t *seg = kvp_segment_table_get(table, obj->replicas[r].segment_id);
        if (seg != NULL && seg->draining)
            return true;
    }
    return false;
}
