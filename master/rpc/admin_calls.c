/*
 * admin_calls.c - the master's operator RPCs: Ping, Stat, List, RemoveByRegex.
 *
 * Design: List returns keys matching a POSIX extended regex, paged by
 * bucket cursor (a key present for the whole scan is returned at least
 * once; one that moves buckets when the table grows may be returned
 * twice), at most PAGE_SCAN_BUDGET buckets per call. RemoveByRegex removes
 * every COMPLETE matching object (or all); PENDING ones and, without force,
 * leased ones are skipped and counted. A pattern's removal goes page by page
 * as List does (paged, cursor / next_cursor; the client library goes on until
 * the cursor is 0), each page's matches removed before the answer.
 *
 * A pattern is checked and bounded by key_pattern.c (no back-references, a bounded
 * written-out size), runs only over keys the caller may see (may_key before the match,
 * so no other tenant's keys cost it anything), and each request has a budget of matching
 * work ((key length + 1) * pattern size per key) and of time: a List page past
 * PAGE_WORK_BUDGET or PAGE_WORK_MS ends early at a bucket's end with its cursor (the page
 * may be empty; the caller goes on, as after PAGE_SCAN_BUDGET buckets), and so does a
 * paged RemoveByRegex's page; an unpaged RemoveByRegex past them removes nothing and
 * answers KVP_ERR_INVALID_ARG with why (it collects before it removes). So one request
 * holds the loop (every other caller) up for about PAGE_WORK_MS at most. Refusals are
 * counted by reason (stats.refused_pattern, kvpool_patterns_refused_total).
 *
 * Thread: master loop only.
 */
#include "master/rpc/admin_calls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/macros.h"
#include "master/match/key_pattern.h"
#include "master/rpc/reply.h"
#include "master/policy/lease.h"
#include "master/policy/tier.h"
#include "master/core/event_sink.h"

#define LIST_DEFAULT 100u
#define LIST_MAX 1000u
/* Buckets one List call (or one page of a paged RemoveByRegex) scans at most, so a filter
 * that matches little stays cheap. */
#define PAGE_SCAN_BUDGET 65536u
/* Matching work one page may do (a List page, a page of a paged RemoveByRegex, a whole
 * unpaged one; units: key bytes times the pattern's written-out size, key_pattern.h), and
 * the time it may take (a safety net: the units' cost varies). Every page is one turn of
 * the master's loop, so this bounds how long one caller holds every other one up. A simple
 * pattern (cost ~16 with the ^.*() around it) over keys of 50 bytes: ~80 000 keys a page. */
#define PAGE_WORK_BUDGET (1ull << 26)
#define PAGE_WORK_MS 10u

kvp_status_t kvp_handle_ping(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    (void)call, (void)req_msg;
    return KVP_OK; /* an empty response */
}

kvp_status_t kvp_handle_auth(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    (void)call;
    (void)req_msg;
    return KVP_ERR_UNSUPPORTED; /* no --acl-file: this master takes no token */
}

/*
 * A Stat segment as the caller may have it: with an ACL, a principal that neither is an
 * admin nor mounted the segment gets what `kvpool stat` shows (name, medium, endpoint,
 * size, use, draining), not what only serves to reach or impersonate its owner: the
 * owner's client id, host id, shared-memory name and rdma address.
 */
static void stat_desc_for_caller(const kvp_call_t *call, const kvp_segment_t *seg,
                                 Kvpool__SegmentDesc *d)
{
    kvp_seg_desc_for_caller(call, seg, d);
    if (kvp_call_owns_segment(call, seg, true))
        return;
    d->host_id = "";
    d->shm_path = "";
    d->rdma_endpoint = "";
    d->rdma_addr = 0;
    d->rdma_rkey = 0;
}

