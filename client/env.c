/*
 * env.c - the library's environment variables, one row each (common/options.h): the
 * variable, its type, default, the field of kvp_client_env_t it is read into, and its
 * help. kvp_client_env_read reads them all once, when a client is created; the table
 * also makes the "Client environment" section of docs/options.md (kvpool --env-markdown).
 *
 * Every value is read as before (a bad one is never an error here: client.c checks the
 * ones that can be wrong, with the parameter's message). Rows marked
 * KVP_OPT_F_READ_ELSEWHERE are process-wide settings read where they live (env.h).
 *
 * Thread: any.
 */
#include "client/env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "common/macros.h"

#define F(field) KVP_OPT_FIELD(kvp_client_env_t, field)
#define LAX KVP_OPT_F_ENV_LAX
#define STR (KVP_OPT_F_ENV_LAX | KVP_OPT_F_PTR)
#define ELSEWHERE (KVP_OPT_F_ENV_LAX | KVP_OPT_F_READ_ELSEWHERE)
/* A row of the data servers' limits (kvp_conn_limits_t): a count (UINT, 1..1000000) or a
 * time (SECONDS, 1..3600 s, kept in ms) */
#define DATA_LIMIT_UINT KVP_OPT_UINT, .arg = "N", .max = 1000000
#define DATA_LIMIT_SECONDS KVP_OPT_SECONDS_MS, .arg = "SECONDS", .max = 3600
#define DATA_LIMIT(nm, var, kind, field, def, text)                                                \
    {                                                                                              \
        .name = nm, .env = var, .type = DATA_LIMIT_##kind, .flags = LAX, .min = 1, .def_doc = def, \
        F(data_limits.field), .help = text                                                         \
    }

/* KVPOOL_PUT_AHEAD: "0" or "off": KVP_PUT_AHEAD_OFF; a number > 0: it (at most 4096); else
 * unset (0). */
static kvp_status_t parse_put_ahead(const kvp_opt_t *opt, const char *value, void *field, char *err,
                                    size_t err_len)
{
    (void)opt, (void)err, (void)err_len;
    char *end;
    unsigned long v = strtoul(value, &end, 10);
    if (strcmp(value, "off") == 0 || (*end == '\0' && end != value && v == 0))
        *(uint32_t *)field = KVP_PUT_AHEAD_OFF;
    else if (*end == '\0' && end != value)
        *(uint32_t *)field = (uint32_t)(v > 4096 ? 4096 : v);
    else
        *(uint32_t *)field = 0;
    return KVP_OK;
}

/* KVPOOL_RDMA_WINDOWS: "1" on, "unbounded" on any device, anything else off. */
static kvp_status_t parse_windows(const kvp_opt_t *opt, const char *value, void *field, char *err,
                                  size_t err_len)
{
    (void)opt, (void)err, (void)err_len;
    *(int *)field = strcmp(value, "1") == 0           ? KVP_RDMA_WINDOWS_ON
                    : strcmp(value, "unbounded") == 0 ? KVP_RDMA_WINDOWS_UNBOUNDED
                                                      : KVP_RDMA_WINDOWS_OFF;
    return KVP_OK;
}

/* KVPOOL_RDMA_QP_CAP: a number > 0 (atoi's reading), else the default (0). */
static kvp_status_t parse_qp_cap(const kvp_opt_t *opt, const char *value, void *field, char *err,
                                 size_t err_len)
{
    (void)opt, (void)err, (void)err_len;
    int v = atoi(value);
    *(unsigned *)field = v > 0 ? (unsigned)v : 0;
    return KVP_OK;
}

/* KVPOOL_KEEP_DUMPABLE: "1" only. */
static kvp_status_t parse_one(const kvp_opt_t *opt, const char *value, void *field, char *err,
                              size_t err_len)
{
    (void)opt, (void)err, (void)err_len;
    *(bool *)field = strcmp(value, "1") == 0;
    return KVP_OK;
}

