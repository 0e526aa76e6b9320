/*
 * bench_ha.c - kvpool-bench ha: what keeping the index's source outside the
 * master costs and buys: the segment records' cost on puts, the rebuild of a
 * restarted master's index, and failover between masters through etcd.
 *
 * DESIGN
 * Always processes of its own on 127.0.0.1 (--master and --segment-records
 * are not used); three parts one after the other, each stopping its
 * processes before the next:
 *
 *   records   two local clusters side by side, one master with
 *             --segment-records on and one with off, one segment each
 *             (--segment-size, default 256 MiB here). Per transport
 *             (--transport, default tcp,shm) and size (4 KiB, 64 KiB) one
 *             client thread puts batches of 32 fresh keys (timed) and removes
 *             each batch (not timed), --duration in all per setting, in 8
 *             slices per setting taken in the order on off off on on off off
 *             on, so that drift of the machine hits both alike; each slice's
 *             first batch is a warm-up. objects/s and GB/s of each setting
 *             (objects over time spent in put) and the ratio on/off.
 *   rebuild   a master (records on) and 4 `kvpool serve` of about 2 x N KiB / 4
 *             each (in 64 MiB steps: 512 MiB for 1 M); N (--ha-objects)
 *             objects of 1 KiB put in batches of 256; the master's VmRSS;
 *             kill -9; a new master on the same address. rebuild_ms is from
 *             its ready line to kvp_pool_stat showing N objects (polled every
 *             20 ms; remount_ms: to all 4 segments mounted again); then its
 *             VmRSS, and 1000 random keys read back and compared byte for byte.
 *   failover  a private etcd (random high ports, a temp data dir, killed by
 *             PID at the end), 3 masters with --etcd --cluster --leader-ttl
 *             (--leader-ttl, default 2), 2 segments and the clients on
 *             etcd://HOST:PORT/NAME (rpc_timeout_ms 15000); 1000 resident
 *             objects of 16 KiB put first. A background thread with a client
 *             of its own puts, gets (checked byte for byte; a failed get is
 *             retried every 20 ms for up to 60 s) and removes 16 KiB objects
 *             of distinct keys in a loop, counting successful puts and gets,
 *             and failed calls, per 100 ms. Per round (--ha-rounds): the
 *             leader (its etcd key) is killed with SIGKILL; failover_ms is
 *             from the kill to the first successful put of the main thread,
 *             which puts a fresh key in a tight loop (failed puts are counted:
 *             probe errors); index_ms is from the kill to the leader's stat
 *             counting the resident objects, which are then all read back
 *             (missing ones are counted and put again); the killed master is
 *             started again on its address, as a standby. The next kill comes
 *             at least 1 s after that and 3 s after the failover ended, so
 *             the windows of two rounds never overlap: ops_ratio is the
 *             background thread's ops in the 3 s after a kill over those in
 *             the 3 s before it (whole 100 ms buckets). At the end, objects of
 *             the load and the probes still in the pool (all were removed, or
 *             their put failed) are listed: leftovers. Without an etcd binary
 *             on PATH the part is skipped (said on stdout and in the JSON).
 *             The private etcd is plain http without authentication, so the
 *             part unsets KVPOOL_ETCD_* (etcd TLS and credentials of the
 *             clients) for itself and its children.
 *
 * What fails the mode: a process that does not start; in records and rebuild
 * any failed call or wrong bytes, an index not rebuilt within 120 s; in
 * failover a failover not over within 60 s, an object put that is never read
 * back (60 s of retries) or is read back wrong, a resident object missing or
 * wrong after a failover. Calls that fail during a failover (the clients are
 * meant to wait through it) are counted and printed with the first of each
 * kind, not fatal: that is part of what is measured.
 * Threads: the caller's, and the failover part's background thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "client/tools/bench/bench.h"
#include "common/etcd.h"

#define HA_KEY_LEN 64
#define HA_REC_BATCH 32u
#define HA_REC_SLICES 8 /* on, off, off, on, ...: drift hits both alike */
#define HA_RB_OBJ 1024u
#define HA_RB_BATCH 256u
#define HA_RB_SEGS 4u
#define HA_RB_SAMPLE 1000u
#define HA_RB_POLL_US 20000
#define HA_RB_MAX_S 120.0
#define HA_FO_OBJ (16u << 10)
#define HA_FO_MASTERS 3
#define HA_FO_SEGS 2u
#define HA_FO_SEG_SIZE (256ull << 20)
#define HA_FO_TIMEOUT_MS 15000u
#define HA_FO_BUCKET_S 0.1
#define HA_FO_WINDOW_S 3.0
#define HA_FO_GAP_S 1.0
#define HA_FO_MAX_S 60.0
#define HA_FO_INDEX_MAX_S 10.0 /* after the failover: the index counts the resident objects */
#define HA_FO_RESIDENT 1000u

/* Object `seed`'s bytes: a function of the seed and the offset, so any object is checkable. */
static void fill(void *buf, size_t len, uint64_t seed)
{
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = kvp_bench_mix64(seed * 0x100000001b3ull + i);
        memcpy((char *)buf + i, &v, len - i < 8 ? len - i : 8);
    }
}

static kvp_status_t client_open(const char *master, const char *transport, uint32_t timeout_ms,
                                kvp_client_t **c_p)
{
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = master;
    p.transport = transport;
    p.rpc_timeout_ms = timeout_ms;
    return kvp_client_create(&p, c_p);
}

static void kill9(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* ---------------- records: the put loop, on vs off ---------------- */

/* batch_put_from of fresh keys for `seconds`: adds the objects put and the time spent in put. */
static int put_rate(const char *master, const char *transport, uint64_t size, double seconds,
                    uint64_t *objs_p, double *busy_p)
{
    kvp_client_t *c;
    kvp_status_t st = client_open(master, transport, 0, &c);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench: ha: client (%s): %s\n", transport, kvp_strerror(st));
        return 1;
    }
    char keys[HA_REC_BATCH][HA_KEY_LEN];
    const char *kp[HA_REC_BATCH];
    const void *src[HA_REC_BATCH];
    size_t sizes[HA_REC_BATCH];
    kvp_status_t res[HA_REC_BATCH];
    char *mem = malloc(HA_REC_BATCH * size);
    if (mem == NULL) {
        fprintf(stderr, "kvpool-bench: ha: out of memory\n");
        kvp_client_destroy(c);
        return 1;
    }
    for (unsigned i = 0; i < HA_REC_BATCH; i++) {
        kp[i] = keys[i];
        src[i] = mem + i * size;
        sizes[i] = size;
        fill(mem + i * size, size, i);
    }
    kvp_register_buffer(c, mem, HA_REC_BATCH * size);
    double busy = 0, t_end = kvp_bench_now() + seconds;
    uint64_t objs = 0, round = 0;
    int rc = 0;
    while (kvp_bench_now() < t_end || round < 4) {
        for (unsigned i = 0; i < HA_REC_BATCH; i++)
            snprintf(keys[i], HA_KEY_LEN, "ha@rec@%s@%" PRIu64 "@%u", transport, round, i);
        double t0 = kvp_bench_now();
        st = kvp_batch_put_from(c, kp, src, sizes, HA_REC_BATCH, NULL, res);
        double t1 = kvp_bench_now();
        const char *what = "put";
        if (st == KVP_OK) {
            what = "remove";
            st = kvp_batch_remove_force(c, kp, HA_REC_BATCH, res);
        }
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench: ha: records %s %s: %s (%s)\n", transport, what,
                    kvp_strerror(st), kvp_client_last_error());
            rc = 1;
            break;
        }
        if (round++ > 0) { /* round 0 is the warm-up */
            busy += t1 - t0;
            objs += HA_REC_BATCH;
        }
    }
    *objs_p += objs;
    *busy_p += busy;
    kvp_unregister_buffer(c, mem);
    kvp_client_destroy(c);
    free(mem);
    return rc;
}

