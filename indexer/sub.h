/*
 * sub.h - the subscriber thread of kvpool-indexer: one ZeroMQ SUB socket per publisher
 * endpoint the registrations name, batches applied in sequence order, gaps healed by
 * replay (sub.c).
 *
 * Thread: kvp_sub_start/stop from the main thread; kvp_sub_wake from any thread (after a
 * registration changed).
 */
#ifndef KVP_INDEXER_SUB_H
#define KVP_INDEXER_SUB_H

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
void kvp_sub_stop(kvp_sub_t *sub);

#endif
