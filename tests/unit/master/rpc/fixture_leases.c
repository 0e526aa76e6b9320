/*
 * fixture_leases.c - the fixture and request helpers of the master handler tests
 * with read leases on (rpc/test_object_calls_leased.c, rpc/test_segment_calls_leased.c,
 * rpc/test_drain_calls.c, rpc/test_admin_calls.c). See fixture_leases.h.
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
#include "tests/unit/master/rpc/fixture_leases.h"

int setup(void **state)
{
    kvp_master_state_t *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return -1;
    if (kvp_master_state_init(st) != KVP_OK) {
        free(st);
        return -1;
    }
    st->rng = 0x5EED5EED5EED5EEDull; /* reproducible placement */
    st->now_ms = 0;
    st->config.evict = false;
    st->config.lease_ttl_ms = 5000;
    st->config.put_timeout_ms = 30000;
    st->config.lease_on_exist = false;
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

Kvpool__MountResponse *mount_raw(kvp_master_state_t *st, uint64_t conn, const char *name,
                                 const char *host, uint64_t size)
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
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 1000 + conn;
    req.segment = &d;
    return svc_call(st, conn, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
}

uint64_t mount_seg(kvp_master_state_t *st, uint64_t conn, const char *name, const char *host,
                   uint64_t size)
{
    Kvpool__MountResponse *r = mount_raw(st, conn, name, host, size);
    assert_int_equal(r->status, KVP_OK);
    uint64_t id = r->segment_id;
    assert_true(id != 0);
    svc_msg_free(r);
    return id;
}

void copy_reps(view_t *v, Kvpool__Replica **reps, size_t n)
{
    assert_true(n <= KVP_MAX_REPLICAS);
    v->n = n;
    for (size_t i = 0; i < n; i++)
        v->r[i] = (rep_t){reps[i]->segment_id, reps[i]->offset, reps[i]->length};
}

view_t put_cfg(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
               unsigned replicas, const char *preferred, bool upsert)
{
    return put_avoid(st, conn, key, size, replicas, preferred, upsert, NULL, 0);
}

view_t put_avoid(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
                 unsigned replicas, const char *preferred, bool upsert, uint64_t *avoid,
                 size_t n_avoid)
{
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.sizes = &size;
    req.n_sizes = 1;
    cfg.replica_num = replicas;
    if (preferred != NULL)
        cfg.preferred_segment = (char *)preferred;
    cfg.upsert = upsert;
    cfg.avoid_segments = avoid;
    cfg.n_avoid_segments = n_avoid;
    req.config = &cfg;
    Kvpool__PutStartResponse *r =
        svc_call(st, conn, KVP_RPC_PUT_START, &req.base, &kvpool__put_start_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 1);
    view_t v = {.status = r->results[0]->status, .size = size};
    copy_reps(&v, r->results[0]->replicas, r->results[0]->n_replicas);
    for (size_t i = 0; i < v.n; i++) {
        assert_int_equal(v.r[i].len, size);
        bool described = false; /* every replica's segment comes with the answer */
        for (size_t s = 0; s < r->n_segments; s++)
            described |= r->segments[s]->id == v.r[i].seg;
        assert_true(described);
    }
    svc_msg_free(r);
    return v;
}

view_t put1(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size)
{
    return put_cfg(st, conn, key, size, 1, NULL, false);
}

view_t upsert1(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size)
{
    return put_cfg(st, conn, key, size, 1, NULL, true);
}

Kvpool__StatusesResponse *put_end(kvp_master_state_t *st, uint64_t conn, const char *const *keys,
                                  size_t n_keys, const uint32_t *crcs, const uint32_t *masks,
                                  size_t n_masks)
{
    Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
    req.keys = svc_keys(keys, n_keys);
    req.n_keys = n_keys;
    req.crc32c = (uint32_t *)crcs;
    req.n_crc32c = n_keys;
    req.written_mask = (uint32_t *)masks;
    req.n_written_mask = n_masks;
    return svc_call(st, conn, KVP_RPC_PUT_END, &req.base, &kvpool__statuses_response__descriptor);
}

