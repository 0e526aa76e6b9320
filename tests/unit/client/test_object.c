/*
 * test_object.c - unit tests for client/object.c, the object flows: batch put / get / exist /
 * remove, scatter/gather pieces, ranged reads, replicas; and the transfer sessions
 * (client/xfer_sessions.c), which run on the same pieces and fakes.
 *
 * The flows run for real: a real kvpool-master on 127.0.0.1 (tests/harness.c) and two
 * segments ("seg-a", "seg-b") mounted by clients of this process. Only the transport is a
 * fake: kvp_transports_test puts "fake-shm" behind every client this test creates, the real
 * shm transport (kvp_transport_shm_ops) with its submit wrapped. Rules set by a test make it
 * fail an op with a status of the test's choosing, corrupt what a READ landed (a byte is
 * flipped and the CRC the op reports is the landed bytes', as a transport that checksums
 * what arrived would say), or delay an op; a rule picks ops by direction, segment (or the
 * segment of the first op it acts on: a replica that stays broken, whichever is read first)
 * and local buffer (a piece), for `left` ops (-1: all).
 *
 * What is asserted is what a user checks through kvpool.h: the bytes that come back (and
 * that nothing is written past them), per-key statuses, replicas written, kvp_is_exist,
 * the bytes each segment holds (kvp_pool_stat: a failed extent is freed) and
 * kvp_client_last_error. The fake's counts only show that a path was really taken (a
 * fallback followed a failed read; a replica that was not written is never read).
 *
 * Fixtures: the master and the two segment owners are started once per group; each test
 * gets a fresh client without a segment of its own (every op goes through the fake to a
 * peer, and no peer carries an earlier test's failure time, which orders replicas) and
 * keys of its own. The second group's master has read leases (0.5 s) for the delay test.
 *
 * Thread: cmocka's; the clients' threads run behind it. The rules are under a lock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/include/kvpool.h"
#include "client/transfer/engine.h"
#include "client/transfer/peer.h"
#include "client/transfer/transport.h"
#include "client/transport/transports.h"
#include "client/transfer/xfer.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "tests/harness.h"

#define KIB ((size_t)1024)
#define MIB ((size_t)1024 * 1024)
#define SEG_A "seg-a"
#define SEG_B "seg-b"
#define SEG_BYTES ((uint64_t)32 * MIB)
#define UNTOUCHED 0xEE /* what a buffer holds where a get must not write */

/* ---------------- the fake transport: shm, with rules ---------------- */

typedef enum act {
    ACT_FAIL = 1, /* the op gets `status`, nothing moves */
    ACT_CORRUPT,  /* a READ lands, then one byte of it is flipped */
    ACT_DELAY,    /* delay_ms before the op runs */
} act_t;

typedef struct rule {
    act_t act;
    kvp_xfer_kind_t kind; /* 0: both */
    const char *segment;  /* NULL: any */
    const void *local;    /* NULL: any buffer; else ops on this piece only */
    bool bind;            /* segment NULL: the first op it acts on binds it to that op's
                             segment (a replica that stays broken, whichever is read first) */
    char bound[256];
    int left;            /* ops it acts on; -1: every one */
    kvp_status_t status; /* ACT_FAIL */
    unsigned delay_ms;   /* ACT_DELAY */
    int hits;            /* ops it acted on */
} rule_t;

#define RULES_MAX 4

static struct {
    pthread_mutex_t lock;
    rule_t rules[RULES_MAX];
    int n_rules;
    int ops[3][3]; /* [seg-a, seg-b, other][kind]: ops submitted (failed ones too) */
} fk = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int seg_index(const char *name)
{
    return strcmp(name, SEG_A) == 0 ? 0 : strcmp(name, SEG_B) == 0 ? 1 : 2;
}

static rule_t *add_rule(rule_t r)
{
    pthread_mutex_lock(&fk.lock);
    assert_true(fk.n_rules < RULES_MAX);
    rule_t *p = &fk.rules[fk.n_rules++];
    *p = r;
    pthread_mutex_unlock(&fk.lock);
    return p;
}

static void fake_reset(void)
{
    pthread_mutex_lock(&fk.lock);
    memset(fk.rules, 0, sizeof(fk.rules));
    fk.n_rules = 0;
    memset(fk.ops, 0, sizeof(fk.ops));
    pthread_mutex_unlock(&fk.lock);
}

static int rule_hits(const rule_t *r)
{
    pthread_mutex_lock(&fk.lock);
    int h = r->hits;
    pthread_mutex_unlock(&fk.lock);
    return h;
}

static int ops_to(const char *segment, kvp_xfer_kind_t kind)
{
    pthread_mutex_lock(&fk.lock);
    int n = fk.ops[seg_index(segment)][kind];
    pthread_mutex_unlock(&fk.lock);
    return n;
}

/* The rule acting on op (its counts taken), copied to *out; false: the op runs as is. */
static bool rule_for(const kvp_xfer_op_t *op, rule_t *out)
{
    bool found = false;
    pthread_mutex_lock(&fk.lock);
    fk.ops[seg_index(op->peer->name)][op->kind]++;
    for (int i = 0; i < fk.n_rules && !found; i++) {
        rule_t *r = &fk.rules[i];
        if ((r->kind != 0 && r->kind != op->kind) ||
            (r->segment != NULL && strcmp(r->segment, op->peer->name) != 0) ||
            (r->local != NULL && r->local != op->local) || r->left == 0)
            continue;
        if (r->bind && r->segment == NULL) {
            snprintf(r->bound, sizeof(r->bound), "%s", op->peer->name);
            r->segment = r->bound;
        }
        if (r->left > 0)
            r->left--;
        r->hits++;
        *out = *r;
        found = true;
    }
    pthread_mutex_unlock(&fk.lock);
    return found;
}

static kvp_status_t fake_create(kvp_transfer_t *xfer, unsigned index, void **ctx_p)
{
    return kvp_transport_shm_ops.create(xfer, index, ctx_p);
}

static void fake_destroy(void *ctx)
{
    kvp_transport_shm_ops.destroy(ctx);
}

static kvp_status_t fake_attach(void *ctx, kvp_peer_t *peer, void **state_p)
{
    return kvp_transport_shm_ops.attach(ctx, peer, state_p);
}

static void fake_detach(void *ctx, kvp_peer_t *peer, void *state)
{
    kvp_transport_shm_ops.detach(ctx, peer, state);
}

static bool fake_stale(void *ctx, const kvp_peer_t *peer, const void *state)
{
    return kvp_transport_shm_ops.stale(ctx, peer, state);
}

