/*
 * test_offset_alloc.c - unit tests for common/offset_alloc.c.
 *
 * The random test drives the allocator against a reference model: a bitmap
 * with one bit per align unit of the arena. Every allocation must land on
 * clear bits inside the usable range, used()/count() must match the model, and
 * because free blocks are coalesced at once, largest_free() must equal the
 * longest run of clear bits. A POOL_FULL answer must mean that no free run
 * could hold the request. Fills with uniform sizes check utilisation against
 * the theoretical best, floor(size / rounded) * rounded.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/offset_alloc.h"

/* ---- deterministic PRNG (splitmix64) ---- */

static uint64_t test_rng_next(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static uint64_t test_rng_range(uint64_t *state, uint64_t lo, uint64_t hi)
{
    return lo + test_rng_next(state) % (hi - lo + 1u);
}

/* ---- reference model: one bit per align unit, set = allocated ---- */

typedef struct test_model {
    uint64_t *words;
    uint64_t units;
    uint64_t nwords;
} test_model_t;

static void test_model_init(test_model_t *model, uint64_t units)
{
    model->units = units;
    model->nwords = (units + 63u) / 64u;
    model->words = calloc(model->nwords, sizeof(uint64_t));
    assert_non_null(model->words);
    /* Bits past the end count as allocated, so they never form a free run. */
    if (units % 64u != 0)
        model->words[model->nwords - 1] = ~UINT64_C(0) << (units % 64u);
}

static void test_model_cleanup(test_model_t *model)
{
    free(model->words);
    model->words = NULL;
}

/* Mask of bits [lo, hi) within one word, 0 <= lo < hi <= 64. */
static uint64_t test_mask(unsigned lo, unsigned hi)
{
    uint64_t upper = hi == 64u ? ~UINT64_C(0) : (UINT64_C(1) << hi) - 1u;
    return upper & ~((UINT64_C(1) << lo) - 1u);
}

/* op 0: true when all clear; op 1: set; op 2: clear (asserting all were set). */
static bool test_model_range(test_model_t *model, uint64_t start, uint64_t n, int op)
{
    uint64_t end = start + n;
    while (start < end) {
        uint64_t w = start / 64u;
        unsigned lo = (unsigned)(start % 64u);
        unsigned hi = end - w * 64u >= 64u ? 64u : (unsigned)(end - w * 64u);
        uint64_t mask = test_mask(lo, hi);
        if (op == 0) {
            if ((model->words[w] & mask) != 0)
                return false;
        } else if (op == 1) {
            model->words[w] |= mask;
        } else {
            assert_true((model->words[w] & mask) == mask);
            model->words[w] &= ~mask;
        }
        start = w * 64u + hi;
    }
    return true;
}

static uint64_t test_model_longest_free(const test_model_t *model)
{
    uint64_t best = 0, run = 0;
    for (uint64_t w = 0; w < model->nwords; w++) {
        uint64_t word = model->words[w];
        if (word == 0) {
            run += 64u;
            continue;
        }
        if (word == ~UINT64_C(0)) {
            best = run > best ? run : best;
            run = 0;
            continue;
        }
        for (unsigned b = 0; b < 64u; b++) {
            if (word & (UINT64_C(1) << b)) {
                best = run > best ? run : best;
                run = 0;
            } else {
                run++;
            }
        }
    }
    return run > best ? run : best;
}

/* ---- random alloc/free against the model ---- */

typedef struct test_live {
    uint64_t offset;
    uint64_t len; /* rounded */
    uint32_t handle;
} test_live_t;

static uint64_t test_round(uint64_t len, uint64_t align)
{
    return (len + align - 1u) & ~(align - 1u);
}

static uint64_t test_pick_len(uint64_t *rng, uint64_t size, uint64_t max_large)
{
    uint64_t r = test_rng_next(rng) % 100u;
    uint64_t len;
    if (r < 50)
        len = test_rng_range(rng, 1, 256);
    else if (r < 85)
        len = test_rng_range(rng, 257, 65536);
    else
        len = test_rng_range(rng, 65537, max_large > 65537 ? max_large : 65537);
    return len > size ? test_rng_range(rng, 1, size) : len;
}

static void test_random_run(uint64_t size, uint64_t align, unsigned ops, uint64_t max_large,
                            uint64_t seed)
{
    kvp_offset_alloc_t *alloc;
    assert_int_equal(kvp_offset_alloc_create(size, align, &alloc), KVP_OK);
    assert_int_equal(kvp_offset_alloc_size(alloc), size);

    uint64_t usable = size & ~(align - 1u);
    test_model_t model;
    test_model_init(&model, usable / align);
    test_live_t *live = calloc(ops, sizeof(*live));
    assert_non_null(live);
    size_t nlive = 0;
    uint64_t used = 0;
    uint64_t rng = seed;
    unsigned full_events = 0;

    for (unsigned i = 0; i < ops; i++) {
        /* Phases that mostly allocate (reach full) and mostly free (reach empty). */
        unsigned alloc_pct = (i / 20000u) % 2u == 0 ? 70u : 35u;
        bool do_alloc = nlive == 0 || test_rng_next(&rng) % 100u < alloc_pct;

        if (do_alloc) {
            uint64_t len = test_pick_len(&rng, size, max_large);
            uint64_t rlen = test_round(len, align);
            uint64_t offset = UINT64_MAX;
            uint32_t handle = KVP_OFFSET_ALLOC_NO_HANDLE;
            kvp_status_t status = kvp_offset_alloc_alloc(alloc, len, &offset, &handle);
            if (status == KVP_OK) {
                assert_int_not_equal(handle, KVP_OFFSET_ALLOC_NO_HANDLE);
                assert_int_equal(offset % align, 0);
                assert_true(offset < usable && rlen <= usable - offset);
                assert_true(test_model_range(&model, offset / align, rlen / align, 0));
                test_model_range(&model, offset / align, rlen / align, 1);
                live[nlive++] = (test_live_t){.offset = offset, .len = rlen, .handle = handle};
                used += rlen;
            } else {
                assert_int_equal(status, KVP_ERR_POOL_FULL);
                assert_int_equal(offset, UINT64_MAX); /* out-params untouched */
                assert_int_equal(handle, KVP_OFFSET_ALLOC_NO_HANDLE);
                assert_true(kvp_offset_alloc_largest_free(alloc) < rlen);
                /* The model's word: nothing free could have held it. */
                if (full_events++ % 16u == 0)
                    assert_true(test_model_longest_free(&model) * align < rlen);
            }
        } else {
            size_t j = (size_t)(test_rng_next(&rng) % nlive);
            kvp_offset_alloc_free(alloc, live[j].handle);
            test_model_range(&model, live[j].offset / align, live[j].len / align, 2);
            used -= live[j].len;
            live[j] = live[--nlive];
        }

        assert_int_equal(kvp_offset_alloc_used(alloc), used);
        assert_int_equal(kvp_offset_alloc_count(alloc), nlive);
        if (i % 4096u == 0)
            assert_int_equal(kvp_offset_alloc_largest_free(alloc),
                             test_model_longest_free(&model) * align);
    }
    assert_true(full_events > 0 || size >= (UINT64_C(1) << 40));

    /* Free everything in random order: one block of the whole usable range. */
    for (size_t k = nlive; k > 1; k--) {
        size_t j = (size_t)(test_rng_next(&rng) % k);
        test_live_t tmp = live[j];
        live[j] = live[k - 1];
        live[k - 1] = tmp;
    }
    for (size_t k = 0; k < nlive; k++) {
        kvp_offset_alloc_free(alloc, live[k].handle);
        test_model_range(&model, live[k].offset / align, live[k].len / align, 2);
    }
    assert_int_equal(kvp_offset_alloc_used(alloc), 0);
    assert_int_equal(kvp_offset_alloc_count(alloc), 0);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), usable);

    uint64_t offset;
    uint32_t handle;
    assert_int_equal(kvp_offset_alloc_alloc(alloc, usable, &offset, &handle), KVP_OK);
    assert_int_equal(offset, 0);
    assert_int_equal(kvp_offset_alloc_used(alloc), usable);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), 0);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, align, &offset, &handle), KVP_ERR_POOL_FULL);
    kvp_offset_alloc_free(alloc, handle);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), usable);

    free(live);
    test_model_cleanup(&model);
    kvp_offset_alloc_destroy(alloc);
}

