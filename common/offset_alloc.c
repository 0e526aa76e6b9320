/*
 * offset_alloc.c - TLSF-style O(1) allocator of [offset, offset+len) ranges.
 *
 * DESIGN
 * The allocator never touches the memory it manages: a segment may live in
 * another process, so every block is described by a node in a growable array
 * owned by the allocator. A node records its block's offset and size, its
 * physical neighbours (the blocks just below and above it, as node indices)
 * and, while the block is free, its links in a segregated free list. The
 * handle given to the caller is the node index of the allocated block; it
 * stays valid across node-array growth because it is an index, not a pointer.
 * Nodes released by coalescing go on a spare list and are reused first.
 *
 * Free blocks are kept in two-level segregated lists (TLSF). Sizes are handled
 * in units of `align`: the first level is floor(log2(units)), the second level
 * splits each power-of-two range into 32 linear classes; units below 32 get
 * one class each. A bitmap per level finds the first non-empty class >= a
 * given class with one ctz per level, so the common alloc is O(1):
 *   1. round the request up to the next class boundary, so that every block of
 *      the class found is large enough, and take the head of its list;
 *   2. if nothing is found, scan the one list of the request's own class for a
 *      block that is large enough. Step 2 makes "fits in some free block" imply
 *      "alloc succeeds" (class rounding alone would refuse e.g. a request of
 *      exactly the size of the only free block); it costs a list walk only
 *      when the arena is nearly full for that size.
 * The found block is split: the low part is returned, the remainder (always a
 * multiple of align) goes back to the lists. free() coalesces with free
 * physical neighbours at once, so there are never two adjacent free blocks
 * and freeing everything leaves one block covering the usable range.
 *
 * Node layout is 32 bytes. The block state lives in free_prev: a real link
 * (or NIL) while the block is free, KVP_OA_TAG_USED while it is allocated and
 * KVP_OA_TAG_SPARE while the node is on the spare list (then free_next links
 * the spare list). Node indices therefore stay below KVP_OA_TAG_SPARE.
 *
 * A size that is not a multiple of align leaves a tail of size % align bytes
 * that no aligned block can use; size < align is rejected at create.
 *
 * Thread: not thread-safe; the master's loop thread owns every allocator.
 *
 * Invariants: physical neighbours tile [0, usable) in offset order; no two
 * physically adjacent blocks are both free; every free block is on exactly
 * the list of its size class and that class's bits are set; used and count
 * sum the allocated blocks.
 */
#include "common/offset_alloc.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define KVP_OA_SL_LOG2 5u
#define KVP_OA_SL_COUNT (1u << KVP_OA_SL_LOG2)
/* units < 2^64: first level index goes up to 63 - SL_LOG2 + 1 */
#define KVP_OA_FL_COUNT (64u - KVP_OA_SL_LOG2 + 1u)

#define KVP_OA_NIL UINT32_MAX
#define KVP_OA_TAG_USED (UINT32_MAX - 1u)
#define KVP_OA_TAG_SPARE (UINT32_MAX - 2u)
#define KVP_OA_MAX_NODES KVP_OA_TAG_SPARE
#define KVP_OA_INIT_NODES 64u

_Static_assert(KVP_OA_NIL == KVP_OFFSET_ALLOC_NO_HANDLE, "no handle must be the nil index");

typedef struct kvp_oa_node {
    uint64_t offset;
    uint64_t size;
    uint32_t phys_prev; /* node of the block just below, or NIL */
    uint32_t phys_next; /* node of the block just above, or NIL */
    uint32_t free_prev; /* free-list link or NIL while free; else a KVP_OA_TAG_* */
    uint32_t free_next; /* free-list link while free; spare-list link while spare */
} kvp_oa_node_t;

_Static_assert(sizeof(kvp_oa_node_t) == 32, "node must stay 32 bytes");

struct kvp_offset_alloc {
    kvp_oa_node_t *nodes;
    uint32_t nodes_cap;  /* entries allocated */
    uint32_t nodes_len;  /* entries ever used (high-water mark) */
    uint32_t spare_head; /* first reusable node, or NIL */
    uint32_t hint;       /* kvp_offset_alloc_reserve: the block its last call left free above */
    unsigned align_shift;
    uint64_t size;   /* as given to create */
    uint64_t usable; /* size rounded down to align */
    uint64_t used;
    uint64_t count;
    uint64_t fl_map;
    uint32_t sl_map[KVP_OA_FL_COUNT];
    uint32_t heads[KVP_OA_FL_COUNT][KVP_OA_SL_COUNT];
};

