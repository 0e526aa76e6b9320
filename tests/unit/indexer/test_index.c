/*
 * test_index.c - unit tests for indexer/index.c: the hashing standard against vectors
 * made with python3-xxhash, registrations and their publishers, stores and removes by
 * standard and by engine hashes, the runs of a query (longest, per medium, per rank,
 * rank_matches' tier walk), tenants and scopes kept apart, the batch's DP rank, resyncs,
 * unregistering, and --max-blocks evicting the least recently stored blocks; budgets per
 * tenant (a tenant's flood evicts its own blocks, never another's) and clears, resyncs and
 * unregisters that cost what their publisher holds (the held-list entries they visit);
 * an unregister (or a re-register that replaces) purging in slices, and racing batches of
 * the same publisher and registers of the same name on other threads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "indexer/index.h"

/* ---- batches made by hand: op i's hashes are H[i], its tokens T[i] ---- */

#define OPS_MAX 8
static uint64_t H[OPS_MAX][64];
static uint32_t T[OPS_MAX][256];

static void hashes_cb(void *arg, const kvp_idx_op_t *op, uint64_t *out)
{
    (void)arg;
    memcpy(out, H[op->hashes_at], op->n_hashes * sizeof(*out));
}

static void tokens_cb(void *arg, const kvp_idx_op_t *op, uint32_t *out)
{
    (void)arg;
    memcpy(out, T[op->tokens_at], op->n_tokens * sizeof(*out));
}

static void apply(kvp_idx_t *idx, uint32_t sub, kvp_idx_op_t *ops, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++)
        ops[i].hashes_at = ops[i].tokens_at = i;
    kvp_idx_batch_t b = {.ops = ops,
                         .n_ops = n,
                         .has_rank = rank >= 0,
                         .rank = rank >= 0 ? (uint32_t)rank : 0,
                         .hashes = hashes_cb,
                         .tokens = tokens_cb};
    kvp_idx_wrlock(idx);
    kvp_idx_apply(idx, sub, &b);
    kvp_idx_unlock(idx);
}

/* A store of n blocks by standard hashes h[] on medium m (NULL: GPU). */
static kvp_idx_op_t stored(const uint64_t *h, size_t n, const char *m)
{
    static int slot;
    (void)slot;
    kvp_idx_op_t op = {
        .kind = KVP_IDX_STORED, .n_hashes = n, .medium = m, .medium_len = m ? strlen(m) : 0};
    memcpy(H[0], h, n * sizeof(*h)); /* callers put one op per batch unless they fill H */
    return op;
}

static kvp_idx_op_t removed(const uint64_t *h, size_t n, const char *m)
{
    kvp_idx_op_t op = stored(h, n, m);
    op.kind = KVP_IDX_REMOVED;
    return op;
}

/* ---- answers ---- */

typedef struct buf {
    char s[8192];
    size_t n;
} buf_t;

static void put(void *arg, const char *s, size_t len)
{
    buf_t *b = arg;
    assert_true(b->n + len < sizeof(b->s));
    memcpy(b->s + b->n, s, len);
    b->n += len;
    b->s[b->n] = '\0';
}

static const char *query(kvp_idx_t *idx, const char *tenant, const char *model, uint32_t bs,
                         const uint64_t *h, size_t n, const char *instance)
{
    static buf_t b;
    b.n = 0;
    b.s[0] = '\0';
    kvp_idx_query_t q = {.model = model,
                         .lora = "",
                         .tenant = tenant,
                         .salt = "",
                         .instance = instance,
                         .block_size = bs,
                         .hashes = h,
                         .n = n};
    kvp_idx_rdlock(idx);
    assert_int_equal(kvp_idx_query(idx, &q, put, &b), KVP_OK);
    kvp_idx_unlock(idx);
    return b.s;
}

static uint32_t reg(kvp_idx_t *idx, const char *endpoint, const char *type, const char *instance,
                    const char *tenant, uint32_t rank)
{
    kvp_idx_reg_params_t p = {.endpoint = endpoint,
                              .replay_endpoint = "",
                              .type = type,
                              .model = "m",
                              .lora = "",
                              .tenant = tenant,
                              .instance = instance,
                              .salt = "",
                              .block_size = 4,
                              .dp_rank = rank};
    bool changed;
    char err[128];
    kvp_idx_wrlock(idx);
    assert_int_equal(kvp_idx_register(idx, &p, &changed, err, sizeof(err)), KVP_OK);
    kvp_idx_sub_info_t subs[16];
    size_t n = kvp_idx_subs(idx, subs, 16);
    kvp_idx_unlock(idx);
    for (size_t i = 0; i < n; i++)
        if (strcmp(subs[i].endpoint, endpoint) == 0)
            return subs[i].id;
    fail_msg("no subscription for %s", endpoint);
    return 0;
}

static void name_cat(void *arg, const char *name)
{
    strcat(arg, name);
}

static kvp_idx_t *mk(uint64_t max_blocks)
{
    kvp_idx_t *idx;
    kvp_idx_params_t p = {.seed = 0, .max_blocks = max_blocks};
    assert_int_equal(kvp_idx_create(&p, &idx), KVP_OK);
    return idx;
}

static void test_hash_vectors(void **state)
{
    (void)state;
    /* python3: xxhash.xxh3_64_intdigest(struct.pack("<4I", 1, 2, 3, 4), seed), then the
     * rolling hash of le64(prev) || le64(local) */
    uint32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint64_t s[2];
    kvp_idx_hash_tokens(0, t, 2, 4, false, 0, s);
    assert_true(s[0] == 0x6fc1ebd4f4d6ea31ull);
    assert_true(s[1] == 0x3a14937fd5340c7aull);
    kvp_idx_hash_tokens(7, t, 2, 4, false, 0, s);
    assert_true(s[0] == 0x06865270683489fcull);
    assert_true(s[1] == 0x9c1d7a3104f1e37cull);
    /* continuing from a parent gives the second block's hash */
    uint64_t s2;
    kvp_idx_hash_tokens(0, t + 4, 1, 4, true, 0x6fc1ebd4f4d6ea31ull, &s2);
    assert_true(s2 == 0x3a14937fd5340c7aull);
}

