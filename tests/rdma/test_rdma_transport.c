/*
 * test_rdma_transport.c - the rdma transport end to end on a real device
 * (inside the Soft-RoCE VM: deploy/test-rdma.sh): a real kvpool-master,
 * real `kvpool serve` owners (transport auto: they find rxe0 and serve their
 * segment over rdma_cm too), and this process as a client with the
 * transport forced to rdma.
 *
 *  1. registered buffers (zero-copy): objects from 1 byte to 3 MiB + 17,
 *     striped in 64 KiB slices over 4 QPs per peer, put and got back
 *     byte-exact, in one batch and one by one; bytes around the
 *     destination untouched.
 *  2. unregistered buffers (staged through registered buffers) and a batch
 *     mixing both kinds: byte-exact.
 *  3. registration: overlap refused, unregister then register again works.
 *  4. forced rdma to an owner that serves no rdma (`--transport tcp`): each
 *     key fails with KVP_ERR_TRANSPORT, nothing becomes visible, no silent
 *     fallback to tcp.
 *  5. device selection: forced rdma with a device list naming no device
 *     fails kvp_client_create with KVP_ERR_TRANSPORT; auto with the same
 *     list falls back to tcp and works.
 *
 * No RDMA device on this host: exit 77 (meson SKIP); deploy/test-rdma.sh
 * counts that as a failure inside the VM.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/include/kvpool.h"
#include "tests/harness.h"

#define SEG_SIZE "64MiB"
#define BIG ((3u << 20) + 17)

typedef struct env {
    kvp_proc_t master;
    kvp_proc_t seg[2];
    int n_seg;
    kvp_client_t *client;
} env_t;

static kvp_client_t *client_new(const char *master, const char *transport, const char *devices)
{
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = master;
    p.transport = transport;
    p.rdma_devices = devices;
    p.rdma_qps_per_peer = 4;
    p.rdma_slice_bytes = 64 << 10;
    p.rpc_timeout_ms = 5000;
    kvp_client_t *c = NULL;
    kvp_status_t st = kvp_client_create(&p, &c);
    return st == KVP_OK ? c : NULL;
}

static int setup_with(void **state, const char *seg_transport)
{
    env_t *e = calloc(1, sizeof(*e));
    char *args[] = {"--lease-ttl", "0", "--no-eviction", NULL};
    if (e == NULL || !kvp_start_master_args(&e->master, args))
        return -1;
    e->n_seg = 2;
    for (int i = 0; i < e->n_seg; i++)
        if (!kvp_start_segment(&e->seg[i], e->master.ready, SEG_SIZE, seg_transport))
            return -1;
    e->client = client_new(e->master.ready, "rdma", NULL);
    if (e->client == NULL)
        return -1;
    *state = e;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, "auto");
}

static int setup_tcp_owners(void **state)
{
    return setup_with(state, "tcp");
}

static int teardown(void **state)
{
    env_t *e = *state;
    kvp_client_destroy(e->client);
    int rc = 0;
    for (int i = 0; i < e->n_seg; i++)
        if (kvp_proc_stop(&e->seg[i], SIGTERM, 10000) != 0)
            rc = -1;
    if (kvp_proc_stop(&e->master, SIGTERM, 10000) != 0)
        rc = -1;
    free(e);
    return rc;
}

static const size_t sizes[] = {1,        63, 4096, (64u << 10) - 1, 64u << 10, (64u << 10) + 1,
                               1u << 20, BIG};
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

/* Put every size from src[], get into dst[] (guard bytes around), compare. */
static void round_trip(kvp_client_t *c, const char *tag, uint8_t *const *src, uint8_t *const *dst)
{
    char keybuf[N_SIZES][64];
    const char *keys[N_SIZES];
    const void *bufs[N_SIZES];
    void *gbufs[N_SIZES];
    size_t caps[N_SIZES];
    kvp_status_t res[N_SIZES];
    int64_t got[N_SIZES];
    for (size_t i = 0; i < N_SIZES; i++) {
        snprintf(keybuf[i], sizeof(keybuf[i]), "rdma/%s/%zu", tag, i);
        keys[i] = keybuf[i];
        kvp_fill_pattern(src[i], sizes[i], 7000 + i + (uint64_t)strlen(tag));
        bufs[i] = src[i];
        memset(dst[i], 0xA5, sizes[i] + 128);
        gbufs[i] = dst[i] + 64;
        caps[i] = sizes[i];
    }
    assert_int_equal(kvp_batch_put_from(c, keys, bufs, sizes, N_SIZES, NULL, res), KVP_OK);
    assert_int_equal(kvp_batch_get_into(c, keys, gbufs, caps, N_SIZES, got), KVP_OK);
    for (size_t i = 0; i < N_SIZES; i++) {
        assert_int_equal(got[i], (int64_t)sizes[i]);
        assert_memory_equal(dst[i] + 64, src[i], sizes[i]);
        for (size_t g = 0; g < 64; g++) {
            assert_int_equal(dst[i][g], 0xA5);
            assert_int_equal(dst[i][64 + sizes[i] + g], 0xA5);
        }
    }
    /* one by one too */
    for (size_t i = 0; i < N_SIZES; i++) {
        memset(dst[i] + 64, 0, sizes[i]);
        assert_int_equal(kvp_get_into(c, keys[i], dst[i] + 64, sizes[i]), (int64_t)sizes[i]);
        assert_memory_equal(dst[i] + 64, src[i], sizes[i]);
    }
}

