/*
 * test_te_rdma.c - the transfer engine's rdma (the rdma transport, client/transport/rdma.c and
 * rdma_regions.c) between two
 * processes, as vLLM's MooncakeConnector drives it (prefill writes into decode's KV cache):
 *   - both engines protocol "rdma"; each registers its KV cache, vLLM's layout (per layer a
 *     K and a V tensor of NUM_BLOCKS blocks), one region per tensor;
 *   - the prefill writes block lists as merged contiguous runs (one range per run and
 *     tensor), then 512 single-block ranges (more than one chunk); the decode's memory is
 *     compared byte for byte with a mirror the prefill keeps;
 *   - ranges outside what the decode registered are refused (KVP_ERR_OUT_OF_RANGE) with its
 *     bytes intact; a tensor the decode unregistered after the prefill got its table is
 *     refused by the NIC (the region is gone), and the next batch reconnects;
 *   - a read of the decode's blocks; a local buffer the prefill did not register is staged
 *     and still goes over rdma; in one batch, a range in a region the decode offers goes over
 *     rdma and one outside any is handed on to tcp (refused there), the peer staying on rdma;
 *     an rdma connect without a token is refused and counted;
 *   - a decode with credentials (KVPOOL_TLS_*, KVPOOL_TLS_CRL, KVPOOL_TE_PEERS=admin,
 *     revoked): a prefill without any, one of another principal and one whose certificate
 *     the CRL lists (named) are refused (KVP_ERR_DENIED) with its bytes intact, admin's
 *     writes. Certificates: $KVPOOL_RDMA_TEST_CERTS (deploy/test-rdma.sh);
 *   - a decode whose KVPOOL_TE_ACL lets admin only read: admin gets no rkeys (they would
 *     open the regions for writes too); its write is refused over tcp, its read served;
 *   - a decode killed between batches: the next fails with a code within the timeout;
 *   - a peer that takes the connection and never answers (its hello waits for the engine's
 *     timeout) holds up no batch to another decode;
 *   - a decode killed while a batch to it is in flight (its completions never come) holds
 *     up no batch to another decode;
 *   - the decode's KVPOOL_TE_ACL changed to take write away from a principal that holds
 *     rkeys: its queue pair is cut, and its writes are refused from then on (nothing lands).
 * Exits 77 (SKIP) without an RDMA device: it runs in the Soft-RoCE VM (deploy/test-rdma.sh).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <time.h>
#include <pthread.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "client/include/kvpool_te.h"
#include "client/te/te_rdma.h"
#include "client/transport/rdma_regions.h"
#include "client/transport/rdma_verbs.h"
#include "tests/harness.h"

#define LAYERS 4
#define TENSORS (LAYERS * 2) /* K and V per layer */
#define NUM_BLOCKS 64
#define BLOCK (32u * 1024) /* 16 tokens x 8 heads x 128 x 2 bytes */
#define TENSOR ((size_t)NUM_BLOCKS * BLOCK)

