/*
 * main.c - kvpool-master: flags, readiness notification, run, clean exit.
 *
 * Design: getopt here, the settings themselves (defaults, values, checks)
 * in config.c. Thread: the main thread, which then runs the loop.
 *
 *   kvpool-master [--config FILE] [--listen HOST:PORT] [--ready-fd N] [--log-level LEVEL] ...
 *
 * --config FILE: the keys of FILE (before any section, and under [master])
 * become flags placed before the command line's own (common/conf.h), so one
 * getopt loop reads both and a flag given here overrides the file.
 *
 * --ready-fd N: once listening, write "HOST:PORT\n" (the bound address) to
 * fd N and close it, so a supervisor or test learns readiness from a pipe,
 * not from sleeps or log scraping.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/conf.h"
#include "common/log.h"
#include "common/parse.h"
#include "master/core/config.h"
#include "master/server.h"

#define DEFAULT_LISTEN "127.0.0.1:50051"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpool-master [options]\n"
            "  --listen HOST:PORT   control-plane address (default " DEFAULT_LISTEN ";\n"
            "                       port 0 picks a free port)\n"
            "  --ready-fd N         write the bound HOST:PORT and a newline to fd N when\n"
            "                       listening, then close it\n"
            "  --log-level LEVEL    off|error|warn|info|debug (default info)\n"
            "  --auth protected|none  protected (default, no credentials configured): take\n"
            "                       connections from this host only, refusing others with\n"
            "                       KVP_ERR_DENIED; none: anyone who reaches the port (a\n"
            "                       trusted network only)\n"
            "Security (docs/operations.md, \"Security\"): with these the port is open to\n"
            "other hosts, and every connection is TLS 1.3 and names a principal:\n"
            "  --tls-cert FILE, --tls-key FILE  the master's certificate (PEM) and its key\n"
            "  --tls-ca FILE        the CA of client certificates (mutual TLS)\n"
            "  --tls-crl FILE       revoked client certificates (PEM CRL)\n"
            "  --acl-file FILE      principals: tenant, roles, cert-cn, token-sha256, key\n"
            "                       patterns; SIGHUP reloads it (and the TLS files)\n"
            "  --data-grants on|off  with TLS: every tcp data request carries a grant the\n"
            "                       master sealed for that extent, op and time, checked by\n"
            "                       the segment's owner (default on; off: owners serve\n"
            "                       any request, as without TLS)\n"
            "  --evict-high-watermark F  also evict in the background when used/capacity\n"
            "                       passes F (default 1.0: off; puts evict what they need)\n"
            "  --evict-low-watermark F   ... down to F (default 0.98)\n"
            "  --lease-ttl SECONDS  safety net of a read lease: a get releases its lease when\n"
            "                       its transfer ends; one never released (the reader died)\n"
            "                       ends this long after it was granted (default 5)\n"
            "  --put-timeout SECONDS  revoke a put not ended by then (default 30)\n"
            "  --soft-pin-ttl SECONDS  default soft pin lifetime (default 1800)\n"
            "  --client-ttl SECONDS  drop a client silent this long: its segments are\n"
            "                       unmounted, its puts revoked (default 10; 0: never)\n"
            "  --segment-grace SECONDS  keep what a DRAM segment dropped so held: taken\n"
            "                       back if that segment mounts again within it (its\n"
            "                       owner was cut off, not restarted) (default 60; 0: off)\n"
            "  --lease-on-exist     exist grants read leases too (default: only get)\n"
            "  --no-eviction        never evict: a full pool refuses puts\n"
            "SSD tier (when SSD segments are mounted: kvpool serve --ssd-path):\n"
            "  --offload-high-watermark F  offload DRAM victims to SSD in the background\n"
            "                       when DRAM used/capacity passes F (default 0.95)\n"
            "  --offload-low-watermark F   ... down to F (default 0.90)\n"
            "  --ssd-evict-high-watermark F  drop SSD objects (LRU) when SSD used passes F\n"
            "                       (default 0.95)\n"
            "  --ssd-evict-low-watermark F   ... down to F (default 0.90)\n"
            "  --promote-on-hit on|off  copy an SSD-only object back to DRAM in the\n"
            "                       background when a get hits it (default on)\n"
            "High availability (leader election through etcd; without --etcd the master\n"
            "is standalone and needs no etcd):\n"
            "  --etcd HOST:PORT[,HOST:PORT...]  etcd endpoints (v3 JSON gateway)\n"
            "  --cluster NAME       the masters of one pool share a name (default kvpool);\n"
            "                       clients use --master etcd://HOST:PORT[,...]/NAME\n"
            "  --leader-ttl SECONDS lease of the leader: a standby takes over this long\n"
            "                       after the leader stops renewing it (default 5, min 2)\n"
            "  --advertise HOST:PORT  the address clients reach this master at (default:\n"
            "                       the --listen address as bound)\n"
            "  --etcd-cacert FILE   CA of etcd's certificate: TLS to every endpoint\n"
            "                       (https://HOST:PORT endpoints are TLS too)\n"
            "  --etcd-cert FILE, --etcd-key FILE  client certificate for etcd's\n"
            "                       --client-cert-auth\n"
            "  --etcd-user NAME, --etcd-password-file FILE  etcd user and the file of its\n"
            "                       password (never a flag value; mode 0600)\n"
            "Metadata that survives the master:\n"
            "  --segment-records on|off  owners of DRAM segments keep a record of the\n"
            "                       objects on them, so that a restarted master adopts\n"
            "                       them back at their remount (default on; SSD segments'\n"
            "                       files always describe themselves; with data grants\n"
            "                       the records are kept even when off, to end write\n"
            "                       grants at their put's end, and nothing is adopted)\n"
            "Operations (docs/operations.md):\n"
            "  --http-listen HOST:PORT  HTTP for /metrics (Prometheus), /health, /api/v1/...\n"
            "                       and /get_all_segments (default 127.0.0.1:9003; when\n"
            "                       that default is taken the master runs without HTTP;\n"
            "                       off: none)\n"
            "  --kv-events-bind ENDPOINT  publish KV events (stored/removed/cleared) on a\n"
            "                       ZeroMQ PUB socket, e.g. tcp://127.0.0.1:5557 (default: off)\n"
            "  --kv-events-replay-bind ENDPOINT  answer replays of missed batches here\n"
            "  --kv-events-topic T  first frame of every message (default kvpool)\n"
            "  --kv-events-queue N  events queued before the oldest are dropped (65536)\n"
            "  --kv-events-replay-batches N  batches kept for replay (default 4096)\n"
            "  --kv-events-model NAME, --kv-events-block-size N, --kv-events-tenant ID,\n"
            "  --kv-events-backend-id ID, --kv-events-dp-rank N  the events' envelope\n"
            "                       (defaults kvpool, 0, default, kvpool-master, 0)\n"
            "  --kv-events-curve-secret FILE  the KV events sockets become CURVE servers\n"
            "                       with this secret key (40 Z85 characters; FILE readable\n"
            "                       by the master's user only, mode 600)\n"
            "  --kv-events-curve-allow FILE  who may subscribe: lines KEY TENANT or KEY *\n"
            "                       (a subscriber's Z85 public key; it hears its tenant's\n"
            "                       events, * every tenant's); SIGHUP reloads it\n"
            "                       (deploy/make-curve-keys.sh makes key pairs)\n"
            "  --config FILE        read settings from FILE (INI: every flag is a key,\n"
            "                       e.g. lease-ttl = 5, no-eviction = true; keys before any\n"
            "                       section and under [master] apply; flags given here\n"
            "                       override it)\n"
            "  --version, --help\n");
}

/*
 * The flags; each is also a config file key (common/conf.h). --config itself is not here:
 * kvp_conf_expand_argv takes it out of argv before getopt runs.
 */
