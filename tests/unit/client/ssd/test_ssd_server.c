/*
 * test_ssd_server.c - unit tests for client/ssd/ssd_server.c, the data
 * server of an SSD segment, spoken to over a raw TCP socket with the
 * kvp_data_req_t protocol (client/transport/wire.h).
 *
 * A real file on the real disk, in a directory made with mkdtemp under the
 * current directory (meson runs tests in the build directory), removed at
 * the end.
 *
 * Checked: a WRITE of 1 MiB + 13 bytes and one of 9 MiB + 100 (more chunks
 * than the ring's depth) read back byte-exact; READs of subranges at
 * unaligned offsets; READV/WRITEV of several small extents; a READ(V)
 * outside the segment is KVP_ERR_OUT_OF_RANGE and the connection serves on;
 * a wrong segment id is KVP_ERR_SEGMENT_GONE; a WRITE at an unaligned offset
 * is KVP_ERR_INVALID_ARG and closes the connection; bytes written through
 * the server and recorded with kvp_ssd_file_record come back after the file
 * is closed and opened again; a read that fails (the file truncated behind
 * the server's back) before any payload byte is a KVP_ERR_IO reply on a
 * connection that goes on, after the first chunk a broken stream, and both
 * count in kvp_ssd_server_io_errors.
 */
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/transport/wire.h"
#include "client/ssd/ssd_file.h"
#include "client/ssd/ssd_server.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/sock.h"

#define MIB (1024ull * 1024)
#define SEG_SIZE (32 * MIB)
#define SEG_ID 0x5eedull

static char g_dir[PATH_MAX];
static char g_path[PATH_MAX + 16];

typedef struct fixture {
    kvp_ssd_file_t *f;
    kvp_data_server_t *srv;
    uint16_t port;
    int fd;
} fixture_t;

static kvp_ssd_file_t *open_file(void)
{
    kvp_ssd_open_params_t p = {.path = g_path, .size = SEG_SIZE, .max_entries = 64};
    kvp_ssd_file_t *f = NULL;
    char why[512];
    kvp_status_t st = kvp_ssd_file_open(&p, &f, why, sizeof(why));
    if (st != KVP_OK)
        fail_msg("open %s: %s: %s", g_path, kvp_strerror(st), why);
    return f;
}

static int connect_to(uint16_t port)
{
    int fd = -1;
    assert_int_equal(kvp_tcp_connect("127.0.0.1", port, 5000, &fd), KVP_OK);
    kvp_sock_set_timeout(fd, 20000);
    return fd;
}

static void start(fixture_t *fx)
{
    assert_int_equal(kvp_ssd_server_create(fx->f, "127.0.0.1", 0, true, &fx->srv, &fx->port),
                     KVP_OK);
    kvp_data_server_set_id(fx->srv, SEG_ID);
    fx->fd = connect_to(fx->port);
}

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));
    fx->f = open_file();
    start(fx);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    close(fx->fd);
    kvp_data_server_destroy(fx->srv);
    kvp_ssd_file_close(fx->f);
    free(fx);
    return 0;
}