static uint64_t kvp_now_ms_for_test(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int to_child = -1, from_child = -1;
static pid_t child;
static uint64_t dec_addr[TENSORS];
static uint16_t dec_port;
static uint8_t *mirror; /* what the decode's tensors must hold, TENSORS x TENSOR */

static void xwrite(int fd, const void *buf, size_t len)
{
    for (size_t off = 0; off < len;) {
        ssize_t k = write(fd, (const uint8_t *)buf + off, len - off);
        if (k <= 0 && errno != EINTR)
            abort();
        off += k > 0 ? (size_t)k : 0;
    }
}

static bool xread(int fd, void *buf, size_t len)
{
    for (size_t off = 0; off < len;) {
        ssize_t k = read(fd, (uint8_t *)buf + off, len - off);
        if (k == 0 || (k < 0 && errno != EINTR))
            return false;
        off += k > 0 ? (size_t)k : 0;
    }
    return true;
}

/* The decode: its engine, its KV cache, then commands from the prefill. */
static void decode_main(int in, int out, const char *certs)
{
    kvp_te_t *te;
    if (certs != NULL) { /* credentials on: peers prove a certificate that names admin */
        char path[512];
        snprintf(path, sizeof(path), "%s/ca.crt", certs);
        setenv("KVPOOL_TLS_CA", path, 1);
        snprintf(path, sizeof(path), "%s/server.crt", certs);
        setenv("KVPOOL_TLS_CERT", path, 1);
        snprintf(path, sizeof(path), "%s/server.key", certs);
        setenv("KVPOOL_TLS_KEY", path, 1);
        snprintf(path, sizeof(path), "%s/crl.pem", certs);
        setenv("KVPOOL_TLS_CRL", path, 1);
        /* revoked: named, so that only the CRL refuses it */
        setenv("KVPOOL_TE_PEERS", "admin, revoked", 1);
    }
    if (kvp_te_create("127.0.0.1", "P2PHANDSHAKE", "rdma", &te) != KVP_OK)
        _exit(3);
    void *t[TENSORS];
    size_t lens[TENSORS];
    for (int i = 0; i < TENSORS; i++) {
        t[i] = aligned_alloc(4096, TENSOR);
        kvp_fill_pattern(t[i], TENSOR, 1000 + (uint64_t)i);
        lens[i] = TENSOR;
    }
    if (kvp_te_register_batch(te, t, lens, TENSORS) != KVP_OK)
        _exit(4);
    uint16_t port = kvp_te_rpc_port(te);
    xwrite(out, &port, sizeof(port));
    for (int i = 0; i < TENSORS; i++) {
        uint64_t a = (uintptr_t)t[i];
        xwrite(out, &a, sizeof(a));
    }
    char cmd;
    while (xread(in, &cmd, 1)) {
        if (cmd == 'D') {
            for (int i = 0; i < TENSORS; i++)
                xwrite(out, t[i], TENSOR);
        } else if (cmd == 'U') {
            int32_t st = kvp_te_unregister(te, t[TENSORS - 1]);
            xwrite(out, &st, sizeof(st));
        } else if (cmd == 'C') {
            kvp_te_counters_t c;
            kvp_te_get_counters(te, &c);
            xwrite(out, &c, sizeof(c));
        } else
            break;
    }
    kvp_te_destroy(te);
    _exit(0);
}

/* Start a decode (credentials from certs, or none): its pipes, port and tensors into the
 * globals, the mirror reset to its initial bytes. */
static int decode_start(const char *certs)
{
    int a[2], b[2];
    if (pipe(a) != 0 || pipe(b) != 0)
        return -1;
    /* our ends are not inherited by later decodes */
    fcntl(a[1], F_SETFD, FD_CLOEXEC);
    fcntl(b[0], F_SETFD, FD_CLOEXEC);
    child = fork();
    if (child == 0) {
        /* a fresh process image: a forked one would share this process's verbs context
         * (librdmacm opens it once), and its queue pairs and regions would outlive it */
        char in[16], out[16];
        snprintf(in, sizeof(in), "%d", a[0]);
        snprintf(out, sizeof(out), "%d", b[1]);
        execl("/proc/self/exe", "rdma_test_te", "decode", in, out, certs ? certs : "",
              (char *)NULL);
        _exit(5);
    }
    close(a[0]);
    close(b[1]);
    to_child = a[1];
    from_child = b[0];
    if (!xread(from_child, &dec_port, sizeof(dec_port)) ||
        !xread(from_child, dec_addr, sizeof(dec_addr)))
        return -1;
    if (mirror == NULL)
        mirror = malloc(TENSORS * TENSOR);
    for (int i = 0; i < TENSORS; i++)
        kvp_fill_pattern(mirror + i * TENSOR, TENSOR, 1000 + (uint64_t)i);
    return 0;
}

static int decode_stop(void)
{
    char q = 'Q';
    xwrite(to_child, &q, 1);
    int status = -1;
    waitpid(child, &status, 0);
    close(to_child);
    close(from_child);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int setup(void **state)
{
    (void)state;
    return decode_start(NULL);
}

static int teardown(void **state)
{
    (void)state;
    int rc = decode_stop();
    free(mirror);
    return rc;
}

/* The decode's tensors, byte for byte, against the mirror. */
static void assert_decode_is_mirror(void)
{
    uint8_t *got = malloc(TENSOR);
    char d = 'D';
    xwrite(to_child, &d, 1);
    for (int i = 0; i < TENSORS; i++) {
        assert_true(xread(from_child, got, TENSOR));
        assert_memory_equal(got, mirror + i * TENSOR, TENSOR);
    }
    free(got);
}

static void decode_counters(kvp_te_counters_t *c)
{
    char d = 'C';
    xwrite(to_child, &d, 1);
    assert_true(xread(from_child, c, sizeof(*c)));
}

typedef struct prefill {
    kvp_te_t *te;
    uint8_t *t[TENSORS];
    char target[64];
} prefill_t;

static void prefill_open(prefill_t *p)
{
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", "rdma", &p->te), KVP_OK);
    void *t[TENSORS];
    size_t lens[TENSORS];
    for (int i = 0; i < TENSORS; i++) {
        p->t[i] = aligned_alloc(4096, TENSOR);
        kvp_fill_pattern(p->t[i], TENSOR, 1 + (uint64_t)i);
        t[i] = p->t[i];
        lens[i] = TENSOR;
    }
    assert_int_equal(kvp_te_register_batch(p->te, t, lens, TENSORS), KVP_OK);
    snprintf(p->target, sizeof(p->target), "127.0.0.1:%u", dec_port);
}

static void prefill_close(prefill_t *p)
{
    kvp_te_destroy(p->te);
    for (int i = 0; i < TENSORS; i++)
        free(p->t[i]);
}

/* vLLM's connector: block ids on both sides, merged into runs where both are consecutive,
 * one range per run and tensor. Returns the range count; the mirror takes the writes. */
static size_t block_runs(prefill_t *p, const int *lb, const int *rb, size_t nb, void **locals,
                         uint64_t *remotes, uint64_t *lens)
{
    size_t n = 0;
    for (int t = 0; t < TENSORS; t++)
        for (size_t i = 0; i < nb;) {
            size_t j = i + 1;
            while (j < nb && lb[j] == lb[j - 1] + 1 && rb[j] == rb[j - 1] + 1)
                j++;
            locals[n] = p->t[t] + (size_t)lb[i] * BLOCK;
            remotes[n] = dec_addr[t] + (uint64_t)rb[i] * BLOCK;
            lens[n] = (j - i) * BLOCK;
            memcpy(mirror + t * TENSOR + (size_t)rb[i] * BLOCK, locals[n], lens[n]);
            n++;
            i = j;
        }
    return n;
}

static void test_connector_sequence(void **state)
{
    (void)state;
    prefill_t p;
    prefill_open(&p);
    /* merged runs: 4 runs of 4, 2, 1 and 8 blocks in each of the 8 tensors */
    int lb[] = {3, 4, 5, 6, 10, 11, 20, 40, 41, 42, 43, 44, 45, 46, 47};
    int rb[] = {0, 1, 2, 3, 8, 9, 30, 50, 51, 52, 53, 54, 55, 56, 57};
    void *locals[512];
    uint64_t remotes[512], lens[512];
    size_t n = block_runs(&p, lb, rb, 15, locals, remotes, lens);
    assert_int_equal(n, 32);
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, n, locals, remotes, lens),
                     KVP_OK);
    assert_decode_is_mirror();
    kvp_te_peer_stat_t ps[2];
    assert_int_equal(kvp_te_peer_stats(p.te, ps, 2), 1);
    assert_string_equal(ps[0].route, "rdma");
    assert_int_equal(ps[0].transfers, 32);
    /* 512 single-block ranges, reversed: two chunks, many chains */
    int lb2[NUM_BLOCKS], rb2[NUM_BLOCKS];
    for (int i = 0; i < NUM_BLOCKS; i++)
        lb2[i] = i, rb2[i] = NUM_BLOCKS - 1 - i;
    n = block_runs(&p, lb2, rb2, NUM_BLOCKS, locals, remotes, lens);
    assert_int_equal(n, 512);
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, n, locals, remotes, lens),
                     KVP_OK);
    assert_decode_is_mirror();
    /* a read of every block of tensor 2 into a zeroed registered buffer */
    uint8_t *back = aligned_alloc(4096, TENSOR);
    memset(back, 0, TENSOR);
    assert_int_equal(kvp_te_register(p.te, back, TENSOR), KVP_OK);
    for (int i = 0; i < NUM_BLOCKS; i++) {
        locals[i] = back + (size_t)i * BLOCK;
        remotes[i] = dec_addr[2] + (uint64_t)i * BLOCK;
        lens[i] = BLOCK;
    }
    assert_int_equal(
        kvp_te_transfer(p.te, p.target, KVP_TE_READ, NUM_BLOCKS, locals, remotes, lens), KVP_OK);
    assert_memory_equal(back, mirror + 2 * TENSOR, TENSOR);
    kvp_te_counters_t c;
    kvp_te_get_counters(p.te, &c);
    assert_int_equal(c.transfers[KVP_TE_WRITE], 32 + 512);
    assert_int_equal(c.bytes[KVP_TE_READ], TENSOR);
    assert_int_equal(c.failures, 0);
    assert_int_equal(kvp_te_unregister(p.te, back), KVP_OK);
    free(back);
    prefill_close(&p);
}

