/*
 * placement.c - where a new object's replicas go.
 *
 * Replicas go to segments of one tier (req->ssd: SSD segments, req->dfs too: DFS
 * segments, else DRAM).
 * Replica 0 goes to the preferred segment when one is given and has room
 * (locality: a client's own segment is served through shm), else, when
 * near_host is given, to a segment of that host that has room (an offload
 * or a promotion stays on the host of its source). The rest are
 * drawn at random weighted by free bytes among segments not chosen yet,
 * first on hosts not used yet, then on any host. A segment whose allocator
 * refuses (fragmentation) is dropped from the draw and the draw repeated.
 * Tenants: a segment dedicated to a tenant takes only that tenant's objects,
 * and a tenant's objects go to its dedicated segments first, then to shared
 * ones (each draw is made among dedicated segments before shared ones).
 *
 * Thread: master loop only. O(segments) per replica.
 */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/rand.h"
#include "master/meta/placement.h"

static bool chosen(const kvp_replica_t *out, unsigned n, uint64_t id)
{
    for (unsigned i = 0; i < n; i++)
        if (out[i].segment_id == id)
            return true;
    return false;
}

static bool host_used(const kvp_segment_table_t *t, const kvp_replica_t *out, unsigned n,
                      const kvp_segment_t *seg)
{
    for (unsigned i = 0; i < n; i++) {
        const kvp_segment_t *o = kvp_segment_table_get(t, out[i].segment_id);
        if (o != NULL && strcmp(o->host_id, seg->host_id) == 0)
            return true;
    }
    return false;
}

bool kvp_placement_avoids(const kvp_placement_req_t *req, uint64_t id)
{
    for (unsigned a = 0; a < req->n_avoid && a < 8; a++)
        if (req->avoid[a] == id)
            return true;
    return false;
}

/* Is seg of the tier req asks for (DRAM, SSD or DFS)? */
static bool tier_ok(const kvp_segment_t *seg, const kvp_placement_req_t *req)
{
    return seg->ssd == req->ssd && seg->dfs == req->dfs;
}

/* May this tenant's objects go to seg (its own or a shared one)? */
static bool allowed(const kvp_segment_t *seg, uint16_t tenant)
{
    return !seg->dedicated || seg->tenant == tenant;
}

/* Can `seg` take one more replica of req->size in this draw (dedicated: only the tenant's
 * own segments)? Writes its free bytes. */
static bool eligible(const kvp_segment_table_t *t, const kvp_replica_t *out, unsigned n,
                     const kvp_segment_t *seg, bool distinct_hosts, const uint64_t *excluded,
                     unsigned n_excl, const kvp_placement_req_t *req, bool dedicated,
                     uint64_t *free_p)
{
    if (seg == NULL || !kvp_segment_open(seg) || !tier_ok(seg, req) || !allowed(seg, req->tenant) ||
        (dedicated && !seg->dedicated) || chosen(out, n, seg->id) ||
        (distinct_hosts && host_used(t, out, n, seg)) ||
        (seg->quiet_until_ms != 0 && kvp_segment_quiet(seg, kvp_now_ms())))
        return false;
    for (unsigned e = 0; e < n_excl; e++)
        if (excluded[e] == seg->id)
            return false;
    *free_p = kvp_segment_usable(seg) - kvp_segment_used(seg);
    return *free_p >= req->size;
}

static bool try_alloc(kvp_segment_t *seg, uint64_t size, kvp_replica_t *r)
{
    uint64_t off;
    uint32_t h;
    if (kvp_offset_alloc_alloc(seg->alloc, size, &off, &h) != KVP_OK)
        return false;
    r->segment_id = seg->id;
    r->offset = off;
    r->handle = h;
    seg->objects++;
    return true;
}

