/*
 * kvpool.h - the public C API of libkvpool.
 *
 * A client connects to kvpool-master, optionally contributes memory to the
 * pool by mounting a DRAM segment (which it then serves to peers), and moves
 * object bytes itself: puts write straight from the caller's buffer into the
 * extents the master allocated, gets read straight into the caller's buffer.
 *
 * Threading: every function may be called from any thread, concurrently, on
 * the same client, except kvp_client_destroy (no call may be in flight).
 *
 * Errors: functions return kvp_status_t (0 = KVP_OK, negative = failure), or
 * a non-negative size / a negative kvp_status_t where a size is returned.
 * kvp_strerror() gives the text. The library never aborts or exits on bad
 * input or a dead peer, and is silent unless KVPOOL_LOG_LEVEL is set.
 */
#ifndef KVPOOL_H
#define KVPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_DEFAULT_MASTER_PORT 50051
#define KVP_MAX_KEY_LEN 4096
/* The most keys one batch call may carry (larger batches: split them). */
#define KVP_MAX_BATCH 65536

typedef struct kvp_client kvp_client_t;

/*
 * Client parameters. Initialise with kvp_client_params_init(), then set what
 * you need. `size` lets the struct grow without breaking callers.
 */
typedef struct kvp_client_params {
    size_t size;                /* sizeof(kvp_client_params_t), set by _init */
    const char *master_addr;    /* "host:port"; NULL: $KVPOOL_MASTER, else 127.0.0.1:50051 */
    uint64_t segment_size;      /* bytes of DRAM to mount and serve; 0: mount nothing */
    const char *transport;      /* "auto" | "tcp" | "shm" | "rdma"; NULL: $KVPOOL_TRANSPORT,
                                   else auto (shm on the same host, else rdma when both
                                   sides have it, else tcp) */
    const char *data_host;      /* address the segment's data server binds and advertises;
                                   NULL: the address this host reaches the master (or the
                                   first etcd member) from; 127.0.0.1 when that is on
                                   this host */
    uint16_t data_port;         /* data server port; 0: any free port */
    const char *segment_name;   /* name of the mounted segment; NULL: "<data_host>:<port>" */
    uint32_t tcp_streams;       /* tcp connections used in parallel per peer per batch; 0: 2 */
    uint64_t tcp_slice_bytes;   /* tcp stripe size for large objects; 0: 1 MiB */
    uint32_t rpc_timeout_ms;    /* master RPC and data transfer timeout; 0: 10000 */
    uint32_t verify_crc;        /* check CRC32C on every get; 1 by default */
    uint32_t heartbeat_ms;      /* liveness heartbeat to the master; 0: 1000 */
    uint32_t drain_timeout_ms;  /* a drain of our segment asked for by someone else
                                   (kvp_request_drain, `kvpool drain`); 0: 30000 */
    const char *rdma_devices;   /* RDMA devices to try, "rxe0,mlx5_0"; NULL: $KVPOOL_RDMA_DEVICE,
                                   else any with an ACTIVE port */
    const char *rdma_host;      /* IPv4 the segment's rdma_cm listener binds and advertises;
                                   NULL: $KVPOOL_RDMA_HOST, else the device's own address */
    uint32_t rdma_qps_per_peer; /* RC QPs per peer, 1..16; 0: 2 */
    uint64_t rdma_slice_bytes;  /* rdma stripe size, 4 KiB..1 GiB; 0: 256 KiB */
    /* SSD segment (docs/architecture.md, "Tiers"): one preallocated file on a local
     * filesystem with O_DIRECT, mounted besides (or instead of) the DRAM segment. Its
     * objects survive this process: the same path mounted again brings them back. */
    const char *ssd_path;     /* NULL: no SSD segment */
    uint64_t ssd_size;        /* bytes of the file's data area (>= 1 MiB) */
    uint32_t ssd_buffered_io; /* 1: accept a filesystem without O_DIRECT (page cache) */
    /* Who may connect to this client's data servers (its segments): "protected", the
     * default while no credentials are configured, takes peers of this host only and
     * refuses others with KVP_ERR_DENIED; "none" takes anyone who reaches the port (a
     * trusted network). NULL: $KVPOOL_AUTH, else "protected". */
    const char *auth;
    /* Security of the control plane (docs/security.md): with a CA, every
     * connection to the master is TLS 1.3 and the master's certificate must name the
     * address dialled; a certificate and key (mutual TLS) or a token name this client's
     * principal. A token is only ever sent over TLS. Each NULL: its environment variable
     * ($KVPOOL_TLS_CERT, $KVPOOL_TLS_KEY, $KVPOOL_TLS_CA, $KVPOOL_TOKEN), else none. */
    const char *tls_cert;
    const char *tls_key;
    const char *tls_ca;
    const char *token;
    /* Dedicate the mounted segments (DRAM and SSD) to this tenant: only its objects go
     * there, and its objects go there first (`kvpool serve --tenant`). The master must have
     * an ACL, and the tenant must be this client's own (an admin's: any). NULL: shared. */
    const char *segment_tenant;
    /* Back the DRAM segment with [segment_file_offset, + segment_size) of this file
     * (MAP_SHARED; e.g. a file on tmpfs or hugetlbfs) instead of anonymous memory, as
     * Mooncake's mount_segment does. The file must be a regular file of this user's with
     * mode 0600 or narrower (KVP_ERR_DENIED otherwise: its permissions are the segment's),
     * the range inside it, the offset a multiple of the page size (KVP_ERR_INVALID_ARG).
     * Same-host peers get the memory over shm only when the range is the whole file; else
     * they use tcp. NULL: anonymous memory (a memfd). */
    const char *segment_file;
    uint64_t segment_file_offset;
    /* The DFS tier (docs/architecture.md "The DFS tier"): a directory every node sees
     * (NFS, 3FS-FUSE; one host's local directory in tests). With dfs_path this client
     * reads and writes DFS replicas in the directory's shard files itself (no owner in the
     * path); with dfs_size (>= 1 MiB) too it mounts a DFS segment: a shard file of that
     * size there, served to clients without the directory like an SSD segment. NULL:
     * $KVPOOL_DFS_PATH (and $KVPOOL_DFS_SIZE), else none. */
    const char *dfs_path;
    uint64_t dfs_size;
    /* Mooncake's tenant_id (docs/python.md, "Tenant ids"): 1..63 bytes of A-Z a-z 0-9 . _ -.
     * Without a credential that binds a tenant (no token or certificate a master's ACL
     * names), it is a key namespace: this client's keys are stored apart from every other
     * tenant_id's and the default namespace's, so exist, get, put, remove, list and
     * remove_all never see another's. With such a credential, it must be the principal's
     * own tenant: another is refused by create with KVP_ERR_DENIED (the master already keeps
     * tenants apart by the credential). NULL: $KVPOOL_TENANT_ID; unset, "" or "default": the
     * default namespace (with a credential, the principal's tenant). */
    const char *tenant_id;
} kvp_client_params_t;

