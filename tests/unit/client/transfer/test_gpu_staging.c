/*
 * test_gpu_staging.c - unit tests for client/mem/gpu.c and the KVP_STAGE_GPU
 * path of client/transfer/staging.c, against tests/gpu/fake_cuda.c.
 *
 * There is no GPU here: KVPOOL_CUDA_LIB points gpu.c at the fake driver (a
 * test double; see its header), whose "device memory" faults on any CPU
 * access and whose async copies run on a worker thread per stream after a
 * delay. So these tests show that gpu.c loads and drives a libcuda-shaped
 * library correctly (symbols, contexts, errors) and that the staging
 * pipeline issues, orders and waits for its copies as designed: the copy of
 * chunk i+1 is issued before chunk i goes to the transport, and a copy-out
 * is not waited for before the next chunk's transfer. They prove nothing
 * about real GPUs; tests/gpu/test_gpu_real.c does that on a GPU machine.
 *
 * One binary, two meson tests: `fake` (KVPOOL_CUDA_LIB = the fake) and
 * `missing` (KVPOOL_CUDA_LIB = a path that does not exist: no CUDA, nothing
 * may crash, GPU staging fails cleanly and host staging still works). The
 * driver is loaded once per process, hence two processes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/mem/gpu.h"
#include "client/transfer/staging.h"
#include "common/crc32c.h"
#include "common/log.h"

#define CHUNK 4096
#define DEPTH 4
#define SEG_SIZE (64 * CHUNK)
#define MAX_RUNS 64
#define COPY_DELAY_US 1000

/* the fake driver's test helpers, looked up in the same library gpu.c loaded */
static struct {
    long (*counter)(const char *name);
    void (*set_delay_us)(unsigned us);
    void (*fail_copy)(long n, int err);
    void (*fail_next_sync)(int err);
    void (*set_dmabuf)(int supported);
    void (*last_dmabuf)(unsigned long long *ptr_p, size_t *size_p);
    void *(*alloc)(size_t size);
    int (*free)(void *p);
    void *(*shadow)(const void *dptr);
    int (*ctx_get_current)(void **ctx);
} fake;

typedef struct fake_seg {
    uint8_t *mem;
    unsigned runs;
    unsigned plain;
    size_t max_batch;
    /* fake counters at the entry of each run-callback call */
    long dtoh_at[MAX_RUNS], dtoh_done_at[MAX_RUNS], htod_at[MAX_RUNS], syncs_at[MAX_RUNS];
} fake_seg_t;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

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

static void seg_run(void *arg, kvp_xfer_op_t *ops, size_t n)
{
    fake_seg_t *f = arg;
    if (f->runs < MAX_RUNS && fake.counter != NULL) {
        f->dtoh_at[f->runs] = fake.counter("dtoh");
        f->dtoh_done_at[f->runs] = fake.counter("dtoh_done");
        f->htod_at[f->runs] = fake.counter("htod");
        f->syncs_at[f->runs] = fake.counter("syncs");
    }
    f->runs++;
    if (n > f->max_batch)
        f->max_batch = n;
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = &ops[i];
        f->plain++;
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
}

typedef struct ctx {
    fake_seg_t seg;
    kvp_stager_t *stager;
    long streams_live0, host_live0;
} ctx_t;

static int setup(void **state)
{
    ctx_t *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    c->seg.mem = calloc(1, SEG_SIZE);
    assert_non_null(c->seg.mem);
    kvp_stager_params_t p = {.chunk_bytes = CHUNK, .depth = DEPTH, .run = seg_run, .arg = &c->seg};
    assert_int_equal(kvp_stager_create(&p, &c->stager), KVP_OK);
    if (fake.counter != NULL) {
        c->streams_live0 = fake.counter("streams_live");
        c->host_live0 = fake.counter("host_live");
        fake.set_delay_us(COPY_DELAY_US);
    }
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ctx_t *c = *state;
    kvp_stager_destroy(c->stager);
    if (fake.counter != NULL) {
        /* the stager gave back every stream and pinned buffer it made */
        assert_int_equal(fake.counter("streams_live"), c->streams_live0);
        assert_int_equal(fake.counter("host_live"), c->host_live0);
        fake.set_delay_us(0);
        fake.fail_copy(0, 0);
    }
    free(c->seg.mem);
    free(c);
    return 0;
}

static void assert_no_current_ctx(void)
{
    void *cur = (void *)1;
    assert_int_equal(fake.ctx_get_current(&cur), 0);
    assert_null(cur); /* gpu.c restored this thread's (empty) context */
}

