/*
 * task_calls.c - copy and move tasks: TaskCreate, TaskQuery, TaskStart, TaskEnd, the
 * heartbeat's offers and the end of a closed connection's tasks (their life otherwise, the
 * timer's part included: policy/copy_tasks.c; their table: meta/task_table.c).
 *
 * Design. Mooncake's create_copy_task (new replicas of an object on named segments) and
 * create_move_task (its replica on one segment taken to another) are done in the background
 * by the owner of a source replica, never through the master. TaskCreate checks the key and
 * the segments and records the task, PENDING, for the owner of a DRAM segment holding a
 * replica (the copy is written from that owner's memory); that owner's next heartbeat offers
 * it; TaskStart gives it the source extent and a new extent on each target that holds no
 * replica yet, with write grants (PROCESSING); the owner writes them, their CRC checked on
 * the way (client/control/task.c), and TaskEnd adds the new replicas (COPY) or swaps the
 * target's in for the source's (MOVE), if the object is still the one copied (same version,
 * size and CRC) and every copy was written. Otherwise the new extents are freed and the task
 * FAILED: its new replicas become visible together or not at all. A MOVE whose object is
 * being read keeps both replicas until no read leases it (the timer), then frees the
 * source's. A task whose runner's connection closes, or that has not ended by its deadline
 * (30 s to start, then --put-timeout), FAILED, its extents freed. Ended tasks are kept for
 * TaskQuery (those that ended last: policy/copy_tasks.c). Tasks live in the master's memory
 * only: an id carries the master that gave it (48 random bits drawn at its first task, and a
 * 16-bit check), so after a restart or a failover a TaskQuery of an earlier master's task
 * answers FAILED, saying why, while a made-up id is NOT_FOUND; its runner's TaskEnd is
 * NOT_FOUND, so extents it wrote were never the object's.
 *
 * Cost. Each call looks its tasks up in the table (meta/task_table.h): TaskQuery, and each
 * task a TaskStart or TaskEnd names, by id in O(1); a heartbeat's offers are its
 * connection's waiting tasks, O(what it offers); a closed connection fails its own, O(those).
 *
 * Who. TaskCreate needs the write role and the key (the dispatcher checks both, and scopes
 * the key to the caller's tenant); the task is that tenant's: a TaskQuery of it by another
 * tenant is NOT_FOUND, as an unknown id. Targets are mounted DRAM segments that take new
 * replicas and are not dedicated to another tenant; the copies count against the tenant's
 * DRAM quota. TaskStart and TaskEnd come from the connection that owns the source segment
 * only (NOT_OWNER otherwise, and nothing changes).
 *
 * Caps. At most KVP_TASKS_LIVE_MAX tasks wait or run at once, and, with an ACL, at most
 * kvp_task_tenant_max of one tenant (the tenant of the caller's credential): TaskCreate past
 * either is TOO_MANY, naming the cap, counted (kvpool_tasks_refused_total). A tenant's share
 * keeps one tenant's flood from taking the others' room; the ended tasks kept for TaskQuery
 * are bounded per tenant the same way (policy/copy_tasks.c).
 *
 * Thread: master loop only.
 */
#include "master/rpc/task_calls.h"

#include <stdio.h>
#include <string.h>

#include "common/grant.h"
#include "common/macros.h"
#include "master/meta/placement.h"
#include "master/meta/record.h"
#include "master/policy/copy_tasks.h"
#include "master/policy/lease.h"
#include "master/policy/tier.h"
#include "master/rpc/reply.h"

_Static_assert(KVP_MAX_REPLICAS == 8, "messages below say 8");

/* The task of that id, or NULL. */
static kvp_task_t *task_find(kvp_master_state_t *st, uint64_t hi, uint64_t lo)
{
    return kvp_task_table_find(&st->copy_tasks, hi, lo);
}

/* ---------------- TaskCreate ---------------- */

