/*
 * test_eviction.c - unit tests for master/eviction.c: the master as a cache.
 *
 * Drives kvp_dispatch_handle the way the server does (packed protobuf-c
 * requests in, packed responses out) and checks what a client sees: which
 * keys EXIST after a put that made the master evict, what REMOVE answers
 * for a leased key, what a put into a pool of pinned objects answers. The
 * master clock (st->now_ms) is set by the tests, so leases, soft pins and
 * put timeouts are exercised at their exact boundaries without sleeping.
 *
 * The policy (an age-biased LRU over probation and protected, the bias
 * learnt from a ghost, on demand; eviction.c's top comment) is
 * checked step by step against a reference model written here with plain
 * arrays (section 1), under the defaults (no watermarks) and with
 * watermarks on. The other sections check one property each (watermarks,
 * leases, pins, put timeouts, store mode, throughput) and count victims
 * rather than name them where the victim order is the model's business.
 * Section 8 replays a slice of the FAST'25 Mooncake trace the way
 * kvpool-bench trace does and asserts the store's prefix hit rate is at
 * least an exact LRU's of the same capacity.
 *
 * Accounting is exact: segments are whole multiples of the master's 64-byte
 * granularity and objects are 64 bytes, so "used" is 64 x resident objects
 * and the watermarks translate into object counts (worked out per test).
 *
 * Each test gets a fresh master state from the fixture; memory a test needs
 * beyond one call (key sets, the reference model, the trace) is owned by
 * the fixture, so an assertion that fails mid-test leaks nothing.
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
#include <unistd.h>

#include "client/tools/bench/cache_sim.h"
#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "master/dispatch.h"
#include "master/meta/placement.h"
#include "master/policy/eviction.h"
#include "master/policy/lease.h"
#include "master/policy/lists.h"
#include "master/core/state.h"
#include "tests/unit/master/svc_call.h"

#ifdef KVP_EVICTION_SIM /* sim_eviction: only section 8 and the plumbing run */
#pragma GCC diagnostic ignored "-Wunused-function"
#endif

#define C1 1
#define C2 2
#define C3 3

/* Object size in every test: one 64-byte extent, so accounting is exact. */
#define OBJ 64u

#define MAX_OWNED 16

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
    /* watermarks on (95 % / 85 %; off by default): the arithmetic of the tests that
     * count victims in a 64-object pool (61 objects -> 54) depends on them; the tests
     * of the defaults (on-demand eviction) set those back */
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

