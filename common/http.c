/*
 * http.c - the HTTP server behind /metrics and the admin views (see http.h),
 * on libmicrohttpd.
 *
 * Design: libmicrohttpd parses requests on a pool of its own threads (epoll);
 * a request reaches the handler only once its header is complete, and the
 * library bounds what a client can cost: KVP_HTTP_CONN_MEMORY per connection
 * (a larger header gets 431 from the library), KVP_HTTP_TIMEOUT_S of
 * silence. The handler builds the whole body in memory; the library sends it
 * as the socket allows.
 *
 * What the library does not bound, this file does:
 *  - Connections: the library's idle timeout is reset by every byte, and its
 *    per-IP limit refuses the newest connection, so a flood from the prober's own
 *    address would starve /health. Instead common/http_guard.c holds a slot per
 *    connection (opened and released in notify()), caps them in all and per peer
 *    by closing the oldest connection still waiting for its head, and a thread of
 *    ours (sweeper()) closes every connection whose head (handshake included) is
 *    not in KVP_HTTP_HEAD_S after the accept. A connection is closed by
 *    shutdown(2) of its socket, which the library's threads see as the peer's
 *    end and close; the guard's lock, taken again in notify() before the library
 *    closes the socket, keeps a closed descriptor from being shut down.
 *  - Bodies: the owner's admit check runs on the head before any byte of a body
 *    is read (a stranger's body is never buffered), and the bytes of bodies
 *    being received are reserved from the budget of the tenant the admit check
 *    charged them to (kvp_http_charge; KVP_HTTP_BODY_BUDGET each; the whole
 *    Content-Length at the head, as a chunked body grows otherwise). The accounts
 *    are a fixed table of KVP_HTTP_BODY_TENANTS (common/http_guard.h, a tenant's
 *    taken while it has bytes reserved), the bytes of all of them bounded by
 *    KVP_HTTP_BODY_TOTAL, and a request costs one pass over the table, no
 *    allocation. A whole request, body and answer, has KVP_HTTP_REQUEST_S from its
 *    head (the same sweeper), so no tenant holds its share for longer. Requests nobody
 *    charged (no ACL: one trust domain) share one account.
 */
#include "common/http.h"

#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/acl.h"
#include "common/clock.h"
#include "common/http_guard.h"
#include "common/log.h"
#include "common/parse.h"

#define KVP_HTTP_THREADS 2
#define KVP_HTTP_TIMEOUT_S 10
#define KVP_HTTP_CONN_MEMORY (64u << 10)
/* slots beyond KVP_HTTP_MAX_CONNS: connections closed by the caps, not yet released */
#define KVP_HTTP_SPARE_SLOTS 128u
#define KVP_HTTP_SWEEP_MS 100
/* an account's key: 't' and a tenant, 'p' and a principal, or "" (nobody charged) */
#define KVP_HTTP_KEY_MAX KVP_HTTP_BUDGET_KEY_MAX
_Static_assert(KVP_HTTP_KEY_MAX > 1 + KVP_ACL_NAME_MAX &&
                   KVP_HTTP_KEY_MAX > 1 + KVP_TENANT_NAME_MAX,
               "a body account's key holds every tenant's and principal's name whole");

struct kvp_http {
    struct MHD_Daemon *d;
    kvp_http_handler_fn fn;
    kvp_http_admit_fn admit; /* NULL: every body is read */
    void *arg;
    _Atomic size_t post_max;    /* POST/PUT bodies taken up to this size; 0: none */
    void (*too_big)(void *arg); /* a POST body refused for its size (counted by the caller) */
    char *cert, *key;           /* HTTPS: PEM text (the key wiped at stop); NULL: plain HTTP */
    char *trust; /* HTTPS: the CAs whose client certificates are asked for; NULL: none */
    size_t cert_len, key_len, trust_len;
    kvp_http_guard_t *guard;
    kvp_http_budget_t *budget;       /* bodies being received, per tenant */
    _Atomic uint64_t refused_budget; /* bodies refused for the budget */
    pthread_t sweeper;               /* closes heads past their deadline */
    pthread_mutex_t lock;            /* stopping */
    pthread_cond_t cond;
    bool stopping, sweeping;
};

