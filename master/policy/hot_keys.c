/*
 * hot_keys.c - hot-key replica fanout: a key read often gets replicas on more segments,
 * and loses them when it cools (--hot-key-reads N, --hot-key-replicas K).
 *
 * Design. Every read the master grants (GetReplicaList) is counted in a table of the keys
 * read in the current one-second window: open addressing by the key's index hash, at most
 * HOT_KEYS of them (a key first read when the table is full is not counted that window);
 * the key's bytes are copied once, when it reaches N reads. At the end of each window:
 * - a key read N times or more is hot: while it has fewer than K replicas of its own, it
 *   gets a copy task (policy/copy_tasks.c) to one more DRAM segment (one on another host
 *   first, the one with the most room), written by the owner of a replica as any copy;
 *   when that task succeeds the new replica is the key's (one task in flight at a time);
 * - a key that was given replicas and is read fewer than N/4 times a second for
 *   COOL_WINDOWS windows in a row loses them, one a window, the last given first, when no
 *   read leases the object (a reader may be on the replica);
 * - every other key is forgotten, so the table holds the keys read this window and the
 *   hot ones. A key overwritten, removed or evicted is forgotten with its replicas (they
 *   went with the object).
 * Replicas given to a hot key are ordinary replicas: a get may read any of them, eviction
 * takes them with the object.
 *
 * Thread: master loop only.
 */
#include "master/policy/hot_keys.h"

#include <stdlib.h>
#include <string.h>

#include "master/meta/object_index.h"
#include "master/meta/record.h"
#include "master/policy/copy_tasks.h"
#include "master/policy/lease.h"

#define HOT_SLOTS 4096u /* the table: a power of two */
#define HOT_KEYS 3072u  /* keys in it at most (3/4 of the slots) */
#define WINDOW_MS 1000u /* the counting window */
#define COOL_WINDOWS 5  /* windows under N/4 before a key loses its replicas */

static uint64_t slot_hash(uint64_t hash)
{
    return hash != 0 ? hash : 1; /* 0 marks a free slot */
}

/* The entry of hash, made when absent and there is room; NULL otherwise. */
static kvp_hot_key_t *hot_get(kvp_master_state_t *st, uint64_t hash, bool make)
{
    for (uint32_t i = (uint32_t)(hash >> 20) & st->hot_mask;; i = (i + 1) & st->hot_mask) {
        kvp_hot_key_t *e = &st->hot[i];
        if (e->hash == hash)
            return e;
        if (e->hash == 0) {
            if (!make || st->hot_count >= HOT_KEYS)
                return NULL;
            memset(e, 0, sizeof(*e));
            e->hash = hash;
            st->hot_count++;
            return e;
        }
    }
}

/* Remove the entry at slot i (its key freed), shifting back the run after it. */
static void hot_del(kvp_master_state_t *st, uint32_t i)
{
    free(st->hot[i].key);
    uint32_t m = st->hot_mask;
    for (uint32_t j = (i + 1) & m; st->hot[j].hash != 0; j = (j + 1) & m) {
        uint32_t k = (uint32_t)(st->hot[j].hash >> 20) & m; /* its home */
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            st->hot[i] = st->hot[j];
            i = j;
        }
    }
    memset(&st->hot[i], 0, sizeof(st->hot[i]));
    st->hot_count--;
}

void kvp_hot_on_read(kvp_master_state_t *st, const kvp_object_t *obj)
{
    uint32_t n = st->config.hot_key_reads;
    if (n == 0)
        return;
    if (st->hot == NULL) { /* once, the first read with the fanout on */
        st->hot = calloc(HOT_SLOTS, sizeof(*st->hot));
        if (st->hot == NULL)
            return;
        st->hot_mask = HOT_SLOTS - 1;
        st->hot_window_ms = st->now_ms + WINDOW_MS;
    }
    kvp_hot_key_t *e = hot_get(st, slot_hash(obj->hash), true);
    if (e == NULL)
        return;
    if (e->key != NULL && e->version != obj->version)
        return; /* another value than the one given replicas: the tick forgets it */
    e->version = obj->version;
    e->reads++;
    if (e->key == NULL && e->reads >= n) {
        e->key = malloc(obj->key_len);
        if (e->key == NULL) {
            e->reads = 0; /* counted again next window */
            return;
        }
        memcpy(e->key, kvp_object_key(obj), obj->key_len);
        e->key_len = obj->key_len;
    }
}

/* A DRAM segment obj has no replica on that may take one more: on another host than its
 * replicas first, then the one with the most room. NULL: none. */
