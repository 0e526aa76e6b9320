/*
 * state.h - everything the master's loop owns: the metadata (segment table,
 * object index), the policy's tables (read leases, the ghost), the drain
 * copies in flight, settings, counters and the master clock.
 *
 * One loop thread owns a kvp_master_state_t: no locks. Layers, each
 * including only those below it (tests/check_layering.py):
 *
 *   main.c, server.c   flags, epoll loop, connections, framing
 *   dispatch.c         the method table: method id -> handler
 *   obs/               HTTP views, metrics, the KV events publisher
 *   rpc/               handlers by concern (segment, object, drain, admin, task)
 *                      and what they share (rpc/call.c: the response packer)
 *   ha/                leadership (election glue), rebuild (adoption)
 *   auth/              ACL, credentials, admission, audit
 *   policy/            eviction -> lease -> lists: what stays, what goes; tiers,
 *                      copy tasks' life, the hot-key fanout
 *   core/              this struct, the settings, the KV event sink
 *   meta/              object, segment_table, object_index, placement,
 *                      lease_table, ghost, task_table: data structures that know no state
 *   match/             the key matcher (List's and RemoveByRegex's patterns)
 */
#ifndef KVP_MASTER_CORE_STATE_H
#define KVP_MASTER_CORE_STATE_H

#include <stdint.h>

#include "common/rpc.h"
#include "common/status.h"
#include "master/core/config.h"
#include "master/core/event_sink.h"
#include "master/meta/ghost.h"
#include "master/meta/group.h"
#include "master/meta/lease_table.h"
#include "master/meta/object.h"
#include "master/meta/object_index.h"
#include "master/meta/segment_table.h"
#include "master/meta/task_table.h"
#include "master/meta/tenant.h"

