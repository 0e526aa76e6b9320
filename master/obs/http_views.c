/*
 * http_views.c - the master's HTTP endpoints (see http_views.h): requests handed from the
 * HTTP threads to the loop, and the JSON and text views.
 *
 * Design: a request becomes a job on a mutex-protected list; the HTTP thread
 * writes the eventfd and waits on a condition variable. The loop takes the
 * whole list at once, renders each job into its reply (the HTTP thread is
 * blocked meanwhile, so the reply is the loop's alone), marks it done and
 * wakes the waiters. A job the loop has not taken in time is unlinked by its
 * HTTP thread and answered 503: a stalled loop never leaves an HTTP thread
 * hanging, and a slow HTTP client never holds anything of the loop's. The
 * JSON views reuse the RPC handlers (Stat, List) through the view's call (the
 * server hands in dispatch.c's path), so the HTTP API and the CLI show the same
 * thing. With an ACL, /metrics stays open but names no tenant unless the
 * scrape is an admin's (or --metrics-tenants on): tenants' names and sizes
 * are not a stranger's business.
 */
#include "master/obs/http_views.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common/http.h"
#include "common/http_auth.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/rpc.h"
#include "kvpool.pb-c.h"

typedef enum job_kind {
    JOB_METRICS,
    JOB_HEALTH,
    JOB_STAT,
    JOB_SEGMENTS,
    JOB_ALL_SEGMENTS,
    JOB_QUERY_SEGMENT,
    JOB_KEYS,
    JOB_ALL_KEYS, /* one page of them; the HTTP thread asks for the next (ALL_KEYS_BODY_MAX) */
    JOB_TENANT_QUOTAS,
    JOB_DRAIN, /* Mooncake's drain job API (drain_views.c): job.drain says which */
    JOB_ADMIT, /* a request's head, before its body is read: is it an admin's? */
} job_kind_t;

#define TENANT_QUOTAS_BODY_MAX 4096 /* a PUT's body: {"requested_quota_bytes":N} and room */
/* /get_all_keys: pages of ALL_KEYS_PAGE keys, each one loop visit; a listing past
 * ALL_KEYS_BODY_MAX bytes is refused (413: page through /api/v1/keys instead) */
#define ALL_KEYS_PAGE 1000u
#define ALL_KEYS_BODY_MAX (64u << 20)

typedef struct job {
    struct job *next;
    job_kind_t kind;
    kvp_http_reply_t *reply;
    char text[1100]; /* JOB_KEYS: the regex; JOB_QUERY_SEGMENT: the segment name */
    uint64_t cursor;
    uint32_t limit;
    bool done;
    bool next_page;         /* JOB_ALL_KEYS after its first page: admitted with the first */
    kvp_drain_view_t drain; /* JOB_DRAIN: which call (its job_id or segment in text) */
    bool tenants;         /* JOB_METRICS: with the per-tenant series (an admin's, or the flag's) */
    kvp_http_cred_t cred; /* its bearer token (wiped once checked) and client certificate */
    /* JOB_TENANT_QUOTAS: the method, ?tenant_id= (in text; has_tenant), a PUT's body */
    char method[8];
    bool has_tenant;
    size_t tenant_len; /* its bytes in text (a NUL in it included) */
    char body[TENANT_QUOTAS_BODY_MAX + 1];
    size_t body_len;
    char who[KVP_ACL_NAME_MAX]; /* the admin admitted ("": no ACL) */
    bool save;                  /* a policy changed: save it to etcd before replying */
    kvp_quota_store_t *quotas;  /* ... there */
} job_t;

struct kvp_master_http {
    kvp_http_t *http;
    int efd;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    job_t *jobs;   /* queued, not yet taken by the loop */
    bool stopping; /* lock */
};

/* ---- HTTP threads ---- */

static bool parse_u64(const char *s, uint64_t max, uint64_t *v)
{
    if (s == NULL || *s == '\0' || *s == '-')
        return false;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(s, &end, 10);
    if (*end != '\0' || errno != 0 || n > max)
        return false;
    *v = n;
    return true;
}

