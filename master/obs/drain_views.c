/*
 * drain_views.c - Mooncake's drain job API on the master's HTTP port (declared in
 * http_views.h): POST /api/v1/drain_jobs, GET /api/v1/drain_jobs/query?job_id=,
 * POST /api/v1/drain_jobs/cancel?job_id=, GET /api/v1/segments/status?segment=
 * (docs/operations.md; the jobs themselves: policy/drain_jobs.c).
 *
 * The answers are Mooncake's (mooncake-store/src/master_admin_service.cpp): a created job
 * {"success":true,"job_id":"<uuid>","status":"CREATED"}, a job's state, a segment's status,
 * an error {"success":false,"error_code":N,"error_message":"..."} with its HTTP status (400
 * INVALID_PARAMS, 404 SEGMENT_NOT_FOUND or JOB_NOT_FOUND, 409 UNAVAILABLE_IN_CURRENT_STATUS,
 * 503 on a standby). Only an admin gets here (http_views.c, admitted()).
 *
 * Thread: the loop's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/http.h"
#include "common/json.h"
#include "master/obs/http_views.h"
#include "master/policy/drain_jobs.h"

#define NAME_MAX_LEN 256 /* a segment name in a body, its NUL included */

static void error(kvp_http_reply_t *r, unsigned http, int code, const char *msg)
{
    r->status = http;
    r->content_type = "application/json";
    kvp_http_printf(r, "{\"success\":false,\"error_code\":%d,\"error_message\":", code);
    kvp_http_json_string(r, msg, strlen(msg));
    kvp_http_printf(r, "}\n");
}

static const char *job_status_name(int s)
{
    static const char *const names[] = {"CREATED",   "PLANNING", "RUNNING",
                                        "SUCCEEDED", "FAILED",   "CANCELED"};
    return s >= 0 && s <= KVP_JOB_CANCELED ? names[s] : "UNKNOWN";
}

/* An array of strings of body's object under key into names (each NAME_MAX_LEN bytes);
 * absent: none. false: not an array of strings (msg set). */
static bool names_of(const kvp_json_t *j, const char *key, char (*names)[NAME_MAX_LEN],
                     unsigned max, unsigned *n_p, char *msg, size_t msg_len)
{
    *n_p = 0;
    int64_t a = kvp_json_get(j, 0, key);
    if (a < 0 || j->t[a].type == KVP_J_NULL)
        return true;
    if (j->t[a].type != KVP_J_ARRAY || j->t[a].size > max) {
        snprintf(msg, msg_len, "\"%s\" must be an array of at most %u segment names", key, max);
        return false;
    }
    uint32_t e = (uint32_t)a + 1;
    for (uint32_t i = 0; i < j->t[a].size; i++, e = j->t[e].next)
        if (!kvp_json_str(j, e, names[i], NAME_MAX_LEN) || names[i][0] == '\0') {
            snprintf(msg, msg_len, "\"%s\"[%u] must be a segment name (1..255 bytes)", key, i);
            return false;
        }
    *n_p = j->t[a].size;
    return true;
}

static void create(kvp_http_reply_t *r, kvp_master_state_t *st, const char *body, size_t len)
{
    char segs[KVP_DRAIN_JOB_SEGMENTS_MAX][NAME_MAX_LEN],
        tgts[KVP_DRAIN_JOB_TARGETS_MAX][NAME_MAX_LEN];
    char msg[200], why[100];
    kvp_json_t j;
    unsigned n = 0, nt = 0;
    uint64_t conc = 4; /* Mooncake's default */
    bool ok = kvp_json_parse(&j, body != NULL ? body : "", len, why, sizeof(why)) == KVP_JSON_OK;
    if (!ok || j.t[0].type != KVP_J_OBJECT) {
        snprintf(msg, sizeof(msg), "Invalid JSON body: %s", ok ? "not an object" : why);
        ok = false;
    } else {
        int64_t c = kvp_json_get(&j, 0, "max_concurrency");
        ok =
            names_of(&j, "segments", segs, KVP_DRAIN_JOB_SEGMENTS_MAX, &n, msg, sizeof(msg)) &&
            names_of(&j, "target_segments", tgts, KVP_DRAIN_JOB_TARGETS_MAX, &nt, msg, sizeof(msg));
        if (ok && c >= 0 && (!kvp_json_u64(&j, (uint32_t)c, &conc) || conc > UINT32_MAX)) {
            snprintf(msg, sizeof(msg), "\"max_concurrency\" must be an integer in 0..2^32-1");
            ok = false;
        }
    }
    kvp_json_free(&j);
    if (!ok)
        return error(r, 400, KVP_MC_INVALID_PARAMS, msg);
    const char *sp[KVP_DRAIN_JOB_SEGMENTS_MAX], *tp[KVP_DRAIN_JOB_TARGETS_MAX];
    for (unsigned i = 0; i < n; i++)
        sp[i] = segs[i];
    for (unsigned i = 0; i < nt; i++)
        tp[i] = tgts[i];
    char id[KVP_DRAIN_JOB_ID_LEN + 1];
    kvp_drain_err_t e;
    if (!kvp_drain_job_create(st, sp, n, tp, nt, (uint32_t)conc, id, &e))
        return error(r, e.http, e.code, e.msg);
    r->content_type = "application/json";
    kvp_http_printf(r, "{\"success\":true,\"job_id\":\"%s\",\"status\":\"CREATED\"}\n", id);
}