static void test_out_of_range_refused(void **state)
{
    (void)state;
    prefill_t p;
    prefill_open(&p);
    void *locals[3] = {p.t[0], p.t[1], p.t[2]};
    /* across the end of tensor 0; before the first; far outside any */
    uint64_t remotes[3] = {dec_addr[0] + TENSOR - BLOCK / 2, dec_addr[0] - BLOCK, 4096};
    uint64_t lens[3] = {BLOCK, BLOCK, BLOCK};
    for (int i = 0; i < 3; i++)
        assert_int_equal(
            kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, 1, &locals[i], &remotes[i], &lens[i]),
            KVP_ERR_OUT_OF_RANGE);
    assert_decode_is_mirror();
    kvp_te_counters_t c;
    kvp_te_get_counters(p.te, &c);
    assert_int_equal(c.failures, 3);
    assert_int_equal(c.transfers[KVP_TE_WRITE], 0);

    /* the last tensor unregistered at the decode after we got its table: the NIC refuses */
    uint64_t ok_remote = dec_addr[0];
    uint64_t blk = BLOCK;
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, 1, locals, &ok_remote, &blk),
                     KVP_OK);
    memcpy(mirror, p.t[0], BLOCK);
    char u = 'U';
    xwrite(to_child, &u, 1);
    int32_t ust;
    assert_true(xread(from_child, &ust, sizeof(ust)));
    assert_int_equal(ust, KVP_OK);
    uint64_t gone = dec_addr[TENSORS - 1];
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, 1, locals, &gone, &blk),
                     KVP_ERR_OUT_OF_RANGE);
    assert_decode_is_mirror();
    /* the next batch (a new queue pair, the table asked again) goes; the gone tensor is
     * refused before the NIC now */
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, 1, locals, &ok_remote, &blk),
                     KVP_OK);
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, 1, locals, &gone, &blk),
                     KVP_ERR_OUT_OF_RANGE);
    assert_decode_is_mirror();
    prefill_close(&p);
}

/* A local buffer the prefill did not register: the transfer engine stages it (copied into
 * its staging buffers, local-only memory regions no peer has a key for) and the batch still
 * goes over rdma; the bytes land, the peer stays on rdma. */
