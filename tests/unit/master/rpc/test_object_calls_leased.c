/*
 * test_object_calls_leased.c - unit tests for master/rpc/object_calls.c with read leases
 * on: upsert (PutConfig.upsert) in place, elsewhere and under a read, PutEnd's
 * per-replica written_mask (also after a replica's segment went away), and
 * Exist with --lease-on-exist.
 *
 * Drives kvp_dispatch_handle the way the server does (fixture_leases.h); the
 * master clock st->now_ms is set by the tests, so leases are exercised at their
 * exact boundaries.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "master/dispatch.h"
#include "master/meta/placement.h"
#include "master/policy/eviction.h"
#include "master/policy/lease.h"
#include "master/core/state.h"
#include "tests/unit/master/rpc/fixture_leases.h"
#include "tests/unit/master/svc_call.h"

/* ---- upsert ---- */

/* Same size, nobody reading: the object is rewritten in place, invisible until PutEnd. */
static void test_upsert_same_size_in_place(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    view_t old = put_done(st, C1, "k", SZ, 1, NULL, 111);
    put_done(st, C1, "other", 64, 1, NULL, 5);
    assert_int_equal(kvp_master_used(st), EXT + 64);

    view_t up = upsert1(st, C2, "k", SZ);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(up.n, 1);
    assert_int_equal(up.r[0].seg, old.r[0].seg);
    assert_int_equal(up.r[0].off, old.r[0].off);
    assert_int_equal(kvp_master_used(st), EXT + 64);

    /* PENDING while being rewritten: no reader sees the half-written bytes */
    assert_int_equal(grl1(st, "k").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(exist1(st, "k"), 0);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, 1);
    assert_int_equal(s.pending, 1);
    /* only the upserting connection may end it */
    assert_int_equal(end1(st, C1, "k", 222), KVP_ERR_NOT_OWNER);

    assert_int_equal(end1(st, C2, "k", 222), KVP_OK);
    view_t v = grl1(st, "k");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.crc, 222);
    assert_int_equal(v.size, SZ);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, old.r[0].seg);
    assert_int_equal(v.r[0].off, old.r[0].off);
    assert_int_equal(exist1(st, "k"), 1);
    assert_int_equal(kvp_master_used(st), EXT + 64);
    s = stat_get(st);
    assert_int_equal(s.objects, 2);
    assert_int_equal(s.pending, 0);

    /* upsert of an absent key is a plain put */
    view_t fresh = upsert1(st, C1, "new", 64);
    assert_int_equal(fresh.status, KVP_OK);
    assert_int_equal(end1(st, C1, "new", 1), KVP_OK);
    assert_int_equal(kvp_master_used(st), EXT + 64 + 64);
}

/* Same size, but the writer could not reach the segment the object is on lately
 * (PutConfig.avoid_segments, as after a write there timed out): placed anew on another
 * segment, not rewritten in place; the old extents go. */
static void test_upsert_avoiding_its_segment(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t s1 = mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t s2 = mount_seg(st, C1, "s2", "h2", MIB);
    view_t old = put_done(st, C1, "k", SZ, 1, "s1", 1);
    assert_int_equal(old.r[0].seg, s1);

    view_t up = put_avoid(st, C2, "k", SZ, 1, NULL, true, &s1, 1);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(up.n, 1);
    assert_int_equal(up.r[0].seg, s2);
    assert_int_equal(kvp_master_used(st), EXT); /* the old extent freed: nobody reads it */
    assert_int_equal(end1(st, C2, "k", 2), KVP_OK);
    view_t v = grl1(st, "k");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.crc, 2);
    assert_int_equal(v.r[0].seg, s2);
}

