/*
 * gpu.c - the CUDA driver API through dlopen (see gpu.h for the contract).
 *
 * Design: the handful of CUDA types, constants and function signatures we
 * use are declared here (values as in cuda.h); nothing from the CUDA toolkit
 * is needed to build. cu_load() runs once (pthread_once): it opens
 * $KVPOOL_CUDA_LIB or libcuda.so.1, resolves the symbols (the unversioned
 * `_v2` names where the driver has both, since that is what cuda.h maps the
 * plain names to), and calls cuInit(0). The table is written only there and
 * read-only afterwards, so every other function is lock-free.
 * cuMemGetHandleForAddressRange (CUDA 11.7+) and cuGetErrorName are optional.
 * The library is never closed: its state lives as long as the process.
 *
 * Contexts: the driver API works on the calling thread's current context.
 * A staging thread usually has none, so each call that needs one makes the
 * device pointer's context current (CU_POINTER_ATTRIBUTE_CONTEXT, or the
 * device's primary context when the pointer reports none, e.g. for memory
 * mapped through cuMemMap) and restores the thread's previous context after
 * the call (ctx_enter/ctx_leave). Pinned host memory is portable, so it is
 * allocated in whatever context is current, else in GPU 0's primary context,
 * which is retained once and kept for the life of the process.
 *
 * Thread: all functions, any thread.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/mem/gpu.h"
#include "common/log.h"

/* ---- the CUDA driver ABI we use (values from cuda.h) ---- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_SUPPORTED 801

#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_DEVICE 2
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1
#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_STREAM_NON_BLOCKING 0x1

typedef CUresult (*cu_init_fn)(unsigned int flags);
typedef CUresult (*cu_get_error_name_fn)(CUresult error, const char **name);
typedef CUresult (*cu_pointer_get_attribute_fn)(void *data, int attribute, CUdeviceptr ptr);
typedef CUresult (*cu_mem_host_alloc_fn)(void **pp, size_t bytesize, unsigned int flags);
typedef CUresult (*cu_mem_free_host_fn)(void *p);
typedef CUresult (*cu_memcpy_htod_async_fn)(CUdeviceptr dst, const void *src, size_t n,
                                            CUstream stream);
typedef CUresult (*cu_memcpy_dtoh_async_fn)(void *dst, CUdeviceptr src, size_t n, CUstream stream);
typedef CUresult (*cu_stream_create_fn)(CUstream *stream, unsigned int flags);
typedef CUresult (*cu_stream_destroy_fn)(CUstream stream);
typedef CUresult (*cu_stream_synchronize_fn)(CUstream stream);
typedef CUresult (*cu_mem_get_handle_fn)(void *handle, CUdeviceptr dptr, size_t size,
                                         int handle_type, unsigned long long flags);
typedef CUresult (*cu_ctx_get_current_fn)(CUcontext *ctx);
typedef CUresult (*cu_ctx_set_current_fn)(CUcontext ctx);
typedef CUresult (*cu_device_get_fn)(CUdevice *device, int ordinal);
typedef CUresult (*cu_primary_ctx_retain_fn)(CUcontext *ctx, CUdevice dev);
typedef CUresult (*cu_primary_ctx_release_fn)(CUdevice dev);

static struct {
    bool ok; /* loaded and cuInit(0) succeeded */
    cu_init_fn init;
    cu_get_error_name_fn get_error_name; /* optional */
    cu_pointer_get_attribute_fn pointer_get_attribute;
    cu_mem_host_alloc_fn mem_host_alloc;
    cu_mem_free_host_fn mem_free_host;
    cu_memcpy_htod_async_fn memcpy_htod_async;
    cu_memcpy_dtoh_async_fn memcpy_dtoh_async;
    cu_stream_create_fn stream_create;
    cu_stream_destroy_fn stream_destroy;
    cu_stream_synchronize_fn stream_synchronize;
    cu_mem_get_handle_fn mem_get_handle; /* optional: CUDA 11.7+ */
    cu_ctx_get_current_fn ctx_get_current;
    cu_ctx_set_current_fn ctx_set_current;
    cu_device_get_fn device_get;
    cu_primary_ctx_retain_fn primary_ctx_retain;
    cu_primary_ctx_release_fn primary_ctx_release;
} cu;

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

