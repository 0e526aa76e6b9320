/*
 * transports.h - the data transports of this library (transport/<name>.c, each
 * implementing transfer/transport.h) and their priority list, which whoever
 * creates a transfer engine hands it (kvp_transfer_t.list): the store's
 * client, the point-to-point transfer engine.
 *
 * Thread: any (constants).
 */
#ifndef KVP_CLIENT_TRANSPORT_TRANSPORTS_H
#define KVP_CLIENT_TRANSPORT_TRANSPORTS_H

#include "client/transfer/transport.h"

/* The transports in priority order (NULL-terminated): adding a transport is adding its ops
 * here. */
extern const kvp_transport_ops_t *const kvp_transports[];

extern const kvp_transport_ops_t kvp_transport_shm_ops;
extern const kvp_transport_ops_t kvp_transport_rdma_ops;
extern const kvp_transport_ops_t kvp_transport_tcp_ops;

#endif