static void test_runs(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    uint32_t e0 = reg(idx, "tcp://e:1", "vLLM", "inst", "default", 0);
    uint32_t e1 = reg(idx, "tcp://e:2", "vLLM", "inst", "default", 1);
    uint64_t h[4] = {11, 12, 13, 14};
    /* rank 0: blocks 0,1 on GPU; rank 1: blocks 0..3 on CPU, block 0 on GPU */
    kvp_idx_op_t op = stored(h, 2, NULL);
    apply(idx, e0, &op, 1, -1);
    op = stored(h, 4, "cpu");
    apply(idx, e1, &op, 1, -1);
    op = stored(h, 1, "GPU");
    apply(idx, e1, &op, 1, -1);
    assert_string_equal(
        query(idx, "default", "m", 4, h, 4, NULL),
        "{\"default\":{\"inst\":{\"longest_matched\":16,\"GPU\":8,\"CPU\":16,\"DISK\":0,"
        "\"DP\":{\"0\":8,\"1\":16},\"rank_matches\":{\"0\":{\"gpu\":8,\"cpu\":8,\"disk\":8},"
        "\"1\":{\"gpu\":4,\"cpu\":16,\"disk\":16}}}}}");
    /* another scope, another tenant: nothing; the prompt's third block unknown: a run of 2 */
    assert_string_equal(query(idx, "default", "other", 4, h, 4, NULL), "{\"default\":{}}");
    assert_string_equal(query(idx, "t2", "m", 4, h, 4, NULL), "{\"t2\":{}}");
    uint64_t h2[3] = {11, 12, 99};
    const char *a = query(idx, "default", "m", 4, h2, 3, "inst");
    assert_non_null(strstr(a, "\"longest_matched\":8,"));
    assert_null(strstr(query(idx, "default", "m", 4, h, 4, "nobody"), "inst"));
    /* a remove on rank 1's CPU of block 1 cuts its CPU run, and the tier walk there */
    op = removed(h + 1, 1, "CPU");
    apply(idx, e1, &op, 1, -1);
    a = query(idx, "default", "m", 4, h, 4, NULL);
    assert_non_null(strstr(a, "\"CPU\":4,"));
    /* block 1 on rank 0, blocks 2, 3 on rank 1: the instance holds all four */
    assert_non_null(strstr(a, "\"longest_matched\":16,"));
    assert_non_null(strstr(a, "\"1\":{\"gpu\":4,\"cpu\":4,\"disk\":4}"));
    /* DISK after a hole in CPU: the walk goes on down, never back up */
    op = stored(h + 1, 1, "disk");
    apply(idx, e1, &op, 1, -1);
    a = query(idx, "default", "m", 4, h, 4, NULL);
    assert_non_null(strstr(a, "\"1\":{\"gpu\":4,\"cpu\":4,\"disk\":8}"));
    /* resync of rank 1's publisher: its blocks go, rank 0's stay */
    kvp_idx_wrlock(idx);
    kvp_idx_resync(idx, e1, "gap");
    kvp_idx_unlock(idx);
    a = query(idx, "default", "m", 4, h, 4, NULL);
    assert_non_null(strstr(a, "\"DP\":{\"0\":8,\"1\":0}"));
    kvp_idx_destroy(idx);
}

