/*
 * test_gpu_real.c - client/mem/gpu.c and the KVP_STAGE_GPU path of
 * client/transfer/staging.c on a REAL GPU (meson suite 'gpu', not run by default:
 * `meson test -C build --suite gpu` on a machine with an NVIDIA GPU).
 *
 * It loads the driver itself (dlopen libcuda.so.1, or $KVPOOL_CUDA_LIB as
 * gpu.c does) to allocate device memory (cuMemAlloc_v2) and to fill and read
 * it back (cuMemcpyHtoD_v2 / cuMemcpyDtoH_v2), then moves it through the
 * stager to a host "segment" and back, checking bytes and CRCs. The stager
 * runs on a thread with no current CUDA context, as a transfer thread would.
 * It also checks kvp_gpu_is_device_ptr on device and host memory and reports
 * whether the driver offers a dma-buf for the device memory (informational:
 * not every driver or kernel does).
 *
 * No libcuda or no device: prints why and exits 77 (meson: SKIP), so the
 * suite never passes without having run on a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/mem/gpu.h"
#include "client/transfer/staging.h"
#include "common/crc32c.h"

#define CHUNK ((size_t)256 << 10)
#define DEPTH 4
#define BIG (5 * CHUNK + 7)
#define NSMALL 500
#define SMALL_SLOT 3000
#define SEG_SIZE (16 * CHUNK)

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;

static struct {
    CUresult (*init)(unsigned int);
    CUresult (*device_get_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*primary_ctx_release)(CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
} cu;

static CUdevice dev;
static uint8_t *seg; /* the fake host "segment" */

#define CU_CHECK(call) assert_int_equal((call), 0)

static void seg_run(void *arg, kvp_xfer_op_t *ops, size_t n)
{
    (void)arg;
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = &ops[i];
        if (op->offset > SEG_SIZE || op->length > SEG_SIZE - op->offset) {
            op->status = KVP_ERR_OUT_OF_RANGE;
            continue;
        }
        if (op->kind == KVP_XFER_WRITE)
            memcpy(seg + op->offset, op->local, op->length);
        else
            memcpy(op->local, seg + op->offset, op->length);
        op->status = KVP_OK;
    }
}

static void fill_pattern(uint8_t *p, size_t len, uint32_t seed)
{
    uint32_t x = seed | 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (uint8_t)(x >> 24);
    }
}

typedef struct stage_job {
    kvp_stager_t *stager;
    kvp_xfer_op_t **ops;
    size_t n;
} stage_job_t;

static void *stage_thread(void *arg)
{
    stage_job_t *j = arg;
    kvp_stager_run(j->stager, KVP_STAGE_GPU, j->ops, j->n);
    return NULL;
}

/* Run the stager on a new thread: no CUDA context is current there. */
static void stage_on_thread(kvp_stager_t *s, kvp_xfer_op_t **ops, size_t n)
{
    stage_job_t j = {s, ops, n};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, stage_thread, &j), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
}

static void test_pointer_kinds(void **state)
{
    (void)state;
    CUdeviceptr d;
    CU_CHECK(cu.mem_alloc(&d, 1 << 20));
    void *h = malloc(4096);
    assert_non_null(h);
    assert_true(kvp_gpu_available());
    assert_true(kvp_gpu_is_device_ptr((void *)(uintptr_t)d));
    assert_true(kvp_gpu_is_device_ptr((void *)(uintptr_t)(d + 4097)));
    assert_false(kvp_gpu_is_device_ptr(h));
    void *pinned = NULL;
    assert_int_equal(kvp_gpu_host_alloc(4096, &pinned), KVP_OK);
    assert_false(kvp_gpu_is_device_ptr(pinned));
    kvp_gpu_host_free(pinned);
    free(h);
    CU_CHECK(cu.mem_free(d));
}

