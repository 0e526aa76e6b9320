/*
 * ssd_io.c - io_uring I/O on an SSD segment's file (liburing).
 *
 * Design: one ring per thread (the caller keeps one kvp_ssd_io_t per thread;
 * nothing here is shared). Two forms: kvp_ssd_io_rw, a batch that returns
 * when all is done, and kvp_ssd_io_start / kvp_ssd_io_wait, one op at a
 * time for pipelines (an op of at most one chunk; waited in any order). kvp_ssd_io_rw walks the
 * caller's ops in order and cuts each into pieces of at most KVP_SSD_IO_CHUNK; up to the ring's
 * depth pieces are in flight. Each in-flight piece is described by one of the ring's `depth` piece
 * records, allocated once at create: the SQE's user_data points to it and it points to the caller's
 * op, so a call allocates nothing. A completion that moved fewer bytes than asked is resubmitted
 * for the rest; -EAGAIN and -EINTR are resubmitted as they were; any other error sets the op's
 * status and the op's remaining pieces are not issued (those in flight are still reaped: the call
 * returns only when the kernel is done with every buffer).
 *
 * Thread: the thread that owns the kvp_ssd_io_t.
 */
#include "client/ssd/ssd_io.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/macros.h"

typedef struct ssd_piece {
    kvp_ssd_iov_t *op;
    uint64_t off;  /* next byte of the op to move (relative to the op) */
    uint64_t left; /* bytes of this piece still to move */
    int fd;
    bool write;
    bool async; /* from kvp_ssd_io_start: kept until kvp_ssd_io_wait */
    bool done;  /* async: completed, not yet waited for */
    bool busy;  /* handed to the kernel, not over */
    struct ssd_piece *next_free;
} ssd_piece_t;

struct kvp_ssd_io {
    struct io_uring ring;
    unsigned depth;
    unsigned in_flight;  /* pieces the kernel has or will have */
    ssd_piece_t *pieces; /* [depth] */
    ssd_piece_t *free_pieces;
    kvp_status_t first;        /* rw: the first op failure of the call */
    bool broken;               /* the ring failed and could not be made again */
    kvp_ssd_io_stats_t *stats; /* NULL: not counted */
};

void kvp_ssd_io_set_stats(kvp_ssd_io_t *io, kvp_ssd_io_stats_t *stats)
{
    io->stats = stats;
}

/* Count ops[0..n) of one direction once they are over. */
static void count_ops(kvp_ssd_io_t *io, bool write, const kvp_ssd_iov_t *ops, size_t n)
{
    kvp_ssd_io_stats_t *s = io->stats;
    if (s == NULL)
        return;
    uint64_t done = 0, bytes = 0, failed = 0;
    for (size_t i = 0; i < n; i++) {
        if (ops[i].status != KVP_OK) {
            failed++;
        } else if (ops[i].len > 0) {
            done++;
            bytes += ops[i].len;
        }
    }
    atomic_fetch_add_explicit(write ? &s->writes : &s->reads, done, memory_order_relaxed);
    atomic_fetch_add_explicit(write ? &s->write_bytes : &s->read_bytes, bytes,
                              memory_order_relaxed);
    if (failed > 0)
        atomic_fetch_add_explicit(&s->errors, failed, memory_order_relaxed);
}

static void reset_pieces(kvp_ssd_io_t *io)
{
    io->free_pieces = NULL;
    for (unsigned i = io->depth; i-- > 0;) {
        io->pieces[i] = (ssd_piece_t){.next_free = io->free_pieces};
        io->free_pieces = &io->pieces[i];
    }
    io->in_flight = 0;
}

kvp_status_t kvp_ssd_io_create(unsigned depth, kvp_ssd_io_t **io_p)
{
    if (depth == 0 || depth > 4096)
        return KVP_ERR_INVALID_ARG;
    kvp_ssd_io_t *io = calloc(1, sizeof(*io));
    if (io == NULL)
        return KVP_ERR_NOMEM;
    kvp_status_t status = KVP_ERR_NOMEM;
    io->pieces = calloc(depth, sizeof(io->pieces[0]));
    if (io->pieces == NULL)
        goto err_free_io;
    int ret = io_uring_queue_init(depth, &io->ring, 0);
    if (ret < 0) {
        errno = -ret;
        KVP_LOG_WARN("ssd io: io_uring_queue_init(%u) failed: %m", depth);
        status = ret == -ENOMEM ? KVP_ERR_NOMEM : KVP_ERR_SYSTEM;
        goto err_free_pieces;
    }
    io->depth = depth;
    reset_pieces(io);
    *io_p = io;
    return KVP_OK;

err_free_pieces:
    free(io->pieces);
err_free_io:
    free(io);
    return status;
}