struct kvp_http_request {
    kvp_http_t *h;
    struct MHD_Connection *c;
    const char *method;
    const char *body; /* a POST's or PUT's whole body (NUL-terminated), or NULL */
    size_t body_len;
    char *charge; /* the admit check's: the account a body is charged to (answer()'s) */
};

/* A POST or PUT being received: its body so far. */
typedef struct post {
    kvp_http_t *h;
    char *buf;
    size_t len, cap;
    size_t reserved; /* from the account's budget */
    int account;     /* h->accounts' index; -1: none yet */
    char key[KVP_HTTP_KEY_MAX];
    bool too_big;   /* a body without a Content-Length grew past the limit: dropped */
    size_t dropped; /* bytes dropped since */
} post_t;

/* A body without a Content-Length (chunked) that grows past the limit is dropped as it
 * comes and answered 413 at its end (libmicrohttpd answers nothing in the middle of a
 * body); past this much more, the connection is closed. */
#define KVP_HTTP_DROP_MAX (64u << 20)

void kvp_http_accept_post(kvp_http_t *h, size_t max_body, void (*too_big)(void *arg))
{
    h->too_big = too_big;
    /* one largest body always fits */
    kvp_http_budget_set(h->budget,
                        max_body > KVP_HTTP_BODY_BUDGET ? max_body : KVP_HTTP_BODY_BUDGET);
    atomic_store(&h->post_max, max_body);
}

void kvp_http_admit(kvp_http_t *h, kvp_http_admit_fn fn)
{
    h->admit = fn;
}

void kvp_http_charge(const kvp_http_request_t *req, const char *tenant, const char *principal)
{
    if (req->charge == NULL)
        return;
    if (tenant != NULL && tenant[0] != '\0')
        snprintf(req->charge, KVP_HTTP_KEY_MAX, "t%s", tenant);
    else if (principal != NULL && principal[0] != '\0')
        snprintf(req->charge, KVP_HTTP_KEY_MAX, "p%s", principal);
}

/* Reserve n more bytes of p's body from its tenant's account (nothing unless OK). */
static kvp_http_budget_result_t reserve_budget(kvp_http_t *h, post_t *p, size_t n)
{
    kvp_http_budget_result_t res = kvp_http_budget_reserve(h->budget, p->key, &p->account, n);
    if (res == KVP_HTTP_BUDGET_OK)
        p->reserved += n;
    return res;
}

void kvp_http_metrics(const kvp_http_request_t *req, const char *prefix, kvp_http_reply_t *r)
{
    kvp_http_t *h = req->h;
    kvp_http_guard_stats_t st;
    kvp_http_guard_stats(h->guard, &st);
    kvp_http_printf(r,
                    "# HELP %s_connections_refused_total Connections and bodies the HTTP "
                    "server closed or refused for its caps, by the cap.\n"
                    "# TYPE %s_connections_refused_total counter\n",
                    prefix, prefix);
    const char *names[] = {"peer", "pool", "head_deadline", "request_deadline", "body_budget"};
    uint64_t v[] = {st.peer, st.pool, st.head_deadline, st.request_deadline,
                    atomic_load(&h->refused_budget)};
    for (size_t i = 0; i < 5; i++)
        kvp_http_printf(r, "%s_connections_refused_total{reason=\"%s\"} %" PRIu64 "\n", prefix,
                        names[i], v[i]);
    kvp_http_printf(r,
                    "# HELP %s_connections Connections the HTTP server holds.\n"
                    "# TYPE %s_connections gauge\n%s_connections %" PRIu64 "\n"
                    "# HELP %s_body_bytes Bytes reserved by request bodies being received.\n"
                    "# TYPE %s_body_bytes gauge\n%s_body_bytes %zu\n",
                    prefix, prefix, prefix, st.live, prefix, prefix, prefix,
                    kvp_http_budget_bytes(h->budget));
}

const char *kvp_http_method(const kvp_http_request_t *req)
{
    return req->method;
}

const char *kvp_http_body(const kvp_http_request_t *req, size_t *len_p)
{
    *len_p = req->body_len;
    return req->body;
}

