/*
 * bench_main.c - kvpool-bench: options, the local cluster, JSON output and
 * the small helpers every mode shares (bench.h).
 *
 *   kvpool-bench MODE [options]       MODE: data limits meta alloc trace ssd ha all
 *
 * Output: each mode prints a human-readable table (and a progress line on
 * stderr while it runs); --json FILE writes
 *   {"machine": {...}, "params": {...}, "results": [{...}, ...]}
 * with one flat object per figure. Field names are stable: dashboards and
 * comparisons read them (docs/benchmarks.md lists them).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/tools/bench/bench.h"
#include "common/parse.h"

/* ---------------- results ---------------- */

struct kvp_bench_out {
    char *buf;
    size_t len, cap;
    int n_results;
    int fields;
};

static void out_append(kvp_bench_out_t *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void out_append(kvp_bench_out_t *o, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = (o->cap + (size_t)n + 1) * 2;
        char *p = realloc(o->buf, cap);
        if (p == NULL)
            return;
        o->buf = p;
        o->cap = cap;
    }
}

static void out_key(kvp_bench_out_t *o, const char *key)
{
    out_append(o, "%s\"%s\": ", o->fields++ ? ", " : "", key);
}

void kvp_bench_result_begin(kvp_bench_out_t *o, const char *mode)
{
    out_append(o, "%s\n    {", o->n_results++ ? "," : "");
    o->fields = 0;
    kvp_bench_result_str(o, "mode", mode);
}

void kvp_bench_result_str(kvp_bench_out_t *o, const char *key, const char *val)
{
    out_key(o, key);
    out_append(o, "\"");
    for (const char *p = val; *p; p++) {
        if (*p == '"' || *p == '\\')
            out_append(o, "\\%c", *p);
        else if ((unsigned char)*p < 0x20)
            out_append(o, "\\u%04x", (unsigned char)*p);
        else
            out_append(o, "%c", *p);
    }
    out_append(o, "\"");
}

void kvp_bench_result_num(kvp_bench_out_t *o, const char *key, double val)
{
    out_key(o, key);
    if (isfinite(val))
        out_append(o, "%.6g", val);
    else
        out_append(o, "null");
}

void kvp_bench_result_int(kvp_bench_out_t *o, const char *key, int64_t val)
{
    out_key(o, key);
    out_append(o, "%lld", (long long)val);
}

void kvp_bench_result_end(kvp_bench_out_t *o)
{
    out_append(o, "}");
}

/* ---------------- limits shared between modes ---------------- */

typedef struct limit_entry {
    uint64_t size;
    unsigned streams; /* 0: memcpy */
    double gbps;
} limit_entry_t;

static limit_entry_t limits[64];
static size_t n_limits;

static void limit_set(uint64_t size, unsigned streams, double gbps)
{
    for (size_t i = 0; i < n_limits; i++) {
        if (limits[i].size == size && limits[i].streams == streams) {
            limits[i].gbps = gbps;
            return;
        }
    }
    if (n_limits < sizeof(limits) / sizeof(limits[0]))
        limits[n_limits++] = (limit_entry_t){size, streams, gbps};
}

static double limit_get(uint64_t size, unsigned streams)
{
    for (size_t i = 0; i < n_limits; i++)
        if (limits[i].size == size && limits[i].streams == streams)
            return limits[i].gbps;
    return 0;
}

double kvp_bench_limit_memcpy_gbps(uint64_t size)
{
    return limit_get(size, 0);
}

double kvp_bench_limit_tcp_gbps(uint64_t size, unsigned streams)
{
    return limit_get(size, streams ? streams : 1);
}

void kvp_bench_limit_set_memcpy(uint64_t size, double gbps)
{
    limit_set(size, 0, gbps);
}

void kvp_bench_limit_set_tcp(uint64_t size, unsigned streams, double gbps)
{
    limit_set(size, streams ? streams : 1, gbps);
}

/* ---------------- time, stats, progress, rss ---------------- */

double kvp_bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void kvp_bench_lat_add(kvp_bench_lat_t *l, double x)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        double *p = realloc(l->v, cap * sizeof(*p));
        if (p == NULL)
            return;
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

double kvp_bench_percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof(*v), cmp_double);
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)rank;
    size_t hi = lo + 1 < n ? lo + 1 : lo;
    double f = rank - (double)lo;
    return v[lo] * (1 - f) + v[hi] * f;
}

