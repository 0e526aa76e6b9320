/*
 * data_grant.c - the data servers' grant gate (data_grant.h).
 *
 * Thread: the connection's serving thread; the keyring is shared (grant.h).
 */
#include "client/segment/data_grant.h"

#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <openssl/crypto.h>

#include "client/segment/conn_server.h"
#include "common/log.h"
#include "common/sock.h"

struct kvp_data_pending_ent {
    uint64_t offset;
    uint64_t version; /* 0: an empty slot */
    uint64_t noted_ms;
    uint64_t length; /* the put's extent, from offset (0: not known, offset alone) */
};

/* A put's note is swept once it is this old and the table is full: every grant it could
 * refuse has expired by then unless leases or puts are given longer. */
#define PENDING_SWEEP_MS 60000u

void kvp_data_pending_init(kvp_data_pending_t *p)
{
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->lock, NULL);
}

void kvp_data_pending_cleanup(kvp_data_pending_t *p)
{
    free(p->ents);
    p->ents = NULL;
    pthread_mutex_destroy(&p->lock);
}

static uint32_t pending_slot(uint64_t offset, uint32_t cap)
{
    return (uint32_t)((offset * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

static kvp_data_pending_ent_t *pending_find(kvp_data_pending_t *p, uint64_t offset)
{
    if (p->cap == 0)
        return NULL;
    for (uint32_t i = pending_slot(offset, p->cap);; i = (i + 1) & (p->cap - 1)) {
        if (p->ents[i].version == 0)
            return NULL;
        if (p->ents[i].offset == offset)
            return &p->ents[i];
    }
}

/* Linear probing's deletion: the entries after the hole that may move into it, do. */
static void pending_del(kvp_data_pending_t *p, kvp_data_pending_ent_t *e)
{
    uint32_t mask = p->cap - 1, i = (uint32_t)(e - p->ents);
    for (uint32_t j = (i + 1) & mask; p->ents[j].version != 0; j = (j + 1) & mask) {
        uint32_t k = pending_slot(p->ents[j].offset, p->cap);
        if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
            p->ents[i] = p->ents[j];
            i = j;
        }
    }
    p->ents[i].version = 0;
    p->count--;
}

/* Rehash into cap slots, leaving out the notes older than before_ms. false: no memory. */
static bool pending_rehash(kvp_data_pending_t *p, uint32_t cap, uint64_t before_ms)
{
    kvp_data_pending_ent_t *old = p->ents, *ents = calloc(cap, sizeof(*ents));
    if (ents == NULL)
        return false;
    uint32_t old_cap = p->cap;
    p->ents = ents;
    p->cap = cap;
    p->count = 0;
    for (uint32_t i = 0; i < old_cap; i++) {
        if (old[i].version == 0 || old[i].noted_ms < before_ms)
            continue;
        uint32_t j = pending_slot(old[i].offset, cap);
        while (ents[j].version != 0)
            j = (j + 1) & (cap - 1);
        ents[j] = old[i];
        p->count++;
    }
    free(old);
    return true;
}

/* A new grant key: every grant from before is refused anyway. Caller holds lock. */
static void pending_gen_locked(kvp_data_pending_t *p, uint64_t gen)
{
    if (p->gen == gen)
        return;
    if (p->count > 0)
        memset(p->ents, 0, p->cap * sizeof(*p->ents));
    p->count = 0;
    p->gen = gen;
}

/* kvp_data_pending_at's work; caller holds lock, generation taken. */
static uint64_t pending_at_locked(kvp_data_pending_t *p, uint64_t offset, uint64_t length,
                                  uint64_t rec, uint64_t note, uint64_t now)
{
    uint64_t pend = 0;
    kvp_data_pending_ent_t *e = pending_find(p, offset);
    if (e != NULL && e->version <= rec) {
        pending_del(p, e);
        e = NULL;
    } else if (e != NULL)
        pend = e->version;
    if (note != 0 && note >= pend && e != NULL) {
        e->version = note;
        e->noted_ms = now;
        e->length = length;
    } else if (note != 0 && e == NULL) {
        bool room = (uint64_t)(p->count + 1) * 4 <= (uint64_t)p->cap * 3;
        if (!room && p->cap < KVP_DATA_PENDING_MAX)
            room = pending_rehash(p, p->cap ? p->cap * 2 : 1024, 0);
        else if (!room && now > PENDING_SWEEP_MS && now - p->swept_ms >= 1000) {
            p->swept_ms = now; /* a full table is swept once a second at most */
            room = pending_rehash(p, p->cap, now - PENDING_SWEEP_MS) &&
                   (uint64_t)(p->count + 1) * 4 <= (uint64_t)p->cap * 3;
        }
        if (room) {
            uint32_t j = pending_slot(offset, p->cap);
            while (p->ents[j].version != 0)
                j = (j + 1) & (p->cap - 1);
            p->ents[j] = (kvp_data_pending_ent_t){offset, note, now, length};
            p->count++;
        } else {
            atomic_fetch_add_explicit(&p->dropped, 1, memory_order_relaxed);
            KVP_LOG_WARN_LIMITED("data server: %u puts begun and not recorded in the last "
                                 "minute; a write let in without a note (an older grant of "
                                 "its extent is refused only from its put's end)",
                                 p->count);
        }
    }
    return pend;
}

uint64_t kvp_data_pending_at(kvp_data_pending_t *p, uint64_t gen, uint64_t offset, uint64_t rec,
                             uint64_t note, uint64_t now)
{
    pthread_mutex_lock(&p->lock);
    pending_gen_locked(p, gen);
    uint64_t pend = pending_at_locked(p, offset, 0, rec, note, now);
    pthread_mutex_unlock(&p->lock);
    return pend;
}

size_t kvp_data_pending_check(kvp_data_pending_t *p, uint64_t gen, const uint64_t *offsets,
                              const uint64_t *lengths, const uint64_t *versions,
                              const uint64_t *recs, size_t n, bool write, uint64_t now)
{
    pthread_mutex_lock(&p->lock);
    pending_gen_locked(p, gen);
    size_t i = 0;
    for (; i < n; i++)
        if (pending_at_locked(p, offsets[i], lengths != NULL ? lengths[i] : 0, recs[i],
                              write ? versions[i] : 0, now) > versions[i])
            break;
    pthread_mutex_unlock(&p->lock);
    return i;
}

bool kvp_data_pending_later(kvp_data_pending_t *p, uint64_t offset, uint64_t length,
                            uint64_t version)
{
    bool later = false;
    pthread_mutex_lock(&p->lock);
    for (uint32_t i = 0; i < p->cap && !later; i++) {
        const kvp_data_pending_ent_t *e = &p->ents[i];
        uint64_t len = e->length > 0 ? e->length : 1;
        later = e->version > version && e->offset < offset + length && offset < e->offset + len;
    }
    pthread_mutex_unlock(&p->lock);
    return later;
}

void kvp_data_pending_forget(kvp_data_pending_t *p, uint64_t offset, uint64_t version)
{
    pthread_mutex_lock(&p->lock);
    kvp_data_pending_ent_t *e = pending_find(p, offset);
    if (e != NULL && e->version <= version)
        pending_del(p, e);
    pthread_mutex_unlock(&p->lock);
}

/* A request's n entries whose grants passed (the extents' offsets and object versions),
 * against what the server knows of them (ended; one lock for the record, one for the
 * table of begun puts): NULL, or why it is refused. write: each entry's put is noted. */
static const char *extents_taken(const kvp_data_ended_t *ended, uint64_t gen,
                                 const uint64_t *offsets, const uint64_t *lengths,
                                 const uint64_t *versions, size_t n, bool write, bool wait,
                                 uint64_t now)
{
    uint64_t recs[KVP_DATA_VEC_MAX];
    ended->versions_at(ended->arg, offsets, recs, n);
    /* a read of an object whose end this owner has not recorded yet waits for it (its
     * bytes are checked there: seg_record.c), then looks again (not a recheck: a write
     * window's is one, its object not ended) */
    bool unrecorded = false;
    for (size_t i = 0; i < n && !write && wait && ended->wait_recorded != NULL; i++)
        unrecorded |= recs[i] < versions[i];
    if (unrecorded) {
        if (!ended->wait_recorded(ended->arg, offsets, versions, n))
            return "the object's end is not recorded by this owner (not ended, or its record "
                   "late)";
        ended->versions_at(ended->arg, offsets, recs, n);
    }
    for (size_t i = 0; i < n; i++) {
        if (write && recs[i] >= versions[i])
            return "the put this write grant was for has ended";
        if (!write && recs[i] > versions[i])
            return "a later object than the read grant's is recorded at the extent";
    }
    if (ended->pending != NULL && kvp_data_pending_check(ended->pending, gen, offsets, lengths,
                                                         versions, recs, n, write, now) < n)
        return "a later object's put has written at the grant's extent";
    return NULL;
}

const char *kvp_data_extents_recheck(const kvp_data_ended_t *ended, uint64_t gen,
                                     const kvp_data_checked_t *c)
{
    if (ended == NULL || c->n == 0)
        return NULL;
    return extents_taken(ended, gen, c->offset, NULL, c->version, c->n, false, false,
                         kvp_grant_now_ms());
}

/* A grant set's header h was read: is its count one to read (*why_p: refused)? */
static bool set_take(kvp_grant_verifier_t *v, const kvp_grant_set_hdr_t *h, const char **why_p)
{
    if (h->count == 0 || h->count > KVP_GRANT_SET_MAX) {
        *why_p = "a grant set of no extents or too many";
        return false;
    }
    v->set_ok = false; /* the connection's set is this one from now on, once checked */
    v->set = *h;
    return true;
}

/* A set's h.count extents into v->set_ext, its room grown with what has arrived (doubling
 * from 64), not made from the count the header promises. KVP_ERR_IO: the stream broke, or
 * no memory for the rest (*why_p; the connection closes either way). */
static kvp_status_t set_recv(kvp_grant_verifier_t *v, int fd, uint32_t count, const char **why_p)
{
    uint32_t got = 0;
    while (got < count) {
        if (got == v->set_cap) {
            uint32_t cap = v->set_cap < 64 ? 64 : v->set_cap * 2;
            cap = cap < count ? cap : count;
            kvp_grant_extent_t *e = realloc(v->set_ext, cap * sizeof(*e));
            if (e == NULL) {
                *why_p = "the owner has no memory for the grant set";
                return KVP_ERR_IO;
            }
            v->set_ext = e;
            v->set_cap = cap;
        }
        uint32_t room = v->set_cap - got, k = count - got < room ? count - got : room;
        if (kvp_recv_all(fd, v->set_ext + got, k * sizeof(*v->set_ext)) != KVP_OK)
            return KVP_ERR_IO;
        got += k;
    }
    return KVP_OK;
}

/* What follows the header before the payload (kvp_data_grants_check): the entries (when on
 * the wire) and the grant part whose size the header gives, in one read; a set's extents
 * (set_recv) and the indices after them next. KVP_ERR_IO: the stream broke (*why_p: a set's
 * size refused, nothing more read). */
static kvp_status_t meta_recv(kvp_grant_verifier_t *v, int fd, uint16_t kind, kvp_data_vec_t *vec,
                              bool vec_on_wire, uint64_t n, kvp_grant_t *g, uint32_t *idx,
                              const char **why_p)
{
    struct iovec iov[2];
    int k = 0;
    kvp_grant_set_hdr_t h;
    if (vec_on_wire)
        iov[k++] = (struct iovec){vec, n * sizeof(*vec)};
    if (kind == KVP_DATA_F_GRANT)
        iov[k++] = (struct iovec){g, n * sizeof(*g)};
    else if (kind == KVP_DATA_F_GRANT_SET)
        iov[k++] = (struct iovec){&h, sizeof(h)};
    else if (kind == KVP_DATA_F_GRANT_SAME)
        iov[k++] = (struct iovec){idx, n * sizeof(*idx)};
    if (k > 0 && kvp_recvv_all(fd, iov, k) != KVP_OK)
        return KVP_ERR_IO;
    if (kind != KVP_DATA_F_GRANT_SET)
        return KVP_OK;
    if (!set_take(v, &h, why_p))
        return KVP_OK; /* refused: nothing more is read */
    /* room from an earlier set: its extents and the indices in one read */
    if (h.count <= v->set_cap) {
        struct iovec two[2] = {{v->set_ext, h.count * sizeof(*v->set_ext)},
                               {idx, n * sizeof(*idx)}};
        return kvp_recvv_all(fd, two, 2) == KVP_OK ? KVP_OK : KVP_ERR_IO;
    }
    if (set_recv(v, fd, h.count, why_p) != KVP_OK)
        return KVP_ERR_IO;
    return kvp_recv_all(fd, idx, n * sizeof(*idx)) == KVP_OK ? KVP_OK : KVP_ERR_IO;
}

kvp_status_t kvp_data_grants_check(kvp_grant_keyring_t *kr, kvp_grant_verifier_t *v,
                                   _Atomic uint64_t *refused, const char *server, int fd,
                                   const kvp_data_req_t *req, kvp_data_vec_t *vec, uint64_t n,
                                   bool vec_on_wire, uint64_t segment_id, uint64_t conn_tag,
                                   const kvp_data_ended_t *ended, kvp_data_checked_t *checked)
{
    kvp_grant_t g[KVP_DATA_VEC_MAX];
    uint32_t idx[KVP_DATA_VEC_MAX];
    if (checked != NULL)
        checked->n = 0;
    if (n == 0 || n > KVP_DATA_VEC_MAX)
        return KVP_ERR_IO;
    const char *why = NULL;
    uint16_t kind = req->flags & KVP_DATA_F_GRANTS;
    if (kind != 0 && kind != KVP_DATA_F_GRANT && kind != KVP_DATA_F_GRANT_SET &&
        kind != KVP_DATA_F_GRANT_SAME) {
        why = "a request with more than one kind of grant";
        kind = 0; /* only the entries are read */
    }
    if (meta_recv(v, fd, kind, vec, vec_on_wire, n, g, idx, &why) != KVP_OK)
        return KVP_ERR_IO;
    bool write =
        req->op == KVP_DATA_WRITE || req->op == KVP_DATA_WRITEV || req->op == KVP_DATA_BIND_WRITE;
    uint8_t op = req->op == KVP_DATA_MAP ? KVP_GRANT_MAP : write ? KVP_GRANT_WRITE : KVP_GRANT_READ;
    uint64_t now = kvp_grant_now_ms();
    /* A request for another segment than ours: its grants were sealed for an earlier mount
     * (or none), nothing is served either way; an honest client learns its descriptor is
     * stale, as it does from an owner without grants. */
    for (uint64_t i = 0; i < n && why == NULL; i++)
        if (vec[i].segment_id != segment_id) {
            KVP_LOG_DEBUG("%s: a request for segment %#llx, not ours (%#llx): gone", server,
                          (unsigned long long)vec[i].segment_id, (unsigned long long)segment_id);
            v->set_ok = false;
            return KVP_ERR_SEGMENT_GONE;
        }
    if (why != NULL)
        ; /* refused below */
    else if (!kvp_grant_verifier_sync(v, kr))
        why = "the owner cannot key its grant check (out of memory)";
    else if (!v->on)
        return KVP_OK; /* grants off: any request is served (a grant sent is ignored) */
    else if (kind == 0)
        why = "no grant (this segment's master seals one for every extent it hands out)";
    else if (kind == KVP_DATA_F_GRANT_SET &&
             kvp_grant_set_check(v->mac, &v->set, v->set_ext, op, segment_id, v->epoch, now,
                                 &why) == KVP_OK)
        v->set_ok = v->set.principal == conn_tag; /* named again by GRANT_SAME */
    else if (kind == KVP_DATA_F_GRANT_SAME && !v->set_ok)
        why = "no grant set taken on this connection";
    else if (kind == KVP_DATA_F_GRANT_SAME && v->set.op != op)
        why = op == KVP_GRANT_WRITE ? "a read grant used to write" : "a write grant used to read";
    else if (kind == KVP_DATA_F_GRANT_SAME && now > v->set.expiry_ms + KVP_GRANT_SKEW_MS)
        why = "the grant has expired";
    bool set = kind == KVP_DATA_F_GRANT_SET || kind == KVP_DATA_F_GRANT_SAME;
    if (why == NULL && set && v->set.principal != conn_tag)
        why = conn_tag == 0 ? "the connection has not proven a principal (no HELLO)"
                            : "the grant is another principal's";
    /* the extents (offset, object version) of the entries, checked against the record at
     * the end, all at once */
    uint64_t offs[KVP_DATA_VEC_MAX], lens[KVP_DATA_VEC_MAX], vers[KVP_DATA_VEC_MAX];
    size_t m = 0;
    v->expiry_ms = set ? v->set.expiry_ms : UINT64_MAX;
    for (uint64_t i = 0; i < n && why == NULL; i++) {
        if (set) {
            const kvp_grant_extent_t *e = idx[i] < v->set.count ? &v->set_ext[idx[i]] : NULL;
            if (e == NULL || !kvp_grant_extent_covers(e, vec[i].offset, vec[i].length))
                why = "the request reaches outside the grant's extent";
            else {
                offs[m] = e->offset;
                lens[m] = e->length;
                vers[m++] = e->version;
            }
        } else if (kvp_grant_check(v->mac, &g[i], op, vec[i].segment_id, vec[i].offset,
                                   vec[i].length, v->epoch, now, &why) == KVP_OK &&
                   g[i].principal != conn_tag)
            why = conn_tag == 0 ? "the connection has not proven a principal (no HELLO)"
                                : "the grant is another principal's";
        else if (why == NULL && (write || op == KVP_GRANT_READ)) {
            offs[m] = g[i].offset;
            lens[m] = g[i].length;
            vers[m++] = g[i].nonce;
            if (g[i].expiry_ms < v->expiry_ms)
                v->expiry_ms = g[i].expiry_ms;
        }
    }
    if (why == NULL && ended != NULL && m > 0)
        why = extents_taken(ended, v->gen, offs, lens, vers, m, write, true, now);
    if (why == NULL) {
        if (checked != NULL) {
            memcpy(checked->offset, offs, m * sizeof(*offs));
            memcpy(checked->version, vers, m * sizeof(*vers));
            checked->n = m;
        }
        return KVP_OK;
    }
    v->set_ok = false;
    atomic_fetch_add_explicit(refused, 1, memory_order_relaxed);
    char peer[80];
    kvp_sock_peer_name(fd, peer, sizeof(peer));
    static const char *ops[] = {"?", "read", "write", "map"};
    KVP_LOG_WARN_LIMITED("%s: a %s from %s refused: %s; closing", server, ops[op], peer, why);
    return KVP_ERR_DENIED;
}

kvp_status_t kvp_data_hello(kvp_grant_keyring_t *kr, kvp_grant_verifier_t *v,
                            _Atomic uint64_t *refused, const char *server, int fd,
                            const kvp_data_req_t *req, uint64_t segment_id, uint64_t *conn_tag_p)
{
    const char *why = NULL;
    uint8_t challenge[KVP_GRANT_CHALLENGE_LEN], proof[KVP_GRANT_PROOF_LEN];
    uint8_t want[KVP_GRANT_PROOF_LEN], key[KVP_GRANT_KEY_LEN];
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC};
    if (!kvp_grant_verifier_sync(v, kr)) {
        why = "the owner cannot key its grant check (out of memory)";
        goto refuse;
    }
    if (!v->on) /* no grants here: nothing to prove, the connection goes on */
        return kvp_send_all(fd, &r, sizeof(r));
    if (req->segment_id != segment_id) { /* a descriptor from before a remount */
        kvp_data_reply(fd, KVP_ERR_SEGMENT_GONE, 0);
        return KVP_ERR_SEGMENT_GONE;
    }
    if (req->offset == 0 || req->length != 0) {
        why = "a HELLO with no principal";
        goto refuse;
    }
    if (!kvp_grant_random(challenge, sizeof(challenge))) {
        why = "the owner cannot draw a challenge";
        goto refuse;
    }
    r.length = sizeof(challenge);
    struct iovec iov[2] = {{&r, sizeof(r)}, {challenge, sizeof(challenge)}};
    if (kvp_sendv_all(fd, iov, 2) != KVP_OK || kvp_recv_all(fd, proof, sizeof(proof)) != KVP_OK)
        return KVP_ERR_IO;
    bool ok = kvp_grant_conn_key(v->mac, req->offset, key) &&
              kvp_grant_hello_proof(key, challenge, segment_id, req->offset, want) &&
              CRYPTO_memcmp(want, proof, sizeof(want)) == 0;
    OPENSSL_cleanse(key, sizeof(key));
    if (!ok) {
        why = "its proof does not match the principal it named";
        goto refuse;
    }
    *conn_tag_p = req->offset;
    return KVP_OK; /* no answer: the client's requests follow its proof without waiting */
refuse:
    atomic_fetch_add_explicit(refused, 1, memory_order_relaxed);
    char peer[80];
    kvp_sock_peer_name(fd, peer, sizeof(peer));
    KVP_LOG_WARN_LIMITED("%s: a HELLO from %s refused: %s; closing", server, peer, why);
    kvp_data_reply(fd, KVP_ERR_DENIED, 0);
    return KVP_ERR_DENIED;
}