kvp_status_t kvp_placement_alloc(kvp_segment_table_t *table, const kvp_placement_req_t *req,
                                 uint64_t *rng_state, kvp_replica_t *out, unsigned *n_p)
{
    if (table->count == 0)
        return KVP_ERR_NO_SEGMENT;
    /* only segments that take new replicas count: not draining ones */
    bool fits_any = false, any = false;
    for (uint32_t i = 0; i < table->n_slots; i++) {
        const kvp_segment_t *seg = table->slots[i];
        if (seg == NULL || !kvp_segment_open(seg) || !tier_ok(seg, req) ||
            !allowed(seg, req->tenant))
            continue;
        any = true;
        if (kvp_segment_usable(seg) >= req->size)
            fits_any = true;
    }
    if (!any)
        return KVP_ERR_NO_SEGMENT;
    if (!fits_any)
        return KVP_ERR_TOO_LARGE;

    unsigned want = req->replica_num ? req->replica_num : 1;
    if (want > KVP_MAX_REPLICAS)
        want = KVP_MAX_REPLICAS;
    unsigned n = 0;
    const kvp_segment_t *const *pref =
        req->n_preferred_list > 0 ? req->preferred_list : &req->preferred;
    unsigned n_pref = req->n_preferred_list > 0 ? req->n_preferred_list : 1;
    /* (a segment mounted again takes no new replica yet, preferred or near or not) */
    uint64_t now = kvp_now_ms();
    for (unsigned k = 0; k < n_pref && n < want; k++) {
        const kvp_segment_t *p = pref[k];
        if (p != NULL && kvp_segment_open(p) && tier_ok(p, req) && allowed(p, req->tenant) &&
            !kvp_segment_quiet(p, now) && !kvp_placement_avoids(req, p->id) &&
            !chosen(out, n, p->id))
            n += try_alloc((kvp_segment_t *)p, req->size, &out[n]);
    }
    for (uint32_t i = 0; n == 0 && req->near_host != NULL && i < table->n_slots; i++) {
        kvp_segment_t *seg = table->slots[i];
        if (seg != NULL && kvp_segment_open(seg) && tier_ok(seg, req) &&
            allowed(seg, req->tenant) && !kvp_segment_quiet(seg, now) &&
            strcmp(seg->host_id, req->near_host) == 0 &&
            kvp_segment_usable(seg) - kvp_segment_used(seg) >= req->size &&
            !kvp_placement_avoids(req, seg->id))
            n += try_alloc(seg, req->size, &out[n]);
    }

    /* excluded[]: segments that refused this object (full or fragmented), and in the first
     * pass the ones the writer asked us to avoid; the second pass (only when the first left
     * replicas unplaced) may use those */
    uint64_t excluded[64 + 8];
    unsigned n_excl = 0;
    unsigned n_avoid = req->n_avoid < 8 ? req->n_avoid : 8;
    for (int pass = n_avoid > 0 ? 0 : 1; pass < 2 && n < want; pass++) {
        n_excl = 0;
        for (unsigned a = 0; pass == 0 && a < n_avoid; a++)
            excluded[n_excl++] = req->avoid[a];
        /* rounds: (dedicated, distinct hosts), (any, distinct hosts), (dedicated, any host),
         * (any, any host); the dedicated rounds only for a tenant's object */
        for (int round = 0; round < 4 && n < want; round++) {
            bool dedicated = round % 2 == 0, distinct_hosts = round < 2;
            if (dedicated && !req->dedicated_first)
                continue;
            while (n < want) {
                uint64_t total = 0, free_b;
                for (uint32_t i = 0; i < table->n_slots; i++)
                    if (eligible(table, out, n, table->slots[i], distinct_hosts, excluded, n_excl,
                                 req, dedicated, &free_b))
                        total += free_b;
                if (total == 0)
                    break;
                uint64_t pick = kvp_rng_next(rng_state) % total;
                kvp_segment_t *sel = NULL;
                for (uint32_t i = 0; i < table->n_slots && sel == NULL; i++) {
                    if (!eligible(table, out, n, table->slots[i], distinct_hosts, excluded, n_excl,
                                  req, dedicated, &free_b))
                        continue;
                    if (pick < free_b)
                        sel = table->slots[i];
                    else
                        pick -= free_b;
                }
                if (sel == NULL)
                    break;
                if (try_alloc(sel, req->size, &out[n])) {
                    n++;
                } else if (n_excl < sizeof(excluded) / sizeof(excluded[0])) {
                    excluded[n_excl++] = sel->id;
                } else {
                    break;
                }
            }
        }
    }
    if (n == 0)
        return KVP_ERR_POOL_FULL;
    *n_p = n;
    return KVP_OK;
}

kvp_status_t kvp_placement_alloc_on(kvp_segment_t *seg, uint64_t size, uint16_t tenant,
                                    kvp_replica_t *out)
{
    if (!kvp_segment_open(seg) || !allowed(seg, tenant))
        return KVP_ERR_INVALID_ARG;
    return try_alloc(seg, size, out) ? KVP_OK : KVP_ERR_POOL_FULL;
}
