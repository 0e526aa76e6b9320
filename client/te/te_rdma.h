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

#include "client/transfer/transport.h"
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

/*
 * Initiator: the rdma transport of the engine's transfer engine (transfer/transport.h; its
 * device the one kvp_te_tp_cfg_t.rdma names, its connections to a target through the
 * config's dial). It takes peers of other hosts; per peer one RC queue pair, connected at its
 * first batch with the token a TE_RDMA request got, and the table the target advertised.
 * Every remote range is checked against that table before the NIC moves a byte of it (asked
 * again once on a miss); a range still not in it is handed on to the next transport of the
 * list (op->pass: tcp, where the target says whether it is out of range or device memory it
 * serves staged); a target that offers no rdma fails the ops with KVP_ERR_TRANSPORT (the peer
 * moves to tcp). A local buffer is an engine-registered range or a staging buffer (mem_reg:
 * a local-only region, never advertised); any other is staged by the transfer engine.
 */
extern const kvp_transport_ops_t kvp_te_rdma_ops;

#endif
