/*
 * test_object_calls.c - unit tests for master/rpc/object_calls.c: the object calls
 * (PutStart, PutEnd, PutRevoke, Remove, Exist, GetReplicaList, GetSize) and
 * what every call gets: batch limits, mismatched arrays, bad keys, and the
 * frame-level errors of the dispatch path (undecodable body, unknown method).
 *
 * Drives kvp_dispatch_handle the way the server does (fixture_store.h): a
 * packed protobuf-c request body in, a packed response out, from connections
 * 1 and 2 (and 3 where a third party is needed). Every answer is unpacked and
 * checked as a client would check it; STAT is the independent view of the
 * accounting.
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
#include "master/rpc/object_calls.h"
#include "master/core/state.h"
#include "tests/unit/master/rpc/fixture_store.h"
#include "tests/unit/master/svc_call.h"

/* ---- put life cycle ---- */

static void test_put_lifecycle(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t seg_id;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 1 << 20, &seg_id), KVP_OK);

    /* PutStart: PENDING, holding space, invisible to readers */
    const char *k = "obj/1";
    uint64_t sz = 5000;
    Kvpool__PutStartResponse *ps = put_start(st, C1, &k, 1, &sz, 1, 1, NULL);
    assert_int_equal(ps->status, KVP_OK);
    assert_int_equal(ps->n_results, 1);
    assert_int_equal(ps->results[0]->status, KVP_OK);
    assert_int_equal(ps->results[0]->n_replicas, 1);
    Kvpool__Replica rep = *ps->results[0]->replicas[0];
    assert_true(rep.segment_id == seg_id);
    assert_int_equal(rep.length, 5000);
    assert_true(rep.offset + rep.length <= (1 << 20));
    /* the response describes the segment the replica is on */
    assert_int_equal(ps->n_segments, 1);
    assert_true(ps->segments[0]->id == seg_id);
    assert_string_equal(ps->segments[0]->name, "seg-a");
    assert_string_equal(ps->segments[0]->tcp_endpoint, "10.0.0.1:7000");
    assert_string_equal(ps->segments[0]->host_id, "host1");
    svc_msg_free(ps);

    assert_int_equal(exist1(st, k), 0);
    assert_int_equal(replicas1_status(st, k), KVP_ERR_NOT_FOUND);
    assert_int_equal(size1(st, k), KVP_ERR_NOT_FOUND);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.pending, 1);
    assert_int_equal(s.objects, 0);
    assert_true(s.used >= 5000);

    /* duplicate PutStart of a pending key, from either connection */
    assert_int_equal(put1(st, C1, k, 10, NULL), KVP_ERR_PENDING);
    assert_int_equal(put1(st, C2, k, 10, NULL), KVP_ERR_PENDING);
    /* REMOVE of a pending key is refused */
    assert_int_equal(keys1(st, C1, KVP_RPC_REMOVE, k), KVP_ERR_PENDING);
    assert_int_equal(stat_get(st).pending, 1);

    /* PutEnd from a connection that did not start it */
    assert_int_equal(end1(st, C2, k, 0x1234), KVP_ERR_NOT_OWNER);
    assert_int_equal(exist1(st, k), 0);
    assert_int_equal(stat_get(st).pending, 1);

    /* PutEnd from the writer: visible, with its CRC */
    assert_int_equal(end1(st, C1, k, 0xCAFEBABE), KVP_OK);
    assert_int_equal(exist1(st, k), 1);
    assert_int_equal(size1(st, k), 5000);
    Kvpool__GetReplicaListResponse *gr = replicas(st, &k, 1);
    assert_int_equal(gr->status, KVP_OK);
    assert_int_equal(gr->n_results, 1);
    assert_int_equal(gr->results[0]->status, KVP_OK);
    assert_int_equal(gr->results[0]->size, 5000);
    assert_int_equal(gr->results[0]->crc32c, 0xCAFEBABE);
    assert_int_equal(gr->results[0]->n_replicas, 1);
    assert_true(gr->results[0]->replicas[0]->segment_id == seg_id);
    assert_true(gr->results[0]->replicas[0]->offset == rep.offset);
    assert_int_equal(gr->results[0]->replicas[0]->length, 5000);
    assert_int_equal(gr->n_segments, 1);
    assert_true(gr->segments[0]->id == seg_id);
    assert_string_equal(gr->segments[0]->shm_path, "/dev/shm/kvp-seg");
    /* what an rdma peer needs comes back as mounted */
    assert_string_equal(gr->segments[0]->rdma_endpoint, "169.254.77.1:7001");
    assert_true(gr->segments[0]->rdma_addr == 0x7f0000001000ull + C1);
    assert_int_equal(gr->segments[0]->rdma_rkey, 0x1234u + C1);
    svc_msg_free(gr);
    s = stat_get(st);
    assert_int_equal(s.pending, 0);
    assert_int_equal(s.objects, 1);
    assert_int_equal(s.seg_objects_sum, 1);

    /* PutEnd again: no longer pending; revoke too */
    assert_int_equal(end1(st, C1, k, 1), KVP_ERR_NOT_PENDING);
    assert_int_equal(keys1(st, C1, KVP_RPC_PUT_REVOKE, k), KVP_ERR_NOT_PENDING);
    /* duplicate PutStart of a complete key */
    assert_int_equal(put1(st, C2, k, 10, NULL), KVP_ERR_EXISTS);
    assert_int_equal(put1(st, C1, k, 5000, NULL), KVP_ERR_EXISTS);
    /* PutEnd/revoke/remove of keys never put */
    assert_int_equal(end1(st, C1, "nope", 1), KVP_ERR_NOT_FOUND);
    assert_int_equal(keys1(st, C1, KVP_RPC_PUT_REVOKE, "nope"), KVP_ERR_NOT_FOUND);
    assert_int_equal(keys1(st, C1, KVP_RPC_REMOVE, "nope"), KVP_ERR_NOT_FOUND);
    /* size 0 is not an object */
    assert_int_equal(put1(st, C1, "zero", 0, NULL), KVP_ERR_INVALID_ARG);

    /* REMOVE of a complete key, by anyone: gone, space back */
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, k), KVP_OK);
    assert_int_equal(exist1(st, k), 0);
    assert_int_equal(replicas1_status(st, k), KVP_ERR_NOT_FOUND);
    assert_int_equal(keys1(st, C2, KVP_RPC_REMOVE, k), KVP_ERR_NOT_FOUND);
    s = stat_get(st);
    assert_int_equal(s.used, 0);
    assert_int_equal(s.objects, 0);
    assert_int_equal(s.seg_objects_sum, 0);
    /* and the key can be written again */
    assert_int_equal(put1(st, C2, k, 100, NULL), KVP_OK);
    assert_int_equal(end1(st, C2, k, 7), KVP_OK);
    assert_int_equal(size1(st, k), 100);
}

