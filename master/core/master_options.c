/*
 * master_options.c - kvpool-master's options, one row each (common/options.h): the flag
 * (which is also the config-file key), its type, default, field of kvp_master_config_t,
 * environment variable and help. main.c makes the getopt entries and --help from it,
 * config.c the defaults and the reading of a value, --options-markdown docs/options.md.
 *
 * Thread: any (the table is constant).
 */
#include <string.h>

#include "common/log.h"
#include "common/macros.h"
#include "master/core/config.h"

#define F(field) KVP_OPT_FIELD(kvp_master_config_t, field)

/* --cluster: a name of 1..128 bytes without '/' (it is a path component of etcd keys). */
static kvp_status_t parse_cluster(const kvp_opt_t *opt, const char *value, void *field, char *err,
                                  size_t err_len)
{
    (void)opt;
    if (value[0] == '\0' || strlen(value) > 128 || strchr(value, '/') != NULL) {
        snprintf(err, err_len, "--cluster needs a name of 1..128 bytes without '/'");
        return KVP_ERR_INVALID_ARG;
    }
    *(const char **)field = value;
    return KVP_OK;
}

static const kvp_opt_t master_rows[] = {
    KVP_OPT_GROUP("General", NULL),
    {.name = "listen",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     .arg = "HOST:PORT",
     .def = "127.0.0.1:50051",
     F(listen),
     .help = "control-plane address (port 0 picks a free port)"},
    KVP_OPT_ROW_READY_FD(kvp_master_config_t, ready_fd),
    KVP_OPT_ROW_LOG_LEVEL(kvp_master_config_t, log_level, "KVPOOL_LOG_LEVEL"),
    {.name = "auth",
     .type = KVP_OPT_STRING,
     .arg = "protected|none",
     .def = "protected",
     F(auth),
     .help = "protected (no credentials configured): take connections from this host only, "
             "refusing others with KVP_ERR_DENIED; none: anyone who reaches the port (a "
             "trusted network only)"},
    {.name = "config",
     .type = KVP_OPT_ACTION,
     .arg = "FILE",
     .help = "read settings from FILE (INI: every flag is a key, e.g. lease-ttl = 5, "
             "no-eviction = true; keys before any section and under [master] apply; flags "
             "given here override it)"},
    KVP_OPT_ROWS_ACTIONS,

    KVP_OPT_GROUP("Security",
                  "with these the port is open to other hosts, and every connection is TLS 1.3 "
                  "and names a principal; docs/security.md"),
    {.name = "tls-cert",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(tls_cert),
     .help = "the master's certificate (PEM)"},
    {.name = "tls-key",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(tls_key),
     .help = "the key of --tls-cert"},
    {.name = "tls-ca",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(tls_ca),
     .help = "the CA of client certificates (mutual TLS)"},
    {.name = "tls-crl",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(tls_crl),
     .help = "revoked client certificates (PEM CRL)"},
    {.name = "acl-file",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(acl_file),
     .help = "principals: tenant, roles, cert-cn, token-sha256, key patterns; SIGHUP reloads "
             "it (and the TLS files)"},
    {.name = "max-tasks-per-tenant",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "0",
     .def_doc = "0 (an equal share)",
     F(max_tasks_per_tenant),
     .max = 4096,
     .help = "with an ACL: copy and move tasks one tenant may have waiting or running at once "
             "(past it TaskCreate is refused with KVP_ERR_TOO_MANY), and the most of its ended "
             "ones kept for query_task, its oldest going first; 0: 4096 (the master's cap of "
             "both, over all tenants) divided by the tenants the ACL's principals belong to "
             "(\"default\" for one that names none)"},
    {.name = "data-grants",
     .type = KVP_OPT_ON_OFF,
     .def = "on",
     F(data_grants),
     .help = "with TLS: every tcp data request carries a grant the master sealed for that "
             "extent, op and time, checked by the segment's owner (off: owners serve any "
             "request, as without TLS)"},
    {.name = "mount-proof",
     .type = KVP_OPT_ON_OFF,
     .def = "on",
     F(mount_proof),
     .help = "before a mount is answered, connect to the tcp endpoint it advertises: the "
             "server there must prove it serves that segment with the secret its owner sent "
             "(refused otherwise; off: the endpoint is only compared with other principals', "
             "for masters that cannot reach the owners' data ports)"},
    {.name = "mount-proof-timeout",
     .type = KVP_OPT_SECONDS_MS,
     .def = "2",
     F(mount_proof_timeout_ms),
     .help = "a mount whose endpoint has not proven itself within this (connect and answer) "
             "is refused"},

    KVP_OPT_GROUP("Admission limits",
                  "what peers may hold of the master: connections, time to authenticate, time "
                  "to send a frame, buffered input; a refusal closes the connection and is "
                  "counted in kvpool_connections_refused_total by reason (docs/security.md)"),
    {.name = "max-connections",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "10000",
     F(max_conns),
     .max = 1u << 24,
     .help = "connections open at most, never more than the descriptor limit (RLIMIT_NOFILE) "
             "leaves room for; a new one past it takes the place of the oldest connection not "
             "authenticated yet, or is closed (0: the descriptor limit only)"},
    {.name = "max-connections-per-peer",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "1024",
     F(max_conns_per_peer),
     .max = 1u << 24,
     .help = "... from one peer address (IPv6: one /64) (0: no cap)"},
    {.name = "max-connections-per-principal",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "1024",
     F(max_conns_per_principal),
     .max = 1u << 24,
     .help = "with an ACL: connections one principal may hold, from any peers; one past it is "
             "refused when it names the principal (certificate or token), the others stay "
             "(0: no cap). A principal's connections share one turn of the loop however many "
             "it opens"},
    {.name = "max-unauthenticated",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "1024",
     F(max_unauth),
     .max = 1u << 24,
     .help = "connections not authenticated yet (TLS handshake and Auth, or without an ACL "
             "their first whole request) at most: past it the oldest of them is closed (0: no "
             "cap)"},
    {.name = "max-unauthenticated-per-peer",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "128",
     F(max_unauth_per_peer),
     .max = 1u << 24,
     .help = "... from one peer address (IPv6: one /64) (0: no cap)"},
    {.name = "auth-timeout",
     .type = KVP_OPT_SECONDS_MS,
     .def = "5",
     F(auth_timeout_ms),
     .help = "close a connection not authenticated this long after it was accepted, whatever "
             "it sends meanwhile (0: never)"},
    {.name = "frame-timeout",
     .type = KVP_OPT_SECONDS_MS,
     .def = "10",
     F(frame_timeout_ms),
     .help = "close a connection whose frame (request) is not whole this long after its first "
             "byte arrived, whatever it sends meanwhile (0: never)"},
    {.name = "max-input-buffers",
     .type = KVP_OPT_SIZE,
     .arg = "SIZE",
     .def = "1GiB",
     F(max_input_bytes),
     .help = "bytes of unfinished large requests (input buffers past their first 256 KiB) held "
             "for all connections together; a connection whose frame would pass it is closed "
             "(0: no cap)"},
    {.name = "max-output-buffers",
     .type = KVP_OPT_SIZE,
     .arg = "SIZE",
     .def = "1GiB",
     F(max_output_bytes),
     .help = "bytes of replies queued and not yet read by their peers, all connections "
             "together; past it the master reads no request from a connection with replies "
             "queued until they are read (one connection: past 4 MiB; 0: no cap in all)"},

    KVP_OPT_GROUP("Eviction, leases, timeouts", NULL),
    {.name = "evict-high-watermark",
     .type = KVP_OPT_FRACTION,
     .def = "1.0",
     F(evict_high),
     .help = "also evict in the background when used/capacity passes F (1.0: off; puts "
             "evict what they need)"},
    {.name = "evict-low-watermark",
     .type = KVP_OPT_FRACTION,
     .def = "0.98",
     F(evict_low),
     .help = "... down to F"},
    {.name = "lease-ttl",
     .type = KVP_OPT_SECONDS_MS,
     .def = "5",
     F(lease_ttl_ms),
     .help = "safety net of a read lease: a get releases its lease when its transfer ends; "
             "one never released (the reader died) ends this long after it was granted"},
    {.name = "put-timeout",
     .type = KVP_OPT_SECONDS_MS,
     .def = "30",
     F(put_timeout_ms),
     .help = "revoke a put not ended by then"},
    {.name = "soft-pin-ttl",
     .type = KVP_OPT_SECONDS,
     .def = "1800",
     F(soft_pin_ttl_s),
     .help = "default soft pin lifetime"},
    {.name = "client-ttl",
     .type = KVP_OPT_SECONDS_MS,
     .def = "10",
     F(client_ttl_ms),
     .help = "drop a client silent this long: its segments are unmounted, its puts revoked "
             "(0: never)"},
    {.name = "segment-grace",
     .type = KVP_OPT_SECONDS_MS,
     .def = "60",
     F(segment_grace_ms),
     .help = "keep what a DRAM segment dropped so held: taken back if that segment mounts "
             "again within it (its owner was cut off, not restarted); keep a DFS segment "
             "whose owner went silent, its objects readable in the directory, until a mount of "
             "its shard file takes it over (0: off)"},
    {.name = "index-seed",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "0",
     F(index_seed),
     .max = INT64_MAX,
     .help = "the key index's hash seed (0: a random one drawn at start). A fixed one makes "
             "eviction repeat exactly from run to run (benchmarks, tests); whoever knows it can "
             "choose keys that pile into one bucket: leave 0 in production"},
    {.name = "lease-on-exist",
     .type = KVP_OPT_SET_TRUE,
     .def = "off",
     F(lease_on_exist),
     .help = "exist grants read leases too (default: only get)"},
    {.name = "lease-on-put",
     .type = KVP_OPT_SET_TRUE,
     .def = "off",
     F(lease_on_put),
     .help = "an object just written is leased for --lease-ttl: no plain remove or replica "
             "clear until then (Mooncake's master leases it for 0 ms)"},
    {.name = "hot-key-reads",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "0",
     F(hot_key_reads),
     .max = 1u << 30,
     .help = "a key read N times or more in a second gets replicas on more segments, written "
             "by a replica's owner, and loses them once its reads stay under N/4 a second for 5 "
             "s (0: off)"},
    {.name = "hot-key-replicas",
     .type = KVP_OPT_UINT,
     .arg = "N",
     .def = "2",
     F(hot_key_replicas),
     .min = 1,
     .max = 7,
     .help = "replicas a hot key gets at most, beyond those it was put with"},
    {.name = "no-eviction",
     .type = KVP_OPT_SET_FALSE,
     .def = "on",
     .def_doc = "off (evict)",
     F(evict),
     .help = "never evict: a full pool refuses puts"},

    KVP_OPT_GROUP("SSD tier", "when SSD segments are mounted: kvpool serve --ssd-path"),
    {.name = "offload-high-watermark",
     .type = KVP_OPT_FRACTION,
     .def = "0.95",
     F(offload_high),
     .help = "offload DRAM victims to SSD in the background when DRAM used/capacity passes F"},
    {.name = "offload-low-watermark",
     .type = KVP_OPT_FRACTION,
     .def = "0.90",
     F(offload_low),
     .help = "... down to F"},
    {.name = "ssd-evict-high-watermark",
     .type = KVP_OPT_FRACTION,
     .def = "0.95",
     F(ssd_evict_high),
     .help = "drop SSD objects (LRU) when SSD used passes F"},
    {.name = "ssd-evict-low-watermark",
     .type = KVP_OPT_FRACTION,
     .def = "0.90",
     F(ssd_evict_low),
     .help = "... down to F"},
    {.name = "dfs-eviction",
     .type = KVP_OPT_ON_OFF,
     .def = "on",
     F(dfs_evict),
     .help = "free DFS copies (LRU) when a DFS replica has no room or DFS used passes the high "
             "watermark (Mooncake's MOONCAKE_DFS_EVICTION_ENABLED)"},
    {.name = "dfs-evict-high-watermark",
     .type = KVP_OPT_FRACTION,
     .def = "0.90",
     F(dfs_evict_high),
     .help = "free DFS copies (LRU) when DFS used passes F"},
    {.name = "dfs-evict-low-watermark",
     .type = KVP_OPT_FRACTION,
     .def = "0.70",
     F(dfs_evict_low),
     .help = "... down to F"},
    {.name = "promote-on-hit",
     .type = KVP_OPT_ON_OFF,
     .def = "on",
     F(promote_on_hit),
     .help = "copy an SSD-only object back to DRAM in the background when a get hits it"},

    KVP_OPT_GROUP("High availability",
                  "leader election through etcd; without --etcd the master is standalone and "
                  "needs no etcd"),
    {.name = "etcd",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     .arg = "HOST:PORT[,HOST:PORT...]",
     F(etcd),
     .help = "etcd endpoints (v3 JSON gateway)"},
    {.name = "cluster",
     .type = KVP_OPT_CUSTOM,
     .arg = "NAME",
     .def = "kvpool",
     F(cluster),
     .parse = parse_cluster,
     .help = "the masters of one pool share a name; clients use --master "
             "etcd://HOST:PORT[,...]/NAME"},
    {.name = "leader-ttl",
     .type = KVP_OPT_UINT,
     .arg = "SECONDS",
     .def = "5",
     F(leader_ttl_s),
     .min = 2,
     .max = 3600,
     .need = "2..3600 seconds",
     .help = "lease of the leader: a standby takes over this long after the leader stops "
             "renewing it"},
    {.name = "advertise",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     .arg = "HOST:PORT",
     .def_doc = "the --listen address as bound",
     F(advertise),
     .help = "the address clients reach this master at"},
    {.name = "etcd-cacert",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(etcd_cacert),
     .help = "CA of etcd's certificate: TLS to every endpoint (https://HOST:PORT endpoints "
             "are TLS too)"},
    {.name = "etcd-cert",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(etcd_cert),
     .help = "client certificate for etcd's --client-cert-auth"},
    {.name = "etcd-key",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(etcd_key),
     .help = "the key of --etcd-cert"},
    {.name = "etcd-user", .type = KVP_OPT_STRING, .arg = "NAME", F(etcd_user), .help = "etcd user"},
    {.name = "etcd-password-file",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(etcd_password_file),
     .help = "the file of --etcd-user's password (never a flag value; mode 0600)"},

    KVP_OPT_GROUP("Metadata that survives the master", NULL),
    {.name = "segment-records",
     .type = KVP_OPT_ON_OFF,
     .def = "on",
     F(segment_records),
     .help = "owners of DRAM segments keep a record of the objects on them, so that a "
             "restarted master adopts them back at their remount (SSD segments' files always "
             "describe themselves; with data grants the records are kept even when off, to "
             "end write grants at their put's end, and nothing is adopted)"},
    {.name = "record-wait",
     .type = KVP_OPT_SECONDS_MS,
     .def = "2",
     F(record_wait_ms),
     .help = "the answer to a request that changed a DRAM segment's objects (a put's end, a "
             "remove) waits until the change is in the socket of the segment's owner's record "
             "stream, so that a kill -9 of the master loses no acknowledged change; an owner "
             "that takes nothing for this long gets it answered anyway, counted "
             "(kvpool_record_wait_expired_total); keep it well under the clients' timeout "
             "(10 s) (0: never wait)"},

    KVP_OPT_GROUP("Operations", "docs/operations.md"),
    {.name = "http-listen",
     .type = KVP_OPT_STRING,
     .arg = "HOST:PORT",
     .def = "127.0.0.1:9003",
     F(http_listen),
     .help = "HTTP for /metrics (Prometheus), /health, /api/v1/..., /get_all_segments and "
             "/get_all_keys (when the default is taken the master runs without HTTP; off: "
             "none)"},
    {.name = "metrics-tenants",
     .type = KVP_OPT_ON_OFF,
     .def = "off",
     F(metrics_tenants),
     .help = "with an ACL: /metrics shows the per-tenant series (tenant names, objects, "
             "bytes, quotas) to every scraper; off: only to an admin principal's token or "
             "client certificate"},
    {.name = "kv-events-bind",
     .type = KVP_OPT_STRING,
     .arg = "ENDPOINT",
     F(kv_events_bind),
     .def_doc = "off",
     .help = "publish KV events (stored/removed/cleared) on a ZeroMQ PUB socket, e.g. "
             "tcp://127.0.0.1:5557"},
    {.name = "kv-events-replay-bind",
     .type = KVP_OPT_STRING,
     .arg = "ENDPOINT",
     F(kv_events_replay),
     .help = "answer replays of missed batches here"},
    {.name = "kv-events-topic",
     .type = KVP_OPT_STRING,
     .arg = "T",
     .def = "kvpool",
     F(kv_events_topic),
     .help = "first frame of every message"},
    {.name = "kv-events-queue",
     .type = KVP_OPT_UINT,
     .def = "65536",
     F(kv_events_queue),
     .max = 1u << 22,
     .help = "events queued before the oldest are dropped"},
    {.name = "kv-events-replay-batches",
     .type = KVP_OPT_UINT,
     .def = "4096",
     F(kv_events_replay_batches),
     .max = 1u << 20,
     .help = "batches kept for replay"},
    {.name = "kv-events-model",
     .type = KVP_OPT_STRING,
     .arg = "NAME",
     .def = "kvpool",
     F(kv_events_model),
     .help = "the events' envelope: model name"},
    {.name = "kv-events-block-size",
     .type = KVP_OPT_UINT,
     .def = "0",
     F(kv_events_block_size),
     .max = 1u << 24,
     .help = "the events' envelope: block size"},
    {.name = "kv-events-tenant",
     .type = KVP_OPT_STRING,
     .arg = "ID",
     .def = "default",
     F(kv_events_tenant),
     .help = "the events' envelope: tenant"},
    {.name = "kv-events-backend-id",
     .type = KVP_OPT_STRING,
     .arg = "ID",
     .def = "kvpool-master",
     F(kv_events_backend_id),
     .help = "the events' envelope: backend id"},
    {.name = "kv-events-dp-rank",
     .type = KVP_OPT_UINT,
     .def = "0",
     F(kv_events_dp_rank),
     .max = 1u << 16,
     .help = "the events' envelope: data-parallel rank"},
    {.name = "kv-events-curve-secret",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(kv_events_curve_secret),
     .help = "the KV events sockets become CURVE servers with this secret key (40 Z85 "
             "characters; FILE readable by the master's user only, mode 600)"},
    {.name = "kv-events-curve-allow",
     .type = KVP_OPT_STRING,
     .arg = "FILE",
     F(kv_events_curve_allow),
     .help = "who may subscribe: lines KEY TENANT or KEY * (a subscriber's Z85 public key; it "
             "hears its tenant's events, * every tenant's); SIGHUP reloads it "
             "(deploy/make-curve-keys.sh makes key pairs)"},
};

kvp_opts_t kvp_master_options(kvp_master_config_t *cfg)
{
    return (kvp_opts_t){.rows = master_rows, .count = KVP_ARRAY_SIZE(master_rows), .base = cfg};
}
