/*
 * bench_main.c - kvpool-bench: main, the global options and the mode table.
 *
 *   kvpool-bench MODE [options]       MODE: data limits meta alloc trace tracegen ssd dfs ha index
 * all
 *
 * Output: each mode prints a human-readable table (and a progress line on
 * stderr while it runs); --json FILE writes
 *   {"machine": {...}, "params": {...}, "results": [{...}, ...]}
 * with one flat object per figure. Field names are stable: dashboards and
 * comparisons read them (docs/benchmarks.md lists them).
 *
 * Design: one getopt table holds every mode's flags. The mode table gives each mode
 * its section of --help, its entry point (bench_<mode>.c) and what it needs around it
 * (a master, the shared cluster a --local run starts, --trace); `all` is a list of
 * modes, run in its order. A run is planned first (the modes, in order, and the
 * checks between the options and them), then the shared cluster starts if a mode
 * needs it, the modes run, and the cluster stops as soon as no mode left needs it.
 * Exit codes: 0, 1 (a mode or the JSON file failed), 2 (usage).
 *
 * Thread: the main thread.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/tools/bench/bench.h"
#include "common/parse.h"

/* An exit code, or go on with the run. */
#define BENCH_GO_ON (-1)

/* ---------------- the mode table ---------------- */

/* What a mode needs around it (bench_mode_t.needs). */
#define MODE_MASTER 0x1u    /* a master: with no --master and no $KVPOOL_MASTER, --local */
#define MODE_STORE 0x2u     /* the shared cluster (a --local run starts it for the mode) */
#define MODE_STORE_LRU 0x4u /* the shared cluster with --eviction client-lru only */
#define MODE_TRACE 0x8u     /* --trace FILE: an error without it, all skips the mode */
#define MODE_OWN 0x10u      /* its own processes whatever --master says (always --local) */

typedef struct bench_mode {
    const char *name;
    const char *usage; /* its section of --help, printed as it is; NULL: none */
    int (*run)(const kvp_bench_opts_t *o, kvp_bench_out_t *out); /* NULL: a list */
    unsigned needs;                                              /* MODE_* */
    const char *const *parts; /* a list: the modes it runs, in order, NULL-terminated */
} bench_mode_t;

static const char *const all_parts[] = {"limits", "data", "alloc", "meta", "trace", NULL};

