/*
 * test_shm.c - unit tests for client/transport/shm.c, the same-host transport
 * (kvp_transport_shm_ops).
 *
 * The test process plays both sides, as two clients on one host would: the
 * "owner" makes a memfd segment and maps it (client.c does the same), and
 * publishes it as /proc/<pid>/fd/<n> (the descriptor's shm_path); the peer's
 * host_id is this host's (kvp_host_id). The transport is created by the engine
 * (kvp_transfer_init with a list of shm alone), peers are attached through it
 * (kvp_transfer_route: shm maps the segment at attach), and batches go
 * straight to the ops table's submit. The owner's mapping has a shadow copy
 * that follows every successful WRITE; after each test the mapping must equal
 * it, so a stray byte written anywhere fails the test.
 *
 * Whether shm mapped a segment is read from /proc/self/maps (the memfd's name),
 * so "not attached" means "not mapped", not only "another route".
 *
 * Thread: cmocka's (the transport's populate thread runs behind it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* client internals: kvp_transfer_t, kvp_peer_t, kvp_xfer_op_t, kvp_host_id, the segment
 * server (internal.h); the ops table (transport.h) */
#include "client/segment/segment_server.h"
#include "client/transfer/engine.h"
#include "tests/unit/client/transport/tp_test.h"
#include "client/transport/wire.h"
#include "client/transfer/transport.h"
#include "client/transport/transports.h"

#include "common/crc32c.h"
#include "common/log.h"

#define SEG_SIZE (16 * MIB)
#define SEG_ID 0x5a11ull
#define SEG_NAME "kvpool-test-shm-seg"

static const kvp_transport_ops_t *const shm_only[] = {&kvp_transport_shm_ops, NULL};

typedef struct fixture {
    int memfd;    /* the owner's segment */
    uint8_t *seg; /* the owner's mapping of it */
    uint8_t *ref; /* what seg must hold */
    kvp_transfer_t xfer;
    kvp_transport_t *tp;
    kvp_peer_t *peer; /* same host, attached by shm */
} fixture_t;

/* Mappings of the test's memfd in this process. */
static int seg_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "re");
    assert_non_null(f);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strstr(line, "memfd:" SEG_NAME) != NULL)
            n++;
    fclose(f);
    return n;
}

/* A peer for the test's segment as a descriptor from the master would describe it. */
static kvp_peer_t *peer_new(const fixture_t *fx, uint64_t segment_id, const char *host_id)
{
    kvp_peer_t *p = kvp_peer_create(segment_id);
    assert_non_null(p);
    p->size = SEG_SIZE;
    snprintf(p->name, sizeof(p->name), "seg-%llx", (unsigned long long)segment_id);
    snprintf(p->host_id, sizeof(p->host_id), "%s", host_id);
    snprintf(p->shm_path, sizeof(p->shm_path), "/proc/%d/fd/%d", (int)getpid(), fx->memfd);
    return p;
}

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    fx->memfd = memfd_create(SEG_NAME, MFD_CLOEXEC);
    assert_true(fx->memfd >= 0);
    assert_int_equal(ftruncate(fx->memfd, (off_t)SEG_SIZE), 0);
    fx->seg = mmap(NULL, SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fx->memfd, 0);
    assert_true(fx->seg != MAP_FAILED);
    fill(fx->seg, SEG_SIZE, 1);
    fx->ref = xmalloc(SEG_SIZE);
    memcpy(fx->ref, fx->seg, SEG_SIZE);
    fx->xfer.list = shm_only;
    fx->xfer.timeout_ms = 10000;
    kvp_host_id(fx->xfer.host_id, sizeof(fx->xfer.host_id));
    assert_int_equal(kvp_transfer_init(&fx->xfer), KVP_OK);
    assert_int_equal(fx->xfer.n_tps, 1);
    fx->tp = &fx->xfer.tps[0];
    assert_ptr_equal(fx->tp->ops, &kvp_transport_shm_ops);
    assert_int_equal(seg_mappings(), 1);
    fx->peer = peer_new(fx, SEG_ID, fx->xfer.host_id);
    assert_int_equal(kvp_transfer_route(&fx->xfer, fx->peer), KVP_TRANSPORT_SHM);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    if (fx->peer != NULL)
        kvp_peer_unref(fx->peer);
    kvp_transfer_cleanup(&fx->xfer);
    munmap(fx->seg, SEG_SIZE);
    if (fx->memfd >= 0)
        close(fx->memfd);
    free(fx->ref);
    free(fx);
    return 0;
}

