/*
 * service_admin.c - the master's liveness, listing, bulk-remove and drain
 * handlers.
 *
 *   Heartbeat      a client says it is alive (any frame does; the server
 *                  closes connections silent past --client-ttl) and lists the
 *                  segments it believes mounted; the answer says whether it
 *                  must remount and which of its segments to drain.
 *   List           keys matching a POSIX extended regex, paged by bucket
 *                  cursor (a key present for the whole scan is returned at
 *                  least once; one that moves buckets when the table grows
 *                  may be returned twice).
 *   RemoveByRegex  every COMPLETE matching object (or all); PENDING ones and,
 *                  without force, leased ones are skipped and counted.
 *   Drain          marks a segment draining: placement skips it and its
 *                  owner learns through its heartbeat that it should move
 *                  its objects away (MoveStart/MoveEnd) and unmount.
 *   MoveStart/End  per object with a single replica on the draining
 *                  segment: a new extent elsewhere, written by the owner,
 *                  then swapped in if the object is unchanged (same size and
 *                  CRC, still there); otherwise the new extent is freed.
 *
 * Thread: master loop only.
 */
#include <regex.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/macros.h"
#include "master/service_internal.h"

#define LIST_DEFAULT 100u
#define LIST_MAX 1000u
/* Buckets one List call scans at most, so a filter that matches little stays cheap. */
#define LIST_SCAN_BUDGET 65536u
#define PATTERN_MAX 1024u

kvp_status_t kvp_svc_heartbeat(kvp_master_state_t *st, uint64_t conn_id, const uint8_t *body,
                               size_t len, uint8_t **resp_p, size_t *resp_len_p)
{
    Kvpool__HeartbeatRequest *req = kvpool__heartbeat_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    Kvpool__HeartbeatResponse resp = KVPOOL__HEARTBEAT_RESPONSE__INIT;
    uint64_t drain[16];
    size_t n_drain = 0;
    if (req->n_segment_ids > 1024) {
        resp.status = KVP_ERR_TOO_MANY;
    } else {
        for (size_t i = 0; i < req->n_segment_ids; i++) {
            kvp_segment_t *seg = kvp_segment_table_get(&st->segments, req->segment_ids[i]);
            if (seg == NULL || seg->owner_conn_id != conn_id)
                resp.remount = true;
            else if (seg->draining && n_drain < KVP_ARRAY_SIZE(drain))
                drain[n_drain++] = seg->id;
        }
    }
    resp.drain_segment_ids = drain;
    resp.n_drain_segment_ids = n_drain;
    kvpool__heartbeat_request__free_unpacked(req, NULL);
    KVP_PACK_RESPONSE(kvpool__heartbeat_response, &resp, resp_p, resp_len_p);
    return KVP_OK;
}

