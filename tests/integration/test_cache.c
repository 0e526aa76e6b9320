/*
 * test_cache.c - kvpool as a cache, with real processes: a master with
 * eviction on and short leases/timeouts, one `kvpool serve` segment, this
 * process as the client.
 *
 * - fill the pool 3x over while re-reading a hot set: every put succeeds,
 *   the hot keys survive, every get returns the right bytes or NOT_FOUND,
 *   and at the end nothing is pending and usage is under the watermark;
 * - read leases end with the read: a key just read can be removed at once
 *   (reads in flight: test_leases.c);
 * - a writer that starts a put and then goes silent (connection open, no
 *   PutEnd) has its put revoked after --put-timeout;
 * - hard pins survive the churn.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "common/rpc.h"
#include "common/clock.h"
#include "common/sock.h"
#include "common/parse.h"
#include "kvpool.pb-c.h"
#include "tests/harness.h"

#define SEG_BYTES (32ull << 20)
#define OBJ 65536

typedef struct env {
    kvp_proc_t master;
    kvp_proc_t seg;
    kvp_client_t *client;
} env_t;

static int setup(void **state)
{
    env_t *e = calloc(1, sizeof(*e));
    char *args[] = {"--lease-ttl", "1", "--put-timeout", "1", NULL};
    if (!kvp_start_master_args(&e->master, args))
        return -1;
    if (!kvp_start_segment(&e->seg, e->master.ready, "32MiB", NULL))
        return -1;
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = e->master.ready;
    if (kvp_client_create(&p, &e->client) != KVP_OK)
        return -1;
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    env_t *e = *state;
    kvp_client_destroy(e->client);
    int rc = 0;
    if (kvp_proc_stop(&e->seg, SIGTERM, 10000) != 0)
        rc = -1;
    if (kvp_proc_stop(&e->master, SIGTERM, 10000) != 0)
        rc = -1;
    free(e);
    return rc;
}

static kvp_pool_stat_t *stat_of(env_t *e)
{
    kvp_pool_stat_t *s = NULL;
    assert_int_equal(kvp_pool_stat(e->client, &s), KVP_OK);
    return s;
}

/* Fill 3x the pool with a churning working set while reading a hot set. */
static void test_fill_three_times(void **state)
{
    env_t *e = *state;
    uint8_t *val = malloc(OBJ), *out = malloc(OBJ);
    enum { HOT = 16 };
    const unsigned total = (unsigned)(3 * SEG_BYTES / OBJ); /* 1536 puts of 64 KiB into 32 MiB */
    char key[64];
    for (unsigned h = 0; h < HOT; h++) {
        snprintf(key, sizeof(key), "hot-%u", h);
        kvp_fill_pattern(val, OBJ, 100000 + h);
        assert_int_equal(kvp_put(e->client, key, val, OBJ, NULL), KVP_OK);
    }
    unsigned found_cold = 0, gone_cold = 0;
    for (unsigned i = 0; i < total; i++) {
        snprintf(key, sizeof(key), "cold-%u", i);
        kvp_fill_pattern(val, OBJ, i);
        assert_int_equal(kvp_put(e->client, key, val, OBJ, NULL), KVP_OK);
        if (i % 8 == 0) {
            /* the hot set is read often: it stays most recently used */
            for (unsigned h = 0; h < HOT; h++) {
                snprintf(key, sizeof(key), "hot-%u", h);
                kvp_fill_pattern(val, OBJ, 100000 + h);
                assert_int_equal(kvp_get_into(e->client, key, out, OBJ), OBJ);
                assert_memory_equal(out, val, OBJ);
            }
        }
    }
    /* every cold key is either intact or gone: never other bytes */
    for (unsigned i = 0; i < total; i++) {
        snprintf(key, sizeof(key), "cold-%u", i);
        int64_t r = kvp_get_into(e->client, key, out, OBJ);
        if (r == OBJ) {
            kvp_fill_pattern(val, OBJ, i);
            assert_memory_equal(out, val, OBJ);
            found_cold++;
        } else {
            assert_int_equal(r, KVP_ERR_NOT_FOUND);
            gone_cold++;
        }
    }
    /* the newest cold key is there, the oldest are gone */
    assert_true(gone_cold > total / 2);
    assert_true(found_cold > 0);
    kvp_pool_stat_t *s = stat_of(e);
    assert_int_equal(s->pending, 0);
    assert_true(s->evicted_objects >= gone_cold);
    assert_true(s->used <= s->capacity);
    kvp_pool_stat_free(s);
    free(val);
    free(out);
}

/*
 * Read leases end with the read (issue 10): a key just read can be removed at
 * once, without force. A read still in flight blocks a plain remove; that, the
 * forced remove under a read and the TTL safety net are tested in test_leases.c.
 */
