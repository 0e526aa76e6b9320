/*
 * lease.h - read leases that end when the read ends, and the end of an
 * object's life (release, retire), which leases can postpone (see lease.c).
 */
#ifndef KVP_MASTER_POLICY_LEASE_H
#define KVP_MASTER_POLICY_LEASE_H

#include <stdbool.h>
#include <stdint.h>

#include "master/core/state.h"

/*
 * A read of obj (COMPLETE) starts: one more reader, expiry pushed to now +
 * TTL. Returns the lease id to release, 0 when out of memory (the read then
 * goes unleased: still CRC-checked).
 */
uint64_t kvp_lease_grant(kvp_master_state_t *st, kvp_object_t *obj);
/* A read is over. Stale or unknown ids are ignored (false). */
bool kvp_lease_release(kvp_master_state_t *st, uint64_t lease_id);
/* End leases whose TTL passed (readers that died). Returns how many. */
unsigned kvp_lease_expire(kvp_master_state_t *st);
/* obj is going away (evicted, its last segment unmounted, ...): forget its lease, if any. */
void kvp_lease_forget(kvp_master_state_t *st, kvp_object_t *obj);
/* Is a read of obj in flight (a lease granted, not released, its TTL not over)? */
static inline bool kvp_leased(const kvp_master_state_t *st, const kvp_object_t *obj)
{
    return obj->state != KVP_OBJ_PENDING && obj->lease != 0 &&
           st->leases.slots[obj->lease - 1].expires_ms > st->now_ms;
}
/* Milliseconds left on obj's lease (0: none). */
uint64_t kvp_lease_left_ms(const kvp_master_state_t *st, const kvp_object_t *obj);

/* Free every extent of obj and destroy it (obj must be unlinked). */
void kvp_object_release(kvp_master_state_t *st, kvp_object_t *obj);

/*
 * Release an unlinked object now or, while reads of it are in flight, keep
 * its extents (state RETIRED, held by its lease) until the last read ends:
 * a leased extent is never freed or reused.
 */
void kvp_object_retire(kvp_master_state_t *st, kvp_object_t *obj);

/* Unlink a COMPLETE object from the index and retire it. */
void kvp_object_remove(kvp_master_state_t *st, kvp_object_t *obj);

#endif
