/*
 * test_errors.c - errors a user can act on, against real processes: the
 * status a call returns and what kvp_client_last_error() says about it.
 *
 *   - bad client settings are refused with a text that names the setting;
 *   - a client without a segment pointed at something that takes the
 *     connection but is no kvpool master (a hung listener, a service that
 *     answers with other bytes) fails create, saying so, instead of every
 *     call after it;
 *   - a batch names its first failing key; a later successful call leaves
 *     the text alone (like errno) and a failure on another thread does not
 *     show here (thread-local);
 *   - an object with two replicas whose owners are both frozen (SIGSTOP,
 *     so their segments stay mounted but answer nothing) is
 *     KVP_ERR_NO_REPLICA for a get and for a put, with the text naming the
 *     segment that failed; a single-replica object keeps the precise status
 *     of its one failure (a timeout).
 *
 * The reader is forced to tcp: over shm a same-host reader copies from the
 * owner's memory even while the owner is stopped.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "client/include/kvpool.h"
#include "tests/harness.h"

#define SEG_SIZE "16MiB"
#define OBJ 65536

typedef struct env {
    kvp_proc_t master;
    kvp_proc_t seg[2];
    bool frozen[2];
    kvp_client_t *client;
} env_t;

static kvp_client_t *client_new(const env_t *e, uint32_t rpc_timeout_ms)
{
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = e->master.ready;
    p.transport = "tcp";
    p.rpc_timeout_ms = rpc_timeout_ms;
    kvp_client_t *c = NULL;
    return kvp_client_create(&p, &c) == KVP_OK ? c : NULL;
}

static int setup(void **state)
{
    env_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return -1;
    *state = e;
    char *args[] = {"--client-ttl", "60", NULL};
    if (!kvp_start_master_args(&e->master, args))
        return -1;
    for (int i = 0; i < 2; i++)
        if (!kvp_start_segment(&e->seg[i], e->master.ready, SEG_SIZE, "tcp"))
            return -1;
    e->client = client_new(e, 1000);
    return e->client != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    env_t *e = *state;
    kvp_client_destroy(e->client);
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        if (e->frozen[i])
            kill(e->seg[i].pid, SIGCONT);
        if (e->seg[i].pid > 0 && kvp_proc_stop(&e->seg[i], SIGTERM, 10000) != 0)
            rc = -1;
    }
    if (e->master.pid > 0 && kvp_proc_stop(&e->master, SIGTERM, 10000) != 0)
        rc = -1;
    free(e);
    return rc;
}

static void expect_text(const char *want)
{
    const char *got = kvp_client_last_error();
    if (strstr(got, want) == NULL)
        fail_msg("kvp_client_last_error() is \"%s\", want it to contain \"%s\"", got, want);
}

/* Settings a client cannot run with: refused, and the text says which and why. */
static void test_bad_settings_named(void **state)
{
    (void)state;
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = "127.0.0.1:1";
    p.tcp_streams = 100;
    kvp_client_t *c = NULL;
    assert_int_equal(kvp_client_create(&p, &c), KVP_ERR_INVALID_ARG);
    assert_null(c);
    expect_text("tcp_streams must be 1..64");
    expect_text("got 100");

    kvp_client_params_init(&p);
    p.master_addr = "127.0.0.1:1";
    p.transport = "carrier-pigeon";
    assert_int_equal(kvp_client_create(&p, &c), KVP_ERR_INVALID_ARG);
    expect_text("unknown transport 'carrier-pigeon'");

    kvp_client_params_init(&p);
    p.master_addr = "no-port-here";
    assert_int_equal(kvp_client_create(&p, &c), KVP_ERR_INVALID_ARG);
    expect_text("master address must be HOST:PORT or etcd://HOST:PORT[,HOST:PORT...]/CLUSTER, got "
                "'no-port-here'");
}

/* A listener on 127.0.0.1 (port in *port); NULL-free: fails the test on error. */
static int listener(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 8), 0);
    socklen_t len = sizeof(a);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* Answers each connection with an HTTP error, as a web service would, until the listener
 * is shut down. */
static void *http_like_main(void *arg)
{
    int fd;
    while ((fd = accept(*(int *)arg, NULL, NULL)) >= 0) {
        static const char reply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                                    "Connection: keep-alive\r\n\r\n";
        ssize_t w = write(fd, reply, sizeof(reply) - 1);
        (void)w;
        char buf[256];
        while (read(fd, buf, sizeof(buf)) > 0) /* until the client gives up */
            ;
        close(fd);
    }
    return NULL;
}

static kvp_status_t create_at(uint16_t port, kvp_client_t **c)
{
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)port);
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = addr;
    p.rpc_timeout_ms = 500;
    *c = NULL;
    return kvp_client_create(&p, c);
}

/* Something that takes the connection but is no master: create fails and says why. */
static void test_not_a_master(void **state)
{
    (void)state;
    uint16_t port;
    int lfd = listener(&port); /* never accepts: the kernel completes the handshake */
    kvp_client_t *c;
    assert_int_equal(create_at(port, &c), KVP_ERR_TIMEOUT);
    assert_null(c);
    expect_text("did not answer a heartbeat: operation timed out");
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%u", (unsigned)port);
    expect_text(want);
    close(lfd);

    lfd = listener(&port);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, http_like_main, &lfd), 0);
    kvp_status_t st = create_at(port, &c);
    assert_null(c);
    if (st != KVP_ERR_PROTOCOL)
        fail_msg("create against an HTTP service: %s, want a protocol error", kvp_strerror(st));
    expect_text("did not answer a heartbeat: protocol error");
    shutdown(lfd, SHUT_RDWR); /* ends the accept loop */
    pthread_join(t, NULL);
    close(lfd);
}