static void test_big_roundtrip(void **state)
{
    (void)state;
    kvp_stager_t *s;
    kvp_stager_params_t p = {.chunk_bytes = CHUNK, .depth = DEPTH, .run = seg_run};
    assert_int_equal(kvp_stager_create(&p, &s), KVP_OK);
    uint8_t *src = malloc(BIG), *back = malloc(BIG);
    assert_non_null(src);
    assert_non_null(back);
    fill_pattern(src, BIG, 7);
    uint32_t want = kvp_crc32c(0, src, BIG);
    CUdeviceptr d1, d2;
    CU_CHECK(cu.mem_alloc(&d1, BIG));
    CU_CHECK(cu.mem_alloc(&d2, BIG));
    CU_CHECK(cu.memcpy_htod(d1, src, BIG));

    kvp_xfer_op_t w = {.kind = KVP_XFER_WRITE,
                       .local = (void *)(uintptr_t)d1,
                       .offset = CHUNK + 3,
                       .length = BIG,
                       .want_crc = true};
    kvp_xfer_op_t *wp[] = {&w};
    stage_on_thread(s, wp, 1);
    assert_int_equal(w.status, KVP_OK);
    assert_int_equal(w.crc, want);
    assert_memory_equal(seg + CHUNK + 3, src, BIG);

    kvp_xfer_op_t r = {.kind = KVP_XFER_READ,
                       .local = (void *)(uintptr_t)d2,
                       .offset = CHUNK + 3,
                       .length = BIG,
                       .want_crc = true};
    kvp_xfer_op_t *rp[] = {&r};
    stage_on_thread(s, rp, 1);
    assert_int_equal(r.status, KVP_OK);
    assert_int_equal(r.crc, want);
    CU_CHECK(cu.memcpy_dtoh(back, d2, BIG));
    assert_memory_equal(back, src, BIG);

    kvp_stager_destroy(s);
    CU_CHECK(cu.mem_free(d1));
    CU_CHECK(cu.mem_free(d2));
    free(src);
    free(back);
}

static void test_many_small(void **state)
{
    (void)state;
    kvp_stager_t *s;
    kvp_stager_params_t p = {.chunk_bytes = CHUNK, .depth = DEPTH, .run = seg_run};
    assert_int_equal(kvp_stager_create(&p, &s), KVP_OK);
    const size_t total = (size_t)NSMALL * SMALL_SLOT;
    uint8_t *src = malloc(total), *back = malloc(total);
    assert_non_null(src);
    assert_non_null(back);
    fill_pattern(src, total, 11);
    CUdeviceptr d1, d2;
    CU_CHECK(cu.mem_alloc(&d1, total));
    CU_CHECK(cu.mem_alloc(&d2, total));
    CU_CHECK(cu.memcpy_htod(d1, src, total));
    memset(back, 0, total);
    CU_CHECK(cu.memcpy_htod(d2, back, total));
    static kvp_xfer_op_t w[NSMALL], r[NSMALL];
    kvp_xfer_op_t *wp[NSMALL], *rp[NSMALL];
    for (size_t i = 0; i < NSMALL; i++) {
        size_t len = 1 + (i * 997) % (SMALL_SLOT - 1);
        w[i] = (kvp_xfer_op_t){.kind = KVP_XFER_WRITE,
                               .local = (void *)(uintptr_t)(d1 + i * SMALL_SLOT),
                               .offset = i * SMALL_SLOT,
                               .length = len,
                               .want_crc = true};
        r[i] = w[i];
        r[i].kind = KVP_XFER_READ;
        r[i].local = (void *)(uintptr_t)(d2 + i * SMALL_SLOT);
        wp[i] = &w[i];
        rp[i] = &r[i];
    }
    stage_on_thread(s, wp, NSMALL);
    stage_on_thread(s, rp, NSMALL);
    CU_CHECK(cu.memcpy_dtoh(back, d2, total));
    for (size_t i = 0; i < NSMALL; i++) {
        const uint8_t *obj = src + i * SMALL_SLOT;
        uint32_t want = kvp_crc32c(0, obj, w[i].length);
        assert_int_equal(w[i].status, KVP_OK);
        assert_int_equal(r[i].status, KVP_OK);
        assert_int_equal(w[i].crc, want);
        assert_int_equal(r[i].crc, want);
        assert_memory_equal(back + i * SMALL_SLOT, obj, w[i].length);
    }
    kvp_stager_destroy(s);
    CU_CHECK(cu.mem_free(d1));
    CU_CHECK(cu.mem_free(d2));
    free(src);
    free(back);
}