kvp_status_t kvp_handle_stat(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    (void)req_msg; /* Stat takes no arguments: its body is ignored */
    kvp_master_state_t *st = call->st;
    Kvpool__StatResponse resp = KVPOOL__STAT_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    size_t n = st->segments.count;
    Kvpool__SegmentStat *ss = kvp_reply_calloc(&r, n, sizeof(*ss));
    Kvpool__SegmentStat **sp = kvp_reply_calloc(&r, n, sizeof(*sp));
    Kvpool__SegmentDesc *ds = kvp_reply_calloc(&r, n, sizeof(*ds));
    if (!ss || !sp || !ds)
        return kvp_reply_abort(&r);
    size_t k = 0;
    uint64_t used = 0;
    for (uint32_t i = 0; i < st->segments.n_slots; i++) {
        kvp_segment_t *seg = st->segments.slots[i];
        if (seg == NULL)
            continue;
        kvpool__segment_stat__init(&ss[k]);
        kvp_seg_desc_fill(&ds[k], seg);
        stat_desc_for_caller(call, seg, &ds[k]);
        ss[k].desc = &ds[k];
        ss[k].used = kvp_segment_stored(seg);
        ss[k].objects = kvp_segment_objects(seg);
        used += ss[k].used;
        sp[k] = &ss[k];
        k++;
    }
    resp.capacity = st->segments.capacity;
    resp.used = used;
    resp.objects = st->index.count - st->index.pending;
    resp.pending = st->index.pending - KVP_MIN(st->holds, st->index.pending); /* puts only */
    resp.evicted_objects = st->stats.evicted_objects;
    resp.evicted_bytes = st->stats.evicted_bytes;
    resp.put_timeouts = st->stats.put_timeouts;
    resp.moved_objects = st->stats.moved;
    resp.reading_objects = st->leases.live;
    resp.reading_bytes = st->leases.bytes;
    resp.leases_released = st->leases.released;
    resp.leases_expired = st->leases.expired;
    resp.ssd_capacity = st->segments.capacity_ssd;
    resp.ssd_used = kvp_segment_table_used_tier(&st->segments, true);
    resp.offloaded_objects = st->stats.offloaded;
    resp.offload_dropped = st->stats.offload_dropped;
    resp.offload_failed = st->stats.offload_failed;
    resp.promoted_objects = st->stats.promoted;
    resp.hits_dram = st->stats.hits_dram;
    resp.hits_ssd = st->stats.hits_ssd;
    resp.ssd_evicted_objects = st->stats.ssd_evicted;
    resp.adopted_objects = st->stats.adopted;
    resp.adopt_refused = st->stats.adopt_refused;
    resp.taken_back = st->stats.taken_back;
    resp.limbo_expired = st->stats.limbo_expired;
    resp.leader = (char *)st->leader;
    resp.epoch = st->epoch;
    resp.standbys = (char *)st->standbys;
    resp.ssd_lost_objects = st->stats.ssd_lost;
    resp.offloading_objects = st->offloading;
    resp.n_segments = k;
    resp.segments = sp;
    return kvp_reply_send(&r);
}

/* A pattern refused (the reply's text says why): KVP_ERR_INVALID_ARG, counted by reason and
 * logged (rate-limited) with who sent it. */
static kvp_status_t pattern_refused(kvp_reply_t *r, kvp_key_pattern_refusal_t why,
                                    const char *method)
{
    kvp_call_t *call = r->call;
    call->st->stats.refused_pattern[why]++;
    KVP_LOG_WARN_LIMITED("connection %llu: %s of principal %s refused (%s): %s",
                         (unsigned long long)call->conn_id, method,
                         call->who != NULL ? call->who->name : "(no ACL)",
                         kvp_key_pattern_reason(why), r->text);
    return kvp_reply_fail(r, KVP_ERR_INVALID_ARG, NULL);
}

/* A key needed more of the matcher than one key may take: the request is refused (nothing
 * listed or removed from the page), counted as work. */
static kvp_status_t key_over_refused(kvp_reply_t *r, const char *pattern, const char *method)
{
    snprintf(r->text, r->text_max,
             "pattern '%.100s' needs more matching work on one key than a key may take (%u "
             "steps of the matcher): nothing was %s; use a simpler pattern (an anchored "
             "prefix '^...' costs least)",
             pattern, KVP_KEY_PATTERN_KEY_STEPS_MAX,
             strcmp(method, "List") == 0 ? "listed" : "removed");
    return pattern_refused(r, KVP_PATTERN_WORK, method);
}