/* GPU 0's primary context, for pinned allocations on threads without a context. */
static pthread_mutex_t host_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext host_ctx;

struct kvp_gpu_stream {
    CUstream stream;
    CUcontext ctx;
    int retained_dev; /* >= 0: ctx is this device's primary context, retained by us */
};

/* Log a failed CUDA call; the status it becomes. */
static kvp_status_t cu_fail(const char *fn, CUresult rc, kvp_status_t status)
{
    const char *name = NULL;
    if (cu.get_error_name == NULL || cu.get_error_name(rc, &name) != CUDA_SUCCESS || name == NULL)
        name = "unknown";
    KVP_LOG_ERROR("gpu: %s failed: CUDA error %d (%s)", fn, rc, name);
    return rc == CUDA_ERROR_OUT_OF_MEMORY ? KVP_ERR_NOMEM : status;
}

static void cu_load(void)
{
    /* process-wide, like the driver it names (loaded once, never closed): read here, once,
     * and documented with the client's environment (client/env.c, docs/options.md); the
     * unit tests point it at a fake driver without a client */
    const char *path = getenv("KVPOOL_CUDA_LIB");
    if (path == NULL || path[0] == '\0')
        path = "libcuda.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        KVP_LOG_INFO("gpu: no CUDA: cannot load %s (%s); GPU buffers are not supported", path,
                     dlerror());
        return;
    }
    struct {
        const char *name;
        void *slot; /* address of the function pointer in `cu` */
        bool required;
    } syms[] = {
        {"cuInit", &cu.init, true},
        {"cuGetErrorName", &cu.get_error_name, false},
        {"cuPointerGetAttribute", &cu.pointer_get_attribute, true},
        {"cuMemHostAlloc", &cu.mem_host_alloc, true},
        {"cuMemFreeHost", &cu.mem_free_host, true},
        {"cuMemcpyHtoDAsync_v2", &cu.memcpy_htod_async, true},
        {"cuMemcpyDtoHAsync_v2", &cu.memcpy_dtoh_async, true},
        {"cuStreamCreate", &cu.stream_create, true},
        {"cuStreamDestroy_v2", &cu.stream_destroy, true},
        {"cuStreamSynchronize", &cu.stream_synchronize, true},
        {"cuMemGetHandleForAddressRange", &cu.mem_get_handle, false},
        {"cuCtxGetCurrent", &cu.ctx_get_current, true},
        {"cuCtxSetCurrent", &cu.ctx_set_current, true},
        {"cuDeviceGet", &cu.device_get, true},
        {"cuDevicePrimaryCtxRetain", &cu.primary_ctx_retain, true},
        {"cuDevicePrimaryCtxRelease_v2", &cu.primary_ctx_release, true},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *sym = dlsym(lib, syms[i].name);
        if (sym == NULL && syms[i].required) {
            KVP_LOG_INFO("gpu: no CUDA: %s has no %s (driver too old?); GPU buffers are not "
                         "supported",
                         path, syms[i].name);
            memset(&cu, 0, sizeof(cu));
            return; /* lib stays open: harmless, and dlclose of a driver is not */
        }
        /* POSIX guarantees a function pointer survives the round trip through void * */
        memcpy(syms[i].slot, &sym, sizeof(sym));
    }
    CUresult rc = cu.init(0);
    if (rc != CUDA_SUCCESS) {
        const char *name = NULL;
        if (cu.get_error_name == NULL || cu.get_error_name(rc, &name) != CUDA_SUCCESS)
            name = "unknown";
        KVP_LOG_INFO("gpu: no CUDA: cuInit(0) failed: CUDA error %d (%s), e.g. no GPU or no "
                     "driver; GPU buffers are not supported",
                     rc, name != NULL ? name : "unknown");
        return;
    }
    if (cu.mem_get_handle == NULL)
        KVP_LOG_INFO("gpu: %s has no cuMemGetHandleForAddressRange: no dma-buf export", path);
    cu.ok = true;
}

bool kvp_gpu_available(void)
{
    pthread_once(&cu_once, cu_load);
    return cu.ok;
}

