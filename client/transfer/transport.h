/*
 * transport.h - the one interface every data transport implements, and the
 * priority list the engine (transfer/engine.c) walks.
 *
 * A transport is one file (transport/<name>.c) exporting one
 * kvp_transport_ops_t; adding a transport is adding that file and one line in
 * kvp_transports[] (transport/transports.c), the list the engine's creator
 * hands it (kvp_transfer_t.list). The engine never names a transport: it creates
 * the ones in the list (only the forced one when a transport is forced), asks
 * each in priority order whether it can reach a peer (attach), keeps the first
 * that says yes on the peer (peer->tp, its state in peer->tp_state[index]),
 * and hands it batches of ops to that peer (submit). A transport that fails an
 * op with KVP_ERR_TRANSPORT ("I cannot carry this peer any more") makes the
 * engine choose again for that peer, from the next transport in the list.
 *
 * Thread: create/destroy on the thread creating/destroying the client; attach
 * under the peer's tp_lock (once per transport and peer), detach when the
 * peer's last reference goes; mem_reg/mem_dereg under the registry's lock;
 * submit from any client thread at once (it must be reentrant).
 */
#ifndef KVP_CLIENT_TRANSFER_TRANSPORT_H
#define KVP_CLIENT_TRANSFER_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/mem/registry.h"
#include "common/status.h"

struct kvp_transfer;
struct kvp_peer;
struct kvp_xfer_op;

/* Most transports one engine holds (tp_state slots on each peer, bits of tp_regs). */
#define KVP_TP_MAX 8

/* What serving our own segment puts in its descriptor (filled by serve). */
typedef struct kvp_serve_desc {
    char rdma_endpoint[72]; /* rdma_cm ipv4:port */
    uint64_t rdma_addr;
    uint32_t rdma_rkey;
    bool rdma_windows; /* peers reach it only through memory windows (KVPOOL_RDMA_WINDOWS) */
} kvp_serve_desc_t;

typedef struct kvp_transport_ops {
    const char *name;
    int id; /* the kvp_transport_id_t that forces this transport */
    /* Create the transport's context. `index` is its place in the engine's
     * list: its per-peer state is peer->tp_state[index]. Any error leaves it
     * out of the list (auto; KVP_ERR_NOT_FOUND: nothing of it on this host,
     * said at info level, others at warning level) or fails kvp_transfer_init (forced); xfer->why
     * may say why. */
    kvp_status_t (*create)(struct kvp_transfer *xfer, unsigned index, void **ctx_p);
    void (*destroy)(void *ctx);
    /* Can this transport reach the peer? KVP_OK: yes, *state_p is its per-peer
     * state (may be NULL); anything else (KVP_ERR_TRANSPORT): no, the engine
     * asks the next one.
     * Called at most once per peer and transport. */
    kvp_status_t (*attach)(void *ctx, struct kvp_peer *peer, void **state_p);
    /* The peer's last reference is gone: undo attach. */
    void (*detach)(void *ctx, struct kvp_peer *peer, void *state);
    /* Optional: is the peer's owner known to be gone (the engine drops it)? */
    bool (*stale)(void *ctx, const struct kvp_peer *peer, const void *state);
    /* Optional (NULL: the transport reaches any host memory and no device
     * memory directly). Register a local buffer once so that ops on it are
     * zero-copy; an error means its ops through this transport are staged. */
    kvp_status_t (*mem_reg)(void *ctx, void *addr, size_t len, kvp_mem_kind_t kind);
    void (*mem_dereg)(void *ctx, void *addr);
    /* Optional: serve [base, base+size) (our own segment) to remote peers;
     * fills this transport's fields of the descriptor. */
    kvp_status_t (*serve)(void *ctx, void *base, uint64_t size, kvp_serve_desc_t *desc);
    /* Optional (rdma serving through memory windows): on our queue pair qp_num, connected
     * by principal tag, bind a window per extent [offs[i], offs[i] + lens[i]) of our segment
     * with remote WRITE (write) or READ, good until expiry_ms at the latest; each one's rkey
     * and slot into rkeys[i] and slots[i]. n_bind 0 and n_unbind > 0: invalidate the windows
     * rkeys/slots name instead. rkeys NULL: a write at the n_bind extents was let in for
     * principal tag: every bound window (any QP) that overlaps one is invalidated but tag's
     * own write windows (qp_num, write and expiry_ms unused). KVP_ERR_DENIED: not that
     * principal's QP; KVP_ERR_NOT_FOUND: no such QP. Thread: any (the data servers'
     * connection threads). */
    kvp_status_t (*windows)(void *ctx, uint32_t qp_num, uint64_t tag, const uint64_t *offs,
                            const uint64_t *lens, size_t n_bind, bool write, uint64_t expiry_ms,
                            uint32_t *rkeys, uint32_t *slots, size_t n_unbind);
    /*
     * Blocking: move every op (all to peers attached to this transport, their
     * local buffers reachable by it) and give each its status and, when
     * want_crc, the CRC32C of the bytes moved in op->crc. The array is
     * borrowed for the call.
     */
    void (*submit)(void *ctx, struct kvp_xfer_op **ops, size_t n);
} kvp_transport_ops_t;

/* One created transport in the engine's list. */
typedef struct kvp_transport {
    const kvp_transport_ops_t *ops;
    void *ctx;
    unsigned index; /* in xfer->tps[] */
} kvp_transport_t;

/* Tests only: a list every engine created from now on uses instead of its own
 * (kvp_transfer_t.list); set before creating a client, never while one exists. Not
 * exported by the shared library. */
extern const kvp_transport_ops_t *const *kvp_transports_test;

#endif