void kvp_ssd_io_destroy(kvp_ssd_io_t *io)
{
    if (io == NULL)
        return;
    io_uring_queue_exit(&io->ring);
    free(io->pieces);
    free(io);
}

static kvp_status_t status_of(int err)
{
    switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return KVP_ERR_NO_SPACE;
    case EIO:
    case ENXIO:
    case ENODEV:
    case EBADMSG:
    case EREMOTEIO:
        return KVP_ERR_IO;
    case ENOMEM:
        return KVP_ERR_NOMEM;
    default:
        return KVP_ERR_SYSTEM;
    }
}

/* Put the piece's next transfer in an SQE. The SQ has room: at most `depth` pieces
 * exist and the SQ holds `depth` entries. */
static void queue_piece(kvp_ssd_io_t *io, ssd_piece_t *p)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    char *buf = (char *)p->op->buf + p->off;
    uint64_t file_off = p->op->file_off + p->off;
    if (p->write)
        io_uring_prep_write(sqe, p->fd, buf, (unsigned)p->left, file_off);
    else
        io_uring_prep_read(sqe, p->fd, buf, (unsigned)p->left, file_off);
    io_uring_sqe_set_data(sqe, p);
    p->busy = true;
}

/* A piece is over (moved all its bytes, or failed): the op learns it; an async piece
 * waits for kvp_ssd_io_wait, a rw piece goes back to the free list. */
static void piece_over(kvp_ssd_io_t *io, ssd_piece_t *p)
{
    p->busy = false;
    io->in_flight--;
    if (p->async) {
        p->done = true;
        return;
    }
    p->next_free = io->free_pieces;
    io->free_pieces = p;
}

/* Failure of the ring itself (not of an I/O): every piece in flight fails and the ring
 * is made again (closing it makes the kernel cancel and finish what it had). */
static void ring_failed(kvp_ssd_io_t *io, int ret)
{
    errno = -ret;
    KVP_LOG_ERROR("ssd io: io_uring_submit failed: %m");
    io_uring_queue_exit(&io->ring);
    ret = io_uring_queue_init(io->depth, &io->ring, 0);
    if (ret < 0) {
        errno = -ret;
        KVP_LOG_ERROR("ssd io: cannot make the ring again: %m");
        io->broken = true;
    }
    for (unsigned i = 0; i < io->depth; i++) {
        ssd_piece_t *p = &io->pieces[i];
        if (!p->busy)
            continue;
        if (p->op->status == KVP_OK)
            p->op->status = KVP_ERR_SYSTEM;
        piece_over(io, p);
    }
    if (io->first == KVP_OK)
        io->first = KVP_ERR_SYSTEM;
}

/* Submit what is queued, wait for one completion at least and handle every completion
 * there is. */
static void progress(kvp_ssd_io_t *io)
{
    for (;;) {
        int ret = io_uring_submit_and_wait(&io->ring, 1);
        if (ret >= 0)
            break;
        if (ret == -EINTR || ret == -EAGAIN || ret == -EBUSY)
            continue;
        ring_failed(io, ret);
        return;
    }
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&io->ring, head, cqe)
    {
        seen++;
        ssd_piece_t *p = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        if (res == -EAGAIN || res == -EINTR) {
            queue_piece(io, p);
            continue;
        }
        if (res > 0 && (uint64_t)res < p->left) {
            p->off += (uint64_t)res; /* short transfer: the rest again */
            p->left -= (uint64_t)res;
            queue_piece(io, p);
            continue;
        }
        if (res <= 0 && p->op->status == KVP_OK) {
            /* 0: end of file on a read (or a write that moved nothing) */
            int err = res == 0 ? EIO : -res;
            p->op->status = res == 0 ? KVP_ERR_IO : status_of(err);
            if (io->first == KVP_OK || p->async)
                KVP_LOG_WARN("ssd io: %s of %llu bytes at file offset %llu failed: %s",
                             p->write ? "write" : "read", (unsigned long long)p->left,
                             (unsigned long long)(p->op->file_off + p->off),
                             res == 0 ? "short transfer" : strerror(err));
            if (io->first == KVP_OK)
                io->first = p->op->status;
        }
        p->left = 0;
        piece_over(io, p);
    }
    io_uring_cq_advance(&io->ring, seen);
}

