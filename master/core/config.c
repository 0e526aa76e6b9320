/*
 * config.c - the master's settings: their defaults, how a flag's value is
 * read into them, and the checks across settings.
 *
 * Design: one table names each setting by its kvpool-master flag, its kind
 * (a fraction 0..1, seconds stored as ms or s, a switch) and where it lives
 * in kvp_master_config_t, so main.c only maps getopt results here and a new
 * setting is one row. Values are read as before: strtod, 0..1 for
 * fractions, 0..one year for times.
 *
 * Thread: any (no state); the master calls it from main before the loop.
 */
#include "master/core/config.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macros.h"

typedef enum setting_kind {
    FRACTION,   /* double, 0..1 */
    SECONDS_MS, /* uint32_t milliseconds, given in (fractional) seconds */
    SECONDS_S,  /* uint32_t whole seconds */
    SWITCH_ON,  /* bool set to true, no value */
    SWITCH_OFF, /* bool set to false, no value */
    ON_OFF,     /* bool, value "on" or "off" */
    STRING,     /* char[size], a non-empty value that fits */
    COUNT,      /* uint32_t, 0..max */
} setting_kind_t;

typedef struct setting {
    const char *name;
    setting_kind_t kind;
    size_t offset;
    size_t size; /* STRING: the array's size; COUNT: the largest value */
} setting_t;

#define STR(name_, field_)                                                                         \
    {                                                                                              \
        name_, STRING, offsetof(kvp_master_config_t, field_),                                      \
            sizeof(((kvp_master_config_t *)0)->field_)                                             \
    }
#define CNT(name_, field_, max_)                                                                   \
    {                                                                                              \
        name_, COUNT, offsetof(kvp_master_config_t, field_), max_                                  \
    }

static const setting_t settings[] = {
    {"evict-high-watermark", FRACTION, offsetof(kvp_master_config_t, evict_high), 0},
    {"evict-low-watermark", FRACTION, offsetof(kvp_master_config_t, evict_low), 0},
    {"lease-ttl", SECONDS_MS, offsetof(kvp_master_config_t, lease_ttl_ms), 0},
    {"put-timeout", SECONDS_MS, offsetof(kvp_master_config_t, put_timeout_ms), 0},
    {"client-ttl", SECONDS_MS, offsetof(kvp_master_config_t, client_ttl_ms), 0},
    {"segment-grace", SECONDS_MS, offsetof(kvp_master_config_t, segment_grace_ms), 0},
    {"soft-pin-ttl", SECONDS_S, offsetof(kvp_master_config_t, soft_pin_ttl_s), 0},
    {"no-eviction", SWITCH_OFF, offsetof(kvp_master_config_t, evict), 0},
    {"lease-on-exist", SWITCH_ON, offsetof(kvp_master_config_t, lease_on_exist), 0},
    {"offload-high-watermark", FRACTION, offsetof(kvp_master_config_t, offload_high), 0},
    {"offload-low-watermark", FRACTION, offsetof(kvp_master_config_t, offload_low), 0},
    {"ssd-evict-high-watermark", FRACTION, offsetof(kvp_master_config_t, ssd_evict_high), 0},
    {"ssd-evict-low-watermark", FRACTION, offsetof(kvp_master_config_t, ssd_evict_low), 0},
    {"promote-on-hit", ON_OFF, offsetof(kvp_master_config_t, promote_on_hit), 0},
    {"segment-records", ON_OFF, offsetof(kvp_master_config_t, segment_records), 0},
    STR("http-listen", http_listen),
    STR("kv-events-bind", kv_events_bind),
    STR("kv-events-replay-bind", kv_events_replay),
    STR("kv-events-topic", kv_events_topic),
    CNT("kv-events-queue", kv_events_queue, 1u << 22),
    CNT("kv-events-replay-batches", kv_events_replay_batches, 1u << 20),
    STR("kv-events-model", kv_events_model),
    CNT("kv-events-block-size", kv_events_block_size, 1u << 24),
    STR("kv-events-tenant", kv_events_tenant),
    STR("kv-events-backend-id", kv_events_backend_id),
    CNT("kv-events-dp-rank", kv_events_dp_rank, 1u << 16),
    STR("kv-events-curve-secret", kv_events_curve_secret),
    STR("kv-events-curve-allow", kv_events_curve_allow),
    STR("auth", auth),
    STR("tls-cert", tls_cert),
    STR("tls-key", tls_key),
    STR("tls-ca", tls_ca),
    STR("tls-crl", tls_crl),
    STR("acl-file", acl_file),
    {"data-grants", ON_OFF, offsetof(kvp_master_config_t, data_grants), 0},
    STR("etcd-cacert", etcd_cacert),
    STR("etcd-cert", etcd_cert),
    STR("etcd-key", etcd_key),
    STR("etcd-user", etcd_user),
    STR("etcd-password-file", etcd_password_file),
};

