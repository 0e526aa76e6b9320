/*
 * test_dispatch.c - unit tests for master/dispatch.c, the method table.
 *
 * Every method id of common/rpc.h maps to its handler (listed here by hand,
 * independently of the table), each row once, with the request and
 * response types of the wire protocol; ids outside the table give the
 * frame-level error the server has always sent (KVP_ERR_UNKNOWN_METHOD,
 * "unknown method N", no body); the table's one-way rows agree with
 * kvp_rpc_is_oneway; an undecodable body gives KVP_ERR_PROTOCOL with its
 * message; Ping and Stat ignore their body.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "master/dispatch.h"
#include "master/rpc/admin_calls.h"
#include "master/rpc/drain_calls.h"
#include "master/rpc/object_calls.h"
#include "master/rpc/record_calls.h"
#include "master/rpc/segment_calls.h"
#include "master/rpc/ssd_calls.h"
#include "master/rpc/task_calls.h"
#include "master/core/state.h"
#include "tests/unit/master/svc_call.h"

typedef struct expect {
    uint16_t id;
    kvp_handler_t handler;
    const ProtobufCMessageDescriptor *req;
    const ProtobufCMessageDescriptor *resp;
} expect_t;

static const expect_t expected[] = {
    {KVP_RPC_PING, kvp_handle_ping, NULL, NULL},
    {KVP_RPC_MOUNT, kvp_handle_mount, &kvpool__mount_request__descriptor,
     &kvpool__mount_response__descriptor},
    {KVP_RPC_UNMOUNT, kvp_handle_unmount, &kvpool__unmount_request__descriptor,
     &kvpool__unmount_response__descriptor},
    {KVP_RPC_PUT_START, kvp_handle_put_start, &kvpool__put_start_request__descriptor,
     &kvpool__put_start_response__descriptor},
    {KVP_RPC_PUT_END, kvp_handle_put_end, &kvpool__put_end_request__descriptor,
     &kvpool__statuses_response__descriptor},
    {KVP_RPC_PUT_REVOKE, kvp_handle_put_revoke, &kvpool__keys_request__descriptor,
     &kvpool__statuses_response__descriptor},
    {KVP_RPC_GET_REPLICA_LIST, kvp_handle_get_replica_list, &kvpool__keys_request__descriptor,
     &kvpool__get_replica_list_response__descriptor},
    {KVP_RPC_EXIST, kvp_handle_exist, &kvpool__keys_request__descriptor,
     &kvpool__statuses_response__descriptor},
    {KVP_RPC_REMOVE, kvp_handle_remove, &kvpool__keys_request__descriptor,
     &kvpool__statuses_response__descriptor},
    {KVP_RPC_GET_SIZE, kvp_handle_get_size, &kvpool__keys_request__descriptor,
     &kvpool__get_size_response__descriptor},
    {KVP_RPC_STAT, kvp_handle_stat, NULL, &kvpool__stat_response__descriptor},
    {KVP_RPC_HEARTBEAT, kvp_handle_heartbeat, &kvpool__heartbeat_request__descriptor,
     &kvpool__heartbeat_response__descriptor},
    {KVP_RPC_LIST, kvp_handle_list, &kvpool__list_request__descriptor,
     &kvpool__list_response__descriptor},
    {KVP_RPC_REMOVE_BY_REGEX, kvp_handle_remove_by_regex,
     &kvpool__remove_by_regex_request__descriptor, &kvpool__remove_by_regex_response__descriptor},
    {KVP_RPC_DRAIN, kvp_handle_drain, &kvpool__drain_request__descriptor,
     &kvpool__drain_response__descriptor},
    {KVP_RPC_MOVE_START, kvp_handle_move_start, &kvpool__move_start_request__descriptor,
     &kvpool__move_start_response__descriptor},
    {KVP_RPC_MOVE_END, kvp_handle_move_end, &kvpool__move_end_request__descriptor,
     &kvpool__statuses_response__descriptor},
    {KVP_RPC_LEASE_RELEASE, kvp_handle_lease_release, &kvpool__lease_release_request__descriptor,
     NULL},
    {KVP_RPC_SSD_TASKS, kvp_handle_ssd_tasks, &kvpool__ssd_tasks_request__descriptor,
     &kvpool__ssd_tasks_response__descriptor},
    {KVP_RPC_ADOPT, kvp_handle_adopt, &kvpool__adopt_request__descriptor,
     &kvpool__adopt_response__descriptor},
    {KVP_RPC_SEG_RECORD, kvp_handle_seg_record, &kvpool__seg_record_request__descriptor,
     &kvpool__seg_record_response__descriptor},
    {KVP_RPC_AUTH, kvp_handle_auth, &kvpool__auth_request__descriptor,
     &kvpool__auth_response__descriptor},
    {KVP_RPC_TASK_CREATE, kvp_handle_task_create, &kvpool__task_create_request__descriptor,
     &kvpool__task_create_response__descriptor},
    {KVP_RPC_TASK_QUERY, kvp_handle_task_query, &kvpool__task_query_request__descriptor,
     &kvpool__task_query_response__descriptor},
    {KVP_RPC_TASK_START, kvp_handle_task_start, &kvpool__task_start_request__descriptor,
     &kvpool__task_start_response__descriptor},
    {KVP_RPC_TASK_END, kvp_handle_task_end, &kvpool__task_end_request__descriptor,
     &kvpool__statuses_response__descriptor},
    {KVP_RPC_REPLICA_CLEAR, kvp_handle_replica_clear, &kvpool__replica_clear_request__descriptor,
     &kvpool__statuses_response__descriptor},
    {KVP_RPC_PUT_COMMIT, kvp_handle_put_commit, &kvpool__put_commit_request__descriptor,
     &kvpool__put_commit_response__descriptor},
};
#define N_EXPECTED (sizeof(expected) / sizeof(expected[0]))

static void test_every_method_maps_to_its_handler(void **state)
{
    (void)state;
    assert_int_equal(N_EXPECTED, KVP_RPC_METHOD_MAX); /* ids 1..MAX, each listed above */
    for (size_t i = 0; i < N_EXPECTED; i++) {
        const kvp_method_t *m = kvp_dispatch_lookup(expected[i].id);
        assert_non_null(m);
        assert_int_equal(m->id, expected[i].id);
        assert_ptr_equal(m->handler, expected[i].handler);
        assert_ptr_equal(m->req_desc, expected[i].req);
        assert_ptr_equal(m->resp_desc, expected[i].resp);
        assert_non_null(m->name);
        /* one-way (no response packed) exactly where the protocol says so */
        assert_int_equal(m->resp_desc == NULL && m->id != KVP_RPC_PING,
                         kvp_rpc_is_oneway(m->id) != 0);
    }
    /* the table has no row beyond these */
    size_t n, rows = 0;
    const kvp_method_t *t = kvp_dispatch_table(&n);
    for (size_t i = 0; i < n; i++) {
        if (t[i].handler == NULL)
            continue;
        rows++;
        assert_int_equal(t[i].id, i);
    }
    assert_int_equal(rows, N_EXPECTED);
}

