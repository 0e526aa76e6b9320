/*
 * registry.h - the buffers the application registered, with what the data path
 * needs to know of each without asking anyone per op: its memory kind (host or
 * CUDA device, asked of the driver once, at registration) and which transports
 * registered it (bit i: the engine's transport i can reach it zero-copy).
 *
 * Lookups are lock-free: the regions are a sorted array published as an
 * immutable snapshot; a registration builds a new snapshot and publishes it.
 * Replaced snapshots are kept until kvp_mem_registry_cleanup (a reader may
 * still hold one); registrations are rare, so this costs little.
 *
 * Thread: kvp_mem_lookup from any thread, without a lock; changes under
 * reg->lock (the caller takes it, see registry.c).
 */
#ifndef KVP_CLIENT_MEM_REGISTRY_H
#define KVP_CLIENT_MEM_REGISTRY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum kvp_mem_kind {
    KVP_MEM_HOST = 0,
    KVP_MEM_CUDA = 1, /* CUDA device memory: the CPU cannot touch it */
} kvp_mem_kind_t;

typedef struct kvp_mem_region {
    uintptr_t addr;
    size_t len;
    kvp_mem_kind_t kind;
    uint32_t tp_regs; /* bit i: registered with the engine's transport i */
} kvp_mem_region_t;

typedef struct kvp_mem_snap {
    struct kvp_mem_snap *retired_next;
    size_t n;
    kvp_mem_region_t r[]; /* sorted by addr, disjoint */
} kvp_mem_snap_t;

typedef struct kvp_mem_registry {
    pthread_mutex_t lock; /* writers */
    _Atomic(kvp_mem_snap_t *) cur;
    kvp_mem_snap_t *retired;
} kvp_mem_registry_t;

void kvp_mem_registry_init(kvp_mem_registry_t *reg);
/* Frees every snapshot; the regions' transport registrations are the caller's. */
void kvp_mem_registry_cleanup(kvp_mem_registry_t *reg);
/* The region holding all of [addr, addr+len), or NULL. Lock-free; the region
 * stays readable until cleanup. */
const kvp_mem_region_t *kvp_mem_lookup(kvp_mem_registry_t *reg, const void *addr, size_t len);
/* reg->lock held: does [addr, addr+len) overlap a region? */
bool kvp_mem_overlaps_locked(kvp_mem_registry_t *reg, uintptr_t addr, size_t len);
/* reg->lock held: add a region (not overlapping any); KVP_ERR_NOMEM. */
kvp_status_t kvp_mem_insert_locked(kvp_mem_registry_t *reg, const kvp_mem_region_t *region);
/* reg->lock held: remove the region starting at addr into *region_p; KVP_ERR_NOT_FOUND. */
kvp_status_t kvp_mem_remove_locked(kvp_mem_registry_t *reg, uintptr_t addr,
                                   kvp_mem_region_t *region_p);

#endif