/* malloc'd memory that from now on lives until teardown. */
static void fx_adopt(fixture_t *fx, void *p)
{
    if (fx->n_owned >= MAX_OWNED)
        free(p);
    assert_true(fx->n_owned < MAX_OWNED);
    fx->owned[fx->n_owned++] = p;
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

/* LeaseRelease of ids[0..n) (one-way: the handler packs no response at all). */
static void lease_release(kvp_master_state_t *st, const uint64_t *ids, size_t n)
{
    Kvpool__LeaseReleaseRequest req = KVPOOL__LEASE_RELEASE_REQUEST__INIT;
    req.lease_ids = (uint64_t *)ids;
    req.n_lease_ids = n;
    size_t len = kvpool__lease_release_request__get_packed_size(&req);
    uint8_t *body = scratch(len ? len : 1);
    kvpool__lease_release_request__pack(&req, body);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    char err[128] = "";
    kvp_status_t s = kvp_dispatch_handle(st, C3, NULL, KVP_RPC_LEASE_RELEASE, body, len, &resp,
                                         &rlen, err, sizeof(err));
    if (s != KVP_OK)
        fail_msg("LeaseRelease of %zu ids: frame-level status %d (%s)", n, s, err);
    assert_null(resp);
    assert_int_equal(rlen, 0);
}

/* Read keys[0..n) (n <= 128) in one GET_REPLICA_LIST (every one must be found), then
 * release the leases as the client does once its transfers are over: in one LeaseRelease,
 * last key first (client/object.c, release_leases). */
static void read_release(kvp_master_state_t *st, const char *const *keys, size_t n)
{
    uint64_t ids[128];
    assert_true(n <= 128);
    Kvpool__GetReplicaListResponse *r = replicas(st, keys, n);
    int32_t whole = r->status;
    size_t n_results = r->n_results, bad = n;
    int32_t bad_status = 0;
    for (size_t i = 0; i < n_results && i < n; i++) {
        ids[n - 1 - i] = r->results[i]->lease_id; /* handed back last key first */
        if (r->results[i]->status != KVP_OK && bad == n) {
            bad = i;
            bad_status = r->results[i]->status;
        }
    }
    svc_msg_free(r);
    assert_int_equal(whole, KVP_OK);
    assert_int_equal(n_results, n);
    if (bad < n)
        fail_msg("GET_REPLICA_LIST %s answered %d, want KVP_OK", keys[bad], bad_status);
    lease_release(st, ids, n);
}

/* How many of keys[from, to) exist. */
static size_t count_exist(kvp_master_state_t *st, const char *const *keys, size_t from, size_t to)
{
    size_t n = 0;
    for (size_t i = from; i < to; i++)
        n += exist1(st, keys[i]) == 1;
    return n;
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* ---- 1. the policy, step by step, against a reference model ---- */

/*
 * The model is eviction.c's top comment written out with plain arrays
 * (O(n) per operation, obviously right): probation and protected, evict end
 * first; hard pins, soft pins and objects being read on lists of their own.
 *   - PutStart handles its keys in request order; a key that finds the pool
 *     full makes the master evict one object's worth (on demand), then the
 *     watermarks, when on, apply to the whole batch. Every eviction call
 *     first ends the leases whose TTL is over (in grant order).
 *   - The policy clock ticks once per put and once per move to a list's new
 *     end; that tick is the key's stamp. A move to a list's evict end keeps
 *     the key's stamp, or takes the head's if that is older.
 *   - PutEnd handles its keys last to first, each stamped: hard pins to the
 *     pinned list, soft pins to the new end of the soft list; otherwise a
 *     key the ghost remembers (from probation first, else from protected)
 *     moves the bias (KVP_POLICY_BIAS_STEP x the other kind's remembered
 *     victims / its own, + 1 each, when more; down for probation, up for
 *     protected; within +-KVP_POLICY_BIAS_LIMIT x probation + protected) and
 *     goes to the new end of protected, else the last key of a batch of
 *     several to the evict end of probation while the gate is open, the
 *     others stay at its new end. The gate: each put the ghost is asked
 *     about counts (before it is counted, open while the returns x
 *     KVP_POLICY_RETURN_RATIO >= the puts), a key it remembers counts as a
 *     return; the counts are halved when the victims since the last halving
 *     pass max(KVP_POLICY_WINDOW_MIN, resident objects).
 *   - GetReplicaList handles its keys last to first: each one found gets a
 *     lease; a new lease moves it to the new end of the reading list (hard
 *     pins stay where they are). When its lease ends (the last release, or
 *     the TTL) it goes to the new end of protected (of the soft list while
 *     its soft pin lasts; LeaseRelease ends its ids in the order given). A
 *     lease over by its TTL and not yet reaped ends when the next read comes
 *     (back to protected), which then starts a new one (to the reading list
 *     again).
 *   - A victim: first, expired soft pins at the head of the soft list become
 *     ordinary (evict end of probation). Then, in the first pass, the head
 *     of probation if its stamp is below protected's head's + the bias (or
 *     protected is empty), else the head of protected, the other list when
 *     the first is empty; in the second pass from the soft list.
 *   - The ghost: the keys evicted since the rotation before last, each with
 *     the list it left. A rotation happens when a victim finds the current
 *     round full: it holds max(1024, resident objects) keys. The master's
 *     ghost is a Bloom filter, so it may remember a key the model does not
 *     (a false positive, rare: counted, bounded) but must never forget one
 *     the model remembers; where they differ the model follows the master's
 *     answer.
 * Random steps: puts of 1..4 keys (new keys, and evicted ones back again,
 * except in the middle half of the run, so that the gate closes and opens
 * again; some soft-pinned, a few hard-pinned), reads of 1..4 keys (resident ones,
 * sometimes the same twice, sometimes an evicted one) whose leases are
 * released at once, held a few steps or never released (the TTL ends them).
 * After each step the keys that EXIST must be the model's, and the master's
 * lists must be the model's, in order.
 */
#define M_SLOTS 64
#define M_STEPS 3000
#define M_KEYS (4 * M_STEPS + 4)
#define M_TICK_MS 10 /* the master clock, per step */
#define M_TTL_MS 2000
#define M_HOLD_STEPS 50 /* held leases are released within M_TTL_MS */
#define M_HELD 16
#define M_HARD 4
#define M_GHOST_MIN 1024 /* eviction.c: GHOST_MIN_KEYS, GHOST_ROUNDS */
#define M_GHOST_ROUNDS 1
#define M_NONE UINT32_MAX

enum { M_PROB, M_PROT, M_PINNED, M_SOFT, M_READING, M_LISTS, M_ABSENT = M_LISTS };
static const char *const m_list_name[] = {"probation", "protected", "pinned", "soft", "reading"};

typedef struct mkey {
    uint8_t where; /* M_PROB .. M_ABSENT */
    uint8_t pin;
    uint32_t readers; /* grants not released */
    uint64_t lease_until_ms;
    uint64_t grant_seq; /* its lease's place in the master's expiry order */
    uint32_t soft_until_s;
    uint64_t ghost_round;   /* the ghost round of its latest eviction; 0: never evicted */
    uint64_t ghost_kind[2]; /* per kind (M_PROB, M_PROT): round of its latest such eviction */
    uint64_t touched;       /* the policy clock when last put or read */
    uint64_t hash;
} mkey_t;

typedef struct mheld {
    uint64_t id;
    uint32_t k;
    unsigned release_step;
} mheld_t;

typedef struct model {
    const char **names;
    mkey_t *keys;
    uint32_t next_key;
    uint32_t list[M_LISTS][M_SLOTS]; /* evict end first */
    size_t n[M_LISTS];
    size_t used; /* objects holding extents: resident and PENDING */
    double high, low;
    uint64_t evicted, runs;
    uint64_t ghost_round, ghost_n, ghost_cap;
    uint64_t ghost_kind_n[2][2];       /* [this round, the one before][kind]: victims */
    uint64_t clock;                    /* the policy clock */
    int64_t bias;                      /* probation's bias (ticks) */
    uint64_t bias_moves, bias_nonzero; /* ghost hits that moved it; steps it was not 0 */
    uint64_t recent_puts, recent_returns, recent_victims; /* the deepest-block rule's gate */
    uint64_t deepest_first, deepest_kept; /* deepest keys sent to the evict end, or not */
    uint64_t deepest_first_late;          /* deepest_first in the last quarter */
    uint64_t ghost_hits, ghost_fp, ghost_asked;
    uint64_t evict_while_reading, soft_demoted, soft_taken, lease_ttl_ended, grant_seq;
    uint32_t victims[M_SLOTS]; /* this step's */
    size_t n_victims;
    mheld_t held[M_HELD];
    size_t n_held;
    uint64_t now_ms;
    unsigned step;
    char what[96]; /* this step, for messages */
} model_t;

static bool m_soft_pinned(const model_t *m, uint32_t k)
{
    return m->keys[k].pin == KVP_PIN_SOFT && (uint64_t)m->keys[k].soft_until_s * 1000 > m->now_ms;
}

static void m_unlink(model_t *m, uint32_t k)
{
    unsigned l = m->keys[k].where;
    size_t i = 0;
    while (i < m->n[l] && m->list[l][i] != k)
        i++;
    assert_true(i < m->n[l]);
    memmove(&m->list[l][i], &m->list[l][i + 1], (m->n[l] - i - 1) * sizeof(uint32_t));
    m->n[l]--;
    m->keys[k].where = M_ABSENT;
}

/* Onto list l: its new end (the clock ticks, the key is the most recent) or its evict end
 * (no older than the head: it keeps its stamp, or takes the head's if that is older);
 * `stamp`: false when the put itself has just stamped it (the index's placement). */
static void m_place(model_t *m, uint32_t k, unsigned l, bool evict_end, bool stamp)
{
    assert_true(m->n[l] < M_SLOTS);
    mkey_t *e = &m->keys[k];
    if (evict_end) {
        if (m->n[l] > 0 && (int64_t)(m->keys[m->list[l][0]].touched - e->touched) < 0)
            e->touched = m->keys[m->list[l][0]].touched;
        memmove(&m->list[l][1], &m->list[l][0], m->n[l] * sizeof(uint32_t));
        m->list[l][0] = k;
    } else {
        if (stamp)
            e->touched = ++m->clock;
        m->list[l][m->n[l]] = k;
    }
    m->n[l]++;
    e->where = (uint8_t)l;
}

static void m_link(model_t *m, uint32_t k, unsigned l, bool evict_end)
{
    m_place(m, k, l, evict_end, true);
}

/* The head of list l: nothing on the scanned lists is being read or pinned (no segment
 * drains here, the one reason left to pass an object over). */
static uint32_t m_scan(model_t *m, unsigned l)
{
    return m->n[l] > 0 ? m->list[l][0] : M_NONE;
}

static uint32_t m_victim(model_t *m, bool take_soft)
{
    while (m->n[M_SOFT] > 0 && !m_soft_pinned(m, m->list[M_SOFT][0])) {
        uint32_t k = m->list[M_SOFT][0];
        m_unlink(m, k);
        m_link(m, k, M_PROB, true);
        m->soft_demoted++;
    }
    if (take_soft)
        return m_scan(m, M_SOFT);
    bool prob_first;
    if (m->n[M_PROB] == 0 || m->n[M_PROT] == 0)
        prob_first = m->n[M_PROT] == 0;
    else
        prob_first = (int64_t)(m->keys[m->list[M_PROB][0]].touched -
                               m->keys[m->list[M_PROT][0]].touched) < m->bias;
    unsigned first = prob_first ? M_PROB : M_PROT;
    uint32_t k = m_scan(m, first);
    return k != M_NONE ? k : m_scan(m, first == M_PROB ? M_PROT : M_PROB);
}

/* A lease ended (last release, or its TTL): the object is back, as just read. */
static void m_read_end(model_t *m, uint32_t k)
{
    m->keys[k].readers = 0;
    if (m->keys[k].where != M_READING)
        return;
    m_unlink(m, k);
    m_link(m, k, m_soft_pinned(m, k) ? M_SOFT : M_PROT, false);
}

/* kvp_lease_expire: leases whose TTL is over end, in the master's expiry order. */
static void m_expire(model_t *m)
{
    for (;;) {
        uint32_t best = M_NONE;
        for (uint32_t k = 0; k < m->next_key; k++) {
            const mkey_t *e = &m->keys[k];
            if (e->where != M_ABSENT && e->readers > 0 && e->lease_until_ms <= m->now_ms &&
                (best == M_NONE || e->grant_seq < m->keys[best].grant_seq))
                best = k;
        }
        if (best == M_NONE)
            return;
        m->lease_ttl_ended++;
        m_read_end(m, best);
    }
}

/* Does the ghost remember k's eviction from list `kind` (M_PROB or M_PROT)? */
static bool m_ghost_has(const model_t *m, uint32_t k, unsigned kind)
{
    uint64_t r = m->keys[k].ghost_kind[kind];
    return r != 0 && r + 1 >= m->ghost_round;
}

static void m_ghost_add(model_t *m, uint32_t k, unsigned kind)
{
    if (m->ghost_round == 0 || m->ghost_n >= m->ghost_cap) {
        uint64_t resident = 0;
        for (unsigned l = 0; l < M_LISTS; l++)
            resident += m->n[l];
        uint64_t keys = resident * M_GHOST_ROUNDS;
        m->ghost_cap = keys < M_GHOST_MIN ? M_GHOST_MIN : keys;
        if (m->ghost_round > 0) { /* the first round has no round before it */
            m->ghost_kind_n[1][0] = m->ghost_kind_n[0][0];
            m->ghost_kind_n[1][1] = m->ghost_kind_n[0][1];
        }
        m->ghost_kind_n[0][0] = m->ghost_kind_n[0][1] = 0;
        m->ghost_round++;
        m->ghost_n = 0;
    }
    m->keys[k].ghost_round = m->ghost_round;
    m->keys[k].ghost_kind[kind] = m->ghost_round;
    m->ghost_kind_n[0][kind]++;
    m->ghost_n++;
}

/* lists.c's bias_by: a victim of `kind` came back. */
static void m_bias(model_t *m, unsigned kind)
{
    int64_t b1 = (int64_t)(m->ghost_kind_n[0][M_PROB] + m->ghost_kind_n[1][M_PROB]) + 1;
    int64_t b2 = (int64_t)(m->ghost_kind_n[0][M_PROT] + m->ghost_kind_n[1][M_PROT]) + 1;
    int64_t lim = KVP_POLICY_BIAS_LIMIT * (int64_t)(m->n[M_PROB] + m->n[M_PROT]);
    int64_t step = KVP_POLICY_BIAS_STEP;
    if (kind == M_PROB) {
        step *= b2 > b1 ? b2 / b1 : 1;
        m->bias = m->bias - step < -lim ? -lim : m->bias - step;
    } else {
        step *= b1 > b2 ? b1 / b2 : 1;
        m->bias = m->bias + step > lim ? lim : m->bias + step;
    }
    m->bias_moves++;
}

/* kvp_evict_to: two passes (soft pins passed over, then taken) until used <= target bytes. */
static void m_evict_to(model_t *m, uint64_t target)
{
    m_expire(m);
    uint64_t count = 0;
    m->evict_while_reading += m->used * OBJ > target && m->n[M_READING] > 0;
    for (int pass = 0; pass < 2 && m->used * OBJ > target; pass++) {
        uint32_t k;
        while (m->used * OBJ > target && (k = m_victim(m, pass == 1)) != M_NONE) {
            m->soft_taken += pass == 1;
            assert_int_equal(m->keys[k].readers, 0);
            unsigned kind = m->keys[k].where == M_PROT ? M_PROT : M_PROB;
            m_unlink(m, k);
            m_ghost_add(m, k, kind);
            uint64_t window = 0;
            for (unsigned l = 0; l < M_LISTS; l++)
                window += m->n[l];
            if (window < KVP_POLICY_WINDOW_MIN)
                window = KVP_POLICY_WINDOW_MIN;
            if (++m->recent_victims > window) {
                m->recent_victims /= 2;
                m->recent_puts /= 2;
                m->recent_returns /= 2;
            }
            m->used--;
            m->victims[m->n_victims++] = k;
            count++;
        }
    }
    m->evicted += count;
    m->runs += count > 0;
}

/* A key to use again: one the master evicted and that is not resident, not in ks[0..n). */
static uint32_t m_pick_evicted(const model_t *m, uint64_t *rng, const uint32_t *ks, size_t n)
{
    for (int tries = 0; tries < 16 && m->next_key > 0; tries++) {
        uint32_t k = (uint32_t)(xorshift(rng) % m->next_key);
        bool dup = false;
        for (size_t j = 0; j < n; j++)
            dup |= ks[j] == k;
        if (!dup && m->keys[k].where == M_ABSENT && m->keys[k].ghost_round != 0)
            return k;
    }
    return M_NONE;
}

static void m_put(kvp_master_state_t *st, model_t *m, uint64_t *rng)
{
    uint32_t ks[4];
    const char *names[4];
    size_t n = 1 + xorshift(rng) % 4;
    unsigned pin = KVP_PIN_NONE;
    uint32_t ttl_s = 0;
    uint64_t r = xorshift(rng) % 64;
    if (r == 0 && m->n[M_PINNED] + n <= M_HARD) {
        pin = KVP_PIN_HARD;
    } else if (r < 8) {
        pin = KVP_PIN_SOFT;
        ttl_s = (uint32_t)(xorshift(rng) % 3); /* 0: the master's default (1 s here) */
    }
    for (size_t j = 0; j < n; j++) {
        uint32_t k = M_NONE;
        bool reuse = m->step < M_STEPS / 4 || m->step >= 3 * M_STEPS / 4;
        if (pin != KVP_PIN_HARD && xorshift(rng) % 4 == 0 && reuse)
            k = m_pick_evicted(m, rng, ks, j);
        if (k == M_NONE)
            k = m->next_key++;
        ks[j] = k;
        names[j] = m->names[k];
    }
    snprintf(m->what, sizeof(m->what), "put of %zu keys, %s first%s", n, names[0],
             pin == KVP_PIN_HARD   ? ", hard-pinned"
             : pin == KVP_PIN_SOFT ? ", soft-pinned"
                                   : "");

    /* PutStart: request order, each key evicts what it needs; then the watermarks */
    for (size_t j = 0; j < n; j++) {
        if (m->used == M_SLOTS)
            m_evict_to(m, (m->used - 1) * OBJ);
        if (m->used == M_SLOTS)
            fail_msg("step %u (%s): the model finds nothing to evict for %s", m->step, m->what,
                     names[j]);
        m->used++;
    }
    double cap = (double)M_SLOTS * OBJ;
    if ((double)(m->used * OBJ) > m->high * cap)
        m_evict_to(m, (uint64_t)(m->low * cap));
    start_batch(st, C1, names, n, pin, ttl_s);

    /* PutEnd: last key first */
    bool ghost[4][2];
    for (size_t j = 0; j < n; j++) {
        for (unsigned kind = 0; kind < 2; kind++)
            ghost[j][kind] =
                kvp_ghost_has(&st->ghost, m->keys[ks[j]].hash,
                              kind == M_PROB ? KVP_GHOST_PROBATION : KVP_GHOST_PROTECTED);
        if (pin == KVP_PIN_HARD)
            continue;
        m->ghost_asked++;
        for (unsigned kind = 0; kind < 2; kind++)
            if (m_ghost_has(m, ks[j], kind) && !ghost[j][kind])
                fail_msg("step %u (%s): the ghost forgot %s, evicted from %s in round %llu (now "
                         "round %llu)",
                         m->step, m->what, names[j], m_list_name[kind],
                         (unsigned long long)m->keys[ks[j]].ghost_kind[kind],
                         (unsigned long long)m->ghost_round);
        bool any = ghost[j][0] || ghost[j][1];
        m->ghost_fp += (ghost[j][0] && !m_ghost_has(m, ks[j], 0)) ||
                       (ghost[j][1] && !m_ghost_has(m, ks[j], 1));
        m->ghost_hits += any;
    }
    end_batch(st, C1, names, n);
    for (size_t j = n; j-- > 0;) {
        mkey_t *e = &m->keys[ks[j]];
        e->pin = (uint8_t)pin;
        e->soft_until_s = 0;
        e->readers = 0;
        e->touched = ++m->clock; /* every put ticks */
        if (pin == KVP_PIN_SOFT)
            e->soft_until_s =
                (uint32_t)((m->now_ms + 999) / 1000 + (ttl_s ? ttl_s : st->config.soft_pin_ttl_s));
        if (pin == KVP_PIN_HARD) {
            m_place(m, ks[j], M_PINNED, false, false);
            continue;
        }
        if (pin == KVP_PIN_SOFT) {
            m_place(m, ks[j], M_SOFT, false, false);
            continue;
        }
        m_place(m, ks[j], M_PROB, false, false); /* where the index puts it */
        bool gate = m->recent_returns * KVP_POLICY_RETURN_RATIO >= m->recent_puts;
        m->recent_puts++;
        m->recent_returns += ghost[j][M_PROB] || ghost[j][M_PROT];
        if (ghost[j][M_PROB] || ghost[j][M_PROT]) {
            m_bias(m, ghost[j][M_PROB] ? M_PROB : M_PROT);
            m_unlink(m, ks[j]);
            m_link(m, ks[j], M_PROT, false);
        } else if (n > 1 && j + 1 == n && gate) {
            m_unlink(m, ks[j]);
            m_link(m, ks[j], M_PROB, true);
            m->deepest_first++;
            m->deepest_first_late += m->step >= 3 * M_STEPS / 4;
        } else if (n > 1 && j + 1 == n) {
            m->deepest_kept++;
        }
    }
}

static void m_release(kvp_master_state_t *st, model_t *m, const uint64_t *ids, const uint32_t *ks,
                      size_t n)
{
    if (n == 0)
        return;
    lease_release(st, ids, n);
    for (size_t i = 0; i < n; i++) {
        assert_true(m->keys[ks[i]].readers > 0);
        if (--m->keys[ks[i]].readers == 0)
            m_read_end(m, ks[i]);
    }
}

static void m_read(kvp_master_state_t *st, model_t *m, uint64_t *rng)
{
    uint32_t ks[4];
    const char *names[4];
    size_t n = 1 + xorshift(rng) % 4;
    size_t resident = 0;
    for (unsigned l = 0; l < M_LISTS; l++)
        resident += m->n[l];
    for (size_t j = 0; j < n; j++) {
        uint32_t k = M_NONE;
        if (xorshift(rng) % 8 == 0 || resident == 0)
            k = m_pick_evicted(m, rng, ks, 0);
        if (k == M_NONE && resident > 0) {
            size_t i = xorshift(rng) % resident;
            unsigned l = M_PROB;
            while (i >= m->n[l])
                i -= m->n[l++];
            k = m->list[l][i];
        }
        if (k == M_NONE)
            k = 0; /* nothing resident, nothing evicted yet: key 0, absent */
        ks[j] = k;
        names[j] = m->names[k];
    }
    snprintf(m->what, sizeof(m->what), "read of %zu keys, %s first", n, names[0]);
    bool found[4];
    for (size_t j = 0; j < n; j++)
        found[j] = m->keys[ks[j]].where != M_ABSENT;

    Kvpool__GetReplicaListResponse *r = replicas(st, names, n);
    int32_t whole = r->status, got[4] = {0};
    size_t n_results = r->n_results;
    uint64_t ids[4] = {0};
    for (size_t j = 0; j < n && j < n_results; j++) {
        got[j] = r->results[j]->status;
        ids[j] = r->results[j]->lease_id;
    }
    svc_msg_free(r);
    assert_int_equal(whole, KVP_OK);
    assert_int_equal(n_results, n);
    for (size_t j = 0; j < n; j++) {
        if (got[j] != (found[j] ? KVP_OK : KVP_ERR_NOT_FOUND))
            fail_msg("step %u (%s): GET_REPLICA_LIST %s answered %d; in the model it is %s",
                     m->step, m->what, names[j], got[j], found[j] ? "resident" : "evicted");
        if (found[j] && ids[j] == 0)
            fail_msg("step %u (%s): %s read without a lease id", m->step, m->what, names[j]);
    }

    /* last key first: each one read gets a lease; a new one takes it to the reading list */
    for (size_t j = n; j-- > 0;) {
        mkey_t *e = &m->keys[ks[j]];
        if (!found[j])
            continue;
        if (e->readers > 0 && e->lease_until_ms <= m->now_ms) {
            m->lease_ttl_ended++; /* over by its TTL, not reaped yet: it ends now */
            m_read_end(m, ks[j]);
        }
        e->readers++;
        e->lease_until_ms = m->now_ms + M_TTL_MS;
        e->grant_seq = ++m->grant_seq;
        if (e->where != M_PINNED && e->where != M_READING) {
            m_unlink(m, ks[j]);
            m_link(m, ks[j], M_READING, false);
        }
    }

    /* the leases: most released at once, some held a few steps, a few never released */
    uint64_t now_ids[4];
    uint32_t now_ks[4];
    size_t n_now = 0;
    for (size_t j = 0; j < n; j++) {
        if (!found[j])
            continue;
        uint64_t fate = xorshift(rng) % 32;
        if (fate == 0)
            continue; /* the reader died: the TTL ends it */
        if (fate <= 8 && m->n_held < M_HELD) {
            m->held[m->n_held++] =
                (mheld_t){.id = ids[j],
                          .k = ks[j],
                          .release_step = m->step + 1 + (unsigned)(xorshift(rng) % M_HOLD_STEPS)};
            continue;
        }
        now_ids[n_now] = ids[j];
        now_ks[n_now++] = ks[j];
    }
    m_release(st, m, now_ids, now_ks, n_now);
}

/* Held leases whose reads are over now. */
static void m_release_held(kvp_master_state_t *st, model_t *m)
{
    uint64_t ids[M_HELD];
    uint32_t ks[M_HELD];
    size_t n = 0, w = 0;
    for (size_t i = 0; i < m->n_held; i++) {
        if (m->held[i].release_step <= m->step) {
            ids[n] = m->held[i].id;
            ks[n++] = m->held[i].k;
        } else {
            m->held[w++] = m->held[i];
        }
    }
    m->n_held = w;
    m_release(st, m, ids, ks, n);
}

/* "probation [a b c] protected [d e]" of the model or the master, cut short if long. */
static void m_dump(char *buf, size_t len, const model_t *m, const kvp_master_state_t *st)
{
    size_t off = 0;
    const kvp_object_list_t *ols[M_LISTS] = {&st->index.probation, &st->index.protected,
                                             &st->index.pinned, &st->index.soft,
                                             &st->index.reading};
    for (unsigned l = 0; l < M_LISTS && off < len; l++) {
        off += (size_t)snprintf(buf + off, len - off, "%s%s [", l ? " " : "", m_list_name[l]);
        if (m != NULL) {
            for (size_t i = 0; i < m->n[l] && off < len; i++)
                off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? " " : "",
                                        m->names[m->list[l][i]]);
        } else {
            const kvp_object_list_t *ol = ols[l];
            size_t i = 0;
            for (const kvp_object_t *o = ol->head; o != NULL && off < len; o = o->lnext, i++)
                off += (size_t)snprintf(buf + off, len - off, "%s%.*s", i ? " " : "",
                                        (int)o->key_len, kvp_object_key(o));
        }
        if (off < len)
            off += (size_t)snprintf(buf + off, len - off, "]");
    }
}

/* After a step: the same keys exist, the lists agree, and so do the counters. */
static void m_check(kvp_master_state_t *st, model_t *m)
{
    char mine[1200], theirs[1200];
    const char *names[3 * M_SLOTS];
    int32_t ex[3 * M_SLOTS];
    size_t n = 0;
    for (unsigned l = 0; l < M_LISTS; l++)
        for (size_t i = 0; i < m->n[l]; i++)
            names[n++] = m->names[m->list[l][i]];
    size_t resident = n;
    for (size_t i = 0; i < m->n_victims; i++)
        names[n++] = m->names[m->victims[i]];
    exist_many(st, names, n, ex);
    for (size_t i = 0; i < n; i++) {
        if (ex[i] == (i < resident))
            continue;
        m_dump(mine, sizeof(mine), m, NULL);
        m_dump(theirs, sizeof(theirs), NULL, st);
        fail_msg("step %u (%s): EXIST %s answered %d, want %d: the %s evicted it\n"
                 "  model (evict end first): %s\n  master: %s",
                 m->step, m->what, names[i], ex[i], i < resident,
                 i < resident ? "master (not the model)" : "model (not the master)", mine, theirs);
    }
    uint64_t objects = st->index.count - st->index.pending;
    if (objects != resident || st->index.pending != 0)
        fail_msg("step %u (%s): the master holds %llu objects (%llu pending), the model %zu",
                 m->step, m->what, (unsigned long long)objects,
                 (unsigned long long)st->index.pending, resident);
    /* same keys; now the same order (a difference here shows up in EXIST steps later) */
    const kvp_object_list_t *ol[M_LISTS] = {&st->index.probation, &st->index.protected,
                                            &st->index.pinned, &st->index.soft, &st->index.reading};
    for (unsigned l = 0; l < M_LISTS; l++) {
        size_t i = 0;
        const kvp_object_t *o = ol[l]->head;
        for (; o != NULL && i < m->n[l]; o = o->lnext, i++) {
            const char *want = m->names[m->list[l][i]];
            if (o->key_len != strlen(want) || memcmp(kvp_object_key(o), want, o->key_len) != 0)
                break;
        }
        if (o != NULL || i != m->n[l] || ol[l]->n != m->n[l]) {
            m_dump(mine, sizeof(mine), m, NULL);
            m_dump(theirs, sizeof(theirs), NULL, st);
            fail_msg("step %u (%s): the master's %s list differs from the model's at position "
                     "%zu (evict end = 0)\n  model: %s\n  master: %s",
                     m->step, m->what, m_list_name[l], i, mine, theirs);
        }
    }
    m->bias_nonzero += m->bias != 0;
    if (st->probation_bias != m->bias || st->policy_clock != m->clock)
        fail_msg("step %u (%s): the master's bias %lld and clock %llu, the model's %lld and %llu",
                 m->step, m->what, (long long)st->probation_bias,
                 (unsigned long long)st->policy_clock, (long long)m->bias,
                 (unsigned long long)m->clock);
    assert_int_equal(st->stats.evicted_objects, m->evicted);
    assert_int_equal(st->stats.evicted_bytes, m->evicted * OBJ);
    assert_int_equal(st->stats.evictions, m->runs);
    assert_int_equal(kvp_master_used(st), m->used * OBJ);
}

static void model_run(fixture_t *fx, double high, double low, uint64_t seed)
{
    kvp_master_state_t *st = &fx->st;
    st->config.evict_high = high;
    st->config.evict_low = low;
    st->config.lease_ttl_ms = M_TTL_MS;
    st->config.soft_pin_ttl_s = 1;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", M_SLOTS * OBJ, NULL), KVP_OK);

    model_t *m = fx_alloc(fx, sizeof(*m));
    m->names = keyset(fx, "m/", M_KEYS);
    m->keys = fx_alloc(fx, M_KEYS * sizeof(*m->keys));
    for (uint32_t k = 0; k < M_KEYS; k++) {
        m->keys[k].where = M_ABSENT;
        m->keys[k].hash = kvp_index_hash(m->names[k], strlen(m->names[k]));
    }
    m->high = high;
    m->low = low;
    uint64_t rng = seed;
    for (m->step = 0; m->step < M_STEPS; m->step++) {
        st->now_ms = m->now_ms = (uint64_t)m->step * M_TICK_MS;
        m->n_victims = 0;
        m_release_held(st, m);
        if (xorshift(&rng) % 2 == 0 || m->step < M_SLOTS / 4)
            m_put(st, m, &rng);
        else
            m_read(st, m, &rng);
        m_check(st, m);
    }
    print_message("%u steps: %llu evicted in %llu runs, %llu ghost rounds, %llu of %llu puts "
                  "back from the ghost (%llu false positives), %llu evictions with reads in "
                  "flight, %llu soft pins expired, %llu taken, %llu leases ended by the TTL; "
                  "deepest keys first %llu (%llu in the last quarter), kept %llu\n",
                  M_STEPS, (unsigned long long)m->evicted, (unsigned long long)m->runs,
                  (unsigned long long)m->ghost_round, (unsigned long long)m->ghost_hits,
                  (unsigned long long)m->ghost_asked, (unsigned long long)m->ghost_fp,
                  (unsigned long long)m->evict_while_reading, (unsigned long long)m->soft_demoted,
                  (unsigned long long)m->soft_taken, (unsigned long long)m->lease_ttl_ended,
                  (unsigned long long)m->deepest_first, (unsigned long long)m->deepest_first_late,
                  (unsigned long long)m->deepest_kept);
    /* the run went through what it is meant to check */
    assert_true(m->ghost_round >= 3); /* the ghost rotated (and forgot) at least twice */
    assert_true(m->ghost_hits > 100);
    assert_true(m->bias_moves > 100 && m->bias_nonzero > 100);    /* the bias moved and mattered */
    assert_true(m->deepest_first > 100 && m->deepest_kept > 100); /* the gate opened and closed */
    assert_true(m->deepest_first_late > 50);                      /* and opened again */
    assert_true(m->ghost_fp * 50 <= m->ghost_asked); /* the Bloom filter's price: < 2 % */
    assert_true(m->evict_while_reading > 0);
    assert_true(m->soft_demoted > 0);
    assert_true(m->lease_ttl_ended > 0);
    assert_true(m->n[M_PINNED] > 0);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.evicted_objects, m->evicted);
    size_t objects = 0;
    for (unsigned l = 0; l < M_LISTS; l++)
        objects += m->n[l];
    assert_int_equal(s.objects, objects);
    assert_int_equal(s.pending, 0);
}

