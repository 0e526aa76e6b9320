/*
 * dispatch.c - the method table and the one path every request takes.
 *
 * Design: one row per method: its id, the protobuf-c type of its request
 * (NULL: the body is ignored, as for Ping and Stat), the type of its
 * response (NULL: none is packed: one-way LeaseRelease, or Ping's empty
 * body) and its handler. kvp_dispatch_handle looks the row up, decodes the
 * body with the request type (undecodable: KVP_ERR_PROTOCOL), runs the
 * handler, which answers through kvp_call_reply (rpc/call.c, the one
 * packer), and frees the request on every path. No switch on method ids: a
 * new method is a handler and a row. The table is indexed by id, so a
 * lookup is O(1) and an id outside it is KVP_ERR_UNKNOWN_METHOD.
 *
 * Thread: master loop only.
 */
#include "master/dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macros.h"
#include "common/log.h"
#include "common/rpc.h"
#include "master/auth/decode_cost.h"
#include "master/rpc/admin_calls.h"
#include "master/rpc/drain_calls.h"
#include "master/rpc/object_calls.h"
#include "master/rpc/segment_calls.h"
#include "master/rpc/record_calls.h"
#include "master/rpc/ssd_calls.h"
#include "master/rpc/task_calls.h"
#include "master/meta/tenant.h"

#define ROW(id_, name_, req_, resp_, handler_, role_)                                              \
    [id_] = {.id = id_,                                                                            \
             .name = name_,                                                                        \
             .req_desc = req_,                                                                     \
             .resp_desc = resp_,                                                                   \
             .handler = handler_,                                                                  \
             .role = role_,                                                                        \
             .scoped = (role_) == KVP_ROLE_READ || (role_) == KVP_ROLE_WRITE}

#define ANY 0u
#define READ KVP_ROLE_READ
#define WRITE KVP_ROLE_WRITE
#define SEGMENT KVP_ROLE_SEGMENT
#define ADMIN KVP_ROLE_ADMIN

