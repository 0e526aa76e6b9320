/*
 * test_tcp.c - unit tests for client/transport/tcp.c, the tcp transport
 * (kvp_transport_tcp_ops), against a real segment server
 * (client/segment/segment_server.c) serving a heap buffer on 127.0.0.1:0.
 *
 * The transport is created by the engine (kvp_transfer_init with a list of
 * tcp alone), peers are attached through it (kvp_transfer_route), and batches
 * go straight to the ops table's submit, so nothing of the engine stands
 * between an op and the transport. The served buffer has a shadow copy that
 * follows every successful WRITE; after each test the buffer must equal it,
 * so a stray byte written anywhere fails the test.
 *
 * Failure cases use a scripted fake server (a thread on a listening socket)
 * that stalls, closes mid-payload, or answers garbage; the transport's
 * timeout is short where the test waits on it, and no test sleeps. Malformed
 * frames sent by a raw socket check that the segment server drops the
 * offending connection (or refuses the request) and goes on serving.
 *
 * Thread: cmocka's; the concurrency test starts threads that only count
 * mismatches (cmocka's asserts stay on the main thread).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <linux/tcp.h> /* struct tcp_info with tcpi_bytes_acked (glibc's lacks it) */

/* client internals: kvp_transfer_t, kvp_peer_t, kvp_xfer_op_t, the data frames, the
 * segment server (internal.h); the ops table (transport.h) */
#include "client/segment/segment_server.h"
#include "client/transfer/engine.h"
#include "tests/unit/client/transport/tp_test.h"
#include "client/transport/wire.h"
#include "client/transfer/transport.h"
#include "client/transport/transports.h"

#include "common/clock.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/sock.h"

#define SEG_SIZE (16 * MIB)
#define SEG_ID 0x7c9ull
#define SEG2_ID 0x7caull

static const kvp_transport_ops_t *const tcp_only[] = {&kvp_transport_tcp_ops, NULL};

typedef struct fixture {
    uint8_t *seg; /* served by srv */
    uint8_t *ref; /* what seg must hold */
    kvp_data_server_t *srv;
    uint16_t port;
    kvp_transfer_t xfer;
    kvp_transport_t *tp;
    kvp_peer_t *peer;
} fixture_t;

static kvp_peer_t *peer_new(fixture_t *fx, uint64_t segment_id, uint16_t port)
{
    kvp_peer_t *p = kvp_peer_create(segment_id);
    assert_non_null(p);
    p->size = SEG_SIZE;
    snprintf(p->name, sizeof(p->name), "seg-%llx", (unsigned long long)segment_id);
    snprintf(p->endpoint, sizeof(p->endpoint), "127.0.0.1:%u", (unsigned)port);
    assert_int_equal(kvp_transfer_route(&fx->xfer, p), KVP_TRANSPORT_TCP);
    return p;
}

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    fx->seg = xmalloc(SEG_SIZE);
    fx->ref = xmalloc(SEG_SIZE);
    fill(fx->seg, SEG_SIZE, 1);
    memcpy(fx->ref, fx->seg, SEG_SIZE);
    assert_int_equal(
        kvp_segment_server_create(fx->seg, SEG_SIZE, "127.0.0.1", 0, true, &fx->srv, &fx->port),
        KVP_OK);
    kvp_data_server_set_id(fx->srv, SEG_ID);
    fx->xfer.list = tcp_only;
    fx->xfer.timeout_ms = 10000;
    fx->xfer.tcp_streams = 2;
    fx->xfer.tcp_slice = MIB;
    assert_int_equal(kvp_transfer_init(&fx->xfer), KVP_OK);
    assert_int_equal(fx->xfer.n_tps, 1);
    fx->tp = &fx->xfer.tps[0];
    assert_ptr_equal(fx->tp->ops, &kvp_transport_tcp_ops);
    fx->peer = peer_new(fx, SEG_ID, fx->port);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    kvp_peer_unref(fx->peer);
    kvp_transfer_cleanup(&fx->xfer);
    kvp_data_server_destroy(fx->srv);
    free(fx->seg);
    free(fx->ref);
    free(fx);
    return 0;
}

/* Every test ends with the served memory as the successful writes left it. */
static void assert_segment_as_written(const fixture_t *fx)
{
    assert_memory_equal(fx->seg, fx->ref, SEG_SIZE);
}

/* Write `len` bytes of pattern `seed` at `off` through the transport (shadowed in ref). */
static void write_ok(fixture_t *fx, uint64_t off, uint64_t len, uint64_t seed)
{
    uint8_t *src = xmalloc(len);
    fill(src, len, seed);
    kvp_xfer_op_t op = op_of(KVP_XFER_WRITE, fx->peer, src, off, len);
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_int_equal(op.crc, kvp_crc32c(0, src, len));
    memcpy(fx->ref + off, src, len);
    free(src);
}

/* Read [off, off+len) through the transport and compare it with what was written. */
static void read_check(const fixture_t *fx, uint64_t off, uint64_t len)
{
    uint8_t *dst = calloc(1, len);
    assert_non_null(dst);
    kvp_xfer_op_t op = op_of(KVP_XFER_READ, fx->peer, dst, off, len);
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_memory_equal(dst, fx->ref + off, len);
    assert_int_equal(op.crc, kvp_crc32c(0, fx->ref + off, len));
    free(dst);
}

static uint64_t served_ops(const fixture_t *fx, int dir)
{
    return atomic_load(&kvp_data_server_stats(fx->srv)->dir[dir].ops);
}

static uint64_t served_bytes(const fixture_t *fx, int dir)
{
    return atomic_load(&kvp_data_server_stats(fx->srv)->dir[dir].bytes);
}

/* Connected sockets of this process whose peer is 127.0.0.1:port (the client's side): how
 * many; with acked, what each has sent and had acked (TCP_INFO), by fd (0 for any other fd
 * below max). */
static int conns_walk(uint16_t port, uint64_t *acked, int max)
{
    if (acked != NULL)
        memset(acked, 0, (size_t)max * sizeof(*acked));
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct sockaddr_in sa;
        socklen_t sl = sizeof(sa);
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || getpeername(fd, (struct sockaddr *)&sa, &sl) != 0 ||
            sa.sin_family != AF_INET || ntohs(sa.sin_port) != port)
            continue;
        n++;
        if (acked == NULL || fd >= max)
            continue;
        struct tcp_info ti;
        socklen_t tl = sizeof(ti);
        assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl), 0);
        acked[fd] = ti.tcpi_bytes_acked;
    }
    closedir(d);
    return n;
}

static int conns_to(uint16_t port)
{
    return conns_walk(port, NULL, 0);
}

static void sent_to(uint16_t port, uint64_t *acked, int max)
{
    (void)conns_walk(port, acked, max);
}

/* ---- a raw client of the data protocol ---- */

static int raw_connect(uint16_t port)
{
    int fd = -1;
    assert_int_equal(kvp_tcp_connect("127.0.0.1", port, 5000, &fd), KVP_OK);
    kvp_sock_set_timeout(fd, 10000); /* a server that wrongly keeps it open fails, not hangs */
    return fd;
}

static int32_t raw_reply(int fd, uint64_t *len_p)
{
    kvp_data_resp_t r;
    assert_int_equal(kvp_recv_all(fd, &r, sizeof(r)), KVP_OK);
    assert_int_equal(r.magic, KVP_DATA_MAGIC);
    if (len_p != NULL)
        *len_p = r.length;
    return r.status;
}

/* The server closed the connection: a read sees end of stream (or a reset). */
static void assert_closed(int fd)
{
    char c;
    ssize_t n;
    do
        n = recv(fd, &c, 1, 0);
    while (n < 0 && errno == EINTR);
    assert_true(n == 0 || (n < 0 && errno == ECONNRESET));
}

/* The connection still serves: a READ on it returns the segment's bytes. */
static void assert_raw_serves(const fixture_t *fx, int fd)
{
    uint8_t buf[100];
    kvp_data_req_t req = {.magic = KVP_DATA_MAGIC,
                          .op = KVP_DATA_READ,
                          .segment_id = SEG_ID,
                          .offset = 4096,
                          .length = sizeof(buf)};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    uint64_t len;
    assert_int_equal(raw_reply(fd, &len), KVP_OK);
    assert_int_equal(len, sizeof(buf));
    assert_int_equal(kvp_recv_all(fd, buf, sizeof(buf)), KVP_OK);
    assert_memory_equal(buf, fx->ref + 4096, sizeof(buf));
}