/* Compile a user pattern; on failure write a message for the reply. */
static kvp_status_t pattern_compile(const char *pattern, regex_t *re, char *msg, size_t msg_len)
{
    if (strlen(pattern) > PATTERN_MAX) {
        snprintf(msg, msg_len, "pattern longer than %u bytes", PATTERN_MAX);
        return KVP_ERR_INVALID_ARG;
    }
    int rc = regcomp(re, pattern, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char err[160];
        regerror(rc, re, err, sizeof(err));
        snprintf(msg, msg_len, "bad regular expression '%s': %s", pattern, err);
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}

/* Does obj's key match? (Keys hold no NUL, so a NUL-terminated copy is the key.) */
static bool key_matches(const kvp_object_t *obj, const regex_t *re)
{
    if (re == NULL)
        return true;
    char key[4097];
    memcpy(key, kvp_object_key(obj), obj->key_len);
    key[obj->key_len] = '\0';
    return regexec(re, key, 0, NULL, 0) == 0;
}

static bool on_segment(const kvp_object_t *obj, uint64_t segment_id)
{
    if (segment_id == 0)
        return true;
    for (unsigned r = 0; r < obj->n_replicas; r++)
        if (obj->replicas[r].segment_id == segment_id)
            return true;
    return false;
}

kvp_status_t kvp_svc_list(kvp_master_state_t *st, const uint8_t *body, size_t len, uint8_t **resp_p,
                          size_t *resp_len_p)
{
    Kvpool__ListRequest *req = kvpool__list_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    Kvpool__ListResponse resp = KVPOOL__LIST_RESPONSE__INIT;
    char msg[256] = "";
    regex_t re;
    bool have_re = false;
    Kvpool__ListEntry *ents = NULL;
    Kvpool__ListEntry **entp = NULL;
    Kvpool__Replica *reps = NULL;
    Kvpool__Replica **repp = NULL;
    kvp_status_t rc = KVP_ERR_NOMEM;
    uint32_t limit = req->limit == 0 ? LIST_DEFAULT : KVP_MIN(req->limit, LIST_MAX);
    resp.message = msg;
    if (req->pattern[0] != '\0') {
        resp.status = pattern_compile(req->pattern, &re, msg, sizeof(msg));
        have_re = resp.status == KVP_OK;
    }
    if (resp.status == KVP_OK && req->cursor > st->index.n_buckets)
        resp.status = KVP_ERR_INVALID_ARG;
    if (resp.status == KVP_ERR_INVALID_ARG && msg[0] == '\0')
        snprintf(msg, sizeof(msg), "cursor %llu is past the end of the table",
                 (unsigned long long)req->cursor);
    if (resp.status != KVP_OK)
        goto pack;
    /* a bucket is finished once started, so a page may pass the limit by a chain */
    size_t cap = limit + 64;
    ents = calloc(cap, sizeof(*ents));
    entp = calloc(cap, sizeof(*entp));
    reps = calloc(cap * KVP_MAX_REPLICAS, sizeof(*reps));
    repp = calloc(cap * KVP_MAX_REPLICAS, sizeof(*repp));
    if (!ents || !entp || !reps || !repp)
        goto out;
    size_t n = 0, nr = 0;
    uint64_t b = req->cursor;
    uint64_t scanned = 0;
    for (; b < st->index.n_buckets && n < limit && scanned < LIST_SCAN_BUDGET; b++, scanned++) {
        for (kvp_object_t *obj = st->index.buckets[b]; obj != NULL; obj = obj->hnext) {
            if (!on_segment(obj, req->segment_id) || !key_matches(obj, have_re ? &re : NULL))
                continue;
            if (n == cap) {
                /* a pathological chain: grow (rare; chains average below one) */
                size_t ncap = cap * 2;
                Kvpool__ListEntry *ne = realloc(ents, ncap * sizeof(*ne));
                if (ne == NULL)
                    goto out;
                ents = ne;
                Kvpool__ListEntry **np = realloc(entp, ncap * sizeof(*np));
                if (np == NULL)
                    goto out;
                entp = np;
                Kvpool__Replica *nrp = realloc(reps, ncap * KVP_MAX_REPLICAS * sizeof(*nrp));
                if (nrp == NULL)
                    goto out;
                /* entries point into reps through repp: rebuild those pointers */
                reps = nrp;
                Kvpool__Replica **nrpp = realloc(repp, ncap * KVP_MAX_REPLICAS * sizeof(*nrpp));
                if (nrpp == NULL)
                    goto out;
                repp = nrpp;
                for (size_t q = 0; q < nr; q++)
                    repp[q] = &reps[q];
                size_t at = 0;
                for (size_t e = 0; e < n; e++) {
                    entp[e] = &ents[e];
                    ents[e].replicas = &repp[at];
                    at += ents[e].n_replicas;
                }
                cap = ncap;
            }
            Kvpool__ListEntry *e = &ents[n];
            kvpool__list_entry__init(e);
            e->key.data = (uint8_t *)kvp_object_key(obj);
            e->key.len = obj->key_len;
            e->size = obj->size;
            e->state = obj->state;
            e->pin = obj->pin;
            e->crc32c = obj->crc32c;
            if (obj->state == KVP_OBJ_COMPLETE)
                e->lease_ms = (uint32_t)KVP_MIN(kvp_lease_left_ms(st, obj), UINT32_MAX);
            e->replicas = &repp[nr];
            e->n_replicas = 0;
            for (unsigned r = 0; r < obj->n_replicas; r++) {
                if (obj->replicas[r].segment_id == 0)
                    continue; /* a PENDING object's replica whose segment went away */
                e->n_replicas++;
                kvpool__replica__init(&reps[nr]);
                reps[nr].segment_id = obj->replicas[r].segment_id;
                reps[nr].offset = obj->replicas[r].offset;
                reps[nr].length = obj->size;
                repp[nr] = &reps[nr];
                nr++;
            }
            entp[n] = e;
            n++;
        }
    }
    resp.entries = entp;
    resp.n_entries = n;
    resp.next_cursor = b < st->index.n_buckets ? b : 0;
pack:
    KVP_PACK_RESPONSE(kvpool__list_response, &resp, resp_p, resp_len_p);
    rc = KVP_OK;
out:
    if (have_re)
        regfree(&re);
    free(ents);
    free(entp);
    free(reps);
    free(repp);
    kvpool__list_request__free_unpacked(req, NULL);
    return rc;
}

kvp_status_t kvp_svc_remove_by_regex(kvp_master_state_t *st, const uint8_t *body, size_t len,
                                     uint8_t **resp_p, size_t *resp_len_p)
{
    Kvpool__RemoveByRegexRequest *req = kvpool__remove_by_regex_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    Kvpool__RemoveByRegexResponse resp = KVPOOL__REMOVE_BY_REGEX_RESPONSE__INIT;
    char msg[256] = "";
    resp.message = msg;
    regex_t re;
    bool have_re = false;
    kvp_object_t **victims = NULL;
    if (!req->all && req->pattern[0] == '\0') {
        resp.status = KVP_ERR_INVALID_ARG;
        snprintf(msg, sizeof(msg), "an empty pattern removes nothing; ask for all instead");
        goto pack;
    }
    if (!req->all) {
        resp.status = pattern_compile(req->pattern, &re, msg, sizeof(msg));
        if (resp.status != KVP_OK)
            goto pack;
        have_re = true;
    }
    /* collect first, then remove: removal unlinks from the chains being walked */
    size_t n = 0, cap = 0;
    for (uint64_t b = 0; b < st->index.n_buckets; b++) {
        for (kvp_object_t *obj = st->index.buckets[b]; obj != NULL; obj = obj->hnext) {
            if (!key_matches(obj, have_re ? &re : NULL))
                continue;
            if (obj->state != KVP_OBJ_COMPLETE) {
                resp.skipped_pending++;
                continue;
            }
            if (kvp_leased(st, obj) && !req->force) {
                resp.skipped_leased++;
                continue;
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 256;
                kvp_object_t **v = realloc(victims, cap * sizeof(*v));
                if (v == NULL) {
                    resp.status = KVP_ERR_NOMEM;
                    goto remove;
                }
                victims = v;
            }
            victims[n++] = obj;
        }
    }
remove:
    for (size_t i = 0; i < n; i++)
        kvp_svc_object_remove(st, victims[i]);
    resp.removed = n;
    if (n > 0)
        KVP_LOG_INFO("removed %zu objects matching %s%s", n, req->all ? "(all)" : req->pattern,
                     req->force ? " (force)" : "");
pack:
    if (have_re)
        regfree(&re);
    free(victims);
    kvpool__remove_by_regex_request__free_unpacked(req, NULL);
    KVP_PACK_RESPONSE(kvpool__remove_by_regex_response, &resp, resp_p, resp_len_p);
    return KVP_OK;
}

kvp_status_t kvp_svc_drain(kvp_master_state_t *st, const uint8_t *body, size_t len,
                           uint8_t **resp_p, size_t *resp_len_p)
{
    Kvpool__DrainRequest *req = kvpool__drain_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    Kvpool__DrainResponse resp = KVPOOL__DRAIN_RESPONSE__INIT;
    char msg[320] = "";
    resp.message = msg;
    kvp_segment_t *seg = req->segment_name[0] != '\0'
                             ? kvp_segment_table_find_name(&st->segments, req->segment_name)
                             : kvp_segment_table_get(&st->segments, req->segment_id);
    if (seg == NULL) {
        resp.status = KVP_ERR_SEGMENT_GONE;
        snprintf(msg, sizeof(msg), "no segment %s is mounted",
                 req->segment_name[0] != '\0' ? req->segment_name : "with that id");
    } else {
        if (!seg->draining)
            KVP_LOG_INFO("segment %s (id %#llx) is draining: %llu objects to move or drop",
                         seg->name, (unsigned long long)seg->id, (unsigned long long)seg->objects);
        seg->draining = true;
        resp.segment_id = seg->id;
    }
    kvpool__drain_request__free_unpacked(req, NULL);
    KVP_PACK_RESPONSE(kvpool__drain_response, &resp, resp_p, resp_len_p);
    return KVP_OK;
}

static int replica_on(const kvp_object_t *obj, uint64_t segment_id)
{
    for (unsigned r = 0; r < obj->n_replicas; r++)
        if (obj->replicas[r].segment_id == segment_id)
            return (int)r;
    return -1;
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

kvp_status_t kvp_svc_move_start(kvp_master_state_t *st, uint64_t conn_id, const uint8_t *body,
                                size_t len, uint8_t **resp_p, size_t *resp_len_p)
{
    Kvpool__MoveStartRequest *req = kvpool__move_start_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    Kvpool__MoveStartResponse resp = KVPOOL__MOVE_START_RESPONSE__INIT;
    Kvpool__PutStartResult *res = NULL;
    Kvpool__PutStartResult **resptr = NULL;
    Kvpool__Replica *reps = NULL;
    Kvpool__Replica **repptr = NULL;
    kvp_seg_set_t segs = {0};
    kvp_status_t rc = KVP_ERR_NOMEM;
    size_t n = req->n_keys;
    kvp_segment_t *from = kvp_segment_table_get(&st->segments, req->from_segment_id);
    resp.status = kvp_svc_check_batch(n);
    if (resp.status == KVP_OK)
        resp.status = from == NULL                     ? KVP_ERR_SEGMENT_GONE
                      : from->owner_conn_id != conn_id ? KVP_ERR_NOT_OWNER
                      : !from->draining                ? KVP_ERR_INVALID_ARG
                                                       : KVP_OK;
    if (resp.status != KVP_OK)
        goto pack;
    res = calloc(n ? n : 1, sizeof(*res));
    resptr = calloc(n ? n : 1, sizeof(*resptr));
    reps = calloc(n ? n : 1, sizeof(*reps));
    repptr = calloc(n ? n : 1, sizeof(*repptr));
    if (!res || !resptr || !reps || !repptr)
        goto out;
    for (size_t i = 0; i < n; i++) {
        kvpool__put_start_result__init(&res[i]);
        resptr[i] = &res[i];
        kvp_object_t *obj;
        res[i].status = kvp_svc_key_lookup(st, &req->keys[i], &obj, NULL);
        if (res[i].status != KVP_OK)
            continue;
        if (obj == NULL || obj->state != KVP_OBJ_COMPLETE || replica_on(obj, from->id) < 0) {
            res[i].status = KVP_ERR_NOT_FOUND;
            continue;
        }
        if (kept_elsewhere(st, obj, from->id))
            continue; /* a replica on a segment that stays keeps it: nothing to copy */
        kvp_placement_req_t preq = {.size = obj->size, .replica_num = 1};
        kvp_replica_t dest;
        unsigned got = 0;
        res[i].status = kvp_placement_alloc(&st->segments, &preq, &st->rng, &dest, &got);
        if (res[i].status != KVP_OK)
            continue;
        kvp_move_t *mv = malloc(sizeof(*mv) + obj->key_len);
        if (mv == NULL ||
            !kvp_svc_seg_set_add(&segs, kvp_segment_table_get(&st->segments, dest.segment_id))) {
            free(mv);
            kvp_svc_extent_free(st, &dest);
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
        kvpool__replica__init(&reps[i]);
        reps[i].segment_id = dest.segment_id;
        reps[i].offset = dest.offset;
        reps[i].length = obj->size;
        repptr[i] = &reps[i];
        res[i].replicas = &repptr[i];
        res[i].n_replicas = 1;
    }
    if (!kvp_svc_seg_set_finish(&segs))
        goto out; /* the moves stay recorded; the owner's MoveEnd or close frees them */
    resp.n_results = n;
    resp.results = resptr;
    resp.n_segments = segs.n;
    resp.segments = segs.ptrs;
pack:
    KVP_PACK_RESPONSE(kvpool__move_start_response, &resp, resp_p, resp_len_p);
    rc = KVP_OK;
out:
    kvp_svc_seg_set_free(&segs);
    free(res);
    free(resptr);
    free(reps);
    free(repptr);
    kvpool__move_start_request__free_unpacked(req, NULL);
    return rc;
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
        kvp_svc_key_lookup(st, key, &obj, NULL);
        if (obj != NULL)
            r = replica_on(obj, from);
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
        kvp_svc_extent_free(st, &obj->replicas[r]);
        obj->replicas[r] = mv->dest;
        st->stats.moved++;
    } else {
        kvp_svc_extent_free(st, &mv->dest);
    }
    free(mv);
    return status;
}

kvp_status_t kvp_svc_move_end(kvp_master_state_t *st, uint64_t conn_id, const uint8_t *body,
                              size_t len, uint8_t **resp_p, size_t *resp_len_p)
{
    Kvpool__MoveEndRequest *req = kvpool__move_end_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    int32_t status = kvp_svc_check_batch(req->n_keys);
    if (status == KVP_OK && req->n_statuses != req->n_keys)
        status = KVP_ERR_INVALID_ARG;
    int32_t *out = NULL;
    kvp_status_t rc = KVP_OK;
    if (status == KVP_OK) {
        out = malloc((req->n_keys ? req->n_keys : 1) * sizeof(*out));
        if (out == NULL) {
            rc = KVP_ERR_NOMEM;
            goto out;
        }
        for (size_t i = 0; i < req->n_keys; i++)
            out[i] =
                move_end_one(st, conn_id, req->from_segment_id, &req->keys[i], req->statuses[i]);
    }
    rc = kvp_svc_pack_statuses(status, out, req->n_keys, resp_p, resp_len_p);
out:
    free(out);
    kvpool__move_end_request__free_unpacked(req, NULL);
    return rc;
}

void kvp_svc_moves_conn_closed(kvp_master_state_t *st, uint64_t conn_id)
{
    kvp_move_t **pp = &st->moves;
    while (*pp != NULL) {
        kvp_move_t *mv = *pp;
        if (mv->conn_id == conn_id) {
            *pp = mv->next;
            kvp_svc_extent_free(st, &mv->dest);
            free(mv);
            continue;
        }
        pp = &mv->next;
    }
}
