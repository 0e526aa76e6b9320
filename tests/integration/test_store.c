/*
 * test_store.c - the core store end to end: a real kvpool-master, two real
 * `kvpool serve` segment processes on 127.0.0.1, and this process as the
 * client. Every get is compared byte for byte with what was put.
 *
 * The same cases run twice: over tcp (forced) and over shm (forced: the
 * segment servers are on this host, so shm must work, or the ops fail).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "tests/harness_pool.h"

#define SEG_SIZE "64MiB"
#define SEG_BYTES (64ull << 20)

typedef struct env {
    kvp_test_pool_t p; /* master, segments, client (harness_pool.h) */
    const char *transport;
    int key_gen;
} env_t;

static int setup(void **state, const char *transport)
{
    env_t *e = calloc(1, sizeof(*e));
    e->transport = transport;
    /* store semantics: a full pool refuses puts (test_cache.c runs the cache). The pool is
     * filled to its last extent here: no room held ahead (KVPOOL_PUT_AHEAD, whose small holds
     * left by earlier tests would cut the free room up), every put the two-call way */
    setenv("KVPOOL_PUT_AHEAD", "off", 1);
    char *args[] = {"--lease-ttl", "0", "--no-eviction", NULL};
    *state = e;
    return kvp_test_pool_start(&e->p, args, 2, SEG_SIZE, transport) ? 0 : -1;
}

static int setup_tcp(void **state)
{
    return setup(state, "tcp");
}

static int setup_shm(void **state)
{
    return setup(state, "shm");
}

static int setup_forced(void **state)
{
    return setup(state, kvp_test_transport());
}

static int teardown(void **state)
{
    env_t *e = *state;
    int rc = kvp_test_pool_stop(&e->p);
    free(e);
    return rc;
}

static kvp_pool_stat_t *stat_of(env_t *e)
{
    kvp_pool_stat_t *s = NULL;
    assert_int_equal(kvp_pool_stat(e->p.client, &s), KVP_OK);
    return s;
}

/* Keys unique per test run so cases never see each other's objects. */
static void key_of(env_t *e, char *buf, size_t len, const char *tag, int i)
{
    snprintf(buf, len, "model@tp_rank:0@pp_rank:0@%s-%s-%d-%d", e->transport, tag, e->key_gen, i);
}

