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
 * reaped is already over; whatever frees an object forgets its slot.
 *
 * Lease ids (what a reader hands back) name grants, not slots: each slot
 * keeps one grant record per owner reading it (a principal with an ACL,
 * else a connection; KVP_LEASE_NOBODY for Exist's leases, which have no
 * id), with a count of that owner's reads. An id is the record's index
 * and 32 random bits drawn for it from the kernel (getrandom(2), 64 tags a
 * call), so ids are unrelated to each other: one reader's id says nothing
 * of another's, and a record reused later has other bits. A release finds
 * its record in O(1), and ends something only when it comes from the
 * record's owner: one reader's releases, right or wrong, never end another
 * reader's lease. Others are ignored and counted (refused_owner, and
 * refused_unknown for an id no grant has: late after the TTL, from before
 * a restart, or made up). Records per slot are few (the owners reading
 * one object at once), and a grant looks its owner's up along the slot's
 * list; a slot that ends frees its records.
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
#include <sys/random.h>

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

/* An array of *n_p records of `size` bytes, doubled (256 at first): the new array (*n_p
 * its count); NULL: out of memory or 2^31 records already (a and *n_p unchanged), so an
 * index never reaches KVP_LEASE_NIL. */
static void *doubled(void *a, uint32_t *n_p, size_t size)
{
    uint32_t n = *n_p ? *n_p * 2 : 256;
    if (n <= *n_p)
        return NULL;
    void *p = realloc(a, (size_t)n * size);
    if (p != NULL)
        *n_p = n;
    return p;
}

static bool grow(kvp_lease_table_t *t)
{
    uint32_t old = t->n_slots;
    kvp_lease_t *s = doubled(t->slots, &t->n_slots, sizeof(*s));
    if (s == NULL)
        return false;
    for (uint32_t i = old; i < t->n_slots; i++) {
        memset(&s[i], 0, sizeof(s[i]));
        s[i].prev = s[i].grants = KVP_LEASE_NIL;
        s[i].next = i + 1 < t->n_slots ? i + 1 : t->free_head;
    }
    t->free_head = old;
    t->slots = s;
    return true;
}

static bool grow_grants(kvp_lease_table_t *t)
{
    uint32_t old = t->n_grants;
    kvp_lease_grant_t *g = doubled(t->grants, &t->n_grants, sizeof(*g));
    if (g == NULL)
        return false;
    for (uint32_t i = old; i < t->n_grants; i++) {
        memset(&g[i], 0, sizeof(g[i]));
        g[i].slot = g[i].prev = KVP_LEASE_NIL;
        g[i].next = i + 1 < t->n_grants ? i + 1 : t->free_grant;
    }
    t->free_grant = old;
    t->grants = g;
    return true;
}

/* 32 random bits, never 0, from the kernel's CSPRNG (drawn KVP_LEASE_TAGS at a time). */
static uint32_t draw_tag(kvp_lease_table_t *t)
{
    if (t->n_tags == 0) {
        if (getrandom(t->tags, sizeof(t->tags), 0) != (ssize_t)sizeof(t->tags))
            for (unsigned k = 0; k < KVP_LEASE_TAGS; k++)
                t->tags[k] = (uint32_t)kvp_random_u64();
        t->n_tags = KVP_LEASE_TAGS;
    }
    uint32_t v = t->tags[--t->n_tags];
    t->tags[t->n_tags] = 0; /* used: nothing keeps it but its grant */
    return v != 0 ? v : 1;
}

static uint64_t lease_id(const kvp_lease_table_t *t, uint32_t g)
{
    return (uint64_t)t->grants[g].tag << 32 | g;
}

/* owner's grant record on slot i, taken (count 0) when it has none; KVP_LEASE_NIL: out of
 * memory. O(owners reading the slot's object). */
static uint32_t grant_record(kvp_lease_table_t *t, uint32_t i, uint64_t owner)
{
    for (uint32_t g = t->slots[i].grants; g != KVP_LEASE_NIL; g = t->grants[g].next)
        if (t->grants[g].owner == owner)
            return g;
    if (t->free_grant == KVP_LEASE_NIL && !grow_grants(t))
        return KVP_LEASE_NIL;
    uint32_t g = t->free_grant;
    kvp_lease_grant_t *r = &t->grants[g];
    t->free_grant = r->next;
    r->owner = owner;
    r->slot = i;
    r->tag = draw_tag(t);
    r->count = 0;
    r->prev = KVP_LEASE_NIL;
    r->next = t->slots[i].grants;
    if (r->next != KVP_LEASE_NIL)
        t->grants[r->next].prev = g;
    t->slots[i].grants = g;
    if (!(owner & KVP_LEASE_PRINCIPAL))
        t->conn_owned++;
    return g;
}

/* Unlink grant record g from its slot and free it (its reads stay counted in the slot). */
static void grant_free(kvp_lease_table_t *t, uint32_t g)
{
    kvp_lease_grant_t *r = &t->grants[g];
    if (r->prev != KVP_LEASE_NIL)
        t->grants[r->prev].next = r->next;
    else
        t->slots[r->slot].grants = r->next;
    if (r->next != KVP_LEASE_NIL)
        t->grants[r->next].prev = r->prev;
    if (!(r->owner & KVP_LEASE_PRINCIPAL))
        t->conn_owned--;
    memset(r, 0, sizeof(*r));
    r->slot = r->prev = KVP_LEASE_NIL;
    r->next = t->free_grant;
    t->free_grant = g;
}

