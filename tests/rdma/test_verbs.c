/*
 * test_verbs.c - unit tests of the RDMA verbs layer (client/transport/rdma_verbs.c) on
 * a real device: inside the Soft-RoCE VM (tests/rdma/rxe-vm.sh), or on any
 * host with an RDMA device given KVP_RDMA_IP.
 *
 * One process: a listener thread accepts (sending its buffer's address and
 * rkey as private data), the test thread connects to $RXE_IP (rdma_cm needs
 * the RDMA netdev's address, not 127.0.0.1), then posts chains and checks
 * completions and bytes. Every test gets a fresh connection and buffers and
 * tears all of it down again (QPs, listener, MRs, device).
 *
 * No RDMA device or no address: prints why and exits 77 (meson: SKIP), so
 * the suite never passes without having run.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "client/transport/rdma_verbs.h"

#define SLICES 8
#define SLICE 4096
#define BUF (SLICES * SLICE)
#define TIMEOUT_MS 20000

typedef struct remote_desc {
    uint64_t addr;
    uint32_t rkey;
    uint32_t len;
} remote_desc_t;

typedef struct fixture {
    kvp_rdma_dev_t *dev;
    kvp_rdma_listener_t *lst;
    uint16_t port;
    uint8_t *srv_buf, *cli_buf;
    kvp_rdma_mr_t *srv_mr, *cli_mr;
    kvp_rdma_qp_t *srv_qp, *cli_qp;
    remote_desc_t remote; /* what the client learned at connect */
    int accept_rc;
    char accept_err[512];
} fixture_t;

static const char *test_ip;

static void *accept_thread(void *arg)
{
    fixture_t *f = arg;
    remote_desc_t d = {(uintptr_t)f->srv_buf, f->srv_mr->rkey, BUF};
    f->accept_rc = kvp_rdma_accept(f->lst, TIMEOUT_MS, &d, sizeof(d), NULL, NULL, &f->srv_qp);
    if (f->accept_rc != 0)
        snprintf(f->accept_err, sizeof(f->accept_err), "%s", kvp_rdma_last_error());
    return NULL;
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    kvp_rdma_dev_params_t p = {.device_names = getenv("KVP_RDMA_DEVICES"), .ipv4 = test_ip};
    int rc = kvp_rdma_dev_open(&p, &f->dev);
    if (rc != 0)
        fail_msg("dev_open: %s", kvp_rdma_last_error());
    const kvp_rdma_dev_info_t *info = kvp_rdma_dev_info(f->dev);
    print_message("device %s port %u gid index %d mtu %u\n", info->name, info->port,
                  info->gid_index, info->active_mtu);
    assert_true(info->active_mtu >= 256);

    f->srv_buf = aligned_alloc(4096, BUF);
    f->cli_buf = aligned_alloc(4096, 2 * BUF);
    assert_non_null(f->srv_buf);
    assert_non_null(f->cli_buf);
    memset(f->srv_buf, 0, BUF);
    memset(f->cli_buf, 0, 2 * BUF);
    if (kvp_rdma_mr_reg(f->dev, f->srv_buf, BUF, true, &f->srv_mr) != 0 ||
        kvp_rdma_mr_reg(f->dev, f->cli_buf, 2 * BUF, false, &f->cli_mr) != 0)
        fail_msg("mr_reg: %s", kvp_rdma_last_error());

    if (kvp_rdma_listen(f->dev, test_ip, 0, 8, &f->lst, &f->port) != 0)
        fail_msg("listen: %s", kvp_rdma_last_error());
    assert_int_not_equal(f->port, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, accept_thread, f), 0);
    rc = kvp_rdma_connect(f->dev, test_ip, f->port, TIMEOUT_MS, NULL, 0, &f->cli_qp);
    char connect_err[512];
    snprintf(connect_err, sizeof(connect_err), "%s", kvp_rdma_last_error());
    pthread_join(t, NULL);
    if (rc != 0)
        fail_msg("connect to %s:%u: %s", test_ip, f->port, connect_err);
    if (f->accept_rc != 0)
        fail_msg("accept: %s", f->accept_err);

    size_t len;
    const void *pd = kvp_rdma_qp_peer_pdata(f->cli_qp, &len);
    assert_true(len >= sizeof(f->remote));
    memcpy(&f->remote, pd, sizeof(f->remote));
    assert_int_equal(f->remote.addr, (uintptr_t)f->srv_buf);
    assert_int_equal(f->remote.rkey, f->srv_mr->rkey);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(kvp_rdma_qp_inflight(f->cli_qp), 0);
    kvp_rdma_qp_destroy(f->cli_qp);
    kvp_rdma_qp_destroy(f->srv_qp);
    kvp_rdma_listener_destroy(f->lst);
    kvp_rdma_mr_dereg(f->cli_mr);
    kvp_rdma_mr_dereg(f->srv_mr);
    kvp_rdma_dev_close(f->dev);
    free(f->cli_buf);
    free(f->srv_buf);
    free(f);
    return 0;
}

