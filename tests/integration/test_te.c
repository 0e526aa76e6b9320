/*
 * test_te.c - the transfer engine (kvpool_te.h) in one process, and a hostile peer on its
 * wire (docs/protocol.md, "Data plane, transfer engine"):
 *   - two engines, tcp and shm: a batch of ranges written and read back, byte-exact; the
 *     counters of both sides;
 *   - a WRITEV chain whose second range leaves the registered memory is refused whole
 *     (KVP_ERR_OUT_OF_RANGE): its first, valid range is not written either;
 *   - a request naming another segment id is KVP_ERR_SEGMENT_GONE;
 *   - after kvp_te_unregister returns, a write into that range is refused, while other
 *     threads keep writing into it until then (tcp; shm under the target's standing lease
 *     and per batch);
 *   - the lease on the wire: the area follows the registered ranges, is sealed, and a
 *     peer's busy mark holds an unregister until cleared or its connection closes;
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
#include <sys/mman.h>
#include <sys/socket.h>

#include "client/include/kvpool_te.h"
#include "client/te/te_lease.h"
#include "client/transport/rdma_status.h"
#include "client/transport/wire.h"
#include "common/clock.h"
#include "common/sock.h"
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
    /* shm: under the target's standing lease where this host allows one (te_lease.h) */
    bool leased = strcmp(proto, "shm") == 0 && kvp_te_lease_allowed();
    assert_int_equal(ca.served_lease[KVP_TE_WRITE], leased ? 64 : 0);
    assert_int_equal(ca.served_lease[KVP_TE_READ], leased ? 64 : 0);
    assert_int_equal(ca.leases, leased ? 1 : 0);
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

/* shm_mode: KVPOOL_TE_SHM of both engines (NULL: unset) */
static void unregister_case(const char *proto, const char *shm_mode)
{
    kvp_te_t *a, *b;
    if (shm_mode != NULL)
        setenv("KVPOOL_TE_SHM", shm_mode, 1);
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", proto, &a), KVP_OK);
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", proto, &b), KVP_OK);
    unsetenv("KVPOOL_TE_SHM");
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
    /* and writers have been refused (a loaded machine may not have run them yet) */
    for (uint64_t until = kvp_now_ms() + 10000;
         atomic_load(&w.refused) == 0 && kvp_now_ms() < until;)
        usleep(1000);
    atomic_store(&w.stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 65536; i++)
        assert_int_equal(dst[i], 0);
    assert_true(atomic_load(&w.refused) > 0);
    kvp_te_counters_t c;
    kvp_te_get_counters(a, &c);
    bool leased = strcmp(proto, "shm") == 0 && shm_mode == NULL && kvp_te_lease_allowed();
    assert_true(leased ? c.served_lease[KVP_TE_WRITE] > 0 : c.served_lease[KVP_TE_WRITE] == 0);
    assert_int_equal(kvp_te_unregister(a, dst), KVP_ERR_NOT_FOUND);
    kvp_te_destroy(b);
    kvp_te_destroy(a);
    free(dst);
}

static void test_unregister_waits_and_then_refuses(void **state)
{
    (void)state;
    unregister_case("tcp", NULL);
}

/* the same over shm: writers under the target's standing lease (te_lease.h), whose
 * unregister waits for a copy under the old regions; and per batch (cma-checked) */
static void test_unregister_waits_and_then_refuses_shm_lease(void **state)
{
    (void)state;
    unregister_case("shm", NULL);
}

static void test_unregister_waits_and_then_refuses_shm_checked(void **state)
{
    (void)state;
    unregister_case("shm", "cma-checked");
}

/* Ask engine te's Unix socket for a lease, as a peer of ours would: its status, the two
 * memfds (fds[0..*n_p)) on *fd_p's answer. */
