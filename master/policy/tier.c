/*
 * tier.c - the SSD tier: what goes to SSD, what comes back, and the tasks
 * that make the owners of SSD segments move the bytes.
 *
 * Design (docs/architecture.md, "Tiers"). Object bytes never pass through
 * the master: it decides, and queues a task for the owner of the SSD
 * segment involved, who copies with its transfer engine and io_uring and
 * reports back (rpc/ssd_calls.c: SsdTasks, a long poll that answers as soon as a
 * task is queued).
 *   - Offload: a DRAM eviction victim with no SSD copy gets an SSD extent
 *     (on its host's SSD segment when that has room, else any; the SSD tier
 *     drops its own least recently used objects to make room). The object
 *     stays readable from DRAM while the owner copies and records it; only
 *     when the owner reports the copy durable does its DRAM extent go (or,
 *     when a read holds it then, the object keeps both). A victim that
 *     already has an SSD copy just loses its DRAM replica.
 *   - The SSD tier's objects (no DRAM replica) are on their own list in LRU
 *     order; the SSD watermarks and puts straight to SSD drop from its head.
 *   - Promotion: a get that finds an object on SSD only (promote-on-hit)
 *     gives it a DRAM extent and asks the SSD owner to copy it there; the
 *     object then has both and is a DRAM object again (protected list). It
 *     is skipped when DRAM has no free room: a promotion never evicts.
 *   - Versions: every put gets a version from a clock that starts at the
 *     wall clock, so a restarted master's versions are larger than those
 *     its predecessor gave. The owner records the version with each object;
 *     at its next mount it offers them back (ha/rebuild.c).
 *   - A task holds the extent it writes to (OFFLOAD: the SSD one; PROMOTE:
 *     the DRAM one) until it ends; an object removed meanwhile is noticed at
 *     the end by its key and version, and the extent freed.
 *
 * Thread: master loop only.
 */
#include "master/policy/tier.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "master/meta/placement.h"
#include "master/meta/record.h"
#include "master/policy/lease.h"
#include "master/policy/lists.h"

/* Offloads in flight at most: eviction waits (puts get POOL_BUSY) past this. */
#define OFFLOADS_MAX 1024u

static uint64_t aligned(uint64_t size, uint64_t align)
{
    return (size + align - 1) / align * align;
}

uint64_t kvp_tier_next_version(kvp_master_state_t *st)
{
    return ++st->version_clock;
}

uint64_t kvp_tier_offload_ahead(const kvp_master_state_t *st)
{
    /* two owner batches of 1 MiB objects (64 each), at most a quarter of DRAM */
    uint64_t cap = kvp_segment_table_capacity_tier(&st->segments, false);
    uint64_t ahead = 128ull << 20;
    return kvp_tier_has_ssd(st) ? (ahead < cap / 4 ? ahead : cap / 4) : 0;
}

bool kvp_tier_offload_full(const kvp_master_state_t *st)
{
    return st->offloading >= OFFLOADS_MAX;
}

bool kvp_tier_ssd_adopting(const kvp_master_state_t *st)
{
    if (!kvp_tier_has_ssd(st))
        return false;
    bool adopting = false;
    for (uint32_t i = 0; i < st->segments.n_slots; i++) {
        const kvp_segment_t *seg = st->segments.slots[i];
        if (seg == NULL || !seg->ssd || seg->dfs)
            continue;
        if (kvp_segment_open(seg))
            return false;
        /* an offer that has not ended in KVP_TIER_ADOPT_WAIT_MS is not waited for: an owner
         * that never ends it must not stall every put into a full DRAM tier */
        adopting |= seg->adopting && st->now_ms - seg->mounted_ms < KVP_TIER_ADOPT_WAIT_MS;
    }
    return adopting;
}

