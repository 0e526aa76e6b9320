/*
 * bench_te.c - kvpool-bench te: the transfer engine (kvpool_te.h, mooncake.engine) as
 * vLLM's MooncakeConnector drives it: batch_transfer_sync_write of runs of one size from
 * this process (the prefill) into the registered memory of a second process (the decode,
 * forked per point), each run to its own place.
 *
 * Per transport (tcp: the rpc port; shm: the same-host route, process_vm_writev after the
 * target's check, or its Unix socket; rdma: one-sided WRITE into the target's memory regions,
 * the source registered too), run size and batch: batches back to back for
 * --duration seconds. Both sides' memory is touched before the first batch (vLLM's KV
 * cache is resident). The first batch is checked byte for byte by the target. Its limit is
 * measured in the same run, interleaved with it: TE_ROUNDS rounds, each a slice of batches,
 * a slice of the limit and a slice of a second figure, the limit always next to the engine
 * (engine, limit, second; the other way round every other round), so that a machine that
 * other work slows or frees moves both sides alike. The limit moves the batch's own bytes by
 * the plain mechanism: tcp the 2-stream loopback socket pump of the run size (the engine's
 * default KVPOOL_TE_STREAMS) whose senders and receivers each cycle through their stream's
 * share of the batch's runs (batch / 2 buffers of the run size each, allocated and touched
 * before its clock starts), shm a memcpy of the batch's runs to the same places of a buffer
 * of this process. The second figure: on tcp the same pump with one buffer a thread, which
 * stays in cache as no batch of these shapes does (the batch's working set is 2-256 MiB a
 * side; measured here and on a 16-vCPU machine, the pump itself loses 10-30 % going from one
 * buffer to the batch's; docs/benchmarks.md, "te"): one_buffer_gbps, pct_of_one_buffer and
 * the rounds' median, reported, not a target; on shm the kernel's cross-process copy alone:
 * process_vm_writev of the batch's runs to their places in the target, one call per batch
 * from one thread, no round trip (kernel_copy_gbps, pct_of_kernel_copy; reported, not a
 * target). Reported: GB/s and limit_gbps over all rounds, batches, p50/p99 of a batch,
 * pct_of_limit (of the totals), the rounds' ratios and their median, and the target (issue
 * 48: tcp >= 90 % of the pump, shm >= 85 % of memcpy) checked on that median, met or
 * missed. rdma's limit is not measured here but
 * given (--rdma-write-limit: ib_write_bw of the same session, deploy/bench-rdma.sh; target
 * 85 %; without it no target is checked). A missed target does not fail the mode (it is
 * reported; a failed transfer or wrong bytes does).
 *
 * Memory: source and target of size x batch each (and the memcpy limit's copy, or the tcp
 * pump's senders' and receivers' buffers, the batch's bytes twice, while it runs), at most
 * 256 MiB a batch (points past it are skipped, said).
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/include/kvpool_te.h"
#include "client/tools/bench/bench.h"

#define TE_MAX_BYTES (256ull << 20)
#define TE_STREAMS 2
#define TE_TARGET_TCP 90.0
#define TE_TARGET_SHM 85.0
#define TE_TARGET_RDMA 85.0
#define TE_ROUNDS 4

typedef struct te_hello {
    int32_t status; /* kvp_status_t of the target's setup */
    uint16_t port;
    uint64_t addr;
} te_hello_t;

/* The byte run i of the source holds at j (and the target holds at place batch-1-i). */
static inline uint8_t te_byte(uint64_t size, unsigned i, uint64_t j)
{
    return (uint8_t)kvp_bench_mix64((uint64_t)i * size + j);
}

