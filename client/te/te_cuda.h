/*
 * te_cuda.h - the transfer engine's CUDA device memory as a target (te_cuda.c): a target's
 * registered device memory, served through pinned staging.
 *
 * Thread: any.
 */
#ifndef KVP_CLIENT_TE_TE_CUDA_H
#define KVP_CLIENT_TE_TE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/transfer/engine.h"
#include "client/transport/wire.h"

/*
 * A target's registered device memory: a peer's WRITEV into it is received into pinned host
 * staging buffers and copied to the device, a READV copied from the device into them and
 * sent. Staging slots (two 256 KiB pinned buffers and a copy stream per buffer) are made
 * at the first such request and reused, at most TE_CUDA_SLOTS (requests beyond wait for
 * one). A request's device extents are packed into the buffers in turn, a copy each, and a
 * buffer is waited for only when it comes round again and at the request's end.
 * Made by the engine's first registration of device memory (under its regions' write lock),
 * freed at its destroy (no request in flight).
 */
typedef struct te_cuda te_cuda_t;
kvp_status_t kvp_te_cuda_new(te_cuda_t **c_p);
void kvp_te_cuda_free(te_cuda_t *c);
/* A device region was registered; a region [addr, addr + len) is unregistered (counted
 * off when it is device memory; c NULL: nothing). */
void kvp_te_cuda_registered(te_cuda_t *c);
void kvp_te_cuda_unregistered(te_cuda_t *c, kvp_transfer_t *xfer, uintptr_t addr, uint64_t len);
/* Does any of v[0..n) (each inside one registered region) lie in device memory? False at
 * once when none is registered. */
bool kvp_te_cuda_vecs(te_cuda_t *c, kvp_transfer_t *xfer, const kvp_data_vec_t *v, size_t n);
/* The data server's write and read (data_backend.h's contract) of extents some of which are
 * device memory; host ones move directly. */
bool kvp_te_cuda_recv(te_cuda_t *c, kvp_transfer_t *xfer, int fd, const kvp_data_vec_t *v, size_t n,
                      kvp_status_t *reply_p);
bool kvp_te_cuda_send(te_cuda_t *c, kvp_transfer_t *xfer, int fd, const kvp_data_vec_t *v, size_t n,
                      uint64_t total);

#endif
