/*
 * tenant_quotas.c - Mooncake's tenant quota admin API, /api/v1/tenant_quotas, on the
 * master's HTTP port (declared in http_views.h; docs/operations.md, docs/security.md).
 *
 * Design: Mooncake's memory quota of a tenant is kvpool's max-dram: GET lists every tenant
 * the master knows (or one, ?tenant_id=) as Mooncake's snapshot, PUT ?tenant_id= sets a
 * max-dram of the caller's choosing, DELETE ?tenant_id= removes it and closes the tenant's
 * admission (no put of it is admitted until a PUT) when it holds nothing. A change is made
 * here, on the loop, between two requests: a put is checked against the quota before or
 * after it, never half way (rpc/object_calls.c). What is charged does not change: a quota
 * lowered below a tenant's usage refuses its next puts (KVP_ERR_QUOTA) and leaves its
 * objects. The policy is kept over the ACL's max-dram (meta/tenant.c), so a SIGHUP
 * reload leaves it, and, with HA, staged for etcd (ha/quota_store.c), which the HTTP thread
 * writes before it answers; a new leader reads it before it serves.
 *
 * The answers are Mooncake's (mooncake-store/src/master_admin_service.cpp): a snapshot
 * {"success":true,"data":{...}}, a list {"success":true,"data":[...]}, an error
 * {"success":false,"error_code":N,"error_message":"..."} with its HTTP status (400
 * INVALID_PARAMS, 404 OBJECT_NOT_FOUND, 409 UNAVAILABLE_IN_CURRENT_MODE or TENANT_NOT_EMPTY,
 * 503 on a standby, 500 PERSISTENT_FAIL when etcd did not take a change). Only an admin
 * gets here (http_views.c, admitted()); without an ACL there are no tenants: 409.
 *
 * Thread: the loop's (render); kvp_tenant_quotas_unsaved on the HTTP thread (the reply is
 * its own then).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/http.h"
#include "common/json.h"
#include "common/log.h"
#include "master/obs/http_views.h"

/* Mooncake's ErrorCode values (mooncake-store/include/types.h) */
#define MC_INTERNAL_ERROR (-1)
#define MC_INVALID_PARAMS (-600)
#define MC_OBJECT_NOT_FOUND (-704)
#define MC_UNAVAILABLE_IN_CURRENT_MODE (-1011)
#define MC_PERSISTENT_FAIL (-1503)
#define MC_TENANT_NOT_EMPTY (-1702)

static const char *mc_name(int code)
{
    switch (code) {
    case MC_INVALID_PARAMS:
        return "INVALID_PARAMS";
    case MC_OBJECT_NOT_FOUND:
        return "OBJECT_NOT_FOUND";
    case MC_UNAVAILABLE_IN_CURRENT_MODE:
        return "UNAVAILABLE_IN_CURRENT_MODE";
    case MC_PERSISTENT_FAIL:
        return "PERSISTENT_FAIL";
    case MC_TENANT_NOT_EMPTY:
        return "TENANT_NOT_EMPTY";
    default:
        return "INTERNAL_ERROR";
    }
}

/* Mooncake's WriteErrorResponse: msg NULL: the code's name. */
static void fail(kvp_http_reply_t *r, unsigned status, int code, const char *msg)
{
    r->status = status;
    r->content_type = "application/json; charset=utf-8";
    r->len = 0;
    const char *m = msg != NULL ? msg : mc_name(code);
    kvp_http_printf(r, "{\"success\":false,\"error_code\":%d,\"error_message\":", code);
    kvp_http_json_string(r, m, strlen(m));
    kvp_http_printf(r, "}");
}

void kvp_tenant_quotas_unsaved(kvp_http_reply_t *r, const char *err)
{
    char msg[400];
    snprintf(msg, sizeof(msg),
             "the tenant quota policy changed on this master but etcd did not save it "
             "(%.250s): a new leader would not have it; send the request again",
             err);
    fail(r, 500, MC_PERSISTENT_FAIL, msg);
}

static void snapshot(kvp_http_reply_t *r, const kvp_tenant_t *t)
{
    /* a tenant without max-dram has no explicit policy: no DRAM quota, admission open */
    bool explicit_policy = t->max_dram != 0;
    kvp_http_printf(r, "{\"tenant_id\":");
    kvp_http_json_string(r, t->name, strlen(t->name));
    kvp_http_printf(r,
                    ",\"requested_quota_bytes\":%" PRIu64 ",\"effective_quota_bytes\":%" PRIu64
                    ",\"charged_bytes\":%" PRIu64
                    ",\"admission_closed\":%s,\"over_quota\":%s,\"has_explicit_policy\":%s}",
                    t->max_dram, t->max_dram, t->dram_bytes, t->closed ? "true" : "false",
                    explicit_policy && t->dram_bytes > t->max_dram ? "true" : "false",
                    explicit_policy ? "true" : "false");
}