static int run_records(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    static const uint64_t sizes[] = {4096, 65536};
    enum { N_SIZES = sizeof(sizes) / sizeof(sizes[0]) };
    uint64_t seg = o->segment_size_set ? o->segment_size : 256ull << 20;
    kvp_bench_cluster_t cl[2]; /* [0]: records on, [1]: off */
    for (int off = 0; off < 2; off++) {
        kvp_bench_cluster_params_t cp = {
            .n = 1, .seg_size = seg, .segment_records = off ? "off" : "on"};
        kvp_bench_progress(o, "ha: records: starting a master with --segment-records %s",
                           cp.segment_records);
        if (kvp_bench_cluster_start_params(&cl[off], &cp) != 0) {
            kvp_bench_progress_done(o);
            fprintf(stderr, "kvpool-bench: ha: cannot start a local cluster\n");
            if (off)
                kvp_bench_cluster_stop(&cl[0]);
            return 1;
        }
    }
    int rc = 0;
    double rate[KVP_BENCH_MAX_LIST][N_SIZES][2] = {{{0}}};
    for (size_t t = 0; t < o->n_transports; t++) {
        for (size_t s = 0; s < N_SIZES; s++) {
            uint64_t objs[2] = {0};
            double busy[2] = {0};
            for (int i = 0; i < 2 * HA_REC_SLICES; i++) {
                int off = (i + i / 2) % 2; /* on off off on on off ... */
                kvp_bench_progress(o, "ha: records %s: put %s %" PRIu64 " B ...",
                                   off ? "off" : "on", o->transports[t], sizes[s]);
                rc |= put_rate(cl[off].master_addr, o->transports[t], sizes[s],
                               o->duration_s / HA_REC_SLICES, &objs[off], &busy[off]);
            }
            for (int off = 0; off < 2; off++)
                rate[t][s][off] = busy[off] > 0 ? (double)objs[off] / busy[off] : 0;
        }
    }
    kvp_bench_progress_done(o);
    kvp_bench_cluster_stop(&cl[0]);
    kvp_bench_cluster_stop(&cl[1]);
    printf("== ha: segment records' cost on puts (batch %u, 1 thread, %.1f s per point, "
           "records on vs --segment-records off) ==\n",
           HA_REC_BATCH, o->duration_s);
    printf("%-4s %8s %12s %8s %12s %8s %7s\n", "tr", "size", "on obj/s", "on GB/s", "off obj/s",
           "off GB/s", "on/off");
    for (size_t t = 0; t < o->n_transports && rc == 0; t++) {
        for (size_t s = 0; s < N_SIZES; s++) {
            double on = rate[t][s][0], off = rate[t][s][1];
            double ratio = off > 0 ? on / off : 0;
            double gb = (double)sizes[s] / 1e9;
            printf("%-4s %6" PRIu64 "KiB %12.0f %8.3f %12.0f %8.3f %7.3f\n", o->transports[t],
                   sizes[s] >> 10, on, on * gb, off, off * gb, ratio);
            kvp_bench_result_begin(out, "ha");
            kvp_bench_result_str(out, "part", "records");
            kvp_bench_result_str(out, "op", "put");
            kvp_bench_result_str(out, "transport", o->transports[t]);
            kvp_bench_result_int(out, "size", (int64_t)sizes[s]);
            kvp_bench_result_int(out, "batch", HA_REC_BATCH);
            kvp_bench_result_int(out, "threads", 1);
            kvp_bench_result_num(out, "duration_s", o->duration_s);
            kvp_bench_result_num(out, "objs_per_s_on", on);
            kvp_bench_result_num(out, "gbps_on", on * gb);
            kvp_bench_result_num(out, "objs_per_s_off", off);
            kvp_bench_result_num(out, "gbps_off", off * gb);
            kvp_bench_result_num(out, "ratio_on_off", ratio);
            kvp_bench_result_end(out);
        }
    }
    fflush(stdout);
    return rc;
}

/* ---------------- rebuild after a master restart ---------------- */

typedef struct rb_buf {
    char keys[HA_RB_BATCH][HA_KEY_LEN];
    const char *kp[HA_RB_BATCH];
    void *buf[HA_RB_BATCH];
    size_t sizes[HA_RB_BATCH];
    kvp_status_t res[HA_RB_BATCH];
    int64_t got[HA_RB_BATCH];
    char mem[HA_RB_BATCH][HA_RB_OBJ];
    char want[HA_RB_OBJ];
} rb_buf_t;

static void rb_key(char *buf, uint64_t i)
{
    snprintf(buf, HA_KEY_LEN, "ha@rb@%" PRIu64, i);
}

/* Put objects 0..n-1 in batches. */
static int rb_put(kvp_client_t *c, rb_buf_t *b, uint64_t n)
{
    for (uint64_t i = 0; i < n; i += HA_RB_BATCH) {
        unsigned k = n - i < HA_RB_BATCH ? (unsigned)(n - i) : HA_RB_BATCH;
        for (unsigned j = 0; j < k; j++) {
            rb_key(b->keys[j], i + j);
            fill(b->mem[j], HA_RB_OBJ, i + j);
        }
        kvp_status_t st =
            kvp_batch_put_from(c, b->kp, (const void *const *)b->buf, b->sizes, k, NULL, b->res);
        if (st != KVP_OK) {
            fprintf(stderr,
                    "kvpool-bench: ha: rebuild: put of %u objects at %" PRIu64 ": %s (%s)\n", k, i,
                    kvp_strerror(st), kvp_client_last_error());
            return 1;
        }
    }
    return 0;
}

/* Read HA_RB_SAMPLE random objects of 0..n-1 back; 0 when every byte is right. */
static int rb_verify(kvp_client_t *c, rb_buf_t *b, uint64_t n)
{
    uint64_t rng = kvp_bench_mix64((uint64_t)time(NULL) ^ (uint64_t)getpid());
    for (unsigned done = 0; done < HA_RB_SAMPLE;) {
        unsigned k = HA_RB_SAMPLE - done < HA_RB_BATCH ? HA_RB_SAMPLE - done : HA_RB_BATCH;
        uint64_t idx[HA_RB_BATCH];
        for (unsigned j = 0; j < k; j++) {
            rng = kvp_bench_mix64(rng);
            idx[j] = rng % n;
            rb_key(b->keys[j], idx[j]);
        }
        kvp_status_t st = kvp_batch_get_into(c, b->kp, b->buf, b->sizes, k, b->got);
        for (unsigned j = 0; j < k; j++) {
            fill(b->want, HA_RB_OBJ, idx[j]);
            if (b->got[j] != HA_RB_OBJ || memcmp(b->mem[j], b->want, HA_RB_OBJ) != 0) {
                fprintf(stderr, "kvpool-bench: ha: rebuild: %s read back %s\n", b->keys[j],
                        b->got[j] < 0 ? kvp_strerror((kvp_status_t)b->got[j]) : "wrong bytes");
                return 1;
            }
        }
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench: ha: rebuild: get: %s\n", kvp_strerror(st));
            return 1;
        }
        done += k;
    }
    return 0;
}