static void test_unregistered_local_is_staged(void **state)
{
    (void)state;
    prefill_t p;
    prefill_open(&p);
    uint8_t *plain = malloc(BLOCK);
    kvp_fill_pattern(plain, BLOCK, 77);
    void *local = plain;
    uint64_t remote = dec_addr[1] + 5 * BLOCK, len = BLOCK;
    kvp_te_counters_t d0, d1;
    decode_counters(&d0);
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, 1, &local, &remote, &len),
                     KVP_OK);
    memcpy(mirror + TENSOR + 5 * BLOCK, plain, BLOCK);
    assert_decode_is_mirror();
    /* and read back into it, staged the other way */
    memset(plain, 0, BLOCK);
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_READ, 1, &local, &remote, &len),
                     KVP_OK);
    assert_memory_equal(plain, mirror + TENSOR + 5 * BLOCK, BLOCK);
    /* rdma: the decode's CPU served neither (its served counts are tcp and shm only) */
    decode_counters(&d1);
    assert_int_equal(d1.served[KVP_TE_WRITE], d0.served[KVP_TE_WRITE]);
    assert_int_equal(d1.served[KVP_TE_READ], d0.served[KVP_TE_READ]);
    kvp_te_peer_stat_t ps[1];
    assert_int_equal(kvp_te_peer_stats(p.te, ps, 1), 1);
    assert_string_equal(ps[0].route, "rdma");
    free(plain);
    prefill_close(&p);
}

/* One batch, two ranges: one in a region the decode offers on rdma, one outside any: the
 * first goes over rdma, the second is handed on to tcp, where the decode refuses it
 * (KVP_ERR_OUT_OF_RANGE, the batch's status); the peer stays on rdma for the next batch. */
static void test_range_without_key_is_handed_on(void **state)
{
    (void)state;
    prefill_t p;
    prefill_open(&p);
    void *locals[2] = {p.t[3] + 7 * BLOCK, p.t[3]};
    uint64_t remotes[2] = {dec_addr[3] + 7 * BLOCK, dec_addr[3] + TENSOR - BLOCK / 2};
    uint64_t lens[2] = {BLOCK, BLOCK};
    kvp_fill_pattern(p.t[3] + 7 * BLOCK, BLOCK, 91);
    kvp_te_counters_t before, after, d0, d1;
    kvp_te_get_counters(p.te, &before);
    decode_counters(&d0);
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, 2, locals, remotes, lens),
                     KVP_ERR_OUT_OF_RANGE);
    memcpy(mirror + 3 * TENSOR + 7 * BLOCK, p.t[3] + 7 * BLOCK, BLOCK);
    assert_decode_is_mirror();
    kvp_te_get_counters(p.te, &after);
    assert_int_equal(after.transfers[KVP_TE_WRITE] - before.transfers[KVP_TE_WRITE], 1);
    assert_int_equal(after.failures - before.failures, 1);
    /* the good range over rdma (the decode served nothing), the other refused over tcp */
    decode_counters(&d1);
    assert_int_equal(d1.served[KVP_TE_WRITE], d0.served[KVP_TE_WRITE]);
    assert_true(d1.refused_range - d0.refused_range >= 1); /* (rdma access errors count late) */
    kvp_te_peer_stat_t ps[1];
    assert_int_equal(kvp_te_peer_stats(p.te, ps, 1), 1);
    assert_string_equal(ps[0].route, "rdma");
    uint64_t one = BLOCK;
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, 1, locals, remotes, &one),
                     KVP_OK);
    assert_decode_is_mirror();
    prefill_close(&p);
}

/* A stranger's rdma connect: no token (or a made-up one): refused, counted. */
static void test_connect_without_token_refused(void **state)
{
    (void)state;
    kvp_te_counters_t before, after;
    decode_counters(&before);
    kvp_rdma_dev_t *dev;
    kvp_rdma_dev_params_t dp = {0};
    assert_int_equal(kvp_rdma_dev_open(&dp, &dev), 0);
    char ip[64];
    assert_int_equal(kvp_rdma_dev_ipv4(dev, ip, sizeof(ip)), 0);
    struct {
        uint32_t magic, version;
        uint8_t token[16];
    } pd = {0x5450564Bu, 1, {0}};
    int refused = 0;
    kvp_te_t *probe;
    assert_int_equal(kvp_te_create("127.0.0.1", "P2PHANDSHAKE", "rdma", &probe), KVP_OK);
    /* the probe's rdma port (a stranger could scan for it): a connect with a made-up token,
     * then one with no private data */
    const char *w = strrchr(kvp_te_rdma_where(probe), ':');
    assert_non_null(w);
    uint16_t port = (uint16_t)atoi(w + 1);
    kvp_rdma_qp_t *qp = NULL;
    if (kvp_rdma_connect(dev, ip, port, 2000, &pd, sizeof(pd), &qp) != 0)
        refused++;
    else
        kvp_rdma_qp_destroy(qp);
    qp = NULL;
    if (kvp_rdma_connect(dev, ip, port, 2000, NULL, 0, &qp) != 0)
        refused++;
    else
        kvp_rdma_qp_destroy(qp);
    assert_int_equal(refused, 2);
    kvp_te_counters_t pc;
    kvp_te_get_counters(probe, &pc);
    assert_int_equal(pc.refused_auth, 2);
    kvp_te_destroy(probe);
    kvp_rdma_dev_close(dev);
    decode_counters(&after);
    assert_int_equal(after.refused_auth, before.refused_auth);
}

/* The group's decode set aside while a test runs one of its own, and back. */
static struct {
    int to, from;
    pid_t child;
    uint16_t port;
    uint64_t addr[TENSORS];
    uint8_t *mirror;
} aside;