typedef struct other_thread {
    kvp_client_t *client;
    int64_t got;
    char text[512];
} other_thread_t;

static void *other_main(void *arg)
{
    other_thread_t *t = arg;
    char buf[16];
    t->got = kvp_get_into(t->client, "errors/other-thread-missing", buf, sizeof(buf));
    snprintf(t->text, sizeof(t->text), "%s", kvp_client_last_error());
    return NULL;
}

/* A batch names its first failing key; success leaves the text; other threads have their own. */
static void test_first_failing_key_and_thread_local(void **state)
{
    env_t *e = *state;
    static char val[OBJ], out[2][OBJ];
    kvp_fill_pattern(val, sizeof(val), 1);
    assert_int_equal(kvp_put(e->client, "errors/present", val, sizeof(val), NULL), KVP_OK);

    const char *keys[2] = {"errors/present", "errors/missing"};
    void *bufs[2] = {out[0], out[1]};
    size_t caps[2] = {OBJ, OBJ};
    int64_t res[2];
    assert_int_equal(kvp_batch_get_into(e->client, keys, bufs, caps, 2, res), KVP_ERR_NOT_FOUND);
    assert_int_equal(res[0], OBJ);
    assert_memory_equal(out[0], val, OBJ);
    assert_int_equal(res[1], KVP_ERR_NOT_FOUND);
    expect_text("get errors/missing: key not found");

    /* a buffer too small is named too, with its key */
    assert_int_equal(kvp_get_into(e->client, "errors/present", out[0], 16),
                     KVP_ERR_BUFFER_TOO_SMALL);
    expect_text("get errors/present: destination buffer smaller than the object");

    /* a single-key call names its key too */
    assert_int_equal(kvp_get_size(e->client, "errors/missing"), KVP_ERR_NOT_FOUND);
    expect_text("get_size errors/missing: key not found");

    /* a put of an existing key */
    assert_int_equal(kvp_put(e->client, "errors/present", val, sizeof(val), NULL), KVP_ERR_EXISTS);
    expect_text("put errors/present: key already exists");

    /* success does not touch it */
    assert_int_equal(kvp_get_into(e->client, "errors/present", out[0], OBJ), OBJ);
    assert_int_equal(kvp_remove(e->client, "errors/present"), KVP_OK);
    expect_text("put errors/present: key already exists");

    /* another thread's failure is its own */
    other_thread_t t = {.client = e->client};
    pthread_t tid;
    assert_int_equal(pthread_create(&tid, NULL, other_main, &t), 0);
    assert_int_equal(pthread_join(tid, NULL), 0);
    assert_int_equal(t.got, KVP_ERR_NOT_FOUND);
    assert_non_null(strstr(t.text, "get errors/other-thread-missing: key not found"));
    expect_text("put errors/present: key already exists");
}

/* Both owners of a 2-replica object frozen: NO_REPLICA for get and put, each copy's failure
 * said; with one replica, that replica's own failure. */
static void test_no_replica_reachable(void **state)
{
    env_t *e = *state;
    static char val[OBJ], out[OBJ];
    kvp_fill_pattern(val, sizeof(val), 2);
    kvp_put_config_t two;
    kvp_put_config_init(&two);
    two.replica_num = 2;
    uint32_t written = 0;
    kvp_status_t r;
    const char *key = "errors/two-copies";
    const void *src = val;
    size_t size = sizeof(val);
    assert_int_equal(kvp_batch_put_from_ex(e->client, &key, &src, &size, 1, &two, &r, &written),
                     KVP_OK);
    assert_int_equal(written, 2);
    assert_int_equal(kvp_put(e->client, "errors/one-copy", val, sizeof(val), NULL), KVP_OK);

    for (int i = 0; i < 2; i++) {
        assert_true(kvp_proc_freeze(e->seg[i].pid, 5000));
        e->frozen[i] = true;
    }
    assert_int_equal(kvp_get_into(e->client, key, out, sizeof(out)), KVP_ERR_NO_REPLICA);
    expect_text("get errors/two-copies: read from segment");
    expect_text("operation timed out");

    assert_int_equal(kvp_get_into(e->client, "errors/one-copy", out, sizeof(out)), KVP_ERR_TIMEOUT);
    expect_text("get errors/one-copy: read from segment");

    key = "errors/two-copies-new";
    assert_int_equal(kvp_batch_put_from_ex(e->client, &key, &src, &size, 1, &two, &r, &written),
                     KVP_ERR_NO_REPLICA);
    assert_int_equal(r, KVP_ERR_NO_REPLICA);
    assert_int_equal(written, 0);
    expect_text("put errors/two-copies-new: write to segment");

    for (int i = 0; i < 2; i++) {
        assert_int_equal(kill(e->seg[i].pid, SIGCONT), 0);
        e->frozen[i] = false;
    }
    /* the owners are back: the copies are intact and readable again */
    assert_int_equal(kvp_get_into(e->client, "errors/two-copies", out, sizeof(out)), OBJ);
    assert_memory_equal(out, val, OBJ);
    assert_int_equal(kvp_is_exist(e->client, "errors/two-copies-new"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_settings_named),
        cmocka_unit_test(test_not_a_master),
        cmocka_unit_test_setup_teardown(test_first_failing_key_and_thread_local, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_replica_reachable, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
