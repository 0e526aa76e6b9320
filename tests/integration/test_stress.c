/*
 * test_stress.c - 16 threads on ONE kvp_client_t for 30 s of mixed batch
 * put / batch get / batch is_exist / remove, while the master is restarted
 * (kill -9, started again on the same address) and a segment owner is
 * killed (kill -9 of a `kvpool serve` process). Issue 11's integration test
 * for the shared master connection: it must not lose or mix bytes, deadlock,
 * or fail to recover.
 *
 * Pool: a real kvpool-master (default read leases), two `kvpool serve`
 * owners (A is killed, B survives) and the shared client's own segment; data
 * forced to tcp (or $KVPOOL_TRANSPORT), so a dead owner shows as a broken
 * socket mid-transfer.
 *
 * Bytes: every object carries a header {magic, key id, size, version,
 * check} and a body that is a pattern of (key id, version); the size is a
 * function of (key id, version) too. Versions come from one global counter,
 * so concurrent overwrites by other threads stay checkable: a successful get
 * must return one complete version that some thread put under that very key
 * (never another key's, never a mix, never garbage). Each thread also owns 4
 * private keys that nobody else writes: a get of those must never go back
 * past the last version whose put (or remove) returned OK (no stale reads).
 *
 * Asserted:
 *  - no wrong bytes, no stale private read, nothing written past a returned
 *    object (guard bytes);
 *  - every call returns a status from the documented set for its operation
 *    (kvpool.h), per key as well as per batch, and a batch returns OK only
 *    when every key succeeded; exist's prefix agrees with its results;
 *  - no deadlock: a watchdog thread fails the test (after dumping every
 *    thread's stack with gdb when there is one) as soon as any call has run
 *    longer than CALL_BOUND_MS; every worker finishes;
 *  - recovery: puts and gets succeed again after the master restart and
 *    after the owner kill; both serve owners remount on the new master by
 *    themselves; after the run a fresh put/exist/get/remove round succeeds
 *    and nothing stays PENDING;
 *  - nothing leaked: the client is destroyed, the survivors exit 0 on
 *    SIGTERM (LeakSanitizer in the ASan build), the killed ones died of our
 *    SIGKILL.
 *
 * Environment: KVPOOL_STRESS_SECONDS (default 30: CI runs the real thing),
 * KVPOOL_STRESS_CALL_BOUND_MS (default 2 x rpc timeout + 6 s).
 *
 * Worker threads never call cmocka; they record their first failure and the
 * main thread asserts after joining them.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "common/clock.h"
#include "common/macros.h"
#include "common/status_list.h"
#include "tests/fault/fault_util.h"
#include "tests/harness.h"

#define N_THREADS 16
#define SEG_SIZE "32MiB"
#define OWN_SEG_SIZE (32ull << 20)
#define RPC_TIMEOUT_MS 2000
#define CALL_BOUND_DEFAULT_MS (2 * RPC_TIMEOUT_MS + 6000)
#define DEFAULT_SECONDS 30
/* After a disruption, this long for the client to settle before its calls count as
 * "recovered" (reconnect, remount, owners remounting by heartbeat). */
#define SETTLE_MS 3000

#define N_SHARED_KEYS 384
#define N_PRIV 4 /* private keys per thread */
#define N_KEYS (N_SHARED_KEYS + N_THREADS * N_PRIV)
#define MAX_BATCH 8
#define MAX_OBJ (256u << 10)
#define GUARD 32
#define HDR_BYTES 32
#define OBJ_MAGIC 0x5354524553534b56ull /* "VKSSERTS" */

/* Object sizes, chosen by (key, version): odd ones catch off-by-one slips. */
static const uint32_t obj_sizes[] = {HDR_BYTES, 33,    1000,   4096,   4097,   10007,
                                     65536,     65537, 131072, 200000, MAX_OBJ};
#define N_SIZES (sizeof(obj_sizes) / sizeof(obj_sizes[0]))

/* before the master restart, master down, after its restart, after the owner kill */
enum { PH_STEADY, PH_MASTER_DOWN, PH_RESTARTED, PH_OWNER_KILLED, N_PHASES };
static const char *const phase_names[N_PHASES] = {"steady", "master killed", "master restarted",
                                                  "owner killed"};
enum { OP_PUT, OP_GET, OP_EXIST, OP_REMOVE, OP_STAT, N_OPS };
static const char *const op_names[N_OPS] = {"put", "get", "exist", "remove", "stat"};
#define N_ST (-KVP_STATUS_MIN + 1) /* histogram slot -status; 0 = OK */
static const char *const st_names[N_ST] = {
#define ST_NAME_(name, value, msg) [-(value)] = #name,
    KVP_STATUS_LIST(ST_NAME_)
#undef ST_NAME_
};

/* Statuses each operation may return (kvpool.h), per batch and per key. The master
 * connection and transfer failures may show on any of them. */
#define NET_ERRS                                                                                   \
    (bit(KVP_ERR_CONNECT) | bit(KVP_ERR_IO) | bit(KVP_ERR_TIMEOUT) | bit(KVP_ERR_SHUTDOWN))
#define XFER_ERRS                                                                                  \
    (bit(KVP_ERR_SEGMENT_GONE) | bit(KVP_ERR_TRANSPORT) | bit(KVP_ERR_NO_REPLICA) |                \
     bit(KVP_ERR_UNKNOWN_SEGMENT))

static inline uint64_t bit(kvp_status_t s)
{
    return 1ull << (unsigned)-s;
}

