/*
 * http.c - the HTTP server behind /metrics and the admin views (see http.h),
 * on libmicrohttpd.
 *
 * Design: libmicrohttpd parses requests on a pool of its own threads (epoll);
 * a request reaches the handler only once its header is complete, and the
 * library bounds what a client can cost: KVP_HTTP_CONN_MEMORY per connection
 * (a larger header gets 431 from the library), KVP_HTTP_TIMEOUT_S of
 * silence, KVP_HTTP_MAX_CONNS connections in all. The handler builds the
 * whole body in memory; the library sends it as the socket allows.
 */
#include "common/http.h"

#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/parse.h"

#define KVP_HTTP_THREADS 2
#define KVP_HTTP_TIMEOUT_S 10
#define KVP_HTTP_MAX_CONNS 1024
#define KVP_HTTP_CONN_MEMORY (64u << 10)

struct kvp_http {
    struct MHD_Daemon *d;
    kvp_http_handler_fn fn;
    void *arg;
    _Atomic size_t post_max;    /* POST/PUT bodies taken up to this size; 0: none */
    void (*too_big)(void *arg); /* a POST body refused for its size (counted by the caller) */
    char *cert, *key;           /* HTTPS: PEM text (the key wiped at stop); NULL: plain HTTP */
    char *trust; /* HTTPS: the CAs whose client certificates are asked for; NULL: none */
    size_t cert_len, key_len, trust_len;
};

struct kvp_http_request {
    struct MHD_Connection *c;
    const char *method;
    const char *body; /* a POST's or PUT's whole body (NUL-terminated), or NULL */
    size_t body_len;
};

/* A POST or PUT being received: its body so far. */
typedef struct post {
    char *buf;
    size_t len, cap;
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
    atomic_store(&h->post_max, max_body);
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
    (void)cls, (void)c, (void)toe;
    post_t *p = *con_cls;
    if (p != NULL) {
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
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
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

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_len, void **con_cls)
{
    kvp_http_t *h = cls;
    (void)version;
    kvp_http_reply_t r = {.status = 200, .content_type = "text/plain; charset=utf-8"};
    size_t post_max = atomic_load(&h->post_max);
    kvp_http_request_t req = {.c = c, .method = method};
    if (post_max > 0 && (strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0)) {
        post_t *p = *con_cls;
        if (p == NULL) { /* the header is in: a body may follow */
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
            if (cl != NULL && strtoull(cl, NULL, 10) > post_max)
                return refuse_big(h, c);
            if ((p = calloc(1, sizeof(*p))) == NULL)
                return MHD_NO;
            *con_cls = p;
            return MHD_YES;
        }
        if (*upload_len > 0) {
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
        if (p->too_big) {
            static const char msg[] = "{\"error\": \"the body is over the size limit\"}";
            return answer_now(c, 413, msg);
        }
        req.body = p->buf != NULL ? p->buf : "";
        if (p->buf != NULL)
            p->buf[p->len] = '\0';
        req.body_len = p->len;
        h->fn(h->arg, url, &req, &r);
    } else if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
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
    if (r.status == 405)
        MHD_add_response_header(resp, "Allow",
                                r.allow != NULL ? r.allow
                                : post_max > 0  ? "GET, HEAD, POST"
                                                : "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, r.status, resp);
    MHD_destroy_response(resp);
    return ret;
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

kvp_status_t kvp_http_start_tls(const char *hostport, const char *cert_file, const char *key_file,
                                const char *trust_file, kvp_http_handler_fn fn, void *arg,
                                kvp_http_t **http_p, uint16_t *bound_port_p)
{
    char host[256];
    uint16_t port;
    if (hostport == NULL || fn == NULL ||
        kvp_parse_hostport(hostport, host, sizeof(host), &port) != KVP_OK)
        return KVP_ERR_INVALID_ARG;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (strcmp(host, "localhost") == 0)
        snprintf(host, sizeof(host), "127.0.0.1");
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return KVP_ERR_INVALID_ARG;
    kvp_http_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return KVP_ERR_NOMEM;
    h->fn = fn;
    h->arg = arg;
    unsigned tls = 0;
    if (cert_file != NULL) {
        h->cert = slurp(cert_file, &h->cert_len);
        h->key = slurp(key_file, &h->key_len);
        if (trust_file != NULL)
            h->trust = slurp(trust_file, &h->trust_len);
        if (h->cert == NULL || h->key == NULL || (trust_file != NULL && h->trust == NULL)) {
            free(h->cert);
            free(h->trust);
            wipe_free(h->key, h->key_len);
            free(h);
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
    h->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG | tls, port, NULL, NULL,
        answer, h, MHD_OPTION_ARRAY, tls ? tls_opts : no_opts, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sa, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)KVP_HTTP_THREADS,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)KVP_HTTP_TIMEOUT_S, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)KVP_HTTP_MAX_CONNS, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)KVP_HTTP_CONN_MEMORY, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_NOTIFY_COMPLETED, post_done, NULL,
        MHD_OPTION_END);
    if (h->d == NULL) {
        free(h->cert);
        free(h->trust);
        wipe_free(h->key, h->key_len);
        free(h);
        return KVP_ERR_SYSTEM;
    }
    if (bound_port_p != NULL) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
        *bound_port_p = info != NULL ? info->port : port;
    }
    *http_p = h;
    return KVP_OK;
}

void kvp_http_stop(kvp_http_t *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->d);
    free(h->cert);
    free(h->trust);
    wipe_free(h->key, h->key_len);
    free(h);
}
