/*
 * service.c - the master's RPC handlers over segments, objects and placement.
 *
 * Every batch RPC answers per key; a whole-request problem (too many keys,
 * mismatched array lengths) is reported in the response's `status` with no
 * per-key results. Requests are decoded with protobuf-c and freed on every
 * path; responses point into master state and are packed before return, so
 * nothing in them outlives the call.
 *
 * Object life: PutStart creates a PENDING object (invisible to get, exist,
 * size) holding its extents; PutEnd by the same connection makes it
 * COMPLETE with its CRC32C; PutRevoke, or the writer's connection closing,
 * frees it. A connection that closes also unmounts the segments it mounted:
 * replicas there are dropped and objects left with none are removed, so a
 * dead owner's bytes are never handed out.
 *
 * Thread: master loop only.
 */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/rpc.h"
#include "common/macros.h"
#include "common/clock.h"
#include "common/parse.h"
#include "common/key.h"
#include "common/rand.h"
#include "kvpool.pb-c.h"
#include "master/master.h"
#include "master/service_internal.h"

kvp_status_t kvp_master_state_init(kvp_master_state_t *st)
{
    memset(st, 0, sizeof(*st));
    kvp_segment_table_init(&st->segments);
    kvp_master_config_init(&st->config);
    kvp_lease_table_init(&st->leases);
    st->now_ms = kvp_now_ms();
    st->rng = kvp_random_u64();
    return kvp_index_init(&st->index);
}

void kvp_master_state_cleanup(kvp_master_state_t *st)
{
    kvp_lease_table_cleanup(&st->leases); /* first: it frees retired objects only */
    kvp_ghost_cleanup(&st->ghost);
    while (st->moves != NULL) {
        kvp_move_t *mv = st->moves;
        st->moves = mv->next;
        free(mv);
    }
    kvp_index_cleanup(&st->index);
    kvp_segment_table_cleanup(&st->segments);
}

void kvp_object_release(kvp_master_state_t *st, kvp_object_t *obj)
{
    kvp_lease_forget(st, obj);
    for (unsigned i = 0; i < obj->n_replicas; i++) {
        kvp_segment_t *seg = kvp_segment_table_get(&st->segments, obj->replicas[i].segment_id);
        if (seg != NULL) {
            kvp_offset_alloc_free(seg->alloc, obj->replicas[i].handle);
            seg->objects--;
        }
    }
    free(obj);
}

/* Free one extent that belongs to no object (a failed move's destination). */
void kvp_svc_extent_free(kvp_master_state_t *st, const kvp_replica_t *rep)
{
    kvp_segment_t *seg = kvp_segment_table_get(&st->segments, rep->segment_id);
    if (seg != NULL) {
        kvp_offset_alloc_free(seg->alloc, rep->handle);
        seg->objects--;
    }
}

/* Unlink a COMPLETE object from the index and retire it (kept while reads are in flight). */
void kvp_svc_object_remove(kvp_master_state_t *st, kvp_object_t *obj)
{
    kvp_index_unlink(&st->index, obj);
    kvp_object_retire(st, obj);
}

/* ---- response packing helpers ---- */

void kvp_svc_desc_fill(Kvpool__SegmentDesc *d, const kvp_segment_t *seg)
{
    kvpool__segment_desc__init(d);
    d->id = seg->id;
    d->name = seg->name;
    d->medium = seg->medium;
    d->size = seg->size;
    d->owner_client_id = seg->owner_client_id;
    d->host_id = seg->host_id;
    d->tcp_endpoint = seg->tcp_endpoint;
    d->shm_path = seg->shm_path;
    d->rdma_endpoint = seg->rdma_endpoint;
    d->rdma_addr = seg->rdma_addr;
    d->rdma_rkey = seg->rdma_rkey;
    d->draining = seg->draining;
}

bool kvp_svc_seg_set_add(kvp_seg_set_t *s, const kvp_segment_t *seg)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->descs[i].id == seg->id)
            return true;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        Kvpool__SegmentDesc *d = realloc(s->descs, cap * sizeof(*d));
        if (d == NULL)
            return false;
        s->descs = d;
        s->cap = cap;
    }
    kvp_svc_desc_fill(&s->descs[s->n++], seg);
    return true;
}

bool kvp_svc_seg_set_finish(kvp_seg_set_t *s)
{
    s->ptrs = malloc((s->n ? s->n : 1) * sizeof(*s->ptrs));
    if (s->ptrs == NULL)
        return false;
    for (size_t i = 0; i < s->n; i++)
        s->ptrs[i] = &s->descs[i];
    return true;
}

void kvp_svc_seg_set_free(kvp_seg_set_t *s)
{
    free(s->descs);
    free(s->ptrs);
}

/*
 * Append obj's replicas to a response under construction: reps/repptr have
 * room (sized by the caller), *nr counts what is used, segs collects the
 * descriptors. false: out of memory.
 */
bool kvp_svc_add_replicas(kvp_master_state_t *st, const kvp_object_t *obj, Kvpool__Replica *reps,
                          Kvpool__Replica **repptr, size_t *nr, kvp_seg_set_t *segs)
{
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        Kvpool__Replica *rep = &reps[*nr];
        kvpool__replica__init(rep);
        rep->segment_id = obj->replicas[r].segment_id;
        rep->offset = obj->replicas[r].offset;
        rep->length = obj->size;
        repptr[(*nr)++] = rep;
        if (!kvp_svc_seg_set_add(segs, kvp_segment_table_get(&st->segments, rep->segment_id)))
            return false;
    }
    return true;
}

