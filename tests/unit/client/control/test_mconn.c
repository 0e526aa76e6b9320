/*
 * test_mconn.c - unit tests for client/control/mconn.c, the master connection
 * shared by a client's threads, against a fake master on 127.0.0.1 (a thread
 * that accepts connections and answers frames as each test scripts it).
 *
 * Checked: replies in another order than the requests reach the right
 * callers; a stuck master times a call out and the connection is replaced;
 * a reply for a call that already timed out is dropped and the next calls
 * get their own replies; a connection that breaks under a call is replaced
 * and the call sent again; frame-level errors; one-way frames; on_ready
 * (first connection, reconnects, refusal); many threads at once.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/control/mconn.h"
#include "common/rpc.h"
#include "common/clock.h"
#include "common/sock.h"

/* ---- the fake master ---- */

typedef struct fake fake_t;
/* Serve one accepted connection; return to close it. conn: 0 for the first. */
typedef void (*serve_fn)(fake_t *f, int fd, int conn);

struct fake {
    int lfd;
    uint16_t port;
    pthread_t thread;
    serve_fn serve;
    int conns;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int flag; /* test <-> server signalling */
    /* on_ready record */
    int ready_calls;
    int ready_first;
    kvp_status_t ready_result;
};

typedef struct req {
    kvp_rpc_hdr_t h;
    char body[256];
} req_t;

/* Read one request frame; false on EOF/error. */
static bool read_req(int fd, req_t *r)
{
    uint8_t hb[KVP_RPC_HDR_LEN];
    if (kvp_recv_all(fd, hb, sizeof(hb)) != KVP_OK)
        return false;
    if (kvp_rpc_hdr_unpack(hb, KVP_RPC_MAX_BODY, &r->h) != KVP_OK)
        return false;
    if (r->h.body_len >= sizeof(r->body))
        return false;
    memset(r->body, 0, sizeof(r->body));
    if (r->h.body_len > 0 && kvp_recv_all(fd, r->body, r->h.body_len) != KVP_OK)
        return false;
    return true;
}

static void reply(int fd, const req_t *r, int32_t status, const char *body)
{
    uint8_t fb[KVP_RPC_HDR_LEN + 256]; /* one send: no Nagle stall between header and body */
    kvp_rpc_hdr_t h = {.method = (uint16_t)(r->h.method | KVP_RPC_RESPONSE_BIT),
                       .request_id = r->h.request_id,
                       .body_len = (uint32_t)strlen(body),
                       .status = status};
    assert_true(h.body_len <= 256);
    kvp_rpc_hdr_pack(&h, fb);
    memcpy(fb + KVP_RPC_HDR_LEN, body, h.body_len);
    assert_int_equal(kvp_send_all(fd, fb, KVP_RPC_HDR_LEN + h.body_len), KVP_OK);
}

static void wait_flag(fake_t *f, int v)
{
    pthread_mutex_lock(&f->lock);
    while (f->flag < v)
        pthread_cond_wait(&f->cv, &f->lock);
    pthread_mutex_unlock(&f->lock);
}

static void set_flag(fake_t *f, int v)
{
    pthread_mutex_lock(&f->lock);
    f->flag = v;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->lock);
}

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    for (;;) {
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0)
            return NULL; /* listening socket shut down */
        int conn = f->conns++;
        f->serve(f, fd, conn);
        close(fd);
    }
}

static fake_t *fake_start(serve_fn serve)
{
    fake_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    f->serve = serve;
    f->ready_result = KVP_OK;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(f->lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(f->lfd, 16), 0);
    socklen_t al = sizeof(a);
    getsockname(f->lfd, (struct sockaddr *)&a, &al);
    f->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
    return f;
}

static void fake_stop(fake_t *f)
{
    shutdown(f->lfd, SHUT_RDWR);
    pthread_join(f->thread, NULL);
    close(f->lfd);
    pthread_mutex_destroy(&f->lock);
    pthread_cond_destroy(&f->cv);
    free(f);
}

static kvp_status_t on_ready(void *arg, kvp_mconn_t *m, kvp_chan_t *ch, bool first)
{
    (void)m;
    (void)ch;
    fake_t *f = arg;
    f->ready_calls++;
    f->ready_first += first;
    return f->ready_result;
}

