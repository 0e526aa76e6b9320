/*
 * lease.c - read leases that end when the read ends.
 *
 * Design: GetReplicaList grants a lease on each object it answers; the
 * client hands the lease back (LeaseRelease, one-way, no round trip on the
 * get's path) as soon as its transfer is over, success or failure. An
 * object under lease is not evicted and not removed without force; a
 * forced remove (or an upsert) of an object being read retires it: out of
 * the index at once, its extents kept until the last reader lets go. The
 * TTL (--lease-ttl) only bounds a reader that dies or hangs mid-read.
 *
 * Per object under read there is one slot in a table (not one per reader):
 * a reader count and an expiry, TTL after the latest grant. Slots of live
 * leases sit on a list in expiry order (every grant has the same TTL, so a
 * grant moves its slot to the tail), so the timer ends expired leases from
 * the head: O(1) per grant, release and expiry. Whether an object is leased
 * is decided by the clock (kvp_leased), so a lease the timer has not yet
 * reaped is already over; whatever frees an object forgets its slot. A lease id is the slot's
 * generation and index: a release that comes late (after the TTL ended the
 * lease and the slot went to another object) names an old generation and
 * is ignored. Within one generation a release is trusted: readers of one
 * object share its lease id, so a client that releases more than it was
 * granted (a bug, or forged frames) can end another reader's lease early;
 * that reader's CRC check (on by default) still catches reused bytes. Generations start at a random
 * value so ids from before a master restart do not match.
 *
 * Objects end here too: kvp_object_release frees an unlinked object's
 * extents (forgetting its lease), kvp_object_retire postpones that while
 * it is read. So whatever drops an object (eviction, remove, unmount, put
 * timeout) calls down into this file, and this file calls only the
 * policy's list hooks (lists.c) and the meta layer.
 *
 * Thread: master loop only.
 */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/rand.h"
#include "master/meta/record.h"
#include "master/policy/lease.h"
#include "master/policy/lists.h"

static void live_unlink(kvp_lease_table_t *t, uint32_t i)
{
    kvp_lease_t *l = &t->slots[i];
    if (l->prev != KVP_LEASE_NIL)
        t->slots[l->prev].next = l->next;
    else
        t->head = l->next;
    if (l->next != KVP_LEASE_NIL)
        t->slots[l->next].prev = l->prev;
    else
        t->tail = l->prev;
}

static void live_append(kvp_lease_table_t *t, uint32_t i)
{
    kvp_lease_t *l = &t->slots[i];
    l->prev = t->tail;
    l->next = KVP_LEASE_NIL;
    if (t->tail != KVP_LEASE_NIL)
        t->slots[t->tail].next = i;
    else
        t->head = i;
    t->tail = i;
}

static bool grow(kvp_lease_table_t *t, uint64_t *rng)
{
    uint32_t n = t->n_slots ? t->n_slots * 2 : 256;
    if (n <= t->n_slots)
        return false;
    kvp_lease_t *s = realloc(t->slots, (size_t)n * sizeof(*s));
    if (s == NULL)
        return false;
    for (uint32_t i = t->n_slots; i < n; i++) {
        memset(&s[i], 0, sizeof(s[i]));
        s[i].gen = (uint32_t)kvp_rng_next(rng);
        s[i].prev = KVP_LEASE_NIL;
        s[i].next = i + 1 < n ? i + 1 : t->free_head;
    }
    t->free_head = t->n_slots;
    t->slots = s;
    t->n_slots = n;
    return true;
}

static void lease_end(kvp_master_state_t *st, uint32_t i, bool release_retired);

static uint64_t lease_id(const kvp_lease_table_t *t, uint32_t i)
{
    return (uint64_t)t->slots[i].gen << 32 | i;
}