kvp_object_t *kvp_tier_set_replicas(kvp_master_state_t *st, kvp_object_t *obj,
                                    const kvp_replica_t *reps, unsigned n)
{
    if (st->events != NULL && obj->state == KVP_OBJ_COMPLETE) /* KV events: media gained/lost */
        kvp_state_media_event(st, obj, kvp_state_media(st, obj->replicas, obj->n_replicas),
                              kvp_state_media(st, reps, n));
    /* charged again for its new replicas (a RETIRED object is in no index: charged to none) */
    bool indexed = obj->state != KVP_OBJ_RETIRED;
    if (n == obj->n_replicas) {
        if (indexed)
            kvp_index_charge(&st->index, obj, -1);
        memmove(obj->replicas, reps, n * sizeof(*reps));
        if (indexed)
            kvp_index_charge(&st->index, obj, +1);
        return obj;
    }
    kvp_object_t *o =
        (obj->flags & KVP_OBJ_F_GROUPED)
            ? kvp_object_create_grouped(kvp_object_key(obj), obj->key_len, obj->hash, n)
            : kvp_object_create(kvp_object_key(obj), obj->key_len, obj->hash, n);
    if (o == NULL)
        return NULL;
    if (indexed)
        kvp_index_charge(&st->index, obj, -1);
    kvp_replica_t *keep = o->replicas;
    size_t head = offsetof(kvp_object_t, replicas);
    memcpy(o, obj, head);
    o->n_replicas = (uint8_t)n;
    memcpy(keep, reps, n * sizeof(*reps));
    memcpy((char *)&o->replicas[n], kvp_object_key(obj), kvp_object_tail_len(obj));
    kvp_index_replace(&st->index, obj, o); /* (and its group's member list) */
    if (indexed)
        kvp_index_charge(&st->index, o, +1);
    if (o->state != KVP_OBJ_PENDING && o->lease != 0)
        st->leases.slots[o->lease - 1].obj = o;
    free(obj);
    return o;
}

static kvp_object_t *lookup(kvp_master_state_t *st, const char *key, size_t len, uint64_t version)
{
    kvp_object_t *obj = kvp_index_lookup(&st->index, key, len, kvp_index_hash(key, len));
    return obj != NULL && obj->state == KVP_OBJ_COMPLETE && obj->version == version ? obj : NULL;
}

/* ---- eviction from SSD ---- */

/* Has obj a replica on a DFS segment? */
static bool on_dfs(const kvp_master_state_t *st, const kvp_object_t *obj)
{
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        const kvp_segment_t *seg =
            kvp_segment_table_get(&st->segments, obj->replicas[r].segment_id);
        if (seg != NULL && seg->dfs)
            return true;
    }
    return false;
}

uint64_t kvp_tier_evict_ssd_to(kvp_master_state_t *st, uint64_t target)
{
    kvp_lease_expire(st);
    uint64_t used = kvp_segment_table_used_tier(&st->segments, true), freed = 0;
    kvp_object_t *next = st->index.ssd.head;
    while (used > target && next != NULL) {
        kvp_object_t *obj = next;
        next = obj->lnext;
        if (on_dfs(st, obj)) /* a DFS copy frees no SSD room: the DFS tier keeps it */
            continue;
        uint64_t bytes = aligned(obj->size, 4096) * obj->n_replicas;
        kvp_state_object_gone(st, obj);
        kvp_index_unlink(&st->index, obj);
        kvp_object_release(st, obj);
        used = bytes < used ? used - bytes : 0;
        freed += bytes;
        st->stats.ssd_evicted++;
    }
    return freed;
}

/* ---- eviction from DFS ---- */

static void free_extent(kvp_master_state_t *st, const kvp_replica_t *rep);

/* Would freeing room on seg help a DFS put of `tenant` (-1: any)? A DFS segment that takes
 * new replicas (not an ownerless one), not dedicated to another tenant. */
static bool dfs_room_for(const kvp_segment_t *seg, int32_t tenant)
{
    return seg != NULL && seg->dfs && kvp_segment_open(seg) &&
           (tenant < 0 || !seg->dedicated || seg->tenant == (uint16_t)tenant);
}

