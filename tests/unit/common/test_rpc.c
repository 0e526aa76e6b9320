/*
 * test_rpc.c - unit tests for common/rpc.c.
 *
 * The codec is checked against explicit wire bytes (not only against itself),
 * the scanner is fed frames one byte at a time and garbage of every length,
 * and kvp_rpc_call runs over a socketpair against a responder thread that
 * reads the real request off the socket and answers with a scripted reply.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/rpc.h"
#include "common/macros.h"
#include "common/sock.h"

static uint64_t test_rng_state = 0x243F6A8885A308D3ull;

static uint64_t test_rng_next(void)
{
    uint64_t z = (test_rng_state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* ---- codec ---- */

static void test_hdr_pack_bytes(void **state)
{
    (void)state;
    kvp_rpc_hdr_t hdr = {
        .version = 77, /* ignored: pack always writes KVP_RPC_VERSION */
        .method = 0x8007,
        .request_id = 0x0102030405060708ull,
        .body_len = 0x0A0B0C0D,
        .status = -16,
        .epoch = 0x1112131415161718ull,
    };
    uint8_t out[KVP_RPC_HDR_LEN];
    memset(out, 0xEE, sizeof(out));
    kvp_rpc_hdr_pack(&hdr, out);
    static const uint8_t want[KVP_RPC_HDR_LEN] = {
        0x4B, 0x56, 0x50, 0x31,                         /* "KVP1" */
        0x02, 0x00,                                     /* version 2 */
        0x07, 0x80,                                     /* method */
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* request id */
        0x0D, 0x0C, 0x0B, 0x0A,                         /* body_len */
        0xF0, 0xFF, 0xFF, 0xFF,                         /* status -16 */
        0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, /* epoch */
    };
    assert_memory_equal(out, want, sizeof(want));
}

static void test_hdr_round_trip(void **state)
{
    (void)state;
    static const kvp_rpc_hdr_t cases[] = {
        {.method = KVP_RPC_PING, .request_id = 1, .body_len = 0, .status = 0},
        {.method = KVP_RPC_STAT | KVP_RPC_RESPONSE_BIT,
         .request_id = UINT64_MAX,
         .body_len = KVP_RPC_MAX_BODY,
         .status = KVP_ERR_INTERNAL},
        {.method = 0xFFFF, .request_id = 0x8000000000000001ull, .body_len = 1, .status = INT32_MIN},
        {.method = 0, .request_id = 0, .body_len = 12345, .status = INT32_MAX},
    };
    for (size_t i = 0; i < KVP_ARRAY_SIZE(cases); i++) {
        uint8_t buf[KVP_RPC_HDR_LEN];
        kvp_rpc_hdr_pack(&cases[i], buf);
        kvp_rpc_hdr_t h;
        memset(&h, 0xA5, sizeof(h));
        assert_int_equal(kvp_rpc_hdr_unpack(buf, KVP_RPC_MAX_BODY, &h), KVP_OK);
        assert_int_equal(h.version, KVP_RPC_VERSION);
        assert_int_equal(h.method, cases[i].method);
        assert_true(h.request_id == cases[i].request_id);
        assert_int_equal(h.body_len, cases[i].body_len);
        assert_int_equal(h.status, cases[i].status);
    }

    /* random headers */
    for (int i = 0; i < 10000; i++) {
        kvp_rpc_hdr_t in = {
            .method = (uint16_t)test_rng_next(),
            .request_id = test_rng_next(),
            .body_len = (uint32_t)(test_rng_next() % (KVP_RPC_MAX_BODY + 1u)),
            .status = (int32_t)test_rng_next(),
        };
        uint8_t buf[KVP_RPC_HDR_LEN];
        kvp_rpc_hdr_pack(&in, buf);
        /* explicit little-endian decode of what pack wrote */
        uint64_t id = 0;
        for (int b = 7; b >= 0; b--)
            id = (id << 8) | buf[8 + b];
        assert_true(id == in.request_id);
        assert_int_equal(buf[6] | (buf[7] << 8), in.method);
        kvp_rpc_hdr_t out;
        assert_int_equal(kvp_rpc_hdr_unpack(buf, KVP_RPC_MAX_BODY, &out), KVP_OK);
        assert_int_equal(out.method, in.method);
        assert_true(out.request_id == in.request_id);
        assert_int_equal(out.body_len, in.body_len);
        assert_int_equal(out.status, in.status);
    }
}

