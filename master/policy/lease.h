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
 * Who may hand a lease back (its owner): a principal, by its tag, with an ACL (any of its
 * connections may release it); else the connection it was granted on. The top bit tells
 * the two apart. KVP_LEASE_NOBODY: a grant nobody releases (it ends by its TTL).
 */
#define KVP_LEASE_NOBODY 0
#define KVP_LEASE_PRINCIPAL (1ull << 63)
static inline uint64_t kvp_lease_owner_principal(uint64_t tag)
{
    return tag | KVP_LEASE_PRINCIPAL;
}
static inline uint64_t kvp_lease_owner_conn(uint64_t conn_id)
{
    return conn_id & ~KVP_LEASE_PRINCIPAL;
}

/*
 * A read of obj (COMPLETE) by owner starts: one more reader, expiry pushed to now + TTL.
 * Returns the lease id owner releases it with: random bits and the index of owner's grant
 * on obj (one per owner and object; a second read by the same owner gets the same id,
 * counted twice). 0: no id (owner KVP_LEASE_NOBODY, or out of memory: the read then holds
 * the lease until its TTL, or goes unleased when no slot could be had: still CRC-checked).
 */
uint64_t kvp_lease_grant(kvp_master_state_t *st, kvp_object_t *obj, uint64_t owner);

/* What became of a release (kvp_lease_release_by). */
typedef enum kvp_lease_outcome {
    KVP_LEASE_RELEASED,  /* one read of owner's ended (the lease with the last one) */
    KVP_LEASE_UNKNOWN,   /* no grant has this id (ended by its TTL, before a restart, made up) */
    KVP_LEASE_NOT_OWNER, /* the grant is another owner's: nothing done */
} kvp_lease_outcome_t;

/*
 * A read is over: the release of lease_id by owner (a LeaseRelease from the wire). Only
 * the owner the id was granted to ends anything; the two refusals are ignored (counted
 * in the table: refused_owner, refused_unknown).
 */
kvp_lease_outcome_t kvp_lease_release_by(kvp_master_state_t *st, uint64_t lease_id, uint64_t owner);
/* The master's own release of an id it granted (no owner check: never for an id from the
 * wire). Stale or unknown ids are ignored (false). */
bool kvp_lease_release(kvp_master_state_t *st, uint64_t lease_id);
/* owner (a connection) is gone: its grants' ids are forgotten (a release of one is
 * unknown from now on); the reads they counted still hold their leases, which end by
 * their TTL, as a dead reader's. O(grant records), only while a connection owns one. */
void kvp_lease_disown(kvp_master_state_t *st, uint64_t owner);
/*
 * obj (COMPLETE) was read or looked up: its group (meta/group.h) is leased until the TTL
 * from now: one expiry for the group (group->lease_until_ms), which eviction consults for
 * each member, so O(1) whatever the group's size; no member gets a lease slot of its own
 * (a remove or upsert of one not being read is not refused). Soft pins are not extended.
 * Nothing without leases (--lease-ttl-ms 0).
 */
void kvp_lease_group(kvp_master_state_t *st, const kvp_object_t *obj);
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
