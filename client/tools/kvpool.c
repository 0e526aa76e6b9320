/*
 * kvpool.c - the kvpool command-line tool: serve a DRAM segment, put, get and
 * remove objects, test whether keys exist, show pool statistics.
 *
 * DESIGN
 * One process per command, built only on the public API of kvpool.h (plus the
 * size and host:port parsers of common/util.h). Global options are parsed with
 * getopt_long("+") so parsing stops at the command name; the command then
 * parses its own options from argv re-based at the command. Every command
 * checks all of its input (numbers, sizes, files, fds) before it connects, so
 * a usage mistake is reported at once and never waits on the master.
 *
 * Exit status: 0 success; 1 the operation failed ("kvpool: WHAT: WHY" on
 * stderr); 2 usage error (the message and the usage text on stderr). `exist`
 * follows test(1): 0 all keys exist, 1 some key does not, 2 error.
 *
 * `serve` blocks SIGINT and SIGTERM before kvp_client_create, so every library
 * thread inherits the mask and only the main thread takes them, in sigwait();
 * it then destroys the client, which unmounts the segment. `get` fetches the
 * whole object before it creates anything, then writes a temporary file beside
 * FILE and renames it over FILE: a failed get never leaves a partial FILE.
 *
 * Thread: single-threaded; the library runs its own threads.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "client/tools/cli/progress.h"
#include "common/conf.h"
#include "common/http.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/clock.h"
#include "common/parse.h"
#include "common/key.h"

#define KVP_CLI_VERSION "0.1.0"
#define KVP_CLI_STR_(x) #x
#define KVP_CLI_STR(x) KVP_CLI_STR_(x)
#define KVP_CLI_DEFAULT_MASTER "127.0.0.1:" KVP_CLI_STR(KVP_DEFAULT_MASTER_PORT)
/* A get whose key is replaced by a larger object between size and read retries this often. */
#define KVP_CLI_GET_ATTEMPTS 3

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* Long-only option codes of the global options (getopt returns them). */
enum {
    OPT_MASTER = 0x100,
    OPT_TRANSPORT,
    OPT_TIMEOUT,
    OPT_RDMA_DEVICE,
    OPT_RDMA_HOST,
    OPT_PROGRESS,
    OPT_NO_PROGRESS,
    OPT_VERSION,
};

/* The global options that may also be keys of a serve config file (and flags after
 * `serve`), in getopt_long's table form. */
#define GLOBAL_OPTIONS                                                                             \
    {"master", required_argument, NULL, OPT_MASTER},                                               \
        {"transport", required_argument, NULL, OPT_TRANSPORT},                                     \
        {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},                                      \
        {"rdma-device", required_argument, NULL, OPT_RDMA_DEVICE},                                 \
    {                                                                                              \
        "rdma-host", required_argument, NULL, OPT_RDMA_HOST                                        \
    }

/* Progress reports (cli_t.progress): on long work only, always, never. */
enum { PROGRESS_AUTO = 0, PROGRESS_ALWAYS, PROGRESS_NEVER };
/* "Long work" for PROGRESS_AUTO: objects of this many bytes, removes of this many keys. */
#define KVP_CLI_PROGRESS_BYTES (32u << 20)
#define KVP_CLI_PROGRESS_KEYS 10000u
/* Keys per remove batch while progress is shown (so it moves). */
#define KVP_CLI_RM_STEP 1024u

typedef struct cli {
    const char *master;       /* "host:port", already validated */
    const char *transport;    /* NULL: library default */
    uint32_t timeout_ms;      /* 0: library default */
    const char *rdma_devices; /* NULL: library default */
    const char *rdma_host;
    unsigned given; /* bit (OPT_x - OPT_MASTER): set on the command line before the command */
    int progress;   /* PROGRESS_* */
} cli_t;

typedef struct command {
    const char *name;
    const char *args;
    int (*run)(const cli_t *cli, const struct command *cmd, int argc, char **argv);
} command_t;

/* An input object: either a read-only mapping of a file or a malloc'd buffer. */
typedef struct input {
    void *data;
    size_t len;
    bool mapped;
} input_t;

static const char global_usage[] =
    "usage: kvpool [--master HOST:PORT] [--transport auto|tcp|shm|rdma] [--timeout-ms N]\n"
    "              [--progress | --no-progress] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  serve --segment-size SIZE [--data-host HOST] [--data-port PORT] [--name NAME]\n"
    "        [--ready-fd N] [--drain-timeout SECONDS]\n"
    "        [--ssd-path PATH --ssd-size SIZE [--ssd-buffered-io]]\n"
    "        [--http-listen HOST:PORT] [--config FILE]\n"
    "                            mount a DRAM segment of SIZE (64MiB, 1g, 4096...) and\n"
    "                            serve it until SIGINT or SIGTERM, then drain it: move\n"
    "                            its objects to other segments (default 30 s; 0: no);\n"
    "                            --ssd-path: also an SSD segment, the file PATH (created\n"
    "                            and preallocated; mounted again, its objects come back);\n"
    "                            either segment may be left out (--segment-size 0);\n"
    "                            --http-listen: serve /metrics (Prometheus) and /health\n"
    "                            (200 while the segment is mounted, else 503);\n"
    "                            --config: an INI file whose keys are these flags and the\n"
    "                            global ones without dashes ([serve] section); flags on\n"
    "                            the command line override it\n"
    "  put [--replicas N] [--prefer SEGMENT] [--upsert] [--medium dram|ssd] KEY FILE|-\n"
    "                            store FILE (or stdin) under KEY (--upsert: replace)\n"
    "  get KEY [FILE|-]          write the object to FILE (default: stdout)\n"
    "  exist KEY...              print KEY<TAB>yes|no; exit 0 if all exist, 1 if not\n"
    "  rm [--force] KEY...       remove objects (--force: also ones being read)\n"
    "  rm [--force] --regex RE | --all\n"
    "                            remove every object whose key matches the POSIX\n"
    "                            extended regex RE, or every object\n"
    "  ls [--limit N] [--json] [RE]\n"
    "                            keys (matching RE), sizes, replicas, lease, pin\n"
    "                            (at most N, default 1000)\n"
    "  drain [--wait SECONDS] SEGMENT\n"
    "                            ask SEGMENT's owner to move its objects elsewhere and\n"
    "                            unmount; wait for it (default 60 s)\n"
    "  stat [--json] [--watch [SECONDS]]\n"
    "                            pool capacity, usage and segments; --watch: again every\n"
    "                            SECONDS (default 1) until Ctrl-C\n"
    "\n"
    "global options:\n"
    "  --master HOST:PORT        master address (default $KVPOOL_MASTER, "
    "else " KVP_CLI_DEFAULT_MASTER ");\n"
    "                            etcd://HOST:PORT[,HOST:PORT...]/CLUSTER: the leader of\n"
    "                            masters started with --etcd ... --cluster CLUSTER\n"
    "  --transport T             data transport: auto, tcp, shm or rdma (default auto:\n"
    "                            shm on one host, else rdma if both sides have it, else tcp)\n"
    "  --rdma-device LIST        RDMA devices to try, e.g. rxe0,mlx5_0 (default\n"
    "                            $KVPOOL_RDMA_DEVICE, else any with an active port)\n"
    "  --rdma-host IPV4          address serve's rdma listener binds and advertises\n"
    "                            (default $KVPOOL_RDMA_HOST, else the device's own)\n"
    "  --timeout-ms N            master RPC and transfer timeout\n"
    "  --progress, --no-progress progress on stderr (a bar on a terminal, else a line\n"
    "                            every 2 s) always / never; default: for long work only\n"
    "                            (drain, removing many keys, objects of 32 MiB or more)\n"
    "  -h, --help, --version\n"
    "\n"
    "exit status: 0 success, 1 failure, 2 usage error\n";

