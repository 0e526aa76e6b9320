/*
 * ghost.c - keys evicted lately, in a pair of Bloom filters.
 *
 * Design: inserts go to the current filter, lookups ask both; when the
 * current one has taken `cap` keys the older one is cleared and becomes
 * current, sized for GHOST_ROUNDS x the objects resident then. So the ghost
 * remembers the last cap..2*cap evictions, at about 10 bits per key. The
 * eviction policy keeps two ghosts in it, one per list a victim left: a
 * key of kind 1 is inserted as (hash ^ GHOST_KIND_SALT), so one lookup per
 * kind tells them apart, and both cover the same span of evictions (the
 * same stretch of time), which the policy's comparison of their hits needs
 * (policy/lists.c). Per filter it counts the keys of each kind. A
 * blocked filter: every probe of a key falls in one 64-byte block, so a
 * lookup or an insert touches one cache line per filter. Out of memory
 * only makes it forget.
 *
 * Thread: master loop only.
 */
#include "master/meta/ghost.h"

#include <stdlib.h>
#include <string.h>

/* The ghost remembers between GHOST_ROUNDS and twice that many x resident objects. */
#define GHOST_ROUNDS 1
#define GHOST_MIN_KEYS 1024
#define GHOST_BITS_PER_KEY 10
#define GHOST_PROBES 4

/* Bit i of a key: a blocked Bloom filter, every probe of a key in one 64-byte block, so a
 * lookup or an insert touches one cache line per filter. */
static uint64_t ghost_probe(uint64_t hash, unsigned i, uint64_t mask)
{
    uint64_t block = ((hash * 0x9E3779B97F4A7C15ull) >> 32) & (mask >> 9);
    uint64_t y = (hash ^ (hash >> 29)) * 0xBF58476D1CE4E5B9ull;
    return block << 9 | ((y >> (9 * i)) & 511);
}

/* A kind-1 key is a different key to the filter. */
#define GHOST_KIND_SALT 0x5851f42d4c957f2dull

bool kvp_ghost_has(const kvp_ghost_t *g, uint64_t hash, unsigned kind)
{
    if (kind != 0)
        hash ^= GHOST_KIND_SALT;
    for (unsigned f = 0; f < 2; f++) {
        if (g->bits[f] == NULL)
            continue;
        unsigned hit = 0;
        for (unsigned i = 0; i < GHOST_PROBES; i++) {
            uint64_t b = ghost_probe(hash, i, g->mask[f]);
            hit += (g->bits[f][b >> 6] >> (b & 63)) & 1;
        }
        if (hit == GHOST_PROBES)
            return true;
    }
    return false;
}

/* (Re)size the filter that becomes current for `keys` keys; false: out of memory. */
static bool ghost_rotate(kvp_ghost_t *g, uint64_t keys)
{
    unsigned next = g->bits[g->cur] == NULL ? g->cur : g->cur ^ 1;
    uint64_t bits = 512; /* one block at least */
    while (bits < keys * GHOST_BITS_PER_KEY)
        bits *= 2;
    uint64_t *b = aligned_alloc(64, bits / 8); /* blocks on cache lines */
    if (b == NULL)
        return false;
    memset(b, 0, bits / 8);
    free(g->bits[next]);
    g->bits[next] = b;
    g->mask[next] = bits - 1;
    g->cur = next;
    g->cap = keys;
    g->n[next][0] = g->n[next][1] = 0;
    return true;
}

void kvp_ghost_add(kvp_ghost_t *g, uint64_t hash, unsigned kind, uint64_t resident)
{
    unsigned cur = g->cur;
    if (g->bits[cur] == NULL || g->n[cur][0] + g->n[cur][1] >= g->cap) {
        uint64_t keys = resident * GHOST_ROUNDS;
        if (!ghost_rotate(g, keys < GHOST_MIN_KEYS ? GHOST_MIN_KEYS : keys))
            return; /* no memory: this victim is forgotten, nothing else changes */
    }
    kind = kind != 0;
    if (kind)
        hash ^= GHOST_KIND_SALT;
    for (unsigned i = 0; i < GHOST_PROBES; i++) {
        uint64_t b = ghost_probe(hash, i, g->mask[g->cur]);
        g->bits[g->cur][b >> 6] |= 1ull << (b & 63);
    }
    g->n[g->cur][kind]++;
}

uint64_t kvp_ghost_size(const kvp_ghost_t *g, unsigned kind)
{
    kind = kind != 0;
    return g->n[0][kind] + g->n[1][kind];
}

void kvp_ghost_cleanup(kvp_ghost_t *g)
{
    free(g->bits[0]);
    free(g->bits[1]);
    *g = (kvp_ghost_t){0};
}
