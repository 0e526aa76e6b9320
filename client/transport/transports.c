/*
 * transports.c - the priority list of this library's transports (transports.h).
 */
#include "client/transport/transports.h"

#include <stddef.h>

const kvp_transport_ops_t *const kvp_transports[] = {
    &kvp_transport_shm_ops,
    &kvp_transport_rdma_ops,
    &kvp_transport_tcp_ops,
    NULL,
};
