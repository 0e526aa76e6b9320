/*
 * bench_data.c - batch_put_from / batch_get_into / batch_is_exist against
 * the store, per transport x object size x batch size.
 *
 * The client threads (--threads LIST) share one kvp_client_t, as a connector's
 * send, receive and lookup threads do, or each has its own (--client-per-thread,
 * as separate workers would; --clients both measures both). Each thread loops
 * until the point's duration is spent: put a batch of fresh keys (timed),
 * check they exist (timed), read them back (timed; CRC32C checked, as users
 * get it), remove them (not timed). With --loop exist|get a thread puts its
 * batch once and then repeats only that op: issue 11's thread points (4
 * threads on one client doing batch_is_exist of 32 keys: >= 1.8x one thread;
 * 1 MiB gets over tcp: >= 1x one thread, no collapse), each reported with
 * ratio_to_1_thread and its target. Every object's first and last
 * bytes are verified after the get. Reported per op: GB/s (10^9 B/s),
 * objects/s, and batch latency p50/p99/p99.9 (and the same divided by the
 * batch size, per object), next to the matching limit measured in the
 * same run: memcpy for shm, a loopback socket pump with the same number of
 * streams for tcp (and, as %ws / pct_of_ws_limit, the same pump cycling through a
 * batch's working set of buffers instead of one that stays in cache). With one thread,
 * also where a batch's time went (rpc us / master_rpc_us_per_batch: its calls to the
 * master, waiting for their answers; xfer us / transfer_us_per_batch: its transfers),
 * from the client's own metrics (kvp_metrics_t) read outside the timed calls.
 *
 * --pieces LIST (issue 14): with N > 1 pieces each object's buffer is split into N
 * equal pieces (a layer-wise KV layout: 1 MiB as 64 x 16 KiB) and put and got with
 * kvp_batch_put_from_multi / kvp_batch_get_into_multi (exist is unchanged); with 1 in
 * the list, ratio_to_1_piece compares each op with the 1-piece point of the same
 * transport, size, batch, thread count and client form (target for gets of 1
 * thread: >= 0.8).
 *
 * Any failure ends the point and fails the run: a put, exist, get or remove
 * that does not succeed for every key (the first failing key and its status
 * are printed), or a get that returns other bytes than were put.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/include/kvpool.h"
#include "client/tools/bench/bench.h"

#define TCP_STREAMS 2 /* the client's default tcp_streams */

enum { OP_PUT, OP_GET, OP_EXIST, N_OPS };
static const char *const op_names[N_OPS] = {"put", "get", "exist"};

typedef struct worker {
    const kvp_bench_opts_t *o;
    kvp_client_t *shared; /* the point's one client, or NULL: this thread creates its own */
    int loop;             /* -1: the full round; OP_GET / OP_EXIST: only that op */
    const char *transport;
    uint64_t size;
    unsigned batch;
    unsigned pieces; /* 1: one buffer per object; N: N equal pieces through the _multi calls */
    unsigned id;
    bool crc;
    double t_start, t_end;
    kvp_bench_lat_t lat[N_OPS];
    double busy[N_OPS];
    uint64_t objs[N_OPS];
    /* one thread only (breakdown): the op's master calls' wait and its transfers' wall time,
     * summed over the counted batches, from the client's metrics around each call */
    bool breakdown;
    uint64_t xfer_ns[N_OPS];
    /* per master method: its calls and their summed wait (the op's master wait is their sum) */
    uint64_t m_calls[N_OPS][KVP_METRICS_RPC_MAX], m_ns[N_OPS][KVP_METRICS_RPC_MAX];
    int failed;
    bool started; /* set by the caller's thread: the worker thread exists */
    char err[256];
} worker_t;

/* Record the worker's first failure: what, the first key whose status is not OK, and why. */
static void fail_batch(worker_t *w, const char *what, kvp_status_t st, char **keys,
                       const kvp_status_t *res, unsigned n)
{
    for (unsigned i = 0; i < n && res != NULL; i++) {
        if (res[i] != KVP_OK) {
            snprintf(w->err, sizeof(w->err), "%s %s: %s", what, keys[i], kvp_strerror(res[i]));
            w->failed = 1;
            return;
        }
    }
    snprintf(w->err, sizeof(w->err), "%s: %s", what, kvp_strerror(st));
    w->failed = 1;
}

static void *page_alloc(uint64_t size)
{
    void *p = NULL;
    return posix_memalign(&p, 4096, size) == 0 ? p : NULL;
}

static kvp_status_t client_new(const kvp_bench_opts_t *o, const char *transport, bool crc,
                               kvp_client_t **c_p)
{
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = o->master;
    p.transport = transport;
    p.verify_crc = crc;
    return kvp_client_create(&p, c_p);
}

/* The client's master calls so far (per method: calls and summed wait) and its transfers'
 * summed wall time, in ns. */
typedef struct waits {
    uint64_t xfer_ns;
    uint64_t calls[KVP_METRICS_RPC_MAX], ns[KVP_METRICS_RPC_MAX];
} waits_t;

