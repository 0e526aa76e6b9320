/*
 * bench_index.c - kvpool-bench index: kvpool-indexer's speed (issue 46, docs/indexer.md),
 * in process and end to end, next to a naive baseline, from one trace.
 *
 * DESIGN
 * Workload. A FAST'25 trace (--trace FILE, or tracegen's --class made in memory) is
 * replayed through --engines mock engines, each an exact LRU pool of --engine-blocks
 * blocks of 16 tokens. A trace hash id stands for 512 tokens, i.e. 32 blocks of 16; block
 * j of id H has the key (H << 5) | j and its tokens are a function of (key, position), so
 * equal prefixes give equal tokens (an id names its whole prefix in these traces). The
 * engine's own block hash is another function of the key (vLLM's would be SHA-256 of the
 * parent and the tokens: a function of the prefix too), never the standard hash, so the
 * indexer maps engine hashes as it does for vLLM. A request (its first --engine-blocks
 * blocks) goes to the engine the hash of its first id picks. First the router's query:
 * the whole prompt, every instance (the expected answer for that engine, its leading run
 * of resident blocks, is kept to check every answer). Then the engine: its resident
 * blocks of the request are touched tail first (so a prompt's tail is evicted before its
 * head, as vLLM's free queue does), LRU victims are evicted for the blocks it lacks
 * (BlockRemoved of their engine hashes), and the lacking blocks are stored, each run of
 * consecutive ones a BlockStored with its parent's engine hash, its token ids, block size
 * 16. One engine's events of one request are one batch. These streams are made once
 * (compact records), then replayed four ways:
 *
 * In process (this thread, one core): each batch is encoded as vLLM's msgpack
 * (msgpack-c; untimed), decoded by the indexer's own kvp_decode_batch and applied with
 * kvp_idx_apply under its write lock, as its subscriber thread does; each query's tokens
 * are made (untimed), then hashed (kvp_idx_hash_tokens) and answered (kvp_idx_query into
 * a sink that keeps the JSON) under the read lock. Block operations = stored + removed
 * blocks + query blocks; the rate with the decode and without it (apply + query only).
 * Every answer is checked against the engine's expected run; at the end the index's
 * holders must equal the blocks the engines hold, nothing unplaced.
 *
 * Baseline (same run, same batches decoded by the same decoder, decode untimed): per
 * instance an open-addressing set of standard hashes, one engine hash -> standard hash
 * map; a query hashes the prompt and walks every instance's set block by block until a
 * miss. Its answers are checked too. Compared with the in-process apply-only rate.
 *
 * End to end: a kvpool-indexer of its own (--listen 127.0.0.1:0 --ready-fd), the engines
 * registered as vLLM publishers (POST /register) on PUB sockets this process binds on
 * 127.0.0.1 (no send limit, so nothing is dropped); empty probe batches go out until
 * every publisher shows a seq in GET /instances (ZeroMQ's slow joiner), then every batch,
 * pre-encoded, is published with vLLM's framing [topic, seq 8-byte BE, msgpack] and the
 * clock stops when /metrics counts every batch applied (polled every 2 ms). Stored and
 * removed event counts, holders, no resync and nothing unplaced are checked.
 *
 * /query latency: 64 registrations answered (the engines and more, on PUB sockets of
 * their own that publish nothing), then POST /query of 8192-token prompts (512 blocks,
 * the first 16 ids of the trace's longest recent requests) over one keep-alive libcurl
 * connection: a warm-up, then --queries timed calls, p50 / p99; every answer must name
 * 64 instances. Then the same queries again while a hostile publisher sends its worst (the
 * block comment at e2e_hostile): p50 / p99 / max next to the same limit.
 *
 * Memory, twice: a fresh kvpool-indexer, the engines registered again, VmRSS
 * (/proc/PID/status) read; then --pairs (block, instance) pairs stored (chains of 512
 * blocks, engine hashes and token ids as above), first each block held by one instance
 * (the index's worst case per pair), then each chain stored by 4 engines (round robin);
 * VmRSS read again when /metrics shows every holder and block; bytes per pair.
 *
 * The in-process replay (index, then baseline) runs IX_PASSES times and the end-to-end load
 * as many times, each on a fresh indexer (the /query latency after the last): each figure
 * is the median pass, with the range in the JSON.
 *
 * Limits (issue 46), reported with each figure and never failing the run: >= 10 M block
 * ops/s in process on one core; >= 2 M block events/s end to end; /query p99 <= 1 ms;
 * <= 64 bytes per (block, instance) pair. A run fails on an error or a wrong count only.
 *
 * The indexer's answers (the in-process JSON, /query, /instances) are read with the
 * project's JSON reader (common/json.h), outside the timed calls.
 *
 * Thread: the caller's (ZeroMQ's own I/O thread and libcurl aside).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <msgpack.h>
#include <zmq.h>

#include "client/tools/bench/bench.h"
#include "common/json.h"
#include "indexer/decode.h"
#include "indexer/index.h"

#define IX_BS 16u         /* tokens per block */
#define IX_PER_ID 32u     /* blocks of 16 per trace hash id (512 tokens) */
#define IX_VOCAB 151936u  /* token ids drawn below this (Qwen's vocabulary) */
#define IX_NIL UINT64_MAX /* no parent */
#define IX_MODEL "bench-model"
#define IX_TOPIC "kv@bench"
#define IX_QUERY_INSTANCES 64u
#define IX_QUERY_BLOCKS 512u /* 8192 tokens */
#define IX_WARMUP 50u
#define IX_CHAIN 512u            /* blocks per stored event of the memory load */
#define IX_MEM_BASE (1ull << 50) /* memory-load keys: beyond any trace's */
#define IX_WAIT_S 120.0          /* the longest wait for the indexer to catch up */
/* passes of the in-process replay (index and baseline interleaved) and of the end-to-end
 * load, each figure the median pass: a shared 2-core machine drifts within seconds */
#define IX_PASSES 3

/* limits (issue 46) */
#define LIMIT_OPS_PER_S 10e6
#define LIMIT_E2E_PER_S 2e6
#define LIMIT_P99_US 1000.0
#define LIMIT_BYTES_PER_PAIR 64.0

/* ---------------- blocks ---------------- */

static uint64_t engine_hash(uint64_t key)
{
    return kvp_bench_mix64(key ^ 0x5eed5eed5eedull) | 1; /* never 0 */
}

static void block_tokens(uint64_t key, uint32_t *t)
{
    for (uint32_t p = 0; p < IX_BS; p++)
        t[p] = (uint32_t)(kvp_bench_mix64(key * IX_BS + p) % IX_VOCAB);
}

/* ---------------- a u64 -> u64 open-addressing map (LRU index, baseline) ----------------
 * Keys are never 0 (callers add 1 where needed); deletion by backward shift. */

typedef struct u64map {
    uint64_t *k, *v;
    size_t mask, n;
} u64map_t;

static size_t slot_of(const u64map_t *m, uint64_t k)
{
    return (size_t)kvp_bench_mix64(k) & m->mask;
}

static int map_init(u64map_t *m, size_t cap)
{
    size_t c = 16;
    while (c < cap * 2)
        c *= 2;
    m->k = calloc(c, sizeof(*m->k));
    m->v = calloc(c, sizeof(*m->v));
    m->mask = c - 1;
    m->n = 0;
    return m->k != NULL && m->v != NULL ? 0 : -1;
}

static void map_free(u64map_t *m)
{
    free(m->k);
    free(m->v);
    memset(m, 0, sizeof(*m));
}

static uint64_t *map_get(const u64map_t *m, uint64_t k)
{
    for (size_t i = slot_of(m, k);; i = (i + 1) & m->mask) {
        if (m->k[i] == k)
            return &m->v[i];
        if (m->k[i] == 0)
            return NULL;
    }
}

static int map_put(u64map_t *m, uint64_t k, uint64_t v);

static int map_grow(u64map_t *m)
{
    u64map_t b;
    if (map_init(&b, m->mask + 1) != 0) {
        map_free(&b);
        return -1;
    }
    for (size_t i = 0; i <= m->mask; i++)
        if (m->k[i] != 0)
            map_put(&b, m->k[i], m->v[i]);
    map_free(m);
    *m = b;
    return 0;
}

static int map_put(u64map_t *m, uint64_t k, uint64_t v)
{
    if ((m->n + 1) * 2 > m->mask + 1 && map_grow(m) != 0)
        return -1;
    size_t i = slot_of(m, k);
    while (m->k[i] != 0 && m->k[i] != k)
        i = (i + 1) & m->mask;
    m->n += m->k[i] == 0;
    m->k[i] = k;
    m->v[i] = v;
    return 0;
}

static void map_del(u64map_t *m, uint64_t k)
{
    size_t i = slot_of(m, k);
    while (m->k[i] != k) {
        if (m->k[i] == 0)
            return;
        i = (i + 1) & m->mask;
    }
    for (size_t j = (i + 1) & m->mask; m->k[j] != 0; j = (j + 1) & m->mask) {
        size_t h = slot_of(m, m->k[j]);
        bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            m->k[i] = m->k[j];
            m->v[i] = m->v[j];
            i = j;
        }
    }
    m->k[i] = 0;
    m->n--;
}

/* ---------------- mock engines: an exact LRU of blocks ---------------- */

typedef struct engine {
    u64map_t where; /* key + 1 -> node */
    uint64_t *key;
    uint32_t *prev, *next; /* node 0: none; head: least recent */
    uint32_t head, tail, n, cap, free_top;
    uint32_t *free_list;
} engine_t;

static int engine_init(engine_t *e, uint32_t cap)
{
    memset(e, 0, sizeof(*e));
    e->cap = cap;
    e->key = calloc(cap + 1, sizeof(*e->key));
    e->prev = calloc(cap + 1, sizeof(*e->prev));
    e->next = calloc(cap + 1, sizeof(*e->next));
    e->free_list = malloc(cap * sizeof(*e->free_list));
    if (map_init(&e->where, cap) != 0 || e->key == NULL || e->prev == NULL || e->next == NULL ||
        e->free_list == NULL)
        return -1;
    for (uint32_t i = 0; i < cap; i++)
        e->free_list[i] = cap - i;
    e->free_top = cap;
    return 0;
}

static void engine_free(engine_t *e)
{
    map_free(&e->where);
    free(e->key);
    free(e->prev);
    free(e->next);
    free(e->free_list);
}

static void lru_unlink(engine_t *e, uint32_t i)
{
    if (e->prev[i] != 0)
        e->next[e->prev[i]] = e->next[i];
    else
        e->head = e->next[i];
    if (e->next[i] != 0)
        e->prev[e->next[i]] = e->prev[i];
    else
        e->tail = e->prev[i];
}

static void lru_push(engine_t *e, uint32_t i)
{
    e->prev[i] = e->tail;
    e->next[i] = 0;
    if (e->tail != 0)
        e->next[e->tail] = i;
    else
        e->head = i;
    e->tail = i;
}

