/*
 * lists.h - the eviction policy's hooks (see lists.c).
 */
#ifndef KVP_MASTER_POLICY_LISTS_H
#define KVP_MASTER_POLICY_LISTS_H

#include <stdbool.h>
#include <stdint.h>

#include "master/core/state.h"

/* The bias's step per ghost hit (policy clock ticks) and its bound (x objects listed):
 * chosen by simulation (docs/benchmarks.md, "Eviction"), the same for every workload. */
#define KVP_POLICY_BIAS_STEP 4
#define KVP_POLICY_BIAS_LIMIT 4
/* The deepest block of a batch goes first only while at least 1 in KVP_POLICY_RETURN_RATIO of
 * the recent puts is a victim coming back (chosen by simulation, the same for every workload;
 * the ghost's false positives alone are about 1 in 40-80). */
#define KVP_POLICY_RETURN_RATIO 20
#define KVP_POLICY_WINDOW_MIN 1024

/*
 * kvp_policy_put: obj just became COMPLETE (PutEnd); `deepest`: it was the
 * last key of a batch of several (batches are handled last key first, so a
 * chain's first block ends up the newest). kvp_policy_read_start: a read
 * lease on obj begins (the object leaves the lists eviction walks);
 * kvp_policy_read_end: it ended (obj back, as the most recently read).
 * kvp_policy_read: a read with no lease (--lease-ttl 0).
 */
void kvp_policy_put(kvp_master_state_t *st, kvp_object_t *obj, bool deepest);
void kvp_policy_read_start(kvp_master_state_t *st, kvp_object_t *obj);
void kvp_policy_read_end(kvp_master_state_t *st, kvp_object_t *obj);
void kvp_policy_read(kvp_master_state_t *st, kvp_object_t *obj);
/* A victim left DRAM for good (the ghost remembers it): counts towards the gate's window. */
void kvp_policy_victim(kvp_master_state_t *st);

/* The list a COMPLETE object not being read belongs on now (pins, tier, offload). */
unsigned kvp_policy_home(const kvp_master_state_t *st, const kvp_object_t *obj);

/* Move obj to policy list `list` (KVP_POLICY_*): its new end, or its evict end. */
void kvp_policy_move(kvp_master_state_t *st, kvp_object_t *obj, unsigned list, bool evict_end);

/* Is obj soft-pinned and its pin not expired? */
static inline bool kvp_policy_soft_pin_live(const kvp_master_state_t *st, const kvp_object_t *obj)
{
    return obj->pin == KVP_PIN_SOFT && (uint64_t)obj->soft_pin_until_s * 1000 > st->now_ms;
}

#endif