static uint64_t allowed_mask(int op)
{
    switch (op) {
    case OP_PUT:
        return bit(KVP_OK) | bit(KVP_ERR_EXISTS) | bit(KVP_ERR_PENDING) | bit(KVP_ERR_POOL_FULL) |
               bit(KVP_ERR_POOL_BUSY) | bit(KVP_ERR_NO_SEGMENT) | bit(KVP_ERR_PUT_REVOKED) |
               NET_ERRS | XFER_ERRS;
    case OP_GET:
        return bit(KVP_OK) | bit(KVP_ERR_NOT_FOUND) | bit(KVP_ERR_CHECKSUM) |
               bit(KVP_ERR_LEASE_EXPIRED) | NET_ERRS | XFER_ERRS;
    case OP_EXIST:
    case OP_STAT:
        return bit(KVP_OK) | NET_ERRS;
    case OP_REMOVE:
        return bit(KVP_OK) | bit(KVP_ERR_NOT_FOUND) | bit(KVP_ERR_PENDING) | bit(KVP_ERR_LEASED) |
               NET_ERRS;
    }
    return 0;
}

typedef struct env env_t;

typedef struct worker {
    env_t *e;
    pthread_t thread;
    int id;
    uint64_t rng;
    uint8_t *src[MAX_BATCH], *dst[MAX_BATCH], *expect;
    uint64_t priv_floor[N_PRIV];              /* a get must not return an older version */
    uint64_t priv_attempted[N_PRIV];          /* newest version ever put (OK or not) */
    uint64_t call_t0;                         /* when the current call began */
    uint64_t hist[N_PHASES][N_OPS][N_ST];     /* calls per phase, operation and status */
    uint64_t key_hist[N_PHASES][N_OPS][N_ST]; /* per-key results */
    uint64_t max_ms[N_OPS];
    uint64_t checked_gets, checked_bytes;
    uint64_t tolerated; /* put NOT_FOUND / NOT_PENDING around a disruption (not strict) */
    /* put and get keys in the settled windows after the restart / the owner kill:
     * answered (any documented outcome but a network or transfer error), or failed */
    uint64_t settled_good[2], settled_bad[2];
    char fail[1024]; /* first failure, "" if none */
} worker_t;

/* What the watchdog watches: when a call began (0: none in flight), and which. */
typedef struct slot {
    _Atomic uint64_t since_ms;
    _Atomic int op;
} slot_t;

struct env {
    kvp_proc_t master;
    kvp_proc_t seg[2]; /* seg[0] is killed mid-run, seg[1] survives */
    kvp_client_t *client;
    char addr[sizeof(((kvp_proc_t *)0)->ready)];
    const char *transport;
    uint64_t bound_ms;
    bool strict; /* default; KVPOOL_STRESS_STRICT=0 tolerates a client that does not recover
                  * and put NOT_FOUND / NOT_PENDING around the disruptions (the bugs this
                  * test found: segment ids reused by a restarted master, PUT_REVOKED) */
    atomic_bool stop;
    atomic_int done; /* workers finished */
    atomic_bool watch_stop;
    pthread_t watchdog;
    bool watchdog_running;
    _Atomic pid_t pids[3];       /* master, seg0, seg1: what the watchdog kills if it fires */
    pthread_mutex_t proc_lock;   /* held by the main thread while it kills and starts them */
    slot_t slots[N_THREADS + 1]; /* workers, then the main thread */
    /* when the master was killed / up again, the owner was dead (0: not yet) */
    _Atomic uint64_t t_start, t_master_kill, t_restart, t_kill;
    /* first OK put / hit after each disruption, ms after it; UINT64_MAX: none */
    _Atomic uint64_t put_after[2], get_after[2];
    _Atomic uint64_t max_version[N_KEYS]; /* newest version ever put under each key */
    atomic_uint_fast64_t version;
    worker_t w[N_THREADS];
};