kvp_status_t kvp_svc_check_batch(size_t n_keys)
{
    return n_keys > 65536 ? KVP_ERR_TOO_MANY : KVP_OK;
}

/*
 * Validate a key off the wire and look it up. Keys travel as protobuf
 * `bytes` with an explicit length, so a NUL inside one is seen (and refused)
 * rather than silently shortening the key.
 */
kvp_status_t kvp_svc_key_lookup(kvp_master_state_t *st, const ProtobufCBinaryData *key,
                                kvp_object_t **obj_p, uint64_t *hash_p)
{
    const char *k = (const char *)key->data;
    if (!kvp_key_valid(k, key->len))
        return KVP_ERR_BAD_KEY;
    uint64_t h = kvp_index_hash(k, key->len);
    if (hash_p)
        *hash_p = h;
    *obj_p = kvp_index_lookup(&st->index, k, key->len, h);
    return KVP_OK;
}

/* ---- handlers ---- */

static kvp_status_t do_mount(kvp_master_state_t *st, uint64_t conn_id, const uint8_t *body,
                             size_t len, uint8_t **resp_p, size_t *resp_len_p)
{
    Kvpool__MountRequest *req = kvpool__mount_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    Kvpool__MountResponse resp = KVPOOL__MOUNT_RESPONSE__INIT;
    char msg[256] = "";
    const Kvpool__SegmentDesc *d = req->segment;
    kvp_status_t status = KVP_ERR_INVALID_ARG;
    char host[256];
    uint16_t port;
    if (d == NULL || d->size < KVP_SEGMENT_MIN_SIZE || d->size > KVP_SEGMENT_MAX_SIZE ||
        d->name[0] == '\0' || strlen(d->name) > 255 || strcmp(d->medium, "dram") != 0 ||
        d->host_id[0] == '\0' ||
        kvp_parse_hostport(d->tcp_endpoint, host, sizeof(host), &port) != KVP_OK ||
        (d->rdma_endpoint[0] != '\0' &&
         kvp_parse_hostport(d->rdma_endpoint, host, sizeof(host), &port) != KVP_OK)) {
        snprintf(msg, sizeof(msg),
                 "mount needs a size of %u bytes to 1 PiB, a name of 1..255 bytes, medium "
                 "\"dram\", a host id, a tcp endpoint host:port and an empty or host:port "
                 "rdma endpoint",
                 KVP_SEGMENT_MIN_SIZE);
        goto out;
    }
    if (kvp_segment_table_find_name(&st->segments, d->name) != NULL) {
        status = KVP_ERR_EXISTS;
        snprintf(msg, sizeof(msg), "a segment named %s is already mounted", d->name);
        goto out;
    }
    kvp_segment_t *seg = calloc(1, sizeof(*seg));
    status = KVP_ERR_NOMEM;
    if (seg == NULL)
        goto out;
    seg->name = strdup(d->name);
    seg->medium = strdup(d->medium);
    seg->host_id = strdup(d->host_id);
    seg->tcp_endpoint = strdup(d->tcp_endpoint);
    seg->shm_path = strdup(d->shm_path);
    seg->rdma_endpoint = strdup(d->rdma_endpoint);
    seg->rdma_addr = d->rdma_addr;
    seg->rdma_rkey = d->rdma_rkey;
    seg->size = d->size;
    seg->owner_client_id = req->client_id;
    seg->owner_conn_id = conn_id;
    if (!seg->name || !seg->medium || !seg->host_id || !seg->tcp_endpoint || !seg->shm_path ||
        !seg->rdma_endpoint) {
        kvp_segment_destroy(seg);
        goto out;
    }
    /* 64-byte granularity: cache-line aligned extents, small metadata. */
    status = kvp_offset_alloc_create(d->size, KVP_SEGMENT_ALIGN, &seg->alloc);
    if (status == KVP_OK)
        status = kvp_segment_table_add(&st->segments, seg);
    if (status != KVP_OK) {
        snprintf(msg, sizeof(msg), "cannot set up segment %s: %s", d->name, kvp_strerror(status));
        kvp_segment_destroy(seg);
        goto out;
    }
    resp.segment_id = seg->id;
    KVP_LOG_INFO("mounted segment %s (id %#llx, %llu bytes, endpoint %s)", seg->name,
                 (unsigned long long)seg->id, (unsigned long long)seg->size, seg->tcp_endpoint);
out:
    resp.status = status;
    resp.message = msg;
    kvpool__mount_request__free_unpacked(req, NULL);
    KVP_PACK_RESPONSE(kvpool__mount_response, &resp, resp_p, resp_len_p);
    return KVP_OK;
}

typedef struct drop_ctx {
    kvp_master_state_t *st;
    uint64_t segment_id;
    uint64_t dropped;
} drop_ctx_t;

/*
 * Drop the replica on ctx->segment_id; remove the object when none is left.
 * A PENDING object keeps its replica positions (the dropped one becomes a
 * tombstone, segment id 0): PutEnd's written_mask refers to them by index.
 */