static const kvp_opt_t env_rows[] = {
    KVP_OPT_GROUP("The master and the data path",
                  "each variable stands in for the kvp_client_params_t field named, when the "
                  "application leaves that field NULL"),
    {.name = "master",
     .env = "KVPOOL_MASTER",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "HOST:PORT",
     .def = NULL,
     .def_doc = "127.0.0.1:50051",
     F(master),
     .help = "master_addr: the master, or etcd://HOST:PORT[,HOST:PORT...]/CLUSTER (the leader "
             "of masters started with --etcd ... --cluster CLUSTER)"},
    {.name = "transport",
     .env = "KVPOOL_TRANSPORT",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "auto|tcp|shm|rdma",
     .def_doc = "auto",
     F(transport),
     .help = "transport: auto is shm on one host, else rdma if both sides have it, else tcp"},
    {.name = "rdma-device",
     .env = "KVPOOL_RDMA_DEVICE",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "LIST",
     .def_doc = "any with an active port",
     F(rdma_devices),
     .help = "rdma_devices: RDMA devices to try, e.g. rxe0,mlx5_0"},
    {.name = "rdma-host",
     .env = "KVPOOL_RDMA_HOST",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "IPV4",
     .def_doc = "the device's own",
     F(rdma_host),
     .help = "rdma_host: the address the segment's rdma listener binds and advertises"},
    {.name = "dfs-path",
     .env = "KVPOOL_DFS_PATH",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "DIR",
     .def_doc = "none",
     F(dfs_path),
     .help = "dfs_path: a DFS directory every node sees: DFS replicas are read and written in "
             "its shard files directly (no owner in the path)"},
    {.name = "dfs-size",
     .env = "KVPOOL_DFS_SIZE",
     .type = KVP_OPT_SIZE,
     .flags = LAX,
     .arg = "SIZE",
     .def_doc = "0: mount no DFS segment",
     F(dfs_size),
     .help = "dfs_size: with a DFS directory, also mount a DFS segment: a shard file of this "
             "size there"},
    {.name = "put-ahead",
     .env = "KVPOOL_PUT_AHEAD",
     .type = KVP_OPT_CUSTOM,
     .flags = LAX,
     .arg = "N|off",
     .parse = parse_put_ahead,
     .def_doc = "1024",
     F(put_ahead),
     .help = "room for this many objects (at most 4096) the master places ahead of this client's "
             "puts, so that a put batch makes one master call (PUT_COMMIT); 0 or off: none, two "
             "calls a batch (PutStart, PutEnd)"},
    {.name = "put-ahead-bytes",
     .env = "KVPOOL_PUT_AHEAD_BYTES",
     .type = KVP_OPT_SIZE,
     .flags = LAX,
     .arg = "SIZE",
     .def_doc = "64MiB",
     F(put_ahead_bytes),
     .help = "... and this many bytes of it at most (a batch larger than that makes two calls)"},
    {.name = "auth",
     .env = "KVPOOL_AUTH",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "protected|none",
     .def_doc = "protected",
     F(auth),
     .help = "auth: protected: the segment's data servers take peers of this host only; none: "
             "anyone who reaches them"},

    KVP_OPT_GROUP("Security", "docs/security.md"),
    {.name = "tls-ca",
     .env = "KVPOOL_TLS_CA",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "FILE",
     .def_doc = "none: plain TCP",
     F(tls_ca),
     .help = "tls_ca: TLS 1.3 to the master, its certificate checked against this CA and the "
             "address dialled"},
    {.name = "tls-cert",
     .env = "KVPOOL_TLS_CERT",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "FILE",
     F(tls_cert),
     .help = "tls_cert: this client's certificate (mutual TLS; its subject CN names the "
             "principal); needs a CA"},
    {.name = "tls-key",
     .env = "KVPOOL_TLS_KEY",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "FILE",
     F(tls_key),
     .help = "tls_key: the key of the certificate"},
    {.name = "token",
     .env = "KVPOOL_TOKEN",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "TOKEN",
     F(token),
     .help = "token: the principal's token, sent on every new connection to the master, over "
             "TLS only (needs a CA)"},
    {.name = "tenant-id",
     .env = "KVPOOL_TENANT_ID",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "NAME",
     F(tenant_id),
     .help = "tenant_id: Mooncake's tenant id; without a credential that binds a tenant, the "
             "namespace of this client's keys; with one, its tenant or refused"},
    {.name = "etcd-cacert",
     .env = "KVPOOL_ETCD_CACERT",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "FILE",
     .def_doc = "none: plain http",
     F(etcd.ca),
     .help = "with an etcd:// master: TLS to etcd, its certificate checked against this CA"},
    {.name = "etcd-cert",
     .env = "KVPOOL_ETCD_CERT",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "FILE",
     F(etcd.cert),
     .help = "client certificate for an etcd run with "
             "--client-cert-auth"},
    {.name = "etcd-key",
     .env = "KVPOOL_ETCD_KEY",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "FILE",
     F(etcd.key),
     .help = "the key of that certificate"},
    {.name = "etcd-user",
     .env = "KVPOOL_ETCD_USER",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "NAME",
     F(etcd.user),
     .help = "the etcd user"},
    {.name = "etcd-password-file",
     .env = "KVPOOL_ETCD_PASSWORD_FILE",
     .type = KVP_OPT_STRING,
     .flags = STR,
     .arg = "FILE",
     F(etcd.password_file),
     .help = "the file of the etcd user's password"},
    {.name = "keep-dumpable",
     .env = "KVPOOL_KEEP_DUMPABLE",
     .type = KVP_OPT_CUSTOM,
     .flags = LAX,
     .arg = "1",
     .parse = parse_one,
     .def_doc = "unset",
     F(keep_dumpable),
     .help = "with data grants on (a master with TLS) a process that mounts a segment makes "
             "itself undumpable, so its /proc entries (open files, memory) are root's only; 1: it "
             "stays dumpable, and any process of its user can open its segment"},
    {.name = "rdma-qp-cap",
     .env = "KVPOOL_RDMA_QP_CAP",
     .type = KVP_OPT_CUSTOM,
     .flags = LAX,
     .arg = "N",
     .parse = parse_qp_cap,
     .def_doc = "256",
     F(rdma_qp_cap),
     .help = "with data grants on: queue pairs one principal may hold to this process's "
             "segment; more are rejected"},
    {.name = "rdma-windows",
     .env = "KVPOOL_RDMA_WINDOWS",
     .type = KVP_OPT_CUSTOM,
     .flags = LAX,
     .arg = "1|unbounded",
     .parse = parse_windows,
     .def_doc = "unset",
     F(rdma_windows),
     .help = "serve the segment over rdma through a memory window per granted extent (kvpool "
             "serve --rdma-windows); 1 is refused on devices that do not keep an access inside "
             "its window (Soft-RoCE, siw), unbounded uses them anyway. Needs data grants on"},

    KVP_OPT_GROUP("Data servers",
                  "what peers may hold of the data servers of this process's segments (tcp, and "
                  "the Unix socket of the shm hand-off; docs/security.md, \"Owner data "
                  "servers\"): for a segment mounted in the application (library mode), whose "
                  "descriptor limit the library leaves as it is; `kvpool serve`'s --data-* flags "
                  "win over them"),
    DATA_LIMIT("data-max-conns", "KVPOOL_DATA_MAX_CONNS", UINT, max_conns, "10000",
               "connections each data server takes at once (the shm socket 1024 at most), and at "
               "most a quarter of the process's descriptor limit (ulimit -n; the shm socket a "
               "sixteenth): raise that limit for more"),
    DATA_LIMIT("data-max-conns-per-peer", "KVPOOL_DATA_MAX_CONNS_PER_PEER", UINT, max_per_peer,
               "4096",
               "of them, from one address (on the shm socket: one uid, a quarter of the socket's "
               "at most)"),
    DATA_LIMIT("data-max-unauth", "KVPOOL_DATA_MAX_UNAUTH", UINT, max_unauth, "4096",
               "of them, not yet authenticated (no HELLO proven; without data grants, no request "
               "header yet); past it the oldest is closed for a new one"),
    DATA_LIMIT("data-max-unauth-per-peer", "KVPOOL_DATA_MAX_UNAUTH_PER_PEER", UINT,
               max_unauth_per_peer, "a quarter of KVPOOL_DATA_MAX_UNAUTH",
               "of those, from one address (uid): past it the peer's new one is closed"),
    DATA_LIMIT("data-handshake-timeout", "KVPOOL_DATA_HANDSHAKE_TIMEOUT", SECONDS, handshake_ms,
               "10",
               "close a connection not authenticated this long after it connected, bytes or "
               "not"),
    DATA_LIMIT("data-frame-timeout", "KVPOOL_DATA_FRAME_TIMEOUT", SECONDS, frame_ms, "30",
               "close a connection whose request is not over this long after its first byte, "
               "plus a second per MiB the request moves"),

    KVP_OPT_GROUP("Process-wide", "process-wide settings, read where the setting lives"),
    {.name = "log-level",
     .env = "KVPOOL_LOG_LEVEL",
     .type = KVP_OPT_STRING,
     .flags = ELSEWHERE,
     .arg = "off|error|warn|info|debug",
     .def_doc = "off (the library is silent)",
     .help = "what the library logs on stderr (common/log.c, at every client's creation; the "
             "kvpool command defaults to warn, kvpool-master to info)"},
    {.name = "cuda-lib",
     .env = "KVPOOL_CUDA_LIB",
     .type = KVP_OPT_STRING,
     .flags = ELSEWHERE,
     .arg = "PATH",
     .def_doc = "libcuda.so.1",
     .help = "the CUDA driver library, loaded once when GPU memory is first seen "
             "(client/mem/gpu.c)"},
    {.name = "tcp-congestion",
     .env = "KVPOOL_TCP_CONGESTION",
     .type = KVP_OPT_STRING,
     .flags = ELSEWHERE,
     .arg = "auto|system|NAME",
     .def_doc = "auto",
     .help = "the TCP congestion control of the connections that move object bytes (a "
             "segment's data connections at both ends, the transfer engine's; common/sock.c, "
             "read once a process): auto keeps the system's unless it is BBR and the peer is on "
             "this host, which becomes cubic (without the fq qdisc BBR paces a connection's "
             "bytes with the kernel's timers: docs/operations.md; between hosts BBR stays); "
             "system keeps the system's; else the algorithm named, to every peer "
             "(net.ipv4.tcp_available_congestion_control; one the kernel refuses is logged once "
             "and the system's kept)"},
    {.name = "crc32c-no-fold",
     .env = "KVPOOL_CRC32C_NO_FOLD",
     .type = KVP_OPT_STRING,
     .flags = ELSEWHERE,
     .arg = "any",
     .def_doc = "unset",
     .help = "set: CRC32C uses the crc32 instruction's three chains only, not the "
             "VPCLMULQDQ/AVX-512 fold (for comparing; common/crc32c.c)"},

};