static void waits_now(kvp_client_t *c, waits_t *out)
{
    kvp_metrics_t m = {.size = sizeof(m)};
    memset(out, 0, sizeof(*out));
    if (kvp_metrics_snapshot(c, &m) != KVP_OK)
        return;
    for (unsigned i = 0; i < KVP_METRICS_RPC_MAX; i++) {
        out->calls[i] = m.master_rpc[i].calls;
        out->ns[i] = m.master_rpc[i].wait_ns;
    }
    out->xfer_ns = m.transfer_ns[0] + m.transfer_ns[1];
}

/* A worker thread's batch: its keys, buffers and result arrays, sized once, and the round in
 * flight. */
typedef struct wctx {
    worker_t *w;
    kvp_client_t *c;
    unsigned b;    /* the batch size */
    unsigned P;    /* pieces per object */
    bool looping;  /* --loop: the keys are put once and removed at the end */
    bool in_store; /* --loop: the batch is in the store */
    char **keys;
    void **src, **dst;
    size_t *sizes;
    kvp_status_t *res;
    int64_t *got;
    int *ex;
    /* --pieces: object i is src[i] / dst[i] cut into P equal pieces, in order */
    void **src_parts, **dst_parts;
    size_t *part_sz, *n_parts;
    const void *const **srcv;
    void *const **dstv;
    const size_t **szv;
    unsigned registered; /* objects whose src and dst are registered with the client */
    /* the round in flight: each op's seconds, and the client's waits before the put, after
     * it (before the exist), after the exist (before the get) and after the get */
    double d[N_OPS];
    waits_t s[4];
} wctx_t;

/* The batch's arrays; false when one is missing (the rest are freed by wctx_free). */
static bool wctx_alloc(wctx_t *x)
{
    unsigned b = x->b, P = x->P;
    x->keys = calloc(b, sizeof(*x->keys));
    x->src = calloc(b, sizeof(*x->src));
    x->dst = calloc(b, sizeof(*x->dst));
    x->sizes = calloc(b, sizeof(*x->sizes));
    x->res = calloc(b, sizeof(*x->res));
    x->got = calloc(b, sizeof(*x->got));
    x->ex = calloc(b, sizeof(*x->ex));
    if (!x->keys || !x->src || !x->dst || !x->sizes || !x->res || !x->got || !x->ex)
        return false;
    if (P <= 1)
        return true;
    x->src_parts = calloc((size_t)b * P, sizeof(*x->src_parts));
    x->dst_parts = calloc((size_t)b * P, sizeof(*x->dst_parts));
    x->part_sz = calloc(P, sizeof(*x->part_sz));
    x->n_parts = calloc(b, sizeof(*x->n_parts));
    x->srcv = calloc(b, sizeof(*x->srcv));
    x->dstv = calloc(b, sizeof(*x->dstv));
    x->szv = calloc(b, sizeof(*x->szv));
    if (!x->src_parts || !x->dst_parts || !x->part_sz || !x->n_parts || !x->srcv || !x->dstv ||
        !x->szv)
        return false;
    for (unsigned j = 0; j < P; j++)
        x->part_sz[j] = x->w->size / P;
    return true;
}

/* Each object's source and destination buffer, filled and registered; false when out of
 * memory. */
static bool wctx_buffers(wctx_t *x)
{
    worker_t *w = x->w;
    unsigned P = x->P;
    for (unsigned i = 0; i < x->b; i++) {
        x->keys[i] = malloc(96);
        /* page-aligned, as registered memory usually is (pinned, mmap'd, a framework's
         * tensors; deploy/py-bench.py's numpy buffers): malloc's placement of 1 MiB blocks
         * depends on what the process freed before (the limits' buffers move glibc's mmap
         * threshold), and the offset of dst from the object's extent modulo 4 KiB picks the
         * copy's store path (crc32c.c) */
        x->src[i] = page_alloc(w->size);
        x->dst[i] = page_alloc(w->size);
        x->sizes[i] = w->size;
        if (!x->keys[i] || !x->src[i] || !x->dst[i])
            return false;
        memset(x->src[i], (int)(i * 31 + w->id + 1), w->size);
        memset(x->dst[i], 0, w->size);
        if (P > 1) {
            for (unsigned j = 0; j < P; j++) {
                x->src_parts[(size_t)i * P + j] = (char *)x->src[i] + (size_t)j * x->part_sz[j];
                x->dst_parts[(size_t)i * P + j] = (char *)x->dst[i] + (size_t)j * x->part_sz[j];
            }
            x->srcv[i] = (const void *const *)&x->src_parts[(size_t)i * P];
            x->dstv[i] = &x->dst_parts[(size_t)i * P];
            x->szv[i] = x->part_sz;
            x->n_parts[i] = P;
        }
        kvp_register_buffer(x->c, x->src[i], w->size);
        kvp_register_buffer(x->c, x->dst[i], w->size);
        x->registered++;
    }
    return true;
}