static void decode_aside(void)
{
    aside.to = to_child, aside.from = from_child, aside.child = child, aside.port = dec_port;
    memcpy(aside.addr, dec_addr, sizeof(aside.addr));
    aside.mirror = mirror;
    mirror = NULL;
}

static void decode_back(void)
{
    to_child = aside.to, from_child = aside.from, child = aside.child, dec_port = aside.port;
    memcpy(dec_addr, aside.addr, sizeof(aside.addr));
    mirror = aside.mirror;
}

static void set_creds(const char *certs, const char *who)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ca.crt", certs);
    setenv("KVPOOL_TLS_CA", path, 1);
    snprintf(path, sizeof(path), "%s/%s.crt", certs, who);
    setenv("KVPOOL_TLS_CERT", path, 1);
    snprintf(path, sizeof(path), "%s/%s.key", certs, who);
    setenv("KVPOOL_TLS_KEY", path, 1);
}

static void clear_creds(void)
{
    unsetenv("KVPOOL_TLS_CA");
    unsetenv("KVPOOL_TLS_CERT");
    unsetenv("KVPOOL_TLS_KEY");
}

/* The certificates deploy/test-rdma.sh makes ($KVPOOL_RDMA_TEST_CERTS); fails without. */
static const char *test_certs(void)
{
    const char *certs = getenv("KVPOOL_RDMA_TEST_CERTS");
    if (certs == NULL || access(certs, R_OK) != 0) {
        fprintf(stderr, "KVPOOL_RDMA_TEST_CERTS not there (deploy/test-rdma.sh makes them)\n");
        fail();
    }
    return certs;
}

/* A decode with credentials that admits principals admin and revoked: a prefill without
 * credentials, one proving another principal (server) and one proving the certificate the
 * CA revoked (crl.pem) get no rkey and move nothing (KVP_ERR_DENIED); admin's prefill
 * writes byte-exact. */
static void test_credentials_admit_only_the_named_principal(void **state)
{
    (void)state;
    const char *certs = test_certs();
    /* the group's decode aside, one with credentials */
    decode_aside();
    assert_int_equal(decode_start(certs), 0);
    int lb[] = {0, 1, 2, 9}, rb[] = {4, 5, 6, 20};
    void *locals[64];
    uint64_t remotes[64], lens[64];
    const char *who[] = {NULL, "server", "revoked", "admin"};
    for (int w = 0; w < 4; w++) {
        if (who[w] != NULL)
            set_creds(certs, who[w]);
        prefill_t p;
        prefill_open(&p);
        clear_creds();
        uint8_t *before = malloc(TENSORS * TENSOR);
        memcpy(before, mirror, TENSORS * TENSOR);
        size_t n = block_runs(&p, lb, rb, 4, locals, remotes, lens);
        kvp_status_t st = kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, n, locals, remotes, lens);
        if (w < 3) {
            assert_int_equal(st, KVP_ERR_DENIED);
            memcpy(mirror, before, TENSORS * TENSOR); /* nothing may have landed */
        } else
            assert_int_equal(st, KVP_OK);
        free(before);
        assert_decode_is_mirror();
        kvp_te_peer_stat_t ps[1];
        assert_int_equal(kvp_te_peer_stats(p.te, ps, 1), 1);
        if (w == 3)
            assert_string_equal(ps[0].route, "rdma");
        prefill_close(&p);
    }
    kvp_te_counters_t c;
    decode_counters(&c);
    assert_true(c.refused_auth >= 3);
    assert_int_equal(decode_stop(), 0);
    free(mirror);
    decode_back();
}

/* The ACL of the decode (principal server, CN kvpool-master) with principal admin's roles. */
static void acl_text(char *buf, size_t len, const char *admin_roles)
{
    snprintf(buf, len,
             "[principal server]\nroles = read, write\ncert-cn = kvpool-master\n\n"
             "[principal admin]\nroles = %s\ncert-cn = admin\n",
             admin_roles);
}

/* The group's decode aside, one with credentials and KVPOOL_TE_ACL a new file of the ACL
 * where admin has admin_roles (its path into acl, of "/tmp/kvpool-te-acl-XXXXXX"). */
static void decode_start_with_acl(const char *certs, char *acl, const char *admin_roles)
{
    char text[256];
    acl_text(text, sizeof(text), admin_roles);
    int fd = mkstemp(acl);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    decode_aside();
    setenv("KVPOOL_TE_ACL", acl, 1); /* the decode inherits it; the prefill has no use for it */
    int started = decode_start(certs);
    unsetenv("KVPOOL_TE_ACL");
    assert_int_equal(started, 0);
}

/* After a prefill of admin was refused (refused_role counted): the decode of
 * decode_start_with_acl stopped, its ACL file removed, the group's decode back. */
static void decode_stop_with_acl(const char *acl)
{
    kvp_te_counters_t c;
    decode_counters(&c);
    assert_true(c.refused_role >= 1);
    assert_int_equal(decode_stop(), 0);
    unlink(acl);
    free(mirror);
    decode_back();
}

/* A decode (principal server, CN kvpool-master) whose KVPOOL_TE_ACL lets principal admin only read
 * (an rkey would open its regions for writes too): admin's prefill gets no rkeys, its write is
 * refused over tcp (KVP_ERR_DENIED, the decode's bytes intact, counted refused_role), its read
 * comes back byte-exact over tcp, and the peer's route says tcp, not rdma. */
