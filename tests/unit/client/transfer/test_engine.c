/*
 * test_engine.c - unit tests for client/transfer/engine.c: routing through the
 * transport ops table, with fake transports in its priority list.
 *
 * Three fakes, in priority order: "fa" (id SHM), "fb" (id RDMA, registers
 * memory: unregistered host buffers are staged on it), "fc" (id TCP). A fake
 * attaches a peer when the peer's host_id holds its letter ('a', 'b', 'c'),
 * keeps a private byte array per attached peer as the "segment", and counts
 * what it is given. Scripts make a fake fail ops to a peer with a status of
 * the test's choosing, or hand ops at high offsets on (op->pass). Every transfer is checked byte
 * for byte, and every CRC against kvp_crc32c of the source.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/transfer/engine.h"
#include "client/transfer/peer_table.h"
#include "client/mem/registry.h"
#include "client/transfer/transport.h"
#include "common/crc32c.h"

#define SEG 65536
#define NFAKE 3

typedef struct fake {
    const char *name;
    char letter;
    unsigned index;
    bool created;
    atomic_int attaches, detaches, submits, ops, regs;
    /* script: ops to the peer named fail_peer get fail_status (fail_left times, -1: always) */
    const char *fail_peer;
    kvp_status_t fail_status;
    atomic_int fail_left;
    /* script: ops at offsets >= pass_from (0: none) are handed on (op->pass) */
    uint64_t pass_from;
    atomic_int passed;
    /* the local pointers the last submit was given */
    void *last_local;
} fake_t;

static fake_t fakes[NFAKE];

typedef struct fake_peer {
    fake_t *f;
    uint8_t mem[SEG];
} fake_peer_t;

static kvp_status_t fake_create(fake_t *f, unsigned index, void **ctx_p)
{
    f->index = index;
    f->created = true;
    *ctx_p = f;
    return KVP_OK;
}
#define FAKE_CREATE(i)                                                                             \
    static kvp_status_t fake_create_##i(kvp_transfer_t *x, unsigned index, void **ctx_p)           \
    {                                                                                              \
        (void)x;                                                                                   \
        return fake_create(&fakes[i], index, ctx_p);                                               \
    }
FAKE_CREATE(0)
FAKE_CREATE(1)
FAKE_CREATE(2)

static void fake_destroy(void *ctx)
{
    ((fake_t *)ctx)->created = false;
}

static kvp_status_t fake_attach(void *ctx, kvp_peer_t *peer, void **state_p)
{
    fake_t *f = ctx;
    atomic_fetch_add(&f->attaches, 1);
    if (strchr(peer->host_id, f->letter) == NULL)
        return KVP_ERR_TRANSPORT;
    fake_peer_t *fp = calloc(1, sizeof(*fp));
    assert_non_null(fp);
    fp->f = f;
    *state_p = fp;
    return KVP_OK;
}

static void fake_detach(void *ctx, kvp_peer_t *peer, void *state)
{
    fake_t *f = ctx;
    (void)peer;
    fake_peer_t *fp = state;
    assert_ptr_equal(fp->f, f);
    atomic_fetch_add(&f->detaches, 1);
    free(fp);
}

static kvp_status_t fake_mem_reg(void *ctx, void *addr, size_t len, kvp_mem_kind_t kind)
{
    (void)addr;
    (void)len;
    (void)kind;
    atomic_fetch_add(&((fake_t *)ctx)->regs, 1);
    return KVP_OK;
}

static void fake_mem_dereg(void *ctx, void *addr)
{
    (void)addr;
    atomic_fetch_sub(&((fake_t *)ctx)->regs, 1);
}