static bool full_read(int fd, void *p, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

/* The decode side, in the child: registers total resident bytes, says where, then answers
 * 'c' (check the batch's bytes: 1 right, 0 wrong) until the parent closes the pipe. */
static void te_target(const char *tr, uint64_t size, unsigned batch, int in, int outfd)
{
    uint64_t total = size * batch;
    te_hello_t h = {.status = KVP_OK};
    kvp_te_t *te = NULL;
    uint8_t *dst = malloc(total);
    if (dst == NULL)
        h.status = KVP_ERR_NOMEM;
    else
        memset(dst, 0, total); /* resident, as a KV cache is */
    if (h.status == KVP_OK)
        h.status = kvp_te_create("127.0.0.1", "P2PHANDSHAKE", tr, &te);
    if (h.status == KVP_OK)
        h.status = kvp_te_register(te, dst, total);
    if (h.status == KVP_OK) {
        h.port = kvp_te_rpc_port(te);
        h.addr = (uintptr_t)dst;
    }
    if (write(outfd, &h, sizeof(h)) == (ssize_t)sizeof(h) && h.status == KVP_OK) {
        char cmd;
        while (read(in, &cmd, 1) == 1 && cmd == 'c') {
            char ok = 1;
            for (unsigned i = 0; i < batch && ok; i++) {
                const uint8_t *p = dst + (uint64_t)(batch - 1 - i) * size;
                for (uint64_t j = 0; j < size; j++)
                    if (p[j] != te_byte(size, i, j)) {
                        fprintf(stderr, "kvpool-bench te: %s: run %u: wrong bytes at %" PRIu64 "\n",
                                tr, i, j);
                        ok = 0;
                        break;
                    }
            }
            if (write(outfd, &ok, 1) != 1)
                break;
        }
    }
    kvp_te_destroy(te);
    free(dst);
    _exit(0);
}

/* memcpy of the batch's runs to the same places of a buffer of ours, for duration: GB/s. */
static double te_memcpy_gbps(void *const *locals, uint8_t *dst, uint64_t size, unsigned batch,
                             double duration)
{
    double t0 = kvp_bench_now(), t = t0;
    uint64_t n = 0;
    while (t - t0 < duration) {
        for (unsigned i = 0; i < batch; i++)
            memcpy(dst + (uint64_t)(batch - 1 - i) * size, locals[i], size);
        __asm__ volatile("" ::"r"(dst) : "memory"); /* the copies happen */
        n++;
        t = kvp_bench_now();
    }
    return (double)n * (double)size * batch / (t - t0) / 1e9;
}

/* The kernel's copy alone: process_vm_writev of the batch's runs into pid, one call a batch
 * (up to IOV_MAX runs), for duration: GB/s, or 0 when a call fails. */
static double te_kernel_copy_gbps(pid_t pid, void *const *locals, const uint64_t *remotes,
                                  uint64_t size, unsigned batch, double duration)
{
    struct iovec l[1024], r[1024];
    if (batch > 1024)
        return 0;
    for (unsigned i = 0; i < batch; i++) {
        l[i] = (struct iovec){.iov_base = locals[i], .iov_len = size};
        r[i] = (struct iovec){.iov_base = (void *)(uintptr_t)remotes[i], .iov_len = size};
    }
    double t0 = kvp_bench_now(), t = t0;
    uint64_t n = 0;
    while (t - t0 < duration) {
        if (process_vm_writev(pid, l, batch, r, batch, 0) != (ssize_t)(size * batch))
            return 0;
        n++;
        t = kvp_bench_now();
    }
    return (double)n * (double)size * batch / (t - t0) / 1e9;
}

/* The median of a point's per-round ratios (the array left as it is). */
static double rounds_median(const double ratios[TE_ROUNDS])
{
    double rs[TE_ROUNDS];
    memcpy(rs, ratios, sizeof(rs));
    return kvp_bench_percentile(rs, TE_ROUNDS, 50);
}

typedef struct te_tally {
    unsigned met, missed;
    char missed_list[1024];
} te_tally_t;

/* One point's setup: this process's engine and buffers, the target process and where its
 * memory is. */
typedef struct te_run {
    const char *tr;
    bool tcp, rdma;
    uint64_t size, total; /* a run's bytes; the batch's */
    unsigned batch;
    unsigned pump_n; /* tcp: the pump's buffers a stream (its share of the batch's runs) */
    kvp_te_t *src_te;
    uint8_t *src, *mdst; /* the source's runs; shm: the memcpy limit's copy */
    void **locals;
    uint64_t *remotes, *lens;
    int to_child[2], from_child[2];
    pid_t pid;
    char target[64];
} te_run_t;

/* What a point's rounds measured. */
typedef struct te_figures {
    uint64_t n;                 /* batches the engine wrote ... */
    double te_time;             /* ... in this many seconds */
    double lim_bytes, lim_time; /* the limit's bytes and seconds */
    double alt_bytes;           /* the second figure's (tcp: one-buffer pump, shm: kernel
                                 * copy) bytes; -1: a measurement of it failed */
    double ratios[TE_ROUNDS], alt_ratios[TE_ROUNDS]; /* each round's % of either */
    kvp_bench_lat_t lat;                             /* each batch's time */
} te_figures_t;

/* Fork the target of r (r->tr, size, batch set), make this process's engine, and write the
 * batch once, checked byte for byte by the target: 0, or 1 (said on stderr). Whatever was
 * made is r's (te_stop). */
static int te_start(te_run_t *r)
{
    r->total = r->size * r->batch;
    /* tcp's pump moves the batch's bytes: each stream's sender and receiver cycle through
     * its share of the batch's runs, as the engine's streams do, in these very buffers
     * (src, and mdst for what it receives): a pump over pages of its own, allocated a slice
     * at a time, ran at a twentieth of the engine's rate at 128 MiB batches, its new pages
     * in the VM's slow memory (docs/benchmarks.md "Memory footprint") */
    r->pump_n = (r->batch + TE_STREAMS - 1) / TE_STREAMS;
    uint64_t room = r->tcp ? (uint64_t)r->pump_n * TE_STREAMS * r->size : r->total;
    r->src = malloc(room);
    r->locals = calloc(r->batch, sizeof(void *));
    r->remotes = calloc(r->batch, sizeof(uint64_t));
    r->lens = calloc(r->batch, sizeof(uint64_t));
    if (r->src == NULL || r->locals == NULL || r->remotes == NULL || r->lens == NULL) {
        fprintf(stderr, "kvpool-bench te: no memory for %" PRIu64 " bytes\n", r->total);
        return 1;
    }
    for (unsigned i = 0; i < r->batch; i++)
        for (uint64_t j = 0; j < r->size; j++)
            r->src[(uint64_t)i * r->size + j] = te_byte(r->size, i, j);
    fflush(stdout);
    fflush(stderr);
    if (pipe(r->to_child) != 0 || pipe(r->from_child) != 0 || (r->pid = fork()) < 0) {
        perror("kvpool-bench te: pipe/fork");
        return 1;
    }
    if (r->pid == 0) {
        close(r->to_child[1]);
        close(r->from_child[0]);
        te_target(r->tr, r->size, r->batch, r->to_child[0], r->from_child[1]);
    }
    close(r->to_child[0]);
    close(r->from_child[1]);
    r->to_child[0] = r->from_child[1] = -1;
    te_hello_t h;
    if (!full_read(r->from_child[0], &h, sizeof(h))) {
        fprintf(stderr, "kvpool-bench te: %s: the target process did not start\n", r->tr);
        return 1;
    }
    kvp_status_t st = h.status;
    if (st == KVP_OK)
        st = kvp_te_create("127.0.0.1", "P2PHANDSHAKE", r->tr, &r->src_te);
    if (st == KVP_OK && r->rdma) /* rdma moves registered memory only */
        st = kvp_te_register(r->src_te, r->src, r->total);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench te: %s: %s\n", r->tr, kvp_strerror(st));
        return 1;
    }
    snprintf(r->target, sizeof(r->target), "127.0.0.1:%u", h.port);
    for (unsigned i = 0; i < r->batch; i++) {
        /* run i of the source to place batch-1-i of the target: no run lands in place */
        r->locals[i] = r->src + (uint64_t)i * r->size;
        r->remotes[i] = h.addr + (uint64_t)(r->batch - 1 - i) * r->size;
        r->lens[i] = r->size;
    }
    st = kvp_te_transfer(r->src_te, r->target, KVP_TE_WRITE, r->batch, r->locals, r->remotes,
                         r->lens);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench te: %s: write: %s\n", r->tr, kvp_strerror(st));
        return 1;
    }
    char ok = 0;
    if (write(r->to_child[1], "c", 1) != 1 || !full_read(r->from_child[0], &ok, 1) || !ok) {
        fprintf(stderr, "kvpool-bench te: %s: the target did not get the batch's bytes\n", r->tr);
        return 1;
    }
    if (!r->rdma && (r->mdst = malloc(room)) == NULL) {
        fprintf(stderr, "kvpool-bench te: no memory for %" PRIu64 " bytes\n", room);
        return 1;
    }
    if (r->mdst != NULL)
        memset(r->mdst, 0, room);
    if (room > r->total) /* an odd batch: the pump's last run, past the batch's */
        memset(r->src + r->total, 7, room - r->total);
    return 0;
}

