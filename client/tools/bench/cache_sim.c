/*
 * cache_sim.c - the reference caches (see cache_sim.h): an exact LRU over
 * arrays indexed by dense block, and Belady's MIN with an indexed max-heap.
 *
 * Thread: any; no state outside the structures the caller passes.
 */
#include "client/tools/bench/cache_sim.h"

#include <stdlib.h>
#include <string.h>

/* ---------------- exact LRU ---------------- */

int kvp_bench_lru_init(kvp_bench_lru_t *l, size_t n_blocks, size_t cap)
{
    l->prev = malloc(n_blocks * sizeof(*l->prev));
    l->next = malloc(n_blocks * sizeof(*l->next));
    l->in = calloc(n_blocks, 1);
    l->head = l->tail = KVP_BENCH_NIL;
    l->count = 0;
    l->cap = cap;
    l->n_blocks = n_blocks;
    return l->prev && l->next && l->in ? 0 : -1;
}

void kvp_bench_lru_cleanup(kvp_bench_lru_t *l)
{
    free(l->prev);
    free(l->next);
    free(l->in);
}

void kvp_bench_lru_reset(kvp_bench_lru_t *l)
{
    l->head = l->tail = KVP_BENCH_NIL;
    l->count = 0;
    memset(l->in, 0, l->n_blocks);
}

void kvp_bench_lru_unlink(kvp_bench_lru_t *l, uint32_t b)
{
    if (l->prev[b] != KVP_BENCH_NIL)
        l->next[l->prev[b]] = l->next[b];
    else
        l->head = l->next[b];
    if (l->next[b] != KVP_BENCH_NIL)
        l->prev[l->next[b]] = l->prev[b];
    else
        l->tail = l->prev[b];
    l->in[b] = 0;
    l->count--;
}

void kvp_bench_lru_push_mru(kvp_bench_lru_t *l, uint32_t b)
{
    l->prev[b] = KVP_BENCH_NIL;
    l->next[b] = l->head;
    if (l->head != KVP_BENCH_NIL)
        l->prev[l->head] = b;
    else
        l->tail = b;
    l->head = b;
    l->in[b] = 1;
    l->count++;
}

void kvp_bench_lru_touch(kvp_bench_lru_t *l, uint32_t b)
{
    if (l->head == b)
        return;
    kvp_bench_lru_unlink(l, b);
    kvp_bench_lru_push_mru(l, b);
}

size_t kvp_bench_lru_prefix(const kvp_bench_lru_t *l, const uint32_t *blk, size_t n)
{
    size_t p = 0;
    while (p < n && l->in[blk[p]])
        p++;
    return p;
}

/* ---------------- Belady's MIN ---------------- */

#define NEVER SIZE_MAX /* next reference of a block that is not referenced again */

typedef struct belady {
    uint32_t *heap; /* resident blocks, a max-heap on key[] */
    uint32_t *pos;  /* per block: its index in heap[], KVP_BENCH_NIL when not resident */
    size_t *key;    /* per block: position of its next reference */
    size_t n, cap;
} belady_t;

static void belady_swap(belady_t *h, size_t i, size_t j)
{
    uint32_t a = h->heap[i], b = h->heap[j];
    h->heap[i] = b;
    h->heap[j] = a;
    h->pos[b] = (uint32_t)i;
    h->pos[a] = (uint32_t)j;
}

static void belady_up(belady_t *h, size_t i)
{
    while (i > 0 && h->key[h->heap[(i - 1) / 2]] < h->key[h->heap[i]]) {
        belady_swap(h, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void belady_down(belady_t *h, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && h->key[h->heap[l]] > h->key[h->heap[m]])
            m = l;
        if (r < h->n && h->key[h->heap[r]] > h->key[h->heap[m]])
            m = r;
        if (m == i)
            return;
        belady_swap(h, i, m);
        i = m;
    }
}

int kvp_bench_belady_hits(const uint32_t *blks, const size_t *off, size_t n_req, size_t n_blocks,
                          size_t cap, uint64_t *hits_p)
{
    size_t n_refs = off[n_req];
    belady_t h = {.cap = cap};
    size_t *next = malloc((n_refs ? n_refs : 1) * sizeof(*next));
    h.heap = malloc(cap * sizeof(*h.heap));
    h.pos = malloc(n_blocks * sizeof(*h.pos));
    h.key = malloc(n_blocks * sizeof(*h.key));
    int rc = -1;
    if (next == NULL || h.heap == NULL || h.pos == NULL || h.key == NULL)
        goto out;
    /* next[i]: the position of the next reference of blks[i], from a backward pass
     * (key[] holds each block's latest-seen position meanwhile) */
    for (size_t b = 0; b < n_blocks; b++) {
        h.key[b] = NEVER;
        h.pos[b] = KVP_BENCH_NIL;
    }
    for (size_t i = n_refs; i-- > 0;) {
        next[i] = h.key[blks[i]];
        h.key[blks[i]] = i;
    }
    uint64_t hits = 0;
    for (size_t q = 0; q < n_req; q++) {
        size_t lo = off[q], hi = off[q + 1], p = lo;
        while (p < hi && h.pos[blks[p]] != KVP_BENCH_NIL)
            p++;
        hits += p - lo;
        for (size_t i = lo; i < hi; i++) {
            uint32_t b = blks[i];
            if (h.pos[b] != KVP_BENCH_NIL) {
                h.key[b] = next[i]; /* later than before: the block moves up */
                belady_up(&h, h.pos[b]);
                continue;
            }
            if (h.n == h.cap) { /* evict the block referenced furthest in the future */
                uint32_t v = h.heap[0];
                belady_swap(&h, 0, --h.n);
                h.pos[v] = KVP_BENCH_NIL;
                belady_down(&h, 0);
            }
            h.key[b] = next[i];
            h.heap[h.n] = b;
            h.pos[b] = (uint32_t)h.n++;
            belady_up(&h, h.pos[b]);
        }
    }
    *hits_p = hits;
    rc = 0;
out:
    free(next);
    free(h.heap);
    free(h.pos);
    free(h.key);
    return rc;
}