void kvp_bench_progress(const kvp_bench_opts_t *o, const char *fmt, ...)
{
    if (o->quiet || !isatty(2))
        return;
    char line[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "\r\033[K%s", line);
}

void kvp_bench_progress_done(const kvp_bench_opts_t *o)
{
    if (!o->quiet && isatty(2))
        fprintf(stderr, "\r\033[K");
}

long long kvp_bench_rss_bytes(pid_t pid)
{
    char path[64], line[256];
    if (pid == 0)
        snprintf(path, sizeof(path), "/proc/self/status");
    else
        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    long long kib = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %lld kB", &kib) == 1)
            break;
    fclose(f);
    return kib < 0 ? -1 : kib * 1024;
}

/* ---------------- local cluster ---------------- */

static char self_dir[PATH_MAX];
static pid_t local_master_pid = -1;

pid_t kvp_bench_master_pid(void)
{
    return local_master_pid;
}

const char *kvp_bench_find_bin(const char *name)
{
    static char found[4][PATH_MAX];
    static int next;
    char *out = found[next++ % 4];
    const char *env =
        strcmp(name, "kvpool-master") == 0 ? getenv("KVPOOL_MASTER_BIN") : getenv("KVPOOL_CLI_BIN");
    if (env != NULL && access(env, X_OK) == 0)
        return env;
    /* installed side by side, or the build tree (client/ and master/) */
    const char *rel[] = {"%s/%s", "%s/../master/%s", "%s/../client/%s"};
    for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
        snprintf(out, PATH_MAX, rel[i], self_dir, name);
        if (access(out, X_OK) == 0)
            return out;
    }
    return name; /* PATH */
}

/* Start argv with fd 3 a pipe; read one line into `line`. Returns the pid or -1. */
static pid_t spawn_ready(char *const argv[], char *line, size_t len)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 3);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, 1);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(pfd[1]);
    size_t got = 0;
    line[0] = '\0';
    while (pid > 0 && got < len - 1) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        if (poll(&p, 1, 15000) <= 0)
            break;
        ssize_t n = read(pfd[0], line + got, len - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
        line[got] = '\0';
        char *nl = strchr(line, '\n');
        if (nl) {
            *nl = '\0';
            close(pfd[0]);
            return pid;
        }
    }
    close(pfd[0]);
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    fprintf(stderr, "kvpool-bench: %s did not start\n", argv[0]);
    return -1;
}

int kvp_bench_cluster_start(kvp_bench_cluster_t *c, unsigned n, uint64_t seg_size)
{
    kvp_bench_cluster_params_t p = {.n = n, .seg_size = seg_size};
    return kvp_bench_cluster_start_params(c, &p);
}

/* --segment-records of the local masters whose start does not say (main sets it) */
static const char *segment_records = "on";

pid_t kvp_bench_master_start(const char *listen, const char *records, const char *const *flags,
                             char *addr, size_t len)
{
    char *margv[32] = {(char *)kvp_bench_find_bin("kvpool-master"),
                       "--listen",
                       (char *)(listen != NULL ? listen : "127.0.0.1:0"),
                       "--ready-fd",
                       "3",
                       "--log-level",
                       "warn",
                       "--segment-records",
                       (char *)(records != NULL ? records : segment_records)};
    size_t na = 9;
    for (size_t i = 0; flags != NULL && flags[i] != NULL && na < 31; i++)
        margv[na++] = (char *)flags[i];
    margv[na] = NULL;
    return spawn_ready(margv, addr, len);
}

/* One `kvpool serve` of seg_size bytes of DRAM, and an SSD segment when ssd_path is set. */
static pid_t serve_start(const char *master, uint64_t seg_size, const char *ssd_path,
                         uint64_t ssd_bytes)
{
    char name[256], size[32], ssd_size[32];
    snprintf(size, sizeof(size), "%llu", (unsigned long long)seg_size);
    snprintf(ssd_size, sizeof(ssd_size), "%llu", (unsigned long long)ssd_bytes);
    char *sargv[16] = {(char *)kvp_bench_find_bin("kvpool"),
                       "--master",
                       (char *)master,
                       "serve",
                       "--segment-size",
                       size,
                       "--ready-fd",
                       "3"};
    if (ssd_path != NULL) {
        sargv[8] = "--ssd-path";
        sargv[9] = (char *)ssd_path;
        sargv[10] = "--ssd-size";
        sargv[11] = ssd_size;
    }
    return spawn_ready(sargv, name, sizeof(name));
}