static void test_registered(void **state)
{
    env_t *e = *state;
    uint8_t *src[N_SIZES], *dst[N_SIZES];
    for (size_t i = 0; i < N_SIZES; i++) {
        src[i] = malloc(sizes[i]);
        dst[i] = malloc(sizes[i] + 128);
        assert_non_null(src[i]);
        assert_non_null(dst[i]);
        assert_int_equal(kvp_register_buffer(e->client, src[i], sizes[i]), KVP_OK);
        assert_int_equal(kvp_register_buffer(e->client, dst[i], sizes[i] + 128), KVP_OK);
    }
    round_trip(e->client, "reg", src, dst);
    for (size_t i = 0; i < N_SIZES; i++) {
        assert_int_equal(kvp_unregister_buffer(e->client, src[i]), KVP_OK);
        assert_int_equal(kvp_unregister_buffer(e->client, dst[i]), KVP_OK);
        free(src[i]);
        free(dst[i]);
    }
}

static void test_unregistered_and_mixed(void **state)
{
    env_t *e = *state;
    uint8_t *src[N_SIZES], *dst[N_SIZES];
    for (size_t i = 0; i < N_SIZES; i++) {
        src[i] = malloc(sizes[i]);
        dst[i] = malloc(sizes[i] + 128);
        assert_non_null(src[i]);
        assert_non_null(dst[i]);
    }
    round_trip(e->client, "unreg", src, dst); /* all staged */
    /* every other buffer registered: zero-copy and staged ops in one batch */
    for (size_t i = 0; i < N_SIZES; i += 2) {
        assert_int_equal(kvp_register_buffer(e->client, src[i], sizes[i]), KVP_OK);
        assert_int_equal(kvp_register_buffer(e->client, dst[i], sizes[i] + 128), KVP_OK);
    }
    round_trip(e->client, "mixed", src, dst);
    for (size_t i = 0; i < N_SIZES; i++) {
        if (i % 2 == 0) {
            assert_int_equal(kvp_unregister_buffer(e->client, src[i]), KVP_OK);
            assert_int_equal(kvp_unregister_buffer(e->client, dst[i]), KVP_OK);
        }
        free(src[i]);
        free(dst[i]);
    }
}

static void test_registration(void **state)
{
    env_t *e = *state;
    size_t len = 1 << 20;
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    assert_int_equal(kvp_register_buffer(e->client, buf, len), KVP_OK);
    assert_int_equal(kvp_register_buffer(e->client, buf + 4096, 4096), KVP_ERR_EXISTS);
    assert_int_equal(kvp_unregister_buffer(e->client, buf + 4096), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_unregister_buffer(e->client, buf), KVP_OK);
    assert_int_equal(kvp_register_buffer(e->client, buf + 4096, 4096), KVP_OK);
    /* the new registration carries data */
    kvp_fill_pattern(buf + 4096, 4096, 99);
    assert_int_equal(kvp_put(e->client, "rdma/reg/again", buf + 4096, 4096, NULL), KVP_OK);
    uint8_t out[4096];
    assert_int_equal(kvp_get_into(e->client, "rdma/reg/again", out, sizeof(out)), 4096);
    assert_memory_equal(out, buf + 4096, 4096);
    assert_int_equal(kvp_unregister_buffer(e->client, buf + 4096), KVP_OK);
    free(buf);
}

