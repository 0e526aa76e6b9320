/*
 * fuzz_indexer.c - libFuzzer target for kvpool-indexer's input parsers and its index.
 *
 * The first byte of an input picks what the rest is:
 *   even  a KV event batch off the wire (indexer/decode.c); when it decodes, it is applied
 *         to a fresh index with two registrations on the publisher (ranks 0 and 1, the
 *         second a pool), then the index is queried by the batch's first hashes and
 *         resynchronized: every block must go (an invariant checked here, a crash if not);
 *   odd   an HTTP body (common/json.c, the JSON reader the API uses): parsed, and on
 *         success every string and integer read back through the accessors the API uses
 *         (the reader on its own, with every accessor: fuzz_json.c).
 * Everything is freed per input: anything left is a leak.
 *
 * Build: meson -Dfuzz=true with clang (deploy/fuzz.sh). Seeds: tests/fuzz/corpus-indexer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"
#include "indexer/decode.h"
#include "indexer/index.h"

static void sink(void *arg, const char *s, size_t len)
{
    (void)s;
    *(size_t *)arg += len;
}

typedef struct metrics {
    char s[16384];
    size_t n;
} metrics_t;

static void metrics_put(void *arg, const char *s, size_t len)
{
    metrics_t *m = arg;
    if (m->n + len + 1 > sizeof(m->s))
        abort();
    memcpy(m->s + m->n, s, len);
    m->n += len;
    m->s[m->n] = '\0';
}

static void batch(const uint8_t *data, size_t size)
{
    kvp_decoder_t d;
    kvp_decoder_init(&d);
    kvp_idx_batch_t b;
    char why[128];
    if (kvp_decode_batch(&d, data, size, &b, why, sizeof(why)) != KVP_OK) {
        kvp_decoder_cleanup(&d);
        return;
    }
    kvp_idx_t *idx;
    kvp_idx_params_t ip = {.seed = 1, .max_blocks = 64};
    if (kvp_idx_create(&ip, &idx) != KVP_OK)
        abort();
    kvp_idx_reg_params_t rp = {.endpoint = "tcp://p:1",
                               .replay_endpoint = "",
                               .type = "vLLM",
                               .model = "m",
                               .lora = "",
                               .tenant = "default",
                               .instance = "i",
                               .salt = "",
                               .block_size = 2,
                               .dp_rank = 0};
    bool changed;
    kvp_idx_wrlock(idx);
    if (kvp_idx_register(idx, &rp, &changed, why, sizeof(why)) != KVP_OK)
        abort();
    rp.dp_rank = 1;
    rp.type = "kvpool";
    if (kvp_idx_register(idx, &rp, &changed, why, sizeof(why)) != KVP_OK)
        abort();
    kvp_idx_sub_info_t sub;
    if (kvp_idx_subs(idx, &sub, 1) != 1)
        abort();
    kvp_idx_apply(idx, sub.id, &b);
    kvp_idx_apply(idx, sub.id, &b); /* twice: stores that exist, removes of what is gone */
    kvp_idx_unlock(idx);
    uint64_t h[8] = {0};
    size_t n = 0;
    if (b.n_ops > 0 && b.ops[0].n_hashes > 0) {
        n = b.ops[0].n_hashes < 8 ? b.ops[0].n_hashes : 8;
        uint64_t *all = malloc(b.ops[0].n_hashes * sizeof(*all));
        if (all == NULL)
            abort();
        b.hashes(b.arg, &b.ops[0], all);
        memcpy(h, all, n * sizeof(*h));
        free(all);
    }
    size_t out = 0;
    kvp_idx_query_t q = {.model = "m",
                         .lora = "",
                         .tenant = "default",
                         .salt = "",
                         .block_size = 2,
                         .hashes = h,
                         .n = n};
    kvp_idx_rdlock(idx);
    if (kvp_idx_query(idx, &q, sink, &out) != KVP_OK)
        abort();
    kvp_idx_unlock(idx);
    kvp_idx_wrlock(idx);
    kvp_idx_resync(idx, sub.id, "gap");
    kvp_idx_unlock(idx);
    metrics_t m = {.n = 0};
    kvp_idx_metrics(idx, metrics_put, &m);
    if (strstr(m.s, "kvpool_indexer_blocks 0\n") == NULL ||
        strstr(m.s, "kvpool_indexer_block_holders 0\n") == NULL)
        abort(); /* a resync leaves no block of its publisher, and it is the only one */
    kvp_idx_destroy(idx);
    kvp_decoder_cleanup(&d);
}

static void body(const uint8_t *data, size_t size)
{
    kvp_json_t j;
    char why[128];
    if (kvp_json_parse(&j, (const char *)data, size, why, sizeof(why)) == KVP_JSON_OK) {
        char s[256];
        uint64_t v;
        for (uint32_t i = 0; i < j.n; i++) {
            (void)kvp_json_str(&j, i, s, sizeof(s));
            (void)kvp_json_u64(&j, i, &v);
            if (j.t[i].next <= i || j.t[i].next > j.n)
                abort(); /* every token's subtree ends after it, within the array */
        }
        (void)kvp_json_get(&j, 0, "token_ids");
    }
    kvp_json_free(&j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) {
        kvp_log_set_level(KVP_LOG_OFF);
        quiet = 1;
    }
    if (size == 0)
        return 0;
    if (data[0] % 2 == 0)
        batch(data + 1, size - 1);
    else
        body(data + 1, size - 1);
    return 0;
}