static void assert_segment_as_written(const fixture_t *fx)
{
    assert_memory_equal(fx->seg, fx->ref, SEG_SIZE);
}

/* A same-host peer is attached by mapping its segment (a second mapping of the memfd,
 * not a copy): WRITEs land in the owner's memory, the owner's bytes come back on READs,
 * with their CRCs; the last reference unmaps it. */
static void test_same_host_maps_segment(void **state)
{
    fixture_t *fx = *state;
    assert_int_equal(seg_mappings(), 2);
    enum { N = 5 };
    const uint64_t len[N] = {1, 4095, 64 * KIB + 3, 3 * MIB + 17, 1};
    const uint64_t off[N] = {0, 4097, 100000, 5 * MIB - 1, SEG_SIZE - 1};
    uint8_t *src[N], *dst[N];
    kvp_xfer_op_t ops[N];
    for (int i = 0; i < N; i++) {
        src[i] = xmalloc(len[i]);
        dst[i] = calloc(1, len[i]);
        assert_non_null(dst[i]);
        fill(src[i], len[i], 10 + (uint64_t)i);
        ops[i] = op_of(KVP_XFER_WRITE, fx->peer, src[i], off[i], len[i]);
    }
    ops[1].want_crc = false;
    tp_submit(fx->tp, ops, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(ops[i].status, KVP_OK);
        assert_int_equal(ops[i].crc, i == 1 ? SENTINEL_CRC : kvp_crc32c(0, src[i], len[i]));
        memcpy(fx->ref + off[i], src[i], len[i]);
    }
    assert_segment_as_written(fx);

    /* the owner writes; the peer reads its bytes */
    fill(fx->seg + 10 * MIB, MIB, 20);
    memcpy(fx->ref + 10 * MIB, fx->seg + 10 * MIB, MIB);
    for (int i = 0; i < N; i++)
        ops[i] = op_of(KVP_XFER_READ, fx->peer, dst[i], off[i], len[i]);
    ops[3].want_crc = false;
    tp_submit(fx->tp, ops, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(ops[i].status, KVP_OK);
        assert_memory_equal(dst[i], src[i], len[i]);
        assert_int_equal(ops[i].crc, i == 3 ? SENTINEL_CRC : kvp_crc32c(0, src[i], len[i]));
    }
    uint8_t *all = xmalloc(SEG_SIZE);
    kvp_xfer_op_t op = op_of(KVP_XFER_READ, fx->peer, all, 0, SEG_SIZE);
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_memory_equal(all, fx->ref, SEG_SIZE);
    assert_int_equal(op.crc, kvp_crc32c(0, fx->ref, SEG_SIZE));
    free(all);
    for (int i = 0; i < N; i++) {
        free(src[i]);
        free(dst[i]);
    }
    assert_segment_as_written(fx);

    kvp_peer_unref(fx->peer); /* detach: stops the populate thread, unmaps */
    fx->peer = NULL;
    assert_int_equal(seg_mappings(), 1);
}

/* Copies of at least KVP_CRC32C_STREAM_MIN marked `stream` (the streaming copy with its
 * CRC), at unaligned addresses on both sides: bytes and CRC right, in both directions. */
