/*
 * test_lifecycle.c - object and node lifecycle against real processes: a
 * kvpool-master, `kvpool serve` segments, this process as the client.
 *
 * - upsert: same size in place, other size into new extents, batches mixing
 *   new and existing keys; a plain put of an existing key stays EXISTS;
 * - best-effort replicas: with one of three segment owners frozen (SIGSTOP),
 *   a 3-replica put succeeds with 2 and says so, and reads come back right;
 * - graceful leave: SIGTERM on `kvpool serve` moves its objects to the other
 *   segment before it exits; `kvp_request_drain` makes the owner drain and
 *   exit by itself; puts during a drain avoid the draining segment; with too
 *   little room elsewhere the objects that fit move and the rest are gone;
 * - list and bulk remove by regex, remove all.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "common/clock.h"
#include "tests/harness.h"

#define OBJ 65536

typedef struct env {
    kvp_proc_t master;
    kvp_proc_t seg[3];
    unsigned n_seg;
    kvp_client_t *client;
} env_t;

/* The running environment, stopped by the teardown even when a test fails midway. */
static env_t *g_env;

/* A master with `extra` flags, n segments of `sizes[i]`, one client (tcp). */
static env_t *env_start(char *const extra[], unsigned n, const char *const *sizes,
                        uint32_t rpc_timeout_ms)
{
    env_t *e = calloc(1, sizeof(*e));
    assert_non_null(e);
    assert_true(kvp_start_master_args(&e->master, extra));
    for (unsigned i = 0; i < n; i++)
        assert_true(kvp_start_segment(&e->seg[i], e->master.ready, sizes[i], "tcp"));
    e->n_seg = n;
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = e->master.ready;
    p.transport = "tcp";
    p.rpc_timeout_ms = rpc_timeout_ms;
    assert_int_equal(kvp_client_create(&p, &e->client), KVP_OK);
    g_env = e;
    return e;
}

/* Stop everything; false if a child exited badly (a crash, a sanitizer report). */
static bool env_stop_all(env_t *e)
{
    bool ok = true;
    kvp_client_destroy(e->client);
    for (unsigned i = 0; i < e->n_seg; i++)
        if (e->seg[i].pid > 0 && kvp_proc_stop(&e->seg[i], SIGTERM, 20000) != 0)
            ok = false;
    if (kvp_proc_stop(&e->master, SIGTERM, 10000) != 0)
        ok = false;
    free(e);
    return ok;
}

static void env_stop(env_t *e)
{
    g_env = NULL;
    assert_true(env_stop_all(e));
}

static int teardown(void **state)
{
    (void)state;
    if (g_env != NULL) { /* the test failed before its own env_stop */
        env_t *e = g_env;
        g_env = NULL;
        for (unsigned i = 0; i < e->n_seg; i++)
            if (e->seg[i].pid > 0)
                kill(e->seg[i].pid, SIGCONT);
        env_stop_all(e);
    }
    return 0;
}

static void put_pattern(env_t *e, const char *key, size_t len, uint64_t seed,
                        const kvp_put_config_t *cfg, kvp_status_t want)
{
    uint8_t *buf = malloc(len);
    kvp_fill_pattern(buf, len, seed);
    kvp_status_t st = kvp_put(e->client, key, buf, len, cfg);
    if (st != want)
        fail_msg("put %s: %s, want %s", key, kvp_strerror(st), kvp_strerror(want));
    free(buf);
}

/* The object under key is exactly `len` bytes of pattern `seed`. */
static void expect_pattern(env_t *e, const char *key, size_t len, uint64_t seed)
{
    uint8_t *want = malloc(len), *got = malloc(len + 1);
    kvp_fill_pattern(want, len, seed);
    int64_t n = kvp_get_into(e->client, key, got, len + 1);
    if (n != (int64_t)len)
        fail_msg("get %s: %lld (%s), want %zu bytes", key, (long long)n,
                 n < 0 ? kvp_strerror((kvp_status_t)n) : "size", len);
    assert_memory_equal(got, want, len);
    free(want);
    free(got);
}

static kvp_pool_stat_t *stat_of(env_t *e)
{
    kvp_pool_stat_t *s = NULL;
    assert_int_equal(kvp_pool_stat(e->client, &s), KVP_OK);
    return s;
}

/* ---- upsert ---- */

