/*
 * ssd_server.c - the file backend of the data server (segment/data_backend.h):
 * an SSD segment's bytes live in the segment's file, moved through io_uring
 * with O_DIRECT (ssd_io.h). The data server (segment/data_server.c) reads and
 * checks every request; this file moves the bytes of checked extents.
 *
 * Design: each connection owns an io_uring and KVP_SSD_IO_DEPTH aligned
 * buffers of KVP_SSD_IO_CHUNK, made once, at the connection's first read or
 * write (conn_open; an idle connection has none): a request allocates nothing.
 *
 *  - READ / READV: the 4 KiB-aligned file range covering each extent is read
 *    in chunks, up to the depth in flight; chunks are sent in order as they
 *    complete (the exact requested bytes of each), and each sent buffer is
 *    refilled with the next chunk. The response header goes out with the
 *    first chunk, so an I/O error before any payload byte is an error reply
 *    (KVP_ERR_IO) and the connection goes on; after that the connection is
 *    closed (the peer sees a broken stream).
 *  - WRITE / WRITEV: each extent must start on a block (extents are whole
 *    blocks of the segment: check); the payload is received chunk by chunk
 *    into the buffers, the last partial block zero-padded, and written while
 *    the next chunk is received. The reply comes once every write completed.
 *    No fsync: the owner's kvp_ssd_file_record syncs the data before it
 *    records. An I/O error drains the rest of the payload and replies
 *    KVP_ERR_IO (KVP_ERR_NO_SPACE when the disk is full).
 *
 * Beside the server's checks, an extent's aligned file range must stay
 * inside the data area (KVP_ERR_OUT_OF_RANGE) and a write must start on a
 * block (KVP_ERR_INVALID_ARG).
 *
 * Threads: the data server's connection threads, several at once. `bad_lock`
 * guards the list of extents whose reads failed.
 */
#include "client/ssd/ssd_server.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include "client/segment/data_backend.h"
#include "client/transport/wire.h"
#include "client/ssd/ssd_io.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/sock.h"

#define DEPTH KVP_SSD_IO_DEPTH
#define CHUNK ((uint64_t)KVP_SSD_IO_CHUNK)
#define BLOCK ((uint64_t)KVP_SSD_BLOCK)
/* FORGETs and unwritten objects remembered (file_backend_t) */
#define SSD_TOMBS 1024u

/* The backend: the segment's file. */
typedef struct file_backend {
    kvp_ssd_file_t *file;
    int file_fd;
    uint64_t base; /* file offset of segment byte 0 */
    uint64_t size;
    _Atomic uint64_t io_errors;
    pthread_mutex_t bad_lock;
    /* extents whose reads failed with an I/O error, for the owner to report (bad_lock) */
    uint64_t bad[KVP_SSD_SERVER_BAD_MAX];
    size_t n_bad;
    /* Once the owner saw a tenant's key, a read waits for its object's RECORD (where the
     * owner checks what a put straight to SSD wrote: ssd_owner.c); FORGETs and refused
     * RECORDs leave a tombstone, so a read of a removed object does not wait for
     * nothing and one of an object found unwritten is refused at once (rec_lock). */
    pthread_mutex_t rec_lock;
    pthread_cond_t rec_cond;
    bool tenants;
    struct {
        uint64_t offset, version;
        bool unwritten;
    } tomb[SSD_TOMBS];
    uint32_t tomb_next;
} file_backend_t;

/* The longest a read waits for its object's RECORD (a task the master sends at the put's
 * end, which the owner asks for in a long poll). */
#define WAIT_RECORD_MS 1000u

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
} conn_io_t;

static uint64_t round_down(uint64_t x)
{
    return x / BLOCK * BLOCK;
}

static uint64_t round_up(uint64_t x)
{
    return (x + BLOCK - 1) / BLOCK * BLOCK;
}