static void ok_one(kvp_http_reply_t *r, const kvp_tenant_t *t)
{
    r->content_type = "application/json; charset=utf-8";
    kvp_http_printf(r, "{\"success\":true,\"data\":");
    snapshot(r, t);
    kvp_http_printf(r, "}");
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const kvp_tenant_t *const *)a)->name, (*(const kvp_tenant_t *const *)b)->name);
}

/* Every tenant, by name (Mooncake lists its accounts in name order). */
static void list(kvp_http_reply_t *r, const kvp_tenant_table_t *tt)
{
    const kvp_tenant_t **v = malloc(tt->n * sizeof(*v));
    if (v == NULL) {
        fail(r, 500, MC_INTERNAL_ERROR, "out of memory");
        return;
    }
    for (uint32_t i = 0; i < tt->n; i++)
        v[i] = &tt->t[i];
    qsort(v, tt->n, sizeof(*v), by_name);
    r->content_type = "application/json; charset=utf-8";
    kvp_http_printf(r, "{\"success\":true,\"data\":[");
    for (uint32_t i = 0; i < tt->n; i++) {
        if (i > 0)
            kvp_http_append(r, ",", 1);
        snapshot(r, v[i]);
    }
    kvp_http_printf(r, "]}");
    free(v);
}

/* A PUT's body: {"requested_quota_bytes": N}, N an integer in 0..2^64-1 (its range is
 * checked after). false: why in why (Mooncake's "Invalid JSON body: ..."). Strict: one
 * object (common/json.h), that one field once, nothing after it; the fields are checked in
 * their order, so the first wrong one is named. */
static bool parse_body(const char *b, size_t len, uint64_t *v, char *why, size_t why_len)
{
    static const char field[] = "requested_quota_bytes";
    char err[160];
    kvp_json_t j;
    bool ok = false, seen = false;
    if (kvp_json_parse(&j, b, len, err, sizeof(err)) != KVP_JSON_OK) {
        snprintf(why, why_len, "Invalid JSON body: %s", err);
        goto out;
    }
    if (j.t[0].type != KVP_J_OBJECT) {
        snprintf(why, why_len, "Invalid JSON body: not a JSON object");
        goto out;
    }
    uint32_t k = 1; /* the first key; its value follows it */
    for (uint32_t i = 0; i < j.t[0].size; i++, k = j.t[k + 1].next) {
        const kvp_json_tok_t *key = &j.t[k], *val = &j.t[k + 1];
        size_t klen = key->end - key->start;
        /* compared as written: an escaped name is not this one */
        if (klen != sizeof(field) - 1 || memcmp(b + key->start, field, klen) != 0) {
            snprintf(why, why_len, "Invalid JSON body: unknown field \"%.*s\"",
                     (int)(klen > 64 ? 64 : klen), b + key->start);
            goto out;
        }
        if (seen) {
            snprintf(why, why_len, "Invalid JSON body: requested_quota_bytes given twice");
            goto out;
        }
        if (!kvp_json_u64(&j, k + 1, v)) {
            /* digits only, and still no u64: too many of them */
            bool digits = val->type == KVP_J_NUMBER;
            for (uint32_t c = val->start; digits && c < val->end; c++)
                digits = b[c] >= '0' && b[c] <= '9';
            snprintf(why, why_len, "Invalid JSON body: requested_quota_bytes %s",
                     digits ? "is out of range" : "needs an unsigned integer");
            goto out;
        }
        seen = true;
    }
    if (!seen) {
        snprintf(why, why_len, "Invalid JSON body: requested_quota_bytes is missing");
        goto out;
    }
    ok = true;
out:
    kvp_json_free(&j);
    return ok;
}

static int32_t known(kvp_tenant_table_t *tt, const char *tenant)
{
    return kvp_tenant_id(tt, tenant, strlen(tenant), false); /* (checked: no NUL in it) */
}

/* Does the name hold a NUL or another control character (what would make it print, or
 * reach a C string, as another name)? */
static bool name_has_control(const char *name, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] == 0x7f)
            return true;
    return false;
}

