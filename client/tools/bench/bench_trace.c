/*
 * bench_trace.c - kvpool-bench trace: replay a FAST'25 Mooncake trace against
 * the real store and compare its prefix hit rate with an exact LRU and with
 * Belady's offline optimum of the same capacity.
 *
 * DESIGN
 * Input is JSONL, one request a line, each an object read with the project's
 * JSON reader (common/json.h); only its `hash_ids` array and `timestamp` are
 * used (other fields may come in any order). A line that is not an object
 * with an array of non-negative integers there is skipped and counted.
 * Each hash id is one KV block of o->block_bytes bytes, stored under the vLLM-like key
 * "trace@tp_rank:0@pp_rank:0@group:0@<id>". While loading, hash ids are interned into dense block
 * numbers 0..U-1 (an open-addressing hash map); everything after that is indexed by the dense
 * number, so each LRU (cache_sim.c) is a doubly linked list threaded through
 * arrays indexed by block (the hash map + list of an exact LRU, map lookups done
 * once).
 *
 * Per request, as a serving engine would: batch_is_exist over its keys gives
 * the cached prefix P; the P prefix blocks are read with batch_get_into and
 * verified (first 16 and last 8 bytes encode the hash id; the store's CRC
 * covers the rest); the blocks the store lacks are written with
 * batch_put_from, in request order. Calls carry at most 128 keys. The hit
 * rate is the sum of prefix hits over the total block references.
 *
 * Eviction "store" (the default): for each capacity point the pool is one
 * segment of exactly capacity_blocks x block_bytes (rounded up to the
 * master's 64-byte extent granularity), empty when the point starts: with
 * --local a fresh master (its default settings) and segment per point, the
 * replay starting once the master's rebuild grace is over (2 s from its
 * start: meanwhile a put into a full pool waits instead of evicting),
 * otherwise the given master's pool must already be empty and of that size.
 * The master's eviction decides what stays; the bench removes nothing. A key
 * that exist reported but that the get then finds NOT_FOUND (evicted in
 * between) ends the prefix there (`get_raced`) and is written again; a put
 * answered EXISTS is fine (`put_exists`; with --trace-clients, PENDING too: another
 * client is writing that block). Every other failure (a put refused
 * with POOL_FULL, wrong bytes, a transport error) is an error.
 *
 * Tiers (--ssd-capacity F, store eviction with --local only): the point's
 * segment server also mounts an SSD segment of F x unique blocks (each block
 * rounded up to 4 KiB, the SSD extent granularity), its file in --ssd-dir
 * (removed after); the master has its default tier settings (offload at
 * 0.95/0.90, promote on hit). The master's counters before and after the
 * point give the hits per tier (hits_dram, hits_ssd: objects gets found
 * with a DRAM replica / on SSD only), offloaded, promoted, dropped and
 * SSD-evicted objects. The LRU and Belady references then have the capacity
 * of both tiers together.
 *
 * Eviction "client-lru" (a reference): the bench is the cache policy. It
 * tracks what it stored in an exact LRU limited to capacity_blocks and removes
 * LRU victims from the store before writing new blocks; a put refused with
 * KVP_ERR_POOL_FULL removes more LRU victims and is retried.
 *
 * References, computed in the bench without the store over the same requests
 * (prefix hits per request, then every block of the request accessed in
 * order): `lru_hit_rate`, an exact LRU of capacity_blocks; `belady_hit_rate`,
 * Belady's MIN of capacity_blocks (every accessed block is inserted; when full
 * the resident block whose next reference is furthest in the future, or that
 * is never referenced again, is evicted; next references are precomputed over
 * the flattened reference string and the resident set is an indexed max-heap,
 * O(n log n)). Both are cache_sim.c's, shared with the master's eviction test.
 *
 * Pace (--pace LIST): each capacity point is replayed once per pace; 0
 * (the default) sends each request as soon as the one before is done, X > 0
 * sends request q no earlier than its "timestamp" / X after the start (the
 * trace's own rate sped up X times; a request late already goes at once).
 * Clients (--trace-clients N, store eviction): N threads, each with its own
 * client and buffers (on the point's master), take the requests in trace
 * order from one shared counter, so up to N are in flight together; a put
 * answered PENDING (another client writing the same block) is then fine,
 * like EXISTS. The references stay sequential: with N > 1 and no pace,
 * requests overtake each other (a turn can start before the one before it
 * has written its blocks), which costs hits whatever the policy.
 *
 * The bench holds no block contents beyond two reusable buffers of
 * batch x block_bytes (one for puts, one for gets) per client, registered
 * once. One thread, or the caller's thread and N - 1 more (--trace-clients).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "client/tools/bench/bench.h"
#include "client/tools/bench/cache_sim.h"
#include "common/json.h"

#define TRACE_BATCH 128             /* keys per call */
#define TRACE_BUF_MAX (64ull << 20) /* bytes per buffer: fewer keys per call for huge blocks */
#define TRACE_KEY_LEN 80
#define TRACE_KEY_PREFIX "trace@tp_rank:0@pp_rank:0@group:0@"
#define TRACE_NIL UINT32_MAX
#define TRACE_SALT 0x9e3779b97f4a7c15ull
#define TRACE_MAX_REPORTS 5       /* detailed messages per error kind and capacity point */
#define TRACE_MAX_ERRORS 1000     /* a capacity point stops after this many errors */
#define TRACE_ALIGN 64u           /* the master's extent granularity (KVP_SEGMENT_ALIGN) */
#define TRACE_SSD_ALIGN 4096u     /* an SSD segment's extent granularity */
#define TRACE_SSD_SLOT 65536u     /* an SSD file has one object-table slot per 64 KiB... */
#define TRACE_SSD_MIN_SLOTS 1024u /* ... and at least this many */
#define TRACE_MIN(a, b) ((a) < (b) ? (a) : (b))
/* The master's rebuild grace (KVP_REBUILD_GRACE_MS, master/core/state.h: 2 s) and a margin: a
 * fresh --local pool is replayed only after it (store_pool_open). */
#define TRACE_REBUILD_GRACE_S 2.2

/* ---------------- trace loading ---------------- */

typedef struct trace {
    uint64_t *ids;  /* dense block -> hash id */
    uint64_t *ts;   /* per request: its "timestamp" (ms from the trace's start; 0 when none) */
    uint32_t *blks; /* dense blocks of all requests, concatenated */
    size_t *off;    /* request r is blks[off[r] .. off[r+1]) */
    size_t n_req, n_blks, n_uniq, max_len, malformed;
    /* intern map: hash id -> dense block; slot empty when val == TRACE_NIL */
    uint64_t *map_key;
    uint32_t *map_val;
    size_t map_cap; /* power of two */
} trace_t;

static size_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (size_t)x;
}

int kvp_bench_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 1024;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

static int map_resize(trace_t *t, size_t cap)
{
    uint64_t *k = malloc(cap * sizeof(*k));
    uint32_t *v = malloc(cap * sizeof(*v));
    if (k == NULL || v == NULL) {
        free(k);
        free(v);
        return -1;
    }
    for (size_t i = 0; i < cap; i++)
        v[i] = TRACE_NIL;
    for (size_t i = 0; i < t->map_cap; i++) {
        if (t->map_val[i] == TRACE_NIL)
            continue;
        size_t s = hash_u64(t->map_key[i]) & (cap - 1);
        while (v[s] != TRACE_NIL)
            s = (s + 1) & (cap - 1);
        k[s] = t->map_key[i];
        v[s] = t->map_val[i];
    }
    free(t->map_key);
    free(t->map_val);
    t->map_key = k;
    t->map_val = v;
    t->map_cap = cap;
    return 0;
}