static kvp_segment_t *fanout_target(kvp_master_state_t *st, const kvp_object_t *obj)
{
    kvp_segment_t *best = NULL;
    bool best_new_host = false;
    uint64_t best_free = 0;
    for (uint32_t i = 0; i < st->segments.n_slots; i++) {
        kvp_segment_t *seg = st->segments.slots[i];
        if (seg == NULL || seg->ssd || !kvp_segment_open(seg) ||
            kvp_object_replica_on(obj, seg->id) >= 0 ||
            (seg->dedicated && seg->tenant != obj->tenant))
            continue;
        uint64_t used = kvp_segment_used(seg), free_b = seg->size > used ? seg->size - used : 0;
        if (free_b < obj->size)
            continue;
        bool new_host = true;
        for (unsigned r = 0; r < obj->n_replicas; r++) {
            const kvp_segment_t *o =
                kvp_segment_table_get(&st->segments, obj->replicas[r].segment_id);
            if (o != NULL && strcmp(o->host_id, seg->host_id) == 0)
                new_host = false;
        }
        if (best == NULL || (new_host && !best_new_host) ||
            (new_host == best_new_host && free_b > best_free)) {
            best = seg;
            best_new_host = new_host;
            best_free = free_b;
        }
    }
    return best;
}

/* One more replica for hot key e (obj): a copy task. */
static void fanout(kvp_master_state_t *st, kvp_hot_key_t *e, const kvp_object_t *obj)
{
    if (obj->n_replicas >= KVP_MAX_REPLICAS || (obj->flags & KVP_OBJ_F_COPYING) != 0)
        return;
    /* the replica counts against the tenant's DRAM quota: none for a tenant it would take
     * past it, or whose admission is closed (the copy's start would refuse it anyway) */
    const kvp_tenant_t *tn = &st->tenants.t[obj->tenant];
    if (tn->closed || !kvp_tenant_dram_fits(tn, obj->size))
        return;
    kvp_segment_t *src = kvp_task_source(st, obj), *dst = fanout_target(st, obj);
    if (src == NULL || dst == NULL)
        return;
    kvp_task_t *t = kvp_task_add(st, obj, KVP_TASK_COPY, src, &dst->id, 1);
    if (t == NULL)
        return;
    e->pending = true;
    e->task_hi = t->id_hi;
    e->task_lo = t->id_lo;
    e->task_target = dst->id;
}

/* Take back the replica hot key e was given last (obj unleased). */
static void take_back(kvp_master_state_t *st, kvp_hot_key_t *e, kvp_object_t *obj)
{
    uint64_t seg = e->dyn[e->n_dyn - 1];
    bool dropping = kvp_object_replica_on(obj, seg) >= 0 && obj->n_replicas > 1;
    if (!kvp_task_drop_replica(st, obj, seg))
        return; /* out of memory: again next window */
    st->stats.hot_dropped += dropping;
    e->n_dyn--; /* (one gone with its segment, or the key's last: nothing freed) */
}

/* The end of a window for e: false when it is to be forgotten. */
static bool window_end(kvp_master_state_t *st, kvp_hot_key_t *e)
{
    uint32_t n = st->config.hot_key_reads;
    if (e->pending) {
        const kvp_task_t *t = kvp_task_table_find(&st->copy_tasks, e->task_hi, e->task_lo);
        if (t != NULL && (t->status == KVP_TASK_PENDING || t->status == KVP_TASK_PROCESSING))
            return true;
        e->pending = false; /* (gone: trimmed, as good as failed) */
        if (t != NULL && t->status == KVP_TASK_SUCCESS && e->n_dyn < KVP_HOT_REPLICAS_MAX) {
            e->dyn[e->n_dyn++] = e->task_target;
            st->stats.hot_added++;
        }
    }
    if (e->key == NULL)
        return false; /* never hot, nothing given */
    kvp_object_t *obj =
        kvp_index_lookup(&st->index, e->key, e->key_len, kvp_index_hash(e->key, e->key_len));
    if (obj == NULL || obj->state != KVP_OBJ_COMPLETE || obj->version != e->version)
        return false; /* gone or overwritten: its replicas went with it */
    if (e->reads >= n) {
        e->cool = 0;
        if (e->n_dyn < st->config.hot_key_replicas)
            fanout(st, e, obj);
        return true;
    }
    if (e->n_dyn == 0)
        return false;
    if ((uint64_t)e->reads * 4 >= n) {
        e->cool = 0;
        return true;
    }
    if (e->cool < COOL_WINDOWS)
        e->cool++;
    if (e->cool >= COOL_WINDOWS && !kvp_leased(st, obj))
        take_back(st, e, obj);
    return e->n_dyn > 0;
}

void kvp_hot_tick(kvp_master_state_t *st)
{
    if (st->hot == NULL || st->now_ms < st->hot_window_ms)
        return;
    st->hot_window_ms = st->now_ms + WINDOW_MS;
    /* Each entry once: a deletion shifts later entries back, maybe one already seen from
     * the start of the table (a run that wraps): those are marked by the pass. */
    static const uint32_t SEEN = 1u << 31;
    for (uint32_t i = 0; i <= st->hot_mask;) {
        kvp_hot_key_t *e = &st->hot[i];
        if (e->hash == 0 || (e->reads & SEEN)) {
            i++;
            continue;
        }
        if (!window_end(st, e)) {
            hot_del(st, i); /* slot i may hold another entry now: looked at next */
            continue;
        }
        e->reads = SEEN;
        i++;
    }
    for (uint32_t i = 0; i <= st->hot_mask; i++)
        st->hot[i].reads &= ~SEEN;
}