static void wctx_free(wctx_t *x)
{
    for (unsigned i = 0; i < x->b && x->keys && x->src && x->dst; i++) {
        if (i < x->registered) {
            kvp_unregister_buffer(x->c, x->src[i]);
            kvp_unregister_buffer(x->c, x->dst[i]);
        }
        free(x->keys[i]);
        free(x->src[i]);
        free(x->dst[i]);
    }
    free(x->keys);
    free(x->src);
    free(x->dst);
    free(x->sizes);
    free(x->res);
    free(x->got);
    free(x->ex);
    free(x->src_parts);
    free(x->dst_parts);
    free(x->part_sz);
    free(x->n_parts);
    free(x->srcv);
    free(x->dstv);
    free(x->szv);
}

/* The round's put (skipped while a --loop batch is in the store); -1 when it failed. */
static int round_put(wctx_t *x)
{
    worker_t *w = x->w;
    if (w->breakdown)
        waits_now(x->c, &x->s[0]);
    double t0 = kvp_bench_now(), t1 = t0;
    if (!x->in_store) {
        kvp_status_t st;
        if (x->P > 1)
            st = kvp_batch_put_from_multi(x->c, (const char *const *)x->keys, x->srcv, x->szv,
                                          x->n_parts, x->b, NULL, x->res);
        else
            st = kvp_batch_put_from(x->c, (const char *const *)x->keys, (const void *const *)x->src,
                                    x->sizes, x->b, NULL, x->res);
        t1 = kvp_bench_now();
        if (st != KVP_OK) {
            fail_batch(w, "put", st, x->keys, x->res, x->b);
            return -1;
        }
        x->in_store = x->looping;
    }
    x->d[OP_PUT] = t1 - t0;
    if (w->breakdown)
        waits_now(x->c, &x->s[1]);
    return 0;
}

/* The round's exist (skipped by --loop get); -1 when not every key exists. */
static int round_exist(wctx_t *x)
{
    worker_t *w = x->w;
    unsigned b = x->b;
    size_t prefix = b;
    kvp_status_t st = KVP_OK;
    double t1e = kvp_bench_now(), t2 = t1e;
    if (w->loop != OP_GET) {
        st = kvp_batch_is_exist(x->c, (const char *const *)x->keys, b, x->ex, &prefix);
        t2 = kvp_bench_now();
    }
    if (st != KVP_OK || prefix != b) {
        snprintf(w->err, sizeof(w->err), "exist: %s (prefix %zu of %u; %s: %s)", kvp_strerror(st),
                 prefix, b, x->keys[prefix < b ? prefix : 0],
                 st != KVP_OK        ? "not asked"
                 : prefix == b       ? "exists"
                 : x->ex[prefix] < 0 ? kvp_strerror((kvp_status_t)x->ex[prefix])
                                     : "does not exist");
        w->failed = 1;
        return -1;
    }
    x->d[OP_EXIST] = t2 - t1e;
    if (w->breakdown)
        waits_now(x->c, &x->s[2]);
    return 0;
}

/* The round's get (skipped by --loop exist) and the check of what came back; -1 when a key
 * failed or its bytes are not the ones put. */
static int round_get(wctx_t *x)
{
    worker_t *w = x->w;
    unsigned b = x->b;
    kvp_status_t st = KVP_OK;
    double t2g = kvp_bench_now(), t3 = t2g;
    if (w->loop != OP_EXIST) {
        if (x->P > 1)
            st = kvp_batch_get_into_multi(x->c, (const char *const *)x->keys, x->dstv, x->szv,
                                          x->n_parts, b, x->got);
        else
            st =
                kvp_batch_get_into(x->c, (const char *const *)x->keys, x->dst, x->sizes, b, x->got);
        t3 = kvp_bench_now();
    } else {
        for (unsigned i = 0; i < b; i++)
            x->got[i] = (int64_t)w->size;
    }
    if (st != KVP_OK) {
        unsigned i = 0;
        while (i + 1 < b && x->got[i] >= 0)
            i++;
        snprintf(w->err, sizeof(w->err), "get %s: %s", x->keys[i],
                 kvp_strerror(x->got[i] < 0 ? (kvp_status_t)x->got[i] : st));
        w->failed = 1;
        return -1;
    }
    x->d[OP_GET] = t3 - t2g;
    if (w->breakdown)
        waits_now(x->c, &x->s[3]);
    for (unsigned i = 0; i < b && !w->failed && w->loop != OP_EXIST; i++) {
        const char *s = x->src[i], *d = x->dst[i];
        if (x->got[i] != (int64_t)w->size || d[0] != s[0] || d[w->size - 1] != s[w->size - 1]) {
            snprintf(w->err, sizeof(w->err), "get returned wrong bytes for %s", x->keys[i]);
            w->failed = 1;
        }
    }
    return w->failed ? -1 : 0;
}

