/*
 * prometheus.c - the master's /metrics in the Prometheus text format (0.0.4):
 * capacity, usage and objects per tier and per segment, operation counters,
 * control-RPC latency histograms per method, clients, segments, HA state and
 * the KV events publisher. Every metric is listed in docs/operations.md.
 * The per-tenant series (they name the ACL's tenants) are rendered only when
 * asked (http_views.c: an admin's scrape, or --metrics-tenants on).
 *
 * Thread: the master loop (http_views.c hands it the request). O(segments + methods).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/etcd.h"
#include "common/http.h"
#include "common/macros.h"
#include "master/match/key_pattern.h"
#include "master/meta/limbo.h"
#include "master/obs/http_views.h"

const uint32_t kvp_rpc_bucket_us[KVP_RPC_BUCKETS - 1] = {10,   25,   50,   100,   250,  500,
                                                         1000, 2500, 5000, 10000, 50000};

static void head(kvp_http_reply_t *r, const char *name, const char *type, const char *help)
{
    kvp_http_printf(r, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(kvp_http_reply_t *r, const char *name, const char *type, const char *help,
                uint64_t v)
{
    head(r, name, type, help);
    kvp_http_printf(r, "%s %" PRIu64 "\n", name, v);
}

/* A label value with \ " and newlines escaped. */
static void label(kvp_http_reply_t *r, const char *s);

/* One line per tenant of a per-tenant metric: NAME{tenant="T"[,EXTRA]} V. */
static void tenant_line(kvp_http_reply_t *r, const char *name, const kvp_tenant_t *t,
                        const char *extra, uint64_t v)
{
    kvp_http_printf(r, "%s{tenant=\"", name);
    label(r, t->name);
    kvp_http_printf(r, "\"%s} %" PRIu64 "\n", extra, v);
}

/* With an ACL: what each tenant holds, its quotas and what they refused (names from the
 * ACL; the tenant "default" holds the keys stored as given, those before it too); by_name
 * false: only what names no tenant. */
static void tenants(kvp_http_reply_t *r, const kvp_master_state_t *st, bool by_name)
{
    if (!st->tenants_on)
        return;
        /* each metric: the kvp_tenant_t field it shows, and for a metric by tier the SSD
         * field besides (the first being DRAM's); NO_TIER: one line per tenant */
#define NO_TIER SIZE_MAX
#define F(x) offsetof(kvp_tenant_t, x)
    static const struct {
        const char *name, *type, *help;
        size_t field, ssd_field;
    } m[] = {
        {"kvpool_tenant_bytes", "gauge", "Bytes a tenant's objects take, by tier (each replica).",
         F(dram_bytes), F(ssd_bytes)},
        {"kvpool_tenant_objects", "gauge", "Objects of a tenant (being put ones included).",
         F(objects), NO_TIER},
        {"kvpool_tenant_quota_bytes", "gauge",
         "A tenant's quota of bytes by tier (max-dram, max-ssd; 0: none).", F(max_dram),
         F(max_ssd)},
        {"kvpool_tenant_quota_objects", "gauge", "A tenant's quota of objects (0: none).",
         F(max_objects), NO_TIER},
        {"kvpool_tenant_puts_refused_total", "counter", "Puts refused for a tenant's quota.",
         F(refused_quota), NO_TIER},
        {"kvpool_tenant_admission_closed", "gauge",
         "1 while a tenant's admission is closed (its quota deleted through "
         "/api/v1/tenant_quotas): no put of it is admitted.",
         F(closed), NO_TIER},
        {"kvpool_tenant_dedicated_segments", "gauge",
         "Segments dedicated to a tenant (kvpool serve --tenant).", F(dedicated), NO_TIER},
    };
#undef F
    for (size_t k = 0; by_name && k < KVP_ARRAY_SIZE(m); k++) {
        head(r, m[k].name, m[k].type, m[k].help);
        for (uint32_t i = 0; i < st->tenants.n; i++) {
            const kvp_tenant_t *t = &st->tenants.t[i];
            const char *base = (const char *)t;
            bool tiers = m[k].ssd_field != NO_TIER;
            tenant_line(r, m[k].name, t, tiers ? ",tier=\"dram\"" : "",
                        *(const uint64_t *)(base + m[k].field));
            if (tiers)
                tenant_line(r, m[k].name, t, ",tier=\"ssd\"",
                            *(const uint64_t *)(base + m[k].ssd_field));
        }
    }
#undef NO_TIER
    one(r, "kvpool_evicted_share_total", "counter",
        "Victims taken from a tenant at or over its share of DRAM, passing others' objects.",
        st->stats.evicted_share);
}
static void label(kvp_http_reply_t *r, const char *s)
{
    for (const char *p = s; *p; p++) {
        if (*p == '\\' || *p == '"')
            kvp_http_printf(r, "\\%c", *p);
        else if (*p == '\n')
            kvp_http_append(r, "\\n", 2);
        else
            kvp_http_append(r, p, 1);
    }
}

