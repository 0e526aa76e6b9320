/*
 * test_decode.c - unit tests for indexer/decode.c: vLLM's array-like batches and events,
 * the newer map form, the standardized envelope, hashes as integers (negative too) and as
 * bytes, events of unknown tags skipped; truncations, bombs (a few bytes claiming 2^32
 * elements), wrong types and random mutations refused or decoded, never read past the end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "indexer/decode.h"

/* ---- a small msgpack writer ---- */

typedef struct mp {
    uint8_t b[4096];
    size_t n;
} mp_t;

static void put8(mp_t *m, uint8_t v)
{
    assert_true(m->n < sizeof(m->b));
    m->b[m->n++] = v;
}

static void putbe(mp_t *m, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--)
        put8(m, (uint8_t)(v >> (8 * i)));
}

static void arr(mp_t *m, uint32_t n)
{
    if (n < 16) {
        put8(m, (uint8_t)(0x90 | n));
    } else {
        put8(m, 0xdc);
        putbe(m, n, 2);
    }
}

static void map(mp_t *m, uint32_t n)
{
    put8(m, (uint8_t)(0x80 | n));
}

static void str(mp_t *m, const char *s)
{
    size_t n = strlen(s);
    put8(m, (uint8_t)(0xa0 | n));
    for (size_t i = 0; i < n; i++)
        put8(m, (uint8_t)s[i]);
}

static void u(mp_t *m, uint64_t v)
{
    if (v < 128) {
        put8(m, (uint8_t)v);
    } else {
        put8(m, 0xcf);
        putbe(m, v, 8);
    }
}

static void nil(mp_t *m)
{
    put8(m, 0xc0);
}

static void f64(mp_t *m)
{
    put8(m, 0xcb);
    putbe(m, 0x41d0000000000000ull, 8);
}

static void bin32(mp_t *m, uint8_t fill, uint8_t last)
{
    put8(m, 0xc4);
    put8(m, 32);
    for (int i = 0; i < 31; i++)
        put8(m, fill);
    put8(m, last);
}

/* vLLM's array-like batch: a store of 2 blocks on CPU, a remove by a bytes hash, a clear,
 * data parallel rank 3. */
static void vllm_batch(mp_t *m)
{
    m->n = 0;
    arr(m, 3);
    f64(m);
    arr(m, 4);
    arr(m, 7);
    str(m, "BlockStored");
    arr(m, 2);
    u(m, 1);
    u(m, 0x8000000000000002ull);
    nil(m);
    arr(m, 8);
    for (int i = 0; i < 8; i++)
        u(m, (uint64_t)i + 100);
    u(m, 4);
    nil(m);
    str(m, "CPU");
    arr(m, 3);
    str(m, "BlockRemoved");
    arr(m, 1);
    bin32(m, 0xee, 0x07);
    nil(m);
    arr(m, 1);
    str(m, "AllBlocksCleared");
    arr(m, 2);
    str(m, "SomethingNew");
    u(m, 5);
    u(m, 3);
}

static void test_vllm_array(void **state)
{
    (void)state;
    mp_t m;
    vllm_batch(&m);
    kvp_decoder_t d;
    kvp_decoder_init(&d);
    kvp_idx_batch_t b;
    char why[128];
    assert_int_equal(kvp_decode_batch(&d, m.b, m.n, &b, why, sizeof(why)), KVP_OK);
    assert_int_equal(b.n_ops, 3);
    assert_true(b.has_rank);
    assert_int_equal(b.rank, 3);
    assert_int_equal(d.unknown, 1);
    const kvp_idx_op_t *op = &b.ops[0];
    assert_int_equal(op->kind, KVP_IDX_STORED);
    assert_false(op->envelope);
    assert_false(op->has_parent);
    assert_true(op->has_tokens);
    assert_int_equal(op->n_tokens, 8);
    assert_int_equal(op->medium_len, 3);
    assert_memory_equal(op->medium, "CPU", 3);
    uint64_t h[2];
    uint32_t t[8];
    b.hashes(b.arg, op, h);
    assert_true(h[0] == 1 && h[1] == 0x8000000000000002ull);
    b.tokens(b.arg, op, t);
    for (int i = 0; i < 8; i++)
        assert_int_equal(t[i], 100 + i);
    op = &b.ops[1];
    assert_int_equal(op->kind, KVP_IDX_REMOVED);
    assert_null(op->medium); /* nil: GPU */
    b.hashes(b.arg, op, h);
    assert_true(h[0] == 0xeeeeeeeeeeeeee07ull); /* the last 8 bytes, big-endian */
    assert_int_equal(b.ops[2].kind, KVP_IDX_CLEARED);
    assert_true(b.ops[2].all_media);
    kvp_decoder_cleanup(&d);
}

