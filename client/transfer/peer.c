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

void kvp_peer_read_latency(kvp_peer_t *peer, uint64_t us, uint64_t now_ms)
{
    uint32_t sample = us > UINT32_MAX ? UINT32_MAX : (uint32_t)(us ? us : 1);
    uint32_t old = atomic_load_explicit(&peer->read_lat_us, memory_order_relaxed);
    uint64_t at = atomic_load_explicit(&peer->read_lat_ms, memory_order_relaxed);
    uint32_t est = sample;
    if (old != 0 && now_ms - at <= KVP_PEER_LAT_STALE_MS)
        est = (uint32_t)(((uint64_t)old * 3 + sample) / 4);
    /* racing threads each store a plausible average: an estimate, not an account */
    atomic_store_explicit(&peer->read_lat_us, est ? est : 1, memory_order_relaxed);
    atomic_store_explicit(&peer->read_lat_ms, now_ms, memory_order_relaxed);
}