/* Remove the batch; -1 when a key was not removed. */
static int batch_remove(wctx_t *x)
{
    kvp_status_t st = kvp_batch_remove_force(x->c, (const char *const *)x->keys, x->b, x->res);
    if (st != KVP_OK) {
        fail_batch(x->w, "remove", st, x->keys, x->res, x->b);
        return -1;
    }
    return 0;
}

/* One round: put, exist, get (each timed, the breakdown's snapshots taken outside the timed
 * calls) and, without --loop, remove; -1 when one failed (w->err says which). */
static int round_run(wctx_t *x)
{
    memset(x->s, 0, sizeof(x->s));
    if (round_put(x) != 0 || round_exist(x) != 0 || round_get(x) != 0)
        return -1;
    return x->looping ? 0 : batch_remove(x);
}

/* Add a measured round to the worker's figures. */
static void round_count(wctx_t *x)
{
    worker_t *w = x->w;
    const waits_t *from[N_OPS] = {&x->s[0], &x->s[2], &x->s[1]};
    const waits_t *to[N_OPS] = {&x->s[1], &x->s[3], &x->s[2]};
    for (int op = 0; op < N_OPS; op++) {
        if (x->looping && op != w->loop)
            continue;
        kvp_bench_lat_add(&w->lat[op], x->d[op]);
        w->busy[op] += x->d[op];
        w->objs[op] += x->b;
        w->xfer_ns[op] += to[op]->xfer_ns - from[op]->xfer_ns;
        for (unsigned m = 0; m < KVP_METRICS_RPC_MAX; m++) {
            w->m_calls[op][m] += to[op]->calls[m] - from[op]->calls[m];
            w->m_ns[op][m] += to[op]->ns[m] - from[op]->ns[m];
        }
    }
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    wctx_t x = {.w = w, .c = w->shared, .b = w->batch, .P = w->pieces, .looping = w->loop >= 0};
    kvp_status_t st;
    if (x.c == NULL && (st = client_new(w->o, w->transport, w->crc, &x.c)) != KVP_OK) {
        snprintf(w->err, sizeof(w->err), "client: %s", kvp_strerror(st));
        w->failed = 1;
        return NULL;
    }
    if (!wctx_alloc(&x) || !wctx_buffers(&x)) {
        snprintf(w->err, sizeof(w->err), "out of memory for %u buffers of %llu bytes", x.b,
                 (unsigned long long)w->size);
        w->failed = 1;
    }
    /* Round 0 is a warm-up (first touch of buffers and mappings) and is not counted;
     * at least 3 rounds are measured even when they take longer than the duration.
     * --loop: the keys are put once and removed at the end; only the looped op is timed. */
    uint64_t iter = 0;
    while ((kvp_bench_now() < w->t_end || iter < 4) && !w->failed) {
        if (!x.looping || iter == 0)
            for (unsigned i = 0; i < x.b; i++)
                snprintf(x.keys[i], 96, "bench@%s@t%u@%llu@%u", w->transport, w->id,
                         (unsigned long long)iter, i);
        iter++;
        if (round_run(&x) != 0)
            break;
        if (iter > 1) /* not the warm-up round */
            round_count(&x);
    }
    if (x.in_store && !w->failed)
        batch_remove(&x);
    wctx_free(&x);
    if (w->shared == NULL)
        kvp_client_destroy(x.c);
    return NULL;
}

static const char *fmt_size(uint64_t s, char *buf, size_t len)
{
    if (s >= (1 << 20) && s % (1 << 20) == 0)
        snprintf(buf, len, "%lluMiB", (unsigned long long)(s >> 20));
    else if (s >= 1024 && s % 1024 == 0)
        snprintf(buf, len, "%lluKiB", (unsigned long long)(s >> 10));
    else
        snprintf(buf, len, "%lluB", (unsigned long long)s);
    return buf;
}

/* Issue 11's targets for threads sharing one client: 4 threads calling batch_is_exist reach
 * 1.8x one thread; 4 threads doing large gets over tcp do not fall below one thread. */
static double target_ratio(const char *transport, int loop, int op, unsigned nt, bool shared,
                           uint64_t size)
{
    if (!shared || nt != 4 || loop != op)
        return 0;
    if (op == OP_EXIST)
        return 1.8;
    if (op == OP_GET && strcmp(transport, "tcp") == 0 && size >= (1u << 20))
        return 1.0;
    return 0;
}

/* Issue 14's target for a get scattered over N pieces (1 thread): >= 0.8x the 1-piece get. */
#define PIECES_TARGET 0.8

/* The 1-piece figures of one (thread count, client form), for ratio_to_1_piece. */
typedef struct piece_base {
    unsigned nt;
    bool shared;
    double v[N_OPS]; /* objects/s at 1 piece; 0: not measured */
} piece_base_t;

typedef struct piece_bases {
    piece_base_t e[2 * KVP_BENCH_MAX_LIST + 2];
    size_t n;
} piece_bases_t;