/* The rebuild part's figures. */
typedef struct rb_figs {
    uint64_t n, seg;        /* objects, bytes per segment */
    double t_put;           /* seconds the puts took */
    double remount_s;       /* from the new master's start to every segment back; -1: never */
    double rebuild_s;       /* ... to every object in its index; -1: never */
    uint64_t seen, adopted; /* objects the new master counts, and adopted */
    long long rss_before, rss_after; /* the old master's RSS, the new one's */
} rb_figs_t;

/* Poll the new master's stat (started at t0) until it counts every object, at most
 * HA_RB_MAX_S. */
static void rb_wait(kvp_client_t *c, double t0, rb_figs_t *fg)
{
    kvp_pool_stat_t *ps = NULL;
    while (kvp_bench_now() - t0 < HA_RB_MAX_S) {
        if (kvp_pool_stat(c, &ps) == KVP_OK) {
            double t = kvp_bench_now() - t0;
            fg->seen = ps->objects;
            fg->adopted = ps->adopted_objects;
            if (fg->remount_s < 0 && ps->n_segments == HA_RB_SEGS)
                fg->remount_s = t;
            kvp_pool_stat_free(ps);
            ps = NULL;
            if (fg->seen >= fg->n) {
                fg->rebuild_s = t;
                break;
            }
        }
        usleep(HA_RB_POLL_US);
    }
}

/* The rebuild's table and result object. */
static void rb_report(kvp_bench_out_t *out, const rb_figs_t *fg)
{
    printf("== ha: rebuild of the index after kill -9 of the master (%u segments of %" PRIu64
           " MiB, records on) ==\n",
           HA_RB_SEGS, fg->seg >> 20);
    printf("%10s %8s %10s %11s %10s %13s %12s %12s %8s\n", "objects", "size", "put obj/s",
           "remount ms", "rebuild ms", "adopted", "RSS before", "RSS after", "sample");
    printf("%10" PRIu64 " %6uKiB %10.0f %11.1f %10.1f %13" PRIu64 " %9lld MiB %8lld MiB %8s\n",
           fg->n, HA_RB_OBJ >> 10, (double)fg->n / fg->t_put, fg->remount_s * 1e3,
           fg->rebuild_s * 1e3, fg->adopted, fg->rss_before >> 20, fg->rss_after >> 20, "ok");
    kvp_bench_result_begin(out, "ha");
    kvp_bench_result_str(out, "part", "rebuild");
    kvp_bench_result_int(out, "objects", (int64_t)fg->n);
    kvp_bench_result_int(out, "size", HA_RB_OBJ);
    kvp_bench_result_int(out, "segments", HA_RB_SEGS);
    kvp_bench_result_int(out, "segment_size", (int64_t)fg->seg);
    kvp_bench_result_num(out, "put_objs_per_s", (double)fg->n / fg->t_put);
    kvp_bench_result_num(out, "remount_ms", fg->remount_s * 1e3);
    kvp_bench_result_num(out, "rebuild_ms", fg->rebuild_s * 1e3);
    kvp_bench_result_int(out, "adopted_objects", (int64_t)fg->adopted);
    kvp_bench_result_int(out, "rss_before_kib", fg->rss_before < 0 ? -1 : fg->rss_before >> 10);
    kvp_bench_result_int(out, "rss_after_kib", fg->rss_after < 0 ? -1 : fg->rss_after >> 10);
    kvp_bench_result_int(out, "verified", HA_RB_SAMPLE);
    kvp_bench_result_str(out, "verify", "ok");
    kvp_bench_result_end(out);
    fflush(stdout);
}

static int run_rebuild(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    rb_figs_t fg = {.n = o->ha_objects, .remount_s = -1, .rebuild_s = -1};
    uint64_t n = fg.n;
    /* about twice the objects' bytes over the segments (room to spare), in 64 MiB steps */
    uint64_t step = 64ull << 20, seg = (n * HA_RB_OBJ * 2 / HA_RB_SEGS + step - 1) / step * step;
    if (seg < step)
        seg = step;
    fg.seg = seg;
    rb_buf_t *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        fprintf(stderr, "kvpool-bench: ha: out of memory\n");
        return 1;
    }
    for (unsigned j = 0; j < HA_RB_BATCH; j++) {
        b->kp[j] = b->keys[j];
        b->buf[j] = b->mem[j];
        b->sizes[j] = HA_RB_OBJ;
    }
    kvp_bench_cluster_params_t cp = {.n = HA_RB_SEGS, .seg_size = seg, .segment_records = "on"};
    kvp_bench_cluster_t cl;
    kvp_bench_progress(o, "ha: rebuild: starting a master and %u segments of %" PRIu64 " MiB",
                       HA_RB_SEGS, seg >> 20);
    if (kvp_bench_cluster_start_params(&cl, &cp) != 0) {
        kvp_bench_progress_done(o);
        fprintf(stderr, "kvpool-bench: ha: cannot start a local cluster\n");
        free(b);
        return 1;
    }
    kvp_client_t *c = NULL;
    kvp_pool_stat_t *ps = NULL;
    kvp_status_t st = client_open(cl.master_addr, NULL, HA_FO_TIMEOUT_MS, &c);
    int rc = 1;
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench: ha: rebuild: client: %s\n", kvp_strerror(st));
        goto out;
    }
    kvp_register_buffer(c, b->mem, sizeof(b->mem));
    kvp_bench_progress(o, "ha: rebuild: putting %" PRIu64 " objects of 1 KiB", n);
    fg.t_put = kvp_bench_now();
    if (rb_put(c, b, n) != 0)
        goto out;
    fg.t_put = kvp_bench_now() - fg.t_put;
    if ((st = kvp_pool_stat(c, &ps)) != KVP_OK || ps->objects != n) {
        fprintf(stderr,
                "kvpool-bench: ha: rebuild: the pool holds %" PRIu64 " objects, not %" PRIu64
                " (%s)\n",
                ps ? ps->objects : 0, n, kvp_strerror(st));
        goto out;
    }
    kvp_pool_stat_free(ps);
    ps = NULL;
    fg.rss_before = kvp_bench_rss_bytes(cl.master_pid);
    kvp_bench_progress(o, "ha: rebuild: kill -9 of the master, a new one on %s", cl.master_addr);
    kill9(cl.master_pid);
    char addr[128];
    cl.master_pid = kvp_bench_master_start(cl.master_addr, "on", NULL, addr, sizeof(addr));
    double t0 = kvp_bench_now();
    if (cl.master_pid < 0) {
        cl.master_pid = 0;
        fprintf(stderr, "kvpool-bench: ha: rebuild: no new master on %s\n", cl.master_addr);
        goto out;
    }
    rb_wait(c, t0, &fg);
    fg.rss_after = kvp_bench_rss_bytes(cl.master_pid);
    if (fg.rebuild_s < 0 || fg.seen != n) {
        fprintf(stderr,
                "kvpool-bench: ha: rebuild: the new master shows %" PRIu64 " objects of %" PRIu64
                " after %.0f s\n",
                fg.seen, n, kvp_bench_now() - t0);
        goto out;
    }
    kvp_bench_progress(o, "ha: rebuild: reading %u random objects back", HA_RB_SAMPLE);
    if (rb_verify(c, b, n) != 0)
        goto out;
    rc = 0;
    kvp_bench_progress_done(o);
    rb_report(out, &fg);