static void test_streaming_copy_crc(void **state)
{
    fixture_t *fx = *state;
    const uint64_t len = 2 * KVP_CRC32C_STREAM_MIN + 5, off = 3 * MIB + 3;
    uint8_t *src = xmalloc(len + 1), *dst = xmalloc(len + 1);
    fill(src + 1, len, 30);
    kvp_xfer_op_t op = op_of(KVP_XFER_WRITE, fx->peer, src + 1, off, len);
    op.stream = true;
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_int_equal(op.crc, kvp_crc32c(0, src + 1, len));
    memcpy(fx->ref + off, src + 1, len);
    assert_segment_as_written(fx);
    memset(dst, 0, len + 1);
    op = op_of(KVP_XFER_READ, fx->peer, dst + 1, off, len);
    op.stream = true;
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_memory_equal(dst + 1, src + 1, len);
    assert_int_equal(op.crc, kvp_crc32c(0, src + 1, len));
    assert_int_equal(dst[0], 0); /* nothing before the buffer */
    free(src);
    free(dst);
}

/* Extents outside the segment, wrapping ones included: KVP_ERR_OUT_OF_RANGE, nothing
 * moved either way; good ops of the same batch (one ending exactly at the segment's end
 * among them) go through. */
static void test_out_of_range(void **state)
{
    fixture_t *fx = *state;
    const struct {
        uint64_t off, len;
    } bad[] = {
        {SEG_SIZE, 1},            /* starts at the end */
        {SEG_SIZE - 10, 11},      /* one byte past it */
        {SEG_SIZE + 4096, 100},   /* beyond */
        {SEG_SIZE + 1, 0},        /* empty, but beyond */
        {UINT64_MAX - 3, 8},      /* offset + length wraps */
        {8, UINT64_MAX - 3},      /* length wraps with the offset */
        {0, SEG_SIZE + 1},        /* longer than the segment */
        {UINT64_MAX, UINT64_MAX}, /* both absurd */
        {SEG_SIZE / 2, SEG_SIZE / 2 + 1},
    };
    enum { BUF = 64 * 1024 };
    uint8_t *buf = xmalloc(BUF);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(buf, 0xee, BUF);
        kvp_xfer_op_t op = op_of(KVP_XFER_READ, fx->peer, buf, bad[i].off, bad[i].len);
        tp_submit(fx->tp, &op, 1);
        assert_int_equal(op.status, KVP_ERR_OUT_OF_RANGE);
        for (size_t k = 0; k < BUF; k++)
            assert_int_equal(buf[k], 0xee);
        fill(buf, BUF, 40 + i);
        op = op_of(KVP_XFER_WRITE, fx->peer, buf, bad[i].off, bad[i].len);
        tp_submit(fx->tp, &op, 1);
        assert_int_equal(op.status, KVP_ERR_OUT_OF_RANGE);
        assert_segment_as_written(fx);
    }
    /* a bad op among good ones fails alone */
    uint8_t a[100], b[100], c[100];
    fill(a, sizeof(a), 50);
    fill(c, sizeof(c), 51);
    memset(b, 0xee, sizeof(b));
    kvp_xfer_op_t ops[3] = {op_of(KVP_XFER_WRITE, fx->peer, a, SEG_SIZE - 100, 100),
                            op_of(KVP_XFER_WRITE, fx->peer, b, SEG_SIZE - 99, 100),
                            op_of(KVP_XFER_WRITE, fx->peer, c, 0, 100)};
    tp_submit(fx->tp, ops, 3);
    assert_int_equal(ops[0].status, KVP_OK);
    assert_int_equal(ops[1].status, KVP_ERR_OUT_OF_RANGE);
    assert_int_equal(ops[2].status, KVP_OK);
    memcpy(fx->ref + SEG_SIZE - 100, a, 100);
    memcpy(fx->ref, c, 100);
    assert_segment_as_written(fx);
    ops[0] = op_of(KVP_XFER_READ, fx->peer, b, SEG_SIZE - 100, 100);
    ops[1] = op_of(KVP_XFER_READ, fx->peer, c, SEG_SIZE - 100, 101);
    memset(c, 0xee, sizeof(c));
    tp_submit(fx->tp, ops, 2);
    assert_int_equal(ops[0].status, KVP_OK);
    assert_memory_equal(b, a, 100);
    assert_int_equal(ops[1].status, KVP_ERR_OUT_OF_RANGE);
    for (size_t k = 0; k < sizeof(c); k++)
        assert_int_equal(c[k], 0xee);
    free(buf);
}

