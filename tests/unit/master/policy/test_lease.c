/*
 * test_lease.c - unit tests for master/lease.c: read leases that end with
 * the read.
 *
 * Drives kvp_dispatch_handle as the server does: GetReplicaList hands out
 * lease ids, LeaseRelease (one-way: no response) hands them back. What is
 * checked is what a client would see: whether a plain remove is refused,
 * whether the pool's used bytes still hold a removed object's extent,
 * whether a put into a pool held by reads in flight waits (POOL_BUSY)
 * rather than fails, and that a stale or repeated release never ends
 * somebody else's lease. The master clock is set by the tests.
 *
 * Owners (the later tests): a lease id is released only by the principal it
 * was granted to (any of its connections), or without an ACL by the
 * connection; ids are random, so a reader's id says nothing of another's;
 * a release by anyone else, the exact id or guesses near the attacker's
 * own, ends nothing and is counted.
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

#define OWNER 1 /* the segment's owner connection */
#define READER 2
#define OTHER 3
#define OBJ 4096u
#define TTL 5000u

static int setup(void **state)
{
    kvp_master_state_t *st = calloc(1, sizeof(*st));
    if (st == NULL || kvp_master_state_init(st) != KVP_OK) {
        free(st);
        return -1;
    }
    st->rng = 0x1EA5E1EA5E1EA5Eull;
    st->now_ms = 1000;
    st->config.lease_ttl_ms = TTL;
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

static void mount(kvp_master_state_t *st, uint64_t size)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.name = (char *)"seg";
    d.medium = (char *)"dram";
    d.size = size;
    d.host_id = (char *)"h";
    d.tcp_endpoint = (char *)"10.0.0.1:7000";
    d.shm_path = (char *)"/dev/shm/kvp-seg";
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 77;
    req.segment = &d;
    Kvpool__MountResponse *r =
        svc_call(st, OWNER, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    svc_msg_free(r);
}

/* PutStart of one key; its per-key status (and the response's message into msg). */
static int32_t put_start(kvp_master_state_t *st, const char *key, uint32_t pin, char *msg,
                         size_t msg_len)
{
    Kvpool__PutConfig pc = KVPOOL__PUT_CONFIG__INIT;
    pc.replica_num = 1;
    pc.pin = pin;
    pc.preferred_segment = (char *)"";
    uint64_t size = OBJ;
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.sizes = &size;
    req.n_sizes = 1;
    req.config = &pc;
    Kvpool__PutStartResponse *r =
        svc_call(st, OTHER, KVP_RPC_PUT_START, &req.base, &kvpool__put_start_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_results, 1);
    int32_t s = r->results[0]->status;
    if (msg != NULL)
        snprintf(msg, msg_len, "%s", r->message);
    svc_msg_free(r);
    return s;
}

static int32_t keys1(kvp_master_state_t *st, uint16_t method, const char *key, bool force)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.force = force;
    Kvpool__StatusesResponse *r =
        svc_call(st, OTHER, method, &req.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

static void put(kvp_master_state_t *st, const char *key, uint32_t pin)
{
    assert_int_equal(put_start(st, key, pin, NULL, 0), KVP_OK);
    uint32_t crc = 42;
    Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    req.crc32c = &crc;
    req.n_crc32c = 1;
    Kvpool__StatusesResponse *r =
        svc_call(st, OTHER, KVP_RPC_PUT_END, &req.base, &kvpool__statuses_response__descriptor);
    assert_int_equal(r->statuses[0], KVP_OK);
    svc_msg_free(r);
}

/* GetReplicaList of one present key: its lease id (never 0). */
static uint64_t read_start(kvp_master_state_t *st, const char *key)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    Kvpool__GetReplicaListResponse *r = svc_call(st, READER, KVP_RPC_GET_REPLICA_LIST, &req.base,
                                                 &kvpool__get_replica_list_response__descriptor);
    assert_int_equal(r->results[0]->status, KVP_OK);
    uint64_t id = r->results[0]->lease_id;
    assert_true(id != 0);
    assert_int_equal(r->lease_ttl_ms, TTL);
    svc_msg_free(r);
    return id;
}

/* LeaseRelease: one-way, the handler packs no response at all. */
static void read_end(kvp_master_state_t *st, const uint64_t *ids, size_t n)
{
    Kvpool__LeaseReleaseRequest req = KVPOOL__LEASE_RELEASE_REQUEST__INIT;
    req.lease_ids = (uint64_t *)ids;
    req.n_lease_ids = n;
    uint8_t body[256];
    size_t len = kvpool__lease_release_request__pack(&req, body);
    uint8_t *resp = (uint8_t *)1;
    size_t rlen = 1;
    char err[128];
    assert_int_equal(kvp_dispatch_handle(st, READER, NULL, KVP_RPC_LEASE_RELEASE, body, len, &resp,
                                         &rlen, err, sizeof(err)),
                     KVP_OK);
    assert_null(resp);
    assert_int_equal(rlen, 0);
}

static void read_end1(kvp_master_state_t *st, uint64_t id)
{
    read_end(st, &id, 1);
}

static int32_t rm(kvp_master_state_t *st, const char *key)
{
    return keys1(st, KVP_RPC_REMOVE, key, false);
}

/* The lease ends with the read: a plain remove right after it goes through. */
static void test_release_ends_lease(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "k", KVP_PIN_NONE);
    uint64_t id = read_start(st, "k");
    assert_int_equal(rm(st, "k"), KVP_ERR_LEASED);
    assert_int_equal(st->leases.live, 1);
    assert_int_equal(st->leases.bytes, OBJ);
    read_end1(st, id);
    assert_int_equal(st->leases.live, 0);
    assert_int_equal(st->leases.bytes, 0);
    assert_int_equal(rm(st, "k"), KVP_OK);
    assert_int_equal(kvp_master_used(st), 0);
}

