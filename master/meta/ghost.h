/*
 * ghost.h - keys evicted lately, and from which list (see ghost.c): two
 * Bloom filters, inserts go to the current one, lookups ask both.
 */
#ifndef KVP_MASTER_META_GHOST_H
#define KVP_MASTER_META_GHOST_H

#include <stdbool.h>
#include <stdint.h>

/* Which list a remembered victim left (the eviction policy's two ghosts in one filter). */
#define KVP_GHOST_PROBATION 0u
#define KVP_GHOST_PROTECTED 1u

typedef struct kvp_ghost {
    uint64_t *bits[2];
    uint64_t mask[2]; /* bits per filter - 1 (a power of two - 1) */
    uint64_t n[2][2]; /* keys per filter and kind */
    uint64_t cap;     /* keys the current filter takes before the next rotation */
    unsigned cur;
} kvp_ghost_t;

/* Is the key with this hash among the recently evicted ones of this kind? */
bool kvp_ghost_has(const kvp_ghost_t *g, uint64_t hash, unsigned kind);
/* Remember an evicted key of a kind; `resident`: objects stored now (sizes the next filter). */
void kvp_ghost_add(kvp_ghost_t *g, uint64_t hash, unsigned kind, uint64_t resident);
/* About how many keys of a kind it remembers now. */
uint64_t kvp_ghost_size(const kvp_ghost_t *g, unsigned kind);
void kvp_ghost_cleanup(kvp_ghost_t *g);

#endif
