/*
 * ssd_server.c - serves an SSD segment to tcp peers, the bytes living in the
 * segment's file.
 *
 * Design: segment/segment_server.c's, with the file in place of memory: an
 * accept thread plus one thread per connection, each in a blocking loop that
 * reads a 32-byte request header, checks every extent, then moves the
 * bytes. Each connection thread owns an io_uring (ssd_io.h) and
 * KVP_SSD_IO_DEPTH aligned buffers of KVP_SSD_IO_CHUNK, made once when the
 * connection starts: a request allocates nothing.
 *
 *  - READ / READV: the 4 KiB-aligned file range covering each extent is read
 *    in chunks, up to the depth in flight; chunks are sent in order as they
 *    complete (the exact requested bytes of each), and each sent buffer is
 *    refilled with the next chunk. The response header goes out with the
 *    first chunk, so an I/O error before any payload byte is an error reply
 *    (KVP_ERR_IO) and the connection goes on; after that the connection is
 *    closed (the peer sees a broken stream).
 *  - WRITE / WRITEV: each extent must start on a block (extents are whole
 *    blocks of the segment); the payload is received chunk by chunk into the
 *    buffers, the last partial block zero-padded, and written while the next
 *    chunk is received. The reply comes once every write completed. No
 *    fsync: the owner's kvp_ssd_file_record syncs the data before it records.
 *    An I/O error drains the rest of the payload and replies KVP_ERR_IO.
 *
 * Bad requests as in segment_server.c: a READ(V) outside the segment gets an
 * error reply and the connection goes on; a bad WRITE(V) (its payload cannot
 * be placed: outside the segment, wrong segment, unaligned offset), a bad
 * magic or an absurd entry count gets an error reply where one can be sent
 * and closes the connection. Every entry is checked before any byte moves.
 *
 * Threads: connections come and go as segment/conn_server.c runs them (an
 * accept thread, a thread per connection); this file serves one. `bad_lock`
 * guards the list of extents whose reads failed.
 */
#include "client/ssd/ssd_server.h"

#include <errno.h>
#include <pthread.h>
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
#include "client/ssd/ssd_io.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/sock.h"

#define DEPTH KVP_SSD_IO_DEPTH
#define CHUNK ((uint64_t)KVP_SSD_IO_CHUNK)
#define BLOCK ((uint64_t)KVP_SSD_BLOCK)

struct kvp_ssd_server {
    kvp_ssd_file_t *file;
    kvp_data_ended_t ended; /* the file's entries: a write grant ends when its put is recorded */
    kvp_data_pending_t pending; /* its begun puts (data_grant.h) */
    int file_fd;
    uint64_t base; /* file offset of segment byte 0 */
    uint64_t size;
    _Atomic uint64_t segment_id;
    _Atomic uint64_t io_errors;
    kvp_served_stats_t stats; /* requests served (relaxed adds, client/metrics.c reads) */
    kvp_conn_server_t *conns;
    pthread_mutex_t bad_lock;
    /* extents whose reads failed with an I/O error, for the owner to report (bad_lock) */
    uint64_t bad[KVP_SSD_SERVER_BAD_MAX];
    size_t n_bad;
    kvp_grant_keyring_t grants;      /* from the last mount (data grants on: a key) */
    _Atomic uint64_t grants_refused; /* requests refused for their grant (or its absence) */
};

/* One piece of a read: a chunk of the file and the bytes of it to send. */
typedef struct rd_chunk {
    uint64_t send_at;  /* offset in the buffer of the first byte to send */
    uint64_t send_len; /* bytes to send */
} rd_chunk_t;

/* Walks the chunks of a list of extents. */
typedef struct cursor {
    const kvp_data_vec_t *v;
    size_t n, i;
    uint64_t at; /* segment offset of the next chunk of extent i */
    bool started;
} cursor_t;

/* A connection's I/O state, made once per connection. */
typedef struct conn_io {
    kvp_ssd_io_t *io;
    uint8_t *buf[DEPTH];
    kvp_ssd_iov_t ops[DEPTH];
    rd_chunk_t ch[DEPTH];
    kvp_data_vec_t vec[KVP_DATA_VEC_MAX];
    kvp_grant_verifier_t v; /* the connection's grant check (segment/data_grant.h) */
    uint64_t tag;           /* the principal it proved in its HELLO (0: none) */
} conn_io_t;

static uint64_t round_down(uint64_t x)
{
    return x / BLOCK * BLOCK;
}

static uint64_t round_up(uint64_t x)
{
    return (x + BLOCK - 1) / BLOCK * BLOCK;
}

