/*
 * test_admin.c - unit tests for the master's newer object and admin paths:
 * upsert (PutConfig.upsert), PutEnd's per-replica written_mask, Heartbeat,
 * Drain, MoveStart/MoveEnd (master/service_admin.c), List, RemoveByRegex,
 * Exist with --lease-on-exist, and the graveyard (master/eviction.c:
 * kvp_object_retire, kvp_graveyard_reap).
 *
 * Drives kvp_dispatch_handle the way the server does: a packed protobuf-c
 * request in, a packed response out, from connections 1, 2 and 3. Answers are
 * unpacked and checked as a client would check them (statuses, sizes,
 * segment ids and offsets); kvp_master_used and per-segment used bytes are the
 * independent view of which extents are held. The master clock st->now_ms is
 * set by the tests, so leases are exercised at their exact boundaries.
 *
 * Store semantics (no eviction) so that placement never frees anything behind
 * a test's back; leases are the default 5000 ms. Each test gets a fresh master
 * state from the fixture, whose teardown (kvp_master_state_cleanup) must free
 * everything: the ASan build turns any leak into a failure.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "master/dispatch.h"
#include "master/meta/placement.h"
#include "master/policy/eviction.h"
#include "master/policy/lease.h"
#include "master/core/state.h"
#include "tests/unit/master/svc_call.h"

#define C1 1
#define C2 2
#define C3 3

#define MIB (1u << 20)
#define SZ 1000u  /* object size in most tests ... */
#define EXT 1024u /* ... and the extent it takes (rounded up to 64) */

static int setup(void **state)
{
    kvp_master_state_t *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return -1;
    if (kvp_master_state_init(st) != KVP_OK) {
        free(st);
        return -1;
    }
    st->rng = 0x5EED5EED5EED5EEDull; /* reproducible placement */
    st->now_ms = 0;
    st->config.evict = false;
    st->config.lease_ttl_ms = 5000;
    st->config.put_timeout_ms = 30000;
    st->config.lease_on_exist = false;
    *state = st;
    return 0;
}

static int teardown(void **state)
{
    kvp_master_state_t *st = *state;
    kvp_master_state_cleanup(st);
    free(st);
    return 0;
}

/* ---- request/response plumbing (svc_call.h) ---- */

static Kvpool__MountResponse *mount_raw(kvp_master_state_t *st, uint64_t conn, const char *name,
                                        const char *host, uint64_t size)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    char ep[64];
    snprintf(ep, sizeof(ep), "10.0.0.%d:7000", (int)conn);
    d.name = (char *)name;
    d.medium = (char *)"dram";
    d.size = size;
    d.host_id = (char *)host;
    d.tcp_endpoint = ep;
    d.shm_path = (char *)"/dev/shm/kvp-seg";
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 1000 + conn;
    req.segment = &d;
    return svc_call(st, conn, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
}

static uint64_t mount_seg(kvp_master_state_t *st, uint64_t conn, const char *name, const char *host,
                          uint64_t size)
{
    Kvpool__MountResponse *r = mount_raw(st, conn, name, host, size);
    assert_int_equal(r->status, KVP_OK);
    uint64_t id = r->segment_id;
    assert_true(id != 0);
    svc_msg_free(r);
    return id;
}

/* Keys travel as protobuf bytes: build the array from C strings (reused buffer). */

/* What a client learns about one key: status, size, CRC, replicas. */
typedef struct rep {
    uint64_t seg, off, len;
} rep_t;
typedef struct view {
    int32_t status;
    uint64_t size;
    uint32_t crc;
    size_t n;
    rep_t r[KVP_MAX_REPLICAS];
} view_t;

static void copy_reps(view_t *v, Kvpool__Replica **reps, size_t n)
{
    assert_true(n <= KVP_MAX_REPLICAS);
    v->n = n;
    for (size_t i = 0; i < n; i++)
        v->r[i] = (rep_t){reps[i]->segment_id, reps[i]->offset, reps[i]->length};
}

/* One-key PutStart with a config; the per-key status and replicas. */
static view_t put_cfg(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
                      unsigned replicas, const char *preferred, bool upsert)
{
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.sizes = &size;
    req.n_sizes = 1;
    cfg.replica_num = replicas;
    if (preferred != NULL)
        cfg.preferred_segment = (char *)preferred;
    cfg.upsert = upsert;
    req.config = &cfg;
    Kvpool__PutStartResponse *r =
        svc_call(st, conn, KVP_RPC_PUT_START, &req.base, &kvpool__put_start_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 1);
    view_t v = {.status = r->results[0]->status, .size = size};
    copy_reps(&v, r->results[0]->replicas, r->results[0]->n_replicas);
    for (size_t i = 0; i < v.n; i++) {
        assert_int_equal(v.r[i].len, size);
        bool described = false; /* every replica's segment comes with the answer */
        for (size_t s = 0; s < r->n_segments; s++)
            described |= r->segments[s]->id == v.r[i].seg;
        assert_true(described);
    }
    svc_msg_free(r);
    return v;
}

static view_t put1(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size)
{
    return put_cfg(st, conn, key, size, 1, NULL, false);
}

static view_t upsert1(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size)
{
    return put_cfg(st, conn, key, size, 1, NULL, true);
}

static Kvpool__StatusesResponse *put_end(kvp_master_state_t *st, uint64_t conn,
                                         const char *const *keys, size_t n_keys,
                                         const uint32_t *crcs, const uint32_t *masks,
                                         size_t n_masks)
{
    Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
    req.keys = svc_keys(keys, n_keys);
    req.n_keys = n_keys;
    req.crc32c = (uint32_t *)crcs;
    req.n_crc32c = n_keys;
    req.written_mask = (uint32_t *)masks;
    req.n_written_mask = n_masks;
    return svc_call(st, conn, KVP_RPC_PUT_END, &req.base, &kvpool__statuses_response__descriptor);
}

