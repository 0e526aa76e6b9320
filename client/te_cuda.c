/*
 * te_cuda.c - Mooncake's `_on_cuda` transfers (kvp_te_transfer_on_cuda, kvpool_te.h) and
 * the device-memory test te.c's route choice needs (te_cuda.h).
 *
 * Mooncake (transfer_engine_py.cpp, batchTransferOnCuda) enqueues a host function on the
 * caller's CUDA stream (cudaLaunchHostFunc) that runs the transfer once the work before it
 * on the stream is done, returns at once, and _exit(1)s the process when the transfer
 * fails. Here the call waits for the caller's stream (cuStreamSynchronize: the data the
 * stream's kernels produced is there, and nothing on it still reads a READ's destination),
 * then moves the ranges as kvp_te_transfer does and returns its status: the bytes have
 * moved when it returns, and a failure is an error code, not the end of the process. A
 * host function may make no CUDA call, and staging device memory needs them; a blocking
 * call is what a host function would do to the stream anyway.
 *
 * Device memory is moved by the transfer engine's staging (client/transfer/staging.c): a
 * pool of stagers, each a ring of pinned host buffers and copy streams made once and
 * reused, copying chunk k+1 while the transport moves chunk k; nothing is allocated per
 * transfer once warm. Host memory among the ranges moves as in kvp_te_transfer (Mooncake
 * moves whatever address it is given, ordered after the stream).
 *
 * Thread: any, as kvp_te_transfer.
 */
#include "client/include/kvpool_te.h"

#include "client/mem/gpu.h"
#include "client/te_cuda.h"

bool kvp_te_cuda_locals(kvp_transfer_t *xfer, size_t n, void *const *locals, const uint64_t *lens)
{
    if (!xfer->gpu)
        return false;
    for (size_t i = 0; i < n; i++) {
        const kvp_mem_region_t *r;
        if (kvp_transfer_mem_find(xfer, locals[i], lens[i], &r) == KVP_MEM_CUDA)
            return true;
    }
    return false;
}

kvp_status_t kvp_te_transfer_on_cuda(kvp_te_t *te, const char *target, int opcode, size_t n,
                                     void *const *locals, const uint64_t *remotes,
                                     const uint64_t *lens, uintptr_t stream)
{
    if (te == NULL || target == NULL || (n > 0 && locals == NULL))
        return KVP_ERR_INVALID_ARG;
    if (!kvp_gpu_available())
        return KVP_ERR_TRANSPORT; /* Mooncake: cudaLaunchHostFunc fails, RuntimeError */
    const void *dev = NULL;       /* a device range, for the context when the thread has none */
    for (size_t i = 0; i < n && dev == NULL; i++)
        if (kvp_gpu_is_device_ptr(locals[i]))
            dev = locals[i];
    kvp_status_t st = kvp_gpu_caller_stream_sync(stream, dev);
    if (st != KVP_OK)
        return st;
    return kvp_te_transfer(te, target, opcode, n, locals, remotes, lens);
}