/* Undo te_start, whatever it got to: the engine, the pipes, the target (killed, reaped),
 * the buffers. */
static void te_stop(te_run_t *r)
{
    kvp_te_destroy(r->src_te);
    for (int i = 0; i < 2; i++) {
        if (r->to_child[i] >= 0)
            close(r->to_child[i]);
        if (r->from_child[i] >= 0)
            close(r->from_child[i]);
    }
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, NULL, 0);
    }
    free(r->src);
    free(r->mdst);
    free(r->locals);
    free(r->remotes);
    free(r->lens);
}

/* The engine's slice: batches back to back for `slice` seconds, each timed into f. Its GB/s
 * in *gbps_p; 0, or 1 when a write failed (said). */
static int te_engine_slice(te_run_t *r, double slice, te_figures_t *f, double *gbps_p)
{
    double t0 = kvp_bench_now(), t = t0;
    uint64_t rn = 0;
    while (t - t0 < slice) {
        double b0 = t;
        kvp_status_t st = kvp_te_transfer(r->src_te, r->target, KVP_TE_WRITE, r->batch, r->locals,
                                          r->remotes, r->lens);
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench te: %s: write: %s\n", r->tr, kvp_strerror(st));
            return 1;
        }
        t = kvp_bench_now();
        kvp_bench_lat_add(&f->lat, t - b0);
        rn++;
    }
    f->n += rn;
    f->te_time += t - t0;
    *gbps_p = (double)rn * (double)r->total / (t - t0) / 1e9;
    return 0;
}

