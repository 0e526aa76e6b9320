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

/* Record a task of kind on obj, PENDING, for the owner of `source` (checked by the caller:
 * a DRAM segment with a replica; targets: ids of segments that may take one); NULL: out of
 * memory. */
kvp_task_t *kvp_task_add(kvp_master_state_t *st, const kvp_object_t *obj, uint8_t kind,
                         const kvp_segment_t *source, const uint64_t *targets, unsigned n_targets);
/* A DRAM segment holding a replica of obj to copy from (one not draining first); NULL. */
kvp_segment_t *kvp_task_source(kvp_master_state_t *st, const kvp_object_t *obj);
/* Take obj's replica on segment_id out of it and free its extent (the caller checked that no
 * read leases obj); none there, or its last replica: nothing. false: out of memory. */
bool kvp_task_drop_replica(kvp_master_state_t *st, kvp_object_t *obj, uint64_t segment_id);
/* A task's status (KVP_TASK_*), or -1: unknown (never, or trimmed). */
int kvp_task_status(kvp_master_state_t *st, uint64_t id_hi, uint64_t id_lo);

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