static kvp_xfer_op_t mkop(kvp_xfer_kind_t kind, void *local, uint64_t off, uint64_t len)
{
    return (kvp_xfer_op_t){.kind = kind,
                           .local = local,
                           .offset = off,
                           .length = len,
                           .want_crc = true,
                           .status = KVP_ERR_INTERNAL};
}

/* ---------------- KVPOOL_CUDA_LIB = the fake driver ---------------- */

static void test_available(void **state)
{
    (void)state;
    assert_true(kvp_gpu_available());
    assert_true(kvp_gpu_available());
    assert_int_equal(fake.counter("init"), 1); /* loaded and initialised once */
}

static void test_device_ptr(void **state)
{
    (void)state;
    uint8_t *d = fake.alloc(1 << 20);
    assert_non_null(d);
    uint8_t *h = malloc(100);
    assert_non_null(h);
    int on_stack = 0;
    void *pinned = NULL;
    assert_int_equal(kvp_gpu_host_alloc(8192, &pinned), KVP_OK);
    assert_non_null(pinned);

    assert_true(kvp_gpu_is_device_ptr(d));
    assert_true(kvp_gpu_is_device_ptr(d + 12345));
    assert_false(kvp_gpu_is_device_ptr(h));
    assert_false(kvp_gpu_is_device_ptr(&on_stack));
    assert_false(kvp_gpu_is_device_ptr(pinned)); /* pinned host memory is host memory */
    assert_false(kvp_gpu_is_device_ptr(NULL));
    int ordinal = -1;
    assert_int_equal(kvp_gpu_device_ordinal(d + 1, &ordinal), KVP_OK);
    assert_int_equal(ordinal, 0);
    assert_int_equal(kvp_gpu_device_ordinal(h, &ordinal), KVP_ERR_INVALID_ARG);

    kvp_gpu_host_free(pinned);
    assert_no_current_ctx();
    free(h);
    assert_int_equal(fake.free(d), 0);
}

static void test_dmabuf(void **state)
{
    (void)state;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *d = fake.alloc(1 << 20);
    assert_non_null(d);
    int fd = -1;
    uint64_t off = 0;
    assert_int_equal(kvp_gpu_dmabuf_fd(d + page + 100, 5000, &fd, &off), KVP_OK);
    assert_true(fd >= 0);
    assert_int_equal(off, 100);
    unsigned long long ptr;
    size_t size;
    fake.last_dmabuf(&ptr, &size);
    assert_int_equal(ptr, (uintptr_t)(d + page)); /* widened to page boundaries */
    assert_int_equal(size, (5100 + page - 1) / page * page);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    close(fd);
    assert_no_current_ctx();

    uint8_t h[64];
    assert_int_not_equal(kvp_gpu_dmabuf_fd(h, sizeof(h), &fd, &off), KVP_OK);
    fake.set_dmabuf(0);
    fd = -1;
    assert_int_equal(kvp_gpu_dmabuf_fd(d, 4096, &fd, &off), KVP_ERR_TRANSPORT);
    assert_int_equal(fd, -1);
    fake.set_dmabuf(1);
    assert_int_equal(fake.free(d), 0);
}

static void test_stream(void **state)
{
    (void)state;
    enum { LEN = 10000 };
    uint8_t *d = fake.alloc(LEN);
    assert_non_null(d);
    uint8_t *h = NULL, *back = NULL;
    assert_int_equal(kvp_gpu_host_alloc(LEN, (void **)&h), KVP_OK);
    assert_int_equal(kvp_gpu_host_alloc(LEN, (void **)&back), KVP_OK);
    fill_random(h, LEN);
    kvp_gpu_stream_t *s = NULL;
    assert_int_equal(kvp_gpu_stream_create(d, &s), KVP_OK);
    fake.set_delay_us(20000);
    long done0 = fake.counter("htod_done");
    assert_int_equal(kvp_gpu_copy_async(s, d, h, LEN, true), KVP_OK);
    assert_int_equal(fake.counter("htod_done"), done0); /* really asynchronous */
    assert_int_equal(kvp_gpu_stream_sync(s), KVP_OK);
    assert_int_equal(fake.counter("htod_done"), done0 + 1);
    assert_memory_equal(fake.shadow(d), h, LEN);
    fake.set_delay_us(0);
    assert_int_equal(kvp_gpu_copy_async(s, back, d, LEN, false), KVP_OK);
    assert_int_equal(kvp_gpu_stream_sync(s), KVP_OK);
    assert_memory_equal(back, h, LEN);
    /* a copy the driver refuses is an error with the status, not a crash */
    assert_int_equal(kvp_gpu_copy_async(s, d, h, 2u << 20, true), KVP_ERR_IO);
    kvp_gpu_stream_destroy(s);
    assert_no_current_ctx();
    assert_int_not_equal(kvp_gpu_stream_create(h, &s), KVP_OK); /* not device memory */
    kvp_gpu_host_free(h);
    kvp_gpu_host_free(back);
    assert_int_equal(fake.free(d), 0);
}