static inline bool kvp_oa_node_is_free(const kvp_oa_node_t *node)
{
    return node->free_prev != KVP_OA_TAG_USED && node->free_prev != KVP_OA_TAG_SPARE;
}

/* Size class of a block of `units` (>= 1) units. */
static inline void kvp_oa_mapping(uint64_t units, unsigned *fl_p, unsigned *sl_p)
{
    if (units < KVP_OA_SL_COUNT) {
        *fl_p = 0;
        *sl_p = (unsigned)units;
        return;
    }
    unsigned log2 = 63u - (unsigned)__builtin_clzll(units);
    *fl_p = log2 - KVP_OA_SL_LOG2 + 1u;
    *sl_p = (unsigned)(units >> (log2 - KVP_OA_SL_LOG2)) - KVP_OA_SL_COUNT;
}

/*
 * Round `units` up to the lower bound of the next class, so that every block in
 * the class of the result holds `units`. False on overflow (then only the
 * fallback scan can serve the request).
 */
static inline bool kvp_oa_round_up(uint64_t units, uint64_t *rounded_p)
{
    if (units < KVP_OA_SL_COUNT) {
        *rounded_p = units;
        return true;
    }
    unsigned log2 = 63u - (unsigned)__builtin_clzll(units);
    uint64_t step = (UINT64_C(1) << (log2 - KVP_OA_SL_LOG2)) - 1u;
    return !__builtin_add_overflow(units, step, rounded_p);
}

static void kvp_oa_list_insert(kvp_offset_alloc_t *alloc, uint32_t idx)
{
    kvp_oa_node_t *node = &alloc->nodes[idx];
    unsigned fl, sl;
    kvp_oa_mapping(node->size >> alloc->align_shift, &fl, &sl);

    uint32_t head = alloc->heads[fl][sl];
    node->free_prev = KVP_OA_NIL;
    node->free_next = head;
    if (head != KVP_OA_NIL)
        alloc->nodes[head].free_prev = idx;
    alloc->heads[fl][sl] = idx;
    alloc->fl_map |= UINT64_C(1) << fl;
    alloc->sl_map[fl] |= 1u << sl;
}

/* Unlinks a free block from its list and marks it used. */
static void kvp_oa_list_remove(kvp_offset_alloc_t *alloc, uint32_t idx)
{
    kvp_oa_node_t *node = &alloc->nodes[idx];
    uint32_t prev = node->free_prev;
    uint32_t next = node->free_next;

    if (next != KVP_OA_NIL)
        alloc->nodes[next].free_prev = prev;
    if (prev != KVP_OA_NIL) {
        alloc->nodes[prev].free_next = next;
    } else {
        unsigned fl, sl;
        kvp_oa_mapping(node->size >> alloc->align_shift, &fl, &sl);
        alloc->heads[fl][sl] = next;
        if (next == KVP_OA_NIL) {
            alloc->sl_map[fl] &= ~(1u << sl);
            if (alloc->sl_map[fl] == 0)
                alloc->fl_map &= ~(UINT64_C(1) << fl);
        }
    }
    node->free_prev = KVP_OA_TAG_USED;
    node->free_next = KVP_OA_NIL;
}

/* Makes sure kvp_oa_node_take() can succeed; may move the node array. */
static kvp_status_t kvp_oa_node_reserve(kvp_offset_alloc_t *alloc)
{
    if (alloc->spare_head != KVP_OA_NIL || alloc->nodes_len < alloc->nodes_cap)
        return KVP_OK;
    if (alloc->nodes_cap >= KVP_OA_MAX_NODES)
        return KVP_ERR_NOMEM;

    uint32_t new_cap =
        alloc->nodes_cap > KVP_OA_MAX_NODES / 2u ? KVP_OA_MAX_NODES : alloc->nodes_cap * 2u;
#if SIZE_MAX / 32u < UINT32_MAX /* 32-bit size_t: the byte count may not fit */
    if (new_cap > SIZE_MAX / sizeof(kvp_oa_node_t))
        return KVP_ERR_NOMEM;
#endif
    kvp_oa_node_t *nodes = realloc(alloc->nodes, (size_t)new_cap * sizeof(kvp_oa_node_t));
    if (nodes == NULL)
        return KVP_ERR_NOMEM;
    alloc->nodes = nodes;
    alloc->nodes_cap = new_cap;
    return KVP_OK;
}

