/*
 * rebuild.c - segments describe themselves: adoption.
 *
 * Design (docs/architecture.md, "Metadata that survives the master"). The
 * master keeps no log. Every segment's owner keeps a record of the COMPLETE
 * objects on its segment: an SSD segment's file (client/ssd/ssd_file.c), a
 * DRAM segment's owner a table in its memory kept current by the master's
 * stream of changes (meta/record.c). After a mount (the master restarted,
 * a new leader took over, or the owner's connection was replaced) the owner
 * offers its record, newest first, and each entry is adopted or refused:
 *   - a key the master does not know, not removed since (tombstones): a new
 *     COMPLETE object, on its home list (hard or soft pin kept);
 *   - the same value (version, size and CRC) as the master's: one more
 *     replica, so copies that come back from several owners merge;
 *   - a newer value than the master's COMPLETE one (an overwrite whose old
 *     copy came back first): the master's goes, the newer one is adopted;
 *   - anything else is stale (an older version, or a put of the key in
 *     flight) and refused, as is an extent that overlaps one adopted
 *     before (entries come newest first, so the newer copy keeps it).
 * Refused entries are counted (stats.adopt_refused) and forgotten by the
 * owner; they are never served. The segment takes no new replica until its
 * owner's offer ends (seg->adopting), so no put can write over a copy that
 * is about to be adopted.
 *
 * Thread: master loop only.
 */
#include "master/ha/rebuild.h"

#include <stdlib.h>
#include <string.h>

#include "master/meta/record.h"
#include "master/policy/lease.h"
#include "master/policy/lists.h"
#include "master/policy/tier.h"

static uint64_t aligned(uint64_t size, uint64_t align)
{
    return (size + align - 1) / align * align;
}

/* The entry is the master's value of the key: one more replica (KVP_ERR_EXISTS when it
 * cannot be one). */
static bool same_value(const kvp_object_t *obj, const kvp_adopt_entry_t *e)
{
    return obj->state == KVP_OBJ_COMPLETE && obj->version == e->version && obj->size == e->size &&
           obj->crc32c == e->crc32c;
}

static kvp_status_t check(kvp_master_state_t *st, const kvp_segment_t *seg, kvp_object_t **obj_p,
                          uint64_t hash, const kvp_adopt_entry_t *e)
{
    kvp_object_t *obj = *obj_p;
    if (obj == NULL)
        return kvp_tombstone_get(&st->tombstones, hash) >= e->version ? KVP_ERR_NOT_FOUND : KVP_OK;
    if (same_value(obj, e)) {
        if (obj->n_replicas >= KVP_MAX_REPLICAS || (obj->flags & KVP_OBJ_F_OFFLOADING))
            return KVP_ERR_EXISTS;
        for (unsigned r = 0; r < obj->n_replicas; r++)
            if (obj->replicas[r].segment_id == seg->id)
                return KVP_ERR_EXISTS;
        return KVP_OK;
    }
    if (obj->state != KVP_OBJ_COMPLETE || obj->version >= e->version ||
        (obj->flags & KVP_OBJ_F_COPYING) != 0)
        return KVP_ERR_EXISTS; /* the master's is newer, or in the making */
    /* ours is newer: the master's value was overwritten before it restarted */
    kvp_object_remove(st, obj);
    *obj_p = NULL;
    return KVP_OK;
}

kvp_status_t kvp_rebuild_adopt(kvp_master_state_t *st, kvp_segment_t *seg,
                               const kvp_adopt_entry_t *e)
{
    uint64_t align = seg->ssd ? 4096 : KVP_SEGMENT_ALIGN;
    uint64_t usable = kvp_segment_usable(seg);
    if (e->version == 0 || e->size == 0 || e->offset % align != 0 || e->offset >= usable ||
        e->size > usable - e->offset || aligned(e->size, align) > usable - e->offset ||
        e->pin > KVP_PIN_HARD || e->key_len == 0 || e->group_len > KVP_GROUP_ID_MAX) {
        st->stats.adopt_refused++;
        return KVP_ERR_INVALID_ARG;
    }
    /* a segment dedicated to a tenant holds that tenant's keys and no other's */
    uint16_t tenant = st->tenants_on ? kvp_tenant_of_key(&st->tenants, e->key, e->key_len) : 0;
    if (seg->dedicated && tenant != seg->tenant) {
        st->stats.adopt_refused++;
        return KVP_ERR_DENIED;
    }
    uint64_t hash = kvp_index_hash(e->key, e->key_len);
    kvp_object_t *obj = kvp_index_lookup(&st->index, e->key, e->key_len, hash);
    if (obj != NULL && same_value(obj, e))
        for (unsigned r = 0; r < obj->n_replicas; r++)
            if (obj->replicas[r].segment_id == seg->id && obj->replicas[r].offset == e->offset) {
                st->stats
                    .adopted++; /* there already: a DFS shard taken over (rpc/segment_calls.c) */
                return KVP_OK;
            }
    kvp_status_t s = check(st, seg, &obj, hash, e);
    kvp_replica_t rep = {.segment_id = seg->id, .offset = e->offset};
    if (s == KVP_OK)
        s = kvp_offset_alloc_reserve(seg->alloc, e->offset, e->size, &rep.handle);
    if (s != KVP_OK) {
        st->stats.adopt_refused++;
        return s == KVP_ERR_NOT_FOUND || s == KVP_ERR_NOMEM ? s : KVP_ERR_EXISTS;
    }
    seg->objects++;
    if (e->version > st->version_clock)
        st->version_clock = e->version;
    if (obj != NULL) {
        kvp_replica_t reps[KVP_MAX_REPLICAS];
        memcpy(reps, obj->replicas, obj->n_replicas * sizeof(reps[0]));
        reps[obj->n_replicas] = rep;
        if (kvp_tier_set_replicas(st, obj, reps, obj->n_replicas + 1u) == NULL) {
            kvp_segment_table_free_extent(&st->segments, &rep);
            return KVP_ERR_NOMEM;
        }
        st->stats.adopted++;
        return KVP_OK;
    }
    /* its group (the tenant's of its key), as the put gave it */
    obj = e->group_len > 0 ? kvp_object_create_grouped(e->key, e->key_len, hash, 1)
                           : kvp_object_create(e->key, e->key_len, hash, 1);
    if (obj != NULL && e->group_len > 0 &&
        kvp_group_join(&st->groups, tenant, e->group, e->group_len, 0, obj) != KVP_OK) {
        free(obj);
        obj = NULL;
    }
    if (obj == NULL) {
        kvp_segment_table_free_extent(&st->segments, &rep);
        return KVP_ERR_NOMEM;
    }
    obj->replicas[0] = rep;
    obj->size = e->size;
    obj->crc32c = e->crc32c;
    obj->version = e->version;
    obj->pin = (uint8_t)e->pin;
    if (e->pin == KVP_PIN_SOFT) {
        uint64_t until = st->now_ms / 1000 + st->config.soft_pin_ttl_s;
        obj->soft_pin_until_s = until > UINT32_MAX ? UINT32_MAX : (uint32_t)until;
    }
    obj->state = KVP_OBJ_COMPLETE;
    obj->tenant = tenant;
    kvp_index_insert(&st->index, obj);
    kvp_state_media_event(st, obj, 0, kvp_state_media(st, obj->replicas, 1)); /* back */
    kvp_policy_move(st, obj, seg->ssd ? KVP_POLICY_SSD : kvp_policy_home(st, obj), false);
    st->stats.adopted++;
    return KVP_OK;
}
