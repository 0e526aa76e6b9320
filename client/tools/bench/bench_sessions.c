/*
 * bench_sessions.c - kvpool-bench sessions: layer-wise KV load and save through transfer
 * sessions (kvp_batch_*_session_*, SGLang's path) against the calls without a session, on a
 * cluster of its own.
 *
 * Per transport of --transport (default tcp,shm): a master and one `kvpool serve` of
 * --segment-size (default 1 GiB) on 127.0.0.1, this client on that transport. Per layer size
 * of --sizes (default 16KiB,128KiB): 32 keys (--batch) of 32 layers each (--pieces), one
 * range per key per layer.
 *
 *  - save: a put session (start, one range call per layer for every key, end) against
 *    kvp_batch_put_from_multi of the same layers (all at once: what a save without sessions
 *    does, after the last layer); both timed whole, GB/s;
 *  - load: a get session (start, a range call per layer, end) against kvp_get_into_ranges
 *    per layer (a GetReplicaList each); repeated for --duration seconds (default 2), GB/s
 *    and the mean time of one layer's call.
 *
 * Checked, or the run fails: every call's results, and the bytes of the last load of
 * each form, compared with what was saved.
 *
 * Thread: the caller's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/tools/bench/bench.h"

#define SESS_KEYS_MAX 256u
#define SESS_LAYERS_MAX 256u

typedef struct spoint {
    uint64_t page;
    unsigned keys, layers;
    double save_sess_s, save_multi_s;
    double load_sess_s, load_ranges_s; /* per load of every layer */
    uint64_t sess_loads, ranges_loads;
} spoint_t;

/* Each layer's bytes of key k: src + (k * layers + l) * page. */
static void fill(uint8_t *p, uint64_t n, uint64_t seed)
{
    uint64_t x = kvp_bench_mix64(seed + 1);
    for (uint64_t i = 0; i + 8 <= n; i += 8) {
        x = kvp_bench_mix64(x);
        memcpy(p + i, &x, 8);
    }
}

static int check_results(const int64_t *r, unsigned n, int64_t want, const char *what)
{
    for (unsigned i = 0; i < n; i++)
        if (r[i] != want) {
            fprintf(stderr, "kvpool-bench sessions: %s: key %u: %" PRId64 " (%s)\n", what, i, r[i],
                    r[i] < 0 ? kvp_strerror((kvp_status_t)r[i]) : "short");
            return -1;
        }
    return 0;
}

static int check_st(const kvp_status_t *st, unsigned n, const char *what)
{
    for (unsigned i = 0; i < n; i++)
        if (st[i] != KVP_OK) {
            fprintf(stderr, "kvpool-bench sessions: %s: key %u: %s\n", what, i,
                    kvp_strerror(st[i]));
            return -1;
        }
    return 0;
}

typedef struct sbufs {
    const char *keys[SESS_KEYS_MAX];
    char names[SESS_KEYS_MAX][48];
    void *ptr[SESS_KEYS_MAX][1];
    size_t size[SESS_KEYS_MAX][1];
    uint64_t off[SESS_KEYS_MAX][1];
    void *const *bufs[SESS_KEYS_MAX];
    const size_t *sizes[SESS_KEYS_MAX];
    const uint64_t *offs[SESS_KEYS_MAX];
    size_t n_bufs[SESS_KEYS_MAX];
    int64_t res[SESS_KEYS_MAX];
    kvp_status_t st[SESS_KEYS_MAX];
    kvp_range_t ranges[SESS_KEYS_MAX];
} sbufs_t;

/* The range arrays of layer l: key k's buffer at base + (k * layers + l) * page. */
static void layer_ranges(sbufs_t *b, const spoint_t *p, uint8_t *base, unsigned l)
{
    for (unsigned k = 0; k < p->keys; k++) {
        b->ptr[k][0] = base + ((uint64_t)k * p->layers + l) * p->page;
        b->size[k][0] = p->page;
        b->off[k][0] = (uint64_t)l * p->page;
        b->bufs[k] = b->ptr[k];
        b->sizes[k] = b->size[k];
        b->offs[k] = b->off[k];
        b->n_bufs[k] = 1;
        b->ranges[k] = (kvp_range_t){
            .key = b->keys[k], .offset = b->off[k][0], .length = p->page, .buf = b->ptr[k][0]};
    }
}

static int save_session(kvp_client_t *c, sbufs_t *b, const spoint_t *p, uint8_t *src)
{
    uint64_t sizes[SESS_KEYS_MAX];
    for (unsigned k = 0; k < p->keys; k++)
        sizes[k] = (uint64_t)p->layers * p->page;
    kvp_batch_put_session_start(c, b->keys, sizes, p->keys, NULL, b->st);
    if (check_st(b->st, p->keys, "put session start") != 0)
        return -1;
    for (unsigned l = 0; l < p->layers; l++) {
        layer_ranges(b, p, src, l);
        kvp_batch_put_from_multi_ranges(c, b->keys, (const void *const *const *)b->bufs, b->sizes,
                                        b->offs, b->n_bufs, p->keys, b->res);
        if (check_results(b->res, p->keys, (int64_t)p->page, "put ranges") != 0)
            return -1;
    }
    kvp_batch_put_session_end(c, b->keys, p->keys, b->st);
    return check_st(b->st, p->keys, "put session end");
}

