/*
 * service_internal.h - helpers shared by the master's RPC handlers
 * (service.c: objects and segments; service_admin.c: liveness, listing,
 * bulk remove, drain). Master loop thread only.
 */
#ifndef KVP_MASTER_SERVICE_INTERNAL_H
#define KVP_MASTER_SERVICE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "kvpool.pb-c.h"
#include "master/master.h"

/* Pack `msg` of protobuf-c type `type` into a malloc'd buffer; return NOMEM on failure. */
#define KVP_PACK_RESPONSE(type, msg, resp_p, len_p)                                                \
    do {                                                                                           \
        size_t n_ = type##__get_packed_size(msg);                                                  \
        uint8_t *b_ = malloc(n_ ? n_ : 1);                                                         \
        if (b_ == NULL)                                                                            \
            return KVP_ERR_NOMEM;                                                                  \
        type##__pack(msg, b_);                                                                     \
        *(resp_p) = b_;                                                                            \
        *(len_p) = n_;                                                                             \
    } while (0)

/* Segment descriptors referenced by a response: a small set of unique ids. */
typedef struct seg_set {
    Kvpool__SegmentDesc *descs;
    Kvpool__SegmentDesc **ptrs;
    size_t n, cap;
} kvp_seg_set_t;

void kvp_svc_desc_fill(Kvpool__SegmentDesc *d, const kvp_segment_t *seg);
bool kvp_svc_seg_set_add(kvp_seg_set_t *s, const kvp_segment_t *seg);
bool kvp_svc_seg_set_finish(kvp_seg_set_t *s);
void kvp_svc_seg_set_free(kvp_seg_set_t *s);

/*
 * Append obj's replicas to a response under construction: reps/repptr have
 * room (sized by the caller), *nr counts what is used, segs collects the
 * descriptors. false: out of memory.
 */
bool kvp_svc_add_replicas(kvp_master_state_t *st, const kvp_object_t *obj, Kvpool__Replica *reps,
                          Kvpool__Replica **repptr, size_t *nr, kvp_seg_set_t *segs);

/* KVP_ERR_TOO_MANY past KVP_MAX_BATCH keys. */
kvp_status_t kvp_svc_check_batch(size_t n_keys);

/* Validate a wire key and look it up (*obj_p NULL when absent). */
kvp_status_t kvp_svc_key_lookup(kvp_master_state_t *st, const ProtobufCBinaryData *key,
                                kvp_object_t **obj_p, uint64_t *hash_p);

/* Free an extent that belongs to no object. */
void kvp_svc_extent_free(kvp_master_state_t *st, const kvp_replica_t *rep);

/* Unlink a COMPLETE object and retire it (kept while reads of it are in flight). */
void kvp_svc_object_remove(kvp_master_state_t *st, kvp_object_t *obj);

/* Pack a StatusesResponse. */
kvp_status_t kvp_svc_pack_statuses(int32_t status, int32_t *statuses, size_t n, uint8_t **resp_p,
                                   size_t *resp_len_p);

/* Handlers in service_admin.c (same contract as kvp_service_handle). */
kvp_status_t kvp_svc_heartbeat(kvp_master_state_t *st, uint64_t conn_id, const uint8_t *body,
                               size_t len, uint8_t **resp_p, size_t *resp_len_p);
kvp_status_t kvp_svc_list(kvp_master_state_t *st, const uint8_t *body, size_t len, uint8_t **resp_p,
                          size_t *resp_len_p);
kvp_status_t kvp_svc_remove_by_regex(kvp_master_state_t *st, const uint8_t *body, size_t len,
                                     uint8_t **resp_p, size_t *resp_len_p);
kvp_status_t kvp_svc_drain(kvp_master_state_t *st, const uint8_t *body, size_t len,
                           uint8_t **resp_p, size_t *resp_len_p);
kvp_status_t kvp_svc_move_start(kvp_master_state_t *st, uint64_t conn_id, const uint8_t *body,
                                size_t len, uint8_t **resp_p, size_t *resp_len_p);
kvp_status_t kvp_svc_move_end(kvp_master_state_t *st, uint64_t conn_id, const uint8_t *body,
                              size_t len, uint8_t **resp_p, size_t *resp_len_p);
/* A connection closed: free the destinations of its unfinished moves. */
void kvp_svc_moves_conn_closed(kvp_master_state_t *st, uint64_t conn_id);

#endif