static int32_t lease_ask_raw(kvp_te_t *te, int *fd_p, int fds[2], size_t *n_p)
{
    char name[64];
    snprintf(name, sizeof(name), "kvpool-te-%u", kvp_te_rpc_port(te));
    assert_int_equal(kvp_unix_connect(name, 5000, fd_p), KVP_OK);
    kvp_data_req_t req = {.magic = KVP_DATA_MAGIC,
                          .op = KVP_DATA_TE_CMA,
                          .flags = KVP_DATA_TE_CMA_LEASE,
                          .segment_id = TE_SEG_ID};
    assert_int_equal(send(*fd_p, &req, sizeof(req), 0), (ssize_t)sizeof(req));
    kvp_data_resp_t r;
    assert_int_equal(kvp_unix_recv_fds(*fd_p, &r, sizeof(r), fds, 2, n_p), KVP_OK);
    assert_int_equal(r.magic, KVP_DATA_MAGIC);
    return r.status;
}

typedef struct unreg {
    kvp_te_t *te;
    void *addr;
    atomic_bool done;
    kvp_status_t st;
} unreg_t;

static void *unreg_main(void *arg)
{
    unreg_t *u = arg;
    u->st = kvp_te_unregister(u->te, u->addr);
    atomic_store(&u->done, true);
    return NULL;
}

/* until *p differs from old, at most ms */
static uint64_t wait_change(const uint64_t *p, uint64_t old, int ms)
{
    uint64_t v = old;
    for (int i = 0; i < ms && (v = __atomic_load_n(p, __ATOMIC_SEQ_CST)) == old; i++)
        usleep(1000);
    return v;
}

/* The lease on the wire (wire.h, KVP_DATA_TE_CMA_LEASE), as a peer of ours sees it: the
 * ranges' memfd lists what is registered, follows a register and an unregister, and cannot
 * be written, shrunk or grown by the peer; the slot's cannot be resized; a slot marked busy
 * under the ranges of before holds an unregister until unmarked, also once its connection
 * closed (revoked: the peer may still be copying); the slot's counts are the target's
 * served_lease; cma-checked grants none. */