/* Another size: new extents, the old ones freed at once (unleased). */
static void test_upsert_other_size(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    put_done(st, C1, "k", SZ, 1, NULL, 1);
    put_done(st, C1, "other", 64, 1, NULL, 2);
    assert_int_equal(kvp_master_used(st), EXT + 64);

    view_t up = upsert1(st, C1, "k", 5000);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(up.n, 1);
    assert_int_equal(up.r[0].len, 5000);
    assert_int_equal(kvp_master_used(st), 5056 + 64); /* 5000 rounded to 64; 1000 freed */
    assert_int_equal(grl1(st, "k").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(end1(st, C1, "k", 3), KVP_OK);
    view_t v = grl1(st, "k");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.size, 5000);
    assert_int_equal(v.crc, 3);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].off, up.r[0].off);
    assert_int_equal(v.r[0].len, 5000);

    /* and smaller again (the lease from the read above has to end first) */
    st->now_ms = 5000;
    up = upsert1(st, C1, "k", 100);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(kvp_master_used(st), 128 + 64);
    assert_int_equal(end1(st, C1, "k", 4), KVP_OK);
    v = grl1(st, "k");
    assert_int_equal(v.size, 100);
    assert_int_equal(graveyard_len(st), 0);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, 2);
    assert_int_equal(s.used, 128 + 64);
}

/* A reader holds a lease: the old extent is kept until it ends, the new one is elsewhere. */
static void test_upsert_leased(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    view_t old = put_done(st, C1, "k", SZ, 1, NULL, 1);
    st->now_ms = 1000;
    assert_int_equal(grl1(st, "k").status, KVP_OK); /* leased until 6000 */

    view_t up = upsert1(st, C2, "k", SZ);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(up.n, 1);
    assert_int_equal(up.r[0].seg, old.r[0].seg);
    assert_true(up.r[0].off != old.r[0].off);
    assert_int_equal(kvp_master_used(st), 2 * EXT);
    assert_int_equal(graveyard_len(st), 1);
    assert_int_equal(grl1(st, "k").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(end1(st, C2, "k", 2), KVP_OK);
    view_t v = grl1(st, "k");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.crc, 2);
    assert_int_equal(v.r[0].off, up.r[0].off);

    st->now_ms = 5999;
    assert_int_equal(kvp_lease_expire(st), 0);
    assert_int_equal(kvp_master_used(st), 2 * EXT);
    st->now_ms = 6000;
    /* two leases end: the retired object's and the new object's (read at 1000 too) */
    assert_int_equal(kvp_lease_expire(st), 2);
    assert_int_equal(kvp_master_used(st), EXT);
    assert_int_equal(graveyard_len(st), 0);
    v = grl1(st, "k");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.r[0].off, up.r[0].off);
}

static void test_upsert_refusals(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    put_done(st, C1, "k", SZ, 1, NULL, 1);
    assert_int_equal(put1(st, C1, "k", SZ).status, KVP_ERR_EXISTS);
    assert_int_equal(put1(st, C2, "k", 2 * SZ).status, KVP_ERR_EXISTS);

    assert_int_equal(put1(st, C1, "p", SZ).status, KVP_OK); /* stays PENDING */
    assert_int_equal(upsert1(st, C1, "p", SZ).status, KVP_ERR_PENDING);
    assert_int_equal(upsert1(st, C2, "p", 2 * SZ).status, KVP_ERR_PENDING);
    assert_int_equal(put1(st, C2, "p", SZ).status, KVP_ERR_PENDING);

    /* an upsert in progress is PENDING too */
    assert_int_equal(upsert1(st, C1, "k", SZ).status, KVP_OK);
    assert_int_equal(upsert1(st, C2, "k", SZ).status, KVP_ERR_PENDING);
    assert_int_equal(upsert1(st, C2, "k", 2 * SZ).status, KVP_ERR_PENDING);
    assert_int_equal(kvp_master_used(st), 2 * EXT);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.pending, 2);
    assert_int_equal(s.objects, 0);
}

/* ---- PutEnd written_mask ---- */

