/*
 * test_crc32c.c - unit tests for common/crc32c.c.
 *
 * Known vectors (RFC 3720 B.4) pin the software reference; the dispatched
 * (hardware where available) and copy paths are then checked against it on
 * pseudo-random data of every small length, every alignment, the lengths
 * around the three-chain block boundaries, and a few large sizes. Data comes
 * from a fixed-seed xorshift generator so a failure reproduces.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"

#define CANARY 0xA5

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

static void fill_random(unsigned char *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (unsigned char)(rng_next() >> 56);
}

/* Lengths around the 3 x 256 and 3 x 8192 round sizes, plus big odd ones. */
static const size_t big_lens[] = {
    767,
    768,
    769,
    3 * 768 + 5,
    4096,
    3 * 8192 - 1,
    3 * 8192,
    3 * 8192 + 1,
    3 * 8192 + 771,
    6 * 8192 + 13,
    65536 + 3,
    (1u << 20) - 1,
    (1u << 20),
    (1u << 20) + 7,
    (3u << 20) + 12345,
};
#define N_BIG_LENS (sizeof(big_lens) / sizeof(big_lens[0]))

static void test_known_vectors(void **state)
{
    (void)state;
    unsigned char buf[32], dst[32];

    assert_int_equal(kvp_crc32c_sw(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(kvp_crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(kvp_crc32c_copy(0, dst, "123456789", 9), 0xE3069283u);

    memset(buf, 0, sizeof(buf));
    assert_int_equal(kvp_crc32c_sw(0, buf, 32), 0x8A9136AAu);
    assert_int_equal(kvp_crc32c(0, buf, 32), 0x8A9136AAu);
    assert_int_equal(kvp_crc32c_copy(0, dst, buf, 32), 0x8A9136AAu);

    memset(buf, 0xFF, sizeof(buf));
    assert_int_equal(kvp_crc32c_sw(0, buf, 32), 0x62A8AB43u);
    assert_int_equal(kvp_crc32c(0, buf, 32), 0x62A8AB43u);
    assert_int_equal(kvp_crc32c_copy(0, dst, buf, 32), 0x62A8AB43u);

    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)i;
    assert_int_equal(kvp_crc32c_sw(0, buf, 32), 0x46DD794Eu);
    assert_int_equal(kvp_crc32c(0, buf, 32), 0x46DD794Eu);
    assert_int_equal(kvp_crc32c_copy(0, dst, buf, 32), 0x46DD794Eu);
}

static void test_empty(void **state)
{
    (void)state;
    unsigned char buf[1] = {0x5A}, dst[1] = {CANARY};

    assert_int_equal(kvp_crc32c(0, buf, 0), 0);
    assert_int_equal(kvp_crc32c_sw(0, buf, 0), 0);
    assert_int_equal(kvp_crc32c(0xDEADBEEFu, buf, 0), 0xDEADBEEFu);
    assert_int_equal(kvp_crc32c_sw(0xDEADBEEFu, buf, 0), 0xDEADBEEFu);
    assert_int_equal(kvp_crc32c_copy(0x12345678u, dst, buf, 0), 0x12345678u);
    assert_int_equal(dst[0], CANARY);
    /* len == 0 never dereferences */
    assert_int_equal(kvp_crc32c(7, NULL, 0), 7);
    assert_int_equal(kvp_crc32c_sw(7, NULL, 0), 7);
    assert_int_equal(kvp_crc32c_copy(7, NULL, NULL, 0), 7);
}

static void test_hw_available(void **state)
{
    (void)state;
    bool hw = kvp_crc32c_hw_available();
#if defined(__x86_64__)
    assert_true(hw == (bool)__builtin_cpu_supports("sse4.2"));
#else
    assert_false(hw);
#endif
    if (!hw)
        print_message("crc32c: no SSE4.2, hardware path not exercised\n");
}

static void test_hw_matches_sw_small(void **state)
{
    (void)state;
    unsigned char *buf = malloc(1024 + 64);
    assert_non_null(buf);

    for (size_t len = 0; len <= 1024; len++) {
        for (size_t off = 0; off < 8; off++) {
            fill_random(buf + off, len);
            uint32_t seed = (uint32_t)rng_next();
            uint32_t sw = kvp_crc32c_sw(seed, buf + off, len);
            assert_int_equal(kvp_crc32c(seed, buf + off, len), sw);
        }
        /* plus one random offset up to a cache line further */
        size_t off = rng_next() % 64;
        fill_random(buf + off, len);
        assert_int_equal(kvp_crc32c(0, buf + off, len), kvp_crc32c_sw(0, buf + off, len));
    }
    free(buf);
}

static void test_hw_matches_sw_large(void **state)
{
    (void)state;
    size_t max = 0;
    for (size_t i = 0; i < N_BIG_LENS; i++)
        max = big_lens[i] > max ? big_lens[i] : max;
    unsigned char *buf = malloc(max + 16);
    assert_non_null(buf);
    fill_random(buf, max + 16);

    for (size_t i = 0; i < N_BIG_LENS; i++) {
        size_t off = rng_next() % 16;
        uint32_t sw = kvp_crc32c_sw(0, buf + off, big_lens[i]);
        assert_int_equal(kvp_crc32c(0, buf + off, big_lens[i]), sw);
        assert_int_equal(kvp_crc32c(0xCAFEF00Du, buf + off, big_lens[i]),
                         kvp_crc32c_sw(0xCAFEF00Du, buf + off, big_lens[i]));
    }
    free(buf);
}

/* Every length from just under the folding path's minimum (512) to past four of its 256-byte
 * rounds, each tail of 64 and 16 bytes and bytes, at random offsets and seeds. */
static void test_fold_lengths(void **state)
{
    (void)state;
    unsigned char *buf = malloc(2200 + 64);
    assert_non_null(buf);
    for (size_t len = 500; len <= 2200; len++) {
        size_t off = rng_next() % 64;
        fill_random(buf + off, len);
        uint32_t seed = (uint32_t)rng_next();
        assert_int_equal(kvp_crc32c(seed, buf + off, len), kvp_crc32c_sw(seed, buf + off, len));
    }
    free(buf);
}

static void test_chaining(void **state)
{
    (void)state;
    unsigned char buf[300], dst[300];
    fill_random(buf, sizeof(buf));
    uint32_t whole = kvp_crc32c_sw(0, buf, sizeof(buf));
    assert_int_equal(kvp_crc32c(0, buf, sizeof(buf)), whole);

    for (size_t split = 0; split <= sizeof(buf); split++) {
        size_t rest = sizeof(buf) - split;
        assert_int_equal(kvp_crc32c_sw(kvp_crc32c_sw(0, buf, split), buf + split, rest), whole);
        assert_int_equal(kvp_crc32c(kvp_crc32c(0, buf, split), buf + split, rest), whole);
        memset(dst, 0, sizeof(dst));
        uint32_t c = kvp_crc32c_copy(0, dst, buf, split);
        c = kvp_crc32c_copy(c, dst + split, buf + split, rest);
        assert_int_equal(c, whole);
        assert_memory_equal(dst, buf, sizeof(buf));
    }

    /* a large buffer split across the round boundaries */
    size_t big = 5 * 24576 + 999;
    unsigned char *b = malloc(big);
    assert_non_null(b);
    fill_random(b, big);
    uint32_t bw = kvp_crc32c_sw(0, b, big);
    for (size_t split = 1; split < big; split = split * 3 + 7)
        assert_int_equal(kvp_crc32c(kvp_crc32c(0, b, split), b + split, big - split), bw);
    free(b);
}

/* Pieces crc'ed on their own and combined give the crc of the whole, at every split. */
static void test_combine(void **state)
{
    (void)state;
    unsigned char buf[300];
    fill_random(buf, sizeof(buf));
    uint32_t whole = kvp_crc32c(0, buf, sizeof(buf));
    for (size_t split = 0; split <= sizeof(buf); split++) {
        size_t rest = sizeof(buf) - split;
        uint32_t a = kvp_crc32c(0, buf, split), b = kvp_crc32c(0, buf + split, rest);
        assert_int_equal(kvp_crc32c_combine(a, b, rest), whole);
    }
    assert_int_equal(kvp_crc32c_combine(0, 0x12345678u, 0), 0x12345678u);

    /* many slices of a large buffer, the way the tcp transport combines them */
    size_t big = (3u << 20) + 12345, slice = 1u << 18;
    unsigned char *b = malloc(big);
    assert_non_null(b);
    fill_random(b, big);
    uint32_t c = 0;
    for (size_t off = 0; off < big; off += slice) {
        size_t n = big - off < slice ? big - off : slice;
        c = kvp_crc32c_combine(c, kvp_crc32c(0, b + off, n), n);
    }
    assert_int_equal(c, kvp_crc32c_sw(0, b, big));
    free(b);
}

static void check_copy_as(const unsigned char *src, unsigned char *dst, size_t dst_size,
                          size_t dst_off, size_t len, uint32_t seed, bool piece)
{
    memset(dst, CANARY, dst_size);
    uint32_t c = piece ? kvp_crc32c_copy_piece(seed, dst + dst_off, src, len, true)
                       : kvp_crc32c_copy(seed, dst + dst_off, src, len);
    assert_int_equal(c, kvp_crc32c(seed, src, len));
    assert_int_equal(c, kvp_crc32c_sw(seed, src, len));
    assert_memory_equal(dst + dst_off, src, len);
    for (size_t i = 0; i < dst_off; i++)
        assert_int_equal(dst[i], CANARY);
    for (size_t i = dst_off + len; i < dst_size; i++)
        assert_int_equal(dst[i], CANARY);
}

static void check_copy(const unsigned char *src, unsigned char *dst, size_t dst_size,
                       size_t dst_off, size_t len, uint32_t seed)
{
    check_copy_as(src, dst, dst_size, dst_off, len, seed, false);
}

static void test_copy(void **state)
{
    (void)state;
    size_t max = 0;
    for (size_t i = 0; i < N_BIG_LENS; i++)
        max = big_lens[i] > max ? big_lens[i] : max;
    size_t size = max + 64;
    unsigned char *src = malloc(size), *dst = malloc(size);
    assert_non_null(src);
    assert_non_null(dst);
    fill_random(src, size);

    for (size_t len = 0; len <= 1024; len++) {
        size_t so = rng_next() % 16, d_o = rng_next() % 16;
        check_copy(src + so, dst, len + 32, d_o, len, (uint32_t)rng_next());
    }
    for (size_t so = 0; so < 8; so++) {
        for (size_t d_o = 0; d_o < 8; d_o++)
            check_copy(src + so, dst, 3 * 768 + 77 + 16, d_o, 3 * 768 + 77, 0);
    }
    for (size_t i = 0; i < N_BIG_LENS; i++) {
        size_t so = rng_next() % 32, d_o = rng_next() % 32;
        check_copy(src + so, dst, big_lens[i] + 32, d_o, big_lens[i], 0);
    }
    free(src);
    free(dst);
}

/*
 * Copies of 1 MiB and more take the streaming-store path unless dst lies just above src
 * modulo 4 KiB; cover both sides of that choice, with odd lengths and unaligned ends.
 */
static void test_copy_large_distances(void **state)
{
    (void)state;
    static const size_t lens[] = {(1u << 20), (1u << 20) + 13, (2u << 20) + 4097};
    static const size_t dists[] = {0, 8, 200, 511, 512, 2048, 4088};
    size_t size = (2u << 20) + 4097 + 2 * 4096;
    unsigned char *src = malloc(size), *dst = malloc(size + 4096);
    assert_non_null(src);
    assert_non_null(dst);
    fill_random(src, size);

    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        for (size_t k = 0; k < sizeof(dists) / sizeof(dists[0]); k++) {
            size_t so = rng_next() % 4096;
            /* dst offset such that (dst + d_o) - (src + so) == dists[k] modulo 4096 */
            size_t d_o = (((uintptr_t)src + so + dists[k] - (uintptr_t)dst) & 4095);
            check_copy(src + so, dst, d_o + lens[i] + 32, d_o, lens[i], (uint32_t)rng_next());
        }
    }
    free(src);
    free(dst);
}

/*
 * dst at src's offset modulo 4 KiB takes the whole-line streaming copy (with AVX2): page-aligned
 * ends, a source a few bytes short of or past a line boundary (the head copied before the
 * lines), and lengths that leave nothing, part of a round or a tail after the rounds.
 */
static void test_copy_same_page_offset(void **state)
{
    (void)state;
    static const size_t lens[] = {(1u << 20), (1u << 20) + 3 * 8192 - 1, (1u << 20) + 70001};
    static const size_t offs[] = {0, 1, 8, 63, 64, 4095};
    size_t size = ((1u << 20) + 70001 + 8192 + 4095) & ~(size_t)4095;
    unsigned char *src = aligned_alloc(4096, size), *dst = aligned_alloc(4096, size + 4096);
    assert_non_null(src);
    assert_non_null(dst);
    fill_random(src, size);
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
        for (size_t k = 0; k < sizeof(offs) / sizeof(offs[0]); k++)
            check_copy(src + offs[k], dst, offs[k] + lens[i] + 32, offs[k], lens[i],
                       (uint32_t)rng_next());
    free(src);
    free(dst);
}

/*
 * A piece of a streamed whole (kvp_crc32c_copy_piece with stream) streams however short it is:
 * the SHORT rounds too, by lines at the same page offset. Lengths around a SHORT round (768),
 * a LONG round (24 KiB) and a layer-wise piece (16 KiB), at the distances that choose among
 * the three copies, from sources on and off a line boundary.
 */
static void test_copy_piece_streamed(void **state)
{
    (void)state;
    static const size_t lens[] = {0,    1,    63,    64,    767,          768,      769,  2303,
                                  2304, 4096, 16384, 16461, 3 * 8192 - 1, 3 * 8192, 70001};
    static const size_t dists[] = {0, 8, 511, 512, 2048};
    static const size_t offs[] = {0, 1, 63, 64, 4000};
    const size_t n_lens = sizeof(lens) / sizeof(lens[0]),
                 n_dists = sizeof(dists) / sizeof(dists[0]);
    const size_t size = 20 * 4096; /* > 4096 + 70001 + 4096 + 32, a multiple of the alignment */
    unsigned char *src = aligned_alloc(4096, size), *dst = aligned_alloc(4096, size);
    assert_non_null(src);
    assert_non_null(dst);
    fill_random(src, size);
    for (size_t t = 0; t < n_lens * n_dists * (sizeof(offs) / sizeof(offs[0])); t++) {
        size_t len = lens[t % n_lens], so = offs[t / (n_lens * n_dists)];
        size_t d_o = (so + dists[(t / n_lens) % n_dists]) & 4095;
        check_copy_as(src + so, dst, d_o + len + 32, d_o, len, (uint32_t)rng_next(), true);
    }
    free(src);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_vectors),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_hw_available),
        cmocka_unit_test(test_hw_matches_sw_small),
        cmocka_unit_test(test_hw_matches_sw_large),
        cmocka_unit_test(test_fold_lengths),
        cmocka_unit_test(test_chaining),
        cmocka_unit_test(test_combine),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_copy_large_distances),
        cmocka_unit_test(test_copy_same_page_offset),
        cmocka_unit_test(test_copy_piece_streamed),
    };
    return cmocka_run_group_tests_name("crc32c", tests, NULL, NULL);
}