static void per_segment(kvp_http_reply_t *r, const kvp_master_state_t *st, const char *name,
                        const char *help, int what)
{
    head(r, name, "gauge", help);
    const kvp_segment_table_t *t = &st->segments;
    for (uint32_t i = 0; i < t->n_slots; i++) {
        const kvp_segment_t *seg = t->slots[i];
        if (seg == NULL)
            continue;
        uint64_t v = what == 0   ? seg->size
                     : what == 1 ? kvp_segment_stored(seg)
                                 : kvp_segment_objects(seg);
        kvp_http_printf(r, "%s{segment=\"", name);
        label(r, seg->name);
        kvp_http_printf(r, "\",tier=\"%s\"} %" PRIu64 "\n",
                        seg->dfs   ? "dfs"
                        : seg->ssd ? "ssd"
                                   : "dram",
                        v);
    }
}

/* Capacity, usage, objects and segments by tier; the index; the same per segment. */
static void capacity(kvp_http_reply_t *r, const kvp_master_state_t *st)
{
    const kvp_segment_table_t *t = &st->segments;
    uint64_t cap[3] = {0}, used[3] = {0}, objs[3] = {0}, segs[3] = {0};
    for (uint32_t i = 0; i < t->n_slots; i++) {
        const kvp_segment_t *seg = t->slots[i];
        if (seg == NULL)
            continue;
        int k = seg->dfs ? 2 : seg->ssd ? 1 : 0;
        cap[k] += seg->size;
        used[k] += kvp_segment_stored(seg);
        objs[k] += kvp_segment_objects(seg);
        segs[k]++;
    }
    static const char *tiers[3] = {"dram", "ssd", "dfs"};
    const uint64_t *tv[3] = {cap, used, objs};
    static const char *tn[3][2] = {
        {"kvpool_capacity_bytes", "Bytes of the mounted segments of the tier."},
        {"kvpool_used_bytes", "Bytes allocated to objects on the tier."},
        {"kvpool_objects", "Object replicas stored on the tier's segments."},
    };
    for (int m = 0; m < 3; m++) {
        head(r, tn[m][0], "gauge", tn[m][1]);
        for (int k = 0; k < 3; k++)
            kvp_http_printf(r, "%s{tier=\"%s\"} %" PRIu64 "\n", tn[m][0], tiers[k], tv[m][k]);
    }
    head(r, "kvpool_segments", "gauge", "Mounted segments of the tier.");
    for (int k = 0; k < 3; k++)
        kvp_http_printf(r, "kvpool_segments{tier=\"%s\"} %" PRIu64 "\n", tiers[k], segs[k]);
    uint64_t holds = KVP_MIN(st->holds, st->index.pending);
    one(r, "kvpool_keys", "gauge", "Keys in the index (complete and being written).",
        st->index.count - holds);
    one(r, "kvpool_pending_objects", "gauge", "Puts started and not ended.",
        st->index.pending - holds);
    one(r, "kvpool_put_holds", "gauge",
        "Holds (room PUT_COMMIT placed ahead of a client's puts, no key's yet).", holds);
    one(r, "kvpool_put_held_bytes", "gauge", "Bytes of DRAM the holds take (x replicas).",
        st->held_bytes);
    per_segment(r, st, "kvpool_segment_capacity_bytes", "Bytes of the segment.", 0);
    per_segment(r, st, "kvpool_segment_used_bytes", "Bytes allocated on the segment.", 1);
    per_segment(r, st, "kvpool_segment_objects", "Object replicas on the segment.", 2);
    one(r, "kvpool_ssd_tasks", "gauge",
        "SSD tier tasks (offload, record, promote, forget) queued for or sent to their segments' "
        "owners and not answered yet.",
        st->n_tasks);
}

