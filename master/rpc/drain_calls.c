/*
 * drain_calls.c - moving objects off a segment before it goes: Drain, MoveStart,
 * MoveEnd, and the end of a closed connection's moves.
 *
 * Design: Drain marks a segment draining: placement skips it and its owner
 * learns through its heartbeat that it should move its objects away and
 * unmount. MoveStart, per object with a single replica on the draining
 * segment: a new extent elsewhere (recorded in st->moves), written by the
 * owner; MoveEnd swaps it in if the object is unchanged (same size and CRC,
 * still there), otherwise frees it. A move never ended is freed when its
 * connection closes. A MoveStart whose answer does not reach its owner (out of
 * memory building it) records nothing: the owner learns of a move only from
 * that answer, so it would never end one it does not know of.
 *
 * Thread: master loop only.
 */
#include "master/rpc/drain_calls.h"

#include <stdlib.h>
#include <string.h>

#include "common/grant.h"
#include "common/log.h"
#include "master/meta/placement.h"
#include "master/meta/record.h"
#include "master/policy/drain_jobs.h"
#include "master/rpc/object_calls.h"
#include "master/rpc/reply.h"

kvp_status_t kvp_handle_drain(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__DrainRequest *req = (Kvpool__DrainRequest *)req_msg;
    Kvpool__DrainResponse resp = KVPOOL__DRAIN_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 320);
    kvp_segment_t *seg = req->segment_name[0] != '\0'
                             ? kvp_segment_table_find_name(&st->segments, req->segment_name)
                             : kvp_segment_table_get(&st->segments, req->segment_id);
    if (seg == NULL)
        return kvp_reply_fail(&r, KVP_ERR_SEGMENT_GONE, "no segment %s is mounted",
                              req->segment_name[0] != '\0' ? req->segment_name : "with that id");
    if (call->who != NULL && !(call->who->roles & KVP_ROLE_ADMIN) &&
        seg->owner_conn_id != call->conn_id)
        return kvp_reply_deny(&r,
                              "principal %s may drain only the segments it serves itself; "
                              "draining %s needs role admin",
                              call->who->name, seg->name);
    if (seg->ssd)
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG,
                              "%s is an SSD segment: it is not drained; stop its owner (kvpool "
                              "serve) and its objects stay in its file, back at its next mount",
                              seg->name);
    if (!seg->draining)
        KVP_LOG_INFO("segment %s (id %#llx) is draining: %llu objects to move or drop", seg->name,
                     (unsigned long long)seg->id, (unsigned long long)seg->objects);
    seg->draining = true;
    kvp_object_holds_drop(st, seg->id); /* room held ahead there: unwritten, not waited for */
    resp.segment_id = seg->id;
    /* placement skips it from now on: this count only goes down */
    for (const kvp_object_t *o = st->index.pending_list.head; o != NULL; o = o->lnext)
        if (kvp_object_replica_on(o, seg->id) >= 0)
            resp.pending++;
    return kvp_reply_send(&r);
}

/* Does obj have a replica on a mounted, non-draining segment other than `from`? */
static bool kept_elsewhere(kvp_master_state_t *st, const kvp_object_t *obj, uint64_t from)
{
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        if (obj->replicas[r].segment_id == from)
            continue;
        const kvp_segment_t *seg =
            kvp_segment_table_get(&st->segments, obj->replicas[r].segment_id);
        if (seg != NULL && !seg->draining)
            return true;
    }
    return false;
}

/* Give up a move: free its destination extent (never swapped in) and the record. */
static void move_abandon(kvp_master_state_t *st, kvp_move_t *mv)
{
    kvp_segment_table_free_extent(&st->segments, &mv->dest);
    free(mv);
}

/* Abandon the moves recorded since st->moves was `since` (a MoveStart's own: it pushes
 * them at the head, and nothing else records moves meanwhile on the loop thread). */
static void moves_abandon_since(kvp_master_state_t *st, kvp_move_t *since)
{
    while (st->moves != since) {
        kvp_move_t *mv = st->moves;
        st->moves = mv->next;
        move_abandon(st, mv);
    }
}

/* A MoveStart not answered (a frame-level error instead): the owner never learns of its
 * moves and sends no MoveEnd for them, and its connection may live on for long; undo them
 * now. moves_before: st->moves before the call. */
