/*
 * test_eviction.c - unit tests for master/eviction.c: the master as a cache.
 *
 * Drives kvp_service_handle the way the server does (packed protobuf-c
 * requests in, packed responses out) and checks what a client sees: which
 * keys EXIST after a put that made the master evict, what REMOVE answers
 * for a leased key, what a put into a pool of pinned objects answers. The
 * master clock (st->now_ms) is set by the tests, so leases, soft pins and
 * put timeouts are exercised at their exact boundaries without sleeping.
 *
 * Accounting is exact: segments are whole multiples of the master's 64-byte
 * granularity and objects are 64 bytes, so "used" is 64 x resident objects
 * and the watermarks translate into object counts (worked out per test).
 *
 * Each test gets a fresh master state from the fixture; memory a test needs
 * beyond one call (key sets, the reference model) is owned by the fixture,
 * so an assertion that fails mid-test leaks nothing.
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
#include <time.h>

#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "master/master.h"
#include "tests/unit/master/svc_call.h"

#define C1 1
#define C2 2
#define C3 3

/* Object size in every test: one 64-byte extent, so accounting is exact. */
#define OBJ 64u

#define MAX_OWNED 8

typedef struct fixture {
    kvp_master_state_t st;
    void *owned[MAX_OWNED]; /* freed by teardown */
    unsigned n_owned;
} fixture_t;

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));
    if (fx == NULL)
        return -1;
    if (kvp_master_state_init(&fx->st) != KVP_OK) {
        free(fx);
        return -1;
    }
    kvp_master_state_t *st = &fx->st;
    st->rng = 0x5EED5EED5EED5EEDull; /* reproducible placement */
    st->now_ms = 0;
    /* the documented defaults, spelled out: the tests' arithmetic depends on them */
    st->config.evict = true;
    st->config.evict_high = 0.95;
    st->config.evict_low = 0.85;
    st->config.lease_ttl_ms = 5000;
    st->config.put_timeout_ms = 30000;
    st->config.soft_pin_ttl_s = 1800;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_cleanup(&fx->st);
    for (unsigned i = 0; i < fx->n_owned; i++)
        free(fx->owned[i]);
    free(fx);
    return 0;
}

/* Zeroed memory that lives until teardown. */
static void *fx_alloc(fixture_t *fx, size_t bytes)
{
    assert_true(fx->n_owned < MAX_OWNED);
    void *p = calloc(1, bytes ? bytes : 1);
    assert_non_null(p);
    fx->owned[fx->n_owned++] = p;
    return p;
}

/* n keys "<prefix><i>", i = 0..n-1, owned by the fixture. */
static const char **keyset(fixture_t *fx, const char *prefix, size_t n)
{
    size_t one = strlen(prefix) + 21;
    const char **ptrs = fx_alloc(fx, n * sizeof(*ptrs) + n * one);
    char *names = (char *)(ptrs + n);
    for (size_t i = 0; i < n; i++) {
        snprintf(names + i * one, one, "%s%zu", prefix, i);
        ptrs[i] = names + i * one;
    }
    return ptrs;
}

/* ---- request/response plumbing (svc_call.h) ---- */

static int32_t mount_seg(kvp_master_state_t *st, uint64_t conn, const char *name, const char *host,
                         uint64_t size, uint64_t *id_p)
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
    Kvpool__MountResponse *r =
        svc_call(st, conn, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
    int32_t status = r->status;
    if (id_p)
        *id_p = r->segment_id;
    svc_msg_free(r);
    return status;
}

/* Keys travel as protobuf bytes: build the array from C strings (reused buffer). */

/* Sizes and CRCs of a batch: a reused, zeroed buffer (one batch at a time). */
static void *scratch_buf;
static size_t scratch_cap;
static void scratch_free(void)
{
    free(scratch_buf);
}
static void *scratch(size_t bytes)
{
    if (bytes > scratch_cap) {
        if (scratch_buf == NULL)
            atexit(scratch_free);
        scratch_buf = realloc(scratch_buf, bytes);
        assert_non_null(scratch_buf);
        scratch_cap = bytes;
    }
    memset(scratch_buf, 0, bytes);
    return scratch_buf;
}

static Kvpool__PutStartResponse *put_start(kvp_master_state_t *st, uint64_t conn,
                                           const char *const *keys, size_t n_keys,
                                           const uint64_t *sizes, size_t n_sizes, unsigned pin,
                                           uint32_t soft_pin_ttl_s)
{
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    req.keys = svc_keys(keys, n_keys);
    req.n_keys = n_keys;
    req.sizes = (uint64_t *)sizes;
    req.n_sizes = n_sizes;
    cfg.replica_num = 1;
    cfg.pin = pin;
    cfg.soft_pin_ttl_s = soft_pin_ttl_s;
    req.config = &cfg;
    return svc_call(st, conn, KVP_RPC_PUT_START, &req.base,
                    &kvpool__put_start_response__descriptor);
}

