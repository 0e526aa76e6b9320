/*
 * rdma_status.h - what the store's rdma transport (rdma.c) and the transfer engine's rdma
 * route (client/te/te_rdma.c) share above the verbs layer: a completion's status as kvpool's,
 * and whether this host has an RDMA device at all.
 *
 * Thread: any.
 */
#ifndef KVP_CLIENT_TRANSPORT_RDMA_STATUS_H
#define KVP_CLIENT_TRANSPORT_RDMA_STATUS_H

#include <dirent.h>
#include <stdbool.h>

#include "client/transport/rdma_verbs.h"
#include "common/status.h"

/* remote access -> KVP_ERR_OUT_OF_RANGE, retry exceeded -> KVP_ERR_CONNECT, else KVP_ERR_IO */
static inline kvp_status_t kvp_rdma_wc_to_status(kvp_rdma_wc_status_t s)
{
    switch (s) {
    case KVP_RDMA_WC_OK:
        return KVP_OK;
    case KVP_RDMA_WC_REMOTE_ACCESS:
        return KVP_ERR_OUT_OF_RANGE;
    case KVP_RDMA_WC_RETRY_EXCEEDED:
        return KVP_ERR_CONNECT;
    default:
        return KVP_ERR_IO;
    }
}

/* Does this host have any RDMA device at all? (Cheap: sysfs; touches no verbs.) */
static inline bool kvp_rdma_devices_present(void)
{
    DIR *d = opendir("/sys/class/infiniband");
    if (d == NULL)
        return false;
    bool any = false;
    struct dirent *e;
    while (!any && (e = readdir(d)) != NULL)
        any = e->d_name[0] != '.';
    closedir(d);
    return any;
}

#endif