/* Check and compile a caller's pattern into kp (then kvp_key_pattern_cleanup it); false:
 * refused, the reply's text says why (*why_p the reason). */
static bool pattern_compile(kvp_reply_t *r, const char *pattern, kvp_key_pattern_t *kp,
                            kvp_key_pattern_refusal_t *why_p)
{
    *why_p = kvp_key_pattern_init(kp, pattern, r->text, r->text_max);
    return *why_p == KVP_PATTERN_OK;
}

/*
 * Key namespaces without an ACL. A client given a tenant_id and no credential that binds a
 * tenant (docs/python.md, "Tenant ids") stores its keys as TENANT 0x1f KEY itself, as the
 * master does for an ACL's tenants, and a client of no tenant_id escapes a key that reads
 * as prefixed as "default" 0x1f KEY (client/control/key_scope.c). List and RemoveByRegex
 * name the namespace (key_namespace): then only its keys are seen, as the client gave them.
 * The namespace comes from the client: without an ACL no request has an authority, and
 * this keeps tenants from meeting by accident, as Mooncake's tenant_id does.
 */

/* Is a stored key in namespace ns (NULL: any)? */
static bool in_namespace(const char *ns, const char *key, size_t len)
{
    if (ns == NULL)
        return true;
    size_t p = kvp_tenant_prefix_len(key, len);
    if (strcmp(ns, KVP_TENANT_DEFAULT) == 0)
        return p == 0 ||
               (p == sizeof(KVP_TENANT_DEFAULT) - 1 && memcmp(key, KVP_TENANT_DEFAULT, p) == 0);
    return p == strlen(ns) && memcmp(key, ns, p) == 0;
}

/* The key as its tenant gave it (with tenants or a namespace, after the prefix;
 * master/meta/tenant.h). */
static const char *user_key(const kvp_master_state_t *st, const char *ns, const kvp_object_t *obj,
                            size_t *len_p)
{
    *len_p = obj->key_len;
    return st->tenants_on || ns != NULL
               ? kvp_tenant_user_key(kvp_object_key(obj), obj->key_len, len_p)
               : kvp_object_key(obj);
}

/* Does obj's key (as its tenant gave it) match? Charges kp's work. */
static bool key_matches(const kvp_master_state_t *st, const char *ns, const kvp_object_t *obj,
                        kvp_key_pattern_t *kp)
{
    if (kp == NULL)
        return true;
    size_t len;
    const char *k = user_key(st, ns, obj, &len);
    return kvp_key_pattern_match(kp, k, len);
}

/*
 * The namespace a List or RemoveByRegex names (*ns_p; NULL: none). Without an ACL, a
 * tenant's name or "default"; with one, the principal's own tenant only (the master
 * scopes by the credential then, and *ns_p stays NULL). false: refused, r says why.
 */
static bool request_namespace(kvp_reply_t *r, const char *asked, const char **ns_p,
                              kvp_status_t *st_p)
{
    const kvp_call_t *call = r->call;
    *ns_p = NULL;
    if (asked == NULL || asked[0] == '\0')
        return true;
    if (!kvp_tenant_name_valid(asked, strlen(asked))) {
        *st_p =
            kvp_reply_fail(r, KVP_ERR_INVALID_ARG,
                           "key_namespace is no tenant name (1..63 bytes of A-Z a-z 0-9 . _ -)");
        return false;
    }
    if (call->who != NULL) {
        if (strcmp(asked, call->who->tenant) == 0)
            return true;
        *st_p = kvp_reply_fail(r, KVP_ERR_DENIED,
                               "tenant_id %s is not the tenant of principal %s (%s): its "
                               "credential names its tenant",
                               asked, call->who->name, call->who->tenant);
        return false;
    }
    *ns_p = asked;
    return true;
}

static bool on_segment(const kvp_object_t *obj, uint64_t segment_id)
{
    if (segment_id == 0)
        return true;
    for (unsigned r = 0; r < obj->n_replicas; r++)
        if (obj->replicas[r].segment_id == segment_id)
            return true;
    return false;
}

/* May the caller see / remove obj? An admin: every object; others: their tenant's, within
 * their key patterns. */
