/*
 * kvpool_te.h - the transfer engine: Mooncake's point-to-point TransferEngine
 * (prefill -> decode KV transfers) on kvpool's transports (docs/architecture.md,
 * "Transfer engine"; wire: docs/protocol.md, "Transfer engine").
 *
 * An engine serves the memory this process registered (kvp_te_register) on its
 * rpc port, with the data plane of a segment's data server: a peer reads and
 * writes it by virtual address, one-sided. No master: a peer is named
 * "host:port" (Mooncake's P2PHANDSHAKE). A range outside what the target
 * registered is refused by the target (KVP_ERR_OUT_OF_RANGE), before any byte
 * of it moves. Protected mode (KVPOOL_AUTH, default "protected"): only peers
 * of this host running as this process's user or root (KVP_ERR_DENIED otherwise).
 * With credentials (KVPOOL_TLS_CA, KVPOOL_TLS_CERT, KVPOOL_TLS_KEY, all three),
 * instead: peers of any host that prove a certificate of that CA whose CN
 * KVPOOL_TE_PEERS names (unset: any); this engine proves its own to its targets.
 * KVPOOL_TE_ACL (an ACL file, the master's format) then says what each may do: read
 * with role read, write (and notify) with role write, an admin both; others of our own
 * principal's tenant only, without key patterns (docs/security.md, "The transfer
 * engine"). With credentials, only our own principal gets the one-copy shm path.
 *
 * Thread: every call from any thread at once, but destroy (no call in flight).
 */
#ifndef KVPOOL_TE_H
#define KVPOOL_TE_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvp_te kvp_te_t;

/* Transfer directions (Mooncake's TransferOpcode: READ 0, WRITE 1). */
#define KVP_TE_READ 0
#define KVP_TE_WRITE 1

/*
 * Create and start an engine. local_hostname: "host" or "host:port" (port 0 or none: any
 * free port; bound on host, "" or NULL: all addresses). metadata: "P2PHANDSHAKE" (the only
 * one here; anything else is KVP_ERR_UNSUPPORTED). protocol: "tcp", "shm" (peers of this
 * host, over a Unix socket), "rdma" (one-sided RDMA into the peer's registered ranges; no
 * device here: KVP_ERR_TRANSPORT), "auto" or "" (shm for a peer of this host, else rdma
 * where both ends have it, else tcp). Environment: KVPOOL_AUTH (protected|none),
 * KVPOOL_TE_TIMEOUT_MS (a transfer with no progress that long fails, default 10000),
 * KVPOOL_TE_STREAMS (tcp connections per peer and transfer, default 2), KVPOOL_TE_SHM (cma,
 * the default: shm peers copy with process_vm_writev/readv, one kernel copy, falling back to
 * the socket frames where the kernel refuses, under our standing lease where the kernel
 * already lets them at our memory; cma-checked: we check each batch; socket),
 * KVPOOL_TLS_CA/_CERT/_KEY, KVPOOL_TE_PEERS and KVPOOL_TE_ACL (peers authenticate; see above). Some
 * credentials only, a KVPOOL_TE_SHM of neither, or a KVPOOL_TE_ACL without credentials, that does
 * not load or names no principal with our certificate's CN: KVP_ERR_INVALID_ARG.
 */
kvp_status_t kvp_te_create(const char *local_hostname, const char *metadata, const char *protocol,
                           kvp_te_t **te_p);
/* Waits, as an unregister of every range does, for shm peers copying into our memory under
 * a standing lease (a peer stopped in the middle of a copy holds it until it goes on or
 * dies). */
void kvp_te_destroy(kvp_te_t *te);
/* The port peers reach this engine on ("host:port"). */
uint16_t kvp_te_rpc_port(const kvp_te_t *te);

/* Open [addr, addr + len) to peers (read and write): host or CUDA device memory (served
 * through pinned staging, not the one-copy shm path). KVP_ERR_INVALID_ARG: empty, or it
 * overlaps a registered range; KVP_ERR_NOMEM. */
kvp_status_t kvp_te_register(kvp_te_t *te, void *addr, size_t len);
/* Close the range registered at addr (waits for transfers in it: a shm peer copying under
 * a standing lease, however long it takes, even stopped, until it is done or dead); once
 * it returns no byte lands in the range. KVP_ERR_NOT_FOUND. */
kvp_status_t kvp_te_unregister(kvp_te_t *te, void *addr);
/* Batch forms: stop at the first failure (those before it stay registered). */
kvp_status_t kvp_te_register_batch(kvp_te_t *te, void *const *addrs, const size_t *lens, size_t n);
kvp_status_t kvp_te_unregister_batch(kvp_te_t *te, void *const *addrs, size_t n);
/* The first registered range's address (0: none). */
uintptr_t kvp_te_first_buffer(kvp_te_t *te);

/*
 * Move n ranges between this process's memory and target's registered memory:
 * opcode KVP_TE_WRITE: locals[i] -> remotes[i] at target, KVP_TE_READ the other way;
 * lens[i] bytes each. Blocking; KVP_OK when every range moved, else the first failure:
 * KVP_ERR_OUT_OF_RANGE (the target did not register it: nothing of that range moved),
 * KVP_ERR_CONNECT, KVP_ERR_TIMEOUT / KVP_ERR_IO (the target vanished), KVP_ERR_DENIED
 * (protected mode, another host), KVP_ERR_TRANSPORT (shm to a peer of another host).
 * Ranges of one batch are independent: when one fails, others may have moved.
 */
