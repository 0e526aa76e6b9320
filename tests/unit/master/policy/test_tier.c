/*
 * test_tier.c - the master's SSD tier (policy/tier.c, rpc/ssd_calls.c) through its
 * RPCs: offload of DRAM victims and what ends an offload (done, failed, the
 * owner gone), the long poll, promotion (and a corrupt SSD copy), adoption
 * of an SSD segment's objects (unknown, known, stale, removed, overlapping,
 * misaligned), puts straight to SSD.
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
#include "master/ha/rebuild.h"
#include "master/policy/eviction.h"
#include "master/policy/lease.h"
#include "master/policy/lists.h"
#include "master/policy/tier.h"
#include "master/rpc/segment_calls.h"
#include "master/core/state.h"
#include "tests/unit/master/svc_call.h"

#define C_DRAM 1 /* the DRAM segment's owner */
#define C_SSD 2  /* the SSD segment's owner */
#define C_CLI 3  /* a client */

#define OBJ 16000u /* objects: 4 fill the 64 KiB DRAM segment */

typedef struct fx {
    kvp_master_state_t st;
    uint64_t dram, ssd;
} fx_t;

static uint64_t mount_ex(kvp_master_state_t *st, uint64_t conn, const char *name,
                         const char *medium, uint64_t size, bool adopting)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.name = (char *)name;
    d.medium = (char *)medium;
    d.size = size;
    d.host_id = (char *)"host-a";
    d.tcp_endpoint = (char *)"127.0.0.1:7000";
    d.shm_path = (char *)"";
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 100 + conn;
    req.segment = &d;
    req.adopting = adopting;
    Kvpool__MountResponse *r =
        svc_call(st, conn, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    uint64_t id = r->segment_id;
    svc_msg_free(r);
    return id;
}

static uint64_t mount(kvp_master_state_t *st, uint64_t conn, const char *name, const char *medium,
                      uint64_t size)
{
    return mount_ex(st, conn, name, medium, size, false);
}

static int setup(void **state)
{
    fx_t *fx = calloc(1, sizeof(*fx));
    if (fx == NULL || kvp_master_state_init(&fx->st) != KVP_OK)
        return -1;
    fx->st.rng = 0x5EED;
    fx->st.now_ms = 0;
    /* no background offload: only puts that need room start one */
    fx->st.config.offload_high = 1.0;
    fx->st.config.offload_low = 1.0;
    fx->dram = mount(&fx->st, C_DRAM, "dram-a", "dram", 65536);
    fx->ssd = mount(&fx->st, C_SSD, "ssd-a", "ssd", 1 << 20);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fx_t *fx = *state;
    kvp_master_state_cleanup(&fx->st);
    free(fx);
    return 0;
}

/* PutStart of one key; its status (and first replica's segment in *seg_p). */
static int32_t put_start(kvp_master_state_t *st, const char *key, uint64_t size, const char *medium,
                         uint64_t *seg_p)
{
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.sizes = &size;
    req.n_sizes = 1;
    cfg.replica_num = 1;
    cfg.medium = (char *)(medium ? medium : "");
    req.config = &cfg;
    Kvpool__PutStartResponse *r =
        svc_call(st, C_CLI, KVP_RPC_PUT_START, &req.base, &kvpool__put_start_response__descriptor);
    int32_t s = r->status != KVP_OK ? r->status : r->results[0]->status;
    if (s == KVP_OK && seg_p != NULL)
        *seg_p = r->results[0]->replicas[0]->segment_id;
    svc_msg_free(r);
    return s;
}

static int32_t put_end(kvp_master_state_t *st, const char *key, uint32_t crc)
{
    Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.crc32c = &crc;
    req.n_crc32c = 1;
    Kvpool__StatusesResponse *r =
        svc_call(st, C_CLI, KVP_RPC_PUT_END, &req.base, &kvpool__statuses_response__descriptor);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

static void put(kvp_master_state_t *st, const char *key, const char *medium)
{
    assert_int_equal(put_start(st, key, OBJ, medium, NULL), KVP_OK);
    assert_int_equal(put_end(st, key, 0xC0FFEE), KVP_OK);
}

/* GetReplicaList of one key: status, and the replicas' segments in order (the lease is
 * handed back at once). */
static int32_t get(kvp_master_state_t *st, const char *key, uint64_t *segs, size_t *n_p)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    Kvpool__GetReplicaListResponse *r = svc_call(st, C_CLI, KVP_RPC_GET_REPLICA_LIST, &req.base,
                                                 &kvpool__get_replica_list_response__descriptor);
    Kvpool__GetReplicaResult *g = r->results[0];
    int32_t s = g->status;
    *n_p = g->n_replicas;
    for (size_t i = 0; i < g->n_replicas; i++)
        segs[i] = g->replicas[i]->segment_id;
    if (g->lease_id != 0)
        kvp_lease_release(st, g->lease_id);
    svc_msg_free(r);
    return s;
}

