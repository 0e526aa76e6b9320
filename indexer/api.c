/*
 * api.c - the HTTP API of kvpool-indexer (api.h; docs/indexer.md, "HTTP API"): Mooncake
 * Conductor's /register, /unregister, /query, /query_by_hash with its field names and
 * answers, and /instances, /health, /metrics.
 *
 * Every refusal is a JSON {"error": ...} with a 4xx and a count in
 * kvpool_indexer_http_refused_total{reason}; nothing of a refused request is applied.
 *
 * Thread: the HTTP server's; the index is reached through its lock.
 */
#include "indexer/api.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "common/acl.h"
#include "common/http_auth.h"
#include "common/json.h"
#include "common/log.h"

static void put_reply(void *arg, const char *s, size_t len)
{
    kvp_http_append(arg, s, len);
}

static void fail(kvp_api_t *api, kvp_http_reply_t *r, unsigned status, const char *reason,
                 const char *msg)
{
    kvp_idx_count_refused(api->idx, reason);
    r->status = status;
    r->content_type = "application/json";
    r->len = 0;
    kvp_http_printf(r, "{\"error\":");
    kvp_http_json_string(r, msg, strlen(msg));
    kvp_http_printf(r, "}\n");
}

/* A string field: required, or default def (NULL: required). false: err says why. */
static bool field_str(const kvp_json_t *j, const char *key, const char *def, char *out, size_t cap,
                      char *err, size_t err_len)
{
    int64_t t = kvp_json_get(j, 0, key);
    if (t < 0 || j->t[t].type == KVP_J_NULL) {
        if (def == NULL) {
            snprintf(err, err_len, "\"%s\" is required", key);
            return false;
        }
        snprintf(out, cap, "%s", def);
        return true;
    }
    if (!kvp_json_str(j, (uint32_t)t, out, cap)) {
        snprintf(err, err_len, "\"%s\" must be a string of at most %zu bytes", key, cap - 1);
        return false;
    }
    for (const char *s = out; *s != '\0'; s++)
        if ((unsigned char)*s < 0x20) {
            snprintf(err, err_len, "\"%s\" has a control character", key);
            return false;
        }
    return true;
}

/* An integer field in min..max, required (has_def false) or def. */
static bool field_uint(const kvp_json_t *j, const char *key, bool has_def, uint64_t def,
                       uint64_t min, uint64_t max, uint64_t *v, char *err, size_t err_len)
{
    int64_t t = kvp_json_get(j, 0, key);
    if (t < 0 || j->t[t].type == KVP_J_NULL) {
        if (!has_def) {
            snprintf(err, err_len, "\"%s\" is required", key);
            return false;
        }
        *v = def;
        return true;
    }
    if (!kvp_json_u64(j, (uint32_t)t, v) || *v < min || *v > max) {
        snprintf(err, err_len, "\"%s\" must be an integer in %" PRIu64 "..%" PRIu64, key, min, max);
        return false;
    }
    return true;
}

/* An endpoint the indexer may dial: tcp://HOST:PORT, HOST a name (letters, digits, '.', '-'),
 * an IPv4 address or [an IPv6 address], PORT 1..65535, nothing else (no ipc://, inproc://,
 * no libzmq source-address or interface forms). Its host into host (no brackets). */
static bool endpoint_parse(const char *e, char *host, size_t cap)
{
    if (strncmp(e, "tcp://", 6) != 0)
        return false;
    const char *h = e + 6, *colon;
    size_t hl;
    if (*h == '[') {
        const char *rb = strchr(++h, ']');
        if (rb == NULL || rb[1] != ':')
            return false;
        hl = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(h, ':');
        if (colon == NULL || *h == '-')
            return false;
        hl = (size_t)(colon - h);
        for (const char *c = h; c < colon; c++)
            if (!isalnum((unsigned char)*c) && *c != '.' && *c != '-')
                return false;
    }
    if (hl == 0 || hl >= cap)
        return false;
    memcpy(host, h, hl);
    host[hl] = '\0';
    uint8_t a6[16];
    if (e[6] == '[' && inet_pton(AF_INET6, host, a6) != 1)
        return false;
    const char *d = colon + 1;
    size_t nd = strspn(d, "0123456789");
    if (nd == 0 || nd > 5 || d[nd] != '\0')
        return false;
    long port = strtol(d, NULL, 10);
    return port >= 1 && port <= 65535;
}

