/*
 * segment_server.c - serves this client's segment to tcp peers, and hands its
 * memory to same-host peers that may have it (shm, MAP on a Unix socket).
 *
 * Design: an accept thread plus one thread per connection, each in a
 * blocking loop: read a 32-byte request header, check the extent lies
 * inside the segment, then recv() a WRITE's payload straight into segment
 * memory, or send() a READ's payload straight out of it. No object byte is
 * buffered or copied in user space. Requests on one connection are handled
 * in order, so a client pipelines by sending several headers ahead.
 *
 * Vectored requests (READV/WRITEV, docs/protocol.md) carry up to
 * KVP_DATA_VEC_MAX extents after the header and are served with one
 * sendmsg/recvmsg over an iovec of segment ranges: one reply per chain.
 *
 * Bad requests: a READ(V) outside the segment gets an error response and the
 * connection goes on; a bad WRITE(V) (its payload cannot be placed), a bad
 * magic or an absurd entry count gets an error response where one can be
 * sent and closes the connection, since the stream can no longer be trusted.
 * Every entry is checked before any byte moves.
 *
 * Counters: each request served adds its extents and bytes to srv->stats with
 * relaxed atomics just before its reply is sent (taken back if the send fails), so
 * a peer that has its reply always sees it counted (client/metrics.c reads them).
 *
 * Threads: connections come and go as segment/conn_server.c runs them (an
 * accept thread, a thread per connection); this file serves one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "client/segment/segment_server.h"
#include "client/transport/wire.h"
#include "client/segment/conn_server.h"
#include "client/segment/data_grant.h"
#include "client/segment/seg_record.h"
#include "common/grant.h"
#include "common/log.h"
#include "common/sock.h"

struct kvp_segment_server {
    uint8_t *base;
    uint64_t size;
    _Atomic uint64_t segment_id;
    kvp_conn_server_t *conns;
    kvp_served_stats_t stats;   /* relaxed adds, one per request served */
    kvp_grant_keyring_t grants; /* from the last mount (data grants on: a key) */
    kvp_data_ended_t ended;     /* the segment's record (ended puts), once set */
    kvp_data_pending_t pending; /* its begun puts (data_grant.h) */
    bool has_record;
    _Atomic uint64_t grants_refused; /* requests refused for their grant (or its absence) */
    /* the shm hand-off (kvp_segment_server_share): the segment's memfd, served on a Unix
     * socket to peers of this host that may have it */
    int mem_fd;
    kvp_conn_server_t *local;
    _Atomic uint64_t shm_refused; /* MAP requests refused */
    /* rdma memory windows (kvp_segment_server_set_windows; NULL: none served here) */
    kvp_segment_windows_fn windows;
    void *windows_arg;
};

/* A connection's state between requests: its grant verifier, and the principal it proved
 * in its HELLO (0: none). */
typedef struct conn_state {
    kvp_grant_verifier_t v;
    uint64_t tag;
} conn_state_t;

/* vec_on_wire: the request's n entries follow its header (READV/WRITEV): read with its
 * grants */
static kvp_status_t check_grants(struct kvp_segment_server *srv, conn_state_t *cs, int fd,
                                 const kvp_data_req_t *req, kvp_data_vec_t *vec, uint64_t n,
                                 bool vec_on_wire)
{
    return kvp_data_grants_check(&srv->grants, &cs->v, &srv->grants_refused, "segment server", fd,
                                 req, vec, n, vec_on_wire, atomic_load(&srv->segment_id), cs->tag,
                                 srv->has_record ? &srv->ended : NULL);
}

/* Do a vectored request's n entries lie in our segment, summing to the header's length? */
static kvp_status_t check_extents(const struct kvp_segment_server *srv, const kvp_data_vec_t *vec,
                                  uint64_t n, uint64_t length)
{
    uint64_t id = atomic_load(&srv->segment_id), total = 0;
    for (uint64_t i = 0; i < n; i++) {
        const kvp_data_vec_t *v = &vec[i];
        if (v->segment_id != id)
            return KVP_ERR_SEGMENT_GONE;
        if (v->length == 0 || v->offset > srv->size || v->length > srv->size - v->offset)
            return KVP_ERR_OUT_OF_RANGE;
        if (__builtin_add_overflow(total, v->length, &total))
            return KVP_ERR_PROTOCOL;
    }
    return total == length ? KVP_OK : KVP_ERR_PROTOCOL; /* the header's length: their sum */
}