/*
 * WRITE of 5 chunks + 7 bytes from device memory: bytes and CRC exact; the
 * copy-in of chunk k+1 was issued, and that of chunk k completed, before
 * chunk k went to the transport.
 */
static void test_write_pipeline(void **state)
{
    ctx_t *c = *state;
    const size_t len = 5 * CHUNK + 7;
    const unsigned nchunks = 6;
    uint8_t *d = fake.alloc(len);
    assert_non_null(d);
    fill_random(fake.shadow(d), len);
    long dtoh0 = fake.counter("dtoh"), done0 = fake.counter("dtoh_done");
    long pageable0 = fake.counter("pageable");

    kvp_xfer_op_t w = mkop(KVP_XFER_WRITE, d, 2 * CHUNK + 3, len);
    kvp_xfer_op_t *wp[] = {&w};
    kvp_stager_run(c->stager, KVP_STAGE_GPU, wp, 1);
    assert_int_equal(w.status, KVP_OK);
    assert_memory_equal(c->seg.mem + 2 * CHUNK + 3, fake.shadow(d), len);
    assert_int_equal(w.crc, kvp_crc32c(0, fake.shadow(d), len));
    assert_int_equal(c->seg.runs, nchunks);
    for (unsigned k = 0; k < nchunks; k++) {
        long issued = c->seg.dtoh_at[k] - dtoh0;
        long done = c->seg.dtoh_done_at[k] - done0;
        assert_int_equal(issued, k + 2 < nchunks ? k + 2 : nchunks);
        assert_true(done >= (long)k + 1);
    }
    assert_int_equal(fake.counter("pageable"), pageable0); /* staging buffers are pinned */
    assert_no_current_ctx();
    assert_int_equal(fake.free(d), 0);
}

/*
 * READ of 5 chunks + 7 bytes into device memory: bytes and CRC exact; the
 * copy-out of every earlier chunk was issued before chunk k's transfer, and
 * not waited for (no synchronize at all) before the transfers of the next
 * depth-1 chunks; all were waited for when the call returned.
 */
static void test_read_pipeline(void **state)
{
    ctx_t *c = *state;
    const size_t len = 5 * CHUNK + 7;
    const unsigned nchunks = 6;
    fill_random(c->seg.mem, 8 * CHUNK);
    uint8_t *d = fake.alloc(len + 64);
    assert_non_null(d);
    memset(fake.shadow(d), 0xA5, len + 64);
    long htod0 = fake.counter("htod"), syncs0 = fake.counter("syncs");

    kvp_xfer_op_t r = mkop(KVP_XFER_READ, d, CHUNK + 1, len);
    kvp_xfer_op_t *rp[] = {&r};
    kvp_stager_run(c->stager, KVP_STAGE_GPU, rp, 1);
    assert_int_equal(r.status, KVP_OK);
    assert_int_equal(fake.counter("htod_done"), fake.counter("htod")); /* all waited for */
    assert_memory_equal(fake.shadow(d), c->seg.mem + CHUNK + 1, len);
    assert_int_equal(((uint8_t *)fake.shadow(d))[len], 0xA5);
    assert_int_equal(r.crc, kvp_crc32c(0, c->seg.mem + CHUNK + 1, len));
    assert_int_equal(c->seg.runs, nchunks);
    for (unsigned k = 0; k < nchunks; k++)
        assert_int_equal(c->seg.htod_at[k] - htod0, k);
    for (unsigned k = 1; k < DEPTH - 1; k++)
        assert_int_equal(c->seg.syncs_at[k] - syncs0, 0);
    assert_no_current_ctx();
    assert_int_equal(fake.free(d), 0);
}