/* A fake server's start: a listener on 127.0.0.1, its stop pipe, its thread. */
static void server_start(int *listen_fd, uint16_t *port, int stop[2], pthread_t *thread,
                         void *(*fn)(void *), void *arg)
{
    assert_int_equal(kvp_tcp_listen("127.0.0.1", 0, 4, listen_fd, port), KVP_OK);
    assert_int_equal(pipe(stop), 0);
    assert_int_equal(pthread_create(thread, NULL, fn, arg), 0);
}

/* A fake server's end: the stop byte, its listener shut (an accept still waiting returns),
 * its thread joined, its descriptors closed. */
static void server_stop(int listen_fd, int stop[2], pthread_t thread)
{
    assert_int_equal(write(stop[1], "x", 1), 1);
    shutdown(listen_fd, SHUT_RDWR);
    pthread_join(thread, NULL);
    close(listen_fd);
    close(stop[0]);
    close(stop[1]);
}

/* ---- a scripted fake server (one connection) ---- */

typedef enum fake_mode {
    FAKE_SILENT,       /* reads the request, never answers */
    FAKE_NO_READ,      /* accepts, never reads */
    FAKE_BAD_MAGIC,    /* answers with a wrong magic */
    FAKE_BAD_STATUS,   /* answers with a positive status */
    FAKE_WRONG_LENGTH, /* answers a READ with another length */
    FAKE_HALF_PAYLOAD, /* sends half a READ's payload, then closes */
    FAKE_SLOW,         /* answers a READ in full (pattern 98), 150 ms late */
    FAKE_DRIBBLE,      /* answers a READ in full (pattern 97), 24 KiB at a time, 0.2 ms apart */
    FAKE_HALF_STALL,   /* sends half a READ's payload, then nothing (stays open) */
} fake_mode_t;

typedef struct fake_server {
    fake_mode_t mode;
    int listen_fd;
    uint16_t port;
    int stop[2]; /* the test writes a byte once the client is done */
    pthread_t thread;
    _Atomic int conn;   /* the connection it took (-1: none yet) */
    kvp_data_req_t req; /* the request it read */
} fake_server_t;

static void *fake_main(void *arg)
{
    fake_server_t *fs = arg;
    int fd = accept4(fs->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return NULL; /* the test stopped us before a client came */
    atomic_store(&fs->conn, fd);
    if (fs->mode != FAKE_NO_READ && kvp_recv_all(fd, &fs->req, sizeof(fs->req)) == KVP_OK) {
        kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = fs->req.length};
        switch (fs->mode) {
        case FAKE_BAD_MAGIC:
            r.magic = 0xdeadbeefu;
            (void)kvp_send_all(fd, &r, sizeof(r));
            break;
        case FAKE_BAD_STATUS:
            r.status = 5;
            (void)kvp_send_all(fd, &r, sizeof(r));
            break;
        case FAKE_WRONG_LENGTH:
            r.length = fs->req.length + 1;
            (void)kvp_send_all(fd, &r, sizeof(r));
            break;
        case FAKE_HALF_PAYLOAD: {
            size_t half = (size_t)fs->req.length / 2;
            uint8_t *p = malloc(half);
            if (p != NULL) {
                fill(p, half, 99);
                if (kvp_send_all(fd, &r, sizeof(r)) == KVP_OK)
                    (void)kvp_send_all(fd, p, half);
                free(p);
            }
            shutdown(fd, SHUT_RDWR);
            break;
        }
        case FAKE_DRIBBLE:
        case FAKE_HALF_STALL:
            for (;;) { /* every request on the connection (DRIBBLE) */
                uint8_t *p = malloc(fs->req.length);
                if (p == NULL || kvp_send_all(fd, &r, sizeof(r)) != KVP_OK) {
                    free(p);
                    break;
                }
                fill(p, fs->req.length, 97);
                uint64_t end = fs->mode == FAKE_DRIBBLE ? fs->req.length : fs->req.length / 2;
                for (uint64_t off = 0; off < end; off += 24 * KIB) {
                    uint64_t n = end - off < 24 * KIB ? end - off : 24 * KIB;
                    if (kvp_send_all(fd, p + off, n) != KVP_OK)
                        break;
                    struct timespec ts = {0, 200 * 1000L};
                    nanosleep(&ts, NULL);
                }
                free(p);
                if (fs->mode != FAKE_DRIBBLE ||
                    kvp_recv_all(fd, &fs->req, sizeof(fs->req)) != KVP_OK)
                    break;
                r.length = fs->req.length;
            }
            break;
        case FAKE_SLOW: {
            uint8_t *p = malloc(fs->req.length);
            if (p != NULL) {
                fill(p, fs->req.length, 98);
                struct timespec ts = {0, 150 * 1000000L};
                nanosleep(&ts, NULL);
                if (kvp_send_all(fd, &r, sizeof(r)) == KVP_OK)
                    (void)kvp_send_all(fd, p, fs->req.length);
                free(p);
            }
            break;
        }
        default:
            break;
        }
    }
    char c;
    while (read(fs->stop[0], &c, 1) < 0 && errno == EINTR) {
    }
    close(fd);
    return NULL;
}

static void fake_start(fake_server_t *fs, fake_mode_t mode)
{
    *fs = (fake_server_t){.mode = mode, .conn = -1};
    server_start(&fs->listen_fd, &fs->port, fs->stop, &fs->thread, fake_main, fs);
}

static void fake_stop(fake_server_t *fs)
{
    /* a read of a request that never comes returns (the client sent its requests on
     * another of its streams); before the stop byte, so the fd is still the fake's */
    int conn = atomic_load(&fs->conn);
    if (conn >= 0)
        shutdown(conn, SHUT_RDWR);
    server_stop(fs->listen_fd, fs->stop, fs->thread);
}

/* ---- a fake owner of two connections that answers in pairs ---- */

/* It takes two connections, then reads one whole write request (WRITE or WRITEV: header,
 * vector, payload) from each before it answers either, and so on: a stream's second
 * request is answered only once the other stream has sent one, so a client that puts a
 * batch on one stream waits out its timeout. Counts the requests of each connection. */
typedef struct pair_server {
    int listen_fd;
    uint16_t port;
    int stop[2];
    pthread_t thread;
    unsigned reqs[2];
    bool bad; /* a request it did not expect */
} pair_server_t;

/* One write request from fd, its payload dropped; false at the stop or an end of stream. */
static bool pair_read_req(pair_server_t *ps, int fd, uint8_t *scratch, size_t cap)
{
    struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = ps->stop[0], .events = POLLIN}};
    while (poll(p, 2, -1) < 0 && errno == EINTR) {
    }
    if (p[1].revents != 0 || p[0].revents == 0)
        return false;
    kvp_data_req_t req;
    if (kvp_recv_all(fd, &req, sizeof(req)) != KVP_OK)
        return false;
    uint64_t skip = req.length;
    if (req.op == KVP_DATA_WRITEV)
        skip += req.offset * sizeof(kvp_data_vec_t);
    else if (req.op != KVP_DATA_WRITE)
        ps->bad = true;
    while (skip > 0) {
        size_t n = skip < cap ? (size_t)skip : cap;
        if (kvp_recv_all(fd, scratch, n) != KVP_OK)
            return false;
        skip -= n;
    }
    return true;
}

static void *pair_main(void *arg)
{
    pair_server_t *ps = arg;
    int fds[2] = {-1, -1};
    size_t cap = 1 << 20;
    uint8_t *scratch = malloc(cap);
    for (int i = 0; i < 2 && scratch != NULL; i++)
        if ((fds[i] = accept4(ps->listen_fd, NULL, NULL, SOCK_CLOEXEC)) < 0)
            break;
    while (scratch != NULL && fds[1] >= 0) {
        bool ok = true;
        for (int i = 0; i < 2 && ok; i++)
            ok = pair_read_req(ps, fds[i], scratch, cap) && ++ps->reqs[i] > 0;
        kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = 0};
        for (int i = 0; i < 2 && ok; i++)
            ok = kvp_send_all(fds[i], &r, sizeof(r)) == KVP_OK;
        if (!ok)
            break;
    }
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(scratch);
    return NULL;
}

static void pair_start(pair_server_t *ps)
{
    *ps = (pair_server_t){0};
    server_start(&ps->listen_fd, &ps->port, ps->stop, &ps->thread, pair_main, ps);
}

