/*
 * fixture_store.c - the fixture and request helpers of the master handler tests
 * with store semantics: no eviction, no read leases (rpc/test_object_calls.c,
 * rpc/test_segment_calls.c). See fixture_store.h.
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
#include "tests/unit/master/rpc/fixture_store.h"

int setup(void **state)
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

int teardown(void **state)
{
    kvp_master_state_t *st = *state;
    kvp_master_state_cleanup(st);
    free(st);
    return 0;
}

kvp_status_t handle_raw(kvp_master_state_t *st, uint64_t conn, uint16_t method, const uint8_t *body,
                        size_t len, uint8_t **resp_p, size_t *resp_len_p, char *errmsg,
                        size_t errmsg_len)
{
    return kvp_dispatch_handle(st, conn, NULL, method, body, len, resp_p, resp_len_p, errmsg,
                               errmsg_len);
}

int32_t mount_desc_msg(kvp_master_state_t *st, uint64_t conn, Kvpool__SegmentDesc *d,
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

int32_t mount_desc(kvp_master_state_t *st, uint64_t conn, Kvpool__SegmentDesc *d, uint64_t *id_p)
{
    return mount_desc_msg(st, conn, d, id_p, NULL);
}

void fill_desc(Kvpool__SegmentDesc *d)
{
    kvpool__segment_desc__init(d);
    d->name = (char *)"seg";
    d->medium = (char *)"dram";
    d->size = 1 << 20;
    d->host_id = (char *)"h";
    d->tcp_endpoint = (char *)"127.0.0.1:7000";
    d->shm_path = (char *)"/dev/shm/x";
}

int32_t mount_seg(kvp_master_state_t *st, uint64_t conn, const char *name, const char *host,
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

Kvpool__PutStartResponse *put_start(kvp_master_state_t *st, uint64_t conn, const char *const *keys,
                                    size_t n_keys, const uint64_t *sizes, size_t n_sizes,
                                    unsigned replicas, const char *preferred)
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

int32_t put1(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
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

Kvpool__StatusesResponse *keys_call(kvp_master_state_t *st, uint64_t conn, uint16_t method,
                                    const char *const *keys, size_t n)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(keys, n);
    req.n_keys = n;
    return svc_call(st, conn, method, &req.base, &kvpool__statuses_response__descriptor);
}

int32_t keys1(kvp_master_state_t *st, uint64_t conn, uint16_t method, const char *key)
{
    Kvpool__StatusesResponse *r = keys_call(st, conn, method, &key, 1);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

Kvpool__StatusesResponse *put_end(kvp_master_state_t *st, uint64_t conn, const char *const *keys,
                                  size_t n_keys, const uint32_t *crcs, size_t n_crcs)
{
    Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
    req.keys = svc_keys(keys, n_keys);
    req.n_keys = n_keys;
    req.crc32c = (uint32_t *)crcs;
    req.n_crc32c = n_crcs;
    return svc_call(st, conn, KVP_RPC_PUT_END, &req.base, &kvpool__statuses_response__descriptor);
}

int32_t end1(kvp_master_state_t *st, uint64_t conn, const char *key, uint32_t crc)
{
    Kvpool__StatusesResponse *r = put_end(st, conn, &key, 1, &crc, 1);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

int32_t exist1(kvp_master_state_t *st, const char *key)
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

int64_t size1(kvp_master_state_t *st, const char *key)
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

Kvpool__GetReplicaListResponse *replicas(kvp_master_state_t *st, const char *const *keys, size_t n)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(keys, n);
    req.n_keys = n;
    return svc_call(st, C3, KVP_RPC_GET_REPLICA_LIST, &req.base,
                    &kvpool__get_replica_list_response__descriptor);
}

int32_t replicas1_status(kvp_master_state_t *st, const char *key)
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

stat_snap_t stat_get(kvp_master_state_t *st)
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
