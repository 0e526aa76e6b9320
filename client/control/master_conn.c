/*
 * master_conn.c - the client's use of its master connection (mconn.c):
 * protobuf calls, the segment's (re)mount, and read leases handed back.
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
 * Thread: any client thread. seg_lock orders a remount against a drain's
 * change of the segment's state (never held across a call: on_ready, which
 * takes it, may run inside any call); rel_lock guards the release queue.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client_priv.h"
#include "client/control/discovery.h"
#include "client/control/mconn.h"
#include "client/control/record.h"
#include "client/mem/scratch.h"
#include "client/internal.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/macros.h"
#include "common/sock.h"
#include "kvpool.pb-c.h"

/* The thread's buffer for packing request bodies: grown to the largest, kept. */
static uint8_t *pack_buf(size_t len)
{
    kvp_thread_buf_t *b = kvp_thread_buf(KVP_TBUF_PACK);
    return b ? kvp_thread_buf_reserve(b, len) : NULL;
}

/* The mount request for our segment, packed into the thread's buffer, or (heap: on_ready,
 * which runs inside a call whose request is in the thread's buffer) a malloc'd one. */
static kvp_status_t mount_pack(kvp_client_t *c, bool heap, bool adopting, uint8_t **body_p,
                               size_t *len_p)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.name = c->seg_name;
    d.medium = "dram";
    d.size = c->seg_size;
    d.owner_client_id = c->client_id;
    d.host_id = c->xfer.host_id;
    d.tcp_endpoint = c->seg_endpoint;
    d.shm_path = c->seg_shm_path;
    d.rdma_endpoint = c->seg_rdma_endpoint;
    d.rdma_addr = c->seg_rdma_addr;
    d.rdma_rkey = c->seg_rdma_rkey;
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = c->client_id;
    req.segment = &d;
    req.adopting = adopting; /* its record is offered next (control/record.c) */
    size_t len = kvpool__mount_request__get_packed_size(&req);
    uint8_t *body = heap ? malloc(len ? len : 1) : pack_buf(len);
    if (body == NULL)
        return KVP_ERR_NOMEM;
    kvpool__mount_request__pack(&req, body);
    *body_p = body;
    *len_p = len;
    return KVP_OK;
}

/* Take the master's answer to a mount (owned: resp is malloc'd, freed here). adopting: the
 * record thread is to offer the record (control/record.c). */
