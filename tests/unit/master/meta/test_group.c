/*
 * test_group.c - unit tests for master/meta/group.c (the group table) and for what the
 * master does with groups (policy/eviction.c's expansion, policy/lease.c's group lease,
 * rpc/object_calls.c's upsert check), through kvp_dispatch_handle as the server calls it.
 *
 * Objects are 64 bytes in a segment of 64 x 64 bytes, so "full" is exact; the master's
 * clock is set by the tests (leases of 5000 ms).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "master/core/state.h"
#include "master/dispatch.h"
#include "master/meta/group.h"
#include "master/meta/object_index.h"
#include "master/policy/lease.h"
#include "tests/unit/master/svc_call.h"

#define OBJ 64u
#define SLOTS 64u

/* ---- the table alone ---- */

static kvp_object_t *grouped(const char *key)
{
    kvp_object_t *o =
        kvp_object_create_grouped(key, strlen(key), kvp_index_hash(key, strlen(key)), 1);
    assert_non_null(o);
    assert_int_equal(kvp_object_group(o), 0);
    return o;
}

static void test_join_leave_and_scope(void **state)
{
    (void)state;
    kvp_group_table_t gt;
    assert_int_equal(kvp_group_table_init(&gt), KVP_OK);
    kvp_object_t *a = grouped("a"), *b = grouped("b"), *c = grouped("c");
    assert_int_equal(kvp_group_join(&gt, 0, "g", 1, 0, a), KVP_OK);
    assert_int_equal(kvp_group_join(&gt, 0, "g", 1, 0, b), KVP_OK);
    assert_int_equal(kvp_group_join(&gt, 1, "g", 1, 0, c), KVP_OK); /* tenant 1's "g" */
    uint32_t g0 = kvp_group_find(&gt, 0, "g", 1), g1 = kvp_group_find(&gt, 1, "g", 1);
    assert_true(g0 != 0 && g1 != 0 && g0 != g1);
    assert_int_equal(kvp_object_group(a), g0);
    assert_int_equal(kvp_object_group(c), g1);
    assert_int_equal(kvp_group_get(&gt, g0)->n, 2);
    assert_int_equal(kvp_group_get(&gt, g1)->n, 1);
    assert_int_equal(gt.live, 2);
    assert_int_equal(gt.members, 3);
    /* a replacement takes its place */
    kvp_object_t *a2 = grouped("a");
    kvp_object_set_group(a2, g0);
    kvp_group_rebind(&gt, a, a2);
    assert_ptr_equal(kvp_group_get(&gt, g0)->members[0], a2);
    /* the last member gone, the group goes; its slot is reused */
    kvp_group_leave(&gt, c);
    assert_int_equal(kvp_group_find(&gt, 1, "g", 1), 0);
    assert_null(kvp_group_get(&gt, g1));
    assert_int_equal(gt.live, 1);
    kvp_object_t *d = grouped("d");
    assert_int_equal(kvp_group_join(&gt, 2, "other", 5, 0, d), KVP_OK);
    assert_int_equal(kvp_object_group(d), g1);
    /* a hold keeps an empty group (an upsert between the old value and the new) */
    kvp_group_hold(&gt, g1);
    kvp_group_leave(&gt, d);
    assert_non_null(kvp_group_get(&gt, g1));
    assert_int_equal(kvp_group_join(&gt, 0, NULL, 0, g1, d), KVP_OK);
    kvp_group_drop(&gt, g1);
    assert_int_equal(kvp_group_get(&gt, g1)->n, 1);
    /* bad names; an ungrouped object cannot join */
    kvp_object_t *e = grouped("e");
    assert_int_equal(kvp_group_join(&gt, 0, "", 0, 0, e), KVP_ERR_INVALID_ARG);
    char big[KVP_GROUP_ID_MAX + 1];
    memset(big, 'x', sizeof(big));
    assert_int_equal(kvp_group_join(&gt, 0, big, sizeof(big), 0, e), KVP_ERR_INVALID_ARG);
    assert_int_equal(kvp_group_join(&gt, 0, big, KVP_GROUP_ID_MAX, 0, e), KVP_OK);
    kvp_object_t *u = kvp_object_create("u", 1, 1, 1);
    assert_int_equal(kvp_group_join(&gt, 0, "g", 1, 0, u), KVP_ERR_INVALID_ARG);
    kvp_group_leave(&gt, a2);
    kvp_group_leave(&gt, b);
    kvp_group_leave(&gt, d);
    kvp_group_leave(&gt, e);
    assert_int_equal(gt.live, 0);
    assert_int_equal(gt.members, 0);
    free(a), free(a2), free(b), free(c), free(d), free(e), free(u);
    kvp_group_table_cleanup(&gt);
}

