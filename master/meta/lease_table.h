/*
 * lease_table.h - the slots of read leases: one per object being read.
 *
 * How many reads are in flight on an object (grants not yet released) and
 * when its lease ends if nobody releases it (the safety net for a reader
 * that dies). A lease id names a slot and its generation, so a release that
 * comes after its lease ended (TTL) never ends a later one. The data
 * structure only; policy/lease.c gives it meaning (grant, release, expiry).
 * Master loop thread only.
 */
#ifndef KVP_MASTER_META_LEASE_TABLE_H
#define KVP_MASTER_META_LEASE_TABLE_H

#include <stdint.h>

#include "master/meta/object.h"

/* "no slot" in the lease lists */
#define KVP_LEASE_NIL UINT32_MAX

typedef struct kvp_lease {
    kvp_object_t *obj;   /* NULL: free slot */
    uint64_t expires_ms; /* TTL after the last grant */
    uint64_t bytes;      /* extent bytes the lease holds (all replicas) */
    uint32_t gen;        /* bumped at every allocation of the slot */
    uint32_t readers;    /* grants not released */
    uint32_t prev, next; /* live slots in expiry order / free list (next); KVP_LEASE_NIL: none */
} kvp_lease_t;

typedef struct kvp_lease_table {
    kvp_lease_t *slots;
    uint32_t n_slots;
    uint32_t free_head;
    uint32_t head, tail; /* live slots, earliest expiry first */
    uint32_t live;
    uint64_t bytes;             /* sum of live slots' bytes */
    uint64_t released, expired; /* leases ended by release / by the TTL */
} kvp_lease_table_t;

void kvp_lease_table_init(kvp_lease_table_t *t);
/* Frees the RETIRED objects leases still hold (their extents go with their allocators). */
void kvp_lease_table_cleanup(kvp_lease_table_t *t);

#endif
