/*
 * test_put_commit.c - PUT_COMMIT's holds (master/rpc/object_calls.c): room placed ahead for a
 * connection, a key committed onto it in one call, and every way a hold ends: used, freed
 * unwritten, given back, its connection closed, its put timeout, its segment drained; and
 * what nobody else may do with it. Store semantics (fixture_store.h).
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

#include "common/acl.h"
#include "common/grant.h"
#include "common/rpc.h"
#include "kvpool.pb-c.h"
#include "master/core/state.h"
#include "master/policy/eviction.h"
#include "master/rpc/object_calls.h"
#include "tests/unit/master/rpc/fixture_store.h"
#include "tests/unit/master/svc_call.h"

#define SEG (64u << 20)
#define OBJ 4096u

/* A PUT_COMMIT of n keys, each on holds[i] (0: a PutStart's key), asking for `want` holds of
 * `size`; masks NULL: every replica written. The answer (svc_msg_free it). */
static Kvpool__PutCommitResponse *commit(kvp_master_state_t *st, uint64_t conn,
                                         const char *const *keys, const uint64_t *holds,
                                         const uint64_t *sizes, const uint32_t *masks, size_t n,
                                         uint32_t want, uint64_t size)
{
    uint32_t *crcs = calloc(n + 1, sizeof(*crcs));
    assert_non_null(crcs);
    Kvpool__PutCommitRequest req = KVPOOL__PUT_COMMIT_REQUEST__INIT;
    req.keys = svc_keys(keys, n);
    req.n_keys = n;
    req.holds = (uint64_t *)holds;
    req.n_holds = n;
    req.crc32c = crcs;
    req.n_crc32c = n;
    req.sizes = (uint64_t *)sizes;
    req.n_sizes = n;
    req.written_mask = (uint32_t *)masks;
    req.n_written_mask = masks != NULL ? n : 0;
    Kvpool__HoldRequest hr = KVPOOL__HOLD_REQUEST__INIT;
    hr.count = want;
    hr.size = size;
    if (want > 0)
        req.hold = &hr;
    Kvpool__PutCommitResponse *r =
        svc_call(st, conn, KVP_RPC_PUT_COMMIT, &req.base, &kvpool__put_commit_response__descriptor);
    free(crcs);
    return r;
}

/* n holds of OBJ bytes for conn into ids[]. */
static void hold(kvp_master_state_t *st, uint64_t conn, size_t n, uint64_t *ids)
{
    Kvpool__PutCommitResponse *r = commit(st, conn, NULL, NULL, NULL, NULL, 0, (uint32_t)n, OBJ);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_holds, n);
    assert_int_equal(r->n_segments, 1); /* the segment its replicas name, to reach it */
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(r->holds[i]->size, OBJ);
        assert_int_equal(r->holds[i]->n_replicas, 1);
        assert_int_equal(r->holds[i]->replicas[0]->length, OBJ);
        ids[i] = r->holds[i]->id;
    }
    svc_msg_free(r);
}

/* One key on one hold: its status. */
static int32_t commit1(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t id,
                       uint64_t size, uint32_t mask)
{
    const char *keys[] = {key};
    Kvpool__PutCommitResponse *r = commit(st, conn, keys, &id, &size, &mask, 1, 0, 0);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_statuses, 1);
    int32_t s = r->statuses[0];
    svc_msg_free(r);
    return s;
}

/* Holds are room, not objects: a key committed onto one is visible at once, and only then. */
static void test_commit_makes_the_key_visible(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", SEG, NULL), KVP_OK);
    uint64_t ids[4];
    hold(st, C2, 4, ids);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.objects, 0); /* neither objects nor puts under way */
    assert_int_equal(s.pending, 0);
    assert_int_equal(s.used, 0);
    assert_int_equal(s.seg_objects_sum, 0);
    assert_int_equal(st->holds, 4);
    assert_int_equal(st->held_bytes, 4 * OBJ);
    assert_int_equal(exist1(st, "a"), 0);
    assert_int_equal(commit1(st, C2, "a", ids[0], OBJ, 1), KVP_OK);
    assert_int_equal(exist1(st, "a"), 1);
    assert_int_equal(size1(st, "a"), OBJ);
    s = stat_get(st);
    assert_int_equal(s.objects, 1);
    assert_int_equal(s.used, OBJ);
    assert_int_equal(st->holds, 3);
    assert_int_equal(st->stats.holds_used, 1);
    /* a hold is taken once */
    assert_int_equal(commit1(st, C2, "b", ids[0], OBJ, 1), KVP_ERR_NOT_FOUND);
    assert_int_equal(exist1(st, "b"), 0);
}

