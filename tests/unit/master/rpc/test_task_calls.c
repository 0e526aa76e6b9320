/*
 * test_task_calls.c - unit tests for master/rpc/task_calls.c: copy and move tasks through
 * kvp_dispatch_handle as the server calls it (fixture_leases.h: read leases of 5000 ms;
 * fixture_tasks.h: the task calls), and their timer (kvp_task_tick, policy/copy_tasks.c).
 * What is checked is what the client sees: the heartbeat's offers, who may start and end a
 * task, the replicas a get is handed afterwards, the bytes each segment has in use (nothing
 * leaked on any failure), and the task's status and message. With an ACL's tenants: one
 * tenant's flood of tasks neither refuses another's creates nor erases its ended tasks.
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
#include "master/core/state.h"
#include "master/policy/copy_tasks.h"
#include "master/policy/lease.h"
#include "tests/unit/master/rpc/fixture_leases.h"
#include "tests/unit/master/rpc/fixture_tasks.h"
#include "tests/unit/master/svc_call.h"

static bool has_replica_on(const view_t *v, uint64_t seg)
{
    for (size_t i = 0; i < v->n; i++)
        if (v->r[i].seg == seg)
            return true;
    return false;
}

/* A copy to two segments: offered to the source's owner only, started and ended by it only;
 * then a get is handed three replicas, and the targets hold the bytes' extents. */
static void test_copy(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t s1 = mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t s2 = mount_seg(st, C2, "s2", "h2", MIB);
    uint64_t s3 = mount_seg(st, C3, "s3", "h3", MIB);
    view_t put = put_done(st, C3, "k", SZ, 1, "s1", 0xC0FFEEu);
    assert_int_equal(put.r[0].seg, s1);
    const char *targets[] = {"s2", "s3", "s2"}; /* a name twice: one copy */
    tid_t t = create(st, C3, KVP_TASK_COPY, "k", NULL, targets, 3);
    assert_int_equal(t.status, KVP_OK);
    assert_true(t.hi != 0 || t.lo != 0);
    tq_t q = query(st, C2, t);
    assert_int_equal(q.status, KVP_OK);
    assert_int_equal(q.task_status, KVP_TASK_PENDING);
    assert_string_equal(q.assigned, "s1");
    tid_t offered = {0};
    assert_int_equal(offers(st, C2, NULL), 0);
    assert_int_equal(offers(st, C1, &offered), 1);
    assert_true(offered.hi == t.hi && offered.lo == t.lo);
    /* only the source's owner starts it */
    assert_int_equal(start(st, C2, t).status, KVP_ERR_NOT_OWNER);
    started_t s = start(st, C1, t);
    assert_int_equal(s.status, KVP_OK);
    assert_int_equal(s.size, SZ);
    assert_int_equal(s.crc, 0xC0FFEEu);
    assert_int_equal(s.source_seg, s1);
    assert_int_equal(s.source_off, put.r[0].off);
    assert_int_equal(s.n, 2);
    assert_true((s.d[0].seg == s2 && s.d[1].seg == s3) || (s.d[0].seg == s3 && s.d[1].seg == s2));
    assert_int_equal(seg_used(st, s2), EXT);
    assert_int_equal(query(st, C3, t).task_status, KVP_TASK_PROCESSING);
    assert_int_equal(start(st, C1, t).status, KVP_ERR_INVALID_ARG); /* started already */
    assert_int_equal(offers(st, C1, NULL), 0);
    /* the copies are not the object's until the end */
    assert_int_equal(grl1(st, "k").n, 1);
    int32_t ok[2] = {KVP_OK, KVP_OK};
    assert_int_equal(end(st, C2, t, ok, 2).status, KVP_ERR_NOT_OWNER);
    q = end(st, C1, t, ok, 2);
    assert_int_equal(q.status, KVP_OK);
    assert_int_equal(q.task_status, KVP_TASK_SUCCESS);
    view_t v = grl1(st, "k");
    assert_int_equal(v.n, 3);
    assert_true(has_replica_on(&v, s1) && has_replica_on(&v, s2) && has_replica_on(&v, s3));
    assert_int_equal(v.crc, 0xC0FFEEu);
    assert_int_equal(end(st, C1, t, ok, 2).status, KVP_ERR_INVALID_ARG); /* over */
    /* a copy to segments that hold replicas already: nothing to write, done at start */
    t = create(st, C3, KVP_TASK_COPY, "k", NULL, targets, 2);
    assert_int_equal(t.status, KVP_OK);
    s = start(st, C1, t);
    assert_int_equal(s.status, KVP_OK);
    assert_int_equal(s.n, 0);
    assert_int_equal(query(st, C3, t).task_status, KVP_TASK_SUCCESS);
    assert_int_equal(seg_used(st, s2), EXT);
}

