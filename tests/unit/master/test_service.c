/*
 * test_service.c - unit tests for master/service.c.
 *
 * Drives kvp_dispatch_handle the way the server does: a packed protobuf-c
 * request body in, a packed response out, from connections 1 and 2 (and 3
 * where a third party is needed). Every answer is unpacked and checked as a
 * client would check it; STAT is the independent view of the accounting.
 * Each test gets a fresh kvp_master_state_t from the fixture, which also
 * cleans it up when an assertion fails.
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
#include "tests/unit/master/svc_call.h"

#define C1 1
#define C2 2
#define C3 3

static int setup(void **state)
{
    kvp_master_state_t *st = calloc(1, sizeof(*st));
    if (st == NULL || kvp_master_state_init(st) != KVP_OK)
        return -1;
    st->rng = 0x5EED5EED5EED5EEDull; /* reproducible placement */
    /* store semantics here: no eviction, no read leases (test_eviction.c covers both) */
    st->config.evict = false;
    st->config.lease_ttl_ms = 0;
    *state = st;
    return 0;
}

static int teardown(void **state)
{
    kvp_master_state_t *st = *state;
    kvp_master_state_cleanup(st);
    free(st);
    return 0;
}

/* ---- request/response plumbing ---- */

/* Handle raw bytes; returns the frame-level status, response left in *resp_p. */
static kvp_status_t handle_raw(kvp_master_state_t *st, uint64_t conn, uint16_t method,
                               const uint8_t *body, size_t len, uint8_t **resp_p,
                               size_t *resp_len_p, char *errmsg, size_t errmsg_len)
{
    return kvp_dispatch_handle(st, conn, NULL, method, body, len, resp_p, resp_len_p, errmsg,
                               errmsg_len);
}

/* Mount; *msg_p (optional, 256 bytes) gets the response's message. */
static int32_t mount_desc_msg(kvp_master_state_t *st, uint64_t conn, Kvpool__SegmentDesc *d,
                              uint64_t *id_p, char *msg_p)
{
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 1000 + conn;
    req.segment = d;
    Kvpool__MountResponse *r =
        svc_call(st, conn, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
    int32_t status = r->status;
    if (id_p)
        *id_p = r->segment_id;
    if (msg_p)
        snprintf(msg_p, 256, "%s", r->message);
    svc_msg_free(r);
    return status;
}

static int32_t mount_desc(kvp_master_state_t *st, uint64_t conn, Kvpool__SegmentDesc *d,
                          uint64_t *id_p)
{
    return mount_desc_msg(st, conn, d, id_p, NULL);
}

static void fill_desc(Kvpool__SegmentDesc *d)
{
    kvpool__segment_desc__init(d);
    d->name = (char *)"seg";
    d->medium = (char *)"dram";
    d->size = 1 << 20;
    d->host_id = (char *)"h";
    d->tcp_endpoint = (char *)"127.0.0.1:7000";
    d->shm_path = (char *)"/dev/shm/x";
}

static int32_t mount_seg(kvp_master_state_t *st, uint64_t conn, const char *name, const char *host,
                         uint64_t size, uint64_t *id_p)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    char ep[64];
    snprintf(ep, sizeof(ep), "10.0.0.%d:7000", (int)conn);
    d.name = (char *)name;
    d.medium = (char *)"dram";
    d.size = size;
    d.host_id = (char *)host;
    d.tcp_endpoint = ep;
    d.shm_path = (char *)"/dev/shm/kvp-seg";
    d.rdma_endpoint = (char *)"169.254.77.1:7001";
    d.rdma_addr = 0x7f0000001000ull + conn;
    d.rdma_rkey = 0x1234u + (uint32_t)conn;
    return mount_desc(st, conn, &d, id_p);
}

/* Keys travel as protobuf bytes: build the array from C strings (reused buffer). */

static Kvpool__PutStartResponse *put_start(kvp_master_state_t *st, uint64_t conn,
                                           const char *const *keys, size_t n_keys,
                                           const uint64_t *sizes, size_t n_sizes, unsigned replicas,
                                           const char *preferred)
{
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    req.keys = svc_keys(keys, n_keys);
    req.n_keys = n_keys;
    req.sizes = (uint64_t *)sizes;
    req.n_sizes = n_sizes;
    cfg.replica_num = replicas;
    if (preferred)
        cfg.preferred_segment = (char *)preferred;
    req.config = &cfg;
    return svc_call(st, conn, KVP_RPC_PUT_START, &req.base,
                    &kvpool__put_start_response__descriptor);
}

