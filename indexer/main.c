/*
 * main.c - kvpool-indexer: options (one row each, common/options.h), the Conductor's JSON
 * config, the index, the subscriber thread, the HTTP API; readiness on --ready-fd; a clean
 * exit on SIGINT / SIGTERM.
 *
 *   kvpool-indexer [--listen HOST:PORT] [--config FILE] [--hash-seed N] ...
 *
 * Thread: the main thread, which waits for a signal once everything runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <zmq.h>

#include "common/acl.h"
#include "common/http.h"
#include "common/json.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/options.h"
#include "common/parse.h"
#include "common/tls.h"
#include "indexer/api.h"
#include "indexer/index.h"
#include "indexer/sub.h"

/* jemalloc (the release build's allocator; docs/indexer.md "Memory") reads this at start:
 * a thread of its own hands freed pages back to the kernel within about a second. The
 * messages of a burst of events (up to the socket's high-water mark of batches) are freed
 * once applied, but without it their pages stay resident until the allocator is next busy,
 * which an idle indexer never is. An operator's MALLOC_CONF still applies over it; without
 * jemalloc (the sanitizer build) nothing reads it. */
const char *malloc_conf = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0";

#define KVP_INDEXER_VERSION "0.1.0"
#define CONFIG_MAX (16u << 20)

typedef struct indexer_config {
    char listen[300];
    char config[4096];
    char state_dir[4000];
    char tls_cert[4096], tls_key[4096], tls_ca[4096], tls_crl[4096], acl_file[4096];
    char curve_secret[4096];
    char publisher_allow[4096];
    uint32_t tenant_regs_max, tenant_subs_max;
    uint32_t instance_ttl_ms;
    char auth[16];
    uint64_t hash_seed, max_blocks, max_message;
    uint64_t max_blocks_per_tenant;
    uint32_t replay_timeout_ms;
    int ready_fd;
    int log_level;
} indexer_config_t;

#define F(field) KVP_OPT_FIELD(indexer_config_t, field)

static const char *const auth_choices[] = {"protected", "none", NULL};