static const kvp_method_t methods[KVP_RPC_METHOD_MAX + 1] = {
    ROW(KVP_RPC_PING, "Ping", NULL, NULL, kvp_handle_ping, ANY),
    ROW(KVP_RPC_MOUNT, "Mount", &kvpool__mount_request__descriptor,
        &kvpool__mount_response__descriptor, kvp_handle_mount, SEGMENT),
    ROW(KVP_RPC_UNMOUNT, "Unmount", &kvpool__unmount_request__descriptor,
        &kvpool__unmount_response__descriptor, kvp_handle_unmount, SEGMENT),
    ROW(KVP_RPC_PUT_START, "PutStart", &kvpool__put_start_request__descriptor,
        &kvpool__put_start_response__descriptor, kvp_handle_put_start, WRITE),
    ROW(KVP_RPC_PUT_END, "PutEnd", &kvpool__put_end_request__descriptor,
        &kvpool__statuses_response__descriptor, kvp_handle_put_end, WRITE),
    ROW(KVP_RPC_PUT_REVOKE, "PutRevoke", &kvpool__keys_request__descriptor,
        &kvpool__statuses_response__descriptor, kvp_handle_put_revoke, WRITE),
    ROW(KVP_RPC_GET_REPLICA_LIST, "GetReplicaList", &kvpool__keys_request__descriptor,
        &kvpool__get_replica_list_response__descriptor, kvp_handle_get_replica_list, READ),
    ROW(KVP_RPC_EXIST, "Exist", &kvpool__keys_request__descriptor,
        &kvpool__statuses_response__descriptor, kvp_handle_exist, READ),
    ROW(KVP_RPC_REMOVE, "Remove", &kvpool__keys_request__descriptor,
        &kvpool__statuses_response__descriptor, kvp_handle_remove, WRITE),
    ROW(KVP_RPC_GET_SIZE, "GetSize", &kvpool__keys_request__descriptor,
        &kvpool__get_size_response__descriptor, kvp_handle_get_size, READ),
    ROW(KVP_RPC_STAT, "Stat", NULL, &kvpool__stat_response__descriptor, kvp_handle_stat, ANY),
    ROW(KVP_RPC_HEARTBEAT, "Heartbeat", &kvpool__heartbeat_request__descriptor,
        &kvpool__heartbeat_response__descriptor, kvp_handle_heartbeat, ANY),
    ROW(KVP_RPC_LIST, "List", &kvpool__list_request__descriptor, &kvpool__list_response__descriptor,
        kvp_handle_list, ANY),
    ROW(KVP_RPC_REMOVE_BY_REGEX, "RemoveByRegex", &kvpool__remove_by_regex_request__descriptor,
        &kvpool__remove_by_regex_response__descriptor, kvp_handle_remove_by_regex, WRITE),
    ROW(KVP_RPC_DRAIN, "Drain", &kvpool__drain_request__descriptor,
        &kvpool__drain_response__descriptor, kvp_handle_drain, SEGMENT),
    ROW(KVP_RPC_MOVE_START, "MoveStart", &kvpool__move_start_request__descriptor,
        &kvpool__move_start_response__descriptor, kvp_handle_move_start, SEGMENT),
    ROW(KVP_RPC_MOVE_END, "MoveEnd", &kvpool__move_end_request__descriptor,
        &kvpool__statuses_response__descriptor, kvp_handle_move_end, SEGMENT),
    ROW(KVP_RPC_LEASE_RELEASE, "LeaseRelease", &kvpool__lease_release_request__descriptor, NULL,
        kvp_handle_lease_release, READ),
    ROW(KVP_RPC_SSD_TASKS, "SsdTasks", &kvpool__ssd_tasks_request__descriptor,
        &kvpool__ssd_tasks_response__descriptor, kvp_handle_ssd_tasks, SEGMENT),
    ROW(KVP_RPC_ADOPT, "Adopt", &kvpool__adopt_request__descriptor,
        &kvpool__adopt_response__descriptor, kvp_handle_adopt, SEGMENT),
    ROW(KVP_RPC_SEG_RECORD, "SegRecord", &kvpool__seg_record_request__descriptor,
        &kvpool__seg_record_response__descriptor, kvp_handle_seg_record, SEGMENT),
    ROW(KVP_RPC_AUTH, "Auth", &kvpool__auth_request__descriptor, &kvpool__auth_response__descriptor,
        kvp_handle_auth, ANY),
    ROW(KVP_RPC_TASK_CREATE, "TaskCreate", &kvpool__task_create_request__descriptor,
        &kvpool__task_create_response__descriptor, kvp_handle_task_create, WRITE),
    ROW(KVP_RPC_TASK_QUERY, "TaskQuery", &kvpool__task_query_request__descriptor,
        &kvpool__task_query_response__descriptor, kvp_handle_task_query, READ),
    ROW(KVP_RPC_TASK_START, "TaskStart", &kvpool__task_start_request__descriptor,
        &kvpool__task_start_response__descriptor, kvp_handle_task_start, SEGMENT),
    ROW(KVP_RPC_TASK_END, "TaskEnd", &kvpool__task_end_request__descriptor,
        &kvpool__statuses_response__descriptor, kvp_handle_task_end, SEGMENT),
    ROW(KVP_RPC_REPLICA_CLEAR, "ReplicaClear", &kvpool__replica_clear_request__descriptor,
        &kvpool__statuses_response__descriptor, kvp_handle_replica_clear, WRITE),
    ROW(KVP_RPC_PUT_COMMIT, "PutCommit", &kvpool__put_commit_request__descriptor,
        &kvpool__put_commit_response__descriptor, kvp_handle_put_commit, WRITE),
};

const kvp_method_t *kvp_dispatch_lookup(uint16_t method)
{
    if (method >= KVP_ARRAY_SIZE(methods) || methods[method].handler == NULL)
        return NULL;
    return &methods[method];
}

const kvp_method_t *kvp_dispatch_table(size_t *n_p)
{
    *n_p = KVP_ARRAY_SIZE(methods);
    return methods;
}

/* The repeated bytes field "keys" of a request (keys batches, PutStart, PutEnd); NULL when
 * its type has none. */
static ProtobufCBinaryData *keys_of(ProtobufCMessage *req, size_t *n_p)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(req->descriptor, "keys");
    if (f == NULL || f->type != PROTOBUF_C_TYPE_BYTES || f->label != PROTOBUF_C_LABEL_REPEATED)
        return NULL;
    *n_p = *(const size_t *)((const char *)req + f->quantifier_offset);
    return *(ProtobufCBinaryData **)((char *)req + f->offset);
}

/* May `who` touch every key the request names (its patterns)? NULL when so, else the first
 * that it may not. */
static const ProtobufCBinaryData *key_refused(const kvp_principal_t *who, ProtobufCMessage *req)
{
    size_t n = 0;
    const ProtobufCBinaryData *keys = keys_of(req, &n);
    for (size_t i = 0; keys != NULL && i < n; i++)
        if (!kvp_principal_may_key(who, keys[i].data, keys[i].len))
            return &keys[i];
    return NULL;
}

/* Does this key of the default tenant need the "default" prefix (it starts with what reads
 * as another tenant's prefix)? Other tenants' keys always get theirs. */