/* Two reads in flight share the object's lease: it ends with the second release. */
static void test_two_readers(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "k", KVP_PIN_NONE);
    uint64_t a = read_start(st, "k");
    uint64_t b = read_start(st, "k");
    assert_true(a == b);
    read_end1(st, a);
    assert_int_equal(rm(st, "k"), KVP_ERR_LEASED);
    read_end1(st, b);
    assert_int_equal(rm(st, "k"), KVP_OK);
    /* one release too many (a buggy client) finds no lease: ignored */
    read_end1(st, b);
    assert_int_equal(st->leases.live, 0);
}

/* A release that comes after the TTL ended the lease never ends a newer one. */
static void test_stale_release_ignored(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "k", KVP_PIN_NONE);
    put(st, "j", KVP_PIN_NONE);
    uint64_t old = read_start(st, "k"); /* this reader hangs */
    st->now_ms += TTL - 1;
    assert_int_equal(kvp_lease_expire(st), 0);
    assert_int_equal(rm(st, "k"), KVP_ERR_LEASED);
    st->now_ms += 1;
    /* the TTL is over: unleased even before the timer reaps the slot */
    assert_int_equal(rm(st, "k"), KVP_OK);
    uint64_t fresh = read_start(st, "j"); /* may reuse the slot index */
    assert_int_equal(kvp_lease_expire(st), 0);
    uint64_t again = read_start(st, "j");
    assert_true(fresh == again);
    assert_true(fresh != old);
    read_end1(st, old); /* the hung reader wakes up: ignored */
    read_end1(st, old);
    assert_int_equal(keys1(st, KVP_RPC_REMOVE, "j", false), KVP_ERR_LEASED);
    read_end1(st, fresh);
    read_end1(st, again);
    assert_int_equal(keys1(st, KVP_RPC_REMOVE, "j", false), KVP_OK);
    /* ids the master never gave out */
    uint64_t bogus[3] = {0, UINT64_MAX, (uint64_t)12345 << 32 | 1};
    read_end(st, bogus, 3);
    assert_int_equal(st->leases.live, 0);
}

/* A forced remove of an object being read frees its extent when the read ends, not later. */
static void test_forced_remove_under_read(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "k", KVP_PIN_NONE);
    uint64_t id = read_start(st, "k");
    assert_int_equal(keys1(st, KVP_RPC_REMOVE, "k", true), KVP_OK);
    assert_int_equal(keys1(st, KVP_RPC_EXIST, "k", false), 0);
    assert_int_equal(kvp_master_used(st), OBJ); /* the reader's bytes stay put */
    put(st, "k", KVP_PIN_NONE);                 /* a new value lives elsewhere */
    assert_int_equal(kvp_master_used(st), 2 * OBJ);
    read_end1(st, id);
    assert_int_equal(kvp_master_used(st), OBJ);
    assert_int_equal(keys1(st, KVP_RPC_EXIST, "k", false), 1);
    /* no read in flight: a forced remove frees at once */
    assert_int_equal(keys1(st, KVP_RPC_REMOVE, "k", true), KVP_OK);
    assert_int_equal(kvp_master_used(st), 0);
}