/* One key: its per-key status. */
static int32_t put1_pin(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
                        unsigned pin, uint32_t soft_pin_ttl_s)
{
    Kvpool__PutStartResponse *r = put_start(st, conn, &key, 1, &size, 1, pin, soft_pin_ttl_s);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 1);
    int32_t s = r->results[0]->status;
    if (s == KVP_OK) {
        assert_int_equal(r->results[0]->n_replicas, 1);
        assert_int_equal(r->results[0]->replicas[0]->length, size);
    } else {
        assert_int_equal(r->results[0]->n_replicas, 0);
    }
    svc_msg_free(r);
    return s;
}

static int32_t put1(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size)
{
    return put1_pin(st, conn, key, size, KVP_PIN_NONE, 0);
}

static Kvpool__StatusesResponse *keys_call(kvp_master_state_t *st, uint64_t conn, uint16_t method,
                                           const char *const *keys, size_t n, bool force)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(keys, n);
    req.n_keys = n;
    req.force = force;
    return svc_call(st, conn, method, &req.base, &kvpool__statuses_response__descriptor);
}

static int32_t keys1(kvp_master_state_t *st, uint64_t conn, uint16_t method, const char *key,
                     bool force)
{
    Kvpool__StatusesResponse *r = keys_call(st, conn, method, &key, 1, force);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

static Kvpool__StatusesResponse *put_end(kvp_master_state_t *st, uint64_t conn,
                                         const char *const *keys, size_t n_keys,
                                         const uint32_t *crcs, size_t n_crcs)
{
    Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
    req.keys = svc_keys(keys, n_keys);
    req.n_keys = n_keys;
    req.crc32c = (uint32_t *)crcs;
    req.n_crc32c = n_crcs;
    return svc_call(st, conn, KVP_RPC_PUT_END, &req.base, &kvpool__statuses_response__descriptor);
}

static int32_t end1(kvp_master_state_t *st, uint64_t conn, const char *key, uint32_t crc)
{
    Kvpool__StatusesResponse *r = put_end(st, conn, &key, 1, &crc, 1);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

/* PutStart keys[0..n) of OBJ bytes each in one request; every key must be accepted. */
static void start_batch(kvp_master_state_t *st, uint64_t conn, const char *const *keys, size_t n,
                        unsigned pin, uint32_t soft_pin_ttl_s)
{
    uint64_t *sizes = scratch(n * sizeof(*sizes));
    for (size_t i = 0; i < n; i++)
        sizes[i] = OBJ;
    Kvpool__PutStartResponse *r = put_start(st, conn, keys, n, sizes, n, pin, soft_pin_ttl_s);
    int32_t whole = r->status;
    size_t n_results = r->n_results, bad = n;
    int32_t bad_status = 0;
    for (size_t i = 0; i < n_results && bad == n; i++)
        if (r->results[i]->status != KVP_OK) {
            bad = i;
            bad_status = r->results[i]->status;
        }
    svc_msg_free(r);
    assert_int_equal(whole, KVP_OK);
    assert_int_equal(n_results, n);
    if (bad < n)
        fail_msg("PutStart of %s (key %zu of a batch of %zu) answered %d, want KVP_OK", keys[bad],
                 bad, n, bad_status);
}

/* PutEnd keys[0..n) in one request; every key must complete. */
static void end_batch(kvp_master_state_t *st, uint64_t conn, const char *const *keys, size_t n)
{
    uint32_t *crcs = scratch(n * sizeof(*crcs));
    Kvpool__StatusesResponse *r = put_end(st, conn, keys, n, crcs, n);
    int32_t whole = r->status;
    size_t n_statuses = r->n_statuses, bad = n;
    int32_t bad_status = 0;
    for (size_t i = 0; i < n_statuses && bad == n; i++)
        if (r->statuses[i] != KVP_OK) {
            bad = i;
            bad_status = r->statuses[i];
        }
    svc_msg_free(r);
    assert_int_equal(whole, KVP_OK);
    assert_int_equal(n_statuses, n);
    if (bad < n)
        fail_msg("PutEnd of %s answered %d, want KVP_OK", keys[bad], bad_status);
}

/* Put keys[0..n) one request at a time (PutStart + PutEnd each), so each is its own LRU step. */
static void put_each(kvp_master_state_t *st, const char *const *keys, size_t n, unsigned pin,
                     uint32_t soft_pin_ttl_s)
{
    for (size_t i = 0; i < n; i++) {
        start_batch(st, C1, &keys[i], 1, pin, soft_pin_ttl_s);
        end_batch(st, C1, &keys[i], 1);
    }
}

/* EXIST for keys[0..n) into out[] (1 resident, 0 not, or a negative status). */
static void exist_many(kvp_master_state_t *st, const char *const *keys, size_t n, int32_t *out)
{
    Kvpool__StatusesResponse *r = keys_call(st, C3, KVP_RPC_EXIST, keys, n, false);
    int32_t whole = r->status;
    size_t n_statuses = r->n_statuses;
    for (size_t i = 0; i < n_statuses && i < n; i++)
        out[i] = r->statuses[i];
    svc_msg_free(r);
    assert_int_equal(whole, KVP_OK);
    assert_int_equal(n_statuses, n);
}

/* Every key of keys[from, to) exists (want 1) or does not (want 0). */
static void expect_exist(kvp_master_state_t *st, const char *const *keys, size_t from, size_t to,
                         int32_t want)
{
    if (from >= to)
        return;
    int32_t *got = scratch((to - from) * sizeof(*got));
    exist_many(st, keys + from, to - from, got);
    for (size_t i = 0; i < to - from; i++)
        if (got[i] != want)
            fail_msg("EXIST %s answered %d, want %d (%s)", keys[from + i], got[i], want,
                     want ? "it should be resident" : "it should have been evicted");
}

static int32_t exist1(kvp_master_state_t *st, const char *key)
{
    int32_t v;
    exist_many(st, &key, 1, &v);
    return v;
}

static Kvpool__GetReplicaListResponse *replicas(kvp_master_state_t *st, const char *const *keys,
                                                size_t n)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(keys, n);
    req.n_keys = n;
    return svc_call(st, C3, KVP_RPC_GET_REPLICA_LIST, &req.base,
                    &kvpool__get_replica_list_response__descriptor);
}

/* Per-key status of GET_REPLICA_LIST for one key; *lease_ttl_p gets the granted lease. */
static int32_t read1(kvp_master_state_t *st, const char *key, uint32_t *lease_ttl_p)
{
    Kvpool__GetReplicaListResponse *r = replicas(st, &key, 1);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 1);
    int32_t s = r->results[0]->status;
    if (s == KVP_OK)
        assert_int_equal(r->results[0]->n_replicas, 1);
    else
        assert_int_equal(r->results[0]->n_replicas, 0);
    if (lease_ttl_p)
        *lease_ttl_p = r->lease_ttl_ms;
    svc_msg_free(r);
    return s;
}