/* Is host an address of a network of --publisher-allow? (A name never is: what it resolves
 * to may change after the check.) */
static bool publisher_allowed(const kvp_api_t *api, const char *host)
{
    uint8_t a[16];
    int fam = inet_pton(AF_INET, host, a) == 1    ? AF_INET
              : inet_pton(AF_INET6, host, a) == 1 ? AF_INET6
                                                  : 0;
    for (unsigned i = 0; fam != 0 && i < api->n_allow; i++) {
        const kvp_api_net_t *n = &api->allow[i];
        if (n->family != fam)
            continue;
        unsigned full = n->prefix / 8, rest = n->prefix % 8;
        if (memcmp(a, n->addr, full) != 0)
            continue;
        if (rest != 0 && ((a[full] ^ n->addr[full]) & (uint8_t)(0xff << (8 - rest))) != 0)
            continue;
        return true;
    }
    return false;
}

bool kvp_api_set_publisher_allow(kvp_api_t *api, const char *list, char *err, size_t err_len)
{
    api->n_allow = 0;
    const char *p = list;
    while (*p != '\0') {
        size_t len = strcspn(p, ",");
        char item[80], *slash;
        if (len == 0 || len >= sizeof(item) || api->n_allow == KVP_API_ALLOW_MAX) {
            snprintf(err, err_len, "--publisher-allow: at most %d networks, each ADDR[/BITS]",
                     KVP_API_ALLOW_MAX);
            return false;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        kvp_api_net_t *n = &api->allow[api->n_allow];
        memset(n, 0, sizeof(*n));
        long bits = -1;
        if ((slash = strchr(item, '/')) != NULL) {
            *slash = '\0';
            char *end;
            bits = strtol(slash + 1, &end, 10);
            if (slash[1] == '\0' || *end != '\0')
                bits = 999;
        }
        n->family = inet_pton(AF_INET, item, n->addr) == 1    ? AF_INET
                    : inet_pton(AF_INET6, item, n->addr) == 1 ? AF_INET6
                                                              : 0;
        long max = n->family == AF_INET ? 32 : 128;
        if (n->family == 0 || bits > max || (slash != NULL && bits < 0)) {
            snprintf(err, err_len,
                     "--publisher-allow: \"%s\" is not an IPv4 or IPv6 address with an "
                     "optional /BITS",
                     item);
            return false;
        }
        n->prefix = (unsigned)(bits < 0 ? max : bits);
        api->n_allow++;
        p += len + (p[len] == ',');
    }
    return true;
}

/* endpoint and replay (""): dialable (tcp://) and, with --publisher-allow, allowed. 0, or 400
 * with err and the refusal counted by its reason. */
static unsigned check_endpoints(kvp_api_t *api, const char *endpoint, const char *replay, char *err,
                                size_t err_len)
{
    const char *es[2] = {endpoint, replay};
    const char *names[2] = {"endpoint", "replay_endpoint"};
    for (int i = 0; i < 2; i++) {
        char host[KVP_IDX_ENDPOINT_MAX];
        if (i == 1 && replay[0] == '\0')
            break;
        if (!endpoint_parse(es[i], host, sizeof(host))) {
            snprintf(err, err_len,
                     "\"%s\" must be tcp://HOST:PORT (HOST a name, an IPv4 address or "
                     "[IPv6]; PORT 1..65535): the indexer dials no other transport",
                     names[i]);
            atomic_fetch_add(&api->reg_refused[KVP_API_REG_endpoint], 1);
            return 400;
        }
        if (api->n_allow > 0 && !publisher_allowed(api, host)) {
            snprintf(err, err_len,
                     "\"%s\": %.100s is not in --publisher-allow (an IP address of an allowed "
                     "network; host names are not taken with it)",
                     names[i], host);
            atomic_fetch_add(&api->reg_refused[KVP_API_REG_publisher_allow], 1);
            return 400;
        }
    }
    return 0;
}

static const char *const reg_reasons[] = {
    "endpoint",      "publisher_allow", "tenant_registrations", "tenant_subscriptions",
    "registrations", "subscriptions",   "publishers",           "scopes",
    "tenant_scopes", "subscribe"};
_Static_assert(sizeof(reg_reasons) / sizeof(reg_reasons[0]) == KVP_API_REG_N, "a name each");

/* The count of a refusal by the index (kvp_idx_reg_params_t's reason_p). */
static void count_reg_refused(kvp_api_t *api, const char *reason)
{
    for (size_t i = 0; i < KVP_API_REG_N; i++)
        if (strcmp(reg_reasons[i], reason) == 0)
            atomic_fetch_add(&api->reg_refused[i], 1);
}

static void put_reg_refused(kvp_api_t *api, kvp_http_reply_t *r)
{
    kvp_http_printf(r, "# HELP kvpool_indexer_registrations_refused_total Registrations "
                       "refused, by reason.\n"
                       "# TYPE kvpool_indexer_registrations_refused_total counter\n");
    for (size_t i = 0; i < KVP_API_REG_N; i++)
        kvp_http_printf(r,
                        "kvpool_indexer_registrations_refused_total{reason=\"%s\"} %" PRIu64 "\n",
                        reg_reasons[i], atomic_load(&api->reg_refused[i]));
}

/* Parse body as an object; 0, or the status (err says why). */
static unsigned parse_object(kvp_json_t *j, const char *text, size_t len, char *err, size_t err_len)
{
    kvp_json_rc_t rc = kvp_json_parse(j, text, len, err, err_len);
    if (rc == KVP_JSON_TOO_BIG)
        return 413;
    if (rc == KVP_JSON_NOMEM)
        return 503;
    if (rc != KVP_JSON_OK)
        return 400;
    if (j->t[0].type != KVP_J_OBJECT) {
        snprintf(err, err_len, "the body must be a JSON object");
        return 400;
    }
    return 0;
}

/* The tenant a request names: its tenant_id ("" or absent: the principal's, or
 * "default"); a principal of a tenant may name only its own (admins: any). 0, or 403 with
 * err. */
static unsigned tenant_of(const kvp_principal_t *who, char *tenant, size_t cap, char *err,
                          size_t err_len)
{
    if (tenant[0] == '\0')
        snprintf(tenant, cap, "%s", who != NULL ? who->tenant : "default");
    if (who != NULL && !(who->roles & KVP_ROLE_ADMIN) && strcmp(tenant, who->tenant) != 0) {
        snprintf(err, err_len, "principal %.50s (tenant %.63s) may not name tenant %.63s",
                 who->name, who->tenant, tenant);
        return 403;
    }
    return 0;
}

/* The refusal reason counted for an HTTP status. */
static const char *reason_of(unsigned st)
{
    return st == 413 ? "body" : st == 400 ? "field" : st == 403 ? "tenant" : "json";
}

/* Register p, and wait until the subscriber thread has its socket: one it cannot make
 * undoes the registration (503). 0, or the HTTP status with err (the refusal counted). */
static unsigned serve(kvp_api_t *api, kvp_idx_reg_params_t *p, char *err, size_t err_len)
{
    bool changed;
    const char *reason = "field";
    p->reason_p = &reason;
    kvp_idx_wrlock(api->idx);
    kvp_status_t s = kvp_idx_register(api->idx, p, &changed, err, err_len);
    kvp_idx_unlock(api->idx);
    if (s == KVP_ERR_NOMEM) {
        snprintf(err, err_len, "out of memory");
        return 503;
    }
    if (s != KVP_OK) {
        count_reg_refused(api, reason);
        return s == KVP_ERR_TOO_MANY ? 429 : 400;
    }
    if (api->sub == NULL)
        return 0; /* at start: the subscriber thread is not running yet */
    if (!kvp_sub_sync(api->sub, KVP_API_SYNC_MS)) {
        KVP_LOG_WARN("registered %s|%s|%u: the subscriber thread has not yet subscribed to %s "
                     "(busy for %u ms): it will",
                     p->instance, p->tenant, p->dp_rank, p->endpoint, KVP_API_SYNC_MS);
        return 0;
    }
    kvp_idx_rdlock(api->idx);
    bool failed = kvp_idx_sub_failed(api->idx, p->tenant, p->endpoint);
    kvp_idx_unlock(api->idx);
    if (!failed)
        return 0;
    kvp_idx_wrlock(api->idx);
    kvp_status_t undone =
        kvp_idx_drop_publisher(api->idx, p->instance, p->tenant, p->dp_rank, p->endpoint);
    kvp_idx_unlock(api->idx);
    kvp_sub_wake(api->sub);
    atomic_fetch_add(&api->reg_refused[KVP_API_REG_subscribe], 1);
    snprintf(err, err_len,
             "cannot subscribe to %.100s: the indexer could not make its ZeroMQ socket (out of "
             "sockets or file descriptors: see its log); %s",
             p->endpoint,
             undone == KVP_OK ? "not registered"
                              : "the registration had it before and keeps it, unsubscribed "
                                "until a later change tries again");
    return 503;
}

unsigned kvp_api_register_json(kvp_api_t *api, const char *text, size_t len,
                               const char *default_instance, const kvp_principal_t *who, char *err,
                               size_t err_len)
{
    kvp_json_t j;
    unsigned st = parse_object(&j, text, len, err, err_len);
    if (st != 0) {
        kvp_json_free(&j);
        return st;
    }
    char endpoint[KVP_IDX_ENDPOINT_MAX], replay[KVP_IDX_ENDPOINT_MAX], type[32];
    char model[KVP_IDX_NAME_MAX], lora[KVP_IDX_NAME_MAX], tenant[KVP_IDX_NAME_MAX];
    char instance[KVP_IDX_NAME_MAX], salt[KVP_IDX_NAME_MAX], ip[200];
    char curve[KVP_IDX_CURVE_KEY_LEN + 2];
    uint64_t bs, rank, port;
    bool ok = true;
    /* an older Conductor file names ip and port instead of endpoint */
    if (kvp_json_get(&j, 0, "endpoint") < 0 && kvp_json_get(&j, 0, "ip") >= 0) {
        ok = field_str(&j, "ip", NULL, ip, sizeof(ip), err, err_len) &&
             field_uint(&j, "port", false, 0, 1, 65535, &port, err, err_len);
        if (ok)
            snprintf(endpoint, sizeof(endpoint), "tcp://%s:%" PRIu64, ip, port);
    } else {
        ok = field_str(&j, "endpoint", NULL, endpoint, sizeof(endpoint), err, err_len);
    }
    ok = ok && field_str(&j, "replay_endpoint", "", replay, sizeof(replay), err, err_len) &&
         field_str(&j, "type", NULL, type, sizeof(type), err, err_len) &&
         field_str(&j, "modelname", NULL, model, sizeof(model), err, err_len) &&
         field_str(&j, "lora_name", "", lora, sizeof(lora), err, err_len) &&
         field_str(&j, "tenant_id", "", tenant, sizeof(tenant), err, err_len) &&
         field_str(&j, "instance_id", default_instance, instance, sizeof(instance), err, err_len) &&
         field_uint(&j, "block_size", false, 0, 1, KVP_IDX_BLOCK_SIZE_MAX, &bs, err, err_len) &&
         field_uint(&j, "dp_rank", default_instance != NULL, 0, 0, KVP_IDX_RANK_MAX, &rank, err,
                    err_len) &&
         field_str(&j, "additionalsalt", "", salt, sizeof(salt), err, err_len) &&
         field_str(&j, "curve_server_key", "", curve, sizeof(curve), err, err_len);
    kvp_json_free(&j);
    if (!ok)
        return 400;
    unsigned ts = tenant_of(who, tenant, sizeof(tenant), err, err_len);
    if (ts != 0)
        return ts;
    if ((ts = check_endpoints(api, endpoint, replay, err, err_len)) != 0)
        return ts;
    uint8_t key[32];
    if (curve[0] != '\0' &&
        (strlen(curve) != KVP_IDX_CURVE_KEY_LEN || zmq_z85_decode(key, curve) == NULL)) {
        snprintf(err, err_len,
                 "\"curve_server_key\" must be a CURVE public key: 40 Z85 "
                 "characters (the publisher's NAME.pub)");
        return 400;
    }
    if (curve[0] != '\0' && !api->curve_on) {
        snprintf(err, err_len,
                 "\"curve_server_key\" given, but this indexer has no CURVE key "
                 "pair (start it with --curve-secret FILE)");
        return 400;
    }
    if (instance[0] == '\0' || model[0] == '\0' || type[0] == '\0') {
        snprintf(err, err_len, "\"instance_id\", \"modelname\" and \"type\" must not be empty");
        return 400;
    }
    kvp_idx_reg_params_t p = {.endpoint = endpoint,
                              .replay_endpoint = replay,
                              .curve_server_key = curve,
                              .type = type,
                              .model = model,
                              .lora = lora,
                              .tenant = tenant,
                              .instance = instance,
                              .salt = salt,
                              .block_size = (uint32_t)bs,
                              .dp_rank = (uint32_t)rank};
    if ((ts = serve(api, &p, err, err_len)) != 0)
        return ts;
    KVP_LOG_INFO("registered %s|%s|%u: %s (%s), model %s, block size %u", instance, tenant,
                 (unsigned)rank, endpoint, type, model, (unsigned)bs);
    return 0;
}

typedef struct text {
    char *s;
    size_t n, cap;
    bool oom;
} text_t;

static void text_put(void *arg, const char *s, size_t len)
{
    text_t *t = arg;
    if (t->oom)
        return;
    if (t->n + len + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->n + len + 1)
            cap *= 2;
        char *b = realloc(t->s, cap);
        if (b == NULL) {
            t->oom = true;
            return;
        }
        t->s = b;
        t->cap = cap;
    }
    memcpy(t->s + t->n, s, len);
    t->n += len;
}