static void move_start_end(kvp_reply_t *r, kvp_status_t rc, void *moves_before)
{
    if (rc != KVP_OK)
        moves_abandon_since(r->call->st, moves_before);
}

kvp_status_t kvp_handle_move_start(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    uint64_t conn_id = call->conn_id;
    Kvpool__MoveStartRequest *req = (Kvpool__MoveStartRequest *)req_msg;
    Kvpool__MoveStartResponse resp = KVPOOL__MOVE_START_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    size_t n = req->n_keys;
    kvp_segment_t *from = kvp_segment_table_get(&st->segments, req->from_segment_id);
    int32_t status = kvp_call_check_batch(n);
    if (status == KVP_OK)
        status = from == NULL                     ? KVP_ERR_SEGMENT_GONE
                 : from->owner_conn_id != conn_id ? KVP_ERR_NOT_OWNER
                 : !from->draining                ? KVP_ERR_INVALID_ARG
                                                  : KVP_OK;
    if (status != KVP_OK)
        return kvp_reply_fail(&r, status, NULL);
    kvp_reply_on_end(&r, move_start_end, st->moves); /* what this call records goes on top */
    Kvpool__PutStartResult *res = kvp_reply_calloc(&r, n, sizeof(*res));
    Kvpool__PutStartResult **resptr = kvp_reply_calloc(&r, n, sizeof(*resptr));
    Kvpool__Replica *reps = kvp_reply_calloc(&r, n, sizeof(*reps));
    Kvpool__Replica **repptr = kvp_reply_calloc(&r, n, sizeof(*repptr));
    if (!res || !resptr || !reps || !repptr || !kvp_call_grants_reserve(st, n))
        return kvp_reply_abort(&r);
    for (size_t i = 0; i < n; i++) {
        kvpool__put_start_result__init(&res[i]);
        resptr[i] = &res[i];
        kvp_object_t *obj;
        res[i].status = kvp_call_key_lookup(st, &req->keys[i], &obj, NULL);
        if (res[i].status != KVP_OK)
            continue;
        if (obj == NULL || obj->state != KVP_OBJ_COMPLETE ||
            kvp_object_replica_on(obj, from->id) < 0) {
            res[i].status = KVP_ERR_NOT_FOUND;
            continue;
        }
        if (kept_elsewhere(st, obj, from->id))
            continue; /* a replica on a segment that stays keeps it: nothing to copy */
        kvp_placement_req_t preq = {.size = obj->size,
                                    .replica_num = 1,
                                    .tenant = obj->tenant,
                                    .dedicated_first = st->tenants.t[obj->tenant].dedicated > 0};
        /* a drain job's target segments first (Mooncake's target_segments) */
        preq.n_preferred_list = kvp_drain_jobs_targets(st, from->id, preq.preferred_list, 8);
        kvp_replica_t dest;
        unsigned got = 0;
        res[i].status = kvp_placement_alloc(&st->segments, &preq, &st->rng, &dest, &got);
        if (res[i].status != KVP_OK)
            continue;
        kvpool__replica__init(&reps[i]);
        reps[i].segment_id = dest.segment_id;
        reps[i].offset = dest.offset;
        reps[i].length = obj->size;
        /* The mover writes the new replica: a write grant, good as long as a put's. Sealed
         * before the move is recorded, so that a key that fails here or below leaves
         * nothing behind: the owner ends (MoveEnd) only the keys answered with a replica. */
        if (!kvp_call_grant(call, &reps[i], i, KVP_GRANT_WRITE, st->config.put_timeout_ms,
                            obj->version)) {
            kvp_segment_table_free_extent(&st->segments, &dest);
            res[i].status = KVP_ERR_INTERNAL;
            continue;
        }
        kvp_move_t *mv = malloc(sizeof(*mv) + obj->key_len);
        if (mv == NULL ||
            !kvp_seg_set_add(&r.segs, kvp_segment_table_get(&st->segments, dest.segment_id),
                             NULL)) {
            free(mv);
            kvp_segment_table_free_extent(&st->segments, &dest);
            res[i].status = KVP_ERR_NOMEM;
            continue;
        }
        mv->conn_id = conn_id;
        mv->from_segment_id = from->id;
        mv->size = obj->size;
        mv->dest = dest;
        mv->crc32c = obj->crc32c;
        mv->key_len = obj->key_len;
        memcpy(mv->key, kvp_object_key(obj), obj->key_len);
        mv->next = st->moves;
        st->moves = mv;
        repptr[i] = &reps[i];
        res[i].replicas = &repptr[i];
        res[i].n_replicas = 1;
    }
    if (!kvp_reply_segments(&r))
        return kvp_reply_abort(&r);
    resp.n_results = n;
    resp.results = resptr;
    return kvp_reply_send(&r);
}

