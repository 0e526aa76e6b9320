/*
 * bench_common.c - what every kvpool-bench mode shares: result objects and the JSON
 * document, timing and percentiles, the progress line, RSS, and the local cluster (a
 * kvpool-master and `kvpool serve` processes on 127.0.0.1).
 *
 * Design: a mode adds one flat JSON object per figure through kvp_bench_result_*; they
 * accumulate as text in a kvp_bench_out_t, and kvp_bench_json_write wraps them in
 *   {"machine": {...}, "params": {...}, "results": [{...}, ...]}
 * Field names and their order are stable (deploy/bench.sh, deploy/py-bench.py and
 * docs/benchmarks.md read them). Processes are started with fd 3 a pipe and are ready when
 * they wrote a line to it (no sleeps); they are stopped by PID and reaped.
 *
 * Thread: nothing here locks. The results, the JSON document and the local cluster belong to
 * the main thread; the timing, statistics and progress helpers touch only what the caller
 * passes, and modes call them from their worker threads too (a kvp_bench_lat_t is added to by
 * one thread). kvp_bench_find_bin hands out one of four static buffers in turn.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "client/tools/bench/bench.h"
#include "common/parse.h"
#include "common/rpc.h"
#include "common/sock.h"

/* ---------------- results ---------------- */

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

void kvp_bench_out_init(kvp_bench_out_t *out)
{
    memset(out, 0, sizeof(*out));
}

void kvp_bench_out_cleanup(kvp_bench_out_t *out)
{
    free(out->buf);
    out->buf = NULL;
    out->len = out->cap = 0;
}

/* ---------------- the JSON document ---------------- */

/* The first line of a small sysfs file, without its newline ("none" when unreadable). */
static void read_line(const char *path, char *buf, size_t len)
{
    snprintf(buf, len, "none");
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return;
    if (fgets(buf, (int)len, f) == NULL)
        snprintf(buf, len, "none");
    buf[strcspn(buf, "\n")] = '\0';
    fclose(f);
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
    /* How idle CPUs wait moves every round trip on a VM (docs/benchmarks.md, "Idle vCPUs"):
     * the cpuidle driver, and the guest's halt-polling window where the driver is haltpoll
     * (-1: no such setting here) */
    char idle[64];
    read_line("/sys/devices/system/cpu/cpuidle/current_driver", idle, sizeof(idle));
    kvp_bench_result_str(o, "cpuidle_driver", idle);
    read_line("/sys/module/haltpoll/parameters/guest_halt_poll_ns", idle, sizeof(idle));
    char *end = NULL;
    long long ns = strtoll(idle, &end, 10);
    kvp_bench_result_int(o, "guest_halt_poll_ns", end != idle ? ns : -1);
    out_append(o, "},\n");
}

/* "key": [v, ...] in a JSON object being written */
static void out_list_u64(kvp_bench_out_t *o, const char *key, const uint64_t *v, size_t n)
{
    out_key(o, key);
    out_append(o, "[");
    for (size_t i = 0; i < n; i++)
        out_append(o, "%s%llu", i ? ", " : "", (unsigned long long)v[i]);
    out_append(o, "]");
}