/* Dense block of hash id `id`, added when new; TRACE_NIL when out of memory. */
static uint32_t intern(trace_t *t, uint64_t id, size_t *ids_cap)
{
    if ((t->n_uniq + 1) * 2 > t->map_cap && map_resize(t, t->map_cap ? t->map_cap * 2 : 4096))
        return TRACE_NIL;
    size_t s = hash_u64(id) & (t->map_cap - 1);
    while (t->map_val[s] != TRACE_NIL) {
        if (t->map_key[s] == id)
            return t->map_val[s];
        s = (s + 1) & (t->map_cap - 1);
    }
    if (t->n_uniq >= TRACE_NIL - 1 ||
        kvp_bench_grow((void **)&t->ids, ids_cap, t->n_uniq + 1, sizeof(*t->ids)))
        return TRACE_NIL;
    t->map_key[s] = id;
    t->map_val[s] = (uint32_t)t->n_uniq;
    t->ids[t->n_uniq] = id;
    return (uint32_t)t->n_uniq++;
}

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    return p;
}

/*
 * A line (len bytes) as a request: the integers of its "hash_ids" array into *tmp, its
 * "timestamp" (a non-negative number of ms; 0 when absent or not a number) into *ts_p.
 * Returns their count, or -1 when the line is not a JSON object with such an array.
 */
static long parse_line(const char *line, size_t len, uint64_t **tmp, size_t *tmp_cap,
                       uint64_t *ts_p)
{
    kvp_json_t j;
    char why[96];
    long n = -1;
    if (kvp_json_parse(&j, line, len, why, sizeof(why)) != KVP_JSON_OK)
        goto out;
    int64_t a = kvp_json_get(&j, 0, "hash_ids");
    if (a < 0 || j.t[a].type != KVP_J_ARRAY ||
        kvp_bench_grow((void **)tmp, tmp_cap, j.t[a].size, sizeof(**tmp)))
        goto out;
    for (uint32_t i = 0, e = (uint32_t)a + 1; i < j.t[a].size; i++, e = j.t[e].next)
        if (!kvp_json_u64(&j, e, &(*tmp)[i]))
            goto out;
    n = (long)j.t[a].size;
    *ts_p = 0;
    int64_t t = kvp_json_get(&j, 0, "timestamp");
    if (t >= 0 && j.t[t].type == KVP_J_NUMBER && j.t[t].end - j.t[t].start < 64) {
        char num[64];
        memcpy(num, line + j.t[t].start, j.t[t].end - j.t[t].start);
        num[j.t[t].end - j.t[t].start] = '\0';
        double v = strtod(num, NULL);
        *ts_p = v > 0 ? (uint64_t)v : 0;
    }
out:
    kvp_json_free(&j);
    return n;
}

static void trace_free(trace_t *t)
{
    free(t->ids);
    free(t->ts);
    free(t->blks);
    free(t->off);
    free(t->map_key);
    free(t->map_val);
}

/* Load at most `limit` requests (0: all). Returns 0, or -1 with a message. */
static int trace_load(trace_t *t, const char *path, uint64_t limit)
{
    memset(t, 0, sizeof(*t));
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        fprintf(stderr, "kvpool-bench: trace: cannot open %s: %m\n", path);
        return -1;
    }
    char *line = NULL;
    size_t line_cap = 0, ids_cap = 0, blks_cap = 0, off_cap = 0, tmp_cap = 0, lineno = 0;
    size_t ts_cap = 0;
    uint64_t *tmp = NULL;
    int rc = -1;
    ssize_t len;
    if (kvp_bench_grow((void **)&t->off, &off_cap, 1, sizeof(*t->off)))
        goto out;
    t->off[0] = 0;
    while ((limit == 0 || t->n_req < limit) && (len = getline(&line, &line_cap, f)) >= 0) {
        lineno++;
        if (*skip_ws(line) == '\0')
            continue; /* blank line */
        uint64_t ts = 0;
        long n =
            (size_t)len == strlen(line) ? parse_line(line, (size_t)len, &tmp, &tmp_cap, &ts) : -1;
        if (n < 0) {
            if (t->malformed++ < TRACE_MAX_REPORTS)
                fprintf(stderr, "kvpool-bench: trace: %s:%zu: no well-formed hash_ids, skipped\n",
                        path, lineno);
            continue;
        }
        if (kvp_bench_grow((void **)&t->blks, &blks_cap, t->n_blks + (size_t)n, sizeof(*t->blks)) ||
            kvp_bench_grow((void **)&t->off, &off_cap, t->n_req + 2, sizeof(*t->off)) ||
            kvp_bench_grow((void **)&t->ts, &ts_cap, t->n_req + 1, sizeof(*t->ts)))
            goto out_nomem;
        t->ts[t->n_req] = ts;
        for (long i = 0; i < n; i++) {
            uint32_t b = intern(t, tmp[i], &ids_cap);
            if (b == TRACE_NIL)
                goto out_nomem;
            t->blks[t->n_blks++] = b;
        }
        t->off[++t->n_req] = t->n_blks;
        if ((size_t)n > t->max_len)
            t->max_len = (size_t)n;
    }
    if (ferror(f)) {
        fprintf(stderr, "kvpool-bench: trace: cannot read %s: %m\n", path);
        goto out;
    }
    if (t->n_req == 0) {
        fprintf(stderr, "kvpool-bench: trace: %s has no request with hash_ids\n", path);
        goto out;
    }
    rc = 0;
    goto out;
out_nomem:
    fprintf(stderr, "kvpool-bench: trace: out of memory loading %s\n", path);
out:
    free(tmp);
    free(line);
    fclose(f);
    if (rc != 0)
        trace_free(t);
    return rc;
}

int kvp_bench_trace_read(FILE *f, const char *name, uint64_t limit, kvp_bench_reqs_t *r)
{
    memset(r, 0, sizeof(*r));
    char *line = NULL;
    size_t line_cap = 0, ids_cap = 0, off_cap = 0, tmp_cap = 0;
    uint64_t *tmp = NULL;
    ssize_t len;
    int rc = -1;
    if (kvp_bench_grow((void **)&r->off, &off_cap, 1, sizeof(*r->off)))
        goto out;
    r->off[0] = 0;
    while ((limit == 0 || r->n_req < limit) && (len = getline(&line, &line_cap, f)) >= 0) {
        uint64_t ts;
        long n =
            (size_t)len == strlen(line) ? parse_line(line, (size_t)len, &tmp, &tmp_cap, &ts) : -1;
        if (n < 0) { /* a blank or malformed line */
            r->malformed += *skip_ws(line) != '\0';
            continue;
        }
        if (kvp_bench_grow((void **)&r->ids, &ids_cap, r->n_ids + (size_t)n, sizeof(*r->ids)) ||
            kvp_bench_grow((void **)&r->off, &off_cap, r->n_req + 2, sizeof(*r->off)))
            goto out;
        memcpy(r->ids + r->n_ids, tmp, (size_t)n * sizeof(*tmp));
        r->n_ids += (size_t)n;
        r->off[++r->n_req] = r->n_ids;
    }
    rc = ferror(f) || r->n_req == 0 ? -1 : 0;
out:
    if (rc != 0)
        fprintf(stderr, "kvpool-bench: %s: %s\n", name,
                r->n_req == 0 ? "no request with hash_ids" : "cannot read it (or out of memory)");
    free(tmp);
    free(line);
    if (rc != 0)
        kvp_bench_reqs_free(r);
    return rc;
}

void kvp_bench_reqs_free(kvp_bench_reqs_t *r)
{
    free(r->ids);
    free(r->off);
    memset(r, 0, sizeof(*r));
}

/* ---------------- the references (cache_sim.h) ---------------- */

/* Prefix hits of one request against the LRU alone, then the request's accesses. */
static size_t lru_sim_request(kvp_bench_lru_t *l, const uint32_t *blk, size_t n)
{
    size_t p = kvp_bench_lru_prefix(l, blk, n);
    if (l->cap == 0)
        return p;
    for (size_t i = 0; i < n; i++) {
        if (l->in[blk[i]]) {
            kvp_bench_lru_touch(l, blk[i]);
            continue;
        }
        while (l->count >= l->cap)
            kvp_bench_lru_unlink(l, l->tail);
        kvp_bench_lru_push_mru(l, blk[i]);
    }
    return p;
}

