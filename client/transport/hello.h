/*
 * hello.h - a data connection's first steps, shared by the tcp and shm transports: prove
 * our principal to a segment's owner (HELLO, data grants on: common/grant.h) and, on the
 * owner's Unix socket, ask for the segment's memory (MAP): transport/wire.h.
 */
#ifndef KVP_CLIENT_TRANSPORT_HELLO_H
#define KVP_CLIENT_TRANSPORT_HELLO_H

#include <stdint.h>
#include <sys/uio.h>

#include "client/transfer/peer.h"
#include "client/transport/wire.h"
#include "common/status.h"

/* One request of a data connection's own (iov[0..n): the header and what follows it; the
 * entries are used up as they are sent) sent on the blocking fd, and its answer's header
 * read into *r: KVP_OK (status 0; what follows the header is the caller's to read), an I/O
 * failure, KVP_ERR_PROTOCOL (not a data answer), or the answer's status
 * (kvp_status_from_wire: never one the list does not know). */
kvp_status_t kvp_data_ask(int fd, struct iovec *iov, int n, kvp_data_resp_t *r);

/* Prove peer->conn_tag's principal with peer->conn_key on a new blocking connection fd to
 * peer's owner (SO_RCVTIMEO/SO_SNDTIMEO set to timeout_ms). KVP_OK: the proof is sent (the
 * owner does not answer one that passes; one that fails is answered KVP_ERR_DENIED in place
 * of the first request's answer, and the connection closed), or the owner checks no
 * grants. */
kvp_status_t kvp_data_hello_prove(int fd, const kvp_peer_t *peer, uint32_t timeout_ms);

/* Ask the owner of peer (its shm_path "@NAME") for the segment's memory: connect, HELLO
 * when we hold a connection key, MAP with our MAP grant (peer->shm_grant) when we hold
 * one. KVP_OK: *mem_fd_p is the segment's memfd (CLOEXEC), *owner_pid_p the owner's pid
 * (SO_PEERCRED). Refused: KVP_ERR_DENIED; no socket: KVP_ERR_CONNECT. */
kvp_status_t kvp_data_map(const kvp_peer_t *peer, uint32_t timeout_ms, int *mem_fd_p,
                          int *owner_pid_p);

#endif
