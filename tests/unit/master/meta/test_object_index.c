/*
 * test_object_index.c - unit tests for master/object_index.c.
 *
 * Many keys force the table through several doublings; forced hash values
 * put distinct keys of the same length on one chain so only the key compare
 * tells them apart; the PENDING list is walked after every state change and
 * checked against what the test expects to be on it.
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

#include "master/dispatch.h"
#include "master/meta/placement.h"
#include "master/policy/eviction.h"
#include "master/policy/lease.h"
#include "master/core/state.h"

static kvp_object_t *new_obj(const char *key, uint64_t hash, kvp_obj_state_t state)
{
    size_t len = strlen(key);
    kvp_object_t *obj = kvp_object_create(key, len, hash, 1);
    assert_non_null(obj);
    assert_int_equal(obj->key_len, len);
    assert_memory_equal(kvp_object_key(obj), key, len);
    obj->state = (uint8_t)state;
    return obj;
}

static kvp_object_t *new_key(const char *key, kvp_obj_state_t state)
{
    return new_obj(key, kvp_index_hash(key, strlen(key)), state);
}

static kvp_object_t *lookup(const kvp_object_index_t *idx, const char *key)
{
    size_t len = strlen(key);
    return kvp_index_lookup(idx, key, len, kvp_index_hash(key, len));
}

/* Walk the PENDING list: well formed (lprev/lnext agree), only PENDING objects. */
static uint64_t pending_walk(const kvp_object_index_t *idx)
{
    uint64_t n = 0;
    const kvp_object_t *prev = NULL;
    for (const kvp_object_t *o = idx->pending_list.head; o != NULL; o = o->lnext) {
        assert_ptr_equal(o->lprev, prev);
        assert_int_equal(o->state, KVP_OBJ_PENDING);
        prev = o;
        n++;
        assert_true(n <= idx->count); /* no cycle */
    }
    assert_int_equal(n, idx->pending);
    return n;
}

static bool on_pending_list(const kvp_object_index_t *idx, const kvp_object_t *obj)
{
    for (const kvp_object_t *o = idx->pending_list.head; o != NULL; o = o->lnext)
        if (o == obj)
            return true;
    return false;
}

static void test_empty(void **state)
{
    (void)state;
    kvp_object_index_t idx;
    assert_int_equal(kvp_index_init(&idx), KVP_OK);
    assert_int_equal(idx.count, 0);
    assert_int_equal(idx.pending, 0);
    assert_null(idx.pending_list.head);
    assert_null(lookup(&idx, "nothing"));
    /* hashing is deterministic and depends on the bytes */
    assert_true(kvp_index_hash("abc", 3) == kvp_index_hash("abc", 3));
    assert_true(kvp_index_hash("abc", 3) != kvp_index_hash("abd", 3));
    assert_true(kvp_index_hash("abc", 3) != kvp_index_hash("abc", 2));
    kvp_index_cleanup(&idx);
}

#define MANY 100000

static void test_many_keys(void **state)
{
    (void)state;
    kvp_object_index_t idx;
    assert_int_equal(kvp_index_init(&idx), KVP_OK);
    uint64_t initial_buckets = idx.n_buckets;
    kvp_object_t **objs = calloc(MANY, sizeof(*objs));
    assert_non_null(objs);
    char key[32];
    for (int i = 0; i < MANY; i++) {
        snprintf(key, sizeof(key), "key/%d", i);
        objs[i] = new_key(key, KVP_OBJ_COMPLETE);
        objs[i]->size = (uint64_t)i;
        kvp_index_insert(&idx, objs[i]);
        assert_int_equal(idx.count, (uint64_t)i + 1);
    }
    /* the table grew: power of two, at least one bucket per object */
    assert_true(idx.n_buckets > initial_buckets);
    assert_int_equal(idx.n_buckets & (idx.n_buckets - 1), 0);
    assert_true(idx.n_buckets >= MANY);
    assert_int_equal(idx.pending, 0);

    /* every key finds its own object after the regrowths */
    for (int i = 0; i < MANY; i++) {
        snprintf(key, sizeof(key), "key/%d", i);
        kvp_object_t *o = lookup(&idx, key);
        if (o != objs[i])
            fail_msg("lookup(%s) = %p, want %p", key, (void *)o, (void *)objs[i]);
    }
    /* absent keys, including prefixes and extensions of present ones */
    assert_null(lookup(&idx, "key/"));
    assert_null(lookup(&idx, "key/100000"));
    assert_null(lookup(&idx, "key/12345x"));
    assert_null(lookup(&idx, "key/1234 "));
    assert_null(lookup(&idx, "Key/1"));

    /* unlink every third key */
    uint64_t expect = MANY;
    for (int i = 0; i < MANY; i += 3) {
        kvp_index_unlink(&idx, objs[i]);
        expect--;
        assert_int_equal(idx.count, expect);
    }
    /* unlinking an object that is not in the table changes nothing */
    kvp_index_unlink(&idx, objs[0]);
    assert_int_equal(idx.count, expect);

    for (int i = 0; i < MANY; i++) {
        snprintf(key, sizeof(key), "key/%d", i);
        kvp_object_t *o = lookup(&idx, key);
        if (i % 3 == 0) {
            assert_null(o);
            free(objs[i]);
        } else {
            assert_ptr_equal(o, objs[i]);
            assert_int_equal(o->size, i);
        }
    }

    /* re-insert some removed keys as new objects */
    for (int i = 0; i < 300; i += 3) {
        snprintf(key, sizeof(key), "key/%d", i);
        objs[i] = new_key(key, KVP_OBJ_COMPLETE);
        kvp_index_insert(&idx, objs[i]);
        assert_ptr_equal(lookup(&idx, key), objs[i]);
    }
    assert_int_equal(idx.count, expect + 100);
    free(objs);
    kvp_index_cleanup(&idx); /* frees the objects still linked */
    assert_null(idx.buckets);
    assert_int_equal(idx.count, 0);
}

