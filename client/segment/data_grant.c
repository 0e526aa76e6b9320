/*
 * data_grant.c - the data servers' grant gate (data_grant.h).
 *
 * Thread: the connection's serving thread; the keyring is shared (grant.h).
 */
#include "client/segment/data_grant.h"

#include <stdlib.h>
#include <sys/uio.h>
#include <openssl/crypto.h>

#include "client/segment/conn_server.h"
#include "common/log.h"
#include "common/sock.h"

/* Read a grant set (its header, then its extents, into v's room for them) off fd.
 * KVP_ERR_IO: the stream broke; KVP_ERR_DENIED: *why_p says what was wrong with its size. */
static kvp_status_t set_recv(kvp_grant_verifier_t *v, int fd, const char **why_p)
{
    kvp_grant_set_hdr_t h;
    if (kvp_recv_all(fd, &h, sizeof(h)) != KVP_OK)
        return KVP_ERR_IO;
    if (h.count == 0 || h.count > KVP_GRANT_SET_MAX) {
        *why_p = "a grant set of no extents or too many";
        return KVP_ERR_DENIED;
    }
    if (h.count > v->set_cap) {
        kvp_grant_extent_t *e = realloc(v->set_ext, h.count * sizeof(*e));
        if (e == NULL) {
            *why_p = "the owner has no memory for the grant set";
            return KVP_ERR_DENIED;
        }
        v->set_ext = e;
        v->set_cap = h.count;
    }
    v->set_ok = false; /* the connection's set is this one from now on, once checked */
    v->set = h;
    return kvp_recv_all(fd, v->set_ext, h.count * sizeof(*v->set_ext));
}

kvp_status_t kvp_data_grants_check(kvp_grant_keyring_t *kr, kvp_grant_verifier_t *v,
                                   _Atomic uint64_t *refused, const char *server, int fd,
                                   const kvp_data_req_t *req, const kvp_data_vec_t *vec, uint64_t n,
                                   uint64_t segment_id, uint64_t conn_tag,
                                   const kvp_data_ended_t *ended)
{
    kvp_grant_t g[KVP_DATA_VEC_MAX];
    uint32_t idx[KVP_DATA_VEC_MAX];
    if (n == 0 || n > KVP_DATA_VEC_MAX)
        return KVP_ERR_IO;
    const char *why = NULL;
    uint16_t kind = req->flags & KVP_DATA_F_GRANTS;
    if (kind != 0 && kind != KVP_DATA_F_GRANT && kind != KVP_DATA_F_GRANT_SET &&
        kind != KVP_DATA_F_GRANT_SAME)
        why = "a request with more than one kind of grant";
    else if (kind == KVP_DATA_F_GRANT && kvp_recv_all(fd, g, n * sizeof(g[0])) != KVP_OK)
        return KVP_ERR_IO;
    else if (kind == KVP_DATA_F_GRANT_SET) {
        kvp_status_t st = set_recv(v, fd, &why);
        if (st == KVP_ERR_IO)
            return st;
    }
    if (why == NULL && (kind & (KVP_DATA_F_GRANT_SET | KVP_DATA_F_GRANT_SAME)) &&
        kvp_recv_all(fd, idx, n * sizeof(idx[0])) != KVP_OK)
        return KVP_ERR_IO;
    bool write = req->op == KVP_DATA_WRITE || req->op == KVP_DATA_WRITEV;
    uint8_t op = req->op == KVP_DATA_MAP ? KVP_GRANT_MAP : write ? KVP_GRANT_WRITE : KVP_GRANT_READ;
    uint64_t now = kvp_grant_now_ms();
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
    for (uint64_t i = 0; i < n && why == NULL; i++) {
        if (vec[i].segment_id != segment_id)
            why = "a request for another segment";
        else if (set) {
            const kvp_grant_extent_t *e = idx[i] < v->set.count ? &v->set_ext[idx[i]] : NULL;
            if (e == NULL || !kvp_grant_extent_covers(e, vec[i].offset, vec[i].length))
                why = "the request reaches outside the grant's extent";
            else if (write && ended != NULL &&
                     ended->version_at(ended->arg, e->offset) >= e->version)
                why = "the put this write grant was for has ended";
            else if (!write && ended != NULL &&
                     ended->version_at(ended->arg, e->offset) > e->version)
                why = "a later object than the read grant's is recorded at the extent";
        } else if (kvp_grant_check(v->mac, &g[i], op, vec[i].segment_id, vec[i].offset,
                                   vec[i].length, v->epoch, now, &why) == KVP_OK &&
                   g[i].principal != conn_tag)
            why = conn_tag == 0 ? "the connection has not proven a principal (no HELLO)"
                                : "the grant is another principal's";
        else if (why == NULL && write && ended != NULL &&
                 ended->version_at(ended->arg, g[i].offset) >= g[i].nonce)
            why = "the put this write grant was for has ended";
        else if (why == NULL && op == KVP_GRANT_READ && ended != NULL &&
                 ended->version_at(ended->arg, g[i].offset) > g[i].nonce)
            why = "a later object than the read grant's is recorded at the extent";
    }
    if (why == NULL)
        return KVP_OK;
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
    if (req->segment_id != segment_id || req->offset == 0 || req->length != 0) {
        why = "a HELLO for another segment, or with no principal";
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
    r.length = 0;
    return kvp_send_all(fd, &r, sizeof(r));
refuse:
    atomic_fetch_add_explicit(refused, 1, memory_order_relaxed);
    char peer[80];
    kvp_sock_peer_name(fd, peer, sizeof(peer));
    KVP_LOG_WARN_LIMITED("%s: a HELLO from %s refused: %s; closing", server, peer, why);
    kvp_data_reply(fd, KVP_ERR_DENIED, 0);
    return KVP_ERR_DENIED;
}
