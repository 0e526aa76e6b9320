/*
 * config.c - the master's settings: their defaults, how a flag's value is
 * read into them, and the checks across settings.
 *
 * Design: the settings are the rows of master_options.c (common/options.h:
 * name, type, default, field, help); here they are applied (defaults, one
 * flag's value by its name) and checked across each other, which no single
 * row can say. Values are read by their row's type: strtod, 0..1 for
 * fractions, 0..one year for times.
 *
 * Thread: any (no state); the master calls it from main before the loop.
 */
#include "master/core/config.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "common/http.h"
#include "common/parse.h"

void kvp_master_config_init(kvp_master_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    kvp_opts_t opts = kvp_master_options(cfg);
    char err[256];
    kvp_status_t st = kvp_opts_defaults(&opts, err, sizeof(err));
    assert(st == KVP_OK); /* the table's defaults are constants: a test sees any mistake */
    (void)st;
}

kvp_status_t kvp_master_config_set(kvp_master_config_t *cfg, const char *name, const char *value,
                                   char *err, size_t err_len)
{
    kvp_opts_t opts = kvp_master_options(cfg);
    const kvp_opt_t *o = kvp_opts_find(&opts, name);
    if (o == NULL || o->type == KVP_OPT_ACTION) {
        snprintf(err, err_len, "no setting named %s", name);
        return KVP_ERR_NOT_FOUND;
    }
    kvp_status_t st = kvp_opt_set(o, cfg, value, err, err_len);
    if (st == KVP_OK && strcmp(name, "http-listen") == 0)
        cfg->http_listen_given = true;
    return st;
}

kvp_status_t kvp_master_config_validate(const kvp_master_config_t *cfg, char *err, size_t err_len)
{
    if (cfg->evict_low > cfg->evict_high) {
        snprintf(err, err_len, "--evict-low-watermark must not exceed the high one");
        return KVP_ERR_INVALID_ARG;
    }
    if (cfg->offload_low > cfg->offload_high) {
        snprintf(err, err_len, "--offload-low-watermark must not exceed the high one");
        return KVP_ERR_INVALID_ARG;
    }
    if (cfg->kv_events_queue == 0) {
        snprintf(err, err_len, "--kv-events-queue needs at least 1 event");
        return KVP_ERR_INVALID_ARG;
    }
    if (!cfg->kv_events_curve_secret[0] != !cfg->kv_events_curve_allow[0] ||
        (cfg->kv_events_curve_secret[0] && !cfg->kv_events_bind[0])) {
        snprintf(err, err_len,
                 "KV events CURVE needs --kv-events-bind, --kv-events-curve-secret and "
                 "--kv-events-curve-allow");
        return KVP_ERR_INVALID_ARG;
    }
    if (strcmp(cfg->auth, "protected") != 0 && strcmp(cfg->auth, "none") != 0) {
        snprintf(err, err_len, "--auth must be protected or none, got '%s'", cfg->auth);
        return KVP_ERR_INVALID_ARG;
    }
    bool tls = cfg->tls_cert[0] || cfg->tls_key[0] || cfg->tls_ca[0] || cfg->tls_crl[0];
    if (tls && (!cfg->tls_cert[0] || !cfg->tls_key[0] || !cfg->acl_file[0])) {
        snprintf(err, err_len,
                 "TLS needs --tls-cert, --tls-key and --acl-file (who may do what); "
                 "--tls-ca for client certificates");
        return KVP_ERR_INVALID_ARG;
    }
    if (cfg->tls_crl[0] && !cfg->tls_ca[0]) {
        snprintf(err, err_len,
                 "--tls-crl revokes client certificates: it needs --tls-ca (the CA "
                 "that signs them)");
        return KVP_ERR_INVALID_ARG;
    }
    if (cfg->acl_file[0] && !tls) {
        snprintf(err, err_len,
                 "--acl-file needs TLS (--tls-cert, --tls-key): tokens and "
                 "principals are never sent in the clear");
        return KVP_ERR_INVALID_ARG;
    }
    if (tls && strcmp(cfg->auth, "none") == 0) {
        snprintf(err, err_len,
                 "--auth none opens the port to anyone: it cannot go with --tls-cert "
                 "and --acl-file");
        return KVP_ERR_INVALID_ARG;
    }
    if (cfg->ssd_evict_low > cfg->ssd_evict_high) {
        snprintf(err, err_len, "--ssd-evict-low-watermark must not exceed the high one");
        return KVP_ERR_INVALID_ARG;
    }
    if (cfg->dfs_evict_low > cfg->dfs_evict_high) {
        snprintf(err, err_len, "--dfs-evict-low-watermark must not exceed the high one");
        return KVP_ERR_INVALID_ARG;
    }
    /* as common/http.c takes it, checked before the control port is bound: a mistyped
     * value is named, whatever else is wrong with the start */
    struct sockaddr_in sa;
    if (strcmp(cfg->http_listen, "off") != 0 && !kvp_http_listen_addr(cfg->http_listen, &sa)) {
        snprintf(err, err_len, "--http-listen needs IPV4:PORT or off, got '%.64s'",
                 cfg->http_listen);
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}
