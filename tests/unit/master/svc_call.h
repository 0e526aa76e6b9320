/*
 * svc_call.h - request/response plumbing shared by the master's handler
 * unit tests (rpc/, policy/, ha/): pack a protobuf request, run it through
 * kvp_dispatch_handle, unpack the reply.
 */
#ifndef KVP_TESTS_UNIT_MASTER_SVC_CALL_H
#define KVP_TESTS_UNIT_MASTER_SVC_CALL_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "master/dispatch.h"
#include "master/meta/placement.h"
#include "master/policy/eviction.h"
#include "master/policy/lease.h"
#include "master/core/state.h"

/* A fresh master state as kvp_master_state_init leaves it (*state), and its cleanup: a
 * cmocka setup/teardown pair. */
int svc_state_setup(void **state);
int svc_state_teardown(void **state);

/* Pack req, handle it (must be frame-level OK), unpack the response as resp_desc. */
void *svc_call(kvp_master_state_t *st, uint64_t conn, uint16_t method, const ProtobufCMessage *req,
               const ProtobufCMessageDescriptor *resp_desc);

/* The same as principal who (NULL: no ACL); NULL when the handler answered nothing. */
void *svc_call_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who,
                  uint16_t method, const ProtobufCMessage *req,
                  const ProtobufCMessageDescriptor *resp_desc);

/* Free a message svc_call returned. */
void svc_msg_free(void *msg);

/* Keys as wire bytes (pointing into the strings); valid until the next call. */
ProtobufCBinaryData *svc_keys(const char *const *keys, size_t n);

#endif