typedef struct stat_snap {
    uint64_t capacity, used, objects, pending;
    uint64_t evicted_objects, evicted_bytes, put_timeouts;
} stat_snap_t;

static stat_snap_t stat_get(kvp_master_state_t *st)
{
    Kvpool__StatRequest req = KVPOOL__STAT_REQUEST__INIT;
    Kvpool__StatResponse *r =
        svc_call(st, C3, KVP_RPC_STAT, &req.base, &kvpool__stat_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    stat_snap_t s = {.capacity = r->capacity,
                     .used = r->used,
                     .objects = r->objects,
                     .pending = r->pending,
                     .evicted_objects = r->evicted_objects,
                     .evicted_bytes = r->evicted_bytes,
                     .put_timeouts = r->put_timeouts};
    svc_msg_free(r);
    return s;
}

/* ---- 1. exact LRU order, against a reference model ---- */

/*
 * One 64-object segment. 95% of 64 objects is 60.8, so the 61st object
 * (counting the one being put, still PENDING) passes the high watermark;
 * 85% is 54.4, so eviction stops when 54 are left.
 */
#define LRU_SLOTS 64
#define LRU_HIGH_OBJS 60 /* the most objects the pool holds without evicting */
#define LRU_LOW_OBJS 54  /* what an eviction run leaves */
#define LRU_STEPS 4000

typedef struct lru_ref {
    const char **keys;
    uint32_t order[LRU_SLOTS + 1]; /* resident key numbers, least recently used first */
    size_t n;
    bool *resident; /* by key number */
    uint32_t next_key;
    uint64_t evicted;       /* objects the master evicted so far */
    uint64_t eviction_runs; /* puts that made it evict */
} lru_ref_t;

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* A new key is put; the master may evict, and must evict the model's least recent keys. */
static void lru_put(kvp_master_state_t *st, lru_ref_t *ref, unsigned step)
{
    uint32_t k = ref->next_key++;
    const char *key = ref->keys[k];
    int32_t s = put1(st, C1, key, OBJ);
    if (s != KVP_OK)
        fail_msg("step %u: PutStart %s answered %d with %zu objects resident", step, key, s,
                 ref->n);

    /* Which of the model's resident keys are gone? They must be its LRU prefix. */
    const char *names[LRU_SLOTS + 1];
    int32_t ex[LRU_SLOTS + 1];
    for (size_t i = 0; i < ref->n; i++)
        names[i] = ref->keys[ref->order[i]];
    exist_many(st, names, ref->n, ex);
    size_t gone = 0;
    while (gone < ref->n && ex[gone] == 0)
        gone++;
    for (size_t i = gone; i < ref->n; i++) {
        if (ex[i] != 1)
            fail_msg("step %u (put %s): the master evicted %s (recency rank %zu of %zu, 0 = "
                     "least recent) but kept %s (rank %zu), which was used less recently",
                     step, key, names[i], i, ref->n, names[gone], gone);
    }
    size_t objects = ref->n + 1; /* the new one holds its space while PENDING */
    if (objects > LRU_HIGH_OBJS) {
        if (objects - gone != LRU_LOW_OBJS)
            fail_msg("step %u (put %s): %zu objects passed the high watermark; the master "
                     "evicted %zu, leaving %zu, want %d (the low watermark)",
                     step, key, objects, gone, objects - gone, LRU_LOW_OBJS);
    } else if (gone != 0) {
        fail_msg("step %u (put %s): %zu objects are below the high watermark, yet the master "
                 "evicted %zu (%s first)",
                 step, key, objects, gone, names[0]);
    }
    for (size_t i = 0; i < gone; i++)
        ref->resident[ref->order[i]] = false;
    memmove(ref->order, ref->order + gone, (ref->n - gone) * sizeof(ref->order[0]));
    ref->n -= gone;
    ref->evicted += gone;
    ref->eviction_runs += gone > 0;

    assert_int_equal(end1(st, C1, key, 0), KVP_OK);
    ref->order[ref->n++] = k;
    ref->resident[k] = true;

    assert_int_equal(st->stats.evicted_objects, ref->evicted);
    assert_int_equal(st->stats.evicted_bytes, ref->evicted * OBJ);
    assert_int_equal(st->stats.evictions, ref->eviction_runs);
    uint64_t used = kvp_master_used(st);
    assert_int_equal(used, ref->n * OBJ);
    assert_true(used <= st->segments.capacity);
}

/* Move key k to the model's MRU end (it was just read). */
static void lru_touch(lru_ref_t *ref, uint32_t k)
{
    size_t i = 0;
    while (i < ref->n && ref->order[i] != k)
        i++;
    assert_true(i < ref->n);
    memmove(ref->order + i, ref->order + i + 1, (ref->n - i - 1) * sizeof(ref->order[0]));
    ref->order[ref->n - 1] = k;
}

/* Read 1..4 keys in one GET_REPLICA_LIST: resident ones (maybe twice), sometimes an evicted one. */
static void lru_read(kvp_master_state_t *st, lru_ref_t *ref, uint64_t *rng, unsigned step)
{
    const char *names[4];
    uint32_t nums[4];
    size_t m = 1 + xorshift(rng) % 4;
    for (size_t j = 0; j < m; j++) {
        uint32_t k = ref->order[xorshift(rng) % ref->n];
        if (xorshift(rng) % 8 == 0 && ref->evicted > 0) {
            do
                k = (uint32_t)(xorshift(rng) % ref->next_key);
            while (ref->resident[k]);
        }
        nums[j] = k;
        names[j] = ref->keys[k];
    }
    Kvpool__GetReplicaListResponse *r = replicas(st, names, m);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, m);
    for (size_t j = 0; j < m; j++) {
        int32_t want = ref->resident[nums[j]] ? KVP_OK : KVP_ERR_NOT_FOUND;
        if (r->results[j]->status != want)
            fail_msg("step %u: GET_REPLICA_LIST %s answered %d, want %d", step, names[j],
                     r->results[j]->status, want);
        if (want == KVP_OK)
            assert_int_equal(r->results[j]->size, OBJ);
    }
    svc_msg_free(r);
    /* a batch touches its keys in request order: the last one read is the most recent */
    for (size_t j = 0; j < m; j++)
        if (ref->resident[nums[j]])
            lru_touch(ref, nums[j]);
}

