/*
 * etcd.c - etcd v3 over the JSON gateway with libcurl, its answers read with the project's
 * JSON tokenizer (common/json.h; see etcd.h).
 *
 * DESIGN
 * One easy handle and one multi handle per kvp_etcd_t. Every request, unary
 * or watch, runs through the multi interface in etcd_attempt(): the loop polls
 * at most 100 ms at a time, so a watch sees its stop flag and its own
 * deadlines without relying on libcurl's progress callback (which fires only
 * about once a second on an idle stream). Connections are kept between calls
 * in the multi handle's cache.
 *
 * The gateway (etcd 3.4.23, checked against a live server; see
 * ../shared/notes/toolchain.md section 3):
 *  - POST only; keys and values base64; int64s in answers are JSON strings
 *    (read with strtoll, never through a double); fields that are zero,
 *    false or empty are left out (a failed txn has no "succeeded", a missing
 *    key no "kvs", a dead lease's keepalive no "TTL", a PUT event no "type").
 *  - Request bodies are built with asprintf: they hold only base64 text and
 *    decimal numbers, which need no JSON escaping.
 *  - Errors: {"error","message","code"} with a gRPC code: 5 not found,
 *    11 compacted, 14 unavailable (no leader, request timed out: the member
 *    cannot serve, so the next endpoint is tried), 4 deadline exceeded, 1
 *    canceled ("the client connection is closing": a member stopping, in a
 *    watch stream; unreachable too).
 *  - Streams (keepalive, watch) wrap each message as {"result":{...}}, one
 *    per line. A watch first answers "created":true, then events. A watch
 *    from a compacted revision answers "canceled":true with
 *    "compact_revision" and leaves the stream open (we close it). When etcd
 *    stops, the stream just ends and libcurl reports CURLE_OK.
 *
 * Security (etcd.h): the TLS options are set on the easy handle before every
 * attempt (curl_easy_reset clears them); with a CA, libcurl's default CA
 * directory is turned off, so only that CA is trusted. The token rides in a
 * second header list (auth_headers) next to the plain one used to
 * authenticate. etcd_request() wraps every request: authenticate first when
 * a user is set and no token is held, and when etcd refuses the token
 * ("invalid auth token", gRPC code 16: expired; "user name is empty": auth
 * was enabled after we started; "revision of auth store is old") drop it,
 * authenticate again and retry once. A user configured while etcd has
 * authentication off is not an error: requests go without a token (a
 * warning says so) until etcd asks for one, so auth can be enabled on a
 * running pool. Secrets (password, token, the authenticate body and answer)
 * are wiped with explicit_bzero before their memory is freed.
 *
 * Failures are counted process-wide by reason (kvp_etcd_stats): each request
 * sets e->reason where it fails; -1 means "not a failure" (a watch that saw
 * no change, a key or lease not found, a stop).
 *
 * libcurl's global state: curl_global_init runs when the first handle of the
 * process is created and curl_global_cleanup when the last is destroyed
 * (etcd_curl_ref/unref, a count under a mutex), so no thread races the
 * (before 7.84 not thread-safe) global init, and a process that destroys its
 * handles leaves nothing of libcurl behind for the leak checkers.
 *
 * Thread: a handle is used by one thread at a time; the global count is the
 * only shared state.
 */
#include "common/etcd.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/json.h"
#include "common/log.h"
#include "common/macros.h"

/* Longest a multi poll sleeps: the stop-flag check interval of a watch. */
#define ETCD_POLL_MS 100
/* Most endpoints in one list. */
#define ETCD_MAX_ENDPOINTS 16
/* Longest password read from a password file. */
#define ETCD_MAX_PASSWORD 1024
/* e->reason of a request that has not failed. */
#define ETCD_NO_FAILURE (-1)

typedef struct etcd_buf {
    char *p;
    size_t n;
    size_t cap;
} etcd_buf_t;

/* One HTTP exchange, unary or watch. */
typedef struct etcd_xfer {
    etcd_buf_t body;
    /* watch only */
    bool watch;
    bool created; /* the server acknowledged the watch: the endpoint works */
    bool done;    /* an event or a final answer is in; stop the transfer */
    kvp_status_t status;
    int64_t start_rev;
    kvp_etcd_event_t ev;
    kvp_etcd_t *e;
} etcd_xfer_t;

struct kvp_etcd {
    CURL *easy;
    CURLM *multi;
    struct curl_slist *headers;
    char *urls[ETCD_MAX_ENDPOINTS]; /* "http://host:port", no trailing slash */
    int n_urls;
    int cur; /* the endpoint tried first */
    uint32_t timeout_ms;
    char err[1024];
    char curl_err[CURL_ERROR_SIZE]; /* libcurl's detail of the last transfer's failure */
    /* security (kvp_etcd_create_ex); NULL: unset */
    char *ca, *cert, *key;
    char *user;
    char *password;                  /* secret: wiped at destroy */
    char *password_file;             /* read again at each authentication (a rotation) */
    char *token;                     /* secret: wiped when dropped; NULL: none held */
    struct curl_slist *auth_headers; /* headers + "Authorization: <token>"; NULL: no token */
    bool auth_off;                   /* etcd said authentication is not enabled */
    bool token_refused;              /* the last answer refused our token (or its lack) */
    int reason;                      /* kvp_etcd_fail_reason_t of this request, or -1 */
};

/* ---- process-wide counters ---- */

static _Atomic uint64_t etcd_failed_n[KVP_ETCD_FAIL_REASONS];
static _Atomic uint64_t etcd_auth_n, etcd_reauth_n;

void kvp_etcd_stats(kvp_etcd_stats_t *stats)
{
    for (int i = 0; i < KVP_ETCD_FAIL_REASONS; i++)
        stats->failed[i] = atomic_load_explicit(&etcd_failed_n[i], memory_order_relaxed);
    stats->authentications = atomic_load_explicit(&etcd_auth_n, memory_order_relaxed);
    stats->reauthentications = atomic_load_explicit(&etcd_reauth_n, memory_order_relaxed);
}

/* ---- libcurl's global state ---- */

static pthread_mutex_t etcd_curl_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned etcd_curl_users;

static kvp_status_t etcd_curl_ref(void)
{
    kvp_status_t status = KVP_OK;
    pthread_mutex_lock(&etcd_curl_mu);
    if (etcd_curl_users == 0 && curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        status = KVP_ERR_NOMEM;
    else
        etcd_curl_users++;
    pthread_mutex_unlock(&etcd_curl_mu);
    return status;
}

static void etcd_curl_unref(void)
{
    pthread_mutex_lock(&etcd_curl_mu);
    if (--etcd_curl_users == 0)
        curl_global_cleanup();
    pthread_mutex_unlock(&etcd_curl_mu);
}

/* ---- errors ---- */

static kvp_status_t etcd_fail(kvp_etcd_t *e, kvp_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static kvp_status_t etcd_fail(kvp_etcd_t *e, kvp_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err, sizeof(e->err), fmt, ap);
    va_end(ap);
    KVP_LOG_DEBUG("etcd: %s", e->err);
    if (status == KVP_ERR_PROTOCOL)
        e->reason = KVP_ETCD_FAIL_OTHER;
    return status;
}

const char *kvp_etcd_error(const kvp_etcd_t *e)
{
    return e->err;
}

const char *kvp_etcd_endpoint(const kvp_etcd_t *e)
{
    return e->urls[e->cur];
}

/* ---- base64 (the gateway's keys and values) ---- */

static const char b64_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* malloc'd, NUL-terminated base64 of p[0..n); NULL when out of memory. */
static char *b64_encode(const void *p, size_t n)
{
    const uint8_t *in = p;
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (out == NULL)
        return NULL;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        *o++ = b64_chars[v >> 18];
        *o++ = b64_chars[v >> 12 & 63];
        *o++ = b64_chars[v >> 6 & 63];
        *o++ = b64_chars[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
        *o++ = b64_chars[v >> 18];
        *o++ = b64_chars[v >> 12 & 63];
        *o++ = i + 1 < n ? b64_chars[v >> 6 & 63] : '=';
        *o++ = '=';
    }
    *o = '\0';
    return out;
}

static int b64_value(char c)
{
    const char *p = c != '\0' ? strchr(b64_chars, c) : NULL;
    return p != NULL ? (int)(p - b64_chars) : -1;
}

/* Decode base64 text (NULL or missing: empty) into a malloc'd, NUL-terminated
 * buffer. KVP_ERR_PROTOCOL for text that is not base64. */
static kvp_status_t b64_decode(const char *text, char **out_p, size_t *len_p)
{
    size_t n = text != NULL ? strlen(text) : 0;
    char *out = malloc(n / 4 * 3 + 3);
    if (out == NULL)
        return KVP_ERR_NOMEM;
    size_t o = 0;
    uint32_t v = 0;
    int bits = 0;
    size_t i = 0;
    for (; i < n && text[i] != '='; i++) {
        int d = b64_value(text[i]);
        if (d < 0) {
            free(out);
            return KVP_ERR_PROTOCOL;
        }
        v = v << 6 | (uint32_t)d;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)(v >> bits & 0xff);
        }
    }
    for (; i < n; i++) {
        if (text[i] != '=') {
            free(out);
            return KVP_ERR_PROTOCOL;
        }
    }
    out[o] = '\0';
    *out_p = out;
    *len_p = o;
    return KVP_OK;
}

