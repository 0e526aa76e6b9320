/*
 * lists.c - the eviction policy's hooks: which list a COMPLETE object is on.
 *
 * Design: an age-biased LRU over probation and protected, the bias moved by
 * the ghost's hits (policy/eviction.c says why). Every object the policy
 * tracks is on exactly one of the index's lists (probation, protected,
 * reading, pinned, soft; obj->policy says which), and each hook moves it in
 * O(1). Moving an object to a list's new end stamps it with the next tick
 * of st->policy_clock (obj->touched); to its evict end, it keeps its stamp
 * or takes the head's if that is older, so each list stays in stamp order.
 * A put that the ghost remembers goes to protected and moves the bias (the
 * victim's list was too eager), the deepest block of a batch to the evict
 * end of probation while victims come back (deepest_first), a read in
 * flight to reading (eviction never walks it), a finished read to
 * protected's new end (or, for an object on the SSD tier only, the SSD
 * list's new end; for one being offloaded, the offloading list:
 * kvp_policy_home). The index puts a new COMPLETE object on probation or
 * a pin list.
 *
 * Thread: master loop only. Time: st->now_ms (soft pin expiry).
 */
#include "master/policy/lists.h"

#include "master/meta/ghost.h"
#include "master/meta/object_index.h"

void kvp_policy_move(kvp_master_state_t *st, kvp_object_t *obj, unsigned list, bool evict_end)
{
    kvp_object_list_remove(kvp_index_policy_list(&st->index, obj), obj);
    obj->policy = (obj->policy & ~KVP_POLICY_LIST_MASK) | list;
    kvp_object_list_t *l = kvp_index_policy_list(&st->index, obj);
    if (evict_end) { /* as old as the head at most: the list stays in stamp order */
        if (l->head != NULL && (int64_t)(l->head->touched - obj->touched) < 0)
            obj->touched = l->head->touched;
        kvp_object_list_prepend(l, obj);
    } else {
        obj->touched = ++st->policy_clock;
        kvp_object_list_append(l, obj);
    }
}

static unsigned list_of(const kvp_object_t *obj)
{
    return obj->policy & KVP_POLICY_LIST_MASK;
}

/* Objects of the SSD tier only (no DRAM replica) are on the SSD tier's list, in LRU order;
 * objects being offloaded on their own list (neither is a DRAM victim). */
static bool ssd_only(const kvp_master_state_t *st, const kvp_object_t *obj)
{
    return obj->n_replicas > 0 && !kvp_segment_table_has_tier(&st->segments, obj, false);
}

/*
 * A victim of list `dir` (-1: probation, +1: protected) was put again while the ghost
 * remembered it: move the bias towards keeping that list's objects longer. Weighted by
 * the ratio of the two ghosts' sizes (ARC's rule), so each list's hits count per victim
 * it gave: the bias settles where a victim of either list is as likely to come back.
 * Bounded by +-KVP_POLICY_BIAS_LIMIT x the objects on the two lists.
 */
static void bias_by(kvp_master_state_t *st, int dir)
{
    int64_t b1 = (int64_t)kvp_ghost_size(&st->ghost, KVP_GHOST_PROBATION) + 1;
    int64_t b2 = (int64_t)kvp_ghost_size(&st->ghost, KVP_GHOST_PROTECTED) + 1;
    int64_t lim = KVP_POLICY_BIAS_LIMIT * (int64_t)(st->index.probation.n + st->index.protected.n);
    int64_t step = KVP_POLICY_BIAS_STEP;
    if (dir < 0) {
        step *= b2 > b1 ? b2 / b1 : 1;
        st->probation_bias = st->probation_bias - step < -lim ? -lim : st->probation_bias - step;
    } else {
        step *= b1 > b2 ? b1 / b2 : 1;
        st->probation_bias = st->probation_bias + step > lim ? lim : st->probation_bias + step;
    }
}

/*
 * The deepest-block rule's gate: does evicting a batch's deepest block first pay now? Only
 * while victims come back: when fewer than 1 recent put in KVP_POLICY_RETURN_RATIO is a
 * victim the ghost remembers (false positives included), the pool keeps nearly everything
 * that is asked for again, LRU is at Belady's level, and a fresh block evicted ahead of
 * LRU's victim can only cost a miss LRU does not have. Counts, not time: the same at any pace.
 */
static bool deepest_first(const kvp_master_state_t *st)
{
    return st->recent_returns * KVP_POLICY_RETURN_RATIO >= st->recent_puts;
}

void kvp_policy_victim(kvp_master_state_t *st)
{
    uint64_t window = st->index.count - st->index.pending;
    if (window < KVP_POLICY_WINDOW_MIN)
        window = KVP_POLICY_WINDOW_MIN;
    if (++st->recent_victims > window) {
        st->recent_victims /= 2;
        st->recent_puts /= 2;
        st->recent_returns /= 2;
    }
}

void kvp_policy_put(kvp_master_state_t *st, kvp_object_t *obj, bool deepest)
{
    /* the index put it at the new end of probation (or on a pin list) */
    obj->touched = ++st->policy_clock;
    if (list_of(obj) != KVP_POLICY_PROBATION)
        return;
    if (ssd_only(st, obj)) {
        kvp_policy_move(st, obj, KVP_POLICY_SSD, false);
        return;
    }
    bool gate = deepest_first(st); /* as the puts before this one left it */
    bool from_prob = kvp_ghost_has(&st->ghost, obj->hash, KVP_GHOST_PROBATION);
    bool from_prot = !from_prob && kvp_ghost_has(&st->ghost, obj->hash, KVP_GHOST_PROTECTED);
    st->recent_puts++;
    st->recent_returns += from_prob || from_prot;
    if (from_prob) {
        bias_by(st, -1); /* probation's victims come back: keep them longer */
        kvp_policy_move(st, obj, KVP_POLICY_PROTECTED, false);
    } else if (from_prot) {
        bias_by(st, +1); /* protected's victims come back: keep them longer */
        kvp_policy_move(st, obj, KVP_POLICY_PROTECTED, false);
    } else if (deepest && gate)
        kvp_policy_move(st, obj, KVP_POLICY_PROBATION, true);
}

void kvp_policy_read_start(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (list_of(obj) != KVP_POLICY_PINNED && list_of(obj) != KVP_POLICY_READING)
        kvp_policy_move(st, obj, KVP_POLICY_READING, false);
}

unsigned kvp_policy_home(const kvp_master_state_t *st, const kvp_object_t *obj)
{
    if (obj->pin == KVP_PIN_HARD)
        return KVP_POLICY_PINNED;
    if (obj->flags & KVP_OBJ_F_OFFLOADING)
        return KVP_POLICY_OFFLOADING;
    if (kvp_policy_soft_pin_live(st, obj))
        return KVP_POLICY_SOFT;
    return ssd_only(st, obj) ? KVP_POLICY_SSD : KVP_POLICY_PROTECTED;
}

void kvp_policy_read_end(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (list_of(obj) == KVP_POLICY_READING)
        kvp_policy_move(st, obj, kvp_policy_home(st, obj), false);
}

void kvp_policy_read(kvp_master_state_t *st, kvp_object_t *obj)
{
    if (list_of(obj) == KVP_POLICY_PROBATION || list_of(obj) == KVP_POLICY_PROTECTED ||
        list_of(obj) == KVP_POLICY_SSD)
        kvp_policy_move(
            st, obj, list_of(obj) == KVP_POLICY_SSD ? KVP_POLICY_SSD : KVP_POLICY_PROTECTED, false);
}