static const kvp_opt_t indexer_rows[] = {
    KVP_OPT_GROUP("General", NULL),
    {.name = "listen",
     .type = KVP_OPT_HOSTPORT,
     .arg = "HOST:PORT",
     .def = "127.0.0.1:13333",
     .def_doc = "127.0.0.1:13333, or the config file's http_server_port",
     F(listen),
     .help = "the HTTP API's address (port 0 picks a free port)"},
    {.name = "config",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     .def_doc = "none",
     F(config),
     .env = "CONDUCTOR_CONFIG_PATH",
     .help = "Mooncake Conductor's JSON config: http_server_port, and kvevent_instance (a map "
             "of name to a /register object, registered at start; the name is the instance "
             "id when the object has none)"},
    {.name = "state-dir",
     .type = KVP_OPT_STRING,
     .arg = "DIR",
     .def_doc = "none (registrations are lost with the process)",
     F(state_dir),
     .help = "keep the registrations in DIR/registrations.json (mode 600, rewritten "
             "atomically on every change); a restarted indexer registers them again, subscribes "
             "and replays what each publisher still holds"},
    {.name = "hash-seed",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "0",
     F(hash_seed),
     .min = 0,
     .max = INT64_MAX,
     .help = "the standard hash's seed S: local = XXH3-64(tokens as LE u32, S)"},
    KVP_OPT_ROW_READY_FD(indexer_config_t, ready_fd),
    KVP_OPT_ROW_LOG_LEVEL(indexer_config_t, log_level, "CONDUCTOR_LOG_LEVEL"),
    {.name = "auth",
     .type = KVP_OPT_ENUM,
     .arg = "protected|none",
     .def = "protected",
     F(auth),
     .choices = auth_choices,
     .help = "protected: answer requests from this host only (others get 403, counted); "
             "none: anyone who reaches the port (a trusted network only)"},
    KVP_OPT_ROWS_ACTIONS,

    KVP_OPT_GROUP("Security",
                  "with --acl-file every request but /health and /metrics names a principal "
                  "(a bearer token or a client certificate) over HTTPS (docs/indexer.md)"),
    {.name = "tls-cert",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     .def_doc = "none (plain HTTP)",
     F(tls_cert),
     .help = "serve HTTPS (TLS 1.3) with this PEM certificate (chain)"},
    {.name = "tls-key",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(tls_key),
     .help = "its private key"},
    {.name = "tls-ca",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(tls_ca),
     .help = "PEM CAs whose client certificates are asked for and verified (their CN names a "
             "principal: cert-cn in the ACL)"},
    {.name = "tls-crl",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(tls_crl),
     .help = "PEM CRLs of those CAs"},
    {.name = "acl-file",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     .def_doc = "none",
     F(acl_file),
     .help = "the ACL (the master's format, docs/security.md): /register and /unregister need "
             "role write, /query and /instances role read (admin: both, every tenant); a "
             "principal names only its own tenant. Needs --tls-cert"},

    {.name = "curve-secret",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     .def_doc = "none",
     F(curve_secret),
     .help = "the indexer's ZeroMQ CURVE secret key (40 Z85 characters, deploy/make-curve-keys.sh; "
             "mode 600): publishers registered with a curve_server_key (a kvpool master's "
             "--kv-events-curve-secret) are reached over CURVE with it; its public key (logged "
             "at start) goes in their allow-list"},

    {.name = "publisher-allow",
     .type = KVP_OPT_STRING,
     .arg = "CIDR[,CIDR...]",
     .def_doc = "none (any tcp:// endpoint)",
     F(publisher_allow),
     .help = "the networks (ADDR or ADDR/BITS, IPv4 or IPv6, at most 64) whose addresses a "
             "registration's endpoint and replay_endpoint may name; with it they must name an IP "
             "address, not a host name (others: 400, counted)"},

    KVP_OPT_GROUP("Limits", NULL),
    {.name = "max-registrations-per-tenant",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "4096",
     F(tenant_regs_max),
     .min = 1,
     .max = KVP_IDX_REGS_MAX,
     .help = "registrations of one tenant at most (past it /register answers 429, counted); "
             "all tenants together: 65536"},
    {.name = "max-subscriptions-per-tenant",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "256",
     F(tenant_subs_max),
     .min = 1,
     .max = KVP_IDX_SUBS_MAX,
     .help = "publisher endpoints the registrations of one tenant name at most, each a ZeroMQ "
             "socket (past it /register answers 429, counted); all tenants together: 4096, "
             "which the subscriber's socket limit covers"},
    {.name = "max-blocks",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "16777216",
     F(max_blocks),
     .min = 1,
     .max = (1u << 31) - 2,
     .help = "blocks indexed at most, removed ones kept for their engine hash included; past it "
             "the least recently stored goes, with all its holders "
             "(kvpool_indexer_evicted_blocks_total)"},
    {.name = "max-blocks-per-tenant",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "0",
     .def_doc = "0 (a fair share: --max-blocks over the tenants holding blocks)",
     F(max_blocks_per_tenant),
     .min = 0,
     .max = (1u << 31) - 2,
     .help = "blocks one tenant keeps at most; past it the tenant's own least recently stored "
             "go (kvpool_indexer_tenant_evicted_blocks_total), never another tenant's"},
    {.name = "instance-ttl",
     .type = KVP_OPT_SECONDS_MS,
     .arg = "SECONDS",
     .def = "0",
     .def_doc = "0 (never)",
     F(instance_ttl_ms),
     .min = 0,
     .max = 86400000,
     .help = "a publisher with no batch for this long is reported stale (GET /instances, "
             "kvpool_indexer_stale_publishers); its blocks stay"},
    {.name = "replay-timeout",
     .type = KVP_OPT_SECONDS_MS,
     .arg = "SECONDS",
     .def = "1",
     F(replay_timeout_ms),
     .min = 1,
     .max = 60000,
     .help = "how long a replay that heals a gap may take before the publisher is "
             "resynchronized instead"},
    {.name = "max-message",
     .type = KVP_OPT_SIZE,
     .arg = "SIZE",
     .def = "64MiB",
     F(max_message),
     .min = 4096,
     .help = "the largest ZeroMQ message taken from a publisher (a larger one is dropped by "
             "ZeroMQ, which shows as a gap)"},
};

static kvp_opts_t indexer_options(indexer_config_t *cfg)
{
    return (kvp_opts_t){.rows = indexer_rows, .count = KVP_ARRAY_SIZE(indexer_rows), .base = cfg};
}

static void usage(const kvp_opts_t *opts, FILE *f)
{
    fputs("usage: kvpool-indexer [options]\n", f);
    kvp_opts_usage(opts, 23, f);
}

