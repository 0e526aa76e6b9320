/*
 * peer_table.h - the tables that find peers by segment id.
 *
 * kvp_peer_table_t is the bare hash (open addressing, linear probing,
 * backward-shift deletion, grown at 1/2 load), each slot holding one
 * reference to its peer; it is not locked. kvp_peers_t is the client's table:
 * the hash under its own rwlock, fed with the descriptors of master replies
 * (kvp_peers_update, which attaches new peers to their transport) and read
 * once per op (kvp_peers_get).
 *
 * Thread: kvp_peers_* from any client thread; kvp_peer_table_* under the
 * caller's lock.
 */
#ifndef KVP_CLIENT_TRANSFER_PEER_TABLE_H
#define KVP_CLIENT_TRANSFER_PEER_TABLE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "client/transfer/engine.h"
#include "client/transfer/peer.h"
#include "common/status.h"
#include "kvpool.pb-c.h"

typedef struct kvp_peer_table {
    kvp_peer_t **slots; /* NULL: empty */
    size_t cap;         /* a power of two, or 0 */
    size_t n;
} kvp_peer_table_t;

void kvp_peer_table_init(kvp_peer_table_t *t);
/* Drops the table's reference of every peer and frees the slots. */
void kvp_peer_table_cleanup(kvp_peer_table_t *t);
/* The peer of this segment (borrowed: no reference taken), or NULL. */
kvp_peer_t *kvp_peer_table_find(const kvp_peer_table_t *t, uint64_t segment_id);
/* Add a peer; its reference is transferred to the table. KVP_ERR_EXISTS (a peer with its
 * segment id is in already; the reference stays the caller's), KVP_ERR_NOMEM. */
kvp_status_t kvp_peer_table_insert(kvp_peer_table_t *t, kvp_peer_t *peer);
/* Take the peer of this segment out; the table's reference is transferred to the caller.
 * NULL: none. */
kvp_peer_t *kvp_peer_table_remove(kvp_peer_table_t *t, uint64_t segment_id);

/* The client's table of peers: the hash under its lock. */
#define KVP_PEERS_SUSPECTS 8       /* failed segments remembered at most */
#define KVP_PEERS_SUSPECT_MS 10000 /* ... for this long after their failure */

typedef struct kvp_peers {
    pthread_rwlock_t lock; /* read per op, written when descriptors change */
    kvp_peer_table_t table;
    uint64_t last_sweep_ms;      /* the last drop of stale peers (lock held for writing) */
    struct kvp_transfer *xfer;   /* attaches new peers to their transport (borrowed) */
    uint64_t client_id;          /* ours: a segment we own is attached as `own` */
    _Atomic uint64_t own_seg_id; /* our DRAM segment's id at the master; 0: none */
    /* segments a transfer to or from failed lately (kvp_peers_suspect): new puts ask the
     * master to place elsewhere while it can */
    pthread_mutex_t suspect_lock;
    _Atomic uint64_t suspect_last_ms; /* the latest failure noted; 0: none */
    struct {
        uint64_t segment_id, ms;
    } suspects[KVP_PEERS_SUSPECTS];
} kvp_peers_t;

void kvp_peers_init(kvp_peers_t *peers, struct kvp_transfer *xfer, uint64_t client_id);
/* Drops every peer (detached from the transports at its last reference). */
void kvp_peers_cleanup(kvp_peers_t *peers);
/* Our DRAM segment is now mounted as seg_id (0: none): its peer is `own`. */
void kvp_peers_set_own(kvp_peers_t *peers, uint64_t seg_id);
/* Learn segments from a master reply: new or changed descriptors become peers attached to
 * their transport; peers whose owner is known gone are dropped. */
void kvp_peers_update(kvp_peers_t *peers, Kvpool__SegmentDesc **descs, size_t n);
/* A known peer with a reference taken (kvp_peer_unref), or NULL. */
kvp_peer_t *kvp_peers_get(kvp_peers_t *peers, uint64_t segment_id);
/* A transfer to or from segment_id failed now (also sets the peer's failed_ms). */
void kvp_peers_suspect(kvp_peers_t *peers, kvp_peer_t *peer);
/* The segments noted so in the last KVP_PEERS_SUSPECT_MS, at most max, into out; how many.
 * No lock is taken when none was noted lately. */
size_t kvp_peers_suspects(kvp_peers_t *peers, uint64_t now_ms, uint64_t *out, size_t max);
/* Did a transfer to or from peer fail in the KVP_PEERS_SUSPECT_MS before now_ms? */
bool kvp_peers_failed_lately(kvp_peer_t *peer, uint64_t now_ms);

#endif