static void test_batch(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 1 << 20, NULL), KVP_OK);
    assert_int_equal(put1(st, C1, "done", 64, NULL), KVP_OK);
    assert_int_equal(end1(st, C1, "done", 0), KVP_OK);
    assert_int_equal(put1(st, C2, "pend", 64, NULL), KVP_OK);

    /* per-key results in request order; the same key twice in one batch */
    const char *keys[] = {"new1", "done", "pend", "new2", "new1"};
    const uint64_t sizes[] = {100, 100, 100, 200, 100};
    Kvpool__PutStartResponse *ps = put_start(st, C1, keys, 5, sizes, 5, 1, NULL);
    assert_int_equal(ps->status, KVP_OK);
    assert_int_equal(ps->n_results, 5);
    static const int32_t want[] = {KVP_OK, KVP_ERR_EXISTS, KVP_ERR_PENDING, KVP_OK,
                                   KVP_ERR_PENDING};
    for (int i = 0; i < 5; i++)
        assert_int_equal(ps->results[i]->status, want[i]);
    assert_int_equal(ps->results[0]->replicas[0]->length, 100);
    assert_int_equal(ps->results[3]->replicas[0]->length, 200);
    svc_msg_free(ps);

    const char *end_keys[] = {"new1", "new2", "pend", "done"};
    const uint32_t crcs[] = {11, 22, 33, 44};
    Kvpool__StatusesResponse *r = put_end(st, C1, end_keys, 4, crcs, 4);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 4);
    assert_int_equal(r->statuses[0], KVP_OK);
    assert_int_equal(r->statuses[1], KVP_OK);
    assert_int_equal(r->statuses[2], KVP_ERR_NOT_OWNER);
    assert_int_equal(r->statuses[3], KVP_ERR_NOT_PENDING);
    svc_msg_free(r);

    /* crc of each key is its own */
    const char *q[] = {"new2", "missing", "new1"};
    Kvpool__GetReplicaListResponse *gr = replicas(st, q, 3);
    assert_int_equal(gr->n_results, 3);
    assert_int_equal(gr->results[0]->status, KVP_OK);
    assert_int_equal(gr->results[0]->crc32c, 22);
    assert_int_equal(gr->results[0]->size, 200);
    assert_int_equal(gr->results[1]->status, KVP_ERR_NOT_FOUND);
    assert_int_equal(gr->results[2]->status, KVP_OK);
    assert_int_equal(gr->results[2]->crc32c, 11);
    assert_int_equal(gr->results[2]->size, 100);
    svc_msg_free(gr);

    /* EXIST for several keys */
    Kvpool__KeysRequest kr = KVPOOL__KEYS_REQUEST__INIT;
    const char *ek[] = {"done", "pend", "missing", "new1"};
    kr.keys = svc_keys(ek, 4);
    kr.n_keys = 4;
    Kvpool__StatusesResponse *er =
        svc_call(st, C3, KVP_RPC_EXIST, &kr.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(er->n_statuses, 4);
    assert_int_equal(er->statuses[0], 1);
    assert_int_equal(er->statuses[1], 0);
    assert_int_equal(er->statuses[2], 0);
    assert_int_equal(er->statuses[3], 1);
    svc_msg_free(er);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, 3);
    assert_int_equal(s.pending, 1);
    assert_int_equal(s.seg_objects_sum, 4);
}

static void test_put_revoke(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 1 << 20, NULL), KVP_OK);
    assert_int_equal(put1(st, C1, "r", 300000, NULL), KVP_OK);
    stat_snap_t s = stat_get(st);
    assert_true(s.used >= 300000);
    assert_int_equal(s.pending, 1);

    assert_int_equal(keys1(st, C2, KVP_RPC_PUT_REVOKE, "r"), KVP_ERR_NOT_OWNER);
    assert_int_equal(stat_get(st).pending, 1);
    assert_int_equal(keys1(st, C1, KVP_RPC_PUT_REVOKE, "r"), KVP_OK);
    s = stat_get(st);
    assert_int_equal(s.used, 0);
    assert_int_equal(s.pending, 0);
    assert_int_equal(s.objects, 0);
    assert_int_equal(s.seg_objects_sum, 0);
    assert_int_equal(exist1(st, "r"), 0);
    assert_int_equal(keys1(st, C1, KVP_RPC_PUT_REVOKE, "r"), KVP_ERR_NOT_FOUND);
    assert_int_equal(end1(st, C1, "r", 0), KVP_ERR_NOT_FOUND);
    /* the key and its space are free for another writer */
    assert_int_equal(put1(st, C2, "r", 1 << 20, NULL), KVP_OK);
    assert_int_equal(end1(st, C2, "r", 0), KVP_OK);
    assert_int_equal(stat_get(st).used, 1 << 20);
}