/* A reader that dies: its lease (and a retired object's extent) ends by the TTL. */
static void test_dead_reader_ttl(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "k", KVP_PIN_NONE);
    read_start(st, "k");
    assert_int_equal(keys1(st, KVP_RPC_REMOVE, "k", true), KVP_OK);
    st->now_ms += TTL - 1;
    assert_int_equal(kvp_lease_expire(st), 0);
    assert_int_equal(kvp_master_used(st), OBJ);
    st->now_ms += 1;
    assert_int_equal(kvp_lease_expire(st), 1);
    assert_int_equal(kvp_master_used(st), 0);
    assert_int_equal(st->leases.expired, 1);
}

/* The owner of the segment goes away while a read is in flight: nothing dangles. */
static void test_unmount_under_read(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "k", KVP_PIN_NONE);
    put(st, "r", KVP_PIN_NONE);
    uint64_t id = read_start(st, "k");
    uint64_t id2 = read_start(st, "r");
    assert_int_equal(keys1(st, KVP_RPC_REMOVE, "r", true), KVP_OK); /* retired, held */
    kvp_dispatch_conn_closed(st, OWNER);
    assert_int_equal(keys1(st, KVP_RPC_EXIST, "k", false), 0);
    read_end1(st, id); /* late: ignored */
    read_end1(st, id2);
    assert_int_equal(st->leases.live, 0);
    st->now_ms += 2 * TTL;
    assert_int_equal(kvp_lease_expire(st), 0);
}

/* A full pool held by reads in flight: POOL_BUSY (the client waits), then room. */
static void test_pool_busy_then_room(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 4 * OBJ);
    put(st, "a", KVP_PIN_NONE);
    put(st, "b", KVP_PIN_NONE);
    put(st, "c", KVP_PIN_NONE);
    put(st, "d", KVP_PIN_NONE);
    uint64_t ids[4] = {read_start(st, "a"), read_start(st, "b"), read_start(st, "c"),
                       read_start(st, "d")};
    char msg[512];
    assert_int_equal(put_start(st, "e", KVP_PIN_NONE, msg, sizeof(msg)), KVP_ERR_POOL_BUSY);
    assert_non_null(strstr(msg, "reads in flight (4 objects)"));
    read_end1(st, ids[2]);
    /* the read of c is over: eviction may take it now */
    assert_int_equal(put_start(st, "e", KVP_PIN_NONE, NULL, 0), KVP_OK);
    assert_int_equal(keys1(st, KVP_RPC_EXIST, "c", false), 0);
    assert_int_equal(keys1(st, KVP_RPC_EXIST, "a", false), 1);
    read_end(st, ids, 2);
    read_end1(st, ids[3]);
}

/* A pool held by pinned objects is really full: POOL_FULL, and the message says so. */
static void test_pool_full_message(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 2 * OBJ);
    put(st, "a", KVP_PIN_HARD);
    assert_int_equal(put_start(st, "p", KVP_PIN_NONE, NULL, 0), KVP_OK); /* pending */
    char msg[512];
    assert_int_equal(put_start(st, "x", KVP_PIN_NONE, msg, sizeof(msg)), KVP_ERR_POOL_FULL);
    assert_non_null(strstr(msg, "pool full: 8192 of 8192 bytes used: 0 by reads in flight"));
    assert_non_null(strstr(msg, "4096 by puts not yet ended (1 objects; 0 bytes of it held ahead "
                                "for writers), 4096 by pinned objects"));
}

/* Reads whose end would free nothing (store mode, hard pins): POOL_FULL at once, no wait. */
static void test_busy_only_when_reads_give_room_back(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 2 * OBJ);
    st->config.evict = false; /* a store: ending the read frees nothing */
    put(st, "a", KVP_PIN_NONE);
    put(st, "b", KVP_PIN_NONE);
    uint64_t id = read_start(st, "a");
    assert_int_equal(put_start(st, "c", KVP_PIN_NONE, NULL, 0), KVP_ERR_POOL_FULL);
    read_end1(st, id);
    st->config.evict = true;
    assert_int_equal(keys1(st, KVP_RPC_REMOVE, "a", false), KVP_OK);
    assert_int_equal(keys1(st, KVP_RPC_REMOVE, "b", false), KVP_OK);
    put(st, "p", KVP_PIN_HARD);
    put(st, "q", KVP_PIN_HARD);
    id = read_start(st, "p"); /* hard-pinned: evictable never, read or not */
    assert_int_equal(put_start(st, "c", KVP_PIN_NONE, NULL, 0), KVP_ERR_POOL_FULL);
    /* but a forced remove of the read one: its room comes back when the read ends */
    assert_int_equal(keys1(st, KVP_RPC_REMOVE, "p", true), KVP_OK);
    assert_int_equal(put_start(st, "c", KVP_PIN_NONE, NULL, 0), KVP_ERR_POOL_BUSY);
    read_end1(st, id);
    assert_int_equal(put_start(st, "c", KVP_PIN_NONE, NULL, 0), KVP_OK);
}