static void test_hdr_unpack_explicit_bytes(void **state)
{
    (void)state;
    const uint8_t in[KVP_RPC_HDR_LEN] = {
        0x4B, 0x56, 0x50, 0x31, 0x02, 0x00, 0x02, 0x00, 0xEF, 0xCD, 0xAB,
        0x89, 0x67, 0x45, 0x23, 0x01, 0x10, 0x00, 0x00, 0x00, 0xFF, 0xFF,
        0xFF, 0xFF, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    };
    kvp_rpc_hdr_t h;
    assert_int_equal(kvp_rpc_hdr_unpack(in, 16, &h), KVP_OK);
    assert_int_equal(h.version, 2);
    assert_int_equal(h.epoch, 7);
    assert_int_equal(h.method, KVP_RPC_MOUNT);
    assert_true(h.request_id == 0x0123456789ABCDEFull);
    assert_int_equal(h.body_len, 16);
    assert_int_equal(h.status, -1);
    /* one byte over the receiver's maximum */
    assert_int_equal(kvp_rpc_hdr_unpack(in, 15, &h), KVP_ERR_FRAME_TOO_LARGE);
    assert_true(h.request_id == 0x0123456789ABCDEFull); /* id kept for the error reply */
}

static void test_hdr_bad_magic(void **state)
{
    (void)state;
    kvp_rpc_hdr_t hdr = {.method = KVP_RPC_PING, .request_id = 9};
    uint8_t buf[KVP_RPC_HDR_LEN];
    for (int i = 0; i < 4; i++) {
        kvp_rpc_hdr_pack(&hdr, buf);
        buf[i] ^= 0x20;
        kvp_rpc_hdr_t h;
        assert_int_equal(kvp_rpc_hdr_unpack(buf, KVP_RPC_MAX_BODY, &h), KVP_ERR_PROTOCOL);
    }
    /* the magic byte-swapped (a big-endian writer) */
    kvp_rpc_hdr_pack(&hdr, buf);
    buf[0] = 0x31, buf[1] = 0x50, buf[2] = 0x56, buf[3] = 0x4B;
    kvp_rpc_hdr_t h;
    assert_int_equal(kvp_rpc_hdr_unpack(buf, KVP_RPC_MAX_BODY, &h), KVP_ERR_PROTOCOL);
}

static void test_hdr_bad_version(void **state)
{
    (void)state;
    kvp_rpc_hdr_t hdr = {.method = KVP_RPC_EXIST, .request_id = 0xABCDEF, .body_len = 3};
    uint8_t buf[KVP_RPC_HDR_LEN];
    static const uint16_t versions[] = {0, 1, 3, 0x100, 0xFFFF}; /* 1: the 24-byte header */
    for (size_t i = 0; i < KVP_ARRAY_SIZE(versions); i++) {
        kvp_rpc_hdr_pack(&hdr, buf);
        buf[4] = (uint8_t)versions[i];
        buf[5] = (uint8_t)(versions[i] >> 8);
        kvp_rpc_hdr_t h;
        memset(&h, 0, sizeof(h));
        assert_int_equal(kvp_rpc_hdr_unpack(buf, KVP_RPC_MAX_BODY, &h), KVP_ERR_VERSION);
        /* written anyway so the error reply can echo the request id */
        assert_int_equal(h.version, versions[i]);
        assert_true(h.request_id == 0xABCDEF);
        assert_int_equal(h.method, KVP_RPC_EXIST);
    }
}