/* A copy fails whole: one copy not written, the object changed meanwhile, its runner's
 * connection gone, or not started in time. Each time no replica is added and the new
 * extents are freed. */
static void test_copy_fails_whole(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t s2 = mount_seg(st, C2, "s2", "h2", MIB);
    uint64_t s3 = mount_seg(st, C3, "s3", "h3", MIB);
    put_done(st, C3, "k", SZ, 1, "s1", 7);
    const char *targets[] = {"s2", "s3"};
    tid_t t = create(st, C3, KVP_TASK_COPY, "k", NULL, targets, 2);
    assert_int_equal(start(st, C1, t).n, 2);
    int32_t one_bad[2] = {KVP_OK, KVP_ERR_CHECKSUM};
    tq_t q = end(st, C1, t, one_bad, 2);
    assert_int_equal(q.task_status, KVP_TASK_FAILED);
    assert_non_null(strstr(q.msg, "checksum"));
    assert_int_equal(grl1(st, "k").n, 1);
    assert_int_equal(seg_used(st, s2), 0);
    assert_int_equal(seg_used(st, s3), 0);
    /* the runner reports the wrong number of copies */
    t = create(st, C3, KVP_TASK_COPY, "k", NULL, targets, 2);
    assert_int_equal(start(st, C1, t).n, 2);
    int32_t ok[2] = {KVP_OK, KVP_OK};
    assert_int_equal(end(st, C1, t, ok, 1).task_status, KVP_TASK_FAILED);
    assert_int_equal(seg_used(st, s2) + seg_used(st, s3), 0);
    /* overwritten while copied: the copies are of the old bytes */
    t = create(st, C3, KVP_TASK_COPY, "k", NULL, targets, 1);
    assert_int_equal(start(st, C1, t).n, 1);
    assert_int_equal(keys1(st, C3, KVP_RPC_REMOVE, "k", true), KVP_OK);
    put_done(st, C3, "k", SZ, 1, "s1", 8);
    q = end(st, C1, t, ok, 1);
    assert_int_equal(q.task_status, KVP_TASK_FAILED);
    assert_non_null(strstr(q.msg, "changed"));
    assert_int_equal(grl1(st, "k").n, 1);
    assert_int_equal(seg_used(st, s2), 0);
    /* not started in time */
    t = create(st, C3, KVP_TASK_COPY, "k", NULL, targets, 1);
    st->now_ms += 30001;
    kvp_task_tick(st);
    q = query(st, C3, t);
    assert_int_equal(q.task_status, KVP_TASK_FAILED);
    assert_non_null(strstr(q.msg, "did not start"));
    assert_int_equal(start(st, C1, t).status, KVP_ERR_INVALID_ARG);
    /* started, not ended by --put-timeout */
    t = create(st, C3, KVP_TASK_COPY, "k", NULL, targets, 1);
    assert_int_equal(start(st, C1, t).n, 1);
    st->now_ms += st->config.put_timeout_ms + 1;
    kvp_task_tick(st);
    assert_int_equal(query(st, C3, t).task_status, KVP_TASK_FAILED);
    assert_int_equal(seg_used(st, s2), 0);
    /* its runner's connection closes mid-copy */
    t = create(st, C3, KVP_TASK_COPY, "k", NULL, targets, 2);
    assert_int_equal(start(st, C1, t).n, 2);
    kvp_dispatch_conn_closed(st, C1);
    q = query(st, C3, t);
    assert_int_equal(q.task_status, KVP_TASK_FAILED);
    assert_non_null(strstr(q.msg, "s1"));
    assert_int_equal(seg_used(st, s2) + seg_used(st, s3), 0);
}