static void test_conn_closed_revokes_pending(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C3, "seg-a", "host1", 1 << 20, NULL), KVP_OK);
    const char *mine[] = {"w1/a", "w1/b", "w1/c"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(put1(st, C1, mine[i], 1000, NULL), KVP_OK);
    assert_int_equal(put1(st, C1, "w1/done", 1000, NULL), KVP_OK);
    assert_int_equal(end1(st, C1, "w1/done", 5), KVP_OK);
    assert_int_equal(put1(st, C2, "w2/a", 2000, NULL), KVP_OK);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.pending, 4);
    assert_int_equal(s.objects, 1);

    kvp_dispatch_conn_closed(st, C1);
    s = stat_get(st);
    /* C1's unfinished puts are gone, its finished one and C2's pending one stay */
    assert_int_equal(s.pending, 1);
    assert_int_equal(s.objects, 1);
    assert_int_equal(s.seg_objects_sum, 2);
    assert_int_equal(s.n_segments, 1); /* C1 owned no segment */
    assert_int_equal(s.used, 1024 + 2048);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(exist1(st, mine[i]), 0);
        /* the keys are free again */
        assert_int_equal(put1(st, C2, mine[i], 64, NULL), KVP_OK);
    }
    assert_int_equal(exist1(st, "w1/done"), 1);
    assert_int_equal(end1(st, C2, "w2/a", 9), KVP_OK);
    assert_int_equal(exist1(st, "w2/a"), 1);
    /* closing a connection with nothing is harmless */
    kvp_dispatch_conn_closed(st, 77);
    assert_int_equal(stat_get(st).pending, 3);
}

/* n puts of 64 bytes from conn, keys "<prefix>/<i>", at the master's time now_ms */
static void put_many(kvp_master_state_t *st, uint64_t conn, const char *prefix, size_t n,
                     uint64_t now_ms)
{
    char(*names)[32] = calloc(n, sizeof(*names));
    const char **keys = calloc(n, sizeof(*keys));
    uint64_t *sizes = calloc(n, sizeof(*sizes));
    assert_non_null(names);
    assert_non_null(keys);
    assert_non_null(sizes);
    for (size_t i = 0; i < n; i++) {
        snprintf(names[i], sizeof(names[i]), "%s/%zu", prefix, i);
        keys[i] = names[i];
        sizes[i] = 64;
    }
    st->now_ms = now_ms;
    Kvpool__PutStartResponse *ps = put_start(st, conn, keys, n, sizes, n, 1, NULL);
    assert_int_equal(ps->status, KVP_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ps->results[i]->status, KVP_OK);
    svc_msg_free(ps);
    free(names);
    free(keys);
    free(sizes);
}

/* With more puts pending than one turn walks, a close revokes its puts over loop turns,
 * a slice each (kvp_object_sweep), not in one walk of every tenant's; the pass keeps its
 * place when the object it stands on goes (here: timed out), and a connection closed
 * during a pass is swept by the next. */
static void test_conn_closed_sweeps_over_turns(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C3, "seg-a", "host1", 64 << 20, NULL), KVP_OK);
    uint64_t t0 = 1000000, timeout = st->config.put_timeout_ms;
    put_many(st, C2, "c2-early", 4096, t0);
    put_many(st, C1, "c1", 5000, t0 + 1);
    put_many(st, C2, "c2-late", 1000, t0 + 2);
    kvp_dispatch_conn_closed(st, C1);
    assert_true(kvp_object_sweeping(st));
    assert_int_equal(stat_get(st).pending, 10096); /* nothing walked yet */
    kvp_object_sweep(st);                          /* the first 4096: C2's early puts */
    assert_int_equal(stat_get(st).pending, 10096);
    /* the pass stands on C1's first put; every put to its deadline but C2's late ones
     * times out (a walk from the head, ended at the first in time) */
    st->now_ms = t0 + 1 + timeout;
    assert_int_equal(kvp_expire_puts(st), 4096 + 5000);
    assert_int_equal(stat_get(st).pending, 1000);
    put_many(st, C1 + 10, "c11", 5000, t0 + 3);
    kvp_dispatch_conn_closed(st, C1 + 10);
    unsigned turns = 0;
    while (kvp_object_sweeping(st) && turns < 10) {
        kvp_object_sweep(st);
        turns++;
    }
    assert_false(kvp_object_sweeping(st));
    assert_in_range(turns, 2, 4); /* the rest of this pass (6 000 visits), then C11's */
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.pending, 1000); /* C2's late puts, untouched */
    assert_int_equal(s.used, 1000 * 64);
    assert_int_equal(exist1(st, "c11/0"), 0);
    assert_int_equal(put1(st, C2, "c11/0", 64, NULL), KVP_OK); /* the key is free again */
    assert_int_equal(end1(st, C2, "c2-late/999", 7), KVP_OK);
    assert_int_equal(exist1(st, "c2-late/999"), 1);
}

/* ---- PutStart and GetReplicaList over loop turns ---- */

#define BIG 65536u

/* The server's turns for one request: handled with the leave to go on (may_continue), and
 * again at the "next turn" while the handler says so (call_again), between() run between
 * turns (NULL: nothing; false: the connection closed, so no more turns); *turns_p: how
 * many. NULL when it was never answered. */
static void *over_turns(kvp_master_state_t *st, uint64_t conn, uint16_t method,
                        const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                        bool (*between)(kvp_master_state_t *st, unsigned turn), unsigned *turns_p)
{
    size_t n = protobuf_c_message_get_packed_size(req);
    uint8_t *body = malloc(n);
    assert_non_null(body);
    assert_int_equal(protobuf_c_message_pack(req, body), n);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    bool again = false;
    unsigned turns = 0;
    for (;;) {
        char err[256] = "";
        st->may_continue = true;
        st->call_again = again;
        assert_int_equal(
            kvp_dispatch_handle(st, conn, NULL, method, body, n, &resp, &rlen, err, sizeof(err)),
            KVP_OK);
        st->may_continue = false;
        again = st->call_again;
        st->call_again = false;
        turns++;
        if (!again)
            break;
        assert_null(resp);
        if (between != NULL && !between(st, turns))
            break;
    }
    free(body);
    *turns_p = turns;
    if (resp == NULL)
        return NULL;
    ProtobufCMessage *m = protobuf_c_message_unpack(resp_desc, NULL, rlen, resp);
    free(resp);
    assert_non_null(m);
    return m;
}

static char (*big_names)[24];
static const char **big_keys;
static uint64_t *big_sizes;

static void big_keys_make(const char *prefix)
{
    big_names = calloc(BIG, sizeof(*big_names));
    big_keys = calloc(BIG, sizeof(*big_keys));
    big_sizes = calloc(BIG, sizeof(*big_sizes));
    assert_true(big_names != NULL && big_keys != NULL && big_sizes != NULL);
    for (size_t i = 0; i < BIG; i++) {
        snprintf(big_names[i], sizeof(big_names[i]), "%s/%zu", prefix, i);
        big_keys[i] = big_names[i];
        big_sizes[i] = 64 + i % 7;
    }
}

