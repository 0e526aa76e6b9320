/*
 * test_conn_server.c - the data servers' listener (client/segment/conn_server.c) and what
 * one peer may hold of it: real tcp connections on 127.0.0.1 from several loopback
 * addresses (127.0.0.2, .3, ...: a peer each), to a server whose serve function speaks a
 * toy protocol of 4-byte frames ("H...": admitted, then echoed; anything else: echoed).
 *
 * Checked: a peer's unauthenticated connections past its share are closed as they come,
 * another peer is served meanwhile, and the ones held are closed at the handshake
 * deadline (each counted by reason); past the cap of unauthenticated connections in all
 * the oldest makes way for a new one; the caps of connections in all and per peer hold
 * for admitted ones; a frame trickled a byte at a time is cut at its deadline, and an
 * admitted connection idle between frames is not; out of descriptors, the waiting
 * connection is accepted on the spare descriptor and closed (counted), and once
 * descriptors are back connections are served again; the process-wide limits' defaults.
 * No sleeps: every wait is a recv or poll on a socket, with a bound.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "client/segment/conn_server.h"
#include "common/clock.h"
#include "common/sock.h"

/* The toy protocol: 4-byte frames; "H" admits; every frame is echoed. */
static void serve_toy(void *arg, kvp_conn_t *conn)
{
    (void)arg;
    char f[4];
    while (kvp_conn_recv_head(conn, f, sizeof(f)) == KVP_OK) {
        if (f[0] == 'H')
            kvp_conn_admit(conn);
        if (kvp_send_all(kvp_conn_fd(conn), f, sizeof(f)) != KVP_OK)
            return;
        kvp_conn_frame_end(conn);
    }
}

typedef struct fixture {
    kvp_conn_server_t *srv;
    uint16_t port;
} fixture_t;

static fixture_t start(kvp_conn_limits_t l)
{
    kvp_conn_limits_set_default(&l);
    fixture_t fx = {0};
    assert_int_equal(kvp_conn_server_create("test server", "127.0.0.1", 0, false, serve_toy, NULL,
                                            &fx.srv, &fx.port),
                     KVP_OK);
    kvp_conn_limits_set_default(NULL);
    return fx;
}

/* A connection from 127.0.0.<host> (a peer of its own), a receive bound of 5 s. */
static int connect_from(const fixture_t *fx, int host)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in src = {.sin_family = AF_INET};
    src.sin_addr.s_addr = htonl(0x7f000000u | (uint32_t)host);
    assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(fx->port)};
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&dst, sizeof(dst)), 0);
    kvp_sock_set_timeout(fd, 5000);
    return fd;
}

/* Send a frame and read its echo: true if the server served it. */
static bool roundtrip(int fd, char kind)
{
    char f[4] = {kind, 'x', 'y', 'z'}, r[4];
    return send(fd, f, sizeof(f), MSG_NOSIGNAL) == sizeof(f) &&
           kvp_recv_all(fd, r, sizeof(r)) == KVP_OK && memcmp(f, r, sizeof(f)) == 0;
}

/* Did the server close it within ms (EOF or a reset; nothing else arrives)? */
static bool closed_within(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, ms) != 1)
        return false;
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno == ECONNRESET);
}

static kvp_conn_refusals_t refusals(const fixture_t *fx)
{
    kvp_conn_refusals_t r = {0};
    kvp_conn_server_refusals(fx->srv, &r);
    return r;
}