/* Check one extent of a request against the segment. */
static kvp_status_t check_extent(const struct kvp_ssd_server *srv, uint64_t id, uint64_t off,
                                 uint64_t len, bool write)
{
    if (id != atomic_load(&srv->segment_id))
        return KVP_ERR_SEGMENT_GONE;
    if (len == 0 || off > srv->size || len > srv->size - off)
        return KVP_ERR_OUT_OF_RANGE;
    /* the aligned file range moved must stay inside the data area too */
    if (round_up(off + len) > srv->size)
        return KVP_ERR_OUT_OF_RANGE;
    if (write && off % BLOCK != 0)
        return KVP_ERR_INVALID_ARG;
    return KVP_OK;
}

/* The next read chunk of the cursor's extents: file range into op, send window into ch. */
static bool next_read_chunk(const struct kvp_ssd_server *srv, cursor_t *cur, kvp_ssd_iov_t *op,
                            rd_chunk_t *ch)
{
    while (cur->i < cur->n) {
        const kvp_data_vec_t *v = &cur->v[cur->i];
        uint64_t lo = v->offset, hi = v->offset + v->length;
        if (!cur->started) {
            cur->at = round_down(lo);
            cur->started = true;
        }
        uint64_t a1 = round_up(hi);
        if (cur->at < a1) {
            op->file_off = srv->base + cur->at;
            op->len = KVP_MIN(CHUNK, a1 - cur->at);
            uint64_t s0 = KVP_MAX(lo, cur->at), s1 = KVP_MIN(hi, cur->at + op->len);
            ch->send_at = s0 - cur->at;
            ch->send_len = s1 - s0;
            cur->at += op->len;
            return true;
        }
        cur->i++;
        cur->started = false;
    }
    return false;
}

/* A read of segment offset `at` failed with an I/O error: remember the extent of v[0..n)
 * that holds it (once), so that the owner reports that object as lost. */
static void note_bad(struct kvp_ssd_server *srv, const kvp_data_vec_t *v, size_t n, uint64_t at)
{
    for (size_t j = 0; j < n; j++) {
        if (at < v[j].offset || at >= v[j].offset + v[j].length)
            continue;
        pthread_mutex_lock(&srv->bad_lock);
        bool known = false;
        for (size_t b = 0; b < srv->n_bad; b++)
            known |= srv->bad[b] == v[j].offset;
        if (!known && srv->n_bad < KVP_SSD_SERVER_BAD_MAX)
            srv->bad[srv->n_bad++] = v[j].offset;
        pthread_mutex_unlock(&srv->bad_lock);
        return;
    }
}

size_t kvp_ssd_server_take_bad(kvp_ssd_server_t *srv, uint64_t *offsets, size_t max)
{
    pthread_mutex_lock(&srv->bad_lock);
    size_t n = srv->n_bad < max ? srv->n_bad : max;
    memcpy(offsets, srv->bad, n * sizeof(*offsets));
    memmove(srv->bad, srv->bad + n, (srv->n_bad - n) * sizeof(*offsets));
    srv->n_bad -= n;
    pthread_mutex_unlock(&srv->bad_lock);
    return n;
}

/*
 * Send the bytes of extents v[0..n) (checked; total bytes in all): the response header,
 * then the payload, read ahead DEPTH chunks deep. Returns false when the connection must
 * close.
 */