static int32_t end_mask1(kvp_master_state_t *st, uint64_t conn, const char *key, uint32_t crc,
                         const uint32_t *mask)
{
    Kvpool__StatusesResponse *r = put_end(st, conn, &key, 1, &crc, mask, mask ? 1 : 0);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

static int32_t end1(kvp_master_state_t *st, uint64_t conn, const char *key, uint32_t crc)
{
    return end_mask1(st, conn, key, crc, NULL);
}

/* PutStart + PutEnd, both must succeed; the replicas. */
static view_t put_done(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
                       unsigned replicas, const char *preferred, uint32_t crc)
{
    view_t v = put_cfg(st, conn, key, size, replicas, preferred, false);
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(end1(st, conn, key, crc), KVP_OK);
    return v;
}

static int32_t keys1(kvp_master_state_t *st, uint64_t conn, uint16_t method, const char *key,
                     bool force)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.force = force;
    Kvpool__StatusesResponse *r =
        svc_call(st, conn, method, &req.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

static int32_t exist1(kvp_master_state_t *st, const char *key)
{
    return keys1(st, C3, KVP_RPC_EXIST, key, false);
}

/* GetReplicaList for one key (grants a read lease when found). */
static view_t grl1(kvp_master_state_t *st, const char *key)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    Kvpool__GetReplicaListResponse *r = svc_call(st, C3, KVP_RPC_GET_REPLICA_LIST, &req.base,
                                                 &kvpool__get_replica_list_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 1);
    Kvpool__GetReplicaResult *g = r->results[0];
    view_t v = {.status = g->status, .size = g->size, .crc = g->crc32c};
    copy_reps(&v, g->replicas, g->n_replicas);
    if (v.status != KVP_OK)
        assert_int_equal(v.n, 0);
    svc_msg_free(r);
    return v;
}

typedef struct stat_snap {
    uint64_t used, objects, pending, moved;
} stat_snap_t;

static stat_snap_t stat_get(kvp_master_state_t *st)
{
    Kvpool__StatRequest req = KVPOOL__STAT_REQUEST__INIT;
    Kvpool__StatResponse *r =
        svc_call(st, C3, KVP_RPC_STAT, &req.base, &kvpool__stat_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    stat_snap_t s = {r->used, r->objects, r->pending, r->moved_objects};
    svc_msg_free(r);
    return s;
}

static uint64_t seg_used(kvp_master_state_t *st, uint64_t id)
{
    kvp_segment_t *seg = kvp_segment_table_get(&st->segments, id);
    assert_non_null(seg);
    return kvp_segment_used(seg);
}

static int32_t heartbeat(kvp_master_state_t *st, uint64_t conn, const uint64_t *ids, size_t n,
                         bool *remount_p, uint64_t *drain, size_t *n_drain_p)
{
    Kvpool__HeartbeatRequest req = KVPOOL__HEARTBEAT_REQUEST__INIT;
    req.client_id = 1000 + conn;
    req.segment_ids = (uint64_t *)ids;
    req.n_segment_ids = n;
    Kvpool__HeartbeatResponse *r =
        svc_call(st, conn, KVP_RPC_HEARTBEAT, &req.base, &kvpool__heartbeat_response__descriptor);
    int32_t s = r->status;
    *remount_p = r->remount;
    assert_true(r->n_drain_segment_ids <= 16);
    *n_drain_p = r->n_drain_segment_ids;
    for (size_t i = 0; i < r->n_drain_segment_ids; i++)
        drain[i] = r->drain_segment_ids[i];
    svc_msg_free(r);
    return s;
}

/* A heartbeat that says which segment table version the client knows: how many
 * descriptors came back (ids into out[], names checked non-empty) and the version. */
static size_t heartbeat_table(kvp_master_state_t *st, uint64_t conn, uint64_t known,
                              uint64_t *version_p, uint64_t *out, size_t cap)
{
    Kvpool__HeartbeatRequest req = KVPOOL__HEARTBEAT_REQUEST__INIT;
    req.client_id = 1000 + conn;
    req.segments_version = known;
    Kvpool__HeartbeatResponse *r =
        svc_call(st, conn, KVP_RPC_HEARTBEAT, &req.base, &kvpool__heartbeat_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    *version_p = r->segments_version;
    size_t n = r->n_segments;
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++) {
        out[i] = r->segments[i]->id;
        assert_true(r->segments[i]->tcp_endpoint[0] != '\0');
    }
    svc_msg_free(r);
    return n;
}

/* Drain by name (or by id when name is NULL); msg (256 bytes, optional) gets the message. */
static int32_t drain(kvp_master_state_t *st, uint64_t conn, const char *name, uint64_t id,
                     uint64_t *id_p, char *msg)
{
    Kvpool__DrainRequest req = KVPOOL__DRAIN_REQUEST__INIT;
    if (name != NULL)
        req.segment_name = (char *)name;
    req.segment_id = id;
    Kvpool__DrainResponse *r =
        svc_call(st, conn, KVP_RPC_DRAIN, &req.base, &kvpool__drain_response__descriptor);
    int32_t s = r->status;
    if (id_p)
        *id_p = r->segment_id;
    if (msg)
        snprintf(msg, 256, "%s", r->message);
    svc_msg_free(r);
    return s;
}

static Kvpool__MoveStartResponse *move_start(kvp_master_state_t *st, uint64_t conn, uint64_t from,
                                             const char *const *keys, size_t n)
{
    Kvpool__MoveStartRequest req = KVPOOL__MOVE_START_REQUEST__INIT;
    req.from_segment_id = from;
    req.keys = svc_keys(keys, n);
    req.n_keys = n;
    return svc_call(st, conn, KVP_RPC_MOVE_START, &req.base,
                    &kvpool__move_start_response__descriptor);
}

/* Whole-request status of a one-key MoveStart. */
static int32_t move_start_status(kvp_master_state_t *st, uint64_t conn, uint64_t from,
                                 const char *key)
{
    Kvpool__MoveStartResponse *r = move_start(st, conn, from, &key, 1);
    int32_t s = r->status;
    if (s != KVP_OK)
        assert_int_equal(r->n_results, 0);
    svc_msg_free(r);
    return s;
}

static Kvpool__StatusesResponse *move_end(kvp_master_state_t *st, uint64_t conn, uint64_t from,
                                          const char *const *keys, size_t n_keys,
                                          const int32_t *statuses, size_t n_statuses)
{
    Kvpool__MoveEndRequest req = KVPOOL__MOVE_END_REQUEST__INIT;
    req.from_segment_id = from;
    req.keys = svc_keys(keys, n_keys);
    req.n_keys = n_keys;
    req.statuses = (int32_t *)statuses;
    req.n_statuses = n_statuses;
    return svc_call(st, conn, KVP_RPC_MOVE_END, &req.base, &kvpool__statuses_response__descriptor);
}

static int32_t move_end1(kvp_master_state_t *st, uint64_t conn, uint64_t from, const char *key,
                         int32_t copy_status)
{
    Kvpool__StatusesResponse *r = move_end(st, conn, from, &key, 1, &copy_status, 1);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

static Kvpool__ListResponse *list(kvp_master_state_t *st, const char *pattern, uint64_t seg,
                                  uint64_t cursor, uint32_t limit)
{
    Kvpool__ListRequest req = KVPOOL__LIST_REQUEST__INIT;
    req.pattern = (char *)pattern;
    req.segment_id = seg;
    req.cursor = cursor;
    req.limit = limit;
    return svc_call(st, C3, KVP_RPC_LIST, &req.base, &kvpool__list_response__descriptor);
}

static Kvpool__RemoveByRegexResponse *rbr(kvp_master_state_t *st, const char *pattern, bool force,
                                          bool all)
{
    Kvpool__RemoveByRegexRequest req = KVPOOL__REMOVE_BY_REGEX_REQUEST__INIT;
    req.pattern = (char *)pattern;
    req.force = force;
    req.all = all;
    return svc_call(st, C3, KVP_RPC_REMOVE_BY_REGEX, &req.base,
                    &kvpool__remove_by_regex_response__descriptor);
}

/* Objects removed while being read, kept by their lease until the read ends. */
static unsigned graveyard_len(const kvp_master_state_t *st)
{
    unsigned n = 0;
    for (uint32_t i = 0; i < st->leases.n_slots; i++)
        n += st->leases.slots[i].obj != NULL && st->leases.slots[i].obj->state == KVP_OBJ_RETIRED;
    return n;
}

/* ---- 1-4. upsert ---- */

/* Same size, nobody reading: the object is rewritten in place, invisible until PutEnd. */
static void test_upsert_same_size_in_place(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    view_t old = put_done(st, C1, "k", SZ, 1, NULL, 111);
    put_done(st, C1, "other", 64, 1, NULL, 5);
    assert_int_equal(kvp_master_used(st), EXT + 64);

    view_t up = upsert1(st, C2, "k", SZ);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(up.n, 1);
    assert_int_equal(up.r[0].seg, old.r[0].seg);
    assert_int_equal(up.r[0].off, old.r[0].off);
    assert_int_equal(kvp_master_used(st), EXT + 64);

    /* PENDING while being rewritten: no reader sees the half-written bytes */
    assert_int_equal(grl1(st, "k").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(exist1(st, "k"), 0);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, 1);
    assert_int_equal(s.pending, 1);
    /* only the upserting connection may end it */
    assert_int_equal(end1(st, C1, "k", 222), KVP_ERR_NOT_OWNER);

    assert_int_equal(end1(st, C2, "k", 222), KVP_OK);
    view_t v = grl1(st, "k");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.crc, 222);
    assert_int_equal(v.size, SZ);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, old.r[0].seg);
    assert_int_equal(v.r[0].off, old.r[0].off);
    assert_int_equal(exist1(st, "k"), 1);
    assert_int_equal(kvp_master_used(st), EXT + 64);
    s = stat_get(st);
    assert_int_equal(s.objects, 2);
    assert_int_equal(s.pending, 0);

    /* upsert of an absent key is a plain put */
    view_t fresh = upsert1(st, C1, "new", 64);
    assert_int_equal(fresh.status, KVP_OK);
    assert_int_equal(end1(st, C1, "new", 1), KVP_OK);
    assert_int_equal(kvp_master_used(st), EXT + 64 + 64);
}

/* Another size: new extents, the old ones freed at once (unleased). */
static void test_upsert_other_size(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    put_done(st, C1, "k", SZ, 1, NULL, 1);
    put_done(st, C1, "other", 64, 1, NULL, 2);
    assert_int_equal(kvp_master_used(st), EXT + 64);

    view_t up = upsert1(st, C1, "k", 5000);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(up.n, 1);
    assert_int_equal(up.r[0].len, 5000);
    assert_int_equal(kvp_master_used(st), 5056 + 64); /* 5000 rounded to 64; 1000 freed */
    assert_int_equal(grl1(st, "k").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(end1(st, C1, "k", 3), KVP_OK);
    view_t v = grl1(st, "k");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.size, 5000);
    assert_int_equal(v.crc, 3);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].off, up.r[0].off);
    assert_int_equal(v.r[0].len, 5000);

    /* and smaller again (the lease from the read above has to end first) */
    st->now_ms = 5000;
    up = upsert1(st, C1, "k", 100);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(kvp_master_used(st), 128 + 64);
    assert_int_equal(end1(st, C1, "k", 4), KVP_OK);
    v = grl1(st, "k");
    assert_int_equal(v.size, 100);
    assert_int_equal(graveyard_len(st), 0);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, 2);
    assert_int_equal(s.used, 128 + 64);
}

