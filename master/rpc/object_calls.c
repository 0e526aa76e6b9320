/*
 * object_calls.c - the master's object RPCs: PutStart, PutEnd, PutRevoke, Remove,
 * Exist, GetReplicaList, GetSize, LeaseRelease; and the revoke of a closed
 * connection's unfinished puts.
 *
 * Design: object life: PutStart creates a PENDING object (invisible to get,
 * exist, size) holding its extents, evicting (policy/eviction.c) when the
 * pool is full; PutEnd by the same connection makes it COMPLETE with its
 * CRC32C; PutRevoke, the put timeout or the writer's connection closing
 * frees it. GetReplicaList grants a read lease per object (policy/lease.c)
 * that LeaseRelease (one-way) ends, from its owner only: the caller's
 * principal (any of its connections) with an ACL, else the caller's
 * connection; another's release is ignored, counted and logged. Batches
 * are handled last key first (the eviction policy's chain order); each
 * key's answer is its own.
 *
 * Thread: master loop only.
 */
#include "master/rpc/object_calls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/grant.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/rpc.h"
#include "master/meta/placement.h"
#include "master/meta/record.h"
#include "master/policy/eviction.h"
#include "master/policy/hot_keys.h"
#include "master/policy/lease.h"
#include "master/policy/lists.h"
#include "master/policy/tier.h"
#include "master/rpc/reply.h"

static void set_pin(kvp_master_state_t *st, kvp_object_t *obj, const kvp_placement_req_t *preq)
{
    obj->pin = (uint8_t)preq->pin;
    obj->soft_pin_until_s = 0;
    if (preq->pin == KVP_PIN_SOFT) {
        /* whole seconds, rounded up so a pin never ends early; saturating, so a huge
         * TTL means "as long as possible" rather than wrapping to the past */
        uint64_t ttl = preq->soft_pin_ttl_s ? preq->soft_pin_ttl_s : st->config.soft_pin_ttl_s;
        uint64_t until = (st->now_ms + 999) / 1000 + ttl;
        obj->soft_pin_until_s = until > UINT32_MAX ? UINT32_MAX : (uint32_t)until;
    }
}

/*
 * Bytes that the reads now in flight give back when they end: removed objects kept for
 * their readers are freed then; a live object becomes evictable again, unless eviction is
 * off, it is hard-pinned or it is on a draining segment. O(reads in flight): a full pool
 * only, once per PutStart batch (*cache_p, -1: not yet computed).
 */
static uint64_t reads_give_back(kvp_master_state_t *st, int64_t *cache_p)
{
    if (*cache_p >= 0)
        return (uint64_t)*cache_p;
    uint64_t bytes = 0;
    const kvp_lease_table_t *t = &st->leases;
    for (uint32_t i = t->head; i != UINT32_MAX; i = t->slots[i].next) {
        const kvp_object_t *obj = t->slots[i].obj;
        if (obj->state == KVP_OBJ_RETIRED || (st->config.evict && obj->pin != KVP_PIN_HARD &&
                                              !kvp_segment_table_on_draining(&st->segments, obj)))
            bytes += t->slots[i].bytes;
    }
    *cache_p = (int64_t)bytes;
    return bytes;
}

/* Which quota of the putting tenant this put would pass ("objects", "DRAM", "SSD"), or
 * "closed" (the admin API deleted its policy: nothing is admitted); NULL: none. Charged:
 * every replica asked for, on the tier the put goes to. */
static const char *over_quota(const kvp_master_state_t *st, const kvp_placement_req_t *preq,
                              uint64_t size)
{
    const kvp_tenant_t *t = &st->tenants.t[preq->tenant];
    uint64_t bytes = size * (preq->replica_num ? preq->replica_num : 1);
    if (t->closed)
        return "closed";
    if (t->max_objects != 0 && t->objects + 1 > t->max_objects)
        return "objects";
    if (!preq->ssd && !kvp_tenant_dram_fits(t, bytes))
        return "DRAM";
    if (preq->ssd && t->max_ssd != 0 && (bytes > t->max_ssd || t->ssd_bytes > t->max_ssd - bytes))
        return "SSD";
    /* a DFS replica is disk bytes: max-ssd covers it */
    if (preq->dfs_extra && t->max_ssd != 0 &&
        (size > t->max_ssd || t->ssd_bytes > t->max_ssd - size))
        return "DFS";
    return NULL;
}

/* Why a put got KVP_ERR_QUOTA (PutStartResponse.message). */
static void quota_message(const kvp_master_state_t *st, const kvp_placement_req_t *preq,
                          uint64_t size, char *buf, size_t len)
{
    const kvp_tenant_t *t = &st->tenants.t[preq->tenant];
    const char *which = over_quota(st, preq, size);
    if (which == NULL)
        which = "objects"; /* (not reached: the quota that refused is still full) */
    bool dfs = strcmp(which, "DFS") == 0, disk = preq->ssd || dfs;
    if (strcmp(which, "closed") == 0)
        snprintf(buf, len,
                 "tenant %s has no quota policy: its admission is closed (DELETE "
                 "/api/v1/tenant_quotas); an admin's PUT of a quota opens it again",
                 t->name);
    else if (strcmp(which, "objects") == 0)
        snprintf(buf, len, "tenant %s is at its quota of objects: %llu of max-objects %llu",
                 t->name, (unsigned long long)t->objects, (unsigned long long)t->max_objects);
    else
        snprintf(
            buf, len,
            "tenant %s is over its %s quota: %llu of max-%s %llu bytes used, this put "
            "needs %llu more",
            t->name, which, (unsigned long long)(disk ? t->ssd_bytes : t->dram_bytes),
            disk ? "ssd" : "dram", (unsigned long long)(disk ? t->max_ssd : t->max_dram),
            (unsigned long long)(dfs ? size : size * (preq->replica_num ? preq->replica_num : 1)));
}

/* Would no DFS segment take an object of size now (the DFS part of a put refused)? */
static bool dfs_short(const kvp_master_state_t *st, uint64_t size, uint16_t tenant)
{
    const kvp_segment_table_t *t = &st->segments;
    for (uint32_t i = 0; i < t->n_slots; i++) {
        const kvp_segment_t *seg = t->slots[i];
        if (seg != NULL && seg->dfs && kvp_segment_open(seg) &&
            (!seg->dedicated || seg->tenant == tenant) &&
            kvp_segment_usable(seg) - kvp_segment_used(seg) >= size)
            return false;
    }
    return true;
}

/* The DFS replica of a put (dfs_replica_num 1) after its memory ones: reps[*n_p] on a DFS
 * segment. No DFS segment mounted: KVP_ERR_UNSUPPORTED; none with room: KVP_ERR_POOL_FULL
 * (the DFS tier evicts nothing for a put: Mooncake's NO_AVAILABLE_HANDLE); bigger than every
 * DFS segment: KVP_ERR_TOO_LARGE. On failure the memory extents are freed too. */
static kvp_status_t put_dfs_replica(kvp_master_state_t *st, const kvp_placement_req_t *r,
                                    kvp_replica_t *reps, unsigned *n_p)
{
    kvp_placement_req_t d = {.size = r->size,
                             .replica_num = 1,
                             .ssd = true,
                             .dfs = true,
                             .tenant = r->tenant,
                             .dedicated_first = r->dedicated_first};
    unsigned nd = 0;
    kvp_status_t status = *n_p < KVP_MAX_REPLICAS
                              ? kvp_placement_alloc(&st->segments, &d, &st->rng, &reps[*n_p], &nd)
                              : KVP_ERR_INVALID_ARG;
    /* no extent (a fragmented DFS): free DFS copies (--dfs-eviction) and try again */
    while (status == KVP_ERR_POOL_FULL && st->config.dfs_evict) {
        uint64_t used = kvp_tier_dfs_used(st, r->tenant);
        if (kvp_tier_evict_dfs_to(st, used > r->size ? used - r->size : 0, r->tenant) == 0)
            break;
        status = kvp_placement_alloc(&st->segments, &d, &st->rng, &reps[*n_p], &nd);
    }
    if (status == KVP_OK) {
        *n_p += nd;
        return KVP_OK;
    }
    for (unsigned i = 0; i < *n_p; i++) {
        kvp_segment_t *seg = kvp_segment_table_get(&st->segments, reps[i].segment_id);
        kvp_offset_alloc_free(seg->alloc, reps[i].handle);
        seg->objects--;
    }
    if (status == KVP_ERR_NO_SEGMENT)
        return KVP_ERR_UNSUPPORTED;
    st->stats.dfs_full++;
    return status;
}

/* Is group id `cur` (0: none) the one a put names (empty: none)? */
static bool same_group(kvp_master_state_t *st, uint32_t cur, const ProtobufCBinaryData *group)
{
    const kvp_group_t *g = kvp_group_get(&st->groups, cur);
    if (g == NULL)
        return group->len == 0;
    return group->len == g->name_len && memcmp(group->data, g->name, g->name_len) == 0;
}

/* Upsert of obj (COMPLETE) by a put of `size`: when the size is the same, nobody reads it,
 * no copy of it is in flight and its replicas are where the put wants them, its extents are
 * rewritten in place: obj is PENDING (so invisible) for conn_id, as a new put's object, and
 * true. false: it cannot be; nothing changed. */
static bool upsert_in_place(kvp_master_state_t *st, uint64_t conn_id, kvp_object_t *obj,
                            uint64_t size, const kvp_placement_req_t *preq)
{
    if (obj->size != size || kvp_leased(st, obj) || (obj->flags & KVP_OBJ_F_COPYING) != 0 ||
        preq->ssd || preq->dfs_extra || kvp_segment_table_has_tier(&st->segments, obj, true) ||
        kvp_segment_table_on_draining(&st->segments, obj) ||
        obj->n_replicas < (preq->replica_num ? preq->replica_num : 1))
        return false;
    /* a replica on a segment the writer could not reach lately: placed anew, elsewhere */
    for (unsigned r = 0; r < obj->n_replicas; r++)
        if (kvp_placement_avoids(preq, obj->replicas[r].segment_id))
            return false;
    kvp_group_t *g = kvp_group_get(&st->groups, kvp_object_group(obj));
    if (g != NULL)
        g->stale = true;       /* a member without a lease: the next read leases it again */
    kvp_lease_forget(st, obj); /* a lease whose TTL is over: its slot goes */
    kvp_record_forget(&st->segments, obj); /* the bytes are about to change */
    kvp_state_object_gone(st, obj);        /* absent until PutEnd (KV events) */
    kvp_index_set_state(&st->index, obj, KVP_OBJ_PENDING);
    obj->writer_conn_id = conn_id;
    obj->deadline_ms = st->now_ms + st->config.put_timeout_ms;
    obj->version = kvp_tier_next_version(st);
    set_pin(st, obj, preq);
    return true;
}