/* In the order of --help. */
static const bench_mode_t modes[] = {
    {"data",
     "data:\n"
     "  --transport LIST       tcp,shm,rdma (default tcp,shm)\n"
     "  --rdma-write-limit G   GB/s of ib_write_bw in this session: rdma puts' %limit\n"
     "  --rdma-read-limit G    GB/s of ib_read_bw in this session: rdma gets' %limit\n"
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
     "  --no-crc               also measure with CRC checks off (labelled crc=off)\n",
     kvp_bench_data, MODE_MASTER | MODE_STORE, NULL},
    {"limits", NULL, kvp_bench_limits, 0, NULL},
    {"meta",
     "meta:\n"
     "  --objects LIST         resident objects (default 10000,1000000,10000000)\n",
     kvp_bench_meta, MODE_MASTER | MODE_STORE, NULL},
    {"alloc",
     "alloc:\n"
     "  --alloc-arena SIZE     arena size (default 64GiB)\n",
     kvp_bench_alloc, 0, NULL},
    {"trace",
     "trace:\n"
     "  --trace FILE           JSONL with hash_ids (Mooncake FAST'25 format)\n"
     "  --block-bytes SIZE     bytes per hash id (default 256KiB)\n"
     "  --capacity LIST        pool size as fractions of unique blocks (default 0.1)\n"
     "  --trace-limit N        replay at most N requests\n"
     "  --eviction MODE        store (default): per capacity an empty pool of exactly that\n"
     "                         many blocks (a fresh --local cluster each), the master evicts;\n"
     "                         client-lru: the bench removes LRU victims itself (a reference)\n"
     "  --pace LIST            replay each capacity once per pace: 0 unpaced (default), X at\n"
     "                         the trace's timestamps sped up X times (e.g. 0,10,100)\n"
     "  --trace-clients N      store eviction: N clients (threads) take the requests in\n"
     "                         trace order, together (default 1)\n"
     "  --ssd-capacity F       store, --local: the segment also gets an SSD tier of F x the\n"
     "                         unique blocks (file in --ssd-dir); hits are split per tier\n",
     kvp_bench_trace, MODE_MASTER | MODE_STORE_LRU | MODE_TRACE, NULL},
    {"tracegen",
     "tracegen (no store; a seeded synthetic trace in the trace mode's JSONL, 512-token\n"
     "    blocks; classes and their sources in bench_tracegen.c, docs/benchmarks.md):\n"
     "  --class NAME           conversation | toolagent | sysprompt | rag\n"
     "  --requests N           requests written (default 10000)\n"
     "  --seed N               the PRNG's seed (default 1)\n"
     "  --out FILE             the JSONL written\n",
     kvp_bench_tracegen, 0, NULL},
    /* the SSD tier's flags (limits, ssd and trace share them) open the ssd section */
    {"ssd",
     "SSD tier (limits' disk figures, ssd, trace --ssd-capacity):\n"
     "  --ssd-dir DIR          directory of the disk test file and SSD segment files, on a\n"
     "                         disk filesystem (default: the current directory; tmpfs refused)\n"
     "  --ssd-file-size SIZE   limits: the disk test file, written then read (default 1GiB)\n"
     "ssd (always --local: its own master with --promote-on-hit off and one segment):\n"
     "  --segment-size SIZE    its DRAM segment (default 256MiB here)\n"
     "  --ssd-size SIZE        its SSD segment (default 2GiB): offload writes about\n"
     "                         the DRAM segment plus 80 % of this\n"
     "  --ssd-objects N        1 MiB objects put straight to SSD and read back (default\n"
     "                         1024: as much as the disk limit's file)\n",
     kvp_bench_ssd, MODE_MASTER, NULL},
    {"dfs",
     "dfs (always its own master, a DRAM segment and a DFS segment whose directory is made in\n"
     "    --ssd-dir; --segment-size its DRAM, --ssd-size its DFS segment, --ssd-objects the\n"
     "    1 MiB objects per point): puts without and with a DFS replica, through the DFS\n"
     "    owner and in the shard file; gets from DFS once the DRAM owner is killed\n",
     kvp_bench_dfs, MODE_OWN, NULL},
    {"ha",
     "ha (always its own processes on 127.0.0.1; records cost, rebuild after a restart,\n"
     "    failover through etcd):\n"
     "  --ha-objects N         1 KiB objects resident when the master is killed (default\n"
     "                         1000000)\n"
     "  --ha-rounds N          leader kills in the failover part (default 10)\n"
     "  --leader-ttl S         the masters' --leader-ttl (default 2)\n",
     kvp_bench_ha, MODE_OWN, NULL},
    {"index",
     "index (kvpool-indexer: a trace through mock engines, in process and end to end through\n"
     "    its own kvpool-indexer over ZeroMQ and HTTP; bench_index.c, docs/benchmarks.md):\n"
     "  --trace FILE / --class NAME  the trace (FAST'25 JSONL), or tracegen's class made in\n"
     "                         memory (--requests, --seed); --trace-limit N\n"
     "  --engines N            mock engines (default 16)\n"
     "  --engine-blocks N      each engine's LRU pool in blocks of 16 tokens (default 16384)\n"
     "  --queries N            timed POST /query calls of 8192 tokens (default 2000)\n"
     "  --pairs N              (block, instance) pairs loaded for the memory figure\n"
     "                         (default 10000000)\n"
     "  --indexer-bin PATH     kvpool-indexer (default $KVPOOL_INDEXER_BIN, the build tree)\n",
     kvp_bench_index, MODE_OWN, NULL},
    {"tasks",
     "tasks (copy and move tasks, on 3 segments of its own per transport; bench_tasks.c):\n"
     "  --transport LIST       tcp,shm (default both)\n"
     "  --sizes LIST           object sizes (default 64KiB,1MiB,4MiB); 256 MiB of each\n"
     "  --segment-size SIZE    each segment (default 1GiB)\n",
     kvp_bench_tasks, MODE_OWN, NULL},
    {"sessions",
     "sessions (layer-wise save and load through transfer sessions against the calls\n"
     "    without one, on one segment of its own per transport; bench_sessions.c):\n"
     "  --transport LIST       tcp,shm (default both)\n"
     "  --sizes LIST           bytes of one layer of one key (default 16KiB,128KiB)\n"
     "  --batch N              keys (default 32)    --pieces N  layers (default 32)\n"
     "  --segment-size SIZE    the segment (default 1GiB)\n"
     "  --duration S           seconds of each load form (default 2)\n",
     kvp_bench_sessions, MODE_OWN, NULL},
    {"te",
     "te (the transfer engine, kvp_te_* / mooncake.engine: batch_transfer_sync_write of\n"
     "    runs into a second process's registered memory, as vLLM's prefill; bench_te.c):\n"
     "  --transport LIST       tcp,shm,rdma (default tcp,shm): tcp against the 2-stream\n"
     "                         socket pump (target 90 %), shm against memcpy of the same\n"
     "                         bytes (target 85 %), each measured next to its point; rdma\n"
     "                         against --rdma-write-limit (ib_write_bw)\n"
     "  --sizes LIST           bytes of one run (default 64KiB,256KiB,1MiB,4MiB)\n"
     "  --batch LIST           runs per batch (default 32,128,512; at most 256 MiB a batch)\n"
     "  --duration S           seconds per point (default 2)\n",
     kvp_bench_te, 0, NULL},
    {"all", NULL, NULL, 0, all_parts},
};

