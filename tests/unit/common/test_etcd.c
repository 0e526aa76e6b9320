/*
 * test_etcd.c - common/etcd.c and common/election.c against a real etcd.
 *
 * Each group starts its own private etcd on 127.0.0.1 (tests/harness.c: random
 * ports, a mkdtemp data dir, killed by PID and removed in teardown): one
 * member for the client and election tests, three for "lose one member", and
 * one started late on a port the election already dials for "etcd
 * unreachable at start" (which then also stops and restarts that etcd).
 * Without an etcd binary the test exits 77 (SKIP), or fails when CI=true or
 * KVPOOL_REQUIRE_ETCD=1.
 *
 * First, with or without etcd, the group "etcd_answers" feeds etcd.c canned answers of the
 * JSON gateway from a fake one (common/http.c on 127.0.0.1:0): int64s as strings past 2^53,
 * escaped base64, fields left out, error shapes, watch streams, a token; and answers the
 * gateway should not give (not JSON, not an object), which fail as protocol errors.
 *
 * Timing: TTL 2 s (etcd's minimum) everywhere; the whole file takes about
 * 20 s. Election outcomes are polled every 5 ms on the monotonic clock.
 * KVPOOL_LOG_LEVEL=debug shows every etcd error; the default here is info
 * (elections, step-downs, etcd state).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/election.h"
#include "common/etcd.h"
#include "common/http.h"
#include "common/log.h"
#include "tests/harness.h"

#define TTL_S 2
#define TTL_MS (TTL_S * 1000)

static kvp_etcd_proc_t g_etcd;

static void sleep_ms(unsigned ms)
{
    usleep(ms * 1000u);
}

static int setup_one(void **state)
{
    (void)state;
    return kvp_start_etcd(&g_etcd) ? 0 : -1;
}

static int setup_three(void **state)
{
    (void)state;
    return kvp_start_etcd_cluster(&g_etcd, 3) ? 0 : -1;
}

static int teardown_etcd(void **state)
{
    (void)state;
    kvp_stop_etcd(&g_etcd);
    return 0;
}

static kvp_etcd_t *client(void)
{
    kvp_etcd_t *e = NULL;
    assert_int_equal(kvp_etcd_create(g_etcd.endpoints, 2000, &e), KVP_OK);
    return e;
}

/* ---- the client ---- */

typedef struct listed {
    int n;
    char keys[8][64];
    char vals[8][64];
} listed_t;

static void list_cb(const char *key, const char *val, size_t len, void *arg)
{
    listed_t *l = arg;
    assert_true(l->n < 8);
    assert_int_equal(strlen(val), len);
    snprintf(l->keys[l->n], sizeof(l->keys[0]), "%s", key);
    snprintf(l->vals[l->n], sizeof(l->vals[0]), "%s", val);
    l->n++;
}

/* ---- etcd's answers, canned (a fake gateway) ---- */

/* The fake's answer to a path; the first of a path wins. */
typedef struct canned {
    const char *path;
    unsigned status;
    const char *body;
} canned_t;

static struct {
    kvp_http_t *http;
    char endpoints[64];
    const canned_t *script; /* set by the test thread between calls */
    size_t n;
    char auth[256]; /* the Authorization header of the last request but authenticate's */
} g_fake;

#define SCRIPT(...)                                                                                \
    do {                                                                                           \
        static const canned_t s_[] = {__VA_ARGS__};                                                \
        g_fake.script = s_;                                                                        \
        g_fake.n = sizeof(s_) / sizeof(s_[0]);                                                     \
    } while (0)

static void fake_gateway(void *arg, const char *path, const kvp_http_request_t *req,
                         kvp_http_reply_t *r)
{
    (void)arg;
    const char *auth = kvp_http_header(req, "Authorization");
    if (strcmp(path, "/v3/auth/authenticate") != 0)
        snprintf(g_fake.auth, sizeof(g_fake.auth), "%s", auth != NULL ? auth : "");
    for (size_t i = 0; i < g_fake.n; i++)
        if (strcmp(g_fake.script[i].path, path) == 0) {
            r->status = g_fake.script[i].status;
            r->content_type = "application/json";
            kvp_http_printf(r, "%s", g_fake.script[i].body);
            return;
        }
    r->status = 404;
    kvp_http_printf(r, "404 page not found\n");
}

static int setup_fake(void **state)
{
    (void)state;
    uint16_t port;
    if (kvp_http_start("127.0.0.1:0", fake_gateway, NULL, &g_fake.http, &port) != KVP_OK)
        return -1;
    kvp_http_accept_post(g_fake.http, 1u << 20, NULL);
    snprintf(g_fake.endpoints, sizeof(g_fake.endpoints), "127.0.0.1:%u", port);
    return 0;
}

static int teardown_fake(void **state)
{
    (void)state;
    kvp_http_stop(g_fake.http);
    return 0;
}

static kvp_etcd_t *fake_client(void)
{
    kvp_etcd_t *e = NULL;
    assert_int_equal(kvp_etcd_create(g_fake.endpoints, 2000, &e), KVP_OK);
    return e;
}

static void assert_error_has(const kvp_etcd_t *e, const char *part)
{
    if (strstr(kvp_etcd_error(e), part) == NULL)
        fail_msg("error \"%s\" does not say \"%s\"", kvp_etcd_error(e), part);
}

/* Ranges: int64s read exactly from their strings, base64 through JSON escapes, what the
 * gateway leaves out, and answers it should not give. */