static bool serve_reads(struct kvp_ssd_server *srv, conn_io_t *cio, int fd, const kvp_data_vec_t *v,
                        size_t n, uint64_t total)
{
    cursor_t cur = {.v = v, .n = n};
    size_t issued = 0, done = 0;
    /* counted before the first byte goes, taken back on failure: a peer that has its
     * bytes always sees them counted */
    kvp_count_add(&srv->stats.dir[1], n, total);
    bool hdr_sent = false, ok = true;
    kvp_status_t io_st = KVP_OK;
    while (issued - done < DEPTH) {
        size_t k = issued % DEPTH;
        if (!next_read_chunk(srv, &cur, &cio->ops[k], &cio->ch[k]))
            break;
        cio->ops[k].buf = cio->buf[k];
        if (kvp_ssd_io_start(cio->io, srv->file_fd, false, &cio->ops[k]) != KVP_OK) {
            io_st = KVP_ERR_SYSTEM;
            break;
        }
        issued++;
    }
    while (done < issued) {
        size_t k = done % DEPTH;
        kvp_status_t st = kvp_ssd_io_wait(cio->io, &cio->ops[k]);
        done++;
        if (!ok || io_st != KVP_OK)
            continue; /* draining: the kernel is done with the buffers when this loop is */
        if (st != KVP_OK) {
            io_st = st;
            if (st == KVP_ERR_IO)
                note_bad(srv, v, n, cio->ops[k].file_off - srv->base);
            continue;
        }
        const rd_chunk_t *ch = &cio->ch[k];
        struct iovec iov[2];
        int iovcnt = 0;
        kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = total};
        if (!hdr_sent)
            iov[iovcnt++] = (struct iovec){.iov_base = &r, .iov_len = sizeof(r)};
        iov[iovcnt++] =
            (struct iovec){.iov_base = cio->buf[k] + ch->send_at, .iov_len = ch->send_len};
        if (kvp_sendv_all(fd, iov, iovcnt) != KVP_OK) {
            ok = false;
            continue;
        }
        hdr_sent = true;
        if (next_read_chunk(srv, &cur, &cio->ops[k], &cio->ch[k])) {
            cio->ops[k].buf = cio->buf[k];
            if (kvp_ssd_io_start(cio->io, srv->file_fd, false, &cio->ops[k]) != KVP_OK)
                io_st = KVP_ERR_SYSTEM;
            else
                issued++;
        }
    }
    if (io_st == KVP_OK && issued == 0 && total > 0)
        io_st = KVP_ERR_SYSTEM; /* nothing could be started */
    if (io_st != KVP_OK || !ok)
        kvp_count_sub(&srv->stats.dir[1], n, total);
    if (io_st != KVP_OK) {
        atomic_fetch_add(&srv->io_errors, 1);
        KVP_LOG_WARN_LIMITED("ssd server: reading %s failed (%s)%s", kvp_ssd_file_path(srv->file),
                             kvp_strerror(io_st),
                             hdr_sent ? "; closing the connection mid-reply" : "");
        if (hdr_sent)
            return false;
        return ok && kvp_data_reply(fd, KVP_ERR_IO, 0) == KVP_OK;
    }
    return ok;
}

/*
 * Receive the payload of extents v[0..n) (checked, aligned) and write it to the file,
 * then reply. Returns false when the connection must close.
 */
static bool serve_writes(struct kvp_ssd_server *srv, conn_io_t *cio, int fd,
                         const kvp_data_vec_t *v, size_t n)
{
    size_t issued = 0, done = 0;
    kvp_status_t io_st = KVP_OK;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        for (uint64_t at = 0; at < v[i].length && ok;) {
            size_t k = issued % DEPTH;
            if (issued - done == DEPTH) { /* the buffer's previous write must be over */
                kvp_status_t st = kvp_ssd_io_wait(cio->io, &cio->ops[done % DEPTH]);
                done++;
                if (st != KVP_OK && io_st == KVP_OK)
                    io_st = st;
            }
            uint64_t len = KVP_MIN(CHUNK, v[i].length - at);
            if (kvp_recv_all(fd, cio->buf[k], len) != KVP_OK) {
                ok = false;
                break;
            }
            if (io_st == KVP_OK) { /* after a failure the rest is only drained */
                uint64_t padded = round_up(len);
                memset(cio->buf[k] + len, 0, padded - len);
                cio->ops[k] = (kvp_ssd_iov_t){
                    .buf = cio->buf[k], .file_off = srv->base + v[i].offset + at, .len = padded};
                if (kvp_ssd_io_start(cio->io, srv->file_fd, true, &cio->ops[k]) != KVP_OK)
                    io_st = KVP_ERR_SYSTEM;
                else
                    issued++;
            }
            at += len;
        }
    }
    while (done < issued) {
        kvp_status_t st = kvp_ssd_io_wait(cio->io, &cio->ops[done % DEPTH]);
        done++;
        if (st != KVP_OK && io_st == KVP_OK)
            io_st = st;
    }
    if (!ok)
        return false;
    if (io_st != KVP_OK) {
        atomic_fetch_add(&srv->io_errors, 1);
        KVP_LOG_WARN_LIMITED("ssd server: writing %s failed (%s)", kvp_ssd_file_path(srv->file),
                             kvp_strerror(io_st));
        return kvp_data_reply(fd, io_st == KVP_ERR_NO_SPACE ? KVP_ERR_NO_SPACE : KVP_ERR_IO, 0) ==
               KVP_OK;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += v[i].length;
    kvp_count_add(&srv->stats.dir[0], n, total);
    return kvp_data_reply(fd, KVP_OK, 0) == KVP_OK;
}

/* Serve one READV/WRITEV whose header is `req`. Returns false when the connection must
 * close (an error reply has then been attempted where one can be sent). */