/* Hot keys: those whose bytes were copied (read --hot-key-reads times in a window). */
static uint64_t hot_keys(const kvp_master_state_t *st)
{
    uint64_t n = 0;
    for (uint32_t i = 0; st->hot != NULL && i <= st->hot_mask; i++)
        n += st->hot[i].key != NULL;
    return n;
}

/* PUT_COMMIT's holds (room placed ahead of a client's puts): handed out, used, gone. */
static void holds(kvp_http_reply_t *r, const kvp_master_stats_t *s)
{
    one(r, "kvpool_put_holds_granted_total", "counter",
        "Holds handed out by PUT_COMMIT (room placed ahead for one object each).",
        s->holds_granted);
    one(r, "kvpool_put_holds_used_total", "counter", "Holds a committed key took.", s->holds_used);
    one(r, "kvpool_put_holds_gone_total", "counter",
        "Holds a commit named that were gone (put timeout, closed connection, restart).",
        s->holds_gone);
}

/* Operation counters: puts, gets, removes, evictions, tiers, leases, adoption, limbo. */
static void operations(kvp_http_reply_t *r, const kvp_master_state_t *st)
{
    const kvp_master_stats_t *s = &st->stats;
    one(r, "kvpool_puts_total", "counter", "Puts ended (objects made visible).", s->puts);
    one(r, "kvpool_gets_total", "counter", "Keys asked for by gets.", s->gets);
    head(r, "kvpool_get_hits_total", "counter", "Gets that found the object, by the tier read.");
    kvp_http_printf(r, "kvpool_get_hits_total{tier=\"dram\"} %" PRIu64 "\n", s->hits_dram);
    kvp_http_printf(r, "kvpool_get_hits_total{tier=\"ssd\"} %" PRIu64 "\n", s->hits_ssd);
    kvp_http_printf(r, "kvpool_get_hits_total{tier=\"dfs\"} %" PRIu64 "\n", s->hits_dfs);
    one(r, "kvpool_dfs_puts_total", "counter", "Puts given a DFS replica (dfs_replica_num 1).",
        s->dfs_puts);
    one(r, "kvpool_dfs_full_total", "counter",
        "Puts refused because no DFS segment had room for their DFS replica.", s->dfs_full);
    one(r, "kvpool_get_misses_total", "counter", "Gets that found no object.", s->get_misses);
    one(r, "kvpool_exists_total", "counter", "Keys asked whether they exist.", s->exists);
    one(r, "kvpool_removes_total", "counter", "Objects removed (remove, remove by regex).",
        s->removes);
    one(r, "kvpool_tasks_created_total", "counter", "Copy and move tasks created.",
        s->tasks_created);
    head(r, "kvpool_tasks_ended_total", "counter", "Copy and move tasks ended, by outcome.");
    kvp_http_printf(r, "kvpool_tasks_ended_total{outcome=\"success\"} %" PRIu64 "\n",
                    s->tasks_succeeded);
    kvp_http_printf(r, "kvpool_tasks_ended_total{outcome=\"failed\"} %" PRIu64 "\n",
                    s->tasks_failed);
    one(r, "kvpool_tasks_live", "gauge", "Copy and move tasks waiting or running.",
        st->copy_tasks.n_live);
    head(r, "kvpool_tasks_refused_total", "counter",
         "Copy and move tasks refused (KVP_ERR_TOO_MANY), by the cap they met: the caller's "
         "tenant's (--max-tasks-per-tenant) or the master's.");
    kvp_http_printf(r,
                    "kvpool_tasks_refused_total{reason=\"tenant\"} %" PRIu64 "\n"
                    "kvpool_tasks_refused_total{reason=\"master\"} %" PRIu64 "\n",
                    st->copy_tasks.refused_tenant, st->copy_tasks.refused_master);
    one(r, "kvpool_hot_keys", "gauge",
        "Keys read --hot-key-reads times a second or more lately, or holding replicas for it.",
        hot_keys(st));
    one(r, "kvpool_hot_replicas_added_total", "counter", "Replicas given to hot keys.",
        s->hot_added);
    one(r, "kvpool_hot_replicas_dropped_total", "counter",
        "Replicas taken back from hot keys that cooled.", s->hot_dropped);
    one(r, "kvpool_evictions_total", "counter", "Objects evicted from DRAM (dropped or offloaded).",
        s->evicted_objects);
    one(r, "kvpool_evicted_bytes_total", "counter", "Bytes freed by evictions.", s->evicted_bytes);
    one(r, "kvpool_eviction_runs_total", "counter", "Eviction runs.", s->evictions);
    one(r, "kvpool_ssd_evictions_total", "counter", "Objects dropped from the SSD tier.",
        s->ssd_evicted);
    one(r, "kvpool_dfs_evictions_total", "counter",
        "DFS copies freed by DFS eviction (least recently used first).", s->dfs_evicted);
    one(r, "kvpool_dfs_orphaned_total", "counter",
        "DFS segments kept, their objects readable, after their owner went silent.",
        s->dfs_orphaned);
    one(r, "kvpool_dfs_taken_over_total", "counter",
        "Objects of an ownerless DFS segment handed to the next owner of its shard file.",
        s->dfs_taken_over);
    one(r, "kvpool_dfs_evicted_objects_total", "counter",
        "Objects removed by DFS eviction (they had no copy on another tier).",
        s->dfs_evicted_objects);
    one(r, "kvpool_offloads_total", "counter", "Objects copied from DRAM to SSD.", s->offloaded);
    one(r, "kvpool_offload_failures_total", "counter", "Offloads that failed.", s->offload_failed);
    one(r, "kvpool_offload_dropped_total", "counter",
        "DRAM victims dropped because no SSD segment had room.", s->offload_dropped);
    one(r, "kvpool_offload_adoption_waits_total", "counter",
        "DRAM evictions put off while every SSD segment was adopting (its owner restarted).",
        s->offload_adopt_waits);
    one(r, "kvpool_promotions_total", "counter", "Objects copied back from SSD to DRAM.",
        s->promoted);
    one(r, "kvpool_lease_waits_total", "counter",
        "Removes refused for a read lease and puts told to wait for room (POOL_BUSY).",
        s->lease_waits);
    one(r, "kvpool_leases_expired_total", "counter", "Read leases ended by their TTL.",
        st->leases.expired);
    /* object groups (meta/group.h) */
    const struct {
        const char *name, *type, *help;
        uint64_t v;
    } groups[] = {
        {"kvpool_groups", "gauge", "Object groups with members (all tenants).", st->groups.live},
        {"kvpool_group_members", "gauge", "Objects in object groups.", st->groups.members},
        {"kvpool_group_refused_total", "counter",
         "Puts refused for their group_ids (another count than the keys, an id over 1024 "
         "bytes, an upsert that moves or clears an object's group).",
         s->group_refused},
        {"kvpool_group_lease_refreshes_total", "counter",
         "Reads or lookups of a grouped object that leased its group's other members.",
         s->group_lease_refreshes},
        {"kvpool_group_evicted_total", "counter",
         "Objects evicted with a victim of their object group.", s->group_evicted},
    };
    for (size_t i = 0; i < sizeof(groups) / sizeof(groups[0]); i++)
        one(r, groups[i].name, groups[i].type, groups[i].help, groups[i].v);
    head(r, "kvpool_lease_releases_refused_total", "counter",
         "Lease releases ignored, by reason (not_owner: the lease was granted to another "
         "principal, or without an ACL on another connection; unknown: no lease has the id: "
         "ended by its TTL, from before a restart, or made up).");
    kvp_http_printf(r,
                    "kvpool_lease_releases_refused_total{reason=\"not_owner\"} %" PRIu64 "\n"
                    "kvpool_lease_releases_refused_total{reason=\"unknown\"} %" PRIu64 "\n",
                    st->leases.refused_owner, st->leases.refused_unknown);
    one(r, "kvpool_put_timeouts_total", "counter", "Puts revoked by --put-timeout.",
        s->put_timeouts);
    one(r, "kvpool_adopted_total", "counter", "Objects segments brought back at (re)mount.",
        s->adopted);
    one(r, "kvpool_adopt_refused_total", "counter", "Stale entries segments offered back.",
        s->adopt_refused);
    uint64_t kept = 0;
    for (const kvp_limbo_t *l = st->limbo; l != NULL; l = l->next)
        kept += l->n;
    one(r, "kvpool_limbo_objects", "gauge",
        "Objects of DRAM segments dropped for silence, kept for their return (--segment-grace).",
        kept);
    one(r, "kvpool_taken_back_total", "counter",
        "Objects of a segment dropped for silence taken back when it mounted again.",
        s->taken_back);
    one(r, "kvpool_limbo_expired_total", "counter",
        "Objects of a segment dropped for silence that did not come back: its grace passed, "
        "it came back as other memory, or they were removed or overwritten meanwhile.",
        s->limbo_expired);
}