/* Another connection's hold is nobody else's: it cannot commit it, nor give it back. */
static void test_another_connections_hold(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", SEG, NULL), KVP_OK);
    uint64_t id;
    hold(st, C2, 1, &id);
    assert_int_equal(commit1(st, C3, "x", id, OBJ, 1), KVP_ERR_NOT_FOUND);
    assert_int_equal(exist1(st, "x"), 0);
    Kvpool__PutCommitRequest req = KVPOOL__PUT_COMMIT_REQUEST__INIT;
    req.release = &id;
    req.n_release = 1;
    svc_msg_free(
        svc_call(st, C3, KVP_RPC_PUT_COMMIT, &req.base, &kvpool__put_commit_response__descriptor));
    assert_int_equal(st->holds, 1);
    assert_int_equal(commit1(st, C2, "x", id, OBJ, 1), KVP_OK); /* still its owner's */
    assert_int_equal(exist1(st, "x"), 1);
}

/* A key refused keeps the hold for its writer; none written frees it. */
static void test_refusals_and_unwritten(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", SEG, NULL), KVP_OK);
    assert_int_equal(put1(st, C2, "old", OBJ, NULL), KVP_OK);
    assert_int_equal(end1(st, C2, "old", 7), KVP_OK);
    uint64_t ids[2];
    hold(st, C2, 2, ids);
    assert_int_equal(commit1(st, C2, "old", ids[0], OBJ, 1), KVP_ERR_EXISTS);
    assert_int_equal(commit1(st, C2, "n1", ids[0], OBJ + 64, 1), KVP_ERR_INVALID_ARG);
    assert_int_equal(st->holds, 2);
    assert_int_equal(commit1(st, C2, "n1", ids[0], OBJ, 1), KVP_OK);
    assert_int_equal(commit1(st, C2, "n2", ids[1], OBJ, 0), KVP_ERR_IO); /* freed */
    assert_int_equal(exist1(st, "n2"), 0);
    assert_int_equal(st->holds, 0);
    assert_int_equal(st->held_bytes, 0);
    assert_int_equal(commit1(st, C2, "n2", ids[1], OBJ, 1), KVP_ERR_NOT_FOUND);
    stat_snap_t s = stat_get(st);
    assert_int_equal(s.used, 2 * OBJ); /* "old" and "n1": nothing else held */
}

/* Given back, a closed connection, the put timeout, a drain: each ends holds, room freed. */
static void test_every_end_frees_the_room(void **state)
{
    kvp_master_state_t *st = *state;
    uint64_t seg;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", SEG, &seg), KVP_OK);
    uint64_t ids[3];
    hold(st, C2, 3, ids);
    Kvpool__PutCommitRequest req = KVPOOL__PUT_COMMIT_REQUEST__INIT;
    req.release = ids;
    req.n_release = 2;
    svc_msg_free(
        svc_call(st, C2, KVP_RPC_PUT_COMMIT, &req.base, &kvpool__put_commit_response__descriptor));
    assert_int_equal(st->holds, 1);
    /* a closed connection's holds stay until their put timeout (its writer may still be
     * writing into them), and nobody can commit them meanwhile */
    hold(st, C2, 1, ids + 1);
    kvp_object_conn_closed(st, C2);
    assert_int_equal(st->holds, 2);
    assert_int_equal(commit1(st, C2 + 10, "late", ids[2], OBJ, 1), KVP_ERR_NOT_FOUND);
    st->now_ms += st->config.put_timeout_ms + 1;
    kvp_expire_puts(st);
    assert_int_equal(st->holds, 0);
    assert_int_equal(kvp_segment_table_used(&st->segments), 0);
    assert_int_equal(commit1(st, C2, "late", ids[0], OBJ, 1), KVP_ERR_NOT_FOUND);
    assert_int_equal(st->stats.holds_gone, 2);

    hold(st, C2, 2, ids);
    Kvpool__DrainRequest dr = KVPOOL__DRAIN_REQUEST__INIT;
    dr.segment_id = seg;
    Kvpool__DrainResponse *d =
        svc_call(st, C1, KVP_RPC_DRAIN, &dr.base, &kvpool__drain_response__descriptor);
    assert_int_equal(d->status, KVP_OK);
    assert_int_equal(d->pending, 0); /* the drain waits for no hold */
    svc_msg_free(d);
    assert_int_equal(st->holds, 0);
    assert_int_equal(kvp_segment_table_used(&st->segments), 0);
}

