/*
 * bench_alloc.c - `kvpool-bench alloc`: the segment offset allocator alone.
 *
 * DESIGN
 * The master places every extent with common/offset_alloc (align 64, as for
 * segments), so its utilisation and speed bound the pool's. No memory is
 * touched: the allocator only keeps node metadata, so a 64 GiB arena is
 * cheap.
 *
 * Uniform fills: for each base size 2^k (32 B .. 32 MiB) and each variant
 * (2^k, 2^k+17, 2^k-17, x0.9, x1.1) allocate one length until the allocator
 * says KVP_ERR_POOL_FULL. Utilisation is the sum of the *requested* lengths
 * over the arena size (the allocator's own used() counts bytes rounded up to
 * 64, which would hide the rounding waste). ns/alloc is the whole fill's time
 * over the number of allocations, node-array growth included. Small sizes
 * would need billions of allocations on 64 GiB, so each fill is capped at
 * KVP_BENCH_ALLOC_MAX_COUNT allocations by shrinking that workload's arena to
 * len * cap bytes; the arena used is reported with every row.
 *
 * Churn: log-uniform lengths 4 KiB .. 4 MiB on the full arena, kept ~90%
 * full (of requested bytes): each step frees a random live block when at or
 * above the target, else allocates. All random choices are drawn before the
 * clock starts. Reported: ns per alloc+free pair, utilisation at the end and
 * the number of allocations refused although the arena was below target
 * (fragmentation).
 *
 * Thread: the caller's thread only.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/tools/bench/bench.h"
#include "common/offset_alloc.h"
#include "common/macros.h"
#include "common/rand.h"

/* Allocator granularity the master uses for segments (KVP_SEGMENT_ALIGN). */
#define KVP_BENCH_ALLOC_ALIGN 64u
/* Cap on allocations per uniform fill; the arena shrinks to keep it. */
#define KVP_BENCH_ALLOC_MAX_COUNT (UINT64_C(4) << 20)
#define KVP_BENCH_ALLOC_MIN_LOG2 5u  /* 32 B */
#define KVP_BENCH_ALLOC_MAX_LOG2 25u /* 32 MiB */
/* Issue targets: utilisation >= 0.99 of requested bytes, <= 100 ns per alloc. */
#define KVP_BENCH_ALLOC_TARGET_UTIL 0.99
#define KVP_BENCH_ALLOC_TARGET_NS 100.0

/* Each figure is the median of this many identical runs (the host may be noisy). */
#define KVP_BENCH_ALLOC_RUNS 3

#define CHURN_MIN (UINT64_C(4) << 10)
#define CHURN_MAX (UINT64_C(4) << 20)
#define CHURN_FILL 0.90
#define CHURN_STEPS (UINT64_C(2) << 20)

typedef struct fill_res {
    uint64_t arena;
    uint64_t allocs;
    double utilisation;
    double ns_per_alloc; /* median over the runs */
    double ns_max;
} fill_res_t;

typedef struct live_blk {
    uint64_t len;
    uint32_t handle;
} live_blk_t;

static double rng_unit(uint64_t *s)
{
    return (double)(kvp_rng_next(s) >> 11) / 9007199254740992.0; /* [0, 1) */
}

static uint64_t churn_len(uint64_t *s)
{
    double lo = log((double)CHURN_MIN), hi = log((double)CHURN_MAX);
    uint64_t len = (uint64_t)llround(exp(lo + (hi - lo) * rng_unit(s)));
    return len < CHURN_MIN ? CHURN_MIN : len > CHURN_MAX ? CHURN_MAX : len;
}

static const char *flag(bool below)
{
    return below ? "  <- below target" : "";
}