/* Fill `params` with defaults (all fields above as documented). */
void kvp_client_params_init(kvp_client_params_t *params);

/*
 * Connect to the master and, when params->segment_size > 0, allocate the
 * segment (a memfd shared with same-host peers), start its data server and
 * mount it. Create returns once the master has answered (the mount, and a
 * first heartbeat that learns the mounted segments). Outcomes: KVP_OK and
 * *client_p set; KVP_ERR_CONNECT (master unreachable), KVP_ERR_TIMEOUT (the
 * connection was taken but nothing answered within rpc_timeout_ms: a hung
 * master), KVP_ERR_PROTOCOL (what answered is no kvpool master),
 * KVP_ERR_INVALID_ARG (bad params), KVP_ERR_NOMEM, KVP_ERR_SYSTEM; the
 * failure's text is in kvp_client_last_error(). `params` is borrowed for the
 * call only.
 */
kvp_status_t kvp_client_create(const kvp_client_params_t *params, kvp_client_t **client_p);

/*
 * Unmount the segment (objects stored in it leave the pool), stop the data
 * server, close every connection and free the client. NULL is ignored.
 */
void kvp_client_destroy(kvp_client_t *client);

/* Name of this client's mounted segment, or NULL when it mounts none. */
const char *kvp_client_segment_name(const kvp_client_t *client);
/* Name of this client's SSD segment, or NULL when it mounts none. */
const char *kvp_client_ssd_segment_name(const kvp_client_t *client);
/* The name of this client's DFS segment (dfs_path with dfs_size), or NULL. */
const char *kvp_client_dfs_segment_name(const kvp_client_t *client);

/*
 * Register a buffer for transfers: host memory, or CUDA device memory (found
 * through the CUDA driver, loaded with dlopen when present). On rdma the
 * region is registered with the NIC once, so transfers to and from it are
 * zero-copy; an unregistered host buffer still works there but is copied
 * through registered staging buffers. GPU memory goes NIC-direct when the
 * driver exports a dma-buf or GPUDirect peer memory works, else (and on tcp
 * and shm always) through pinned host staging buffers, pipelined. On tcp and
 * shm registering host memory is optional. Overlapping an existing
 * registration returns KVP_ERR_EXISTS; KVP_ERR_TRANSPORT if the NIC refuses it.
 */
kvp_status_t kvp_register_buffer(kvp_client_t *client, void *addr, size_t len);
kvp_status_t kvp_unregister_buffer(kvp_client_t *client, void *addr);

/* Pinning: whether eviction may take the object (see docs/operations.md). */
#define KVP_PIN_NONE 0
#define KVP_PIN_SOFT 1 /* evicted only when nothing unpinned is left, until the pin expires */
#define KVP_PIN_HARD 2 /* never evicted; removed only by remove */

/* Where replicas go and how they are kept. Initialise with kvp_put_config_init(). */
typedef struct kvp_put_config {
    size_t size;                   /* sizeof(kvp_put_config_t) */
    uint32_t replica_num;          /* extents on distinct segments; default 1 */
    const char *preferred_segment; /* segment name to place the first replica on, if it has
                                      room; KVP_SEGMENT_LOCAL: this client's own segment;
                                      NULL: placement by free space (weighted random) */
    uint32_t pin;                  /* KVP_PIN_NONE (default), KVP_PIN_SOFT, KVP_PIN_HARD */
    uint32_t soft_pin_ttl_s;       /* soft pin lifetime; 0: the master's default (30 min) */
    uint32_t mode;                 /* KVP_PUT_INSERT (default) or KVP_PUT_UPSERT */
    const char *medium;            /* NULL or "dram": DRAM; "ssd": straight to the SSD tier
                                      (blocks known to be cold) */
    /* replica i on the segment named preferred_segments[i] while it has room (i <
     * n_preferred_segments <= 8; Mooncake's preferred_segments); when given, it replaces
     * preferred_segment */
    const char *const *preferred_segments;
    size_t n_preferred_segments;
    /* object groups (Mooncake's ReplicateConfig.group_ids): NULL: none named (a new object
     * is ungrouped, an upsert keeps the object's group); else group_ids[i] is key i's
     * group ("": ungrouped), n_group_ids equal to the call's key count (1 for kvp_put),
     * each at most KVP_GROUP_ID_MAX bytes (KVP_ERR_INVALID_ARG otherwise). Scoped by the
     * client's tenant. A read of one member leases the group; an eviction of one takes
     * the group's members that are not being read or pinned. An upsert naming another
     * group than the object's gets KVP_ERR_INVALID_ARG. Not for kvp_aq (INVALID_ARG). */
    const char *const *group_ids;
    size_t n_group_ids;
    /* Mooncake's dfs_replica_num: 1 adds a replica on a DFS segment (kvpool serve
     * --dfs-path) besides the memory ones: the put succeeds only once it is written
     * (KVP_ERR_UNSUPPORTED: no DFS segment mounted; KVP_ERR_POOL_FULL: the DFS is full;
     * nothing is stored either way); 0 (default): none; more, or 1 with medium "ssd":
     * KVP_ERR_INVALID_ARG */
    uint32_t dfs_replica_num;
} kvp_put_config_t;

#define KVP_GROUP_ID_MAX 1024

/*
 * Put modes. INSERT fails with KVP_ERR_EXISTS when the key exists. UPSERT
 * replaces it: an object of the same size that nobody is reading is
 * rewritten in place; otherwise the new value gets new extents and the old
 * ones are freed once readers' leases end. The key reads as absent while the
 * new value is being written, and stays absent if that put fails.
 */
