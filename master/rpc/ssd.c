/*
 * ssd.c - the RPCs of SSD segment owners.
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
 * rpc/record.c.)
 *
 * Only the connection that mounted an SSD segment may speak for it.
 *
 * Thread: master loop only.
 */
#include "master/rpc/ssd.h"

#include <stdlib.h>
#include <string.h>

#include "common/grant.h"
#include "common/log.h"
#include "common/macros.h"
#include "master/policy/eviction.h"
#include "master/policy/tier.h"

/* Tasks one answer carries at most. */
#define TASKS_MAX 256u

static kvp_segment_t *own_ssd(kvp_call_t *call, uint64_t segment_id)
{
    kvp_segment_t *seg = kvp_segment_table_get(&call->st->segments, segment_id);
    return seg != NULL && seg->ssd && seg->owner_conn_id == call->conn_id ? seg : NULL;
}

kvp_status_t kvp_handle_ssd_tasks(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__SsdTasksRequest *req = (Kvpool__SsdTasksRequest *)req_msg;
    Kvpool__SsdTasksResponse resp = KVPOOL__SSD_TASKS_RESPONSE__INIT;
    kvp_segment_t *seg = own_ssd(call, req->segment_id);
    if (seg == NULL) {
        resp.status = KVP_ERR_SEGMENT_GONE;
        return kvp_call_reply(call, &resp.base);
    }
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
    Kvpool__SsdTask *tasks = calloc(n ? n : 1, sizeof(*tasks));
    Kvpool__SsdTask **tp = calloc(n ? n : 1, sizeof(*tp));
    Kvpool__Replica *reps = calloc(n ? n : 1, sizeof(*reps));
    kvp_ssd_task_t **forget = calloc(n ? n : 1, sizeof(*forget));
    kvp_seg_set_t segs = {0};
    kvp_status_t rc = KVP_ERR_NOMEM;
    size_t k = 0, nf = 0;
    if (!tasks || !tp || !reps || !forget || !kvp_call_grants_reserve(st, n))
        goto out;
    for (kvp_ssd_task_t *t = st->tasks; t != NULL && k < n; t = t->next) {
        if (t->segment_id != seg->id || t->sent)
            continue;
        Kvpool__SsdTask *m = &tasks[k];
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
                goto out;
            m->dram = &reps[k];
            if (d != NULL && !kvp_seg_set_add(&segs, d, NULL))
                goto out;
        }
        tp[k++] = m;
        if (t->kind == KVP_SSD_FORGET)
            forget[nf++] = t; /* nothing to report: gone once sent */
        t->sent = true;
    }
    if (!kvp_seg_set_finish(&segs) || !kvp_seg_set_conn_keys(call, &segs))
        goto out;
    resp.tasks = tp;
    resp.n_tasks = k;
    resp.segments = segs.ptrs;
    resp.n_segments = segs.n;
    rc = kvp_call_reply(call, &resp.base);
out:
    if (rc != KVP_OK) { /* no answer goes out: the tasks are still to be sent */
        for (kvp_ssd_task_t *t = st->tasks; t != NULL; t = t->next)
            for (size_t i = 0; i < k; i++)
                if (tasks[i].task_id == t->id)
                    t->sent = false;
    } else {
        for (size_t i = 0; i < nf; i++)
            kvp_state_task_remove(st, forget[i]);
    }
    kvp_seg_set_free(&segs);
    free(tasks);
    free(tp);
    free(reps);
    free(forget);
    return rc;
}
