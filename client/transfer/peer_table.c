/*
 * peer_table.c - the peer tables (peer_table.h): the hash by segment id, and
 * the client's table, which learns descriptors from master replies and
 * attaches new peers to their transport then (shm maps the segment), under
 * its write lock.
 *
 * Thread: any client thread; kvp_peers_t guards its hash with its rwlock
 * (lookups, once per op, share it).
 */
#include "client/transfer/peer_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"

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

void kvp_peers_init(kvp_peers_t *peers, kvp_transfer_t *xfer, uint64_t client_id)
{
    pthread_rwlock_init(&peers->lock, NULL);
    kvp_peer_table_init(&peers->table);
    peers->last_sweep_ms = 0;
    peers->xfer = xfer;
    peers->client_id = client_id;
    atomic_init(&peers->own_seg_id, 0);
    pthread_mutex_init(&peers->suspect_lock, NULL);
    atomic_init(&peers->suspect_last_ms, 0);
    memset(peers->suspects, 0, sizeof(peers->suspects));
}

void kvp_peers_suspect(kvp_peers_t *peers, kvp_peer_t *peer)
{
    uint64_t now = kvp_now_ms();
    atomic_store(&peer->failed_ms, now);
    pthread_mutex_lock(&peers->suspect_lock);
    size_t slot = 0; /* its own slot, else the oldest */
    for (size_t i = 0; i < KVP_PEERS_SUSPECTS; i++) {
        if (peers->suspects[i].segment_id == peer->segment_id) {
            slot = i;
            break;
        }
        if (peers->suspects[i].ms < peers->suspects[slot].ms)
            slot = i;
    }
    peers->suspects[slot].segment_id = peer->segment_id;
    peers->suspects[slot].ms = now;
    atomic_store(&peers->suspect_last_ms, now);
    pthread_mutex_unlock(&peers->suspect_lock);
}

size_t kvp_peers_suspects(kvp_peers_t *peers, uint64_t now_ms, uint64_t *out, size_t max)
{
    uint64_t last = atomic_load_explicit(&peers->suspect_last_ms, memory_order_relaxed);
    if (last == 0 || now_ms - last >= KVP_PEERS_SUSPECT_MS)
        return 0;
    size_t n = 0;
    pthread_mutex_lock(&peers->suspect_lock);
    for (size_t i = 0; i < KVP_PEERS_SUSPECTS && n < max; i++)
        if (peers->suspects[i].ms != 0 && now_ms - peers->suspects[i].ms < KVP_PEERS_SUSPECT_MS)
            out[n++] = peers->suspects[i].segment_id;
    pthread_mutex_unlock(&peers->suspect_lock);
    return n;
}

bool kvp_peers_failed_lately(kvp_peer_t *peer, uint64_t now_ms)
{
    uint64_t failed = atomic_load(&peer->failed_ms);
    return failed != 0 && now_ms - failed < KVP_PEERS_SUSPECT_MS;
}

void kvp_peers_cleanup(kvp_peers_t *peers)
{
    kvp_peer_table_cleanup(&peers->table); /* detaches them from the transports */
    pthread_rwlock_destroy(&peers->lock);
    pthread_mutex_destroy(&peers->suspect_lock);
}

void kvp_peers_set_own(kvp_peers_t *peers, uint64_t seg_id)
{
    atomic_store(&peers->own_seg_id, seg_id);
}

/* Drop peers whose owner is known gone (a mapped memfd would stay alive). */
static void peers_sweep_locked(kvp_peers_t *peers)
{
    uint64_t now = kvp_now_ms();
    if (now - peers->last_sweep_ms < 2000)
        return;
    peers->last_sweep_ms = now;
    for (size_t i = 0; i < peers->table.cap;) {
        kvp_peer_t *p = peers->table.slots[i];
        if (p != NULL && kvp_transfer_peer_stale(peers->xfer, p)) {
            /* an entry may shift into slot i: look at it again */
            kvp_peer_unref(kvp_peer_table_remove(&peers->table, p->segment_id));
            continue;
        }
        i++;
    }
}

/* Does the peer we know under this id describe the same segment? A restarted master
 * numbers its segments from scratch: an id we know may now name another segment. A
 * descriptor of a segment with grants that carries no connection key (an answer that
 * hands none; Heartbeats did until 0.1.0's failover fix) says nothing of the key: the one
 * we have is kept, as a peer without it opens data connections that prove no principal,
 * which its owner refuses. */
