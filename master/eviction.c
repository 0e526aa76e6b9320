/*
 * eviction.c - keeping a full pool useful: which objects go when a put
 * needs room, and the put timeout that reclaims zombie PENDING objects.
 *
 * Policy: 2Q with a ghost, tuned for prefix caches (docs/architecture.md,
 * "Eviction"). KV-cache blocks come in prefix chains (block i is worth
 * nothing once a block before it is gone) and most are written once and
 * never read again, so:
 *   - probation: objects put and not read since, oldest first. Victims come
 *     from here while it holds more than 2 % of the objects.
 *   - protected: objects read at least once (or put again soon after being
 *     evicted), least recently used first (a read counts when it ends).
 *   - reading: objects with a read in flight (a lease held). Eviction never
 *     looks at them; when the lease ends they go to protected's new end.
 *   - pinned (hard pins) and soft (soft pins, in pin order): hard pins are
 *     never victims; soft pins only in a second pass, when nothing else is
 *     left, and an expired soft pin at the head of its list moves to
 *     probation, an ordinary object again.
 *   - ghost: the keys of the last ~2-4 x (objects resident) victims, in a
 *     pair of Bloom filters (5-10 bytes per resident object: 10 bits per
 *     key, rounded up to a power of two). A key put
 *     again while the ghost remembers it goes straight to protected: it
 *     came back, so it is likely to come back again.
 *   - chain order: PutEnd and GetReplicaList handle their keys last to
 *     first, so the first block of a chain ends up the most recent and a
 *     chain is eaten from its tail, never from its head. The last key of a
 *     PutEnd batch of several keys (the deepest block of a chain, the least
 *     shared) goes to the evict end of probation.
 * Replayed on the FAST'25 Mooncake trace with the pool at 10 % of the
 * unique blocks it reaches a 0.28 hit rate where exact LRU gets 0.26
 * (kvpool-bench trace). Every hook and every victim is O(1): objects that
 * cannot go (being read, pinned) are on lists eviction never walks, so
 * the head of probation or protected is a victim. The one exception is an
 * object on a draining segment (being moved away): it is passed over and
 * moves to the new end of its list. One search looks at each at most
 * once, but while a drain runs, every search of a list whose head is all
 * draining objects passes over them again: O(objects left on the draining
 * segment) per victim, until the drain ends (known cost, drains are rare
 * and short).
 *
 * Eviction is on demand: a put that does not fit evicts just what it
 * needs (PutStart, service.c); the watermarks (off by default) can keep
 * headroom besides. PENDING objects are on no policy list, so never
 * evicted.
 *
 * PENDING objects are on their own list in creation order; with one
 * put timeout for all, the head is always the first to expire.
 *
 * Thread: master loop only. Time: st->now_ms (set by the loop, or by tests).
 */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "master/master.h"

/* Probation keeps at least this share of the objects (per mille). */
#define PROBATION_FLOOR_PERMILLE 20
/* The ghost remembers between GHOST_ROUNDS and twice that many x resident objects. */
#define GHOST_ROUNDS 2
#define GHOST_MIN_KEYS 1024
#define GHOST_BITS_PER_KEY 10
#define GHOST_PROBES 4

void kvp_master_config_init(kvp_master_config_t *cfg)
{
    cfg->evict = true;
    cfg->evict_high = 1.0; /* off: puts evict what they need */
    cfg->evict_low = 0.98;
    cfg->lease_ttl_ms = 5000;
    cfg->put_timeout_ms = 30000;
    cfg->soft_pin_ttl_s = 1800;
    cfg->client_ttl_ms = 10000;
    cfg->lease_on_exist = false;
}

uint64_t kvp_master_used(const kvp_master_state_t *st)
{
    uint64_t used = 0;
    for (uint32_t i = 0; i < st->segments.n_slots; i++)
        if (st->segments.slots[i] != NULL)
            used += kvp_segment_used(st->segments.slots[i]);
    return used;
}

/* ---- the ghost ---- */

/* Bit i of a key: a blocked Bloom filter, every probe of a key in one 64-byte block, so a
 * lookup or an insert touches one cache line per filter. */
static uint64_t ghost_probe(uint64_t hash, unsigned i, uint64_t mask)
{
    uint64_t block = ((hash * 0x9E3779B97F4A7C15ull) >> 32) & (mask >> 9);
    uint64_t y = (hash ^ (hash >> 29)) * 0xBF58476D1CE4E5B9ull;
    return block << 9 | ((y >> (9 * i)) & 511);
}