static void test_answers_range(void **state)
{
    (void)state;
    kvp_etcd_t *e = fake_client();
    char *val = NULL;
    size_t len = 0;
    int64_t crev = 0, mrev = 0, rev = 0;
    /* "//8=" (bytes ff ff) written with escapes; 2^53 + 1 and INT64_MAX: no double holds them */
    SCRIPT({"/v3/kv/range", 200,
            "{\"header\":{\"revision\":\"9007199254740993\"},\"kvs\":[{\"key\":\"YS9i\","
            "\"value\":\"\\/\\/8\\u003d\",\"create_revision\":\"9007199254740993\","
            "\"mod_revision\":\"9223372036854775807\",\"lease\":\"7\"}],\"count\":\"1\"}\n"});
    assert_int_equal(kvp_etcd_get(e, "a/b", &val, &len, &crev, &mrev, &rev), KVP_OK);
    assert_int_equal(len, 2);
    assert_memory_equal(val, "\xff\xff", 3);
    assert_true(crev == 9007199254740993ll);
    assert_true(mrev == INT64_MAX);
    assert_true(rev == 9007199254740993ll);
    free(val);
    /* an int64 the gateway would send as a string, sent as a number: read exactly too */
    SCRIPT({"/v3/kv/range", 200,
            "{\"header\":{\"revision\":9007199254740993},\"kvs\":[{\"key\":\"YQ==\"}]}"});
    assert_int_equal(kvp_etcd_get(e, "a", &val, &len, &crev, &mrev, &rev), KVP_OK);
    assert_true(rev == 9007199254740993ll);
    assert_int_equal(len, 0); /* no "value": empty */
    assert_true(crev == 0 && mrev == 0);
    free(val);
    SCRIPT({"/v3/kv/range", 200, "{\"header\":{\"revision\":\"3\"}}"});
    assert_int_equal(kvp_etcd_get(e, "a", &val, &len, NULL, NULL, NULL), KVP_ERR_NOT_FOUND);
    SCRIPT({"/v3/kv/range", 200, "{\"kvs\":[]}"});
    assert_int_equal(kvp_etcd_get(e, "a", &val, &len, NULL, NULL, NULL), KVP_ERR_NOT_FOUND);
    SCRIPT({"/v3/kv/range", 200, "{\"kvs\":[{\"key\":\"!!\"}]}"});
    assert_int_equal(kvp_etcd_get(e, "a", &val, &len, NULL, NULL, NULL), KVP_ERR_PROTOCOL);
    assert_error_has(e, "not base64");
    SCRIPT({"/v3/kv/range", 200, "{\"kvs\":[7]}"});
    assert_int_equal(kvp_etcd_get(e, "a", &val, &len, NULL, NULL, NULL), KVP_ERR_PROTOCOL);
    assert_error_has(e, "kv object");

    /* a list: every kv, in order */
    SCRIPT({"/v3/kv/range", 200,
            "{\"kvs\":[{\"key\":\"L3QvYQ==\",\"value\":\"MQ==\"},{\"key\":\"L3QvYg==\"}]}"});
    listed_t l = {0};
    assert_int_equal(kvp_etcd_list(e, "/t/", list_cb, &l), KVP_OK);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.keys[0], "/t/a");
    assert_string_equal(l.vals[0], "1");
    assert_string_equal(l.keys[1], "/t/b");
    assert_string_equal(l.vals[1], "");

    /* not JSON, not an object, JSON with something after it: protocol errors */
    static const char *bad[] = {"{", "[1]", "{} x", "", "\"text\""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        canned_t c = {"/v3/kv/range", 200, bad[i]};
        g_fake.script = &c;
        g_fake.n = 1;
        if (kvp_etcd_get(e, "a", &val, &len, NULL, NULL, NULL) != KVP_ERR_PROTOCOL)
            fail_msg("took the answer '%s'", bad[i]);
        assert_error_has(e, "not a JSON object");
    }
    kvp_etcd_destroy(e);
}

/* Txns: succeeded (left out when false), the ranges of their responses. */
static void test_answers_txn(void **state)
{
    (void)state;
    kvp_etcd_t *e = fake_client();
    SCRIPT({"/v3/kv/txn", 200, "{\"header\":{},\"succeeded\":true}"});
    assert_int_equal(kvp_etcd_put_if(e, "k", "v", 1, "g", 3), KVP_OK);
    assert_int_equal(kvp_etcd_delete_if(e, "k", 3), KVP_OK);
    SCRIPT({"/v3/kv/txn", 200, "{\"header\":{}}"});
    assert_int_equal(kvp_etcd_put_if(e, "k", "v", 1, "g", 3), KVP_ERR_NOT_OWNER);
    SCRIPT({"/v3/kv/txn", 200, "{\"responses\":[{\"response_range\":{\"count\":\"1\"}}]}"});
    assert_int_equal(kvp_etcd_delete_if(e, "k", 3), KVP_ERR_NOT_OWNER);
    SCRIPT({"/v3/kv/txn", 200, "{\"responses\":[{\"response_range\":{}}]}"});
    assert_int_equal(kvp_etcd_delete_if(e, "k", 3), KVP_ERR_NOT_FOUND);

    bool created = false;
    int64_t crev = 0;
    SCRIPT({"/v3/kv/txn", 200,
            "{\"succeeded\":true,\"responses\":[{\"response_put\":{}},{\"response_range\":"
            "{\"kvs\":[{\"key\":\"aw==\",\"value\":\"dg==\",\"create_revision\":\"42\","
            "\"lease\":\"9\"}]}}]}"});
    assert_int_equal(kvp_etcd_create_key(e, "k", "v", 1, 9, &created, &crev), KVP_OK);
    assert_true(created);
    assert_int_equal(crev, 42);
    /* failed: the holder's kv (another lease) is responses[0]'s */
    SCRIPT({"/v3/kv/txn", 200,
            "{\"responses\":[{\"response_range\":{\"kvs\":[{\"key\":\"aw==\","
            "\"create_revision\":\"41\",\"lease\":\"8\"}]}}]}"});
    assert_int_equal(kvp_etcd_create_key(e, "k", "v", 1, 9, &created, &crev), KVP_OK);
    assert_false(created);
    assert_int_equal(crev, 41);
    SCRIPT({"/v3/kv/txn", 200, "{\"responses\":[{\"response_range\":{}}]}"});
    assert_int_equal(kvp_etcd_create_key(e, "k", "v", 1, 9, &created, &crev), KVP_ERR_PROTOCOL);
    kvp_etcd_destroy(e);
}

/* Leases, and the error shapes: {"error","message","code"} and a stream's
 * {"error":{"grpc_code",...}}, with escapes in the message; text that is not JSON. */
static void test_answers_lease(void **state)
{
    (void)state;
    kvp_etcd_t *e = fake_client();
    int64_t id = 0, ttl = -1;
    SCRIPT(
        {"/v3/lease/grant", 200, "{\"header\":{},\"ID\":\"4111120140920247582\",\"TTL\":\"5\"}"});
    assert_int_equal(kvp_etcd_lease_grant(e, 5, &id), KVP_OK);
    assert_true(id == 4111120140920247582ll);
    SCRIPT({"/v3/lease/grant", 200, "{\"TTL\":\"5\"}"});
    assert_int_equal(kvp_etcd_lease_grant(e, 5, &id), KVP_ERR_PROTOCOL);
    SCRIPT({"/v3/lease/keepalive", 200, "{\"result\":{\"ID\":\"1\",\"TTL\":\"5\"}}\n"});
    assert_int_equal(kvp_etcd_lease_keepalive(e, 1, &ttl), KVP_OK);
    assert_int_equal(ttl, 5);
    SCRIPT({"/v3/lease/keepalive", 200, "{\"result\":{\"ID\":\"1\"}}\n"});
    assert_int_equal(kvp_etcd_lease_keepalive(e, 1, &ttl), KVP_OK);
    assert_int_equal(ttl, 0); /* no TTL: the lease is gone */
    SCRIPT({"/v3/lease/keepalive", 200,
            "{\"error\":{\"grpc_code\":5,\"http_code\":404,\"message\":\"etcdserver: requested "
            "lease not found\",\"http_status\":\"Not Found\"}}\n"});
    assert_int_equal(kvp_etcd_lease_keepalive(e, 1, &ttl), KVP_ERR_NOT_FOUND);
    assert_error_has(e, "requested lease not found");
    SCRIPT({"/v3/lease/revoke", 404,
            "{\"error\":\"etcdserver: requested lease not found\",\"message\":\"etcdserver: "
            "requested lease not found\",\"code\":5}"});
    assert_int_equal(kvp_etcd_lease_revoke(e, 7), KVP_ERR_NOT_FOUND);
    assert_error_has(e, "gRPC code 5");
    /* only "error" as text: that is the message */
    SCRIPT({"/v3/lease/revoke", 500, "{\"error\":\"etcdserver: \\u003cboom\\u003e\",\"code\":2}"});
    assert_int_equal(kvp_etcd_lease_revoke(e, 7), KVP_ERR_PROTOCOL);
    assert_error_has(e, "etcdserver: <boom>");
    /* unavailable: another endpoint may serve (there is none here) */
    SCRIPT({"/v3/lease/revoke", 503,
            "{\"error\":\"x\",\"message\":\"etcdserver: request timed out\",\"code\":14}"});
    assert_int_equal(kvp_etcd_lease_revoke(e, 7), KVP_ERR_CONNECT);
    assert_error_has(e, "request timed out");
    /* a code that is no integer is no code */
    SCRIPT({"/v3/lease/revoke", 503, "{\"message\":\"odd\",\"code\":\"14\"}"});
    assert_int_equal(kvp_etcd_lease_revoke(e, 7), KVP_ERR_PROTOCOL);
    assert_error_has(e, "gRPC code -1");
    SCRIPT({"/v3/lease/revoke", 502, "Bad Gateway\nmore"});
    assert_int_equal(kvp_etcd_lease_revoke(e, 7), KVP_ERR_PROTOCOL);
    assert_error_has(e, "HTTP 502: Bad Gateway");
    kvp_etcd_destroy(e);
}