/* Many groups: the hash grows, every one is still found, and all go. */
static void test_many_groups(void **state)
{
    (void)state;
    kvp_group_table_t gt;
    assert_int_equal(kvp_group_table_init(&gt), KVP_OK);
    enum { N = 5000 };
    kvp_object_t **o = calloc(N, sizeof(*o));
    assert_non_null(o);
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "k%d", i);
        o[i] = grouped(name);
        snprintf(name, sizeof(name), "g%d", i / 2);
        assert_int_equal(kvp_group_join(&gt, (uint16_t)(i % 3), name, strlen(name), 0, o[i]),
                         KVP_OK);
    }
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "g%d", i / 2);
        assert_int_equal(kvp_group_find(&gt, (uint16_t)(i % 3), name, strlen(name)),
                         kvp_object_group(o[i]));
    }
    for (int i = 0; i < N; i++) {
        kvp_group_leave(&gt, o[i]);
        free(o[i]);
    }
    assert_int_equal(gt.live, 0);
    free(o);
    kvp_group_table_cleanup(&gt);
}

/* Every member of g sits where its index says, and g holds n of them. */
static void check_members(kvp_group_table_t *gt, uint32_t id, uint32_t n)
{
    kvp_group_t *g = kvp_group_get(gt, id);
    assert_non_null(g);
    assert_int_equal(g->n, n);
    for (uint32_t i = 0; i < g->n; i++) {
        assert_int_equal(kvp_object_member_index(g->members[i]), i);
        assert_int_equal(kvp_object_group(g->members[i]), id);
    }
}

/* One group of many members: leaves in a scattered order and replacements keep each
 * member's index right (the swap-remove's fix-up), the group holds exactly the others,
 * and a leave of what is not (or no longer) a member changes nothing. */
static void test_big_group_leave_rebind(void **state)
{
    (void)state;
    enum { N = 20000 };
    kvp_group_table_t gt;
    assert_int_equal(kvp_group_table_init(&gt), KVP_OK);
    kvp_object_t **o = calloc(N, sizeof(*o));
    bool *in = calloc(N, sizeof(*in));
    assert_non_null(o);
    assert_non_null(in);
    char key[32];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        o[i] = grouped(key);
        assert_int_equal(kvp_group_join(&gt, 3, "big", 3, 0, o[i]), KVP_OK);
        in[i] = true;
    }
    uint32_t id = kvp_group_find(&gt, 3, "big", 3);
    check_members(&gt, id, N);
    /* every 7th replaced by a copy (as tier.c does: same tail), every 3rd leaves, in a
     * scattered order (a stride prime to N) */
    uint32_t n = N;
    for (int j = 0; j < N; j++) {
        int i = (int)(((uint64_t)j * 7919u) % N);
        if (i % 7 == 0) {
            snprintf(key, sizeof(key), "k%d", i);
            kvp_object_t *r = grouped(key);
            kvp_object_set_group(r, kvp_object_group(o[i]));
            kvp_object_set_member_index(r, kvp_object_member_index(o[i]));
            kvp_group_rebind(&gt, o[i], r);
            free(o[i]);
            o[i] = r;
        }
        if (i % 3 == 0) {
            kvp_group_leave(&gt, o[i]);
            assert_int_equal(kvp_object_group(o[i]), 0);
            kvp_group_leave(&gt, o[i]); /* again: not a member, nothing happens */
            in[i] = false;
            n--;
        }
        if (j % 1000 == 0)
            check_members(&gt, id, n);
    }
    check_members(&gt, id, n);
    assert_int_equal(gt.members, n);
    kvp_group_t *g = kvp_group_get(&gt, id);
    for (uint32_t k = 0; k < g->n; k++) { /* exactly the ones still in, each once */
        const char *kk = kvp_object_key(g->members[k]);
        int i = atoi(kk + 1);
        assert_true(in[i]);
        assert_ptr_equal(g->members[k], o[i]);
    }
    /* an object never in the group, whose stale tail names it and a member's index */
    kvp_object_t *stranger = grouped("stranger");
    kvp_object_set_group(stranger, id);
    kvp_object_set_member_index(stranger, 0);
    kvp_group_leave(&gt, stranger);
    kvp_group_rebind(&gt, stranger, stranger);
    check_members(&gt, id, n);
    free(stranger);
    for (int i = 0; i < N; i++) {
        if (in[i])
            kvp_group_leave(&gt, o[i]);
        free(o[i]);
    }
    assert_null(kvp_group_get(&gt, id));
    assert_int_equal(gt.members, 0);
    assert_int_equal(gt.live, 0);
    free(o);
    free(in);
    kvp_group_table_cleanup(&gt);
}

