/*
 * test_drain_calls.c - unit tests for master/rpc/drain_calls.c: Drain (and the
 * segments a Heartbeat asks to drain), placement around draining segments,
 * MoveStart/MoveEnd, and the cleanup of moves in flight beside removed objects
 * kept for their readers.
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

static void test_heartbeat_and_drain(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id1 = mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t id2 = mount_seg(st, C2, "s2", "h2", MIB);
    uint64_t drained[16];
    size_t nd = 99;
    bool remount = true;

    assert_int_equal(heartbeat(st, C1, &id1, 1, &remount, drained, &nd), KVP_OK);
    assert_false(remount);
    assert_int_equal(nd, 0);
    assert_int_equal(heartbeat(st, C1, NULL, 0, &remount, drained, &nd), KVP_OK);
    assert_false(remount);
    uint64_t unknown[2] = {id1, id1 + 5};
    assert_int_equal(heartbeat(st, C1, unknown, 2, &remount, drained, &nd), KVP_OK);
    assert_true(remount);
    assert_int_equal(heartbeat(st, C1, &id2, 1, &remount, drained, &nd), KVP_OK);
    assert_true(remount); /* mounted, but by someone else */

    uint64_t got = 0;
    char msg[256];
    assert_int_equal(drain(st, C3, "s1", 0, &got, msg), KVP_OK);
    assert_int_equal(got, id1);
    assert_int_equal(heartbeat(st, C1, &id1, 1, &remount, drained, &nd), KVP_OK);
    assert_false(remount);
    assert_int_equal(nd, 1);
    assert_int_equal(drained[0], id1);
    /* the other owner is not asked to drain */
    assert_int_equal(heartbeat(st, C2, &id2, 1, &remount, drained, &nd), KVP_OK);
    assert_false(remount);
    assert_int_equal(nd, 0);
    /* ... nor does a non-owner listing the drained segment get it */
    assert_int_equal(heartbeat(st, C2, &id1, 1, &remount, drained, &nd), KVP_OK);
    assert_true(remount);
    assert_int_equal(nd, 0);

    /* draining is visible in STAT's segment descriptors */
    Kvpool__StatRequest sreq = KVPOOL__STAT_REQUEST__INIT;
    Kvpool__StatResponse *sr =
        svc_call(st, C3, KVP_RPC_STAT, &sreq.base, &kvpool__stat_response__descriptor);
    assert_int_equal(sr->n_segments, 2);
    for (size_t i = 0; i < sr->n_segments; i++)
        assert_int_equal(sr->segments[i]->desc->draining, sr->segments[i]->desc->id == id1);
    svc_msg_free(sr);

    /* unknown name: refused with a message saying which */
    msg[0] = '\0';
    assert_int_equal(drain(st, C3, "nope", 0, NULL, msg), KVP_ERR_SEGMENT_GONE);
    assert_non_null(strstr(msg, "nope"));
    /* by id when no name is given */
    assert_int_equal(drain(st, C3, NULL, id2 + 7, NULL, msg), KVP_ERR_SEGMENT_GONE);
    assert_true(msg[0] != '\0');
    assert_int_equal(drain(st, C3, NULL, id2, &got, NULL), KVP_OK);
    assert_int_equal(got, id2);
    assert_int_equal(heartbeat(st, C2, &id2, 1, &remount, drained, &nd), KVP_OK);
    assert_int_equal(nd, 1);
    assert_int_equal(drained[0], id2);
    /* draining twice is harmless */
    assert_int_equal(drain(st, C3, "s1", 0, NULL, NULL), KVP_OK);

    /* too many ids in one heartbeat */
    uint64_t *many = calloc(1025, sizeof(*many));
    assert_non_null(many);
    int32_t s = heartbeat(st, C1, many, 1025, &remount, drained, &nd);
    free(many);
    assert_int_equal(s, KVP_ERR_TOO_MANY);
}

static void test_draining_gets_no_placements(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id1 = mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t id2 = mount_seg(st, C2, "s2", "h2", MIB);
    assert_int_equal(drain(st, C3, "s1", 0, NULL, NULL), KVP_OK);
    for (int i = 0; i < 20; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k%d", i);
        view_t v = put1(st, C3, key, SZ);
        assert_int_equal(v.status, KVP_OK);
        assert_int_equal(v.n, 1);
        assert_int_equal(v.r[0].seg, id2);
    }
    view_t v = put_cfg(st, C1, "pref", SZ, 1, "s1", false);
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, id2);
    /* two replicas wanted, one non-draining segment: one replica */
    v = put_cfg(st, C1, "two", SZ, 2, NULL, false);
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, id2);
    assert_int_equal(seg_used(st, id1), 0);
    assert_int_equal(seg_used(st, id2), 22 * EXT);
}