static void test_upsert(void **state)
{
    (void)state;
    char *flags[] = {"--lease-ttl", "0", NULL};
    const char *sizes[] = {"32MiB"};
    env_t *e = env_start(flags, 1, sizes, 10000);
    kvp_put_config_t up;
    kvp_put_config_init(&up);
    up.mode = KVP_PUT_UPSERT;

    put_pattern(e, "u", OBJ, 1, NULL, KVP_OK);
    put_pattern(e, "u", OBJ, 2, NULL, KVP_ERR_EXISTS); /* insert keeps the old value */
    expect_pattern(e, "u", OBJ, 1);
    put_pattern(e, "u", OBJ, 3, &up, KVP_OK); /* same size: in place */
    expect_pattern(e, "u", OBJ, 3);
    kvp_pool_stat_t *s = stat_of(e);
    assert_int_equal(s->objects, 1);
    assert_int_equal(s->used, OBJ);
    kvp_pool_stat_free(s);
    put_pattern(e, "u", 3 * OBJ + 5, 4, &up, KVP_OK); /* other size: new extents */
    expect_pattern(e, "u", 3 * OBJ + 5, 4);
    assert_int_equal(kvp_get_size(e->client, "u"), 3 * OBJ + 5);
    put_pattern(e, "new", 100, 5, &up, KVP_OK); /* upsert of a new key is a put */
    expect_pattern(e, "new", 100, 5);

    /* a batch mixing existing and new keys */
    enum { N = 8 };
    char keys[N][16];
    const char *kp[N];
    const void *bp[N];
    size_t sz[N];
    uint8_t *bufs[N];
    kvp_status_t res[N];
    for (unsigned i = 0; i < N; i++) {
        snprintf(keys[i], sizeof(keys[i]), "m%u", i);
        kp[i] = keys[i];
        if (i % 2 == 0)
            put_pattern(e, keys[i], OBJ, 100 + i, NULL, KVP_OK);
        sz[i] = i % 4 == 0 ? OBJ : OBJ / 2 + i;
        bufs[i] = malloc(sz[i]);
        kvp_fill_pattern(bufs[i], sz[i], 200 + i);
        bp[i] = bufs[i];
    }
    assert_int_equal(kvp_batch_put_from(e->client, kp, bp, sz, N, &up, res), KVP_OK);
    for (unsigned i = 0; i < N; i++) {
        assert_int_equal(res[i], KVP_OK);
        expect_pattern(e, keys[i], sz[i], 200 + i);
        free(bufs[i]);
    }
    s = stat_of(e);
    assert_int_equal(s->objects, 2 + N);
    assert_int_equal(s->pending, 0);
    kvp_pool_stat_free(s);
    env_stop(e);
}

/*
 * Upsert right after a read, with a 30 s lease TTL: the read's lease ended with the
 * read, so the value is rewritten in place (no second extent kept for a reader that
 * is gone). Upsert under a read still in flight is tested in test_leases.c and
 * tests/unit/master/rpc/test_object_calls_leased.c.
 */
static void test_upsert_leased(void **state)
{
    (void)state;
    char *flags[] = {"--lease-ttl", "30", NULL};
    const char *sizes[] = {"32MiB"};
    env_t *e = env_start(flags, 1, sizes, 10000);
    kvp_put_config_t up;
    kvp_put_config_init(&up);
    up.mode = KVP_PUT_UPSERT;
    put_pattern(e, "l", OBJ, 1, NULL, KVP_OK);
    expect_pattern(e, "l", OBJ, 1); /* the lease ends when this read does */
    put_pattern(e, "l", OBJ, 2, &up, KVP_OK);
    expect_pattern(e, "l", OBJ, 2);
    kvp_pool_stat_t *s = stat_of(e);
    assert_int_equal(s->objects, 1);
    assert_int_equal(s->used, OBJ);
    kvp_pool_stat_free(s);
    env_stop(e);
}

/* ---- best-effort replicas ---- */

/* SIGSTOP pid and wait until every one of its threads is stopped. */
static void freeze(pid_t pid)
{
    assert_true(kvp_proc_freeze(pid, 5000));
}