static void test_hdr_too_large(void **state)
{
    (void)state;
    uint8_t buf[KVP_RPC_HDR_LEN];
    kvp_rpc_hdr_t h;
    kvp_rpc_hdr_t hdr = {.method = KVP_RPC_PUT_START, .request_id = 5};

    hdr.body_len = KVP_RPC_MAX_BODY;
    kvp_rpc_hdr_pack(&hdr, buf);
    assert_int_equal(kvp_rpc_hdr_unpack(buf, KVP_RPC_MAX_BODY, &h), KVP_OK);

    hdr.body_len = KVP_RPC_MAX_BODY + 1;
    kvp_rpc_hdr_pack(&hdr, buf);
    assert_int_equal(kvp_rpc_hdr_unpack(buf, KVP_RPC_MAX_BODY, &h), KVP_ERR_FRAME_TOO_LARGE);
    assert_true(h.request_id == 5);

    hdr.body_len = UINT32_MAX;
    kvp_rpc_hdr_pack(&hdr, buf);
    assert_int_equal(kvp_rpc_hdr_unpack(buf, KVP_RPC_MAX_BODY, &h), KVP_ERR_FRAME_TOO_LARGE);
    assert_int_equal(kvp_rpc_hdr_unpack(buf, UINT32_MAX, &h), KVP_OK);

    hdr.body_len = 1;
    kvp_rpc_hdr_pack(&hdr, buf);
    assert_int_equal(kvp_rpc_hdr_unpack(buf, 0, &h), KVP_ERR_FRAME_TOO_LARGE);
    hdr.body_len = 0;
    kvp_rpc_hdr_pack(&hdr, buf);
    assert_int_equal(kvp_rpc_hdr_unpack(buf, 0, &h), KVP_OK);
}

/* ---- frame scanning ---- */

/* Build a frame with a body of `body_len` bytes of a pattern; returns its length. */
static size_t make_frame(uint8_t *buf, uint16_t method, uint64_t id, uint32_t body_len)
{
    kvp_rpc_hdr_t hdr = {.method = method, .request_id = id, .body_len = body_len};
    kvp_rpc_hdr_pack(&hdr, buf);
    for (uint32_t i = 0; i < body_len; i++)
        buf[KVP_RPC_HDR_LEN + i] = (uint8_t)(i * 7 + 1);
    return KVP_RPC_HDR_LEN + body_len;
}

static void test_scan_byte_at_a_time(void **state)
{
    (void)state;
    static const uint32_t bodies[] = {0, 1, 100, 4096};
    uint8_t *buf = malloc(KVP_RPC_HDR_LEN + 4096);
    assert_non_null(buf);
    for (size_t b = 0; b < KVP_ARRAY_SIZE(bodies); b++) {
        size_t flen = make_frame(buf, KVP_RPC_GET_SIZE, 1000 + b, bodies[b]);
        for (size_t len = 0; len < flen; len++) {
            kvp_rpc_hdr_t h;
            size_t fl = 0;
            /* each prefix in a fresh exact-size allocation: ASan sees any over-read */
            uint8_t *prefix = malloc(len ? len : 1);
            assert_non_null(prefix);
            memcpy(prefix, buf, len);
            kvp_status_t st = kvp_rpc_frame_scan(prefix, len, KVP_RPC_MAX_BODY, &h, &fl);
            free(prefix);
            if (st != KVP_ERR_PENDING)
                fail_msg("body %u: scan of %zu/%zu bytes = %d, want PENDING", bodies[b], len, flen,
                         st);
            /* the need is known once the header is in */
            if (len >= KVP_RPC_HDR_LEN)
                assert_int_equal(fl, flen);
            else
                assert_true(fl >= len + 1 && fl <= flen);
        }
        kvp_rpc_hdr_t h;
        size_t fl = 0;
        assert_int_equal(kvp_rpc_frame_scan(buf, flen, KVP_RPC_MAX_BODY, &h, &fl), KVP_OK);
        assert_int_equal(fl, flen);
        assert_int_equal(h.method, KVP_RPC_GET_SIZE);
        assert_true(h.request_id == 1000 + b);
        assert_int_equal(h.body_len, bodies[b]);
    }
    free(buf);
}

