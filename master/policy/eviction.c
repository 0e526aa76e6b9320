/*
 * eviction.c - keeping a full pool useful: which objects go when a put
 * needs room, and the put timeout that reclaims zombie PENDING objects.
 *
 * Policy: an age-biased LRU over two lists, the bias learnt from a ghost
 * (docs/architecture.md, "Eviction"; chosen by simulation over every
 * workload class, docs/benchmarks.md, "Eviction policy"). KV-cache blocks
 * come in prefix chains (block i is worth nothing once a block before it
 * is gone); some workloads write most blocks once and never read them
 * again (one-hit blocks should go first: 2Q), others put a conversation's
 * new blocks once and first read them at its next turn, many thousands
 * of blocks later (they must stay as long as LRU keeps them). One fixed
 * rule would fit one kind and lose on the other, so:
 *   - every object carries obj->touched, the policy clock (one tick per
 *     put or read) when it was last put or read (the PENDING put timeout's
 *     field: a COMPLETE object has none, so it costs no byte).
 *   - probation: objects put and not read since; protected: objects read
 *     at least once (or put again while the ghost remembers them). Both are
 *     in touched order, oldest first (a read counts when it ends).
 *   - the victim is the head of probation while it is older than the head
 *     of protected by more than -probation_bias ticks, i.e. while
 *     probation.head->touched < protected.head->touched + bias, else the
 *     head of protected (the other list when one is empty). bias 0 is plain
 *     LRU over both lists; a large bias is 2Q (probation first); a negative
 *     one keeps new puts longer than old reads.
 *   - ghost: the keys of the last 1-2 x (objects resident) victims and the
 *     list each one left, in one pair of Bloom filters (2.5-5 bytes per
 *     resident object: 10 bits per key, rounded up to a power of two). A
 *     key put again while the ghost remembers it goes to protected and
 *     moves the bias: a probation victim back lowers it, a protected one
 *     raises it, each by KVP_POLICY_BIAS_STEP ticks x the ratio of the
 *     other list's victims remembered to its own (ARC's weighting: hits
 *     count per victim a list gave), within +-KVP_POLICY_BIAS_LIMIT x the
 *     objects on the two lists. It settles where a victim of either list is
 *     as likely to come back. Ticks, not objects: the bias compares ages.
 *   - reading: objects with a read in flight (a lease held). Eviction never
 *     looks at them; when the lease ends they go to protected's new end.
 *   - pinned (hard pins) and soft (soft pins, in pin order): hard pins are
 *     never victims; soft pins only in a second pass, when nothing else is
 *     left, and an expired soft pin at the head of its list moves to
 *     probation's evict end with the time of its last put or read, an
 *     ordinary (old) object again.
 *   - chain order: PutEnd and GetReplicaList handle their keys last to
 *     first, and the client hands a batch's leases back last key first, so
 *     the first block of a chain ends up the most recent and a chain is
 *     eaten from its tail, never from its head. The last key of a PutEnd
 *     batch of several keys (the deepest block of a chain, the least shared)
 *     goes to the evict end of probation, as old as its head, while victims
 *     come back: at least 1 in KVP_POLICY_RETURN_RATIO (20) of the recent
 *     puts is a key the ghost remembers (counted over a window of about the
 *     resident objects' number of victims). Below that the pool keeps nearly
 *     everything asked for again, LRU is at Belady's level, and a fresh block
 *     evicted ahead of LRU's victim can only cost a miss LRU does not have.
 * Replayed with the real handlers (sim_eviction, the hit-rate unit test)
 * it is at or above exact LRU at 2-50 % of the unique blocks on every
 * generated class and on the FAST'25 synthetic trace, and closes about a
 * quarter of the LRU -> Belady gap on average. Every hook and every victim
 * is O(1): objects that cannot go (being read, pinned) are on lists
 * eviction never walks, so the head of probation or protected is a victim. The one exception is an
 * object on a draining segment (being moved away): it is passed over and
 * moves to the new end of its list. One search looks at each at most
 * once, but while a drain runs, every search of a list whose head is all
 * draining objects passes over them again: O(objects left on the draining
 * segment) per victim, until the drain ends (known cost, drains are rare
 * and short).
 *
 * Tenants (an ACL; master/meta/tenant.h): when the DRAM is shared by tenants and some hold
 * at least their share (the [tenant NAME] section's `share` of DRAM, else an equal part of
 * what the configured shares leave, among the tenants that hold DRAM) while others hold
 * less, victims come from the tenants at or over their share first: an object of a tenant
 * under its share at the evict end moves to its list's new end (order kept among them), as
 * a draining one does, so one tenant's burst cannot flush another's working set. When no
 * tenant is over its share any more, or none of theirs is left on the lists, the run goes
 * on in plain policy order. Cost: O(tenants) per run to set the shares, and each object
 * passed over is moved once per scan.
 *
 * Object groups (meta/group.h): an object whose group is leased (the group's lease
 * expiry, set by a read of a member) or has a member being read (the group's count of
 * members with a lease slot) is passed over (as a draining one is), an O(1) check; a
 * victim takes the members of its group that may go (evict_group: each checked as a
 * victim is), O(members) once per group.
 *
 * Eviction is on demand: a put that does not fit evicts just what it
 * needs (PutStart, rpc/object_calls.c); the watermarks (off by default) can keep
 * headroom besides. With an SSD tier mounted, DRAM victims are offloaded
 * to it (policy/tier.c), in the background from --offload-high-watermark
 * on, and what is counted here is DRAM: a victim being offloaded frees its
 * room only when its copy is durable. PENDING objects are on no policy list, so never
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
#include "master/policy/eviction.h"
#include "master/policy/lease.h"
#include "master/policy/lists.h"
#include "master/policy/tier.h"

/* ---- victims ---- */

