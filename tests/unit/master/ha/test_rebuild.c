/*
 * test_rebuild.c - segments that describe themselves (ha/rebuild.c, rpc/record_calls.c,
 * meta/record.c) through their RPCs. Adopt: an owner's offer after a mount flagged
 * `adopting` (a new object; the same value from two segments merged; an older, a
 * removed, an overlapping, a misaligned or otherwise invalid entry refused; a newer
 * value replacing the master's; a put in flight winning; pins kept; only the owner's
 * connection speaks; no put lands on the segment until the offer ends; the version
 * clock moves past what was adopted). Records: the ADD and DEL changes queued for a
 * DRAM segment's owner by puts and removes (decoded byte by byte, as the server
 * pushes them), none for adopted entries; SegRecord, the owning client's subscription
 * to them, and the segments and callers it refuses.
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
#include "master/meta/limbo.h"
#include "master/meta/object_index.h"
#include "master/meta/record.h"
#include "master/policy/lease.h"
#include "master/rpc/segment_calls.h"
#include "master/core/state.h"
#include "tests/unit/master/svc_call.h"

#define C_A 1   /* owner of segment A (DRAM, adopting) */
#define C_B 2   /* owner of segment B (DRAM, adopting) */
#define C_P 3   /* owner of segment P (DRAM, open: where puts go) */
#define C_CLI 4 /* a client */
#define C_X 5   /* owner of a segment a test mounts itself */

#define SEG 65536u /* every DRAM segment's size */

typedef struct fx {
    kvp_master_state_t st;
    uint64_t a, b, p;
    uint64_t v; /* a version older than anything the master gave */
} fx_t;

static uint64_t mount_mem(kvp_master_state_t *st, uint64_t conn, const char *name,
                          const char *medium, uint64_t size, bool adopting, const char *shm)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.name = (char *)name;
    d.medium = (char *)medium;
    d.size = size;
    d.host_id = (char *)"host-a";
    d.tcp_endpoint = (char *)"127.0.0.1:7000";
    d.shm_path = (char *)shm;
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 100 + conn;
    req.segment = &d;
    req.adopting = adopting;
    Kvpool__MountResponse *r =
        svc_call(st, conn, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    uint64_t id = r->segment_id;
    svc_msg_free(r);
    return id;
}

static uint64_t mount(kvp_master_state_t *st, uint64_t conn, const char *name, const char *medium,
                      uint64_t size, bool adopting)
{
    return mount_mem(st, conn, name, medium, size, adopting, "");
}

static fx_t *fx_new(void)
{
    fx_t *fx = calloc(1, sizeof(*fx));
    if (fx == NULL || kvp_master_state_init(&fx->st) != KVP_OK) {
        free(fx);
        return NULL;
    }
    fx->st.rng = 0x5EED;
    fx->st.now_ms = 0;
    fx->v = fx->st.version_clock - 1000000;
    return fx;
}

/* A and B adopting, P open: every put lands on P. */
static int setup(void **state)
{
    fx_t *fx = fx_new();
    if (fx == NULL)
        return -1;
    fx->a = mount(&fx->st, C_A, "dram-a", "dram", SEG, true);
    fx->b = mount(&fx->st, C_B, "dram-b", "dram", SEG, true);
    fx->p = mount(&fx->st, C_P, "dram-p", "dram", SEG, false);
    *state = fx;
    return 0;
}

/* No segment: the test mounts its own. */
static int setup_bare(void **state)
{
    fx_t *fx = fx_new();
    if (fx == NULL)
        return -1;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fx_t *fx = *state;
    kvp_master_state_cleanup(&fx->st);
    free(fx);
    return 0;
}

static kvp_segment_t *seg_of(fx_t *fx, uint64_t id)
{
    kvp_segment_t *seg = kvp_segment_table_get(&fx->st.segments, id);
    assert_non_null(seg);
    return seg;
}

static kvp_object_t *lookup(fx_t *fx, const char *key)
{
    return kvp_index_lookup(&fx->st.index, key, strlen(key), kvp_index_hash(key, strlen(key)));
}

/* ---- Adopt ---- */

typedef struct ent {
    const char *key;
    uint64_t version, offset, size;
    uint32_t crc, pin;
} ent_t;

/* Adopt from conn for segment seg: the response's status; statuses[] get the entries'. */
static int32_t adopt(fx_t *fx, uint64_t conn, uint64_t seg, const ent_t *in, size_t n, bool last,
                     int32_t *statuses)
{
    Kvpool__AdoptEntry e[8], *ep[8];
    assert_true(n <= 8);
    for (size_t i = 0; i < n; i++) {
        kvpool__adopt_entry__init(&e[i]);
        e[i].key.data = (uint8_t *)in[i].key;
        e[i].key.len = strlen(in[i].key);
        e[i].version = in[i].version;
        e[i].offset = in[i].offset;
        e[i].size = in[i].size;
        e[i].crc32c = in[i].crc;
        e[i].pin = in[i].pin;
        ep[i] = &e[i];
    }
    Kvpool__AdoptRequest req = KVPOOL__ADOPT_REQUEST__INIT;
    req.segment_id = seg;
    req.entries = ep;
    req.n_entries = n;
    req.last = last;
    Kvpool__AdoptResponse *r =
        svc_call(&fx->st, conn, KVP_RPC_ADOPT, &req.base, &kvpool__adopt_response__descriptor);
    int32_t s = r->status;
    if (s == KVP_OK) {
        assert_int_equal(r->n_statuses, n);
        for (size_t i = 0; i < n; i++)
            statuses[i] = r->statuses[i];
    } else {
        assert_int_equal(r->n_statuses, 0);
    }
    svc_msg_free(r);
    return s;
}

/* One entry, offered by the segment's owner (conn): its status. */
static int32_t adopt1(fx_t *fx, uint64_t conn, uint64_t seg, const char *key, uint64_t version,
                      uint64_t offset, uint64_t size, uint32_t crc, uint32_t pin)
{
    ent_t e = {key, version, offset, size, crc, pin};
    int32_t s = KVP_ERR_INTERNAL;
    assert_int_equal(adopt(fx, conn, seg, &e, 1, false, &s), KVP_OK);
    return s;
}

/* ---- object RPCs ---- */

typedef struct put_opt {
    uint32_t pin;
    bool upsert;
} put_opt_t;

/* PutStart of one key from the client: its status; the first replica's segment and offset. */
static int32_t put_start(fx_t *fx, const char *key, uint64_t size, const put_opt_t *opt,
                         uint64_t *seg_p, uint64_t *off_p)
{
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.sizes = &size;
    req.n_sizes = 1;
    cfg.replica_num = 1;
    cfg.medium = (char *)"";
    cfg.preferred_segment = (char *)"";
    if (opt != NULL) {
        cfg.pin = opt->pin;
        cfg.upsert = opt->upsert;
    }
    req.config = &cfg;
    Kvpool__PutStartResponse *r = svc_call(&fx->st, C_CLI, KVP_RPC_PUT_START, &req.base,
                                           &kvpool__put_start_response__descriptor);
    int32_t s = r->status;
    if (s == KVP_OK) {
        assert_int_equal(r->n_results, 1);
        s = r->results[0]->status;
    }
    if (s == KVP_OK) {
        assert_int_equal(r->results[0]->n_replicas, 1);
        if (seg_p != NULL)
            *seg_p = r->results[0]->replicas[0]->segment_id;
        if (off_p != NULL)
            *off_p = r->results[0]->replicas[0]->offset;
    }
    svc_msg_free(r);
    return s;
}