/* The target named `name` for obj's task, or NULL with why in r. */
static kvp_segment_t *target_check(kvp_master_state_t *st, kvp_reply_t *r, const kvp_object_t *obj,
                                   const char *name)
{
    kvp_segment_t *seg = kvp_segment_table_find_name(&st->segments, name);
    if (seg == NULL)
        snprintf(r->text, sizeof(r->text), "no segment %s is mounted", name);
    else if (seg->ssd)
        snprintf(r->text, sizeof(r->text), "%s is an SSD segment: copies go to DRAM segments",
                 name);
    else if (!kvp_segment_open(seg))
        snprintf(r->text, sizeof(r->text), "%s takes no new replicas now (draining or adopting)",
                 name);
    else if (seg->dedicated && seg->tenant != obj->tenant)
        snprintf(r->text, sizeof(r->text), "%s is dedicated to another tenant", name);
    else
        return seg;
    return NULL;
}

/* Has the caller's tenant (from its credential) or the master room for one more task?
 * KVP_OK, or TOO_MANY with the cap in r, counted. */
static kvp_status_t room_check(kvp_call_t *call, kvp_reply_t *r)
{
    kvp_master_state_t *st = call->st;
    kvp_task_table_t *tt = &st->copy_tasks;
    if (st->tenants_on && call->who != NULL) {
        uint32_t cap = kvp_task_tenant_max(st);
        uint32_t n = kvp_task_table_tenant_live(tt, call->who->tenant_id);
        if (n >= cap) {
            tt->refused_tenant++;
            char share[96] = "";
            if (st->config.max_tasks_per_tenant == 0)
                snprintf(share, sizeof(share),
                         "an equal share of the master's %u among the ACL's %u "
                         "tenants; ",
                         KVP_TASKS_LIVE_MAX, st->acl_tenants);
            snprintf(r->text, r->text_max,
                     "tenant %s has %u copy and move tasks waiting or running, at most %u a "
                     "tenant (%s--max-tasks-per-tenant): wait for some to end",
                     call->who->tenant, n, cap, share);
            return KVP_ERR_TOO_MANY;
        }
    }
    if (tt->n_live >= KVP_TASKS_LIVE_MAX) {
        tt->refused_master++;
        snprintf(r->text, r->text_max,
                 "%u copy and move tasks are waiting or running already, the most the master "
                 "holds; wait for some to end",
                 KVP_TASKS_LIVE_MAX);
        return KVP_ERR_TOO_MANY;
    }
    return KVP_OK;
}

kvp_status_t kvp_handle_task_create(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__TaskCreateRequest *req = (Kvpool__TaskCreateRequest *)req_msg;
    Kvpool__TaskCreateResponse resp = KVPOOL__TASK_CREATE_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 320);
    if (req->kind != KVP_TASK_COPY && req->kind != KVP_TASK_MOVE)
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, "task kind %u: 0 copy or 1 move", req->kind);
    bool move = req->kind == KVP_TASK_MOVE;
    if (req->n_keys != 1)
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, "a task names one key, not %zu",
                              req->n_keys);
    if (req->n_targets == 0 || req->n_targets > (move ? 1u : KVP_TASK_TARGETS_MAX))
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG,
                              move ? "a move names one target"
                                   : "a copy names 1 to 8 target segments");
    _Static_assert(KVP_TASK_TARGETS_MAX == 8, "the message above says 8");
    kvp_status_t status = room_check(call, &r);
    if (status != KVP_OK)
        return kvp_reply_fail(&r, status, NULL);
    kvp_object_t *obj;
    status = kvp_call_key_lookup(st, &req->keys[0], &obj, NULL);
    if (status != KVP_OK)
        return kvp_reply_fail(&r, status, NULL);
    if (obj == NULL || obj->state != KVP_OBJ_COMPLETE)
        return kvp_reply_fail(&r, KVP_ERR_NOT_FOUND, "no such object");
    kvp_segment_t *source;
    if (move) {
        source = kvp_segment_table_find_name(&st->segments, req->source);
        if (source == NULL || kvp_object_replica_on(obj, source->id) < 0)
            return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, "%s holds no replica of the object",
                                  req->source);
        if (source->ssd)
            return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG,
                                  "%s is an SSD segment: moves start from DRAM replicas",
                                  req->source);
    } else {
        source = kvp_task_source(st, obj);
        if (source == NULL)
            return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG,
                                  "the object has no DRAM replica to copy from");
    }
    uint64_t targets[KVP_TASK_TARGETS_MAX];
    unsigned n_targets = 0;
    for (size_t i = 0; i < req->n_targets; i++) {
        kvp_segment_t *seg = target_check(st, &r, obj, req->targets[i]);
        if (seg == NULL)
            return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, NULL);
        if (move && seg == source)
            return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, "source and target are the same");
        if (move && kvp_object_replica_on(obj, seg->id) >= 0)
            return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, "%s holds a replica already", seg->name);
        bool dup = false;
        for (unsigned k = 0; k < n_targets; k++)
            dup |= targets[k] == seg->id;
        if (!dup)
            targets[n_targets++] = seg->id;
    }
    kvp_task_t *t = kvp_task_add(st, obj, (uint8_t)req->kind, source, targets, n_targets);
    if (t == NULL)
        return kvp_reply_abort(&r);
    resp.id_hi = t->id_hi;
    resp.id_lo = t->id_lo;
    return kvp_reply_send(&r);
}

