/*
 * test_sock.c - common/sock.c: kvp_sock_unacked, what the master asks of a record stream
 * that closes (master/server.c: were its changes all taken by the owner's TCP?).
 *
 * A loopback tcp pair whose receiver reads nothing: the sender writes until its socket is
 * full, so part of what it wrote waits unacknowledged (the receiver's window is closed);
 * then the receiver reads it all, and every byte is acknowledged.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/sock.h"

static void tcp_pair(int *a, int *b)
{
    int lfd = -1;
    uint16_t port = 0;
    assert_int_equal(kvp_tcp_listen("127.0.0.1", 0, 4, &lfd, &port), KVP_OK);
    assert_int_equal(kvp_tcp_connect("127.0.0.1", port, 2000, a), KVP_OK);
    *b = accept(lfd, NULL, NULL);
    assert_true(*b >= 0);
    close(lfd);
}

static void test_unacked_until_read(void **state)
{
    (void)state;
    int tx, rx;
    tcp_pair(&rx, &tx); /* the accepted end sends, as the master's record streams do */
    int small = 64 << 10;
    assert_int_equal(setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
    assert_false(kvp_sock_unacked(tx, 0));
    assert_int_equal(fcntl(tx, F_SETFL, fcntl(tx, F_GETFL) | O_NONBLOCK), 0);
    static char buf[1 << 16];
    uint64_t sent = 0;
    for (;;) {
        ssize_t n = send(tx, buf, sizeof(buf), MSG_NOSIGNAL);
        if (n < 0) {
            assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
            break;
        }
        sent += (uint64_t)n;
    }
    usleep(50 * 1000); /* what the receiver's window takes is acknowledged by now */
    assert_true(kvp_sock_unacked(tx, sent)); /* the rest waits in the sender's socket */
    uint64_t got = 0;
    while (got < sent) {
        ssize_t n = recv(rx, buf, sizeof(buf), 0);
        assert_true(n > 0);
        got += (uint64_t)n;
    }
    bool acked = false;
    for (int i = 0; i < 100 && !acked; i++) {
        acked = !kvp_sock_unacked(tx, sent);
        if (!acked)
            usleep(10 * 1000);
    }
    assert_true(acked);
    assert_true(kvp_sock_unacked(tx, sent + 1)); /* a byte never written is not acknowledged */
    close(tx);
    close(rx);
}

/* Not tcp: it cannot tell, and says so (false). */
static void test_not_tcp(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_false(kvp_sock_unacked(sv[0], 100));
    close(sv[0]);
    close(sv[1]);
}

/* The choice: BBR (any version) between two ends on one host becomes cubic unless the
 * setting says otherwise, across hosts it stays; "system", or the algorithm the socket runs
 * already, changes nothing; a name is taken as given, on one host or across. */
static void test_congestion_choice(void **state)
{
    (void)state;
    assert_string_equal(kvp_sock_congestion_choice(NULL, "bbr", true), "cubic");
    assert_string_equal(kvp_sock_congestion_choice("", "bbr", true), "cubic");
    assert_string_equal(kvp_sock_congestion_choice("auto", "bbr2", true), "cubic");
    assert_null(kvp_sock_congestion_choice(NULL, "bbr", false));
    assert_null(kvp_sock_congestion_choice("auto", "bbr2", false));
    assert_null(kvp_sock_congestion_choice(NULL, "cubic", true));
    assert_null(kvp_sock_congestion_choice("auto", "dctcp", true));
    assert_null(kvp_sock_congestion_choice("system", "bbr", true));
    assert_string_equal(kvp_sock_congestion_choice("reno", "cubic", true), "reno");
    assert_string_equal(kvp_sock_congestion_choice("cubic", "bbr", false), "cubic");
    assert_null(kvp_sock_congestion_choice("reno", "reno", false));
}

/* Same host: both ends of a loopback pair (v4 and, where the host has it, v6), and of a
 * connection to one of this host's own non-loopback addresses; not a Unix socket, not a
 * socket that is not connected. (Two hosts: tests/net, test_net.py.) */
static void test_same_host(void **state)
{
    (void)state;
    int a, b;
    tcp_pair(&a, &b);
    assert_true(kvp_sock_same_host(a));
    assert_true(kvp_sock_same_host(b));
    close(a);
    close(b);
    int lfd = -1;
    uint16_t port = 0;
    if (kvp_tcp_listen("::1", 0, 4, &lfd, &port) == KVP_OK) {
        assert_int_equal(kvp_tcp_connect("::1", port, 2000, &a), KVP_OK);
        b = accept(lfd, NULL, NULL);
        assert_true(b >= 0);
        assert_true(kvp_sock_same_host(a) && kvp_sock_same_host(b));
        close(a);
        close(b);
        close(lfd);
    }
    struct ifaddrs *ifs = NULL;
    assert_int_equal(getifaddrs(&ifs), 0);
    for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET ||
            (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP))
            continue;
        char host[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, host, sizeof(host));
        assert_int_equal(kvp_tcp_listen(host, 0, 4, &lfd, &port), KVP_OK);
        assert_int_equal(kvp_tcp_connect(host, port, 2000, &a), KVP_OK);
        b = accept(lfd, NULL, NULL);
        assert_true(b >= 0);
        assert_true(kvp_sock_same_host(a) && kvp_sock_same_host(b)); /* own address */
        close(a);
        close(b);
        close(lfd);
        break;
    }
    freeifaddrs(ifs);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_false(kvp_sock_same_host(sv[0]));
    close(sv[0]);
    close(sv[1]);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_false(kvp_sock_same_host(fd)); /* no peer */
    close(fd);
}