/* Only after a successful kvp_oa_node_reserve(). */
static uint32_t kvp_oa_node_take(kvp_offset_alloc_t *alloc)
{
    uint32_t idx = alloc->spare_head;
    if (idx != KVP_OA_NIL) {
        alloc->spare_head = alloc->nodes[idx].free_next;
        return idx;
    }
    return alloc->nodes_len++;
}

static void kvp_oa_node_put(kvp_offset_alloc_t *alloc, uint32_t idx)
{
    kvp_oa_node_t *node = &alloc->nodes[idx];
    node->free_prev = KVP_OA_TAG_SPARE;
    node->free_next = alloc->spare_head;
    alloc->spare_head = idx;
}

/* A free block of at least `units` units, or NIL. */
static uint32_t kvp_oa_find(const kvp_offset_alloc_t *alloc, uint64_t units)
{
    unsigned fl, sl;
    uint64_t rounded;

    if (kvp_oa_round_up(units, &rounded)) {
        kvp_oa_mapping(rounded, &fl, &sl);
        uint32_t sl_bits = alloc->sl_map[fl] & (~0u << sl);
        if (sl_bits == 0 && fl + 1u < 64u) {
            uint64_t fl_bits = alloc->fl_map & (~UINT64_C(0) << (fl + 1u));
            if (fl_bits != 0) {
                fl = (unsigned)__builtin_ctzll(fl_bits);
                sl_bits = alloc->sl_map[fl];
            }
        }
        if (sl_bits != 0)
            return alloc->heads[fl][__builtin_ctz(sl_bits)];
    }

    /* Class rounding skipped the request's own class: look for a fit in it. */
    uint64_t len = units << alloc->align_shift;
    kvp_oa_mapping(units, &fl, &sl);
    for (uint32_t idx = alloc->heads[fl][sl]; idx != KVP_OA_NIL;
         idx = alloc->nodes[idx].free_next) {
        if (alloc->nodes[idx].size >= len)
            return idx;
    }
    return KVP_OA_NIL;
}

kvp_status_t kvp_offset_alloc_create(uint64_t size, uint64_t align, kvp_offset_alloc_t **alloc_p)
{
    if (alloc_p == NULL || size == 0 || align == 0 || (align & (align - 1u)) != 0 || size < align)
        return KVP_ERR_INVALID_ARG;

    kvp_offset_alloc_t *alloc = calloc(1, sizeof(*alloc));
    if (alloc == NULL)
        return KVP_ERR_NOMEM;

    alloc->nodes = malloc(KVP_OA_INIT_NODES * sizeof(kvp_oa_node_t));
    if (alloc->nodes == NULL)
        goto err_free_alloc;

    alloc->nodes_cap = KVP_OA_INIT_NODES;
    alloc->spare_head = KVP_OA_NIL;
    alloc->align_shift = (unsigned)__builtin_ctzll(align);
    alloc->size = size;
    alloc->usable = size & ~(align - 1u);
    memset(alloc->heads, 0xff, sizeof(alloc->heads)); /* every head NIL */

    uint32_t idx = kvp_oa_node_take(alloc);
    kvp_oa_node_t *node = &alloc->nodes[idx];
    node->offset = 0;
    node->size = alloc->usable;
    node->phys_prev = KVP_OA_NIL;
    node->phys_next = KVP_OA_NIL;
    kvp_oa_list_insert(alloc, idx);

    *alloc_p = alloc;
    return KVP_OK;

err_free_alloc:
    free(alloc);
    return KVP_ERR_NOMEM;
}

void kvp_offset_alloc_destroy(kvp_offset_alloc_t *alloc)
{
    if (alloc == NULL)
        return;
    free(alloc->nodes);
    free(alloc);
}