static double *piece_base(piece_bases_t *pb, unsigned nt, bool shared)
{
    static double none[N_OPS];
    for (size_t i = 0; i < pb->n; i++)
        if (pb->e[i].nt == nt && pb->e[i].shared == shared)
            return pb->e[i].v;
    if (pb->n == sizeof(pb->e) / sizeof(pb->e[0])) {
        memset(none, 0, sizeof(none));
        return none;
    }
    pb->e[pb->n] = (piece_base_t){.nt = nt, .shared = shared};
    return pb->e[pb->n++].v;
}

/* One measured point: its settings, its threads' figures, and the limits it is compared
 * with. */
typedef struct point {
    const kvp_bench_opts_t *o;
    kvp_bench_out_t *out;
    const char *transport;
    uint64_t size;
    unsigned batch, pieces, nt;
    bool crc, shared, rdma;
    int loop; /* -1, or the op --loop repeats */
    const char *clients;
    worker_t *w;
    double limit, ws_limit; /* the transport's limit (rdma: per op), the tcp working-set pump */
    double *base, *pbase;   /* run_point's base and pbase */
} point_t;

/* One op's figures at a point. */
typedef struct op_fig {
    kvp_bench_lat_t all; /* every thread's batch latencies */
    double objs_s, gbps, p50, p99, p999;
    double rpc_us, xfer_us; /* per batch, 1 thread; -1 otherwise */
    double limit, pct, ws_pct;
    double ratio, pratio, target, tval;
    const char *tfield;
} op_fig_t;

/* Start the point's threads (each on its own worker_t), then wait for them; 1 when one
 * failed (said on stderr). */
static int point_threads(point_t *pt)
{
    const kvp_bench_opts_t *o = pt->o;
    unsigned nt = pt->nt;
    pthread_t *th = calloc(nt, sizeof(*th));
    if (th == NULL) {
        fprintf(stderr, "kvpool-bench: data: out of memory\n");
        return 1;
    }
    kvp_client_t *one = NULL;
    if (pt->shared) {
        kvp_status_t st = client_new(o, pt->transport, pt->crc, &one);
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench: data %s: client: %s\n", pt->transport, kvp_strerror(st));
            free(th);
            return 1;
        }
    }
    double t0 = kvp_bench_now();
    for (unsigned t = 0; t < nt; t++) {
        worker_t *w = &pt->w[t];
        *w = (worker_t){.o = o,
                        .shared = one,
                        .loop = pt->loop,
                        .transport = pt->transport,
                        .size = pt->size,
                        .batch = pt->batch,
                        .pieces = pt->pieces,
                        .id = t,
                        .crc = pt->crc,
                        .t_start = t0,
                        .t_end = t0 + o->duration_s,
                        .breakdown = nt == 1};
        w->started = pthread_create(&th[t], NULL, worker_main, w) == 0;
        if (!w->started) {
            snprintf(w->err, sizeof(w->err), "cannot start a client thread");
            w->failed = 1;
        }
    }
    char sz[32];
    kvp_bench_progress(o, "data: %s %s batch %u pieces %u threads %u (%s client%s)%s%s%s ...",
                       pt->transport, fmt_size(pt->size, sz, sizeof(sz)), pt->batch, pt->pieces, nt,
                       pt->clients, pt->shared ? "" : "s", pt->crc ? "" : " crc=off",
                       pt->loop >= 0 ? " loop " : "", pt->loop >= 0 ? op_names[pt->loop] : "");
    int rc = 0;
    for (unsigned t = 0; t < nt; t++) {
        if (pt->w[t].started)
            pthread_join(th[t], NULL);
        if (pt->w[t].failed) {
            fprintf(stderr, "kvpool-bench: data %s %llu: %s\n", pt->transport,
                    (unsigned long long)pt->size, pt->w[t].err);
            rc = 1;
        }
    }
    kvp_client_destroy(one);
    kvp_bench_progress_done(o);
    free(th);
    return rc;
}

/* The target an op's ratio is held to, if any: issue 11's thread targets, or issue 14's
 * for a get over pieces. */
static void op_target(const point_t *pt, int op, op_fig_t *f)
{
    f->target = target_ratio(pt->transport, pt->loop, op, pt->nt, pt->shared, pt->size);
    f->tfield = f->target > 0 ? "ratio_to_1_thread" : "none";
    f->tval = f->ratio;
    if (pt->pieces > 1 && op == OP_GET && pt->nt == 1 && pt->pbase[op] > 0) {
        f->target = PIECES_TARGET;
        f->tfield = "ratio_to_1_piece";
        f->tval = f->pratio;
    }
}

/* An op's figures over the point's threads; sets the point's base / pbase for the op when it
 * is the 1-thread / 1-piece baseline. */