/* What a group costs per object (glibc's count of bytes in use): printed, and bounded. */
static void test_bytes_per_object(void **state)
{
    (void)state;
    enum { N = 100000, PER_GROUP = 8 };
    kvp_group_table_t gt;
    assert_int_equal(kvp_group_table_init(&gt), KVP_OK);
    kvp_object_t **o = calloc(N, sizeof(*o));
    assert_non_null(o);
    char key[64], name[32];
    size_t base = mallinfo2().uordblks;
    for (int i = 0; i < N; i++) {
        int n = snprintf(key, sizeof(key), "model/layer/%08d/blockhash", i);
        o[i] = kvp_object_create(key, (size_t)n, (uint64_t)i, 1);
    }
    double plain = (double)(mallinfo2().uordblks - base) / N;
    for (int i = 0; i < N; i++)
        free(o[i]);
    base = mallinfo2().uordblks;
    for (int i = 0; i < N; i++) {
        int n = snprintf(key, sizeof(key), "model/layer/%08d/blockhash", i);
        o[i] = kvp_object_create_grouped(key, (size_t)n, (uint64_t)i, 1);
        int m = snprintf(name, sizeof(name), "req-%d", i / PER_GROUP);
        assert_int_equal(kvp_group_join(&gt, 0, name, (size_t)m, 0, o[i]), KVP_OK);
    }
    double with = (double)(mallinfo2().uordblks - base) / N;
    print_message("bytes per object (a 35-byte key, 1 replica): %.1f ungrouped, %.1f in a group "
                  "of %d (+%.1f: id after the key, member pointer, the group's share)\n",
                  plain, with, PER_GROUP, with - plain);
    assert_true(with - plain <= 32.0);
    for (int i = 0; i < N; i++) {
        kvp_group_leave(&gt, o[i]);
        free(o[i]);
    }
    free(o);
    kvp_group_table_cleanup(&gt);
}

/* ---- the master with groups ---- */

/* Mount segment "s1" (SLOTS objects) on conn, adopting (its objects offered back); its id. */
static uint64_t mount(kvp_master_state_t *st, uint64_t conn, bool adopting)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.name = (char *)"s1";
    d.medium = (char *)"dram";
    d.size = SLOTS * OBJ;
    d.host_id = (char *)"h1";
    d.tcp_endpoint = (char *)"10.0.0.1:7000";
    d.shm_path = (char *)"/dev/shm/kvp-seg";
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 1000 + conn;
    req.segment = &d;
    req.adopting = adopting;
    Kvpool__MountResponse *r =
        svc_call(st, conn, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    uint64_t id = r->segment_id;
    svc_msg_free(r);
    return id;
}

static int setup(void **state)
{
    if (svc_state_setup(state) != 0)
        return -1;
    kvp_master_state_t *st = *state;
    st->rng = 0x5EED5EED5EED5EEDull;
    st->now_ms = 1;
    st->config.evict = true;
    st->config.lease_ttl_ms = 5000;
    st->config.put_timeout_ms = 30000;
    st->config.soft_pin_ttl_s = 1800;
    st->config.segment_records = true;
    return mount(st, 1, false) != 0 ? 0 : -1;
}

/* PutStart + PutEnd of one 64-byte key in group (NULL: none named); upsert; pin. */
static int32_t put_pin(kvp_master_state_t *st, const char *key, const char *group, bool upsert,
                       unsigned pin)
{
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    uint64_t size = OBJ;
    ProtobufCBinaryData g = {.len = group ? strlen(group) : 0, .data = (uint8_t *)group};
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.sizes = &size;
    req.n_sizes = 1;
    cfg.replica_num = 1;
    cfg.upsert = upsert;
    cfg.pin = pin;
    req.config = &cfg;
    if (group != NULL) {
        req.group_ids = &g;
        req.n_group_ids = 1;
    }
    Kvpool__PutStartResponse *r =
        svc_call(st, 2, KVP_RPC_PUT_START, &req.base, &kvpool__put_start_response__descriptor);
    int32_t status = r->status != KVP_OK ? r->status : r->results[0]->status;
    svc_msg_free(r);
    if (status != KVP_OK)
        return status;
    Kvpool__PutEndRequest end = KVPOOL__PUT_END_REQUEST__INIT;
    uint32_t crc = 0;
    end.keys = svc_keys(&key, 1);
    end.n_keys = 1;
    end.crc32c = &crc;
    end.n_crc32c = 1;
    Kvpool__StatusesResponse *e =
        svc_call(st, 2, KVP_RPC_PUT_END, &end.base, &kvpool__statuses_response__descriptor);
    status = e->status != KVP_OK ? e->status : e->statuses[0];
    svc_msg_free(e);
    return status;
}