typedef struct kvp_master_stats {
    uint64_t evicted_objects;
    uint64_t evicted_bytes;
    uint64_t evictions;     /* eviction runs */
    uint64_t evicted_share; /* victims taken from a tenant over its share, passing others */
    uint64_t put_timeouts;  /* PENDING puts revoked by --put-timeout */
    /* PUT_COMMIT's holds (rpc/object_calls.c): handed out, taken by a key, named when gone */
    uint64_t holds_granted;
    uint64_t holds_used;
    uint64_t holds_gone;
    uint64_t moved; /* objects moved off draining segments */
    /* copy and move tasks (policy/copy_tasks.c): created, and ended each way */
    uint64_t tasks_created;
    uint64_t tasks_succeeded;
    uint64_t tasks_failed;
    uint64_t hot_added;   /* replicas given to hot keys */
    uint64_t hot_dropped; /* ... and taken back when they cooled */
    /* tiers (policy/tier.c) */
    uint64_t offloaded;
    uint64_t offload_dropped;     /* DRAM victims dropped: no SSD room */
    uint64_t offload_adopt_waits; /* DRAM evictions put off: every SSD segment adopting */
    uint64_t offload_failed;
    uint64_t promoted;
    uint64_t hits_dram;
    uint64_t hits_ssd;
    uint64_t hits_dfs; /* gets of objects on DFS only (policy/tier.c) */
    uint64_t dfs_puts; /* puts that asked for a DFS replica and got one (rpc/object_calls.c) */
    uint64_t dfs_full; /* ... refused: no DFS segment had room (KVP_ERR_POOL_FULL) */
    uint64_t ssd_evicted;
    uint64_t dfs_evicted;         /* DFS copies freed by DFS eviction (policy/tier.c) */
    uint64_t dfs_evicted_objects; /* ... of which objects on no other tier: removed */
    uint64_t dfs_orphaned;        /* DFS segments kept after their owner went silent */
    uint64_t dfs_taken_over;      /* ... objects handed to a new owner of their shard file */
    uint64_t adopted;             /* objects segments brought back at (re)mount (ha/rebuild.c) */
    uint64_t adopt_refused;       /* stale entries they offered: dropped, never served */
    uint64_t taken_back;          /* objects of a segment dropped for silence, taken back at its
                                   * remount (meta/limbo.c) */
    uint64_t limbo_expired;       /* ... dropped for good: the segment did not come back in time */
    uint64_t ssd_lost;            /* SSD objects found unreadable by an owner (promotion) */
    /* operations (master/obs/): per key or object, not per request */
    uint64_t puts;        /* puts ended (objects made visible) */
    uint64_t gets;        /* keys asked for replicas (GetReplicaList) */
    uint64_t get_misses;  /* ... that found nothing to read */
    uint64_t exists;      /* keys asked whether they exist */
    uint64_t removes;     /* objects removed (Remove, RemoveByRegex) */
    uint64_t lease_waits; /* removes refused for a read lease, puts told to wait (POOL_BUSY) */
    /* object groups (meta/group.h) */
    uint64_t group_refused;         /* puts refused for their group ids (moved, bad length) */
    uint64_t group_lease_refreshes; /* a group's members leased by a read of one */
    uint64_t group_evicted;         /* objects evicted with a victim of their group */
    uint64_t refused_protected;     /* connections of other hosts refused in protected mode */
    /* refusals of the ACL (master/auth/admission.c, dispatch.c; kvpool_connections_refused_total
     * and kvpool_requests_refused_total by reason) */
    uint64_t refused_tls;         /* a TLS handshake that failed (not TLS, unknown CA, revoked..) */
    uint64_t refused_unauth;      /* a request before any credential */
    uint64_t refused_token;       /* a wrong token */
    uint64_t refused_removed;     /* a principal removed from the ACL while connected */
    uint64_t refused_role;        /* a method its roles do not allow */
    uint64_t refused_key;         /* a key outside its patterns */
    uint64_t refused_decode_cost; /* a body that would decode into far more than its size
                                     (master/auth/decode_cost.h) */
    uint64_t refused_http_unauth; /* an HTTP view without an admin's bearer token */
    uint64_t refused_http_role;   /* ... with a token of a principal that is no admin */
    /* claims on another principal's segment (rpc/segment_calls.c, record_calls.c;
     * kvpool_segment_claims_refused_total by reason) */
    uint64_t refused_seg_record;   /* SegRecord of a segment another principal mounted */
    uint64_t refused_seg_endpoint; /* a mount advertising another principal's data endpoint */
    uint64_t refused_seg_held;     /* a mount of a name held (limbo) for another principal */
    uint64_t refused_seg_proof;    /* a mount whose endpoint did not prove it serves it */
    /* names refused for a NUL or control character, or a segment name's edge whitespace
     * (kvpool_names_refused_total by reason) */
    uint64_t refused_name_segment; /* a Mount's segment name (rpc/segment_calls.c) */
    uint64_t refused_name_tenant;  /* a tenant of the quota API (obs/tenant_quotas.c) */
    /* List and RemoveByRegex patterns refused, by kvp_key_pattern_refusal_t
     * (master/match/key_pattern.h; kvpool_patterns_refused_total by reason) */
    uint64_t refused_pattern[8];
    /* admission limits (master/auth/admission.c, server.c): connections closed, by the cap
     * or deadline that closed them */
    uint64_t refused_max_conns;       /* --max-connections */
    uint64_t refused_max_conns_peer;  /* --max-connections-per-peer */
    uint64_t refused_max_unauth;      /* --max-unauthenticated */
    uint64_t refused_max_unauth_peer; /* --max-unauthenticated-per-peer */
    uint64_t refused_descriptors;     /* accepted and closed: no descriptor left (EMFILE) */
    uint64_t refused_auth_timeout;    /* --auth-timeout */
    uint64_t refused_frame_timeout;   /* --frame-timeout */
    uint64_t refused_input_buffers;   /* --max-input-buffers */
    /* --max-connections-per-principal */
    uint64_t refused_max_conns_principal;
    /* rpc/object_calls.c: batches of keys stopped at their time budget, continued at their
     * connection's next turn, by method (common/rpc.h) */
    uint64_t keys_continued[KVP_RPC_METHOD_MAX + 1];
    uint64_t close_sweeps; /* connections whose puts were revoked over loop turns */
    /* server.c: connections whose requests were no longer read, their replies unread (over
     * 4 MiB queued, or --max-output-buffers for all), and the replies queued now */
    uint64_t output_paused;
    uint64_t output_queued;
    /* server.c, record gates: connections whose replies waited for an owner's record stream,
     * and those answered after --record-wait without it */
    uint64_t record_waits;
    uint64_t record_wait_expired;
    uint64_t record_lost; /* record streams closed with changes their owner never got */
} kvp_master_stats_t;