/* A reader holds a lease: the old extent is kept until it ends, the new one is elsewhere. */
static void test_upsert_leased(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    view_t old = put_done(st, C1, "k", SZ, 1, NULL, 1);
    st->now_ms = 1000;
    assert_int_equal(grl1(st, "k").status, KVP_OK); /* leased until 6000 */

    view_t up = upsert1(st, C2, "k", SZ);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(up.n, 1);
    assert_int_equal(up.r[0].seg, old.r[0].seg);
    assert_true(up.r[0].off != old.r[0].off);
    assert_int_equal(kvp_master_used(st), 2 * EXT);
    assert_int_equal(graveyard_len(st), 1);
    assert_int_equal(grl1(st, "k").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(end1(st, C2, "k", 2), KVP_OK);
    view_t v = grl1(st, "k");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.crc, 2);
    assert_int_equal(v.r[0].off, up.r[0].off);

    st->now_ms = 5999;
    assert_int_equal(kvp_lease_expire(st), 0);
    assert_int_equal(kvp_master_used(st), 2 * EXT);
    st->now_ms = 6000;
    /* two leases end: the retired object's and the new object's (read at 1000 too) */
    assert_int_equal(kvp_lease_expire(st), 2);
    assert_int_equal(kvp_master_used(st), EXT);
    assert_int_equal(graveyard_len(st), 0);
    v = grl1(st, "k");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.r[0].off, up.r[0].off);
}

static void test_upsert_refusals(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    put_done(st, C1, "k", SZ, 1, NULL, 1);
    assert_int_equal(put1(st, C1, "k", SZ).status, KVP_ERR_EXISTS);
    assert_int_equal(put1(st, C2, "k", 2 * SZ).status, KVP_ERR_EXISTS);

    assert_int_equal(put1(st, C1, "p", SZ).status, KVP_OK); /* stays PENDING */
    assert_int_equal(upsert1(st, C1, "p", SZ).status, KVP_ERR_PENDING);
    assert_int_equal(upsert1(st, C2, "p", 2 * SZ).status, KVP_ERR_PENDING);
    assert_int_equal(put1(st, C2, "p", SZ).status, KVP_ERR_PENDING);

    /* an upsert in progress is PENDING too */
    assert_int_equal(upsert1(st, C1, "k", SZ).status, KVP_OK);
    assert_int_equal(upsert1(st, C2, "k", SZ).status, KVP_ERR_PENDING);
    assert_int_equal(upsert1(st, C2, "k", 2 * SZ).status, KVP_ERR_PENDING);
    assert_int_equal(kvp_master_used(st), 2 * EXT);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.pending, 2);
    assert_int_equal(s.objects, 0);
}

/* ---- 5. PutEnd written_mask ---- */