static void test_reader_principal_gets_no_rdma_keys(void **state)
{
    (void)state;
    const char *certs = test_certs();
    char acl[] = "/tmp/kvpool-te-acl-XXXXXX";
    decode_start_with_acl(certs, acl, "read");
    set_creds(certs, "admin");
    prefill_t p;
    prefill_open(&p);
    clear_creds();
    int lb[] = {0, 1, 2, 9}, rb[] = {4, 5, 6, 20};
    void *locals[64];
    uint64_t remotes[64], lens[64];
    uint8_t *before = malloc(TENSORS * TENSOR);
    memcpy(before, mirror, TENSORS * TENSOR);
    size_t n = block_runs(&p, lb, rb, 4, locals, remotes, lens); /* (the mirror takes them) */
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, n, locals, remotes, lens),
                     KVP_ERR_DENIED);
    memcpy(mirror, before, TENSORS * TENSOR); /* nothing may have landed */
    free(before);
    assert_decode_is_mirror();
    uint8_t *back = aligned_alloc(4096, TENSOR);
    memset(back, 0, TENSOR);
    assert_int_equal(kvp_te_register(p.te, back, TENSOR), KVP_OK);
    for (int i = 0; i < NUM_BLOCKS; i++) {
        locals[i % 64] = back + (size_t)i * BLOCK;
        remotes[i % 64] = dec_addr[1] + (uint64_t)i * BLOCK;
        lens[i % 64] = BLOCK;
        if (i % 64 == 63)
            assert_int_equal(
                kvp_te_transfer(p.te, p.target, KVP_TE_READ, 64, locals, remotes, lens), KVP_OK);
    }
    assert_memory_equal(back, mirror + 1 * TENSOR, TENSOR);
    kvp_te_peer_stat_t ps[1];
    assert_int_equal(kvp_te_peer_stats(p.te, ps, 1), 1);
    assert_string_equal(ps[0].route, "tcp");
    assert_int_equal(kvp_te_unregister(p.te, back), KVP_OK);
    free(back);
    prefill_close(&p);
    decode_stop_with_acl(acl);
}

/* A decode whose KVPOOL_TE_ACL lets admin read and write: admin's prefill writes over rdma.
 * The file is replaced with one that lets admin only read: within about a second the decode
 * cuts every rdma queue pair (an rkey cannot be taken back from one holder), and admin's
 * next batches fail (the queue pair gone) until one is refused outright (its new TE_RDMA
 * gets no keys, its write over tcp KVP_ERR_DENIED); no byte of any of them lands. */
static void test_acl_change_cuts_a_writer_off_rdma(void **state)
{
    (void)state;
    const char *certs = test_certs();
    char acl[] = "/tmp/kvpool-te-acl-XXXXXX";
    decode_start_with_acl(certs, acl, "read, write");
    set_creds(certs, "admin");
    setenv("KVPOOL_TE_TIMEOUT_MS", "3000", 1);
    prefill_t p;
    prefill_open(&p);
    unsetenv("KVPOOL_TE_TIMEOUT_MS");
    clear_creds();
    int lb[] = {0, 1, 2, 9}, rb[] = {4, 5, 6, 20};
    void *locals[64];
    uint64_t remotes[64], lens[64];
    size_t n = block_runs(&p, lb, rb, 4, locals, remotes, lens);
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, n, locals, remotes, lens),
                     KVP_OK);
    assert_decode_is_mirror();
    kvp_te_peer_stat_t ps[1];
    assert_int_equal(kvp_te_peer_stats(p.te, ps, 1), 1);
    assert_string_equal(ps[0].route, "rdma");

    /* admin may only read now: a new file renamed over the old */
    char tmp[64], ro[256];
    acl_text(ro, sizeof(ro), "read");
    snprintf(tmp, sizeof(tmp), "%s.new", acl);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, ro, strlen(ro)), (ssize_t)strlen(ro));
    close(fd);
    assert_int_equal(rename(tmp, acl), 0);
    usleep(1500 * 1000); /* the decode looks at the file at most once a second */
    uint8_t *before = malloc(TENSORS * TENSOR);
    memcpy(before, mirror, TENSORS * TENSOR);
    int lb2[] = {30, 31, 32}, rb2[] = {40, 41, 42};
    kvp_status_t st = KVP_OK;
    int tries = 0;
    for (; tries < 8 && st != KVP_ERR_DENIED; tries++) {
        n = block_runs(&p, lb2, rb2, 3, locals, remotes, lens);
        uint64_t t0 = kvp_now_ms_for_test();
        st = kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, n, locals, remotes, lens);
        fprintf(stderr, "admin's write after the ACL change, try %d: %s after %llu ms\n", tries,
                kvp_strerror(st), (unsigned long long)(kvp_now_ms_for_test() - t0));
        assert_int_not_equal(st, KVP_OK);
    }
    assert_int_equal(st, KVP_ERR_DENIED);
    memcpy(mirror, before, TENSORS * TENSOR); /* nothing may have landed */
    free(before);
    assert_decode_is_mirror();
    assert_int_equal(kvp_te_peer_stats(p.te, ps, 1), 1);
    assert_string_equal(ps[0].route, "tcp");
    prefill_close(&p);
    decode_stop_with_acl(acl);
}

/* A decode killed between two batches: writes to it fail with a code (once the kernel
 * tore its queue pairs down), each within the engine's timeout (KVPOOL_TE_TIMEOUT_MS,
 * 10 s): never a hang. */