/* Objects on the scanned lists are neither being read nor pinned (other lists hold
 * those): what is left to check is the segment, and with tenant shares, its tenant. */
static bool evictable(kvp_master_state_t *st, const kvp_object_t *obj)
{
    /* an object on a draining segment is being moved away: evicting it frees no room
     * that new puts could use */
    if (kvp_segment_table_on_draining(&st->segments, obj))
        return false;
    /* a member of a group one of whose members is being read stays (Mooncake's group
     * eviction: a group with a leased member is passed over whole) */
    /* O(1): the group counts its members with a read lease slot (policy/lease.c; the slots
     * whose TTL is over are reaped before each run) and keeps one expiry for the lease a read
     * of any member gives them all; obj itself, on a scanned list, is not being read */
    const kvp_group_t *g = kvp_group_get(&st->groups, kvp_object_group(obj));
    if (g != NULL && (g->leased > 0 || g->lease_until_ms > st->now_ms))
        return false;
    if (!st->share_evict || obj->tenant >= st->tenants.n)
        return true;
    const kvp_tenant_t *t = &st->tenants.t[obj->tenant];
    return t->dram_bytes >= t->share_bytes;
}

/* Each tenant's share of DRAM for this run; true when some tenant holds at least its share
 * while another holds less (victims then come from the first kind first). */
static bool shares_set(kvp_master_state_t *st)
{
    if (!st->tenants_on || st->tenants.n < 2)
        return false;
    uint64_t cap = kvp_segment_table_capacity_tier(&st->segments, false);
    uint64_t fixed = 0, n_equal = 0;
    for (uint32_t i = 0; i < st->tenants.n; i++) {
        const kvp_tenant_t *t = &st->tenants.t[i];
        if (t->share_permille != 0)
            fixed += t->share_permille;
        else if (t->dram_bytes > 0)
            n_equal++;
    }
    uint64_t rest = fixed >= 1000 ? 0 : cap / 1000 * (1000 - fixed);
    bool over = false, under = false;
    for (uint32_t i = 0; i < st->tenants.n; i++) {
        kvp_tenant_t *t = &st->tenants.t[i];
        t->share_bytes = t->share_permille != 0 ? cap / 1000 * t->share_permille
                         : n_equal > 0          ? rest / n_equal
                                                : 0;
        if (t->dram_bytes == 0 && t->share_permille == 0)
            continue;
        if (t->dram_bytes >= t->share_bytes)
            over = true;
        else
            under = true;
    }
    return over && under;
}