/* ---- JSON answers ---- */

/*
 * A parsed answer: its tokens and the text they point into, which it owns (a unary answer's
 * body, taken from its transfer). Tokens are indices; -1 is "none" (a field absent, or
 * looked up in something that is not an object), and every helper takes -1, so a path of
 * lookups needs no check at each step.
 */
typedef struct etcd_json {
    kvp_json_t j;
    char *text;
    size_t cap;    /* bytes allocated at text (for a wipe) */
    char why[128]; /* a parse that failed: why (not JSON, too many values, ...) */
} etcd_json_t;

/* Parse text[0..len) into r (r->text stays the caller's): false when it is not JSON, or
 * more than the reader takes (r->why says which). */
static bool etcd_json_parse(etcd_json_t *r, const char *text, size_t len)
{
    memset(r, 0, sizeof(*r));
    if (kvp_json_parse(&r->j, text, len, r->why, sizeof(r->why)) == KVP_JSON_OK)
        return true;
    KVP_LOG_DEBUG("etcd: an answer that is not JSON: %s", r->why);
    kvp_json_free(&r->j);
    return false;
}

/* Free r (and its text; wiped first when it held a secret). A zeroed r is fine. */
static void etcd_json_free(etcd_json_t *r, bool wipe)
{
    kvp_json_free(&r->j);
    if (wipe && r->text != NULL)
        explicit_bzero(r->text, r->cap);
    free(r->text);
    memset(r, 0, sizeof(*r));
}

static bool j_is(const kvp_json_t *j, int64_t tok, kvp_json_type_t type)
{
    return tok >= 0 && (uint32_t)tok < j->n && j->t[tok].type == type;
}

/* The value of field name in object obj (case-sensitive; the first of that name), or -1. */
static int64_t j_get(const kvp_json_t *j, int64_t obj, const char *name)
{
    return j_is(j, obj, KVP_J_OBJECT) ? kvp_json_get(j, (uint32_t)obj, name) : -1;
}

/* Element i of array arr, or -1. */
static int64_t j_item(const kvp_json_t *j, int64_t arr, uint32_t i)
{
    if (!j_is(j, arr, KVP_J_ARRAY) || i >= j->t[arr].size)
        return -1;
    uint32_t e = (uint32_t)arr + 1;
    while (i-- > 0)
        e = j->t[e].next;
    return e;
}

/* String token tok unescaped into a malloc'd copy: *s_p NULL when tok is not a string.
 * KVP_ERR_NOMEM; KVP_ERR_PROTOCOL for a string holding a \u0000. */
static kvp_status_t j_strdup(const kvp_json_t *j, int64_t tok, char **s_p)
{
    *s_p = NULL;
    if (!j_is(j, tok, KVP_J_STRING))
        return KVP_OK;
    size_t cap = kvp_json_str_cap(j, (uint32_t)tok);
    char *s = malloc(cap);
    if (s == NULL)
        return KVP_ERR_NOMEM;
    if (!kvp_json_str(j, (uint32_t)tok, s, cap)) { /* (cap always suffices) */
        free(s);
        return KVP_ERR_PROTOCOL;
    }
    *s_p = s;
    return KVP_OK;
}

/* An int64 field: a JSON string of digits in the gateway's answers, read with strtoll (a
 * JSON integer is read exactly too); missing, or anything else, means 0. */
static int64_t j_int64(const kvp_json_t *j, int64_t obj, const char *name)
{
    int64_t f = j_get(j, obj, name), v = 0;
    if (j_is(j, f, KVP_J_STRING)) {
        char small[32], *text = small;
        if (!kvp_json_str(j, (uint32_t)f, small, sizeof(small)) && j_strdup(j, f, &text) != KVP_OK)
            return 0;
        v = strtoll(text, NULL, 10);
        if (text != small)
            free(text);
        return v;
    }
    return j_is(j, f, KVP_J_NUMBER) && kvp_json_i64(j, (uint32_t)f, &v) ? v : 0;
}

static bool j_true(const kvp_json_t *j, int64_t obj, const char *name)
{
    return j_is(j, j_get(j, obj, name), KVP_J_TRUE);
}

/* A decoded key-value from a "kvs" entry or an event's "kv". */
typedef struct etcd_kv {
    char *key;
    size_t key_len;
    char *val;
    size_t len;
    int64_t create_rev;
    int64_t mod_rev;
    int64_t lease;
} etcd_kv_t;

static void etcd_kv_cleanup(etcd_kv_t *kv)
{
    free(kv->key);
    free(kv->val);
}

/* A base64 string field of obj, decoded (absent or not a string: empty). */
static kvp_status_t j_b64(const kvp_json_t *j, int64_t obj, const char *name, char **out_p,
                          size_t *len_p)
{
    char *text;
    kvp_status_t status = j_strdup(j, j_get(j, obj, name), &text);
    if (status == KVP_OK)
        status = b64_decode(text, out_p, len_p);
    free(text);
    return status;
}

static kvp_status_t etcd_kv_parse(kvp_etcd_t *e, const kvp_json_t *j, int64_t o, etcd_kv_t *kv)
{
    memset(kv, 0, sizeof(*kv));
    if (!j_is(j, o, KVP_J_OBJECT))
        return etcd_fail(e, KVP_ERR_PROTOCOL, "etcd answer without the expected kv object");
    kvp_status_t status = j_b64(j, o, "key", &kv->key, &kv->key_len);
    if (status == KVP_OK) {
        status = j_b64(j, o, "value", &kv->val, &kv->len);
        if (status != KVP_OK)
            free(kv->key);
    }
    if (status != KVP_OK)
        return etcd_fail(e, status, "etcd answer with a key or value that is not base64");
    kv->create_rev = j_int64(j, o, "create_revision");
    kv->mod_rev = j_int64(j, o, "mod_revision");
    kv->lease = j_int64(j, o, "lease");
    return KVP_OK;
}

static bool has(const char *text, const char *part)
{
    return text != NULL && strstr(text, part) != NULL;
}

/*
 * An error answer about credentials (code: gRPC code, msg: etcd's text, may
 * be NULL)? Then keep a sentence saying what to do, note whether a new token
 * may help (e->token_refused) and return true: the request is refused.
 */
static bool etcd_auth_answer(kvp_etcd_t *e, int code, const char *msg, const char *path, long http)
{
    const char *hint;
    if (code == 16 || has(msg, "invalid auth token") || has(msg, "revision of auth store is old")) {
        e->token_refused = true; /* expired, or the auth store changed: authenticate again */
        hint = e->user != NULL ? "etcd refused a fresh token" : "etcd wants a token";
    } else if (has(msg, "user name is empty")) {
        e->token_refused = true; /* authentication was enabled after we started */
        hint = e->user != NULL ? "etcd asks for a user although we sent a fresh token"
                               : "etcd has authentication enabled: configure an etcd user "
                                 "and its password file";
    } else if (has(msg, "authentication failed")) {
        hint = "check the etcd user and its password file";
    } else if (code == 7 || has(msg, "permission denied")) {
        hint = "grant the etcd user's role readwrite on the prefix /kvpool/<cluster>/";
    } else {
        return false;
    }
    /* the user name is not secret; the password and the token never enter the text */
    char who[300] = "";
    if (e->user != NULL)
        snprintf(who, sizeof(who), " (user '%s')", e->user);
    etcd_fail(e, KVP_ERR_DENIED, "etcd %s refused %s%s: %s (%s; HTTP %ld, gRPC code %d)",
              e->urls[e->cur], path, who, msg != NULL ? msg : "no error text", hint, http, code);
    if (strcmp(path, "/v3/auth/authenticate") == 0)
        etcd_fail(e, KVP_ERR_DENIED, "etcd %s: authentication as user '%s' failed: %s (%s)",
                  e->urls[e->cur], e->user, msg != NULL ? msg : "no error text", hint);
    e->reason = KVP_ETCD_FAIL_AUTH;
    return true;
}

