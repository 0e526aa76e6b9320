/*
 * object_priv.h - the parts of the object flows (object.c) that the transfer sessions
 * (xfer_sessions.c) reuse: the master calls on keys, PutEnd / PutRevoke, the put config's
 * check, a replica's grant, the replica order of a get and the hand-back of its leases.
 *
 * Thread: any client thread (as object.c).
 */
#ifndef KVP_CLIENT_OBJECT_PRIV_H
#define KVP_CLIENT_OBJECT_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/client_priv.h"
#include "client/transfer/xfer.h"
#include "kvpool.pb-c.h"

/* Replicas per object, at most (the master answers more: a protocol error). */
#define KVP_OBJ_REPLICAS_MAX 8

/* A KeysRequest-shaped RPC for keys[idx[0..m)] (idx NULL: keys[0..m)); the body into the
 * thread's scratch arena. */
kvp_status_t kvp_obj_keys_call(kvp_client_t *c, uint16_t method, const char *const *keys,
                               const size_t *idx, size_t m, bool force, uint8_t **resp_p,
                               size_t *rlen_p);
/* PutRevoke of keys[idx[0..m)], the puts versions[j] names (NULL: whichever this connection
 * has PENDING); the StatusesResponse body as kvp_obj_keys_call's. */
kvp_status_t kvp_obj_revoke_call(kvp_client_t *c, const char *const *keys, const size_t *idx,
                                 const uint64_t *versions, size_t m, uint8_t **resp_p,
                                 size_t *rlen_p);
/* PutEnd (sizes, crcs, masks: one per key) or PutRevoke for keys[idx[0..m)], of the puts
 * versions[j] names (their PutStart's answer; NULL: whichever this connection has PENDING);
 * PutEnd's per-key statuses to out[idx[j]] (a put the master dropped: KVP_ERR_PUT_REVOKED;
 * sent twice, its first answer lost with the connection: OK where the master has the key with
 * that size and CRC). */
void kvp_obj_end_or_revoke(kvp_client_t *c, uint16_t method, const char *const *keys,
                           const size_t *idx, const uint64_t *versions, const uint64_t *sizes,
                           const uint32_t *crcs, const uint32_t *masks, size_t m, int32_t *out);
/* config (NULL: the defaults) filled and checked into *cfg: KVP_OK or KVP_ERR_INVALID_ARG. */
kvp_status_t kvp_obj_put_config(const kvp_put_config_t *config, kvp_put_config_t *cfg);
/* The PutConfig of cfg on the wire (strings borrowed from cfg, avoid[8] the caller's). */
void kvp_obj_put_config_wire(kvp_client_t *c, const kvp_put_config_t *cfg, Kvpool__PutConfig *pc,
                             uint64_t *avoid);
/* rep's grant in an answer with descriptors segs (pointers into that answer). */
kvp_xfer_grant_t kvp_obj_rep_grant(const Kvpool__Replica *rep, Kvpool__SegmentDesc *const *segs,
                                   size_t n_segs);
/* r's replicas in the order to read them (order[0..min(n_replicas, 8))). */
void kvp_obj_order_replicas(kvp_client_t *c, Kvpool__GetReplicaResult *r, size_t *order);

#endif