static void test_batch_sizes(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    static const size_t sizes[] = {1, 100, 4096, 65536 + 3, 1 << 20, (4 << 20) + 1, 16 << 20};
    enum { N = sizeof(sizes) / sizeof(sizes[0]) };
    char keybuf[N][128];
    const char *keys[N];
    void *src[N], *dst[N];
    size_t caps[N];
    kvp_status_t res[N];
    int64_t got[N];
    for (int i = 0; i < N; i++) {
        key_of(e, keybuf[i], sizeof(keybuf[i]), "sz", i);
        keys[i] = keybuf[i];
        src[i] = malloc(sizes[i]);
        dst[i] = malloc(sizes[i] + 16);
        caps[i] = sizes[i] + 16;
        kvp_fill_pattern(src[i], sizes[i], (uint64_t)i + 1000);
        memset(dst[i], 0xAB, sizes[i] + 16);
    }
    assert_int_equal(
        kvp_batch_put_from(e->p.client, keys, (const void *const *)src, sizes, N, NULL, res),
        KVP_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(res[i], KVP_OK);
    assert_int_equal(kvp_batch_get_into(e->p.client, keys, dst, caps, N, got), KVP_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(got[i], (int64_t)sizes[i]);
        assert_memory_equal(dst[i], src[i], sizes[i]);
        /* nothing written past the object */
        assert_int_equal(((uint8_t *)dst[i])[sizes[i]], 0xAB);
        assert_int_equal(kvp_get_size(e->p.client, keys[i]), (int64_t)sizes[i]);
    }
    /* the sizes of the batch in one call, with a key never stored and a bad key among them */
    {
        const char *sk[N + 2];
        int64_t sz[N + 2];
        char never[128];
        key_of(e, never, sizeof(never), "never", 0);
        for (int i = 0; i < N; i++)
            sk[i] = keys[i];
        sk[N] = never;
        sk[N + 1] = "";
        assert_int_equal(kvp_batch_get_size(e->p.client, sk, N + 2, sz), KVP_OK);
        for (int i = 0; i < N; i++)
            assert_int_equal(sz[i], (int64_t)sizes[i]);
        assert_int_equal(sz[N], KVP_ERR_NOT_FOUND);
        assert_int_equal(sz[N + 1], KVP_ERR_BAD_KEY);
        assert_int_equal(kvp_batch_get_size(e->p.client, sk, 0, sz), KVP_OK);
        assert_int_equal(kvp_batch_get_size(NULL, sk, 1, sz), KVP_ERR_INVALID_ARG);
    }
    /* single-key API on the same objects */
    memset(dst[3], 0, sizes[3]);
    assert_int_equal(kvp_get_into(e->p.client, keys[3], dst[3], caps[3]), (int64_t)sizes[3]);
    assert_memory_equal(dst[3], src[3], sizes[3]);
    kvp_status_t rm[N];
    assert_int_equal(kvp_batch_remove(e->p.client, keys, N, rm), KVP_OK);
    for (int i = 0; i < N; i++) {
        free(src[i]);
        free(dst[i]);
    }
    kvp_pool_stat_t *s = stat_of(e);
    assert_int_equal(s->used, 0);
    assert_int_equal(s->objects, 0);
    kvp_pool_stat_free(s);
}

static void test_exist_prefix(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    char kb[8][128];
    const char *keys[8];
    for (int i = 0; i < 8; i++) {
        key_of(e, kb[i], sizeof(kb[i]), "pfx", i);
        keys[i] = kb[i];
    }
    char val[512];
    for (int i = 0; i < 5; i++) {
        kvp_fill_pattern(val, sizeof(val), (uint64_t)i);
        assert_int_equal(kvp_put(e->p.client, keys[i], val, sizeof(val), NULL), KVP_OK);
    }
    int ex[8];
    size_t prefix = 99;
    assert_int_equal(kvp_batch_is_exist(e->p.client, keys, 8, ex, &prefix), KVP_OK);
    assert_int_equal(prefix, 5);
    for (int i = 0; i < 8; i++)
        assert_int_equal(ex[i], i < 5 ? 1 : 0);
    /* a hole in the middle ends the prefix */
    const char *holey[4] = {keys[0], keys[1], keys[6], keys[3]};
    assert_int_equal(kvp_batch_is_exist(e->p.client, holey, 4, ex, &prefix), KVP_OK);
    assert_int_equal(prefix, 2);
    assert_int_equal(ex[2], 0);
    assert_int_equal(ex[3], 1);
    /* an invalid key is reported per key */
    const char *bad[2] = {keys[0], ""};
    assert_int_equal(kvp_batch_is_exist(e->p.client, bad, 2, ex, &prefix), KVP_OK);
    assert_int_equal(ex[0], 1);
    assert_int_equal(ex[1], KVP_ERR_BAD_KEY);
    assert_int_equal(kvp_is_exist(e->p.client, keys[7]), 0);
    kvp_status_t rm[5];
    assert_int_equal(kvp_batch_remove(e->p.client, keys, 5, rm), KVP_OK);
}

static void test_remove_and_duplicate(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    char key[128];
    key_of(e, key, sizeof(key), "dup", 0);
    char a[1000], b[1000], out[1000];
    kvp_fill_pattern(a, sizeof(a), 1);
    kvp_fill_pattern(b, sizeof(b), 2);
    assert_int_equal(kvp_put(e->p.client, key, a, sizeof(a), NULL), KVP_OK);
    assert_int_equal(kvp_put(e->p.client, key, b, sizeof(b), NULL), KVP_ERR_EXISTS);
    assert_int_equal(kvp_get_into(e->p.client, key, out, sizeof(out)), (int64_t)sizeof(out));
    assert_memory_equal(out, a, sizeof(a)); /* the refused put changed nothing */
    assert_int_equal(kvp_remove(e->p.client, key), KVP_OK);
    assert_int_equal(kvp_get_into(e->p.client, key, out, sizeof(out)), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_is_exist(e->p.client, key), 0);
    assert_int_equal(kvp_remove(e->p.client, key), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_get_size(e->p.client, key), KVP_ERR_NOT_FOUND);
    /* the key is free again */
    assert_int_equal(kvp_put(e->p.client, key, b, sizeof(b), NULL), KVP_OK);
    assert_int_equal(kvp_get_into(e->p.client, key, out, sizeof(out)), (int64_t)sizeof(out));
    assert_memory_equal(out, b, sizeof(b));
    assert_int_equal(kvp_remove(e->p.client, key), KVP_OK);
}

static void test_bad_input(void **state)
{
    env_t *e = *state;
    char val[64] = "x";
    char long_key[4098];
    memset(long_key, 'k', sizeof(long_key) - 1);
    long_key[4097] = '\0';
    assert_int_equal(kvp_put(e->p.client, "", val, sizeof(val), NULL), KVP_ERR_BAD_KEY);
    assert_int_equal(kvp_put(e->p.client, long_key, val, sizeof(val), NULL), KVP_ERR_BAD_KEY);
    long_key[4096] = '\0'; /* exactly 4096 bytes is allowed */
    assert_int_equal(kvp_put(e->p.client, long_key, val, sizeof(val), NULL), KVP_OK);
    assert_int_equal(kvp_remove(e->p.client, long_key), KVP_OK);
    assert_int_equal(kvp_put(e->p.client, "bad\xff\xfeutf8", val, sizeof(val), NULL),
                     KVP_ERR_BAD_KEY);
    assert_int_equal(kvp_put(e->p.client, "zero-len", val, 0, NULL), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_put(e->p.client, NULL, val, 1, NULL), KVP_ERR_BAD_KEY);
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.replica_num = 0;
    assert_int_equal(kvp_put(e->p.client, "cfg", val, 1, &cfg), KVP_ERR_INVALID_ARG);

    /* a buffer too small: error, and the buffer is untouched */
    e->key_gen++;
    char key[128];
    key_of(e, key, sizeof(key), "small", 0);
    char big[4096];
    kvp_fill_pattern(big, sizeof(big), 9);
    assert_int_equal(kvp_put(e->p.client, key, big, sizeof(big), NULL), KVP_OK);
    char small[100];
    memset(small, 0x5A, sizeof(small));
    assert_int_equal(kvp_get_into(e->p.client, key, small, sizeof(small)),
                     KVP_ERR_BUFFER_TOO_SMALL);
    for (size_t i = 0; i < sizeof(small); i++)
        assert_int_equal((uint8_t)small[i], 0x5A);
    assert_int_equal(kvp_remove(e->p.client, key), KVP_OK);

    /* batch with a mix: per-key results */
    const char *keys[3] = {"mix-ok", "", "mix-ok2"};
    const void *bufs[3] = {val, val, val};
    size_t sizes[3] = {10, 10, 10};
    kvp_status_t res[3];
    assert_int_equal(kvp_batch_put_from(e->p.client, keys, bufs, sizes, 3, NULL, res),
                     KVP_ERR_BAD_KEY);
    assert_int_equal(res[0], KVP_OK);
    assert_int_equal(res[1], KVP_ERR_BAD_KEY);
    assert_int_equal(res[2], KVP_OK);
    assert_int_equal(kvp_remove(e->p.client, "mix-ok"), KVP_OK);
    assert_int_equal(kvp_remove(e->p.client, "mix-ok2"), KVP_OK);
}

static void test_too_large_and_full(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    size_t huge = SEG_BYTES + 1;
    void *buf = malloc(huge);
    kvp_fill_pattern(buf, huge, 5);
    char key[128];
    key_of(e, key, sizeof(key), "huge", 0);
    assert_int_equal(kvp_put(e->p.client, key, buf, huge, NULL), KVP_ERR_TOO_LARGE);
    kvp_pool_stat_t *s = stat_of(e);
    assert_int_equal(s->pending, 0);
    assert_int_equal(s->used, 0);
    kvp_pool_stat_free(s);

    /* fill the pool with 4 MiB objects until it refuses */
    size_t osz = 4u << 20;
    int stored = 0;
    kvp_status_t st = KVP_OK;
    char keys[64][128];
    for (int i = 0; i < 64; i++) {
        key_of(e, keys[i], sizeof(keys[i]), "fill", i);
        kvp_fill_pattern(buf, osz, (uint64_t)i);
        st = kvp_put(e->p.client, keys[i], buf, osz, NULL);
        if (st != KVP_OK)
            break;
        stored++;
    }
    assert_int_equal(st, KVP_ERR_POOL_FULL);
    /* 2 x 64 MiB of 4 MiB extents (64-byte granularity): exactly 32 fit */
    assert_int_equal(stored, 32);
    s = stat_of(e);
    assert_int_equal(s->pending, 0);
    assert_int_equal(s->objects, (uint64_t)stored);
    assert_int_equal(s->used, (uint64_t)stored * osz);
    kvp_pool_stat_free(s);
    /* everything stored is intact */
    void *out = malloc(osz);
    for (int i = 0; i < stored; i++) {
        kvp_fill_pattern(buf, osz, (uint64_t)i);
        assert_int_equal(kvp_get_into(e->p.client, keys[i], out, osz), (int64_t)osz);
        assert_memory_equal(out, buf, osz);
    }
    /* freeing one makes room for one */
    assert_int_equal(kvp_remove(e->p.client, keys[0]), KVP_OK);
    kvp_fill_pattern(buf, osz, 777);
    assert_int_equal(kvp_put(e->p.client, keys[stored], buf, osz, NULL), KVP_OK);
    assert_int_equal(kvp_get_into(e->p.client, keys[stored], out, osz), (int64_t)osz);
    assert_memory_equal(out, buf, osz);
    assert_int_equal(kvp_remove(e->p.client, keys[stored]), KVP_OK);
    for (int i = 1; i < stored; i++)
        assert_int_equal(kvp_remove(e->p.client, keys[i]), KVP_OK);
    s = stat_of(e);
    assert_int_equal(s->used, 0);
    assert_int_equal(s->objects, 0);
    kvp_pool_stat_free(s);
    free(out);
    free(buf);
}

static void test_replicas_and_preferred(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    kvp_pool_stat_t *s = stat_of(e);
    assert_int_equal(s->n_segments, 2);
    char pref[256];
    snprintf(pref, sizeof(pref), "%s", s->segments[1].name);
    kvp_pool_stat_free(s);

    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.preferred_segment = pref;
    char key[128], val[8192], out[8192];
    kvp_fill_pattern(val, sizeof(val), 42);
    for (int i = 0; i < 10; i++) {
        key_of(e, key, sizeof(key), "pref", i);
        assert_int_equal(kvp_put(e->p.client, key, val, sizeof(val), &cfg), KVP_OK);
    }
    s = stat_of(e);
    for (size_t i = 0; i < s->n_segments; i++)
        assert_int_equal(s->segments[i].objects, strcmp(s->segments[i].name, pref) == 0 ? 10 : 0);
    kvp_pool_stat_free(s);
    for (int i = 0; i < 10; i++) {
        key_of(e, key, sizeof(key), "pref", i);
        assert_int_equal(kvp_remove(e->p.client, key), KVP_OK);
    }

    /* two replicas land on both segments; both hold the same bytes */
    kvp_put_config_init(&cfg);
    cfg.replica_num = 2;
    key_of(e, key, sizeof(key), "rep", 0);
    assert_int_equal(kvp_put(e->p.client, key, val, sizeof(val), &cfg), KVP_OK);
    s = stat_of(e);
    assert_int_equal(s->objects, 1);
    assert_int_equal(s->segments[0].objects, 1);
    assert_int_equal(s->segments[1].objects, 1);
    kvp_pool_stat_free(s);
    assert_int_equal(kvp_get_into(e->p.client, key, out, sizeof(out)), (int64_t)sizeof(out));
    assert_memory_equal(out, val, sizeof(val));
    assert_int_equal(kvp_remove(e->p.client, key), KVP_OK);
}

/* Kill one segment server: single-replica keys on it vanish, 2-replica keys survive. */
static void test_segment_death(void **state)
{
    env_t *e = *state;
    e->key_gen++;
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.replica_num = 2;
    char key[128], val[100000], out[100000];
    kvp_fill_pattern(val, sizeof(val), 4242);
    key_of(e, key, sizeof(key), "survivor", 0);
    assert_int_equal(kvp_put(e->p.client, key, val, sizeof(val), &cfg), KVP_OK);
    char single[8][128];
    for (int i = 0; i < 8; i++) {
        key_of(e, single[i], sizeof(single[i]), "single", i);
        assert_int_equal(kvp_put(e->p.client, single[i], val, sizeof(val), NULL), KVP_OK);
    }
    kvp_proc_kill9(&e->p.seg[0]);
    /* the master learns of the death when the segment's connection closes */
    kvp_pool_stat_t *s = NULL;
    for (int tries = 0; tries < 500; tries++) {
        kvp_pool_stat_free(s);
        s = stat_of(e);
        if (s->n_segments == 1)
            break;
        usleep(10000);
    }
    assert_int_equal(s->n_segments, 1);
    uint64_t left = s->segments[0].objects;
    kvp_pool_stat_free(s);
    assert_int_equal(kvp_get_into(e->p.client, key, out, sizeof(out)), (int64_t)sizeof(out));
    assert_memory_equal(out, val, sizeof(val));
    uint64_t found = 0;
    for (int i = 0; i < 8; i++) {
        int64_t r = kvp_get_into(e->p.client, single[i], out, sizeof(out));
        if (r == (int64_t)sizeof(out)) {
            assert_memory_equal(out, val, sizeof(val));
            found++;
        } else {
            assert_int_equal(r, KVP_ERR_NOT_FOUND);
        }
    }
    assert_int_equal(found + 1, left);
    /* restart the segment so the teardown stops two */
    assert_true(kvp_start_segment(&e->p.seg[0], e->p.master.ready, SEG_SIZE, NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_sizes),          cmocka_unit_test(test_exist_prefix),
        cmocka_unit_test(test_remove_and_duplicate), cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_too_large_and_full),   cmocka_unit_test(test_replicas_and_preferred),
        cmocka_unit_test(test_segment_death),
    };
    if (kvp_test_transport() != NULL) /* the same suite on the transport under test */
        return cmocka_run_group_tests_name("store_forced", tests, setup_forced, teardown);
    int fails = cmocka_run_group_tests_name("store_tcp", tests, setup_tcp, teardown);
    fails += cmocka_run_group_tests_name("store_shm", tests, setup_shm, teardown);
    return fails;
}