/* Batches of keys continued over loop turns, by method (those that ever were). */
static void continued(kvp_http_reply_t *r, const kvp_master_state_t *st, const kvp_master_view_t *v)
{
    head(r, "kvpool_requests_continued_total", "counter",
         "Times a batch of keys (PutStart, GetReplicaList, PutEnd, PutRevoke, Remove, Exist, "
         "ReplicaClear) "
         "reached its time budget in one loop turn and went on at its connection's next turn, "
         "by method.");
    for (size_t m = 0; m < v->n_methods && m <= KVP_RPC_METHOD_MAX; m++)
        if (v->method_names[m] != NULL && st->stats.keys_continued[m] > 0)
            kvp_http_printf(r, "kvpool_requests_continued_total{method=\"%s\"} %" PRIu64 "\n",
                            v->method_names[m], st->stats.keys_continued[m]);
}

/* Control-RPC latency by method: the loop's counters, named by the view's method table. */
static void rpc_latency(kvp_http_reply_t *r, const kvp_master_state_t *st,
                        const kvp_master_view_t *v)
{
    if (st->rpc_hist == NULL)
        return;
    head(r, "kvpool_rpc_duration_seconds", "histogram",
         "Time the master's loop spent on a control RPC, by method.");
    for (size_t m = 0; m < v->n_methods; m++) {
        const char *name = v->method_names[m];
        if (name == NULL)
            continue;
        const kvp_rpc_hist_t *h = &st->rpc_hist[m];
        uint64_t cum = 0;
        for (int b = 0; b < KVP_RPC_BUCKETS; b++) {
            cum += h->count[b];
            if (b < KVP_RPC_BUCKETS - 1)
                kvp_http_printf(r,
                                "kvpool_rpc_duration_seconds_bucket{method=\"%s\",le=\"%g\"} "
                                "%" PRIu64 "\n",
                                name, kvp_rpc_bucket_us[b] / 1e6, cum);
            else
                kvp_http_printf(r,
                                "kvpool_rpc_duration_seconds_bucket{method=\"%s\",le=\"+Inf\"} "
                                "%" PRIu64 "\n",
                                name, cum);
        }
        kvp_http_printf(r, "kvpool_rpc_duration_seconds_sum{method=\"%s\"} %.9f\n", name,
                        h->sum_ns / 1e9);
        kvp_http_printf(r, "kvpool_rpc_duration_seconds_count{method=\"%s\"} %" PRIu64 "\n", name,
                        cum);
    }
}

