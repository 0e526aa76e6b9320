/*
 * test_http.c - the master's HTTP endpoints (master/obs/http_views.c) over raw
 * sockets, against a real kvpool-master with --http-listen and a real segment:
 * every endpoint's status and content after puts the test made, then hostile
 * requests (garbage, a header over the limit, a POST with a body it never
 * sends, a connection that stops half way) after which /health still answers
 * and a put/get round trip is byte-exact. The master exits 0 at the end (under
 * ASan/LSan: no leak in any of those paths).
 *
 * The Prometheus, promtool and 200-connection checks are in
 * tests/python/test_ops_http.py.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "tests/harness_pool.h"

typedef struct ctx {
    kvp_test_pool_t p; /* the master (with --http-listen), one segment, a client */
    int http_port;
} ctx_t;

static int connect_http(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    struct timeval tv = {.tv_sec = 15};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* Send raw bytes, read the whole answer (HTTP/1.0: the server closes); its status code
 * (0: none) and body in out. */
static int raw(int port, const char *req, size_t req_len, char *out, size_t out_len)
{
    int fd = connect_http(port);
    size_t off = 0;
    while (off < req_len) {
        ssize_t n = send(fd, req + off, req_len - off, MSG_NOSIGNAL);
        if (n <= 0)
            break; /* the server may close on a request it refuses */
        off += (size_t)n;
    }
    size_t got = 0;
    ssize_t n;
    while (got < out_len - 1 && (n = recv(fd, out + got, out_len - 1 - got, 0)) > 0)
        got += (size_t)n;
    out[got] = '\0';
    close(fd);
    int code = 0;
    if (sscanf(out, "HTTP/1.%*d %d", &code) != 1)
        return 0;
    char *body = strstr(out, "\r\n\r\n");
    if (body != NULL)
        memmove(out, body + 4, strlen(body + 4) + 1);
    return code;
}

static int get(int port, const char *path, char *out, size_t out_len)
{
    char req[1024];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    return raw(port, req, (size_t)n, out, out_len);
}

static int setup(void **state)
{
    ctx_t *c = calloc(1, sizeof(*c));
    c->http_port = kvp_etcd_free_port(); /* a port in the harness's range nothing holds */
    char listen[32];
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", c->http_port);
    char *extra[] = {"--http-listen", listen, NULL};
    *state = c;
    return kvp_test_pool_start(&c->p, extra, 1, "64MiB", NULL) ? 0 : -1;
}

static int teardown(void **state)
{
    ctx_t *c = *state;
    int rc = kvp_test_pool_stop(&c->p);
    free(c);
    return rc;
}

static void put_objects(ctx_t *c, const char *prefix, int n, size_t size)
{
    char *buf = malloc(size);
    for (int i = 0; i < n; i++) {
        char key[64];
        snprintf(key, sizeof(key), "%s%d", prefix, i);
        kvp_fill_pattern(buf, size, (uint64_t)i);
        assert_int_equal(kvp_put(c->p.client, key, buf, size, NULL), KVP_OK);
    }
    free(buf);
}

/* Every page of /api/v1/keys?regex=RE, as the docs say a caller walks it (a page may be cut
 * short by the master's per-page time budget, e.g. under ASan on a busy machine): the keys
 * listed in all, and that `must` (a JSON fragment) was on one of the pages. */
static int count_keys(int port, const char *re, const char *must)
{
    static char out[1 << 20];
    unsigned long long cursor = 0;
    int count = 0, pages = 0;
    bool seen = false;
    do {
        char path[256];
        snprintf(path, sizeof(path), "/api/v1/keys?regex=%s&limit=1000&cursor=%llu", re, cursor);
        assert_int_equal(get(port, path, out, sizeof(out)), 200);
        const char *cnt = strstr(out, "\"count\":");
        const char *next = strstr(out, "\"next_cursor\":");
        assert_non_null(cnt);
        assert_non_null(next);
        count += atoi(cnt + strlen("\"count\":"));
        seen = seen || strstr(out, must) != NULL;
        unsigned long long was = cursor;
        cursor = strtoull(next + strlen("\"next_cursor\":"), NULL, 10);
        assert_true(cursor == 0 || cursor > was); /* it moves on */
        assert_true(++pages < 100000);
    } while (cursor != 0);
    assert_true(seen);
    return count;
}

static void test_endpoints(void **state)
{
    ctx_t *c = *state;
    put_objects(c, "http@", 3, 50000);
    static char out[1 << 20];
    assert_int_equal(get(c->http_port, "/health", out, sizeof(out)), 200);
    assert_string_equal(out, "ok\n");
    assert_int_equal(get(c->http_port, "/metrics", out, sizeof(out)), 200);
    assert_non_null(strstr(out, "\nkvpool_puts_total 3\n"));
    assert_non_null(strstr(out, "\nkvpool_objects{tier=\"dram\"} 3\n"));
    assert_non_null(strstr(out, "# TYPE kvpool_rpc_duration_seconds histogram\n"));
    assert_int_equal(get(c->http_port, "/api/v1/stat", out, sizeof(out)), 200);
    assert_non_null(strstr(out, "\"objects\":3"));
    assert_int_equal(get(c->http_port, "/api/v1/segments", out, sizeof(out)), 200);
    assert_non_null(strstr(out, "\"total_segments\":1"));
    assert_non_null(strstr(out, c->p.seg[0].ready));
    assert_int_equal(count_keys(c->http_port, "%5Ehttp%40", "\"key\":\"http@2\""), 3);
    assert_int_equal(get(c->http_port, "/api/v1/keys?regex=(", out, sizeof(out)), 400);
    assert_int_equal(get(c->http_port, "/get_all_segments", out, sizeof(out)), 200);
    char line[600];
    snprintf(line, sizeof(line), "%s\n", c->p.seg[0].ready);
    assert_string_equal(out, line);
    assert_int_equal(get(c->http_port, "/query_segment?segment=nope", out, sizeof(out)), 404);
    assert_int_equal(get(c->http_port, "/query_segment", out, sizeof(out)), 400);
    assert_int_equal(get(c->http_port, "/nothing/here", out, sizeof(out)), 404);
}

static void test_hostile(void **state)
{
    ctx_t *c = *state;
    static char out[1 << 16];
    /* garbage: the server answers 400 or closes; never a crash */
    char junk[4096];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (char)(i * 131 + 7);
    int code = raw(c->http_port, junk, sizeof(junk), out, sizeof(out));
    assert_true(code == 0 || code == 400);
    /* a header far over the 64 KiB a connection may use */
    size_t big = 1 << 20;
    char *req = malloc(big + 64);
    int n = snprintf(req, 64, "GET /metrics HTTP/1.0\r\nX-Big: ");
    memset(req + n, 'a', big);
    memcpy(req + n + big, "\r\n\r\n", 4);
    code = raw(c->http_port, req, (size_t)n + big + 4, out, sizeof(out));
    assert_true(code == 0 || code == 431 || code == 413 || code == 400);
    free(req);
    /* a POST announcing a body it never sends, and a request cut half way: the server
     * holds them until its timeout, and serves everyone else meanwhile */
    int fd1 = connect_http(c->http_port);
    static const char post[] =
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 999999\r\n\r\nab";
    assert_int_equal(send(fd1, post, sizeof(post) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(post) - 1);
    int fd2 = connect_http(c->http_port);
    static const char half[] = "GET /metr";
    assert_int_equal(send(fd2, half, sizeof(half) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(half) - 1);
    assert_int_equal(get(c->http_port, "/health", out, sizeof(out)), 200);
    /* the control plane: a byte-exact round trip */
    put_objects(c, "after@", 2, 70000);
    char *got = malloc(70000), *want = malloc(70000);
    assert_int_equal(kvp_get_into(c->p.client, "after@1", got, 70000), 70000);
    kvp_fill_pattern(want, 70000, 1);
    assert_memory_equal(got, want, 70000);
    free(got);
    free(want);
    close(fd1);
    close(fd2);
    assert_int_equal(get(c->http_port, "/metrics", out, sizeof(out)), 200);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoints),
        cmocka_unit_test(test_hostile),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