static int fail(const char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(const command_t *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int global_option(cli_t *cli, const command_t *cmd, int opt, const char *arg);
static int check_master(const cli_t *cli, const command_t *cmd, const char *from);

/*
 * "kvpool: WHAT: WHY" on stderr, WHY being kvp_strerror() or strerror();
 * returns the failure exit code.
 */
static int fail(const char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvpool: ", stderr);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, ": %s\n", why);
    va_end(ap);
    return CLI_FAIL;
}

/* The message, then the command's usage line (or the whole text) on stderr. */
static int usage_error(const command_t *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvpool: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (cmd != NULL)
        fprintf(stderr, "usage: kvpool [GLOBAL OPTIONS] %s %s\n(see kvpool --help)\n", cmd->name,
                cmd->args);
    else
        fputs(global_usage, stderr);
    return CLI_USAGE;
}

/* Report a getopt error ('?' or ':'), naming the option that caused it. */
static int option_error(const command_t *cmd, int opt, int argc, char **argv)
{
    char shortopt[3] = {'-', (char)optopt, '\0'};
    const char *arg = argv[KVP_MAX(1, KVP_MIN(optind - 1, argc - 1))];
    const char *name = strncmp(arg, "--", 2) != 0 && optopt != 0 ? shortopt : arg;
    if (opt == ':')
        return usage_error(cmd, "option '%s' needs an argument", name);
    return usage_error(cmd, "unknown option '%s'", name);
}

/* Decimal unsigned integer in [0, max]; false on anything else. */
static bool parse_uint(const char *text, uint64_t max, uint64_t *value_p)
{
    if (text == NULL || text[0] < '0' || text[0] > '9')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        return false;
    *value_p = v;
    return true;
}

/* Seconds in [0, 86400], fractions allowed; false on anything else. */
static bool parse_seconds(const char *text, double *value_p)
{
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || !(v >= 0) || v > 86400)
        return false;
    *value_p = v;
    return true;
}

/* "1.5 GiB"; below 1 KiB "512 B". */
static const char *human_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", bytes);
        return buf;
    }
    double v = (double)bytes / 1024.0;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < KVP_ARRAY_SIZE(units)) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

/* Connect; params NULL: no segment. Reports its own failure on stderr. */
static kvp_status_t client_open(const cli_t *cli, kvp_client_params_t *params,
                                kvp_client_t **client_p)
{
    kvp_client_params_t defaults;
    if (params == NULL) {
        kvp_client_params_init(&defaults);
        params = &defaults;
    }
    params->master_addr = cli->master;
    params->transport = cli->transport;
    params->rpc_timeout_ms = cli->timeout_ms;
    params->rdma_devices = cli->rdma_devices;
    params->rdma_host = cli->rdma_host;
    kvp_status_t status = kvp_client_create(params, client_p);
    if (status == KVP_ERR_CONNECT)
        fprintf(stderr,
                "kvpool: cannot reach master %s: %s\n"
                "kvpool: is kvpool-master running there? (set --master or $KVPOOL_MASTER)\n",
                cli->master, kvp_strerror(status));
    else if (status != KVP_OK)
        fail(kvp_strerror(status), "cannot create a client for master %s", cli->master);
    return status;
}

static bool write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* write_all in steps, telling `p` how far it is (NULL: no progress). */
static bool write_all_progress(int fd, const void *buf, size_t len, kvp_progress_t *p)
{
    const size_t step = 8u << 20;
    for (size_t at = 0; at < len;) {
        size_t n = KVP_MIN(step, len - at);
        if (!write_all(fd, (const char *)buf + at, n))
            return false;
        at += n;
        kvp_progress_set(p, at);
    }
    return true;
}

/* Whether to report progress for work that is long (`long_work`) or not. */
static bool progress_wanted(const cli_t *cli, bool long_work)
{
    return cli->progress == PROGRESS_ALWAYS || (cli->progress == PROGRESS_AUTO && long_work);
}

/*
 * Parse the options of a command that has none but --help. Returns true when
 * the command must stop now, with its exit code in *rc_p.
 */