/* Fill an arena with `len`-byte allocations until the allocator refuses. */
static int fill_once(uint64_t arena_max, uint64_t len, fill_res_t *r)
{
    uint64_t arena = arena_max;
    if (len <= arena_max / KVP_BENCH_ALLOC_MAX_COUNT)
        arena = len * KVP_BENCH_ALLOC_MAX_COUNT;
    kvp_offset_alloc_t *a;
    kvp_status_t st = kvp_offset_alloc_create(arena, KVP_BENCH_ALLOC_ALIGN, &a);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench alloc: cannot create a %" PRIu64 "-byte arena: %s\n", arena,
                kvp_strerror(st));
        return -1;
    }
    uint64_t n = 0, off;
    uint32_t h;
    double t0 = kvp_bench_now();
    while ((st = kvp_offset_alloc_alloc(a, len, &off, &h)) == KVP_OK)
        n++;
    double dt = kvp_bench_now() - t0;
    kvp_offset_alloc_destroy(a);
    if (st != KVP_ERR_POOL_FULL) {
        fprintf(stderr,
                "kvpool-bench alloc: alloc of %" PRIu64 " bytes failed after %" PRIu64
                " blocks: %s\n",
                len, n, kvp_strerror(st));
        return -1;
    }
    r->arena = arena;
    r->allocs = n;
    r->utilisation = (double)n * (double)len / (double)arena;
    r->ns_per_alloc = n ? dt * 1e9 / (double)n : 0.0;
    return 0;
}

/* The fill is deterministic: runs differ only in time; keep the median. */
static int fill_uniform(uint64_t arena_max, uint64_t len, fill_res_t *r)
{
    double ns[KVP_BENCH_ALLOC_RUNS];
    for (unsigned i = 0; i < KVP_BENCH_ALLOC_RUNS; i++) {
        if (fill_once(arena_max, len, r) != 0)
            return -1;
        ns[i] = r->ns_per_alloc;
    }
    r->ns_per_alloc = kvp_bench_percentile(ns, KVP_BENCH_ALLOC_RUNS, 50);
    r->ns_max = ns[KVP_BENCH_ALLOC_RUNS - 1];
    return 0;
}

static void report_uniform(kvp_bench_out_t *out, const char *workload, uint64_t len,
                           const fill_res_t *r)
{
    bool below =
        r->utilisation < KVP_BENCH_ALLOC_TARGET_UTIL || r->ns_per_alloc > KVP_BENCH_ALLOC_TARGET_NS;
    printf("%-8s %10" PRIu64 " %14" PRIu64 " %10" PRIu64 " %11.4f %8.1f%s\n", workload, len,
           r->arena, r->allocs, r->utilisation, r->ns_per_alloc, flag(below));
    kvp_bench_result_begin(out, "alloc");
    kvp_bench_result_str(out, "workload", workload);
    kvp_bench_result_int(out, "size", (int64_t)len);
    kvp_bench_result_num(out, "utilisation", r->utilisation);
    kvp_bench_result_num(out, "ns_per_alloc", r->ns_per_alloc);
    kvp_bench_result_num(out, "ns_per_alloc_max", r->ns_max);
    kvp_bench_result_int(out, "runs", KVP_BENCH_ALLOC_RUNS);
    kvp_bench_result_int(out, "allocs", (int64_t)r->allocs);
    kvp_bench_result_int(out, "arena", (int64_t)r->arena);
    kvp_bench_result_int(out, "align", KVP_BENCH_ALLOC_ALIGN);
    kvp_bench_result_int(out, "max_allocs", (int64_t)KVP_BENCH_ALLOC_MAX_COUNT);
    kvp_bench_result_end(out);
}

/* Pre-drawn choices and the live-block table shared by the churn runs. */
typedef struct churn_ctx {
    uint64_t arena;
    uint64_t target; /* requested bytes kept live */
    uint64_t *lens;  /* [CHURN_STEPS] */
    uint32_t *victim;
    live_blk_t *live;
    size_t live_cap;
} churn_ctx_t;

typedef struct churn_res {
    uint64_t allocs, frees, failed;
    size_t n_live;
    double fill_util, util, ns_pair;
} churn_res_t;

static void churn_free_one(kvp_offset_alloc_t *a, live_blk_t *live, size_t *n_live,
                           uint64_t *live_bytes, uint32_t pick)
{
    size_t v = pick % *n_live;
    kvp_offset_alloc_free(a, live[v].handle);
    *live_bytes -= live[v].len;
    live[v] = live[--*n_live];
}

/*
 * One churn run on a fresh allocator. Step i frees live block victim[i] %
 * n_live when live bytes are at or above the target, else allocates lens[i];
 * a refused allocation below the target counts as failed and frees instead.
 */