/* The file's limits on an extent inside the segment. */
static kvp_status_t file_check(void *backend, uint64_t off, uint64_t len, bool write)
{
    const file_backend_t *fb = backend;
    /* the aligned file range moved must stay inside the data area too */
    if (round_up(off + len) > fb->size)
        return KVP_ERR_OUT_OF_RANGE;
    if (write && off % BLOCK != 0)
        return KVP_ERR_INVALID_ARG;
    return KVP_OK;
}

/* The next read chunk of the cursor's extents: file range into op, send window into ch. */
static bool next_read_chunk(const file_backend_t *fb, cursor_t *cur, kvp_ssd_iov_t *op,
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
            op->file_off = fb->base + cur->at;
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
static void note_bad(file_backend_t *fb, const kvp_data_vec_t *v, size_t n, uint64_t at)
{
    for (size_t j = 0; j < n; j++) {
        if (at < v[j].offset || at >= v[j].offset + v[j].length)
            continue;
        pthread_mutex_lock(&fb->bad_lock);
        bool known = false;
        for (size_t b = 0; b < fb->n_bad; b++)
            known |= fb->bad[b] == v[j].offset;
        if (!known && fb->n_bad < KVP_SSD_SERVER_BAD_MAX)
            fb->bad[fb->n_bad++] = v[j].offset;
        pthread_mutex_unlock(&fb->bad_lock);
        return;
    }
}

/*
 * The backend's read (data_backend.h): send the response header, then the bytes of the
 * checked extents v[0..n) (total bytes in all), read ahead DEPTH chunks deep.
 */
static bool file_read(void *backend, void *conn, int fd, const kvp_data_vec_t *v, size_t n,
                      uint64_t total, kvp_status_t *reply_p)
{
    file_backend_t *fb = backend;
    conn_io_t *cio = conn;
    cursor_t cur = {.v = v, .n = n};
    size_t issued = 0, done = 0;
    bool hdr_sent = false, ok = true;
    kvp_status_t io_st = KVP_OK;
    while (issued - done < DEPTH) {
        size_t k = issued % DEPTH;
        if (!next_read_chunk(fb, &cur, &cio->ops[k], &cio->ch[k]))
            break;
        cio->ops[k].buf = cio->buf[k];
        if (kvp_ssd_io_start(cio->io, fb->file_fd, false, &cio->ops[k]) != KVP_OK) {
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
                note_bad(fb, v, n, cio->ops[k].file_off - fb->base);
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
        if (next_read_chunk(fb, &cur, &cio->ops[k], &cio->ch[k])) {
            cio->ops[k].buf = cio->buf[k];
            if (kvp_ssd_io_start(cio->io, fb->file_fd, false, &cio->ops[k]) != KVP_OK)
                io_st = KVP_ERR_SYSTEM;
            else
                issued++;
        }
    }
    if (io_st == KVP_OK && issued == 0 && total > 0)
        io_st = KVP_ERR_SYSTEM; /* nothing could be started */
    if (io_st != KVP_OK) {
        atomic_fetch_add(&fb->io_errors, 1);
        KVP_LOG_WARN_LIMITED("ssd server: reading %s failed (%s)%s", kvp_ssd_file_path(fb->file),
                             kvp_strerror(io_st),
                             hdr_sent ? "; closing the connection mid-reply" : "");
        *reply_p = KVP_ERR_IO; /* answered by the server while no byte went */
        return ok && !hdr_sent;
    }
    return ok;
}

/* The backend's write (data_backend.h): receive the payload of the checked (aligned)
 * extents v[0..n) and write it to the file. */
static bool file_write(void *backend, void *conn, int fd, const kvp_data_vec_t *v, size_t n,
                       kvp_status_t *reply_p)
{
    file_backend_t *fb = backend;
    conn_io_t *cio = conn;
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
                    .buf = cio->buf[k], .file_off = fb->base + v[i].offset + at, .len = padded};
                if (kvp_ssd_io_start(cio->io, fb->file_fd, true, &cio->ops[k]) != KVP_OK)
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
        atomic_fetch_add(&fb->io_errors, 1);
        KVP_LOG_WARN_LIMITED("ssd server: writing %s failed (%s)", kvp_ssd_file_path(fb->file),
                             kvp_strerror(io_st));
        *reply_p = io_st == KVP_ERR_NO_SPACE ? KVP_ERR_NO_SPACE : KVP_ERR_IO;
    }
    return true;
}

