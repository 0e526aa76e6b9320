/*
 * session.c - the client's session with its master (session.h): the master
 * connection (mconn.c) with protobuf calls, the segment's (re)mount, and
 * read leases handed back.
 *
 * Every thread calls through one kvp_mconn_t: requests are in flight
 * together and matched to their replies by id. When a connection is
 * replaced, on_ready (below) runs on the new one before any call can use
 * it: the segment is mounted again (empty in the master's view: PENDING
 * puts and the mount were bound to the old connection) and the lease
 * releases queued while there was no connection are sent.
 *
 * Lease releases are one-way frames sent by the getter itself, on the
 * shared connection, so "get, then remove" from one thread reaches the
 * master in that order. With no connection they wait in rel_ids.
 *
 * Thread: any client thread. The segment's state lock orders a remount
 * against a drain's change of its state (never held across a call: on_ready,
 * which takes it, may run inside any call); rel_lock guards the release queue.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/control/session.h"
#include "client/control/key_scope.h"
#include "client/mem/scratch.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/macros.h"
#include "common/sock.h"
#include "kvpool.pb-c.h"

struct kvp_session {
    kvp_mconn_t *mc; /* shared by all threads */
    char tenant[64]; /* the segment's tenant (MountRequest.tenant); "": shared */
    kvp_segment_t *seg;
    kvp_peers_t *peers;
    uint64_t client_id;
    kvp_key_scope_t scope; /* the keys' namespace without a credential's tenant (key_scope.h) */
    /* read leases to hand back, kept while there is no master connection */
    pthread_mutex_t rel_lock;
    uint64_t *rel_ids;
    size_t rel_n, rel_cap;
};

/* The thread's buffer for packing request bodies: grown to the largest, kept. */
static uint8_t *pack_buf(size_t len)
{
    kvp_thread_buf_t *b = kvp_thread_buf(KVP_TBUF_PACK);
    return b ? kvp_thread_buf_reserve(b, len) : NULL;
}

/* The mount request for our segment, packed into the thread's buffer, or (heap: on_ready,
 * which runs inside a call whose request is in the thread's buffer) a malloc'd one. */
static kvp_status_t mount_pack(kvp_session_t *s, bool heap, bool adopting, bool remount,
                               uint8_t **body_p, size_t *len_p)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    kvp_segment_describe(s->seg, &d);
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = s->client_id;
    req.segment = &d;
    req.adopting = adopting; /* its record is offered next (control/record_sync.c) */
    req.remount = remount;   /* mounted before: no new replica for a moment (protocol.md) */
    req.tenant = s->tenant;
    uint8_t secret[KVP_PROVE_SECRET_LEN]; /* the master asks our server to prove it */
    kvp_segment_proof_secret(s->seg, secret);
    req.proof_secret.data = secret;
    req.proof_secret.len = sizeof(secret);
    size_t len = kvpool__mount_request__get_packed_size(&req);
    uint8_t *body = heap ? malloc(len ? len : 1) : pack_buf(len);
    if (body == NULL) {
        explicit_bzero(secret, sizeof(secret));
        return KVP_ERR_NOMEM;
    }
    kvpool__mount_request__pack(&req, body);
    explicit_bzero(secret, sizeof(secret));
    *body_p = body;
    *len_p = len;
    return KVP_OK;
}

/* Take the master's answer to a mount (owned: resp is malloc'd, freed here). adopting: the
 * record thread is to offer the record (control/record_sync.c). */
static kvp_status_t mount_reply(kvp_session_t *s, uint8_t *resp, size_t rlen, bool owned,
                                bool adopting)
{
    Kvpool__MountResponse *mr = kvpool__mount_response__unpack(NULL, rlen, resp);
    if (owned)
        free(resp);
    if (mr == NULL)
        return KVP_ERR_PROTOCOL;
    kvp_status_t st = mr->status;
    if (st == KVP_OK) {
        kvp_segment_mounted(s->seg, mr->segment_id, adopting, mr->grant_key.data, mr->grant_key.len,
                            mr->grant_epoch);
        kvp_peers_set_own(s->peers, mr->segment_id);
    } else {
        KVP_LOG_ERROR("master refused to mount segment %s: %s (%s)", kvp_segment_name(s->seg),
                      kvp_strerror(st), mr->message);
        if (mr->message[0] != '\0')
            kvp_status_note(mr->message); /* the master's words, for the caller's last error */
    }
    kvpool__mount_response__free_unpacked(mr, NULL);
    return st;
}

