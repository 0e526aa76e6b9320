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

#include <fcntl.h>
#include <inttypes.h>
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

static bool endpoint_ok(const char *e)
{
    return (strncmp(e, "tcp://", 6) == 0 && strlen(e) > 6 && strchr(e, '*') == NULL) ||
           (strncmp(e, "ipc://", 6) == 0 && strlen(e) > 6);
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
    if (!endpoint_ok(endpoint) || (replay[0] != '\0' && !endpoint_ok(replay))) {
        snprintf(err, err_len,
                 "\"endpoint\" and \"replay_endpoint\" must be tcp://HOST:PORT (or ipc://PATH)");
        return 400;
    }
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
    bool changed;
    kvp_idx_wrlock(api->idx);
    kvp_status_t s = kvp_idx_register(api->idx, &p, &changed, err, err_len);
    kvp_idx_unlock(api->idx);
    if (s == KVP_ERR_NOMEM) {
        snprintf(err, err_len, "out of memory");
        return 503;
    }
    if (s != KVP_OK)
        return 400;
    if (changed && api->sub != NULL)
        kvp_sub_wake(api->sub);
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
        fail(api, r, st, reason_of(st), err);
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

static void handle(kvp_api_t *api, const char *path, const kvp_http_request_t *req,
                   kvp_http_reply_t *reply)
{
    if (api->protected_mode && !kvp_http_peer_is_loopback(req)) {
        fail(api, reply, 403, "peer",
             "protected mode: requests from this host only (start kvpool-indexer with "
             "--auth none to serve others)");
        return;
    }
    const char *m = kvp_http_method(req);
    bool post = strcmp(m, "POST") == 0;
    bool get = strcmp(m, "GET") == 0 || strcmp(m, "HEAD") == 0;
    const kvp_principal_t *who = NULL;
    if (api->acl != NULL && strcmp(path, "/health") != 0 && strcmp(path, "/metrics") != 0) {
        /* a bearer token, or else a client certificate verified against --tls-ca and
         * --tls-crl (common/http_auth.h) */
        if ((who = kvp_http_principal(req, api->acl, api->tls)) == NULL) {
            fail(api, reply, 401, "unauthenticated",
                 "authentication required: send Authorization: Bearer TOKEN, or a client "
                 "certificate, of a principal the ACL names");
            KVP_LOG_WARN_LIMITED("indexer: a request for %s refused: no principal", path);
            return;
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
            return;
        }
    }
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
            else
                do_query(api, req, reply, i == 3, who);
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
