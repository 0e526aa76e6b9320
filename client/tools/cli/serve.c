/*
 * serve.c - `kvpool serve`: the segment owner. Mount a DRAM segment (and/or an SSD one)
 * into the pool, serve it until SIGINT or SIGTERM, then drain it (move its objects to
 * other segments) and unmount; optionally serve /metrics and /health over HTTP.
 *
 * Design: the flags may come from an INI file too (--config, common/conf.h): the file is
 * expanded into argv first, and a global option in it (or after `serve`) yields to the
 * same option given before `serve`. The steps: parse and check every input; block SIGINT
 * and SIGTERM before kvp_client_create, so every library thread inherits the mask and
 * only the main thread takes them, in sigtimedwait(); create the client (which mounts
 * the segments) and the HTTP server; announce (stdout, then one write to --ready-fd);
 * wait for a signal, or for the segment to be drained on request (kvpool drain), which
 * ends serve at once; drain; stop HTTP, then destroy the client, which unmounts.
 *
 * Thread: the main thread runs every step; serve_http_handler runs on libmicrohttpd's
 * threads and reads only the client (its metrics snapshot) and the atomic `leaving`; HTTP
 * stops before the client is destroyed.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/tools/cli/cli.h"
#include "common/clock.h"
#include "common/conf.h"
#include "common/http.h"
#include "common/macros.h"
#include "common/parse.h"

/* What serve's HTTP handler reads (on libmicrohttpd's threads). */
typedef struct serve_http {
    kvp_client_t *client;
    bool dram;            /* a DRAM segment was asked for: health follows it */
    _Atomic bool leaving; /* a signal came: draining and going away */
} serve_http_t;

/* One serve: its inputs, then what it started. Lives on serve_run's stack. */
typedef struct serve {
    kvp_cli_t cli; /* the global options; the config file's under the command line's */
    kvp_client_params_t params;
    int ready_fd;            /* -1: none */
    double drain_s;          /* drain timeout; 0: no drain */
    bool dram_given;         /* --segment-size was given (0 included) */
    const char *http_listen; /* NULL: no HTTP */
    sigset_t mask;           /* SIGINT, SIGTERM: blocked */
    kvp_client_t *client;
    kvp_http_t *http;
    serve_http_t hs;
    char http_addr[300]; /* "HOST:PORT" the HTTP server listens on */
    const char *name;    /* the segment's name, for the messages */
} serve_t;

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

/* One of serve's own options, or a global one (from the config file or after `serve`);
 * -1, or the usage error's exit code. */
static int serve_option(serve_t *s, const kvp_cli_t *gcli, const kvp_cli_command_t *cmd, int opt)
{
    uint64_t v;
    switch (opt) {
    case 's':
        if (!kvp_parse_size(optarg, &s->params.segment_size))
            return kvp_cli_usage_error(cmd, "--segment-size needs a size such as 64MiB, got '%s'",
                                       optarg);
        s->dram_given = true;
        break;
    case 'S':
        s->params.ssd_path = optarg;
        break;
    case 'F':
        s->params.segment_file = optarg;
        break;
    case 'O':
        if (!kvp_parse_size(optarg, &s->params.segment_file_offset))
            return kvp_cli_usage_error(cmd,
                                       "--segment-file-offset needs a size such as 4KiB, got "
                                       "'%s'",
                                       optarg);
        break;
    case 'Z':
        if (!kvp_parse_size(optarg, &s->params.ssd_size) || s->params.ssd_size < (1u << 20))
            return kvp_cli_usage_error(cmd, "--ssd-size needs a size of at least 1MiB, got '%s'",
                                       optarg);
        break;
    case 'B':
        s->params.ssd_buffered_io = 1;
        break;
    case 'H':
        s->params.data_host = optarg;
        break;
    case 'A':
        if (strcmp(optarg, "protected") != 0 && strcmp(optarg, "none") != 0)
            return kvp_cli_usage_error(cmd, "--auth needs protected or none, got '%s'", optarg);
        s->params.auth = optarg;
        break;
    case 'p':
        if (!kvp_cli_parse_uint(optarg, UINT16_MAX, &v))
            return kvp_cli_usage_error(cmd, "--data-port needs a port 0..65535, got '%s'", optarg);
        s->params.data_port = (uint16_t)v;
        break;
    case 'n':
        s->params.segment_name = optarg;
        break;
    case 'T':
        if (optarg[0] == '\0' || strlen(optarg) > 63)
            return kvp_cli_usage_error(cmd, "--tenant needs a tenant's name of 1..63 bytes");
        s->params.segment_tenant = optarg;
        break;
    case 'r':
        if (!kvp_cli_parse_uint(optarg, INT_MAX, &v))
            return kvp_cli_usage_error(cmd, "--ready-fd needs a file descriptor, got '%s'", optarg);
        s->ready_fd = (int)v;
        break;
    case 'd':
        if (!kvp_cli_parse_seconds(optarg, &s->drain_s))
            return kvp_cli_usage_error(cmd, "--drain-timeout needs seconds (0..86400), got '%s'",
                                       optarg);
        break;
    case 'W':
        /* read by the rdma transport when it serves the segment (client/transport/rdma.c) */
        if (strcmp(optarg, "on") != 0 && strcmp(optarg, "unbounded") != 0 &&
            strcmp(optarg, "off") != 0)
            return kvp_cli_usage_error(cmd,
                                       "--rdma-windows must be on, unbounded or off, got "
                                       "'%s'",
                                       optarg);
        if (strcmp(optarg, "off") == 0)
            unsetenv("KVPOOL_RDMA_WINDOWS");
        else
            setenv("KVPOOL_RDMA_WINDOWS", strcmp(optarg, "on") == 0 ? "1" : optarg, 1);
        break;
    case 'L': {
        char host[256];
        uint16_t port;
        if (kvp_parse_hostport(optarg, host, sizeof(host), &port) != KVP_OK)
            return kvp_cli_usage_error(cmd, "--http-listen needs HOST:PORT (port 0: any), got '%s'",
                                       optarg);
        s->http_listen = optarg;
        break;
    }
    default:
        /* a global option in the config file (or after `serve`): the command line's
         * own, given before `serve`, wins */
        if (gcli->given & (1u << (opt - KVP_CLI_OPT_MASTER)))
            break;
        return kvp_cli_global_option(&s->cli, cmd, opt, optarg);
    }
    return -1;
}