#define N_MODES (sizeof(modes) / sizeof(modes[0]))

static const bench_mode_t *mode_find(const char *name)
{
    for (size_t i = 0; i < N_MODES; i++)
        if (strcmp(name, modes[i].name) == 0)
            return &modes[i];
    return NULL;
}

static void usage(FILE *f)
{
    fputs("usage: kvpool-bench MODE [options]\nmodes: ", f);
    for (size_t i = 0; i < N_MODES; i++)
        fprintf(f, "%s%s", i ? " | " : "", modes[i].name);
    fputs(" (all but ssd, dfs, ha and index)\n"
          "cluster:\n"
          "  --master HOST:PORT     a running master (default $KVPOOL_MASTER)\n"
          "  --local                start a master and segments on 127.0.0.1 and stop them after\n"
          "  --segments N           local segments (default 1)\n"
          "  --segment-size SIZE    bytes per local segment (default 4GiB)\n"
          "  --segment-records on|off  the local masters' --segment-records (default on: owners\n"
          "                         keep a record of their objects, a restarted master adopts "
          "them)\n"
          "  --tls-dir DIR          the local masters run with TLS 1.3 and DIR/acl.conf, and\n"
          "                         every client presents DIR/admin.crt (deploy/make-certs.sh\n"
          "                         DIR admin; the ACL names admin with every role)\n"
          "  --data-grants on|off   with --tls-dir: the local masters' --data-grants (default\n"
          "                         on: every tcp data request carries a grant)\n",
          f);
    for (size_t i = 0; i < N_MODES; i++)
        if (modes[i].usage != NULL)
            fputs(modes[i].usage, f);
    fputs("output:\n"
          "  --json FILE            write every figure and the parameters as JSON\n"
          "  --quiet                no progress line\n",
          f);
}

/* ---------------- options ---------------- */