/* Index of obj's replica on such a segment, or -1. */
static int dfs_replica(const kvp_master_state_t *st, const kvp_object_t *obj, int32_t tenant)
{
    for (unsigned r = 0; r < obj->n_replicas; r++)
        if (dfs_room_for(kvp_segment_table_get(&st->segments, obj->replicas[r].segment_id), tenant))
            return (int)r;
    return -1;
}

uint64_t kvp_tier_dfs_used(const kvp_master_state_t *st, int32_t tenant)
{
    uint64_t used = 0;
    for (uint32_t i = 0; i < st->segments.n_slots; i++)
        if (dfs_room_for(st->segments.slots[i], tenant))
            used += kvp_segment_used(st->segments.slots[i]);
    return used;
}

uint64_t kvp_tier_evict_dfs_to(kvp_master_state_t *st, uint64_t target, int32_t tenant)
{
    kvp_lease_expire(st);
    uint64_t used = kvp_tier_dfs_used(st, tenant), freed = 0;
    /* the pinned, soft-pinned, reading and offloading lists are never walked; the pending
     * objects are on none of these */
    kvp_object_list_t *lists[3] = {&st->index.ssd, &st->index.probation, &st->index.protected};
    for (unsigned l = 0; l < 3 && used > target; l++) {
        kvp_object_t *next = lists[l]->head;
        while (used > target && next != NULL) {
            kvp_object_t *obj = next;
            next = obj->lnext;
            int d = dfs_replica(st, obj, tenant);
            if (d < 0 || obj->state != KVP_OBJ_COMPLETE || (obj->flags & KVP_OBJ_F_COPYING) ||
                obj->pin == KVP_PIN_HARD || kvp_leased(st, obj))
                continue;
            uint64_t bytes = aligned(obj->size, 4096);
            if (obj->n_replicas == 1) { /* its only copy: the object goes (as SSD evictions) */
                st->stats.dfs_evicted_objects++;
                kvp_state_object_gone(st, obj);
                kvp_index_unlink(&st->index, obj);
                kvp_object_release(st, obj); /* its owner forgets the entry too */
            } else {
                kvp_replica_t keep[KVP_MAX_REPLICAS], gone = obj->replicas[d];
                unsigned nk = 0;
                for (unsigned r = 0; r < obj->n_replicas; r++)
                    if ((int)r != d)
                        keep[nk++] = obj->replicas[r];
                kvp_object_t *o = kvp_tier_set_replicas(st, obj, keep, nk);
                if (o == NULL)
                    continue; /* out of memory: it keeps its DFS copy */
                kvp_ssd_task_t *t = kvp_state_task_add(st, KVP_SSD_FORGET, gone.segment_id,
                                                       kvp_object_key(o), o->key_len);
                if (t != NULL) { /* else the entry stays; its version refuses it later */
                    t->ssd = gone;
                    t->version = o->version;
                    t->size = o->size;
                }
                free_extent(st, &gone);
            }
            st->stats.dfs_evicted++;
            used = bytes < used ? used - bytes : 0;
            freed += bytes;
        }
    }
    return freed;
}

/* ---- offload ---- */

static const char *host_of(const kvp_master_state_t *st, const kvp_object_t *obj, bool ssd)
{
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        const kvp_segment_t *seg =
            kvp_segment_table_get(&st->segments, obj->replicas[r].segment_id);
        if (seg != NULL && seg->ssd == ssd)
            return seg->host_id;
    }
    return NULL;
}

/* An extent of `size` on the SSD tier (near host when it has room), making room by
 * dropping SSD objects when needed; none when the tenant's SSD quota has no room. */
