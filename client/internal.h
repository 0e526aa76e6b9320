/*
 * internal.h - libkvpool internals shared by the client's files, the transfer
 * engine, the transports and the segment server.
 *
 * Layering: client.c / object.c (API) -> control/master_conn.c (control RPC)
 * and transfer/engine.c (data engine) -> transport/{shm,tcp,rdma}.c through
 * kvp_transport_ops_t (transfer/transport.h). segment/segment_server.c serves this client's own
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
#include "client/mem/registry.h"
#include "client/transfer/transport.h"
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
    /* the descriptor the master sent (immutable once the peer is in the table) */
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
    bool own;                   /* this client's own segment */
    bool ssd;                   /* an SSD segment (medium "ssd": served over tcp) */
    _Atomic uint64_t failed_ms; /* last transfer failure (kvp_now_ms), 0: none */
    /* The transport chosen for it (transfer/engine.c): set at attach, changed only
     * when it fails the peer; NULL when none reaches it. tp_state[i] is transport
     * i's per-peer state, written once under tp_lock before tp points to it. */
    struct kvp_transfer *xfer; /* the engine that attached it (detach at the last unref) */
    _Atomic(struct kvp_transport *) tp;
    void *tp_state[KVP_TP_MAX];
    uint32_t tp_attached; /* bit i: transport i attached (tp_lock) */
    bool tp_tried;        /* attach ran (tp_lock) */
    pthread_mutex_t tp_lock;
} kvp_peer_t;

/* A peer with one reference (the caller's) and no transport yet; NULL: no memory. */
kvp_peer_t *kvp_peer_create(uint64_t segment_id);
void kvp_peer_ref(kvp_peer_t *peer);
/* The last reference detaches the peer from its transports and frees it. */
void kvp_peer_unref(kvp_peer_t *peer);
/* Transport `index`'s state of a peer attached to it (transport.h). */
static inline void *kvp_peer_tp_state(const kvp_peer_t *peer, unsigned index)
{
    return peer->tp_state[index];
}

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
    bool stream;         /* a piece of a move of >= KVP_CRC32C_STREAM_MIN bytes: copies stream */
    uint32_t crc;        /* out */
    kvp_status_t status; /* out */
} kvp_xfer_op_t;

typedef enum kvp_transport_id {
    KVP_TRANSPORT_AUTO = 0,
    KVP_TRANSPORT_TCP = 1,
    KVP_TRANSPORT_SHM = 2,
    KVP_TRANSPORT_RDMA = 3,
} kvp_transport_id_t;

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

/* Most stagers of one kind (host, gpu) one engine makes; threads beyond wait for one. */
#define KVP_STAGERS_MAX 4

typedef struct kvp_stager_pool {
    pthread_mutex_t lock; /* taken to take or give back a stager, never across its use */
    pthread_cond_t cond;
    unsigned n[2];                               /* made, per kind */
    unsigned n_free[2];                          /* free[kind][0..n_free) */
    struct kvp_stager *all[2][KVP_STAGERS_MAX];  /* for destroy */
    struct kvp_stager *free[2][KVP_STAGERS_MAX]; /* ready to take */
} kvp_stager_pool_t;

/* ---- counters (client/metrics.c reads them) ----
 * Relaxed atomics, added once per batch (engine) or per request (data servers): never a
 * lock, never an allocation. Index [dir]: 0 put (WRITE), 1 get (READ). */
typedef struct kvp_count_stats {
    _Atomic uint64_t ops, bytes;
} kvp_count_stats_t;

typedef struct kvp_xfer_stats {
    kvp_count_stats_t tp[KVP_METRICS_TP_MAX][2]; /* [KVP_METRICS_TP_*][dir] */
    _Atomic uint64_t errors[2];                  /* [dir] */
    kvp_count_stats_t staged[2];                 /* [0] host, [1] gpu */
} kvp_xfer_stats_t;

/* What a data server did to our segment: [dir], 0 a peer's put (WRITE), 1 its get (READ). */
typedef struct kvp_served_stats {
    kvp_count_stats_t dir[2];
} kvp_served_stats_t;