static bool parse_no_options(const command_t *cmd, int argc, char **argv, int *rc_p)
{
    static const struct option opts[] = {
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt = getopt_long(argc, argv, "+:h", opts, NULL);
    if (opt == -1)
        return false;
    if (opt == 'h') {
        fputs(global_usage, stdout);
        *rc_p = CLI_OK;
    } else {
        *rc_p = option_error(cmd, opt, argc, argv);
    }
    return true;
}

/* ---- serve -------------------------------------------------------------- */

/* What serve's HTTP handler reads (on libmicrohttpd's threads). */
typedef struct serve_http {
    kvp_client_t *client;
    bool dram;            /* a DRAM segment was asked for: health follows it */
    _Atomic bool leaving; /* a signal came: draining and going away */
} serve_http_t;

/* GET /metrics (Prometheus text), /health (200 "ok" while the segment is mounted and
 * not leaving, else 503 and why). Thread: an HTTP server thread. */
static void serve_http_handler(void *arg, const char *path, const kvp_http_request_t *req,
                               kvp_http_reply_t *reply)
{
    (void)req;
    serve_http_t *h = arg;
    kvp_metrics_t m = {.size = sizeof(m)};
    if (kvp_metrics_snapshot(h->client, &m) != KVP_OK) {
        reply->status = 500;
        kvp_http_printf(reply, "no metrics: %s\n", kvp_client_last_error());
        return;
    }
    if (strcmp(path, "/metrics") == 0) {
        /* bounded: a fixed set of series, two segment names of < 300 bytes */
        char text[16384];
        size_t need = kvp_metrics_format_prometheus(&m, text, sizeof(text));
        if (need >= sizeof(text)) {
            reply->status = 500;
            kvp_http_printf(reply, "metrics text too long (%zu bytes)\n", need);
            return;
        }
        reply->content_type = "text/plain; version=0.0.4; charset=utf-8";
        kvp_http_append(reply, text, need);
    } else if (strcmp(path, "/health") == 0) {
        const char *why = NULL;
        if (atomic_load(&h->leaving))
            why = "shutting down: draining the segment";
        else if (h->dram && m.dram_draining)
            why = "draining";
        else if (h->dram && !m.dram_mounted)
            why = "segment not mounted (drained)";
        else if (!h->dram && !m.ssd_mounted)
            why = "SSD segment not mounted";
        reply->status = why == NULL ? 200 : 503;
        kvp_http_printf(reply, "%s\n", why == NULL ? "ok" : why);
    } else {
        reply->status = 404;
        kvp_http_printf(reply, "not found: %s (try /metrics or /health)\n", path);
    }
}

/* serve's work once its argv (config file expanded) is known. */
static int serve_run(const cli_t *gcli, const command_t *cmd, const struct option *opts, int argc,
                     char **argv)
{
    cli_t cli = *gcli;
    kvp_client_params_t params;
    kvp_client_params_init(&params);
    uint64_t v;
    int ready_fd = -1;
    double drain_s = 30;
    bool dram_given = false;
    const char *http_listen = NULL;
    int opt;
    optind = 0;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        switch (opt) {
        case 's':
            if (!kvp_parse_size(optarg, &params.segment_size))
                return usage_error(cmd, "--segment-size needs a size such as 64MiB, got '%s'",
                                   optarg);
            dram_given = true;
            break;
        case 'S':
            params.ssd_path = optarg;
            break;
        case 'Z':
            if (!kvp_parse_size(optarg, &params.ssd_size) || params.ssd_size < (1u << 20))
                return usage_error(cmd, "--ssd-size needs a size of at least 1MiB, got '%s'",
                                   optarg);
            break;
        case 'B':
            params.ssd_buffered_io = 1;
            break;
        case 'H':
            params.data_host = optarg;
            break;
        case 'p':
            if (!parse_uint(optarg, UINT16_MAX, &v))
                return usage_error(cmd, "--data-port needs a port 0..65535, got '%s'", optarg);
            params.data_port = (uint16_t)v;
            break;
        case 'n':
            params.segment_name = optarg;
            break;
        case 'r':
            if (!parse_uint(optarg, INT_MAX, &v))
                return usage_error(cmd, "--ready-fd needs a file descriptor, got '%s'", optarg);
            ready_fd = (int)v;
            break;
        case 'd':
            if (!parse_seconds(optarg, &drain_s))
                return usage_error(cmd, "--drain-timeout needs seconds (0..86400), got '%s'",
                                   optarg);
            break;
        case 'L': {
            char host[256];
            uint16_t port;
            if (kvp_parse_hostport(optarg, host, sizeof(host), &port) != KVP_OK)
                return usage_error(cmd, "--http-listen needs HOST:PORT (port 0: any), got '%s'",
                                   optarg);
            http_listen = optarg;
            break;
        }
        case 'h':
            fputs(global_usage, stdout);
            return CLI_OK;
        case '?':
        case ':':
            return option_error(cmd, opt, argc, argv);
        default: {
            /* a global option in the config file (or after `serve`): the command line's
             * own, given before `serve`, wins */
            if (gcli->given & (1u << (opt - OPT_MASTER)))
                break;
            int rc = global_option(&cli, cmd, opt, optarg);
            if (rc >= 0)
                return rc;
            break;
        }
        }
    }
    if (optind < argc)
        return usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (cli.master != gcli->master) {
        int bad = check_master(&cli, cmd, "master");
        if (bad >= 0)
            return bad;
    }
    if (!dram_given && params.ssd_path == NULL)
        return usage_error(cmd, "serve needs --segment-size (and/or --ssd-path)");
    if (params.segment_size == 0 && params.ssd_path == NULL)
        return usage_error(cmd, "--segment-size 0 needs an SSD segment (--ssd-path)");
    if ((params.ssd_path == NULL) != (params.ssd_size == 0))
        return usage_error(cmd, "--ssd-path and --ssd-size go together");
    if (ready_fd >= 0 && fcntl(ready_fd, F_GETFD) < 0)
        return usage_error(cmd, "--ready-fd %d is not an open file descriptor", ready_fd);

    /* Before any library thread exists: they all inherit the blocked mask. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    int err = pthread_sigmask(SIG_BLOCK, &mask, NULL);
    if (err != 0)
        return fail(strerror(err), "cannot block SIGINT/SIGTERM");

    kvp_client_t *client;
    params.drain_timeout_ms = drain_s > 0 ? (uint32_t)(drain_s * 1000) : 30000;
    if (client_open(&cli, &params, &client) != KVP_OK)
        return CLI_FAIL;
    serve_http_t hs = {.client = client, .dram = params.segment_size > 0};
    atomic_init(&hs.leaving, false);
    kvp_http_t *http = NULL;
    char http_addr[300] = "";
    if (http_listen != NULL) {
        uint16_t port = 0;
        kvp_status_t hst = kvp_http_start(http_listen, serve_http_handler, &hs, &http, &port);
        if (hst != KVP_OK) {
            kvp_client_destroy(client);
            return fail(kvp_strerror(hst), "--http-listen %s", http_listen);
        }
        char host[256];
        kvp_parse_hostport(http_listen, host, sizeof(host), &(uint16_t){0});
        snprintf(http_addr, sizeof(http_addr), "%s:%u", host, (unsigned)port);
    }
    const char *name = kvp_client_segment_name(client);
    const char *ssd_name = kvp_client_ssd_segment_name(client);
    if (name != NULL)
        printf("serving segment %s (%" PRIu64 " bytes) for master %s\n", name, params.segment_size,
               cli.master);
    if (ssd_name != NULL)
        printf("serving SSD segment %s (%" PRIu64 " bytes, file %s) for master %s\n", ssd_name,
               params.ssd_size, params.ssd_path, cli.master);
    if (http != NULL)
        printf("metrics on http://%s/metrics, health on http://%s/health\n", http_addr, http_addr);
    if (name == NULL)
        name = ssd_name != NULL ? ssd_name : "(unnamed)";
    fflush(stdout);
    if (ready_fd >= 0) {
        /* one write: the segment's name, then (with --http-listen) "http HOST:PORT" */
        char line[1024];
        int n = http != NULL ? snprintf(line, sizeof(line), "%s\nhttp %s\n", name, http_addr)
                             : snprintf(line, sizeof(line), "%s\n", name);
        size_t len = n < 0 ? 0 : KVP_MIN((size_t)n, sizeof(line) - 1);
        if (!write_all(ready_fd, line, len))
            fprintf(stderr, "kvpool: cannot write to --ready-fd %d: %s\n", ready_fd,
                    strerror(errno));
        close(ready_fd);
    }

    /* Wait for a signal; also stop once the segment was drained on request (kvpool drain). */
    int rc = CLI_OK;
    for (;;) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
        int sig = sigtimedwait(&mask, NULL, &ts);
        if (sig > 0)
            break;
        if (errno != EAGAIN && errno != EINTR) {
            rc = fail(strerror(errno), "sigtimedwait");
            break;
        }
        if (params.segment_size > 0 && !kvp_client_segment_mounted(client)) {
            printf("segment %s was drained on request: exiting\n", name);
            fflush(stdout);
            kvp_http_stop(http);
            kvp_client_destroy(client);
            return CLI_OK;
        }
    }
    atomic_store(&hs.leaving, true);
    if (rc == CLI_OK && drain_s > 0 && kvp_client_segment_mounted(client)) {
        uint64_t moved = 0, lost = 0;
        uint64_t t0 = kvp_now_ms();
        kvp_status_t st = kvp_drain(client, (uint32_t)(drain_s * 1000), &moved, &lost);
        if (st == KVP_ERR_PENDING) {
            /* a requested drain is already running: let it finish */
            while (kvp_client_segment_mounted(client))
                usleep(50 * 1000);
            st = KVP_OK;
        }
        if (st != KVP_OK)
            fprintf(stderr, "kvpool: drain of %s: %s\n", name, kvp_strerror(st));
        printf("segment %s drained in %.1f s: %" PRIu64 " objects moved, %" PRIu64
               " left the pool\n",
               name, (double)(kvp_now_ms() - t0) / 1000.0, moved, lost);
        fflush(stdout);
    }
    kvp_http_stop(http); /* its handler reads the client */
    kvp_client_destroy(client);
    return rc;
}

static int cmd_serve(const cli_t *cli, const command_t *cmd, int argc, char **argv)
{
    /* every flag is also a config file key (common/conf.h), global ones included */
    static const struct option opts[] = {
        {"segment-size", required_argument, NULL, 's'},
        {"data-host", required_argument, NULL, 'H'},
        {"data-port", required_argument, NULL, 'p'},
        {"name", required_argument, NULL, 'n'},
        {"ready-fd", required_argument, NULL, 'r'},
        {"drain-timeout", required_argument, NULL, 'd'},
        {"ssd-path", required_argument, NULL, 'S'},
        {"ssd-size", required_argument, NULL, 'Z'},
        {"ssd-buffered-io", no_argument, NULL, 'B'},
        {"http-listen", required_argument, NULL, 'L'},
        GLOBAL_OPTIONS,
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int cargc;
    char **cargv;
    char err[512] = "";
    kvp_status_t st =
        kvp_conf_expand_argv(argc, argv, opts, "serve", &cargc, &cargv, err, sizeof(err));
    if (st != KVP_OK)
        return usage_error(cmd, "--config: %s", err[0] ? err : kvp_strerror(st));
    /* the options' arguments point into cargv: it lives until serve is over */
    int rc = serve_run(cli, cmd, opts, cargc, cargv);
    kvp_conf_free_argv(cargv, argv);
    return rc;
}

/* ---- put ---------------------------------------------------------------- */

/* Read fd to its end into a malloc'd buffer (pipes, ttys, /proc files). */
static int read_stream(int fd, const char *what, input_t *in)
{
    size_t cap = 1 << 20;
    size_t len = 0;
    char *buf = malloc(cap);
    if (buf == NULL)
        return fail(strerror(ENOMEM), "reading %s", what);
    for (;;) {
        if (len == cap) {
            char *bigger = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                return fail(strerror(ENOMEM), "reading %s", what);
            }
            buf = bigger;
            cap *= 2;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n == 0)
            break;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            return fail(strerror(e), "cannot read %s", what);
        }
        len += (size_t)n;
    }
    in->data = buf;
    in->len = len;
    in->mapped = false;
    return CLI_OK;
}