static void test_engine_hashes(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    uint32_t e = reg(idx, "tcp://e:1", "vLLM", "inst", "default", 0);
    uint32_t pool = reg(idx, "tcp://pool:1", "kvpool", "inst", "default", 0);
    /* the engine's hashes 1001, 1002 with their tokens; the standard ones from the tokens */
    for (int i = 0; i < 8; i++)
        T[0][i] = (uint32_t)i + 1;
    uint64_t eng[2] = {1001, 1002};
    kvp_idx_op_t op = stored(eng, 2, NULL);
    op.has_tokens = true;
    op.n_tokens = 8;
    apply(idx, e, &op, 1, -1);
    uint64_t std[2] = {0x6fc1ebd4f4d6ea31ull, 0x3a14937fd5340c7aull};
    assert_non_null(strstr(query(idx, "default", "m", 4, std, 2, NULL), "\"GPU\":8,"));
    /* a child stored with its parent's engine hash continues from the parent's standard */
    for (int i = 0; i < 4; i++)
        T[0][i] = (uint32_t)i + 9;
    uint64_t child = 1003;
    op = stored(&child, 1, NULL);
    op.has_tokens = true;
    op.n_tokens = 4;
    op.has_parent = true;
    op.parent = 1002;
    apply(idx, e, &op, 1, -1);
    uint32_t t12[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    uint64_t s3[3];
    kvp_idx_hash_tokens(0, t12, 3, 4, false, 0, s3);
    assert_non_null(strstr(query(idx, "default", "m", 4, s3, 3, NULL), "\"GPU\":12,"));
    /* the pool names the engine's hash (its key's): CPU for the block */
    op = stored(eng, 2, "cpu");
    op.envelope = true;
    apply(idx, pool, &op, 1, -1);
    assert_non_null(strstr(query(idx, "default", "m", 4, s3, 3, NULL), "\"CPU\":8,"));
    /* the engine removes by its own hash */
    op = removed(eng, 1, NULL);
    apply(idx, e, &op, 1, -1);
    const char *a = query(idx, "default", "m", 4, s3, 3, NULL);
    assert_non_null(strstr(a, "\"GPU\":0,"));
    assert_non_null(strstr(a, "\"longest_matched\":12,")); /* block 0 on CPU, 1 and 2 on GPU */
    /* a parent never mapped: unplaced, nothing indexed */
    uint64_t orphan = 5000;
    op = stored(&orphan, 1, NULL);
    op.has_tokens = true;
    op.n_tokens = 4;
    op.has_parent = true;
    op.parent = 4242;
    apply(idx, e, &op, 1, -1);
    buf_t m = {.n = 0};
    kvp_idx_metrics(idx, put, &m);
    assert_non_null(strstr(m.s, "kvpool_indexer_unplaced_blocks_total 1\n"));
    /* token ids that are not whole blocks of the scope's size: unplaced */
    op = stored(&orphan, 1, NULL);
    op.has_tokens = true;
    op.n_tokens = 3;
    apply(idx, e, &op, 1, -1);
    m.n = 0;
    kvp_idx_metrics(idx, put, &m);
    assert_non_null(strstr(m.s, "kvpool_indexer_unplaced_blocks_total 2\n"));
    kvp_idx_destroy(idx);
}

static void test_ranks_tenants_clear(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    /* one engine endpoint registered for ranks 0 and 1 of an instance: a batch's rank picks */
    uint32_t e = reg(idx, "tcp://e:1", "vLLM", "inst", "default", 0);
    (void)reg(idx, "tcp://e:1", "vLLM", "inst", "default", 1);
    uint64_t h[2] = {21, 22};
    kvp_idx_op_t op = stored(h, 2, NULL);
    apply(idx, e, &op, 1, 1);
    assert_non_null(strstr(query(idx, "default", "m", 4, h, 2, NULL), "\"DP\":{\"0\":0,\"1\":8}"));
    /* a pool's batch of rank 0 counts for every rank it is registered under */
    uint32_t p = reg(idx, "tcp://pool:1", "Mooncake", "inst", "default", 0);
    (void)reg(idx, "tcp://pool:1", "Mooncake", "inst", "default", 1);
    op = stored(h, 1, "cpu");
    op.envelope = true;
    apply(idx, p, &op, 1, 0);
    const char *a = query(idx, "default", "m", 4, h, 2, NULL);
    assert_non_null(strstr(a, "\"0\":{\"gpu\":0,\"cpu\":4,\"disk\":4}"));
    assert_non_null(strstr(a, "\"1\":{\"gpu\":8,\"cpu\":8,\"disk\":8}"));
    /* an envelope of another tenant is not applied to this tenant's registrations */
    uint64_t h3 = 23;
    op = stored(&h3, 1, "cpu");
    op.envelope = true;
    op.tenant = "other";
    op.tenant_len = 5;
    apply(idx, p, &op, 1, 0);
    assert_null(strstr(query(idx, "default", "m", 4, &h3, 1, NULL), "\"CPU\":4"));
    /* a cleared of cpu on the pool: its CPU blocks go, the engine's GPU ones stay */
    op =
        (kvp_idx_op_t){.kind = KVP_IDX_CLEARED, .envelope = true, .medium = "cpu", .medium_len = 3};
    apply(idx, p, &op, 1, 0);
    a = query(idx, "default", "m", 4, h, 2, NULL);
    assert_non_null(strstr(a, "\"CPU\":0,"));
    assert_non_null(strstr(a, "\"GPU\":8,"));
    /* vLLM's AllBlocksCleared: every medium of the publisher */
    op = (kvp_idx_op_t){.kind = KVP_IDX_CLEARED, .all_media = true};
    apply(idx, e, &op, 1, 1);
    assert_non_null(strstr(query(idx, "default", "m", 4, h, 2, NULL), "\"longest_matched\":0,"));
    /* unregister: the names, then nothing left to find */
    char names[256] = "";
    kvp_idx_wrlock(idx);
    assert_int_equal(kvp_idx_unregister(idx, "inst", "default", true, 0, name_cat, names), KVP_OK);
    assert_int_equal(kvp_idx_unregister(idx, "inst", "default", true, 0, name_cat, names),
                     KVP_ERR_NOT_FOUND);
    kvp_idx_sub_info_t subs[4];
    assert_int_equal(kvp_idx_subs(idx, subs, 4), 0);
    kvp_idx_unlock(idx);
    assert_string_equal(names, "inst|default|0inst|default|1");
    assert_string_equal(query(idx, "default", "m", 4, h, 2, NULL), "{\"default\":{}}");
    kvp_idx_destroy(idx);
}

static void test_max_blocks(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(100);
    uint32_t e = reg(idx, "tcp://e:1", "vLLM", "inst", "default", 0);
    uint64_t h[50];
    for (uint64_t round = 0; round < 10; round++) {
        for (int i = 0; i < 50; i++)
            h[i] = round * 1000 + (uint64_t)i + 1;
        kvp_idx_op_t op = stored(h, 50, NULL);
        apply(idx, e, &op, 1, -1);
    }
    buf_t m = {.n = 0};
    kvp_idx_metrics(idx, put, &m);
    assert_non_null(strstr(m.s, "kvpool_indexer_blocks 100\n"));
    assert_non_null(strstr(m.s, "kvpool_indexer_evicted_blocks_total 400\n"));
    /* the last two rounds are there, the first is not */
    assert_non_null(strstr(query(idx, "default", "m", 4, h, 50, NULL), "\"GPU\":200,"));
    for (int i = 0; i < 50; i++)
        h[i] = (uint64_t)i + 1;
    assert_non_null(strstr(query(idx, "default", "m", 4, h, 50, NULL), "\"GPU\":0,"));
    kvp_idx_destroy(idx);
}

/* Many stores and removes against a plain model: the block and holder counts agree, and
 * the table finds every block after its growths and backward-shift deletions. */
static void test_model(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    uint32_t e = reg(idx, "tcp://e:1", "vLLM", "inst", "default", 0);
    enum { N = 5000 };
    static bool in[N];
    memset(in, 0, sizeof(in));
    uint64_t r = 12345;
    size_t count = 0;
    for (int it = 0; it < 60000; it++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        uint64_t k = r % N;
        uint64_t hv = k * 0x9E3779B97F4A7C15ull + 1;
        kvp_idx_op_t op = (r >> 32) % 3 ? stored(&hv, 1, NULL) : removed(&hv, 1, NULL);
        apply(idx, e, &op, 1, -1);
        if (op.kind == KVP_IDX_STORED && !in[k])
            count++, in[k] = true;
        else if (op.kind == KVP_IDX_REMOVED && in[k])
            count--, in[k] = false;
    }
    buf_t m = {.n = 0};
    kvp_idx_metrics(idx, put, &m);
    char want[64];
    snprintf(want, sizeof(want), "kvpool_indexer_blocks %zu\n", count);
    assert_non_null(strstr(m.s, want));
    for (uint64_t k = 0; k < N; k++) {
        uint64_t hv = k * 0x9E3779B97F4A7C15ull + 1;
        const char *a = query(idx, "default", "m", 4, &hv, 1, NULL);
        assert_int_equal(strstr(a, "\"GPU\":4,") != NULL, in[k]);
    }
    kvp_idx_destroy(idx);
}

/* An engine hash's map outlives its block: a pool's event naming it after the engine removed
 * the block (their batches have no common order) still finds the standard hash; past
 * --max-blocks maps the least recently used go. A medium beyond the three is named in an
 * answer while the instance holds any block on it. */
static void test_maps_outlive_blocks(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(4);
    uint32_t e = reg(idx, "tcp://e:1", "vLLM", "inst", "default", 0);
    uint32_t pool = reg(idx, "tcp://pool:1", "kvpool", "inst", "default", 0);
    for (int i = 0; i < 4; i++)
        T[0][i] = (uint32_t)i + 1;
    uint64_t eng = 777;
    kvp_idx_op_t op = stored(&eng, 1, NULL);
    op.has_tokens = true;
    op.n_tokens = 4;
    apply(idx, e, &op, 1, -1);
    op = removed(&eng, 1, NULL); /* the engine evicts it: no block left */
    apply(idx, e, &op, 1, -1);
    uint64_t std = 0x6fc1ebd4f4d6ea31ull;
    assert_non_null(strstr(query(idx, "default", "m", 4, &std, 1, NULL), "\"longest_matched\":0,"));
    op = stored(&eng, 1, "cpu"); /* the pool's offload ends after it */
    op.envelope = true;
    apply(idx, pool, &op, 1, -1);
    assert_non_null(strstr(query(idx, "default", "m", 4, &std, 1, NULL), "\"CPU\":4,"));
    /* a fifth medium: named while held, with its run; not once its last block goes */
    uint64_t other = 4242;
    op = stored(&other, 1, "nvme");
    op.envelope = true;
    apply(idx, pool, &op, 1, -1);
    const char *a = query(idx, "default", "m", 4, &std, 1, NULL);
    assert_non_null(strstr(a, "\"NVME\":0,"));
    op = removed(&other, 1, "nvme");
    op.envelope = true;
    apply(idx, pool, &op, 1, -1);
    assert_null(strstr(query(idx, "default", "m", 4, &std, 1, NULL), "NVME"));
    /* more maps than --max-blocks (4): the oldest unused go, counted */
    for (uint64_t k = 0; k < 10; k++) {
        uint64_t h = 9000 + k;
        for (int i = 0; i < 4; i++)
            T[0][i] = (uint32_t)(k * 4 + (uint64_t)i + 100);
        op = stored(&h, 1, NULL);
        op.has_tokens = true;
        op.n_tokens = 4;
        apply(idx, e, &op, 1, -1);
    }
    buf_t m = {.n = 0};
    kvp_idx_metrics(idx, put, &m);
    assert_non_null(strstr(m.s, "kvpool_indexer_engine_hashes 4\n"));
    assert_non_null(strstr(m.s, "kvpool_indexer_engine_hashes_evicted_total 7\n"));
    kvp_idx_destroy(idx);
}

static uint64_t metric_of(kvp_idx_t *idx, const char *name)
{
    static buf_t m;
    m.n = 0;
    kvp_idx_metrics(idx, put, &m);
    kvp_idx_metrics_tenants(idx, put, &m);
    char key[128];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *at = strstr(m.s, key);
    assert_non_null(at);
    return strtoull(at + strlen(key), NULL, 10);
}

/* A block stored by engines of two hashings: both engine hashes find it (the second one in
 * the overflow maps), each engine's remove takes its own holder. An engine hash that comes
 * again for other tokens names the new block from then on. */
static void test_two_hashings(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    uint32_t e1 = reg(idx, "tcp://e:1", "vLLM", "a", "default", 0);
    uint32_t e2 = reg(idx, "tcp://e:2", "SGLang", "b", "default", 0);
    uint32_t pool = reg(idx, "tcp://pool:1", "kvpool", "a", "default", 0);
    for (int i = 0; i < 4; i++)
        T[0][i] = (uint32_t)i + 1;
    uint64_t std = 0x6fc1ebd4f4d6ea31ull, h1 = 1001, h2 = 2001;
    kvp_idx_op_t op = stored(&h1, 1, NULL);
    op.has_tokens = true;
    op.n_tokens = 4;
    apply(idx, e1, &op, 1, -1);
    op = stored(&h2, 1, NULL);
    op.has_tokens = true;
    op.n_tokens = 4;
    apply(idx, e2, &op, 1, -1);
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 1);
    assert_int_equal(metric_of(idx, "kvpool_indexer_engine_hashes"), 2);
    const char *a = query(idx, "default", "m", 4, &std, 1, NULL);
    assert_non_null(strstr(a, "\"a\":{\"longest_matched\":4,"));
    assert_non_null(strstr(a, "\"b\":{\"longest_matched\":4,"));
    /* the second engine removes by its hash: its holder goes, the first engine's stays */
    op = removed(&h2, 1, NULL);
    apply(idx, e2, &op, 1, -1);
    a = query(idx, "default", "m", 4, &std, 1, NULL);
    assert_non_null(strstr(a, "\"a\":{\"longest_matched\":4,"));
    assert_non_null(strstr(a, "\"b\":{\"longest_matched\":0,"));
    op = removed(&h1, 1, NULL);
    apply(idx, e1, &op, 1, -1);
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 0);
    assert_int_equal(metric_of(idx, "kvpool_indexer_block_holders"), 0);
    /* both maps outlive the block: the pool names the second engine's hash */
    assert_int_equal(metric_of(idx, "kvpool_indexer_engine_hashes"), 2);
    op = stored(&h2, 1, "cpu");
    op.envelope = true;
    apply(idx, pool, &op, 1, -1);
    assert_non_null(strstr(query(idx, "default", "m", 4, &std, 1, NULL), "\"CPU\":4,"));
    /* engine hash 1001 again, for other tokens: it names that block now */
    for (int i = 0; i < 4; i++)
        T[0][i] = (uint32_t)i + 50;
    uint64_t other;
    kvp_idx_hash_tokens(0, T[0], 1, 4, false, 0, &other);
    op = stored(&h1, 1, NULL);
    op.has_tokens = true;
    op.n_tokens = 4;
    apply(idx, e1, &op, 1, -1);
    assert_non_null(strstr(query(idx, "default", "m", 4, &other, 1, NULL), "\"GPU\":4,"));
    op = removed(&h1, 1, NULL);
    apply(idx, e1, &op, 1, -1);
    assert_non_null(strstr(query(idx, "default", "m", 4, &other, 1, NULL), "\"GPU\":0,"));
    a = query(idx, "default", "m", 4, &std, 1, NULL);
    assert_non_null(strstr(a, "\"CPU\":4,")); /* the first block untouched */
    kvp_idx_destroy(idx);
}

