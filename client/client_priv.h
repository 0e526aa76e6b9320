/*
 * client_priv.h - the client object (struct kvp_client), seen only by the
 * files that implement the public API at the top of libkvpool: client.c
 * (life), object.c (the batch flows), admin.c, metrics.c, buffers.c.
 *
 * It holds parts, each an object with its own state and lock: the engine
 * and its peers (transfer/), the session with the master (control/), the
 * own segment (segment/), the heartbeat and record threads (control/), the
 * SSD segment (ssd/). Lower folders never see this struct: each is handed
 * the parts it needs.
 */
#ifndef KVP_CLIENT_CLIENT_PRIV_H
#define KVP_CLIENT_CLIENT_PRIV_H

#include <stdbool.h>
#include <stdint.h>

#include "common/tls.h"
#include "client/control/discovery.h"
#include "client/env.h"
#include "client/control/heartbeat.h"
#include "client/control/record_sync.h"
#include "client/control/session.h"
#include "client/include/kvpool.h"
#include "client/segment/segment.h"
#include "client/ssd/ssd_owner.h"
#include "client/transfer/engine.h"
#include "client/transfer/peer_table.h"

struct kvp_client {
    kvp_client_params_t params; /* its defaults filled; borrowed strings cleared */
    kvp_client_env_t env;       /* the environment, read once at create (env.h); its strings
                                 * are used during create only, as params' are */
    char master_host[256];
    uint16_t master_port;
    char data_host[64]; /* params.data_host, or the address that routes to the master */
    uint64_t client_id;
    bool protected_mode; /* our data servers take peers of this host only (params.auth) */
    kvp_tls_t *tls;      /* TLS to the master (params.tls_*, KVPOOL_TLS_*); NULL: plain */
    const char *token;   /* params.token or KVPOOL_TOKEN, during create only (mconn copies) */

    kvp_transfer_t xfer; /* the engine, with the registered buffers */
    kvp_peers_t peers;   /* every segment we know of */
    /* etcd:// master address: the leader is found through etcd (control/discovery.c) */
    kvp_discovery_t *disc;
    kvp_session_t *session;   /* the master connection, shared by all threads */
    kvp_segment_t *seg;       /* our DRAM segment; NULL: none */
    kvp_record_sync_t *rec;   /* keeps seg's record current; NULL without seg */
    kvp_heartbeat_t *hb;      /* liveness, remounts and requested drains */
    kvp_ssd_owner_t *ssd;     /* our SSD segment; NULL: none */
    struct kvp_xsessions *xs; /* the transfer sessions open (xfer_sessions.c) */
    struct kvp_holds *holds;  /* room the master placed ahead of our puts (put_holds.c) */
    kvp_ssd_owner_t *dfs;     /* our DFS segment (a shard file in the DFS directory); NULL */
};

/* What a drain of this client's segment works with. */
static inline kvp_drain_params_t kvp_client_drain_params(kvp_client_t *c)
{
    return (kvp_drain_params_t){
        .session = c->session, .seg = c->seg, .peers = &c->peers, .xfer = &c->xfer};
}

#endif