static const struct option long_opts[] = {
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
    {"class", required_argument, NULL, 'g'},
    {"pace", required_argument, NULL, 'p'},
    {"trace-clients", required_argument, NULL, 'k'},
    {"requests", required_argument, NULL, 'Q'},
    {"seed", required_argument, NULL, 'E'},
    {"out", required_argument, NULL, 'f'},
    {"ssd-dir", required_argument, NULL, 'D'},
    {"ssd-file-size", required_argument, NULL, 'F'},
    {"ssd-size", required_argument, NULL, 'Z'},
    {"ssd-objects", required_argument, NULL, 'N'},
    {"ssd-capacity", required_argument, NULL, 'X'},
    {"segment-records", required_argument, NULL, 'G'},
    {"tls-dir", required_argument, NULL, 'V'},
    {"data-grants", required_argument, NULL, 'M'},
    {"ha-objects", required_argument, NULL, 'H'},
    {"ha-rounds", required_argument, NULL, 'U'},
    {"leader-ttl", required_argument, NULL, 'Y'},
    {"engines", required_argument, NULL, 'x'},
    {"engine-blocks", required_argument, NULL, 'y'},
    {"pairs", required_argument, NULL, 'z'},
    {"queries", required_argument, NULL, 'u'},
    {"indexer-bin", required_argument, NULL, 'J'},
    {"json", required_argument, NULL, 'j'},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static void opts_defaults(kvp_bench_opts_t *o)
{
    *o = (kvp_bench_opts_t){
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
        .gen_seed = 1,
        .trace_clients = 1,
        .gen_requests = 10000,
        .ha_objects = 1000000,
        .ha_rounds = 10,
        .leader_ttl = 2,
        .idx_engines = 16,
        .idx_engine_blocks = 16384,
        .idx_pairs = 10000000,
        .idx_queries = 2000,
    };
}

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

/*
 * A comma list of whole numbers in 1..max into v (KVP_BENCH_MAX_LIST at most); with `set`
 * kept ascending, each once. Returns 0, or -1 when the list or a number is bad.
 */
static int parse_counts(const char *text, uint64_t max, bool set, unsigned *v, size_t *n_p)
{
    uint64_t tmp[KVP_BENCH_MAX_LIST];
    size_t n, nv = 0;
    if (parse_list_u64(text, tmp, &n, false) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (tmp[i] == 0 || tmp[i] > max)
            return -1;
        size_t at = nv;
        if (set) {
            at = 0;
            while (at < nv && v[at] < tmp[i])
                at++;
            if (at < nv && v[at] == tmp[i])
                continue;
            memmove(&v[at + 1], &v[at], (nv - at) * sizeof(v[0]));
        }
        v[at] = (unsigned)tmp[i];
        nv++;
    }
    *n_p = nv;
    return 0;
}

/* A size (1GiB, 4096, ...) of at least `min` bytes: 0, or -1. */
static int parse_size_min(const char *text, uint64_t min, uint64_t *v)
{
    return kvp_parse_size(text, v) && *v >= min ? 0 : -1;
}

/* A whole decimal number, all of the text: 0, or -1. */
static int parse_whole(const char *text, uint64_t *v)
{
    char *end;
    errno = 0;
    *v = strtoull(text, &end, 10);
    return errno || *end ? -1 : 0;
}

static int parse_transports(const char *text, kvp_bench_opts_t *o)
{
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", text);
    o->n_transports = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save);
         tok && o->n_transports < KVP_BENCH_MAX_LIST; tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "tcp") && strcmp(tok, "shm") && strcmp(tok, "rdma"))
            return -1;
        o->transports[o->n_transports++] = strcmp(tok, "tcp") == 0   ? "tcp"
                                           : strcmp(tok, "shm") == 0 ? "shm"
                                                                     : "rdma";
    }
    return o->n_transports == 0 ? -1 : 0;
}

static int parse_capacities(const char *text, kvp_bench_opts_t *o)
{
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", text);
    o->n_capacities = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save);
         tok && o->n_capacities < KVP_BENCH_MAX_LIST; tok = strtok_r(NULL, ",", &save)) {
        double v = strtod(tok, NULL);
        if (!(v > 0 && v <= 1))
            return -1;
        o->capacities[o->n_capacities++] = v;
    }
    return o->n_capacities == 0 ? -1 : 0;
}

/* --pace: a comma list of speed-ups >= 0 (0: unpaced). */
static int parse_paces(const char *text, kvp_bench_opts_t *o)
{
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", text);
    o->n_paces = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save);
         tok && o->n_paces < KVP_BENCH_MAX_LIST; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        double v = strtod(tok, &end);
        if (*end != '\0' || !(v >= 0 && v <= 1e9))
            return -1;
        o->paces[o->n_paces++] = v;
    }
    return o->n_paces == 0 ? -1 : 0;
}

/*
 * One option of a group: 0 when set, -1 when its value is bad, OPT_NOT_MINE when the
 * option belongs to another group.
 */
#define OPT_NOT_MINE 1

/* cluster (and the local masters' --segment-records) */
static int opt_cluster(kvp_bench_opts_t *o, int opt, const char *arg)
{
    switch (opt) {
    case 'm':
        o->master = arg;
        return 0;
    case 'L':
        o->local = true;
        return 0;
    case 'n':
        o->segments = (unsigned)strtoul(arg, NULL, 10);
        return o->segments == 0 || o->segments > 64 ? -1 : 0;
    case 'S':
        if (parse_size_min(arg, 1, &o->segment_size) != 0)
            return -1;
        o->segment_size_set = true;
        return 0;
    case 'G':
        if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0)
            return -1;
        o->segment_records = strcmp(arg, "on") == 0;
        return 0;
    case 'V':
        return kvp_bench_tls_use(arg) == 0 ? 0 : -1;
    case 'M':
        return kvp_bench_data_grants_use(arg);
    default:
        return OPT_NOT_MINE;
    }
}