static void big_keys_free(void)
{
    free(big_names);
    free(big_keys);
    free(big_sizes);
}

/* Between turns another connection's calls are answered: a put and a read of its own. */
static bool others_served(kvp_master_state_t *st, unsigned turn)
{
    static unsigned calls;
    char key[32];
    snprintf(key, sizeof(key), "c2/%u", calls++);
    (void)turn;
    assert_int_equal(put1(st, C2, key, 100, NULL), KVP_OK);
    assert_int_equal(end1(st, C2, key, turn), KVP_OK);
    assert_int_equal(exist1(st, key), 1);
    return true;
}

static uint64_t seg_b;

/* After the first turn, seg-b's owner unmounts it. */
static bool seg_b_leaves(kvp_master_state_t *st, unsigned turn)
{
    if (turn == 1) {
        Kvpool__UnmountRequest ur = KVPOOL__UNMOUNT_REQUEST__INIT;
        ur.segment_id = seg_b;
        Kvpool__UnmountResponse *um =
            svc_call(st, 4, KVP_RPC_UNMOUNT, &ur.base, &kvpool__unmount_response__descriptor);
        assert_int_equal(um->status, KVP_OK);
        svc_msg_free(um);
    }
    return true;
}

/* After the first turn, the caller's connection closes. */
static bool c1_closes(kvp_master_state_t *st, unsigned turn)
{
    (void)turn;
    assert_true(st->leases.live > 0); /* the first turn's, granted */
    kvp_dispatch_conn_closed(st, C1);
    return false;
}

/* PutStart of the BIG keys of big_keys_make, one replica each, over turns. */
static Kvpool__PutStartResponse *
big_put(kvp_master_state_t *st, bool (*between)(kvp_master_state_t *, unsigned), unsigned *turns_p)
{
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    cfg.replica_num = 1;
    req.keys = svc_keys(big_keys, BIG);
    req.n_keys = req.n_sizes = BIG;
    req.sizes = big_sizes;
    req.config = &cfg;
    return over_turns(st, C1, KVP_RPC_PUT_START, &req.base, &kvpool__put_start_response__descriptor,
                      between, turns_p);
}

static Kvpool__GetReplicaListResponse *
big_read(kvp_master_state_t *st, bool (*between)(kvp_master_state_t *, unsigned), unsigned *turns_p)
{
    Kvpool__KeysRequest kr = KVPOOL__KEYS_REQUEST__INIT;
    kr.keys = svc_keys(big_keys, BIG);
    kr.n_keys = BIG;
    return over_turns(st, C1, KVP_RPC_GET_REPLICA_LIST, &kr.base,
                      &kvpool__get_replica_list_response__descriptor, between, turns_p);
}

/* A PutStart and a GetReplicaList of 65536 keys each go on over loop turns (4 ms of work a
 * turn), other connections served between them, and answer every key as one call would:
 * each put's replica of its size, each read's size and replica; counted by method. */
static void test_big_batches_over_turns(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C3, "seg-a", "host1", 64 << 20, NULL), KVP_OK);
    big_keys_make("big");
    unsigned turns;
    Kvpool__PutStartResponse *ps = big_put(st, others_served, &turns);
    assert_non_null(ps);
    assert_true(turns > 1);
    assert_int_equal(st->stats.keys_continued[KVP_RPC_PUT_START], turns - 1);
    assert_int_equal(ps->status, KVP_OK);
    assert_int_equal(ps->n_results, BIG);
    assert_int_equal(ps->n_segments, 1);
    for (size_t i = 0; i < BIG; i++) {
        assert_int_equal(ps->results[i]->status, KVP_OK);
        assert_int_equal(ps->results[i]->n_replicas, 1);
        assert_int_equal(ps->results[i]->replicas[0]->length, big_sizes[i]);
        assert_int_equal(ps->results[i]->replicas[0]->segment_id, ps->segments[0]->id);
    }
    svc_msg_free(ps);
    assert_int_equal(stat_get(st).pending, BIG);
    uint32_t *crcs = calloc(BIG, sizeof(*crcs));
    assert_non_null(crcs);
    svc_msg_free(put_end(st, C1, big_keys, BIG, crcs, BIG));
    free(crcs);
    assert_int_equal(stat_get(st).pending, 0);

    Kvpool__GetReplicaListResponse *gr = big_read(st, others_served, &turns);
    assert_non_null(gr);
    assert_true(turns > 1);
    assert_int_equal(st->stats.keys_continued[KVP_RPC_GET_REPLICA_LIST], turns - 1);
    assert_int_equal(gr->n_results, BIG);
    for (size_t i = 0; i < BIG; i++) {
        assert_int_equal(gr->results[i]->status, KVP_OK);
        assert_int_equal(gr->results[i]->size, big_sizes[i]);
        assert_int_equal(gr->results[i]->n_replicas, 1);
    }
    svc_msg_free(gr);

    /* a GetSize of them all, its last key one never stored: first key first over the turns,
     * every size as put */
    const char *last = big_keys[BIG - 1];
    big_keys[BIG - 1] = "big-never-stored";
    Kvpool__KeysRequest gs = KVPOOL__KEYS_REQUEST__INIT;
    gs.keys = svc_keys(big_keys, BIG);
    gs.n_keys = BIG;
    st->keys_turn_ns = 200000; /* a GetSize key is cheap: turns of 0.2 ms, so it spans several */
    Kvpool__GetSizeResponse *sz =
        over_turns(st, C1, KVP_RPC_GET_SIZE, &gs.base, &kvpool__get_size_response__descriptor,
                   others_served, &turns);
    st->keys_turn_ns = 0;
    big_keys[BIG - 1] = last;
    assert_non_null(sz);
    assert_true(turns > 1);
    assert_int_equal(st->stats.keys_continued[KVP_RPC_GET_SIZE], turns - 1);
    assert_int_equal(sz->n_sizes, BIG);
    for (size_t i = 0; i < BIG - 1; i++)
        assert_int_equal(sz->sizes[i], big_sizes[i]);
    assert_int_equal(sz->sizes[BIG - 1], KVP_ERR_NOT_FOUND);
    svc_msg_free(sz);

    /* and a ReplicaClear of them all (the whole objects: no segment named) */
    Kvpool__ReplicaClearRequest rc = KVPOOL__REPLICA_CLEAR_REQUEST__INIT;
    rc.keys = svc_keys(big_keys, BIG);
    rc.n_keys = BIG;
    rc.segment = "";
    Kvpool__StatusesResponse *cr =
        over_turns(st, C1, KVP_RPC_REPLICA_CLEAR, &rc.base, &kvpool__statuses_response__descriptor,
                   others_served, &turns);
    assert_non_null(cr);
    assert_true(turns > 1);
    assert_int_equal(st->stats.keys_continued[KVP_RPC_REPLICA_CLEAR], turns - 1);
    assert_int_equal(cr->n_statuses, BIG);
    for (size_t i = 0; i < BIG; i++)
        assert_int_equal(cr->statuses[i], KVP_OK);
    svc_msg_free(cr);
    assert_int_equal(exist1(st, big_keys[0]), 0);
    assert_int_equal(exist1(st, big_keys[BIG - 1]), 0);

    /* stored again, then a Remove naming the first key again in the last place: first key
     * first over every turn, so its first place removes it and its second is not found */
    ps = big_put(st, NULL, &turns);
    assert_int_equal(ps->status, KVP_OK);
    svc_msg_free(ps);
    crcs = calloc(BIG, sizeof(*crcs));
    assert_non_null(crcs);
    svc_msg_free(put_end(st, C1, big_keys, BIG, crcs, BIG));
    free(crcs);
    const char *kept = big_keys[BIG - 1];
    big_keys[BIG - 1] = big_keys[0];
    Kvpool__KeysRequest rr = KVPOOL__KEYS_REQUEST__INIT;
    rr.keys = svc_keys(big_keys, BIG);
    rr.n_keys = BIG;
    cr = over_turns(st, C1, KVP_RPC_REMOVE, &rr.base, &kvpool__statuses_response__descriptor,
                    others_served, &turns);
    assert_non_null(cr);
    assert_true(turns > 1);
    assert_int_equal(st->stats.keys_continued[KVP_RPC_REMOVE], turns - 1);
    assert_int_equal(cr->n_statuses, BIG);
    for (size_t i = 0; i < BIG - 1; i++)
        assert_int_equal(cr->statuses[i], KVP_OK);
    assert_int_equal(cr->statuses[BIG - 1], KVP_ERR_NOT_FOUND);
    svc_msg_free(cr);
    assert_int_equal(exist1(st, big_keys[0]), 0);
    assert_int_equal(exist1(st, kept), 1); /* never named */
    big_keys[BIG - 1] = kept;
    big_keys_free();
}