/* A block held by many (registration, medium) pairs: every holder counted and answered,
 * removed one by one until the block is gone (the holder array grows and shrinks back). */
static void test_many_holders(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    enum { N = 12 };
    uint32_t sub[N];
    for (int k = 0; k < N; k++) {
        char ep[32], inst[16];
        snprintf(ep, sizeof(ep), "tcp://e:%d", k + 1);
        snprintf(inst, sizeof(inst), "i%02d", k);
        sub[k] = reg(idx, ep, "kvpool", inst, "default", 0);
    }
    static const char *media[3] = {"GPU", "CPU", "DISK"};
    uint64_t h[2] = {77, 78};
    for (int k = 0; k < N; k++)
        for (int m = 0; m < 3; m++) {
            kvp_idx_op_t op = stored(h, 2, media[m]);
            apply(idx, sub[k], &op, 1, -1);
        }
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 2);
    assert_int_equal(metric_of(idx, "kvpool_indexer_block_holders"), 2 * N * 3);
    for (int k = 0; k < N; k++) {
        for (int m = 0; m < 3; m++) {
            const char *a = query(idx, "default", "m", 4, h, 2, NULL);
            char want[96];
            snprintf(want, sizeof(want), "\"i%02d\":{\"longest_matched\":8,", k);
            assert_non_null(strstr(a, want));
            kvp_idx_op_t op = removed(h, 1, media[m]); /* the first block only */
            apply(idx, sub[k], &op, 1, -1);
        }
        const char *a = query(idx, "default", "m", 4, h, 2, NULL);
        char want[96];
        snprintf(want, sizeof(want), "\"i%02d\":{\"longest_matched\":0,", k);
        assert_non_null(strstr(a, want));
        assert_int_equal(metric_of(idx, "kvpool_indexer_block_holders"),
                         (uint64_t)(2 * N * 3 - 3 * (k + 1)));
    }
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 1);
    kvp_idx_destroy(idx);
}

/* Store blocks first..first+n of sub (in ops of 50). */
static void store_range(kvp_idx_t *idx, uint32_t sub, uint64_t first, uint64_t n)
{
    uint64_t h[50];
    for (uint64_t k = 0; k < n;) {
        size_t c = 0;
        for (; c < 50 && k < n; c++, k++)
            h[c] = first + k;
        kvp_idx_op_t op = stored(h, c, NULL);
        apply(idx, sub, &op, 1, -1);
    }
}

/* How many of blocks first..first+n tenant's instance inst holds (a query of each). */
static uint64_t held_of(kvp_idx_t *idx, const char *tenant, const char *inst, uint64_t first,
                        uint64_t n)
{
    uint64_t held = 0;
    char want[64];
    snprintf(want, sizeof(want), "\"%s\":{\"longest_matched\":4,", inst);
    for (uint64_t k = 0; k < n; k++) {
        uint64_t h = first + k;
        held += strstr(query(idx, tenant, "m", 4, &h, 1, NULL), want) != NULL;
    }
    return held;
}