/* ---------------- the store replay ---------------- */

typedef struct run {
    const kvp_bench_opts_t *o;
    const trace_t *t;
    kvp_client_t *c;
    bool store;    /* the master's eviction decides (else the bench's LRU) */
    uint64_t bb;   /* block bytes */
    size_t batch;  /* keys per call */
    uint8_t *pbuf; /* batch x bb: put sources */
    uint8_t *gbuf; /* batch x bb: get destinations */
    char (*keys)[TRACE_KEY_LEN];
    const char **kp;
    void **bp;
    size_t *szs;
    kvp_status_t *st;
    int64_t *got;
    int *ex;             /* max_len: is_exist answers of the current request */
    uint32_t *victim;    /* max_len: blocks to remove before this request's puts */
    uint32_t *miss;      /* max_len: blocks to put, request order; TRACE_NIL: dropped */
    uint32_t *tmp;       /* 2 x batch */
    uint8_t *stored;     /* per block: client-lru: the bench believes the store holds it;
                          * store: queued for this request's puts */
    uint32_t *pend;      /* per block: index in miss[] while waiting to be put, else TRACE_NIL */
    kvp_bench_lru_t lru; /* client-lru: what the bench keeps in the store, capacity_blocks */
    /* counters of the current capacity */
    uint64_t hits, total, bytes_read, bytes_written;
    uint64_t get_errors, put_errors, other_errors; /* errors: any of them fails the run */
    uint64_t get_raced, put_exists;                /* store: not errors */
    uint64_t mismatches, pool_full_evictions;      /* client-lru: not errors */
    char ssd_path[4096];                           /* tiers: this point's SSD file, "" when none */
    const char *addr; /* store: the point's master (the other clients connect there) */
} run_t;

static void put_u64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, sizeof(v));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static uint64_t run_errors(const run_t *r)
{
    return r->get_errors + r->put_errors + r->other_errors;
}

static void fill_keys(run_t *r, const uint32_t *blk, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        snprintf(r->keys[i], TRACE_KEY_LEN, TRACE_KEY_PREFIX "%" PRIu64, r->t->ids[blk[i]]);
        r->kp[i] = r->keys[i];
    }
}

/* The block's identity inside its bytes; the middle keeps the fill pattern. */
static void stamp_block(const run_t *r, uint8_t *p, uint64_t id)
{
    put_u64(p, id);
    put_u64(p + 8, id ^ TRACE_SALT);
    if (r->bb >= 32)
        put_u64(p + r->bb - 8, ~id);
}

static bool block_ok(const run_t *r, const uint8_t *p, uint64_t id)
{
    return get_u64(p) == id && get_u64(p + 8) == (id ^ TRACE_SALT) &&
           (r->bb < 32 || get_u64(p + r->bb - 8) == ~id);
}

static void clear_stamp(const run_t *r, uint8_t *p)
{
    memset(p, 0, 16);
    if (r->bb >= 32)
        memset(p + r->bb - 8, 0, 8);
}

/* Statuses that describe one key; any other status carried by every key is the call's. */
static bool per_key_status(kvp_status_t s)
{
    switch (s) {
    case KVP_ERR_NOT_FOUND:
    case KVP_ERR_EXISTS:
    case KVP_ERR_POOL_FULL:
    case KVP_ERR_PENDING:
    case KVP_ERR_NOT_PENDING:
    case KVP_ERR_BAD_KEY:
    case KVP_ERR_TOO_LARGE:
    case KVP_ERR_CHECKSUM:
        return true;
    default:
        return false;
    }
}

/* Whole-call failures (master unreachable, ...) end the run: returns -1. */
static int call_failed(kvp_status_t rc, const kvp_status_t *per_key, size_t n, const char *what)
{
    if (rc == KVP_OK || per_key_status(rc))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (per_key[i] != rc)
            return 0; /* a per-key failure: the caller counts it */
    fprintf(stderr, "kvpool-bench: trace: %s failed: %s\n", what, kvp_strerror(rc));
    return -1;
}

/* Remove blocks from the store (client-lru victims, or cleanup). */
static int remove_blocks(run_t *r, const uint32_t *blk, size_t n)
{
    for (size_t s = 0; s < n; s += r->batch) {
        size_t m = TRACE_MIN(r->batch, n - s);
        fill_keys(r, blk + s, m);
        kvp_status_t rc = kvp_batch_remove_force(r->c, r->kp, m, r->st);
        if (call_failed(rc, r->st, m, "batch_remove"))
            return -1;
        for (size_t i = 0; i < m; i++) {
            if (r->st[i] == KVP_ERR_NOT_FOUND)
                r->mismatches++;
            else if (r->st[i] != KVP_OK && r->other_errors++ < TRACE_MAX_REPORTS)
                fprintf(stderr, "kvpool-bench: trace: remove %s: %s\n", r->keys[i],
                        kvp_strerror(r->st[i]));
        }
    }
    return 0;
}

/* Forget a block the bench will not keep (evicted, or its put failed). */
static void drop_block(run_t *r, uint32_t b)
{
    if (r->lru.in[b])
        kvp_bench_lru_unlink(&r->lru, b);
    if (r->pend[b] != TRACE_NIL)
        r->miss[r->pend[b]] = TRACE_NIL;
    r->pend[b] = TRACE_NIL;
    r->stored[b] = 0;
}

/*
 * The store refused `need` puts with POOL_FULL: evict that many more LRU
 * blocks (skipping blocks still waiting to be put) and remove them.
 * Returns how many were removed (0: nothing left to evict), -1 on failure.
 */
static long evict_more(run_t *r, size_t need)
{
    size_t k = 0;
    uint32_t b = r->lru.tail;
    while (b != KVP_BENCH_NIL && k < need && k < r->batch) {
        uint32_t up = r->lru.prev[b];
        if (r->pend[b] == TRACE_NIL) {
            drop_block(r, b);
            r->tmp[k++] = b;
        }
        b = up;
    }
    if (k > 0 && remove_blocks(r, r->tmp, k))
        return -1;
    r->pool_full_evictions += k;
    return (long)k;
}

/* One batch_put_from of blk[0..n) (n <= batch), each block stamped with its id. */
static int put_call(run_t *r, const uint32_t *blk, size_t n)
{
    fill_keys(r, blk, n);
    for (size_t i = 0; i < n; i++) {
        r->bp[i] = r->pbuf + i * r->bb;
        stamp_block(r, r->bp[i], r->t->ids[blk[i]]);
        r->szs[i] = r->bb;
    }
    kvp_status_t rc =
        kvp_batch_put_from(r->c, r->kp, (const void *const *)r->bp, r->szs, n, NULL, r->st);
    return call_failed(rc, r->st, n, "batch_put_from");
}

static void put_error(run_t *r, size_t i)
{
    if (r->put_errors++ < TRACE_MAX_REPORTS)
        fprintf(stderr, "kvpool-bench: trace: put %s: %s\n", r->keys[i], kvp_strerror(r->st[i]));
}

/* Store eviction: put blk[0..n); EXISTS is fine (and, with concurrent clients, PENDING: another
 * client is writing the same block), anything else an error. */
static int put_chunk_store(run_t *r, const uint32_t *blk, size_t n)
{
    if (put_call(r, blk, n))
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (r->st[i] == KVP_OK)
            r->bytes_written += r->bb;
        else if (r->st[i] == KVP_ERR_EXISTS ||
                 (r->st[i] == KVP_ERR_PENDING && r->o->trace_clients > 1))
            r->put_exists++;
        else
            put_error(r, i);
    }
    return 0;
}

