/*
 * test_staging.c - unit tests for client/transfer/staging.c in KVP_STAGE_HOST mode.
 *
 * The run callback is a fake transport over a "segment" that is a host
 * array: READ and WRITE are memcpy, and it can fail its Nth plain op with
 * KVP_ERR_IO. It also checks what the engine hands the transports: every
 * plain op lies inside one registered staging buffer, a batch never holds
 * more than one buffer's worth of bytes, and the peer is passed through.
 * Data comes from a fixed-seed generator so a failure reproduces; every
 * result is checked byte for byte, with guard bytes around destinations,
 * and every CRC against kvp_crc32c over the whole source.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "client/transfer/peer.h"
#include "client/transfer/staging.h"
#include "common/crc32c.h"

#define CHUNK 4096
#define DEPTH 3
#define SEG_SIZE (64 * CHUNK)
#define GUARD 64
#define CANARY 0xA5
#define MAX_BUFS 8

typedef struct fake_seg {
    uint8_t *mem;
    kvp_peer_t *peer;     /* the peer every op must carry */
    unsigned fail_at;     /* 1-based plain op number that fails, 0: none */
    unsigned plain_seen;  /* plain ops run so far */
    unsigned runs;        /* run-callback calls */
    size_t max_batch;     /* most plain ops in one call */
    void *bufs[MAX_BUFS]; /* registered staging buffers */
    unsigned nbufs;
    unsigned regs, deregs;
    unsigned reg_fail_at; /* 1-based reg call that fails, 0: none */
    pthread_mutex_t lock;
} fake_seg_t;

static uint64_t rng_state;

static void fill_random(uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        uint64_t x = rng_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        rng_state = x;
        p[i] = (uint8_t)(x >> 56);
    }
}

static bool in_registered_buf(fake_seg_t *f, const void *p, uint64_t len)
{
    for (unsigned i = 0; i < f->nbufs; i++) {
        const uint8_t *b = f->bufs[i];
        if ((const uint8_t *)p >= b && (const uint8_t *)p + len <= b + CHUNK)
            return true;
    }
    return false;
}

static void seg_run(void *arg, kvp_xfer_op_t *ops, size_t n)
{
    fake_seg_t *f = arg;
    pthread_mutex_lock(&f->lock);
    f->runs++;
    if (n > f->max_batch)
        f->max_batch = n;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = &ops[i];
        bytes += op->length;
        assert_ptr_equal(op->peer, f->peer);
        assert_true(in_registered_buf(f, op->local, op->length));
        assert_false(op->want_crc);
        if (++f->plain_seen == f->fail_at) {
            op->status = KVP_ERR_IO;
            continue;
        }
        if (op->offset > SEG_SIZE || op->length > SEG_SIZE - op->offset) {
            op->status = KVP_ERR_OUT_OF_RANGE;
            continue;
        }
        if (op->kind == KVP_XFER_WRITE)
            memcpy(f->mem + op->offset, op->local, op->length);
        else
            memcpy(op->local, f->mem + op->offset, op->length);
        op->status = KVP_OK;
    }
    assert_true(bytes <= CHUNK);
    pthread_mutex_unlock(&f->lock);
}

static kvp_status_t seg_reg(void *arg, void *buf, size_t len)
{
    fake_seg_t *f = arg;
    assert_int_equal(len, CHUNK);
    assert_true(((uintptr_t)buf & 4095) == 0);
    if (++f->regs == f->reg_fail_at)
        return KVP_ERR_SYSTEM;
    for (unsigned i = 0; i < f->nbufs; i++)
        assert_ptr_not_equal(f->bufs[i], buf);
    assert_true(f->nbufs < MAX_BUFS);
    f->bufs[f->nbufs++] = buf;
    return KVP_OK;
}

static void seg_dereg(void *arg, void *buf)
{
    fake_seg_t *f = arg;
    f->deregs++;
    for (unsigned i = 0; i < f->nbufs; i++) {
        if (f->bufs[i] == buf) {
            f->bufs[i] = f->bufs[--f->nbufs];
            return;
        }
    }
    fail_msg("dereg of a buffer that is not registered");
}

typedef struct ctx {
    fake_seg_t seg;
    kvp_peer_t peer;
    kvp_stager_t *stager;
} ctx_t;