/* Pack a LeaseRelease of ids into the thread's buffer (heap: a malloc'd one). */
static kvp_status_t release_pack(const uint64_t *ids, size_t n, bool heap, uint8_t **body_p,
                                 size_t *len_p)
{
    Kvpool__LeaseReleaseRequest req = KVPOOL__LEASE_RELEASE_REQUEST__INIT;
    req.lease_ids = (uint64_t *)ids;
    req.n_lease_ids = n;
    size_t len = kvpool__lease_release_request__get_packed_size(&req);
    uint8_t *body = heap ? malloc(len ? len : 1) : pack_buf(len);
    if (body == NULL)
        return KVP_ERR_NOMEM;
    kvpool__lease_release_request__pack(&req, body);
    *body_p = body;
    *len_p = len;
    return KVP_OK;
}

/* Take the queued releases (the caller frees *ids_p). */
static size_t releases_take(kvp_session_t *s, uint64_t **ids_p)
{
    pthread_mutex_lock(&s->rel_lock);
    size_t n = s->rel_n;
    *ids_p = s->rel_ids;
    s->rel_ids = NULL;
    s->rel_n = s->rel_cap = 0;
    pthread_mutex_unlock(&s->rel_lock);
    return n;
}

/* Runs on the thread that opened a new connection, before anyone else can use it. */
static kvp_status_t on_ready(void *arg, kvp_mconn_t *m, kvp_chan_t *ch, bool first)
{
    kvp_session_t *s = arg;
    if (s->seg != NULL)
        kvp_segment_state_lock(s->seg);
    if (kvp_segment_state(s->seg) == KVP_SEG_MOUNTED) {
        /* The master forgot our segment with the old connection: mount it again. A
         * refusal (the master has not yet seen the old connection close) is not the
         * caller's error: the next heartbeat is told to remount and tries again. */
        uint8_t *body = NULL, *resp;
        size_t len, rlen;
        /* even a first mount waits for its record stream (record_sync.c), so that no object
         * lands on the segment before its changes are streamed */
        bool adopting = true;
        kvp_status_t st = mount_pack(s, true, adopting, !first, &body, &len);
        if (st == KVP_OK)
            st = kvp_mconn_ready_call(m, ch, KVP_RPC_MOUNT, body, len, &resp, &rlen);
        free(body);
        if (st == KVP_OK)
            st = mount_reply(s, resp, rlen, true, adopting);
        if (st != KVP_OK &&
            (first || st == KVP_ERR_IO || st == KVP_ERR_TIMEOUT || st == KVP_ERR_PROTOCOL)) {
            kvp_segment_state_unlock(s->seg);
            return st;
        }
    }
    if (s->seg != NULL)
        kvp_segment_state_unlock(s->seg);
    /* releases kept while there was no connection go out ahead of any call */
    uint64_t *ids;
    size_t n = releases_take(s, &ids);
    if (n > 0) {
        uint8_t *body = NULL;
        size_t len;
        if (release_pack(ids, n, true, &body, &len) == KVP_OK &&
            kvp_mconn_ready_send(m, ch, KVP_RPC_LEASE_RELEASE, body, len) != KVP_OK)
            KVP_LOG_WARN("cannot hand %zu read leases back to the master: they end by their TTL",
                         n);
        free(body);
    }
    free(ids);
    return KVP_OK;
}

kvp_status_t kvp_session_open(const kvp_session_params_t *params, kvp_session_t **s_p)
{
    kvp_session_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVP_ERR_NOMEM;
    s->seg = params->seg;
    s->peers = params->peers;
    s->client_id = params->client_id;
    snprintf(s->tenant, sizeof(s->tenant), "%s", params->tenant ? params->tenant : "");
    pthread_mutex_init(&s->rel_lock, NULL);
    kvp_mconn_params_t p = {.host = params->master_host,
                            .port = params->master_port,
                            .resolve = params->disc ? kvp_discovery_leader : NULL,
                            .resolve_arg = params->disc,
                            .timeout_ms = params->timeout_ms,
                            .on_ready = on_ready,
                            .arg = s,
                            .tls = params->tls,
                            .token = params->token};
    kvp_status_t st = kvp_mconn_create(&p, &s->mc);
    if (st == KVP_OK)
        st = kvp_mconn_connect(s->mc);
    if (st != KVP_OK && s->mc != NULL && params->err != NULL)
        kvp_mconn_last_error(s->mc, params->err, params->err_len);
    if (st != KVP_OK) {
        kvp_session_close(s);
        return st;
    }
    *s_p = s;
    return KVP_OK;
}

void kvp_session_close(kvp_session_t *s)
{
    if (s == NULL)
        return;
    kvp_mconn_destroy(s->mc);
    s->mc = NULL;
    uint64_t *ids;
    releases_take(s, &ids);
    free(ids);
    pthread_mutex_destroy(&s->rel_lock);
    free(s);
}

kvp_mconn_t *kvp_session_mconn(kvp_session_t *s)
{
    return s->mc;
}