static void pair_stop(pair_server_t *ps)
{
    server_stop(ps->listen_fd, ps->stop, ps->thread);
}

/* ---- tests ---- */

/* Ops of every size class (one byte, a vector-sized piece, exactly a slice, several slices)
 * in one WRITE batch and one READ batch: the bytes land where they were aimed, come back
 * unchanged, and each CRC is that of its bytes. Then the whole segment in one READ. */
static void test_write_read_roundtrip(void **state)
{
    fixture_t *fx = *state;
    enum { N = 8 };
    const uint64_t len[N] = {1, 4095, 64 * KIB, 64 * KIB + 1, MIB, 3 * MIB + 17, 100, 1};
    const uint64_t off[N] = {0, 4097, 100000, 300000, MIB, 3 * MIB - 5, 7 * MIB + 3, SEG_SIZE - 1};
    uint8_t *src[N], *dst[N];
    kvp_xfer_op_t ops[N];
    for (int i = 0; i < N; i++) {
        src[i] = xmalloc(len[i]);
        dst[i] = calloc(1, len[i]);
        assert_non_null(dst[i]);
        fill(src[i], len[i], 10 + (uint64_t)i);
        ops[i] = op_of(KVP_XFER_WRITE, fx->peer, src[i], off[i], len[i]);
    }
    uint64_t w0 = served_bytes(fx, 0);
    tp_submit(fx->tp, ops, N);
    uint64_t total = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(ops[i].status, KVP_OK);
        assert_int_equal(ops[i].crc, kvp_crc32c(0, src[i], len[i]));
        memcpy(fx->ref + off[i], src[i], len[i]);
        total += len[i];
    }
    assert_segment_as_written(fx);
    assert_int_equal(served_bytes(fx, 0) - w0, total);

    /* read back in the opposite order */
    for (int i = 0; i < N; i++)
        ops[i] = op_of(KVP_XFER_READ, fx->peer, dst[N - 1 - i], off[N - 1 - i], len[N - 1 - i]);
    tp_submit(fx->tp, ops, N);
    for (int i = 0; i < N; i++) {
        int k = N - 1 - i;
        assert_int_equal(ops[i].status, KVP_OK);
        assert_memory_equal(dst[k], src[k], len[k]);
        assert_int_equal(ops[i].crc, kvp_crc32c(0, src[k], len[k]));
    }
    read_check(fx, 0, SEG_SIZE);
    for (int i = 0; i < N; i++) {
        free(src[i]);
        free(dst[i]);
    }
    assert_segment_as_written(fx);
}

/* Hundreds of small ops to one endpoint travel as vectored chains (more than
 * KVP_DATA_VEC_MAX in one batch, so several chains per stream): every piece lands at its
 * own offset; CRCs only where asked, the others' crc untouched. */
static void test_small_ops_vectored(void **state)
{
    fixture_t *fx = *state;
    enum { N = 600 };
    uint64_t len[N], off[N], total = 0;
    uint8_t *src = xmalloc(N * 4096), *dst = xmalloc(N * 4096);
    static kvp_xfer_op_t ops[N];
    const uint32_t streams[3] = {1, 2, 5};
    for (int round = 0; round < 3; round++) {
        fx->xfer.tcp_streams = streams[round];
        fill(src, N * 4096, 50 + (uint64_t)round);
        total = 0;
        for (int i = 0; i < N; i++) {
            len[i] = 1 + ((uint64_t)i * 37 + (uint64_t)round * 11) % 3000;
            off[i] = 2 * MIB + (uint64_t)i * 4096 + (uint64_t)(i % 7);
            ops[i] = op_of(KVP_XFER_WRITE, fx->peer, src + i * 4096, off[i], len[i]);
            ops[i].want_crc = i % 2 == 0;
            total += len[i];
        }
        uint64_t w_ops = served_ops(fx, 0), w_bytes = served_bytes(fx, 0);
        tp_submit(fx->tp, ops, N);
        for (int i = 0; i < N; i++) {
            assert_int_equal(ops[i].status, KVP_OK);
            assert_int_equal(ops[i].crc,
                             i % 2 == 0 ? kvp_crc32c(0, src + i * 4096, len[i]) : SENTINEL_CRC);
            memcpy(fx->ref + off[i], src + i * 4096, len[i]);
        }
        assert_int_equal(served_ops(fx, 0) - w_ops, N); /* one extent per op */
        assert_int_equal(served_bytes(fx, 0) - w_bytes, total);
        assert_segment_as_written(fx);

        memset(dst, 0, N * 4096);
        for (int i = 0; i < N; i++) {
            int k = (i * 7) % N; /* another order */
            ops[i] = op_of(KVP_XFER_READ, fx->peer, dst + k * 4096, off[k], len[k]);
            ops[i].want_crc = i % 2 == 1;
        }
        tp_submit(fx->tp, ops, N);
        for (int i = 0; i < N; i++) {
            int k = (i * 7) % N;
            assert_int_equal(ops[i].status, KVP_OK);
            assert_memory_equal(dst + k * 4096, src + k * 4096, len[k]);
            assert_int_equal(ops[i].crc,
                             i % 2 == 1 ? kvp_crc32c(0, src + k * 4096, len[k]) : SENTINEL_CRC);
        }
    }
    free(src);
    free(dst);
    assert_segment_as_written(fx);
}

/* A big op cut in slices of tcp_slice bytes (small ones chained, big ones alone) over
 * tcp_streams connections: bytes and CRC (put together from the slices') right, one
 * served extent per slice, min(streams, slices) connections opened, pooled and reused. */
static void test_slices_and_streams(void **state)
{
    fixture_t *fx = *state;
    const uint64_t len = 9 * MIB + 13, off = 777777;
    const struct {
        uint64_t slice;
        uint32_t streams;
    } cfg[] = {{4096, 1}, {100000, 2}, {4096, 3}, {256 * KIB, 4}, {64 * KIB, 8}, {MIB, 8}};
    uint8_t *src = xmalloc(len), *dst = xmalloc(len);
    int expect_conns = 0;
    assert_int_equal(conns_to(fx->port), 0);
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        fx->xfer.tcp_slice = cfg[c].slice;
        fx->xfer.tcp_streams = cfg[c].streams;
        uint64_t n_slices = (len + cfg[c].slice - 1) / cfg[c].slice;
        int want = (int)(n_slices < cfg[c].streams ? n_slices : cfg[c].streams);
        if (want > expect_conns)
            expect_conns = want; /* idle connections stay pooled */
        fill(src, len, 200 + c);
        kvp_xfer_op_t op = op_of(KVP_XFER_WRITE, fx->peer, src, off, len);
        uint64_t w_ops = served_ops(fx, 0);
        tp_submit(fx->tp, &op, 1);
        assert_int_equal(op.status, KVP_OK);
        assert_int_equal(op.crc, kvp_crc32c(0, src, len));
        assert_int_equal(served_ops(fx, 0) - w_ops, n_slices);
        assert_int_equal(conns_to(fx->port), expect_conns);
        memcpy(fx->ref + off, src, len);
        assert_segment_as_written(fx);

        memset(dst, 0, len);
        op = op_of(KVP_XFER_READ, fx->peer, dst, off, len);
        uint64_t r_ops = served_ops(fx, 1);
        tp_submit(fx->tp, &op, 1);
        assert_int_equal(op.status, KVP_OK);
        assert_memory_equal(dst, src, len);
        assert_int_equal(op.crc, kvp_crc32c(0, src, len));
        assert_int_equal(served_ops(fx, 1) - r_ops, n_slices);
        assert_int_equal(conns_to(fx->port), expect_conns); /* reused, none opened */
    }
    /* several big ops in one batch, interleaved over the streams */
    fx->xfer.tcp_slice = 300 * KIB;
    fx->xfer.tcp_streams = 3;
    kvp_xfer_op_t ops[3];
    for (int i = 0; i < 3; i++)
        ops[i] = op_of(KVP_XFER_READ, fx->peer, dst + (uint64_t)i * 3 * MIB,
                       (uint64_t)i * 4 * MIB + 1, 3 * MIB);
    memset(dst, 0, len);
    tp_submit(fx->tp, ops, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ops[i].status, KVP_OK);
        assert_memory_equal(dst + (uint64_t)i * 3 * MIB, fx->ref + (uint64_t)i * 4 * MIB + 1,
                            3 * MIB);
        assert_int_equal(ops[i].crc, kvp_crc32c(0, fx->ref + (uint64_t)i * 4 * MIB + 1, 3 * MIB));
    }
    free(src);
    free(dst);
    assert_segment_as_written(fx);
}