static void fake_submit(void *ctx, kvp_xfer_op_t **ops, size_t n)
{
    fake_t *f = ctx;
    atomic_fetch_add(&f->submits, 1);
    atomic_fetch_add(&f->ops, (int)n);
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = ops[i];
        fake_peer_t *fp = kvp_peer_tp_state(op->peer, f->index);
        /* the engine hands a transport only ops to peers attached to it */
        assert_non_null(fp);
        assert_ptr_equal(fp->f, f);
        f->last_local = op->local;
        assert_false(op->pass); /* the engine clears it before each submit */
        if (f->pass_from != 0 && op->offset >= f->pass_from) {
            atomic_fetch_add(&f->passed, 1);
            op->status = KVP_ERR_TRANSPORT;
            op->pass = true;
            continue;
        }
        if (f->fail_peer != NULL && strcmp(op->peer->name, f->fail_peer) == 0 &&
            atomic_load(&f->fail_left) != 0) {
            if (atomic_load(&f->fail_left) > 0)
                atomic_fetch_sub(&f->fail_left, 1);
            op->status = f->fail_status;
            continue;
        }
        assert_true(op->offset + op->length <= SEG);
        uint8_t *seg = fp->mem + op->offset;
        if (op->kind == KVP_XFER_WRITE)
            memcpy(seg, op->local, op->length);
        else
            memcpy(op->local, seg, op->length);
        if (op->want_crc)
            op->crc = kvp_crc32c(0, seg, op->length);
        op->status = KVP_OK;
    }
}

static const kvp_transport_ops_t fake_ops[NFAKE] = {
    {.name = "fa",
     .id = KVP_TRANSPORT_SHM,
     .create = fake_create_0,
     .destroy = fake_destroy,
     .attach = fake_attach,
     .detach = fake_detach,
     .submit = fake_submit},
    {.name = "fb",
     .id = KVP_TRANSPORT_RDMA,
     .create = fake_create_1,
     .destroy = fake_destroy,
     .attach = fake_attach,
     .detach = fake_detach,
     .mem_reg = fake_mem_reg,
     .mem_dereg = fake_mem_dereg,
     .submit = fake_submit},
    {.name = "fc",
     .id = KVP_TRANSPORT_TCP,
     .create = fake_create_2,
     .destroy = fake_destroy,
     .attach = fake_attach,
     .detach = fake_detach,
     .submit = fake_submit},
};
static const kvp_transport_ops_t *const fake_list[] = {&fake_ops[0], &fake_ops[1], &fake_ops[2],
                                                       NULL};

static kvp_transfer_t *xfer_new(kvp_transport_id_t forced)
{
    memset(fakes, 0, sizeof(fakes));
    for (int i = 0; i < NFAKE; i++) {
        fakes[i].name = fake_ops[i].name;
        fakes[i].letter = (char)('a' + i);
    }
    kvp_transfer_t *x = calloc(1, sizeof(*x));
    assert_non_null(x);
    x->forced = forced;
    x->list = fake_list;
    x->timeout_ms = 1000;
    snprintf(x->host_id, sizeof(x->host_id), "test-host");
    assert_int_equal(kvp_transfer_init(x), KVP_OK);
    return x;
}

static void xfer_free(kvp_transfer_t *x)
{
    kvp_transfer_cleanup(x);
    for (int i = 0; i < NFAKE; i++)
        assert_false(fakes[i].created);
    free(x);
}

static kvp_peer_t *peer_new(uint64_t id, const char *name, const char *reach)
{
    kvp_peer_t *p = kvp_peer_create(id);
    assert_non_null(p);
    p->size = SEG;
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(p->host_id, sizeof(p->host_id), "%s", reach);
    return p;
}

static void fill(uint8_t *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 8));
}

static kvp_xfer_op_t op_of(kvp_xfer_kind_t kind, kvp_peer_t *p, void *local, uint64_t off,
                           uint64_t len)
{
    return (kvp_xfer_op_t){.kind = kind,
                           .local = local,
                           .offset = off,
                           .length = len,
                           .peer = p,
                           .want_crc = true,
                           .status = KVP_ERR_INTERNAL};
}

/* The first transport of the list that attaches a peer carries its ops; ops of one batch
 * are spread over the right transports; statuses, data and CRCs come back. */
