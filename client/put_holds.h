/*
 * put_holds.h - room the master placed ahead for this client's next puts (put_holds.c):
 * the holds PUT_COMMIT hands out (docs/architecture.md "A put in one round trip").
 *
 * A hold is one object's extents (a replica each, with its write grant), of one size, for
 * puts placed one way (replica count, preferred segments: the fingerprint), bound to the
 * master connection that got it (its generation). A put batch whose every key has a hold
 * of its size writes into them and ends with one PUT_COMMIT, which also asks for the next
 * batch's. Holds are used only well before the master's put timeout (half of it), never
 * after their connection changed, and none on a segment a write to just failed.
 *
 * Thread: any (one lock; nothing is done under it but copying holds).
 */
#ifndef KVP_CLIENT_PUT_HOLDS_H
#define KVP_CLIENT_PUT_HOLDS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.pb-c.h"

#define KVP_HOLD_REPLICAS_MAX 8
#define KVP_HOLD_GRANT_LEN 80

/* A grant set of a PUT_COMMIT answer (common/grant.h: the header, then its extents, as the
 * master sealed it for one segment), kept while a hold names one of its extents: every
 * kvp_hold_t value that names it holds a reference. */
typedef struct kvp_hold_set {
    _Atomic uint32_t refs;
    uint32_t count; /* its extents */
    uint8_t data[];
} kvp_hold_set_t;

/* One hold, as this client keeps it. Its replicas' write grants: extents of grant sets
 * (data grants on: one MAC a segment an answer), or a grant of its own each. */
typedef struct kvp_hold {
    uint64_t id;
    uint64_t size;
    uint64_t usable_until_ms; /* kvp_now_ms: half the put timeout after it came */
    uint32_t n_replicas;
    struct {
        uint64_t segment_id;
        uint64_t offset;
        kvp_hold_set_t *set; /* its grant's set (a reference), or NULL */
        uint32_t set_index;  /* its extent in set */
        uint32_t grant_len;  /* set NULL: 0 or KVP_HOLD_GRANT_LEN */
        uint8_t grant[KVP_HOLD_GRANT_LEN];
    } reps[KVP_HOLD_REPLICAS_MAX];
} kvp_hold_t;

typedef struct kvp_holds kvp_holds_t;

/* At most max_holds holds and max_bytes of room held at once; max_holds 0: never any (every
 * put makes two master calls). NULL: no memory. */
kvp_holds_t *kvp_holds_create(uint32_t max_holds, uint64_t max_bytes);
void kvp_holds_destroy(kvp_holds_t *h);

/* Asks for holds at all (on, and the master answers PUT_COMMIT)? */
bool kvp_holds_on(kvp_holds_t *h);
/* The master does not know PUT_COMMIT: never ask again. */
void kvp_holds_off(kvp_holds_t *h);

/*
 * A hold of size szs[j] for each of the m keys, all or none: true and out[0..m) filled (the
 * holds are the caller's now, with their references: it commits them or puts them back, and
 * then lets go of them with kvp_holds_release). fp: the batch's placement
 * fingerprint; gen: the master connection's generation; holds of another of either are
 * dropped first (the master frees them at its put timeout, or when their connection closed).
 */
bool kvp_holds_take(kvp_holds_t *h, uint64_t fp, uint64_t gen, const uint64_t *szs, size_t m,
                    kvp_hold_t *out);
/* Holds still the caller's (their keys were refused, not written) back, for later batches
 * (the pool takes references of its own: the caller still releases its copies). */
void kvp_holds_put_back(kvp_holds_t *h, uint64_t fp, uint64_t gen, const kvp_hold_t *hs, size_t n);
/* The caller's copies of n holds let go of (their grant sets' references): after their
 * batch's writes and commit. */
void kvp_holds_release(kvp_hold_t *hs, size_t n);
/* The holds a PUT_COMMIT answer handed out (the put timeout it said), got on connection gen;
 * segs: the answer's descriptors, whose grant sets a hold's replicas may name (copied). */
void kvp_holds_add(kvp_holds_t *h, uint64_t fp, uint64_t gen, Kvpool__Hold *const *holds, size_t n,
                   Kvpool__SegmentDesc *const *segs, size_t n_segs, uint32_t put_timeout_ms);
/* Forget every hold with an extent on segment_id (a write there failed). */
void kvp_holds_drop_segment(kvp_holds_t *h, uint64_t segment_id);
/* How many holds of `size` to ask for after a batch that used (or would have used) `used`:
 * what brings them back to `used`, within the limits. */
uint32_t kvp_holds_want(kvp_holds_t *h, uint64_t fp, uint64_t size, size_t used);

/* Every hold kept (of connection gen) dropped, to be given back (a put found the pool or
 * its quota full: they may be what fills it); how many are to be given back now. */
size_t kvp_holds_give_all(kvp_holds_t *h, uint64_t gen);
/* Up to cap holds of connection gen dropped unwritten into ids (the caller gives them back
 * in its PUT_COMMIT: they are no longer here); how many. */
size_t kvp_holds_gone(kvp_holds_t *h, uint64_t gen, uint64_t *ids, size_t cap);

/* Counters (kvp_metrics): holds taken by batches, dropped unused (expired, another
 * connection or placement, a failed segment). */
void kvp_holds_counts(kvp_holds_t *h, uint64_t *taken, uint64_t *dropped);

#endif
