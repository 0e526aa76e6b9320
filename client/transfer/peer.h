/*
 * peer.h - a peer: what this client knows of a segment (its descriptor, the
 * transport the engine chose for it), refcounted so a transfer may keep using
 * a peer its table dropped. The tables that find peers by segment id are in
 * peer_table.h.
 *
 * Thread: any; the refcount is atomic, the transport fields are the engine's
 * (engine.c, under tp_lock).
 */
#ifndef KVP_CLIENT_TRANSFER_PEER_H
#define KVP_CLIENT_TRANSFER_PEER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/transfer/transport.h"
#include "common/status.h"

struct kvp_transfer;

/* What we know of a remote (or our own) segment. */
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
    /* data grants on: our connection key for it and our principal's tag, which a data
     * connection proves in its HELLO (common/grant.h); has_conn_key false: no HELLO */
    uint8_t conn_key[32];
    uint64_t conn_tag;
    bool has_conn_key;
    /* Optional: run on each new tcp connection to the peer before any request (a
     * transfer engine's TE_AUTH, client/te/te.c); an error closes it and fails the transfer */
    kvp_status_t (*hello)(void *arg, int fd, uint32_t timeout_ms);
    void *hello_arg;
    /* tcp: peers of one endpoint share connections within one epoch only; the first peer of
     * a newer epoch retires the older ones' (a transfer engine whose KVPOOL_TE_ACL changed:
     * its connections prove their target again, te.c). 0 for the store's peers. */
    uint64_t conn_epoch;
    bool grants; /* its owner checks grants: shm and rdma need a MAP grant / an rdma key */
    /* ... and a MAP grant for the shm hand-off (transport/hello.h), when the master gave
     * one; a peer's is used once, at attach */
    uint8_t shm_grant[80];
    bool has_shm_grant;
    /* ... and our rdma key for it (the proof that connects a queue pair: common/grant.h),
     * when the master gave one; without one (grants on) rdma does not take the peer */
    uint8_t rdma_key[32];
    bool has_rdma_key;
    bool rdma_windows; /* its owner serves rdma through memory windows only (wire.h BIND) */
    bool own;          /* this client's own segment */
    bool ssd;          /* an SSD segment (medium "ssd": served over tcp) */
    bool dfs;          /* a DFS segment (medium "dfs"; ssd is set too: served like one) */
    _Atomic uint64_t failed_ms; /* last transfer failure (kvp_now_ms), 0: none */
    /* How long its owner takes to answer a read (tcp: a read request fully sent to its
     * response's header, the first on each stream of a transfer): a moving average in us
     * (0: none yet) and when it last moved (kvp_now_ms). A get tries a replica whose owner
     * answers far slower than another's after it (object.c, order_replicas). */
    _Atomic uint32_t read_lat_us;
    _Atomic uint64_t read_lat_ms;
    /* The transport chosen for it (transfer/engine.c): set at attach, changed only
     * when it fails the peer; NULL when none reaches it. tp_state[i] is transport
     * i's per-peer state, written once under tp_lock before tp points to it. */
    struct kvp_transfer *xfer;             /* the engine that attached it */
    void (*detach)(struct kvp_peer *peer); /* the engine's undo of attach, at the last unref */
    _Atomic(struct kvp_transport *) tp;
    void *tp_state[KVP_TP_MAX];
    uint32_t tp_attached; /* bit i: transport i attached (tp_lock) */
    bool tp_tried;        /* attach ran (tp_lock) */
    pthread_mutex_t tp_lock;
} kvp_peer_t;

/* A peer with one reference (the caller's) and no transport yet; NULL: no memory. */
kvp_peer_t *kvp_peer_create(uint64_t segment_id);
void kvp_peer_ref(kvp_peer_t *peer);
/* A read of this peer's answered after us microseconds: fold it into read_lat_us (a
 * moving average, a quarter of the new sample; the first sample, or one after a pause of
 * more than KVP_PEER_LAT_STALE_MS, starts it anew). */
void kvp_peer_read_latency(kvp_peer_t *peer, uint64_t us, uint64_t now_ms);
/* An estimate older than this is no longer believed (the peer may have recovered). */
#define KVP_PEER_LAT_STALE_MS 10000
/* The last reference detaches the peer from its transports (peer->detach) and frees it. */
void kvp_peer_unref(kvp_peer_t *peer);
/* Transport `index`'s state of a peer attached to it (transport.h). */
static inline void *kvp_peer_tp_state(const kvp_peer_t *peer, unsigned index)
{
    return peer->tp_state[index];
}

#endif