static void fill(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static int32_t do_write(int fd, uint64_t id, uint64_t off, const void *data, uint64_t len)
{
    kvp_data_req_t req = {.magic = KVP_DATA_MAGIC,
                          .op = KVP_DATA_WRITE,
                          .segment_id = id,
                          .offset = off,
                          .length = len};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    kvp_data_resp_t r;
    if (kvp_send_all(fd, data, len) != KVP_OK) /* a server that refused may have closed */
        return INT32_MIN;
    assert_int_equal(kvp_recv_all(fd, &r, sizeof(r)), KVP_OK);
    assert_int_equal(r.magic, KVP_DATA_MAGIC);
    assert_int_equal(r.length, 0);
    return r.status;
}

static int32_t do_read(int fd, uint64_t id, uint64_t off, uint64_t len, void *out)
{
    kvp_data_req_t req = {.magic = KVP_DATA_MAGIC,
                          .op = KVP_DATA_READ,
                          .segment_id = id,
                          .offset = off,
                          .length = len};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    kvp_data_resp_t r;
    assert_int_equal(kvp_recv_all(fd, &r, sizeof(r)), KVP_OK);
    assert_int_equal(r.magic, KVP_DATA_MAGIC);
    if (r.status != 0) {
        assert_int_equal(r.length, 0);
        return r.status;
    }
    assert_int_equal(r.length, len);
    assert_int_equal(kvp_recv_all(fd, out, len), KVP_OK);
    return 0;
}

static int32_t do_writev(int fd, const kvp_data_vec_t *v, size_t n, const uint8_t *const *data)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += v[i].length;
    kvp_data_req_t req = {
        .magic = KVP_DATA_MAGIC, .op = KVP_DATA_WRITEV, .offset = n, .length = total};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    assert_int_equal(kvp_send_all(fd, v, n * sizeof(v[0])), KVP_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(kvp_send_all(fd, data[i], v[i].length), KVP_OK);
    kvp_data_resp_t r;
    assert_int_equal(kvp_recv_all(fd, &r, sizeof(r)), KVP_OK);
    return r.status;
}

static int32_t do_readv(int fd, const kvp_data_vec_t *v, size_t n, uint8_t *const *out)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += v[i].length;
    kvp_data_req_t req = {
        .magic = KVP_DATA_MAGIC, .op = KVP_DATA_READV, .offset = n, .length = total};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    assert_int_equal(kvp_send_all(fd, v, n * sizeof(v[0])), KVP_OK);
    kvp_data_resp_t r;
    assert_int_equal(kvp_recv_all(fd, &r, sizeof(r)), KVP_OK);
    if (r.status != 0)
        return r.status;
    assert_int_equal(r.length, total);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(kvp_recv_all(fd, out[i], v[i].length), KVP_OK);
    return 0;
}

/* The server closed the connection: a read sees end of stream. */
static void assert_closed(int fd)
{
    char c;
    ssize_t n;
    do
        n = recv(fd, &c, 1, 0);
    while (n < 0 && errno == EINTR);
    assert_true(n == 0 || (n < 0 && errno == ECONNRESET));
}

static void test_write_read_roundtrip(void **state)
{
    fixture_t *fx = *state;
    uint64_t sizes[2] = {MIB + 13, 9 * MIB + 100};
    uint64_t offs[2] = {8192, 4 * MIB};
    for (int k = 0; k < 2; k++) {
        uint8_t *w = malloc(sizes[k]), *r = malloc(sizes[k]);
        assert_non_null(w);
        assert_non_null(r);
        fill(w, sizes[k], (uint64_t)k + 1);
        assert_int_equal(do_write(fx->fd, SEG_ID, offs[k], w, sizes[k]), KVP_OK);
        memset(r, 0, sizes[k]);
        assert_int_equal(do_read(fx->fd, SEG_ID, offs[k], sizes[k], r), KVP_OK);
        assert_memory_equal(r, w, sizes[k]);
        /* subranges starting at unaligned offsets, one across chunk boundaries */
        uint64_t sub[3][2] = {{4097, 300000}, {1, sizes[k] - 2}, {sizes[k] - 5, 5}};
        for (int j = 0; j < 3; j++) {
            memset(r, 0, sizes[k]);
            assert_int_equal(do_read(fx->fd, SEG_ID, offs[k] + sub[j][0], sub[j][1], r), KVP_OK);
            assert_memory_equal(r, w + sub[j][0], sub[j][1]);
        }
        free(w);
        free(r);
    }
    /* the padding of the last block of the first extent is zeros */
    uint8_t pad[4096 - 13];
    assert_int_equal(do_read(fx->fd, SEG_ID, 8192 + MIB + 13, sizeof(pad), pad), KVP_OK);
    for (size_t i = 0; i < sizeof(pad); i++)
        assert_int_equal(pad[i], 0);
    assert_int_equal(kvp_ssd_server_io_errors(fx->srv), 0);
}

