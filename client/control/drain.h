/*
 * drain.h - graceful drain of this client's DRAM segment (drain.c): its
 * objects moved to other segments through the transfer engine, then the
 * segment unmounted; and asking the master to have another owner drain.
 */
#ifndef KVP_CLIENT_CONTROL_DRAIN_H
#define KVP_CLIENT_CONTROL_DRAIN_H

#include <stdint.h>

#include "client/control/session.h"
#include "client/segment/segment.h"
#include "client/transfer/engine.h"
#include "client/transfer/peer_table.h"
#include "common/status.h"

/* What a drain works with (all borrowed). */
typedef struct kvp_drain_params {
    kvp_session_t *session;
    kvp_segment_t *seg; /* NULL: nothing to drain (KVP_ERR_INVALID_ARG) */
    kvp_peers_t *peers;
    kvp_transfer_t *xfer;
} kvp_drain_params_t;

/* Drain the segment within timeout_ms: *moved_p objects moved, *lost_p left the pool (both
 * 0 on error; may be NULL). KVP_ERR_PENDING: a drain is under way; KVP_ERR_INVALID_ARG: no
 * segment mounted. Thread: the caller's (blocking). */
kvp_status_t kvp_drain_run(const kvp_drain_params_t *p, uint32_t timeout_ms, uint64_t *moved_p,
                           uint64_t *lost_p);
/* Ask the master to have segment_name's owner drain it (at its next heartbeat). */
kvp_status_t kvp_drain_request(kvp_session_t *s, const char *segment_name);

#endif