static void test_priority_and_spread(void **state)
{
    (void)state;
    kvp_transfer_t *x = xfer_new(KVP_TRANSPORT_AUTO);
    assert_int_equal(x->n_tps, 3);
    kvp_peer_t *pa = peer_new(1, "pa", "abc"), *pb = peer_new(2, "pb", "bc"),
               *pc = peer_new(3, "pc", "c");
    kvp_transfer_attach(x, pa);
    assert_int_equal(kvp_transfer_route(x, pa), KVP_TRANSPORT_SHM);
    assert_int_equal(kvp_transfer_route(x, pb), KVP_TRANSPORT_RDMA); /* attached on first use */
    assert_int_equal(kvp_transfer_route(x, pc), KVP_TRANSPORT_TCP);
    /* pb refused by fa, pc by fa and fb: each asked once */
    assert_int_equal(fakes[0].attaches, 3);
    assert_int_equal(fakes[1].attaches, 2);
    assert_int_equal(fakes[2].attaches, 1);

    /* fb needs registered memory: register the buffers so that nothing is staged */
    static uint8_t src[3][1000], dst[3][1000];
    uint32_t regs;
    assert_int_equal(kvp_transfer_register(x, src, sizeof(src), KVP_MEM_HOST, &regs), KVP_OK);
    assert_int_equal(regs, 1u << 1);
    kvp_mem_region_t r = {.addr = (uintptr_t)src, .len = sizeof(src), .tp_regs = regs};
    assert_int_equal(kvp_mem_insert_locked(&x->mem, &r), KVP_OK);
    assert_int_equal(kvp_transfer_register(x, dst, sizeof(dst), KVP_MEM_HOST, &regs), KVP_OK);
    r = (kvp_mem_region_t){.addr = (uintptr_t)dst, .len = sizeof(dst), .tp_regs = regs};
    assert_int_equal(kvp_mem_insert_locked(&x->mem, &r), KVP_OK);
    assert_int_equal(fakes[1].regs, 2);

    kvp_peer_t *peers[3] = {pa, pb, pc};
    kvp_xfer_op_t ops[6];
    for (int i = 0; i < 3; i++) {
        fill(src[i], sizeof(src[i]), (unsigned)i + 1);
        /* interleaved: a, b, c, a, b, c */
        ops[i] = op_of(KVP_XFER_WRITE, peers[i], src[i], 100 * (unsigned)i, 500);
        ops[i + 3] = op_of(KVP_XFER_WRITE, peers[i], src[i] + 500, 100 * (unsigned)i + 500, 500);
    }
    kvp_transfer_run(x, ops, 6);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(ops[i].status, KVP_OK);
        assert_int_equal(ops[i].crc, kvp_crc32c(0, ops[i].local, 500));
    }
    for (int t = 0; t < 3; t++) {
        assert_int_equal(fakes[t].submits, 1); /* one call per transport per batch */
        assert_int_equal(fakes[t].ops, 2);
    }
    for (int i = 0; i < 3; i++)
        ops[i] = op_of(KVP_XFER_READ, peers[i], dst[i], 100 * (unsigned)i, 1000);
    kvp_transfer_run(x, ops, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ops[i].status, KVP_OK);
        assert_memory_equal(dst[i], src[i], 1000);
        assert_int_equal(ops[i].crc, kvp_crc32c(0, src[i], 1000));
    }
    assert_ptr_equal(fakes[1].last_local, dst[1]); /* registered: zero-copy */

    kvp_mem_region_t gone;
    assert_int_equal(kvp_mem_remove_locked(&x->mem, (uintptr_t)src, &gone), KVP_OK);
    kvp_transfer_unregister(x, src, gone.tp_regs);
    assert_int_equal(fakes[1].regs, 1);
    kvp_peer_unref(pa);
    kvp_peer_unref(pb);
    kvp_peer_unref(pc);
    /* the last reference detaches each peer from the transport that attached it */
    for (int t = 0; t < 3; t++)
        assert_int_equal(fakes[t].detaches, 1);
    xfer_free(x); /* deregisters dst */
    assert_int_equal(fakes[1].regs, 0);
}

/* A forced transport is the only one created: a peer it cannot reach fails with
 * KVP_ERR_TRANSPORT, nothing falls back. */
