/*
 * peer.c - a peer's life (peer.h): created with one reference, shared by the
 * table and the transfers that use it; the last reference has the engine
 * that attached it undo the attach (peer->detach), then frees it.
 *
 * Thread: any.
 */
#include <stdlib.h>

#include "client/transfer/peer.h"

kvp_peer_t *kvp_peer_create(uint64_t segment_id)
{
    kvp_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    atomic_init(&p->refs, 1);
    atomic_init(&p->tp, NULL);
    p->segment_id = segment_id;
    pthread_mutex_init(&p->tp_lock, NULL);
    return p;
}

void kvp_peer_ref(kvp_peer_t *peer)
{
    atomic_fetch_add(&peer->refs, 1);
}

void kvp_peer_unref(kvp_peer_t *peer)
{
    if (atomic_fetch_sub(&peer->refs, 1) != 1)
        return;
    if (peer->detach != NULL)
        peer->detach(peer);
    pthread_mutex_destroy(&peer->tp_lock);
    free(peer);
}