static bool serve_vec(struct kvp_ssd_server *srv, conn_io_t *cio, int fd, const kvp_data_req_t *req)
{
    kvp_data_vec_t *vec = cio->vec;
    uint64_t n = req->offset;
    if (n == 0 || n > KVP_DATA_VEC_MAX) {
        KVP_LOG_WARN_LIMITED("ssd server: vectored request with %llu entries (1..%d); closing",
                             (unsigned long long)n, KVP_DATA_VEC_MAX);
        kvp_data_reply(fd, KVP_ERR_PROTOCOL, 0);
        return false;
    }
    kvp_status_t gst =
        kvp_data_grants_check(&srv->grants, &cio->v, &srv->grants_refused, "ssd server", fd, req,
                              vec, n, true, atomic_load(&srv->segment_id), cio->tag, &srv->ended);
    if (gst == KVP_ERR_SEGMENT_GONE) /* a stale descriptor: a read's connection goes on */
        return kvp_data_reply(fd, gst, 0) == KVP_OK && req->op == KVP_DATA_READV;
    if (gst != KVP_OK) { /* nothing is read or written; the connection ends */
        if (gst == KVP_ERR_DENIED)
            kvp_data_reply(fd, KVP_ERR_DENIED, 0);
        return false;
    }
    bool write = req->op == KVP_DATA_WRITEV;
    kvp_status_t st = KVP_OK;
    uint64_t total = 0;
    for (uint64_t i = 0; i < n && st == KVP_OK; i++) {
        st = check_extent(srv, vec[i].segment_id, vec[i].offset, vec[i].length, write);
        if (st == KVP_OK && __builtin_add_overflow(total, vec[i].length, &total))
            st = KVP_ERR_PROTOCOL;
    }
    if (st == KVP_OK && total != req->length)
        st = KVP_ERR_PROTOCOL; /* the header's length must be the entries' sum */
    if (write) {
        if (st != KVP_OK) {
            kvp_data_reply(fd, st, 0);
            return false;
        }
        return serve_writes(srv, cio, fd, vec, n);
    }
    if (st != KVP_OK)
        return kvp_data_reply(fd, st, 0) == KVP_OK;
    return serve_reads(srv, cio, fd, vec, n, total);
}

static void conn_io_cleanup(conn_io_t *cio)
{
    kvp_grant_verifier_cleanup(&cio->v);
    for (unsigned i = 0; i < DEPTH; i++)
        free(cio->buf[i]);
    kvp_ssd_io_destroy(cio->io);
    free(cio);
}

static conn_io_t *conn_io_create(struct kvp_ssd_server *srv)
{
    conn_io_t *cio = calloc(1, sizeof(*cio));
    if (cio == NULL)
        return NULL;
    if (kvp_ssd_io_create(DEPTH, &cio->io) != KVP_OK) {
        free(cio);
        return NULL;
    }
    kvp_ssd_io_set_stats(cio->io, kvp_ssd_file_io_stats(srv->file));
    for (unsigned i = 0; i < DEPTH; i++) {
        cio->buf[i] = kvp_ssd_buf_alloc(CHUNK);
        if (cio->buf[i] == NULL) {
            conn_io_cleanup(cio);
            return NULL;
        }
    }
    return cio;
}

/* One connection's requests, in order, until it ends or cannot be trusted. */
static void serve_conn(void *arg, int fd)
{
    struct kvp_ssd_server *srv = arg;
    conn_io_t *cio = conn_io_create(srv);
    if (cio == NULL)
        KVP_LOG_WARN_LIMITED("ssd server: no ring or buffers for a connection; closing it");
    for (; cio != NULL;) {
        kvp_data_req_t req;
        if (kvp_recv_all(fd, &req, sizeof(req)) != KVP_OK)
            break;
        if (req.magic == KVP_DATA_MAGIC &&
            (req.op == KVP_DATA_READV || req.op == KVP_DATA_WRITEV)) {
            if (!serve_vec(srv, cio, fd, &req))
                break;
            continue;
        }
        if (req.magic == KVP_DATA_MAGIC && req.op == KVP_DATA_HELLO) {
            if (kvp_data_hello(&srv->grants, &cio->v, &srv->grants_refused, "ssd server", fd, &req,
                               atomic_load(&srv->segment_id), &cio->tag) != KVP_OK)
                break;
            continue;
        }
        if (req.magic != KVP_DATA_MAGIC || (req.op != KVP_DATA_READ && req.op != KVP_DATA_WRITE)) {
            KVP_LOG_WARN_LIMITED("ssd server: bad request header (magic %#x op %u); closing",
                                 req.magic, req.op);
            break;
        }
        bool write = req.op == KVP_DATA_WRITE;
        kvp_data_vec_t one = {
            .segment_id = req.segment_id, .offset = req.offset, .length = req.length};
        kvp_status_t gst = kvp_data_grants_check(
            &srv->grants, &cio->v, &srv->grants_refused, "ssd server", fd, &req, &one, 1, false,
            atomic_load(&srv->segment_id), cio->tag, &srv->ended);
        if (gst == KVP_ERR_SEGMENT_GONE) { /* a stale descriptor: a read's connection goes on */
            if (kvp_data_reply(fd, gst, 0) == KVP_OK && !write)
                continue;
            break;
        }
        if (gst != KVP_OK) { /* nothing is read or written; the connection ends */
            if (gst == KVP_ERR_DENIED)
                kvp_data_reply(fd, KVP_ERR_DENIED, 0);
            break;
        }
        kvp_status_t st = check_extent(srv, req.segment_id, req.offset, req.length, write);
        if (write) {
            if (st != KVP_OK) {
                kvp_data_reply(fd, st, 0);
                break;
            }
            if (!serve_writes(srv, cio, fd, &one, 1))
                break;
        } else {
            if (st != KVP_OK) {
                if (kvp_data_reply(fd, st, 0) != KVP_OK)
                    break;
                continue;
            }
            if (!serve_reads(srv, cio, fd, &one, 1, req.length))
                break;
        }
    }
    if (cio != NULL)
        conn_io_cleanup(cio);
}