/* One batch to two servers: each op reaches its own segment (a group per endpoint). */
static void test_two_endpoints(void **state)
{
    fixture_t *fx = *state;
    uint8_t *seg2 = xmalloc(SEG_SIZE);
    memset(seg2, 0, SEG_SIZE);
    kvp_data_server_t *srv2;
    uint16_t port2;
    assert_int_equal(kvp_segment_server_create(seg2, SEG_SIZE, "127.0.0.1", 0, true, &srv2, &port2),
                     KVP_OK);
    kvp_data_server_set_id(srv2, SEG2_ID);
    kvp_peer_t *p2 = peer_new(fx, SEG2_ID, port2);
    enum { N = 6 };
    const uint64_t len[N] = {10, 200 * KIB, 3000, 2 * MIB + 1, 1, 70000};
    uint8_t *src[N], *dst[N];
    kvp_xfer_op_t ops[N];
    for (int i = 0; i < N; i++) {
        src[i] = xmalloc(len[i]);
        dst[i] = calloc(1, len[i]);
        fill(src[i], len[i], 300 + (uint64_t)i);
        ops[i] =
            op_of(KVP_XFER_WRITE, i % 2 ? p2 : fx->peer, src[i], (uint64_t)i * 3 * MIB / 2, len[i]);
    }
    tp_submit(fx->tp, ops, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(ops[i].status, KVP_OK);
        uint64_t o = (uint64_t)i * 3 * MIB / 2;
        if (i % 2) {
            assert_memory_equal(seg2 + o, src[i], len[i]);
        } else {
            memcpy(fx->ref + o, src[i], len[i]);
        }
        ops[i] = op_of(KVP_XFER_READ, i % 2 ? p2 : fx->peer, dst[i], o, len[i]);
    }
    assert_segment_as_written(fx);
    tp_submit(fx->tp, ops, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(ops[i].status, KVP_OK);
        assert_memory_equal(dst[i], src[i], len[i]);
        assert_int_equal(ops[i].crc, kvp_crc32c(0, src[i], len[i]));
        free(src[i]);
        free(dst[i]);
    }
    kvp_peer_unref(p2);
    kvp_data_server_destroy(srv2);
    free(seg2);
}

/* Extents outside the segment, wrapping ones included: KVP_ERR_OUT_OF_RANGE
 * (docs/protocol.md), the local buffer of a READ untouched, nothing written; the
 * transport goes on (a refused WRITE's closed connection is not pooled). */
static void test_out_of_range(void **state)
{
    fixture_t *fx = *state;
    const struct {
        uint64_t off, len;
    } bad[] = {
        {SEG_SIZE, 1},              /* starts at the end */
        {SEG_SIZE - 10, 11},        /* runs one byte past it */
        {SEG_SIZE + 4096, 100},     /* beyond */
        {UINT64_MAX - 3, 8},        /* offset + length wraps past 2^64 */
        {UINT64_MAX, 1},            /* the last offset there is */
        {SEG_SIZE - 4096, 64 * KIB} /* a vector-sized one past the end */
    };
    uint8_t buf[64 * KIB];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(buf, 0xee, sizeof(buf));
        kvp_xfer_op_t op = op_of(KVP_XFER_READ, fx->peer, buf, bad[i].off, bad[i].len);
        tp_submit(fx->tp, &op, 1);
        assert_int_equal(op.status, KVP_ERR_OUT_OF_RANGE);
        for (size_t k = 0; k < bad[i].len; k++)
            assert_int_equal(buf[k], 0xee);

        fill(buf, sizeof(buf), 400 + i);
        op = op_of(KVP_XFER_WRITE, fx->peer, buf, bad[i].off, bad[i].len);
        tp_submit(fx->tp, &op, 1);
        assert_int_equal(op.status, KVP_ERR_OUT_OF_RANGE);
        assert_segment_as_written(fx);
        /* the next op is carried */
        write_ok(fx, SEG_SIZE - 100, 100, 500 + i);
        read_check(fx, SEG_SIZE - 100, 100);
    }
    /* a bad READ in a batch of big ones (each its own request) fails alone */
    uint8_t *a = xmalloc(200 * KIB), *b = xmalloc(200 * KIB), *c = xmalloc(200 * KIB);
    memset(b, 0xee, 200 * KIB);
    kvp_xfer_op_t ops[3] = {op_of(KVP_XFER_READ, fx->peer, a, 0, 200 * KIB),
                            op_of(KVP_XFER_READ, fx->peer, b, SEG_SIZE - 100 * KIB, 200 * KIB),
                            op_of(KVP_XFER_READ, fx->peer, c, 5 * MIB, 200 * KIB)};
    fx->xfer.tcp_streams = 1; /* the same connection carries all three */
    tp_submit(fx->tp, ops, 3);
    assert_int_equal(ops[0].status, KVP_OK);
    assert_int_equal(ops[1].status, KVP_ERR_OUT_OF_RANGE);
    assert_int_equal(ops[2].status, KVP_OK);
    assert_memory_equal(a, fx->ref, 200 * KIB);
    assert_memory_equal(c, fx->ref + 5 * MIB, 200 * KIB);
    assert_int_equal(ops[2].crc, kvp_crc32c(0, fx->ref + 5 * MIB, 200 * KIB));
    for (size_t k = 0; k < 200 * KIB; k++)
        assert_int_equal(b[k], 0xee);
    /* small WRITEs (a chain) with one bad piece: the bad one fails; each of the others
     * either landed whole and says so, or failed having written nothing (a chain's status
     * is every piece's, and the server checks every entry before a byte moves) */
    fill(a, 200 * KIB, 600);
    ops[0] = op_of(KVP_XFER_WRITE, fx->peer, a, 4096, 1000);
    ops[1] = op_of(KVP_XFER_WRITE, fx->peer, a + 1000, SEG_SIZE - 10, 1000);
    ops[2] = op_of(KVP_XFER_WRITE, fx->peer, a + 2000, 8192, 1000);
    tp_submit(fx->tp, ops, 3);
    assert_int_equal(ops[1].status, KVP_ERR_OUT_OF_RANGE);
    if (ops[0].status == KVP_OK)
        memcpy(fx->ref + 4096, a, 1000);
    if (ops[2].status == KVP_OK)
        memcpy(fx->ref + 8192, a + 2000, 1000);
    assert_segment_as_written(fx);
    read_check(fx, 0, 64 * KIB);
    free(a);
    free(b);
    free(c);
}

/* Ops to a segment id the server does not serve (a stale descriptor, or the owner
 * remounted under a new id) fail with KVP_ERR_SEGMENT_GONE and write nothing; the right
 * id, over the same connections, works. */
static void test_wrong_segment(void **state)
{
    fixture_t *fx = *state;
    kvp_peer_t *stale = peer_new(fx, SEG_ID + 1, fx->port); /* same endpoint, same pool */
    uint8_t buf[5000], big[100 * KIB];
    memset(buf, 0xee, sizeof(buf));
    fill(big, sizeof(big), 700);
    kvp_xfer_op_t ops[2] = {op_of(KVP_XFER_READ, stale, buf, 0, sizeof(buf)),
                            op_of(KVP_XFER_WRITE, stale, big, 4096, sizeof(big))};
    tp_submit(fx->tp, &ops[0], 1);
    assert_int_equal(ops[0].status, KVP_ERR_SEGMENT_GONE);
    for (size_t k = 0; k < sizeof(buf); k++)
        assert_int_equal(buf[k], 0xee);
    tp_submit(fx->tp, &ops[1], 1);
    assert_int_equal(ops[1].status, KVP_ERR_SEGMENT_GONE);
    assert_segment_as_written(fx);
    write_ok(fx, 4096, 5000, 701);
    read_check(fx, 0, 64 * KIB);

    /* the owner remounted: the old id is gone for every op, the new one serves */
    kvp_data_server_set_id(fx->srv, SEG_ID + 1);
    kvp_xfer_op_t op = op_of(KVP_XFER_WRITE, fx->peer, big, 0, sizeof(big));
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_ERR_SEGMENT_GONE);
    assert_segment_as_written(fx);
    op = op_of(KVP_XFER_WRITE, stale, big, 0, sizeof(big));
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    memcpy(fx->ref, big, sizeof(big));
    assert_segment_as_written(fx);
    kvp_data_server_set_id(fx->srv, SEG_ID);
    kvp_peer_unref(stale);
}