static void test_decode_that_dies_fails_in_time(void **state)
{
    (void)state;
    decode_aside();
    assert_int_equal(decode_start(NULL), 0);
    prefill_t p;
    prefill_open(&p);
    int lb[] = {1, 2, 3}, rb[] = {7, 8, 9};
    void *locals[64];
    uint64_t remotes[64], lens[64];
    size_t n = block_runs(&p, lb, rb, 3, locals, remotes, lens);
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, n, locals, remotes, lens),
                     KVP_OK);
    kill(child, SIGKILL);
    int status;
    waitpid(child, &status, 0);
    /* the kernel tears the dead process's queue pairs and regions down after its exit;
     * within a few batches the writes fail, each within the timeout */
    kvp_status_t st = KVP_OK;
    for (int round = 0; round < 10 && st == KVP_OK; round++) {
        usleep(500 * 1000);
        uint64_t t0 = kvp_now_ms_for_test();
        st = kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, n, locals, remotes, lens);
        uint64_t dt = kvp_now_ms_for_test() - t0;
        fprintf(stderr, "a write to the killed decode, round %d: %s after %llu ms\n", round,
                kvp_strerror(st), (unsigned long long)dt);
        assert_true(dt < 15000);
    }
    /* no completion for KVPOOL_TE_TIMEOUT_MS: KVP_ERR_TIMEOUT; the QP's retries exhausted
     * first: KVP_ERR_CONNECT */
    assert_true(st == KVP_ERR_CONNECT || st == KVP_ERR_TIMEOUT);
    prefill_close(&p);
    close(to_child);
    close(from_child);
    free(mirror);
    decode_back();
}

/* The batch to the silent peer, on a thread of its own. */
typedef struct silent_batch {
    prefill_t *p;
    char target[64];
    void **locals;
    uint64_t *remotes, *lens;
    size_t n;
    kvp_status_t st;
    uint64_t ms, end;
} silent_batch_t;

static void *silent_batch_main(void *arg)
{
    silent_batch_t *b = arg;
    uint64_t t0 = kvp_now_ms_for_test();
    b->st =
        kvp_te_transfer(b->p->te, b->target, KVP_TE_WRITE, b->n, b->locals, b->remotes, b->lens);
    b->end = kvp_now_ms_for_test();
    b->ms = b->end - t0;
    return NULL;
}

/* One prefill, two targets: a socket that takes the connection (the kernel's backlog) and
 * never answers, so the first batch to it waits in its hello for the engine's timeout
 * (KVPOOL_TE_TIMEOUT_MS, 3 s here), and the live decode. A batch to the decode while the
 * other waits goes through at once, byte-exact (a peer's hello holds its own batches, not
 * the engine's); the silent one fails with a code within its timeout. */
static void test_silent_peer_holds_up_no_other(void **state)
{
    (void)state;
    decode_aside(); /* the group's has a tensor unregistered (test_out_of_range_refused) */
    assert_int_equal(decode_start(NULL), 0);
    setenv("KVPOOL_TE_TIMEOUT_MS", "3000", 1);
    prefill_t p;
    prefill_open(&p);
    unsetenv("KVPOOL_TE_TIMEOUT_MS");
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(ls >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    assert_int_equal(bind(ls, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(ls, 16), 0);
    assert_int_equal(getsockname(ls, (struct sockaddr *)&a, &al), 0);
    int lb[] = {1, 2, 3}, rb[] = {7, 8, 9};
    void *locals[64];
    uint64_t remotes[64], lens[64];
    size_t n = block_runs(&p, lb, rb, 3, locals, remotes, lens);
    silent_batch_t b = {.p = &p, .locals = locals, .remotes = remotes, .lens = lens, .n = n};
    snprintf(b.target, sizeof(b.target), "127.0.0.1:%u", ntohs(a.sin_port));
    pthread_t tid;
    assert_int_equal(pthread_create(&tid, NULL, silent_batch_main, &b), 0);
    usleep(300 * 1000); /* the silent peer's hello is waiting */
    uint64_t t0 = kvp_now_ms_for_test();
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, n, locals, remotes, lens),
                     KVP_OK);
    uint64_t dt = kvp_now_ms_for_test() - t0;
    pthread_join(tid, NULL);
    fprintf(stderr, "the live decode's batch: %llu ms; the silent peer's: %s after %llu ms\n",
            (unsigned long long)dt, kvp_strerror(b.st), (unsigned long long)b.ms);
    /* done before the silent one gave up: it was not waited for */
    assert_true(t0 + dt < b.end);
    assert_int_not_equal(b.st, KVP_OK);
    assert_true(b.ms < 3000 + 3000);
    assert_decode_is_mirror();
    kvp_te_peer_stat_t ps[2];
    assert_int_equal(kvp_te_peer_stats(p.te, ps, 2), 2);
    close(ls);
    prefill_close(&p);
    assert_int_equal(decode_stop(), 0);
    free(mirror);
    decode_back();
}

/* Another decode's globals (to_child ... mirror) swapped with the current one's. */
typedef struct decode_state {
    int to, from;
    pid_t child;
    uint16_t port;
    uint64_t addr[TENSORS];
    uint8_t *mirror;
} decode_state_t;