static void test_lru_order_matches_reference(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    st->config.lease_ttl_ms = 0; /* no leases: only recency decides */
    assert_int_equal(mount_seg(st, C1, "seg", "h1", LRU_SLOTS * OBJ, NULL), KVP_OK);

    lru_ref_t *ref = fx_alloc(fx, sizeof(*ref));
    ref->keys = keyset(fx, "lru/", LRU_SLOTS + LRU_STEPS);
    ref->resident = fx_alloc(fx, (LRU_SLOTS + LRU_STEPS) * sizeof(bool));

    for (unsigned i = 0; i < LRU_SLOTS; i++)
        lru_put(st, ref, i);
    assert_true(ref->evicted > 0); /* filling 64 slots passed the watermark */

    uint64_t rng = 0x0DDB1A5E5BAD5EEDull;
    unsigned puts = 0;
    for (unsigned step = 0; step < LRU_STEPS; step++) {
        if (xorshift(&rng) % 2 == 0) {
            lru_put(st, ref, LRU_SLOTS + step);
            puts++;
        } else {
            lru_read(st, ref, &rng, LRU_SLOTS + step);
        }
        /* the pool stays between the watermarks */
        assert_true(ref->n >= LRU_LOW_OBJS && ref->n <= LRU_HIGH_OBJS);
    }
    /* every run evicted 7 (61 -> 54): about one put in seven made the master evict */
    assert_true(puts > LRU_STEPS / 3);
    assert_int_equal(ref->evicted, LRU_SLOTS + puts - ref->n);

    stat_snap_t s = stat_get(st);
    assert_int_equal(s.evicted_objects, ref->evicted);
    assert_int_equal(s.evicted_bytes, ref->evicted * OBJ);
    assert_int_equal(s.objects, ref->n);
    assert_int_equal(s.used, ref->n * OBJ);
    assert_int_equal(s.pending, 0);
}

