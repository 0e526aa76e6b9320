/*
 * test_segment_calls_principals.c - unit tests for what a segment's principal may do that
 * another may not (master/rpc/segment_calls.c, record_calls.c, admin_calls.c' Stat,
 * meta/limbo.c): SegRecord only by the principal that mounted the segment, a mount that
 * claims another principal's data endpoint or a name held for it refused, a dropped
 * segment's objects taken back only by its own principal, and the owner's client id and
 * details in Heartbeat and Stat only for its principal and admins.
 *
 * Drives kvp_dispatch_handle with principals, as the server does with an ACL (tenants
 * off: the principals' tag is what is compared).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "common/acl.h"
#include "master/dispatch.h"
#include "master/meta/limbo.h"
#include "master/core/state.h"
#include "tests/unit/master/rpc/fixture_store.h"
#include "tests/unit/master/svc_call.h"

#define C_OWNER 1  /* the owner's control connection */
#define C_STREAM 2 /* its record stream */
#define C_THIEF 3  /* the other principal's */
#define C_BACK 4   /* the owner's, after it came back */
#define C_CLI 5    /* a client putting */

static const kvp_principal_t OWNER = {
    .name = "segsrv", .tenant = "default", .roles = KVP_ROLE_SEGMENT, .tag = 0x1111};
static const kvp_principal_t THIEF = {
    .name = "bobseg", .tenant = "default", .roles = KVP_ROLE_SEGMENT, .tag = 0x2223};
static const kvp_principal_t READER = {
    .name = "bob", .tenant = "default", .roles = KVP_ROLE_READ | KVP_ROLE_WRITE, .tag = 0x3335};
static const kvp_principal_t ADMIN = {
    .name = "admin", .tenant = "default", .roles = KVP_ROLE_ADMIN, .tag = 0x4447};

/* A DRAM segment mounted by who: the status; *id_p its id. */
static int32_t mount_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who,
                        const char *name, const char *endpoint, const char *shm, bool adopting,
                        uint64_t *id_p)
{
    Kvpool__SegmentDesc d;
    fill_desc(&d); /* a DRAM segment of host "h" */
    d.name = (char *)name;
    d.tcp_endpoint = (char *)endpoint;
    d.shm_path = (char *)shm;
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 100 + conn;
    req.segment = &d;
    req.adopting = adopting;
    Kvpool__MountResponse *r =
        svc_call_as(st, conn, who, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
    int32_t s = r->status;
    if (id_p != NULL)
        *id_p = r->segment_id;
    if (s == KVP_ERR_DENIED)
        assert_true(strstr(r->message, "may not mount segment") != NULL);
    svc_msg_free(r);
    return s;
}

/* SegRecord by who on conn: KVP_OK when it became the segment's stream, else the status. */
static int32_t subscribe_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who,
                            uint64_t seg, uint64_t client_id)
{
    Kvpool__SegRecordRequest req = KVPOOL__SEG_RECORD_REQUEST__INIT;
    req.segment_id = seg;
    req.client_id = client_id;
    st->stream_segment = 0;
    Kvpool__SegRecordResponse *r = svc_call_as(st, conn, who, KVP_RPC_SEG_RECORD, &req.base,
                                               &kvpool__seg_record_response__descriptor);
    if (r == NULL) {
        assert_int_equal(st->stream_segment, seg);
        st->stream_segment = 0;
        return KVP_OK;
    }
    assert_int_equal(st->stream_segment, 0);
    int32_t s = r->status;
    svc_msg_free(r);
    return s;
}

/* An empty offer that ends (Adopt, last). */
static int32_t offer_end(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who,
                         uint64_t seg)
{
    Kvpool__AdoptRequest req = KVPOOL__ADOPT_REQUEST__INIT;
    req.segment_id = seg;
    req.last = true;
    Kvpool__AdoptResponse *r =
        svc_call_as(st, conn, who, KVP_RPC_ADOPT, &req.base, &kvpool__adopt_response__descriptor);
    int32_t s = r->status;
    svc_msg_free(r);
    return s;
}

/* A put of key by an anonymous client (no ACL on this call: tenants are off). */
static void put(kvp_master_state_t *st, const char *key)
{
    assert_int_equal(put1(st, C_CLI, key, 100, NULL), KVP_OK);
    assert_int_equal(end1(st, C_CLI, key, 7), KVP_OK);
}

static bool stored(kvp_master_state_t *st, const char *key)
{
    return kvp_index_lookup(&st->index, key, strlen(key), kvp_index_hash(key, strlen(key))) != NULL;
}

static int setup_records(void **state)
{
    if (setup(state) != 0)
        return -1;
    kvp_master_state_t *st = *state;
    st->config.segment_records = true;
    return 0;
}

/* ---- SegRecord ---- */

