/*
 * http.h - a small HTTP/1.1 GET server for metrics and admin views, on
 * libmicrohttpd (see http.c).
 *
 * Thread: the server runs on threads of its own (libmicrohttpd's pool, epoll);
 * the handler is called on one of them, never on the caller's loop. A slow or
 * hostile client (slowloris, garbage, huge headers) costs one connection slot
 * and is timed out; it never reaches the handler with a partial request.
 *
 * Caps every server keeps (http.c; docs/operations.md, "HTTP limits"): KVP_HTTP_MAX_CONNS
 * connections in all and KVP_HTTP_PER_PEER per peer address, a new connection taking the
 * place of the oldest one still waiting for its request head (so /health gets in while a
 * flood holds the pool); KVP_HTTP_HEAD_S for a request's head, TLS handshake included,
 * from the accept (or the previous request's end), which trickled bytes do not extend;
 * KVP_HTTP_BODY_BUDGET bytes of unfinished bodies per tenant (the one the admit check
 * charged, kvp_http_charge; a body past it is answered 503 before it is read), for at most
 * KVP_HTTP_BODY_TENANTS tenants at once and KVP_HTTP_BODY_TOTAL bytes in all;
 * KVP_HTTP_REQUEST_S for a whole request from its head (a body trickled in, an answer read
 * slowly: closed). kvp_http_metrics shows what they refused.
 */
#ifndef KVP_COMMON_HTTP_H
#define KVP_COMMON_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>

#include "common/status.h"

#define KVP_HTTP_MAX_CONNS 1024 /* connections held at once */
#define KVP_HTTP_PER_PEER 128   /* ... from one peer address */
#define KVP_HTTP_HEAD_S 8 /* a request's head, TLS handshake included (under the idle timeout) */
#define KVP_HTTP_BODY_BUDGET (64u << 20)      /* bytes of bodies being received, per tenant */
#define KVP_HTTP_BODY_TENANTS 256             /* tenants with bodies being received at once */
#define KVP_HTTP_BODY_TOTAL ((size_t)1 << 30) /* bytes of bodies being received, in all */
#define KVP_HTTP_REQUEST_S 60 /* a whole request from its head: its body read, its answer sent */

typedef struct kvp_http kvp_http_t;
typedef struct kvp_http_request kvp_http_request_t;

/* A growable reply body: kvp_http_printf appends; the server frees it. */
typedef struct kvp_http_reply {
    unsigned status;          /* 200 unless the handler says otherwise */
    const char *content_type; /* static string; default "text/plain; charset=utf-8" */
    char *body;
    size_t len, cap;
    int oom;           /* an append failed: the server answers 500 */
    const char *allow; /* a 405's Allow header (static); NULL: the methods the server takes */
} kvp_http_reply_t;

/* Called for every GET or HEAD (and, after kvp_http_accept_post, every request: the
 * handler answers a method it does not take, kvp_http_method): path is the URL's path (no
 * query). */
typedef void (*kvp_http_handler_fn)(void *arg, const char *path, const kvp_http_request_t *req,
                                    kvp_http_reply_t *reply);

/* A query argument of the request (?name=value, URL-decoded), or NULL. */
const char *kvp_http_query(const kvp_http_request_t *req, const char *name);
/* The same with its decoded length in *len_p: a value holding a NUL (`%00`) is longer than
 * its strlen, so a name check sees all of it, not the part before the NUL. */
const char *kvp_http_query_n(const kvp_http_request_t *req, const char *name, size_t *len_p);