/* Watch streams: one {"result":...} a line, the created line first. */
static void test_answers_watch(void **state)
{
    (void)state;
    kvp_etcd_t *e = fake_client();
    kvp_etcd_event_t ev;
    SCRIPT({"/v3/watch", 200,
            "{\"result\":{\"header\":{\"revision\":\"4\"},\"created\":true}}\n"
            "{\"result\":{\"header\":{},\"events\":[{\"kv\":{\"key\":\"dw==\","
            "\"create_revision\":\"3\",\"mod_revision\":\"5\",\"version\":\"2\","
            "\"value\":\"eA==\"}}]}}\n"});
    assert_int_equal(kvp_etcd_watch(e, "w", 4, 2000, NULL, &ev), KVP_OK);
    assert_int_equal(ev.type, KVP_ETCD_EVENT_PUT);
    assert_int_equal(ev.mod_rev, 5);
    assert_int_equal(ev.create_rev, 3);
    assert_int_equal(ev.len, 1);
    assert_string_equal(ev.val, "x");
    kvp_etcd_event_cleanup(&ev);
    /* an event older than the start is skipped; a DELETE carries no value */
    SCRIPT({"/v3/watch", 200,
            "{\"result\":{\"created\":true}}\n"
            "{\"result\":{\"events\":[{\"kv\":{\"key\":\"dw==\",\"mod_revision\":\"4\"}},"
            "{\"type\":\"DELETE\",\"kv\":{\"key\":\"dw==\",\"mod_revision\":\"6\"}}]}}\n"});
    assert_int_equal(kvp_etcd_watch(e, "w", 5, 2000, NULL, &ev), KVP_OK);
    assert_int_equal(ev.type, KVP_ETCD_EVENT_DELETE);
    assert_int_equal(ev.mod_rev, 6);
    assert_null(ev.val);
    SCRIPT({"/v3/watch", 200,
            "{\"result\":{\"created\":true}}\n"
            "{\"result\":{\"canceled\":true,\"compact_revision\":\"10\"}}\n"});
    assert_int_equal(kvp_etcd_watch(e, "w", 3, 2000, NULL, &ev), KVP_ERR_OUT_OF_RANGE);
    assert_error_has(e, "compacted up to revision 10");
    SCRIPT({"/v3/watch", 200,
            "{\"result\":{\"canceled\":true,\"cancel_reason\":\"rpc error: code = "
            "PermissionDenied desc = etcdserver: permission denied\"}}\n"});
    assert_int_equal(kvp_etcd_watch(e, "w", 3, 2000, NULL, &ev), KVP_ERR_DENIED);
    SCRIPT({"/v3/watch", 200, "{\"result\":{\"canceled\":true}}\n"});
    assert_int_equal(kvp_etcd_watch(e, "w", 3, 2000, NULL, &ev), KVP_ERR_PROTOCOL);
    assert_error_has(e, "no reason given");
    SCRIPT({"/v3/watch", 200, "{\"result\":{\"created\":true}}\n{\"result\":\n"});
    assert_int_equal(kvp_etcd_watch(e, "w", 3, 2000, NULL, &ev), KVP_ERR_PROTOCOL);
    assert_error_has(e, "unparsable line");
    SCRIPT({"/v3/watch", 200,
            "{\"error\":{\"grpc_code\":14,\"message\":\"etcdserver: no leader\"}}\n"});
    assert_int_equal(kvp_etcd_watch(e, "w", 3, 2000, NULL, &ev), KVP_ERR_CONNECT);
    kvp_etcd_destroy(e);
}

/* A user: the token of /v3/auth/authenticate (unescaped) rides in every request. */
static void test_answers_token(void **state)
{
    (void)state;
    char pw[] = "/tmp/kvp-test-etcd-pw-XXXXXX";
    int fd = mkstemp(pw);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "secret\n", 7), 7);
    close(fd);
    kvp_etcd_security_t sec = {.user = "kvpool", .password_file = pw};
    kvp_etcd_params_t p = {.endpoints = g_fake.endpoints, .timeout_ms = 2000, .security = &sec};
    char err[256];
    kvp_etcd_t *e = NULL;
    assert_int_equal(kvp_etcd_create_ex(&p, &e, err, sizeof(err)), KVP_OK);
    kvp_etcd_stats_t before, after;
    kvp_etcd_stats(&before);
    SCRIPT({"/v3/auth/authenticate", 200, "{\"header\":{},\"token\":\"tok.\\u0041BC\\/1\"}"},
           {"/v3/kv/put", 200, "{\"header\":{}}"});
    assert_int_equal(kvp_etcd_put(e, "k", "v", 1, 0), KVP_OK);
    assert_string_equal(g_fake.auth, "tok.ABC/1");
    kvp_etcd_stats(&after);
    assert_true(after.authentications == before.authentications + 1);
    kvp_etcd_destroy(e);

    assert_int_equal(kvp_etcd_create_ex(&p, &e, err, sizeof(err)), KVP_OK);
    SCRIPT({"/v3/auth/authenticate", 200, "{\"header\":{}}"});
    assert_int_equal(kvp_etcd_put(e, "k", "v", 1, 0), KVP_ERR_PROTOCOL);
    assert_error_has(e, "answer without a token");
    SCRIPT({"/v3/auth/authenticate", 400,
            "{\"error\":\"etcdserver: authentication failed, invalid user ID or password\","
            "\"message\":\"etcdserver: authentication failed, invalid user ID or password\","
            "\"code\":3}"});
    assert_int_equal(kvp_etcd_put(e, "k", "v", 1, 0), KVP_ERR_DENIED);
    assert_error_has(e, "authentication as user 'kvpool' failed");
    kvp_etcd_destroy(e);
    unlink(pw);
}

