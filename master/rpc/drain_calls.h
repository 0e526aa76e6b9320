/*
 * drain_calls.h - Drain, MoveStart, MoveEnd (see drain_calls.c).
 */
#ifndef KVP_MASTER_RPC_DRAIN_CALLS_H
#define KVP_MASTER_RPC_DRAIN_CALLS_H

#include <stdint.h>

#include "master/rpc/call.h"

/* Handlers (kvp_handler_t): dispatch.c's method table names them. */
kvp_status_t kvp_handle_drain(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_move_start(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_move_end(kvp_call_t *call, ProtobufCMessage *msg);

/* A connection closed: free the destinations of its unfinished moves. */
void kvp_drain_conn_closed(kvp_master_state_t *st, uint64_t conn_id);

#endif
