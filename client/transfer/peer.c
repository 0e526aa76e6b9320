/*
 * peer.c - the peer table: what this client knows of every segment it has
 * heard of (its descriptor, the transport chosen for it), found by segment id
 * in a hash (peer.h).
 *
 * Descriptors arrive with master replies (kvp_client_peers_update); the peer
 * is attached to its transport then (shm maps the segment), under the table's
 * write lock. An entry is refcounted so a transfer may keep using a peer the
 * table dropped; the last reference detaches it from its transports.
 *
 * Thread: any client thread; the table is guarded by peer_lock (a rwlock:
 * lookups, once per op, share it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_priv.h"
#include "client/internal.h"
#include "client/transfer/peer.h"
#include "common/clock.h"
#include "common/log.h"
#include "kvpool.pb-c.h"

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
    kvp_transfer_detach_peer(peer);
    pthread_mutex_destroy(&peer->tp_lock);
    free(peer);
}

/* ---- the hash ---- */

static size_t slot_of(uint64_t id, size_t cap)
{
    /* segment ids may be sequential: mix them (splitmix64 finaliser) */
    id ^= id >> 30;
    id *= 0xbf58476d1ce4e5b9ull;
    id ^= id >> 27;
    id *= 0x94d049bb133111ebull;
    id ^= id >> 31;
    return (size_t)id & (cap - 1);
}

void kvp_peer_table_init(kvp_peer_table_t *t)
{
    *t = (kvp_peer_table_t){0};
}

void kvp_peer_table_cleanup(kvp_peer_table_t *t)
{
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i] != NULL)
            kvp_peer_unref(t->slots[i]);
    free(t->slots);
    *t = (kvp_peer_table_t){0};
}

kvp_peer_t *kvp_peer_table_find(const kvp_peer_table_t *t, uint64_t segment_id)
{
    if (t->n == 0)
        return NULL;
    for (size_t i = slot_of(segment_id, t->cap);; i = (i + 1) & (t->cap - 1)) {
        kvp_peer_t *p = t->slots[i];
        if (p == NULL || p->segment_id == segment_id)
            return p;
    }
}

static void place(kvp_peer_t **slots, size_t cap, kvp_peer_t *p)
{
    size_t i = slot_of(p->segment_id, cap);
    while (slots[i] != NULL)
        i = (i + 1) & (cap - 1);
    slots[i] = p;
}

kvp_status_t kvp_peer_table_insert(kvp_peer_table_t *t, kvp_peer_t *peer)
{
    if (kvp_peer_table_find(t, peer->segment_id) != NULL)
        return KVP_ERR_EXISTS;
    if ((t->n + 1) * 2 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        kvp_peer_t **slots = calloc(cap, sizeof(*slots));
        if (slots == NULL)
            return KVP_ERR_NOMEM;
        for (size_t i = 0; i < t->cap; i++)
            if (t->slots[i] != NULL)
                place(slots, cap, t->slots[i]);
        free(t->slots);
        t->slots = slots;
        t->cap = cap;
    }
    place(t->slots, t->cap, peer);
    t->n++;
    return KVP_OK;
}

kvp_peer_t *kvp_peer_table_remove(kvp_peer_table_t *t, uint64_t segment_id)
{
    if (t->n == 0)
        return NULL;
    size_t mask = t->cap - 1;
    size_t i = slot_of(segment_id, t->cap);
    while (t->slots[i] != NULL && t->slots[i]->segment_id != segment_id)
        i = (i + 1) & mask;
    kvp_peer_t *found = t->slots[i];
    if (found == NULL)
        return NULL;
    /* backward shift: pull later entries of the probe run into the hole when their home
     * slot does not lie cyclically in (hole, j] */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; t->slots[j] != NULL; j = (j + 1) & mask) {
        size_t home = slot_of(t->slots[j]->segment_id, t->cap);
        bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (!stays) {
            t->slots[hole] = t->slots[j];
            hole = j;
        }
    }
    t->slots[hole] = NULL;
    t->n--;
    return found;
}

/* ---- the client's table ---- */

