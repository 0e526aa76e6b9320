/*
 * peer.h - the peer table: peers found by segment id in an open-addressing
 * hash (linear probing, backward-shift deletion, grown at 1/2 load), each
 * holding one reference to its peer.
 *
 * Thread: the table is not locked; the client guards it with peer_lock.
 */
#ifndef KVP_CLIENT_TRANSFER_PEER_H
#define KVP_CLIENT_TRANSFER_PEER_H

#include <stddef.h>
#include <stdint.h>

#include "client/internal.h"

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

#endif
