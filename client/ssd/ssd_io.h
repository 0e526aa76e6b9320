/*
 * ssd_io.h - io_uring I/O on an SSD segment's file (liburing).
 *
 * One kvp_ssd_io_t per thread: a ring of KVP_SSD_IO_DEPTH entries. A call
 * submits a batch of reads or writes, keeps up to the ring's depth in
 * flight, and returns when all are done. With O_DIRECT every buffer,
 * file offset and length must be a multiple of KVP_SSD_BLOCK (buffers from
 * kvp_ssd_buf_alloc are).
 */
#ifndef KVP_CLIENT_SSD_SSD_IO_H
#define KVP_CLIENT_SSD_SSD_IO_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Extent alignment and I/O granularity of SSD segments (O_DIRECT). */
#define KVP_SSD_BLOCK 4096u
/* Queue depth of the SSD path (server connections, offload worker, kvpool-bench limits)
 * and the largest single I/O it issues. */
#define KVP_SSD_IO_DEPTH 8u
#define KVP_SSD_IO_CHUNK (1u << 20)

typedef struct kvp_ssd_io kvp_ssd_io_t;

typedef struct kvp_ssd_iov {
    void *buf;
    uint64_t file_off;   /* byte offset in the file */
    uint64_t len;        /* <= KVP_SSD_IO_CHUNK is not required: longer ones are split */
    kvp_status_t status; /* out: KVP_OK, KVP_ERR_IO (EIO, short transfer), KVP_ERR_NO_SPACE */
} kvp_ssd_iov_t;

kvp_status_t kvp_ssd_io_create(unsigned depth, kvp_ssd_io_t **io_p);
void kvp_ssd_io_destroy(kvp_ssd_io_t *io);

/* Counters of one SSD segment's I/O, shared by every ring on its file (relaxed atomics):
 * ops completed, their bytes, ops that failed. One add per op, after it completed. */
typedef struct kvp_ssd_io_stats {
    _Atomic uint64_t reads, read_bytes, writes, write_bytes, errors;
} kvp_ssd_io_stats_t;

/* Count this ring's reads and writes (not datasync) into stats from now on (borrowed: it
 * must outlive the ring); NULL: count nothing (the default). */
void kvp_ssd_io_set_stats(kvp_ssd_io_t *io, kvp_ssd_io_stats_t *stats);

/* Read (write=false) or write n ranges of fd; returns KVP_OK or the first op's failure. */
kvp_status_t kvp_ssd_io_rw(kvp_ssd_io_t *io, int fd, bool write, kvp_ssd_iov_t *ops, size_t n);
/*
 * Asynchronous form, for pipelines (the SSD server reads the next chunks while it sends
 * the previous): start one op (len <= KVP_SSD_IO_CHUNK) and wait for it later. At most
 * the ring's depth may be started and not yet waited for, and kvp_ssd_io_rw must not be
 * called while any is. Short transfers and EAGAIN/EINTR are retried as in rw. The op,
 * its buffer and fd are borrowed until kvp_ssd_io_wait(op) returns.
 * start: KVP_OK, or KVP_ERR_INVALID_ARG (no room: depth ops already started, or len too
 * long); wait: the op's status.
 */
kvp_status_t kvp_ssd_io_start(kvp_ssd_io_t *io, int fd, bool write, kvp_ssd_iov_t *op);
kvp_status_t kvp_ssd_io_wait(kvp_ssd_io_t *io, kvp_ssd_iov_t *op);

/* fdatasync(fd) through the ring. */
kvp_status_t kvp_ssd_io_datasync(kvp_ssd_io_t *io, int fd);

/* Buffers for O_DIRECT: KVP_SSD_BLOCK-aligned, len rounded up to it; free with free(). */
void *kvp_ssd_buf_alloc(size_t len);

#endif