static int churn_once(const churn_ctx_t *c, churn_res_t *r)
{
    kvp_offset_alloc_t *a;
    kvp_status_t st = kvp_offset_alloc_create(c->arena, KVP_BENCH_ALLOC_ALIGN, &a);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench alloc: cannot create a %" PRIu64 "-byte arena: %s\n",
                c->arena, kvp_strerror(st));
        return -1;
    }
    /* Warm fill to the target (not timed), the same blocks in every run. */
    uint64_t seed = 0xD1B54A32D192ED03ull;
    live_blk_t *live = c->live;
    size_t n_live = 0;
    uint64_t live_bytes = 0, off;
    uint32_t h;
    while (live_bytes < c->target && n_live < c->live_cap) {
        uint64_t len = churn_len(&seed);
        if (kvp_offset_alloc_alloc(a, len, &off, &h) != KVP_OK)
            break;
        live[n_live++] = (live_blk_t){.len = len, .handle = h};
        live_bytes += len;
    }
    r->fill_util = (double)live_bytes / (double)c->arena;

    uint64_t allocs = 0, frees = 0, failed = 0;
    double t0 = kvp_bench_now();
    for (uint64_t i = 0; i < CHURN_STEPS; i++) {
        if ((live_bytes >= c->target || n_live == c->live_cap) && n_live > 0) {
            churn_free_one(a, live, &n_live, &live_bytes, c->victim[i]);
            frees++;
        } else if (kvp_offset_alloc_alloc(a, c->lens[i], &off, &h) == KVP_OK) {
            live[n_live++] = (live_blk_t){.len = c->lens[i], .handle = h};
            live_bytes += c->lens[i];
            allocs++;
        } else {
            failed++;
            if (n_live > 0) {
                churn_free_one(a, live, &n_live, &live_bytes, c->victim[i]);
                frees++;
            }
        }
    }
    double dt = kvp_bench_now() - t0;
    kvp_offset_alloc_destroy(a);
    double pairs = (double)(allocs + frees) / 2.0;
    r->allocs = allocs;
    r->frees = frees;
    r->failed = failed;
    r->n_live = n_live;
    r->util = (double)live_bytes / (double)c->arena;
    r->ns_pair = pairs > 0 ? dt * 1e9 / pairs : 0.0;
    return 0;
}

/* Churn on the full arena; all random choices are drawn before the clock starts. */
static int churn(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    churn_ctx_t c = {.arena = o->alloc_segment};
    c.target = (uint64_t)((double)c.arena * CHURN_FILL);
    /* ~arena / 600 KiB blocks are live on average; the cap only guards odd arenas */
    c.live_cap = (size_t)KVP_MIN(c.arena / CHURN_MIN + 1, UINT64_C(4) << 20);
    c.lens = malloc(CHURN_STEPS * sizeof(*c.lens));
    c.victim = malloc(CHURN_STEPS * sizeof(*c.victim));
    c.live = malloc(c.live_cap * sizeof(*c.live));
    int rc = -1;
    if (c.lens == NULL || c.victim == NULL || c.live == NULL) {
        fprintf(stderr, "kvpool-bench alloc: out of memory for the churn workload\n");
        goto out;
    }
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (uint64_t i = 0; i < CHURN_STEPS; i++) {
        c.lens[i] = churn_len(&seed);
        c.victim[i] = (uint32_t)kvp_rng_next(&seed);
    }
    churn_res_t r;
    double ns[KVP_BENCH_ALLOC_RUNS];
    for (unsigned i = 0; i < KVP_BENCH_ALLOC_RUNS; i++) {
        if (churn_once(&c, &r) != 0)
            goto out;
        ns[i] = r.ns_pair;
    }
    double ns_pair = kvp_bench_percentile(ns, KVP_BENCH_ALLOC_RUNS, 50);
    double ns_max = ns[KVP_BENCH_ALLOC_RUNS - 1];
    bool below = ns_pair > 2 * KVP_BENCH_ALLOC_TARGET_NS || r.failed > 0;
    printf("%-8s %10s %14" PRIu64 " %10" PRIu64 " %11.4f %8.1f%s\n", "churn", "4K-4M", c.arena,
           r.allocs, r.util, ns_pair, flag(below));
    printf("  churn: %" PRIu64 " steps at ~%.0f%% full: %" PRIu64 " allocs + %" PRIu64
           " frees, %" PRIu64 " allocs refused below the target, %zu blocks live, warm fill"
           " reached %.4f; ns column is per alloc+free pair\n",
           CHURN_STEPS, CHURN_FILL * 100, r.allocs, r.frees, r.failed, r.n_live, r.fill_util);
    kvp_bench_result_begin(out, "alloc");
    kvp_bench_result_str(out, "workload", "churn");
    kvp_bench_result_int(out, "size", 0);
    kvp_bench_result_int(out, "size_min", (int64_t)CHURN_MIN);
    kvp_bench_result_int(out, "size_max", (int64_t)CHURN_MAX);
    kvp_bench_result_str(out, "size_dist", "log-uniform");
    kvp_bench_result_num(out, "target_fill", CHURN_FILL);
    kvp_bench_result_num(out, "utilisation", r.util);
    kvp_bench_result_num(out, "ns_per_alloc", ns_pair);
    kvp_bench_result_num(out, "ns_per_pair", ns_pair);
    kvp_bench_result_num(out, "ns_per_pair_max", ns_max);
    kvp_bench_result_str(out, "timing", "per alloc+free pair");
    kvp_bench_result_int(out, "runs", KVP_BENCH_ALLOC_RUNS);
    kvp_bench_result_int(out, "steps", (int64_t)CHURN_STEPS);
    kvp_bench_result_int(out, "allocs", (int64_t)r.allocs);
    kvp_bench_result_int(out, "frees", (int64_t)r.frees);
    kvp_bench_result_int(out, "failed_allocs", (int64_t)r.failed);
    kvp_bench_result_int(out, "live_blocks", (int64_t)r.n_live);
    kvp_bench_result_int(out, "arena", (int64_t)c.arena);
    kvp_bench_result_int(out, "align", KVP_BENCH_ALLOC_ALIGN);
    kvp_bench_result_end(out);
    rc = 0;
out:
    free(c.live);
    free(c.victim);
    free(c.lens);
    return rc;
}

