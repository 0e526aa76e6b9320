/*
 * bench.h - shared pieces of kvpool-bench: options, result output (human
 * table + JSON), the local cluster, timing and percentiles.
 *
 * Files: bench_main.c holds main, the global options and the mode table;
 * bench_common.c what the modes share (results and the JSON document, timing,
 * statistics, progress, the local cluster); bench_<mode>.c one mode each, and
 * bench_limits.c also keeps the limits measured in this run for the other modes.
 *
 * Each mode exposes one entry point
 * `int kvp_bench_<mode>(const kvp_bench_opts_t *o, kvp_bench_out_t *out)`
 * returning 0 on success, non-zero on any failure: a failed put, get, exist or
 * remove, wrong bytes, a failed cluster start or measurement (the first few
 * failures are printed on stderr with their kvp_strerror text). A mode
 * prints its own human-readable table to stdout (with a progress line on
 * stderr while it runs) and adds one flat JSON object per figure through
 * kvp_bench_result_*.
 */
#ifndef KVP_BENCH_H
#define KVP_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "client/include/kvpool.h"
#include "common/tls.h"

#define KVP_BENCH_MAX_LIST 16

typedef struct kvp_bench_opts {
    /* cluster */
    const char *master;    /* running master HOST:PORT; NULL with local=true */
    bool local;            /* start master + segments on loopback ourselves */
    unsigned segments;     /* local: number of `kvpool serve` processes (default 1) */
    uint64_t segment_size; /* local: bytes per segment (default 4 GiB) */
    bool segment_size_set; /* --segment-size was given (the ssd mode has its own default) */
    bool segment_records;  /* local masters: --segment-records on (default) or off */
    /* data mode */
    const char *transports[KVP_BENCH_MAX_LIST]; /* "tcp", "shm", "rdma" */
    size_t n_transports;
    /* rdma limits measured outside (perftest ib_write_bw / ib_read_bw in the
     * same session, GB/s): put is compared with write, get with read */
    double rdma_write_gbps, rdma_read_gbps;
    uint64_t sizes[KVP_BENCH_MAX_LIST]; /* object sizes */
    size_t n_sizes;
    unsigned batches[KVP_BENCH_MAX_LIST];
    size_t n_batches;
    bool sizes_set, batches_set; /* --sizes / --batch given (te: its own defaults otherwise) */
    unsigned threads; /* client threads (default 1); data: the largest of thread_counts */
    /* data: --threads LIST, ascending; a count > 1 also measures 1 thread, the baseline of
     * ratio_to_1_thread */
    unsigned thread_counts[KVP_BENCH_MAX_LIST];
    size_t n_thread_counts;
    /* data: the threads share one client (default), each has its own
     * (--client-per-thread), or both forms are measured (--clients both) */
    bool clients_shared, clients_own;
    /* data: NULL (each round puts, checks, gets and removes a batch) or "exist" / "get":
     * the batch is put once, then only that op is repeated (issue 11's thread points) */
    const char *loop;
    /* data: --pieces LIST (default 1): with N > 1 each object's buffer is split into N equal
     * pieces and put / got with kvp_batch_put_from_multi / kvp_batch_get_into_multi (issue 14's
     * layer-wise layout); ratio_to_1_piece compares with the 1-piece point when it is listed */
    unsigned pieces[KVP_BENCH_MAX_LIST];
    size_t n_pieces;
    double duration_s; /* per measured point (default 2 s) */
    bool no_crc;       /* also measure with CRC checks off (labelled) */
    /* meta mode */
    uint64_t meta_objects[KVP_BENCH_MAX_LIST]; /* resident object counts (10k, 1M, 10M) */
    size_t n_meta_objects;
    /* alloc mode */
    uint64_t alloc_segment; /* arena size (default 64 GiB) */
    /* trace mode */
    const char *trace_path;
    uint64_t block_bytes;                  /* default 256 KiB */
    double capacities[KVP_BENCH_MAX_LIST]; /* fractions of unique blocks (default 0.1) */
    size_t n_capacities;
    uint64_t trace_limit; /* max requests replayed (0: all) */
    /* false (default, --eviction store): per capacity point an empty pool of exactly
     * capacity_blocks blocks, the master's eviction decides what stays; true
     * (--eviction client-lru): the bench removes LRU victims itself (a reference) */
    bool trace_client_lru;
    /* trace pacing: each capacity point is replayed once per pace, a speed-up of the trace's
     * timestamps (0: unpaced, as fast as it goes; 10: ten times the trace's own rate) */
    double paces[KVP_BENCH_MAX_LIST];
    size_t n_paces;
    unsigned trace_clients; /* store eviction: clients (threads) replaying together (1) */
    /* tracegen mode: the class, its seed, how many requests, the JSONL written */
    const char *gen_class;
    uint64_t gen_seed;
    uint64_t gen_requests;
    const char *gen_out;
    /* SSD tier: the files live in ssd_dir (default "."; never tmpfs) */
    const char *ssd_dir;
    uint64_t ssd_file_size; /* limits: the disk test file (default 1 GiB) */
    uint64_t ssd_size;      /* ssd mode: the SSD segment (default 2 GiB) */
    uint64_t ssd_objects;   /* ssd mode: 1 MiB objects read back from SSD (default 1024) */
    /* trace: the SSD tier as a fraction of unique blocks (0: no SSD segment) */
    double ssd_capacity;
    /* ha mode (always its own local processes) */
    uint64_t ha_objects; /* rebuild: 1 KiB objects put before the master is killed (1000000) */
    unsigned ha_rounds;  /* failover: leader kills (default 10) */
    unsigned leader_ttl; /* failover: the masters' --leader-ttl in seconds (default 2) */
    /* index mode: mock engines (count, LRU blocks of 16 tokens each), (block, instance)
     * pairs loaded for the memory figure, timed /query calls, the daemon's binary */
    unsigned idx_engines;
    uint64_t idx_engine_blocks, idx_pairs, idx_queries;
    const char *idx_bin;
    /* output */
    const char *json_path;
    bool quiet; /* no progress line */
} kvp_bench_opts_t;