static kvp_status_t mount_reply(kvp_client_t *c, uint8_t *resp, size_t rlen, bool owned,
                                bool adopting)
{
    Kvpool__MountResponse *mr = kvpool__mount_response__unpack(NULL, rlen, resp);
    if (owned)
        free(resp);
    if (mr == NULL)
        return KVP_ERR_PROTOCOL;
    kvp_status_t st = mr->status;
    if (st == KVP_OK) {
        if (adopting) /* flagged before the id changes: the record thread sees both */
            kvp_client_record_offer_later(c, mr->segment_id);
        atomic_store(&c->seg_id, mr->segment_id);
        kvp_segment_server_set_id(c->seg_server, mr->segment_id);
        KVP_LOG_INFO("mounted segment %s (%llu bytes) as %#llx", c->seg_name,
                     (unsigned long long)c->seg_size, (unsigned long long)mr->segment_id);
    } else {
        KVP_LOG_ERROR("master refused to mount segment %s: %s (%s)", c->seg_name, kvp_strerror(st),
                      mr->message);
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
static size_t releases_take(kvp_client_t *c, uint64_t **ids_p)
{
    pthread_mutex_lock(&c->rel_lock);
    size_t n = c->rel_n;
    *ids_p = c->rel_ids;
    c->rel_ids = NULL;
    c->rel_n = c->rel_cap = 0;
    pthread_mutex_unlock(&c->rel_lock);
    return n;
}

/* Runs on the thread that opened a new connection, before anyone else can use it. */
static kvp_status_t on_ready(void *arg, kvp_mconn_t *m, int fd, bool first)
{
    kvp_client_t *c = arg;
    pthread_mutex_lock(&c->seg_lock);
    if (atomic_load(&c->seg_state) == KVP_SEG_MOUNTED) {
        /* The master forgot our segment with the old connection: mount it again. A
         * refusal (the master has not yet seen the old connection close) is not the
         * caller's error: the next heartbeat is told to remount and tries again. */
        uint8_t *body = NULL, *resp;
        size_t len, rlen;
        /* even a first mount waits for its record stream (record.c), so that no object
         * lands on the segment before its changes are streamed */
        bool adopting = true;
        kvp_status_t st = mount_pack(c, true, adopting, &body, &len);
        if (st == KVP_OK)
            st = kvp_mconn_ready_call(m, fd, KVP_RPC_MOUNT, body, len, &resp, &rlen);
        free(body);
        if (st == KVP_OK)
            st = mount_reply(c, resp, rlen, true, adopting);
        if (st != KVP_OK &&
            (first || st == KVP_ERR_IO || st == KVP_ERR_TIMEOUT || st == KVP_ERR_PROTOCOL)) {
            pthread_mutex_unlock(&c->seg_lock);
            return st;
        }
    }
    pthread_mutex_unlock(&c->seg_lock);
    /* releases kept while there was no connection go out ahead of any call */
    uint64_t *ids;
    size_t n = releases_take(c, &ids);
    if (n > 0) {
        uint8_t *body = NULL;
        size_t len;
        if (release_pack(ids, n, true, &body, &len) == KVP_OK &&
            kvp_mconn_ready_send(m, fd, KVP_RPC_LEASE_RELEASE, body, len) != KVP_OK)
            KVP_LOG_WARN("cannot hand %zu read leases back to the master: they end by their TTL",
                         n);
        free(body);
    }
    free(ids);
    return KVP_OK;
}

kvp_status_t kvp_client_master_open(kvp_client_t *c)
{
    kvp_mconn_params_t p = {.host = c->master_host,
                            .port = c->master_port,
                            .resolve = c->disc ? kvp_discovery_leader : NULL,
                            .resolve_arg = c->disc,
                            .timeout_ms = c->params.rpc_timeout_ms,
                            .on_ready = on_ready,
                            .arg = c};
    kvp_status_t st = kvp_mconn_create(&p, &c->mc);
    if (st != KVP_OK)
        return st;
    st = kvp_mconn_connect(c->mc);
    if (st != KVP_OK) {
        kvp_mconn_destroy(c->mc);
        c->mc = NULL;
    }
    return st;
}

void kvp_client_master_close(kvp_client_t *c)
{
    kvp_mconn_destroy(c->mc);
    c->mc = NULL;
    uint64_t *ids;
    releases_take(c, &ids);
    free(ids);
}

kvp_status_t kvp_client_mount(kvp_client_t *c)
{
    /* seg_lock is not held across the call: if the connection breaks under it, the
     * reconnect's on_ready (this very thread) takes seg_lock to mount on the new one */
    if (atomic_load(&c->seg_state) != KVP_SEG_MOUNTED)
        return KVP_OK;
    uint8_t *body, *resp;
    size_t len, rlen;
    kvp_status_t st = mount_pack(c, false, true, &body, &len);
    if (st == KVP_OK)
        st = kvp_mconn_call(c->mc, KVP_RPC_MOUNT, body, len, &resp, &rlen);
    if (st != KVP_OK)
        return st;
    /* a drain that began meanwhile drains the id it read; this late mount ends with the
     * connection (or the unmount at destroy), like any undrained segment */
    pthread_mutex_lock(&c->seg_lock);
    st = atomic_load(&c->seg_state) == KVP_SEG_MOUNTED ? mount_reply(c, resp, rlen, false, true)
                                                       : KVP_OK;
    pthread_mutex_unlock(&c->seg_lock);
    return st;
}

/* Queue ids for the next connection. */
static void releases_queue(kvp_client_t *c, const uint64_t *ids, size_t n)
{
    pthread_mutex_lock(&c->rel_lock);
    if (c->rel_n + n > c->rel_cap) {
        size_t cap = KVP_MAX(c->rel_cap * 2, KVP_MAX(c->rel_n + n, (size_t)256));
        uint64_t *p = realloc(c->rel_ids, cap * sizeof(*p));
        if (p == NULL) {
            pthread_mutex_unlock(&c->rel_lock);
            return; /* the leases end by their TTL */
        }
        c->rel_ids = p;
        c->rel_cap = cap;
    }
    memcpy(c->rel_ids + c->rel_n, ids, n * sizeof(*ids));
    c->rel_n += n;
    pthread_mutex_unlock(&c->rel_lock);
}

void kvp_client_lease_release(kvp_client_t *c, const uint64_t *ids, size_t n)
{
    if (n == 0)
        return;
    uint8_t *body;
    size_t len;
    if (release_pack(ids, n, false, &body, &len) != KVP_OK)
        return; /* the leases end by their TTL */
    kvp_status_t st = kvp_mconn_send(c->mc, KVP_RPC_LEASE_RELEASE, body, len);
    if (st == KVP_OK)
        return;
    if (st != KVP_ERR_CONNECT) {
        KVP_LOG_WARN("cannot hand %zu read leases back to the master: they end by their TTL", n);
        return;
    }
    releases_queue(c, ids, n);
    /* a connection opened since we looked took the queue before we added to it */
    if (kvp_mconn_connected(c->mc)) {
        uint64_t *q;
        size_t qn = releases_take(c, &q);
        if (qn > 0 && release_pack(q, qn, false, &body, &len) == KVP_OK &&
            kvp_mconn_send(c->mc, KVP_RPC_LEASE_RELEASE, body, len) != KVP_OK)
            KVP_LOG_WARN("cannot hand %zu read leases back to the master: they end by their TTL",
                         qn);
        free(q);
    }
}

kvp_status_t kvp_client_call(kvp_client_t *c, uint16_t method, const ProtobufCMessage *req,
                             uint8_t **resp_p, size_t *resp_len_p)
{
    size_t len = req ? protobuf_c_message_get_packed_size(req) : 0;
    if (len > KVP_RPC_MAX_BODY)
        return KVP_ERR_FRAME_TOO_LARGE;
    uint8_t *body = pack_buf(len);
    if (body == NULL)
        return KVP_ERR_NOMEM;
    if (req)
        protobuf_c_message_pack(req, body);
    return kvp_mconn_call(c->mc, method, body, len, resp_p, resp_len_p);
}

void *kvp_client_call_unpack(kvp_client_t *c, uint16_t method, const ProtobufCMessage *req,
                             const ProtobufCMessageDescriptor *desc, kvp_status_t *st_p)
{
    uint8_t *body;
    size_t len;
    *st_p = kvp_client_call(c, method, req, &body, &len);
    if (*st_p != KVP_OK)
        return NULL;
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, len, body);
    if (msg == NULL)
        *st_p = KVP_ERR_PROTOCOL;
    return msg;
}