static void bad_request(kvp_http_reply_t *r, const char *fmt, const char *arg)
{
    r->status = 400;
    r->content_type = "application/json";
    char msg[256];
    snprintf(msg, sizeof(msg), fmt, arg);
    kvp_http_printf(r, "{\"error\":");
    kvp_http_json_string(r, msg, strlen(msg));
    kvp_http_printf(r, "}\n");
}

/* The request's body (at most TENANT_QUOTAS_BODY_MAX bytes: the server refused more) into
 * job. */
static void body_take(job_t *job, const kvp_http_request_t *req)
{
    size_t blen = 0;
    const char *body = kvp_http_body(req, &blen);
    if (body != NULL && blen <= TENANT_QUOTAS_BODY_MAX) {
        memcpy(job->body, body, blen);
        job->body_len = blen;
    }
}

/* /api/v1/tenant_quotas into job: its method, ?tenant_id= and body. false: answered (405). */
static bool tenant_quotas_job(job_t *job, const kvp_http_request_t *req, bool get)
{
    const char *method = kvp_http_method(req);
    job->kind = JOB_TENANT_QUOTAS;
    if (!get && strcmp(method, "PUT") != 0 && strcmp(method, "DELETE") != 0) {
        job->reply->status = 405;
        job->reply->allow = "GET, HEAD, PUT, DELETE";
        kvp_http_printf(job->reply, "method %.16s not allowed: GET, PUT or DELETE\n", method);
        return false;
    }
    snprintf(job->method, sizeof(job->method), "%s", get ? "GET" : method);
    size_t tlen = 0; /* decoded, a %00 included: the name is checked whole (tenant_quotas.c) */
    const char *tenant = kvp_http_query_n(req, "tenant_id", &tlen);
    job->has_tenant = tenant != NULL && tlen != 0; /* empty: none, as Mooncake */
    job->tenant_len = !job->has_tenant           ? 0
                      : tlen < sizeof(job->text) ? tlen
                                                 : sizeof(job->text) - 1;
    memcpy(job->text, job->has_tenant ? tenant : "", job->tenant_len);
    job->text[job->tenant_len] = '\0';
    body_take(job, req);
    return true;
}

/* Hand job to the loop and wait for it (at most KVP_MASTER_HTTP_WAIT_MS for the loop to
 * take it); job->done says whether it was answered. */
static void run_job(kvp_master_http_t *h, job_t *job)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += KVP_MASTER_HTTP_WAIT_MS / 1000;
    pthread_mutex_lock(&h->lock);
    if (!h->stopping) {
        job->next = h->jobs;
        h->jobs = job;
        uint64_t one = 1;
        if (write(h->efd, &one, sizeof(one)) < 0) { /* a full counter still wakes the loop */
        }
        while (!job->done && !h->stopping &&
               pthread_cond_timedwait(&h->cond, &h->lock, &deadline) != ETIMEDOUT) {
        }
    }
    if (!job->done) {
        /* still queued (the loop never took it): take it back; once taken, a job always
         * ends (the loop does not stop half way through one) */
        bool queued = false;
        for (job_t **pp = &h->jobs; *pp != NULL; pp = &(*pp)->next)
            if (*pp == job) {
                *pp = job->next;
                queued = true;
                break;
            }
        while (!queued && !job->done)
            pthread_cond_wait(&h->cond, &h->lock);
    }
    pthread_mutex_unlock(&h->lock);
}

/* Mooncake's drain job API into job: which call, its ?job_id= or ?segment= (in text), a
 * POST /api/v1/drain_jobs' body. false: answered (405, 404 or 400). */