/* ---------------- TaskQuery ---------------- */

/* resp filled from t. */
static void task_describe(const kvp_task_t *t, Kvpool__TaskQueryResponse *resp)
{
    resp->kind = t->kind;
    resp->task_status = t->status;
    resp->created_ms = t->created_ms;
    resp->updated_ms = t->updated_ms;
    resp->assigned_client = (char *)t->assigned;
    resp->message = (char *)t->message;
}

/* The task of that id the caller may see (its tenant's), or NULL. */
static kvp_task_t *task_for(kvp_call_t *call, uint64_t hi, uint64_t lo)
{
    kvp_task_t *t = task_find(call->st, hi, lo);
    if (t != NULL && call->who != NULL && call->who->tenant_id != t->tenant)
        return NULL; /* another tenant's: as unknown */
    return t;
}

kvp_status_t kvp_handle_task_query(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    Kvpool__TaskQueryRequest *req = (Kvpool__TaskQueryRequest *)req_msg;
    Kvpool__TaskQueryResponse resp = KVPOOL__TASK_QUERY_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    kvp_task_t *t = task_for(call, req->id_hi, req->id_lo);
    if (t == NULL && kvp_task_id_earlier(&call->st->copy_tasks, req->id_hi, req->id_lo)) {
        /* an earlier master's (a restart, a failover): its tasks ended with it, and nothing
         * of them became a replica here */
        resp.task_status = KVP_TASK_FAILED;
        resp.assigned_client = "";
        resp.message = "the master that had this task stopped (a restart or a failover): its "
                       "tasks ended with it, and nothing of them was kept";
        return kvp_reply_send(&r);
    }
    if (t == NULL)
        return kvp_reply_fail(&r, KVP_ERR_NOT_FOUND, NULL);
    task_describe(t, &resp);
    return kvp_reply_send(&r);
}

/* ---------------- the heartbeat's offers ---------------- */

size_t kvp_task_offers(kvp_master_state_t *st, uint64_t conn_id, Kvpool__TaskOffer *out, size_t max)
{
    size_t n = 0;
    for (kvp_task_t *t = kvp_task_table_waiting(&st->copy_tasks, conn_id); t != NULL && n < max;
         t = t->run_next) {
        kvpool__task_offer__init(&out[n]);
        out[n].id_hi = t->id_hi;
        out[n].id_lo = t->id_lo;
        out[n].segment_id = t->source_seg;
        n++;
    }
    return n;
}

/* ---------------- TaskStart ---------------- */

#define BATCH_MAX 64 /* tasks a TaskStart or TaskEnd names at most */

