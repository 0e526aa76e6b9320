/*
 * offset_alloc.h - O(1) offset allocator for one segment (TLSF-style).
 *
 * Hands out [offset, offset+len) ranges of an abstract address space of
 * `size` bytes. It never touches the segment's memory: all block metadata is
 * kept in a node array owned by the allocator, so it works for remote memory
 * (the master allocates inside segments that live in other processes).
 *
 * Thread: not thread-safe; the master's loop thread owns every allocator.
 */
#ifndef KVP_COMMON_OFFSET_ALLOC_H
#define KVP_COMMON_OFFSET_ALLOC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kvp_offset_alloc kvp_offset_alloc_t;

/* An invalid handle value; never returned by a successful alloc. */
#define KVP_OFFSET_ALLOC_NO_HANDLE UINT32_MAX

/*
 * Create an allocator over [0, size). `align` (a power of two, >= 1) is the
 * alignment of every returned offset and the granularity of every block; a
 * request is rounded up to it. Returns KVP_ERR_INVALID_ARG for size 0 or a bad
 * alignment, KVP_ERR_NOMEM when metadata cannot be allocated.
 */
kvp_status_t kvp_offset_alloc_create(uint64_t size, uint64_t align, kvp_offset_alloc_t **alloc_p);
void kvp_offset_alloc_destroy(kvp_offset_alloc_t *alloc);

/*
 * Allocate `len` bytes (len >= 1). On success writes the offset and an opaque
 * handle used to free the block. Returns KVP_ERR_POOL_FULL when no free block
 * can hold the request, KVP_ERR_INVALID_ARG for len 0 or len > size,
 * KVP_ERR_NOMEM when node metadata cannot grow. O(1) in the common case.
 */
kvp_status_t kvp_offset_alloc_alloc(kvp_offset_alloc_t *alloc, uint64_t len, uint64_t *offset_p,
                                    uint32_t *handle_p);

/*
 * Allocate exactly [offset, offset+len) (len rounded up to align; offset a
 * multiple of it): a range whose place is already decided (an SSD segment's
 * objects, brought back at mount). KVP_ERR_EXISTS when part of it is
 * allocated, KVP_ERR_INVALID_ARG when it is misaligned or outside the usable
 * size. O(1) when calls come in ascending offset order, else O(blocks).
 */
kvp_status_t kvp_offset_alloc_reserve(kvp_offset_alloc_t *alloc, uint64_t offset, uint64_t len,
                                      uint32_t *handle_p);

/* Free a block by the handle its alloc returned; coalesces with free neighbours. O(1). */
void kvp_offset_alloc_free(kvp_offset_alloc_t *alloc, uint32_t handle);

/* Accounting: bytes in allocated blocks (after rounding to align), total size, */
/* the largest single free block, and the number of allocated blocks. */
uint64_t kvp_offset_alloc_used(const kvp_offset_alloc_t *alloc);
uint64_t kvp_offset_alloc_size(const kvp_offset_alloc_t *alloc);
uint64_t kvp_offset_alloc_largest_free(const kvp_offset_alloc_t *alloc);
uint64_t kvp_offset_alloc_count(const kvp_offset_alloc_t *alloc);

#endif