static void op_figures(const point_t *pt, int op, op_fig_t *f)
{
    unsigned nt = pt->nt;
    uint64_t objs = 0;
    double busy = 0;
    for (unsigned t = 0; t < nt; t++) {
        for (size_t i = 0; i < pt->w[t].lat[op].n; i++)
            kvp_bench_lat_add(&f->all, pt->w[t].lat[op].v[i]);
        objs += pt->w[t].objs[op];
        busy += pt->w[t].busy[op];
    }
    /* rate = objects per second of time spent in this op, summed over threads */
    double per_thread_s = busy / nt;
    f->objs_s = per_thread_s > 0 ? (double)objs / per_thread_s : 0;
    f->gbps = op == OP_EXIST ? 0 : f->objs_s * (double)pt->size / 1e9;
    f->p50 = kvp_bench_percentile(f->all.v, f->all.n, 50) * 1e6;
    f->p99 = kvp_bench_percentile(f->all.v, f->all.n, 99) * 1e6;
    f->p999 = kvp_bench_percentile(f->all.v, f->all.n, 99.9) * 1e6;
    /* one thread: per batch, the master calls' wait and the transfers' time (-1: not
     * measured, several threads share the client's counters) */
    f->rpc_us = -1;
    f->xfer_us = -1;
    if (nt == 1 && f->all.n > 0) {
        uint64_t rpc_ns = 0;
        for (unsigned m = 0; m < KVP_METRICS_RPC_MAX; m++)
            rpc_ns += pt->w[0].m_ns[op][m];
        f->rpc_us = (double)rpc_ns / 1e3 / (double)f->all.n;
        f->xfer_us = (double)pt->w[0].xfer_ns[op] / 1e3 / (double)f->all.n;
    }
    f->limit = pt->limit;
    if (pt->rdma) /* perftest's figure for the same verb, measured outside */
        f->limit = op == OP_PUT ? pt->o->rdma_write_gbps : op == OP_GET ? pt->o->rdma_read_gbps : 0;
    f->pct = op != OP_EXIST && f->limit > 0 ? f->gbps / f->limit * 100 : 0;
    if (nt == 1)
        pt->base[op] = f->objs_s;
    f->ratio = pt->base[op] > 0 ? f->objs_s / pt->base[op] : 0;
    if (pt->pieces == 1)
        pt->pbase[op] = f->objs_s;
    f->pratio = pt->pieces > 1 && pt->pbase[op] > 0 ? f->objs_s / pt->pbase[op] : 0;
    op_target(pt, op, f);
    f->ws_pct = op != OP_EXIST && pt->ws_limit > 0 ? f->gbps / pt->ws_limit * 100 : 0;
}

/* The op's row of the human table. */
static void op_print(const point_t *pt, int op, const op_fig_t *f)
{
    char sz[32], tgt[64] = "";
    if (f->target > 0)
        snprintf(tgt, sizeof(tgt), "  target >= %.1fx: %s", f->target,
                 f->tval >= f->target ? "met" : "MISSED");
    char rpc_s[16] = "-", xfer_s[16] = "-";
    if (f->rpc_us >= 0) {
        snprintf(rpc_s, sizeof(rpc_s), "%.1f", f->rpc_us);
        snprintf(xfer_s, sizeof(xfer_s), "%.1f", f->xfer_us);
    }
    printf("%-4s %-5s %8s %5u %5u %3u %-6s %-3s %8.2f %6.1f%% %5.0f%% %10.0f %9.1f %9.1f %9.1f "
           "%5.2fx %5.2fx %8s %8s%s\n",
           pt->transport, op_names[op], fmt_size(pt->size, sz, sizeof(sz)), pt->batch, pt->pieces,
           pt->nt,
           pt->nt == 1  ? "one"
           : pt->shared ? "shared"
                        : "own",
           pt->crc ? "on" : "off", f->gbps, f->pct, f->ws_pct, f->objs_s, f->p50, f->p99, f->p999,
           f->ratio, f->pratio, rpc_s, xfer_s, tgt);
}

/* The op's target fields of its result. */
static void op_json_target(kvp_bench_out_t *out, const op_fig_t *f)
{
    kvp_bench_result_num(out, "target_ratio", f->target);
    kvp_bench_result_str(out, "target_field", f->tfield);
    const char *tdesc = "none";
    if (strcmp(f->tfield, "ratio_to_1_piece") == 0)
        tdesc = "issue 14: a get scattered over N pieces >= 0.8x the 1-piece get";
    else if (f->target == 1.8)
        tdesc = "issue 11: 4 threads on one client >= 1.8x one thread";
    else if (f->target == 1.0)
        tdesc = "issue 11: 4 threads on one client >= 1x one thread (2 streams): no collapse";
    kvp_bench_result_str(out, "target", tdesc);
    kvp_bench_result_str(out, "target_met",
                         f->target <= 0         ? "n/a"
                         : f->tval >= f->target ? "yes"
                                                : "no");
}

/* ... and per master method the op called (1 thread): rpc_<method>_us, the mean wait of one
 * call, and rpc_<method>_calls_per_batch */
