/*
 * test_peer.c - unit tests for the peer table of client/transfer/peer.c: an
 * open-addressing hash of refcounted peers by segment id.
 *
 * Checked against a plain array of the ids that should be in: after every
 * change, every id in is found (with its own peer) and a sample of ids out is
 * not; removals exercise backward shifting across wrapped probe runs; the
 * table grows while keeping its entries; references are counted exactly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>

#include "client/transfer/peer_table.h"

static void check(const kvp_peer_table_t *t, const uint64_t *ids, const bool *in, size_t n)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        kvp_peer_t *p = kvp_peer_table_find(t, ids[i]);
        if (in[i]) {
            assert_non_null(p);
            assert_int_equal(p->segment_id, ids[i]);
            count++;
        } else {
            assert_null(p);
        }
    }
    assert_int_equal(t->n, count);
    assert_true(t->cap == 0 || t->n * 2 <= t->cap);
}

static void test_insert_find_remove(void **state)
{
    (void)state;
    kvp_peer_table_t t;
    kvp_peer_table_init(&t);
    assert_null(kvp_peer_table_find(&t, 1));
    assert_null(kvp_peer_table_remove(&t, 1));
    kvp_peer_t *a = kvp_peer_create(42);
    assert_int_equal(kvp_peer_table_insert(&t, a), KVP_OK);
    assert_ptr_equal(kvp_peer_table_find(&t, 42), a);
    assert_null(kvp_peer_table_find(&t, 43));
    /* a second peer for the same segment is refused; the caller keeps its reference */
    kvp_peer_t *dup = kvp_peer_create(42);
    assert_int_equal(kvp_peer_table_insert(&t, dup), KVP_ERR_EXISTS);
    kvp_peer_unref(dup);
    assert_ptr_equal(kvp_peer_table_remove(&t, 42), a);
    assert_null(kvp_peer_table_find(&t, 42));
    assert_int_equal(t.n, 0);
    kvp_peer_unref(a);
    kvp_peer_table_cleanup(&t);
}

/* Many ids, sequential and with a large stride (same low bits), in and out in turns. */
static void test_growth_and_shift(void **state)
{
    (void)state;
    enum { N = 3000 };
    static uint64_t ids[N];
    static bool in[N];
    for (size_t i = 0; i < N; i++)
        ids[i] = i < N / 2 ? i + 1 : ((uint64_t)i << 32) | 0x1000;
    kvp_peer_table_t t;
    kvp_peer_table_init(&t);
    size_t caps = 0, last_cap = 0;
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(kvp_peer_table_insert(&t, kvp_peer_create(ids[i])), KVP_OK);
        in[i] = true;
        if (t.cap != last_cap) {
            caps++;
            last_cap = t.cap;
        }
        if (i % 97 == 0)
            check(&t, ids, in, N);
    }
    assert_true(caps >= 8); /* 16 .. 8192 */
    check(&t, ids, in, N);
    /* remove every third, then every other of the rest */
    for (size_t i = 0; i < N; i += 3) {
        kvp_peer_t *p = kvp_peer_table_remove(&t, ids[i]);
        assert_non_null(p);
        assert_int_equal(p->segment_id, ids[i]);
        kvp_peer_unref(p);
        in[i] = false;
    }
    check(&t, ids, in, N);
    for (size_t i = 1; i < N; i += 2) {
        kvp_peer_t *p = kvp_peer_table_remove(&t, ids[i]);
        assert_int_equal(p != NULL, in[i]);
        if (p != NULL)
            kvp_peer_unref(p);
        in[i] = false;
        if (i % 101 == 1)
            check(&t, ids, in, N);
    }
    check(&t, ids, in, N);
    /* and back in */
    for (size_t i = 0; i < N; i += 2) {
        if (!in[i]) {
            assert_int_equal(kvp_peer_table_insert(&t, kvp_peer_create(ids[i])), KVP_OK);
            in[i] = true;
        }
    }
    check(&t, ids, in, N);
    kvp_peer_table_cleanup(&t);
    assert_int_equal(t.n, 0);
}

/* Removal in a small table where probe runs wrap around the end. */
static void test_wrapped_runs(void **state)
{
    (void)state;
    for (uint64_t seed = 0; seed < 200; seed++) {
        enum { N = 7 }; /* stays in a 16-slot table */
        uint64_t ids[N];
        bool in[N];
        kvp_peer_table_t t;
        kvp_peer_table_init(&t);
        for (size_t i = 0; i < N; i++) {
            ids[i] = seed * 1000 + i * 13 + 1;
            in[i] = true;
            assert_int_equal(kvp_peer_table_insert(&t, kvp_peer_create(ids[i])), KVP_OK);
        }
        assert_int_equal(t.cap, 16);
        for (size_t k = 0; k < N; k++) {
            size_t i = (k * 3 + seed) % N;
            kvp_peer_unref(kvp_peer_table_remove(&t, ids[i]));
            in[i] = false;
            check(&t, ids, in, N);
        }
        kvp_peer_table_cleanup(&t);
    }
}

/* The table holds one reference; a user's reference keeps the peer alive after removal
 * and after the table is gone. */
static void test_refcount(void **state)
{
    (void)state;
    kvp_peer_table_t t;
    kvp_peer_table_init(&t);
    kvp_peer_t *p = kvp_peer_create(5);
    assert_int_equal(kvp_peer_table_insert(&t, p), KVP_OK);
    kvp_peer_ref(p); /* a transfer holding it */
    assert_int_equal(atomic_load(&p->refs), 2);
    kvp_peer_t *q = kvp_peer_create(6);
    assert_int_equal(kvp_peer_table_insert(&t, q), KVP_OK);
    kvp_peer_table_cleanup(&t); /* frees q, drops the table's reference of p */
    assert_int_equal(atomic_load(&p->refs), 1);
    assert_int_equal(p->segment_id, 5); /* still readable */
    kvp_peer_unref(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_insert_find_remove),
        cmocka_unit_test(test_growth_and_shift),
        cmocka_unit_test(test_wrapped_runs),
        cmocka_unit_test(test_refcount),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
