/*
 * fixture_leases.h - a master with store semantics (no eviction, so that placement
 * never frees anything behind a test's back) and read leases of 5000 ms, its
 * clock st->now_ms set by the tests; and one-call helpers that pack a request,
 * run it through kvp_dispatch_handle (svc_call.h) from connections 1, 2 and 3
 * and check and unpack the answer as a client would (statuses, sizes, segment
 * ids and offsets). kvp_master_used and per-segment used bytes (seg_used) are
 * the independent view of which extents are held. teardown
 * (kvp_master_state_cleanup) must free everything: the ASan build turns any
 * leak into a failure.
 */
#ifndef KVP_TESTS_UNIT_MASTER_RPC_FIXTURE_LEASES_H
#define KVP_TESTS_UNIT_MASTER_RPC_FIXTURE_LEASES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.pb-c.h"
#include "master/core/state.h"

#define C1 1
#define C2 2
#define C3 3
#define MIB (1u << 20)
#define SZ 1000u  /* object size in most tests ... */
#define EXT 1024u /* ... and the extent it takes (rounded up to 64) */

int setup(void **state);

int teardown(void **state);

Kvpool__MountResponse *mount_raw(kvp_master_state_t *st, uint64_t conn, const char *name,
                                 const char *host, uint64_t size);

uint64_t mount_seg(kvp_master_state_t *st, uint64_t conn, const char *name, const char *host,
                   uint64_t size);

/* What a client learns about one key: status, size, CRC, replicas. */
typedef struct rep {
    uint64_t seg, off, len;
} rep_t;

typedef struct view {
    int32_t status;
    uint64_t size;
    uint32_t crc;
    size_t n;
    rep_t r[KVP_MAX_REPLICAS];
} view_t;

void copy_reps(view_t *v, Kvpool__Replica **reps, size_t n);

/* One-key PutStart with a config; the per-key status and replicas. */
view_t put_cfg(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
               unsigned replicas, const char *preferred, bool upsert);

/* put_cfg naming n_avoid segments the writer could not reach lately (avoid_segments). */
view_t put_avoid(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
                 unsigned replicas, const char *preferred, bool upsert, uint64_t *avoid,
                 size_t n_avoid);

view_t put1(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size);

view_t upsert1(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size);

Kvpool__StatusesResponse *put_end(kvp_master_state_t *st, uint64_t conn, const char *const *keys,
                                  size_t n_keys, const uint32_t *crcs, const uint32_t *masks,
                                  size_t n_masks);

int32_t end_mask1(kvp_master_state_t *st, uint64_t conn, const char *key, uint32_t crc,
                  const uint32_t *mask);

int32_t end1(kvp_master_state_t *st, uint64_t conn, const char *key, uint32_t crc);

/* PutStart + PutEnd, both must succeed; the replicas. */
view_t put_done(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
                unsigned replicas, const char *preferred, uint32_t crc);

int32_t keys1(kvp_master_state_t *st, uint64_t conn, uint16_t method, const char *key, bool force);

int32_t exist1(kvp_master_state_t *st, const char *key);

/* GetReplicaList for one key (grants a read lease when found). */
view_t grl1(kvp_master_state_t *st, const char *key);

typedef struct stat_snap {
    uint64_t used, objects, pending, moved;
} stat_snap_t;

stat_snap_t stat_get(kvp_master_state_t *st);

uint64_t seg_used(kvp_master_state_t *st, uint64_t id);

int32_t heartbeat(kvp_master_state_t *st, uint64_t conn, const uint64_t *ids, size_t n,
                  bool *remount_p, uint64_t *drain, size_t *n_drain_p);

/* A heartbeat that says which segment table version the client knows: how many
 * descriptors came back (ids into out[], names checked non-empty) and the version. */
size_t heartbeat_table(kvp_master_state_t *st, uint64_t conn, uint64_t known, uint64_t *version_p,
                       uint64_t *out, size_t cap);

/* Drain by name (or by id when name is NULL); msg (256 bytes, optional) gets the message. */
int32_t drain(kvp_master_state_t *st, uint64_t conn, const char *name, uint64_t id, uint64_t *id_p,
              char *msg);

Kvpool__MoveStartResponse *move_start(kvp_master_state_t *st, uint64_t conn, uint64_t from,
                                      const char *const *keys, size_t n);

/* Whole-request status of a one-key MoveStart. */
int32_t move_start_status(kvp_master_state_t *st, uint64_t conn, uint64_t from, const char *key);

Kvpool__StatusesResponse *move_end(kvp_master_state_t *st, uint64_t conn, uint64_t from,
                                   const char *const *keys, size_t n_keys, const int32_t *statuses,
                                   size_t n_statuses);

int32_t move_end1(kvp_master_state_t *st, uint64_t conn, uint64_t from, const char *key,
                  int32_t copy_status);

Kvpool__ListResponse *list(kvp_master_state_t *st, const char *pattern, uint64_t seg,
                           uint64_t cursor, uint32_t limit);

Kvpool__RemoveByRegexResponse *rbr(kvp_master_state_t *st, const char *pattern, bool force,
                                   bool all);

/* Objects removed while being read, kept by their lease until the read ends. */
unsigned graveyard_len(const kvp_master_state_t *st);

#endif