/* ---- 2. watermarks ---- */

/*
 * 100 slots: the high watermark (95%) is 95 objects, the low one (85%) 85.
 * One PutStart batch that takes the pool past 95% leaves it at 85% or less,
 * having evicted the least recently used, never the batch itself.
 */
static void test_watermarks_after_put_batch(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    const uint64_t cap = 100 * OBJ;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", cap, NULL), KVP_OK);
    const char **old = keyset(fx, "old/", 80);
    const char **batch = keyset(fx, "batch/", 16);
    const char **more = keyset(fx, "more/", 11);

    put_each(st, old, 80, KVP_PIN_NONE, 0);
    assert_int_equal(st->stats.evicted_objects, 0);
    assert_int_equal(kvp_master_used(st), 80 * OBJ);

    /* 80 + 16 = 96 objects: past 95%, evicted down to 85 */
    start_batch(st, C1, batch, 16, KVP_PIN_NONE, 0);
    uint64_t used = kvp_master_used(st);
    if (used > cap * 85 / 100)
        fail_msg("after a batch took the pool to 96%%, used is %llu of %llu (%llu%%), want at "
                 "most 85%%",
                 (unsigned long long)used, (unsigned long long)cap,
                 (unsigned long long)(used * 100 / cap));
    assert_int_equal(used, 85 * OBJ); /* and no more than needed */
    assert_int_equal(st->stats.evicted_objects, 11);
    end_batch(st, C1, batch, 16);
    expect_exist(st, old, 0, 11, 0);
    expect_exist(st, old, 11, 80, 1);
    expect_exist(st, batch, 0, 16, 1);

    /* 85 + 10 = 95 objects: at the high watermark, not past it: nothing goes */
    start_batch(st, C1, more, 10, KVP_PIN_NONE, 0);
    end_batch(st, C1, more, 10);
    assert_int_equal(kvp_master_used(st), 95 * OBJ);
    assert_int_equal(st->stats.evicted_objects, 11);
    /* one more is past it: the 11 least recently used go (old/11..old/21) */
    start_batch(st, C1, &more[10], 1, KVP_PIN_NONE, 0);
    end_batch(st, C1, &more[10], 1);
    assert_int_equal(kvp_master_used(st), 85 * OBJ);
    assert_int_equal(st->stats.evicted_objects, 22);
    expect_exist(st, old, 0, 22, 0);
    expect_exist(st, old, 22, 80, 1);
    expect_exist(st, batch, 0, 16, 1);
    expect_exist(st, more, 0, 11, 1);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.used, 85 * OBJ);
    assert_int_equal(s.objects, 85);
    assert_int_equal(s.evicted_objects, 22);
}

/* ---- 3. read leases, on the master clock ---- */

static void test_lease_blocks_remove_until_expiry(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    st->config.lease_ttl_ms = 5000;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    assert_int_equal(put1(st, C1, "leased", OBJ), KVP_OK);
    assert_int_equal(end1(st, C1, "leased", 0), KVP_OK);

    st->now_ms = 1000;
    uint32_t ttl = 0;
    assert_int_equal(read1(st, "leased", &ttl), KVP_OK);
    assert_int_equal(ttl, 5000); /* the reader is told how long it may read */

    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "leased", false), KVP_ERR_LEASED);
    assert_int_equal(KVP_ERR_LEASED, -28);
    st->now_ms = 5999;
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "leased", false), KVP_ERR_LEASED);
    assert_int_equal(exist1(st, "leased"), 1);
    st->now_ms = 6000; /* 1000 + 5000: the lease is over */
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "leased", false), KVP_OK);
    assert_int_equal(exist1(st, "leased"), 0);
    assert_int_equal(kvp_master_used(st), 0);
}

/*
 * A leased object is the least recently used one, and the pool fills past the
 * high watermark: eviction passes over it and takes the next ones. Once the
 * lease is over it is the first to go.
 */
static void test_lease_skipped_by_eviction(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    st->config.lease_ttl_ms = 5000;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    const char **others = keyset(fx, "other/", 67);

    st->now_ms = 1000;
    assert_int_equal(put1(st, C1, "leased", OBJ), KVP_OK);
    assert_int_equal(end1(st, C1, "leased", 0), KVP_OK);
    assert_int_equal(read1(st, "leased", NULL), KVP_OK); /* leased until 6000 */
    /* 60 newer objects: "leased" is the least recently used of 61 */
    put_each(st, others, 60, KVP_PIN_NONE, 0);
    assert_int_equal(st->stats.evicted_objects, 7); /* 61 -> 54 */
    assert_int_equal(exist1(st, "leased"), 1);
    expect_exist(st, others, 0, 7, 0);
    expect_exist(st, others, 7, 60, 1);
    assert_int_equal(kvp_master_used(st), 54 * OBJ);

    /* the lease is over: at the next eviction it goes first, with 6 others */
    st->now_ms = 6000;
    put_each(st, &others[60], 7, KVP_PIN_NONE, 0);
    assert_int_equal(st->stats.evicted_objects, 14);
    assert_int_equal(exist1(st, "leased"), 0);
    expect_exist(st, others, 0, 13, 0);
    expect_exist(st, others, 13, 67, 1);
}