/* SsdTasks for the SSD segment, reporting done[0..n_done); the caller frees the answer. */
static Kvpool__SsdTasksResponse *tasks(fx_t *fx, const uint64_t *ids, const int32_t *statuses,
                                       size_t n_done)
{
    Kvpool__SsdTaskResult res[8], *resp[8];
    for (size_t i = 0; i < n_done; i++) {
        kvpool__ssd_task_result__init(&res[i]);
        res[i].task_id = ids[i];
        res[i].status = statuses[i];
        resp[i] = &res[i];
    }
    Kvpool__SsdTasksRequest req = KVPOOL__SSD_TASKS_REQUEST__INIT;
    req.segment_id = fx->ssd;
    req.max_tasks = 8;
    req.done = resp;
    req.n_done = n_done;
    Kvpool__SsdTasksResponse *r = svc_call(&fx->st, C_SSD, KVP_RPC_SSD_TASKS, &req.base,
                                           &kvpool__ssd_tasks_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    return r;
}

/*
 * Fill DRAM with 4 objects, then a 5th put: the oldest (k0) is offloaded, and, since the put
 * waits for offloads, the next ones (k1, k2) too: a waiting put keeps a quarter of DRAM more
 * in flight than it needs (kvp_tier_offload_ahead), unless SSD has no room for them
 * (`offloads`: the tasks expected). The tasks are sent; *ids_p gets their ids.
 */
static void fill_and_offload(fx_t *fx, size_t offloads, uint64_t *ids)
{
    put(&fx->st, "k0", NULL);
    put(&fx->st, "k1", NULL);
    put(&fx->st, "k2", NULL);
    put(&fx->st, "k3", NULL);
    assert_int_equal(kvp_tier_offload_ahead(&fx->st), 65536 / 4);
    /* no room: victims go to SSD, and the put waits for its room (POOL_BUSY) */
    assert_int_equal(put_start(&fx->st, "k4", OBJ, NULL, NULL), KVP_ERR_POOL_BUSY);
    assert_int_equal(fx->st.offloading, offloads);
    Kvpool__SsdTasksResponse *r = tasks(fx, NULL, NULL, 0);
    assert_int_equal(r->n_tasks, offloads);
    for (size_t i = 0; i < offloads; i++) {
        Kvpool__SsdTask *t = r->tasks[i];
        char want[4];
        snprintf(want, sizeof(want), "k%zu", i); /* oldest first */
        assert_int_equal(t->key.len, 2);
        assert_memory_equal(t->key.data, want, 2);
        assert_int_equal(t->kind, KVP_SSD_OFFLOAD);
        assert_int_equal(t->size, OBJ);
        assert_int_equal(t->crc32c, 0xC0FFEE);
        assert_non_null(t->dram);
        assert_int_equal(t->dram->segment_id, fx->dram);
        assert_int_equal(t->ssd_offset % 4096, 0);
        ids[i] = t->task_id;
    }
    assert_int_equal(r->n_segments, 1); /* the DRAM segment they read from */
    svc_msg_free(r);
}

static void test_offload_done_moves_victim_to_ssd(void **state)
{
    fx_t *fx = *state;
    fx->st.config.promote_on_hit = false; /* the reads below leave them on SSD */
    uint64_t ids[3];
    fill_and_offload(fx, 3, ids);
    /* while they run, the victims read from DRAM */
    uint64_t segs[8];
    size_t n;
    assert_int_equal(get(&fx->st, "k0", segs, &n), KVP_OK);
    assert_int_equal(n, 1);
    assert_int_equal(segs[0], fx->dram);
    int32_t ok[3] = {KVP_OK, KVP_OK, KVP_OK};
    svc_msg_free(tasks(fx, ids, ok, 3));
    assert_int_equal(fx->st.offloading, 0);
    assert_int_equal(fx->st.offloading_bytes, 0);
    assert_int_equal(fx->st.stats.offloaded, 3);
    assert_int_equal(get(&fx->st, "k0", segs, &n), KVP_OK);
    assert_int_equal(n, 1);
    assert_int_equal(segs[0], fx->ssd);
    assert_int_equal(kvp_segment_table_used_tier(&fx->st.segments, false), 1 * OBJ);
    /* their DRAM room is back: the put goes through now */
    assert_int_equal(put_start(&fx->st, "k4", OBJ, NULL, NULL), KVP_OK);
    /* the hit on an SSD-only object was counted per tier */
    assert_true(fx->st.stats.hits_ssd >= 1);
}

static void test_offload_failure_keeps_dram(void **state)
{
    fx_t *fx = *state;
    uint64_t ids[3];
    fill_and_offload(fx, 3, ids);
    assert_true(kvp_segment_table_used_tier(&fx->st.segments, true) > 0); /* tasks hold them */
    int32_t io[3] = {KVP_ERR_IO, KVP_ERR_IO, KVP_ERR_IO};
    svc_msg_free(tasks(fx, ids, io, 3));
    assert_int_equal(fx->st.stats.offload_failed, 3);
    assert_int_equal(kvp_segment_table_used_tier(&fx->st.segments, true), 0);
    uint64_t segs[8];
    size_t n;
    assert_int_equal(get(&fx->st, "k0", segs, &n), KVP_OK);
    assert_int_equal(segs[0], fx->dram);
}

/* k0..k3 are there, read from DRAM */
static void all_in_dram(fx_t *fx)
{
    for (int k = 0; k < 4; k++) {
        char key[8];
        snprintf(key, sizeof(key), "k%d", k);
        uint64_t segs[8];
        size_t n;
        assert_int_equal(get(&fx->st, key, segs, &n), KVP_OK);
        assert_int_equal(segs[0], fx->dram);
    }
}

static void test_owner_gone_mid_offload_keeps_dram(void **state)
{
    fx_t *fx = *state;
    uint64_t ids[3];
    fill_and_offload(fx, 3, ids);
    kvp_dispatch_conn_closed(&fx->st, C_SSD); /* kill -9 of the SSD owner */
    assert_int_equal(fx->st.offloading, 0);
    assert_int_equal(fx->st.offloading_bytes, 0);
    assert_int_equal(fx->st.segments.capacity_ssd, 0);
    all_in_dram(fx);
    /* no SSD tier left: the next put evicts (drops) as before */
    assert_int_equal(put_start(&fx->st, "k4", OBJ, NULL, NULL), KVP_OK);
}

/* The SSD owner killed mid-offload and restarted: until its offer ends (adopting) no SSD
 * segment takes replicas, and DRAM victims must wait for it, not be dropped: a put that
 * needs room gets POOL_BUSY, the background offload starts nothing; once the offer ends,
 * victims go to SSD as before and every object is still there. */
static void test_restarted_owner_adopting_drops_nothing(void **state)
{
    fx_t *fx = *state;
    uint64_t ids[3];
    fill_and_offload(fx, 3, ids);
    kvp_dispatch_conn_closed(&fx->st, C_SSD); /* kill -9 of the SSD owner */
    fx->ssd = mount_ex(&fx->st, C_SSD, "ssd-a", "ssd", 1 << 20, true);
    assert_true(kvp_tier_has_ssd(&fx->st));
    assert_true(kvp_tier_ssd_adopting(&fx->st));
    /* a put that needs room waits */
    assert_int_equal(put_start(&fx->st, "k4", OBJ, NULL, NULL), KVP_ERR_POOL_BUSY);
    /* and so does the background offload, past its watermark */
    fx->st.config.offload_high = 0.5;
    fx->st.config.offload_low = 0.25;
    kvp_evict_if_needed(&fx->st);
    assert_int_equal(fx->st.stats.offload_dropped, 0);
    assert_int_equal(fx->st.offloading, 0);
    assert_true(fx->st.stats.offload_adopt_waits >= 2);
    all_in_dram(fx);
    /* an offer that does not end is not waited for past its bound: an owner that never
     * ends it cannot stall the puts (victims are dropped then, as with no SSD tier) */
    uint64_t now = fx->st.now_ms;
    fx->st.now_ms = now + KVP_TIER_ADOPT_WAIT_MS;
    assert_false(kvp_tier_ssd_adopting(&fx->st));
    fx->st.now_ms = now + KVP_TIER_ADOPT_WAIT_MS - 1;
    assert_true(kvp_tier_ssd_adopting(&fx->st));
    /* the offer ends (nothing recorded): victims go to SSD, none is dropped */
    Kvpool__AdoptRequest req = KVPOOL__ADOPT_REQUEST__INIT;
    req.segment_id = fx->ssd;
    req.last = true;
    Kvpool__AdoptResponse *r =
        svc_call(&fx->st, C_SSD, KVP_RPC_ADOPT, &req.base, &kvpool__adopt_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    svc_msg_free(r);
    assert_false(kvp_tier_ssd_adopting(&fx->st));
    kvp_evict_if_needed(&fx->st);
    assert_true(fx->st.offloading > 0);
    assert_int_equal(fx->st.stats.offload_dropped, 0);
    assert_int_equal(fx->st.index.count, 4);
}

/* SSD full of objects being read: no room for the victim, so it is dropped (counted) and
 * the put goes on, rather than waiting for room that will not come. */
static void test_ssd_full_drops_instead(void **state)
{
    fx_t *fx = *state;
    kvp_dispatch_conn_closed(&fx->st, C_SSD);
    fx->ssd = mount(&fx->st, C_SSD, "ssd-small", "ssd", 16384); /* one object */
    fx->st.config.promote_on_hit = false;
    fx->st.config.ssd_evict_high = 1.0; /* a full SSD is fine: no background drop */
    fx->st.config.ssd_evict_low = 1.0;
    put(&fx->st, "k0", NULL);
    put(&fx->st, "k1", NULL);
    put(&fx->st, "k2", NULL);
    put(&fx->st, "k3", NULL);
    /* k0 is offloaded into the one SSD slot; k1 and k2 (the room offloaded ahead) find no
     * SSD room and are dropped, which frees the put's room at once */
    assert_int_equal(put_start(&fx->st, "k4", OBJ, NULL, NULL), KVP_OK);
    assert_int_equal(put_end(&fx->st, "k4", 1), KVP_OK);
    assert_int_equal(fx->st.stats.offload_dropped, 2);
    assert_int_equal(fx->st.offloading, 1);
    Kvpool__SsdTasksResponse *r = tasks(fx, NULL, NULL, 0);
    assert_int_equal(r->n_tasks, 1);
    uint64_t id = r->tasks[0]->task_id;
    svc_msg_free(r);
    const char *first = "k0";
    int32_t ok = KVP_OK;
    svc_msg_free(tasks(fx, &id, &ok, 1));
    /* the one SSD object is being read: it cannot make room */
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    const char *k = first;
    req.keys = svc_keys(&k, 1);
    req.n_keys = 1;
    Kvpool__GetReplicaListResponse *g =
        svc_call(&fx->st, C_CLI, KVP_RPC_GET_REPLICA_LIST, &req.base,
                 &kvpool__get_replica_list_response__descriptor);
    assert_int_equal(g->results[0]->status, KVP_OK);
    svc_msg_free(g);          /* lease kept */
    put(&fx->st, "k5", NULL); /* fits: k0's DRAM room came back */
    put(&fx->st, "k6", NULL);
    assert_int_equal(put_start(&fx->st, "k7", OBJ, NULL, NULL), KVP_OK);
    assert_true(fx->st.stats.offload_dropped >= 3);
    assert_int_equal(fx->st.offloading, 0);
}

static void test_long_poll_parks_when_idle(void **state)
{
    fx_t *fx = *state;
    Kvpool__SsdTasksRequest req = KVPOOL__SSD_TASKS_REQUEST__INIT;
    req.segment_id = fx->ssd;
    uint8_t body[64], *resp = NULL;
    size_t len = kvpool__ssd_tasks_request__pack(&req, body), rlen = 0;
    char err[128];
    fx->st.may_park = true;
    assert_int_equal(kvp_dispatch_handle(&fx->st, C_SSD, NULL, KVP_RPC_SSD_TASKS, body, len, &resp,
                                         &rlen, err, sizeof(err)),
                     KVP_OK);
    assert_true(fx->st.parked); /* no task: held, no answer */
    assert_int_equal(rlen, 0);
    fx->st.parked = false;
    fx->st.may_park = false;
    /* a task queued wakes it (the server calls again) */
    fx->st.tasks_ready = false;
    put(&fx->st, "s0", "ssd");
    assert_true(fx->st.tasks_ready);
    /* another connection may not speak for the segment */
    Kvpool__SsdTasksResponse *r = svc_call(&fx->st, C_CLI, KVP_RPC_SSD_TASKS, &req.base,
                                           &kvpool__ssd_tasks_response__descriptor);
    assert_int_equal(r->status, KVP_ERR_SEGMENT_GONE);
    svc_msg_free(r);
}

static void test_put_to_ssd_is_recorded(void **state)
{
    fx_t *fx = *state;
    uint64_t seg = 0;
    assert_int_equal(put_start(&fx->st, "cold", OBJ, "ssd", &seg), KVP_OK);
    assert_int_equal(seg, fx->ssd);
    assert_int_equal(put_end(&fx->st, "cold", 7), KVP_OK);
    Kvpool__SsdTasksResponse *r = tasks(fx, NULL, NULL, 0);
    assert_int_equal(r->n_tasks, 1);
    assert_int_equal(r->tasks[0]->kind, KVP_SSD_RECORD);
    assert_int_equal(r->tasks[0]->crc32c, 7);
    svc_msg_free(r);
    assert_int_equal(put_start(&fx->st, "x", OBJ, "tape", NULL), KVP_ERR_INVALID_ARG);
    /* a remove has the owner forget it */
    Kvpool__KeysRequest kr = KVPOOL__KEYS_REQUEST__INIT;
    const char *k = "cold";
    kr.keys = svc_keys(&k, 1);
    kr.n_keys = 1;
    svc_msg_free(
        svc_call(&fx->st, C_CLI, KVP_RPC_REMOVE, &kr.base, &kvpool__statuses_response__descriptor));
    r = tasks(fx, NULL, NULL, 0);
    assert_int_equal(r->n_tasks, 1);
    assert_int_equal(r->tasks[0]->kind, KVP_SSD_FORGET);
    svc_msg_free(r);
    /* an SSD segment is not drained (its owner stops; the file keeps the objects) */
    Kvpool__DrainRequest dr = KVPOOL__DRAIN_REQUEST__INIT;
    dr.segment_id = fx->ssd;
    Kvpool__DrainResponse *d =
        svc_call(&fx->st, C_CLI, KVP_RPC_DRAIN, &dr.base, &kvpool__drain_response__descriptor);
    assert_int_equal(d->status, KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(d->message, "SSD segment"));
    svc_msg_free(d);
}

static void test_promotion_and_corrupt_copy(void **state)
{
    fx_t *fx = *state;
    put(&fx->st, "p", "ssd");
    put(&fx->st, "q", "ssd");
    svc_msg_free(tasks(fx, NULL, NULL, 0)); /* the RECORDs (not reported: fine) */
    uint64_t segs[8];
    size_t n;
    assert_int_equal(get(&fx->st, "p", segs, &n), KVP_OK);
    assert_int_equal(get(&fx->st, "q", segs, &n), KVP_OK);
    Kvpool__SsdTasksResponse *r = tasks(fx, NULL, NULL, 0);
    assert_int_equal(r->n_tasks, 2);
    uint64_t ids[2];
    int32_t st[2];
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(r->tasks[i]->kind, KVP_SSD_PROMOTE);
        assert_int_equal(r->tasks[i]->dram->segment_id, fx->dram);
        ids[i] = r->tasks[i]->task_id;
        /* p's copy reads back fine, q's is corrupt */
        st[i] = r->tasks[i]->key.data[0] == 'p' ? KVP_OK : KVP_ERR_CHECKSUM;
    }
    svc_msg_free(r);
    svc_msg_free(tasks(fx, ids, st, 2));
    assert_int_equal(fx->st.stats.promoted, 1);
    assert_int_equal(fx->st.stats.ssd_lost, 1);
    assert_int_equal(get(&fx->st, "p", segs, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_int_equal(segs[0], fx->dram); /* DRAM first */
    assert_int_equal(segs[1], fx->ssd);
    assert_int_equal(get(&fx->st, "q", segs, &n), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_segment_table_used_tier(&fx->st.segments, false), 16000);
}

static int32_t adopt1(fx_t *fx, const char *key, uint64_t version, uint64_t offset, uint64_t size,
                      uint32_t crc)
{
    Kvpool__AdoptEntry e = KVPOOL__ADOPT_ENTRY__INIT, *ep = &e;
    e.key.data = (uint8_t *)key;
    e.key.len = strlen(key);
    e.version = version;
    e.offset = offset;
    e.size = size;
    e.crc32c = crc;
    Kvpool__AdoptRequest req = KVPOOL__ADOPT_REQUEST__INIT;
    req.segment_id = fx->ssd;
    req.entries = &ep;
    req.n_entries = 1;
    Kvpool__AdoptResponse *r =
        svc_call(&fx->st, C_SSD, KVP_RPC_ADOPT, &req.base, &kvpool__adopt_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

static void test_adoption_rules(void **state)
{
    fx_t *fx = *state;
    uint64_t v_old = fx->st.version_clock - 1000;
    /* unknown key: adopted, readable from SSD with its size and CRC */
    assert_int_equal(adopt1(fx, "a", v_old, 0, 5000, 11), KVP_OK);
    uint64_t segs[8];
    size_t n;
    assert_int_equal(get(&fx->st, "a", segs, &n), KVP_OK);
    assert_int_equal(segs[0], fx->ssd);
    /* overlapping an adopted extent, or misaligned, or outside: refused */
    assert_int_equal(adopt1(fx, "b", v_old, 4096, 100, 1), KVP_ERR_EXISTS);
    assert_int_equal(adopt1(fx, "c", v_old, 8192 + 512, 100, 1), KVP_ERR_INVALID_ARG);
    assert_int_equal(adopt1(fx, "d", v_old, 1 << 20, 100, 1), KVP_ERR_INVALID_ARG);
    /* the master has a newer value: the copy is stale */
    put(&fx->st, "e", NULL);
    assert_int_equal(adopt1(fx, "e", v_old, 16384, OBJ, 0xC0FFEE), KVP_ERR_EXISTS);
    /* removed after the copy was written (even while absent): refused */
    Kvpool__KeysRequest kr = KVPOOL__KEYS_REQUEST__INIT;
    const char *k = "f";
    kr.keys = svc_keys(&k, 1);
    kr.n_keys = 1;
    Kvpool__StatusesResponse *sr =
        svc_call(&fx->st, C_CLI, KVP_RPC_REMOVE, &kr.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(sr->statuses[0], KVP_ERR_NOT_FOUND);
    svc_msg_free(sr);
    assert_int_equal(adopt1(fx, "f", v_old, 32768, 100, 1), KVP_ERR_NOT_FOUND);
    /* a copy newer than the tombstone is fine */
    assert_int_equal(adopt1(fx, "f", fx->st.version_clock + 5, 32768, 100, 1), KVP_OK);
    /* a known object of the same version: one more replica (the SSD copy back) */
    kvp_object_t *obj = kvp_index_lookup(&fx->st.index, "e", 1, kvp_index_hash("e", 1));
    assert_non_null(obj);
    assert_int_equal(adopt1(fx, "e", obj->version, 65536, OBJ, 0xC0FFEE), KVP_OK);
    assert_int_equal(get(&fx->st, "e", segs, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_int_equal(segs[0], fx->dram);
    assert_int_equal(segs[1], fx->ssd);
    assert_int_equal(fx->st.stats.adopted, 3);
}

/* ---- the DFS tier (dfs_replica_num; docs/architecture.md "The DFS tier") ---- */

#define C_DFS 4 /* the DFS segment's owner */

/* PutStart of one key with dfs_replica_num dfs (and medium); its status, the replicas'
 * segments in segs[] and their count in *n_p. */
static int32_t put_start_dfs(kvp_master_state_t *st, const char *key, uint64_t size, uint32_t dfs,
                             const char *medium, uint64_t *segs, size_t *n_p)
{
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.sizes = &size;
    req.n_sizes = 1;
    cfg.replica_num = 1;
    cfg.dfs_replica_num = dfs;
    cfg.medium = (char *)(medium ? medium : "");
    req.config = &cfg;
    Kvpool__PutStartResponse *r =
        svc_call(st, C_CLI, KVP_RPC_PUT_START, &req.base, &kvpool__put_start_response__descriptor);
    int32_t s = r->status != KVP_OK ? r->status : r->results[0]->status;
    *n_p = 0;
    for (size_t i = 0; s == KVP_OK && i < r->results[0]->n_replicas; i++)
        segs[(*n_p)++] = r->results[0]->replicas[i]->segment_id;
    svc_msg_free(r);
    return s;
}

/* PutEnd of one key with its written mask. */
static int32_t put_end_mask(kvp_master_state_t *st, const char *key, uint32_t crc, uint32_t mask)
{
    Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.crc32c = &crc;
    req.n_crc32c = 1;
    req.written_mask = &mask;
    req.n_written_mask = 1;
    Kvpool__StatusesResponse *r =
        svc_call(st, C_CLI, KVP_RPC_PUT_END, &req.base, &kvpool__statuses_response__descriptor);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

static void test_dfs_replica(void **state)
{
    fx_t *fx = *state;
    uint64_t segs[8];
    size_t n;
    /* no DFS segment yet: the DFS part is refused, nothing held */
    assert_int_equal(put_start_dfs(&fx->st, "d0", OBJ, 1, NULL, segs, &n), KVP_ERR_UNSUPPORTED);
    assert_int_equal(kvp_segment_table_used(&fx->st.segments), 0);
    uint64_t dfs = mount(&fx->st, C_DFS, "127.0.0.1:7001/dfs/0123/shard-h-0.kvpdfs", "dfs", 65536);
    kvp_segment_t *seg = kvp_segment_table_get(&fx->st.segments, dfs);
    assert_true(seg->dfs && seg->ssd);
    /* a tier of its own: neither the SSD tier's capacity nor DRAM's */
    assert_int_equal(kvp_segment_table_capacity_tier(&fx->st.segments, true), 1 << 20);
    assert_int_equal(kvp_segment_table_capacity_tier(&fx->st.segments, false), 65536);
    assert_int_equal(fx->st.segments.capacity_dfs, 65536);
    /* 2 or more, or with medium "ssd": refused */
    assert_int_equal(put_start_dfs(&fx->st, "d0", OBJ, 2, NULL, segs, &n), KVP_ERR_INVALID_ARG);
    assert_int_equal(put_start_dfs(&fx->st, "d0", OBJ, 1, "ssd", segs, &n), KVP_ERR_INVALID_ARG);
    /* the memory replica first, the DFS one last */
    assert_int_equal(put_start_dfs(&fx->st, "d0", OBJ, 1, NULL, segs, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_true(segs[0] == fx->dram && segs[1] == dfs);
    /* a PutEnd without the DFS replica revokes the key: nothing visible, nothing held */
    assert_int_equal(put_end_mask(&fx->st, "d0", 5, 0x1), KVP_ERR_IO);
    assert_int_equal(kvp_segment_table_used(&fx->st.segments), 0);
    assert_int_equal(get(&fx->st, "d0", segs, &n), KVP_ERR_NOT_FOUND);
    /* with both: stored; the DFS owner records it; reads list DRAM first */
    assert_int_equal(put_start_dfs(&fx->st, "d0", OBJ, 1, NULL, segs, &n), KVP_OK);
    assert_int_equal(put_end_mask(&fx->st, "d0", 5, 0x3), KVP_OK);
    assert_int_equal(fx->st.stats.dfs_puts, 2);
    Kvpool__SsdTasksRequest tr = KVPOOL__SSD_TASKS_REQUEST__INIT;
    tr.segment_id = dfs;
    tr.max_tasks = 8;
    Kvpool__SsdTasksResponse *t = svc_call(&fx->st, C_DFS, KVP_RPC_SSD_TASKS, &tr.base,
                                           &kvpool__ssd_tasks_response__descriptor);
    assert_int_equal(t->n_tasks, 1);
    assert_int_equal(t->tasks[0]->kind, KVP_SSD_RECORD);
    assert_int_equal(t->tasks[0]->crc32c, 5);
    svc_msg_free(t);
    assert_int_equal(get(&fx->st, "d0", segs, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_true(segs[0] == fx->dram && segs[1] == dfs);
    /* puts to the SSD tier never land on DFS */
    for (int i = 0; i < 4; i++) {
        char k[8];
        snprintf(k, sizeof(k), "s%d", i);
        assert_int_equal(put_start(&fx->st, k, OBJ, "ssd", segs), KVP_OK);
        assert_true(segs[0] == fx->ssd);
    }
}

static void test_dfs_full_and_eviction(void **state)
{
    fx_t *fx = *state;
    uint64_t segs[8], dfs = mount(&fx->st, C_DFS, "h:1/dfs/0123/shard-h-0.kvpdfs", "dfs", 65536);
    size_t n;
    fx->st.config.dfs_evict = false; /* --dfs-eviction off (test_dfs_eviction: on) */
    /* 4 objects fill the DFS segment (16000 B in 16 KiB blocks) */
    for (int i = 0; i < 4; i++) {
        char k[8];
        snprintf(k, sizeof(k), "f%d", i);
        assert_int_equal(put_start_dfs(&fx->st, k, OBJ, 1, NULL, segs, &n), KVP_OK);
        assert_int_equal(put_end_mask(&fx->st, k, 9, 0x3), KVP_OK);
    }
    /* DRAM is full too: a put there evicts the oldest, which loses its DRAM replica only */
    put(&fx->st, "m0", NULL);
    assert_int_equal(get(&fx->st, "f0", segs, &n), KVP_OK);
    assert_int_equal(n, 1);
    assert_true(segs[0] == dfs);
    assert_int_equal(fx->st.stats.offloaded, 0); /* not an offload: the copy was there */
    /* the fifth: refused (no DFS room, none evicted for it), nothing held */
    uint64_t used = kvp_segment_table_used(&fx->st.segments);
    assert_int_equal(put_start_dfs(&fx->st, "f4", OBJ, 1, NULL, segs, &n), KVP_ERR_POOL_FULL);
    assert_int_equal(kvp_segment_table_used(&fx->st.segments), used);
    assert_int_equal(fx->st.stats.dfs_full, 1);
    assert_int_equal(get(&fx->st, "f4", segs, &n), KVP_ERR_NOT_FOUND);
    /* the SSD tier's eviction takes nothing of DFS */
    kvp_tier_evict_ssd_to(&fx->st, 0);
    for (int i = 0; i < 4; i++) {
        char k[8];
        snprintf(k, sizeof(k), "f%d", i);
        assert_int_equal(get(&fx->st, k, segs, &n), KVP_OK);
    }
    /* without a DFS replica the put still fits (DRAM evicts as usual) */
    assert_int_equal(put_start(&fx->st, "f4", OBJ, NULL, NULL), KVP_OK);
}

/* Find the task of kind queued for segment seg (NULL: none). */
static const kvp_ssd_task_t *task_of(const kvp_master_state_t *st, uint64_t seg, int kind)
{
    for (const kvp_ssd_task_t *t = st->tasks; t != NULL; t = t->next)
        if (t->segment_id == seg && (int)t->kind == kind)
            return t;
    return NULL;
}

static void test_dfs_eviction(void **state)
{
    fx_t *fx = *state;
    uint64_t segs[8], dfs = mount(&fx->st, C_DFS, "h:1/dfs/0123/shard-h-0.kvpdfs", "dfs", 65536);
    mount(&fx->st, C_DRAM, "dram-b", "dram", 1 << 20); /* DRAM has room: no DRAM eviction */
    size_t n;
    /* high watermark 1.0: only puts that need room evict */
    fx->st.config.dfs_evict_high = 1.0;
    fx->st.config.dfs_evict_low = 1.0;
    fx->st.config.promote_on_hit = false; /* (a promotion in flight is never a victim) */
    for (int i = 0; i < 4; i++) {         /* DFS full: f0..f3 */
        char k[8];
        snprintf(k, sizeof(k), "f%d", i);
        assert_int_equal(put_start_dfs(&fx->st, k, OBJ, 1, NULL, segs, &n), KVP_OK);
        assert_int_equal(put_end_mask(&fx->st, k, 9, 0x3), KVP_OK);
    }
    /* f0 a DRAM victim: on DFS only now */
    kvp_object_t *f0 = kvp_index_lookup(&fx->st.index, "f0", 2, kvp_index_hash("f0", 2));
    assert_int_equal(kvp_tier_victim(&fx->st, f0), KVP_TIER_FREED);
    assert_int_equal(get(&fx->st, "f0", segs, &n), KVP_OK);
    assert_true(n == 1 && segs[0] == dfs);
    /* f1 hard-pinned: never a DFS victim */
    kvp_object_t *f1 = kvp_index_lookup(&fx->st.index, "f1", 2, kvp_index_hash("f1", 2));
    f1->pin = KVP_PIN_HARD;
    kvp_policy_move(&fx->st, f1, KVP_POLICY_PINNED, false);
    fx->st.now_ms += 3600 * 1000; /* the reads' leases (get) are over */
    /* a fifth DFS put: the least recently used DFS copy goes; f0 had no other: removed */
    assert_int_equal(put_start_dfs(&fx->st, "f4", OBJ, 1, NULL, segs, &n), KVP_OK);
    assert_true(n == 2 && segs[1] == dfs);
    assert_int_equal(put_end_mask(&fx->st, "f4", 9, 0x3), KVP_OK);
    assert_int_equal(get(&fx->st, "f0", segs, &n), KVP_ERR_NOT_FOUND);
    assert_int_equal(fx->st.stats.dfs_evicted, 1);
    assert_int_equal(fx->st.stats.dfs_evicted_objects, 1);
    assert_int_equal(fx->st.stats.dfs_full, 0);
    const kvp_ssd_task_t *fg = task_of(&fx->st, dfs, KVP_SSD_FORGET); /* its entry goes */
    assert_non_null(fg);
    assert_int_equal(fg->key_len, 2);
    assert_memory_equal(fg->key, "f0", 2);
    fx->st.now_ms += 3600 * 1000;
    /* the sixth: f2 (the oldest in DRAM but f1, pinned) loses its DFS copy, keeps DRAM */
    assert_int_equal(put_start_dfs(&fx->st, "f5", OBJ, 1, NULL, segs, &n), KVP_OK);
    assert_int_equal(put_end_mask(&fx->st, "f5", 9, 0x3), KVP_OK);
    assert_int_equal(fx->st.stats.dfs_evicted, 2);
    assert_int_equal(fx->st.stats.dfs_evicted_objects, 1);
    assert_int_equal(get(&fx->st, "f2", segs, &n), KVP_OK);
    assert_true(n == 1 && segs[0] != dfs);
    assert_int_equal(get(&fx->st, "f1", segs, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_int_equal(get(&fx->st, "f3", segs, &n), KVP_OK);
    assert_int_equal(n, 2);
    /* the watermarks: above the high one, down to the low one */
    fx->st.now_ms += 3600 * 1000;
    fx->st.config.dfs_evict_high = 0.5;
    fx->st.config.dfs_evict_low = 0.25;
    kvp_evict_if_needed(&fx->st);
    assert_int_equal(kvp_segment_table_used_dfs(&fx->st.segments), 16384); /* f1's */
    const char *ks[] = {"f2", "f3", "f4", "f5"};
    for (int i = 0; i < 4; i++) { /* all still there, in DRAM */
        assert_int_equal(get(&fx->st, ks[i], segs, &n), KVP_OK);
        assert_true(n == 1 && segs[0] != dfs);
    }
    assert_int_equal(fx->st.stats.dfs_evicted, 5);
    assert_int_equal(fx->st.stats.dfs_evicted_objects, 1);
    /* a DFS segment dedicated to another tenant: a put of tenant 0 cannot use it, and
     * evicts nothing there */
    assert_int_equal(put_start_dfs(&fx->st, "y0", OBJ, 1, NULL, segs, &n), KVP_OK);
    assert_int_equal(put_end_mask(&fx->st, "y0", 9, 0x3), KVP_OK); /* evictable */
    kvp_segment_t *ds = kvp_segment_table_get(&fx->st.segments, dfs);
    ds->dedicated = true;
    ds->tenant = 7;
    assert_int_equal(put_start_dfs(&fx->st, "x0", OBJ, 1, NULL, segs, &n), KVP_ERR_POOL_FULL);
    assert_int_equal(fx->st.stats.dfs_evicted, 5);
    assert_int_equal(kvp_segment_table_used_dfs(&fx->st.segments), 2 * 16384);
    ds->dedicated = false;
    /* --dfs-eviction off: a full DFS refuses */
    fx->st.config.dfs_evict = false;
    fx->st.config.dfs_evict_high = 1.0;
    for (int i = 0; i < 2; i++) {
        char k[8];
        snprintf(k, sizeof(k), "g%d", i);
        assert_int_equal(put_start_dfs(&fx->st, k, OBJ, 1, NULL, segs, &n), KVP_OK);
        assert_int_equal(put_end_mask(&fx->st, k, 9, 0x3), KVP_OK);
    }
    assert_int_equal(put_start_dfs(&fx->st, "g2", OBJ, 1, NULL, segs, &n), KVP_ERR_POOL_FULL);
    assert_int_equal(fx->st.stats.dfs_evicted, 5);
}

/* The DFS owner's connection closes: its segment stays, ownerless, its objects readable;
 * a mount of the same shard file takes it over; past --segment-grace it goes. */
static void test_dfs_owner_gone_and_takeover(void **state)
{
    fx_t *fx = *state;
    uint64_t segs[8], dfs = mount(&fx->st, C_DFS, "h:1/dfs/0123/shard-h-0.kvpdfs", "dfs", 65536);
    size_t n;
    fx->st.config.segment_grace_ms = 60000;
    fx->st.config.promote_on_hit = false;
    for (int i = 0; i < 2; i++) {
        char k[8];
        snprintf(k, sizeof(k), "d%d", i);
        assert_int_equal(put_start_dfs(&fx->st, k, OBJ, 1, NULL, segs, &n), KVP_OK);
        assert_int_equal(put_end_mask(&fx->st, k, 9, 0x3), KVP_OK);
    }
    kvp_object_t *d0 = kvp_index_lookup(&fx->st.index, "d0", 2, kvp_index_hash("d0", 2));
    assert_int_equal(kvp_tier_victim(&fx->st, d0), KVP_TIER_FREED); /* d0: on DFS only */
    uint64_t off = 0;
    assert_int_equal(get(&fx->st, "d0", segs, &n), KVP_OK);
    d0 = kvp_index_lookup(&fx->st.index, "d0", 2, kvp_index_hash("d0", 2));
    off = d0->replicas[0].offset;
    kvp_dispatch_conn_closed(&fx->st, C_DFS); /* kill -9 of its owner */
    kvp_segment_t *seg = kvp_segment_table_get(&fx->st.segments, dfs);
    assert_non_null(seg);
    assert_true(seg->orphan);
    assert_int_equal(fx->st.stats.dfs_orphaned, 1);
    assert_int_equal(get(&fx->st, "d0", segs, &n), KVP_OK); /* still an object, on DFS */
    assert_true(n == 1 && segs[0] == dfs);
    /* no new DFS replica there, and a DFS put evicts nothing (no room to make) */
    fx->st.now_ms += 3600 * 1000;
    assert_int_equal(put_start_dfs(&fx->st, "d2", OBJ, 1, NULL, segs, &n), KVP_ERR_POOL_FULL);
    assert_int_equal(fx->st.stats.dfs_evicted, 0);
    assert_int_equal(get(&fx->st, "d0", segs, &n), KVP_OK);
    /* another shard file (or size) takes nothing over */
    uint64_t other = mount(&fx->st, 5, "h:2/dfs/0123/shard-h2-0.kvpdfs", "dfs", 65536);
    assert_non_null(kvp_segment_table_get(&fx->st.segments, dfs));
    assert_int_equal(fx->st.stats.dfs_taken_over, 0);
    /* the same shard file, mounted by a new owner: the objects are handed to it */
    uint64_t now = mount(&fx->st, 6, "h:3/dfs/0123/shard-h-0.kvpdfs", "dfs", 65536);
    assert_null(kvp_segment_table_get(&fx->st.segments, dfs));
    assert_int_equal(fx->st.stats.dfs_taken_over, 2);
    assert_int_equal(get(&fx->st, "d0", segs, &n), KVP_OK);
    assert_true(n == 1 && segs[0] == now);
    assert_int_equal(get(&fx->st, "d1", segs, &n), KVP_OK);
    assert_true(n == 2 && segs[1] == now);
    /* its owner's offer of d0 finds it there: adopted, no second replica */
    d0 = kvp_index_lookup(&fx->st.index, "d0", 2, kvp_index_hash("d0", 2));
    kvp_adopt_entry_t e = {
        .key = "d0", .key_len = 2, .version = d0->version, .offset = off, .size = OBJ, .crc32c = 9};
    uint64_t refused = fx->st.stats.adopt_refused;
    assert_int_equal(kvp_rebuild_adopt(&fx->st, kvp_segment_table_get(&fx->st.segments, now), &e),
                     KVP_OK);
    assert_int_equal(fx->st.stats.adopt_refused, refused);
    assert_int_equal(get(&fx->st, "d0", segs, &n), KVP_OK);
    assert_int_equal(n, 1);
    /* the new owner dies too; nobody takes over within the grace: the segment goes */
    kvp_dispatch_conn_closed(&fx->st, 6);
    assert_non_null(kvp_segment_table_get(&fx->st.segments, now));
    fx->st.now_ms += 61000;
    kvp_segment_limbo_expire(&fx->st);
    assert_null(kvp_segment_table_get(&fx->st.segments, now));
    assert_int_equal(get(&fx->st, "d0", segs, &n), KVP_ERR_NOT_FOUND);
    assert_int_equal(get(&fx->st, "d1", segs, &n), KVP_OK); /* its DRAM replica */
    assert_true(n == 1 && segs[0] == fx->dram);
    (void)other;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_offload_done_moves_victim_to_ssd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_offload_failure_keeps_dram, setup, teardown),
        cmocka_unit_test_setup_teardown(test_owner_gone_mid_offload_keeps_dram, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restarted_owner_adopting_drops_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ssd_full_drops_instead, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_poll_parks_when_idle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_to_ssd_is_recorded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_promotion_and_corrupt_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adoption_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dfs_replica, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dfs_full_and_eviction, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dfs_eviction, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dfs_owner_gone_and_takeover, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