/* data: what is measured */
static int opt_data_points(kvp_bench_opts_t *o, int opt, const char *arg)
{
    switch (opt) {
    case 't':
        return parse_transports(arg, o);
    case 's':
        o->sizes_set = true;
        return parse_list_u64(arg, o->sizes, &o->n_sizes, true);
    case 'b':
        o->batches_set = true;
        return parse_counts(arg, 65536, false, o->batches, &o->n_batches);
    case 'T':
        if (parse_counts(arg, 256, true, o->thread_counts, &o->n_thread_counts) != 0)
            return -1;
        o->threads = o->thread_counts[o->n_thread_counts - 1];
        return 0;
    case 'I': /* 1 (the baseline) first */
        return parse_counts(arg, 65536, true, o->pieces, &o->n_pieces);
    case 'd':
        o->duration_s = strtod(arg, NULL);
        return o->duration_s > 0 ? 0 : -1;
    case 'C':
        o->no_crc = true;
        return 0;
    default:
        return OPT_NOT_MINE;
    }
}

/* data: how the clients run, and the rdma limits measured outside */
static int opt_data_clients(kvp_bench_opts_t *o, int opt, const char *arg)
{
    switch (opt) {
    case 'P':
        o->clients_shared = false;
        o->clients_own = true;
        return 0;
    case 'K':
        o->clients_shared = strcmp(arg, "shared") == 0 || strcmp(arg, "both") == 0;
        o->clients_own = strcmp(arg, "per-thread") == 0 || strcmp(arg, "both") == 0;
        return !o->clients_shared && !o->clients_own ? -1 : 0;
    case 'O':
        if (strcmp(arg, "exist") != 0 && strcmp(arg, "get") != 0)
            return -1;
        o->loop = strcmp(arg, "exist") == 0 ? "exist" : "get";
        return 0;
    case 'W':
    case 'R': {
        double *gbps = opt == 'W' ? &o->rdma_write_gbps : &o->rdma_read_gbps;
        *gbps = strtod(arg, NULL);
        return *gbps > 0 ? 0 : -1;
    }
    default:
        return OPT_NOT_MINE;
    }
}

/* meta, alloc, trace */
static int opt_meta_trace(kvp_bench_opts_t *o, int opt, const char *arg)
{
    switch (opt) {
    case 'o':
        return parse_list_u64(arg, o->meta_objects, &o->n_meta_objects, false);
    case 'A':
        return parse_size_min(arg, 4096, &o->alloc_segment);
    case 'r':
        o->trace_path = arg;
        return 0;
    case 'B':
        return parse_size_min(arg, 1, &o->block_bytes);
    case 'c':
        return parse_capacities(arg, o);
    case 'l':
        o->trace_limit = strtoull(arg, NULL, 10);
        return 0;
    case 'e':
        if (strcmp(arg, "store") != 0 && strcmp(arg, "client-lru") != 0)
            return -1;
        o->trace_client_lru = strcmp(arg, "client-lru") == 0;
        return 0;
    case 'g':
        o->gen_class = arg;
        return 0;
    case 'p':
        return parse_paces(arg, o);
    case 'k': {
        uint64_t v;
        if (parse_whole(arg, &v) != 0 || v == 0 || v > 64)
            return -1;
        o->trace_clients = (unsigned)v;
        return 0;
    }
    case 'Q':
        return parse_whole(arg, &o->gen_requests) != 0 || o->gen_requests == 0 ? -1 : 0;
    case 'E':
        return parse_whole(arg, &o->gen_seed);
    case 'f':
        o->gen_out = arg;
        return 0;
    case 'X':
        o->ssd_capacity = strtod(arg, NULL);
        return o->ssd_capacity > 0 && o->ssd_capacity <= 4 ? 0 : -1;
    default:
        return OPT_NOT_MINE;
    }
}

