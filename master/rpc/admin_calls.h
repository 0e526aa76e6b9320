/*
 * admin_calls.h - Ping, Stat, List, RemoveByRegex (see admin_calls.c).
 */
#ifndef KVP_MASTER_RPC_ADMIN_CALLS_H
#define KVP_MASTER_RPC_ADMIN_CALLS_H

#include <stdint.h>

#include "master/rpc/call.h"

/* Handlers (kvp_handler_t): dispatch.c's method table names them. */
kvp_status_t kvp_handle_ping(kvp_call_t *call, ProtobufCMessage *msg);
/* Auth reaches the table only on a master without an ACL (server.c answers it otherwise):
 * KVP_ERR_UNSUPPORTED, it takes no token. */
kvp_status_t kvp_handle_auth(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_stat(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_list(kvp_call_t *call, ProtobufCMessage *msg);
kvp_status_t kvp_handle_remove_by_regex(kvp_call_t *call, ProtobufCMessage *msg);

#endif