static bool may_key(const kvp_call_t *call, const char *ns, const kvp_object_t *obj)
{
    const kvp_principal_t *who = call->who;
    if (who == NULL)
        return in_namespace(ns, kvp_object_key(obj), obj->key_len);
    if (who->roles & KVP_ROLE_ADMIN)
        return true;
    if (call->st->tenants_on && obj->tenant != who->tenant_id)
        return false;
    size_t len;
    const char *k = user_key(call->st, NULL, obj, &len);
    return kvp_principal_may_key(who, k, len);
}

/* A segment's owner listing its own segment (a drain), or an admin listing one. */
static bool own_segment(const kvp_call_t *call, uint64_t segment_id)
{
    const kvp_principal_t *who = call->who;
    if (who == NULL || (who->roles & KVP_ROLE_ADMIN))
        return true;
    const kvp_segment_t *seg =
        segment_id != 0 ? kvp_segment_table_get(&call->st->segments, segment_id) : NULL;
    return (who->roles & KVP_ROLE_SEGMENT) && seg != NULL && seg->owner_conn_id == call->conn_id;
}

/* List: a reader (its keys), or a segment's owner listing its own segment (a drain). */
static bool may_list(const kvp_call_t *call, uint64_t segment_id, bool stored_keys)
{
    const kvp_principal_t *who = call->who;
    if (stored_keys)
        return segment_id != 0 && own_segment(call, segment_id);
    return who == NULL || (who->roles & KVP_ROLE_READ) || own_segment(call, segment_id);
}

/* A page of List entries under construction: its arrays grow past their first room for a
 * pathological chain (a bucket is finished once started). */
typedef struct list_page {
    Kvpool__ListEntry *ents;
    Kvpool__ListEntry **entp;
    Kvpool__Replica *reps;
    Kvpool__Replica **repp;
    size_t n, nr, cap; /* entries, replicas, room for entries */
} list_page_t;

static bool list_page_init(list_page_t *p, size_t cap)
{
    *p = (list_page_t){.cap = cap};
    p->ents = calloc(cap, sizeof(*p->ents));
    p->entp = calloc(cap, sizeof(*p->entp));
    p->reps = calloc(cap * KVP_MAX_REPLICAS, sizeof(*p->reps));
    p->repp = calloc(cap * KVP_MAX_REPLICAS, sizeof(*p->repp));
    return p->ents && p->entp && p->reps && p->repp;
}

/* Twice the room (rare; chains average below one). false: out of memory. */
static bool list_page_grow(list_page_t *p)
{
    size_t ncap = p->cap * 2;
    Kvpool__ListEntry *ne = realloc(p->ents, ncap * sizeof(*ne));
    if (ne == NULL)
        return false;
    p->ents = ne;
    Kvpool__ListEntry **np = realloc(p->entp, ncap * sizeof(*np));
    if (np == NULL)
        return false;
    p->entp = np;
    Kvpool__Replica *nrp = realloc(p->reps, ncap * KVP_MAX_REPLICAS * sizeof(*nrp));
    if (nrp == NULL)
        return false;
    /* entries point into reps through repp: rebuild those pointers */
    p->reps = nrp;
    Kvpool__Replica **nrpp = realloc(p->repp, ncap * KVP_MAX_REPLICAS * sizeof(*nrpp));
    if (nrpp == NULL)
        return false;
    p->repp = nrpp;
    for (size_t q = 0; q < p->nr; q++)
        p->repp[q] = &p->reps[q];
    size_t at = 0;
    for (size_t e = 0; e < p->n; e++) {
        p->entp[e] = &p->ents[e];
        p->ents[e].replicas = &p->repp[at];
        at += p->ents[e].n_replicas;
    }
    p->cap = ncap;
    return true;
}

/* The reply's end: the page goes (kvp_reply_end_cb_t). */
static void list_page_free(kvp_reply_t *r, kvp_status_t rc, void *arg)
{
    (void)r, (void)rc;
    list_page_t *p = arg;
    free(p->ents);
    free(p->entp);
    free(p->reps);
    free(p->repp);
}

/* Append obj to the page (room made): its key (as stored, or as its tenant gave it), its
 * state and its replicas. */