bool kvp_api_save(kvp_api_t *api)
{
    if (api->state == NULL)
        return true;
    pthread_mutex_lock(&api->state_lock);
    text_t t = {0};
    kvp_idx_rdlock(api->idx);
    kvp_idx_registrations_json(api->idx, text_put, &t);
    kvp_idx_unlock(api->idx);
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", api->state);
    bool ok = !t.oom;
    int fd = ok ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    ok = fd >= 0 && write(fd, t.s, t.n) == (ssize_t)t.n && fsync(fd) == 0;
    if (fd >= 0 && close(fd) != 0)
        ok = false;
    ok = ok && rename(tmp, api->state) == 0;
    if (!ok) {
        KVP_LOG_ERROR("--state-dir: cannot write %s (%m): a restart would not know the "
                      "registrations made since the last write",
                      api->state);
        unlink(tmp);
    }
    free(t.s);
    pthread_mutex_unlock(&api->state_lock);
    return ok;
}

static void do_register(kvp_api_t *api, const kvp_http_request_t *req, kvp_http_reply_t *r,
                        const kvp_principal_t *who)
{
    size_t len;
    const char *body = kvp_http_body(req, &len);
    char err[256];
    unsigned st = kvp_api_register_json(api, body, len, NULL, who, err, sizeof(err));
    if (st != 0) {
        fail(api, r, st, st == 429 || st == 503 ? "field" : reason_of(st), err);
        return;
    }
    char instance[KVP_IDX_NAME_MAX] = "";
    kvp_json_t j;
    if (kvp_json_parse(&j, body, len, err, sizeof(err)) == KVP_JSON_OK)
        (void)field_str(&j, "instance_id", "", instance, sizeof(instance), err, sizeof(err));
    kvp_json_free(&j);
    (void)kvp_api_save(api);
    r->content_type = "application/json";
    kvp_http_printf(r, "{\"status\":\"registered successfully\",\"instance_id\":");
    kvp_http_json_string(r, instance, strlen(instance));
    kvp_http_printf(r, "}\n");
}

