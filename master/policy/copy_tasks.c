/*
 * copy_tasks.c - the life of copy and move tasks, shared by their calls (rpc/task_calls.c,
 * where the protocol is described) and the hot-key fanout (policy/hot_keys.c).
 *
 * Design. A task is made PENDING for the owner of a DRAM replica (kvp_task_add), started
 * and ended by that owner's calls, and ended here otherwise: by the timer when it has not
 * started within START_WAIT_MS or not ended by its deadline (--put-timeout after its
 * start), and, for a move whose new replica is in while readers may be on the source,
 * finished by the timer once no read leases the object (kvp_task_drop_source). A task that
 * fails frees the extents it holds: its new replicas become visible together or not at all.
 * Ended tasks are kept for TaskQuery, per tenant: the kvp_task_tenant_max that ended last of
 * each tenant, and KVP_TASKS_KEPT_MAX in all, taken from the tenants that keep the most
 * (meta/task_table.c); the older ones go at the next kvp_task_add, a tenant's own at its own
 * add. So one tenant's flood of tasks costs its own history, not another's. The tasks live in
 * meta/task_table.c, indexed by id, by runner and by tenant, so no call here walks more than
 * the live tasks (the timer) or what it changes.
 *
 * Thread: master loop only.
 */
#include "master/policy/copy_tasks.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "master/meta/record.h"
#include "master/policy/lease.h"
#include "master/policy/tier.h"

#define START_WAIT_MS 30000 /* a PENDING task its runner has not started by then fails */

uint32_t kvp_task_tenant_max(const kvp_master_state_t *st)
{
    if (!st->tenants_on)
        return KVP_TASKS_LIVE_MAX;
    if (st->config.max_tasks_per_tenant != 0)
        return st->config.max_tasks_per_tenant;
    /* the ACL's tenants, not every tenant a key named: an Adopt or a quota call that names
     * tenants never shrinks the others' share */
    uint32_t share = KVP_TASKS_LIVE_MAX / (st->acl_tenants > 0 ? st->acl_tenants : 1);
    return share > 0 ? share : 1;
}

static bool task_live(const kvp_task_t *t)
{
    return t->status == KVP_TASK_PENDING || t->status == KVP_TASK_PROCESSING;
}

/* Free the extents a task holds (not yet the object's). */
static void task_free_dests(kvp_master_state_t *st, kvp_task_t *t)
{
    for (unsigned i = 0; i < t->n_dests; i++)
        kvp_segment_table_free_extent(&st->segments, &t->dests[i]);
    t->n_dests = 0;
}

void kvp_task_end(kvp_master_state_t *st, kvp_task_t *t, uint8_t status, const char *fmt, ...)
{
    if (!task_live(t))
        return;
    if (status == KVP_TASK_FAILED)
        task_free_dests(st, t);
    t->n_dests = 0;
    kvp_task_table_end(&st->copy_tasks, t, status);
    t->message[0] = '\0';
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t->message, sizeof(t->message), fmt, ap);
        va_end(ap);
    }
    if (status == KVP_TASK_SUCCESS) {
        st->stats.tasks_succeeded++;
    } else {
        st->stats.tasks_failed++;
        KVP_LOG_INFO("%s task %016" PRIx64 "%016" PRIx64 " failed: %s",
                     t->kind == KVP_TASK_COPY ? "copy" : "move", t->id_hi, t->id_lo, t->message);
    }
}

kvp_object_t *kvp_task_object(kvp_master_state_t *st, const kvp_task_t *t)
{
    kvp_object_t *obj =
        kvp_index_lookup(&st->index, t->key, t->key_len, kvp_index_hash(t->key, t->key_len));
    return obj != NULL && obj->state == KVP_OBJ_COMPLETE ? obj : NULL;
}

kvp_segment_t *kvp_task_source(kvp_master_state_t *st, const kvp_object_t *obj)
{
    kvp_segment_t *any = NULL;
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        kvp_segment_t *seg = kvp_segment_table_get(&st->segments, obj->replicas[r].segment_id);
        if (seg == NULL || seg->ssd)
            continue;
        if (!seg->draining)
            return seg;
        any = seg;
    }
    return any;
}

kvp_task_t *kvp_task_add(kvp_master_state_t *st, const kvp_object_t *obj, uint8_t kind,
                         const kvp_segment_t *source, const uint64_t *targets, unsigned n_targets)
{
    kvp_task_t *t = calloc(1, sizeof(*t) + obj->key_len);
    if (t == NULL)
        return NULL;
    t->kind = kind;
    t->tenant = obj->tenant;
    t->deadline_ms = st->now_ms + START_WAIT_MS;
    t->source_seg = source->id;
    t->exec_conn = source->owner_conn_id;
    t->n_targets = (uint8_t)n_targets;
    memcpy(t->targets, targets, n_targets * sizeof(*targets));
    snprintf(t->assigned, sizeof(t->assigned), "%s", source->name);
    t->key_len = obj->key_len;
    memcpy(t->key, kvp_object_key(obj), obj->key_len);
    if (!kvp_task_table_add(&st->copy_tasks, t)) {
        free(t);
        return NULL;
    }
    st->stats.tasks_created++;
    kvp_task_table_trim_tenant(&st->copy_tasks, t->tenant, kvp_task_tenant_max(st));
    kvp_task_table_trim(&st->copy_tasks, KVP_TASKS_KEPT_MAX);
    return t;
}

bool kvp_task_drop_replica(kvp_master_state_t *st, kvp_object_t *obj, uint64_t segment_id)
{
    int r = kvp_object_replica_on(obj, segment_id);
    if (r < 0 || obj->n_replicas < 2)
        return true; /* none there, or its last: nothing taken */
    kvp_replica_t reps[KVP_MAX_REPLICAS], gone = obj->replicas[r];
    unsigned n = 0;
    for (unsigned i = 0; i < obj->n_replicas; i++)
        if ((int)i != r)
            reps[n++] = obj->replicas[i];
    if (kvp_tier_set_replicas(st, obj, reps, n) == NULL)
        return false;
    kvp_segment_table_free_extent(&st->segments, &gone);
    return true;
}

void kvp_task_drop_source(kvp_master_state_t *st, kvp_task_t *t, kvp_object_t *obj)
{
    if (!kvp_task_drop_replica(st, obj, t->source_seg))
        kvp_task_end(st, t, KVP_TASK_FAILED,
                     "out of memory dropping the source replica (the object keeps both)");
    else
        kvp_task_end(st, t, KVP_TASK_SUCCESS, NULL);
}

void kvp_task_tick(kvp_master_state_t *st)
{
    /* (t may end, leaving the live list: its successor is taken first) */
    for (kvp_task_t *t = st->copy_tasks.live, *nx; t != NULL; t = nx) {
        nx = t->next;
        if (t->drop_pending) {
            kvp_object_t *obj = kvp_task_object(st, t);
            if (obj == NULL || obj->version != t->version)
                kvp_task_end(st, t, KVP_TASK_SUCCESS, NULL); /* the object went: nothing to drop */
            else if (!kvp_leased(st, obj))
                kvp_task_drop_source(st, t, obj);
            else if (st->now_ms >= t->deadline_ms)
                kvp_task_end(st, t, KVP_TASK_FAILED,
                             "the object is still being read: it keeps its source replica too");
            continue;
        }
        if (st->now_ms >= t->deadline_ms)
            kvp_task_end(st, t, KVP_TASK_FAILED,
                         t->status == KVP_TASK_PENDING ? "the owner of %s did not start it in time"
                                                       : "the owner of %s did not end it in time",
                         t->assigned);
    }
}