static int setup(void **state)
{
    ctx_t *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    c->seg.mem = calloc(1, SEG_SIZE);
    assert_non_null(c->seg.mem);
    c->seg.peer = &c->peer;
    pthread_mutex_init(&c->seg.lock, NULL);
    rng_state = 0x9E3779B97F4A7C15ull;
    kvp_stager_params_t p = {.chunk_bytes = CHUNK,
                             .depth = DEPTH,
                             .run = seg_run,
                             .reg = seg_reg,
                             .dereg = seg_dereg,
                             .arg = &c->seg};
    assert_int_equal(kvp_stager_create(&p, &c->stager), KVP_OK);
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ctx_t *c = *state;
    kvp_stager_destroy(c->stager);
    assert_int_equal(c->seg.nbufs, 0); /* every registered buffer deregistered */
    assert_int_equal(c->seg.regs, c->seg.deregs + (c->seg.reg_fail_at ? 1 : 0));
    pthread_mutex_destroy(&c->seg.lock);
    free(c->seg.mem);
    free(c);
    return 0;
}

static kvp_xfer_op_t mkop(ctx_t *c, kvp_xfer_kind_t kind, void *local, uint64_t off, uint64_t len)
{
    return (kvp_xfer_op_t){.kind = kind,
                           .local = local,
                           .offset = off,
                           .length = len,
                           .peer = &c->peer,
                           .want_crc = true,
                           .crc = 0xDEADBEEF,
                           .status = KVP_ERR_INTERNAL};
}

static void run1(ctx_t *c, kvp_xfer_op_t *op)
{
    kvp_xfer_op_t *ops[1] = {op};
    kvp_stager_run(c->stager, KVP_STAGE_HOST, ops, 1);
}

/* Write len random bytes at off, read them back, check bytes, guards and CRCs. */
static void roundtrip(ctx_t *c, uint64_t off, size_t len)
{
    uint8_t *src = malloc(len);
    uint8_t *dst = malloc(len + 2 * GUARD);
    assert_non_null(src);
    assert_non_null(dst);
    fill_random(src, len);
    memset(dst, CANARY, len + 2 * GUARD);
    uint32_t want = kvp_crc32c(0, src, len);

    kvp_xfer_op_t w = mkop(c, KVP_XFER_WRITE, src, off, len);
    run1(c, &w);
    assert_int_equal(w.status, KVP_OK);
    assert_int_equal(w.crc, want);
    assert_memory_equal(c->seg.mem + off, src, len);

    kvp_xfer_op_t r = mkop(c, KVP_XFER_READ, dst + GUARD, off, len);
    run1(c, &r);
    assert_int_equal(r.status, KVP_OK);
    assert_int_equal(r.crc, want);
    assert_memory_equal(dst + GUARD, src, len);
    for (size_t i = 0; i < GUARD; i++) {
        assert_int_equal(dst[i], CANARY);
        assert_int_equal(dst[GUARD + len + i], CANARY);
    }
    free(src);
    free(dst);
}

static void test_sizes(void **state)
{
    ctx_t *c = *state;
    const size_t sizes[] = {1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 7};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        unsigned runs0 = c->seg.runs;
        roundtrip(c, 3 * CHUNK + 5, sizes[i]);
        /* one run per buffer's worth each way: the chunking is what it says */
        unsigned per_way = (unsigned)((sizes[i] + CHUNK - 1) / CHUNK);
        assert_int_equal(c->seg.runs - runs0, 2 * per_way);
    }
    /* buffers were allocated and registered once, for the whole stager */
    assert_int_equal(c->seg.regs, DEPTH);
    assert_int_equal(c->seg.deregs, 0);
    assert_int_equal(c->seg.nbufs, DEPTH);
}