static void test_put_end_written_mask(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t ids[3] = {mount_seg(st, C1, "s1", "h1", MIB), mount_seg(st, C1, "s2", "h2", MIB),
                       mount_seg(st, C1, "s3", "h3", MIB)};

    view_t m = put_cfg(st, C2, "m", SZ, 3, NULL, false);
    assert_int_equal(m.status, KVP_OK);
    assert_int_equal(m.n, 3);
    assert_int_equal(kvp_master_used(st), 3 * EXT);
    uint32_t mask = 0x5; /* replicas 0 and 2 written */
    assert_int_equal(end_mask1(st, C2, "m", 7, &mask), KVP_OK);
    view_t v = grl1(st, "m");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.crc, 7);
    assert_int_equal(v.n, 2);
    assert_int_equal(v.r[0].seg, m.r[0].seg);
    assert_int_equal(v.r[0].off, m.r[0].off);
    assert_int_equal(v.r[1].seg, m.r[2].seg);
    assert_int_equal(v.r[1].off, m.r[2].off);
    assert_int_equal(kvp_master_used(st), 2 * EXT);
    assert_int_equal(seg_used(st, m.r[1].seg), 0);
    assert_int_equal(kvp_segment_table_get(&st->segments, m.r[1].seg)->objects, 0);

    /* nothing written: the put is revoked, all its extents freed */
    view_t z = put_cfg(st, C2, "z", SZ, 3, NULL, false);
    assert_int_equal(z.n, 3);
    assert_int_equal(kvp_master_used(st), 5 * EXT);
    mask = 0;
    assert_int_equal(end_mask1(st, C2, "z", 8, &mask), KVP_ERR_IO);
    assert_int_equal(exist1(st, "z"), 0);
    assert_int_equal(grl1(st, "z").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_master_used(st), 2 * EXT);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, 1);
    assert_int_equal(s.pending, 0);
    assert_int_equal(end1(st, C2, "z", 8), KVP_ERR_NOT_FOUND);
    /* the key is free again */
    assert_int_equal(put1(st, C2, "z", SZ).status, KVP_OK);
    assert_int_equal(end1(st, C2, "z", 8), KVP_OK);
    assert_int_equal(kvp_master_used(st), 3 * EXT);

    /* masks must be absent or one per key: otherwise the whole request is refused */
    assert_int_equal(put1(st, C2, "a", SZ).status, KVP_OK);
    assert_int_equal(put1(st, C2, "b", SZ).status, KVP_OK);
    const char *ab[2] = {"a", "b"};
    uint32_t crcs[2] = {1, 2};
    uint32_t masks[3] = {1, 1, 1};
    Kvpool__StatusesResponse *r = put_end(st, C2, ab, 2, crcs, masks, 1);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_int_equal(r->n_statuses, 0);
    svc_msg_free(r);
    r = put_end(st, C2, ab, 2, crcs, masks, 3);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_int_equal(r->n_statuses, 0);
    svc_msg_free(r);
    s = stat_get(st);
    assert_int_equal(s.pending, 2); /* nothing was ended */
    r = put_end(st, C2, ab, 2, crcs, masks, 2);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 2);
    assert_int_equal(r->statuses[0], KVP_OK);
    assert_int_equal(r->statuses[1], KVP_OK);
    svc_msg_free(r);
    assert_int_equal(grl1(st, "a").crc, 1);
    assert_int_equal(grl1(st, "b").crc, 2);
    assert_int_equal(kvp_master_used(st), 5 * EXT);
    (void)ids;
}

/* ---- 6-7. heartbeat and drain ---- */

/* The heartbeat hands the whole segment table to a client whose version is not the
 * current one (so it attaches peers before its first transfer), and nothing otherwise. */
static void test_heartbeat_segment_table(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id1 = mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t ids[8], v0 = 0, v1 = 0, v2 = 0;
    size_t n = heartbeat_table(st, C3, 0, &v0, ids, 8); /* a new client knows nothing */
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], id1);
    assert_true(v0 != 0);
    assert_int_equal(heartbeat_table(st, C3, v0, &v1, ids, 8), 0); /* up to date */
    assert_int_equal(v1, 0);
    uint64_t id2 = mount_seg(st, C2, "s2", "h2", MIB);
    n = heartbeat_table(st, C3, v0, &v1, ids, 8); /* a mount changes the version */
    assert_int_equal(n, 2);
    assert_true(v1 != v0);
    assert_true((ids[0] == id1 && ids[1] == id2) || (ids[0] == id2 && ids[1] == id1));
    kvp_dispatch_conn_closed(st, C2); /* its owner's connection closes: unmounted */
    n = heartbeat_table(st, C3, v1, &v2, ids, 8);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], id1);
    assert_true(v2 != v1 && v2 != 0);
}

static void test_heartbeat_and_drain(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id1 = mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t id2 = mount_seg(st, C2, "s2", "h2", MIB);
    uint64_t drained[16];
    size_t nd = 99;
    bool remount = true;

    assert_int_equal(heartbeat(st, C1, &id1, 1, &remount, drained, &nd), KVP_OK);
    assert_false(remount);
    assert_int_equal(nd, 0);
    assert_int_equal(heartbeat(st, C1, NULL, 0, &remount, drained, &nd), KVP_OK);
    assert_false(remount);
    uint64_t unknown[2] = {id1, id1 + 5};
    assert_int_equal(heartbeat(st, C1, unknown, 2, &remount, drained, &nd), KVP_OK);
    assert_true(remount);
    assert_int_equal(heartbeat(st, C1, &id2, 1, &remount, drained, &nd), KVP_OK);
    assert_true(remount); /* mounted, but by someone else */

    uint64_t got = 0;
    char msg[256];
    assert_int_equal(drain(st, C3, "s1", 0, &got, msg), KVP_OK);
    assert_int_equal(got, id1);
    assert_int_equal(heartbeat(st, C1, &id1, 1, &remount, drained, &nd), KVP_OK);
    assert_false(remount);
    assert_int_equal(nd, 1);
    assert_int_equal(drained[0], id1);
    /* the other owner is not asked to drain */
    assert_int_equal(heartbeat(st, C2, &id2, 1, &remount, drained, &nd), KVP_OK);
    assert_false(remount);
    assert_int_equal(nd, 0);
    /* ... nor does a non-owner listing the drained segment get it */
    assert_int_equal(heartbeat(st, C2, &id1, 1, &remount, drained, &nd), KVP_OK);
    assert_true(remount);
    assert_int_equal(nd, 0);

    /* draining is visible in STAT's segment descriptors */
    Kvpool__StatRequest sreq = KVPOOL__STAT_REQUEST__INIT;
    Kvpool__StatResponse *sr =
        svc_call(st, C3, KVP_RPC_STAT, &sreq.base, &kvpool__stat_response__descriptor);
    assert_int_equal(sr->n_segments, 2);
    for (size_t i = 0; i < sr->n_segments; i++)
        assert_int_equal(sr->segments[i]->desc->draining, sr->segments[i]->desc->id == id1);
    svc_msg_free(sr);

    /* unknown name: refused with a message saying which */
    msg[0] = '\0';
    assert_int_equal(drain(st, C3, "nope", 0, NULL, msg), KVP_ERR_SEGMENT_GONE);
    assert_non_null(strstr(msg, "nope"));
    /* by id when no name is given */
    assert_int_equal(drain(st, C3, NULL, id2 + 7, NULL, msg), KVP_ERR_SEGMENT_GONE);
    assert_true(msg[0] != '\0');
    assert_int_equal(drain(st, C3, NULL, id2, &got, NULL), KVP_OK);
    assert_int_equal(got, id2);
    assert_int_equal(heartbeat(st, C2, &id2, 1, &remount, drained, &nd), KVP_OK);
    assert_int_equal(nd, 1);
    assert_int_equal(drained[0], id2);
    /* draining twice is harmless */
    assert_int_equal(drain(st, C3, "s1", 0, NULL, NULL), KVP_OK);

    /* too many ids in one heartbeat */
    uint64_t *many = calloc(1025, sizeof(*many));
    assert_non_null(many);
    int32_t s = heartbeat(st, C1, many, 1025, &remount, drained, &nd);
    free(many);
    assert_int_equal(s, KVP_ERR_TOO_MANY);
}