static void file_versions_at(void *file, const uint64_t *offsets, uint64_t *versions, size_t n)
{
    kvp_ssd_file_versions_at(file, offsets, versions, n);
}

kvp_status_t kvp_ssd_server_create(kvp_ssd_file_t *f, const char *host, uint16_t port,
                                   bool protected_mode, kvp_ssd_server_t **srv_p,
                                   uint16_t *bound_port_p)
{
    struct kvp_ssd_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return KVP_ERR_NOMEM;
    srv->file = f;
    kvp_data_pending_init(&srv->pending);
    srv->ended =
        (kvp_data_ended_t){.versions_at = file_versions_at, .arg = f, .pending = &srv->pending};
    srv->file_fd = kvp_ssd_file_fd(f);
    srv->base = kvp_ssd_file_data_base(f);
    srv->size = kvp_ssd_file_size(f);
    atomic_store(&srv->segment_id, 0);
    atomic_store(&srv->io_errors, 0);
    pthread_mutex_init(&srv->bad_lock, NULL);
    kvp_grant_keyring_init(&srv->grants);
    kvp_status_t status = kvp_conn_server_create("ssd server", host, port, protected_mode,
                                                 serve_conn, srv, &srv->conns, bound_port_p);
    if (status != KVP_OK) {
        pthread_mutex_destroy(&srv->bad_lock);
        kvp_grant_keyring_cleanup(&srv->grants);
        kvp_data_pending_cleanup(&srv->pending);
        free(srv);
        return status;
    }
    *srv_p = srv;
    return KVP_OK;
}

void kvp_ssd_server_set_id(kvp_ssd_server_t *srv, uint64_t segment_id)
{
    atomic_store(&srv->segment_id, segment_id);
}

void kvp_ssd_server_set_grants(kvp_ssd_server_t *srv, const uint8_t *key, size_t key_len,
                               uint64_t epoch)
{
    kvp_grant_keyring_set(&srv->grants, key, key_len, epoch);
}

uint64_t kvp_ssd_server_grants_refused(const kvp_ssd_server_t *srv)
{
    return atomic_load_explicit(&srv->grants_refused, memory_order_relaxed);
}

const kvp_served_stats_t *kvp_ssd_server_stats(const kvp_ssd_server_t *srv)
{
    return &srv->stats;
}

uint64_t kvp_ssd_server_refused(const kvp_ssd_server_t *srv)
{
    return kvp_conn_server_refused(srv->conns);
}

uint64_t kvp_ssd_server_io_errors(const kvp_ssd_server_t *srv)
{
    return atomic_load(&srv->io_errors);
}

void kvp_ssd_server_recorded(kvp_ssd_server_t *srv, uint64_t offset, uint64_t version)
{
    kvp_data_pending_forget(&srv->pending, offset, version);
}

void kvp_ssd_server_destroy(kvp_ssd_server_t *srv)
{
    if (srv == NULL)
        return;
    kvp_conn_server_destroy(srv->conns);
    pthread_mutex_destroy(&srv->bad_lock);
    kvp_grant_keyring_cleanup(&srv->grants);
    kvp_data_pending_cleanup(&srv->pending);
    free(srv);
}