static void test_scan_back_to_back(void **state)
{
    (void)state;
    uint8_t buf[3 * KVP_RPC_HDR_LEN + 10 + 0 + 33];
    size_t l1 = make_frame(buf, KVP_RPC_PUT_START, 1, 10);
    size_t l2 = make_frame(buf + l1, KVP_RPC_PUT_END, 2, 0);
    size_t l3 = make_frame(buf + l1 + l2, KVP_RPC_REMOVE, 3, 33);
    size_t total = l1 + l2 + l3;
    assert_int_equal(total, sizeof(buf));

    kvp_rpc_hdr_t h;
    size_t fl;
    size_t pos = 0;
    static const uint16_t methods[] = {KVP_RPC_PUT_START, KVP_RPC_PUT_END, KVP_RPC_REMOVE};
    const size_t lens[] = {l1, l2, l3};
    for (int i = 0; i < 3; i++) {
        /* the whole rest of the stream is buffered: only the first frame is reported */
        assert_int_equal(kvp_rpc_frame_scan(buf + pos, total - pos, KVP_RPC_MAX_BODY, &h, &fl),
                         KVP_OK);
        assert_int_equal(fl, lens[i]);
        assert_int_equal(h.method, methods[i]);
        assert_true(h.request_id == (uint64_t)i + 1);
        pos += fl;
    }
    assert_int_equal(pos, total);

    /* first frame complete plus half a header of the second */
    assert_int_equal(kvp_rpc_frame_scan(buf, l1 + 12, KVP_RPC_MAX_BODY, &h, &fl), KVP_OK);
    assert_int_equal(fl, l1);
    assert_int_equal(kvp_rpc_frame_scan(buf + l1, 12, KVP_RPC_MAX_BODY, &h, &fl), KVP_ERR_PENDING);
}

static void test_scan_rejects_garbage_early(void **state)
{
    (void)state;
    /* a wrong first byte is refused with just that byte */
    static const uint8_t starts[][4] = {
        {'G', 'E', 'T', ' '},
        {0x16, 0x03, 0x01, 0x00},
        {0x00, 0x00, 0x00, 0x00},
        {0x31, 0x50, 0x56, 0x4B}, /* magic in the wrong byte order */
    };
    for (size_t i = 0; i < KVP_ARRAY_SIZE(starts); i++) {
        for (size_t len = 1; len <= 4; len++) {
            kvp_rpc_hdr_t h;
            size_t fl;
            if (kvp_rpc_frame_scan(starts[i], len, KVP_RPC_MAX_BODY, &h, &fl) != KVP_ERR_PROTOCOL)
                fail_msg("garbage start %zu not refused after %zu bytes", i, len);
        }
    }
    /* right first bytes, wrong later magic byte: refused as soon as that byte is in */
    const uint8_t partial[4] = {0x4B, 0x56, 0x50, 0x32};
    kvp_rpc_hdr_t h;
    size_t fl;
    assert_int_equal(kvp_rpc_frame_scan(partial, 3, KVP_RPC_MAX_BODY, &h, &fl), KVP_ERR_PENDING);
    assert_int_equal(kvp_rpc_frame_scan(partial, 4, KVP_RPC_MAX_BODY, &h, &fl), KVP_ERR_PROTOCOL);

    /* a whole header with a bad version or an oversized body: the header's error */
    uint8_t buf[KVP_RPC_HDR_LEN];
    make_frame(buf, KVP_RPC_PING, 1, 0);
    buf[4] = 9;
    assert_int_equal(kvp_rpc_frame_scan(buf, sizeof(buf), KVP_RPC_MAX_BODY, &h, &fl),
                     KVP_ERR_VERSION);
    kvp_rpc_hdr_t big = {.method = KVP_RPC_PING, .request_id = 1, .body_len = 1u << 30};
    kvp_rpc_hdr_pack(&big, buf);
    assert_int_equal(kvp_rpc_frame_scan(buf, sizeof(buf), KVP_RPC_MAX_BODY, &h, &fl),
                     KVP_ERR_FRAME_TOO_LARGE);
    /* an empty buffer is just "need more" */
    assert_int_equal(kvp_rpc_frame_scan(buf, 0, KVP_RPC_MAX_BODY, &h, &fl), KVP_ERR_PENDING);
}