/* Load FILE ("-": stdin) into `in`: regular files are mapped, the rest read. */
static int input_load(const char *path, input_t *in)
{
    if (strcmp(path, "-") == 0)
        return read_stream(STDIN_FILENO, "stdin", in);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fail(strerror(errno), "cannot open '%s'", path);
    struct stat st;
    int rc;
    if (fstat(fd, &st) < 0) {
        rc = fail(strerror(errno), "cannot stat '%s'", path);
    } else if (S_ISDIR(st.st_mode)) {
        rc = fail(strerror(EISDIR), "cannot read '%s'", path);
    } else if (S_ISREG(st.st_mode) && st.st_size > 0) {
        if ((uint64_t)st.st_size > SIZE_MAX) {
            rc = fail(strerror(EFBIG), "cannot map '%s'", path);
        } else {
            void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) {
                rc = fail(strerror(errno), "cannot map '%s'", path);
            } else {
                madvise(p, (size_t)st.st_size, MADV_SEQUENTIAL);
                in->data = p;
                in->len = (size_t)st.st_size;
                in->mapped = true;
                rc = CLI_OK;
            }
        }
    } else {
        /* Pipes, devices, and regular files that claim size 0 (/proc). */
        char what[PATH_MAX + 2];
        snprintf(what, sizeof(what), "'%s'", path);
        rc = read_stream(fd, what, in);
    }
    close(fd);
    return rc;
}

static void input_release(input_t *in)
{
    if (in->mapped)
        munmap(in->data, in->len);
    else
        free(in->data);
}

static int cmd_put(const cli_t *cli, const command_t *cmd, int argc, char **argv)
{
    static const struct option opts[] = {
        {"replicas", required_argument, NULL, 'r'}, {"prefer", required_argument, NULL, 'p'},
        {"upsert", no_argument, NULL, 'u'},         {"medium", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    kvp_put_config_t config;
    kvp_put_config_init(&config);
    uint64_t v;
    int opt;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'r':
            if (!parse_uint(optarg, UINT32_MAX, &v) || v == 0)
                return usage_error(cmd, "--replicas needs a count >= 1, got '%s'", optarg);
            config.replica_num = (uint32_t)v;
            break;
        case 'p':
            config.preferred_segment = optarg;
            break;
        case 'u':
            config.mode = KVP_PUT_UPSERT;
            break;
        case 'm':
            if (strcmp(optarg, "dram") != 0 && strcmp(optarg, "ssd") != 0)
                return usage_error(cmd, "--medium needs dram or ssd, got '%s'", optarg);
            config.medium = optarg;
            break;
        case 'h':
            fputs(global_usage, stdout);
            return CLI_OK;
        default:
            return option_error(cmd, opt, argc, argv);
        }
    }
    if (argc - optind != 2)
        return usage_error(cmd, "put needs KEY and FILE (or - for stdin)");
    const char *key = argv[optind];
    const char *path = argv[optind + 1];
    /* Before reading what may be gigabytes of stdin. */
    if (!kvp_key_valid(key, strlen(key)))
        return fail(kvp_strerror(KVP_ERR_BAD_KEY), "put %s", key);

    input_t in;
    int rc = input_load(path, &in);
    if (rc != CLI_OK)
        return rc;
    if (in.len == 0) {
        input_release(&in);
        fprintf(stderr, "kvpool: put %s: %s is empty: refusing to store an empty object\n", key,
                strcmp(path, "-") == 0 ? "stdin" : path);
        return CLI_FAIL;
    }
    kvp_client_t *client;
    if (client_open(cli, NULL, &client) != KVP_OK) {
        input_release(&in);
        return CLI_FAIL;
    }
    const void *buf = in.data;
    size_t len = in.len;
    kvp_status_t result = KVP_OK;
    uint32_t written = 0;
    /* one call moves the object: its progress is the elapsed time, then the whole */
    kvp_progress_t *prog = NULL;
    if (progress_wanted(cli, len >= KVP_CLI_PROGRESS_BYTES)) {
        char what[300];
        snprintf(what, sizeof(what), "put %.*s", 256, key);
        prog = kvp_progress_start(what, 0, true, NULL, KVP_PROGRESS_AUTO, 0);
    }
    kvp_status_t status =
        kvp_batch_put_from_ex(client, &key, &buf, &len, 1, &config, &result, &written);
    if (status == KVP_OK) {
        kvp_progress_set_total(prog, len);
        kvp_progress_set(prog, len);
    }
    kvp_progress_end(prog, status == KVP_OK ? "done" : "failed");
    kvp_client_destroy(client);
    input_release(&in);
    if (status != KVP_OK)
        return fail(kvp_strerror(result != KVP_OK ? result : status), "put %s", key);
    if (written < config.replica_num)
        fprintf(stderr, "kvpool: put %s: stored with %u of %u replicas\n", key, written,
                config.replica_num);
    return CLI_OK;
}

/* ---- get ---------------------------------------------------------------- */

/*
 * Write buf to path so that path either keeps its old content or holds all of
 * buf: a temp file in the same directory, renamed over path. Non-regular
 * targets (/dev/null, fifos) are written in place, never replaced.
 */
static int output_write(const char *path, const void *buf, size_t len, kvp_progress_t *prog)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return fail(strerror(EISDIR), "cannot write '%s'", path);
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
            return fail(strerror(errno), "cannot open '%s'", path);
        bool ok = write_all_progress(fd, buf, len, prog);
        int e = errno;
        close(fd);
        return ok ? CLI_OK : fail(strerror(e), "cannot write '%s'", path);
    }
    /* Replace what a symlink points to, not the link itself. */
    char *target = realpath(path, NULL);
    const char *dst = target != NULL ? target : path;
    const char *slash = strrchr(dst, '/');
    size_t dirlen = slash != NULL ? (size_t)(slash - dst) + 1 : 0;
    const char *base = dst + dirlen;
    size_t tlen = strlen(dst) + 32;
    char *tmp = malloc(tlen);
    if (tmp == NULL) {
        free(target);
        return fail(strerror(ENOMEM), "cannot write '%s'", path);
    }
    snprintf(tmp, tlen, "%.*s.%s.kvpool-XXXXXX", (int)dirlen, dst, base);

    int rc = CLI_FAIL;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        fail(strerror(errno), "cannot create a temporary file for '%s'", path);
        goto out_free;
    }
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) < 0 || !write_all_progress(fd, buf, len, prog)) {
        fail(strerror(errno), "cannot write '%s'", tmp);
        goto out_unlink;
    }
    if (close(fd) < 0) {
        fd = -1;
        fail(strerror(errno), "cannot write '%s'", tmp);
        goto out_unlink;
    }
    fd = -1;
    if (rename(tmp, dst) < 0) {
        fail(strerror(errno), "cannot rename '%s' to '%s'", tmp, dst);
        goto out_unlink;
    }
    rc = CLI_OK;
    goto out_free;

out_unlink:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
out_free:
    free(tmp);
    free(target);
    return rc;
}