/* The backend's conn_close: the connection's ring and buffers. */
static void conn_close(void *backend, void *conn)
{
    (void)backend;
    conn_io_t *cio = conn;
    for (unsigned i = 0; i < DEPTH; i++)
        free(cio->buf[i]);
    kvp_ssd_io_destroy(cio->io);
    free(cio);
}

/* The backend's conn_open: a ring and DEPTH aligned buffers, made once per connection. */
static kvp_status_t conn_open(void *backend, void **conn_p)
{
    const file_backend_t *fb = backend;
    conn_io_t *cio = calloc(1, sizeof(*cio));
    if (cio == NULL)
        goto err_log;
    if (kvp_ssd_io_create(DEPTH, &cio->io) != KVP_OK)
        goto err_free_cio;
    kvp_ssd_io_set_stats(cio->io, kvp_ssd_file_io_stats(fb->file));
    for (unsigned i = 0; i < DEPTH; i++) {
        cio->buf[i] = kvp_ssd_buf_alloc(CHUNK);
        if (cio->buf[i] == NULL) {
            conn_close(backend, cio);
            goto err_log;
        }
    }
    *conn_p = cio;
    return KVP_OK;

err_free_cio:
    free(cio);
err_log:
    KVP_LOG_WARN_LIMITED("ssd server: no ring or buffers for a connection; closing it");
    return KVP_ERR_NOMEM;
}

static void file_versions_at(void *backend, const uint64_t *offsets, uint64_t *versions, size_t n)
{
    file_backend_t *fb = backend;
    kvp_ssd_file_versions_at(fb->file, offsets, versions, n);
}

/* 1: (offset, version) is recorded, or was and is gone; -1: it was found unwritten; 0:
 * neither yet (rec_lock held). */
static int recorded_locked(file_backend_t *fb, uint64_t offset, uint64_t version)
{
    uint64_t v = 0;
    kvp_ssd_file_versions_at(fb->file, &offset, &v, 1);
    if (v >= version)
        return 1;
    for (uint32_t i = 0; i < SSD_TOMBS; i++)
        if (fb->tomb[i].offset == offset && fb->tomb[i].version >= version)
            return fb->tomb[i].unwritten && fb->tomb[i].version == version ? -1 : 1;
    return 0;
}

static bool file_wait_recorded(void *backend, const uint64_t *offsets, const uint64_t *versions,
                               size_t n)
{
    file_backend_t *fb = backend;
    struct timespec until = kvp_deadline_ms(WAIT_RECORD_MS);
    pthread_mutex_lock(&fb->rec_lock);
    bool all = true;
    for (size_t i = 0; i < n && fb->tenants && all; i++) {
        int r;
        while ((r = recorded_locked(fb, offsets[i], versions[i])) == 0)
            if (pthread_cond_timedwait(&fb->rec_cond, &fb->rec_lock, &until) == ETIMEDOUT) {
                r = recorded_locked(fb, offsets[i], versions[i]);
                break;
            }
        all = r > 0;
    }
    pthread_mutex_unlock(&fb->rec_lock);
    return all;
}

static void file_destroy(void *backend)
{
    file_backend_t *fb = backend;
    pthread_cond_destroy(&fb->rec_cond);
    pthread_mutex_destroy(&fb->rec_lock);
    pthread_mutex_destroy(&fb->bad_lock);
    free(fb);
}

static const kvp_data_backend_ops_t file_ops = {
    .name = "ssd server",
    .conn_open = conn_open,
    .conn_close = conn_close,
    .check = file_check,
    .read = file_read,
    .write = file_write,
    .destroy = file_destroy,
};