static void test_scan_random_garbage(void **state)
{
    (void)state;
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = test_rng_next() % 64;
        uint8_t *buf = malloc(len ? len : 1);
        assert_non_null(buf);
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)test_rng_next();
        /* half the time start with the right magic so the deeper paths run too */
        if (len >= 4 && (iter & 1)) {
            buf[0] = 0x4B, buf[1] = 0x56, buf[2] = 0x50, buf[3] = 0x31;
            if (len >= 6 && (iter & 2))
                buf[4] = 1, buf[5] = 0;
        }
        kvp_rpc_hdr_t h;
        size_t fl = 0;
        kvp_status_t st = kvp_rpc_frame_scan(buf, len, 1024, &h, &fl);
        switch (st) {
        case KVP_OK:
            assert_true(len >= KVP_RPC_HDR_LEN);
            assert_true(fl >= KVP_RPC_HDR_LEN && fl <= len);
            assert_int_equal(fl, KVP_RPC_HDR_LEN + h.body_len);
            break;
        case KVP_ERR_PENDING:
            assert_true(fl > len);
            break;
        case KVP_ERR_PROTOCOL:
        case KVP_ERR_VERSION:
        case KVP_ERR_FRAME_TOO_LARGE:
            break;
        default:
            fail_msg("unexpected scan status %d", st);
        }
        free(buf);
    }
}

/* ---- kvp_rpc_call over a socketpair ---- */

typedef struct reply {
    uint16_t method;    /* 0: request method | RESPONSE_BIT */
    int64_t request_id; /* -1: the request's id */
    int32_t status;
    const char *body; /* may be NULL */
    size_t body_len;
} reply_t;

typedef struct responder {
    int fd;
    reply_t replies[4];
    int n_replies;
    bool close_after_request; /* read the request, then close without answering */
    size_t partial_reply;     /* > 0: send only this many bytes of reply 0, then close */
    /* what the responder saw */
    kvp_rpc_hdr_t req;
    uint8_t req_body[256];
    kvp_status_t req_status;
} responder_t;

static void *responder_main(void *arg)
{
    responder_t *r = arg;
    uint8_t hb[KVP_RPC_HDR_LEN];
    r->req_status = kvp_recv_all(r->fd, hb, sizeof(hb));
    if (r->req_status == KVP_OK)
        r->req_status = kvp_rpc_hdr_unpack(hb, sizeof(r->req_body), &r->req);
    if (r->req_status == KVP_OK && r->req.body_len > 0)
        r->req_status = kvp_recv_all(r->fd, r->req_body, r->req.body_len);
    if (r->req_status != KVP_OK || r->close_after_request)
        goto done;
    for (int i = 0; i < r->n_replies; i++) {
        const reply_t *rp = &r->replies[i];
        kvp_rpc_hdr_t h = {
            .method = rp->method ? rp->method : (uint16_t)(r->req.method | KVP_RPC_RESPONSE_BIT),
            .request_id = rp->request_id < 0 ? r->req.request_id : (uint64_t)rp->request_id,
            .body_len = (uint32_t)rp->body_len,
            .status = rp->status,
        };
        uint8_t frame[KVP_RPC_HDR_LEN + 256];
        kvp_rpc_hdr_pack(&h, frame);
        if (rp->body_len)
            memcpy(frame + KVP_RPC_HDR_LEN, rp->body, rp->body_len);
        size_t flen = KVP_RPC_HDR_LEN + rp->body_len;
        if (r->partial_reply > 0)
            flen = r->partial_reply;
        if (kvp_send_all(r->fd, frame, flen) != KVP_OK)
            break;
        if (r->partial_reply > 0)
            break;
    }
done:
    close(r->fd);
    return NULL;
}

typedef struct call_result {
    kvp_status_t status;
    uint8_t *resp;
    size_t resp_len;
} call_result_t;

/* Run one kvp_rpc_call against a responder scripted in *r. */
static call_result_t run_call(responder_t *r, uint16_t method, uint64_t id, const char *body)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    kvp_sock_set_timeout(sv[0], 10000); /* a hang fails the test instead of blocking it */
    r->fd = sv[1];
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, responder_main, r), 0);
    call_result_t res = {.resp = (uint8_t *)"sentinel", .resp_len = 999};
    res.status =
        kvp_rpc_call(sv[0], method, id, body, body ? strlen(body) : 0, &res.resp, &res.resp_len);
    assert_int_equal(pthread_join(th, NULL), 0);
    close(sv[0]);
    return res;
}