/* A put with a DFS replica: is there DFS room for `size` (DFS copies freed for it, least
 * recently used first, with --dfs-eviction)? KVP_OK; UNSUPPORTED: no DFS segment; POOL_BUSY:
 * the segments of a master just restarted still offer what they hold (the client asks
 * again, as for DRAM); POOL_FULL. */
static kvp_status_t dfs_room(kvp_master_state_t *st, const kvp_placement_req_t *preq, uint64_t size)
{
    if (st->segments.capacity_dfs == 0)
        return KVP_ERR_UNSUPPORTED;
    if (st->now_ms < st->rebuild_until_ms && dfs_short(st, size, preq->tenant)) {
        st->stats.lease_waits++;
        return KVP_ERR_POOL_BUSY;
    }
    while (st->config.dfs_evict && dfs_short(st, size, preq->tenant)) {
        uint64_t used = kvp_tier_dfs_used(st, preq->tenant);
        if (kvp_tier_evict_dfs_to(st, used > size ? used - size : 0, preq->tenant) == 0)
            break;
    }
    if (dfs_short(st, size, preq->tenant)) {
        st->stats.dfs_full++;
        return KVP_ERR_POOL_FULL;
    }
    return KVP_OK;
}

/* The extents of a new object (r: the put's placement, r->size its size) into reps, *n_p of
 * them, the DFS replica r asks for among them: evicting for room as the policy says, or
 * POOL_BUSY when the room comes back by itself (a master just restarted, reads or offloads
 * in flight: the client asks again). On failure nothing is held. */
static kvp_status_t put_place(kvp_master_state_t *st, const kvp_placement_req_t *r,
                              int64_t *give_back_p, kvp_replica_t *reps, unsigned *n_p)
{
    uint64_t size = r->size;
    kvp_status_t status = kvp_placement_alloc(&st->segments, r, &st->rng, reps, n_p);
    /* Just restarted (or just elected): the segments are still remounting and offering
     * what they hold. Neither evict what came back nor fail: the client asks again. */
    if ((status == KVP_ERR_POOL_FULL || status == KVP_ERR_NO_SEGMENT) &&
        st->now_ms < st->rebuild_until_ms) {
        st->stats.lease_waits++;
        return KVP_ERR_POOL_BUSY;
    }
    /* A segment mounted again takes nothing for a moment (segment_table.h): wait for it
     * rather than evict elsewhere. */
    if ((status == KVP_ERR_POOL_FULL || status == KVP_ERR_NO_SEGMENT) &&
        st->segments.quiet_until_ms != 0 && kvp_now_ms() < st->segments.quiet_until_ms) {
        st->stats.lease_waits++;
        return KVP_ERR_POOL_BUSY;
    }
    /* No room: evict this object's worth (policy order) and try again. Free bytes are
     * not a free extent: in a fragmented segment the freed space may be scattered, so
     * keep evicting until the object fits or nothing evictable is left. Eviction is of
     * the tier the put goes to; DRAM victims may go to SSD (offload, policy/tier.c),
     * which frees their room only when the copy is durable. */
    uint64_t need = size * (r->replica_num ? r->replica_num : 1);
    while (status == KVP_ERR_POOL_FULL) {
        /* leases whose TTL is over first: what they free may be enough by itself */
        uint64_t before = kvp_segment_table_used_tier(&st->segments, r->ssd);
        kvp_lease_expire(st);
        uint64_t used = kvp_segment_table_used_tier(&st->segments, r->ssd);
        /* a DRAM put that will wait for offloads has more of them started than it needs,
         * so the SSD owners never wait for the next victims between batches */
        uint64_t want = need + (r->ssd ? 0 : kvp_tier_offload_ahead(st));
        uint64_t target = used > want ? used - want : 0;
        uint64_t freed = r->ssd ? kvp_tier_evict_ssd_to(st, target) : kvp_evict_to(st, target);
        if (freed == 0 && used == before)
            break;
        status = kvp_placement_alloc(&st->segments, r, &st->rng, reps, n_p);
    }
    /* Nothing evictable is left. If the reads (or offloads) in flight give back enough
     * room when they end, the client waits and asks again (bounded by its timeout). */
    if (status == KVP_ERR_POOL_FULL &&
        ((!r->ssd && (st->offloading_bytes > 0 || kvp_tier_ssd_adopting(st))) ||
         reads_give_back(st, give_back_p) >= need)) {
        st->stats.lease_waits++;
        return KVP_ERR_POOL_BUSY;
    }
    if (status == KVP_OK && r->dfs_extra)
        status = put_dfs_replica(st, r, reps, n_p);
    return status;
}

/* A new PENDING object of `size` under key (len bytes, hashed), for conn_id: its extents
 * placed for preq (quota, DFS room, eviction), or with a hold the hold's (taken: the hold
 * leaves the index, its extents are the new object's). group as put_start_key's; held: a
 * group held for it (0: none). */
static kvp_status_t put_create(kvp_master_state_t *st, uint64_t conn_id, const char *key,
                               size_t len, uint64_t hash, uint64_t size,
                               const kvp_placement_req_t *preq, const ProtobufCBinaryData *group,
                               uint32_t held, int64_t *give_back_p, kvp_object_t *hold,
                               bool is_hold, kvp_object_t **obj_p)
{
    kvp_status_t status;
    kvp_replica_t reps[KVP_MAX_REPLICAS];
    unsigned n = 0;
    kvp_placement_req_t r = *preq;
    r.size = size;
    if (hold != NULL) {
        const kvp_tenant_t *t = &st->tenants.t[preq->tenant];
        if (t->closed || (t->max_objects != 0 && t->objects + 1 > t->max_objects)) {
            st->tenants.t[preq->tenant].refused_quota++;
            return KVP_ERR_QUOTA; /* (the hold stays the writer's) */
        }
        n = hold->n_replicas;
        memcpy(reps, hold->replicas, n * sizeof(reps[0]));
    } else {
        if (over_quota(st, preq, size) != NULL) {
            if (!is_hold) /* (room ahead refused is no put refused) */
                st->tenants.t[preq->tenant].refused_quota++;
            return KVP_ERR_QUOTA;
        }
        /* no DFS room for it: refused before DRAM evicts anything for its memory replicas */
        if (preq->dfs_extra && (status = dfs_room(st, preq, size)) != KVP_OK)
            return status;
        status = put_place(st, &r, give_back_p, reps, &n);
        if (status != KVP_OK)
            return status;
        if (preq->dfs_extra)
            st->stats.dfs_puts++;
    }
    bool grouped = group != NULL ? group->len > 0 : held != 0;
    kvp_object_t *obj = grouped ? kvp_object_create_grouped(key, len, hash, n)
                                : kvp_object_create(key, len, hash, n);
    if (obj != NULL && grouped &&
        kvp_group_join(&st->groups, r.tenant, group != NULL ? (const char *)group->data : NULL,
                       group != NULL ? group->len : 0, held, obj) != KVP_OK) {
        free(obj);
        obj = NULL;
    }
    if (obj == NULL) {
        for (unsigned i = 0; i < n && hold == NULL; i++) {
            kvp_segment_t *seg = kvp_segment_table_get(&st->segments, reps[i].segment_id);
            kvp_offset_alloc_free(seg->alloc, reps[i].handle);
            seg->objects--;
        }
        return KVP_ERR_NOMEM;
    }
    if (hold != NULL) { /* its extents are obj's now: the hold goes, nothing freed */
        kvp_index_unlink(&st->index, hold);
        free(hold);
    }
    memcpy(obj->replicas, reps, n * sizeof(reps[0]));
    obj->size = size;
    obj->version = kvp_tier_next_version(st);
    obj->state = KVP_OBJ_PENDING;
    obj->tenant = r.tenant;
    obj->writer_conn_id = conn_id;
    obj->deadline_ms = st->now_ms + st->config.put_timeout_ms;
    if (is_hold)
        obj->flags |= KVP_OBJ_F_HOLD;
    set_pin(st, obj, preq);
    kvp_index_insert(&st->index, obj);
    *obj_p = obj;
    return KVP_OK;
}

/* group: the group this key's put names (NULL: none named, an upsert keeps the object's;
 * empty: ungrouped). *held_p: a group held for the new object (the caller drops it). hold:
 * the hold whose extents the object takes (PUT_COMMIT; never an upsert in place), or NULL. */
static kvp_status_t put_start_key(kvp_master_state_t *st, uint64_t conn_id,
                                  const ProtobufCBinaryData *key, uint64_t size,
                                  const kvp_placement_req_t *preq, const ProtobufCBinaryData *group,
                                  int64_t *give_back_p, uint32_t *held_p, kvp_object_t *hold,
                                  kvp_object_t **obj_p)
{
    kvp_object_t *obj;
    uint64_t hash;
    kvp_status_t status = kvp_call_key_lookup(st, key, &obj, &hash);
    if (status != KVP_OK)
        return status;
    if (size == 0)
        return KVP_ERR_INVALID_ARG;
    if (obj != NULL && obj->state != KVP_OBJ_COMPLETE)
        return KVP_ERR_PENDING;
    if (obj != NULL && !preq->upsert)
        return KVP_ERR_EXISTS;
    /* group membership is immutable while the object exists (Mooncake's UpsertStart:
     * INVALID_PARAMS): an upsert may keep its group, not move or clear it */
    if (obj != NULL && group != NULL && !same_group(st, kvp_object_group(obj), group)) {
        st->stats.group_refused++;
        return KVP_ERR_INVALID_ARG;
    }
    if (obj != NULL) {
        /* Upsert: in place when it can be; otherwise the old object goes now (its extents
         * stay until readers' leases end) and the new one gets extents of its own. Either
         * way the key is absent until PutEnd, and absent for good if the new put fails. */
        if (hold == NULL && upsert_in_place(st, conn_id, obj, size, preq)) {
            *obj_p = obj;
            return KVP_OK;
        }
        /* the new value keeps the old one's group, even when it was its last member */
        *held_p = kvp_object_group(obj);
        kvp_group_hold(&st->groups, *held_p);
        kvp_object_remove(st, obj);
    }
    return put_create(st, conn_id, (const char *)key->data, key->len, hash, size, preq, group,
                      *held_p, give_back_p, hold, false, obj_p);
}

static kvp_status_t put_start_one(kvp_master_state_t *st, uint64_t conn_id,
                                  const ProtobufCBinaryData *key, uint64_t size,
                                  const kvp_placement_req_t *preq, const ProtobufCBinaryData *group,
                                  int64_t *give_back_p, kvp_object_t **obj_p)
{
    uint32_t held = 0;
    kvp_status_t s =
        put_start_key(st, conn_id, key, size, preq, group, give_back_p, &held, NULL, obj_p);
    kvp_group_drop(&st->groups, held);
    return s;
}