static bool drain_job(job_t *job, const char *path, const kvp_http_request_t *req)
{
    static const struct {
        const char *path, *method;
        kvp_drain_view_t kind;
        const char *arg;
    } calls[] = {
        {"/api/v1/drain_jobs", "POST", KVP_DRAIN_VIEW_CREATE, NULL},
        {"/api/v1/drain_jobs/query", "GET", KVP_DRAIN_VIEW_QUERY, "job_id"},
        {"/api/v1/drain_jobs/cancel", "POST", KVP_DRAIN_VIEW_CANCEL, "job_id"},
        {"/api/v1/segments/status", "GET", KVP_DRAIN_VIEW_SEGMENT_STATUS, "segment"},
    };
    kvp_http_reply_t *r = job->reply;
    const char *method = kvp_http_method(req);
    for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
        if (strcmp(path, calls[i].path) != 0)
            continue;
        bool get = strcmp(calls[i].method, "GET") == 0;
        if (strcmp(method, calls[i].method) != 0 && !(get && strcmp(method, "HEAD") == 0)) {
            r->status = 405;
            r->allow = get ? "GET, HEAD" : "POST";
            kvp_http_printf(r, "method %.16s not allowed: %s\n", method, r->allow);
            return false;
        }
        job->kind = JOB_DRAIN;
        job->drain = calls[i].kind;
        job->has_tenant = false;
        const char *v = calls[i].arg != NULL ? kvp_http_query(req, calls[i].arg) : NULL;
        if (v != NULL && strlen(v) >= sizeof(job->text)) {
            bad_request(r, "?%s= is too long", calls[i].arg);
            return false;
        }
        snprintf(job->text, sizeof(job->text), "%s", v != NULL ? v : "");
        body_take(job, req);
        return true;
    }
    r->status = 404;
    kvp_http_printf(r,
                    "no such endpoint: %.200s (the drain job API: /api/v1/drain_jobs, "
                    "/api/v1/drain_jobs/query, /api/v1/drain_jobs/cancel)\n",
                    path);
    return false;
}

/* A request (admit_only: its head, whose credential the loop checks as the view's) */
static void serve(kvp_master_http_t *h, const char *path, const kvp_http_request_t *req,
                  kvp_http_reply_t *reply, bool admit_only)
{
    job_t job = {.reply = reply, .limit = 100};
    const char *method = kvp_http_method(req);
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (strcmp(path, "/api/v1/tenant_quotas") == 0) {
        if (!tenant_quotas_job(&job, req, get))
            return;
    } else if (strncmp(path, "/api/v1/drain_jobs", 18) == 0 ||
               strcmp(path, "/api/v1/segments/status") == 0) {
        if (!drain_job(&job, path, req))
            return;
    } else if (!get) {
        reply->status = 405;
        reply->allow = "GET, HEAD";
        kvp_http_printf(reply, "method %.16s not allowed: only GET and HEAD\n", method);
        return;
    } else if (strcmp(path, "/metrics") == 0) {
        job.kind = JOB_METRICS;
    } else if (strcmp(path, "/health") == 0) {
        job.kind = JOB_HEALTH;
    } else if (strcmp(path, "/api/v1/stat") == 0) {
        job.kind = JOB_STAT;
    } else if (strcmp(path, "/api/v1/segments") == 0) {
        job.kind = JOB_SEGMENTS;
    } else if (strcmp(path, "/get_all_segments") == 0) {
        job.kind = JOB_ALL_SEGMENTS;
    } else if (strcmp(path, "/get_all_keys") == 0) {
        job.kind = JOB_ALL_KEYS;
        job.limit = ALL_KEYS_PAGE;
    } else if (strcmp(path, "/query_segment") == 0) {
        job.kind = JOB_QUERY_SEGMENT;
        const char *name = kvp_http_query(req, "segment");
        if (name == NULL || name[0] == '\0' || strlen(name) >= sizeof(job.text)) {
            reply->status = 400;
            kvp_http_printf(reply, "query_segment needs ?segment=NAME\n");
            return;
        }
        snprintf(job.text, sizeof(job.text), "%s", name);
    } else if (strcmp(path, "/api/v1/keys") == 0) {
        job.kind = JOB_KEYS;
        const char *re = kvp_http_query(req, "regex");
        const char *limit = kvp_http_query(req, "limit");
        const char *cursor = kvp_http_query(req, "cursor");
        uint64_t v;
        if (re != NULL && strlen(re) > 1024)
            return bad_request(reply, "regex longer than %s bytes", "1024");
        if (limit != NULL) {
            if (!parse_u64(limit, 1000, &v) || v == 0)
                return bad_request(reply, "limit needs 1..1000, got '%.64s'", limit);
            job.limit = (uint32_t)v;
        }
        if (cursor != NULL) {
            if (!parse_u64(cursor, UINT64_MAX, &v))
                return bad_request(reply, "cursor needs a number, got '%.64s'", cursor);
            job.cursor = v;
        }
        snprintf(job.text, sizeof(job.text), "%s", re != NULL ? re : "");
    } else {
        reply->status = 404;
        kvp_http_printf(reply,
                        "no such endpoint: %.200s (see docs/operations.md: /metrics, "
                        "/health, /api/v1/stat, /api/v1/segments, /api/v1/keys, "
                        "/api/v1/tenant_quotas, /api/v1/drain_jobs, /get_all_segments, "
                        "/get_all_keys, "
                        "/query_segment)\n",
                        path);
        return;
    }
    if (admit_only)
        job.kind = JOB_ADMIT;
    kvp_http_cred_take(&job.cred, req); /* checked on the loop, which owns the ACL */
    run_job(h, &job);
    while (job.kind == JOB_ALL_KEYS && job.done && reply->status == 200 && !reply->oom &&
           job.cursor != 0) {
        job.done = false; /* the next page, as long as the loop answers */
        job.next_page = true;
        run_job(h, &job);
    }
    kvp_http_cred_wipe(&job.cred);
    if (!job.done) {
        reply->status = 503;
        reply->len = 0;
        kvp_http_printf(reply, "the master's loop did not answer within %u ms\n",
                        KVP_MASTER_HTTP_WAIT_MS);
    } else if (job.kind == JOB_METRICS && reply->status == 200) {
        kvp_http_metrics(req, "kvpool_master_http", reply); /* the HTTP server's caps */
    } else if (job.save && job.quotas != NULL) {
        /* a tenant quota policy changed on the loop: into etcd before the admin hears so
         * (here, off the loop: etcd may be slow) */
        char err[256] = "";
        if (kvp_quota_store_save(job.quotas, err, sizeof(err)) != KVP_OK) {
            KVP_LOG_ERROR("a tenant quota policy changed on this master but etcd did not take "
                          "it (%s): a new leader would not have it",
                          err);
            reply->len = 0;
            kvp_tenant_quotas_unsaved(reply, err);
        }
    }
}

