/*
 * bench_dfs.c - kvpool-bench dfs: what a DFS replica costs a put, and what a get from it
 * gives once the memory replica is gone.
 *
 * DESIGN
 * Always a local cluster of its own: a master with --promote-on-hit off (a get from DFS
 * stays one), a `kvpool serve` with a DRAM segment (--segment-size, default 256 MiB) and
 * a `kvpool serve --segment-size 0 --dfs-path DIR --dfs-size` (the DFS owner; --ssd-size,
 * default 2 GiB), DIR a directory of its own in --ssd-dir (a local disk standing in for
 * the shared file system; removed at the end). Two clients: "owner" has no DFS directory
 * (its DFS bytes go through the DFS owner's data server, as for an SSD segment), "direct"
 * has DIR (it reads and writes the shard file itself, io_uring, synced before PutEnd).
 * One thread, 1 MiB objects, batches of 32, CRC32C on, --ssd-objects objects (default
 * 1024, at most what fits 80 % of the DRAM segment and of the DFS segment) per point:
 *
 *   put_mem         the direct client, no DFS replica: the memory tier alone
 *   put_dfs_owner   the owner client, dfs_replica_num 1
 *   put_dfs_direct  the direct client, dfs_replica_num 1
 *   get_dfs_owner   the DRAM serve killed (SIGKILL): every object is on DFS only; the
 *                   owner client reads them all back (through the DFS owner)
 *   get_dfs_direct  the direct client reads them all back (the shard file)
 *
 * Each get point checks every object's bytes and that the client's metrics counted its
 * reads on the transport it is named for ("ssd": through the owner, "dfs": in the file);
 * a failed call or wrong bytes fail the mode.
 * Thread: the caller's.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "client/tools/bench/bench.h"
#include "common/macros.h"

#define DFS_OBJ (1u << 20)
#define DFS_BATCH 32u
#define DFS_KEY_LEN 64

typedef struct dfs_bench {
    const kvp_bench_opts_t *o;
    kvp_bench_out_t *out;
    void *src[DFS_BATCH], *dst[DFS_BATCH];
    size_t sizes[DFS_BATCH];
    char keys[DFS_BATCH][DFS_KEY_LEN];
    const char *kp[DFS_BATCH];
    kvp_status_t res[DFS_BATCH];
    int64_t got[DFS_BATCH];
    uint64_t n; /* objects per point */
} dfs_bench_t;

static void set_keys(dfs_bench_t *s, const char *part, uint64_t first, unsigned b)
{
    for (unsigned i = 0; i < b; i++) {
        snprintf(s->keys[i], DFS_KEY_LEN, "dfsbench@%s@%" PRIu64, part, first + i);
        s->kp[i] = s->keys[i];
        s->sizes[i] = DFS_OBJ;
        s->res[i] = KVP_OK;
    }
}

/* Put objects [0, s->n) of part; each batch's time into lat. 0, or -1. */
static int put_all(dfs_bench_t *s, kvp_client_t *c, const char *part, uint32_t dfs,
                   kvp_bench_lat_t *lat, double *secs_p)
{
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.dfs_replica_num = dfs;
    double t0 = kvp_bench_now();
    for (uint64_t first = 0; first < s->n; first += DFS_BATCH) {
        unsigned b = (unsigned)(s->n - first < DFS_BATCH ? s->n - first : DFS_BATCH);
        set_keys(s, part, first, b);
        for (unsigned i = 0; i < b; i++)
            memcpy(s->src[i], &(uint64_t){first + i}, 8);
        double b0 = kvp_bench_now();
        kvp_status_t st =
            kvp_batch_put_from(c, s->kp, (const void *const *)s->src, s->sizes, b, &cfg, s->res);
        kvp_bench_lat_add(lat, kvp_bench_now() - b0);
        for (unsigned i = 0; i < b && st == KVP_OK; i++)
            st = s->res[i];
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench: dfs: put %s: %s (%s)\n", part, kvp_strerror(st),
                    kvp_client_last_error());
            return -1;
        }
    }
    *secs_p = kvp_bench_now() - t0;
    return 0;
}

/* Read objects [0, s->n) of part back, checking each. 0, or -1. */
static int get_all(dfs_bench_t *s, kvp_client_t *c, const char *part, kvp_bench_lat_t *lat,
                   double *secs_p)
{
    double t0 = kvp_bench_now();
    for (uint64_t first = 0; first < s->n; first += DFS_BATCH) {
        unsigned b = (unsigned)(s->n - first < DFS_BATCH ? s->n - first : DFS_BATCH);
        set_keys(s, part, first, b);
        double b0 = kvp_bench_now();
        kvp_status_t st = kvp_batch_get_into(c, s->kp, s->dst, s->sizes, b, s->got);
        kvp_bench_lat_add(lat, kvp_bench_now() - b0);
        for (unsigned i = 0; i < b; i++) {
            uint64_t id;
            memcpy(&id, s->dst[i], 8);
            if (st != KVP_OK || s->got[i] != (int64_t)DFS_OBJ || id != first + i ||
                memcmp((char *)s->dst[i] + 8, (char *)s->src[0] + 8, DFS_OBJ - 8) != 0) {
                fprintf(stderr, "kvpool-bench: dfs: get %s: %s (%s)\n", s->kp[i],
                        s->got[i] < 0  ? kvp_strerror((kvp_status_t)s->got[i])
                        : st != KVP_OK ? kvp_strerror(st)
                                       : "other bytes than were put",
                        kvp_client_last_error());
                return -1;
            }
        }
    }
    *secs_p = kvp_bench_now() - t0;
    return 0;
}

