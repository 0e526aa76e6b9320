/*
 * test_segment_calls_leased.c - unit tests for master/rpc/segment_calls.c with read
 * leases on: the segment table a Heartbeat hands out, and the bounds on a
 * mounted segment's size.
 *
 * Drives kvp_dispatch_handle the way the server does (fixture_leases.h).
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

/* ---- heartbeat and drain ---- */

/* The heartbeat hands the whole segment table to a client whose version is not the
 * current one (so it attaches peers before its first transfer), and nothing otherwise. */
static void test_heartbeat_segment_table(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id1 = mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t ids[8], v0 = 0, v1 = 0, v2 = 0;
    size_t n = heartbeat_table(st, C3, 0, &v0, ids, 8); /* a new client knows nothing */
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], id1);
    assert_true(v0 != 0);
    assert_int_equal(heartbeat_table(st, C3, v0, &v1, ids, 8), 0); /* up to date */
    assert_int_equal(v1, 0);
    uint64_t id2 = mount_seg(st, C2, "s2", "h2", MIB);
    n = heartbeat_table(st, C3, v0, &v1, ids, 8); /* a mount changes the version */
    assert_int_equal(n, 2);
    assert_true(v1 != v0);
    assert_true((ids[0] == id1 && ids[1] == id2) || (ids[0] == id2 && ids[1] == id1));
    kvp_dispatch_conn_closed(st, C2); /* its owner's connection closes: unmounted */
    n = heartbeat_table(st, C3, v1, &v2, ids, 8);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], id1);
    assert_true(v2 != v1 && v2 != 0);
}

/*
 * Found by the fuzzer (tests/fuzz/crashes/capacity_overflow): a mount whose
 * size made the pool's capacity wrap to a few KiB made every eviction check
 * think the pool was over its watermark and evict everyone's objects.
 */
static void test_mount_size_bounds(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "ok", "h1", 1 << 20);
    assert_int_equal(put1(st, C1, "keep", SZ).status, KVP_OK);
    assert_int_equal(end1(st, C1, "keep", 1), KVP_OK);
    static const uint64_t bad[] = {UINT64_MAX, UINT64_MAX - (1ull << 20) + 4096,
                                   KVP_SEGMENT_MAX_SIZE + 1};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        Kvpool__MountResponse *r = mount_raw(st, C2, "evil", "h2", bad[i]);
        assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
        assert_true(strlen(r->message) > 0);
        svc_msg_free(r);
    }
    assert_int_equal(st->segments.capacity, 1 << 20);
    kvp_evict_if_needed(st);
    assert_int_equal(exist1(st, "keep"), 1);
    /* the largest segment is fine, and so is the pool's sum of them */
    mount_seg(st, C2, "huge", "h2", KVP_SEGMENT_MAX_SIZE);
    assert_int_equal(st->segments.capacity, KVP_SEGMENT_MAX_SIZE + (1 << 20));
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_heartbeat_segment_table),
        T(test_mount_size_bounds),
    };
#undef T
    return cmocka_run_group_tests_name("segment_calls_leased", tests, NULL, NULL);
}