/* A tenant flooding past --max-blocks evicts its own least recently stored blocks: another
 * tenant under its fair share keeps every one; a third tenant's arrival shrinks the shares
 * and the one over its share gives way; each eviction is counted for its tenant. */
static void test_tenant_budgets(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(100);
    uint32_t a = reg(idx, "tcp://a:1", "vLLM", "ia", "team-a", 0);
    uint32_t b = reg(idx, "tcp://b:1", "vLLM", "ib", "team-b", 0);
    uint32_t c = reg(idx, "tcp://c:1", "vLLM", "ic", "team-c", 0);
    store_range(idx, a, 1, 30);
    store_range(idx, b, 1000, 500); /* its share: 50 of 100 */
    assert_int_equal(held_of(idx, "team-a", "ia", 1, 30), 30);
    assert_int_equal(metric_of(idx, "kvpool_indexer_tenant_blocks{tenant=\"team-b\"}"), 50);
    assert_int_equal(
        metric_of(idx, "kvpool_indexer_tenant_evicted_blocks_total{tenant=\"team-b\"}"), 450);
    assert_int_equal(held_of(idx, "team-b", "ib", 1450, 50), 50); /* its newest */
    assert_int_equal(held_of(idx, "team-b", "ib", 1000, 450), 0);
    assert_null(strstr(query(idx, "team-a", "m", 4, (uint64_t[]){1}, 1, NULL), "\"ib\""));
    store_range(idx, c, 5000, 200); /* shares of 33: team-b gives way, team-a stays */
    assert_int_equal(held_of(idx, "team-a", "ia", 1, 30), 30);
    assert_true(metric_of(idx, "kvpool_indexer_tenant_blocks{tenant=\"team-c\"}") <= 33);
    assert_true(metric_of(idx, "kvpool_indexer_tenant_blocks{tenant=\"team-b\"}") <= 50);
    assert_true(metric_of(idx, "kvpool_indexer_blocks") <= 100);
    assert_int_equal(metric_of(idx, "kvpool_indexer_tenant_block_budget"), 33);
    buf_t m = {.n = 0};
    kvp_idx_metrics_tenants(idx, put, &m);
    assert_null(strstr(m.s, "kvpool_indexer_tenant_evicted_blocks_total{tenant=\"team-a\"}"));
    m.n = 0; /* the series that name tenants are apart from the others */
    kvp_idx_metrics(idx, put, &m);
    assert_null(strstr(m.s, "team-"));
    kvp_idx_destroy(idx);

    /* an explicit budget: team-b keeps 20 of its own though --max-blocks has room */
    kvp_idx_params_t p = {.max_blocks = 1000, .max_blocks_per_tenant = 20};
    assert_int_equal(kvp_idx_create(&p, &idx), KVP_OK);
    a = reg(idx, "tcp://a:1", "vLLM", "ia", "team-a", 0);
    b = reg(idx, "tcp://b:1", "vLLM", "ib", "team-b", 0);
    store_range(idx, a, 1, 20);
    store_range(idx, b, 1000, 300);
    assert_int_equal(held_of(idx, "team-a", "ia", 1, 20), 20);
    assert_int_equal(held_of(idx, "team-b", "ib", 1280, 20), 20);
    assert_int_equal(metric_of(idx, "kvpool_indexer_tenant_blocks{tenant=\"team-b\"}"), 20);
    kvp_idx_destroy(idx);
}

/* A clear, a resync and an unregister visit what their publisher holds, not every node:
 * team-a's 5 000 blocks are never walked by team-b's 200 [store, clear] pairs, nor by a
 * publisher whose one block was stored and removed 5 000 times (its list is compacted). */
static void test_purge_costs_what_it_holds(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    uint32_t a = reg(idx, "tcp://a:1", "vLLM", "ia", "team-a", 0);
    uint32_t b = reg(idx, "tcp://b:1", "vLLM", "ib", "team-b", 0);
    store_range(idx, a, 1, 5000);
    uint64_t v0 = metric_of(idx, "kvpool_indexer_purge_visits_total");
    for (uint64_t k = 0; k < 200; k++) {
        uint64_t h = 100000 + k;
        kvp_idx_op_t ops[2] = {stored(&h, 1, NULL), {.kind = KVP_IDX_CLEARED, .all_media = true}};
        apply(idx, b, ops, 2, -1);
    }
    assert_int_equal(metric_of(idx, "kvpool_indexer_purge_visits_total") - v0, 200);
    assert_int_equal(held_of(idx, "team-a", "ia", 1, 5000), 5000);
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 5000);
    /* one block stored and removed again and again, then a clear: a few entries */
    uint64_t h = 7;
    for (int k = 0; k < 5000; k++) {
        kvp_idx_op_t op = k % 2 == 0 ? stored(&h, 1, NULL) : removed(&h, 1, NULL);
        apply(idx, b, &op, 1, -1);
    }
    store_range(idx, b, 200000, 10);
    v0 = metric_of(idx, "kvpool_indexer_purge_visits_total");
    kvp_idx_op_t clear = {.kind = KVP_IDX_CLEARED, .all_media = true};
    apply(idx, b, &clear, 1, -1);
    /* at most 4 x its holders + 128 entries: compacted when full past 2 x + 64 */
    assert_true(metric_of(idx, "kvpool_indexer_purge_visits_total") - v0 <= 4 * 10 + 128);
    assert_int_equal(held_of(idx, "team-b", "ib", 200000, 10), 0);
    /* a resync of team-b's publisher: what it holds (3 blocks) */
    store_range(idx, b, 300000, 3);
    v0 = metric_of(idx, "kvpool_indexer_purge_visits_total");
    kvp_idx_wrlock(idx);
    kvp_idx_resync(idx, b, "gap");
    kvp_idx_unlock(idx);
    assert_int_equal(metric_of(idx, "kvpool_indexer_purge_visits_total") - v0, 3);
    assert_int_equal(held_of(idx, "team-a", "ia", 1, 5000), 5000);
    /* a medium's clear keeps the blocks held on the others (their entries stay) */
    store_range(idx, a, 1, 2); /* on GPU already */
    uint64_t two[2] = {1, 2};
    kvp_idx_op_t cpu = stored(two, 2, "cpu");
    cpu.envelope = true;
    apply(idx, a, &cpu, 1, -1);
    kvp_idx_op_t clear_cpu = {
        .kind = KVP_IDX_CLEARED, .envelope = true, .medium = "cpu", .medium_len = 3};
    apply(idx, a, &clear_cpu, 1, -1);
    assert_non_null(strstr(query(idx, "team-a", "m", 4, two, 2, NULL), "\"GPU\":8,\"CPU\":0,"));
    /* unregistering team-a: its 5 000 */
    v0 = metric_of(idx, "kvpool_indexer_purge_visits_total");
    char names[256] = "";
    kvp_idx_wrlock(idx);
    assert_int_equal(kvp_idx_unregister(idx, "ia", "team-a", true, 0, name_cat, names), KVP_OK);
    kvp_idx_reap(idx);
    kvp_idx_unlock(idx);
    assert_int_equal(metric_of(idx, "kvpool_indexer_purge_visits_total") - v0, 5000);
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 0);
    kvp_idx_destroy(idx);
}