/* Many small objects in one call go out in few batches, and come back exact. */
static void test_many_small(void **state)
{
    ctx_t *c = *state;
    enum { N = 300 };
    static kvp_xfer_op_t w[N], r[N];
    kvp_xfer_op_t *wp[N], *rp[N];
    uint8_t *src = malloc(N * 200), *dst = malloc(N * 200);
    assert_non_null(src);
    assert_non_null(dst);
    fill_random(src, N * 200);
    memset(dst, CANARY, N * 200);
    uint64_t off = 0;
    for (int i = 0; i < N; i++) {
        size_t len = 1 + (size_t)(i * 37) % 200;
        w[i] = mkop(c, KVP_XFER_WRITE, src + i * 200, off, len);
        r[i] = mkop(c, KVP_XFER_READ, dst + i * 200, off, len);
        wp[i] = &w[i];
        rp[i] = &r[i];
        off += len + (size_t)i % 3; /* gaps: the segment layout is not the buffer layout */
    }
    assert_true(off <= SEG_SIZE);
    kvp_stager_run(c->stager, KVP_STAGE_HOST, wp, N);
    unsigned write_runs = c->seg.runs;
    kvp_stager_run(c->stager, KVP_STAGE_HOST, rp, N);
    unsigned read_runs = c->seg.runs - write_runs;
    for (int i = 0; i < N; i++) {
        assert_int_equal(w[i].status, KVP_OK);
        assert_int_equal(r[i].status, KVP_OK);
        uint32_t want = kvp_crc32c(0, src + i * 200, w[i].length);
        assert_int_equal(w[i].crc, want);
        assert_int_equal(r[i].crc, want);
        assert_memory_equal(dst + i * 200, src + i * 200, r[i].length);
        assert_memory_equal(c->seg.mem + w[i].offset, src + i * 200, w[i].length);
        if (r[i].length < 200)
            assert_int_equal(dst[i * 200 + r[i].length], CANARY);
    }
    /* ~30 KiB in 4 KiB buffers: a handful of batches, not one per object */
    assert_true(write_runs <= 16);
    assert_true(read_runs <= 16);
    assert_true(c->seg.max_batch > 10);
    free(src);
    free(dst);
}

/* READs and WRITEs interleaved in one call, big and small. */
static void test_mixed(void **state)
{
    ctx_t *c = *state;
    enum { N = 12, REGION = 16 * CHUNK };
    uint8_t *newdata = malloc(REGION), *dst = malloc(REGION);
    assert_non_null(newdata);
    assert_non_null(dst);
    fill_random(c->seg.mem, REGION); /* region A: existing objects, read */
    fill_random(newdata, REGION);    /* region B: written */
    memset(dst, CANARY, REGION);
    kvp_xfer_op_t ops[N];
    kvp_xfer_op_t *pp[N];
    uint64_t off = 0;
    for (int i = 0; i < N; i++) {
        size_t len = i % 4 == 0 ? 2 * CHUNK + 100 : 100 + (size_t)i * 31;
        if (i % 2)
            ops[i] = mkop(c, KVP_XFER_WRITE, newdata + off, REGION + off, len);
        else
            ops[i] = mkop(c, KVP_XFER_READ, dst + off, off, len);
        pp[i] = &ops[i];
        off += len;
    }
    kvp_stager_run(c->stager, KVP_STAGE_HOST, pp, N);
    for (int i = 0; i < N; i++) {
        kvp_xfer_op_t *op = &ops[i];
        assert_int_equal(op->status, KVP_OK);
        if (op->kind == KVP_XFER_WRITE) {
            uint64_t o = op->offset - REGION;
            assert_memory_equal(c->seg.mem + op->offset, newdata + o, op->length);
            assert_int_equal(op->crc, kvp_crc32c(0, newdata + o, op->length));
        } else {
            assert_memory_equal(dst + op->offset, c->seg.mem + op->offset, op->length);
            assert_int_equal(op->crc, kvp_crc32c(0, c->seg.mem + op->offset, op->length));
        }
    }
    free(newdata);
    free(dst);
}

/* The 2nd plain op (A's 2nd chunk) fails: A fails with it, its 3rd chunk is not moved; B, C pass.
 */