static bool drop_replica_cb(kvp_object_t *obj, void *arg)
{
    drop_ctx_t *ctx = arg;
    unsigned live = 0;
    bool hit = false;
    for (unsigned i = 0; i < obj->n_replicas; i++) {
        if (obj->replicas[i].segment_id == ctx->segment_id)
            hit = true;
        else if (obj->replicas[i].segment_id != 0)
            live++;
    }
    if (!hit)
        return false;
    if (live == 0) {
        ctx->dropped++;
        kvp_lease_forget(ctx->st, obj); /* its readers fail: the owner is gone */
        return true;                    /* its only extent was on the segment being destroyed */
    }
    if (obj->state == KVP_OBJ_PENDING) {
        for (unsigned i = 0; i < obj->n_replicas; i++)
            if (obj->replicas[i].segment_id == ctx->segment_id)
                obj->replicas[i].segment_id = 0;
        return false;
    }
    unsigned w = 0;
    for (unsigned i = 0; i < obj->n_replicas; i++) {
        if (obj->replicas[i].segment_id == ctx->segment_id)
            continue;
        obj->replicas[w++] = obj->replicas[i];
    }
    /* Shift the key down behind the shortened replica array. */
    memmove((char *)&obj->replicas[w], kvp_object_key(obj), obj->key_len);
    obj->n_replicas = (uint8_t)w;
    return false;
}

static uint64_t unmount_segment(kvp_master_state_t *st, kvp_segment_t *seg)
{
    drop_ctx_t ctx = {.st = st, .segment_id = seg->id};
    if (seg->objects > 0)
        kvp_index_foreach_remove(&st->index, drop_replica_cb, &ctx);
    KVP_LOG_INFO("unmounted segment %s (id %#llx): %llu objects lost their last replica", seg->name,
                 (unsigned long long)seg->id, (unsigned long long)ctx.dropped);
    kvp_segment_table_remove(&st->segments, seg);
    return ctx.dropped;
}

static kvp_status_t do_unmount(kvp_master_state_t *st, uint64_t conn_id, const uint8_t *body,
                               size_t len, uint8_t **resp_p, size_t *resp_len_p)
{
    Kvpool__UnmountRequest *req = kvpool__unmount_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    Kvpool__UnmountResponse resp = KVPOOL__UNMOUNT_RESPONSE__INIT;
    kvp_segment_t *seg = kvp_segment_table_get(&st->segments, req->segment_id);
    if (seg == NULL)
        resp.status = KVP_ERR_SEGMENT_GONE;
    else if (seg->owner_conn_id != conn_id)
        resp.status = KVP_ERR_NOT_OWNER;
    else
        resp.objects_dropped = unmount_segment(st, seg);
    kvpool__unmount_request__free_unpacked(req, NULL);
    KVP_PACK_RESPONSE(kvpool__unmount_response, &resp, resp_p, resp_len_p);
    return KVP_OK;
}

/* Has obj a replica on a draining segment? (No new bytes go there.) */
static bool on_draining(kvp_master_state_t *st, const kvp_object_t *obj)
{
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        const kvp_segment_t *seg =
            kvp_segment_table_get(&st->segments, obj->replicas[r].segment_id);
        if (seg != NULL && seg->draining)
            return true;
    }
    return false;
}

static void set_pin(kvp_master_state_t *st, kvp_object_t *obj, const kvp_placement_req_t *preq)
{
    obj->pin = (uint8_t)preq->pin;
    obj->soft_pin_until_s = 0;
    if (preq->pin == KVP_PIN_SOFT) {
        /* whole seconds, rounded up so a pin never ends early; saturating, so a huge
         * TTL means "as long as possible" rather than wrapping to the past */
        uint64_t ttl = preq->soft_pin_ttl_s ? preq->soft_pin_ttl_s : st->config.soft_pin_ttl_s;
        uint64_t until = (st->now_ms + 999) / 1000 + ttl;
        obj->soft_pin_until_s = until > UINT32_MAX ? UINT32_MAX : (uint32_t)until;
    }
}

/*
 * Bytes that the reads now in flight give back when they end: removed objects kept for
 * their readers are freed then; a live object becomes evictable again, unless eviction is
 * off, it is hard-pinned or it is on a draining segment. O(reads in flight): a full pool
 * only, once per PutStart batch (*cache_p, -1: not yet computed).
 */
static uint64_t reads_give_back(kvp_master_state_t *st, int64_t *cache_p)
{
    if (*cache_p >= 0)
        return (uint64_t)*cache_p;
    uint64_t bytes = 0;
    const kvp_lease_table_t *t = &st->leases;
    for (uint32_t i = t->head; i != UINT32_MAX; i = t->slots[i].next) {
        const kvp_object_t *obj = t->slots[i].obj;
        if (obj->state == KVP_OBJ_RETIRED ||
            (st->config.evict && obj->pin != KVP_PIN_HARD && !on_draining(st, obj)))
            bytes += t->slots[i].bytes;
    }
    *cache_p = (int64_t)bytes;
    return bytes;
}

