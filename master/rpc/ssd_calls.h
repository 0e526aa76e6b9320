/*
 * ssd_calls.h - the RPC of SSD segment owners: SsdTasks (see ssd_calls.c).
 */
#ifndef KVP_MASTER_RPC_SSD_CALLS_H
#define KVP_MASTER_RPC_SSD_CALLS_H

#include "master/rpc/call.h"

/* Handlers (kvp_handler_t): dispatch.c's method table names them. */
kvp_status_t kvp_handle_ssd_tasks(kvp_call_t *call, ProtobufCMessage *msg);

#endif