/*
 * Serve one READV/WRITEV whose header is `req`. Returns false when the connection must
 * close (I/O failed, or a WRITEV/count that cannot be trusted); an error reply has then
 * been attempted.
 */
static bool serve_vec(struct kvp_segment_server *srv, conn_state_t *cs, int fd,
                      const kvp_data_req_t *req)
{
    kvp_data_vec_t vec[KVP_DATA_VEC_MAX];
    struct iovec iov[KVP_DATA_VEC_MAX + 1];
    uint64_t n = req->offset;
    if (n == 0 || n > KVP_DATA_VEC_MAX) {
        KVP_LOG_WARN_LIMITED("segment server: vectored request with %llu entries (1..%d); closing",
                             (unsigned long long)n, KVP_DATA_VEC_MAX);
        kvp_data_reply(fd, KVP_ERR_PROTOCOL, 0);
        return false;
    }
    kvp_status_t st = check_grants(srv, cs, fd, req, vec, n, true);
    if (st == KVP_ERR_SEGMENT_GONE) /* a stale descriptor: a read's connection goes on */
        return kvp_data_reply(fd, st, 0) == KVP_OK && req->op == KVP_DATA_READV;
    if (st != KVP_OK) { /* nothing is read or written; the connection ends */
        if (st == KVP_ERR_DENIED)
            kvp_data_reply(fd, KVP_ERR_DENIED, 0);
        return false;
    }
    uint64_t total = req->length;
    st = check_extents(srv, vec, n, total);
    for (uint64_t i = 0; i < n && st == KVP_OK; i++)
        iov[i + 1] =
            (struct iovec){.iov_base = srv->base + vec[i].offset, .iov_len = vec[i].length};
    if (req->op == KVP_DATA_WRITEV) {
        if (st != KVP_OK) {
            kvp_data_reply(fd, st, 0);
            return false;
        }
        if (kvp_recvv_all(fd, iov + 1, (int)n) != KVP_OK)
            return false;
        kvp_count_add(&srv->stats.dir[0], n, total); /* before the reply, as reads */
        return kvp_data_reply(fd, KVP_OK, 0) == KVP_OK;
    }
    if (st != KVP_OK)
        return kvp_data_reply(fd, st, 0) == KVP_OK;
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = total};
    iov[0] = (struct iovec){.iov_base = &r, .iov_len = sizeof(r)};
    /* counted before the reply goes, so a reader that has its bytes sees them counted */
    kvp_count_add(&srv->stats.dir[1], n, total);
    if (kvp_sendv_all(fd, iov, (int)n + 1) != KVP_OK) {
        kvp_count_sub(&srv->stats.dir[1], n, total);
        return false;
    }
    return true;
}

/*
 * BIND_READ / BIND_WRITE / UNBIND (wire.h): memory windows for the rdma queue pair named in
 * segment_id, checked like a READV / WRITEV (the grants, the HELLO's principal, the extents
 * inside the segment), bound by the rdma transport. Returns false when the connection must
 * close (a refused grant, a stream that cannot be trusted, I/O).
 */