out:
    kvp_bench_progress_done(o);
    kvp_pool_stat_free(ps);
    if (c != NULL)
        kvp_unregister_buffer(c, b->mem);
    kvp_client_destroy(c);
    /* killed, not stopped: a stopped serve drains its objects to the others first */
    for (unsigned i = 0; i < cl.n_segs; i++)
        kill9(cl.seg_pids[i]);
    cl.n_segs = 0;
    kvp_bench_cluster_stop(&cl);
    free(b);
    return rc;
}

/* ---------------- failover through etcd ---------------- */

typedef struct ha_etcd {
    pid_t pid;
    char dir[256];     /* data dir and log; removed at the end */
    char endpoint[64]; /* 127.0.0.1:PORT */
} ha_etcd_t;

static bool etcd_on_path(void)
{
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", path != NULL ? path : "/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d != NULL;
         d = strtok_r(NULL, ":", &save)) {
        char exe[4200];
        snprintf(exe, sizeof(exe), "%s/etcd", d);
        if (access(exe, X_OK) == 0)
            return true;
    }
    return false;
}

/* A port of 20000..32767 free on 127.0.0.1 now, or -1. */
static int free_port(uint64_t *rng)
{
    for (int i = 0; i < 1000; i++) {
        *rng = kvp_bench_mix64(*rng);
        int port = 20000 + (int)(*rng % 12768);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        close(fd);
        if (ok)
            return port;
    }
    return -1;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void etcd_stop(ha_etcd_t *e)
{
    kill9(e->pid);
    e->pid = 0;
    if (e->dir[0] != '\0')
        nftw(e->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    e->dir[0] = '\0';
}

static pid_t etcd_spawn(const ha_etcd_t *e, int cport, int pport)
{
    char data[300], log[300], curl[64], purl[64], initial[96];
    snprintf(data, sizeof(data), "%s/data", e->dir);
    snprintf(log, sizeof(log), "%s/etcd.log", e->dir);
    snprintf(curl, sizeof(curl), "http://127.0.0.1:%d", cport);
    snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", pport);
    snprintf(initial, sizeof(initial), "m0=%s", purl);
    char *argv[] = {"etcd",
                    "--name",
                    "m0",
                    "--data-dir",
                    data,
                    "--listen-client-urls",
                    curl,
                    "--advertise-client-urls",
                    curl,
                    "--listen-peer-urls",
                    purl,
                    "--initial-advertise-peer-urls",
                    purl,
                    "--initial-cluster",
                    initial,
                    "--initial-cluster-state",
                    "new",
                    "--logger=zap",
                    "--log-outputs=stderr",
                    NULL};
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the bench */
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
        _exit(127);
    execvp(argv[0], argv);
    _exit(127);
}

/* One etcd member on random ports; 0 once it answers reads, else -1 (message on stderr). */
static int etcd_start(ha_etcd_t *e)
{
    memset(e, 0, sizeof(*e));
    const char *tmp = getenv("TMPDIR");
    snprintf(e->dir, sizeof(e->dir), "%s/kvpool-bench-etcd.XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(e->dir) == NULL) {
        fprintf(stderr, "kvpool-bench: ha: mkdtemp %s: %s\n", e->dir, strerror(errno));
        e->dir[0] = '\0';
        return -1;
    }
    uint64_t rng = kvp_bench_mix64((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20));
    for (int attempt = 0; attempt < 3; attempt++) {
        int cport = free_port(&rng), pport = free_port(&rng);
        if (cport < 0 || pport < 0 || cport == pport)
            continue;
        snprintf(e->endpoint, sizeof(e->endpoint), "127.0.0.1:%d", cport);
        e->pid = etcd_spawn(e, cport, pport);
        if (e->pid < 0)
            break;
        kvp_etcd_t *h = NULL;
        bool healthy = false, exited = false;
        kvp_etcd_create(e->endpoint, 500, &h);
        for (double t0 = kvp_bench_now(); h != NULL && kvp_bench_now() - t0 < 20;) {
            kvp_status_t st = kvp_etcd_get(h, "/kvpool-bench/probe", NULL, NULL, NULL, NULL, NULL);
            if ((healthy = st == KVP_OK || st == KVP_ERR_NOT_FOUND))
                break;
            if ((exited = waitpid(e->pid, NULL, WNOHANG) == e->pid))
                break;
            usleep(50 * 1000);
        }
        kvp_etcd_destroy(h);
        if (healthy)
            return 0;
        if (!exited)
            kill9(e->pid);
        e->pid = 0;
        /* a port taken between the check and etcd's bind: new ports, a fresh data dir */
        char data[300];
        snprintf(data, sizeof(data), "%s/data", e->dir);
        nftw(data, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    fprintf(stderr, "kvpool-bench: ha: etcd did not start (its log: %s/etcd.log, kept)\n", e->dir);
    e->dir[0] = '\0';
    return -1;
}

/* The background load: put, get (checked), remove 16 KiB objects of distinct keys. */
enum { FO_PUT, FO_GET, FO_REMOVE, FO_LOST, FO_WRONG, FO_N };
#define FO_IDS 64 /* failed calls whose object is remembered, per kind */
static const char *const fo_what[FO_N] = {"put", "get", "remove", "lost", "get"};

typedef struct fo_load {
    const char *master;
    double t0;          /* bucket 0 starts here */
    uint32_t *ok, *err; /* successful puts and gets, failed calls, per HA_FO_BUCKET_S */
    size_t n_buckets;
    atomic_bool stop, ready; /* ready: the loop runs (or its client failed: no_client) */
    bool no_client;
    /* failed puts, gets, removes; objects not read back within HA_FO_MAX_S; wrong bytes */
    uint64_t n[FO_N];
    char first[FO_N][400];      /* the first failure of each kind, with its time */
    double last[FO_N];          /* the time of the last one */
    uint64_t late_reads;        /* objects a get did not find at first but a retry did */
    double late_max_s;          /* the longest of those waits */
    uint64_t ids[FO_N][FO_IDS]; /* the load objects of the first failed calls of each kind */
    int64_t leftover;           /* load and probe objects in the pool after the end (-1: unknown) */
    /* of those, load objects whose remove failed, whose put failed, and the rest */
    uint64_t leftover_removed, leftover_put, leftover_other;
    char leftover_keys[4 * HA_KEY_LEN]; /* the first few */
} fo_load_t;

static void fo_count(const fo_load_t *l, uint32_t *buckets)
{
    double b = (kvp_bench_now() - l->t0) / HA_FO_BUCKET_S;
    if (b >= 0 && (size_t)b < l->n_buckets)
        buckets[(size_t)b]++;
}

static void fo_error(fo_load_t *l, int kind, const char *key, const char *why)
{
    l->last[kind] = kvp_bench_now() - l->t0;
    if (l->n[kind] < FO_IDS)
        sscanf(key, "ha@fo@load@%" SCNu64, &l->ids[kind][l->n[kind]]);
    if (l->n[kind]++ == 0)
        snprintf(l->first[kind], sizeof(l->first[0]), "%.2f s: %s %s: %s [%s]", l->last[kind],
                 fo_what[kind], key, why, kvp_client_last_error());
    fo_count(l, l->err);
}

/* Read key back; a get that fails is retried every 20 ms (an index being rebuilt). */
static void fo_get(fo_load_t *l, kvp_client_t *c, const char *key, const char *src, char *dst)
{
    double t0 = kvp_bench_now();
    int64_t got = kvp_get_into(c, key, dst, HA_FO_OBJ);
    if (got < 0) {
        fo_error(l, FO_GET, key, kvp_strerror((kvp_status_t)got));
        while (got < 0 && kvp_bench_now() - t0 < HA_FO_MAX_S) {
            usleep(20 * 1000);
            got = kvp_get_into(c, key, dst, HA_FO_OBJ);
        }
        if (got >= 0) {
            l->late_reads++;
            if (kvp_bench_now() - t0 > l->late_max_s)
                l->late_max_s = kvp_bench_now() - t0;
        }
    }
    if (got < 0)
        fo_error(l, FO_LOST, key, kvp_strerror((kvp_status_t)got));
    else if (got != HA_FO_OBJ || memcmp(src, dst, HA_FO_OBJ) != 0)
        fo_error(l, FO_WRONG, key, "wrong bytes");
    else
        fo_count(l, l->ok);
}

static void *fo_load_main(void *arg)
{
    fo_load_t *l = arg;
    kvp_client_t *c = NULL;
    char *src = malloc(HA_FO_OBJ), *dst = malloc(HA_FO_OBJ);
    kvp_status_t st = client_open(l->master, NULL, HA_FO_TIMEOUT_MS, &c);
    l->no_client = st != KVP_OK || src == NULL || dst == NULL;
    atomic_store(&l->ready, true);
    char key[HA_KEY_LEN];
    for (uint64_t i = 0; !l->no_client && !atomic_load(&l->stop); i++) {
        snprintf(key, sizeof(key), "ha@fo@load@%" PRIu64, i);
        fill(src, HA_FO_OBJ, i);
        if ((st = kvp_put(c, key, src, HA_FO_OBJ, NULL)) != KVP_OK) {
            fo_error(l, FO_PUT, key, kvp_strerror(st));
            continue;
        }
        fo_count(l, l->ok);
        fo_get(l, c, key, src, dst);
        if ((st = kvp_remove_force(c, key)) != KVP_OK)
            fo_error(l, FO_REMOVE, key, kvp_strerror(st));
    }
    kvp_client_destroy(c);
    free(src);
    free(dst);
    return NULL;
}

/* The sum of buckets in [from, from + HA_FO_WINDOW_S) (whole buckets). */
static uint64_t fo_window(const fo_load_t *l, const uint32_t *buckets, double from)
{
    uint64_t sum = 0;
    long b0 = (long)((from - l->t0) / HA_FO_BUCKET_S);
    for (long b = b0; b < b0 + (long)(HA_FO_WINDOW_S / HA_FO_BUCKET_S + 0.5); b++)
        if (b >= 0 && (size_t)b < l->n_buckets)
            sum += buckets[b];
    return sum;
}

/* The failover part's cluster and its resident objects. */
typedef struct fo {
    kvp_client_t *c;
    kvp_etcd_t *h;
    const char *const *flags; /* the masters' flags */
    char leader_key[64];
    char addr[HA_FO_MASTERS][128];
    pid_t pid[HA_FO_MASTERS];
    /* HA_FO_RESIDENT objects put before the first round, read back after every failover */
    char *src, *dst;
    char keys[HA_FO_RESIDENT][HA_KEY_LEN];
    const char *kp[HA_FO_RESIDENT];
    const void *sp[HA_FO_RESIDENT];
    void *dp[HA_FO_RESIDENT];
    size_t sizes[HA_FO_RESIDENT];
    int64_t got[HA_FO_RESIDENT];
    kvp_status_t res[HA_FO_RESIDENT];
} fo_t;

typedef struct fo_round {
    double t_kill, failover_s;
    double index_s; /* from the kill to the leader's stat counting every resident object */
    int killed;
    uint64_t epoch, probe_errors;
    unsigned missing, wrong; /* resident objects not read back, read back wrong */
    char leader[128];        /* the leader key's value after the failover */
    char probe_err[200];     /* the probe's first failure */
} fo_round_t;

/* Index of the master whose address is the leader key's value (copied to val), or -1. */
static int fo_leader(fo_t *f, char *val, size_t len)
{
    char *v = NULL;
    int who = -1;
    val[0] = '\0';
    if (kvp_etcd_get(f->h, f->leader_key, &v, NULL, NULL, NULL, NULL) == KVP_OK) {
        snprintf(val, len, "%s", v);
        for (int i = 0; i < HA_FO_MASTERS && who < 0; i++)
            if (strcmp(v, f->addr[i]) == 0)
                who = i;
    }
    free(v);
    return who;
}

static int fo_resident_put(fo_t *f)
{
    for (unsigned i = 0; i < HA_FO_RESIDENT; i++) {
        f->kp[i] = f->keys[i];
        f->sp[i] = f->src + (size_t)i * HA_FO_OBJ;
        f->dp[i] = f->dst + (size_t)i * HA_FO_OBJ;
        f->sizes[i] = HA_FO_OBJ;
        snprintf(f->keys[i], HA_KEY_LEN, "ha@fo@resident@%u", i);
        fill(f->src + (size_t)i * HA_FO_OBJ, HA_FO_OBJ, (1ull << 40) + i);
    }
    kvp_status_t st =
        kvp_batch_put_from(f->c, f->kp, f->sp, f->sizes, HA_FO_RESIDENT, NULL, f->res);
    if (st != KVP_OK)
        fprintf(stderr, "kvpool-bench: ha: failover: put of the resident objects: %s (%s)\n",
                kvp_strerror(st), kvp_client_last_error());
    return st == KVP_OK ? 0 : -1;
}

/* After a failover: wait for the index to count the resident objects (index_s), then read
 * them all back; one not found is counted and put again, so every round starts whole. */
static void fo_resident_check(fo_t *f, fo_round_t *fr)
{
    fr->index_s = -1;
    while (kvp_bench_now() - fr->t_kill < fr->failover_s + HA_FO_INDEX_MAX_S) {
        kvp_pool_stat_t *ps;
        if (kvp_pool_stat(f->c, &ps) == KVP_OK) {
            bool all = ps->objects >= HA_FO_RESIDENT;
            kvp_pool_stat_free(ps);
            if (all) {
                fr->index_s = kvp_bench_now() - fr->t_kill;
                break;
            }
        }
        usleep(HA_RB_POLL_US);
    }
    kvp_batch_get_into(f->c, f->kp, f->dp, f->sizes, HA_FO_RESIDENT, f->got);
    for (unsigned i = 0; i < HA_FO_RESIDENT; i++) {
        if (f->got[i] == HA_FO_OBJ && memcmp(f->dp[i], f->sp[i], HA_FO_OBJ) == 0)
            continue;
        if (f->got[i] >= 0) {
            fr->wrong++;
            continue;
        }
        fr->missing++;
        if (kvp_put(f->c, f->kp[i], f->sp[i], HA_FO_OBJ, NULL) != KVP_OK)
            fprintf(stderr, "kvpool-bench: ha: failover: cannot put %s again\n", f->kp[i]);
    }
}

static void sleep_until(double t)
{
    double d = t - kvp_bench_now();
    if (d > 0)
        usleep((useconds_t)(d * 1e6));
}

/*
 * One round: kill the leader, put fresh keys until a put succeeds, check the resident
 * objects, start the killed master again as a standby. 0, or -1 with a message on stderr.
 */
static int fo_round(fo_t *f, unsigned r, fo_round_t *fr)
{
    int k = -1;
    for (double t0 = kvp_bench_now(); k < 0 && kvp_bench_now() - t0 < HA_FO_MAX_S;)
        if ((k = fo_leader(f, fr->leader, sizeof(fr->leader))) < 0)
            usleep(20 * 1000);
    if (k < 0) {
        fprintf(stderr, "kvpool-bench: ha: failover: no leader among the masters in etcd (%s)\n",
                kvp_etcd_error(f->h));
        return -1;
    }
    char key[HA_KEY_LEN];
    const char *src = f->src; /* any 16 KiB */
    fr->killed = k;
    fr->t_kill = kvp_bench_now();
    kill9(f->pid[k]);
    f->pid[k] = 0;
    kvp_status_t st = KVP_ERR_TIMEOUT;
    for (unsigned a = 0; kvp_bench_now() - fr->t_kill < HA_FO_MAX_S; a++) {
        snprintf(key, sizeof(key), "ha@fo@probe@%u@%u", r, a);
        if ((st = kvp_put(f->c, key, src, HA_FO_OBJ, NULL)) == KVP_OK)
            break;
        if (fr->probe_errors++ == 0)
            snprintf(fr->probe_err, sizeof(fr->probe_err), "%.0f ms after the kill: put %s: %s",
                     (kvp_bench_now() - fr->t_kill) * 1e3, key, kvp_strerror(st));
    }
    fr->failover_s = kvp_bench_now() - fr->t_kill;
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench: ha: failover round %u: no put succeeded in %.0f s\n", r + 1,
                HA_FO_MAX_S);
        return -1;
    }
    kvp_remove_force(f->c, key);
    fo_resident_check(f, fr);
    kvp_pool_stat_t *ps;
    if (kvp_pool_stat(f->c, &ps) == KVP_OK) {
        fr->epoch = ps->epoch;
        kvp_pool_stat_free(ps);
    }
    fo_leader(f, fr->leader, sizeof(fr->leader));
    char again[128];
    f->pid[k] = kvp_bench_master_start(f->addr[k], "on", f->flags, again, sizeof(again));
    if (f->pid[k] < 0) {
        f->pid[k] = 0;
        fprintf(stderr, "kvpool-bench: ha: failover: cannot start %s again\n", f->addr[k]);
        return -1;
    }
    return 0;
}

static void fo_report(const kvp_bench_opts_t *o, kvp_bench_out_t *out, const fo_load_t *l,
                      const fo_round_t *fr, unsigned n, const fo_t *f)
{
    printf("== ha: failover: kill -9 of the leader of %d masters (etcd, --leader-ttl %u), "
           "%u segments, 16 KiB objects (%u resident), rpc timeout %u ms ==\n",
           HA_FO_MASTERS, o->leader_ttl, HA_FO_SEGS, HA_FO_RESIDENT, HA_FO_TIMEOUT_MS);
    printf("%5s %-17s %-17s %5s %9s %8s %7s %8s %8s %6s %6s %6s\n", "round", "killed", "new leader",
           "epoch", "failover", "index", "missing", "ops pre", "ops post", "ratio", "bg err",
           "probe");
    printf("%5s %-17s %-17s %5s %9s %8s %7s %8s %8s %6s %6s %6s\n", "", "", "", "", "ms", "ms", "",
           "3 s", "3 s", "", "", "err");
    uint64_t pre_all = 0, post_all = 0, probe_errors = 0, missing = 0, wrong = 0;
    double v[1000];
    for (unsigned r = 0; r < n; r++) {
        uint64_t pre = fo_window(l, l->ok, fr[r].t_kill - HA_FO_WINDOW_S);
        uint64_t post = fo_window(l, l->ok, fr[r].t_kill);
        uint64_t errs = fo_window(l, l->err, fr[r].t_kill);
        double ratio = pre ? (double)post / (double)pre : 0;
        pre_all += pre;
        post_all += post;
        probe_errors += fr[r].probe_errors;
        missing += fr[r].missing;
        wrong += fr[r].wrong;
        v[r] = fr[r].failover_s * 1e3;
        double index_ms = fr[r].index_s < 0 ? -1 : fr[r].index_s * 1e3; /* -1: not in time */
        printf("%5u %-17s %-17s %5" PRIu64 " %9.1f %8.1f %7u %8" PRIu64 " %8" PRIu64
               " %6.3f %6" PRIu64 " %6" PRIu64 "\n",
               r + 1, f->addr[fr[r].killed], fr[r].leader, fr[r].epoch, v[r], index_ms,
               fr[r].missing + fr[r].wrong, pre, post, ratio, errs, fr[r].probe_errors);
        kvp_bench_result_begin(out, "ha");
        kvp_bench_result_str(out, "part", "failover_round");
        kvp_bench_result_int(out, "round", r + 1);
        kvp_bench_result_int(out, "leader_ttl", o->leader_ttl);
        kvp_bench_result_str(out, "killed", f->addr[fr[r].killed]);
        kvp_bench_result_str(out, "new_leader", fr[r].leader);
        kvp_bench_result_int(out, "epoch", (int64_t)fr[r].epoch);
        kvp_bench_result_num(out, "failover_ms", v[r]);
        kvp_bench_result_num(out, "index_ms", index_ms);
        kvp_bench_result_int(out, "resident_missing", fr[r].missing);
        kvp_bench_result_int(out, "resident_wrong", fr[r].wrong);
        kvp_bench_result_int(out, "ops_before", (int64_t)pre);
        kvp_bench_result_int(out, "ops_after", (int64_t)post);
        kvp_bench_result_num(out, "ops_ratio", ratio);
        kvp_bench_result_int(out, "errors_after", (int64_t)errs);
        kvp_bench_result_int(out, "probe_errors", (int64_t)fr[r].probe_errors);
        kvp_bench_result_str(out, "probe_first_error", fr[r].probe_err);
        kvp_bench_result_end(out);
    }
    for (unsigned r = 0; r < n; r++)
        if (fr[r].probe_errors > 0)
            printf("  round %u: %" PRIu64 " failed probe put(s), the first %s\n", r + 1,
                   fr[r].probe_errors, fr[r].probe_err);
    for (int k = 0; k < FO_N; k++)
        if (l->n[k] > 0)
            printf("  background: %" PRIu64 " failed %s(s) (the last at %.2f s), the first at %s\n",
                   l->n[k], k == FO_LOST ? "read-back" : fo_what[k], l->last[k], l->first[k]);
    double per_s = n * HA_FO_WINDOW_S, ratio = pre_all ? (double)post_all / (double)pre_all : 0;
    double mn = v[0], mx = v[0];
    for (unsigned r = 1; r < n; r++) {
        mn = v[r] < mn ? v[r] : mn;
        mx = v[r] > mx ? v[r] : mx;
    }
    double med = kvp_bench_percentile(v, n, 50);
    printf("failover ms: median %.1f, min %.1f, max %.1f over %u rounds; background put+get: "
           "%.0f ops/s in the 3 s before a kill, %.0f in the 3 s after (ratio %.3f)\n",
           med, mn, mx, n, (double)pre_all / per_s, (double)post_all / per_s, ratio);
    printf("failed calls: %" PRIu64 " background puts, %" PRIu64 " gets (%" PRIu64
           " of those objects read by a retry, after at most %.0f ms), %" PRIu64
           " removes, %" PRIu64 " probe puts; background objects lost %" PRIu64
           ", read back wrong %" PRIu64 "; resident objects missing after a failover %" PRIu64
           ", wrong %" PRIu64 "\n",
           l->n[FO_PUT], l->n[FO_GET], l->late_reads, l->late_max_s * 1e3, l->n[FO_REMOVE],
           probe_errors, l->n[FO_LOST], l->n[FO_WRONG], missing, wrong);
    if (l->leftover < 0)
        printf("leftover objects: cannot list keys\n");
    if (l->leftover > 0)
        printf("objects removed (or whose put failed) still in the pool at the end: %" PRId64
               " (%" PRIu64 " whose remove failed, %" PRIu64 " whose put failed, %" PRIu64
               " other), e.g. %s\n",
               l->leftover, l->leftover_removed, l->leftover_put, l->leftover_other,
               l->leftover_keys);
    kvp_bench_result_begin(out, "ha");
    kvp_bench_result_str(out, "part", "failover");
    kvp_bench_result_str(out, "skipped", "");
    kvp_bench_result_int(out, "rounds", n);
    kvp_bench_result_int(out, "masters", HA_FO_MASTERS);
    kvp_bench_result_int(out, "segments", HA_FO_SEGS);
    kvp_bench_result_int(out, "leader_ttl", o->leader_ttl);
    kvp_bench_result_int(out, "rpc_timeout_ms", HA_FO_TIMEOUT_MS);
    kvp_bench_result_int(out, "size", HA_FO_OBJ);
    kvp_bench_result_int(out, "resident", HA_FO_RESIDENT);
    kvp_bench_result_num(out, "failover_ms_median", med);
    kvp_bench_result_num(out, "failover_ms_min", mn);
    kvp_bench_result_num(out, "failover_ms_max", mx);
    kvp_bench_result_num(out, "ops_per_s_before", (double)pre_all / per_s);
    kvp_bench_result_num(out, "ops_per_s_after", (double)post_all / per_s);
    kvp_bench_result_num(out, "ops_ratio", ratio);
    kvp_bench_result_int(out, "put_errors", (int64_t)l->n[FO_PUT]);
    kvp_bench_result_int(out, "get_errors", (int64_t)l->n[FO_GET]);
    kvp_bench_result_int(out, "late_reads", (int64_t)l->late_reads);
    kvp_bench_result_num(out, "late_read_max_ms", l->late_max_s * 1e3);
    kvp_bench_result_int(out, "remove_errors", (int64_t)l->n[FO_REMOVE]);
    kvp_bench_result_int(out, "probe_errors", (int64_t)probe_errors);
    kvp_bench_result_int(out, "lost_objects", (int64_t)l->n[FO_LOST]);
    kvp_bench_result_int(out, "wrong_bytes", (int64_t)l->n[FO_WRONG]);
    kvp_bench_result_int(out, "resident_missing", (int64_t)missing);
    kvp_bench_result_int(out, "resident_wrong", (int64_t)wrong);
    kvp_bench_result_int(out, "leftover_objects", l->leftover);
    kvp_bench_result_int(out, "leftover_after_failed_remove", (int64_t)l->leftover_removed);
    kvp_bench_result_int(out, "leftover_after_failed_put", (int64_t)l->leftover_put);
    kvp_bench_result_end(out);
    fflush(stdout);
}

/* Objects of the load or the probes still in the pool once the load stopped: every one was
 * removed (or its put failed), so each is a remove or a put whose outcome was misreported. */
static void fo_leftovers(fo_t *f, fo_load_t *l)
{
    kvp_key_info_t *keys = NULL;
    size_t n = 0;
    l->leftover = 0;
    if (kvp_list_keys(f->c, "^ha@fo@(load|probe)@", 1000, &keys, &n) != KVP_OK) {
        l->leftover = -1;
        return;
    }
    l->leftover = (int64_t)n;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (i < 4)
            at += (size_t)snprintf(l->leftover_keys + at, sizeof(l->leftover_keys) - at, "%s%s",
                                   i ? " " : "", keys[i].key);
        uint64_t id;
        bool removed = false, put = false;
        if (sscanf(keys[i].key, "ha@fo@load@%" SCNu64, &id) == 1) {
            for (uint64_t j = 0; j < l->n[FO_REMOVE] && j < FO_IDS; j++)
                removed |= l->ids[FO_REMOVE][j] == id;
            for (uint64_t j = 0; j < l->n[FO_PUT] && j < FO_IDS; j++)
                put |= l->ids[FO_PUT][j] == id;
        }
        l->leftover_removed += removed;
        l->leftover_put += put && !removed;
        l->leftover_other += !put && !removed;
    }
    kvp_key_list_free(keys, n);
}

/* Whether any round lost or garbled a resident object. */
static bool fo_any_missing(const fo_round_t *fr, unsigned n)
{
    for (unsigned r = 0; r < n; r++)
        if (fr[r].missing > 0 || fr[r].wrong > 0)
            return true;
    return false;
}

/* The failover part where no etcd can run: said, with a result that says why. */
static int fo_skip(kvp_bench_out_t *out)
{
    printf("== ha: failover: SKIPPED: no etcd binary on PATH (Debian: apt-get install "
           "etcd-server) ==\n");
    kvp_bench_result_begin(out, "ha");
    kvp_bench_result_str(out, "part", "failover");
    kvp_bench_result_str(out, "skipped", "no etcd binary on PATH");
    kvp_bench_result_end(out);
    return 0;
}

/* Our etcd is plain http: settings meant for another etcd would only break it. */
static void etcd_env_clear(void)
{
    static const char *const etcd_env[] = {"KVPOOL_ETCD_CACERT", "KVPOOL_ETCD_CERT",
                                           "KVPOOL_ETCD_KEY", "KVPOOL_ETCD_USER",
                                           "KVPOOL_ETCD_PASSWORD_FILE"};
    for (size_t i = 0; i < sizeof(etcd_env) / sizeof(etcd_env[0]); i++)
        unsetenv(etcd_env[i]);
}

/* Start the failover cluster on the etcd at `endpoint`: HA_FO_MASTERS masters with f->flags,
 * HA_FO_SEGS segments against eaddr (their pids in seg), f's client and etcd client; then
 * put the resident objects. 0, or -1 (said on stderr). */
static int fo_start(const kvp_bench_opts_t *o, fo_t *f, const char *endpoint, const char *eaddr,
                    pid_t *seg)
{
    kvp_bench_progress(o, "ha: failover: starting %d masters and %u segments", HA_FO_MASTERS,
                       HA_FO_SEGS);
    for (int i = 0; i < HA_FO_MASTERS; i++)
        if ((f->pid[i] =
                 kvp_bench_master_start(NULL, "on", f->flags, f->addr[i], sizeof(f->addr[i]))) < 0)
            return -1;
    for (unsigned i = 0; i < HA_FO_SEGS; i++)
        if ((seg[i] = kvp_bench_serve_start(eaddr, HA_FO_SEG_SIZE)) < 0)
            return -1;
    kvp_status_t st = client_open(eaddr, NULL, HA_FO_TIMEOUT_MS, &f->c);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench: ha: failover: client: %s\n", kvp_strerror(st));
        return -1;
    }
    if ((st = kvp_etcd_create(endpoint, 2000, &f->h)) != KVP_OK) {
        fprintf(stderr, "kvpool-bench: ha: failover: etcd client: %s\n", kvp_strerror(st));
        return -1;
    }
    return fo_resident_put(f) != 0 ? -1 : 0;
}

