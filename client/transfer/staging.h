/*
 * staging.h - move ops whose local buffer the transport cannot touch
 * directly (GPU memory on tcp/shm, or on rdma without GPUDirect; host memory
 * not registered with rdma) through a ring of staging buffers that it can.
 *
 * Pipelined: while the transport moves one staging buffer, the next one is
 * being filled from the op's buffer (WRITE) and the previous ones are being
 * drained into it (READ). Small ops share a staging buffer, so a batch of many
 * small objects is one transport call per buffer, not one per object.
 *
 * Thread: a stager may be used from any thread; concurrent kvp_stager_run
 * calls on one stager are serialised (use one stager per thread for
 * parallelism). The run callback is called on the thread of kvp_stager_run.
 */
#ifndef KVP_CLIENT_STAGING_H
#define KVP_CLIENT_STAGING_H

#include <stddef.h>

#include "client/transfer/xfer.h"
#include "common/status.h"

/* How staged chunks are copied between the op's buffer and a staging buffer. */
typedef enum kvp_stage_mem {
    KVP_STAGE_HOST = 0, /* memcpy */
    KVP_STAGE_GPU = 1,  /* CUDA async copies (client/gpu.h); host buffers among them: memcpy */
} kvp_stage_mem_t;

typedef struct kvp_stager kvp_stager_t;

/*
 * Runs plain ops (whose local buffers are staging buffers) on the real
 * transports; blocking, sets each op's status. The ops array is borrowed for
 * the call; it holds at most one staging buffer's worth of bytes.
 */
typedef void (*kvp_stage_run_cb_t)(void *arg, kvp_xfer_op_t *ops, size_t n);
/* Registers / deregisters a staging buffer with the transports (e.g. rdma MR) once; may be NULL. */
typedef kvp_status_t (*kvp_stage_reg_cb_t)(void *arg, void *buf, size_t len);
typedef void (*kvp_stage_dereg_cb_t)(void *arg, void *buf);

typedef struct kvp_stager_params {
    size_t chunk_bytes; /* size of one staging buffer; 0: 1 MiB */
    unsigned depth;     /* buffers in the ring, >= 2; 0: 4 */
    kvp_stage_run_cb_t run;
    kvp_stage_reg_cb_t reg;     /* may be NULL */
    kvp_stage_dereg_cb_t dereg; /* may be NULL */
    void *arg;                  /* passed to run, reg and dereg */
} kvp_stager_params_t;

/*
 * Create a stager. Staging buffers are allocated (pinned when the first run
 * is in KVP_STAGE_GPU mode and CUDA is available) and registered on the first
 * kvp_stager_run, once. KVP_ERR_INVALID_ARG for a NULL run callback or
 * depth 1, KVP_ERR_NOMEM.
 */
kvp_status_t kvp_stager_create(const kvp_stager_params_t *p, kvp_stager_t **s_p);
/* Deregisters (dereg callback) and frees the staging buffers, destroys GPU streams. */
void kvp_stager_destroy(kvp_stager_t *s);

/*
 * Move every op through staging buffers; op->local is the caller's (GPU or
 * host) buffer, borrowed until the call returns. Sets op->status, and op->crc
 * when op->want_crc (CRC32C of the object's bytes, chained over chunks). A
 * failed chunk fails its op (the first error wins) and its remaining chunks
 * are skipped; the other ops go on. KVP_STAGE_GPU without CUDA fails every op
 * with KVP_ERR_TRANSPORT.
 */
void kvp_stager_run(kvp_stager_t *s, kvp_stage_mem_t mem, kvp_xfer_op_t **ops, size_t n);

#endif
