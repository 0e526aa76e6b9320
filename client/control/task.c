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

/* One task of a batch: its TaskStart answer and where its writes are in the batch's ops. */
typedef struct run {
    uint64_t hi, lo;
    Kvpool__TaskStartResponse *sr; /* NULL: not started (nothing to end) */
    size_t first_op, n_ops;        /* its dests' ops: ops[first_op..first_op + n_ops) */
    int32_t statuses[8];
} run_t;

/* TaskStart of r; its dests' writes appended to ops (room for 8 more). */
static void run_start(const kvp_drain_params_t *p, run_t *r, kvp_xfer_op_t *ops, size_t *n_ops)
{
    Kvpool__TaskStartRequest req = KVPOOL__TASK_START_REQUEST__INIT;
    req.id_hi = r->hi;
    req.id_lo = r->lo;
    kvp_status_t st;
    Kvpool__TaskStartResponse *sr = kvp_session_call_unpack(
        p->session, KVP_RPC_TASK_START, &req.base, &kvpool__task_start_response__descriptor, &st);
    if (sr == NULL)
        return; /* the master fails it by its deadline */
    if (sr->status != KVP_OK || sr->n_dests == 0 || sr->n_dests > 8) {
        if (sr->status != KVP_OK)
            KVP_LOG_INFO("task %016llx%016llx not started: %s", (unsigned long long)r->hi,
                         (unsigned long long)r->lo, sr->message);
        kvpool__task_start_response__free_unpacked(sr, NULL);
        return; /* (more than 8: never from a master; it fails the task by its deadline) */
    }
    r->sr = sr;
    kvp_peers_update(p->peers, sr->segments, sr->n_segments);
    const void *local = p->seg != NULL && sr->source_segment_id == kvp_segment_id(p->seg)
                            ? kvp_segment_extent(p->seg, sr->source_offset, sr->size)
                            : NULL;
    r->first_op = *n_ops;
    for (size_t i = 0; i < sr->n_dests; i++) {
        const Kvpool__Replica *d = sr->dests[i];
        kvp_peer_t *peer = kvp_peers_get(p->peers, d->segment_id);
        r->statuses[i] = local == NULL           ? KVP_ERR_OUT_OF_RANGE
                         : peer == NULL          ? KVP_ERR_UNKNOWN_SEGMENT
                         : d->length != sr->size ? KVP_ERR_PROTOCOL
                                                 : KVP_OK;
        if (r->statuses[i] != KVP_OK) {
            if (peer != NULL)
                kvp_peer_unref(peer);
            continue;
        }
        ops[(*n_ops)++] = (kvp_xfer_op_t){.kind = KVP_XFER_WRITE,
                                          .local = (void *)local,
                                          .offset = d->offset,
                                          .length = sr->size,
                                          .peer = peer,
                                          .want_crc = true,
                                          .grant = KVP_XFER_GRANT(d->grant)};
    }
    r->n_ops = *n_ops - r->first_op;
}

/* The writes of r are done: TaskEnd with a status per dest. */
static void run_end(const kvp_drain_params_t *p, run_t *r, kvp_xfer_op_t *ops)
{
    Kvpool__TaskStartResponse *sr = r->sr;
    for (size_t i = 0, q = r->first_op; i < sr->n_dests; i++) {
        if (r->statuses[i] != KVP_OK)
            continue;
        kvp_status_t s = ops[q].status;
        if (s == KVP_OK && ops[q].crc != sr->crc32c)
            s = KVP_ERR_CHECKSUM; /* the source extent was rewritten meanwhile */
        r->statuses[i] = s;
        kvp_peer_unref(ops[q].peer);
        q++;
    }
    Kvpool__TaskEndRequest end = KVPOOL__TASK_END_REQUEST__INIT;
    end.id_hi = r->hi;
    end.id_lo = r->lo;
    end.statuses = r->statuses;
    end.n_statuses = sr->n_dests;
    kvp_status_t st;
    Kvpool__TaskQueryResponse *er = kvp_session_call_unpack(
        p->session, KVP_RPC_TASK_END, &end.base, &kvpool__task_query_response__descriptor, &st);
    if (er != NULL && er->status == KVP_OK && er->task_status == 2 /* FAILED */)
        KVP_LOG_INFO("task %016llx%016llx failed: %s", (unsigned long long)r->hi,
                     (unsigned long long)r->lo, er->message);
    if (er != NULL)
        kvpool__task_query_response__free_unpacked(er, NULL);
    kvpool__task_start_response__free_unpacked(sr, NULL);
    r->sr = NULL;
}

size_t kvp_task_run(const kvp_drain_params_t *p, const uint64_t *ids, size_t n)
{
    /* all the batch's writes in one transfer run: they go in parallel, over the
     * transport's streams, as a put's do */
    run_t *runs = calloc(n, sizeof(*runs));
    kvp_xfer_op_t *ops = calloc(8 * n + 1, sizeof(*ops));
    if (runs == NULL || ops == NULL) {
        free(runs);
        free(ops);
        return 0; /* out of memory: the master offers them again at the next beat */
    }
    size_t n_ops = 0, started = 0;
    for (size_t i = 0; i < n; i++) {
        runs[i].hi = ids[2 * i];
        runs[i].lo = ids[2 * i + 1];
        run_start(p, &runs[i], ops, &n_ops);
        started += runs[i].sr != NULL;
    }
    kvp_transfer_run(p->xfer, ops, n_ops);
    for (size_t i = 0; i < n; i++)
        if (runs[i].sr != NULL)
            run_end(p, &runs[i], ops);
    free(runs);
    free(ops);
    return started;
}