void kvp_tenant_quotas_render(kvp_http_reply_t *r, kvp_master_state_t *st,
                              const kvp_master_view_t *v, const char *method, const char *tenant,
                              size_t tenant_len, const char *body, size_t body_len, const char *who,
                              bool *save_p)
{
    *save_p = false;
    /* the whole decoded name: `zz-nul%00b` is refused, never taken for `zz-nul` */
    bool valid = tenant != NULL && kvp_tenant_name_valid(tenant, tenant_len);
    bool put = strcmp(method, "PUT") == 0, del = strcmp(method, "DELETE") == 0;
    uint64_t bytes = 0;
    if (tenant != NULL && name_has_control(tenant, tenant_len)) {
        st->stats.refused_name_tenant++;
        KVP_LOG_WARN_LIMITED("tenant quota API: a %s by principal %s named a tenant_id with a NUL "
                             "or control character: refused",
                             method, who[0] ? who : "(no ACL)");
        /* Mooncake's words first (a PUT's or DELETE's, a GET's), then why */
        return fail(r, 400, MC_INVALID_PARAMS,
                    put || del ? "Missing or invalid tenant_id: it holds a NUL or control "
                                 "character (a tenant's name is 1..63 bytes of A-Z a-z 0-9 . _ -)"
                               : "Invalid tenant_id: it holds a NUL or control character (a "
                                 "tenant's name is 1..63 bytes of A-Z a-z 0-9 . _ -)");
    }
    /* Mooncake's order: a PUT's or DELETE's tenant and body first, then the service */
    if ((put || del) && !valid)
        return fail(r, 400, MC_INVALID_PARAMS, "Missing or invalid tenant_id");
    if (put) {
        char why[200];
        if (!parse_body(body, body_len, &bytes, why, sizeof(why)))
            return fail(r, 400, MC_INVALID_PARAMS, why);
        if (bytes == 0 || bytes > KVP_TENANT_QUOTA_MAX)
            return fail(r, 400, MC_INVALID_PARAMS, "Tenant quota must be in [1, 2^63 - 1] bytes");
    }
    if (!v->serving)
        return fail(r, 503, MC_UNAVAILABLE_IN_CURRENT_MODE, "service plane is not active");
    if (v->acl == NULL) /* no ACL: no tenants (Mooncake's multi-tenant mode off) */
        return fail(r, 409, MC_UNAVAILABLE_IN_CURRENT_MODE, NULL);
    kvp_tenant_table_t *tt = &st->tenants;
    if (!put && !del) {
        if (tenant == NULL)
            return list(r, tt);
        if (!valid)
            return fail(r, 400, MC_INVALID_PARAMS, "Invalid tenant_id");
        int32_t id = known(tt, tenant);
        if (id < 0)
            return fail(r, 404, MC_OBJECT_NOT_FOUND, NULL);
        return ok_one(r, &tt->t[id]);
    }
    if (put) {
        int32_t id = kvp_tenant_id(tt, tenant, strlen(tenant), true);
        if (id < 0)
            return fail(r, 500, MC_INTERNAL_ERROR, "the master knows as many tenants as it may");
        kvp_tenant_t *t = &tt->t[id];
        uint64_t was = t->max_dram;
        t->policy = KVP_TENANT_POLICY_SET;
        t->policy_dram = bytes;
        kvp_tenant_policy_apply(t);
        KVP_LOG_INFO("audit: tenant %s's DRAM quota set to %" PRIu64 " bytes (was %" PRIu64
                     "%s) by principal %s over HTTP; %" PRIu64 " bytes charged",
                     t->name, bytes, was, was == 0 ? ": none" : "", who, t->dram_bytes);
    } else {
        int32_t id = known(tt, tenant);
        kvp_tenant_t *t = id >= 0 ? &tt->t[id] : NULL;
        if (t == NULL || t->max_dram == 0) /* no explicit policy to delete */
            return fail(r, 404, MC_OBJECT_NOT_FOUND, NULL);
        if (t->dram_bytes != 0 || t->ssd_bytes != 0 || t->objects != 0)
            return fail(r, 409, MC_TENANT_NOT_EMPTY, NULL);
        t->policy = KVP_TENANT_POLICY_CLOSED;
        kvp_tenant_policy_apply(t);
        KVP_LOG_INFO("audit: tenant %s's DRAM quota deleted by principal %s over HTTP: its "
                     "admission is closed until a PUT",
                     t->name, who);
    }
    if (v->quotas != NULL) {
        char *text = kvp_tenant_policy_dump(tt);
        if (text == NULL)
            return fail(r, 500, MC_PERSISTENT_FAIL, "out of memory");
        kvp_quota_store_stage(v->quotas, text, st->epoch);
        *save_p = true;
    }
    if (put)
        return ok_one(r, &tt->t[known(tt, tenant)]);
    r->content_type = "application/json; charset=utf-8";
    kvp_http_printf(r, "{\"success\":true,\"data\":null}"); /* Mooncake's: no account left */
}
