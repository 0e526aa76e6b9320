/*
 * data_grant.c - the data servers' grant gate (data_grant.h).
 *
 * Thread: the connection's serving thread; the keyring is shared (grant.h).
 */
#include "client/segment/data_grant.h"

#include "common/log.h"
#include "common/sock.h"

kvp_status_t kvp_data_grants_check(kvp_grant_keyring_t *kr, kvp_grant_verifier_t *v,
                                   _Atomic uint64_t *refused, const char *server, int fd,
                                   const kvp_data_req_t *req, const kvp_data_vec_t *vec, uint64_t n,
                                   uint64_t segment_id)
{
    kvp_grant_t g[KVP_DATA_VEC_MAX];
    if (n == 0 || n > KVP_DATA_VEC_MAX)
        return KVP_ERR_IO;
    bool carried = (req->flags & KVP_DATA_F_GRANT) != 0;
    if (carried && kvp_recv_all(fd, g, n * sizeof(g[0])) != KVP_OK)
        return KVP_ERR_IO;
    const char *why = NULL;
    if (!kvp_grant_verifier_sync(v, kr))
        why = "the owner cannot key its grant check (out of memory)";
    else if (!v->on)
        return KVP_OK; /* grants off: any request is served (a grant sent is ignored) */
    else if (!carried)
        why = "no grant (this segment's master seals one for every extent it hands out)";
    bool write = req->op == KVP_DATA_WRITE || req->op == KVP_DATA_WRITEV;
    uint8_t op = write ? KVP_GRANT_WRITE : KVP_GRANT_READ;
    uint64_t now = kvp_grant_now_ms();
    for (uint64_t i = 0; i < n && why == NULL; i++) {
        if (vec[i].segment_id != segment_id)
            why = "a request for another segment";
        else
            kvp_grant_check(v->mac, &g[i], op, vec[i].segment_id, vec[i].offset, vec[i].length,
                            v->epoch, now, &why);
    }
    if (why == NULL)
        return KVP_OK;
    atomic_fetch_add_explicit(refused, 1, memory_order_relaxed);
    char peer[80];
    kvp_sock_peer_name(fd, peer, sizeof(peer));
    KVP_LOG_WARN_LIMITED("%s: a %s from %s refused: %s; closing", server, write ? "write" : "read",
                         peer, why);
    return KVP_ERR_DENIED;
}