static void test_call_ok(void **state)
{
    (void)state;
    responder_t r = {
        .replies = {{.request_id = -1, .body = "pong-body", .body_len = 9}},
        .n_replies = 1,
    };
    call_result_t res = run_call(&r, KVP_RPC_EXIST, 0x1122334455667788ull, "request!");
    assert_int_equal(res.status, KVP_OK);
    /* the request as it went over the wire */
    assert_int_equal(r.req_status, KVP_OK);
    assert_int_equal(r.req.version, KVP_RPC_VERSION);
    assert_int_equal(r.req.method, KVP_RPC_EXIST);
    assert_true(r.req.request_id == 0x1122334455667788ull);
    assert_int_equal(r.req.body_len, 8);
    assert_int_equal(r.req.status, 0);
    assert_memory_equal(r.req_body, "request!", 8);
    /* the response body */
    assert_int_equal(res.resp_len, 9);
    assert_non_null(res.resp);
    assert_memory_equal(res.resp, "pong-body", 9);
    free(res.resp);
}

static void test_call_empty_bodies(void **state)
{
    (void)state;
    responder_t r = {.replies = {{.request_id = -1}}, .n_replies = 1};
    call_result_t res = run_call(&r, KVP_RPC_PING, 7, NULL);
    assert_int_equal(res.status, KVP_OK);
    assert_int_equal(r.req.body_len, 0);
    assert_int_equal(r.req.method, KVP_RPC_PING);
    assert_int_equal(res.resp_len, 0);
    free(res.resp); /* NULL or a 0-byte buffer: either may be freed */
}

static void test_call_skips_stale_reply(void **state)
{
    (void)state;
    responder_t r = {
        .replies =
            {
                {.request_id = 41, .body = "stale-one", .body_len = 9},
                /* a stale error reply must not be taken as this call's error */
                {.request_id = 40, .status = KVP_ERR_TIMEOUT, .body = "old", .body_len = 3},
                {.request_id = -1, .body = "fresh", .body_len = 5},
            },
        .n_replies = 3,
    };
    call_result_t res = run_call(&r, KVP_RPC_GET_SIZE, 42, "q");
    assert_int_equal(res.status, KVP_OK);
    assert_int_equal(res.resp_len, 5);
    assert_memory_equal(res.resp, "fresh", 5);
    free(res.resp);
}

static void test_call_frame_error_status(void **state)
{
    (void)state;
    responder_t r = {
        .replies = {{.request_id = -1,
                     .status = KVP_ERR_UNKNOWN_METHOD,
                     .body = "unknown method 11",
                     .body_len = 17}},
        .n_replies = 1,
    };
    call_result_t res = run_call(&r, KVP_RPC_STAT, 3, NULL);
    assert_int_equal(res.status, KVP_ERR_UNKNOWN_METHOD);

    responder_t r2 = {
        .replies = {{.request_id = -1, .status = KVP_ERR_FRAME_TOO_LARGE}},
        .n_replies = 1,
    };
    res = run_call(&r2, KVP_RPC_PUT_START, 4, "x");
    assert_int_equal(res.status, KVP_ERR_FRAME_TOO_LARGE);

    /* a status that is not a kvp_status_t is a protocol error, not passed through */
    responder_t r3 = {.replies = {{.request_id = -1, .status = 5}}, .n_replies = 1};
    res = run_call(&r3, KVP_RPC_STAT, 5, NULL);
    assert_int_equal(res.status, KVP_ERR_PROTOCOL);
    responder_t r4 = {.replies = {{.request_id = -1, .status = -1000}}, .n_replies = 1};
    res = run_call(&r4, KVP_RPC_STAT, 6, NULL);
    assert_int_equal(res.status, KVP_ERR_PROTOCOL);
}

static void test_call_wrong_method(void **state)
{
    (void)state;
    /* right id, but the response is for another method (or lacks the response bit) */
    responder_t r = {
        .replies = {{.method = KVP_RPC_PUT_END | KVP_RPC_RESPONSE_BIT,
                     .request_id = -1,
                     .body = "zz",
                     .body_len = 2}},
        .n_replies = 1,
    };
    call_result_t res = run_call(&r, KVP_RPC_PUT_START, 8, "a");
    assert_int_equal(res.status, KVP_ERR_PROTOCOL);

    responder_t r2 = {.replies = {{.method = KVP_RPC_PUT_START, .request_id = -1}}, .n_replies = 1};
    res = run_call(&r2, KVP_RPC_PUT_START, 9, "a");
    assert_int_equal(res.status, KVP_ERR_PROTOCOL);
}

