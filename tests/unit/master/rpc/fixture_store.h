/*
 * fixture_store.h - a master with store semantics (no eviction, no read leases,
 * reproducible placement) for the handler tests, and one-call helpers that
 * pack a request, run it through kvp_dispatch_handle (svc_call.h) and check
 * and unpack the answer as a client would. Each test gets a fresh
 * kvp_master_state_t from setup, which teardown cleans up also when an
 * assertion fails.
 */
#ifndef KVP_TESTS_UNIT_MASTER_RPC_FIXTURE_STORE_H
#define KVP_TESTS_UNIT_MASTER_RPC_FIXTURE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.pb-c.h"
#include "master/core/state.h"

#define C1 1
#define C2 2
#define C3 3

int setup(void **state);

int teardown(void **state);

/* Handle raw bytes; returns the frame-level status, response left in *resp_p. */
kvp_status_t handle_raw(kvp_master_state_t *st, uint64_t conn, uint16_t method, const uint8_t *body,
                        size_t len, uint8_t **resp_p, size_t *resp_len_p, char *errmsg,
                        size_t errmsg_len);

/* Mount; *msg_p (optional, 256 bytes) gets the response's message. */
int32_t mount_desc_msg(kvp_master_state_t *st, uint64_t conn, Kvpool__SegmentDesc *d,
                       uint64_t *id_p, char *msg_p);

int32_t mount_desc(kvp_master_state_t *st, uint64_t conn, Kvpool__SegmentDesc *d, uint64_t *id_p);

void fill_desc(Kvpool__SegmentDesc *d);

int32_t mount_seg(kvp_master_state_t *st, uint64_t conn, const char *name, const char *host,
                  uint64_t size, uint64_t *id_p);

Kvpool__PutStartResponse *put_start(kvp_master_state_t *st, uint64_t conn, const char *const *keys,
                                    size_t n_keys, const uint64_t *sizes, size_t n_sizes,
                                    unsigned replicas, const char *preferred);

/* One key: its per-key status; *rep_p gets the first replica when OK. */
int32_t put1(kvp_master_state_t *st, uint64_t conn, const char *key, uint64_t size,
             Kvpool__Replica *rep_p);

Kvpool__StatusesResponse *keys_call(kvp_master_state_t *st, uint64_t conn, uint16_t method,
                                    const char *const *keys, size_t n);

int32_t keys1(kvp_master_state_t *st, uint64_t conn, uint16_t method, const char *key);

Kvpool__StatusesResponse *put_end(kvp_master_state_t *st, uint64_t conn, const char *const *keys,
                                  size_t n_keys, const uint32_t *crcs, size_t n_crcs);

int32_t end1(kvp_master_state_t *st, uint64_t conn, const char *key, uint32_t crc);

int32_t exist1(kvp_master_state_t *st, const char *key);

int64_t size1(kvp_master_state_t *st, const char *key);

Kvpool__GetReplicaListResponse *replicas(kvp_master_state_t *st, const char *const *keys, size_t n);

/* Per-key status of GET_REPLICA_LIST for one key. */
int32_t replicas1_status(kvp_master_state_t *st, const char *key);

typedef struct stat_snap {
    uint64_t capacity, used, objects, pending;
    size_t n_segments;
    uint64_t seg_objects_sum;
} stat_snap_t;

stat_snap_t stat_get(kvp_master_state_t *st);

#endif