pid_t kvp_bench_serve_start(const char *master, uint64_t seg_size)
{
    return serve_start(master, seg_size, NULL, 0);
}

int kvp_bench_cluster_start_params(kvp_bench_cluster_t *c, const kvp_bench_cluster_params_t *p)
{
    memset(c, 0, sizeof(*c));
    c->master_pid = kvp_bench_master_start(NULL, p->segment_records, p->master_flags,
                                           c->master_addr, sizeof(c->master_addr));
    if (c->master_pid < 0)
        return -1;
    local_master_pid = c->master_pid;
    for (unsigned i = 0; i < p->n && i < 64; i++) {
        pid_t pid =
            serve_start(c->master_addr, p->seg_size, i == 0 ? p->ssd_path : NULL, p->ssd_size);
        if (pid < 0) {
            kvp_bench_cluster_stop(c);
            return -1;
        }
        c->seg_pids[c->n_segs++] = pid;
    }
    return 0;
}

void kvp_bench_stop_pid(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 1000; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

void kvp_bench_cluster_stop(kvp_bench_cluster_t *c)
{
    for (unsigned i = 0; i < c->n_segs; i++)
        kvp_bench_stop_pid(c->seg_pids[i]);
    c->n_segs = 0;
    kvp_bench_stop_pid(c->master_pid);
    c->master_pid = 0;
    local_master_pid = -1;
}

/* ---------------- options ---------------- */

static int parse_list_u64(const char *text, uint64_t *out, size_t *n, bool sizes)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", text);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (*n == KVP_BENCH_MAX_LIST)
            return -1;
        if (sizes) {
            if (!kvp_parse_size(tok, &v))
                return -1;
        } else {
            char *end;
            errno = 0;
            v = strtoull(tok, &end, 10);
            if (errno || *end)
                return -1;
        }
        out[(*n)++] = v;
    }
    return *n ? 0 : -1;
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: kvpool-bench MODE [options]\n"
        "modes: data | limits | meta | alloc | trace | ssd | ha | all (all but ssd and ha)\n"
        "cluster:\n"
        "  --master HOST:PORT     a running master (default $KVPOOL_MASTER)\n"
        "  --local                start a master and segments on 127.0.0.1 and stop them after\n"
        "  --segments N           local segments (default 1)\n"
        "  --segment-size SIZE    bytes per local segment (default 4GiB)\n"
        "  --segment-records on|off  the local masters' --segment-records (default on: owners\n"
        "                         keep a record of their objects, a restarted master adopts them)\n"
        "data:\n"
        "  --transport LIST       tcp,shm,rdma (default tcp,shm)\n"
        "  --rdma-write-limit G   GB/s of ib_write_bw in this session: rdma puts' %%limit\n"
        "  --rdma-read-limit G    GB/s of ib_read_bw in this session: rdma gets' %%limit\n"
        "  --sizes LIST           object sizes (default 4KiB,64KiB,1MiB,4MiB,16MiB)\n"
        "  --batch LIST           keys per batch (default 32)\n"
        "  --threads LIST         client threads, e.g. 1,4 (default 1); they share one client;\n"
        "                         a count > 1 also measures 1 thread (ratio_to_1_thread)\n"
        "  --client-per-thread    each thread has its own client instead (the former form)\n"
        "  --clients MODE         shared (default) | per-thread | both\n"
        "  --loop OP              exist | get: put each thread's batch once, then repeat\n"
        "                         only OP for the duration (default: put, exist, get, remove)\n"
        "  --pieces LIST          split each object's buffer into N equal pieces, put and got\n"
        "                         with the _multi calls (default 1; e.g. 1,64: ratio_to_1_piece)\n"
        "  --duration S           seconds per point (default 2)\n"
        "  --no-crc               also measure with CRC checks off (labelled crc=off)\n"
        "meta:\n"
        "  --objects LIST         resident objects (default 10000,1000000,10000000)\n"
        "alloc:\n"
        "  --alloc-arena SIZE     arena size (default 64GiB)\n"
        "trace:\n"
        "  --trace FILE           JSONL with hash_ids (Mooncake FAST'25 format)\n"
        "  --block-bytes SIZE     bytes per hash id (default 256KiB)\n"
        "  --capacity LIST        pool size as fractions of unique blocks (default 0.1)\n"
        "  --trace-limit N        replay at most N requests\n"
        "  --eviction MODE        store (default): per capacity an empty pool of exactly that\n"
        "                         many blocks (a fresh --local cluster each), the master evicts;\n"
        "                         client-lru: the bench removes LRU victims itself (a reference)\n"
        "  --ssd-capacity F       store, --local: the segment also gets an SSD tier of F x the\n"
        "                         unique blocks (file in --ssd-dir); hits are split per tier\n"
        "SSD tier (limits' disk figures, ssd, trace --ssd-capacity):\n"
        "  --ssd-dir DIR          directory of the disk test file and SSD segment files, on a\n"
        "                         disk filesystem (default: the current directory; tmpfs refused)\n"
        "  --ssd-file-size SIZE   limits: the disk test file, written then read (default 1GiB)\n"
        "ssd (always --local: its own master with --promote-on-hit off and one segment):\n"
        "  --segment-size SIZE    its DRAM segment (default 256MiB here)\n"
        "  --ssd-size SIZE        its SSD segment (default 2GiB): offload writes about\n"
        "                         the DRAM segment plus 80 %% of this\n"
        "  --ssd-objects N        1 MiB objects put straight to SSD and read back (default\n"
        "                         1024: as much as the disk limit's file)\n"
        "ha (always its own processes on 127.0.0.1; records cost, rebuild after a restart,\n"
        "    failover through etcd):\n"
        "  --ha-objects N         1 KiB objects resident when the master is killed (default\n"
        "                         1000000)\n"
        "  --ha-rounds N          leader kills in the failover part (default 10)\n"
        "  --leader-ttl S         the masters' --leader-ttl (default 2)\n"
        "output:\n"
        "  --json FILE            write every figure and the parameters as JSON\n"
        "  --quiet                no progress line\n");
}