static bool needs_prefix(const kvp_principal_t *who, const ProtobufCBinaryData *key)
{
    return who->tenant_id != 0 || kvp_tenant_prefix_len((const char *)key->data, key->len) > 0;
}

static bool scratch_reserve(kvp_master_state_t *st, size_t bytes, size_t n)
{
    if (bytes > st->scope_cap) {
        uint8_t *b = realloc(st->scope_buf, bytes);
        if (b == NULL)
            return false;
        st->scope_buf = b;
        st->scope_cap = bytes;
    }
    if (n > st->scope_orig_cap) {
        uint8_t **o = realloc(st->scope_orig, n * sizeof(*o));
        if (o == NULL)
            return false;
        st->scope_orig = o;
        st->scope_orig_cap = n;
    }
    return true;
}

/*
 * Tenants: the keys a request names become its tenant's stored keys: TENANT 0x1f KEY, or
 * for the default tenant the key as given (unless it reads as prefixed: then "default"
 * 0x1f KEY), written into the state's scratch; st->scope_orig keeps the decoded ones, put
 * back by unscope_keys before the request is freed. Nothing a client sends can name
 * another tenant's key: a prefix is always the caller's, and a tenant's name has no 0x1f.
 * *scoped_p: whether any key was rewritten.
 */
static kvp_status_t scope_keys(kvp_master_state_t *st, const kvp_principal_t *who,
                               ProtobufCMessage *req, bool *scoped_p)
{
    *scoped_p = false;
    size_t n = 0;
    ProtobufCBinaryData *keys = keys_of(req, &n);
    if (keys == NULL || n == 0)
        return KVP_OK;
    size_t plen = strlen(who->tenant), total = 0, rewrite = 0;
    for (size_t i = 0; i < n; i++)
        if (needs_prefix(who, &keys[i])) {
            total += plen + 1 + keys[i].len;
            rewrite++;
        }
    if (rewrite == 0)
        return KVP_OK; /* the default tenant's keys are stored as given */
    if (!scratch_reserve(st, total, n))
        return KVP_ERR_NOMEM;
    uint8_t *p = st->scope_buf;
    for (size_t i = 0; i < n; i++) {
        st->scope_orig[i] = keys[i].data;
        if (!needs_prefix(who, &keys[i]))
            continue;
        memcpy(p, who->tenant, plen);
        p[plen] = KVP_TENANT_SEP;
        if (keys[i].len > 0)
            memcpy(p + plen + 1, keys[i].data, keys[i].len);
        keys[i].data = p;
        keys[i].len += plen + 1;
        p += keys[i].len;
    }
    *scoped_p = true;
    return KVP_OK;
}

static void unscope_keys(kvp_master_state_t *st, const kvp_principal_t *who, ProtobufCMessage *req)
{
    size_t n = 0, plen = strlen(who->tenant);
    ProtobufCBinaryData *keys = keys_of(req, &n);
    for (size_t i = 0; i < n; i++)
        if (keys[i].data != st->scope_orig[i]) {
            keys[i].data = st->scope_orig[i];
            keys[i].len -= plen + 1;
        }
}

/*
 * A request going on over loop turns (its handler set st->call_again) stays decoded here
 * until its last turn, one per connection: a later turn neither decodes it again (65536
 * keys: milliseconds a turn, which made a batch of many turns cost several times its work)
 * nor checks its keys against the principal's patterns again (done at its first turn, as
 * for any request under way); its keys are scoped to the tenant at each turn (in the
 * state's scratch, which other requests use between turns).
 */
typedef struct held_req {
    struct held_req *next;
    const kvp_master_state_t *st;
    uint64_t conn_id;
    uint16_t method;
    ProtobufCMessage *req;
} held_req_t;

static held_req_t *held_reqs;

/* The request this connection has under way, taken off the list when it is this call's
 * (again, the same method); NULL: none (one left of another request is freed). */
static ProtobufCMessage *held_req_take(const kvp_master_state_t *st, uint64_t conn_id,
                                       uint16_t method, bool again)
{
    for (held_req_t **pp = &held_reqs; *pp != NULL; pp = &(*pp)->next) {
        held_req_t *h = *pp;
        if (h->st != st || h->conn_id != conn_id)
            continue;
        *pp = h->next;
        ProtobufCMessage *req = h->req;
        bool same = h->method == method;
        free(h);
        if (again && same)
            return req;
        protobuf_c_message_free_unpacked(req, NULL);
        return NULL;
    }
    return NULL;
}

/* Keep req for the connection's next turn; false: no memory (it is decoded again then). */
static bool held_req_keep(const kvp_master_state_t *st, uint64_t conn_id, uint16_t method,
                          ProtobufCMessage *req)
{
    held_req_t *h = malloc(sizeof(*h));
    if (h == NULL)
        return false;
    *h =
        (held_req_t){.next = held_reqs, .st = st, .conn_id = conn_id, .method = method, .req = req};
    held_reqs = h;
    return true;
}