static void test_vectored(void **state)
{
    fixture_t *fx = *state;
    enum { N = 5 };
    uint64_t lens[N] = {1, 100, 4096, 5000, 70000};
    uint64_t offs[N] = {20 * MIB, 20 * MIB + 4096, 20 * MIB + 3 * 4096, 21 * MIB, 22 * MIB + 8192};
    kvp_data_vec_t v[N];
    uint8_t *w[N], *r[N];
    for (int i = 0; i < N; i++) {
        v[i] = (kvp_data_vec_t){.segment_id = SEG_ID, .offset = offs[i], .length = lens[i]};
        w[i] = malloc(lens[i]);
        r[i] = calloc(1, lens[i]);
        fill(w[i], lens[i], 100 + (uint64_t)i);
    }
    assert_int_equal(do_writev(fx->fd, v, N, (const uint8_t *const *)w), KVP_OK);
    /* read back in another order */
    kvp_data_vec_t rv[N];
    uint8_t *rr[N];
    for (int i = 0; i < N; i++) {
        rv[i] = v[N - 1 - i];
        rr[i] = r[N - 1 - i];
    }
    assert_int_equal(do_readv(fx->fd, rv, N, rr), KVP_OK);
    for (int i = 0; i < N; i++)
        assert_memory_equal(r[i], w[i], lens[i]);
    /* unaligned subranges of two of them */
    kvp_data_vec_t sv[2] = {{.segment_id = SEG_ID, .offset = offs[3] + 7, .length = 4000},
                            {.segment_id = SEG_ID, .offset = offs[4] + 4095, .length = 60000}};
    uint8_t s0[4000], *s1 = malloc(60000);
    uint8_t *so[2] = {s0, s1};
    assert_int_equal(do_readv(fx->fd, sv, 2, so), KVP_OK);
    assert_memory_equal(s0, w[3] + 7, 4000);
    assert_memory_equal(s1, w[4] + 4095, 60000);
    /* one entry outside the segment: an error for the chain, the connection goes on */
    kvp_data_vec_t bad[2] = {v[0], {.segment_id = SEG_ID, .offset = SEG_SIZE - 10, .length = 11}};
    assert_int_equal(do_readv(fx->fd, bad, 2, so), KVP_ERR_OUT_OF_RANGE);
    assert_int_equal(do_readv(fx->fd, v, 1, r), KVP_OK);
    /* a WRITEV with an unaligned entry: refused, connection closed */
    kvp_data_vec_t unal = {.segment_id = SEG_ID, .offset = 4096 + 512, .length = 1};
    kvp_data_req_t req = {.magic = KVP_DATA_MAGIC, .op = KVP_DATA_WRITEV, .offset = 1, .length = 1};
    assert_int_equal(kvp_send_all(fx->fd, &req, sizeof(req)), KVP_OK);
    assert_int_equal(kvp_send_all(fx->fd, &unal, sizeof(unal)), KVP_OK);
    kvp_data_resp_t resp;
    assert_int_equal(kvp_recv_all(fx->fd, &resp, sizeof(resp)), KVP_OK);
    assert_int_equal(resp.status, KVP_ERR_INVALID_ARG);
    assert_closed(fx->fd);
    for (int i = 0; i < N; i++) {
        free(w[i]);
        free(r[i]);
    }
    free(s1);
}

