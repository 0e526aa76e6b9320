/*
 * master_conn.c - the connection to kvpool-master: calls with reconnect and
 * remount, and the queue of read leases to hand back.
 *
 * The master connection is one blocking socket behind master_lock. PENDING
 * puts and mounted segments are bound to it on the master, so if it breaks
 * the master revokes those puts and unmounts the segment; the client
 * reconnects on the next call, remounts its segment (empty in the master's
 * view) and retries the call once. A retried PutStart is therefore safe.
 *
 * Thread: any client thread; master_lock serialises calls, rel_lock guards
 * the release queue.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/client_priv.h"
#include "client/internal.h"
#include "client/mem/gpu.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/macros.h"
#include "common/sock.h"
#include "kvpool.pb-c.h"

/* strict (kvp_client_create): any refusal of the mount is the caller's error. */
kvp_status_t kvp_client_master_connect_locked(kvp_client_t *c, bool strict)
{
    int fd;
    kvp_status_t st =
        kvp_tcp_connect(c->master_host, c->master_port, c->params.rpc_timeout_ms, &fd);
    if (st != KVP_OK) {
        KVP_LOG_WARN("cannot connect to master %s:%u: %s", c->master_host, c->master_port,
                     kvp_strerror(st));
        return st == KVP_ERR_TIMEOUT ? KVP_ERR_TIMEOUT : KVP_ERR_CONNECT;
    }
    kvp_sock_set_timeout(fd, c->params.rpc_timeout_ms);
    c->master_fd = fd;
    if (atomic_load(&c->seg_state) == KVP_SEG_MOUNTED) {
        /* The master forgot our segment with the old connection: mount it again. A
         * refusal (the master has not yet seen the old connection close) is not the
         * caller's error: the next heartbeat is told to remount and tries again. */
        st = kvp_client_mount_locked(c);
        if (st != KVP_OK &&
            (strict || st == KVP_ERR_IO || st == KVP_ERR_TIMEOUT || st == KVP_ERR_PROTOCOL)) {
            close(c->master_fd);
            c->master_fd = -1;
            return st;
        }
    }
    return KVP_OK;
}

static kvp_status_t call_locked(kvp_client_t *c, uint16_t method, const ProtobufCMessage *req,
                                uint8_t **resp_p, size_t *resp_len_p)
{
    size_t len = req ? protobuf_c_message_get_packed_size(req) : 0;
    if (len > KVP_RPC_MAX_BODY)
        return KVP_ERR_FRAME_TOO_LARGE;
    uint8_t *body = malloc(len ? len : 1);
    if (body == NULL)
        return KVP_ERR_NOMEM;
    if (req)
        protobuf_c_message_pack(req, body);
    kvp_status_t st = KVP_ERR_CONNECT;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (c->master_fd < 0) {
            st = kvp_client_master_connect_locked(c, false);
            if (st != KVP_OK)
                break;
            kvp_client_releases_flush_locked(
                c); /* kept while there was no connection: ahead of req */
        }
        st = kvp_rpc_call(c->master_fd, method, ++c->next_req_id, body, len, resp_p, resp_len_p);
        if (st != KVP_ERR_IO && st != KVP_ERR_TIMEOUT && st != KVP_ERR_PROTOCOL &&
            st != KVP_ERR_VERSION && st != KVP_ERR_CONNECT)
            break;
        /* the connection is unusable; the master drops what was bound to it */
        close(c->master_fd);
        c->master_fd = -1;
        if (st == KVP_ERR_TIMEOUT || st == KVP_ERR_VERSION)
            break;
    }
    free(body);
    return st;
}

/*
 * Send the queued lease releases (master_lock held). One-way: nothing is
 * read back. With no connection they stay queued for the next one (lease
 * ids are the master's, not the connection's); when the send fails they
 * are dropped and the leases end by their TTL.
 */