/* Client-lru: put blk[0..n) (n <= batch), retrying POOL_FULL refusals after more evictions. */
static int put_chunk_lru(run_t *r, const uint32_t *blk, size_t n)
{
    uint32_t *left = r->tmp + r->batch; /* second half of tmp: keys still to put */
    memcpy(left, blk, n * sizeof(*left));
    while (n > 0) {
        if (put_call(r, left, n))
            return -1;
        size_t full = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t b = left[i];
            if (r->st[i] == KVP_OK || r->st[i] == KVP_ERR_EXISTS) {
                r->pend[b] = TRACE_NIL;
                if (r->st[i] == KVP_OK)
                    r->bytes_written += r->bb;
                else
                    r->mismatches++;
            } else if (r->st[i] == KVP_ERR_POOL_FULL) {
                left[full++] = b;
            } else {
                put_error(r, i);
                drop_block(r, b);
            }
        }
        n = full;
        if (n == 0)
            break;
        long k = evict_more(r, n);
        if (k < 0)
            return -1;
        if (k == 0) {
            /* nothing of ours left to evict: the pool is full of someone else's data */
            if (r->put_errors < TRACE_MAX_REPORTS)
                fprintf(stderr, "kvpool-bench: trace: put: pool full with nothing of the "
                                "bench's left to evict\n");
            r->put_errors += n;
            for (size_t i = 0; i < n; i++)
                drop_block(r, left[i]);
            break;
        }
    }
    return 0;
}

/*
 * Read blk[0..n) (n <= batch) and check each block is the one asked for;
 * ex[0..n) are the blocks' exist answers. Store eviction: a block evicted
 * since the exist (NOT_FOUND) ends the prefix; its ex[] becomes 0 so that it
 * is written again. Returns the index of the first such block (n: none), or
 * -1 when the whole call failed.
 */
static long get_chunk(run_t *r, const uint32_t *blk, int *ex, size_t n)
{
    fill_keys(r, blk, n);
    for (size_t i = 0; i < n; i++) {
        r->bp[i] = r->gbuf + i * r->bb;
        clear_stamp(r, r->bp[i]); /* a failed read must not pass on a stale block */
        r->szs[i] = r->bb;
    }
    kvp_status_t rc = kvp_batch_get_into(r->c, r->kp, r->bp, r->szs, n, r->got);
    if (rc != KVP_OK && !per_key_status(rc)) {
        size_t same = 0;
        while (same < n && r->got[same] == rc)
            same++;
        if (same == n) {
            fprintf(stderr, "kvpool-bench: trace: batch_get_into failed: %s\n", kvp_strerror(rc));
            return -1;
        }
    }
    size_t raced = n;
    for (size_t i = 0; i < n; i++) {
        const char *why = NULL;
        if (r->store && r->got[i] == KVP_ERR_NOT_FOUND) {
            r->get_raced++;
            ex[i] = 0;
            if (raced == n)
                raced = i;
            continue;
        }
        if (r->got[i] < 0)
            why = kvp_strerror((kvp_status_t)r->got[i]);
        else if ((uint64_t)r->got[i] != r->bb)
            why = "wrong size";
        else if (!block_ok(r, r->bp[i], r->t->ids[blk[i]]))
            why = "wrong block content (not the block of this hash id)";
        if (why == NULL)
            r->bytes_read += r->bb;
        else if (r->get_errors++ < TRACE_MAX_REPORTS)
            fprintf(stderr, "kvpool-bench: trace: get %s: %s\n", r->keys[i], why);
    }
    return (long)raced;
}

/* batch_is_exist over the request: r->ex[0..n) and the cached prefix. */
static int exist_prefix(run_t *r, const uint32_t *blk, size_t n, size_t *prefix_p)
{
    size_t p = 0;
    bool in_prefix = true;
    for (size_t s = 0; s < n; s += r->batch) {
        size_t m = TRACE_MIN(r->batch, n - s), cp = 0;
        fill_keys(r, blk + s, m);
        kvp_status_t rc = kvp_batch_is_exist(r->c, r->kp, m, r->ex + s, &cp);
        if (rc != KVP_OK) {
            fprintf(stderr, "kvpool-bench: trace: batch_is_exist failed: %s\n", kvp_strerror(rc));
            return -1;
        }
        for (size_t i = 0; i < m; i++)
            if (r->ex[s + i] < 0 && r->other_errors++ < TRACE_MAX_REPORTS)
                fprintf(stderr, "kvpool-bench: trace: exist %s: %s\n", r->keys[i],
                        kvp_strerror((kvp_status_t)r->ex[s + i]));
        if (in_prefix)
            p += cp;
        in_prefix = in_prefix && cp == m;
    }
    *prefix_p = p;
    return 0;
}

/*
 * Store eviction, one request: exist -> prefix P, read and verify the prefix
 * (it ends early at a block evicted meanwhile), put the blocks the store lacks.
 */
static int run_request_store(run_t *r, const uint32_t *blk, size_t n)
{
    size_t p;
    if (exist_prefix(r, blk, n, &p))
        return -1;
    size_t hit = p;
    for (size_t s = 0; s < p; s += r->batch) {
        size_t m = TRACE_MIN(r->batch, p - s);
        long k = get_chunk(r, blk + s, r->ex + s, m);
        if (k < 0)
            return -1;
        if ((size_t)k < m) {
            hit = s + (size_t)k;
            break;
        }
    }
    r->hits += hit;
    r->total += n;
    size_t nm = 0;
    for (size_t i = hit; i < n; i++) {
        uint32_t b = blk[i];
        if (r->ex[i] == 0 && !r->stored[b]) { /* each block once, in request order */
            r->stored[b] = 1;
            r->miss[nm++] = b;
        }
    }
    for (size_t i = 0; i < nm; i++)
        r->stored[r->miss[i]] = 0;
    for (size_t s = 0; s < nm; s += r->batch)
        if (put_chunk_store(r, r->miss + s, TRACE_MIN(r->batch, nm - s)))
            return -1;
    return 0;
}

/*
 * Client-lru, one request: exist -> prefix P, read and verify the prefix, plan
 * the LRU (the same steps as lru_sim_request), remove the victims, put the misses.
 */
static int run_request_lru(run_t *r, const uint32_t *blk, size_t n)
{
    size_t p;
    if (exist_prefix(r, blk, n, &p))
        return -1;
    r->hits += p;
    r->total += n;
    for (size_t s = 0; s < p; s += r->batch)
        if (get_chunk(r, blk + s, r->ex + s, TRACE_MIN(r->batch, p - s)) < 0)
            return -1;

    /* reconcile the bench's view with the store's answers */
    for (size_t i = 0; i < n; i++) {
        uint32_t b = blk[i];
        if (r->ex[i] == 1 && !r->stored[b]) {
            r->mismatches++;
            r->stored[b] = 1; /* someone else's copy: adopt it */
        } else if (r->ex[i] == 0 && r->stored[b]) {
            r->mismatches++;
            r->stored[b] = 0; /* lost: it will be put again */
        }
    }
    if (r->lru.cap == 0)
        return 0;

    size_t nv = 0, nm = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b = blk[i];
        if (r->lru.in[b]) {
            kvp_bench_lru_touch(&r->lru, b);
        } else {
            while (r->lru.count >= r->lru.cap) {
                uint32_t v = r->lru.tail;
                bool was_stored = r->stored[v] && r->pend[v] == TRACE_NIL;
                drop_block(r, v); /* a victim still waiting for its put is just not put */
                if (was_stored)
                    r->victim[nv++] = v;
            }
            kvp_bench_lru_push_mru(&r->lru, b);
        }
        if (!r->stored[b]) {
            r->stored[b] = 1;
            r->pend[b] = (uint32_t)nm;
            r->miss[nm++] = b;
        }
    }
    if (remove_blocks(r, r->victim, nv))
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < nm; i++) /* compact: victims dropped from miss[] */
        if (r->miss[i] != TRACE_NIL) {
            r->pend[r->miss[i]] = (uint32_t)k;
            r->miss[k++] = r->miss[i];
        }
    for (size_t s = 0; s < k; s += r->batch) {
        size_t m = TRACE_MIN(r->batch, k - s);
        memcpy(r->tmp, r->miss + s, m * sizeof(*r->tmp));
        if (put_chunk_lru(r, r->tmp, m))
            return -1;
    }
    return 0;
}