int kvp_bench_alloc(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    static const char *const names[] = {"pow2", "pow2+17", "pow2-17", "x0.9", "x1.1"};
    if (o->alloc_segment < KVP_BENCH_ALLOC_ALIGN) {
        fprintf(stderr, "kvpool-bench alloc: the arena must be at least %u bytes\n",
                KVP_BENCH_ALLOC_ALIGN);
        return 1;
    }
    printf("offset allocator, align %u, arena %" PRIu64 " bytes (fills capped at %" PRIu64
           " allocs by a smaller arena); utilisation = requested bytes / arena\n",
           KVP_BENCH_ALLOC_ALIGN, o->alloc_segment, KVP_BENCH_ALLOC_MAX_COUNT);
    printf("%-8s %10s %14s %10s %11s %8s\n", "workload", "size", "arena", "allocs", "utilisation",
           "ns/alloc");
    for (unsigned k = KVP_BENCH_ALLOC_MIN_LOG2; k <= KVP_BENCH_ALLOC_MAX_LOG2; k++) {
        uint64_t base = UINT64_C(1) << k;
        for (size_t w = 0; w < KVP_ARRAY_SIZE(names); w++) {
            int64_t len;
            switch (w) {
            case 0:
                len = (int64_t)base;
                break;
            case 1:
                len = (int64_t)base + 17;
                break;
            case 2:
                len = (int64_t)base - 17;
                break;
            case 3:
                len = llround((double)base * 0.9);
                break;
            default:
                len = llround((double)base * 1.1);
                break;
            }
            if (len <= 0 || (uint64_t)len > o->alloc_segment)
                continue;
            kvp_bench_progress(o, "alloc: %s size %" PRId64, names[w], len);
            fill_res_t r;
            if (fill_uniform(o->alloc_segment, (uint64_t)len, &r) != 0) {
                kvp_bench_progress_done(o);
                return 1;
            }
            kvp_bench_progress_done(o);
            report_uniform(out, names[w], (uint64_t)len, &r);
        }
    }
    kvp_bench_progress(o, "alloc: churn (%" PRIu64 " steps)", CHURN_STEPS);
    int rc = churn(o, out);
    kvp_bench_progress_done(o);
    fflush(stdout);
    return rc == 0 ? 0 : 1;
}