static void test_hash_collisions(void **state)
{
    (void)state;
    kvp_object_index_t idx;
    assert_int_equal(kvp_index_init(&idx), KVP_OK);
    /* same hash, same length: only the bytes differ */
    const uint64_t h = 0xDEADBEEF00000042ull;
    static const char *const keys[] = {"aaaa", "aaab", "baaa", "abab", "zzzz"};
    kvp_object_t *objs[5];
    for (int i = 0; i < 5; i++) {
        objs[i] = new_obj(keys[i], h, KVP_OBJ_COMPLETE);
        kvp_index_insert(&idx, objs[i]);
    }
    /* one hash with a different length on the same chain too */
    kvp_object_t *longer = new_obj("aaaaa", h, KVP_OBJ_COMPLETE);
    kvp_index_insert(&idx, longer);
    /* and a different hash in the same bucket */
    const uint64_t h_other = h + idx.n_buckets;
    kvp_object_t *other = new_obj("aaaa", h_other, KVP_OBJ_COMPLETE);
    kvp_index_insert(&idx, other);

    for (int i = 0; i < 5; i++)
        assert_ptr_equal(kvp_index_lookup(&idx, keys[i], 4, h), objs[i]);
    assert_ptr_equal(kvp_index_lookup(&idx, "aaaaa", 5, h), longer);
    assert_ptr_equal(kvp_index_lookup(&idx, "aaaa", 4, h_other), other);
    assert_null(kvp_index_lookup(&idx, "aaac", 4, h));
    assert_null(kvp_index_lookup(&idx, "aaa", 3, h));
    assert_null(kvp_index_lookup(&idx, "zzzz", 4, h + 1));

    /* unlink from the middle of the chain; the rest stay reachable */
    kvp_index_unlink(&idx, objs[2]);
    assert_null(kvp_index_lookup(&idx, "baaa", 4, h));
    for (int i = 0; i < 5; i++)
        if (i != 2)
            assert_ptr_equal(kvp_index_lookup(&idx, keys[i], 4, h), objs[i]);
    assert_ptr_equal(kvp_index_lookup(&idx, "aaaaa", 5, h), longer);
    free(objs[2]);
    assert_int_equal(idx.count, 6);

    /* grow with the collisions in place: they survive the rehash */
    char key[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof(key), "filler-%d", i);
        kvp_index_insert(&idx, new_key(key, KVP_OBJ_COMPLETE));
    }
    assert_true(idx.n_buckets > 1024);
    for (int i = 0; i < 5; i++)
        if (i != 2)
            assert_ptr_equal(kvp_index_lookup(&idx, keys[i], 4, h), objs[i]);
    assert_ptr_equal(kvp_index_lookup(&idx, "aaaa", 4, h_other), other);
    kvp_index_cleanup(&idx);
}

