/*
 * config.h - the master's settings: defaults, flag values, validation
 * (see config.c).
 */
#ifndef KVP_MASTER_CONFIG_H
#define KVP_MASTER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/options.h"
#include "common/status.h"

/*
 * Master settings: every flag of kvpool-master (and key of its config file) is a field
 * here, described by one row of the table in master/master_options.c (its name, type,
 * default, environment variable and help); the defaults below are that table's.
 */
typedef struct kvp_master_config {
    /* the process (master/main.c); the strings are borrowed from argv */
    const char *listen;        /* HOST:PORT of the control plane (127.0.0.1:50051) */
    int ready_fd;              /* write the bound address here when listening (-1: none) */
    int log_level;             /* kvp_log_level_t (info; $KVPOOL_LOG_LEVEL) */
    const char *etcd;          /* etcd endpoints (NULL: standalone, no election) */
    const char *cluster;       /* the masters of one pool share it (kvpool) */
    uint32_t leader_ttl_s;     /* lease of the leader (5) */
    const char *advertise;     /* the address clients reach us at (NULL: the bound one) */
    bool evict;                /* false: a full pool refuses puts (store, not cache) */
    double evict_high;         /* evict when used/capacity passes this (1.0: off) */
    double evict_low;          /* ... down to this (0.98) */
    uint32_t lease_ttl_ms;     /* read lease granted by GetReplicaList (5000) */
    uint32_t put_timeout_ms;   /* a PENDING put not ended by then is revoked (30000) */
    uint32_t soft_pin_ttl_s;   /* default soft pin lifetime (1800) */
    uint32_t client_ttl_ms;    /* a connection silent this long is dropped (10000; 0: never) */
    uint64_t index_seed;       /* the key index's hash seed; 0: a random one at start */
    uint32_t segment_grace_ms; /* a DRAM segment dropped so: its objects kept for its
                                * owner's return this long (60000; 0: not kept) */
    bool lease_on_exist;       /* Exist grants read leases too (false) */
    bool lease_on_put;         /* PutEnd leases the object for the TTL (false) */
    /* hot keys (policy/hot_keys.c): a key read this often per second gets replicas of its own
     * on more segments, dropped when it cools (0: off) */
    uint32_t hot_key_reads;
    uint32_t hot_key_replicas; /* ... at most this many more (2) */
    /* SSD tier (policy/tier.c) */
    double offload_high;   /* offload DRAM victims in the background above this (0.95) */
    double offload_low;    /* ... down to this (0.90) */
    double ssd_evict_high; /* drop SSD-tier objects above this share of SSD capacity (0.95) */
    double ssd_evict_low;  /* ... down to this (0.90) */
    bool promote_on_hit;   /* copy SSD-only objects back to DRAM when read (true) */
    /* DFS tier: free DFS copies, least recently used first, when a DFS replica has no room
     * or DFS used passes dfs_evict_high (down to dfs_evict_low); Mooncake's
     * MOONCAKE_DFS_EVICTION_* (true, 0.9, 0.7) */
    bool dfs_evict;
    double dfs_evict_high;
    double dfs_evict_low;
    bool segment_records; /* DRAM segments' owners keep a record of their objects (true) */
    /* a reply that changed a DRAM segment waits at most this long for the change to be in
     * its owner's record stream's socket (server.c, "record gates"; 0: no wait) */
    uint32_t record_wait_ms;
    /* operations (master/obs/) */
    char http_listen[300];      /* HOST:PORT of /metrics and the admin views; "off": none */
    bool http_listen_given;     /* set by a flag: failing to listen is fatal (else a warning) */
    bool metrics_tenants;       /* /metrics names tenants to every scraper, not only to admins */
    char kv_events_bind[300];   /* ZMQ endpoint of the KV events PUB socket ("": off) */
    char kv_events_replay[300]; /* ... of its replay ROUTER socket ("": none) */
    char kv_events_topic[128];
    uint32_t kv_events_queue;          /* events queued at most (65536) */
    uint32_t kv_events_replay_batches; /* batches kept for replay (4096) */
    char kv_events_model[256];         /* the envelope: model_name (kvpool) */
    uint32_t kv_events_block_size;
    char kv_events_tenant[256];     /* tenant_id (default) */
    char kv_events_backend_id[256]; /* backend_id (kvpool-master) */
    uint32_t kv_events_dp_rank;
    char kv_events_curve_secret[512]; /* the master's CURVE secret key file ("": no CURVE) */
    char kv_events_curve_allow[512];  /* subscribers' public keys and tenants ("": none) */
    /* who may connect: "protected" (this host only: no credentials are configured) or
     * "none" (anyone who reaches the port: a trusted network) */
    char auth[16];
    /* TLS and the ACL (master/auth/, docs/security.md): "" when not given */
    char tls_cert[512];
    char tls_key[512];
    char tls_ca[512];
    char tls_crl[512];
    char acl_file[512];
    /* with an ACL: copy and move tasks one tenant holds at most, live and ended (0: an equal
     * share of the master's 4096; policy/copy_tasks.c) */
    uint32_t max_tasks_per_tenant;
    bool data_grants; /* with TLS: tcp data requests carry grants (common/grant.h) */
    bool mount_proof; /* a mount's tcp endpoint proves it serves the segment (true) */
    uint32_t mount_proof_timeout_ms; /* ... within this (2000) */
    /* admission limits (master/auth/admission.c, server.c; docs/security.md) */
    uint32_t max_conns;           /* connections open at most (10000; 0: the fd limit's) */
    uint32_t max_conns_per_peer;  /* ... from one peer address, IPv6 by /64 (1024; 0: no cap) */
    uint32_t max_unauth;          /* ... not authenticated yet (1024; 0: no cap) */
    uint32_t max_unauth_per_peer; /* ... of them from one peer address (128; 0: no cap) */
    uint32_t auth_timeout_ms;     /* authenticate this long after the accept (5000; 0: never) */
    uint32_t frame_timeout_ms;    /* a frame begun must end within this (10000; 0: never) */
    uint64_t max_input_bytes;     /* input buffers past their first chunk, all together (1 GiB;
                                   * 0: no cap) */
    uint64_t max_output_bytes;    /* replies queued and not read, all together: past it no
                                   * connection with replies queued is read (1 GiB; 0: no cap) */
    /* connections of one principal, from any peers (1024; 0: no cap) */
    uint32_t max_conns_per_principal;
    /* etcd's TLS and credentials (docs/security.md, "etcd"): "" when not given */
    char etcd_cacert[512];
    char etcd_cert[512];
    char etcd_key[512];
    char etcd_user[257];
    char etcd_password_file[512];
} kvp_master_config_t;

/* The defaults (the table's). */
void kvp_master_config_init(kvp_master_config_t *cfg);

/* The option table of kvpool-master (master_options.c) over *cfg's fields. */
kvp_opts_t kvp_master_options(kvp_master_config_t *cfg);

/*
 * Set one setting from its kvpool-master flag (long name without "--":
 * "lease-ttl", "no-eviction", ...). value is the flag's argument (NULL for
 * flags that take none). KVP_ERR_INVALID_ARG with a sentence in err on a bad
 * value; KVP_ERR_NOT_FOUND for a name that is not a setting (--help, --version
 * are actions, not settings).
 */
kvp_status_t kvp_master_config_set(kvp_master_config_t *cfg, const char *name, const char *value,
                                   char *err, size_t err_len);

/* Settings that are fine one by one but not together. KVP_ERR_INVALID_ARG + err. */
kvp_status_t kvp_master_config_validate(const kvp_master_config_t *cfg, char *err, size_t err_len);

#endif
