/*
 * eviction.c - keeping a full pool usable: LRU eviction between watermarks,
 * and the put timeout that reclaims zombie PENDING objects.
 *
 * Design: COMPLETE objects sit on one LRU list (object_index.c); a put
 * (PutEnd) or a read (GetReplicaList) moves an object to the MRU end, so
 * the order is exact LRU, not a sampled approximation. Eviction walks from
 * the LRU end and frees objects until usage is down to the target, skipping
 * objects under a read lease (their extents may be being read right now),
 * hard-pinned objects, and, in a first pass, soft-pinned ones; a second
 * pass takes soft-pinned objects only if the first could not reach the
 * target. PENDING objects are never on the LRU list, so never evicted.
 *
 * PENDING objects are on their own list in creation order; with one
 * put timeout for all, the head is always the first to expire.
 *
 * Thread: master loop only. Time: st->now_ms (set by the loop, or by tests).
 */
#include "common/log.h"
#include "master/master.h"

void kvp_master_config_init(kvp_master_config_t *cfg)
{
    cfg->evict = true;
    cfg->evict_high = 0.95;
    cfg->evict_low = 0.85;
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

static bool evictable(const kvp_master_state_t *st, const kvp_object_t *obj, bool take_soft)
{
    if (kvp_leased(st, obj))
        return false; /* being read */
    if (obj->pin == KVP_PIN_HARD)
        return false;
    if (obj->pin == KVP_PIN_SOFT && !take_soft &&
        (uint64_t)obj->soft_pin_until_s * 1000 > st->now_ms)
        return false;
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

uint64_t kvp_evict_to(kvp_master_state_t *st, uint64_t target)
{
    uint64_t used = kvp_master_used(st);
    if (!st->config.evict || used <= target)
        return 0;
    uint64_t freed = 0, count = 0;
    for (int pass = 0; pass < 2 && used > target; pass++) {
        kvp_object_t *obj = st->index.lru.head;
        while (obj != NULL && used > target) {
            kvp_object_t *next = obj->lnext;
            if (evictable(st, obj, pass == 1)) {
                uint64_t bytes = kvp_object_bytes(obj);
                kvp_index_unlink(&st->index, obj);
                kvp_object_release(st, obj);
                used = bytes < used ? used - bytes : 0;
                freed += bytes;
                count++;
            }
            obj = next;
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