/* A segment that leaves while a PutStart is under way ends it: answered
 * KVP_ERR_SEGMENT_GONE with no result, every object it had made undone (on the segment
 * that stays too), the pool's room whole; a GetReplicaList whose connection closes
 * between turns is never answered, and the read leases it granted go with it. */
static void test_big_batches_ended(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C3, "seg-a", "host1", 64 << 20, NULL), KVP_OK);
    assert_int_equal(mount_seg(st, 4, "seg-b", "host2", 64 << 20, &seg_b), KVP_OK);
    big_keys_make("gone");
    unsigned turns;
    Kvpool__PutStartResponse *ps = big_put(st, seg_b_leaves, &turns);
    assert_non_null(ps);
    assert_int_equal(turns, 2);
    assert_int_equal(ps->status, KVP_ERR_SEGMENT_GONE);
    assert_int_equal(ps->n_results, 0);
    assert_non_null(strstr(ps->message, "a segment left"));
    svc_msg_free(ps);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.pending, 0);
    assert_int_equal(s.used, 0);
    assert_int_equal(s.n_segments, 1);
    assert_int_equal(exist1(st, big_keys[0]), 0);
    assert_int_equal(put1(st, C2, big_keys[0], 64, NULL), KVP_OK); /* the key is free */

    /* reads with leases: the other 65535 keys stored (a read of them all takes turns on
     * any machine), then a read of all 65536 closed after its first turn */
    st->config.lease_ttl_ms = 60000;
    const char **last = big_keys + 1;
    svc_msg_free(put_start(st, C2, last, BIG - 1, big_sizes + 1, BIG - 1, 1, NULL));
    uint32_t *crcs = calloc(BIG, sizeof(*crcs));
    assert_non_null(crcs);
    svc_msg_free(put_end(st, C2, last, BIG - 1, crcs, BIG - 1));
    free(crcs);
    assert_int_equal(st->leases.live, 0);
    assert_null(big_read(st, c1_closes, &turns));
    assert_int_equal(turns, 1);
    assert_int_equal(st->leases.live, 0); /* every lease it granted released */
    assert_int_equal(exist1(st, last[0]), 1);
    big_keys_free();
}

static void test_preferred_segment(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t seg_a, seg_b;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 64 << 20, &seg_a), KVP_OK);
    assert_int_equal(mount_seg(st, C2, "seg-b", "host2", 64 * 1024, &seg_b), KVP_OK);
    for (int i = 0; i < 8; i++) {
        char key[16];
        snprintf(key, sizeof(key), "p%d", i);
        const char *kp = key;
        uint64_t sz = 4096;
        Kvpool__PutStartResponse *ps = put_start(st, C2, &kp, 1, &sz, 1, 1, "seg-b");
        assert_int_equal(ps->results[0]->status, KVP_OK);
        assert_true(ps->results[0]->replicas[0]->segment_id == seg_b);
        svc_msg_free(ps);
    }
    /* an unknown preferred name is ignored, not an error */
    const char *kp = "q";
    uint64_t sz = 64;
    Kvpool__PutStartResponse *ps = put_start(st, C2, &kp, 1, &sz, 1, 1, "no-such-seg");
    assert_int_equal(ps->results[0]->status, KVP_OK);
    svc_msg_free(ps);
}

