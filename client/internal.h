/*
 * internal.h - libkvpool internals shared by the client's files, the transfer
 * engine, the transports and the segment server.
 *
 * Layering: client.c / object.c (API) -> control/master_conn.c (control RPC)
 * and transfer/engine.c (data engine) -> transport/{shm,tcp,rdma}.c through
 * kvp_transport_ops_t. segment/segment_server.c serves this client's own
 * segment to remote peers.
 */
#ifndef KVP_CLIENT_INTERNAL_H
#define KVP_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/include/kvpool.h"
#include "common/crc32c.h"
#include "common/status.h"

/* ---- data-plane wire format (tcp transport, docs/protocol.md) ---- */
#define KVP_DATA_MAGIC 0x4450564Bu /* "KVPD" little-endian */
#define KVP_DATA_READ 1
#define KVP_DATA_WRITE 2
/* Vectored: `offset` carries the entry count n (1..KVP_DATA_VEC_MAX), `length` the sum of the
 * entries' lengths, segment_id is 0; n kvp_data_vec_t follow the header (then, for WRITEV,
 * the entries' payloads back to back). One response for the whole chain. */
#define KVP_DATA_READV 3
#define KVP_DATA_WRITEV 4
#define KVP_DATA_VEC_MAX 256

typedef struct kvp_data_req {
    uint32_t magic;
    uint16_t op;
    uint16_t flags;
    uint64_t segment_id;
    uint64_t offset;
    uint64_t length;
} kvp_data_req_t; /* 32 bytes, little-endian host order (x86-64, aarch64) */

typedef struct kvp_data_resp {
    uint32_t magic;
    int32_t status;
    uint64_t length; /* READ(V): payload bytes that follow when status == 0 */
} kvp_data_resp_t;   /* 16 bytes */

typedef struct kvp_data_vec {
    uint64_t segment_id;
    uint64_t offset;
    uint64_t length;
} kvp_data_vec_t; /* 24 bytes: one extent of a READV/WRITEV */

_Static_assert(sizeof(kvp_data_vec_t) == 24, "data vector entry is 24 bytes");
_Static_assert(sizeof(kvp_data_req_t) == 32, "data request header is 32 bytes");
_Static_assert(sizeof(kvp_data_resp_t) == 16, "data response header is 16 bytes");

/* ---- peers: what we know of a remote (or our own) segment ---- */
typedef struct kvp_peer {
    atomic_int refs;
    uint64_t segment_id;
    uint64_t size;
    uint64_t owner_client_id;
    char name[256];
    char endpoint[256]; /* tcp host:port */
    char host_id[128];
    char shm_path[128];
    char rdma_endpoint[64]; /* rdma_cm ipv4:port, "" when the owner serves no rdma */
    uint64_t rdma_addr;     /* the segment's byte 0 in the owner */
    uint32_t rdma_rkey;
    /* shm mapping, set up once under the peer table lock */
    void *shm_base;
    bool shm_tried;
    bool shm_own; /* our own segment: memory not unmapped here */
    bool gone;
    _Atomic uint64_t failed_ms; /* last transfer failure (kvp_now_ms), 0: none */
} kvp_peer_t;

void kvp_peer_unref(kvp_peer_t *peer);

/* ---- transfer engine ---- */
typedef enum kvp_xfer_kind {
    KVP_XFER_READ = KVP_DATA_READ,   /* segment -> local */
    KVP_XFER_WRITE = KVP_DATA_WRITE, /* local -> segment */
} kvp_xfer_kind_t;

typedef struct kvp_xfer_op {
    kvp_xfer_kind_t kind;
    void *local;
    uint64_t offset;
    uint64_t length;
    kvp_peer_t *peer;    /* borrowed for the call */
    bool want_crc;       /* compute crc of the bytes moved into `crc` */
    uint32_t crc;        /* out */
    kvp_status_t status; /* out */
} kvp_xfer_op_t;

typedef enum kvp_transport_id {
    KVP_TRANSPORT_AUTO = 0,
    KVP_TRANSPORT_TCP = 1,
    KVP_TRANSPORT_SHM = 2,
    KVP_TRANSPORT_RDMA = 3,
} kvp_transport_id_t;

struct kvp_transfer;

/* A transport that moves bytes in slices, in any order, checksums whole ops: the source of
 * each WRITE that wants one before it starts, each READ that landed after it ends. */
static inline void kvp_xfer_crc_writes(kvp_xfer_op_t **ops, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ops[i]->want_crc && ops[i]->kind == KVP_XFER_WRITE)
            ops[i]->crc = kvp_crc32c(0, ops[i]->local, ops[i]->length);
}
static inline void kvp_xfer_crc_reads(kvp_xfer_op_t **ops, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ops[i]->want_crc && ops[i]->kind == KVP_XFER_READ && ops[i]->status == KVP_OK)
            ops[i]->crc = kvp_crc32c(0, ops[i]->local, ops[i]->length);
}

/* One data transport. transfer() moves every op (all of them use this transport) and,
 * for each op with want_crc, leaves the CRC32C of the bytes moved in op->crc. */
