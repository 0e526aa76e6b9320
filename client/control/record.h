/*
 * record.h - segments describe themselves, the owner's side: offering a
 * record back after a mount, and keeping a DRAM segment's record current
 * (see record.c).
 */
#ifndef KVP_CLIENT_CONTROL_RECORD_H
#define KVP_CLIENT_CONTROL_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/control/mconn.h"
#include "client/segment/seg_record.h"
#include "common/status.h"

/* Entries offered per Adopt call. */
#define KVP_RECORD_OFFER_BATCH 1024u

/* Called for each entry the master refused: the owner forgets it. */
typedef void (*kvp_record_refused_cb_t)(void *arg, const kvp_record_entry_t *e);

/*
 * Offer e[0..n) (newest first) for segment seg_id, mounted with `adopting`, in
 * batches; the last call (sent even when n is 0) ends the offer and opens the segment
 * to new replicas. fd >= 0: inside on_ready, on that connection (kvp_mconn_ready_call);
 * fd < 0: kvp_mconn_call. *adopted_p / *refused_p: the counts (may be NULL).
 */
kvp_status_t kvp_record_offer(kvp_mconn_t *m, int fd, uint64_t seg_id, const kvp_record_entry_t *e,
                              size_t n, kvp_record_refused_cb_t refused, void *arg,
                              size_t *adopted_p, size_t *refused_p);

struct kvp_client;
/* The DRAM segment was mounted as seg_id with `adopting`: the record thread offers the
 * record (after applying any change still in flight for the previous mount). */
void kvp_client_record_offer_later(struct kvp_client *c, uint64_t seg_id);
/* The thread that keeps the record current (SegRecord long polls). */
kvp_status_t kvp_client_record_start(struct kvp_client *c);
/* Wait until the segment's first offer ended (the segment takes new replicas). */
kvp_status_t kvp_client_record_wait_open(struct kvp_client *c);
/* Ask it to stop (the unmount that follows ends its poll); _stop also joins it. */
void kvp_client_record_signal(struct kvp_client *c);
void kvp_client_record_stop(struct kvp_client *c);

#endif