static void test_out_of_range_keeps_connection(void **state)
{
    fixture_t *fx = *state;
    uint8_t buf[64];
    assert_int_equal(do_read(fx->fd, SEG_ID, SEG_SIZE - 10, 11, buf), KVP_ERR_OUT_OF_RANGE);
    assert_int_equal(do_read(fx->fd, SEG_ID, SEG_SIZE, 1, buf), KVP_ERR_OUT_OF_RANGE);
    assert_int_equal(do_read(fx->fd, SEG_ID, 0, 0, buf), KVP_ERR_OUT_OF_RANGE);
    assert_int_equal(do_read(fx->fd, SEG_ID, UINT64_MAX - 3, 8, buf), KVP_ERR_OUT_OF_RANGE);
    /* still serving */
    uint8_t w[64];
    fill(w, sizeof(w), 7);
    assert_int_equal(do_write(fx->fd, SEG_ID, SEG_SIZE - 4096, w, sizeof(w)), KVP_OK);
    assert_int_equal(do_read(fx->fd, SEG_ID, SEG_SIZE - 4096, sizeof(w), buf), KVP_OK);
    assert_memory_equal(buf, w, sizeof(w));
    assert_int_equal(do_read(fx->fd, SEG_ID, SEG_SIZE - 1, 1, buf), KVP_OK);
    assert_int_equal(buf[0], 0);
    /* a WRITE outside: refused and closed */
    static uint8_t big[4097];
    assert_int_equal(do_write(fx->fd, SEG_ID, SEG_SIZE - 4096, big, sizeof(big)),
                     KVP_ERR_OUT_OF_RANGE);
    assert_closed(fx->fd);
}

