/*
 * ssd_calls.c - the RPCs of SSD segment owners.
 *
 * SsdTasks: the owner reports the tasks it finished and asks for new ones
 * (policy/tier.c queues them). When there is none the request is held
 * (st->parked; the server keeps it and calls again when a task is queued,
 * or after about a second, then answering even with none): a long poll, so
 * an offload starts as soon as its victim is chosen. The results in a held
 * request are applied once, on its first call (st->park_retry on the
 * others).
 *
 * (After its mount the owner offers the objects its file holds: Adopt, in
 * rpc/record_calls.c.)
 *
 * Only the connection that mounted an SSD segment may speak for it.
 *
 * Thread: master loop only.
 */
#include "master/rpc/ssd_calls.h"

#include <stdlib.h>
#include <string.h>

#include "common/grant.h"
#include "common/log.h"
#include "common/macros.h"
#include "master/policy/eviction.h"
#include "master/policy/tier.h"
#include "master/rpc/reply.h"

/* Tasks one answer carries at most. */
#define TASKS_MAX 256u

static kvp_segment_t *own_ssd(kvp_call_t *call, uint64_t segment_id)
{
    kvp_segment_t *seg = kvp_segment_table_get(&call->st->segments, segment_id);
    return seg != NULL && seg->ssd && seg->owner_conn_id == call->conn_id ? seg : NULL;
}

/* What an SsdTasks answer hands out: the tasks it marked sent, the FORGET ones among them. */
typedef struct tasks_out {
    Kvpool__SsdTask *tasks;
    size_t k;
    kvp_ssd_task_t **forget;
    size_t nf;
} tasks_out_t;

static void tasks_end(kvp_reply_t *r, kvp_status_t rc, void *arg)
{
    tasks_out_t *o = arg;
    kvp_master_state_t *st = r->call->st;
    if (rc != KVP_OK) { /* no answer goes out: the tasks are still to be sent */
        for (kvp_ssd_task_t *t = st->tasks; t != NULL; t = t->next)
            for (size_t i = 0; i < o->k; i++)
                if (o->tasks[i].task_id == t->id)
                    t->sent = false;
    } else {
        for (size_t i = 0; i < o->nf; i++)
            kvp_state_task_remove(st, o->forget[i]);
    }
}

kvp_status_t kvp_handle_ssd_tasks(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__SsdTasksRequest *req = (Kvpool__SsdTasksRequest *)req_msg;
    Kvpool__SsdTasksResponse resp = KVPOOL__SSD_TASKS_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    kvp_segment_t *seg = own_ssd(call, req->segment_id);
    if (seg == NULL)
        return kvp_reply_fail(&r, KVP_ERR_SEGMENT_GONE, NULL);
    if (!st->park_retry) {
        for (size_t i = 0; i < req->n_done; i++)
            kvp_tier_task_done(st, seg->id, req->done[i]->task_id, req->done[i]->status);
        for (size_t i = 0; i < req->n_bad_offsets && i < 1024; i++)
            kvp_tier_ssd_bad(st, seg, req->bad_offsets[i]);
        if (req->n_done > 0)
            kvp_evict_if_needed(st); /* room came back: background offload goes on */
    }
    size_t max = req->max_tasks ? KVP_MIN((size_t)req->max_tasks, (size_t)TASKS_MAX) : TASKS_MAX;
    size_t n = 0;
    for (kvp_ssd_task_t *t = st->tasks; t != NULL && n < max; t = t->next)
        n += t->segment_id == seg->id && !t->sent;
    if (n == 0 && st->may_park) {
        st->parked = true; /* the server holds the request: no answer now */
        return KVP_OK;
    }
    tasks_out_t o = {0};
    kvp_reply_on_end(&r, tasks_end, &o);
    o.tasks = kvp_reply_calloc(&r, n, sizeof(*o.tasks));
    Kvpool__SsdTask **tp = kvp_reply_calloc(&r, n, sizeof(*tp));
    Kvpool__Replica *reps = kvp_reply_calloc(&r, n, sizeof(*reps));
    o.forget = kvp_reply_calloc(&r, n, sizeof(*o.forget));
    if (!o.tasks || !tp || !reps || !o.forget || !kvp_call_grants_reserve(st, n))
        return kvp_reply_abort(&r);
    for (kvp_ssd_task_t *t = st->tasks; t != NULL && o.k < n; t = t->next) {
        if (t->segment_id != seg->id || t->sent)
            continue;
        size_t k = o.k;
        Kvpool__SsdTask *m = &o.tasks[k];
        kvpool__ssd_task__init(m);
        m->task_id = t->id;
        m->kind = t->kind;
        m->key.data = (uint8_t *)t->key;
        m->key.len = t->key_len;
        m->version = t->version;
        m->size = t->size;
        m->crc32c = t->crc32c;
        m->ssd_offset = t->ssd.offset;
        if (t->kind == KVP_SSD_OFFLOAD || t->kind == KVP_SSD_PROMOTE) {
            kvp_segment_t *d = kvp_segment_table_get(&st->segments, t->dram.segment_id);
            kvpool__replica__init(&reps[k]);
            reps[k].segment_id = t->dram.segment_id;
            reps[k].offset = t->dram.offset;
            reps[k].length = t->size;
            /* an offload reads the DRAM replica, a promotion writes it */
            if (!kvp_call_grant(call, &reps[k], k,
                                t->kind == KVP_SSD_OFFLOAD ? KVP_GRANT_READ : KVP_GRANT_WRITE,
                                st->config.put_timeout_ms, t->version))
                return kvp_reply_abort(&r);
            m->dram = &reps[k];
            if (d != NULL && !kvp_seg_set_add(&r.segs, d, NULL))
                return kvp_reply_abort(&r);
        }
        tp[o.k++] = m;
        if (t->kind == KVP_SSD_FORGET)
            o.forget[o.nf++] = t; /* nothing to report: gone once sent */
        t->sent = true;
    }
    if (!kvp_reply_segments(&r))
        return kvp_reply_abort(&r);
    resp.tasks = tp;
    resp.n_tasks = o.k;
    return kvp_reply_send(&r);
}