static bool engine_has(const engine_t *e, uint64_t key)
{
    return map_get(&e->where, key + 1) != NULL;
}

static void engine_touch(engine_t *e, uint64_t key)
{
    uint64_t *v = map_get(&e->where, key + 1);
    if (v != NULL) {
        lru_unlink(e, (uint32_t)*v);
        lru_push(e, (uint32_t)*v);
    }
}

/* The least recently used block goes: its key. */
static uint64_t engine_evict(engine_t *e)
{
    uint32_t i = e->head;
    uint64_t key = e->key[i];
    lru_unlink(e, i);
    map_del(&e->where, key + 1);
    e->free_list[e->free_top++] = i;
    e->n--;
    return key;
}

static int engine_add(engine_t *e, uint64_t key)
{
    uint32_t i = e->free_list[--e->free_top];
    e->key[i] = key;
    if (map_put(&e->where, key + 1, i) != 0)
        return -1;
    lru_push(e, i);
    e->n++;
    return 0;
}

/* ---------------- text: answers, HTTP bodies ---------------- */

typedef struct text {
    char *p; /* NUL-terminated once anything was put */
    size_t len, cap;
} text_t;

/* Append s[0..len): false when out of memory (nothing appended). */
static bool text_put(text_t *t, const char *s, size_t len)
{
    if (kvp_bench_grow((void **)&t->p, &t->cap, t->len + len + 1, 1) != 0)
        return false;
    memcpy(t->p + t->len, s, len);
    t->len += len;
    t->p[t->len] = '\0';
    return true;
}

static void text_clear(text_t *t)
{
    t->len = 0;
    if (t->p != NULL)
        t->p[0] = '\0';
}

/* ---------------- the streams ---------------- */

/* One item: a query (the prompt of request req, n blocks, routed to engine, whose expected
 * run is `expect` blocks) or a batch (engine's events: n_rm removed keys, then n_runs runs
 * of stored keys, each [count, parent key or IX_NIL, keys...], from keys[at]). */
typedef struct item {
    bool query;
    uint32_t engine, req, n, expect, n_rm, n_runs;
    size_t at;
} item_t;

typedef struct ix {
    const kvp_bench_opts_t *o;
    kvp_bench_reqs_t tr;
    engine_t *eng;
    unsigned n_eng;
    item_t *items;
    size_t n_items, cap_items;
    uint64_t *keys;
    size_t n_keys, cap_keys;
    /* totals */
    uint64_t stored_blocks, removed_blocks, query_blocks, stored_events, removed_events, batches,
        queries, resident, hit_blocks; /* hit_blocks: the routed engines' expected runs */
    /* scratch */
    uint32_t *tok;   /* tokens of the longest prompt */
    uint64_t *hash;  /* its seq hashes */
    uint64_t *qkeys; /* its block keys */
    size_t max_blocks;
    msgpack_sbuffer sb;
    text_t ans; /* the last answer (sink) */
    int errors;
} ix_t;

static int push_key(ix_t *x, uint64_t k)
{
    if (kvp_bench_grow((void **)&x->keys, &x->cap_keys, x->n_keys + 1, sizeof(*x->keys)) != 0)
        return -1;
    x->keys[x->n_keys++] = k;
    return 0;
}

static item_t *push_item(ix_t *x)
{
    if (kvp_bench_grow((void **)&x->items, &x->cap_items, x->n_items + 1, sizeof(*x->items)) != 0)
        return NULL;
    item_t *it = &x->items[x->n_items++];
    memset(it, 0, sizeof(*it));
    return it;
}

/* Request q's block keys into x->qkeys; how many (at most the engine pool). */
static size_t req_keys(const ix_t *x, size_t q)
{
    size_t n = 0;
    for (size_t i = x->tr.off[q]; i < x->tr.off[q + 1] && n < x->max_blocks; i++)
        for (uint32_t j = 0; j < IX_PER_ID && n < x->max_blocks; j++)
            x->qkeys[n++] = (x->tr.ids[i] << 5) | j;
    return n;
}

/* One request: the query, then the engine's batch. */
static int make_request(ix_t *x, size_t q)
{
    size_t n = req_keys(x, q);
    if (n == 0)
        return 0;
    unsigned e = (unsigned)(kvp_bench_mix64(x->tr.ids[x->tr.off[q]]) % x->n_eng);
    engine_t *en = &x->eng[e];
    size_t run = 0;
    while (run < n && engine_has(en, x->qkeys[run]))
        run++;
    item_t *qi = push_item(x);
    if (qi == NULL)
        return -1;
    *qi = (item_t){
        .query = true, .engine = e, .req = (uint32_t)q, .n = (uint32_t)n, .expect = (uint32_t)run};
    x->queries++;
    x->query_blocks += n;
    x->hit_blocks += run;
    size_t lack = 0;
    for (size_t i = n; i-- > 0;) { /* tail first: the head ends most recent */
        if (engine_has(en, x->qkeys[i]))
            engine_touch(en, x->qkeys[i]);
        else
            lack++;
    }
    if (lack == 0)
        return 0;
    item_t *b = push_item(x);
    if (b == NULL)
        return -1;
    b->engine = e;
    b->at = x->n_keys;
    while (en->n + lack > en->cap) {
        if (push_key(x, engine_hash(engine_evict(en))) != 0)
            return -1;
        b->n_rm++;
    }
    if (b->n_rm > 0) {
        x->removed_events++;
        x->removed_blocks += b->n_rm;
    }
    /* runs of lacking blocks, each with its parent; added in order, then touched tail
     * first with the rest so that the head stays most recent */
    for (size_t i = 0; i < n;) {
        if (engine_has(en, x->qkeys[i])) {
            i++;
            continue;
        }
        size_t at = x->n_keys, j = i;
        if (push_key(x, 0) != 0 || push_key(x, i > 0 ? x->qkeys[i - 1] : IX_NIL) != 0)
            return -1;
        for (; j < n && !engine_has(en, x->qkeys[j]); j++)
            if (push_key(x, x->qkeys[j]) != 0 || engine_add(en, x->qkeys[j]) != 0)
                return -1;
        x->keys[at] = j - i;
        x->stored_blocks += j - i;
        x->stored_events++;
        b->n_runs++;
        i = j;
    }
    for (size_t i = n; i-- > 0;)
        engine_touch(en, x->qkeys[i]);
    x->batches++;
    return 0;
}

static int make_streams(ix_t *x)
{
    for (size_t q = 0; q < x->tr.n_req; q++)
        if (make_request(x, q) != 0) {
            fprintf(stderr, "kvpool-bench index: out of memory making the streams\n");
            return -1;
        }
    for (unsigned e = 0; e < x->n_eng; e++)
        x->resident += x->eng[e].n;
    return 0;
}