uint64_t kvp_lease_grant(kvp_master_state_t *st, kvp_object_t *obj)
{
    kvp_lease_table_t *t = &st->leases;
    if (st->config.lease_ttl_ms == 0) {
        kvp_policy_read(st, obj); /* no leases: a read is over as soon as it is answered */
        return 0;
    }
    uint32_t i;
    if (obj->lease != 0 && !kvp_leased(st, obj)) {
        t->expired++; /* over by its TTL, not reaped yet: its readers are gone */
        lease_end(st, obj->lease - 1, true);
    }
    if (obj->lease != 0) {
        i = obj->lease - 1;
        live_unlink(t, i);
    } else {
        if (t->free_head == KVP_LEASE_NIL && !grow(t, &st->rng))
            return 0;
        i = t->free_head;
        kvp_lease_t *l = &t->slots[i];
        t->free_head = l->next;
        l->gen++;
        if (l->gen == 0)
            l->gen = 1; /* id 0 means "no lease" */
        l->obj = obj;
        l->readers = 0;
        l->bytes = kvp_object_bytes(obj);
        t->bytes += l->bytes;
        t->live++;
        obj->lease = i + 1;
        kvp_policy_read_start(st, obj); /* off the lists eviction walks */
    }
    kvp_lease_t *l = &t->slots[i];
    l->readers++;
    l->expires_ms = st->now_ms + st->config.lease_ttl_ms;
    live_append(t, i);
    return lease_id(t, i);
}

/* The lease on slot i is over: free the slot (and a retired object with it when asked). */
static void lease_end(kvp_master_state_t *st, uint32_t i, bool release_retired)
{
    kvp_lease_table_t *t = &st->leases;
    kvp_lease_t *l = &t->slots[i];
    kvp_object_t *obj = l->obj;
    live_unlink(t, i);
    t->bytes -= l->bytes;
    t->live--;
    l->obj = NULL;
    l->prev = KVP_LEASE_NIL;
    l->next = t->free_head;
    t->free_head = i;
    obj->lease = 0;
    if (obj->state == KVP_OBJ_COMPLETE && release_retired)
        kvp_policy_read_end(st, obj); /* back on the lists, as just read */
    else if (obj->state == KVP_OBJ_RETIRED && release_retired)
        kvp_object_release(st, obj);
}

bool kvp_lease_release(kvp_master_state_t *st, uint64_t lease_id)
{
    kvp_lease_table_t *t = &st->leases;
    uint32_t i = (uint32_t)lease_id;
    if (i >= t->n_slots || t->slots[i].obj == NULL || t->slots[i].gen != (uint32_t)(lease_id >> 32))
        return false;
    t->released++;
    if (--t->slots[i].readers == 0)
        lease_end(st, i, true);
    return true;
}

unsigned kvp_lease_expire(kvp_master_state_t *st)
{
    kvp_lease_table_t *t = &st->leases;
    unsigned n = 0;
    while (t->head != KVP_LEASE_NIL && t->slots[t->head].expires_ms <= st->now_ms) {
        lease_end(st, t->head, true);
        n++;
    }
    if (n > 0) {
        /* counted in stat (leases_expired); Exist's leases (--lease-on-exist) always end so */
        t->expired += n;
        KVP_LOG_DEBUG("%u read leases ended by their %u ms TTL (not released)", n,
                      st->config.lease_ttl_ms);
    }
    return n;
}

void kvp_lease_forget(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (obj->state != KVP_OBJ_PENDING && obj->lease != 0)
        lease_end(st, obj->lease - 1, false);
}

uint64_t kvp_lease_left_ms(const kvp_master_state_t *st, const kvp_object_t *obj)
{
    if (!kvp_leased(st, obj))
        return 0;
    uint64_t exp = st->leases.slots[obj->lease - 1].expires_ms;
    return exp > st->now_ms ? exp - st->now_ms : 0;
}

void kvp_object_retire(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (kvp_leased(st, obj)) {
        /* out of the index now: out of the owners' records too (its extents stay held
         * until its reads end) */
        kvp_record_forget(&st->segments, obj);
        obj->state = KVP_OBJ_RETIRED;
    } else
        kvp_object_release(st, obj);
}

void kvp_object_release(kvp_master_state_t *st, kvp_object_t *obj)
{
    kvp_lease_forget(st, obj);
    kvp_state_forget_ssd(st, obj); /* SSD copies' entries go from their files too */
    for (unsigned i = 0; i < obj->n_replicas; i++)
        kvp_segment_table_free_extent(&st->segments, &obj->replicas[i]);
    free(obj);
}

void kvp_object_remove(kvp_master_state_t *st, kvp_object_t *obj)
{
    kvp_state_object_gone(st, obj); /* KV events: removed from its media */
    kvp_index_unlink(&st->index, obj);
    kvp_object_retire(st, obj);
}