static void test_pool_full(void **state)
{
    kvp_master_state_t *st = *state;
    /* no segment at all */
    assert_int_equal(put1(st, C1, "k", 64, NULL), KVP_ERR_NO_SEGMENT);
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 64 * 1024, NULL), KVP_OK);
    assert_int_equal(put1(st, C1, "huge", 64 * 1024 + 1, NULL), KVP_ERR_TOO_LARGE);

    /* a batch: the first two fill the segment, the third does not fit */
    const char *keys[] = {"a", "b", "c"};
    const uint64_t sizes[] = {32 * 1024, 32 * 1024, 4096};
    Kvpool__PutStartResponse *ps = put_start(st, C1, keys, 3, sizes, 3, 1, NULL);
    assert_int_equal(ps->status, KVP_OK);
    assert_int_equal(ps->results[0]->status, KVP_OK);
    assert_int_equal(ps->results[1]->status, KVP_OK);
    assert_int_equal(ps->results[2]->status, KVP_ERR_POOL_FULL);
    assert_int_equal(ps->results[2]->n_replicas, 0);
    svc_msg_free(ps);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.pending, 2); /* the refused key left nothing behind */
    assert_int_equal(s.used, 64 * 1024);
    assert_int_equal(exist1(st, "c"), 0);
    assert_int_equal(end1(st, C1, "c", 0), KVP_ERR_NOT_FOUND);

    const uint32_t crcs[] = {0, 0};
    Kvpool__StatusesResponse *r = put_end(st, C1, keys, 2, crcs, 2);
    assert_int_equal(r->statuses[0], KVP_OK);
    assert_int_equal(r->statuses[1], KVP_OK);
    svc_msg_free(r);
    assert_int_equal(put1(st, C2, "d", 64, NULL), KVP_ERR_POOL_FULL);
    s = stat_get(st);
    assert_int_equal(s.pending, 0);
    assert_int_equal(s.objects, 2);
    /* a key refused for space can be put once there is room */
    assert_int_equal(keys1(st, C1, KVP_RPC_REMOVE, "a"), KVP_OK);
    assert_int_equal(put1(st, C2, "d", 64, NULL), KVP_OK);
}

static void test_mismatched_arrays(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 1 << 20, NULL), KVP_OK);
    const char *keys[] = {"m1", "m2"};
    const uint64_t sizes[] = {100, 100, 100};
    /* fewer sizes than keys, and more */
    for (size_t ns = 1; ns <= 3; ns += 2) {
        Kvpool__PutStartResponse *ps = put_start(st, C1, keys, 2, sizes, ns, 1, NULL);
        assert_int_equal(ps->status, KVP_ERR_INVALID_ARG);
        assert_int_equal(ps->n_results, 0);
        svc_msg_free(ps);
    }
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.pending, 0);
    assert_int_equal(s.used, 0);

    /* PutEnd with a crc array of the wrong length: nothing is completed */
    Kvpool__PutStartResponse *ps = put_start(st, C1, keys, 2, sizes, 2, 1, NULL);
    assert_int_equal(ps->status, KVP_OK);
    svc_msg_free(ps);
    const uint32_t crcs[] = {1, 2, 3};
    for (size_t nc = 1; nc <= 3; nc += 2) {
        Kvpool__StatusesResponse *r = put_end(st, C1, keys, 2, crcs, nc);
        assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
        assert_int_equal(r->n_statuses, 0);
        svc_msg_free(r);
    }
    assert_int_equal(stat_get(st).pending, 2);
    assert_int_equal(exist1(st, "m1"), 0);
}

static void test_too_many_keys(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 1 << 20, NULL), KVP_OK);
    enum { N = 65537 };
    const char **keys = calloc(N, sizeof(*keys));
    uint64_t *sizes = calloc(N, sizeof(*sizes));
    assert_non_null(keys);
    assert_non_null(sizes);
    for (int i = 0; i < N; i++) {
        keys[i] = "same";
        sizes[i] = 64;
    }
    Kvpool__PutStartResponse *ps = put_start(st, C1, keys, N, sizes, N, 1, NULL);
    assert_int_equal(ps->status, KVP_ERR_TOO_MANY);
    assert_int_equal(ps->n_results, 0);
    svc_msg_free(ps);
    Kvpool__KeysRequest kr = KVPOOL__KEYS_REQUEST__INIT;
    kr.keys = svc_keys(keys, N);
    kr.n_keys = N;
    Kvpool__StatusesResponse *er =
        svc_call(st, C3, KVP_RPC_EXIST, &kr.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(er->status, KVP_ERR_TOO_MANY);
    assert_int_equal(er->n_statuses, 0);
    svc_msg_free(er);
    assert_int_equal(stat_get(st).pending, 0);
    /* 65536 is still allowed */
    er = NULL;
    kr.n_keys = N - 1;
    er = svc_call(st, C3, KVP_RPC_EXIST, &kr.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(er->status, KVP_OK);
    assert_int_equal(er->n_statuses, N - 1);
    svc_msg_free(er);
    free(keys);
    free(sizes);
}

static void test_undecodable_body(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 1 << 20, NULL), KVP_OK);
    /* field 1, wire type 2, with a length running past the end of the buffer */
    static const uint8_t junk[] = {0x0A, 0x7F, 'a', 'b'};
    static const uint16_t methods[] = {
        KVP_RPC_MOUNT,      KVP_RPC_UNMOUNT, KVP_RPC_PUT_START,        KVP_RPC_PUT_END,
        KVP_RPC_PUT_REVOKE, KVP_RPC_EXIST,   KVP_RPC_GET_REPLICA_LIST, KVP_RPC_REMOVE,
        KVP_RPC_GET_SIZE,
    };
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        uint8_t *resp = NULL;
        size_t rlen = 0;
        char err[256] = "";
        kvp_status_t s =
            handle_raw(st, C1, methods[i], junk, sizeof(junk), &resp, &rlen, err, sizeof(err));
        if (s != KVP_ERR_PROTOCOL)
            fail_msg("method %u: undecodable body gave %d, want KVP_ERR_PROTOCOL", methods[i], s);
        assert_null(resp);
        assert_true(strlen(err) > 0);
    }

    /* a valid PutStart cut short by one byte */
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    const char *k = "truncated-key";
    uint64_t sz = 64;
    req.keys = svc_keys(&k, 1);
    req.n_keys = 1;
    req.sizes = &sz;
    req.n_sizes = 1;
    size_t n = kvpool__put_start_request__get_packed_size(&req);
    uint8_t *body = malloc(n);
    assert_non_null(body);
    kvpool__put_start_request__pack(&req, body);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    char err[256] = "";
    kvp_status_t s =
        handle_raw(st, C1, KVP_RPC_PUT_START, body, n - 1, &resp, &rlen, err, sizeof(err));
    free(body);
    assert_int_equal(s, KVP_ERR_PROTOCOL);
    assert_null(resp);
    /* and nothing was created */
    assert_int_equal(stat_get(st).pending, 0);
}