/* Clients, and what the ACL, protected mode and TLS refused. */
static void refusals(kvp_http_reply_t *r, const kvp_master_state_t *st, const kvp_master_view_t *v)
{
    const kvp_master_stats_t *s = &st->stats;
    one(r, "kvpool_clients", "gauge", "Client connections open.", st->clients);
    one(r, "kvpool_output_paused_total", "counter",
        "Times the master stopped reading a connection's requests because its peer did not read "
        "the replies (over 4 MiB queued for it, or --max-output-buffers for all).",
        s->output_paused);
    one(r, "kvpool_output_queued_bytes", "gauge",
        "Bytes of replies queued and not yet written to their peers, all connections.",
        s->output_queued);
    one(r, "kvpool_record_waits_total", "counter",
        "Times a connection's replies waited for a change they made to reach a DRAM segment "
        "owner's record stream (its socket was full: --record-wait).",
        s->record_waits);
    one(r, "kvpool_record_wait_expired_total", "counter",
        "Times such replies were sent after --record-wait without the change in the owner's "
        "socket (a kill -9 of the master then could lose it).",
        s->record_wait_expired);
    one(r, "kvpool_close_sweeps_total", "counter",
        "Connections closed with puts unfinished while more puts were pending than one loop "
        "turn walks: their puts were revoked by a walk continued over turns.",
        s->close_sweeps);
    one(r, "kvpool_record_streams_lost_total", "counter",
        "Record streams that closed with changes their owner never got (its record may miss "
        "them at a master restart).",
        s->record_lost);
    one(r, "kvpool_record_unsent_bytes", "gauge",
        "Bytes of record changes DRAM segments' owners have not received yet (queued here, or "
        "unacknowledged in their sockets): what a kill -9 of the master now would lose.",
        v->record_unsent != NULL ? v->record_unsent(&st->segments) : 0);
    kvp_http_printf(
        r,
        "# HELP kvpool_connections_refused_total Connections refused and closed, by reason "
        "(protected_mode: a peer of another host while no credentials are configured; tls: a "
        "failed TLS handshake; unauthenticated: a request before any credential; bad_token; "
        "principal_removed: its principal left the ACL; max_connections, "
        "max_connections_per_peer, max_connections_per_principal, max_unauthenticated, "
        "max_unauthenticated_per_peer: a cap "
        "reached, closing the new connection or the oldest unauthenticated one; descriptors: "
        "none left to accept with; auth_timeout, frame_timeout: a deadline passed; "
        "input_buffers: --max-input-buffers reached).\n"
        "# TYPE kvpool_connections_refused_total counter\n"
        "kvpool_connections_refused_total{reason=\"protected_mode\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"tls\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"unauthenticated\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"bad_token\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"principal_removed\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"max_connections\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"max_connections_per_peer\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"max_connections_per_principal\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"max_unauthenticated\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"max_unauthenticated_per_peer\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"descriptors\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"auth_timeout\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"frame_timeout\"} %" PRIu64 "\n"
        "kvpool_connections_refused_total{reason=\"input_buffers\"} %" PRIu64 "\n"
        "# HELP kvpool_requests_refused_total Requests of a known principal refused by the ACL, "
        "by reason (role: a method its roles do not allow; key: a key outside its patterns; "
        "decode_cost: a body that would decode into far more memory than its size, or with "
        "too many unknown fields, refused before decoding, with or without an ACL).\n"
        "# TYPE kvpool_requests_refused_total counter\n"
        "kvpool_requests_refused_total{reason=\"role\"} %" PRIu64 "\n"
        "kvpool_requests_refused_total{reason=\"key\"} %" PRIu64 "\n"
        "kvpool_requests_refused_total{reason=\"decode_cost\"} %" PRIu64 "\n"
        "# HELP kvpool_http_refused_total HTTP views refused (the views beyond /metrics and "
        "/health need an admin's bearer token when an ACL is on), by reason.\n"
        "# TYPE kvpool_http_refused_total counter\n"
        "kvpool_http_refused_total{reason=\"unauthenticated\"} %" PRIu64 "\n"
        "kvpool_http_refused_total{reason=\"role\"} %" PRIu64 "\n",
        s->refused_protected, s->refused_tls, s->refused_unauth, s->refused_token,
        s->refused_removed, s->refused_max_conns, s->refused_max_conns_peer,
        s->refused_max_conns_principal, s->refused_max_unauth, s->refused_max_unauth_peer,
        s->refused_descriptors, s->refused_auth_timeout, s->refused_frame_timeout,
        s->refused_input_buffers, s->refused_role, s->refused_key, s->refused_decode_cost,
        s->refused_http_unauth, s->refused_http_role);
}