/* Collect completions until the chain of `qp` ends; returns how many. */
static int wait_chain(fixture_t *f, kvp_rdma_qp_t *qp, kvp_rdma_wc_t *out, int max)
{
    int got = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        kvp_rdma_wc_t wc[16];
        int n = kvp_rdma_wait(f->dev, wc, 16, 1000);
        if (n < 0)
            fail_msg("wait: %s", kvp_rdma_last_error());
        for (int i = 0; i < n; i++) {
            assert_ptr_equal(wc[i].qp, qp);
            assert_true(got < max);
            out[got++] = wc[i];
            if (wc[i].chain_end)
                return got;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > TIMEOUT_MS)
            fail_msg("no chain end within %d ms (%d completions)", TIMEOUT_MS, got);
    }
}

static void fill_chain(fixture_t *f, kvp_rdma_wr_t *w, size_t local_base)
{
    for (int i = 0; i < SLICES; i++) {
        /* Remote slices in reverse order: a mix-up of slices shows. */
        w[i] = (kvp_rdma_wr_t){.local = f->cli_buf + local_base + (size_t)i * SLICE,
                               .lkey = f->cli_mr->lkey,
                               .len = SLICE,
                               .remote = f->remote.addr + (uint64_t)(SLICES - 1 - i) * SLICE,
                               .rkey = f->remote.rkey,
                               .wr_id = 100 + (uint64_t)i};
    }
}

/* WRITE a chain of 8 slices, READ them back, check every byte. */
static void test_write_read_chain(void **state)
{
    fixture_t *f = *state;
    for (size_t i = 0; i < BUF; i++)
        f->cli_buf[i] = (uint8_t)(i * 7 + i / SLICE);
    kvp_rdma_wr_t w[SLICES];
    kvp_rdma_wc_t wc[SLICES + 1];

    fill_chain(f, w, 0);
    assert_int_equal(kvp_rdma_post_chain(f->cli_qp, KVP_RDMA_WRITE, w, SLICES, NULL), 0);
    assert_int_equal(kvp_rdma_qp_inflight(f->cli_qp), SLICES);
    /* Only the last WR is signaled: one completion for the chain. */
    assert_int_equal(wait_chain(f, f->cli_qp, wc, SLICES + 1), 1);
    assert_int_equal(wc[0].status, KVP_RDMA_WC_OK);
    assert_int_equal(wc[0].wr_id, 100 + SLICES - 1);
    assert_int_equal(kvp_rdma_qp_inflight(f->cli_qp), 0);
    for (int i = 0; i < SLICES; i++)
        assert_memory_equal(f->srv_buf + (size_t)(SLICES - 1 - i) * SLICE,
                            f->cli_buf + (size_t)i * SLICE, SLICE);

    fill_chain(f, w, BUF); /* read into the second half */
    assert_int_equal(kvp_rdma_post_chain(f->cli_qp, KVP_RDMA_READ, w, SLICES, NULL), 0);
    assert_int_equal(wait_chain(f, f->cli_qp, wc, SLICES + 1), 1);
    assert_int_equal(wc[0].status, KVP_RDMA_WC_OK);
    assert_memory_equal(f->cli_buf + BUF, f->cli_buf, BUF);
    assert_false(kvp_rdma_qp_in_error(f->cli_qp));
    assert_string_equal(kvp_rdma_qp_state_str(f->cli_qp), "RTS");
}