/* The defaults: on-demand eviction, one object's worth per put that does not fit. */
static void test_policy_matches_reference(void **state)
{
    kvp_master_config_t defaults;
    kvp_master_config_init(&defaults);
    assert_true(defaults.evict_high >= 1.0); /* watermarks off */
    model_run(*state, defaults.evict_high, defaults.evict_low, 0x0DDB1A5E5BAD5EEDull);
}

/* Watermarks on (95 % / 85 %: 61 objects of 64 pass the high one, 54 are left). */
static void test_policy_matches_reference_watermarks(void **state)
{
    model_run(*state, 0.95, 0.85, 0x5EED0FC0FFEE1234ull);
}

/* ---- 2. watermarks ---- */

/*
 * Watermarks on (off by default: the test sets them). 100 slots: the high
 * watermark (95 %) is 95 objects, the low one (85 %) 85. One PutStart batch
 * that takes the pool past 95 % leaves it at exactly 85 %, and the batch
 * itself (PENDING) is never a victim; at 95 % exactly nothing goes.
 */
static void test_watermarks_after_put_batch(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    st->config.evict_high = 0.95;
    st->config.evict_low = 0.85;
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
    assert_int_equal(count_exist(st, old, 0, 80), 69);
    expect_exist(st, batch, 0, 16, 1);

    /* 85 + 10 = 95 objects: at the high watermark, not past it: nothing goes */
    start_batch(st, C1, more, 10, KVP_PIN_NONE, 0);
    end_batch(st, C1, more, 10);
    assert_int_equal(kvp_master_used(st), 95 * OBJ);
    assert_int_equal(st->stats.evicted_objects, 11);
    /* one more is past it: 11 go, never the one being put */
    start_batch(st, C1, &more[10], 1, KVP_PIN_NONE, 0);
    assert_int_equal(kvp_master_used(st), 85 * OBJ);
    end_batch(st, C1, &more[10], 1);
    assert_int_equal(exist1(st, more[10]), 1);
    assert_int_equal(st->stats.evicted_objects, 22);
    assert_int_equal(count_exist(st, old, 0, 80) + count_exist(st, batch, 0, 16) +
                         count_exist(st, more, 0, 11),
                     85);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.used, 85 * OBJ);
    assert_int_equal(s.objects, 85);
    assert_int_equal(s.evicted_objects, 22);
    assert_int_equal(st->stats.evictions, 2);
}

