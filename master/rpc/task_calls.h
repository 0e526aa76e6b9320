/*
 * task_calls.h - copy and move tasks: TaskCreate, TaskQuery, TaskStart, TaskEnd, the
 * heartbeat's offers, a closed connection's tasks (see task_calls.c).
 */
#ifndef KVP_MASTER_RPC_TASK_CALLS_H
#define KVP_MASTER_RPC_TASK_CALLS_H

#include <stddef.h>
#include <stdint.h>

#include "master/rpc/call.h"

kvp_status_t kvp_handle_task_create(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_task_query(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_task_start(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_task_end(kvp_call_t *call, ProtobufCMessage *msg);

/* The tasks waiting for connection conn_id to start them (a heartbeat's offers), newest
 * first: at most max into out; how many. O(how many). */
size_t kvp_task_offers(kvp_master_state_t *st, uint64_t conn_id, Kvpool__TaskOffer *out,
                       size_t max);
/* conn_id closed: the tasks it runs, or was to run, fail (their extents freed). O(those). */
void kvp_task_conn_closed(kvp_master_state_t *st, uint64_t conn_id);

#endif