static volatile sig_atomic_t stop_signal, reload_signal;

static void on_signal(int sig)
{
    if (sig == SIGHUP)
        reload_signal = 1;
    else
        stop_signal = sig;
}

/* The config file: its port (0: none), and its registrations. -1, or the exit code. */
static int load_config(kvp_api_t *api, const char *path, uint64_t *port_p)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "kvpool-indexer: --config %s: %m\n", path);
        return 2;
    }
    char *text = malloc(CONFIG_MAX);
    size_t len = text != NULL ? fread(text, 1, CONFIG_MAX, f) : 0;
    bool whole = feof(f) != 0;
    fclose(f);
    if (text == NULL || !whole) {
        free(text);
        fprintf(stderr, "kvpool-indexer: --config %s: unreadable or over 16 MiB\n", path);
        return 2;
    }
    kvp_json_t j;
    char why[256];
    int rc = -1;
    if (kvp_json_parse(&j, text, len, why, sizeof(why)) != KVP_JSON_OK ||
        j.t[0].type != KVP_J_OBJECT) {
        fprintf(stderr, "kvpool-indexer: --config %s: %s\n", path,
                j.t != NULL && j.n > 0 ? "not a JSON object" : why);
        rc = 2;
        goto out;
    }
    int64_t p = kvp_json_get(&j, 0, "http_server_port");
    if (p >= 0 && (!kvp_json_u64(&j, (uint32_t)p, port_p) || *port_p > 65535)) {
        fprintf(stderr, "kvpool-indexer: --config %s: http_server_port must be a port\n", path);
        rc = 2;
        goto out;
    }
    int64_t inst = kvp_json_get(&j, 0, "kvevent_instance");
    if (inst < 0)
        goto out;
    if (j.t[inst].type != KVP_J_OBJECT) {
        fprintf(stderr, "kvpool-indexer: --config %s: kvevent_instance must be an object\n", path);
        rc = 2;
        goto out;
    }
    uint32_t k = (uint32_t)inst + 1;
    for (uint32_t i = 0; i < j.t[inst].size; i++) {
        uint32_t v = j.t[k].next;
        char name[KVP_IDX_NAME_MAX], err[256];
        if (!kvp_json_str(&j, k, name, sizeof(name))) {
            fprintf(stderr, "kvpool-indexer: --config %s: an instance name over %d bytes\n", path,
                    KVP_IDX_NAME_MAX - 1);
            rc = 2;
            goto out;
        }
        unsigned st =
            j.t[v].type != KVP_J_OBJECT
                ? 400
                : kvp_api_register_json(api, text + j.t[v].start, j.t[v].end - j.t[v].start, name,
                                        NULL, err, sizeof(err));
        if (st != 0) {
            fprintf(stderr, "kvpool-indexer: --config %s: kvevent_instance \"%s\": %s\n", path,
                    name, j.t[v].type != KVP_J_OBJECT ? "not an object" : err);
            rc = 2;
            goto out;
        }
        k = j.t[v].next;
    }
out:
    kvp_json_free(&j);
    free(text);
    return rc;
}

/* --tls-* and --acl-file: read and checked. -1, or the exit code (reported). */
static int security(const indexer_config_t *cfg, kvp_tls_t **tls_p, kvp_acl_t **acl_p)
{
    char err[512];
    if (cfg->acl_file[0] != '\0' && cfg->tls_cert[0] == '\0') {
        fprintf(stderr, "kvpool-indexer: --acl-file needs --tls-cert and --tls-key (tokens are "
                        "never taken in clear)\n");
        return 2;
    }
    if ((cfg->tls_cert[0] != '\0') != (cfg->tls_key[0] != '\0') ||
        ((cfg->tls_ca[0] != '\0' || cfg->tls_crl[0] != '\0') && cfg->tls_cert[0] == '\0')) {
        fprintf(stderr, "kvpool-indexer: --tls-cert and --tls-key go together, and --tls-ca, "
                        "--tls-crl need them\n");
        return 2;
    }
    if (cfg->tls_cert[0] != '\0') { /* the files checked now, the client certificates later */
        kvp_tls_params_t tp = {.cert = cfg->tls_cert,
                               .key = cfg->tls_key,
                               .ca = cfg->tls_ca[0] ? cfg->tls_ca : NULL,
                               .crl = cfg->tls_crl[0] ? cfg->tls_crl : NULL};
        if (kvp_tls_create(&tp, true, tls_p, err, sizeof(err)) != KVP_OK) {
            fprintf(stderr, "kvpool-indexer: %s\n", err);
            return 2;
        }
    }
    if (cfg->acl_file[0] != '\0' &&
        kvp_acl_load(cfg->acl_file, acl_p, err, sizeof(err)) != KVP_OK) {
        fprintf(stderr, "kvpool-indexer: --acl-file %s: %s\n", cfg->acl_file, err);
        kvp_tls_destroy(*tls_p);
        *tls_p = NULL;
        return 2;
    }
    return -1;
}

