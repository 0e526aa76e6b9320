/*
 * data_server.c - serves a segment this client owns to tcp peers, its bytes
 * wherever its backend (data_backend.h) keeps them: a DRAM segment's memory
 * (segment_server.c), an SSD segment's file (ssd/ssd_server.c). A DRAM
 * segment's memory is also handed to same-host peers that may have it (shm,
 * MAP on a Unix socket).
 *
 * Design: an accept thread plus one thread per connection (conn_server.c),
 * each in a blocking loop: read a 32-byte request header, then what follows
 * it up to the payload (vector entries, grants), check the grants and that
 * every extent lies inside the segment (and the backend's own limits), and
 * only then have the backend move the bytes. Requests on one connection are
 * handled in order, so a client pipelines by sending several headers ahead.
 * The server never looks behind the backend; the backend never sees a
 * request that was not checked.
 *
 * Vectored requests (READV/WRITEV, docs/protocol.md) carry up to
 * KVP_DATA_VEC_MAX extents after the header: one reply per chain. READ/WRITE
 * are served as a chain of one, the extent taken from the header.
 *
 * Bad requests: a READ(V) outside the segment gets an error response and the
 * connection goes on; a bad WRITE(V) (its payload cannot be placed), a bad
 * magic or an absurd entry count gets an error response where one can be
 * sent and closes the connection, since the stream can no longer be trusted.
 * Every entry is checked before any byte moves.
 *
 * Admission (conn_server.h): a connection is unauthenticated until its HELLO
 * proved a principal (data grants on) or, with nothing to prove, until a
 * first request header came in whole; each request is a frame, from its
 * header's first byte to its reply, with a deadline that its length extends.
 * A backend's per-connection state (an SSD segment's ring and buffers) is
 * made at the connection's first read or write, not as it connects: an idle
 * connection holds a thread's stack and a descriptor, nothing more.
 *
 * Counters: each request served adds its extents and bytes to srv->stats with
 * relaxed atomics just before its reply is sent (a read's taken back if its reply
 * does not all go), so a peer that has its reply always sees it counted
 * (client/metrics.c reads them).
 *
 * Threads: the connection threads of conn_server.c, several at once; the
 * settings (id, grant key) are atomics or the keyring's, read at each request.
 */
#include "client/segment/data_server.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "client/segment/conn_server.h"
#include "client/transport/wire.h"
#include "common/grant.h"
#include "common/log.h"
#include "common/sock.h"

struct kvp_data_server {
    const kvp_data_backend_ops_t *ops;
    void *backend;
    uint64_t size;
    _Atomic uint64_t segment_id;
    kvp_conn_server_t *conns;
    kvp_served_stats_t stats;   /* relaxed adds, one per request served */
    kvp_grant_keyring_t grants; /* from the last mount (data grants on: a key) */
    kvp_data_ended_t ended;     /* what the segment holds (ended puts), once set */
    kvp_data_pending_t pending; /* its begun puts (data_grant.h) */
    bool has_ended;
    _Atomic uint64_t grants_refused; /* requests refused for their grant (or its absence) */
    /* the shm hand-off (kvp_data_server_share): the segment's memfd, served on a Unix
     * socket to peers of this host that may have it */
    int mem_fd;
    kvp_conn_server_t *local;
    char local_name[64];
    _Atomic uint64_t map_refused; /* MAP requests refused */
    /* rdma memory windows (kvp_data_server_set_windows; NULL: none served here) */
    kvp_data_windows_fn windows;
    void *windows_arg;
    /* mount proofs (kvp_data_server_proof): the secret drawn at create, the name it is
     * proven for (set before the mount that sends the secret; "": none yet) */
    pthread_mutex_t proof_lock;
    uint8_t proof_secret[KVP_PROVE_SECRET_LEN];
    char proof_name[KVP_PROVE_NAME_MAX + 1];
};

_Static_assert(KVP_DATA_PROVE == KVP_PROVE_OP && KVP_DATA_MAGIC == KVP_PROVE_MAGIC,
               "the PROVE frame the master sends (common/grant.h) is this server's");

/* A connection's state between requests: its grant verifier, the principal it proved in
 * its HELLO (0: none), the backend's state for it, and room for a request's entries. */