static void test_pending_list(void **state)
{
    (void)state;
    kvp_object_index_t idx;
    assert_int_equal(kvp_index_init(&idx), KVP_OK);
    enum { N = 64 };
    kvp_object_t *objs[N];
    bool pending[N];
    char key[32];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "p%d", i);
        pending[i] = i % 2 == 0;
        objs[i] = new_key(key, pending[i] ? KVP_OBJ_PENDING : KVP_OBJ_COMPLETE);
        kvp_index_insert(&idx, objs[i]);
    }
    assert_int_equal(idx.count, N);
    assert_int_equal(pending_walk(&idx), N / 2);
    for (int i = 0; i < N; i++)
        assert_int_equal(on_pending_list(&idx, objs[i]), pending[i]);

    /* COMPLETE -> PENDING -> COMPLETE, in a scrambled order */
    uint64_t s = 17;
    for (int step = 0; step < 2000; step++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)((s >> 33) % N);
        bool to_pending = (s >> 20) & 1;
        kvp_index_set_state(&idx, objs[i], to_pending ? KVP_OBJ_PENDING : KVP_OBJ_COMPLETE);
        pending[i] = to_pending;
        assert_int_equal(objs[i]->state, to_pending ? KVP_OBJ_PENDING : KVP_OBJ_COMPLETE);
        uint64_t want = 0;
        for (int k = 0; k < N; k++)
            want += pending[k];
        assert_int_equal(pending_walk(&idx), want);
        assert_int_equal(on_pending_list(&idx, objs[i]), to_pending);
    }
    /* setting the state it already has is a no-op (no double link / unlink) */
    kvp_index_set_state(&idx, objs[0], KVP_OBJ_PENDING);
    pending[0] = true;
    uint64_t before = pending_walk(&idx);
    kvp_index_set_state(&idx, objs[0], KVP_OBJ_PENDING);
    assert_int_equal(pending_walk(&idx), before);
    kvp_index_set_state(&idx, objs[1], KVP_OBJ_COMPLETE);
    pending[1] = false;
    before = pending_walk(&idx);
    kvp_index_set_state(&idx, objs[1], KVP_OBJ_COMPLETE);
    assert_int_equal(pending_walk(&idx), before);

    /* unlinking a PENDING object takes it off the list too; a COMPLETE one leaves it alone */
    for (int i = 0; i < N; i += 3) {
        uint64_t p = idx.pending;
        kvp_index_unlink(&idx, objs[i]);
        assert_int_equal(idx.pending, pending[i] ? p - 1 : p);
        assert_false(on_pending_list(&idx, objs[i]));
        pending_walk(&idx);
        assert_null(
            kvp_index_lookup(&idx, kvp_object_key(objs[i]), objs[i]->key_len, objs[i]->hash));
        free(objs[i]);
        objs[i] = NULL;
    }
    /* all remaining pending ones: make them COMPLETE; list empties */
    for (int i = 0; i < N; i++)
        if (objs[i])
            kvp_index_set_state(&idx, objs[i], KVP_OBJ_COMPLETE);
    assert_int_equal(idx.pending, 0);
    assert_null(idx.pending_list.head);

    /* an object created with state 0 becomes PENDING through set_state after insert */
    kvp_object_t *fresh = kvp_object_create("fresh", 5, kvp_index_hash("fresh", 5), 2);
    assert_non_null(fresh);
    kvp_index_insert(&idx, fresh);
    assert_int_equal(idx.pending, 0);
    kvp_index_set_state(&idx, fresh, KVP_OBJ_PENDING);
    assert_int_equal(idx.pending, 1);
    assert_ptr_equal(idx.pending_list.head, fresh);
    kvp_index_cleanup(&idx);
}

typedef struct visit_ctx {
    uint64_t visits;
    uint64_t removed;
    uint64_t removed_pending;
} visit_ctx_t;

/* Remove objects whose size (their number) is a multiple of 4 or 7. */
static bool remove_some_cb(kvp_object_t *obj, void *arg)
{
    visit_ctx_t *ctx = arg;
    ctx->visits++;
    bool rm = obj->size % 4 == 0 || obj->size % 7 == 0;
    if (rm) {
        ctx->removed++;
        ctx->removed_pending += obj->state == KVP_OBJ_PENDING;
    }
    return rm;
}

static bool remove_all_cb(kvp_object_t *obj, void *arg)
{
    (void)obj;
    ((visit_ctx_t *)arg)->visits++;
    return true;
}