/* What holds a pool that has no room left (PutStartResponse.message). */
static void pool_full_message(kvp_master_state_t *st, char *buf, size_t len)
{
    uint64_t pending = st->index.pending_bytes;
    uint64_t used = kvp_master_used(st);
    uint64_t other = used - KVP_MIN(used, pending + st->leases.bytes);
    snprintf(buf, len,
             "pool full: %llu of %llu bytes used: %llu by reads in flight (%u objects), %llu by "
             "puts not yet ended (%llu objects; %llu bytes of it held ahead for writers), %llu "
             "by %s; or the free room is too fragmented for the object",
             (unsigned long long)used, (unsigned long long)st->segments.capacity,
             (unsigned long long)st->leases.bytes, st->leases.live, (unsigned long long)pending,
             (unsigned long long)st->index.pending, (unsigned long long)st->held_bytes,
             (unsigned long long)other,
             st->config.evict ? "pinned objects or objects on draining segments"
                              : "stored objects (eviction is off: --no-eviction)");
}

/* Why the DFS replica of a put was refused (PutStartResponse.message). */
static void dfs_message(const kvp_master_state_t *st, kvp_status_t status, char *buf, size_t len)
{
    if (status == KVP_ERR_UNSUPPORTED)
        snprintf(buf, len,
                 "dfs_replica_num 1 but no DFS segment is mounted (kvpool serve "
                 "--dfs-path DIR --dfs-size N): nothing stored");
    else
        snprintf(buf, len,
                 "DFS full: %llu of %llu bytes of the DFS segments used, and a DFS replica is "
                 "never made by evicting another one: nothing stored (remove objects with DFS "
                 "replicas or mount a larger --dfs-size)",
                 (unsigned long long)kvp_segment_table_used_dfs(&st->segments),
                 (unsigned long long)st->segments.capacity_dfs);
}

/* A put's options (PutConfig; NULL: the defaults) into preq; KVP_ERR_INVALID_ARG for a
 * medium that is neither dram nor ssd. */
static kvp_status_t put_config(kvp_master_state_t *st, const Kvpool__PutConfig *cfg,
                               kvp_placement_req_t *preq)
{
    *preq = (kvp_placement_req_t){.replica_num = 1};
    if (cfg != NULL) {
        preq->replica_num = cfg->replica_num ? cfg->replica_num : 1;
        if (cfg->pin <= KVP_PIN_HARD)
            preq->pin = cfg->pin;
        preq->soft_pin_ttl_s = cfg->soft_pin_ttl_s;
        preq->upsert = cfg->upsert;
        if (strcmp(cfg->medium, "ssd") == 0)
            preq->ssd = true;
        else if (cfg->medium[0] != '\0' && strcmp(cfg->medium, "dram") != 0)
            return KVP_ERR_INVALID_ARG;
        /* Mooncake's dfs_replica_num: 0 or 1, and a DFS replica goes with memory ones */
        if (cfg->dfs_replica_num > 1 || (cfg->dfs_replica_num == 1 && preq->ssd))
            return KVP_ERR_INVALID_ARG;
        preq->dfs_extra = cfg->dfs_replica_num == 1;
        if (cfg->preferred_segment[0] != '\0')
            preq->preferred = kvp_segment_table_find_name(&st->segments, cfg->preferred_segment);
        for (size_t i = 0; i < cfg->n_preferred_segments && i < 8; i++)
            preq->preferred_list[preq->n_preferred_list++] =
                kvp_segment_table_find_name(&st->segments, cfg->preferred_segments[i]);
        preq->avoid = cfg->avoid_segments;
        preq->n_avoid = (unsigned)KVP_MIN(cfg->n_avoid_segments, (size_t)8);
    }
    if (preq->replica_num > KVP_MAX_REPLICAS - (preq->dfs_extra ? 1u : 0u))
        preq->replica_num = KVP_MAX_REPLICAS - (preq->dfs_extra ? 1u : 0u);
    return KVP_OK;
}

/* A PutStart not answered: undo the PENDING objects it created (its results). req_arg: the
 * request; NULL when its connection closed while it was under way (held_drop): the close
 * revokes the connection's PENDING puts. */
static void put_start_end(kvp_reply_t *r, kvp_status_t rc, void *req_arg)
{
    const Kvpool__PutStartRequest *req = req_arg;
    const Kvpool__PutStartResponse *resp = (const Kvpool__PutStartResponse *)r->resp;
    kvp_master_state_t *st = r->call->st;
    for (size_t i = 0; rc != KVP_OK && req != NULL && i < resp->n_results; i++) {
        if (resp->results[i] == NULL || resp->results[i]->status != KVP_OK)
            continue;
        kvp_object_t *obj;
        if (kvp_call_key_lookup(st, &req->keys[i], &obj, NULL) == KVP_OK && obj != NULL &&
            obj->state == KVP_OBJ_PENDING && obj->writer_conn_id == r->call->conn_id) {
            kvp_index_unlink(&st->index, obj);
            kvp_object_release(st, obj);
        }
    }
}

/*
 * Budget of one loop turn for a batch of keys (PutStart, GetReplicaList, and keys_batch's
 * PutEnd, PutRevoke, Remove, Exist): up to 65536 keys' work, KEYS_TURN_NS of it at most in
 * one call, with the server's leave (st->may_continue); the call is made again with the same
 * request at its connection's next turn (st->call_again; the request stays in the
 * connection's input, and the connection's later requests wait behind it), so that no batch
 * holds the loop, every other caller, for longer.
 */
#define KEYS_TURN_NS (4ull * 1000000ull)

/* A turn's budget: KEYS_TURN_NS, or the state's own (st->keys_turn_ns: the unit tests make
 * turns short enough that a batch of cheap keys still spans several, whatever the machine). */
static uint64_t keys_turn_ns(const kvp_master_state_t *st)
{
    return st->keys_turn_ns != 0 ? st->keys_turn_ns : KEYS_TURN_NS;
}
#define KEYS_TURN_CHECK 64u /* keys between two looks at the clock */

/* Time to stop this turn (looked at every KEYS_TURN_CHECK keys)? */
static bool turn_over(const kvp_master_state_t *st, unsigned *since, uint64_t stop)
{
    if (!st->may_continue || ++*since < KEYS_TURN_CHECK)
        return false;
    *since = 0;
    return kvp_now_ns() >= stop;
}

/*
 * A PutStart's or GetReplicaList's answer while it is built: the response, its arrays (the
 * results, their replicas), the segments they name, the keys done. On the handler's stack
 * while the batch fits in one turn; past it, in a held_t until the connection's next turn.
 */
typedef struct listing {
    kvp_reply_t r;
    union {
        ProtobufCMessage base;
        Kvpool__PutStartResponse ps;
        Kvpool__GetReplicaListResponse gr;
    } resp;
    void *res;             /* PutStartResult or GetReplicaResult, one per key */
    Kvpool__Replica *reps; /* the replicas they name */
    Kvpool__Replica **repptr;
    size_t n, done, nr; /* keys; keys done; replicas used */
    bool quota_said;
} listing_t;

/*
 * A listing held between turns, one per connection. The grants its replicas point to (the
 * state's grant buffer, reserved for the whole batch) go with it, and come back into the
 * state at the next turn. The segments table may change meanwhile: the descriptors are
 * filled again from it at each turn, and one gone ends the batch (held_resume).
 */
typedef struct held {
    struct held *next;
    const kvp_master_state_t *st;
    uint64_t conn_id;
    kvp_rpc_method_t method;
    struct kvp_grant *grants;
    size_t grants_cap;
    uint64_t grants_ms;
    kvp_call_t call; /* st and conn_id, for its end when the connection closes */
    listing_t l;
} held_t;

static held_t *helds;

/* The listing this connection has under way for `method` of n keys, taken off the list;
 * NULL: none (one of another request, if any, is ended: never answered now). */
static held_t *held_take(kvp_master_state_t *st, uint64_t conn_id, kvp_rpc_method_t method,
                         size_t n);

/* Keep l (on the stack, or h's already) for the connection's next turn and tell the server
 * so; false: no memory to wait with (l is still whole: it is answered now). */
static bool held_keep(kvp_call_t *call, held_t *h, listing_t *l, kvp_rpc_method_t method)
{
    kvp_master_state_t *st = call->st;
    if (h == NULL) {
        if ((h = malloc(sizeof(*h))) == NULL)
            return false;
        h->l = *l;
        h->l.r.resp = &h->l.resp.base;
    }
    h->next = helds;
    h->st = st;
    h->conn_id = call->conn_id;
    h->method = method;
    h->call = (kvp_call_t){.st = st, .conn_id = call->conn_id};
    h->l.r.call = &h->call;
    h->l.r.end_arg = NULL;
    h->grants = st->grant_buf;
    h->grants_cap = st->grant_cap;
    h->grants_ms = st->grant_now_ms;
    st->grant_buf = NULL;
    st->grant_cap = 0;
    helds = h;
    st->stats.keys_continued[method]++;
    st->call_again = true;
    return true;
}

/* End h unanswered (its end undoes what it granted) and free it. */
static void held_drop(held_t *h)
{
    (void)kvp_reply_abort(&h->l.r);
    free(h->grants);
    free(h);
}

static held_t *held_take(kvp_master_state_t *st, uint64_t conn_id, kvp_rpc_method_t method,
                         size_t n)
{
    for (held_t **pp = &helds; *pp != NULL; pp = &(*pp)->next) {
        held_t *h = *pp;
        if (h->st != st || h->conn_id != conn_id)
            continue;
        *pp = h->next;
        if (st->call_again && h->method == method && h->l.n == n)
            return h;
        held_drop(h);
        return NULL;
    }
    return NULL;
}

/* h's listing back for this turn's call: its grants into the state, its segments'
 * descriptors filled again. false: one of its segments is gone (h's end undid what it
 * made or granted, and left its response with no result, for a status of its own). */
static bool held_resume(kvp_call_t *call, held_t *h, void *end_arg)
{
    kvp_master_state_t *st = call->st;
    listing_t *l = &h->l;
    free(st->grant_buf);
    st->grant_buf = h->grants;
    st->grant_cap = h->grants_cap;
    st->grant_now_ms = h->grants_ms;
    h->grants = NULL;
    l->r.call = call;
    l->r.end_arg = end_arg;
    for (size_t d = 0; d < l->r.segs.n; d++) {
        const kvp_segment_t *seg = kvp_segment_table_get(&st->segments, l->r.segs.descs[d].id);
        if (seg == NULL) {
            l->r.end_cb(&l->r, KVP_ERR_SEGMENT_GONE, end_arg);
            l->r.end_cb = NULL;
            return false;
        }
        kvp_seg_desc_fill(&l->r.segs.descs[d], seg);
    }
    return true;
}