static void test_unknown_method(void **state)
{
    kvp_master_state_t *st = *state;
    static const uint16_t methods[] = {0, KVP_RPC_METHOD_MAX + 1, 99,
                                       KVP_RPC_PING | KVP_RPC_RESPONSE_BIT, 0xFFFF};
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        uint8_t *resp = (uint8_t *)"x";
        size_t rlen = 3;
        char err[256] = "";
        kvp_status_t s = handle_raw(st, C1, methods[i], NULL, 0, &resp, &rlen, err, sizeof(err));
        assert_int_equal(s, KVP_ERR_UNKNOWN_METHOD);
        assert_null(resp);
        assert_int_equal(rlen, 0);
        assert_true(strlen(err) > 0);
    }
}

static void test_bad_keys(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 1 << 20, NULL), KVP_OK);
    char *k4096 = malloc(4098);
    assert_non_null(k4096);
    memset(k4096, 'k', 4097);
    k4096[4096] = '\0';
    char *k4097 = malloc(4098);
    assert_non_null(k4097);
    memset(k4097, 'k', 4097);
    k4097[4097] = '\0';

    /* invalid UTF-8, overlong, surrogate, empty, too long; plus good neighbours */
    const char *keys[] = {"good", "bad\xC3(", "\xC0\xAF", "\xED\xA0\x80",
                          "",     k4097,      k4096,      "caf\xC3\xA9"};
    const uint64_t sizes[] = {64, 64, 64, 64, 64, 64, 64, 64};
    static const int32_t want[] = {KVP_OK,          KVP_ERR_BAD_KEY, KVP_ERR_BAD_KEY,
                                   KVP_ERR_BAD_KEY, KVP_ERR_BAD_KEY, KVP_ERR_BAD_KEY,
                                   KVP_OK,          KVP_OK};
    Kvpool__PutStartResponse *ps = put_start(st, C1, keys, 8, sizes, 8, 1, NULL);
    assert_int_equal(ps->status, KVP_OK);
    assert_int_equal(ps->n_results, 8);
    for (int i = 0; i < 8; i++)
        if (ps->results[i]->status != want[i])
            fail_msg("key %d: status %d, want %d", i, ps->results[i]->status, want[i]);
    svc_msg_free(ps);
    assert_int_equal(stat_get(st).pending, 3);

    /* every per-key method says BAD_KEY for the same key */
    const char *bad = "bad\xC3(";
    assert_int_equal(exist1(st, bad), KVP_ERR_BAD_KEY);
    assert_int_equal(size1(st, bad), KVP_ERR_BAD_KEY);
    assert_int_equal(replicas1_status(st, bad), KVP_ERR_BAD_KEY);
    assert_int_equal(end1(st, C1, bad, 0), KVP_ERR_BAD_KEY);
    assert_int_equal(keys1(st, C1, KVP_RPC_PUT_REVOKE, bad), KVP_ERR_BAD_KEY);
    assert_int_equal(keys1(st, C1, KVP_RPC_REMOVE, bad), KVP_ERR_BAD_KEY);
    assert_int_equal(exist1(st, k4097), KVP_ERR_BAD_KEY);

    /* the 4096-byte key works end to end */
    assert_int_equal(end1(st, C1, k4096, 42), KVP_OK);
    assert_int_equal(exist1(st, k4096), 1);
    assert_int_equal(size1(st, k4096), 64);
    free(k4096);
    free(k4097);
}

/*
 * A key with a NUL byte inside, hand-encoded (protobuf-c's packer would stop at
 * the NUL). The wire string "k\0x" is not the key "k": the master must refuse it
 * as a bad key rather than answer for "k".
 */
static void test_key_with_embedded_nul(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C1, "seg-a", "host1", 1 << 20, NULL), KVP_OK);
    assert_int_equal(put1(st, C1, "k", 64, NULL), KVP_OK);
    assert_int_equal(end1(st, C1, "k", 0), KVP_OK);

    /* KeysRequest { keys: "k\0x" } */
    static const uint8_t exist_body[] = {0x0A, 0x03, 'k', 0x00, 'x'};
    uint8_t *resp = NULL;
    size_t rlen = 0;
    char err[256] = "";
    assert_int_equal(handle_raw(st, C2, KVP_RPC_EXIST, exist_body, sizeof(exist_body), &resp, &rlen,
                                err, sizeof(err)),
                     KVP_OK);
    Kvpool__StatusesResponse *er = kvpool__statuses_response__unpack(NULL, rlen, resp);
    free(resp);
    assert_non_null(er);
    int32_t exist_answer = er->n_statuses == 1 ? er->statuses[0] : 99;
    svc_msg_free(er);

    /* KeysRequest { keys: "k\0x" } as REMOVE: must not remove "k" */
    resp = NULL;
    assert_int_equal(handle_raw(st, C2, KVP_RPC_REMOVE, exist_body, sizeof(exist_body), &resp,
                                &rlen, err, sizeof(err)),
                     KVP_OK);
    Kvpool__StatusesResponse *rr = kvpool__statuses_response__unpack(NULL, rlen, resp);
    free(resp);
    assert_non_null(rr);
    int32_t remove_answer = rr->n_statuses == 1 ? rr->statuses[0] : 99;
    svc_msg_free(rr);
    int32_t k_still_there = exist1(st, "k");

    if (exist_answer != KVP_ERR_BAD_KEY || remove_answer != KVP_ERR_BAD_KEY || k_still_there != 1)
        fail_msg("key \"k\\0x\": EXIST gave %d, REMOVE gave %d (want %d for both); "
                 "\"k\" exists afterwards: %d (want 1)",
                 exist_answer, remove_answer, KVP_ERR_BAD_KEY, k_still_there);
}