static void handle(void *arg, const char *path, const kvp_http_request_t *req,
                   kvp_http_reply_t *reply)
{
    serve(arg, path, req, reply, false);
}

/* kvp_http_admit_fn: the body of a PUT /api/v1/tenant_quotas or a POST /api/v1/drain_jobs is
 * read only once the loop found its credential an admin's (401/403 from the head otherwise); every
 * other request that is not a GET takes no body and is answered from its head. */
static bool admit(void *arg, const char *path, const kvp_http_request_t *req,
                  kvp_http_reply_t *reply)
{
    const char *method = kvp_http_method(req);
    bool body = (strcmp(method, "PUT") == 0 && strcmp(path, "/api/v1/tenant_quotas") == 0) ||
                (strcmp(method, "POST") == 0 && strcmp(path, "/api/v1/drain_jobs") == 0);
    serve(arg, path, req, reply, body);
    return body && reply->status == 200 && reply->len == 0;
}

kvp_status_t kvp_master_http_start(const char *hostport, const char *cert, const char *key,
                                   const char *ca, kvp_master_http_t **h_p, uint16_t *port_p)
{
    kvp_master_http_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return KVP_ERR_NOMEM;
    h->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (h->efd < 0) {
        free(h);
        return KVP_ERR_SYSTEM;
    }
    pthread_mutex_init(&h->lock, NULL);
    pthread_condattr_t cattr;
    pthread_condattr_init(&cattr);
    pthread_condattr_setclock(&cattr, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cond, &cattr);
    pthread_condattr_destroy(&cattr);
    kvp_status_t s = kvp_http_start_tls(hostport, cert, key, ca, handle, h, &h->http, port_p);
    if (s != KVP_OK) {
        close(h->efd);
        pthread_mutex_destroy(&h->lock);
        pthread_cond_destroy(&h->cond);
        free(h);
        return s;
    }
    /* PUT /api/v1/tenant_quotas and POST /api/v1/drain_jobs have a body; every other method
     * is answered in handle() */
    kvp_http_accept_post(h->http, TENANT_QUOTAS_BODY_MAX, NULL);
    kvp_http_admit(h->http, admit); /* an admin's credential before a body is read */
    *h_p = h;
    return KVP_OK;
}