static void op_json_methods(const point_t *pt, int op, const op_fig_t *f)
{
    const worker_t *w = &pt->w[0];
    for (unsigned m = 0; pt->nt == 1 && f->all.n > 0 && m < KVP_METRICS_RPC_MAX; m++) {
        const char *name = kvp_metrics_rpc_name(m);
        if (w->m_calls[op][m] == 0 || name == NULL)
            continue;
        char field[64];
        snprintf(field, sizeof(field), "rpc_%s_us", name);
        kvp_bench_result_num(pt->out, field,
                             (double)w->m_ns[op][m] / 1e3 / (double)w->m_calls[op][m]);
        snprintf(field, sizeof(field), "rpc_%s_calls_per_batch", name);
        kvp_bench_result_num(pt->out, field, (double)w->m_calls[op][m] / (double)f->all.n);
    }
}

/* The op's result object. */
static void op_json(const point_t *pt, int op, const op_fig_t *f)
{
    kvp_bench_out_t *out = pt->out;
    kvp_bench_result_begin(out, "data");
    kvp_bench_result_str(out, "op", op_names[op]);
    kvp_bench_result_str(out, "transport", pt->transport);
    kvp_bench_result_int(out, "size", (int64_t)pt->size);
    kvp_bench_result_int(out, "batch", pt->batch);
    kvp_bench_result_int(out, "pieces", pt->pieces);
    kvp_bench_result_int(out, "piece_bytes", (int64_t)(pt->size / pt->pieces));
    kvp_bench_result_int(out, "threads", pt->nt);
    kvp_bench_result_str(out, "clients", pt->clients);
    kvp_bench_result_str(out, "loop", pt->loop >= 0 ? op_names[pt->loop] : "none");
    kvp_bench_result_str(out, "crc", pt->crc ? "on" : "off");
    kvp_bench_result_num(out, "gbps", f->gbps);
    kvp_bench_result_num(out, "objs_per_s", f->objs_s);
    kvp_bench_result_num(out, "objs_per_s_per_thread", f->objs_s / pt->nt);
    kvp_bench_result_num(out, "ratio_to_1_thread", f->ratio);
    kvp_bench_result_num(out, "ratio_to_1_piece", f->pratio);
    op_json_target(out, f);
    kvp_bench_result_num(out, "p50_us", f->p50);
    kvp_bench_result_num(out, "p99_us", f->p99);
    kvp_bench_result_num(out, "p999_us", f->p999);
    kvp_bench_result_num(out, "obj_p50_us", f->p50 / pt->batch);
    kvp_bench_result_num(out, "obj_p99_us", f->p99 / pt->batch);
    kvp_bench_result_num(out, "obj_p999_us", f->p999 / pt->batch);
    kvp_bench_result_num(out, "limit_gbps", op == OP_EXIST ? 0 : f->limit);
    kvp_bench_result_str(out, "limit",
                         op == OP_EXIST                      ? "none"
                         : pt->rdma && f->limit <= 0         ? "none"
                         : pt->rdma && op == OP_PUT          ? "ib_write_bw"
                         : pt->rdma                          ? "ib_read_bw"
                         : strcmp(pt->transport, "shm") == 0 ? "memcpy"
                                                             : "tcp-pump");
    kvp_bench_result_num(out, "pct_of_limit", f->pct);
    /* tcp: the same pump over a batch's working set (bench_limits.c), for reference */
    kvp_bench_result_num(out, "ws_limit_gbps", op == OP_EXIST ? 0 : pt->ws_limit);
    kvp_bench_result_num(out, "pct_of_ws_limit", f->ws_pct);
    kvp_bench_result_int(out, "batches", (int64_t)f->all.n);
    /* where a batch's time went (1 thread; -1 otherwise): its master calls' wait and its
     * transfers' wall time, per batch, from the client's metrics (kvp_metrics_t) */
    kvp_bench_result_num(out, "master_rpc_us_per_batch", f->rpc_us);
    kvp_bench_result_num(out, "transfer_us_per_batch", f->xfer_us);
    op_json_methods(pt, op, f);
    kvp_bench_result_end(out);
}

/* base[op]: objects/s of the same point at 1 thread (0: not measured); set when nt == 1.
 * pbase[op]: the same at 1 piece (same thread count and client form); set when pieces == 1. */