/* The server goes away between batches: its pooled connections are dead and nothing
 * listens any more. Each batch fails (not a hang, not a false success) well inside the
 * transport's timeout, and the dead connections are dropped. */
static void test_server_gone(void **state)
{
    fixture_t *fx = *state;
    fx->xfer.tcp_streams = 3;
    fx->xfer.tcp_slice = 64 * KIB; /* 32 slices, a request each, over the 3 connections */
    write_ok(fx, 0, 2 * MIB, 800);
    read_check(fx, 0, 2 * MIB);
    assert_int_equal(conns_to(fx->port), 3);
    kvp_data_server_destroy(fx->srv);
    fx->srv = NULL;
    fx->xfer.timeout_ms = 5000;
    uint8_t *dst = xmalloc(2 * MIB);
    for (int round = 0; round < 2; round++) {
        /* round 0: over the dead pooled connections; round 1: new connections refused */
        kvp_xfer_op_t op = op_of(KVP_XFER_READ, fx->peer, dst, 0, 2 * MIB);
        uint64_t t0 = kvp_now_ms();
        tp_submit(fx->tp, &op, 1);
        assert_int_not_equal(op.status, KVP_OK);
        assert_int_not_equal(op.status, KVP_ERR_INTERNAL); /* it was set */
        assert_true(kvp_now_ms() - t0 < fx->xfer.timeout_ms);
        assert_int_equal(conns_to(fx->port), 0); /* dead ones are not kept */
    }
    free(dst);
    /* for teardown */
    uint16_t port;
    assert_int_equal(
        kvp_segment_server_create(fx->seg, SEG_SIZE, "127.0.0.1", 0, true, &fx->srv, &port),
        KVP_OK);
}

/* A peer that takes the request and never answers, or never reads: KVP_ERR_TIMEOUT after
 * about timeout_ms without progress, not a hang. */
static void test_stalled_peer_times_out(void **state)
{
    fixture_t *fx = *state;
    fx->xfer.timeout_ms = 300;
    fx->xfer.tcp_streams = 1;
    const struct {
        fake_mode_t mode;
        kvp_xfer_kind_t kind;
        uint64_t len;
    } cases[] = {
        {FAKE_SILENT, KVP_XFER_READ, 1000},
        {FAKE_SILENT, KVP_XFER_WRITE, 1000},
        {FAKE_NO_READ, KVP_XFER_WRITE, 32 * MIB}, /* more than the socket buffers take */
    };
    uint8_t *buf = xmalloc(32 * MIB);
    fill(buf, 32 * MIB, 900);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fake_server_t fs;
        fake_start(&fs, cases[i].mode);
        kvp_peer_t *p = peer_new(fx, SEG_ID, fs.port);
        p->size = 64 * MIB;
        fx->xfer.tcp_slice = cases[i].len; /* one request */
        kvp_xfer_op_t op = op_of(cases[i].kind, p, buf, 0, cases[i].len);
        uint64_t t0 = kvp_now_ms();
        tp_submit(fx->tp, &op, 1);
        uint64_t took = kvp_now_ms() - t0;
        assert_int_equal(op.status, KVP_ERR_TIMEOUT);
        assert_true(took >= 250);
        assert_true(took < 5000);
        fake_stop(&fs);
        if (cases[i].mode == FAKE_SILENT) {
            assert_int_equal(fs.req.magic, KVP_DATA_MAGIC);
            assert_int_equal(fs.req.op, cases[i].kind);
        }
        kvp_peer_unref(p);
    }
    free(buf);
}

/* Each stream's first read answered gives its peer's read latency (what a get orders
 * replicas by, object.c): a write alone gives none; a read of a near server a small one; a
 * server that answers 150 ms late at least 150 ms, the right bytes all the same; the
 * estimate moves by a quarter of a new sample. */
static void test_read_latency(void **state)
{
    fixture_t *fx = *state;
    assert_int_equal(atomic_load(&fx->peer->read_lat_us), 0);
    write_ok(fx, 8192, 4096, 31);
    assert_int_equal(atomic_load(&fx->peer->read_lat_us), 0);
    read_check(fx, 8192, 4096);
    uint32_t near = atomic_load(&fx->peer->read_lat_us);
    assert_true(near > 0);
    assert_true(near < 100000);
    assert_true(kvp_now_ms() - atomic_load(&fx->peer->read_lat_ms) < 5000);

    fake_server_t fs;
    fake_start(&fs, FAKE_SLOW);
    kvp_peer_t *p = peer_new(fx, SEG_ID, fs.port);
    uint8_t *buf = calloc(1, 4000), *want = xmalloc(4000);
    assert_non_null(buf);
    fill(want, 4000, 98);
    kvp_xfer_op_t op = op_of(KVP_XFER_READ, p, buf, 0, 4000);
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_memory_equal(buf, want, 4000);
    uint32_t far = atomic_load(&p->read_lat_us);
    assert_true(far >= 140000);
    assert_true(far < 5000000);
    fake_stop(&fs);
    kvp_peer_unref(p);

    /* a moving average: a quarter of a new sample, a sample after a pause starts anew */
    kvp_peer_t *q = kvp_peer_create(SEG2_ID);
    assert_non_null(q);
    kvp_peer_read_latency(q, 1000, 50000);
    assert_int_equal(atomic_load(&q->read_lat_us), 1000);
    kvp_peer_read_latency(q, 5000, 50001);
    assert_int_equal(atomic_load(&q->read_lat_us), 2000);
    kvp_peer_read_latency(q, 300, 50001 + KVP_PEER_LAT_STALE_MS + 1);
    assert_int_equal(atomic_load(&q->read_lat_us), 300);
    kvp_peer_unref(q);
    free(buf);
    free(want);
    assert_segment_as_written(fx);
}

/* Threads of this process (/proc/self/task). */
static int threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

typedef struct big_arg {
    fixture_t *fx;
    uint64_t off;
    unsigned id;
    int bad;
} big_arg_t;

/* 5 MiB written and read back at a->off, three rounds: each a transfer big enough to run
 * its streams on threads. */
static void *big_thread(void *v)
{
    big_arg_t *a = v;
    enum { LEN = 5 * 1024 * 1024 };
    uint8_t *src = malloc(LEN), *dst = malloc(LEN);
    for (int round = 0; round < 3 && src != NULL && dst != NULL; round++) {
        fill(src, LEN, 7000 + a->id * 10 + (uint64_t)round);
        kvp_xfer_op_t w = op_of(KVP_XFER_WRITE, a->fx->peer, src, a->off, LEN);
        kvp_xfer_op_t *op = &w;
        a->fx->tp->ops->submit(a->fx->tp->ctx, &op, 1);
        memset(dst, 0, LEN);
        kvp_xfer_op_t r = op_of(KVP_XFER_READ, a->fx->peer, dst, a->off, LEN);
        op = &r;
        a->fx->tp->ops->submit(a->fx->tp->ctx, &op, 1);
        if (w.status != KVP_OK || r.status != KVP_OK || w.crc != kvp_crc32c(0, src, LEN) ||
            r.crc != w.crc || memcmp(src, dst, LEN) != 0)
            a->bad++;
    }
    if (src != NULL)
        memcpy(a->fx->ref + a->off, src, LEN); /* the last round is what the segment holds */
    free(src);
    free(dst);
    return NULL;
}

/* A batch of a few requests is spread over the streams, not taken whole by the first to
 * pull (from 1 MiB to a peer, SPREAD_MIN, each stream holds at most its share of the
 * batch's requests in flight): 64 KiB runs chained into 512 KiB requests, four of them over
 * two streams, and 256 KiB runs chained two to a request, to an owner that answers its two
 * connections in pairs (pair_server_t: before, the first stream took all four and the
 * batch waited out its timeout); each stream carries two. Under 1 MiB a batch goes on the
 * first stream, every round: 16 KiB runs chained into four 128 KiB requests to the real
 * owner, measured by what each connection had acked. */