static int cmd_get(const cli_t *cli, const command_t *cmd, int argc, char **argv)
{
    int rc;
    if (parse_no_options(cmd, argc, argv, &rc))
        return rc;
    if (argc - optind < 1 || argc - optind > 2)
        return usage_error(cmd, "get needs KEY and optionally FILE");
    const char *key = argv[optind];
    const char *path = argc - optind == 2 ? argv[optind + 1] : "-";

    kvp_client_t *client;
    if (client_open(cli, NULL, &client) != KVP_OK)
        return CLI_FAIL;
    void *buf = NULL;
    int64_t got = KVP_ERR_INTERNAL;
    kvp_progress_t *prog = NULL;
    /* The key may be removed and re-put with another size between the calls. */
    for (int attempt = 0; attempt < KVP_CLI_GET_ATTEMPTS; attempt++) {
        int64_t size = kvp_get_size(client, key);
        if (size < 0) {
            got = size;
            break;
        }
        if (prog == NULL && progress_wanted(cli, (uint64_t)size >= KVP_CLI_PROGRESS_BYTES)) {
            char what[300];
            snprintf(what, sizeof(what), "get %.*s", 256, key);
            prog = kvp_progress_start(what, 0, true, NULL, KVP_PROGRESS_AUTO, 0);
        }
        if ((uint64_t)size > SIZE_MAX || (buf = malloc((size_t)size)) == NULL) {
            kvp_progress_end(prog, "failed");
            kvp_client_destroy(client);
            fprintf(stderr, "kvpool: get %s: cannot allocate %" PRId64 " bytes\n", key, size);
            return CLI_FAIL;
        }
        got = kvp_get_into(client, key, buf, (size_t)size);
        if (got != KVP_ERR_BUFFER_TOO_SMALL)
            break;
        free(buf);
        buf = NULL;
    }
    kvp_client_destroy(client);
    if (got >= 0 && prog != NULL) {
        /* the transfer is one call; writing the file is shown as it goes */
        kvp_progress_set_total(prog, (uint64_t)got);
        kvp_progress_set(prog, (uint64_t)got);
        char what[PATH_MAX + 16];
        snprintf(what, sizeof(what), "write %s", strcmp(path, "-") == 0 ? "stdout" : path);
        kvp_progress_phase(prog, what, (uint64_t)got);
    }
    if (got < 0)
        rc = fail(kvp_strerror((kvp_status_t)got), "get %s", key);
    else if (strcmp(path, "-") == 0 && !write_all_progress(STDOUT_FILENO, buf, (size_t)got, prog))
        /* A reader that went away (| head) is not worth a message. */
        rc = errno == EPIPE ? CLI_FAIL : fail(strerror(errno), "get %s: writing stdout", key);
    else if (strcmp(path, "-") == 0)
        rc = CLI_OK;
    else
        rc = output_write(path, buf, (size_t)got, prog);
    kvp_progress_end(prog, got >= 0 && rc == CLI_OK ? "done" : "failed");
    free(buf);
    return rc;
}

/* ---- exist, rm ---------------------------------------------------------- */

static int cmd_exist(const cli_t *cli, const command_t *cmd, int argc, char **argv)
{
    int rc;
    if (parse_no_options(cmd, argc, argv, &rc))
        return rc;
    if (optind >= argc)
        return usage_error(cmd, "%s needs at least one KEY", cmd->name);
    const char *const *keys = (const char *const *)argv + optind;
    size_t n = (size_t)(argc - optind);
    int *results = malloc(n * sizeof(*results));
    if (results == NULL)
        return fail(strerror(ENOMEM), "exist");
    kvp_client_t *client;
    if (client_open(cli, NULL, &client) != KVP_OK) {
        free(results);
        return CLI_USAGE; /* an error, not an answer: same code as test(1) */
    }
    for (size_t off = 0; off < n; off += KVP_MAX_BATCH) {
        size_t cnt = KVP_MIN(n - off, (size_t)KVP_MAX_BATCH);
        for (size_t i = 0; i < cnt; i++)
            results[off + i] = 2; /* not an answer: left unwritten by the library */
        kvp_status_t status = kvp_batch_is_exist(client, keys + off, cnt, results + off, NULL);
        for (size_t i = 0; i < cnt && status != KVP_OK; i++)
            if (results[off + i] == 2)
                results[off + i] = status;
    }
    kvp_client_destroy(client);
    bool all = true, error = false;
    for (size_t i = 0; i < n; i++) {
        if (results[i] == 1) {
            printf("%s\tyes\n", keys[i]);
        } else if (results[i] == 0) {
            printf("%s\tno\n", keys[i]);
            all = false;
        } else {
            printf("%s\terror: %s\n", keys[i], kvp_strerror((kvp_status_t)results[i]));
            error = true;
        }
    }
    free(results);
    if (fflush(stdout) != 0) {
        fail(strerror(errno), "writing stdout");
        return CLI_USAGE;
    }
    return error ? CLI_USAGE : all ? CLI_OK : CLI_FAIL;
}