static void test_dmabuf_report(void **state)
{
    (void)state;
    CUdeviceptr d;
    CU_CHECK(cu.mem_alloc(&d, 4 << 20));
    int fd = -1;
    uint64_t off = 0;
    kvp_status_t st = kvp_gpu_dmabuf_fd((void *)(uintptr_t)(d + 100), 1 << 20, &fd, &off);
    if (st == KVP_OK) {
        printf("dma-buf: offered (fd %d, offset %llu)\n", fd, (unsigned long long)off);
        assert_true(fd >= 0);
        assert_int_equal(off, 100);
        close(fd);
    } else {
        printf("dma-buf: not offered by this driver/kernel (%s)\n", kvp_strerror(st));
    }
    CU_CHECK(cu.mem_free(d));
}

static int no_gpu(const char *why)
{
    printf("SKIP: %s\n", why);
    return 77;
}

int main(void)
{
    const char *path = getenv("KVPOOL_CUDA_LIB");
    if (path == NULL || path[0] == '\0')
        path = "libcuda.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        char why[512];
        snprintf(why, sizeof(why), "cannot load %s (%s): no NVIDIA driver on this machine", path,
                 dlerror());
        return no_gpu(why);
    }
    struct {
        const char *name;
        void *slot;
    } syms[] = {
        {"cuInit", &cu.init},
        {"cuDeviceGetCount", &cu.device_get_count},
        {"cuDeviceGet", &cu.device_get},
        {"cuDevicePrimaryCtxRetain", &cu.primary_ctx_retain},
        {"cuDevicePrimaryCtxRelease_v2", &cu.primary_ctx_release},
        {"cuCtxSetCurrent", &cu.ctx_set_current},
        {"cuMemAlloc_v2", &cu.mem_alloc},
        {"cuMemFree_v2", &cu.mem_free},
        {"cuMemcpyHtoD_v2", &cu.memcpy_htod},
        {"cuMemcpyDtoH_v2", &cu.memcpy_dtoh},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *sym = dlsym(lib, syms[i].name);
        if (sym == NULL) {
            fprintf(stderr, "%s has no %s\n", path, syms[i].name);
            return 1;
        }
        memcpy(syms[i].slot, &sym, sizeof(sym));
    }
    int count = 0;
    CUresult rc = cu.init(0);
    if (rc != 0 || cu.device_get_count(&count) != 0 || count == 0) {
        char why[256];
        snprintf(why, sizeof(why), "no CUDA device (cuInit: %d, devices: %d)", rc, count);
        return no_gpu(why);
    }
    CUcontext ctx;
    if (cu.device_get(&dev, 0) != 0 || cu.primary_ctx_retain(&ctx, dev) != 0 ||
        cu.ctx_set_current(ctx) != 0) {
        fprintf(stderr, "cannot make GPU 0's primary context current\n");
        return 1;
    }
    seg = calloc(1, SEG_SIZE);
    if (seg == NULL)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pointer_kinds),
        cmocka_unit_test(test_big_roundtrip),
        cmocka_unit_test(test_many_small),
        cmocka_unit_test(test_dmabuf_report),
    };
    int failed = cmocka_run_group_tests_name("gpu_real", tests, NULL, NULL);
    free(seg);
    cu.ctx_set_current(NULL);
    cu.primary_ctx_release(dev);
    return failed;
}
