/*
 * test_scratch.c - unit tests for client/mem/scratch.c, the per-thread arena
 * the object flows take their per-batch state from.
 *
 * Checked: alignment and separation of what is handed out (patterns written
 * to every byte survive), mark / release hands back exactly what came after
 * the mark, a call that outgrows the main block is served from overflow
 * blocks and the next release to empty grows the main block to fit that
 * call, calloc zeroes and refuses an overflowing count, the protobuf-c
 * allocator over the arena unpacks a real message, the per-thread buffers
 * grow and keep their bytes, and a thread's arena is freed when it exits
 * (the ASan build's leak check).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "client/mem/scratch.h"
#include "kvpool.pb-c.h"

static void test_alignment_and_separation(void **state)
{
    (void)state;
    size_t mark = kvp_scratch_mark();
    enum { N = 40 };
    unsigned char *p[N];
    size_t len[N];
    for (int i = 0; i < N; i++) {
        len[i] = 1 + (size_t)i * 37;
        p[i] = kvp_scratch_alloc(len[i]);
        assert_non_null(p[i]);
        assert_int_equal((uintptr_t)p[i] % 16, 0);
        memset(p[i], i + 1, len[i]);
    }
    for (int i = 0; i < N; i++)
        for (size_t k = 0; k < len[i]; k++)
            assert_int_equal(p[i][k], i + 1);
    kvp_scratch_release(mark);
}

static void test_mark_release(void **state)
{
    (void)state;
    size_t m0 = kvp_scratch_mark();
    void *a = kvp_scratch_alloc(100);
    size_t m1 = kvp_scratch_mark();
    void *b = kvp_scratch_alloc(200);
    assert_ptr_not_equal(a, b);
    kvp_scratch_release(m1);
    assert_int_equal(kvp_scratch_mark(), m1);
    void *b2 = kvp_scratch_alloc(200);
    assert_ptr_equal(b, b2); /* what came after the mark was handed back */
    kvp_scratch_release(m0);
    assert_int_equal(kvp_scratch_mark(), m0);
    void *a2 = kvp_scratch_alloc(100);
    assert_ptr_equal(a, a2);
    kvp_scratch_release(m0);
}

static void test_overflow_then_grow(void **state)
{
    (void)state;
    kvp_scratch_release(0);
    (void)kvp_scratch_alloc(16); /* make sure the main block exists */
    kvp_scratch_release(0);
    size_t cap0 = kvp_scratch_capacity();
    assert_true(cap0 > 0);
    /* one call that needs far more than the main block: served anyway */
    enum { N = 8 };
    size_t chunk = cap0;
    unsigned char *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = kvp_scratch_alloc(chunk);
        assert_non_null(p[i]);
        memset(p[i], 0xa0 + i, chunk);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(p[i][chunk - 1], 0xa0 + i);
    kvp_scratch_release(0);
    /* the main block now holds what that call needed */
    size_t cap1 = kvp_scratch_capacity();
    assert_true(cap1 >= (size_t)N * chunk);
    /* so the same call again fits in it, contiguous, with no overflow block */
    unsigned char *first = kvp_scratch_alloc(chunk);
    for (int i = 1; i < N; i++) {
        unsigned char *q = kvp_scratch_alloc(chunk);
        assert_true(q >= first && q + chunk <= first + cap1);
    }
    kvp_scratch_release(0);
    assert_int_equal(kvp_scratch_capacity(), cap1); /* no regrowth when nothing overflowed */
}

static void test_scratch_calloc(void **state)
{
    (void)state;
    size_t mark = kvp_scratch_mark();
    unsigned char *d = kvp_scratch_alloc(4096);
    memset(d, 0xff, 4096);
    kvp_scratch_release(mark);
    unsigned char *z = kvp_scratch_calloc(64, 64); /* the same bytes, dirty before */
    assert_ptr_equal(z, d);
    for (int i = 0; i < 4096; i++)
        assert_int_equal(z[i], 0);
    assert_null(kvp_scratch_calloc(SIZE_MAX / 2, 4)); /* n * size overflows */
    kvp_scratch_release(mark);
}

static void test_protobuf_allocator(void **state)
{
    (void)state;
    Kvpool__PutStartResult r0 = KVPOOL__PUT_START_RESULT__INIT, r1 = KVPOOL__PUT_START_RESULT__INIT;
    r0.status = 0;
    r1.status = -5;
    Kvpool__PutStartResult *rs[2] = {&r0, &r1};
    Kvpool__PutStartResponse resp = KVPOOL__PUT_START_RESPONSE__INIT;
    resp.results = rs;
    resp.n_results = 2;
    resp.message = "held by reads";
    uint8_t buf[256];
    size_t len = kvpool__put_start_response__pack(&resp, buf);
    size_t mark = kvp_scratch_mark();
    Kvpool__PutStartResponse *u = kvpool__put_start_response__unpack(&kvp_scratch_pb, len, buf);
    assert_non_null(u);
    assert_true(kvp_scratch_mark() > mark); /* it came from the arena */
    assert_int_equal(u->n_results, 2);
    assert_int_equal(u->results[1]->status, -5);
    assert_string_equal(u->message, "held by reads");
    kvpool__put_start_response__free_unpacked(u, &kvp_scratch_pb); /* a no-op free */
    kvp_scratch_release(mark);
}

static void test_thread_bufs(void **state)
{
    (void)state;
    kvp_thread_buf_t *rx = kvp_thread_buf(KVP_TBUF_RX);
    kvp_thread_buf_t *pk = kvp_thread_buf(KVP_TBUF_PACK);
    assert_non_null(rx);
    assert_non_null(pk);
    assert_ptr_not_equal(rx, pk);
    unsigned char *b = kvp_thread_buf_reserve(rx, 100);
    memcpy(b, "kept", 5);
    b = kvp_thread_buf_reserve(rx, 1 << 20); /* grows, keeps its bytes */
    assert_non_null(b);
    assert_true(rx->cap >= (1u << 20));
    assert_string_equal((char *)b, "kept");
    assert_ptr_equal(kvp_thread_buf_reserve(rx, 10), b); /* never shrinks */
}

static void *thread_main(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100; i++)
        memset(kvp_scratch_alloc(100000), 1, 100000); /* overflow blocks too */
    kvp_thread_buf_reserve(kvp_thread_buf(KVP_TBUF_RX), 1 << 16);
    return NULL; /* no release: the thread's exit frees it all */
}

static void test_thread_exit_frees(void **state)
{
    (void)state;
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, thread_main, NULL), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alignment_and_separation), cmocka_unit_test(test_mark_release),
        cmocka_unit_test(test_overflow_then_grow),       cmocka_unit_test(test_scratch_calloc),
        cmocka_unit_test(test_protobuf_allocator),       cmocka_unit_test(test_thread_bufs),
        cmocka_unit_test(test_thread_exit_frees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
