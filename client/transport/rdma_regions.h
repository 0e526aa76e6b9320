/*
 * rdma_regions.h - the rdma transport (rdma.c) for a transfer engine (client/te/te.c): the
 * ranges an engine registers served as memory regions of their own, and other engines'
 * reached as "keyed" peers, on the one rdma implementation the store's segments use.
 *
 * Target (rdma_regions.c): every range the engine registers is a memory region of its own
 * (remote READ+WRITE over that range only: its rkey opens nothing else), on the transport's
 * device and protection domain, so the same region is the local side of the engine's own
 * batches. The table of (addr, len, rkey) goes to admitted peers only (TE_RDMA over the
 * engine's tcp connection, wire.h; kvp_rdma_regions_answer) with a one-time token; the
 * transport's accept thread lets a queue pair in only for a token handed out in the last
 * KVP_DATA_TE_RDMA_TOKEN_MS (at most 256 outstanding, 1024 queue pairs), once. Removing a
 * range deregisters its region: the NIC refuses any later access to it.
 *
 * Initiator (rdma.c): a peer with a tcp endpoint of an engine (kvp_transfer_t.rdma_offer set)
 * is keyed: its queue pairs connect with the token of an offer (kvp_rdma_offer_fn: the
 * engine dials the peer, proves itself, sends TE_RDMA: kvp_rdma_regions_ask), and every range
 * of a batch is checked against the offered table before the NIC moves a byte of it (asked
 * again once on a miss; a range still not in it is handed on to the next transport,
 * op->pass). A peer that offers no rdma (KVP_ERR_UNSUPPORTED) fails its ops with
 * KVP_ERR_TRANSPORT: the transfer engine moves it to tcp.
 *
 * Thread: any; the accept thread (the transport's) calls the gate and the tick.
 */
#ifndef KVP_CLIENT_TRANSPORT_RDMA_REGIONS_H
#define KVP_CLIENT_TRANSPORT_RDMA_REGIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/transfer/engine.h"
#include "client/transport/wire.h"
#include "common/status.h"

/* What an engine hands a peer for its queue pairs: where to connect, a one-time token, and
 * the table of its regions (sorted, disjoint; malloc'd: the taker frees it). */
typedef struct kvp_rdma_offer {
    char ipv4[16];
    uint16_t port;
    uint8_t token[16];
    kvp_data_te_rdma_region_t *tab;
    size_t n;
} kvp_rdma_offer_t;

/* A keyed queue pair's connect data (rdma_cm private data): the token of an offer. */
typedef struct kvp_rdma_token_pdata {
    uint32_t magic, version;
    uint8_t token[16];
} kvp_rdma_token_pdata_t;
#define KVP_RDMA_TOKEN_MAGIC 0x5450564Bu /* "KVPT" */
#define KVP_RDMA_TOKEN_VERSION 1u

/* Does this host have an RDMA device at all (cheap: sysfs)? */
bool kvp_rdma_present(void);

typedef struct kvp_rdma_regions kvp_rdma_regions_t;

/* Serve the engine's ranges on xfer's rdma transport: listen (kvp_transfer_t.rdma_host, else
 * the device's address) and take queue pairs for tokens only. tick: called by the accept
 * thread at each turn (at least every 200 ms), NULL: none. KVP_ERR_NOT_FOUND: xfer has no
 * rdma transport. *rr_p lives as long as the transport (kvp_transfer_cleanup frees it). */
kvp_status_t kvp_rdma_regions_serve(kvp_transfer_t *xfer, void (*tick)(void *), void *tick_arg,
                                    kvp_rdma_regions_t **rr_p);
/* "rxe0 169.254.77.1:port", for logs. */
const char *kvp_rdma_regions_where(const kvp_rdma_regions_t *rr);
/* A range the engine registers: a region of its own (KVP_ERR_NOMEM, KVP_ERR_TRANSPORT). */
kvp_status_t kvp_rdma_regions_add(kvp_rdma_regions_t *rr, void *addr, size_t len);
/* ... and unregisters: the NIC refuses it from now on. */
void kvp_rdma_regions_remove(kvp_rdma_regions_t *rr, void *addr);
/* Answer a TE_RDMA request on fd (its peer admitted): a token and the table. false: close the
 * connection. */
bool kvp_rdma_regions_answer(kvp_rdma_regions_t *rr, int fd);
/* Every accepted queue pair to the error state and every outstanding token void: the peers
 * connect again through a new TE_RDMA, admitted and checked anew. */
void kvp_rdma_regions_cut(kvp_rdma_regions_t *rr);

/* Initiator: send TE_RDMA on fd (an admitted connection to the engine) and read its offer.
 * KVP_ERR_UNSUPPORTED: it offers us no rdma (none there, an older engine, or keys our
 * principal may not hold). */
kvp_status_t kvp_rdma_regions_ask(int fd, kvp_rdma_offer_t *offer);

#endif
