/*
 * dispatch.h - the master's method table: method id -> request type,
 * handler, response type (see dispatch.c).
 */
#ifndef KVP_MASTER_DISPATCH_H
#define KVP_MASTER_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "common/acl.h"
#include "master/rpc/call.h"
#include "master/core/state.h"

typedef struct kvp_method {
    uint16_t id;                                 /* kvp_rpc_method_t */
    const char *name;                            /* for logs and tests */
    const ProtobufCMessageDescriptor *req_desc;  /* NULL: the body is ignored */
    const ProtobufCMessageDescriptor *resp_desc; /* NULL: one-way, or an empty response */
    kvp_handler_t handler;
    uint32_t role; /* KVP_ROLE_* a principal needs to call it (master/auth/acl.h); 0: any */
    bool scoped;   /* its "keys" are the caller's: checked against its patterns and, with an
                      ACL, made its tenant's (master/meta/tenant.h) before the handler runs */
} kvp_method_t;

/* The row for a method id, or NULL when the master has none. */
const kvp_method_t *kvp_dispatch_lookup(uint16_t method);
/* Rows of the table (for tests: every row, once). */
const kvp_method_t *kvp_dispatch_table(size_t *n_p);

/*
 * Handle one request body for `method` from connection conn_id, on behalf of
 * `who` (NULL: no ACL, --auth none or protected mode). With a principal, the method's
 * role and every key the request names (its repeated `keys` field) are checked first:
 * KVP_ERR_DENIED, with why in errmsg, and nothing is done. On KVP_OK
 * *resp_p is a malloc'd packed response (caller frees; NULL with length 0
 * for an empty body). A non-OK return is a frame-level error (undecodable
 * body, unknown method): the caller replies with the status and `errmsg`.
 */
kvp_status_t kvp_dispatch_handle(kvp_master_state_t *st, uint64_t conn_id,
                                 const kvp_principal_t *who, uint16_t method, const uint8_t *body,
                                 size_t body_len, uint8_t **resp_p, size_t *resp_len_p,
                                 char *errmsg, size_t errmsg_len);

/* A connection closed: end its moves, revoke its PENDING puts, unmount its segments. */
void kvp_dispatch_conn_closed(kvp_master_state_t *st, uint64_t conn_id);

#endif