void kvp_client_releases_flush_locked(kvp_client_t *c)
{
    if (atomic_load(&c->rel_pending) == 0 || c->master_fd < 0)
        return; /* a getter that queues after this look finds the lock taken: the unlock
                 * (kvp_client_master_unlock) sends it */
    pthread_mutex_lock(&c->rel_lock);
    size_t n = c->rel_n;
    uint64_t *ids = c->rel_ids;
    size_t cap = c->rel_cap;
    c->rel_ids = c->rel_send; /* the queue takes the idle buffer */
    c->rel_cap = c->rel_send_cap;
    c->rel_n = 0;
    atomic_store(&c->rel_pending, 0);
    pthread_mutex_unlock(&c->rel_lock);
    c->rel_send = ids;
    c->rel_send_cap = cap;
    if (n == 0)
        return;
    Kvpool__LeaseReleaseRequest req = KVPOOL__LEASE_RELEASE_REQUEST__INIT;
    req.lease_ids = ids;
    req.n_lease_ids = n;
    size_t len = kvpool__lease_release_request__get_packed_size(&req);
    if (len > c->rel_body_cap) {
        uint8_t *b = realloc(c->rel_body, len);
        if (b == NULL)
            return;
        c->rel_body = b;
        c->rel_body_cap = len;
    }
    kvpool__lease_release_request__pack(&req, c->rel_body);
    if (kvp_rpc_send(c->master_fd, KVP_RPC_LEASE_RELEASE, ++c->next_req_id, c->rel_body, len) !=
        KVP_OK) {
        KVP_LOG_WARN("cannot hand %zu read leases back to the master: they end by their TTL", n);
        close(c->master_fd);
        c->master_fd = -1;
    }
}

void kvp_client_master_unlock(kvp_client_t *c)
{
    pthread_mutex_unlock(&c->master_lock);
    /* releases queued while we held the lock: their getter found it taken and left
     * them to us (it checked after queueing, we check after unlocking) */
    while (atomic_load(&c->rel_pending) > 0 && pthread_mutex_trylock(&c->master_lock) == 0) {
        bool connected = c->master_fd >= 0;
        kvp_client_releases_flush_locked(c);
        pthread_mutex_unlock(&c->master_lock);
        if (!connected)
            break; /* kept for the next connection */
    }
}

void kvp_client_lease_release(kvp_client_t *c, const uint64_t *ids, size_t n)
{
    if (n == 0)
        return;
    pthread_mutex_lock(&c->rel_lock);
    if (c->rel_n + n > c->rel_cap) {
        /* grows to the largest backlog once, then reused */
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
    atomic_store(&c->rel_pending, c->rel_n);
    pthread_mutex_unlock(&c->rel_lock);
    if (pthread_mutex_trylock(&c->master_lock) == 0) {
        kvp_client_releases_flush_locked(c);
        kvp_client_master_unlock(c);
    }
}

kvp_status_t kvp_client_call(kvp_client_t *c, uint16_t method, const ProtobufCMessage *req,
                             uint8_t **resp_p, size_t *resp_len_p)
{
    pthread_mutex_lock(&c->master_lock);
    kvp_client_releases_flush_locked(c); /* a release goes out before anything that follows it */
    kvp_status_t st = call_locked(c, method, req, resp_p, resp_len_p);
    kvp_client_master_unlock(c); /* sends what was queued meanwhile */
    return st;
}

kvp_status_t kvp_client_mount_locked(kvp_client_t *c)
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
    uint8_t *resp;
    size_t rlen;
    size_t len = kvpool__mount_request__get_packed_size(&req);
    uint8_t *body = malloc(len ? len : 1);
    if (body == NULL)
        return KVP_ERR_NOMEM;
    kvpool__mount_request__pack(&req, body);
    kvp_status_t st =
        kvp_rpc_call(c->master_fd, KVP_RPC_MOUNT, ++c->next_req_id, body, len, &resp, &rlen);
    free(body);
    if (st != KVP_OK)
        return st;
    Kvpool__MountResponse *mr = kvpool__mount_response__unpack(NULL, rlen, resp);
    free(resp);
    if (mr == NULL)
        return KVP_ERR_PROTOCOL;
    st = mr->status;
    if (st == KVP_OK) {
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

void *kvp_client_call_unpack(kvp_client_t *c, uint16_t method, const ProtobufCMessage *req,
                             const ProtobufCMessageDescriptor *desc, kvp_status_t *st_p)
{
    uint8_t *body;
    size_t len;
    *st_p = kvp_client_call(c, method, req, &body, &len);
    if (*st_p != KVP_OK)
        return NULL;
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, len, body);
    free(body);
    if (msg == NULL)
        *st_p = KVP_ERR_PROTOCOL;
    return msg;
}