int32_t end_mask1(kvp_master_state_t *st, uint64_t conn, const char *key, uint32_t crc,
                  const uint32_t *mask)
{
    Kvpool__StatusesResponse *r = put_end(st, conn, &key, 1, &crc, mask, mask ? 1 : 0);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

int32_t end1(kvp_master_state_t *st, uint64_t conn, const char *key, uint32_t crc)
{
    return end_mask1(st, conn, key, crc, NULL);
}

view_t put_done(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
                unsigned replicas, const char *preferred, uint32_t crc)
{
    view_t v = put_cfg(st, conn, key, size, replicas, preferred, false);
    assert_int_equal(v.status, KVP_OK);
    assert_int_equal(end1(st, conn, key, crc), KVP_OK);
    return v;
}

int32_t keys1(kvp_master_state_t *st, uint64_t conn, uint16_t method, const char *key, bool force)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.force = force;
    Kvpool__StatusesResponse *r =
        svc_call(st, conn, method, &req.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

int32_t exist1(kvp_master_state_t *st, const char *key)
{
    return keys1(st, C3, KVP_RPC_EXIST, key, false);
}

view_t grl1(kvp_master_state_t *st, const char *key)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    Kvpool__GetReplicaListResponse *r = svc_call(st, C3, KVP_RPC_GET_REPLICA_LIST, &req.base,
                                                 &kvpool__get_replica_list_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 1);
    Kvpool__GetReplicaResult *g = r->results[0];
    view_t v = {.status = g->status, .size = g->size, .crc = g->crc32c};
    copy_reps(&v, g->replicas, g->n_replicas);
    if (v.status != KVP_OK)
        assert_int_equal(v.n, 0);
    svc_msg_free(r);
    return v;
}

stat_snap_t stat_get(kvp_master_state_t *st)
{
    Kvpool__StatRequest req = KVPOOL__STAT_REQUEST__INIT;
    Kvpool__StatResponse *r =
        svc_call(st, C3, KVP_RPC_STAT, &req.base, &kvpool__stat_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    stat_snap_t s = {r->used, r->objects, r->pending, r->moved_objects};
    svc_msg_free(r);
    return s;
}

uint64_t seg_used(kvp_master_state_t *st, uint64_t id)
{
    kvp_segment_t *seg = kvp_segment_table_get(&st->segments, id);
    assert_non_null(seg);
    return kvp_segment_used(seg);
}

int32_t heartbeat(kvp_master_state_t *st, uint64_t conn, const uint64_t *ids, size_t n,
                  bool *remount_p, uint64_t *drain, size_t *n_drain_p)
{
    Kvpool__HeartbeatRequest req = KVPOOL__HEARTBEAT_REQUEST__INIT;
    req.client_id = 1000 + conn;
    req.segment_ids = (uint64_t *)ids;
    req.n_segment_ids = n;
    Kvpool__HeartbeatResponse *r =
        svc_call(st, conn, KVP_RPC_HEARTBEAT, &req.base, &kvpool__heartbeat_response__descriptor);
    int32_t s = r->status;
    *remount_p = r->remount;
    assert_true(r->n_drain_segment_ids <= 16);
    *n_drain_p = r->n_drain_segment_ids;
    for (size_t i = 0; i < r->n_drain_segment_ids; i++)
        drain[i] = r->drain_segment_ids[i];
    svc_msg_free(r);
    return s;
}

size_t heartbeat_table(kvp_master_state_t *st, uint64_t conn, uint64_t known, uint64_t *version_p,
                       uint64_t *out, size_t cap)
{
    Kvpool__HeartbeatRequest req = KVPOOL__HEARTBEAT_REQUEST__INIT;
    req.client_id = 1000 + conn;
    req.segments_version = known;
    Kvpool__HeartbeatResponse *r =
        svc_call(st, conn, KVP_RPC_HEARTBEAT, &req.base, &kvpool__heartbeat_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    *version_p = r->segments_version;
    size_t n = r->n_segments;
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++) {
        out[i] = r->segments[i]->id;
        assert_true(r->segments[i]->tcp_endpoint[0] != '\0');
    }
    svc_msg_free(r);
    return n;
}

int32_t drain(kvp_master_state_t *st, uint64_t conn, const char *name, uint64_t id, uint64_t *id_p,
              char *msg)
{
    Kvpool__DrainRequest req = KVPOOL__DRAIN_REQUEST__INIT;
    if (name != NULL)
        req.segment_name = (char *)name;
    req.segment_id = id;
    Kvpool__DrainResponse *r =
        svc_call(st, conn, KVP_RPC_DRAIN, &req.base, &kvpool__drain_response__descriptor);
    int32_t s = r->status;
    if (id_p)
        *id_p = r->segment_id;
    if (msg)
        snprintf(msg, 256, "%s", r->message);
    svc_msg_free(r);
    return s;
}

Kvpool__MoveStartResponse *move_start(kvp_master_state_t *st, uint64_t conn, uint64_t from,
                                      const char *const *keys, size_t n)
{
    Kvpool__MoveStartRequest req = KVPOOL__MOVE_START_REQUEST__INIT;
    req.from_segment_id = from;
    req.keys = svc_keys(keys, n);
    req.n_keys = n;
    return svc_call(st, conn, KVP_RPC_MOVE_START, &req.base,
                    &kvpool__move_start_response__descriptor);
}

int32_t move_start_status(kvp_master_state_t *st, uint64_t conn, uint64_t from, const char *key)
{
    Kvpool__MoveStartResponse *r = move_start(st, conn, from, &key, 1);
    int32_t s = r->status;
    if (s != KVP_OK)
        assert_int_equal(r->n_results, 0);
    svc_msg_free(r);
    return s;
}

Kvpool__StatusesResponse *move_end(kvp_master_state_t *st, uint64_t conn, uint64_t from,
                                   const char *const *keys, size_t n_keys, const int32_t *statuses,
                                   size_t n_statuses)
{
    Kvpool__MoveEndRequest req = KVPOOL__MOVE_END_REQUEST__INIT;
    req.from_segment_id = from;
    req.keys = svc_keys(keys, n_keys);
    req.n_keys = n_keys;
    req.statuses = (int32_t *)statuses;
    req.n_statuses = n_statuses;
    return svc_call(st, conn, KVP_RPC_MOVE_END, &req.base, &kvpool__statuses_response__descriptor);
}

int32_t move_end1(kvp_master_state_t *st, uint64_t conn, uint64_t from, const char *key,
                  int32_t copy_status)
{
    Kvpool__StatusesResponse *r = move_end(st, conn, from, &key, 1, &copy_status, 1);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

Kvpool__ListResponse *list(kvp_master_state_t *st, const char *pattern, uint64_t seg,
                           uint64_t cursor, uint32_t limit)
{
    Kvpool__ListRequest req = KVPOOL__LIST_REQUEST__INIT;
    req.pattern = (char *)pattern;
    req.segment_id = seg;
    req.cursor = cursor;
    req.limit = limit;
    return svc_call(st, C3, KVP_RPC_LIST, &req.base, &kvpool__list_response__descriptor);
}

Kvpool__RemoveByRegexResponse *rbr(kvp_master_state_t *st, const char *pattern, bool force,
                                   bool all)
{
    Kvpool__RemoveByRegexRequest req = KVPOOL__REMOVE_BY_REGEX_REQUEST__INIT;
    req.pattern = (char *)pattern;
    req.force = force;
    req.all = all;
    return svc_call(st, C3, KVP_RPC_REMOVE_BY_REGEX, &req.base,
                    &kvpool__remove_by_regex_response__descriptor);
}

unsigned graveyard_len(const kvp_master_state_t *st)
{
    unsigned n = 0;
    for (uint32_t i = 0; i < st->leases.n_slots; i++)
        n += st->leases.slots[i].obj != NULL && st->leases.slots[i].obj->state == KVP_OBJ_RETIRED;
    return n;
}