static void test_call_peer_close(void **state)
{
    (void)state;
    /* the peer reads the request and closes */
    responder_t r = {.close_after_request = true};
    call_result_t res = run_call(&r, KVP_RPC_REMOVE, 10, "key");
    assert_int_equal(res.status, KVP_ERR_IO);
    assert_int_equal(r.req_status, KVP_OK);

    /* the peer closes in the middle of the response header */
    responder_t r2 = {.replies = {{.request_id = -1, .body = "0123456789", .body_len = 10}},
                      .n_replies = 1,
                      .partial_reply = 10};
    res = run_call(&r2, KVP_RPC_REMOVE, 11, "key");
    assert_int_equal(res.status, KVP_ERR_IO);

    /* ... and in the middle of the response body */
    responder_t r3 = {.replies = {{.request_id = -1, .body = "0123456789", .body_len = 10}},
                      .n_replies = 1,
                      .partial_reply = KVP_RPC_HDR_LEN + 4};
    res = run_call(&r3, KVP_RPC_REMOVE, 12, "key");
    assert_int_equal(res.status, KVP_ERR_IO);

    /* a stale reply, then the close */
    responder_t r4 = {.replies = {{.request_id = 1, .body = "old", .body_len = 3}}, .n_replies = 1};
    res = run_call(&r4, KVP_RPC_REMOVE, 13, "key");
    assert_int_equal(res.status, KVP_ERR_IO);
}

static void test_call_bad_response_header(void **state)
{
    (void)state;
    /* a response with an oversized body_len is refused before any allocation */
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    kvp_sock_set_timeout(sv[0], 10000);
    kvp_rpc_hdr_t h = {.method = KVP_RPC_STAT | KVP_RPC_RESPONSE_BIT,
                       .request_id = 77,
                       .body_len = KVP_RPC_MAX_BODY + 1};
    uint8_t hb[KVP_RPC_HDR_LEN];
    kvp_rpc_hdr_pack(&h, hb);
    /* the request fits in the socket buffer, so the reply can be queued up front */
    assert_int_equal(kvp_send_all(sv[1], hb, sizeof(hb)), KVP_OK);
    uint8_t *resp = NULL;
    size_t resp_len = 0;
    assert_int_equal(kvp_rpc_call(sv[0], KVP_RPC_STAT, 77, NULL, 0, &resp, &resp_len),
                     KVP_ERR_FRAME_TOO_LARGE);
    close(sv[0]);
    close(sv[1]);

    /* a response that is not ours at all */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    kvp_sock_set_timeout(sv[0], 10000);
    const char junk[KVP_RPC_HDR_LEN] = "HTTP/1.1 400 Bad Reques";
    assert_int_equal(kvp_send_all(sv[1], junk, sizeof(junk)), KVP_OK);
    assert_int_equal(kvp_rpc_call(sv[0], KVP_RPC_STAT, 78, NULL, 0, &resp, &resp_len),
                     KVP_ERR_PROTOCOL);
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hdr_pack_bytes),
        cmocka_unit_test(test_hdr_round_trip),
        cmocka_unit_test(test_hdr_unpack_explicit_bytes),
        cmocka_unit_test(test_hdr_bad_magic),
        cmocka_unit_test(test_hdr_bad_version),
        cmocka_unit_test(test_hdr_too_large),
        cmocka_unit_test(test_scan_byte_at_a_time),
        cmocka_unit_test(test_scan_back_to_back),
        cmocka_unit_test(test_scan_rejects_garbage_early),
        cmocka_unit_test(test_scan_random_garbage),
        cmocka_unit_test(test_call_ok),
        cmocka_unit_test(test_call_empty_bodies),
        cmocka_unit_test(test_call_skips_stale_reply),
        cmocka_unit_test(test_call_frame_error_status),
        cmocka_unit_test(test_call_wrong_method),
        cmocka_unit_test(test_call_peer_close),
        cmocka_unit_test(test_call_bad_response_header),
    };
    return cmocka_run_group_tests_name("rpc", tests, NULL, NULL);
}