static void cc_of(int fd, char *cc, size_t cap)
{
    memset(cc, 0, cap);
    socklen_t len = (socklen_t)cap - 1;
    assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, &len), 0);
}

/* Both ends of a tcp pair take the algorithm $KVPOOL_TCP_CONGESTION names (read at the
 * first call, so set before it: no other test here calls it); a Unix socket is left as
 * it is. */
static void test_data_congestion(void **state)
{
    (void)state;
    setenv("KVPOOL_TCP_CONGESTION", "reno", 1);
    int a, b;
    tcp_pair(&a, &b);
    char cc[32];
    kvp_sock_data_congestion(a);
    kvp_sock_data_congestion(b);
    cc_of(a, cc, sizeof(cc));
    assert_string_equal(cc, "reno");
    cc_of(b, cc, sizeof(cc));
    assert_string_equal(cc, "reno");
    close(a);
    close(b);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    kvp_sock_data_congestion(sv[0]);
    char byte = 7;
    assert_int_equal(write(sv[0], &byte, 1), 1); /* still a working socket */
    assert_int_equal(read(sv[1], &byte, 1), 1);
    close(sv[0]);
    close(sv[1]);
}

/* kvp_recv_discard drops exactly len bytes (more than its sink holds): the next byte is the
 * one after them; a peer gone before len bytes came is an error, not a hang. */
static void test_recv_discard(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    enum { N = 40000 };
    static uint8_t buf[N + 1];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)(i * 7);
    assert_int_equal(kvp_send_all(sv[0], buf, sizeof(buf)), KVP_OK);
    assert_int_equal(kvp_recv_discard(sv[1], N), KVP_OK);
    uint8_t next = 0;
    assert_int_equal(kvp_recv_all(sv[1], &next, 1), KVP_OK);
    assert_int_equal(next, buf[N]);
    assert_int_equal(kvp_send_all(sv[0], buf, 100), KVP_OK);
    close(sv[0]);
    assert_int_not_equal(kvp_recv_discard(sv[1], 200), KVP_OK);
    close(sv[1]);
}

/* Descriptors over a Unix socket: two sent with a message arrive as two new descriptors of
 * the same files (a byte written through one is read through the other's twin); asked for
 * one, the second is closed, not leaked; none sent, none received. */
static void test_unix_fds(void **state)
{
    (void)state;
    int sv[2], p1[2], p2[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(pipe(p1), 0);
    assert_int_equal(pipe(p2), 0);
    int send[2] = {p1[1], p2[1]}, got[4];
    size_t n;
    char msg[8] = "hello!!", buf[8];
    assert_int_equal(kvp_unix_send_fds(sv[0], msg, sizeof(msg), send, 2), KVP_OK);
    assert_int_equal(kvp_unix_recv_fds(sv[1], buf, sizeof(buf), got, 4, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_memory_equal(buf, msg, sizeof(msg));
    assert_int_equal(write(got[0], "a", 1), 1);
    assert_int_equal(write(got[1], "b", 1), 1);
    char c;
    assert_int_equal(read(p1[0], &c, 1), 1);
    assert_int_equal(c, 'a');
    assert_int_equal(read(p2[0], &c, 1), 1);
    assert_int_equal(c, 'b');
    assert_true(fcntl(got[0], F_GETFD) & FD_CLOEXEC);
    close(got[0]);
    close(got[1]);
    /* one asked for: the second closed here (its pipe's write end then has none open once
     * ours is closed too: the reader sees end of file) */
    assert_int_equal(kvp_unix_send_fds(sv[0], msg, sizeof(msg), send, 2), KVP_OK);
    int one = -1;
    assert_int_equal(kvp_unix_recv_fd(sv[1], buf, sizeof(buf), &one), KVP_OK);
    assert_true(one >= 0);
    close(one);
    close(p2[1]);
    fcntl(p2[0], F_SETFL, O_NONBLOCK); /* a leaked twin: EAGAIN, not a hang */
    assert_int_equal(read(p2[0], &c, 1), 0);
    /* a plain message: no descriptor */
    assert_int_equal(kvp_send_all(sv[0], msg, sizeof(msg)), KVP_OK);
    assert_int_equal(kvp_unix_recv_fd(sv[1], buf, sizeof(buf), &one), KVP_OK);
    assert_int_equal(one, -1);
    assert_int_equal(kvp_unix_send_fds(sv[0], msg, sizeof(msg), send, 0), KVP_ERR_INVALID_ARG);
    close(p1[0]);
    close(p1[1]);
    close(p2[0]);
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unacked_until_read), cmocka_unit_test(test_not_tcp),
        cmocka_unit_test(test_congestion_choice),  cmocka_unit_test(test_same_host),
        cmocka_unit_test(test_data_congestion),    cmocka_unit_test(test_recv_discard),
        cmocka_unit_test(test_unix_fds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