typedef struct removed {
    kvp_http_reply_t *r;
    unsigned n;
} removed_t;

static void removed_one(void *arg, const char *name)
{
    removed_t *x = arg;
    if (x->n++ > 0)
        kvp_http_append(x->r, ",", 1);
    kvp_http_json_string(x->r, name, strlen(name));
}

static void do_unregister(kvp_api_t *api, const kvp_http_request_t *req, kvp_http_reply_t *r,
                          const kvp_principal_t *who)
{
    size_t len;
    const char *body = kvp_http_body(req, &len);
    char err[256], instance[KVP_IDX_NAME_MAX], tenant[KVP_IDX_NAME_MAX];
    kvp_json_t j;
    unsigned st = parse_object(&j, body, len, err, sizeof(err));
    uint64_t rank = 0;
    bool all = false;
    if (st == 0) {
        all = kvp_json_get(&j, 0, "dp_rank") < 0 ||
              j.t[kvp_json_get(&j, 0, "dp_rank")].type == KVP_J_NULL;
        if (!field_str(&j, "instance_id", NULL, instance, sizeof(instance), err, sizeof(err)) ||
            !field_str(&j, "tenant_id", "", tenant, sizeof(tenant), err, sizeof(err)) ||
            (!all &&
             !field_uint(&j, "dp_rank", false, 0, 0, KVP_IDX_RANK_MAX, &rank, err, sizeof(err))))
            st = 400;
        else
            st = tenant_of(who, tenant, sizeof(tenant), err, sizeof(err));
    }
    kvp_json_free(&j);
    if (st != 0) {
        fail(api, r, st, reason_of(st), err);
        return;
    }
    r->content_type = "application/json";
    kvp_http_printf(r, "{\"status\":\"unregistered successfully\",\"removed_instances\":[");
    removed_t x = {.r = r};
    kvp_idx_wrlock(api->idx);
    kvp_status_t s =
        kvp_idx_unregister(api->idx, instance, tenant, all, (uint32_t)rank, removed_one, &x);
    kvp_idx_unlock(api->idx);
    if (s != KVP_OK) {
        char msg[KVP_IDX_NAME_MAX * 2 + 64];
        snprintf(msg, sizeof(msg), "no registration of instance %s in tenant %s%s", instance,
                 tenant, all ? "" : " with that dp_rank");
        fail(api, r, 404, "field", msg);
        return;
    }
    if (api->sub != NULL)
        kvp_sub_wake(api->sub);
    (void)kvp_api_save(api);
    kvp_http_printf(r, "]}\n");
}

