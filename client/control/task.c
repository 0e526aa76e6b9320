/*
 * task.c - copy and move tasks, the client's part (master/rpc/task_calls.c has the
 * design): TaskCreate and TaskQuery for the API (admin.c), and the runner. The master offers
 * a task to the owner of its source segment in a heartbeat answer; the heartbeat thread runs
 * it here: TaskStart hands over the source extent (on this client's own segment) and a new
 * extent with a write grant on each target; each is written straight from segment memory
 * through the transfer engine, its CRC computed on the way and compared with the object's
 * (an extent rewritten meanwhile fails the copy, never lands as the object); TaskEnd reports
 * each, and the master makes them the object's replicas, or frees them.
 *
 * Thread: create/query from any API caller (the session serializes calls); kvp_task_run
 * from the heartbeat thread.
 */
#include "client/control/task.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/rpc.h"

kvp_status_t kvp_task_create(kvp_session_t *s, uint32_t kind, const char *key, const char *source,
                             const char *const *targets, size_t n_targets, kvp_task_id_t *id_p)
{
    if (key == NULL || id_p == NULL || (n_targets > 0 && targets == NULL) ||
        (kind == KVP_MOVE_TASK && (source == NULL || n_targets != 1)) || n_targets > 64)
        return KVP_ERR_INVALID_ARG;
    for (size_t i = 0; i < n_targets; i++)
        if (targets[i] == NULL)
            return KVP_ERR_INVALID_ARG;
    id_p->hi = id_p->lo = 0;
    Kvpool__TaskCreateRequest req = KVPOOL__TASK_CREATE_REQUEST__INIT;
    ProtobufCBinaryData k = {.len = strlen(key), .data = (uint8_t *)key};
    req.kind = kind;
    req.keys = &k;
    req.n_keys = 1;
    req.source = (char *)(source != NULL ? source : "");
    req.targets = (char **)targets;
    req.n_targets = n_targets;
    kvp_status_t st;
    Kvpool__TaskCreateResponse *r = kvp_session_call_unpack(
        s, KVP_RPC_TASK_CREATE, &req.base, &kvpool__task_create_response__descriptor, &st);
    if (r == NULL)
        return st;
    st = r->status;
    if (st == KVP_OK) {
        id_p->hi = r->id_hi;
        id_p->lo = r->id_lo;
    } else if (r->message[0] != '\0') {
        kvp_status_note(r->message); /* the master's words, for the caller's last error */
    }
    kvpool__task_create_response__free_unpacked(r, NULL);
    return st;
}

kvp_status_t kvp_task_query(kvp_session_t *s, kvp_task_id_t id, kvp_task_info_t *info)
{
    if (info == NULL)
        return KVP_ERR_INVALID_ARG;
    memset(info, 0, sizeof(*info));
    Kvpool__TaskQueryRequest req = KVPOOL__TASK_QUERY_REQUEST__INIT;
    req.id_hi = id.hi;
    req.id_lo = id.lo;
    kvp_status_t st;
    Kvpool__TaskQueryResponse *r = kvp_session_call_unpack(
        s, KVP_RPC_TASK_QUERY, &req.base, &kvpool__task_query_response__descriptor, &st);
    if (r == NULL)
        return st;
    st = r->status;
    if (st == KVP_OK) {
        info->kind = r->kind;
        info->status = r->task_status;
        info->created_ms = r->created_ms;
        info->updated_ms = r->updated_ms;
        snprintf(info->assigned, sizeof(info->assigned), "%s", r->assigned_client);
        snprintf(info->message, sizeof(info->message), "%s", r->message);
    }
    kvpool__task_query_response__free_unpacked(r, NULL);
    return st;
}

/* One task of a batch: its TaskStart result and where its writes are in the batch's ops. */
typedef struct run {
    const Kvpool__TaskStartResult *res; /* NULL: not started (nothing to end) */
    size_t first_op;                    /* its dests' ops: ops[first_op..) */
    int32_t statuses[8];
} run_t;