/* --curve-secret: the key pair into p (the secret read from FILE, readable by its owner
 * only; the public one derived). -1, or the exit code (reported). */
static int curve_keys(const char *path, kvp_sub_params_t *p)
{
    if (path[0] == '\0')
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    char buf[128];
    ssize_t n = -1;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        (st.st_mode & (S_IRWXG | S_IRWXO)) == 0)
        n = read(fd, buf, sizeof(buf) - 1);
    if (fd < 0 || n < 0) {
        fprintf(stderr, "kvpool-indexer: --curve-secret %s: %s\n", path,
                fd < 0 ? strerror(errno)
                       : "not a regular file readable by its owner only (chmod 600 it)");
        if (fd >= 0)
            close(fd);
        return 2;
    }
    close(fd);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    buf[n] = '\0';
    uint8_t raw[32];
    bool ok = n == KVP_IDX_CURVE_KEY_LEN && zmq_z85_decode(raw, buf) != NULL &&
              zmq_curve_public(p->curve_public, buf) == 0;
    if (ok)
        memcpy(p->curve_secret, buf, sizeof(p->curve_secret));
    OPENSSL_cleanse(buf, sizeof(buf));
    OPENSSL_cleanse(raw, sizeof(raw));
    if (!ok) {
        fprintf(stderr,
                "kvpool-indexer: --curve-secret %s: not a CURVE secret key (40 Z85 "
                "characters on one line, as deploy/make-curve-keys.sh writes in "
                "NAME.key)\n",
                path);
        return 2;
    }
    KVP_LOG_INFO("CURVE on: the indexer's public key (for the publishers' allow-lists) is %s",
                 p->curve_public);
    return -1;
}

/* Each subscription is a ZeroMQ socket (a descriptor for its mailbox, one for its
 * connection): the soft limit on descriptors raised to what every subscription needs (the
 * hard limit at most), and a warning when that is short (a registration whose socket cannot
 * be made is then refused, 503). */
static void fd_limit(void)
{
    struct rlimit rl;
    rlim_t need = 2 * KVP_IDX_SUBS_MAX + 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            (void)getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
        KVP_LOG_WARN("%llu file descriptors at most (ulimit -n), fewer than the %llu that %u "
                     "subscriptions may need: registrations whose socket cannot be made are "
                     "refused (503)",
                     (unsigned long long)rl.rlim_cur, (unsigned long long)need, KVP_IDX_SUBS_MAX);
}

/*
 * The limits every registration is checked against (--max-*-per-tenant, --publisher-allow),
 * then the registrations to start with: --state-dir's file (its path written in state; api->state
 * set), then --config's (which may name the port: cfg->listen, unless --listen was given).
 * -1, or the exit code (reported).
 */
static int registrations(indexer_config_t *cfg, kvp_api_t *api, char *state, size_t state_len,
                         bool listen_given, bool config_given)
{
    int rc;
    char err[256];
    /* the limits every registration is checked against, the files' too */
    kvp_idx_set_tenant_caps(api->idx, cfg->tenant_regs_max, cfg->tenant_subs_max);
    if (!kvp_api_set_publisher_allow(api, cfg->publisher_allow, err, sizeof(err))) {
        fprintf(stderr, "kvpool-indexer: %s\n", err);
        return 2;
    }
    fd_limit();
    if (cfg->state_dir[0] != '\0') {
        if (mkdir(cfg->state_dir, 0700) != 0 && errno != EEXIST) {
            fprintf(stderr, "kvpool-indexer: --state-dir %s: %m\n", cfg->state_dir);
            return 2;
        }
        snprintf(state, state_len, "%s/registrations.json", cfg->state_dir);
        if (access(state, F_OK) == 0) {
            uint64_t ignored = 0;
            if ((rc = load_config(api, state, &ignored)) >= 0) {
                fprintf(stderr,
                        "kvpool-indexer: --state-dir: %s cannot be read back: move it "
                        "away to start without its registrations\n",
                        state);
                return rc;
            }
            KVP_LOG_INFO("registrations read back from %s", state);
        }
        api->state = state;
    }
    uint64_t cfg_port = 0;
    if (cfg->config[0] != '\0' && !config_given && access(cfg->config, F_OK) != 0) {
        /* as the Conductor: a CONDUCTOR_CONFIG_PATH that names no file is no registration */
        KVP_LOG_WARN("CONDUCTOR_CONFIG_PATH=%s: no such file: no registrations from it",
                     cfg->config);
    } else if (cfg->config[0] != '\0') {
        if ((rc = load_config(api, cfg->config, &cfg_port)) >= 0)
            return rc;
        if (!listen_given && cfg_port != 0)
            snprintf(cfg->listen, sizeof(cfg->listen), "127.0.0.1:%" PRIu64, cfg_port);
    }
    return -1;
}