static void test_force_remove_of_leased_key(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    st->config.lease_ttl_ms = 5000;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    assert_int_equal(put1(st, C1, "leased", OBJ), KVP_OK);
    assert_int_equal(end1(st, C1, "leased", 0), KVP_OK);
    st->now_ms = 1000;
    assert_int_equal(read1(st, "leased", NULL), KVP_OK);
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "leased", false), KVP_ERR_LEASED);
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "leased", true), KVP_OK);
    assert_int_equal(exist1(st, "leased"), 0);
    assert_int_equal(read1(st, "leased", NULL), KVP_ERR_NOT_FOUND);
    /* the reader's extent stays allocated until its lease ends (6000 ms) ... */
    assert_int_equal(kvp_master_used(st), OBJ);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, 0);
    assert_int_equal(s.evicted_objects, 0); /* a remove is not an eviction */
    st->now_ms = 5999;
    assert_int_equal(kvp_lease_expire(st), 0);
    assert_int_equal(kvp_master_used(st), OBJ);
    /* ... and then is freed */
    st->now_ms = 6000;
    assert_int_equal(kvp_lease_expire(st), 1);
    assert_int_equal(kvp_master_used(st), 0);
}

/* ---- 4. pins ---- */

/* Hard-pinned objects are older than unpinned ones: eviction passes over them. */
static void test_hard_pins_skipped_by_eviction(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    const char **hard = keyset(fx, "hard/", 30);
    const char **plain = keyset(fx, "plain/", 31);
    put_each(st, hard, 30, KVP_PIN_HARD, 0);
    put_each(st, plain, 31, KVP_PIN_NONE, 0); /* the 61st object: 7 go */
    assert_int_equal(st->stats.evicted_objects, 7);
    expect_exist(st, hard, 0, 30, 1);
    expect_exist(st, plain, 0, 7, 0);
    expect_exist(st, plain, 7, 31, 1);
}

/* A pool full of hard-pinned objects refuses a put, and the refused put leaves nothing. */
static void test_hard_pins_fill_pool(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    const char **hard = keyset(fx, "hard/", 64);
    put_each(st, hard, 64, KVP_PIN_HARD, 0);
    assert_int_equal(kvp_master_used(st), 64 * OBJ);

    assert_int_equal(put1(st, C2, "one-more", OBJ), KVP_ERR_POOL_FULL);
    assert_int_equal(put1_pin(st, C2, "soft-one", OBJ, KVP_PIN_SOFT, 60), KVP_ERR_POOL_FULL);
    assert_int_equal(exist1(st, "one-more"), 0);
    expect_exist(st, hard, 0, 64, 1);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.pending, 0);
    assert_int_equal(s.objects, 64);
    assert_int_equal(s.used, 64 * OBJ);
    assert_int_equal(s.evicted_objects, 0);
}

/* Soft-pinned objects, older than the unpinned ones, stay while unpinned ones can go. */
static void test_soft_pins_outlive_unpinned(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    const char **soft = keyset(fx, "soft/", 30);
    const char **plain = keyset(fx, "plain/", 38);
    put_each(st, soft, 30, KVP_PIN_SOFT, 60);
    put_each(st, plain, 31, KVP_PIN_NONE, 0); /* 61 objects: 7 go, all unpinned */
    assert_int_equal(st->stats.evicted_objects, 7);
    expect_exist(st, soft, 0, 30, 1);
    expect_exist(st, plain, 0, 7, 0);
    expect_exist(st, plain, 7, 31, 1);
    put_each(st, &plain[31], 7, KVP_PIN_NONE, 0); /* 61 again */
    assert_int_equal(st->stats.evicted_objects, 14);
    expect_exist(st, soft, 0, 30, 1);
    expect_exist(st, plain, 0, 14, 0);
    expect_exist(st, plain, 14, 38, 1);
}

/*
 * 58 soft-pinned and 2 unpinned objects, then a 61st: the first pass takes
 * the 2 unpinned ones (the most recent, yet not pinned), which is not enough
 * for the low watermark (54), so a second pass takes the 5 least recently
 * used soft-pinned ones.
 */
static void test_soft_pins_second_pass(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    const char **soft = keyset(fx, "soft/", 58);
    const char **plain = keyset(fx, "plain/", 3);
    put_each(st, soft, 58, KVP_PIN_SOFT, 60);
    put_each(st, plain, 2, KVP_PIN_NONE, 0);
    assert_int_equal(st->stats.evicted_objects, 0);
    put_each(st, &plain[2], 1, KVP_PIN_NONE, 0);
    assert_int_equal(st->stats.evicted_objects, 7);
    assert_int_equal(kvp_master_used(st), 54 * OBJ);
    expect_exist(st, plain, 0, 2, 0);
    expect_exist(st, plain, 2, 3, 1);
    expect_exist(st, soft, 0, 5, 0);
    expect_exist(st, soft, 5, 58, 1);
}