static int cmd_rm(const cli_t *cli, const command_t *cmd, int argc, char **argv)
{
    static const struct option opts[] = {
        {"force", no_argument, NULL, 'f'},
        {"regex", required_argument, NULL, 'r'},
        {"all", no_argument, NULL, 'a'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool force = false, all = false;
    const char *regex = NULL;
    int opt;
    while ((opt = getopt_long(argc, argv, "+:fh", opts, NULL)) != -1) {
        if (opt == 'f') {
            force = true;
        } else if (opt == 'r') {
            regex = optarg;
        } else if (opt == 'a') {
            all = true;
        } else if (opt == 'h') {
            fputs(global_usage, stdout);
            return CLI_OK;
        } else {
            return option_error(cmd, opt, argc, argv);
        }
    }
    if (regex != NULL || all) {
        if (optind < argc || (regex != NULL && all))
            return usage_error(cmd, "rm takes KEYs, --regex RE or --all, not several");
        if (regex != NULL && regex[0] == '\0')
            return usage_error(cmd, "--regex needs a non-empty pattern (--all removes all)");
        kvp_client_t *client;
        if (client_open(cli, NULL, &client) != KVP_OK)
            return CLI_FAIL;
        uint64_t removed = 0;
        /* one request the master carries out: only the elapsed time to show, on request */
        kvp_progress_t *prog = progress_wanted(cli, false)
                                   ? kvp_progress_start(all ? "rm --all" : "rm --regex", 0, false,
                                                        "objects", KVP_PROGRESS_AUTO, 0)
                                   : NULL;
        kvp_status_t st = all ? kvp_remove_all(client, force, &removed)
                              : kvp_remove_by_regex(client, regex, force, &removed);
        kvp_progress_set(prog, removed);
        kvp_progress_end(prog, st == KVP_OK ? "done" : "failed");
        kvp_client_destroy(client);
        if (st != KVP_OK)
            return fail(kvp_strerror(st), "rm %s%s", all ? "--all" : "--regex ", all ? "" : regex);
        printf("removed %" PRIu64 " objects\n", removed);
        return CLI_OK;
    }
    if (optind >= argc)
        return usage_error(cmd, "%s needs at least one KEY", cmd->name);
    const char *const *keys = (const char *const *)argv + optind;
    size_t n = (size_t)(argc - optind);
    kvp_status_t *results = malloc(n * sizeof(*results));
    if (results == NULL)
        return fail(strerror(ENOMEM), "rm");
    kvp_client_t *client;
    if (client_open(cli, NULL, &client) != KVP_OK) {
        free(results);
        return CLI_FAIL;
    }
    kvp_progress_t *prog = NULL;
    size_t step = KVP_MAX_BATCH;
    if (progress_wanted(cli, n >= KVP_CLI_PROGRESS_KEYS)) {
        prog = kvp_progress_start("rm", n, false, "keys", KVP_PROGRESS_AUTO, 0);
        step = KVP_CLI_RM_STEP; /* smaller batches, so the progress moves */
    }
    for (size_t off = 0; off < n; off += step) {
        size_t cnt = KVP_MIN(n - off, step);
        kvp_progress_set(prog, off);
        for (size_t i = 0; i < cnt; i++)
            results[off + i] = (kvp_status_t)1; /* not a status: unwritten */
        kvp_status_t status = force ? kvp_batch_remove_force(client, keys + off, cnt, results + off)
                                    : kvp_batch_remove(client, keys + off, cnt, results + off);
        for (size_t i = 0; i < cnt; i++)
            if ((int)results[off + i] == 1)
                results[off + i] = status;
    }
    kvp_progress_set(prog, n);
    kvp_progress_end(prog, "done");
    kvp_client_destroy(client);
    int rc = CLI_OK;
    for (size_t i = 0; i < n; i++) {
        if (results[i] != KVP_OK) {
            fprintf(stderr, "%s\t%s\n", keys[i], kvp_strerror(results[i]));
            rc = CLI_FAIL;
        }
    }
    free(results);
    return rc;
}

/* A bounded char array from the library as a JSON string. */
static void json_string(const char *s, size_t cap)
{
    putchar('"');
    for (size_t i = 0; i < cap && s[i] != '\0'; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

/* ---- ls ----------------------------------------------------------------- */

static int cmd_ls(const cli_t *cli, const command_t *cmd, int argc, char **argv)
{
    static const struct option opts[] = {
        {"limit", required_argument, NULL, 'l'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    uint64_t limit = 1000;
    bool json = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        if (opt == 'l') {
            if (!parse_uint(optarg, 10000000, &limit) || limit == 0)
                return usage_error(cmd, "--limit needs a count 1..10000000, got '%s'", optarg);
        } else if (opt == 'j') {
            json = true;
        } else if (opt == 'h') {
            fputs(global_usage, stdout);
            return CLI_OK;
        } else {
            return option_error(cmd, opt, argc, argv);
        }
    }
    if (argc - optind > 1)
        return usage_error(cmd, "ls takes at most one PATTERN");
    const char *pattern = optind < argc ? argv[optind] : "";
    kvp_client_t *client;
    if (client_open(cli, NULL, &client) != KVP_OK)
        return CLI_FAIL;
    kvp_key_info_t *keys = NULL;
    size_t n = 0;
    kvp_status_t st = kvp_list_keys(client, pattern, (size_t)limit + 1, &keys, &n);
    kvp_pool_stat_t *ps = NULL; /* each replica's medium, from its segment */
    if (st == KVP_OK && kvp_pool_stat(client, &ps) != KVP_OK)
        ps = NULL;
    kvp_client_destroy(client);
    if (st != KVP_OK)
        return fail(kvp_strerror(st), "ls %s", pattern);
    bool more = n > limit;
    if (more)
        n = (size_t)limit;
    char a[32];
    if (json)
        fputs("[", stdout);
    else if (n > 0)
        printf("%-10s  %8s  %-8s  %-5s  %8s  %s\n", "SIZE", "REPLICAS", "MEDIUM", "PIN", "LEASE",
               "KEY");
    for (size_t i = 0; i < n; i++) {
        const kvp_key_info_t *k = &keys[i];
        const char *pin = k->pin == KVP_PIN_HARD ? "hard" : k->pin == KVP_PIN_SOFT ? "soft" : "-";
        /* each replica's medium, as "dram", "ssd" or "dram+ssd" */
        bool on[2] = {false, false};
        for (uint32_t r = 0; r < k->n_replicas && r < 8; r++)
            for (size_t g = 0; ps != NULL && g < ps->n_segments; g++)
                if (ps->segments[g].id == k->segment_ids[r])
                    on[strcmp(ps->segments[g].medium, "ssd") == 0] = true;
        const char *medium = on[0] && on[1] ? "dram+ssd" : on[1] ? "ssd" : on[0] ? "dram" : "-";
        if (json) {
            printf("%s{\"key\":", i > 0 ? "," : "");
            json_string(k->key, strlen(k->key));
            printf(",\"size\":%" PRIu64 ",\"replicas\":%u,\"medium\":\"%s\",\"complete\":%s,"
                   "\"lease_ms\":%u,\"pin\":\"%s\"}",
                   k->size, k->n_replicas, medium, k->complete ? "true" : "false", k->lease_ms,
                   pin);
        } else {
            char lease[32] = "-";
            if (!k->complete)
                snprintf(lease, sizeof(lease), "writing");
            else if (k->lease_ms > 0)
                snprintf(lease, sizeof(lease), "%.1fs", k->lease_ms / 1000.0);
            printf("%-10s  %8u  %-8s  %-5s  %8s  %s\n", human_size(k->size, a, sizeof(a)),
                   k->n_replicas, medium, pin, lease, k->key);
        }
    }
    if (json)
        fputs("]\n", stdout);
    if (more)
        fprintf(stderr, "kvpool: ls: showing the first %" PRIu64 " keys; more match (--limit)\n",
                limit);
    kvp_key_list_free(keys, more ? n + 1 : n);
    if (ps != NULL)
        kvp_pool_stat_free(ps);
    if (fflush(stdout) != 0)
        return fail(strerror(errno), "writing stdout");
    return CLI_OK;
}

/* ---- drain -------------------------------------------------------------- */

static int cmd_drain(const cli_t *cli, const command_t *cmd, int argc, char **argv)
{
    static const struct option opts[] = {
        {"wait", required_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    double wait_s = 60;
    int opt;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        if (opt == 'w') {
            if (!parse_seconds(optarg, &wait_s))
                return usage_error(cmd, "--wait needs seconds (0..86400), got '%s'", optarg);
        } else if (opt == 'h') {
            fputs(global_usage, stdout);
            return CLI_OK;
        } else {
            return option_error(cmd, opt, argc, argv);
        }
    }
    if (argc - optind != 1)
        return usage_error(cmd, "drain needs one SEGMENT name (see kvpool stat)");
    const char *name = argv[optind];
    kvp_client_t *client;
    if (client_open(cli, NULL, &client) != KVP_OK)
        return CLI_FAIL;
    /* what it holds before the drain begins: the progress's total */
    uint64_t left = 0, first = UINT64_MAX;
    kvp_pool_stat_t *ps0 = NULL;
    if (kvp_pool_stat(client, &ps0) == KVP_OK) {
        for (size_t i = 0; i < ps0->n_segments; i++)
            if (strcmp(ps0->segments[i].name, name) == 0)
                first = ps0->segments[i].objects;
        kvp_pool_stat_free(ps0);
    }
    uint64_t t0 = kvp_now_ms();
    kvp_status_t st = kvp_request_drain(client, name);
    if (st != KVP_OK) {
        kvp_client_destroy(client);
        return fail(kvp_strerror(st), "drain %s", name);
    }
    /* the owner drains and unmounts; watch for the segment to go */
    int rc = CLI_FAIL;
    kvp_progress_t *prog = NULL;
    if (progress_wanted(cli, wait_s > 0)) {
        char what[300];
        snprintf(what, sizeof(what), "drain %.*s", 256, name);
        prog = kvp_progress_start(what, first == UINT64_MAX ? 0 : first, false, "replicas",
                                  KVP_PROGRESS_AUTO, 0);
    }
    for (;;) {
        kvp_pool_stat_t *ps = NULL;
        st = kvp_pool_stat(client, &ps);
        if (st != KVP_OK) {
            kvp_progress_end(prog, "failed");
            prog = NULL;
            fail(kvp_strerror(st), "drain %s: stat", name);
            break;
        }
        bool present = false;
        for (size_t i = 0; i < ps->n_segments; i++)
            if (strcmp(ps->segments[i].name, name) == 0) {
                present = true;
                left = ps->segments[i].objects;
            }
        kvp_pool_stat_free(ps);
        if (present && first == UINT64_MAX) {
            first = left; /* what it held when the drain began */
            kvp_progress_set_total(prog, first);
        }
        if (first != UINT64_MAX)
            kvp_progress_set(prog, present ? first - KVP_MIN(left, first) : first);
        double dt = (double)(kvp_now_ms() - t0) / 1000.0;
        if (!present) {
            kvp_progress_end(prog, "unmounted");
            prog = NULL;
            printf("segment %s drained and unmounted in %.1f s\n", name, dt);
            rc = CLI_OK;
            break;
        }
        if (dt >= wait_s && wait_s == 0) {
            printf("drain of %s requested\n", name);
            rc = CLI_OK;
            break;
        }
        if (dt >= wait_s) {
            kvp_progress_end(prog, "still mounted");
            prog = NULL;
            fprintf(stderr,
                    "kvpool: drain %s: still mounted after %.1f s (%" PRIu64
                    " replicas left); the owner keeps draining\n",
                    name, dt, left);
            break;
        }
        usleep(100 * 1000);
    }
    kvp_progress_end(prog, rc == CLI_OK ? "requested" : "still mounted");
    kvp_client_destroy(client);
    return rc;
}

/* ---- stat --------------------------------------------------------------- */

static void stat_print_json(const kvp_pool_stat_t *st)
{
    printf("{\"capacity\":%" PRIu64 ",\"used\":%" PRIu64 ",\"objects\":%" PRIu64
           ",\"pending\":%" PRIu64 ",\"evicted_objects\":%" PRIu64 ",\"evicted_bytes\":%" PRIu64
           ",\"put_timeouts\":%" PRIu64 ",\"moved_objects\":%" PRIu64
           ",\"reading_objects\":%" PRIu64 ",\"reading_bytes\":%" PRIu64
           ",\"leases_released\":%" PRIu64 ",\"leases_expired\":%" PRIu64,
           st->capacity, st->used, st->objects, st->pending, st->evicted_objects, st->evicted_bytes,
           st->put_timeouts, st->moved_objects, st->reading_objects, st->reading_bytes,
           st->leases_released, st->leases_expired);
    printf(",\"dram_capacity\":%" PRIu64 ",\"dram_used\":%" PRIu64 ",\"ssd_capacity\":%" PRIu64
           ",\"ssd_used\":%" PRIu64 ",\"offloaded_objects\":%" PRIu64
           ",\"offload_dropped\":%" PRIu64 ",\"offload_failed\":%" PRIu64
           ",\"offloading_objects\":%" PRIu64 ",\"promoted_objects\":%" PRIu64
           ",\"hits_dram\":%" PRIu64 ",\"hits_ssd\":%" PRIu64 ",\"ssd_evicted_objects\":%" PRIu64
           ",\"adopted_objects\":%" PRIu64 ",\"ssd_lost_objects\":%" PRIu64
           ",\"adopt_refused\":%" PRIu64,
           st->capacity - st->ssd_capacity, st->used - st->ssd_used, st->ssd_capacity, st->ssd_used,
           st->offloaded_objects, st->offload_dropped, st->offload_failed, st->offloading_objects,
           st->promoted_objects, st->hits_dram, st->hits_ssd, st->ssd_evicted_objects,
           st->adopted_objects, st->ssd_lost_objects, st->adopt_refused);
    fputs(",\"leader\":", stdout);
    json_string(st->leader, sizeof(st->leader));
    printf(",\"epoch\":%" PRIu64 ",\"standbys\":", st->epoch);
    json_string(st->standbys, sizeof(st->standbys));
    fputs(",\"segments\":[", stdout);
    for (size_t i = 0; i < st->n_segments; i++) {
        const kvp_segment_info_t *s = &st->segments[i];
        printf("%s{\"id\":%" PRIu64 ",\"name\":", i > 0 ? "," : "", s->id);
        json_string(s->name, sizeof(s->name));
        fputs(",\"medium\":", stdout);
        json_string(s->medium, sizeof(s->medium));
        fputs(",\"endpoint\":", stdout);
        json_string(s->endpoint, sizeof(s->endpoint));
        printf(",\"size\":%" PRIu64 ",\"used\":%" PRIu64 ",\"objects\":%" PRIu64
               ",\"draining\":%s}",
               s->size, s->used, s->objects, s->draining ? "true" : "false");
    }
    fputs("]}\n", stdout);
}

static void stat_print_table(const kvp_pool_stat_t *st)
{
    char a[32], b[32];
    double pct = st->capacity > 0 ? 100.0 * (double)st->used / (double)st->capacity : 0.0;
    if (st->leader[0] != '\0') {
        printf("leader    %s (epoch %" PRIu64 ")\n", st->leader, st->epoch);
        printf("standbys  %s\n", st->standbys[0] ? st->standbys : "none");
    }
    printf("capacity  %s\n", human_size(st->capacity, a, sizeof(a)));
    printf("used      %s (%.1f%%)\n", human_size(st->used, a, sizeof(a)), pct);
    printf("objects   %" PRIu64 "\n", st->objects);
    printf("pending   %" PRIu64 "\n", st->pending);
    printf("reading   %" PRIu64 " objects, %s (leases released %" PRIu64 ", expired %" PRIu64 ")\n",
           st->reading_objects, human_size(st->reading_bytes, a, sizeof(a)), st->leases_released,
           st->leases_expired);
    if (st->adopted_objects > 0 || st->adopt_refused > 0)
        printf("adopted   %" PRIu64 " objects brought back by segments at their mount, %" PRIu64
               " stale entries refused\n",
               st->adopted_objects, st->adopt_refused);
    if (st->ssd_capacity > 0) {
        uint64_t dc = st->capacity - st->ssd_capacity, du = st->used - st->ssd_used;
        printf("dram      %s of %s (%.1f%%)\n", human_size(du, a, sizeof(a)),
               human_size(dc, b, sizeof(b)), dc > 0 ? 100.0 * (double)du / (double)dc : 0.0);
        printf("ssd       %s of %s (%.1f%%)\n", human_size(st->ssd_used, a, sizeof(a)),
               human_size(st->ssd_capacity, b, sizeof(b)),
               st->ssd_capacity > 0 ? 100.0 * (double)st->ssd_used / (double)st->ssd_capacity
                                    : 0.0);
        printf("hits      dram %" PRIu64 ", ssd %" PRIu64 "\n", st->hits_dram, st->hits_ssd);
        printf("tiering   offloaded %" PRIu64 " (in flight %" PRIu64 ", failed %" PRIu64
               ", dropped for lack of SSD room %" PRIu64 "), promoted %" PRIu64
               ", evicted from SSD %" PRIu64 ", lost %" PRIu64 "\n",
               st->offloaded_objects, st->offloading_objects, st->offload_failed,
               st->offload_dropped, st->promoted_objects, st->ssd_evicted_objects,
               st->ssd_lost_objects);
    }
    printf("segments  %zu\n", st->n_segments);
    if (st->n_segments == 0)
        return;
    int wname = 4, wmed = 6, wend = 8;
    for (size_t i = 0; i < st->n_segments; i++) {
        const kvp_segment_info_t *s = &st->segments[i];
        wname = KVP_MAX(wname, (int)strnlen(s->name, sizeof(s->name)));
        wmed = KVP_MAX(wmed, (int)strnlen(s->medium, sizeof(s->medium)));
        wend = KVP_MAX(wend, (int)strnlen(s->endpoint, sizeof(s->endpoint)));
    }
    printf("\n%-*s  %-*s  %-*s  %10s  %10s  %s\n", wname, "NAME", wmed, "MEDIUM", wend, "ENDPOINT",
           "SIZE", "USED", "OBJECTS");
    for (size_t i = 0; i < st->n_segments; i++) {
        const kvp_segment_info_t *s = &st->segments[i];
        printf("%-*.*s  %-*.*s  %-*.*s  %10s  %10s  %" PRIu64 "%s\n", wname, wname, s->name, wmed,
               wmed, s->medium, wend, wend, s->endpoint, human_size(s->size, a, sizeof(a)),
               human_size(s->used, b, sizeof(b)), s->objects, s->draining ? "  (draining)" : "");
    }
}

/* Wait `secs` for one of `mask`'s signals (blocked in every thread); true: one came. */
static bool watch_wait(const sigset_t *mask, double secs)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)(secs * 1000);
    for (;;) {
        uint64_t now = kvp_now_ms();
        if (now >= deadline)
            return false;
        uint64_t left = deadline - now;
        struct timespec ts = {.tv_sec = (time_t)(left / 1000),
                              .tv_nsec = (long)(left % 1000) * 1000000};
        if (sigtimedwait(mask, NULL, &ts) > 0)
            return true;
        if (errno != EINTR && errno != EAGAIN)
            return false;
    }
}

static int cmd_stat(const cli_t *cli, const command_t *cmd, int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"watch", optional_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool json = false, watch = false;
    double every = 1.0;
    int opt;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'j':
            json = true;
            break;
        case 'w':
            watch = true;
            /* --watch=N, or --watch N when the next word is a number */
            if (optarg == NULL && optind < argc && parse_seconds(argv[optind], &every))
                optarg = argv[optind++];
            if (optarg != NULL && (!parse_seconds(optarg, &every) || every < 0.1))
                return usage_error(cmd, "--watch needs seconds (0.1..86400), got '%s'", optarg);
            break;
        case 'h':
            fputs(global_usage, stdout);
            return CLI_OK;
        default:
            return option_error(cmd, opt, argc, argv);
        }
    }
    if (optind < argc)
        return usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    /* --watch: SIGINT/SIGTERM blocked before the client's threads exist (they inherit
     * the mask), taken by the main thread between draws, as serve does */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    if (watch) {
        int err = pthread_sigmask(SIG_BLOCK, &mask, NULL);
        if (err != 0)
            return fail(strerror(err), "cannot block SIGINT/SIGTERM");
    }
    kvp_client_t *client;
    if (client_open(cli, NULL, &client) != KVP_OK)
        return CLI_FAIL;
    /* --watch on a terminal redraws in place; elsewhere (a pipe, a log) one block after
     * another, each under a timestamp line (JSON: one object per line) */
    bool redraw = watch && !json && isatty(STDOUT_FILENO);
    int rc = CLI_OK;
    for (unsigned round = 0;; round++) {
        kvp_pool_stat_t *st = NULL;
        kvp_status_t status = kvp_pool_stat(client, &st);
        if (status != KVP_OK) {
            rc = fail(kvp_strerror(status), "stat");
            break;
        }
        if (watch && !json) {
            char when[64];
            time_t now = time(NULL);
            struct tm tm;
            strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tm));
            if (redraw)
                fputs("\033[H\033[2J", stdout);
            else if (round > 0)
                putchar('\n');
            printf("--- %s, every %.1f s (Ctrl-C to stop)\n", when, every);
        }
        if (json)
            stat_print_json(st);
        else
            stat_print_table(st);
        kvp_pool_stat_free(st);
        if (fflush(stdout) != 0) {
            rc = fail(strerror(errno), "writing stdout");
            break;
        }
        if (!watch || watch_wait(&mask, every))
            break;
    }
    kvp_client_destroy(client);
    return rc;
}