static void test_put_end_written_mask(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t ids[3] = {mount_seg(st, C1, "s1", "h1", MIB), mount_seg(st, C1, "s2", "h2", MIB),
                       mount_seg(st, C1, "s3", "h3", MIB)};

    view_t m = put_cfg(st, C2, "m", SZ, 3, NULL, false);
    assert_int_equal(m.status, KVP_OK);
    assert_int_equal(m.n, 3);
    assert_int_equal(kvp_master_used(st), 3 * EXT);
    uint32_t mask = 0x5; /* replicas 0 and 2 written */
    assert_int_equal(end_mask1(st, C2, "m", 7, &mask), KVP_OK);
    view_t v = grl1(st, "m");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.crc, 7);
    assert_int_equal(v.n, 2);
    assert_int_equal(v.r[0].seg, m.r[0].seg);
    assert_int_equal(v.r[0].off, m.r[0].off);
    assert_int_equal(v.r[1].seg, m.r[2].seg);
    assert_int_equal(v.r[1].off, m.r[2].off);
    assert_int_equal(kvp_master_used(st), 2 * EXT);
    assert_int_equal(seg_used(st, m.r[1].seg), 0);
    assert_int_equal(kvp_segment_table_get(&st->segments, m.r[1].seg)->objects, 0);

    /* nothing written: the put is revoked, all its extents freed */
    view_t z = put_cfg(st, C2, "z", SZ, 3, NULL, false);
    assert_int_equal(z.n, 3);
    assert_int_equal(kvp_master_used(st), 5 * EXT);
    mask = 0;
    assert_int_equal(end_mask1(st, C2, "z", 8, &mask), KVP_ERR_IO);
    assert_int_equal(exist1(st, "z"), 0);
    assert_int_equal(grl1(st, "z").status, KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_master_used(st), 2 * EXT);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, 1);
    assert_int_equal(s.pending, 0);
    assert_int_equal(end1(st, C2, "z", 8), KVP_ERR_NOT_FOUND);
    /* the key is free again */
    assert_int_equal(put1(st, C2, "z", SZ).status, KVP_OK);
    assert_int_equal(end1(st, C2, "z", 8), KVP_OK);
    assert_int_equal(kvp_master_used(st), 3 * EXT);

    /* masks must be absent or one per key: otherwise the whole request is refused */
    assert_int_equal(put1(st, C2, "a", SZ).status, KVP_OK);
    assert_int_equal(put1(st, C2, "b", SZ).status, KVP_OK);
    const char *ab[2] = {"a", "b"};
    uint32_t crcs[2] = {1, 2};
    uint32_t masks[3] = {1, 1, 1};
    Kvpool__StatusesResponse *r = put_end(st, C2, ab, 2, crcs, masks, 1);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_int_equal(r->n_statuses, 0);
    svc_msg_free(r);
    r = put_end(st, C2, ab, 2, crcs, masks, 3);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    assert_int_equal(r->n_statuses, 0);
    svc_msg_free(r);
    s = stat_get(st);
    assert_int_equal(s.pending, 2); /* nothing was ended */
    r = put_end(st, C2, ab, 2, crcs, masks, 2);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 2);
    assert_int_equal(r->statuses[0], KVP_OK);
    assert_int_equal(r->statuses[1], KVP_OK);
    svc_msg_free(r);
    assert_int_equal(grl1(st, "a").crc, 1);
    assert_int_equal(grl1(st, "b").crc, 2);
    assert_int_equal(kvp_master_used(st), 5 * EXT);
    (void)ids;
}

/* ---- Exist and leases ---- */

static void test_exist_lease(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    put_done(st, C1, "k1", 64, 1, NULL, 0);
    put_done(st, C1, "k2", 64, 1, NULL, 0);

    st->config.lease_on_exist = false;
    assert_int_equal(exist1(st, "k1"), 1);
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "k1", false), KVP_OK);

    st->config.lease_on_exist = true;
    st->now_ms = 1000;
    assert_int_equal(exist1(st, "k2"), 1);
    assert_int_equal(exist1(st, "missing"), 0);
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "k2", false), KVP_ERR_LEASED);
    Kvpool__ListResponse *r = list(st, "^k2$", 0, 0, 10);
    assert_int_equal(r->n_entries, 1);
    assert_int_equal(r->entries[0]->lease_ms, 5000);
    svc_msg_free(r);
    st->now_ms = 5999;
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "k2", false), KVP_ERR_LEASED);
    st->now_ms = 6000;
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "k2", false), KVP_OK);
    assert_int_equal(kvp_master_used(st), 0);
}