/*
 * The defaults (high watermark 1.0: off): nothing is evicted before the pool
 * is full, and a put that does not fit evicts one object's worth per key, so
 * the pool ends exactly full, with no bulk drop to a low watermark.
 */
static void test_default_put_evicts_only_what_it_needs(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    kvp_master_config_init(&st->config);
    assert_true(st->config.evict_high >= 1.0);
    const uint64_t cap = 100 * OBJ;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", cap, NULL), KVP_OK);
    const char **old = keyset(fx, "old/", 100);
    const char **batch = keyset(fx, "batch/", 17);

    put_each(st, old, 100, KVP_PIN_NONE, 0); /* up to 100 %: the old 95 % would have evicted */
    assert_int_equal(st->stats.evicted_objects, 0);
    assert_int_equal(kvp_master_used(st), cap);
    kvp_evict_if_needed(st); /* the loop's timer: nothing to do either */
    assert_int_equal(st->stats.evicted_objects, 0);

    start_batch(st, C1, batch, 16, KVP_PIN_NONE, 0);
    assert_int_equal(st->stats.evicted_objects, 16);
    assert_int_equal(kvp_master_used(st), cap);
    end_batch(st, C1, batch, 16);
    expect_exist(st, batch, 0, 16, 1);
    assert_int_equal(count_exist(st, old, 0, 100), 84);

    start_batch(st, C1, &batch[16], 1, KVP_PIN_NONE, 0);
    end_batch(st, C1, &batch[16], 1);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.used, cap);
    assert_int_equal(s.objects, 100);
    assert_int_equal(s.evicted_objects, 17);
    assert_int_equal(s.evicted_bytes, 17 * OBJ);
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
 * Two leased objects are the first victims in line (the oldest of protected,
 * probation empty) and the pool is full: a put passes over them (they move to
 * the new end of protected) and takes the next one. Even when everything else
 * goes they stay, as long as their reads last: one until its reader releases
 * it (LeaseRelease), the other, whose reader never does, until the TTL.
 */