#define KVP_PUT_INSERT 0
#define KVP_PUT_UPSERT 1

#define KVP_SEGMENT_LOCAL "@local"

void kvp_put_config_init(kvp_put_config_t *config);

/*
 * Store one object. The bytes at [buf, buf+len) are read during the call only.
 * Outcomes: KVP_OK; KVP_ERR_EXISTS (a complete object with this key exists);
 * KVP_ERR_PENDING (another writer is putting it); KVP_ERR_POOL_FULL;
 * KVP_ERR_TOO_LARGE; KVP_ERR_NO_SEGMENT; KVP_ERR_BAD_KEY; KVP_ERR_INVALID_ARG
 * (len 0); transfer errors (KVP_ERR_IO, KVP_ERR_CONNECT, KVP_ERR_TIMEOUT,
 * KVP_ERR_SEGMENT_GONE); KVP_ERR_PUT_REVOKED (the master dropped the unfinished
 * put: it restarted, lost this client's connection, or the segment went away;
 * retry). On any failure nothing is visible under the key.
 * config may be NULL (defaults).
 */
kvp_status_t kvp_put(kvp_client_t *client, const char *key, const void *buf, size_t len,
                     const kvp_put_config_t *config);

/*
 * Read one object into [buf, buf+cap). Returns the object size (>= 1) or a
 * negative kvp_status_t: KVP_ERR_NOT_FOUND, KVP_ERR_BUFFER_TOO_SMALL (nothing
 * written to buf), KVP_ERR_CHECKSUM (the bytes in buf are not the object),
 * KVP_ERR_LEASE_EXPIRED (the transfer outlasted the read lease: retry),
 * transfer errors. Never returns success with wrong bytes.
 */
int64_t kvp_get_into(kvp_client_t *client, const char *key, void *buf, size_t cap);

/*
 * Batch put: keys[i] from bufs[i] of sizes[i], for i < n (n <= KVP_MAX_BATCH).
 * results[i] receives each key's status. Returns KVP_OK when every key
 * succeeded, otherwise the first failing key's status (or a whole-batch error
 * such as KVP_ERR_CONNECT, in which case every results[i] carries it too).
 * A key named twice is put from its first entry; the later ones get
 * KVP_ERR_PENDING and nothing of their buffers is written.
 */
kvp_status_t kvp_batch_put_from(kvp_client_t *client, const char *const *keys,
                                const void *const *bufs, const size_t *sizes, size_t n,
                                const kvp_put_config_t *config, kvp_status_t *results);

/*
 * kvp_batch_put_from, also reporting replicas_written[i] (may be NULL): how
 * many replicas key i was stored with. Multi-replica puts are best effort per
 * replica: a key whose write reached 2 of 3 extents succeeds with 2 (the
 * failed extent is freed); it fails only when no replica was written.
 */
kvp_status_t kvp_batch_put_from_ex(kvp_client_t *client, const char *const *keys,
                                   const void *const *bufs, const size_t *sizes, size_t n,
                                   const kvp_put_config_t *config, kvp_status_t *results,
                                   uint32_t *replicas_written);

/*
 * Batch get: keys[i] into bufs[i] of capacity caps[i]. results[i] receives
 * the object's size or a negative status. Returns as kvp_batch_put_from.
 */
kvp_status_t kvp_batch_get_into(kvp_client_t *client, const char *const *keys, void *const *bufs,
                                const size_t *caps, size_t n, int64_t *results);

/*
 * Which keys exist (complete objects; PENDING ones do not count). results[i]:
 * 1 exists, 0 does not, negative: a status for that key (e.g. KVP_ERR_BAD_KEY).
 * *prefix_len_p (may be NULL) receives the number of leading keys that all
 * exist: the longest cached prefix of a request's block keys.
 * Answered from master metadata only.
 */
kvp_status_t kvp_batch_is_exist(kvp_client_t *client, const char *const *keys, size_t n,
                                int *results, size_t *prefix_len_p);

/* 1 if the key exists, 0 if not, or a negative status. */
int kvp_is_exist(kvp_client_t *client, const char *key);

/*
 * Remove one object. KVP_OK, KVP_ERR_NOT_FOUND, KVP_ERR_PENDING, or
 * KVP_ERR_LEASED while a reader holds a read lease on it (a get in the last
 * lease-ttl seconds); kvp_remove_force removes it anyway (the reader's CRC
 * check then reports the object gone rather than returning other bytes).
 */
kvp_status_t kvp_remove(kvp_client_t *client, const char *key);
kvp_status_t kvp_remove_force(kvp_client_t *client, const char *key);

/* Batch remove; results[i] per key; returns as kvp_batch_put_from. */
kvp_status_t kvp_batch_remove(kvp_client_t *client, const char *const *keys, size_t n,
                              kvp_status_t *results);
/*
 * Mooncake's BatchReplicaClear. segment NULL or "": each key's object is
 * removed as kvp_batch_remove removes it. Else only its replicas on the
 * segments named segment go, the object staying readable from its others
 * (removed whole when those were all it had). results[i]: KVP_OK cleared;
 * KVP_ERR_NOT_FOUND no such object, or none of its replicas there;
 * KVP_ERR_PENDING being written; KVP_ERR_LEASED under a read lease (the
 * master's --lease-on-put leases one just written). Returns as
 * kvp_batch_put_from.
 */
kvp_status_t kvp_batch_replica_clear(kvp_client_t *client, const char *const *keys, size_t n,
                                     const char *segment, kvp_status_t *results);
/* The same, also removing objects under a read lease. */
kvp_status_t kvp_batch_remove_force(kvp_client_t *client, const char *const *keys, size_t n,
                                    kvp_status_t *results);

/*
 * Remove every complete object whose key matches `pattern`, a POSIX extended
 * regular expression (regcomp(3) syntax, REG_EXTENDED, C locale; "^prefix/" for a prefix).
 * Objects being written are skipped, and so are objects under a read lease
 * unless `force`. *removed_p (may be NULL) receives the count. An empty or
 * invalid pattern is KVP_ERR_INVALID_ARG.
 */
kvp_status_t kvp_remove_by_regex(kvp_client_t *client, const char *pattern, int force,
                                 uint64_t *removed_p);
