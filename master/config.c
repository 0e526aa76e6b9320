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
#include "master/config.h"

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
} setting_kind_t;

typedef struct setting {
    const char *name;
    setting_kind_t kind;
    size_t offset;
} setting_t;

static const setting_t settings[] = {
    {"evict-high-watermark", FRACTION, offsetof(kvp_master_config_t, evict_high)},
    {"evict-low-watermark", FRACTION, offsetof(kvp_master_config_t, evict_low)},
    {"lease-ttl", SECONDS_MS, offsetof(kvp_master_config_t, lease_ttl_ms)},
    {"put-timeout", SECONDS_MS, offsetof(kvp_master_config_t, put_timeout_ms)},
    {"client-ttl", SECONDS_MS, offsetof(kvp_master_config_t, client_ttl_ms)},
    {"soft-pin-ttl", SECONDS_S, offsetof(kvp_master_config_t, soft_pin_ttl_s)},
    {"no-eviction", SWITCH_OFF, offsetof(kvp_master_config_t, evict)},
    {"lease-on-exist", SWITCH_ON, offsetof(kvp_master_config_t, lease_on_exist)},
    {"offload-high-watermark", FRACTION, offsetof(kvp_master_config_t, offload_high)},
    {"offload-low-watermark", FRACTION, offsetof(kvp_master_config_t, offload_low)},
    {"ssd-evict-high-watermark", FRACTION, offsetof(kvp_master_config_t, ssd_evict_high)},
    {"ssd-evict-low-watermark", FRACTION, offsetof(kvp_master_config_t, ssd_evict_low)},
    {"promote-on-hit", ON_OFF, offsetof(kvp_master_config_t, promote_on_hit)},
    {"segment-records", ON_OFF, offsetof(kvp_master_config_t, segment_records)},
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
    cfg->lease_on_exist = false;
    cfg->offload_high = 0.95;
    cfg->offload_low = 0.90;
    cfg->ssd_evict_high = 0.95;
    cfg->ssd_evict_low = 0.90;
    cfg->promote_on_hit = true;
    cfg->segment_records = true;
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
    char *end;
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
    if (cfg->ssd_evict_low > cfg->ssd_evict_high) {
        snprintf(err, err_len, "--ssd-evict-low-watermark must not exceed the high one");
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}