static void test_lease_skipped_by_eviction(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    kvp_master_config_init(&st->config); /* on demand */
    st->config.lease_ttl_ms = 5000;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    const char **others = keyset(fx, "other/", 62);
    const char *two[2] = {"released", "abandoned"};

    st->now_ms = 1000;
    put_each(st, two, 2, KVP_PIN_NONE, 0);
    Kvpool__GetReplicaListResponse *r = replicas(st, two, 2); /* leased until 6000 */
    int32_t got0 = r->results[0]->status, got1 = r->results[1]->status;
    uint64_t id = r->results[0]->lease_id;
    svc_msg_free(r);
    assert_int_equal(got0, KVP_OK);
    assert_int_equal(got1, KVP_OK);
    assert_true(id != 0);
    put_each(st, others, 62, KVP_PIN_NONE, 0);
    read_release(st, others, 62); /* all protected, after the two leased ones */
    assert_int_equal(st->index.probation.n, 0);
    assert_int_equal(kvp_master_used(st), 64 * OBJ);

    /* full: a put passes over both and takes the next one in line */
    assert_int_equal(put1(st, C1, "new", OBJ), KVP_OK);
    assert_int_equal(end1(st, C1, "new", 0), KVP_OK);
    assert_int_equal(st->stats.evicted_objects, 1);
    assert_int_equal(exist1(st, "released"), 1);
    assert_int_equal(exist1(st, "abandoned"), 1);
    assert_int_equal(count_exist(st, others, 0, 62), 61);

    /* everything else can go; they cannot */
    kvp_evict_to(st, 0);
    assert_int_equal(kvp_master_used(st), 2 * OBJ);
    assert_int_equal(exist1(st, "released"), 1);
    assert_int_equal(exist1(st, "abandoned"), 1);
    assert_int_equal(count_exist(st, others, 0, 62) + exist1(st, "new"), 0);

    /* the read is over (LeaseRelease): it can go now, the other one still cannot */
    lease_release(st, &id, 1);
    kvp_evict_to(st, 0);
    assert_int_equal(exist1(st, "released"), 0);
    assert_int_equal(exist1(st, "abandoned"), 1);
    st->now_ms = 5999;
    kvp_evict_to(st, 0);
    assert_int_equal(exist1(st, "abandoned"), 1);
    /* its TTL is over (1000 + 5000) */
    st->now_ms = 6000;
    kvp_evict_to(st, 0);
    assert_int_equal(exist1(st, "abandoned"), 0);
    assert_int_equal(kvp_master_used(st), 0);
    assert_int_equal(st->stats.evicted_objects, 64 + 1);
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

/*
 * Hard pins sit on a list of their own that eviction never walks: the oldest
 * objects, read too (a read moves nothing off that list), yet never victims,
 * not even when everything else goes.
 */
static void test_hard_pins_skipped_by_eviction(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_t *st = &fx->st;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 64 * OBJ, NULL), KVP_OK);
    const char **hard = keyset(fx, "hard/", 30);
    const char **plain = keyset(fx, "plain/", 31);
    put_each(st, hard, 30, KVP_PIN_HARD, 0);
    read_release(st, hard, 30);
    assert_int_equal(st->index.pinned.n, 30);
    put_each(st, plain, 31, KVP_PIN_NONE, 0); /* the 61st object: 7 go */
    assert_int_equal(st->stats.evicted_objects, 7);
    expect_exist(st, hard, 0, 30, 1);
    assert_int_equal(count_exist(st, plain, 0, 31), 24);

    kvp_evict_to(st, 0);
    assert_int_equal(st->stats.evicted_objects, 31);
    assert_int_equal(kvp_master_used(st), 30 * OBJ);
    expect_exist(st, hard, 0, 30, 1);
    assert_int_equal(st->index.pinned.n, 30);
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
    assert_int_equal(count_exist(st, plain, 0, 31), 24);
    put_each(st, &plain[31], 7, KVP_PIN_NONE, 0); /* 61 again */
    assert_int_equal(st->stats.evicted_objects, 14);
    expect_exist(st, soft, 0, 30, 1);
    assert_int_equal(count_exist(st, plain, 0, 38), 24);
}