static void test_small_batch_spread(void **state)
{
    fixture_t *fx = *state;
    fx->xfer.tcp_streams = 2;
    fx->xfer.tcp_slice = MIB;
    fx->xfer.timeout_ms = 3000;
    uint8_t *src = xmalloc(2 * MIB);
    kvp_xfer_op_t ops[32];
    const struct {
        uint64_t run, chain;
        unsigned n;
    } spread[] = {
        {64 * KIB, 512 * KIB, 32}, /* 2 MiB: four chains */
        {256 * KIB, 0, 8},         /* 2 MiB: four chains of two */
    };
    for (size_t c = 0; c < sizeof(spread) / sizeof(spread[0]); c++) {
        fx->xfer.tcp_chain = spread[c].chain;
        pair_server_t ps;
        pair_start(&ps);
        kvp_peer_t *p = peer_new(fx, SEG_ID, ps.port);
        p->size = 64 * MIB;
        for (unsigned i = 0; i < spread[c].n; i++)
            ops[i] =
                op_of(KVP_XFER_WRITE, p, src + i * spread[c].run, i * spread[c].run, spread[c].run);
        tp_submit(fx->tp, ops, spread[c].n);
        for (unsigned i = 0; i < spread[c].n; i++)
            assert_int_equal(ops[i].status, KVP_OK);
        pair_stop(&ps);
        kvp_peer_unref(p);
        assert_false(ps.bad);
        assert_int_equal(ps.reqs[0], 2);
        assert_int_equal(ps.reqs[1], 2);
    }

    enum { FDS = 4096 };
    static uint64_t before[FDS], after[FDS];
    const uint64_t run = 16 * KIB, total = 32 * run; /* 512 KiB */
    fx->xfer.tcp_chain = 128 * KIB;
    for (int round = 0; round < 5; round++) {
        fill(src, total, 300 + (uint64_t)round);
        for (unsigned i = 0; i < 32; i++) /* run i to place 31-i */
            ops[i] = op_of(KVP_XFER_WRITE, fx->peer, src + i * run, (31 - i) * run, run);
        sent_to(fx->port, before, FDS);
        tp_submit(fx->tp, ops, 32);
        for (unsigned i = 0; i < 32; i++) {
            assert_int_equal(ops[i].status, KVP_OK);
            memcpy(fx->ref + (31 - i) * run, src + i * run, run);
        }
        assert_segment_as_written(fx);
        sent_to(fx->port, after, FDS);
        unsigned whole = 0, other = 0;
        for (int fd = 0; fd < FDS; fd++) {
            uint64_t sent = after[fd] - before[fd];
            if (sent >= total && sent < total + 64 * KIB)
                whole++;
            else if (sent >= run) /* a stream's hello is a few bytes */
                other++;
        }
        assert_int_equal(whole, 1);
        assert_int_equal(other, 0);
    }
    fx->xfer.tcp_chain = 0;
    free(src);
}

/* Transfers of 1 MiB or more over several streams run them on threads of the ctx's pool
 * (tcp.c, run_transfer): the bytes and CRCs come out right, for one caller and for three
 * at once (they share the pool; a caller that finds no idle worker runs its streams
 * itself); the pool is started once and kept (no thread per transfer), and a transport's
 * cleanup stops its workers (no thread left behind). A big read whose owner sends half
 * its payload and closes fails, within the timeout, on both streams' threads. */
static void test_threaded_transfers(void **state)
{
    fixture_t *fx = *state;
    fx->xfer.tcp_streams = 4;
    fx->xfer.tcp_slice = 256 * KIB;
    /* four streams opened by a transfer too small for threads (the owner serves each
     * connection on a thread of its own, in this process too) */
    write_ok(fx, 0, MIB - 4096, 60);
    read_check(fx, 0, MIB - 4096);
    assert_int_equal(conns_to(fx->port), 4);
    int t0 = threads_now();
    write_ok(fx, 12345, 9 * MIB, 61);
    read_check(fx, 12345, 9 * MIB);
    int t1 = threads_now();
    assert_true(t1 > t0);      /* workers started for it */
    assert_true(t1 <= t0 + 3); /* at most one per stream but the caller's */
    for (int i = 0; i < 4; i++) {
        write_ok(fx, 1000 + (uint64_t)i, 6 * MIB, 62 + (uint64_t)i);
        read_check(fx, 0, SEG_SIZE);
    }
    assert_int_equal(threads_now(), t1); /* the same workers, kept */

    fx->xfer.tcp_streams = 2;
    pthread_t th[3];
    big_arg_t args[3];
    for (unsigned i = 0; i < 3; i++) {
        args[i] = (big_arg_t){.fx = fx, .off = (uint64_t)i * 5 * MIB + 7, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, big_thread, &args[i]), 0);
    }
    for (unsigned i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    assert_segment_as_written(fx);

    /* an owner that breaks off mid-payload: the read fails, within the timeout */
    fake_server_t fs;
    fake_start(&fs, FAKE_HALF_PAYLOAD);
    kvp_peer_t *p = peer_new(fx, SEG_ID, fs.port);
    p->size = 64 * MIB;
    fx->xfer.tcp_slice = MIB;
    fx->xfer.timeout_ms = 500;
    uint8_t *buf = xmalloc(8 * MIB);
    kvp_xfer_op_t op = op_of(KVP_XFER_READ, p, buf, 0, 8 * MIB);
    uint64_t t = kvp_now_ms();
    tp_submit(fx->tp, &op, 1);
    assert_true(op.status == KVP_ERR_IO || op.status == KVP_ERR_TIMEOUT);
    assert_true(kvp_now_ms() - t < 3000);
    fake_stop(&fs);
    kvp_peer_unref(p);
    free(buf);

    /* a transport of its own: its cleanup takes its workers with it */
    int before = threads_now();
    kvp_transfer_t x = {
        .list = tcp_only, .timeout_ms = 10000, .tcp_streams = 3, .tcp_slice = 512 * KIB};
    assert_int_equal(kvp_transfer_init(&x), KVP_OK);
    kvp_peer_t *q = kvp_peer_create(SEG_ID);
    assert_non_null(q);
    q->size = SEG_SIZE;
    snprintf(q->endpoint, sizeof(q->endpoint), "127.0.0.1:%u", (unsigned)fx->port);
    assert_int_equal(kvp_transfer_route(&x, q), KVP_TRANSPORT_TCP);
    uint8_t *dst = xmalloc(SEG_SIZE);
    kvp_xfer_op_t r = op_of(KVP_XFER_READ, q, dst, 0, SEG_SIZE);
    tp_submit(&x.tps[0], &r, 1);
    assert_int_equal(r.status, KVP_OK);
    assert_memory_equal(dst, fx->ref, SEG_SIZE);
    assert_true(threads_now() > before);
    kvp_peer_unref(q);
    kvp_transfer_cleanup(&x);
    /* its workers are joined; the owner's threads for its connections end as they see
     * the connections close */
    for (int i = 0; i < 200 && threads_now() != before; i++)
        usleep(10000);
    assert_int_equal(threads_now(), before);
    free(dst);
}

/* A read's payload wakes its stream only once TCP_LOWAT of it has come (SO_RCVLOWAT): the
 * rest of a payload shorter than that still wakes it (an odd length, sent a little at a
 * time), a payload that stops coming fails at the timeout (not earlier, not never), and a
 * pooled connection goes back waking at the first byte (a small read right after a large
 * one on the same stream would otherwise wait out the timeout). */