/* The rounds, under the background load: the first kill after a full window of steady load,
 * each next one a window after the failover (and a gap after the round); then the last
 * round's window. *n_rounds_p: the rounds done. 0, or -1 when a round failed. */
static int fo_rounds(const kvp_bench_opts_t *o, fo_t *f, fo_round_t *fr, unsigned *n_rounds_p)
{
    double next_kill = kvp_bench_now() + HA_FO_WINDOW_S;
    for (; *n_rounds_p < o->ha_rounds; (*n_rounds_p)++) {
        unsigned r = *n_rounds_p;
        kvp_bench_progress(o, "ha: failover: round %u of %u", r + 1, o->ha_rounds);
        sleep_until(next_kill);
        if (fo_round(f, r, &fr[r]) != 0)
            return -1;
        double now = kvp_bench_now(), ok = fr[r].t_kill + fr[r].failover_s;
        next_kill =
            now + HA_FO_GAP_S > ok + HA_FO_WINDOW_S ? now + HA_FO_GAP_S : ok + HA_FO_WINDOW_S;
    }
    if (*n_rounds_p > 0)
        sleep_until(fr[*n_rounds_p - 1].t_kill + HA_FO_WINDOW_S + HA_FO_BUCKET_S);
    return 0;
}

static int run_failover(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    if (!etcd_on_path())
        return fo_skip(out);
    etcd_env_clear();
    ha_etcd_t e;
    kvp_bench_progress(o, "ha: failover: starting etcd");
    if (etcd_start(&e) != 0) {
        kvp_bench_progress_done(o);
        return 1;
    }
    char name[32], ttl[16], eaddr[128];
    snprintf(name, sizeof(name), "bench%d", (int)getpid());
    snprintf(ttl, sizeof(ttl), "%u", o->leader_ttl);
    snprintf(eaddr, sizeof(eaddr), "etcd://%s/%s", e.endpoint, name);
    const char *flags[] = {"--etcd", e.endpoint,    "--cluster", name, "--leader-ttl",
                           ttl,      "--log-level", "error",     NULL};
    pid_t seg[HA_FO_SEGS] = {0};
    unsigned n_rounds = 0;
    fo_t *f = calloc(1, sizeof(*f));
    fo_round_t *fr = calloc(o->ha_rounds, sizeof(*fr));
    fo_load_t l = {.master = eaddr};
    /* generous: each round takes at most the probe's limit plus the gaps */
    l.n_buckets =
        (size_t)((o->ha_rounds * (HA_FO_MAX_S + 2 * HA_FO_WINDOW_S) + 60) / HA_FO_BUCKET_S);
    l.ok = calloc(l.n_buckets, sizeof(*l.ok));
    l.err = calloc(l.n_buckets, sizeof(*l.err));
    pthread_t th;
    bool load_started = false;
    int rc = 1;
    if (f == NULL || fr == NULL || l.ok == NULL || l.err == NULL ||
        (f->src = malloc((size_t)HA_FO_RESIDENT * HA_FO_OBJ)) == NULL ||
        (f->dst = malloc((size_t)HA_FO_RESIDENT * HA_FO_OBJ)) == NULL) {
        fprintf(stderr, "kvpool-bench: ha: out of memory\n");
        goto out;
    }
    f->flags = flags;
    snprintf(f->leader_key, sizeof(f->leader_key), "/kvpool/%s/leader", name);
    if (fo_start(o, f, e.endpoint, eaddr, seg) != 0)
        goto out;
    l.t0 = kvp_bench_now();
    if (pthread_create(&th, NULL, fo_load_main, &l) != 0) {
        fprintf(stderr, "kvpool-bench: ha: failover: cannot start a thread\n");
        goto out;
    }
    load_started = true;
    while (!atomic_load(&l.ready))
        usleep(10 * 1000);
    if (l.no_client) {
        fprintf(stderr, "kvpool-bench: ha: failover: the background client did not start\n");
        goto out;
    }
    if (fo_rounds(o, f, fr, &n_rounds) != 0)
        goto out;
    rc = 0;
out:
    if (load_started) {
        atomic_store(&l.stop, true);
        pthread_join(th, NULL);
    }
    kvp_bench_progress_done(o);
    if (n_rounds > 0) {
        fo_leftovers(f, &l);
        fo_report(o, out, &l, fr, n_rounds, f);
    }
    if (l.n[FO_LOST] > 0 || l.n[FO_WRONG] > 0 || fo_any_missing(fr, n_rounds)) {
        fprintf(stderr, "kvpool-bench: ha: failover: objects were lost or read back wrong\n");
        rc = 1;
    }
    if (f != NULL) {
        kvp_etcd_destroy(f->h);
        kvp_client_destroy(f->c);
        for (int i = 0; i < HA_FO_MASTERS; i++)
            kill9(f->pid[i]);
        free(f->src);
        free(f->dst);
    }
    for (unsigned i = 0; i < HA_FO_SEGS; i++)
        kill9(seg[i]);
    etcd_stop(&e);
    free(f);
    free(fr);
    free(l.ok);
    free(l.err);
    return rc;
}

int kvp_bench_ha(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    int rc = run_records(o, out);
    rc |= run_rebuild(o, out);
    rc |= run_failover(o, out);
    return rc;
}