bool kvp_ghost_has(const kvp_ghost_t *g, uint64_t hash)
{
    for (unsigned f = 0; f < 2; f++) {
        if (g->bits[f] == NULL)
            continue;
        unsigned hit = 0;
        for (unsigned i = 0; i < GHOST_PROBES; i++) {
            uint64_t b = ghost_probe(hash, i, g->mask[f]);
            hit += (g->bits[f][b >> 6] >> (b & 63)) & 1;
        }
        if (hit == GHOST_PROBES)
            return true;
    }
    return false;
}

/* (Re)size the filter that becomes current for `keys` keys; false: out of memory. */
static bool ghost_rotate(kvp_ghost_t *g, uint64_t keys)
{
    unsigned next = g->bits[g->cur] == NULL ? g->cur : g->cur ^ 1;
    uint64_t bits = 512; /* one block at least */
    while (bits < keys * GHOST_BITS_PER_KEY)
        bits *= 2;
    uint64_t *b = aligned_alloc(64, bits / 8); /* blocks on cache lines */
    if (b == NULL)
        return false;
    memset(b, 0, bits / 8);
    free(g->bits[next]);
    g->bits[next] = b;
    g->mask[next] = bits - 1;
    g->cur = next;
    g->cap = keys;
    g->n_cur = 0;
    return true;
}

static void ghost_add(kvp_master_state_t *st, uint64_t hash)
{
    kvp_ghost_t *g = &st->ghost;
    if (g->bits[g->cur] == NULL || g->n_cur >= g->cap) {
        uint64_t resident = st->index.count - st->index.pending;
        uint64_t keys = resident * GHOST_ROUNDS;
        if (!ghost_rotate(g, keys < GHOST_MIN_KEYS ? GHOST_MIN_KEYS : keys))
            return; /* no memory: this victim is forgotten, nothing else changes */
    }
    for (unsigned i = 0; i < GHOST_PROBES; i++) {
        uint64_t b = ghost_probe(hash, i, g->mask[g->cur]);
        g->bits[g->cur][b >> 6] |= 1ull << (b & 63);
    }
    g->n_cur++;
}

void kvp_ghost_cleanup(kvp_ghost_t *g)
{
    free(g->bits[0]);
    free(g->bits[1]);
    *g = (kvp_ghost_t){0};
}

/* ---- policy hooks ---- */

static void move_to(kvp_master_state_t *st, kvp_object_t *obj, unsigned list, bool evict_end)
{
    kvp_object_list_remove(kvp_index_policy_list(&st->index, obj), obj);
    obj->policy = (obj->policy & ~KVP_POLICY_LIST_MASK) | list;
    kvp_object_list_t *l = kvp_index_policy_list(&st->index, obj);
    if (evict_end)
        kvp_object_list_prepend(l, obj);
    else
        kvp_object_list_append(l, obj);
}

static unsigned list_of(const kvp_object_t *obj)
{
    return obj->policy & KVP_POLICY_LIST_MASK;
}

static bool soft_pin_live(const kvp_master_state_t *st, const kvp_object_t *obj)
{
    return obj->pin == KVP_PIN_SOFT && (uint64_t)obj->soft_pin_until_s * 1000 > st->now_ms;
}

void kvp_policy_put(kvp_master_state_t *st, kvp_object_t *obj, bool deepest)
{
    /* the index put it at the new end of probation (or on a pin list) */
    if (list_of(obj) != KVP_POLICY_PROBATION)
        return;
    if (kvp_ghost_has(&st->ghost, obj->hash))
        move_to(st, obj, KVP_POLICY_PROTECTED, false);
    else if (deepest)
        move_to(st, obj, KVP_POLICY_PROBATION, true);
}

void kvp_policy_read_start(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (list_of(obj) != KVP_POLICY_PINNED && list_of(obj) != KVP_POLICY_READING)
        move_to(st, obj, KVP_POLICY_READING, false);
}

void kvp_policy_read_end(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (list_of(obj) == KVP_POLICY_READING)
        move_to(st, obj, soft_pin_live(st, obj) ? KVP_POLICY_SOFT : KVP_POLICY_PROTECTED, false);
}