static void test_foreach_remove(void **state)
{
    (void)state;
    kvp_object_index_t idx;
    assert_int_equal(kvp_index_init(&idx), KVP_OK);
    enum { N = 5000 };
    char key[32];
    uint64_t pending = 0;
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "obj:%d", i);
        kvp_obj_state_t st = i % 3 == 0 ? KVP_OBJ_PENDING : KVP_OBJ_COMPLETE;
        kvp_object_t *o = new_key(key, st);
        o->size = (uint64_t)i;
        kvp_index_insert(&idx, o);
        pending += st == KVP_OBJ_PENDING;
    }
    assert_int_equal(idx.pending, pending);

    visit_ctx_t ctx = {0};
    kvp_index_foreach_remove(&idx, remove_some_cb, &ctx);
    assert_int_equal(ctx.visits, N); /* every object exactly once */
    uint64_t want_removed = 0, want_removed_pending = 0;
    for (int i = 0; i < N; i++)
        if (i % 4 == 0 || i % 7 == 0) {
            want_removed++;
            want_removed_pending += i % 3 == 0;
        }
    assert_int_equal(ctx.removed, want_removed);
    assert_int_equal(ctx.removed_pending, want_removed_pending);
    assert_int_equal(idx.count, N - want_removed);
    assert_int_equal(idx.pending, pending - want_removed_pending);
    assert_int_equal(pending_walk(&idx), pending - want_removed_pending);

    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "obj:%d", i);
        kvp_object_t *o = lookup(&idx, key);
        if (i % 4 == 0 || i % 7 == 0) {
            assert_null(o);
        } else {
            assert_non_null(o);
            assert_int_equal(o->size, i);
            assert_int_equal(on_pending_list(&idx, o), i % 3 == 0);
        }
    }

    /* a second pass that removes nothing visits the survivors only */
    ctx = (visit_ctx_t){0};
    kvp_index_foreach_remove(&idx, remove_some_cb, &ctx);
    assert_int_equal(ctx.visits, N - want_removed);
    assert_int_equal(ctx.removed, 0);

    /* remove everything */
    ctx = (visit_ctx_t){0};
    kvp_index_foreach_remove(&idx, remove_all_cb, &ctx);
    assert_int_equal(ctx.visits, N - want_removed);
    assert_int_equal(idx.count, 0);
    assert_int_equal(idx.pending, 0);
    assert_null(idx.pending_list.head);
    assert_null(lookup(&idx, "obj:1"));
    kvp_index_cleanup(&idx);
}

static void test_key_bytes(void **state)
{
    (void)state;
    kvp_object_index_t idx;
    assert_int_equal(kvp_index_init(&idx), KVP_OK);
    /* a 4096-byte key and one with non-ASCII bytes, with several replicas in front */
    char *big = malloc(4096);
    assert_non_null(big);
    for (int i = 0; i < 4096; i++)
        big[i] = (char)('a' + i % 26);
    uint64_t hb = kvp_index_hash(big, 4096);
    kvp_object_t *ob = kvp_object_create(big, 4096, hb, KVP_MAX_REPLICAS);
    assert_non_null(ob);
    assert_int_equal(ob->key_len, 4096);
    assert_int_equal(ob->n_replicas, KVP_MAX_REPLICAS);
    kvp_index_insert(&idx, ob);
    const char *u = "\xE6\x97\xA5\xE6\x9C\xAC/\xF0\x9F\x98\x80";
    kvp_object_t *ou = new_key(u, KVP_OBJ_COMPLETE);
    kvp_index_insert(&idx, ou);

    assert_ptr_equal(kvp_index_lookup(&idx, big, 4096, hb), ob);
    assert_memory_equal(kvp_object_key(ob), big, 4096);
    big[4095] = 'Z';
    assert_null(kvp_index_lookup(&idx, big, 4096, kvp_index_hash(big, 4096)));
    assert_ptr_equal(lookup(&idx, u), ou);
    free(big);
    kvp_index_cleanup(&idx);
}

/*
 * The seed: keys that share a bucket under one seed are spread under another, so keys
 * chosen offline to collide (under a seed they do not know) do not pile into one chain.
 * 4096 keys that all fall in bucket 0 of 1024 under seed 0, hashed under a drawn seed: no
 * bucket gets more than a few of them.
 */
static void test_seeded_hash(void **state)
{
    (void)state;
    enum { KEYS = 4096, BUCKETS = 1024 };
    static char keys[KEYS][32];
    unsigned n = 0;
    kvp_index_hash_seed(0);
    for (unsigned i = 0; n < KEYS; i++) {
        snprintf(keys[n], sizeof(keys[n]), "aimed/%u", i);
        if ((kvp_index_hash(keys[n], strlen(keys[n])) & (BUCKETS - 1)) == 0)
            n++;
    }
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    kvp_index_hash_seed(seed);
    static unsigned per[BUCKETS];
    memset(per, 0, sizeof(per));
    unsigned most = 0;
    for (unsigned k = 0; k < KEYS; k++) {
        unsigned b = (unsigned)(kvp_index_hash(keys[k], strlen(keys[k])) & (BUCKETS - 1));
        if (++per[b] > most)
            most = per[b];
    }
    assert_true(most < 20); /* 4 on average; all 4096 in one without the seed */
    /* stable under one seed, and an index works under it */
    assert_true(kvp_index_hash("abc", 3) == kvp_index_hash("abc", 3));
    kvp_object_index_t idx;
    assert_int_equal(kvp_index_init(&idx), KVP_OK);
    assert_null(lookup(&idx, keys[0]));
    kvp_index_cleanup(&idx);
    kvp_index_hash_seed(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),           cmocka_unit_test(test_many_keys),
        cmocka_unit_test(test_hash_collisions), cmocka_unit_test(test_pending_list),
        cmocka_unit_test(test_foreach_remove),  cmocka_unit_test(test_key_bytes),
        cmocka_unit_test(test_seeded_hash),
    };
    return cmocka_run_group_tests_name("object_index", tests, NULL, NULL);
}