static kvp_status_t put_start_one(kvp_master_state_t *st, uint64_t conn_id,
                                  const ProtobufCBinaryData *key, uint64_t size,
                                  const kvp_placement_req_t *preq, int64_t *give_back_p,
                                  kvp_object_t **obj_p)
{
    kvp_object_t *obj;
    uint64_t hash;
    kvp_status_t status = kvp_svc_key_lookup(st, key, &obj, &hash);
    if (status != KVP_OK)
        return status;
    if (size == 0)
        return KVP_ERR_INVALID_ARG;
    if (obj != NULL && obj->state != KVP_OBJ_COMPLETE)
        return KVP_ERR_PENDING;
    if (obj != NULL && !preq->upsert)
        return KVP_ERR_EXISTS;
    if (obj != NULL) {
        /* Upsert. Same size and nobody reading: rewrite the extents in place (the
         * object is PENDING, so invisible, while that happens). Otherwise the old
         * object goes now (its extents stay until readers' leases end) and the new
         * one gets extents of its own. Either way the key is absent until PutEnd,
         * and absent for good if the new put fails. */
        if (obj->size == size && !kvp_leased(st, obj) && !on_draining(st, obj) &&
            obj->n_replicas >= (preq->replica_num ? preq->replica_num : 1)) {
            kvp_lease_forget(st, obj); /* a lease whose TTL is over: its slot goes */
            kvp_index_set_state(&st->index, obj, KVP_OBJ_PENDING);
            obj->writer_conn_id = conn_id;
            obj->deadline_ms = st->now_ms + st->config.put_timeout_ms;
            set_pin(st, obj, preq);
            *obj_p = obj;
            return KVP_OK;
        }
        kvp_svc_object_remove(st, obj);
    }
    kvp_replica_t reps[KVP_MAX_REPLICAS];
    unsigned n = 0;
    kvp_placement_req_t r = *preq;
    r.size = size;
    status = kvp_placement_alloc(&st->segments, &r, &st->rng, reps, &n);
    /* No room: evict this object's worth (policy order) and try again. Free bytes are
     * not a free extent: in a fragmented segment the freed space may be scattered, so
     * keep evicting until the object fits or nothing evictable is left. */
    uint64_t need = size * (r.replica_num ? r.replica_num : 1);
    while (status == KVP_ERR_POOL_FULL) {
        /* leases whose TTL is over first: what they free may be enough by itself */
        uint64_t before = kvp_master_used(st);
        kvp_lease_expire(st);
        uint64_t used = kvp_master_used(st);
        if (kvp_evict_to(st, used > need ? used - need : 0) == 0 && used == before)
            break;
        status = kvp_placement_alloc(&st->segments, &r, &st->rng, reps, &n);
    }
    /* Nothing evictable is left. If the reads in flight give back enough room when they
     * end, the client waits and asks again (bounded by its timeout). */
    if (status == KVP_ERR_POOL_FULL && reads_give_back(st, give_back_p) >= need)
        return KVP_ERR_POOL_BUSY;
    if (status != KVP_OK)
        return status;
    obj = kvp_object_create((const char *)key->data, key->len, hash, n);
    if (obj == NULL) {
        for (unsigned i = 0; i < n; i++) {
            kvp_segment_t *seg = kvp_segment_table_get(&st->segments, reps[i].segment_id);
            kvp_offset_alloc_free(seg->alloc, reps[i].handle);
            seg->objects--;
        }
        return KVP_ERR_NOMEM;
    }
    memcpy(obj->replicas, reps, n * sizeof(reps[0]));
    obj->size = size;
    obj->state = KVP_OBJ_PENDING;
    obj->writer_conn_id = conn_id;
    obj->deadline_ms = st->now_ms + st->config.put_timeout_ms;
    set_pin(st, obj, preq);
    kvp_index_insert(&st->index, obj);
    *obj_p = obj;
    return KVP_OK;
}

/* What holds a pool that has no room left (PutStartResponse.message). */
static void pool_full_message(kvp_master_state_t *st, char *buf, size_t len)
{
    uint64_t pending = 0;
    for (const kvp_object_t *o = st->index.pending_list.head; o != NULL; o = o->lnext)
        pending += kvp_object_bytes(o);
    uint64_t used = kvp_master_used(st);
    uint64_t other = used - KVP_MIN(used, pending + st->leases.bytes);
    snprintf(buf, len,
             "pool full: %llu of %llu bytes used: %llu by reads in flight (%u objects), %llu by "
             "puts not yet ended (%llu objects), %llu by %s; or the free room is too "
             "fragmented for the object",
             (unsigned long long)used, (unsigned long long)st->segments.capacity,
             (unsigned long long)st->leases.bytes, st->leases.live, (unsigned long long)pending,
             (unsigned long long)st->index.pending, (unsigned long long)other,
             st->config.evict ? "pinned objects or objects on draining segments"
                              : "stored objects (eviction is off: --no-eviction)");
}