/*
 * 58 soft-pinned and 2 unpinned objects, then a 61st: the first pass takes
 * the 2 unpinned ones, which is not enough for the low watermark (54), so a
 * second pass takes 5 soft-pinned ones; never the one being put.
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
    assert_int_equal(count_exist(st, soft, 0, 58), 53);
}

/* Put keys[0..n) one at a time, each read (and released) right after its put: protected. */
static void put_read_each(kvp_master_state_t *st, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        put_each(st, &keys[i], 1, KVP_PIN_NONE, 0);
        read_release(st, &keys[i], 1);
    }
}

/*
 * Soft pins from the master's default TTL (10 s here) put at now = 0, first
 * in line (probation; every unpinned object was read, so protected): at
 * 9.999 s they still protect, and unpinned objects go instead; at 10 s they
 * are over, and they are the first to go.
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
    put_read_each(st, plain, 30);

    st->now_ms = 9999;
    put_read_each(st, &plain[30], 1);
    assert_int_equal(st->stats.evicted_objects, 7);
    expect_exist(st, soft, 0, 30, 1);
    assert_int_equal(count_exist(st, plain, 0, 31), 24);

    st->now_ms = 10000;
    put_read_each(st, &plain[31], 7);
    assert_int_equal(st->stats.evicted_objects, 14);
    assert_int_equal(count_exist(st, soft, 0, 30), 23);
    assert_int_equal(count_exist(st, plain, 0, 38), 31);
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

/* ---- 8. hit rate on the workload traces ---- */

/*
 * Slices of every workload class (tests/unit/master/data: the first 2000
 * requests of the FAST'25 Mooncake synthetic trace, and of each class
 * `kvpool-bench tracegen` writes; tests/unit/master/meson.build passes their paths in
 * KVPOOL_TEST_TRACES, separated by ':'), each replayed through the master's
 * handlers exactly as kvpool-bench trace drives a store, per request: EXIST
 * of its keys (calls of at most 128) gives the cached prefix P;
 * GET_REPLICA_LIST of the P prefix keys, whose leases are then released;
 * PUT_START + PUT_END of the keys that did not exist, in request order, 128
 * a call. Each block is one 64-byte object, in a segment of C objects. The
 * same request flow drives an exact LRU of C blocks (a read touches, a put
 * inserts, evicting the least recently used when full) and Belady's MIN of
 * C blocks (the yardstick, as in kvpool-bench trace); the store's hit rate
 * (sum of P / blocks) must be at least LRU's less TRACE_SLACK on every slice
 * at every capacity.
 *
 * Built with -DKVP_EVICTION_SIM this file is also `sim_eviction`, the
 * offline simulator the policy was chosen with: it replays whole traces
 * (argv) at the capacities of --capacity (percent of the unique blocks)
 * through the real policy code and prints store / LRU / Belady and the
 * share of the LRU -> Belady gap the store closes.
 */
#define TRACE_ENV "KVPOOL_TEST_TRACES"
#define TRACE_REQUESTS 2000
#define TRACE_SLACK 0.002   /* store >= LRU - this, per slice and capacity */
#define TRACE_MIN_GAP 0.005 /* sim: the gap closed is counted where Belady - LRU >= this */
#define TRACE_BATCH 128
#define TRACE_KEY_LEN 64
#define TRACE_KEY_PREFIX "trace@tp_rank:0@pp_rank:0@group:0@"
#define TRACE_NIL UINT32_MAX