/*
 * Run the indexer cfg describes until SIGINT or SIGTERM: 0, or the exit code of what could
 * not start (reported). Every way out undoes what was made, in reverse order (a clean stop
 * goes down the same ladder).
 */
static int indexer_run(indexer_config_t *cfg, bool listen_given, bool config_given)
{
    int rc = 1;
    kvp_idx_t *idx;
    kvp_idx_params_t ip = {.seed = cfg->hash_seed,
                           .max_blocks = cfg->max_blocks,
                           .ttl_ms = cfg->instance_ttl_ms,
                           .max_blocks_per_tenant = cfg->max_blocks_per_tenant};
    if (kvp_idx_create(&ip, &idx) != KVP_OK) {
        fprintf(stderr, "kvpool-indexer: out of memory\n");
        return rc;
    }
    kvp_tls_t *tls = NULL;
    kvp_acl_t *acl = NULL;
    rc = security(cfg, &tls, &acl);
    if (rc >= 0)
        goto err_destroy_idx;
    kvp_sub_params_t sp = {
        .idx = idx, .replay_timeout_ms = cfg->replay_timeout_ms, .max_message = cfg->max_message};
    rc = curve_keys(cfg->curve_secret, &sp);
    if (rc >= 0)
        goto err_destroy_security;
    kvp_api_t api = {.idx = idx,
                     .curve_on = sp.curve_secret[0] != '\0',
                     .protected_mode = strcmp(cfg->auth, "protected") == 0 && acl == NULL,
                     .acl = acl,
                     .acl_lock = PTHREAD_RWLOCK_INITIALIZER,
                     .tls = cfg->tls_ca[0] != '\0' ? tls : NULL,
                     .seed = cfg->hash_seed,
                     .state_lock = PTHREAD_MUTEX_INITIALIZER};
    char state[4100];
    rc = registrations(cfg, &api, state, sizeof(state), listen_given, config_given);
    if (rc >= 0)
        goto err_wipe_curve;
    /* the signals are taken only inside sigsuspend below: none is lost before it. Blocked
     * before the subscriber thread starts (it inherits the mask): a SIGHUP that came while
     * the main thread was not yet in sigsuspend went to that thread, set reload_signal, and
     * the main thread slept in sigsuspend without seeing it until the next signal */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    kvp_sub_t *sub;
    rc = 1;
    if (kvp_sub_start(&sp, &sub) != KVP_OK) {
        fprintf(stderr, "kvpool-indexer: cannot start the subscriber thread\n");
        goto err_wipe_curve;
    }
    api.sub = sub;
    kvp_sub_wake(sub); /* the config's registrations */

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    kvp_http_t *http;
    uint16_t bound;
    kvp_status_t hs = cfg->tls_cert[0] != '\0'
                          ? kvp_http_start_tls(cfg->listen, cfg->tls_cert, cfg->tls_key,
                                               cfg->tls_ca[0] ? cfg->tls_ca : NULL, kvp_api_handle,
                                               &api, &http, &bound)
                          : kvp_http_start(cfg->listen, kvp_api_handle, &api, &http, &bound);
    if (hs != KVP_OK) {
        fprintf(stderr, "kvpool-indexer: cannot listen on %s\n", cfg->listen);
        goto err_stop_sub;
    }
    kvp_http_accept_post(http, KVP_API_BODY_MAX, kvp_api_too_big);
    kvp_http_admit(http, kvp_api_admit); /* credentials from the head, before a body */
    char host[256];
    uint16_t port;
    (void)kvp_parse_hostport(cfg->listen, host, sizeof(host), &port);
    if (!api.protected_mode || strncmp(host, "127.", 4) == 0 || strcmp(host, "localhost") == 0)
        ;
    else
        KVP_LOG_WARN("protected mode: requests from other hosts are refused (403); --auth none "
                     "serves them");
    KVP_LOG_INFO("serving the indexer API on %s:%u (seed %" PRIu64 ", at most %" PRIu64 " blocks)",
                 host, bound, cfg->hash_seed, cfg->max_blocks);
    if (cfg->ready_fd >= 0) {
        char line[300];
        int n = snprintf(line, sizeof(line), "%s:%u\n", host, bound);
        if (write(cfg->ready_fd, line, (size_t)n) != n)
            KVP_LOG_WARN("cannot write to --ready-fd %d: %m", cfg->ready_fd);
        close(cfg->ready_fd);
    }
    while (stop_signal == 0) {
        sigsuspend(&old);
        if (reload_signal) {
            reload_signal = 0;
            if (api.acl != NULL)
                kvp_api_reload_acl(&api, cfg->acl_file);
            else
                KVP_LOG_INFO("SIGHUP: no --acl-file to read again");
        }
    }
    KVP_LOG_INFO("stopping (signal %d)", (int)stop_signal);
    rc = 0;
    kvp_http_stop(http);
err_stop_sub:
    kvp_sub_stop(sub);
err_wipe_curve:
    OPENSSL_cleanse(sp.curve_secret, sizeof(sp.curve_secret));
    acl = api.acl; /* the one a reload left */
err_destroy_security:
    kvp_acl_destroy(acl);
    kvp_tls_destroy(tls);
err_destroy_idx:
    kvp_idx_destroy(idx);
    return rc;
}