static kvp_status_t do_put_start(kvp_master_state_t *st, uint64_t conn_id, const uint8_t *body,
                                 size_t len, uint8_t **resp_p, size_t *resp_len_p)
{
    Kvpool__PutStartRequest *req = kvpool__put_start_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    Kvpool__PutStartResponse resp = KVPOOL__PUT_START_RESPONSE__INIT;
    Kvpool__PutStartResult *res = NULL;
    Kvpool__PutStartResult **resptr = NULL;
    Kvpool__Replica *reps = NULL;
    Kvpool__Replica **repptr = NULL;
    kvp_seg_set_t segs = {0};
    kvp_status_t rc = KVP_OK;
    char full_msg[384] = "";

    resp.status = kvp_svc_check_batch(req->n_keys);
    if (resp.status == KVP_OK && req->n_sizes != req->n_keys)
        resp.status = KVP_ERR_INVALID_ARG;
    if (resp.status != KVP_OK)
        goto pack;

    kvp_placement_req_t preq = {.replica_num = 1};
    if (req->config != NULL) {
        preq.replica_num = req->config->replica_num ? req->config->replica_num : 1;
        if (req->config->pin <= KVP_PIN_HARD)
            preq.pin = req->config->pin;
        preq.soft_pin_ttl_s = req->config->soft_pin_ttl_s;
        preq.upsert = req->config->upsert;
        if (req->config->preferred_segment[0] != '\0')
            preq.preferred =
                kvp_segment_table_find_name(&st->segments, req->config->preferred_segment);
    }
    if (preq.replica_num > KVP_MAX_REPLICAS)
        preq.replica_num = KVP_MAX_REPLICAS;
    size_t n = req->n_keys;
    res = calloc(n ? n : 1, sizeof(*res));
    resptr = calloc(n ? n : 1, sizeof(*resptr));
    /* an in-place upsert answers with the existing object's replicas */
    size_t per_key = preq.upsert ? KVP_MAX_REPLICAS : preq.replica_num;
    reps = calloc(n * per_key + 1, sizeof(*reps));
    repptr = calloc(n * per_key + 1, sizeof(*repptr));
    if (!res || !resptr || !reps || !repptr) {
        rc = KVP_ERR_NOMEM;
        goto out;
    }
    size_t nr = 0;
    int64_t give_back = -1;
    for (size_t i = 0; i < n; i++) {
        kvpool__put_start_result__init(&res[i]);
        resptr[i] = &res[i];
        kvp_object_t *obj = NULL;
        res[i].status =
            put_start_one(st, conn_id, &req->keys[i], req->sizes[i], &preq, &give_back, &obj);
        if ((res[i].status == KVP_ERR_POOL_FULL || res[i].status == KVP_ERR_POOL_BUSY) &&
            full_msg[0] == '\0')
            pool_full_message(st, full_msg, sizeof(full_msg));
        if (res[i].status != KVP_OK)
            continue;
        res[i].replicas = &repptr[nr];
        res[i].n_replicas = obj->n_replicas;
        if (!kvp_svc_add_replicas(st, obj, reps, repptr, &nr, &segs)) {
            rc = KVP_ERR_NOMEM;
            goto out;
        }
    }
    if (!kvp_svc_seg_set_finish(&segs)) {
        rc = KVP_ERR_NOMEM;
        goto out;
    }
    kvp_evict_if_needed(st);
    resp.n_results = n;
    resp.results = resptr;
    resp.n_segments = segs.n;
    resp.segments = segs.ptrs;
    resp.message = full_msg;
pack:;
    size_t plen = kvpool__put_start_response__get_packed_size(&resp);
    uint8_t *buf = malloc(plen ? plen : 1);
    if (buf == NULL) {
        rc = KVP_ERR_NOMEM;
        goto out;
    }
    kvpool__put_start_response__pack(&resp, buf);
    *resp_p = buf;
    *resp_len_p = plen;
out:
    if (rc != KVP_OK && res != NULL && resptr != NULL) {
        /* Could not answer: undo the PENDING objects this call created. */
        for (size_t i = 0; i < req->n_keys; i++) {
            if (resptr[i] == NULL || res[i].status != KVP_OK)
                continue;
            kvp_object_t *obj;
            if (kvp_svc_key_lookup(st, &req->keys[i], &obj, NULL) == KVP_OK && obj != NULL &&
                obj->state == KVP_OBJ_PENDING && obj->writer_conn_id == conn_id) {
                kvp_index_unlink(&st->index, obj);
                kvp_object_release(st, obj);
            }
        }
    }
    kvp_svc_seg_set_free(&segs);
    free(res);
    free(resptr);
    free(reps);
    free(repptr);
    kvpool__put_start_request__free_unpacked(req, NULL);
    return rc;
}

/* Pack a StatusesResponse from a per-key status array. */
kvp_status_t kvp_svc_pack_statuses(int32_t status, int32_t *statuses, size_t n, uint8_t **resp_p,
                                   size_t *resp_len_p)
{
    Kvpool__StatusesResponse resp = KVPOOL__STATUSES_RESPONSE__INIT;
    resp.status = status;
    resp.statuses = statuses;
    resp.n_statuses = statuses ? n : 0;
    KVP_PACK_RESPONSE(kvpool__statuses_response, &resp, resp_p, resp_len_p);
    return KVP_OK;
}

typedef kvp_status_t (*key_op_fn_t)(kvp_master_state_t *st, uint64_t conn_id,
                                    const ProtobufCBinaryData *key,
                                    const Kvpool__PutEndRequest *end, size_t i, bool force);

static kvp_status_t op_put_end(kvp_master_state_t *st, uint64_t conn_id,
                               const ProtobufCBinaryData *key, const Kvpool__PutEndRequest *end,
                               size_t i, bool force)
{
    (void)force;
    kvp_object_t *obj;
    kvp_status_t status = kvp_svc_key_lookup(st, key, &obj, NULL);
    if (status != KVP_OK)
        return status;
    if (obj == NULL)
        return KVP_ERR_NOT_FOUND;
    if (obj->state != KVP_OBJ_PENDING)
        return KVP_ERR_NOT_PENDING;
    if (obj->writer_conn_id != conn_id)
        return KVP_ERR_NOT_OWNER;
    /* Best effort per replica: keep what was written (bit r: replica r of PutStart's
     * answer; no mask: all), free the rest, and drop tombstones of replicas whose
     * segment went away meanwhile. */
    uint32_t mask = end->n_written_mask > 0 ? end->written_mask[i] : UINT32_MAX;
    unsigned w = 0;
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        if (obj->replicas[r].segment_id != 0 && (mask & (1u << r)))
            obj->replicas[w++] = obj->replicas[r];
        else if (obj->replicas[r].segment_id != 0)
            kvp_svc_extent_free(st, &obj->replicas[r]);
    }
    if (w == 0) {
        kvp_index_unlink(&st->index, obj);
        free(obj);
        return KVP_ERR_IO;
    }
    if (w < obj->n_replicas) {
        memmove((char *)&obj->replicas[w], kvp_object_key(obj), obj->key_len);
        obj->n_replicas = (uint8_t)w;
    }
    obj->crc32c = end->crc32c[i];
    obj->deadline_ms = 0;
    obj->lease = 0; /* from now on: lease slot and policy state, not the writer */
    obj->policy = 0;
    kvp_index_set_state(&st->index, obj, KVP_OBJ_COMPLETE);
    kvp_policy_put(st, obj, end->n_keys > 1 && i + 1 == end->n_keys);
    return KVP_OK;
}