static bool serve_windows(struct kvp_segment_server *srv, conn_state_t *cs, int fd,
                          const kvp_data_req_t *req)
{
    uint64_t n = req->offset;
    if (n == 0 || n > KVP_DATA_VEC_MAX || req->segment_id > UINT32_MAX) {
        KVP_LOG_WARN_LIMITED("segment server: a window request with %llu entries (1..%d) or "
                             "no queue pair; closing",
                             (unsigned long long)n, KVP_DATA_VEC_MAX);
        kvp_data_reply(fd, KVP_ERR_PROTOCOL, 0);
        return false;
    }
    uint32_t qp = (uint32_t)req->segment_id;
    uint32_t rkeys[KVP_DATA_VEC_MAX], slots[KVP_DATA_VEC_MAX];
    if (req->op == KVP_DATA_UNBIND) {
        kvp_data_window_t w[KVP_DATA_VEC_MAX];
        if (kvp_recv_all(fd, w, n * sizeof(*w)) != KVP_OK)
            return false;
        if (srv->windows == NULL || cs->tag == 0)
            return false; /* nothing was bound on this connection's word */
        for (uint64_t i = 0; i < n; i++) {
            rkeys[i] = w[i].rkey;
            slots[i] = w[i].slot;
        }
        kvp_status_t st =
            srv->windows(srv->windows_arg, qp, cs->tag, NULL, NULL, 0, false, 0, rkeys, slots, n);
        if (st == KVP_ERR_DENIED) {
            atomic_fetch_add_explicit(&srv->grants_refused, 1, memory_order_relaxed);
            KVP_LOG_WARN_LIMITED("segment server: an UNBIND for another principal's queue pair "
                                 "refused; closing");
            return false;
        }
        return true; /* no answer */
    }
    kvp_data_vec_t vec[KVP_DATA_VEC_MAX];
    kvp_data_req_t as = *req; /* the grants are checked as for the vectored op */
    kvp_status_t st = check_grants(srv, cs, fd, &as, vec, n, true);
    if (st == KVP_ERR_SEGMENT_GONE)
        return kvp_data_reply(fd, st, 0) == KVP_OK;
    if (st != KVP_OK) {
        if (st == KVP_ERR_DENIED)
            kvp_data_reply(fd, KVP_ERR_DENIED, 0);
        return false;
    }
    if (srv->windows == NULL || !cs->v.on || cs->tag == 0) {
        KVP_LOG_WARN_LIMITED("segment server: a window request, but this segment is not served "
                             "through rdma windows (KVPOOL_RDMA_WINDOWS, data grants on)");
        return kvp_data_reply(fd, KVP_ERR_INVALID_ARG, 0) == KVP_OK;
    }
    uint64_t offs[KVP_DATA_VEC_MAX], lens[KVP_DATA_VEC_MAX];
    st = check_extents(srv, vec, n, req->length);
    for (uint64_t i = 0; i < n; i++) {
        offs[i] = vec[i].offset;
        lens[i] = vec[i].length;
    }
    if (st == KVP_OK)
        st = srv->windows(srv->windows_arg, qp, cs->tag, offs, lens, n,
                          req->op == KVP_DATA_BIND_WRITE, cs->v.expiry_ms + KVP_GRANT_SKEW_MS,
                          rkeys, slots, 0);
    if (st == KVP_ERR_DENIED) {
        atomic_fetch_add_explicit(&srv->grants_refused, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("segment server: windows asked for another principal's queue pair "
                             "refused; closing");
        kvp_data_reply(fd, KVP_ERR_DENIED, 0);
        return false;
    }
    if (st != KVP_OK)
        return kvp_data_reply(fd, st, 0) == KVP_OK;
    kvp_data_window_t w[KVP_DATA_VEC_MAX];
    for (uint64_t i = 0; i < n; i++)
        w[i] = (kvp_data_window_t){.rkey = rkeys[i], .slot = slots[i]};
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = n * sizeof(*w)};
    struct iovec iov[2] = {{&r, sizeof(r)}, {w, n * sizeof(*w)}};
    return kvp_sendv_all(fd, iov, 2) == KVP_OK;
}

/*
 * A MAP (wire.h): hand the segment's memfd to a peer of this host that may have it: on the
 * Unix socket, running as our user or root (SO_PEERCRED), naming the whole segment, with a
 * MAP grant for the principal it proved in its HELLO (grants on). Refused: counted, logged,
 * KVP_ERR_DENIED, no descriptor. The connection ends either way.
 */