int kvp_master_http_fd(const kvp_master_http_t *h)
{
    return h->efd;
}

void kvp_master_http_stop(kvp_master_http_t *h)
{
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->lock);
    h->stopping = true;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    kvp_http_stop(h->http); /* waits for the handler threads, which all return now */
    close(h->efd);
    pthread_mutex_destroy(&h->lock);
    pthread_cond_destroy(&h->cond);
    free(h);
}

/* ---- the loop ---- */

/* Call an RPC handler as a client would (conn 0: no client). NULL on failure. */
static void *call_rpc(kvp_master_state_t *st, const kvp_master_view_t *v, uint16_t method,
                      const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc)
{
    uint8_t small[2048], *body = NULL;
    size_t len = 0;
    if (req != NULL) {
        len = protobuf_c_message_get_packed_size(req);
        body = len <= sizeof(small) ? small : malloc(len);
        if (body == NULL)
            return NULL;
        protobuf_c_message_pack(req, body);
    }
    uint8_t *resp = NULL;
    size_t rlen = 0;
    char err[256];
    kvp_status_t s = v->call(st, method, body, len, &resp, &rlen, err, sizeof(err));
    if (body != small)
        free(body); /* NULL or a malloc'd one */
    void *msg = NULL;
    if (s == KVP_OK)
        msg = protobuf_c_message_unpack(resp_desc, NULL, rlen, resp);
    free(resp);
    return msg;
}

static const char *tier_name(const kvp_segment_t *seg)
{
    return seg->dfs ? "dfs" : seg->ssd ? "ssd" : "dram";
}

static void render_health(kvp_http_reply_t *r, const kvp_master_state_t *st,
                          const kvp_master_view_t *v)
{
    if (v->serving) {
        if (v->ha)
            kvp_http_printf(r, "ok: leader %s, epoch %" PRIu64 "\n", v->self, st->epoch);
        else
            kvp_http_printf(r, "ok\n");
        return;
    }
    r->status = 503;
    kvp_http_printf(r, "not serving: %s\n", v->reason != NULL ? v->reason : "standby");
}

static void json_kv_u64(kvp_http_reply_t *r, const char *name, uint64_t v, bool comma)
{
    kvp_http_printf(r, "%s\"%s\":%" PRIu64, comma ? "," : "", name, v);
}

static void render_stat(kvp_http_reply_t *r, kvp_master_state_t *st, const kvp_master_view_t *v)
{
    Kvpool__StatResponse *s =
        call_rpc(st, v, KVP_RPC_STAT, NULL, &kvpool__stat_response__descriptor);
    if (s == NULL) {
        r->status = 500;
        kvp_http_printf(r, "{\"error\":\"Stat failed\"}\n");
        return;
    }
    kvp_http_printf(r, "{\"status\":%d", s->status);
    /* every counter and gauge of `kvpool stat`, by its proto field name */
    const ProtobufCMessageDescriptor *d = &kvpool__stat_response__descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->label == PROTOBUF_C_LABEL_REPEATED)
            continue;
        const char *p = (const char *)s + f->offset;
        if (f->type == PROTOBUF_C_TYPE_UINT64)
            json_kv_u64(r, f->name, *(const uint64_t *)p, true);
        else if (f->type == PROTOBUF_C_TYPE_STRING) {
            const char *str = *(char *const *)p;
            kvp_http_printf(r, ",\"%s\":", f->name);
            kvp_http_json_string(r, str != NULL ? str : "", str != NULL ? strlen(str) : 0);
        }
    }
    kvp_http_printf(r, ",\"segments\":%zu,\"clients\":%u,\"serving\":%s", s->n_segments,
                    st->clients, v->serving ? "true" : "false");
    kvp_http_printf(r, "}\n");
    kvpool__stat_response__free_unpacked(s, NULL);
}

