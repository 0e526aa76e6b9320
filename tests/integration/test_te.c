/*
 * test_te.c - the transfer engine (kvpool_te.h) in one process, and a hostile peer on its
 * wire (docs/protocol.md, "Data plane, transfer engine"):
 *   - two engines, tcp and shm: a batch of ranges written and read back, byte-exact; the
 *     counters of both sides;
 *   - a WRITEV chain whose second range leaves the registered memory is refused whole
 *     (KVP_ERR_OUT_OF_RANGE): its first, valid range is not written either;
 *   - a request naming another segment id is KVP_ERR_SEGMENT_GONE;
 *   - after kvp_te_unregister returns, a write into that range is refused, while other
 *     threads keep writing into it until then;
 *   - a target nobody listens on fails fast (KVP_ERR_CONNECT); an async batch's status;
 *     protocol rdma on a host without a device is KVP_ERR_TRANSPORT.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "client/include/kvpool_te.h"
#include "client/transport/rdma_status.h"
#include "client/transport/wire.h"
#include "tests/harness.h"

#define TE_SEG_ID 0x4b56505445ull
#define MIB (1u << 20)

static void target_of(kvp_te_t *te, char *buf, size_t len)
{
    snprintf(buf, len, "127.0.0.1:%u", kvp_te_rpc_port(te));
}

static void roundtrip(const char *proto)
{
    kvp_te_t *a, *b;
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", proto, &a), KVP_OK);
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", proto, &b), KVP_OK);
    uint8_t *dst = calloc(1, 4 * MIB), *src = malloc(4 * MIB), *back = calloc(1, 4 * MIB);
    kvp_fill_pattern(src, 4 * MIB, 7);
    assert_int_equal(kvp_te_register(a, dst, 4 * MIB), KVP_OK);
    char t[64];
    target_of(a, t, sizeof(t));
    /* what the target registered, asked over the wire (REGIONS) */
    uint64_t ra[4], rl[4];
    size_t rn;
    assert_int_equal(kvp_te_remote_regions(b, t, ra, rl, 4, &rn), KVP_OK);
    assert_int_equal(rn, 1);
    assert_int_equal(ra[0], (uintptr_t)dst);
    assert_int_equal(rl[0], 4 * MIB);
    /* 64 ranges: every 64 KiB piece of src to the mirrored place in dst */
    void *locals[64], *backs[64];
    uint64_t remotes[64], lens[64];
    for (int i = 0; i < 64; i++) {
        locals[i] = src + (size_t)i * 65536;
        backs[i] = back + (size_t)i * 65536;
        remotes[i] = (uintptr_t)(dst + (size_t)(63 - i) * 65536);
        lens[i] = 65536;
    }
    assert_int_equal(kvp_te_transfer(b, t, KVP_TE_WRITE, 64, locals, remotes, lens), KVP_OK);
    for (int i = 0; i < 64; i++)
        assert_memory_equal(dst + (size_t)(63 - i) * 65536, src + (size_t)i * 65536, 65536);
    assert_int_equal(kvp_te_transfer(b, t, KVP_TE_READ, 64, backs, remotes, lens), KVP_OK);
    assert_memory_equal(back, src, 4 * MIB);
    kvp_te_counters_t ca, cb;
    kvp_te_get_counters(a, &ca);
    kvp_te_get_counters(b, &cb);
    assert_int_equal(cb.transfers[KVP_TE_WRITE], 64);
    assert_int_equal(cb.bytes[KVP_TE_READ], 4 * MIB);
    assert_int_equal(ca.served_bytes[KVP_TE_WRITE], 4 * MIB);
    assert_int_equal(ca.refused_range, 0);
    /* async: one batch, its status once done, then forgotten */
    uint64_t id;
    assert_int_equal(kvp_te_submit(b, t, KVP_TE_WRITE, 1, locals, remotes, lens, &id), KVP_OK);
    assert_int_equal(kvp_te_status(b, id, 10000), 1);
    assert_int_equal(kvp_te_status(b, id, 0), KVP_ERR_NOT_FOUND);
    kvp_te_destroy(b);
    kvp_te_destroy(a);
    free(dst);
    free(src);
    free(back);
}

static void test_roundtrip_tcp(void **state)
{
    (void)state;
    roundtrip("tcp");
}

static void test_roundtrip_shm(void **state)
{
    (void)state;
    roundtrip("shm");
}

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static void recv_exact(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, (uint8_t *)buf + got, len - got, 0);
        assert_true(n > 0);
        got += (size_t)n;
    }
}

