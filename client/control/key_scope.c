/*
 * key_scope.c - a client's key namespace without a credential that binds its tenant
 * (key_scope.h; the master's side: master/meta/tenant.c, master/dispatch.c scope_keys,
 * master/rpc/admin_calls.c for List and RemoveByRegex).
 *
 * Cost: nothing without the scope; with it, each key of a request is copied once with its
 * prefix into a buffer of the thread's own (KVP_TBUF_KEYS: no allocation once it has grown
 * to the largest batch; never the scratch arena, whose blocks the caller still holds), and
 * a key of no tenant_id is looked at for a 0x1f in its first 64 bytes.
 *
 * Thread: any.
 */
#include "client/control/key_scope.h"

#include <string.h>

#include "client/mem/scratch.h"
#include "common/acl.h"
#include "common/rpc.h"

#define SEP '\x1f'
#define DEFAULT_NS "default"

/* Methods whose "keys" are keys as the caller gave them. */
static bool names_user_keys(uint16_t method)
{
    switch (method) {
    case KVP_RPC_PUT_START:
    case KVP_RPC_PUT_END:
    case KVP_RPC_PUT_COMMIT:
    case KVP_RPC_PUT_REVOKE:
    case KVP_RPC_GET_REPLICA_LIST:
    case KVP_RPC_EXIST:
    case KVP_RPC_REMOVE:
    case KVP_RPC_GET_SIZE:
    case KVP_RPC_REPLICA_CLEAR:
    case KVP_RPC_TASK_CREATE:
        return true;
    default:
        return false;
    }
}

/* A field of req by name and type (repeated or not); NULL: its type has none. */
static const ProtobufCFieldDescriptor *field(const ProtobufCMessage *req, const char *name,
                                             ProtobufCType type, ProtobufCLabel label)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(req->descriptor, name);
    return f != NULL && f->type == type && f->label == label ? f : NULL;
}

/* The prefix key k gets: the namespace's, or for a key of no tenant_id that reads as a
 * namespace's (a valid tenant name, then 0x1f), "default"'s; NULL: none. */
static const char *prefix_of(const kvp_key_scope_t *scope, const ProtobufCBinaryData *k,
                             size_t *len_p)
{
    if (scope->ns_len > 0) {
        *len_p = scope->ns_len;
        return scope->ns;
    }
    const void *sep = k->len > 0 ? memchr(k->data, SEP, k->len < 64 ? k->len : 64) : NULL;
    if (sep == NULL ||
        !kvp_tenant_name_valid((const char *)k->data, (size_t)((const uint8_t *)sep - k->data)))
        return NULL;
    *len_p = sizeof(DEFAULT_NS) - 1;
    return DEFAULT_NS;
}

static kvp_status_t scope_keys(const kvp_key_scope_t *scope, ProtobufCMessage *req,
                               const ProtobufCFieldDescriptor *f, kvp_key_scope_undo_t *undo)
{
    size_t n = *(const size_t *)((const char *)req + f->quantifier_offset);
    ProtobufCBinaryData **keys_p = (ProtobufCBinaryData **)((char *)req + f->offset);
    ProtobufCBinaryData *keys = *keys_p;
    size_t total = 0, plen = 0;
    bool any = false;
    for (size_t i = 0; i < n; i++)
        if (prefix_of(scope, &keys[i], &plen) != NULL) {
            total += plen + 1 + keys[i].len;
            any = true;
        }
    if (!any)
        return KVP_OK; /* keys of no tenant_id, none of which reads as prefixed */
    /* a buffer of the thread's own, not the scratch arena: the caller's arena (its
     * overflow blocks too) must outlive this packing */
    kvp_thread_buf_t *tb = kvp_thread_buf(KVP_TBUF_KEYS);
    ProtobufCBinaryData *nk =
        tb != NULL ? (ProtobufCBinaryData *)kvp_thread_buf_reserve(tb, n * sizeof(*nk) + total)
                   : NULL;
    if (nk == NULL)
        return KVP_ERR_NOMEM;
    uint8_t *p = (uint8_t *)(nk + n);
    for (size_t i = 0; i < n; i++) {
        const char *pre = prefix_of(scope, &keys[i], &plen);
        if (pre == NULL) {
            nk[i] = keys[i];
            continue;
        }
        memcpy(p, pre, plen);
        p[plen] = SEP;
        if (keys[i].len > 0)
            memcpy(p + plen + 1, keys[i].data, keys[i].len);
        nk[i].data = p;
        nk[i].len = plen + 1 + keys[i].len;
        p += nk[i].len;
    }
    undo->keys_field = keys_p;
    undo->keys = keys;
    *keys_p = nk;
    return KVP_OK;
}

kvp_status_t kvp_key_scope_apply(const kvp_key_scope_t *scope, uint16_t method,
                                 ProtobufCMessage *req, kvp_key_scope_undo_t *undo)
{
    memset(undo, 0, sizeof(*undo));
    if (scope == NULL || !scope->on || req == NULL)
        return KVP_OK;
    if (method == KVP_RPC_LIST || method == KVP_RPC_REMOVE_BY_REGEX) {
        const ProtobufCFieldDescriptor *stored =
            field(req, "stored_keys", PROTOBUF_C_TYPE_BOOL, PROTOBUF_C_LABEL_NONE);
        if (stored != NULL && *(const protobuf_c_boolean *)((const char *)req + stored->offset))
            return KVP_OK; /* a drain: keys as stored */
        const ProtobufCFieldDescriptor *f =
            field(req, "key_namespace", PROTOBUF_C_TYPE_STRING, PROTOBUF_C_LABEL_NONE);
        if (f == NULL || scope->ns_len == 0)
            return KVP_OK; /* no tenant_id: every key, as stored (the pool's operator) */
        undo->ns_field = (char **)((char *)req + f->offset);
        undo->ns = *undo->ns_field;
        *undo->ns_field = (char *)scope->ns;
        return KVP_OK;
    }
    if (!names_user_keys(method))
        return KVP_OK;
    const ProtobufCFieldDescriptor *f =
        field(req, "keys", PROTOBUF_C_TYPE_BYTES, PROTOBUF_C_LABEL_REPEATED);
    return f != NULL ? scope_keys(scope, req, f, undo) : KVP_OK;
}

void kvp_key_scope_undo(const kvp_key_scope_undo_t *undo)
{
    if (undo->keys_field != NULL)
        *undo->keys_field = undo->keys;
    if (undo->ns_field != NULL)
        *undo->ns_field = undo->ns;
}