static void test_defaults(void **state)
{
    (void)state;
    kvp_conn_limits_t l;
    kvp_conn_limits_get_default(&l);
    assert_int_equal(l.max_conns, KVP_CONN_DEFAULT_MAX_CONNS);
    assert_int_equal(l.max_per_peer, KVP_CONN_DEFAULT_MAX_PER_PEER);
    assert_int_equal(l.max_unauth, KVP_CONN_DEFAULT_MAX_UNAUTH);
    assert_int_equal(l.max_unauth_per_peer, KVP_CONN_DEFAULT_MAX_UNAUTH / 4);
    assert_int_equal(l.handshake_ms, KVP_CONN_DEFAULT_HANDSHAKE_MS);
    assert_int_equal(l.frame_ms, KVP_CONN_DEFAULT_FRAME_MS);
    kvp_conn_limits_set_default(&(kvp_conn_limits_t){.max_unauth = 16, .frame_ms = 5});
    kvp_conn_limits_get_default(&l);
    assert_int_equal(l.max_unauth_per_peer, 4);
    assert_int_equal(l.frame_ms, 5);
    assert_int_equal(l.max_conns, KVP_CONN_DEFAULT_MAX_CONNS);
    /* the environment's (KVPOOL_DATA_*) fill only what was not set (kvpool serve's flags) */
    kvp_conn_limits_fill(&(kvp_conn_limits_t){.max_unauth = 99, .max_conns = 77});
    kvp_conn_limits_get_default(&l);
    assert_int_equal(l.max_unauth, 16);
    assert_int_equal(l.max_conns, 77);
    assert_int_equal(l.frame_ms, 5);
    kvp_conn_limits_set_default(NULL);
    kvp_conn_limits_get_default(&l);
    assert_int_equal(l.frame_ms, KVP_CONN_DEFAULT_FRAME_MS);
    assert_int_equal(l.max_conns, KVP_CONN_DEFAULT_MAX_CONNS);
    /* honest load from one host: 100 transfer threads of 8 streams each (an SSD owner) may
     * be unauthenticated at once, every one for its first round trip */
    assert_true(l.max_unauth_per_peer >= 100 * 8);
    assert_true(l.max_per_peer >= 100 * 8 + 64);
}

static void test_unauthenticated_flood(void **state)
{
    (void)state;
    fixture_t fx = start((kvp_conn_limits_t){.max_conns = 64,
                                             .max_per_peer = 32,
                                             .max_unauth = 16,
                                             .max_unauth_per_peer = 4,
                                             .handshake_ms = 1500,
                                             .frame_ms = 10000});
    int flood[10];
    for (int i = 0; i < 10; i++)
        flood[i] = connect_from(&fx, 2);
    /* another peer is served while they are held (taken after them: they were all seen) */
    int honest = connect_from(&fx, 1);
    assert_true(roundtrip(honest, 'H'));
    for (int i = 0; i < 10; i++) /* the first 4 held, the rest past the peer's share */
        assert_int_equal(closed_within(flood[i], 0), i >= 4);
    /* the held ones go at the handshake deadline, bytes or not (one sends half a frame) */
    assert_int_equal(send(flood[0], "E", 1, MSG_NOSIGNAL), 1);
    uint64_t t0 = kvp_now_ms();
    for (int i = 0; i < 10; i++) {
        assert_true(closed_within(flood[i], 3000));
        close(flood[i]);
    }
    assert_true(kvp_now_ms() - t0 < 3000);
    kvp_conn_refusals_t r = refusals(&fx);
    assert_int_equal(r.unauth_limit, 6);
    assert_int_equal(r.handshake_timeout, 4);
    assert_true(roundtrip(honest, 'E')); /* admitted: no handshake deadline */
    close(honest);
    kvp_conn_server_destroy(fx.srv);
}

static void test_oldest_unauthenticated_makes_way(void **state)
{
    (void)state;
    fixture_t fx = start((kvp_conn_limits_t){.max_conns = 64,
                                             .max_per_peer = 32,
                                             .max_unauth = 8,
                                             .max_unauth_per_peer = 4,
                                             .handshake_ms = 10000,
                                             .frame_ms = 10000});
    int held[8];
    for (int i = 0; i < 8; i++) {
        held[i] = connect_from(&fx, 2 + i / 4);
        assert_true(roundtrip(held[i], 'E')); /* served, still unauthenticated */
    }
    int honest = connect_from(&fx, 1);
    assert_true(roundtrip(honest, 'H'));
    assert_true(closed_within(held[0], 3000)); /* the oldest */
    for (int i = 1; i < 8; i++)
        assert_true(roundtrip(held[i], 'E'));
    assert_int_equal(refusals(&fx).unauth_limit, 1);
    for (int i = 0; i < 8; i++)
        close(held[i]);
    close(honest);
    kvp_conn_server_destroy(fx.srv);
}