/* What one request can take: 1024 holds at most, room held a 64th of the pool at most, none in
 * the last eighth of a pool that does not evict; a request past the bounds is refused whole. */
static void test_bounds(void **state)
{
    kvp_master_state_t *st = *state;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", SEG, NULL), KVP_OK);
    Kvpool__PutCommitResponse *r = commit(st, C2, NULL, NULL, NULL, NULL, 0, 100000, 64);
    assert_int_equal(r->n_holds, 1024);
    svc_msg_free(r);
    r = commit(st, C3, NULL, NULL, NULL, NULL, 0, 1024, 1u << 20);
    assert_int_equal(r->n_holds, 0); /* 1 MiB of 64 MiB, of which 64 KiB is already held */
    assert_true(strstr(r->message, "room held ahead is at its bound") != NULL);
    assert_true(st->held_bytes <= SEG / 64);
    svc_msg_free(r);

    const char *keys[1025];
    uint64_t holds[1025], sizes[1025];
    for (size_t i = 0; i < 1025; i++) {
        keys[i] = "k";
        holds[i] = 1;
        sizes[i] = OBJ;
    }
    r = commit(st, C2, keys, holds, sizes, NULL, 1025, 0, 0);
    assert_int_equal(r->status, KVP_ERR_INVALID_ARG);
    svc_msg_free(r);
    uint64_t before = st->holds;
    r = commit(st, C2, keys, holds, sizes, NULL, 2, 1, 0); /* a hold of 0 bytes: none */
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_holds, 0);
    svc_msg_free(r);
    assert_int_equal(st->holds, before);

    /* a size whose replicas' bytes pass 2^64: refused before any bound is reckoned with it */
    Kvpool__PutCommitRequest req = KVPOOL__PUT_COMMIT_REQUEST__INIT;
    Kvpool__HoldRequest hr = KVPOOL__HOLD_REQUEST__INIT;
    Kvpool__PutConfig pc = KVPOOL__PUT_CONFIG__INIT;
    pc.replica_num = 2;
    hr.count = 4;
    hr.size = (UINT64_MAX / 2) + 1 + OBJ; /* x 2: 2 * OBJ + 2 after wrapping */
    hr.config = &pc;
    req.hold = &hr;
    r = svc_call(st, C2, KVP_RPC_PUT_COMMIT, &req.base, &kvpool__put_commit_response__descriptor);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_holds, 0);
    assert_true(strstr(r->message, "past any pool") != NULL);
    svc_msg_free(r);
    assert_int_equal(st->holds, before);
}

/* In a full cache a hold is placed by evicting: then room held ahead stays a sliver, 1/512 of
 * the DRAM tier (a hold that evicts takes a cached object out one batch early). */
