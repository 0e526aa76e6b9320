/*
 * bench_ssd.c - kvpool-bench ssd: the SSD tier against the disk's own
 * figures measured in the same run.
 *
 * DESIGN
 * Always a local cluster of its own: a master with --promote-on-hit off (so
 * objects read from SSD stay there and every read of them is an SSD read)
 * and one `kvpool serve` with a DRAM segment (--segment-size, default
 * 256 MiB) and an SSD segment (--ssd-size, default 2 GiB) whose file is in
 * --ssd-dir (refused on tmpfs; removed at the end). The disk limits come
 * from the limits mode's code (bench_limits.c: io_uring O_DIRECT, 1 MiB
 * blocks, KVP_SSD_IO_DEPTH in flight), measured first. One client thread,
 * one client (transport: the client's choice unless one --transport is
 * given), objects of 1 MiB, batches of 32, CRC32C checked on every get.
 *
 *   get_ssd   --ssd-objects objects put with medium "ssd", then
 *             batch_get_into of 32 keys in random order (a fresh shuffle of
 *             all keys per pass) for --duration; every object's stamp is
 *             checked. The master's stat must show the gets as SSD hits
 *             (hits_ssd grew by the objects read, hits_dram did not), or the
 *             point fails. Compared with disk_read; target 85 %.
 *   get_dram  the same on objects put to DRAM (as many as fit under 80 % of
 *             the DRAM segment, at most --ssd-objects): hits_dram must grow,
 *             hits_ssd not. A reference for the data mode's 1 MiB get.
 *   offload   fresh 1 MiB objects put in batches of 32 until the DRAM segment
 *             plus 80 % of the SSD segment has been written (or 60 s): once
 *             DRAM is full every put waits for offload to make room. The
 *             master's stat is sampled every 0.2 s between batches; the
 *             steady part starts at the first sample with offloaded_objects
 *             above its start and ends at the last sample before the puts
 *             end. offload rate = delta(offloaded_objects) x 1 MiB / its time;
 *             compared with disk_write; target 80 %. Put throughput is reported
 *             for the steady part and for the whole loop. After the loop the
 *             bench waits for offloads in flight to end, then reads the first
 *             batch written (by then on SSD only) back and checks it.
 *
 * Objects of a part are removed before the next part starts. Any failed
 * call, wrong bytes, or a tier check that does not hold fails the mode;
 * missed targets do not (they are reported).
 * Thread: the caller's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "client/ssd/ssd_io.h"
#include "client/tools/bench/bench.h"

#define SSD_OBJ (1u << 20)
#define SSD_BATCH 32u
#define SSD_SALT 0x9e3779b97f4a7c15ull
#define SSD_KEY_LEN 64
#define SSD_GET_TARGET 85.0
#define SSD_OFFLOAD_TARGET 80.0
#define SSD_SAMPLE_S 0.2
#define SSD_OFFLOAD_MAX_S 60.0
#define SSD_TCP_STREAMS 2

typedef struct ssd_bench {
    const kvp_bench_opts_t *o;
    kvp_bench_out_t *out;
    kvp_client_t *c;
    const char *transport; /* NULL: the client's choice */
    uint64_t dram_size, ssd_size;
    void *src[SSD_BATCH], *dst[SSD_BATCH];
    size_t sizes[SSD_BATCH];
    char keys[SSD_BATCH][SSD_KEY_LEN];
    const char *kp[SSD_BATCH];
    kvp_status_t res[SSD_BATCH];
    int64_t got[SSD_BATCH];
} ssd_bench_t;

static void key_of(char *buf, const char *part, uint64_t i)
{
    snprintf(buf, SSD_KEY_LEN, "ssdbench@%s@%" PRIu64, part, i);
}

/* Object i's identity in its first and last 8 bytes; the rest keeps the buffer's pattern. */
static void stamp(void *p, uint64_t i)
{
    uint64_t a = i ^ SSD_SALT, b = ~i;
    memcpy(p, &a, 8);
    memcpy((char *)p + SSD_OBJ - 8, &b, 8);
}

static bool stamp_ok(const void *p, uint64_t i)
{
    uint64_t a, b;
    memcpy(&a, p, 8);
    memcpy(&b, (const char *)p + SSD_OBJ - 8, 8);
    return a == (i ^ SSD_SALT) && b == ~i;
}