static bool desc_matches(const kvp_peer_t *p, const Kvpool__SegmentDesc *d)
{
    bool keyed = d->conn_key.len == sizeof(p->conn_key);
    if (p->has_conn_key && !keyed && d->grants)
        keyed = true; /* compared as ours below */
    else if (p->has_conn_key != keyed)
        return false;
    return p->size == d->size && p->owner_client_id == d->owner_client_id &&
           p->rdma_addr == d->rdma_addr && p->rdma_rkey == d->rdma_rkey &&
           strcmp(p->name, d->name) == 0 && strcmp(p->endpoint, d->tcp_endpoint) == 0 &&
           strcmp(p->host_id, d->host_id) == 0 && strcmp(p->shm_path, d->shm_path) == 0 &&
           strcmp(p->rdma_endpoint, d->rdma_endpoint) == 0 && p->grants == d->grants &&
           p->rdma_windows == d->rdma_windows &&
           (!p->has_conn_key || d->conn_key.len != sizeof(p->conn_key) ||
            (p->conn_tag == d->conn_tag &&
             memcmp(p->conn_key, d->conn_key.data, sizeof(p->conn_key)) == 0));
}

/* Learn segments from a master response. Caller holds no lock. */
void kvp_peers_update(kvp_peers_t *peers, Kvpool__SegmentDesc **descs, size_t n)
{
    /* the common case, every segment known as described: the shared lock only */
    pthread_rwlock_rdlock(&peers->lock);
    bool same = kvp_now_ms() - peers->last_sweep_ms < 2000; /* no sweep due */
    for (size_t i = 0; same && i < n; i++) {
        const kvp_peer_t *p = kvp_peer_table_find(&peers->table, descs[i]->id);
        same = p != NULL && desc_matches(p, descs[i]);
    }
    pthread_rwlock_unlock(&peers->lock);
    if (same)
        return;
    pthread_rwlock_wrlock(&peers->lock);
    peers_sweep_locked(peers);
    for (size_t i = 0; i < n; i++) {
        const Kvpool__SegmentDesc *d = descs[i];
        kvp_peer_t *old = kvp_peer_table_find(&peers->table, d->id);
        if (old != NULL && desc_matches(old, d))
            continue;
        if (old != NULL) {
            /* transfers in flight keep their reference to the old one */
            KVP_LOG_INFO("segment id %#llx now names %s (was %s): a new master numbered it",
                         (unsigned long long)d->id, d->name, old->name);
            kvp_peer_unref(kvp_peer_table_remove(&peers->table, d->id));
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
        p->has_conn_key = d->conn_key.len == sizeof(p->conn_key);
        if (p->has_conn_key) {
            memcpy(p->conn_key, d->conn_key.data, sizeof(p->conn_key));
            p->conn_tag = d->conn_tag;
        }
        p->grants = d->grants;
        p->rdma_windows = d->rdma_windows;
        p->has_rdma_key = d->rdma_key.len == sizeof(p->rdma_key);
        if (p->has_rdma_key)
            memcpy(p->rdma_key, d->rdma_key.data, sizeof(p->rdma_key));
        p->has_shm_grant = d->shm_grant.len == sizeof(p->shm_grant);
        if (p->has_shm_grant)
            memcpy(p->shm_grant, d->shm_grant.data, sizeof(p->shm_grant));
        p->dfs = strcmp(d->medium, "dfs") == 0;
        p->ssd = p->dfs || strcmp(d->medium, "ssd") == 0;
        p->own = d->id == atomic_load(&peers->own_seg_id) && d->owner_client_id == peers->client_id;
        if (kvp_peer_table_insert(&peers->table, p) != KVP_OK) {
            kvp_peer_unref(p);
            break;
        }
        /* choose its transport now (shm maps the segment and faults it in behind) */
        kvp_transfer_attach(peers->xfer, p);
    }
    pthread_rwlock_unlock(&peers->lock);
}

/* Find a known peer and take a reference, or NULL. */
kvp_peer_t *kvp_peers_get(kvp_peers_t *peers, uint64_t segment_id)
{
    pthread_rwlock_rdlock(&peers->lock);
    kvp_peer_t *found = kvp_peer_table_find(&peers->table, segment_id);
    if (found != NULL)
        kvp_peer_ref(found);
    pthread_rwlock_unlock(&peers->lock);
    return found;
}