bool kvp_http_peer_is_loopback(const kvp_http_request_t *req)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(req->c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci == NULL || ci->client_addr == NULL)
        return false;
    if (ci->client_addr->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ci->client_addr;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (ci->client_addr->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ci->client_addr;
        return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    }
    return false;
}

static void post_done(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    kvp_http_t *h = cls;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci != NULL) /* the next request's head is due within the deadline */
        kvp_http_guard_request(h->guard, (int)(intptr_t)ci->socket_context - 1, false,
                               kvp_now_ns());
    post_t *p = *con_cls;
    if (p != NULL) {
        kvp_http_budget_release(h->budget, p->account, p->reserved);
        free(p->buf);
        free(p);
        *con_cls = NULL;
    }
}

/* A fixed answer (413, 500) at once, before the body is read: the library closes the
 * connection after it. */
static enum MHD_Result answer_now(struct MHD_Connection *c, unsigned status, const char *text);

/* 413 for a POST body over the limit, before it is read; counted through too_big. */
static enum MHD_Result refuse_big(kvp_http_t *h, struct MHD_Connection *c)
{
    static const char msg[] = "{\"error\": \"the body is over the size limit\"}";
    if (h->too_big != NULL)
        h->too_big(h->arg);
    return answer_now(c, 413, msg);
}

static enum MHD_Result answer_now(struct MHD_Connection *c, unsigned status, const char *text)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

const char *kvp_http_query(const kvp_http_request_t *req, const char *name)
{
    return MHD_lookup_connection_value(req->c, MHD_GET_ARGUMENT_KIND, name);
}

const char *kvp_http_query_n(const kvp_http_request_t *req, const char *name, size_t *len_p)
{
    const char *v = NULL;
    size_t len = 0;
    if (MHD_lookup_connection_value_n(req->c, MHD_GET_ARGUMENT_KIND, name, strlen(name), &v,
                                      &len) != MHD_YES)
        return NULL;
    *len_p = len;
    return v;
}

static int reserve(kvp_http_reply_t *r, size_t n)
{
    if (r->oom)
        return 0;
    if (r->len + n + 1 <= r->cap)
        return 1;
    size_t cap = r->cap ? r->cap : 4096;
    while (cap < r->len + n + 1)
        cap *= 2;
    char *b = realloc(r->body, cap);
    if (b == NULL) {
        r->oom = 1;
        return 0;
    }
    r->body = b;
    r->cap = cap;
    return 1;
}

void kvp_http_append(kvp_http_reply_t *r, const char *data, size_t len)
{
    if (!reserve(r, len))
        return;
    memcpy(r->body + r->len, data, len);
    r->len += len;
    r->body[r->len] = '\0';
}