typedef struct ctx_guard {
    CUcontext prev;
    bool switched;
} ctx_guard_t;

/* Make ctx current on this thread for one call; ctx_leave restores the previous one. */
static kvp_status_t ctx_enter(CUcontext ctx, ctx_guard_t *g)
{
    g->switched = false;
    CUresult rc = cu.ctx_get_current(&g->prev);
    if (rc != CUDA_SUCCESS)
        return cu_fail("cuCtxGetCurrent", rc, KVP_ERR_IO);
    if (g->prev == ctx)
        return KVP_OK;
    rc = cu.ctx_set_current(ctx);
    if (rc != CUDA_SUCCESS)
        return cu_fail("cuCtxSetCurrent", rc, KVP_ERR_IO);
    g->switched = true;
    return KVP_OK;
}

static void ctx_leave(const ctx_guard_t *g)
{
    if (!g->switched)
        return;
    CUresult rc = cu.ctx_set_current(g->prev);
    if (rc != CUDA_SUCCESS)
        cu_fail("cuCtxSetCurrent (restore)", rc, KVP_ERR_IO);
}

kvp_status_t kvp_gpu_device_ordinal(const void *p, int *ordinal_p)
{
    if (!kvp_gpu_available())
        return KVP_ERR_TRANSPORT;
    unsigned int type = 0;
    CUresult rc = cu.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                           (CUdeviceptr)(uintptr_t)p);
    if (rc != CUDA_SUCCESS) {
        /* CUDA_ERROR_INVALID_VALUE is CUDA's answer for memory it does not know: host */
        if (rc != CUDA_ERROR_INVALID_VALUE)
            KVP_LOG_DEBUG("gpu: cuPointerGetAttribute(%p) failed: CUDA error %d; taken as host", p,
                          rc);
        return KVP_ERR_INVALID_ARG;
    }
    if (type != CU_MEMORYTYPE_DEVICE)
        return KVP_ERR_INVALID_ARG;
    int ordinal = -1;
    rc = cu.pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                  (CUdeviceptr)(uintptr_t)p);
    if (rc != CUDA_SUCCESS)
        return cu_fail("cuPointerGetAttribute(DEVICE_ORDINAL)", rc, KVP_ERR_IO);
    *ordinal_p = ordinal;
    return KVP_OK;
}

bool kvp_gpu_is_device_ptr(const void *p)
{
    int ordinal;
    return kvp_gpu_device_ordinal(p, &ordinal) == KVP_OK;
}

/*
 * The context to work on p in: the one p was allocated in, else its device's
 * primary context, retained here (*retained_dev_p >= 0: release it later).
 */
static kvp_status_t ptr_ctx(const void *p, CUcontext *ctx_p, int *retained_dev_p)
{
    int ordinal;
    kvp_status_t st = kvp_gpu_device_ordinal(p, &ordinal);
    if (st != KVP_OK)
        return st;
    CUcontext ctx = NULL;
    CUresult rc =
        cu.pointer_get_attribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)(uintptr_t)p);
    if (rc == CUDA_SUCCESS && ctx != NULL) {
        *ctx_p = ctx;
        *retained_dev_p = -1;
        return KVP_OK;
    }
    CUdevice dev;
    rc = cu.device_get(&dev, ordinal);
    if (rc != CUDA_SUCCESS)
        return cu_fail("cuDeviceGet", rc, KVP_ERR_IO);
    rc = cu.primary_ctx_retain(&ctx, dev);
    if (rc != CUDA_SUCCESS)
        return cu_fail("cuDevicePrimaryCtxRetain", rc, KVP_ERR_IO);
    *ctx_p = ctx;
    *retained_dev_p = dev;
    return KVP_OK;
}

static void ptr_ctx_release(int retained_dev)
{
    if (retained_dev < 0)
        return;
    CUresult rc = cu.primary_ctx_release(retained_dev);
    if (rc != CUDA_SUCCESS)
        cu_fail("cuDevicePrimaryCtxRelease_v2", rc, KVP_ERR_IO);
}