static void test_a_full_cache_holds_a_sliver(void **state)
{
    kvp_master_state_t *st = *state;
    st->config.evict = true;
    assert_int_equal(mount_seg(st, C1, "seg", "h1", 2u << 20, NULL), KVP_OK);
    char key[32];
    for (int i = 0; i < 512; i++) { /* full: 512 objects of 4 KiB */
        snprintf(key, sizeof(key), "o%d", i);
        assert_int_equal(put1(st, C2, key, OBJ, NULL), KVP_OK);
        assert_int_equal(end1(st, C2, key, 1), KVP_OK);
    }
    Kvpool__PutCommitResponse *r = commit(st, C2, NULL, NULL, NULL, NULL, 0, 4, OBJ);
    assert_int_equal(r->n_holds, 1); /* 4 KiB: 1/512 of 2 MiB */
    assert_true(strstr(r->message, "room held ahead is at its bound") != NULL);
    svc_msg_free(r);
    assert_int_equal(stat_get(st).objects, 511); /* one evicted for it */
}

/* Segment "seg" (SEG bytes, host h1, shm path shm) mounted on C1, again (remount) or first: the
 * answer (svc_msg_free it). */
static Kvpool__MountResponse *mount_one(kvp_master_state_t *st, bool remount, const char *shm)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.name = (char *)"seg";
    d.medium = (char *)"dram";
    d.size = SEG;
    d.host_id = (char *)"h1";
    d.tcp_endpoint = (char *)"10.0.0.1:7000";
    d.shm_path = (char *)shm;
    d.rdma_endpoint = (char *)"";
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = 1001;
    req.segment = &d;
    req.remount = remount;
    Kvpool__MountResponse *mr =
        svc_call(st, C1, KVP_RPC_MOUNT, &req.base, &kvpool__mount_response__descriptor);
    assert_int_equal(mr->status, KVP_OK);
    return mr;
}

/* A segment mounted again (its master restarted, its owner's connection broke) takes no new
 * replica for a moment: bytes under its earlier mount's holds may still land. A put then waits
 * (POOL_BUSY: the client asks again), it does not evict elsewhere; afterwards it is placed. */
static void test_a_remounted_segment_is_quiet_a_moment(void **state)
{
    kvp_master_state_t *st = *state;
    Kvpool__MountResponse *mr = mount_one(st, true, "/dev/shm/kvp-seg");
    kvp_segment_t *seg = kvp_segment_table_get(&st->segments, mr->segment_id);
    svc_msg_free(mr);
    assert_non_null(seg);
    assert_true(seg->quiet_until_ms != 0);
    assert_int_equal(put1(st, C2, "k", OBJ, NULL), KVP_ERR_POOL_BUSY);
    Kvpool__PutCommitResponse *r = commit(st, C2, NULL, NULL, NULL, NULL, 0, 4, OBJ);
    assert_int_equal(r->n_holds, 0); /* no hold there either */
    svc_msg_free(r);
    seg->quiet_until_ms = 1; /* (its moment passed) */
    st->segments.quiet_until_ms = 1;
    assert_int_equal(put1(st, C2, "k", OBJ, NULL), KVP_OK);
}

/* With data grants on, a PUT_COMMIT's holds are sealed as one grant set a segment (one MAC,
 * which the writer keeps while it keeps a hold of it), not a grant each: every hold's replica
 * names its own extent of its descriptor's set, which the owner's check takes for a write by
 * the caller's principal; a key committed on a hold is visible as ever. */