/* Remove every complete object in the pool (leased ones only with force). */
kvp_status_t kvp_remove_all(kvp_client_t *client, int force, uint64_t *removed_p);

/* One key as kvp_list_keys reports it. */
typedef struct kvp_key_info {
    char *key; /* NUL-terminated */
    uint64_t size;
    uint32_t complete;   /* 0: being written (PENDING) */
    uint32_t n_replicas; /* replicas; their segments in segment_ids */
    uint64_t segment_ids[8];
    uint32_t lease_ms; /* read lease left, 0: none */
    uint32_t pin;      /* KVP_PIN_* */
} kvp_key_info_t;

/*
 * Keys matching `pattern` (POSIX extended regex; NULL or "": all), at most
 * `max` of them (bounded output). *keys_p receives an array of *n_p entries,
 * freed with kvp_key_list_free. The scan is not a snapshot: keys added or
 * removed meanwhile may or may not appear; none present throughout is missed.
 */
kvp_status_t kvp_list_keys(kvp_client_t *client, const char *pattern, size_t max,
                           kvp_key_info_t **keys_p, size_t *n_p);
/* With an ACL on the master: the tenant whose key it is (an admin lists every tenant's);
 * "" when the master has no ACL. Keys stored before it had one are "default"'s. */
const char *kvp_key_info_tenant(const kvp_key_info_t *info);
void kvp_key_list_free(kvp_key_info_t *keys, size_t n);

/*
 * Graceful leave: stop new placements on this client's segment, copy every
 * object whose only replica is there to other segments (where space allows),
 * then unmount it. Objects not moved within timeout_ms leave the pool.
 * *moved_p / *lost_p (may be NULL) receive the counts. The segment's memory
 * stays readable until kvp_client_destroy. KVP_ERR_INVALID_ARG: no segment.
 */
kvp_status_t kvp_drain(kvp_client_t *client, uint32_t timeout_ms, uint64_t *moved_p,
                       uint64_t *lost_p);

/*
 * Ask the owner of segment `name` (any client) to drain it, as kvp_drain does;
 * the owner starts within a heartbeat. KVP_ERR_SEGMENT_GONE: no such segment.
 */
kvp_status_t kvp_request_drain(kvp_client_t *client, const char *segment_name);

/*
 * Copy and move tasks (Mooncake's create_copy_task / create_move_task / query_task): new
 * replicas of an object on named segments, or its replica on one segment taken to another,
 * written in the background by the owner of a source replica (never through the master).
 * The new replicas become the object's together, or not at all (the task FAILED, why in
 * its message). Kinds and states are Mooncake's numbers.
 */
#define KVP_COPY_TASK 0
#define KVP_MOVE_TASK 1
#define KVP_TASK_PENDING 0
#define KVP_TASK_PROCESSING 1
#define KVP_TASK_FAILED 2
#define KVP_TASK_SUCCESS 3
typedef struct kvp_task_id {
    uint64_t hi, lo;
} kvp_task_id_t;
typedef struct kvp_task_info {
    uint32_t kind;                   /* KVP_COPY_TASK, KVP_MOVE_TASK */
    uint32_t status;                 /* KVP_TASK_* */
    uint64_t created_ms, updated_ms; /* wall clock, ms since the epoch */
    char assigned[128];              /* the source segment, whose owner runs it */
    char message[160];               /* why it failed */
} kvp_task_info_t;
/* A copy of key to each of targets[0..n) (segment names, 1..8; a target that holds a
 * replica already needs nothing). KVP_ERR_NOT_FOUND: no such object; KVP_ERR_INVALID_ARG: a
 * target not mounted, an SSD one, or one that takes no new replicas (the last error says). */
kvp_status_t kvp_create_copy_task(kvp_client_t *client, const char *key, const char *const *targets,
                                  size_t n_targets, kvp_task_id_t *id_p);
/* A move of key's replica on segment source to segment target. */
kvp_status_t kvp_create_move_task(kvp_client_t *client, const char *key, const char *source,
                                  const char *target, kvp_task_id_t *id_p);
/* Where a task stands. KVP_ERR_NOT_FOUND: no task of the caller's tenant has this id (the
 * master keeps the 4096 newest ended ones); a task of a master that has since restarted or
 * failed over: KVP_TASK_FAILED, why in the message. */
kvp_status_t kvp_query_task(kvp_client_t *client, kvp_task_id_t id, kvp_task_info_t *info);

/*
 * 1 while this client's segment is mounted, 0 once drained (by kvp_drain or
 * a drain requested from elsewhere) or when it mounts none.
 */
int kvp_client_segment_mounted(kvp_client_t *client);

/* Size of a complete object, or a negative status (KVP_ERR_NOT_FOUND). */
int64_t kvp_get_size(kvp_client_t *client, const char *key);
/* The sizes of a batch's objects in one master call: sizes[i] is keys[i]'s size, or a
 * negative status (KVP_ERR_NOT_FOUND, KVP_ERR_BAD_KEY). Returns KVP_OK when the call was
 * answered (the results per key), else its status, also in every sizes[i]. */
kvp_status_t kvp_batch_get_size(kvp_client_t *client, const char *const *keys, size_t n,
                                int64_t *sizes);

/* One mounted segment, as the master sees it. */
typedef struct kvp_segment_info {
    uint64_t id;
    char name[256];
    char medium[16];    /* "dram" or "ssd" */
    char endpoint[256]; /* tcp data server "host:port" */
    uint64_t size;
    uint64_t used;
    uint64_t objects; /* replicas stored in the segment */
    int draining;     /* being drained: no new replicas go here */
} kvp_segment_info_t;

