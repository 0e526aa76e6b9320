/*
 * test_hot_keys.c - unit tests for master/policy/hot_keys.c: the hot-key fanout through
 * kvp_dispatch_handle as the server calls it (fixture_leases.h: read leases of 5000 ms) and
 * its timer (kvp_hot_tick): which keys get a replica, written by a replica's owner through a
 * copy task (fixture_tasks.h), when it is taken back, and what the tenant's quota allows.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>

#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "master/core/state.h"
#include "master/policy/hot_keys.h"
#include "master/policy/lease.h"
#include "tests/unit/master/rpc/fixture_leases.h"
#include "tests/unit/master/rpc/fixture_tasks.h"

/* A window of the hot-key fanout: `reads` gets of key, then the window's end. */
static void window(kvp_master_state_t *st, const char *key, int reads)
{
    for (int i = 0; i < reads; i++)
        assert_int_equal(grl1(st, key).status, KVP_OK);
    st->now_ms += 1000;
    kvp_lease_expire(st); /* as the server's timer does */
    kvp_hot_tick(st);
}

/* --hot-key-reads: a key read that often gets a replica on another host, written by its
 * owner through a copy task, at most --hot-key-replicas of them; once it cools (and its
 * read leases ended) the replica goes, its extent freed. A key read less is never copied. */
static void test_hot_keys(void **state)
{
    kvp_master_state_t *st = *state;
    st->config.hot_key_reads = 10;
    st->config.hot_key_replicas = 1;
    uint64_t s1 = mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t s2 = mount_seg(st, C2, "s2", "h2", MIB);
    uint64_t s3 = mount_seg(st, C3, "s3", "h3", MIB);
    put_done(st, C3, "hot", SZ, 1, "s1", 42);
    put_done(st, C3, "cold", SZ, 1, "s1", 43);
    window(st, "cold", 9); /* under the rate: nothing */
    assert_int_equal(offers(st, C1, NULL), 0);
    window(st, "hot", 10);
    tid_t t = {0};
    assert_int_equal(offers(st, C1, &t), 1); /* the owner of its replica writes the copy */
    started_t s = start(st, C1, t);
    assert_int_equal(s.n, 1);
    assert_true(s.d[0].seg == s2 || s.d[0].seg == s3);
    uint64_t dyn = s.d[0].seg;
    int32_t ok[1] = {KVP_OK};
    assert_int_equal(end(st, C1, t, ok, 1).task_status, KVP_TASK_SUCCESS);
    assert_int_equal(grl1(st, "hot").n, 2);
    window(st, "hot", 20); /* still hot: the task is the key's; no more than 1 more */
    window(st, "hot", 20);
    assert_int_equal(offers(st, C1, NULL), 0);
    assert_int_equal(st->stats.hot_added, 1);
    assert_int_equal(seg_used(st, dyn), EXT);
    /* it cools: after 5 windows under 10/4 reads and its leases over, the replica goes */
    for (int w = 0; w < 4; w++)
        window(st, "hot", 1);
    assert_int_equal(seg_used(st, dyn), EXT);
    for (int w = 0; w < 8 && seg_used(st, dyn) != 0; w++)
        window(st, "hot", 0);
    assert_int_equal(seg_used(st, dyn), 0);
    assert_int_equal(st->stats.hot_dropped, 1);
    view_t v = grl1(st, "hot");
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, s1);
    assert_int_equal(v.crc, 42);
    /* overwritten while hot with a replica given: forgotten, nothing dropped twice */
    window(st, "cold", 10);
    assert_int_equal(offers(st, C1, &t), 1);
    assert_int_equal(start(st, C1, t).n, 1);
    assert_int_equal(end(st, C1, t, ok, 1).task_status, KVP_TASK_SUCCESS);
    window(st, "cold", 10);
    assert_int_equal(st->stats.hot_added, 2);
    assert_int_equal(keys1(st, C3, KVP_RPC_REMOVE, "cold", true), KVP_OK);
    for (int w = 0; w < 8; w++)
        window(st, "hot", 0);
    assert_int_equal(st->stats.hot_dropped, 1);
    assert_int_equal(seg_used(st, s2) + seg_used(st, s3), 0);
}

/* A hot key's replica counts against its tenant's DRAM quota: none while it would pass
 * max-dram or the tenant's admission is closed (the quota admin API), one once it fits. */
static void test_hot_keys_quota(void **state)
{
    kvp_master_state_t *st = *state;
    st->config.hot_key_reads = 10;
    st->config.hot_key_replicas = 1;
    mount_seg(st, C1, "s1", "h1", MIB);
    mount_seg(st, C2, "s2", "h2", MIB);
    put_done(st, C3, "hot", SZ, 1, "s1", 42);
    kvp_tenant_t *tn = &st->tenants.t[0];
    assert_int_equal(tn->dram_bytes, SZ); /* charged: its size per replica */
    tn->max_dram = 2 * SZ - 1;            /* holds the replica it has, not a second */
    window(st, "hot", 10);
    window(st, "hot", 10);
    assert_int_equal(offers(st, C1, NULL), 0);
    tn->max_dram = 2 * SZ;
    tn->closed = 1;
    window(st, "hot", 10);
    assert_int_equal(offers(st, C1, NULL), 0);
    tn->closed = 0;
    window(st, "hot", 10);
    tid_t t = {0};
    assert_int_equal(offers(st, C1, &t), 1);
    assert_int_equal(start(st, C1, t).n, 1);
    int32_t ok[1] = {KVP_OK};
    assert_int_equal(end(st, C1, t, ok, 1).task_status, KVP_TASK_SUCCESS);
    assert_int_equal(grl1(st, "hot").n, 2);
    assert_int_equal(tn->dram_bytes, 2 * SZ);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hot_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hot_keys_quota, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