kvp_status_t kvp_te_transfer(kvp_te_t *te, const char *target, int opcode, size_t n,
                             void *const *locals, const uint64_t *remotes, const uint64_t *lens);

/*
 * Mooncake's `_on_cuda` forms (transfer_write_on_cuda, ...): wait until the work issued so
 * far on the caller's CUDA stream (a cudaStream_t / CUstream; 0: the legacy default
 * stream) is done, then kvp_te_transfer. locals may be CUDA device memory (staged through
 * the engine's reused pinned host buffers with the driver's copies) or host memory. Beyond
 * Mooncake, which runs the transfer from a host function on the stream and ends the process
 * when it fails: blocking, its failure returned. KVP_ERR_TRANSPORT: no CUDA driver or
 * device; KVP_ERR_IO: the driver refused the stream or work on it failed.
 */
kvp_status_t kvp_te_transfer_on_cuda(kvp_te_t *te, const char *target, int opcode, size_t n,
                                     void *const *locals, const uint64_t *remotes,
                                     const uint64_t *lens, uintptr_t stream);

/* The same, run on the engine's worker thread: *id_p (> 0) names it for kvp_te_status. A
 * target that is malformed or does not resolve fails here (KVP_ERR_INVALID_ARG,
 * KVP_ERR_CONNECT), as in kvp_te_transfer. */
kvp_status_t kvp_te_submit(kvp_te_t *te, const char *target, int opcode, size_t n,
                           void *const *locals, const uint64_t *remotes, const uint64_t *lens,
                           uint64_t *id_p);
/* A submitted batch: 1 done (its id is then forgotten), 0 running, or its failure (< 0);
 * KVP_ERR_NOT_FOUND: no such batch. wait_ms > 0: wait that long for it to end. */
int kvp_te_status(kvp_te_t *te, uint64_t id, uint32_t wait_ms);

/* The ranges target ("host:port") registered, lowest address first (Mooncake's segment
 * descriptor: get_first_buffer_address): up to cap into addrs/lens, *n_p how many there are
 * (at most 4096 are told). Any peer that may transfer to target may ask. */
kvp_status_t kvp_te_remote_regions(kvp_te_t *te, const char *target, uint64_t *addrs,
                                   uint64_t *lens, size_t cap, size_t *n_p);

/* What this engine did and refused. */
typedef struct kvp_te_counters {
    uint64_t transfers[2]; /* [opcode]: ranges moved as initiator */
    uint64_t bytes[2];
    uint64_t failures;  /* ranges that failed, as initiator */
    uint64_t served[2]; /* [opcode of the peer]: ranges peers moved in our memory */
    uint64_t served_bytes[2];
    uint64_t refused_range;     /* peer ranges outside what we registered */
    uint64_t refused_protected; /* connections of another host (protected mode) */
    uint64_t refused_user;      /* peers of this host of another user (protected mode) */
    uint64_t refused_auth;      /* credentials on: connections that proved no allowed principal */
    uint64_t served_cma[2];     /* of served: moved by the peer with process_vm_* (shm, one copy) */
    uint64_t notifies;          /* notifies peers sent us, queued */
    uint64_t notifies_dropped;  /* ... refused: not admitted, or TE_NOTIFIES_MAX pending */
    /* KVPOOL_TE_ACL: proved principals refused, by reason */
    uint64_t refused_role;   /* a request its roles do not allow (or no rights at all) */
    uint64_t refused_tenant; /* connections of a principal of another tenant */
    /* of served_cma: moved by peers under a standing lease (no round trip a batch) */
    uint64_t served_lease[2];
    uint64_t leases; /* shm peers holding a standing lease now */
} kvp_te_counters_t;
void kvp_te_get_counters(kvp_te_t *te, kvp_te_counters_t *out);

/* Send target a notify (Mooncake's TransferNotify: name, msg; bytes, at most 64 KiB in all)
 * on a connection of its own, after what this thread moved to it: KVP_OK once queued
 * there; KVP_ERR_DENIED (not admitted), KVP_ERR_NO_SPACE (4096 pending there). */
kvp_status_t kvp_te_notify(kvp_te_t *te, const char *target, const char *name, size_t name_len,
                           const char *msg, size_t msg_len);
/* The notifies peers sent, oldest first, each handed to fn and then forgotten; returns how
 * many. */
typedef void (*kvp_te_notify_fn)(void *arg, const char *name, size_t name_len, const char *msg,
                                 size_t msg_len);
size_t kvp_te_get_notifies(kvp_te_t *te, kvp_te_notify_fn fn, void *arg);

/* Per target this engine transferred to (as initiator): its name and counts. */
typedef struct kvp_te_peer_stat {
    char target[256]; /* "host:port" */
    char route[8];    /* "tcp", "shm" (the socket frames), "shm-cma" (one copy) or "rdma" */
    uint64_t transfers, bytes, failures;
} kvp_te_peer_stat_t;
/* Up to cap targets into out; returns how many there are (may exceed cap). */
size_t kvp_te_peer_stats(kvp_te_t *te, kvp_te_peer_stat_t *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