static void render_segment_json(kvp_http_reply_t *r, const kvp_segment_t *seg)
{
    kvp_http_printf(r, "{\"name\":");
    kvp_http_json_string(r, seg->name, strlen(seg->name));
    kvp_http_printf(r, ",\"id\":\"%#" PRIx64 "\",\"tier\":\"%s\",\"medium\":", seg->id,
                    tier_name(seg));
    kvp_http_json_string(r, seg->medium, strlen(seg->medium));
    json_kv_u64(r, "capacity", seg->size, true);
    json_kv_u64(r, "used", kvp_segment_stored(seg), true);
    json_kv_u64(r, "objects", kvp_segment_objects(seg), true);
    json_kv_u64(r, "owner_client_id", seg->owner_client_id, true);
    kvp_http_printf(r, ",\"tcp_endpoint\":");
    kvp_http_json_string(r, seg->tcp_endpoint, strlen(seg->tcp_endpoint));
    kvp_http_printf(r, ",\"rdma_endpoint\":");
    kvp_http_json_string(r, seg->rdma_endpoint, strlen(seg->rdma_endpoint));
    kvp_http_printf(r, ",\"rdma_windows\":%s", seg->rdma_windows ? "true" : "false");
    kvp_http_printf(r, ",\"status\":\"%s\"}",
                    seg->draining ? "draining" : (seg->adopting ? "adopting" : "mounted"));
}

static void render_segments(kvp_http_reply_t *r, const kvp_master_state_t *st)
{
    const kvp_segment_table_t *t = &st->segments;
    kvp_http_printf(r, "{\"total_segments\":%u,\"segments\":[", t->count);
    bool first = true;
    for (uint32_t i = 0; i < t->n_slots; i++) {
        if (t->slots[i] == NULL)
            continue;
        if (!first)
            kvp_http_append(r, ",", 1);
        first = false;
        render_segment_json(r, t->slots[i]);
    }
    kvp_http_printf(r, "]}\n");
}

static void render_keys(kvp_http_reply_t *r, kvp_master_state_t *st, const kvp_master_view_t *v,
                        const job_t *job)
{
    Kvpool__ListRequest req = KVPOOL__LIST_REQUEST__INIT;
    req.pattern = (char *)job->text;
    req.cursor = job->cursor;
    req.limit = job->limit;
    Kvpool__ListResponse *l =
        call_rpc(st, v, KVP_RPC_LIST, &req.base, &kvpool__list_response__descriptor);
    if (l == NULL) {
        r->status = 500;
        kvp_http_printf(r, "{\"error\":\"List failed\"}\n");
        return;
    }
    if (l->status != KVP_OK) {
        r->status = l->status == KVP_ERR_INVALID_ARG ? 400 : 500;
        kvp_http_printf(r, "{\"error\":");
        kvp_http_json_string(r, l->message, strlen(l->message));
        kvp_http_printf(r, ",\"status\":%d}\n", l->status);
        kvpool__list_response__free_unpacked(l, NULL);
        return;
    }
    kvp_http_printf(r, "{\"keys\":[");
    for (size_t i = 0; i < l->n_entries; i++) {
        const Kvpool__ListEntry *e = l->entries[i];
        kvp_http_printf(r, "%s{\"key\":", i ? "," : "");
        kvp_http_json_string(r, (const char *)e->key.data, e->key.len);
        if (e->tenant != NULL && e->tenant[0] != '\0') { /* with an ACL: whose key */
            kvp_http_printf(r, ",\"tenant\":");
            kvp_http_json_string(r, e->tenant, strlen(e->tenant));
        }
        kvp_http_printf(r, ",\"size\":%" PRIu64 ",\"state\":\"%s\",\"replicas\":[", e->size,
                        e->state == 2 ? "complete" : "pending");
        for (size_t k = 0; k < e->n_replicas; k++) {
            const kvp_segment_t *seg =
                kvp_segment_table_get(&st->segments, e->replicas[k]->segment_id);
            kvp_http_printf(r, "%s{\"segment\":", k ? "," : "");
            const char *name = seg != NULL ? seg->name : "";
            kvp_http_json_string(r, name, strlen(name));
            kvp_http_printf(r, ",\"tier\":\"%s\"}", seg != NULL ? tier_name(seg) : "gone");
        }
        kvp_http_printf(r, "]}");
    }
    kvp_http_printf(r, "],\"count\":%zu,\"next_cursor\":%" PRIu64 "}\n", l->n_entries,
                    l->next_cursor);
    kvpool__list_response__free_unpacked(l, NULL);
}