static void test_failed_chunk_write(void **state)
{
    ctx_t *c = *state;
    uint8_t *src = malloc(7 * CHUNK);
    assert_non_null(src);
    fill_random(src, 7 * CHUNK);
    kvp_xfer_op_t a = mkop(c, KVP_XFER_WRITE, src, 0, 3 * CHUNK);
    kvp_xfer_op_t b = mkop(c, KVP_XFER_WRITE, src + 3 * CHUNK, 3 * CHUNK, 3 * CHUNK);
    kvp_xfer_op_t d = mkop(c, KVP_XFER_WRITE, src + 6 * CHUNK, 6 * CHUNK, CHUNK);
    kvp_xfer_op_t *ops[] = {&a, &b, &d};
    c->seg.fail_at = 2;
    kvp_stager_run(c->stager, KVP_STAGE_HOST, ops, 3);
    assert_int_equal(a.status, KVP_ERR_IO);
    assert_int_equal(b.status, KVP_OK);
    assert_int_equal(d.status, KVP_OK);
    assert_int_equal(c->seg.plain_seen, 6); /* A's 3rd chunk skipped */
    assert_memory_equal(c->seg.mem, src, CHUNK);
    static const uint8_t zero[CHUNK];
    assert_memory_equal(c->seg.mem + 2 * CHUNK, zero, CHUNK);
    assert_memory_equal(c->seg.mem + 3 * CHUNK, src + 3 * CHUNK, 4 * CHUNK);
    assert_int_equal(b.crc, kvp_crc32c(0, src + 3 * CHUNK, 3 * CHUNK));
    assert_int_equal(d.crc, kvp_crc32c(0, src + 6 * CHUNK, CHUNK));
    free(src);
}

/*
 * A READ whose 2nd chunk fails is not OK; the small ops packed into the same
 * batch as that chunk still pass.
 */
static void test_failed_chunk_read(void **state)
{
    ctx_t *c = *state;
    fill_random(c->seg.mem, 4 * CHUNK);
    uint8_t *dst = malloc(4 * CHUNK);
    assert_non_null(dst);
    memset(dst, CANARY, 4 * CHUNK);
    kvp_xfer_op_t a = mkop(c, KVP_XFER_READ, dst, 0, 2 * CHUNK - 300);
    kvp_xfer_op_t s1 = mkop(c, KVP_XFER_READ, dst + 2 * CHUNK, 2 * CHUNK, 100);
    kvp_xfer_op_t s2 = mkop(c, KVP_XFER_READ, dst + 3 * CHUNK, 3 * CHUNK, 50);
    kvp_xfer_op_t *ops[] = {&a, &s1, &s2};
    c->seg.fail_at = 2; /* A's 2nd chunk, in one batch with s1 and s2 */
    kvp_stager_run(c->stager, KVP_STAGE_HOST, ops, 3);
    assert_int_equal(c->seg.runs, 2);
    assert_int_equal(c->seg.max_batch, 3);
    assert_int_equal(a.status, KVP_ERR_IO);
    assert_int_equal(s1.status, KVP_OK);
    assert_int_equal(s2.status, KVP_OK);
    assert_memory_equal(dst + 2 * CHUNK, c->seg.mem + 2 * CHUNK, 100);
    assert_memory_equal(dst + 3 * CHUNK, c->seg.mem + 3 * CHUNK, 50);
    assert_int_equal(dst[3 * CHUNK + 50], CANARY);
    assert_int_equal(s1.crc, kvp_crc32c(0, c->seg.mem + 2 * CHUNK, 100));
    assert_int_equal(s2.crc, kvp_crc32c(0, c->seg.mem + 3 * CHUNK, 50));
    free(dst);
}

/* Zero-length ops succeed with the CRC of nothing; bad ops fail alone. */
static void test_edge_ops(void **state)
{
    ctx_t *c = *state;
    uint8_t byte = 0x5A;
    kvp_xfer_op_t z = mkop(c, KVP_XFER_WRITE, NULL, 0, 0);
    kvp_xfer_op_t bad = mkop(c, KVP_XFER_READ, NULL, 0, 10);
    kvp_xfer_op_t range = mkop(c, KVP_XFER_WRITE, &byte, SEG_SIZE, 1);
    kvp_xfer_op_t ok = mkop(c, KVP_XFER_WRITE, &byte, 17, 1);
    kvp_xfer_op_t *ops[] = {&z, &bad, &range, &ok};
    kvp_stager_run(c->stager, KVP_STAGE_HOST, ops, 4);
    assert_int_equal(z.status, KVP_OK);
    assert_int_equal(z.crc, 0);
    assert_int_equal(bad.status, KVP_ERR_INVALID_ARG);
    assert_int_equal(range.status, KVP_ERR_OUT_OF_RANGE);
    assert_int_equal(ok.status, KVP_OK);
    assert_int_equal(c->seg.mem[17], 0x5A);
    kvp_stager_run(c->stager, KVP_STAGE_HOST, ops, 0);
}