typedef struct kvp_transport_ops {
    const char *name;
    kvp_status_t (*init)(struct kvp_transfer *xfer, void **ctx_p);
    void (*cleanup)(void *ctx);
    /* Blocking: returns when each op has its status. Thread-safe. */
    void (*transfer)(void *ctx, kvp_xfer_op_t **ops, size_t n);
} kvp_transport_ops_t;

extern const kvp_transport_ops_t kvp_transport_tcp_ops;
extern const kvp_transport_ops_t kvp_transport_shm_ops;
extern const kvp_transport_ops_t kvp_transport_rdma_ops;

/* ---- rdma transport extras (transport/rdma.c), on its ctx ---- */
typedef struct kvp_dmabuf {
    int fd;
    uint64_t offset; /* of the registered address within the dma-buf */
} kvp_dmabuf_t;
/* Register [addr, addr+len) for local access (dmabuf: device memory exported
 * as a dma-buf, else NULL). KVP_ERR_EXISTS if it overlaps a registration. */
kvp_status_t kvp_rdma_transport_reg(void *ctx, void *addr, size_t len, const void *dmabuf);
kvp_status_t kvp_rdma_transport_dereg(void *ctx, void *addr);
/* Is [addr, addr+len) inside one registered region (zero-copy possible)? */
bool kvp_rdma_transport_covers(void *ctx, const void *addr, size_t len);
/* Register the segment for remote READ+WRITE, listen for peers; out: the
 * descriptor's rdma endpoint, address and rkey. */
kvp_status_t kvp_rdma_transport_serve(void *ctx, void *base, uint64_t size, char *endpoint,
                                      size_t endpoint_len, uint64_t *addr_p, uint32_t *rkey_p);

typedef struct kvp_transfer {
    kvp_transport_id_t forced;
    char host_id[128];
    uint64_t client_id;
    uint32_t timeout_ms;
    uint32_t tcp_streams;
    uint64_t tcp_slice;
    char rdma_devices[256]; /* device list, "" = auto */
    char rdma_host[64];     /* IPv4 to serve the segment on; "" = the device's */
    uint32_t rdma_qps;      /* QPs per peer */
    uint64_t rdma_slice;    /* stripe size */
    char rdma_error[512];   /* why rdma is not available */
    bool gpu;               /* the CUDA driver is loaded: check for device pointers */
    void *tcp_ctx;
    void *shm_ctx;
    void *rdma_ctx; /* NULL: no rdma */
    pthread_mutex_t stage_lock;
    struct kvp_stager *stager_host; /* unregistered host memory on rdma */
    struct kvp_stager *stager_gpu;  /* device memory the transport cannot reach */
} kvp_transfer_t;

kvp_status_t kvp_transfer_init(kvp_transfer_t *xfer);
void kvp_transfer_cleanup(kvp_transfer_t *xfer);
/* Which transport an op to this peer uses (shm needs the same host and a mapping). */
kvp_transport_id_t kvp_transfer_route(kvp_transfer_t *xfer, kvp_peer_t *peer);
/* Run a batch of ops, each routed by kvp_transfer_route. Sets each op's status. */
void kvp_transfer_run(kvp_transfer_t *xfer, kvp_xfer_op_t *ops, size_t n);
/* kvp_register_buffer's transport side: rdma registration (GPU memory: by
 * dma-buf, else directly, else it will be staged). */
kvp_status_t kvp_transfer_register(kvp_transfer_t *xfer, void *addr, size_t len);
void kvp_transfer_unregister(kvp_transfer_t *xfer, void *addr);
/* Serve our segment over rdma too (when the rdma transport is up). */
kvp_status_t kvp_transfer_serve_segment(kvp_transfer_t *xfer, void *base, uint64_t size,
                                        char *endpoint, size_t endpoint_len, uint64_t *addr_p,
                                        uint32_t *rkey_p);

/* shm helpers used by the route decision */
bool kvp_shm_map_peer(kvp_peer_t *peer);

/* ---- segment server (this client's own segment) ---- */
typedef struct kvp_segment_server kvp_segment_server_t;

/*
 * Start serving [base, base+size) as segment `segment_id` (set later with
 * kvp_segment_server_set_id once the master assigned it) on host:port.
 */
kvp_status_t kvp_segment_server_create(void *base, uint64_t size, const char *host, uint16_t port,
                                       kvp_segment_server_t **srv_p, uint16_t *bound_port_p);
void kvp_segment_server_set_id(kvp_segment_server_t *srv, uint64_t segment_id);
void kvp_segment_server_destroy(kvp_segment_server_t *srv);

/* ---- kvp_client_last_error (last_error.c) ---- */
/* Bracket a public call: kvp_api_leave returns rc, and when the outermost call fails with
 * nothing recorded, records "<op>: <status text>". */
void kvp_api_enter(void);
int64_t kvp_api_leave(int64_t rc, const char *op);
/* Note what went wrong, in words, for the calling thread (the first note of a call wins;
 * it becomes kvp_client_last_error() only if the call fails). _key: about that key only. */
void kvp_api_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kvp_api_fail_key(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A batch's first key that finally failed: its note, or "<op> <key>: <status text>". */
void kvp_api_fail_keys(const char *op, const char *const *keys, const int32_t *st, size_t n);

/* The identity of this host for shm routing: boot id + pid namespace. */
void kvp_host_id(char *buf, size_t len);

#endif