/* A READ with a wrong rkey: remote access error; the QP is then in error. */
static void test_bad_rkey(void **state)
{
    fixture_t *f = *state;
    kvp_rdma_wr_t w[SLICES];
    kvp_rdma_wc_t wc[SLICES + 1];
    fill_chain(f, w, 0);
    w[0].rkey ^= 0xff; /* same MR index, wrong key */
    assert_int_equal(kvp_rdma_post_chain(f->cli_qp, KVP_RDMA_READ, w, 1, NULL), 0);
    assert_int_equal(wait_chain(f, f->cli_qp, wc, SLICES + 1), 1);
    print_message("bad rkey READ: %s (ibv status %d)\n", kvp_rdma_wc_status_str(wc[0].status),
                  wc[0].ibv_status);
    assert_int_equal(wc[0].status, KVP_RDMA_WC_REMOTE_ACCESS);
    assert_int_equal(wc[0].wr_id, 100);
    assert_true(kvp_rdma_qp_in_error(f->cli_qp));
    const char *st = kvp_rdma_qp_state_str(f->cli_qp);
    print_message("QP state after the error: %s\n", st ? st : kvp_rdma_last_error());
    assert_non_null(st);
    assert_string_equal(st, "ERR");
    assert_int_equal(kvp_rdma_post_chain(f->cli_qp, KVP_RDMA_READ, w + 1, 1, NULL), -ENOTCONN);
    print_message("post on it: %s\n", kvp_rdma_last_error());
}

/* A bad rkey in the middle of a chain: the failing WR is reported with its
 * own wr_id, the rest is flushed, and the chain still ends exactly once. */
static void test_bad_rkey_mid_chain(void **state)
{
    fixture_t *f = *state;
    kvp_rdma_wr_t w[SLICES];
    kvp_rdma_wc_t wc[SLICES + 1];
    fill_chain(f, w, 0);
    w[3].rkey ^= 0xff;
    assert_int_equal(kvp_rdma_post_chain(f->cli_qp, KVP_RDMA_WRITE, w, SLICES, NULL), 0);
    int n = wait_chain(f, f->cli_qp, wc, SLICES + 1);
    for (int i = 0; i < n; i++)
        print_message("wc %d: wr_id %llu %s%s\n", i, (unsigned long long)wc[i].wr_id,
                      kvp_rdma_wc_status_str(wc[i].status), wc[i].chain_end ? " (chain end)" : "");
    assert_true(n >= 2);
    assert_int_equal(wc[0].wr_id, 103);
    assert_int_equal(wc[0].status, KVP_RDMA_WC_REMOTE_ACCESS);
    for (int i = 1; i < n; i++)
        assert_int_equal(wc[i].status, KVP_RDMA_WC_FLUSHED);
    assert_int_equal(wc[n - 1].wr_id, 100 + SLICES - 1);
    assert_int_equal(kvp_rdma_qp_inflight(f->cli_qp), 0);
    assert_true(kvp_rdma_qp_in_error(f->cli_qp));
}

/* The device's own address; a QP moved to ERR by hand (what a transfer that
 * timed out does): its chain still ends exactly once, nothing stays in
 * flight, and the QP refuses more work. */