/* The answer to a batch whose segment left while it was under way. */
static kvp_status_t held_gone(listing_t *l, held_t *h, size_t *n_results, size_t *n_segments)
{
    *n_results = 0;
    *n_segments = 0; /* (the segments collected are released as the reply ends) */
    kvp_status_t rc = kvp_reply_fail(&l->r, KVP_ERR_SEGMENT_GONE,
                                     l->r.text_max > 0 ? "a segment left while this batch was "
                                                         "under way: nothing of it was kept"
                                                       : NULL);
    free(h);
    return rc;
}

/* A PutStart's per-key loop, from key l->done on, for this turn; false: held for the next. */
static bool put_start_keys(kvp_call_t *call, const Kvpool__PutStartRequest *req,
                           kvp_placement_req_t *preq, listing_t *l, held_t *h)
{
    kvp_master_state_t *st = call->st;
    Kvpool__PutStartResult *res = l->res;
    int64_t give_back = -1; /* what reads in flight give back: once a turn, if needed */
    uint64_t stop = kvp_now_ns() + keys_turn_ns(st);
    unsigned since = 0;
    for (size_t i = l->done; i < l->n; i = ++l->done) {
        if (turn_over(st, &since, stop) && held_keep(call, h, l, KVP_RPC_PUT_START))
            return false;
        kvpool__put_start_result__init(&res[i]);
        l->resp.ps.results[i] = &res[i];
        kvp_object_t *obj = NULL;
        res[i].status =
            put_start_one(st, call->conn_id, &req->keys[i], req->sizes[i], preq,
                          req->n_group_ids ? &req->group_ids[i] : NULL, &give_back, &obj);
        kvp_reply_t *r = &l->r;
        if (preq->dfs_extra && r->text[0] == '\0' &&
            (res[i].status == KVP_ERR_UNSUPPORTED ||
             ((res[i].status == KVP_ERR_POOL_FULL || res[i].status == KVP_ERR_TOO_LARGE) &&
              dfs_short(st, req->sizes[i], preq->tenant))))
            dfs_message(st, res[i].status, r->text, r->text_max);
        if ((res[i].status == KVP_ERR_POOL_FULL || res[i].status == KVP_ERR_POOL_BUSY) &&
            r->text[0] == '\0')
            pool_full_message(st, r->text, r->text_max);
        if (res[i].status == KVP_ERR_QUOTA && !l->quota_said) { /* the quota's words first */
            quota_message(st, preq, req->sizes[i], r->text, r->text_max);
            l->quota_said = true;
            KVP_LOG_WARN_LIMITED("put refused (principal %s): %s", call->who->name, r->text);
        }
        if (res[i].status != KVP_OK)
            continue;
        res[i].replicas = &l->repptr[l->nr];
        res[i].n_replicas = obj->n_replicas;
        res[i].version = obj->version; /* named again by its PutEnd, PutRevoke or commit */
        /* write grants: good while the put may stay PENDING */
        if (!kvp_call_add_replicas(call, obj, l->reps, l->repptr, &l->nr, &r->segs, KVP_GRANT_WRITE,
                                   st->config.put_timeout_ms)) {
            l->done = SIZE_MAX; /* (its object undone with the rest: kvp_reply_abort) */
            return true;
        }
    }
    return true;
}

kvp_status_t kvp_handle_put_start(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__PutStartRequest *req = (Kvpool__PutStartRequest *)req_msg;
    held_t *h = held_take(st, call->conn_id, KVP_RPC_PUT_START, req->n_keys);
    st->call_again = false;
    listing_t local, *l = h != NULL ? &h->l : &local;
    kvp_placement_req_t preq;
    int32_t status = kvp_call_check_batch(req->n_keys);
    if (status == KVP_OK && req->n_sizes != req->n_keys)
        status = KVP_ERR_INVALID_ARG;
    /* group ids: none (every key as before), or one per key (Mooncake: INVALID_PARAMS) */
    if (status == KVP_OK && req->n_group_ids != 0 && req->n_group_ids != req->n_keys)
        status = KVP_ERR_INVALID_ARG;
    for (size_t i = 0; status == KVP_OK && i < req->n_group_ids; i++)
        if (req->group_ids[i].len > KVP_GROUP_ID_MAX)
            status = KVP_ERR_INVALID_ARG;
    if (status != KVP_OK && req->n_group_ids != 0)
        st->stats.group_refused++;
    /* an unknown medium: the status alone (PutStart has always answered it without a
     * message); each turn again: the request's config is decoded anew, segments looked up */
    if (status == KVP_OK)
        status = put_config(st, req->config, &preq);
    preq.tenant = call->who != NULL && st->tenants_on ? call->who->tenant_id : 0;
    preq.dedicated_first = st->tenants.t[preq.tenant].dedicated > 0;
    if (h != NULL && !held_resume(call, h, req))
        return held_gone(l, h, &l->resp.ps.n_results, &l->resp.ps.n_segments);
    if (h == NULL) {
        memset(l, 0, sizeof(*l));
        l->resp.ps = (Kvpool__PutStartResponse)KVPOOL__PUT_START_RESPONSE__INIT;
        kvp_reply_init(&l->r, call, &l->resp.base, 384);
        if (status != KVP_OK)
            return kvp_reply_fail(&l->r, status, NULL);
        size_t n = l->n = req->n_keys;
        l->res = kvp_reply_calloc(&l->r, n, sizeof(Kvpool__PutStartResult));
        Kvpool__PutStartResult **resptr = kvp_reply_calloc(&l->r, n, sizeof(*resptr));
        /* an in-place upsert answers with the existing object's replicas */
        size_t per_key = preq.upsert ? KVP_MAX_REPLICAS : preq.replica_num + preq.dfs_extra;
        /* uninitialised: each one used is initialised; a calloc this large (tens of KiB)
         * made the allocator hand back zeroed pages, a madvise and page faults on every call */
        l->reps = kvp_reply_alloc(&l->r, n * per_key + 1, sizeof(*l->reps));
        l->repptr = kvp_reply_calloc(&l->r, n * per_key + 1, sizeof(*l->repptr));
        if (!l->res || !resptr || !l->reps || !l->repptr ||
            !kvp_call_grants_reserve(st, n * per_key))
            return kvp_reply_abort(&l->r);
        l->resp.ps.n_results = n;
        l->resp.ps.results = resptr;
        l->resp.ps.put_timeout_ms = st->config.put_timeout_ms;
        kvp_reply_on_end(&l->r, put_start_end, req);
    }
    if (!put_start_keys(call, req, &preq, l, h))
        return KVP_OK; /* (held: answered at a later turn) */
    kvp_status_t rc;
    if (l->done == SIZE_MAX || !kvp_reply_segments(&l->r)) {
        rc = kvp_reply_abort(&l->r);
    } else {
        kvp_evict_if_needed(st);
        rc = kvp_reply_send(&l->r);
    }
    free(h); /* (its listing's arrays were the reply's: released as it ended) */
    return rc;
}

/* One key of a keys batch; arg: what the method's handler passed (PutEnd: its request;
 * ReplicaClear: the segment's name), i the key's index. */
typedef kvp_status_t (*key_op_fn_t)(kvp_master_state_t *st, uint64_t conn_id,
                                    const ProtobufCBinaryData *key, const void *arg, size_t i,
                                    bool force);

/* The object under a wire key; KVP_ERR_NOT_FOUND when there is none. */
static kvp_status_t existing(kvp_master_state_t *st, const ProtobufCBinaryData *key,
                             kvp_object_t **obj_p)
{
    kvp_status_t status = kvp_call_key_lookup(st, key, obj_p, NULL);
    if (status == KVP_OK && *obj_p == NULL)
        status = KVP_ERR_NOT_FOUND;
    return status;
}

/* The PENDING object this connection is writing under key (PutEnd, PutRevoke): the put of
 * `version` (its PutStart's answer; 0: whichever). Another put's (the connection's threads
 * share it; the one named died with its segment and another took the key): NOT_FOUND, the
 * named put is gone. */
static kvp_status_t own_pending(kvp_master_state_t *st, uint64_t conn_id,
                                const ProtobufCBinaryData *key, uint64_t version,
                                kvp_object_t **obj_p)
{
    kvp_status_t status = existing(st, key, obj_p);
    if (status != KVP_OK)
        return status;
    if ((*obj_p)->state != KVP_OBJ_PENDING)
        return KVP_ERR_NOT_PENDING;
    if ((*obj_p)->writer_conn_id != conn_id)
        return KVP_ERR_NOT_OWNER;
    if (version != 0 && (*obj_p)->version != version)
        return KVP_ERR_NOT_FOUND;
    return KVP_OK;
}

static kvp_status_t op_put_end(kvp_master_state_t *st, uint64_t conn_id,
                               const ProtobufCBinaryData *key, const void *arg, size_t i,
                               bool force)
{
    const Kvpool__PutEndRequest *end = arg;
    (void)force;
    kvp_object_t *obj;
    uint64_t version = end->n_versions > i ? end->versions[i] : 0;
    kvp_status_t status = own_pending(st, conn_id, key, version, &obj);
    if (status != KVP_OK)
        return status;
    /* Best effort per replica: keep what was written (bit r: replica r of PutStart's
     * answer; no mask: all), free the rest, and drop tombstones of replicas whose
     * segment went away meanwhile. */
    uint32_t mask = end->n_written_mask > 0 ? end->written_mask[i] : UINT32_MAX;
    /* a DFS replica not written fails the whole put (Mooncake: the put succeeds only once
     * its DFS write did): no object is left without the replica it was asked with */
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        const kvp_segment_t *seg =
            kvp_segment_table_get(&st->segments, obj->replicas[r].segment_id);
        if (seg != NULL && seg->dfs && !(mask & (1u << r)))
            mask = 0;
    }
    unsigned w = 0;
    kvp_index_charge(&st->index, obj, -1); /* its replicas change: charged again below */
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        if (obj->replicas[r].segment_id != 0 && (mask & (1u << r)))
            obj->replicas[w++] = obj->replicas[r];
        else if (obj->replicas[r].segment_id != 0)
            kvp_segment_table_free_extent(&st->segments, &obj->replicas[r]);
    }
    if (w > 0 && w < obj->n_replicas) {
        memmove((char *)&obj->replicas[w], kvp_object_key(obj), kvp_object_tail_len(obj));
        obj->n_replicas = (uint8_t)w;
    }
    kvp_index_charge(&st->index, obj, +1);
    if (w == 0) {
        kvp_index_unlink(&st->index, obj);
        free(obj);
        return KVP_ERR_IO;
    }
    obj->crc32c = end->crc32c[i];
    obj->deadline_ms = 0;
    obj->lease = 0; /* from now on: lease slot and policy state, not the writer */
    obj->policy = 0;
    kvp_index_set_state(&st->index, obj, KVP_OBJ_COMPLETE);
    st->stats.puts++;
    kvp_state_media_event(st, obj, 0, kvp_state_media(st, obj->replicas, obj->n_replicas));
    kvp_policy_put(st, obj, end->n_keys > 1 && i + 1 == end->n_keys);
    if (st->config.lease_on_put)
        kvp_lease_grant(st, obj, KVP_LEASE_NOBODY); /* Mooncake's: it ends by the TTL */
    kvp_record_object(&st->segments, obj); /* DRAM owners' records, in the same loop turn */
    kvp_tier_on_put_end(st, obj);          /* replicas on SSD get recorded by their owners */
    return KVP_OK;
}

