/*
 * serve.c - `kvpool serve`: the segment owner. Mount a DRAM segment (and/or an SSD one)
 * into the pool, serve it until SIGINT or SIGTERM, then drain it (move its objects to
 * other segments) and unmount; optionally serve /metrics and /health over HTTP.
 *
 * Design: serve's options are the rows of serve_rows (common/options.h: name, type,
 * default, field of serve_t, help), from which its getopt entries, --help and
 * --options-markdown come. The flags may come from an INI file too (--config, common/conf.h): the
 * file is expanded into argv first, and a global option in it (or after `serve`) yields to the same
 * option given before `serve`. The steps: parse and check every input; block SIGINT and SIGTERM
 * before kvp_client_create, so every library thread inherits the mask and only the main thread
 * takes them, in sigtimedwait(); create the client (which mounts the segments) and the HTTP server;
 * announce (stdout, then one write to --ready-fd); wait for a signal, or for the segment to be
 * drained on request (kvpool drain), which ends serve at once; drain; stop HTTP, then destroy the
 * client, which unmounts.
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
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "client/segment/conn_server.h"
#include "client/tools/cli/cli.h"
#include "common/clock.h"
#include "common/conf.h"
#include "common/log.h"
#include "common/http.h"
#include "common/macros.h"
#include "common/options.h"
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
    kvp_conn_limits_t data_limits; /* the data servers' (client/segment/conn_server.h) */
    int ready_fd;                  /* -1: none */
    double drain_s;                /* drain timeout; 0: no drain */
    bool dram_given;               /* --segment-size was given (0 included) */
    const char *http_listen;       /* NULL: no HTTP */
    sigset_t mask;                 /* SIGINT, SIGTERM: blocked */
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
        kvp_http_metrics(req, "kvpool_serve_http", reply); /* the HTTP server's caps */
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

/* --rdma-windows: read by the rdma transport when it serves the segment, from the
 * environment the client reads at its creation (client/env.c). */
static kvp_status_t parse_rdma_windows(const kvp_opt_t *opt, const char *value, void *field,
                                       char *err, size_t err_len)
{
    (void)field;
    if (strcmp(value, "on") != 0 && strcmp(value, "unbounded") != 0 && strcmp(value, "off") != 0) {
        snprintf(err, err_len, "--%s must be on, unbounded or off, got '%s'", opt->name, value);
        return KVP_ERR_INVALID_ARG;
    }
    if (strcmp(value, "off") == 0)
        unsetenv("KVPOOL_RDMA_WINDOWS");
    else
        setenv("KVPOOL_RDMA_WINDOWS", strcmp(value, "on") == 0 ? "1" : value, 1);
    return KVP_OK;
}

#define F(field) KVP_OPT_FIELD(serve_t, field)
static const char *const auth_choices[] = {"protected", "none", NULL};

/* serve's own options, one row each (common/options.h); the global options (main.c) may
 * be given after `serve` and in its config file too. */