static void test_draining_gets_no_placements(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id1 = mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t id2 = mount_seg(st, C2, "s2", "h2", MIB);
    assert_int_equal(drain(st, C3, "s1", 0, NULL, NULL), KVP_OK);
    for (int i = 0; i < 20; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k%d", i);
        view_t v = put1(st, C3, key, SZ);
        assert_int_equal(v.status, KVP_OK);
        assert_int_equal(v.n, 1);
        assert_int_equal(v.r[0].seg, id2);
    }
    view_t v = put_cfg(st, C1, "pref", SZ, 1, "s1", false);
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, id2);
    /* two replicas wanted, one non-draining segment: one replica */
    v = put_cfg(st, C1, "two", SZ, 2, NULL, false);
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, id2);
    assert_int_equal(seg_used(st, id1), 0);
    assert_int_equal(seg_used(st, id2), 22 * EXT);
}

/* ---- 8. moves off a draining segment ---- */

static void test_move(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t a = mount_seg(st, C1, "A", "h1", MIB);
    uint64_t b = mount_seg(st, C2, "B", "h2", MIB);
    const char *singles[6] = {"k1", "k2", "k3", "k4", "k5", "k6"};
    view_t orig[6];
    for (int i = 0; i < 6; i++) {
        orig[i] = put_done(st, C3, singles[i], SZ, 1, "A", 100 + i);
        assert_int_equal(orig[i].r[0].seg, a);
    }
    view_t dual = put_done(st, C3, "dual", SZ, 2, "A", 50);
    assert_int_equal(dual.n, 2);
    assert_int_equal(dual.r[0].seg, a);
    assert_int_equal(dual.r[1].seg, b);
    view_t onb = put_done(st, C3, "onb", SZ, 1, "B", 60);
    assert_int_equal(onb.r[0].seg, b);
    assert_int_equal(seg_used(st, a), 7 * EXT);
    assert_int_equal(seg_used(st, b), 2 * EXT);

    /* not draining yet: refused; not the owner: refused first; unknown segment */
    assert_int_equal(move_start_status(st, C1, a, "k1"), KVP_ERR_INVALID_ARG);
    assert_int_equal(move_start_status(st, C2, a, "k1"), KVP_ERR_NOT_OWNER);
    assert_int_equal(move_start_status(st, C1, a + 9, "k1"), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(kvp_master_used(st), 9 * EXT);

    assert_int_equal(drain(st, C3, "A", 0, NULL, NULL), KVP_OK);
    assert_int_equal(move_start_status(st, C2, a, "k1"), KVP_ERR_NOT_OWNER);
    assert_null(st->moves);

    const char *keys[9] = {"k1", "k2", "dual", "nokey", "k3", "k4", "k5", "k6", "onb"};
    Kvpool__MoveStartResponse *r = move_start(st, C1, a, keys, 9);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 9);
    view_t dest[9];
    for (int i = 0; i < 9; i++) {
        dest[i] = (view_t){.status = r->results[i]->status};
        copy_reps(&dest[i], r->results[i]->replicas, r->results[i]->n_replicas);
    }
    bool b_described = false;
    for (size_t s = 0; s < r->n_segments; s++)
        b_described |= r->segments[s]->id == b;
    assert_true(b_described);
    svc_msg_free(r);
    for (int i = 0; i < 9; i++) {
        if (i == 2) { /* dual: its replica on B keeps it */
            assert_int_equal(dest[i].status, KVP_OK);
            assert_int_equal(dest[i].n, 0);
        } else if (i == 3 || i == 8) { /* no such key; not on A */
            assert_int_equal(dest[i].status, KVP_ERR_NOT_FOUND);
            assert_int_equal(dest[i].n, 0);
        } else {
            assert_int_equal(dest[i].status, KVP_OK);
            assert_int_equal(dest[i].n, 1);
            assert_int_equal(dest[i].r[0].seg, b);
            assert_int_equal(dest[i].r[0].len, SZ);
        }
    }
    assert_int_equal(seg_used(st, a), 7 * EXT);
    assert_int_equal(seg_used(st, b), 8 * EXT);

    /* k1 copied: swapped in, A's extent freed */
    assert_int_equal(move_end1(st, C1, a, "k1", KVP_OK), KVP_OK);
    view_t v = grl1(st, "k1");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.crc, 100);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, b);
    assert_int_equal(v.r[0].off, dest[0].r[0].off);
    assert_int_equal(stat_get(st).moved, 1);
    assert_int_equal(seg_used(st, a), 6 * EXT);
    assert_int_equal(seg_used(st, b), 8 * EXT);

    /* k2's copy failed: unchanged, the destination freed */
    assert_int_equal(move_end1(st, C1, a, "k2", KVP_ERR_IO), KVP_OK);
    v = grl1(st, "k2");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, a);
    assert_int_equal(v.r[0].off, orig[1].r[0].off);
    assert_int_equal(seg_used(st, b), 7 * EXT);

    /* k3 replaced by an upsert of another size (lands on B: A is draining) */
    view_t up = upsert1(st, C3, "k3", 2000);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(up.r[0].seg, b);
    assert_int_equal(end1(st, C3, "k3", 333), KVP_OK);
    assert_int_equal(seg_used(st, a), 5 * EXT);
    assert_int_equal(seg_used(st, b), 7 * EXT + 2048);
    assert_int_equal(move_end1(st, C1, a, "k3", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_int_equal(seg_used(st, b), 6 * EXT + 2048);
    v = grl1(st, "k3");
    assert_int_equal(v.size, 2000);
    assert_int_equal(v.r[0].off, up.r[0].off);

    /* k4 removed meanwhile */
    assert_int_equal(keys1(st, C3, KVP_RPC_REMOVE, "k4", false), KVP_OK);
    assert_int_equal(seg_used(st, a), 4 * EXT);
    assert_int_equal(move_end1(st, C1, a, "k4", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_int_equal(seg_used(st, b), 5 * EXT + 2048);
    assert_int_equal(exist1(st, "k4"), 0);

    /* k6 upserted with the same size: not in place, since A is draining, but into a
     * new extent on B (A's freed); the copy in flight is stale */
    up = upsert1(st, C3, "k6", SZ);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(up.r[0].seg, b);
    assert_int_equal(end1(st, C3, "k6", 666), KVP_OK);
    assert_int_equal(seg_used(st, a), 3 * EXT);
    assert_int_equal(seg_used(st, b), 6 * EXT + 2048);
    assert_int_equal(move_end1(st, C1, a, "k6", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_int_equal(seg_used(st, b), 5 * EXT + 2048);
    v = grl1(st, "k6");
    assert_int_equal(v.crc, 666);
    assert_int_equal(v.r[0].seg, b);

    /* no move for these (any more) */
    assert_int_equal(move_end1(st, C1, a, "dual", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_int_equal(move_end1(st, C1, a, "k1", KVP_OK), KVP_ERR_NOT_FOUND);
    /* k5's move belongs to C1: C2 cannot end it, and it stays */
    assert_int_equal(move_end1(st, C2, a, "k5", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_int_equal(move_end1(st, C1, b, "k5", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_non_null(st->moves);
    /* statuses must match keys */
    const char *k5 = "k5";
    int32_t sts[2] = {0, 0};
    Kvpool__StatusesResponse *er = move_end(st, C1, a, &k5, 1, sts, 2);
    assert_int_equal(er->status, KVP_ERR_INVALID_ARG);
    assert_int_equal(er->n_statuses, 0);
    svc_msg_free(er);
    assert_int_equal(seg_used(st, a), 3 * EXT); /* k2, k5, dual */
    assert_int_equal(seg_used(st, b), 5 * EXT + 2048);
    assert_int_equal(stat_get(st).moved, 1);

    /* the owner goes away mid-move: k5's destination is freed, A unmounted */
    kvp_dispatch_conn_closed(st, C1);
    assert_null(st->moves);
    assert_null(kvp_segment_table_get(&st->segments, a));
    assert_int_equal(kvp_master_used(st), 4 * EXT + 2048); /* dual, onb, k1, k3, k6 */
    assert_int_equal(seg_used(st, b), 4 * EXT + 2048);
    assert_int_equal(exist1(st, "k6"), 1);
    assert_int_equal(exist1(st, "k5"), 0);
    assert_int_equal(exist1(st, "k2"), 0);
    assert_int_equal(exist1(st, "k1"), 1);
    v = grl1(st, "dual");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, b);
    assert_int_equal(v.r[0].off, dual.r[1].off);
    assert_int_equal(stat_get(st).objects, 5); /* dual, onb, k1, k3, k6 */
}

/* ---- 9. list ---- */

#define LIST_N 150

static void test_list(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id1 = mount_seg(st, C1, "s1", "h1", 4 * MIB);
    uint64_t id2 = mount_seg(st, C2, "s2", "h2", 4 * MIB);
    char key[32];
    for (int i = 0; i < LIST_N; i++) {
        snprintf(key, sizeof(key), "a/%d", i);
        put_done(st, C3, key, 100 + i, i % 10 == 0 ? 2 : 1, "s1", (uint32_t)i);
        snprintf(key, sizeof(key), "b/%d", i);
        put_done(st, C3, key, 100 + i, 1, "s2", (uint32_t)i);
    }
    assert_int_equal(put_cfg(st, C3, "a/p", 64, 1, "s1", false).status, KVP_OK); /* PENDING */
    st->now_ms = 1000;
    assert_int_equal(grl1(st, "a/5").status, KVP_OK); /* leased until 6000 */
    st->now_ms = 3000;

    bool seen[LIST_N] = {false};
    unsigned n_seen = 0, pages = 0;
    bool seen_pending = false;
    uint64_t cursor = 0;
    do {
        Kvpool__ListResponse *r = list(st, "^a/", 0, cursor, 50);
        assert_int_equal(r->status, KVP_OK);
        assert_true(r->n_entries <= 50 + 8); /* a page may finish its last bucket */
        for (size_t e = 0; e < r->n_entries; e++) {
            Kvpool__ListEntry *en = r->entries[e];
            char k[32];
            assert_true(en->key.len < sizeof(k));
            memcpy(k, en->key.data, en->key.len);
            k[en->key.len] = '\0';
            assert_memory_equal(k, "a/", 2);
            if (strcmp(k, "a/p") == 0) {
                assert_false(seen_pending);
                seen_pending = true;
                assert_int_equal(en->state, KVP_OBJ_PENDING);
                assert_int_equal(en->size, 64);
                assert_int_equal(en->n_replicas, 1);
                assert_int_equal(en->lease_ms, 0);
                continue;
            }
            int i = atoi(k + 2);
            assert_true(i >= 0 && i < LIST_N);
            assert_false(seen[i]);
            seen[i] = true;
            n_seen++;
            assert_int_equal(en->state, KVP_OBJ_COMPLETE);
            assert_int_equal(en->size, 100 + i);
            assert_int_equal(en->crc32c, i);
            assert_int_equal(en->n_replicas, i % 10 == 0 ? 2 : 1);
            assert_int_equal(en->replicas[0]->segment_id, id1);
            for (size_t q = 0; q < en->n_replicas; q++)
                assert_int_equal(en->replicas[q]->length, 100 + i);
            assert_int_equal(en->lease_ms, i == 5 ? 3000 : 0);
        }
        cursor = r->next_cursor;
        svc_msg_free(r);
        pages++;
        assert_true(pages < 100);
    } while (cursor != 0);
    assert_int_equal(n_seen, LIST_N);
    assert_true(seen_pending);
    assert_true(pages >= 3);

    /* only keys with a replica on s2: every b key and the 2-replica a keys */
    unsigned on2 = 0;
    cursor = 0;
    do {
        Kvpool__ListResponse *r = list(st, "", id2, cursor, 0);
        assert_int_equal(r->status, KVP_OK);
        for (size_t e = 0; e < r->n_entries; e++) {
            Kvpool__ListEntry *en = r->entries[e];
            bool here = false;
            for (size_t q = 0; q < en->n_replicas; q++)
                here |= en->replicas[q]->segment_id == id2;
            assert_true(here);
            on2++;
        }
        cursor = r->next_cursor;
        svc_msg_free(r);
    } while (cursor != 0);
    assert_int_equal(on2, LIST_N + LIST_N / 10);
    /* nothing of b is on s1 */
    Kvpool__ListResponse *r = list(st, "^b/", id1, 0, 1000);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_entries, 0);
    assert_int_equal(r->next_cursor, 0);
    svc_msg_free(r);

    /* refusals */
    r = list(st, "(", 0, 0, 10);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_true(r->message[0] != '\0');
    assert_int_equal(r->n_entries, 0);
    svc_msg_free(r);
    r = list(st, "", 0, st->index.n_buckets + 1, 10);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_int_equal(r->n_entries, 0);
    svc_msg_free(r);
    /* the end of the table is an empty last page */
    r = list(st, "", 0, st->index.n_buckets, 10);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_entries, 0);
    assert_int_equal(r->next_cursor, 0);
    svc_msg_free(r);
}

/*
 * One bucket chain longer than a page's slack (limit + 64): the page grows
 * in place while its entries point into arrays being reallocated. Keys are
 * picked so that they all hash into the same bucket.
 */
#define CHAIN_N 150

static void test_list_long_chain(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id1 = mount_seg(st, C1, "s1", "h1", 4 * MIB);
    uint64_t id2 = mount_seg(st, C2, "s2", "h2", 4 * MIB);
    uint64_t mask = st->index.n_buckets - 1;
    assert_true(CHAIN_N < st->index.n_buckets); /* the table will not grow */
    uint64_t bucket = kvp_index_hash("c/0", 3) & mask;
    int found[CHAIN_N];
    char key[32];
    int n = 0;
    for (int j = 0; n < CHAIN_N; j++) {
        assert_true(j < 10000000);
        snprintf(key, sizeof(key), "c/%d", j);
        if ((kvp_index_hash(key, strlen(key)) & mask) != bucket)
            continue;
        found[n] = j;
        put_done(st, C3, key, 64 + (uint64_t)n, n % 3 == 0 ? 2 : 1, "s1", (uint32_t)j);
        n++;
    }
    /* limit 1: the first bucket with a match is the whole chain, 150 > 1 + 64 */
    Kvpool__ListResponse *r = list(st, "^c/", 0, 0, 1);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_entries, CHAIN_N);
    assert_int_equal(r->next_cursor, bucket + 1);
    bool seen[CHAIN_N] = {false};
    for (size_t e = 0; e < r->n_entries; e++) {
        Kvpool__ListEntry *en = r->entries[e];
        memcpy(key, en->key.data, en->key.len);
        key[en->key.len] = '\0';
        int j = atoi(key + 2), at = -1;
        for (int q = 0; q < CHAIN_N; q++)
            if (found[q] == j)
                at = q;
        assert_true(at >= 0);
        assert_false(seen[at]);
        seen[at] = true;
        assert_int_equal(en->size, 64 + at);
        assert_int_equal(en->crc32c, j);
        assert_int_equal(en->n_replicas, at % 3 == 0 ? 2 : 1);
        assert_int_equal(en->replicas[0]->segment_id, id1);
        assert_int_equal(en->replicas[0]->length, 64 + at);
        if (en->n_replicas == 2) {
            assert_int_equal(en->replicas[1]->segment_id, id2);
            assert_int_equal(en->replicas[1]->length, 64 + at);
        }
    }
    svc_msg_free(r);
}

/* ---- 10. remove by regex ---- */

static void test_remove_by_regex(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    char key[32];
    for (int i = 0; i < 30; i++) {
        snprintf(key, sizeof(key), "a/%d", i);
        put_done(st, C1, key, 64, 1, NULL, 0);
    }
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "b/%d", i);
        put_done(st, C1, key, 64, 1, NULL, 0);
    }
    assert_int_equal(put1(st, C1, "a/1p", 64).status, KVP_OK); /* PENDING, matches */
    assert_int_equal(grl1(st, "a/12").status, KVP_OK);         /* leased until 5000 */
    assert_int_equal(kvp_master_used(st), 41 * 64);

    /* a/1, a/10..a/19 match: 11 complete, one of them leased */
    Kvpool__RemoveByRegexResponse *r = rbr(st, "^a/1", false, false);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->removed, 10);
    assert_int_equal(r->skipped_leased, 1);
    assert_int_equal(r->skipped_pending, 1);
    svc_msg_free(r);
    for (int i = 0; i < 30; i++) {
        snprintf(key, sizeof(key), "a/%d", i);
        bool gone = (i == 1 || (i >= 10 && i < 20)) && i != 12;
        assert_int_equal(exist1(st, key), gone ? 0 : 1);
    }
    assert_int_equal(kvp_master_used(st), 31 * 64);

    /* force: the leased one goes too, its extent kept until the lease ends */
    r = rbr(st, "^a/1", true, false);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->removed, 1);
    assert_int_equal(r->skipped_leased, 0);
    assert_int_equal(r->skipped_pending, 1);
    svc_msg_free(r);
    assert_int_equal(exist1(st, "a/12"), 0);
    assert_int_equal(grl1(st, "a/12").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_master_used(st), 31 * 64);
    st->now_ms = 4999;
    assert_int_equal(kvp_lease_expire(st), 0);
    st->now_ms = 5000;
    assert_int_equal(kvp_lease_expire(st), 1);
    assert_int_equal(kvp_master_used(st), 30 * 64);

    /* refusals */
    r = rbr(st, "", false, false);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_true(r->message[0] != '\0');
    assert_int_equal(r->removed, 0);
    svc_msg_free(r);
    r = rbr(st, "[", false, false);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_true(r->message[0] != '\0');
    assert_int_equal(r->removed, 0);
    svc_msg_free(r);
    r = rbr(st, "^zzz", false, false);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->removed, 0);
    svc_msg_free(r);
    assert_int_equal(kvp_master_used(st), 30 * 64);

    /* all: everything but the PENDING and the leased */
    assert_int_equal(grl1(st, "b/3").status, KVP_OK); /* leased until 10000 */
    r = rbr(st, "", false, true);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->removed, 28); /* a/0, a/2..9, a/20..29, every b but b/3 */
    assert_int_equal(r->skipped_leased, 1);
    assert_int_equal(r->skipped_pending, 1);
    svc_msg_free(r);
    assert_int_equal(exist1(st, "b/3"), 1);
    assert_int_equal(kvp_master_used(st), 2 * 64);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, 1);
    assert_int_equal(s.pending, 1);
    assert_int_equal(graveyard_len(st), 0);
}

