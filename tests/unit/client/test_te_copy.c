/*
 * test_te_copy.c - unit tests for client/te/te_copy.c, the transfer engine's same-host copy:
 * a batch's ranges moved with process_vm_writev / readv, split by bytes over the caller and
 * helper threads. The "other process" is this one (process_vm_* to our own pid moves bytes
 * as to another's), so every byte is checked here.
 *
 * Asserted: every range lands byte for byte and nothing is written around the ranges, for
 * 1-8 threads, ranges of odd lengths that the parts cut in the middle, more ranges than one
 * call takes (IOV_MAX) and a batch below the split threshold; both directions; a remote
 * range that is not mapped, the first or one in a helper's part, gives EFAULT with no hang,
 * and the pool goes on serving after it;
 * two threads sharing one pool at once (one gets the helpers, the other copies alone).
 *
 * Thread: cmocka's; the pool's helpers and the test's own threads behind it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client/te/te_copy.h"

#define GUARD 64

typedef struct batch {
    size_t n;
    void **l;
    uint64_t *r, *lens;
    uint8_t *src, *dst;
    size_t src_len, dst_len;
} batch_t;

static uint8_t byte_at(size_t i)
{
    return (uint8_t)(i * 2654435761u >> 13);
}

/* n ranges of lengths from lens (cycled), source ranges back to back, destination ranges in
 * reverse order with GUARD bytes between them (the guards must stay 0xEE). */
static void batch_make(batch_t *b, size_t n, const size_t *lens, size_t n_lens)
{
    b->n = n;
    b->l = calloc(n, sizeof(*b->l));
    b->r = calloc(n, sizeof(*b->r));
    b->lens = calloc(n, sizeof(*b->lens));
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += lens[i % n_lens];
    b->src_len = total;
    b->dst_len = total + (n + 1) * GUARD;
    b->src = malloc(b->src_len);
    b->dst = malloc(b->dst_len);
    assert_non_null(b->l);
    assert_non_null(b->r);
    assert_non_null(b->lens);
    assert_non_null(b->src);
    assert_non_null(b->dst);
    for (size_t i = 0; i < total; i++)
        b->src[i] = byte_at(i);
    memset(b->dst, 0xEE, b->dst_len);
    size_t so = 0, d_end = b->dst_len - GUARD;
    for (size_t i = 0; i < n; i++) {
        size_t len = lens[i % n_lens];
        b->l[i] = b->src + so;
        b->lens[i] = len;
        d_end -= len;
        b->r[i] = (uintptr_t)(b->dst + d_end);
        d_end -= GUARD;
        so += len;
    }
}

static void batch_check(const batch_t *b)
{
    uint8_t *want = malloc(b->dst_len);
    assert_non_null(want);
    memset(want, 0xEE, b->dst_len);
    for (size_t i = 0; i < b->n; i++)
        memcpy(want + ((uint8_t *)(uintptr_t)b->r[i] - b->dst), b->l[i], b->lens[i]);
    assert_memory_equal(b->dst, want, b->dst_len);
    free(want);
}

static void batch_free(batch_t *b)
{
    free(b->l);
    free(b->r);
    free(b->lens);
    free(b->src);
    free(b->dst);
}

static void write_then_read(unsigned threads, size_t n, const size_t *lens, size_t n_lens)
{
    kvp_te_copy_t *c = kvp_te_copy_create(threads);
    assert_non_null(c);
    batch_t b;
    batch_make(&b, n, lens, n_lens);
    assert_int_equal(kvp_te_copy_run(c, getpid(), true, b.l, b.r, b.lens, b.n), 0);
    batch_check(&b);
    /* read it back into a cleared source */
    uint8_t *keep = malloc(b.src_len);
    assert_non_null(keep);
    memcpy(keep, b.src, b.src_len);
    memset(b.src, 0, b.src_len);
    assert_int_equal(kvp_te_copy_run(c, getpid(), false, b.l, b.r, b.lens, b.n), 0);
    assert_memory_equal(b.src, keep, b.src_len);
    free(keep);
    batch_free(&b);
    kvp_te_copy_destroy(c);
}

static void test_runs_split_over_threads(void **state)
{
    (void)state;
    /* 8 MiB in ranges of 1 MiB + 3 and 700 KiB - 1: the parts end inside ranges */
    static const size_t lens[] = {(1u << 20) + 3, (700u << 10) - 1};
    for (unsigned t = 1; t <= 8; t++)
        write_then_read(t, 10, lens, 2);
}