/* A dead reader's lease, over by its TTL but not yet reaped by the timer, frees the room a
 * put needs: the put reaps it and fits, instead of failing. */
static void test_put_reaps_expired_lease(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 2 * OBJ);
    put(st, "a", KVP_PIN_NONE);
    put(st, "b", KVP_PIN_HARD);
    read_start(st, "a"); /* the reader dies */
    assert_int_equal(keys1(st, KVP_RPC_REMOVE, "a", true), KVP_OK);
    assert_int_equal(kvp_master_used(st), 2 * OBJ);
    st->now_ms += TTL + 100; /* before the loop's timer runs */
    assert_int_equal(put_start(st, "c", KVP_PIN_NONE, NULL, 0), KVP_OK);
    assert_int_equal(st->leases.expired, 1);
}

/* ---- owners ---- */

#define ALICE_CONN 5
#define ALICE_CONN2 6
#define BOB_CONN 7

static const kvp_principal_t alice_p = {.name = "alice",
                                        .tenant = "default",
                                        .roles = KVP_ROLE_READ | KVP_ROLE_WRITE,
                                        .tag = 0xA11CE00000000001ull};
static const kvp_principal_t bob_p = {.name = "bob",
                                      .tenant = "default",
                                      .roles = KVP_ROLE_READ | KVP_ROLE_WRITE,
                                      .tag = 0xB0B0000000000001ull};

/* GetReplicaList of one present key on connection conn as principal who (NULL: no ACL):
 * its lease id (never 0). */
static uint64_t read_start_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who,
                              const char *key)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = svc_keys(&key, 1);
    req.n_keys = 1;
    uint8_t body[256];
    size_t len = kvpool__keys_request__pack(&req, body);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    char err[128] = "";
    assert_int_equal(kvp_dispatch_handle(st, conn, who, KVP_RPC_GET_REPLICA_LIST, body, len, &resp,
                                         &rlen, err, sizeof(err)),
                     KVP_OK);
    Kvpool__GetReplicaListResponse *r = kvpool__get_replica_list_response__unpack(NULL, rlen, resp);
    free(resp);
    assert_non_null(r);
    assert_int_equal(r->results[0]->status, KVP_OK);
    uint64_t id = r->results[0]->lease_id;
    kvpool__get_replica_list_response__free_unpacked(r, NULL);
    assert_true(id != 0);
    return id;
}

/* LeaseRelease of ids[0..n) on connection conn as principal who. */
static void read_end_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who,
                        const uint64_t *ids, size_t n)
{
    Kvpool__LeaseReleaseRequest req = KVPOOL__LEASE_RELEASE_REQUEST__INIT;
    req.lease_ids = (uint64_t *)ids;
    req.n_lease_ids = n;
    size_t len = kvpool__lease_release_request__get_packed_size(&req);
    uint8_t *body = malloc(len ? len : 1);
    assert_non_null(body);
    kvpool__lease_release_request__pack(&req, body);
    uint8_t *resp = (uint8_t *)1;
    size_t rlen = 1;
    char err[128] = "";
    assert_int_equal(kvp_dispatch_handle(st, conn, who, KVP_RPC_LEASE_RELEASE, body, len, &resp,
                                         &rlen, err, sizeof(err)),
                     KVP_OK);
    free(body);
    assert_null(resp);
}

static void read_end1_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who,
                         uint64_t id)
{
    read_end_as(st, conn, who, &id, 1);
}

/* Ids around `own` an attacker would try: its index +-1..64 with its tag, its index and
 * the ones beside it with tags +-1..64 of its own, and the first 64 indexes with its own
 * tag (but its own id). At most 448. */