/*
 * Map an error answer ({"error","message","code"}, or a stream's
 * {"error":{...}}) to a status and keep its text. *retry_p: the member cannot
 * serve now (unavailable, deadline): another endpoint may.
 */
static kvp_status_t etcd_error_answer(kvp_etcd_t *e, long http, const kvp_json_t *j,
                                      const char *path, bool *retry_p)
{
    int64_t err = j_get(j, 0, "error");
    int64_t obj = j_is(j, err, KVP_J_OBJECT) ? err : 0;
    char *msg = NULL; /* NULL: no text (or none could be copied) */
    if (j_strdup(j, j_get(j, obj, "message"), &msg) == KVP_OK && msg == NULL)
        (void)j_strdup(j, err, &msg);
    int64_t code_item = j_get(j, obj, "code");
    if (code_item < 0)
        code_item = j_get(j, obj, "grpc_code");
    int64_t code64;
    int code = j_is(j, code_item, KVP_J_NUMBER) && kvp_json_i64(j, (uint32_t)code_item, &code64) &&
                       code64 >= INT_MIN && code64 <= INT_MAX
                   ? (int)code64
                   : -1;
    kvp_status_t status = KVP_ERR_PROTOCOL;
    *retry_p = false;
    if (strcmp(path, "/v3/auth/authenticate") == 0 && has(msg, "authentication is not enabled")) {
        e->auth_off = true; /* see etcd_authenticate */
        status = etcd_fail(e, KVP_ERR_UNSUPPORTED, "etcd %s: %s", e->urls[e->cur], msg);
        free(msg);
        return status;
    }
    if (etcd_auth_answer(e, code, msg, path, http)) {
        free(msg);
        return KVP_ERR_DENIED;
    }
    switch (code) {
    case 5: /* NotFound: lease not found */
        status = KVP_ERR_NOT_FOUND;
        break;
    case 11: /* OutOfRange: revision compacted */
        status = KVP_ERR_OUT_OF_RANGE;
        break;
    case 14: /* Unavailable: no leader, request timed out, leader changed */
        status = KVP_ERR_CONNECT;
        *retry_p = true;
        break;
    case 1: /* Canceled: "grpc: the client connection is closing" when the member stops */
        if (has(msg, "closing")) {
            status = KVP_ERR_CONNECT;
            *retry_p = true;
        }
        break;
    case 4: /* DeadlineExceeded */
        status = KVP_ERR_TIMEOUT;
        *retry_p = true;
        break;
    default:
        break;
    }
    etcd_fail(e, status, "etcd %s on %s: %s (HTTP %ld, gRPC code %d)", path, e->urls[e->cur],
              msg != NULL ? msg : "no error text", http, code);
    free(msg);
    if (status == KVP_ERR_CONNECT || status == KVP_ERR_TIMEOUT)
        e->reason = KVP_ETCD_FAIL_CONNECT;
    if (status == KVP_ERR_PROTOCOL)
        KVP_LOG_WARN("etcd: %s", e->err); /* a request etcd rejects is our bug */
    return status;
}

/* ---- transfers ---- */

static bool buf_append(etcd_buf_t *b, const char *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = KVP_MAX(b->cap * 2, b->n + n + 1);
        cap = KVP_MAX(cap, (size_t)1024);
        char *q = realloc(b->p, cap);
        if (q == NULL)
            return false;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

/* A watch's "canceled" answer (res: its result): x->status says why. */
static void watch_canceled(etcd_xfer_t *x, const kvp_json_t *j, int64_t res)
{
    kvp_etcd_t *e = x->e;
    int64_t compact = j_int64(j, res, "compact_revision");
    char *why = NULL;
    kvp_status_t status = j_strdup(j, j_get(j, res, "cancel_reason"), &why);
    if (status != KVP_OK)
        x->status = etcd_fail(e, status, "etcd canceled the watch: its reason unreadable");
    /* a refused token or permission: "rpc error: code = Unauthenticated desc = ..." */
    else if (has(why, "code = Unauthenticated") || has(why, "code = PermissionDenied") ||
             has(why, "code = InvalidArgument"))
        x->status =
            etcd_auth_answer(e, has(why, "Unauthenticated") ? 16 : -1, why, "/v3/watch", 200)
                ? KVP_ERR_DENIED
                : etcd_fail(e, KVP_ERR_PROTOCOL, "etcd canceled the watch: %s", why);
    else if (compact > 0)
        x->status = etcd_fail(e, KVP_ERR_OUT_OF_RANGE,
                              "etcd watch from revision %" PRId64
                              " refused: compacted up to revision %" PRId64,
                              x->start_rev, compact);
    else
        x->status = etcd_fail(e, KVP_ERR_PROTOCOL, "etcd canceled the watch: %s",
                              why != NULL ? why : "no reason given");
    x->done = true;
    free(why);
}

/* One line of a watch stream: {"result":{...}} or an error. */
static void watch_line(etcd_xfer_t *x, const char *line, size_t len)
{
    kvp_etcd_t *e = x->e;
    etcd_json_t r;
    bool parsed = etcd_json_parse(&r, line, len);
    const kvp_json_t *j = &r.j;
    int64_t res = j_get(j, 0, "result");
    if (!j_is(j, res, KVP_J_OBJECT)) {
        bool retry;
        x->status = parsed ? etcd_error_answer(e, 200, j, "/v3/watch", &retry)
                           : etcd_fail(e, KVP_ERR_PROTOCOL, "etcd watch: unparsable line");
        x->done = true;
        etcd_json_free(&r, false);
        return;
    }
    if (j_true(j, res, "created"))
        x->created = true;
    if (j_true(j, res, "canceled")) {
        watch_canceled(x, j, res);
        etcd_json_free(&r, false);
        return;
    }
    int64_t events = j_get(j, res, "events");
    uint32_t n = j_is(j, events, KVP_J_ARRAY) ? j->t[events].size : 0;
    for (uint32_t i = 0, ev = (uint32_t)events + 1; i < n; i++, ev = j->t[ev].next) {
        etcd_kv_t kv;
        x->status = etcd_kv_parse(e, j, j_get(j, ev, "kv"), &kv);
        if (x->status != KVP_OK) {
            x->done = true;
            break;
        }
        if (kv.mod_rev < x->start_rev) {
            etcd_kv_cleanup(&kv);
            continue;
        }
        char type[16];
        int64_t t = j_get(j, ev, "type");
        bool del = j_is(j, t, KVP_J_STRING) && kvp_json_str(j, (uint32_t)t, type, sizeof(type)) &&
                   strcmp(type, "DELETE") == 0;
        x->ev.type = del ? KVP_ETCD_EVENT_DELETE : KVP_ETCD_EVENT_PUT;
        x->ev.mod_rev = kv.mod_rev;
        x->ev.create_rev = del ? 0 : kv.create_rev;
        x->ev.val = del ? NULL : kv.val;
        x->ev.len = del ? 0 : kv.len;
        if (del)
            free(kv.val);
        free(kv.key);
        x->done = true;
        break;
    }
    etcd_json_free(&r, false);
}

static size_t etcd_write_cb(char *data, size_t size, size_t nmemb, void *arg)
{
    etcd_xfer_t *x = arg;
    size_t n = size * nmemb;
    if (x->done)
        return n; /* the rest of a stream we are about to close */
    if (!buf_append(&x->body, data, n))
        return 0; /* CURLE_WRITE_ERROR */
    if (!x->watch)
        return n;
    char *nl;
    while (!x->done && (nl = memchr(x->body.p, '\n', x->body.n)) != NULL) {
        *nl = '\0';
        watch_line(x, x->body.p, (size_t)(nl - x->body.p));
        x->body.n -= (size_t)(nl + 1 - x->body.p);
        memmove(x->body.p, nl + 1, x->body.n + 1);
    }
    return n;
}

/* The TLS settings of one attempt (curl_easy_reset cleared them). */
static void etcd_set_tls(kvp_etcd_t *e, CURL *h)
{
    e->curl_err[0] = '\0';
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, e->curl_err);
    if (e->ca != NULL) {
        curl_easy_setopt(h, CURLOPT_CAINFO, e->ca);
        curl_easy_setopt(h, CURLOPT_CAPATH, NULL); /* this CA only, not the system's */
    }
    if (e->cert != NULL) {
        curl_easy_setopt(h, CURLOPT_SSLCERT, e->cert);
        curl_easy_setopt(h, CURLOPT_SSLKEY, e->key);
    }
}