static int32_t put_end(fx_t *fx, const char *key, uint32_t crc)
{
    Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.crc32c = &crc;
    req.n_crc32c = 1;
    Kvpool__StatusesResponse *r = svc_call(&fx->st, C_CLI, KVP_RPC_PUT_END, &req.base,
                                           &kvpool__statuses_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

/* A whole put; its replica's segment and offset. */
static void put(fx_t *fx, const char *key, uint64_t size, uint32_t crc, const put_opt_t *opt,
                uint64_t *seg_p, uint64_t *off_p)
{
    assert_int_equal(put_start(fx, key, size, opt, seg_p, off_p), KVP_OK);
    assert_int_equal(put_end(fx, key, crc), KVP_OK);
}

/* Remove or Exist of one key: its per-key status. */
static int32_t keys_op(fx_t *fx, uint16_t method, const char *key)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    Kvpool__StatusesResponse *r =
        svc_call(&fx->st, C_CLI, method, &req.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

typedef struct got {
    int32_t status;
    uint64_t size;
    uint32_t crc;
    size_t n;
    uint64_t seg[8], off[8];
} got_t;

/* GetReplicaList of one key, as a reader sees it (the lease is handed back at once). */
static got_t get(fx_t *fx, const char *key)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    Kvpool__GetReplicaListResponse *r =
        svc_call(&fx->st, C_CLI, KVP_RPC_GET_REPLICA_LIST, &req.base,
                 &kvpool__get_replica_list_response__descriptor);
    assert_int_equal(r->n_results, 1);
    Kvpool__GetReplicaResult *g = r->results[0];
    got_t out = {.status = g->status, .size = g->size, .crc = g->crc32c, .n = g->n_replicas};
    assert_true(g->n_replicas <= 8);
    for (size_t i = 0; i < g->n_replicas; i++) {
        out.seg[i] = g->replicas[i]->segment_id;
        out.off[i] = g->replicas[i]->offset;
    }
    if (g->lease_id != 0)
        kvp_lease_release(&fx->st, g->lease_id);
    svc_msg_free(r);
    return out;
}

/* Has the key's replica list a replica at (seg, off)? */
static bool has_replica(const got_t *g, uint64_t seg, uint64_t off)
{
    for (size_t i = 0; i < g->n; i++)
        if (g->seg[i] == seg && g->off[i] == off)
            return true;
    return false;
}

/* ---- SegRecord ---- */

typedef struct rec {
    unsigned op;
    uint64_t offset, size, version;
    uint32_t crc;
    unsigned pin;
    char key[64];
    size_t key_len;
} rec_t;

static uint64_t le(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Decode a changes stream (it must be well formed): the number of records. */
static size_t decode(const uint8_t *buf, size_t len, rec_t *out, size_t max)
{
    size_t n = 0, at = 0;
    while (at < len) {
        assert_true(n < max);
        rec_t *r = &out[n++];
        memset(r, 0, sizeof(*r));
        assert_true(len - at >= 9);
        r->op = buf[at];
        r->offset = le(buf + at + 1, 8);
        if (r->op == 2) {
            at += 9;
            continue;
        }
        assert_int_equal(r->op, 1);
        assert_true(len - at >= 32);
        r->size = le(buf + at + 9, 8);
        r->version = le(buf + at + 17, 8);
        r->crc = (uint32_t)le(buf + at + 25, 4);
        r->pin = buf[at + 29];
        r->key_len = (size_t)le(buf + at + 30, 2);
        assert_true(r->key_len < sizeof(r->key));
        assert_true(len - at - 32 >= r->key_len);
        memcpy(r->key, buf + at + 32, r->key_len);
        at += 32 + r->key_len;
    }
    return n;
}

/* Is seg on the segment table's list of records to push (server.c, push_records)? */
static bool listed(fx_t *fx, uint64_t seg)
{
    for (size_t i = 0; i < fx->st.segments.n_dirty; i++)
        if (fx->st.segments.dirty_ids[i] == seg)
            return true;
    return false;
}

/* What the server writes next on seg's SegRecord stream (push_records): the changes queued,
 * taken and decoded into out[]; how many. None may be queued when out is NULL. */
static size_t changes(fx_t *fx, uint64_t seg, rec_t *out, size_t max)
{
    kvp_segment_t *s = seg_of(fx, seg);
    assert_false(s->record_broken);
    if (s->rec_len > 0) { /* the server is told to push them */
        assert_true(fx->st.segments.records_dirty);
        assert_true(listed(fx, seg));
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    kvp_record_take(s, &buf, &len);
    if (out == NULL) {
        free(buf);
        assert_int_equal(len, 0);
        return 0;
    }
    size_t n = decode(buf, len, out, max);
    free(buf);
    return n;
}

#define OWNER(conn) (100u + (conn)) /* the client id mount() gives a connection's segments */

/* SegRecord from conn, as the server runs it: KVP_OK when the request became seg's record
 * stream (no reply; st.stream_segment names the segment, reset here as the server does),
 * else the status of the reply that refused it. */
static int32_t subscribe(fx_t *fx, uint64_t conn, uint64_t seg, uint64_t client_id)
{
    Kvpool__SegRecordRequest req = KVPOOL__SEG_RECORD_REQUEST__INIT;
    req.segment_id = seg;
    req.client_id = client_id;
    uint8_t body[64], *resp = NULL;
    size_t len = kvpool__seg_record_request__pack(&req, body), rlen = 0;
    char err[128] = "";
    fx->st.stream_segment = 0;
    assert_int_equal(kvp_dispatch_handle(&fx->st, conn, NULL, KVP_RPC_SEG_RECORD, body, len, &resp,
                                         &rlen, err, sizeof(err)),
                     KVP_OK);
    if (resp == NULL) {
        assert_int_equal(rlen, 0);
        assert_int_equal(fx->st.stream_segment, seg);
        fx->st.stream_segment = 0;
        return KVP_OK;
    }
    assert_int_equal(fx->st.stream_segment, 0);
    Kvpool__SegRecordResponse *r = kvpool__seg_record_response__unpack(NULL, rlen, resp);
    free(resp);
    assert_non_null(r);
    int32_t s = r->status;
    assert_int_not_equal(s, KVP_OK); /* an answer ends the stream: only refusals get one */
    assert_int_equal(r->changes.len, 0);
    svc_msg_free(r);
    return s;
}

/* ---- tests: Adopt ---- */

static void test_unknown_key_adopted_and_readable(void **state)
{
    fx_t *fx = *state;
    assert_int_equal(adopt1(fx, C_A, fx->a, "alpha", fx->v, 128, 1000, 0xA1FA, 0), KVP_OK);
    got_t g = get(fx, "alpha");
    assert_int_equal(g.status, KVP_OK);
    assert_int_equal(g.size, 1000);
    assert_int_equal(g.crc, 0xA1FA);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.seg[0], fx->a);
    assert_int_equal(g.off[0], 128);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "alpha"), 1);
    assert_int_equal(fx->st.stats.adopted, 1);
    assert_int_equal(fx->st.stats.adopt_refused, 0);
    /* its extent is held: the segment counts it */
    assert_int_equal(kvp_segment_used(seg_of(fx, fx->a)), 1024);
    assert_int_equal(seg_of(fx, fx->a)->objects, 1);
    /* and it is an object like any other: it can be removed */
    assert_int_equal(keys_op(fx, KVP_RPC_REMOVE, "alpha"), KVP_OK);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "alpha"), 0);
    assert_int_equal(kvp_segment_used(seg_of(fx, fx->a)), 0);
}