/* Hashes first, first + 1, ... of op (its parent field names first). */
static void seq_cb(void *arg, const kvp_idx_op_t *op, uint64_t *out)
{
    (void)arg;
    for (size_t k = 0; k < op->n_hashes; k++)
        out[k] = op->parent + k;
}

/* One batch of sub: blocks first..first+n stored, then (clear) all of them cleared. */
static void store_seq(kvp_idx_t *idx, uint32_t sub, uint64_t first, size_t n, bool clear)
{
    kvp_idx_op_t ops[2] = {{.kind = KVP_IDX_STORED, .n_hashes = n, .parent = first},
                           {.kind = KVP_IDX_CLEARED, .all_media = true}};
    kvp_idx_batch_t b = {.ops = ops, .n_ops = clear ? 2 : 1, .hashes = seq_cb};
    kvp_idx_wrlock(idx);
    kvp_idx_apply(idx, sub, &b);
    kvp_idx_unlock(idx);
}

/* The subscriber thread, woken after an unregister: the blocks of those unregistered go. */
static void reap(kvp_idx_t *idx)
{
    kvp_idx_wrlock(idx);
    kvp_idx_reap(idx);
    kvp_idx_unlock(idx);
}

static kvp_status_t unreg(kvp_idx_t *idx, const char *inst, const char *tenant, char *names)
{
    kvp_idx_wrlock(idx);
    kvp_status_t st = kvp_idx_unregister(idx, inst, tenant, true, 0, name_cat, names);
    kvp_idx_unlock(idx);
    return st;
}

/* An unregister of a registration holding 100 000 blocks takes it out of every answer at
 * once, its name free, without walking its blocks; the reap that follows purges them letting
 * the write lock go between slices (counted), and leaves team-a's blocks whole; so for a
 * re-register in another scope, which replaces the registration. */
static void test_unregister_in_slices(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    uint32_t a = reg(idx, "tcp://a:1", "vLLM", "ia", "team-a", 0);
    uint32_t b = reg(idx, "tcp://b:1", "vLLM", "ib", "team-b", 0);
    store_range(idx, a, 1, 1000);
    store_seq(idx, b, 1000000, 100000, false);
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 101000);
    uint64_t s0 = metric_of(idx, "kvpool_indexer_write_slices_total");
    char names[256] = "";
    uint64_t v0 = metric_of(idx, "kvpool_indexer_purge_visits_total");
    assert_int_equal(unreg(idx, "ib", "team-b", names), KVP_OK);
    assert_string_equal(names, "ib|team-b|0");
    assert_int_equal(metric_of(idx, "kvpool_indexer_purge_visits_total"), v0);
    uint64_t h = 1000000;
    assert_string_equal(query(idx, "team-b", "m", 4, &h, 1, NULL), "{\"team-b\":{}}");
    assert_int_equal(metric_of(idx, "kvpool_indexer_write_slices_total"), s0);
    assert_int_equal(metric_of(idx, "kvpool_indexer_registrations_unregistering"), 1);
    reap(idx);
    assert_int_equal(metric_of(idx, "kvpool_indexer_registrations_unregistering"), 0);
    assert_int_equal(metric_of(idx, "kvpool_indexer_purge_visits_total") - v0, 100000);
    assert_true(metric_of(idx, "kvpool_indexer_write_slices_total") - s0 >= 100000 / 8192);
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 1000);
    assert_int_equal(metric_of(idx, "kvpool_indexer_block_holders"), 1000);
    assert_int_equal(unreg(idx, "ib", "team-b", names), KVP_ERR_NOT_FOUND);
    assert_int_equal(held_of(idx, "team-a", "ia", 1, 1000), 1000);
    /* registered again: a registration of its own, holding nothing of the old one's */
    b = reg(idx, "tcp://b:1", "vLLM", "ib", "team-b", 0);
    assert_non_null(strstr(query(idx, "team-b", "m", 4, &h, 1, NULL), "\"longest_matched\":0,"));
    store_seq(idx, b, 1000000, 100000, false);
    /* another scope: the old registration's blocks purged in slices, the new one live */
    kvp_idx_reg_params_t p = {.endpoint = "tcp://b:1",
                              .replay_endpoint = "",
                              .type = "vLLM",
                              .model = "m2",
                              .lora = "",
                              .tenant = "team-b",
                              .instance = "ib",
                              .salt = "",
                              .block_size = 4};
    bool changed;
    char err[128];
    s0 = metric_of(idx, "kvpool_indexer_write_slices_total");
    kvp_idx_wrlock(idx);
    assert_int_equal(kvp_idx_register(idx, &p, &changed, err, sizeof(err)), KVP_OK);
    kvp_idx_unlock(idx);
    assert_true(changed);
    assert_string_equal(query(idx, "team-b", "m", 4, &h, 1, NULL), "{\"team-b\":{}}");
    reap(idx);
    assert_true(metric_of(idx, "kvpool_indexer_write_slices_total") - s0 >= 100000 / 8192);
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 1000);
    assert_non_null(strstr(query(idx, "team-b", "m2", 4, &h, 1, NULL), "\"ib\":{"));
    assert_string_equal(query(idx, "team-b", "m", 4, &h, 1, NULL), "{\"team-b\":{}}");
    assert_int_equal(held_of(idx, "team-a", "ia", 1, 1000), 1000);
    kvp_idx_destroy(idx);
}

/* The tables double off the write lock: a batch copies them under a read lock between its
 * slices (queries go on) and swaps them in, so that no query waits for a copy of millions of
 * slots; none is doubled under the write lock, in one batch of 400 000 blocks or in 8 000
 * batches of 50, and every block is there after. */
static void test_tables_grow_aside(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    uint32_t a = reg(idx, "tcp://a:1", "vLLM", "ia", "team-a", 0);
    uint32_t b = reg(idx, "tcp://b:1", "vLLM", "ib", "team-b", 0);
    const char *aside = "kvpool_indexer_table_grows_total{where=\"aside\"}",
               *locked = "kvpool_indexer_table_grows_total{where=\"write_lock\"}";
    store_seq(idx, a, 1000000, 400000, false);
    uint64_t g = metric_of(idx, aside);
    assert_true(g >= 4);                  /* 65 536 slots at first: 131 072, ..., 1 048 576 */
    store_range(idx, b, 5000000, 400000); /* past 3/4 of 1 048 576, in batches of 50 */
    assert_true(metric_of(idx, aside) > g);
    assert_int_equal(metric_of(idx, locked), 0);
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 800000);
    uint64_t held = 0;
    for (uint64_t k = 0; k < 400000; k += 997)
        held += held_of(idx, "team-a", "ia", 1000000 + k, 1);
    assert_int_equal(held, (400000 + 996) / 997);
    assert_int_equal(held_of(idx, "team-b", "ib", 5000000, 2000), 2000);
    assert_int_equal(held_of(idx, "team-b", "ib", 5398000, 2000), 2000);
    kvp_idx_destroy(idx);
}