kvp_status_t kvp_gpu_dmabuf_fd(const void *p, size_t len, int *fd_p, uint64_t *offset_p)
{
    if (!kvp_gpu_available() || cu.mem_get_handle == NULL)
        return KVP_ERR_TRANSPORT;
    if (len == 0)
        return KVP_ERR_INVALID_ARG;
    CUcontext ctx;
    int retained_dev;
    kvp_status_t st = ptr_ctx(p, &ctx, &retained_dev);
    if (st != KVP_OK)
        return st;
    /* the driver wants address and size aligned to the host page size */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)p & ~(page - 1);
    uintptr_t end = ((uintptr_t)p + len + page - 1) & ~(page - 1);
    ctx_guard_t g;
    st = ctx_enter(ctx, &g);
    if (st == KVP_OK) {
        int fd = -1;
        CUresult rc = cu.mem_get_handle(&fd, (CUdeviceptr)start, end - start,
                                        CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        ctx_leave(&g);
        if (rc == CUDA_SUCCESS && fd >= 0) {
            *fd_p = fd;
            *offset_p = (uint64_t)((uintptr_t)p - start);
        } else if (rc == CUDA_ERROR_NOT_SUPPORTED || rc == CUDA_SUCCESS) {
            KVP_LOG_INFO("gpu: the driver offers no dma-buf for GPU memory at %p (CUDA error %d)",
                         p, rc);
            st = KVP_ERR_TRANSPORT;
        } else {
            st = cu_fail("cuMemGetHandleForAddressRange", rc, KVP_ERR_TRANSPORT);
        }
    }
    ptr_ctx_release(retained_dev);
    return st;
}

/* GPU 0's primary context, retained on first use and kept for the process. */
static kvp_status_t host_ctx_get(CUcontext *ctx_p)
{
    kvp_status_t st = KVP_OK;
    pthread_mutex_lock(&host_ctx_lock);
    if (host_ctx == NULL) {
        CUdevice dev;
        CUresult rc = cu.device_get(&dev, 0);
        if (rc != CUDA_SUCCESS) {
            st = cu_fail("cuDeviceGet(0)", rc, KVP_ERR_IO);
        } else {
            rc = cu.primary_ctx_retain(&host_ctx, dev);
            if (rc != CUDA_SUCCESS) {
                host_ctx = NULL;
                st = cu_fail("cuDevicePrimaryCtxRetain", rc, KVP_ERR_IO);
            }
        }
    }
    *ctx_p = host_ctx;
    pthread_mutex_unlock(&host_ctx_lock);
    return st;
}

/* Enter the current context, or GPU 0's primary one when the thread has none. */
static kvp_status_t host_ctx_enter(ctx_guard_t *g)
{
    CUcontext cur = NULL;
    CUresult rc = cu.ctx_get_current(&cur);
    if (rc != CUDA_SUCCESS)
        return cu_fail("cuCtxGetCurrent", rc, KVP_ERR_IO);
    if (cur == NULL) {
        kvp_status_t st = host_ctx_get(&cur);
        if (st != KVP_OK)
            return st;
    }
    return ctx_enter(cur, g);
}

kvp_status_t kvp_gpu_host_alloc(size_t len, void **p_out)
{
    if (!kvp_gpu_available())
        return KVP_ERR_TRANSPORT;
    ctx_guard_t g;
    kvp_status_t st = host_ctx_enter(&g);
    if (st != KVP_OK)
        return st;
    void *p = NULL;
    CUresult rc = cu.mem_host_alloc(&p, len, CU_MEMHOSTALLOC_PORTABLE);
    ctx_leave(&g);
    if (rc != CUDA_SUCCESS)
        return cu_fail("cuMemHostAlloc", rc, KVP_ERR_NOMEM);
    *p_out = p;
    return KVP_OK;
}

void kvp_gpu_host_free(void *p)
{
    if (p == NULL || !kvp_gpu_available())
        return;
    ctx_guard_t g;
    if (host_ctx_enter(&g) != KVP_OK)
        return;
    CUresult rc = cu.mem_free_host(p);
    ctx_leave(&g);
    if (rc != CUDA_SUCCESS)
        cu_fail("cuMemFreeHost", rc, KVP_ERR_IO);
}