static void test_kv(void **state)
{
    (void)state;
    kvp_etcd_t *e = client();
    char *val = NULL;
    size_t len = 0;
    int64_t crev = 0, mrev = 0, rev = 0;

    assert_int_equal(kvp_etcd_get(e, "/t/kv/missing", &val, &len, &crev, &mrev, &rev),
                     KVP_ERR_NOT_FOUND);
    assert_null(val);

    assert_int_equal(kvp_etcd_put(e, "/t/kv/a", "hello", 5, 0), KVP_OK);
    assert_int_equal(kvp_etcd_get(e, "/t/kv/a", &val, &len, &crev, &mrev, &rev), KVP_OK);
    assert_string_equal(val, "hello");
    assert_int_equal(len, 5);
    assert_true(crev > 0);
    assert_int_equal(crev, mrev);
    assert_true(rev >= mrev);
    free(val);
    int64_t crev1 = crev, mrev1 = mrev;
    assert_int_equal(kvp_etcd_put(e, "/t/kv/a", "", 0, 0), KVP_OK);
    assert_int_equal(kvp_etcd_get(e, "/t/kv/a", &val, &len, &crev, &mrev, NULL), KVP_OK);
    assert_string_equal(val, ""); /* an empty value: the gateway omits it */
    assert_int_equal(len, 0);
    assert_int_equal(crev, crev1);
    assert_true(mrev > mrev1);
    free(val);

    /* base64 of keys and values of every length mod 3, bytes >= 0x80, NULs in values */
    const char *keys[] = {"/t/kv/b/\x01", "/t/kv/b/\xff\xfe", "/t/kv/b/\xc3\xbc=+/", "/t/kv/b/x"};
    for (size_t k = 0; k < 4; k++) {
        char bin[7] = {'\0', (char)0xff, 'a', '\0', (char)0x80, '=', (char)k};
        size_t n = 4 + k;
        assert_int_equal(kvp_etcd_put(e, keys[k], bin, n, 0), KVP_OK);
        assert_int_equal(kvp_etcd_get(e, keys[k], &val, &len, NULL, NULL, NULL), KVP_OK);
        assert_int_equal(len, n);
        assert_memory_equal(val, bin, n);
        assert_int_equal(val[n], '\0');
        free(val);
    }

    /* list: exactly the prefix, in key order */
    assert_int_equal(kvp_etcd_put(e, "/t/list/b", "2", 1, 0), KVP_OK);
    assert_int_equal(kvp_etcd_put(e, "/t/list/a", "1", 1, 0), KVP_OK);
    assert_int_equal(kvp_etcd_put(e, "/t/list0", "no", 2, 0), KVP_OK);
    assert_int_equal(kvp_etcd_put(e, "/t/lis", "no", 2, 0), KVP_OK);
    listed_t l = {0};
    assert_int_equal(kvp_etcd_list(e, "/t/list/", list_cb, &l), KVP_OK);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.keys[0], "/t/list/a");
    assert_string_equal(l.vals[0], "1");
    assert_string_equal(l.keys[1], "/t/list/b");
    memset(&l, 0, sizeof(l));
    assert_int_equal(kvp_etcd_list(e, "/t/none/", list_cb, &l), KVP_OK);
    assert_int_equal(l.n, 0);
    /* a prefix ending in 0xff: the range end carries into the byte before */
    assert_int_equal(kvp_etcd_put(e, "/t/kv/c\xff\x01", "y", 1, 0), KVP_OK);
    assert_int_equal(kvp_etcd_put(e, "/t/kv/d", "no", 2, 0), KVP_OK);
    memset(&l, 0, sizeof(l));
    assert_int_equal(kvp_etcd_list(e, "/t/kv/c\xff", list_cb, &l), KVP_OK);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.keys[0], "/t/kv/c\xff\x01");
    assert_int_equal(kvp_etcd_list(e, "", list_cb, &l), KVP_ERR_INVALID_ARG);

    /* delete_if: only the holder of the create revision deletes */
    assert_int_equal(kvp_etcd_get(e, "/t/kv/a", NULL, NULL, &crev, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_etcd_delete_if(e, "/t/kv/a", crev - 1), KVP_ERR_NOT_OWNER);
    assert_int_equal(kvp_etcd_get(e, "/t/kv/a", NULL, NULL, NULL, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_etcd_delete_if(e, "/t/kv/a", crev), KVP_OK);
    assert_int_equal(kvp_etcd_get(e, "/t/kv/a", NULL, NULL, NULL, NULL, NULL), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_etcd_delete_if(e, "/t/kv/a", crev), KVP_ERR_NOT_FOUND);
    kvp_etcd_destroy(e);
}

static void test_endpoints(void **state)
{
    (void)state;
    kvp_etcd_t *e = NULL;
    assert_int_equal(kvp_etcd_create("", 1000, &e), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_etcd_create("127.0.0.1:1,,127.0.0.1:2", 1000, &e), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_etcd_create("127.0.0.1:1", 0, &e), KVP_ERR_INVALID_ARG);

    /* nothing listens on the first: the call goes on to the second and stays there */
    char eps[256];
    int dead = kvp_etcd_free_port();
    snprintf(eps, sizeof(eps), "127.0.0.1:%d,http://127.0.0.1:%d/", dead, g_etcd.client_port[0]);
    assert_int_equal(kvp_etcd_create(eps, 1000, &e), KVP_OK);
    assert_int_equal(kvp_etcd_put(e, "/t/ep", "v", 1, 0), KVP_OK);
    char want[64];
    snprintf(want, sizeof(want), "http://127.0.0.1:%d", g_etcd.client_port[0]);
    assert_string_equal(kvp_etcd_endpoint(e), want);
    assert_int_equal(kvp_etcd_get(e, "/t/ep", NULL, NULL, NULL, NULL, NULL), KVP_OK);
    kvp_etcd_destroy(e);

    /* none reachable: KVP_ERR_CONNECT at once, with the reason kept */
    snprintf(eps, sizeof(eps), "127.0.0.1:%d", dead);
    assert_int_equal(kvp_etcd_create(eps, 1000, &e), KVP_OK);
    uint64_t t0 = kvp_now_ms();
    assert_int_equal(kvp_etcd_put(e, "/t/ep", "v", 1, 0), KVP_ERR_CONNECT);
    assert_true(kvp_now_ms() - t0 < 500);
    assert_non_null(strstr(kvp_etcd_error(e), "onnect"));
    kvp_etcd_destroy(e);
}

/* A file of these bytes in a fresh temp dir (mode `mode`); its path in path[0..cap). */
static void write_file(char *path, size_t cap, const char *name, const char *bytes, int mode)
{
    char dir[] = "/tmp/kvpool-etcd-sec.XXXXXX";
    assert_non_null(mkdtemp(dir));
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(bytes, f);
    fclose(f);
    chmod(path, (mode_t)mode);
}

static void remove_file(const char *path)
{
    unlink(path);
    char dir[256];
    snprintf(dir, sizeof(dir), "%s", path);
    *strrchr(dir, '/') = '\0';
    rmdir(dir);
}

/* Security settings are checked at create, the error names what is wrong and never the
 * password; a CA turns schemeless endpoints into https and refuses an http:// one. */
static void test_security_settings(void **state)
{
    (void)state;
    char pw[256], err[512];
    write_file(pw, sizeof(pw), "pw", "s3cret-Pw\n", 0600);
    kvp_etcd_t *e = NULL;
    kvp_etcd_security_t sec = {.cert = pw};
    kvp_etcd_params_t p = {.endpoints = "127.0.0.1:1", .timeout_ms = 1000, .security = &sec};
    assert_int_equal(kvp_etcd_create_ex(&p, &e, err, sizeof(err)), KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "needs its key"));
    sec = (kvp_etcd_security_t){.user = "kvpool"};
    assert_int_equal(kvp_etcd_create_ex(&p, &e, err, sizeof(err)), KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "needs a password file"));
    sec = (kvp_etcd_security_t){.ca = "/nonexistent/ca.crt"};
    assert_int_equal(kvp_etcd_create_ex(&p, &e, err, sizeof(err)), KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "/nonexistent/ca.crt"));
    sec = (kvp_etcd_security_t){.ca = pw};
    p.endpoints = "http://127.0.0.1:1";
    assert_int_equal(kvp_etcd_create_ex(&p, &e, err, sizeof(err)), KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "plain http"));
    p.endpoints = "127.0.0.1:1";
    assert_int_equal(kvp_etcd_create_ex(&p, &e, err, sizeof(err)), KVP_OK);
    assert_string_equal(kvp_etcd_endpoint(e), "https://127.0.0.1:1");
    kvp_etcd_destroy(e);

    char empty[256];
    write_file(empty, sizeof(empty), "empty", "\n", 0600);
    sec = (kvp_etcd_security_t){.user = "kvpool", .password_file = empty};
    assert_int_equal(kvp_etcd_create_ex(&p, &e, err, sizeof(err)), KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "is empty"));
    sec.password_file = pw;
    assert_int_equal(kvp_etcd_create_ex(&p, &e, err, sizeof(err)), KVP_OK);
    /* nothing listens: the error says so and holds no password */
    assert_int_equal(kvp_etcd_put(e, "/t/sec", "v", 1, 0), KVP_ERR_CONNECT);
    assert_null(strstr(kvp_etcd_error(e), "s3cret"));
    kvp_etcd_destroy(e);
    remove_file(empty);
    remove_file(pw);
}