static void test_record_only_for_the_principal_that_mounted(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id;
    assert_int_equal(mount_as(st, C_OWNER, &OWNER, "own", "127.0.0.1:7000", "@m", true, &id),
                     KVP_OK);
    /* the owner's client id and all, from another principal: refused, counted, no stream */
    assert_int_equal(subscribe_as(st, C_THIEF, &THIEF, id, 100 + C_OWNER), KVP_ERR_NOT_OWNER);
    assert_int_equal(st->stats.refused_seg_record, 1);
    /* not an admin either: the stream is the owner's */
    assert_int_equal(subscribe_as(st, C_THIEF, &ADMIN, id, 100 + C_OWNER), KVP_ERR_NOT_OWNER);
    assert_int_equal(st->stats.refused_seg_record, 2);
    /* the owner's principal with another client id: the segment is not its client's */
    assert_int_equal(subscribe_as(st, C_STREAM, &OWNER, id, 12345), KVP_ERR_SEGMENT_GONE);
    /* the owner, on a connection of its own */
    assert_int_equal(subscribe_as(st, C_STREAM, &OWNER, id, 100 + C_OWNER), KVP_OK);
    assert_int_equal(st->stats.refused_seg_record, 2);
}

/* ---- a mount claiming another principal's segment ---- */

static void test_endpoint_of_another_principal(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id;
    assert_int_equal(mount_as(st, C_OWNER, &OWNER, "own", "127.0.0.1:7000", "@m", false, &id),
                     KVP_OK);
    const char *same[] = {"127.0.0.1:7000",          "localhost:7000",  "127.1:7000",
                          "[::ffff:127.0.0.1]:7000", "LocalHost.:7000", "127.0.0.2:7000"};
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++)
        assert_int_equal(mount_as(st, C_THIEF, &THIEF, "fake", same[i], "", false, NULL),
                         KVP_ERR_DENIED);
    assert_int_equal(mount_as(st, C_THIEF, &THIEF, "fake", "127.0.0.1:7001", "@m", false, NULL),
                     KVP_ERR_DENIED); /* the owner's shm path */
    assert_int_equal(st->stats.refused_seg_endpoint, 7);
    /* another port, another address: mounted */
    assert_int_equal(mount_as(st, C_THIEF, &THIEF, "fake", "127.0.0.1:7001", "", false, NULL),
                     KVP_OK);
    assert_int_equal(mount_as(st, C_THIEF, &THIEF, "fake2", "10.0.0.9:7000", "", false, NULL),
                     KVP_OK);
    /* the owner's own principal may advertise it again (an SSD segment beside it, a second
     * client): it proves nothing, but claims nothing of another's either */
    assert_int_equal(mount_as(st, C_BACK, &OWNER, "own2", "127.0.0.1:7000", "", false, NULL),
                     KVP_OK);
    assert_int_equal(st->stats.refused_seg_endpoint, 7);
    /* without an ACL there are no principals: nothing is compared */
    assert_int_equal(mount_as(st, C_CLI, NULL, "anon", "127.0.0.1:7000", "", false, NULL), KVP_OK);
}

/* ---- a dropped segment's objects ---- */

static void test_dropped_segment_taken_back_only_by_its_principal(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id, back;
    assert_int_equal(mount_as(st, C_OWNER, &OWNER, "own", "127.0.0.1:7000", "@m", false, &id),
                     KVP_OK);
    put(st, "k1");
    put(st, "k2");
    kvp_dispatch_conn_closed(st, C_OWNER);
    assert_false(stored(st, "k1"));
    assert_non_null(st->limbo);
    /* another principal: its name, host and memory, at another endpoint: refused, and the
     * limbo stays */
    assert_int_equal(mount_as(st, C_THIEF, &THIEF, "own", "127.0.0.1:7001", "@m", true, NULL),
                     KVP_ERR_DENIED);
    assert_int_equal(st->stats.refused_seg_held, 1);
    /* another name, the dropped segment's endpoint or memory: held for its owner too */
    assert_int_equal(mount_as(st, C_THIEF, &THIEF, "other", "127.0.0.1:7000", "", true, NULL),
                     KVP_ERR_DENIED);
    assert_int_equal(mount_as(st, C_THIEF, &THIEF, "other", "127.0.0.1:7001", "@m", true, NULL),
                     KVP_ERR_DENIED);
    assert_int_equal(st->stats.refused_seg_endpoint, 2);
    assert_non_null(st->limbo);
    assert_int_equal(st->limbo->n, 2);
    assert_false(stored(st, "k1"));
    /* the owner's principal, the same segment: taken back when its offer ends */
    assert_int_equal(mount_as(st, C_BACK, &OWNER, "own", "127.0.0.1:7000", "@m", true, &back),
                     KVP_OK);
    assert_null(st->limbo);
    assert_int_equal(offer_end(st, C_BACK, &OWNER, back), KVP_OK);
    assert_true(stored(st, "k1") && stored(st, "k2"));
    assert_int_equal(st->stats.taken_back, 2);
}