static kvp_mconn_t *mconn_for(fake_t *f, uint32_t timeout_ms)
{
    kvp_mconn_params_t p = {.host = "127.0.0.1",
                            .port = f->port,
                            .timeout_ms = timeout_ms,
                            .on_ready = on_ready,
                            .arg = f};
    kvp_mconn_t *m;
    assert_int_equal(kvp_mconn_create(&p, &m), KVP_OK);
    return m;
}

/* A call whose reply body must equal `want`. */
static kvp_status_t call_str(kvp_mconn_t *m, const char *body, char *out, size_t cap)
{
    uint8_t *resp = NULL;
    size_t len = 0;
    kvp_status_t st = kvp_mconn_call(m, KVP_RPC_PING, body, strlen(body), &resp, &len);
    if (st == KVP_OK) {
        snprintf(out, cap, "%.*s", (int)len, resp ? (char *)resp : "");
    }
    return st;
}

/* Echo every request, answering whatever has arrived in reverse order. */
static void serve_echo_reversed(fake_t *f, int fd, int conn)
{
    (void)f;
    (void)conn;
    req_t *q = calloc(64, sizeof(*q));
    for (;;) {
        int n = 0;
        if (!read_req(fd, &q[n++]))
            break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        while (n < 64 && poll(&p, 1, 2) == 1 && (p.revents & POLLIN))
            if (!read_req(fd, &q[n++])) {
                n--;
                break;
            }
        for (int i = n - 1; i >= 0; i--)
            if (q[i].h.method != KVP_RPC_LEASE_RELEASE)
                reply(fd, &q[i], 0, q[i].body);
    }
    free(q);
}

/* ---- out of order ---- */

static void serve_four_reversed(fake_t *f, int fd, int conn)
{
    (void)f;
    (void)conn;
    req_t q[4];
    for (int i = 0; i < 4; i++)
        if (!read_req(fd, &q[i]))
            return;
    for (int i = 3; i >= 0; i--)
        reply(fd, &q[i], 0, q[i].body);
    req_t r;
    while (read_req(fd, &r))
        ;
}

typedef struct targ {
    kvp_mconn_t *m;
    int idx;
    int calls;
    kvp_status_t st;
    int wrong;
} targ_t;

static void *one_call(void *arg)
{
    targ_t *t = arg;
    char body[32], got[64];
    snprintf(body, sizeof(body), "req-%d", t->idx);
    t->st = call_str(t->m, body, got, sizeof(got));
    if (t->st == KVP_OK && strcmp(got, body) != 0)
        t->wrong++;
    return NULL;
}

