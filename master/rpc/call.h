/*
 * call.h - what every RPC handler shares: the call it answers, the one
 * response packer, request checks and the parts of responses that name
 * replicas and segments (see call.c; the response builder is reply.h).
 */
#ifndef KVP_MASTER_RPC_CALL_H
#define KVP_MASTER_RPC_CALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.pb-c.h"
#include "common/acl.h"
#include "master/core/state.h"

/*
 * One request being handled. The dispatcher fills st, conn_id and
 * resp_desc (the method's response type; NULL: one-way) and frees the
 * request after the handler returns; the handler answers through its
 * response builder (reply.h), which packs with kvp_call_reply: that sets
 * resp/resp_len (malloc'd, the dispatcher's caller frees them).
 */
typedef struct kvp_call {
    kvp_master_state_t *st;
    uint64_t conn_id;
    const kvp_principal_t *who; /* the caller's principal; NULL: no ACL (anyone may) */
    const ProtobufCMessageDescriptor *resp_desc;
    uint8_t *resp;
    size_t resp_len;
} kvp_call_t;

/*
 * A handler: the request is already decoded (its type is the method's
 * request type, or NULL for methods whose body is ignored) and borrowed
 * until return. KVP_OK: answered (or one-way); any other status is a
 * frame-level error (the reply carries only the status).
 */
typedef kvp_status_t (*kvp_handler_t)(kvp_call_t *call, ProtobufCMessage *req);

/*
 * The one response packer: pack msg (of the method's response type) into
 * call->resp. KVP_ERR_NOMEM when out of memory (no response then). The
 * message may point into the handler's buffers and master state: they only
 * need to live until this returns.
 */
kvp_status_t kvp_call_reply(kvp_call_t *call, const ProtobufCMessage *msg);

/*
 * Data grants (common/grant.h). Before building a response that names up to `count`
 * extents: make room for their grants and read the clock (false: out of memory). Then
 * kvp_call_grant seals slot `slot`'s grant for rep (op KVP_GRANT_READ/WRITE, good for ttl_ms)
 * and points rep->grant at it; nothing when grants are off or the segment has no key.
 * version: the object's version, the grant's nonce (an owner refuses a write grant once its
 * record has that version or a later one at the extent: the put ended; a read grant once it
 * has a later one: the extent holds another object now); 0: a counter's.
 * The grants live until the next response is built: kvp_call_reply packs them first.
 */
bool kvp_call_grants_reserve(kvp_master_state_t *st, size_t count);
bool kvp_call_grant(kvp_call_t *call, Kvpool__Replica *rep, size_t slot, uint8_t op,
                    uint64_t ttl_ms, uint64_t version);

/* KVP_ERR_TOO_MANY past 65536 keys. */
kvp_status_t kvp_call_check_batch(size_t n_keys);

/* Validate a wire key and look it up (*obj_p NULL when absent). */
kvp_status_t kvp_call_key_lookup(kvp_master_state_t *st, const ProtobufCBinaryData *key,
                                 kvp_object_t **obj_p, uint64_t *hash_p);

/* Segment descriptors referenced by a response: a small set of unique ids. */
typedef struct kvp_seg_set {
    Kvpool__SegmentDesc *descs;
    Kvpool__SegmentDesc **ptrs;
    size_t n, cap;
    uint8_t *conn_keys;           /* kvp_seg_set_conn_keys: K_p and K_r, 64 bytes per descriptor */
    struct kvp_grant *shm_grants; /* ... and a MAP grant per descriptor (common/grant.h) */
    /* grant sets (kvp_call_add_replicas, data grants on): each extent handed out, with its
     * descriptor's index, in the order given; each descriptor's count (set_n, room for cap);
     * the op and lifetime of them all; sealed by kvp_seg_set_conn_keys into sets */
    struct kvp_set_ext *pend;
    size_t n_pend, cap_pend;
    uint32_t *set_n;
    uint8_t set_op;
    uint64_t set_ttl_ms;
    uint8_t *sets;
} kvp_seg_set_t;

void kvp_seg_desc_fill(Kvpool__SegmentDesc *d, const kvp_segment_t *seg);
/* Is the caller seg's owner, for what only the owner may see or do: without an ACL anyone
 * (there are no principals); with one the principal that mounted it, or an admin when
 * admin is true. */
bool kvp_call_owns_segment(const kvp_call_t *call, const kvp_segment_t *seg, bool admin);
/* d, filled from seg, as the caller may have it: its owner's client id (which names the
 * owner in SegRecord) only for seg's owner or an admin; the rest as every answer that
 * hands descriptors out has it (a client compares them field by field, segment_calls.c). */
void kvp_seg_desc_for_caller(const kvp_call_t *call, const kvp_segment_t *seg,
                             Kvpool__SegmentDesc *d);
/* Add seg's descriptor unless there (*index_p, when not NULL: its position). */
bool kvp_seg_set_add(kvp_seg_set_t *s, const kvp_segment_t *seg, size_t *index_p);
bool kvp_seg_set_finish(kvp_seg_set_t *s);
/* Each descriptor as the caller may have it (kvp_seg_desc_for_caller); then, data grants
 * on: give each descriptor the caller's connection key and tag for it, a MAP grant where
 * the caller may be handed the segment's memory, and its grant set when
 * kvp_call_add_replicas put extents in one (an answer that hands out grants, after
 * kvp_seg_set_finish). false: out of memory. */
bool kvp_seg_set_conn_keys(kvp_call_t *call, kvp_seg_set_t *s);
void kvp_seg_set_free(kvp_seg_set_t *s);

/*
 * rep's extent (its segment, offset, length) granted for op: into its segment's grant set
 * in segs (the descriptor added when not there) while data grants are on and the set has
 * room (one op and lifetime per answer: op, ttl_ms), else a grant of its own in slot
 * (kvp_call_grant). Nothing for a segment not in the table. false: out of memory.
 */
bool kvp_call_grant_extent(kvp_call_t *call, Kvpool__Replica *rep, size_t slot, kvp_seg_set_t *segs,
                           uint8_t op, uint64_t ttl_ms, uint64_t version);

/*
 * Append obj's replicas to a response under construction: reps/repptr have
 * room (sized by the caller), *nr counts what is used, segs collects the
 * descriptors. With data grants on, each replica's extent goes into its
 * segment's grant set (grant_op, good for grant_ttl_ms; one op per answer), or
 * past KVP_GRANT_SET_MAX extents gets a grant of its own. false: out of memory.
 */
bool kvp_call_add_replicas(kvp_call_t *call, const kvp_object_t *obj, Kvpool__Replica *reps,
                           Kvpool__Replica **repptr, size_t *nr, kvp_seg_set_t *segs,
                           uint8_t grant_op, uint64_t grant_ttl_ms);

#endif