static void test_limbo_owner_must_match(void **state)
{
    (void)state;
    kvp_limbo_owner_t a = {.tag = 1, .tenant = 2, .dedicated = true, .dedicated_to = 2};
    kvp_limbo_t *l = kvp_limbo_new("n", "h", "@m", "127.0.0.1:1", "", &a, 10);
    assert_non_null(l);
    assert_true(kvp_limbo_is(l, "n", "h", "@m", &a));
    kvp_limbo_owner_t b = a;
    b.tag = 3;
    assert_false(kvp_limbo_is(l, "n", "h", "@m", &b)); /* another principal */
    b = a;
    b.tenant = 4;
    assert_false(kvp_limbo_is(l, "n", "h", "@m", &b)); /* its principal now in another tenant */
    b = a;
    b.dedicated = false;
    assert_false(kvp_limbo_is(l, "n", "h", "@m", &b)); /* not dedicated now */
    b = a;
    b.dedicated_to = 5;
    assert_false(kvp_limbo_is(l, "n", "h", "@m", &b)); /* dedicated to another tenant */
    assert_true(kvp_limbo_held_by(l, 1));
    assert_false(kvp_limbo_held_by(l, 3));
    kvp_limbo_free(l);
}

/* ---- what Heartbeat and Stat hand out ---- */

/* The descriptor of segment id in who's Heartbeat (NULL: none); *r_p to free. */
static Kvpool__SegmentDesc *beat_desc(kvp_master_state_t *st, const kvp_principal_t *who,
                                      uint64_t id, Kvpool__HeartbeatResponse **r_p)
{
    Kvpool__HeartbeatRequest req = KVPOOL__HEARTBEAT_REQUEST__INIT;
    *r_p = svc_call_as(st, C_CLI, who, KVP_RPC_HEARTBEAT, &req.base,
                       &kvpool__heartbeat_response__descriptor);
    for (size_t i = 0; i < (*r_p)->n_segments; i++)
        if ((*r_p)->segments[i]->id == id)
            return (*r_p)->segments[i];
    return NULL;
}

static void test_owner_details_only_to_its_principal(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t id;
    assert_int_equal(mount_as(st, C_OWNER, &OWNER, "own", "127.0.0.1:7000", "@m", false, &id),
                     KVP_OK);
    Kvpool__HeartbeatResponse *r;
    assert_null(beat_desc(st, &THIEF, id, &r)); /* neither reads nor writes */
    svc_msg_free(r);
    Kvpool__SegmentDesc *d = beat_desc(st, &READER, id, &r);
    assert_non_null(d);
    assert_int_equal(d->owner_client_id, 0);
    assert_string_equal(d->tcp_endpoint, "127.0.0.1:7000");
    assert_string_equal(d->shm_path, "@m"); /* a client compares every field it is given */
    svc_msg_free(r);
    const kvp_principal_t *all[] = {&OWNER, &ADMIN, NULL};
    for (size_t i = 0; i < 3; i++) {
        d = beat_desc(st, all[i], id, &r);
        assert_non_null(d);
        assert_int_equal(d->owner_client_id, 100 + C_OWNER);
        svc_msg_free(r);
    }
    /* Stat: what `kvpool stat` shows, not what reaches or impersonates the owner */
    Kvpool__StatRequest sreq = KVPOOL__STAT_REQUEST__INIT;
    Kvpool__StatResponse *s = svc_call_as(st, C_CLI, &THIEF, KVP_RPC_STAT, &sreq.base,
                                          &kvpool__stat_response__descriptor);
    assert_int_equal(s->n_segments, 1);
    d = s->segments[0]->desc;
    assert_string_equal(d->name, "own");
    assert_string_equal(d->tcp_endpoint, "127.0.0.1:7000");
    assert_int_equal(d->owner_client_id, 0);
    assert_string_equal(d->host_id, "");
    assert_string_equal(d->shm_path, "");
    svc_msg_free(s);
    s = svc_call_as(st, C_CLI, &ADMIN, KVP_RPC_STAT, &sreq.base,
                    &kvpool__stat_response__descriptor);
    d = s->segments[0]->desc;
    assert_int_equal(d->owner_client_id, 100 + C_OWNER);
    assert_string_equal(d->host_id, "h");
    assert_string_equal(d->shm_path, "@m");
    svc_msg_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_record_only_for_the_principal_that_mounted,
                                        setup_records, teardown),
        cmocka_unit_test_setup_teardown(test_endpoint_of_another_principal, setup_records,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_dropped_segment_taken_back_only_by_its_principal,
                                        setup_records, teardown),
        cmocka_unit_test(test_limbo_owner_must_match),
        cmocka_unit_test_setup_teardown(test_owner_details_only_to_its_principal, setup_records,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