/* ---- 11. Exist and leases ---- */

static void test_exist_lease(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    put_done(st, C1, "k1", 64, 1, NULL, 0);
    put_done(st, C1, "k2", 64, 1, NULL, 0);

    st->config.lease_on_exist = false;
    assert_int_equal(exist1(st, "k1"), 1);
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "k1", false), KVP_OK);

    st->config.lease_on_exist = true;
    st->now_ms = 1000;
    assert_int_equal(exist1(st, "k2"), 1);
    assert_int_equal(exist1(st, "missing"), 0);
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "k2", false), KVP_ERR_LEASED);
    Kvpool__ListResponse *r = list(st, "^k2$", 0, 0, 10);
    assert_int_equal(r->n_entries, 1);
    assert_int_equal(r->entries[0]->lease_ms, 5000);
    svc_msg_free(r);
    st->now_ms = 5999;
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "k2", false), KVP_ERR_LEASED);
    st->now_ms = 6000;
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "k2", false), KVP_OK);
    assert_int_equal(kvp_master_used(st), 0);
}

/* ---- 12. cleanup with a graveyard and moves in flight ---- */

static void test_cleanup_graveyard_and_moves(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t a = mount_seg(st, C1, "A", "h1", MIB);
    mount_seg(st, C2, "B", "h2", MIB);
    put_done(st, C3, "g1", SZ, 1, "A", 1);
    put_done(st, C3, "g2", SZ, 2, "A", 2);
    put_done(st, C3, "m1", SZ, 1, "A", 3);
    put_done(st, C3, "m2", SZ, 1, "A", 4);
    assert_int_equal(grl1(st, "g1").status, KVP_OK);
    assert_int_equal(grl1(st, "g2").status, KVP_OK);
    assert_int_equal(keys1(st, C3, KVP_RPC_REMOVE, "g1", true), KVP_OK);
    assert_int_equal(upsert1(st, C3, "g2", 3 * SZ).status, KVP_OK); /* left PENDING */
    assert_int_equal(graveyard_len(st), 2);
    assert_int_equal(drain(st, C3, "A", 0, NULL, NULL), KVP_OK);
    const char *mk[2] = {"m1", "m2"};
    Kvpool__MoveStartResponse *r = move_start(st, C1, a, mk, 2);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->results[0]->n_replicas, 1);
    assert_int_equal(r->results[1]->n_replicas, 1);
    svc_msg_free(r);
    assert_non_null(st->moves);
    assert_non_null(st->moves->next);
    assert_int_equal(kvp_master_used(st), 7 * EXT + 3008); /* 3000 rounded to 64 */
    /* the fixture's kvp_master_state_cleanup frees it all (ASan/LSan check) */
}