static void test_map_and_envelope(void **state)
{
    (void)state;
    mp_t m = {.n = 0};
    map(&m, 3);
    str(&m, "ts");
    f64(&m);
    str(&m, "events");
    arr(&m, 2);
    map(&m, 8); /* newer vLLM: a tagged struct as a map */
    str(&m, "type");
    str(&m, "BlockStored");
    str(&m, "block_hashes");
    arr(&m, 1);
    put8(&m, 0xff); /* -1 */
    str(&m, "parent_block_hash");
    u(&m, 77);
    str(&m, "token_ids");
    arr(&m, 2);
    u(&m, 1);
    u(&m, 2);
    str(&m, "block_size");
    u(&m, 2);
    str(&m, "medium");
    nil(&m);
    str(&m, "extra_keys");
    arr(&m, 1);
    arr(&m, 2);
    u(&m, 1);
    str(&m, "x");
    str(&m, "group_idx");
    u(&m, 0);
    map(&m, 8); /* the standardized envelope, as kvpool masters publish it */
    str(&m, "event_id");
    u(&m, 0);
    str(&m, "event_type");
    str(&m, "removed");
    str(&m, "tenant_id");
    str(&m, "team");
    str(&m, "medium");
    str(&m, "cpu");
    str(&m, "dp_rank");
    u(&m, 2);
    str(&m, "seq_hashes");
    arr(&m, 1);
    u(&m, 9);
    str(&m, "base_block_idx");
    nil(&m);
    str(&m, "object_key");
    str(&m, "k");
    str(&m, "data_parallel_rank");
    u(&m, 1);
    kvp_decoder_t d;
    kvp_decoder_init(&d);
    kvp_idx_batch_t b;
    char why[128];
    assert_int_equal(kvp_decode_batch(&d, m.b, m.n, &b, why, sizeof(why)), KVP_OK);
    assert_int_equal(b.n_ops, 2);
    assert_true(b.has_rank && b.rank == 1);
    const kvp_idx_op_t *op = &b.ops[0];
    assert_int_equal(op->kind, KVP_IDX_STORED);
    assert_true(op->has_parent && op->parent == 77);
    uint64_t h;
    b.hashes(b.arg, op, &h);
    assert_true(h == UINT64_MAX);
    op = &b.ops[1];
    assert_true(op->envelope);
    assert_int_equal(op->kind, KVP_IDX_REMOVED);
    assert_int_equal(op->tenant_len, 4);
    assert_memory_equal(op->tenant, "team", 4);
    assert_true(op->has_rank && op->rank == 2);
    assert_false(op->has_base);
    b.hashes(b.arg, op, &h);
    assert_true(h == 9);
    kvp_decoder_cleanup(&d);
}

/* Empty arrays (no token ids, no hashes) decode, before any array was ever read: the
 * decoder's arrays start empty. */
static void test_empty_arrays(void **state)
{
    (void)state;
    mp_t m = {.n = 0};
    arr(&m, 2);
    f64(&m);
    arr(&m, 2);
    arr(&m, 4);
    str(&m, "BlockStored");
    arr(&m, 1);
    u(&m, 5);
    nil(&m);
    arr(&m, 0); /* token_ids [] */
    arr(&m, 2);
    str(&m, "BlockRemoved");
    arr(&m, 0); /* block_hashes [] */
    kvp_decoder_t d;
    kvp_decoder_init(&d);
    kvp_idx_batch_t b;
    char why[128];
    assert_int_equal(kvp_decode_batch(&d, m.b, m.n, &b, why, sizeof(why)), KVP_OK);
    assert_int_equal(b.n_ops, 2);
    assert_int_equal(b.ops[0].n_tokens, 0);
    assert_int_equal(b.ops[1].n_hashes, 0);
    uint64_t h;
    b.hashes(b.arg, &b.ops[0], &h);
    assert_true(h == 5);
    b.hashes(b.arg, &b.ops[1], &h);
    kvp_decoder_cleanup(&d);
}