static void out_list_unsigned(kvp_bench_out_t *o, const char *key, const unsigned *v, size_t n)
{
    out_key(o, key);
    out_append(o, "[");
    for (size_t i = 0; i < n; i++)
        out_append(o, "%s%u", i ? ", " : "", v[i]);
    out_append(o, "]");
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
    out_list_u64(o, "sizes", p->sizes, p->n_sizes);
    out_list_unsigned(o, "batches", p->batches, p->n_batches);
    kvp_bench_result_int(o, "threads", p->threads);
    out_list_unsigned(o, "thread_counts", p->thread_counts, p->n_thread_counts);
    kvp_bench_result_str(o, "clients",
                         p->clients_shared && p->clients_own ? "both"
                         : p->clients_shared                 ? "shared"
                                                             : "per-thread");
    kvp_bench_result_str(o, "loop", p->loop ? p->loop : "none");
    out_list_unsigned(o, "pieces", p->pieces, p->n_pieces);
    kvp_bench_result_num(o, "duration_s", p->duration_s);
    kvp_bench_result_int(o, "crc", 1);
    kvp_bench_result_int(o, "no_crc_too", p->no_crc);
    out_list_u64(o, "meta_objects", p->meta_objects, p->n_meta_objects);
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

int kvp_bench_json_write(const kvp_bench_out_t *results, const kvp_bench_opts_t *o,
                         const char *mode)
{
    int rc = 0;
    kvp_bench_out_t doc;
    kvp_bench_out_init(&doc);
    out_append(&doc, "{\n");
    machine_json(&doc);
    params_json(&doc, o, mode);
    out_append(&doc, "  \"results\": [%s\n  ]\n}\n", results->buf ? results->buf : "");
    FILE *f = fopen(o->json_path, "we");
    if (f == NULL || fwrite(doc.buf, 1, doc.len, f) != doc.len || fclose(f) != 0) {
        fprintf(stderr, "kvpool-bench: cannot write %s: %s\n", o->json_path, strerror(errno));
        rc = -1;
    }
    kvp_bench_out_cleanup(&doc);
    return rc;
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

double kvp_bench_cpu_s(pid_t pid)
{
    char path[64], line[1024];
    if (pid == 0)
        snprintf(path, sizeof(path), "/proc/self/stat");
    else
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    char *ok = fgets(line, sizeof(line), f);
    fclose(f);
    /* the name in parentheses may hold spaces: fields count from its closing one */
    char *p = ok ? strrchr(line, ')') : NULL;
    unsigned long long ut = 0, st = 0;
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (double)(ut + st) / (double)hz : -1;
}

int kvp_bench_pool_stat(kvp_client_t *c, const char *mode, kvp_pool_stat_t *ps_p)
{
    kvp_pool_stat_t *p = NULL;
    kvp_status_t st = kvp_pool_stat(c, &p);
    if (st != KVP_OK || p == NULL) {
        fprintf(stderr, "kvpool-bench: %s: pool stat: %s\n", mode, kvp_strerror(st));
        return -1;
    }
    *ps_p = *p;
    ps_p->segments = NULL;
    ps_p->n_segments = 0;
    kvp_pool_stat_free(p);
    return 0;
}

/* ---------------- local cluster ---------------- */

static char self_dir[PATH_MAX];
static pid_t local_master_pid = -1;
/* --segment-records of the local masters whose start does not say */
static const char *segment_records = "on";
/* --tls-dir: the local masters' TLS flags (NULL: plain), and the clients' context */
static char tls_files[5][600];
static bool tls_on;
static kvp_tls_t *tls_ctx;

int kvp_bench_tls_use(const char *dir)
{
    static const char *const names[5] = {"server.crt", "server.key", "ca.crt", "acl.conf",
                                         "admin.crt"};
    for (int i = 0; i < 5; i++) {
        snprintf(tls_files[i], sizeof(tls_files[i]), "%s/%s", dir, names[i]);
        if (access(tls_files[i], R_OK) != 0) {
            fprintf(stderr, "kvpool-bench: --tls-dir: no %s (deploy/make-certs.sh DIR admin)\n",
                    tls_files[i]);
            return -1;
        }
    }
    char key[600];
    snprintf(key, sizeof(key), "%s/admin.key", dir);
    /* every client of this process and of its `kvpool serve` children presents admin */
    setenv("KVPOOL_TLS_CA", tls_files[2], 1);
    setenv("KVPOOL_TLS_CERT", tls_files[4], 1);
    setenv("KVPOOL_TLS_KEY", key, 1);
    kvp_tls_params_t tp = {.ca = tls_files[2], .cert = tls_files[4], .key = key};
    char err[256];
    if (kvp_tls_create(&tp, false, &tls_ctx, err, sizeof(err)) != KVP_OK) {
        fprintf(stderr, "kvpool-bench: --tls-dir: %s\n", err);
        return -1;
    }
    tls_on = true;
    return 0;
}

static const char *data_grants; /* --data-grants: "on", "off" or NULL (the master's own) */

int kvp_bench_data_grants_use(const char *arg)
{
    if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0)
        return -1;
    data_grants = arg;
    return 0;
}

bool kvp_bench_tls_on(void)
{
    return tls_on;
}

kvp_chan_t *kvp_bench_dial(const char *addr, uint32_t timeout_ms)
{
    char host[256], err[256] = "";
    uint16_t port;
    int fd;
    kvp_chan_t *ch = NULL;
    if (kvp_parse_hostport(addr, host, sizeof(host), &port) != KVP_OK ||
        kvp_tcp_connect(host, port, timeout_ms, &fd) != KVP_OK) {
        fprintf(stderr, "kvpool-bench: cannot connect to %s\n", addr);
        return NULL;
    }
    kvp_sock_set_timeout(fd, timeout_ms);
    if (kvp_chan_open(tls_ctx, fd, host, timeout_ms, &ch, err, sizeof(err)) != KVP_OK) {
        fprintf(stderr, "kvpool-bench: %s: %s\n", addr, err);
        return NULL;
    }
    return ch;
}

double kvp_bench_connect_us(const char *addr, unsigned n)
{
    double *t = calloc(n, sizeof(*t));
    unsigned got = 0;
    for (unsigned i = 0; t != NULL && i < n; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        kvp_chan_t *ch = kvp_bench_dial(addr, 5000);
        clock_gettime(CLOCK_MONOTONIC, &b);
        if (ch == NULL)
            break;
        kvp_chan_close(ch);
        t[got++] = (double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) / 1e3;
    }
    double med = 0;
    if (got > 0) {
        qsort(t, got, sizeof(*t), cmp_double);
        med = t[got / 2];
    }
    free(t);
    return med;
}

void kvp_bench_cluster_init(bool records)
{
    char exe[PATH_MAX];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (el > 0) {
        exe[el] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        snprintf(self_dir, sizeof(self_dir), "%s", exe);
    }
    segment_records = records ? "on" : "off";
}

pid_t kvp_bench_master_pid(void)
{
    return local_master_pid;
}

const char *kvp_bench_find_bin(const char *name)
{
    static char found[4][PATH_MAX];
    static int next;
    char *out = found[next++ % 4];
    const char *env = strcmp(name, "kvpool-master") == 0    ? getenv("KVPOOL_MASTER_BIN")
                      : strcmp(name, "kvpool-indexer") == 0 ? getenv("KVPOOL_INDEXER_BIN")
                                                            : getenv("KVPOOL_CLI_BIN");
    if (env != NULL && access(env, X_OK) == 0)
        return env;
    /* installed side by side, or the build tree (client/, master/ and indexer/) */
    const char *rel[] = {"%s/%s", "%s/../master/%s", "%s/../client/%s", "%s/../indexer/%s"};
    for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
        snprintf(out, PATH_MAX, rel[i], self_dir, name);
        if (access(out, X_OK) == 0)
            return out;
    }
    return name; /* PATH */
}