static void list_page_add(const kvp_master_state_t *st, const char *ns, list_page_t *p,
                          const kvp_object_t *obj, bool stored)
{
    Kvpool__ListEntry *e = &p->ents[p->n];
    kvpool__list_entry__init(e);
    size_t klen = obj->key_len;
    e->key.data = (uint8_t *)(stored ? kvp_object_key(obj) : user_key(st, ns, obj, &klen));
    e->key.len = klen;
    if (st->tenants_on && !stored) /* whose key (an admin sees every tenant's) */
        e->tenant = st->tenants.t[obj->tenant < st->tenants.n ? obj->tenant : 0].name;
    e->size = obj->size;
    e->state = obj->state;
    e->pin = obj->pin;
    e->crc32c = obj->crc32c;
    if (obj->state == KVP_OBJ_COMPLETE)
        e->lease_ms = (uint32_t)KVP_MIN(kvp_lease_left_ms(st, obj), UINT32_MAX);
    e->replicas = &p->repp[p->nr];
    e->n_replicas = 0;
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        if (obj->replicas[r].segment_id == 0)
            continue; /* a PENDING object's replica whose segment went away */
        e->n_replicas++;
        kvpool__replica__init(&p->reps[p->nr]);
        p->reps[p->nr].segment_id = obj->replicas[r].segment_id;
        p->reps[p->nr].offset = obj->replicas[r].offset;
        p->reps[p->nr].length = obj->size;
        p->repp[p->nr] = &p->reps[p->nr];
        p->nr++;
    }
    p->entp[p->n] = e;
    p->n++;
}

/*
 * Fill the page from the request's cursor: whole buckets, until `limit` entries,
 * PAGE_SCAN_BUDGET buckets or PAGE_WORK_BUDGET of matching work. The first bucket is always
 * scanned (as remove_scan does): a page cut before it would answer its own cursor, and from
 * cursor 0 that reads as "the end" (an empty listing). *next_p: the bucket to go on from
 * (0: the end). false: out of memory.
 */
static bool list_scan(const kvp_call_t *call, const Kvpool__ListRequest *req, const char *ns,
                      kvp_key_pattern_t *kp, uint32_t limit, list_page_t *p, uint64_t *next_p)
{
    const kvp_master_state_t *st = call->st;
    /* a drain moves what its segment holds, whoever's it is: keys as stored */
    bool stored = req->stored_keys;
    uint64_t b = req->cursor;
    uint64_t scanned = 0;
    for (;
         b < st->index.n_buckets && p->n < limit && scanned < PAGE_SCAN_BUDGET &&
         (kp == NULL || scanned == 0 || !kvp_key_pattern_over(kp, PAGE_WORK_BUDGET, PAGE_WORK_MS));
         b++, scanned++) {
        for (kvp_object_t *obj = st->index.buckets[b]; obj != NULL; obj = obj->hnext) {
            /* whose key it is first: the pattern runs over the caller's keys only (a hold,
             * PUT_COMMIT's room placed ahead, is nobody's key) */
            if ((obj->flags & KVP_OBJ_F_HOLD) || !on_segment(obj, req->segment_id) ||
                (!stored && !may_key(call, ns, obj)) ||
                !key_matches(st, stored ? NULL : ns, obj, kp))
                continue;
            if (p->n == p->cap && !list_page_grow(p))
                return false;
            list_page_add(st, stored ? NULL : ns, p, obj, stored);
        }
    }
    *next_p = b < st->index.n_buckets ? b : 0;
    return true;
}