kvp_status_t kvp_dispatch_handle(kvp_master_state_t *st, uint64_t conn_id,
                                 const kvp_principal_t *who, uint16_t method, const uint8_t *body,
                                 size_t body_len, uint8_t **resp_p, size_t *resp_len_p,
                                 char *errmsg, size_t errmsg_len)
{
    *resp_p = NULL;
    *resp_len_p = 0;
    /* a batch under way (st->call_again) goes on only in its handler: refused here, it is
     * answered, and ends (its handler drops what it held at the connection's next call of it,
     * or at its close) */
    bool again = st->call_again;
    st->call_again = false;
    const kvp_method_t *m = kvp_dispatch_lookup(method);
    if (m == NULL) {
        snprintf(errmsg, errmsg_len, "unknown method %u", method);
        return KVP_ERR_UNKNOWN_METHOD;
    }
    /* admin may call everything; others need the method's role */
    if (who != NULL && !(who->roles & KVP_ROLE_ADMIN) && (who->roles & m->role) != m->role) {
        char have[64], need[64];
        snprintf(errmsg, errmsg_len, "principal %s (roles %s) may not call %s: it needs role %s",
                 who->name, kvp_roles_str(who->roles, have, sizeof(have)), m->name,
                 kvp_roles_str(m->role, need, sizeof(need)));
        st->stats.refused_role++;
        return KVP_ERR_DENIED;
    }
    ProtobufCMessage *req = held_req_take(st, conn_id, method, again);
    bool resumed = req != NULL;
    kvp_status_t status = KVP_ERR_PROTOCOL;
    if (!resumed && m->req_desc != NULL) {
        /* what the decode would allocate, judged from the wire first (auth/decode_cost.h) */
        kvp_decode_cost_t cost;
        char why[200];
        if (!kvp_decode_cost(m->req_desc, body, body_len, &cost, why, sizeof(why))) {
            snprintf(errmsg, errmsg_len, "%s", why);
            st->stats.refused_decode_cost++;
            KVP_LOG_WARN_LIMITED("connection %llu (principal %s): %s", (unsigned long long)conn_id,
                                 who != NULL ? who->name : "-", why);
            return KVP_ERR_TOO_MANY;
        }
        req = protobuf_c_message_unpack(m->req_desc, NULL, body_len, body);
        if (req == NULL)
            goto out;
    }
    const ProtobufCBinaryData *bad =
        who != NULL && req != NULL && m->scoped && !resumed ? key_refused(who, req) : NULL;
    if (bad != NULL) {
        snprintf(errmsg, errmsg_len,
                 "principal %s may not touch key '%.*s' (outside its key patterns); nothing "
                 "in this %s was done",
                 who->name, (int)(bad->len > 200 ? 200 : bad->len), (const char *)bad->data,
                 m->name);
        st->stats.refused_key++;
        protobuf_c_message_free_unpacked(req, NULL);
        return KVP_ERR_DENIED;
    }
    bool scoped = false;
    if (who != NULL && req != NULL && m->scoped && st->tenants_on &&
        (status = scope_keys(st, who, req, &scoped)) != KVP_OK) {
        protobuf_c_message_free_unpacked(req, NULL);
        goto out;
    }
    kvp_call_t call = {.st = st, .conn_id = conn_id, .who = who, .resp_desc = m->resp_desc};
    st->call_again = again;
    status = m->handler(&call, req);
    if (scoped)
        unscope_keys(st, who, req);
    if (req != NULL && !(st->call_again && held_req_keep(st, conn_id, method, req)))
        protobuf_c_message_free_unpacked(req, NULL);
    if (status != KVP_OK) {
        free(call.resp);
        goto out;
    }
    *resp_p = call.resp;
    *resp_len_p = call.resp_len;
out:
    if (status == KVP_ERR_PROTOCOL)
        snprintf(errmsg, errmsg_len, "cannot decode the body of method %u (%zu bytes)", method,
                 body_len);
    else if (status != KVP_OK)
        snprintf(errmsg, errmsg_len, "%s", kvp_strerror(status));
    return status;
}

void kvp_dispatch_conn_closed(kvp_master_state_t *st, uint64_t conn_id)
{
    (void)held_req_take(st, conn_id, 0, false); /* a request under way: freed */
    kvp_drain_conn_closed(st, conn_id);
    kvp_task_conn_closed(st, conn_id);
    kvp_object_conn_closed(st, conn_id);
    kvp_segment_conn_closed(st, conn_id);
}