kvp_opts_t kvp_client_env_table(kvp_client_env_t *env)
{
    return (kvp_opts_t){.rows = env_rows, .count = KVP_ARRAY_SIZE(env_rows), .base = env};
}

/* The transfer engine's variables: typed and range-checked (a bad value fails the engine's
 * creation, named), read by kvp_te_env_read as each engine is created. */
#define TF(field) KVP_OPT_FIELD(kvp_te_env_t, field)
static const char *const te_shm_modes[] = {"cma", "cma-checked", "socket", NULL};
static const kvp_opt_t te_env_rows[] = {
    KVP_OPT_GROUP("Transfer engine", "mooncake.engine.TransferEngine / kvp_te_* (client/te/te.c), "
                                     "read as each engine is created, typed and range-checked: "
                                     "a bad value fails initialize, the variable named; "
                                     "KVPOOL_AUTH and KVPOOL_TLS_CA, _CERT, _KEY apply too"),
    {.name = "te-timeout-ms",
     .env = "KVPOOL_TE_TIMEOUT_MS",
     .type = KVP_OPT_UINT,
     .min = 1,
     .max = 3600000,
     .def = "10000",
     TF(timeout_ms),
     .arg = "MS",
     .def_doc = "10000",
     .help = "milliseconds (1 to 3600000): a transfer to a peer that makes no progress this "
             "long fails (KVP_ERR_TIMEOUT)"},
    {.name = "te-streams",
     .env = "KVPOOL_TE_STREAMS",
     .type = KVP_OPT_UINT,
     .min = 1,
     .max = 64,
     .def = "2",
     TF(streams),
     .arg = "N",
     .def_doc = "2",
     .help = "connections one transfer drives to one peer (tcp and shm; 1 to 64, as the "
             "store's client takes for the same transport)"},
    {.name = "te-chain",
     .env = "KVPOOL_TE_CHAIN",
     .type = KVP_OPT_SIZE,
     .min = 4096,
     .max = 64 << 20,
     TF(chain), /* unset: 0, the transport's */
     .need = "a size from 4KiB to 64MiB",
     .arg = "SIZE",
     .def_doc = "512KiB",
     .help = "on tcp, runs of up to 256 KiB go to a peer in requests of up to this many "
             "bytes (64 KiB at least), a longer run alone (4KiB to 64MiB; docs/benchmarks.md, "
             "\"te\")"},
    {.name = "te-stage-chunk",
     .env = "KVPOOL_TE_STAGE_CHUNK",
     .type = KVP_OPT_SIZE,
     .min = 4096,
     .max = 64 << 20,
     .def = "16MiB",
     TF(stage_chunk),
     .need = "a size from 4KiB to 64MiB",
     .arg = "SIZE",
     .def_doc = "16MiB",
     .help = "CUDA device memory a transfer moves is staged through pinned host buffers of this "
             "size, two a transfer in flight (4KiB to 64MiB; docs/python.md, the _on_cuda forms)"},
    {.name = "te-peers",
     .env = "KVPOOL_TE_PEERS",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     TF(peers),
     .arg = "CN,CN,...",
     .def_doc = "unset",
     .help = "with KVPOOL_TLS_CA, _CERT and _KEY (peers then prove a certificate of that CA, "
             "from any host): the principals (CNs) admitted; unset: any of the CA "
             "(docs/security.md, \"The transfer engine\")"},
    {.name = "tls-crl",
     .env = "KVPOOL_TLS_CRL",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     TF(tls_crl),
     .arg = "FILE",
     .def_doc = "unset: no revocation check",
     .help = "with KVPOOL_TLS_CA, _CERT and _KEY: the CA's CRL(s) (PEM); a transfer engine "
             "peer proving a revoked certificate is refused, as the master's --tls-crl refuses "
             "it; one that does not load fails initialize (docs/security.md, \"The transfer "
             "engine\")"},
    {.name = "te-acl",
     .env = "KVPOOL_TE_ACL",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     TF(acl),
     .arg = "FILE",
     .def_doc = "unset",
     .help = "with KVPOOL_TLS_CA, _CERT and _KEY: an ACL file in the master's --acl-file "
             "format saying what each proved peer may do (role read: read; write: write and "
             "notify; admin: both; others of the engine's own principal's tenant, without key "
             "patterns); unset: every admitted peer reads and writes; read again when the "
             "file changes (at most once a second; one that does not load keeps the one "
             "before) (docs/security.md, \"The transfer engine\")"},
    {.name = "te-shm",
     .env = "KVPOOL_TE_SHM",
     .type = KVP_OPT_ENUM,
     .flags = KVP_OPT_F_PTR,
     .choices = te_shm_modes,
     .def = "cma",
     TF(shm),
     .arg = "cma|cma-checked|socket",
     .def_doc = "cma",
     .help = "shm peers: cma, the initiator copies with process_vm_writev/readv (one kernel "
             "copy; the socket path when the kernel refuses), under the target's standing "
             "lease where the kernel already opens the target's memory to it (the same user, "
             "no Yama ptrace restriction, no other principal or KVPOOL_TE_ACL: no round trip "
             "a batch), else once the target checked the batch's ranges; cma-checked, the "
             "target checks every batch (a round trip more); socket, the frames over the Unix "
             "socket"},
    {.name = "te-copy-threads",
     .env = "KVPOOL_TE_COPY_THREADS",
     .type = KVP_OPT_UINT,
     .min = 1,
     .max = 8,
     .def = "2",
     TF(copy_threads),
     .arg = "N",
     .def_doc = "2",
     .help =
         "shm's cma route (1 to 8): threads that copy one batch of 2 MiB or more (the caller and "
         "N-1 helpers of the engine's, the batch split by bytes; parts of at least 1 MiB; "
         "the caller, its part done, waits for the helpers awake for up to 200 us once all "
         "are copying)"},
    {.name = "te-rdma-device",
     .env = "KVPOOL_RDMA_DEVICE",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     TF(rdma_device),
     .arg = "LIST",
     .def_doc = "any with an active port",
     .help = "protocol rdma (or auto on a host with a device): the RDMA devices to try, e.g. "
             "rxe0,mlx5_0 (as the store's client reads it)"},
    {.name = "te-rdma-host",
     .env = "KVPOOL_RDMA_HOST",
     .type = KVP_OPT_STRING,
     .flags = KVP_OPT_F_PTR,
     TF(rdma_host),
     .arg = "IPV4",
     .def_doc = "the device's own",
     .help = "the IPv4 address the engine serves rdma on (a bad address fails initialize)"},
};
#undef TF

