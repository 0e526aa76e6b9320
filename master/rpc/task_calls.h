/*
 * task_calls.h - copy and move tasks: TaskCreate, TaskQuery, TaskStart, TaskEnd (see
 * task_calls.c).
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

/* The tasks waiting for connection conn_id to start them (a heartbeat's offers): at most
 * max into out; how many. */
size_t kvp_task_offers(kvp_master_state_t *st, uint64_t conn_id, Kvpool__TaskOffer *out,
                       size_t max);
/* conn_id closed: the tasks it runs, or was to run, fail (their extents freed). */
void kvp_task_conn_closed(kvp_master_state_t *st, uint64_t conn_id);
/* The timer: tasks past their deadline fail; moves whose source replica waits for its read
 * leases to end finish once they have. */
void kvp_task_tick(kvp_master_state_t *st);

#endif