/* ------------------------------------------------------------------ helpers */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint64_t rnd(worker_t *w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

static uint32_t size_of(uint32_t key_id, uint64_t version)
{
    return obj_sizes[mix64(((uint64_t)key_id << 40) ^ version) % N_SIZES];
}

static void key_name(uint32_t key_id, char *buf, size_t len)
{
    if (key_id < N_SHARED_KEYS)
        snprintf(buf, len, "stress/shared/%03u", key_id);
    else
        snprintf(buf, len, "stress/private/t%02u/%u", (key_id - N_SHARED_KEYS) / N_PRIV,
                 (key_id - N_SHARED_KEYS) % N_PRIV);
}

static void put_u64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The one complete value of (key_id, version): header then pattern. */
static uint32_t make_object(uint8_t *buf, uint32_t key_id, uint64_t version)
{
    uint32_t size = size_of(key_id, version);
    put_u64(buf, OBJ_MAGIC);
    put_u64(buf + 8, ((uint64_t)key_id << 32) | size);
    put_u64(buf + 16, version);
    put_u64(buf + 24, mix64(OBJ_MAGIC ^ ((uint64_t)key_id << 32 | size) ^ mix64(version)));
    kvp_fill_pattern(buf + HDR_BYTES, size - HDR_BYTES, mix64(((uint64_t)key_id << 40) ^ version));
    return size;
}

static void bump_max(_Atomic uint64_t *m, uint64_t v)
{
    uint64_t cur = atomic_load(m);
    while (cur < v && !atomic_compare_exchange_weak(m, &cur, v))
        ;
}

static void note_first(_Atomic uint64_t *first, _Atomic uint64_t *since)
{
    uint64_t t0 = atomic_load(since);
    if (t0 == 0)
        return;
    uint64_t dt = kvp_now_ms() - t0;
    uint64_t cur = atomic_load(first);
    while (dt < cur && !atomic_compare_exchange_weak(first, &cur, dt))
        ;
}

static void call_begin(env_t *e, int slot, int op)
{
    if (slot < N_THREADS)
        e->w[slot].call_t0 = kvp_now_ms();
    atomic_store(&e->slots[slot].op, op);
    atomic_store(&e->slots[slot].since_ms, kvp_now_ms());
}

static uint64_t call_end(env_t *e, int slot)
{
    uint64_t t0 = atomic_exchange(&e->slots[slot].since_ms, 0);
    return kvp_now_ms() - t0;
}

static int phase_now(env_t *e)
{
    uint64_t now = kvp_now_ms(), t;
    if ((t = atomic_load(&e->t_kill)) != 0 && now >= t)
        return PH_OWNER_KILLED;
    if ((t = atomic_load(&e->t_restart)) != 0 && now >= t)
        return PH_RESTARTED;
    if ((t = atomic_load(&e->t_master_kill)) != 0 && now >= t)
        return PH_MASTER_DOWN;
    return PH_STEADY;
}

static void failf(worker_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void failf(worker_t *w, const char *fmt, ...)
{
    if (w->fail[0] != '\0')
        return;
    uint64_t t = atomic_load(&w->e->t_start);
    int n =
        snprintf(w->fail, sizeof(w->fail), "worker %d, call from %.3f s to %.3f s (%s): ", w->id,
                 (double)(w->call_t0 - t) / 1000, (double)(kvp_now_ms() - t) / 1000,
                 phase_names[phase_now(w->e)]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->fail + n, sizeof(w->fail) - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Which settled window a call that began at t0 is in: 0 after the restart, 1 after the
 * owner kill, -1 in neither (before, or within SETTLE_MS of a disruption). */
static int settled_window(env_t *e, uint64_t t0)
{
    uint64_t tr = atomic_load(&e->t_restart), tk = atomic_load(&e->t_kill);
    if (tk != 0 && t0 >= tk + SETTLE_MS)
        return 1;
    if (tr != 0 && t0 >= tr + SETTLE_MS && (tk == 0 || t0 < tk))
        return 0;
    return -1;
}

/* Count a status; false (and a failure noted) when the operation may not return it. */
static bool check_status(worker_t *w, int op, bool per_key, int64_t st, const char *key)
{
    env_t *e = w->e;
    int s = st > 0 ? 0 : (int)-st;
    if (op == OP_PUT && !e->strict && (st == KVP_ERR_NOT_FOUND || st == KVP_ERR_NOT_PENDING)) {
        /* Before KVP_ERR_PUT_REVOKED, a put whose PENDING object the master dropped
         * between PutStart and PutEnd came back with the master's NOT_FOUND /
         * NOT_PENDING: KVPOOL_STRESS_STRICT=0 tolerates that around the disruptions. */
        uint64_t mk = atomic_load(&e->t_master_kill), tr = atomic_load(&e->t_restart);
        uint64_t tk = atomic_load(&e->t_kill), t0 = w->call_t0;
        if ((mk != 0 && t0 + 1000 >= mk && (tr == 0 || t0 < tr + SETTLE_MS)) ||
            (tk != 0 && t0 + 1000 >= tk && t0 < tk + SETTLE_MS)) {
            w->tolerated++;
            w->key_hist[phase_now(e)][op][s] += per_key;
            return true;
        }
    }
    if (per_key && (op == OP_PUT || op == OP_GET)) {
        int win = settled_window(e, w->call_t0);
        if (win >= 0) {
            bool bad = st < 0 && ((NET_ERRS | XFER_ERRS) & (1ull << s));
            (bad ? w->settled_bad : w->settled_good)[win]++;
        }
    }
    if (st < KVP_STATUS_MIN || !(allowed_mask(op) & (1ull << s))) {
        /* (the call's own account, e.g. which segment refused a write: the library logs
         * nothing by default, so this is all a CI log will show of it) */
        const char *why = kvp_client_last_error();
        failf(w, "%s%s %s returned %lld (%s), not a status %s may return; the call said: %s",
              op_names[op], per_key ? " of key" : "", key ? key : "", (long long)st,
              kvp_strerror((kvp_status_t)st), op_names[op], why != NULL ? why : "-");
        return false;
    }
    (per_key ? w->key_hist : w->hist)[phase_now(w->e)][op][s]++;
    return true;
}

/* A batch returns OK only when every key succeeded, and otherwise a failure. */
static bool check_batch(worker_t *w, int op, kvp_status_t st, const int64_t *res, size_t n)
{
    bool all_ok = true;
    for (size_t i = 0; i < n; i++)
        all_ok &= res[i] >= 0;
    if ((st == KVP_OK) != all_ok) {
        failf(w, "batch %s returned %s but its keys %s", op_names[op], kvp_strerror(st),
              all_ok ? "all succeeded" : "did not all succeed");
        return false;
    }
    return true;
}

/* Distinct random keys: all shared, or (a quarter of the time) this thread's own. */
static size_t pick_keys(worker_t *w, uint32_t *ids, bool *priv)
{
    *priv = rnd(w) % 4 == 0;
    size_t n = 1 + rnd(w) % (*priv ? N_PRIV : MAX_BATCH);
    for (size_t i = 0; i < n; i++) {
        bool dup;
        do {
            ids[i] = *priv ? N_SHARED_KEYS + (uint32_t)w->id * N_PRIV + (uint32_t)(rnd(w) % N_PRIV)
                           : (uint32_t)(rnd(w) % N_SHARED_KEYS);
            dup = false;
            for (size_t j = 0; j < i; j++)
                dup |= ids[j] == ids[i];
        } while (dup);
    }
    return n;
}

static int priv_index(worker_t *w, uint32_t key_id)
{
    return (int)(key_id - N_SHARED_KEYS) - w->id * N_PRIV;
}

/* ------------------------------------------------------------------ operations */

static bool do_put(worker_t *w, const uint32_t *ids, const char *const *keys, size_t n, bool priv)
{
    env_t *e = w->e;
    size_t sizes[MAX_BATCH];
    uint64_t ver[MAX_BATCH];
    for (size_t i = 0; i < n; i++) {
        ver[i] = atomic_fetch_add(&e->version, 1) + 1;
        /* published before the put starts: a reader may see it any time after */
        bump_max(&e->max_version[ids[i]], ver[i]);
        if (priv)
            w->priv_attempted[priv_index(w, ids[i])] = ver[i];
        sizes[i] = make_object(w->src[i], ids[i], ver[i]);
    }
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    uint64_t r = rnd(w);
    cfg.mode = r % 8 == 0 ? KVP_PUT_INSERT : KVP_PUT_UPSERT;
    cfg.replica_num = (r >> 8) % 5 == 0 ? 2 : 1;
    kvp_status_t res[MAX_BATCH];
    uint32_t replicas[MAX_BATCH];
    for (size_t i = 0; i < n; i++)
        res[i] = (kvp_status_t)1;
    call_begin(e, w->id, OP_PUT);
    kvp_status_t st = kvp_batch_put_from_ex(e->client, keys, (const void *const *)w->src, sizes, n,
                                            &cfg, res, replicas);
    uint64_t ms = call_end(e, w->id);
    if (ms > w->max_ms[OP_PUT])
        w->max_ms[OP_PUT] = ms;
    if (!check_status(w, OP_PUT, false, st, NULL))
        return false;
    int64_t r64[MAX_BATCH];
    bool any_ok = false;
    for (size_t i = 0; i < n; i++) {
        if (!check_status(w, OP_PUT, true, res[i], keys[i]))
            return false;
        r64[i] = res[i];
        if (res[i] == KVP_OK) {
            any_ok = true;
            /* an upsert of the same size rewrites in place, keeping the old replicas */
            if (replicas[i] < 1 || replicas[i] > 2) {
                failf(w, "put %s OK with %u replicas written (asked for %u)", keys[i], replicas[i],
                      cfg.replica_num);
                return false;
            }
            if (priv)
                w->priv_floor[priv_index(w, ids[i])] = ver[i];
        }
    }
    if (any_ok) {
        note_first(&e->put_after[0], &e->t_restart);
        note_first(&e->put_after[1], &e->t_kill);
    }
    return check_batch(w, OP_PUT, st, r64, n);
}

/* A returned object must be one complete version put under this key. */
static bool verify_object(worker_t *w, uint32_t key_id, const char *key, const uint8_t *buf,
                          int64_t got, bool priv)
{
    env_t *e = w->e;
    for (size_t g = 0; g < GUARD; g++)
        if (buf[(size_t)got + g] != 0xA5) {
            failf(w, "get %s (%lld B) wrote past the object (byte %zu)", key, (long long)got,
                  (size_t)got + g);
            return false;
        }
    if (got < HDR_BYTES || get_u64(buf) != OBJ_MAGIC) {
        failf(w, "get %s: %lld bytes that do not start with an object header", key, (long long)got);
        return false;
    }
    uint64_t ks = get_u64(buf + 8), version = get_u64(buf + 16);
    uint32_t hkey = (uint32_t)(ks >> 32), hsize = (uint32_t)ks;
    if (hkey != key_id) {
        char other[64];
        key_name(hkey, other, sizeof(other));
        failf(w, "get %s returned an object of key %s (version %" PRIu64 ")", key, other, version);
        return false;
    }
    uint64_t newest = atomic_load(&e->max_version[key_id]);
    if (version == 0 || version > newest || hsize != (uint32_t)got ||
        hsize != size_of(key_id, version)) {
        failf(w,
              "get %s: %lld bytes, header says version %" PRIu64 " size %u: never put "
              "(newest version put %" PRIu64 ")",
              key, (long long)got, version, hsize, newest);
        return false;
    }
    make_object(w->expect, key_id, version);
    if (memcmp(buf, w->expect, (size_t)got) != 0) {
        size_t at = 0;
        while (buf[at] == w->expect[at])
            at++;
        failf(w,
              "get %s: version %" PRIu64 " (%lld B) differs from what was put from byte %zu: "
              "a mix of versions or garbage",
              key, version, (long long)got, at);
        return false;
    }
    if (priv) {
        int p = priv_index(w, key_id);
        if (version < w->priv_floor[p]) {
            failf(w,
                  "get %s returned version %" PRIu64 " but version %" PRIu64
                  " (or a remove) had already returned OK: a stale read",
                  key, version, w->priv_floor[p]);
            return false;
        }
    }
    w->checked_gets++;
    w->checked_bytes += (uint64_t)got;
    return true;
}

static bool do_get(worker_t *w, const uint32_t *ids, const char *const *keys, size_t n, bool priv)
{
    env_t *e = w->e;
    size_t caps[MAX_BATCH];
    int64_t got[MAX_BATCH];
    for (size_t i = 0; i < n; i++) {
        caps[i] = MAX_OBJ;
        memset(w->dst[i], 0xA5, MAX_OBJ + GUARD);
        got[i] = INT64_MIN;
    }
    call_begin(e, w->id, OP_GET);
    kvp_status_t st = kvp_batch_get_into(e->client, keys, (void *const *)w->dst, caps, n, got);
    uint64_t ms = call_end(e, w->id);
    if (ms > w->max_ms[OP_GET])
        w->max_ms[OP_GET] = ms;
    if (!check_status(w, OP_GET, false, st, NULL))
        return false;
    bool any_ok = false;
    for (size_t i = 0; i < n; i++) {
        if (got[i] == 0 || !check_status(w, OP_GET, true, got[i], keys[i])) {
            if (got[i] == 0)
                failf(w, "get %s returned size 0", keys[i]);
            return false;
        }
        if (got[i] > 0) {
            if (!verify_object(w, ids[i], keys[i], w->dst[i], got[i], priv))
                return false;
            any_ok = true;
        }
    }
    if (any_ok) {
        note_first(&e->get_after[0], &e->t_restart);
        note_first(&e->get_after[1], &e->t_kill);
    }
    return check_batch(w, OP_GET, st, got, n);
}

static bool do_exist(worker_t *w, const char *const *keys, size_t n)
{
    env_t *e = w->e;
    int ex[MAX_BATCH];
    size_t prefix = SIZE_MAX;
    for (size_t i = 0; i < n; i++)
        ex[i] = -1000;
    call_begin(e, w->id, OP_EXIST);
    kvp_status_t st = kvp_batch_is_exist(e->client, keys, n, ex, &prefix);
    uint64_t ms = call_end(e, w->id);
    if (ms > w->max_ms[OP_EXIST])
        w->max_ms[OP_EXIST] = ms;
    if (!check_status(w, OP_EXIST, false, st, NULL))
        return false;
    if (st != KVP_OK)
        return true;
    size_t lead = 0;
    while (lead < n && ex[lead] == 1)
        lead++;
    for (size_t i = 0; i < n; i++)
        if (ex[i] != 0 && ex[i] != 1) {
            failf(w, "exist %s: %d (the batch returned OK)", keys[i], ex[i]);
            return false;
        }
    if (prefix != lead) {
        failf(w, "exist: prefix %zu but the first %zu keys exist", prefix, lead);
        return false;
    }
    return true;
}

static bool do_remove(worker_t *w, const uint32_t *ids, const char *const *keys, size_t n,
                      bool priv)
{
    env_t *e = w->e;
    kvp_status_t res[MAX_BATCH];
    for (size_t i = 0; i < n; i++)
        res[i] = (kvp_status_t)1;
    uint64_t r = rnd(w) % 8;
    call_begin(e, w->id, OP_REMOVE);
    kvp_status_t st;
    if (r < 2) { /* the single-key call */
        n = 1;
        st = kvp_remove(e->client, keys[0]);
        res[0] = st;
    } else if (r == 2) { /* also objects under a read lease: readers must see them gone */
        st = kvp_batch_remove_force(e->client, keys, n, res);
    } else {
        st = kvp_batch_remove(e->client, keys, n, res);
    }
    uint64_t ms = call_end(e, w->id);
    if (ms > w->max_ms[OP_REMOVE])
        w->max_ms[OP_REMOVE] = ms;
    if (!check_status(w, OP_REMOVE, false, st, NULL))
        return false;
    int64_t r64[MAX_BATCH];
    for (size_t i = 0; i < n; i++) {
        if (!check_status(w, OP_REMOVE, true, res[i], keys[i]))
            return false;
        r64[i] = res[i];
        if (priv && res[i] == KVP_OK) { /* gone: no version put so far may come back */
            int p = priv_index(w, ids[i]);
            w->priv_floor[p] = w->priv_attempted[p] + 1;
        }
    }
    return check_batch(w, OP_REMOVE, st, r64, n);
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    env_t *e = w->e;
    uint32_t ids[MAX_BATCH];
    char kb[MAX_BATCH][64];
    const char *keys[MAX_BATCH];
    bool ok = true;
    while (ok && !atomic_load(&e->stop)) {
        bool priv;
        size_t n = pick_keys(w, ids, &priv);
        for (size_t i = 0; i < n; i++) {
            key_name(ids[i], kb[i], sizeof(kb[i]));
            keys[i] = kb[i];
        }
        unsigned op = (unsigned)(rnd(w) % 100);
        if (op < 35)
            ok = do_put(w, ids, keys, n, priv);
        else if (op < 70)
            ok = do_get(w, ids, keys, n, priv);
        else if (op < 88)
            ok = do_exist(w, keys, n);
        else
            ok = do_remove(w, ids, keys, n, priv);
    }
    atomic_fetch_add(&e->done, 1);
    return NULL;
}

/* ------------------------------------------------------------------ watchdog */

static void dump_stacks(void)
{
    if (access("/usr/bin/gdb", X_OK) != 0)
        return;
    char pid[16];
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    char *argv[] = {"/usr/bin/gdb", "-p", pid, "-batch", "-nx", "-ex", "thread apply all bt", NULL};
    kvp_run(argv, NULL, NULL, 0, 60000);
}

/* A call that never returns is a deadlock: say which, dump stacks, kill the children
 * by PID and fail at once (the stuck thread cannot be joined). */
static void *watchdog_main(void *arg)
{
    env_t *e = arg;
    while (!atomic_load(&e->watch_stop)) {
        uint64_t now = kvp_now_ms();
        int stuck = -1;
        for (int i = 0; i <= N_THREADS; i++) {
            uint64_t t0 = atomic_load(&e->slots[i].since_ms);
            if (t0 != 0 && now > t0 && now - t0 > e->bound_ms)
                stuck = i;
        }
        if (stuck >= 0) {
            fprintf(stderr, "\nWATCHDOG: calls running longer than %" PRIu64 " ms:\n", e->bound_ms);
            for (int i = 0; i <= N_THREADS; i++) {
                uint64_t t0 = atomic_load(&e->slots[i].since_ms);
                if (t0 != 0)
                    fprintf(stderr, "  %s %d: %s for %" PRIu64 " ms\n",
                            i < N_THREADS ? "worker" : "main thread", i,
                            op_names[atomic_load(&e->slots[i].op)], now - t0);
            }
            fprintf(stderr, "deadlock or lost reply; stacks follow\n");
            dump_stacks();
            /* not in the middle of a restart: a new master would outlive us */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 20;
            pthread_mutex_timedlock(&e->proc_lock, &until);
            for (int i = 0; i < 3; i++) {
                pid_t p = atomic_load(&e->pids[i]);
                if (p > 0)
                    fault_kill9_pid(p);
            }
            _exit(1);
        }
        fault_sleep_ms(50);
    }
    return NULL;
}

/* ------------------------------------------------------------------ setup */

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    if (v == NULL || v[0] == '\0')
        return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    return *end == '\0' && x > 0 ? (uint64_t)x : dflt;
}

static int setup(void **state)
{
    env_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return -1;
    *state = e;
    pthread_mutex_init(&e->proc_lock, NULL);
    /* let the watchdog's gdb attach to us where Yama restricts ptrace */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    e->transport = kvp_test_transport() ? kvp_test_transport() : "tcp";
    e->bound_ms = env_u64("KVPOOL_STRESS_CALL_BOUND_MS", CALL_BOUND_DEFAULT_MS);
    e->strict = env_u64("KVPOOL_STRESS_STRICT", 1) != 0;
    /* default read leases: removes meet LEASED, force-removes meet readers */
    if (!kvp_start_master_args(&e->master, NULL))
        return -1;
    snprintf(e->addr, sizeof(e->addr), "%s", e->master.ready);
    atomic_store(&e->pids[0], e->master.pid);
    for (int i = 0; i < 2; i++) {
        if (!kvp_start_segment(&e->seg[i], e->addr, SEG_SIZE, e->transport))
            return -1;
        atomic_store(&e->pids[1 + i], e->seg[i].pid);
    }
    /* the library logs nothing by default: its warnings (a write that failed, and why an
     * owner refused one: this process serves the client's own segment) go to the test's
     * log, next to the owners' */
    setenv("KVPOOL_LOG_LEVEL", "warn", 0);
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = e->addr;
    p.transport = e->transport;
    p.segment_size = OWN_SEG_SIZE; /* remounted by every reconnect, beside the user calls */
    p.rpc_timeout_ms = RPC_TIMEOUT_MS;
    if (kvp_client_create(&p, &e->client) != KVP_OK)
        return -1;
    for (int i = 0; i < 2; i++) {
        atomic_store(&e->put_after[i], UINT64_MAX);
        atomic_store(&e->get_after[i], UINT64_MAX);
    }
    if (pthread_create(&e->watchdog, NULL, watchdog_main, e) != 0)
        return -1;
    e->watchdog_running = true;
    return 0;
}

static int teardown(void **state)
{
    env_t *e = *state;
    if (e == NULL)
        return -1;
    int rc = 0;
    /* a failed assertion left workers running: stop them (each call is bounded) */
    atomic_store(&e->stop, true);
    for (int i = 0; i < N_THREADS; i++) {
        if (e->w[i].thread != 0)
            pthread_join(e->w[i].thread, NULL);
        for (int b = 0; b < MAX_BATCH; b++) {
            free(e->w[i].src[b]);
            free(e->w[i].dst[b]);
        }
        free(e->w[i].expect);
    }
    if (e->watchdog_running) {
        atomic_store(&e->watch_stop, true);
        pthread_join(e->watchdog, NULL);
    }
    kvp_client_destroy(e->client);
    for (int i = 0; i < 2; i++) {
        if (e->seg[i].pid <= 0)
            continue;
        int st = kvp_proc_stop(&e->seg[i], SIGTERM, 10000);
        if (st != 0) {
            fprintf(stderr, "segment owner %d exited with %d\n", i, st);
            rc = -1;
        }
    }
    if (e->master.pid > 0) {
        int st = kvp_proc_stop(&e->master, SIGTERM, 10000);
        if (st != 0) {
            fprintf(stderr, "master exited with %d\n", st);
            rc = -1;
        }
    }
    pthread_mutex_destroy(&e->proc_lock);
    free(e);
    return rc;
}

/* ------------------------------------------------------------------ the test */

/* The pool as the master sees it, from the main thread (watched like a worker). */
static kvp_status_t main_stat(env_t *e, size_t *n_seg_p, uint64_t *pending_p, bool *has_owners_p)
{
    kvp_pool_stat_t *s = NULL;
    call_begin(e, N_THREADS, OP_STAT);
    kvp_status_t st = kvp_pool_stat(e->client, &s);
    call_end(e, N_THREADS);
    if (st != KVP_OK)
        return st;
    *n_seg_p = s->n_segments;
    *pending_p = s->pending;
    int owners = 0;
    for (size_t i = 0; i < s->n_segments; i++)
        for (int k = 0; k < 2; k++)
            owners += e->seg[k].pid > 0 && strcmp(s->segments[i].name, e->seg[k].ready) == 0;
    *has_owners_p = owners == (e->seg[0].pid > 0) + (e->seg[1].pid > 0);
    kvp_pool_stat_free(s);
    return KVP_OK;
}

/* "id=name ..." of the segments the master lists, for the log. */
static void print_segments(env_t *e, const char *when)
{
    kvp_pool_stat_t *s = NULL;
    call_begin(e, N_THREADS, OP_STAT);
    kvp_status_t st = kvp_pool_stat(e->client, &s);
    call_end(e, N_THREADS);
    printf("# segments %s:", when);
    for (size_t i = 0; st == KVP_OK && i < s->n_segments; i++)
        printf(" %#" PRIx64 "=%s%s", s->segments[i].id, s->segments[i].name,
               strcmp(s->segments[i].name, e->seg[0].ready) == 0   ? "(A)"
               : strcmp(s->segments[i].name, e->seg[1].ready) == 0 ? "(B)"
                                                                   : "(own)");
    printf("%s\n", st == KVP_OK ? "" : kvp_strerror(st));
    kvp_pool_stat_free(s);
}

/* Wait (bounded) until the master lists every live owner and the client's own segment. */
static uint64_t wait_remounted(env_t *e, int timeout_ms)
{
    uint64_t t0 = kvp_now_ms();
    size_t want = 1 + (e->seg[0].pid > 0) + (e->seg[1].pid > 0);
    while (kvp_now_ms() - t0 < (uint64_t)timeout_ms) {
        size_t n_seg = 0;
        uint64_t pending = 0;
        bool owners = false;
        if (main_stat(e, &n_seg, &pending, &owners) == KVP_OK && n_seg == want && owners)
            return kvp_now_ms() - t0;
        fault_sleep_ms(50);
    }
    return UINT64_MAX;
}

static void sleep_until(env_t *e, uint64_t t)
{
    (void)e;
    while (kvp_now_ms() < t)
        fault_sleep_ms(20);
}

static void print_histogram(env_t *e)
{
    uint64_t max_ms[N_OPS] = {0}, gets = 0, bytes = 0;
    for (int t = 0; t < N_THREADS; t++) {
        for (int o = 0; o < N_OPS; o++)
            if (e->w[t].max_ms[o] > max_ms[o])
                max_ms[o] = e->w[t].max_ms[o];
        gets += e->w[t].checked_gets;
        bytes += e->w[t].checked_bytes;
    }
    for (int ph = 0; ph < N_PHASES; ph++) {
        printf("# phase \"%s\"\n", phase_names[ph]);
        for (int o = 0; o < OP_STAT; o++) {
            uint64_t hist[N_ST] = {0}, key_hist[N_ST] = {0}, calls = 0;
            for (int t = 0; t < N_THREADS; t++)
                for (int s = 0; s < N_ST; s++) {
                    hist[s] += e->w[t].hist[ph][o][s];
                    key_hist[s] += e->w[t].key_hist[ph][o][s];
                    calls += e->w[t].hist[ph][o][s];
                }
            printf("#   %-6s %6" PRIu64 " calls;", op_names[o], calls);
            for (int s = 0; s < N_ST; s++) {
                uint64_t c = o == OP_EXIST ? hist[s] : key_hist[s];
                if (c != 0)
                    printf(" %s %" PRIu64, st_names[s] + 4 * (s != 0) /* no KVP_ */, c);
            }
            printf("%s\n", o == OP_EXIST ? " (calls)" : " (keys)");
        }
    }
    printf("# slowest call: put %" PRIu64 " ms, get %" PRIu64 " ms, exist %" PRIu64
           " ms, remove %" PRIu64 " ms\n",
           max_ms[OP_PUT], max_ms[OP_GET], max_ms[OP_EXIST], max_ms[OP_REMOVE]);
    printf("# %" PRIu64 " objects read back and checked byte for byte (%.1f MiB)\n", gets,
           (double)bytes / (1 << 20));
}

/* put, exist, get (byte-exact) and remove MAX_BATCH fresh 4 KiB keys; false and `why` on
 * the first step that fails. Main thread, after the workers. */
static bool final_round(kvp_client_t *c, const char *tag, char *why, size_t why_len)
{
    static uint8_t val[MAX_BATCH][4096], out[MAX_BATCH][4096];
    char kb[MAX_BATCH][64];
    const char *keys[MAX_BATCH];
    const void *srcs[MAX_BATCH];
    void *dsts[MAX_BATCH];
    size_t sizes[MAX_BATCH];
    for (int i = 0; i < MAX_BATCH; i++) {
        snprintf(kb[i], sizeof(kb[i]), "stress/final/%s/%d", tag, i);
        keys[i] = kb[i];
        kvp_fill_pattern(val[i], sizeof(val[i]), 77 + (uint64_t)i);
        srcs[i] = val[i];
        dsts[i] = out[i];
        sizes[i] = sizeof(val[i]);
    }
    kvp_status_t res[MAX_BATCH];
    int64_t got[MAX_BATCH];
    int ex[MAX_BATCH];
    size_t prefix = 0;
    kvp_status_t st = kvp_batch_put_from(c, keys, srcs, sizes, MAX_BATCH, NULL, res);
    if (st != KVP_OK) {
        snprintf(why, why_len, "batch put: %s (%s)", kvp_strerror(st), kvp_client_last_error());
        return false;
    }
    st = kvp_batch_is_exist(c, keys, MAX_BATCH, ex, &prefix);
    if (st != KVP_OK || prefix != MAX_BATCH) {
        snprintf(why, why_len, "batch exist: %s, prefix %zu", kvp_strerror(st), prefix);
        return false;
    }
    st = kvp_batch_get_into(c, keys, dsts, sizes, MAX_BATCH, got);
    if (st != KVP_OK) {
        snprintf(why, why_len, "batch get: %s (%s)", kvp_strerror(st), kvp_client_last_error());
        return false;
    }
    for (int i = 0; i < MAX_BATCH; i++)
        if (got[i] != (int64_t)sizeof(val[i]) || memcmp(out[i], val[i], sizeof(val[i])) != 0) {
            snprintf(why, why_len, "get %s: wrong size or bytes", keys[i]);
            return false;
        }
    st = kvp_batch_remove(c, keys, MAX_BATCH, res);
    if (st != KVP_OK) {
        snprintf(why, why_len, "batch remove: %s", kvp_strerror(st));
        return false;
    }
    return true;
}

static void test_stress(void **state)
{
    env_t *e = *state;
    uint64_t seconds = env_u64("KVPOOL_STRESS_SECONDS", DEFAULT_SECONDS);
    uint64_t t_start = kvp_now_ms(), run_ms = seconds * 1000;
    atomic_store(&e->t_start, t_start);
    printf("# %d threads on one client for %" PRIu64 " s over %s; call bound %" PRIu64 " ms\n",
           N_THREADS, seconds, e->transport, e->bound_ms);

    for (int i = 0; i < N_THREADS; i++) {
        worker_t *w = &e->w[i];
        w->e = e;
        w->id = i;
        w->rng = mix64((uint64_t)i + 1 + t_start);
        for (int b = 0; b < MAX_BATCH; b++) {
            w->src[b] = malloc(MAX_OBJ);
            w->dst[b] = malloc(MAX_OBJ + GUARD);
            assert_non_null(w->src[b]);
            assert_non_null(w->dst[b]);
        }
        w->expect = malloc(MAX_OBJ);
        assert_non_null(w->expect);
    }
    for (int i = 0; i < N_THREADS; i++)
        assert_int_equal(pthread_create(&e->w[i].thread, NULL, worker_main, &e->w[i]), 0);

    /* 1. at 30 %: kill -9 the master, start it again on the same address */
    print_segments(e, "at the start");
    sleep_until(e, t_start + run_ms * 3 / 10);
    atomic_store(&e->t_master_kill, kvp_now_ms());
    pthread_mutex_lock(&e->proc_lock);
    int k = fault_kill9(&e->master);
    char *margs[] = {"--listen", e->addr, NULL}; /* a later --listen wins over 127.0.0.1:0 */
    bool up = kvp_start_master_args(&e->master, margs);
    atomic_store(&e->pids[0], e->master.pid);
    pthread_mutex_unlock(&e->proc_lock);
    if (k != 0)
        fail_msg("the master had already ended (%d) before our SIGKILL", k);
    assert_true(up);
    assert_string_equal(e->master.ready, e->addr);
    atomic_store(&e->t_restart, kvp_now_ms());
    uint64_t remount_ms = wait_remounted(e, 10000);
    printf("# %.1f s: master restarted (kill -9); owners and the client remounted after %" PRIu64
           " ms\n",
           (double)(atomic_load(&e->t_restart) - t_start) / 1000, remount_ms);
    if (remount_ms == UINT64_MAX)
        fail_msg("the segments were not all mounted on the new master within 10 s");
    print_segments(e, "on the new master");

    /* 2. at 60 %: kill -9 segment owner A */
    sleep_until(e, t_start + run_ms * 6 / 10);
    atomic_store(&e->t_kill, kvp_now_ms()); /* from the signal on: its reaping takes a while */
    pthread_mutex_lock(&e->proc_lock);
    k = fault_kill9(&e->seg[0]);
    atomic_store(&e->pids[1], 0);
    pthread_mutex_unlock(&e->proc_lock);
    if (k != 0)
        fail_msg("segment owner A had already ended (%d) before our SIGKILL", k);
    printf("# %.1f s: segment owner A killed (kill -9)\n",
           (double)(atomic_load(&e->t_kill) - t_start) / 1000);

    /* 3. the end: every worker finishes (the watchdog bounds each call) */
    sleep_until(e, t_start + run_ms);
    atomic_store(&e->stop, true);
    char first[512] = "";
    int failed = 0;
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(e->w[i].thread, NULL);
        e->w[i].thread = 0;
        if (e->w[i].fail[0] != '\0') {
            fprintf(stderr, "%s\n", e->w[i].fail);
            if (failed++ == 0)
                snprintf(first, sizeof(first), "%s", e->w[i].fail);
        }
    }
    assert_int_equal(atomic_load(&e->done), N_THREADS);
    printf("# all %d workers finished %.1f s after the start\n", N_THREADS,
           (double)(kvp_now_ms() - t_start) / 1000);
    print_histogram(e);
    uint64_t good[2] = {0}, bad[2] = {0}, tolerated = 0;
    for (int t = 0; t < N_THREADS; t++) {
        for (int i = 0; i < 2; i++) {
            good[i] += e->w[t].settled_good[i];
            bad[i] += e->w[t].settled_bad[i];
        }
        tolerated += e->w[t].tolerated;
    }
    bool recovered = true;
    for (int i = 0; i < 2; i++) {
        uint64_t p = atomic_load(&e->put_after[i]), g = atomic_load(&e->get_after[i]);
        printf("# after the %s: first OK put / hit %" PRId64 " / %" PRId64
               " ms later; from %d s later on, %" PRIu64 " of %" PRIu64
               " put and get keys failed with a network or transfer error\n",
               i == 0 ? "master restart" : "owner kill", p == UINT64_MAX ? -1 : (int64_t)p,
               g == UINT64_MAX ? -1 : (int64_t)g, SETTLE_MS / 1000, bad[i], good[i] + bad[i]);
        recovered &= p != UINT64_MAX && g != UINT64_MAX && bad[i] * 10 <= good[i] + bad[i];
    }
    if (tolerated > 0)
        printf("# %" PRIu64 " put keys around the disruptions came back NOT_FOUND / NOT_PENDING "
               "(not a documented put status; tolerated unless KVPOOL_STRESS_STRICT=1)\n",
               tolerated);
    if (failed > 0)
        fail_msg("%d of %d workers failed; first: %s", failed, N_THREADS, first);
    if (atomic_load(&e->put_after[0]) == UINT64_MAX || atomic_load(&e->get_after[0]) == UINT64_MAX)
        fail_msg("no put or no get succeeded after the master restart");

    /* 4. the shared client works as new: a fresh round, every step OK */
    char why[256] = "";
    if (!final_round(e->client, "shared", why, sizeof(why)))
        recovered = false;
    if (!recovered) {
        if (e->strict)
            fail_msg("the shared client did not recover: settled windows above (at most 10 %% "
                     "failed keys), and the final round: %s",
                     why[0] ? why : "OK");
        printf("# NOT RECOVERED (tolerated unless KVPOOL_STRESS_STRICT=1): see the settled "
               "windows above; final round on the shared client: %s\n",
               why[0] ? why : "OK");
    }
    /* whatever the shared client's state, the pool itself recovered: a new client works */
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = e->addr;
    p.transport = e->transport;
    p.rpc_timeout_ms = RPC_TIMEOUT_MS;
    kvp_client_t *fresh = NULL;
    assert_int_equal(kvp_client_create(&p, &fresh), KVP_OK);
    bool fresh_ok = final_round(fresh, "fresh", why, sizeof(why));
    kvp_client_destroy(fresh);
    if (!fresh_ok)
        fail_msg("a new client after the run: %s", why);

    /* nothing left half-written: every put ended or was revoked */
    size_t n_seg = 0;
    uint64_t pending = UINT64_MAX;
    bool owners = false;
    for (int i = 0; i < 100 && pending != 0; i++) {
        assert_int_equal(main_stat(e, &n_seg, &pending, &owners), KVP_OK);
        if (pending != 0)
            fault_sleep_ms(50);
    }
    assert_int_equal(pending, 0);
    assert_int_equal(n_seg, 2); /* owner B and the client's own */
    assert_true(owners);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stress, setup, teardown),
    };
    return cmocka_run_group_tests_name("stress", tests, NULL, NULL);
}