static const kvp_opt_t serve_rows[] = {
    KVP_OPT_GROUP("Segments", NULL),
    {.name = "segment-size",
     .type = KVP_OPT_SIZE,
     F(params.segment_size),
     .help = "mount a DRAM segment of SIZE (64MiB, 1g, 4096...) and serve it until SIGINT or "
             "SIGTERM, then drain it; needed unless --ssd-path is given (0: no DRAM "
             "segment)"},
    {.name = "data-host",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     .arg = "HOST",
     F(params.data_host),
     .def_doc = "the address that routes to the master",
     .help = "the address the data servers bind and advertise"},
    {.name = "data-port",
     .type = KVP_OPT_UINT,
     .arg = "PORT",
     F(params.data_port),
     .max = UINT16_MAX,
     .need = "a port 0..65535",
     .def = "0",
     .help = "the data server's port (0: any free port)"},
    {.name = "name",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     .arg = "NAME",
     F(params.segment_name),
     .def_doc = "generated",
     .help = "the segment's name"},
    {.name = "segment-file",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     .arg = "PATH",
     F(params.segment_file),
     .help = "the DRAM segment is SIZE bytes of the file PATH from --segment-file-offset "
             "(page-aligned), mapped shared (tmpfs, hugetlbfs); the file must be mode 0600"},
    {.name = "segment-file-offset",
     .type = KVP_OPT_SIZE,
     F(params.segment_file_offset),
     .def = "0",
     .need = "a size such as 4KiB",
     .help = "where in --segment-file the segment starts"},
    {.name = "ssd-path",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     .arg = "PATH",
     F(params.ssd_path),
     .help = "also an SSD segment, the file PATH (created and preallocated; mounted again, its "
             "objects come back)"},
    {.name = "ssd-size",
     .type = KVP_OPT_SIZE,
     F(params.ssd_size),
     .min = 1u << 20,
     .need = "a size of at least 1MiB",
     .help = "the SSD segment's size (with --ssd-path)"},
    {.name = "dfs-path",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     .arg = "DIR",
     F(params.dfs_path),
     .help = "a DFS directory every node sees (NFS, 3FS-FUSE): DFS replicas are read and "
             "written in its shard files directly; with --dfs-size also a DFS segment, a shard "
             "file there (kept across restarts)"},
    {.name = "dfs-size",
     .type = KVP_OPT_SIZE,
     F(params.dfs_size),
     .min = 1u << 20,
     .need = "a size of at least 1MiB",
     .help = "the DFS segment's size (with --dfs-path): its shard file's data area"},
    {.name = "ssd-buffered-io",
     .type = KVP_OPT_SET_TRUE,
     .def = "off",
     F(params.ssd_buffered_io),
     .help = "accept a filesystem without O_DIRECT (the page cache)"},
    {.name = "tenant",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR | KVP_OPT_F_NONEMPTY,
     .arg = "T",
     F(params.segment_tenant),
     .max = 63,
     .need = "a tenant's name of 1..63 bytes",
     .help = "dedicate the segments to tenant T (the ACL's): only its objects go there, and "
             "its go there first"},

    KVP_OPT_GROUP("Data servers",
                  "what peers may hold of the segments' data servers (tcp, and the Unix socket "
                  "of the shm hand-off): docs/security.md, \"Owner data servers\"; a flag left "
                  "out takes its KVPOOL_DATA_* variable, else the default"),
    {.name = "data-max-conns",
     .type = KVP_OPT_UINT,
     F(data_limits.max_conns),
     .def_doc = "10000",
     .min = 1,
     .max = 1000000,
     .help = "connections each data server takes at once (the shm socket 1024 at most), and at "
             "most a quarter of the descriptor limit (serve raises its soft limit to the hard "
             "one, and logs it); more are closed as they come, nothing read"},
    {.name = "data-max-conns-per-peer",
     .type = KVP_OPT_UINT,
     F(data_limits.max_per_peer),
     .def_doc = "4096",
     .min = 1,
     .max = 1000000,
     .help = "of them, from one address (on the shm socket: one uid, a quarter of its "
             "connections at most)"},
    {.name = "data-max-unauth",
     .type = KVP_OPT_UINT,
     F(data_limits.max_unauth),
     .def_doc = "4096",
     .min = 1,
     .max = 1000000,
     .help = "of them, not yet authenticated (no HELLO proven; without data grants, no request "
             "header yet): past it the oldest is closed for the new one"},
    {.name = "data-max-unauth-per-peer",
     .type = KVP_OPT_UINT,
     F(data_limits.max_unauth_per_peer),
     .def_doc = "a quarter of --data-max-unauth",
     .min = 1,
     .max = 1000000,
     .help = "of those, from one address (uid): past it the peer's new one is closed"},
    {.name = "data-handshake-timeout",
     .type = KVP_OPT_SECONDS_MS,
     F(data_limits.handshake_ms),
     .def_doc = "10",
     .min = 1,
     .max = 3600,
     .need = "seconds (1..3600)",
     .help = "close a connection not authenticated this long after it connected, bytes or "
             "not"},
    {.name = "data-frame-timeout",
     .type = KVP_OPT_SECONDS_MS,
     F(data_limits.frame_ms),
     .def_doc = "30",
     .min = 1,
     .max = 3600,
     .need = "seconds (1..3600)",
     .help = "close a connection whose request is not over this long after its first byte, "
             "plus a second per MiB the request moves"},

    KVP_OPT_GROUP("Process", NULL),
    {.name = "ready-fd",
     .type = KVP_OPT_INT,
     .arg = "N",
     F(ready_fd),
     .def = "-1",
     .def_doc = "none",
     .max = INT_MAX,
     .need = "a file descriptor",
     .help = "when serving, write the segment's name (then \"http HOST:PORT\" with "
             "--http-listen) to fd N and close it"},
    {.name = "drain-timeout",
     .type = KVP_OPT_SECONDS_F,
     F(drain_s),
     .def = "30",
     .max = 86400,
     .need = "seconds (0..86400)",
     .help = "on SIGINT or SIGTERM, move the segment's objects to other segments for at most "
             "this long before unmounting (0: no drain)"},
    {.name = "http-listen",
     .type = KVP_OPT_HOSTPORT,
     .flags = KVP_OPT_F_PTR,
     F(http_listen),
     .def_doc = "none",
     .need = "HOST:PORT (port 0: any)",
     .help = "serve /metrics (Prometheus) and /health (200 while the segment is mounted, else "
             "503)"},
    {.name = "config",
     .type = KVP_OPT_ACTION,
     .arg = "FILE",
     .help = "an INI file whose keys are these flags and the global ones without dashes "
             "([serve] section and keys before any section); flags on the command line "
             "override it"},
    {.name = "help", .short_flag = 'h', .type = KVP_OPT_ACTION, .help = "this text"},
    {.name = "options-markdown",
     .type = KVP_OPT_ACTION,
     .flags = KVP_OPT_F_HIDDEN,
     .help = "these options as Markdown tables (docs/options.md)"},

    KVP_OPT_GROUP("Security", NULL),
    {.name = "auth",
     .type = KVP_OPT_ENUM,
     .flags = KVP_OPT_F_PTR,
     F(params.auth),
     .choices = auth_choices,
     .def_doc = "protected",
     .env = "KVPOOL_AUTH",
     .need = "protected or none",
     .help = "protected: the data servers take peers of this host only; none: anyone who "
             "reaches the port (a trusted network)"},
    {.name = "rdma-windows",
     .type = KVP_OPT_CUSTOM,
     .arg = "on|unbounded|off",
     .parse = parse_rdma_windows,
     .def_doc = "off",
     .env = "KVPOOL_RDMA_WINDOWS",
     .help = "rdma peers reach the segment only through a memory window per granted extent, "
             "bound on their queue pair (data grants on; the variable's value for on is 1); "
             "refused on a device that does not keep an access inside its window (Soft-RoCE) "
             "unless unbounded"},
};

