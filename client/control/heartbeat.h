/*
 * heartbeat.h - the client's liveness heartbeat (heartbeat.c): a thread that
 * beats on the session, learns the segment table, remounts or drains the
 * segment when the master asks.
 */
#ifndef KVP_CLIENT_CONTROL_HEARTBEAT_H
#define KVP_CLIENT_CONTROL_HEARTBEAT_H

#include <stddef.h>
#include <stdint.h>

#include "client/control/drain.h"
#include "common/status.h"

typedef struct kvp_heartbeat kvp_heartbeat_t;

typedef struct kvp_heartbeat_params {
    kvp_drain_params_t drain; /* session, segment (NULL: none), peers, engine (borrowed) */
    uint64_t client_id;
    uint32_t interval_ms;
    uint32_t drain_timeout_ms; /* a drain someone else asked for */
} kvp_heartbeat_params_t;

/* Beat once now (learning every mounted segment before the first put or get), then start
 * the thread. A first beat that fails fails the start with its status. */
kvp_status_t kvp_heartbeat_start(const kvp_heartbeat_params_t *params, kvp_heartbeat_t **hb_p);
/* Let a drain in progress finish, stop and join the thread, free it. NULL: nothing. */
void kvp_heartbeat_stop(kvp_heartbeat_t *hb);

#endif