/* Client-lru: remove everything the bench believes it stored and reset its bookkeeping. */
static int remove_all(run_t *r)
{
    size_t k = 0;
    int rc = 0;
    for (size_t b = 0; b < r->t->n_uniq && rc == 0; b++) {
        if (!r->stored[b])
            continue;
        r->tmp[k++] = (uint32_t)b;
        if (k == r->batch) {
            rc = remove_blocks(r, r->tmp, k);
            k = 0;
        }
    }
    if (rc == 0 && k > 0)
        rc = remove_blocks(r, r->tmp, k);
    memset(r->stored, 0, r->t->n_uniq);
    for (size_t b = 0; b < r->t->n_uniq; b++)
        r->pend[b] = TRACE_NIL;
    kvp_bench_lru_reset(&r->lru);
    return rc;
}

/* Client-lru: remove every key of the trace (leftovers of an earlier run). Returns how many
 * existed, or -1. */
static long sweep_all(run_t *r)
{
    long found = 0;
    for (size_t s = 0; s < r->t->n_uniq; s += r->batch) {
        size_t m = TRACE_MIN(r->batch, r->t->n_uniq - s);
        for (size_t i = 0; i < m; i++)
            r->tmp[i] = (uint32_t)(s + i);
        fill_keys(r, r->tmp, m);
        kvp_status_t rc = kvp_batch_remove_force(r->c, r->kp, m, r->st);
        if (call_failed(rc, r->st, m, "batch_remove"))
            return -1;
        for (size_t i = 0; i < m; i++) {
            if (r->st[i] == KVP_OK) {
                found++;
            } else if (r->st[i] != KVP_ERR_NOT_FOUND) {
                fprintf(stderr, "kvpool-bench: trace: remove %s: %s\n", r->keys[i],
                        kvp_strerror(r->st[i]));
                return -1;
            }
        }
    }
    return found;
}

/* Connect the run's client to `addr` and register its buffers. */
static int run_connect(run_t *r, const char *addr)
{
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = addr;
    p.transport = r->o->n_transports == 1 ? r->o->transports[0] : NULL;
    kvp_status_t st = kvp_client_create(&p, &r->c);
    if (st != KVP_OK) {
        r->c = NULL;
        fprintf(stderr, "kvpool-bench: trace: cannot connect to %s: %s\n",
                addr ? addr : "the default master", kvp_strerror(st));
        return -1;
    }
    /* optional on tcp/shm, done once so rdma would be zero-copy */
    kvp_register_buffer(r->c, r->pbuf, r->batch * r->bb);
    kvp_register_buffer(r->c, r->gbuf, r->batch * r->bb);
    return 0;
}

static void run_disconnect(run_t *r)
{
    if (r->c == NULL)
        return;
    kvp_unregister_buffer(r->c, r->pbuf);
    kvp_unregister_buffer(r->c, r->gbuf);
    kvp_client_destroy(r->c);
    r->c = NULL;
}

static void run_free(run_t *r)
{
    run_disconnect(r);
    free(r->pbuf);
    free(r->gbuf);
    free(r->keys);
    free(r->kp);
    free(r->bp);
    free(r->szs);
    free(r->st);
    free(r->got);
    free(r->ex);
    free(r->victim);
    free(r->miss);
    free(r->tmp);
    free(r->stored);
    free(r->pend);
    kvp_bench_lru_cleanup(&r->lru);
}

static int run_init(run_t *r, const kvp_bench_opts_t *o, const trace_t *t)
{
    memset(r, 0, sizeof(*r));
    r->o = o;
    r->t = t;
    r->store = !o->trace_client_lru;
    r->bb = o->block_bytes ? o->block_bytes : 256 * 1024;
    if (r->bb < 16) {
        fprintf(stderr, "kvpool-bench: trace: block size must be >= 16 bytes\n");
        return -1;
    }
    r->batch = (size_t)TRACE_MIN((uint64_t)TRACE_BATCH, TRACE_BUF_MAX / r->bb);
    if (r->batch == 0)
        r->batch = 1;
    size_t len = t->max_len ? t->max_len : 1;
    r->pbuf = malloc(r->batch * r->bb);
    r->gbuf = malloc(r->batch * r->bb);
    r->keys = malloc(r->batch * sizeof(*r->keys));
    r->kp = malloc(r->batch * sizeof(*r->kp));
    r->bp = malloc(r->batch * sizeof(*r->bp));
    r->szs = malloc(r->batch * sizeof(*r->szs));
    r->st = malloc(r->batch * sizeof(*r->st));
    r->got = malloc(r->batch * sizeof(*r->got));
    r->ex = malloc(len * sizeof(*r->ex));
    r->victim = malloc(len * sizeof(*r->victim));
    r->miss = malloc(len * sizeof(*r->miss));
    r->tmp = malloc(2 * r->batch * sizeof(*r->tmp));
    r->stored = calloc(t->n_uniq, 1);
    r->pend = malloc(t->n_uniq * sizeof(*r->pend));
    if (kvp_bench_lru_init(&r->lru, t->n_uniq, 0) || !r->pbuf || !r->gbuf || !r->keys || !r->kp ||
        !r->bp || !r->szs || !r->st || !r->got || !r->ex || !r->victim || !r->miss || !r->tmp ||
        !r->stored || !r->pend) {
        fprintf(stderr, "kvpool-bench: trace: out of memory\n");
        return -1;
    }
    for (size_t b = 0; b < t->n_uniq; b++)
        r->pend[b] = TRACE_NIL;
    /* a cheap non-constant pattern once; each put only stamps the block's id */
    for (size_t i = 0; i < r->batch * r->bb; i += 8) {
        uint64_t v = (i * TRACE_SALT) ^ 0x5bd1e995;
        memcpy(r->pbuf + i, &v, TRACE_MIN(8, r->batch * r->bb - i));
    }
    memset(r->gbuf, 0, r->batch * r->bb);
    return 0;
}

/*
 * Store eviction: an empty pool of exactly `bytes` for this point, and the
 * client connected to it. With --local a fresh master and segment (in *cl,
 * *started set); otherwise the given master's pool must already be so.
 */
