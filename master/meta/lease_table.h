/*
 * lease_table.h - the slots of read leases: one per object being read, and
 * the grants of each slot: one per reader (principal or connection) of it.
 *
 * How many reads are in flight on an object (grants not yet released) and
 * when its lease ends if nobody releases it (the safety net for a reader
 * that dies). A lease id names a grant, not a slot: the grant's index and
 * random bits drawn for it (from the kernel's CSPRNG), so an id is neither
 * predictable from another nor valid once its grant ended; the grant keeps
 * who it was given to, and only they may hand it back. The data structure
 * only; policy/lease.c gives it meaning (grant, release, expiry).
 * Master loop thread only.
 */
#ifndef KVP_MASTER_META_LEASE_TABLE_H
#define KVP_MASTER_META_LEASE_TABLE_H

#include <stdint.h>

#include "master/meta/object.h"

/* "no slot" / "no grant" in the lease lists */
#define KVP_LEASE_NIL UINT32_MAX
/* random 32-bit tags drawn at once: one getrandom(2) of 256 bytes (never cut short by a
 * signal) per this many new grants */
#define KVP_LEASE_TAGS 64

typedef struct kvp_lease {
    kvp_object_t *obj;   /* NULL: free slot */
    uint64_t expires_ms; /* TTL after the last grant */
    uint64_t bytes;      /* extent bytes the lease holds (all replicas) */
    uint32_t readers;    /* grants not released (those without an id included) */
    uint32_t prev, next; /* live slots in expiry order / free list (next); KVP_LEASE_NIL: none */
    uint32_t grants;     /* the slot's first grant record; KVP_LEASE_NIL: none */
} kvp_lease_t;

/* One reader's hold on a slot: the reads of one object granted to one owner and not yet
 * released. Its index and tag make the lease id the owner was handed. */
typedef struct kvp_lease_grant {
    uint64_t owner;      /* who may release it (policy/lease.c: a principal or a connection) */
    uint32_t slot;       /* its lease slot; KVP_LEASE_NIL: a free record */
    uint32_t tag;        /* random, drawn when the record was taken: the id's high half */
    uint32_t count;      /* reads granted to owner not released */
    uint32_t prev, next; /* the slot's grants / the free list (next) */
} kvp_lease_grant_t;

typedef struct kvp_lease_table {
    kvp_lease_t *slots;
    uint32_t n_slots;
    uint32_t free_head;
    uint32_t head, tail; /* live slots, earliest expiry first */
    uint32_t live;
    uint64_t bytes;             /* sum of live slots' bytes */
    uint64_t released, expired; /* leases ended by release / by the TTL */
    kvp_lease_grant_t *grants;  /* grant records (grow by doubling) */
    uint32_t n_grants;
    uint32_t free_grant; /* KVP_LEASE_NIL: none */
    /* releases ignored: an id granted to another owner (not_owner), an id no grant has
     * (unknown: ended by its TTL, from before a restart, or made up) */
    uint64_t refused_owner, refused_unknown;
    uint32_t conn_owned;           /* live grant records owned by a connection (no ACL) */
    uint32_t tags[KVP_LEASE_TAGS]; /* random tags not yet used: tags[0..n_tags) */
    uint32_t n_tags;
} kvp_lease_table_t;

void kvp_lease_table_init(kvp_lease_table_t *t);
/* Frees the RETIRED objects leases still hold (their extents go with their allocators). */
void kvp_lease_table_cleanup(kvp_lease_table_t *t);

#endif
