/*
 * index.h - kvpool-indexer's prefix index: registrations, their publishers, and which
 * blocks each holds on which medium (see index.c for the design; docs/indexer.md for the
 * semantics it implements).
 *
 * Thread: one lock (kvp_idx_rdlock / kvp_idx_wrlock) guards everything here. The
 * subscriber thread applies batches under the write lock; HTTP threads query under the
 * read lock and (un)register under the write lock (the blocks of those unregistered are
 * purged by the subscriber thread: kvp_idx_reap). Functions say which they need.
 */
#ifndef KVP_INDEXER_INDEX_H
#define KVP_INDEXER_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define KVP_IDX_MEDIA_MAX 8 /* GPU, CPU, DISK and five more names */
#define KVP_IDX_MEDIUM_GPU 0
#define KVP_IDX_MEDIUM_CPU 1
#define KVP_IDX_MEDIUM_DISK 2
#define KVP_IDX_PUBS_MAX 16  /* publishers of one registration */
#define KVP_IDX_NAME_MAX 256 /* instance, tenant, model, LoRA, salt: bytes + NUL */
#define KVP_IDX_ENDPOINT_MAX 256
#define KVP_IDX_REGS_MAX 65536 /* registrations */
#define KVP_IDX_SUBS_MAX 4096  /* subscriptions (a tenant's publisher endpoints), all tenants */
#define KVP_IDX_BLOCK_SIZE_MAX 65536
#define KVP_IDX_RANK_MAX 65535
#define KVP_IDX_CURVE_KEY_LEN 40 /* a CURVE key in Z85 */

typedef struct kvp_idx kvp_idx_t;

typedef struct kvp_idx_params {
    uint64_t seed;       /* the standard hash's seed S */
    uint64_t max_blocks; /* blocks indexed at most (least recently stored go); 0: 2^31 */
    uint32_t ttl_ms;     /* a publisher silent this long is reported stale; 0: never */
    /* blocks one tenant's registrations keep at most (past it its own least recently
     * stored go); 0: a fair share, max_blocks over the tenants holding blocks */
    uint64_t max_blocks_per_tenant;
} kvp_idx_params_t;

kvp_status_t kvp_idx_create(const kvp_idx_params_t *p, kvp_idx_t **idx_p);
void kvp_idx_destroy(kvp_idx_t *idx);

void kvp_idx_rdlock(kvp_idx_t *idx);
void kvp_idx_wrlock(kvp_idx_t *idx);
void kvp_idx_unlock(kvp_idx_t *idx);

/* ---- the standard hashes (no lock) ---- */

/* seq[0..n) of n complete blocks of bs tokens (tokens[0..n*bs)), continuing from
 * *parent when has_parent. */
void kvp_idx_hash_tokens(uint64_t seed, const uint32_t *tokens, size_t n, uint32_t bs,
                         bool has_parent, uint64_t parent, uint64_t *seq);

/* ---- registrations (write lock) ---- */

typedef struct kvp_idx_reg_params {
    const char *endpoint, *replay_endpoint, *type;
    const char *curve_server_key; /* the publisher's CURVE public key (Z85); "": none */
    const char *model, *lora, *tenant, *instance, *salt;
    uint32_t block_size, dp_rank;
    /* out, optional: a refusal's reason, as counted in /metrics ("tenant_registrations",
     * "tenant_subscriptions", "registrations", "subscriptions", "publishers", "scopes",
     * "field") */
    const char **reason_p;
} kvp_idx_reg_params_t;

/* Register (docs/indexer.md, "POST /register"). KVP_ERR_TOO_MANY past the limits
 * (registrations, publishers of one, the tenant's caps); *changed_p: subscriptions changed (the
 * subscriber thread must look again). err: why, for a refusal. */
kvp_status_t kvp_idx_register(kvp_idx_t *idx, const kvp_idx_reg_params_t *p, bool *changed_p,
                              char *err, size_t err_len);