static void machine_json(kvp_bench_out_t *o)
{
    struct utsname u;
    uname(&u);
    char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (f) {
        char line[512];
        while (fgets(line, sizeof(line), f)) {
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c) {
                    snprintf(model, sizeof(model), "%s", c + 2);
                    model[strcspn(model, "\n")] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    out_append(o, "  \"machine\": {");
    o->fields = 0;
    kvp_bench_result_str(o, "cpu", model);
    kvp_bench_result_int(o, "cores", sysconf(_SC_NPROCESSORS_ONLN));
    kvp_bench_result_int(o, "mem_bytes", (int64_t)pages * psz);
    kvp_bench_result_str(o, "kernel", u.release);
    kvp_bench_result_str(o, "arch", u.machine);
    out_append(o, "},\n");
}

static void params_json(kvp_bench_out_t *o, const kvp_bench_opts_t *p, const char *mode)
{
    out_append(o, "  \"params\": {");
    o->fields = 0;
    kvp_bench_result_str(o, "mode", mode);
    kvp_bench_result_str(o, "master", p->local ? "local" : (p->master ? p->master : ""));
    kvp_bench_result_int(o, "segments", p->segments);
    kvp_bench_result_int(o, "segment_size", (int64_t)p->segment_size);
    kvp_bench_result_str(o, "segment_records", p->segment_records ? "on" : "off");
    out_key(o, "transports");
    out_append(o, "[");
    for (size_t i = 0; i < p->n_transports; i++)
        out_append(o, "%s\"%s\"", i ? ", " : "", p->transports[i]);
    out_append(o, "]");
    out_key(o, "sizes");
    out_append(o, "[");
    for (size_t i = 0; i < p->n_sizes; i++)
        out_append(o, "%s%llu", i ? ", " : "", (unsigned long long)p->sizes[i]);
    out_append(o, "]");
    out_key(o, "batches");
    out_append(o, "[");
    for (size_t i = 0; i < p->n_batches; i++)
        out_append(o, "%s%u", i ? ", " : "", p->batches[i]);
    out_append(o, "]");
    kvp_bench_result_int(o, "threads", p->threads);
    out_key(o, "thread_counts");
    out_append(o, "[");
    for (size_t i = 0; i < p->n_thread_counts; i++)
        out_append(o, "%s%u", i ? ", " : "", p->thread_counts[i]);
    out_append(o, "]");
    kvp_bench_result_str(o, "clients",
                         p->clients_shared && p->clients_own ? "both"
                         : p->clients_shared                 ? "shared"
                                                             : "per-thread");
    kvp_bench_result_str(o, "loop", p->loop ? p->loop : "none");
    out_key(o, "pieces");
    out_append(o, "[");
    for (size_t i = 0; i < p->n_pieces; i++)
        out_append(o, "%s%u", i ? ", " : "", p->pieces[i]);
    out_append(o, "]");
    kvp_bench_result_num(o, "duration_s", p->duration_s);
    kvp_bench_result_int(o, "crc", 1);
    kvp_bench_result_int(o, "no_crc_too", p->no_crc);
    out_key(o, "meta_objects");
    out_append(o, "[");
    for (size_t i = 0; i < p->n_meta_objects; i++)
        out_append(o, "%s%llu", i ? ", " : "", (unsigned long long)p->meta_objects[i]);
    out_append(o, "]");
    kvp_bench_result_int(o, "alloc_arena", (int64_t)p->alloc_segment);
    kvp_bench_result_str(o, "trace", p->trace_path ? p->trace_path : "");
    kvp_bench_result_int(o, "block_bytes", (int64_t)p->block_bytes);
    out_key(o, "capacities");
    out_append(o, "[");
    for (size_t i = 0; i < p->n_capacities; i++)
        out_append(o, "%s%g", i ? ", " : "", p->capacities[i]);
    out_append(o, "]");
    kvp_bench_result_int(o, "trace_limit", (int64_t)p->trace_limit);
    kvp_bench_result_str(o, "eviction", p->trace_client_lru ? "client-lru" : "store");
    kvp_bench_result_str(o, "ssd_dir", p->ssd_dir);
    kvp_bench_result_int(o, "ssd_file_size", (int64_t)p->ssd_file_size);
    kvp_bench_result_int(o, "ssd_size", (int64_t)p->ssd_size);
    kvp_bench_result_int(o, "ssd_objects", (int64_t)p->ssd_objects);
    kvp_bench_result_num(o, "ssd_capacity", p->ssd_capacity);
    kvp_bench_result_int(o, "ha_objects", (int64_t)p->ha_objects);
    kvp_bench_result_int(o, "ha_rounds", p->ha_rounds);
    kvp_bench_result_int(o, "leader_ttl", p->leader_ttl);
    out_append(o, "},\n");
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    char exe[PATH_MAX];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (el > 0) {
        exe[el] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        snprintf(self_dir, sizeof(self_dir), "%s", exe);
    }
    if (argc < 2 || argv[1][0] == '-') {
        usage(argc >= 2 && strcmp(argv[1], "--help") == 0 ? stdout : stderr);
        return argc >= 2 && strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    const char *mode = argv[1];
    static const char *const modes[] = {"data",  "limits", "meta", "alloc",
                                        "trace", "ssd",    "ha",   "all"};
    bool known = false;
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
        known |= strcmp(mode, modes[i]) == 0;
    if (!known) {
        fprintf(stderr, "kvpool-bench: unknown mode '%s'\n", mode);
        usage(stderr);
        return 2;
    }

    kvp_bench_opts_t o = {
        .master = getenv("KVPOOL_MASTER"),
        .segments = 1,
        .segment_size = 4ull << 30,
        .transports = {"tcp", "shm"},
        .n_transports = 2,
        .sizes = {4096, 65536, 1 << 20, 4 << 20, 16 << 20},
        .n_sizes = 5,
        .batches = {32},
        .n_batches = 1,
        .threads = 1,
        .thread_counts = {1},
        .n_thread_counts = 1,
        .clients_shared = true,
        .pieces = {1},
        .n_pieces = 1,
        .duration_s = 2,
        .meta_objects = {10000, 1000000, 10000000},
        .n_meta_objects = 3,
        .alloc_segment = 64ull << 30,
        .block_bytes = 256 << 10,
        .capacities = {0.1},
        .n_capacities = 1,
        .ssd_dir = ".",
        .ssd_file_size = 1ull << 30,
        .ssd_size = 2ull << 30,
        .ssd_objects = 1024,
        .segment_records = true,
        .ha_objects = 1000000,
        .ha_rounds = 10,
        .leader_ttl = 2,
    };
    static const struct option opts[] = {
        {"master", required_argument, NULL, 'm'},
        {"local", no_argument, NULL, 'L'},
        {"segments", required_argument, NULL, 'n'},
        {"segment-size", required_argument, NULL, 'S'},
        {"transport", required_argument, NULL, 't'},
        {"sizes", required_argument, NULL, 's'},
        {"batch", required_argument, NULL, 'b'},
        {"threads", required_argument, NULL, 'T'},
        {"client-per-thread", no_argument, NULL, 'P'},
        {"clients", required_argument, NULL, 'K'},
        {"loop", required_argument, NULL, 'O'},
        {"pieces", required_argument, NULL, 'I'},
        {"duration", required_argument, NULL, 'd'},
        {"no-crc", no_argument, NULL, 'C'},
        {"rdma-write-limit", required_argument, NULL, 'W'},
        {"rdma-read-limit", required_argument, NULL, 'R'},
        {"objects", required_argument, NULL, 'o'},
        {"alloc-arena", required_argument, NULL, 'A'},
        {"trace", required_argument, NULL, 'r'},
        {"block-bytes", required_argument, NULL, 'B'},
        {"capacity", required_argument, NULL, 'c'},
        {"trace-limit", required_argument, NULL, 'l'},
        {"eviction", required_argument, NULL, 'e'},
        {"ssd-dir", required_argument, NULL, 'D'},
        {"ssd-file-size", required_argument, NULL, 'F'},
        {"ssd-size", required_argument, NULL, 'Z'},
        {"ssd-objects", required_argument, NULL, 'N'},
        {"ssd-capacity", required_argument, NULL, 'X'},
        {"segment-records", required_argument, NULL, 'G'},
        {"ha-objects", required_argument, NULL, 'H'},
        {"ha-rounds", required_argument, NULL, 'U'},
        {"leader-ttl", required_argument, NULL, 'Y'},
        {"json", required_argument, NULL, 'j'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    optind = 2;
    int opt, li = 0;
    char tbuf[128];
    while ((opt = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        uint64_t tmp[KVP_BENCH_MAX_LIST];
        size_t n;
        switch (opt) {
        case 'm':
            o.master = optarg;
            break;
        case 'L':
            o.local = true;
            break;
        case 'n':
            o.segments = (unsigned)strtoul(optarg, NULL, 10);
            if (o.segments == 0 || o.segments > 64)
                goto bad;
            break;
        case 'S':
            if (!kvp_parse_size(optarg, &o.segment_size) || o.segment_size == 0)
                goto bad;
            o.segment_size_set = true;
            break;
        case 't':
            snprintf(tbuf, sizeof(tbuf), "%s", optarg);
            o.n_transports = 0;
            for (char *save = NULL, *tok = strtok_r(tbuf, ",", &save);
                 tok && o.n_transports < KVP_BENCH_MAX_LIST; tok = strtok_r(NULL, ",", &save)) {
                if (strcmp(tok, "tcp") && strcmp(tok, "shm") && strcmp(tok, "rdma"))
                    goto bad;
                o.transports[o.n_transports++] = strcmp(tok, "tcp") == 0   ? "tcp"
                                                 : strcmp(tok, "shm") == 0 ? "shm"
                                                                           : "rdma";
            }
            if (o.n_transports == 0)
                goto bad;
            break;
        case 's':
            if (parse_list_u64(optarg, o.sizes, &o.n_sizes, true) != 0)
                goto bad;
            break;
        case 'b':
            if (parse_list_u64(optarg, tmp, &n, false) != 0)
                goto bad;
            for (size_t i = 0; i < n; i++) {
                if (tmp[i] == 0 || tmp[i] > 65536)
                    goto bad;
                o.batches[i] = (unsigned)tmp[i];
            }
            o.n_batches = n;
            break;
        case 'T':
            if (parse_list_u64(optarg, tmp, &n, false) != 0)
                goto bad;
            o.n_thread_counts = 0;
            o.threads = 0;
            for (size_t i = 0; i < n; i++) { /* ascending, each once */
                if (tmp[i] == 0 || tmp[i] > 256)
                    goto bad;
                size_t at = 0;
                while (at < o.n_thread_counts && o.thread_counts[at] < tmp[i])
                    at++;
                if (at < o.n_thread_counts && o.thread_counts[at] == tmp[i])
                    continue;
                memmove(&o.thread_counts[at + 1], &o.thread_counts[at],
                        (o.n_thread_counts - at) * sizeof(o.thread_counts[0]));
                o.thread_counts[at] = (unsigned)tmp[i];
                o.n_thread_counts++;
                if (tmp[i] > o.threads)
                    o.threads = (unsigned)tmp[i];
            }
            break;
        case 'I':
            if (parse_list_u64(optarg, tmp, &n, false) != 0)
                goto bad;
            o.n_pieces = 0;
            for (size_t i = 0; i < n; i++) { /* ascending, each once: 1 (the baseline) first */
                if (tmp[i] == 0 || tmp[i] > 65536)
                    goto bad;
                size_t at = 0;
                while (at < o.n_pieces && o.pieces[at] < tmp[i])
                    at++;
                if (at < o.n_pieces && o.pieces[at] == tmp[i])
                    continue;
                memmove(&o.pieces[at + 1], &o.pieces[at], (o.n_pieces - at) * sizeof(o.pieces[0]));
                o.pieces[at] = (unsigned)tmp[i];
                o.n_pieces++;
            }
            break;
        case 'P':
            o.clients_shared = false;
            o.clients_own = true;
            break;
        case 'K':
            o.clients_shared = strcmp(optarg, "shared") == 0 || strcmp(optarg, "both") == 0;
            o.clients_own = strcmp(optarg, "per-thread") == 0 || strcmp(optarg, "both") == 0;
            if (!o.clients_shared && !o.clients_own)
                goto bad;
            break;
        case 'O':
            if (strcmp(optarg, "exist") != 0 && strcmp(optarg, "get") != 0)
                goto bad;
            o.loop = strcmp(optarg, "exist") == 0 ? "exist" : "get";
            break;
        case 'd':
            o.duration_s = strtod(optarg, NULL);
            if (!(o.duration_s > 0))
                goto bad;
            break;
        case 'C':
            o.no_crc = true;
            break;
        case 'W':
        case 'R':
            *(opt == 'W' ? &o.rdma_write_gbps : &o.rdma_read_gbps) = strtod(optarg, NULL);
            if (!(*(opt == 'W' ? &o.rdma_write_gbps : &o.rdma_read_gbps) > 0))
                goto bad;
            break;
        case 'o':
            if (parse_list_u64(optarg, o.meta_objects, &o.n_meta_objects, false) != 0)
                goto bad;
            break;
        case 'A':
            if (!kvp_parse_size(optarg, &o.alloc_segment) || o.alloc_segment < 4096)
                goto bad;
            break;
        case 'r':
            o.trace_path = optarg;
            break;
        case 'B':
            if (!kvp_parse_size(optarg, &o.block_bytes) || o.block_bytes == 0)
                goto bad;
            break;
        case 'c': {
            snprintf(tbuf, sizeof(tbuf), "%s", optarg);
            o.n_capacities = 0;
            for (char *save = NULL, *tok = strtok_r(tbuf, ",", &save);
                 tok && o.n_capacities < KVP_BENCH_MAX_LIST; tok = strtok_r(NULL, ",", &save)) {
                double v = strtod(tok, NULL);
                if (!(v > 0 && v <= 1))
                    goto bad;
                o.capacities[o.n_capacities++] = v;
            }
            if (o.n_capacities == 0)
                goto bad;
            break;
        }
        case 'l':
            o.trace_limit = strtoull(optarg, NULL, 10);
            break;
        case 'e':
            if (strcmp(optarg, "store") == 0)
                o.trace_client_lru = false;
            else if (strcmp(optarg, "client-lru") == 0)
                o.trace_client_lru = true;
            else
                goto bad;
            break;
        case 'D':
            o.ssd_dir = optarg;
            break;
        case 'F':
            if (!kvp_parse_size(optarg, &o.ssd_file_size) || o.ssd_file_size < (1u << 20))
                goto bad;
            break;
        case 'Z':
            if (!kvp_parse_size(optarg, &o.ssd_size) || o.ssd_size < (64u << 20))
                goto bad;
            break;
        case 'N': {
            char *end;
            errno = 0;
            o.ssd_objects = strtoull(optarg, &end, 10);
            if (errno || *end || o.ssd_objects == 0)
                goto bad;
            break;
        }
        case 'X':
            o.ssd_capacity = strtod(optarg, NULL);
            if (!(o.ssd_capacity > 0 && o.ssd_capacity <= 4))
                goto bad;
            break;
        case 'G':
            if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0)
                goto bad;
            o.segment_records = strcmp(optarg, "on") == 0;
            break;
        case 'H':
        case 'U':
        case 'Y': {
            char *end;
            errno = 0;
            uint64_t v = strtoull(optarg, &end, 10);
            if (errno || *end || v == 0 || (opt == 'U' && v > 1000) ||
                (opt == 'Y' && (v < 2 || v > 3600)))
                goto bad;
            if (opt == 'H')
                o.ha_objects = v;
            else
                *(opt == 'U' ? &o.ha_rounds : &o.leader_ttl) = (unsigned)v;
            break;
        }
        case 'j':
            o.json_path = optarg;
            break;
        case 'q':
            o.quiet = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "kvpool-bench: bad value for --%s: '%s'\n", opts[li].name, optarg);
        usage(stderr);
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "kvpool-bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    bool all = strcmp(mode, "all") == 0;
    if (strcmp(mode, "trace") == 0 && o.trace_path == NULL) {
        fprintf(stderr, "kvpool-bench: trace needs --trace FILE\n");
        return 2;
    }
    if (all && o.trace_path == NULL)
        fprintf(stderr, "kvpool-bench: all: no --trace FILE, the trace mode is skipped\n");
    bool run_trace = o.trace_path != NULL && (all || strcmp(mode, "trace") == 0);
    /* the trace in store eviction brings its own pool per capacity point */
    bool need_store = all || strcmp(mode, "data") == 0 || strcmp(mode, "meta") == 0 ||
                      (run_trace && o.trace_client_lru);
    bool run_ssd = strcmp(mode, "ssd") == 0;
    bool run_ha = strcmp(mode, "ha") == 0;
    if (run_ha) /* its own processes, whatever --master says */
        o.local = true;
    segment_records = o.segment_records ? "on" : "off";
    if (o.ssd_capacity > 0 && (!run_trace || o.trace_client_lru)) {
        fprintf(stderr, "kvpool-bench: --ssd-capacity is for the trace mode in store eviction\n");
        return 2;
    }
    if ((need_store || run_trace || run_ssd) && !o.local && o.master == NULL) {
        fprintf(stderr, "kvpool-bench: no --master and no $KVPOOL_MASTER: using --local\n");
        o.local = true;
    }

    if (o.local && !o.segment_records && !run_ha)
        printf("(local masters run with --segment-records off: no owner records)\n");
    kvp_bench_out_t out = {0};
    kvp_bench_cluster_t cluster;
    bool started = false;
    if (need_store && o.local) {
        if (kvp_bench_cluster_start(&cluster, o.segments, o.segment_size) != 0) {
            fprintf(stderr, "kvpool-bench: cannot start the local cluster\n");
            return 1;
        }
        started = true;
        o.master = cluster.master_addr;
    }

    int rc = 0;
    if (all || strcmp(mode, "limits") == 0)
        rc |= kvp_bench_limits(&o, &out);
    if (all || strcmp(mode, "data") == 0)
        rc |= kvp_bench_data(&o, &out);
    if (all || strcmp(mode, "alloc") == 0)
        rc |= kvp_bench_alloc(&o, &out);
    if (all || strcmp(mode, "meta") == 0)
        rc |= kvp_bench_meta(&o, &out);
    if (started && !(run_trace && o.trace_client_lru)) {
        /* its memory is given back before the trace starts pools of its own */
        kvp_bench_cluster_stop(&cluster);
        started = false;
    }
    if (run_trace)
        rc |= kvp_bench_trace(&o, &out);
    if (run_ssd)
        rc |= kvp_bench_ssd(&o, &out);
    if (run_ha)
        rc |= kvp_bench_ha(&o, &out);
    if (started)
        kvp_bench_cluster_stop(&cluster);

    if (o.json_path != NULL) {
        kvp_bench_out_t doc = {0};
        out_append(&doc, "{\n");
        machine_json(&doc);
        params_json(&doc, &o, mode);
        out_append(&doc, "  \"results\": [%s\n  ]\n}\n", out.buf ? out.buf : "");
        FILE *f = fopen(o.json_path, "we");
        if (f == NULL || fwrite(doc.buf, 1, doc.len, f) != doc.len || fclose(f) != 0) {
            fprintf(stderr, "kvpool-bench: cannot write %s: %s\n", o.json_path, strerror(errno));
            rc = 1;
        }
        free(doc.buf);
    }
    free(out.buf);
    if (rc)
        fprintf(stderr, "kvpool-bench: %s: FAILED (errors above)\n", mode);
    return rc ? 1 : 0;
}