void kvp_policy_read(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (list_of(obj) == KVP_POLICY_PROBATION || list_of(obj) == KVP_POLICY_PROTECTED)
        move_to(st, obj, KVP_POLICY_PROTECTED, false);
}

/* ---- victims ---- */

/* Objects on the scanned lists are neither being read nor pinned (other lists hold
 * those): what is left to check is the segment. */
static bool evictable(const kvp_master_state_t *st, const kvp_object_t *obj)
{
    /* an object on a draining segment is being moved away: evicting it frees no room
     * that new puts could use */
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        const kvp_segment_t *seg =
            kvp_segment_table_get(&st->segments, obj->replicas[r].segment_id);
        if (seg != NULL && seg->draining)
            return false;
    }
    return true;
}

/* The first evictable object of l from its evict end; the ones passed over move to its
 * new end, so the next scan does not look at them again first. */
static kvp_object_t *scan(kvp_master_state_t *st, kvp_object_list_t *l)
{
    for (uint64_t left = l->n; left > 0 && l->head != NULL; left--) {
        kvp_object_t *obj = l->head;
        if (evictable(st, obj))
            return obj;
        kvp_object_list_remove(l, obj);
        kvp_object_list_append(l, obj);
    }
    return NULL;
}

static kvp_object_t *victim(kvp_master_state_t *st, bool take_soft)
{
    kvp_object_index_t *ix = &st->index;
    /* soft pins that ran out are ordinary objects again (pin order: the head expires
     * first when every pin has the default TTL; a longer one ahead holds the rest up) */
    while (ix->soft.head != NULL && !soft_pin_live(st, ix->soft.head))
        move_to(st, ix->soft.head, KVP_POLICY_PROBATION, false);
    if (take_soft)
        return scan(st, &ix->soft);
    uint64_t complete = ix->probation.n + ix->protected.n;
    bool probation_first =
        ix->probation.n * 1000 > complete * PROBATION_FLOOR_PERMILLE || ix->protected.n == 0;
    kvp_object_list_t *first = probation_first ? &ix->probation : &ix->protected;
    kvp_object_list_t *second = probation_first ? &ix->protected : &ix->probation;
    kvp_object_t *obj = scan(st, first);
    return obj != NULL ? obj : scan(st, second);
}

uint64_t kvp_evict_to(kvp_master_state_t *st, uint64_t target)
{
    kvp_lease_expire(st); /* leases whose TTL is over give their objects back first */
    uint64_t used = kvp_master_used(st);
    if (!st->config.evict || used <= target)
        return 0;
    uint64_t freed = 0, count = 0;
    for (int pass = 0; pass < 2 && used > target; pass++) {
        kvp_object_t *obj;
        while (used > target && (obj = victim(st, pass == 1)) != NULL) {
            uint64_t bytes = kvp_object_bytes(obj);
            kvp_index_unlink(&st->index, obj);
            ghost_add(st, obj->hash);
            kvp_object_release(st, obj);
            used = bytes < used ? used - bytes : 0;
            freed += bytes;
            count++;
        }
    }
    if (count > 0) {
        st->stats.evictions++;
        st->stats.evicted_objects += count;
        st->stats.evicted_bytes += freed;
        KVP_LOG_DEBUG("evicted %llu objects (%llu bytes)", (unsigned long long)count,
                      (unsigned long long)freed);
    }
    return freed;
}

void kvp_evict_if_needed(kvp_master_state_t *st)
{
    uint64_t cap = st->segments.capacity;
    if (cap == 0)
        return;
    if ((double)kvp_master_used(st) > st->config.evict_high * (double)cap)
        kvp_evict_to(st, (uint64_t)(st->config.evict_low * (double)cap));
}

unsigned kvp_expire_puts(kvp_master_state_t *st)
{
    unsigned n = 0;
    kvp_object_t *obj = st->index.pending_list.head;
    while (obj != NULL) {
        kvp_object_t *next = obj->lnext;
        if (obj->deadline_ms <= st->now_ms) {
            kvp_index_unlink(&st->index, obj);
            kvp_object_release(st, obj);
            n++;
        }
        obj = next;
    }
    if (n > 0) {
        st->stats.put_timeouts += n;
        KVP_LOG_INFO("revoked %u puts not ended within %u ms", n, st->config.put_timeout_ms);
    }
    return n;
}
