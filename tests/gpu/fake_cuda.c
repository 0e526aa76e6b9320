/*
 * fake_cuda.c - a TEST DOUBLE of the CUDA driver library (libcuda.so.1),
 * built only for the tests as libfake_cuda.so and loaded by client/mem/gpu.c
 * through KVPOOL_CUDA_LIB. It exists because the machines that run the unit
 * tests have no GPU: it lets the tests exercise gpu.c's loading, context
 * handling and error paths and the staging pipeline's ordering and
 * synchronisation. It proves nothing about real GPUs, real drivers or real
 * DMA; tests/gpu/test_gpu_real.c is the test for that, on a GPU machine.
 *
 * What it models, as far as the code under test can tell:
 * - "Device memory" (fake_cuda_alloc, cuMemAlloc_v2) is a memfd mapped twice:
 *   a PROT_NONE mapping whose addresses are the device pointers, so any CPU
 *   access to device memory crashes the test as it would on a real GPU, and
 *   a hidden read-write "shadow" mapping that the fake's copies and the test
 *   (fake_cuda_shadow) use. cuPointerGetAttribute says DEVICE inside such an
 *   allocation, HOST for cuMemHostAlloc memory, and fails with
 *   CUDA_ERROR_INVALID_VALUE for anything else (plain malloc memory).
 * - One device (ordinal 0) and one context. The current context is per
 *   thread and starts NULL; copies, allocations and stream creation without
 *   a current context fail with CUDA_ERROR_INVALID_CONTEXT, as on a driver.
 * - Each stream has a worker thread that performs the async copies in issue
 *   order, each after an optional delay (fake_cuda_set_delay_us), so a copy
 *   really is still in flight after cuMemcpy*Async returns and
 *   cuStreamSynchronize really has to wait. The default streams (handles 0, 1,
 *   2) take no copies here; synchronizing them is counted (default_syncs).
 * - Every entry point is counted (fake_cuda_counter("htod"), ...), a copy or
 *   a synchronize can be made to fail, and dma-buf export can be switched off.
 *
 * Thread: all entry points are thread-safe (one mutex for the tables, one per
 * stream for its queue).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_NOT_SUPPORTED 801

#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1

#define MAX_DEV_ALLOCS 64
#define MAX_HOST_ALLOCS 256
#define QUEUE_CAP 1024
#define DEV_GRANULE ((size_t)64 << 10)

struct CUctx_st {
    int unused;
};

typedef struct copy_task {
    void *dst;
    const void *src;
    size_t len;
    bool htod;
} copy_task_t;

struct CUstream_st {
    uint32_t magic;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    copy_task_t q[QUEUE_CAP];
    unsigned head, count; /* a task leaves the queue once it is copied */
    bool stop;
};
#define STREAM_MAGIC 0x5354524du

typedef struct dev_alloc {
    uint8_t *dev;    /* PROT_NONE: the addresses the caller sees */
    uint8_t *shadow; /* read-write view of the same memfd */
    size_t size;
    int fd;
} dev_alloc_t;

typedef struct host_alloc {
    void *p;
    size_t size;
} host_alloc_t;

static struct CUctx_st the_ctx;
static _Thread_local CUcontext cur_ctx;
static pthread_mutex_t tables_lock = PTHREAD_MUTEX_INITIALIZER;
static dev_alloc_t dev_allocs[MAX_DEV_ALLOCS];
static host_alloc_t host_allocs[MAX_HOST_ALLOCS];
static atomic_bool inited;
static atomic_uint delay_us;
static atomic_bool dmabuf_supported = true;
static atomic_long copies_tried;
static atomic_long fail_copy_at; /* copies_tried value that fails; 0: none */
static atomic_int fail_copy_err;
static atomic_int fail_sync_err; /* next cuStreamSynchronize returns it; 0: none */
static unsigned long long last_dmabuf_ptr;
static size_t last_dmabuf_size;

#define COUNTERS(X)                                                                                \
    X(init)                                                                                        \
    X(htod)                                                                                        \
    X(dtoh)                                                                                        \
    X(htod_done)                                                                                   \
    X(dtoh_done)                                                                                   \
    X(pageable)                                                                                    \
    X(syncs)                                                                                       \
    X(default_syncs)                                                                               \
    X(streams_created)                                                                             \
    X(streams_live)                                                                                \
    X(host_live)                                                                                   \
    X(ctx_set)                                                                                     \
    X(retain)                                                                                      \
    X(release)                                                                                     \
    X(dmabuf)