/* Round `round` of a point: a slice of the engine, of its limit and of the second figure
 * (the other way round in odd rounds: the limit always next to the engine), into f. 0, or 1
 * when the engine or the limit failed (said). */
static int te_round(const kvp_bench_opts_t *o, te_run_t *r, unsigned round, double slice,
                    te_figures_t *f)
{
    double rg = 0, rl = 0, ra = 0; /* this round's GB/s: engine, limit, second figure */
    for (unsigned step = 0; step < 3; step++) {
        unsigned what = round % 2 == 0 ? step : 2 - step;
        if (what == 0) {
            if (te_engine_slice(r, slice, f, &rg) != 0)
                return 1;
        } else if (what == 1 && r->rdma) { /* given, not measured (0: none) */
            rl = o->rdma_write_gbps;
        } else if (what == 1) {
            rl = r->tcp ? kvp_bench_measure_tcp_pump_gbps(r->size, TE_STREAMS, r->pump_n, slice,
                                                          r->src, r->mdst)
                        : te_memcpy_gbps(r->locals, r->mdst, r->size, r->batch, slice);
            if (rl <= 0) {
                fprintf(stderr, "kvpool-bench te: %s: the limit (%s) failed\n", r->tr,
                        r->tcp ? "tcp pump" : "memcpy");
                return 1;
            }
            f->lim_bytes += rl * 1e9 * slice;
            f->lim_time += slice;
        } else if (!r->rdma) {
            ra = r->tcp
                     ? kvp_bench_measure_tcp_pump_gbps(r->size, TE_STREAMS, 1, slice, NULL, NULL)
                     : te_kernel_copy_gbps(r->pid, r->locals, r->remotes, r->size, r->batch, slice);
            f->alt_bytes = f->alt_bytes < 0 || ra <= 0 ? -1 : f->alt_bytes + ra * 1e9 * slice;
        }
    }
    f->ratios[round] = rl > 0 ? 100 * rg / rl : 0;
    f->alt_ratios[round] = ra > 0 ? 100 * rg / ra : 0;
    return 0;
}