static void test_same_value_from_two_segments_merges(void **state)
{
    fx_t *fx = *state;
    assert_int_equal(adopt1(fx, C_A, fx->a, "m", fx->v, 0, 1000, 5, 0), KVP_OK);
    assert_int_equal(adopt1(fx, C_B, fx->b, "m", fx->v, 4096, 1000, 5, 0), KVP_OK);
    assert_int_equal(fx->st.index.count, 1);
    got_t g = get(fx, "m");
    assert_int_equal(g.status, KVP_OK);
    assert_int_equal(g.n, 2);
    assert_true(has_replica(&g, fx->a, 0));
    assert_true(has_replica(&g, fx->b, 4096));
    assert_int_equal(g.size, 1000);
    assert_int_equal(g.crc, 5);
    /* the same value twice on one segment is not a third replica */
    assert_int_equal(adopt1(fx, C_B, fx->b, "m", fx->v, 8192, 1000, 5, 0), KVP_ERR_EXISTS);
    assert_int_equal(get(fx, "m").n, 2);
    assert_int_equal(kvp_segment_used(seg_of(fx, fx->b)), 1024);
    /* an object the master put: a copy of its value elsewhere is one more replica */
    uint64_t pseg, poff;
    put(fx, "put", 500, 0xC0FFEE, NULL, &pseg, &poff);
    assert_int_equal(pseg, fx->p);
    kvp_object_t *obj = lookup(fx, "put");
    assert_non_null(obj);
    assert_int_equal(adopt1(fx, C_A, fx->a, "put", obj->version, 2048, 500, 0xC0FFEE, 0), KVP_OK);
    g = get(fx, "put");
    assert_int_equal(g.n, 2);
    assert_true(has_replica(&g, fx->p, poff));
    assert_true(has_replica(&g, fx->a, 2048));
    assert_int_equal(fx->st.stats.adopted, 3);
    assert_int_equal(fx->st.stats.adopt_refused, 1);
    assert_int_equal(fx->st.index.count, 2);
}

static void test_older_version_refused(void **state)
{
    fx_t *fx = *state;
    assert_int_equal(adopt1(fx, C_A, fx->a, "o", fx->v, 0, 1000, 5, 0), KVP_OK);
    assert_int_equal(adopt1(fx, C_B, fx->b, "o", fx->v - 1, 0, 1000, 5, 0), KVP_ERR_EXISTS);
    /* the same version with another value is no replica of it either */
    assert_int_equal(adopt1(fx, C_B, fx->b, "o", fx->v, 0, 1000, 6, 0), KVP_ERR_EXISTS);
    assert_int_equal(adopt1(fx, C_B, fx->b, "o", fx->v, 0, 999, 5, 0), KVP_ERR_EXISTS);
    assert_int_equal(fx->st.stats.adopt_refused, 3);
    got_t g = get(fx, "o");
    assert_int_equal(g.status, KVP_OK);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.seg[0], fx->a);
    assert_int_equal(g.crc, 5);
    assert_int_equal(kvp_segment_used(seg_of(fx, fx->b)), 0); /* nothing held for them */
    /* older than a value the master put since */
    put(fx, "fresh", 1000, 1, NULL, NULL, NULL);
    assert_int_equal(adopt1(fx, C_A, fx->a, "fresh", fx->v, 4096, 1000, 1, 0), KVP_ERR_EXISTS);
    g = get(fx, "fresh");
    assert_int_equal(g.n, 1);
    assert_int_equal(g.seg[0], fx->p);
}

static void test_newer_version_replaces_masters(void **state)
{
    fx_t *fx = *state;
    uint64_t poff;
    put(fx, "k", 1000, 0xC0FFEE, NULL, NULL, &poff);
    kvp_object_t *obj = lookup(fx, "k");
    assert_non_null(obj);
    uint64_t v1 = obj->version;
    assert_int_equal(changes(fx, fx->p, (rec_t[4]){0}, 4), 1); /* the put's ADD */
    /* an overwrite the master lost: its copy on A is newer */
    assert_int_equal(adopt1(fx, C_A, fx->a, "k", v1 + 1, 256, 2000, 9, 0), KVP_OK);
    assert_int_equal(fx->st.stats.adopted, 1);
    got_t g = get(fx, "k");
    assert_int_equal(g.status, KVP_OK);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.seg[0], fx->a);
    assert_int_equal(g.off[0], 256);
    assert_int_equal(g.size, 2000);
    assert_int_equal(g.crc, 9);
    assert_int_equal(fx->st.index.count, 1);
    /* the old value's extent is free, and P's owner is told to forget it */
    assert_int_equal(kvp_segment_used(seg_of(fx, fx->p)), 0);
    rec_t r[4];
    assert_int_equal(changes(fx, fx->p, r, 4), 1);
    assert_int_equal(r[0].op, 2);
    assert_int_equal(r[0].offset, poff);
    /* the replaced value offered again (from B) is stale now */
    assert_int_equal(adopt1(fx, C_B, fx->b, "k", v1, 0, 1000, 0xC0FFEE, 0), KVP_ERR_EXISTS);
    assert_int_equal(get(fx, "k").seg[0], fx->a);
    /* the same between two adopted copies: B's newer one wins over A's */
    assert_int_equal(adopt1(fx, C_B, fx->b, "k", v1 + 2, 512, 3000, 10, 0), KVP_OK);
    g = get(fx, "k");
    assert_int_equal(g.n, 1);
    assert_int_equal(g.seg[0], fx->b);
    assert_int_equal(g.off[0], 512);
    assert_int_equal(g.size, 3000);
    assert_int_equal(kvp_segment_used(seg_of(fx, fx->a)), 0);
}

static void test_removed_since_refused(void **state)
{
    fx_t *fx = *state;
    put(fx, "r", 1000, 1, NULL, NULL, NULL);
    uint64_t v = lookup(fx, "r")->version;
    assert_int_equal(keys_op(fx, KVP_RPC_REMOVE, "r"), KVP_OK);
    assert_int_equal(adopt1(fx, C_A, fx->a, "r", v, 0, 1000, 1, 0), KVP_ERR_NOT_FOUND);
    assert_int_equal(get(fx, "r").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "r"), 0);
    /* a remove of a key the master did not know (its copy was on a segment not back yet) */
    assert_int_equal(keys_op(fx, KVP_RPC_REMOVE, "gone"), KVP_ERR_NOT_FOUND);
    assert_int_equal(adopt1(fx, C_A, fx->a, "gone", fx->v, 1024, 100, 1, 0), KVP_ERR_NOT_FOUND);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "gone"), 0);
    assert_int_equal(fx->st.stats.adopt_refused, 2);
    assert_int_equal(fx->st.stats.adopted, 0);
    assert_int_equal(kvp_segment_used(seg_of(fx, fx->a)), 0);
    /* written after the remove: fine */
    assert_int_equal(adopt1(fx, C_A, fx->a, "gone", fx->st.version_clock + 5, 1024, 100, 1, 0),
                     KVP_OK);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "gone"), 1);
}

