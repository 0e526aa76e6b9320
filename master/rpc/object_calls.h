/*
 * object_calls.h - object RPCs: puts, gets, removes, leases (see object_calls.c).
 */
#ifndef KVP_MASTER_RPC_OBJECT_CALLS_H
#define KVP_MASTER_RPC_OBJECT_CALLS_H

#include <stdbool.h>
#include <stdint.h>

#include "master/rpc/call.h"

/* Handlers (kvp_handler_t): dispatch.c's method table names them. */
kvp_status_t kvp_handle_put_start(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_put_end(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_put_revoke(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_put_commit(kvp_call_t *call, ProtobufCMessage *msg);
/* Free the holds (PUT_COMMIT's room placed ahead) that have an extent on segment_id: it
 * drains, nothing new goes there. Their writers' commits find them gone. */
void kvp_object_holds_drop(kvp_master_state_t *st, uint64_t segment_id);
kvp_status_t kvp_handle_remove(kvp_call_t *call, ProtobufCMessage *msg);
/* REPLICA_CLEAR: Remove, or the replicas on one segment only (Mooncake's BatchReplicaClear) */
kvp_status_t kvp_handle_replica_clear(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_exist(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_get_replica_list(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_get_size(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_lease_release(kvp_call_t *call, ProtobufCMessage *msg);

/* A connection closed: revoke its PENDING puts (at once, or by kvp_object_sweep). */
void kvp_object_conn_closed(kvp_master_state_t *st, uint64_t conn_id);
/* Closed connections' puts are being revoked over loop turns: the server's loop calls
 * kvp_object_sweep at each turn (without waiting for events) while this is true. */
bool kvp_object_sweeping(const kvp_master_state_t *st);
void kvp_object_sweep(kvp_master_state_t *st);

#endif