kvp_status_t kvp_handle_list(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__ListRequest *req = (Kvpool__ListRequest *)req_msg;
    Kvpool__ListResponse resp = KVPOOL__LIST_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 256);
    uint32_t limit = req->limit == 0 ? LIST_DEFAULT : KVP_MIN(req->limit, LIST_MAX);
    if (!may_list(call, req->segment_id, req->stored_keys)) {
        if (call->who == NULL)
            return kvp_reply_deny(&r, "stored keys are listed by segment only");
        return kvp_reply_deny(&r,
                              "principal %s may not list%s: that needs role read (or role "
                              "segment, for a segment it serves itself)",
                              call->who->name, req->stored_keys ? " stored keys" : "");
    }
    if (req->cursor > st->index.n_buckets)
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG, "cursor %llu is past the end of the table",
                              (unsigned long long)req->cursor);
    const char *ns;
    kvp_status_t refused;
    if (!request_namespace(&r, req->key_namespace, &ns, &refused))
        return refused;
    kvp_key_pattern_t *kp = NULL;
    kvp_key_pattern_refusal_t why;
    if (req->pattern[0] != '\0') {
        kp = malloc(sizeof(*kp));
        if (kp == NULL)
            return kvp_reply_abort(&r);
        if (!pattern_compile(&r, req->pattern, kp, &why)) {
            free(kp);
            return pattern_refused(&r, why, "List");
        }
    }
    list_page_t page;
    kvp_reply_on_end(&r, list_page_free, &page);
    /* a bucket is finished once started, so a page may pass the limit by a chain */
    bool ok = list_page_init(&page, limit + 64) &&
              list_scan(call, req, ns, kp, limit, &page, &resp.next_cursor);
    bool key_over = kp != NULL && kp->key_over;
    if (kp != NULL) {
        kvp_key_pattern_cleanup(kp);
        free(kp);
    }
    if (!ok)
        return kvp_reply_abort(&r);
    if (key_over)
        return key_over_refused(&r, req->pattern, "List");
    resp.entries = page.entp;
    resp.n_entries = page.n;
    return kvp_reply_send(&r);
}

/* What a RemoveByRegex removes, collected before it is removed (removal unlinks from the
 * chains being walked). */
typedef struct {
    kvp_object_t **v;
    size_t n, cap;
} victims_t;

static bool victims_add(victims_t *vs, kvp_object_t *obj)
{
    if (vs->n == vs->cap) {
        size_t cap = vs->cap ? vs->cap * 2 : 256;
        kvp_object_t **v = realloc(vs->v, cap * sizeof(*v));
        if (v == NULL)
            return false;
        vs->v = v;
        vs->cap = cap;
    }
    vs->v[vs->n++] = obj;
    return true;
}

/* Collect what a RemoveByRegex removes, whole buckets from the request's cursor (paged) or
 * from the start, until the table's end or a page's budget of matching work (and, paged,
 * of buckets); the first bucket is always scanned, so a paged removal always goes on.
 * *next_p: the bucket to go on from, 0 at the end. False: out of memory (what was
 * collected stays in vs). */
static bool remove_scan(const kvp_call_t *call, const Kvpool__RemoveByRegexRequest *req,
                        const char *ns, bool paged, kvp_key_pattern_t *kp, victims_t *vs,
                        Kvpool__RemoveByRegexResponse *resp, uint64_t *next_p)
{
    const kvp_master_state_t *st = call->st;
    uint64_t b = paged ? req->cursor : 0;
    bool ok = true;
    for (uint64_t scanned = 0; ok && b < st->index.n_buckets; b++, scanned++) {
        if (scanned > 0 &&
            ((paged && scanned >= PAGE_SCAN_BUDGET) ||
             (kp != NULL && kvp_key_pattern_over(kp, PAGE_WORK_BUDGET, PAGE_WORK_MS))))
            break;
        for (kvp_object_t *obj = st->index.buckets[b]; ok && obj != NULL; obj = obj->hnext) {
            /* whose key it is first: the pattern runs over the caller's keys only */
            if ((obj->flags & KVP_OBJ_F_HOLD) || !may_key(call, ns, obj) ||
                !key_matches(st, ns, obj, kp))
                continue;
            if (obj->state != KVP_OBJ_COMPLETE)
                resp->skipped_pending++;
            else if (kvp_leased(st, obj) && !req->force)
                resp->skipped_leased++;
            else
                ok = victims_add(vs, obj);
        }
    }
    *next_p = b < st->index.n_buckets ? b : 0;
    return ok;
}

/* Remove what remove_scan collected: a tombstone each (what an SSD segment's owner, down now,
 * kept must not come back) and KV events (remove-all: `cleared` on both media, then `stored`
 * again for what stays, objects being read without force; a pattern: one `removed` each). */
