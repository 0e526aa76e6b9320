/*
 * test_tls.c - unit tests for common/tls.c's client channel.
 *
 * Over a socketpair, a server session (kvp_tls_accept, non-blocking, in a thread) and a
 * client channel (kvp_chan_open) with certificates made by deploy/make-certs.sh
 * (KVPOOL_SOURCE_ROOT names the tree; openssl must be installed): two frames written as two
 * TLS records at once, the client reads the first whole; kvp_chan_wait_readable must then
 * see the second, which OpenSSL read ahead into its buffer (poll cannot see it). It did not:
 * SSL_pending counts only a record already processed, and a client's reply waited for the
 * next bytes on the connection (a heartbeat's answer, up to a second later; found by the
 * insider fuzzer's canary, tests/insider/insider_fuzz.c).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/tls.h"

static char dir[256];

typedef struct server {
    kvp_tls_t *tls;
    int fd;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    bool written;
} server_t;

/* Finish the handshake (reading until the client's first byte), then write two records. */
static void *server_main(void *arg)
{
    server_t *s = arg;
    kvp_ssl_t *ssl = NULL;
    assert_int_equal(kvp_tls_accept(s->tls, s->fd, &ssl), KVP_OK);
    char err[256], b;
    for (;;) {
        ssize_t n = kvp_tls_read(ssl, &b, 1, err, sizeof(err));
        if (n == 1)
            break;
        assert_true(n == KVP_TLS_WANT_READ || n == KVP_TLS_WANT_WRITE);
        usleep(1000);
    }
    const char *frames[2] = {"first frame.", "second frame"};
    for (int i = 0; i < 2; i++) {
        size_t off = 0;
        while (off < 12) {
            ssize_t n = kvp_tls_write(ssl, frames[i] + off, 12 - off, err, sizeof(err));
            if (n > 0)
                off += (size_t)n;
            else
                usleep(1000);
        }
    }
    pthread_mutex_lock(&s->lock);
    s->written = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->lock);
    usleep(300 * 1000); /* keep the session open while the client looks */
    kvp_tls_free(ssl);
    return NULL;
}

static int setup(void **state)
{
    (void)state;
    const char *root = getenv("KVPOOL_SOURCE_ROOT");
    snprintf(dir, sizeof(dir), "/tmp/kvp-test-tls-XXXXXX");
    if (root == NULL || mkdtemp(dir) == NULL)
        return -1;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "bash %s/deploy/make-certs.sh %s >/dev/null 2>&1", root, dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_read_ahead_record_is_readable(void **state)
{
    (void)state;
    char cert[300], key[300], ca[300], err[256];
    snprintf(cert, sizeof(cert), "%s/server.crt", dir);
    snprintf(key, sizeof(key), "%s/server.key", dir);
    snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
    kvp_tls_params_t sp = {.cert = cert, .key = key}, cp = {.ca = ca};
    kvp_tls_t *stls, *ctls;
    assert_int_equal(kvp_tls_create(&sp, true, &stls, err, sizeof(err)), KVP_OK);
    assert_int_equal(kvp_tls_create(&cp, false, &ctls, err, sizeof(err)), KVP_OK);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    server_t s = {.tls = stls, .fd = sv[0]};
    pthread_mutex_init(&s.lock, NULL);
    pthread_cond_init(&s.cv, NULL);
    pthread_t t;
    pthread_create(&t, NULL, server_main, &s);
    kvp_chan_t *ch;
    assert_int_equal(kvp_chan_open(ctls, sv[1], "localhost", 5000, &ch, err, sizeof(err)), KVP_OK);
    assert_int_equal(kvp_chan_send_all(ch, "x", 1), KVP_OK);
    pthread_mutex_lock(&s.lock);
    while (!s.written)
        pthread_cond_wait(&s.cv, &s.lock);
    pthread_mutex_unlock(&s.lock);
    usleep(20 * 1000); /* both records in the socket before the client reads */
    char got[13] = "";
    assert_int_equal(kvp_chan_wait_readable(ch, 1000), KVP_OK);
    assert_int_equal(kvp_chan_recv_all(ch, got, 12), KVP_OK);
    assert_string_equal(got, "first frame.");
    /* the second record was read ahead with the first: readable now, not after a timeout */
    assert_int_equal(kvp_chan_wait_readable(ch, 100), KVP_OK);
    assert_int_equal(kvp_chan_recv_all(ch, got, 12), KVP_OK);
    assert_string_equal(got, "second frame");
    pthread_join(t, NULL);
    kvp_chan_close(ch);
    close(sv[0]);
    kvp_tls_destroy(stls);
    kvp_tls_destroy(ctls);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_ahead_record_is_readable),
    };
    return cmocka_run_group_tests_name("tls", tests, setup, teardown);
}