/* ---- main --------------------------------------------------------------- */

static const command_t commands[] = {
    {"serve",
     "--segment-size SIZE [--data-host HOST] [--data-port PORT] [--name NAME] "
     "[--ready-fd N] [--drain-timeout SECONDS] [--ssd-path PATH --ssd-size SIZE] "
     "[--http-listen HOST:PORT] [--config FILE]",
     cmd_serve},
    {"put", "[--replicas N] [--prefer SEGMENT] [--upsert] KEY FILE|-", cmd_put},
    {"get", "KEY [FILE|-]", cmd_get},
    {"exist", "KEY...", cmd_exist},
    {"rm", "[--force] KEY... | [--force] --regex RE | [--force] --all", cmd_rm},
    {"ls", "[--limit N] [--json] [RE]", cmd_ls},
    {"drain", "[--wait SECONDS] SEGMENT", cmd_drain},
    {"stat", "[--json] [--watch [SECONDS]]", cmd_stat},
};

/*
 * Apply global option `opt` (an OPT_* code) with argument `arg` to *cli. Returns -1 when
 * done, or the usage error's exit code (reported). `cmd`: the command whose argv carried
 * it (serve's config file), NULL before the command.
 */
static int global_option(cli_t *cli, const command_t *cmd, int opt, const char *arg)
{
    uint64_t v;
    switch (opt) {
    case OPT_MASTER:
        cli->master = arg;
        break;
    case OPT_TRANSPORT:
        if (strcmp(arg, "auto") != 0 && strcmp(arg, "tcp") != 0 && strcmp(arg, "shm") != 0 &&
            strcmp(arg, "rdma") != 0)
            return usage_error(cmd, "--transport must be auto, tcp, shm or rdma, got '%s'", arg);
        cli->transport = arg;
        break;
    case OPT_RDMA_DEVICE:
        cli->rdma_devices = arg;
        break;
    case OPT_RDMA_HOST:
        cli->rdma_host = arg;
        break;
    case OPT_TIMEOUT:
        if (!parse_uint(arg, UINT32_MAX, &v) || v == 0)
            return usage_error(cmd, "--timeout-ms needs milliseconds >= 1, got '%s'", arg);
        cli->timeout_ms = (uint32_t)v;
        break;
    case OPT_PROGRESS:
        cli->progress = PROGRESS_ALWAYS;
        break;
    case OPT_NO_PROGRESS:
        cli->progress = PROGRESS_NEVER;
        break;
    default:
        return CLI_USAGE; /* not a global option: never asked */
    }
    return -1;
}