static void test_random_64mib(void **state)
{
    (void)state;
    test_random_run(UINT64_C(64) << 20, 8, 200000, UINT64_C(4) << 20, 1);
}

static void test_random_64mib_align4k(void **state)
{
    (void)state;
    test_random_run(UINT64_C(64) << 20, 4096, 100000, UINT64_C(4) << 20, 2);
}

static void test_random_odd_sizes(void **state)
{
    (void)state;
    test_random_run(1000003, 1, 60000, 200000, 3);    /* prime, byte-granular */
    test_random_run(12345678, 8, 60000, 1u << 20, 4); /* size % align != 0 */
    test_random_run((UINT64_C(3) << 20) + 7 * 4096, 4096, 30000, 1u << 19, 5);
    test_random_run(100, 4, 20000, 64, 6); /* tiny arena */
    test_random_run(UINT64_C(1) << 40, UINT64_C(1) << 20, 30000, UINT64_C(1) << 38, 7);
}

/* ---- exact accounting ---- */

static void test_accounting(void **state)
{
    (void)state;
    kvp_offset_alloc_t *alloc;
    uint64_t off[4];
    uint32_t h[4];

    assert_int_equal(kvp_offset_alloc_create(1 << 20, 64, &alloc), KVP_OK);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), 1 << 20);

    assert_int_equal(kvp_offset_alloc_alloc(alloc, 1, &off[0], &h[0]), KVP_OK);
    assert_int_equal(off[0], 0);
    assert_int_equal(kvp_offset_alloc_used(alloc), 64);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 65, &off[1], &h[1]), KVP_OK);
    assert_int_equal(off[1], 64);
    assert_int_equal(kvp_offset_alloc_used(alloc), 64 + 128);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 64, &off[2], &h[2]), KVP_OK);
    assert_int_equal(off[2], 192);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 1000, &off[3], &h[3]), KVP_OK);
    assert_int_equal(off[3], 256);
    assert_int_equal(kvp_offset_alloc_used(alloc), 64 + 128 + 64 + 1024);
    assert_int_equal(kvp_offset_alloc_count(alloc), 4);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), (1 << 20) - 1280);

    /* A hole of 128 bytes between two used blocks. */
    kvp_offset_alloc_free(alloc, h[1]);
    assert_int_equal(kvp_offset_alloc_used(alloc), 64 + 64 + 1024);
    assert_int_equal(kvp_offset_alloc_count(alloc), 3);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), (1 << 20) - 1280);

    /* Freeing h[2] merges the hole with it: 192 bytes at 64. */
    kvp_offset_alloc_free(alloc, h[2]);
    kvp_offset_alloc_free(alloc, h[3]);
    assert_int_equal(kvp_offset_alloc_count(alloc), 1);
    assert_int_equal(kvp_offset_alloc_used(alloc), 64);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), (1 << 20) - 64);
    kvp_offset_alloc_free(alloc, h[0]);
    assert_int_equal(kvp_offset_alloc_used(alloc), 0);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), 1 << 20);
    kvp_offset_alloc_destroy(alloc);
}