/* A move: the target's replica in, the source's out; while a read leases the object the
 * source stays (a reader may be on it) and goes once the lease ends. */
static void test_move(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t s1 = mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t s2 = mount_seg(st, C2, "s2", "h2", MIB);
    put_done(st, C3, "m", SZ, 1, "s1", 9);
    const char *to[] = {"s2"};
    tid_t t = create(st, C3, KVP_TASK_MOVE, "m", "s1", to, 1);
    assert_int_equal(t.status, KVP_OK);
    assert_int_equal(query(st, C3, t).kind, KVP_TASK_MOVE);
    started_t s = start(st, C1, t);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.d[0].seg, s2);
    int32_t ok[1] = {KVP_OK};
    assert_int_equal(end(st, C1, t, ok, 1).task_status, KVP_TASK_SUCCESS);
    view_t v = grl1(st, "m"); /* (leases the object: below) */
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, s2);
    assert_int_equal(seg_used(st, s1), 0);
    /* back to s1 while that read's lease holds: both replicas until it ends */
    const char *back[] = {"s1"};
    t = create(st, C3, KVP_TASK_MOVE, "m", "s2", back, 1);
    assert_int_equal(start(st, C2, t).n, 1);
    tq_t q = end(st, C2, t, ok, 1);
    assert_int_equal(q.task_status, KVP_TASK_PROCESSING);
    assert_int_equal(seg_used(st, s1), EXT);
    assert_int_equal(seg_used(st, s2), EXT);
    kvp_task_tick(st);
    assert_int_equal(query(st, C3, t).task_status, KVP_TASK_PROCESSING);
    st->now_ms += 5001; /* the lease's TTL */
    kvp_task_tick(st);
    assert_int_equal(query(st, C3, t).task_status, KVP_TASK_SUCCESS);
    assert_int_equal(seg_used(st, s2), 0);
    v = grl1(st, "m");
    assert_int_equal(v.n, 1);
    assert_int_equal(v.r[0].seg, s1);
}

/* What TaskCreate refuses, and what a stranger learns of a task id. */
static void test_create_refusals(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    mount_seg(st, C2, "s2", "h2", MIB);
    put_done(st, C3, "k", SZ, 1, "s1", 1);
    const char *s2[] = {"s2"}, *nope[] = {"s2", "nope"}, *s1[] = {"s1"};
    tid_t t = create(st, C3, KVP_TASK_COPY, "missing", NULL, s2, 1);
    assert_int_equal(t.status, KVP_ERR_NOT_FOUND);
    t = create(st, C3, KVP_TASK_COPY, "k", NULL, nope, 2);
    assert_int_equal(t.status, KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(t.msg, "nope"));
    assert_int_equal(create(st, C3, KVP_TASK_COPY, "k", NULL, NULL, 0).status, KVP_ERR_INVALID_ARG);
    assert_int_equal(create(st, C3, 7, "k", NULL, s2, 1).status, KVP_ERR_INVALID_ARG);
    t = create(st, C3, KVP_TASK_MOVE, "k", "s2", s1, 1); /* s2 holds no replica */
    assert_int_equal(t.status, KVP_ERR_INVALID_ARG);
    assert_int_equal(create(st, C3, KVP_TASK_MOVE, "k", "s1", s1, 1).status, KVP_ERR_INVALID_ARG);
    assert_int_equal(create(st, C3, KVP_TASK_MOVE, "k", "s1", nope, 2).status, KVP_ERR_INVALID_ARG);
    assert_int_equal(drain(st, C3, "s2", 0, NULL, NULL), KVP_OK);
    t = create(st, C3, KVP_TASK_COPY, "k", NULL, s2, 1);
    assert_int_equal(t.status, KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(t.msg, "draining"));
    /* an unknown id */
    tid_t none = {.hi = 1, .lo = 2};
    assert_int_equal(query(st, C3, none).status, KVP_ERR_NOT_FOUND);
    assert_int_equal(start(st, C1, none).status, KVP_ERR_NOT_FOUND);
    /* an id an earlier master gave (another incarnation, its check right): FAILED, why */
    t = create(st, C3, KVP_TASK_COPY, "k", NULL, s1, 1);
    uint64_t inc = (t.hi >> 16) ^ 0x5a5a, x = (inc ^ t.lo) * 0x9E3779B97F4A7C15ull;
    tid_t earlier = {.hi = inc << 16 | ((x ^ (x >> 29)) >> 48), .lo = t.lo};
    tq_t q = query(st, C3, earlier);
    assert_int_equal(q.status, KVP_OK);
    assert_int_equal(q.task_status, KVP_TASK_FAILED);
    assert_non_null(strstr(q.msg, "restart"));
    earlier.hi ^= 1; /* its check wrong: made up */
    assert_int_equal(query(st, C3, earlier).status, KVP_ERR_NOT_FOUND);
    /* another tenant's principal: as unknown */
    t = create(st, C3, KVP_TASK_COPY, "k", NULL, s1, 1);
    assert_int_equal(t.status, KVP_OK);
    kvp_principal_t other = {.name = "bob", .tenant = "t5", .tenant_id = 5, .roles = KVP_ROLE_READ};
    Kvpool__TaskQueryRequest req = KVPOOL__TASK_QUERY_REQUEST__INIT;
    req.id_hi = t.hi;
    req.id_lo = t.lo;
    Kvpool__TaskQueryResponse *r = svc_call_as(st, C2, &other, KVP_RPC_TASK_QUERY, &req.base,
                                               &kvpool__task_query_response__descriptor);
    assert_non_null(r);
    assert_int_equal(r->status, KVP_ERR_NOT_FOUND);
    assert_string_equal(r->assigned_client, "");
    svc_msg_free(r);
}