/* the SSD tier, ha, output */
static int opt_ssd_ha(kvp_bench_opts_t *o, int opt, const char *arg)
{
    uint64_t v;
    switch (opt) {
    case 'D':
        o->ssd_dir = arg;
        return 0;
    case 'F':
        return parse_size_min(arg, 1u << 20, &o->ssd_file_size);
    case 'Z':
        return parse_size_min(arg, 64u << 20, &o->ssd_size);
    case 'N':
        return parse_whole(arg, &o->ssd_objects) != 0 || o->ssd_objects == 0 ? -1 : 0;
    case 'H':
        if (parse_whole(arg, &v) != 0 || v == 0)
            return -1;
        o->ha_objects = v;
        return 0;
    case 'U':
        if (parse_whole(arg, &v) != 0 || v == 0 || v > 1000)
            return -1;
        o->ha_rounds = (unsigned)v;
        return 0;
    case 'Y':
        if (parse_whole(arg, &v) != 0 || v < 2 || v > 3600)
            return -1;
        o->leader_ttl = (unsigned)v;
        return 0;
    case 'j':
        o->json_path = arg;
        return 0;
    case 'q':
        o->quiet = true;
        return 0;
    default:
        return OPT_NOT_MINE;
    }
}

/* index */
static int opt_index(kvp_bench_opts_t *o, int opt, const char *arg)
{
    uint64_t v;
    switch (opt) {
    case 'x':
        if (parse_whole(arg, &v) != 0 || v == 0 || v > 1024)
            return -1;
        o->idx_engines = (unsigned)v;
        return 0;
    case 'y':
        return parse_whole(arg, &o->idx_engine_blocks) != 0 || o->idx_engine_blocks < 64 ||
                       o->idx_engine_blocks > (1u << 24)
                   ? -1
                   : 0;
    case 'z':
        return parse_whole(arg, &o->idx_pairs) != 0 || o->idx_pairs == 0 ? -1 : 0;
    case 'u':
        return parse_whole(arg, &o->idx_queries) != 0 || o->idx_queries == 0 ? -1 : 0;
    case 'J':
        o->idx_bin = arg;
        return 0;
    default:
        return OPT_NOT_MINE;
    }
}

/* Parse the options after MODE into o (defaults first). Returns BENCH_GO_ON or an exit code. */
static int opts_parse(int argc, char **argv, kvp_bench_opts_t *o)
{
    static int (*const groups[])(kvp_bench_opts_t *, int, const char *) = {
        opt_cluster, opt_data_points, opt_data_clients, opt_meta_trace, opt_ssd_ha, opt_index};
    opts_defaults(o);
    optind = 2;
    int opt, li = 0;
    while ((opt = getopt_long(argc, argv, "h", long_opts, &li)) != -1) {
        if (opt == 'h') {
            usage(stdout);
            return 0;
        }
        int r = OPT_NOT_MINE;
        for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]) && r == OPT_NOT_MINE; g++)
            r = groups[g](o, opt, optarg);
        if (r == OPT_NOT_MINE) { /* getopt_long said why */
            usage(stderr);
            return 2;
        }
        if (r != 0) {
            fprintf(stderr, "kvpool-bench: bad value for --%s: '%s'\n", long_opts[li].name, optarg);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvpool-bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return BENCH_GO_ON;
}

/* ---------------- the run ---------------- */

/* The modes one run runs, in order, and what they need together. */
typedef struct bench_plan {
    const bench_mode_t *modes[N_MODES];
    size_t n;
    unsigned needs; /* MODE_*, of all of them */
} bench_plan_t;

static bool mode_uses_store(const bench_mode_t *m, const kvp_bench_opts_t *o)
{
    return (m->needs & MODE_STORE) || ((m->needs & MODE_STORE_LRU) && o->trace_client_lru);
}

/* Whether a mode from the i-th on runs against the shared cluster. */
static bool plan_uses_store(const bench_plan_t *p, size_t i, const kvp_bench_opts_t *o)
{
    for (; i < p->n; i++)
        if (mode_uses_store(p->modes[i], o))
            return true;
    return false;
}