static void do_query(kvp_api_t *api, const kvp_http_request_t *req, kvp_http_reply_t *r,
                     bool by_hash, const kvp_principal_t *who)
{
    size_t len;
    const char *body = kvp_http_body(req, &len);
    char err[256], model[KVP_IDX_NAME_MAX], lora[KVP_IDX_NAME_MAX], tenant[KVP_IDX_NAME_MAX],
        instance[KVP_IDX_NAME_MAX], salt[KVP_IDX_NAME_MAX];
    kvp_json_t j;
    unsigned st = parse_object(&j, body, len, err, sizeof(err));
    uint64_t bs = 0;
    uint64_t *hashes = NULL;
    uint32_t *tokens = NULL;
    size_t n = 0;
    bool has_instance = false;
    if (st != 0)
        goto out;
    st = 400;
    if (!field_str(&j, "model", NULL, model, sizeof(model), err, sizeof(err)) ||
        !field_str(&j, "tenant_id", "", tenant, sizeof(tenant), err, sizeof(err)) ||
        !field_str(&j, "cache_salt", "", salt, sizeof(salt), err, sizeof(err)) ||
        !field_uint(&j, "block_size", false, 0, 1, KVP_IDX_BLOCK_SIZE_MAX, &bs, err, sizeof(err)))
        goto out;
    int64_t ln = kvp_json_get(&j, 0, "lora_name"), li = kvp_json_get(&j, 0, "lora_id");
    bool has_ln = ln >= 0 && j.t[ln].type != KVP_J_NULL;
    bool has_li = li >= 0 && j.t[li].type != KVP_J_NULL;
    if (has_ln && has_li) {
        snprintf(err, sizeof(err), "\"lora_id\" is deprecated: give \"lora_name\" alone");
        goto out;
    }
    lora[0] = '\0';
    if (has_ln && !field_str(&j, "lora_name", "", lora, sizeof(lora), err, sizeof(err)))
        goto out;
    if (has_li) { /* the deprecated id: negative is the base model, else its decimal */
        const kvp_json_tok_t *t = &j.t[li];
        uint64_t v;
        if (t->type != KVP_J_NUMBER) {
            snprintf(err, sizeof(err), "\"lora_id\" must be an integer");
            goto out;
        }
        if (kvp_json_u64(&j, (uint32_t)li, &v))
            snprintf(lora, sizeof(lora), "%" PRIu64, v);
        else if (j.text[t->start] != '-') {
            snprintf(err, sizeof(err), "\"lora_id\" must be an integer");
            goto out;
        }
    }
    int64_t it = kvp_json_get(&j, 0, "instance_id");
    has_instance = it >= 0 && j.t[it].type != KVP_J_NULL;
    if (has_instance &&
        !field_str(&j, "instance_id", "", instance, sizeof(instance), err, sizeof(err)))
        goto out;
    if ((st = tenant_of(who, tenant, sizeof(tenant), err, sizeof(err))) != 0)
        goto out;
    st = 400;
    const char *arr_key = by_hash ? "seq_hashes" : "token_ids";
    int64_t a = kvp_json_get(&j, 0, arr_key);
    if (by_hash && a < 0) {
        arr_key = "block_hash";
        a = kvp_json_get(&j, 0, arr_key);
    }
    if (a < 0 || j.t[a].type != KVP_J_ARRAY) {
        snprintf(err, sizeof(err), "\"%s\" (an array) is required",
                 by_hash ? "seq_hashes" : "token_ids");
        goto out;
    }
    size_t count = j.t[a].size;
    n = by_hash ? count : count / bs;
    hashes = malloc((n ? n : 1) * sizeof(*hashes));
    tokens = by_hash ? NULL : malloc((count ? count : 1) * sizeof(*tokens));
    if (hashes == NULL || (!by_hash && tokens == NULL)) {
        st = 503;
        snprintf(err, sizeof(err), "out of memory");
        goto out;
    }
    uint32_t e = (uint32_t)a + 1;
    for (size_t i = 0; i < count; i++, e = j.t[e].next) {
        uint64_t v;
        if (!kvp_json_u64(&j, e, &v) || (!by_hash && v > UINT32_MAX)) {
            snprintf(err, sizeof(err), "\"%s\"[%zu] must be an integer in 0..%s", arr_key, i,
                     by_hash ? "2^64-1" : "2^32-1");
            goto out;
        }
        if (by_hash)
            hashes[i] = v;
        else
            tokens[i] = (uint32_t)v;
    }
    st = 0;
out:
    kvp_json_free(&j);
    if (st != 0) {
        free(hashes);
        free(tokens);
        fail(api, r, st, reason_of(st), err);
        return;
    }
    kvp_idx_count_query(api->idx, by_hash);
    kvp_idx_query_t q = {.model = model,
                         .lora = lora,
                         .tenant = tenant,
                         .salt = salt,
                         .instance = has_instance ? instance : NULL,
                         .block_size = (uint32_t)bs,
                         .hashes = hashes,
                         .n = n};
    if (!by_hash)
        kvp_idx_hash_tokens(api->seed, tokens, n, (uint32_t)bs, false, 0, hashes);
    r->content_type = "application/json";
    kvp_idx_rdlock(api->idx);
    kvp_status_t s = kvp_idx_query(api->idx, &q, put_reply, r);
    kvp_idx_unlock(api->idx);
    free(hashes);
    free(tokens);
    if (s != KVP_OK)
        fail(api, r, 503, "json", "out of memory");
    else
        kvp_http_append(r, "\n", 1);
}