static bool ssd_extent(kvp_master_state_t *st, uint64_t size, const char *near_host,
                       uint16_t tenant, kvp_replica_t *rep)
{
    const kvp_tenant_t *t = &st->tenants.t[tenant];
    if (t->max_ssd != 0 && t->ssd_bytes + size > t->max_ssd)
        return false;
    kvp_placement_req_t req = {.size = size,
                               .replica_num = 1,
                               .ssd = true,
                               .near_host = near_host,
                               .tenant = tenant,
                               .dedicated_first = t->dedicated > 0};
    unsigned n = 0;
    kvp_status_t s = kvp_placement_alloc(&st->segments, &req, &st->rng, rep, &n);
    while (s == KVP_ERR_POOL_FULL) {
        uint64_t used = kvp_segment_table_used_tier(&st->segments, true);
        if (kvp_tier_evict_ssd_to(st, used > size ? used - size : 0) == 0)
            break;
        s = kvp_placement_alloc(&st->segments, &req, &st->rng, rep, &n);
    }
    return s == KVP_OK && n == 1;
}

static void free_extent(kvp_master_state_t *st, const kvp_replica_t *rep)
{
    kvp_segment_table_free_extent(&st->segments, rep);
}

kvp_tier_victim_t kvp_tier_victim(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (!kvp_tier_has_file(st) || obj->pin == KVP_PIN_HARD)
        return KVP_TIER_DROP;
    /* its SSD (and DFS) replicas stay; its DRAM ones go (now when it has an SSD copy, else once an
     * offload of the first one is durable) */
    kvp_replica_t keep[KVP_MAX_REPLICAS], gone[KVP_MAX_REPLICAS];
    unsigned nk = 0, nd = 0;
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        if (kvp_segment_table_replica_on(&st->segments, &obj->replicas[r], true))
            keep[nk++] = obj->replicas[r];
        else
            gone[nd++] = obj->replicas[r];
    }
    if (nk > 0) {
        kvp_object_t *o = kvp_tier_set_replicas(st, obj, keep, nk);
        if (o == NULL)
            return KVP_TIER_DROP;
        for (unsigned g = 0; g < nd; g++)
            free_extent(st, &gone[g]);
        kvp_policy_move(st, o, KVP_POLICY_SSD, false);
        return KVP_TIER_FREED;
    }
    if (nd == 0 || !kvp_tier_has_ssd(st) || kvp_tier_offload_full(st) ||
        obj->key_len > KVP_TIER_KEY_MAX)
        return KVP_TIER_DROP;
    kvp_replica_t ssd;
    if (!ssd_extent(st, obj->size, host_of(st, obj, false), obj->tenant, &ssd)) {
        st->stats.offload_dropped++;
        return KVP_TIER_DROP;
    }
    kvp_ssd_task_t *t =
        kvp_state_task_add(st, KVP_SSD_OFFLOAD, ssd.segment_id, kvp_object_key(obj), obj->key_len);
    if (t == NULL) {
        free_extent(st, &ssd);
        return KVP_TIER_DROP;
    }
    t->version = obj->version;
    t->size = obj->size;
    t->crc32c = obj->crc32c;
    t->ssd = ssd;
    t->dram = gone[0];
    t->bytes = nd * aligned(obj->size, KVP_SEGMENT_ALIGN);
    obj->flags |= KVP_OBJ_F_OFFLOADING;
    kvp_policy_move(st, obj, KVP_POLICY_OFFLOADING, false);
    st->offloading++;
    st->offloading_bytes += t->bytes;
    return KVP_TIER_OFFLOAD;
}