/* Leadership and the etcd client's failures. */
static void ha(kvp_http_reply_t *r, const kvp_master_state_t *st, const kvp_master_view_t *v)
{
    one(r, "kvpool_leader", "gauge", "1 while this master serves (standalone or the leader).",
        v->serving ? 1 : 0);
    one(r, "kvpool_epoch", "gauge", "The epoch this master leads under (0: standalone).",
        st->epoch);
    uint64_t standbys = 0;
    for (const char *p = st->standbys; *p; p++)
        if (p == st->standbys || p[-1] == ',')
            standbys++;
    one(r, "kvpool_standbys", "gauge", "Standby masters registered in etcd.", standbys);
    kvp_etcd_stats_t ets;
    kvp_etcd_stats(&ets);
    static const char *const etcd_reasons[KVP_ETCD_FAIL_REASONS] = {"auth", "tls", "connect",
                                                                    "other"};
    head(r, "kvpool_etcd_requests_failed_total", "counter",
         "etcd requests of this master that failed, by reason (auth: etcd refused the user, "
         "password, token or permission; tls: etcd's certificate not verified or ours refused; "
         "connect: no endpoint reachable in time; other).");
    for (int i = 0; i < KVP_ETCD_FAIL_REASONS; i++)
        kvp_http_printf(r, "kvpool_etcd_requests_failed_total{reason=\"%s\"} %" PRIu64 "\n",
                        etcd_reasons[i], ets.failed[i]);
    one(r, "kvpool_etcd_authentications_total", "counter",
        "etcd tokens obtained with --etcd-user (the first ones and renewals).",
        ets.authentications);
    one(r, "kvpool_etcd_reauthentications_total", "counter",
        "Of those: after etcd refused a token (expired, or the auth store changed).",
        ets.reauthentications);
}