/* --lease-on-put (Mooncake's tests expect it): an object just written is leased for the
 * TTL, so neither a plain remove nor REPLICA_CLEAR takes it until then; a forced remove
 * does. */
static int32_t clear1(kvp_master_state_t *st, const char *key, const char *segment)
{
    ProtobufCBinaryData kb = {strlen(key), (uint8_t *)key};
    Kvpool__ReplicaClearRequest req = KVPOOL__REPLICA_CLEAR_REQUEST__INIT;
    req.keys = &kb;
    req.n_keys = 1;
    req.segment = (char *)segment;
    Kvpool__StatusesResponse *r =
        svc_call(st, C2, KVP_RPC_REPLICA_CLEAR, &req.base, &kvpool__statuses_response__descriptor);
    assert_non_null(r);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

static void test_put_lease(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    put_done(st, C1, "plain", 64, 1, NULL, 0); /* off (the default): no lease */
    assert_int_equal(clear1(st, "plain", "s1"), KVP_OK);
    assert_int_equal(exist1(st, "plain"), 0);

    st->config.lease_on_put = true;
    st->now_ms = 1000;
    put_done(st, C1, "k1", 64, 1, NULL, 0);
    put_done(st, C1, "k2", 64, 1, NULL, 0);
    assert_int_equal(clear1(st, "k1", "s1"), KVP_ERR_LEASED);
    assert_int_equal(clear1(st, "k1", ""), KVP_ERR_LEASED);
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "k1", false), KVP_ERR_LEASED);
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, "k2", true), KVP_OK); /* force */
    st->now_ms = 5999;
    assert_int_equal(clear1(st, "k1", "s1"), KVP_ERR_LEASED);
    st->now_ms = 6000;
    assert_int_equal(clear1(st, "k1", "s1"), KVP_OK);
    assert_int_equal(exist1(st, "k1"), 0);
    assert_int_equal(exist1(st, "k2"), 0);
}

/*
 * Review finding: a replica's segment unmounted while the put is PENDING must
 * not shift the indices PutEnd's written_mask refers to.
 */
static void test_written_mask_after_unmount(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t a = mount_seg(st, C2, "a", "ha", MIB);
    uint64_t b = mount_seg(st, C3, "b", "hb", MIB);
    view_t v = put_cfg(st, C1, "k", SZ, 2, "a", false);
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.n, 2);
    assert_int_equal(v.r[0].seg, a);
    assert_int_equal(v.r[1].seg, b);
    kvp_dispatch_conn_closed(st, C2); /* a goes away while the put is PENDING */
    uint32_t only_a = 1;              /* a written, b failed: nothing written survives */
    assert_int_equal(end_mask1(st, C1, "k", 7, &only_a), KVP_ERR_IO);
    assert_int_equal(exist1(st, "k"), 0);
    assert_int_equal(seg_used(st, b), 0);

    a = mount_seg(st, C2, "a", "ha", MIB);
    v = put_cfg(st, C1, "k2", SZ, 2, "a", false);
    assert_int_equal(v.status, KVP_OK);
    kvp_dispatch_conn_closed(st, C2);
    uint32_t only_b = 2; /* b written: the object lives on b */
    assert_int_equal(end_mask1(st, C1, "k2", 9, &only_b), KVP_OK);
    view_t g = grl1(st, "k2");
    assert_int_equal(g.status, KVP_OK);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.r[0].seg, b);
    assert_int_equal(g.r[0].off, v.r[1].off);
    assert_int_equal(g.crc, 9);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_upsert_same_size_in_place),
        T(test_upsert_avoiding_its_segment),
        T(test_upsert_other_size),
        T(test_upsert_leased),
        T(test_upsert_refusals),
        T(test_put_end_written_mask),
        T(test_exist_lease),
        T(test_put_lease),
        T(test_written_mask_after_unmount),
    };
#undef T
    return cmocka_run_group_tests_name("object_calls_leased", tests, NULL, NULL);
}