typedef struct conn {
    struct kvp_data_server *srv;
    kvp_conn_t *conn;
    int fd;
    void *backend_conn;
    bool backend_open; /* conn_open ran (at the first read or write) */
    kvp_grant_verifier_t v;
    uint64_t tag;
    kvp_data_vec_t vec[KVP_DATA_VEC_MAX];
    kvp_data_checked_t checked; /* the extents and versions the last passed grants named */
} conn_t;

/* vec_on_wire: the request's n entries follow its header (READV/WRITEV, windows): read with
 * its grants */
static kvp_status_t check_grants(conn_t *c, const kvp_data_req_t *req, uint64_t n, bool vec_on_wire)
{
    struct kvp_data_server *srv = c->srv;
    return kvp_data_grants_check(&srv->grants, &c->v, &srv->grants_refused, srv->ops->name, c->fd,
                                 req, c->vec, n, vec_on_wire, atomic_load(&srv->segment_id), c->tag,
                                 srv->has_ended ? &srv->ended : NULL, &c->checked);
}

/* A write at the checked c->vec[0..n) is let in (its put noted by check_grants): the rdma
 * windows bound over those extents go before its first byte lands (transport.h, the
 * windows op with rkeys NULL): a window kept past its object's removal opens nothing of
 * the next object put there. */
static void windows_written(conn_t *c, uint64_t n)
{
    struct kvp_data_server *srv = c->srv;
    if (srv->windows == NULL || !c->v.on)
        return;
    uint64_t offs[KVP_DATA_VEC_MAX], lens[KVP_DATA_VEC_MAX];
    for (uint64_t i = 0; i < n; i++) {
        offs[i] = c->vec[i].offset;
        lens[i] = c->vec[i].length;
    }
    srv->windows(srv->windows_arg, 0, c->tag, offs, lens, n, true, 0, NULL, NULL, 0);
}

/* Do a request's n entries lie in our segment (and pass the backend's own check), summing
 * to the header's length? */
static kvp_status_t check_extents(const struct kvp_data_server *srv, const kvp_data_vec_t *vec,
                                  uint64_t n, uint64_t length, bool write)
{
    uint64_t id = atomic_load(&srv->segment_id), total = 0;
    for (uint64_t i = 0; i < n; i++) {
        const kvp_data_vec_t *v = &vec[i];
        if (v->segment_id != id)
            return KVP_ERR_SEGMENT_GONE;
        if (v->length == 0 || v->offset > srv->size || v->length > srv->size - v->offset)
            return KVP_ERR_OUT_OF_RANGE;
        if (srv->ops->check != NULL) {
            kvp_status_t st = srv->ops->check(srv->backend, v->offset, v->length, write);
            if (st != KVP_OK)
                return st;
        }
        if (__builtin_add_overflow(total, v->length, &total))
            return KVP_ERR_PROTOCOL;
    }
    return total == length ? KVP_OK : KVP_ERR_PROTOCOL; /* the header's length: their sum */
}

/* The backend's state for this connection, made at its first read or write (what a
 * connection that never gets that far holds is no more than its thread and fd). false:
 * it cannot be made (the backend said why); the connection closes. */
static bool backend_open(conn_t *c)
{
    struct kvp_data_server *srv = c->srv;
    if (c->backend_open || srv->ops->conn_open == NULL)
        return true;
    if (srv->ops->conn_open(srv->backend, &c->backend_conn) != KVP_OK)
        return false;
    c->backend_open = true;
    return true;
}

/* The backend reads the checked c->vec[0..n) out (total bytes): counted before its first
 * byte goes, taken back unless all did. Returns false when the connection must close. */
static bool serve_read(conn_t *c, uint64_t n, uint64_t total)
{
    struct kvp_data_server *srv = c->srv;
    kvp_status_t reply = KVP_OK;
    kvp_count_add(&srv->stats.dir[1], n, total);
    bool ok = srv->ops->read(srv->backend, c->backend_conn, c->fd, c->vec, n, total, &reply);
    if (ok && reply == KVP_OK)
        return true;
    kvp_count_sub(&srv->stats.dir[1], n, total);
    return ok && kvp_data_reply(c->fd, reply, 0) == KVP_OK;
}

