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

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    kvp_client_t *c = w->shared;
    kvp_status_t st;
    if (c == NULL && (st = client_new(w->o, w->transport, w->crc, &c)) != KVP_OK) {
        snprintf(w->err, sizeof(w->err), "client: %s", kvp_strerror(st));
        w->failed = 1;
        return NULL;
    }
    unsigned b = w->batch;
    char **keys = calloc(b, sizeof(*keys));
    void **src = calloc(b, sizeof(*src)), **dst = calloc(b, sizeof(*dst));
    size_t *sizes = calloc(b, sizeof(*sizes));
    kvp_status_t *res = calloc(b, sizeof(*res));
    int64_t *got = calloc(b, sizeof(*got));
    int *ex = calloc(b, sizeof(*ex));
    bool nomem = !keys || !src || !dst || !sizes || !res || !got || !ex;
    /* --pieces: object i is src[i] / dst[i] cut into P equal pieces, in order */
    unsigned P = w->pieces;
    void **src_parts = NULL, **dst_parts = NULL;
    size_t *part_sz = NULL, *n_parts = NULL;
    const void *const **srcv = NULL;
    void *const **dstv = NULL;
    const size_t **szv = NULL;
    if (P > 1 && !nomem) {
        src_parts = calloc((size_t)b * P, sizeof(*src_parts));
        dst_parts = calloc((size_t)b * P, sizeof(*dst_parts));
        part_sz = calloc(P, sizeof(*part_sz));
        n_parts = calloc(b, sizeof(*n_parts));
        srcv = calloc(b, sizeof(*srcv));
        dstv = calloc(b, sizeof(*dstv));
        szv = calloc(b, sizeof(*szv));
        nomem = !src_parts || !dst_parts || !part_sz || !n_parts || !srcv || !dstv || !szv;
        for (unsigned j = 0; j < P && !nomem; j++)
            part_sz[j] = w->size / P;
    }
    unsigned registered = 0;
    for (unsigned i = 0; i < b && !nomem; i++) {
        keys[i] = malloc(96);
        /* page-aligned, as registered memory usually is (pinned, mmap'd, a framework's
         * tensors; deploy/py-bench.py's numpy buffers): malloc's placement of 1 MiB blocks
         * depends on what the process freed before (the limits' buffers move glibc's mmap
         * threshold), and the offset of dst from the object's extent modulo 4 KiB picks the
         * copy's store path (crc32c.c) */
        src[i] = page_alloc(w->size);
        dst[i] = page_alloc(w->size);
        sizes[i] = w->size;
        if (!keys[i] || !src[i] || !dst[i]) {
            nomem = true;
            break;
        }
        memset(src[i], (int)(i * 31 + w->id + 1), w->size);
        memset(dst[i], 0, w->size);
        if (P > 1) {
            for (unsigned j = 0; j < P; j++) {
                src_parts[(size_t)i * P + j] = (char *)src[i] + (size_t)j * part_sz[j];
                dst_parts[(size_t)i * P + j] = (char *)dst[i] + (size_t)j * part_sz[j];
            }
            srcv[i] = (const void *const *)&src_parts[(size_t)i * P];
            dstv[i] = &dst_parts[(size_t)i * P];
            szv[i] = part_sz;
            n_parts[i] = P;
        }
        kvp_register_buffer(c, src[i], w->size);
        kvp_register_buffer(c, dst[i], w->size);
        registered++;
    }
    /* Round 0 is a warm-up (first touch of buffers and mappings) and is not counted;
     * at least 3 rounds are measured even when they take longer than the duration. */
    uint64_t iter = 0;
    if (nomem) {
        snprintf(w->err, sizeof(w->err), "out of memory for %u buffers of %llu bytes", b,
                 (unsigned long long)w->size);
        w->failed = 1;
    }
    /* --loop: the keys are put once and removed at the end; only the looped op is timed */
    bool looping = w->loop >= 0, in_store = false;
    while ((kvp_bench_now() < w->t_end || iter < 4) && !w->failed) {
        if (!looping || iter == 0)
            for (unsigned i = 0; i < b; i++)
                snprintf(keys[i], 96, "bench@%s@t%u@%llu@%u", w->transport, w->id,
                         (unsigned long long)iter, i);
        iter++;
        /* the breakdown's snapshots are taken outside the timed calls */
        waits_t s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        if (w->breakdown)
            waits_now(c, &s0);
        double t0 = kvp_bench_now(), t1 = t0;
        if (!in_store) {
            if (P > 1)
                st = kvp_batch_put_from_multi(c, (const char *const *)keys, srcv, szv, n_parts, b,
                                              NULL, res);
            else
                st = kvp_batch_put_from(c, (const char *const *)keys, (const void *const *)src,
                                        sizes, b, NULL, res);
            t1 = kvp_bench_now();
            if (st != KVP_OK) {
                fail_batch(w, "put", st, keys, res, b);
                break;
            }
            in_store = looping;
        }
        if (w->breakdown)
            waits_now(c, &s1);
        size_t prefix = b;
        double t1e = kvp_bench_now(), t2 = t1e;
        if (w->loop != OP_GET) {
            st = kvp_batch_is_exist(c, (const char *const *)keys, b, ex, &prefix);
            t2 = kvp_bench_now();
        } else {
            st = KVP_OK;
        }
        if (st != KVP_OK || prefix != b) {
            snprintf(w->err, sizeof(w->err), "exist: %s (prefix %zu of %u; %s: %s)",
                     kvp_strerror(st), prefix, b, keys[prefix < b ? prefix : 0],
                     st != KVP_OK     ? "not asked"
                     : prefix == b    ? "exists"
                     : ex[prefix] < 0 ? kvp_strerror((kvp_status_t)ex[prefix])
                                      : "does not exist");
            w->failed = 1;
            break;
        }
        if (w->breakdown)
            waits_now(c, &s2);
        double t2g = kvp_bench_now(), t3 = t2g;
        if (w->loop != OP_EXIST) {
            if (P > 1)
                st = kvp_batch_get_into_multi(c, (const char *const *)keys, dstv, szv, n_parts, b,
                                              got);
            else
                st = kvp_batch_get_into(c, (const char *const *)keys, dst, sizes, b, got);
            t3 = kvp_bench_now();
        } else {
            st = KVP_OK;
            for (unsigned i = 0; i < b; i++)
                got[i] = (int64_t)w->size;
        }
        if (st != KVP_OK) {
            unsigned i = 0;
            while (i + 1 < b && got[i] >= 0)
                i++;
            snprintf(w->err, sizeof(w->err), "get %s: %s", keys[i],
                     kvp_strerror(got[i] < 0 ? (kvp_status_t)got[i] : st));
            w->failed = 1;
            break;
        }
        if (w->breakdown)
            waits_now(c, &s3);
        for (unsigned i = 0; i < b && !w->failed && w->loop != OP_EXIST; i++) {
            const char *s = src[i], *d = dst[i];
            if (got[i] != (int64_t)w->size || d[0] != s[0] || d[w->size - 1] != s[w->size - 1]) {
                snprintf(w->err, sizeof(w->err), "get returned wrong bytes for %s", keys[i]);
                w->failed = 1;
            }
        }
        if (w->failed)
            break;
        if (!looping) {
            st = kvp_batch_remove_force(c, (const char *const *)keys, b, res);
            if (st != KVP_OK) {
                fail_batch(w, "remove", st, keys, res, b);
                break;
            }
        }
        if (iter == 1)
            continue; /* the warm-up round */
        double d[N_OPS] = {t1 - t0, t3 - t2g, t2 - t1e};
        const waits_t *from[N_OPS] = {&s0, &s2, &s1}, *to[N_OPS] = {&s1, &s3, &s2};
        for (int op = 0; op < N_OPS; op++) {
            if (looping && op != w->loop)
                continue;
            kvp_bench_lat_add(&w->lat[op], d[op]);
            w->busy[op] += d[op];
            w->objs[op] += b;
            w->xfer_ns[op] += to[op]->xfer_ns - from[op]->xfer_ns;
            for (unsigned m = 0; m < KVP_METRICS_RPC_MAX; m++) {
                w->m_calls[op][m] += to[op]->calls[m] - from[op]->calls[m];
                w->m_ns[op][m] += to[op]->ns[m] - from[op]->ns[m];
            }
        }
    }
    if (in_store && !w->failed) {
        st = kvp_batch_remove_force(c, (const char *const *)keys, b, res);
        if (st != KVP_OK)
            fail_batch(w, "remove", st, keys, res, b);
    }
    for (unsigned i = 0; i < b && keys && src && dst; i++) {
        if (i < registered) {
            kvp_unregister_buffer(c, src[i]);
            kvp_unregister_buffer(c, dst[i]);
        }
        free(keys[i]);
        free(src[i]);
        free(dst[i]);
    }
    free(keys);
    free(src);
    free(dst);
    free(sizes);
    free(res);
    free(got);
    free(ex);
    free(src_parts);
    free(dst_parts);
    free(part_sz);
    free(n_parts);
    free(srcv);
    free(dstv);
    free(szv);
    if (w->shared == NULL)
        kvp_client_destroy(c);
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