/* A failing reg fails the call's ops, frees what was allocated, and the next call retries. */
static void test_reg_failure(void **state)
{
    ctx_t *c = *state;
    c->seg.reg_fail_at = 2;
    uint8_t src[100];
    fill_random(src, sizeof(src));
    kvp_xfer_op_t w = mkop(c, KVP_XFER_WRITE, src, 0, sizeof(src));
    run1(c, &w);
    assert_int_equal(w.status, KVP_ERR_SYSTEM);
    assert_int_equal(c->seg.regs, 2);
    assert_int_equal(c->seg.deregs, 1); /* the first buffer, registered before the failure */
    assert_int_equal(c->seg.nbufs, 0);
    run1(c, &w);
    assert_int_equal(w.status, KVP_OK);
    assert_int_equal(c->seg.regs, 2 + DEPTH);
    assert_memory_equal(c->seg.mem, src, sizeof(src));
}

typedef struct thread_arg {
    ctx_t *c;
    uint64_t off;
    int ok;
} thread_arg_t;

static void *writer(void *arg)
{
    thread_arg_t *t = arg;
    size_t len = 3 * CHUNK + 11;
    uint8_t *src = malloc(len), *dst = malloc(len);
    if (src == NULL || dst == NULL)
        goto out;
    for (size_t i = 0; i < len; i++)
        src[i] = (uint8_t)(i * 7 + t->off);
    t->ok = 1;
    for (int round = 0; round < 20; round++) {
        kvp_xfer_op_t w = mkop(t->c, KVP_XFER_WRITE, src, t->off, len);
        kvp_xfer_op_t r = mkop(t->c, KVP_XFER_READ, dst, t->off, len);
        kvp_xfer_op_t *wp[] = {&w}, *rp[] = {&r};
        kvp_stager_run(t->c->stager, KVP_STAGE_HOST, wp, 1);
        kvp_stager_run(t->c->stager, KVP_STAGE_HOST, rp, 1);
        if (w.status != KVP_OK || r.status != KVP_OK || memcmp(src, dst, len) != 0 ||
            r.crc != kvp_crc32c(0, src, len))
            t->ok = 0;
    }
out:
    free(src);
    free(dst);
    return NULL;
}

/* Concurrent calls on one stager serialise: each thread gets its own bytes back. */
static void test_concurrent(void **state)
{
    ctx_t *c = *state;
    thread_arg_t args[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (thread_arg_t){c, (uint64_t)i * 8 * CHUNK, 0};
        assert_int_equal(pthread_create(&th[i], NULL, writer, &args[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].ok, 1);
    }
    assert_int_equal(c->seg.regs, DEPTH);
}

static void noop_run(void *arg, kvp_xfer_op_t *ops, size_t n)
{
    (void)arg;
    (void)ops;
    (void)n;
}

static void test_params(void **state)
{
    (void)state;
    kvp_stager_t *s = NULL;
    kvp_stager_params_t p = {.depth = 1, .run = noop_run};
    assert_int_equal(kvp_stager_create(&p, &s), KVP_ERR_INVALID_ARG);
    p = (kvp_stager_params_t){.run = NULL};
    assert_int_equal(kvp_stager_create(&p, &s), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_stager_create(NULL, &s), KVP_ERR_INVALID_ARG);
    /* defaults (1 MiB x 4), no reg callbacks: buffers allocated on first run only */
    p = (kvp_stager_params_t){.run = noop_run};
    assert_int_equal(kvp_stager_create(&p, &s), KVP_OK);
    kvp_stager_destroy(s);
    /* a run callback that sets no status fails the op rather than reporting it OK */
    p = (kvp_stager_params_t){.chunk_bytes = 4096, .depth = 2, .run = noop_run};
    assert_int_equal(kvp_stager_create(&p, &s), KVP_OK);
    uint8_t buf[10] = {0};
    kvp_xfer_op_t r = {.kind = KVP_XFER_READ, .local = buf, .length = sizeof(buf)};
    kvp_xfer_op_t *rp[] = {&r};
    kvp_stager_run(s, KVP_STAGE_HOST, rp, 1);
    assert_int_not_equal(r.status, KVP_OK);
    kvp_stager_destroy(s);
    kvp_stager_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_small, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_chunk_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_chunk_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_edge_ops, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reg_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent, setup, teardown),
        cmocka_unit_test(test_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
