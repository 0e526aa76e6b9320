/*
 * data_backend.h - where a data server's bytes live: the one interface the
 * data server (data_server.c) moves them through, implemented by a DRAM
 * segment's memory (segment_server.c), an SSD or DFS segment's file
 * (ssd/ssd_server.c) and a transfer engine's registered memory (client/te/te.c,
 * kvp_te_*, whose own frames the server hands it whole: op_frame).
 *
 * The server never looks behind it: it reads each request (its header, its
 * vector entries and grants), checks the grants and that every extent lies
 * inside the segment, counts what it serves and refuses, and answers every
 * error. A backend adds its own limits on an extent (check) and moves the
 * bytes of checked extents between the connection's socket and where they
 * live (read, write), without allocating or copying per request beyond what
 * its medium needs: memory is sent and received in place; a file goes
 * through buffers made once per connection (conn_open), at its first read or
 * write (not as it connects: a connection that never gets that far holds none).
 *
 * Thread: every op runs on a connection's thread, several connections at
 * once (they must be reentrant); conn_open and conn_close on the thread of
 * the connection they serve, at its first read or write and at its end;
 * destroy once, after every connection ended.
 */
#ifndef KVP_CLIENT_SEGMENT_DATA_BACKEND_H
#define KVP_CLIENT_SEGMENT_DATA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/transport/wire.h"
#include "common/status.h"

struct kvp_conn; /* conn_server.h */

/* Frames of the store's segments beside READ(V)/WRITE(V) and HELLO that a backend's bytes
 * allow (wire.h); the server's others are bad requests on its server. */
#define KVP_DATA_FRAME_MAP 0x1u     /* MAP: the bytes are memory the owner shares (a memfd) */
#define KVP_DATA_FRAME_WINDOWS 0x2u /* BIND_READ, BIND_WRITE, UNBIND: rdma memory windows */

/* What op_frame did with a request. */
typedef enum {
    KVP_DATA_OP_CLOSE = 0,   /* served or refused; the connection must close */
    KVP_DATA_OP_GO_ON = 1,   /* served or refused; the connection goes on */
    KVP_DATA_OP_UNKNOWN = 2, /* not an op of the backend's: a bad request (the server closes) */
} kvp_data_op_t;

typedef struct kvp_data_backend_ops {
    const char *name; /* in the server's logs: "segment server", "ssd server", ... */
    unsigned frames;  /* KVP_DATA_FRAME_* */
    /* Optional: the connection's own state (*conn_p, handed to read and write), made at
     * its first read or write, once checked. An error closes it without serving that
     * request (the backend says why). */
    kvp_status_t (*conn_open)(void *backend, void **conn_p);
    void (*conn_close)(void *backend, void *conn);
    /* Optional: has the connection (its state from conn_open) proved what the backend asks
     * of a peer? Until it has, it stays unauthenticated for the server's limits
     * (conn_server.h: the handshake's deadline, the first closed when slots run out). NULL:
     * with nothing to prove, a request's header in whole admits it. */
    bool (*proved)(void *backend, void *conn);
    /* Optional: the backend's own limits on an extent [off, off + len) that lies inside
     * the segment (len > 0), for a write or a read: KVP_OK, or the error to answer. */
    kvp_status_t (*check)(void *backend, uint64_t off, uint64_t len, bool write);
    /*
     * A read of the checked extents v[0..n) (total bytes in all): send the response header
     * (kvp_data_resp_t, status 0, length total) and then their bytes in order on fd.
     * Returns false when the connection must close (the socket broke, or the reply was cut
     * short); true with *reply_p KVP_OK when every byte went, or with KVP_ERR_IO when the
     * storage failed before any byte of the reply was sent (the server answers it and the
     * connection goes on). The server counted the read before the call and takes it back
     * unless every byte went.
     */
    bool (*read)(void *backend, void *conn, int fd, const kvp_data_vec_t *v, size_t n,
                 uint64_t total, kvp_status_t *reply_p);
    /*
     * A write of the checked extents v[0..n): receive their payload from fd, in order, and
     * store it. Returns false when the connection must close (the socket broke); true with
     * *reply_p KVP_OK when every byte is stored (the server counts it and answers), or with
     * the storage's error (KVP_ERR_IO, KVP_ERR_NO_SPACE) once the rest of the payload was
     * drained (the server answers it and the connection goes on).
     */
    bool (*write)(void *backend, void *conn, int fd, const kvp_data_vec_t *v, size_t n,
                  kvp_status_t *reply_p);
    /* Optional: a request of an op the server does not serve itself (the backend's own
     * frames: a transfer engine's, wire.h), header req (its magic checked, nothing else):
     * read what follows it and answer on fd, replies included. frame: the connection as its
     * server holds it (kvp_conn_frame_extend, for a request that moves bytes meanwhile).
     * NULL: every such op is a bad request. */
    kvp_data_op_t (*op_frame)(void *backend, void *conn, struct kvp_conn *frame, int fd,
                              const kvp_data_req_t *req);
    /* Optional: the server is gone; free the backend. */
    void (*destroy)(void *backend);
} kvp_data_backend_ops_t;

#endif