static void test_forced(void **state)
{
    (void)state;
    kvp_transfer_t *x = xfer_new(KVP_TRANSPORT_SHM);
    assert_int_equal(x->n_tps, 1);
    assert_true(fakes[0].created);
    assert_false(fakes[1].created);
    assert_false(fakes[2].created);
    kvp_peer_t *far = peer_new(7, "far", "bc"), *near = peer_new(8, "near", "a");
    uint8_t buf[64], back[64];
    fill(buf, sizeof(buf), 9);
    kvp_xfer_op_t ops[2] = {op_of(KVP_XFER_WRITE, far, buf, 0, 64),
                            op_of(KVP_XFER_WRITE, near, buf, 0, 64)};
    kvp_transfer_run(x, ops, 2);
    assert_int_equal(ops[0].status, KVP_ERR_TRANSPORT);
    assert_int_equal(ops[1].status, KVP_OK);
    assert_int_equal(kvp_transfer_route(x, far), KVP_TRANSPORT_AUTO);
    assert_int_equal(fakes[0].ops, 1);
    /* a transport failure under a forced transport is not re-chosen either */
    fakes[0].fail_peer = "near";
    fakes[0].fail_status = KVP_ERR_TRANSPORT;
    atomic_store(&fakes[0].fail_left, 1);
    ops[1] = op_of(KVP_XFER_READ, near, back, 0, 64);
    kvp_transfer_run(x, &ops[1], 1);
    assert_int_equal(ops[1].status, KVP_ERR_TRANSPORT);
    assert_int_equal(kvp_transfer_route(x, near), KVP_TRANSPORT_SHM);
    kvp_transfer_run(x, &ops[1], 1);
    assert_int_equal(ops[1].status, KVP_OK);
    assert_memory_equal(back, buf, 64);
    kvp_peer_unref(far);
    kvp_peer_unref(near);
    assert_int_equal(fakes[0].detaches, 1);
    xfer_free(x);

    /* forcing a transport that is not in the list: no transport, init fails */
    kvp_transfer_t y = {.forced = (kvp_transport_id_t)9, .list = fake_list};
    assert_int_not_equal(kvp_transfer_init(&y), KVP_OK);
}

/* KVP_ERR_TRANSPORT from the peer's transport: the engine chooses again from the next
 * transports and retries the op once, in the same call; later batches go to the new one.
 * Other failures keep the transport. */
static void test_rechoose(void **state)
{
    (void)state;
    kvp_transfer_t *x = xfer_new(KVP_TRANSPORT_AUTO);
    kvp_peer_t *flaky = peer_new(11, "flaky", "ac"), *slow = peer_new(12, "slow", "ac");
    assert_int_equal(kvp_transfer_route(x, flaky), KVP_TRANSPORT_SHM);
    fakes[0].fail_peer = "flaky";
    fakes[0].fail_status = KVP_ERR_TRANSPORT;
    atomic_store(&fakes[0].fail_left, -1);
    uint8_t buf[256], back[256];
    fill(buf, sizeof(buf), 3);
    kvp_xfer_op_t ops[2] = {op_of(KVP_XFER_WRITE, flaky, buf, 64, 256),
                            op_of(KVP_XFER_WRITE, slow, buf, 64, 256)};
    kvp_transfer_run(x, ops, 2);
    assert_int_equal(ops[0].status, KVP_OK);
    assert_int_equal(ops[0].crc, kvp_crc32c(0, buf, 256));
    assert_int_equal(ops[1].status, KVP_OK);
    assert_int_equal(kvp_transfer_route(x, flaky), KVP_TRANSPORT_TCP);
    assert_int_equal(fakes[0].ops, 2); /* flaky's failed try, slow */
    assert_int_equal(fakes[2].ops, 1); /* flaky's retry */
    /* from now on straight to fc */
    ops[0] = op_of(KVP_XFER_READ, flaky, back, 64, 256);
    kvp_transfer_run(x, ops, 1);
    assert_int_equal(ops[0].status, KVP_OK);
    assert_memory_equal(back, buf, 256);
    assert_int_equal(fakes[0].ops, 2);
    assert_int_equal(fakes[2].ops, 2);

    /* a timeout is the peer's failure, not the transport's: kept, no retry */
    fakes[0].fail_peer = "slow";
    fakes[0].fail_status = KVP_ERR_TIMEOUT;
    atomic_store(&fakes[0].fail_left, 1);
    ops[1] = op_of(KVP_XFER_READ, slow, back, 64, 256);
    kvp_transfer_run(x, &ops[1], 1);
    assert_int_equal(ops[1].status, KVP_ERR_TIMEOUT);
    assert_int_equal(kvp_transfer_route(x, slow), KVP_TRANSPORT_SHM);
    assert_int_equal(fakes[2].ops, 2);
    memset(back, 0, sizeof(back));
    kvp_transfer_run(x, &ops[1], 1);
    assert_int_equal(ops[1].status, KVP_OK);
    assert_memory_equal(back, buf, 256);

    /* the last transport failing: nothing after it, the failure stays */
    fakes[2].fail_peer = "flaky";
    fakes[2].fail_status = KVP_ERR_TRANSPORT;
    atomic_store(&fakes[2].fail_left, 1);
    kvp_transfer_run(x, ops, 1);
    assert_int_equal(ops[0].status, KVP_ERR_TRANSPORT);
    assert_int_equal(kvp_transfer_route(x, flaky), KVP_TRANSPORT_TCP);

    kvp_peer_unref(flaky);
    kvp_peer_unref(slow);
    /* flaky had two attached transports (fa, kept until the end, and fc); slow one */
    assert_int_equal(fakes[0].detaches, 2);
    assert_int_equal(fakes[2].detaches, 1);
    xfer_free(x);
}

