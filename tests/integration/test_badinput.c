/*
 * test_badinput.c - hostile bytes on the wire: raw sockets to a real
 * kvpool-master and to a real segment server's tcp data endpoint.
 *
 * Master (24-byte RPC frames, common/rpc.h): garbage is closed at once; a bad
 * version or an oversized body_len gets an error frame then the close (and
 * the body is never allocated); an unknown method or an undecodable body gets
 * an error frame and the connection stays usable. After every bad connection
 * a normal client's put/get round trip must still be byte-exact, and after
 * 200 of them the master's fd count is back to its baseline and its RSS has
 * not grown by more than a few MiB.
 *
 * Segment data server (32-byte requests, client/transport/wire.h): a garbage header
 * is closed; a READ outside the segment or of another segment id gets an
 * error response and the connection goes on. The segment process keeps
 * serving and exits 0 on SIGTERM at teardown.
 *
 * The wire layouts are written out here byte by byte on purpose: the test
 * checks the documented protocol, not our own encoder.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "common/rpc.h"
#include "tests/harness.h"

#define SEG_SIZE "64MiB"

#define RPC_MAGIC 0x3150564Bu
#define RPC_HDR 32
#define RPC_VERSION 2
#define RPC_RESP 0x8000u
#define M_PING 1
#define M_PUT_START 4
#define M_STAT 11

#define DATA_MAGIC 0x4450564Bu
#define DATA_REQ 32
#define DATA_RESP 16
#define OP_READ 1
#define OP_WRITE 2
#define OP_READV 3
#define OP_WRITEV 4
#define VEC_MAX 256

#define IO_TIMEOUT_MS 5000

/*
 * How much the master's RSS may grow over 200 bad connections. Under ASan
 * every freed buffer sits in the quarantine and its touched pages stay
 * resident, so the bound is looser there; LeakSanitizer at the master's exit
 * (a non-zero status from kvp_proc_stop) is the leak check in that build.
 */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_GROWTH_KIB (48 * 1024)
#else
#define RSS_GROWTH_KIB (8 * 1024)
#endif

typedef struct env {
    kvp_proc_t master;
    kvp_proc_t seg;
    kvp_client_t *client;
    int master_fds; /* the master's fd count with only the segment and client connected */
    int round;
} env_t;

typedef struct frame {
    uint32_t magic;
    uint16_t version;
    uint16_t method;
    uint64_t req_id;
    uint32_t body_len;
    int32_t status;
    char body[1024]; /* the first bytes of the body, NUL-terminated */
} frame_t;

static int setup(void **state)
{
    env_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return -1;
    *state = e;
    if (!kvp_start_master(&e->master))
        return -1;
    if (!kvp_start_segment(&e->seg, e->master.ready, SEG_SIZE, NULL))
        return -1;
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = e->master.ready;
    p.transport = "tcp"; /* the round trips go through the data server under test */
    p.rpc_timeout_ms = IO_TIMEOUT_MS;
    if (kvp_client_create(&p, &e->client) != KVP_OK)
        return -1;
    /* a round trip: the master has accepted the client's connection */
    kvp_pool_stat_t *s = NULL;
    if (kvp_pool_stat(e->client, &s) != KVP_OK)
        return -1;
    kvp_pool_stat_free(s);
    e->master_fds = kvp_proc_fd_count(e->master.pid);
    return e->master_fds > 0 ? 0 : -1;
}

static int teardown(void **state)
{
    env_t *e = *state;
    if (e == NULL)
        return -1;
    kvp_client_destroy(e->client);
    int rc = 0;
    int st = kvp_proc_stop(&e->seg, SIGTERM, 10000);
    if (st != 0) {
        fprintf(stderr, "segment server exited with %d\n", st);
        rc = -1;
    }
    st = kvp_proc_stop(&e->master, SIGTERM, 10000);
    if (st != 0) {
        fprintf(stderr, "master exited with %d\n", st);
        rc = -1;
    }
    free(e);
    return rc;
}

/* ---- little-endian packing ---- */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static void rpc_hdr(uint8_t out[RPC_HDR], uint32_t magic, uint16_t version, uint16_t method,
                    uint64_t req_id, uint32_t body_len)
{
    put32(out, magic);
    put16(out + 4, version);
    put16(out + 6, method);
    put64(out + 8, req_id);
    put32(out + 16, body_len);
    put32(out + 20, 0);
    put64(out + 24, 0); /* epoch */
}

static void data_req(uint8_t out[DATA_REQ], uint16_t op, uint64_t seg_id, uint64_t off,
                     uint64_t len)
{
    put32(out, DATA_MAGIC);
    put16(out + 4, op);
    put16(out + 6, 0);
    put64(out + 8, seg_id);
    put64(out + 16, off);
    put64(out + 24, len);
}