static void test_read_lease(void **state)
{
    env_t *e = *state;
    char val[4096], out[4096];
    kvp_fill_pattern(val, sizeof(val), 7);
    assert_int_equal(kvp_put(e->client, "leased", val, sizeof(val), NULL), KVP_OK);
    assert_int_equal(kvp_put(e->client, "leased2", val, sizeof(val), NULL), KVP_OK);
    /* not read yet: no lease, plain remove works */
    assert_int_equal(kvp_remove(e->client, "leased2"), KVP_OK);
    assert_int_equal(kvp_get_into(e->client, "leased", out, sizeof(out)), (int64_t)sizeof(out));
    assert_memory_equal(out, val, sizeof(out));
    /* the get has finished, so has its lease: the plain remove goes through at once
     * (one call, no waiting out the 1 s TTL) */
    assert_int_equal(kvp_remove(e->client, "leased"), KVP_OK);
    assert_int_equal(kvp_is_exist(e->client, "leased"), 0);
    /* force removes a just-read object at once too */
    assert_int_equal(kvp_put(e->client, "leased", val, sizeof(val), NULL), KVP_OK);
    assert_int_equal(kvp_get_into(e->client, "leased", out, sizeof(out)), (int64_t)sizeof(out));
    assert_int_equal(kvp_remove_force(e->client, "leased"), KVP_OK);
    assert_int_equal(kvp_is_exist(e->client, "leased"), 0);
}

/* A writer that sends PutStart and then goes silent, its connection open. */
static void test_zombie_put(void **state)
{
    env_t *e = *state;
    char host[64];
    uint16_t port;
    assert_int_equal(kvp_parse_hostport(e->master.ready, host, sizeof(host), &port), KVP_OK);
    int fd;
    assert_int_equal(kvp_tcp_connect(host, port, 5000, &fd), KVP_OK);
    ProtobufCBinaryData k = {.len = 6, .data = (uint8_t *)"zombie"};
    uint64_t size = 4096;
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    req.keys = &k;
    req.n_keys = 1;
    req.sizes = &size;
    req.n_sizes = 1;
    uint8_t body[256];
    size_t len = kvpool__put_start_request__pack(&req, body);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    assert_int_equal(kvp_rpc_call(fd, KVP_RPC_PUT_START, 1, body, len, &resp, &rlen), KVP_OK);
    Kvpool__PutStartResponse *pr = kvpool__put_start_response__unpack(NULL, rlen, resp);
    free(resp);
    assert_non_null(pr);
    assert_int_equal(pr->results[0]->status, KVP_OK);
    kvpool__put_start_response__free_unpacked(pr, NULL);

    char val[4096], out[4096];
    kvp_fill_pattern(val, sizeof(val), 99);
    /* while the zombie's put is PENDING the key is taken, and invisible */
    assert_int_equal(kvp_put(e->client, "zombie", val, sizeof(val), NULL), KVP_ERR_PENDING);
    assert_int_equal(kvp_is_exist(e->client, "zombie"), 0);
    /* after --put-timeout (1 s) the master revokes it: the key is usable again */
    uint64_t t0 = kvp_now_ms();
    kvp_status_t st;
    while ((st = kvp_put(e->client, "zombie", val, sizeof(val), NULL)) == KVP_ERR_PENDING &&
           kvp_now_ms() - t0 < 5000)
        usleep(50000);
    assert_int_equal(st, KVP_OK);
    assert_int_equal(kvp_get_into(e->client, "zombie", out, sizeof(out)), (int64_t)sizeof(out));
    assert_memory_equal(out, val, sizeof(val));
    kvp_pool_stat_t *s = stat_of(e);
    assert_true(s->put_timeouts >= 1);
    assert_int_equal(s->pending, 0);
    kvp_pool_stat_free(s);
    close(fd);
    assert_int_equal(kvp_remove_force(e->client, "zombie"), KVP_OK);
}

static void test_hard_pins_survive(void **state)
{
    env_t *e = *state;
    uint8_t *val = malloc(OBJ), *out = malloc(OBJ);
    kvp_put_config_t pin;
    kvp_put_config_init(&pin);
    pin.pin = KVP_PIN_HARD;
    char key[64];
    for (unsigned i = 0; i < 8; i++) {
        snprintf(key, sizeof(key), "pinned-%u", i);
        kvp_fill_pattern(val, OBJ, 5000 + i);
        assert_int_equal(kvp_put(e->client, key, val, OBJ, &pin), KVP_OK);
    }
    /* churn 2x the pool of unpinned objects */
    for (unsigned i = 0; i < 2 * SEG_BYTES / OBJ; i++) {
        snprintf(key, sizeof(key), "churn-%u", i);
        kvp_fill_pattern(val, OBJ, i);
        assert_int_equal(kvp_put(e->client, key, val, OBJ, NULL), KVP_OK);
    }
    for (unsigned i = 0; i < 8; i++) {
        snprintf(key, sizeof(key), "pinned-%u", i);
        kvp_fill_pattern(val, OBJ, 5000 + i);
        assert_int_equal(kvp_get_into(e->client, key, out, OBJ), OBJ);
        assert_memory_equal(out, val, OBJ);
    }
    free(val);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill_three_times),
        cmocka_unit_test(test_read_lease),
        cmocka_unit_test(test_zombie_put),
        cmocka_unit_test(test_hard_pins_survive),
    };
    return cmocka_run_group_tests_name("cache", tests, setup, teardown);
}