static void test_unknown_method(void **state)
{
    kvp_master_state_t *st = *state;
    const uint16_t unknown[] = {0, KVP_RPC_METHOD_MAX + 1, 100, 0x7fff, 0xffff};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        uint8_t *resp = (uint8_t *)"x";
        size_t rlen = 7;
        char err[256] = "";
        char want[64];
        kvp_status_t s = kvp_dispatch_handle(st, 1, NULL, unknown[i], (const uint8_t *)"", 0, &resp,
                                             &rlen, err, sizeof(err));
        assert_int_equal(s, KVP_ERR_UNKNOWN_METHOD);
        snprintf(want, sizeof(want), "unknown method %u", unknown[i]);
        assert_string_equal(err, want);
        assert_null(resp);
        assert_int_equal(rlen, 0);
        assert_null(kvp_dispatch_lookup(unknown[i]));
    }
}

static void test_undecodable_body(void **state)
{
    kvp_master_state_t *st = *state;
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff};
    for (size_t i = 0; i < N_EXPECTED; i++) {
        uint8_t *resp = NULL;
        size_t rlen = 0;
        char err[256] = "";
        kvp_status_t s = kvp_dispatch_handle(st, 1, NULL, expected[i].id, junk, sizeof(junk), &resp,
                                             &rlen, err, sizeof(err));
        if (expected[i].req == NULL) {
            /* Ping and Stat ignore their body */
            assert_int_equal(s, KVP_OK);
            free(resp);
            continue;
        }
        char want[128];
        snprintf(want, sizeof(want), "cannot decode the body of method %u (%zu bytes)",
                 expected[i].id, sizeof(junk));
        assert_int_equal(s, KVP_ERR_PROTOCOL);
        assert_string_equal(err, want);
        assert_null(resp);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_method_maps_to_its_handler),
        cmocka_unit_test_setup_teardown(test_unknown_method, svc_state_setup, svc_state_teardown),
        cmocka_unit_test_setup_teardown(test_undecodable_body, svc_state_setup, svc_state_teardown),
    };
    return cmocka_run_group_tests_name("dispatch", tests, NULL, NULL);
}