/* ---- REPLICA_CLEAR (Mooncake's BatchReplicaClear) ---- */

static int32_t *replica_clear(kvp_master_state_t *st, const char *const *keys, size_t n,
                              const char *segment, Kvpool__StatusesResponse **resp_p)
{
    ProtobufCBinaryData kb[8];
    for (size_t i = 0; i < n; i++)
        kb[i] = (ProtobufCBinaryData){strlen(keys[i]), (uint8_t *)keys[i]};
    Kvpool__ReplicaClearRequest req = KVPOOL__REPLICA_CLEAR_REQUEST__INIT;
    req.keys = kb;
    req.n_keys = n;
    req.segment = (char *)segment;
    Kvpool__StatusesResponse *r =
        svc_call(st, C1, KVP_RPC_REPLICA_CLEAR, &req.base, &kvpool__statuses_response__descriptor);
    assert_non_null(r);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, n);
    *resp_p = r;
    return r->statuses;
}

static void test_replica_clear(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t seg_a, seg_b;
    assert_int_equal(mount_seg(st, C1, "host1:12345", "host1", 64 << 20, &seg_a), KVP_OK);
    assert_int_equal(mount_seg(st, C2, "host2:12346", "host2", 64 << 20, &seg_b), KVP_OK);
    /* two replicas each (one per segment), one replica, one still being written */
    const char *two[] = {"r2-a", "r2-b"};
    uint64_t sizes[] = {4096, 4096};
    Kvpool__PutStartResponse *ps = put_start(st, C1, two, 2, sizes, 2, 2, NULL);
    assert_int_equal(ps->results[0]->n_replicas, 2);
    svc_msg_free(ps);
    Kvpool__StatusesResponse *e = put_end(st, C1, two, 2, (uint32_t[]){1, 2}, 2);
    svc_msg_free(e);
    Kvpool__Replica rep;
    assert_int_equal(put1(st, C1, "one", 8192, &rep), KVP_OK);
    assert_int_equal(end1(st, C1, "one", 3), KVP_OK);
    uint64_t one_seg = rep.segment_id;
    const char *one_name = one_seg == seg_a ? "host1:12345" : "host2:12346";
    assert_int_equal(put1(st, C1, "pending", 4096, NULL), KVP_OK);
    stat_snap_t before = stat_get(st);

    /* a segment holding one of two replicas: that replica goes, the other stays readable */
    Kvpool__StatusesResponse *r;
    const char *ka[] = {"r2-a", "missing", "pending"};
    int32_t *s = replica_clear(st, ka, 3, "host1:12345", &r);
    assert_int_equal(s[0], KVP_OK);
    assert_int_equal(s[1], KVP_ERR_NOT_FOUND);
    assert_int_equal(s[2], KVP_ERR_PENDING);
    svc_msg_free(r);
    Kvpool__GetReplicaListResponse *gl = replicas(st, (const char *[]){"r2-a"}, 1);
    assert_int_equal(gl->results[0]->status, KVP_OK);
    assert_int_equal(gl->results[0]->n_replicas, 1);
    assert_true(gl->results[0]->replicas[0]->segment_id == seg_b);
    svc_msg_free(gl);
    stat_snap_t after = stat_get(st);
    assert_true(after.used == before.used - 4096); /* the extent was freed */
    assert_int_equal(after.objects, before.objects);

    /* again on the same segment: nothing of r2-a there any more */
    s = replica_clear(st, (const char *[]){"r2-a"}, 1, "host1:12345", &r);
    assert_int_equal(s[0], KVP_ERR_NOT_FOUND);
    svc_msg_free(r);
    /* a segment of no replica of it, an unknown segment: nothing taken */
    const char *other = one_seg == seg_a ? "host2:12346" : "host1:12345";
    s = replica_clear(st, (const char *[]){"one"}, 1, other, &r);
    assert_int_equal(s[0], KVP_ERR_NOT_FOUND);
    svc_msg_free(r);
    s = replica_clear(st, (const char *[]){"one"}, 1, "nowhere:1", &r);
    assert_int_equal(s[0], KVP_ERR_NOT_FOUND);
    svc_msg_free(r);
    assert_int_equal(exist1(st, "one"), 1);

    /* the segment of its only replica: the object goes */
    s = replica_clear(st, (const char *[]){"one"}, 1, one_name, &r);
    assert_int_equal(s[0], KVP_OK);
    svc_msg_free(r);
    assert_int_equal(exist1(st, "one"), 0);
    assert_int_equal(stat_get(st).objects, after.objects - 1);

    /* no segment: the whole object, as Remove */
    s = replica_clear(st, (const char *[]){"r2-b"}, 1, "", &r);
    assert_int_equal(s[0], KVP_OK);
    svc_msg_free(r);
    assert_int_equal(exist1(st, "r2-b"), 0);
    assert_int_equal(exist1(st, "r2-a"), 1);

    /* a name longer than any segment's: the whole call refused */
    char longname[300];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    ProtobufCBinaryData kb = {4, (uint8_t *)"r2-a"};
    Kvpool__ReplicaClearRequest req = KVPOOL__REPLICA_CLEAR_REQUEST__INIT;
    req.keys = &kb;
    req.n_keys = 1;
    req.segment = longname;
    r = svc_call(st, C1, KVP_RPC_REPLICA_CLEAR, &req.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    svc_msg_free(r);
    assert_int_equal(exist1(st, "r2-a"), 1);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_put_lifecycle),
        T(test_batch),
        T(test_put_revoke),
        T(test_conn_closed_revokes_pending),
        T(test_conn_closed_sweeps_over_turns),
        T(test_big_batches_over_turns),
        T(test_big_batches_ended),
        T(test_preferred_segment),
        T(test_replica_clear),
        T(test_pool_full),
        T(test_mismatched_arrays),
        T(test_too_many_keys),
        T(test_undecodable_body),
        T(test_unknown_method),
        T(test_bad_keys),
        T(test_key_with_embedded_nul),
    };
#undef T
    return cmocka_run_group_tests_name("object_calls", tests, NULL, NULL);
}