/* May this request be served (protected mode's peer; with an ACL, a principal with the role
 * the path needs)? false: answered (401/403, counted). From the head alone (kvp_api_admit). */
static bool admitted(kvp_api_t *api, const char *path, const kvp_http_request_t *req,
                     kvp_http_reply_t *reply, const kvp_principal_t **who_p)
{
    if (api->protected_mode && !kvp_http_peer_is_loopback(req)) {
        fail(api, reply, 403, "peer",
             "protected mode: requests from this host only (start kvpool-indexer with "
             "--auth none to serve others)");
        return false;
    }
    const kvp_principal_t *who = NULL;
    if (api->acl != NULL && strcmp(path, "/health") != 0 && strcmp(path, "/metrics") != 0) {
        /* a bearer token, or else a client certificate verified against --tls-ca and
         * --tls-crl (common/http_auth.h) */
        if ((who = kvp_http_principal(req, api->acl, api->tls)) == NULL) {
            fail(api, reply, 401, "unauthenticated",
                 "authentication required: send Authorization: Bearer TOKEN, or a client "
                 "certificate, of a principal the ACL names");
            KVP_LOG_WARN_LIMITED("indexer: a request for %s refused: no principal", path);
            return false;
        }
        /* registering needs role write, asking role read; an admin may do both */
        uint32_t need = strcmp(path, "/register") == 0 || strcmp(path, "/unregister") == 0
                            ? KVP_ROLE_WRITE
                            : KVP_ROLE_READ;
        if (!(who->roles & (need | KVP_ROLE_ADMIN))) {
            char msg[KVP_ACL_NAME_MAX + 64];
            snprintf(msg, sizeof(msg), "principal %s may not call %s: it needs role %s", who->name,
                     path, need == KVP_ROLE_WRITE ? "write" : "read");
            fail(api, reply, 403, "role", msg);
            return false;
        }
    }
    *who_p = who;
    return true;
}