static void batch_failed(ssd_bench_t *s, const char *what, kvp_status_t st, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        if (s->res[i] != KVP_OK) {
            fprintf(stderr, "kvpool-bench: ssd: %s %s: %s (%s)\n", what, s->kp[i],
                    kvp_strerror(s->res[i]), kvp_client_last_error());
            return;
        }
    }
    fprintf(stderr, "kvpool-bench: ssd: %s: %s (%s)\n", what, kvp_strerror(st),
            kvp_client_last_error());
}

/* Put objects [first, first + n) of `part` (n <= SSD_BATCH) with `medium` (NULL: DRAM). */
static int put_batch(ssd_bench_t *s, const char *part, uint64_t first, unsigned n,
                     const char *medium)
{
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.medium = medium;
    for (unsigned i = 0; i < n; i++) {
        key_of(s->keys[i], part, first + i);
        s->kp[i] = s->keys[i];
        stamp(s->src[i], first + i);
        s->sizes[i] = SSD_OBJ;
        s->res[i] = KVP_OK;
    }
    kvp_status_t st =
        kvp_batch_put_from(s->c, s->kp, (const void *const *)s->src, s->sizes, n, &cfg, s->res);
    if (st != KVP_OK) {
        batch_failed(s, "put", st, n);
        return -1;
    }
    return 0;
}

/* Get objects idx[0..n) of `part` and check them. */
static int get_batch(ssd_bench_t *s, const char *part, const uint64_t *idx, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        key_of(s->keys[i], part, idx[i]);
        s->kp[i] = s->keys[i];
        s->sizes[i] = SSD_OBJ;
        memset(s->dst[i], 0, 8);
    }
    kvp_status_t st = kvp_batch_get_into(s->c, s->kp, s->dst, s->sizes, n, s->got);
    for (unsigned i = 0; i < n; i++) {
        if (st != KVP_OK || s->got[i] != (int64_t)SSD_OBJ) {
            fprintf(stderr, "kvpool-bench: ssd: get %s: %s (%s)\n", s->kp[i],
                    s->got[i] < 0 ? kvp_strerror((kvp_status_t)s->got[i]) : kvp_strerror(st),
                    kvp_client_last_error());
            return -1;
        }
        if (!stamp_ok(s->dst[i], idx[i])) {
            fprintf(stderr, "kvpool-bench: ssd: get %s returned other bytes than were put\n",
                    s->kp[i]);
            return -1;
        }
    }
    return 0;
}

static int remove_range(ssd_bench_t *s, const char *part, uint64_t n)
{
    for (uint64_t first = 0; first < n; first += SSD_BATCH) {
        unsigned b = (unsigned)(n - first < SSD_BATCH ? n - first : SSD_BATCH);
        for (unsigned i = 0; i < b; i++) {
            key_of(s->keys[i], part, first + i);
            s->kp[i] = s->keys[i];
        }
        kvp_status_t st = kvp_batch_remove_force(s->c, s->kp, b, s->res);
        if (st != KVP_OK) {
            batch_failed(s, "remove", st, b);
            return -1;
        }
    }
    return 0;
}

static void result_common(ssd_bench_t *s, const char *op, double gbps, double objs_s, double p50,
                          double p99, const char *limit, double limit_gbps, double target)
{
    kvp_bench_out_t *out = s->out;
    double pct = limit_gbps > 0 ? gbps / limit_gbps * 100 : 0;
    kvp_bench_result_begin(out, "ssd");
    kvp_bench_result_str(out, "op", op);
    kvp_bench_result_str(out, "transport", s->transport ? s->transport : "auto");
    kvp_bench_result_int(out, "size", SSD_OBJ);
    kvp_bench_result_int(out, "batch", SSD_BATCH);
    kvp_bench_result_str(out, "crc", "on");
    kvp_bench_result_num(out, "gbps", gbps);
    kvp_bench_result_num(out, "objs_per_s", objs_s);
    kvp_bench_result_num(out, "p50_us", p50);
    kvp_bench_result_num(out, "p99_us", p99);
    kvp_bench_result_str(out, "limit", limit);
    kvp_bench_result_num(out, "limit_gbps", limit_gbps);
    kvp_bench_result_num(out, "pct_of_limit", pct);
    kvp_bench_result_num(out, "target_pct", target);
    kvp_bench_result_str(out, "target_met",
                         target <= 0 || limit_gbps <= 0 ? "n/a"
                         : pct >= target                ? "yes"
                                                        : "no");
    kvp_bench_result_int(out, "dram_segment", (int64_t)s->dram_size);
    kvp_bench_result_int(out, "ssd_segment", (int64_t)s->ssd_size);
    printf("%-9s %8.2f %10.0f %9.0f %9.0f %-10s %8.2f %6.1f%%", op, gbps, objs_s, p50, p99, limit,
           limit_gbps, pct);
    if (target > 0 && limit_gbps > 0)
        printf("  target %.0f%%: %s", target, pct >= target ? "met" : "MISSED");
    printf("\n");
}

