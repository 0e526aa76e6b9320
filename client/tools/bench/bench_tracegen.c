/*
 * bench_tracegen.c - kvpool-bench tracegen: write a seeded synthetic KV-cache
 * trace of one workload class, in the FAST'25 Mooncake JSONL shape the trace
 * mode (and the eviction unit test) replays:
 *   {"timestamp": MS, "input_length": TOKENS, "output_length": TOKENS, "hash_ids": [...]}
 *
 * DESIGN
 * One hash id is one 512-token block (the Mooncake traces' block). A prompt
 * is a shared prefix (a system or tool prompt, the previous turn of the same
 * session, a document) followed by new tokens. A block's id stands for the
 * whole prefix up to its end, so a prompt of L tokens built on a prefix of
 * Lp tokens reuses the prefix's first floor(Lp / 512) ids and takes fresh
 * ones (the next integers) for its other ceil(L / 512) - floor(Lp / 512)
 * blocks: the partial last block of a prefix is never shared, as in the
 * real traces. Ids are handed out in order from 0.
 *
 * Requests come from "sessions" (a conversation, an agent loop, a single
 * request); session starts are a Poisson process of rate rate / (mean
 * requests per session); the next request of a session comes after the
 * previous one's decode time (TRACEGEN_DECODE_MS per output token) plus a
 * think time. Every request of every session is laid out first, sorted by
 * time, and the first --requests written (a session cut by the end simply
 * stops). Lengths are lognormal (median, sigma), popularity Zipf(s) over a
 * fixed set (inverse CDF by binary search), session lengths a discrete
 * Pareto (heavy tail: a few sessions are much longer). One splitmix64
 * stream seeded by --seed drives everything, so a (class, seed, requests)
 * triple always gives the same file.
 *
 * The classes and where their figures come from (docs/benchmarks.md,
 * "Workload classes", has the table):
 *   conversation  multi-turn chat: each turn's prompt is the previous turn's
 *                 prompt + its answer + a new user message; 32 app system
 *                 prompts (Zipf 1.0); turns per session Pareto(1.3), at most
 *                 64; think time lognormal, median 60 s. Mooncake FAST'25
 *                 conversation trace: 12 031 requests in an hour (3.3/s),
 *                 mean input about 12 k tokens, mean output about 340; the
 *                 ATC'25 study (Wang et al., "KVCache Cache in the Wild"):
 *                 multi-turn reuse dominates to-C chat, the reuse gap is
 *                 minutes, a few sessions have very many turns.
 *   toolagent     agent loops: a long tool prompt shared by every loop of
 *                 that agent (16 agents, Zipf 1.1, median 5 000 tokens), many
 *                 short steps (a tool result + a short answer), think time =
 *                 tool latency, median 3 s. Mooncake FAST'25 tool&agent
 *                 trace: mean input about 8.6 k tokens, short outputs (about
 *                 180 tokens), about 6.5 requests/s; ATC'25: agent workloads
 *                 reuse a long shared prefix within seconds.
 *   sysprompt     API (to-B) single-turn requests: 8 very popular system
 *                 prompts (Zipf 1.2, median 3 000 tokens) and a unique tail.
 *                 ATC'25: single-turn to-B reuse is mostly the shared system
 *                 prompt, heavily skewed towards a few of them.
 *   rag           document QA: one short shared instruction, a long document
 *                 (median 12 000 tokens), a unique question; 15 % of the
 *                 requests ask again about one of 2 000 earlier documents
 *                 (Zipf 0.8), the rest bring a new one. ATC'25: long-context
 *                 RAG/document prompts show the least reuse; Mooncake's
 *                 traces put long prompts at 10 k+ tokens.
 * The figures are drawn from the published statistics as approximations
 * (the papers give means and shapes, not these exact distributions).
 *
 * Single-threaded; the whole trace is held in memory (ids of every request)
 * while it is sorted, then written.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/tools/bench/bench.h"

#define TRACEGEN_BLOCK 512u         /* tokens per hash id */
#define TRACEGEN_DECODE_MS 0.03     /* decode time per output token (ms), 30 ms/token */
#define TRACEGEN_MAX_TOKENS 131072u /* a prompt is cut at this length (128 k context) */

