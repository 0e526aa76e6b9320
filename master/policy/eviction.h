/*
 * eviction.h - making room in a full pool, and the put timeout (see
 * eviction.c).
 */
#ifndef KVP_MASTER_POLICY_EVICTION_H
#define KVP_MASTER_POLICY_EVICTION_H

#include <stdint.h>

#include "master/core/state.h"

/*
 * Evict COMPLETE objects in the policy's order, skipping leased ones, hard
 * pins, objects on draining segments and (first pass) soft pins, until used
 * bytes are at most `target`. Returns the bytes freed.
 */
uint64_t kvp_evict_to(kvp_master_state_t *st, uint64_t target);
/* Evict down to the low watermark if usage is above the high one (and go on with the
 * groups below). */
void kvp_evict_if_needed(kvp_master_state_t *st);
/* The members of victims' groups too many for one call (st->n_group_evictions > 0): a
 * loop turn's share of them go (the server calls it each turn while there are any). */
void kvp_evict_groups_continue(kvp_master_state_t *st);
/* Revoke PENDING puts past their deadline. Returns how many. */
unsigned kvp_expire_puts(kvp_master_state_t *st);

#endif