/* One page of /get_all_keys (Mooncake's form: one key a line), from job->cursor on; the next
 * page's cursor into job->cursor (0: none). A byte of a key that would break the line (a
 * control byte, a backslash) is written \xNN. */
static void render_all_keys(kvp_http_reply_t *r, kvp_master_state_t *st, const kvp_master_view_t *v,
                            job_t *job)
{
    Kvpool__ListRequest req = KVPOOL__LIST_REQUEST__INIT;
    req.pattern = "";
    req.cursor = job->cursor;
    req.limit = job->limit;
    Kvpool__ListResponse *l =
        call_rpc(st, v, KVP_RPC_LIST, &req.base, &kvpool__list_response__descriptor);
    if (l == NULL || l->status != KVP_OK) {
        r->status = 500;
        r->len = 0;
        kvp_http_printf(r, "listing the keys failed: %s\n", l != NULL ? l->message : "no memory");
        if (l != NULL)
            kvpool__list_response__free_unpacked(l, NULL);
        return;
    }
    for (size_t i = 0; i < l->n_entries; i++) {
        const uint8_t *k = l->entries[i]->key.data;
        size_t n = l->entries[i]->key.len, from = 0;
        for (size_t j = 0; j < n; j++)
            if (k[j] < 0x20 || k[j] == 0x7f || k[j] == '\\') {
                kvp_http_append(r, (const char *)k + from, j - from);
                kvp_http_printf(r, "\\x%02x", k[j]);
                from = j + 1;
            }
        kvp_http_append(r, (const char *)k + from, n - from);
        kvp_http_append(r, "\n", 1);
    }
    job->cursor = l->next_cursor;
    kvpool__list_response__free_unpacked(l, NULL);
    if (r->len > ALL_KEYS_BODY_MAX) {
        r->status = 413;
        r->len = 0;
        kvp_http_printf(r, "the keys take more than %u MiB: page through /api/v1/keys\n",
                        ALL_KEYS_BODY_MAX >> 20);
    }
}

/* The principal the job's bearer token, or else its client certificate (verified against
 * the control port's CAs and CRL, its CN an ACL cert-cn), names; NULL: none
 * (common/http_auth.h). The token is wiped. */
static const kvp_principal_t *credential(job_t *job, const kvp_master_view_t *v)
{
    return kvp_http_cred_check(&job->cred, v->acl, v->tls);
}

/* With an ACL, every view but /metrics and /health (which hold no key) is an admin's: its
 * credential must name an admin principal. false: refused (401 or 403, counted). /metrics
 * is never refused: its per-tenant series go only to an admin (job->tenants), or to all
 * with --metrics-tenants on; without an ACL there are no tenants to show. */