/* Many small objects, device and host buffers, READ and WRITE, in one call. */
static void test_many_small_mixed(void **state)
{
    ctx_t *c = *state;
    enum { N = 200, SLOT = 160 };
    fake.set_delay_us(50);
    uint8_t *d = fake.alloc(N * SLOT);
    uint8_t *h = malloc(N * SLOT);
    uint8_t *want = malloc(N * SLOT);
    assert_non_null(d);
    assert_non_null(h);
    assert_non_null(want);
    uint8_t *dsh = fake.shadow(d);
    fill_random(c->seg.mem, SEG_SIZE);
    fill_random(want, N * SLOT);
    memcpy(dsh, want, N * SLOT);
    memcpy(h, want, N * SLOT);
    static kvp_xfer_op_t ops[N];
    kvp_xfer_op_t *pp[N];
    for (int i = 0; i < N; i++) {
        size_t len = 1 + (size_t)(i * 53) % (SLOT - 1);
        uint8_t *local = (i % 3 == 0 ? h : d) + (size_t)i * SLOT;
        kvp_xfer_kind_t kind = i % 2 ? KVP_XFER_WRITE : KVP_XFER_READ;
        ops[i] = mkop(kind, local, (uint64_t)i * SLOT, len);
        pp[i] = &ops[i];
    }
    uint8_t *seg_before = malloc(SEG_SIZE);
    assert_non_null(seg_before);
    memcpy(seg_before, c->seg.mem, SEG_SIZE);
    kvp_stager_run(c->stager, KVP_STAGE_GPU, pp, N);
    assert_true(c->seg.runs < N / 4);
    assert_true(c->seg.max_batch > 4);
    for (int i = 0; i < N; i++) {
        kvp_xfer_op_t *op = &ops[i];
        const uint8_t *local = (i % 3 == 0 ? h : dsh) + (size_t)i * SLOT;
        assert_int_equal(op->status, KVP_OK);
        if (op->kind == KVP_XFER_WRITE) {
            assert_memory_equal(c->seg.mem + op->offset, want + (size_t)i * SLOT, op->length);
            assert_int_equal(op->crc, kvp_crc32c(0, want + (size_t)i * SLOT, op->length));
        } else {
            assert_memory_equal(local, seg_before + op->offset, op->length);
            assert_int_equal(op->crc, kvp_crc32c(0, seg_before + op->offset, op->length));
            /* the bytes after the object are untouched */
            assert_memory_equal(local + op->length, want + (size_t)i * SLOT + op->length,
                                SLOT - op->length);
        }
    }
    free(seg_before);
    free(want);
    free(h);
    assert_int_equal(fake.free(d), 0);
}

/* A CUDA copy that fails fails its op only; a failed wait fails a READ. */
static void test_copy_failures(void **state)
{
    ctx_t *c = *state;
    uint8_t *d = fake.alloc(5 * CHUNK);
    assert_non_null(d);
    fill_random(fake.shadow(d), 5 * CHUNK);
    kvp_xfer_op_t a = mkop(KVP_XFER_WRITE, d, 0, 3 * CHUNK);
    kvp_xfer_op_t b = mkop(KVP_XFER_WRITE, d + 3 * CHUNK, 3 * CHUNK, 2 * CHUNK);
    kvp_xfer_op_t *ops[] = {&a, &b};
    fake.fail_copy(2, 700 /* CUDA_ERROR_ILLEGAL_ADDRESS */); /* A's 2nd chunk copy-in */
    kvp_stager_run(c->stager, KVP_STAGE_GPU, ops, 2);
    assert_int_equal(a.status, KVP_ERR_IO);
    assert_int_equal(b.status, KVP_OK);
    /* A failed before any of its chunks went out (its 1st was still staged): nothing of it */
    assert_int_equal(c->seg.plain, 2);
    static const uint8_t zero[3 * CHUNK];
    assert_memory_equal(c->seg.mem, zero, 3 * CHUNK);
    assert_memory_equal(c->seg.mem + 3 * CHUNK, (uint8_t *)fake.shadow(d) + 3 * CHUNK, 2 * CHUNK);
    assert_int_equal(b.crc, kvp_crc32c(0, (uint8_t *)fake.shadow(d) + 3 * CHUNK, 2 * CHUNK));

    /* the driver reports a fault when the copy-out is waited for: the READ is not OK */
    kvp_xfer_op_t r = mkop(KVP_XFER_READ, d, 0, 100);
    kvp_xfer_op_t *rp[] = {&r};
    fake.fail_next_sync(700);
    kvp_stager_run(c->stager, KVP_STAGE_GPU, rp, 1);
    assert_int_equal(r.status, KVP_ERR_IO);
    kvp_stager_run(c->stager, KVP_STAGE_GPU, rp, 1); /* and the stager goes on working */
    assert_int_equal(r.status, KVP_OK);
    assert_int_equal(fake.free(d), 0);
}

/* ---------------- KVPOOL_CUDA_LIB = a file that does not exist ---------------- */

