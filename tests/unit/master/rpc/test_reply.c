/*
 * test_reply.c - unit tests for master/rpc/reply.c, the response builder every
 * handler answers through: the status and message it sets (cut at the method's
 * room, not sent when empty), the arrays and per-key statuses it releases, the
 * end callback with the outcome, refusals counted by role, and that every
 * response type in the method table has the `status` field kvp_reply_fail sets.
 *
 * Each test builds a reply around a real response type and unpacks what
 * kvp_call_reply packed, as a client would.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "master/dispatch.h"
#include "master/rpc/reply.h"
#include "master/core/state.h"
#include "tests/unit/master/svc_call.h"

static kvp_call_t call_for(kvp_master_state_t *st, const ProtobufCMessageDescriptor *resp_desc)
{
    return (kvp_call_t){.st = st, .conn_id = 1, .resp_desc = resp_desc};
}

/* The packed answer, unpacked as resp_desc; the call's buffer freed. */
static void *unpacked(kvp_call_t *call)
{
    assert_non_null(call->resp);
    ProtobufCMessage *m =
        protobuf_c_message_unpack(call->resp_desc, NULL, call->resp_len, call->resp);
    assert_non_null(m);
    free(call->resp);
    call->resp = NULL;
    return m;
}

static void test_fail_sets_status_and_message(void **state)
{
    kvp_call_t call = call_for(*state, &kvpool__drain_response__descriptor);
    Kvpool__DrainResponse resp = KVPOOL__DRAIN_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, &call, &resp.base, 320);
    assert_int_equal(kvp_reply_fail(&r, KVP_ERR_SEGMENT_GONE, "no segment %s is mounted", "s1"),
                     KVP_OK);
    Kvpool__DrainResponse *got = unpacked(&call);
    assert_int_equal(got->status, KVP_ERR_SEGMENT_GONE);
    assert_string_equal(got->message, "no segment s1 is mounted");
    protobuf_c_message_free_unpacked(&got->base, NULL);
}

/* A message longer than the method's room is cut there, as snprintf into its buffer did. */
static void test_message_cut_at_room(void **state)
{
    kvp_call_t call = call_for(*state, &kvpool__list_response__descriptor);
    Kvpool__ListResponse resp = KVPOOL__LIST_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, &call, &resp.base, 16);
    assert_int_equal(kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, "%s", "0123456789abcdefghij"), KVP_OK);
    Kvpool__ListResponse *got = unpacked(&call);
    assert_int_equal(got->status, KVP_ERR_INVALID_ARG);
    assert_string_equal(got->message, "0123456789abcde");
    protobuf_c_message_free_unpacked(&got->base, NULL);
}

/* No message: the same bytes as the bare response (proto3 sends no empty string). */
static void test_no_message_same_bytes(void **state)
{
    kvp_call_t call = call_for(*state, &kvpool__drain_response__descriptor);
    Kvpool__DrainResponse resp = KVPOOL__DRAIN_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, &call, &resp.base, 320);
    resp.segment_id = 42;
    assert_int_equal(kvp_reply_send(&r), KVP_OK);
    Kvpool__DrainResponse bare = KVPOOL__DRAIN_RESPONSE__INIT;
    bare.segment_id = 42;
    bare.message = (char *)"";
    uint8_t want[64];
    size_t n = kvpool__drain_response__pack(&bare, want);
    assert_int_equal(call.resp_len, n);
    assert_memory_equal(call.resp, want, n);
    free(call.resp);
}

/* A message the handler wrote itself, with a whole-request status OK. */
static void test_handler_text_sent(void **state)
{
    kvp_call_t call = call_for(*state, &kvpool__put_start_response__descriptor);
    Kvpool__PutStartResponse resp = KVPOOL__PUT_START_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, &call, &resp.base, 384);
    strcpy(r.text, "pool full");
    assert_true(kvp_reply_segments(&r));
    assert_int_equal(kvp_reply_send(&r), KVP_OK);
    Kvpool__PutStartResponse *got = unpacked(&call);
    assert_int_equal(got->status, KVP_OK);
    assert_string_equal(got->message, "pool full");
    assert_int_equal(got->n_segments, 0);
    protobuf_c_message_free_unpacked(&got->base, NULL);
}