typedef struct kvp_pool_stat {
    uint64_t capacity; /* sum of segment sizes */
    uint64_t used;     /* bytes allocated (complete + pending) */
    uint64_t objects;  /* complete objects */
    uint64_t pending;  /* objects being written */
    size_t n_segments;
    kvp_segment_info_t *segments;
    uint64_t evicted_objects; /* since the master started */
    uint64_t evicted_bytes;
    uint64_t put_timeouts;    /* PENDING puts revoked by the put timeout */
    uint64_t moved_objects;   /* objects moved off draining segments */
    uint64_t reading_objects; /* objects with reads in flight (under a read lease) */
    uint64_t reading_bytes;   /* their bytes, removed-while-read objects included */
    uint64_t leases_released; /* reads ended by the reader (since the master started) */
    uint64_t leases_expired;  /* read leases ended by --lease-ttl: readers that died */
    /* tiers (docs/architecture.md, "Tiers"); counters since the master started */
    uint64_t ssd_capacity;        /* part of capacity on SSD segments */
    uint64_t ssd_used;            /* part of used on SSD segments */
    uint64_t offloaded_objects;   /* DRAM victims copied to SSD */
    uint64_t offload_dropped;     /* DRAM victims dropped: no SSD room */
    uint64_t offload_failed;      /* offloads that failed (stayed in DRAM) */
    uint64_t offloading_objects;  /* offloads in flight now */
    uint64_t promoted_objects;    /* SSD-only objects copied back to DRAM after a hit */
    uint64_t hits_dram;           /* objects gets found with a DRAM replica */
    uint64_t hits_ssd;            /* objects gets found on SSD only */
    uint64_t ssd_evicted_objects; /* dropped from SSD to make room */
    uint64_t adopted_objects;     /* brought back by segments at their (re)mount */
    uint64_t ssd_lost_objects;    /* SSD copies found unreadable (I/O or checksum) */
    /* metadata that survives the master (docs/operations.md, "Master restart") */
    uint64_t adopt_refused; /* stale entries segments offered back: dropped, never served */
    /* high availability (docs/operations.md, "High availability"); "" / 0 standalone */
    char leader[256];    /* the leader's control address */
    uint64_t epoch;      /* its epoch: grows with every new leader */
    char standbys[1024]; /* the standbys' addresses, comma-separated */
    /* segments dropped for silence (kvpool-master --segment-grace), since the master started */
    uint64_t taken_back;    /* objects taken back when their segment mounted again */
    uint64_t limbo_expired; /* objects not taken back (grace over, or removed, overwritten or
                             * in the way since): dropped, never served */
} kvp_pool_stat_t;

/*
 * What the calling thread's last failed kvpool call was about, in words:
 * "get model@blk-7: read from segment 10.0.0.5:40123 failed: operation
 * timed out", "create: tcp_streams must be 1..64 (got 100)". Every public
 * call that fails (returns a negative status, or a batch with a failed key)
 * sets it; a successful call leaves it unchanged, like errno. Thread-local:
 * one thread's failure never shows in another's. The string is valid until
 * the thread's next failing call; never NULL.
 */
const char *kvp_client_last_error(void);

/* Pool-wide view from the master. Free with kvp_pool_stat_free(). */
kvp_status_t kvp_pool_stat(kvp_client_t *client, kvp_pool_stat_t **stat_p);
void kvp_pool_stat_free(kvp_pool_stat_t *stat);

/* ---- client metrics ---- */

/* Transports of the metrics' per-transport counters: kvp_metrics_t.client[] and .served[]
 * are indexed by these (KVP_METRICS_TP_MAX slots; unused ones stay 0). "ssd" is a
 * transfer to or from an SSD segment (carried over tcp by its data server): counted apart
 * so the tiers show; "tcp" is then DRAM segments only. */
#define KVP_METRICS_TP_TCP 0
#define KVP_METRICS_TP_SHM 1
#define KVP_METRICS_TP_RDMA 2
#define KVP_METRICS_TP_SSD 3
#define KVP_METRICS_TP_DFS 4   /* DFS replicas read or written in the shard files themselves */
#define KVP_METRICS_TP_COUNT 5 /* in use now */
#define KVP_METRICS_TP_MAX 8   /* slots in the struct (room to grow) */

/* The version kvp_metrics_snapshot writes into kvp_metrics_t.version (2: master_rpc[] and
 * transfer_runs / transfer_ns added; 4: te_refused_*). */
#define KVP_METRICS_VERSION 4

/* Slots of kvp_metrics_t.master_rpc[]: indexed by the wire's method number
 * (docs/protocol.md, "Control plane": the method table); kvp_metrics_rpc_name says
 * which are in use. */
#define KVP_METRICS_RPC_MAX 32

/* Counters of one direction of one transport. */
typedef struct kvp_metrics_count {
    uint64_t ops;   /* transfers that completed successfully */
    uint64_t bytes; /* their bytes */
} kvp_metrics_count_t;

/* Counters of one method of the master connection's calls. */
typedef struct kvp_metrics_rpc {
    uint64_t calls;   /* calls made (a one-way LeaseRelease: messages sent) */
    uint64_t failed;  /* of them, calls that got no answer: the connection failed or could
                         not be made, the call timed out, or the master refused the frame */
    uint64_t wait_ns; /* summed wall time from each call's start to its answer (or its
                         failure; a one-way message: to the end of its send), retries and
                         reconnections included */
} kvp_metrics_rpc_t;

/*
 * A snapshot of this client's counters, all since kvp_client_create, all monotonic except
 * the capacities. Set `size` to sizeof(kvp_metrics_t) (the library writes no byte past
 * it, so a caller built against an older, shorter struct keeps working) and read
 * `version` to know which fields a newer library filled; fields are only ever added at
 * the end.
 *
 * As initiator (puts and gets this process made): client[tp].put / .get count transfer
 * operations, one per contiguous extent moved (an object replica; a scatter/gather
 * object counts one per buffer piece), whatever the transport slices it into. Replicas
 * count once each: a put with 2 replicas is 2 put ops. Offloads and promotions that an
 * SSD segment's owner does are counted too (a get from DRAM and a put to DRAM).
 * put_errors / get_errors: transfer operations that failed (I/O, timeout, transport,
 * segment gone) and gets whose bytes failed their CRC32C check. Not counted: requests the
 * master refused (not found, pool full): no transfer was made.
 * staged[0] (host) / staged[1] (gpu): the part of those operations copied through
 * staging buffers (CUDA device memory, or host memory the NIC has not registered).
 *
 * As segment owner (what peers did to our segments): served[tp].get counts requests
 * served by a data server that read the segment (the peer's get), .put the ones that
 * wrote it; one per extent of a vectored request, one per slice of a sliced transfer.
 * Only the tcp data server (served[KVP_METRICS_TP_TCP], the DRAM segment) and the SSD
 * data server (served[KVP_METRICS_TP_SSD]) see requests: one-sided shm and rdma
 * transfers never involve the owner, so they are not counted here (only by the peer
 * that made them, as its client[] counters).
 *
 * SSD I/O of this client's SSD segment (its data server, the offload worker and the
 * file's object table): reads and writes that completed, their bytes, and the ones that
 * failed.
 *
 * Where a batch's time goes (version 2): master_rpc[method] counts this client's calls on
 * its master connection and the time each waited for its answer (a put batch is a
 * PutStart and a PutEnd; a get batch a GetReplicaList and a one-way LeaseRelease; an
 * exist batch an Exist), and transfer_runs / transfer_ns the batches of transfers its
 * puts ([0]) and gets ([1]) ran and their wall time (a get's every round of replicas
 * counts). A put batch's time is about its two calls' wait plus its transfer time; what
 * is left is the client's own work (packing, checksums). Threads that share the client
 * add up: their sums can exceed the wall clock.
 *
 * Thread: any; counters are read one by one with relaxed atomics, so a snapshot taken
 * while transfers run may show one counter a little ahead of another.
 */