/* The backend takes the checked c->vec[0..n)'s payload in; counted before the reply. */
static bool serve_write(conn_t *c, uint64_t n, uint64_t total)
{
    struct kvp_data_server *srv = c->srv;
    kvp_status_t reply = KVP_OK;
    if (!srv->ops->write(srv->backend, c->backend_conn, c->fd, c->vec, n, &reply))
        return false;
    if (reply == KVP_OK)
        kvp_count_add(&srv->stats.dir[0], n, total);
    return kvp_data_reply(c->fd, reply, 0) == KVP_OK;
}

/*
 * Serve one READ/WRITE (its extent in the header) or READV/WRITEV (its n entries after it)
 * whose header is `req`. Returns false when the connection must close (I/O failed, or a
 * write/count that cannot be trusted); an error reply has then been attempted.
 */
static bool serve_rw(conn_t *c, const kvp_data_req_t *req)
{
    struct kvp_data_server *srv = c->srv;
    bool vec_on_wire = req->op == KVP_DATA_READV || req->op == KVP_DATA_WRITEV;
    bool write = req->op == KVP_DATA_WRITE || req->op == KVP_DATA_WRITEV;
    uint64_t n = 1;
    if (vec_on_wire) {
        n = req->offset;
        if (n == 0 || n > KVP_DATA_VEC_MAX) {
            KVP_LOG_WARN_LIMITED("%s: vectored request with %llu entries (1..%d); closing",
                                 srv->ops->name, (unsigned long long)n, KVP_DATA_VEC_MAX);
            kvp_data_reply(c->fd, KVP_ERR_PROTOCOL, 0);
            return false;
        }
    } else {
        c->vec[0] = (kvp_data_vec_t){
            .segment_id = req->segment_id, .offset = req->offset, .length = req->length};
    }
    kvp_status_t st = check_grants(c, req, n, vec_on_wire);
    if (st == KVP_ERR_SEGMENT_GONE) /* a stale descriptor: a read's connection goes on */
        return kvp_data_reply(c->fd, st, 0) == KVP_OK && !write;
    if (st != KVP_OK) { /* nothing is read or written; the connection ends */
        if (st == KVP_ERR_DENIED)
            kvp_data_reply(c->fd, KVP_ERR_DENIED, 0);
        return false;
    }
    st = check_extents(srv, c->vec, n, req->length, write);
    if (st != KVP_OK) { /* a write's payload cannot be placed: the stream is lost */
        bool replied = kvp_data_reply(c->fd, st, 0) == KVP_OK;
        return replied && !write;
    }
    if (!backend_open(c))
        return false;
    /* its payload or reply: time for its bytes, once they are known to lie in the segment
     * (a length a header only claims extends nothing) */
    kvp_conn_frame_extend(c->conn, req->length);
    if (write)
        windows_written(c, n);
    return write ? serve_write(c, n, req->length) : serve_read(c, n, req->length);
}

/* An UNBIND (wire.h): invalidate the windows it names, bound on this connection's word.
 * No answer. Returns false when the connection must close. */