static void lease_end(kvp_master_state_t *st, uint32_t i, bool release_retired);

uint64_t kvp_lease_grant(kvp_master_state_t *st, kvp_object_t *obj, uint64_t owner)
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
        if (t->free_head == KVP_LEASE_NIL && !grow(t))
            return 0;
        i = t->free_head;
        kvp_lease_t *l = &t->slots[i];
        t->free_head = l->next;
        l->obj = obj;
        l->readers = 0;
        l->grants = KVP_LEASE_NIL;
        l->bytes = kvp_object_bytes(obj);
        t->bytes += l->bytes;
        t->live++;
        obj->lease = i + 1;
        kvp_policy_read_start(st, obj); /* off the lists eviction walks */
        kvp_group_t *grp = kvp_group_get(&st->groups, kvp_object_group(obj));
        if (grp != NULL && obj->state == KVP_OBJ_COMPLETE) { /* eviction passes it over */
            grp->leased++;
            obj->flags |= KVP_OBJ_F_GROUP_LEASED;
        }
    }
    kvp_lease_t *l = &t->slots[i];
    l->readers++;
    l->expires_ms = st->now_ms + st->config.lease_ttl_ms;
    live_append(t, i);
    if (owner == KVP_LEASE_NOBODY)
        return 0;
    uint32_t g = grant_record(t, i, owner);
    if (g == KVP_LEASE_NIL)
        return 0; /* counted among the readers: the lease holds until its TTL */
    t->grants[g].count++;
    return lease_id(t, g);
}

void kvp_lease_group(kvp_master_state_t *st, const kvp_object_t *obj)
{
    kvp_group_t *g = kvp_group_get(&st->groups, kvp_object_group(obj));
    if (g == NULL || st->config.lease_ttl_ms == 0)
        return;
    /* O(1) whatever the group's size: one expiry for the group, which eviction consults
     * (policy/eviction.c), no member touched */
    g->lease_until_ms = st->now_ms + st->config.lease_ttl_ms;
    if (!g->stale && st->now_ms - g->refreshed_ms < st->config.lease_ttl_ms / 4)
        return; /* (counted at most 4 times a TTL per group, as when each member was leased) */
    g->stale = false;
    g->refreshed_ms = st->now_ms;
    st->stats.group_lease_refreshes++;
}

/* obj's lease slot ends: its group no longer counts it. */
static void group_unlease(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (!(obj->flags & KVP_OBJ_F_GROUP_LEASED))
        return;
    obj->flags &= (uint8_t)~KVP_OBJ_F_GROUP_LEASED;
    kvp_group_t *g = kvp_group_get(&st->groups, kvp_object_group(obj));
    if (g != NULL && g->leased > 0)
        g->leased--;
}

/* The lease on slot i is over: free the slot (and a retired object with it when asked). */
static void lease_end(kvp_master_state_t *st, uint32_t i, bool release_retired)
{
    kvp_lease_table_t *t = &st->leases;
    kvp_lease_t *l = &t->slots[i];
    kvp_object_t *obj = l->obj;
    while (l->grants != KVP_LEASE_NIL) /* every id of it is unknown from now on */
        grant_free(t, l->grants);
    live_unlink(t, i);
    t->bytes -= l->bytes;
    t->live--;
    l->obj = NULL;
    l->prev = KVP_LEASE_NIL;
    l->next = t->free_head;
    t->free_head = i;
    obj->lease = 0;
    group_unlease(st, obj);
    if (obj->state == KVP_OBJ_COMPLETE && release_retired)
        kvp_policy_read_end(st, obj); /* back on the lists, as just read */
    else if (obj->state == KVP_OBJ_RETIRED && release_retired)
        kvp_object_release(st, obj);
}

/* The release of lease_id (by owner, when check_owner). */
static kvp_lease_outcome_t release(kvp_master_state_t *st, uint64_t lease_id, uint64_t owner,
                                   bool check_owner)
{
    kvp_lease_table_t *t = &st->leases;
    uint32_t g = (uint32_t)lease_id;
    if (g >= t->n_grants || t->grants[g].slot == KVP_LEASE_NIL ||
        t->grants[g].tag != (uint32_t)(lease_id >> 32)) {
        t->refused_unknown++;
        return KVP_LEASE_UNKNOWN;
    }
    if (check_owner && t->grants[g].owner != owner) {
        t->refused_owner++;
        return KVP_LEASE_NOT_OWNER;
    }
    uint32_t i = t->grants[g].slot;
    t->released++;
    if (--t->grants[g].count == 0)
        grant_free(t, g);
    if (--t->slots[i].readers == 0)
        lease_end(st, i, true);
    return KVP_LEASE_RELEASED;
}

kvp_lease_outcome_t kvp_lease_release_by(kvp_master_state_t *st, uint64_t lease_id, uint64_t owner)
{
    return release(st, lease_id, owner, true);
}

bool kvp_lease_release(kvp_master_state_t *st, uint64_t lease_id)
{
    return release(st, lease_id, 0, false) == KVP_LEASE_RELEASED;
}

void kvp_lease_disown(kvp_master_state_t *st, uint64_t owner)
{
    kvp_lease_table_t *t = &st->leases;
    for (uint32_t g = 0; g < t->n_grants && t->conn_owned > 0; g++)
        if (t->grants[g].slot != KVP_LEASE_NIL && t->grants[g].owner == owner)
            grant_free(t, g);
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