/* MODE (argv[1]) from the table, or an exit code with --help or a message. */
static int mode_pick(int argc, char **argv, const bench_mode_t **mode_p)
{
    if (argc < 2 || argv[1][0] == '-') {
        bool help = argc >= 2 && strcmp(argv[1], "--help") == 0;
        usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    const bench_mode_t *m = mode_find(argv[1]);
    if (m == NULL) {
        fprintf(stderr, "kvpool-bench: unknown mode '%s'\n", argv[1]);
        usage(stderr);
        return 2;
    }
    *mode_p = m;
    return BENCH_GO_ON;
}

/* The modes `m` runs: itself, or its parts (a mode that cannot run is skipped, said once). */
static int plan_make(const bench_mode_t *m, const kvp_bench_opts_t *o, bench_plan_t *p)
{
    memset(p, 0, sizeof(*p));
    if (m->run != NULL) {
        if ((m->needs & MODE_TRACE) && o->trace_path == NULL) {
            fprintf(stderr, "kvpool-bench: %s needs --trace FILE\n", m->name);
            return 2;
        }
        p->modes[p->n++] = m;
    }
    for (size_t i = 0; m->parts != NULL && m->parts[i] != NULL; i++) {
        const bench_mode_t *part = mode_find(m->parts[i]);
        if ((part->needs & MODE_TRACE) && o->trace_path == NULL) {
            fprintf(stderr, "kvpool-bench: %s: no --trace FILE, the %s mode is skipped\n", m->name,
                    part->name);
            continue;
        }
        p->modes[p->n++] = part;
    }
    for (size_t i = 0; i < p->n; i++)
        p->needs |= p->modes[i]->needs;
    return BENCH_GO_ON;
}

/* What the options mean for this plan: where the master comes from, the checks between
 * them, and a note on stdout when local masters keep no records. */
static int plan_check(const bench_plan_t *p, kvp_bench_opts_t *o)
{
    if (p->needs & MODE_OWN)
        o->local = true;
    if (o->ssd_capacity > 0 && (!(p->needs & MODE_TRACE) || o->trace_client_lru)) {
        fprintf(stderr, "kvpool-bench: --ssd-capacity is for the trace mode in store eviction\n");
        return 2;
    }
    if ((p->needs & MODE_MASTER) && !o->local && o->master == NULL) {
        fprintf(stderr, "kvpool-bench: no --master and no $KVPOOL_MASTER: using --local\n");
        o->local = true;
    }
    if (o->local && !o->segment_records && !(p->needs & MODE_OWN))
        printf("(local masters run with --segment-records off: no owner records)\n");
    return BENCH_GO_ON;
}

/*
 * Run the plan's modes in order. `cluster` (NULL: none) is the shared cluster, stopped as
 * soon as no mode left uses it: its memory is given back before the trace starts pools of
 * its own. Returns 0, or non-zero when a mode failed.
 */
static int plan_run(const bench_plan_t *p, const kvp_bench_opts_t *o, kvp_bench_out_t *out,
                    kvp_bench_cluster_t *cluster)
{
    int rc = 0;
    for (size_t i = 0; i < p->n; i++) {
        rc |= p->modes[i]->run(o, out);
        if (cluster != NULL && !plan_uses_store(p, i + 1, o)) {
            kvp_bench_cluster_stop(cluster);
            cluster = NULL;
        }
    }
    if (cluster != NULL)
        kvp_bench_cluster_stop(cluster);
    return rc;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const bench_mode_t *mode = NULL;
    kvp_bench_opts_t o;
    bench_plan_t plan;
    int code = mode_pick(argc, argv, &mode);
    if (code == BENCH_GO_ON)
        code = opts_parse(argc, argv, &o);
    if (code == BENCH_GO_ON)
        code = plan_make(mode, &o, &plan);
    if (code == BENCH_GO_ON)
        code = plan_check(&plan, &o);
    if (code != BENCH_GO_ON)
        return code;

    kvp_bench_cluster_init(o.segment_records);
    kvp_bench_cluster_t cluster;
    bool started = false;
    if (o.local && plan_uses_store(&plan, 0, &o)) {
        if (kvp_bench_cluster_start(&cluster, o.segments, o.segment_size) != 0) {
            fprintf(stderr, "kvpool-bench: cannot start the local cluster\n");
            return 1;
        }
        started = true;
        o.master = cluster.master_addr;
    }
    kvp_bench_out_t out;
    kvp_bench_out_init(&out);
    int rc = plan_run(&plan, &o, &out, started ? &cluster : NULL);
    if (o.json_path != NULL && kvp_bench_json_write(&out, &o, mode->name) != 0)
        rc = 1;
    kvp_bench_out_cleanup(&out);
    if (rc)
        fprintf(stderr, "kvpool-bench: %s: FAILED (errors above)\n", mode->name);
    return rc ? 1 : 0;
}