static int save_multi(kvp_client_t *c, sbufs_t *b, const spoint_t *p, uint8_t *src)
{
    static const void *ptrs[SESS_KEYS_MAX][SESS_LAYERS_MAX];
    static size_t szs[SESS_KEYS_MAX][SESS_LAYERS_MAX];
    const void *const *bufs[SESS_KEYS_MAX];
    const size_t *sizes[SESS_KEYS_MAX];
    for (unsigned k = 0; k < p->keys; k++) {
        for (unsigned l = 0; l < p->layers; l++) {
            ptrs[k][l] = src + ((uint64_t)k * p->layers + l) * p->page;
            szs[k][l] = p->page;
        }
        bufs[k] = ptrs[k];
        sizes[k] = szs[k];
        b->n_bufs[k] = p->layers;
    }
    kvp_batch_put_from_multi(c, b->keys, bufs, sizes, b->n_bufs, p->keys, NULL, b->st);
    return check_st(b->st, p->keys, "put multi");
}

static int load_session(kvp_client_t *c, sbufs_t *b, const spoint_t *p, uint8_t *dst)
{
    kvp_batch_get_session_start(c, b->keys, p->keys, b->st);
    if (check_st(b->st, p->keys, "get session start") != 0)
        return -1;
    for (unsigned l = 0; l < p->layers; l++) {
        layer_ranges(b, p, dst, l);
        kvp_batch_get_into_multi_ranges(c, b->keys, b->bufs, b->sizes, b->offs, b->n_bufs, p->keys,
                                        b->res);
        if (check_results(b->res, p->keys, (int64_t)p->page, "get ranges") != 0)
            return -1;
    }
    return kvp_batch_get_session_end(c, b->keys, p->keys) == KVP_OK ? 0 : -1;
}

static int load_ranges(kvp_client_t *c, sbufs_t *b, const spoint_t *p, uint8_t *dst)
{
    for (unsigned l = 0; l < p->layers; l++) {
        layer_ranges(b, p, dst, l);
        kvp_get_into_ranges(c, b->ranges, p->keys, b->res);
        if (check_results(b->res, p->keys, (int64_t)p->page, "get_into_ranges") != 0)
            return -1;
    }
    return 0;
}

static int run_point(kvp_client_t *c, const kvp_bench_opts_t *o, spoint_t *p)
{
    uint64_t total = (uint64_t)p->keys * p->layers * p->page;
    uint8_t *src = malloc(total), *dst = malloc(total);
    sbufs_t *b = calloc(1, sizeof(*b));
    int rc = -1;
    if (src == NULL || dst == NULL || b == NULL)
        goto out;
    fill(src, total, p->page);
    for (unsigned k = 0; k < p->keys; k++) {
        snprintf(b->names[k], sizeof(b->names[k]), "bench-sess/m/%" PRIu64 "/%u", p->page, k);
        b->keys[k] = b->names[k];
    }
    double t0 = kvp_bench_now();
    if (save_multi(c, b, p, src) != 0)
        goto out;
    p->save_multi_s = kvp_bench_now() - t0;
    for (unsigned k = 0; k < p->keys; k++)
        kvp_remove(c, b->keys[k]);
    for (unsigned k = 0; k < p->keys; k++)
        snprintf(b->names[k], sizeof(b->names[k]), "bench-sess/s/%" PRIu64 "/%u", p->page, k);
    t0 = kvp_bench_now();
    if (save_session(c, b, p, src) != 0)
        goto out;
    p->save_sess_s = kvp_bench_now() - t0;
    double dur = o->duration_s > 0 ? o->duration_s : 2.0;
    /* the two loads alternate, so both see the same machine */
    double sess = 0, ranges = 0, end = kvp_bench_now() + 2 * dur;
    p->sess_loads = p->ranges_loads = 0;
    while (kvp_bench_now() < end || p->sess_loads == 0) {
        memset(dst, 0, total);
        t0 = kvp_bench_now();
        if (load_session(c, b, p, dst) != 0)
            goto out;
        sess += kvp_bench_now() - t0;
        p->sess_loads++;
        if (memcmp(dst, src, total) != 0) {
            fprintf(stderr, "kvpool-bench sessions: a session load read other bytes\n");
            goto out;
        }
        memset(dst, 0, total);
        t0 = kvp_bench_now();
        if (load_ranges(c, b, p, dst) != 0)
            goto out;
        ranges += kvp_bench_now() - t0;
        p->ranges_loads++;
        if (memcmp(dst, src, total) != 0) {
            fprintf(stderr, "kvpool-bench sessions: a ranged load read other bytes\n");
            goto out;
        }
    }
    p->load_sess_s = sess / (double)p->sess_loads;
    p->load_ranges_s = ranges / (double)p->ranges_loads;
    rc = 0;
out:
    for (unsigned k = 0; b != NULL && k < p->keys; k++)
        kvp_remove(c, b->keys[k]);
    free(src);
    free(dst);
    free(b);
    return rc;
}