static void test_flush(void **state)
{
    fixture_t *f = *state;
    char ip[64];
    assert_int_equal(kvp_rdma_dev_ipv4(f->dev, ip, sizeof(ip)), 0);
    assert_string_equal(ip, test_ip);
    assert_true(kvp_rdma_dev_cq_depth(f->dev) >= 1024);

    kvp_rdma_qp_poll_cm(f->cli_qp); /* nothing pending: still usable */
    assert_false(kvp_rdma_qp_in_error(f->cli_qp));
    kvp_rdma_wr_t w[SLICES];
    kvp_rdma_wc_t wc[SLICES + 1];
    fill_chain(f, w, 0);
    assert_int_equal(kvp_rdma_post_chain(f->cli_qp, KVP_RDMA_READ, w, SLICES, NULL), 0);
    assert_int_equal(kvp_rdma_qp_flush(f->cli_qp), 0);
    int n = wait_chain(f, f->cli_qp, wc, SLICES + 1);
    for (int i = 0; i < n; i++)
        assert_true(wc[i].status == KVP_RDMA_WC_OK || wc[i].status == KVP_RDMA_WC_FLUSHED);
    assert_int_equal(wc[n - 1].wr_id, 100 + SLICES - 1);
    assert_int_equal(kvp_rdma_qp_inflight(f->cli_qp), 0);
    assert_true(kvp_rdma_qp_in_error(f->cli_qp));
    assert_string_equal(kvp_rdma_qp_state_str(f->cli_qp), "ERR");
    assert_int_equal(kvp_rdma_post_chain(f->cli_qp, KVP_RDMA_READ, w, 1, NULL), -ENOTCONN);
}

/* The passive side goes away: the connector learns it from rdma_cm. */
static void test_disconnect_seen(void **state)
{
    fixture_t *f = *state;
    kvp_rdma_qp_destroy(f->srv_qp); /* rdma_disconnect */
    f->srv_qp = NULL;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        kvp_rdma_qp_poll_cm(f->cli_qp);
        if (kvp_rdma_qp_in_error(f->cli_qp))
            break;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > TIMEOUT_MS)
            fail_msg("the disconnect was not seen within %d ms", TIMEOUT_MS);
        struct timespec ten_ms = {0, 10 * 1000 * 1000};
        nanosleep(&ten_ms, NULL);
    }
    kvp_rdma_wr_t w[SLICES];
    fill_chain(f, w, 0);
    assert_int_equal(kvp_rdma_post_chain(f->cli_qp, KVP_RDMA_READ, w, 1, NULL), -ENOTCONN);
}

/* Bounded in-flight work and argument checks, without the network. */
static void test_limits(void **state)
{
    fixture_t *f = *state;
    kvp_rdma_wr_t w[SLICES];
    fill_chain(f, w, 0);
    assert_int_equal(kvp_rdma_post_chain(f->cli_qp, KVP_RDMA_WRITE, w, 0, NULL), -EINVAL);
    assert_int_equal(
        kvp_rdma_post_chain(f->cli_qp, KVP_RDMA_WRITE, w, KVP_RDMA_MAX_CHAIN + 1, NULL), -EINVAL);
    kvp_rdma_qp_t *qp = NULL;
    assert_int_not_equal(kvp_rdma_connect(f->dev, "127.0.0.1x", f->port, 1000, NULL, 0, &qp), 0);
    print_message("bad address: %s\n", kvp_rdma_last_error());
    assert_null(qp);
}

int main(void)
{
    test_ip = getenv("KVP_RDMA_IP");
    if (test_ip == NULL)
        test_ip = getenv("RXE_IP");
    if (test_ip == NULL) {
        printf("SKIP: no RDMA address (RXE_IP / KVP_RDMA_IP unset): run inside "
               "tests/rdma/rxe-vm.sh, or set KVP_RDMA_IP to an RDMA netdev's IPv4 address\n");
        return 77;
    }
    kvp_rdma_dev_params_t p = {.device_names = getenv("KVP_RDMA_DEVICES"), .ipv4 = test_ip};
    kvp_rdma_dev_t *dev;
    int rc = kvp_rdma_dev_open(&p, &dev);
    if (rc == -ENODEV) {
        printf("SKIP: %s\n", kvp_rdma_last_error());
        return 77;
    }
    if (rc != 0) {
        printf("FAIL: cannot open an RDMA device: %s\n", kvp_rdma_last_error());
        return 1;
    }
    kvp_rdma_dev_close(dev);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_write_read_chain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_rkey, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_rkey_mid_chain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flush, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disconnect_seen, setup, teardown),
    };
    return cmocka_run_group_tests_name("rdma_verbs", tests, NULL, NULL);
}
