/*
 * test_drain_grants.c - MoveStart's failure paths (master/rpc/drain_calls.c): a move whose
 * answer cannot be built must leave nothing behind, neither a recorded move
 * (st->moves) nor its destination extent. The owner learns of a move only from
 * MoveStart's answer, so one it never got is one it never ends: before the fix
 * it stayed allocated until the owner's connection closed.
 *
 * The failures are forced at the link boundary (-Wl,--wrap, tests/unit/master/meson.build):
 * kvp_grant_seal (a write grant that cannot be sealed: that key's result is
 * KVP_ERR_INTERNAL) and kvp_grant_conn_key (a segment descriptor's connection key
 * that cannot be derived: the whole call fails at frame level). Data grants are
 * on (st->grants_on before the segments mount, so each gets a key); the other
 * MoveStart/MoveEnd behaviour is rpc/test_drain_calls.c's. The fixture's teardown
 * (kvp_master_state_cleanup) frees everything: the ASan build fails on a leak.
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

#include "common/grant.h"
#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "common/acl.h"
#include "master/core/state.h"
#include "tests/unit/master/svc_call.h"

#define OWNER 1 /* mounts A, the segment drained */
#define OTHER 2 /* mounts B, where moves go */
#define CLIENT 3

#define MIB (1u << 20)
#define SZ 1000u  /* object size ... */
#define EXT 1024u /* ... and the extent it takes (rounded up to 64) */

/* How many calls of each wrapped function fail from now on (0: none). */
static unsigned seal_failures, conn_key_failures;

bool __real_kvp_grant_seal(kvp_grant_mac_t *mac, kvp_grant_t *g);
bool __wrap_kvp_grant_seal(kvp_grant_mac_t *mac, kvp_grant_t *g);
bool __wrap_kvp_grant_seal(kvp_grant_mac_t *mac, kvp_grant_t *g)
{
    if (seal_failures > 0) {
        seal_failures--;
        return false;
    }
    return __real_kvp_grant_seal(mac, g);
}

bool __real_kvp_grant_conn_key(kvp_grant_mac_t *mac, uint64_t tag, uint8_t out[KVP_GRANT_KEY_LEN]);
bool __wrap_kvp_grant_conn_key(kvp_grant_mac_t *mac, uint64_t tag, uint8_t out[KVP_GRANT_KEY_LEN]);
bool __wrap_kvp_grant_conn_key(kvp_grant_mac_t *mac, uint64_t tag, uint8_t out[KVP_GRANT_KEY_LEN])
{
    if (conn_key_failures > 0) {
        conn_key_failures--;
        return false;
    }
    return __real_kvp_grant_conn_key(mac, tag, out);
}

typedef struct fixture {
    kvp_master_state_t st;
    uint64_t a, b; /* segment ids */
} fixture_t;

static uint64_t mount(kvp_master_state_t *st, uint64_t conn, const char *name)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.name = (char *)name;
    d.medium = (char *)"dram";
    d.size = MIB;
    d.host_id = (char *)name;                  /* a host each */
    d.tcp_endpoint = (char *)"127.0.0.1:7000"; /* never connected to: no shm path either */
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 1000 + conn;
    req.segment = &d;
    Kvpool__MountResponse *r =
        svc_call(st, conn, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->grant_key.len, KVP_GRANT_KEY_LEN); /* grants are on */
    uint64_t id = r->segment_id;
    svc_msg_free(r);
    return id;
}

/* A one-replica object on A (the only segment mounted when it is put). */
static void put_on_a(kvp_master_state_t *st, const char *key)
{
    uint64_t size = SZ;
    uint32_t crc = 7;
    Kvpool__PutStartRequest ps = KVPOOL__PUT_START_REQUEST__INIT;
    ps.keys = svc_keys(&key, 1);
    ps.n_keys = 1;
    ps.sizes = &size;
    ps.n_sizes = 1;
    Kvpool__PutStartResponse *r =
        svc_call(st, CLIENT, KVP_RPC_PUT_START, &ps.base, &kvpool__put_start_response__descriptor);
    assert_int_equal(r->results[0]->status, KVP_OK);
    svc_msg_free(r);
    Kvpool__PutEndRequest pe = KVPOOL__PUT_END_REQUEST__INIT;
    pe.keys = svc_keys(&key, 1);
    pe.n_keys = 1;
    pe.crc32c = &crc;
    pe.n_crc32c = 1;
    Kvpool__StatusesResponse *e =
        svc_call(st, CLIENT, KVP_RPC_PUT_END, &pe.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(e->statuses[0], KVP_OK);
    svc_msg_free(e);
}

/* Two objects on A, then B mounted and A draining. */
static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));
    if (fx == NULL || kvp_master_state_init(&fx->st) != KVP_OK) {
        free(fx);
        return -1;
    }
    kvp_master_state_t *st = &fx->st;
    st->rng = 0x5EED5EED5EED5EEDull;
    st->config.evict = false;
    st->config.lease_ttl_ms = 5000;
    st->config.put_timeout_ms = 30000;
    st->grants_on = true;
    fx->a = mount(st, OWNER, "A");
    put_on_a(st, "k1");
    put_on_a(st, "k2");
    fx->b = mount(st, OTHER, "B");
    Kvpool__DrainRequest dr = KVPOOL__DRAIN_REQUEST__INIT;
    dr.segment_id = fx->a;
    Kvpool__DrainResponse *r =
        svc_call(st, CLIENT, KVP_RPC_DRAIN, &dr.base, &kvpool__drain_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    svc_msg_free(r);
    seal_failures = conn_key_failures = 0;
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    kvp_master_state_cleanup(&fx->st);
    free(fx);
    return 0;
}