static void test_wrong_segment(void **state)
{
    fixture_t *fx = *state;
    uint8_t buf[16];
    assert_int_equal(do_read(fx->fd, SEG_ID + 1, 0, 16, buf), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(do_read(fx->fd, SEG_ID, 0, 16, buf), KVP_OK); /* goes on */
    kvp_data_vec_t v = {.segment_id = 0, .offset = 0, .length = 16};
    uint8_t *out[1] = {buf};
    assert_int_equal(do_readv(fx->fd, &v, 1, out), KVP_ERR_SEGMENT_GONE);
    kvp_data_server_set_id(fx->srv, SEG_ID + 1);
    assert_int_equal(do_read(fx->fd, SEG_ID, 0, 16, buf), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(do_write(fx->fd, SEG_ID, 0, buf, 16), KVP_ERR_SEGMENT_GONE);
    assert_closed(fx->fd);
    kvp_data_server_set_id(fx->srv, SEG_ID);
}

static void test_unaligned_write(void **state)
{
    fixture_t *fx = *state;
    uint8_t w[100] = {1, 2, 3};
    assert_int_equal(do_write(fx->fd, SEG_ID, 4096 + 1, w, sizeof(w)), KVP_ERR_INVALID_ARG);
    assert_closed(fx->fd);
    /* a new connection is served */
    int fd = connect_to(fx->port);
    assert_int_equal(do_write(fd, SEG_ID, 4096, w, sizeof(w)), KVP_OK);
    close(fd);
}

static void test_bad_header_closes(void **state)
{
    fixture_t *fx = *state;
    kvp_data_req_t req = {
        .magic = 0x12345678, .op = KVP_DATA_READ, .segment_id = SEG_ID, .length = 1};
    assert_int_equal(kvp_send_all(fx->fd, &req, sizeof(req)), KVP_OK);
    assert_closed(fx->fd);
    int fd = connect_to(fx->port);
    req = (kvp_data_req_t){.magic = KVP_DATA_MAGIC, .op = KVP_DATA_READV, .offset = 100000};
    assert_int_equal(kvp_send_all(fd, &req, sizeof(req)), KVP_OK);
    kvp_data_resp_t r;
    assert_int_equal(kvp_recv_all(fd, &r, sizeof(r)), KVP_OK);
    assert_int_equal(r.status, KVP_ERR_PROTOCOL);
    assert_closed(fd);
    close(fd);
}

static void test_recorded_survives_reopen(void **state)
{
    fixture_t *fx = *state;
    uint64_t len = 2 * MIB + 333, off = 12 * MIB;
    uint8_t *w = malloc(len), *r = malloc(len);
    fill(w, len, 4242);
    assert_int_equal(do_write(fx->fd, SEG_ID, off, w, len), KVP_OK);
    kvp_ssd_entry_t e = {.version = 77,
                         .offset = off,
                         .size = len,
                         .crc32c = kvp_crc32c(0, w, len),
                         .key_len = 9,
                         .key = "durable/1"};
    assert_int_equal(kvp_ssd_file_record(fx->f, &e, 1, NULL), KVP_OK);

    close(fx->fd);
    kvp_data_server_destroy(fx->srv);
    kvp_ssd_file_close(fx->f);
    fx->f = open_file();
    kvp_ssd_entry_t got;
    char key[KVP_SSD_KEY_MAX];
    assert_true(kvp_ssd_file_lookup(fx->f, off, &got, key));
    assert_int_equal(got.version, 77);
    assert_int_equal(got.size, len);
    assert_int_equal(got.crc32c, e.crc32c);
    assert_memory_equal(got.key, "durable/1", 9);
    start(fx);
    memset(r, 0, len);
    assert_int_equal(do_read(fx->fd, SEG_ID, got.offset, got.size, r), KVP_OK);
    assert_int_equal(kvp_crc32c(0, r, len), got.crc32c);
    assert_memory_equal(r, w, len);
    free(w);
    free(r);
}

/* Reads past the end of a file truncated behind the server's back fail (a short read,
 * then none): before the first payload byte an error reply, after it a closed stream. */
static void test_io_error(void **state)
{
    fixture_t *fx = *state;
    uint64_t base = kvp_ssd_file_data_base(fx->f);
    uint8_t *buf = malloc(3 * MIB);
    fill(buf, 3 * MIB, 9);
    assert_int_equal(do_write(fx->fd, SEG_ID, 0, buf, 3 * MIB), KVP_OK);
    assert_int_equal(ftruncate(kvp_ssd_file_fd(fx->f), (off_t)(base + 3 * MIB / 2)), 0);
    assert_int_equal(do_read(fx->fd, SEG_ID, 2 * MIB, 4096, buf), KVP_ERR_IO);
    assert_int_equal(kvp_ssd_server_io_errors(fx->srv), 1);
    assert_int_equal(do_read(fx->fd, SEG_ID, 0, 100, buf), KVP_OK); /* goes on */
    /* the first chunk goes out, the second fails: the stream breaks */
    kvp_data_req_t req = {.magic = KVP_DATA_MAGIC,
                          .op = KVP_DATA_READ,
                          .segment_id = SEG_ID,
                          .offset = 0,
                          .length = 5 * MIB / 2};
    assert_int_equal(kvp_send_all(fx->fd, &req, sizeof(req)), KVP_OK);
    kvp_data_resp_t r;
    assert_int_equal(kvp_recv_all(fx->fd, &r, sizeof(r)), KVP_OK);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.length, 5 * MIB / 2);
    assert_int_equal(kvp_recv_all(fx->fd, buf, MIB), KVP_OK);
    assert_int_not_equal(kvp_recv_all(fx->fd, buf, 3 * MIB / 2), KVP_OK);
    assert_int_equal(kvp_ssd_server_io_errors(fx->srv), 2);
    assert_int_equal(ftruncate(kvp_ssd_file_fd(fx->f), (off_t)(base + SEG_SIZE)), 0);
    free(buf);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(void)
{
    kvp_log_init_from_env();
    snprintf(g_dir, sizeof(g_dir), "./ssd-server-test-XXXXXX");
    if (mkdtemp(g_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(g_path, sizeof(g_path), "%s/seg", g_dir);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_write_read_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vectored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_range_keeps_connection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_segment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unaligned_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_header_closes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recorded_survives_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_io_error, setup, teardown),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return failed;
}