kvp_status_t kvp_ssd_io_rw(kvp_ssd_io_t *io, int fd, bool write, kvp_ssd_iov_t *ops, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ops[i].status = KVP_OK;
    io->first = KVP_OK;
    if (io->broken) {
        for (size_t i = 0; i < n; i++)
            ops[i].status = KVP_ERR_SYSTEM;
        count_ops(io, write, ops, n);
        return KVP_ERR_SYSTEM;
    }
    size_t next_op = 0;   /* the op whose next piece is issued next */
    uint64_t next_at = 0; /* its next byte */
    for (;;) {
        /* Issue pieces while there are pieces to issue and records to describe them. */
        while (io->free_pieces != NULL && next_op < n && !io->broken) {
            kvp_ssd_iov_t *op = &ops[next_op];
            if (next_at >= op->len || op->status != KVP_OK) {
                next_op++;
                next_at = 0;
                continue;
            }
            ssd_piece_t *p = io->free_pieces;
            io->free_pieces = p->next_free;
            *p = (ssd_piece_t){.op = op,
                               .off = next_at,
                               .left = KVP_MIN(op->len - next_at, (uint64_t)KVP_SSD_IO_CHUNK),
                               .fd = fd,
                               .write = write};
            next_at += p->left;
            queue_piece(io, p);
            io->in_flight++;
        }
        if (io->in_flight == 0)
            break;
        progress(io);
    }
    count_ops(io, write, ops, n);
    return io->first;
}

kvp_status_t kvp_ssd_io_start(kvp_ssd_io_t *io, int fd, bool write, kvp_ssd_iov_t *op)
{
    if (io->free_pieces == NULL || op->len > KVP_SSD_IO_CHUNK)
        return KVP_ERR_INVALID_ARG;
    if (io->broken)
        return KVP_ERR_SYSTEM;
    op->status = KVP_OK;
    ssd_piece_t *p = io->free_pieces;
    io->free_pieces = p->next_free;
    *p = (ssd_piece_t){.op = op, .left = op->len, .fd = fd, .write = write, .async = true};
    if (op->len == 0) {
        p->done = true;
        return KVP_OK;
    }
    queue_piece(io, p);
    io->in_flight++;
    /* submit now so the kernel works while the caller does; errors surface in wait */
    io_uring_submit(&io->ring);
    return KVP_OK;
}

kvp_status_t kvp_ssd_io_wait(kvp_ssd_io_t *io, kvp_ssd_iov_t *op)
{
    ssd_piece_t *p = NULL;
    for (unsigned i = 0; i < io->depth && p == NULL; i++)
        if (io->pieces[i].async && io->pieces[i].op == op)
            p = &io->pieces[i];
    if (p == NULL)
        return KVP_ERR_INVALID_ARG; /* not started */
    while (!p->done)
        progress(io);
    count_ops(io, p->write, op, 1);
    kvp_status_t st = op->status;
    *p = (ssd_piece_t){.next_free = io->free_pieces};
    io->free_pieces = p;
    return st;
}

kvp_status_t kvp_ssd_io_datasync(kvp_ssd_io_t *io, int fd)
{
    if (io->broken)
        return KVP_ERR_SYSTEM;
    for (;;) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
        io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
        io_uring_sqe_set_data(sqe, NULL);
        int ret;
        do
            ret = io_uring_submit(&io->ring);
        while (ret == -EINTR || ret == -EAGAIN || ret == -EBUSY);
        if (ret < 0) {
            errno = -ret;
            KVP_LOG_ERROR("ssd io: io_uring_submit (fsync) failed: %m");
            return KVP_ERR_SYSTEM;
        }
        struct io_uring_cqe *cqe;
        ret = io_uring_wait_cqe(&io->ring, &cqe);
        if (ret < 0) {
            errno = -ret;
            KVP_LOG_ERROR("ssd io: io_uring_wait_cqe (fsync) failed: %m");
            return KVP_ERR_SYSTEM;
        }
        int res = cqe->res;
        io_uring_cqe_seen(&io->ring, cqe);
        if (res == -EINTR || res == -EAGAIN)
            continue;
        if (res < 0) {
            errno = -res;
            KVP_LOG_WARN("ssd io: fdatasync failed: %m");
            return status_of(-res);
        }
        return KVP_OK;
    }
}

void *kvp_ssd_buf_alloc(size_t len)
{
    size_t rounded = (len + KVP_SSD_BLOCK - 1) / KVP_SSD_BLOCK * KVP_SSD_BLOCK;
    if (rounded < len)
        return NULL;
    if (rounded == 0)
        rounded = KVP_SSD_BLOCK;
    void *p = NULL;
    if (posix_memalign(&p, KVP_SSD_BLOCK, rounded) != 0)
        return NULL;
    return p;
}