/* Put objects [0, n) of `part` to the tier (ssd: medium "ssd", else DRAM); *put_done_p: how
 * many were sent, for the removal. 0, or -1. */
static int get_put_all(ssd_bench_t *s, bool ssd, const char *part, uint64_t n, uint64_t *put_done_p)
{
    for (*put_done_p = 0; *put_done_p < n; *put_done_p += SSD_BATCH) {
        uint64_t done = *put_done_p;
        unsigned b = (unsigned)(n - done < SSD_BATCH ? n - done : SSD_BATCH);
        if (put_batch(s, part, done, b, ssd ? "ssd" : NULL) != 0)
            return -1;
    }
    return 0;
}

/* What run_get's reads did: batches timed after the warm-up one. */
typedef struct get_reads {
    kvp_bench_lat_t lat;
    uint64_t objs;
    double busy;
    unsigned rounds; /* the warm-up included */
} get_reads_t;

/* Read objects [0, n) of `part` back in random batches (a fresh shuffle of all keys per
 * pass, perm: room for n) for the duration and at least 4 batches. 0, or -1. */
static int get_reads(ssd_bench_t *s, const char *part, uint64_t *perm, uint64_t n, get_reads_t *g)
{
    for (uint64_t i = 0; i < n; i++)
        perm[i] = i;
    unsigned seed = 12345;
    uint64_t pos = n;
    double t_end = kvp_bench_now() + s->o->duration_s;
    while (kvp_bench_now() < t_end || g->rounds < 4) {
        if (pos >= n) { /* a fresh random order of every key */
            for (uint64_t i = n - 1; i > 0; i--) {
                uint64_t j = (uint64_t)rand_r(&seed) % (i + 1), t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
            pos = 0;
        }
        unsigned b = (unsigned)(n - pos < SSD_BATCH ? n - pos : SSD_BATCH);
        double t0 = kvp_bench_now();
        if (get_batch(s, part, perm + pos, b) != 0)
            return -1;
        double d = kvp_bench_now() - t0;
        pos += b;
        if (g->rounds++ == 0)
            continue; /* warm-up: first connection to the SSD server */
        kvp_bench_lat_add(&g->lat, d);
        g->busy += d;
        g->objs += b;
    }
    return 0;
}

/* The limit a get is compared with: ssd, the disk's read speed before and after the reads,
 * averaged (it drifts: bench.h); dram, the transport's own limit. 0, or -1. */
static int get_limit(ssd_bench_t *s, bool ssd, const char **limit_p, double *limit_gbps_p,
                     double *lim_before_p, double *lim_after_p)
{
    if (ssd) {
        *limit_p = "disk_read";
        *lim_before_p = kvp_bench_limit_disk_gbps(false);
        if (kvp_bench_disk_limits_remeasure(s->o) != 0)
            return -1;
        *lim_after_p = kvp_bench_limit_disk_gbps(false);
        *limit_gbps_p = (*lim_before_p + *lim_after_p) / 2;
    } else if (s->transport != NULL && strcmp(s->transport, "tcp") == 0) {
        *limit_p = "tcp-pump";
        *limit_gbps_p = kvp_bench_limit_tcp_gbps(SSD_OBJ, SSD_TCP_STREAMS);
    } else {
        *limit_p = "memcpy";
        *limit_gbps_p = kvp_bench_limit_memcpy_gbps(SSD_OBJ);
    }
    return 0;
}

/*
 * get_ssd (ssd = true) or get_dram: put n objects to that tier, read them back in random
 * batches for the duration, check the master counted the reads on that tier.
 */
static int run_get(ssd_bench_t *s, bool ssd, uint64_t n)
{
    const char *part = ssd ? "ssd" : "dram";
    const char *op = ssd ? "get_ssd" : "get_dram";
    int rc = -1;
    uint64_t *perm = malloc(n * sizeof(*perm));
    get_reads_t g = {.lat = {0}};
    if (perm == NULL) {
        fprintf(stderr, "kvpool-bench: ssd: out of memory\n");
        return -1;
    }
    /* the disk's limit just before: written then read back, as the objects are next (a
     * virtualised disk's speed drifts, and its host caches what was just written) */
    if (ssd && kvp_bench_disk_limits_remeasure(s->o) != 0) {
        free(perm);
        return -1;
    }
    uint64_t put_done = 0;
    kvp_bench_progress(s->o, "ssd: %s: putting %" PRIu64 " objects", op, n);
    if (get_put_all(s, ssd, part, n, &put_done) != 0)
        goto out;
    kvp_pool_stat_t before, after;
    if (kvp_bench_pool_stat(s->c, "ssd", &before) != 0)
        goto out;
    if (ssd && before.ssd_used < n * SSD_OBJ)
        fprintf(stderr,
                "kvpool-bench: ssd: get_ssd: %" PRIu64 " objects put with medium ssd but the "
                "master counts only %" PRIu64 " bytes on SSD\n",
                n, before.ssd_used);
    kvp_bench_progress(s->o, "ssd: %s: reading for %.1f s", op, s->o->duration_s);
    if (get_reads(s, part, perm, n, &g) != 0 || kvp_bench_pool_stat(s->c, "ssd", &after) != 0)
        goto out;
    uint64_t dh = after.hits_dram - before.hits_dram, sh = after.hits_ssd - before.hits_ssd;
    uint64_t read_objs = g.objs + (uint64_t)(g.rounds > 0 ? SSD_BATCH : 0); /* the warm-up */
    bool tier_ok = ssd ? (dh == 0 && sh >= g.objs) : (sh == 0 && dh >= g.objs);
    double objs_s = g.busy > 0 ? (double)g.objs / g.busy : 0;
    double gbps = objs_s * SSD_OBJ / 1e9;
    double p50 = kvp_bench_percentile(g.lat.v, g.lat.n, 50) * 1e6;
    double p99 = kvp_bench_percentile(g.lat.v, g.lat.n, 99) * 1e6;
    const char *limit;
    double limit_gbps, lim_before = 0, lim_after = 0;
    if (get_limit(s, ssd, &limit, &limit_gbps, &lim_before, &lim_after) != 0)
        goto out;
    kvp_bench_progress_done(s->o);
    result_common(s, op, gbps, objs_s, p50, p99, limit, limit_gbps, ssd ? SSD_GET_TARGET : 0);
    if (ssd) {
        kvp_bench_result_num(s->out, "limit_before_gbps", lim_before);
        kvp_bench_result_num(s->out, "limit_after_gbps", lim_after);
        printf("          disk_read measured %.2f GB/s before and %.2f after (the limit: their "
               "mean)\n",
               lim_before, lim_after);
    }
    kvp_bench_result_int(s->out, "objects", (int64_t)n);
    kvp_bench_result_int(s->out, "batches", (int64_t)g.lat.n);
    kvp_bench_result_int(s->out, "objects_read", (int64_t)read_objs);
    kvp_bench_result_int(s->out, "hits_dram", (int64_t)dh);
    kvp_bench_result_int(s->out, "hits_ssd", (int64_t)sh);
    kvp_bench_result_int(s->out, "promoted_objects", (int64_t)after.promoted_objects);
    kvp_bench_result_int(s->out, "ssd_used", (int64_t)after.ssd_used);
    kvp_bench_result_str(s->out, "tier_check", tier_ok ? "ok" : "failed");
    kvp_bench_result_end(s->out);
    printf("          %" PRIu64 " objects, %zu batches; master: hits_dram +%" PRIu64
           ", hits_ssd +%" PRIu64 " for %" PRIu64 " objects read: %s\n",
           n, g.lat.n, dh, sh, read_objs, tier_ok ? "as expected" : "NOT on the expected tier");
    if (!tier_ok) {
        fprintf(stderr,
                "kvpool-bench: ssd: %s: the master counted hits_dram +%" PRIu64
                " and hits_ssd +%" PRIu64 " for %" PRIu64 " objects read from %s: the figure is "
                "not that tier's\n",
                op, dh, sh, read_objs, ssd ? "SSD" : "DRAM");
        goto out;
    }
    rc = 0;
out:
    kvp_bench_progress_done(s->o);
    if (put_done > 0 && remove_range(s, part, put_done < n ? put_done : n) != 0)
        rc = -1;
    free(perm);
    free(g.lat.v);
    return rc;
}

typedef struct sample {
    double t;
    uint64_t offloaded, put; /* objects */
} sample_t;

/* run_offload's figures. */
typedef struct offload {
    uint64_t total, put; /* objects to put, put */
    sample_t *smp;       /* the master's stat every SSD_SAMPLE_S between batches */
    size_t ns, max_samples;
    kvp_bench_lat_t lat;       /* puts in the steady part */
    kvp_pool_stat_t start, ps; /* the pool before, and after the offloads settled */
    double t0, t_put_end, t_settled;
    bool timed_out;
    /* the steady part: from the first sample with offloads done to the last one */
    double rate_objs, put_objs_s, steady_s;
    uint64_t steady_off;
    bool whole; /* no steady part: the rates are over the whole loop */
} offload_t;

/* Put fresh objects in batches until of->total are put (or SSD_OFFLOAD_MAX_S), sampling the
 * master's stat between batches. 0, or -1. */
static int offload_puts(ssd_bench_t *s, offload_t *of)
{
    of->t0 = kvp_bench_now();
    double last = of->t0, now = of->t0;
    of->smp[of->ns++] = (sample_t){of->t0, of->start.offloaded_objects, 0};
    while (of->put < of->total) {
        if (now - of->t0 > SSD_OFFLOAD_MAX_S) {
            of->timed_out = true;
            break;
        }
        double b0 = kvp_bench_now();
        if (put_batch(s, "off", of->put, SSD_BATCH, NULL) != 0)
            return -1;
        now = kvp_bench_now();
        of->put += SSD_BATCH;
        bool steady = of->smp[of->ns - 1].offloaded > of->start.offloaded_objects;
        if (steady)
            kvp_bench_lat_add(&of->lat, now - b0);
        if (now - last >= SSD_SAMPLE_S && of->ns < of->max_samples) {
            if (kvp_bench_pool_stat(s->c, "ssd", &of->ps) != 0)
                return -1;
            now = kvp_bench_now();
            last = now;
            of->smp[of->ns++] = (sample_t){now, of->ps.offloaded_objects, of->put};
            kvp_bench_progress(s->o,
                               "ssd: offload: %" PRIu64 "/%" PRIu64 " objects put, %" PRIu64
                               " offloaded, %" PRIu64 " in flight",
                               of->put, of->total,
                               of->ps.offloaded_objects - of->start.offloaded_objects,
                               of->ps.offloading_objects);
        }
    }
    of->t_put_end = kvp_bench_now();
    return 0;
}

/* The steady part's rates; then let offloads in flight end (the counters are then final):
 * a run too short for two samples while offloading (the bench smoke) gets the rate over the
 * whole loop, offloads settled (a lower bound). 0, or -1. */
static int offload_rates(ssd_bench_t *s, offload_t *of)
{
    const sample_t *smp = of->smp;
    size_t ns = of->ns, first = 0;
    while (first < ns && smp[first].offloaded == of->start.offloaded_objects)
        first++;
    if (first < ns && ns - 1 > first) {
        of->steady_s = smp[ns - 1].t - smp[first].t;
        of->steady_off = smp[ns - 1].offloaded - smp[first].offloaded;
        of->rate_objs = (double)of->steady_off / of->steady_s;
        of->put_objs_s = (double)(smp[ns - 1].put - smp[first].put) / of->steady_s;
    }
    double wait_end = kvp_bench_now() + 30;
    for (;;) {
        if (kvp_bench_pool_stat(s->c, "ssd", &of->ps) != 0)
            return -1;
        if (of->ps.offloading_objects == 0 || kvp_bench_now() > wait_end)
            break;
        usleep(50000);
    }
    of->t_settled = kvp_bench_now();
    of->whole = of->steady_s <= 0 && of->ps.offloaded_objects > of->start.offloaded_objects;
    if (of->whole) {
        of->rate_objs = (double)(of->ps.offloaded_objects - of->start.offloaded_objects) /
                        (of->t_settled - of->t0);
        of->put_objs_s = (double)of->put / (of->t_put_end - of->t0);
    }
    return 0;
}

/* The offload's result object and table lines, against the disk's write speed before and
 * after the offload, averaged (it drifts: bench.h). 0, or -1 when the disk's could not be
 * measured again. */
static int offload_report(ssd_bench_t *s, offload_t *of)
{
    const kvp_pool_stat_t *ps = &of->ps, *start = &of->start;
    double all_s = of->t_put_end - of->t0;
    double gbps = of->rate_objs * SSD_OBJ / 1e9;
    double lim_before = kvp_bench_limit_disk_gbps(true);
    if (kvp_bench_disk_limits_remeasure(s->o) != 0)
        return -1;
    double lim_after = kvp_bench_limit_disk_gbps(true);
    double limit_gbps = (lim_before + lim_after) / 2;
    double p50 = kvp_bench_percentile(of->lat.v, of->lat.n, 50) * 1e6;
    double p99 = kvp_bench_percentile(of->lat.v, of->lat.n, 99) * 1e6;
    uint64_t off = ps->offloaded_objects - start->offloaded_objects;
    uint64_t dropped = ps->offload_dropped - start->offload_dropped;
    uint64_t failed = ps->offload_failed - start->offload_failed;
    uint64_t evicted = ps->evicted_objects - start->evicted_objects;
    uint64_t ssd_evicted = ps->ssd_evicted_objects - start->ssd_evicted_objects;
    double put_gbps_all = all_s > 0 ? (double)of->put * SSD_OBJ / all_s / 1e9 : 0;
    result_common(s, "offload", gbps, of->rate_objs, p50, p99, "disk_write", limit_gbps,
                  SSD_OFFLOAD_TARGET);
    kvp_bench_result_num(s->out, "limit_before_gbps", lim_before);
    kvp_bench_result_num(s->out, "limit_after_gbps", lim_after);
    printf("          disk_write measured %.2f GB/s before and %.2f after (the limit: their "
           "mean)\n",
           lim_before, lim_after);
    kvp_bench_result_num(s->out, "put_gbps", of->put_objs_s * SSD_OBJ / 1e9);
    kvp_bench_result_num(s->out, "put_gbps_all", put_gbps_all);
    kvp_bench_result_num(s->out, "steady_s", of->steady_s);
    kvp_bench_result_num(s->out, "elapsed_s", all_s);
    kvp_bench_result_int(s->out, "objects_put", (int64_t)of->put);
    kvp_bench_result_int(s->out, "steady_offloaded", (int64_t)of->steady_off);
    kvp_bench_result_int(s->out, "offloaded_objects", (int64_t)off);
    kvp_bench_result_int(s->out, "offloading_objects", (int64_t)ps->offloading_objects);
    kvp_bench_result_int(s->out, "offload_dropped", (int64_t)dropped);
    kvp_bench_result_int(s->out, "offload_failed", (int64_t)failed);
    kvp_bench_result_int(s->out, "evicted_objects", (int64_t)evicted);
    kvp_bench_result_int(s->out, "ssd_evicted_objects", (int64_t)ssd_evicted);
    kvp_bench_result_int(s->out, "ssd_used", (int64_t)ps->ssd_used);
    kvp_bench_result_int(s->out, "dram_used", (int64_t)(ps->used - ps->ssd_used));
    kvp_bench_result_int(s->out, "objects", (int64_t)ps->objects);
    kvp_bench_result_end(s->out);
    printf("          %" PRIu64 " objects put in %.2f s (%.2f GB/s; steady part %.2f s: puts %.2f "
           "GB/s); master: %" PRIu64 " offloaded, %" PRIu64 " dropped, %" PRIu64 " failed, %" PRIu64
           " still in flight, %" PRIu64 " evicted, %" PRIu64
           " objects resident (%.2f GiB on SSD)\n",
           of->put, all_s, put_gbps_all, of->steady_s, of->put_objs_s * SSD_OBJ / 1e9, off, dropped,
           failed, ps->offloading_objects, evicted, ps->objects, (double)ps->ssd_used / (1 << 30));
    return 0;
}

/* The offload's checks: a rate was measured; the master's dropped and failed offloads said;
 * the first batch, put to DRAM first, is on SSD by now: read it back. 0, or -1. */
static int offload_check(ssd_bench_t *s, offload_t *of)
{
    kvp_pool_stat_t *ps = &of->ps;
    uint64_t dropped = ps->offload_dropped - of->start.offload_dropped;
    uint64_t failed = ps->offload_failed - of->start.offload_failed;
    if (of->timed_out)
        fprintf(stderr,
                "kvpool-bench: ssd: offload: stopped after %.0f s with %" PRIu64 " of %" PRIu64
                " objects put\n",
                SSD_OFFLOAD_MAX_S, of->put, of->total);
    if (of->whole)
        printf("          (too short for a steady part: the rate is over the whole loop, until "
               "the offloads settled)\n");
    if (of->steady_s <= 0 && !of->whole) {
        fprintf(stderr, "kvpool-bench: ssd: offload: nothing was offloaded while the puts ran: "
                        "no rate\n");
        return -1;
    }
    if (dropped || failed)
        fprintf(stderr,
                "kvpool-bench: ssd: offload: the master counted %" PRIu64 " dropped and %" PRIu64
                " failed offloads with the SSD tier at %.0f %%\n",
                dropped, failed, 100.0 * (double)ps->ssd_used / (double)ps->ssd_capacity);
    uint64_t idx[SSD_BATCH];
    for (unsigned i = 0; i < SSD_BATCH; i++)
        idx[i] = i;
    kvp_pool_stat_t b4;
    if (kvp_bench_pool_stat(s->c, "ssd", &b4) != 0 || get_batch(s, "off", idx, SSD_BATCH) != 0 ||
        kvp_bench_pool_stat(s->c, "ssd", ps) != 0)
        return -1;
    printf("          the first %u objects read back: hits_ssd +%" PRIu64 ", hits_dram +%" PRIu64
           "\n",
           SSD_BATCH, ps->hits_ssd - b4.hits_ssd, ps->hits_dram - b4.hits_dram);
    return 0;
}

static int run_offload(ssd_bench_t *s)
{
    offload_t of = {.total = (s->dram_size + s->ssd_size / 10 * 8) / SSD_OBJ,
                    .max_samples = (size_t)(SSD_OFFLOAD_MAX_S / SSD_SAMPLE_S) + 16};
    of.total = (of.total + SSD_BATCH - 1) / SSD_BATCH * SSD_BATCH;
    of.smp = calloc(of.max_samples, sizeof(*of.smp));
    int rc = -1;
    if (of.smp == NULL) {
        fprintf(stderr, "kvpool-bench: ssd: out of memory\n");
        return -1;
    }
    /* the disk's limit just before the measured offload (it drifts: see bench.h) */
    if (kvp_bench_disk_limits_remeasure(s->o) != 0 ||
        kvp_bench_pool_stat(s->c, "ssd", &of.start) != 0 || offload_puts(s, &of) != 0 ||
        offload_rates(s, &of) != 0)
        goto out;
    kvp_bench_progress_done(s->o);
    if (offload_report(s, &of) != 0 || offload_check(s, &of) != 0)
        goto out;
    rc = 0;
out:
    kvp_bench_progress_done(s->o);
    free(of.smp);
    free(of.lat.v);
    return rc;
}

int kvp_bench_ssd(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    if (!o->local) {
        fprintf(stderr, "kvpool-bench: ssd: needs --local (it starts its own master with "
                        "--promote-on-hit off and a segment with an SSD file)\n");
        return 1;
    }
    if (kvp_bench_ssd_dir_check(o->ssd_dir) != 0)
        return 1;
    ssd_bench_t s = {.o = o,
                     .out = out,
                     .dram_size = o->segment_size_set ? o->segment_size : 256ull << 20,
                     .ssd_size = o->ssd_size};
    s.transport = o->n_transports == 1 ? o->transports[0] : NULL;
    int rc = 0;
    if (kvp_bench_disk_limits_ensure(o) != 0)
        rc = 1;
    if (kvp_bench_limits_ensure(o, SSD_OBJ, SSD_TCP_STREAMS) != 0)
        rc = 1;
    char path[4096];
    snprintf(path, sizeof(path), "%s/kvpool-bench-ssd-%d.seg", o->ssd_dir, (int)getpid());
    unlink(path);
    static const char *const master_flags[] = {"--promote-on-hit", "off", NULL};
    kvp_bench_cluster_params_t cp = {.n = 1,
                                     .seg_size = s.dram_size,
                                     .ssd_path = path,
                                     .ssd_size = s.ssd_size,
                                     .master_flags = master_flags};
    kvp_bench_cluster_t cl;
    kvp_bench_progress(o, "ssd: starting a master and a segment (SSD file %s)", path);
    if (kvp_bench_cluster_start_params(&cl, &cp) != 0) {
        kvp_bench_progress_done(o);
        fprintf(stderr, "kvpool-bench: ssd: cannot start the local cluster (SSD file %s)\n", path);
        unlink(path);
        return 1;
    }
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = cl.master_addr;
    p.transport = s.transport;
    p.verify_crc = true;
    kvp_status_t st = kvp_client_create(&p, &s.c);
    unsigned nbuf = 0;
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench: ssd: client: %s\n", kvp_strerror(st));
        rc = 1;
        goto out;
    }
    for (; nbuf < SSD_BATCH; nbuf++) {
        s.src[nbuf] = malloc(SSD_OBJ);
        s.dst[nbuf] = malloc(SSD_OBJ);
        if (s.src[nbuf] == NULL || s.dst[nbuf] == NULL) {
            free(s.src[nbuf]);
            free(s.dst[nbuf]);
            fprintf(stderr, "kvpool-bench: ssd: out of memory\n");
            rc = 1;
            goto out;
        }
        for (size_t i = 0; i < SSD_OBJ; i += 8) {
            uint64_t v = (i * SSD_SALT) ^ (nbuf * 0x5bd1e995ull);
            memcpy((char *)s.src[nbuf] + i, &v, 8);
        }
        memset(s.dst[nbuf], 0, SSD_OBJ);
        kvp_register_buffer(s.c, s.src[nbuf], SSD_OBJ);
        kvp_register_buffer(s.c, s.dst[nbuf], SSD_OBJ);
    }
    kvp_bench_progress_done(o);
    printf("== ssd: the SSD tier against this disk (%s: io_uring O_DIRECT, depth %u: read %.2f "
           "GB/s, write %.2f GB/s) ==\n",
           o->ssd_dir, KVP_SSD_IO_DEPTH, kvp_bench_limit_disk_gbps(false),
           kvp_bench_limit_disk_gbps(true));
    printf("local master (--promote-on-hit off), one segment: DRAM %llu MiB, SSD %llu MiB (%s); "
           "1 MiB objects, batches of %u, CRC on, transport %s, %.1f s per get point\n",
           (unsigned long long)(s.dram_size >> 20), (unsigned long long)(s.ssd_size >> 20), path,
           SSD_BATCH, s.transport ? s.transport : "auto", o->duration_s);
    printf("%-9s %8s %10s %9s %9s %-10s %8s %7s\n", "op", "GB/s", "obj/s", "p50 us", "p99 us",
           "limit", "GB/s", "%limit");
    uint64_t dram_objs = s.dram_size / 10 * 8 / SSD_OBJ;
    if (dram_objs > o->ssd_objects)
        dram_objs = o->ssd_objects;
    if (run_get(&s, true, o->ssd_objects) != 0)
        rc = 1;
    if (dram_objs < SSD_BATCH) {
        fprintf(stderr, "kvpool-bench: ssd: the DRAM segment is too small for get_dram\n");
        rc = 1;
    } else if (run_get(&s, false, dram_objs) != 0) {
        rc = 1;
    }
    if (run_offload(&s) != 0)
        rc = 1;
    fflush(stdout);
out:
    for (unsigned i = 0; i < nbuf; i++) {
        kvp_unregister_buffer(s.c, s.src[i]);
        kvp_unregister_buffer(s.c, s.dst[i]);
        free(s.src[i]);
        free(s.dst[i]);
    }
    kvp_client_destroy(s.c);
    kvp_bench_cluster_stop(&cl);
    unlink(path);
    return rc;
}