/* An offload ended: the object goes to SSD (or keeps both while read), or stays. */
static void offload_done(kvp_master_state_t *st, kvp_ssd_task_t *t, kvp_status_t status)
{
    st->offloading--;
    st->offloading_bytes -= t->bytes;
    kvp_object_t *obj = lookup(st, t->key, t->key_len, t->version);
    bool mine = obj != NULL && (obj->flags & KVP_OBJ_F_OFFLOADING);
    bool ssd_ok = kvp_segment_table_get(&st->segments, t->ssd.segment_id) != NULL;
    if (mine)
        obj->flags &= (uint8_t)~KVP_OBJ_F_OFFLOADING;
    if (status != KVP_OK || !mine || !ssd_ok || obj->n_replicas >= KVP_MAX_REPLICAS) {
        if (status != KVP_OK) {
            st->stats.offload_failed++;
            KVP_LOG_WARN_LIMITED("offload of %.*s to SSD segment %#llx failed: %s (it stays in "
                                 "DRAM)",
                                 (int)t->key_len, t->key, (unsigned long long)t->segment_id,
                                 kvp_strerror(status));
        }
        if (ssd_ok) {
            free_extent(st, &t->ssd);
            if (status == KVP_OK) { /* recorded for an object that is gone: forget it */
                kvp_ssd_task_t *f =
                    kvp_state_task_add(st, KVP_SSD_FORGET, t->segment_id, t->key, t->key_len);
                if (f != NULL) {
                    f->ssd = t->ssd;
                    f->version = t->version;
                }
            }
        }
        if (mine && !kvp_leased(st, obj))
            kvp_policy_move(st, obj, kvp_policy_home(st, obj), false);
        return;
    }
    kvp_replica_t reps[KVP_MAX_REPLICAS], gone[KVP_MAX_REPLICAS];
    unsigned n = 0, ng = 0;
    bool read = kvp_leased(st, obj);
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        if (read || kvp_segment_table_replica_on(&st->segments, &obj->replicas[r], true))
            reps[n++] = obj->replicas[r];
        else
            gone[ng++] = obj->replicas[r];
    }
    reps[n++] = t->ssd;
    kvp_object_t *o = kvp_tier_set_replicas(st, obj, reps, n);
    if (o == NULL) {
        free_extent(st, &t->ssd);
        if (!read)
            kvp_policy_move(st, obj, kvp_policy_home(st, obj), false);
        return;
    }
    for (unsigned g = 0; g < ng; g++)
        free_extent(st, &gone[g]);
    st->stats.offloaded++;
    if (!read) /* being read: it keeps DRAM; the end of the read puts it home */
        kvp_policy_move(st, o, kvp_policy_home(st, o), false);
}

/* ---- promotion ---- */

void kvp_tier_on_get(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (!kvp_tier_has_file(st) || kvp_segment_table_has_tier(&st->segments, obj, false)) {
        st->stats.hits_dram++;
        return;
    }
    if (on_dfs(st, obj))
        st->stats.hits_dfs++;
    else
        st->stats.hits_ssd++;
    if (!st->config.promote_on_hit || (obj->flags & (KVP_OBJ_F_PROMOTING | KVP_OBJ_F_OFFLOADING)) ||
        obj->n_replicas >= KVP_MAX_REPLICAS)
        return;
    /* only into free room: a promotion never evicts (nor offloads) anything */
    uint64_t cap = kvp_segment_table_capacity_tier(&st->segments, false);
    uint64_t used = kvp_segment_table_used_tier(&st->segments, false);
    uint64_t bytes = aligned(obj->size, KVP_SEGMENT_ALIGN);
    if (cap == 0 || (double)(used + bytes) > st->config.offload_high * (double)cap)
        return;
    const kvp_tenant_t *ten = &st->tenants.t[obj->tenant]; /* nor past its tenant's quota */
    if (ten->closed || (ten->max_dram != 0 && ten->dram_bytes + obj->size > ten->max_dram))
        return;
    kvp_placement_req_t req = {.size = obj->size,
                               .replica_num = 1,
                               .near_host = host_of(st, obj, true),
                               .tenant = obj->tenant,
                               .dedicated_first = ten->dedicated > 0};
    kvp_replica_t dram;
    unsigned n = 0;
    if (kvp_placement_alloc(&st->segments, &req, &st->rng, &dram, &n) != KVP_OK || n != 1)
        return;
    const kvp_replica_t *src = NULL;
    for (unsigned r = 0; r < obj->n_replicas && src == NULL; r++) {
        const kvp_segment_t *s = kvp_segment_table_get(&st->segments, obj->replicas[r].segment_id);
        if (s != NULL && s->ssd && !s->orphan) /* (an ownerless DFS segment copies nothing) */
            src = &obj->replicas[r];
    }
    kvp_ssd_task_t *t = src == NULL ? NULL
                                    : kvp_state_task_add(st, KVP_SSD_PROMOTE, src->segment_id,
                                                         kvp_object_key(obj), obj->key_len);
    if (t == NULL) {
        free_extent(st, &dram);
        return;
    }
    t->version = obj->version;
    t->size = obj->size;
    t->crc32c = obj->crc32c;
    t->ssd = *src;
    t->dram = dram;
    obj->flags |= KVP_OBJ_F_PROMOTING;
}