static void test_overlapping_extent_refused(void **state)
{
    fx_t *fx = *state;
    assert_int_equal(adopt1(fx, C_A, fx->a, "a", fx->v + 9, 0, 1000, 1, 0), KVP_OK);
    /* [0, 1024) is a's (64-byte extents) */
    assert_int_equal(adopt1(fx, C_A, fx->a, "b", fx->v + 8, 960, 64, 1, 0), KVP_ERR_EXISTS);
    assert_int_equal(adopt1(fx, C_A, fx->a, "c", fx->v + 7, 512, 4096, 1, 0), KVP_ERR_EXISTS);
    assert_int_equal(adopt1(fx, C_A, fx->a, "d", fx->v + 6, 1024, 64, 1, 0), KVP_OK);
    assert_int_equal(get(fx, "b").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(get(fx, "c").status, KVP_ERR_NOT_FOUND);
    got_t g = get(fx, "a");
    assert_int_equal(g.status, KVP_OK);
    assert_int_equal(g.off[0], 0);
    assert_int_equal(g.size, 1000);
    assert_int_equal(fx->st.stats.adopted, 2);
    assert_int_equal(fx->st.stats.adopt_refused, 2);
    assert_int_equal(kvp_segment_used(seg_of(fx, fx->a)), 1024 + 64);
}

static void test_invalid_entries_refused(void **state)
{
    fx_t *fx = *state;
    const uint64_t v = fx->v;
    assert_int_equal(adopt1(fx, C_A, fx->a, "mis", v, 32, 100, 1, 0), KVP_ERR_INVALID_ARG);
    assert_int_equal(adopt1(fx, C_A, fx->a, "zero", v, 0, 0, 1, 0), KVP_ERR_INVALID_ARG);
    assert_int_equal(adopt1(fx, C_A, fx->a, "past", v, SEG - 64, 128, 1, 0), KVP_ERR_INVALID_ARG);
    assert_int_equal(adopt1(fx, C_A, fx->a, "end", v, SEG, 64, 1, 0), KVP_ERR_INVALID_ARG);
    assert_int_equal(adopt1(fx, C_A, fx->a, "pin", v, 0, 100, 1, 3), KVP_ERR_INVALID_ARG);
    assert_int_equal(adopt1(fx, C_A, fx->a, "v0", 0, 0, 100, 1, 0), KVP_ERR_INVALID_ARG);
    assert_int_equal(fx->st.stats.adopt_refused, 6);
    assert_int_equal(fx->st.stats.adopted, 0);
    assert_int_equal(fx->st.index.count, 0);
    assert_int_equal(kvp_segment_used(seg_of(fx, fx->a)), 0);
    const char *keys[] = {"mis", "zero", "past", "end", "pin", "v0"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        assert_int_equal(keys_op(fx, KVP_RPC_EXIST, keys[i]), 0);
    /* the edges themselves are fine: 64-byte aligned, ending at the segment's end */
    assert_int_equal(adopt1(fx, C_A, fx->a, "last", v, SEG - 128, 128, 1, 0), KVP_OK);
    assert_int_equal(adopt1(fx, C_A, fx->a, "al", v, 64, 64, 1, 0), KVP_OK);
    /* SSD: 4 KiB extents */
    uint64_t ssd = mount(&fx->st, C_X, "ssd-x", "ssd", 1 << 20, true);
    assert_int_equal(adopt1(fx, C_X, ssd, "s1", v, 64, 100, 1, 0), KVP_ERR_INVALID_ARG);
    assert_int_equal(adopt1(fx, C_X, ssd, "s2", v, 2048, 100, 1, 0), KVP_ERR_INVALID_ARG);
    assert_int_equal(adopt1(fx, C_X, ssd, "s3", v, 4096, 100, 1, 0), KVP_OK);
    got_t g = get(fx, "s3");
    assert_int_equal(g.status, KVP_OK);
    assert_int_equal(g.seg[0], ssd);
    assert_int_equal(g.off[0], 4096);
    assert_int_equal(fx->st.stats.adopt_refused, 8);
    assert_int_equal(fx->st.stats.adopted, 3);
}

/* A size so large that rounding it up to the extent alignment wraps: still an extent past
 * the segment's end. */
static void test_huge_size_refused_as_invalid(void **state)
{
    fx_t *fx = *state;
    assert_int_equal(adopt1(fx, C_A, fx->a, "huge", fx->v, 0, UINT64_MAX, 1, 0),
                     KVP_ERR_INVALID_ARG);
    assert_int_equal(adopt1(fx, C_A, fx->a, "huge2", fx->v, 64, UINT64_MAX - 62, 1, 0),
                     KVP_ERR_INVALID_ARG);
    assert_int_equal(fx->st.stats.adopt_refused, 2);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "huge"), 0);
    assert_int_equal(kvp_segment_used(seg_of(fx, fx->a)), 0);
}

static void test_put_in_flight_wins(void **state)
{
    fx_t *fx = *state;
    uint64_t seg, off;
    assert_int_equal(put_start(fx, "pp", 1000, NULL, &seg, &off), KVP_OK);
    /* even a copy that claims to be newer: the put is the latest word */
    assert_int_equal(adopt1(fx, C_A, fx->a, "pp", fx->st.version_clock + 10, 0, 1000, 7, 0),
                     KVP_ERR_EXISTS);
    assert_int_equal(fx->st.stats.adopt_refused, 1);
    assert_int_equal(kvp_segment_used(seg_of(fx, fx->a)), 0);
    assert_int_equal(put_end(fx, "pp", 0xBEEF), KVP_OK);
    got_t g = get(fx, "pp");
    assert_int_equal(g.status, KVP_OK);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.seg[0], seg);
    assert_int_equal(g.off[0], off);
    assert_int_equal(g.crc, 0xBEEF);
}

/* The LIST entry of one key (exactly one must match): its pin. */
static uint32_t listed_pin(fx_t *fx, const char *key)
{
    char pattern[64];
    snprintf(pattern, sizeof(pattern), "^%s$", key);
    Kvpool__ListRequest req = KVPOOL__LIST_REQUEST__INIT;
    req.pattern = pattern;
    Kvpool__ListResponse *r;
    /* a page may end early, with its cursor (its time budget: a slow ASan run) */
    for (;;) {
        r = svc_call(&fx->st, C_CLI, KVP_RPC_LIST, &req.base, &kvpool__list_response__descriptor);
        assert_int_equal(r->status, KVP_OK);
        if (r->n_entries > 0 || r->next_cursor == 0)
            break;
        req.cursor = r->next_cursor;
        svc_msg_free(r);
    }
    assert_int_equal(r->n_entries, 1);
    assert_int_equal(r->entries[0]->key.len, strlen(key));
    assert_memory_equal(r->entries[0]->key.data, key, strlen(key));
    assert_int_equal(r->entries[0]->state, 2); /* COMPLETE */
    uint32_t pin = r->entries[0]->pin;
    svc_msg_free(r);
    return pin;
}

static void test_pins_kept(void **state)
{
    fx_t *fx = *state;
    fx->st.now_ms = 5000;
    ent_t e[3] = {
        {"hard", fx->v + 3, 0, 100, 1, 2},
        {"soft", fx->v + 2, 128, 100, 1, 1},
        {"none", fx->v + 1, 256, 100, 1, 0},
    };
    int32_t s[3];
    assert_int_equal(adopt(fx, C_A, fx->a, e, 3, false, s), KVP_OK);
    assert_int_equal(s[0], KVP_OK);
    assert_int_equal(s[1], KVP_OK);
    assert_int_equal(s[2], KVP_OK);
    assert_int_equal(listed_pin(fx, "hard"), 2);
    assert_int_equal(listed_pin(fx, "soft"), 1);
    assert_int_equal(listed_pin(fx, "none"), 0);
    /* on the lists the eviction policy keeps them on */
    kvp_object_t *h = lookup(fx, "hard"), *so = lookup(fx, "soft"), *n = lookup(fx, "none");
    assert_non_null(h);
    assert_non_null(so);
    assert_non_null(n);
    assert_int_equal(h->policy & KVP_POLICY_LIST_MASK, KVP_POLICY_PINNED);
    assert_int_equal(so->policy & KVP_POLICY_LIST_MASK, KVP_POLICY_SOFT);
    /* the unpinned one an eviction candidate like any (the home list of an adopted object) */
    assert_true((n->policy & KVP_POLICY_LIST_MASK) == KVP_POLICY_PROBATION ||
                (n->policy & KVP_POLICY_LIST_MASK) == KVP_POLICY_PROTECTED);
    assert_int_equal(fx->st.index.pinned.n, 1);
    assert_int_equal(fx->st.index.soft.n, 1);
    /* a soft pin runs from the adoption for the master's TTL */
    assert_int_equal(so->soft_pin_until_s, 5 + fx->st.config.soft_pin_ttl_s);
}