static kvp_opts_t serve_opts(serve_t *s)
{
    return (kvp_opts_t){.rows = serve_rows, .count = KVP_ARRAY_SIZE(serve_rows), .base = s};
}

/* serve --help, --options-markdown; KVP_CLI_OK. */
static int serve_action(const kvp_cli_command_t *cmd, const char *name)
{
    kvp_opts_t opts = serve_opts(NULL);
    if (strcmp(name, "help") == 0) {
        printf("usage: kvpool [GLOBAL OPTIONS] %s [OPTIONS]\n", cmd->name);
        kvp_opts_usage(&opts, 28, stdout);
        printf("The global options (kvpool --help) may follow `serve` and be keys of its "
               "config file too.\n");
    } else {
        printf("## kvpool serve\n\nGenerated by `kvpool serve --options-markdown` from the "
               "option table (client/tools/cli/serve.c). Every flag is also a key of the file "
               "that `--config FILE` reads (without its dashes; keys before any section and "
               "under `[serve]`), and so are the global options of `kvpool --help`. An "
               "environment variable named here is the library's (see Client environment): "
               "the flag overrides it.\n\n");
        kvp_opts_markdown(&opts, stdout);
    }
    return KVP_CLI_OK;
}

/* One of serve's own options, or a global one (from the config file or after `serve`);
 * -1, or the usage error's exit code. */