pid_t kvp_bench_spawn_ready(char *const argv[], char *line, size_t len)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return -1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* never outlive the bench (a bench that dies leaves no master or segment running;
         * spawned from the main thread, whose end is the process's) */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
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
    /* the meta mode mounts a segment nobody serves (127.0.0.1:1): no mount proofs */
    margv[na++] = "--mount-proof";
    margv[na++] = "off";
    /* one hash seed every run: which objects a full pool evicts (the ghost's filters hash
     * keys with it) repeats exactly, so a replay's hit rate does too */
    margv[na++] = "--index-seed";
    margv[na++] = "1";
    static const char *const tls_flags[4] = {"--tls-cert", "--tls-key", "--tls-ca", "--acl-file"};
    for (int i = 0; tls_on && i < 4; i++) {
        margv[na++] = (char *)tls_flags[i];
        margv[na++] = tls_files[i];
    }
    if (data_grants != NULL) {
        margv[na++] = "--data-grants";
        margv[na++] = (char *)data_grants;
    }
    for (size_t i = 0; flags != NULL && flags[i] != NULL && na < 31; i++)
        margv[na++] = (char *)flags[i];
    margv[na] = NULL;
    return kvp_bench_spawn_ready(margv, addr, len);
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
    return kvp_bench_spawn_ready(sargv, name, sizeof(name));
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

/* ---- the control plane's round-trip limit (limits mode: rtt, rtt-tls) ---- */

#define RTT_REPLY 128 /* a batch's answer of statuses: about what Exist and PutEnd return */

typedef struct rtt_server {
    int lfd;
    size_t req_bytes;
    kvp_tls_t *tls; /* NULL: plain */
} rtt_server_t;

/* Move exactly len bytes on the server's side (ssl NULL: plain). false: closed or failed. */
static bool rtt_io(int fd, kvp_ssl_t *ssl, char *buf, size_t len, bool wr)
{
    char err[256];
    for (size_t done = 0; done < len;) {
        ssize_t n = ssl  ? (wr ? kvp_tls_write(ssl, buf + done, len - done, err, sizeof(err))
                               : kvp_tls_read(ssl, buf + done, len - done, err, sizeof(err)))
                    : wr ? send(fd, buf + done, len - done, MSG_NOSIGNAL)
                         : recv(fd, buf + done, len - done, 0);
        if (n == KVP_TLS_WANT_READ || n == KVP_TLS_WANT_WRITE) {
            struct pollfd p = {.fd = fd, .events = n == KVP_TLS_WANT_READ ? POLLIN : POLLOUT};
            poll(&p, 1, 5000);
            continue;
        }
        if (n <= 0)
            return false;
        done += (size_t)n;
    }
    return true;
}

/* Answer each request of req_bytes with RTT_REPLY bytes until the peer closes. */
static void *rtt_serve(void *arg)
{
    rtt_server_t *s = arg;
    int fd = accept(s->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    kvp_ssl_t *ssl = NULL;
    if (s->tls != NULL && kvp_tls_accept(s->tls, fd, &ssl) != KVP_OK) {
        close(fd);
        return NULL;
    }
    char *buf = malloc(s->req_bytes > RTT_REPLY ? s->req_bytes : RTT_REPLY);
    while (buf != NULL && rtt_io(fd, ssl, buf, s->req_bytes, false) &&
           rtt_io(fd, ssl, buf, RTT_REPLY, true))
        ;
    free(buf);
    kvp_tls_free(ssl);
    close(fd);
    return NULL;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

int kvp_bench_rtt(size_t req_bytes, double duration_s, bool tls, double *us_p, double *cpu_us_p)
{
    *us_p = *cpu_us_p = 0;
    if (req_bytes < KVP_RPC_HDR_LEN || (tls && !tls_on))
        return -1;
    rtt_server_t s = {.lfd = -1, .req_bytes = req_bytes};
    char err[256] = "";
    if (tls) {
        kvp_tls_params_t sp = {.cert = tls_files[0], .key = tls_files[1], .ca = tls_files[2]};
        if (kvp_tls_create(&sp, true, &s.tls, err, sizeof(err)) != KVP_OK) {
            fprintf(stderr, "kvpool-bench: rtt-tls: %s\n", err);
            return -1;
        }
    }
    uint16_t port = 0;
    int fd = -1, rc = -1;
    pthread_t th;
    bool started = false, dialled = false;
    kvp_chan_t *ch = NULL;
    uint8_t *req = calloc(1, req_bytes), reply[RTT_REPLY];
    if (req == NULL || kvp_tcp_listen("127.0.0.1", 0, 1, &s.lfd, &port) != KVP_OK)
        goto out;
    started = pthread_create(&th, NULL, rtt_serve, &s) == 0;
    if (!started || kvp_tcp_connect("127.0.0.1", port, 5000, &fd) != KVP_OK)
        goto out;
    dialled = true;
    kvp_sock_set_timeout(fd, 5000);
    kvp_status_t cst =
        kvp_chan_open(tls ? tls_ctx : NULL, fd, "127.0.0.1", 5000, &ch, err, sizeof(err));
    fd = -1; /* the channel's from here on: it closes it, on failure too */
    if (cst != KVP_OK) {
        fprintf(stderr, "kvpool-bench: rtt%s: %s\n", tls ? "-tls" : "", err);
        goto out;
    }
    /* as a call to the master goes: a header and its body in one write, then the answer */
    for (int i = 0; i < 50; i++) /* warm-up: the handshake's last messages, the caches */
        if (kvp_chan_send2(ch, req, KVP_RPC_HDR_LEN, req + KVP_RPC_HDR_LEN,
                           req_bytes - KVP_RPC_HDR_LEN) != KVP_OK ||
            kvp_chan_recv_all(ch, reply, sizeof(reply)) != KVP_OK)
            goto out;
    uint64_t n = 0;
    double c0 = cpu_s(), t0 = kvp_bench_now(), t1 = t0;
    while (t1 - t0 < duration_s) {
        if (kvp_chan_send2(ch, req, KVP_RPC_HDR_LEN, req + KVP_RPC_HDR_LEN,
                           req_bytes - KVP_RPC_HDR_LEN) != KVP_OK ||
            kvp_chan_recv_all(ch, reply, sizeof(reply)) != KVP_OK)
            goto out;
        n++;
        t1 = kvp_bench_now();
    }
    *us_p = (t1 - t0) / (double)n * 1e6;
    *cpu_us_p = (cpu_s() - c0) / (double)n * 1e6;
    rc = 0;
out:
    if (ch != NULL)
        kvp_chan_close(ch);
    else if (fd >= 0)
        close(fd);
    if (started) {
        if (!dialled) { /* never connected: wake the accept */
            int wake = -1;
            if (kvp_tcp_connect("127.0.0.1", port, 1000, &wake) == KVP_OK)
                close(wake);
        }
        pthread_join(th, NULL);
    }
    if (s.lfd >= 0)
        close(s.lfd);
    kvp_tls_destroy(s.tls);
    free(req);
    return rc;
}

/* Move what one memory BIO holds into another (the two sessions' "network"). */
static void mem_pump(BIO *from, BIO *to)
{
    char buf[16384];
    int n;
    while ((n = BIO_read(from, buf, sizeof(buf))) > 0)
        BIO_write(to, buf, n);
}

/* Read exactly len bytes of session s's plaintext (all of it is already in its BIO). */
static bool mem_read(SSL *s, char *buf, size_t len)
{
    for (size_t got = 0, n = 0; got < len; got += n)
        if (SSL_read_ex(s, buf + got, len - got, &n) != 1)
            return false;
    return true;
}

int kvp_bench_rtt_tls_mem(size_t req_bytes, double duration_s, double *us_p)
{
    *us_p = 0;
    if (!tls_on || req_bytes < RTT_REPLY)
        return -1;
    int rc = -1;
    SSL_CTX *sctx = SSL_CTX_new(TLS_server_method()), *cctx = SSL_CTX_new(TLS_client_method());
    SSL *srv = NULL, *cli = NULL;
    char *buf = malloc(req_bytes);
    if (sctx == NULL || cctx == NULL || buf == NULL ||
        SSL_CTX_use_certificate_chain_file(sctx, tls_files[0]) != 1 ||
        SSL_CTX_use_PrivateKey_file(sctx, tls_files[1], SSL_FILETYPE_PEM) != 1)
        goto out;
    /* the library's settings (common/tls.c): TLS 1.3, AES-128-GCM first, read-ahead */
    SSL_CTX *both[2] = {sctx, cctx};
    for (int i = 0; i < 2; i++) {
        SSL_CTX_set_min_proto_version(both[i], TLS1_3_VERSION);
        SSL_CTX_set_ciphersuites(both[i], "TLS_AES_128_GCM_SHA256");
        SSL_CTX_set_read_ahead(both[i], 1);
    }
    srv = SSL_new(sctx);
    cli = SSL_new(cctx);
    if (srv == NULL || cli == NULL)
        goto out;
    BIO *s_in = BIO_new(BIO_s_mem()), *s_out = BIO_new(BIO_s_mem());
    BIO *c_in = BIO_new(BIO_s_mem()), *c_out = BIO_new(BIO_s_mem());
    SSL_set_bio(srv, s_in, s_out);
    SSL_set_bio(cli, c_in, c_out);
    SSL_set_accept_state(srv);
    SSL_set_connect_state(cli);
    for (int i = 0; i < 10 && !(SSL_is_init_finished(srv) && SSL_is_init_finished(cli)); i++) {
        SSL_do_handshake(cli);
        mem_pump(c_out, s_in);
        SSL_do_handshake(srv);
        mem_pump(s_out, c_in);
    }
    if (!SSL_is_init_finished(srv) || !SSL_is_init_finished(cli))
        goto out;
    memset(buf, 7, req_bytes);
    uint64_t n = 0;
    double t0 = kvp_bench_now(), t1 = t0;
    while (t1 - t0 < duration_s || n < 100) {
        size_t w;
        if (SSL_write_ex(cli, buf, req_bytes, &w) != 1)
            goto out;
        mem_pump(c_out, s_in);
        if (!mem_read(srv, buf, req_bytes) || SSL_write_ex(srv, buf, RTT_REPLY, &w) != 1)
            goto out;
        mem_pump(s_out, c_in);
        if (!mem_read(cli, buf, RTT_REPLY))
            goto out;
        n++;
        t1 = kvp_bench_now();
    }
    *us_p = (t1 - t0) / (double)n * 1e6;
    rc = 0;
out:
    SSL_free(srv);
    SSL_free(cli);
    SSL_CTX_free(sctx);
    SSL_CTX_free(cctx);
    free(buf);
    return rc;
}