/* Is a tenant still at or over its share (after a victim)? */
static bool any_over(const kvp_master_state_t *st)
{
    for (uint32_t i = 0; i < st->tenants.n; i++) {
        const kvp_tenant_t *t = &st->tenants.t[i];
        if (t->dram_bytes > 0 && t->dram_bytes >= t->share_bytes)
            return true;
    }
    return false;
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
    while (ix->soft.head != NULL && !kvp_policy_soft_pin_live(st, ix->soft.head))
        kvp_policy_move(st, ix->soft.head, KVP_POLICY_PROBATION, true); /* stamp kept */
    if (take_soft)
        return scan(st, &ix->soft);
    bool probation_first;
    if (ix->probation.head == NULL || ix->protected.head == NULL)
        probation_first = ix->protected.head == NULL;
    else
        probation_first = (int64_t)(ix->probation.head->touched - ix->protected.head->touched) <
                          st->probation_bias;
    kvp_object_list_t *first = probation_first ? &ix->probation : &ix->protected;
    kvp_object_list_t *second = probation_first ? &ix->protected : &ix->probation;
    kvp_object_t *obj = scan(st, first);
    if (obj == NULL)
        obj = scan(st, second);
    if (obj == NULL && st->share_evict) { /* none of the tenants over their share is left */
        st->share_evict = false;
        return victim(st, take_soft);
    }
    if (obj != NULL && st->share_evict)
        st->stats.evicted_share++;
    return obj;
}

/* One DRAM victim goes: dropped, or offloaded to SSD (its room free when the copy is
 * durable). Counted in *freed_p (bytes free now), *used_p, *count_p. */
static void evict_one(kvp_master_state_t *st, kvp_object_t *obj, uint64_t *freed_p,
                      uint64_t *used_p, uint64_t *count_p)
{
    uint64_t bytes = kvp_object_bytes(obj);
    kvp_tier_victim_t what = kvp_tier_victim(st, obj);
    if (what == KVP_TIER_DROP) {
        kvp_state_object_gone(st, obj);
        bool prot = (obj->policy & KVP_POLICY_LIST_MASK) == KVP_POLICY_PROTECTED;
        kvp_index_unlink(&st->index, obj);
        kvp_ghost_add(&st->ghost, obj->hash, prot ? KVP_GHOST_PROTECTED : KVP_GHOST_PROBATION,
                      st->index.count - st->index.pending);
        kvp_object_release(st, obj);
        kvp_policy_victim(st);
    }
    if (what != KVP_TIER_OFFLOAD)
        *freed_p += bytes;
    *used_p = bytes < *used_p ? *used_p - bytes : 0;
    (*count_p)++;
}

/* May a member of an evicted object's group go with it? The checks a victim passes:
 * complete, on a list eviction scans (not being read, not hard-pinned, not on its way to
 * or from SSD; soft-pinned only in the soft pass or when its pin is over), evictable. */
static bool member_goes(kvp_master_state_t *st, const kvp_object_t *m, bool take_soft)
{
    if (m->state != KVP_OBJ_COMPLETE || (m->flags & KVP_OBJ_F_COPYING))
        return false;
    switch (m->policy & KVP_POLICY_LIST_MASK) {
    case KVP_POLICY_PROBATION:
    case KVP_POLICY_PROTECTED:
        break;
    case KVP_POLICY_SOFT:
        if (!take_soft && kvp_policy_soft_pin_live(st, m))
            return false;
        break;
    default:
        return false;
    }
    return evictable(st, m);
}