/* One key: its per-key status; *rep_p gets the first replica when OK. */
static int32_t put1(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
                    Kvpool__Replica *rep_p)
{
    Kvpool__PutStartResponse *r = put_start(st, conn, &key, 1, &size, 1, 1, NULL);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 1);
    int32_t s = r->results[0]->status;
    if (s == KVP_OK) {
        assert_int_equal(r->results[0]->n_replicas, 1);
        assert_int_equal(r->results[0]->replicas[0]->length, size);
        if (rep_p)
            *rep_p = *r->results[0]->replicas[0];
    } else {
        assert_int_equal(r->results[0]->n_replicas, 0);
    }
    svc_msg_free(r);
    return s;
}

static Kvpool__StatusesResponse *keys_call(kvp_master_state_t *st, uint64_t conn, uint16_t method,
                                           const char *const *keys, size_t n)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(keys, n);
    req.n_keys = n;
    return svc_call(st, conn, method, &req.base, &kvpool__statuses_response__descriptor);
}

static int32_t keys1(kvp_master_state_t *st, uint64_t conn, uint16_t method, const char *key)
{
    Kvpool__StatusesResponse *r = keys_call(st, conn, method, &key, 1);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

static Kvpool__StatusesResponse *put_end(kvp_master_state_t *st, uint64_t conn,
                                         const char *const *keys, size_t n_keys,
                                         const uint32_t *crcs, size_t n_crcs)
{
    Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
    req.keys = svc_keys(keys, n_keys);
    req.n_keys = n_keys;
    req.crc32c = (uint32_t *)crcs;
    req.n_crc32c = n_crcs;
    return svc_call(st, conn, KVP_RPC_PUT_END, &req.base, &kvpool__statuses_response__descriptor);
}

static int32_t end1(kvp_master_state_t *st, uint64_t conn, const char *key, uint32_t crc)
{
    Kvpool__StatusesResponse *r = put_end(st, conn, &key, 1, &crc, 1);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

static int32_t exist1(kvp_master_state_t *st, const char *key)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    Kvpool__StatusesResponse *r =
        svc_call(st, C3, KVP_RPC_EXIST, &req.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t v = r->statuses[0];
    svc_msg_free(r);
    return v;
}

static int64_t size1(kvp_master_state_t *st, const char *key)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    Kvpool__GetSizeResponse *r =
        svc_call(st, C3, KVP_RPC_GET_SIZE, &req.base, &kvpool__get_size_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_sizes, 1);
    int64_t v = r->sizes[0];
    svc_msg_free(r);
    return v;
}

static Kvpool__GetReplicaListResponse *replicas(kvp_master_state_t *st, const char *const *keys,
                                                size_t n)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(keys, n);
    req.n_keys = n;
    return svc_call(st, C3, KVP_RPC_GET_REPLICA_LIST, &req.base,
                    &kvpool__get_replica_list_response__descriptor);
}

/* Per-key status of GET_REPLICA_LIST for one key. */
static int32_t replicas1_status(kvp_master_state_t *st, const char *key)
{
    Kvpool__GetReplicaListResponse *r = replicas(st, &key, 1);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 1);
    int32_t s = r->results[0]->status;
    if (s != KVP_OK)
        assert_int_equal(r->results[0]->n_replicas, 0);
    svc_msg_free(r);
    return s;
}

typedef struct stat_snap {
    uint64_t capacity, used, objects, pending;
    size_t n_segments;
    uint64_t seg_objects_sum;
} stat_snap_t;

static stat_snap_t stat_get(kvp_master_state_t *st)
{
    Kvpool__StatRequest req = KVPOOL__STAT_REQUEST__INIT;
    Kvpool__StatResponse *r =
        svc_call(st, C3, KVP_RPC_STAT, &req.base, &kvpool__stat_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    stat_snap_t s = {.capacity = r->capacity,
                     .used = r->used,
                     .objects = r->objects,
                     .pending = r->pending,
                     .n_segments = r->n_segments};
    uint64_t used = 0, cap = 0;
    for (size_t i = 0; i < r->n_segments; i++) {
        assert_non_null(r->segments[i]->desc);
        used += r->segments[i]->used;
        cap += r->segments[i]->desc->size;
        s.seg_objects_sum += r->segments[i]->objects;
    }
    /* the totals agree with the per-segment rows */
    assert_int_equal(used, s.used);
    assert_int_equal(cap, s.capacity);
    svc_msg_free(r);
    return s;
}

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

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_mount),
        T(test_mount_bad),
        T(test_mount_too_small_says_why),
        T(test_put_lifecycle),
        T(test_batch),
        T(test_put_revoke),
        T(test_conn_closed_revokes_pending),
        T(test_conn_closed_unmounts),
        T(test_unmount_keeps_other_replicas),
        T(test_preferred_segment),
        T(test_pool_full),
        T(test_mismatched_arrays),
        T(test_too_many_keys),
        T(test_undecodable_body),
        T(test_unknown_method),
        T(test_bad_keys),
        T(test_key_with_embedded_nul),
    };
#undef T
    return cmocka_run_group_tests_name("service", tests, NULL, NULL);
}