kvp_opts_t kvp_te_env_table(kvp_te_env_t *env)
{
    return (kvp_opts_t){.rows = te_env_rows, .count = KVP_ARRAY_SIZE(te_env_rows), .base = env};
}

kvp_status_t kvp_te_env_read(kvp_te_env_t *env, char *err, size_t err_len)
{
    memset(env, 0, sizeof(*env));
    kvp_opts_t t = kvp_te_env_table(env);
    kvp_status_t st = kvp_opts_defaults(&t, err, err_len);
    if (st == KVP_OK)
        st = kvp_opts_env(&t, err, err_len);
    if (st == KVP_OK && env->rdma_device != NULL && env->rdma_device[0] == '\0')
        env->rdma_device = NULL;
    if (st == KVP_OK && env->rdma_host != NULL && env->rdma_host[0] == '\0')
        env->rdma_host = NULL;
    struct in_addr a;
    if (st == KVP_OK && env->rdma_host != NULL && inet_pton(AF_INET, env->rdma_host, &a) != 1) {
        snprintf(err, err_len, "$KVPOOL_RDMA_HOST: '%.64s' is not an IPv4 address", env->rdma_host);
        st = KVP_ERR_INVALID_ARG;
    }
    return st;
}

void kvp_client_env_read(kvp_client_env_t *env)
{
    memset(env, 0, sizeof(*env));
    kvp_opts_t t = kvp_client_env_table(env);
    char err[8];
    kvp_opts_env(&t, err, sizeof(err)); /* every row is lax: never fails */
}