static kvp_status_t op_put_revoke(kvp_master_state_t *st, uint64_t conn_id,
                                  const ProtobufCBinaryData *key, const Kvpool__PutEndRequest *end,
                                  size_t i, bool force)
{
    (void)end, (void)i, (void)force;
    kvp_object_t *obj;
    kvp_status_t status = kvp_svc_key_lookup(st, key, &obj, NULL);
    if (status != KVP_OK)
        return status;
    if (obj == NULL)
        return KVP_ERR_NOT_FOUND;
    if (obj->state != KVP_OBJ_PENDING)
        return KVP_ERR_NOT_PENDING;
    if (obj->writer_conn_id != conn_id)
        return KVP_ERR_NOT_OWNER;
    kvp_index_unlink(&st->index, obj);
    kvp_object_release(st, obj);
    return KVP_OK;
}

static kvp_status_t op_remove(kvp_master_state_t *st, uint64_t conn_id,
                              const ProtobufCBinaryData *key, const Kvpool__PutEndRequest *end,
                              size_t i, bool force)
{
    (void)conn_id, (void)end, (void)i, (void)force;
    kvp_object_t *obj;
    kvp_status_t status = kvp_svc_key_lookup(st, key, &obj, NULL);
    if (status != KVP_OK)
        return status;
    if (obj == NULL)
        return KVP_ERR_NOT_FOUND;
    if (obj->state == KVP_OBJ_PENDING)
        return KVP_ERR_PENDING;
    if (kvp_leased(st, obj) && !force)
        return KVP_ERR_LEASED;
    kvp_svc_object_remove(st, obj);
    return KVP_OK;
}

static kvp_status_t op_exist(kvp_master_state_t *st, uint64_t conn_id,
                             const ProtobufCBinaryData *key, const Kvpool__PutEndRequest *end,
                             size_t i, bool force)
{
    (void)conn_id, (void)end, (void)i, (void)force;
    kvp_object_t *obj;
    kvp_status_t status = kvp_svc_key_lookup(st, key, &obj, NULL);
    if (status != KVP_OK)
        return status;
    if (obj == NULL || obj->state != KVP_OBJ_COMPLETE)
        return 0;
    if (st->config.lease_on_exist)
        kvp_lease_grant(st, obj); /* nobody releases it: it ends by the TTL */
    return 1;
}

/* Per-key statuses for PutEnd/PutRevoke/Remove/Exist: one loop, one packer. */
static kvp_status_t do_keys(kvp_master_state_t *st, uint64_t conn_id, uint16_t method,
                            const uint8_t *body, size_t len, uint8_t **resp_p, size_t *resp_len_p)
{
    ProtobufCBinaryData *keys;
    size_t n_keys;
    bool force = false;
    Kvpool__PutEndRequest *end = NULL;
    Kvpool__KeysRequest *kreq = NULL;
    if (method == KVP_RPC_PUT_END) {
        end = kvpool__put_end_request__unpack(NULL, len, body);
        if (end == NULL)
            return KVP_ERR_PROTOCOL;
        keys = end->keys;
        n_keys = end->n_keys;
    } else {
        kreq = kvpool__keys_request__unpack(NULL, len, body);
        if (kreq == NULL)
            return KVP_ERR_PROTOCOL;
        keys = kreq->keys;
        n_keys = kreq->n_keys;
        force = kreq->force;
    }
    key_op_fn_t fn = method == KVP_RPC_PUT_END      ? op_put_end
                     : method == KVP_RPC_PUT_REVOKE ? op_put_revoke
                     : method == KVP_RPC_REMOVE     ? op_remove
                                                    : op_exist;
    int32_t status = kvp_svc_check_batch(n_keys);
    if (status == KVP_OK && end != NULL &&
        (end->n_crc32c != n_keys || (end->n_written_mask != 0 && end->n_written_mask != n_keys)))
        status = KVP_ERR_INVALID_ARG;
    int32_t *out = NULL;
    kvp_status_t rc = KVP_OK;
    if (status == KVP_OK) {
        out = malloc((n_keys ? n_keys : 1) * sizeof(*out));
        if (out == NULL) {
            rc = KVP_ERR_NOMEM;
            goto out;
        }
        /* last key first: the eviction policy sees a chain's first block last, so it
         * ends up the most recent (eviction.c); each key's answer is its own */
        for (size_t i = n_keys; i-- > 0;)
            out[i] = fn(st, conn_id, &keys[i], end, i, force);
    }
    rc = kvp_svc_pack_statuses(status, out, n_keys, resp_p, resp_len_p);
out:
    free(out);
    if (end)
        kvpool__put_end_request__free_unpacked(end, NULL);
    if (kreq)
        kvpool__keys_request__free_unpacked(kreq, NULL);
    return rc;
}