/* serve's argv (config file expanded) into *s, every input checked; -1, or the exit code
 * when serve must stop now. */
static int serve_parse(serve_t *s, const kvp_cli_t *gcli, const kvp_cli_command_t *cmd,
                       const struct option *opts, int argc, char **argv)
{
    int opt;
    optind = 0;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        int rc = opt == 'h' || opt == '?' || opt == ':' ? kvp_cli_option_other(cmd, opt, argc, argv)
                                                        : serve_option(s, gcli, cmd, opt);
        if (rc >= 0)
            return rc;
    }
    if (optind < argc)
        return kvp_cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (s->cli.master != gcli->master) {
        int bad = kvp_cli_check_master(&s->cli, cmd, "master");
        if (bad >= 0)
            return bad;
    }
    const kvp_client_params_t *p = &s->params;
    if (!s->dram_given && p->ssd_path == NULL)
        return kvp_cli_usage_error(cmd, "serve needs --segment-size (and/or --ssd-path)");
    if (p->segment_size == 0 && p->ssd_path == NULL)
        return kvp_cli_usage_error(cmd, "--segment-size 0 needs an SSD segment (--ssd-path)");
    if (p->segment_file == NULL && p->segment_file_offset != 0)
        return kvp_cli_usage_error(cmd, "--segment-file-offset needs --segment-file");
    if (p->segment_file != NULL && p->segment_size == 0)
        return kvp_cli_usage_error(cmd, "--segment-file needs --segment-size (the bytes of it to "
                                        "serve)");
    if ((p->ssd_path == NULL) != (p->ssd_size == 0))
        return kvp_cli_usage_error(cmd, "--ssd-path and --ssd-size go together");
    if (s->ready_fd >= 0 && fcntl(s->ready_fd, F_GETFD) < 0)
        return kvp_cli_usage_error(cmd, "--ready-fd %d is not an open file descriptor",
                                   s->ready_fd);
    return -1;
}

/* Block the signals, create the client (mounting the segments), start HTTP; -1, or the
 * failure's exit code (reported, nothing left running). */
static int serve_start(serve_t *s)
{
    /* Before any library thread exists: they all inherit the blocked mask. */
    int rc = kvp_cli_stop_signals(&s->mask, true);
    if (rc >= 0)
        return rc;
    s->params.drain_timeout_ms = s->drain_s > 0 ? (uint32_t)(s->drain_s * 1000) : 30000;
    if (kvp_cli_client_open(&s->cli, &s->params, &s->client) != KVP_OK)
        return KVP_CLI_FAIL;
    s->hs.client = s->client;
    s->hs.dram = s->params.segment_size > 0;
    atomic_init(&s->hs.leaving, false);
    if (s->http_listen == NULL)
        return -1;
    uint16_t port = 0;
    kvp_status_t hst = kvp_http_start(s->http_listen, serve_http_handler, &s->hs, &s->http, &port);
    if (hst != KVP_OK) {
        kvp_client_destroy(s->client);
        return kvp_cli_fail(kvp_cli_why(hst), "--http-listen %s", s->http_listen);
    }
    char host[256];
    kvp_parse_hostport(s->http_listen, host, sizeof(host), &(uint16_t){0});
    snprintf(s->http_addr, sizeof(s->http_addr), "%s:%u", host, (unsigned)port);
    return -1;
}

/* What is served, on stdout; then one write to --ready-fd: the segment's name, then (with
 * --http-listen) "http HOST:PORT". Sets s->name. */