/* A registration unregistered counts towards its tenant's cap until its blocks are reaped: a
 * tenant unregistering in a loop holds no more slots than its cap; another tenant is not
 * refused meanwhile. */
static void test_unregistered_count_until_reaped(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    kvp_idx_set_tenant_caps(idx, 1, 0);
    uint32_t b = reg(idx, "tcp://b:1", "vLLM", "ib", "team-b", 0);
    store_seq(idx, b, 1, 20000, false);
    char names[64] = "";
    assert_int_equal(unreg(idx, "ib", "team-b", names), KVP_OK);
    kvp_idx_reg_params_t p = {.endpoint = "tcp://b:1",
                              .replay_endpoint = "",
                              .type = "vLLM",
                              .model = "m",
                              .lora = "",
                              .tenant = "team-b",
                              .instance = "ib",
                              .salt = "",
                              .block_size = 4};
    const char *reason = NULL;
    p.reason_p = &reason;
    bool changed;
    char err[256];
    kvp_idx_wrlock(idx);
    assert_int_equal(kvp_idx_register(idx, &p, &changed, err, sizeof(err)), KVP_ERR_TOO_MANY);
    kvp_idx_unlock(idx);
    assert_string_equal(reason, "tenant_registrations");
    assert_non_null(strstr(err, "still being dropped"));
    (void)reg(idx, "tcp://a:1", "vLLM", "ia", "team-a", 0);
    reap(idx);
    (void)reg(idx, "tcp://b:1", "vLLM", "ib", "team-b", 0);
    kvp_idx_destroy(idx);
}

/* A block kept for its engine hash after its tenant's last registration of the scope went
 * keeps the scope's slot: another tenant registering the same model gets a scope of its own,
 * so that the same tokens make a block of its own, counted to it (a slot taken again named
 * the kept block's scope: team-b's block was team-a's node, in team-a's clock). A tenant
 * holds at most a quarter of the scopes. */
static void test_scopes_kept_by_blocks(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(1000);
    uint32_t a = reg(idx, "tcp://a:1", "vLLM", "ia", "team-a", 0);
    for (int i = 0; i < 4; i++)
        T[0][i] = (uint32_t)i + 11;
    uint64_t eng = 777;
    kvp_idx_op_t op = stored(&eng, 1, NULL);
    op.has_tokens = true;
    op.n_tokens = 4;
    apply(idx, a, &op, 1, -1);
    op = removed(&eng, 1, NULL); /* kept for its engine hash, no holder */
    apply(idx, a, &op, 1, -1);
    char names[256] = "";
    assert_int_equal(unreg(idx, "ia", "team-a", names), KVP_OK);
    reap(idx);
    assert_int_equal(metric_of(idx, "kvpool_indexer_tenant_blocks{tenant=\"team-a\"}"), 1);
    uint32_t b = reg(idx, "tcp://b:1", "vLLM", "ib", "team-b", 0);
    op = stored(&eng, 1, NULL);
    op.has_tokens = true;
    op.n_tokens = 4;
    apply(idx, b, &op, 1, -1);
    assert_int_equal(metric_of(idx, "kvpool_indexer_tenant_blocks{tenant=\"team-b\"}"), 1);
    assert_int_equal(metric_of(idx, "kvpool_indexer_tenant_blocks{tenant=\"team-a\"}"), 1);
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 1); /* team-a's has no holder */
    op = removed(&eng, 1, NULL); /* team-b's remove takes its own holder, not team-a's node */
    apply(idx, b, &op, 1, -1);
    assert_int_equal(metric_of(idx, "kvpool_indexer_block_holders"), 0);
    assert_int_equal(metric_of(idx, "kvpool_indexer_tenant_blocks{tenant=\"team-a\"}"), 1);

    /* a quarter of the 4 096 scopes per tenant; others register still */
    kvp_idx_reg_params_t p = {.endpoint = "tcp://x:1",
                              .replay_endpoint = "",
                              .type = "vLLM",
                              .lora = "",
                              .tenant = "team-x",
                              .salt = "",
                              .block_size = 4};
    const char *reason = NULL;
    p.reason_p = &reason;
    char model[32], inst[32], err[256];
    bool changed;
    kvp_status_t st = KVP_OK;
    int n = 0;
    kvp_idx_wrlock(idx);
    for (; n < 2000 && st == KVP_OK; n++) {
        snprintf(model, sizeof(model), "m%d", n);
        snprintf(inst, sizeof(inst), "i%d", n);
        p.model = model;
        p.instance = inst;
        st = kvp_idx_register(idx, &p, &changed, err, sizeof(err));
    }
    kvp_idx_unlock(idx);
    assert_int_equal(st, KVP_ERR_TOO_MANY);
    assert_int_equal(n, 1025);
    assert_string_equal(reason, "tenant_scopes");
    assert_non_null(strstr(err, "team-x has 1024 scopes"));
    (void)reg(idx, "tcp://y:1", "vLLM", "iy", "team-y", 0);
    kvp_idx_destroy(idx);
}

typedef struct waiter {
    kvp_idx_t *idx;
    _Atomic bool stop;
    _Atomic uint64_t reads;
} waiter_t;

/* An HTTP thread answering queries: the read lock taken again and again, 20 us apart. */
static void *reads_in_loop(void *arg)
{
    waiter_t *w = arg;
    while (!atomic_load(&w->stop)) {
        kvp_idx_rdlock(w->idx);
        atomic_fetch_add(&w->reads, 1);
        kvp_idx_unlock(w->idx);
        usleep(20);
    }
    return NULL;
}

/* A batch keeps the write lock for slices of 8192 steps while nobody waits for it, and lets
 * it go after 1024 while a query waits (a wait of a fraction of a millisecond, whatever the
 * memory's speed). A reader waits only when the scheduler runs it during the batch: on a
 * loaded machine (CI's other tests on the other core) a batch may see few waits, so it is
 * tried up to five times; slices of 8192 whoever waits would never pass. */
static void test_slices_shorter_while_waited(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    uint32_t a = reg(idx, "tcp://a:1", "vLLM", "ia", "team-a", 0);
    uint64_t s0 = metric_of(idx, "kvpool_indexer_write_slices_total");
    store_seq(idx, a, 1000000, 100000, false);
    uint64_t alone = metric_of(idx, "kvpool_indexer_write_slices_total") - s0;
    assert_in_range(alone, 6, 16); /* about 100 000 / 8192 */
    waiter_t w = {.idx = idx};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reads_in_loop, &w), 0);
    while (atomic_load(&w.reads) == 0)
        sched_yield();
    uint64_t waited = 0;
    unsigned k = 0;
    for (; k < 5 && waited <= 2 * alone + 8; k++) { /* up to 100 000 / 1024 */
        s0 = metric_of(idx, "kvpool_indexer_write_slices_total");
        store_seq(idx, a, 2000000 + 100000 * k, 100000, false);
        waited = metric_of(idx, "kvpool_indexer_write_slices_total") - s0;
    }
    atomic_store(&w.stop, true);
    pthread_join(t, NULL);
    assert_true(waited > 2 * alone + 8);
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 100000 * (1 + k)); /* all in */
    kvp_idx_destroy(idx);
}