#define COUNTER_FIELD_(name) atomic_long name;
static struct {
    COUNTERS(COUNTER_FIELD_)
} cnt;

/* ---- test helpers (not part of the CUDA API) ---- */

long fake_cuda_counter(const char *name)
{
#define COUNTER_GET_(field)                                                                        \
    if (strcmp(name, #field) == 0)                                                                 \
        return atomic_load(&cnt.field);
    COUNTERS(COUNTER_GET_)
#undef COUNTER_GET_
    return -1;
}

void fake_cuda_set_delay_us(unsigned us)
{
    atomic_store(&delay_us, us);
}

/* The nth async copy issued from now on fails with err (n = 0: none). */
void fake_cuda_fail_copy(long n, int err)
{
    atomic_store(&fail_copy_err, err);
    atomic_store(&fail_copy_at, n > 0 ? atomic_load(&copies_tried) + n : 0);
}

/* The next cuStreamSynchronize returns err (after waiting, as a driver reporting an async fault).
 */
void fake_cuda_fail_next_sync(int err)
{
    atomic_store(&fail_sync_err, err);
}

void fake_cuda_set_dmabuf(int supported)
{
    atomic_store(&dmabuf_supported, supported != 0);
}

void fake_cuda_last_dmabuf(unsigned long long *ptr_p, size_t *size_p)
{
    pthread_mutex_lock(&tables_lock);
    *ptr_p = last_dmabuf_ptr;
    *size_p = last_dmabuf_size;
    pthread_mutex_unlock(&tables_lock);
}

/* Device memory, no context needed (for tests); NULL when out of slots or memory. */
void *fake_cuda_alloc(size_t size)
{
    size_t sz = (size + DEV_GRANULE - 1) & ~(DEV_GRANULE - 1);
    if (sz == 0)
        sz = DEV_GRANULE;
    int fd = memfd_create("fake-cuda-device", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    void *dev = MAP_FAILED, *shadow = MAP_FAILED;
    if (ftruncate(fd, (off_t)sz) == 0) {
        dev = mmap(NULL, sz, PROT_NONE, MAP_SHARED, fd, 0);
        shadow = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    pthread_mutex_lock(&tables_lock);
    for (int i = 0; i < MAX_DEV_ALLOCS && dev != MAP_FAILED && shadow != MAP_FAILED; i++) {
        if (dev_allocs[i].dev == NULL) {
            dev_allocs[i] = (dev_alloc_t){dev, shadow, sz, fd};
            pthread_mutex_unlock(&tables_lock);
            return dev;
        }
    }
    pthread_mutex_unlock(&tables_lock);
    if (dev != MAP_FAILED)
        munmap(dev, sz);
    if (shadow != MAP_FAILED)
        munmap(shadow, sz);
    close(fd);
    return NULL;
}

/* 0, or CUDA_ERROR_INVALID_VALUE when p is not the start of a device allocation. */
int fake_cuda_free(void *p)
{
    pthread_mutex_lock(&tables_lock);
    for (int i = 0; i < MAX_DEV_ALLOCS; i++) {
        dev_alloc_t a = dev_allocs[i];
        if (a.dev != NULL && a.dev == p) {
            memset(&dev_allocs[i], 0, sizeof(dev_allocs[i]));
            pthread_mutex_unlock(&tables_lock);
            munmap(a.dev, a.size);
            munmap(a.shadow, a.size);
            close(a.fd);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&tables_lock);
    return CUDA_ERROR_INVALID_VALUE;
}

/* Where [p, p+len) of device memory can be read and written by the test; NULL if not device. */
static uint8_t *shadow_of(const void *p, size_t len, dev_alloc_t *a_p)
{
    uintptr_t x = (uintptr_t)p;
    uint8_t *r = NULL;
    pthread_mutex_lock(&tables_lock);
    for (int i = 0; i < MAX_DEV_ALLOCS; i++) {
        dev_alloc_t *a = &dev_allocs[i];
        uintptr_t base = (uintptr_t)a->dev;
        if (a->dev != NULL && x >= base && x < base + a->size && len <= base + a->size - x) {
            r = a->shadow + (x - base);
            if (a_p != NULL)
                *a_p = *a;
            break;
        }
    }
    pthread_mutex_unlock(&tables_lock);
    return r;
}

void *fake_cuda_shadow(const void *dptr)
{
    return shadow_of(dptr, 0, NULL);
}

static bool is_pinned(const void *p, size_t len)
{
    uintptr_t x = (uintptr_t)p;
    bool r = false;
    pthread_mutex_lock(&tables_lock);
    for (int i = 0; i < MAX_HOST_ALLOCS; i++) {
        uintptr_t base = (uintptr_t)host_allocs[i].p;
        if (host_allocs[i].p != NULL && x >= base && x < base + host_allocs[i].size &&
            len <= base + host_allocs[i].size - x) {
            r = true;
            break;
        }
    }
    pthread_mutex_unlock(&tables_lock);
    return r;
}

/* ---- the CUDA driver API subset ---- */

CUresult cuInit(unsigned int flags)
{
    atomic_fetch_add(&cnt.init, 1);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    atomic_store(&inited, true);
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name)
{
    static const struct {
        CUresult err;
        const char *name;
    } names[] = {
        {CUDA_SUCCESS, "CUDA_SUCCESS"},
        {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
        {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
        {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
        {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
        {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
        {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
        {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"},
        {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (names[i].err == error) {
            *name = names[i].name;
            return CUDA_SUCCESS;
        }
    }
    *name = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

#define NEED_INIT()                                                                                \
    do {                                                                                           \
        if (!atomic_load(&inited))                                                                 \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    } while (0)
#define NEED_CTX()                                                                                 \
    do {                                                                                           \
        NEED_INIT();                                                                               \
        if (cur_ctx != &the_ctx)                                                                   \
            return CUDA_ERROR_INVALID_CONTEXT;                                                     \
    } while (0)

CUresult cuDeviceGetCount(int *count)
{
    NEED_INIT();
    *count = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    NEED_INIT();
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    NEED_INIT();
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    atomic_fetch_add(&cnt.retain, 1);
    *ctx = &the_ctx;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    NEED_INIT();
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    atomic_fetch_add(&cnt.release, 1);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    NEED_INIT();
    *ctx = cur_ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    NEED_INIT();
    if (ctx != NULL && ctx != &the_ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    atomic_fetch_add(&cnt.ctx_set, 1);
    cur_ctx = ctx;
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    NEED_INIT();
    const void *p = (const void *)(uintptr_t)ptr;
    bool dev = shadow_of(p, 1, NULL) != NULL;
    if (!dev && !is_pinned(p, 1))
        return CUDA_ERROR_INVALID_VALUE; /* what the driver says for memory it does not know */
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = &the_ctx;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        if (!dev)
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)data = 0;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    NEED_CTX();
    void *p = fake_cuda_alloc(size);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    NEED_CTX();
    return fake_cuda_free((void *)(uintptr_t)dptr);
}

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    NEED_CTX();
    if (flags & ~0x7u)
        return CUDA_ERROR_INVALID_VALUE;
    size_t sz = (size + 4095) & ~(size_t)4095;
    void *p = aligned_alloc(4096, sz ? sz : 4096);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&tables_lock);
    for (int i = 0; i < MAX_HOST_ALLOCS; i++) {
        if (host_allocs[i].p == NULL) {
            host_allocs[i] = (host_alloc_t){p, size};
            pthread_mutex_unlock(&tables_lock);
            atomic_fetch_add(&cnt.host_live, 1);
            *pp = p;
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&tables_lock);
    free(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void *p)
{
    NEED_INIT();
    pthread_mutex_lock(&tables_lock);
    for (int i = 0; i < MAX_HOST_ALLOCS; i++) {
        if (host_allocs[i].p != NULL && host_allocs[i].p == p) {
            host_allocs[i].p = NULL;
            pthread_mutex_unlock(&tables_lock);
            free(p);
            atomic_fetch_sub(&cnt.host_live, 1);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&tables_lock);
    return CUDA_ERROR_INVALID_VALUE;
}

/* Synchronous copies (only test_gpu_real.c uses them, when run against this fake). */
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    NEED_CTX();
    uint8_t *d = shadow_of((void *)(uintptr_t)dst, n, NULL);
    if (d == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(d, src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    NEED_CTX();
    uint8_t *s = shadow_of((void *)(uintptr_t)src, n, NULL);
    if (s == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, s, n);
    return CUDA_SUCCESS;
}

static void *stream_worker(void *arg)
{
    CUstream s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->count == 0 && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->count == 0)
            break; /* stop, and nothing left */
        copy_task_t t = s->q[s->head];
        pthread_mutex_unlock(&s->mu);
        unsigned us = atomic_load(&delay_us);
        if (us)
            usleep(us);
        memcpy(t.dst, t.src, t.len);
        atomic_fetch_add(t.htod ? &cnt.htod_done : &cnt.dtoh_done, 1);
        pthread_mutex_lock(&s->mu);
        s->head = (s->head + 1) % QUEUE_CAP;
        s->count--;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    NEED_CTX();
    if (flags & ~1u)
        return CUDA_ERROR_INVALID_VALUE;
    CUstream s = calloc(1, sizeof(*s));
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = STREAM_MAGIC;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, stream_worker, s) != 0) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    atomic_fetch_add(&cnt.streams_created, 1);
    atomic_fetch_add(&cnt.streams_live, 1);
    *stream = s;
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream s)
{
    NEED_INIT();
    if (s == NULL || s->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&s->mu);
    s->stop = true; /* the worker drains the queue first, as the driver would */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    s->magic = 0;
    free(s);
    atomic_fetch_sub(&cnt.streams_live, 1);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s)
{
    NEED_INIT();
    /* the default streams (0: legacy, CU_STREAM_LEGACY 1, CU_STREAM_PER_THREAD 2) of the
     * current context: nothing is ever queued on them here */
    if ((uintptr_t)s <= 2) {
        NEED_CTX();
        atomic_fetch_add(&cnt.syncs, 1);
        atomic_fetch_add(&cnt.default_syncs, 1);
        return (CUresult)atomic_exchange(&fail_sync_err, 0);
    }
    if (s->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    atomic_fetch_add(&cnt.syncs, 1);
    pthread_mutex_lock(&s->mu);
    while (s->count > 0)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return (CUresult)atomic_exchange(&fail_sync_err, 0);
}

static CUresult enqueue(CUstream s, void *dst, const void *src, size_t len, bool htod,
                        const void *host)
{
    NEED_CTX();
    if (s == NULL || s->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    long n = atomic_fetch_add(&copies_tried, 1) + 1;
    if (n == atomic_load(&fail_copy_at))
        return (CUresult)atomic_load(&fail_copy_err);
    if (shadow_of(host, len, NULL) != NULL)
        return CUDA_ERROR_INVALID_VALUE; /* both sides device: not what was asked */
    if (!is_pinned(host, len))
        atomic_fetch_add(&cnt.pageable, 1);
    pthread_mutex_lock(&s->mu);
    while (s->count == QUEUE_CAP)
        pthread_cond_wait(&s->cv, &s->mu);
    s->q[(s->head + s->count) % QUEUE_CAP] = (copy_task_t){dst, src, len, htod};
    s->count++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(htod ? &cnt.htod : &cnt.dtoh, 1);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    uint8_t *d = shadow_of((void *)(uintptr_t)dst, n, NULL);
    if (d == NULL)
        return atomic_load(&inited) ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    return enqueue(s, d, src, n, true, src);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    uint8_t *sh = shadow_of((void *)(uintptr_t)src, n, NULL);
    if (sh == NULL)
        return atomic_load(&inited) ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    return enqueue(s, dst, sh, n, false, dst);
}

CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size, int handle_type,
                                       unsigned long long flags)
{
    NEED_CTX();
    atomic_fetch_add(&cnt.dmabuf, 1);
    if (handle_type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!atomic_load(&dmabuf_supported))
        return CUDA_ERROR_NOT_SUPPORTED;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (dptr % page != 0 || size % page != 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE; /* the driver requires host-page alignment */
    dev_alloc_t a;
    if (shadow_of((void *)(uintptr_t)dptr, size, &a) == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(a.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&tables_lock);
    last_dmabuf_ptr = dptr;
    last_dmabuf_size = size;
    pthread_mutex_unlock(&tables_lock);
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}
