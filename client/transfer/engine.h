/*
 * engine.h - the transfer engine (engine.c): the transports of the priority
 * list (transport.h), the buffers registered with them (mem/registry.c), the
 * stagers for memory a transport cannot reach, and the batch runner every
 * object flow calls.
 *
 * Thread: kvp_transfer_run from any client thread at once; init/cleanup on the
 * thread that creates/destroys the client.
 */
#ifndef KVP_CLIENT_TRANSFER_ENGINE_H
#define KVP_CLIENT_TRANSFER_ENGINE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/mem/registry.h"
#include "client/transfer/peer.h"
#include "client/transfer/transport.h"
#include "client/transfer/xfer.h"
#include "common/grant.h"
#include "common/status.h"

struct kvp_rdma_offer;

/* Most stagers of one kind one engine makes; threads beyond wait for one. */
#define KVP_STAGERS_MAX 4

/* The kinds of stager: host memory a transport must register (rdma), device memory to a
 * peer mapped on this host (shm: the "transfer" of a buffer is a memcpy, so many small
 * buffers overlap best), device memory to a peer behind a socket or a NIC (each buffer
 * one batch on the streams: large ones, kvp_transfer_t.stage_chunk). */
enum { KVP_STAGE_POOL_HOST = 0, KVP_STAGE_POOL_GPU_NEAR, KVP_STAGE_POOL_GPU_FAR, KVP_STAGE_POOLS };

typedef struct kvp_stager_pool {
    pthread_mutex_t lock; /* taken to take or give back a stager, never across its use */
    pthread_cond_t cond;
    unsigned n[KVP_STAGE_POOLS];                               /* made, per kind */
    unsigned n_free[KVP_STAGE_POOLS];                          /* free[kind][0..n_free) */
    struct kvp_stager *all[KVP_STAGE_POOLS][KVP_STAGERS_MAX];  /* for destroy */
    struct kvp_stager *free[KVP_STAGE_POOLS][KVP_STAGERS_MAX]; /* ready to take */
} kvp_stager_pool_t;

/* kvp_transfer_t.rdma_windows: serve the segment over rdma through memory windows. */
enum { KVP_RDMA_WINDOWS_OFF = 0, KVP_RDMA_WINDOWS_ON, KVP_RDMA_WINDOWS_UNBOUNDED };

typedef struct kvp_transfer {
    /* settings, filled by the client before kvp_transfer_init */
    kvp_transport_id_t forced;
    char host_id[128];
    uint64_t client_id;
    uint32_t timeout_ms;
    uint32_t tcp_streams;
    uint64_t tcp_slice;
    uint64_t tcp_chain;     /* bytes of small slices chained into one request; 0: the tcp
                             * transport's default (512 KiB, at most tcp_slice) */
    uint64_t stage_chunk;   /* bytes of one staging buffer for device memory to a peer not
                             * on shm (staging.h; two a stager); 0: 16 MiB */
    char rdma_devices[256]; /* device list, "" = auto */
    char rdma_host[64];     /* IPv4 to serve the segment on; "" = the device's */
    uint32_t rdma_qps;      /* QPs per peer */
    uint64_t rdma_slice;    /* stripe size */
    int rdma_windows;       /* serve through memory windows: KVP_RDMA_WINDOWS_* (below;
                             * KVPOOL_RDMA_WINDOWS, client/env.c) */
    unsigned rdma_qp_cap;   /* QPs one principal may hold to our segment; 0: the default
                             * (KVPOOL_RDMA_QP_CAP) */
    /* a transfer engine's (client/te/te.c): the offer of a peer with a tcp endpoint and no
     * rdma descriptor (its regions' keys and a connect token: transport/rdma_regions.h),
     * which makes such peers rdma's; NULL: none are */
    kvp_status_t (*rdma_offer)(void *arg, const kvp_peer_t *peer, struct kvp_rdma_offer *offer);
    void *rdma_offer_arg;
    /* the priority list to create (kvp_transports, transport/transports.h; tests put fakes
     * here); NULL: kvp_transfer_init fails, KVP_ERR_INVALID_ARG */
    const kvp_transport_ops_t *const *list;
    /* a transport created before the list, forced or not (the DFS shard files, when the
     * client has a DFS directory: it takes only DFS segments' peers); NULL: none */
    const kvp_transport_ops_t *first;
    char dfs_dir[1024]; /* the DFS directory (client/ssd/dfs.h); "": none */
    /* settings the creator's own transports read at create (a transfer engine's one-copy
     * shm path, client/te/te_shm.h); NULL: none (those transports stay out) */
    const void *own_cfg;

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
    /* the data grants' key of our segment's mount (segment/segment.c sets it): a serving
     * transport (rdma) lets in only peers that prove a key derived from it; and the
     * connection requests it refused */
    kvp_grant_keyring_t seg_grants;
    _Atomic uint64_t serve_refused;
    /* remote access errors peers caused on our segment's queue pairs (their async events),
     * and the NIC's own count of them (-1: the device keeps none), kept by the rdma accept
     * thread */
    _Atomic uint64_t serve_access_errors;
    _Atomic int64_t nic_access_errors;
    /* our segment is served through memory windows only (rdma, KVPOOL_RDMA_WINDOWS=1 with
     * data grants on): its descriptor says so, the data server binds them (BIND_READ/WRITE) */
    bool seg_windows;
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
/* The memory kind of [addr, addr+len): the registry's when registered (*region_p the
 * region, NULL otherwise), else the driver's answer (unregistered memory). Thread: any, no
 * lock. */
kvp_mem_kind_t kvp_transfer_mem_find(kvp_transfer_t *xfer, const void *addr, size_t len,
                                     const kvp_mem_region_t **region_p);
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

/* The serving transport's windows op (transport.h): KVP_ERR_INVALID_ARG when none serves
 * our segment through windows. */
kvp_status_t kvp_transfer_windows(kvp_transfer_t *xfer, uint32_t qp_num, uint64_t tag,
                                  const uint64_t *offs, const uint64_t *lens, size_t n_bind,
                                  bool write, uint64_t expiry_ms, uint32_t *rkeys, uint32_t *slots,
                                  size_t n_unbind);

/* Register [addr, addr+len) (kvp_register_buffer): find its memory kind, register it with
 * every transport that wants it, add it to the registry. KVP_ERR_INVALID_ARG (overlaps a
 * registered buffer), or a forced transport's refusal. Thread: any (the registry's lock). */
kvp_status_t kvp_transfer_register_buffer(kvp_transfer_t *xfer, void *addr, size_t len);
/* Undo kvp_transfer_register_buffer for the buffer starting at addr; KVP_ERR_NOT_FOUND. */
kvp_status_t kvp_transfer_unregister_buffer(kvp_transfer_t *xfer, void *addr);

/* The identity of this host for shm routing: boot id + pid namespace. */
void kvp_host_id(char *buf, size_t len);

#endif