static kvp_status_t op_put_revoke(kvp_master_state_t *st, uint64_t conn_id,
                                  const ProtobufCBinaryData *key, const void *arg, size_t i,
                                  bool force)
{
    const Kvpool__KeysRequest *req = arg;
    (void)force;
    kvp_object_t *obj;
    uint64_t version = req != NULL && req->n_versions > i ? req->versions[i] : 0;
    kvp_status_t status = own_pending(st, conn_id, key, version, &obj);
    if (status != KVP_OK)
        return status;
    kvp_index_unlink(&st->index, obj);
    kvp_object_release(st, obj);
    return KVP_OK;
}

static kvp_status_t op_remove(kvp_master_state_t *st, uint64_t conn_id,
                              const ProtobufCBinaryData *key, const void *arg, size_t i, bool force)
{
    (void)conn_id, (void)arg, (void)i, (void)force;
    kvp_object_t *obj;
    uint64_t hash;
    kvp_status_t status = kvp_call_key_lookup(st, key, &obj, &hash);
    if (status != KVP_OK)
        return status;
    if (obj == NULL) {
        /* a copy an SSD segment's owner (down now) kept must not come back */
        kvp_tombstone_add(&st->tombstones, hash, kvp_tier_next_version(st));
        return KVP_ERR_NOT_FOUND;
    }
    if (obj->state == KVP_OBJ_PENDING)
        return KVP_ERR_PENDING;
    if (kvp_leased(st, obj) && !force) {
        st->stats.lease_waits++;
        return KVP_ERR_LEASED;
    }
    kvp_tombstone_add(&st->tombstones, hash, kvp_tier_next_version(st));
    kvp_object_remove(st, obj);
    st->stats.removes++;
    return KVP_OK;
}

static kvp_status_t op_exist(kvp_master_state_t *st, uint64_t conn_id,
                             const ProtobufCBinaryData *key, const void *arg, size_t i, bool force)
{
    (void)conn_id, (void)arg, (void)i, (void)force;
    kvp_object_t *obj;
    kvp_status_t status = kvp_call_key_lookup(st, key, &obj, NULL);
    if (status != KVP_OK)
        return status;
    st->stats.exists++;
    if (obj == NULL || obj->state != KVP_OBJ_COMPLETE)
        return 0;
    /* a grouped object's lookup leases its whole group (Mooncake's ExistKey) */
    bool grouped = kvp_object_group(obj) != 0;
    if (st->config.lease_on_exist || grouped)
        kvp_lease_grant(st, obj, KVP_LEASE_NOBODY); /* it ends by the TTL */
    if (grouped)
        kvp_lease_group(st, obj);
    return 1;
}

/*
 * A keys batch (PutEnd, PutRevoke, Remove, Exist) goes on over turns as a PutStart does
 * (KEYS_TURN_NS). What it answered so far waits here, one per connection: 4 bytes a key of
 * a request its connection holds anyway.
 */

typedef struct keys_cont {
    struct keys_cont *next;
    const kvp_master_state_t *st;
    uint64_t conn_id;
    key_op_fn_t fn; /* (NULL: GetSize) */
    kvp_rpc_method_t method;
    size_t n_keys, width; /* keys; bytes of one answer (a status, GetSize's size) */
    size_t left;          /* steps still to do (keys [0, left), or with forward the last left) */
    unsigned char out[];
} keys_cont_t;

static keys_cont_t *keys_conts;

/* The batch this connection has under way (taken off the list); NULL: none. */
static keys_cont_t *cont_take(const kvp_master_state_t *st, uint64_t conn_id)
{
    for (keys_cont_t **pp = &keys_conts; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->st == st && (*pp)->conn_id == conn_id) {
            keys_cont_t *k = *pp;
            *pp = k->next;
            return k;
        }
    return NULL;
}

/* This very request again (the server says so): where it stopped; NULL: a request of its
 * own (anything kept for another is dropped). */
static keys_cont_t *cont_again(kvp_master_state_t *st, uint64_t conn_id, key_op_fn_t fn,
                               kvp_rpc_method_t method, size_t n_keys)
{
    keys_cont_t *k = cont_take(st, conn_id);
    if (k != NULL &&
        (!st->call_again || k->fn != fn || k->method != method || k->n_keys != n_keys)) {
        free(k);
        k = NULL;
    }
    st->call_again = false;
    return k;
}

/* left keys not done at the budget's end: keep what out answered for the next call
 * and tell the server so (st->call_again). false: no memory to wait with. */
static bool cont_keep(kvp_call_t *call, keys_cont_t *k, key_op_fn_t fn, const void *out,
                      size_t width, size_t n_keys, size_t left, kvp_rpc_method_t method)
{
    if (k == NULL && (k = malloc(sizeof(*k) + n_keys * width)) == NULL)
        return false;
    *k = (keys_cont_t){.next = keys_conts,
                       .st = call->st,
                       .conn_id = call->conn_id,
                       .fn = fn,
                       .method = method,
                       .n_keys = n_keys,
                       .width = width,
                       .left = left};
    memcpy(k->out, out, n_keys * width); /* (the keys not done yet: not read) */
    keys_conts = k;
    call->st->stats.keys_continued[method]++;
    call->st->call_again = true;
    return true;
}

/* Per-key statuses for PutEnd/PutRevoke/Remove/Exist/ReplicaClear: one loop, one answer
 * (continued at later turns past KEYS_TURN_NS). arg: fn's (key_op_fn_t). Last key first
 * (the eviction policy sees a chain's first block last, so it ends up the most recent:
 * policy/lists.c), or with forward first key first (a key named twice in a Remove: its
 * first place removes, the later ones are not found, as Mooncake answers). */
static kvp_status_t keys_batch(kvp_call_t *call, ProtobufCBinaryData *keys, size_t n_keys,
                               const void *arg, bool force, key_op_fn_t fn, kvp_rpc_method_t method,
                               bool forward)
{
    Kvpool__StatusesResponse resp = KVPOOL__STATUSES_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    kvp_master_state_t *st = call->st;
    /* this very request again (the server says so): where it stopped */
    keys_cont_t *k = cont_again(st, call->conn_id, fn, method, n_keys);
    int32_t status = kvp_call_check_batch(n_keys);
    int32_t *out = status == KVP_OK ? kvp_reply_statuses(&r, n_keys) : NULL;
    if (out == NULL) {
        free(k);
        return status != KVP_OK ? kvp_reply_fail(&r, status, NULL) : kvp_reply_abort(&r);
    }
    size_t i = n_keys;
    if (k != NULL) { /* what its earlier calls answered */
        memcpy(out, k->out, n_keys * sizeof(*out));
        i = k->left;
    }
    uint64_t stop = kvp_now_ns() + keys_turn_ns(st);
    for (unsigned since = 0; i > 0; i--) {
        if (st->may_continue && ++since == KEYS_TURN_CHECK) {
            since = 0;
            if (kvp_now_ns() >= stop &&
                cont_keep(call, k, fn, out, sizeof(*out), n_keys, i, method)) {
                (void)kvp_reply_abort(&r); /* (no answer yet: its array goes) */
                return KVP_OK;
            }
        }
        size_t j = forward ? n_keys - i : i - 1;
        out[j] = fn(st, call->conn_id, &keys[j], arg, j, force);
    }
    free(k);
    return kvp_reply_send(&r);
}

kvp_status_t kvp_handle_put_end(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    Kvpool__PutEndRequest *req = (Kvpool__PutEndRequest *)req_msg;
    size_t n = req->n_keys;
    if (req->n_crc32c != n || (req->n_written_mask != 0 && req->n_written_mask != n) ||
        (req->n_versions != 0 && req->n_versions != n)) {
        Kvpool__StatusesResponse resp = KVPOOL__STATUSES_RESPONSE__INIT;
        kvp_reply_t r;
        kvp_reply_init(&r, call, &resp.base, 0);
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, NULL);
    }
    return keys_batch(call, req->keys, n, req, false, op_put_end, KVP_RPC_PUT_END, false);
}

kvp_status_t kvp_handle_put_revoke(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    Kvpool__KeysRequest *req = (Kvpool__KeysRequest *)req_msg;
    if (req->n_versions != 0 && req->n_versions != req->n_keys) {
        Kvpool__StatusesResponse resp = KVPOOL__STATUSES_RESPONSE__INIT;
        kvp_reply_t r;
        kvp_reply_init(&r, call, &resp.base, 0);
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, NULL); /* (a version per key, or none) */
    }
    return keys_batch(call, req->keys, req->n_keys, req, req->force, op_put_revoke,
                      KVP_RPC_PUT_REVOKE, false);
}

/*
 * PUT_COMMIT: a batch's puts ended, and room held ahead for the next, in one round trip
 * (docs/architecture.md "A put in one round trip"). A hold is a PENDING object of the
 * caller's connection under a key no request can name (a NUL first: no wire key has one,
 * and the connection's id): placed, charged to the tenant, evicted for and timed out as a
 * put's (not revoked with its connection: kvp_object_conn_closed). A key committed with a hold
 * takes the hold's extents as a PutStart would have placed them (the same checks on the key:
 * EXISTS, PENDING, an upsert's group) and ends as PutEnd ends it, in the same turn: the writer's
 * bytes are in, so it is visible when the answer goes, never before.
 */
#define HOLD_ASK_MAX 1024u    /* holds one answer hands out, at most */
#define HOLD_POOL_SHARE 64u   /* holds take 1/64 of the DRAM tier at most, all connections' */
#define HOLD_QUOTA_SHARE 8u   /* ... and 1/8 of a tenant's DRAM quota, when it has one */
#define HOLD_EVICT_SHARE 512u /* ... and 1/512 of it, when holding takes evicting */
#define COMMIT_KEYS_MAX 1024u /* keys one PUT_COMMIT names, at most (one turn's work) */
#define HOLD_KEY_LEN 17