/* An op a transport hands on (op->pass: it cannot carry that op, it keeps the peer, as rdma
 * does with a range the target offers no key for) runs on the next transport of the list that
 * reaches its peer, once, and the peer's transport stays; one handed on by the last that
 * reaches the peer keeps KVP_ERR_TRANSPORT; a transport handed an op may hand it on again
 * (staged, at level 1, too); the others of the batch are unaffected. */
static void test_pass_hands_one_op_on(void **state)
{
    (void)state;
    kvp_transfer_t *x = xfer_new(KVP_TRANSPORT_AUTO);
    kvp_peer_t *ac = peer_new(31, "ac", "ac"), *a = peer_new(32, "a", "a"),
               *abc = peer_new(33, "abc", "abc");
    fakes[0].pass_from = SEG / 2;
    uint8_t buf[512], back[512];
    fill(buf, sizeof(buf), 8);
    kvp_xfer_op_t ops[4] = {op_of(KVP_XFER_WRITE, ac, buf, 0, 256),
                            op_of(KVP_XFER_WRITE, ac, buf + 256, SEG / 2 + 64, 256),
                            op_of(KVP_XFER_WRITE, a, buf, SEG / 2, 128),
                            op_of(KVP_XFER_WRITE, a, buf, 64, 128)};
    kvp_transfer_run(x, ops, 4);
    assert_int_equal(ops[0].status, KVP_OK);
    assert_int_equal(ops[1].status, KVP_OK); /* on fc */
    assert_int_equal(ops[1].crc, kvp_crc32c(0, buf + 256, 256));
    assert_int_equal(ops[2].status, KVP_ERR_TRANSPORT); /* none after fa reaches "a" */
    assert_false(ops[2].pass);
    assert_int_equal(ops[3].status, KVP_OK);
    assert_int_equal(fakes[0].passed, 2);
    assert_int_equal(fakes[0].ops, 4);
    assert_int_equal(fakes[2].ops, 1);
    assert_int_equal(fakes[1].ops, 0);
    /* the peers' transports did not move */
    assert_int_equal(kvp_transfer_route(x, ac), KVP_TRANSPORT_SHM);
    assert_int_equal(kvp_transfer_route(x, a), KVP_TRANSPORT_SHM);
    /* what fc holds for ac is what was written; fa's half too */
    ops[0] = op_of(KVP_XFER_READ, ac, back, SEG / 2 + 64, 256);
    ops[1] = op_of(KVP_XFER_READ, ac, back + 256, 0, 256);
    kvp_transfer_run(x, ops, 2);
    assert_int_equal(ops[0].status, KVP_OK);
    assert_int_equal(ops[1].status, KVP_OK);
    assert_memory_equal(back, buf + 256, 256);
    assert_memory_equal(back + 256, buf, 256);
    assert_int_equal(fakes[2].ops, 2);

    /* twice: fa hands on to fb (which stages an unregistered buffer), fb hands on to fc */
    fakes[1].pass_from = SEG / 2;
    ops[0] = op_of(KVP_XFER_WRITE, abc, buf, SEG / 2 + 8, 512);
    kvp_transfer_run(x, ops, 1);
    assert_int_equal(ops[0].status, KVP_OK);
    assert_int_equal(fakes[1].passed, 1);
    assert_int_equal(fakes[2].ops, 3);
    assert_int_equal(kvp_transfer_route(x, abc), KVP_TRANSPORT_SHM);
    memset(back, 0, sizeof(back));
    ops[0] = op_of(KVP_XFER_READ, abc, back, SEG / 2 + 8, 512);
    kvp_transfer_run(x, ops, 1);
    assert_int_equal(ops[0].status, KVP_OK);
    assert_memory_equal(back, buf, 512);

    kvp_peer_unref(ac);
    kvp_peer_unref(a);
    kvp_peer_unref(abc);
    /* ac attached to fa and fc, abc to all three, a to fa */
    assert_int_equal(fakes[0].detaches, 3);
    assert_int_equal(fakes[1].detaches, 1);
    assert_int_equal(fakes[2].detaches, 2);
    xfer_free(x);
}