static void test_holds_grants_are_one_set(void **state)
{
    kvp_master_state_t *st = *state;
    static const kvp_principal_t W = {
        .name = "w", .tenant = "default", .roles = KVP_ROLE_READ | KVP_ROLE_WRITE, .tag = 0x5151};
    st->grants_on = true;
    st->config.put_timeout_ms = 30000;
    Kvpool__MountResponse *mr = mount_one(st, false, "/dev/shm/kvp-seg");
    assert_int_equal(mr->grant_key.len, KVP_GRANT_KEY_LEN);
    kvp_grant_mac_t *mac;
    assert_int_equal(kvp_grant_mac_create(mr->grant_key.data, &mac), KVP_OK);
    uint64_t seg_id = mr->segment_id, epoch = mr->grant_epoch;
    svc_msg_free(mr);

    enum { N = 8 };
    Kvpool__PutCommitRequest req = KVPOOL__PUT_COMMIT_REQUEST__INIT;
    Kvpool__HoldRequest hr = KVPOOL__HOLD_REQUEST__INIT;
    hr.count = N;
    hr.size = OBJ;
    req.hold = &hr;
    Kvpool__PutCommitResponse *r = svc_call_as(st, C2, &W, KVP_RPC_PUT_COMMIT, &req.base,
                                               &kvpool__put_commit_response__descriptor);
    assert_non_null(r);
    assert_int_equal(r->n_holds, N);
    assert_int_equal(r->n_segments, 1);
    const ProtobufCBinaryData *set = &r->segments[0]->grant_set;
    assert_int_equal(set->len, kvp_grant_set_len(N)); /* one set of N extents */
    kvp_grant_set_hdr_t h;
    memcpy(&h, set->data, sizeof(h));
    kvp_grant_extent_t ext[N];
    memcpy(ext, set->data + sizeof(h), sizeof(ext));
    const char *why = NULL;
    assert_int_equal(
        kvp_grant_set_check(mac, &h, ext, KVP_GRANT_WRITE, seg_id, epoch, kvp_grant_now_ms(), &why),
        KVP_OK);
    assert_int_equal(h.principal, W.tag);
    assert_int_not_equal(
        kvp_grant_set_check(mac, &h, ext, KVP_GRANT_READ, seg_id, epoch, kvp_grant_now_ms(), &why),
        KVP_OK); /* a write grant, for writing only */
    bool seen[N] = {false};
    for (size_t i = 0; i < N; i++) {
        const Kvpool__Replica *rep = r->holds[i]->replicas[0];
        assert_int_equal(rep->grant.len, 0); /* no grant of its own */
        assert_int_equal(rep->grant_set, 1);
        assert_true(rep->grant_index < N);
        assert_false(seen[rep->grant_index]);
        seen[rep->grant_index] = true;
        assert_true(kvp_grant_extent_covers(&ext[rep->grant_index], rep->offset, OBJ));
    }
    uint64_t id = r->holds[0]->id;
    svc_msg_free(r);
    kvp_grant_mac_destroy(mac);
    const char *keys[] = {"a"};
    uint64_t sizes[] = {OBJ};
    uint32_t crcs[] = {0}, masks[] = {1};
    req = (Kvpool__PutCommitRequest)KVPOOL__PUT_COMMIT_REQUEST__INIT;
    req.keys = svc_keys(keys, 1);
    req.n_keys = req.n_holds = req.n_sizes = req.n_crc32c = req.n_written_mask = 1;
    req.holds = &id;
    req.sizes = sizes;
    req.crc32c = crcs;
    req.written_mask = masks;
    r = svc_call_as(st, C2, &W, KVP_RPC_PUT_COMMIT, &req.base,
                    &kvpool__put_commit_response__descriptor);
    assert_int_equal(r->statuses[0], KVP_OK);
    svc_msg_free(r);
    assert_int_equal(exist1(st, "a"), 1);
}

/* The hold answer of principal who on conn (4 holds of OBJ): its one descriptor's K_p and MAP
 * grant (zeroed when none) into kp/map. */
static void keys_of(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who,
                    uint8_t kp[KVP_GRANT_KEY_LEN], kvp_grant_t *map)
{
    Kvpool__PutCommitRequest req = KVPOOL__PUT_COMMIT_REQUEST__INIT;
    Kvpool__HoldRequest hr = KVPOOL__HOLD_REQUEST__INIT;
    hr.count = 4;
    hr.size = OBJ;
    req.hold = &hr;
    Kvpool__PutCommitResponse *r = svc_call_as(st, conn, who, KVP_RPC_PUT_COMMIT, &req.base,
                                               &kvpool__put_commit_response__descriptor);
    assert_int_equal(r->n_segments, 1);
    const Kvpool__SegmentDesc *d = r->segments[0];
    assert_int_equal(d->conn_key.len, KVP_GRANT_KEY_LEN);
    assert_int_equal(d->conn_tag, who->tag);
    memcpy(kp, d->conn_key.data, KVP_GRANT_KEY_LEN);
    memset(map, 0, sizeof(*map));
    if (d->shm_grant.len == sizeof(*map))
        memcpy(map, d->shm_grant.data, sizeof(*map));
    svc_msg_free(r);
}