void kvp_master_config_init(kvp_master_config_t *cfg)
{
    cfg->evict = true;
    cfg->evict_high = 1.0; /* off: puts evict what they need */
    cfg->evict_low = 0.98;
    cfg->lease_ttl_ms = 5000;
    cfg->put_timeout_ms = 30000;
    cfg->soft_pin_ttl_s = 1800;
    cfg->client_ttl_ms = 10000;
    cfg->segment_grace_ms = 60000;
    cfg->lease_on_exist = false;
    cfg->offload_high = 0.95;
    cfg->offload_low = 0.90;
    cfg->ssd_evict_high = 0.95;
    cfg->ssd_evict_low = 0.90;
    cfg->promote_on_hit = true;
    cfg->segment_records = true;
    cfg->data_grants = true;
    snprintf(cfg->http_listen, sizeof(cfg->http_listen), "127.0.0.1:9003");
    cfg->http_listen_given = false;
    cfg->kv_events_bind[0] = cfg->kv_events_replay[0] = '\0';
    snprintf(cfg->kv_events_topic, sizeof(cfg->kv_events_topic), "kvpool");
    cfg->kv_events_queue = 65536;
    cfg->kv_events_replay_batches = 4096;
    snprintf(cfg->kv_events_model, sizeof(cfg->kv_events_model), "kvpool");
    cfg->kv_events_block_size = 0;
    snprintf(cfg->kv_events_tenant, sizeof(cfg->kv_events_tenant), "default");
    snprintf(cfg->kv_events_backend_id, sizeof(cfg->kv_events_backend_id), "kvpool-master");
    cfg->kv_events_dp_rank = 0;
    cfg->kv_events_curve_secret[0] = cfg->kv_events_curve_allow[0] = '\0';
    snprintf(cfg->auth, sizeof(cfg->auth), "protected");
    cfg->tls_cert[0] = cfg->tls_key[0] = cfg->tls_ca[0] = cfg->tls_crl[0] = '\0';
    cfg->acl_file[0] = '\0';
    cfg->etcd_cacert[0] = cfg->etcd_cert[0] = cfg->etcd_key[0] = '\0';
    cfg->etcd_user[0] = cfg->etcd_password_file[0] = '\0';
}

kvp_status_t kvp_master_config_set(kvp_master_config_t *cfg, const char *name, const char *value,
                                   char *err, size_t err_len)
{
    const setting_t *s = NULL;
    for (size_t i = 0; i < KVP_ARRAY_SIZE(settings); i++)
        if (strcmp(settings[i].name, name) == 0)
            s = &settings[i];
    if (s == NULL) {
        snprintf(err, err_len, "no setting named %s", name);
        return KVP_ERR_NOT_FOUND;
    }
    char *field = (char *)cfg + s->offset;
    if (s->kind == SWITCH_ON || s->kind == SWITCH_OFF) {
        *(bool *)field = s->kind == SWITCH_ON;
        return KVP_OK;
    }
    if (s->kind == ON_OFF) {
        if (strcmp(value, "on") != 0 && strcmp(value, "off") != 0) {
            snprintf(err, err_len, "bad value '%s' for %s (on or off)", value, name);
            return KVP_ERR_INVALID_ARG;
        }
        *(bool *)field = strcmp(value, "on") == 0;
        return KVP_OK;
    }
    if (s->kind == STRING) {
        if (value[0] == '\0' || strlen(value) >= s->size) {
            snprintf(err, err_len, "--%s needs a value of 1..%zu bytes", name, s->size - 1);
            return KVP_ERR_INVALID_ARG;
        }
        memcpy(field, value, strlen(value) + 1);
        if (strcmp(name, "http-listen") == 0)
            cfg->http_listen_given = true;
        return KVP_OK;
    }
    char *end;
    if (s->kind == COUNT) {
        unsigned long long n = strtoull(value, &end, 10);
        if (*end != '\0' || end == value || value[0] == '-' || n > s->size) {
            snprintf(err, err_len, "--%s needs a whole number 0..%zu, got '%s'", name, s->size,
                     value);
            return KVP_ERR_INVALID_ARG;
        }
        *(uint32_t *)field = (uint32_t)n;
        return KVP_OK;
    }
    double v = strtod(value, &end);
    bool frac = s->kind == FRACTION;
    if (*end != '\0' || end == value || !(v >= 0) || (frac && v > 1) ||
        (!frac && v > 86400 * 365)) {
        snprintf(err, err_len, "bad value '%s' for %s", value,
                 frac ? "a watermark (0..1)" : "a time in seconds");
        return KVP_ERR_INVALID_ARG;
    }
    if (s->kind == FRACTION)
        *(double *)field = v;
    else if (s->kind == SECONDS_MS)
        *(uint32_t *)field = (uint32_t)(v * 1000);
    else
        *(uint32_t *)field = (uint32_t)v;
    return KVP_OK;
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
    return KVP_OK;
}