/* Per-tenant caps on registrations and on subscriptions (publisher endpoints the tenant's
 * registrations name); 0: none but the global limits. Write lock (or before any thread). */
void kvp_idx_set_tenant_caps(kvp_idx_t *idx, uint32_t regs, uint32_t subs);

/* Unregister (instance, tenant, rank; all_ranks: every rank): the names of those removed,
 * "instance|tenant|rank", each written by cb. KVP_ERR_NOT_FOUND when none matched. What it
 * costs does not grow with what they hold: they are gone from every answer and batch when it
 * returns, their blocks purged later by kvp_idx_reap (as are those of a registration that
 * kvp_idx_register replaces or kvp_idx_drop_publisher undoes). */
kvp_status_t kvp_idx_unregister(kvp_idx_t *idx, const char *instance, const char *tenant,
                                bool all_ranks, uint32_t rank,
                                void (*cb)(void *arg, const char *name), void *arg);

/* Purge the blocks of the registrations unregistered since (the subscriber thread, when woken
 * after an unregister). Called with the write lock held, returns with it held: the lock is let
 * go between slices, as kvp_idx_apply does, so that a registration holding millions of blocks
 * holds queries for a slice at a time. Nothing to purge: O(1). */
void kvp_idx_reap(kvp_idx_t *idx);

/* Every registration's publishers as Conductor config entries: the text of
 * {"kvevent_instance": {NAME: {/register object}, ...}} through put (read lock). */
void kvp_idx_registrations_json(kvp_idx_t *idx, void (*put)(void *arg, const char *s, size_t len),
                                void *arg);

/* ---- subscriptions (the subscriber thread's view) ---- */

/* A subscription: one publisher endpoint of one tenant, shared by every registration of that
 * tenant naming it (another tenant naming it has a subscription of its own). */
typedef struct kvp_idx_sub_info {
    uint32_t id;  /* stable while the subscription lives */
    uint64_t gen; /* changes when its endpoint is re-made (replay endpoint changed) */
    char tenant[KVP_IDX_NAME_MAX]; /* the tenant it belongs to */
    char endpoint[KVP_IDX_ENDPOINT_MAX];
    char replay[KVP_IDX_ENDPOINT_MAX];
    char curve[KVP_IDX_CURVE_KEY_LEN + 1]; /* its CURVE public key; "": none */
    bool topic_replay; /* a kvpool master publishes on it: replays name their topic */
} kvp_idx_sub_info_t;

/* The live subscriptions into out[0..max) (read lock); how many there are. */
size_t kvp_idx_subs(kvp_idx_t *idx, kvp_idx_sub_info_t *out, size_t max);

/* The subscriber thread made subscription sub's socket (generation gen), or could not
 * (write lock). */
void kvp_idx_sub_open(kvp_idx_t *idx, uint32_t sub, uint64_t gen, bool ok);
/* Could the subscriber thread not make the socket of tenant's subscription to endpoint, when
 * it last tried (read lock)? */
bool kvp_idx_sub_failed(kvp_idx_t *idx, const char *tenant, const char *endpoint);
/* Take endpoint, the last publisher of registration (instance, tenant, rank), away from it
 * (the registration goes when it was its only one): a registration that cannot be served,
 * undone (write lock). KVP_ERR_NOT_FOUND: no such registration, or endpoint not its last. */
kvp_status_t kvp_idx_drop_publisher(kvp_idx_t *idx, const char *instance, const char *tenant,
                                    uint32_t rank, const char *endpoint);

/* ---- events (write lock) ---- */

/* One decoded event (decode.c fills them; the hash and token arrays are read through the
 * callbacks of kvp_idx_batch_t). */
typedef enum kvp_idx_op_kind { KVP_IDX_STORED, KVP_IDX_REMOVED, KVP_IDX_CLEARED } kvp_idx_op_kind_t;