static void remove_victims(kvp_master_state_t *st, const Kvpool__RemoveByRegexRequest *req,
                           bool all, const victims_t *vs)
{
    if (all)
        st->tombstones.cleared = kvp_tier_next_version(st);
    const kvp_event_sink_t *ev = all ? st->events : NULL;
    st->events = ev != NULL ? NULL : st->events;
    for (size_t i = 0; i < vs->n; i++) {
        if (!all)
            kvp_tombstone_add(&st->tombstones, vs->v[i]->hash, kvp_tier_next_version(st));
        kvp_object_remove(st, vs->v[i]);
    }
    st->stats.removes += vs->n;
    if (ev != NULL) {
        st->events = ev;
        for (unsigned m = 0; m < KVP_MEDIUM_COUNT; m++)
            kvp_event_cleared(ev, (kvp_medium_t)m);
        for (uint64_t b = 0; b < st->index.n_buckets; b++)
            for (kvp_object_t *obj = st->index.buckets[b]; obj != NULL; obj = obj->hnext)
                if (obj->state == KVP_OBJ_COMPLETE)
                    kvp_state_media_event(st, obj, 0,
                                          kvp_state_media(st, obj->replicas, obj->n_replicas));
    }
    if (vs->n > 0)
        KVP_LOG_INFO("removed %zu objects matching %s%s", vs->n, req->all ? "(all)" : req->pattern,
                     req->force ? " (force)" : "");
}

kvp_status_t kvp_handle_remove_by_regex(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__RemoveByRegexRequest *req = (Kvpool__RemoveByRegexRequest *)req_msg;
    Kvpool__RemoveByRegexResponse resp = KVPOOL__REMOVE_BY_REGEX_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 256);
    kvp_key_pattern_t *kp = NULL;
    kvp_key_pattern_refusal_t why;
    if (req->all && call->who != NULL && !(call->who->roles & KVP_ROLE_ADMIN))
        return kvp_reply_deny(&r, "principal %s may not remove every object: that needs role admin",
                              call->who->name);
    if (!req->all && req->pattern[0] == '\0')
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG,
                              "an empty pattern removes nothing; ask for all instead");
    const char *ns;
    kvp_status_t refused;
    if (!request_namespace(&r, req->key_namespace, &ns, &refused))
        return refused;
    if (!req->all) {
        kp = malloc(sizeof(*kp));
        if (kp == NULL)
            return kvp_reply_abort(&r);
        if (!pattern_compile(&r, req->pattern, kp, &why)) {
            free(kp);
            return pattern_refused(&r, why, "RemoveByRegex");
        }
    }
    bool paged = req->paged && kp != NULL;
    victims_t vs = {0};
    uint64_t next = 0;
    if (!remove_scan(call, req, ns, paged, kp, &vs, &resp, &next))
        resp.status = KVP_ERR_NOMEM; /* what was collected is removed; the answer says so */
    bool over = kp != NULL && !paged && next != 0;
    bool key_over = kp != NULL && kp->key_over;
    if (kp != NULL) {
        kvp_key_pattern_cleanup(kp);
        free(kp);
    }
    if (key_over) {
        free(vs.v);
        resp.skipped_leased = resp.skipped_pending = 0;
        return key_over_refused(&r, req->pattern, "RemoveByRegex");
    }
    if (over) {
        free(vs.v);
        resp.skipped_leased = resp.skipped_pending = 0;
        snprintf(r.text, r.text_max,
                 "pattern '%.100s' needs more matching work than one request may do (%llu "
                 "units, key bytes times the pattern's size, or %u ms): nothing was removed; "
                 "ask page by page (paged, as kvpool's clients do) or use a simpler pattern "
                 "(an anchored prefix '^...' costs least)",
                 req->pattern, (unsigned long long)PAGE_WORK_BUDGET, PAGE_WORK_MS);
        return pattern_refused(&r, KVP_PATTERN_WORK, "RemoveByRegex");
    }
    remove_victims(st, req, req->all && ns == NULL, &vs); /* a namespace's all: its keys */
    resp.removed = vs.n;
    resp.next_cursor = paged ? next : 0;
    free(vs.v);
    return kvp_reply_send(&r);
}