typedef struct kvp_metrics {
    size_t size;      /* in: sizeof(kvp_metrics_t) as the caller knows it */
    uint32_t version; /* out: KVP_METRICS_VERSION of the library that filled it */
    uint32_t reserved;
    struct {
        kvp_metrics_count_t put, get;
    } client[KVP_METRICS_TP_MAX];
    uint64_t put_errors, get_errors;
    struct {
        kvp_metrics_count_t put, get;
    } served[KVP_METRICS_TP_MAX];
    kvp_metrics_count_t staged[2]; /* [0] host, [1] gpu staging */
    kvp_metrics_count_t ssd_read, ssd_write;
    uint64_t ssd_io_errors;
    /* mounted segments ("" and 0: none) */
    char dram_segment[300];
    uint64_t dram_capacity; /* bytes; 0 once drained */
    char ssd_segment[300];
    uint64_t ssd_capacity;
    int32_t dram_mounted;  /* 1 while the DRAM segment is mounted (kvp_client_segment_mounted) */
    int32_t dram_draining; /* 1 while its objects are being moved away (kvp_drain) */
    int32_t ssd_mounted;   /* 1 while an SSD segment is open */
    int32_t reserved2;
    /* connections of other hosts this process's data servers refused (protected mode) */
    uint64_t refused_protected;
    /* data requests its data servers refused for a missing or bad grant (data grants on:
     * docs/protocol.md "Grants"); each closed its connection */
    uint64_t refused_grant;
    /* requests for its segment's memory (the shm hand-off) it refused: another user, no
     * or a bad MAP grant (docs/protocol.md "Shared memory") */
    uint64_t refused_shm;
    /* rdma connection requests to its segment it refused: no proof of a principal that may
     * hold the segment, a bad, stale or replayed proof, or past the principal's cap of
     * queue pairs (docs/protocol.md "Data plane, rdma transport") */
    uint64_t refused_rdma;
    /* remote access errors peers caused on its segment's rdma queue pairs (a bad rkey,
     * address or permission: the QPs' async events), and the NIC's own count of them
     * (-1: the device keeps none, e.g. Soft-RoCE) */
    uint64_t rdma_access_errors;
    int64_t rdma_nic_access_errors;
    /* version 2: the master connection's calls by method, and the transfers' wall time */
    kvp_metrics_rpc_t master_rpc[KVP_METRICS_RPC_MAX];
    uint64_t transfer_runs[2]; /* [0] put, [1] get: batches of transfers run */
    uint64_t transfer_ns[2];   /* their summed wall time */
    /* version 3: connections its data servers (tcp and the shm socket) closed for their
     * limits (docs/security.md, "Owner data servers"): past the cap in all, past the
     * peer's (an address; a uid on the shm socket), past the cap of connections not yet
     * authenticated (a new one refused, or the oldest closed for it), not authenticated
     * in time, a request not completed in time, and accepted and closed for want of
     * descriptors or threads */
    uint64_t refused_conn_limit;
    uint64_t refused_peer_limit;
    uint64_t refused_unauth_limit;
    uint64_t refused_handshake_timeout;
    uint64_t refused_frame_timeout;
    uint64_t refused_resources;
    /* version 4: what this process's transfer engines (kvpool_te.h; all of them, live and
     * destroyed) refused, by reason: a range not registered, another host (protected
     * mode), another user of this host, no proved allowed principal, a request the
     * principal's roles do not allow, a principal of another tenant (kvp_te_counters_t) */
    uint64_t te_refused_range;
    uint64_t te_refused_protected;
    uint64_t te_refused_user;
    uint64_t te_refused_auth;
    uint64_t te_refused_role;
    uint64_t te_refused_tenant;
} kvp_metrics_t;

/*
 * Fill *out (out->size set by the caller, at least offsetof(kvp_metrics_t, client)) with
 * this client's counters. KVP_OK; KVP_ERR_INVALID_ARG for a NULL argument or a size too
 * small. Takes no lock of the data path and allocates nothing. Thread: any.
 */
kvp_status_t kvp_metrics_snapshot(kvp_client_t *client, kvp_metrics_t *out);

/* "tcp", "shm", "rdma", "ssd" for a KVP_METRICS_TP_* index; NULL for an unused one. */
const char *kvp_metrics_transport_name(unsigned tp);

/* The method of kvp_metrics_t.master_rpc[i] ("put_start", "get_replica_list", ...); NULL
 * for a slot no method uses. */
const char *kvp_metrics_rpc_name(unsigned i);

/*
 * The snapshot in the Prometheus text exposition format (version 0.0.4), with HELP and
 * TYPE lines: kvpool_client_ops_total{transport,op="put|get"},
 * kvpool_client_bytes_total{transport,op}, kvpool_client_errors_total{op},
 * kvpool_client_staged_ops_total{kind}, kvpool_client_staged_bytes_total{kind},
 * kvpool_served_ops_total{transport}, kvpool_served_bytes_total{transport},
 * kvpool_ssd_io_ops_total{op="read|write"}, kvpool_ssd_io_bytes_total{op},
 * kvpool_ssd_io_errors_total, kvpool_segment_capacity_bytes{segment,tier="dram|ssd"}.
 * Writes at most cap bytes (NUL included) to buf and returns the length the whole text
 * needs (without the NUL), like snprintf: call again with a larger buffer when it is
 * >= cap. buf may be NULL when cap is 0. m is a whole kvp_metrics_t as this header
 * defines it (filled by kvp_metrics_snapshot). Thread: any; touches nothing but its
 * arguments.
 */