static inline void kvp_count_add(kvp_count_stats_t *c, uint64_t ops, uint64_t bytes)
{
    atomic_fetch_add_explicit(&c->ops, ops, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->bytes, bytes, memory_order_relaxed);
}
/* Take back a count added ahead of a reply that then failed. */
static inline void kvp_count_sub(kvp_count_stats_t *c, uint64_t ops, uint64_t bytes)
{
    atomic_fetch_sub_explicit(&c->ops, ops, memory_order_relaxed);
    atomic_fetch_sub_explicit(&c->bytes, bytes, memory_order_relaxed);
}

typedef struct kvp_transfer {
    /* settings, filled by the client before kvp_transfer_init */
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
    /* the priority list to create; NULL: kvp_transports (tests put fakes here) */
    const kvp_transport_ops_t *const *list;

    char why[512]; /* why the last transport that could not be created could not */
    bool gpu;      /* the CUDA driver is loaded: device pointers are possible */
    kvp_transport_t tps[KVP_TP_MAX]; /* created, in priority order */
    unsigned n_tps;
    kvp_mem_registry_t mem; /* registered buffers (client/mem/registry.c) */
    /* our own segment, once served (shm maps it no second time; ops on it may be
     * zero-copy on the transports that registered it to serve it) */
    void *seg_base;
    uint64_t seg_size;
    uint32_t seg_tp_regs;
    kvp_stager_pool_t stagers;
    kvp_xfer_stats_t stats; /* what this client moved, as initiator */
} kvp_transfer_t;

/* Create the transports of the list (only the forced one when one is forced). */
kvp_status_t kvp_transfer_init(kvp_transfer_t *xfer);
/* Peers must be gone (their transports' state detached) before this. */
void kvp_transfer_cleanup(kvp_transfer_t *xfer);
/* Choose the peer's transport if not done yet (the first transport of the list that
 * attaches it). Thread: any; the first caller does the work under peer->tp_lock. */
void kvp_transfer_attach(kvp_transfer_t *xfer, kvp_peer_t *peer);
/* Which transport ops to this peer use (attaching it first if needed);
 * KVP_TRANSPORT_AUTO: none reaches it. */
kvp_transport_id_t kvp_transfer_route(kvp_transfer_t *xfer, kvp_peer_t *peer);
/* Undo every transport's attach of the peer (kvp_peer_unref, last reference). */
void kvp_transfer_detach_peer(kvp_peer_t *peer);
/* Is the peer's owner known to be gone (a transport says so)? */
bool kvp_transfer_peer_stale(kvp_transfer_t *xfer, kvp_peer_t *peer);
/* Run a batch of ops, each on its peer's transport (staged when that transport
 * cannot reach the op's buffer). Sets each op's status. Allocates nothing after
 * the calling thread's first batches (per-thread scratch, kept). */
void kvp_transfer_run(kvp_transfer_t *xfer, kvp_xfer_op_t *ops, size_t n);
/* The memory kind of [addr, addr+len): the registry's when registered, else the
 * driver's answer (unregistered memory). Thread: any, no lock. */
kvp_mem_kind_t kvp_transfer_mem_kind(kvp_transfer_t *xfer, const void *addr, size_t len);
/* kvp_register_buffer's transport side (the registry's lock held): register with
 * every transport that wants it; *tp_regs_p gets a bit per transport that did.
 * Memory a transport could not register is staged on it, unless that transport
 * is forced (then the registration fails). */
kvp_status_t kvp_transfer_register(kvp_transfer_t *xfer, void *addr, size_t len,
                                   kvp_mem_kind_t kind, uint32_t *tp_regs_p);
void kvp_transfer_unregister(kvp_transfer_t *xfer, void *addr, uint32_t tp_regs);
/* Serve our segment on the transports that serve (rdma: register + listen). */
kvp_status_t kvp_transfer_serve_segment(kvp_transfer_t *xfer, void *base, uint64_t size,
                                        char *endpoint, size_t endpoint_len, uint64_t *addr_p,
                                        uint32_t *rkey_p);

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
/* Its counters (live, updated by the connection threads); valid until destroy. */
const kvp_served_stats_t *kvp_segment_server_stats(const kvp_segment_server_t *srv);

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