static bool serve_unbind(conn_t *c, uint32_t qp, uint64_t n)
{
    struct kvp_data_server *srv = c->srv;
    kvp_data_window_t w[KVP_DATA_VEC_MAX];
    uint32_t rkeys[KVP_DATA_VEC_MAX], slots[KVP_DATA_VEC_MAX];
    if (kvp_recv_all(c->fd, w, n * sizeof(*w)) != KVP_OK)
        return false;
    if (srv->windows == NULL || c->tag == 0)
        return false; /* nothing was bound on this connection's word */
    for (uint64_t i = 0; i < n; i++) {
        rkeys[i] = w[i].rkey;
        slots[i] = w[i].slot;
    }
    kvp_status_t st =
        srv->windows(srv->windows_arg, qp, c->tag, NULL, NULL, 0, false, 0, rkeys, slots, n);
    if (st == KVP_ERR_DENIED) {
        atomic_fetch_add_explicit(&srv->grants_refused, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("%s: an UNBIND for another principal's queue pair refused; closing",
                             srv->ops->name);
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
static bool serve_windows(conn_t *c, const kvp_data_req_t *req)
{
    struct kvp_data_server *srv = c->srv;
    const char *name = srv->ops->name;
    uint64_t n = req->offset;
    if (n == 0 || n > KVP_DATA_VEC_MAX || req->segment_id > UINT32_MAX) {
        KVP_LOG_WARN_LIMITED("%s: a window request with %llu entries (1..%d) or no queue pair; "
                             "closing",
                             name, (unsigned long long)n, KVP_DATA_VEC_MAX);
        kvp_data_reply(c->fd, KVP_ERR_PROTOCOL, 0);
        return false;
    }
    uint32_t qp = (uint32_t)req->segment_id;
    if (req->op == KVP_DATA_UNBIND)
        return serve_unbind(c, qp, n);
    kvp_status_t st = check_grants(c, req, n, true); /* checked as for the vectored op */
    if (st == KVP_ERR_SEGMENT_GONE)
        return kvp_data_reply(c->fd, st, 0) == KVP_OK;
    if (st != KVP_OK) {
        if (st == KVP_ERR_DENIED)
            kvp_data_reply(c->fd, KVP_ERR_DENIED, 0);
        return false;
    }
    if (srv->windows == NULL || !c->v.on || c->tag == 0) {
        KVP_LOG_WARN_LIMITED("%s: a window request, but this segment is not served through rdma "
                             "windows (KVPOOL_RDMA_WINDOWS, data grants on)",
                             name);
        return kvp_data_reply(c->fd, KVP_ERR_INVALID_ARG, 0) == KVP_OK;
    }
    bool write = req->op == KVP_DATA_BIND_WRITE;
    uint64_t offs[KVP_DATA_VEC_MAX], lens[KVP_DATA_VEC_MAX];
    uint32_t rkeys[KVP_DATA_VEC_MAX], slots[KVP_DATA_VEC_MAX];
    st = check_extents(srv, c->vec, n, req->length, write);
    for (uint64_t i = 0; i < n; i++) {
        offs[i] = c->vec[i].offset;
        lens[i] = c->vec[i].length;
    }
    if (st == KVP_OK && write)
        windows_written(c, n); /* other principals' windows there go first */
    if (st == KVP_OK)
        st = srv->windows(srv->windows_arg, qp, c->tag, offs, lens, n, write,
                          c->v.expiry_ms + KVP_GRANT_SKEW_MS, rkeys, slots, 0);
    const char *why = NULL;
    if (st == KVP_OK && (why = kvp_data_extents_recheck(srv->has_ended ? &srv->ended : NULL,
                                                        c->v.gen, &c->checked)) != NULL) {
        /* a later put was let in at an extent between the check and the bind (its scan of
         * the windows may have missed these): undone, refused like a stale grant */
        srv->windows(srv->windows_arg, qp, c->tag, NULL, NULL, 0, false, 0, rkeys, slots, n);
        atomic_fetch_add_explicit(&srv->grants_refused, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("%s: windows refused: %s; closing", name, why);
        kvp_data_reply(c->fd, KVP_ERR_DENIED, 0);
        return false;
    }
    if (st == KVP_ERR_DENIED) {
        atomic_fetch_add_explicit(&srv->grants_refused, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("%s: windows asked for another principal's queue pair refused; "
                             "closing",
                             name);
        kvp_data_reply(c->fd, KVP_ERR_DENIED, 0);
        return false;
    }
    if (st != KVP_OK)
        return kvp_data_reply(c->fd, st, 0) == KVP_OK;
    kvp_data_window_t w[KVP_DATA_VEC_MAX];
    for (uint64_t i = 0; i < n; i++)
        w[i] = (kvp_data_window_t){.rkey = rkeys[i], .slot = slots[i]};
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = n * sizeof(*w)};
    struct iovec iov[2] = {{&r, sizeof(r)}, {w, n * sizeof(*w)}};
    return kvp_sendv_all(c->fd, iov, 2) == KVP_OK;
}

/*
 * A MAP (wire.h): hand the segment's memfd to a peer of this host that may have it: on the
 * Unix socket, running as our user or root (SO_PEERCRED), naming the whole segment, with a
 * MAP grant for the principal it proved in its HELLO (grants on). Refused: counted, logged,
 * KVP_ERR_DENIED, no descriptor. The connection ends either way.
 */
static void serve_map(conn_t *c, const kvp_data_req_t *req)
{
    struct kvp_data_server *srv = c->srv;
    int pid = 0;
    uint32_t uid = 0;
    const char *why = NULL;
    uint64_t id = atomic_load(&srv->segment_id);
    if (srv->mem_fd < 0 || !kvp_unix_peer(c->fd, &pid, &uid))
        why = "a MAP on a connection that is not the segment's Unix socket";
    else if (uid != geteuid() && uid != 0)
        why = "the peer runs as another user";
    else if (req->segment_id != id || req->offset != 0 || req->length != srv->size)
        why = "a MAP must name the whole of this segment";
    if (why != NULL) {
        atomic_fetch_add_explicit(&srv->map_refused, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("%s: a map from pid %d (uid %u) refused: %s; closing", srv->ops->name,
                             pid, uid, why);
        kvp_data_reply(c->fd, KVP_ERR_DENIED, 0);
        return;
    }
    kvp_data_vec_t whole = {.segment_id = id, .offset = 0, .length = srv->size};
    kvp_status_t st = kvp_data_grants_check(&srv->grants, &c->v, &srv->map_refused, srv->ops->name,
                                            c->fd, req, &whole, 1, false, id, c->tag, NULL, NULL);
    if (st != KVP_OK) {
        if (st == KVP_ERR_DENIED)
            kvp_data_reply(c->fd, KVP_ERR_DENIED, 0);
        return;
    }
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = srv->size};
    if (kvp_unix_send_fd(c->fd, &r, sizeof(r), srv->mem_fd) == KVP_OK)
        KVP_LOG_DEBUG("%s: segment memory handed to pid %d (uid %u)", srv->ops->name, pid, uid);
}

/*
 * A PROVE (wire.h): the master asks whether this server serves the segment a mount names.
 * Answered with the proof of our secret when the name is ours, KVP_ERR_DENIED otherwise
 * (logged, no secret); the connection ends either way.
 */
static void serve_prove(conn_t *c, const kvp_data_req_t *req)
{
    struct kvp_data_server *srv = c->srv;
    uint8_t body[KVP_PROVE_NONCE_LEN + KVP_PROVE_NAME_MAX + 1];
    if (req->segment_id != 0 || req->offset != 0 || req->length <= KVP_PROVE_NONCE_LEN ||
        req->length > KVP_PROVE_NONCE_LEN + KVP_PROVE_NAME_MAX) {
        KVP_LOG_WARN_LIMITED("%s: a malformed PROVE; closing", srv->ops->name);
        kvp_data_reply(c->fd, KVP_ERR_DENIED, 0);
        return;
    }
    size_t len = (size_t)req->length;
    if (kvp_recv_all(c->fd, body, len) != KVP_OK)
        return;
    body[len] = '\0';
    const char *name = (const char *)body + KVP_PROVE_NONCE_LEN;
    uint8_t proof[KVP_PROVE_LEN];
    pthread_mutex_lock(&srv->proof_lock);
    bool ours = srv->proof_name[0] != '\0' && strlen(name) == len - KVP_PROVE_NONCE_LEN &&
                strcmp(name, srv->proof_name) == 0 &&
                kvp_grant_mount_proof(srv->proof_secret, body, name, proof);
    pthread_mutex_unlock(&srv->proof_lock);
    if (!ours) {
        char peer[80];
        kvp_sock_peer_name(c->fd, peer, sizeof(peer));
        KVP_LOG_WARN_LIMITED("%s: %s asked this server to prove it serves segment %.255s, which "
                             "it does not serve: a mount names this endpoint for another "
                             "segment (refused)",
                             srv->ops->name, peer, name);
        kvp_data_reply(c->fd, KVP_ERR_DENIED, 0);
        return;
    }
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = KVP_PROVE_LEN};
    struct iovec iov[2] = {{&r, sizeof(r)}, {proof, sizeof(proof)}};
    (void)kvp_sendv_all(c->fd, iov, 2);
}

/* Serve one request whose header is req. Returns false when the connection ends. */
static bool serve_frame(conn_t *c, const kvp_data_req_t *req)
{
    struct kvp_data_server *srv = c->srv;
    unsigned frames = srv->ops->frames;
    if (req->magic == KVP_DATA_MAGIC) {
        switch (req->op) {
        case KVP_DATA_READ:
        case KVP_DATA_WRITE:
        case KVP_DATA_READV:
        case KVP_DATA_WRITEV:
            return serve_rw(c, req);
        case KVP_DATA_HELLO:
            return kvp_data_hello(&srv->grants, &c->v, &srv->grants_refused, srv->ops->name, c->fd,
                                  req, atomic_load(&srv->segment_id), &c->tag) == KVP_OK;
        case KVP_DATA_PROVE:
            serve_prove(c, req);
            return false;
        case KVP_DATA_MAP:
            if ((frames & KVP_DATA_FRAME_MAP) == 0)
                break;
            serve_map(c, req);
            return false;
        case KVP_DATA_BIND_READ:
        case KVP_DATA_BIND_WRITE:
        case KVP_DATA_UNBIND:
            if ((frames & KVP_DATA_FRAME_WINDOWS) == 0)
                break;
            return serve_windows(c, req);
        default: /* the backend's own (a transfer engine's), if it has any */
            if (srv->ops->op_frame == NULL)
                break;
            if (!backend_open(c))
                return false;
            kvp_data_op_t done =
                srv->ops->op_frame(srv->backend, c->backend_conn, c->conn, c->fd, req);
            if (done != KVP_DATA_OP_UNKNOWN)
                return done == KVP_DATA_OP_GO_ON;
            break;
        }
    }
    KVP_LOG_WARN_LIMITED("%s: bad request header (magic %#x op %u); closing", srv->ops->name,
                         req->magic, req->op);
    return false;
}

/* A connection not yet admitted (conn_server.h) is, once it proved a principal in a HELLO
 * (data grants on), or the backend's proof (ops->proved), or with nothing to prove once a
 * request's header came in whole (a first request that moves many bytes is then timed as a
 * request, not as a handshake). */
static void admit(conn_t *c)
{
    if (kvp_conn_admitted(c->conn) || !kvp_grant_verifier_sync(&c->v, &c->srv->grants))
        return;
    const kvp_data_backend_ops_t *ops = c->srv->ops;
    if (ops->proved != NULL && !(c->backend_open && ops->proved(c->srv->backend, c->backend_conn)))
        return; /* the backend's proof first (the engine's TE_AUTH) */
    if (!c->v.on || c->tag != 0)
        kvp_conn_admit(c->conn);
}

/* One request of the connection (its frame). Returns false when the connection ends. */
static bool serve_request(conn_t *c)
{
    kvp_data_req_t req;
    if (kvp_conn_recv_head(c->conn, &req, sizeof(req)) != KVP_OK)
        return false;
    if (req.magic == KVP_DATA_MAGIC)
        admit(c);
    bool ok = serve_frame(c, &req);
    if (ok) {
        admit(c); /* a HELLO's proof */
        kvp_conn_frame_end(c->conn);
    }
    return ok;
}

/* One connection's requests, in order, until it ends or cannot be trusted. */
static void serve_conn(void *arg, kvp_conn_t *conn)
{
    struct kvp_data_server *srv = arg;
    conn_t c = {.srv = srv, .conn = conn, .fd = kvp_conn_fd(conn), .v = {0}};
    while (serve_request(&c))
        ;
    kvp_grant_verifier_cleanup(&c.v);
    if (c.backend_open && srv->ops->conn_close != NULL)
        srv->ops->conn_close(srv->backend, c.backend_conn);
}

kvp_status_t kvp_data_server_create(const kvp_data_server_params_t *p, kvp_data_server_t **srv_p,
                                    uint16_t *bound_port_p)
{
    struct kvp_data_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return KVP_ERR_NOMEM;
    srv->ops = p->ops;
    srv->backend = p->backend;
    srv->size = p->size;
    srv->mem_fd = -1;
    atomic_store(&srv->segment_id, p->segment_id);
    if (!kvp_grant_random(srv->proof_secret, sizeof(srv->proof_secret))) {
        free(srv);
        return KVP_ERR_SYSTEM;
    }
    pthread_mutex_init(&srv->proof_lock, NULL);
    kvp_grant_keyring_init(&srv->grants);
    kvp_data_pending_init(&srv->pending);
    kvp_data_server_set_versions(srv, p->versions_at, p->wait_recorded, p->versions_arg);
    snprintf(srv->local_name, sizeof(srv->local_name), "%s (shm)", p->ops->name);
    kvp_status_t status = kvp_conn_server_create(p->ops->name, p->host, p->port, p->protected_mode,
                                                 serve_conn, srv, &srv->conns, bound_port_p);
    if (status != KVP_OK) {
        pthread_mutex_destroy(&srv->proof_lock);
        kvp_grant_keyring_cleanup(&srv->grants);
        kvp_data_pending_cleanup(&srv->pending);
        free(srv);
        return status;
    }
    *srv_p = srv;
    return KVP_OK;
}

void kvp_data_server_destroy(kvp_data_server_t *srv)
{
    if (srv == NULL)
        return;
    kvp_conn_server_destroy(srv->local);
    kvp_conn_server_destroy(srv->conns);
    if (srv->ops->destroy != NULL)
        srv->ops->destroy(srv->backend);
    kvp_grant_keyring_cleanup(&srv->grants);
    kvp_data_pending_cleanup(&srv->pending);
    explicit_bzero(srv->proof_secret, sizeof(srv->proof_secret));
    pthread_mutex_destroy(&srv->proof_lock);
    free(srv);
}

void kvp_data_server_proof(kvp_data_server_t *srv, const char *name,
                           uint8_t secret[KVP_PROVE_SECRET_LEN])
{
    pthread_mutex_lock(&srv->proof_lock);
    snprintf(srv->proof_name, sizeof(srv->proof_name), "%s", name);
    memcpy(secret, srv->proof_secret, KVP_PROVE_SECRET_LEN);
    pthread_mutex_unlock(&srv->proof_lock);
}

void *kvp_data_server_backend(const kvp_data_server_t *srv)
{
    return srv->backend;
}

void kvp_data_server_set_id(kvp_data_server_t *srv, uint64_t segment_id)
{
    atomic_store(&srv->segment_id, segment_id);
}

void kvp_data_server_set_grants(kvp_data_server_t *srv, const uint8_t *key, size_t key_len,
                                uint64_t epoch)
{
    kvp_grant_keyring_set(&srv->grants, key, key_len, epoch);
}

void kvp_data_server_set_versions(kvp_data_server_t *srv,
                                  void (*versions_at)(void *arg, const uint64_t *offsets,
                                                      uint64_t *versions, size_t n),
                                  bool (*wait_recorded)(void *arg, const uint64_t *offsets,
                                                        const uint64_t *versions, size_t n),
                                  void *arg)
{
    srv->ended = (kvp_data_ended_t){.versions_at = versions_at,
                                    .wait_recorded = wait_recorded,
                                    .arg = arg,
                                    .pending = &srv->pending};
    srv->has_ended = versions_at != NULL;
}

kvp_data_pending_t *kvp_data_server_pending(kvp_data_server_t *srv)
{
    return &srv->pending;
}

kvp_status_t kvp_data_server_share(kvp_data_server_t *srv, int mem_fd, const char *sock_name)
{
    srv->mem_fd = mem_fd;
    return kvp_conn_server_create_unix(srv->local_name, sock_name, serve_conn, srv, &srv->local);
}

void kvp_data_server_set_windows(kvp_data_server_t *srv, kvp_data_windows_fn fn, void *arg)
{
    srv->windows = fn;
    srv->windows_arg = arg;
}

const kvp_served_stats_t *kvp_data_server_stats(const kvp_data_server_t *srv)
{
    return &srv->stats;
}

uint64_t kvp_data_server_refused(const kvp_data_server_t *srv)
{
    return kvp_conn_server_refused(srv->conns);
}

uint64_t kvp_data_server_grants_refused(const kvp_data_server_t *srv)
{
    return atomic_load_explicit(&srv->grants_refused, memory_order_relaxed);
}

uint64_t kvp_data_server_map_refused(const kvp_data_server_t *srv)
{
    return atomic_load_explicit(&srv->map_refused, memory_order_relaxed);
}

void kvp_data_server_admission(const kvp_data_server_t *srv, kvp_conn_refusals_t *sum)
{
    if (srv == NULL)
        return;
    kvp_conn_server_refusals(srv->conns, sum);
    kvp_conn_server_refusals(srv->local, sum);
}
