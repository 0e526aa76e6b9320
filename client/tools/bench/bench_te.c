/*
 * bench_te.c - kvpool-bench te: the transfer engine (kvpool_te.h, mooncake.engine) as
 * vLLM's MooncakeConnector drives it, batch_transfer_sync_write of runs of one size into
 * a second engine's registered memory, here in one process (both engines' threads on this
 * machine's CPUs, as a prefill and a decode of one host would be).
 *
 * Per transport (tcp: the rpc port; shm: the Unix socket), run size and batch: batches
 * back to back for --duration seconds, each writing `batch` runs from a source buffer
 * into the target's, every run to its own place. The first batch of each point is
 * checked byte for byte. Reported: GB/s, batches, p50/p99 of a batch, and the limit of
 * this run (limits mode's measures): tcp the 2-stream loopback socket pump of the run
 * size (the engine's default KVPOOL_TE_STREAMS), shm memcpy; pct_of_limit.
 *
 * Memory: source and target of size x batch each, at most 256 MiB (points past it are
 * skipped, said).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/include/kvpool_te.h"
#include "client/tools/bench/bench.h"

#define TE_MAX_BYTES (256ull << 20)
#define TE_STREAMS 2

static int te_point(const kvp_bench_opts_t *o, kvp_bench_out_t *out, const char *tr, uint64_t size,
                    unsigned batch)
{
    uint64_t total = size * batch;
    kvp_te_t *dst_te = NULL, *src_te = NULL;
    uint8_t *src = malloc(total), *dst = calloc(1, total);
    void **locals = calloc(batch, sizeof(void *));
    uint64_t *remotes = calloc(batch, sizeof(uint64_t)), *lens = calloc(batch, sizeof(uint64_t));
    kvp_bench_lat_t lat = {0};
    int rc = 1;
    if (src == NULL || dst == NULL || locals == NULL || remotes == NULL || lens == NULL) {
        fprintf(stderr, "kvpool-bench te: no memory for %" PRIu64 " bytes\n", total);
        goto out;
    }
    for (uint64_t i = 0; i < total; i++)
        src[i] = (uint8_t)kvp_bench_mix64(i);
    kvp_status_t st = kvp_te_create("127.0.0.1", "P2PHANDSHAKE", tr, &dst_te);
    if (st == KVP_OK)
        st = kvp_te_create("127.0.0.1", "P2PHANDSHAKE", tr, &src_te);
    if (st == KVP_OK)
        st = kvp_te_register(dst_te, dst, total);
    if (st == KVP_OK && strcmp(tr, "rdma") == 0) /* rdma moves registered memory only */
        st = kvp_te_register(src_te, src, total);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench te: %s: %s\n", tr, kvp_strerror(st));
        goto out;
    }
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%u", kvp_te_rpc_port(dst_te));
    for (unsigned i = 0; i < batch; i++) {
        /* run i of the source to place batch-1-i of the target: no run lands in place */
        locals[i] = src + (uint64_t)i * size;
        remotes[i] = (uintptr_t)(dst + (uint64_t)(batch - 1 - i) * size);
        lens[i] = size;
    }
    st = kvp_te_transfer(src_te, target, KVP_TE_WRITE, batch, locals, remotes, lens);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench te: %s: write: %s\n", tr, kvp_strerror(st));
        goto out;
    }
    for (unsigned i = 0; i < batch; i++)
        if (memcmp(dst + (uint64_t)(batch - 1 - i) * size, locals[i], size) != 0) {
            fprintf(stderr, "kvpool-bench te: %s: run %u: wrong bytes\n", tr, i);
            goto out;
        }
    double t0 = kvp_bench_now(), t = t0;
    uint64_t n = 0;
    while (t - t0 < o->duration_s) {
        double b0 = t;
        st = kvp_te_transfer(src_te, target, KVP_TE_WRITE, batch, locals, remotes, lens);
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench te: %s: write: %s\n", tr, kvp_strerror(st));
            goto out;
        }
        t = kvp_bench_now();
        kvp_bench_lat_add(&lat, t - b0);
        n++;
    }
    double gbps = (double)n * (double)total / (t - t0) / 1e9;
    bool tcp = strcmp(tr, "tcp") == 0;
    /* rdma: ib_write_bw of this session (--rdma-write-limit), 0 when not given */
    bool rdma = strcmp(tr, "rdma") == 0;
    const char *limit_name = rdma ? "ib_write_bw" : tcp ? "tcp-pump" : "memcpy";
    double limit = rdma  ? o->rdma_write_gbps
                   : tcp ? kvp_bench_limit_tcp_gbps(size, TE_STREAMS)
                         : kvp_bench_limit_memcpy_gbps(size);
    double p50 = kvp_bench_percentile(lat.v, lat.n, 50) * 1e6;
    double p99 = kvp_bench_percentile(lat.v, lat.n, 99) * 1e6;
    printf("  %-4s %8" PRIu64
           " KiB x %4u  %7.2f GB/s  %6.1f %% of %s  p50 %9.0f us  p99 %9.0f us\n",
           tr, size >> 10, batch, gbps, limit > 0 ? 100 * gbps / limit : 0, limit_name, p50, p99);
    kvp_bench_result_begin(out, "te");
    kvp_bench_result_str(out, "op", "batch_transfer_sync_write");
    kvp_bench_result_str(out, "transport", tr);
    kvp_bench_result_int(out, "size", (int64_t)size);
    kvp_bench_result_int(out, "batch", batch);
    kvp_bench_result_num(out, "gbps", gbps);
    kvp_bench_result_int(out, "batches", (int64_t)n);
    kvp_bench_result_num(out, "p50_us", p50);
    kvp_bench_result_num(out, "p99_us", p99);
    kvp_bench_result_str(out, "limit", limit_name);
    kvp_bench_result_int(out, "limit_streams", tcp ? TE_STREAMS : 0);
    kvp_bench_result_num(out, "limit_gbps", limit);
    kvp_bench_result_num(out, "pct_of_limit", limit > 0 ? 100 * gbps / limit : 0);
    kvp_bench_result_end(out);
    rc = 0;