kvp_status_t kvp_offset_alloc_alloc(kvp_offset_alloc_t *alloc, uint64_t len, uint64_t *offset_p,
                                    uint32_t *handle_p)
{
    if (alloc == NULL || offset_p == NULL || handle_p == NULL || len == 0 || len > alloc->size)
        return KVP_ERR_INVALID_ARG;
    if (len > alloc->usable)
        return KVP_ERR_POOL_FULL;

    /* usable <= 2^64 - align, so this cannot overflow */
    uint64_t mask = (UINT64_C(1) << alloc->align_shift) - 1u;
    len = (len + mask) & ~mask;

    uint32_t idx = kvp_oa_find(alloc, len >> alloc->align_shift);
    if (idx == KVP_OA_NIL)
        return KVP_ERR_POOL_FULL;

    bool split = alloc->nodes[idx].size > len;
    if (split) {
        /* Before touching any list: growth may fail, and it moves the array. */
        kvp_status_t status = kvp_oa_node_reserve(alloc);
        if (status != KVP_OK)
            return status;
    }

    kvp_oa_list_remove(alloc, idx);
    if (split) {
        uint32_t rest_idx = kvp_oa_node_take(alloc);
        kvp_oa_node_t *node = &alloc->nodes[idx];
        kvp_oa_node_t *rest = &alloc->nodes[rest_idx];

        rest->offset = node->offset + len;
        rest->size = node->size - len;
        rest->phys_prev = idx;
        rest->phys_next = node->phys_next;
        if (node->phys_next != KVP_OA_NIL)
            alloc->nodes[node->phys_next].phys_prev = rest_idx;
        node->phys_next = rest_idx;
        node->size = len;
        kvp_oa_list_insert(alloc, rest_idx);
    }

    alloc->used += len;
    alloc->count++;
    *offset_p = alloc->nodes[idx].offset;
    *handle_p = idx;
    return KVP_OK;
}

void kvp_offset_alloc_free(kvp_offset_alloc_t *alloc, uint32_t handle)
{
    /* A handle that is not an allocated block (never was, already freed) is ignored. */
    if (alloc == NULL || handle >= alloc->nodes_len ||
        alloc->nodes[handle].free_prev != KVP_OA_TAG_USED)
        return;

    kvp_oa_node_t *nodes = alloc->nodes;
    uint32_t idx = handle;
    alloc->used -= nodes[idx].size;
    alloc->count--;

    uint32_t prev = nodes[idx].phys_prev;
    if (prev != KVP_OA_NIL && kvp_oa_node_is_free(&nodes[prev])) {
        kvp_oa_list_remove(alloc, prev);
        nodes[prev].size += nodes[idx].size;
        nodes[prev].phys_next = nodes[idx].phys_next;
        if (nodes[idx].phys_next != KVP_OA_NIL)
            nodes[nodes[idx].phys_next].phys_prev = prev;
        kvp_oa_node_put(alloc, idx);
        idx = prev;
    }

    uint32_t next = nodes[idx].phys_next;
    if (next != KVP_OA_NIL && kvp_oa_node_is_free(&nodes[next])) {
        kvp_oa_list_remove(alloc, next);
        nodes[idx].size += nodes[next].size;
        nodes[idx].phys_next = nodes[next].phys_next;
        if (nodes[next].phys_next != KVP_OA_NIL)
            nodes[nodes[next].phys_next].phys_prev = idx;
        kvp_oa_node_put(alloc, next);
    }

    kvp_oa_list_insert(alloc, idx);
}

/* A node index that is a live block (free or used), or NIL. */
static uint32_t kvp_oa_live(const kvp_offset_alloc_t *alloc, uint32_t idx)
{
    if (idx >= alloc->nodes_len || alloc->nodes[idx].free_prev == KVP_OA_TAG_SPARE)
        return KVP_OA_NIL;
    return idx;
}