static void test_best_effort_replicas(void **state)
{
    (void)state;
    char *flags[] = {"--client-ttl", "60", "--lease-ttl", "0", NULL};
    const char *sizes[] = {"16MiB", "16MiB", "16MiB"};
    env_t *e = env_start(flags, 3, sizes, 1500);
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.replica_num = 3;
    uint8_t *buf = malloc(OBJ);
    const char *k0 = "r0", *k1 = "r1";
    const void *bp = buf;
    size_t len = OBJ;
    kvp_status_t res;
    uint32_t written = 99;

    kvp_fill_pattern(buf, OBJ, 10);
    assert_int_equal(kvp_batch_put_from_ex(e->client, &k0, &bp, &len, 1, &cfg, &res, &written),
                     KVP_OK);
    assert_int_equal(written, 3);

    /* freeze one owner: the master still lists it, its data server never answers */
    freeze(e->seg[2].pid);
    kvp_fill_pattern(buf, OBJ, 11);
    uint64_t t0 = kvp_now_ms();
    assert_int_equal(kvp_batch_put_from_ex(e->client, &k1, &bp, &len, 1, &cfg, &res, &written),
                     KVP_OK);
    assert_int_equal(res, KVP_OK);
    assert_int_equal(written, 2);
    assert_true(kvp_now_ms() - t0 < 1500 + 2000);
    expect_pattern(e, "r1", OBJ, 11);
    kvp_key_info_t *ks = NULL;
    size_t n = 0;
    assert_int_equal(kvp_list_keys(e->client, "^r1$", 10, &ks, &n), KVP_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ks[0].n_replicas, 2);
    kvp_key_list_free(ks, n);
    /* r0 has a replica on the frozen owner: the get goes to a live one */
    t0 = kvp_now_ms();
    expect_pattern(e, "r0", OBJ, 10);
    assert_true(kvp_now_ms() - t0 < 1000);

    assert_int_equal(kill(e->seg[2].pid, SIGCONT), 0);
    free(buf);
    env_stop(e);
}

/* ---- drain ---- */

static void put_on_sized(env_t *e, const char *prefix, unsigned n, const char *segment,
                         unsigned replicas, size_t size)
{
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.preferred_segment = segment;
    cfg.replica_num = replicas;
    char key[64];
    for (unsigned i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s%u", prefix, i);
        put_pattern(e, key, size + i, 1000 + i, &cfg, KVP_OK);
    }
}

static void put_on(env_t *e, const char *prefix, unsigned n, const char *segment, unsigned replicas)
{
    put_on_sized(e, prefix, n, segment, replicas, OBJ);
}

static void expect_all(env_t *e, const char *prefix, unsigned n)
{
    char key[64];
    for (unsigned i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s%u", prefix, i);
        expect_pattern(e, key, OBJ + i, 1000 + i);
    }
}

static void test_drain_on_sigterm(void **state)
{
    (void)state;
    char *flags[] = {"--lease-ttl", "0", NULL};
    const char *sizes[] = {"32MiB", "32MiB"};
    env_t *e = env_start(flags, 2, sizes, 10000);
    put_on(e, "d", 40, e->seg[0].ready, 1);
    put_on(e, "two", 5, e->seg[0].ready, 2);
    kvp_pool_stat_t *s = stat_of(e);
    for (size_t i = 0; i < s->n_segments; i++)
        if (strcmp(s->segments[i].name, e->seg[0].ready) == 0)
            assert_int_equal(s->segments[i].objects, 45);
    kvp_pool_stat_free(s);

    assert_int_equal(kvp_proc_stop(&e->seg[0], SIGTERM, 20000), 0); /* drains, then exits 0 */
    expect_all(e, "d", 40);
    expect_all(e, "two", 5);
    s = stat_of(e);
    assert_int_equal(s->n_segments, 1);
    assert_string_equal(s->segments[0].name, e->seg[1].ready);
    assert_int_equal(s->objects, 45);
    assert_int_equal(s->moved_objects, 40); /* the 2-replica ones needed no copy */
    kvp_pool_stat_free(s);
    env_stop(e);
}