/* A put placed on a segment before it began to drain may end after the owner's last pass:
 * DRAIN tells the owner how many are still being written there, so it waits for them and
 * passes once more before it unmounts (client/control/drain.c). */
static uint64_t drain_pending(kvp_master_state_t *st, const char *name)
{
    Kvpool__DrainRequest req = KVPOOL__DRAIN_REQUEST__INIT;
    req.segment_name = (char *)name;
    Kvpool__DrainResponse *r =
        svc_call(st, C3, KVP_RPC_DRAIN, &req.base, &kvpool__drain_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    uint64_t n = r->pending;
    svc_msg_free(r);
    return n;
}

static void test_drain_counts_puts_in_flight(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id1 = mount_seg(st, C1, "s1", "h1", MIB);
    mount_seg(st, C2, "s2", "h2", MIB);
    /* two puts in flight on s1 (one with a second replica on s2), one on s2 only */
    view_t a = put_cfg(st, C3, "a", SZ, 1, "s1", false);
    view_t b = put_cfg(st, C3, "b", SZ, 2, "s1", false);
    view_t c = put_cfg(st, C3, "c", SZ, 1, "s2", false);
    assert_true(a.r[0].seg == id1 && b.n == 2 && c.r[0].seg != id1);
    assert_int_equal(drain_pending(st, "s1"), 2); /* a and b, not c */
    assert_int_equal(end1(st, C3, "a", 1), KVP_OK);
    assert_int_equal(drain_pending(st, "s1"), 1);
    assert_int_equal(keys1(st, C3, KVP_RPC_PUT_REVOKE, "b", false), KVP_OK);
    assert_int_equal(drain_pending(st, "s1"), 0);
    /* draining: nothing new is placed there, so the count stays 0 */
    view_t d = put_cfg(st, C3, "d", SZ, 1, "s1", false);
    assert_int_equal(d.status, KVP_OK);
    assert_true(d.r[0].seg != id1);
    assert_int_equal(drain_pending(st, "s1"), 0);
}

/* ---- moves off a draining segment ---- */

static void test_move(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t a = mount_seg(st, C1, "A", "h1", MIB);
    uint64_t b = mount_seg(st, C2, "B", "h2", MIB);
    const char *singles[6] = {"k1", "k2", "k3", "k4", "k5", "k6"};
    view_t orig[6];
    for (int i = 0; i < 6; i++) {
        orig[i] = put_done(st, C3, singles[i], SZ, 1, "A", 100 + i);
        assert_int_equal(orig[i].r[0].seg, a);
    }
    view_t dual = put_done(st, C3, "dual", SZ, 2, "A", 50);
    assert_int_equal(dual.n, 2);
    assert_int_equal(dual.r[0].seg, a);
    assert_int_equal(dual.r[1].seg, b);
    view_t onb = put_done(st, C3, "onb", SZ, 1, "B", 60);
    assert_int_equal(onb.r[0].seg, b);
    assert_int_equal(seg_used(st, a), 7 * EXT);
    assert_int_equal(seg_used(st, b), 2 * EXT);

    /* not draining yet: refused; not the owner: refused first; unknown segment */
    assert_int_equal(move_start_status(st, C1, a, "k1"), KVP_ERR_INVALID_ARG);
    assert_int_equal(move_start_status(st, C2, a, "k1"), KVP_ERR_NOT_OWNER);
    assert_int_equal(move_start_status(st, C1, a + 9, "k1"), KVP_ERR_SEGMENT_GONE);
    assert_int_equal(kvp_master_used(st), 9 * EXT);

    assert_int_equal(drain(st, C3, "A", 0, NULL, NULL), KVP_OK);
    assert_int_equal(move_start_status(st, C2, a, "k1"), KVP_ERR_NOT_OWNER);
    assert_null(st->moves);

    const char *keys[9] = {"k1", "k2", "dual", "nokey", "k3", "k4", "k5", "k6", "onb"};
    Kvpool__MoveStartResponse *r = move_start(st, C1, a, keys, 9);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 9);
    view_t dest[9];
    for (int i = 0; i < 9; i++) {
        dest[i] = (view_t){.status = r->results[i]->status};
        copy_reps(&dest[i], r->results[i]->replicas, r->results[i]->n_replicas);
    }
    bool b_described = false;
    for (size_t s = 0; s < r->n_segments; s++)
        b_described |= r->segments[s]->id == b;
    assert_true(b_described);
    svc_msg_free(r);
    for (int i = 0; i < 9; i++) {
        if (i == 2) { /* dual: its replica on B keeps it */
            assert_int_equal(dest[i].status, KVP_OK);
            assert_int_equal(dest[i].n, 0);
        } else if (i == 3 || i == 8) { /* no such key; not on A */
            assert_int_equal(dest[i].status, KVP_ERR_NOT_FOUND);
            assert_int_equal(dest[i].n, 0);
        } else {
            assert_int_equal(dest[i].status, KVP_OK);
            assert_int_equal(dest[i].n, 1);
            assert_int_equal(dest[i].r[0].seg, b);
            assert_int_equal(dest[i].r[0].len, SZ);
        }
    }
    assert_int_equal(seg_used(st, a), 7 * EXT);
    assert_int_equal(seg_used(st, b), 8 * EXT);

    /* k1 copied: swapped in, A's extent freed */
    assert_int_equal(move_end1(st, C1, a, "k1", KVP_OK), KVP_OK);
    view_t v = grl1(st, "k1");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.crc, 100);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, b);
    assert_int_equal(v.r[0].off, dest[0].r[0].off);
    assert_int_equal(stat_get(st).moved, 1);
    assert_int_equal(seg_used(st, a), 6 * EXT);
    assert_int_equal(seg_used(st, b), 8 * EXT);

    /* k2's copy failed: unchanged, the destination freed */
    assert_int_equal(move_end1(st, C1, a, "k2", KVP_ERR_IO), KVP_OK);
    v = grl1(st, "k2");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, a);
    assert_int_equal(v.r[0].off, orig[1].r[0].off);
    assert_int_equal(seg_used(st, b), 7 * EXT);

    /* k3 replaced by an upsert of another size (lands on B: A is draining) */
    view_t up = upsert1(st, C3, "k3", 2000);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(up.r[0].seg, b);
    assert_int_equal(end1(st, C3, "k3", 333), KVP_OK);
    assert_int_equal(seg_used(st, a), 5 * EXT);
    assert_int_equal(seg_used(st, b), 7 * EXT + 2048);
    assert_int_equal(move_end1(st, C1, a, "k3", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_int_equal(seg_used(st, b), 6 * EXT + 2048);
    v = grl1(st, "k3");
    assert_int_equal(v.size, 2000);
    assert_int_equal(v.r[0].off, up.r[0].off);

    /* k4 removed meanwhile */
    assert_int_equal(keys1(st, C3, KVP_RPC_REMOVE, "k4", false), KVP_OK);
    assert_int_equal(seg_used(st, a), 4 * EXT);
    assert_int_equal(move_end1(st, C1, a, "k4", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_int_equal(seg_used(st, b), 5 * EXT + 2048);
    assert_int_equal(exist1(st, "k4"), 0);

    /* k6 upserted with the same size: not in place, since A is draining, but into a
     * new extent on B (A's freed); the copy in flight is stale */
    up = upsert1(st, C3, "k6", SZ);
    assert_int_equal(up.status, KVP_OK);
    assert_int_equal(up.r[0].seg, b);
    assert_int_equal(end1(st, C3, "k6", 666), KVP_OK);
    assert_int_equal(seg_used(st, a), 3 * EXT);
    assert_int_equal(seg_used(st, b), 6 * EXT + 2048);
    assert_int_equal(move_end1(st, C1, a, "k6", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_int_equal(seg_used(st, b), 5 * EXT + 2048);
    v = grl1(st, "k6");
    assert_int_equal(v.crc, 666);
    assert_int_equal(v.r[0].seg, b);

    /* no move for these (any more) */
    assert_int_equal(move_end1(st, C1, a, "dual", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_int_equal(move_end1(st, C1, a, "k1", KVP_OK), KVP_ERR_NOT_FOUND);
    /* k5's move belongs to C1: C2 cannot end it, and it stays */
    assert_int_equal(move_end1(st, C2, a, "k5", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_int_equal(move_end1(st, C1, b, "k5", KVP_OK), KVP_ERR_NOT_FOUND);
    assert_non_null(st->moves);
    /* statuses must match keys */
    const char *k5 = "k5";
    int32_t sts[2] = {0, 0};
    Kvpool__StatusesResponse *er = move_end(st, C1, a, &k5, 1, sts, 2);
    assert_int_equal(er->status, KVP_ERR_INVALID_ARG);
    assert_int_equal(er->n_statuses, 0);
    svc_msg_free(er);
    assert_int_equal(seg_used(st, a), 3 * EXT); /* k2, k5, dual */
    assert_int_equal(seg_used(st, b), 5 * EXT + 2048);
    assert_int_equal(stat_get(st).moved, 1);

    /* the owner goes away mid-move: k5's destination is freed, A unmounted */
    kvp_dispatch_conn_closed(st, C1);
    assert_null(st->moves);
    assert_null(kvp_segment_table_get(&st->segments, a));
    assert_int_equal(kvp_master_used(st), 4 * EXT + 2048); /* dual, onb, k1, k3, k6 */
    assert_int_equal(seg_used(st, b), 4 * EXT + 2048);
    assert_int_equal(exist1(st, "k6"), 1);
    assert_int_equal(exist1(st, "k5"), 0);
    assert_int_equal(exist1(st, "k2"), 0);
    assert_int_equal(exist1(st, "k1"), 1);
    v = grl1(st, "dual");
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, b);
    assert_int_equal(v.r[0].off, dual.r[1].off);
    assert_int_equal(stat_get(st).objects, 5); /* dual, onb, k1, k3, k6 */
}

/* ---- cleanup with a graveyard and moves in flight ---- */

static void test_cleanup_graveyard_and_moves(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t a = mount_seg(st, C1, "A", "h1", MIB);
    mount_seg(st, C2, "B", "h2", MIB);
    put_done(st, C3, "g1", SZ, 1, "A", 1);
    put_done(st, C3, "g2", SZ, 2, "A", 2);
    put_done(st, C3, "m1", SZ, 1, "A", 3);
    put_done(st, C3, "m2", SZ, 1, "A", 4);
    assert_int_equal(grl1(st, "g1").status, KVP_OK);
    assert_int_equal(grl1(st, "g2").status, KVP_OK);
    assert_int_equal(keys1(st, C3, KVP_RPC_REMOVE, "g1", true), KVP_OK);
    assert_int_equal(upsert1(st, C3, "g2", 3 * SZ).status, KVP_OK); /* left PENDING */
    assert_int_equal(graveyard_len(st), 2);
    assert_int_equal(drain(st, C3, "A", 0, NULL, NULL), KVP_OK);
    const char *mk[2] = {"m1", "m2"};
    Kvpool__MoveStartResponse *r = move_start(st, C1, a, mk, 2);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->results[0]->n_replicas, 1);
    assert_int_equal(r->results[1]->n_replicas, 1);
    svc_msg_free(r);
    assert_non_null(st->moves);
    assert_non_null(st->moves->next);
    assert_int_equal(kvp_master_used(st), 7 * EXT + 3008); /* 3000 rounded to 64 */
    /* the fixture's kvp_master_state_cleanup frees it all (ASan/LSan check) */
}

/*
 * Review finding: a put while the only segment that could take it drains must
 * fail at once (no segment / too large), not evict the whole pool trying.
 */
static void test_put_while_draining_evicts_nothing(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t a = mount_seg(st, C1, "big", "h1", MIB);
    char key[32];
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof(key), "o%d", i);
        put_done(st, C1, key, SZ, 1, NULL, 1);
    }
    assert_int_equal(drain(st, C2, "big", 0, NULL, NULL), KVP_OK);
    assert_int_equal(put1(st, C2, "new", SZ).status, KVP_ERR_NO_SEGMENT);
    mount_seg(st, C3, "small", "h3", 64 * 1024);
    assert_int_equal(put1(st, C2, "new2", 100 * 1024).status, KVP_ERR_TOO_LARGE);
    assert_int_equal(st->stats.evicted_objects, 0);
    assert_int_equal(seg_used(st, a), 20 * EXT);
    assert_int_equal(exist1(st, "o7"), 1);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_heartbeat_and_drain),
        T(test_draining_gets_no_placements),
        T(test_drain_counts_puts_in_flight),
        T(test_move),
        T(test_put_while_draining_evicts_nothing),
        T(test_cleanup_graveyard_and_moves),
    };
#undef T
    return cmocka_run_group_tests_name("drain_calls", tests, NULL, NULL);
}