/* May the caller start or end t (in state `want`) now? KVP_OK, or why not (*why_p). */
static kvp_status_t runner_check(const kvp_call_t *call, const kvp_task_t *t, uint8_t want,
                                 const char **why_p)
{
    if (t == NULL) {
        *why_p = "no such task";
        return KVP_ERR_NOT_FOUND;
    }
    if (t->exec_conn != call->conn_id) {
        *why_p = "the task is for the owner of its source segment";
        return KVP_ERR_NOT_OWNER;
    }
    if (t->status != want || t->drop_pending) {
        *why_p = t->status == KVP_TASK_PENDING      ? "the task is not started"
                 : t->status == KVP_TASK_PROCESSING ? "the task is started already"
                                                    : "the task is over";
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}

/* Start t (PENDING, the caller its runner): an extent on each target that holds no replica
 * yet, in t->dests, and t PROCESSING (SUCCESS with none to write). Anything else ends it
 * FAILED, why in t->message, and returns the status. *obj_p, *src_p: the object and its
 * source replica. */
static kvp_status_t start_one(kvp_master_state_t *st, kvp_task_t *t, kvp_object_t **obj_p,
                              int *src_p)
{
    kvp_object_t *obj = kvp_task_object(st, t);
    int src = obj != NULL ? kvp_object_replica_on(obj, t->source_seg) : -1;
    if (src < 0) {
        kvp_task_end(st, t, KVP_TASK_FAILED,
                     "the object or its source replica went before it began");
        return KVP_ERR_NOT_FOUND;
    }
    unsigned n = 0;
    const char *why = NULL;
    kvp_status_t fail = KVP_OK;
    const kvp_segment_t *full = NULL;
    for (unsigned i = 0; i < t->n_targets && fail == KVP_OK; i++) {
        kvp_segment_t *seg = kvp_segment_table_get(&st->segments, t->targets[i]);
        if (seg == NULL) {
            fail = KVP_ERR_SEGMENT_GONE;
            why = "a target segment was unmounted";
        } else if (kvp_object_replica_on(obj, seg->id) >= 0) {
            continue; /* holds one already: nothing to copy there */
        } else if (obj->n_replicas + n >= KVP_MAX_REPLICAS) {
            fail = KVP_ERR_TOO_MANY;
            why = "the object would have more replicas than a key may (8)";
        } else if ((fail = kvp_placement_alloc_on(seg, obj->size, obj->tenant, &t->dests[n])) ==
                   KVP_OK) {
            n++;
        } else {
            full = seg;
        }
    }
    t->n_dests = (uint8_t)n;
    const kvp_tenant_t *tn = &st->tenants.t[obj->tenant];
    uint64_t more = obj->size * n; /* charged as a put is: its size per replica */
    if (fail == KVP_OK && (tn->closed || !kvp_tenant_dram_fits(tn, more))) {
        fail = KVP_ERR_QUOTA;
        why = "the copies would take the tenant over its DRAM quota";
    }
    if (fail != KVP_OK) {
        if (full != NULL)
            kvp_task_end(st, t, KVP_TASK_FAILED, "%s: %s", full->name,
                         fail == KVP_ERR_POOL_FULL ? "no room" : "takes no new replicas now");
        else
            kvp_task_end(st, t, KVP_TASK_FAILED, "%s", why);
        return fail;
    }
    if (n == 0) { /* every target holds a replica: done */
        kvp_task_end(st, t, KVP_TASK_SUCCESS, NULL);
        return KVP_OK;
    }
    kvp_task_table_start(t);
    t->deadline_ms = st->now_ms + st->config.put_timeout_ms;
    t->version = obj->version;
    t->size = obj->size;
    t->crc32c = obj->crc32c;
    *obj_p = obj;
    *src_p = src;
    return KVP_OK;
}

/* The tasks a TaskStart started: if its answer does not go out, its runner knows nothing of
 * their extents. */
typedef struct start_arg {
    kvp_task_t **t;
    size_t n;
} start_arg_t;

static void task_start_end(kvp_reply_t *r, kvp_status_t rc, void *arg)
{
    start_arg_t *a = arg;
    for (size_t i = 0; rc != KVP_OK && i < a->n; i++)
        kvp_task_end(r->call->st, a->t[i], KVP_TASK_FAILED, "out of memory starting it");
}

kvp_status_t kvp_handle_task_start(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__TaskStartRequest *req = (Kvpool__TaskStartRequest *)req_msg;
    Kvpool__TaskStartResponse resp = KVPOOL__TASK_START_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 200);
    size_t n = req->n_tasks;
    if (n == 0 || n > BATCH_MAX)
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, "1 to %u tasks a call, not %zu", BATCH_MAX,
                              n);
    size_t cap = n * KVP_TASK_TARGETS_MAX;
    Kvpool__TaskStartResult *res = kvp_reply_calloc(&r, n, sizeof(*res));
    Kvpool__TaskStartResult **resptr = kvp_reply_calloc(&r, n, sizeof(*resptr));
    Kvpool__Replica *reps = kvp_reply_calloc(&r, cap, sizeof(*reps));
    Kvpool__Replica **repptr = kvp_reply_calloc(&r, cap, sizeof(*repptr));
    start_arg_t *arg = kvp_reply_calloc(&r, 1, sizeof(*arg));
    kvp_task_t **started = kvp_reply_calloc(&r, n, sizeof(*started));
    if (!res || !resptr || !reps || !repptr || !arg || !started ||
        !kvp_call_grants_reserve(st, cap))
        return kvp_reply_abort(&r);
    arg->t = started;
    kvp_reply_on_end(&r, task_start_end, arg);
    size_t nr = 0;
    for (size_t i = 0; i < n; i++) {
        kvpool__task_start_result__init(&res[i]);
        resptr[i] = &res[i];
        kvp_task_t *t = task_find(st, req->tasks[i]->id_hi, req->tasks[i]->id_lo);
        const char *why = NULL;
        res[i].status = runner_check(call, t, KVP_TASK_PENDING, &why);
        if (res[i].status != KVP_OK) {
            res[i].message = (char *)why;
            continue;
        }
        kvp_object_t *obj = NULL;
        int src = -1;
        res[i].status = start_one(st, t, &obj, &src);
        if (res[i].status != KVP_OK || t->status != KVP_TASK_PROCESSING) {
            res[i].message = t->message;
            continue;
        }
        started[arg->n++] = t; /* (failed, its extents freed, if no answer goes out) */
        res[i].dests = &repptr[nr];
        res[i].n_dests = t->n_dests;
        for (unsigned k = 0; k < t->n_dests; k++, nr++) {
            kvpool__replica__init(&reps[nr]);
            reps[nr].segment_id = t->dests[k].segment_id;
            reps[nr].offset = t->dests[k].offset;
            reps[nr].length = obj->size;
            repptr[nr] = &reps[nr];
            if (!kvp_call_grant(call, &reps[nr], nr, KVP_GRANT_WRITE, st->config.put_timeout_ms,
                                obj->version) ||
                !kvp_seg_set_add(&r.segs, kvp_segment_table_get(&st->segments, reps[nr].segment_id),
                                 NULL))
                return kvp_reply_abort(&r);
        }
        res[i].size = obj->size;
        res[i].crc32c = obj->crc32c;
        res[i].source_segment_id = t->source_seg;
        res[i].source_offset = obj->replicas[src].offset;
    }
    if (!kvp_reply_segments(&r))
        return kvp_reply_abort(&r);
    resp.results = resptr;
    resp.n_results = n;
    return kvp_reply_send(&r);
}