kvp_status_t kvp_offset_alloc_reserve(kvp_offset_alloc_t *alloc, uint64_t offset, uint64_t len,
                                      uint32_t *handle_p)
{
    if (alloc == NULL || handle_p == NULL || len == 0)
        return KVP_ERR_INVALID_ARG;
    uint64_t mask = (UINT64_C(1) << alloc->align_shift) - 1u;
    if ((offset & mask) != 0 || offset >= alloc->usable || len > alloc->usable - offset)
        return KVP_ERR_INVALID_ARG;
    len = (len + mask) & ~mask;
    if (len > alloc->usable - offset)
        return KVP_ERR_INVALID_ARG;
    /* the block holding offset: from the hint when it lies below (ascending calls: O(1)),
     * else from the lowest block */
    uint32_t idx = kvp_oa_live(alloc, alloc->hint);
    if (idx == KVP_OA_NIL || alloc->nodes[idx].offset > offset) {
        idx = kvp_oa_live(alloc, 0);
        if (idx == KVP_OA_NIL)
            return KVP_ERR_INTERNAL;
        while (alloc->nodes[idx].phys_prev != KVP_OA_NIL)
            idx = alloc->nodes[idx].phys_prev;
    }
    while (idx != KVP_OA_NIL && alloc->nodes[idx].offset + alloc->nodes[idx].size <= offset)
        idx = alloc->nodes[idx].phys_next;
    if (idx == KVP_OA_NIL || !kvp_oa_node_is_free(&alloc->nodes[idx]) ||
        alloc->nodes[idx].offset + alloc->nodes[idx].size < offset + len)
        return KVP_ERR_EXISTS; /* part of the range is allocated */
    /* two spare nodes before touching any list (growth may move the array) */
    if (kvp_oa_node_reserve(alloc) != KVP_OK)
        return KVP_ERR_NOMEM;
    uint32_t spare1 = kvp_oa_node_take(alloc);
    kvp_status_t st = kvp_oa_node_reserve(alloc);
    kvp_oa_node_put(alloc, spare1);
    if (st != KVP_OK)
        return KVP_ERR_NOMEM;

    kvp_oa_list_remove(alloc, idx);
    kvp_oa_node_t *node = &alloc->nodes[idx];
    if (node->offset < offset) {
        /* the part below stays free in node idx; the range gets a node of its own */
        uint32_t r = kvp_oa_node_take(alloc);
        node = &alloc->nodes[idx];
        kvp_oa_node_t *rn = &alloc->nodes[r];
        rn->offset = offset;
        rn->size = node->offset + node->size - offset;
        rn->phys_prev = idx;
        rn->phys_next = node->phys_next;
        if (node->phys_next != KVP_OA_NIL)
            alloc->nodes[node->phys_next].phys_prev = r;
        node->phys_next = r;
        node->size = offset - node->offset;
        kvp_oa_list_insert(alloc, idx);
        idx = r;
        node = rn;
        node->free_prev = KVP_OA_TAG_USED;
        node->free_next = KVP_OA_NIL;
    }
    alloc->hint = idx;
    if (node->size > len) {
        uint32_t t = kvp_oa_node_take(alloc);
        node = &alloc->nodes[idx];
        kvp_oa_node_t *tn = &alloc->nodes[t];
        tn->offset = offset + len;
        tn->size = node->size - len;
        tn->phys_prev = idx;
        tn->phys_next = node->phys_next;
        if (node->phys_next != KVP_OA_NIL)
            alloc->nodes[node->phys_next].phys_prev = t;
        node->phys_next = t;
        node->size = len;
        kvp_oa_list_insert(alloc, t);
        alloc->hint = t;
    }
    alloc->used += len;
    alloc->count++;
    *handle_p = idx;
    return KVP_OK;
}

uint64_t kvp_offset_alloc_used(const kvp_offset_alloc_t *alloc)
{
    return alloc->used;
}

uint64_t kvp_offset_alloc_size(const kvp_offset_alloc_t *alloc)
{
    return alloc->size;
}

/* Exact: every block of the highest non-empty class is larger than any below it. */
uint64_t kvp_offset_alloc_largest_free(const kvp_offset_alloc_t *alloc)
{
    if (alloc->fl_map == 0)
        return 0;

    unsigned fl = 63u - (unsigned)__builtin_clzll(alloc->fl_map);
    unsigned sl = 31u - (unsigned)__builtin_clz(alloc->sl_map[fl]);
    uint64_t largest = 0;
    for (uint32_t idx = alloc->heads[fl][sl]; idx != KVP_OA_NIL;
         idx = alloc->nodes[idx].free_next) {
        if (alloc->nodes[idx].size > largest)
            largest = alloc->nodes[idx].size;
    }
    return largest;
}

uint64_t kvp_offset_alloc_count(const kvp_offset_alloc_t *alloc)
{
    return alloc->count;
}