static void test_lease(void **state)
{
    (void)state;
    kvp_etcd_t *e = client();
    int64_t id = 0, ttl = -1;
    assert_int_equal(kvp_etcd_lease_grant(e, 5, &id), KVP_OK);
    assert_true(id != 0);
    assert_int_equal(kvp_etcd_lease_keepalive(e, id, &ttl), KVP_OK);
    assert_int_equal(ttl, 5);
    assert_int_equal(kvp_etcd_put(e, "/t/lease/k", "v", 1, id), KVP_OK);
    assert_int_equal(kvp_etcd_lease_revoke(e, id), KVP_OK);
    /* the key went with the lease */
    assert_int_equal(kvp_etcd_get(e, "/t/lease/k", NULL, NULL, NULL, NULL, NULL),
                     KVP_ERR_NOT_FOUND);
    ttl = -1;
    assert_int_equal(kvp_etcd_lease_keepalive(e, id, &ttl), KVP_OK);
    assert_int_equal(ttl, 0);
    assert_int_equal(kvp_etcd_lease_revoke(e, id), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_etcd_put(e, "/t/lease/k", "v", 1, id), KVP_ERR_NOT_FOUND);
    assert_non_null(strstr(kvp_etcd_error(e), "lease not found"));
    /* a TTL under etcd's minimum is raised to 2 s */
    assert_int_equal(kvp_etcd_lease_grant(e, 1, &id), KVP_OK);
    assert_int_equal(kvp_etcd_lease_keepalive(e, id, &ttl), KVP_OK);
    assert_int_equal(ttl, 2);
    assert_int_equal(kvp_etcd_lease_revoke(e, id), KVP_OK);
    kvp_etcd_destroy(e);
}

static void test_create_key(void **state)
{
    (void)state;
    kvp_etcd_t *a = client(), *b = client();
    int64_t la, lb;
    assert_int_equal(kvp_etcd_lease_grant(a, 10, &la), KVP_OK);
    assert_int_equal(kvp_etcd_lease_grant(b, 10, &lb), KVP_OK);
    bool created = false;
    int64_t rev_a = 0, rev_b = 0;
    assert_int_equal(kvp_etcd_create_key(a, "/t/ck", "A", 1, la, &created, &rev_a), KVP_OK);
    assert_true(created);
    int64_t crev = 0;
    char *val;
    size_t len;
    assert_int_equal(kvp_etcd_get(a, "/t/ck", &val, &len, &crev, NULL, NULL), KVP_OK);
    assert_string_equal(val, "A");
    free(val);
    assert_int_equal(crev, rev_a);
    /* the second loses and learns the holder's create revision */
    assert_int_equal(kvp_etcd_create_key(b, "/t/ck", "B", 1, lb, &created, &rev_b), KVP_OK);
    assert_false(created);
    assert_int_equal(rev_b, rev_a);
    /* a retry by the holder (its first answer lost) is still its own */
    assert_int_equal(kvp_etcd_create_key(a, "/t/ck", "A", 1, la, &created, &rev_b), KVP_OK);
    assert_true(created);
    assert_int_equal(rev_b, rev_a);
    /* an unknown lease */
    assert_int_equal(kvp_etcd_create_key(b, "/t/ck2", "B", 1, 12345, &created, &rev_b),
                     KVP_ERR_NOT_FOUND);
    /* once the holder's lease is gone, the next creator gets a higher create revision */
    assert_int_equal(kvp_etcd_lease_revoke(a, la), KVP_OK);
    assert_int_equal(kvp_etcd_create_key(b, "/t/ck", "B", 1, lb, &created, &rev_b), KVP_OK);
    assert_true(created);
    assert_true(rev_b > rev_a);
    assert_int_equal(kvp_etcd_lease_revoke(b, lb), KVP_OK);
    kvp_etcd_destroy(a);
    kvp_etcd_destroy(b);
}

static void test_watch_events(void **state)
{
    (void)state;
    kvp_etcd_t *e = client();
    int64_t rev = 0;
    kvp_etcd_event_t ev;
    /* a PUT made before the watch, at its start revision, comes back at once */
    assert_int_equal(kvp_etcd_put(e, "/t/w/put", "abc", 3, 0), KVP_OK);
    int64_t mrev = 0, crev = 0;
    assert_int_equal(kvp_etcd_get(e, "/t/w/put", NULL, NULL, &crev, &mrev, &rev), KVP_OK);
    assert_int_equal(kvp_etcd_watch(e, "/t/w/put", mrev, 2000, NULL, &ev), KVP_OK);
    assert_int_equal(ev.type, KVP_ETCD_EVENT_PUT);
    assert_int_equal(ev.mod_rev, mrev);
    assert_int_equal(ev.create_rev, crev);
    assert_int_equal(ev.len, 3);
    assert_string_equal(ev.val, "abc");
    kvp_etcd_event_cleanup(&ev);

    /* a lease that runs out deletes its key: the watch sees a DELETE */
    int64_t id;
    assert_int_equal(kvp_etcd_lease_grant(e, TTL_S, &id), KVP_OK);
    assert_int_equal(kvp_etcd_put(e, "/t/w/exp", "x", 1, id), KVP_OK);
    assert_int_equal(kvp_etcd_get(e, "/t/w/exp", NULL, NULL, NULL, &mrev, &rev), KVP_OK);
    uint64_t t0 = kvp_now_ms();
    assert_int_equal(kvp_etcd_watch(e, "/t/w/exp", rev + 1, 6000, NULL, &ev), KVP_OK);
    uint64_t took = kvp_now_ms() - t0;
    assert_int_equal(ev.type, KVP_ETCD_EVENT_DELETE);
    assert_true(ev.mod_rev > mrev);
    assert_null(ev.val);
    kvp_etcd_event_cleanup(&ev);
    print_message("lease TTL %d s: key deleted %" PRIu64 " ms after the put\n", TTL_S, took);
    assert_true(took >= 1000 && took <= TTL_MS + 1500);
    kvp_etcd_destroy(e);
}