/* ---- results (bench_common.c) ---- */

/* The result objects written so far, as JSON text. Modes touch it only through
 * kvp_bench_result_*; main owns it (init / cleanup). */
typedef struct kvp_bench_out {
    char *buf;
    size_t len, cap;
    int n_results;
    int fields;
} kvp_bench_out_t;

void kvp_bench_out_init(kvp_bench_out_t *out);
void kvp_bench_out_cleanup(kvp_bench_out_t *out);

/* Start a result object (a flat JSON object); "mode" is set to `mode`. */
void kvp_bench_result_begin(kvp_bench_out_t *out, const char *mode);
void kvp_bench_result_str(kvp_bench_out_t *out, const char *key, const char *val);
void kvp_bench_result_num(kvp_bench_out_t *out, const char *key, double val);
void kvp_bench_result_int(kvp_bench_out_t *out, const char *key, int64_t val);
void kvp_bench_result_end(kvp_bench_out_t *out);

/*
 * Write o->json_path: {"machine": {...}, "params": {...} (the options, `mode` the one
 * asked for), "results": [the objects in `results`]}. Returns 0, or -1 with a message
 * on stderr.
 */
int kvp_bench_json_write(const kvp_bench_out_t *results, const kvp_bench_opts_t *o,
                         const char *mode);

/* ---- limits measured in this run (bench_limits.c) ---- */

/*
 * The machine's limits measured in this run by the limits mode, used by the
 * data mode for pct_of_limit. 0 when not measured.
 */
double kvp_bench_limit_memcpy_gbps(uint64_t size);
double kvp_bench_limit_tcp_gbps(uint64_t size, unsigned streams);
/* The same pump over a batch's working set: each stream cycles through the buffers of its
 * share of a batch of 32 (16 per stream at 2 streams; fewer for big objects, at most 128 MiB
 * a side), as the data mode's gets and puts do, instead of one buffer that stays in cache. */
double kvp_bench_limit_tcp_ws_gbps(uint64_t size, unsigned streams);
/*
 * Measure (once) the memcpy and loopback-tcp limits for a size and stream count.
 * Returns 0, or -1 (message on stderr) when a measurement failed.
 */
int kvp_bench_limits_ensure(const kvp_bench_opts_t *o, uint64_t size, unsigned streams);
/* The loopback tcp pump measured now, for duration seconds: each stream's sender and receiver
 * cycle through nbufs buffers of size (1: tcp-pump, one that stays in cache). The buffers:
 * src and dst, the caller's, streams x nbufs x size each (stream s's at s x nbufs x size:
 * the pump moves the very pages the engine it stands beside moves), or with NULL its own,
 * allocated and touched before the clock starts. GB/s, or 0 when it failed. For a mode that
 * puts its limit next to each point (te) rather than once per run. */
double kvp_bench_measure_tcp_pump_gbps(uint64_t size, unsigned streams, unsigned nbufs,
                                       double duration, uint8_t *src, uint8_t *dst);

/*
 * The disk's own figures (limits' disk part): io_uring O_DIRECT write then read of a file of
 * o->ssd_file_size in o->ssd_dir, 1 MiB blocks at queue depth KVP_SSD_IO_DEPTH (client/ssd's
 * own I/O code). Measured once per run; returns 0, or -1 with a message on stderr.
 */
int kvp_bench_disk_limits_ensure(const kvp_bench_opts_t *o);
/* Measure the disk again (a virtualised disk's speed drifts by 2x within minutes: the SSD
 * tier's figures are compared with a limit measured just before them). */