static void test_payload_wakeups(void **state)
{
    fixture_t *fx = *state;
    fx->xfer.tcp_streams = 1;
    const uint64_t len = MIB + 12345;
    uint8_t *buf = xmalloc(len), *want = xmalloc(len);
    fill(want, len, 97);

    fake_server_t fs;
    fake_start(&fs, FAKE_DRIBBLE);
    kvp_peer_t *p = peer_new(fx, SEG_ID, fs.port);
    p->size = 64 * MIB;
    fx->xfer.tcp_slice = 4 * MIB; /* one request */
    kvp_xfer_op_t op = op_of(KVP_XFER_READ, p, buf, 0, len);
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_memory_equal(buf, want, len);
    /* its last wake-up waited for the whole rest: the connection went back to the pool
     * with a high mark unless it was set back; a small read on it must not wait it out */
    uint64_t t0 = kvp_now_ms();
    op = op_of(KVP_XFER_READ, p, buf, 0, 100);
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_memory_equal(buf, want, 100);
    assert_true(kvp_now_ms() - t0 < 1000);
    fake_stop(&fs);
    kvp_peer_unref(p);

    fake_start(&fs, FAKE_HALF_STALL);
    p = peer_new(fx, SEG_ID, fs.port);
    p->size = 64 * MIB;
    fx->xfer.timeout_ms = 400;
    op = op_of(KVP_XFER_READ, p, buf, 0, len);
    t0 = kvp_now_ms();
    tp_submit(fx->tp, &op, 1);
    uint64_t took = kvp_now_ms() - t0;
    assert_int_equal(op.status, KVP_ERR_TIMEOUT);
    assert_true(took >= 350 && took < 5000);
    fake_stop(&fs);
    kvp_peer_unref(p);

    /* the real owner: a 4 MiB read, then 100 bytes on the same pooled connection */
    fx->xfer.timeout_ms = 10000;
    write_ok(fx, 0, 4 * MIB, 70);
    read_check(fx, 0, 4 * MIB);
    assert_int_equal(conns_to(fx->port), 1);
    t0 = kvp_now_ms();
    read_check(fx, 4096, 100);
    assert_true(kvp_now_ms() - t0 < 1000);
    assert_int_equal(conns_to(fx->port), 1);
    free(buf);
    free(want);
}

/* A peer that breaks off mid-payload or answers garbage: the op fails with KVP_ERR_IO or
 * KVP_ERR_PROTOCOL at once (never reported as done with a half-filled buffer). */
static void test_broken_peer(void **state)
{
    fixture_t *fx = *state;
    fx->xfer.timeout_ms = 10000;
    fx->xfer.tcp_streams = 1;
    fx->xfer.tcp_slice = MIB;
    const struct {
        fake_mode_t mode;
        kvp_status_t want;
    } cases[] = {
        {FAKE_HALF_PAYLOAD, KVP_ERR_IO},
        {FAKE_BAD_MAGIC, KVP_ERR_PROTOCOL},
        {FAKE_BAD_STATUS, KVP_ERR_PROTOCOL},
        {FAKE_WRONG_LENGTH, KVP_ERR_PROTOCOL},
    };
    uint8_t *buf = xmalloc(512 * KIB);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fake_server_t fs;
        fake_start(&fs, cases[i].mode);
        kvp_peer_t *p = peer_new(fx, SEG_ID, fs.port);
        kvp_xfer_op_t op = op_of(KVP_XFER_READ, p, buf, 4096, 512 * KIB);
        uint64_t t0 = kvp_now_ms();
        tp_submit(fx->tp, &op, 1);
        assert_int_equal(op.status, cases[i].want);
        assert_true(kvp_now_ms() - t0 < fx->xfer.timeout_ms / 2);
        assert_int_equal(conns_to(fs.port), 0); /* the connection was dropped */
        fake_stop(&fs);
        kvp_peer_unref(p);
    }
    free(buf);
    read_check(fx, 0, MIB); /* the real server's peer is unaffected */
}

/* Malformed frames from a raw socket: the server refuses or drops that connection and
 * goes on serving others (and the same one where the protocol says so); no frame moves a
 * byte of the segment. */
static void test_server_survives_malformed_frames(void **state)
{
    fixture_t *fx = *state;
    kvp_data_req_t req;
    uint64_t len;

    /* bad magic: closed */
    int fd = raw_connect(fx->port);
    req = (kvp_data_req_t){
        .magic = 0x12345678, .op = KVP_DATA_WRITE, .segment_id = SEG_ID, .length = 16};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    assert_closed(fd);
    close(fd);

    /* a HELLO to a server whose mount gave no grant key: answered with no challenge, and
     * the connection serves on, unproven */
    fd = raw_connect(fx->port);
    req = (kvp_data_req_t){
        .magic = KVP_DATA_MAGIC, .op = KVP_DATA_HELLO, .segment_id = SEG_ID, .offset = 7};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    uint64_t hello_len = 99;
    assert_int_equal(raw_reply(fd, &hello_len), 0);
    assert_int_equal(hello_len, 0);
    assert_raw_serves(fx, fd);
    close(fd);

    /* a MAP (the shm hand-off) over tcp, even one naming the whole segment: refused, no
     * descriptor can travel on tcp anyway, closed */
    fd = raw_connect(fx->port);
    req = (kvp_data_req_t){
        .magic = KVP_DATA_MAGIC, .op = KVP_DATA_MAP, .segment_id = SEG_ID, .length = SEG_SIZE};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    assert_int_equal(raw_reply(fd, NULL), KVP_ERR_DENIED);
    assert_closed(fd);
    close(fd);

    /* unknown ops (0, 11, 0xffff): closed */
    const uint16_t unknown[] = {0, KVP_DATA_PROVE + 1, 0xffff};
    for (size_t i = 0; i < 3; i++) {
        fd = raw_connect(fx->port);
        req = (kvp_data_req_t){
            .magic = KVP_DATA_MAGIC, .op = unknown[i], .segment_id = SEG_ID, .length = 16};
        assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
        assert_closed(fd);
        close(fd);
    }
    /* rdma window requests (BIND_READ, BIND_WRITE, UNBIND) with no entries: a protocol
     * error, closed */
    const uint16_t window_ops[] = {KVP_DATA_BIND_READ, KVP_DATA_BIND_WRITE, KVP_DATA_UNBIND};
    for (size_t i = 0; i < 3; i++) {
        fd = raw_connect(fx->port);
        req = (kvp_data_req_t){.magic = KVP_DATA_MAGIC, .op = window_ops[i], .segment_id = 1};
        assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
        assert_int_equal(raw_reply(fd, NULL), KVP_ERR_PROTOCOL);
        assert_closed(fd);
        close(fd);
    }

    /* absurd READ lengths and wrapping extents: refused, the connection goes on */
    fd = raw_connect(fx->port);
    const struct {
        uint64_t off, len;
    } absurd[] = {{0, UINT64_MAX}, {SEG_SIZE - 8, UINT64_MAX - 4}, {8, 1ull << 63}, {0, 0}};
    for (size_t i = 0; i < sizeof(absurd) / sizeof(absurd[0]); i++) {
        req = (kvp_data_req_t){.magic = KVP_DATA_MAGIC,
                               .op = KVP_DATA_READ,
                               .segment_id = SEG_ID,
                               .offset = absurd[i].off,
                               .length = absurd[i].len};
        assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
        assert_int_equal(raw_reply(fd, &len), KVP_ERR_OUT_OF_RANGE);
        assert_int_equal(len, 0);
    }
    assert_raw_serves(fx, fd);
    /* a READV whose total is not the entries' sum: refused, goes on */
    kvp_data_vec_t v[2] = {{.segment_id = SEG_ID, .offset = 0, .length = 10},
                           {.segment_id = SEG_ID, .offset = 100, .length = 10}};
    req =
        (kvp_data_req_t){.magic = KVP_DATA_MAGIC, .op = KVP_DATA_READV, .offset = 2, .length = 21};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    assert_int_equal(kvp_send_all(fd, v, sizeof(v)), KVP_OK);
    assert_int_equal(raw_reply(fd, NULL), KVP_ERR_PROTOCOL);
    assert_raw_serves(fx, fd);
    /* a WRITE of an absurd length: refused and closed, nothing written */
    req = (kvp_data_req_t){.magic = KVP_DATA_MAGIC,
                           .op = KVP_DATA_WRITE,
                           .segment_id = SEG_ID,
                           .offset = 4096,
                           .length = 1ull << 62};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    uint8_t junk[4096];
    memset(junk, 0xab, sizeof(junk));
    (void)kvp_send_all(fd, junk, sizeof(junk)); /* may fail: the server closes */
    assert_int_equal(raw_reply(fd, NULL), KVP_ERR_OUT_OF_RANGE);
    assert_closed(fd);
    close(fd);

    /* a WRITEV with one entry outside the segment: refused and closed, and not even its
     * good entry written (every entry is checked before a byte moves) */
    fd = raw_connect(fx->port);
    kvp_data_vec_t wv[2] = {{.segment_id = SEG_ID, .offset = 4096, .length = 1000},
                            {.segment_id = SEG_ID, .offset = SEG_SIZE - 10, .length = 1000}};
    req = (kvp_data_req_t){
        .magic = KVP_DATA_MAGIC, .op = KVP_DATA_WRITEV, .offset = 2, .length = 2000};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    assert_int_equal(kvp_send_all(fd, wv, sizeof(wv)), KVP_OK);
    (void)kvp_send_all(fd, junk, 2000 < sizeof(junk) ? 2000 : sizeof(junk));
    assert_int_equal(raw_reply(fd, NULL), KVP_ERR_OUT_OF_RANGE);
    assert_closed(fd);
    close(fd);
    assert_segment_as_written(fx);

    /* vectored counts of 0 and far above KVP_DATA_VEC_MAX: refused and closed */
    const uint64_t counts[] = {0, KVP_DATA_VEC_MAX + 1, UINT64_MAX};
    for (size_t i = 0; i < 3; i++) {
        fd = raw_connect(fx->port);
        req = (kvp_data_req_t){
            .magic = KVP_DATA_MAGIC, .op = KVP_DATA_WRITEV, .offset = counts[i], .length = 16};
        assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
        assert_int_equal(raw_reply(fd, NULL), KVP_ERR_PROTOCOL);
        assert_closed(fd);
        close(fd);
    }

    /* half a header, then gone */
    fd = raw_connect(fx->port);
    req = (kvp_data_req_t){.magic = KVP_DATA_MAGIC, .op = KVP_DATA_WRITE};
    assert_int_equal(kvp_send_all(fd, &req, 10), KVP_OK);
    close(fd);

    assert_segment_as_written(fx);
    /* the server still serves the transport, and a new raw connection */
    write_ok(fx, 4096, 3 * MIB, 1000);
    read_check(fx, 0, 4 * MIB);
    fd = raw_connect(fx->port);
    assert_raw_serves(fx, fd);
    close(fd);
    assert_segment_as_written(fx);
}

