/*
 * rdma_ctx.h - what the rdma transport (rdma.c) lends rdma_regions.c, the transfer engine's
 * serving on it: its device, its listener and accept thread under another gate, and its table
 * of local memory regions. Nothing else uses these.
 */
#ifndef KVP_CLIENT_TRANSPORT_RDMA_CTX_H
#define KVP_CLIENT_TRANSPORT_RDMA_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "client/transfer/engine.h"
#include "client/transport/rdma_verbs.h"
#include "common/status.h"

/* xfer's rdma transport's context, or NULL: it has none. */
void *kvp_rdma_ctx_of(kvp_transfer_t *xfer);
kvp_rdma_dev_t *kvp_rdma_ctx_dev(void *ctx);

/* A connect request's gate (0: accept), called by the accept thread with ext. */
typedef int (*kvp_rdma_gate_fn)(void *ext, const void *pdata, size_t len);

/*
 * Listen on ip (the transport's rdma_host, else the device's address: *ip_out) and take queue
 * pairs through gate instead of a segment's proof (no accept data: there is no segment), at
 * most KVP_RDMA_ACCEPTED_MAX at once; tick(ext) at each turn of the accept thread. ext is
 * the caller's, freed with ext_free once the accept thread stopped (kvp_transfer_cleanup).
 * The transport must serve no segment.
 */
#define KVP_RDMA_ACCEPTED_MAX 1024
kvp_status_t kvp_rdma_ctx_listen(void *ctx, kvp_rdma_gate_fn gate, void (*tick)(void *), void *ext,
                                 void (*ext_free)(void *), char *ip_out, size_t ip_len,
                                 uint16_t *port_p);
/* A region the caller registered on this device (its own remote access): the transport's
 * batches find its lkey, mem_reg of a range inside it takes it as is; the caller deregisters
 * it after kvp_rdma_ctx_mr_unshare. KVP_ERR_EXISTS: it overlaps a registration. */
kvp_status_t kvp_rdma_ctx_mr_share(void *ctx, void *addr, size_t len, kvp_rdma_mr_t *mr);
void kvp_rdma_ctx_mr_unshare(void *ctx, void *addr);
/* Every accepted queue pair not in error to the error state; how many. */
unsigned kvp_rdma_ctx_cut(void *ctx);

#endif