/* shm attaches only peers of this host whose segment it can open and map whole: another
 * host id, no shm_path, a path that does not open, or a file shorter than the descriptor
 * says, and the segment is not mapped (the engine has no route for the peer here; with
 * tcp after shm in the list, tcp carries it). */
static void test_not_attached(void **state)
{
    fixture_t *fx = *state;
    kvp_peer_t *p[4];
    p[0] = peer_new(fx, SEG_ID + 1, "another-boot-id/4026531836");
    p[1] = peer_new(fx, SEG_ID + 2, fx->xfer.host_id);
    p[1]->shm_path[0] = '\0';
    p[2] = peer_new(fx, SEG_ID + 3, fx->xfer.host_id);
    snprintf(p[2]->shm_path, sizeof(p[2]->shm_path), "/proc/%d/fd/%d", (int)getpid(), 1000000);
    p[3] = peer_new(fx, SEG_ID + 4, fx->xfer.host_id);
    p[3]->size = 2 * SEG_SIZE;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(kvp_transfer_route(&fx->xfer, p[i]), KVP_TRANSPORT_AUTO);
        assert_null(kvp_peer_tp_state(p[i], fx->tp->index));
        assert_int_equal(seg_mappings(), 2); /* the owner's and fx->peer's only */
        uint8_t buf[16];
        kvp_xfer_op_t op = op_of(KVP_XFER_WRITE, p[i], buf, 0, sizeof(buf));
        kvp_transfer_run(&fx->xfer, &op, 1);
        assert_int_equal(op.status, KVP_ERR_TRANSPORT);
    }
    assert_segment_as_written(fx);
    for (int i = 0; i < 4; i++)
        kvp_peer_unref(p[i]);

    /* the whole list: the other host's peer goes to tcp (the owner serves the same
     * memory), the same host's to shm */
    kvp_data_server_t *srv;
    uint16_t port;
    assert_int_equal(
        kvp_segment_server_create(fx->seg, SEG_SIZE, "127.0.0.1", 0, true, &srv, &port), KVP_OK);
    kvp_data_server_set_id(srv, SEG_ID);
    static const kvp_transport_ops_t *const shm_tcp[] = {&kvp_transport_shm_ops,
                                                         &kvp_transport_tcp_ops, NULL};
    kvp_transfer_t *x = calloc(1, sizeof(*x));
    assert_non_null(x);
    x->list = shm_tcp;
    x->timeout_ms = 10000;
    x->tcp_streams = 2;
    x->tcp_slice = MIB;
    snprintf(x->host_id, sizeof(x->host_id), "%s", fx->xfer.host_id);
    assert_int_equal(kvp_transfer_init(x), KVP_OK);
    kvp_peer_t *far = peer_new(fx, SEG_ID, "another-boot-id/4026531836");
    snprintf(far->endpoint, sizeof(far->endpoint), "127.0.0.1:%u", (unsigned)port);
    kvp_peer_t *near = peer_new(fx, SEG_ID, x->host_id);
    snprintf(near->endpoint, sizeof(near->endpoint), "127.0.0.1:%u", (unsigned)port);
    assert_int_equal(kvp_transfer_route(x, far), KVP_TRANSPORT_TCP);
    assert_int_equal(seg_mappings(), 2);
    assert_int_equal(kvp_transfer_route(x, near), KVP_TRANSPORT_SHM);
    assert_int_equal(seg_mappings(), 3);
    uint8_t src[3000], dst[3000];
    fill(src, sizeof(src), 60);
    kvp_xfer_op_t ops[2] = {op_of(KVP_XFER_WRITE, far, src, 12345, sizeof(src)),
                            op_of(KVP_XFER_READ, near, dst, 12345, sizeof(dst))};
    kvp_transfer_run(x, &ops[0], 1);
    assert_int_equal(ops[0].status, KVP_OK);
    kvp_transfer_run(x, &ops[1], 1);
    assert_int_equal(ops[1].status, KVP_OK);
    assert_memory_equal(dst, src, sizeof(src));
    memcpy(fx->ref + 12345, src, sizeof(src));
    assert_segment_as_written(fx);
    kvp_peer_unref(far);
    kvp_peer_unref(near);
    assert_int_equal(seg_mappings(), 2);
    kvp_transfer_cleanup(x);
    free(x);
    kvp_data_server_destroy(srv);
}