/* A scripted status comes back on its op only; the others of the batch are unaffected. */
static void test_status_passthrough(void **state)
{
    (void)state;
    kvp_transfer_t *x = xfer_new(KVP_TRANSPORT_AUTO);
    kvp_peer_t *bad = peer_new(21, "bad", "c"), *good = peer_new(22, "good", "c");
    fakes[2].fail_peer = "bad";
    fakes[2].fail_status = KVP_ERR_IO;
    atomic_store(&fakes[2].fail_left, -1);
    uint8_t buf[128];
    fill(buf, sizeof(buf), 5);
    kvp_xfer_op_t ops[3] = {op_of(KVP_XFER_WRITE, good, buf, 0, 128),
                            op_of(KVP_XFER_WRITE, bad, buf, 0, 128),
                            op_of(KVP_XFER_WRITE, good, buf, 128, 100)};
    ops[2].want_crc = false;
    ops[2].crc = 0x1234;
    kvp_transfer_run(x, ops, 3);
    assert_int_equal(ops[0].status, KVP_OK);
    assert_int_equal(ops[0].crc, kvp_crc32c(0, buf, 128));
    assert_int_equal(ops[1].status, KVP_ERR_IO);
    assert_int_equal(ops[2].status, KVP_OK);
    assert_int_equal(ops[2].crc, 0x1234); /* no CRC asked: untouched */
    assert_int_equal(kvp_transfer_route(x, bad), KVP_TRANSPORT_TCP);
    kvp_peer_unref(bad);
    kvp_peer_unref(good);
    xfer_free(x);
}

/* Big batches (beyond any fixed stack array) run whole, twice (the scratch is kept). */
static void test_large_batch(void **state)
{
    (void)state;
    kvp_transfer_t *x = xfer_new(KVP_TRANSPORT_AUTO);
    kvp_peer_t *pa = peer_new(31, "pa", "a"), *pc = peer_new(32, "pc", "c");
    enum { N = 1000 };
    static uint8_t src[N * 16], dst[N * 16];
    static kvp_xfer_op_t ops[N];
    fill(src, sizeof(src), 77);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++)
            ops[i] = op_of(KVP_XFER_WRITE, i % 3 ? pa : pc, src + i * 16, (uint64_t)i * 16, 16);
        kvp_transfer_run(x, ops, N);
        for (int i = 0; i < N; i++)
            assert_int_equal(ops[i].status, KVP_OK);
        for (int i = 0; i < N; i++)
            ops[i] = op_of(KVP_XFER_READ, i % 3 ? pa : pc, dst + i * 16, (uint64_t)i * 16, 16);
        kvp_transfer_run(x, ops, N);
        for (int i = 0; i < N; i++)
            assert_int_equal(ops[i].status, KVP_OK);
        assert_memory_equal(dst, src, sizeof(src));
        memset(dst, 0, sizeof(dst));
    }
    assert_int_equal(fakes[0].submits, 4);
    assert_int_equal(fakes[2].submits, 4);
    kvp_peer_unref(pa);
    kvp_peer_unref(pc);
    xfer_free(x);
}

/* Host memory fb cannot reach (not registered) is staged: fb sees staging buffers, the
 * bytes and CRCs are right. Threads staging at once take different stagers from the
 * pool, never more than KVP_STAGERS_MAX. */
typedef struct stage_arg {
    kvp_transfer_t *x;
    kvp_peer_t *p;
    unsigned id;
    int bad;
} stage_arg_t;