static void test_lease_on_the_wire(void **state)
{
    (void)state;
    if (!kvp_te_lease_allowed()) {
        print_message("no leases here (Yama ptrace_scope > 0 or not dumpable): skipped\n");
        skip();
    }
    kvp_te_t *a;
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", "shm", &a), KVP_OK);
    uint8_t *mem = calloc(1, 65536), *mem2 = calloc(1, 4096);
    assert_int_equal(kvp_te_register(a, mem, 65536), KVP_OK);
    int fd, fds[2];
    size_t nfd;
    assert_int_equal(lease_ask_raw(a, &fd, fds, &nfd), KVP_OK);
    assert_int_equal(nfd, 2);
    const size_t rsz = sizeof(kvp_data_te_lease_regions_t);
    assert_true(mmap(NULL, rsz, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0) == MAP_FAILED);
    assert_int_equal(write(fds[0], "x", 1), -1);
    assert_int_equal(ftruncate(fds[0], 0), -1);
    assert_int_equal(ftruncate(fds[1], 0), -1);
    assert_int_equal(ftruncate(fds[1], 1 << 20), -1);
    const kvp_data_te_lease_regions_t *area = mmap(NULL, rsz, PROT_READ, MAP_SHARED, fds[0], 0);
    kvp_data_te_lease_slot_t *slot =
        mmap(NULL, sizeof(*slot), PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
    assert_true(area != MAP_FAILED && slot != MAP_FAILED);
    assert_int_equal(mprotect((void *)area, rsz, PROT_READ | PROT_WRITE), -1);
    assert_int_equal(area->magic, KVP_TE_LEASE_MAGIC);
    assert_int_equal(slot->magic, KVP_TE_SLOT_MAGIC);
    uint64_t g = __atomic_load_n(&area->gen, __ATOMIC_SEQ_CST);
    assert_int_equal(g % 2, 0);
    assert_int_equal(area->n_regions, 1);
    assert_int_equal(area->regions[0][0], (uintptr_t)mem);
    assert_int_equal(area->regions[0][1], 65536);
    /* what the peer counts in its slot is the target's */
    __atomic_store_n(&slot->moved[KVP_TE_WRITE], 5, __ATOMIC_SEQ_CST);
    __atomic_store_n(&slot->bytes[KVP_TE_WRITE], 5 * 4096, __ATOMIC_SEQ_CST);
    kvp_te_counters_t c;
    kvp_te_get_counters(a, &c);
    assert_int_equal(c.leases, 1);
    assert_int_equal(c.served_lease[KVP_TE_WRITE], 5);
    assert_int_equal(c.served_cma[KVP_TE_WRITE], 5);
    assert_int_equal(c.served_bytes[KVP_TE_WRITE], 5 * 4096);
    /* a copy under generation g in flight: the unregister publishes, then waits for it */
    __atomic_store_n(&slot->state, g << 1 | 1, __ATOMIC_SEQ_CST);
    unreg_t u = {.te = a, .addr = mem};
    pthread_t th;
    pthread_create(&th, NULL, unreg_main, &u);
    for (int i = 0; i < 5000 && __atomic_load_n(&area->gen, __ATOMIC_SEQ_CST) < g + 2; i++)
        usleep(1000); /* published (odd while written, then g + 2) */
    assert_int_equal(__atomic_load_n(&area->gen, __ATOMIC_SEQ_CST), g + 2);
    assert_false(kvp_wait_flag(&u.done, 200));
    assert_int_equal(__atomic_load_n(&area->n_regions, __ATOMIC_SEQ_CST), 0);
    __atomic_store_n(&slot->state, g << 1, __ATOMIC_SEQ_CST); /* done */
    assert_true(kvp_wait_flag(&u.done, 5000));
    pthread_join(th, NULL);
    assert_int_equal(u.st, KVP_OK);
    /* a register is published; a mark under the new generation holds nothing */
    assert_int_equal(kvp_te_register(a, mem2, 4096), KVP_OK);
    g = __atomic_load_n(&area->gen, __ATOMIC_SEQ_CST);
    assert_int_equal(area->n_regions, 1);
    assert_int_equal(area->regions[0][0], (uintptr_t)mem2);
    /* the connection closed with the slot marked under the ranges of before: revoked, and
     * the unregister still waits for that copy (its process lives: this one) */
    __atomic_store_n(&slot->state, (g - 2) << 1 | 1, __ATOMIC_SEQ_CST);
    close(fd);
    assert_int_equal(wait_change(&slot->revoked, 0, 5000), 1);
    unreg_t u2 = {.te = a, .addr = mem2};
    pthread_create(&th, NULL, unreg_main, &u2);
    assert_false(kvp_wait_flag(&u2.done, 200));
    __atomic_store_n(&slot->state, (g - 2) << 1, __ATOMIC_SEQ_CST);
    assert_true(kvp_wait_flag(&u2.done, 5000));
    pthread_join(th, NULL);
    assert_int_equal(u2.st, KVP_OK);
    kvp_te_get_counters(a, &c);
    assert_int_equal(c.leases, 0);
    assert_int_equal(c.served_lease[KVP_TE_WRITE], 5); /* kept once the slot is freed */
    munmap((void *)area, rsz);
    munmap(slot, sizeof(*slot));
    close(fds[0]);
    close(fds[1]);
    kvp_te_destroy(a);
    /* cma-checked: per batch only, no lease */
    setenv("KVPOOL_TE_SHM", "cma-checked", 1);
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", "shm", &a), KVP_OK);
    unsetenv("KVPOOL_TE_SHM");
    assert_int_equal(lease_ask_raw(a, &fd, fds, &nfd), KVP_ERR_UNSUPPORTED);
    assert_int_equal(nfd, 0);
    close(fd);
    kvp_te_destroy(a);
    free(mem);
    free(mem2);
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
        cmocka_unit_test(test_unregister_waits_and_then_refuses_shm_lease),
        cmocka_unit_test(test_unregister_waits_and_then_refuses_shm_checked),
        cmocka_unit_test(test_lease_on_the_wire),
        cmocka_unit_test(test_nobody_there),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