/* The KV events publisher. */
static void kv_events(kvp_http_reply_t *r, const kvp_master_view_t *v)
{
    kvp_events_stats_t es;
    kvp_events_stats(v->events, &es);
    one(r, "kvpool_kv_events_enabled", "gauge", "1 when KV events are published.",
        v->events != NULL);
    one(r, "kvpool_kv_events_queue_depth", "gauge", "KV events waiting to be sent.", es.queued);
    one(r, "kvpool_kv_events_published_total", "counter", "KV events sent.", es.published);
    one(r, "kvpool_kv_events_dropped_total", "counter",
        "KV events dropped because the queue was full.", es.dropped);
    one(r, "kvpool_kv_events_batches_total", "counter", "KV event batches sent.", es.batches);
    one(r, "kvpool_kv_events_cuts_total", "counter",
        "Allow-list reloads that removed a key and so closed every subscriber connection.",
        es.cuts);
    one(r, "kvpool_kv_events_curve", "gauge",
        "1 when KV event subscribers need CURVE and a key of the allow-list.", es.curve);
    head(r, "kvpool_kv_events_refused_total", "counter",
         "KV event subscribers refused: no CURVE or a failed handshake (curve), a key not "
         "in the allow-list (key), a subscription or replay of another tenant's stream "
         "(topic).");
    kvp_http_printf(r,
                    "kvpool_kv_events_refused_total{reason=\"curve\"} %" PRIu64 "\n"
                    "kvpool_kv_events_refused_total{reason=\"key\"} %" PRIu64 "\n"
                    "kvpool_kv_events_refused_total{reason=\"topic\"} %" PRIu64 "\n",
                    es.refused_curve, es.refused_key, es.refused_topic);
}