/* ---------------- randomness ---------------- */

typedef struct rng {
    uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1). */
static double rng_unit(rng_t *r)
{
    return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_normal(rng_t *r)
{
    return sqrt(-2.0 * log(rng_unit(r))) * cos(6.283185307179586 * rng_unit(r));
}

static double rng_lognormal(rng_t *r, double median, double sigma)
{
    return median * exp(sigma * rng_normal(r));
}

static double rng_exp(rng_t *r, double mean)
{
    return -mean * log(rng_unit(r));
}

/* Discrete Pareto: floor(U^(-1/alpha)) (P(X >= k) = k^-alpha), at most max (>= 1). */
static unsigned rng_pareto(rng_t *r, double alpha, unsigned max)
{
    double x = floor(pow(rng_unit(r), -1.0 / alpha));
    return x >= (double)max ? max : x < 1 ? 1 : (unsigned)x;
}

/* Zipf(s) over n items: the CDF, drawn by binary search. */
typedef struct zipf {
    double *cdf;
    unsigned n;
} zipf_t;

static int zipf_init(zipf_t *z, unsigned n, double s)
{
    z->n = n;
    z->cdf = malloc(n * sizeof(*z->cdf));
    if (z->cdf == NULL)
        return -1;
    double sum = 0;
    for (unsigned i = 0; i < n; i++)
        z->cdf[i] = (sum += pow(i + 1.0, -s));
    for (unsigned i = 0; i < n; i++)
        z->cdf[i] /= sum;
    return 0;
}

static unsigned zipf_draw(const zipf_t *z, rng_t *r)
{
    double u = rng_unit(r);
    unsigned lo = 0, hi = z->n - 1;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (z->cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ---------------- prompts ---------------- */

/* A prompt: its token count and the ids of its blocks (the last one may be partial). */
typedef struct prompt {
    uint64_t *ids;
    uint32_t n_ids, tokens;
} prompt_t;

/* A (lognormal) token count, at least 1. */
static uint32_t tokens(rng_t *r, double median, double sigma)
{
    double t = rng_lognormal(r, median, sigma);
    return t < 1 ? 1 : t > TRACEGEN_MAX_TOKENS ? TRACEGEN_MAX_TOKENS : (uint32_t)t;
}

/* *out = `base` (NULL: empty) + `extra` new tokens: base's full blocks, then fresh ids. */
static int prompt_extend(const prompt_t *base, uint32_t extra, uint64_t *next_id, prompt_t *out)
{
    uint32_t base_tokens = base ? base->tokens : 0;
    uint32_t total = base_tokens + extra;
    if (total > TRACEGEN_MAX_TOKENS)
        total = TRACEGEN_MAX_TOKENS;
    if (total < base_tokens)
        total = base_tokens;
    uint32_t keep = base_tokens / TRACEGEN_BLOCK;
    uint32_t n = (total + TRACEGEN_BLOCK - 1) / TRACEGEN_BLOCK;
    uint64_t *ids = malloc((n ? n : 1) * sizeof(*ids));
    if (ids == NULL)
        return -1;
    if (keep > 0)
        memcpy(ids, base->ids, keep * sizeof(*ids));
    for (uint32_t i = keep; i < n; i++)
        ids[i] = (*next_id)++;
    out->ids = ids;
    out->n_ids = n;
    out->tokens = total;
    return 0;
}

/* ---------------- classes ---------------- */

/* One class's parameters (the table in the top comment and in docs/benchmarks.md). */
typedef struct gen_class {
    const char *name;
    double rate;          /* requests per second (all sessions) */
    unsigned n_shared;    /* shared prefixes (system / tool prompts, documents) */
    double shared_zipf;   /* their popularity */
    double shared_median; /* tokens */
    double shared_sigma;
    double first_median; /* the session's first new tokens (user message, task, document) */
    double first_sigma;
    double step_median; /* each later request's new tokens (user message, tool result) */
    double step_sigma;
    double out_median; /* output tokens */
    double out_sigma;
    double turns_alpha; /* requests per session: discrete Pareto(alpha), at most turns_max */
    unsigned turns_max;
    double think_median_s; /* between a session's answer and its next request */
    double think_sigma;
    double fresh_prefix; /* rag: share of requests that bring a new document */
} gen_class_t;

static const gen_class_t classes[] = {
    {"conversation", 3.3, 32, 1.0, 1500, 0.6, 4000, 1.0, 1500, 1.0, 250, 0.8, 1.6, 64, 60, 1.0, 0},
    {"toolagent", 6.5, 16, 1.1, 5000, 0.4, 800, 0.8, 400, 1.0, 120, 0.7, 1.1, 32, 3, 1.0, 0},
    {"sysprompt", 10, 200, 1.2, 3000, 0.5, 1000, 1.0, 0, 0, 150, 0.8, 1e9, 1, 0, 0, 0},
    {"rag", 2, 2000, 0.8, 12000, 0.6, 100, 0.8, 0, 0, 200, 0.8, 1e9, 1, 0, 0, 0.85},
};

static const gen_class_t *class_find(const char *name)
{
    for (size_t i = 0; i < sizeof(classes) / sizeof(classes[0]); i++)
        if (strcmp(classes[i].name, name) == 0)
            return &classes[i];
    return NULL;
}

const char *kvp_bench_tracegen_classes(void)
{
    return "conversation, toolagent, sysprompt, rag";
}

/* One request laid out: when, which session, which of its turns. */
typedef struct slot {
    double t_ms;
    uint32_t session, turn;
} slot_t;

static int slot_cmp(const void *a, const void *b)
{
    const slot_t *x = a, *y = b;
    if (x->t_ms != y->t_ms)
        return x->t_ms < y->t_ms ? -1 : 1;
    if (x->session != y->session)
        return x->session < y->session ? -1 : 1;
    return x->turn < y->turn ? -1 : x->turn > y->turn;
}

/* A session's state while the trace is written. */
typedef struct session {
    prompt_t last; /* its previous request's prompt (ids freed after its last turn) */
    uint32_t last_out, shared;
    uint32_t *outs; /* output tokens per turn, drawn while laying out (decode time) */
} session_t;

typedef struct gen {
    const gen_class_t *c;
    rng_t rng;
    zipf_t zipf;
    prompt_t *shared; /* the shared prefixes, made on first use (tokens 0: not yet) */
    prompt_t instr;   /* rag: the one instruction every document follows */
    uint64_t next_id;
    session_t *sess;
    uint32_t n_sess;
    slot_t *slots;
    size_t n_slots;
} gen_t;

static void gen_free(gen_t *g)
{
    for (uint32_t i = 0; g->shared != NULL && i < g->c->n_shared; i++)
        free(g->shared[i].ids);
    for (uint32_t i = 0; g->sess != NULL && i < g->n_sess; i++) {
        free(g->sess[i].last.ids);
        free(g->sess[i].outs);
    }
    free(g->shared);
    free(g->instr.ids);
    free(g->sess);
    free(g->slots);
    free(g->zipf.cdf);
}

/* Lay out sessions until there are at least `n` requests. */
static int gen_layout(gen_t *g, size_t n)
{
    const gen_class_t *c = g->c;
    /* mean requests per session (numerically: the Pareto is capped) */
    double mean_turns = 0;
    for (unsigned k = 1; k <= c->turns_max; k++)
        mean_turns += pow((double)k, -c->turns_alpha); /* P(X >= k) */
    double session_gap_ms = 1000.0 * mean_turns / c->rate;
    size_t cap_slots = 0, cap_sess = 0;
    /* Sessions start until the first n requests in time order are all laid out: every
     * session started before the n-th request's time is there (a horizon grown until so). */
    double t = 0, horizon = 1000.0 * (double)n / c->rate;
    for (;;) {
        if (t > horizon) {
            qsort(g->slots, g->n_slots, sizeof(*g->slots), slot_cmp);
            if (g->n_slots >= n && g->slots[n - 1].t_ms <= t)
                return 0;
            horizon *= 1.25;
        }
        t += rng_exp(&g->rng, session_gap_ms);
        unsigned turns = c->turns_max > 1 ? rng_pareto(&g->rng, c->turns_alpha, c->turns_max) : 1;
        if (g->n_sess == cap_sess) {
            cap_sess = cap_sess ? 2 * cap_sess : 1024;
            session_t *s = realloc(g->sess, cap_sess * sizeof(*s));
            if (s == NULL)
                return -1;
            g->sess = s;
        }
        session_t *s = &g->sess[g->n_sess];
        memset(s, 0, sizeof(*s));
        s->outs = malloc(turns * sizeof(*s->outs));
        if (s->outs == NULL)
            return -1;
        double at = t;
        for (unsigned k = 0; k < turns; k++) {
            if (g->n_slots == cap_slots) {
                cap_slots = cap_slots ? 2 * cap_slots : 4096;
                slot_t *sl = realloc(g->slots, cap_slots * sizeof(*sl));
                if (sl == NULL) {
                    free(s->outs);
                    return -1;
                }
                g->slots = sl;
            }
            s->outs[k] = tokens(&g->rng, c->out_median, c->out_sigma);
            g->slots[g->n_slots++] = (slot_t){at, g->n_sess, k};
            at += s->outs[k] * TRACEGEN_DECODE_MS +
                  1000.0 * rng_lognormal(&g->rng, c->think_median_s > 0 ? c->think_median_s : 1,
                                         c->think_sigma);
        }
        g->n_sess++;
    }
}

/* rag: the instruction before every document, two blocks (made on first use). */
static const prompt_t *instruction(gen_t *g)
{
    if (g->instr.tokens == 0 && prompt_extend(NULL, 2 * TRACEGEN_BLOCK, &g->next_id, &g->instr))
        return NULL;
    return &g->instr;
}

/* The shared prefix i (made on first use; rag: the instruction + document i). */
static const prompt_t *shared_prefix(gen_t *g, unsigned i)
{
    prompt_t *p = &g->shared[i];
    const prompt_t *base = NULL;
    if (p->tokens == 0 && g->c->fresh_prefix > 0 && (base = instruction(g)) == NULL)
        return NULL;
    if (p->tokens == 0 &&
        prompt_extend(base, tokens(&g->rng, g->c->shared_median, g->c->shared_sigma), &g->next_id,
                      p) != 0)
        return NULL;
    return p;
}

/* The prompt of request `sl` (in time order: a session's turns come in order). */
static int gen_prompt(gen_t *g, const slot_t *sl, prompt_t *out)
{
    const gen_class_t *c = g->c;
    session_t *s = &g->sess[sl->session];
    if (sl->turn > 0) /* the previous prompt, its answer, the new message */
        return prompt_extend(&s->last, s->last_out + tokens(&g->rng, c->step_median, c->step_sigma),
                             &g->next_id, out);
    const prompt_t *base;
    prompt_t fresh = {0};
    if (c->fresh_prefix > 0 && rng_unit(&g->rng) < c->fresh_prefix) {
        /* a new document after the one shared instruction */
        const prompt_t *instr = instruction(g);
        if (instr == NULL ||
            prompt_extend(instr, tokens(&g->rng, c->shared_median, c->shared_sigma), &g->next_id,
                          &fresh) != 0)
            return -1;
        base = &fresh;
    } else {
        base = shared_prefix(g, zipf_draw(&g->zipf, &g->rng));
        if (base == NULL)
            return -1;
    }
    int rc =
        prompt_extend(base, tokens(&g->rng, c->first_median, c->first_sigma), &g->next_id, out);
    free(fresh.ids);
    return rc;
}

static int gen_write(gen_t *g, FILE *f, size_t n, uint64_t *blocks_p)
{
    uint64_t blocks = 0;
    for (size_t i = 0; i < n && i < g->n_slots; i++) {
        const slot_t *sl = &g->slots[i];
        session_t *s = &g->sess[sl->session];
        prompt_t p;
        if (gen_prompt(g, sl, &p) != 0)
            return -1;
        fprintf(f,
                "{\"timestamp\": %" PRIu64 ", \"input_length\": %u, \"output_length\": %u, "
                "\"hash_ids\": [",
                (uint64_t)sl->t_ms, p.tokens, s->outs[sl->turn]);
        for (uint32_t j = 0; j < p.n_ids; j++)
            fprintf(f, j ? ", %" PRIu64 : "%" PRIu64, p.ids[j]);
        fputs("]}\n", f);
        blocks += p.n_ids;
        free(s->last.ids);
        s->last = p;
        s->last_out = s->outs[sl->turn];
    }
    *blocks_p = blocks;
    return ferror(f) ? -1 : 0;
}

/* Lay the trace out and write its first n requests to f. 0, or -1 (said on stderr). */
static int gen_run(gen_t *g, uint64_t n, FILE *f, uint64_t *blocks_p)
{
    g->shared = calloc(g->c->n_shared, sizeof(*g->shared));
    if (g->shared == NULL || zipf_init(&g->zipf, g->c->n_shared, g->c->shared_zipf) != 0 ||
        gen_layout(g, n) != 0) {
        fprintf(stderr, "kvpool-bench tracegen: out of memory\n");
        return -1;
    }
    if (gen_write(g, f, n, blocks_p) != 0) {
        fprintf(stderr, "kvpool-bench tracegen: writing the trace failed\n");
        return -1;
    }
    return 0;
}

int kvp_bench_tracegen_write(const char *class_name, uint64_t seed, uint64_t n, FILE *f)
{
    const gen_class_t *c = class_find(class_name != NULL ? class_name : "");
    if (c == NULL) {
        fprintf(stderr, "kvpool-bench: --class is one of %s\n", kvp_bench_tracegen_classes());
        return -1;
    }
    gen_t g = {.c = c, .rng = {seed}};
    uint64_t blocks = 0;
    int rc = gen_run(&g, n, f, &blocks);
    gen_free(&g);
    return rc;
}

int kvp_bench_tracegen(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    const gen_class_t *c = class_find(o->gen_class ? o->gen_class : "");
    if (c == NULL) {
        fprintf(stderr, "kvpool-bench tracegen: --class is one of %s\n",
                kvp_bench_tracegen_classes());
        return 1;
    }
    if (o->gen_out == NULL) {
        fprintf(stderr, "kvpool-bench tracegen: --out FILE is needed\n");
        return 1;
    }
    gen_t g = {.c = c, .rng = {o->gen_seed}};
    int rc = 1;
    FILE *f = fopen(o->gen_out, "we");
    if (f == NULL) {
        fprintf(stderr, "kvpool-bench tracegen: cannot write %s: %s\n", o->gen_out,
                strerror(errno));
        goto out;
    }
    uint64_t blocks = 0;
    if (gen_run(&g, o->gen_requests, f, &blocks) != 0)
        goto out;
    rc = 0;
    printf("tracegen %s seed %" PRIu64 ": %" PRIu64 " requests, %" PRIu64 " blocks, %" PRIu64
           " ids, in %s\n",
           c->name, o->gen_seed, (uint64_t)o->gen_requests, blocks, g.next_id, o->gen_out);
    kvp_bench_result_begin(out, "tracegen");
    kvp_bench_result_str(out, "class", c->name);
    kvp_bench_result_int(out, "seed", (int64_t)o->gen_seed);
    kvp_bench_result_int(out, "requests", (int64_t)o->gen_requests);
    kvp_bench_result_int(out, "blocks", (int64_t)blocks);
    kvp_bench_result_int(out, "unique_blocks", (int64_t)g.next_id);
    kvp_bench_result_end(out);
out:
    if (f != NULL && fclose(f) != 0 && rc == 0) {
        fprintf(stderr, "kvpool-bench tracegen: closing %s failed\n", o->gen_out);
        rc = 1;
    }
    gen_free(&g);
    return rc;
}
