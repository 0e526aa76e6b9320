/*
 * cache_sim.h - the reference caches hit rates are measured against: an exact
 * LRU and Belady's offline MIN, over dense block numbers 0..n_blocks-1 (a trace's
 * hash ids interned in order of first use). kvpool-bench trace reports both
 * beside the store's hit rate; the master's eviction test
 * (tests/unit/master/policy/test_eviction.c) checks the store against the LRU and its
 * simulator build prints all three. Plain C on arrays, no library: any thread,
 * one caller per structure.
 */
#ifndef KVP_BENCH_CACHE_SIM_H
#define KVP_BENCH_CACHE_SIM_H

#include <stddef.h>
#include <stdint.h>

#define KVP_BENCH_NIL UINT32_MAX /* no block: the ends of the LRU list */

/*
 * An exact LRU: a doubly linked list threaded through arrays indexed by block
 * (the hash map + list of an exact LRU, with the lookups done once, at interning).
 * The fields are read by the callers (in[b]: resident; tail: the next victim);
 * they change it only through the functions below. Evicting is the caller's
 * (kvp_bench_lru_unlink of tail while count >= cap): what a victim means differs.
 */
typedef struct kvp_bench_lru {
    uint32_t *prev, *next; /* per block: towards MRU / towards LRU */
    uint8_t *in;           /* per block: resident */
    uint32_t head, tail;   /* MRU, LRU; KVP_BENCH_NIL when empty */
    size_t count, cap, n_blocks;
} kvp_bench_lru_t;

/* An empty LRU of `cap` blocks (its arrays malloc'd for n_blocks). 0, or -1 when out of
 * memory (then kvp_bench_lru_cleanup still frees what was allocated). */
int kvp_bench_lru_init(kvp_bench_lru_t *l, size_t n_blocks, size_t cap);
void kvp_bench_lru_cleanup(kvp_bench_lru_t *l);
/* Empty it (cap unchanged). */
void kvp_bench_lru_reset(kvp_bench_lru_t *l);
/* Take resident block b out. */
void kvp_bench_lru_unlink(kvp_bench_lru_t *l, uint32_t b);
/* Insert block b (not resident) as the MRU; no eviction. */
void kvp_bench_lru_push_mru(kvp_bench_lru_t *l, uint32_t b);
/* Make resident block b the MRU. */
void kvp_bench_lru_touch(kvp_bench_lru_t *l, uint32_t b);
/* How many of blk[0..n) are resident before the first one that is not: a request's
 * prefix hits. */
size_t kvp_bench_lru_prefix(const kvp_bench_lru_t *l, const uint32_t *blk, size_t n);

/*
 * Prefix hits of requests 0..n_req-1 (request q: blks[off[q] .. off[q + 1])) under
 * Belady's MIN with `cap` blocks (cap > 0): per request its prefix of resident blocks
 * counts, then every block of it is accessed in order; each accessed block is inserted,
 * and when full the resident block whose next reference is furthest in the future (or
 * that is never referenced again) is evicted. Next references are precomputed over the
 * flattened reference string and the resident set is an indexed max-heap: O(n log n).
 * 0 with the hits in *hits_p, or -1 when out of memory.
 */
int kvp_bench_belady_hits(const uint32_t *blks, const size_t *off, size_t n_req, size_t n_blocks,
                          size_t cap, uint64_t *hits_p);

#endif