static void test_only_the_owner_adopts(void **state)
{
    fx_t *fx = *state;
    ent_t e = {"x", fx->v, 0, 100, 1, 0};
    int32_t s;
    assert_int_equal(adopt(fx, C_B, fx->a, &e, 1, true, &s), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(adopt(fx, C_CLI, fx->a, &e, 1, true, &s), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(adopt(fx, C_A, 0xDEAD, &e, 1, true, &s), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "x"), 0);
    assert_int_equal(fx->st.stats.adopted, 0);
    /* nor did anyone else end A's offer */
    assert_true(seg_of(fx, fx->a)->adopting);
    /* the owner's connection closed: its segment is gone, and so is its say */
    kvp_dispatch_conn_closed(&fx->st, C_A);
    assert_int_equal(adopt(fx, C_A, fx->a, &e, 1, true, &s), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "x"), 0);
}

static void test_batch_statuses_per_entry(void **state)
{
    fx_t *fx = *state;
    ent_t e[4] = {
        {"b1", fx->v + 4, 0, 1000, 1, 0},
        {"b2", fx->v + 3, 32, 100, 2, 0},  /* misaligned */
        {"b3", fx->v + 2, 512, 100, 3, 0}, /* inside b1's extent */
        {"b4", fx->v + 1, 4096, 100, 4, 0},
    };
    int32_t s[4];
    assert_int_equal(adopt(fx, C_A, fx->a, e, 4, false, s), KVP_OK);
    assert_int_equal(s[0], KVP_OK);
    assert_int_equal(s[1], KVP_ERR_INVALID_ARG);
    assert_int_equal(s[2], KVP_ERR_EXISTS);
    assert_int_equal(s[3], KVP_OK);
    assert_int_equal(fx->st.stats.adopted, 2);
    assert_int_equal(fx->st.stats.adopt_refused, 2);
    assert_int_equal(seg_of(fx, fx->a)->adopt_ok, 2);
    assert_int_equal(seg_of(fx, fx->a)->adopt_refused, 2);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "b1"), 1);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "b2"), 0);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "b3"), 0);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "b4"), 1);
    /* the offer is not over until `last` */
    assert_true(seg_of(fx, fx->a)->adopting);
    assert_int_equal(adopt(fx, C_A, fx->a, NULL, 0, true, s), KVP_OK);
    assert_false(seg_of(fx, fx->a)->adopting);
}

static void test_adopting_segment_takes_no_put(void **state)
{
    fx_t *fx = *state;
    uint64_t a = mount(&fx->st, C_A, "only", "dram", 4096, true);
    int32_t s = put_start(fx, "n", 2048, NULL, NULL, NULL);
    assert_true(s == KVP_ERR_NO_SEGMENT || s == KVP_ERR_POOL_FULL);
    assert_int_equal(keys_op(fx, KVP_RPC_EXIST, "n"), 0);
    assert_int_equal(kvp_segment_used(seg_of(fx, a)), 0);
    /* a batch that is not the last leaves it closed */
    ent_t e = {"held", fx->v, 0, 2048, 1, 0};
    int32_t es;
    assert_int_equal(adopt(fx, C_A, a, &e, 1, false, &es), KVP_OK);
    assert_int_equal(es, KVP_OK);
    s = put_start(fx, "n", 2048, NULL, NULL, NULL);
    assert_true(s == KVP_ERR_NO_SEGMENT || s == KVP_ERR_POOL_FULL);
    /* the last (empty) batch opens it; the put goes beside the adopted copy */
    assert_int_equal(adopt(fx, C_A, a, NULL, 0, true, &es), KVP_OK);
    uint64_t seg, off;
    assert_int_equal(put_start(fx, "n", 2048, NULL, &seg, &off), KVP_OK);
    assert_int_equal(seg, a);
    assert_int_equal(off, 2048);
    assert_int_equal(put_end(fx, "n", 1), KVP_OK);
    got_t g = get(fx, "held");
    assert_int_equal(g.status, KVP_OK);
    assert_int_equal(g.off[0], 0);
    /* both held: the segment is full, neither extent handed out twice */
    assert_int_equal(kvp_segment_used(seg_of(fx, a)), 4096);
}

static void test_version_clock_passes_adopted(void **state)
{
    fx_t *fx = *state;
    uint64_t big = fx->st.version_clock + 1000000;
    assert_int_equal(adopt1(fx, C_A, fx->a, "v", big, 0, 1000, 1, 0), KVP_OK);
    assert_true(fx->st.version_clock >= big);
    /* a new put gets a later version than anything adopted */
    put(fx, "later", 1000, 2, NULL, NULL, NULL);
    assert_true(lookup(fx, "later")->version > big);
    /* an overwrite of the adopted key too: the adopted copy offered again is stale */
    put_opt_t up = {.upsert = true};
    put(fx, "v", 2000, 3, &up, NULL, NULL);
    assert_true(lookup(fx, "v")->version > big);
    assert_int_equal(adopt1(fx, C_B, fx->b, "v", big, 0, 1000, 1, 0), KVP_ERR_EXISTS);
    got_t g = get(fx, "v");
    assert_int_equal(g.n, 1);
    assert_int_equal(g.seg[0], fx->p);
    assert_int_equal(g.size, 2000);
    assert_int_equal(g.crc, 3);
}

/* ---- tests: SegRecord ---- */

static void test_record_add_then_del(void **state)
{
    fx_t *fx = *state;
    assert_true(seg_of(fx, fx->p)->record);
    changes(fx, fx->p, NULL, 0);
    fx->st.segments.records_dirty = false; /* as the server leaves it after a push */
    uint64_t off;
    put_opt_t hard = {.pin = 2};
    assert_int_equal(put_start(fx, "rec-key", 1000, &hard, NULL, &off), KVP_OK);
    /* not COMPLETE yet: nothing to record */
    assert_false(fx->st.segments.records_dirty);
    changes(fx, fx->p, NULL, 0);
    assert_int_equal(put_end(fx, "rec-key", 0xABCD1234), KVP_OK);
    assert_true(fx->st.segments.records_dirty);
    assert_true(listed(fx, fx->p));
    rec_t r[4];
    assert_int_equal(changes(fx, fx->p, r, 4), 1);
    assert_int_equal(r[0].op, 1);
    assert_int_equal(r[0].offset, off);
    assert_int_equal(r[0].size, 1000);
    assert_int_equal(r[0].version, lookup(fx, "rec-key")->version);
    assert_int_equal(r[0].crc, 0xABCD1234);
    assert_int_equal(r[0].pin, 2);
    assert_int_equal(r[0].key_len, 7);
    assert_memory_equal(r[0].key, "rec-key", 7);
    /* taken: nothing more; the other segments had nothing */
    changes(fx, fx->p, NULL, 0);
    changes(fx, fx->a, NULL, 0);
    changes(fx, fx->b, NULL, 0);
    /* a remove: the extent is no longer an object's */
    fx->st.segments.records_dirty = false;
    assert_int_equal(keys_op(fx, KVP_RPC_REMOVE, "rec-key"), KVP_OK);
    assert_true(fx->st.segments.records_dirty);
    assert_int_equal(changes(fx, fx->p, r, 4), 1);
    assert_int_equal(r[0].op, 2);
    assert_int_equal(r[0].offset, off);
    changes(fx, fx->p, NULL, 0);
}