/* The metric's value as a double (a counter of seconds). */
static double metric_f(kvp_idx_t *idx, const char *name)
{
    static buf_t m;
    m.n = 0;
    kvp_idx_metrics(idx, put, &m);
    char key[128];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *at = strstr(m.s, key);
    assert_non_null(at);
    return strtod(at + strlen(key), NULL);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Queries first: with no query being answered a batch never waits; with one answered
 * through a whole batch the batch waits for it at its slice points, at most 2 ms a wait
 * and about 3/4 of its time, and still goes in whole; a wait ends at its bound when the
 * query does not. */
static void test_batches_wait_for_queries(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    uint32_t a = reg(idx, "tcp://a:1", "vLLM", "ia", "team-a", 0);
    kvp_idx_yield(idx); /* nobody querying: no wait */
    store_seq(idx, a, 1000000, 100000, false);
    assert_int_equal(metric_of(idx, "kvpool_indexer_query_yields_total"), 0);

    kvp_idx_query_begin(idx);
    double t0 = now_s();
    kvp_idx_yield(idx); /* the bound of one wait: ~2 ms */
    double one = now_s() - t0;
    assert_true(one >= 0.0015);
    assert_int_equal(metric_of(idx, "kvpool_indexer_query_yields_total"), 1);

    t0 = now_s();
    store_seq(idx, a, 2000000, 100000, false);
    double took = now_s() - t0;
    kvp_idx_query_end(idx);
    uint64_t yields = metric_of(idx, "kvpool_indexer_query_yields_total") - 1;
    double waited = metric_f(idx, "kvpool_indexer_query_yield_seconds_total") - one;
    assert_true(yields >= 10); /* 100 000 blocks: slices of 128 while queried */
    /* 6 ms of waits in a row at most, then 3 of waiting for 1 of work: 3/4 of its time (and
     * a quarter of the last wait's overshoot, which a loaded machine may make 10 ms) */
    assert_true(waited <= 0.75 * took + 0.0015 + 0.01);
    assert_true(waited >= 0.002); /* a whole wait at least: the batch did wait */
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 200000); /* all in */

    /* the query over: batches go on without waiting */
    store_seq(idx, a, 3000000, 100000, false);
    assert_int_equal(metric_of(idx, "kvpool_indexer_query_yields_total"), yields + 1);
    kvp_idx_destroy(idx);
}

typedef struct racer {
    kvp_idx_t *idx;
    uint32_t sub;
    _Atomic bool stop;
    _Atomic uint64_t batches; /* applied so far */
} racer_t;

/* The subscriber thread: team-b's publisher storing 20 000 blocks and clearing them, and the
 * blocks of those unregistered reaped after each batch. */
static void *batches(void *arg)
{
    racer_t *x = arg;
    for (uint64_t k = 0; !atomic_load(&x->stop); k++) {
        store_seq(x->idx, x->sub, 1000000 + (k % 4) * 5000, 20000, k % 3 == 0);
        reap(x->idx);
        atomic_fetch_add(&x->batches, 1);
    }
    return NULL;
}

/* HTTP threads: one name of team-b registered and unregistered again and again. */
static void *churn(void *arg)
{
    racer_t *x = arg;
    kvp_idx_reg_params_t p = {.endpoint = "tcp://b:1",
                              .replay_endpoint = "",
                              .type = "vLLM",
                              .model = "m",
                              .lora = "",
                              .tenant = "team-b",
                              .instance = "ib",
                              .salt = "",
                              .block_size = 4};
    for (uint64_t k = 0; k < 40; k++) {
        while (atomic_load(&x->batches) < k) /* a batch or more between turns */
            sched_yield();
        bool changed;
        char err[128], names[4096] = "";
        kvp_idx_wrlock(x->idx);
        (void)kvp_idx_register(x->idx, &p, &changed, err, sizeof(err));
        kvp_idx_unlock(x->idx);
        (void)unreg(x->idx, "ib", "team-b", names);
    }
    return NULL;
}

/* Two threads register and unregister the same name while batches of its publisher are
 * applied in slices and reaped (a batch's clear stops when its registration went meanwhile; a
 * slot is taken again only once reaped): no registration is found twice, and after it all
 * team-b's blocks are gone with its registrations and team-a's are whole (under ASan: nothing
 * freed is touched). */
static void test_unregister_races(void **state)
{
    (void)state;
    kvp_idx_t *idx = mk(0);
    uint32_t a = reg(idx, "tcp://a:1", "vLLM", "ia", "team-a", 0);
    /* ib2 keeps team-b's subscription alive while ib comes and goes */
    racer_t x = {.idx = idx, .sub = reg(idx, "tcp://b:1", "vLLM", "ib2", "team-b", 0)};
    store_range(idx, a, 1, 1000);
    pthread_t t[3];
    assert_int_equal(pthread_create(&t[0], NULL, batches, &x), 0);
    assert_int_equal(pthread_create(&t[1], NULL, churn, &x), 0);
    assert_int_equal(pthread_create(&t[2], NULL, churn, &x), 0);
    pthread_join(t[1], NULL);
    pthread_join(t[2], NULL);
    atomic_store(&x.stop, true);
    pthread_join(t[0], NULL);
    char names[256] = "";
    (void)unreg(idx, "ib", "team-b", names);
    assert_int_equal(unreg(idx, "ib2", "team-b", names), KVP_OK);
    reap(idx);
    assert_int_equal(metric_of(idx, "kvpool_indexer_blocks"), 1000);
    assert_int_equal(metric_of(idx, "kvpool_indexer_block_holders"), 1000);
    assert_int_equal(held_of(idx, "team-a", "ia", 1, 1000), 1000);
    assert_true(atomic_load(&x.batches) >= 40);
    assert_true(metric_of(idx, "kvpool_indexer_write_slices_total") >= 80);
    kvp_idx_destroy(idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_vectors),
        cmocka_unit_test(test_runs),
        cmocka_unit_test(test_engine_hashes),
        cmocka_unit_test(test_ranks_tenants_clear),
        cmocka_unit_test(test_max_blocks),
        cmocka_unit_test(test_maps_outlive_blocks),
        cmocka_unit_test(test_two_hashings),
        cmocka_unit_test(test_many_holders),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_tenant_budgets),
        cmocka_unit_test(test_purge_costs_what_it_holds),
        cmocka_unit_test(test_unregister_in_slices),
        cmocka_unit_test(test_tables_grow_aside),
        cmocka_unit_test(test_unregistered_count_until_reaped),
        cmocka_unit_test(test_scopes_kept_by_blocks),
        cmocka_unit_test(test_slices_shorter_while_waited),
        cmocka_unit_test(test_batches_wait_for_queries),
        cmocka_unit_test(test_unregister_races),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
