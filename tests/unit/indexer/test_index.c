/*
 * test_index.c - unit tests for indexer/index.c: the hashing standard against vectors
 * made with python3-xxhash, registrations and their publishers, stores and removes by
 * standard and by engine hashes, the runs of a query (longest, per medium, per rank,
 * rank_matches' tier walk), tenants and scopes kept apart, the batch's DP rank, resyncs,
 * unregistering, and --max-blocks evicting the least recently stored blocks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_vectors),  cmocka_unit_test(test_runs),
        cmocka_unit_test(test_engine_hashes), cmocka_unit_test(test_ranks_tenants_clear),
        cmocka_unit_test(test_max_blocks),    cmocka_unit_test(test_maps_outlive_blocks),
        cmocka_unit_test(test_two_hashings),  cmocka_unit_test(test_many_holders),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