/* Batches from several threads at once on one transport (its pool and scratches are
 * shared): every thread's bytes and CRCs right. */
typedef struct thread_arg {
    fixture_t *fx;
    unsigned id;
    int bad;
} thread_arg_t;

static void *submit_thread(void *v)
{
    thread_arg_t *a = v;
    enum { LEN = 300 * 1024, ROUNDS = 15 };
    uint8_t *src = malloc(LEN), *dst = malloc(LEN);
    kvp_xfer_op_t *ops[3];
    for (int round = 0; round < ROUNDS && src != NULL && dst != NULL; round++) {
        fill(src, LEN, a->id * 1000 + (uint64_t)round);
        uint64_t off = (uint64_t)a->id * 2 * MIB + (uint64_t)round;
        /* a big op and two small ones (a chain) */
        kvp_xfer_op_t w[3] = {
            op_of(KVP_XFER_WRITE, a->fx->peer, src, off, LEN - 2000),
            op_of(KVP_XFER_WRITE, a->fx->peer, src + LEN - 2000, off + LEN - 2000, 1000),
            op_of(KVP_XFER_WRITE, a->fx->peer, src + LEN - 1000, off + LEN - 1000, 1000)};
        for (int i = 0; i < 3; i++)
            ops[i] = &w[i];
        a->fx->tp->ops->submit(a->fx->tp->ctx, ops, 3);
        memset(dst, 0, LEN);
        kvp_xfer_op_t r[3] = {
            op_of(KVP_XFER_READ, a->fx->peer, dst, off, 1000),
            op_of(KVP_XFER_READ, a->fx->peer, dst + 1000, off + 1000, 1000),
            op_of(KVP_XFER_READ, a->fx->peer, dst + 2000, off + 2000, LEN - 2000)};
        for (int i = 0; i < 3; i++)
            ops[i] = &r[i];
        a->fx->tp->ops->submit(a->fx->tp->ctx, ops, 3);
        for (int i = 0; i < 3; i++)
            if (w[i].status != KVP_OK || r[i].status != KVP_OK ||
                w[i].crc != kvp_crc32c(0, w[i].local, w[i].length) ||
                r[i].crc != kvp_crc32c(0, r[i].local, r[i].length))
                a->bad++;
        if (memcmp(src, dst, LEN) != 0)
            a->bad++;
    }
    if (src == NULL || dst == NULL)
        a->bad++;
    free(src);
    free(dst);
    return NULL;
}

static void test_concurrent_submits(void **state)
{
    fixture_t *fx = *state;
    fx->xfer.tcp_streams = 2;
    fx->xfer.tcp_slice = 64 * KIB;
    enum { T = 6 };
    pthread_t th[T];
    thread_arg_t args[T];
    for (unsigned i = 0; i < T; i++) {
        args[i] = (thread_arg_t){.fx = fx, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, submit_thread, &args[i]), 0);
    }
    for (unsigned i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    /* the threads' last rounds are what the segment holds */
    uint8_t *src = xmalloc(300 * KIB);
    for (unsigned i = 0; i < T; i++) {
        fill(src, 300 * KIB, i * 1000 + 14);
        assert_memory_equal(fx->seg + (uint64_t)i * 2 * MIB + 14, src, 300 * KIB);
    }
    free(src);
}

/* ---- bugs found by these tests, fixed ---- */

/* Fixed bug: tcp.c did not check an op's extent against the peer's size before slicing it
 * (the server checks each slice alone), so a WRITE that starts inside the segment and runs
 * past its end was reported KVP_ERR_OUT_OF_RANGE after its first slices were written. */
static void test_bug_partial_out_of_range_write(void **state)
{
    fixture_t *fx = *state;
    fx->xfer.tcp_slice = 128 * KIB; /* chains of at most 128 KiB: one request per slice */
    fx->xfer.tcp_streams = 1;
    uint64_t len = 4 * 128 * KIB;
    uint8_t *src = xmalloc(len);
    fill(src, len, 1100);
    kvp_xfer_op_t op = op_of(KVP_XFER_WRITE, fx->peer, src, SEG_SIZE - 128 * KIB, len);
    tp_submit(fx->tp, &op, 1);
    assert_int_not_equal(op.status, KVP_OK); /* OUT_OF_RANGE, or IO if the close came first */
    free(src);
    assert_segment_as_written(fx); /* fails: the last 128 KiB of the segment were written */
}

/* Fixed bug, the same, worse: slices of an op whose offset + length wraps past 2^64 got
 * offsets that wrap to the start of the segment, and the ones the server found in range
 * were written there (on other streams than the first slice's) while the op failed. */
static void test_bug_wrapping_write(void **state)
{
    fixture_t *fx = *state;
    fx->xfer.tcp_slice = 128 * KIB;
    fx->xfer.tcp_streams = 2;
    uint64_t len = 12 * 128 * KIB; /* more slices than one connection takes (its share) */
    uint8_t *src = xmalloc(len);
    fill(src, len, 1200);
    kvp_xfer_op_t op = op_of(KVP_XFER_WRITE, fx->peer, src, UINT64_MAX - 128 * KIB + 1, len);
    tp_submit(fx->tp, &op, 1);
    assert_int_not_equal(op.status, KVP_OK);
    free(src);
    assert_segment_as_written(fx); /* fails: slices 8.. landed at offsets 7 * 128 KiB .. */
}

/* Fixed bug: a pooled connection the server closed while it sat idle (the owner restarted
 * on the same port) was handed out again, so the next batch failed with KVP_ERR_IO although
 * the server served; an idle connection is now checked when it is taken. */
static void test_bug_pool_hands_out_dead_connections(void **state)
{
    fixture_t *fx = *state;
    fx->xfer.tcp_streams = 3;
    fx->xfer.tcp_slice = 64 * KIB;
    read_check(fx, 0, 2 * MIB); /* three connections pooled */
    assert_int_equal(conns_to(fx->port), 3);
    kvp_data_server_destroy(fx->srv);
    uint16_t port;
    assert_int_equal(
        kvp_segment_server_create(fx->seg, SEG_SIZE, "127.0.0.1", fx->port, true, &fx->srv, &port),
        KVP_OK);
    assert_int_equal(port, fx->port);
    kvp_data_server_set_id(fx->srv, SEG_ID);
    read_check(fx, 0, 100); /* fails: KVP_ERR_IO on a dead pooled connection */
}

int main(void)
{
    kvp_log_init_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_write_read_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_small_ops_vectored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slices_and_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_endpoints, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_segment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stalled_peer_times_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_latency, setup, teardown),
        cmocka_unit_test_setup_teardown(test_small_batch_spread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threaded_transfers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_payload_wakeups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broken_peer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_survives_malformed_frames, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_submits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bug_partial_out_of_range_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bug_wrapping_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bug_pool_hands_out_dead_connections, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