/* Drop peers whose owner is known gone (a mapped memfd would stay alive). */
static void peers_sweep_locked(kvp_client_t *c)
{
    uint64_t now = kvp_now_ms();
    if (now - c->last_sweep_ms < 2000)
        return;
    c->last_sweep_ms = now;
    for (size_t i = 0; i < c->peers.cap;) {
        kvp_peer_t *p = c->peers.slots[i];
        if (p != NULL && kvp_transfer_peer_stale(&c->xfer, p)) {
            /* an entry may shift into slot i: look at it again */
            kvp_peer_unref(kvp_peer_table_remove(&c->peers, p->segment_id));
            continue;
        }
        i++;
    }
}

/* Does the peer we know under this id describe the same segment? A restarted master
 * numbers its segments from scratch: an id we know may now name another segment. */
static bool desc_matches(const kvp_peer_t *p, const Kvpool__SegmentDesc *d)
{
    return p->size == d->size && p->owner_client_id == d->owner_client_id &&
           p->rdma_addr == d->rdma_addr && p->rdma_rkey == d->rdma_rkey &&
           strcmp(p->name, d->name) == 0 && strcmp(p->endpoint, d->tcp_endpoint) == 0 &&
           strcmp(p->host_id, d->host_id) == 0 && strcmp(p->shm_path, d->shm_path) == 0 &&
           strcmp(p->rdma_endpoint, d->rdma_endpoint) == 0;
}

/* Learn segments from a master response. Caller holds no lock. */
void kvp_client_peers_update(kvp_client_t *c, Kvpool__SegmentDesc **descs, size_t n)
{
    /* the common case, every segment known as described: the shared lock only */
    pthread_rwlock_rdlock(&c->peer_lock);
    bool same = kvp_now_ms() - c->last_sweep_ms < 2000; /* no sweep due */
    for (size_t i = 0; same && i < n; i++) {
        const kvp_peer_t *p = kvp_peer_table_find(&c->peers, descs[i]->id);
        same = p != NULL && desc_matches(p, descs[i]);
    }
    pthread_rwlock_unlock(&c->peer_lock);
    if (same)
        return;
    pthread_rwlock_wrlock(&c->peer_lock);
    peers_sweep_locked(c);
    for (size_t i = 0; i < n; i++) {
        const Kvpool__SegmentDesc *d = descs[i];
        kvp_peer_t *old = kvp_peer_table_find(&c->peers, d->id);
        if (old != NULL && desc_matches(old, d))
            continue;
        if (old != NULL) {
            /* transfers in flight keep their reference to the old one */
            KVP_LOG_INFO("segment id %#llx now names %s (was %s): a new master numbered it",
                         (unsigned long long)d->id, d->name, old->name);
            kvp_peer_unref(kvp_peer_table_remove(&c->peers, d->id));
        }
        kvp_peer_t *p = kvp_peer_create(d->id);
        if (p == NULL)
            break;
        p->size = d->size;
        p->owner_client_id = d->owner_client_id;
        snprintf(p->name, sizeof(p->name), "%s", d->name);
        snprintf(p->endpoint, sizeof(p->endpoint), "%s", d->tcp_endpoint);
        snprintf(p->host_id, sizeof(p->host_id), "%s", d->host_id);
        snprintf(p->shm_path, sizeof(p->shm_path), "%s", d->shm_path);
        snprintf(p->rdma_endpoint, sizeof(p->rdma_endpoint), "%s", d->rdma_endpoint);
        p->rdma_addr = d->rdma_addr;
        p->rdma_rkey = d->rdma_rkey;
        p->ssd = strcmp(d->medium, "ssd") == 0;
        p->own = c->seg_base != NULL && d->id == atomic_load(&c->seg_id) &&
                 d->owner_client_id == c->client_id;
        if (kvp_peer_table_insert(&c->peers, p) != KVP_OK) {
            kvp_peer_unref(p);
            break;
        }
        /* choose its transport now (shm maps the segment and faults it in behind) */
        kvp_transfer_attach(&c->xfer, p);
    }
    pthread_rwlock_unlock(&c->peer_lock);
}

/* Find a known peer and take a reference, or NULL. */
kvp_peer_t *kvp_client_peer_get(kvp_client_t *c, uint64_t segment_id)
{
    pthread_rwlock_rdlock(&c->peer_lock);
    kvp_peer_t *found = kvp_peer_table_find(&c->peers, segment_id);
    if (found != NULL)
        kvp_peer_ref(found);
    pthread_rwlock_unlock(&c->peer_lock);
    return found;
}