static bool admitted(job_t *job, kvp_master_state_t *st, const kvp_master_view_t *v)
{
    job->tenants = v->acl == NULL || st->config.metrics_tenants;
    if (v->acl == NULL || job->kind == JOB_HEALTH || job->next_page)
        return true; /* (a next page: its request's first was admitted) */
    if (job->kind == JOB_METRICS) {
        if (!job->tenants && (job->cred.token[0] != '\0' || job->cred.cert_len > 0)) {
            const kvp_principal_t *who = credential(job, v);
            job->tenants = who != NULL && (who->roles & KVP_ROLE_ADMIN);
        }
        return true;
    }
    kvp_http_reply_t *r = job->reply;
    const kvp_principal_t *who = credential(job, v);
    if (who != NULL && (who->roles & KVP_ROLE_ADMIN)) {
        snprintf(job->who, sizeof(job->who), "%s", who->name);
        return true;
    }
    r->content_type = "application/json";
    if (who == NULL) {
        r->status = 401;
        st->stats.refused_http_unauth++;
        kvp_http_printf(r, "{\"error\":\"authentication required: send Authorization: Bearer "
                           "TOKEN, or a client certificate, of an admin principal\"}\n");
    } else {
        r->status = 403;
        st->stats.refused_http_role++;
        char msg[200];
        snprintf(msg, sizeof(msg), "principal %s is not an admin", who->name);
        kvp_http_printf(r, "{\"error\":");
        kvp_http_json_string(r, msg, strlen(msg));
        kvp_http_printf(r, "}\n");
    }
    KVP_LOG_WARN_LIMITED("http: a request refused (%s)",
                         who == NULL ? "no admin token" : "not an admin");
    return false;
}

static void render(job_t *job, kvp_master_state_t *st, const kvp_master_view_t *v)
{
    kvp_http_reply_t *r = job->reply;
    if (!admitted(job, st, v))
        return;
    const kvp_segment_table_t *t = &st->segments;
    switch (job->kind) {
    case JOB_METRICS:
        r->content_type = "text/plain; version=0.0.4; charset=utf-8";
        kvp_master_metrics_render(r, st, v, job->tenants);
        break;
    case JOB_HEALTH:
        render_health(r, st, v);
        break;
    case JOB_STAT:
        r->content_type = "application/json";
        render_stat(r, st, v);
        break;
    case JOB_SEGMENTS:
        r->content_type = "application/json";
        render_segments(r, st);
        break;
    case JOB_ALL_SEGMENTS: /* Mooncake's form: one segment name a line */
        for (uint32_t i = 0; i < t->n_slots; i++)
            if (t->slots[i] != NULL)
                kvp_http_printf(r, "%s\n", t->slots[i]->name);
        break;
    case JOB_QUERY_SEGMENT: { /* Mooncake's form */
        const kvp_segment_t *seg = kvp_segment_table_find_name(t, job->text);
        if (seg == NULL) {
            r->status = 404;
            kvp_http_printf(r, "no segment named %.200s\n", job->text);
            break;
        }
        kvp_http_printf(r, "%s\nUsed(bytes): %" PRIu64 "\nCapacity(bytes): %" PRIu64 "\n",
                        seg->name, kvp_segment_stored(seg), seg->size);
        break;
    }
    case JOB_KEYS:
        r->content_type = "application/json";
        render_keys(r, st, v, job);
        break;
    case JOB_ALL_KEYS:
        r->content_type = "text/plain; charset=utf-8";
        render_all_keys(r, st, v, job);
        break;
    case JOB_DRAIN:
        kvp_drain_views_render(r, st, v, job->drain, job->text, job->body, job->body_len);
        break;
    case JOB_ADMIT: /* admitted: the body may be read */
        break;
    case JOB_TENANT_QUOTAS:
        kvp_tenant_quotas_render(r, st, v, job->method, job->has_tenant ? job->text : NULL,
                                 job->tenant_len, job->body, job->body_len, job->who, &job->save);
        job->quotas = job->save ? v->quotas : NULL;
        break;
    }
}

void kvp_master_http_serve(kvp_master_http_t *h, kvp_master_state_t *st,
                           const kvp_master_view_t *view)
{
    uint64_t n;
    if (read(h->efd, &n, sizeof(n)) < 0) { /* EAGAIN: nothing new; the list says */
    }
    pthread_mutex_lock(&h->lock);
    job_t *jobs = h->jobs;
    h->jobs = NULL;
    pthread_mutex_unlock(&h->lock);
    /* taken: each HTTP thread waits for its job's done flag (http_views.h) */
    while (jobs != NULL) {
        job_t *job = jobs;
        jobs = job->next;
        render(job, st, view);
        pthread_mutex_lock(&h->lock);
        job->done = true;
        pthread_cond_broadcast(&h->cond);
        pthread_mutex_unlock(&h->lock);
    }
}