kvp_status_t kvp_gpu_stream_create(const void *dev_ptr, kvp_gpu_stream_t **s_p)
{
    if (!kvp_gpu_available())
        return KVP_ERR_TRANSPORT;
    kvp_gpu_stream_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVP_ERR_NOMEM;
    kvp_status_t st = ptr_ctx(dev_ptr, &s->ctx, &s->retained_dev);
    if (st != KVP_OK)
        goto err_free;
    ctx_guard_t g;
    st = ctx_enter(s->ctx, &g);
    if (st != KVP_OK)
        goto err_release;
    CUresult rc = cu.stream_create(&s->stream, CU_STREAM_NON_BLOCKING);
    ctx_leave(&g);
    if (rc != CUDA_SUCCESS) {
        st = cu_fail("cuStreamCreate", rc, KVP_ERR_IO);
        goto err_release;
    }
    *s_p = s;
    return KVP_OK;

err_release:
    ptr_ctx_release(s->retained_dev);
err_free:
    free(s);
    return st;
}

void kvp_gpu_stream_destroy(kvp_gpu_stream_t *s)
{
    if (s == NULL)
        return;
    ctx_guard_t g;
    if (ctx_enter(s->ctx, &g) == KVP_OK) {
        CUresult rc = cu.stream_synchronize(s->stream);
        if (rc != CUDA_SUCCESS)
            cu_fail("cuStreamSynchronize", rc, KVP_ERR_IO);
        rc = cu.stream_destroy(s->stream);
        if (rc != CUDA_SUCCESS)
            cu_fail("cuStreamDestroy_v2", rc, KVP_ERR_IO);
        ctx_leave(&g);
    }
    ptr_ctx_release(s->retained_dev);
    free(s);
}

kvp_status_t kvp_gpu_copy_async(kvp_gpu_stream_t *s, void *dst, const void *src, size_t len,
                                bool to_device)
{
    ctx_guard_t g;
    kvp_status_t st = ctx_enter(s->ctx, &g);
    if (st != KVP_OK)
        return st;
    CUresult rc;
    if (to_device)
        rc = cu.memcpy_htod_async((CUdeviceptr)(uintptr_t)dst, src, len, s->stream);
    else
        rc = cu.memcpy_dtoh_async(dst, (CUdeviceptr)(uintptr_t)src, len, s->stream);
    ctx_leave(&g);
    if (rc != CUDA_SUCCESS)
        return cu_fail(to_device ? "cuMemcpyHtoDAsync_v2" : "cuMemcpyDtoHAsync_v2", rc, KVP_ERR_IO);
    return KVP_OK;
}

kvp_status_t kvp_gpu_stream_sync(kvp_gpu_stream_t *s)
{
    ctx_guard_t g;
    kvp_status_t st = ctx_enter(s->ctx, &g);
    if (st != KVP_OK)
        return st;
    CUresult rc = cu.stream_synchronize(s->stream);
    ctx_leave(&g);
    if (rc != CUDA_SUCCESS)
        return cu_fail("cuStreamSynchronize", rc, KVP_ERR_IO);
    return KVP_OK;
}

kvp_status_t kvp_gpu_caller_stream_sync(uintptr_t stream, const void *dev_ptr)
{
    if (!kvp_gpu_available())
        return KVP_ERR_TRANSPORT;
    CUcontext cur = NULL;
    CUresult rc = cu.ctx_get_current(&cur);
    if (rc != CUDA_SUCCESS)
        return cu_fail("cuCtxGetCurrent", rc, KVP_ERR_IO);
    int retained_dev = -1;
    kvp_status_t st = KVP_OK;
    if (cur == NULL) {
        if (dev_ptr != NULL && kvp_gpu_is_device_ptr(dev_ptr))
            st = ptr_ctx(dev_ptr, &cur, &retained_dev);
        else
            st = host_ctx_get(&cur);
        if (st != KVP_OK)
            return st;
    }
    ctx_guard_t g;
    st = ctx_enter(cur, &g);
    if (st == KVP_OK) {
        rc = cu.stream_synchronize((CUstream)stream);
        ctx_leave(&g);
        if (rc != CUDA_SUCCESS)
            st = cu_fail("cuStreamSynchronize (the caller's stream)", rc, KVP_ERR_IO);
    }
    ptr_ctx_release(retained_dev);
    return st;
}