/* A request of exactly a free block's size, in a class rounding would skip. */
static void test_exact_fit_fallback(void **state)
{
    (void)state;
    kvp_offset_alloc_t *alloc;
    uint64_t off, off_b, off_c;
    uint32_t ha, hb, hc;

    /* align 1: sizes 64..127 have classes 2 wide, so 65 rounds up to [66, 68). */
    assert_int_equal(kvp_offset_alloc_create(1000, 1, &alloc), KVP_OK);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 65, &off, &ha), KVP_OK);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 1, &off_b, &hb), KVP_OK);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 1000 - 66, &off_c, &hc), KVP_OK);
    assert_int_equal(kvp_offset_alloc_used(alloc), 1000);
    kvp_offset_alloc_free(alloc, ha);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), 65);

    assert_int_equal(kvp_offset_alloc_alloc(alloc, 66, &off, &ha), KVP_ERR_POOL_FULL);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 65, &off, &ha), KVP_OK);
    assert_int_equal(off, 0);
    assert_int_equal(kvp_offset_alloc_used(alloc), 1000);

    kvp_offset_alloc_free(alloc, hb);
    kvp_offset_alloc_free(alloc, ha);
    kvp_offset_alloc_free(alloc, hc);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), 1000);
    kvp_offset_alloc_destroy(alloc);
}