int kvp_bench_disk_limits_remeasure(const kvp_bench_opts_t *o);
/* GB/s of the disk measured in this run (0: not measured). */
double kvp_bench_limit_disk_gbps(bool write);
/* 0 when `dir` can hold an SSD file (exists, on a disk filesystem); -1 with a message
 * (tmpfs and ramfs are refused: they have no disk behind them). */
int kvp_bench_ssd_dir_check(const char *dir);

/* ---- local cluster (bench_common.c) ---- */

/* --tls-dir: local masters with TLS and DIR/acl.conf; this process and its children present
 * DIR/admin.crt ($KVPOOL_TLS_*). 0, or -1 when DIR lacks a file. */
int kvp_bench_tls_use(const char *dir);
bool kvp_bench_tls_on(void);
/*
 * The control plane's floor on this machine: one client thread sends a request of req_bytes
 * (a header and a body in one write, as a call to the master goes) over loopback TCP to a
 * thread of this process that answers 128 bytes, for duration_s; plain, or with tls TLS 1.3
 * through the library's own channel and server session (--tls-dir's certificates). *us_p:
 * the mean round trip; *cpu_us_p: this process's CPU (both ends) per round trip. 0, or -1
 * (tls without --tls-dir, a socket or handshake failure: said on stderr).
 */
int kvp_bench_rtt(size_t req_bytes, double duration_s, bool tls, double *us_p, double *cpu_us_p);
/* The same round trip's TLS work alone: two TLS 1.3 sessions (the library's cipher and
 * read-ahead) over memory buffers in this thread, no socket, no wake-up: the cipher and
 * record cost of one call. *us_p: per round trip. 0, or -1 (no --tls-dir, a failure). */
int kvp_bench_rtt_tls_mem(size_t req_bytes, double duration_s, double *us_p);
/* --data-grants on|off: the local masters' flag (unset: theirs). 0, or -1 for another value. */
int kvp_bench_data_grants_use(const char *arg);
/* A connection to the master at addr ("HOST:PORT"), TLS when --tls-dir is in use. NULL on
 * failure (said on stderr). */
kvp_chan_t *kvp_bench_dial(const char *addr, uint32_t timeout_ms);
/* The median time of n connects (TCP, and the TLS handshake with --tls-dir), in us. */
double kvp_bench_connect_us(const char *addr, unsigned n);
typedef struct kvp_bench_cluster {
    pid_t master_pid;
    pid_t seg_pids[64];
    unsigned n_segs;
    char master_addr[128];
} kvp_bench_cluster_t;

/*
 * Start a master (its default settings) and n segment servers of seg_size bytes
 * on 127.0.0.1. Returns 0, or -1 with a message on stderr and nothing left running.
 */
int kvp_bench_cluster_start(kvp_bench_cluster_t *c, unsigned n, uint64_t seg_size);
/* A local cluster with more settings: extra master flags, and an SSD segment beside the
 * first serve process's DRAM segment. */
typedef struct kvp_bench_cluster_params {
    unsigned n;                      /* serve processes */
    uint64_t seg_size;               /* DRAM bytes per serve process (0: none) */
    const char *ssd_path;            /* NULL: no SSD segment; else the first one's file */
    uint64_t ssd_size;               /* its bytes */
    const char *const *master_flags; /* NULL-terminated extra kvpool-master flags, or NULL */
    const char *segment_records;     /* "on" | "off"; NULL: as --segment-records says */
} kvp_bench_cluster_params_t;
int kvp_bench_cluster_start_params(kvp_bench_cluster_t *c, const kvp_bench_cluster_params_t *p);
/*
 * Where our sibling binaries are (the directory of /proc/self/exe) and the --segment-records
 * of the local masters whose start does not say: main calls it once, before any start.
 */
void kvp_bench_cluster_init(bool segment_records);
/* SIGTERM everything by PID, reap. */
void kvp_bench_cluster_stop(kvp_bench_cluster_t *c);
/*
 * The pieces of a cluster, for modes that kill and restart them (ha). Start one
 * kvpool-master on `listen` (NULL: 127.0.0.1:0, a free port) with --segment-records
 * `records` (NULL: as --segment-records says) and the extra flags (NULL-terminated, or
 * NULL); its bound HOST:PORT goes to addr. Start one `kvpool serve` of seg_size bytes of
 * DRAM against `master` (HOST:PORT or etcd://HOST:PORT/NAME). Both return the pid once the
 * process wrote its ready line, or -1 with a message on stderr.
 */
pid_t kvp_bench_master_start(const char *listen, const char *records, const char *const *flags,
                             char *addr, size_t len);