static void test_record_two_puts_in_order(void **state)
{
    fx_t *fx = *state;
    uint64_t o1, o2;
    put(fx, "one", 100, 11, NULL, NULL, &o1);
    put(fx, "two", 200, 22, NULL, NULL, &o2);
    assert_int_not_equal(o1, o2);
    rec_t r[4];
    assert_int_equal(changes(fx, fx->p, r, 4), 2);
    assert_int_equal(r[0].op, 1);
    assert_int_equal(r[0].offset, o1);
    assert_int_equal(r[0].size, 100);
    assert_int_equal(r[0].crc, 11);
    assert_int_equal(r[0].key_len, 3);
    assert_memory_equal(r[0].key, "one", 3);
    assert_int_equal(r[1].op, 1);
    assert_int_equal(r[1].offset, o2);
    assert_int_equal(r[1].size, 200);
    assert_int_equal(r[1].crc, 22);
    assert_memory_equal(r[1].key, "two", 3);
    assert_true(r[1].version > r[0].version);
}

static void test_record_subscribe(void **state)
{
    fx_t *fx = *state;
    uint64_t off;
    put(fx, "early", 100, 1, NULL, NULL, &off); /* before anyone listens */
    /* the owning client, on a connection of its own: no answer, the stream is set up */
    assert_int_equal(subscribe(fx, C_X, fx->p, OWNER(C_P)), KVP_OK);
    /* what was queued before is kept for it */
    rec_t r[2];
    assert_int_equal(changes(fx, fx->p, r, 2), 1);
    assert_int_equal(r[0].op, 1);
    assert_int_equal(r[0].offset, off);
    assert_memory_equal(r[0].key, "early", 5);
    /* or on the connection that mounted it */
    assert_int_equal(subscribe(fx, C_P, fx->p, OWNER(C_P)), KVP_OK);
    /* another client may not listen in, whatever its connection */
    assert_int_equal(subscribe(fx, C_X, fx->p, OWNER(C_A)), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(subscribe(fx, C_P, fx->p, OWNER(C_A)), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(subscribe(fx, C_X, fx->p, 0), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(subscribe(fx, C_X, 0xDEAD, OWNER(C_P)), KVP_ERR_SEGMENT_GONE);
    /* a segment still being offered back can be listened to (its changes come later) */
    assert_int_equal(subscribe(fx, C_X, fx->a, OWNER(C_A)), KVP_OK);
}

static void test_record_unsupported_and_gone(void **state)
{
    fx_t *fx = *state;
    uint64_t ssd = mount(&fx->st, C_X, "ssd-x", "ssd", 1 << 20, false);
    assert_false(seg_of(fx, ssd)->record);
    assert_int_equal(subscribe(fx, C_X, ssd, OWNER(C_X)), KVP_ERR_UNSUPPORTED);
    fx->st.config.segment_records = false;
    uint64_t norec = mount(&fx->st, C_X + 1, "dram-norec", "dram", SEG, false);
    fx->st.config.segment_records = true;
    assert_int_equal(subscribe(fx, C_X + 1, norec, OWNER(C_X + 1)), KVP_ERR_UNSUPPORTED);
    /* the setting is the one at mount: turning it on later changes nothing for it */
    assert_int_equal(subscribe(fx, C_X + 1, norec, OWNER(C_X + 1)), KVP_ERR_UNSUPPORTED);
    /* the owner's connection closed: its segment, and its record, are gone */
    kvp_dispatch_conn_closed(&fx->st, C_P);
    assert_int_equal(subscribe(fx, C_X + 2, fx->p, OWNER(C_P)), KVP_ERR_SEGMENT_GONE);
    /* a put to the unrecorded segment (the only open one left) queues nothing */
    fx->st.segments.records_dirty = false;
    uint64_t seg;
    put(fx, "nr", 100, 1, NULL, &seg, NULL);
    assert_int_equal(seg, norec);
    assert_int_equal(seg_of(fx, norec)->rec_len, 0);
    assert_false(listed(fx, norec));
    assert_false(fx->st.segments.records_dirty);
}

static void test_adopted_entries_not_recorded(void **state)
{
    fx_t *fx = *state;
    assert_true(seg_of(fx, fx->a)->record);
    fx->st.segments.records_dirty = false;
    assert_int_equal(adopt1(fx, C_A, fx->a, "ad", fx->v, 640, 100, 1, 0), KVP_OK);
    changes(fx, fx->a, NULL, 0); /* its owner has it already */
    /* one more replica of a put's value: neither segment hears of it */
    put(fx, "pv", 100, 7, NULL, NULL, NULL);
    changes(fx, fx->p, (rec_t[2]){0}, 2);
    uint64_t v = lookup(fx, "pv")->version;
    assert_int_equal(adopt1(fx, C_B, fx->b, "pv", v, 0, 100, 7, 0), KVP_OK);
    assert_int_equal(get(fx, "pv").n, 2);
    changes(fx, fx->b, NULL, 0);
    changes(fx, fx->p, NULL, 0);
    /* refused entries neither: the owner drops them itself */
    assert_int_equal(adopt1(fx, C_A, fx->a, "bad", fx->v, 32, 100, 1, 0), KVP_ERR_INVALID_ARG);
    changes(fx, fx->a, NULL, 0);
    /* but a remove of an adopted object is its owner's to hear of */
    assert_int_equal(keys_op(fx, KVP_RPC_REMOVE, "ad"), KVP_OK);
    rec_t r[2];
    assert_int_equal(changes(fx, fx->a, r, 2), 1);
    assert_int_equal(r[0].op, 2);
    assert_int_equal(r[0].offset, 640);
    /* and of the merged one, both owners */
    assert_int_equal(keys_op(fx, KVP_RPC_REMOVE, "pv"), KVP_OK);
    assert_int_equal(changes(fx, fx->b, r, 2), 1);
    assert_int_equal(r[0].op, 2);
    assert_int_equal(r[0].offset, 0);
    assert_int_equal(changes(fx, fx->p, r, 2), 1);
    assert_int_equal(r[0].op, 2);
}

/* ---- a segment dropped for silence, and taken back (meta/limbo.c) ---- */

#define C_X2 6 /* the same owner's connection after it came back */

/* X (memory "@mem-x") holds k1, k2, k3 and is dropped as its owner's connection closes;
 * k2 is put anew on P meanwhile. */
static void dropped_x(fx_t *fx, uint64_t *x_p)
{
    uint64_t x = mount_mem(&fx->st, C_X, "dram-x", "dram", SEG, false, "@mem-x");
    uint64_t seg;
    put(fx, "k1", 100, 1, NULL, &seg, NULL);
    assert_int_equal(seg, x);
    put(fx, "k2", 100, 2, NULL, NULL, NULL);
    put(fx, "k3", 100, 3, NULL, NULL, NULL);
    uint8_t *buf = NULL; /* what the server streamed to the owner (lost on the way) */
    size_t len = 0;
    kvp_record_take(seg_of(fx, x), &buf, &len);
    free(buf);
    kvp_dispatch_conn_closed(&fx->st, C_X);
    assert_null(kvp_segment_table_get(&fx->st.segments, x));
    assert_null(lookup(fx, "k1"));
    assert_non_null(fx->st.limbo);
    assert_int_equal(fx->st.limbo->n, 3);
    fx->p = mount(&fx->st, C_P, "dram-p", "dram", SEG, false);
    put(fx, "k2", 100, 22, NULL, &seg, NULL); /* a newer value of k2, on P */
    assert_int_equal(seg, fx->p);
    *x_p = x;
}

static void test_dropped_segment_taken_back(void **state)
{
    fx_t *fx = *state;
    uint64_t x;
    dropped_x(fx, &x);
    uint64_t v2 = lookup(fx, "k2")->version;
    /* the same segment mounts again and offers a record that lacks k3 (its ADD was lost) */
    uint64_t x2 = mount_mem(&fx->st, C_X2, "dram-x", "dram", SEG, true, "@mem-x");
    assert_null(fx->st.limbo);
    ent_t had = {"k1", 0, 0, 100, 1, 0};
    kvp_segment_t *s = seg_of(fx, x2);
    assert_non_null(s->limbo);
    for (size_t i = 0; i < s->limbo->n; i++)
        if (strcmp(s->limbo->e[i].key, "k1") == 0) {
            had.version = s->limbo->e[i].version;
            had.offset = s->limbo->e[i].offset;
        }
    int32_t st1;
    assert_int_equal(adopt(fx, C_X2, x2, &had, 1, true, &st1), KVP_OK);
    assert_int_equal(st1, KVP_OK);
    /* k1 from the offer, k3 taken back, k2 stays P's newer value */
    got_t g = get(fx, "k1");
    assert_int_equal(g.n, 1);
    g = get(fx, "k3");
    assert_int_equal(g.n, 1);
    assert_int_equal(lookup(fx, "k3")->replicas[0].segment_id, x2);
    assert_int_equal(lookup(fx, "k3")->crc32c, 3);
    assert_int_equal(lookup(fx, "k2")->version, v2);
    assert_int_equal(lookup(fx, "k2")->replicas[0].segment_id, fx->p);
    assert_int_equal(fx->st.stats.taken_back, 1);
    assert_int_equal(fx->st.stats.limbo_expired, 1);
    assert_int_equal(fx->st.stats.adopted, 1);
    assert_int_equal(fx->st.stats.adopt_refused, 0);
    assert_null(s->limbo);
    /* the owner's record hears of k3 (and of nothing else) */
    rec_t r[4];
    assert_int_equal(changes(fx, x2, r, 4), 1);
    assert_int_equal(r[0].op, 1);
    assert_int_equal(r[0].key_len, 2);
    assert_memory_equal(r[0].key, "k3", 2);
    assert_int_equal(r[0].crc, 3);
    /* and a new put may land there now */
    assert_false(s->adopting);
}

static void test_dropped_segment_other_memory_gets_nothing(void **state)
{
    fx_t *fx = *state;
    uint64_t x;
    dropped_x(fx, &x);
    /* the owner restarted: the same name, other memory */
    uint64_t x2 = mount_mem(&fx->st, C_X2, "dram-x", "dram", SEG, true, "@mem-x-2");
    assert_null(fx->st.limbo);
    assert_null(seg_of(fx, x2)->limbo);
    assert_int_equal(adopt(fx, C_X2, x2, NULL, 0, true, NULL), KVP_OK);
    assert_null(lookup(fx, "k1"));
    assert_null(lookup(fx, "k3"));
    assert_int_equal(fx->st.stats.taken_back, 0);
    assert_int_equal(fx->st.stats.limbo_expired, 3);
}

static void test_dropped_segment_grace_passes(void **state)
{
    fx_t *fx = *state;
    uint64_t x;
    dropped_x(fx, &x);
    fx->st.now_ms += fx->st.config.segment_grace_ms - 1;
    kvp_segment_limbo_expire(&fx->st);
    assert_non_null(fx->st.limbo);
    fx->st.now_ms += 1;
    kvp_segment_limbo_expire(&fx->st);
    assert_null(fx->st.limbo);
    assert_int_equal(fx->st.stats.limbo_expired, 3);
    uint64_t x2 = mount_mem(&fx->st, C_X2, "dram-x", "dram", SEG, true, "@mem-x");
    assert_int_equal(adopt(fx, C_X2, x2, NULL, 0, true, NULL), KVP_OK);
    assert_null(lookup(fx, "k3"));
    assert_int_equal(fx->st.stats.taken_back, 0);
}

static void test_unmounted_segment_keeps_nothing(void **state)
{
    fx_t *fx = *state;
    uint64_t x = mount_mem(&fx->st, C_X, "dram-x", "dram", SEG, false, "@mem-x");
    put(fx, "k1", 100, 1, NULL, NULL, NULL);
    Kvpool__UnmountRequest req = KVPOOL__UNMOUNT_REQUEST__INIT;
    req.segment_id = x;
    Kvpool__UnmountResponse *r =
        svc_call(&fx->st, C_X, KVP_RPC_UNMOUNT, &req.base, &kvpool__unmount_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    svc_msg_free(r);
    assert_null(fx->st.limbo); /* its owner said it goes: its memory goes with it */
    /* and with --segment-grace 0 a silent one keeps nothing either */
    fx->st.config.segment_grace_ms = 0;
    mount_mem(&fx->st, C_X2, "dram-y", "dram", SEG, false, "@mem-y");
    put(fx, "k2", 100, 2, NULL, NULL, NULL);
    kvp_dispatch_conn_closed(&fx->st, C_X2);
    assert_null(fx->st.limbo);
}

/* The owner's stream took what the segment's record queue holds (or lost it: either way
 * it is gone from the queue). */
static void record_taken(fx_t *fx, uint64_t x)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    kvp_record_take(seg_of(fx, x), &buf, &len);
    free(buf);
}

/*
 * The changes a lost stream carried can free an extent without a tombstone (an upsert to
 * another size, an eviction) and give it to another object: the owner's record still has
 * the old object there, the limbo the new one. The offer against the limbo refuses the
 * stale entry, and the limbo's objects are taken back: z's new value and y.
 */
static void test_limbo_beats_a_stale_record(void **state)
{
    fx_t *fx = *state;
    uint64_t x = mount_mem(&fx->st, C_X, "dram-x", "dram", SEG, false, "@mem-x");
    uint64_t seg, oz, ow, oz2, oy;
    put(fx, "z", 100, 1, NULL, &seg, &oz);
    put(fx, "w", 100, 2, NULL, &seg, &ow);
    uint64_t vz1 = lookup(fx, "z")->version, vw = lookup(fx, "w")->version;
    record_taken(fx, x); /* the owner got these */
    put_opt_t up = {.upsert = true};
    put(fx, "z", 300, 11, &up, &seg, &oz2);
    put(fx, "y", 100, 3, NULL, &seg, &oy);
    uint64_t vz2 = lookup(fx, "z")->version, vy = lookup(fx, "y")->version;
    assert_int_equal(oy, oz); /* y took z's old extent */
    record_taken(fx, x);      /* these were lost with the stream */
    kvp_dispatch_conn_closed(&fx->st, C_X);
    uint64_t x2 = mount_mem(&fx->st, C_X2, "dram-x", "dram", SEG, true, "@mem-x");
    ent_t offer[2] = {{"w", vw, ow, 100, 2, 0}, {"z", vz1, oz, 100, 1, 0}};
    int32_t sts[2];
    assert_int_equal(adopt(fx, C_X2, x2, offer, 2, true, sts), KVP_OK);
    assert_int_equal(sts[0], KVP_OK);
    assert_int_equal(sts[1], KVP_ERR_NOT_FOUND); /* stale: refused */
    kvp_object_t *z = lookup(fx, "z"), *y = lookup(fx, "y");
    assert_non_null(z);
    assert_int_equal(z->version, vz2);
    assert_int_equal(z->replicas[0].offset, oz2);
    assert_non_null(y);
    assert_int_equal(y->version, vy);
    assert_int_equal(y->replicas[0].offset, oy);
    assert_int_equal(fx->st.stats.taken_back, 2);
}

/* An upsert in place (same size, same extent) whose changes were lost: the record offers
 * the old version at the same extent; the limbo's newer one wins. */
static void test_limbo_beats_an_in_place_upsert(void **state)
{
    fx_t *fx = *state;
    uint64_t x = mount_mem(&fx->st, C_X, "dram-x", "dram", SEG, false, "@mem-x");
    uint64_t seg, oz, oz2;
    put(fx, "z", 100, 1, NULL, &seg, &oz);
    uint64_t vz1 = lookup(fx, "z")->version;
    record_taken(fx, x);
    put_opt_t up = {.upsert = true};
    put(fx, "z", 100, 11, &up, &seg, &oz2);
    uint64_t vz2 = lookup(fx, "z")->version;
    record_taken(fx, x);
    kvp_dispatch_conn_closed(&fx->st, C_X);
    uint64_t x2 = mount_mem(&fx->st, C_X2, "dram-x", "dram", SEG, true, "@mem-x");
    ent_t offer[1] = {{"z", vz1, oz, 100, 1, 0}};
    int32_t sts[1];
    assert_int_equal(adopt(fx, C_X2, x2, offer, 1, true, sts), KVP_OK);
    assert_int_equal(sts[0], KVP_ERR_NOT_FOUND);
    kvp_object_t *z = lookup(fx, "z");
    assert_non_null(z);
    assert_int_equal(z->version, vz2);
    assert_int_equal(z->crc32c, 11);
}

/* A segment dropped empty keeps an (empty) limbo: a record that still lists an object
 * whose removal it missed offers it in vain. */
static void test_empty_limbo_refuses_the_record(void **state)
{
    fx_t *fx = *state;
    uint64_t x = mount_mem(&fx->st, C_X, "dram-x", "dram", SEG, false, "@mem-x");
    uint64_t seg, oz;
    put(fx, "z", 100, 1, NULL, &seg, &oz);
    uint64_t vz1 = lookup(fx, "z")->version;
    record_taken(fx, x);
    assert_int_equal(keys_op(fx, KVP_RPC_REMOVE, "z"), KVP_OK);
    /* as an eviction leaves it: no tombstone (the table is a bounded cache, too) */
    kvp_tombstone_cleanup(&fx->st.tombstones);
    memset(&fx->st.tombstones, 0, sizeof(fx->st.tombstones));
    record_taken(fx, x); /* its DEL was lost */
    kvp_dispatch_conn_closed(&fx->st, C_X);
    assert_non_null(fx->st.limbo);
    assert_int_equal(fx->st.limbo->n, 0);
    uint64_t x2 = mount_mem(&fx->st, C_X2, "dram-x", "dram", SEG, true, "@mem-x");
    ent_t offer[1] = {{"z", vz1, oz, 100, 1, 0}};
    int32_t sts[1];
    assert_int_equal(adopt(fx, C_X2, x2, offer, 1, true, sts), KVP_OK);
    assert_int_equal(sts[0], KVP_ERR_NOT_FOUND);
    assert_null(lookup(fx, "z"));
}

#define C_X3 7 /* and again */

/* Three objects at their extents, as an owner's record lists them. */
typedef struct three {
    ent_t e[3];
} three_t;

static three_t record_of_three(fx_t *fx, uint64_t x)
{
    three_t t;
    const char *keys[3] = {"k1", "k2", "k3"};
    for (unsigned i = 0; i < 3; i++) {
        uint64_t seg, off;
        put(fx, keys[i], 100, i + 1, NULL, &seg, &off);
        assert_int_equal(seg, x);
        t.e[i] = (ent_t){keys[i], lookup(fx, keys[i])->version, off, 100, i + 1, 0};
    }
    record_taken(fx, x);
    return t;
}

/*
 * Dropped again while the offer it came back from a limbo with runs (one batch adopted):
 * that limbo is kept again, whole, and the next offer has everything adopted.
 */
static void test_dropped_again_during_its_offer(void **state)
{
    fx_t *fx = *state;
    uint64_t x = mount_mem(&fx->st, C_X, "dram-x", "dram", SEG, false, "@mem-x");
    three_t t = record_of_three(fx, x);
    kvp_dispatch_conn_closed(&fx->st, C_X);
    uint64_t x2 = mount_mem(&fx->st, C_X2, "dram-x", "dram", SEG, true, "@mem-x");
    int32_t sts[3];
    assert_int_equal(adopt(fx, C_X2, x2, t.e, 1, false, sts), KVP_OK); /* k1, not the last */
    assert_int_equal(sts[0], KVP_OK);
    kvp_dispatch_conn_closed(&fx->st, C_X2);
    assert_non_null(fx->st.limbo);
    assert_int_equal(fx->st.limbo->n, 3);
    uint64_t x3 = mount_mem(&fx->st, C_X3, "dram-x", "dram", SEG, true, "@mem-x");
    assert_int_equal(adopt(fx, C_X3, x3, t.e, 3, true, sts), KVP_OK);
    for (unsigned i = 0; i < 3; i++) {
        assert_int_equal(sts[i], KVP_OK);
        assert_non_null(lookup(fx, t.e[i].key));
    }
}

/*
 * After a master restart (no limbo), dropped during its offer: the index held only what was
 * adopted, so the limbo made then is partial, and the next offer is checked as after a
 * restart: everything adopted, not refused for missing from it.
 */
static void test_dropped_during_an_offer_after_a_restart(void **state)
{
    fx_t *fx = *state;
    uint64_t x = mount_mem(&fx->st, C_X, "dram-x", "dram", SEG, false, "@mem-x");
    three_t t = record_of_three(fx, x);
    /* a new master: nothing in its index, the owner mounts with its record */
    kvp_master_config_t cfg = fx->st.config;
    kvp_master_state_cleanup(&fx->st);
    assert_int_equal(kvp_master_state_init(&fx->st), KVP_OK);
    fx->st.config = cfg;
    fx->st.rng = 0x5EED;
    fx->st.now_ms = 0;
    uint64_t x2 = mount_mem(&fx->st, C_X2, "dram-x", "dram", SEG, true, "@mem-x");
    int32_t sts[3];
    assert_int_equal(adopt(fx, C_X2, x2, t.e, 1, false, sts), KVP_OK);
    kvp_dispatch_conn_closed(&fx->st, C_X2);
    assert_non_null(fx->st.limbo);
    assert_true(fx->st.limbo->partial);
    uint64_t x3 = mount_mem(&fx->st, C_X3, "dram-x", "dram", SEG, true, "@mem-x");
    assert_int_equal(adopt(fx, C_X3, x3, t.e, 3, true, sts), KVP_OK);
    for (unsigned i = 0; i < 3; i++) {
        assert_int_equal(sts[i], KVP_OK);
        assert_non_null(lookup(fx, t.e[i].key));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unknown_key_adopted_and_readable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_same_value_from_two_segments_merges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_older_version_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_version_replaces_masters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_removed_since_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlapping_extent_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_entries_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_huge_size_refused_as_invalid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_in_flight_wins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pins_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_only_the_owner_adopts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_statuses_per_entry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adopting_segment_takes_no_put, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_version_clock_passes_adopted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_add_then_del, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_two_puts_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_subscribe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_unsupported_and_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adopted_entries_not_recorded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dropped_segment_taken_back, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_dropped_segment_other_memory_gets_nothing, setup_bare,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_dropped_segment_grace_passes, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_unmounted_segment_keeps_nothing, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_limbo_beats_a_stale_record, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_limbo_beats_an_in_place_upsert, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_empty_limbo_refuses_the_record, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_dropped_again_during_its_offer, setup_bare, teardown),
        cmocka_unit_test_setup_teardown(test_dropped_during_an_offer_after_a_restart, setup_bare,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