static uint64_t used(kvp_master_state_t *st, uint64_t id)
{
    return kvp_segment_used(kvp_segment_table_get(&st->segments, id));
}

/*
 * MoveStart of k1 and k2 by A's owner, as principal `who` (NULL: no ACL, so no
 * connection keys). The frame-level status; on KVP_OK each key's status and
 * replica count go to status[] and n_reps[].
 */
static kvp_status_t move_start(fixture_t *fx, const kvp_principal_t *who, int32_t status[2],
                               size_t n_reps[2])
{
    static const char *const keys[2] = {"k1", "k2"};
    Kvpool__MoveStartRequest req = KVPOOL__MOVE_START_REQUEST__INIT;
    req.from_segment_id = fx->a;
    req.keys = svc_keys(keys, 2);
    req.n_keys = 2;
    uint8_t body[256];
    size_t n = protobuf_c_message_get_packed_size(&req.base);
    assert_true(n <= sizeof(body));
    protobuf_c_message_pack(&req.base, body);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    char err[256] = "";
    kvp_status_t s = kvp_dispatch_handle(&fx->st, OWNER, who, KVP_RPC_MOVE_START, body, n, &resp,
                                         &rlen, err, sizeof(err));
    if (s != KVP_OK) {
        assert_null(resp);
        return s;
    }
    Kvpool__MoveStartResponse *r = kvpool__move_start_response__unpack(NULL, rlen, resp);
    free(resp);
    assert_non_null(r);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 2);
    for (size_t i = 0; i < 2; i++) {
        status[i] = r->results[i]->status;
        n_reps[i] = r->results[i]->n_replicas;
    }
    svc_msg_free(r);
    return KVP_OK;
}

static size_t moves_recorded(const kvp_master_state_t *st)
{
    size_t n = 0;
    for (const kvp_move_t *mv = st->moves; mv != NULL; mv = mv->next)
        n++;
    return n;
}

/* k1's grant cannot be sealed: k1 fails alone and leaves nothing; k2 moves. */
static void test_seal_failure_leaves_nothing(void **state)
{
    fixture_t *fx = *state;
    int32_t status[2];
    size_t n_reps[2];
    seal_failures = 1;
    assert_int_equal(move_start(fx, NULL, status, n_reps), KVP_OK);
    assert_int_equal(seal_failures, 0); /* the failure was used */
    assert_int_equal(status[0], KVP_ERR_INTERNAL);
    assert_int_equal(n_reps[0], 0);
    assert_int_equal(status[1], KVP_OK);
    assert_int_equal(n_reps[1], 1);
    assert_int_equal(moves_recorded(&fx->st), 1);
    assert_int_equal(fx->st.moves->key_len, 2);
    assert_memory_equal(fx->st.moves->key, "k2", 2);
    assert_int_equal(used(&fx->st, fx->b), EXT); /* k2's destination only */
    assert_int_equal(used(&fx->st, fx->a), 2 * EXT);
}

/* Every grant fails: nothing recorded, B as empty as before. */
static void test_all_seals_fail(void **state)
{
    fixture_t *fx = *state;
    int32_t status[2];
    size_t n_reps[2];
    seal_failures = 2;
    assert_int_equal(move_start(fx, NULL, status, n_reps), KVP_OK);
    assert_int_equal(status[0], KVP_ERR_INTERNAL);
    assert_int_equal(status[1], KVP_ERR_INTERNAL);
    assert_null(fx->st.moves);
    assert_int_equal(used(&fx->st, fx->b), 0);
    /* and the keys can still be moved */
    assert_int_equal(move_start(fx, NULL, status, n_reps), KVP_OK);
    assert_int_equal(status[0], KVP_OK);
    assert_int_equal(status[1], KVP_OK);
    assert_int_equal(moves_recorded(&fx->st), 2);
    assert_int_equal(used(&fx->st, fx->b), 2 * EXT);
}

/*
 * The answer cannot be built after the loop (B's connection key): a frame-level
 * error, so the owner never learns of the moves: none may stay recorded, no
 * destination allocated, though the connection stays open.
 */
static void test_no_answer_leaves_nothing(void **state)
{
    fixture_t *fx = *state;
    kvp_principal_t who = {
        .name = "owner", .tenant = "default", .roles = KVP_ROLE_ADMIN, .tag = 0x70776e6572};
    int32_t status[2];
    size_t n_reps[2];
    conn_key_failures = 1;
    assert_int_equal(move_start(fx, &who, status, n_reps), KVP_ERR_NOMEM);
    assert_int_equal(conn_key_failures, 0);
    assert_null(fx->st.moves);
    assert_int_equal(used(&fx->st, fx->b), 0);
    assert_int_equal(used(&fx->st, fx->a), 2 * EXT);
    /* the retry works, from the same connection */
    assert_int_equal(move_start(fx, &who, status, n_reps), KVP_OK);
    assert_int_equal(status[0], KVP_OK);
    assert_int_equal(n_reps[0], 1);
    assert_int_equal(moves_recorded(&fx->st), 2);
    assert_int_equal(used(&fx->st, fx->b), 2 * EXT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_seal_failure_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_seals_fail, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_answer_leaves_nothing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
