/*
 * record_sync.h - segments describe themselves, the owner's side: offering a
 * record back after a mount, and keeping a DRAM segment's record current
 * (see record_sync.c).
 */
#ifndef KVP_CLIENT_CONTROL_RECORD_SYNC_H
#define KVP_CLIENT_CONTROL_RECORD_SYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/control/mconn.h"
#include "client/control/session.h"
#include "client/segment/segment.h"
#include "client/segment/seg_record.h"
#include "common/status.h"

/* Entries offered per Adopt call. */
#define KVP_RECORD_OFFER_BATCH 1024u

/* Called for each entry the master refused: the owner forgets it. */
typedef void (*kvp_record_refused_cb_t)(void *arg, const kvp_record_entry_t *e);

/*
 * Offer e[0..n) (newest first) for segment seg_id, mounted with `adopting`, in
 * batches; the last call (sent even when n is 0) ends the offer and opens the segment
 * to new replicas. ch: inside on_ready, on that connection (kvp_mconn_ready_call);
 * NULL: kvp_mconn_call. *adopted_p / *refused_p: the counts (may be NULL).
 */
kvp_status_t kvp_record_offer(kvp_mconn_t *m, kvp_chan_t *ch, uint64_t seg_id,
                              const kvp_record_entry_t *e, size_t n,
                              kvp_record_refused_cb_t refused, void *arg, size_t *adopted_p,
                              size_t *refused_p);

/* The record thread of a DRAM segment (SegRecord long polls on a connection of its own): it
 * keeps the segment's record current and offers it after each (re)mount. */
typedef struct kvp_record_sync kvp_record_sync_t;

typedef struct kvp_record_sync_params {
    kvp_segment_t *seg;     /* its record, id, state and offer flags (borrowed) */
    kvp_session_t *session; /* the master it is mounted at (borrowed) */
    uint64_t client_id;
    uint32_t timeout_ms;
} kvp_record_sync_params_t;

/* Start the thread. */
kvp_status_t kvp_record_sync_start(const kvp_record_sync_params_t *params,
                                   kvp_record_sync_t **rs_p);
/* Wait until the segment's first offer ended (the segment takes new replicas). */
kvp_status_t kvp_record_sync_wait_open(kvp_record_sync_t *rs);
/* Stop it, join and free it. NULL: nothing. */
void kvp_record_sync_stop(kvp_record_sync_t *rs);

#endif