static kvp_status_t do_get_replicas(kvp_master_state_t *st, const uint8_t *body, size_t len,
                                    uint8_t **resp_p, size_t *resp_len_p)
{
    Kvpool__KeysRequest *req = kvpool__keys_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    Kvpool__GetReplicaListResponse resp = KVPOOL__GET_REPLICA_LIST_RESPONSE__INIT;
    Kvpool__GetReplicaResult *res = NULL;
    Kvpool__GetReplicaResult **resptr = NULL;
    Kvpool__Replica *reps = NULL;
    Kvpool__Replica **repptr = NULL;
    kvp_seg_set_t segs = {0};
    kvp_status_t rc = KVP_OK;
    size_t n = req->n_keys;
    resp.status = kvp_svc_check_batch(n);
    if (resp.status == KVP_OK) {
        res = calloc(n ? n : 1, sizeof(*res));
        resptr = calloc(n ? n : 1, sizeof(*resptr));
        reps = calloc(n * KVP_MAX_REPLICAS + 1, sizeof(*reps));
        repptr = calloc(n * KVP_MAX_REPLICAS + 1, sizeof(*repptr));
        if (!res || !resptr || !reps || !repptr) {
            rc = KVP_ERR_NOMEM;
            goto out;
        }
        size_t nr = 0;
        for (size_t i = n; i-- > 0;) { /* last key first, as in do_keys */
            kvpool__get_replica_result__init(&res[i]);
            resptr[i] = &res[i];
            kvp_object_t *obj;
            res[i].status = kvp_svc_key_lookup(st, &req->keys[i], &obj, NULL);
            if (res[i].status != KVP_OK)
                continue;
            if (obj == NULL || obj->state != KVP_OBJ_COMPLETE) {
                res[i].status = KVP_ERR_NOT_FOUND;
                continue;
            }
            res[i].size = obj->size;
            res[i].crc32c = obj->crc32c;
            /* a read lease: the extents stay put (no eviction, no plain remove) until
             * the client releases it after its transfer */
            res[i].lease_id = kvp_lease_grant(st, obj); /* the read counts when it ends */
            res[i].replicas = &repptr[nr];
            res[i].n_replicas = obj->n_replicas;
            if (!kvp_svc_add_replicas(st, obj, reps, repptr, &nr, &segs)) {
                rc = KVP_ERR_NOMEM;
                goto out;
            }
        }
        if (!kvp_svc_seg_set_finish(&segs)) {
            rc = KVP_ERR_NOMEM;
            goto out;
        }
        resp.n_results = n;
        resp.results = resptr;
        resp.n_segments = segs.n;
        resp.segments = segs.ptrs;
        resp.lease_ttl_ms = st->config.lease_ttl_ms;
    }
    size_t plen = kvpool__get_replica_list_response__get_packed_size(&resp);
    uint8_t *b = malloc(plen ? plen : 1);
    if (b == NULL) {
        rc = KVP_ERR_NOMEM;
        goto out;
    }
    kvpool__get_replica_list_response__pack(&resp, b);
    *resp_p = b;
    *resp_len_p = plen;
out:
    /* no answer goes out: nobody will release the leases this call granted */
    for (size_t i = 0; rc != KVP_OK && resptr != NULL && i < n; i++)
        if (resptr[i] != NULL && res[i].lease_id != 0)
            kvp_lease_release(st, res[i].lease_id);
    kvp_svc_seg_set_free(&segs);
    free(res);
    free(resptr);
    free(reps);
    free(repptr);
    kvpool__keys_request__free_unpacked(req, NULL);
    return rc;
}

/* One-way: no response is packed. */
static kvp_status_t do_lease_release(kvp_master_state_t *st, const uint8_t *body, size_t len)
{
    Kvpool__LeaseReleaseRequest *req = kvpool__lease_release_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    for (size_t i = 0; i < req->n_lease_ids; i++)
        kvp_lease_release(st, req->lease_ids[i]);
    kvpool__lease_release_request__free_unpacked(req, NULL);
    return KVP_OK;
}

static kvp_status_t do_get_size(kvp_master_state_t *st, const uint8_t *body, size_t len,
                                uint8_t **resp_p, size_t *resp_len_p)
{
    Kvpool__KeysRequest *req = kvpool__keys_request__unpack(NULL, len, body);
    if (req == NULL)
        return KVP_ERR_PROTOCOL;
    Kvpool__GetSizeResponse resp = KVPOOL__GET_SIZE_RESPONSE__INIT;
    int64_t *sizes = NULL;
    kvp_status_t rc = KVP_OK;
    resp.status = kvp_svc_check_batch(req->n_keys);
    if (resp.status == KVP_OK) {
        sizes = malloc((req->n_keys ? req->n_keys : 1) * sizeof(*sizes));
        if (sizes == NULL) {
            rc = KVP_ERR_NOMEM;
            goto out;
        }
        for (size_t i = 0; i < req->n_keys; i++) {
            kvp_object_t *obj;
            kvp_status_t s = kvp_svc_key_lookup(st, &req->keys[i], &obj, NULL);
            if (s == KVP_OK && (obj == NULL || obj->state != KVP_OBJ_COMPLETE))
                s = KVP_ERR_NOT_FOUND;
            sizes[i] = s == KVP_OK ? (int64_t)obj->size : s;
        }
        resp.sizes = sizes;
        resp.n_sizes = req->n_keys;
    }
    size_t plen = kvpool__get_size_response__get_packed_size(&resp);
    uint8_t *b = malloc(plen ? plen : 1);
    if (b == NULL) {
        rc = KVP_ERR_NOMEM;
        goto out;
    }
    kvpool__get_size_response__pack(&resp, b);
    *resp_p = b;
    *resp_len_p = plen;
out:
    free(sizes);
    kvpool__keys_request__free_unpacked(req, NULL);
    return rc;
}