static void drop_copy(kvp_master_state_t *st, kvp_object_t *obj, uint64_t segment_id,
                      uint64_t offset);

static void promote_done(kvp_master_state_t *st, kvp_ssd_task_t *t, kvp_status_t status)
{
    kvp_object_t *obj = lookup(st, t->key, t->key_len, t->version);
    if (obj != NULL)
        obj->flags &= (uint8_t)~KVP_OBJ_F_PROMOTING;
    bool dram_ok = kvp_segment_table_get(&st->segments, t->dram.segment_id) != NULL;
    if (status == KVP_ERR_CHECKSUM || (status == KVP_ERR_IO && obj != NULL)) {
        /* the SSD copy is bad: that replica is lost (the object too, if it was its last) */
        if (obj != NULL)
            drop_copy(st, obj, t->ssd.segment_id, t->ssd.offset);
        obj = NULL;
    }
    if (status != KVP_OK || obj == NULL || !dram_ok || obj->n_replicas >= KVP_MAX_REPLICAS ||
        kvp_segment_table_has_tier(&st->segments, obj, false)) {
        if (dram_ok)
            free_extent(st, &t->dram);
        return;
    }
    kvp_replica_t reps[KVP_MAX_REPLICAS];
    reps[0] = t->dram;
    memcpy(&reps[1], obj->replicas, obj->n_replicas * sizeof(reps[0]));
    kvp_object_t *o = kvp_tier_set_replicas(st, obj, reps, obj->n_replicas + 1u);
    if (o == NULL) {
        free_extent(st, &t->dram);
        return;
    }
    st->stats.promoted++;
    kvp_record_replica(&st->segments, o, &t->dram);
    if (!kvp_leased(st, o))
        kvp_policy_move(st, o, kvp_policy_home(st, o), false);
}

/* Drop obj's replica at (segment, offset); the object goes when it was its last. */
static void drop_copy(kvp_master_state_t *st, kvp_object_t *obj, uint64_t segment_id,
                      uint64_t offset)
{
    kvp_replica_t keep[KVP_MAX_REPLICAS], gone = {0};
    unsigned nk = 0;
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        if (obj->replicas[r].segment_id == segment_id && obj->replicas[r].offset == offset)
            gone = obj->replicas[r];
        else
            keep[nk++] = obj->replicas[r];
    }
    if (gone.segment_id == 0)
        return;
    st->stats.ssd_lost++;
    KVP_LOG_WARN_LIMITED("SSD copy of %.*s (segment %#llx, offset %llu) is unreadable: dropped",
                         (int)obj->key_len, kvp_object_key(obj), (unsigned long long)segment_id,
                         (unsigned long long)offset);
    if (nk == 0) {
        kvp_object_remove(st, obj); /* readers in flight fail their read (or CRC) */
        return;
    }
    kvp_object_t *o = kvp_tier_set_replicas(st, obj, keep, nk);
    if (o == NULL)
        return;
    free_extent(st, &gone);
    if (!kvp_leased(st, o) && o->state == KVP_OBJ_COMPLETE)
        kvp_policy_move(st, o, kvp_policy_home(st, o), false);
}