/* A transfer that failed in libcurl: keep what happened, with a hint for TLS failures. */
static kvp_status_t etcd_curl_failure(kvp_etcd_t *e, CURLcode rc, const char *path, int idx)
{
    const char *detail = e->curl_err[0] != '\0' ? e->curl_err : curl_easy_strerror(rc);
    const char *hint = NULL;
    switch (rc) {
    case CURLE_PEER_FAILED_VERIFICATION:
        hint = "etcd's certificate is not signed by the etcd CA file, or does not name this "
               "host: check the CA (--etcd-cacert, KVPOOL_ETCD_CACERT) and the certificate's "
               "subjectAltName";
        break;
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
        hint = "a certificate or key file could not be used";
        break;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
        if (has(detail, "alert") || has(detail, "SSL") || has(detail, "TLS"))
            hint = has(detail, "certificate required") || has(detail, "unknown ca") ||
                           has(detail, "bad certificate")
                       ? "etcd refused our client certificate (it runs --client-cert-auth): "
                         "give one signed by its --trusted-ca-file (--etcd-cert and "
                         "--etcd-key, KVPOOL_ETCD_CERT and KVPOOL_ETCD_KEY)"
                       : "TLS failed";
        break;
    default:
        break;
    }
    /* TLS 1.3: the client's handshake ends before the server checks our certificate, so a
     * refusal may arrive as the connection closing under libcurl rather than as the alert
     * (or, when libcurl's first request is already on its way, as its send failing) */
    if (hint == NULL && strncmp(e->urls[idx], "https://", 8) == 0 &&
        (has(detail, "getpeername") || has(detail, "reset by peer") ||
         has(detail, "SSL_ERROR_SYSCALL") || has(detail, "unexpected eof") ||
         has(detail, "Broken pipe")))
        hint = "etcd closed the connection at the TLS handshake: it may refuse our client "
               "certificate, or want one (--client-cert-auth): give one signed by its "
               "--trusted-ca-file (--etcd-cert and --etcd-key, KVPOOL_ETCD_CERT and "
               "KVPOOL_ETCD_KEY)";
    if (hint == NULL) {
        e->reason = KVP_ETCD_FAIL_CONNECT;
        return etcd_fail(e, KVP_ERR_CONNECT, "etcd %s on %s: %s", path, e->urls[idx], detail);
    }
    e->reason = KVP_ETCD_FAIL_TLS;
    return etcd_fail(e, KVP_ERR_CONNECT, "etcd %s on %s: TLS: %s (%s)", path, e->urls[idx], detail,
                     hint);
}

typedef enum etcd_outcome {
    ETCD_ANSWERED, /* a whole answer (x->body, http) or a watch result (x->done) */
    ETCD_RETRY,    /* this endpoint failed: try the next */
    ETCD_FINAL,    /* stop here with the status */
} etcd_outcome_t;

/*
 * POST body to path on endpoint idx (which becomes e->cur). The endpoint has
 * e->timeout_ms to show it works: the whole answer of a unary call, the
 * "created" line of a watch. A watch then runs until `deadline`.
 */
static etcd_outcome_t etcd_attempt(kvp_etcd_t *e, int idx, const char *path, const char *body,
                                   etcd_xfer_t *x, uint64_t deadline, const atomic_bool *stop,
                                   long *http_p, kvp_status_t *status_p)
{
    char url[512];
    e->cur = idx;
    e->reason = ETCD_NO_FAILURE;
    snprintf(url, sizeof(url), "%s%s", e->urls[idx], path);
    CURL *h = e->easy;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, e->auth_headers != NULL ? e->auth_headers : e->headers);
    etcd_set_tls(e, h);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, etcd_write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)e->timeout_ms);
    x->body.n = 0;
    x->created = false;
    if (curl_multi_add_handle(e->multi, h) != CURLM_OK) {
        *status_p = etcd_fail(e, KVP_ERR_NOMEM, "curl_multi_add_handle failed");
        return ETCD_FINAL;
    }
    uint64_t alive_deadline = kvp_now_ms() + e->timeout_ms;
    if (!x->watch)
        deadline = alive_deadline;
    etcd_outcome_t out = ETCD_FINAL;
    CURLcode rc = CURLE_OK;
    for (;;) {
        int running = 0;
        CURLMcode mc = curl_multi_perform(e->multi, &running);
        if (mc != CURLM_OK) {
            *status_p =
                etcd_fail(e, KVP_ERR_INTERNAL, "curl_multi_perform: %s", curl_multi_strerror(mc));
            break;
        }
        if (x->done) {
            out = ETCD_ANSWERED;
            break;
        }
        if (running == 0) {
            int left;
            CURLMsg *m;
            rc = CURLE_GOT_NOTHING;
            while ((m = curl_multi_info_read(e->multi, &left)) != NULL)
                if (m->msg == CURLMSG_DONE)
                    rc = m->data.result;
            out = ETCD_ANSWERED;
            break;
        }
        if (stop != NULL && atomic_load(stop)) {
            *status_p = etcd_fail(e, KVP_ERR_SHUTDOWN, "etcd %s: stopped", path);
            break;
        }
        uint64_t now = kvp_now_ms();
        bool alive = x->watch && x->created;
        if (!alive && now >= alive_deadline) {
            *status_p = etcd_fail(e, KVP_ERR_TIMEOUT, "etcd %s on %s: no answer in %u ms", path,
                                  e->urls[idx], e->timeout_ms);
            e->reason = KVP_ETCD_FAIL_CONNECT;
            out = x->watch && now >= deadline ? ETCD_FINAL : ETCD_RETRY;
            break;
        }
        if (now >= deadline) {
            *status_p = etcd_fail(e, KVP_ERR_TIMEOUT, "etcd %s on %s: no change in time", path,
                                  e->urls[idx]);
            break;
        }
        uint64_t wait = KVP_MIN(deadline - now, (uint64_t)ETCD_POLL_MS);
        if (!alive)
            wait = KVP_MIN(wait, alive_deadline - now);
        curl_multi_poll(e->multi, NULL, 0, (int)wait + 1, NULL);
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, http_p);
    curl_multi_remove_handle(e->multi, h);
    if (out != ETCD_ANSWERED || x->done)
        return out;
    switch (rc) {
    case CURLE_OK:
        return ETCD_ANSWERED;
    case CURLE_OUT_OF_MEMORY:
    case CURLE_WRITE_ERROR:
        *status_p = etcd_fail(e, KVP_ERR_NOMEM, "etcd %s: out of memory", path);
        return ETCD_FINAL;
    case CURLE_OPERATION_TIMEDOUT:
        *status_p = etcd_fail(e, KVP_ERR_TIMEOUT, "etcd %s on %s: %s", path, e->urls[idx],
                              curl_easy_strerror(rc));
        e->reason = KVP_ETCD_FAIL_CONNECT;
        return ETCD_RETRY;
    default: /* cannot connect or resolve, connection reset, nothing answered, TLS */
        *status_p = etcd_curl_failure(e, rc, path, idx);
        return ETCD_RETRY;
    }
}

