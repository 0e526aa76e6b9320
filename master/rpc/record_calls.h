/*
 * record_calls.h - the RPCs by which segments describe themselves: Adopt, SegRecord
 * (see record_calls.c).
 */
#ifndef KVP_MASTER_RPC_RECORD_CALLS_H
#define KVP_MASTER_RPC_RECORD_CALLS_H

#include "master/rpc/call.h"

/* Handlers (kvp_handler_t): dispatch.c's method table names them. */
kvp_status_t kvp_handle_adopt(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_seg_record(kvp_call_t *call, ProtobufCMessage *msg);

#endif
