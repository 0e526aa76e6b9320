/*
 * client_priv.h - the client object, shared by the files of libkvpool that
 * act for a client: client.c (life), object.c (flows), control/ (master
 * connection, heartbeat, drain), transfer/peer.c, mem/registry.c, admin.c.
 */
#ifndef KVP_CLIENT_CLIENT_PRIV_H
#define KVP_CLIENT_CLIENT_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "client/internal.h"
#include "client/transfer/peer.h"
#include "kvpool.pb-c.h"

/* This client's own segment. */
#define KVP_SEG_NONE 0     /* mounts nothing */
#define KVP_SEG_MOUNTED 1  /* mounted (or to be remounted after a reconnect) */
#define KVP_SEG_DRAINING 2 /* moving its objects away */
#define KVP_SEG_DRAINED 3  /* unmounted for good; memory kept until destroy */

struct kvp_client {
    kvp_client_params_t params;
    char master_host[256];
    uint16_t master_port;
    uint64_t client_id;

    struct kvp_mconn *mc; /* the master connection, shared by all threads */
    /* etcd:// master address: the leader is found through etcd (control/discovery.c) */
    struct kvp_discovery *disc;
    /* orders a remount (on a new connection, or asked by the master) against a drain
     * changing the segment's state */
    pthread_mutex_t seg_lock;

    /* read leases to hand back, kept while there is no master connection */
    pthread_mutex_t rel_lock;
    uint64_t *rel_ids;
    size_t rel_n, rel_cap;

    kvp_transfer_t xfer;

    pthread_rwlock_t peer_lock; /* peers: read per op, written when descriptors arrive */
    kvp_peer_table_t peers;
    uint64_t last_sweep_ms;

    /* own segment */
    int seg_fd;
    void *seg_base;
    uint64_t seg_size;
    char seg_name[300];
    char seg_endpoint[280];
    char seg_shm_path[64];
    char seg_rdma_endpoint[64]; /* "" when the segment is not served over rdma */
    uint64_t seg_rdma_addr;
    uint32_t seg_rdma_rkey;
    _Atomic uint64_t seg_id;
    /* the master's segment table version we last received (heartbeat) */
    _Atomic uint64_t segments_version;
    kvp_segment_server_t *seg_server;
    /* the record of the objects on it (segment/seg_record.c), kept current by the record
     * thread and offered back at each mount (control/record.c); NULL without a segment */
    struct kvp_seg_record *record;
    pthread_t rec_thread;
    bool rec_started;
    _Atomic bool rec_stop;
    _Atomic uint64_t rec_offer_id; /* a mount whose record is still to be offered */
    _Atomic uint64_t rec_open_id;  /* the last mount whose offer ended (the segment open) */
    /* SSD segment (ssd/ssd_owner.c), NULL when none */
    struct kvp_ssd_owner *ssd;

    /* registered buffers: xfer.mem (client/mem/registry.c) */

    /* liveness heartbeat (control/heartbeat.c) */
    pthread_t hb_thread;
    bool hb_started;
    pthread_mutex_t hb_lock;
    pthread_cond_t hb_cond;
    bool hb_stop;
    bool hb_closing; /* destroy began: start no new drain */
    /* own segment's state: KVP_SEG_* */
    _Atomic int seg_state;
    /* a drain asked for by someone else runs on its own thread */
    pthread_t drain_thread;
    _Atomic bool drain_running;
    bool drain_thread_started;
};

/* Master RPC with reconnect (and remount of the segment) on a broken connection. */
kvp_status_t kvp_client_call(kvp_client_t *c, uint16_t method, const ProtobufCMessage *req,
                             uint8_t **resp_p, size_t *resp_len_p);
/* kvp_client_call, then unpack the reply as `desc`; NULL on any failure (*st_p says why). */
void *kvp_client_call_unpack(kvp_client_t *c, uint16_t method, const ProtobufCMessage *req,
                             const ProtobufCMessageDescriptor *desc, kvp_status_t *st_p);
/* Open the master connection (create): mounts the segment; any refusal is an error. */
kvp_status_t kvp_client_master_open(kvp_client_t *c);
/* Close it and drop what was queued for it (destroy). */
void kvp_client_master_close(kvp_client_t *c);
/* Hand back read leases after a get's transfers (no round trip: one-way). */
void kvp_client_lease_release(kvp_client_t *c, const uint64_t *ids, size_t n);
/* Mount the segment again on the current connection (the master asked for it). */
kvp_status_t kvp_client_mount(kvp_client_t *c);
/* Learn segment descriptors from a master response. */
void kvp_client_peers_update(kvp_client_t *c, Kvpool__SegmentDesc **descs, size_t n);
/* A known peer with a reference taken (kvp_peer_unref), or NULL. */
kvp_peer_t *kvp_client_peer_get(kvp_client_t *c, uint64_t segment_id);

/* control/heartbeat.c: start / stop the heartbeat thread. */
kvp_status_t kvp_client_heartbeat_start(kvp_client_t *c);
void kvp_client_heartbeat_stop(kvp_client_t *c);

#endif