/* A failed answer that is not JSON: etcd's HTTP layer said no (its first line is kept). */
static kvp_status_t etcd_text_answer(kvp_etcd_t *e, long http, const char *body, const char *path)
{
    char text[200];
    size_t n = 0;
    for (const char *p = body != NULL ? body : ""; *p != '\0' && *p != '\n'; p++)
        if (n + 1 < sizeof(text))
            text[n++] = *p >= ' ' && *p < 127 ? *p : '?';
    text[n] = '\0';
    /* etcd 3.4 with --client-cert-auth and authentication both on refuses a gateway client
     * whose certificate names a CommonName */
    if (has(text, "CommonName of client")) {
        etcd_fail(e, KVP_ERR_DENIED,
                  "etcd %s on %s: %s (HTTP %ld; etcd with --client-cert-auth and authentication "
                  "both on takes JSON-gateway clients only with a certificate without a "
                  "CommonName: issue the etcd client certificate with an empty subject CN)",
                  path, e->urls[e->cur], text, http);
        e->reason = KVP_ETCD_FAIL_TLS;
        return KVP_ERR_DENIED;
    }
    return etcd_fail(e, KVP_ERR_PROTOCOL, "etcd %s on %s: HTTP %ld%s%s", path, e->urls[e->cur],
                     http, n > 0 ? ": " : "", text);
}

/* Note an endpoint's failure in the list of everything tried. */
static void etcd_note_failure(kvp_etcd_t *e, char *tried, size_t cap)
{
    size_t n = strlen(tried);
    if (snprintf(tried + n, cap - n, "%s%s", n > 0 ? "; " : "", e->err) >= (int)(cap - n))
        KVP_LOG_DEBUG("etcd: the list of endpoint failures is cut short");
}

/*
 * Run one request on the endpoints in turn, starting with the remembered one.
 * Unary (x->watch false): *resp_p is the parsed 200 answer, which takes x's body
 * (etcd_json_free it).
 * Watch: the outcome is in x (x->done) or the status; a stream that breaks
 * or ends goes on at the next endpoint from the same start revision.
 */
static kvp_status_t etcd_run(kvp_etcd_t *e, const char *path, const char *body, etcd_xfer_t *x,
                             uint32_t timeout_ms, const atomic_bool *stop, etcd_json_t *resp_p)
{
    uint64_t deadline = kvp_now_ms() + timeout_ms;
    kvp_status_t status = KVP_ERR_CONNECT;
    char tried[sizeof(e->err)] = "";
    int first = e->cur;
    for (int i = 0; i < e->n_urls; i++, etcd_note_failure(e, tried, sizeof(tried))) {
        int idx = (first + i) % e->n_urls;
        long http = 0;
        etcd_outcome_t out = etcd_attempt(e, idx, path, body, x, deadline, stop, &http, &status);
        if (out == ETCD_RETRY)
            continue;
        if (out == ETCD_FINAL)
            return status;
        if (x->done)
            return x->status;
        etcd_json_t r;
        bool parsed = etcd_json_parse(&r, x->body.p != NULL ? x->body.p : "", x->body.n);
        /* an error, or a stream's (keepalive's) {"error":{...}} */
        if (http != 200 || j_is(&r.j, j_get(&r.j, 0, "error"), KVP_J_OBJECT)) {
            bool retry = false;
            status = parsed ? etcd_error_answer(e, http, &r.j, path, &retry)
                            : etcd_text_answer(e, http, x->body.p, path);
            etcd_json_free(&r, false);
            if (retry)
                continue;
            return status;
        }
        if (x->watch) { /* the stream ended without an event: etcd went away */
            etcd_json_free(&r, false);
            status =
                etcd_fail(e, KVP_ERR_CONNECT, "etcd watch on %s: the stream ended", e->urls[idx]);
            continue;
        }
        if (!j_is(&r.j, 0, KVP_J_OBJECT)) {
            status =
                etcd_fail(e, KVP_ERR_PROTOCOL, "etcd %s on %s: answer is not a JSON object%s%s",
                          path, e->urls[idx], parsed ? "" : ": ", parsed ? "" : r.why);
            etcd_json_free(&r, false);
            return status;
        }
        r.text = x->body.p; /* the tokens point into it: the answer owns it now */
        r.cap = x->body.cap;
        x->body = (etcd_buf_t){0};
        *resp_p = r;
        return KVP_OK;
    }
    if (e->n_urls > 1)
        etcd_fail(e, status, "no etcd endpoint could serve %s: %s", path, tried);
    return status;
}

/* ---- authentication ---- */

/* Free a buffer that held a secret. */
static void etcd_wipe_free(char *p, size_t n)
{
    if (p != NULL)
        explicit_bzero(p, n);
    free(p);
}

/* Forget the token (wiped, with its header line). */
static void etcd_drop_token(kvp_etcd_t *e)
{
    for (struct curl_slist *l = e->auth_headers; l != NULL; l = l->next)
        explicit_bzero(l->data, strlen(l->data));
    curl_slist_free_all(e->auth_headers);
    e->auth_headers = NULL;
    if (e->token != NULL)
        etcd_wipe_free(e->token, strlen(e->token));
    e->token = NULL;
}

/* Append s as a JSON string body (quotes included) at out; returns the end. out must have
 * room for 6 * strlen(s) + 2 bytes. */
static char *json_string(char *out, const char *s)
{
    *out++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p == '"' || *p == '\\') {
            *out++ = '\\';
            *out++ = (char)*p;
        } else if (*p < 0x20) {
            out += sprintf(out, "\\u%04x", *p);
        } else {
            *out++ = (char)*p;
        }
    }
    *out++ = '"';
    return out;
}

static kvp_status_t etcd_read_password(const char *path, char **pw_p, char *err, size_t err_len);

/*
 * Get a token for e->user (POST /v3/auth/authenticate) and put it in
 * e->auth_headers. etcd with authentication off: KVP_OK without a token
 * (e->auth_off, a warning). Runs on the handle's thread; the body and the
 * answer hold secrets and are wiped.
 */
static kvp_status_t etcd_authenticate(kvp_etcd_t *e)
{
    /* the password file is read again each time, so that a password rotated in etcd and
     * written to the file is taken at the next authentication (a token that expired or was
     * refused), with no restart; unreadable now: the password read before */
    char *pw = NULL, why[512];
    if (etcd_read_password(e->password_file, &pw, why, sizeof(why)) != KVP_OK) {
        KVP_LOG_WARN_LIMITED("etcd: %s; authenticating with the password read before", why);
    } else if (strcmp(pw, e->password) != 0) {
        KVP_LOG_INFO("etcd: the password file %s changed: authenticating as '%s' with the "
                     "password it holds now",
                     e->password_file, e->user);
        etcd_wipe_free(e->password, ETCD_MAX_PASSWORD + 2);
        e->password = pw;
        pw = NULL;
    }
    if (pw != NULL)
        etcd_wipe_free(pw, ETCD_MAX_PASSWORD + 2);
    size_t cap = 6 * (strlen(e->user) + strlen(e->password)) + 32;
    char *body = malloc(cap);
    if (body == NULL)
        return etcd_fail(e, KVP_ERR_NOMEM, "etcd authenticate: out of memory");
    char *o = body + sprintf(body, "{\"name\":");
    o = json_string(o, e->user);
    o += sprintf(o, ",\"password\":");
    o = json_string(o, e->password);
    sprintf(o, "}");
    etcd_xfer_t x = {.e = e};
    etcd_json_t r = {0};
    kvp_status_t status = etcd_run(e, "/v3/auth/authenticate", body, &x, e->timeout_ms, NULL, &r);
    etcd_wipe_free(body, cap);
    etcd_wipe_free(x.body.p, x.body.cap);
    if (status == KVP_ERR_UNSUPPORTED && e->auth_off) {
        KVP_LOG_WARN_LIMITED("etcd %s has authentication off: user '%s' is not used, and anyone "
                             "who reaches etcd may write kvpool's keys (etcdctl auth enable)",
                             e->urls[e->cur], e->user);
        return KVP_OK;
    }
    if (status != KVP_OK)
        return status;
    char *token = NULL;
    (void)j_strdup(&r.j, j_get(&r.j, 0, "token"), &token); /* (out of memory: as none) */
    etcd_json_free(&r, true);
    bool got = token != NULL && token[0] != '\0';
    if (got) {
        e->token = token;
        token = NULL;
        char *line = NULL;
        if (e->token != NULL && asprintf(&line, "Authorization: %s", e->token) >= 0) {
            e->auth_headers = curl_slist_append(NULL, "Content-Type: application/json");
            struct curl_slist *l =
                e->auth_headers != NULL ? curl_slist_append(e->auth_headers, line) : NULL;
            if (l == NULL) {
                curl_slist_free_all(e->auth_headers);
                e->auth_headers = NULL;
            }
            etcd_wipe_free(line, strlen(line));
        }
    }
    if (token != NULL)
        etcd_wipe_free(token, strlen(token));
    if (!got)
        return etcd_fail(e, KVP_ERR_PROTOCOL, "etcd authenticate on %s: answer without a token",
                         e->urls[e->cur]);
    if (e->auth_headers == NULL) {
        etcd_drop_token(e);
        return etcd_fail(e, KVP_ERR_NOMEM, "etcd authenticate: out of memory");
    }
    atomic_fetch_add_explicit(&etcd_auth_n, 1, memory_order_relaxed);
    return KVP_OK;
}