pid_t kvp_bench_serve_start(const char *master, uint64_t seg_size);
/* SIGTERM pid, SIGKILL after 10 s; reap. */
void kvp_bench_stop_pid(pid_t pid);
/* Path of a sibling binary ("kvpool-master", "kvpool", "kvpool-indexer"): env
 * ($KVPOOL_MASTER_BIN, $KVPOOL_CLI_BIN, $KVPOOL_INDEXER_BIN), next to us, build tree, PATH. */
const char *kvp_bench_find_bin(const char *name);
/* Start argv (its stdout to /dev/null) with fd 3 a pipe, and read the one line a daemon's
 * --ready-fd 3 writes into `line` (15 s at most). Returns the pid, or -1 (said on stderr;
 * nothing left running). Call it from the main thread: the child is sent SIGTERM when the
 * thread that spawned it ends (PR_SET_PDEATHSIG), so a bench that dies leaves none behind. */
pid_t kvp_bench_spawn_ready(char *const argv[], char *line, size_t len);
/* PID of a running master we started (for RSS), or -1. */
pid_t kvp_bench_master_pid(void);

/* ---- timing, stats, progress (bench_common.c) ---- */
double kvp_bench_now(void); /* monotonic seconds */
/* Sort `v` in place and return the p-th percentile (0 <= p <= 100). */
double kvp_bench_percentile(double *v, size_t n, double p);

/* Latency samples (seconds), grown as they come; free v when done. A sample that finds
 * no memory is dropped. */
typedef struct kvp_bench_lat {
    double *v;
    size_t n, cap;
} kvp_bench_lat_t;
void kvp_bench_lat_add(kvp_bench_lat_t *l, double x);
/* "\r<text>" on stderr unless quiet; kvp_bench_progress_done clears the line. */
void kvp_bench_progress(const kvp_bench_opts_t *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void kvp_bench_progress_done(const kvp_bench_opts_t *o);

/* Resident set size of a process in bytes (pid 0: self), -1 if unknown. */
long long kvp_bench_rss_bytes(pid_t pid);
/* CPU seconds (user + system) a process has used so far (pid 0: self), -1 if unknown. */
double kvp_bench_cpu_s(pid_t pid);

/* The pool as the master sees it, without its segment list; -1 with a message naming
 * `mode` when it cannot be asked (*ps_p is written only on success). */
int kvp_bench_pool_stat(kvp_client_t *c, const char *mode, kvp_pool_stat_t *ps_p);

/* splitmix64 finaliser: a bijection, so distinct inputs give distinct outputs (keys, object
 * bytes, seeds). Inline: the meta mode makes its keys with it on the measured path. */
static inline uint64_t kvp_bench_mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* ---- traces (bench_trace.c, bench_tracegen.c) ---- */

/* Make *p (*cap elements of elem bytes) hold at least `need`: doubled from 1024. 0, or -1
 * (out of memory; *p unchanged). */
int kvp_bench_grow(void **p, size_t *cap, size_t need, size_t elem);

/* The requests of a FAST'25 JSONL trace, as read: request q's hash ids are
 * ids[off[q] .. off[q+1]). */
typedef struct kvp_bench_reqs {
    uint64_t *ids;
    size_t *off;
    size_t n_req, n_ids, malformed;
} kvp_bench_reqs_t;
/* Read at most `limit` requests (0: all) of f (named `name` in messages); lines without a
 * well-formed hash_ids array are skipped and counted. 0, or -1 (said on stderr). */
int kvp_bench_trace_read(FILE *f, const char *name, uint64_t limit, kvp_bench_reqs_t *r);
void kvp_bench_reqs_free(kvp_bench_reqs_t *r);
/* Write n requests of tracegen's class (its seed) to f. 0, or -1 (said on stderr). */
int kvp_bench_tracegen_write(const char *class_name, uint64_t seed, uint64_t n, FILE *f);

/* ---- modes ---- */
int kvp_bench_data(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
int kvp_bench_limits(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
int kvp_bench_meta(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
int kvp_bench_alloc(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
int kvp_bench_trace(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
/* tracegen: no store; writes o->gen_out (bench_tracegen.c) */
int kvp_bench_tracegen(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
/* The classes tracegen knows, for messages. */
const char *kvp_bench_tracegen_classes(void);
int kvp_bench_ssd(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
int kvp_bench_dfs(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
int kvp_bench_ha(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
/* index: kvpool-indexer in process, end to end, /query latency, memory (bench_index.c) */
int kvp_bench_index(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
/* Copy and move tasks on a cluster of its own (bench_tasks.c). */
int kvp_bench_tasks(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
/* Layer-wise save and load through transfer sessions (bench_sessions.c). */
int kvp_bench_sessions(const kvp_bench_opts_t *o, kvp_bench_out_t *out);
/* te: the transfer engine's batch_transfer_sync_write (bench_te.c) */
int kvp_bench_te(const kvp_bench_opts_t *o, kvp_bench_out_t *out);

#endif
