/*
 * ghost.h - keys evicted lately (see ghost.c): two Bloom filters, inserts
 * go to the current one, lookups ask both.
 */
#ifndef KVP_MASTER_META_GHOST_H
#define KVP_MASTER_META_GHOST_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kvp_ghost {
    uint64_t *bits[2];
    uint64_t mask[2]; /* bits per filter - 1 (a power of two - 1) */
    uint64_t n_cur;   /* keys in bits[cur] */
    uint64_t cap;
    unsigned cur;
} kvp_ghost_t;

/* Is the key with this hash among the recently evicted ones? */
bool kvp_ghost_has(const kvp_ghost_t *g, uint64_t hash);
/* Remember an evicted key; `resident`: objects stored now (sizes the next filter). */
void kvp_ghost_add(kvp_ghost_t *g, uint64_t hash, uint64_t resident);
void kvp_ghost_cleanup(kvp_ghost_t *g);

#endif