static void test_caps_of_admitted(void **state)
{
    (void)state;
    fixture_t fx = start((kvp_conn_limits_t){.max_conns = 12,
                                             .max_per_peer = 5,
                                             .max_unauth = 8,
                                             .max_unauth_per_peer = 4,
                                             .handshake_ms = 10000,
                                             .frame_ms = 10000});
    int fds[12], n = 0;
    for (int i = 0; i < 5; i++) {
        fds[n] = connect_from(&fx, 2);
        assert_true(roundtrip(fds[n++], 'H'));
    }
    int extra = connect_from(&fx, 2); /* the peer's sixth */
    assert_true(closed_within(extra, 3000));
    close(extra);
    for (int i = 0; i < 7; i++) {
        fds[n] = connect_from(&fx, 3 + i / 4);
        assert_true(roundtrip(fds[n++], 'H'));
    }
    extra = connect_from(&fx, 9); /* the server's thirteenth */
    assert_true(closed_within(extra, 3000));
    close(extra);
    kvp_conn_refusals_t r = refusals(&fx);
    assert_int_equal(r.peer_limit, 1);
    assert_int_equal(r.conn_limit, 1);
    /* one leaves: room again */
    close(fds[--n]);
    int again = -1;
    for (int tries = 0; tries < 50 && again < 0; tries++) { /* its thread ends first */
        again = connect_from(&fx, 9);
        if (!roundtrip(again, 'H')) {
            close(again);
            again = -1;
            struct pollfd none = {.fd = -1};
            poll(&none, 1, 20);
        }
    }
    assert_true(again >= 0);
    close(again);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    kvp_conn_server_destroy(fx.srv);
}

static void test_trickled_frame_is_cut(void **state)
{
    (void)state;
    fixture_t fx = start((kvp_conn_limits_t){.handshake_ms = 10000, .frame_ms = 300});
    int fd = connect_from(&fx, 1);
    assert_true(roundtrip(fd, 'H'));
    /* idle between frames, admitted: not cut (longer than the frame deadline) */
    assert_false(closed_within(fd, 600));
    assert_true(roundtrip(fd, 'E'));
    /* a byte every 200 ms: the frame's deadline is its first byte's, not the last one's */
    uint64_t t0 = kvp_now_ms();
    bool cut = false;
    for (int i = 0; i < 30 && !cut; i++) {
        if (send(fd, "E", 1, MSG_NOSIGNAL) != 1)
            break;
        cut = closed_within(fd, 200);
    }
    if (!cut)
        cut = closed_within(fd, 2000);
    assert_true(cut);
    assert_true(kvp_now_ms() - t0 < 2000);
    assert_int_equal(refusals(&fx).frame_timeout, 1);
    close(fd);
    kvp_conn_server_destroy(fx.srv);
}

static void test_out_of_descriptors(void **state)
{
    (void)state;
    fixture_t fx = start((kvp_conn_limits_t){.handshake_ms = 10000, .frame_ms = 10000});
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = 256;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    int fill[256], n = 0;
    for (;;) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            break;
        assert_true(n < 256);
        fill[n++] = fd;
    }
    assert_int_equal(errno, EMFILE);
    close(fill[--n]); /* room for the client's socket only */
    int c = connect_from(&fx, 1);
    /* the server cannot take it: accepted on its spare descriptor and closed */
    assert_true(closed_within(c, 3000));
    close(c);
    assert_int_equal(refusals(&fx).resources, 1);
    while (n > 0)
        close(fill[--n]);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    /* descriptors back: served again */
    c = connect_from(&fx, 1);
    assert_true(roundtrip(c, 'H'));
    close(c);
    kvp_conn_server_destroy(fx.srv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_unauthenticated_flood),
        cmocka_unit_test(test_oldest_unauthenticated_makes_way),
        cmocka_unit_test(test_caps_of_admitted),
        cmocka_unit_test(test_trickled_frame_is_cut),
        cmocka_unit_test(test_out_of_descriptors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