static size_t guesses(uint64_t own, uint64_t *out)
{
    size_t n = 0;
    uint32_t idx = (uint32_t)own, tag = (uint32_t)(own >> 32);
    for (uint32_t d = 1; d <= 64; d++) {
        out[n++] = (uint64_t)tag << 32 | (idx + d);
        out[n++] = (uint64_t)tag << 32 | (idx - d);
        out[n++] = (uint64_t)(tag + d) << 32 | idx;
        out[n++] = (uint64_t)(tag - d) << 32 | idx;
        out[n++] = (uint64_t)(tag + d) << 32 | (idx + 1);
        out[n++] = (uint64_t)(tag + d) << 32 | (idx - 1);
    }
    for (uint32_t g = 0; g < 64; g++)
        if (g != idx)
            out[n++] = (uint64_t)tag << 32 | g;
    return n;
}

/* With an ACL: bob releases alice's exact id and ids near his own; alice's lease holds
 * (a plain remove is refused), the refusals are counted, and alice's own release (from
 * another connection of hers) ends it. */
static void test_release_by_another_principal_refused(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "a", KVP_PIN_NONE);
    put(st, "b", KVP_PIN_NONE);
    uint64_t alice_id = read_start_as(st, ALICE_CONN, &alice_p, "a");
    uint64_t bob_id = read_start_as(st, BOB_CONN, &bob_p, "b");
    assert_true(alice_id != bob_id);

    read_end1_as(st, BOB_CONN, &bob_p, alice_id); /* a perfect guess, or a leak */
    assert_int_equal(st->leases.refused_owner, 1);
    assert_int_equal(rm(st, "a"), KVP_ERR_LEASED);
    uint64_t g[512];
    size_t n = guesses(bob_id, g);
    read_end_as(st, BOB_CONN, &bob_p, g, n);
    assert_int_equal(rm(st, "a"), KVP_ERR_LEASED);
    assert_true(st->leases.refused_owner + st->leases.refused_unknown >= 1 + n);
    assert_int_equal(st->leases.live, 2);
    /* bob on alice's connection is still bob */
    read_end1_as(st, ALICE_CONN, &bob_p, alice_id);
    assert_int_equal(rm(st, "a"), KVP_ERR_LEASED);

    read_end1_as(st, ALICE_CONN2, &alice_p, alice_id); /* hers, from another connection */
    assert_int_equal(rm(st, "a"), KVP_OK);
    read_end1_as(st, BOB_CONN, &bob_p, bob_id);
    assert_int_equal(rm(st, "b"), KVP_OK);
    assert_int_equal(st->leases.live, 0);
}

/* Without an ACL the owner is the connection: another connection's release (the exact id
 * or guesses) is refused; the reader's own ends the lease. */
static void test_release_by_another_connection_refused(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "a", KVP_PIN_NONE);
    put(st, "b", KVP_PIN_NONE);
    uint64_t alice_id = read_start_as(st, ALICE_CONN, NULL, "a");
    uint64_t bob_id = read_start_as(st, BOB_CONN, NULL, "b");
    read_end1_as(st, BOB_CONN, NULL, alice_id);
    uint64_t g[512];
    size_t n = guesses(bob_id, g);
    read_end_as(st, BOB_CONN, NULL, g, n);
    assert_int_equal(st->leases.refused_owner, 1);
    assert_int_equal(rm(st, "a"), KVP_ERR_LEASED);
    read_end1_as(st, ALICE_CONN2, NULL, alice_id); /* another connection: refused too */
    assert_int_equal(st->leases.refused_owner, 2);
    assert_int_equal(rm(st, "a"), KVP_ERR_LEASED);
    read_end1_as(st, ALICE_CONN, NULL, alice_id);
    assert_int_equal(rm(st, "a"), KVP_OK);
    read_end1_as(st, BOB_CONN, NULL, bob_id);
    assert_int_equal(st->leases.live, 0);
}

/* Two owners reading one object hold separate ids: one releasing its own many times (a
 * buggy or hostile client) never ends the other's read. */
static void test_shared_object_separate_ids(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "k", KVP_PIN_NONE);
    uint64_t a = read_start_as(st, ALICE_CONN, &alice_p, "k");
    uint64_t a2 = read_start_as(st, ALICE_CONN2, &alice_p, "k"); /* her second read */
    uint64_t b = read_start_as(st, BOB_CONN, &bob_p, "k");
    assert_true(a == a2); /* one owner, one id, two reads */
    assert_true(a != b);
    assert_true((a >> 32) != (b >> 32));
    for (int i = 0; i < 5; i++)
        read_end1_as(st, BOB_CONN, &bob_p, b);
    assert_int_equal(rm(st, "k"), KVP_ERR_LEASED);
    assert_true(st->leases.refused_unknown >= 4);
    read_end1_as(st, ALICE_CONN, &alice_p, a);
    assert_int_equal(rm(st, "k"), KVP_ERR_LEASED); /* her second read is still on */
    read_end1_as(st, ALICE_CONN2, &alice_p, a);
    assert_int_equal(rm(st, "k"), KVP_OK);
}

