/*
 * tombstone.c - keys removed lately (tombstone.h).
 *
 * Design: a set-associative table of (key hash, version at removal), 64 Ki
 * sets of 4 ways (4 MiB, allocated on the first remove): a removal
 * overwrites the oldest way of its set. So the last ~256 Ki removals are
 * remembered for sure, older ones while their set has room. An SSD entry
 * whose key has a tombstone newer than the entry is dropped at adoption
 * (policy/tier.c); a key whose tombstone was overwritten may come back if
 * its owner was down across the remove (docs/architecture.md says so). A
 * hash collision only drops an entry that was still good: a miss, never
 * wrong bytes.
 *
 * Thread: master loop only.
 */
#include "master/meta/tombstone.h"

#include <stdlib.h>

#define SETS (1u << 16)

void kvp_tombstone_add(kvp_tombstones_t *t, uint64_t hash, uint64_t version)
{
    if (t->sets == NULL) {
        t->sets = calloc((size_t)SETS * KVP_TOMBSTONE_WAYS, sizeof(*t->sets));
        if (t->sets == NULL)
            return;
        t->n_sets = SETS;
    }
    kvp_tombstone_t *set = &t->sets[(hash & (t->n_sets - 1)) * KVP_TOMBSTONE_WAYS];
    unsigned oldest = 0;
    for (unsigned w = 0; w < KVP_TOMBSTONE_WAYS; w++) {
        if (set[w].version != 0 && set[w].hash == hash) {
            oldest = w;
            break;
        }
        if (set[w].version < set[oldest].version)
            oldest = w;
    }
    set[oldest].hash = hash;
    set[oldest].version = version;
}

uint64_t kvp_tombstone_get(const kvp_tombstones_t *t, uint64_t hash)
{
    uint64_t v = t->cleared;
    if (t->sets == NULL)
        return v;
    const kvp_tombstone_t *set = &t->sets[(hash & (t->n_sets - 1)) * KVP_TOMBSTONE_WAYS];
    for (unsigned w = 0; w < KVP_TOMBSTONE_WAYS; w++)
        if (set[w].version != 0 && set[w].hash == hash && set[w].version > v)
            v = set[w].version;
    return v;
}

void kvp_tombstone_cleanup(kvp_tombstones_t *t)
{
    free(t->sets);
    t->sets = NULL;
    t->n_sets = 0;
}