/* base[op]: objects/s of the same point at 1 thread (0: not measured); set when nt == 1.
 * pbase[op]: the same at 1 piece (same thread count and client form); set when pieces == 1. */
static int run_point(const kvp_bench_opts_t *o, kvp_bench_out_t *out, const char *transport,
                     uint64_t size, unsigned batch, unsigned pieces, bool crc, unsigned nt,
                     bool shared, double base[N_OPS], double pbase[N_OPS])
{
    int loop = o->loop == NULL ? -1 : strcmp(o->loop, "exist") == 0 ? OP_EXIST : OP_GET;
    worker_t *w = calloc(nt, sizeof(*w));
    pthread_t *th = calloc(nt, sizeof(*th));
    if (w == NULL || th == NULL) {
        fprintf(stderr, "kvpool-bench: data: out of memory\n");
        free(w);
        free(th);
        return 1;
    }
    kvp_client_t *one = NULL;
    if (shared) {
        kvp_status_t st = client_new(o, transport, crc, &one);
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench: data %s: client: %s\n", transport, kvp_strerror(st));
            free(w);
            free(th);
            return 1;
        }
    }
    double t0 = kvp_bench_now();
    for (unsigned t = 0; t < nt; t++) {
        w[t] = (worker_t){.o = o,
                          .shared = one,
                          .loop = loop,
                          .transport = transport,
                          .size = size,
                          .batch = batch,
                          .pieces = pieces,
                          .id = t,
                          .crc = crc,
                          .t_start = t0,
                          .t_end = t0 + o->duration_s,
                          .breakdown = nt == 1};
        w[t].started = pthread_create(&th[t], NULL, worker_main, &w[t]) == 0;
        if (!w[t].started) {
            snprintf(w[t].err, sizeof(w[t].err), "cannot start a client thread");
            w[t].failed = 1;
        }
    }
    char sz[32];
    const char *clients = shared ? "shared" : "per-thread";
    kvp_bench_progress(o, "data: %s %s batch %u pieces %u threads %u (%s client%s)%s%s%s ...",
                       transport, fmt_size(size, sz, sizeof(sz)), batch, pieces, nt, clients,
                       shared ? "" : "s", crc ? "" : " crc=off", loop >= 0 ? " loop " : "",
                       loop >= 0 ? op_names[loop] : "");
    int rc = 0;
    for (unsigned t = 0; t < nt; t++) {
        if (w[t].started)
            pthread_join(th[t], NULL);
        if (w[t].failed) {
            fprintf(stderr, "kvpool-bench: data %s %llu: %s\n", transport, (unsigned long long)size,
                    w[t].err);
            rc = 1;
        }
    }
    kvp_client_destroy(one);
    kvp_bench_progress_done(o);
    bool rdma = strcmp(transport, "rdma") == 0;
    double limit = rdma ? 0
                   : strcmp(transport, "shm") == 0
                       ? kvp_bench_limit_memcpy_gbps(size)
                       : kvp_bench_limit_tcp_gbps(size, TCP_STREAMS * nt);
    double ws_limit =
        strcmp(transport, "tcp") == 0 ? kvp_bench_limit_tcp_ws_gbps(size, TCP_STREAMS * nt) : 0;
    for (int op = 0; op < N_OPS && rc == 0; op++) {
        if (loop >= 0 && op != loop)
            continue;
        kvp_bench_lat_t all = {0};
        uint64_t objs = 0;
        double busy = 0;
        for (unsigned t = 0; t < nt; t++) {
            for (size_t i = 0; i < w[t].lat[op].n; i++)
                kvp_bench_lat_add(&all, w[t].lat[op].v[i]);
            objs += w[t].objs[op];
            busy += w[t].busy[op];
        }
        /* rate = objects per second of time spent in this op, summed over threads */
        double per_thread_s = busy / nt;
        double objs_s = per_thread_s > 0 ? (double)objs / per_thread_s : 0;
        double gbps = op == OP_EXIST ? 0 : objs_s * (double)size / 1e9;
        double p50 = kvp_bench_percentile(all.v, all.n, 50) * 1e6;
        double p99 = kvp_bench_percentile(all.v, all.n, 99) * 1e6;
        double p999 = kvp_bench_percentile(all.v, all.n, 99.9) * 1e6;
        /* one thread: per batch, the master calls' wait and the transfers' time (-1: not
         * measured, several threads share the client's counters) */
        double rpc_us = -1, xfer_us = -1;
        if (nt == 1 && all.n > 0) {
            uint64_t rpc_ns = 0;
            for (unsigned m = 0; m < KVP_METRICS_RPC_MAX; m++)
                rpc_ns += w[0].m_ns[op][m];
            rpc_us = (double)rpc_ns / 1e3 / (double)all.n;
            xfer_us = (double)w[0].xfer_ns[op] / 1e3 / (double)all.n;
        }
        if (rdma) /* perftest's figure for the same verb, measured outside */
            limit = op == OP_PUT ? o->rdma_write_gbps : op == OP_GET ? o->rdma_read_gbps : 0;
        double pct = op != OP_EXIST && limit > 0 ? gbps / limit * 100 : 0;
        if (nt == 1)
            base[op] = objs_s;
        double ratio = base[op] > 0 ? objs_s / base[op] : 0;
        if (pieces == 1)
            pbase[op] = objs_s;
        double pratio = pieces > 1 && pbase[op] > 0 ? objs_s / pbase[op] : 0;
        double target = target_ratio(transport, loop, op, nt, shared, size);
        const char *tfield = target > 0 ? "ratio_to_1_thread" : "none";
        double tval = ratio;
        if (pieces > 1 && op == OP_GET && nt == 1 && pbase[op] > 0) {
            target = PIECES_TARGET;
            tfield = "ratio_to_1_piece";
            tval = pratio;
        }
        char tgt[64] = "";
        if (target > 0)
            snprintf(tgt, sizeof(tgt), "  target >= %.1fx: %s", target,
                     tval >= target ? "met" : "MISSED");
        double ws_pct = op != OP_EXIST && ws_limit > 0 ? gbps / ws_limit * 100 : 0;
        char rpc_s[16] = "-", xfer_s[16] = "-";
        if (rpc_us >= 0) {
            snprintf(rpc_s, sizeof(rpc_s), "%.1f", rpc_us);
            snprintf(xfer_s, sizeof(xfer_s), "%.1f", xfer_us);
        }
        printf("%-4s %-5s %8s %5u %5u %3u %-6s %-3s %8.2f %6.1f%% %5.0f%% %10.0f %9.1f %9.1f %9.1f "
               "%5.2fx %5.2fx %8s %8s%s\n",
               transport, op_names[op], fmt_size(size, sz, sizeof(sz)), batch, pieces, nt,
               nt == 1  ? "one"
               : shared ? "shared"
                        : "own",
               crc ? "on" : "off", gbps, pct, ws_pct, objs_s, p50, p99, p999, ratio, pratio, rpc_s,
               xfer_s, tgt);
        kvp_bench_result_begin(out, "data");
        kvp_bench_result_str(out, "op", op_names[op]);
        kvp_bench_result_str(out, "transport", transport);
        kvp_bench_result_int(out, "size", (int64_t)size);
        kvp_bench_result_int(out, "batch", batch);
        kvp_bench_result_int(out, "pieces", pieces);
        kvp_bench_result_int(out, "piece_bytes", (int64_t)(size / pieces));
        kvp_bench_result_int(out, "threads", nt);
        kvp_bench_result_str(out, "clients", clients);
        kvp_bench_result_str(out, "loop", loop >= 0 ? op_names[loop] : "none");
        kvp_bench_result_str(out, "crc", crc ? "on" : "off");
        kvp_bench_result_num(out, "gbps", gbps);
        kvp_bench_result_num(out, "objs_per_s", objs_s);
        kvp_bench_result_num(out, "objs_per_s_per_thread", objs_s / nt);
        kvp_bench_result_num(out, "ratio_to_1_thread", ratio);
        kvp_bench_result_num(out, "ratio_to_1_piece", pratio);
        kvp_bench_result_num(out, "target_ratio", target);
        kvp_bench_result_str(out, "target_field", tfield);
        const char *tdesc = "none";
        if (strcmp(tfield, "ratio_to_1_piece") == 0)
            tdesc = "issue 14: a get scattered over N pieces >= 0.8x the 1-piece get";
        else if (target == 1.8)
            tdesc = "issue 11: 4 threads on one client >= 1.8x one thread";
        else if (target == 1.0)
            tdesc = "issue 11: 4 threads on one client >= 1x one thread (2 streams): no collapse";
        kvp_bench_result_str(out, "target", tdesc);
        kvp_bench_result_str(out, "target_met",
                             target <= 0      ? "n/a"
                             : tval >= target ? "yes"
                                              : "no");
        kvp_bench_result_num(out, "p50_us", p50);
        kvp_bench_result_num(out, "p99_us", p99);
        kvp_bench_result_num(out, "p999_us", p999);
        kvp_bench_result_num(out, "obj_p50_us", p50 / batch);
        kvp_bench_result_num(out, "obj_p99_us", p99 / batch);
        kvp_bench_result_num(out, "obj_p999_us", p999 / batch);
        kvp_bench_result_num(out, "limit_gbps", op == OP_EXIST ? 0 : limit);
        kvp_bench_result_str(out, "limit",
                             op == OP_EXIST                  ? "none"
                             : rdma && limit <= 0            ? "none"
                             : rdma && op == OP_PUT          ? "ib_write_bw"
                             : rdma                          ? "ib_read_bw"
                             : strcmp(transport, "shm") == 0 ? "memcpy"
                                                             : "tcp-pump");
        kvp_bench_result_num(out, "pct_of_limit", pct);
        /* tcp: the same pump over a batch's working set (bench_limits.c), for reference */
        kvp_bench_result_num(out, "ws_limit_gbps", op == OP_EXIST ? 0 : ws_limit);
        kvp_bench_result_num(out, "pct_of_ws_limit", ws_pct);
        kvp_bench_result_int(out, "batches", (int64_t)all.n);
        /* where a batch's time went (1 thread; -1 otherwise): its master calls' wait and its
         * transfers' wall time, per batch, from the client's metrics (kvp_metrics_t) */
        kvp_bench_result_num(out, "master_rpc_us_per_batch", rpc_us);
        kvp_bench_result_num(out, "transfer_us_per_batch", xfer_us);
        /* ... and per method the op called (1 thread): rpc_<method>_us, the mean wait of
         * one call, and rpc_<method>_calls_per_batch */
        for (unsigned m = 0; nt == 1 && all.n > 0 && m < KVP_METRICS_RPC_MAX; m++) {
            const char *name = kvp_metrics_rpc_name(m);
            if (w[0].m_calls[op][m] == 0 || name == NULL)
                continue;
            char field[64];
            snprintf(field, sizeof(field), "rpc_%s_us", name);
            kvp_bench_result_num(out, field,
                                 (double)w[0].m_ns[op][m] / 1e3 / (double)w[0].m_calls[op][m]);
            snprintf(field, sizeof(field), "rpc_%s_calls_per_batch", name);
            kvp_bench_result_num(out, field, (double)w[0].m_calls[op][m] / (double)all.n);
        }
        kvp_bench_result_end(out);
        free(all.v);
    }
    for (unsigned t = 0; t < nt; t++)
        for (int op = 0; op < N_OPS; op++)
            free(w[t].lat[op].v);
    free(w);
    free(th);
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