static void report(dfs_bench_t *s, const char *op, const char *who, kvp_bench_lat_t *lat,
                   double secs, uint64_t tp_ops)
{
    double gbps = secs > 0 ? (double)s->n * DFS_OBJ / secs / 1e9 : 0;
    double p50 = kvp_bench_percentile(lat->v, lat->n, 50) * 1e6;
    double p99 = kvp_bench_percentile(lat->v, lat->n, 99) * 1e6;
    kvp_bench_result_begin(s->out, "dfs");
    kvp_bench_result_str(s->out, "op", op);
    kvp_bench_result_str(s->out, "client", who);
    kvp_bench_result_int(s->out, "size", DFS_OBJ);
    kvp_bench_result_int(s->out, "batch", DFS_BATCH);
    kvp_bench_result_int(s->out, "objects", (int64_t)s->n);
    kvp_bench_result_str(s->out, "crc", "on");
    kvp_bench_result_num(s->out, "gbps", gbps);
    kvp_bench_result_num(s->out, "objs_per_s", secs > 0 ? (double)s->n / secs : 0);
    kvp_bench_result_num(s->out, "p50_batch_us", p50);
    kvp_bench_result_num(s->out, "p99_batch_us", p99);
    kvp_bench_result_int(s->out, "transport_ops", (int64_t)tp_ops);
    kvp_bench_result_end(s->out);
    printf("%-15s %-7s %8.2f %10.0f %11.0f %11.0f %10" PRIu64 "\n", op, who, gbps,
           secs > 0 ? (double)s->n / secs : 0, p50, p99, tp_ops);
    free(lat->v);
    *lat = (kvp_bench_lat_t){0};
}

static uint64_t tp_ops(kvp_client_t *c, int tp, bool get)
{
    kvp_metrics_t m = {.size = sizeof(m)};
    if (kvp_metrics_snapshot(c, &m) != KVP_OK)
        return 0;
    return get ? m.client[tp].get.ops : m.client[tp].put.ops;
}

/* The bench's DFS directory: its id file and shard files, then itself. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[4400];
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d != NULL)
        closedir(d);
    if (rmdir(dir) != 0)
        fprintf(stderr, "kvpool-bench: dfs: cannot remove %s: %s\n", dir, strerror(errno));
}

static pid_t spawn(char *const argv[])
{
    char line[512];
    return kvp_bench_spawn_ready(argv, line, sizeof(line));
}

static int run_points(dfs_bench_t *s, kvp_client_t *owner, kvp_client_t *direct, pid_t *dram_pid)
{
    kvp_bench_lat_t lat = {0};
    double secs;
    printf("%-15s %-7s %8s %10s %11s %11s %10s\n", "op", "client", "GB/s", "obj/s", "p50 batch",
           "p99 batch", "tp ops");
    uint64_t d0 = tp_ops(direct, KVP_METRICS_TP_DFS, false);
    if (put_all(s, direct, "mem", 0, &lat, &secs) != 0)
        return -1;
    report(s, "put_mem", "direct", &lat, secs, tp_ops(direct, KVP_METRICS_TP_DFS, false) - d0);
    uint64_t o0 = tp_ops(owner, KVP_METRICS_TP_SSD, false);
    if (put_all(s, owner, "own", 1, &lat, &secs) != 0)
        return -1;
    report(s, "put_dfs_owner", "owner", &lat, secs, tp_ops(owner, KVP_METRICS_TP_SSD, false) - o0);
    d0 = tp_ops(direct, KVP_METRICS_TP_DFS, false);
    if (put_all(s, direct, "dir", 1, &lat, &secs) != 0)
        return -1;
    uint64_t dput = tp_ops(direct, KVP_METRICS_TP_DFS, false) - d0;
    report(s, "put_dfs_direct", "direct", &lat, secs, dput);
    if (dput != s->n) {
        fprintf(stderr,
                "kvpool-bench: dfs: the direct client wrote %" PRIu64 " of %" PRIu64
                " DFS replicas in the shard file\n",
                dput, s->n);
        return -1;
    }
    /* the memory replicas go: every object is on DFS only */
    kill(*dram_pid, SIGKILL);
    waitpid(*dram_pid, NULL, 0);
    *dram_pid = -1;
    usleep(300000);
    o0 = tp_ops(owner, KVP_METRICS_TP_SSD, true);
    if (get_all(s, owner, "own", &lat, &secs) != 0)
        return -1;
    uint64_t og = tp_ops(owner, KVP_METRICS_TP_SSD, true) - o0;
    report(s, "get_dfs_owner", "owner", &lat, secs, og);
    d0 = tp_ops(direct, KVP_METRICS_TP_DFS, true);
    if (get_all(s, direct, "dir", &lat, &secs) != 0)
        return -1;
    uint64_t dg = tp_ops(direct, KVP_METRICS_TP_DFS, true) - d0;
    report(s, "get_dfs_direct", "direct", &lat, secs, dg);
    if (og != s->n || dg != s->n) {
        fprintf(stderr,
                "kvpool-bench: dfs: reads not on their transport: owner %" PRIu64
                " through the DFS owner, direct %" PRIu64 " in the file, of %" PRIu64 "\n",
                og, dg, s->n);
        return -1;
    }
    return 0;
}