static void test_refused(void **state)
{
    (void)state;
    kvp_decoder_t d;
    kvp_decoder_init(&d);
    kvp_idx_batch_t b;
    char why[128];
    mp_t m;
    vllm_batch(&m);
    /* every truncation */
    for (size_t len = 0; len < m.n; len++)
        if (kvp_decode_batch(&d, m.b, len, &b, why, sizeof(why)) != KVP_ERR_PROTOCOL)
            fail_msg("a batch cut at %zu of %zu bytes decoded", len, m.n);
    /* trailing bytes */
    m.b[m.n] = 0xc0;
    assert_int_equal(kvp_decode_batch(&d, m.b, m.n + 1, &b, why, sizeof(why)), KVP_ERR_PROTOCOL);
    /* a bomb: an array of 2^32-1 events in 6 bytes */
    static const uint8_t bomb[] = {0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(kvp_decode_batch(&d, bomb, sizeof(bomb), &b, why, sizeof(why)),
                     KVP_ERR_PROTOCOL);
    /* a map of 2^32-1 entries to skip, inside an event */
    static const uint8_t bomb2[] = {0x92, 0x00, 0x91, 0x92, 0xab, 'B',  'l',  'o',  'c', 'k',
                                    'R',  'e',  'm',  'o',  0xdf, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(kvp_decode_batch(&d, bomb2, sizeof(bomb2), &b, why, sizeof(why)),
                     KVP_ERR_PROTOCOL);
    /* a token id over 2^32-1, a hash of 65 bytes, a string where hashes go */
    m.n = 0;
    arr(&m, 2);
    f64(&m);
    arr(&m, 1);
    arr(&m, 4);
    str(&m, "BlockStored");
    arr(&m, 1);
    u(&m, 1);
    nil(&m);
    arr(&m, 1);
    u(&m, 1ull << 32);
    assert_int_equal(kvp_decode_batch(&d, m.b, m.n, &b, why, sizeof(why)), KVP_ERR_PROTOCOL);
    m.n = 0;
    arr(&m, 2);
    f64(&m);
    arr(&m, 1);
    arr(&m, 2);
    str(&m, "BlockRemoved");
    put8(&m, 0xa3);
    put8(&m, 'a');
    put8(&m, 'b');
    put8(&m, 'c');
    assert_int_equal(kvp_decode_batch(&d, m.b, m.n, &b, why, sizeof(why)), KVP_ERR_PROTOCOL);
    /* deep nesting inside a skipped value: no recursion, refused only when cut */
    uint8_t deep[3000];
    size_t n = 0;
    deep[n++] = 0x92;
    deep[n++] = 0x00;
    deep[n++] = 0x91;
    deep[n++] = 0x92;
    deep[n++] = 0xa3;
    deep[n++] = 'Z';
    deep[n++] = 'z';
    deep[n++] = 'z';
    for (int i = 0; i < 2000; i++)
        deep[n++] = 0x91;
    deep[n++] = 0xc0;
    assert_int_equal(kvp_decode_batch(&d, deep, n, &b, why, sizeof(why)), KVP_OK);
    assert_int_equal(b.n_ops, 0);
    assert_int_equal(kvp_decode_batch(&d, deep, n - 1, &b, why, sizeof(why)), KVP_ERR_PROTOCOL);
    kvp_decoder_cleanup(&d);
}

/* Random mutations of a valid batch: decoded or refused, and a decoded one's arrays read
 * back within the buffer (ASan in CI). */
static void test_mutations(void **state)
{
    (void)state;
    mp_t base;
    vllm_batch(&base);
    kvp_decoder_t d;
    kvp_decoder_init(&d);
    uint64_t r = 0x2545F4914F6CDD1Dull;
    uint64_t h[64];
    uint32_t t[64];
    for (int it = 0; it < 50000; it++) {
        uint8_t *b = malloc(base.n);
        assert_non_null(b);
        memcpy(b, base.b, base.n);
        for (int k = 0; k < 1 + it % 3; k++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            b[r % base.n] = (uint8_t)(r >> 40);
        }
        kvp_idx_batch_t bt;
        char why[64];
        if (kvp_decode_batch(&d, b, base.n, &bt, why, sizeof(why)) == KVP_OK)
            for (size_t i = 0; i < bt.n_ops; i++) {
                if (bt.ops[i].n_hashes <= 64)
                    bt.hashes(bt.arg, &bt.ops[i], h);
                if (bt.ops[i].has_tokens && bt.ops[i].n_tokens <= 64)
                    bt.tokens(bt.arg, &bt.ops[i], t);
            }
        free(b);
    }
    kvp_decoder_cleanup(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vllm_array),   cmocka_unit_test(test_map_and_envelope),
        cmocka_unit_test(test_empty_arrays), cmocka_unit_test(test_refused),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
