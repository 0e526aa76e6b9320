/*
 * test_segment_calls.c - unit tests for master/rpc/segment_calls.c: Mount (its checks
 * and what it says when it refuses), Unmount, and the unmount of a closed
 * connection's segments with the replicas it leaves.
 *
 * Drives kvp_dispatch_handle the way the server does (fixture_store.h); STAT is
 * the independent view of the accounting.
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
#include "tests/unit/master/rpc/fixture_store.h"
#include "tests/unit/master/svc_call.h"

/* ---- mount ---- */

static void test_mount(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id = 0, id2 = 0;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 1 << 20, &id), KVP_OK);
    assert_true(id != 0);
    /* same name again, from another connection: refused, nothing changes */
    assert_int_equal(mount_seg(st, C2, "seg-a", "host2", 2 << 20, &id2), KVP_ERR_EXISTS);
    assert_true(id2 == 0);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.n_segments, 1);
    assert_int_equal(s.capacity, 1 << 20);
    assert_int_equal(s.used, 0);
    /* another name is fine, and gets another id */
    assert_int_equal(mount_seg(st, C2, "seg-b", "host2", 2 << 20, &id2), KVP_OK);
    assert_true(id2 != 0 && id2 != id);
    s = stat_get(st);
    assert_int_equal(s.n_segments, 2);
    assert_int_equal(s.capacity, 3 << 20);

    /* PING answers OK with an empty body */
    uint8_t *resp = (uint8_t *)"x";
    size_t rlen = 5;
    char err[64];
    assert_int_equal(handle_raw(st, C1, KVP_RPC_PING, NULL, 0, &resp, &rlen, err, sizeof(err)),
                     KVP_OK);
    assert_int_equal(rlen, 0);
    free(resp);
}

static void test_mount_bad(void **state)
{
    kvp_master_state_t *st = *state;
    char longname[300];
    memset(longname, 'n', 256);
    longname[256] = '\0';

    for (int c = 0; c < 10; c++) {
        Kvpool__SegmentDesc d;
        fill_desc(&d);
        switch (c) {
        case 0:
            d.size = 0;
            break;
        case 1:
            d.medium = (char *)"gpu"; /* dram and ssd are the media */
            break;
        case 2:
            d.name = (char *)"";
            break;
        case 3:
            d.host_id = (char *)"";
            break;
        case 4:
            d.tcp_endpoint = (char *)"no-port";
            break;
        case 5:
            d.tcp_endpoint = (char *)"";
            break;
        case 6:
            d.name = longname;
            break;
        case 7:
            d.size = 32;
            break; /* below the 64-byte allocation granularity */
        case 8:
            d.tcp_endpoint = (char *)"127.0.0.1:70000";
            break;
        case 9:
            d.rdma_endpoint = (char *)"169.254.77.1"; /* no port */
            break;
        }
        char msg[256];
        uint64_t id = 12345;
        int32_t s = mount_desc_msg(st, C1, &d, &id, msg);
        if (s != KVP_ERR_INVALID_ARG)
            fail_msg("bad mount case %d: status %d, want KVP_ERR_INVALID_ARG", c, s);
        assert_true(id == 0);
        /* a refusal says why (case 7 is checked on its own below) */
        if (c != 7 && msg[0] == '\0')
            fail_msg("bad mount case %d: refused without a message", c);
    }
    /* no segment at all in the request */
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    Kvpool__MountResponse *r =
        svc_call(st, C1, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    svc_msg_free(r);

    stat_snap_t s = stat_get(st);
    assert_int_equal(s.n_segments, 0);
    assert_int_equal(s.capacity, 0);
    /* a 255-byte name is the longest allowed */
    longname[255] = '\0';
    assert_int_equal(mount_seg(st, C1, longname, "h", 4096, NULL), KVP_OK);
}

/* A segment smaller than the 64-byte granularity is refused, and the refusal says why. */
static void test_mount_too_small_says_why(void **state)
{
    kvp_master_state_t *st = *state;
    Kvpool__SegmentDesc d;
    fill_desc(&d);
    d.size = 32;
    char msg[256];
    assert_int_equal(mount_desc_msg(st, C1, &d, NULL, msg), KVP_ERR_INVALID_ARG);
    assert_int_equal(stat_get(st).n_segments, 0);
    if (msg[0] == '\0')
        fail_msg("mount of a 32-byte segment refused with KVP_ERR_INVALID_ARG but an empty "
                 "message");
}

static void test_conn_closed_unmounts(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t seg_a;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 1 << 20, &seg_a), KVP_OK);
    /* objects written by C2 into C1's segment, one complete, one pending */
    assert_int_equal(put1(st, C2, "x", 4096, NULL), KVP_OK);
    assert_int_equal(end1(st, C2, "x", 1), KVP_OK);
    assert_int_equal(put1(st, C2, "y", 4096, NULL), KVP_OK);
    assert_int_equal(exist1(st, "x"), 1);

    kvp_dispatch_conn_closed(st, C1);
    assert_int_equal(exist1(st, "x"), 0);
    assert_int_equal(replicas1_status(st, "x"), KVP_ERR_NOT_FOUND);
    assert_int_equal(size1(st, "x"), KVP_ERR_NOT_FOUND);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.n_segments, 0);
    assert_int_equal(s.capacity, 0);
    assert_int_equal(s.objects, 0);
    assert_int_equal(s.pending, 0);
    /* the pending writer finds its object gone */
    assert_int_equal(end1(st, C2, "y", 1), KVP_ERR_NOT_FOUND);
    /* nothing to place on */
    assert_int_equal(put1(st, C2, "z", 64, NULL), KVP_ERR_NO_SEGMENT);
    /* the name can be mounted again */
    uint64_t again;
    assert_int_equal(mount_seg(st, C2, "seg-a", "host1", 1 << 20, &again), KVP_OK);
    assert_true(again != seg_a); /* the old id does not resolve to the new segment */
}