static void serve_map(struct kvp_segment_server *srv, conn_state_t *cs, int fd,
                      const kvp_data_req_t *req)
{
    int pid = 0;
    uint32_t uid = 0;
    const char *why = NULL;
    uint64_t id = atomic_load(&srv->segment_id);
    if (srv->mem_fd < 0 || !kvp_unix_peer(fd, &pid, &uid))
        why = "a MAP on a connection that is not the segment's Unix socket";
    else if (uid != geteuid() && uid != 0)
        why = "the peer runs as another user";
    else if (req->segment_id != id || req->offset != 0 || req->length != srv->size)
        why = "a MAP must name the whole of this segment";
    if (why != NULL) {
        atomic_fetch_add_explicit(&srv->shm_refused, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("segment server: a map from pid %d (uid %u) refused: %s; closing", pid,
                             uid, why);
        kvp_data_reply(fd, KVP_ERR_DENIED, 0);
        return;
    }
    kvp_data_vec_t whole = {.segment_id = id, .offset = 0, .length = srv->size};
    kvp_status_t st =
        kvp_data_grants_check(&srv->grants, &cs->v, &srv->shm_refused, "segment server", fd, req,
                              &whole, 1, false, id, cs->tag, NULL);
    if (st != KVP_OK) {
        if (st == KVP_ERR_DENIED)
            kvp_data_reply(fd, KVP_ERR_DENIED, 0);
        return;
    }
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = srv->size};
    if (kvp_unix_send_fd(fd, &r, sizeof(r), srv->mem_fd) == KVP_OK)
        KVP_LOG_DEBUG("segment server: segment memory handed to pid %d (uid %u)", pid, uid);
}

/* One connection's requests, in order, until it ends or cannot be trusted. */
static void serve_conn(void *arg, int fd)
{
    struct kvp_segment_server *srv = arg;
    conn_state_t cs = {.v = {0}};
    for (;;) {
        kvp_data_req_t req;
        if (kvp_recv_all(fd, &req, sizeof(req)) != KVP_OK)
            break;
        if (req.magic == KVP_DATA_MAGIC &&
            (req.op == KVP_DATA_READV || req.op == KVP_DATA_WRITEV)) {
            if (!serve_vec(srv, &cs, fd, &req))
                break;
            continue;
        }
        if (req.magic == KVP_DATA_MAGIC &&
            (req.op == KVP_DATA_BIND_READ || req.op == KVP_DATA_BIND_WRITE ||
             req.op == KVP_DATA_UNBIND)) {
            if (!serve_windows(srv, &cs, fd, &req))
                break;
            continue;
        }
        if (req.magic == KVP_DATA_MAGIC && req.op == KVP_DATA_MAP) {
            serve_map(srv, &cs, fd, &req);
            break;
        }
        if (req.magic == KVP_DATA_MAGIC && req.op == KVP_DATA_HELLO) {
            if (kvp_data_hello(&srv->grants, &cs.v, &srv->grants_refused, "segment server", fd,
                               &req, atomic_load(&srv->segment_id), &cs.tag) != KVP_OK)
                break;
            continue;
        }
        if (req.magic != KVP_DATA_MAGIC || (req.op != KVP_DATA_READ && req.op != KVP_DATA_WRITE)) {
            KVP_LOG_WARN_LIMITED("segment server: bad request header (magic %#x op %u); closing",
                                 req.magic, req.op);
            break;
        }
        kvp_data_vec_t one = {
            .segment_id = req.segment_id, .offset = req.offset, .length = req.length};
        kvp_status_t gst = check_grants(srv, &cs, fd, &req, &one, 1, false);
        if (gst == KVP_ERR_SEGMENT_GONE) { /* a stale descriptor: a read's connection goes on */
            if (kvp_data_reply(fd, gst, 0) == KVP_OK && req.op == KVP_DATA_READ)
                continue;
            break;
        }
        if (gst != KVP_OK) { /* nothing is read or written; the connection ends */
            if (gst == KVP_ERR_DENIED)
                kvp_data_reply(fd, KVP_ERR_DENIED, 0);
            break;
        }
        kvp_status_t st = KVP_OK;
        if (req.segment_id != atomic_load(&srv->segment_id))
            st = KVP_ERR_SEGMENT_GONE;
        else if (req.length == 0 || req.offset > srv->size || req.length > srv->size - req.offset)
            st = KVP_ERR_OUT_OF_RANGE;
        if (req.op == KVP_DATA_WRITE) {
            if (st != KVP_OK) {
                kvp_data_reply(fd, st, 0);
                break;
            }
            if (kvp_recv_all(fd, srv->base + req.offset, req.length) != KVP_OK)
                break;
            kvp_count_add(&srv->stats.dir[0], 1, req.length);
            if (kvp_data_reply(fd, KVP_OK, 0) != KVP_OK)
                break;
        } else {
            if (st != KVP_OK) {
                if (kvp_data_reply(fd, st, 0) != KVP_OK)
                    break;
                continue;
            }
            kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = req.length};
            struct iovec iov[2] = {{.iov_base = &r, .iov_len = sizeof(r)},
                                   {.iov_base = srv->base + req.offset, .iov_len = req.length}};
            kvp_count_add(&srv->stats.dir[1], 1, req.length);
            if (kvp_sendv_all(fd, iov, 2) != KVP_OK) {
                kvp_count_sub(&srv->stats.dir[1], 1, req.length);
                break;
            }
        }
    }
    kvp_grant_verifier_cleanup(&cs.v);
}