/* Append to the reply body (printf format). */
void kvp_http_printf(kvp_http_reply_t *reply, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Append len bytes. */
void kvp_http_append(kvp_http_reply_t *reply, const char *data, size_t len);
/* Append s as a JSON string literal, quotes included. */
void kvp_http_json_string(kvp_http_reply_t *reply, const char *s, size_t len);

/* "HOST:PORT" as the servers below take it (HOST an IPv4 address or localhost; port 0:
 * any free port) into *sa; false: not such an address. */
bool kvp_http_listen_addr(const char *hostport, struct sockaddr_in *sa);

/*
 * Listen on "HOST:PORT" (port 0: any free port; *bound_port_p gets it) and serve
 * until kvp_http_stop. KVP_ERR_INVALID_ARG for a bad address, KVP_ERR_SYSTEM when
 * it cannot listen.
 */
kvp_status_t kvp_http_start(const char *hostport, kvp_http_handler_fn fn, void *arg,
                            kvp_http_t **http_p, uint16_t *bound_port_p);
/* The same over HTTPS (TLS 1.3 only) with a PEM certificate and key (kept in memory
 * until stop, then wiped). trust_file (PEM CAs, or NULL): clients are asked for a
 * certificate (not required; the handler verifies what kvp_http_peer_cert gives).
 * KVP_ERR_INVALID_ARG when a file cannot be read. */
kvp_status_t kvp_http_start_tls(const char *hostport, const char *cert_file, const char *key_file,
                                const char *trust_file, kvp_http_handler_fn fn, void *arg,
                                kvp_http_t **http_p, uint16_t *bound_port_p);
/* The certificate the client presented over HTTPS (DER, valid during the request), its
 * length; 0: none (plain HTTP, or none sent). Not verified: the caller does that. */
size_t kvp_http_peer_cert(const kvp_http_request_t *req, const void **der_p);
/* A request header (e.g. "Authorization"), or NULL. */
const char *kvp_http_header(const kvp_http_request_t *req, const char *name);

/* Take POST and PUT requests too (else 405), with bodies of up to max_body bytes (a larger one is
 * answered 413 before it is read, and the connection closed: too_big(the handler's arg) is
 * called, to count it; NULL: nothing), handed to the handler whole (kvp_http_body). Call it
 * right after start, before the address is announced. */
void kvp_http_accept_post(kvp_http_t *http, size_t max_body, void (*too_big)(void *arg));
/* Called once a request's head is in, before any of its body is read, for every request but
 * a GET or HEAD: true lets the body be read and the request go to the handler; false
 * answers with reply at once (the handler's 401 or 403, say) and closes the connection,
 * the body unread. It decides from the method, path, headers and peer certificate alone
 * (kvp_http_body is NULL). */
typedef bool (*kvp_http_admit_fn)(void *arg, const char *path, const kvp_http_request_t *req,
                                  kvp_http_reply_t *reply);
/* Called by an admit check that lets a body be read: charge it to tenant's budget of bodies
 * being received (the tenant of the principal the credential names), or, with tenant NULL or
 * "", to principal's own. A body nobody charged (no ACL: one trust domain) takes the one
 * shared account. Never from a name the client chose. */
void kvp_http_charge(const kvp_http_request_t *req, const char *tenant, const char *principal);
/* Set the server's admit check (the handler's arg is passed). Call it right after start. */
void kvp_http_admit(kvp_http_t *http, kvp_http_admit_fn fn);
/* Append the server's own refusals and load as Prometheus text, the names prefixed with
 * prefix (e.g. "kvpool_indexer_http"): PREFIX_connections_refused_total{reason="peer",
 * "pool", "head_deadline", "body_budget"}, PREFIX_connections, PREFIX_body_bytes. */
void kvp_http_metrics(const kvp_http_request_t *req, const char *prefix, kvp_http_reply_t *reply);

/* The request's method ("GET", "HEAD", "POST", "PUT", "DELETE", ...). */
const char *kvp_http_method(const kvp_http_request_t *req);
/* A POST's or PUT's body (NUL-terminated; "" when empty), its length in *len_p; NULL for
 * others. */
const char *kvp_http_body(const kvp_http_request_t *req, size_t *len_p);
/* Is the client on this host (127.0.0.0/8 or ::1)? */
bool kvp_http_peer_is_loopback(const kvp_http_request_t *req);

/* Stop serving, close every connection, wait for the handler threads. NULL is fine. */
void kvp_http_stop(kvp_http_t *http);

#endif