static void test_drain_requested(void **state)
{
    (void)state;
    char *flags[] = {"--lease-ttl", "0", NULL};
    const char *sizes[] = {"32MiB", "32MiB", "32MiB"};
    env_t *e = env_start(flags, 3, sizes, 10000);
    put_on(e, "c", 30, e->seg[2].ready, 1);
    assert_int_equal(kvp_request_drain(e->client, "no-such-segment"), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(kvp_request_drain(e->client, e->seg[2].ready), KVP_OK);
    /* from now on nothing new lands there, even when asked for */
    put_on(e, "late", 5, e->seg[2].ready, 1);
    /* the owner drains within a heartbeat and exits by itself */
    assert_int_equal(kvp_proc_wait_exit(&e->seg[2], 20000), 0);
    expect_all(e, "c", 30);
    expect_all(e, "late", 5);
    kvp_pool_stat_t *s = stat_of(e);
    assert_int_equal(s->n_segments, 2);
    assert_int_equal(s->objects, 35);
    assert_int_equal(s->moved_objects, 30);
    kvp_pool_stat_free(s);
    env_stop(e);
}

/* Not enough room elsewhere: what fits moves, the rest leaves the pool; nothing is wrong. */
static void test_drain_without_room(void **state)
{
    (void)state;
    char *flags[] = {"--lease-ttl", "0", NULL};
    const char *sizes[] = {"32MiB", "4MiB"};
    env_t *e = env_start(flags, 2, sizes, 10000);
    enum { BIG = 512 * 1024 };
    put_on_sized(e, "big", 24, e->seg[0].ready, 1, BIG); /* 12 MiB: the 4 MiB one holds 7 */
    assert_int_equal(kvp_proc_stop(&e->seg[0], SIGTERM, 20000), 0);
    kvp_pool_stat_t *s = stat_of(e);
    uint64_t moved = s->moved_objects;
    assert_true(moved > 0 && moved < 24);
    assert_int_equal(s->objects, moved);
    kvp_pool_stat_free(s);
    unsigned found = 0;
    char key[32];
    uint8_t *buf = malloc(BIG + 24);
    for (unsigned i = 0; i < 24; i++) {
        snprintf(key, sizeof(key), "big%u", i);
        int64_t r = kvp_get_into(e->client, key, buf, BIG + 24);
        if (r == KVP_ERR_NOT_FOUND)
            continue;
        assert_int_equal(r, BIG + i);
        expect_pattern(e, key, BIG + i, 1000 + i);
        found++;
    }
    assert_int_equal(found, moved);
    free(buf);
    env_stop(e);
}

/* ---- list / remove by regex / remove all ---- */

static void test_list_and_bulk_remove(void **state)
{
    (void)state;
    char *flags[] = {"--lease-ttl", "0", NULL};
    const char *sizes[] = {"16MiB"};
    env_t *e = env_start(flags, 1, sizes, 10000);
    /* a second segment under a name already mounted is refused at create */
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = e->master.ready;
    p.segment_size = 4 << 20;
    p.segment_name = e->seg[0].ready;
    kvp_client_t *dup = NULL;
    assert_int_equal(kvp_client_create(&p, &dup), KVP_ERR_EXISTS);
    assert_null(dup);
    char key[32];
    for (unsigned i = 0; i < 30; i++) {
        snprintf(key, sizeof(key), "a/%u", i);
        put_pattern(e, key, 100 + i, i, NULL, KVP_OK);
        snprintf(key, sizeof(key), "b/%u", i);
        put_pattern(e, key, 200, i, NULL, KVP_OK);
    }
    kvp_key_info_t *ks = NULL;
    size_t n = 0;
    assert_int_equal(kvp_list_keys(e->client, "^a/", 1000, &ks, &n), KVP_OK);
    assert_int_equal(n, 30);
    unsigned seen = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned idx;
        assert_int_equal(sscanf(ks[i].key, "a/%u", &idx), 1);
        assert_true(idx < 30);
        assert_false(seen & (1u << idx));
        seen |= 1u << idx;
        assert_int_equal(ks[i].size, 100 + idx);
        assert_int_equal(ks[i].n_replicas, 1);
        assert_true(ks[i].complete);
    }
    kvp_key_list_free(ks, n);
    assert_int_equal(kvp_list_keys(e->client, NULL, 7, &ks, &n), KVP_OK); /* bounded */
    assert_int_equal(n, 7);
    kvp_key_list_free(ks, n);
    assert_int_equal(kvp_list_keys(e->client, "(", 10, &ks, &n), KVP_ERR_INVALID_ARG);

    uint64_t removed = 0;
    assert_int_equal(kvp_remove_by_regex(e->client, "^a/1", 0, &removed), KVP_OK);
    assert_int_equal(removed, 11); /* a/1, a/10..a/19 */
    assert_int_equal(kvp_is_exist(e->client, "a/1"), 0);
    assert_int_equal(kvp_is_exist(e->client, "a/2"), 1);
    assert_int_equal(kvp_is_exist(e->client, "b/1"), 1);
    assert_int_equal(kvp_remove_by_regex(e->client, "", 0, &removed), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_remove_by_regex(e->client, "a[", 0, &removed), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_remove_all(e->client, 0, &removed), KVP_OK);
    assert_int_equal(removed, 49);
    assert_int_equal(kvp_list_keys(e->client, "", 1000, &ks, &n), KVP_OK);
    assert_int_equal(n, 0);
    kvp_key_list_free(ks, n);
    kvp_pool_stat_t *s = stat_of(e);
    assert_int_equal(s->used, 0);
    kvp_pool_stat_free(s);
    env_stop(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_upsert, teardown),
        cmocka_unit_test_teardown(test_upsert_leased, teardown),
        cmocka_unit_test_teardown(test_best_effort_replicas, teardown),
        cmocka_unit_test_teardown(test_drain_on_sigterm, teardown),
        cmocka_unit_test_teardown(test_drain_requested, teardown),
        cmocka_unit_test_teardown(test_drain_without_room, teardown),
        cmocka_unit_test_teardown(test_list_and_bulk_remove, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