/* Unlink the move of `key` from `from` by conn, or NULL. */
static kvp_move_t *move_take(kvp_master_state_t *st, uint64_t conn_id, uint64_t from,
                             const ProtobufCBinaryData *key)
{
    for (kvp_move_t **pp = &st->moves; *pp != NULL; pp = &(*pp)->next) {
        kvp_move_t *mv = *pp;
        if (mv->conn_id == conn_id && mv->from_segment_id == from && mv->key_len == key->len &&
            memcmp(mv->key, key->data, key->len) == 0) {
            *pp = mv->next;
            return mv;
        }
    }
    return NULL;
}

static kvp_status_t move_end_one(kvp_master_state_t *st, uint64_t conn_id, uint64_t from,
                                 const ProtobufCBinaryData *key, int32_t copy_status)
{
    kvp_move_t *mv = move_take(st, conn_id, from, key);
    if (mv == NULL)
        return KVP_ERR_NOT_FOUND;
    kvp_status_t status = KVP_OK;
    kvp_object_t *obj = NULL;
    int r = -1;
    if (copy_status == KVP_OK) {
        kvp_call_key_lookup(st, key, &obj, NULL);
        if (obj != NULL)
            r = kvp_object_replica_on(obj, from);
        /* swap only onto the very object that was copied, into a live segment */
        if (obj == NULL || obj->state != KVP_OBJ_COMPLETE || obj->size != mv->size ||
            obj->crc32c != mv->crc32c || r < 0 ||
            kvp_segment_table_get(&st->segments, mv->dest.segment_id) == NULL)
            status = KVP_ERR_NOT_FOUND;
    }
    if (copy_status == KVP_OK && status == KVP_OK) {
        /* The old extent is on a draining segment, which takes no new extents: freed
         * here, it is never reused, so a reader still leasing it reads intact bytes
         * until the owner unmounts. */
        unsigned media = kvp_state_media(st, obj->replicas, obj->n_replicas);
        kvp_index_charge(&st->index, obj, -1); /* its tier may change: charged again */
        kvp_segment_table_free_extent(&st->segments, &obj->replicas[r]);
        obj->replicas[r] = mv->dest;
        kvp_index_charge(&st->index, obj, +1);
        kvp_record_replica(&st->segments, obj, &mv->dest);
        /* KV events: a move to another medium (a DRAM object drained onto SSD) */
        kvp_state_media_event(st, obj, media, kvp_state_media(st, obj->replicas, obj->n_replicas));
        st->stats.moved++;
        kvp_drain_jobs_moved(st, from, mv->size); /* a drain job's unit done */
        free(mv);
    } else {
        move_abandon(st, mv);
    }
    return status;
}

kvp_status_t kvp_handle_move_end(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    Kvpool__MoveEndRequest *req = (Kvpool__MoveEndRequest *)req_msg;
    Kvpool__StatusesResponse resp = KVPOOL__STATUSES_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    int32_t status = kvp_call_check_batch(req->n_keys);
    if (status == KVP_OK && req->n_statuses != req->n_keys)
        status = KVP_ERR_INVALID_ARG;
    if (status != KVP_OK)
        return kvp_reply_fail(&r, status, NULL);
    int32_t *out = kvp_reply_statuses(&r, req->n_keys);
    if (out == NULL)
        return kvp_reply_abort(&r);
    for (size_t i = 0; i < req->n_keys; i++)
        out[i] = move_end_one(call->st, call->conn_id, req->from_segment_id, &req->keys[i],
                              req->statuses[i]);
    return kvp_reply_send(&r);
}

void kvp_drain_conn_closed(kvp_master_state_t *st, uint64_t conn_id)
{
    kvp_move_t **pp = &st->moves;
    while (*pp != NULL) {
        kvp_move_t *mv = *pp;
        if (mv->conn_id == conn_id) {
            *pp = mv->next;
            move_abandon(st, mv);
            continue;
        }
        pp = &mv->next;
    }
}
