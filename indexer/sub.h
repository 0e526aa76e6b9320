/*
 * sub.h - the subscriber thread of kvpool-indexer: one ZeroMQ SUB socket per publisher
 * endpoint the registrations name, batches applied in sequence order, gaps healed by
 * replays asked asynchronously, at most a few per tenant at once (sub.c).
 *
 * Thread: kvp_sub_start/stop from the main thread; kvp_sub_wake from any thread (after a
 * registration changed).
 */
#ifndef KVP_INDEXER_SUB_H
#define KVP_INDEXER_SUB_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "indexer/index.h"

typedef struct kvp_sub kvp_sub_t;

typedef struct kvp_sub_params {
    kvp_idx_t *idx;
    uint32_t replay_timeout_ms; /* a replay that has not ended by then: the gap stays */
    uint64_t max_message;       /* bytes of one ZeroMQ message at most */
    /* the indexer's CURVE key pair (Z85), for publishers registered with a server key;
     * "" when --curve-secret is not given */
    char curve_secret[KVP_IDX_CURVE_KEY_LEN + 1], curve_public[KVP_IDX_CURVE_KEY_LEN + 1];
} kvp_sub_params_t;

kvp_status_t kvp_sub_start(const kvp_sub_params_t *p, kvp_sub_t **sub_p);
void kvp_sub_wake(kvp_sub_t *sub);
/* Wake the subscriber thread and wait (at most timeout_ms) until it has made its sockets
 * match the index as it is now (kvp_idx_sub_failed then says which could not be made):
 * false on timeout (it never waits on a replay: this is milliseconds unless it is swamped).
 * Any thread but the subscriber's. */
bool kvp_sub_sync(kvp_sub_t *sub, uint32_t timeout_ms);
void kvp_sub_stop(kvp_sub_t *sub);

#endif