/*
 * The victim of group gid went: the group's other members that may go, go too (Mooncake's
 * group eviction: a victim expands to its group's current members, each checked as a victim
 * is). At most GROUP_TURN members are looked at in one call of the eviction; a larger group's
 * others go at the next ones (kvp_evict_if_needed: each loop tick and each put), GROUP_TURN a
 * call over all such groups, so that no eviction holds the loop for a whole group (65 536
 * members: 26 ms). The members are walked from the last one down: one that leaves the group
 * meanwhile hands its place to the last member, one already looked at, and a member that
 * joins meanwhile is not taken (it is newer than the victim).
 */
#define GROUP_TURN 4096u

/* Look at the members of e's group below its cursor, at most *budget_p of them; true: done
 * (none left, or the group is gone). */
static bool group_members_go(kvp_master_state_t *st, struct kvp_group_eviction *e,
                             uint32_t *budget_p, uint64_t *freed_p, uint64_t *used_p,
                             uint64_t *count_p)
{
    bool ssd = kvp_tier_has_ssd(st);
    kvp_group_t *g;
    while ((g = kvp_group_get(&st->groups, e->gid)) != NULL && e->cursor > 0 && *budget_p > 0) {
        if (ssd && kvp_tier_offload_full(st))
            return true; /* (a hint, not a promise: the others go by the policy alone) */
        if (e->cursor > g->n)
            e->cursor = g->n; /* members left by other ways: the last ones took their place */
        if (e->cursor == 0)
            break;
        kvp_object_t *m = g->members[--e->cursor];
        (*budget_p)--;
        if (!member_goes(st, m, e->take_soft))
            continue;
        evict_one(st, m, freed_p, used_p, count_p); /* (may free the group: looked up again) */
        st->stats.group_evicted++;
    }
    return g == NULL || e->cursor == 0;
}

static void evict_group(kvp_master_state_t *st, uint32_t gid, bool take_soft, uint64_t *freed_p,
                        uint64_t *used_p, uint64_t *count_p)
{
    const kvp_group_t *g = kvp_group_get(&st->groups, gid);
    if (g == NULL || g->n == 0)
        return;
    for (uint32_t i = 0; i < st->n_group_evictions; i++)
        if (st->group_evictions[i].gid == gid)
            return; /* going already */
    struct kvp_group_eviction e = {.gid = gid, .cursor = g->n, .take_soft = take_soft};
    uint32_t budget = GROUP_TURN;
    if (group_members_go(st, &e, &budget, freed_p, used_p, count_p))
        return;
    if (st->n_group_evictions == st->cap_group_evictions) {
        uint32_t cap = st->cap_group_evictions ? 2 * st->cap_group_evictions : 8;
        struct kvp_group_eviction *a = realloc(st->group_evictions, cap * sizeof(*a));
        if (a == NULL)
            return; /* (a hint: the others go by the policy alone) */
        st->group_evictions = a;
        st->cap_group_evictions = cap;
    }
    kvp_group_hold(&st->groups, gid); /* its id not reused while it is here */
    st->group_evictions[st->n_group_evictions++] = e;
}

void kvp_evict_groups_continue(kvp_master_state_t *st)
{
    uint32_t budget = GROUP_TURN;
    uint64_t freed = 0, used = 0, count = 0;
    while (st->n_group_evictions > 0 && budget > 0) {
        struct kvp_group_eviction *e = &st->group_evictions[0];
        if (!group_members_go(st, e, &budget, &freed, &used, &count))
            break;
        uint32_t gid = e->gid;
        memmove(e, e + 1, --st->n_group_evictions * sizeof(*e));
        kvp_group_drop(&st->groups, gid); /* (freed now if it is empty) */
    }
    if (count > 0) {
        st->stats.evictions++;
        st->stats.evicted_objects += count;
        st->stats.evicted_bytes += freed;
    }
}

/* DRAM bytes in use, less what the offloads in flight free when they end. */
static uint64_t dram_used(const kvp_master_state_t *st)
{
    uint64_t used = kvp_segment_table_used_tier(&st->segments, false);
    return used > st->offloading_bytes ? used - st->offloading_bytes : 0;
}