size_t kvp_metrics_format_prometheus(const kvp_metrics_t *m, char *buf, size_t cap);

/* ---- scatter/gather, ranged reads, asynchronous batches (docs/architecture.md) ---- */

/*
 * Batch put where object i is the concatenation of bufs[i][0..n_bufs[i]) of
 * sizes[i][0..n_bufs[i]) bytes, in order (e.g. one buffer per layer's K and V:
 * vLLM's and SGLang's batch_put_from_multi_buffers). Zero-copy like
 * kvp_batch_put_from on every transport: each buffer is written straight into
 * the object's extent at its running offset (device buffers are staged as
 * there); the CRC stored is the whole object's. n_bufs[i] >= 1; a buffer of
 * size 0 is skipped (it may be NULL); the total must be >= 1. A key whose
 * arrays are missing, whose buffer is NULL, or whose total is 0 gets
 * KVP_ERR_INVALID_ARG. Every buffer is read during the call only. results[i]
 * per key; returns as kvp_batch_put_from (its outcomes too). config may be NULL.
 */
kvp_status_t kvp_batch_put_from_multi(kvp_client_t *client, const char *const *keys,
                                      const void *const *const *bufs, const size_t *const *sizes,
                                      const size_t *n_bufs, size_t n,
                                      const kvp_put_config_t *config, kvp_status_t *results);

/*
 * Batch get that scatters object i into bufs[i][0..n_bufs[i]) of capacities
 * sizes[i][..], in order: the first buffer is filled, then the next, until the
 * object ends (batch_get_into_multi_buffers). results[i]: the object's true
 * length (>= 1) on success, the buffers past the object's end left untouched;
 * or a negative status: KVP_ERR_BUFFER_TOO_SMALL when the buffers' total
 * capacity is less than the object (nothing written), KVP_ERR_NOT_FOUND,
 * KVP_ERR_INVALID_ARG (missing arrays, a NULL buffer of non-zero capacity),
 * and kvp_batch_get_into's others. CRC-checked like kvp_batch_get_into (the
 * CRC over the pieces, in order): never a success with wrong bytes. Buffers of
 * capacity 0 are skipped. Returns as kvp_batch_put_from.
 */
kvp_status_t kvp_batch_get_into_multi(kvp_client_t *client, const char *const *keys,
                                      void *const *const *bufs, const size_t *const *sizes,
                                      const size_t *n_bufs, size_t n, int64_t *results);

/* One ranged read: bytes [offset, offset + length) of object `key` into buf. */
typedef struct kvp_range {
    const char *key;
    uint64_t offset;
    uint64_t length; /* buf holds at least this many bytes */
    void *buf;
} kvp_range_t;

/*
 * Ranged reads (n <= KVP_MAX_BATCH). results[i]: the bytes read into
 * ranges[i].buf, == length, or fewer when the range reaches past the object's
 * end (it is read up to the end; nothing is written past the returned count);
 * or negative: KVP_ERR_NOT_FOUND, KVP_ERR_OUT_OF_RANGE (offset >= the object's
 * size), KVP_ERR_INVALID_ARG (length 0, NULL buf), KVP_ERR_BAD_KEY, transfer
 * errors. Several ranges may name the same key: its replicas are asked for
 * once. Not CRC-checked: the stored CRC covers whole objects, so a part of one
 * cannot be verified (a get of the whole object can). Returns as
 * kvp_batch_put_from.
 */
kvp_status_t kvp_get_into_ranges(kvp_client_t *client, const kvp_range_t *ranges, size_t n,
                                 int64_t *results);

/*
 * Transfer sessions (Mooncake's batch_get_session_* / batch_put_session_*): the master is
 * asked once per key at start; the ranged transfers in between go straight to the replicas
 * with no master call (SGLang's layer-wise KV load and save). Sessions belong to this
 * client (any of its threads) and see only what the master lets its principal see (its
 * tenant's keys). Every array has n entries (n <= KVP_MAX_BATCH); results[i] is key i's.
 * The range calls allocate nothing per call beyond the thread's reused scratch arena.
 *
 * kvp_batch_get_session_start: look up each key's replicas and take a read lease (a start
 * of a key already in a get session replaces it). results[i]: KVP_OK, KVP_ERR_NOT_FOUND,
 * KVP_ERR_BAD_KEY, master errors (a failed start ends the key's session).
 *
 * kvp_batch_get_into_multi_ranges: key i's ranges b < n_bufs[i]: sizes[i][b] bytes of the
 * object from offsets[i][b] into bufs[i][b]. results[i]: the bytes read (the sum of its
 * sizes), or KVP_ERR_INVALID_ARG (no get session, or a range past the object's end:
 * nothing read), KVP_ERR_LEASE_EXPIRED (the lease ended before or during the read: the
 * session is dropped; the bytes are not trusted), transfer errors (each replica is tried).
 * Not CRC-checked (the stored CRC covers whole objects).
 *
 * kvp_batch_get_session_end: drop the keys' get sessions (and hand their leases back);
 * keys with none are ignored. KVP_OK.
 */
kvp_status_t kvp_batch_get_session_start(kvp_client_t *client, const char *const *keys, size_t n,
                                         kvp_status_t *results);
kvp_status_t kvp_batch_get_into_multi_ranges(kvp_client_t *client, const char *const *keys,
                                             void *const *const *bufs, const size_t *const *sizes,
                                             const uint64_t *const *offsets, const size_t *n_bufs,
                                             size_t n, int64_t *results);
kvp_status_t kvp_batch_get_session_end(kvp_client_t *client, const char *const *keys, size_t n);