/* Our own segment is not mapped a second time: shm uses the client's mapping
 * (xfer->seg_base), and detaching it leaves that mapping alone. */
static void test_own_segment(void **state)
{
    fixture_t *fx = *state;
    kvp_peer_unref(fx->peer); /* a fresh engine state: unmapped */
    fx->peer = NULL;
    assert_int_equal(seg_mappings(), 1);
    fx->xfer.seg_base = fx->seg;
    fx->xfer.seg_size = SEG_SIZE;
    kvp_peer_t *own = peer_new(fx, SEG_ID, fx->xfer.host_id);
    own->own = true;
    own->shm_path[0] = '\0';
    assert_int_equal(kvp_transfer_route(&fx->xfer, own), KVP_TRANSPORT_SHM);
    assert_int_equal(seg_mappings(), 1);
    uint8_t src[5000], dst[5000];
    fill(src, sizeof(src), 70);
    kvp_xfer_op_t op = op_of(KVP_XFER_WRITE, own, src, 777, sizeof(src));
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_int_equal(op.crc, kvp_crc32c(0, src, sizeof(src)));
    memcpy(fx->ref + 777, src, sizeof(src));
    assert_segment_as_written(fx);
    op = op_of(KVP_XFER_READ, own, dst, 777, sizeof(dst));
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_memory_equal(dst, src, sizeof(src));
    op = op_of(KVP_XFER_WRITE, own, src, SEG_SIZE - 10, sizeof(src));
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_ERR_OUT_OF_RANGE);
    kvp_peer_unref(own);
    assert_int_equal(seg_mappings(), 1);
    assert_segment_as_written(fx); /* still mapped, still ours */
    fx->xfer.seg_base = NULL;
    fx->xfer.seg_size = 0;
}

/* The owner going away (its memfd closed: the shm_path no longer resolves) makes the
 * peer stale, so the client can drop it; the mapping itself stays readable. */
static void test_stale_when_owner_gone(void **state)
{
    fixture_t *fx = *state;
    assert_false(kvp_transfer_peer_stale(&fx->xfer, fx->peer));
    uint8_t src[4096], dst[4096];
    fill(src, sizeof(src), 80);
    kvp_xfer_op_t op = op_of(KVP_XFER_WRITE, fx->peer, src, 8192, sizeof(src));
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    memcpy(fx->ref + 8192, src, sizeof(src));
    close(fx->memfd);
    fx->memfd = -1;
    assert_true(kvp_transfer_peer_stale(&fx->xfer, fx->peer));
    op = op_of(KVP_XFER_READ, fx->peer, dst, 8192, sizeof(dst));
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_memory_equal(dst, src, sizeof(src));
    assert_segment_as_written(fx);
}

/* A child process playing the owner (as uid, 0: ours): serves MAP on the abstract socket
 * `name` over the fixture's memfd (data grants off). Its pid, once it serves. */
static pid_t owner_start(fixture_t *fx, const char *name, uid_t uid)
{
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        kvp_data_server_t *srv;
        uint16_t port;
        char ok = 'n';
        if ((uid == 0 || (setgid(uid) == 0 && setuid(uid) == 0)) &&
            kvp_segment_server_create(fx->seg, SEG_SIZE, "127.0.0.1", 0, true, &srv, &port) ==
                KVP_OK) {
            kvp_data_server_set_id(srv, SEG_ID);
            if (kvp_data_server_share(srv, fx->memfd, name) == KVP_OK)
                ok = 'y';
        }
        if (write(ready[1], &ok, 1) != 1 || ok != 'y')
            _exit(1);
        for (;;)
            pause();
    }
    close(ready[1]);
    char ok = 0;
    assert_int_equal(read(ready[0], &ok, 1), 1);
    close(ready[0]);
    assert_int_equal(ok, 'y');
    return child;
}

