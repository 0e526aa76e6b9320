/*
 * session.h - the client's session with its master (session.c): the shared
 * master connection (mconn.c) with what rides on it — protobuf calls, the
 * segment's (re)mount on every new connection, read leases handed back.
 *
 * Thread: any client thread.
 */
#ifndef KVP_CLIENT_CONTROL_SESSION_H
#define KVP_CLIENT_CONTROL_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "client/control/discovery.h"
#include "client/control/mconn.h"
#include "client/segment/segment.h"
#include "client/transfer/peer_table.h"
#include "common/status.h"
#include "kvpool.pb-c.h"

typedef struct kvp_session kvp_session_t;

typedef struct kvp_session_params {
    const char *master_host; /* HOST:PORT masters; ignored with disc */
    uint16_t master_port;
    kvp_discovery_t *disc; /* etcd:// masters: the leader is found through it; NULL: none */
    uint32_t timeout_ms;
    uint64_t client_id;
    kvp_segment_t *seg; /* mounted on every new connection; NULL: mounts nothing */
    kvp_peers_t *peers; /* told the segment's id at each mount (borrowed) */
    kvp_tls_t *tls;     /* TLS to the master (borrowed for the session's life); NULL: plain */
    const char *token;  /* sent in an Auth request on each connection (copied); NULL: none */
    const char *tenant; /* the segment is dedicated to this tenant (copied); NULL: shared */
    char *err;          /* when open fails, why (a TLS refusal, a wrong token); may be NULL */
    size_t err_len;
} kvp_session_params_t;

/* Connect (mounting the segment): any refusal is an error. The pointers are borrowed for the
 * session's life. */
kvp_status_t kvp_session_open(const kvp_session_params_t *params, kvp_session_t **s_p);
/* Close it and drop what was queued for it. NULL: nothing. */
void kvp_session_close(kvp_session_t *s);
/* Its connection (for its address, state and counters). */
kvp_mconn_t *kvp_session_mconn(kvp_session_t *s);
struct kvp_key_scope;
/* The namespace of the keys its calls name (client/control/key_scope.h), set once, before
 * any call names a key (copied). */
void kvp_session_set_key_scope(kvp_session_t *s, const struct kvp_key_scope *scope);

/* Master RPC with reconnect (and remount of the segment) on a broken connection. The reply
 * is the thread's buffer (valid until its next call). */
kvp_status_t kvp_session_call(kvp_session_t *s, uint16_t method, const ProtobufCMessage *req,
                              uint8_t **resp_p, size_t *resp_len_p);
/* kvp_session_call, then unpack the reply as `desc`; NULL on any failure (*st_p says why). */
void *kvp_session_call_unpack(kvp_session_t *s, uint16_t method, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *desc, kvp_status_t *st_p);
/* Mount the segment again on the current connection (the master asked for it). */
kvp_status_t kvp_session_mount(kvp_session_t *s);
/* Hand back read leases after a get's transfers (no round trip: one-way). */
void kvp_session_lease_release(kvp_session_t *s, const uint64_t *ids, size_t n);

#endif