static int32_t put(kvp_master_state_t *st, const char *key, const char *group, bool upsert)
{
    return put_pin(st, key, group, upsert, KVP_PIN_NONE);
}

static int32_t keys1(kvp_master_state_t *st, uint16_t method, const char *key)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    Kvpool__StatusesResponse *r =
        svc_call(st, 3, method, &req.base, &kvpool__statuses_response__descriptor);
    int32_t s = r->status != KVP_OK ? r->status : r->statuses[0];
    svc_msg_free(r);
    return s;
}

/* Is key resident? (without an Exist, which would lease a grouped key's group) */
static bool resident(kvp_master_state_t *st, const char *key)
{
    kvp_object_t *o =
        kvp_index_lookup(&st->index, key, strlen(key), kvp_index_hash(key, strlen(key)));
    return o != NULL && o->state == KVP_OBJ_COMPLETE;
}

static void fill(kvp_master_state_t *st, const char *prefix, unsigned n)
{
    char key[32];
    for (unsigned i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s%u", prefix, i);
        assert_int_equal(put(st, key, NULL, false), KVP_OK);
    }
}

/* A victim takes its group's members with it; an older ungrouped object stays. */
static void test_eviction_expands(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(put(st, "a1", "a", false), KVP_OK); /* the oldest: the first victim */
    assert_int_equal(put(st, "x", NULL, false), KVP_OK);
    assert_int_equal(put(st, "a2", "a", false), KVP_OK);
    assert_int_equal(put(st, "b1", "", false), KVP_OK); /* "": ungrouped */
    fill(st, "f", SLOTS - 4);                           /* full */
    assert_true(resident(st, "a1") && resident(st, "a2"));
    uint64_t evicted = st->stats.group_evicted;
    assert_int_equal(put(st, "one-more", NULL, false), KVP_OK);
    assert_false(resident(st, "a1"));
    assert_false(resident(st, "a2")); /* with a1 */
    assert_true(resident(st, "x"));   /* older than a2, ungrouped: stays */
    assert_true(resident(st, "b1"));
    assert_int_equal(st->stats.group_evicted, evicted + 1);
    assert_int_equal(st->groups.live, 0); /* membership cleaned up */
}

/* A 65 536-member group in a segment of as many slots and 64 more: a read of a member
 * leases the group with no lease slot per member, a read lease slot on a member is counted
 * in its group (passed over whole, in O(1) per object looked at: the old scan of every
 * member for each was 2^32 steps here), and once the leases are over the group goes as a
 * unit. */