/*
 * The hand-off (shm_path "@NAME"): a child process plays the owner, serving MAP on an
 * abstract Unix socket over the fixture's memfd (segment_server.c, data grants off). The
 * peer is handed the memfd and maps it: its bytes are the owner's, its writes land in the
 * owner's memory. A MAP for another segment id is refused (nothing mapped). When the owner
 * exits, the peer is stale (the pidfd taken at the hand-off).
 */
static void test_handoff_from_owner_process(void **state)
{
    fixture_t *fx = *state;
    char name[64];
    snprintf(name, sizeof(name), "kvpool-test-shm-%d", (int)getpid());
    pid_t child = owner_start(fx, name, 0);

    kvp_peer_t *p = peer_new(fx, SEG_ID, fx->xfer.host_id);
    snprintf(p->shm_path, sizeof(p->shm_path), "@%s", name);
    kvp_peer_t *other = peer_new(fx, SEG_ID + 1, fx->xfer.host_id);
    snprintf(other->shm_path, sizeof(other->shm_path), "@%s", name);
    assert_int_equal(kvp_transfer_route(&fx->xfer, other), KVP_TRANSPORT_AUTO);
    assert_int_equal(seg_mappings(), 2); /* the owner's and fx->peer's only */
    assert_int_equal(kvp_transfer_route(&fx->xfer, p), KVP_TRANSPORT_SHM);
    assert_int_equal(seg_mappings(), 3);

    uint8_t src[8192], dst[8192];
    kvp_xfer_op_t op = op_of(KVP_XFER_READ, p, dst, 4096, sizeof(dst));
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_memory_equal(dst, fx->ref + 4096, sizeof(dst));
    fill(src, sizeof(src), 91);
    op = op_of(KVP_XFER_WRITE, p, src, 65536, sizeof(src));
    tp_submit(fx->tp, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    memcpy(fx->ref + 65536, src, sizeof(src));
    assert_segment_as_written(fx);

    assert_false(kvp_transfer_peer_stale(&fx->xfer, p));
    assert_int_equal(kill(child, SIGKILL), 0);
    assert_int_equal(waitpid(child, NULL, 0), child);
    assert_true(kvp_transfer_peer_stale(&fx->xfer, p));
    kvp_peer_unref(p);
    kvp_peer_unref(other);
    assert_int_equal(seg_mappings(), 2);
}

/*
 * A process of another user that serves MAP under a name a descriptor gives (say, the
 * socket name of an owner that died) is not taken: the client maps memory only from its
 * own user or root, as owners hand it only to them. Needs root to play another user (CI
 * runs as root; elsewhere cmocka reports it skipped).
 */
static void test_handoff_refused_from_another_user(void **state)
{
    fixture_t *fx = *state;
    if (geteuid() != 0)
        skip();
    char name[64];
    snprintf(name, sizeof(name), "kvpool-test-shm-squat-%d", (int)getpid());
    pid_t child = owner_start(fx, name, 65534);
    kvp_peer_t *p = peer_new(fx, SEG_ID, fx->xfer.host_id);
    snprintf(p->shm_path, sizeof(p->shm_path), "@%s", name);
    assert_int_equal(kvp_transfer_route(&fx->xfer, p), KVP_TRANSPORT_AUTO);
    assert_int_equal(seg_mappings(), 2); /* nothing mapped */
    kvp_peer_unref(p);
    assert_int_equal(kill(child, SIGKILL), 0);
    assert_int_equal(waitpid(child, NULL, 0), child);
}

int main(void)
{
    kvp_log_init_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_host_maps_segment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streaming_copy_crc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_attached, setup, teardown),
        cmocka_unit_test_setup_teardown(test_own_segment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_when_owner_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handoff_from_owner_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handoff_refused_from_another_user, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