/* ---- uniform fills: utilisation against the theoretical best ---- */

static void test_fill_one(uint64_t size, uint64_t align, uint64_t len)
{
    kvp_offset_alloc_t *alloc;
    assert_int_equal(kvp_offset_alloc_create(size, align, &alloc), KVP_OK);

    uint64_t rlen = test_round(len, align);
    uint64_t best_n = size / rlen;
    uint32_t *handles = calloc(best_n + 1, sizeof(*handles));
    assert_non_null(handles);

    uint64_t n = 0, offset;
    kvp_status_t status;
    while ((status = kvp_offset_alloc_alloc(alloc, len, &offset, &handles[n])) == KVP_OK) {
        assert_true(n < best_n);
        n++;
    }
    assert_int_equal(status, KVP_ERR_POOL_FULL);

    double util = (double)kvp_offset_alloc_used(alloc) / (double)size;
    double best = (double)(best_n * rlen) / (double)size;
    print_message("fill %8" PRIu64 " B (rounded %8" PRIu64 "): %6" PRIu64
                  " blocks, util %.5f, theoretical %.5f\n",
                  len, rlen, n, util, best);
    assert_int_equal(kvp_offset_alloc_used(alloc), n * rlen);
    assert_true(util >= 0.99);
    assert_int_equal(n, best_n);

    /* Punch holes of exactly one block each, then refill them all. */
    for (uint64_t i = 0; i < n; i += 2)
        kvp_offset_alloc_free(alloc, handles[i]);
    for (uint64_t i = 0; i < n; i += 2)
        assert_int_equal(kvp_offset_alloc_alloc(alloc, len, &offset, &handles[i]), KVP_OK);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, len, &offset, &handles[n]), KVP_ERR_POOL_FULL);
    assert_int_equal(kvp_offset_alloc_used(alloc), n * rlen);

    for (uint64_t i = 0; i < n; i++)
        kvp_offset_alloc_free(alloc, handles[i]);
    assert_int_equal(kvp_offset_alloc_count(alloc), 0);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), size);
    free(handles);
    kvp_offset_alloc_destroy(alloc);
}

static void test_fill_uniform(void **state)
{
    (void)state;
    const uint64_t size = UINT64_C(256) << 20;
    const uint64_t lens[] = {4096,           4096 + 17,       4096 - 17,
                             65536 * 9 / 10, 65536 * 11 / 10, UINT64_C(1) << 20};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
        test_fill_one(size, 8, lens[i]);
}

/* ---- bad input ---- */

