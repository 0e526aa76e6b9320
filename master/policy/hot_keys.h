/*
 * hot_keys.h - hot-key replica fanout (see hot_keys.c; --hot-key-reads).
 */
#ifndef KVP_MASTER_POLICY_HOT_KEYS_H
#define KVP_MASTER_POLICY_HOT_KEYS_H

#include "master/core/state.h"

/* A read of obj (COMPLETE) was granted: counted, when the fanout is on. Allocates nothing
 * but the key's copy, once, when the key turns hot. */
void kvp_hot_on_read(kvp_master_state_t *st, const kvp_object_t *obj);
/* The timer: at the end of each one-second window, hot keys get a copy task to one more
 * segment, keys that cooled lose the replicas they were given, the rest are forgotten. */
void kvp_hot_tick(kvp_master_state_t *st);

#endif