/*
 * kvp_batch_put_session_start: reserve each object of sizes[i] bytes (PutStart: invisible
 * until the end). results[i]: KVP_OK; KVP_ERR_INVALID_ARG (the key is in a put session
 * already, size 0, a bad config); KVP_ERR_EXISTS, KVP_ERR_PENDING, KVP_ERR_POOL_FULL,
 * KVP_ERR_QUOTA and the other PutStart outcomes of kvp_batch_put_from.
 *
 * kvp_batch_put_from_multi_ranges: write key i's ranges (sizes[i][b] bytes from bufs[i][b]
 * at object offset offsets[i][b]) into every replica, zero-copy. results[i]: the bytes
 * written, or KVP_ERR_INVALID_ARG (no put session, it is being ended, or a range past the
 * object's size: nothing written), KVP_ERR_PUT_REVOKED (the master's put timeout is near
 * or over: nothing written), transfer errors (KVP_ERR_NO_REPLICA: no replica reached).
 * A replica a write missed is dropped at the end; the others keep the object.
 *
 * kvp_batch_put_session_end: make the objects visible (PutEnd). Each byte must have been
 * written by a range (the same range may be written again): else KVP_ERR_INVALID_ARG and
 * the session stays open. results[i]: KVP_OK; KVP_ERR_INVALID_ARG (no put session);
 * KVP_ERR_PUT_REVOKED (the master dropped the put: timed out, or its connection closed);
 * KVP_ERR_IO (no replica was written whole). A put that is over leaves its session.
 *
 * kvp_batch_put_session_revoke: drop the puts (PutRevoke): the keys stay absent.
 * results[i]: KVP_OK (also when the master had dropped it already), KVP_ERR_INVALID_ARG
 * (no put session), master errors (the session stays, to retry).
 *
 * End and revoke wait for the range calls in flight on their keys; a range call started
 * after them gets KVP_ERR_INVALID_ARG. A client that dies holding put sessions leaves
 * nothing: the master revokes its PENDING puts (its connection closes, or --put-timeout).
 */
kvp_status_t kvp_batch_put_session_start(kvp_client_t *client, const char *const *keys,
                                         const uint64_t *sizes, size_t n,
                                         const kvp_put_config_t *config, kvp_status_t *results);
kvp_status_t kvp_batch_put_from_multi_ranges(kvp_client_t *client, const char *const *keys,
                                             const void *const *const *bufs,
                                             const size_t *const *sizes,
                                             const uint64_t *const *offsets, const size_t *n_bufs,
                                             size_t n, int64_t *results);
kvp_status_t kvp_batch_put_session_end(kvp_client_t *client, const char *const *keys, size_t n,
                                       kvp_status_t *results);
kvp_status_t kvp_batch_put_session_revoke(kvp_client_t *client, const char *const *keys, size_t n,
                                          kvp_status_t *results);

/*
 * Asynchronous batches. A queue runs submitted batches on its own worker
 * threads (a fixed pool, started at create; never a thread per call), each
 * exactly as the synchronous call would, and signals each completion on an
 * eventfd the caller can poll or hand to an event loop (epoll, asyncio
 * add_reader). Batches run concurrently, so they may complete in any order;
 * user_data tells them apart.
 */
typedef struct kvp_aq kvp_aq_t;

typedef struct kvp_aq_completion {
    void *user_data;     /* as submitted */
    kvp_status_t status; /* the batch call's return */
} kvp_aq_completion_t;

/* Batches submitted and not yet reaped, at most, per queue. */
#define KVP_AQ_MAX_INFLIGHT 1024

/*
 * A queue over `client` (borrowed: it must outlive the queue) with `workers`
 * threads (0: 2; at most 64). KVP_OK and *aq_p set; KVP_ERR_INVALID_ARG,
 * KVP_ERR_NOMEM, KVP_ERR_SYSTEM (no eventfd or thread).
 */
kvp_status_t kvp_aq_create(kvp_client_t *client, unsigned workers, kvp_aq_t **aq_p);

/*
 * Wait for every submitted batch to complete, then stop the workers and free
 * the queue; completions not reaped are dropped and the fd is closed. No
 * other call on the queue may be in flight or follow. NULL is ignored.
 */
void kvp_aq_destroy(kvp_aq_t *aq);

/*
 * The queue's eventfd (EFD_NONBLOCK | EFD_CLOEXEC, owned by the queue):
 * readable exactly while completions wait to be reaped. Read it only through
 * kvp_aq_reap. KVP_ERR_INVALID_ARG for a NULL aq.
 */
int kvp_aq_fd(kvp_aq_t *aq);

/*
 * Submit a batch and return at once: kvp_batch_put_from, kvp_batch_get_into,
 * kvp_batch_is_exist (prefix length not reported) with the same arguments,
 * run on a worker exactly as the synchronous call: results[] and the
 * completion's status are what it would give (bad arrays included).
 * Every array (keys and their strings, bufs and the memory they point to,
 * sizes/caps, results) is borrowed until the batch's completion is reaped:
 * keep it valid and untouched until then. The put config and its strings
 * are copied here (the caller's may go away). Outcomes: KVP_OK (a completion
 * will come); KVP_ERR_TOO_MANY when KVP_AQ_MAX_INFLIGHT batches are submitted
 * and not yet reaped (reap some first); KVP_ERR_INVALID_ARG (NULL aq, a config
 * string too long: preferred_segment over 255 bytes, medium over 31);
 * KVP_ERR_SHUTDOWN once destroy began. Nothing is submitted on failure.
 * Thread: any, concurrently.
 */
kvp_status_t kvp_aq_put(kvp_aq_t *aq, const char *const *keys, const void *const *bufs,
                        const size_t *sizes, size_t n, const kvp_put_config_t *config,
                        kvp_status_t *results, void *user_data);
kvp_status_t kvp_aq_get(kvp_aq_t *aq, const char *const *keys, void *const *bufs,
                        const size_t *caps, size_t n, int64_t *results, void *user_data);
kvp_status_t kvp_aq_exist(kvp_aq_t *aq, const char *const *keys, size_t n, int *results,
                          void *user_data);

/*
 * Non-blocking: move up to `max` completed batches to out, oldest completion
 * first, and return how many. The eventfd is read down when none is left, so
 * it stays readable exactly while more wait. A reaped batch's arrays are the
 * caller's again. Thread: any, concurrently.
 */
size_t kvp_aq_reap(kvp_aq_t *aq, kvp_aq_completion_t *out, size_t max);

#ifdef __cplusplus
}
#endif

#endif