static void *stage_thread(void *v)
{
    stage_arg_t *a = v;
    enum { LEN = 3000 };
    uint8_t *src = malloc(LEN), *dst = malloc(LEN);
    for (int round = 0; round < 20; round++) {
        fill(src, LEN, a->id * 100 + (unsigned)round);
        uint64_t off = a->id * (SEG / 8);
        kvp_xfer_op_t w = op_of(KVP_XFER_WRITE, a->p, src, off, LEN);
        kvp_transfer_run(a->x, &w, 1);
        memset(dst, 0, LEN);
        kvp_xfer_op_t r = op_of(KVP_XFER_READ, a->p, dst, off, LEN);
        kvp_transfer_run(a->x, &r, 1);
        if (w.status != KVP_OK || r.status != KVP_OK || memcmp(src, dst, LEN) != 0 ||
            w.crc != kvp_crc32c(0, src, LEN) || r.crc != w.crc)
            a->bad++;
    }
    free(src);
    free(dst);
    return NULL;
}

static void test_staged_pool(void **state)
{
    (void)state;
    kvp_transfer_t *x = xfer_new(KVP_TRANSPORT_AUTO);
    kvp_peer_t *pb = peer_new(41, "pb", "b");
    uint8_t src[500], dst[500];
    fill(src, sizeof(src), 1);
    kvp_xfer_op_t op = op_of(KVP_XFER_WRITE, pb, src, 10, sizeof(src));
    kvp_transfer_run(x, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_int_equal(op.crc, kvp_crc32c(0, src, sizeof(src)));
    assert_ptr_not_equal(fakes[1].last_local, src); /* a staging buffer */
    assert_int_equal(x->stagers.n[KVP_STAGE_POOL_HOST], 1);
    assert_int_equal(x->stagers.n_free[KVP_STAGE_POOL_HOST], 1); /* given back */
    op = op_of(KVP_XFER_READ, pb, dst, 10, sizeof(dst));
    kvp_transfer_run(x, &op, 1);
    assert_int_equal(op.status, KVP_OK);
    assert_memory_equal(dst, src, sizeof(src));
    assert_int_equal(x->stagers.n[KVP_STAGE_POOL_HOST], 1); /* reused */

    enum { T = 8 };
    pthread_t th[T];
    stage_arg_t args[T];
    for (unsigned i = 0; i < T; i++) {
        args[i] = (stage_arg_t){.x = x, .p = pb, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, stage_thread, &args[i]), 0);
    }
    for (unsigned i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    assert_true(x->stagers.n[KVP_STAGE_POOL_HOST] >= 1);
    assert_true(x->stagers.n[KVP_STAGE_POOL_HOST] <= KVP_STAGERS_MAX);
    assert_int_equal(x->stagers.n_free[KVP_STAGE_POOL_HOST], x->stagers.n[KVP_STAGE_POOL_HOST]);
    assert_int_equal(x->stagers.n[KVP_STAGE_POOL_GPU_NEAR], 0);
    assert_int_equal(x->stagers.n[KVP_STAGE_POOL_GPU_FAR], 0);
    kvp_peer_unref(pb);
    xfer_free(x);
    assert_int_equal(fakes[1].regs, 0); /* staging buffers deregistered */
}

/* The registry: a lookup finds the region holding all of a range, nothing else. */
static void test_registry_lookup(void **state)
{
    (void)state;
    kvp_mem_registry_t reg;
    kvp_mem_registry_init(&reg);
    assert_null(kvp_mem_lookup(&reg, (void *)0x1000, 1));
    kvp_mem_region_t rs[] = {{.addr = 0x3000, .len = 0x1000, .kind = KVP_MEM_CUDA},
                             {.addr = 0x1000, .len = 0x1000, .kind = KVP_MEM_HOST},
                             {.addr = 0x5000, .len = 0x100, .kind = KVP_MEM_HOST, .tp_regs = 4}};
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvp_mem_insert_locked(&reg, &rs[i]), KVP_OK);
    assert_true(kvp_mem_overlaps_locked(&reg, 0x1fff, 2));
    assert_true(kvp_mem_overlaps_locked(&reg, 0x0, 0x1001));
    assert_false(kvp_mem_overlaps_locked(&reg, 0x2000, 0x1000));
    const kvp_mem_region_t *r = kvp_mem_lookup(&reg, (void *)0x3000, 0x1000);
    assert_non_null(r);
    assert_int_equal(r->kind, KVP_MEM_CUDA);
    assert_null(kvp_mem_lookup(&reg, (void *)0x3001, 0x1000)); /* runs past the end */
    assert_null(kvp_mem_lookup(&reg, (void *)0x2fff, 1));
    assert_null(kvp_mem_lookup(&reg, (void *)0x4000, 1));
    r = kvp_mem_lookup(&reg, (void *)0x50ff, 1);
    assert_non_null(r);
    assert_int_equal(r->tp_regs, 4);
    r = kvp_mem_lookup(&reg, (void *)0x1800, 0x10);
    assert_non_null(r);
    assert_int_equal(r->addr, 0x1000);
    kvp_mem_region_t out;
    assert_int_equal(kvp_mem_remove_locked(&reg, 0x1000, &out), KVP_OK);
    assert_int_equal(out.len, 0x1000);
    assert_int_equal(kvp_mem_remove_locked(&reg, 0x1000, &out), KVP_ERR_NOT_FOUND);
    assert_null(kvp_mem_lookup(&reg, (void *)0x1800, 0x10));
    assert_non_null(kvp_mem_lookup(&reg, (void *)0x3800, 0x10));
    kvp_mem_registry_cleanup(&reg);
}