/* ---- raw sockets ---- */

static int connect_to(const char *hostport)
{
    char host[256];
    snprintf(host, sizeof(host), "%s", hostport);
    char *colon = strrchr(host, ':');
    assert_non_null(colon);
    *colon = '\0';
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    assert_int_equal(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void send_bytes(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail_msg("send: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

/*
 * Read exactly len bytes within timeout_ms. Returns len, 0 if the peer
 * closed before the first byte, -1 on timeout, error or a close mid-way.
 */
static ssize_t recv_exact(int fd, void *buf, size_t len, int timeout_ms)
{
    uint8_t *p = buf;
    size_t got = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (got < len) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long spent = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (spent >= timeout_ms)
            return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int rc = poll(&pf, 1, (int)(timeout_ms - spent));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            return -1;
        ssize_t n = recv(fd, p + got, len - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            return got == 0 ? 0 : -1;
        if (n < 0)
            return -1;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

/*
 * The peer closes the connection within timeout_ms with nothing (more) to
 * read: recv returns 0 (a reset counts too, it is a close). Fails otherwise.
 */
static void expect_closed(int fd, int timeout_ms, const char *what)
{
    uint8_t b[256];
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int rc;
    do
        rc = poll(&pf, 1, timeout_ms);
    while (rc < 0 && errno == EINTR);
    if (rc == 0)
        fail_msg("%s: connection still open after %d ms", what, timeout_ms);
    ssize_t n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
    if (n > 0)
        fail_msg("%s: %zd unexpected bytes instead of a close", what, n);
    if (n < 0 && errno != ECONNRESET)
        fail_msg("%s: recv: %s", what, strerror(errno));
}

/* The connection is still open: nothing to read and no close pending. */
static void expect_open(int fd, const char *what)
{
    uint8_t b;
    ssize_t n = recv(fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n >= 0)
        fail_msg("%s: connection %s", what, n == 0 ? "closed" : "has unexpected bytes");
    assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
}

/* Read one RPC frame (header, then up to 1023 bytes of body kept as text). */
static void read_frame(int fd, frame_t *f, const char *what)
{
    uint8_t h[RPC_HDR];
    ssize_t n = recv_exact(fd, h, sizeof(h), IO_TIMEOUT_MS);
    if (n != RPC_HDR)
        fail_msg("%s: no reply frame (%s)", what, n == 0 ? "closed" : "timeout or error");
    f->magic = get32(h);
    f->version = (uint16_t)(h[4] | h[5] << 8);
    f->method = (uint16_t)(h[6] | h[7] << 8);
    f->req_id = get64(h + 8);
    f->body_len = get32(h + 16);
    f->status = (int32_t)get32(h + 20);
    assert_int_equal(f->magic, RPC_MAGIC);
    assert_int_equal(f->version, RPC_VERSION);
    assert_true(f->body_len <= 64 * 1024);
    size_t keep = f->body_len < sizeof(f->body) - 1 ? f->body_len : sizeof(f->body) - 1;
    assert_int_equal(recv_exact(fd, f->body, keep, IO_TIMEOUT_MS), (ssize_t)keep);
    f->body[keep] = '\0';
    for (uint32_t left = f->body_len - (uint32_t)keep; left > 0;) {
        char sink[512];
        size_t c = left < sizeof(sink) ? left : sizeof(sink);
        assert_int_equal(recv_exact(fd, sink, c, IO_TIMEOUT_MS), (ssize_t)c);
        left -= (uint32_t)c;
    }
}

/* An error frame for (method, req_id) with `status` and a text body. */
static void expect_error_frame(int fd, uint16_t method, uint64_t req_id, kvp_status_t status,
                               const char *what)
{
    frame_t f;
    read_frame(fd, &f, what);
    if (f.status != status)
        fail_msg("%s: status %d (%s), want %d; body '%s'", what, f.status,
                 kvp_strerror((kvp_status_t)f.status), status, f.body);
    assert_int_equal(f.method, (uint16_t)(method | RPC_RESP));
    assert_int_equal(f.req_id, req_id);
    assert_true(f.body_len > 0); /* a message for humans */
}

/* PING on fd answers with method 1|0x8000, status 0, our request id. */
static void expect_ping_ok(int fd, uint64_t req_id, const char *what)
{
    uint8_t h[RPC_HDR];
    rpc_hdr(h, RPC_MAGIC, RPC_VERSION, M_PING, req_id, 0);
    send_bytes(fd, h, sizeof(h));
    frame_t f;
    read_frame(fd, &f, what);
    if (f.status != 0)
        fail_msg("%s: ping failed: %d '%s'", what, f.status, f.body);
    assert_int_equal(f.method, M_PING | RPC_RESP);
    assert_int_equal(f.req_id, req_id);
    assert_int_equal(f.body_len, 0);
}

/* The normal client still works: put, get byte-exact, remove. */
static void round_trip(env_t *e)
{
    char key[64];
    e->round++;
    snprintf(key, sizeof(key), "badinput/rt/%d", e->round);
    size_t len = 1000 + (size_t)e->round * 37 % 70000;
    uint8_t *src = malloc(len), *dst = malloc(len);
    assert_non_null(src);
    assert_non_null(dst);
    kvp_fill_pattern(src, len, (uint64_t)e->round);
    memset(dst, 0, len);
    assert_int_equal(kvp_put(e->client, key, src, len, NULL), KVP_OK);
    assert_int_equal(kvp_get_into(e->client, key, dst, len), (int64_t)len);
    assert_memory_equal(dst, src, len);
    assert_int_equal(kvp_remove(e->client, key), KVP_OK);
    free(src);
    free(dst);
}

/* ---- the master ---- */

static void test_garbage(void **state)
{
    env_t *e = *state;
    /* sizes: one byte (rejected before a whole header), a header's worth, more */
    static const size_t sizes[] = {1, 3, 24, 100, 4096};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint8_t buf[4096];
        kvp_fill_pattern(buf, sizes[i], 0xBAD0 + i);
        buf[0] = (uint8_t)(buf[0] == 0x4B ? 0x00 : buf[0]); /* never our magic's first byte */
        int fd = connect_to(e->master.ready);
        send_bytes(fd, buf, sizes[i]);
        expect_closed(fd, IO_TIMEOUT_MS, "garbage");
        close(fd);
        round_trip(e);
    }
    /* the right first three bytes of the magic, then a wrong fourth */
    uint8_t almost[RPC_HDR];
    rpc_hdr(almost, RPC_MAGIC ^ 0x01000000u, RPC_VERSION, M_PING, 1, 0);
    int fd = connect_to(e->master.ready);
    send_bytes(fd, almost, sizeof(almost));
    expect_closed(fd, IO_TIMEOUT_MS, "bad magic");
    close(fd);
    round_trip(e);
}

static void test_bad_version(void **state)
{
    env_t *e = *state;
    static const uint16_t versions[] = {0, 1, 3, 0xFFFF};
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
        uint8_t h[RPC_HDR];
        rpc_hdr(h, RPC_MAGIC, versions[i], M_PING, 0x1122334455667788ull + i, 0);
        int fd = connect_to(e->master.ready);
        send_bytes(fd, h, sizeof(h));
        expect_error_frame(fd, M_PING, 0x1122334455667788ull + i, KVP_ERR_VERSION, "bad version");
        expect_closed(fd, IO_TIMEOUT_MS, "after bad version");
        close(fd);
        round_trip(e);
    }
}

/* A "Name:  N kB" line of /proc/PID/status, in KiB; -1 if absent. */
static long proc_status_kib(pid_t pid, const char *name)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    long kib = -1;
    size_t nlen = strlen(name);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, name, nlen) == 0 && sscanf(line + nlen, " %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

static void test_frame_too_large(void **state)
{
    env_t *e = *state;
    long rss0 = kvp_proc_rss_kib(e->master.pid);
    assert_true(rss0 > 0);
    /* the peak address-space size: grows if the body were ever allocated, touched or not */
    long peak0 = proc_status_kib(e->master.pid, "VmPeak:");
    assert_true(peak0 > 0);
    static const uint32_t lens[] = {1u << 30, (64u << 20) + 1, 0xFFFFFFFFu};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        uint8_t h[RPC_HDR];
        rpc_hdr(h, RPC_MAGIC, RPC_VERSION, M_PUT_START, 42 + i, lens[i]);
        int fd = connect_to(e->master.ready);
        send_bytes(fd, h, sizeof(h));
        expect_error_frame(fd, M_PUT_START, 42 + i, KVP_ERR_FRAME_TOO_LARGE, "huge body_len");
        expect_closed(fd, IO_TIMEOUT_MS, "after huge body_len");
        close(fd);
        round_trip(e);
    }
    long rss1 = kvp_proc_rss_kib(e->master.pid);
    if (rss1 - rss0 > RSS_GROWTH_KIB)
        fail_msg("master RSS grew from %ld to %ld KiB", rss0, rss1);
    long peak1 = proc_status_kib(e->master.pid, "VmPeak:");
    if (peak1 - peak0 > 256 * 1024)
        fail_msg("master VmPeak grew from %ld to %ld KiB: a huge body was allocated", peak0, peak1);
}

static void test_truncated(void **state)
{
    env_t *e = *state;
    /* half a header */
    uint8_t h[RPC_HDR];
    rpc_hdr(h, RPC_MAGIC, RPC_VERSION, M_PING, 7, 0);
    int fd = connect_to(e->master.ready);
    send_bytes(fd, h, 10);
    close(fd);
    round_trip(e);
    /* a whole header promising 100 bytes, then 50, then our close */
    uint8_t frame[RPC_HDR + 50];
    rpc_hdr(frame, RPC_MAGIC, RPC_VERSION, M_PUT_START, 8, 100);
    memset(frame + RPC_HDR, 0x11, 50);
    fd = connect_to(e->master.ready);
    send_bytes(fd, frame, sizeof(frame));
    close(fd);
    round_trip(e);
    /* the same, but only shut our write side: the master must close, never answer */
    fd = connect_to(e->master.ready);
    send_bytes(fd, frame, sizeof(frame));
    shutdown(fd, SHUT_WR);
    expect_closed(fd, IO_TIMEOUT_MS, "truncated frame then EOF");
    close(fd);
    round_trip(e);
    /* a frame trickled one byte at a time is still one frame */
    fd = connect_to(e->master.ready);
    rpc_hdr(h, RPC_MAGIC, RPC_VERSION, M_PING, 9, 0);
    for (size_t i = 0; i < sizeof(h); i++) {
        send_bytes(fd, h + i, 1);
        if (i + 1 < sizeof(h))
            expect_open(fd, "partial header");
    }
    frame_t f;
    read_frame(fd, &f, "trickled ping");
    assert_int_equal(f.status, 0);
    assert_int_equal(f.method, M_PING | RPC_RESP);
    assert_int_equal(f.req_id, 9);
    close(fd);
    round_trip(e);
}

static void test_unknown_method(void **state)
{
    env_t *e = *state;
    int fd = connect_to(e->master.ready);
    static const uint16_t methods[] = {0, KVP_RPC_METHOD_MAX + 1, 999, 0x7FFF};
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        uint8_t frame[RPC_HDR + 5];
        rpc_hdr(frame, RPC_MAGIC, RPC_VERSION, methods[i], 100 + i, 5);
        memcpy(frame + RPC_HDR, "hello", 5);
        send_bytes(fd, frame, sizeof(frame));
        expect_error_frame(fd, methods[i], 100 + i, KVP_ERR_UNKNOWN_METHOD, "unknown method");
        expect_open(fd, "after unknown method");
        expect_ping_ok(fd, 200 + i, "ping after unknown method");
    }
    /* a response frame sent to the master is a protocol error, not a crash */
    uint8_t h[RPC_HDR];
    rpc_hdr(h, RPC_MAGIC, RPC_VERSION, M_PING | RPC_RESP, 300, 0);
    send_bytes(fd, h, sizeof(h));
    expect_error_frame(fd, M_PING | RPC_RESP, 300, KVP_ERR_PROTOCOL, "response bit");
    expect_ping_ok(fd, 301, "ping after response bit");
    close(fd);
    round_trip(e);
}

static void test_garbage_body(void **state)
{
    env_t *e = *state;
    int fd = connect_to(e->master.ready);
    /* 0xFF...: a protobuf tag varint that never ends; no message decodes it */
    uint8_t frame[RPC_HDR + 16];
    memset(frame + RPC_HDR, 0xFF, 16);
    rpc_hdr(frame, RPC_MAGIC, RPC_VERSION, M_PUT_START, 500, 16);
    send_bytes(fd, frame, sizeof(frame));
    expect_error_frame(fd, M_PUT_START, 500, KVP_ERR_PROTOCOL, "PUT_START garbage body");
    expect_open(fd, "after garbage body");
    expect_ping_ok(fd, 501, "ping after garbage body");
    /* every method with a request body: same answer, same connection */
    for (uint16_t m = 2; m <= 20; m++) {
        if (m == 11 || m == 18)
            continue; /* STAT has no request body to decode; 18 is one-way (below) */
        rpc_hdr(frame, RPC_MAGIC, RPC_VERSION, m, 600 + m, 16);
        send_bytes(fd, frame, sizeof(frame));
        expect_error_frame(fd, m, 600 + m, KVP_ERR_PROTOCOL, "garbage body");
    }
    expect_ping_ok(fd, 700, "ping after garbage bodies");
    /* LEASE_RELEASE (18) is one-way: a garbage body gets no answer at all (the sender
     * waits for none), and neither do lease ids that were never granted; the
     * connection stays usable and the next reply is the ping's */
    rpc_hdr(frame, RPC_MAGIC, RPC_VERSION, 18, 750, 16);
    send_bytes(fd, frame, sizeof(frame));
    static const uint8_t bogus[] = {0x0a, 0x08, 1, 2, 3, 4, 5, 6, 7, 8}; /* lease_ids: 1 */
    rpc_hdr(frame, RPC_MAGIC, RPC_VERSION, 18, 751, sizeof(bogus));
    memcpy(frame + RPC_HDR, bogus, sizeof(bogus));
    send_bytes(fd, frame, RPC_HDR + sizeof(bogus));
    expect_ping_ok(fd, 752, "ping after one-way lease releases");
    /* pipelined: unknown method, garbage PUT_START, ping - in one write, answered in order */
    uint8_t pipe[3 * RPC_HDR + 16];
    rpc_hdr(pipe, RPC_MAGIC, RPC_VERSION, 4242, 801, 0);
    rpc_hdr(pipe + RPC_HDR, RPC_MAGIC, RPC_VERSION, M_PUT_START, 802, 16);
    memset(pipe + 2 * RPC_HDR, 0xFF, 16);
    rpc_hdr(pipe + 2 * RPC_HDR + 16, RPC_MAGIC, RPC_VERSION, M_PING, 803, 0);
    send_bytes(fd, pipe, sizeof(pipe));
    expect_error_frame(fd, 4242, 801, KVP_ERR_UNKNOWN_METHOD, "pipelined unknown");
    expect_error_frame(fd, M_PUT_START, 802, KVP_ERR_PROTOCOL, "pipelined garbage");
    frame_t f;
    read_frame(fd, &f, "pipelined ping");
    assert_int_equal(f.status, 0);
    assert_int_equal(f.method, M_PING | RPC_RESP);
    assert_int_equal(f.req_id, 803);
    close(fd);
    round_trip(e);
    /* nothing half-made was left behind */
    kvp_pool_stat_t *s = NULL;
    assert_int_equal(kvp_pool_stat(e->client, &s), KVP_OK);
    assert_int_equal(s->n_segments, 1);
    assert_int_equal(s->objects, 0);
    assert_int_equal(s->pending, 0);
    assert_int_equal(s->used, 0);
    kvp_pool_stat_free(s);
}

/* Wait (bounded) until pid's fd count is `want`; returns the last count seen. */
static int wait_fd_count(pid_t pid, int want, int timeout_ms)
{
    int n = -1;
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        n = kvp_proc_fd_count(pid);
        if (n == want)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return n;
}

/* One bad connection of kind i % 6, finished (closed by us or by the master). */
static void bad_connection(env_t *e, int i)
{
    uint8_t buf[RPC_HDR + 64];
    int fd = connect_to(e->master.ready);
    switch (i % 6) {
    case 0: /* garbage */
        kvp_fill_pattern(buf, sizeof(buf), (uint64_t)i);
        buf[0] = 0xEE;
        send_bytes(fd, buf, sizeof(buf));
        expect_closed(fd, IO_TIMEOUT_MS, "loop: garbage");
        break;
    case 1: /* bad version */
        rpc_hdr(buf, RPC_MAGIC, 9, M_PING, (uint64_t)i, 0);
        send_bytes(fd, buf, RPC_HDR);
        expect_error_frame(fd, M_PING, (uint64_t)i, KVP_ERR_VERSION, "loop: version");
        expect_closed(fd, IO_TIMEOUT_MS, "loop: version");
        break;
    case 2: /* 1 GiB body */
        rpc_hdr(buf, RPC_MAGIC, RPC_VERSION, M_STAT, (uint64_t)i, 1u << 30);
        send_bytes(fd, buf, RPC_HDR);
        expect_error_frame(fd, M_STAT, (uint64_t)i, KVP_ERR_FRAME_TOO_LARGE, "loop: huge");
        expect_closed(fd, IO_TIMEOUT_MS, "loop: huge");
        break;
    case 3: /* truncated, then our close */
        rpc_hdr(buf, RPC_MAGIC, RPC_VERSION, M_PUT_START, (uint64_t)i, 1000);
        memset(buf + RPC_HDR, 0x22, 64);
        send_bytes(fd, buf, sizeof(buf));
        break;
    case 4: /* unknown method, then a garbage body, then our close */
        rpc_hdr(buf, RPC_MAGIC, RPC_VERSION, 777, (uint64_t)i, 0);
        send_bytes(fd, buf, RPC_HDR);
        expect_error_frame(fd, 777, (uint64_t)i, KVP_ERR_UNKNOWN_METHOD, "loop: unknown");
        rpc_hdr(buf, RPC_MAGIC, RPC_VERSION, M_PUT_START, (uint64_t)i, 8);
        memset(buf + RPC_HDR, 0xFF, 8);
        send_bytes(fd, buf, RPC_HDR + 8);
        expect_error_frame(fd, M_PUT_START, (uint64_t)i, KVP_ERR_PROTOCOL, "loop: body");
        break;
    default: /* connect and close at once */
        break;
    }
    close(fd);
}

static void test_many_bad_connections(void **state)
{
    env_t *e = *state;
    /* warm up: the first connections may grow the master's tables once */
    for (int i = 0; i < 12; i++)
        bad_connection(e, i);
    round_trip(e);
    int fds0 = e->master_fds;
    long rss0 = kvp_proc_rss_kib(e->master.pid);
    assert_true(rss0 > 0);
    for (int i = 0; i < 200; i++) {
        bad_connection(e, i);
        if (i % 25 == 24)
            round_trip(e);
    }
    round_trip(e);
    int fds1 = wait_fd_count(e->master.pid, fds0, 5000);
    if (fds1 != fds0)
        fail_msg("master fds: %d before 200 bad connections, %d after", fds0, fds1);
    long rss1 = kvp_proc_rss_kib(e->master.pid);
    if (rss1 - rss0 > RSS_GROWTH_KIB)
        fail_msg("master RSS grew from %ld to %ld KiB over 200 bad connections", rss0, rss1);
}

/* Many half-finished frames held open at once do not stall anyone else. */
static void test_many_idle_partial(void **state)
{
    env_t *e = *state;
    int fds0 = e->master_fds;
    enum { N = 100 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        uint8_t h[RPC_HDR];
        rpc_hdr(h, RPC_MAGIC, RPC_VERSION, M_PUT_START, (uint64_t)i, 4096);
        fds[i] = connect_to(e->master.ready);
        send_bytes(fds[i], h, (size_t)(i % RPC_HDR) + 1);
    }
    round_trip(e);
    for (int i = 0; i < N; i++)
        expect_open(fds[i], "idle partial frame");
    for (int i = 0; i < N; i++)
        close(fds[i]);
    round_trip(e);
    int fds1 = wait_fd_count(e->master.pid, fds0, 5000);
    assert_int_equal(fds1, fds0);
}

/* ---- the segment server's tcp data endpoint ---- */

typedef struct seg_view {
    char endpoint[256];
    uint64_t id;
    uint64_t size;
} seg_view_t;

static void seg_of(env_t *e, seg_view_t *v)
{
    kvp_pool_stat_t *s = NULL;
    assert_int_equal(kvp_pool_stat(e->client, &s), KVP_OK);
    assert_int_equal(s->n_segments, 1);
    snprintf(v->endpoint, sizeof(v->endpoint), "%s", s->segments[0].endpoint);
    v->id = s->segments[0].id;
    v->size = s->segments[0].size;
    kvp_pool_stat_free(s);
    assert_int_equal(v->size, 64ull << 20);
}

static void expect_data_resp(int fd, int32_t status, uint64_t len, const char *what)
{
    uint8_t r[DATA_RESP];
    ssize_t n = recv_exact(fd, r, sizeof(r), IO_TIMEOUT_MS);
    if (n != DATA_RESP)
        fail_msg("%s: no response (%s)", what, n == 0 ? "closed" : "timeout or error");
    assert_int_equal(get32(r), DATA_MAGIC);
    if ((int32_t)get32(r + 4) != status)
        fail_msg("%s: status %d, want %d", what, (int32_t)get32(r + 4), status);
    assert_int_equal(get64(r + 8), len);
}

/* A valid READ of len bytes at 0 on fd: header then exactly len payload bytes. */
static void expect_read_ok(int fd, const seg_view_t *v, uint64_t len, const char *what)
{
    uint8_t req[DATA_REQ];
    data_req(req, OP_READ, v->id, 0, len);
    send_bytes(fd, req, sizeof(req));
    expect_data_resp(fd, 0, len, what);
    uint8_t *payload = malloc(len);
    assert_non_null(payload);
    assert_int_equal(recv_exact(fd, payload, len, IO_TIMEOUT_MS), (ssize_t)len);
    free(payload);
    expect_open(fd, what);
}

static void test_data_read_errors(void **state)
{
    env_t *e = *state;
    seg_view_t v;
    seg_of(e, &v);
    int fd = connect_to(v.endpoint);
    uint8_t req[DATA_REQ];
    /* past the end; at the end; straddling the end; offset + length wrapping */
    const uint64_t bad[][2] = {
        {v.size + 4096, 64},      {v.size, 1},     {v.size - 10, 11},
        {v.size - 1, UINT64_MAX}, {UINT64_MAX, 2}, {0, v.size + 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        data_req(req, OP_READ, v.id, bad[i][0], bad[i][1]);
        send_bytes(fd, req, sizeof(req));
        expect_data_resp(fd, KVP_ERR_OUT_OF_RANGE, 0, "READ out of range");
        expect_open(fd, "after READ out of range");
    }
    /* the very last byte is fine */
    data_req(req, OP_READ, v.id, v.size - 1, 1);
    send_bytes(fd, req, sizeof(req));
    expect_data_resp(fd, 0, 1, "READ last byte");
    uint8_t b;
    assert_int_equal(recv_exact(fd, &b, 1, IO_TIMEOUT_MS), 1);
    /* another segment id */
    static const uint64_t ids_delta[] = {1, 1000};
    for (size_t i = 0; i < 2; i++) {
        data_req(req, OP_READ, v.id + ids_delta[i], 0, 64);
        send_bytes(fd, req, sizeof(req));
        expect_data_resp(fd, KVP_ERR_SEGMENT_GONE, 0, "READ wrong segment");
        expect_open(fd, "after READ wrong segment");
    }
    data_req(req, OP_READ, UINT64_MAX, 0, 64);
    send_bytes(fd, req, sizeof(req));
    expect_data_resp(fd, KVP_ERR_SEGMENT_GONE, 0, "READ segment id ~0");
    /* and the connection still serves a good READ */
    expect_read_ok(fd, &v, 4096, "READ after errors");
    close(fd);
    round_trip(e);
}

static void test_data_garbage(void **state)
{
    env_t *e = *state;
    seg_view_t v;
    seg_of(e, &v);
    uint8_t req[DATA_REQ];
    kvp_fill_pattern(req, sizeof(req), 0xDA7A);
    put32(req, 0x12345678u);
    int fd = connect_to(v.endpoint);
    send_bytes(fd, req, sizeof(req));
    expect_closed(fd, IO_TIMEOUT_MS, "data server: garbage header");
    close(fd);
    round_trip(e);
}

static void test_data_bad_op(void **state)
{
    env_t *e = *state;
    seg_view_t v;
    seg_of(e, &v);
    uint8_t req[DATA_REQ];
    data_req(req, 99, v.id, 0, 64); /* our magic, an op that does not exist */
    int fd = connect_to(v.endpoint);
    send_bytes(fd, req, sizeof(req));
    expect_closed(fd, IO_TIMEOUT_MS, "data server: unknown op");
    close(fd);
    round_trip(e);
}

/* A vectored request: header (offset = n entries, length = total), then n entries. */
static void send_vec(int fd, uint16_t op, uint64_t n, uint64_t total, const uint64_t (*ent)[3],
                     size_t n_ent)
{
    uint8_t req[DATA_REQ];
    data_req(req, op, 0, n, total);
    send_bytes(fd, req, sizeof(req));
    for (size_t i = 0; i < n_ent; i++) {
        uint8_t b[24];
        put64(b, ent[i][0]);
        put64(b + 8, ent[i][1]);
        put64(b + 16, ent[i][2]);
        send_bytes(fd, b, sizeof(b));
    }
}

/* Malformed READV/WRITEV: every entry is checked before a byte moves. A READV with bad
 * entries gets an error and the connection goes on; an absurd count, or a bad WRITEV,
 * gets an error and a close. A good READV afterwards returns the entries' bytes. */
static void test_data_bad_vector(void **state)
{
    env_t *e = *state;
    seg_view_t v;
    seg_of(e, &v);
    int fd = connect_to(v.endpoint);
    const uint64_t out[][3] = {{v.id, 0, 64}, {v.id, v.size - 10, 11}};
    send_vec(fd, OP_READV, 2, 75, out, 2);
    expect_data_resp(fd, KVP_ERR_OUT_OF_RANGE, 0, "READV entry out of range");
    expect_open(fd, "after READV out of range");
    const uint64_t wrap[][3] = {{v.id, v.size - 1, UINT64_MAX}, {v.id, 0, 1}};
    send_vec(fd, OP_READV, 2, 0, wrap, 2);
    expect_data_resp(fd, KVP_ERR_OUT_OF_RANGE, 0, "READV entry wrapping");
    const uint64_t zero[][3] = {{v.id, 0, 0}};
    send_vec(fd, OP_READV, 1, 0, zero, 1);
    expect_data_resp(fd, KVP_ERR_OUT_OF_RANGE, 0, "READV zero-length entry");
    const uint64_t other[][3] = {{v.id, 0, 64}, {v.id + 1, 0, 64}};
    send_vec(fd, OP_READV, 2, 128, other, 2);
    expect_data_resp(fd, KVP_ERR_SEGMENT_GONE, 0, "READV wrong segment");
    const uint64_t good[][3] = {{v.id, 0, 64}, {v.id, 4096, 100}};
    send_vec(fd, OP_READV, 2, 165, good, 2); /* lengths do not add up to the header's */
    expect_data_resp(fd, KVP_ERR_PROTOCOL, 0, "READV total mismatch");
    expect_open(fd, "after READV total mismatch");
    send_vec(fd, OP_READV, 2, 164, good, 2);
    expect_data_resp(fd, 0, 164, "READV good");
    uint8_t b[164];
    assert_int_equal(recv_exact(fd, b, sizeof(b), IO_TIMEOUT_MS), (ssize_t)sizeof(b));
    expect_open(fd, "after READV good");
    /* absurd counts: error, close */
    const uint64_t counts[] = {0, VEC_MAX + 1, UINT64_MAX};
    for (size_t i = 0; i < 3; i++) {
        send_vec(fd, OP_READV, counts[i], 64, NULL, 0);
        expect_data_resp(fd, KVP_ERR_PROTOCOL, 0, "READV absurd count");
        expect_closed(fd, IO_TIMEOUT_MS, "after READV absurd count");
        close(fd);
        fd = connect_to(v.endpoint);
    }
    /* a WRITEV that cannot be placed: error, close, nothing written */
    send_vec(fd, OP_WRITEV, 2, 75, out, 2);
    expect_data_resp(fd, KVP_ERR_OUT_OF_RANGE, 0, "WRITEV entry out of range");
    expect_closed(fd, IO_TIMEOUT_MS, "after WRITEV out of range");
    close(fd);
    round_trip(e);
}

/* A WRITE that cannot be placed: error response, then the server closes (its payload
 * would follow and cannot be skipped safely). No segment byte changes. */
static void test_data_bad_write(void **state)
{
    env_t *e = *state;
    seg_view_t v;
    seg_of(e, &v);
    uint8_t req[DATA_REQ];
    data_req(req, OP_WRITE, v.id, v.size, 64);
    int fd = connect_to(v.endpoint);
    send_bytes(fd, req, sizeof(req));
    expect_data_resp(fd, KVP_ERR_OUT_OF_RANGE, 0, "WRITE out of range");
    expect_closed(fd, IO_TIMEOUT_MS, "after WRITE out of range");
    close(fd);
    data_req(req, OP_WRITE, v.id + 1, 0, 64);
    fd = connect_to(v.endpoint);
    send_bytes(fd, req, sizeof(req));
    expect_data_resp(fd, KVP_ERR_SEGMENT_GONE, 0, "WRITE wrong segment");
    expect_closed(fd, IO_TIMEOUT_MS, "after WRITE wrong segment");
    close(fd);
    round_trip(e);
}

/* A truncated header, a READ whose reader goes away: the server carries on. */
static void test_data_truncated(void **state)
{
    env_t *e = *state;
    seg_view_t v;
    seg_of(e, &v);
    uint8_t req[DATA_REQ];
    data_req(req, OP_READ, v.id, 0, 64);
    int fd = connect_to(v.endpoint);
    send_bytes(fd, req, 20);
    close(fd);
    /* ask for 32 MiB and hang up without reading it */
    data_req(req, OP_READ, v.id, 0, 32u << 20);
    fd = connect_to(v.endpoint);
    send_bytes(fd, req, sizeof(req));
    close(fd);
    round_trip(e);
    fd = connect_to(v.endpoint);
    expect_read_ok(fd, &v, 1u << 20, "READ after abandoned ones");
    close(fd);
    round_trip(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_bad_version),
        cmocka_unit_test(test_frame_too_large),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_unknown_method),
        cmocka_unit_test(test_garbage_body),
        cmocka_unit_test(test_many_bad_connections),
        cmocka_unit_test(test_many_idle_partial),
        cmocka_unit_test(test_data_read_errors),
        cmocka_unit_test(test_data_garbage),
        cmocka_unit_test(test_data_bad_op),
        cmocka_unit_test(test_data_bad_vector),
        cmocka_unit_test(test_data_bad_write),
        cmocka_unit_test(test_data_truncated),
    };
    return cmocka_run_group_tests_name("badinput", tests, setup, teardown);
}