/* The master address must be HOST:PORT or an etcd:// URL; -1 or the usage error's code. */
static int check_master(const cli_t *cli, const command_t *cmd, const char *from)
{
    char host[256];
    uint16_t port;
    if (strncmp(cli->master, "etcd://", 7) != 0 && /* the leader, found in etcd */
        kvp_parse_hostport(cli->master, host, sizeof(host), &port) != KVP_OK)
        return usage_error(cmd, "%s needs HOST:PORT or etcd://HOST:PORT[,...]/CLUSTER, got '%s'",
                           from, cli->master);
    return -1;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        GLOBAL_OPTIONS,
        {"progress", no_argument, NULL, OPT_PROGRESS},
        {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    cli_t cli = {0};
    const char *master_from = "--master";
    int opt;

    /* A closed stdout or ready pipe must be an error we report, not a silent death. */
    signal(SIGPIPE, SIG_IGN);
    /* the library is silent by default; a CLI user wants its warnings (e.g. the master's
     * account of what holds a full pool) next to the error ($KVPOOL_LOG_LEVEL overrides) */
    if (getenv("KVPOOL_LOG_LEVEL") == NULL)
        kvp_log_set_level(KVP_LOG_WARN);
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            fputs(global_usage, stdout);
            return CLI_OK;
        case OPT_VERSION:
            printf("kvpool " KVP_CLI_VERSION "\n");
            return CLI_OK;
        case '?':
        case ':':
            return option_error(NULL, opt, argc, argv);
        default: {
            int rc = global_option(&cli, NULL, opt, optarg);
            if (rc >= 0)
                return rc;
            cli.given |= 1u << (opt - OPT_MASTER);
            break;
        }
        }
    }
    if (cli.master == NULL) {
        const char *env = getenv("KVPOOL_MASTER");
        master_from = "$KVPOOL_MASTER";
        cli.master = env != NULL && env[0] != '\0' ? env : KVP_CLI_DEFAULT_MASTER;
    }
    int bad = check_master(&cli, NULL, master_from);
    if (bad >= 0)
        return bad;

    if (optind >= argc)
        return usage_error(NULL, "no command given");
    const char *name = argv[optind];
    for (size_t i = 0; i < KVP_ARRAY_SIZE(commands); i++) {
        if (strcmp(name, commands[i].name) == 0) {
            int cargc = argc - optind;
            char **cargv = argv + optind;
            optind = 0; /* glibc: re-initialise getopt for the command's argv */
            return commands[i].run(&cli, &commands[i], cargc, cargv);
        }
    }
    if (strcmp(name, "help") == 0) {
        fputs(global_usage, stdout);
        return CLI_OK;
    }
    return usage_error(NULL, "unknown command '%s'", name);
}