typedef struct trace {
    uint32_t *blks; /* dense block numbers of all requests, concatenated */
    size_t *off;    /* request r: blks[off[r] .. off[r + 1]) */
    uint64_t *ids;  /* dense block -> hash id */
    size_t n_req, n_blks, n_uniq, max_len;
} trace_t;

static size_t trace_hash(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

/*
 * Load the first `limit` requests' hash_ids (plain malloc, no assertion
 * inside, so nothing leaks on failure: the caller hands the arrays to the
 * fixture). Returns false with a reason in err.
 */
static bool trace_load(const char *path, size_t limit, trace_t *t, char *err, size_t err_len)
{
    memset(t, 0, sizeof(*t));
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        snprintf(err, err_len, "cannot open %s: %m", path);
        return false;
    }
    size_t blks_cap = 0, map_cap = 0;
    uint64_t *map_key = NULL;
    uint32_t *map_val = NULL;
    char *line = NULL;
    size_t line_cap = 0;
    bool ok = false;
    size_t off_cap = 1024;
    t->off = malloc(off_cap * sizeof(*t->off));
    if (t->off == NULL)
        goto out;
    t->off[0] = 0;
    while (t->n_req < limit && getline(&line, &line_cap, f) > 0) {
        if (t->n_req + 2 > off_cap) {
            size_t *o = realloc(t->off, 2 * off_cap * sizeof(*o));
            if (o == NULL)
                goto out;
            t->off = o;
            off_cap *= 2;
        }
        const char *p = strstr(line, "\"hash_ids\"");
        p = p != NULL ? strchr(p, '[') : NULL;
        if (p == NULL)
            continue;
        p++;
        size_t start = t->n_blks;
        for (;;) {
            char *endp;
            while (*p == ' ' || *p == ',')
                p++;
            if (*p < '0' || *p > '9')
                break;
            uint64_t id = strtoull(p, &endp, 10);
            p = endp;
            if (t->n_blks == blks_cap) {
                blks_cap = blks_cap ? 2 * blks_cap : 1 << 16;
                uint32_t *b = realloc(t->blks, blks_cap * sizeof(*b));
                if (b == NULL)
                    goto out;
                t->blks = b;
            }
            if ((t->n_uniq + 1) * 2 > map_cap) { /* intern: hash id -> dense block */
                size_t cap = map_cap ? 2 * map_cap : 1 << 16;
                uint64_t *k = malloc(cap * sizeof(*k));
                uint32_t *v = malloc(cap * sizeof(*v));
                uint64_t *ids = realloc(t->ids, cap / 2 * sizeof(*ids));
                if (ids != NULL)
                    t->ids = ids;
                if (k == NULL || v == NULL || ids == NULL) {
                    free(k);
                    free(v);
                    goto out;
                }
                memset(v, 0xff, cap * sizeof(*v));
                for (size_t i = 0; i < map_cap; i++) {
                    if (map_val[i] == TRACE_NIL)
                        continue;
                    size_t s = trace_hash(map_key[i]) & (cap - 1);
                    while (v[s] != TRACE_NIL)
                        s = (s + 1) & (cap - 1);
                    k[s] = map_key[i];
                    v[s] = map_val[i];
                }
                free(map_key);
                free(map_val);
                map_key = k;
                map_val = v;
                map_cap = cap;
            }
            size_t s = trace_hash(id) & (map_cap - 1);
            while (map_val[s] != TRACE_NIL && map_key[s] != id)
                s = (s + 1) & (map_cap - 1);
            if (map_val[s] == TRACE_NIL) {
                map_key[s] = id;
                map_val[s] = (uint32_t)t->n_uniq;
                t->ids[t->n_uniq++] = id;
            }
            t->blks[t->n_blks++] = map_val[s];
        }
        if (*p != ']') {
            t->n_blks = start; /* malformed: not a request */
            continue;
        }
        t->off[++t->n_req] = t->n_blks;
        if (t->n_blks - start > t->max_len)
            t->max_len = t->n_blks - start;
    }
    ok = t->n_req > 0;
    if (!ok)
        snprintf(err, err_len, "%s has no request with hash_ids", path);
out:
    if (!ok && err[0] == '\0')
        snprintf(err, err_len, "out of memory loading %s", path);
    free(line);
    free(map_key);
    free(map_val);
    fclose(f);
    if (!ok) {
        free(t->blks);
        free(t->off);
        free(t->ids);
    }
    return ok;
}

typedef struct trace_run {
    const trace_t *t;
    char (*names)[TRACE_KEY_LEN]; /* max_len */
    const char **kp;              /* max_len */
    const char **puts;            /* max_len */
    int32_t *ex;                  /* max_len */
    kvp_bench_lru_t lru;          /* n_uniq blocks (cache_sim.h) */
} trace_run_t;

/* One request through the exact LRU of r->lru.cap blocks, as the store sees it (the
 * prefix read, the missing blocks put; a block present after the prefix is neither):
 * its prefix hits. */
static size_t lru_request(trace_run_t *r, const uint32_t *blk, size_t n)
{
    kvp_bench_lru_t *l = &r->lru;
    size_t p = kvp_bench_lru_prefix(l, blk, n);
    for (size_t i = 0; i < p; i++) /* read: touched */
        kvp_bench_lru_touch(l, blk[i]);
    for (size_t i = p; i < n; i++) { /* put, the ones that were missing */
        if (l->in[blk[i]])
            continue;
        while (l->count >= l->cap)
            kvp_bench_lru_unlink(l, l->tail);
        kvp_bench_lru_push_mru(l, blk[i]);
    }
    return p;
}

/* One request through the master: its prefix hits. */
static size_t store_request(kvp_master_state_t *st, trace_run_t *r, const uint32_t *blk, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        snprintf(r->names[i], TRACE_KEY_LEN, TRACE_KEY_PREFIX "%llu",
                 (unsigned long long)r->t->ids[blk[i]]);
        r->kp[i] = r->names[i];
    }
    for (size_t i = 0; i < n; i += TRACE_BATCH)
        exist_many(st, &r->kp[i], n - i < TRACE_BATCH ? n - i : TRACE_BATCH, &r->ex[i]);
    size_t p = 0;
    while (p < n && r->ex[p] == 1)
        p++;
    for (size_t i = 0; i < p; i += TRACE_BATCH)
        read_release(st, &r->kp[i], p - i < TRACE_BATCH ? p - i : TRACE_BATCH);
    size_t n_puts = 0;
    for (size_t i = p; i < n; i++)
        if (r->ex[i] == 0)
            r->puts[n_puts++] = r->kp[i];
    for (size_t i = 0; i < n_puts; i += TRACE_BATCH) {
        size_t m = n_puts - i < TRACE_BATCH ? n_puts - i : TRACE_BATCH;
        start_batch(st, C1, &r->puts[i], m, KVP_PIN_NONE, 0);
        end_batch(st, C1, &r->puts[i], m);
    }
    return p;
}

/* Prefix hits of the trace under Belady's MIN with `cap` blocks (cache_sim.h, as
 * kvpool-bench trace computes it). */
static uint64_t belady_hits(const trace_t *t, size_t cap)
{
    uint64_t hits = 0;
    if (kvp_bench_belady_hits(t->blks, t->off, t->n_req, t->n_uniq, cap, &hits) != 0)
        fail_msg("belady: out of memory");
    return hits;
}

typedef struct trace_point {
    size_t cap;
    double store, lru, belady;
    int64_t over_lru; /* store hits - exact LRU hits, in blocks */
} trace_point_t;