static int indexer_main(int argc, char **argv)
{
    indexer_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    kvp_opts_t opts = indexer_options(&cfg);
    char err[256];
    kvp_log_set_component("kvpool-indexer");
    if (kvp_opts_defaults(&opts, err, sizeof(err)) != KVP_OK ||
        kvp_opts_env(&opts, err, sizeof(err)) != KVP_OK) {
        fprintf(stderr, "kvpool-indexer: %s\n", err);
        return 2;
    }
    static struct option longopts[32];
    char shortopts[16];
    if (kvp_opts_getopt(&opts, 1, NULL, longopts, KVP_ARRAY_SIZE(longopts), "", shortopts,
                        sizeof(shortopts)) == 0) {
        fprintf(stderr, "kvpool-indexer: the option table outgrew its getopt table\n");
        return 1;
    }
    bool listen_given = false, config_given = false;
    int opt;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        size_t set;
        const kvp_opt_t *o = kvp_opts_lookup(&opts, 1, opt, &set);
        if (o == NULL) {
            usage(&opts, stderr);
            return 2;
        }
        if (o->type == KVP_OPT_ACTION) {
            if (strcmp(o->name, "help") == 0) {
                usage(&opts, stdout);
            } else if (strcmp(o->name, "version") == 0) {
                printf("kvpool-indexer " KVP_INDEXER_VERSION "\n");
            } else {
                printf("## kvpool-indexer\n\nGenerated by `kvpool-indexer --options-markdown` "
                       "from the option table (indexer/main.c). `--config FILE` is Mooncake "
                       "Conductor's JSON file (docs/indexer.md), not a file of these flags.\n\n");
                kvp_opts_markdown(&opts, stdout);
            }
            return 0;
        }
        if (kvp_opt_set(o, &cfg, optarg, err, sizeof(err)) != KVP_OK) {
            fprintf(stderr, "kvpool-indexer: %s\n", err);
            return 2;
        }
        listen_given |= strcmp(o->name, "listen") == 0;
        config_given |= strcmp(o->name, "config") == 0;
    }
    if (optind < argc) {
        fprintf(stderr, "kvpool-indexer: unexpected argument '%s'\n", argv[optind]);
        usage(&opts, stderr);
        return 2;
    }
    kvp_log_set_level((kvp_log_level_t)cfg.log_level);
    return indexer_run(&cfg, listen_given, config_given);
}

int main(int argc, char **argv)
{
    return indexer_main(argc, argv);
}