/* A watch transfer made ready for another try. */
static void etcd_xfer_reset(etcd_xfer_t *x)
{
    free(x->ev.val);
    memset(&x->ev, 0, sizeof(x->ev));
    x->done = x->created = false;
    x->status = KVP_OK;
}

/*
 * Every request: etcd_run with a token when a user is set. A refused token
 * (expired) is dropped, a new one obtained and the request tried once more.
 * Counts the failure, if any, by reason.
 */
static kvp_status_t etcd_request(kvp_etcd_t *e, const char *path, const char *body, etcd_xfer_t *x,
                                 uint32_t timeout_ms, const atomic_bool *stop, etcd_json_t *resp_p)
{
    kvp_status_t status;
    for (int attempt = 0;; attempt++) {
        e->token_refused = false;
        e->reason = ETCD_NO_FAILURE;
        status = KVP_OK;
        if (e->user != NULL && e->token == NULL && !e->auth_off)
            status = etcd_authenticate(e);
        if (status == KVP_OK) {
            etcd_xfer_reset(x);
            status = etcd_run(e, path, body, x, timeout_ms, stop, resp_p);
        }
        if (status == KVP_OK || !e->token_refused || e->user == NULL || attempt > 0)
            break;
        KVP_LOG_DEBUG("etcd %s: token refused (%s): authenticating again", e->urls[e->cur], e->err);
        etcd_drop_token(e);
        e->auth_off = false;
        atomic_fetch_add_explicit(&etcd_reauth_n, 1, memory_order_relaxed);
    }
    if (status != KVP_OK && e->reason != ETCD_NO_FAILURE)
        atomic_fetch_add_explicit(&etcd_failed_n[e->reason], 1, memory_order_relaxed);
    return status;
}

/* A unary call; body is freed here (it may be NULL: asprintf failed). */
static kvp_status_t etcd_call(kvp_etcd_t *e, const char *path, char *body, etcd_json_t *resp_p)
{
    if (body == NULL)
        return etcd_fail(e, KVP_ERR_NOMEM, "etcd %s: out of memory", path);
    etcd_xfer_t x = {.e = e};
    kvp_status_t status = etcd_request(e, path, body, &x, e->timeout_ms, NULL, resp_p);
    free(x.body.p);
    free(body);
    return status;
}

/* asprintf that gives NULL on failure. */
static char *etcd_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static char *etcd_fmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

/* ---- create / destroy ---- */

/* What create_ex allocates besides libcurl's handles (wiping the password). */
static void etcd_free(kvp_etcd_t *e)
{
    for (int i = 0; i < e->n_urls; i++)
        free(e->urls[i]);
    free(e->ca);
    free(e->cert);
    free(e->key);
    free(e->user);
    free(e->password_file);
    if (e->password != NULL)
        etcd_wipe_free(e->password, ETCD_MAX_PASSWORD + 2);
    free(e);
}

/* Split the list into e->urls; a host:port without a scheme gets https:// when tls. */
static kvp_status_t etcd_parse_endpoints(kvp_etcd_t *e, const char *endpoints, bool tls)
{
    const char *p = endpoints;
    while (*p != '\0') {
        size_t n = strcspn(p, ",");
        while (n > 0 && p[n - 1] == '/')
            n--;
        if (n == 0 || e->n_urls == ETCD_MAX_ENDPOINTS)
            return KVP_ERR_INVALID_ARG;
        bool scheme = memmem(p, n, "://", 3) != NULL;
        char *url = etcd_fmt("%s%.*s", scheme ? "" : tls ? "https://" : "http://", (int)n, p);
        if (url == NULL)
            return KVP_ERR_NOMEM;
        e->urls[e->n_urls++] = url;
        p += strcspn(p, ",");
        if (*p == ',')
            p++;
    }
    return e->n_urls > 0 ? KVP_OK : KVP_ERR_INVALID_ARG;
}

/* Say why in err and return status. */
static kvp_status_t create_fail(char *err, size_t err_len, kvp_status_t status, const char *fmt,
                                ...) __attribute__((format(printf, 4, 5)));

static kvp_status_t create_fail(char *err, size_t err_len, kvp_status_t status, const char *fmt,
                                ...)
{
    if (err != NULL && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* A copy of a readable file's name in *copy_p (NULL stays NULL). */
static kvp_status_t etcd_file(const char *what, const char *path, char **copy_p, char *err,
                              size_t err_len)
{
    if (path == NULL)
        return KVP_OK;
    if (access(path, R_OK) != 0)
        return create_fail(err, err_len, KVP_ERR_INVALID_ARG, "cannot read the etcd %s %s: %m",
                           what, path);
    *copy_p = strdup(path);
    return *copy_p != NULL ? KVP_OK : KVP_ERR_NOMEM;
}

/* Read the password from path into *pw_p (ETCD_MAX_PASSWORD + 2 bytes, wipe it): one
 * trailing newline (\n or \r\n) is stripped; empty, NUL bytes or longer than
 * ETCD_MAX_PASSWORD: refused. */
static kvp_status_t etcd_read_password(const char *path, char **pw_p, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        kvp_status_t status = create_fail(err, err_len, KVP_ERR_INVALID_ARG,
                                          "cannot read the etcd password file %s: %m", path);
        if (fd >= 0)
            close(fd);
        return status;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return create_fail(err, err_len, KVP_ERR_INVALID_ARG,
                           "the etcd password file %s is not a regular file", path);
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO))
        KVP_LOG_WARN_LIMITED(
            "etcd: the password file %s may be read by its group or others (mode %03o): "
            "chmod 600 it",
            path, (unsigned)(st.st_mode & 0777));
    char *buf = calloc(1, ETCD_MAX_PASSWORD + 2);
    if (buf == NULL) {
        close(fd);
        return KVP_ERR_NOMEM;
    }
    size_t n = 0;
    ssize_t r;
    while (n < ETCD_MAX_PASSWORD + 1 && (r = read(fd, buf + n, ETCD_MAX_PASSWORD + 1 - n)) > 0)
        n += (size_t)r;
    close(fd);
    if (n > 0 && buf[n - 1] == '\n') {
        buf[--n] = '\0';
        if (n > 0 && buf[n - 1] == '\r')
            buf[--n] = '\0';
    }
    const char *why = n == 0                  ? "is empty"
                      : n > ETCD_MAX_PASSWORD ? "holds more than 1024 bytes"
                      : strlen(buf) != n      ? "holds a NUL byte"
                      : memchr(buf, '\n', n)  ? "holds more than one line"
                                              : NULL;
    if (why != NULL) {
        etcd_wipe_free(buf, ETCD_MAX_PASSWORD + 2);
        return create_fail(err, err_len, KVP_ERR_INVALID_ARG, "the etcd password file %s %s", path,
                           why);
    }
    *pw_p = buf;
    return KVP_OK;
}