kvp_status_t kvp_session_mount(kvp_session_t *s)
{
    /* the state lock is not held across the call: if the connection breaks under it, the
     * reconnect's on_ready (this very thread) takes it to mount on the new one */
    if (kvp_segment_state(s->seg) != KVP_SEG_MOUNTED)
        return KVP_OK;
    uint8_t *body, *resp;
    size_t len, rlen;
    kvp_status_t st = mount_pack(s, false, true, true, &body, &len);
    if (st == KVP_OK)
        st = kvp_mconn_call(s->mc, KVP_RPC_MOUNT, body, len, &resp, &rlen);
    if (st != KVP_OK)
        return st;
    /* a drain that began meanwhile drains the id it read; this late mount ends with the
     * connection (or the unmount at destroy), like any undrained segment */
    kvp_segment_state_lock(s->seg);
    st = kvp_segment_state(s->seg) == KVP_SEG_MOUNTED ? mount_reply(s, resp, rlen, false, true)
                                                      : KVP_OK;
    kvp_segment_state_unlock(s->seg);
    return st;
}

/* Queue ids for the next connection. */
static void releases_queue(kvp_session_t *s, const uint64_t *ids, size_t n)
{
    pthread_mutex_lock(&s->rel_lock);
    if (s->rel_n + n > s->rel_cap) {
        size_t cap = KVP_MAX(s->rel_cap * 2, KVP_MAX(s->rel_n + n, (size_t)256));
        uint64_t *p = realloc(s->rel_ids, cap * sizeof(*p));
        if (p == NULL) {
            pthread_mutex_unlock(&s->rel_lock);
            return; /* the leases end by their TTL */
        }
        s->rel_ids = p;
        s->rel_cap = cap;
    }
    memcpy(s->rel_ids + s->rel_n, ids, n * sizeof(*ids));
    s->rel_n += n;
    pthread_mutex_unlock(&s->rel_lock);
}

void kvp_session_lease_release(kvp_session_t *s, const uint64_t *ids, size_t n)
{
    if (n == 0)
        return;
    uint8_t *body;
    size_t len;
    if (release_pack(ids, n, false, &body, &len) != KVP_OK)
        return; /* the leases end by their TTL */
    kvp_status_t st = kvp_mconn_send(s->mc, KVP_RPC_LEASE_RELEASE, body, len);
    if (st == KVP_OK)
        return;
    if (st != KVP_ERR_CONNECT) {
        KVP_LOG_WARN("cannot hand %zu read leases back to the master: they end by their TTL", n);
        return;
    }
    releases_queue(s, ids, n);
    /* a connection opened since we looked took the queue before we added to it */
    if (kvp_mconn_connected(s->mc)) {
        uint64_t *q;
        size_t qn = releases_take(s, &q);
        if (qn > 0 && release_pack(q, qn, false, &body, &len) == KVP_OK &&
            kvp_mconn_send(s->mc, KVP_RPC_LEASE_RELEASE, body, len) != KVP_OK)
            KVP_LOG_WARN("cannot hand %zu read leases back to the master: they end by their TTL",
                         qn);
        free(q);
    }
}

void kvp_session_set_key_scope(kvp_session_t *s, const kvp_key_scope_t *scope)
{
    s->scope = *scope;
}

kvp_status_t kvp_session_call(kvp_session_t *s, uint16_t method, const ProtobufCMessage *req,
                              uint8_t **resp_p, size_t *resp_len_p)
{
    /* the caller's keys in its namespace, for the packing only (key_scope.h) */
    kvp_key_scope_undo_t undo;
    kvp_status_t st = kvp_key_scope_apply(&s->scope, method, (ProtobufCMessage *)req, &undo);
    size_t len = st == KVP_OK && req ? protobuf_c_message_get_packed_size(req) : 0;
    uint8_t *body = NULL;
    if (st == KVP_OK && len > KVP_RPC_MAX_BODY)
        st = KVP_ERR_FRAME_TOO_LARGE;
    else if (st == KVP_OK && (body = pack_buf(len)) == NULL)
        st = KVP_ERR_NOMEM;
    if (st == KVP_OK && req)
        protobuf_c_message_pack(req, body);
    kvp_key_scope_undo(&undo);
    if (st != KVP_OK)
        return st;
    return kvp_mconn_call(s->mc, method, body, len, resp_p, resp_len_p);
}

void *kvp_session_call_unpack(kvp_session_t *s, uint16_t method, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *desc, kvp_status_t *st_p)
{
    uint8_t *body;
    size_t len;
    *st_p = kvp_session_call(s, method, req, &body, &len);
    if (*st_p != KVP_OK)
        return NULL;
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, len, body);
    if (msg == NULL)
        *st_p = KVP_ERR_PROTOCOL;
    return msg;
}
