/*
 * peer.c - the peer table: what this client knows of every segment it has
 * heard of (its descriptor, the shm mapping once made), found by segment id.
 *
 * Descriptors arrive with master replies (kvp_client_peers_update); an entry
 * is refcounted so a transfer may keep using a peer the table dropped.
 *
 * Thread: any client thread; the table is guarded by peer_lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/client_priv.h"
#include "client/internal.h"
#include "client/mem/gpu.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/clock.h"
#include "kvpool.pb-c.h"

void kvp_peer_unref(kvp_peer_t *peer)
{
    if (atomic_fetch_sub(&peer->refs, 1) != 1)
        return;
    if (peer->shm_base != NULL && !peer->shm_own)
        munmap(peer->shm_base, peer->size);
    free(peer);
}

/* Drop mapped peers whose owner process is gone (their memfd would stay alive). */
static void peers_sweep_locked(kvp_client_t *c)
{
    uint64_t now = kvp_now_ms();
    if (now - c->last_sweep_ms < 2000)
        return;
    c->last_sweep_ms = now;
    size_t w = 0;
    for (size_t i = 0; i < c->n_peers; i++) {
        kvp_peer_t *p = c->peers[i];
        if (p->shm_base != NULL && !p->shm_own && access(p->shm_path, F_OK) != 0) {
            kvp_peer_unref(p);
            continue;
        }
        c->peers[w++] = p;
    }
    c->n_peers = w;
}

/* Learn segments from a master response. Caller holds no lock. */
void kvp_client_peers_update(kvp_client_t *c, Kvpool__SegmentDesc **descs, size_t n)
{
    pthread_mutex_lock(&c->peer_lock);
    peers_sweep_locked(c);
    for (size_t i = 0; i < n; i++) {
        const Kvpool__SegmentDesc *d = descs[i];
        bool known = false;
        for (size_t k = 0; k < c->n_peers && !known; k++)
            known = c->peers[k]->segment_id == d->id;
        if (known)
            continue;
        if (c->n_peers == c->cap_peers) {
            size_t cap = c->cap_peers ? c->cap_peers * 2 : 16;
            kvp_peer_t **pp = realloc(c->peers, cap * sizeof(*pp));
            if (pp == NULL)
                break;
            c->peers = pp;
            c->cap_peers = cap;
        }
        kvp_peer_t *p = calloc(1, sizeof(*p));
        if (p == NULL)
            break;
        atomic_init(&p->refs, 1);
        p->segment_id = d->id;
        p->size = d->size;
        p->owner_client_id = d->owner_client_id;
        snprintf(p->name, sizeof(p->name), "%s", d->name);
        snprintf(p->endpoint, sizeof(p->endpoint), "%s", d->tcp_endpoint);
        snprintf(p->host_id, sizeof(p->host_id), "%s", d->host_id);
        snprintf(p->shm_path, sizeof(p->shm_path), "%s", d->shm_path);
        snprintf(p->rdma_endpoint, sizeof(p->rdma_endpoint), "%s", d->rdma_endpoint);
        p->rdma_addr = d->rdma_addr;
        p->rdma_rkey = d->rdma_rkey;
        if (c->seg_base != NULL && d->id == atomic_load(&c->seg_id) &&
            d->owner_client_id == c->client_id) {
            p->shm_base = c->seg_base;
            p->shm_own = true;
        } else if (c->xfer.forced != KVP_TRANSPORT_TCP && c->xfer.forced != KVP_TRANSPORT_RDMA &&
                   strcmp(p->host_id, c->xfer.host_id) == 0) {
            kvp_shm_map_peer(p);
        }
        c->peers[c->n_peers++] = p;
    }
    pthread_mutex_unlock(&c->peer_lock);
}

/* Find a known peer and take a reference, or NULL. */
kvp_peer_t *kvp_client_peer_get(kvp_client_t *c, uint64_t segment_id)
{
    kvp_peer_t *found = NULL;
    pthread_mutex_lock(&c->peer_lock);
    for (size_t k = 0; k < c->n_peers; k++) {
        if (c->peers[k]->segment_id == segment_id) {
            found = c->peers[k];
            atomic_fetch_add(&found->refs, 1);
            break;
        }
    }
    pthread_mutex_unlock(&c->peer_lock);
    return found;
}