/* Result i of a TaskStart answer: its dests' writes appended to ops (room for 8 more). */
static void run_plan(const kvp_drain_params_t *p, const Kvpool__TaskStartResult *res, run_t *r,
                     kvp_xfer_op_t *ops, size_t *n_ops)
{
    if (res->status != KVP_OK || res->n_dests == 0 || res->n_dests > 8) {
        if (res->status != KVP_OK)
            KVP_LOG_INFO("a task not started: %s", res->message);
        return; /* (more than 8: never from a master; it fails the task by its deadline) */
    }
    r->res = res;
    const void *local = p->seg != NULL && res->source_segment_id == kvp_segment_id(p->seg)
                            ? kvp_segment_extent(p->seg, res->source_offset, res->size)
                            : NULL;
    r->first_op = *n_ops;
    for (size_t i = 0; i < res->n_dests; i++) {
        const Kvpool__Replica *d = res->dests[i];
        kvp_peer_t *peer = kvp_peers_get(p->peers, d->segment_id);
        r->statuses[i] = local == NULL            ? KVP_ERR_OUT_OF_RANGE
                         : peer == NULL           ? KVP_ERR_UNKNOWN_SEGMENT
                         : d->length != res->size ? KVP_ERR_PROTOCOL
                                                  : KVP_OK;
        if (r->statuses[i] != KVP_OK) {
            if (peer != NULL)
                kvp_peer_unref(peer);
            continue;
        }
        ops[(*n_ops)++] = (kvp_xfer_op_t){.kind = KVP_XFER_WRITE,
                                          .local = (void *)local,
                                          .offset = d->offset,
                                          .length = res->size,
                                          .peer = peer,
                                          .want_crc = true,
                                          .grant = KVP_XFER_GRANT(d->grant)};
    }
}

/* The writes of r are done: its statuses per dest (its peers released). */
static void run_statuses(run_t *r, kvp_xfer_op_t *ops)
{
    const Kvpool__TaskStartResult *res = r->res;
    for (size_t i = 0, q = r->first_op; i < res->n_dests; i++) {
        if (r->statuses[i] != KVP_OK)
            continue;
        kvp_status_t s = ops[q].status;
        if (s == KVP_OK && ops[q].crc != res->crc32c)
            s = KVP_ERR_CHECKSUM; /* the source extent was rewritten meanwhile */
        r->statuses[i] = s;
        kvp_peer_unref(ops[q].peer);
        q++;
    }
}

size_t kvp_task_run(const kvp_drain_params_t *p, const uint64_t *ids, size_t n)
{
    if (n == 0 || n > 64)
        return 0;
    /* one TaskStart for the batch, all its writes in one transfer run (in parallel, over the
     * transport's streams, as a put's), one TaskEnd */
    Kvpool__TaskOffer offers[64], *offp[64];
    for (size_t i = 0; i < n; i++) {
        kvpool__task_offer__init(&offers[i]);
        offers[i].id_hi = ids[2 * i];
        offers[i].id_lo = ids[2 * i + 1];
        offp[i] = &offers[i];
    }
    Kvpool__TaskStartRequest req = KVPOOL__TASK_START_REQUEST__INIT;
    req.tasks = offp;
    req.n_tasks = n;
    kvp_status_t st;
    Kvpool__TaskStartResponse *sr = kvp_session_call_unpack(
        p->session, KVP_RPC_TASK_START, &req.base, &kvpool__task_start_response__descriptor, &st);
    if (sr == NULL)
        return 0; /* the master fails them by their deadline */
    run_t *runs = calloc(n, sizeof(*runs));
    kvp_xfer_op_t *ops = calloc(8 * n + 1, sizeof(*ops));
    size_t n_ops = 0, started = 0;
    if (runs != NULL && ops != NULL && sr->status == KVP_OK && sr->n_results == n) {
        kvp_peers_update(p->peers, sr->segments, sr->n_segments);
        for (size_t i = 0; i < n; i++)
            run_plan(p, sr->results[i], &runs[i], ops, &n_ops);
        kvp_transfer_run(p->xfer, ops, n_ops);
        Kvpool__TaskEndItem items[64], *itemp[64];
        for (size_t i = 0; i < n; i++) {
            if (runs[i].res == NULL)
                continue;
            run_statuses(&runs[i], ops);
            kvpool__task_end_item__init(&items[started]);
            items[started].id_hi = ids[2 * i];
            items[started].id_lo = ids[2 * i + 1];
            items[started].statuses = runs[i].statuses;
            items[started].n_statuses = runs[i].res->n_dests;
            itemp[started] = &items[started];
            started++;
        }
        if (started > 0) {
            Kvpool__TaskEndRequest end = KVPOOL__TASK_END_REQUEST__INIT;
            end.tasks = itemp;
            end.n_tasks = started;
            Kvpool__StatusesResponse *er =
                kvp_session_call_unpack(p->session, KVP_RPC_TASK_END, &end.base,
                                        &kvpool__statuses_response__descriptor, &st);
            for (size_t i = 0; er != NULL && i < er->n_statuses; i++)
                if (er->statuses[i] == 2 /* FAILED: why in the task, for query_task */)
                    KVP_LOG_INFO("a copy or move task failed (query_task says why)");
            if (er != NULL)
                kvpool__statuses_response__free_unpacked(er, NULL);
        }
    } else if (sr->status != KVP_OK) {
        KVP_LOG_INFO("tasks not started: %s", sr->message);
    }
    kvpool__task_start_response__free_unpacked(sr, NULL);
    free(runs);
    free(ops);
    return started;
}