static void handle(kvp_api_t *api, const char *path, const kvp_http_request_t *req,
                   kvp_http_reply_t *reply)
{
    const char *m = kvp_http_method(req);
    bool post = strcmp(m, "POST") == 0;
    bool get = strcmp(m, "GET") == 0 || strcmp(m, "HEAD") == 0;
    const kvp_principal_t *who = NULL;
    if (!admitted(api, path, req, reply, &who))
        return;
    static const char *posts[] = {"/register", "/unregister", "/query", "/query_by_hash"};
    static const char *gets[] = {"/instances", "/health", "/metrics"};
    for (size_t i = 0; i < 4; i++)
        if (strcmp(path, posts[i]) == 0) {
            if (!post) {
                fail(api, reply, 405, "method", "use POST");
                return;
            }
            if (i == 0)
                do_register(api, req, reply, who);
            else if (i == 1)
                do_unregister(api, req, reply, who);
            else {
                kvp_idx_query_begin(api->idx); /* batches wait for it (kvp_idx_yield) */
                do_query(api, req, reply, i == 3, who);
                kvp_idx_query_end(api->idx);
            }
            return;
        }
    for (size_t i = 0; i < 3; i++)
        if (strcmp(path, gets[i]) == 0) {
            if (!get) {
                fail(api, reply, 405, "method", "use GET");
                return;
            }
            if (i == 0) {
                reply->content_type = "application/json";
                kvp_idx_instances_json(
                    api->idx, who != NULL && !(who->roles & KVP_ROLE_ADMIN) ? who->tenant : NULL,
                    put_reply, reply); /* a tenant's principal: its tenant's only */
                kvp_http_append(reply, "\n", 1);
            } else if (i == 1) {
                reply->content_type = "application/json";
                kvp_http_printf(reply, "{\"status\":\"ok\"}\n");
            } else {
                reply->content_type = "text/plain; version=0.0.4";
                kvp_idx_metrics(api->idx, put_reply, reply);
                /* the series naming tenants: an admin's scrape, or all without an ACL */
                const kvp_principal_t *adm =
                    api->acl != NULL ? kvp_http_principal(req, api->acl, api->tls) : NULL;
                if (api->acl == NULL || (adm != NULL && (adm->roles & KVP_ROLE_ADMIN)))
                    kvp_idx_metrics_tenants(api->idx, put_reply, reply);
                kvp_http_metrics(req, "kvpool_indexer_http", reply); /* the server's caps */
                put_reg_refused(api, reply);
            }
            return;
        }
    fail(api, reply, 404, "path", "no such endpoint");
}

