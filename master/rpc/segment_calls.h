/*
 * segment_calls.h - Mount, Unmount, Heartbeat (see segment_calls.c).
 */
#ifndef KVP_MASTER_RPC_SEGMENT_CALLS_H
#define KVP_MASTER_RPC_SEGMENT_CALLS_H

#include <stdint.h>

#include "master/rpc/call.h"

/* Handlers (kvp_handler_t): dispatch.c's method table names them. */
kvp_status_t kvp_handle_mount(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_unmount(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_heartbeat(kvp_call_t *call, ProtobufCMessage *msg);

/* A connection closed: unmount the segments it mounted. */
void kvp_segment_conn_closed(kvp_master_state_t *st, uint64_t conn_id);
/* Drop the limbos (meta/limbo.c) whose --segment-grace has passed (the master's timer). */
void kvp_segment_limbo_expire(kvp_master_state_t *st);

#endif