void kvp_tier_ssd_bad(kvp_master_state_t *st, kvp_segment_t *seg, uint64_t offset)
{
    kvp_object_index_t *ix = &st->index;
    for (uint64_t b = 0; b < ix->n_buckets; b++)
        for (kvp_object_t *obj = ix->buckets[b]; obj != NULL; obj = obj->hnext)
            for (unsigned r = 0; r < obj->n_replicas; r++)
                if (obj->state == KVP_OBJ_COMPLETE && obj->replicas[r].segment_id == seg->id &&
                    obj->replicas[r].offset == offset) {
                    drop_copy(st, obj, seg->id, offset);
                    return;
                }
}

/* ---- puts straight to SSD ---- */

void kvp_tier_on_put_end(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (!kvp_tier_has_file(st))
        return;
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        if (!kvp_segment_table_replica_on(&st->segments, &obj->replicas[r], true))
            continue;
        kvp_ssd_task_t *t = kvp_state_task_add(st, KVP_SSD_RECORD, obj->replicas[r].segment_id,
                                               kvp_object_key(obj), obj->key_len);
        if (t == NULL) { /* out of memory: stored, but not recorded */
            KVP_LOG_WARN_LIMITED("SSD segment %#llx: no memory for the record task of %.*s (it "
                                 "will not survive a restart of its owner)",
                                 (unsigned long long)obj->replicas[r].segment_id, (int)obj->key_len,
                                 kvp_object_key(obj));
            continue;
        }
        t->version = obj->version;
        t->size = obj->size;
        t->crc32c = obj->crc32c;
        t->ssd = obj->replicas[r];
    }
}

/* ---- task ends ---- */

void kvp_tier_task_done(kvp_master_state_t *st, uint64_t segment_id, uint64_t task_id,
                        kvp_status_t status)
{
    kvp_ssd_task_t *t = st->tasks;
    while (t != NULL && !(t->id == task_id && t->segment_id == segment_id && t->sent))
        t = t->next;
    if (t == NULL)
        return; /* unknown or ended already (a segment gone) */
    if (t->kind == KVP_SSD_OFFLOAD)
        offload_done(st, t, status);
    else if (t->kind == KVP_SSD_PROMOTE)
        promote_done(st, t, status);
    else if (t->kind == KVP_SSD_RECORD && status != KVP_OK)
        KVP_LOG_WARN_LIMITED("SSD segment %#llx could not record %.*s: %s (it will not survive a "
                             "restart of its owner)",
                             (unsigned long long)segment_id, (int)t->key_len, t->key,
                             kvp_strerror(status));
    kvp_state_task_remove(st, t);
}

void kvp_tier_segment_gone(kvp_master_state_t *st, uint64_t segment_id)
{
    kvp_ssd_task_t *t = st->tasks;
    while (t != NULL) {
        kvp_ssd_task_t *next = t->next;
        bool owner_gone = t->segment_id == segment_id;
        bool dram_gone = t->dram.segment_id == segment_id;
        if (owner_gone || (dram_gone && t->kind == KVP_SSD_PROMOTE)) {
            /* its owner will never report it (or its destination is gone): end it now as
             * failed; what it held is freed (a gone segment's extents go with it) */
            if (t->kind == KVP_SSD_OFFLOAD) {
                st->offloading--;
                st->offloading_bytes -= t->bytes;
                kvp_object_t *obj = lookup(st, t->key, t->key_len, t->version);
                if (obj != NULL && (obj->flags & KVP_OBJ_F_OFFLOADING)) {
                    obj->flags &= (uint8_t)~KVP_OBJ_F_OFFLOADING;
                    if (!kvp_leased(st, obj))
                        kvp_policy_move(st, obj, kvp_policy_home(st, obj), false);
                }
                if (!owner_gone)
                    free_extent(st, &t->ssd);
            } else if (t->kind == KVP_SSD_PROMOTE) {
                kvp_object_t *obj = lookup(st, t->key, t->key_len, t->version);
                if (obj != NULL)
                    obj->flags &= (uint8_t)~KVP_OBJ_F_PROMOTING;
                if (!dram_gone)
                    free_extent(st, &t->dram);
            }
            kvp_state_task_remove(st, t);
        }
        t = next;
    }
}