/* The security settings, checked and copied into e. */
static kvp_status_t etcd_set_security(kvp_etcd_t *e, const kvp_etcd_security_t *sec, char *err,
                                      size_t err_len)
{
    if ((sec->cert == NULL) != (sec->key == NULL))
        return create_fail(err, err_len, KVP_ERR_INVALID_ARG,
                           "an etcd client certificate needs its key and the other way round "
                           "(--etcd-cert with --etcd-key, KVPOOL_ETCD_CERT with KVPOOL_ETCD_KEY)");
    if ((sec->user == NULL) != (sec->password_file == NULL))
        return create_fail(err, err_len, KVP_ERR_INVALID_ARG,
                           "an etcd user needs a password file and the other way round "
                           "(--etcd-user with --etcd-password-file, KVPOOL_ETCD_USER with "
                           "KVPOOL_ETCD_PASSWORD_FILE)");
    kvp_status_t status;
    if ((status = etcd_file("CA file", sec->ca, &e->ca, err, err_len)) != KVP_OK ||
        (status = etcd_file("client certificate", sec->cert, &e->cert, err, err_len)) != KVP_OK ||
        (status = etcd_file("client key", sec->key, &e->key, err, err_len)) != KVP_OK)
        return status;
    if (sec->user != NULL) {
        if (sec->user[0] == '\0' || strlen(sec->user) > 256)
            return create_fail(err, err_len, KVP_ERR_INVALID_ARG,
                               "the etcd user name needs 1..256 bytes");
        if ((e->user = strdup(sec->user)) == NULL)
            return KVP_ERR_NOMEM;
        if ((status = etcd_read_password(sec->password_file, &e->password, err, err_len)) != KVP_OK)
            return status;
        if ((e->password_file = strdup(sec->password_file)) == NULL)
            return KVP_ERR_NOMEM;
    }
    for (int i = 0; i < e->n_urls; i++) {
        if (strncmp(e->urls[i], "http://", 7) == 0 && e->ca != NULL)
            return create_fail(err, err_len, KVP_ERR_INVALID_ARG,
                               "etcd endpoint %s is plain http, but an etcd CA file is given "
                               "(TLS): write https:// or leave the scheme out",
                               e->urls[i]);
        if (strncmp(e->urls[i], "http://", 7) == 0 && e->user != NULL)
            KVP_LOG_WARN("etcd: the password of user '%s' goes in the clear to %s: give an "
                         "etcd CA file (TLS)",
                         e->user, e->urls[i]);
    }
    return KVP_OK;
}

kvp_status_t kvp_etcd_create_ex(const kvp_etcd_params_t *params, kvp_etcd_t **e_p, char *err,
                                size_t err_len)
{
    if (params == NULL || params->endpoints == NULL || params->timeout_ms == 0)
        return create_fail(err, err_len, KVP_ERR_INVALID_ARG, "no etcd endpoints or timeout");
    kvp_etcd_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return KVP_ERR_NOMEM;
    e->timeout_ms = params->timeout_ms;
    const kvp_etcd_security_t *sec = params->security;
    kvp_status_t status =
        etcd_parse_endpoints(e, params->endpoints, sec != NULL && sec->ca != NULL);
    if (status != KVP_OK) {
        create_fail(err, err_len, status,
                    "bad etcd endpoint list \"%s\": want host:port[,host:port...] (at most %d; "
                    "http:// or https:// may lead each)",
                    params->endpoints, ETCD_MAX_ENDPOINTS);
        KVP_LOG_ERROR("etcd: bad endpoint list \"%s\": want host:port[,host:port...]",
                      params->endpoints);
        goto err_free;
    }
    if (sec != NULL && (status = etcd_set_security(e, sec, err, err_len)) != KVP_OK)
        goto err_free;
    status = etcd_curl_ref();
    if (status != KVP_OK)
        goto err_free;
    status = KVP_ERR_NOMEM;
    e->easy = curl_easy_init();
    if (e->easy == NULL)
        goto err_unref;
    e->multi = curl_multi_init();
    if (e->multi == NULL)
        goto err_cleanup_easy;
    e->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (e->headers == NULL)
        goto err_cleanup_multi;
    *e_p = e;
    return KVP_OK;

err_cleanup_multi:
    curl_multi_cleanup(e->multi);
err_cleanup_easy:
    curl_easy_cleanup(e->easy);
err_unref:
    etcd_curl_unref();
err_free:
    if (status == KVP_ERR_NOMEM)
        create_fail(err, err_len, status, "etcd client: out of memory");
    etcd_free(e);
    return status;
}

kvp_status_t kvp_etcd_create(const char *endpoints, uint32_t timeout_ms, kvp_etcd_t **e_p)
{
    kvp_etcd_params_t p = {.endpoints = endpoints, .timeout_ms = timeout_ms};
    return kvp_etcd_create_ex(&p, e_p, NULL, 0);
}

void kvp_etcd_destroy(kvp_etcd_t *e)
{
    if (e == NULL)
        return;
    etcd_drop_token(e);
    curl_slist_free_all(e->headers);
    curl_multi_cleanup(e->multi);
    curl_easy_cleanup(e->easy);
    etcd_free(e);
    etcd_curl_unref();
}

/* ---- leases ---- */

/* A unary call whose request is one int64 field: {"<field>":"<v>"}. */
static kvp_status_t etcd_call_int(kvp_etcd_t *e, const char *path, const char *field, int64_t v,
                                  etcd_json_t *resp_p)
{
    return etcd_call(e, path, etcd_fmt("{\"%s\":\"%" PRId64 "\"}", field, v), resp_p);
}

kvp_status_t kvp_etcd_lease_grant(kvp_etcd_t *e, int64_t ttl_s, int64_t *id_p)
{
    etcd_json_t r = {0};
    kvp_status_t status = etcd_call_int(e, "/v3/lease/grant", "TTL", ttl_s, &r);
    if (status != KVP_OK)
        return status;
    int64_t id = j_int64(&r.j, 0, "ID");
    etcd_json_free(&r, false);
    if (id == 0)
        return etcd_fail(e, KVP_ERR_PROTOCOL, "etcd lease grant: answer without an ID");
    *id_p = id;
    return KVP_OK;
}

kvp_status_t kvp_etcd_lease_keepalive(kvp_etcd_t *e, int64_t id, int64_t *ttl_p)
{
    etcd_json_t r = {0};
    kvp_status_t status = etcd_call_int(e, "/v3/lease/keepalive", "ID", id, &r);
    if (status != KVP_OK)
        return status;
    int64_t res = j_get(&r.j, 0, "result");
    if (!j_is(&r.j, res, KVP_J_OBJECT)) {
        bool retry;
        status = etcd_error_answer(e, 200, &r.j, "/v3/lease/keepalive", &retry);
        etcd_json_free(&r, false);
        return status;
    }
    *ttl_p = j_int64(&r.j, res, "TTL"); /* absent: the lease is gone */
    etcd_json_free(&r, false);
    return KVP_OK;
}

kvp_status_t kvp_etcd_lease_revoke(kvp_etcd_t *e, int64_t id)
{
    etcd_json_t r = {0};
    kvp_status_t status = etcd_call_int(e, "/v3/lease/revoke", "ID", id, &r);
    etcd_json_free(&r, false);
    return status;
}

/* ---- keys ---- */

kvp_status_t kvp_etcd_put(kvp_etcd_t *e, const char *key, const void *val, size_t len,
                          int64_t lease)
{
    char *k = b64_encode(key, strlen(key)), *v = b64_encode(val, len);
    char *body = k != NULL && v != NULL ? etcd_fmt("{\"key\":\"%s\",\"value\":\"%s\",\"lease\":"
                                                   "\"%" PRId64 "\"}",
                                                   k, v, lease)
                                        : NULL;
    free(k);
    free(v);
    etcd_json_t r = {0};
    kvp_status_t status = etcd_call(e, "/v3/kv/put", body, &r);
    etcd_json_free(&r, false);
    return status;
}

kvp_status_t kvp_etcd_put_if(kvp_etcd_t *e, const char *key, const void *val, size_t len,
                             const char *guard_key, int64_t guard_rev)
{
    char *k = b64_encode(key, strlen(key)), *v = b64_encode(val, len);
    char *g = b64_encode(guard_key, strlen(guard_key));
    char *body =
        k != NULL && v != NULL && g != NULL
            ? etcd_fmt("{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"result\":"
                       "\"EQUAL\",\"create_revision\":\"%" PRId64 "\"}],"
                       "\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\"}}]}",
                       g, guard_rev, k, v)
            : NULL;
    free(k);
    free(v);
    free(g);
    etcd_json_t r = {0};
    kvp_status_t status = etcd_call(e, "/v3/kv/txn", body, &r);
    if (status != KVP_OK)
        return status;
    status = j_true(&r.j, 0, "succeeded") ? KVP_OK : KVP_ERR_NOT_OWNER;
    etcd_json_free(&r, false);
    return status;
}