static void test_forced_rdma_to_tcp_owner(void **state)
{
    env_t *e = *state;
    uint8_t buf[1000];
    kvp_fill_pattern(buf, sizeof(buf), 5);
    const char *keys[3] = {"rdma/tcp-owner/0", "rdma/tcp-owner/1", "rdma/tcp-owner/2"};
    const void *bufs[3] = {buf, buf, buf};
    size_t lens[3] = {10, 100, 1000};
    kvp_status_t res[3];
    assert_int_equal(kvp_batch_put_from(e->client, keys, bufs, lens, 3, NULL, res),
                     KVP_ERR_TRANSPORT);
    int ex[3];
    assert_int_equal(kvp_batch_is_exist(e->client, keys, 3, ex, NULL), KVP_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(res[i], KVP_ERR_TRANSPORT);
        assert_int_equal(ex[i], 0);
    }
    kvp_pool_stat_t *s = NULL;
    assert_int_equal(kvp_pool_stat(e->client, &s), KVP_OK);
    assert_int_equal(s->objects, 0);
    assert_int_equal(s->pending, 0);
    assert_int_equal(s->used, 0);
    kvp_pool_stat_free(s);
    /* the same owners over tcp work: the refusal was the transport's */
    kvp_client_t *tc = client_new(e->master.ready, "tcp", NULL);
    assert_non_null(tc);
    assert_int_equal(kvp_put(tc, keys[0], buf, 10, NULL), KVP_OK);
    kvp_client_destroy(tc);
}

static void test_device_selection(void **state)
{
    env_t *e = *state;
    /* forced rdma, no such device: a clear refusal at create */
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = e->master.ready;
    p.transport = "rdma";
    p.rdma_devices = "nosuchdev0,nosuchdev1";
    kvp_client_t *c = NULL;
    assert_int_equal(kvp_client_create(&p, &c), KVP_ERR_TRANSPORT);
    assert_null(c);
    /* auto with the same list: tcp between hosts, and it works */
    c = client_new(e->master.ready, "auto", "nosuchdev0,nosuchdev1");
    assert_non_null(c);
    uint8_t in[5000], out[5000];
    kvp_fill_pattern(in, sizeof(in), 11);
    assert_int_equal(kvp_put(c, "rdma/auto/fallback", in, sizeof(in), NULL), KVP_OK);
    assert_int_equal(kvp_get_into(c, "rdma/auto/fallback", out, sizeof(out)), sizeof(in));
    assert_memory_equal(in, out, sizeof(in));
    kvp_client_destroy(c);
    /* and the rdma client reads what the fallback client wrote */
    memset(out, 0, sizeof(out));
    assert_int_equal(kvp_get_into(e->client, "rdma/auto/fallback", out, sizeof(out)), sizeof(in));
    assert_memory_equal(in, out, sizeof(in));
}

static bool rdma_device_present(void)
{
    DIR *d = opendir("/sys/class/infiniband");
    if (d == NULL)
        return false;
    bool any = false;
    struct dirent *de;
    while (!any && (de = readdir(d)) != NULL)
        any = de->d_name[0] != '.';
    closedir(d);
    return any;
}

int main(void)
{
    if (!rdma_device_present()) {
        printf("SKIP: no RDMA device on this host (run deploy/test-rdma.sh: Soft-RoCE VM)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_registered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unregistered_and_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forced_rdma_to_tcp_owner, setup_tcp_owners, teardown),
        cmocka_unit_test_setup_teardown(test_device_selection, setup, teardown),
    };
    return cmocka_run_group_tests_name("rdma_transport", tests, NULL, NULL);
}