static void test_unmount_keeps_other_replicas(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t seg_a, seg_b;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 1 << 20, &seg_a), KVP_OK);
    assert_int_equal(mount_seg(st, C3, "seg-b", "host2", 1 << 20, &seg_b), KVP_OK);
    /* two replicas each (one per host); a long key so the key bytes move on a drop */
    char longkey[600];
    memset(longkey, 'L', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';
    const char *keys[] = {"two/1", "two/2", longkey};
    const uint64_t sizes[] = {1000, 2000, 3000};
    Kvpool__PutStartResponse *ps = put_start(st, C2, keys, 3, sizes, 3, 2, NULL);
    uint64_t off_b[3] = {0};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ps->results[i]->status, KVP_OK);
        assert_int_equal(ps->results[i]->n_replicas, 2);
        assert_true(ps->results[i]->replicas[0]->segment_id !=
                    ps->results[i]->replicas[1]->segment_id);
        for (int r = 0; r < 2; r++)
            if (ps->results[i]->replicas[r]->segment_id == seg_b)
                off_b[i] = ps->results[i]->replicas[r]->offset;
    }
    assert_int_equal(ps->n_segments, 2);
    svc_msg_free(ps);
    const uint32_t crcs[] = {1, 2, 3};
    Kvpool__StatusesResponse *er = put_end(st, C2, keys, 3, crcs, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(er->statuses[i], KVP_OK);
    svc_msg_free(er);

    /* unmount by someone else than the owner: refused */
    Kvpool__UnmountRequest ur = KVPOOL__UNMOUNT_REQUEST__INIT;
    ur.segment_id = seg_a;
    Kvpool__UnmountResponse *um =
        svc_call(st, C2, KVP_RPC_UNMOUNT, &ur.base, &kvpool__unmount_response__descriptor);
    assert_int_equal(um->status, KVP_ERR_NOT_OWNER);
    svc_msg_free(um);
    assert_int_equal(stat_get(st).n_segments, 2);

    /* seg-a's owner goes away: every object keeps its seg-b replica */
    kvp_dispatch_conn_closed(st, C1);
    Kvpool__GetReplicaListResponse *gr = replicas(st, keys, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(gr->results[i]->status, KVP_OK);
        assert_int_equal(gr->results[i]->size, sizes[i]);
        assert_int_equal(gr->results[i]->crc32c, crcs[i]);
        assert_int_equal(gr->results[i]->n_replicas, 1);
        assert_true(gr->results[i]->replicas[0]->segment_id == seg_b);
        assert_true(gr->results[i]->replicas[0]->offset == off_b[i]);
    }
    assert_int_equal(gr->n_segments, 1);
    assert_true(gr->segments[0]->id == seg_b);
    svc_msg_free(gr);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.n_segments, 1);
    assert_int_equal(s.objects, 3);
    assert_int_equal(s.seg_objects_sum, 3);

    /* the stale id of seg-a is gone for an explicit unmount too */
    um = svc_call(st, C1, KVP_RPC_UNMOUNT, &ur.base, &kvpool__unmount_response__descriptor);
    assert_int_equal(um->status, KVP_ERR_SEGMENT_GONE);
    svc_msg_free(um);

    /* removing them frees seg-b completely */
    for (int i = 0; i < 3; i++)
        assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, keys[i]), KVP_OK);
    s = stat_get(st);
    assert_int_equal(s.used, 0);
    assert_int_equal(s.seg_objects_sum, 0);

    /* explicit unmount by the owner reports how many objects lost their last replica */
    assert_int_equal(put1(st, C2, "only-b", 64, NULL), KVP_OK);
    assert_int_equal(end1(st, C2, "only-b", 0), KVP_OK);
    ur.segment_id = seg_b;
    um = svc_call(st, C3, KVP_RPC_UNMOUNT, &ur.base, &kvpool__unmount_response__descriptor);
    assert_int_equal(um->status, KVP_OK);
    assert_int_equal(um->objects_dropped, 1);
    svc_msg_free(um);
    assert_int_equal(exist1(st, "only-b"), 0);
    assert_int_equal(stat_get(st).n_segments, 0);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_mount),
        T(test_mount_bad),
        T(test_mount_too_small_says_why),
        T(test_conn_closed_unmounts),
        T(test_unmount_keeps_other_replicas),
    };
#undef T
    return cmocka_run_group_tests_name("segment_calls", tests, NULL, NULL);
}