/* TaskStart and TaskEnd name many tasks at once: each gets its own result, a refusal of one
 * (unknown, another runner's) leaves the others alone; more than 64 is refused whole. */
static void test_batches(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t s2 = mount_seg(st, C2, "s2", "h2", MIB);
    const char *to[] = {"s2"};
    tid_t t[3];
    for (int i = 0; i < 3; i++) {
        char key[8];
        snprintf(key, sizeof(key), "b%d", i);
        put_done(st, C3, key, SZ, 1, "s1", 100 + (uint32_t)i);
        t[i] = create(st, C3, KVP_TASK_COPY, key, NULL, to, 1);
    }
    Kvpool__TaskOffer o[4], *op[4];
    for (int i = 0; i < 4; i++) {
        kvpool__task_offer__init(&o[i]);
        o[i].id_hi = i < 3 ? t[i].hi : 1;
        o[i].id_lo = i < 3 ? t[i].lo : 2;
        op[i] = &o[i];
    }
    Kvpool__TaskStartRequest req = KVPOOL__TASK_START_REQUEST__INIT;
    req.tasks = op;
    req.n_tasks = 4;
    Kvpool__TaskStartResponse *r =
        svc_call(st, C1, KVP_RPC_TASK_START, &req.base, &kvpool__task_start_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 4);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r->results[i]->status, KVP_OK);
        assert_int_equal(r->results[i]->n_dests, 1);
        assert_int_equal(r->results[i]->crc32c, 100 + i);
        assert_int_equal(r->results[i]->dests[0]->segment_id, s2);
    }
    assert_int_equal(r->results[3]->status, KVP_ERR_NOT_FOUND);
    svc_msg_free(r);
    assert_int_equal(seg_used(st, s2), 3 * EXT);
    /* end: the first written, the second not; the third left running */
    int32_t ok = KVP_OK, bad = KVP_ERR_IO;
    Kvpool__TaskEndItem it[2], *itp[2];
    for (int i = 0; i < 2; i++) {
        kvpool__task_end_item__init(&it[i]);
        it[i].id_hi = t[i].hi;
        it[i].id_lo = t[i].lo;
        it[i].statuses = i == 0 ? &ok : &bad;
        it[i].n_statuses = 1;
        itp[i] = &it[i];
    }
    Kvpool__TaskEndRequest ereq = KVPOOL__TASK_END_REQUEST__INIT;
    ereq.tasks = itp;
    ereq.n_tasks = 2;
    Kvpool__StatusesResponse *e =
        svc_call(st, C2, KVP_RPC_TASK_END, &ereq.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(e->statuses[0], KVP_ERR_NOT_OWNER); /* not the runner: nothing done */
    assert_int_equal(e->statuses[1], KVP_ERR_NOT_OWNER);
    svc_msg_free(e);
    e = svc_call(st, C1, KVP_RPC_TASK_END, &ereq.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(e->statuses[0], KVP_TASK_SUCCESS);
    assert_int_equal(e->statuses[1], KVP_TASK_FAILED);
    svc_msg_free(e);
    assert_int_equal(grl1(st, "b0").n, 2);
    assert_int_equal(grl1(st, "b1").n, 1);
    assert_int_equal(query(st, C3, t[2]).task_status, KVP_TASK_PROCESSING);
    assert_int_equal(seg_used(st, s2), 2 * EXT);
    /* 65 tasks in one call: refused whole */
    Kvpool__TaskOffer *many[65];
    for (int i = 0; i < 65; i++)
        many[i] = &o[3];
    req.tasks = many;
    req.n_tasks = 65;
    r = svc_call(st, C1, KVP_RPC_TASK_START, &req.base, &kvpool__task_start_response__descriptor);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    svc_msg_free(r);
}

/* A heartbeat offers the newest waiting tasks first, 64 at most; the others come once those
 * are started. At most 4096 tasks wait or run at once; a closed connection fails every task
 * it was to run, started or not. */
static void test_offers_and_limits(void **state)
{
    kvp_master_state_t *st = *state;
    mount_seg(st, C1, "s1", "h1", MIB);
    uint64_t s2 = mount_seg(st, C2, "s2", "h2", MIB);
    put_done(st, C3, "k", SZ, 1, "s1", 5);
    const char *to[] = {"s2"};
    tid_t t[70];
    for (int i = 0; i < 70; i++) {
        t[i] = create(st, C3, KVP_TASK_COPY, "k", NULL, to, 1);
        assert_int_equal(t[i].status, KVP_OK);
    }
    assert_int_equal(offers(st, C2, NULL), 0);
    tid_t first = {0};
    assert_int_equal(offers(st, C1, &first), 64);
    assert_true(first.hi == t[69].hi && first.lo == t[69].lo);
    for (int i = 69; i >= 6; i--)
        assert_int_equal(start(st, C1, t[i]).status, KVP_OK);
    assert_int_equal(offers(st, C1, &first), 6);
    assert_true(first.hi == t[5].hi && first.lo == t[5].lo);
    for (int i = 70; i < 4096; i++)
        assert_int_equal(create(st, C3, KVP_TASK_COPY, "k", NULL, to, 1).status, KVP_OK);
    assert_int_equal(st->copy_tasks.n_live, 4096);
    tid_t over = create(st, C3, KVP_TASK_COPY, "k", NULL, to, 1);
    assert_int_equal(over.status, KVP_ERR_TOO_MANY);
    kvp_dispatch_conn_closed(st, C1);
    assert_int_equal(st->copy_tasks.n_live, 0);
    assert_int_equal(offers(st, C1, NULL), 0);
    for (int i = 0; i < 70; i += 23) {
        tq_t q = query(st, C3, t[i]);
        assert_int_equal(q.task_status, KVP_TASK_FAILED);
        assert_non_null(strstr(q.msg, "went before"));
    }
    assert_int_equal(seg_used(st, s2), 0);
    /* ended tasks kept for TaskQuery: the 4096 that ended last, the others go at the next
     * create (s1 went with C1: a key elsewhere) */
    assert_int_equal(st->copy_tasks.n, 4096);
    mount_seg(st, C3, "s3", "h3", MIB);
    put_done(st, C3, "k3", SZ, 1, "s3", 6);
    tid_t late = create(st, C3, KVP_TASK_COPY, "k3", NULL, to, 1);
    assert_int_equal(late.status, KVP_OK);
    assert_int_equal(st->copy_tasks.n, 4096 + 1);
    st->now_ms += 30001; /* not started in time: 4097 ended */
    kvp_task_tick(st);
    assert_int_equal(create(st, C3, KVP_TASK_COPY, "k3", NULL, to, 1).status, KVP_OK);
    assert_int_equal(st->copy_tasks.n, 4096 + 1);
    /* the first to end went: of C1's, the started ones ended first, the last started (t[6])
     * first of all */
    assert_int_equal(query(st, C3, t[6]).status, KVP_ERR_NOT_FOUND);
    assert_int_equal(query(st, C3, t[7]).task_status, KVP_TASK_FAILED);
    assert_int_equal(query(st, C3, late).task_status, KVP_TASK_FAILED);
}

/* Bob (tenant team-b) creates copy tasks of his own object until refused, as in the attack
 * reported: alice (team-a) was refused 48 of her 56 creates, and her finished task vanished
 * from TaskQuery, for 4096 live and 4096 ended tasks were shared by all tenants. Now bob is
 * refused at his tenant's share (4096 over the ACL's 3 tenants: default, team-a, team-b,
 * however many more tenants keys named), naming it and counted; every create of alice's
 * succeeds; and after 4 more rounds of his tasks ending (not started in time) his oldest are
 * gone, his last kept, and her finished task answered. */
static void test_a_tenants_flood_leaves_another_alone(void **state)
{
    enum { ROUNDS = 4, SEEN = 8 };
    kvp_master_state_t *st = *state;
    st->tenants_on = true;
    kvp_principal_t alice = tenant_principal(st, "alice", "team-a");
    kvp_principal_t bob = tenant_principal(st, "bob", "team-b");
    assert_int_equal(st->tenants.n, 3);
    st->acl_tenants = 3; /* as credentials.c counts an ACL naming default, team-a, team-b */
    /* tenants named only by keys (an Adopt's, a quota call's) do not shrink the share */
    for (int i = 0; i < 100; i++) {
        char name[16];
        int len = snprintf(name, sizeof(name), "adopted-%d", i);
        assert_true(kvp_tenant_id(&st->tenants, name, (size_t)len, true) > 0);
    }
    const int share = 4096 / 3;
    mount_seg(st, C1, "s1", "h1", MIB);
    mount_seg(st, C2, "s2", "h2", MIB);
    const char *to[] = {"s2"};
    put_as(st, C3, &alice, "a", "s1", 1);
    put_as(st, C3, &bob, "b", "s1", 2);
    tid_t done = create_as(st, C3, &alice, KVP_TASK_COPY, "a", NULL, to, 1);
    assert_int_equal(start(st, C1, done).n, 1);
    int32_t ok1[1] = {KVP_OK};
    assert_int_equal(end(st, C1, done, ok1, 1).task_status, KVP_TASK_SUCCESS);
    /* the flood: until refused (today's cap over all tenants: 4096) */
    tid_t first[SEEN], last[SEEN], t = {0};
    int n = 0;
    for (; n < 5000; n++) {
        t = create_as(st, C3, &bob, KVP_TASK_COPY, "b", NULL, to, 1);
        if (t.status != KVP_OK)
            break;
        if (n < SEEN)
            first[n] = t;
    }
    for (int i = 0; i < 56; i++) /* the victim's creates all go through */
        assert_int_equal(create_as(st, C3, &alice, KVP_TASK_COPY, "a", NULL, to, 1).status, KVP_OK);
    assert_int_equal(n, share);
    assert_int_equal(t.status, KVP_ERR_TOO_MANY);
    assert_non_null(strstr(t.msg, "team-b"));
    assert_non_null(strstr(t.msg, "at most 1365 a tenant"));
    assert_int_equal(st->copy_tasks.refused_tenant, 1);
    assert_int_equal(st->copy_tasks.refused_master, 0);
    /* his tasks end, not started in time, and he floods again: his history goes, not hers */
    for (int round = 0; round < ROUNDS; round++) {
        st->now_ms += 30001;
        kvp_task_tick(st);
        for (int i = 0; i < share; i++) {
            t = create_as(st, C3, &bob, KVP_TASK_COPY, "b", NULL, to, 1);
            assert_int_equal(t.status, KVP_OK);
            if (i >= share - SEEN)
                last[i - (share - SEEN)] = t;
        }
    }
    st->now_ms += 30001;
    kvp_task_tick(st);
    assert_int_equal(query_as(st, C3, &bob, t).task_status, KVP_TASK_FAILED);
    /* his next create trims his ended tasks to his share, the last round's kept */
    assert_int_equal(create_as(st, C3, &bob, KVP_TASK_COPY, "b", NULL, to, 1).status, KVP_OK);
    for (int i = 0; i < SEEN; i++) {
        assert_int_equal(query_as(st, C3, &bob, first[i]).status, KVP_ERR_NOT_FOUND);
        assert_int_equal(query_as(st, C3, &bob, last[i]).task_status, KVP_TASK_FAILED);
    }
    tq_t q = query_as(st, C3, &alice, done);
    assert_int_equal(q.status, KVP_OK);
    assert_int_equal(q.task_status, KVP_TASK_SUCCESS);
    assert_int_equal(kvp_task_table_tenant_ended(&st->copy_tasks, bob.tenant_id), share);
    assert_int_equal(kvp_task_table_tenant_ended(&st->copy_tasks, alice.tenant_id), 1 + 56);
    /* not bob's to see */
    assert_int_equal(query_as(st, C3, &bob, done).status, KVP_ERR_NOT_FOUND);
}

/* --max-tasks-per-tenant sets the tenants' cap; the master's (4096 in all) still holds when
 * the tenants' caps add up past it, refused in its own words and counted apart. */
static void test_tenant_cap_setting_and_the_masters_cap(void **state)
{
    kvp_master_state_t *st = *state;
    char err[256];
    assert_int_equal(
        kvp_master_config_set(&st->config, "max-tasks-per-tenant", "3000", err, sizeof(err)),
        KVP_OK);
    st->tenants_on = true;
    kvp_principal_t alice = tenant_principal(st, "alice", "team-a");
    kvp_principal_t bob = tenant_principal(st, "bob", "team-b");
    mount_seg(st, C1, "s1", "h1", MIB);
    mount_seg(st, C2, "s2", "h2", MIB);
    const char *to[] = {"s2"};
    put_as(st, C3, &alice, "a", "s1", 1);
    put_as(st, C3, &bob, "b", "s1", 2);
    for (int i = 0; i < 3000; i++)
        assert_int_equal(create_as(st, C3, &bob, KVP_TASK_COPY, "b", NULL, to, 1).status, KVP_OK);
    tid_t t = create_as(st, C3, &bob, KVP_TASK_COPY, "b", NULL, to, 1);
    assert_int_equal(t.status, KVP_ERR_TOO_MANY);
    assert_non_null(strstr(t.msg, "at most 3000 a tenant (--max-tasks-per-tenant)"));
    for (int i = 0; i < 1096; i++)
        assert_int_equal(create_as(st, C3, &alice, KVP_TASK_COPY, "a", NULL, to, 1).status, KVP_OK);
    t = create_as(st, C3, &alice, KVP_TASK_COPY, "a", NULL, to, 1);
    assert_int_equal(t.status, KVP_ERR_TOO_MANY);
    assert_non_null(strstr(t.msg, "4096 copy and move tasks are waiting or running already"));
    assert_int_equal(st->copy_tasks.refused_tenant, 1);
    assert_int_equal(st->copy_tasks.refused_master, 1);
    assert_int_equal(kvp_task_table_tenant_live(&st->copy_tasks, alice.tenant_id), 1096);
    /* without an ACL there are no tenants: the setting does nothing (as before it was) */
    st->tenants_on = false;
    kvp_dispatch_conn_closed(st, C1); /* every task fails: its runner went */
    assert_int_equal(st->copy_tasks.n_live, 0);
    mount_seg(st, C3, "s3", "h3", MIB);
    put_done(st, C3, "k", SZ, 1, "s3", 3);
    for (int i = 0; i < 4096; i++)
        assert_int_equal(create(st, C3, KVP_TASK_COPY, "k", NULL, to, 1).status, KVP_OK);
    assert_int_equal(create(st, C3, KVP_TASK_COPY, "k", NULL, to, 1).status, KVP_ERR_TOO_MANY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_fails_whole, setup, teardown),
        cmocka_unit_test_setup_teardown(test_move, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_offers_and_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_tenants_flood_leaves_another_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tenant_cap_setting_and_the_masters_cap, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