int kvp_bench_dfs(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    if (kvp_bench_ssd_dir_check(o->ssd_dir) != 0)
        return 1;
    uint64_t dram = o->segment_size_set ? o->segment_size : 256ull << 20;
    dfs_bench_t s = {.o = o, .out = out};
    s.n = o->ssd_objects;
    uint64_t fit = KVP_MIN(dram, o->ssd_size) / 10 * 8 / DFS_OBJ / 3; /* three parts */
    if (s.n > fit)
        s.n = fit;
    if (s.n < DFS_BATCH) {
        fprintf(stderr, "kvpool-bench: dfs: segments too small (DRAM %llu, DFS %llu bytes)\n",
                (unsigned long long)dram, (unsigned long long)o->ssd_size);
        return 1;
    }
    char dir[4096], maddr[128], dsz[32], msz[32];
    snprintf(dir, sizeof(dir), "%s/kvpool-bench-dfs-%d", o->ssd_dir, (int)getpid());
    if (mkdir(dir, 0700) != 0) {
        fprintf(stderr, "kvpool-bench: dfs: mkdir %s: %s\n", dir, strerror(errno));
        return 1;
    }
    snprintf(dsz, sizeof(dsz), "%llu", (unsigned long long)o->ssd_size);
    snprintf(msz, sizeof(msz), "%llu", (unsigned long long)dram);
    static const char *const mflags[] = {"--promote-on-hit", "off", NULL};
    int rc = 1;
    kvp_client_t *owner = NULL, *direct = NULL;
    unsigned nbuf = 0;
    pid_t dram_pid = -1, dfs_pid = -1;
    pid_t master = kvp_bench_master_start(NULL, NULL, mflags, maddr, sizeof(maddr));
    if (master < 0)
        goto out_dir;
    char *dargv[] = {(char *)kvp_bench_find_bin("kvpool"),
                     "--master",
                     maddr,
                     "serve",
                     "--segment-size",
                     "0",
                     "--dfs-path",
                     dir,
                     "--dfs-size",
                     dsz,
                     "--ready-fd",
                     "3",
                     NULL};
    char *margv[] = {(char *)kvp_bench_find_bin("kvpool"),
                     "--master",
                     maddr,
                     "serve",
                     "--segment-size",
                     msz,
                     "--ready-fd",
                     "3",
                     NULL};
    dfs_pid = spawn(dargv);
    dram_pid = dfs_pid > 0 ? spawn(margv) : -1;
    if (dram_pid < 0)
        goto out;
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = maddr;
    if (kvp_client_create(&p, &owner) != KVP_OK)
        goto out;
    p.dfs_path = dir;
    if (kvp_client_create(&p, &direct) != KVP_OK)
        goto out;
    for (; nbuf < DFS_BATCH; nbuf++) {
        s.src[nbuf] = malloc(DFS_OBJ);
        s.dst[nbuf] = malloc(DFS_OBJ);
        if (s.src[nbuf] == NULL || s.dst[nbuf] == NULL) {
            free(s.src[nbuf]);
            free(s.dst[nbuf]);
            goto out;
        }
        for (size_t i = 0; i < DFS_OBJ; i += 8)
            memcpy((char *)s.src[nbuf] + i, &(uint64_t){i * 0x9e3779b97f4a7c15ull}, 8);
    }
    printf("== dfs: DFS replicas (a local directory in %s standing in for the shared file "
           "system), %" PRIu64 " x 1 MiB objects per point, batches of %u, CRC on ==\n",
           o->ssd_dir, s.n, DFS_BATCH);
    rc = run_points(&s, owner, direct, &dram_pid) == 0 ? 0 : 1;
    fflush(stdout);
out:
    for (unsigned i = 0; i < nbuf; i++) {
        free(s.src[i]);
        free(s.dst[i]);
    }
    kvp_client_destroy(direct);
    kvp_client_destroy(owner);
    if (dram_pid > 0)
        kvp_bench_stop_pid(dram_pid);
    if (dfs_pid > 0)
        kvp_bench_stop_pid(dfs_pid);
    kvp_bench_stop_pid(master);
out_dir:
    remove_dir(dir);
    return rc;
}
