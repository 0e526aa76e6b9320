/*
 * state.c - set-up and teardown of the master's state (state.h).
 *
 * Design: teardown goes leases first (they alone free RETIRED objects, which
 * are in no index), then moves, objects, segments (their allocators).
 *
 * Thread: the loop's (before it starts and after it ends).
 */
#include "master/core/state.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/rand.h"
#include "master/meta/limbo.h"

kvp_status_t kvp_master_state_init(kvp_master_state_t *st)
{
    memset(st, 0, sizeof(*st));
    kvp_segment_table_init(&st->segments);
    kvp_master_config_init(&st->config);
    kvp_lease_table_init(&st->leases);
    st->now_ms = kvp_now_ms();
    st->rng = kvp_random_u64();
    /* versions start at the wall clock (1/16 us): a restarted master, or a new leader,
     * gives larger ones than the copies segments kept from before (unless its predecessor
     * gave more than 16 versions a microsecond on average) */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    st->version_clock = ((uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u) << 4;
    kvp_status_t s = kvp_tenant_table_init(&st->tenants);
    if (s != KVP_OK)
        return s;
    s = kvp_group_table_init(&st->groups);
    if (s != KVP_OK)
        return s;
    s = kvp_index_init(&st->index);
    st->index.charge = kvp_state_charge;
    st->index.charge_arg = st;
    st->index.groups = &st->groups;
    st->segments.groups = &st->groups;
    return s;
}

static void charge_one(uint64_t *v, uint64_t by, int sign)
{
    *v = sign > 0 ? *v + by : *v > by ? *v - by : 0;
}

void kvp_state_charge(void *arg, const kvp_object_t *obj, int sign)
{
    kvp_master_state_t *st = arg;
    /* a hold's extents (PUT_COMMIT) are room placed ahead, no object stored: counted apart */
    bool hold = (obj->flags & KVP_OBJ_F_HOLD) != 0;
    if (hold)
        charge_one(&st->holds, 1, sign);
    for (unsigned i = 0; hold && i < obj->n_replicas; i++) {
        kvp_segment_t *seg =
            obj->replicas[i].segment_id == 0
                ? NULL
                : kvp_segment_table_get(&st->segments, obj->replicas[i].segment_id);
        if (seg != NULL) {
            charge_one(&seg->held, 1, sign);
            charge_one(&seg->held_bytes,
                       (obj->size + KVP_SEGMENT_ALIGN - 1) / KVP_SEGMENT_ALIGN * KVP_SEGMENT_ALIGN,
                       sign);
            charge_one(&st->held_bytes, obj->size, sign);
            if (obj->tenant < st->tenants.n)
                charge_one(&st->tenants.t[obj->tenant].held_bytes, obj->size, sign);
        }
    }
    if (hold && obj->tenant < st->tenants.n)
        charge_one(&st->tenants.t[obj->tenant].holds, 1, sign);
    /* ... and apart for its tenant: held_bytes only (its quota counts them, its usage, share
     * and objects do not) */
    if (hold || obj->tenant >= st->tenants.n)
        return;
    kvp_tenant_t *t = &st->tenants.t[obj->tenant];
    for (unsigned i = 0; i < obj->n_replicas; i++) {
        if (obj->replicas[i].segment_id == 0)
            continue; /* lost while PENDING (its segment went) */
        const kvp_segment_t *seg =
            kvp_segment_table_get(&st->segments, obj->replicas[i].segment_id);
        if (seg != NULL)
            charge_one(seg->ssd ? &t->ssd_bytes : &t->dram_bytes, obj->size, sign);
    }
    charge_one(&t->objects, 1, sign);
}

unsigned kvp_state_media(const kvp_master_state_t *st, const kvp_replica_t *reps, unsigned n)
{
    unsigned m = 0;
    for (unsigned i = 0; i < n; i++) {
        if (reps[i].segment_id == 0)
            continue;
        const kvp_segment_t *seg = kvp_segment_table_get(&st->segments, reps[i].segment_id);
        if (seg != NULL)
            m |= 1u << (seg->ssd ? KVP_MEDIUM_DISK : KVP_MEDIUM_CPU);
    }
    return m;
}

void kvp_state_media_event(kvp_master_state_t *st, const kvp_object_t *obj, unsigned before,
                           unsigned after)
{
    if (st->events == NULL)
        return;
    const char *key = kvp_object_key(obj);
    for (unsigned m = 0; m < KVP_MEDIUM_COUNT; m++) {
        unsigned bit = 1u << m;
        if ((after & bit) && !(before & bit))
            kvp_event_stored(st->events, (kvp_medium_t)m, key, obj->key_len);
        else if ((before & bit) && !(after & bit))
            kvp_event_removed(st->events, (kvp_medium_t)m, key, obj->key_len);
    }
}

void kvp_master_state_cleanup(kvp_master_state_t *st)
{
    kvp_lease_table_cleanup(&st->leases); /* first: it frees retired objects only */
    kvp_ghost_cleanup(&st->ghost);
    kvp_tombstone_cleanup(&st->tombstones);
    while (st->limbo != NULL) {
        kvp_limbo_t *l = st->limbo;
        st->limbo = l->next;
        kvp_limbo_free(l);
    }
    while (st->tasks != NULL) {
        kvp_ssd_task_t *t = st->tasks;
        st->tasks = t->next;
        free(t);
    }
    st->n_tasks = 0;
    while (st->moves != NULL) {
        kvp_move_t *mv = st->moves;
        st->moves = mv->next;
        free(mv);
    }
    for (uint32_t i = 0; st->hot != NULL && i <= st->hot_mask; i++)
        free(st->hot[i].key);
    free(st->hot);
    kvp_task_table_cleanup(&st->copy_tasks); /* (the tasks' extents go with the segments) */
    if (st->drain_jobs_free != NULL)
        st->drain_jobs_free(st);
    free(st->group_evictions); /* (the groups they hold go whole, below) */

    st->index.charge = NULL; /* nothing is charged any more */
    st->index.groups = NULL; /* (the table goes whole, below) */
    kvp_index_cleanup(&st->index);
    kvp_group_table_cleanup(&st->groups);
    kvp_segment_table_cleanup(&st->segments);
    kvp_tenant_table_cleanup(&st->tenants);
    free(st->closed_writers);
    free(st->scope_buf);
    free(st->grant_buf);
    free(st->scope_orig);
}

kvp_ssd_task_t *kvp_state_task_add(kvp_master_state_t *st, kvp_ssd_task_kind_t kind,
                                   uint64_t segment_id, const char *key, size_t key_len)
{
    kvp_ssd_task_t *t = calloc(1, sizeof(*t) + key_len);
    if (t == NULL)
        return NULL;
    t->id = ++st->next_task_id;
    t->kind = (uint8_t)kind;
    t->segment_id = segment_id;
    t->key_len = (uint16_t)key_len;
    memcpy(t->key, key, key_len);
    if (st->tasks_tail != NULL)
        st->tasks_tail->next = t;
    else
        st->tasks = t;
    st->tasks_tail = t;
    st->n_tasks++;
    st->tasks_ready = true;
    return t;
}

void kvp_state_task_remove(kvp_master_state_t *st, kvp_ssd_task_t *task)
{
    kvp_ssd_task_t *prev = NULL;
    for (kvp_ssd_task_t *t = st->tasks; t != NULL; prev = t, t = t->next) {
        if (t != task)
            continue;
        if (prev != NULL)
            prev->next = t->next;
        else
            st->tasks = t->next;
        if (st->tasks_tail == t)
            st->tasks_tail = prev;
        st->n_tasks--;
        free(t);
        return;
    }
}

void kvp_state_forget_ssd(kvp_master_state_t *st, const kvp_object_t *obj)
{
    if (st->segments.capacity_ssd + st->segments.capacity_dfs == 0 || obj->state == KVP_OBJ_PENDING)
        return;
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        if (!kvp_segment_table_replica_on(&st->segments, &obj->replicas[r], true))
            continue;
        kvp_ssd_task_t *t = kvp_state_task_add(st, KVP_SSD_FORGET, obj->replicas[r].segment_id,
                                               kvp_object_key(obj), obj->key_len);
        if (t != NULL) { /* else the entry stays; its version or its CRC refuse it later */
            t->ssd = obj->replicas[r];
            t->version = obj->version;
            t->size = obj->size;
        }
    }
}