/* Control-RPC latency per method (server.c measures, master/obs/ shows): buckets of
 * KVP_RPC_BUCKETS upper bounds in microseconds, the last one +Inf. */
#define KVP_RPC_BUCKETS 12
extern const uint32_t kvp_rpc_bucket_us[KVP_RPC_BUCKETS - 1];
typedef struct kvp_rpc_hist {
    uint64_t count[KVP_RPC_BUCKETS]; /* not cumulative */
    uint64_t sum_ns;
} kvp_rpc_hist_t;

/* A task for an SSD segment's owner (policy/tier.c). Key inline after the struct. */
typedef enum kvp_ssd_task_kind {
    KVP_SSD_OFFLOAD = 1,
    KVP_SSD_RECORD = 2,
    KVP_SSD_PROMOTE = 3,
    KVP_SSD_FORGET = 4,
} kvp_ssd_task_kind_t;

typedef struct kvp_ssd_task {
    struct kvp_ssd_task *next;
    uint64_t id;
    uint64_t segment_id; /* the SSD segment: its owner does the work */
    uint64_t version;
    uint64_t size;
    kvp_replica_t ssd;  /* the SSD extent (OFFLOAD: held by the task until it ends) */
    kvp_replica_t dram; /* OFFLOAD: the source; PROMOTE: the destination (held) */
    uint64_t bytes;     /* OFFLOAD: DRAM bytes it frees when it ends */
    uint32_t crc32c;
    uint8_t kind;
    bool sent;
    uint16_t key_len;
    char key[];
} kvp_ssd_task_t;

/* Keys removed lately, so that an SSD segment's owner coming back never brings one back
 * (meta/tombstone.h). */
#include "master/meta/tombstone.h"

/*
 * A copy in flight during a drain (MoveStart .. MoveEnd, rpc/drain_calls.c): a new
 * extent `dest` for an object whose only replica is on segment `from`. The
 * key is stored inline after the struct.
 */
typedef struct kvp_move {
    struct kvp_move *next;
    uint64_t conn_id; /* the draining owner's connection */
    uint64_t from_segment_id;
    uint64_t size;
    kvp_replica_t dest;
    uint32_t crc32c; /* the object's CRC when the move started */
    uint16_t key_len;
    char key[];
} kvp_move_t;

/*
 * A key counted by the hot-key fanout (policy/hot_keys.c, --hot-key-reads): its reads in the
 * current window, and the replicas it was given while hot. An open-addressing table by the
 * key's index hash; the key's bytes are kept once it is hot.
 */
#define KVP_HOT_REPLICAS_MAX 7
typedef struct kvp_hot_key {
    uint64_t hash; /* 0: a free slot */
    uint64_t version;
    uint32_t reads; /* in this window */
    uint8_t cool;   /* windows in a row under the cooling rate */
    uint8_t n_dyn;  /* replicas it was given (their segments in dyn) */
    bool pending;   /* a copy task in flight: its id and target */
    uint64_t task_hi, task_lo, task_target;
    uint64_t dyn[KVP_HOT_REPLICAS_MAX];
    char *key; /* malloc'd once hot; NULL before */
    uint16_t key_len;
} kvp_hot_key_t;