/* ---------------- msgpack: vLLM's EventBatch, array-like ---------------- */

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* [ts, [BlockRemoved?, BlockStored...]] of batch `it` into x->sb. */
static void encode_batch(ix_t *x, const item_t *it)
{
    msgpack_sbuffer_clear(&x->sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &x->sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_double(&pk, (double)time(NULL));
    msgpack_pack_array(&pk, (it->n_rm > 0) + it->n_runs);
    const uint64_t *k = x->keys + it->at;
    if (it->n_rm > 0) { /* ["BlockRemoved", hashes, medium] */
        msgpack_pack_array(&pk, 3);
        pack_str(&pk, "BlockRemoved");
        msgpack_pack_array(&pk, it->n_rm);
        for (uint32_t i = 0; i < it->n_rm; i++)
            msgpack_pack_uint64(&pk, k[i]); /* already engine hashes */
        msgpack_pack_nil(&pk);
        k += it->n_rm;
    }
    uint32_t t[IX_BS];
    for (uint32_t r = 0; r < it->n_runs; r++) {
        /* ["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium] */
        uint64_t cnt = k[0], parent = k[1];
        k += 2;
        msgpack_pack_array(&pk, 7);
        pack_str(&pk, "BlockStored");
        msgpack_pack_array(&pk, (size_t)cnt);
        for (uint64_t i = 0; i < cnt; i++)
            msgpack_pack_uint64(&pk, engine_hash(k[i]));
        if (parent == IX_NIL)
            msgpack_pack_nil(&pk);
        else
            msgpack_pack_uint64(&pk, engine_hash(parent));
        msgpack_pack_array(&pk, (size_t)cnt * IX_BS);
        for (uint64_t i = 0; i < cnt; i++) {
            block_tokens(k[i], t);
            for (uint32_t p = 0; p < IX_BS; p++)
                msgpack_pack_uint32(&pk, t[p]);
        }
        msgpack_pack_uint32(&pk, IX_BS);
        msgpack_pack_nil(&pk);
        msgpack_pack_nil(&pk);
        k += cnt;
    }
}

/* The query's tokens (x->tok) and keys (x->qkeys); its block count. */
static size_t query_tokens(ix_t *x, const item_t *it)
{
    size_t n = req_keys(x, it->req);
    for (size_t i = 0; i < n; i++)
        block_tokens(x->qkeys[i], x->tok + i * IX_BS);
    return n;
}

/* ---------------- answers ---------------- */

/* The index's put callback: its text into x->ans. */
static void sink(void *arg, const char *s, size_t len)
{
    ix_t *x = arg;
    text_put(&x->ans, s, len);
}

/* An index answer ({TENANT:{INSTANCE:{"longest_matched":N,...},...}}) parsed into j: the
 * token of its tenant's object, or -1 when it is not that JSON (j freed by the caller). */
static int64_t answer_parse(kvp_json_t *j, const char *ans, size_t len)
{
    char why[96];
    memset(j, 0, sizeof(*j));
    if (ans == NULL || kvp_json_parse(j, ans, len, why, sizeof(why)) != KVP_JSON_OK ||
        j->t[0].type != KVP_J_OBJECT || j->t[0].size != 1 || j->t[2].type != KVP_J_OBJECT)
        return -1;
    return 2; /* after the tenant's name */
}

/* engine-E's longest_matched in an answer (tokens), or -1 when absent. */
static long long answer_of(const char *ans, size_t len, unsigned e)
{
    kvp_json_t j;
    char inst[32];
    snprintf(inst, sizeof(inst), "engine-%u", e);
    int64_t t = answer_parse(&j, ans, len);
    int64_t i = t >= 0 ? kvp_json_get(&j, (uint32_t)t, inst) : -1;
    int64_t m = i >= 0 ? kvp_json_get(&j, (uint32_t)i, "longest_matched") : -1;
    uint64_t v;
    long long got =
        m >= 0 && kvp_json_u64(&j, (uint32_t)m, &v) && v <= INT64_MAX ? (long long)v : -1;
    kvp_json_free(&j);
    return got;
}

/* The instances an answer names with a longest_matched. */
static unsigned answer_instances(const char *ans, size_t len)
{
    kvp_json_t j;
    unsigned n = 0;
    int64_t t = answer_parse(&j, ans, len);
    for (uint32_t i = 0, k = (uint32_t)t + 1; t >= 0 && i < j.t[t].size; i++) {
        n += kvp_json_get(&j, k + 1, "longest_matched") >= 0; /* k: a name, k + 1 its value */
        k = j.t[k + 1].next;
    }
    kvp_json_free(&j);
    return n;
}

static void check_answer(ix_t *x, const char *what, const item_t *it, long long got)
{
    long long want = (long long)it->expect * IX_BS;
    if (got != want && x->errors++ < 5)
        fprintf(stderr,
                "kvpool-bench index: %s: request %u: engine-%u longest_matched %lld, expected "
                "%lld\n",
                what, it->req, it->engine, got, want);
}

/* A counter of a Prometheus text (the first line starting with `name `), or -1. */
static double metric(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
        if (strncmp(p, name, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1;
}

/* ---------------- the replay driver ---------------- */

/* What a replay does with the streams: query(x, it, n, arg) with the prompt's tokens in
 * x->tok (n blocks), batch(x, it, b, arg) with the batch decoded by the indexer's decoder
 * (its decode time in *decode_s). Each returns 0, or -1 to stop. */
typedef struct replay_ops {
    int (*query)(ix_t *x, const item_t *it, size_t n, void *arg);
    int (*batch)(ix_t *x, const item_t *it, const kvp_idx_batch_t *b, void *arg);
} replay_ops_t;

/* The streams, in order: tokens made and batches encoded outside the callbacks' timing.
 * 0, or -1 when a callback stopped it or a batch did not decode. */
static int replay_streams(ix_t *x, const replay_ops_t *ops, void *arg, double *decode_s)
{
    kvp_decoder_t dec;
    kvp_decoder_init(&dec);
    int rc = 0;
    char why[160];
    for (size_t i = 0; i < x->n_items && rc == 0; i++) {
        const item_t *it = &x->items[i];
        if (it->query) {
            rc = ops->query(x, it, query_tokens(x, it), arg);
            continue;
        }
        encode_batch(x, it);
        kvp_idx_batch_t b;
        double t0 = kvp_bench_now();
        kvp_status_t st =
            kvp_decode_batch(&dec, (const uint8_t *)x->sb.data, x->sb.size, &b, why, sizeof(why));
        *decode_s += kvp_bench_now() - t0;
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench index: a batch does not decode: %s\n", why);
            rc = -1;
            break;
        }
        rc = ops->batch(x, it, &b, arg);
    }
    kvp_decoder_cleanup(&dec);
    return rc;
}

/* ---------------- in process ---------------- */

typedef struct inproc {
    double t_decode, t_apply, t_query, t_base_decode, t_base_apply, t_base_query;
} inproc_t;

typedef struct inproc_run {
    kvp_idx_t *idx;
    uint32_t *subs; /* engine -> its subscription */
    inproc_t *r;
} inproc_run_t;

static int idx_setup(ix_t *x, kvp_idx_t **idx_p, uint32_t *subs)
{
    kvp_idx_params_t p = {0};
    if (kvp_idx_create(&p, idx_p) != KVP_OK)
        return -1;
    kvp_idx_wrlock(*idx_p);
    for (unsigned e = 0; e < x->n_eng; e++) {
        char ep[64], inst[32], err[256];
        snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", 20000 + e);
        snprintf(inst, sizeof(inst), "engine-%u", e);
        kvp_idx_reg_params_t r = {.endpoint = ep,
                                  .replay_endpoint = "",
                                  .type = "vLLM",
                                  .model = IX_MODEL,
                                  .lora = "",
                                  .tenant = "default",
                                  .instance = inst,
                                  .salt = "",
                                  .block_size = IX_BS};
        bool changed;
        if (kvp_idx_register(*idx_p, &r, &changed, err, sizeof(err)) != KVP_OK) {
            fprintf(stderr, "kvpool-bench index: register %s: %s\n", inst, err);
            kvp_idx_unlock(*idx_p);
            return -1;
        }
    }
    kvp_idx_sub_info_t *info = calloc(x->n_eng, sizeof(*info));
    size_t n = info != NULL ? kvp_idx_subs(*idx_p, info, x->n_eng) : 0;
    kvp_idx_unlock(*idx_p);
    for (size_t i = 0; i < n && i < x->n_eng; i++) {
        unsigned port = (unsigned)atoi(strrchr(info[i].endpoint, ':') + 1);
        subs[port - 20000] = info[i].id;
    }
    free(info);
    return n == x->n_eng ? 0 : -1;
}

static int inproc_query(ix_t *x, const item_t *it, size_t n, void *arg)
{
    inproc_run_t *ir = arg;
    text_clear(&x->ans);
    double t0 = kvp_bench_now();
    kvp_idx_hash_tokens(0, x->tok, n, IX_BS, false, 0, x->hash);
    kvp_idx_query_t q = {.model = IX_MODEL,
                         .lora = "",
                         .tenant = "default",
                         .salt = "",
                         .block_size = IX_BS,
                         .hashes = x->hash,
                         .n = n};
    kvp_idx_rdlock(ir->idx);
    kvp_status_t st = kvp_idx_query(ir->idx, &q, sink, x);
    kvp_idx_unlock(ir->idx);
    ir->r->t_query += kvp_bench_now() - t0;
    check_answer(x, "in process", it,
                 st == KVP_OK ? answer_of(x->ans.p, x->ans.len, it->engine) : -1);
    return 0;
}

static int inproc_batch(ix_t *x, const item_t *it, const kvp_idx_batch_t *b, void *arg)
{
    inproc_run_t *ir = arg;
    double t0 = kvp_bench_now();
    kvp_idx_wrlock(ir->idx);
    kvp_idx_apply(ir->idx, ir->subs[it->engine], b);
    kvp_idx_unlock(ir->idx);
    ir->r->t_apply += kvp_bench_now() - t0;
    (void)x;
    return 0;
}

static int run_inproc(ix_t *x, inproc_t *r)
{
    static const replay_ops_t ops = {inproc_query, inproc_batch};
    inproc_run_t ir = {.subs = calloc(x->n_eng, sizeof(uint32_t)), .r = r};
    int rc = -1;
    if (ir.subs == NULL || idx_setup(x, &ir.idx, ir.subs) != 0) {
        fprintf(stderr, "kvpool-bench index: cannot set the index up\n");
        goto out;
    }
    if (replay_streams(x, &ops, &ir, &r->t_decode) != 0)
        goto out;
    text_clear(&x->ans);
    kvp_idx_metrics(ir.idx, sink, x);
    double holders = metric(x->ans.p, "kvpool_indexer_block_holders");
    double unplaced = metric(x->ans.p, "kvpool_indexer_unplaced_blocks_total");
    if (holders != (double)x->resident || unplaced != 0) {
        fprintf(stderr,
                "kvpool-bench index: in process: %.0f holders for %" PRIu64
                " resident blocks, %.0f unplaced\n",
                holders, x->resident, unplaced);
        x->errors++;
    }
    rc = 0;
out:
    kvp_idx_destroy(ir.idx);
    free(ir.subs);
    return rc;
}

/* ---------------- the naive baseline ---------------- */

typedef struct naive {
    u64map_t *set; /* per instance: its standard hashes (std_key) */
    u64map_t e2s;  /* engine hash -> standard hash */
    uint64_t *h, *s;
    uint32_t *t, *run;
    size_t hcap, scap, tcap;
    inproc_t *r;
} naive_t;

static uint64_t std_key(uint64_t s)
{
    return s != 0 ? s : 1; /* the set's empty key; one hash in 2^64 aliases */
}

static int naive_op(naive_t *nv, unsigned e, const kvp_idx_batch_t *b, const kvp_idx_op_t *op)
{
    size_t n = op->n_hashes;
    if (kvp_bench_grow((void **)&nv->h, &nv->hcap, n, sizeof(*nv->h)) != 0 ||
        kvp_bench_grow((void **)&nv->s, &nv->scap, n, sizeof(*nv->s)) != 0 ||
        kvp_bench_grow((void **)&nv->t, &nv->tcap, op->n_tokens, sizeof(*nv->t)) != 0)
        return -1;
    b->hashes(b->arg, op, nv->h);
    if (op->kind == KVP_IDX_STORED) {
        b->tokens(b->arg, op, nv->t);
        uint64_t *parent = op->has_parent ? map_get(&nv->e2s, op->parent) : NULL;
        kvp_idx_hash_tokens(0, nv->t, n, IX_BS, parent != NULL, parent != NULL ? *parent : 0,
                            nv->s);
        for (size_t i = 0; i < n; i++)
            if (map_put(&nv->set[e], std_key(nv->s[i]), 1) != 0 ||
                map_put(&nv->e2s, nv->h[i], nv->s[i]) != 0)
                return -1;
    } else if (op->kind == KVP_IDX_REMOVED) {
        for (size_t i = 0; i < n; i++) {
            uint64_t *sv = map_get(&nv->e2s, nv->h[i]);
            if (sv != NULL)
                map_del(&nv->set[e], std_key(*sv));
        }
    }
    return 0;
}

static int naive_batch(ix_t *x, const item_t *it, const kvp_idx_batch_t *b, void *arg)
{
    naive_t *nv = arg;
    double t0 = kvp_bench_now();
    int rc = 0;
    for (size_t k = 0; k < b->n_ops && rc == 0; k++)
        rc = naive_op(nv, it->engine, b, &b->ops[k]);
    nv->r->t_base_apply += kvp_bench_now() - t0;
    if (rc != 0)
        fprintf(stderr, "kvpool-bench index: baseline: out of memory\n");
    (void)x;
    return rc;
}

static int naive_query(ix_t *x, const item_t *it, size_t n, void *arg)
{
    naive_t *nv = arg;
    double t0 = kvp_bench_now();
    kvp_idx_hash_tokens(0, x->tok, n, IX_BS, false, 0, x->hash);
    for (unsigned e = 0; e < x->n_eng; e++) {
        size_t k = 0;
        while (k < n && map_get(&nv->set[e], std_key(x->hash[k])) != NULL)
            k++;
        nv->run[e] = (uint32_t)k;
    }
    nv->r->t_base_query += kvp_bench_now() - t0;
    check_answer(x, "baseline", it, (long long)nv->run[it->engine] * IX_BS);
    return 0;
}

static int run_naive(ix_t *x, inproc_t *r)
{
    static const replay_ops_t ops = {naive_query, naive_batch};
    naive_t nv = {.r = r};
    int rc = -1;
    nv.run = calloc(x->n_eng, sizeof(*nv.run));
    nv.set = calloc(x->n_eng, sizeof(*nv.set));
    if (nv.run == NULL || nv.set == NULL || map_init(&nv.e2s, 1u << 20) != 0)
        goto out;
    for (unsigned e = 0; e < x->n_eng; e++)
        if (map_init(&nv.set[e], x->eng[e].cap) != 0)
            goto out;
    rc = replay_streams(x, &ops, &nv, &r->t_base_decode);
out:
    for (unsigned e = 0; nv.set != NULL && e < x->n_eng; e++)
        map_free(&nv.set[e]);
    free(nv.set);
    map_free(&nv.e2s);
    free(nv.h);
    free(nv.s);
    free(nv.t);
    free(nv.run);
    return rc;
}

/* ---------------- the daemon: HTTP ---------------- */

typedef struct daemon {
    pid_t pid;
    char addr[128];
    CURL *curl;
    struct curl_slist *hdr;
    text_t out; /* the last answer */
} daemon_t;

static size_t curl_sink(char *p, size_t sz, size_t n, void *arg)
{
    daemon_t *d = arg;
    size_t len = sz * n;
    return text_put(&d->out, p, len) ? len : 0;
}

/* GET (body NULL) or POST path; the HTTP status (0: no answer), the answer in d->out.p. */
static long http(daemon_t *d, const char *path, const char *body, size_t len)
{
    char url[256];
    snprintf(url, sizeof(url), "http://%s%s", d->addr, path);
    text_clear(&d->out);
    curl_easy_setopt(d->curl, CURLOPT_URL, url);
    if (body != NULL) {
        curl_easy_setopt(d->curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(d->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    } else {
        curl_easy_setopt(d->curl, CURLOPT_HTTPGET, 1L);
    }
    long code = 0;
    if (curl_easy_perform(d->curl) != CURLE_OK ||
        curl_easy_getinfo(d->curl, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK)
        return 0;
    return code;
}

static int daemon_start(daemon_t *d, const kvp_bench_opts_t *o)
{
    memset(d, 0, sizeof(*d));
    char *argv[] = {
        (char *)(o->idx_bin != NULL ? o->idx_bin : kvp_bench_find_bin("kvpool-indexer")),
        "--listen",
        "127.0.0.1:0",
        "--ready-fd",
        "3",
        "--log-level",
        "warn",
        NULL};
    d->pid = kvp_bench_spawn_ready(argv, d->addr, sizeof(d->addr));
    if (d->pid < 0)
        return -1;
    d->curl = curl_easy_init();
    d->hdr = curl_slist_append(NULL, "Content-Type: application/json");
    if (d->curl == NULL || d->hdr == NULL)
        return -1;
    /* no "Expect: 100-continue" round trip before a large body: routers do not send it */
    d->hdr = curl_slist_append(d->hdr, "Expect:");
    curl_easy_setopt(d->curl, CURLOPT_HTTPHEADER, d->hdr);
    curl_easy_setopt(d->curl, CURLOPT_WRITEFUNCTION, curl_sink);
    curl_easy_setopt(d->curl, CURLOPT_WRITEDATA, d);
    curl_easy_setopt(d->curl, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(d->curl, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(d->curl, CURLOPT_NOSIGNAL, 1L);
    return 0;
}

static void daemon_stop(daemon_t *d)
{
    if (d->curl != NULL)
        curl_easy_cleanup(d->curl);
    curl_slist_free_all(d->hdr);
    free(d->out.p);
    if (d->pid > 0)
        kvp_bench_stop_pid(d->pid);
    memset(d, 0, sizeof(*d));
}

/* A metric of the daemon's /metrics (-1: not there or no answer). */
static double daemon_metric(daemon_t *d, const char *name)
{
    return http(d, "/metrics", NULL, 0) == 200 ? metric(d->out.p, name) : -1;
}

static int daemon_register_model(daemon_t *d, const char *endpoint, const char *instance,
                                 const char *model)
{
    char body[512];
    int n = snprintf(body, sizeof(body),
                     "{\"endpoint\":\"%s\",\"type\":\"vLLM\",\"modelname\":\"%s\","
                     "\"instance_id\":\"%s\",\"block_size\":%u,\"dp_rank\":0}",
                     endpoint, model, instance, IX_BS);
    long code = http(d, "/register", body, (size_t)n);
    if (code != 200) {
        fprintf(stderr, "kvpool-bench index: POST /register %s: HTTP %ld: %s\n", instance, code,
                d->out.p != NULL ? d->out.p : "");
        return -1;
    }
    return 0;
}

static int daemon_register(daemon_t *d, const char *endpoint, const char *instance)
{
    return daemon_register_model(d, endpoint, instance, IX_MODEL);
}

/* ---------------- publishers ---------------- */

typedef struct pubs {
    void *ctx;
    void **sock;
    char (*ep)[64];
    uint64_t *seq;
    unsigned n;
} pubs_t;

static int pubs_open(pubs_t *p, unsigned n)
{
    memset(p, 0, sizeof(*p));
    p->ctx = zmq_ctx_new();
    p->sock = calloc(n, sizeof(*p->sock));
    p->ep = calloc(n, sizeof(*p->ep));
    p->seq = calloc(n, sizeof(*p->seq));
    if (p->ctx == NULL || p->sock == NULL || p->ep == NULL || p->seq == NULL)
        return -1;
    while (p->n < n) {
        void *s = zmq_socket(p->ctx, ZMQ_PUB);
        int zero = 0;
        size_t len = sizeof(p->ep[p->n]);
        if (s == NULL)
            return -1;
        p->sock[p->n] = s; /* closed by pubs_close whatever happens next */
        p->n++;
        zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero)); /* no limit: nothing dropped */
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
        if (zmq_bind(s, "tcp://127.0.0.1:*") != 0 ||
            zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, p->ep[p->n - 1], &len) != 0) {
            fprintf(stderr, "kvpool-bench index: cannot bind a PUB socket: %s\n",
                    zmq_strerror(zmq_errno()));
            return -1;
        }
    }
    return 0;
}

static void pubs_close(pubs_t *p)
{
    for (unsigned i = 0; i < p->n; i++)
        zmq_close(p->sock[i]);
    if (p->ctx != NULL)
        zmq_ctx_term(p->ctx);
    free(p->sock);
    free(p->ep);
    free(p->seq);
    memset(p, 0, sizeof(*p));
}

/* [topic, seq, payload] on publisher i; with `borrow` the payload is sent from where it is
 * (it must stay there until the socket is closed), else copied. */
static int publish(pubs_t *p, unsigned i, const void *payload, size_t len, bool borrow)
{
    uint8_t seq[8];
    for (int k = 0; k < 8; k++)
        seq[k] = (uint8_t)(p->seq[i] >> (56 - 8 * k));
    p->seq[i]++;
    zmq_msg_t m;
    int r = borrow ? zmq_msg_init_data(&m, (void *)payload, len, NULL, NULL)
                   : zmq_msg_init_size(&m, len);
    if (r == 0 && !borrow)
        memcpy(zmq_msg_data(&m), payload, len);
    if (r != 0 || zmq_send(p->sock[i], IX_TOPIC, strlen(IX_TOPIC), ZMQ_SNDMORE) < 0 ||
        zmq_send(p->sock[i], seq, 8, ZMQ_SNDMORE) < 0 || zmq_msg_send(&m, p->sock[i], 0) < 0) {
        if (r == 0)
            zmq_msg_close(&m);
        fprintf(stderr, "kvpool-bench index: zmq_send: %s\n", zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

/* The seq of the publisher at endpoint ep in a GET /instances answer
 * ({"instances":[{...,"publishers":[{"endpoint":EP,...,"seq":N|null,...}]}]}): false when
 * it is not there or null (nothing heard from it yet). */
static bool publisher_seq(const kvp_json_t *j, const char *ep, uint64_t *seq_p)
{
    int64_t insts = kvp_json_get(j, 0, "instances");
    if (insts < 0 || j->t[insts].type != KVP_J_ARRAY)
        return false;
    for (uint32_t i = 0, r = (uint32_t)insts + 1; i < j->t[insts].size; i++, r = j->t[r].next) {
        int64_t pubs = kvp_json_get(j, r, "publishers");
        if (pubs < 0 || j->t[pubs].type != KVP_J_ARRAY)
            continue;
        for (uint32_t k = 0, b = (uint32_t)pubs + 1; k < j->t[pubs].size; k++, b = j->t[b].next) {
            char name[256];
            int64_t e = kvp_json_get(j, b, "endpoint");
            if (e < 0 || !kvp_json_str(j, (uint32_t)e, name, sizeof(name)) || strcmp(name, ep) != 0)
                continue;
            int64_t s = kvp_json_get(j, b, "seq");
            return s >= 0 && kvp_json_u64(j, (uint32_t)s, seq_p);
        }
    }
    return false;
}

/* Register publishers [0, n) as engine-0.. and probe until the indexer has taken the last
 * probe of each (its seq in /instances is the last one sent): ZeroMQ's slow joiner drops
 * what is published before the subscription is made. */
static int pubs_register(daemon_t *d, pubs_t *p, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        char inst[32];
        snprintf(inst, sizeof(inst), "engine-%u", i);
        if (daemon_register(d, p->ep[i], inst) != 0)
            return -1;
    }
    static const uint8_t empty[] = {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90}; /* [0.0, []] */
    double deadline = kvp_bench_now() + 30;
    for (;;) {
        kvp_json_t j;
        char why[96];
        if (http(d, "/instances", NULL, 0) != 200)
            return -1;
        if (kvp_json_parse(&j, d->out.p, d->out.len, why, sizeof(why)) != KVP_JSON_OK) {
            fprintf(stderr, "kvpool-bench index: GET /instances: %s\n", why);
            kvp_json_free(&j);
            return -1;
        }
        unsigned waiting = 0;
        for (unsigned i = 0; i < n; i++) {
            uint64_t seq;
            if (publisher_seq(&j, p->ep[i], &seq)) {
                waiting += seq + 1 != p->seq[i]; /* one on its way */
                continue;
            }
            waiting++;
            if (publish(p, i, empty, sizeof(empty), false) != 0) {
                kvp_json_free(&j);
                return -1;
            }
        }
        kvp_json_free(&j);
        if (waiting == 0)
            return 0;
        if (kvp_bench_now() > deadline) {
            fprintf(stderr, "kvpool-bench index: %u publishers never heard by the indexer\n",
                    waiting);
            return -1;
        }
        usleep(20000);
    }
}

/* Wait until /metrics' batches reach `want`; the time it was seen (0: never). */
static double wait_batches(daemon_t *d, double want)
{
    double deadline = kvp_bench_now() + IX_WAIT_S;
    while (kvp_bench_now() < deadline) {
        double got = daemon_metric(d, "kvpool_indexer_batches_total");
        if (got < 0)
            return 0;
        if (got >= want)
            return kvp_bench_now();
        usleep(2000);
    }
    fprintf(stderr, "kvpool-bench index: the indexer did not apply every batch in %.0f s\n",
            IX_WAIT_S);
    return 0;
}

/* ---------------- end to end, /query latency ---------------- */

typedef struct e2e {
    double seconds, events_per_s, ev_min, ev_max; /* ev_*: the range over the passes */
    double p50_us, p99_us, mean_us;
    size_t lat_n;
    /* the same queries while a hostile publisher sends its worst (e2e_hostile) */
    double h_p50_us, h_p99_us, h_max_us, h_seconds, h_events, h_grows_aside, h_grows_locked,
        h_hold_max_us, h_holds_over_ms, h_blocks_sent, h_yields, h_yield_s;
    size_t h_lat_n;
    uint64_t h_cycles;
} e2e_t;

static int e2e_check(ix_t *x, daemon_t *d, double s0, double r0)
{
    double stored = daemon_metric(d, "kvpool_indexer_events_total{type=\"stored\"}") - s0;
    double removed = daemon_metric(d, "kvpool_indexer_events_total{type=\"removed\"}") - r0;
    double holders = metric(d->out.p, "kvpool_indexer_block_holders");
    double unplaced = metric(d->out.p, "kvpool_indexer_unplaced_blocks_total");
    double resyncs = metric(d->out.p, "kvpool_indexer_resyncs_total{reason=\"gap\"}") +
                     metric(d->out.p, "kvpool_indexer_resyncs_total{reason=\"restart\"}") +
                     metric(d->out.p, "kvpool_indexer_resyncs_total{reason=\"malformed\"}");
    if (stored != (double)x->stored_events || removed != (double)x->removed_events ||
        holders != (double)x->resident || unplaced != 0 || resyncs != 0) {
        fprintf(stderr,
                "kvpool-bench index: end to end: %.0f stored / %.0f removed events applied (sent "
                "%" PRIu64 " / %" PRIu64 "), %.0f holders for %" PRIu64
                " resident blocks, %.0f unplaced, %.0f resyncs\n",
                stored, removed, x->stored_events, x->removed_events, holders, x->resident,
                unplaced, resyncs);
        return -1;
    }
    return 0;
}

/* Every batch pre-encoded: one buffer, offsets per batch (n_batches + 1). */
static int encode_all(ix_t *x, char **buf_p, size_t **off_p)
{
    size_t cap = 1u << 24, len = 0, nb = 0;
    char *buf = malloc(cap);
    size_t *off = malloc((x->batches + 1) * sizeof(*off));
    if (buf == NULL || off == NULL)
        goto nomem;
    off[0] = 0;
    for (size_t i = 0; i < x->n_items; i++) {
        if (x->items[i].query)
            continue;
        encode_batch(x, &x->items[i]);
        if (len + x->sb.size > cap) {
            while (len + x->sb.size > cap)
                cap *= 2;
            char *b = realloc(buf, cap);
            if (b == NULL)
                goto nomem;
            buf = b;
        }
        memcpy(buf + len, x->sb.data, x->sb.size);
        len += x->sb.size;
        off[++nb] = len;
    }
    *buf_p = buf;
    *off_p = off;
    return 0;
nomem:
    free(buf);
    free(off);
    fprintf(stderr, "kvpool-bench index: out of memory encoding the batches\n");
    return -1;
}

static int e2e_publish(ix_t *x, daemon_t *d, pubs_t *p, e2e_t *r)
{
    char *buf = NULL;
    size_t *off = NULL;
    int rc = -1;
    if (encode_all(x, &buf, &off) != 0)
        return -1;
    double b0 = daemon_metric(d, "kvpool_indexer_batches_total");
    double s0 = metric(d->out.p, "kvpool_indexer_events_total{type=\"stored\"}");
    double r0 = metric(d->out.p, "kvpool_indexer_events_total{type=\"removed\"}");
    kvp_bench_progress(x->o, "index: end to end, %" PRIu64 " batches", x->batches);
    double t0 = kvp_bench_now();
    size_t nb = 0;
    for (size_t i = 0; i < x->n_items; i++) {
        if (x->items[i].query)
            continue;
        if (publish(p, x->items[i].engine, buf + off[nb], off[nb + 1] - off[nb], true) != 0)
            goto out;
        nb++;
    }
    double t1 = wait_batches(d, b0 + (double)nb);
    if (t1 == 0)
        goto out;
    r->seconds = t1 - t0;
    r->events_per_s = (double)(x->stored_blocks + x->removed_blocks) / r->seconds;
    rc = e2e_check(x, d, s0, r0);
    free(buf); /* every batch applied: ZeroMQ holds none of it any more */
    buf = NULL;
out:
    kvp_bench_progress_done(x->o);
    /* buf is left as it is (leaked) when ZeroMQ may still send from it */
    free(off);
    return rc;
}

/* The prompts of the latency test: the first 16 ids (512 blocks) of up to 256 of the
 * trace's latest requests that have them; else the first request's, padded with fresh
 * ids. Their JSON bodies, one after another in *bodies (offsets in off). */
static int query_bodies(ix_t *x, char **bodies_p, size_t **off_p, size_t *n_p)
{
    const size_t per = IX_QUERY_BLOCKS / IX_PER_ID, max_prompts = 256;
    size_t *pick = malloc(max_prompts * sizeof(*pick)), n = 0;
    size_t cap = max_prompts * (IX_QUERY_BLOCKS * IX_BS * 7 + 256);
    char *b = malloc(cap);
    size_t *off = malloc((max_prompts + 1) * sizeof(*off));
    uint32_t t[IX_BS];
    if (pick == NULL || b == NULL || off == NULL) {
        free(pick);
        free(b);
        free(off);
        return -1;
    }
    for (size_t q = x->tr.n_req; q-- > 0 && n < max_prompts;)
        if (x->tr.off[q + 1] - x->tr.off[q] >= per)
            pick[n++] = q;
    bool padded = n == 0;
    if (padded)
        pick[n++] = 0;
    size_t len = 0;
    off[0] = 0;
    for (size_t k = 0; k < n; k++) {
        const uint64_t *ids = x->tr.ids + x->tr.off[pick[k]];
        size_t have = x->tr.off[pick[k] + 1] - x->tr.off[pick[k]];
        len += (size_t)sprintf(
            b + len, "{\"model\":\"" IX_MODEL "\",\"block_size\":%u,\"token_ids\":[", IX_BS);
        for (size_t i = 0; i < per; i++) {
            uint64_t id = i < have ? ids[i] : (1ull << 58) + i;
            for (uint32_t j = 0; j < IX_PER_ID; j++) {
                block_tokens((id << 5) | j, t);
                for (uint32_t p = 0; p < IX_BS; p++)
                    len += (size_t)sprintf(b + len, "%s%u", i + j + p ? "," : "", t[p]);
            }
        }
        len += (size_t)sprintf(b + len, "]}");
        off[k + 1] = len;
    }
    free(pick);
    *bodies_p = b;
    *off_p = off;
    *n_p = n;
    return 0;
}

/* One POST /query, timed (*dt_p, seconds); its answer must name every instance of p. */
static int time_query(daemon_t *d, const pubs_t *p, const char *body, size_t len, double *dt_p)
{
    double t0 = kvp_bench_now();
    long code = http(d, "/query", body, len);
    *dt_p = kvp_bench_now() - t0;
    unsigned answered = code == 200 ? answer_instances(d->out.p, d->out.len) : 0;
    if (code != 200 || answered != p->n) {
        fprintf(stderr, "kvpool-bench index: POST /query: HTTP %ld, %u instances answered\n", code,
                answered);
        return -1;
    }
    return 0;
}

/* ---------------- /query latency under a hostile publisher ---------------- */

/* A publisher registered for another model (its blocks are a scope of their own: never in
 * the answers, but in the same tables, under the same lock) sends its worst while the same
 * queries are timed again: batches of IX_HOSTILE_RUN fresh blocks (a chain from no parent,
 * token ids and engine hashes never sent before), the index growing through its tables'
 * doublings to IX_HOSTILE_MAX blocks; then IX_HOSTILE_PAIRS [BlockStored, AllBlocksCleared]
 * pairs and a last clear, the whole purge of what it holds; and again (a cycle). Paced at
 * the end-to-end limit's rate (LIMIT_E2E_PER_S block events/s); its socket drops past 256
 * queued batches (a gap: the indexer resyncs it, another purge). The queries go on until
 * --queries are timed and a whole cycle went through (at most IX_HOSTILE_S). */
#define IX_HOSTILE_RUN 4096u
#define IX_HOSTILE_MAX (4096u * 1024u)
#define IX_HOSTILE_PAIRS 2500u
#define IX_HOSTILE_S 120.0
#define IX_HOSTILE_MODEL "hostile-model"

typedef struct hostile {
    pubs_t p;
    pthread_t th;
    atomic_bool stop;
    atomic_uint_fast64_t cycles;
    uint64_t batches, blocks; /* sent */
    msgpack_sbuffer sb;
    uint32_t *tok;
    /* the batch of IX_HOSTILE_RUN fresh blocks, encoded once with fixed-width fields, its
     * engine hashes and first two token ids written in place for each batch (the bench's own
     * encoding would take a core of the two this machine kind has) */
    uint8_t *run;
    size_t run_len, run_hashes, run_tokens; /* offsets of the first hash's and token's bytes */
    int err;
} hostile_t;

static uint8_t *put_be(uint8_t *w, uint64_t v, unsigned bytes)
{
    for (unsigned k = 0; k < bytes; k++)
        *w++ = (uint8_t)(v >> (8 * (bytes - 1 - k)));
    return w;
}

/* [ts, [["BlockStored", hashes, nil, token_ids, 16, nil, nil]]] of IX_HOSTILE_RUN blocks, every
 * number at its widest (0xcf / 0xce), arrays as 0xdd; -1: out of memory. */
static int hostile_run_encode(hostile_t *h)
{
    size_t n = IX_HOSTILE_RUN, nt = n * IX_BS;
    h->run = malloc(64 + n * 9 + nt * 5);
    if (h->run == NULL)
        return -1;
    uint8_t *w = h->run;
    *w++ = 0x92;
    *w++ = 0xcb;
    double ts = (double)time(NULL);
    uint64_t bits;
    memcpy(&bits, &ts, sizeof(bits));
    w = put_be(w, bits, 8);
    *w++ = 0x91;
    *w++ = 0x97;
    *w++ = 0xa0 | 11;
    memcpy(w, "BlockStored", 11);
    w += 11;
    *w++ = 0xdd;
    w = put_be(w, n, 4);
    h->run_hashes = (size_t)(w - h->run);
    for (size_t i = 0; i < n; i++) {
        *w++ = 0xcf;
        w = put_be(w, 0, 8);
    }
    *w++ = 0xc0; /* no parent: a chain of its own */
    *w++ = 0xdd;
    w = put_be(w, nt, 4);
    h->run_tokens = (size_t)(w - h->run);
    for (size_t t = 0; t < nt; t++) {
        *w++ = 0xce;
        w = put_be(w, h->tok[t], 4);
    }
    *w++ = (uint8_t)IX_BS;
    *w++ = 0xc0;
    *w++ = 0xc0;
    h->run_len = (size_t)(w - h->run);
    return 0;
}

/* The next run batch in h->run: engine hashes and a first block never sent before, so that
 * every block of the chain is new. */
static void hostile_run_next(hostile_t *h)
{
    uint64_t nb = h->batches++;
    for (uint32_t i = 0; i < IX_HOSTILE_RUN; i++)
        put_be(h->run + h->run_hashes + 9 * (size_t)i + 1, engine_hash((nb << 16) | i), 8);
    put_be(h->run + h->run_tokens + 1, (uint32_t)nb, 4);
    put_be(h->run + h->run_tokens + 6, (uint32_t)(nb >> 32), 4);
}

static void hostile_stored(msgpack_packer *pk, hostile_t *h, uint32_t n)
{
    uint64_t nb = h->batches;
    msgpack_pack_array(pk, 7);
    pack_str(pk, "BlockStored");
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_uint64(pk, engine_hash((nb << 16) | i));
    msgpack_pack_nil(pk);             /* no parent: a chain of its own */
    h->tok[0] = (uint32_t)nb;         /* its first block's tokens never seen before: */
    h->tok[1] = (uint32_t)(nb >> 32); /* every block of the chain is new */
    msgpack_pack_array(pk, (size_t)n * IX_BS);
    for (size_t t = 0; t < (size_t)n * IX_BS; t++)
        msgpack_pack_uint32(pk, h->tok[t]);
    msgpack_pack_uint32(pk, IX_BS);
    msgpack_pack_nil(pk);
    msgpack_pack_nil(pk);
    h->batches++;
}

/* The clears that end a cycle, into h->sb; its block events. */
static uint64_t hostile_clears(hostile_t *h)
{
    msgpack_sbuffer_clear(&h->sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &h->sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_double(&pk, (double)time(NULL));
    msgpack_pack_array(&pk, 2 * IX_HOSTILE_PAIRS + 1);
    for (uint32_t i = 0; i < IX_HOSTILE_PAIRS; i++) {
        hostile_stored(&pk, h, 1);
        msgpack_pack_array(&pk, 1);
        pack_str(&pk, "AllBlocksCleared");
    }
    msgpack_pack_array(&pk, 1);
    pack_str(&pk, "AllBlocksCleared");
    return IX_HOSTILE_PAIRS;
}

static void *hostile_main(void *arg)
{
    hostile_t *h = arg;
    double t0 = kvp_bench_now();
    uint64_t held = 0;
    while (!atomic_load(&h->stop)) {
        bool clear = held >= IX_HOSTILE_MAX;
        uint64_t ev = IX_HOSTILE_RUN;
        if (clear)
            ev = hostile_clears(h);
        else
            hostile_run_next(h);
        held = clear ? 0 : held + ev;
        if (publish(&h->p, 0, clear ? h->sb.data : (const char *)h->run,
                    clear ? h->sb.size : h->run_len, false) != 0) {
            h->err = -1;
            break;
        }
        h->blocks += ev;
        if (clear)
            atomic_fetch_add(&h->cycles, 1);
        double due = t0 + (double)h->blocks / LIMIT_E2E_PER_S - kvp_bench_now();
        if (due > 0)
            usleep((useconds_t)(due * 1e6));
    }
    return NULL;
}

/* The queries again while a hostile publisher runs (the block comment above). */
static int e2e_hostile(ix_t *x, daemon_t *d, pubs_t *p, const char *bodies, const size_t *off,
                       size_t n, e2e_t *r)
{
    hostile_t h;
    memset(&h, 0, sizeof(h));
    msgpack_sbuffer_init(&h.sb);
    size_t cap = 1u << 20, got = 0;
    double *lat = malloc(cap * sizeof(*lat));
    h.tok = malloc((size_t)IX_HOSTILE_RUN * IX_BS * sizeof(*h.tok));
    int rc = -1, hwm = 256;
    bool started = false;
    if (lat == NULL || h.tok == NULL || pubs_open(&h.p, 1) != 0 ||
        zmq_setsockopt(h.p.sock[0], ZMQ_SNDHWM, &hwm, sizeof(hwm)) != 0 ||
        daemon_register_model(d, h.p.ep[0], "hostile-0", IX_HOSTILE_MODEL) != 0)
        goto out;
    for (size_t t = 0; t < (size_t)IX_HOSTILE_RUN * IX_BS; t++)
        h.tok[t] = (uint32_t)(engine_hash(t) % IX_VOCAB);
    if (hostile_run_encode(&h) != 0)
        goto out;
    double ev0 = daemon_metric(d, "kvpool_indexer_events_total{type=\"stored\"}");
    double aside0 = daemon_metric(d, "kvpool_indexer_table_grows_total{where=\"aside\"}");
    double lock0 = daemon_metric(d, "kvpool_indexer_table_grows_total{where=\"write_lock\"}");
    double over0 = daemon_metric(d, "kvpool_indexer_write_holds_over_1ms_total");
    double yields0 = daemon_metric(d, "kvpool_indexer_query_yields_total");
    double yield_s0 = daemon_metric(d, "kvpool_indexer_query_yield_seconds_total");
    if (pthread_create(&h.th, NULL, hostile_main, &h) != 0)
        goto out;
    started = true;
    kvp_bench_progress(x->o, "index: POST /query under a hostile publisher");
    double t0 = kvp_bench_now();
    for (size_t k = 0; got < cap; k++) {
        double dt, now = kvp_bench_now();
        if (k >= IX_WARMUP + x->o->idx_queries && atomic_load(&h.cycles) >= 1)
            break;
        if (now - t0 > IX_HOSTILE_S) {
            fprintf(stderr,
                    "kvpool-bench index: the hostile publisher did not finish a cycle "
                    "in %.0f s\n",
                    IX_HOSTILE_S);
            goto out;
        }
        if (time_query(d, p, bodies + off[k % n], off[k % n + 1] - off[k % n], &dt) != 0)
            goto out;
        if (k >= IX_WARMUP)
            lat[got++] = dt;
    }
    r->h_seconds = kvp_bench_now() - t0;
    atomic_store(&h.stop, true);
    pthread_join(h.th, NULL);
    started = false;
    r->h_cycles = atomic_load(&h.cycles);
    r->h_events = daemon_metric(d, "kvpool_indexer_events_total{type=\"stored\"}") - ev0;
    r->h_grows_aside =
        daemon_metric(d, "kvpool_indexer_table_grows_total{where=\"aside\"}") - aside0;
    r->h_grows_locked =
        daemon_metric(d, "kvpool_indexer_table_grows_total{where=\"write_lock\"}") - lock0;
    r->h_holds_over_ms = daemon_metric(d, "kvpool_indexer_write_holds_over_1ms_total") - over0;
    r->h_hold_max_us = 1e6 * daemon_metric(d, "kvpool_indexer_write_hold_max_seconds");
    r->h_yields = daemon_metric(d, "kvpool_indexer_query_yields_total") - yields0;
    r->h_yield_s = daemon_metric(d, "kvpool_indexer_query_yield_seconds_total") - yield_s0;
    r->h_blocks_sent = (double)h.blocks;
    r->h_lat_n = got;
    r->h_p50_us = 1e6 * kvp_bench_percentile(lat, got, 50);
    r->h_p99_us = 1e6 * kvp_bench_percentile(lat, got, 99);
    r->h_max_us = 1e6 * kvp_bench_percentile(lat, got, 100);
    rc = h.err;
out:
    if (started) {
        atomic_store(&h.stop, true);
        pthread_join(h.th, NULL);
    }
    kvp_bench_progress_done(x->o);
    pubs_close(&h.p);
    msgpack_sbuffer_destroy(&h.sb);
    free(h.run);
    free(h.tok);
    free(lat);
    return rc;
}

static int e2e_latency(ix_t *x, daemon_t *d, pubs_t *p, e2e_t *r)
{
    for (unsigned i = x->n_eng; i < p->n; i++) { /* instances with empty pools */
        char inst[32];
        snprintf(inst, sizeof(inst), "engine-%u", i);
        if (daemon_register(d, p->ep[i], inst) != 0)
            return -1;
    }
    char *bodies = NULL;
    size_t *off = NULL, n = 0;
    if (query_bodies(x, &bodies, &off, &n) != 0)
        return -1;
    size_t total = IX_WARMUP + x->o->idx_queries;
    double *lat = malloc(x->o->idx_queries * sizeof(*lat));
    int rc = -1;
    if (lat == NULL)
        goto out;
    kvp_bench_progress(x->o, "index: %zu POST /query", total);
    for (size_t k = 0; k < total; k++) {
        double dt;
        if (time_query(d, p, bodies + off[k % n], off[k % n + 1] - off[k % n], &dt) != 0)
            goto out;
        if (k >= IX_WARMUP)
            lat[k - IX_WARMUP] = dt;
    }
    r->lat_n = x->o->idx_queries;
    double sum = 0;
    for (size_t k = 0; k < r->lat_n; k++)
        sum += lat[k];
    r->mean_us = 1e6 * sum / (double)r->lat_n;
    r->p50_us = 1e6 * kvp_bench_percentile(lat, r->lat_n, 50);
    r->p99_us = 1e6 * kvp_bench_percentile(lat, r->lat_n, 99);
    kvp_bench_progress_done(x->o);
    rc = e2e_hostile(x, d, p, bodies, off, n, r);
out:
    kvp_bench_progress_done(x->o);
    free(lat);
    free(bodies);
    free(off);
    return rc;
}

/* One end-to-end pass on a fresh indexer; the /query latency after it when `latency`. */
static int run_e2e(ix_t *x, e2e_t *r, bool latency)
{
    daemon_t d;
    pubs_t p;
    int rc = -1;
    memset(&p, 0, sizeof(p));
    unsigned n_pubs = x->n_eng > IX_QUERY_INSTANCES ? x->n_eng : IX_QUERY_INSTANCES;
    if (daemon_start(&d, x->o) != 0 || pubs_open(&p, n_pubs) != 0 ||
        pubs_register(&d, &p, x->n_eng) != 0)
        goto out;
    if (e2e_publish(x, &d, &p, r) != 0 || (latency && e2e_latency(x, &d, &p, r) != 0))
        goto out;
    rc = 0;
out:
    daemon_stop(&d);
    pubs_close(&p);
    return rc;
}

/* ---------------- memory ---------------- */

typedef struct mem {
    unsigned share; /* instances holding each block */
    uint64_t pairs;
    long long rss_before, rss_loaded, rss_after; /* fresh, at the last batch, settled */
    double bytes_per_pair, blocks, maps;
    bool ok;
} mem_t;

#define IX_MEM_SHARE 4 /* the second memory point: each block held by 4 instances */

/* Chain c of the memory load (len blocks from key IX_MEM_BASE + c * IX_CHAIN), one
 * BlockStored, into x->sb; keys: room for IX_CHAIN + 2. */
static void encode_chain(ix_t *x, uint64_t c, uint32_t len, uint64_t *keys)
{
    keys[0] = len;
    keys[1] = IX_NIL;
    for (uint32_t i = 0; i < len; i++)
        keys[2 + i] = IX_MEM_BASE + c * IX_CHAIN + i;
    uint64_t *saved = x->keys;
    x->keys = keys;
    item_t it = {.n_runs = 1, .at = 0};
    encode_batch(x, &it);
    x->keys = saved;
}

/* pid's VmRSS once it stops falling (from `now`): the memory the allocator kept of the
 * messages queued meanwhile (up to 512 batches in flight) goes back within a second or two
 * and is not the index's; at most 10 s. */
static long long rss_settled(pid_t pid, long long now)
{
    for (int k = 0, still = 0; k < 40 && still < 4 && now >= 0; k++) {
        usleep(250 * 1000);
        long long r = kvp_bench_rss_bytes(pid);
        still = r >= now - 65536 ? still + 1 : 0;
        now = r < now ? r : now;
    }
    return now;
}

/* Load about --pairs pairs into a fresh indexer, each block stored by `share` engines
 * (the next ones round robin), and measure its RSS. */
static int run_memory(ix_t *x, unsigned share, mem_t *r)
{
    daemon_t d;
    pubs_t p;
    int rc = -1;
    memset(&p, 0, sizeof(p));
    r->share = share;
    if (daemon_start(&d, x->o) != 0 || pubs_open(&p, x->n_eng) != 0 ||
        pubs_register(&d, &p, x->n_eng) != 0)
        goto out;
    double b0 = daemon_metric(&d, "kvpool_indexer_batches_total");
    r->rss_before = kvp_bench_rss_bytes(d.pid);
    uint64_t blocks = x->o->idx_pairs / share, chains = (blocks + IX_CHAIN - 1) / IX_CHAIN;
    r->pairs = blocks * share;
    uint64_t keys[IX_CHAIN + 2], sent = 0;
    for (uint64_t c = 0; c < chains; c++) {
        uint32_t len = c + 1 < chains ? IX_CHAIN : (uint32_t)(blocks - c * IX_CHAIN);
        encode_chain(x, c, len, keys);
        /* at most ~512 batches (~24 MiB) in flight: the queue is not what is measured */
        if (sent % 256 < share && sent >= 512 && wait_batches(&d, b0 + (double)(sent - 512)) == 0)
            goto out;
        if (c % 1024 == 0)
            kvp_bench_progress(x->o, "index: memory, %" PRIu64 " of %" PRIu64 " pairs sent",
                               c * IX_CHAIN * share, r->pairs);
        for (unsigned k = 0; k < share; k++, sent++)
            if (publish(&p, (unsigned)((c + k) % x->n_eng), x->sb.data, x->sb.size, false) != 0)
                goto out;
    }
    kvp_bench_progress_done(x->o);
    if (wait_batches(&d, b0 + (double)sent) == 0)
        goto out;
    r->rss_loaded = kvp_bench_rss_bytes(d.pid);
    r->rss_after = rss_settled(d.pid, r->rss_loaded);
    double holders = daemon_metric(&d, "kvpool_indexer_block_holders");
    r->blocks = metric(d.out.p, "kvpool_indexer_blocks");
    r->maps = metric(d.out.p, "kvpool_indexer_engine_hashes");
    if (holders != (double)r->pairs || r->blocks != (double)blocks || r->rss_before < 0 ||
        r->rss_after < 0) {
        fprintf(stderr,
                "kvpool-bench index: memory: %.0f holders of %.0f blocks for %" PRIu64
                " pairs of %" PRIu64 " blocks\n",
                holders, r->blocks, r->pairs, blocks);
        goto out;
    }
    r->bytes_per_pair = (double)(r->rss_after - r->rss_before) / (double)r->pairs;
    rc = 0;
out:
    kvp_bench_progress_done(x->o);
    daemon_stop(&d);
    pubs_close(&p);
    return rc;
}

/* ---------------- the run ---------------- */

static int load_trace(ix_t *x)
{
    const kvp_bench_opts_t *o = x->o;
    if (o->trace_path != NULL) {
        FILE *f = fopen(o->trace_path, "re");
        if (f == NULL) {
            fprintf(stderr, "kvpool-bench index: cannot open %s: %m\n", o->trace_path);
            return -1;
        }
        int rc = kvp_bench_trace_read(f, o->trace_path, o->trace_limit, &x->tr);
        fclose(f);
        return rc;
    }
    if (o->gen_class == NULL) {
        fprintf(stderr, "kvpool-bench index: needs --trace FILE or --class NAME\n");
        return -1;
    }
    FILE *f = tmpfile();
    if (f == NULL || kvp_bench_tracegen_write(o->gen_class, o->gen_seed, o->gen_requests, f) != 0) {
        if (f != NULL)
            fclose(f);
        return -1;
    }
    rewind(f);
    int rc = kvp_bench_trace_read(f, o->gen_class, o->trace_limit, &x->tr);
    fclose(f);
    return rc;
}

static int ix_init(ix_t *x, const kvp_bench_opts_t *o)
{
    memset(x, 0, sizeof(*x));
    x->o = o;
    msgpack_sbuffer_init(&x->sb);
    if (load_trace(x) != 0)
        return -1;
    for (size_t q = 0; q < x->tr.n_req; q++)
        for (size_t i = x->tr.off[q]; i < x->tr.off[q + 1]; i++)
            if (x->tr.ids[i] >= (1ull << 58)) {
                fprintf(stderr, "kvpool-bench index: hash id %" PRIu64 " over 2^58\n",
                        x->tr.ids[i]);
                return -1;
            }
    x->n_eng = o->idx_engines;
    x->max_blocks = (size_t)o->idx_engine_blocks;
    size_t qmax = x->max_blocks > IX_QUERY_BLOCKS ? x->max_blocks : IX_QUERY_BLOCKS;
    x->eng = calloc(x->n_eng, sizeof(*x->eng));
    x->tok = malloc(qmax * IX_BS * sizeof(*x->tok));
    x->hash = malloc(qmax * sizeof(*x->hash));
    x->qkeys = malloc(qmax * sizeof(*x->qkeys));
    if (x->eng == NULL || x->tok == NULL || x->hash == NULL || x->qkeys == NULL)
        return -1;
    for (unsigned e = 0; e < x->n_eng; e++)
        if (engine_init(&x->eng[e], (uint32_t)o->idx_engine_blocks) != 0)
            return -1;
    return 0;
}

static void ix_free(ix_t *x)
{
    for (unsigned e = 0; x->eng != NULL && e < x->n_eng; e++)
        engine_free(&x->eng[e]);
    free(x->eng);
    free(x->items);
    free(x->keys);
    free(x->tok);
    free(x->hash);
    free(x->qkeys);
    free(x->ans.p);
    msgpack_sbuffer_destroy(&x->sb);
    kvp_bench_reqs_free(&x->tr);
}

static void result_limit(kvp_bench_out_t *out, const char *key, double limit, bool met)
{
    kvp_bench_result_num(out, key, limit);
    kvp_bench_result_str(out, "limit_met", met ? "yes" : "no");
}

/* The median of n values (v is left as it is). */
static double median(const double *v, size_t n)
{
    double c[IX_PASSES];
    memcpy(c, v, n * sizeof(*v));
    return kvp_bench_percentile(c, n, 50);
}

/* The in-process passes' figures: medians, and the range of the rate with the decode. */
typedef struct inproc_sum {
    double r_all, r_app, r_base, r_min, r_max;
    double decode_s, apply_s, query_s, base_apply_s, base_query_s;
} inproc_sum_t;

static void inproc_sum(const ix_t *x, const inproc_t *ip, inproc_sum_t *s)
{
    double ops = (double)(x->stored_blocks + x->removed_blocks + x->query_blocks);
    double all[IX_PASSES], app[IX_PASSES], base[IX_PASSES], dec[IX_PASSES], apl[IX_PASSES],
        qry[IX_PASSES], bap[IX_PASSES], bqr[IX_PASSES];
    for (int k = 0; k < IX_PASSES; k++) {
        all[k] = ops / (ip[k].t_decode + ip[k].t_apply + ip[k].t_query);
        app[k] = ops / (ip[k].t_apply + ip[k].t_query);
        base[k] = ops / (ip[k].t_base_apply + ip[k].t_base_query);
        dec[k] = ip[k].t_decode;
        apl[k] = ip[k].t_apply;
        qry[k] = ip[k].t_query;
        bap[k] = ip[k].t_base_apply;
        bqr[k] = ip[k].t_base_query;
    }
    *s = (inproc_sum_t){.r_all = median(all, IX_PASSES),
                        .r_app = median(app, IX_PASSES),
                        .r_base = median(base, IX_PASSES),
                        .r_min = all[0],
                        .r_max = all[0],
                        .decode_s = median(dec, IX_PASSES),
                        .apply_s = median(apl, IX_PASSES),
                        .query_s = median(qry, IX_PASSES),
                        .base_apply_s = median(bap, IX_PASSES),
                        .base_query_s = median(bqr, IX_PASSES)};
    for (int k = 1; k < IX_PASSES; k++) {
        s->r_min = all[k] < s->r_min ? all[k] : s->r_min;
        s->r_max = all[k] > s->r_max ? all[k] : s->r_max;
    }
}

/* A latency part's result opened, with what every one has. */
static void latency_part(kvp_bench_out_t *out, const char *part, size_t queries)
{
    kvp_bench_result_begin(out, "index");
    kvp_bench_result_str(out, "part", part);
    kvp_bench_result_int(out, "instances", IX_QUERY_INSTANCES);
    kvp_bench_result_int(out, "prompt_tokens", IX_QUERY_BLOCKS * IX_BS);
    kvp_bench_result_int(out, "queries", (int64_t)queries);
}

static void report_hostile(const e2e_t *e2, kvp_bench_out_t *out)
{
    printf("  %-34s %11.0f us %9s us %10s\n", "  the same, hostile publisher, p99", e2->h_p99_us,
           "<= 1000", e2->h_p99_us <= LIMIT_P99_US ? "yes" : "no");
    printf("  (hostile: %.0f blocks sent, %.0f events applied, in %.1f s, %" PRIu64
           " cycles to %u blocks and back; %zu queries, p50 %.0f us, max %.0f us; tables doubled "
           "%.0f times off the write lock, %.0f under it; the write lock held %.0f us at most, "
           "%.0f times over 1 ms; batches waited for queries %.0f times, %.2f s)\n",
           e2->h_blocks_sent, e2->h_events, e2->h_seconds, e2->h_cycles, IX_HOSTILE_MAX,
           e2->h_lat_n, e2->h_p50_us, e2->h_max_us, e2->h_grows_aside, e2->h_grows_locked,
           e2->h_hold_max_us, e2->h_holds_over_ms, e2->h_yields, e2->h_yield_s);
    latency_part(out, "query_latency_hostile", e2->h_lat_n);
    kvp_bench_result_num(out, "seconds", e2->h_seconds);
    kvp_bench_result_num(out, "hostile_blocks_sent", e2->h_blocks_sent);
    kvp_bench_result_num(out, "hostile_blocks_per_s", e2->h_blocks_sent / e2->h_seconds);
    kvp_bench_result_num(out, "hostile_events_applied", e2->h_events);
    kvp_bench_result_num(out, "write_hold_max_us", e2->h_hold_max_us);
    kvp_bench_result_num(out, "write_holds_over_1ms", e2->h_holds_over_ms);
    kvp_bench_result_num(out, "query_yields", e2->h_yields);
    kvp_bench_result_num(out, "query_yield_seconds", e2->h_yield_s);
    kvp_bench_result_int(out, "hostile_cycles", (int64_t)e2->h_cycles);
    kvp_bench_result_int(out, "hostile_max_blocks", IX_HOSTILE_MAX);
    kvp_bench_result_num(out, "table_grows_aside", e2->h_grows_aside);
    kvp_bench_result_num(out, "table_grows_write_lock", e2->h_grows_locked);
    kvp_bench_result_num(out, "p50_us", e2->h_p50_us);
    kvp_bench_result_num(out, "p99_us", e2->h_p99_us);
    kvp_bench_result_num(out, "max_us", e2->h_max_us);
    result_limit(out, "limit_p99_us", LIMIT_P99_US, e2->h_p99_us <= LIMIT_P99_US);
    kvp_bench_result_end(out);
}

static void report(const ix_t *x, const inproc_t *ip, const e2e_t *e2, bool e2_ok, const mem_t *m,
                   kvp_bench_out_t *out)
{
    uint64_t ev = x->stored_blocks + x->removed_blocks, ops = ev + x->query_blocks;
    inproc_sum_t sm;
    inproc_sum(x, ip, &sm);
    double r_all = sm.r_all, r_app = sm.r_app, r_base = sm.r_base;
    const char *src = x->o->trace_path != NULL ? x->o->trace_path : x->o->gen_class;
    printf("index: %s, %zu requests, %u engines x %" PRIu64 " blocks of %u tokens\n", src,
           x->tr.n_req, x->n_eng, x->o->idx_engine_blocks, IX_BS);
    printf("  streams: %" PRIu64 " batches (%" PRIu64 " stored blocks in %" PRIu64
           " events, %" PRIu64 " removed), %" PRIu64 " queries of %" PRIu64 " blocks (%" PRIu64
           " of them a prefix hit on the routed engine)\n",
           x->batches, x->stored_blocks, x->stored_events, x->removed_blocks, x->queries,
           x->query_blocks, x->hit_blocks);
    printf("  (medians of %d passes; each end-to-end pass on a fresh indexer)\n", IX_PASSES);
    printf("  %-34s %14s %12s %10s\n", "figure", "value", "limit", "met");
    printf("  %-34s %12.2f M %10s M %10s\n", "in process, block ops/s (decode)", r_all / 1e6,
           ">= 10", r_all >= LIMIT_OPS_PER_S ? "yes" : "no");
    printf("  %-34s %12.2f M %12s %10s\n", "in process, block ops/s (apply)", r_app / 1e6, "", "");
    printf("  %-34s %12.2f M %12s %10s\n", "naive baseline, block ops/s", r_base / 1e6, "", "");
    kvp_bench_result_begin(out, "index");
    kvp_bench_result_str(out, "part", "in_process");
    kvp_bench_result_str(out, "trace", src);
    kvp_bench_result_int(out, "requests", (int64_t)x->tr.n_req);
    kvp_bench_result_int(out, "engines", x->n_eng);
    kvp_bench_result_int(out, "engine_blocks", (int64_t)x->o->idx_engine_blocks);
    kvp_bench_result_int(out, "block_size", IX_BS);
    kvp_bench_result_int(out, "batches", (int64_t)x->batches);
    kvp_bench_result_int(out, "stored_blocks", (int64_t)x->stored_blocks);
    kvp_bench_result_int(out, "removed_blocks", (int64_t)x->removed_blocks);
    kvp_bench_result_int(out, "queries", (int64_t)x->queries);
    kvp_bench_result_int(out, "query_blocks", (int64_t)x->query_blocks);
    kvp_bench_result_int(out, "query_hit_blocks", (int64_t)x->hit_blocks);
    kvp_bench_result_int(out, "block_ops", (int64_t)ops);
    kvp_bench_result_int(out, "passes", IX_PASSES);
    kvp_bench_result_num(out, "decode_s", sm.decode_s);
    kvp_bench_result_num(out, "apply_s", sm.apply_s);
    kvp_bench_result_num(out, "query_s", sm.query_s);
    kvp_bench_result_num(out, "ops_per_s", r_all);
    kvp_bench_result_num(out, "ops_per_s_min", sm.r_min);
    kvp_bench_result_num(out, "ops_per_s_max", sm.r_max);
    kvp_bench_result_num(out, "ops_per_s_apply_only", r_app);
    kvp_bench_result_num(out, "baseline_ops_per_s", r_base);
    kvp_bench_result_num(out, "baseline_apply_s", sm.base_apply_s);
    kvp_bench_result_num(out, "baseline_query_s", sm.base_query_s);
    kvp_bench_result_num(out, "ratio_to_baseline", r_app / r_base);
    result_limit(out, "limit_ops_per_s", LIMIT_OPS_PER_S, r_all >= LIMIT_OPS_PER_S);
    kvp_bench_result_end(out);
    if (e2_ok) {
        printf("  %-34s %12.2f M %10s M %10s\n", "end to end, block events/s",
               e2->events_per_s / 1e6, ">= 2", e2->events_per_s >= LIMIT_E2E_PER_S ? "yes" : "no");
        printf("  %-34s %11.0f us %12s %10s\n", "POST /query 8192 tokens, p50", e2->p50_us, "", "");
        printf("  %-34s %11.0f us %9s us %10s\n", "POST /query 8192 tokens, p99", e2->p99_us,
               "<= 1000", e2->p99_us <= LIMIT_P99_US ? "yes" : "no");
        kvp_bench_result_begin(out, "index");
        kvp_bench_result_str(out, "part", "end_to_end");
        kvp_bench_result_int(out, "batches", (int64_t)x->batches);
        kvp_bench_result_int(out, "block_events", (int64_t)ev);
        kvp_bench_result_num(out, "seconds", e2->seconds);
        kvp_bench_result_int(out, "passes", IX_PASSES);
        kvp_bench_result_num(out, "events_per_s", e2->events_per_s);
        kvp_bench_result_num(out, "events_per_s_min", e2->ev_min);
        kvp_bench_result_num(out, "events_per_s_max", e2->ev_max);
        result_limit(out, "limit_events_per_s", LIMIT_E2E_PER_S,
                     e2->events_per_s >= LIMIT_E2E_PER_S);
        kvp_bench_result_end(out);
        latency_part(out, "query_latency", e2->lat_n);
        kvp_bench_result_num(out, "p50_us", e2->p50_us);
        kvp_bench_result_num(out, "p99_us", e2->p99_us);
        kvp_bench_result_num(out, "mean_us", e2->mean_us);
        result_limit(out, "limit_p99_us", LIMIT_P99_US, e2->p99_us <= LIMIT_P99_US);
        kvp_bench_result_end(out);
        report_hostile(e2, out);
    }
    for (int k = 0; k < 2; k++) {
        if (!m[k].ok)
            continue;
        char name[64];
        snprintf(name, sizeof(name), "memory per pair, %u holder%s/block", m[k].share,
                 m[k].share > 1 ? "s" : "");
        printf("  %-34s %12.1f B %10s B %10s\n", name, m[k].bytes_per_pair, "<= 64",
               m[k].bytes_per_pair <= LIMIT_BYTES_PER_PAIR ? "yes" : "no");
        printf("  (%" PRIu64 " pairs, %.0f blocks, %.0f engine hashes mapped; VmRSS %.1f -> %.1f "
               "MiB, %.1f as the last batch was applied)\n",
               m[k].pairs, m[k].blocks, m[k].maps, (double)m[k].rss_before / 1048576.0,
               (double)m[k].rss_after / 1048576.0, (double)m[k].rss_loaded / 1048576.0);
        kvp_bench_result_begin(out, "index");
        kvp_bench_result_str(out, "part", "memory");
        kvp_bench_result_int(out, "holders_per_block", m[k].share);
        kvp_bench_result_int(out, "pairs", (int64_t)m[k].pairs);
        kvp_bench_result_num(out, "blocks", m[k].blocks);
        kvp_bench_result_num(out, "engine_hashes", m[k].maps);
        kvp_bench_result_int(out, "rss_before", m[k].rss_before);
        kvp_bench_result_int(out, "rss_loaded", m[k].rss_loaded);
        kvp_bench_result_int(out, "rss_after", m[k].rss_after);
        kvp_bench_result_num(out, "bytes_per_pair", m[k].bytes_per_pair);
        result_limit(out, "limit_bytes_per_pair", LIMIT_BYTES_PER_PAIR,
                     m[k].bytes_per_pair <= LIMIT_BYTES_PER_PAIR);
        kvp_bench_result_end(out);
    }
}

int kvp_bench_index(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    ix_t x;
    inproc_t ip[IX_PASSES] = {{0}};
    e2e_t e2[IX_PASSES] = {{0}};
    mem_t m[2] = {{0}};
    int rc = 1;
    if (ix_init(&x, o) != 0) {
        fprintf(stderr, "kvpool-bench index: cannot set up (out of memory or no trace)\n");
        goto out;
    }
    kvp_bench_progress(o, "index: making the streams of %zu requests", x.tr.n_req);
    if (make_streams(&x) != 0)
        goto out;
    for (int k = 0; k < IX_PASSES; k++) {
        kvp_bench_progress(o, "index: in process, pass %d", k + 1);
        if (run_inproc(&x, &ip[k]) != 0)
            goto out;
        kvp_bench_progress(o, "index: naive baseline, pass %d", k + 1);
        if (run_naive(&x, &ip[k]) != 0)
            goto out;
    }
    kvp_bench_progress_done(o);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    bool e2_ok = true;
    double ev[IX_PASSES], secs[IX_PASSES];
    for (int k = 0; k < IX_PASSES && e2_ok; k++) {
        e2_ok = run_e2e(&x, &e2[k], k == IX_PASSES - 1) == 0;
        ev[k] = e2[k].events_per_s;
        secs[k] = e2[k].seconds;
    }
    e2e_t es = e2[IX_PASSES - 1]; /* the latency figures: the last pass's */
    if (e2_ok) {
        es.events_per_s = median(ev, IX_PASSES);
        es.seconds = median(secs, IX_PASSES);
        es.ev_min = es.ev_max = ev[0];
        for (int k = 1; k < IX_PASSES; k++) {
            es.ev_min = ev[k] < es.ev_min ? ev[k] : es.ev_min;
            es.ev_max = ev[k] > es.ev_max ? ev[k] : es.ev_max;
        }
    }
    m[0].ok = run_memory(&x, 1, &m[0]) == 0;
    m[1].ok = run_memory(&x, x.n_eng < IX_MEM_SHARE ? x.n_eng : IX_MEM_SHARE, &m[1]) == 0;
    report(&x, ip, &es, e2_ok, m, out);
    rc = e2_ok && m[0].ok && m[1].ok && x.errors == 0 ? 0 : 1;
    if (x.errors > 0)
        fprintf(stderr, "kvpool-bench index: %d wrong answers or counts\n", x.errors);
out:
    kvp_bench_progress_done(o);
    ix_free(&x);
    return rc;
}