out:
    kvp_te_destroy(src_te);
    kvp_te_destroy(dst_te);
    free(lat.v);
    free(src);
    free(dst);
    free(locals);
    free(remotes);
    free(lens);
    return rc;
}

int kvp_bench_te(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    static const uint64_t def_sizes[] = {64u << 10, 256u << 10, 1u << 20, 4u << 20};
    static const unsigned def_batches[] = {32, 128, 512};
    const uint64_t *sizes = o->sizes_set ? o->sizes : def_sizes;
    size_t n_sizes = o->sizes_set ? o->n_sizes : 4;
    const unsigned *batches = o->batches_set ? o->batches : def_batches;
    size_t n_batches = o->batches_set ? o->n_batches : 3;
    int rc = 0;
    for (size_t s = 0; s < n_sizes; s++)
        if (kvp_bench_limits_ensure(o, sizes[s], TE_STREAMS) != 0)
            rc = 1;
    printf("== te: batch_transfer_sync_write between two engines of this process (%.1f s per "
           "point) ==\n",
           o->duration_s);
    for (size_t t = 0; t < o->n_transports; t++) {
        const char *tr = o->transports[t];
        if (strcmp(tr, "tcp") != 0 && strcmp(tr, "shm") != 0 && strcmp(tr, "rdma") != 0) {
            printf("  %s: not in the transfer engine yet, skipped\n", tr);
            continue;
        }
        for (size_t s = 0; s < n_sizes; s++)
            for (size_t b = 0; b < n_batches; b++) {
                if (sizes[s] * batches[b] > TE_MAX_BYTES) {
                    printf("  %-4s %8" PRIu64 " KiB x %4u  skipped: over %llu MiB a batch\n", tr,
                           sizes[s] >> 10, batches[b], TE_MAX_BYTES >> 20);
                    continue;
                }
                rc |= te_point(o, out, tr, sizes[s], batches[b]);
            }
    }
    return rc;
}