static kvp_status_t do_stat(kvp_master_state_t *st, uint8_t **resp_p, size_t *resp_len_p)
{
    Kvpool__StatResponse resp = KVPOOL__STAT_RESPONSE__INIT;
    size_t n = st->segments.count;
    Kvpool__SegmentStat *ss = calloc(n ? n : 1, sizeof(*ss));
    Kvpool__SegmentStat **sp = calloc(n ? n : 1, sizeof(*sp));
    Kvpool__SegmentDesc *ds = calloc(n ? n : 1, sizeof(*ds));
    kvp_status_t rc = KVP_ERR_NOMEM;
    if (!ss || !sp || !ds)
        goto out;
    size_t k = 0;
    uint64_t used = 0;
    for (uint32_t i = 0; i < st->segments.n_slots; i++) {
        kvp_segment_t *seg = st->segments.slots[i];
        if (seg == NULL)
            continue;
        kvpool__segment_stat__init(&ss[k]);
        kvp_svc_desc_fill(&ds[k], seg);
        ss[k].desc = &ds[k];
        ss[k].used = kvp_segment_used(seg);
        ss[k].objects = seg->objects;
        used += ss[k].used;
        sp[k] = &ss[k];
        k++;
    }
    resp.capacity = st->segments.capacity;
    resp.used = used;
    resp.objects = st->index.count - st->index.pending;
    resp.pending = st->index.pending;
    resp.evicted_objects = st->stats.evicted_objects;
    resp.evicted_bytes = st->stats.evicted_bytes;
    resp.put_timeouts = st->stats.put_timeouts;
    resp.moved_objects = st->stats.moved;
    resp.reading_objects = st->leases.live;
    resp.reading_bytes = st->leases.bytes;
    resp.leases_released = st->leases.released;
    resp.leases_expired = st->leases.expired;
    resp.n_segments = k;
    resp.segments = sp;
    size_t plen = kvpool__stat_response__get_packed_size(&resp);
    uint8_t *b = malloc(plen ? plen : 1);
    if (b == NULL)
        goto out;
    kvpool__stat_response__pack(&resp, b);
    *resp_p = b;
    *resp_len_p = plen;
    rc = KVP_OK;
out:
    free(ss);
    free(sp);
    free(ds);
    return rc;
}

kvp_status_t kvp_service_handle(kvp_master_state_t *st, uint64_t conn_id, uint16_t method,
                                const uint8_t *body, size_t body_len, uint8_t **resp_p,
                                size_t *resp_len_p, char *errmsg, size_t errmsg_len)
{
    kvp_status_t status;
    *resp_p = NULL;
    *resp_len_p = 0;
    switch (method) {
    case KVP_RPC_PING:
        status = KVP_OK;
        break;
    case KVP_RPC_MOUNT:
        status = do_mount(st, conn_id, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_UNMOUNT:
        status = do_unmount(st, conn_id, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_PUT_START:
        status = do_put_start(st, conn_id, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_PUT_END:
    case KVP_RPC_PUT_REVOKE:
    case KVP_RPC_REMOVE:
    case KVP_RPC_EXIST:
        status = do_keys(st, conn_id, method, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_GET_REPLICA_LIST:
        status = do_get_replicas(st, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_GET_SIZE:
        status = do_get_size(st, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_STAT:
        status = do_stat(st, resp_p, resp_len_p);
        break;
    case KVP_RPC_HEARTBEAT:
        status = kvp_svc_heartbeat(st, conn_id, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_LIST:
        status = kvp_svc_list(st, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_REMOVE_BY_REGEX:
        status = kvp_svc_remove_by_regex(st, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_DRAIN:
        status = kvp_svc_drain(st, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_MOVE_START:
        status = kvp_svc_move_start(st, conn_id, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_MOVE_END:
        status = kvp_svc_move_end(st, conn_id, body, body_len, resp_p, resp_len_p);
        break;
    case KVP_RPC_LEASE_RELEASE:
        status = do_lease_release(st, body, body_len);
        break;
    default:
        snprintf(errmsg, errmsg_len, "unknown method %u", method);
        return KVP_ERR_UNKNOWN_METHOD;
    }
    if (status == KVP_ERR_PROTOCOL)
        snprintf(errmsg, errmsg_len, "cannot decode the body of method %u (%zu bytes)", method,
                 body_len);
    else if (status != KVP_OK)
        snprintf(errmsg, errmsg_len, "%s", kvp_strerror(status));
    return status;
}

void kvp_service_conn_closed(kvp_master_state_t *st, uint64_t conn_id)
{
    kvp_svc_moves_conn_closed(st, conn_id);
    /* Revoke the connection's unfinished puts. */
    kvp_object_t *obj = st->index.pending_list.head;
    unsigned revoked = 0;
    while (obj != NULL) {
        kvp_object_t *next = obj->lnext;
        if (obj->writer_conn_id == conn_id) {
            kvp_index_unlink(&st->index, obj);
            kvp_object_release(st, obj);
            revoked++;
        }
        obj = next;
    }
    if (revoked)
        KVP_LOG_INFO("connection %llu closed: revoked %u unfinished puts",
                     (unsigned long long)conn_id, revoked);
    for (uint32_t i = 0; i < st->segments.n_slots; i++) {
        kvp_segment_t *seg = st->segments.slots[i];
        if (seg != NULL && seg->owner_conn_id == conn_id)
            unmount_segment(st, seg);
    }
}