static void fake_submit(void *ctx, kvp_xfer_op_t **ops, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = ops[i];
        rule_t r = {0};
        bool act = rule_for(op, &r);
        if (act && r.act == ACT_FAIL) {
            op->status = r.status;
            continue;
        }
        uint64_t t0 = kvp_now_ns();
        if (act && r.act == ACT_DELAY) {
            struct timespec ts = {r.delay_ms / 1000, (long)(r.delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        kvp_transport_shm_ops.submit(ctx, &op, 1);
        if (op->kind == KVP_XFER_READ && op->status == KVP_OK) /* as tcp measures its reads */
            kvp_peer_read_latency(op->peer, (kvp_now_ns() - t0) / 1000, kvp_now_ms());
        if (act && r.act == ACT_CORRUPT && op->kind == KVP_XFER_READ && op->status == KVP_OK) {
            uint8_t *b = op->local;
            b[op->length / 2] ^= 0x5a;
            if (op->want_crc)
                op->crc = kvp_crc32c(0, op->local, op->length);
        }
    }
}

static const kvp_transport_ops_t fake_shm_ops = {
    .name = "fake-shm",
    .id = KVP_TRANSPORT_SHM,
    .create = fake_create,
    .destroy = fake_destroy,
    .attach = fake_attach,
    .detach = fake_detach,
    .stale = fake_stale,
    .submit = fake_submit,
};
static const kvp_transport_ops_t *const fake_list[] = {&fake_shm_ops, NULL};
/* The same fake routed as tcp (group_setup_remote fills it in): its peers are remote DRAM
 * to the get flow (object.c orders them by their read latency, which shm peers on this
 * host are not) */
static kvp_transport_ops_t fake_remote_ops;
static const kvp_transport_ops_t *const fake_remote_list[] = {&fake_remote_ops, NULL};

/* ---------------- fixtures ---------------- */

typedef struct fixture {
    kvp_proc_t master;
    kvp_client_t *owner[2]; /* mount seg-a, seg-b */
    kvp_client_t *c;        /* the test's client: no segment */
} fixture_t;

static kvp_client_t *client_new(const char *master, uint64_t seg_bytes, const char *seg_name)
{
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = master;
    p.transport = "auto";
    p.segment_size = seg_bytes;
    p.segment_name = seg_name;
    kvp_client_t *c = NULL;
    kvp_status_t st = kvp_client_create(&p, &c);
    if (st != KVP_OK)
        fprintf(stderr, "client create: %s\n", kvp_client_last_error());
    return st == KVP_OK ? c : NULL;
}

static int group_teardown(void **state)
{
    fixture_t *fx = *state;
    for (int i = 0; i < 2; i++)
        kvp_client_destroy(fx->owner[i]);
    int st = kvp_proc_stop(&fx->master, SIGTERM, 10000);
    free(fx);
    if (st != 0)
        fprintf(stderr, "master exited with %d\n", st);
    return st == 0 ? 0 : -1;
}

static int group_setup_list(void **state, char *const args[],
                            const kvp_transport_ops_t *const *list)
{
    /* every engine created from now on (owners' and tests' clients) has only the fake */
    kvp_transports_test = list;
    fixture_t *fx = calloc(1, sizeof(*fx));
    *state = fx;
    if (fx == NULL || !kvp_start_master_args(&fx->master, args))
        return -1;
    fx->owner[0] = client_new(fx->master.ready, SEG_BYTES, SEG_A);
    fx->owner[1] = client_new(fx->master.ready, SEG_BYTES, SEG_B);
    return fx->owner[0] != NULL && fx->owner[1] != NULL ? 0 : -1;
}

static int group_setup_args(void **state, char *const args[])
{
    return group_setup_list(state, args, fake_list);
}

static int group_setup_remote(void **state)
{
    char *args[] = {"--lease-ttl", "0", "--no-eviction", NULL};
    fake_remote_ops = fake_shm_ops;
    fake_remote_ops.name = "fake-remote";
    fake_remote_ops.id = KVP_TRANSPORT_TCP;
    return group_setup_list(state, args, fake_remote_list);
}

static int group_setup(void **state)
{
    /* store semantics: nothing is evicted under a test's feet; no read leases */
    char *args[] = {"--lease-ttl", "0", "--no-eviction", NULL};
    return group_setup_args(state, args);
}

static int group_setup_leases(void **state)
{
    char *args[] = {"--lease-ttl", "0.5", "--no-eviction", NULL};
    return group_setup_args(state, args);
}

static int setup(void **state)
{
    fixture_t *fx = *state;
    fake_reset();
    fx->c = client_new(fx->master.ready, 0, NULL);
    return fx->c != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    kvp_client_destroy(fx->c);
    fx->c = NULL;
    fake_reset();
    return 0;
}

/* ---------------- helpers ---------------- */

static uint8_t *pattern(size_t len, uint64_t seed)
{
    uint8_t *b = malloc(len);
    assert_non_null(b);
    kvp_fill_pattern(b, len, seed);
    return b;
}

static uint8_t *untouched(size_t len)
{
    uint8_t *b = malloc(len);
    assert_non_null(b);
    memset(b, UNTOUCHED, len);
    return b;
}

static bool all_untouched(const uint8_t *b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (b[i] != UNTOUCHED)
            return false;
    return true;
}

/* One key through the batch flow, with replicas and a preferred first segment. */
static kvp_status_t put_one(kvp_client_t *c, const char *key, const void *buf, size_t len,
                            uint32_t replicas, const char *preferred, uint32_t *written)
{
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.replica_num = replicas;
    cfg.preferred_segment = preferred;
    kvp_status_t r = KVP_ERR_PROTOCOL;
    uint32_t w = 99;
    kvp_status_t rc = kvp_batch_put_from_ex(c, &key, &buf, &len, 1, &cfg, &r, &w);
    assert_int_equal(rc, r);
    if (written != NULL)
        *written = w;
    return rc;
}

/* The whole object under key is want[0..len): the size returned, the bytes, nothing past. */
static void assert_get(kvp_client_t *c, const char *key, const uint8_t *want, size_t len)
{
    uint8_t *got = untouched(len + 64);
    assert_int_equal(kvp_get_into(c, key, got, len + 64), (int64_t)len);
    assert_memory_equal(got, want, len);
    assert_true(all_untouched(got + len, 64));
    free(got);
}

static uint64_t seg_used(kvp_client_t *c, const char *name)
{
    kvp_pool_stat_t *s = NULL;
    assert_int_equal(kvp_pool_stat(c, &s), KVP_OK);
    uint64_t used = UINT64_MAX;
    for (size_t i = 0; i < s->n_segments; i++)
        if (strcmp(s->segments[i].name, name) == 0)
            used = s->segments[i].used;
    kvp_pool_stat_free(s);
    assert_true(used != UINT64_MAX);
    return used;
}

static void assert_last_error_has(const char *what)
{
    const char *e = kvp_client_last_error();
    if (strstr(e, what) == NULL)
        fail_msg("last error \"%s\" does not name \"%s\"", e, what);
}

/* ---------------- plain batches ---------------- */

/* Batch put, exist, get and remove of keys of several sizes (one byte; over the 1 MiB at
 * which copies stream): every byte back, nothing past it; gone after the remove. */
static void test_batch_roundtrip(void **state)
{
    fixture_t *fx = *state;
    const char *keys[4] = {"rt/one-byte", "rt/4000", "rt/1MiB+3", "rt/64KiB"};
    size_t sizes[4] = {1, 4000, MIB + 3, 64 * KIB};
    const void *bufs[4];
    for (int i = 0; i < 4; i++)
        bufs[i] = pattern(sizes[i], 100 + (uint64_t)i);
    kvp_status_t res[4];
    assert_int_equal(kvp_batch_put_from(fx->c, keys, bufs, sizes, 4, NULL, res), KVP_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(res[i], KVP_OK);

    const char *ask[5] = {keys[0], keys[1], keys[2], keys[3], "rt/never-put"};
    int ex[5];
    size_t prefix = 99;
    assert_int_equal(kvp_batch_is_exist(fx->c, ask, 5, ex, &prefix), KVP_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(ex[i], 1);
    assert_int_equal(ex[4], 0);
    assert_int_equal(prefix, 4);

    void *out[4];
    size_t caps[4];
    for (int i = 0; i < 4; i++) {
        caps[i] = sizes[i] + (size_t)i * 100; /* exact, then larger */
        out[i] = untouched(caps[i]);
    }
    int64_t got[4];
    assert_int_equal(kvp_batch_get_into(fx->c, keys, out, caps, 4, got), KVP_OK);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(got[i], (int64_t)sizes[i]);
        assert_memory_equal(out[i], bufs[i], sizes[i]);
        assert_true(all_untouched((uint8_t *)out[i] + sizes[i], caps[i] - sizes[i]));
    }

    assert_int_equal(kvp_batch_remove(fx->c, keys, 4, res), KVP_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(res[i], KVP_OK);
    assert_int_equal(kvp_batch_is_exist(fx->c, ask, 5, ex, &prefix), KVP_OK);
    for (int i = 0; i < 5; i++)
        assert_int_equal(ex[i], 0);
    assert_int_equal(prefix, 0);
    assert_int_equal(kvp_get_into(fx->c, keys[1], out[1], caps[1]), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_batch_remove(fx->c, keys, 4, res), KVP_ERR_NOT_FOUND);
    for (int i = 0; i < 4; i++)
        assert_int_equal(res[i], KVP_ERR_NOT_FOUND);
    for (int i = 0; i < 4; i++) {
        free((void *)bufs[i]);
        free(out[i]);
    }
}

/* A put batch mixing good keys with an existing key, an empty and a NULL key, an empty
 * object and a NULL buffer: each key its own status, the call the first failure's, the good
 * keys stored, the existing one unchanged. */
static void test_batch_put_mixed(void **state)
{
    fixture_t *fx = *state;
    uint8_t *old = pattern(300, 1), *a = pattern(500, 2), *b = pattern(700, 3);
    assert_int_equal(put_one(fx->c, "pm/exists", old, 300, 1, NULL, NULL), KVP_OK);

    const char *keys[6] = {"pm/a", "pm/exists", "", NULL, "pm/empty", "pm/b"};
    const void *bufs[6] = {a, b, a, a, a, b};
    size_t sizes[6] = {500, 700, 500, 500, 0, 700};
    kvp_status_t res[6];
    assert_int_equal(kvp_batch_put_from(fx->c, keys, bufs, sizes, 6, NULL, res), KVP_ERR_EXISTS);
    assert_int_equal(res[0], KVP_OK);
    assert_int_equal(res[1], KVP_ERR_EXISTS);
    assert_int_equal(res[2], KVP_ERR_BAD_KEY);
    assert_int_equal(res[3], KVP_ERR_BAD_KEY);
    assert_int_equal(res[4], KVP_ERR_INVALID_ARG);
    assert_int_equal(res[5], KVP_OK);
    assert_last_error_has("pm/exists");

    /* a NULL buffer of a non-empty object: that key alone is refused */
    const char *k2[2] = {"pm/null-buf", "pm/c"};
    const void *b2[2] = {NULL, a};
    size_t s2[2] = {10, 500};
    assert_int_equal(kvp_batch_put_from(fx->c, k2, b2, s2, 2, NULL, res), KVP_ERR_INVALID_ARG);
    assert_int_equal(res[0], KVP_ERR_INVALID_ARG);
    assert_int_equal(res[1], KVP_OK);

    assert_get(fx->c, "pm/a", a, 500);
    assert_get(fx->c, "pm/b", b, 700);
    assert_get(fx->c, "pm/c", a, 500);
    assert_get(fx->c, "pm/exists", old, 300);
    assert_int_equal(kvp_is_exist(fx->c, "pm/empty"), 0);
    assert_int_equal(kvp_is_exist(fx->c, "pm/null-buf"), 0);
    free(old);
    free(a);
    free(b);
}

/* A get batch mixing found keys with a missing one, one whose buffer is too small (nothing
 * written to it), a bad key and a NULL buffer: per-key results, the call the first
 * failure's, the found ones' bytes. */
static void test_batch_get_mixed(void **state)
{
    fixture_t *fx = *state;
    uint8_t *a = pattern(1000, 11), *b = pattern(2000, 12);
    assert_int_equal(put_one(fx->c, "gm/a", a, 1000, 1, NULL, NULL), KVP_OK);
    assert_int_equal(put_one(fx->c, "gm/b", b, 2000, 1, NULL, NULL), KVP_OK);

    const char *keys[6] = {"gm/a", "gm/missing", "gm/b", "", "gm/a", "gm/b"};
    void *out[6];
    size_t caps[6] = {1000, 100, 1999, 100, 1000, 4096};
    for (int i = 0; i < 6; i++)
        out[i] = untouched(caps[i]);
    free(out[4]);
    out[4] = NULL;
    int64_t got[6];
    assert_int_equal(kvp_batch_get_into(fx->c, keys, out, caps, 6, got), KVP_ERR_NOT_FOUND);
    assert_int_equal(got[0], 1000);
    assert_int_equal(got[1], KVP_ERR_NOT_FOUND);
    assert_int_equal(got[2], KVP_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(got[3], KVP_ERR_BAD_KEY);
    assert_int_equal(got[4], KVP_ERR_INVALID_ARG);
    assert_int_equal(got[5], 2000);
    assert_memory_equal(out[0], a, 1000);
    assert_memory_equal(out[5], b, 2000);
    assert_true(all_untouched(out[1], caps[1]));
    assert_true(all_untouched(out[2], caps[2]));
    assert_true(all_untouched((uint8_t *)out[5] + 2000, caps[5] - 2000));
    assert_last_error_has("gm/missing");

    /* one key: the status itself */
    assert_int_equal(kvp_get_into(fx->c, "gm/b", out[2], caps[2]), KVP_ERR_BUFFER_TOO_SMALL);
    assert_true(all_untouched(out[2], caps[2]));
    for (int i = 0; i < 6; i++)
        free(out[i]);
    free(a);
    free(b);
}

/* Exist and remove batches mixing present, absent and bad keys: each key's answer in its
 * own place, the cached prefix. */
static void test_batch_exist_remove_mixed(void **state)
{
    fixture_t *fx = *state;
    uint8_t *v = pattern(64, 21);
    const char *present[3] = {"er/p0", "er/p1", "er/p2"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(put_one(fx->c, present[i], v, 64, 1, NULL, NULL), KVP_OK);

    const char *ask[6] = {"er/p0", "er/p1", "er/absent", "", "er/p2", "er/absent2"};
    int ex[6];
    size_t prefix = 99;
    assert_int_equal(kvp_batch_is_exist(fx->c, ask, 6, ex, &prefix), KVP_OK);
    assert_int_equal(ex[0], 1);
    assert_int_equal(ex[1], 1);
    assert_int_equal(ex[2], 0);
    assert_int_equal(ex[3], KVP_ERR_BAD_KEY);
    assert_int_equal(ex[4], 1);
    assert_int_equal(ex[5], 0);
    assert_int_equal(prefix, 2);

    const char *rm[4] = {"er/absent", "er/p1", "", "er/p2"};
    kvp_status_t res[4];
    assert_int_equal(kvp_batch_remove(fx->c, rm, 4, res), KVP_ERR_NOT_FOUND);
    assert_int_equal(res[0], KVP_ERR_NOT_FOUND);
    assert_int_equal(res[1], KVP_OK);
    assert_int_equal(res[2], KVP_ERR_BAD_KEY);
    assert_int_equal(res[3], KVP_OK);
    assert_int_equal(kvp_batch_is_exist(fx->c, ask, 6, ex, &prefix), KVP_OK);
    assert_int_equal(ex[0], 1);
    assert_int_equal(ex[1], 0);
    assert_int_equal(ex[4], 0);
    assert_int_equal(prefix, 1);
    assert_get(fx->c, "er/p0", v, 64);
    free(v);
}

/* ---------------- failed writes ---------------- */

/* Two replicas, the write to `failing` fails: the key is stored with one replica, read back
 * right from the other (never from the failed one), and the failed extent is freed. seg-a
 * takes the first replica, the one whose write computes the CRC on the way: when it fails
 * the CRC comes from the source. Plain and scatter/gather puts. */
static void one_replica_write_fails(fixture_t *fx, const char *failing, const char *other)
{
    uint64_t used_failing = seg_used(fx->c, failing), used_other = seg_used(fx->c, other);
    rule_t *r = add_rule((rule_t){.act = ACT_FAIL,
                                  .kind = KVP_XFER_WRITE,
                                  .segment = failing,
                                  .left = -1,
                                  .status = KVP_ERR_IO});
    char key[64], mkey[64];
    snprintf(key, sizeof(key), "rw/%s/plain", failing);
    snprintf(mkey, sizeof(mkey), "rw/%s/multi", failing);
    uint8_t *v = pattern(10000, 31);
    uint32_t written = 0;
    assert_int_equal(put_one(fx->c, key, v, 10000, 2, SEG_A, &written), KVP_OK);
    assert_int_equal(written, 1);
    assert_int_equal(rule_hits(r), 1);

    /* the same bytes in three pieces, the middle one empty */
    const void *pieces[3] = {v, NULL, v + 4000};
    size_t psz[3] = {4000, 0, 6000};
    const void *const *bufs[1] = {pieces};
    const size_t *sizes[1] = {psz};
    size_t n_bufs[1] = {3};
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.replica_num = 2;
    cfg.preferred_segment = SEG_A;
    kvp_status_t res = KVP_ERR_PROTOCOL;
    const char *mk = mkey;
    assert_int_equal(kvp_batch_put_from_multi(fx->c, &mk, bufs, sizes, n_bufs, 1, &cfg, &res),
                     KVP_OK);
    assert_int_equal(res, KVP_OK);
    assert_int_equal(rule_hits(r), 3); /* its two pieces failed */

    /* the failed extents were freed, the written ones kept */
    assert_true(seg_used(fx->c, failing) == used_failing);
    assert_true(seg_used(fx->c, other) >= used_other + 20000);

    fake_reset();
    assert_get(fx->c, key, v, 10000);
    assert_get(fx->c, mkey, v, 10000);
    assert_int_equal(ops_to(failing, KVP_XFER_READ), 0);
    assert_int_equal(ops_to(other, KVP_XFER_READ), 2);
    free(v);
}

static void test_first_replica_write_fails(void **state)
{
    one_replica_write_fails(*state, SEG_A, SEG_B);
}

static void test_second_replica_write_fails(void **state)
{
    one_replica_write_fails(*state, SEG_B, SEG_A);
}

/* A put whose writes all fail: the key is not visible (exist 0, get NOT_FOUND), its space
 * is given back, last_error names it, and a later put of the same key succeeds. Two
 * replicas: KVP_ERR_NO_REPLICA; one: the write's own failure. */
static void write_fails_everywhere(fixture_t *fx, const char *key, uint32_t replicas,
                                   kvp_status_t injected, kvp_status_t want)
{
    uint64_t used_a = seg_used(fx->c, SEG_A), used_b = seg_used(fx->c, SEG_B);
    rule_t *r =
        add_rule((rule_t){.act = ACT_FAIL, .kind = KVP_XFER_WRITE, .left = -1, .status = injected});
    uint8_t *v = pattern(5000, 41);
    assert_int_equal(put_one(fx->c, key, v, 5000, replicas, NULL, NULL), want);
    assert_int_equal(rule_hits(r), (int)replicas);
    assert_last_error_has(key);
    assert_int_equal(kvp_is_exist(fx->c, key), 0);
    uint8_t buf[16];
    assert_int_equal(kvp_get_into(fx->c, key, buf, sizeof(buf)), KVP_ERR_NOT_FOUND);
    assert_true(seg_used(fx->c, SEG_A) == used_a);
    assert_true(seg_used(fx->c, SEG_B) == used_b);

    fake_reset();
    uint32_t written = 0;
    assert_int_equal(put_one(fx->c, key, v, 5000, replicas, NULL, &written), KVP_OK);
    assert_int_equal(written, replicas);
    assert_get(fx->c, key, v, 5000);
    free(v);
}

static void test_write_fails_all_replicas(void **state)
{
    write_fails_everywhere(*state, "wf/two", 2, KVP_ERR_IO, KVP_ERR_NO_REPLICA);
}

static void test_write_fails_single_replica(void **state)
{
    write_fails_everywhere(*state, "wf/one", 1, KVP_ERR_TIMEOUT, KVP_ERR_TIMEOUT);
}

/* A batch whose middle key's write fails: that key alone fails (and is not visible, and can
 * be put again), the others are stored. */
static void test_batch_write_fails_one_key(void **state)
{
    fixture_t *fx = *state;
    uint8_t *v[3] = {pattern(3000, 51), pattern(3000, 52), pattern(3000, 53)};
    const char *keys[3] = {"bw/k0", "bw/k1", "bw/k2"};
    const void *bufs[3] = {v[0], v[1], v[2]};
    size_t sizes[3] = {3000, 3000, 3000};
    rule_t *r = add_rule((rule_t){
        .act = ACT_FAIL, .kind = KVP_XFER_WRITE, .local = v[1], .left = -1, .status = KVP_ERR_IO});
    kvp_status_t res[3];
    assert_int_equal(kvp_batch_put_from(fx->c, keys, bufs, sizes, 3, NULL, res), KVP_ERR_IO);
    assert_int_equal(res[0], KVP_OK);
    assert_int_equal(res[1], KVP_ERR_IO);
    assert_int_equal(res[2], KVP_OK);
    assert_int_equal(rule_hits(r), 1);
    assert_last_error_has("bw/k1");
    int ex[3];
    size_t prefix = 0;
    assert_int_equal(kvp_batch_is_exist(fx->c, keys, 3, ex, &prefix), KVP_OK);
    assert_int_equal(ex[0], 1);
    assert_int_equal(ex[1], 0);
    assert_int_equal(ex[2], 1);
    assert_int_equal(prefix, 1);
    assert_get(fx->c, "bw/k0", v[0], 3000);
    assert_get(fx->c, "bw/k2", v[2], 3000);

    fake_reset();
    assert_int_equal(put_one(fx->c, "bw/k1", v[1], 3000, 1, NULL, NULL), KVP_OK);
    assert_get(fx->c, "bw/k1", v[1], 3000);
    for (int i = 0; i < 3; i++)
        free(v[i]);
}

/* ---------------- failed and corrupted reads ---------------- */

/* Two replicas, the one read first stays broken (every read from it fails): the get is
 * served by the other replica, right bytes, for a whole get, the one key of a batch whose
 * read failed, and a ranged read; a call that succeeds leaves last_error as it was. */
static void test_get_falls_back_to_other_replica(void **state)
{
    fixture_t *fx = *state;
    uint8_t *v = pattern(20000, 61), *w = pattern(30000, 62);
    assert_int_equal(put_one(fx->c, "fb/v", v, 20000, 2, NULL, NULL), KVP_OK);
    assert_int_equal(put_one(fx->c, "fb/w", w, 30000, 2, NULL, NULL), KVP_OK);
    uint8_t tiny[1];
    assert_int_equal(kvp_get_into(fx->c, "fb/not-there", tiny, 1), KVP_ERR_NOT_FOUND);
    char before[512];
    snprintf(before, sizeof(before), "%s", kvp_client_last_error());

    rule_t *r = add_rule((rule_t){.act = ACT_FAIL,
                                  .kind = KVP_XFER_READ,
                                  .bind = true,
                                  .left = -1,
                                  .status = KVP_ERR_TIMEOUT});
    assert_get(fx->c, "fb/v", v, 20000);
    assert_int_equal(rule_hits(r), 1);
    assert_int_equal(ops_to(SEG_A, KVP_XFER_READ), 1);
    assert_int_equal(ops_to(SEG_B, KVP_XFER_READ), 1);
    assert_string_equal(kvp_client_last_error(), before);

    /* a batch: only w's read fails, and w is read again from its other replica */
    fake_reset();
    const char *keys[2] = {"fb/v", "fb/w"};
    void *out[2] = {untouched(20000), untouched(30000)};
    size_t caps[2] = {20000, 30000};
    r = add_rule((rule_t){.act = ACT_FAIL,
                          .kind = KVP_XFER_READ,
                          .local = out[1],
                          .bind = true,
                          .left = -1,
                          .status = KVP_ERR_IO});
    int64_t got[2];
    assert_int_equal(kvp_batch_get_into(fx->c, keys, out, caps, 2, got), KVP_OK);
    assert_int_equal(got[0], 20000);
    assert_int_equal(got[1], 30000);
    assert_memory_equal(out[0], v, 20000);
    assert_memory_equal(out[1], w, 30000);
    assert_int_equal(rule_hits(r), 1);
    assert_int_equal(ops_to(SEG_A, KVP_XFER_READ) + ops_to(SEG_B, KVP_XFER_READ), 3);

    /* a ranged read falls back the same way */
    fake_reset();
    r = add_rule((rule_t){.act = ACT_FAIL,
                          .kind = KVP_XFER_READ,
                          .bind = true,
                          .left = -1,
                          .status = KVP_ERR_TIMEOUT});
    uint8_t *part = untouched(100);
    kvp_range_t range = {.key = "fb/w", .offset = 12345, .length = 100, .buf = part};
    int64_t n = 0;
    assert_int_equal(kvp_get_into_ranges(fx->c, &range, 1, &n), KVP_OK);
    assert_int_equal(n, 100);
    assert_memory_equal(part, w + 12345, 100);
    assert_int_equal(rule_hits(r), 1);
    assert_string_equal(kvp_client_last_error(), before);
    free(part);
    free(out[0]);
    free(out[1]);
    free(v);
    free(w);
}

/* Every read fails: two replicas give KVP_ERR_NO_REPLICA (both tried), one replica keeps its
 * own failure; last_error names the key; once reads work again the key reads right. */
static void test_get_all_replicas_fail(void **state)
{
    fixture_t *fx = *state;
    uint8_t *v = pattern(8000, 71);
    assert_int_equal(put_one(fx->c, "nr/two", v, 8000, 2, NULL, NULL), KVP_OK);
    assert_int_equal(put_one(fx->c, "nr/one", v, 8000, 1, NULL, NULL), KVP_OK);
    rule_t *r = add_rule(
        (rule_t){.act = ACT_FAIL, .kind = KVP_XFER_READ, .left = -1, .status = KVP_ERR_TIMEOUT});
    uint8_t *out = untouched(8000);
    assert_int_equal(kvp_get_into(fx->c, "nr/two", out, 8000), KVP_ERR_NO_REPLICA);
    assert_int_equal(rule_hits(r), 2);
    assert_last_error_has("nr/two");
    assert_int_equal(kvp_get_into(fx->c, "nr/one", out, 8000), KVP_ERR_TIMEOUT);
    assert_int_equal(rule_hits(r), 3);
    assert_last_error_has("nr/one");

    /* in a batch, and ranged: the same per key */
    const char *keys[2] = {"nr/one", "nr/two"};
    void *outs[2] = {out, out};
    size_t caps[2] = {8000, 8000};
    int64_t got[2];
    assert_int_equal(kvp_batch_get_into(fx->c, keys, outs, caps, 2, got), KVP_ERR_TIMEOUT);
    assert_int_equal(got[0], KVP_ERR_TIMEOUT);
    assert_int_equal(got[1], KVP_ERR_NO_REPLICA);
    kvp_range_t range = {.key = "nr/two", .offset = 10, .length = 10, .buf = out};
    int64_t n = 0;
    assert_int_equal(kvp_get_into_ranges(fx->c, &range, 1, &n), KVP_ERR_NO_REPLICA);
    assert_int_equal(n, KVP_ERR_NO_REPLICA);

    fake_reset();
    assert_get(fx->c, "nr/two", v, 8000);
    assert_get(fx->c, "nr/one", v, 8000);
    free(out);
    free(v);
}

/* A read whose bytes are corrupted on the way: KVP_ERR_CHECKSUM, and last_error names the key
 * and the segment; with a second replica the get is served by it, right bytes; with both
 * corrupted, KVP_ERR_CHECKSUM (not NO_REPLICA). In a batch only that key fails. */
static void test_get_corrupted_read(void **state)
{
    fixture_t *fx = *state;
    uint8_t *v = pattern(4096, 81), *w = pattern(5000, 82);
    assert_int_equal(put_one(fx->c, "cr/one", v, 4096, 1, SEG_B, NULL), KVP_OK);
    assert_int_equal(put_one(fx->c, "cr/two", w, 5000, 2, NULL, NULL), KVP_OK);

    rule_t *r = add_rule((rule_t){.act = ACT_CORRUPT, .kind = KVP_XFER_READ, .left = -1});
    uint8_t *out = untouched(5000);
    assert_int_equal(kvp_get_into(fx->c, "cr/one", out, 5000), KVP_ERR_CHECKSUM);
    assert_int_equal(rule_hits(r), 1);
    assert_last_error_has("cr/one");
    assert_last_error_has("checksum");
    assert_last_error_has(SEG_B);
    assert_int_equal(kvp_get_into(fx->c, "cr/two", out, 5000), KVP_ERR_CHECKSUM);
    assert_int_equal(rule_hits(r), 3); /* both replicas read, both corrupted */
    assert_last_error_has("cr/two");

    /* two replicas, one corrupts every read: the other one serves it */
    fake_reset();
    r = add_rule((rule_t){.act = ACT_CORRUPT, .kind = KVP_XFER_READ, .bind = true, .left = -1});
    assert_get(fx->c, "cr/two", w, 5000);
    assert_int_equal(rule_hits(r), 1);

    /* a batch: the corrupted key alone fails */
    fake_reset();
    const char *keys[2] = {"cr/two", "cr/one"};
    void *outs[2] = {untouched(5000), untouched(4096)};
    size_t caps[2] = {5000, 4096};
    r = add_rule((rule_t){.act = ACT_CORRUPT, .kind = KVP_XFER_READ, .local = outs[1], .left = 1});
    int64_t got[2];
    assert_int_equal(kvp_batch_get_into(fx->c, keys, outs, caps, 2, got), KVP_ERR_CHECKSUM);
    assert_int_equal(got[0], 5000);
    assert_int_equal(got[1], KVP_ERR_CHECKSUM);
    assert_memory_equal(outs[0], w, 5000);
    assert_int_equal(rule_hits(r), 1);
    assert_last_error_has("cr/one");

    fake_reset();
    assert_get(fx->c, "cr/one", v, 4096);
    free(outs[0]);
    free(outs[1]);
    free(out);
    free(v);
    free(w);
}

/* ---------------- scatter/gather ---------------- */

/* A multi put (pieces of several sizes, an empty NULL one, one over 1 MiB) reads back as
 * the concatenation through a plain get and through multi gets cut differently (the true
 * length returned, nothing written past it); a plain put reads back through a multi get;
 * total capacity one byte short: KVP_ERR_BUFFER_TOO_SMALL, nothing written; a corrupted
 * piece: KVP_ERR_CHECKSUM. */
static void test_multi_put_get(void **state)
{
    fixture_t *fx = *state;
    const size_t total = 100 + 1 + 5000 + MIB;
    uint8_t *v = pattern(total, 91);
    const void *pieces[5] = {v, NULL, v + 100, v + 101, v + 5101};
    size_t psz[5] = {100, 0, 1, 5000, MIB};
    const void *const *bufs[1] = {pieces};
    const size_t *sizes[1] = {psz};
    size_t n_bufs[1] = {5};
    const char *key = "mp/obj";
    kvp_status_t res = KVP_ERR_PROTOCOL;
    assert_int_equal(kvp_batch_put_from_multi(fx->c, &key, bufs, sizes, n_bufs, 1, NULL, &res),
                     KVP_OK);
    assert_int_equal(res, KVP_OK);
    assert_int_equal(kvp_get_size(fx->c, key), (int64_t)total);
    assert_get(fx->c, key, v, total);

    /* gathered into other cuts: [7][empty][rest - 10][10 + 40 spare][64 spare] */
    void *g[5] = {untouched(7), NULL, untouched(total - 17), untouched(50), untouched(64)};
    size_t gsz[5] = {7, 0, total - 17, 50, 64};
    void *const *gbufs[1] = {g};
    const size_t *gsizes[1] = {gsz};
    int64_t got = 0;
    assert_int_equal(kvp_batch_get_into_multi(fx->c, &key, gbufs, gsizes, n_bufs, 1, &got), KVP_OK);
    assert_int_equal(got, (int64_t)total);
    assert_memory_equal(g[0], v, 7);
    assert_memory_equal(g[2], v + 7, total - 17);
    assert_memory_equal(g[3], v + total - 10, 10);
    assert_true(all_untouched((uint8_t *)g[3] + 10, 40));
    assert_true(all_untouched(g[4], 64));

    /* one byte short in all: refused, nothing written */
    void *s[2] = {untouched(1000), untouched(total - 1001)};
    size_t ssz[2] = {1000, total - 1001};
    void *const *sbufs[1] = {s};
    const size_t *ssizes[1] = {ssz};
    size_t n2[1] = {2};
    assert_int_equal(kvp_batch_get_into_multi(fx->c, &key, sbufs, ssizes, n2, 1, &got),
                     KVP_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(got, KVP_ERR_BUFFER_TOO_SMALL);
    assert_true(all_untouched(s[0], ssz[0]));
    assert_true(all_untouched(s[1], ssz[1]));

    /* a corrupted piece (the second buffer's read) fails the whole object's CRC */
    ssz[1] = total - 1000;
    free(s[1]);
    s[1] = untouched(ssz[1]);
    rule_t *r =
        add_rule((rule_t){.act = ACT_CORRUPT, .kind = KVP_XFER_READ, .local = s[1], .left = -1});
    assert_int_equal(kvp_batch_get_into_multi(fx->c, &key, sbufs, ssizes, n2, 1, &got),
                     KVP_ERR_CHECKSUM);
    assert_int_equal(got, KVP_ERR_CHECKSUM);
    assert_int_equal(rule_hits(r), 1);
    fake_reset();
    assert_int_equal(kvp_batch_get_into_multi(fx->c, &key, sbufs, ssizes, n2, 1, &got), KVP_OK);
    assert_int_equal(got, (int64_t)total);
    assert_memory_equal(s[0], v, 1000);
    assert_memory_equal(s[1], v + 1000, total - 1000);

    /* a plain put, read through pieces */
    const char *pkey = "mp/plain";
    assert_int_equal(put_one(fx->c, pkey, v, 9000, 1, NULL, NULL), KVP_OK);
    void *p[3] = {untouched(3000), untouched(3000), untouched(3000)};
    size_t pps[3] = {3000, 3000, 3000};
    void *const *pbufs[1] = {p};
    const size_t *psizes[1] = {pps};
    size_t n3[1] = {3};
    assert_int_equal(kvp_batch_get_into_multi(fx->c, &pkey, pbufs, psizes, n3, 1, &got), KVP_OK);
    assert_int_equal(got, 9000);
    for (int i = 0; i < 3; i++)
        assert_memory_equal(p[i], v + 3000 * i, 3000);

    const char *rm[2] = {key, pkey};
    kvp_status_t rr[2];
    assert_int_equal(kvp_batch_remove(fx->c, rm, 2, rr), KVP_OK);
    for (int i = 0; i < 5; i++)
        free(g[i]);
    for (int i = 0; i < 2; i++)
        free(s[i]);
    for (int i = 0; i < 3; i++)
        free(p[i]);
    free(v);
}

/* Multi batches mixing good keys with keys whose pieces are wrong (no pieces, a NULL piece
 * of non-zero size, a total of 0) and a missing key: per-key results. */
static void test_multi_batch_mixed(void **state)
{
    fixture_t *fx = *state;
    uint8_t *v = pattern(3000, 95);
    const void *p_good[2] = {v, v + 1000};
    size_t s_good[2] = {1000, 2000};
    const void *p_null[2] = {v, NULL};
    size_t s_null[2] = {1000, 5};
    const void *p_zero[2] = {NULL, v};
    size_t s_zero[2] = {0, 0};
    const char *keys[5] = {"mm/good", "mm/none", "mm/null", "mm/zero", "mm/good2"};
    const void *const *bufs[5] = {p_good, p_good, p_null, p_zero, p_good};
    const size_t *sizes[5] = {s_good, s_good, s_null, s_zero, s_good};
    size_t n_bufs[5] = {2, 0, 2, 2, 2};
    kvp_status_t res[5];
    assert_int_equal(kvp_batch_put_from_multi(fx->c, keys, bufs, sizes, n_bufs, 5, NULL, res),
                     KVP_ERR_INVALID_ARG);
    assert_int_equal(res[0], KVP_OK);
    assert_int_equal(res[1], KVP_ERR_INVALID_ARG);
    assert_int_equal(res[2], KVP_ERR_INVALID_ARG);
    assert_int_equal(res[3], KVP_ERR_INVALID_ARG);
    assert_int_equal(res[4], KVP_OK);
    for (int i = 1; i < 4; i++)
        assert_int_equal(kvp_is_exist(fx->c, keys[i]), 0);

    /* gets: good, missing, too small, a NULL buffer of non-zero capacity, good */
    void *a[2] = {untouched(2500), untouched(600)};
    size_t as[2] = {2500, 600};
    void *small[2] = {untouched(1000), untouched(1999)};
    size_t ss[2] = {1000, 1999};
    void *nb[2] = {untouched(3000), NULL};
    size_t ns[2] = {3000, 1};
    void *b[1] = {untouched(3000)};
    size_t bs[1] = {3000};
    const char *gk[5] = {"mm/good", "mm/missing", "mm/good", "mm/good2", "mm/good2"};
    void *const *gb[5] = {a, a, small, nb, b};
    const size_t *gs[5] = {as, as, ss, ns, bs};
    size_t gn[5] = {2, 2, 2, 2, 1};
    int64_t got[5];
    assert_int_equal(kvp_batch_get_into_multi(fx->c, gk, gb, gs, gn, 5, got), KVP_ERR_NOT_FOUND);
    assert_int_equal(got[0], 3000);
    assert_int_equal(got[1], KVP_ERR_NOT_FOUND);
    assert_int_equal(got[2], KVP_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(got[3], KVP_ERR_INVALID_ARG);
    assert_int_equal(got[4], 3000);
    assert_memory_equal(a[0], v, 2500);
    assert_memory_equal(a[1], v + 2500, 500);
    assert_true(all_untouched((uint8_t *)a[1] + 500, 100));
    assert_true(all_untouched(small[0], 1000));
    assert_true(all_untouched(small[1], 1999));
    assert_true(all_untouched(nb[0], 3000));
    assert_memory_equal(b[0], v, 3000);
    for (int i = 0; i < 2; i++) {
        free(a[i]);
        free(small[i]);
    }
    free(nb[0]);
    free(b[0]);
    free(v);
}

/* ---------------- ranges ---------------- */

/* Ranged reads: the bytes of each range, cut at the object's end (the shorter count, nothing
 * written past it), several ranges of one key, and per-range errors: offset at the end
 * (OUT_OF_RANGE), a missing key, length 0, a NULL buffer, a bad key. */
static void test_ranges(void **state)
{
    fixture_t *fx = *state;
    uint8_t *a = pattern(10000, 101), *b = pattern(300, 102);
    assert_int_equal(put_one(fx->c, "rg/a", a, 10000, 1, NULL, NULL), KVP_OK);
    assert_int_equal(put_one(fx->c, "rg/b", b, 300, 1, NULL, NULL), KVP_OK);
    enum { N = 10 };
    uint8_t *buf[N];
    for (int i = 0; i < N; i++)
        buf[i] = untouched(256);
    kvp_range_t r[N] = {
        {.key = "rg/b", .offset = 50, .length = 200, .buf = buf[0]},
        {.key = "rg/a", .offset = 0, .length = 100, .buf = buf[1]},
        {.key = "rg/a", .offset = 9990, .length = 100, .buf = buf[2]}, /* cut: 10 */
        {.key = "rg/a", .offset = 5000, .length = 1, .buf = buf[3]},
        {.key = "rg/b", .offset = 300, .length = 1, .buf = buf[4]}, /* at the end */
        {.key = "rg/missing", .offset = 0, .length = 10, .buf = buf[5]},
        {.key = "rg/a", .offset = 10, .length = 0, .buf = buf[6]},
        {.key = "rg/a", .offset = 10, .length = 10, .buf = NULL},
        {.key = "", .offset = 0, .length = 10, .buf = buf[8]},
        {.key = "rg/b", .offset = 299, .length = 256, .buf = buf[9]}, /* cut: 1 */
    };
    int64_t got[N];
    assert_int_equal(kvp_get_into_ranges(fx->c, r, N, got), KVP_ERR_OUT_OF_RANGE);
    assert_int_equal(got[0], 200);
    assert_memory_equal(buf[0], b + 50, 200);
    assert_int_equal(got[1], 100);
    assert_memory_equal(buf[1], a, 100);
    assert_int_equal(got[2], 10);
    assert_memory_equal(buf[2], a + 9990, 10);
    assert_true(all_untouched(buf[2] + 10, 246));
    assert_int_equal(got[3], 1);
    assert_int_equal(buf[3][0], a[5000]);
    assert_true(all_untouched(buf[3] + 1, 255));
    assert_int_equal(got[4], KVP_ERR_OUT_OF_RANGE);
    assert_true(all_untouched(buf[4], 256));
    assert_int_equal(got[5], KVP_ERR_NOT_FOUND);
    assert_int_equal(got[6], KVP_ERR_INVALID_ARG);
    assert_int_equal(got[7], KVP_ERR_INVALID_ARG);
    assert_int_equal(got[8], KVP_ERR_BAD_KEY);
    assert_int_equal(got[9], 1);
    assert_int_equal(buf[9][0], b[299]);
    assert_true(all_untouched(buf[9] + 1, 255));
    assert_last_error_has("rg/b");

    /* all good: KVP_OK, a whole object as a range too */
    uint8_t *whole = untouched(10000);
    kvp_range_t ok[2] = {{.key = "rg/a", .offset = 0, .length = 10000, .buf = whole},
                         {.key = "rg/b", .offset = 1, .length = 2, .buf = buf[4]}};
    assert_int_equal(kvp_get_into_ranges(fx->c, ok, 2, got), KVP_OK);
    assert_int_equal(got[0], 10000);
    assert_int_equal(got[1], 2);
    assert_memory_equal(whole, a, 10000);
    assert_memory_equal(buf[4], b + 1, 2);
    free(whole);
    for (int i = 0; i < N; i++)
        free(buf[i]);
    free(a);
    free(b);
}

/* ---------------- read leases (the second group) ---------------- */

/* A read delayed past the master's read lease (0.5 s) is not trusted: KVP_ERR_LEASE_EXPIRED
 * even though its bytes moved; the next get, not delayed, reads it. */
static void test_read_outlasts_lease(void **state)
{
    fixture_t *fx = *state;
    uint8_t *v = pattern(2048, 111);
    assert_int_equal(put_one(fx->c, "ls/v", v, 2048, 1, NULL, NULL), KVP_OK);
    rule_t *r =
        add_rule((rule_t){.act = ACT_DELAY, .kind = KVP_XFER_READ, .left = 1, .delay_ms = 700});
    uint8_t *out = untouched(2048);
    assert_int_equal(kvp_get_into(fx->c, "ls/v", out, 2048), KVP_ERR_LEASE_EXPIRED);
    assert_int_equal(rule_hits(r), 1);
    assert_last_error_has("ls/v");
    assert_get(fx->c, "ls/v", v, 2048);
    free(out);
    free(v);
}

/* Two replicas on remote owners, one of which answers reads 80 ms late: after one get
 * has met it (and one has met the other, not heard from before, so near), gets go to the
 * near one first, right bytes, none to the slow one; a batch too. When the near one fails
 * a read, the slow one still serves it. (tcp measures the latencies on the wire:
 * test_tcp's test_read_latency; tests/net's far-owner scenario end to end.) */
static void test_get_prefers_the_near_replica(void **state)
{
    fixture_t *fx = *state;
    uint8_t *v = pattern(20000, 71), *w = pattern(9000, 72);
    assert_int_equal(put_one(fx->c, "near/v", v, 20000, 2, NULL, NULL), KVP_OK);
    assert_int_equal(put_one(fx->c, "near/w", w, 9000, 2, NULL, NULL), KVP_OK);
    fake_reset();
    rule_t *slow = add_rule((rule_t){
        .act = ACT_DELAY, .kind = KVP_XFER_READ, .bind = true, .left = -1, .delay_ms = 80});
    /* the first get reads the replica the master named first: the slow one from now on */
    assert_get(fx->c, "near/v", v, 20000);
    assert_int_equal(rule_hits(slow), 1);
    const char *far = strcmp(slow->bound, SEG_A) == 0 ? SEG_A : SEG_B;
    const char *near = strcmp(far, SEG_A) == 0 ? SEG_B : SEG_A;
    assert_string_equal(slow->bound, far);
    /* the other replica, not heard from, counts as near: tried next, learnt near */
    assert_get(fx->c, "near/v", v, 20000);
    assert_int_equal(ops_to(near, KVP_XFER_READ), 1);
    for (int i = 0; i < 5; i++) {
        uint64_t t0 = kvp_now_ms();
        assert_get(fx->c, i % 2 ? "near/v" : "near/w", i % 2 ? v : w, i % 2 ? 20000 : 9000);
        assert_true(kvp_now_ms() - t0 < 80); /* not a read of the slow one */
    }
    const char *keys[2] = {"near/v", "near/w"};
    void *out[2] = {untouched(20000), untouched(9000)};
    size_t caps[2] = {20000, 9000};
    int64_t got[2];
    assert_int_equal(kvp_batch_get_into(fx->c, keys, out, caps, 2, got), KVP_OK);
    assert_memory_equal(out[0], v, 20000);
    assert_memory_equal(out[1], w, 9000);
    assert_int_equal(rule_hits(slow), 1); /* the slow replica read once, by the first get */
    assert_int_equal(ops_to(far, KVP_XFER_READ), 1);
    assert_int_equal(ops_to(near, KVP_XFER_READ), 8);

    /* the near one fails its reads: the slow one still serves them */
    rule_t *broken = add_rule((rule_t){
        .act = ACT_FAIL, .kind = KVP_XFER_READ, .segment = near, .left = 1, .status = KVP_ERR_IO});
    assert_get(fx->c, "near/v", v, 20000);
    assert_int_equal(rule_hits(broken), 1);
    assert_int_equal(rule_hits(slow), 2);
    free(out[0]);
    free(out[1]);
    free(v);
    free(w);
}

/* ---------------- transfer sessions (xfer_sessions.c, on the same flows) ---------------- */

#define LAYER ((size_t)4096)
#define LAYERS 4

/* One key's put session: each layer of v written as one range; results[] per layer. */
static void session_put_layers(kvp_client_t *c, const char *key, const uint8_t *v, int64_t *results)
{
    for (size_t l = 0; l < LAYERS; l++) {
        const void *pieces[1] = {v + l * LAYER};
        size_t psz[1] = {LAYER};
        uint64_t off[1] = {l * LAYER};
        const void *const *bufs[1] = {pieces};
        const size_t *sizes[1] = {psz};
        const uint64_t *offs[1] = {off};
        size_t n_bufs[1] = {1};
        results[l] = 0;
        kvp_batch_put_from_multi_ranges(c, &key, bufs, sizes, offs, n_bufs, 1, &results[l]);
    }
}

/* A put session of two replicas whose first range to one of them fails: that replica gets
 * no further range and is dropped at the end (its extent freed); the object is whole on
 * the other, CRC-checked. */
static void test_session_put_replica_fails(void **state)
{
    fixture_t *fx = *state;
    uint64_t used_b = seg_used(fx->c, SEG_B);
    rule_t *r = add_rule((rule_t){.act = ACT_FAIL,
                                  .kind = KVP_XFER_WRITE,
                                  .segment = SEG_B,
                                  .left = 1,
                                  .status = KVP_ERR_IO});
    const char *key = "sess/rep";
    uint8_t *v = pattern(LAYERS * LAYER, 71);
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.replica_num = 2;
    cfg.preferred_segment = SEG_A;
    uint64_t size = LAYERS * LAYER;
    kvp_status_t st = KVP_ERR_PROTOCOL;
    assert_int_equal(kvp_batch_put_session_start(fx->c, &key, &size, 1, &cfg, &st), KVP_OK);
    assert_int_equal(st, KVP_OK);
    int64_t res[LAYERS];
    session_put_layers(fx->c, key, v, res);
    for (int l = 0; l < LAYERS; l++)
        assert_int_equal(res[l], (int64_t)LAYER);
    assert_int_equal(rule_hits(r), 1);
    assert_int_equal(ops_to(SEG_B, KVP_XFER_WRITE), 1); /* never again after it failed */
    assert_int_equal(ops_to(SEG_A, KVP_XFER_WRITE), LAYERS);
    int exists = -1;
    assert_int_equal(kvp_batch_is_exist(fx->c, &key, 1, &exists, NULL), KVP_OK);
    assert_int_equal(exists, 0); /* invisible until the end */
    assert_int_equal(kvp_batch_put_session_end(fx->c, &key, 1, &st), KVP_OK);
    assert_int_equal(st, KVP_OK);
    assert_true(seg_used(fx->c, SEG_B) == used_b);
    fake_reset();
    assert_get(fx->c, key, v, LAYERS * LAYER);
    assert_int_equal(ops_to(SEG_B, KVP_XFER_READ), 0);
    /* the session is over */
    assert_int_equal(kvp_batch_put_session_end(fx->c, &key, 1, &st), KVP_ERR_INVALID_ARG);
    free(v);
}

/* Every write of a one-replica put session fails: each range answers the write's failure,
 * the end KVP_ERR_IO (the master revokes it: nothing visible, its space back), and the key
 * can be put again. */
static void test_session_put_all_writes_fail(void **state)
{
    fixture_t *fx = *state;
    uint64_t used = seg_used(fx->c, SEG_A) + seg_used(fx->c, SEG_B);
    add_rule(
        (rule_t){.act = ACT_FAIL, .kind = KVP_XFER_WRITE, .left = -1, .status = KVP_ERR_TIMEOUT});
    const char *key = "sess/none";
    uint8_t *v = pattern(LAYERS * LAYER, 72);
    uint64_t size = LAYERS * LAYER;
    kvp_status_t st = KVP_ERR_PROTOCOL;
    assert_int_equal(kvp_batch_put_session_start(fx->c, &key, &size, 1, NULL, &st), KVP_OK);
    int64_t res[LAYERS];
    session_put_layers(fx->c, key, v, res);
    assert_int_equal(res[0], KVP_ERR_TIMEOUT);
    assert_int_equal(kvp_batch_put_session_end(fx->c, &key, 1, &st), KVP_ERR_IO);
    assert_int_equal(st, KVP_ERR_IO);
    assert_true(seg_used(fx->c, SEG_A) + seg_used(fx->c, SEG_B) == used);
    fake_reset();
    uint8_t tiny[1];
    assert_int_equal(kvp_get_into(fx->c, key, tiny, 1), KVP_ERR_NOT_FOUND);
    assert_int_equal(put_one(fx->c, key, v, LAYERS * LAYER, 1, NULL, NULL), KVP_OK);
    assert_get(fx->c, key, v, LAYERS * LAYER);
    free(v);
}

/* A get session's reads fall back to the other replica when one keeps failing; a read past
 * the object is refused before anything moves. */
static void test_session_get_falls_back(void **state)
{
    fixture_t *fx = *state;
    const char *key = "sess/get";
    uint8_t *v = pattern(LAYERS * LAYER, 73);
    assert_int_equal(put_one(fx->c, key, v, LAYERS * LAYER, 2, NULL, NULL), KVP_OK);
    kvp_status_t st = KVP_ERR_PROTOCOL;
    assert_int_equal(kvp_batch_get_session_start(fx->c, &key, 1, &st), KVP_OK);
    rule_t *r = add_rule((rule_t){.act = ACT_FAIL,
                                  .kind = KVP_XFER_READ,
                                  .bind = true,
                                  .left = -1,
                                  .status = KVP_ERR_TIMEOUT});
    uint8_t *out = untouched(2 * LAYER);
    void *pieces[2] = {out, out + LAYER};
    size_t psz[2] = {LAYER, LAYER};
    uint64_t off[2] = {3 * LAYER, 100};
    void *const *bufs[1] = {pieces};
    const size_t *sizes[1] = {psz};
    const uint64_t *offs[1] = {off};
    size_t n_bufs[1] = {2};
    int64_t n = 0;
    assert_int_equal(kvp_batch_get_into_multi_ranges(fx->c, &key, bufs, sizes, offs, n_bufs, 1, &n),
                     KVP_OK);
    assert_int_equal(n, (int64_t)(2 * LAYER));
    assert_memory_equal(out, v + 3 * LAYER, LAYER);
    assert_memory_equal(out + LAYER, v + 100, LAYER);
    assert_int_equal(rule_hits(r), 2); /* both pieces, from the failing replica, once */
    fake_reset();
    memset(out, UNTOUCHED, 2 * LAYER);
    off[0] = 3 * LAYER + 1; /* one byte past the end */
    assert_int_equal(kvp_batch_get_into_multi_ranges(fx->c, &key, bufs, sizes, offs, n_bufs, 1, &n),
                     KVP_ERR_INVALID_ARG);
    assert_int_equal(n, KVP_ERR_INVALID_ARG);
    assert_true(all_untouched(out, 2 * LAYER));
    assert_int_equal(ops_to(SEG_A, KVP_XFER_READ) + ops_to(SEG_B, KVP_XFER_READ), 0);
    assert_int_equal(kvp_batch_get_session_end(fx->c, &key, 1), KVP_OK);
    free(out);
    free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_batch_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_put_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_get_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_exist_remove_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_first_replica_write_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_second_replica_write_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_fails_all_replicas, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_fails_single_replica, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_write_fails_one_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_falls_back_to_other_replica, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_all_replicas_fail, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_corrupted_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multi_put_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multi_batch_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ranges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_session_put_replica_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_session_put_all_writes_fail, setup, teardown),
        cmocka_unit_test_setup_teardown(test_session_get_falls_back, setup, teardown),
    };
    const struct CMUnitTest lease_tests[] = {
        cmocka_unit_test_setup_teardown(test_read_outlasts_lease, setup, teardown),
    };
    const struct CMUnitTest remote_tests[] = {
        cmocka_unit_test_setup_teardown(test_get_prefers_the_near_replica, setup, teardown),
    };
    int failed = cmocka_run_group_tests_name("object", tests, group_setup, group_teardown);
    failed += cmocka_run_group_tests_name("object_remote", remote_tests, group_setup_remote,
                                          group_teardown);
    failed += cmocka_run_group_tests_name("object_leases", lease_tests, group_setup_leases,
                                          group_teardown);
    return failed;
}