/* Put key = val; the store's revision right after. */
static int64_t put_rev(kvp_etcd_t *e, const char *key, const char *val)
{
    int64_t rev = 0;
    assert_int_equal(kvp_etcd_put(e, key, val, strlen(val), 0), KVP_OK);
    assert_int_equal(kvp_etcd_get(e, key, NULL, NULL, NULL, NULL, &rev), KVP_OK);
    return rev;
}

static void test_watch_timeout(void **state)
{
    (void)state;
    kvp_etcd_t *e = client();
    int64_t rev = put_rev(e, "/t/w/quiet", "q");
    kvp_etcd_event_t ev;
    uint64_t t0 = kvp_now_ms();
    assert_int_equal(kvp_etcd_watch(e, "/t/w/quiet", rev + 1, 300, NULL, &ev), KVP_ERR_TIMEOUT);
    uint64_t took = kvp_now_ms() - t0;
    assert_true(took >= 300 && took < 800);
    /* the handle still works after a watch cut short */
    assert_int_equal(kvp_etcd_put(e, "/t/w/quiet", "r", 1, 0), KVP_OK);
    assert_int_equal(kvp_etcd_watch(e, "/t/w/quiet", rev + 1, 1000, NULL, &ev), KVP_OK);
    assert_string_equal(ev.val, "r");
    kvp_etcd_event_cleanup(&ev);
    kvp_etcd_destroy(e);
}

typedef struct stopper {
    atomic_bool flag;
    unsigned after_ms;
} stopper_t;

static void *stopper_main(void *arg)
{
    stopper_t *s = arg;
    sleep_ms(s->after_ms);
    atomic_store(&s->flag, true);
    return NULL;
}

static void test_watch_stop(void **state)
{
    (void)state;
    kvp_etcd_t *e = client();
    int64_t rev = put_rev(e, "/t/w/stop", "s");
    kvp_etcd_event_t ev;
    stopper_t s = {.after_ms = 300};
    atomic_init(&s.flag, false);
    pthread_t t;
    uint64_t t0 = kvp_now_ms();
    assert_int_equal(pthread_create(&t, NULL, stopper_main, &s), 0);
    assert_int_equal(kvp_etcd_watch(e, "/t/w/stop", rev + 1, 10000, &s.flag, &ev),
                     KVP_ERR_SHUTDOWN);
    uint64_t took = kvp_now_ms() - t0;
    pthread_join(t, NULL);
    print_message("watch stopped %" PRIu64 " ms after the flag\n", took - s.after_ms);
    /* checked every 100 ms (libcurl's own progress callback: about once a second) */
    assert_true(took >= s.after_ms && took < s.after_ms + 300);
    kvp_etcd_destroy(e);
}