static void test_missing(void **state)
{
    (void)state;
    assert_false(kvp_gpu_available());
    uint8_t *h = malloc(4096);
    assert_non_null(h);
    assert_false(kvp_gpu_is_device_ptr(h));
    assert_false(kvp_gpu_is_device_ptr(NULL));
    int ordinal;
    assert_int_equal(kvp_gpu_device_ordinal(h, &ordinal), KVP_ERR_TRANSPORT);
    int fd = -1;
    uint64_t off;
    assert_int_equal(kvp_gpu_dmabuf_fd(h, 4096, &fd, &off), KVP_ERR_TRANSPORT);
    void *p = NULL;
    assert_int_equal(kvp_gpu_host_alloc(4096, &p), KVP_ERR_TRANSPORT);
    assert_null(p);
    kvp_gpu_host_free(h); /* no CUDA: ignored, not passed anywhere */
    kvp_gpu_stream_t *s = NULL;
    assert_int_equal(kvp_gpu_stream_create(h, &s), KVP_ERR_TRANSPORT);
    assert_null(s);
    free(h);
}

static void test_missing_staging(void **state)
{
    ctx_t *c = *state;
    uint8_t src[300], dst[300];
    fill_random(src, sizeof(src));
    kvp_xfer_op_t w = mkop(KVP_XFER_WRITE, src, 0, sizeof(src));
    kvp_xfer_op_t *wp[] = {&w};
    kvp_stager_run(c->stager, KVP_STAGE_GPU, wp, 1);
    assert_int_equal(w.status, KVP_ERR_TRANSPORT);
    assert_int_equal(c->seg.runs, 0);
    kvp_stager_run(c->stager, KVP_STAGE_HOST, wp, 1);
    assert_int_equal(w.status, KVP_OK);
    kvp_xfer_op_t r = mkop(KVP_XFER_READ, dst, 0, sizeof(dst));
    kvp_xfer_op_t *rp[] = {&r};
    kvp_stager_run(c->stager, KVP_STAGE_HOST, rp, 1);
    assert_int_equal(r.status, KVP_OK);
    assert_memory_equal(dst, src, sizeof(src));
    assert_int_equal(r.crc, kvp_crc32c(0, src, sizeof(src)));
}

static int load_fake(void)
{
    const char *path = getenv("KVPOOL_CUDA_LIB");
    if (path == NULL || !kvp_gpu_available()) {
        fprintf(stderr, "the fake CUDA driver did not load (KVPOOL_CUDA_LIB=%s)\n",
                path ? path : "(unset)");
        return -1;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD); /* the instance gpu.c loaded */
    if (lib == NULL) {
        fprintf(stderr, "%s is not loaded: %s\n", path, dlerror());
        return -1;
    }
    struct {
        const char *name;
        void *slot;
    } syms[] = {
        {"fake_cuda_counter", &fake.counter},
        {"fake_cuda_set_delay_us", &fake.set_delay_us},
        {"fake_cuda_fail_copy", &fake.fail_copy},
        {"fake_cuda_fail_next_sync", &fake.fail_next_sync},
        {"fake_cuda_set_dmabuf", &fake.set_dmabuf},
        {"fake_cuda_last_dmabuf", &fake.last_dmabuf},
        {"fake_cuda_alloc", &fake.alloc},
        {"fake_cuda_free", &fake.free},
        {"fake_cuda_shadow", &fake.shadow},
        {"cuCtxGetCurrent", &fake.ctx_get_current},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *sym = dlsym(lib, syms[i].name);
        if (sym == NULL) {
            fprintf(stderr, "%s has no %s: not the fake driver\n", path, syms[i].name);
            dlclose(lib);
            return -1;
        }
        memcpy(syms[i].slot, &sym, sizeof(sym));
    }
    dlclose(lib); /* drops our reference only; gpu.c keeps the library loaded */
    return 0;
}

int main(int argc, char **argv)
{
    kvp_log_init_from_env(); /* KVPOOL_LOG_LEVEL=debug shows what gpu.c logs */
    if (argc == 2 && strcmp(argv[1], "missing") == 0) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_missing),
            cmocka_unit_test_setup_teardown(test_missing_staging, setup, teardown),
        };
        return cmocka_run_group_tests_name("gpu_missing", tests, NULL, NULL);
    }
    if (argc != 2 || strcmp(argv[1], "fake") != 0) {
        fprintf(stderr, "usage: %s fake|missing (with KVPOOL_CUDA_LIB set)\n", argv[0]);
        return 2;
    }
    if (load_fake() != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_available),
        cmocka_unit_test(test_device_ptr),
        cmocka_unit_test(test_dmabuf),
        cmocka_unit_test(test_stream),
        cmocka_unit_test_setup_teardown(test_write_pipeline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_pipeline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_small_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_failures, setup, teardown),
    };
    return cmocka_run_group_tests_name("gpu_fake", tests, NULL, NULL);
}