/* Descriptors from the master's answers (peer_table.c, kvp_peers_update): one that differs
 * from the peer known under its id replaces it; one of a segment with grants that carries
 * no connection key says nothing of the key, and the keyed peer stays (a keyless peer put in
 * between a get's answer and its transfer opened data connections with no HELLO, which the
 * owner refused: the failover bench with TLS lost whole rounds to it). */
static void test_peers_keep_their_connection_key(void **state)
{
    (void)state;
    kvp_transfer_t *x = xfer_new(KVP_TRANSPORT_AUTO);
    kvp_peers_t peers;
    kvp_peers_init(&peers, x, 7);
    uint8_t key[32], key2[32];
    memset(key, 0x5a, sizeof(key));
    memset(key2, 0xa5, sizeof(key2));
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.id = 9;
    d.name = "seg";
    d.medium = "dram";
    d.size = SEG;
    d.owner_client_id = 3;
    d.host_id = "c";
    d.tcp_endpoint = "127.0.0.1:1";
    d.grants = true;
    d.conn_key.data = key;
    d.conn_key.len = sizeof(key);
    d.conn_tag = 0x4447;
    Kvpool__SegmentDesc *dp = &d;
    kvp_peers_update(&peers, &dp, 1);
    kvp_peer_t *p = kvp_peers_get(&peers, 9);
    assert_non_null(p);
    assert_true(p->has_conn_key);
    assert_memory_equal(p->conn_key, key, sizeof(key));
    /* the same segment without our key (a keyless answer): the same peer, its key kept */
    Kvpool__SegmentDesc bare = d;
    bare.conn_key.data = NULL;
    bare.conn_key.len = 0;
    bare.conn_tag = 0;
    dp = &bare;
    kvp_peers_update(&peers, &dp, 1);
    kvp_peer_t *q = kvp_peers_get(&peers, 9);
    assert_ptr_equal(q, p);
    assert_true(q->has_conn_key);
    kvp_peer_unref(q);
    /* another key (a remount): a new peer with it */
    d.conn_key.data = key2;
    dp = &d;
    kvp_peers_update(&peers, &dp, 1);
    q = kvp_peers_get(&peers, 9);
    assert_ptr_not_equal(q, p);
    assert_true(q->has_conn_key);
    assert_memory_equal(q->conn_key, key2, sizeof(key2));
    kvp_peer_unref(q);
    kvp_peer_unref(p);
    /* without grants the segment has no key: a peer without one */
    bare.grants = false;
    dp = &bare;
    kvp_peers_update(&peers, &dp, 1);
    q = kvp_peers_get(&peers, 9);
    assert_false(q->has_conn_key);
    assert_false(q->grants);
    kvp_peer_unref(q);
    kvp_peers_cleanup(&peers);
    xfer_free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_priority_and_spread),
        cmocka_unit_test(test_forced),
        cmocka_unit_test(test_rechoose),
        cmocka_unit_test(test_pass_hands_one_op_on),
        cmocka_unit_test(test_status_passthrough),
        cmocka_unit_test(test_large_batch),
        cmocka_unit_test(test_staged_pool),
        cmocka_unit_test(test_registry_lookup),
        cmocka_unit_test(test_peers_keep_their_connection_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