kvp_status_t kvp_segment_server_create(void *base, uint64_t size, const char *host, uint16_t port,
                                       bool protected_mode, kvp_segment_server_t **srv_p,
                                       uint16_t *bound_port_p)
{
    struct kvp_segment_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return KVP_ERR_NOMEM;
    srv->base = base;
    srv->size = size;
    srv->mem_fd = -1;
    atomic_store(&srv->segment_id, UINT64_MAX);
    kvp_grant_keyring_init(&srv->grants);
    kvp_data_pending_init(&srv->pending);
    kvp_status_t status = kvp_conn_server_create("segment server", host, port, protected_mode,
                                                 serve_conn, srv, &srv->conns, bound_port_p);
    if (status != KVP_OK) {
        kvp_grant_keyring_cleanup(&srv->grants);
        kvp_data_pending_cleanup(&srv->pending);
        free(srv);
        return status;
    }
    *srv_p = srv;
    return KVP_OK;
}

kvp_status_t kvp_segment_server_share(kvp_segment_server_t *srv, int mem_fd, const char *sock_name)
{
    srv->mem_fd = mem_fd;
    return kvp_conn_server_create_unix("segment server (shm)", sock_name, serve_conn, srv,
                                       &srv->local);
}

uint64_t kvp_segment_server_shm_refused(const kvp_segment_server_t *srv)
{
    return atomic_load_explicit(&srv->shm_refused, memory_order_relaxed);
}

void kvp_segment_server_set_id(kvp_segment_server_t *srv, uint64_t segment_id)
{
    atomic_store(&srv->segment_id, segment_id);
}

void kvp_segment_server_set_grants(kvp_segment_server_t *srv, const uint8_t *key, size_t key_len,
                                   uint64_t epoch)
{
    kvp_grant_keyring_set(&srv->grants, key, key_len, epoch);
}

static void record_versions_at(void *record, const uint64_t *offsets, uint64_t *versions, size_t n)
{
    kvp_seg_record_versions_at(record, offsets, versions, n);
}

void kvp_segment_server_set_record(kvp_segment_server_t *srv, struct kvp_seg_record *record)
{
    srv->ended = (kvp_data_ended_t){
        .versions_at = record_versions_at, .arg = record, .pending = &srv->pending};
    if (record != NULL)
        kvp_seg_record_set_pending(record, &srv->pending);
    srv->has_record = record != NULL;
}

void kvp_segment_server_set_windows(kvp_segment_server_t *srv, kvp_segment_windows_fn fn, void *arg)
{
    srv->windows = fn;
    srv->windows_arg = arg;
}

uint64_t kvp_segment_server_grants_refused(const kvp_segment_server_t *srv)
{
    return atomic_load_explicit(&srv->grants_refused, memory_order_relaxed);
}

uint64_t kvp_segment_server_refused(const kvp_segment_server_t *srv)
{
    return kvp_conn_server_refused(srv->conns);
}

const kvp_served_stats_t *kvp_segment_server_stats(const kvp_segment_server_t *srv)
{
    return &srv->stats;
}

void kvp_segment_server_destroy(kvp_segment_server_t *srv)
{
    if (srv == NULL)
        return;
    kvp_conn_server_destroy(srv->local);
    kvp_conn_server_destroy(srv->conns);
    kvp_grant_keyring_cleanup(&srv->grants);
    kvp_data_pending_cleanup(&srv->pending);
    free(srv);
}