static uint64_t hold_next; /* hold ids (master loop only) */

static void hold_key(char out[HOLD_KEY_LEN], uint64_t conn_id, uint64_t id)
{
    out[0] = '\0';
    memcpy(out + 1, &conn_id, sizeof(conn_id));
    memcpy(out + 9, &id, sizeof(id));
}

/* This connection's hold `id`; NULL: none (gone, or never its). */
static kvp_object_t *hold_find(kvp_master_state_t *st, uint64_t conn_id, uint64_t id)
{
    char k[HOLD_KEY_LEN];
    hold_key(k, conn_id, id);
    kvp_object_t *obj = kvp_index_lookup(&st->index, k, sizeof(k), kvp_index_hash(k, sizeof(k)));
    if (obj == NULL || !(obj->flags & KVP_OBJ_F_HOLD) || obj->state != KVP_OBJ_PENDING ||
        obj->writer_conn_id != conn_id)
        return NULL;
    return obj;
}

/* Hold h freed unwritten: its room back. */
static void hold_drop(kvp_master_state_t *st, kvp_object_t *h)
{
    kvp_index_unlink(&st->index, h);
    kvp_object_release(st, h);
}

/* A hold of conn's, by id, freed unwritten (an id not conn's: nothing). */
static void hold_free(kvp_master_state_t *st, uint64_t conn_id, uint64_t id)
{
    kvp_object_t *h = hold_find(st, conn_id, id);
    if (h != NULL)
        hold_drop(st, h);
}

/* Key i of a commit, written to its hold: the hold's extents become the key's object, which
 * ends as PutEnd ends it. A refusal of the key (EXISTS, PENDING, a bad key or group) leaves
 * the hold the caller's; no replica written frees it. */
static kvp_status_t commit_held(kvp_call_t *call, const Kvpool__PutCommitRequest *req,
                                const Kvpool__PutEndRequest *end, const kvp_placement_req_t *preq,
                                size_t i)
{
    kvp_master_state_t *st = call->st;
    kvp_object_t *hold = hold_find(st, call->conn_id, req->holds[i]);
    if (hold == NULL) {
        st->stats.holds_gone++;
        return KVP_ERR_NOT_FOUND;
    }
    uint32_t all = hold->n_replicas >= 32 ? UINT32_MAX : (1u << hold->n_replicas) - 1;
    uint32_t mask = req->n_written_mask > 0 ? req->written_mask[i] : UINT32_MAX;
    if ((mask & all) == 0) {
        hold_drop(st, hold);
        return KVP_ERR_IO;
    }
    if (req->sizes[i] != hold->size || hold->tenant != preq->tenant)
        return KVP_ERR_INVALID_ARG;
    uint32_t held = 0;
    kvp_object_t *obj = NULL;
    kvp_status_t s =
        put_start_key(st, call->conn_id, &req->keys[i], req->sizes[i], preq,
                      req->n_group_ids ? &req->group_ids[i] : NULL, NULL, &held, hold, &obj);
    kvp_group_drop(&st->groups, held);
    if (s != KVP_OK)
        return s;
    st->stats.holds_used++;
    return op_put_end(st, call->conn_id, &req->keys[i], end, i, false);
}

/* Release the holds an answer that did not go out handed out. */
static void holds_undo(kvp_reply_t *r, kvp_status_t rc, void *arg)
{
    (void)arg;
    const Kvpool__PutCommitResponse *resp = (const Kvpool__PutCommitResponse *)r->resp;
    for (size_t k = 0; rc != KVP_OK && k < resp->n_holds; k++)
        hold_free(r->call->st, r->call->conn_id, resp->holds[k]->id);
}

/* One hold of hr->size placed for preq into *hold (its replicas, with write grants, from
 * reps; slot: the first grant slot). */
static kvp_status_t hold_one(kvp_call_t *call, const kvp_placement_req_t *preq, uint64_t size,
                             int64_t *give_back_p, Kvpool__Hold *hold, Kvpool__Replica *reps,
                             Kvpool__Replica **repptr, size_t slot, kvp_seg_set_t *segs)
{
    kvp_master_state_t *st = call->st;
    uint64_t id = ++hold_next;
    char k[HOLD_KEY_LEN];
    hold_key(k, call->conn_id, id);
    kvp_object_t *obj = NULL;
    kvp_status_t s = put_create(st, call->conn_id, k, sizeof(k), kvp_index_hash(k, sizeof(k)), size,
                                preq, NULL, 0, give_back_p, NULL, true, &obj);
    if (s != KVP_OK)
        return s;
    kvpool__hold__init(hold);
    hold->id = id;
    hold->size = size;
    hold->replicas = repptr;
    hold->n_replicas = obj->n_replicas;
    for (unsigned q = 0; q < obj->n_replicas; q++) {
        Kvpool__Replica *rep = &reps[q];
        kvpool__replica__init(rep);
        rep->segment_id = obj->replicas[q].segment_id;
        rep->offset = obj->replicas[q].offset;
        rep->length = size;
        /* in its segment's grant set of this answer, which the writer keeps while it
         * keeps a hold of it (client/put_holds.c): one MAC a segment an answer */
        if (!kvp_call_grant_extent(call, rep, slot + q, segs, KVP_GRANT_WRITE,
                                   st->config.put_timeout_ms, obj->version))
            return KVP_ERR_NOMEM; /* (the hold stays: it is in the answer's undo) */
        repptr[q] = rep;
    }
    st->stats.holds_granted++;
    return KVP_OK;
}

/* May another hold of `need` bytes (x replicas) be placed? Holds stay a small part of the
 * pool and of the tenant's quota, and none is made in the last 1/HOLD_QUOTA_SHARE of a
 * tenant's quota or of a pool that does not evict: there a put would find the room it needs
 * held by another connection's holds (its own it gives back: client/object.c). */
static bool hold_room(const kvp_master_state_t *st, const kvp_tenant_t *t, uint64_t need,
                      uint64_t pool_max)
{
    if (st->held_bytes + need > pool_max)
        return false;
    if (t->max_dram != 0 &&
        (t->held_bytes + need > t->max_dram / HOLD_QUOTA_SHARE ||
         t->dram_bytes + t->held_bytes + need > t->max_dram - t->max_dram / HOLD_QUOTA_SHARE))
        return false;
    if (t->max_objects != 0 && t->objects + t->holds + 1 > t->max_objects - t->max_objects / 8)
        return false;
    uint64_t cap = kvp_segment_table_capacity_tier(&st->segments, false);
    uint64_t used = kvp_segment_table_used_tier(&st->segments, false);
    if (!st->config.evict)
        return used + need + cap / HOLD_QUOTA_SHARE <= cap;
    /* A hold that evicts takes a cached object out one batch early (before the gets of the
     * writer's next request, which may hit it): room held by evicting stays a sliver. */
    return used + need <= cap || st->held_bytes + need <= cap / HOLD_EVICT_SHARE;
}

/* The holds hr asks for, into the answer (fewer, with why in its message, when the pool
 * or the quota has no more room). DRAM only: a hold is never an SSD or DFS replica. */
static bool holds_grant(kvp_call_t *call, const Kvpool__HoldRequest *hr, kvp_reply_t *r,
                        Kvpool__PutCommitResponse *resp)
{
    kvp_master_state_t *st = call->st;
    size_t count = KVP_MIN(hr->count, HOLD_ASK_MAX);
    kvp_placement_req_t preq;
    if (count == 0 || hr->size == 0)
        return true;
    if (put_config(st, hr->config, &preq) != KVP_OK || preq.ssd || preq.dfs_extra) {
        snprintf(r->text, r->text_max, "holds are DRAM room only: none for an SSD or DFS put");
        return true;
    }
    preq.upsert = false;
    preq.pin = KVP_PIN_NONE;
    preq.tenant = call->who != NULL && st->tenants_on ? call->who->tenant_id : 0;
    preq.dedicated_first = st->tenants.t[preq.tenant].dedicated > 0;
    size_t per = preq.replica_num;
    if (per == 0 || hr->size > UINT64_MAX / per) {
        snprintf(r->text, r->text_max, "no hold of %llu bytes x %zu replicas: past any pool",
                 (unsigned long long)hr->size, per);
        return true;
    }
    Kvpool__Hold *holds = kvp_reply_alloc(r, count, sizeof(*holds));
    Kvpool__Hold **hp = kvp_reply_alloc(r, count, sizeof(*hp));
    Kvpool__Replica *reps = kvp_reply_alloc(r, count * per, sizeof(*reps));
    Kvpool__Replica **rp = kvp_reply_alloc(r, count * per, sizeof(*rp));
    if (!holds || !hp || !reps || !rp || !kvp_call_grants_reserve(st, count * per))
        return false;
    resp->holds = hp;
    kvp_reply_on_end(r, holds_undo, NULL);
    int64_t give_back = -1;
    uint64_t pool_max = kvp_segment_table_capacity_tier(&st->segments, false) / HOLD_POOL_SHARE;
    const kvp_tenant_t *t = &st->tenants.t[preq.tenant];
    uint64_t need = hr->size * per;
    for (size_t k = 0; k < count; k++) {
        /* room held ahead stays a small part of the pool and of the tenant's quota: a put
         * that needs room evicts objects, never waits for another's holds */
        if (!hold_room(st, t, need, pool_max)) {
            snprintf(r->text, r->text_max,
                     "room held ahead is at its bound (1/%u of the DRAM tier, 1/%u of a "
                     "tenant's quota, and none in the last 1/%u of a quota or of a pool that "
                     "does not evict): %llu bytes held",
                     HOLD_POOL_SHARE, HOLD_QUOTA_SHARE, HOLD_QUOTA_SHARE,
                     (unsigned long long)st->held_bytes);
            break;
        }
        holds[k].id = 0;
        kvp_status_t s = hold_one(call, &preq, hr->size, &give_back, &holds[k], &reps[k * per],
                                  &rp[k * per], k * per, &r->segs);
        if (holds[k].id != 0) /* (made: undone with the answer if it does not go) */
            hp[resp->n_holds++] = &holds[k];
        if (s == KVP_ERR_NOMEM)
            return false;
        if (s != KVP_OK) {
            if (s == KVP_ERR_QUOTA)
                quota_message(st, &preq, hr->size, r->text, r->text_max);
            else if (s == KVP_ERR_POOL_FULL || s == KVP_ERR_POOL_BUSY)
                pool_full_message(st, r->text, r->text_max);
            break;
        }
    }
    return true;
}