/* ---------------- TaskEnd ---------------- */

/* The copies are written: make them the object's (t PROCESSING). */
static void task_commit(kvp_master_state_t *st, kvp_task_t *t, const int32_t *statuses)
{
    kvp_object_t *obj = kvp_task_object(st, t);
    if (obj == NULL || obj->version != t->version || obj->size != t->size ||
        obj->crc32c != t->crc32c || kvp_object_replica_on(obj, t->source_seg) < 0) {
        kvp_task_end(st, t, KVP_TASK_FAILED, "the object changed or went while it was copied");
        return;
    }
    for (unsigned i = 0; i < t->n_dests; i++) {
        if (statuses[i] != KVP_OK) {
            kvp_task_end(st, t, KVP_TASK_FAILED, "a copy could not be written: %s",
                         kvp_strerror(statuses[i]));
            return;
        }
        if (kvp_segment_table_get(&st->segments, t->dests[i].segment_id) == NULL) {
            kvp_task_end(st, t, KVP_TASK_FAILED, "a target segment was unmounted");
            return;
        }
    }
    kvp_replica_t reps[KVP_MAX_REPLICAS];
    unsigned n = obj->n_replicas;
    memcpy(reps, obj->replicas, n * sizeof(*reps));
    for (unsigned i = 0; i < t->n_dests && n < KVP_MAX_REPLICAS; i++)
        reps[n++] = t->dests[i];
    kvp_object_t *o = kvp_tier_set_replicas(st, obj, reps, n);
    if (o == NULL) {
        kvp_task_end(st, t, KVP_TASK_FAILED, "out of memory adding the replicas");
        return;
    }
    for (unsigned i = 0; i < t->n_dests; i++)
        kvp_record_replica(&st->segments, o, &t->dests[i]);
    t->n_dests = 0; /* the object's now */
    if (t->kind == KVP_TASK_COPY) {
        kvp_task_end(st, t, KVP_TASK_SUCCESS, NULL);
    } else if (kvp_leased(st, o)) {
        /* readers may be reading the source replica: it goes when they are done */
        kvp_task_table_release(&st->copy_tasks, t);
        t->deadline_ms = st->now_ms + st->config.lease_ttl_ms + st->config.put_timeout_ms;
    } else {
        kvp_task_drop_source(st, t, o);
    }
}