typedef struct kvp_idx_op {
    kvp_idx_op_kind_t kind;
    bool all_media; /* vLLM's AllBlocksCleared: every medium */
    bool envelope;  /* the standardized envelope (else vLLM's event) */
    bool has_parent, has_base, has_tokens, has_rank;
    const char *medium; /* NULL: GPU */
    size_t medium_len;
    const char *tenant; /* an envelope's tenant_id; NULL: none */
    size_t tenant_len;
    uint32_t rank; /* an envelope's dp_rank (has_rank) */
    uint64_t parent, base;
    size_t n_hashes, n_tokens;
    size_t hashes_at, tokens_at; /* where decode.c reads them again */
} kvp_idx_op_t;

typedef struct kvp_idx_batch {
    const kvp_idx_op_t *ops;
    size_t n_ops;
    bool has_rank; /* the batch's data_parallel_rank */
    uint32_t rank;
    /* reads op's hashes / tokens into out[0..op->n_*) */
    void (*hashes)(void *arg, const kvp_idx_op_t *op, uint64_t *out);
    void (*tokens)(void *arg, const kvp_idx_op_t *op, uint32_t *out);
    void *arg;
} kvp_idx_batch_t;

/* Apply one batch of subscription sub to the registrations it publishes for. Called with
 * the write lock held, and returns with it held; a large batch is applied in slices, the
 * lock released between them (readers get in): a reader may see a prefix of the batch
 * applied, never its events out of order. kvp_idx_resync likewise. */
void kvp_idx_apply(kvp_idx_t *idx, uint32_t sub, const kvp_idx_batch_t *b);

/* Drop every block subscription sub's publisher holds (a resync), with its reason
 * ("gap", "restart", "malformed"). */
void kvp_idx_resync(kvp_idx_t *idx, uint32_t sub, const char *reason);

/* The subscription's sequence state, kept here so /instances shows it. */
void kvp_idx_sub_seen(kvp_idx_t *idx, uint32_t sub, uint64_t seq, bool connected);
/* Counters the subscriber thread keeps (any lock). */
void kvp_idx_count_batch(kvp_idx_t *idx, bool replayed);

/* ---- queries (read lock) ---- */

typedef struct kvp_idx_query {
    const char *model, *lora, *tenant, *salt, *instance; /* instance NULL: all */
    uint32_t block_size;
    const uint64_t *hashes; /* the prompt's seq hashes */
    size_t n;
} kvp_idx_query_t;

/* A query being answered, from before its body is parsed to its answer (any thread, no
 * lock): the thread applying batches waits for it where it lets the write lock go, and
 * before it decodes a batch (kvp_idx_yield, no lock held; a bounded share of its time). */
void kvp_idx_query_begin(kvp_idx_t *idx);
void kvp_idx_query_end(kvp_idx_t *idx);
void kvp_idx_yield(kvp_idx_t *idx);

/* Answer q as JSON (docs/indexer.md "POST /query") through put(arg, text, len). */
kvp_status_t kvp_idx_query(kvp_idx_t *idx, const kvp_idx_query_t *q,
                           void (*put)(void *arg, const char *s, size_t len), void *arg);

/* GET /instances (of one tenant; NULL: all) and GET /metrics bodies (read lock taken
 * inside). */
void kvp_idx_instances_json(kvp_idx_t *idx, const char *tenant,
                            void (*put)(void *arg, const char *s, size_t len), void *arg);
void kvp_idx_metrics(kvp_idx_t *idx, void (*put)(void *arg, const char *s, size_t len), void *arg);
/* The per-tenant series of /metrics (they name tenants: for an admin's scrape, or all without
 * an ACL): each tenant's blocks and evictions (docs/indexer.md, "Budgets per tenant"). Read
 * lock taken inside. */
void kvp_idx_metrics_tenants(kvp_idx_t *idx, void (*put)(void *arg, const char *s, size_t len),
                             void *arg);

/* A query counted (kind "tokens" or "hashes"); a refused HTTP request (reason). */
void kvp_idx_count_query(kvp_idx_t *idx, bool by_hash);
void kvp_idx_count_refused(kvp_idx_t *idx, const char *reason);
/* A batch the decoder refused (the reason counted with resyncs). */

#endif