static void query(kvp_http_reply_t *r, kvp_master_state_t *st, const char *id)
{
    kvp_drain_job_view_t v;
    kvp_drain_err_t e;
    if (!kvp_drain_job_query(st, id, &v, &e))
        return error(r, e.http, e.code, e.msg);
    r->content_type = "application/json";
    kvp_http_printf(r,
                    "{\"success\":true,\"job_id\":\"%s\",\"type\":0,\"type_name\":\"DRAIN\","
                    "\"status\":%d,\"status_name\":\"%s\",\"created_at_ms_epoch\":%" PRIu64
                    ",\"last_updated_at_ms_epoch\":%" PRIu64 ",\"segments\":[",
                    v.id, v.status, job_status_name(v.status), v.created_ms, v.updated_ms);
    for (unsigned i = 0; i < v.n_segments; i++) {
        if (i > 0)
            kvp_http_append(r, ",", 1);
        kvp_http_json_string(r, v.segments[i], strlen(v.segments[i]));
    }
    kvp_http_printf(r,
                    "],\"succeeded_units\":%" PRIu64 ",\"failed_units\":%" PRIu64
                    ",\"blocked_units\":0,\"active_units\":%" PRIu64 ",\"migrated_bytes\":%" PRIu64
                    ",\"message\":",
                    v.succeeded, v.failed, v.active, v.migrated_bytes);
    kvp_http_json_string(r, v.message, strlen(v.message));
    kvp_http_printf(r, ",\"error_code\":0,\"error_message\":\"\"}\n");
}

static void segment_status(kvp_http_reply_t *r, kvp_master_state_t *st, const char *name)
{
    static const char *const names[] = {"UNDEFINED", "OK", "DRAINING", "DRAINED"};
    int status;
    kvp_drain_err_t e;
    if (!kvp_drain_segment_status(st, name, &status, &e))
        return error(r, e.http, e.code, e.msg);
    r->content_type = "application/json";
    kvp_http_printf(r, "{\"success\":true,\"segment\":");
    kvp_http_json_string(r, name, strlen(name));
    kvp_http_printf(r,
                    ",\"status\":%d,\"status_name\":\"%s\",\"error_code\":0,"
                    "\"error_message\":\"\"}\n",
                    status, names[status]);
}

void kvp_drain_views_render(kvp_http_reply_t *r, kvp_master_state_t *st,
                            const kvp_master_view_t *view, kvp_drain_view_t kind, const char *arg,
                            const char *body, size_t body_len)
{
    if (!view->serving)
        return error(r, 503, -1011, "this master is not the leader: ask the leader");
    switch (kind) {
    case KVP_DRAIN_VIEW_CREATE:
        create(r, st, body, body_len);
        break;
    case KVP_DRAIN_VIEW_QUERY:
        query(r, st, arg);
        break;
    case KVP_DRAIN_VIEW_CANCEL: {
        kvp_drain_err_t e;
        if (!kvp_drain_job_cancel(st, arg, &e))
            error(r, e.http, e.code, e.msg);
        break;
    }
    case KVP_DRAIN_VIEW_SEGMENT_STATUS:
        if (arg == NULL || arg[0] == '\0')
            return error(r, 400, KVP_MC_INVALID_PARAMS, "Missing segment query parameter");
        segment_status(r, st, arg);
        break;
    }
}
