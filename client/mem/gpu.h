/*
 * gpu.h - the CUDA driver API as the transfer engine needs it, loaded at run
 * time: no CUDA header, library or toolkit is needed to build kvpool, and a
 * process without libcuda runs exactly as before (every kvp_gpu_* call then
 * answers "no GPU").
 *
 * libcuda.so.1 (or $KVPOOL_CUDA_LIB, used by the tests to load a fake driver)
 * is opened with dlopen and cuInit(0) is called once, on the first call of any
 * kvp_gpu_* function (pthread_once). All functions are thread-safe. A thread
 * does not need a current CUDA context: copies and dma-buf exports run in the
 * context the device pointer belongs to, which is made current for the call
 * and the caller's own current context restored afterwards.
 *
 * Errors: every failed CUDA call is logged once where it happens, with the
 * CUDA function name and error number, and becomes KVP_ERR_NOMEM (CUDA out of
 * memory), KVP_ERR_TRANSPORT (no CUDA, or a feature the driver does not
 * offer) or KVP_ERR_IO (anything else). Nothing here aborts.
 */
#ifndef KVP_CLIENT_GPU_H
#define KVP_CLIENT_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* libcuda could be loaded and cuInit(0) succeeded. Logs (info, once) why not. */
bool kvp_gpu_available(void);

/*
 * True iff CUDA says p is device memory (CU_MEMORYTYPE_DEVICE). False for
 * host memory (also pinned host memory) and always false without CUDA.
 */
bool kvp_gpu_is_device_ptr(const void *p);

/*
 * The ordinal of the GPU whose memory p is. KVP_ERR_INVALID_ARG when p is not
 * device memory, KVP_ERR_TRANSPORT without CUDA.
 */
kvp_status_t kvp_gpu_device_ordinal(const void *p, int *ordinal_p);

/*
 * A dma-buf file descriptor (for ibv_reg_dmabuf_mr) that covers [p, p+len):
 * the range is widened to host-page boundaries, as cuMemGetHandleForAddressRange
 * requires, and *offset_p is where p lies inside the dma-buf. The caller owns
 * *fd_p and closes it. KVP_ERR_TRANSPORT when the driver does not offer
 * dma-buf export (old driver, no CUDA, or CUDA_ERROR_NOT_SUPPORTED).
 */
kvp_status_t kvp_gpu_dmabuf_fd(const void *p, size_t len, int *fd_p, uint64_t *offset_p);

/*
 * Pinned (page-locked, CU_MEMHOSTALLOC_PORTABLE: usable from every context)
 * host memory, for staging buffers that GPU copies can DMA from and to.
 * Allocated in the calling thread's current context, or in the primary
 * context of GPU 0 (retained once for the process) when it has none.
 * KVP_ERR_TRANSPORT without CUDA, KVP_ERR_NOMEM when CUDA is out of memory.
 */
kvp_status_t kvp_gpu_host_alloc(size_t len, void **p_out);
void kvp_gpu_host_free(void *p);

/*
 * A copy stream in the context of dev_ptr's GPU (the context that allocated
 * it, else that GPU's primary context). Copies are issued asynchronously and
 * complete in issue order; kvp_gpu_stream_sync waits for all issued copies.
 * A stream is used by one thread at a time.
 */
typedef struct kvp_gpu_stream kvp_gpu_stream_t;

kvp_status_t kvp_gpu_stream_create(const void *dev_ptr, kvp_gpu_stream_t **s_p);
/* Waits for outstanding copies, then destroys. NULL is ignored. */
void kvp_gpu_stream_destroy(kvp_gpu_stream_t *s);
/*
 * Issue a copy of len bytes: host src -> device dst when to_device, else
 * device src -> host dst. Both buffers are borrowed until the next
 * kvp_gpu_stream_sync returns; the host side should be pinned memory for the
 * copy to be really asynchronous.
 */
kvp_status_t kvp_gpu_copy_async(kvp_gpu_stream_t *s, void *dst, const void *src, size_t len,
                                bool to_device);
/* Wait until every copy issued on s is done; the first failure is returned. */
kvp_status_t kvp_gpu_stream_sync(kvp_gpu_stream_t *s);

/*
 * Wait until every operation issued so far on a caller's stream is done (a CUstream, the
 * same handle as a cudaStream_t; 0 is the legacy default stream, 2 the per-thread one): in
 * the calling thread's current context, else the context of dev_ptr (device memory, may be
 * NULL), else GPU 0's primary context. KVP_ERR_TRANSPORT without CUDA, KVP_ERR_IO when the
 * driver refuses the stream or one of its operations failed.
 */
kvp_status_t kvp_gpu_caller_stream_sync(uintptr_t stream, const void *dev_ptr);

#endif