/* A point's figures: its line on stdout, its JSON result, the tally of targets. */
static void te_report(const kvp_bench_opts_t *o, kvp_bench_out_t *out, te_tally_t *tally,
                      const te_run_t *r, const te_figures_t *f, double slice)
{
    const char *tr = r->tr;
    bool tcp = r->tcp, rdma = r->rdma;
    const char *limit_name = rdma ? "ib_write_bw" : tcp ? "tcp-pump-batch" : "memcpy";
    double gbps = (double)f->n * (double)r->total / f->te_time / 1e9;
    double limit = rdma ? o->rdma_write_gbps : f->lim_bytes / f->lim_time / 1e9;
    double median = rounds_median(f->ratios), alt_median = rounds_median(f->alt_ratios);
    /* 0: not measured (rdma), or a measurement failed */
    double alt = !rdma && f->alt_bytes > 0 ? f->alt_bytes / (slice * TE_ROUNDS) / 1e9 : 0;
    double pct = limit > 0 ? 100 * gbps / limit : 0, alt_pct = alt > 0 ? 100 * gbps / alt : 0;
    double want = rdma ? TE_TARGET_RDMA : tcp ? TE_TARGET_TCP : TE_TARGET_SHM;
    bool checked = limit > 0, met = median >= want; /* rdma without --rdma-write-limit: none */
    double p50 = kvp_bench_percentile(f->lat.v, f->lat.n, 50) * 1e6;
    double p99 = kvp_bench_percentile(f->lat.v, f->lat.n, 99) * 1e6;
    printf("  %-4s %8" PRIu64 " KiB x %4u  %6.2f GB/s  %6.2f %-14s %5.1f %%  rounds", tr,
           r->size >> 10, r->batch, gbps, limit, limit_name, pct);
    for (unsigned i = 0; i < TE_ROUNDS; i++)
        printf(" %.0f", f->ratios[i]);
    if (checked)
        printf("  median %5.1f %% (>= %.0f %%: %s)", median, want, met ? "met" : "MISSED");
    else
        printf("  (no --rdma-write-limit: no target checked)");
    if (alt > 0)
        printf("  %s %.2f GB/s: %.0f %% (median %.0f %%)", tcp ? "one-buffer pump" : "kernel copy",
               alt, alt_pct, alt_median);
    printf("  p50 %7.0f us  p99 %7.0f us\n", p50, p99);
    if (checked && met)
        tally->met++;
    else if (checked) {
        tally->missed++;
        size_t l = strlen(tally->missed_list);
        snprintf(tally->missed_list + l, sizeof(tally->missed_list) - l, " %s/%" PRIu64 "KiBx%u",
                 tr, r->size >> 10, r->batch);
    }
    kvp_bench_result_begin(out, "te");
    kvp_bench_result_str(out, "op", "batch_transfer_sync_write");
    kvp_bench_result_str(out, "transport", tr);
    kvp_bench_result_int(out, "size", (int64_t)r->size);
    kvp_bench_result_int(out, "batch", r->batch);
    kvp_bench_result_num(out, "gbps", gbps);
    kvp_bench_result_int(out, "batches", (int64_t)f->n);
    kvp_bench_result_num(out, "p50_us", p50);
    kvp_bench_result_num(out, "p99_us", p99);
    kvp_bench_result_str(out, "limit", limit_name);
    kvp_bench_result_int(out, "limit_streams", tcp ? TE_STREAMS : 0);
    kvp_bench_result_num(out, "limit_gbps", limit);
    kvp_bench_result_num(out, "pct_of_limit", pct);
    kvp_bench_result_int(out, "rounds", TE_ROUNDS);
    for (unsigned i = 0; i < TE_ROUNDS; i++) {
        char key[32];
        snprintf(key, sizeof(key), "pct_round_%u", i + 1);
        kvp_bench_result_num(out, key, f->ratios[i]);
    }
    kvp_bench_result_num(out, "pct_median", median);
    if (tcp) {
        kvp_bench_result_int(out, "limit_bufs_per_stream", r->pump_n);
        kvp_bench_result_num(out, "one_buffer_gbps", alt);
        kvp_bench_result_num(out, "pct_of_one_buffer", alt_pct);
        kvp_bench_result_num(out, "pct_one_buffer_median", alt_median);
    } else if (!rdma) {
        kvp_bench_result_num(out, "kernel_copy_gbps", alt);
        kvp_bench_result_num(out, "pct_of_kernel_copy", alt_pct);
        kvp_bench_result_num(out, "pct_kernel_copy_median", alt_median);
    }
    kvp_bench_result_num(out, "target_pct", want);
    kvp_bench_result_str(out, "target_met", !checked ? "none" : met ? "met" : "missed");
    kvp_bench_result_end(out);
}

/* One point (transport tr, runs of size, batch of them): started, measured in TE_ROUNDS
 * rounds, reported. 0, or 1 when it could not be measured (said). */
static int te_point(const kvp_bench_opts_t *o, kvp_bench_out_t *out, te_tally_t *tally,
                    const char *tr, uint64_t size, unsigned batch)
{
    te_run_t r = {.tr = tr,
                  .tcp = strcmp(tr, "tcp") == 0,
                  .rdma = strcmp(tr, "rdma") == 0,
                  .size = size,
                  .batch = batch,
                  .to_child = {-1, -1},
                  .from_child = {-1, -1},
                  .pid = -1};
    te_figures_t f = {0};
    double slice = o->duration_s / TE_ROUNDS;
    int rc = te_start(&r);
    for (unsigned round = 0; rc == 0 && round < TE_ROUNDS; round++)
        rc = te_round(o, &r, round, slice, &f);
    if (rc == 0)
        te_report(o, out, tally, &r, &f, slice);
    free(f.lat.v);
    te_stop(&r);
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
    te_tally_t tally = {0};
    printf("== te: batch_transfer_sync_write from this process into a second one's registered "
           "memory (%.1f s per point, interleaved with its limit) ==\n",
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
                rc |= te_point(o, out, &tally, tr, sizes[s], batches[b]);
            }
    }
    printf("  te: targets met at %u of %u points%s%s\n", tally.met, tally.met + tally.missed,
           tally.missed ? "; missed:" : "", tally.missed_list);
    return rc;
}