static void test_more_ranges_than_one_call(void **state)
{
    (void)state;
    /* 3000 ranges of 1-4 KiB + odd (about 9 MiB): each part spans several calls */
    static const size_t lens[] = {4099, 1021, 3001, 2048};
    write_then_read(2, 3000, lens, 4);
    write_then_read(3, 3000, lens, 4);
}

static void test_small_batch_on_the_caller(void **state)
{
    (void)state;
    static const size_t lens[] = {65536};
    write_then_read(2, 8, lens, 1); /* 512 KiB: under the split threshold */
    write_then_read(4, 1, lens, 1);
}

static void test_unmapped_range_in_the_middle(void **state)
{
    (void)state;
    kvp_te_copy_t *c = kvp_te_copy_create(3);
    assert_non_null(c);
    static const size_t lens[] = {1u << 20};
    batch_t b;
    batch_make(&b, 12, lens, 1);
    /* reserved and inaccessible, kept until the end: an address unmapped before the pool
     * starts its helpers could be reused for one of their stacks */
    void *gone = mmap(NULL, 1u << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(gone != MAP_FAILED);
    uint64_t keep = b.r[7];
    b.r[7] = (uintptr_t)gone; /* range 7 of 12: in a helper's part (3 threads: 4 ranges each) */
    assert_int_equal(kvp_te_copy_run(c, getpid(), true, b.l, b.r, b.lens, b.n), EFAULT);
    b.r[7] = keep;
    memset(b.dst, 0xEE, b.dst_len);
    assert_int_equal(kvp_te_copy_run(c, getpid(), true, b.l, b.r, b.lens, b.n), 0);
    batch_check(&b);
    batch_free(&b);
    kvp_te_copy_destroy(c);
    munmap(gone, 1u << 20);
}

static void test_unmapped_remote_is_efault(void **state)
{
    (void)state;
    kvp_te_copy_t *c = kvp_te_copy_create(2);
    assert_non_null(c);
    size_t len = 4u << 20;
    uint8_t *src = malloc(len);
    assert_non_null(src);
    memset(src, 1, len);
    /* a range no one may touch, kept reserved until the end (an address unmapped before
     * the pool starts its helpers could be reused for one of their stacks) */
    void *gone = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(gone != MAP_FAILED);
    void *l = src;
    uint64_t r = (uintptr_t)gone, rlen = len;
    assert_int_equal(kvp_te_copy_run(c, getpid(), true, &l, &r, &rlen, 1), EFAULT);
    /* the pool still serves */
    static const size_t lens[] = {(1u << 20) + 5};
    batch_t b;
    batch_make(&b, 4, lens, 1);
    assert_int_equal(kvp_te_copy_run(c, getpid(), true, b.l, b.r, b.lens, b.n), 0);
    batch_check(&b);
    batch_free(&b);
    free(src);
    kvp_te_copy_destroy(c);
    munmap(gone, len);
}

typedef struct sharer {
    kvp_te_copy_t *c;
    int rc;
} sharer_t;

static void *share_main(void *arg)
{
    sharer_t *s = arg;
    static const size_t lens[] = {(1u << 20) + 7, 333333};
    for (int i = 0; i < 20 && s->rc == 0; i++) {
        batch_t b;
        batch_make(&b, 6, lens, 2);
        s->rc = kvp_te_copy_run(s->c, getpid(), true, b.l, b.r, b.lens, b.n);
        if (s->rc == 0)
            batch_check(&b);
        batch_free(&b);
    }
    return NULL;
}

static void test_two_callers_share_a_pool(void **state)
{
    (void)state;
    kvp_te_copy_t *c = kvp_te_copy_create(3);
    assert_non_null(c);
    sharer_t s[2] = {{.c = c}, {.c = c}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, share_main, &s[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(s[i].rc, 0);
    }
    kvp_te_copy_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runs_split_over_threads),
        cmocka_unit_test(test_more_ranges_than_one_call),
        cmocka_unit_test(test_small_batch_on_the_caller),
        cmocka_unit_test(test_unmapped_range_in_the_middle),
        cmocka_unit_test(test_unmapped_remote_is_efault),
        cmocka_unit_test(test_two_callers_share_a_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
