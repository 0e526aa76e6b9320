/*
 * te_rdma.h - the transfer engine's rdma route (client/te/te.c, kvpool_te.h): one-sided RDMA
 * WRITE / READ between an initiator's registered memory and the ranges a target registered,
 * on the verbs layer of the store's rdma transport (client/transport/rdma_verbs.h).
 *
 * A target that has a device registers each range it registers as a memory region (remote
 * READ and WRITE: that range, nothing around it) and listens with rdma_cm. A peer gets the
 * regions' rkeys and a one-time connect token only over the engine's tcp connection, by a
 * TE_RDMA request (wire.h) that the target answers after the peer passed the same admission
 * as a tcp transfer (protected mode's host and user, or a proved certificate); the token is
 * the only way to a queue pair (the accept refuses any other). The initiator checks every
 * range against the table the target advertised before the NIC moves a byte of it; the
 * NIC checks it again against the target's region (a range the target unregistered since:
 * a remote access error, KVP_ERR_OUT_OF_RANGE).
 *
 * Thread: any; a peer's batches one at a time; batches to different peers at once (a
 * completion thread hands each its completions).
 */
#ifndef KVP_CLIENT_TE_TE_RDMA_H
#define KVP_CLIENT_TE_TE_RDMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct te_rdma te_rdma_t;
typedef struct te_rdma_peer te_rdma_peer_t;

/* Does this host have an RDMA device at all (cheap: sysfs)? */
bool te_rdma_present(void);
/* Called by the accept thread at each turn, at least every 200 ms (te.c: a changed
 * KVPOOL_TE_ACL is looked for even when no tcp request comes). */
typedef void (*te_rdma_tick_fn)(void *arg);
/* Open the device (devices: names to try, NULL: any; host: the IPv4 address to serve on,
 * NULL: the device's own; KVPOOL_RDMA_DEVICE and _HOST, read by te.c), listen, start the
 * accept thread (tick: NULL, or called by it). */
kvp_status_t te_rdma_open(uint32_t timeout_ms, const char *devices, const char *host,
                          te_rdma_tick_fn tick, void *tick_arg, te_rdma_t **r_p);
void te_rdma_close(te_rdma_t *r);
/* An engine's (te.c), NULL: it has no rdma. */
struct kvp_te;
te_rdma_t *kvp_te_rdma(struct kvp_te *te);
/* "rxe0 169.254.77.1:port", for logs. */
const char *te_rdma_where(const te_rdma_t *r);

/* Register / deregister a range the engine registered (target and initiator alike: a local
 * buffer of an rdma transfer must be inside one). */
kvp_status_t te_rdma_reg(te_rdma_t *r, void *addr, size_t len);
void te_rdma_dereg(te_rdma_t *r, void *addr);

/* Target: answer a TE_RDMA request on fd (its peer admitted). false: close the connection. */
bool te_rdma_serve(te_rdma_t *r, int fd);
/* Remote access errors peers caused on our queue pairs (the NIC refused an address, rkey or
 * permission), and rdma connects refused (no valid token). */
uint64_t te_rdma_access_errors(te_rdma_t *r);
uint64_t te_rdma_refused_connects(te_rdma_t *r);
/* Target: every accepted queue pair to the error state (the NIC takes nothing more through
 * it; reaped by the accept thread) and every outstanding token void: the peers connect again
 * through a new TE_RDMA, admitted and checked anew. */
void te_rdma_cut_peers(te_rdma_t *r);

/* Initiator: a target's state (queue pair, the table it advertised). */
te_rdma_peer_t *te_rdma_peer_new(void);
void te_rdma_peer_free(te_rdma_peer_t *p);
/* Its queue pair dropped (after the batch on it, if any): the next batch connects anew, its
 * target proved again (te.c: our KVPOOL_TE_ACL changed). */
void te_rdma_peer_reset(te_rdma_peer_t *p);
/* false once the target said it offers no rdma. */
bool te_rdma_peer_offers(const te_rdma_peer_t *p);

/* Opens a connection to the target, admitted there (te.c's te_connect): *fd_p. */
typedef kvp_status_t (*te_rdma_dial_fn)(void *arg, int *fd_p);

/*
 * Move ranges [0, n) (opcode KVP_TE_WRITE / KVP_TE_READ) over rdma. Ranges outside what the
 * target advertised are KVP_ERR_OUT_OF_RANGE without a byte moved (the table is asked again
 * once first). KVP_ERR_UNSUPPORTED before anything moved: a local buffer this engine did not
 * register, or a target that offers no rdma (the caller may take another route).
 * *moved_p, *bytes_p: ranges (and their bytes) that moved. Returns the first failure.
 */
kvp_status_t te_rdma_transfer(te_rdma_t *r, te_rdma_peer_t *p, te_rdma_dial_fn dial, void *arg,
                              int opcode, size_t n, void *const *locals, const uint64_t *remotes,
                              const uint64_t *lens, size_t *moved_p, uint64_t *bytes_p);

#endif