kvp_status_t kvp_ssd_server_create(kvp_ssd_file_t *f, const char *host, uint16_t port,
                                   bool protected_mode, kvp_data_server_t **srv_p,
                                   uint16_t *bound_port_p)
{
    file_backend_t *fb = calloc(1, sizeof(*fb));
    if (fb == NULL)
        return KVP_ERR_NOMEM;
    fb->file = f;
    fb->file_fd = kvp_ssd_file_fd(f);
    fb->base = kvp_ssd_file_data_base(f);
    fb->size = kvp_ssd_file_size(f);
    atomic_store(&fb->io_errors, 0);
    pthread_mutex_init(&fb->bad_lock, NULL);
    pthread_mutex_init(&fb->rec_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&fb->rec_cond, &ca);
    pthread_condattr_destroy(&ca);
    kvp_data_server_params_t p = {.ops = &file_ops,
                                  .backend = fb,
                                  .size = fb->size,
                                  .segment_id = 0,
                                  .versions_at = file_versions_at,
                                  .wait_recorded = file_wait_recorded,
                                  .versions_arg = fb,
                                  .host = host,
                                  .port = port,
                                  .protected_mode = protected_mode};
    kvp_status_t status = kvp_data_server_create(&p, srv_p, bound_port_p);
    if (status != KVP_OK)
        file_destroy(fb);
    return status;
}

size_t kvp_ssd_server_take_bad(kvp_data_server_t *srv, uint64_t *offsets, size_t max)
{
    file_backend_t *fb = kvp_data_server_backend(srv);
    pthread_mutex_lock(&fb->bad_lock);
    size_t n = fb->n_bad < max ? fb->n_bad : max;
    memcpy(offsets, fb->bad, n * sizeof(*offsets));
    memmove(fb->bad, fb->bad + n, (fb->n_bad - n) * sizeof(*offsets));
    fb->n_bad -= n;
    pthread_mutex_unlock(&fb->bad_lock);
    return n;
}

uint64_t kvp_ssd_server_io_errors(const kvp_data_server_t *srv)
{
    const file_backend_t *fb = kvp_data_server_backend(srv);
    return atomic_load(&fb->io_errors);
}

void kvp_ssd_server_recorded(kvp_data_server_t *srv, uint64_t offset, uint64_t version)
{
    kvp_data_pending_forget(kvp_data_server_pending(srv), offset, version);
    file_backend_t *fb = kvp_data_server_backend(srv);
    pthread_mutex_lock(&fb->rec_lock);
    pthread_cond_broadcast(&fb->rec_cond);
    pthread_mutex_unlock(&fb->rec_lock);
}

/* A tombstone for (offset, version), and the waiting reads woken. */
static void tomb_add(kvp_data_server_t *srv, uint64_t offset, uint64_t version, bool unwritten)
{
    file_backend_t *fb = kvp_data_server_backend(srv);
    pthread_mutex_lock(&fb->rec_lock);
    fb->tomb[fb->tomb_next].offset = offset;
    fb->tomb[fb->tomb_next].version = version;
    fb->tomb[fb->tomb_next].unwritten = unwritten;
    fb->tomb_next = (fb->tomb_next + 1) % SSD_TOMBS;
    pthread_cond_broadcast(&fb->rec_cond);
    pthread_mutex_unlock(&fb->rec_lock);
}

void kvp_ssd_server_forgot(kvp_data_server_t *srv, uint64_t offset, uint64_t version)
{
    tomb_add(srv, offset, version, false);
}

void kvp_ssd_server_unwritten(kvp_data_server_t *srv, uint64_t offset, uint64_t version)
{
    tomb_add(srv, offset, version, true);
    file_backend_t *fb = kvp_data_server_backend(srv);
    pthread_mutex_lock(&fb->bad_lock); /* the master drops the copy (SsdTasks.bad_offsets) */
    if (fb->n_bad < KVP_SSD_SERVER_BAD_MAX)
        fb->bad[fb->n_bad++] = offset;
    pthread_mutex_unlock(&fb->bad_lock);
}

void kvp_ssd_server_saw_tenants(kvp_data_server_t *srv)
{
    file_backend_t *fb = kvp_data_server_backend(srv);
    pthread_mutex_lock(&fb->rec_lock);
    fb->tenants = true;
    pthread_mutex_unlock(&fb->rec_lock);
}