/*
 * Soft pins from the master's default TTL (10 s here) put at now = 0: at
 * 9.999 s they still protect; at 10 s they are over, and the soft-pinned
 * objects are plain LRU candidates (the oldest, so the first to go).
 */
static void test_soft_pin_expiry(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    st->config.soft_pin_ttl_s = 10;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    const char **soft = keyset(fx, "soft/", 30);
    const char **plain = keyset(fx, "plain/", 38);
    st->now_ms = 0;
    put_each(st, soft, 30, KVP_PIN_SOFT, 0); /* 0: the master's default */
    put_each(st, plain, 30, KVP_PIN_NONE, 0);

    st->now_ms = 9999;
    put_each(st, &plain[30], 1, KVP_PIN_NONE, 0);
    assert_int_equal(st->stats.evicted_objects, 7);
    expect_exist(st, soft, 0, 30, 1);
    expect_exist(st, plain, 0, 7, 0);

    st->now_ms = 10000;
    put_each(st, &plain[31], 7, KVP_PIN_NONE, 0);
    assert_int_equal(st->stats.evicted_objects, 14);
    expect_exist(st, soft, 0, 7, 0);
    expect_exist(st, soft, 7, 30, 1);
    expect_exist(st, plain, 7, 38, 1);
}

/* ---- 5. zombie puts ---- */

static void test_put_timeout_revokes_zombie(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    st->config.put_timeout_ms = 30000;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    st->now_ms = 0;
    assert_int_equal(put1(st, C1, "done", OBJ), KVP_OK);
    assert_int_equal(end1(st, C1, "done", 0), KVP_OK);
    uint64_t used_before = kvp_master_used(st);

    assert_int_equal(put1(st, C1, "zombie", 4 * OBJ), KVP_OK); /* never ended */
    assert_int_equal(kvp_master_used(st), used_before + 4 * OBJ);
    st->now_ms = 10000;
    assert_int_equal(put1(st, C1, "later", OBJ), KVP_OK); /* deadline 40000 */

    st->now_ms = 29999;
    assert_int_equal(kvp_expire_puts(st), 0);
    assert_int_equal(st->stats.put_timeouts, 0);
    assert_int_equal(put1(st, C2, "zombie", OBJ), KVP_ERR_PENDING);

    st->now_ms = 30000;
    assert_int_equal(kvp_expire_puts(st), 1);
    assert_int_equal(st->stats.put_timeouts, 1);
    assert_int_equal(kvp_master_used(st), used_before + OBJ); /* "later" is still pending */
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.put_timeouts, 1);
    assert_int_equal(s.pending, 1);
    assert_int_equal(exist1(st, "zombie"), 0);

    /* another connection takes the key over; the zombie writer cannot end it */
    assert_int_equal(put1(st, C2, "zombie", OBJ), KVP_OK);
    assert_int_equal(end1(st, C1, "zombie", 0), KVP_ERR_NOT_OWNER);
    assert_int_equal(end1(st, C2, "zombie", 0), KVP_OK);
    assert_int_equal(exist1(st, "zombie"), 1);
    assert_int_equal(exist1(st, "done"), 1);

    /* the other pending put has its own deadline */
    assert_int_equal(kvp_expire_puts(st), 0);
    st->now_ms = 40000;
    assert_int_equal(kvp_expire_puts(st), 1);
    assert_int_equal(st->stats.put_timeouts, 2);
    assert_int_equal(end1(st, C1, "later", 0), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_master_used(st), used_before + OBJ);
    assert_int_equal(stat_get(st).pending, 0);
}

/* ---- 6. store semantics ---- */

static void test_no_evict_refuses_when_full(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    st->config.evict = false;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    const char **keys = keyset(fx, "k/", 64);
    put_each(st, keys, 64, KVP_PIN_NONE, 0); /* through both watermarks */
    assert_int_equal(kvp_master_used(st), 64 * OBJ);

    assert_int_equal(put1(st, C2, "one-more", OBJ), KVP_ERR_POOL_FULL);
    expect_exist(st, keys, 0, 64, 1);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.evicted_objects, 0);
    assert_int_equal(s.pending, 0);
    assert_int_equal(s.objects, 64);
    assert_int_equal(st->stats.evictions, 0);
}

/* ---- 7. throughput ---- */

#define TP_OBJECTS (1u << 20)
#define TP_BATCH 65536u /* the largest batch the master takes */