static const struct option opts[] = {
    {"listen", required_argument, NULL, 'l'},
    {"ready-fd", required_argument, NULL, 'r'},
    {"log-level", required_argument, NULL, 'v'},
    /* 's': a setting of kvp_master_config_t, read by config.c under its flag name */
    {"evict-high-watermark", required_argument, NULL, 's'},
    {"evict-low-watermark", required_argument, NULL, 's'},
    {"lease-ttl", required_argument, NULL, 's'},
    {"put-timeout", required_argument, NULL, 's'},
    {"soft-pin-ttl", required_argument, NULL, 's'},
    {"no-eviction", no_argument, NULL, 's'},
    {"client-ttl", required_argument, NULL, 's'},
    {"segment-grace", required_argument, NULL, 's'},
    {"lease-on-exist", no_argument, NULL, 's'},
    {"offload-high-watermark", required_argument, NULL, 's'},
    {"offload-low-watermark", required_argument, NULL, 's'},
    {"ssd-evict-high-watermark", required_argument, NULL, 's'},
    {"ssd-evict-low-watermark", required_argument, NULL, 's'},
    {"promote-on-hit", required_argument, NULL, 's'},
    {"segment-records", required_argument, NULL, 's'},
    {"etcd", required_argument, NULL, 'e'},
    {"cluster", required_argument, NULL, 'c'},
    {"leader-ttl", required_argument, NULL, 't'},
    {"advertise", required_argument, NULL, 'a'},
    {"etcd-cacert", required_argument, NULL, 's'},
    {"etcd-cert", required_argument, NULL, 's'},
    {"etcd-key", required_argument, NULL, 's'},
    {"etcd-user", required_argument, NULL, 's'},
    {"etcd-password-file", required_argument, NULL, 's'},
    {"http-listen", required_argument, NULL, 's'},
    {"kv-events-bind", required_argument, NULL, 's'},
    {"kv-events-replay-bind", required_argument, NULL, 's'},
    {"kv-events-topic", required_argument, NULL, 's'},
    {"kv-events-queue", required_argument, NULL, 's'},
    {"kv-events-replay-batches", required_argument, NULL, 's'},
    {"kv-events-model", required_argument, NULL, 's'},
    {"kv-events-block-size", required_argument, NULL, 's'},
    {"kv-events-tenant", required_argument, NULL, 's'},
    {"kv-events-backend-id", required_argument, NULL, 's'},
    {"kv-events-dp-rank", required_argument, NULL, 's'},
    {"kv-events-curve-secret", required_argument, NULL, 's'},
    {"kv-events-curve-allow", required_argument, NULL, 's'},
    {"auth", required_argument, NULL, 's'},
    {"tls-cert", required_argument, NULL, 's'},
    {"tls-key", required_argument, NULL, 's'},
    {"tls-ca", required_argument, NULL, 's'},
    {"tls-crl", required_argument, NULL, 's'},
    {"data-grants", required_argument, NULL, 's'},
    {"acl-file", required_argument, NULL, 's'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

/* The --etcd-* settings in *sec; NULL when none is given (plain http, no credential). */
static const kvp_etcd_security_t *etcd_security(const kvp_master_config_t *cfg,
                                                kvp_etcd_security_t *sec)
{
    sec->ca = cfg->etcd_cacert[0] ? cfg->etcd_cacert : NULL;
    sec->cert = cfg->etcd_cert[0] ? cfg->etcd_cert : NULL;
    sec->key = cfg->etcd_key[0] ? cfg->etcd_key : NULL;
    sec->user = cfg->etcd_user[0] ? cfg->etcd_user : NULL;
    sec->password_file = cfg->etcd_password_file[0] ? cfg->etcd_password_file : NULL;
    return sec->ca || sec->cert || sec->key || sec->user || sec->password_file ? sec : NULL;
}

/* Runs on the main thread; argv: the command line with the config file's flags in front. */
static int master_main(int argc, char **argv)
{
    const char *listen_addr = DEFAULT_LISTEN;
    int ready_fd = -1;
    const char *etcd = NULL, *cluster = "kvpool", *advertise = NULL;
    uint32_t leader_ttl = 5;
    kvp_master_config_t cfg;
    kvp_master_config_init(&cfg);
    kvp_log_set_component("kvpool-master");
    kvp_log_set_level(KVP_LOG_INFO);
    kvp_log_init_from_env();

    int opt, idx = 0;
    char err[160];
    while ((opt = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
        switch (opt) {
        case 'l':
            listen_addr = optarg;
            break;
        case 'e':
            etcd = optarg;
            break;
        case 'c':
            if (optarg[0] == '\0' || strlen(optarg) > 128 || strchr(optarg, '/') != NULL) {
                fprintf(stderr, "kvpool-master: --cluster needs a name of 1..128 bytes "
                                "without '/'\n");
                return 2;
            }
            cluster = optarg;
            break;
        case 't': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end != '\0' || v < 2 || v > 3600) {
                fprintf(stderr, "kvpool-master: --leader-ttl needs 2..3600 seconds\n");
                return 2;
            }
            leader_ttl = (uint32_t)v;
            break;
        }
        case 'a':
            advertise = optarg;
            break;
        case 'r': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end != '\0' || v < 0 || v > 65535) {
                fprintf(stderr, "kvpool-master: --ready-fd needs a file descriptor number\n");
                return 2;
            }
            ready_fd = (int)v;
            break;
        }
        case 'v': {
            kvp_log_level_t lvl;
            if (!kvp_log_parse_level(optarg, &lvl)) {
                fprintf(stderr, "kvpool-master: unknown log level '%s'\n", optarg);
                return 2;
            }
            kvp_log_set_level(lvl);
            break;
        }
        case 's':
            if (kvp_master_config_set(&cfg, opts[idx].name, optarg, err, sizeof(err)) != KVP_OK) {
                fprintf(stderr, "kvpool-master: %s\n", err);
                return 2;
            }
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("kvpool-master 0.1.0\n");
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvpool-master: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    char host[256];
    uint16_t port;
    if (kvp_parse_hostport(listen_addr, host, sizeof(host), &port) != KVP_OK) {
        fprintf(stderr, "kvpool-master: --listen needs HOST:PORT, got '%s'\n", listen_addr);
        return 2;
    }
    kvp_master_server_t *srv;
    uint16_t bound;
    if (kvp_master_config_validate(&cfg, err, sizeof(err)) != KVP_OK) {
        fprintf(stderr, "kvpool-master: %s\n", err);
        return 2;
    }
    if (etcd == NULL && etcd_security(&cfg, &(kvp_etcd_security_t){0}) != NULL) {
        fprintf(stderr, "kvpool-master: the --etcd-* settings need --etcd\n");
        return 2;
    }
    kvp_status_t status = kvp_master_server_create(host, port, &cfg, &srv, &bound);
    if (status != KVP_OK) {
        /* the server logged which of --listen, --http-listen, --kv-events-bind failed */
        fprintf(stderr, "kvpool-master: cannot start (--listen %s): %s\n", listen_addr,
                kvp_strerror(status));
        return 1;
    }
    KVP_LOG_INFO("listening on %s:%u", host, bound);
    if (etcd != NULL) {
        char self[300];
        snprintf(self, sizeof(self), "%s:%u", host, bound);
        if (advertise != NULL)
            snprintf(self, sizeof(self), "%s", advertise);
        char ahost[256];
        uint16_t aport;
        if (kvp_parse_hostport(self, ahost, sizeof(ahost), &aport) != KVP_OK || aport == 0 ||
            strcmp(ahost, "0.0.0.0") == 0) {
            fprintf(stderr, "kvpool-master: clients cannot reach %s: give --advertise HOST:PORT\n",
                    self);
            kvp_master_server_destroy(srv);
            return 2;
        }
        kvp_etcd_security_t sec;
        char why[512] = "";
        kvp_election_params_t ep = {.endpoints = etcd,
                                    .cluster = cluster,
                                    .self = self,
                                    .ttl_s = leader_ttl,
                                    .security = etcd_security(&cfg, &sec),
                                    .err = why,
                                    .err_len = sizeof(why)};
        status = kvp_master_server_elect(srv, &ep);
        if (status != KVP_OK) {
            fprintf(stderr, "kvpool-master: --etcd %s: %s\n", etcd,
                    why[0] != '\0' ? why : kvp_strerror(status));
            kvp_master_server_destroy(srv);
            return 2;
        }
        KVP_LOG_INFO("high availability: campaigning in cluster %s through etcd %s%s%s%s%s%s as "
                     "%s (leader ttl %u s); a standby until elected",
                     cluster, etcd, cfg.etcd_cacert[0] ? " over TLS" : "",
                     cfg.etcd_cert[0] ? " with a client certificate" : "",
                     cfg.etcd_user[0] ? " (etcd user " : "", cfg.etcd_user,
                     cfg.etcd_user[0] ? ")" : "", self, leader_ttl);
    }
    if (ready_fd >= 0) {
        char line[300];
        int n = snprintf(line, sizeof(line), "%s:%u\n", host, bound);
        if (write(ready_fd, line, (size_t)n) != n)
            KVP_LOG_WARN("cannot write to --ready-fd %d: %m", ready_fd);
        close(ready_fd);
    }
    status = kvp_master_server_run(srv);
    kvp_master_server_destroy(srv);
    KVP_LOG_INFO("stopped");
    return status == KVP_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    int conf_argc;
    char **conf_argv;
    char err[512];
    if (kvp_conf_expand_argv(argc, argv, opts, "master", &conf_argc, &conf_argv, err,
                             sizeof(err)) != KVP_OK) {
        fprintf(stderr, "kvpool-master: %s\n", err);
        return 2;
    }
    /* optarg strings point into conf_argv: it lives until the master has stopped */
    int rc = master_main(conf_argc, conf_argv);
    kvp_conf_free_argv(conf_argv, argv);
    return rc;
}