/* POST /v3/kv/compaction: not in the client's API (kvpool never compacts). */
static void compact(int64_t rev)
{
    char url[128], body[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v3/kv/compaction", g_etcd.client_port[0]);
    snprintf(body, sizeof(body), "{\"revision\":\"%" PRId64 "\"}", rev);
    CURL *h = curl_easy_init();
    assert_non_null(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, NULL);
    FILE *devnull = fopen("/dev/null", "w");
    curl_easy_setopt(h, CURLOPT_WRITEDATA, devnull);
    assert_int_equal(curl_easy_perform(h), CURLE_OK);
    long http = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
    assert_int_equal(http, 200);
    fclose(devnull);
    curl_easy_cleanup(h);
}

static void test_watch_compacted(void **state)
{
    (void)state;
    kvp_etcd_t *e = client(); /* also holds libcurl's global state for compact() */
    int64_t mrev1, mrev2, rev;
    kvp_etcd_event_t ev;
    assert_int_equal(kvp_etcd_put(e, "/t/w/cmp", "1", 1, 0), KVP_OK);
    assert_int_equal(kvp_etcd_get(e, "/t/w/cmp", NULL, NULL, NULL, &mrev1, NULL), KVP_OK);
    assert_int_equal(kvp_etcd_put(e, "/t/w/cmp", "2", 1, 0), KVP_OK);
    assert_int_equal(kvp_etcd_get(e, "/t/w/cmp", NULL, NULL, NULL, &mrev2, &rev), KVP_OK);
    compact(mrev2);
    assert_int_equal(kvp_etcd_watch(e, "/t/w/cmp", mrev1, 2000, NULL, &ev), KVP_ERR_OUT_OF_RANGE);
    assert_non_null(strstr(kvp_etcd_error(e), "compacted"));
    /* recovery as documented: read again, watch from the read's revision + 1 */
    assert_int_equal(kvp_etcd_get(e, "/t/w/cmp", NULL, NULL, NULL, NULL, &rev), KVP_OK);
    assert_int_equal(kvp_etcd_watch(e, "/t/w/cmp", rev + 1, 200, NULL, &ev), KVP_ERR_TIMEOUT);
    kvp_etcd_destroy(e);
}

/* ---- the election ---- */

typedef struct change_count {
    atomic_int n;
} change_count_t;

static void on_change(void *arg)
{
    change_count_t *c = arg;
    atomic_fetch_add(&c->n, 1);
}

static kvp_election_t *elect(const char *cluster, const char *self, const char *endpoints,
                             change_count_t *changes)
{
    kvp_election_params_t params = {
        .endpoints = endpoints,
        .cluster = cluster,
        .self = self,
        .ttl_s = TTL_S,
        .timeout_ms = 500,
        .on_change = changes != NULL ? on_change : NULL,
        .arg = changes,
    };
    kvp_election_t *el = NULL;
    assert_int_equal(kvp_election_start(&params, &el), KVP_OK);
    return el;
}

static bool leading(kvp_election_t *el, uint64_t *epoch_p)
{
    return kvp_election_leading(el, kvp_now_ms(), epoch_p);
}

/* Poll until el leads; the ms it took, or -1 after timeout_ms. Fails if
 * `other` leads at the same instant. */
static int64_t wait_leading(kvp_election_t *el, kvp_election_t *other, uint64_t timeout_ms)
{
    uint64_t t0 = kvp_now_ms();
    for (;;) {
        uint64_t now = kvp_now_ms();
        bool a = kvp_election_leading(el, now, NULL);
        if (other != NULL)
            assert_false(a && kvp_election_leading(other, now, NULL));
        if (a)
            return (int64_t)(now - t0);
        if (now - t0 > timeout_ms)
            return -1;
        sleep_ms(5);
    }
}

/* el leads now with an epoch above `before`; returns it. */
static uint64_t assert_new_term(kvp_election_t *el, uint64_t before)
{
    uint64_t epoch = 0;
    assert_true(leading(el, &epoch));
    assert_true(epoch > before);
    return epoch;
}

/* Start A and B; wait until one leads; *leader_p / *standby_p; returns its epoch. */
static uint64_t elect_two(const char *cluster, const char *endpoints, kvp_election_t **leader_p,
                          kvp_election_t **standby_p, change_count_t *changes)
{
    kvp_election_t *a = elect(cluster, "10.0.0.1:7001", endpoints, changes);
    kvp_election_t *b = elect(cluster, "10.0.0.2:7001", endpoints, changes);
    uint64_t t0 = kvp_now_ms();
    while (!leading(a, NULL) && !leading(b, NULL)) {
        assert_true(kvp_now_ms() - t0 < 5000);
        sleep_ms(5);
    }
    *leader_p = leading(a, NULL) ? a : b;
    *standby_p = *leader_p == a ? b : a;
    /* the standby learns the leader */
    t0 = kvp_now_ms();
    while (kvp_election_leader(*standby_p, NULL, 0, NULL) != KVP_OK) {
        assert_true(kvp_now_ms() - t0 < 3000);
        sleep_ms(5);
    }
    uint64_t epoch = 0;
    assert_true(leading(*leader_p, &epoch));
    assert_true(epoch > 0);
    return epoch;
}

static void standby_cb(const char *addr, void *arg)
{
    listed_t *l = arg;
    snprintf(l->vals[l->n++], sizeof(l->vals[0]), "%s", addr);
}

static void test_election_resign(void **state)
{
    (void)state;
    change_count_t changes;
    atomic_init(&changes.n, 0);
    kvp_election_t *l, *s;
    uint64_t epoch = elect_two("resign", g_etcd.endpoints, &l, &s, &changes), seen = 0;
    assert_false(leading(s, NULL));
    /* both name the same leader and epoch */
    char la[64], sa[64];
    assert_int_equal(kvp_election_leader(l, la, sizeof(la), &seen), KVP_OK);
    assert_int_equal(seen, epoch);
    assert_int_equal(kvp_election_leader(s, sa, sizeof(sa), &seen), KVP_OK);
    assert_string_equal(la, sa);
    assert_int_equal(seen, epoch);
    assert_int_equal(kvp_election_leader(s, sa, 4, NULL), KVP_ERR_BUFFER_TOO_SMALL);
    /* the fence is the clock: the same state reads false at a time past the TTL */
    assert_false(kvp_election_leading(l, kvp_now_ms() + TTL_MS, NULL));
    /* each told its on_change (the standby's call comes just after it records the leader) */
    for (uint64_t t0 = kvp_now_ms(); atomic_load(&changes.n) < 2 && kvp_now_ms() - t0 < 2000;)
        sleep_ms(5);
    assert_true(atomic_load(&changes.n) >= 2);

    /* standbys: every member but the leader */
    listed_t st = {0};
    assert_int_equal(kvp_election_standbys(l, standby_cb, &st), KVP_OK);
    assert_int_equal(st.n, 1);
    assert_string_not_equal(st.vals[0], la);

    uint64_t t0 = kvp_now_ms();
    kvp_election_stop(l, true);
    int64_t took = wait_leading(s, NULL, 1000);
    print_message("resign: the standby leads %" PRId64 " ms after stop(resign)\n", took);
    assert_true(took >= 0);
    assert_true(kvp_now_ms() - t0 < 1000);
    uint64_t epoch2 = assert_new_term(s, epoch);
    assert_int_equal(kvp_election_leader(s, sa, sizeof(sa), &seen), KVP_OK);
    assert_string_equal(sa, st.vals[0]);
    assert_int_equal(seen, epoch2);
    /* the resigned member's key went with its lease: no standby is left */
    memset(&st, 0, sizeof(st));
    assert_int_equal(kvp_election_standbys(s, standby_cb, &st), KVP_OK);
    assert_int_equal(st.n, 0);
    kvp_election_stop(s, true);
}

static void test_election_crash(void **state)
{
    (void)state;
    kvp_election_t *l, *s;
    uint64_t epoch = elect_two("crash", g_etcd.endpoints, &l, &s, NULL);
    kvp_election_stop(l, false); /* as a crash: the key lingers until the lease ends */
    int64_t took = wait_leading(s, NULL, TTL_MS + 1500);
    print_message("crash: the standby leads %" PRId64 " ms after the leader stopped (TTL %d s)\n",
                  took, TTL_S);
    assert_true(took >= 0);
    /* not before the lease could have run out: at least TTL - TTL/3 after the last keepalive */
    assert_true(took >= TTL_MS - TTL_MS / 3 - 200);
    assert_new_term(s, epoch);
    kvp_election_stop(s, true);
}

static void test_election_fencing(void **state)
{
    (void)state;
    kvp_election_t *l, *s;
    uint64_t epoch = elect_two("fence", g_etcd.endpoints, &l, &s, NULL);
    uint64_t t0 = kvp_now_ms();
    kvp_election_test_pause(l, true); /* no keepalive from here on */
    /* the paused leader's fence drops before its lease can end; never two leaders */
    int64_t fell = -1, took = -1;
    while (took < 0) {
        uint64_t now = kvp_now_ms();
        bool lead_l = kvp_election_leading(l, now, NULL);
        bool lead_s = kvp_election_leading(s, now, NULL);
        assert_false(lead_l && lead_s);
        /* its last keepalive was sent before the pause: the fence is down by TTL - TTL/5 */
        assert_false(lead_l && now - t0 >= TTL_MS - TTL_MS / 5);
        if (!lead_l && fell < 0)
            fell = (int64_t)(now - t0);
        if (lead_l)
            assert_true(fell < 0); /* never true again once false */
        if (lead_s)
            took = (int64_t)(now - t0);
        assert_true(now - t0 < TTL_MS + 2000);
        sleep_ms(2);
    }
    print_message("fencing: paused leader stops leading after %" PRId64
                  " ms, standby leads after %" PRId64 " ms (TTL %d s)\n",
                  fell, took, TTL_S);
    assert_true(fell >= 0 && took >= fell);
    uint64_t epoch2 = assert_new_term(s, epoch);
    sleep_ms(300);
    assert_false(leading(l, NULL));
    /* resumed: it finds its lease gone, steps down and stands by behind the new leader */
    kvp_election_test_pause(l, false);
    char addr[64], want[64];
    uint64_t seen = 0;
    assert_int_equal(kvp_election_leader(s, want, sizeof(want), NULL), KVP_OK);
    uint64_t t1 = kvp_now_ms();
    while (kvp_election_leader(l, addr, sizeof(addr), &seen) != KVP_OK || seen != epoch2) {
        assert_false(leading(l, NULL));
        assert_true(kvp_now_ms() - t1 < 3000);
        sleep_ms(5);
    }
    assert_string_equal(addr, want);
    assert_false(leading(l, NULL));
    assert_true(leading(s, NULL));
    kvp_election_stop(l, true);
    kvp_election_stop(s, true);
}

/* ---- three members, one lost ---- */

static void test_cluster_lose_member(void **state)
{
    (void)state;
    kvp_etcd_t *e = client();
    assert_int_equal(kvp_etcd_put(e, "/t/c/k", "1", 1, 0), KVP_OK);
    kvp_election_t *l, *s;
    uint64_t epoch = elect_two("three", g_etcd.endpoints, &l, &s, NULL);

    /* the member every client dials first */
    kvp_kill_etcd_member(&g_etcd, 0);
    uint64_t t0 = kvp_now_ms();
    char *val = NULL;
    kvp_status_t st;
    while ((st = kvp_etcd_put(e, "/t/c/k", "2", 1, 0)) != KVP_OK) /* a raft election may run */
        assert_true(kvp_now_ms() - t0 < 5000);
    assert_int_equal(kvp_etcd_get(e, "/t/c/k", &val, NULL, NULL, NULL, NULL), KVP_OK);
    assert_string_equal(val, "2");
    free(val);
    char dead[64];
    snprintf(dead, sizeof(dead), "http://127.0.0.1:%d", g_etcd.client_port[0]);
    assert_string_not_equal(kvp_etcd_endpoint(e), dead);

    /* the election lives on: the leader keeps (or regains) the lead, then hands it over */
    assert_true(wait_leading(l, s, 4000) >= 0);
    uint64_t epoch1 = 0;
    assert_true(leading(l, &epoch1));
    assert_int_equal(epoch1, epoch);
    kvp_election_stop(l, true);
    int64_t took = wait_leading(s, NULL, 1500);
    print_message("3 members, 1 killed: resign handed over in %" PRId64 " ms\n", took);
    assert_true(took >= 0);
    assert_new_term(s, epoch);
    kvp_election_stop(s, true);
    kvp_etcd_destroy(e);
}

/* ---- etcd unreachable at start, stopped and restarted ---- */

typedef struct watcher {
    kvp_etcd_t *e;
    int64_t rev;
    kvp_status_t status;
} watcher_t;

static void *watcher_main(void *arg)
{
    watcher_t *w = arg;
    kvp_etcd_event_t ev;
    w->status = kvp_etcd_watch(w->e, "/kvpool/late/leader", w->rev, 20000, NULL, &ev);
    if (w->status == KVP_OK)
        kvp_etcd_event_cleanup(&ev);
    return NULL;
}

static void test_unreachable_then_restart(void **state)
{
    (void)state;
    int port = kvp_etcd_free_port();
    assert_true(port > 0);
    char eps[64];
    snprintf(eps, sizeof(eps), "127.0.0.1:%d", port);
    kvp_election_t *el = elect("late", "10.0.0.9:7001", eps, NULL);
    sleep_ms(700);
    assert_false(leading(el, NULL));
    assert_int_equal(kvp_election_leader(el, NULL, 0, NULL), KVP_ERR_NOT_FOUND);

    assert_true(kvp_start_etcd_port(&g_etcd, port));
    int64_t took = wait_leading(el, NULL, 3000);
    print_message("etcd up late: leading %" PRId64 " ms after etcd became healthy\n", took);
    assert_true(took >= 0);
    uint64_t epoch = 0;
    assert_true(leading(el, &epoch));

    /* a watch in progress when etcd stops ends with KVP_ERR_CONNECT */
    watcher_t w = {.status = KVP_OK};
    assert_int_equal(kvp_etcd_create(eps, 1000, &w.e), KVP_OK);
    assert_int_equal(kvp_etcd_get(w.e, "/kvpool/late/leader", NULL, NULL, NULL, NULL, &w.rev),
                     KVP_OK);
    w.rev++;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, watcher_main, &w), 0);
    sleep_ms(200);
    uint64_t t0 = kvp_now_ms();
    kvp_stop_etcd_member(&g_etcd, 0);
    pthread_join(t, NULL);
    assert_int_equal(w.status, KVP_ERR_CONNECT);
    kvp_etcd_destroy(w.e);

    /* the leader's fence drops within the TTL while etcd is away */
    while (leading(el, NULL))
        assert_true(kvp_now_ms() - t0 < TTL_MS);
    print_message("etcd stopped: leading false after %" PRIu64 " ms\n", kvp_now_ms() - t0);
    sleep_ms(500);
    assert_false(leading(el, NULL));

    /* etcd restarts with its data: the lease survived, so the same term resumes */
    assert_true(kvp_restart_etcd_member(&g_etcd, 0));
    took = wait_leading(el, NULL, 3000);
    print_message("etcd restarted: leading again %" PRId64 " ms after it became healthy\n", took);
    assert_true(took >= 0);
    uint64_t epoch2 = 0;
    assert_true(leading(el, &epoch2));
    assert_int_equal(epoch2, epoch);
    kvp_election_stop(el, true);
}