static void test_eviction_throughput(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", (uint64_t)TP_OBJECTS * OBJ, NULL), KVP_OK);
    const char **keys = keyset(fx, "t/", TP_OBJECTS);
    st->config.evict = false; /* fill to 100% */
    for (size_t b = 0; b < TP_OBJECTS; b += TP_BATCH) {
        start_batch(st, C1, &keys[b], TP_BATCH, KVP_PIN_NONE, 0);
        end_batch(st, C1, &keys[b], TP_BATCH);
    }
    assert_int_equal(kvp_master_used(st), (uint64_t)TP_OBJECTS * OBJ);
    assert_int_equal(st->index.count, TP_OBJECTS);

    st->config.evict = true;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t freed = kvp_evict_to(st, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;

    assert_int_equal(freed, (uint64_t)TP_OBJECTS * OBJ);
    assert_int_equal(st->stats.evicted_objects, TP_OBJECTS);
    assert_int_equal(st->index.count, 0);
    assert_int_equal(kvp_master_used(st), 0);
    print_message("evicted %u objects in %.1f ms (%.0f objects/s)\n", TP_OBJECTS, ms,
                  ms > 0 ? TP_OBJECTS / (ms / 1e3) : 0.0);
}

/* Regression: a soft pin TTL past 2^32 s minus uptime wrapped to the past (no pin at all). */
static void test_soft_pin_huge_ttl_does_not_wrap(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    st->config.lease_ttl_ms = 0;
    assert_int_equal(mount_seg(st, C1, "seg", "h", 64 * OBJ, NULL), KVP_OK);
    st->now_ms = 5000 * 1000ull;
    assert_int_equal(put1_pin(st, C1, "pinned", OBJ, KVP_PIN_SOFT, UINT32_MAX), KVP_OK);
    assert_int_equal(end1(st, C1, "pinned", 0), KVP_OK);
    assert_int_equal(put1(st, C1, "a", OBJ), KVP_OK);
    assert_int_equal(end1(st, C1, "a", 0), KVP_OK);
    /* first pass must skip the pinned (older) object and take "a" */
    kvp_evict_to(st, kvp_master_used(st) - OBJ);
    assert_int_equal(exist1(st, "pinned"), 1);
    assert_int_equal(exist1(st, "a"), 0);
}

/* Regression: a 1 s soft pin set at 999 ms ended 1 ms later (whole-second rounding). */
static void test_soft_pin_never_ends_early(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    st->config.lease_ttl_ms = 0;
    assert_int_equal(mount_seg(st, C1, "seg", "h", 64 * OBJ, NULL), KVP_OK);
    st->now_ms = 999;
    assert_int_equal(put1_pin(st, C1, "pinned", OBJ, KVP_PIN_SOFT, 1), KVP_OK);
    assert_int_equal(end1(st, C1, "pinned", 0), KVP_OK);
    assert_int_equal(put1(st, C1, "a", OBJ), KVP_OK);
    assert_int_equal(end1(st, C1, "a", 0), KVP_OK);
    st->now_ms = 1998; /* 999 ms after the pin: still pinned */
    kvp_evict_to(st, kvp_master_used(st) - OBJ);
    assert_int_equal(exist1(st, "pinned"), 1);
    assert_int_equal(exist1(st, "a"), 0);
}

/* Regression: after evicting scattered small objects, a larger put must keep evicting
 * until it fits, not fail with POOL_FULL while evictable objects remain. */
static void test_fragmented_pool_keeps_evicting(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    st->config.lease_ttl_ms = 0;
    st->config.evict_high = 1.0; /* only the no-room path evicts here */
    st->config.evict_low = 1.0;
    assert_int_equal(mount_seg(st, C1, "seg", "h", 64 * OBJ, NULL), KVP_OK);
    char key[32];
    for (unsigned i = 0; i < 64; i++) {
        snprintf(key, sizeof(key), "k%u", i);
        assert_int_equal(put1(st, C1, key, OBJ), KVP_OK);
        assert_int_equal(end1(st, C1, key, 0), KVP_OK);
    }
    /* read the even keys: the odd ones become least recently used, scattered holes */
    for (unsigned i = 0; i < 64; i += 2) {
        snprintf(key, sizeof(key), "k%u", i);
        assert_int_equal(read1(st, key, NULL), KVP_OK);
    }
    assert_int_equal(put1(st, C1, "big", 4 * OBJ), KVP_OK);
    assert_int_equal(end1(st, C1, "big", 0), KVP_OK);
    assert_int_equal(exist1(st, "big"), 1);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_lru_order_matches_reference),
        T(test_watermarks_after_put_batch),
        T(test_lease_blocks_remove_until_expiry),
        T(test_lease_skipped_by_eviction),
        T(test_force_remove_of_leased_key),
        T(test_hard_pins_skipped_by_eviction),
        T(test_hard_pins_fill_pool),
        T(test_soft_pins_outlive_unpinned),
        T(test_soft_pins_second_pass),
        T(test_soft_pin_expiry),
        T(test_put_timeout_revokes_zombie),
        T(test_no_evict_refuses_when_full),
        T(test_eviction_throughput),
        T(test_soft_pin_huge_ttl_does_not_wrap),
        T(test_soft_pin_never_ends_early),
        T(test_fragmented_pool_keeps_evicting),
    };
#undef T
    return cmocka_run_group_tests_name("eviction", tests, NULL, NULL);
}