/* The request's shape: per-key arrays of one length, at most COMMIT_KEYS_MAX keys. */
static bool commit_shape_ok(const Kvpool__PutCommitRequest *req)
{
    size_t n = req->n_keys;
    if (n > COMMIT_KEYS_MAX || req->n_release > HOLD_ASK_MAX || req->n_holds != n ||
        req->n_crc32c != n || req->n_sizes != n ||
        (req->n_written_mask != 0 && req->n_written_mask != n) ||
        (req->n_group_ids != 0 && req->n_group_ids != n) ||
        (req->n_versions != 0 && req->n_versions != n))
        return false;
    for (size_t i = 0; i < req->n_group_ids; i++)
        if (req->group_ids[i].len > KVP_GROUP_ID_MAX)
            return false;
    return true;
}

kvp_status_t kvp_handle_put_commit(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__PutCommitRequest *req = (Kvpool__PutCommitRequest *)req_msg;
    Kvpool__PutCommitResponse resp = KVPOOL__PUT_COMMIT_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 384);
    st->call_again = false;
    kvp_placement_req_t preq;
    if (!commit_shape_ok(req))
        return kvp_reply_fail(
            &r, KVP_ERR_INVALID_ARG,
            "a PutCommit names at most %u keys, with one hold, CRC32C, size "
            "(and written mask, group id, version) each, and gives back at most %u "
            "holds",
            COMMIT_KEYS_MAX, HOLD_ASK_MAX);
    if (put_config(st, req->config, &preq) != KVP_OK)
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, NULL);
    preq.tenant = call->who != NULL && st->tenants_on ? call->who->tenant_id : 0;
    size_t n = req->n_keys;
    int32_t *out = n > 0 ? kvp_reply_statuses(&r, n) : NULL;
    if (n > 0 && out == NULL)
        return kvp_reply_abort(&r);
    Kvpool__PutEndRequest end = KVPOOL__PUT_END_REQUEST__INIT;
    end.keys = req->keys;
    end.n_keys = n;
    end.crc32c = req->crc32c;
    end.n_crc32c = n;
    end.written_mask = req->written_mask;
    end.n_written_mask = req->n_written_mask;
    end.versions = req->versions;
    end.n_versions = req->n_versions;
    for (size_t j = n; j > 0; j--) { /* last key first, as keys_batch */
        size_t i = j - 1;
        out[i] = req->holds[i] != 0 ? commit_held(call, req, &end, &preq, i)
                                    : op_put_end(st, call->conn_id, &req->keys[i], &end, i, false);
    }
    for (size_t k = 0; k < req->n_release; k++) /* given back unwritten */
        hold_free(st, call->conn_id, req->release[k]);
    resp.put_timeout_ms = st->config.put_timeout_ms;
    if (req->hold != NULL && !holds_grant(call, req->hold, &r, &resp))
        return kvp_reply_abort(&r);
    if (!kvp_reply_segments(&r))
        return kvp_reply_abort(&r);
    kvp_evict_if_needed(st);
    return kvp_reply_send(&r);
}

/*
 * A draining segment's held room goes back now (a drain waits for no hold). Only the
 * extents on that segment: a hold with replicas elsewhere too stays its client's with
 * those (the one here a tombstone, skipped at its commit, as a PENDING object's on a
 * segment that went away), because the client may write into it before it learns
 * anything: freed, those extents could be another object's by then. The extents freed
 * here are not placed again (placement skips a draining segment), so a late write into
 * one lands on nobody's object.
 */
void kvp_object_holds_drop(kvp_master_state_t *st, uint64_t segment_id)
{
    kvp_object_t *obj = st->index.pending_list.head;
    while (obj != NULL) {
        kvp_object_t *next = obj->lnext;
        if ((obj->flags & KVP_OBJ_F_HOLD) && kvp_object_replica_on(obj, segment_id) >= 0) {
            unsigned live = 0;
            for (unsigned r = 0; r < obj->n_replicas; r++)
                live +=
                    obj->replicas[r].segment_id != 0 && obj->replicas[r].segment_id != segment_id;
            if (live == 0) {
                kvp_index_unlink(&st->index, obj);
                kvp_object_release(st, obj);
            } else {
                kvp_index_charge(&st->index, obj, -1); /* one replica less: charged again */
                for (unsigned r = 0; r < obj->n_replicas; r++)
                    if (obj->replicas[r].segment_id == segment_id) {
                        kvp_segment_table_free_extent(&st->segments, &obj->replicas[r]);
                        obj->replicas[r].segment_id = 0;
                    }
                kvp_index_charge(&st->index, obj, +1);
            }
        }
        obj = next;
    }
}

kvp_status_t kvp_handle_remove(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    Kvpool__KeysRequest *req = (Kvpool__KeysRequest *)req_msg;
    return keys_batch(call, req->keys, req->n_keys, NULL, req->force, op_remove, KVP_RPC_REMOVE,
                      true);
}

/* One key of REPLICA_CLEAR with a segment name: its complete replicas on segments of that
 * name go; the whole object when they are all it has. NOT_FOUND: none there. */
static kvp_status_t clear_on_segment(kvp_master_state_t *st, kvp_object_t *obj, const char *segment)
{
    kvp_replica_t keep[KVP_MAX_REPLICAS], gone[KVP_MAX_REPLICAS];
    unsigned n_keep = 0, n_gone = 0;
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        const kvp_segment_t *seg =
            kvp_segment_table_get(&st->segments, obj->replicas[r].segment_id);
        if (seg != NULL && seg->name != NULL && strcmp(seg->name, segment) == 0)
            gone[n_gone++] = obj->replicas[r];
        else
            keep[n_keep++] = obj->replicas[r];
    }
    if (n_gone == 0)
        return KVP_ERR_NOT_FOUND;
    if (n_keep == 0) {
        kvp_tombstone_add(&st->tombstones, obj->hash, kvp_tier_next_version(st));
        kvp_object_remove(st, obj);
        st->stats.removes++;
        return KVP_OK;
    }
    if (kvp_tier_set_replicas(st, obj, keep, n_keep) == NULL)
        return KVP_ERR_NOMEM;
    for (unsigned i = 0; i < n_gone; i++)
        kvp_segment_table_free_extent(&st->segments, &gone[i]);
    return KVP_OK;
}

/* One key of REPLICA_CLEAR (arg: the segment's name; "": the whole object, as Remove). */
static kvp_status_t op_replica_clear(kvp_master_state_t *st, uint64_t conn_id,
                                     const ProtobufCBinaryData *key, const void *arg, size_t i,
                                     bool force)
{
    const char *segment = arg;
    if (segment[0] == '\0')
        return op_remove(st, conn_id, key, NULL, i, force);
    kvp_object_t *obj;
    kvp_status_t status = kvp_call_key_lookup(st, key, &obj, NULL);
    if (status != KVP_OK)
        return status;
    if (obj == NULL)
        return KVP_ERR_NOT_FOUND;
    if (obj->state == KVP_OBJ_PENDING)
        return KVP_ERR_PENDING;
    if (kvp_leased(st, obj)) {
        st->stats.lease_waits++;
        return KVP_ERR_LEASED;
    }
    return clear_on_segment(st, obj, segment);
}

kvp_status_t kvp_handle_replica_clear(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    Kvpool__ReplicaClearRequest *req = (Kvpool__ReplicaClearRequest *)req_msg;
    const char *segment = req->segment != NULL ? req->segment : "";
    if (strlen(segment) > 255) {
        Kvpool__StatusesResponse resp = KVPOOL__STATUSES_RESPONSE__INIT;
        kvp_reply_t r;
        kvp_reply_init(&r, call, &resp.base, 0);
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, NULL);
    }
    return keys_batch(call, req->keys, req->n_keys, segment, false, op_replica_clear,
                      KVP_RPC_REPLICA_CLEAR, false);
}

kvp_status_t kvp_handle_exist(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    Kvpool__KeysRequest *req = (Kvpool__KeysRequest *)req_msg;
    return keys_batch(call, req->keys, req->n_keys, NULL, req->force, op_exist, KVP_RPC_EXIST,
                      false);
}

/* Who may hand back the leases granted to this call (policy/lease.h): its principal with
 * an ACL (a client that reconnects releases on its new connection), else its connection. */
static uint64_t lease_owner(const kvp_call_t *call)
{
    return call->who != NULL ? kvp_lease_owner_principal(call->who->tag)
                             : kvp_lease_owner_conn(call->conn_id);
}

/* A GetReplicaList not answered: nobody will release the leases it granted (its results). */
static void get_replica_list_end(kvp_reply_t *r, kvp_status_t rc, void *arg)
{
    (void)arg;
    const Kvpool__GetReplicaListResponse *resp = (const Kvpool__GetReplicaListResponse *)r->resp;
    for (size_t i = 0; rc != KVP_OK && i < resp->n_results; i++)
        if (resp->results[i] != NULL && resp->results[i]->lease_id != 0)
            kvp_lease_release(r->call->st, resp->results[i]->lease_id); /* ids it granted */
}

/* A GetReplicaList's per-key loop, last key first as in keys_batch, from key n - done - 1
 * down, for this turn; false: held for the next. */
static bool replica_list_keys(kvp_call_t *call, const Kvpool__KeysRequest *req, listing_t *l,
                              held_t *h)
{
    kvp_master_state_t *st = call->st;
    Kvpool__GetReplicaResult *res = l->res;
    uint64_t owner = lease_owner(call);
    uint64_t stop = kvp_now_ns() + keys_turn_ns(st);
    unsigned since = 0;
    for (; l->done < l->n; l->done++) {
        if (turn_over(st, &since, stop) && held_keep(call, h, l, KVP_RPC_GET_REPLICA_LIST))
            return false;
        size_t i = l->n - 1 - l->done;
        kvpool__get_replica_result__init(&res[i]);
        l->resp.gr.results[i] = &res[i];
        kvp_object_t *obj;
        res[i].status = kvp_call_key_lookup(st, &req->keys[i], &obj, NULL);
        if (res[i].status != KVP_OK)
            continue;
        st->stats.gets++;
        if (obj == NULL || obj->state != KVP_OBJ_COMPLETE) {
            res[i].status = KVP_ERR_NOT_FOUND;
            st->stats.get_misses++;
            continue;
        }
        res[i].size = obj->size;
        res[i].crc32c = obj->crc32c;
        /* a read lease: the extents stay put (no eviction, no plain remove) until the
         * client releases it after its transfer */
        res[i].lease_id = kvp_lease_grant(st, obj, owner); /* the read counts when it ends */
        kvp_lease_group(st, obj); /* and its group's other members are leased too */
        kvp_tier_on_get(st, obj); /* hit per tier; an SSD-only object is promoted */
        kvp_hot_on_read(st, obj); /* --hot-key-reads: counted */
        res[i].replicas = &l->repptr[l->nr];
        res[i].n_replicas = obj->n_replicas;
        /* read grants: good while the read lease is (no leases: as long as a put) */
        if (!kvp_call_add_replicas(
                call, obj, l->reps, l->repptr, &l->nr, &l->r.segs, KVP_GRANT_READ,
                st->config.lease_ttl_ms ? st->config.lease_ttl_ms : st->config.put_timeout_ms)) {
            l->done = SIZE_MAX;
            return true;
        }
    }
    return true;
}