static int setup_none(void **state)
{
    (void)state;
    memset(&g_etcd, 0, sizeof(g_etcd));
    return 0;
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_INFO);
    kvp_log_init_from_env();
    const struct CMUnitTest answers[] = {
        cmocka_unit_test(test_answers_range), cmocka_unit_test(test_answers_txn),
        cmocka_unit_test(test_answers_lease), cmocka_unit_test(test_answers_watch),
        cmocka_unit_test(test_answers_token),
    };
    int answers_failed =
        cmocka_run_group_tests_name("etcd_answers", answers, setup_fake, teardown_fake);
    if (answers_failed != 0)
        return answers_failed;
    if (!kvp_etcd_available()) {
        const char *ci = getenv("CI"), *req = getenv("KVPOOL_REQUIRE_ETCD");
        bool required =
            (ci != NULL && strcmp(ci, "true") == 0) || (req != NULL && strcmp(req, "1") == 0);
        fprintf(
            stderr, "test_etcd: no etcd binary on PATH (Debian: apt-get install etcd-server)%s\n",
            required ? "; CI=true or KVPOOL_REQUIRE_ETCD=1 makes that a failure" : ": skipping");
        return required ? 1 : 77;
    }
    const struct CMUnitTest one[] = {
        cmocka_unit_test(test_kv),
        cmocka_unit_test(test_endpoints),
        cmocka_unit_test(test_security_settings),
        cmocka_unit_test(test_lease),
        cmocka_unit_test(test_create_key),
        cmocka_unit_test(test_watch_events),
        cmocka_unit_test(test_watch_timeout),
        cmocka_unit_test(test_watch_stop),
        cmocka_unit_test(test_watch_compacted),
        cmocka_unit_test(test_election_resign),
        cmocka_unit_test(test_election_crash),
        cmocka_unit_test(test_election_fencing),
    };
    const struct CMUnitTest three[] = {
        cmocka_unit_test(test_cluster_lose_member),
    };
    const struct CMUnitTest late[] = {
        cmocka_unit_test(test_unreachable_then_restart),
    };
    int fails = cmocka_run_group_tests_name("etcd_one_member", one, setup_one, teardown_etcd);
    fails += cmocka_run_group_tests_name("etcd_three_members", three, setup_three, teardown_etcd);
    fails += cmocka_run_group_tests_name("etcd_late", late, setup_none, teardown_etcd);
    return fails;
}