/* Each answer hands a principal its connection key and (one that may map the segment) a MAP
 * grant for every descriptor: derived once and handed out again (the segment keeps the last
 * principal's), never another principal's; a MAP grant is sealed anew when the master's
 * epoch changed (credentials reloaded) or half its life is gone. */
static void test_descriptor_keys_derived_once(void **state)
{
    kvp_master_state_t *st = *state;
    static const kvp_principal_t A = {
        .name = "a", .tenant = "default", .roles = KVP_ROLE_ADMIN, .tag = 0x0a0a};
    static const kvp_principal_t B = {
        .name = "b", .tenant = "default", .roles = KVP_ROLE_READ | KVP_ROLE_WRITE, .tag = 0x0b0b};
    st->grants_on = true;
    st->config.put_timeout_ms = 30000;
    Kvpool__MountResponse *mr = mount_one(st, false, "@kvp-seg");
    kvp_grant_mac_t *mac;
    assert_int_equal(kvp_grant_mac_create(mr->grant_key.data, &mac), KVP_OK);
    uint64_t seg_id = mr->segment_id;
    svc_msg_free(mr);
    uint8_t want_a[KVP_GRANT_KEY_LEN], want_b[KVP_GRANT_KEY_LEN], kp[KVP_GRANT_KEY_LEN];
    assert_true(kvp_grant_conn_key(mac, A.tag, want_a));
    assert_true(kvp_grant_conn_key(mac, B.tag, want_b));
    kvp_grant_t m1, m2;
    const char *why = NULL;

    keys_of(st, C2, &A, kp, &m1);
    assert_memory_equal(kp, want_a, sizeof(kp));
    assert_int_equal(kvp_grant_check(mac, &m1, KVP_GRANT_MAP, seg_id, 0, SEG, st->grant_epoch,
                                     kvp_grant_now_ms(), &why),
                     KVP_OK);
    assert_int_equal(m1.principal, A.tag);
    keys_of(st, C2, &A, kp, &m2); /* again: the same key, the same grant */
    assert_memory_equal(kp, want_a, sizeof(kp));
    assert_memory_equal(&m2, &m1, sizeof(m1));
    keys_of(st, C3, &B, kp, &m2); /* another principal: its own key and MAP grant (no
                                     tenants: a reader and writer of every key may map it) */
    assert_memory_equal(kp, want_b, sizeof(kp));
    assert_int_equal(m2.principal, B.tag);
    keys_of(st, C2, &A, kp, &m2); /* back: A's key, a MAP grant of A's */
    assert_memory_equal(kp, want_a, sizeof(kp));
    assert_int_equal(m2.principal, A.tag);
    assert_int_equal(kvp_grant_check(mac, &m2, KVP_GRANT_MAP, seg_id, 0, SEG, st->grant_epoch,
                                     kvp_grant_now_ms(), &why),
                     KVP_OK);
    st->grant_epoch++; /* (a reload draws a new epoch: the grant kept is of the old one) */
    keys_of(st, C2, &A, kp, &m1);
    assert_int_equal(m1.epoch, st->grant_epoch);
    assert_int_not_equal(m1.nonce, m2.nonce);
    assert_int_equal(kvp_grant_check(mac, &m1, KVP_GRANT_MAP, seg_id, 0, SEG, st->grant_epoch,
                                     kvp_grant_now_ms(), &why),
                     KVP_OK);
    kvp_grant_mac_destroy(mac);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_commit_makes_the_key_visible, setup, teardown),
        cmocka_unit_test_setup_teardown(test_another_connections_hold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals_and_unwritten, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_end_frees_the_room, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_full_cache_holds_a_sliver, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_remounted_segment_is_quiet_a_moment, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_holds_grants_are_one_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_descriptor_keys_derived_once, setup, teardown),
    };
    return cmocka_run_group_tests_name("put_commit", tests, NULL, NULL);
}
