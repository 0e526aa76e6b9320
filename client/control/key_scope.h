/*
 * key_scope.h - a client's key namespace when no credential binds its tenant (docs/python.md,
 * "Tenant ids"): the keys of its requests stored as the master stores an ACL tenant's.
 *
 * A client given tenant_id T, talking to a master with no ACL (or with no credential that
 * names a principal), sends every key it names as T 0x1f KEY; a client with no tenant_id
 * sends its keys as given, but one that reads as another namespace's (a tenant name and
 * 0x1f at its start) as "default" 0x1f KEY. So two tenant_ids never meet on a key, and no
 * key a client names can be another namespace's: the mapping from (tenant, key) to the key
 * stored is one to one, and the same as the master's for an ACL's tenants
 * (master/meta/tenant.c), so objects of T are found alike with and without the ACL. List
 * and RemoveByRegex of a client with a tenant_id name its namespace (key_namespace): the
 * master answers its keys only, as given. With a credential that binds a tenant the master
 * scopes every key itself, and nothing is done here (the scope is off).
 *
 * Thread: any; the scope is set before the first call and read only after.
 */
#ifndef KVP_CLIENT_CONTROL_KEY_SCOPE_H
#define KVP_CLIENT_CONTROL_KEY_SCOPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "kvpool_status.h"

typedef struct kvp_key_scope {
    bool on;     /* false: keys go as given (the master scopes by the credential) */
    char ns[64]; /* the tenant_id; "": none (the default namespace) */
    size_t ns_len;
} kvp_key_scope_t;

/* What kvp_key_scope_apply changed in a request, for kvp_key_scope_undo. */
typedef struct kvp_key_scope_undo {
    ProtobufCBinaryData **keys_field; /* the request's keys array pointer; NULL: untouched */
    ProtobufCBinaryData *keys;        /* ... its value before */
    char **ns_field;                  /* the request's key_namespace; NULL: untouched */
    char *ns;
} kvp_key_scope_undo_t;

/*
 * Rewrite the keys of a request of `method` that names keys of the caller's (Put*, Exist,
 * Get*, Remove, ReplicaClear, TaskCreate) into the calling thread's scratch arena
 * (kvp_scratch_alloc: the caller holds a mark and releases it after packing), or set its
 * key_namespace (List of keys as given, RemoveByRegex). Other methods (a segment owner's:
 * MoveStart, a List of stored keys, SegRecord, ...) are left alone. KVP_ERR_NOMEM: the
 * request is unchanged.
 */
kvp_status_t kvp_key_scope_apply(const kvp_key_scope_t *scope, uint16_t method,
                                 ProtobufCMessage *req, kvp_key_scope_undo_t *undo);
/* Put the request back as it was. */
void kvp_key_scope_undo(const kvp_key_scope_undo_t *undo);

#endif