typedef struct kvp_master_state {
    kvp_segment_table_t segments;
    kvp_object_index_t index;
    kvp_master_config_t config;
    kvp_master_stats_t stats;
    uint64_t rng;
    uint64_t now_ms; /* the master clock: set by the loop before each event (tests set it) */
    kvp_lease_table_t leases;
    kvp_ghost_t ghost; /* keys evicted lately, and from which list */
    /* the eviction policy (policy/lists.c): its clock ticks once per object put or read
     * (obj->touched); probation's head is the victim while older than protected's head
     * + probation_bias ticks (0: plain LRU over both lists), moved by the ghost's hits */
    uint64_t policy_clock;
    int64_t probation_bias;
    /* the deepest-block rule's gate (policy/lists.c): of the recent puts the ghost was asked
     * about, how many it remembered (victims coming back); the three counts are halved
     * whenever the victims since the last halving pass the objects resident (1024 at least) */
    uint64_t recent_puts, recent_returns, recent_victims;
    kvp_move_t *moves; /* drain copies in flight */
    /* victims' groups whose members go at later turns (policy/eviction.c): each held
     * (kvp_group_hold) while it is here */
    struct kvp_group_eviction {
        uint32_t gid, cursor; /* the members below cursor are still to be looked at */
        bool take_soft;
    } * group_evictions;
    uint32_t n_group_evictions, cap_group_evictions;
    uint64_t keys_turn_ns; /* a key batch's budget of one loop turn; 0: the default (4 ms) */
    /* Mooncake's drain jobs (policy/drain_jobs.c), made at the first; the cleanup frees them
     * through the hook that made them (core knows nothing of policy) */
    struct kvp_drain_jobs *drain_jobs;
    void (*drain_jobs_free)(struct kvp_master_state *st);
    kvp_task_table_t copy_tasks; /* copy and move tasks (meta/task_table.h) */
    kvp_hot_key_t *hot;          /* the hot-key fanout's table (policy/hot_keys.c), or NULL */
    uint32_t hot_mask, hot_count;
    uint64_t hot_window_ms; /* when the current window ends */
    /* SSD tier (policy/tier.c) */
    kvp_ssd_task_t *tasks, *tasks_tail; /* in order of creation */
    uint64_t n_tasks;                   /* on that list: queued or sent, not answered */
    uint64_t next_task_id;
    uint64_t offloading_bytes; /* DRAM bytes that offloads in flight will free */
    uint64_t offloading;       /* offloads in flight */
    uint64_t version_clock;    /* the last version given (starts at the wall clock, us) */
    kvp_tombstones_t tombstones;
    struct kvp_limbo *limbo; /* segments dropped for silence, until --segment-grace */
    bool tasks_ready;        /* a task was queued: the server answers owners waiting for tasks */
    /* the connection of the request being handled (server.c sets it around each call):
     * handlers that care where a request came from (a mount's loopback endpoint) ask it */
    bool call_has_fd;
    int call_fd;
    bool may_park;   /* set by the server: SsdTasks may wait instead of answering now */
    bool parked;     /* set by SsdTasks: no answer yet, the server holds the request */
    bool park_retry; /* set by the server: this SsdTasks call was held (its results are in) */
    /* set by the server: a keys batch may stop at its time budget and be called again with
     * the same request at its connection's next turn (rpc/object_calls.c keys_batch) */
    bool may_continue;
    bool call_again; /* set by such a handler: no answer yet, call it again */
    /* connections closed with more puts pending than one turn's walk: their puts are revoked
     * by a walk of the pending list continued over loop turns (rpc/object_calls.c
     * kvp_object_sweep); [0, n_sweeping): the current pass's, sorted; then those closed
     * since, for the next pass */
    uint64_t *closed_writers;
    uint32_t n_closed_writers, cap_closed_writers, n_sweeping;
    uint64_t sweep_left; /* the pass's pending objects still to visit */
    /* PUT_COMMIT's holds (rpc/object_calls.c): the room they take (bytes x replicas), all
     * connections' (core/state.c keeps it) */
    uint64_t held_bytes;
    uint64_t holds; /* how many (in the index: PENDING, not keys) */
    /* mount proofs (auth/mount_proof.h; docs/security.md): mount_proof is set by the server
     * (--mount-proof on); a Mount that needs its endpoint proven fills proof_ask and sets
     * proof_asked and parked (no answer now); the server proves it and calls the Mount
     * again with proof_result 1 (proven) or -1 (not: why in proof_why); 0: a first call */
    bool mount_proof;
    bool proof_asked;
    int proof_result;
    char proof_why[400];
    struct {
        char host[256];
        uint16_t port;
        char name[256];
        uint8_t secret[32];
    } proof_ask;
    /* A restarted master or a new leader waits this long for the segments to remount and
     * offer their records: a put that finds no room meanwhile is told to wait
     * (KVP_ERR_POOL_BUSY, retried by the client) rather than evicting or failing. */
    uint64_t rebuild_until_ms;
    /* high availability (ha/leadership.c): what Stat shows */
    uint64_t epoch;          /* the epoch this master leads under; 0: standalone */
    char leader[300];        /* the leader's address ("" standalone) */
    char standbys[1024];     /* the standbys' addresses, comma-separated */
    uint64_t stream_segment; /* set by SegRecord: the server streams this segment's record
                                changes on the calling connection (no answer now) */
    /* operations (master/obs/) */
    const kvp_event_sink_t *events; /* KV events (core/event_sink.h), or NULL */
    kvp_rpc_hist_t *rpc_hist;       /* [KVP_RPC_METHOD_MAX + 1], or NULL (tests) */
    uint32_t clients;               /* connections open now (server.c) */
    /* tenants (meta/tenant.h): with an ACL, keys are scoped by tenant and charged to it */
    kvp_tenant_table_t tenants;
    /* object groups (meta/group.h), scoped by tenant: members leased and evicted together */
    kvp_group_table_t groups;
    bool tenants_on;      /* an ACL is loaded: keys of requests get the caller's tenant prefix */
    uint32_t acl_tenants; /* the distinct tenants the ACL's principals belong to (the live
                             task share divides by these, not by every tenant a key named) */
    bool share_evict;     /* an eviction run takes objects of tenants over their share first */
    /* data grants (common/grant.h): with TLS, answers that name extents carry grants the
     * owners check; the epoch is drawn at start, the keys at each mount */
    bool grants_on;
    uint64_t grant_epoch;
    struct kvp_grant *grant_buf; /* a response's grants (kvp_call_grants_reserve) */
    size_t grant_cap;
    uint64_t grant_now_ms; /* the wall clock when the response's grants were cut */
    uint64_t grant_nonce;
    /* dispatch.c's scratch for the stored keys of a request (grown, never shrunk) */
    uint8_t *scope_buf;
    size_t scope_cap;
    uint8_t **scope_orig;
    size_t scope_orig_cap;
} kvp_master_state_t;