/* Ids are random: 200 grants on one slot and record (each released before the next) get
 * 200 different tags, none the last one plus or minus a little. */
static void test_ids_random(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "k", KVP_PIN_NONE);
    uint64_t ids[200];
    for (int i = 0; i < 200; i++) {
        ids[i] = read_start_as(st, ALICE_CONN, NULL, "k");
        read_end1_as(st, ALICE_CONN, NULL, ids[i]);
        assert_int_equal(st->leases.live, 0);
    }
    unsigned near = 0;
    for (int i = 0; i < 200; i++) {
        for (int j = 0; j < i; j++)
            assert_true(ids[i] != ids[j]);
        int64_t d = i > 0 ? (int64_t)(ids[i] >> 32) - (int64_t)(ids[i - 1] >> 32) : INT64_MAX;
        near += d > -1024 && d < 1024;
    }
    assert_true(near <= 1); /* 2^-21 per pair by chance */
    assert_int_equal(st->leases.refused_owner + st->leases.refused_unknown, 0);
}

/* A connection that closes (no ACL): its ids are forgotten (a release of one is unknown,
 * not another owner's), and its reads still hold until the TTL, as a dead reader's. */
static void test_closed_connection_reads_end_by_ttl(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "k", KVP_PIN_NONE);
    uint64_t id = read_start_as(st, ALICE_CONN, NULL, "k");
    kvp_dispatch_conn_closed(st, ALICE_CONN);
    read_end1_as(st, ALICE_CONN2, NULL, id); /* the client reconnected: too late */
    assert_int_equal(st->leases.refused_owner, 0);
    assert_int_equal(st->leases.refused_unknown, 1);
    assert_int_equal(rm(st, "k"), KVP_ERR_LEASED);
    st->now_ms += TTL;
    assert_int_equal(kvp_lease_expire(st), 1);
    assert_int_equal(rm(st, "k"), KVP_OK);
    /* a principal's leases outlive one of its connections (it may release on another) */
    put(st, "p", KVP_PIN_NONE);
    id = read_start_as(st, ALICE_CONN, &alice_p, "p");
    kvp_dispatch_conn_closed(st, ALICE_CONN);
    read_end1_as(st, ALICE_CONN2, &alice_p, id);
    assert_int_equal(rm(st, "p"), KVP_OK);
}

/* A slot that ends (TTL, unmount) frees its grant records: their ids are unknown after. */
static void test_ids_end_with_their_lease(void **state)
{
    kvp_master_state_t *st = *state;
    mount(st, 1 << 20);
    put(st, "k", KVP_PIN_NONE);
    uint64_t a = read_start_as(st, ALICE_CONN, &alice_p, "k");
    uint64_t b = read_start_as(st, BOB_CONN, &bob_p, "k");
    st->now_ms += TTL;
    assert_int_equal(kvp_lease_expire(st), 1);
    uint64_t a2 = read_start_as(st, ALICE_CONN, &alice_p, "k"); /* a new lease */
    read_end1_as(st, BOB_CONN, &bob_p, b);                      /* bob's old id: unknown */
    read_end1_as(st, ALICE_CONN, &alice_p, a);                  /* so is alice's */
    assert_int_equal(st->leases.refused_unknown, 2);
    assert_int_equal(rm(st, "k"), KVP_ERR_LEASED);
    read_end1_as(st, ALICE_CONN, &alice_p, a2);
    assert_int_equal(rm(st, "k"), KVP_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
        T(test_release_ends_lease),
        T(test_two_readers),
        T(test_stale_release_ignored),
        T(test_forced_remove_under_read),
        T(test_dead_reader_ttl),
        T(test_unmount_under_read),
        T(test_pool_busy_then_room),
        T(test_pool_full_message),
        T(test_busy_only_when_reads_give_room_back),
        T(test_put_reaps_expired_lease),
        T(test_release_by_another_principal_refused),
        T(test_release_by_another_connection_refused),
        T(test_shared_object_separate_ids),
        T(test_ids_random),
        T(test_closed_connection_reads_end_by_ttl),
        T(test_ids_end_with_their_lease),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