static void decode_swap(decode_state_t *d)
{
    decode_state_t cur = {
        .to = to_child, .from = from_child, .child = child, .port = dec_port, .mirror = mirror};
    memcpy(cur.addr, dec_addr, sizeof(cur.addr));
    to_child = d->to, from_child = d->from, child = d->child, dec_port = d->port;
    memcpy(dec_addr, d->addr, sizeof(dec_addr));
    mirror = d->mirror;
    *d = cur;
}

/* One prefill, two decodes (KVPOOL_TE_TIMEOUT_MS 3 s): decode A killed after a first batch
 * connected its queue pairs; a batch to A on a thread fails with a code (the rdma transport
 * sees the dead peer's disconnect when it takes its queue pair and connects anew, which
 * fails; had its completions stopped instead, the batch would give up at the timeout), and
 * meanwhile one to decode B goes through byte-exact, and the prefill unregisters a buffer
 * A's batch does not use: while A's batch runs, neither waits for it (the completion thread
 * hands each batch its own; a batch holds no lock on the regions). */
static void test_dead_decode_holds_up_no_other(void **state)
{
    (void)state;
    decode_aside();
    assert_int_equal(decode_start(NULL), 0); /* A */
    decode_state_t a = {0};
    decode_swap(&a);                         /* A's in a; the globals empty */
    assert_int_equal(decode_start(NULL), 0); /* B */
    setenv("KVPOOL_TE_TIMEOUT_MS", "3000", 1);
    prefill_t p;
    prefill_open(&p);
    unsetenv("KVPOOL_TE_TIMEOUT_MS");
    int lb[] = {1, 2, 3}, rb[] = {7, 8, 9};
    void *la[64], *lbuf[64];
    uint64_t ra[64], lena[64], rbuf[64], lenb[64];
    decode_swap(&a); /* A current */
    char target_a[64];
    snprintf(target_a, sizeof(target_a), "127.0.0.1:%u", dec_port);
    size_t na = block_runs(&p, lb, rb, 3, la, ra, lena);
    assert_int_equal(kvp_te_transfer(p.te, target_a, KVP_TE_WRITE, na, la, ra, lena), KVP_OK);
    kill(child, SIGKILL);
    int status;
    waitpid(child, &status, 0);
    decode_swap(&a); /* B current */
    size_t nb = block_runs(&p, lb, rb, 3, lbuf, rbuf, lenb);
    uint8_t *spare = aligned_alloc(4096, TENSOR);
    assert_int_equal(kvp_te_register(p.te, spare, TENSOR), KVP_OK);
    silent_batch_t bt = {.p = &p, .locals = la, .remotes = ra, .lens = lena, .n = na};
    snprintf(bt.target, sizeof(bt.target), "%s", target_a);
    pthread_t tid;
    assert_int_equal(pthread_create(&tid, NULL, silent_batch_main, &bt), 0);
    usleep(300 * 1000); /* A's batch is posted and waiting for completions */
    uint64_t t0 = kvp_now_ms_for_test();
    assert_int_equal(kvp_te_transfer(p.te, p.target, KVP_TE_WRITE, nb, lbuf, rbuf, lenb), KVP_OK);
    uint64_t dt = kvp_now_ms_for_test() - t0;
    uint64_t t1 = kvp_now_ms_for_test();
    assert_int_equal(kvp_te_unregister(p.te, spare), KVP_OK);
    uint64_t du = kvp_now_ms_for_test() - t1;
    pthread_join(tid, NULL);
    fprintf(stderr,
            "decode B's batch: %llu ms; an unregister meanwhile: %llu ms; the dead decode A's: "
            "%s after %llu ms\n",
            (unsigned long long)dt, (unsigned long long)du, kvp_strerror(bt.st),
            (unsigned long long)bt.ms);
    /* B's was not held up by A's, nor the unregister (begun while A's ran: ended before it) */
    assert_true(t0 >= bt.end || t0 + dt < bt.end);
    assert_true(t1 >= bt.end || t1 + du < bt.end);
    assert_true(dt < 3000 && du < 3000);
    free(spare);
    assert_int_not_equal(bt.st, KVP_OK);
    assert_true(bt.ms < 3000 + 6000); /* the timeout, the flush's wait */
    assert_decode_is_mirror();
    prefill_close(&p);
    assert_int_equal(decode_stop(), 0);
    free(mirror);
    close(a.to);
    close(a.from);
    free(a.mirror);
    decode_back();
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "decode") == 0)
        decode_main(atoi(argv[2]), atoi(argv[3]), argv[4][0] != '\0' ? argv[4] : NULL);
    if (!kvp_rdma_present()) {
        fprintf(stderr, "no RDMA device: SKIP\n");
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_connector_sequence),
        cmocka_unit_test(test_out_of_range_refused),
        cmocka_unit_test(test_unregistered_local_is_staged),
        cmocka_unit_test(test_range_without_key_is_handed_on),
        cmocka_unit_test(test_connect_without_token_refused),
        cmocka_unit_test(test_credentials_admit_only_the_named_principal),
        cmocka_unit_test(test_reader_principal_gets_no_rdma_keys),
        cmocka_unit_test(test_silent_peer_holds_up_no_other),
        cmocka_unit_test(test_dead_decode_holds_up_no_other),
        cmocka_unit_test(test_acl_change_cuts_a_writer_off_rdma),
        cmocka_unit_test(test_decode_that_dies_fails_in_time),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