/* How long a new master waits for segments to come back (rebuild_until_ms). */
#define KVP_REBUILD_GRACE_MS 2000u

/* Default settings, empty tables, the clock read, a random placement seed. */
kvp_status_t kvp_master_state_init(kvp_master_state_t *st);

/* Charge (+1) or refund (-1) what obj takes to its tenant: its bytes on each tier by its
 * replicas' segments (those segments must still be in the table), and one object. The
 * index calls it (kvp_index_charge); so does who changes an object's replicas in place. */
void kvp_state_charge(void *st, const kvp_object_t *obj, int sign);
/* Free every object, segment, lease slot and move. */
void kvp_master_state_cleanup(kvp_master_state_t *st);

/* Queue a task for the owner of SSD segment segment_id (wakes owners waiting for tasks).
 * NULL: out of memory. */
kvp_ssd_task_t *kvp_state_task_add(kvp_master_state_t *st, kvp_ssd_task_kind_t kind,
                                   uint64_t segment_id, const char *key, size_t key_len);
/* Unlink and free a task. */
void kvp_state_task_remove(kvp_master_state_t *st, kvp_ssd_task_t *task);
/* obj is going (its extents are being freed): its SSD owners forget their entries. */
void kvp_state_forget_ssd(kvp_master_state_t *st, const kvp_object_t *obj);

/* KV events (core/event_sink.h): the media an object's replicas are on (bit
 * 1 << KVP_MEDIUM_CPU for DRAM segments, 1 << KVP_MEDIUM_DISK for SSD ones). */
unsigned kvp_state_media(const kvp_master_state_t *st, const kvp_replica_t *reps, unsigned n);
/* A COMPLETE object's media went from `before` to `after`: `stored` for each medium
 * gained, `removed` for each lost (no-op without a publisher). */
void kvp_state_media_event(kvp_master_state_t *st, const kvp_object_t *obj, unsigned before,
                           unsigned after);
/* A COMPLETE object is going (removed, evicted, lost): `removed` on its media. */
static inline void kvp_state_object_gone(kvp_master_state_t *st, const kvp_object_t *obj)
{
    if (st->events != NULL && obj->state == KVP_OBJ_COMPLETE)
        kvp_state_media_event(st, obj, kvp_state_media(st, obj->replicas, obj->n_replicas), 0);
}

/* Bytes allocated over all segments. */
static inline uint64_t kvp_master_used(const kvp_master_state_t *st)
{
    return kvp_segment_table_used(&st->segments);
}

#endif