kvp_status_t kvp_handle_task_end(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__TaskEndRequest *req = (Kvpool__TaskEndRequest *)req_msg;
    Kvpool__StatusesResponse resp = KVPOOL__STATUSES_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    size_t n = req->n_tasks;
    if (n == 0 || n > BATCH_MAX)
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, NULL);
    int32_t *out = kvp_reply_statuses(&r, n);
    if (out == NULL)
        return kvp_reply_abort(&r);
    for (size_t i = 0; i < n; i++) {
        const Kvpool__TaskEndItem *it = req->tasks[i];
        kvp_task_t *t = task_find(st, it->id_hi, it->id_lo);
        const char *why;
        out[i] = runner_check(call, t, KVP_TASK_PROCESSING, &why);
        if (out[i] != KVP_OK)
            continue;
        if (it->n_statuses != t->n_dests)
            kvp_task_end(st, t, KVP_TASK_FAILED, "its runner reported %zu copies of %u",
                         it->n_statuses, t->n_dests);
        else
            task_commit(st, t, it->statuses);
        out[i] = t->status;
    }
    return kvp_reply_send(&r);
}

/* ---------------- ends ---------------- */

void kvp_task_conn_closed(kvp_master_state_t *st, uint64_t conn_id)
{
    /* its runner's lists: every task it runs or was to run but the moves that wait for the
     * master only (each one ended leaves them: its successor is taken first) */
    for (int pass = 0; pass < 2; pass++) {
        kvp_task_t *t = pass == 0 ? kvp_task_table_running(&st->copy_tasks, conn_id)
                                  : kvp_task_table_waiting(&st->copy_tasks, conn_id);
        for (kvp_task_t *nx; t != NULL; t = nx) {
            nx = t->run_next;
            kvp_task_end(st, t, KVP_TASK_FAILED, "the owner of %s went before the task ended",
                         t->assigned);
        }
    }
}