uint64_t kvp_evict_to(kvp_master_state_t *st, uint64_t target)
{
    kvp_lease_expire(st); /* leases whose TTL is over give their objects back first */
    uint64_t used = dram_used(st);
    if (!st->config.evict || used <= target)
        return 0;
    uint64_t freed = 0, count = 0;
    bool ssd = kvp_tier_has_ssd(st);
    /* the SSD tier's segments are all adopting (an owner restarted): no victim could go
     * there yet, and dropping them would lose what SSD keeps a moment later */
    if (ssd && kvp_tier_ssd_adopting(st)) {
        st->stats.offload_adopt_waits++;
        return 0;
    }
    st->share_evict = shares_set(st);
    for (int pass = 0; pass < 2 && used > target; pass++) {
        kvp_object_t *obj;
        /* with an SSD tier, victims go there; when offloads are at their bound the
         * puts wait for them (POOL_BUSY) rather than drop objects SSD could keep */
        while (used > target && !(ssd && kvp_tier_offload_full(st)) &&
               (obj = victim(st, pass == 1)) != NULL) {
            uint32_t gid = kvp_object_group(obj);
            evict_one(st, obj, &freed, &used, &count);
            evict_group(st, gid, pass == 1, &freed, &used, &count);
            if (st->share_evict && !any_over(st))
                st->share_evict = false;
        }
    }
    st->share_evict = false;
    if (count > 0) {
        st->stats.evictions++;
        st->stats.evicted_objects += count;
        st->stats.evicted_bytes += freed;
        KVP_LOG_DEBUG("evicted %llu objects (%llu bytes freed now)", (unsigned long long)count,
                      (unsigned long long)freed);
    }
    return freed;
}

void kvp_evict_if_needed(kvp_master_state_t *st)
{
    if (st->n_group_evictions > 0)
        kvp_evict_groups_continue(st);
    bool ssd = kvp_tier_has_ssd(st);
    uint64_t cap = kvp_segment_table_capacity_tier(&st->segments, false);
    /* with an SSD tier, DRAM keeps headroom by offloading in the background */
    double high = ssd ? st->config.offload_high : st->config.evict_high;
    double low = ssd ? st->config.offload_low : st->config.evict_low;
    if (cap > 0 && (double)dram_used(st) > high * (double)cap)
        kvp_evict_to(st, (uint64_t)(low * (double)cap));
    uint64_t scap = kvp_segment_table_capacity_tier(&st->segments, true);
    if (scap > 0 && (double)kvp_segment_table_used_tier(&st->segments, true) >
                        st->config.ssd_evict_high * (double)scap)
        kvp_tier_evict_ssd_to(st, (uint64_t)(st->config.ssd_evict_low * (double)scap));
    uint64_t dcap = st->segments.capacity_dfs;
    if (dcap > 0 && st->config.dfs_evict && st->now_ms >= st->rebuild_until_ms &&
        (double)kvp_tier_dfs_used(st, -1) > st->config.dfs_evict_high * (double)dcap)
        kvp_tier_evict_dfs_to(st, (uint64_t)(st->config.dfs_evict_low * (double)dcap), -1);
}

unsigned kvp_expire_puts(kvp_master_state_t *st)
{
    /* The pending list is in deadline order (a put joins its tail with now + put_timeout_ms,
     * a fixed setting, on a monotonic clock): the walk ends at the first put still in time,
     * costing what expires, never every put pending. */
    unsigned n = 0;
    kvp_object_t *obj;
    while ((obj = st->index.pending_list.head) != NULL && obj->deadline_ms <= st->now_ms) {
        kvp_index_unlink(&st->index, obj);
        if (st->index.pending_list.head == obj)
            break; /* (not indexed: never so) */
        kvp_object_release(st, obj);
        n++;
    }
    if (n > 0) {
        st->stats.put_timeouts += n;
        KVP_LOG_INFO("revoked %u puts not ended within %u ms", n, st->config.put_timeout_ms);
    }
    return n;
}