static void test_statuses(void **state)
{
    kvp_call_t call = call_for(*state, &kvpool__statuses_response__descriptor);
    Kvpool__StatusesResponse resp = KVPOOL__STATUSES_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, &call, &resp.base, 0);
    int32_t *out = kvp_reply_statuses(&r, 3);
    assert_non_null(out);
    out[0] = KVP_OK;
    out[1] = KVP_ERR_NOT_FOUND;
    out[2] = 1;
    assert_int_equal(kvp_reply_send(&r), KVP_OK);
    Kvpool__StatusesResponse *got = unpacked(&call);
    assert_int_equal(got->status, KVP_OK);
    assert_int_equal(got->n_statuses, 3);
    assert_int_equal(got->statuses[1], KVP_ERR_NOT_FOUND);
    assert_int_equal(got->statuses[2], 1);
    protobuf_c_message_free_unpacked(&got->base, NULL);
}

typedef struct ended {
    int calls;
    kvp_status_t rc;
} ended_t;

static void on_end(kvp_reply_t *r, kvp_status_t rc, void *arg)
{
    ended_t *e = arg;
    assert_non_null(r->resp); /* the response is still there */
    e->calls++;
    e->rc = rc;
}

/* The end callback learns whether the answer goes out; arrays are released either way
 * (the ASan build fails on a leak). */
static void test_end_callback(void **state)
{
    kvp_call_t call = call_for(*state, &kvpool__get_size_response__descriptor);
    Kvpool__GetSizeResponse resp = KVPOOL__GET_SIZE_RESPONSE__INIT;
    ended_t e = {0};
    kvp_reply_t r;
    kvp_reply_init(&r, &call, &resp.base, 0);
    kvp_reply_on_end(&r, on_end, &e);
    int64_t *sizes = kvp_reply_alloc(&r, 2, sizeof(*sizes));
    assert_non_null(sizes);
    sizes[0] = 7;
    sizes[1] = KVP_ERR_NOT_FOUND;
    resp.sizes = sizes;
    resp.n_sizes = 2;
    assert_non_null(kvp_reply_calloc(&r, 0, 16)); /* room for one at least */
    assert_int_equal(kvp_reply_send(&r), KVP_OK);
    assert_int_equal(e.calls, 1);
    assert_int_equal(e.rc, KVP_OK);
    Kvpool__GetSizeResponse *got = unpacked(&call);
    assert_int_equal(got->n_sizes, 2);
    assert_int_equal(got->sizes[0], 7);
    protobuf_c_message_free_unpacked(&got->base, NULL);

    /* no answer after all: the callback undoes, the caller gets a frame-level NOMEM */
    kvp_reply_init(&r, &call, &resp.base, 0);
    kvp_reply_on_end(&r, on_end, &e);
    assert_non_null(kvp_reply_calloc(&r, 4, sizeof(int64_t)));
    assert_int_equal(kvp_reply_abort(&r), KVP_ERR_NOMEM);
    assert_int_equal(e.calls, 2);
    assert_int_equal(e.rc, KVP_ERR_NOMEM);
    assert_null(call.resp);
}

static void test_deny_counts_refusal(void **state)
{
    kvp_master_state_t *st = *state;
    kvp_call_t call = call_for(st, &kvpool__remove_by_regex_response__descriptor);
    Kvpool__RemoveByRegexResponse resp = KVPOOL__REMOVE_BY_REGEX_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, &call, &resp.base, 256);
    uint64_t before = st->stats.refused_role;
    assert_int_equal(kvp_reply_deny(&r, "principal %s may not", "bob"), KVP_OK);
    assert_int_equal(st->stats.refused_role, before + 1);
    Kvpool__RemoveByRegexResponse *got = unpacked(&call);
    assert_int_equal(got->status, KVP_ERR_DENIED);
    assert_string_equal(got->message, "principal bob may not");
    protobuf_c_message_free_unpacked(&got->base, NULL);
}

/* Every response a handler answers with has the int32 `status` kvp_reply_fail sets (Auth's
 * is built by the server, never by rpc/: kvp_handle_auth only refuses). */
static void test_every_response_has_status(void **state)
{
    (void)state;
    size_t n;
    const kvp_method_t *m = kvp_dispatch_table(&n);
    for (size_t i = 0; i < n; i++) {
        if (m[i].resp_desc == NULL || m[i].id == KVP_RPC_AUTH)
            continue;
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(m[i].resp_desc, "status");
        if (f == NULL || f->type != PROTOBUF_C_TYPE_INT32)
            fail_msg("%s's response %s has no int32 status", m[i].name, m[i].resp_desc->name);
    }
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, svc_state_setup, svc_state_teardown)
    const struct CMUnitTest tests[] = {
        T(test_fail_sets_status_and_message),
        T(test_message_cut_at_room),
        T(test_no_message_same_bytes),
        T(test_handler_text_sent),
        T(test_statuses),
        T(test_end_callback),
        T(test_deny_counts_refusal),
        cmocka_unit_test(test_every_response_has_status),
    };
#undef T
    return cmocka_run_group_tests_name("reply", tests, NULL, NULL);
}