void kvp_http_printf(kvp_http_reply_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(small)) {
        kvp_http_append(r, small, (size_t)n);
        return;
    }
    if (!reserve(r, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(r->body + r->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    r->len += (size_t)n;
}

void kvp_http_json_string(kvp_http_reply_t *r, const char *s, size_t len)
{
    kvp_http_append(r, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        kvp_http_append(r, s + run, i - run);
        run = i + 1;
        if (ch == '"')
            kvp_http_append(r, "\\\"", 2);
        else if (ch == '\\')
            kvp_http_append(r, "\\\\", 2);
        else
            kvp_http_printf(r, "\\u%04x", ch);
    }
    kvp_http_append(r, s + run, len - run);
    kvp_http_append(r, "\"", 1);
}

/* 503 for a body over its tenant's budget (or with every account held by others), before
 * it is read; counted. */
static enum MHD_Result refuse_budget(kvp_http_t *h, struct MHD_Connection *c,
                                     kvp_http_budget_result_t res)
{
    atomic_fetch_add(&h->refused_budget, 1);
    size_t mib = kvp_http_budget_per_account(h->budget) >> 20;
    char msg[256];
    if (res == KVP_HTTP_BUDGET_TENANT) {
        KVP_LOG_WARN_LIMITED("http: a request body refused: its tenant's budget of %zu MiB of "
                             "bodies being received is spent",
                             mib);
        snprintf(msg, sizeof(msg),
                 "{\"error\": \"this tenant's request bodies being received are over its "
                 "budget of %zu MiB (KVP_HTTP_BODY_BUDGET): finish or close them, then try "
                 "again later\"}",
                 mib);
    } else if (res == KVP_HTTP_BUDGET_FULL) {
        KVP_LOG_WARN_LIMITED("http: a request body refused: the bodies being received hold "
                             "the server's %zu MiB",
                             KVP_HTTP_BODY_TOTAL >> 20);
        snprintf(msg, sizeof(msg),
                 "{\"error\": \"the request bodies being received hold the server's %zu MiB "
                 "(KVP_HTTP_BODY_TOTAL): try again later\"}",
                 KVP_HTTP_BODY_TOTAL >> 20);
    } else {
        KVP_LOG_WARN_LIMITED("http: a request body refused: %u other tenants have bodies "
                             "being received",
                             (unsigned)KVP_HTTP_BODY_TENANTS);
        snprintf(msg, sizeof(msg),
                 "{\"error\": \"request bodies of %u other tenants are being received (the "
                 "server's most at once): try again later\"}",
                 (unsigned)KVP_HTTP_BODY_TENANTS);
    }
    return answer_now(c, 503, msg);
}

/* The first call of a POST or PUT, its head in: refused (413 for its size, 503 over its
 * tenant's body budget) or readied to take its body, charged to key (the admit check's). */
static enum MHD_Result post_begin(kvp_http_t *h, struct MHD_Connection *c, size_t post_max,
                                  const char *key, void **con_cls)
{
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    unsigned long long want = cl != NULL ? strtoull(cl, NULL, 10) : 0;
    if (want > post_max)
        return refuse_big(h, c);
    post_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return MHD_NO;
    p->h = h;
    p->account = -1;
    snprintf(p->key, sizeof(p->key), "%s", key);
    kvp_http_budget_result_t res =
        want > 0 ? reserve_budget(h, p, (size_t)want) : KVP_HTTP_BUDGET_OK;
    if (res != KVP_HTTP_BUDGET_OK) {
        free(p);
        return refuse_budget(h, c, res);
    }
    *con_cls = p;
    return MHD_YES;
}

/* Take a piece of a POST's or PUT's body. */
static enum MHD_Result post_take(kvp_http_t *h, post_t *p, const char *upload, size_t *upload_len,
                                 size_t post_max)
{
    if (!p->too_big && p->len + *upload_len > post_max) {
        p->too_big = true; /* counted now, answered at the body's end */
        if (h->too_big != NULL)
            h->too_big(h->arg);
        free(p->buf);
        p->buf = NULL;
        p->len = p->cap = 0;
    }
    if (p->too_big) {
        p->dropped += *upload_len;
        *upload_len = 0;
        return p->dropped > KVP_HTTP_DROP_MAX ? MHD_NO : MHD_YES;
    }
    if (p->len + *upload_len + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 4096;
        while (cap < p->len + *upload_len + 1)
            cap *= 2;
        /* a body of unknown length reserves as it grows; past the budget the connection is
         * closed (nothing can be answered in the middle of a body) */
        if (cap > p->reserved && reserve_budget(h, p, cap - p->reserved) != KVP_HTTP_BUDGET_OK) {
            atomic_fetch_add(&h->refused_budget, 1);
            KVP_LOG_WARN_LIMITED("http: a request body dropped: its tenant's budget of bodies "
                                 "being received is spent");
            return MHD_NO;
        }
        char *b = realloc(p->buf, cap);
        if (b == NULL)
            return MHD_NO;
        p->buf = b;
        p->cap = cap;
    }
    memcpy(p->buf + p->len, upload, *upload_len);
    p->len += *upload_len;
    *upload_len = 0;
    return MHD_YES;
}

/* Queue the handler's reply (a 500 when it ran out of memory). */
static enum MHD_Result send_reply(struct MHD_Connection *c, kvp_http_reply_t r, size_t post_max,
                                  bool close)
{
    if (r.oom) {
        free(r.body);
        r = (kvp_http_reply_t){.status = 500, .content_type = "text/plain; charset=utf-8"};
        static const char msg[] = "out of memory\n";
        r.body = strdup(msg);
        r.len = r.body ? sizeof(msg) - 1 : 0;
    }
    struct MHD_Response *resp;
    if (r.body == NULL)
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    else
        resp = MHD_create_response_from_buffer(r.len, r.body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(r.body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", r.content_type);
    if (close)
        MHD_add_response_header(resp, "Connection", "close");
    if (r.status == 405)
        MHD_add_response_header(resp, "Allow",
                                r.allow != NULL ? r.allow
                                : post_max > 0  ? "GET, HEAD, POST"
                                                : "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, r.status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* The first call of a request: its head is in (the guard stops its deadline). */
static void head_in(kvp_http_t *h, struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci != NULL)
        kvp_http_guard_request(h->guard, (int)(intptr_t)ci->socket_context - 1, true, kvp_now_ns());
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **con_cls)
{
    kvp_http_t *h = cls;
    (void)version;
    kvp_http_reply_t r = {.status = 200, .content_type = "text/plain; charset=utf-8"};
    size_t post_max = atomic_load(&h->post_max);
    char charge[KVP_HTTP_KEY_MAX] = ""; /* nobody charged: the shared account */
    kvp_http_request_t req = {.h = h, .c = c, .method = method, .charge = charge};
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (*con_cls == NULL) {
        head_in(h, c);
        if (!get && h->admit != NULL && !h->admit(h->arg, url, &req, &r))
            return send_reply(c, r, post_max, true); /* before any of the body is read */
    }
    if (post_max > 0 && (strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0)) {
        post_t *p = *con_cls;
        if (p == NULL) /* the header is in: a body may follow */
            return post_begin(h, c, post_max, charge, con_cls);
        if (*upload_len > 0)
            return post_take(h, p, upload, upload_len, post_max);
        if (p->too_big) {
            static const char msg[] = "{\"error\": \"the body is over the size limit\"}";
            return answer_now(c, 413, msg);
        }
        req.body = p->buf != NULL ? p->buf : "";
        if (p->buf != NULL)
            p->buf[p->len] = '\0';
        req.body_len = p->len;
        h->fn(h->arg, url, &req, &r);
    } else if (!get) {
        if (*upload_len > 0) { /* a body we do not read: drop it */
            *upload_len = 0;
            return MHD_YES;
        }
        if (post_max > 0) { /* an API: the handler answers (405 in its own words) */
            h->fn(h->arg, url, &req, &r);
        } else {
            r.status = 405;
            kvp_http_printf(&r, "method %s not allowed: only GET and HEAD\n", method);
        }
    } else {
        h->fn(h->arg, url, &req, &r);
    }
    return send_reply(c, r, post_max, false);
}

/* The guard's kick: the library's thread sees the end of the socket and closes it. */
static void kick(void *arg, int fd)
{
    (void)arg;
    shutdown(fd, SHUT_RDWR);
}

/* A connection opened (a slot from the guard, or refused) or closed (its slot released). */
static void notify(void *cls, struct MHD_Connection *c, void **socket_context,
                   enum MHD_ConnectionNotificationCode code)
{
    kvp_http_t *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        kvp_http_guard_close(h->guard, (int)(intptr_t)*socket_context - 1);
        *socket_context = NULL;
        return;
    }
    kvp_http_peer_t peer = {{0}};
    const union MHD_ConnectionInfo *ai =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ai != NULL && ai->client_addr != NULL && ai->client_addr->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ai->client_addr;
        peer.addr[10] = peer.addr[11] = 0xff;
        memcpy(peer.addr + 12, &in->sin_addr, 4);
    } else if (ai != NULL && ai->client_addr != NULL && ai->client_addr->sa_family == AF_INET6) {
        memcpy(peer.addr, &((const struct sockaddr_in6 *)ai->client_addr)->sin6_addr, 16);
    }
    const union MHD_ConnectionInfo *fi =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (fi == NULL)
        return;
    int slot = kvp_http_guard_open(h->guard, &peer, fi->connect_fd, kvp_now_ns());
    *socket_context = (void *)(intptr_t)(slot + 1);
    if (slot < 0) {
        KVP_LOG_WARN_LIMITED("http: a connection refused: every slot of its peer (at most %u) "
                             "or of the server (%u) is inside a request",
                             (unsigned)KVP_HTTP_PER_PEER, (unsigned)KVP_HTTP_MAX_CONNS);
        shutdown(fi->connect_fd, SHUT_RDWR);
    }
}

/* Closes the connections whose head is past its deadline, every KVP_HTTP_SWEEP_MS. */
static void *sweeper(void *arg)
{
    kvp_http_t *h = arg;
    pthread_mutex_lock(&h->lock);
    while (!h->stopping) {
        struct timespec t = kvp_deadline_ms(KVP_HTTP_SWEEP_MS);
        pthread_cond_timedwait(&h->cond, &h->lock, &t);
        pthread_mutex_unlock(&h->lock);
        unsigned n = kvp_http_guard_sweep(h->guard, kvp_now_ns());
        if (n > 0)
            KVP_LOG_WARN_LIMITED("http: %u connections closed: no request head within %u s", n,
                                 (unsigned)KVP_HTTP_HEAD_S);
        pthread_mutex_lock(&h->lock);
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[256];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t n = strlen(line);
    while (n > 0 && line[n - 1] == '\n')
        line[--n] = '\0';
    KVP_LOG_DEBUG("http: %s", line);
}

const char *kvp_http_header(const kvp_http_request_t *req, const char *name)
{
    return MHD_lookup_connection_value(req->c, MHD_HEADER_KIND, name);
}

/* A whole (small) file as a NUL-terminated string; NULL: unreadable or over 1 MiB. */
static char *slurp(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    char *buf = malloc(1u << 20);
    size_t n = buf != NULL ? fread(buf, 1, (1u << 20) - 1, f) : 0;
    bool whole = feof(f) != 0;
    fclose(f);
    if (buf == NULL || !whole || n == 0) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len_p = n;
    return buf;
}

static void wipe_free(char *p, size_t len)
{
    if (p == NULL)
        return;
    volatile char *v = p;
    for (size_t i = 0; i < len; i++)
        v[i] = 0;
    free(p);
}

static void free_http(kvp_http_t *h)
{
    free(h->cert);
    free(h->trust);
    wipe_free(h->key, h->key_len);
    kvp_http_budget_destroy(h->budget);
    free(h);
}

/* The connection caps and the thread that keeps the head deadline. */
static kvp_status_t guard_start(kvp_http_t *h)
{
    h->guard = kvp_http_guard_create(KVP_HTTP_MAX_CONNS + KVP_HTTP_SPARE_SLOTS, KVP_HTTP_MAX_CONNS,
                                     KVP_HTTP_PER_PEER, (uint64_t)KVP_HTTP_HEAD_S * 1000000000ull,
                                     kick, h);
    if (h->guard == NULL)
        return KVP_ERR_NOMEM;
    kvp_http_guard_request_deadline(h->guard, (uint64_t)KVP_HTTP_REQUEST_S * 1000000000ull);
    pthread_mutex_init(&h->lock, NULL);
    pthread_condattr_t cattr;
    pthread_condattr_init(&cattr);
    pthread_condattr_setclock(&cattr, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cond, &cattr);
    pthread_condattr_destroy(&cattr);
    if (pthread_create(&h->sweeper, NULL, sweeper, h) != 0) {
        pthread_cond_destroy(&h->cond);
        pthread_mutex_destroy(&h->lock);
        kvp_http_guard_destroy(h->guard);
        return KVP_ERR_NOMEM;
    }
    h->sweeping = true;
    return KVP_OK;
}

static void guard_stop(kvp_http_t *h)
{
    if (!h->sweeping)
        return;
    pthread_mutex_lock(&h->lock);
    h->stopping = true;
    pthread_cond_signal(&h->cond);
    pthread_mutex_unlock(&h->lock);
    pthread_join(h->sweeper, NULL);
    pthread_cond_destroy(&h->cond);
    pthread_mutex_destroy(&h->lock);
    kvp_http_guard_destroy(h->guard);
    h->sweeping = false;
}

kvp_status_t kvp_http_start(const char *hostport, kvp_http_handler_fn fn, void *arg,
                            kvp_http_t **http_p, uint16_t *bound_port_p)
{
    return kvp_http_start_tls(hostport, NULL, NULL, NULL, fn, arg, http_p, bound_port_p);
}

size_t kvp_http_peer_cert(const kvp_http_request_t *req, const void **der_p)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(req->c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (ci == NULL || ci->tls_session == NULL)
        return 0;
    unsigned n = 0;
    const gnutls_datum_t *l = gnutls_certificate_get_peers((gnutls_session_t)ci->tls_session, &n);
    if (l == NULL || n == 0)
        return 0;
    *der_p = l[0].data;
    return l[0].size;
}

bool kvp_http_listen_addr(const char *hostport, struct sockaddr_in *sa)
{
    char host[256];
    uint16_t port;
    if (hostport == NULL || kvp_parse_hostport(hostport, host, sizeof(host), &port) != KVP_OK)
        return false;
    *sa = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(port)};
    if (strcmp(host, "localhost") == 0)
        snprintf(host, sizeof(host), "127.0.0.1");
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1;
}

kvp_status_t kvp_http_start_tls(const char *hostport, const char *cert_file, const char *key_file,
                                const char *trust_file, kvp_http_handler_fn fn, void *arg,
                                kvp_http_t **http_p, uint16_t *bound_port_p)
{
    struct sockaddr_in sa;
    if (fn == NULL || !kvp_http_listen_addr(hostport, &sa))
        return KVP_ERR_INVALID_ARG;
    kvp_http_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return KVP_ERR_NOMEM;
    h->fn = fn;
    h->arg = arg;
    h->budget =
        kvp_http_budget_create(KVP_HTTP_BODY_TENANTS, KVP_HTTP_BODY_BUDGET, KVP_HTTP_BODY_TOTAL);
    if (h->budget == NULL) {
        free(h);
        return KVP_ERR_NOMEM;
    }
    unsigned tls = 0;
    if (cert_file != NULL) {
        h->cert = slurp(cert_file, &h->cert_len);
        h->key = slurp(key_file, &h->key_len);
        if (trust_file != NULL)
            h->trust = slurp(trust_file, &h->trust_len);
        if (h->cert == NULL || h->key == NULL || (trust_file != NULL && h->trust == NULL)) {
            free_http(h);
            return KVP_ERR_INVALID_ARG;
        }
        tls = MHD_USE_TLS;
    }
    struct MHD_OptionItem tls_opts[] = {
        {MHD_OPTION_HTTPS_MEM_CERT, 0, h->cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, h->key},
        {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)"NORMAL:-VERS-ALL:+VERS-TLS1.3"},
        /* a trust list: libmicrohttpd asks each client for a certificate (GNUTLS_CERT_REQUEST) */
        {h->trust != NULL ? MHD_OPTION_HTTPS_MEM_TRUST : MHD_OPTION_END, 0, h->trust},
        {MHD_OPTION_END, 0, NULL},
    };
    struct MHD_OptionItem no_opts[] = {{MHD_OPTION_END, 0, NULL}};
    if (guard_start(h) != KVP_OK) {
        free_http(h);
        return KVP_ERR_NOMEM;
    }
    h->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG | tls,
        ntohs(sa.sin_port), NULL, NULL, answer, h, MHD_OPTION_ARRAY, tls ? tls_opts : no_opts,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)KVP_HTTP_THREADS, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)KVP_HTTP_TIMEOUT_S,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(KVP_HTTP_MAX_CONNS + KVP_HTTP_SPARE_SLOTS),
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)KVP_HTTP_CONN_MEMORY,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_NOTIFY_COMPLETED, post_done, h, MHD_OPTION_NOTIFY_CONNECTION, notify, h,
        MHD_OPTION_END);
    if (h->d == NULL) {
        guard_stop(h);
        free_http(h);
        return KVP_ERR_SYSTEM;
    }
    if (bound_port_p != NULL) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
        *bound_port_p = info != NULL ? info->port : ntohs(sa.sin_port);
    }
    *http_p = h;
    return KVP_OK;
}

void kvp_http_stop(kvp_http_t *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->d); /* every connection released from the guard */
    guard_stop(h);
    free_http(h);
}