static int run_point(const kvp_bench_opts_t *o, kvp_bench_out_t *out, const char *transport,
                     uint64_t size, unsigned batch, unsigned pieces, bool crc, unsigned nt,
                     bool shared, double base[N_OPS], double pbase[N_OPS])
{
    point_t pt = {.o = o,
                  .out = out,
                  .transport = transport,
                  .size = size,
                  .batch = batch,
                  .pieces = pieces,
                  .nt = nt,
                  .crc = crc,
                  .shared = shared,
                  .rdma = strcmp(transport, "rdma") == 0,
                  .loop = o->loop == NULL                 ? -1
                          : strcmp(o->loop, "exist") == 0 ? OP_EXIST
                                                          : OP_GET,
                  .clients = shared ? "shared" : "per-thread",
                  .w = calloc(nt, sizeof(worker_t)),
                  .base = base,
                  .pbase = pbase};
    if (pt.w == NULL) {
        fprintf(stderr, "kvpool-bench: data: out of memory\n");
        return 1;
    }
    int rc = point_threads(&pt);
    pt.limit = pt.rdma                         ? 0
               : strcmp(transport, "shm") == 0 ? kvp_bench_limit_memcpy_gbps(size)
                                               : kvp_bench_limit_tcp_gbps(size, TCP_STREAMS * nt);
    pt.ws_limit =
        strcmp(transport, "tcp") == 0 ? kvp_bench_limit_tcp_ws_gbps(size, TCP_STREAMS * nt) : 0;
    for (int op = 0; op < N_OPS && rc == 0; op++) {
        if (pt.loop >= 0 && op != pt.loop)
            continue;
        op_fig_t f = {.all = {0}};
        op_figures(&pt, op, &f);
        op_print(&pt, op, &f);
        op_json(&pt, op, &f);
        free(f.all.v);
    }
    for (unsigned t = 0; t < nt; t++)
        for (int op = 0; op < N_OPS; op++)
            free(pt.w[t].lat[op].v);
    free(pt.w);
    return rc;
}

/* Every thread count of the point (1 first: the baseline), in each client form asked for. */
static int run_threads(const kvp_bench_opts_t *o, kvp_bench_out_t *out, const char *transport,
                       uint64_t size, unsigned batch, unsigned pieces, bool crc, piece_bases_t *pb)
{
    double base[N_OPS] = {0};
    int rc = 0;
    bool one_done = false;
    for (size_t i = 0; i < o->n_thread_counts; i++) {
        unsigned nt = o->thread_counts[i];
        bool one_shared = o->clients_shared;
        if (nt > 1 && !one_done) /* the baseline of ratio_to_1_thread */
            rc |= run_point(o, out, transport, size, batch, pieces, crc, 1, one_shared, base,
                            piece_base(pb, 1, one_shared));
        one_done = true;
        if (nt == 1) {
            rc |= run_point(o, out, transport, size, batch, pieces, crc, 1, one_shared, base,
                            piece_base(pb, 1, one_shared));
            continue;
        }
        if (o->clients_shared)
            rc |= run_point(o, out, transport, size, batch, pieces, crc, nt, true, base,
                            piece_base(pb, nt, true));
        if (o->clients_own)
            rc |= run_point(o, out, transport, size, batch, pieces, crc, nt, false, base,
                            piece_base(pb, nt, false));
    }
    return rc;
}

int kvp_bench_data(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    int rc = 0;
    /* exist moves no object bytes: no limit to compare with */
    bool need_limits = o->loop == NULL || strcmp(o->loop, "exist") != 0;
    for (size_t s = 0; s < o->n_sizes && need_limits; s++)
        for (size_t i = 0; i < o->n_thread_counts; i++)
            if (kvp_bench_limits_ensure(o, o->sizes[s], TCP_STREAMS * o->thread_counts[i]) != 0)
                rc = 1;
    printf("== data: batch ops against %s (threads %u%s, %s, %.1f s per point%s%s) ==\n", o->master,
           o->threads, o->threads > 1 ? " max" : "",
           o->clients_shared && o->clients_own ? "one shared client and one client per thread"
           : o->clients_shared                 ? "sharing one client"
                                               : "one client per thread",
           o->duration_s, o->loop ? ", loop " : "", o->loop ? o->loop : "");
    printf("%-4s %-5s %8s %5s %5s %3s %-6s %-3s %8s %7s %6s %10s %9s %9s %9s %6s %6s %8s %8s\n",
           "tr", "op", "size", "batch", "pcs", "thr", "client", "crc", "GB/s", "%limit", "%ws",
           "obj/s", "p50 us", "p99 us", "p99.9 us", "x1thr", "x1pc", "rpc us", "xfer us");
    for (size_t p = 0; p < o->n_pieces; p++)
        for (size_t s = 0; s < o->n_sizes; s++)
            if (o->sizes[s] % o->pieces[p] != 0) {
                fprintf(stderr,
                        "kvpool-bench: data: size %llu does not split into %u equal pieces\n",
                        (unsigned long long)o->sizes[s], o->pieces[p]);
                rc = 1;
            }
    for (size_t t = 0; t < o->n_transports; t++)
        for (size_t s = 0; s < o->n_sizes; s++)
            for (size_t b = 0; b < o->n_batches; b++)
                for (int crc = 1; crc >= (o->no_crc ? 0 : 1); crc--) {
                    piece_bases_t pb = {.n = 0};
                    for (size_t p = 0; p < o->n_pieces; p++) {
                        if (o->sizes[s] % o->pieces[p] != 0)
                            continue;
                        rc |= run_threads(o, out, o->transports[t], o->sizes[s], o->batches[b],
                                          o->pieces[p], crc != 0, &pb);
                    }
                }
    fflush(stdout);
    return rc;
}