/*
 * Review finding: a put while the only segment that could take it drains must
 * fail at once (no segment / too large), not evict the whole pool trying.
 */
static void test_put_while_draining_evicts_nothing(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t a = mount_seg(st, C1, "big", "h1", MIB);
    char key[32];
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof(key), "o%d", i);
        put_done(st, C1, key, SZ, 1, NULL, 1);
    }
    assert_int_equal(drain(st, C2, "big", 0, NULL, NULL), KVP_OK);
    assert_int_equal(put1(st, C2, "new", SZ).status, KVP_ERR_NO_SEGMENT);
    mount_seg(st, C3, "small", "h3", 64 * 1024);
    assert_int_equal(put1(st, C2, "new2", 100 * 1024).status, KVP_ERR_TOO_LARGE);
    assert_int_equal(st->stats.evicted_objects, 0);
    assert_int_equal(seg_used(st, a), 20 * EXT);
    assert_int_equal(exist1(st, "o7"), 1);
}

/*
 * Review finding: a replica's segment unmounted while the put is PENDING must
 * not shift the indices PutEnd's written_mask refers to.
 */
static void test_written_mask_after_unmount(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t a = mount_seg(st, C2, "a", "ha", MIB);
    uint64_t b = mount_seg(st, C3, "b", "hb", MIB);
    view_t v = put_cfg(st, C1, "k", SZ, 2, "a", false);
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.n, 2);
    assert_int_equal(v.r[0].seg, a);
    assert_int_equal(v.r[1].seg, b);
    kvp_dispatch_conn_closed(st, C2); /* a goes away while the put is PENDING */
    uint32_t only_a = 1;              /* a written, b failed: nothing written survives */
    assert_int_equal(end_mask1(st, C1, "k", 7, &only_a), KVP_ERR_IO);
    assert_int_equal(exist1(st, "k"), 0);
    assert_int_equal(seg_used(st, b), 0);

    a = mount_seg(st, C2, "a", "ha", MIB);
    v = put_cfg(st, C1, "k2", SZ, 2, "a", false);
    assert_int_equal(v.status, KVP_OK);
    kvp_dispatch_conn_closed(st, C2);
    uint32_t only_b = 2; /* b written: the object lives on b */
    assert_int_equal(end_mask1(st, C1, "k2", 9, &only_b), KVP_OK);
    view_t g = grl1(st, "k2");
    assert_int_equal(g.status, KVP_OK);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.r[0].seg, b);
    assert_int_equal(g.r[0].off, v.r[1].off);
    assert_int_equal(g.crc, 9);
}