enum { BIG = 65536 };
static int setup_big(void **state)
{
    if (setup(state) != 0)
        return -1;
    kvp_master_state_t *st = *state;
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.name = (char *)"s2";
    d.medium = (char *)"dram";
    d.size = (uint64_t)BIG * OBJ;
    d.host_id = (char *)"h1";
    d.tcp_endpoint = (char *)"10.0.0.1:7000";
    d.shm_path = (char *)"/dev/shm/kvp-seg2";
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 1001;
    req.segment = &d;
    Kvpool__MountResponse *r =
        svc_call(st, 1, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
    int ok = r->status == KVP_OK ? 0 : -1;
    svc_msg_free(r);
    return ok;
}

static kvp_object_t *lookup(kvp_master_state_t *st, const char *key)
{
    return kvp_index_lookup(&st->index, key, strlen(key), kvp_index_hash(key, strlen(key)));
}

static void test_big_group_lease_and_eviction(void **state)
{
    kvp_master_state_t *st = *state;
    char key[32];
    for (unsigned i = 0; i < BIG; i++) {
        snprintf(key, sizeof(key), "big%u", i);
        assert_int_equal(put(st, key, "big", false), KVP_OK);
    }
    fill(st, "u", SLOTS); /* full */
    uint32_t gid = kvp_object_group(lookup(st, "big0"));
    kvp_group_t *g = kvp_group_get(&st->groups, gid);
    assert_non_null(g);
    assert_int_equal(g->n, BIG);
    /* Exist of one member: the group is leased, no member gets a slot */
    uint32_t slots = st->leases.live;
    assert_int_equal(keys1(st, KVP_RPC_EXIST, "big7"), 1);
    assert_true(g->lease_until_ms > st->now_ms);
    assert_true(st->leases.live <= slots + 1);
    assert_false(kvp_leased(st, lookup(st, "big8")));
    fill(st, "v", 16); /* pressure: ungrouped ones go, the group stays whole */
    assert_int_equal(g->n, BIG);
    assert_false(resident(st, "u0"));
    /* the group lease over, a read lease slot on one member still holds it */
    st->now_ms += 5001;
    kvp_lease_expire(st); /* (big7's own lease from Exist: over, reaped as eviction does) */
    assert_int_equal(g->leased, 0);
    kvp_lease_grant(st, lookup(st, "big9"), KVP_LEASE_NOBODY);
    assert_int_equal(g->leased, 1);
    fill(st, "w", 16);
    assert_int_equal(g->n, BIG);
    /* that lease ends by its TTL: the count goes down, and the group goes as a unit */
    st->now_ms += 5001;
    kvp_lease_expire(st);
    assert_int_equal(g->leased, 0);
    uint64_t evicted = st->stats.group_evicted;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 0; resident(st, "big0"); i++) {
        assert_true(i < 2 * SLOTS + 64);
        snprintf(key, sizeof(key), "x%u", i);
        assert_int_equal(put(st, key, NULL, false), KVP_OK);
    }
    /* the victim took 4096 of its group with it; the rest go a turn's share at a time,
     * never more than 4096 members looked at in one call */
    assert_int_equal(st->n_group_evictions, 1);
    unsigned turns = 0;
    while (st->n_group_evictions > 0) {
        uint64_t before = st->stats.group_evicted;
        kvp_evict_groups_continue(st);
        assert_true(st->stats.group_evicted - before <= 4096);
        assert_true(++turns <= BIG / 4096 + 1);
    }
    assert_true(turns >= BIG / 4096 - 2);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    print_message("puts and turns until the %d-member group went (printed, not checked): %.1f "
                  "ms\n",
                  BIG,
                  (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    for (unsigned i = 0; i < BIG; i += 997) {
        snprintf(key, sizeof(key), "big%u", i);
        assert_false(resident(st, key));
    }
    assert_int_equal(st->stats.group_evicted, evicted + BIG - 1);
    assert_null(kvp_group_get(&st->groups, gid));
    assert_true(resident(st, "w15"));
}

/* Members that may not go stay: pinned ones; one being read keeps the group whole. */
static void test_eviction_checks_each_member(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(put(st, "p1", "p", false), KVP_OK);
    assert_int_equal(put_pin(st, "p2", "p", false, KVP_PIN_HARD), KVP_OK); /* pinned */
    assert_int_equal(put(st, "q1", "q", false), KVP_OK);
    assert_int_equal(put(st, "q2", "q", false), KVP_OK);
    assert_int_equal(put(st, "q3", "q", false), KVP_OK);
    /* q1 looked up: Exist leases its group (q2, q3 too) */
    assert_int_equal(keys1(st, KVP_RPC_EXIST, "q1"), 1);
    /* one expiry for the group (O(1)), no lease slot per member */
    const kvp_object_t *q3 = kvp_index_lookup(&st->index, "q3", 2, kvp_index_hash("q3", 2));
    assert_true(kvp_group_get(&st->groups, kvp_object_group(q3))->lease_until_ms > st->now_ms);
    assert_false(kvp_leased(st, q3));
    fill(st, "f", SLOTS - 5);
    /* pressure: 10 more puts, each evicting */
    fill(st, "more", 10);
    assert_false(resident(st, "p1"));
    assert_true(resident(st, "p2")); /* pinned: skipped by the expansion */
    assert_true(resident(st, "q1") && resident(st, "q2") && resident(st, "q3"));
    /* the leases end by their TTL: the group is ordinary again, and goes together */
    st->now_ms += 5001;
    char key[32];
    for (unsigned i = 0; resident(st, "q1"); i++) { /* puts until q1 is a victim */
        assert_true(i < 2 * SLOTS);
        assert_true(resident(st, "q2") && resident(st, "q3"));
        snprintf(key, sizeof(key), "late%u", i);
        assert_int_equal(put(st, key, NULL, false), KVP_OK);
    }
    assert_false(resident(st, "q2")); /* with it */
    assert_false(resident(st, "q3"));
}

/* An upsert keeps the group or is refused (INVALID_ARG); a new value keeps its group. */
static void test_upsert_keeps_group(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(put(st, "k", "g", false), KVP_OK);
    assert_int_equal(put(st, "k", "h", true), KVP_ERR_INVALID_ARG);
    assert_int_equal(put(st, "k", "", true), KVP_ERR_INVALID_ARG);
    assert_int_equal(st->stats.group_refused, 2);
    assert_int_equal(put(st, "k", NULL, true), KVP_OK);
    assert_int_equal(put(st, "k", "g", true), KVP_OK);
    uint32_t id = kvp_group_find(&st->groups, 0, "g", 1);
    assert_true(id != 0);
    assert_int_equal(kvp_group_get(&st->groups, id)->n, 1);
    /* the only member replaced by a new value (the old one being read): still in g */
    assert_int_equal(put(st, "u", NULL, false), KVP_OK);
    assert_int_equal(put(st, "u", "g", true), KVP_ERR_INVALID_ARG);
    assert_int_equal(keys1(st, KVP_RPC_REMOVE, "k"), KVP_OK);
    assert_int_equal(kvp_group_find(&st->groups, 0, "g", 1), 0);
    assert_int_equal(st->groups.live, 0);
}

/* group_ids of another count than the keys: the whole request is refused. */
static void test_count_mismatch(void **state)
{
    kvp_master_state_t *st = *state;
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    const char *keys[2] = {"m1", "m2"};
    uint64_t sizes[2] = {OBJ, OBJ};
    ProtobufCBinaryData g = {.len = 1, .data = (uint8_t *)"g"};
    req.keys = svc_keys(keys, 2);
    req.n_keys = 2;
    req.sizes = sizes;
    req.n_sizes = 2;
    req.group_ids = &g;
    req.n_group_ids = 1;
    Kvpool__PutStartResponse *r =
        svc_call(st, 2, KVP_RPC_PUT_START, &req.base, &kvpool__put_start_response__descriptor);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    svc_msg_free(r);
    assert_false(resident(st, "m1"));
    assert_int_equal(st->index.count, 0);
}

/* A segment dropped (its owner's connection gone) and mounted again: its objects come
 * back from the master's limbo in their groups. */
static void test_dropped_segment_keeps_groups(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(put(st, "d1", "d", false), KVP_OK);
    assert_int_equal(put(st, "d2", "d", false), KVP_OK);
    assert_int_equal(put(st, "d3", NULL, false), KVP_OK);
    kvp_dispatch_conn_closed(st, 1);
    assert_false(resident(st, "d1"));
    assert_int_equal(st->groups.live, 0);
    assert_non_null(st->limbo);
    uint64_t back = mount(st, 4, true);
    Kvpool__AdoptRequest req = KVPOOL__ADOPT_REQUEST__INIT;
    req.segment_id = back;
    req.last = true;
    Kvpool__AdoptResponse *r =
        svc_call(st, 4, KVP_RPC_ADOPT, &req.base, &kvpool__adopt_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    svc_msg_free(r);
    assert_true(resident(st, "d1") && resident(st, "d2") && resident(st, "d3"));
    uint32_t id = kvp_group_find(&st->groups, 0, "d", 1);
    assert_true(id != 0);
    assert_int_equal(kvp_group_get(&st->groups, id)->n, 2);
    assert_int_equal(put(st, "d1", "e", true), KVP_ERR_INVALID_ARG);
    assert_int_equal(put(st, "d3", "d", true), KVP_ERR_INVALID_ARG); /* still ungrouped */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join_leave_and_scope),
        cmocka_unit_test(test_many_groups),
        cmocka_unit_test(test_bytes_per_object),
        cmocka_unit_test(test_big_group_leave_rebind),
        cmocka_unit_test_setup_teardown(test_eviction_expands, setup, svc_state_teardown),
        cmocka_unit_test_setup_teardown(test_big_group_lease_and_eviction, setup_big,
                                        svc_state_teardown),
        cmocka_unit_test_setup_teardown(test_eviction_checks_each_member, setup,
                                        svc_state_teardown),
        cmocka_unit_test_setup_teardown(test_upsert_keeps_group, setup, svc_state_teardown),
        cmocka_unit_test_setup_teardown(test_count_mismatch, setup, svc_state_teardown),
        cmocka_unit_test_setup_teardown(test_dropped_segment_keeps_groups, setup,
                                        svc_state_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