static void test_bad_input(void **state)
{
    (void)state;
    kvp_offset_alloc_t *alloc = NULL;

    assert_int_equal(kvp_offset_alloc_create(0, 8, &alloc), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_offset_alloc_create(4096, 3, &alloc), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_offset_alloc_create(4096, 0, &alloc), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_offset_alloc_create(4096, 8192, &alloc), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_offset_alloc_create(4096, 8, NULL), KVP_ERR_INVALID_ARG);
    assert_null(alloc);
    kvp_offset_alloc_destroy(NULL);

    assert_int_equal(kvp_offset_alloc_create(4096, 8, &alloc), KVP_OK);
    uint64_t off = 77;
    uint32_t h = 77, h2;
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 0, &off, &h), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 4097, &off, &h), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, UINT64_MAX, &off, &h), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_offset_alloc_alloc(NULL, 8, &off, &h), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 8, NULL, &h), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 8, &off, NULL), KVP_ERR_INVALID_ARG);
    assert_int_equal(off, 77);
    assert_int_equal(h, 77);

    /* Handles that are not allocated blocks: nothing changes. */
    kvp_offset_alloc_free(alloc, 0); /* node 0 is the initial free block */
    kvp_offset_alloc_free(alloc, KVP_OFFSET_ALLOC_NO_HANDLE);
    kvp_offset_alloc_free(alloc, 12345);
    kvp_offset_alloc_free(NULL, 0);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), 4096);
    assert_int_equal(kvp_offset_alloc_count(alloc), 0);

    assert_int_equal(kvp_offset_alloc_alloc(alloc, 100, &off, &h), KVP_OK);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 200, &off, &h2), KVP_OK);
    kvp_offset_alloc_free(alloc, h);
    kvp_offset_alloc_free(alloc, h); /* double free: ignored */
    assert_int_equal(kvp_offset_alloc_count(alloc), 1);
    assert_int_equal(kvp_offset_alloc_used(alloc), 200);
    kvp_offset_alloc_free(alloc, h2);
    kvp_offset_alloc_free(alloc, h2); /* its node was merged away: ignored */
    kvp_offset_alloc_free(alloc, h);
    assert_int_equal(kvp_offset_alloc_count(alloc), 0);
    assert_int_equal(kvp_offset_alloc_used(alloc), 0);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), 4096);

    assert_int_equal(kvp_offset_alloc_alloc(alloc, 4096, &off, &h), KVP_OK);
    assert_int_equal(off, 0);
    kvp_offset_alloc_free(alloc, h);
    kvp_offset_alloc_destroy(alloc);

    /* size not a multiple of align: the tail is unusable, len <= size is still valid input. */
    assert_int_equal(kvp_offset_alloc_create(4100, 8, &alloc), KVP_OK);
    assert_int_equal(kvp_offset_alloc_size(alloc), 4100);
    assert_int_equal(kvp_offset_alloc_largest_free(alloc), 4096);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 4097, &off, &h), KVP_ERR_POOL_FULL);
    assert_int_equal(kvp_offset_alloc_alloc(alloc, 4101, &off, &h), KVP_ERR_INVALID_ARG);
    kvp_offset_alloc_destroy(alloc);
}

/* Many blocks: the node array grows and its nodes are reused after merges. */
static void test_node_growth(void **state)
{
    (void)state;
    const uint64_t n = 100000;
    kvp_offset_alloc_t *alloc;
    uint32_t *handles = calloc(n, sizeof(*handles));
    assert_non_null(handles);
    assert_int_equal(kvp_offset_alloc_create(n, 1, &alloc), KVP_OK);

    for (int round = 0; round < 3; round++) {
        uint64_t off;
        for (uint64_t i = 0; i < n; i++) {
            assert_int_equal(kvp_offset_alloc_alloc(alloc, 1, &off, &handles[i]), KVP_OK);
            assert_int_equal(off, i);
        }
        assert_int_equal(kvp_offset_alloc_alloc(alloc, 1, &off, &handles[0]), KVP_ERR_POOL_FULL);
        assert_int_equal(kvp_offset_alloc_count(alloc), n);
        assert_int_equal(kvp_offset_alloc_largest_free(alloc), 0);
        for (uint64_t i = 1; i < n; i += 2)
            kvp_offset_alloc_free(alloc, handles[i]);
        for (uint64_t i = 0; i < n; i += 2)
            kvp_offset_alloc_free(alloc, handles[i]);
        assert_int_equal(kvp_offset_alloc_count(alloc), 0);
        assert_int_equal(kvp_offset_alloc_largest_free(alloc), n);
    }
    kvp_offset_alloc_destroy(alloc);
    free(handles);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accounting),
        cmocka_unit_test(test_exact_fit_fallback),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_node_growth),
        cmocka_unit_test(test_fill_uniform),
        cmocka_unit_test(test_random_64mib),
        cmocka_unit_test(test_random_64mib_align4k),
        cmocka_unit_test(test_random_odd_sizes),
    };
    return cmocka_run_group_tests_name("offset_alloc", tests, NULL, NULL);
}