static void serve_announce(serve_t *s)
{
    const char *name = kvp_client_segment_name(s->client);
    const char *ssd_name = kvp_client_ssd_segment_name(s->client);
    if (name != NULL)
        printf("serving segment %s (%" PRIu64 " bytes) for master %s\n", name,
               s->params.segment_size, s->cli.master);
    if (ssd_name != NULL)
        printf("serving SSD segment %s (%" PRIu64 " bytes, file %s) for master %s\n", ssd_name,
               s->params.ssd_size, s->params.ssd_path, s->cli.master);
    if (s->http != NULL)
        printf("metrics on http://%s/metrics, health on http://%s/health\n", s->http_addr,
               s->http_addr);
    if (name == NULL)
        name = ssd_name != NULL ? ssd_name : "(unnamed)";
    s->name = name;
    fflush(stdout);
    if (s->ready_fd < 0)
        return;
    char line[1024];
    int n = s->http != NULL ? snprintf(line, sizeof(line), "%s\nhttp %s\n", name, s->http_addr)
                            : snprintf(line, sizeof(line), "%s\n", name);
    size_t len = n < 0 ? 0 : KVP_MIN((size_t)n, sizeof(line) - 1);
    if (!kvp_cli_write_all(s->ready_fd, line, len))
        fprintf(stderr, "kvpool: cannot write to --ready-fd %d: %s\n", s->ready_fd,
                strerror(errno));
    close(s->ready_fd);
}

/* Wait for a signal (KVP_CLI_OK) or sigtimedwait's failure (KVP_CLI_FAIL, reported); also
 * stop once the segment was drained on request (kvpool drain): *drained_p, KVP_CLI_OK. */
static int serve_wait(serve_t *s, bool *drained_p)
{
    *drained_p = false;
    for (;;) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
        int sig = sigtimedwait(&s->mask, NULL, &ts);
        if (sig > 0)
            return KVP_CLI_OK;
        if (errno != EAGAIN && errno != EINTR)
            return kvp_cli_fail(strerror(errno), "sigtimedwait");
        if (s->params.segment_size > 0 && !kvp_client_segment_mounted(s->client)) {
            printf("segment %s was drained on request: exiting\n", s->name);
            fflush(stdout);
            *drained_p = true;
            return KVP_CLI_OK;
        }
    }
}

/* Move the DRAM segment's objects elsewhere before going away (or let a drain that was
 * requested finish), and say how it went. */
static void serve_drain(serve_t *s)
{
    uint64_t moved = 0, lost = 0;
    uint64_t t0 = kvp_now_ms();
    kvp_status_t st = kvp_drain(s->client, (uint32_t)(s->drain_s * 1000), &moved, &lost);
    if (st == KVP_ERR_PENDING) {
        /* a requested drain is already running: let it finish */
        while (kvp_client_segment_mounted(s->client))
            usleep(50 * 1000);
        st = KVP_OK;
    }
    if (st != KVP_OK)
        fprintf(stderr, "kvpool: drain of %s: %s\n", s->name, kvp_cli_why(st));
    printf("segment %s drained in %.1f s: %" PRIu64 " objects moved, %" PRIu64 " left the pool\n",
           s->name, (double)(kvp_now_ms() - t0) / 1000.0, moved, lost);
    fflush(stdout);
}

/* serve's work once its argv (config file expanded) is known. */
static int serve_run(const kvp_cli_t *gcli, const kvp_cli_command_t *cmd, const struct option *opts,
                     int argc, char **argv)
{
    serve_t s = {.cli = *gcli, .ready_fd = -1, .drain_s = 30};
    kvp_client_params_init(&s.params);
    int rc = serve_parse(&s, gcli, cmd, opts, argc, argv);
    if (rc >= 0)
        return rc;
    rc = serve_start(&s);
    if (rc >= 0)
        return rc;
    serve_announce(&s);
    bool drained;
    rc = serve_wait(&s, &drained);
    if (!drained) {
        atomic_store(&s.hs.leaving, true);
        if (rc == KVP_CLI_OK && s.drain_s > 0 && kvp_client_segment_mounted(s.client))
            serve_drain(&s);
    }
    kvp_http_stop(s.http); /* its handler reads the client */
    kvp_client_destroy(s.client);
    return rc;
}

int kvp_cli_serve(const kvp_cli_t *cli, const kvp_cli_command_t *cmd, int argc, char **argv)
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
        {"auth", required_argument, NULL, 'A'},
        {"tenant", required_argument, NULL, 'T'},
        {"segment-file", required_argument, NULL, 'F'},
        {"segment-file-offset", required_argument, NULL, 'O'},
        {"rdma-windows", required_argument, NULL, 'W'},
        KVP_CLI_GLOBAL_OPTIONS,
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int cargc;
    char **cargv;
    char err[512] = "";
    kvp_status_t st =
        kvp_conf_expand_argv(argc, argv, opts, "serve", &cargc, &cargv, err, sizeof(err));
    if (st != KVP_OK)
        return kvp_cli_usage_error(cmd, "--config: %s", err[0] ? err : kvp_strerror(st));
    /* the options' arguments point into cargv: it lives until serve is over */
    int rc = serve_run(cli, cmd, opts, cargc, cargv);
    kvp_conf_free_argv(cargv, argv);
    return rc;
}