void kvp_api_too_big(void *arg)
{
    kvp_api_t *api = arg;
    kvp_idx_count_refused(api->idx, "body");
}

void kvp_api_handle(void *arg, const char *path, const kvp_http_request_t *req,
                    kvp_http_reply_t *reply)
{
    kvp_api_t *api = arg;
    pthread_rwlock_rdlock(&api->acl_lock); /* the principal found stays valid meanwhile */
    handle(api, path, req, reply);
    pthread_rwlock_unlock(&api->acl_lock);
}

bool kvp_api_admit(void *arg, const char *path, const kvp_http_request_t *req,
                   kvp_http_reply_t *reply)
{
    kvp_api_t *api = arg;
    const kvp_principal_t *who = NULL;
    bool body = strcmp(kvp_http_method(req), "POST") == 0 &&
                (strcmp(path, "/register") == 0 || strcmp(path, "/unregister") == 0 ||
                 strcmp(path, "/query") == 0 || strcmp(path, "/query_by_hash") == 0);
    pthread_rwlock_rdlock(&api->acl_lock);
    bool ok = admitted(api, path, req, reply, &who);
    if (ok && !body) { /* a request that takes no body: answered now (404, 405), none read */
        handle(api, path, req, reply);
        ok = false;
    }
    if (ok && who != NULL) /* its body counts against its tenant's budget, not everyone's */
        kvp_http_charge(req, who->tenant, who->name);
    pthread_rwlock_unlock(&api->acl_lock);
    return ok;
}

void kvp_api_reload_acl(kvp_api_t *api, const char *path)
{
    kvp_acl_t *acl;
    char err[512];
    if (kvp_acl_load(path, &acl, err, sizeof(err)) != KVP_OK) {
        KVP_LOG_ERROR("ACL reload failed, the old ACL stays: %s: %s", path, err);
        return;
    }
    pthread_rwlock_wrlock(&api->acl_lock);
    kvp_acl_t *old = api->acl;
    api->acl = acl;
    pthread_rwlock_unlock(&api->acl_lock);
    kvp_acl_destroy(old);
    KVP_LOG_INFO("ACL reloaded from %s: %zu principals", path, acl->n);
}