static void test_out_of_order(void **state)
{
    (void)state;
    fake_t *f = fake_start(serve_four_reversed);
    kvp_mconn_t *m = mconn_for(f, 5000);
    assert_int_equal(kvp_mconn_connect(m), KVP_OK);
    pthread_t th[4];
    targ_t ta[4];
    for (int i = 0; i < 4; i++) {
        ta[i] = (targ_t){.m = m, .idx = i};
        pthread_create(&th[i], NULL, one_call, &ta[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(ta[i].st, KVP_OK);
        assert_int_equal(ta[i].wrong, 0);
    }
    kvp_mconn_stats_t s;
    kvp_mconn_stats(m, &s);
    assert_int_equal(s.connects, 1);
    assert_int_equal(s.in_flight, 0);
    assert_int_equal(f->ready_calls, 1);
    assert_int_equal(f->ready_first, 1);
    kvp_mconn_destroy(m);
    fake_stop(f);
}

/* ---- a master that answers nothing ---- */

static void serve_mute_then_echo(fake_t *f, int fd, int conn)
{
    if (conn == 0) {
        req_t r;
        while (read_req(fd, &r))
            ; /* never answers; returns when the client closes */
        return;
    }
    serve_echo_reversed(f, fd, conn);
}

static void test_stuck_master_times_out_and_reconnects(void **state)
{
    (void)state;
    fake_t *f = fake_start(serve_mute_then_echo);
    kvp_mconn_t *m = mconn_for(f, 300);
    char got[64];
    uint64_t t0 = kvp_now_ms();
    assert_int_equal(call_str(m, "lost", got, sizeof(got)), KVP_ERR_TIMEOUT);
    uint64_t took = kvp_now_ms() - t0;
    assert_true(took >= 250);
    assert_true(took < 3000); /* bounded by the timeout, not hung */
    /* nothing arrived at all: the connection was judged dead and closed */
    assert_false(kvp_mconn_connected(m));
    assert_int_equal(call_str(m, "again", got, sizeof(got)), KVP_OK);
    assert_string_equal(got, "again");
    kvp_mconn_stats_t s;
    kvp_mconn_stats(m, &s);
    assert_int_equal(s.connects, 2);
    assert_int_equal(f->ready_calls, 2);
    assert_int_equal(f->ready_first, 0); /* never via kvp_mconn_connect */
    kvp_mconn_destroy(m);
    fake_stop(f);
}

/* ---- a reply after its call timed out ---- */

static void serve_late(fake_t *f, int fd, int conn)
{
    (void)conn;
    req_t a, b, c;
    if (!read_req(fd, &a))
        return;
    set_flag(f, 1); /* A is in */
    if (!read_req(fd, &b))
        return;
    reply(fd, &b, 0, b.body);
    wait_flag(f, 2); /* A timed out */
    reply(fd, &a, 0, "late-A");
    if (!read_req(fd, &c))
        return;
    reply(fd, &c, 0, c.body);
    while (read_req(fd, &c))
        ;
}

static void *call_a(void *arg)
{
    targ_t *t = arg;
    char got[64];
    t->st = call_str(t->m, "A", got, sizeof(got));
    return NULL;
}

static void test_late_reply_dropped(void **state)
{
    (void)state;
    fake_t *f = fake_start(serve_late);
    kvp_mconn_t *m = mconn_for(f, 400);
    assert_int_equal(kvp_mconn_connect(m), KVP_OK);
    targ_t ta = {.m = m};
    pthread_t th;
    pthread_create(&th, NULL, call_a, &ta);
    wait_flag(f, 1);
    char got[64];
    assert_int_equal(call_str(m, "B", got, sizeof(got)), KVP_OK);
    assert_string_equal(got, "B");
    pthread_join(th, NULL);
    assert_int_equal(ta.st, KVP_ERR_TIMEOUT);
    /* B's reply came after A was sent: the master is alive, the connection stays */
    assert_true(kvp_mconn_connected(m));
    set_flag(f, 2);
    assert_int_equal(call_str(m, "C", got, sizeof(got)), KVP_OK);
    assert_string_equal(got, "C"); /* not "late-A" */
    kvp_mconn_stats_t s;
    kvp_mconn_stats(m, &s);
    assert_int_equal(s.connects, 1);
    assert_int_equal(s.late_replies, 1);
    kvp_mconn_destroy(m);
    fake_stop(f);
}

/* ---- a connection that breaks under a call ---- */

static void serve_drop_first(fake_t *f, int fd, int conn)
{
    if (conn == 0) {
        req_t r;
        read_req(fd, &r);
        return; /* closes without answering */
    }
    serve_echo_reversed(f, fd, conn);
}

static void test_broken_connection_retried(void **state)
{
    (void)state;
    fake_t *f = fake_start(serve_drop_first);
    kvp_mconn_t *m = mconn_for(f, 5000);
    assert_int_equal(kvp_mconn_connect(m), KVP_OK);
    char got[64];
    assert_int_equal(call_str(m, "retry-me", got, sizeof(got)), KVP_OK);
    assert_string_equal(got, "retry-me");
    assert_int_equal(f->ready_calls, 2);
    assert_int_equal(f->ready_first, 1);
    kvp_mconn_stats_t s;
    kvp_mconn_stats(m, &s);
    assert_int_equal(s.connects, 2);
    kvp_mconn_destroy(m);
    fake_stop(f);
}

/* ---- error frames, one-way frames ---- */

static void serve_errors_and_oneway(fake_t *f, int fd, int conn)
{
    (void)conn;
    req_t r;
    while (read_req(fd, &r)) {
        if (r.h.method == KVP_RPC_LEASE_RELEASE) {
            pthread_mutex_lock(&f->lock);
            f->flag = r.h.body_len == 3 && memcmp(r.body, "rel", 3) == 0 ? 10 : -1;
            pthread_mutex_unlock(&f->lock);
            continue; /* one-way: no answer */
        }
        if (strcmp(r.body, "refuse") == 0)
            reply(fd, &r, KVP_ERR_NOT_FOUND, "no such thing");
        else if (strcmp(r.body, "garbage-status") == 0)
            reply(fd, &r, 12345, "not a status");
        else
            reply(fd, &r, 0, r.body);
    }
}

static void test_error_frames_and_oneway(void **state)
{
    (void)state;
    fake_t *f = fake_start(serve_errors_and_oneway);
    kvp_mconn_t *m = mconn_for(f, 5000);
    /* no connection: a one-way frame is not sent and does not connect */
    assert_int_equal(kvp_mconn_send(m, KVP_RPC_LEASE_RELEASE, "rel", 3), KVP_ERR_CONNECT);
    assert_false(kvp_mconn_connected(m));
    assert_int_equal(kvp_mconn_connect(m), KVP_OK);
    char got[64];
    assert_int_equal(call_str(m, "refuse", got, sizeof(got)), KVP_ERR_NOT_FOUND);
    assert_int_equal(call_str(m, "garbage-status", got, sizeof(got)), KVP_ERR_PROTOCOL);
    assert_int_equal(kvp_mconn_send(m, KVP_RPC_LEASE_RELEASE, "rel", 3), KVP_OK);
    /* the one-way frame went first on the stream: by this reply it was read */
    assert_int_equal(call_str(m, "after", got, sizeof(got)), KVP_OK);
    assert_string_equal(got, "after");
    pthread_mutex_lock(&f->lock);
    assert_int_equal(f->flag, 10);
    pthread_mutex_unlock(&f->lock);
    kvp_mconn_stats_t s;
    kvp_mconn_stats(m, &s);
    assert_int_equal(s.connects, 1); /* error replies do not cost the connection */
    kvp_mconn_destroy(m);
    fake_stop(f);
}

static void test_ready_refusal(void **state)
{
    (void)state;
    fake_t *f = fake_start(serve_echo_reversed);
    f->ready_result = KVP_ERR_EXISTS;
    kvp_mconn_t *m = mconn_for(f, 2000);
    assert_int_equal(kvp_mconn_connect(m), KVP_ERR_EXISTS);
    assert_false(kvp_mconn_connected(m));
    f->ready_result = KVP_OK;
    char got[64];
    assert_int_equal(call_str(m, "now", got, sizeof(got)), KVP_OK);
    assert_string_equal(got, "now");
    kvp_mconn_destroy(m);
    fake_stop(f);
}

static void test_nobody_listening(void **state)
{
    (void)state;
    fake_t *f = fake_start(serve_echo_reversed);
    kvp_mconn_t *m = mconn_for(f, 1000);
    fake_stop(f); /* the port is closed now */
    char got[64];
    assert_int_equal(call_str(m, "x", got, sizeof(got)), KVP_ERR_CONNECT);
    kvp_mconn_destroy(m);
}

/* ---- many threads ---- */

static void *many_calls(void *arg)
{
    targ_t *t = arg;
    char body[64], got[64];
    for (int i = 0; i < t->calls; i++) {
        snprintf(body, sizeof(body), "t%d-call%d", t->idx, i);
        kvp_status_t st = call_str(t->m, body, got, sizeof(got));
        if (st != KVP_OK) {
            t->st = st;
            return NULL;
        }
        if (strcmp(got, body) != 0)
            t->wrong++;
        if (i % 50 == 0)
            kvp_mconn_send(t->m, KVP_RPC_LEASE_RELEASE, "rel", 3);
    }
    return NULL;
}

static void test_many_threads(void **state)
{
    (void)state;
    fake_t *f = fake_start(serve_echo_reversed);
    kvp_mconn_t *m = mconn_for(f, 10000);
    enum { T = 8 };
    pthread_t th[T];
    targ_t ta[T];
    for (int i = 0; i < T; i++) {
        ta[i] = (targ_t){.m = m, .idx = i, .calls = 500, .st = KVP_OK};
        pthread_create(&th[i], NULL, many_calls, &ta[i]);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(ta[i].st, KVP_OK);
        assert_int_equal(ta[i].wrong, 0);
    }
    kvp_mconn_stats_t s;
    kvp_mconn_stats(m, &s);
    assert_int_equal(s.connects, 1);
    assert_int_equal(s.late_replies, 0);
    assert_int_equal(s.in_flight, 0);
    kvp_mconn_destroy(m);
    fake_stop(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_stuck_master_times_out_and_reconnects),
        cmocka_unit_test(test_late_reply_dropped),
        cmocka_unit_test(test_broken_connection_retried),
        cmocka_unit_test(test_error_frames_and_oneway),
        cmocka_unit_test(test_ready_refusal),
        cmocka_unit_test(test_nobody_listening),
        cmocka_unit_test(test_many_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
