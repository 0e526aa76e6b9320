/*
 * te_rdma.h - the transfer engine's rdma, as its tests see it. The engine's rdma is the store's
 * rdma transport (client/transport/rdma.c): its registered ranges served there as regions
 * of their own, its peers of other hosts reached there with the keys they offer
 * (client/transport/rdma_regions.h).
 */
#ifndef KVP_CLIENT_TE_TE_RDMA_H
#define KVP_CLIENT_TE_TE_RDMA_H

struct kvp_te;

/* "rxe0 169.254.77.1:port": where the engine takes rdma connections; NULL: it serves no rdma. */
const char *kvp_te_rdma_where(struct kvp_te *te);

#endif
