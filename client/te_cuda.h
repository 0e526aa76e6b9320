/*
 * te_cuda.h - the transfer engine's CUDA device memory (te_cuda.c): which of an
 * initiator's local ranges are device memory, for te.c's route choice.
 *
 * Thread: any.
 */
#ifndef KVP_CLIENT_TE_CUDA_H
#define KVP_CLIENT_TE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/transfer/engine.h"

/* Is any of the n local ranges CUDA device memory? The kernel's process_vm_* cannot
 * reach it: such a batch takes the socket path, whose engine stages it through pinned
 * host memory. False at once when the process has no CUDA. */
bool kvp_te_cuda_locals(kvp_transfer_t *xfer, size_t n, void *const *locals, const uint64_t *lens);

#endif