static void report(kvp_bench_out_t *out, const char *transport, const spoint_t *p)
{
    double bytes = (double)p->keys * p->layers * (double)p->page;
    double ss = bytes / p->save_sess_s / 1e9, sm = bytes / p->save_multi_s / 1e9;
    double ls = bytes / p->load_sess_s / 1e9, lr = bytes / p->load_ranges_s / 1e9;
    double ls_us = p->load_sess_s / p->layers * 1e6, lr_us = p->load_ranges_s / p->layers * 1e6;
    printf("  %-4s %3u keys x %3u layers x %7" PRIu64 " B  save: session %6.2f GB/s, multi %6.2f "
           "GB/s  load: session %6.2f GB/s (%.0f us/layer), ranges %6.2f GB/s (%.0f us/layer), "
           "%.2fx\n",
           transport, p->keys, p->layers, p->page, ss, sm, ls, ls_us, lr, lr_us, ls / lr);
    kvp_bench_result_begin(out, "sessions");
    kvp_bench_result_str(out, "transport", transport);
    kvp_bench_result_int(out, "keys", p->keys);
    kvp_bench_result_int(out, "layers", p->layers);
    kvp_bench_result_int(out, "layer_bytes", (int64_t)p->page);
    kvp_bench_result_num(out, "save_session_gbps", ss);
    kvp_bench_result_num(out, "save_multi_gbps", sm);
    kvp_bench_result_num(out, "load_session_gbps", ls);
    kvp_bench_result_num(out, "load_ranges_gbps", lr);
    kvp_bench_result_num(out, "load_session_us_per_layer", ls_us);
    kvp_bench_result_num(out, "load_ranges_us_per_layer", lr_us);
    kvp_bench_result_num(out, "load_session_ratio_to_ranges", ls / lr);
    kvp_bench_result_end(out);
}

int kvp_bench_sessions(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    static const uint64_t def_sizes[] = {16u << 10, 128u << 10};
    const uint64_t *sizes = o->n_sizes > 0 ? o->sizes : def_sizes;
    size_t n_sizes = o->n_sizes > 0 ? o->n_sizes : 2;
    static const char *def_transports[] = {"tcp", "shm"};
    const char *const *transports = o->n_transports > 0 ? o->transports : def_transports;
    size_t n_transports = o->n_transports > 0 ? o->n_transports : 2;
    uint64_t seg = o->segment_size_set ? o->segment_size : 1ull << 30;
    unsigned keys = o->n_batches > 0 ? o->batches[0] : 32;
    unsigned layers = o->n_pieces > 0 && o->pieces[0] > 1 ? o->pieces[0] : 32;
    if (keys == 0 || keys > SESS_KEYS_MAX || layers > SESS_LAYERS_MAX) {
        fprintf(stderr, "kvpool-bench sessions: --batch 1..%u keys, --pieces 2..%u layers\n",
                SESS_KEYS_MAX, SESS_LAYERS_MAX);
        return 1;
    }
    int rc = 0;
    printf("sessions: layer-wise save and load, one segment of %" PRIu64 " MiB per transport\n",
           seg >> 20);
    for (size_t t = 0; t < n_transports && rc == 0; t++) {
        const char *tr = transports[t];
        if (strcmp(tr, "tcp") != 0 && strcmp(tr, "shm") != 0)
            continue; /* (rdma: the VM's runs) */
        setenv("KVPOOL_TRANSPORT", tr, 1);
        kvp_bench_cluster_t cl;
        kvp_bench_cluster_params_t cp = {.n = 1, .seg_size = seg};
        int started = kvp_bench_cluster_start_params(&cl, &cp);
        unsetenv("KVPOOL_TRANSPORT");
        if (started != 0)
            return 1;
        kvp_client_params_t p;
        kvp_client_params_init(&p);
        p.master_addr = cl.master_addr;
        p.transport = tr;
        kvp_client_t *c = NULL;
        kvp_status_t st = kvp_client_create(&p, &c);
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench sessions: client: %s\n", kvp_strerror(st));
            rc = 1;
        }
        for (size_t s = 0; rc == 0 && s < n_sizes; s++) {
            spoint_t pt = {.page = sizes[s], .keys = keys, .layers = layers};
            if ((uint64_t)keys * layers * sizes[s] * 2 > seg) {
                printf("  %-4s %u x %u x %" PRIu64 " B: skipped, not twice in the segment "
                       "(--segment-size)\n",
                       tr, keys, layers, sizes[s]);
                continue;
            }
            if (run_point(c, o, &pt) != 0) {
                rc = 1;
                break;
            }
            report(out, tr, &pt);
        }
        kvp_client_destroy(c);
        kvp_bench_cluster_stop(&cl);
    }
    return rc;
}