/* The first kv of a range answer (a txn's response_range or a plain range):
 * KVP_ERR_NOT_FOUND when it holds none. */
static kvp_status_t etcd_first_kv(kvp_etcd_t *e, const kvp_json_t *j, int64_t range, etcd_kv_t *kv)
{
    int64_t first = j_item(j, j_get(j, range, "kvs"), 0);
    if (first < 0)
        return KVP_ERR_NOT_FOUND;
    return etcd_kv_parse(e, j, first, kv);
}

/* The response_range of op i of a txn answer (the root). */
static int64_t txn_range(const kvp_json_t *j, uint32_t i)
{
    return j_get(j, j_item(j, j_get(j, 0, "responses"), i), "response_range");
}

kvp_status_t kvp_etcd_create_key(kvp_etcd_t *e, const char *key, const void *val, size_t len,
                                 int64_t lease, bool *created_p, int64_t *create_rev_p)
{
    char *k = b64_encode(key, strlen(key)), *v = b64_encode(val, len);
    char *body = NULL;
    if (k != NULL && v != NULL)
        body = etcd_fmt("{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"result\":"
                        "\"EQUAL\",\"create_revision\":\"0\"}],"
                        "\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\","
                        "\"lease\":\"%" PRId64 "\"}},{\"request_range\":{\"key\":\"%s\"}}],"
                        "\"failure\":[{\"request_range\":{\"key\":\"%s\"}}]}",
                        k, k, v, lease, k, k);
    free(k);
    free(v);
    etcd_json_t r = {0};
    kvp_status_t status = etcd_call(e, "/v3/kv/txn", body, &r);
    if (status != KVP_OK)
        return status;
    bool succeeded = j_true(&r.j, 0, "succeeded");
    etcd_kv_t kv;
    /* success: [put, range]; failure: [range] */
    status = etcd_first_kv(e, &r.j, txn_range(&r.j, succeeded ? 1 : 0), &kv);
    etcd_json_free(&r, false);
    if (status == KVP_ERR_NOT_FOUND) /* deleted between the compare and the range: impossible
                                        in one txn, so the answer is malformed */
        return etcd_fail(e, KVP_ERR_PROTOCOL, "etcd txn on %s: no key in the answer", key);
    if (status != KVP_OK)
        return status;
    *created_p = succeeded || (lease != 0 && kv.lease == lease);
    *create_rev_p = kv.create_rev;
    etcd_kv_cleanup(&kv);
    return KVP_OK;
}

kvp_status_t kvp_etcd_get(kvp_etcd_t *e, const char *key, char **val_p, size_t *len_p,
                          int64_t *create_rev_p, int64_t *mod_rev_p, int64_t *rev_p)
{
    char *k = b64_encode(key, strlen(key));
    char *body = k != NULL ? etcd_fmt("{\"key\":\"%s\"}", k) : NULL;
    free(k);
    etcd_json_t r = {0};
    kvp_status_t status = etcd_call(e, "/v3/kv/range", body, &r);
    if (status != KVP_OK)
        return status;
    etcd_kv_t kv;
    status = etcd_first_kv(e, &r.j, 0, &kv);
    int64_t rev = j_int64(&r.j, j_get(&r.j, 0, "header"), "revision");
    etcd_json_free(&r, false);
    if (status != KVP_OK)
        return status;
    if (val_p != NULL) {
        *val_p = kv.val;
        kv.val = NULL;
    }
    if (len_p != NULL)
        *len_p = kv.len;
    if (create_rev_p != NULL)
        *create_rev_p = kv.create_rev;
    if (mod_rev_p != NULL)
        *mod_rev_p = kv.mod_rev;
    if (rev_p != NULL)
        *rev_p = rev;
    etcd_kv_cleanup(&kv);
    return KVP_OK;
}

kvp_status_t kvp_etcd_list(kvp_etcd_t *e, const char *prefix, kvp_etcd_list_cb_t cb, void *arg)
{
    size_t n = strlen(prefix);
    if (n == 0)
        return KVP_ERR_INVALID_ARG;
    /* range_end: the prefix with its last byte below 0xff raised by one and
     * what follows dropped; a prefix of 0xff bytes only ranges to the end
     * ("\0"). */
    char *end = strdup(prefix);
    if (end == NULL)
        return KVP_ERR_NOMEM;
    size_t end_len = n;
    while (end_len > 0 && (uint8_t)end[end_len - 1] == 0xff)
        end_len--;
    if (end_len > 0)
        end[end_len - 1] = (char)((uint8_t)end[end_len - 1] + 1);
    else
        end_len = 1, end[0] = '\0';
    char *k = b64_encode(prefix, n), *re = b64_encode(end, end_len);
    free(end);
    char *body =
        k != NULL && re != NULL ? etcd_fmt("{\"key\":\"%s\",\"range_end\":\"%s\"}", k, re) : NULL;
    free(k);
    free(re);
    etcd_json_t r = {0};
    kvp_status_t status = etcd_call(e, "/v3/kv/range", body, &r);
    if (status != KVP_OK)
        return status;
    const kvp_json_t *j = &r.j;
    int64_t kvs = j_get(j, 0, "kvs");
    uint32_t n_kvs = j_is(j, kvs, KVP_J_ARRAY) ? j->t[kvs].size : 0;
    for (uint32_t i = 0, item = (uint32_t)kvs + 1; i < n_kvs; i++, item = j->t[item].next) {
        etcd_kv_t kv;
        status = etcd_kv_parse(e, j, item, &kv);
        if (status != KVP_OK)
            break;
        cb(kv.key, kv.val, kv.len, arg);
        etcd_kv_cleanup(&kv);
    }
    etcd_json_free(&r, false);
    return status;
}

kvp_status_t kvp_etcd_delete_if(kvp_etcd_t *e, const char *key, int64_t create_rev)
{
    char *k = b64_encode(key, strlen(key));
    char *body = NULL;
    if (k != NULL)
        body = etcd_fmt("{\"compare\":[{\"key\":\"%s\",\"target\":\"CREATE\",\"result\":"
                        "\"EQUAL\",\"create_revision\":\"%" PRId64 "\"}],"
                        "\"success\":[{\"request_delete_range\":{\"key\":\"%s\"}}],"
                        "\"failure\":[{\"request_range\":{\"key\":\"%s\",\"count_only\":true}}]}",
                        k, create_rev, k, k);
    free(k);
    etcd_json_t r = {0};
    kvp_status_t status = etcd_call(e, "/v3/kv/txn", body, &r);
    if (status != KVP_OK)
        return status;
    if (j_true(&r.j, 0, "succeeded"))
        status = KVP_OK;
    else
        status =
            j_int64(&r.j, txn_range(&r.j, 0), "count") > 0 ? KVP_ERR_NOT_OWNER : KVP_ERR_NOT_FOUND;
    etcd_json_free(&r, false);
    return status;
}

/* ---- watch ---- */

kvp_status_t kvp_etcd_watch(kvp_etcd_t *e, const char *key, int64_t start_rev, uint32_t timeout_ms,
                            const atomic_bool *stop, kvp_etcd_event_t *ev_p)
{
    if (start_rev <= 0)
        return KVP_ERR_INVALID_ARG;
    char *k = b64_encode(key, strlen(key));
    char *body = k != NULL ? etcd_fmt("{\"create_request\":{\"key\":\"%s\",\"start_revision\":"
                                      "\"%" PRId64 "\"}}",
                                      k, start_rev)
                           : NULL;
    free(k);
    if (body == NULL)
        return etcd_fail(e, KVP_ERR_NOMEM, "etcd watch: out of memory");
    etcd_xfer_t x = {.e = e, .watch = true, .start_rev = start_rev};
    kvp_status_t status = etcd_request(e, "/v3/watch", body, &x, timeout_ms, stop, NULL);
    free(x.body.p);
    free(body);
    if (status == KVP_OK)
        *ev_p = x.ev;
    else
        free(x.ev.val);
    return status;
}

void kvp_etcd_event_cleanup(kvp_etcd_event_t *ev)
{
    free(ev->val);
    ev->val = NULL;
    ev->len = 0;
}