static int serve_option(serve_t *s, const kvp_cli_t *gcli, const kvp_cli_command_t *cmd, int opt)
{
    const kvp_opts_t sets[] = {serve_opts(s), kvp_cli_global_opts(&s->cli)};
    size_t set = 0;
    const kvp_opt_t *o = kvp_opts_lookup(sets, KVP_ARRAY_SIZE(sets), opt, &set);
    if (o != NULL && set == 0 && o->type == KVP_OPT_ACTION)
        return serve_action(cmd, o->name);
    if (o != NULL && set == 0) {
        char err[300];
        if (kvp_opt_set(o, s, optarg, err, sizeof(err)) != KVP_OK)
            return kvp_cli_usage_error(cmd, "%s", err);
        if (strcmp(o->name, "segment-size") == 0)
            s->dram_given = true;
        return -1;
    }
    if (o == NULL)
        return KVP_CLI_USAGE; /* none of the tables': never asked */
    /* a global option in the config file (or after `serve`): the command line's own,
     * given before `serve`, wins */
    if (kvp_cli_global_given(gcli, o))
        return -1;
    return kvp_cli_global_set(&s->cli, cmd, o, optarg);
}

/* serve's argv (config file expanded) into *s, every input checked; -1, or the exit code
 * when serve must stop now. */
static int serve_parse(serve_t *s, const kvp_cli_t *gcli, const kvp_cli_command_t *cmd,
                       const struct option *opts, int argc, char **argv)
{
    int opt;
    optind = 0;
    while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
        int rc = opt == '?' || opt == ':' ? kvp_cli_option_other(cmd, opt, argc, argv)
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
    bool dfs_seg = p->dfs_path != NULL && p->dfs_size != 0;
    if (!s->dram_given && p->ssd_path == NULL && !dfs_seg)
        return kvp_cli_usage_error(cmd, "serve needs --segment-size (and/or --ssd-path, "
                                        "--dfs-path with --dfs-size)");
    if (p->segment_size == 0 && p->ssd_path == NULL && !dfs_seg)
        return kvp_cli_usage_error(cmd, "--segment-size 0 needs an SSD segment (--ssd-path) or "
                                        "a DFS segment (--dfs-path with --dfs-size)");
    if (p->dfs_size != 0 && p->dfs_path == NULL)
        return kvp_cli_usage_error(cmd, "--dfs-size needs --dfs-path");
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

/* An owner takes hundreds of peers' connections, and its data servers take a quarter of
 * the descriptor limit each (conn_server.h): the soft limit goes up to the hard one (as
 * Redis does for its maxclients), logged. A library-mode segment leaves its process's
 * limit alone. */
static void serve_raise_nofile(void)
{
    const rlim_t most = 1u << 20;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max || rl.rlim_cur >= most)
        return;
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max < most ? rl.rlim_max : most;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0) /* a failure leaves it as it was: fewer peers */
        KVP_LOG_INFO("serve: descriptor limit (ulimit -n) raised from %llu to %llu for the data "
                     "servers' connections",
                     (unsigned long long)was, (unsigned long long)rl.rlim_cur);
    else
        KVP_LOG_WARN("serve: cannot raise the descriptor limit from %llu to %llu: %m; the data "
                     "servers take fewer connections",
                     (unsigned long long)was, (unsigned long long)rl.rlim_cur);
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
    serve_raise_nofile();
    kvp_conn_limits_set_default(&s->data_limits); /* before the client starts its servers */
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
    const char *dfs_name = kvp_client_dfs_segment_name(s->client);
    if (dfs_name != NULL)
        printf("serving DFS segment %s (%" PRIu64 " bytes, directory %s) for master %s\n", dfs_name,
               s->params.dfs_size, s->params.dfs_path, s->cli.master);
    if (s->http != NULL)
        printf("metrics on http://%s/metrics, health on http://%s/health\n", s->http_addr,
               s->http_addr);
    if (name == NULL)
        name = ssd_name != NULL ? ssd_name : dfs_name != NULL ? dfs_name : "(unnamed)";
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
    serve_t s = {.cli = *gcli};
    kvp_client_params_init(&s.params);
    kvp_opts_t so = serve_opts(&s);
    char err[256];
    if (kvp_opts_defaults(&so, err, sizeof(err)) != KVP_OK)
        return kvp_cli_fail(err, "serve's option table");
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
    const kvp_opts_t sets[] = {serve_opts(NULL), kvp_cli_global_opts(NULL)};
    struct option opts[64];
    char shortopts[16];
    if (kvp_opts_getopt(sets, KVP_ARRAY_SIZE(sets), NULL, opts, KVP_ARRAY_SIZE(opts),
                        "+:", shortopts, sizeof(shortopts)) == 0)
        return kvp_cli_fail("too many options", "serve's option table");
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