static void test_chain_is_refused_whole(void **state)
{
    (void)state;
    kvp_te_t *a;
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", "tcp", &a), KVP_OK);
    uint8_t *mem = calloc(1, 8192);
    assert_int_equal(kvp_te_register(a, mem, 8192), KVP_OK);
    int fd = raw_connect(kvp_te_rpc_port(a));
    /* WRITEV of two ranges: [mem, +100) inside, [mem + 8000, +400) past the end */
    /* WRITEV: the header's offset field is the entry count, its length the total */
    kvp_data_req_t req = {
        .magic = KVP_DATA_MAGIC, .op = KVP_DATA_WRITEV, .offset = 2, .length = 500};
    kvp_data_vec_t v[2] = {
        {.segment_id = TE_SEG_ID, .offset = (uintptr_t)mem, .length = 100},
        {.segment_id = TE_SEG_ID, .offset = (uintptr_t)mem + 8000, .length = 400}};
    uint8_t payload[500];
    memset(payload, 0x5A, sizeof(payload));
    assert_int_equal(send(fd, &req, sizeof(req), 0), (ssize_t)sizeof(req));
    assert_int_equal(send(fd, v, sizeof(v), 0), (ssize_t)sizeof(v));
    (void)send(fd, payload, sizeof(payload), MSG_NOSIGNAL);
    kvp_data_resp_t r;
    recv_exact(fd, &r, sizeof(r));
    assert_int_equal(r.status, KVP_ERR_OUT_OF_RANGE);
    for (int i = 0; i < 8192; i++)
        assert_int_equal(mem[i], 0); /* the valid first range was not written either */
    close(fd);
    /* another segment id: SEGMENT_GONE (a READ: the connection goes on) */
    fd = raw_connect(kvp_te_rpc_port(a));
    kvp_data_req_t rd = {.magic = KVP_DATA_MAGIC,
                         .op = KVP_DATA_READ,
                         .segment_id = 1,
                         .offset = (uintptr_t)mem,
                         .length = 16};
    assert_int_equal(send(fd, &rd, sizeof(rd), 0), (ssize_t)sizeof(rd));
    recv_exact(fd, &r, sizeof(r));
    assert_int_equal(r.status, KVP_ERR_SEGMENT_GONE);
    rd.segment_id = TE_SEG_ID;
    assert_int_equal(send(fd, &rd, sizeof(rd), 0), (ssize_t)sizeof(rd));
    recv_exact(fd, &r, sizeof(r));
    assert_int_equal(r.status, KVP_OK);
    uint8_t got[16];
    recv_exact(fd, got, 16);
    close(fd);
    kvp_te_counters_t c;
    kvp_te_get_counters(a, &c);
    assert_int_equal(c.refused_range, 1);
    kvp_te_destroy(a);
    free(mem);
}

typedef struct writer {
    kvp_te_t *te;
    char target[64];
    uint8_t *dst;
    atomic_bool stop;
    atomic_int ok, refused;
} writer_t;

static void *writer_main(void *arg)
{
    writer_t *w = arg;
    uint8_t buf[65536];
    memset(buf, 0x77, sizeof(buf));
    void *loc = buf;
    uint64_t rem = (uintptr_t)w->dst, len = sizeof(buf);
    while (!atomic_load(&w->stop)) {
        kvp_status_t st = kvp_te_transfer(w->te, w->target, KVP_TE_WRITE, 1, &loc, &rem, &len);
        if (st == KVP_OK)
            atomic_fetch_add(&w->ok, 1);
        else
            atomic_fetch_add(&w->refused, 1);
    }
    return NULL;
}

static void test_unregister_waits_and_then_refuses(void **state)
{
    (void)state;
    kvp_te_t *a, *b;
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", "tcp", &a), KVP_OK);
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", "tcp", &b), KVP_OK);
    uint8_t *dst = calloc(1, 65536);
    assert_int_equal(kvp_te_register(a, dst, 65536), KVP_OK);
    assert_int_equal(kvp_te_register(a, dst + 100, 10), KVP_ERR_INVALID_ARG); /* overlap */
    assert_int_equal((uintptr_t)kvp_te_first_buffer(a), (uintptr_t)dst);
    writer_t w = {.te = b, .dst = dst};
    target_of(a, w.target, sizeof(w.target));
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, writer_main, &w);
    while (atomic_load(&w.ok) < 20)
        usleep(1000);
    assert_int_equal(kvp_te_unregister(a, dst), KVP_OK);
    memset(dst, 0, 65536); /* no byte may land after this */
    usleep(200000);
    atomic_store(&w.stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 65536; i++)
        assert_int_equal(dst[i], 0);
    assert_true(atomic_load(&w.refused) > 0);
    assert_int_equal(kvp_te_unregister(a, dst), KVP_ERR_NOT_FOUND);
    kvp_te_destroy(b);
    kvp_te_destroy(a);
    free(dst);
}

static void test_nobody_there(void **state)
{
    (void)state;
    kvp_te_t *a, *b;
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", "tcp", &a), KVP_OK);
    char t[64];
    target_of(a, t, sizeof(t));
    kvp_te_destroy(a); /* its port now closed */
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", "tcp", &b), KVP_OK);
    uint8_t buf[64];
    void *loc = buf;
    uint64_t rem = 4096, len = sizeof(buf);
    assert_int_equal(kvp_te_transfer(b, t, KVP_TE_WRITE, 1, &loc, &rem, &len), KVP_ERR_CONNECT);
    assert_int_equal(kvp_te_transfer(b, "no-port", KVP_TE_WRITE, 1, &loc, &rem, &len),
                     KVP_ERR_INVALID_ARG);
    kvp_te_destroy(b);
    assert_int_equal(kvp_te_create("127.0.0.1", "etcd://x:2379", "tcp", &a), KVP_ERR_UNSUPPORTED);
    /* rdma needs a device (tests/rdma/test_te_rdma.c has one, in the Soft-RoCE VM) */
    if (!kvp_rdma_devices_present())
        assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", "rdma", &a), KVP_ERR_TRANSPORT);
}

int main(void)
{
    /* raw frames without TE_AUTH: no credentials (a TLS pass's would make them DENIED) */
    unsetenv("KVPOOL_TLS_CA");
    unsetenv("KVPOOL_TLS_CERT");
    unsetenv("KVPOOL_TLS_KEY");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_tcp),
        cmocka_unit_test(test_roundtrip_shm),
        cmocka_unit_test(test_chain_is_refused_whole),
        cmocka_unit_test(test_unregister_waits_and_then_refuses),
        cmocka_unit_test(test_nobody_there),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
