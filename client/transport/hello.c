/*
 * hello.c - HELLO and MAP, a client's side (hello.h; the owner's is
 * segment/data_grant.c and segment/data_server.c).
 *
 * Thread: any (state is the caller's connection).
 */
#include "client/transport/hello.h"

#include <unistd.h>

#include "client/transport/wire.h"
#include "common/grant.h"
#include "common/sock.h"

kvp_status_t kvp_data_ask(int fd, struct iovec *iov, int n, kvp_data_resp_t *r)
{
    kvp_status_t st = kvp_sendv_all(fd, iov, n);
    if (st == KVP_OK)
        st = kvp_recv_all(fd, r, sizeof(*r));
    if (st != KVP_OK)
        return st;
    return r->magic != KVP_DATA_MAGIC ? KVP_ERR_PROTOCOL : kvp_status_from_wire(r->status);
}

kvp_status_t kvp_data_hello_prove(int fd, const kvp_peer_t *peer, uint32_t timeout_ms)
{
    kvp_sock_set_timeout(fd, timeout_ms);
    kvp_data_req_t req = {.magic = KVP_DATA_MAGIC,
                          .op = KVP_DATA_HELLO,
                          .segment_id = peer->segment_id,
                          .offset = peer->conn_tag};
    kvp_data_resp_t r;
    uint8_t challenge[KVP_GRANT_CHALLENGE_LEN], proof[KVP_GRANT_PROOF_LEN];
    kvp_status_t st =
        kvp_data_ask(fd, &(struct iovec){.iov_base = &req, .iov_len = sizeof(req)}, 1, &r);
    if (st != KVP_OK)
        return st;
    if (r.length == 0)
        return KVP_OK; /* the owner checks no grants (its mount gave it no key) */
    if (r.length != sizeof(challenge))
        return KVP_ERR_PROTOCOL;
    st = kvp_recv_all(fd, challenge, sizeof(challenge));
    if (st != KVP_OK)
        return st;
    if (!kvp_grant_hello_proof(peer->conn_key, challenge, peer->segment_id, peer->conn_tag, proof))
        return KVP_ERR_INTERNAL;
    /* A proof that passes is not answered: our requests follow it at once (an owner that
     * refuses it answers the first of them KVP_ERR_DENIED and closes). Waiting for a verdict
     * cost a round trip per connection, and on a 2-CPU host it left the owner's connection
     * thread on the other CPU from ours often enough to slow small gets by a quarter for the
     * life of the connection (docs/benchmarks.md, "TLS and the ACL"). */
    return kvp_send_all(fd, proof, sizeof(proof));
}

kvp_status_t kvp_data_map(const kvp_peer_t *peer, uint32_t timeout_ms, int *mem_fd_p,
                          int *owner_pid_p)
{
    if (peer->shm_path[0] != '@')
        return KVP_ERR_INVALID_ARG;
    int fd, mem_fd = -1;
    kvp_status_t st = kvp_unix_connect(peer->shm_path + 1, timeout_ms, &fd);
    if (st != KVP_OK)
        return st;
    /* the owner hands its memory to its own user or root only; we take it from the same:
     * a process of another user that took the name of a dead owner's socket gets no
     * bytes of ours */
    uint32_t uid;
    if (!kvp_unix_peer(fd, owner_pid_p, &uid) || (uid != geteuid() && uid != 0))
        st = KVP_ERR_CONNECT;
    if (st == KVP_OK && peer->has_conn_key)
        st = kvp_data_hello_prove(fd, peer, timeout_ms);
    if (st == KVP_OK) {
        kvp_data_req_t req = {.magic = KVP_DATA_MAGIC,
                              .op = KVP_DATA_MAP,
                              .flags = peer->has_shm_grant ? KVP_DATA_F_GRANT : 0,
                              .segment_id = peer->segment_id,
                              .offset = 0,
                              .length = peer->size};
        struct iovec iov[2] = {{&req, sizeof(req)},
                               {(void *)peer->shm_grant, sizeof(peer->shm_grant)}};
        st = kvp_sendv_all(fd, iov, peer->has_shm_grant ? 2 : 1);
    }
    kvp_data_resp_t r;
    if (st == KVP_OK)
        st = kvp_unix_recv_fd(fd, &r, sizeof(r), &mem_fd);
    if (st == KVP_OK && (r.magic != KVP_DATA_MAGIC || r.status > 0))
        st = KVP_ERR_PROTOCOL;
    else if (st == KVP_OK && r.status != 0)
        st = (kvp_status_t)r.status;
    else if (st == KVP_OK && (mem_fd < 0 || r.length != peer->size))
        st = KVP_ERR_PROTOCOL;
    close(fd);
    if (st != KVP_OK) {
        if (mem_fd >= 0)
            close(mem_fd);
        return st;
    }
    *mem_fd_p = mem_fd;
    return KVP_OK;
}