/* The trace replayed at `pct` % of its unique blocks (at least one minimal segment). */
static trace_point_t trace_capacity(fixture_t *fx, trace_run_t *r, double pct, bool with_belady)
{
    const trace_t *t = r->t;
    size_t cap = (size_t)((double)t->n_uniq * pct / 100.0);
    if (cap < KVP_SEGMENT_MIN_SIZE / OBJ)
        cap = KVP_SEGMENT_MIN_SIZE / OBJ;
    /* a fresh master with the defaults, one segment of `cap` objects */
    kvp_master_state_cleanup(&fx->st);
    assert_int_equal(kvp_master_state_init(&fx->st), KVP_OK);
    kvp_master_state_t *st = &fx->st;
    st->rng = 0x5EED5EED5EED5EEDull;
    st->now_ms = 0;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", cap * OBJ, NULL), KVP_OK);
    kvp_bench_lru_reset(&r->lru);
    r->lru.cap = cap;

    uint64_t store_hits = 0, lru_hits = 0;
    for (size_t q = 0; q < t->n_req; q++) {
        const uint32_t *blk = &t->blks[t->off[q]];
        size_t n = t->off[q + 1] - t->off[q];
        store_hits += store_request(st, r, blk, n);
        lru_hits += lru_request(r, blk, n);
    }
    assert_true(kvp_master_used(st) <= cap * OBJ);
    assert_int_equal(st->index.pending, 0);
    trace_point_t pt = {.cap = cap,
                        .store = (double)store_hits / (double)t->n_blks,
                        .lru = (double)lru_hits / (double)t->n_blks,
                        .over_lru = (int64_t)store_hits - (int64_t)lru_hits};
    if (with_belady)
        pt.belady = (double)belady_hits(t, cap) / (double)t->n_blks;
    return pt;
}

/* Load the first `limit` requests of `path` (0: all) and set up r's buffers (fixture's). */
static void trace_open(fixture_t *fx, const char *path, size_t limit, trace_t *t, trace_run_t *r)
{
    char err[512] = "";
    if (!trace_load(path, limit ? limit : SIZE_MAX / 2, t, err, sizeof(err)))
        fail_msg("trace: %s", err);
    fx_adopt(fx, t->blks);
    fx_adopt(fx, t->off);
    fx_adopt(fx, t->ids);
    r->t = t;
    size_t per_key = TRACE_KEY_LEN + 2 * sizeof(char *) + sizeof(int32_t);
    uint8_t *b = fx_alloc(fx, t->max_len * per_key);
    r->names = (char(*)[TRACE_KEY_LEN])b;
    r->kp = (const char **)(b + t->max_len * TRACE_KEY_LEN);
    r->puts = r->kp + t->max_len;
    r->ex = (int32_t *)(r->puts + t->max_len);
    int rc = kvp_bench_lru_init(&r->lru, t->n_uniq, 0);
    fx_adopt(fx, r->lru.prev);
    fx_adopt(fx, r->lru.next);
    fx_adopt(fx, r->lru.in);
    if (rc != 0)
        fail_msg("trace: out of memory");
}

/* Every slice of KVPOOL_TEST_TRACES at 5, 10 and 25 %: store >= exact LRU - TRACE_SLACK. */
static void test_trace_hit_rate_beats_lru(void **state)
{
    fixture_t *fx = *state;
    const char *paths = getenv(TRACE_ENV);
    if (paths == NULL || paths[0] == '\0')
        fail_msg(TRACE_ENV " is not set: meson points it at the slices in tests/unit/master/data");
    char list[4096];
    snprintf(list, sizeof(list), "%s", paths);
    unsigned n_slices = 0, n_below = 0;
    char *save = NULL;
    for (char *path = strtok_r(list, ":", &save); path != NULL; path = strtok_r(NULL, ":", &save)) {
        if (access(path, R_OK) != 0)
            fail_msg("trace slice %s is not readable (" TRACE_ENV ")", path);
        unsigned owned = fx->n_owned;
        trace_t t;
        trace_run_t r = {0};
        trace_open(fx, path, TRACE_REQUESTS, &t, &r);
        static const double pcts[] = {5, 10, 25};
        for (size_t i = 0; i < sizeof(pcts) / sizeof(pcts[0]); i++) {
            trace_point_t pt = trace_capacity(fx, &r, pcts[i], false);
            const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
            bool below = pt.store < pt.lru - TRACE_SLACK;
            print_message("%s: %zu requests (%zu blocks, %zu unique), capacity %zu blocks "
                          "(%.0f %%): store hit rate %.4f, exact LRU %.4f%s\n",
                          name, t.n_req, t.n_blks, t.n_uniq, pt.cap, pcts[i], pt.store, pt.lru,
                          below ? "  BELOW LRU" : "");
            n_below += below;
        }
        while (fx->n_owned > owned) /* this slice's memory */
            free(fx->owned[--fx->n_owned]);
        n_slices++;
    }
    assert_true(n_slices > 0);
    if (n_below > 0)
        fail_msg("%u slice x capacity points below exact LRU - %.3f (above)", n_below, TRACE_SLACK);
}

#ifndef KVP_EVICTION_SIM
int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_policy_matches_reference),
        T(test_policy_matches_reference_watermarks),
        T(test_watermarks_after_put_batch),
        T(test_default_put_evicts_only_what_it_needs),
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
        T(test_trace_hit_rate_beats_lru),
    };
#undef T
    return cmocka_run_group_tests_name("eviction", tests, NULL, NULL);
}
#else
/* "0.123" in a static buffer (one printf argument at a time). */
static const char *gap_txt(double gap)
{
    static char buf[16];
    snprintf(buf, sizeof(buf), "%.3f", gap);
    return buf;
}

/*
 * sim_eviction TRACE... [--capacity P,P,...] [--limit N]: each trace at each capacity
 * (percent of its unique blocks; default 2,5,10,25,50) through the real policy, exact LRU
 * and Belady; a line per point, then the mean gap closed.
 */
int main(int argc, char **argv)
{
    double pcts[16] = {2, 5, 10, 25, 50};
    size_t n_pcts = 5, limit = 0;
    const char *paths[64];
    size_t n_paths = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--capacity") == 0 && i + 1 < argc) {
            n_pcts = 0;
            char *save = NULL;
            for (char *tok = strtok_r(argv[++i], ",", &save); tok && n_pcts < 16;
                 tok = strtok_r(NULL, ",", &save))
                pcts[n_pcts++] = strtod(tok, NULL);
        } else if (strcmp(argv[i], "--limit") == 0 && i + 1 < argc) {
            limit = strtoull(argv[++i], NULL, 10);
        } else if (n_paths < 64) {
            paths[n_paths++] = argv[i];
        }
    }
    if (n_paths == 0) {
        fprintf(stderr, "usage: sim_eviction TRACE... [--capacity 2,5,10,25,50] [--limit N]\n");
        return 2;
    }
    double gap_sum = 0;
    unsigned n_gap = 0, n_below = 0, n_under = 0;
    printf("%-28s %5s %9s %7s %7s %7s %7s %8s\n", "trace", "cap%", "blocks", "store", "lru",
           "belady", "gap", "vs lru");
    for (size_t p = 0; p < n_paths; p++) {
        void *state = NULL;
        if (setup(&state) != 0)
            return 1;
        fixture_t *fx = state;
        trace_t t;
        trace_run_t r = {0};
        trace_open(fx, paths[p], limit, &t, &r);
        const char *name = strrchr(paths[p], '/') ? strrchr(paths[p], '/') + 1 : paths[p];
        for (size_t i = 0; i < n_pcts; i++) {
            trace_point_t pt = trace_capacity(fx, &r, pcts[i], true);
            /* the share of the LRU -> Belady gap closed, where there is a gap to speak of */
            bool has_gap = pt.belady - pt.lru >= TRACE_MIN_GAP;
            double gap = has_gap ? (pt.store - pt.lru) / (pt.belady - pt.lru) : 0;
            gap_sum += gap;
            n_gap += has_gap;
            n_below += pt.store < pt.lru - TRACE_SLACK;
            n_under += pt.over_lru < 0;
            printf("%-28s %5.1f %9zu %7.4f %7.4f %7.4f %7s %+8lld%s\n", name, pcts[i], pt.cap,
                   pt.store, pt.lru, pt.belady, has_gap ? gap_txt(gap) : "-",
                   (long long)pt.over_lru, pt.store < pt.lru - TRACE_SLACK ? "  BELOW" : "");
            fflush(stdout);
        }
        teardown(&state);
    }
    printf("mean gap closed %.3f over the %u points where Belady - LRU >= %.3f; %u points below "
           "LRU - %.3f; %u points with fewer hits than LRU (vs lru < 0)\n",
           n_gap ? gap_sum / n_gap : 0, n_gap, TRACE_MIN_GAP, n_below, TRACE_SLACK, n_under);
    return n_below > 0;
}
#endif