kvp_status_t kvp_handle_get_replica_list(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__KeysRequest *req = (Kvpool__KeysRequest *)req_msg;
    held_t *h = held_take(st, call->conn_id, KVP_RPC_GET_REPLICA_LIST, req->n_keys);
    st->call_again = false;
    listing_t local, *l = h != NULL ? &h->l : &local;
    if (h != NULL && !held_resume(call, h, NULL))
        return held_gone(l, h, &l->resp.gr.n_results, &l->resp.gr.n_segments);
    if (h == NULL) {
        memset(l, 0, sizeof(*l));
        l->resp.gr = (Kvpool__GetReplicaListResponse)KVPOOL__GET_REPLICA_LIST_RESPONSE__INIT;
        kvp_reply_init(&l->r, call, &l->resp.base, 0);
        size_t n = l->n = req->n_keys;
        int32_t status = kvp_call_check_batch(n);
        if (status != KVP_OK)
            return kvp_reply_fail(&l->r, status, NULL);
        l->res = kvp_reply_calloc(&l->r, n, sizeof(Kvpool__GetReplicaResult));
        Kvpool__GetReplicaResult **resptr = kvp_reply_calloc(&l->r, n, sizeof(*resptr));
        /* as in put_start */
        l->reps = kvp_reply_alloc(&l->r, n * KVP_MAX_REPLICAS + 1, sizeof(*l->reps));
        l->repptr = kvp_reply_calloc(&l->r, n * KVP_MAX_REPLICAS + 1, sizeof(*l->repptr));
        if (!l->res || !resptr || !l->reps || !l->repptr ||
            !kvp_call_grants_reserve(st, n * KVP_MAX_REPLICAS))
            return kvp_reply_abort(&l->r);
        l->resp.gr.n_results = n;
        l->resp.gr.results = resptr;
        kvp_reply_on_end(&l->r, get_replica_list_end, NULL);
    }
    if (!replica_list_keys(call, req, l, h))
        return KVP_OK; /* (held: answered at a later turn) */
    l->resp.gr.lease_ttl_ms = st->config.lease_ttl_ms;
    kvp_status_t rc = l->done == SIZE_MAX || !kvp_reply_segments(&l->r) ? kvp_reply_abort(&l->r)
                                                                        : kvp_reply_send(&l->r);
    free(h); /* (its listing's arrays were the reply's: released as it ended) */
    return rc;
}

/* One-way: no response is packed, so a release refused (another owner's lease, an unknown
 * id) is only ignored, counted (kvpool_lease_releases_refused_total) and logged. */
kvp_status_t kvp_handle_lease_release(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__LeaseReleaseRequest *req = (Kvpool__LeaseReleaseRequest *)req_msg;
    uint64_t owner = lease_owner(call);
    size_t refused = 0;
    for (size_t i = 0; i < req->n_lease_ids; i++)
        if (kvp_lease_release_by(st, req->lease_ids[i], owner) == KVP_LEASE_NOT_OWNER)
            refused++;
    if (refused > 0) /* (no id logged: an id is what a release needs) */
        KVP_LOG_WARN_LIMITED("connection %llu (principal %s): %zu of %zu lease releases "
                             "refused: granted to another %s",
                             (unsigned long long)call->conn_id,
                             call->who != NULL ? call->who->name : "none", refused,
                             req->n_lease_ids, call->who != NULL ? "principal" : "connection");
    return KVP_OK;
}

/* A key's size, or its status (GetSize). */
static int64_t key_size(kvp_master_state_t *st, ProtobufCBinaryData *key)
{
    kvp_object_t *obj;
    kvp_status_t s = kvp_call_key_lookup(st, key, &obj, NULL);
    if (s == KVP_OK && (obj == NULL || obj->state != KVP_OBJ_COMPLETE)) {
        s = KVP_ERR_NOT_FOUND;
        /* a get that learns the size first ends here on a miss: count it as one (a hit is
         * counted by the GetReplicaList that follows) */
        st->stats.gets++;
        st->stats.get_misses++;
    }
    return s == KVP_OK ? (int64_t)obj->size : s;
}

/* First key first, continued at later turns past KEYS_TURN_NS as keys_batch is. */
kvp_status_t kvp_handle_get_size(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__KeysRequest *req = (Kvpool__KeysRequest *)req_msg;
    Kvpool__GetSizeResponse resp = KVPOOL__GET_SIZE_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    size_t n = req->n_keys;
    keys_cont_t *k = cont_again(st, call->conn_id, NULL, KVP_RPC_GET_SIZE, n);
    int32_t status = kvp_call_check_batch(n);
    int64_t *sizes = status == KVP_OK ? kvp_reply_alloc(&r, n, sizeof(*sizes)) : NULL;
    if (sizes == NULL) {
        free(k);
        return status != KVP_OK ? kvp_reply_fail(&r, status, NULL) : kvp_reply_abort(&r);
    }
    size_t i = 0;
    if (k != NULL) { /* what its earlier calls answered */
        memcpy(sizes, k->out, n * sizeof(*sizes));
        i = n - k->left;
    }
    uint64_t stop = kvp_now_ns() + keys_turn_ns(st);
    for (unsigned since = 0; i < n; i++) {
        if (turn_over(st, &since, stop) &&
            cont_keep(call, k, NULL, sizes, sizeof(*sizes), n, n - i, KVP_RPC_GET_SIZE)) {
            (void)kvp_reply_abort(&r); /* (no answer yet: its array goes) */
            return KVP_OK;
        }
        sizes[i] = key_size(st, &req->keys[i]);
    }
    free(k);
    resp.sizes = sizes;
    resp.n_sizes = n;
    return kvp_reply_send(&r);
}

/*
 * A closed connection's unfinished puts are revoked. The pending list holds every tenant's
 * puts, so a walk of it costs what all of them hold (0.4 s for 262 144): a close finds them
 * at once only while the list is one turn's walk (SWEEP_TURN); past that the connection
 * joins st->closed_writers and a pass over the list revokes them, SWEEP_TURN objects a loop
 * turn (kvp_object_sweep). A pass visits the objects pending when it began (their count):
 * a closed connection adds none, later puts join the tail, none is put in the middle, and
 * one unlinked or replaced where the pass stands moves it on (the list's cursor).
 * Its holds (PUT_COMMIT's room placed ahead) stay until their put timeout: a client that
 * lost its connection may still be writing into one (it uses a hold only while its master
 * answered within 200 ms), and nothing new may land there before those bytes have.
 */
#define SWEEP_TURN 4096u

static void revoke_writer_now(kvp_master_state_t *st, uint64_t conn_id)
{
    kvp_object_t *obj = st->index.pending_list.head;
    unsigned revoked = 0;
    while (obj != NULL) {
        kvp_object_t *next = obj->lnext;
        if (obj->writer_conn_id == conn_id && !(obj->flags & KVP_OBJ_F_HOLD)) {
            kvp_index_unlink(&st->index, obj);
            kvp_object_release(st, obj);
            revoked++;
        }
        obj = next;
    }
    if (revoked)
        KVP_LOG_INFO("connection %llu closed: revoked %u unfinished puts",
                     (unsigned long long)conn_id, revoked);
}

static bool closed_writer_add(kvp_master_state_t *st, uint64_t conn_id)
{
    if (st->n_closed_writers == st->cap_closed_writers) {
        uint32_t cap = st->cap_closed_writers ? 2 * st->cap_closed_writers : 16;
        uint64_t *w = realloc(st->closed_writers, cap * sizeof(*w));
        if (w == NULL)
            return false;
        st->closed_writers = w;
        st->cap_closed_writers = cap;
    }
    st->closed_writers[st->n_closed_writers++] = conn_id;
    st->stats.close_sweeps++;
    return true;
}

void kvp_object_conn_closed(kvp_master_state_t *st, uint64_t conn_id)
{
    free(cont_take(st, conn_id)); /* a keys batch under way: never answered now */
    for (held_t **pp = &helds; *pp != NULL; pp = &(*pp)->next) /* a listing: ended */
        if ((*pp)->st == st && (*pp)->conn_id == conn_id) {
            held_t *h = *pp;
            *pp = h->next;
            held_drop(h);
            break;
        }
    /* Its leases' ids (no ACL: owned by the connection) go: a release of one is unknown from
     * now on, not another owner's; the reads hold until their TTL, as a dead reader's. */
    kvp_lease_disown(st, kvp_lease_owner_conn(conn_id));
    if (st->index.pending_list.n <= SWEEP_TURN || !closed_writer_add(st, conn_id))
        revoke_writer_now(st, conn_id); /* (no memory to wait with: now, whatever it costs) */
}

bool kvp_object_sweeping(const kvp_master_state_t *st)
{
    return st->n_closed_writers > 0;
}

static int cmp_conn(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

void kvp_object_sweep(kvp_master_state_t *st)
{
    kvp_object_list_t *l = &st->index.pending_list;
    if (st->n_sweeping == 0) { /* a pass begins: for the connections closed until now */
        st->n_sweeping = st->n_closed_writers;
        qsort(st->closed_writers, st->n_sweeping, sizeof(*st->closed_writers), cmp_conn);
        l->cursor = l->head;
        st->sweep_left = l->n;
    }
    unsigned revoked = 0;
    for (unsigned k = 0; k < SWEEP_TURN && l->cursor != NULL && st->sweep_left > 0; k++) {
        kvp_object_t *obj = l->cursor;
        l->cursor = obj->lnext;
        st->sweep_left--;
        if (!(obj->flags & KVP_OBJ_F_HOLD) &&
            bsearch(&obj->writer_conn_id, st->closed_writers, st->n_sweeping,
                    sizeof(*st->closed_writers), cmp_conn) != NULL) {
            kvp_index_unlink(&st->index, obj);
            kvp_object_release(st, obj);
            revoked++;
        }
    }
    if (revoked)
        KVP_LOG_INFO("closed connections: revoked %u unfinished puts", revoked);
    if (l->cursor != NULL && st->sweep_left > 0)
        return;
    l->cursor = NULL; /* the pass is over: its connections' puts are all gone */
    st->n_closed_writers -= st->n_sweeping;
    memmove(st->closed_writers, st->closed_writers + st->n_sweeping,
            st->n_closed_writers * sizeof(*st->closed_writers));
    st->n_sweeping = 0;
}
