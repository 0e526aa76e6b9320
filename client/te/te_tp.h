/*
 * te_tp.h - what the transfer engine's own transports (te_shm.c) take from the
 * engine (te.c): kvp_transfer_t.own_cfg, read at their create; it outlives the transfer
 * engine.
 */
#ifndef KVP_CLIENT_TE_TE_TP_H
#define KVP_CLIENT_TE_TE_TP_H

#include <stdbool.h>
#include <stdint.h>

#include "client/transfer/peer.h"
#include "common/status.h"

typedef struct kvp_te_tp_cfg {
    /* a connection of the engine's own to the peer's endpoint, its timeouts set and our
     * principal proved (te.c); *pid_p the peer's pid on a Unix socket */
    kvp_status_t (*dial)(void *arg, const kvp_peer_t *peer, int *fd_p, int *pid_p);
    void *dial_arg;
    bool lease;            /* shm: ask targets for a standing lease (KVPOOL_TE_SHM=cma) */
    uint32_t copy_threads; /* shm: KVPOOL_TE_COPY_THREADS */
} kvp_te_tp_cfg_t;

#endif
