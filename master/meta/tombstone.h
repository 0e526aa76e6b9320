/*
 * tombstone.h - keys removed lately, with the version clock at their removal
 * (see tombstone.c). An SSD segment's owner that comes back (restart, kill -9)
 * offers its file's objects again; one whose key was removed after that copy
 * was written must not come back.
 */
#ifndef KVP_MASTER_META_TOMBSTONE_H
#define KVP_MASTER_META_TOMBSTONE_H

#include <stdint.h>

#define KVP_TOMBSTONE_WAYS 4u

typedef struct kvp_tombstone {
    uint64_t hash;
    uint64_t version; /* the version clock when the key was removed; 0: empty */
} kvp_tombstone_t;

typedef struct kvp_tombstones {
    kvp_tombstone_t *sets; /* n_sets x KVP_TOMBSTONE_WAYS */
    uint64_t n_sets;       /* a power of two */
    uint64_t cleared;      /* everything removed at this version (remove all); 0: never */
} kvp_tombstones_t;

/* Remember that the key with this hash was removed at `version` (the oldest way of its set
 * is overwritten when the set is full). Allocates the table on first use; false when it
 * cannot (then nothing is remembered). */
void kvp_tombstone_add(kvp_tombstones_t *t, uint64_t hash, uint64_t version);
/* The latest removal version remembered for the hash (or the remove-all), 0: none. */
uint64_t kvp_tombstone_get(const kvp_tombstones_t *t, uint64_t hash);
void kvp_tombstone_cleanup(kvp_tombstones_t *t);

#endif