/*
 * Found by the fuzzer (tests/fuzz/crashes/capacity_overflow): a mount whose
 * size made the pool's capacity wrap to a few KiB made every eviction check
 * think the pool was over its watermark and evict everyone's objects.
 */
static void test_mount_size_bounds(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "ok", "h1", 1 << 20);
    assert_int_equal(put1(st, C1, "keep", SZ).status, KVP_OK);
    assert_int_equal(end1(st, C1, "keep", 1), KVP_OK);
    static const uint64_t bad[] = {UINT64_MAX, UINT64_MAX - (1ull << 20) + 4096,
                                   KVP_SEGMENT_MAX_SIZE + 1};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        Kvpool__MountResponse *r = mount_raw(st, C2, "evil", "h2", bad[i]);
        assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
        assert_true(strlen(r->message) > 0);
        svc_msg_free(r);
    }
    assert_int_equal(st->segments.capacity, 1 << 20);
    kvp_evict_if_needed(st);
    assert_int_equal(exist1(st, "keep"), 1);
    /* the largest segment is fine, and so is the pool's sum of them */
    mount_seg(st, C2, "huge", "h2", KVP_SEGMENT_MAX_SIZE);
    assert_int_equal(st->segments.capacity, KVP_SEGMENT_MAX_SIZE + (1 << 20));
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_upsert_same_size_in_place),
        T(test_upsert_other_size),
        T(test_upsert_leased),
        T(test_upsert_refusals),
        T(test_put_end_written_mask),
        T(test_heartbeat_and_drain),
        T(test_heartbeat_segment_table),
        T(test_draining_gets_no_placements),
        T(test_move),
        T(test_list),
        T(test_list_long_chain),
        T(test_remove_by_regex),
        T(test_exist_lease),
        T(test_mount_size_bounds),
        T(test_put_while_draining_evicts_nothing),
        T(test_written_mask_after_unmount),
        T(test_cleanup_graveyard_and_moves),
    };
#undef T
    return cmocka_run_group_tests_name("admin", tests, NULL, NULL);
}