/* Claims on segments another principal mounted, refused (rpc/segment_calls.c,
 * record_calls.c). */
static void segment_claims(kvp_http_reply_t *r, const kvp_master_state_t *st)
{
    const kvp_master_stats_t *s = &st->stats;
    head(r, "kvpool_segment_claims_refused_total", "counter",
         "Requests refused for acting on a segment another principal mounted, by reason "
         "(record: SegRecord of its record; endpoint: a mount advertising a data endpoint "
         "its segment advertises; held: a mount of its name while the master holds what it "
         "held for --segment-grace; proof: a mount whose tcp endpoint did not prove it serves "
         "the segment, --mount-proof).");
    kvp_http_printf(r,
                    "kvpool_segment_claims_refused_total{reason=\"record\"} %" PRIu64 "\n"
                    "kvpool_segment_claims_refused_total{reason=\"endpoint\"} %" PRIu64 "\n"
                    "kvpool_segment_claims_refused_total{reason=\"held\"} %" PRIu64 "\n"
                    "kvpool_segment_claims_refused_total{reason=\"proof\"} %" PRIu64 "\n",
                    s->refused_seg_record, s->refused_seg_endpoint, s->refused_seg_held,
                    s->refused_seg_proof);
    head(r, "kvpool_names_refused_total", "counter",
         "Names refused for a NUL or control character in them, or a segment name with "
         "whitespace at an end, by reason (segment: a Mount's name; tenant: the tenant quota "
         "API's).");
    kvp_http_printf(r,
                    "kvpool_names_refused_total{reason=\"segment\"} %" PRIu64 "\n"
                    "kvpool_names_refused_total{reason=\"tenant\"} %" PRIu64 "\n",
                    s->refused_name_segment, s->refused_name_tenant);
}

/* List and RemoveByRegex patterns refused (master/match/key_pattern.h), by reason. */
static void patterns_refused(kvp_http_reply_t *r, const kvp_master_state_t *st)
{
    _Static_assert(KVP_PATTERN_REFUSALS <= KVP_ARRAY_SIZE(st->stats.refused_pattern),
                   "stats.refused_pattern has a slot per reason");
    head(r, "kvpool_patterns_refused_total", "counter",
         "List and remove-by-regex patterns refused with KVP_ERR_INVALID_ARG, by reason "
         "(too_long, syntax, backref: a back-reference, nesting: groups too deep, repeat: a "
         "count too large, cost: too large written out, work: more matching work than one "
         "request may do).");
    for (int i = KVP_PATTERN_OK + 1; i < KVP_PATTERN_REFUSALS; i++)
        kvp_http_printf(r, "kvpool_patterns_refused_total{reason=\"%s\"} %" PRIu64 "\n",
                        kvp_key_pattern_reason((kvp_key_pattern_refusal_t)i),
                        st->stats.refused_pattern[i]);
}

void kvp_master_metrics_render(kvp_http_reply_t *r, const kvp_master_state_t *st,
                               const kvp_master_view_t *v, bool tenant_names)
{
    capacity(r, st);
    operations(r, st);
    holds(r, &st->stats);
    rpc_latency(r, st, v);
    continued(r, st, v);
    refusals(r, st, v);
    patterns_refused(r, st);
    tenants(r, st, tenant_names);
    ha(r, st, v);
    kv_events(r, v);
    segment_claims(r, st);
}