static int store_pool_open(run_t *r, uint64_t bytes, uint64_t ssd_bytes, kvp_bench_cluster_t *cl,
                           bool *started)
{
    const char *addr = r->o->master;
    if (ssd_bytes > 0 && !r->o->local) {
        fprintf(stderr, "kvpool-bench: trace: --ssd-capacity needs --local (a fresh pool with an "
                        "SSD segment per capacity point)\n");
        return -1;
    }
    double started_at = kvp_bench_now();
    if (r->o->local) {
        kvp_bench_cluster_params_t cp = {.n = 1, .seg_size = bytes};
        if (ssd_bytes > 0) {
            if (kvp_bench_ssd_dir_check(r->o->ssd_dir) != 0)
                return -1;
            snprintf(r->ssd_path, sizeof(r->ssd_path), "%s/kvpool-bench-trace-%d.seg",
                     r->o->ssd_dir, (int)getpid());
            unlink(r->ssd_path);
            cp.ssd_path = r->ssd_path;
            cp.ssd_size = ssd_bytes;
        }
        if (kvp_bench_cluster_start_params(cl, &cp) != 0) {
            fprintf(stderr,
                    "kvpool-bench: trace: cannot start a local cluster with a %" PRIu64
                    "-byte segment%s%s\n",
                    bytes, ssd_bytes ? " and an SSD segment in " : "",
                    ssd_bytes ? r->ssd_path : "");
            return -1;
        }
        *started = true;
        addr = cl->master_addr;
    }
    r->addr = addr;
    if (run_connect(r, addr))
        return -1;
    kvp_pool_stat_t ps;
    if (kvp_bench_pool_stat(r->c, "trace", &ps))
        return -1;
    if (ps.capacity != bytes + ssd_bytes || ps.ssd_capacity != ssd_bytes || ps.used != 0 ||
        ps.objects != 0 || ps.pending != 0) {
        fprintf(stderr,
                "kvpool-bench: trace: eviction store needs an empty pool of exactly %" PRIu64
                " bytes (capacity_blocks x block bytes), but %s has %" PRIu64 " bytes with %" PRIu64
                " used by %" PRIu64 " objects: use --local (a fresh "
                "cluster per capacity point) or --eviction client-lru\n",
                bytes, addr ? addr : "the master", ps.capacity, ps.used, ps.objects);
        return -1;
    }
    /* A master that just started answers a put that finds no room "wait" (POOL_BUSY) rather
     * than evicting, for its rebuild grace (segments of a restarted master remount and offer
     * their records meanwhile); the client retries those keys in a put of their own. That is
     * not the policy at work: a fresh pool's replay starts once the grace is over. */
    if (*started) {
        double left = started_at + TRACE_REBUILD_GRACE_S - kvp_bench_now();
        if (left > 0) {
            struct timespec ts = {.tv_sec = (time_t)left,
                                  .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
    return 0;
}

/* ---------------- pacing and concurrent clients ---------------- */

/* Wait until request q's time: its timestamp / pace after t0 (pace 0: no wait). */
static void pace_wait(const trace_t *t, size_t q, double t0, double pace)
{
    if (pace <= 0)
        return;
    double at = t0 + (double)t->ts[q] / 1000.0 / pace;
    for (double now = kvp_bench_now(); now < at; now = kvp_bench_now()) {
        double left = at - now;
        struct timespec ts = {.tv_sec = (time_t)left,
                              .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* One client thread of a concurrent replay: takes the next request in trace order. */
typedef struct replay_thread {
    run_t *r;
    _Atomic size_t *next;
    _Atomic bool *stop;
    double t0, pace;
    int rc;
    pthread_t tid;
} replay_thread_t;

static void *replay_thread(void *arg)
{
    replay_thread_t *rt = arg;
    const trace_t *t = rt->r->t;
    for (;;) {
        size_t q = atomic_fetch_add(rt->next, 1);
        if (q >= t->n_req || atomic_load(rt->stop))
            break;
        pace_wait(t, q, rt->t0, rt->pace);
        const uint32_t *blk = t->blks + t->off[q];
        if (run_request_store(rt->r, blk, t->off[q + 1] - t->off[q]) != 0 ||
            run_errors(rt->r) >= TRACE_MAX_ERRORS) {
            rt->rc = -1;
            atomic_store(rt->stop, true);
            break;
        }
    }
    return NULL;
}

/*
 * The requests of one capacity point: in trace order from this thread (one client), or
 * from o->trace_clients threads with a client each (store eviction), each taking the next
 * request; paced by the timestamps / `pace` when pace > 0. *done_p: requests replayed
 * (all, unless it had to stop). Counters end up in r. Returns 0, or -1.
 */
static int replay(run_t *r, double frac, double pace, size_t *done_p)
{
    const trace_t *t = r->t;
    unsigned n_cl = r->store && r->o->trace_clients > 1 ? r->o->trace_clients : 1;
    double t0 = kvp_bench_now(), last = t0;
    if (n_cl == 1) {
        size_t done = 0;
        int rc = 0;
        for (; done < t->n_req; done++) {
            pace_wait(t, done, t0, pace);
            const uint32_t *blk = t->blks + t->off[done];
            size_t n = t->off[done + 1] - t->off[done];
            if ((r->store ? run_request_store(r, blk, n) : run_request_lru(r, blk, n)) != 0) {
                rc = -1;
                break;
            }
            if (run_errors(r) >= TRACE_MAX_ERRORS) {
                fprintf(stderr,
                        "kvpool-bench: trace: capacity %.3g: %" PRIu64
                        " errors, stopping this capacity point\n",
                        frac, run_errors(r));
                done++;
                break;
            }
            double now = kvp_bench_now();
            if (now - last >= 0.25) {
                last = now;
                kvp_bench_progress(r->o, "trace cap %.3g: %zu/%zu requests, hit rate %.4f", frac,
                                   done + 1, t->n_req,
                                   r->total ? (double)r->hits / (double)r->total : 0.0);
            }
        }
        *done_p = done;
        return rc;
    }
    /* thread 0 uses r (connected); the others a run of their own each, on the same master */
    replay_thread_t *th = calloc(n_cl, sizeof(*th));
    run_t *extra = calloc(n_cl, sizeof(*extra));
    _Atomic size_t next = 0;
    _Atomic bool stop = false;
    int rc = 0;
    unsigned ready = 1, started = 0;
    if (th == NULL || extra == NULL) {
        fprintf(stderr, "kvpool-bench: trace: out of memory\n");
        rc = -1;
        goto out;
    }
    for (; ready < n_cl; ready++)
        if (run_init(&extra[ready], r->o, t) || run_connect(&extra[ready], r->addr)) {
            run_free(&extra[ready]);
            rc = -1;
            goto out;
        }
    t0 = kvp_bench_now();
    for (; started < n_cl; started++) {
        th[started] = (replay_thread_t){.r = started == 0 ? r : &extra[started],
                                        .next = &next,
                                        .stop = &stop,
                                        .t0 = t0,
                                        .pace = pace};
        if (pthread_create(&th[started].tid, NULL, replay_thread, &th[started]) != 0) {
            fprintf(stderr, "kvpool-bench: trace: cannot start a client thread\n");
            atomic_store(&stop, true);
            rc = -1;
            break;
        }
    }
    for (unsigned i = 0; i < started; i++) {
        pthread_join(th[i].tid, NULL);
        rc |= th[i].rc;
    }
    for (unsigned i = 1; i < ready; i++) { /* their counters into r */
        r->hits += extra[i].hits;
        r->total += extra[i].total;
        r->bytes_read += extra[i].bytes_read;
        r->bytes_written += extra[i].bytes_written;
        r->get_errors += extra[i].get_errors;
        r->put_errors += extra[i].put_errors;
        r->other_errors += extra[i].other_errors;
        r->get_raced += extra[i].get_raced;
        r->put_exists += extra[i].put_exists;
    }
    if (atomic_load(&stop))
        fprintf(stderr,
                "kvpool-bench: trace: capacity %.3g: a client stopped (%" PRIu64 " errors)\n", frac,
                run_errors(r));
out:
    for (unsigned i = 1; i < ready; i++)
        run_free(&extra[i]);
    free(extra);
    free(th);
    size_t n = atomic_load(&next);
    *done_p = rc == 0 && n > t->n_req ? t->n_req : (n < t->n_req ? n : t->n_req);
    return rc;
}

/* One capacity point of run_capacity: its sizes, what the replay did, and the references. */
typedef struct cap_point {
    double frac, pace;
    const char *name;
    size_t cap;        /* DRAM capacity in blocks */
    uint64_t pool;     /* its bytes (client-lru: the pool's whole capacity) */
    size_t ssd_cap;    /* tiers: SSD capacity in blocks (0: no SSD segment) */
    uint64_t ssd_pool; /* its bytes */
    size_t ref_cap;    /* the references' capacity: both tiers together */
    size_t done;       /* requests replayed */
    double elapsed;
    uint64_t evicted;         /* store: objects the master evicted */
    kvp_pool_stat_t ps0, ps1; /* store: the pool before and after the replay */
    uint64_t lru_hits, bel_hits;
} cap_point_t;

/* The point's pool sizes: cap blocks of DRAM, each extent rounded up to the master's
 * granularity; tiers: the SSD segment, ssd_cap blocks of whole 4 KiB extents (at least
 * 1 MiB). */
static void cap_sizes(const run_t *r, cap_point_t *cp)
{
    const trace_t *t = r->t;
    cp->cap = (size_t)(cp->frac * (double)t->n_uniq);
    if (cp->cap == 0)
        cp->cap = 1;
    cp->pool = (uint64_t)cp->cap * ((r->bb + TRACE_ALIGN - 1) / TRACE_ALIGN * TRACE_ALIGN);
    if (r->o->ssd_capacity <= 0 || !r->store)
        return;
    size_t ssd_cap = (size_t)(r->o->ssd_capacity * (double)t->n_uniq);
    ssd_cap = ssd_cap ? ssd_cap : 1;
    uint64_t ssd_pool =
        (uint64_t)ssd_cap * ((r->bb + TRACE_SSD_ALIGN - 1) / TRACE_SSD_ALIGN * TRACE_SSD_ALIGN);
    if (ssd_pool < (1u << 20))
        ssd_pool = 1u << 20;
    uint64_t slots = ssd_pool / TRACE_SSD_SLOT;
    slots = slots < TRACE_SSD_MIN_SLOTS ? TRACE_SSD_MIN_SLOTS : slots;
    if (slots < ssd_cap)
        fprintf(stderr,
                "kvpool-bench: trace: the SSD file's object table has one slot per 64 KiB "
                "(at least 1024): %" PRIu64 " slots for %zu blocks of %" PRIu64
                " bytes, so offloads past that fail (use 64 KiB blocks or larger)\n",
                slots, ssd_cap, r->bb);
    cp->ssd_cap = ssd_cap;
    cp->ssd_pool = ssd_pool;
}

/* The point's pool: store eviction, a fresh local cluster of exactly its size (*started: it
 * runs); client-lru, the pool as it is, with the bench's LRU set to cap blocks. 0, or -1. */
static int cap_pool(run_t *r, cap_point_t *cp, kvp_bench_cluster_t *cl, bool *started)
{
    if (r->store) {
        if (store_pool_open(r, cp->pool, cp->ssd_pool, cl, started) ||
            kvp_bench_pool_stat(r->c, "trace", &cp->ps0))
            return -1;
        return 0;
    }
    r->lru.cap = cp->cap;
    kvp_pool_stat_t ps = {0};
    if (kvp_bench_pool_stat(r->c, "trace", &ps) != 0)
        r->other_errors++;
    else if ((double)cp->cap * (double)r->bb > (double)ps.capacity)
        fprintf(stderr,
                "kvpool-bench: trace: capacity %.3g = %zu blocks = %.2f GiB but the pool has "
                "%.2f GiB: expect POOL_FULL evictions and hit_rate below lru_hit_rate "
                "(give the local cluster more --segment-size)\n",
                cp->frac, cp->cap, (double)cp->cap * (double)r->bb / (1 << 30),
                (double)ps.capacity / (1 << 30));
    cp->pool = ps.capacity;
    return 0;
}

/* The references: the same requests through an LRU and Belady's choice, at ref_cap blocks.
 * 0, or -1 (out of memory). */
static int cap_references(const run_t *r, cap_point_t *cp)
{
    const trace_t *t = r->t;
    kvp_bench_lru_t sim;
    if (kvp_bench_lru_init(&sim, t->n_uniq, cp->ref_cap) ||
        kvp_bench_belady_hits(t->blks, t->off, cp->done, t->n_uniq, cp->ref_cap, &cp->bel_hits)) {
        kvp_bench_lru_cleanup(&sim);
        fprintf(stderr, "kvpool-bench: trace: out of memory\n");
        return -1;
    }
    for (size_t q = 0; q < cp->done; q++)
        cp->lru_hits += lru_sim_request(&sim, t->blks + t->off[q], t->off[q + 1] - t->off[q]);
    kvp_bench_lru_cleanup(&sim);
    return 0;
}

/* The point's hit rates: the store's, the LRU's and Belady's. */
typedef struct cap_rates {
    double hit, lru, bel, rps;
    uint64_t hd, hs; /* tiers: the master's hits from DRAM and from SSD */
    double dram_share, ssd_share;
} cap_rates_t;

static void cap_rates(const run_t *r, const cap_point_t *cp, cap_rates_t *cr)
{
    uint64_t total = r->t->off[cp->done];
    cr->hit = r->total ? (double)r->hits / (double)r->total : 0;
    cr->lru = total ? (double)cp->lru_hits / (double)total : 0;
    cr->bel = total ? (double)cp->bel_hits / (double)total : 0;
    cr->rps = cp->elapsed > 0 ? (double)cp->done / cp->elapsed : 0;
    cr->hd = cp->ps1.hits_dram - cp->ps0.hits_dram;
    cr->hs = cp->ps1.hits_ssd - cp->ps0.hits_ssd;
    cr->dram_share = cr->hd + cr->hs ? (double)cr->hd / (double)(cr->hd + cr->hs) : 0;
    cr->ssd_share = cr->hd + cr->hs ? (double)cr->hs / (double)(cr->hd + cr->hs) : 0;
}

/* The point's lines of the human table. */
static void cap_print(const run_t *r, const cap_point_t *cp, const cap_rates_t *cr)
{
    const kvp_pool_stat_t *ps0 = &cp->ps0, *ps1 = &cp->ps1;
    printf(
        "%-22.22s %-10s %8.3g %5.4g %10zu %9zu %8.4f %8.4f %8.4f %9.1f %8.2f %9.2f %9.2f %7" PRIu64
        "\n",
        cp->name, r->store ? "store" : "client-lru", cp->frac, cp->pace, cp->cap, cp->done, cr->hit,
        cr->lru, cr->bel, cr->rps, cp->elapsed, (double)r->bytes_read / 1e9,
        (double)r->bytes_written / 1e9, run_errors(r));
    if (r->store)
        printf("  %" PRIu64 "-byte pool: %" PRIu64 " objects evicted by the master, %" PRIu64
               " gets raced with an eviction, %" PRIu64 " puts found the block already there\n",
               cp->pool, cp->evicted, r->get_raced, r->put_exists);
    if (cp->ssd_cap > 0)
        printf("  tiers: SSD %zu blocks (%" PRIu64 " bytes) beside DRAM %zu: hits %.1f %% from "
               "DRAM, %.1f %% from SSD (%" PRIu64 " / %" PRIu64 " objects); %" PRIu64
               " offloaded, %" PRIu64 " promoted, %" PRIu64 " offloads dropped, %" PRIu64
               " failed, %" PRIu64 " evicted from SSD; references at %zu blocks\n",
               cp->ssd_cap, cp->ssd_pool, cp->cap, cr->dram_share * 100, cr->ssd_share * 100,
               cr->hd, cr->hs, ps1->offloaded_objects - ps0->offloaded_objects,
               ps1->promoted_objects - ps0->promoted_objects,
               ps1->offload_dropped - ps0->offload_dropped,
               ps1->offload_failed - ps0->offload_failed,
               ps1->ssd_evicted_objects - ps0->ssd_evicted_objects, cp->ref_cap);
    if (!r->store && (r->mismatches || r->pool_full_evictions))
        printf("  %" PRIu64 " store/bench mismatches, %" PRIu64
               " extra evictions after POOL_FULL\n",
               r->mismatches, r->pool_full_evictions);
    if (run_errors(r))
        printf("  errors: %" PRIu64 " gets, %" PRIu64 " puts, %" PRIu64 " other\n", r->get_errors,
               r->put_errors, r->other_errors);
    fflush(stdout);
}

/* The tiers' fields of the point's result. */
static void cap_json_tiers(const run_t *r, const cap_point_t *cp, const cap_rates_t *cr,
                           kvp_bench_out_t *out)
{
    const kvp_pool_stat_t *ps0 = &cp->ps0, *ps1 = &cp->ps1;
    kvp_bench_result_num(out, "ssd_capacity", r->o->ssd_capacity);
    kvp_bench_result_int(out, "ssd_capacity_blocks", (int64_t)cp->ssd_cap);
    kvp_bench_result_int(out, "ssd_pool_bytes", (int64_t)cp->ssd_pool);
    kvp_bench_result_int(out, "ref_capacity_blocks", (int64_t)cp->ref_cap);
    kvp_bench_result_int(out, "hits_dram", (int64_t)cr->hd);
    kvp_bench_result_int(out, "hits_ssd", (int64_t)cr->hs);
    kvp_bench_result_num(out, "dram_hit_share", cr->dram_share);
    kvp_bench_result_num(out, "ssd_hit_share", cr->ssd_share);
    kvp_bench_result_num(out, "dram_hit_rate", cr->hit * cr->dram_share);
    kvp_bench_result_num(out, "ssd_hit_rate", cr->hit * cr->ssd_share);
    kvp_bench_result_int(out, "offloaded_objects",
                         (int64_t)(ps1->offloaded_objects - ps0->offloaded_objects));
    kvp_bench_result_int(out, "promoted_objects",
                         (int64_t)(ps1->promoted_objects - ps0->promoted_objects));
    kvp_bench_result_int(out, "offload_dropped",
                         (int64_t)(ps1->offload_dropped - ps0->offload_dropped));
    kvp_bench_result_int(out, "offload_failed",
                         (int64_t)(ps1->offload_failed - ps0->offload_failed));
    kvp_bench_result_int(out, "ssd_evicted_objects",
                         (int64_t)(ps1->ssd_evicted_objects - ps0->ssd_evicted_objects));
    kvp_bench_result_int(out, "ssd_used", (int64_t)ps1->ssd_used);
}

/* The point's result object. */
static void cap_json(const run_t *r, const cap_point_t *cp, const cap_rates_t *cr,
                     kvp_bench_out_t *out)
{
    kvp_bench_result_begin(out, "trace");
    kvp_bench_result_str(out, "trace", cp->name);
    kvp_bench_result_str(out, "eviction", r->store ? "store" : "client-lru");
    kvp_bench_result_num(out, "capacity", cp->frac);
    kvp_bench_result_num(out, "pace", cp->pace);
    kvp_bench_result_int(out, "clients",
                         r->store && r->o->trace_clients > 1 ? r->o->trace_clients : 1);
    kvp_bench_result_int(out, "capacity_blocks", (int64_t)cp->cap);
    kvp_bench_result_int(out, "block_bytes", (int64_t)r->bb);
    kvp_bench_result_int(out, "pool_bytes", (int64_t)cp->pool);
    kvp_bench_result_int(out, "requests", (int64_t)cp->done);
    kvp_bench_result_int(out, "blocks", (int64_t)r->total);
    kvp_bench_result_int(out, "unique_blocks", (int64_t)r->t->n_uniq);
    kvp_bench_result_num(out, "hit_rate", cr->hit);
    kvp_bench_result_num(out, "lru_hit_rate", cr->lru);
    kvp_bench_result_num(out, "belady_hit_rate", cr->bel);
    kvp_bench_result_num(out, "requests_per_s", cr->rps);
    kvp_bench_result_num(out, "elapsed_s", cp->elapsed);
    kvp_bench_result_int(out, "bytes_read", (int64_t)r->bytes_read);
    kvp_bench_result_int(out, "bytes_written", (int64_t)r->bytes_written);
    kvp_bench_result_int(out, "get_errors", (int64_t)r->get_errors);
    kvp_bench_result_int(out, "put_errors", (int64_t)r->put_errors);
    kvp_bench_result_int(out, "other_errors", (int64_t)r->other_errors);
    kvp_bench_result_int(out, "get_raced", (int64_t)r->get_raced);
    kvp_bench_result_int(out, "put_exists", (int64_t)r->put_exists);
    kvp_bench_result_int(out, "store_evicted_objects", (int64_t)cp->evicted);
    kvp_bench_result_int(out, "mismatches", (int64_t)r->mismatches);
    kvp_bench_result_int(out, "pool_full_evictions", (int64_t)r->pool_full_evictions);
    kvp_bench_result_int(out, "malformed_lines", (int64_t)r->t->malformed);
    if (cp->ssd_cap > 0)
        cap_json_tiers(r, cp, cr, out);
    kvp_bench_result_end(out);
}

/* Replay the trace once at capacity `frac` and pace `pace`. Returns 0, or -1 when the run
 * had to stop. */
static int run_capacity(run_t *r, double frac, double pace, const char *name, kvp_bench_out_t *out)
{
    cap_point_t cp = {.frac = frac, .pace = pace, .name = name};
    r->hits = r->total = r->bytes_read = r->bytes_written = 0;
    r->get_errors = r->put_errors = r->other_errors = r->mismatches = 0;
    r->get_raced = r->put_exists = r->pool_full_evictions = 0;
    cap_sizes(r, &cp);
    kvp_bench_cluster_t cl;
    bool started = false;
    int rc = 0;
    r->ssd_path[0] = '\0';
    if (cap_pool(r, &cp, &cl, &started) != 0) {
        rc = -1;
        goto out;
    }

    double t0 = kvp_bench_now();
    if (replay(r, frac, pace, &cp.done) != 0)
        rc = -1;
    cp.elapsed = kvp_bench_now() - t0;
    kvp_bench_progress_done(r->o);

    cp.ps1 = cp.ps0;
    if (r->store) {
        if (kvp_bench_pool_stat(r->c, "trace", &cp.ps1) == 0)
            cp.evicted = cp.ps1.evicted_objects - cp.ps0.evicted_objects;
        else
            r->other_errors++;
    } else if (remove_all(r)) {
        rc = -1;
    }

    cp.ref_cap = cp.cap + cp.ssd_cap; /* tiers: both together */
    if (cap_references(r, &cp) != 0) {
        rc = -1;
        goto out;
    }
    cap_rates_t cr;
    cap_rates(r, &cp, &cr);
    cap_print(r, &cp, &cr);
    cap_json(r, &cp, &cr, out);
out:
    if (r->store) {
        run_disconnect(r);
        if (started)
            kvp_bench_cluster_stop(&cl);
        if (r->ssd_path[0] != '\0')
            unlink(r->ssd_path);
    }
    return rc;
}

int kvp_bench_trace(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    if (o->trace_path == NULL) {
        fprintf(stderr, "kvpool-bench: trace needs --trace FILE\n");
        return 1;
    }
    const char *name = strrchr(o->trace_path, '/');
    name = name ? name + 1 : o->trace_path;
    trace_t t;
    if (trace_load(&t, o->trace_path, o->trace_limit))
        return 1;
    run_t r;
    int rc = 1;
    if (run_init(&r, o, &t))
        goto out;
    printf("trace %s: %zu requests%s, %zu blocks, %zu unique, %zu malformed lines skipped; "
           "blocks of %" PRIu64 " bytes; %s\n",
           name, t.n_req, o->trace_limit ? " (limited)" : "", t.n_blks, t.n_uniq, t.malformed, r.bb,
           r.store ? "eviction store (per capacity: an empty pool of capacity_blocks blocks, the "
                     "master evicts)"
                   : "eviction client-lru (a reference: the bench removes LRU victims itself)");
    if (!r.store) {
        if (run_connect(&r, o->master))
            goto out;
        long left = sweep_all(&r);
        if (left < 0)
            goto out;
        if (left > 0)
            printf("  removed %ld blocks left in the store by an earlier run\n", left);
    }
    printf("%-22s %-10s %8s %5s %10s %9s %8s %8s %8s %9s %8s %9s %9s %7s\n", "trace", "eviction",
           "capacity", "pace", "cap_blocks", "requests", "hit", "lru_hit", "belady", "req/s",
           "time_s", "read_GB", "write_GB", "errors");
    double def_cap = 0.1;
    const double *caps = o->n_capacities ? o->capacities : &def_cap;
    size_t n_caps = o->n_capacities ? o->n_capacities : 1;
    uint64_t errors = 0;
    rc = 0;
    double unpaced = 0;
    const double *paces = o->n_paces ? o->paces : &unpaced;
    size_t n_paces = o->n_paces ? o->n_paces : 1;
    for (size_t i = 0; i < n_caps && rc == 0; i++)
        for (size_t j = 0; j < n_paces && rc == 0; j++) {
            rc = run_capacity(&r, caps[i], paces[j], name, out) ? 1 : 0;
            errors += run_errors(&r);
        }
    if (errors > 0) {
        fprintf(stderr,
                "kvpool-bench: trace: %" PRIu64 " errors (failed or wrong gets, failed "
                "puts, exists or removes)\n",
                errors);
        rc = 1;
    }
out:
    run_free(&r);
    trace_free(&t);
    return rc;
}
