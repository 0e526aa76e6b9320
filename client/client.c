/*
 * client.c - a client's life: parameters, create (the transfer engine, the
 * client's own segment, the session with the master that mounts it, the
 * heartbeat and record threads, the SSD segment) and destroy (the same, in
 * reverse).
 *
 * The parts are objects of the folders below (client_priv.h): the object
 * flows (object.c) and the admin calls (admin.c) use them; no lower folder
 * sees the client.
 *
 * Threads: every API call may come from any thread. The master connection
 * is shared by all of them (control/mconn.c: requests in flight together,
 * no lock held while waiting); the peer table has its own rwlock, the
 * registry its lock (lookups take none). No lock is held across a data
 * transfer.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "client/api.h"
#include "client/client_priv.h"
#include "client/put_holds.h"
#include "client/xfer_sessions.h"
#include "client/control/key_scope.h"
#include "client/ssd/dfs.h"
#include "client/transport/transports.h"
#include "common/acl.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/parse.h"
#include "common/rand.h"
#include "common/rpc.h"
#include "common/sock.h"
#include "kvpool.pb-c.h"

void kvp_client_params_init(kvp_client_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->size = sizeof(*p);
    p->verify_crc = 1;
}

const char *kvp_client_segment_name(const kvp_client_t *client)
{
    return client->seg ? kvp_segment_name(client->seg) : NULL;
}

const char *kvp_client_ssd_segment_name(const kvp_client_t *client)
{
    return client->ssd ? kvp_ssd_owner_name(client->ssd) : NULL;
}

const char *kvp_client_dfs_segment_name(const kvp_client_t *client)
{
    return client->dfs ? kvp_ssd_owner_name(client->dfs) : NULL;
}

/* ---------------- parameters ---------------- */

/* The master address: HOST:PORT, or etcd://... (the leader found and followed through etcd,
 * leader_changed told of a new one). */
static kvp_status_t master_addr_parse(kvp_client_t *c, kvp_discovery_change_cb_t leader_changed)
{
    const char *master = c->params.master_addr ? c->params.master_addr : c->env.master;
    if (master == NULL || master[0] == '\0')
        master = "127.0.0.1:50051";
    if (kvp_discovery_is_etcd(master)) {
        uint32_t t = c->params.rpc_timeout_ms ? c->params.rpc_timeout_ms : 10000;
        char why[512] = "";
        const kvp_etcd_security_t *sec = &c->env.etcd;
        bool any = sec->ca || sec->cert || sec->key || sec->user || sec->password_file;
        kvp_status_t st = kvp_discovery_create(master, t, any ? sec : NULL, leader_changed, c,
                                               &c->disc, why, sizeof(why));
        if (st == KVP_OK)
            return KVP_OK;
        if (why[0] != '\0') { /* etcd's settings (KVPOOL_ETCD_*) */
            KVP_LOG_ERROR("%s", why);
            kvp_api_fail("create: %s", why);
            return st;
        }
        KVP_LOG_ERROR("master address must be etcd://HOST:PORT[,HOST:PORT...]/CLUSTER, got '%s'",
                      master);
    } else if (kvp_parse_hostport(master, c->master_host, sizeof(c->master_host),
                                  &c->master_port) == KVP_OK) {
        return KVP_OK;
    } else {
        KVP_LOG_ERROR("master address must be HOST:PORT, got '%s'", master);
    }
    kvp_api_fail("create: master address must be HOST:PORT or "
                 "etcd://HOST:PORT[,HOST:PORT...]/CLUSTER, got '%s'",
                 master);
    return KVP_ERR_INVALID_ARG;
}

/*
 * The host our data servers bind and advertise: params.data_host, or else the address this
 * host reaches the master (or, with etcd, its first member) from, so that peers on other
 * hosts can reach them by default; 127.0.0.1 when the master is on this host.
 */
static void data_host_param(kvp_client_t *c)
{
    if (c->params.data_host != NULL && c->params.data_host[0] != '\0') {
        snprintf(c->data_host, sizeof(c->data_host), "%s", c->params.data_host);
        return;
    }
    char host[256] = "";
    uint16_t port = 0;
    const char *master = c->params.master_addr ? c->params.master_addr : c->env.master;
    if (c->disc != NULL && master != NULL && strstr(master, "://") != NULL) {
        const char *a = strstr(master, "://") + 3;
        char first[300];
        size_t n = strcspn(a, ",/");
        snprintf(first, sizeof(first), "%.*s", (int)(n < 299 ? n : 299), a);
        if (kvp_parse_hostport(first, host, sizeof(host), &port) != KVP_OK)
            host[0] = '\0';
    } else {
        snprintf(host, sizeof(host), "%s", c->master_host);
        port = c->master_port;
    }
    snprintf(c->data_host, sizeof(c->data_host), "127.0.0.1");
    char self[64];
    if (host[0] != '\0' && !kvp_host_is_loopback(host) &&
        kvp_sock_route_addr(host, port, self, sizeof(self)) == KVP_OK &&
        !kvp_host_is_loopback(self))
        snprintf(c->data_host, sizeof(c->data_host), "%s", self);
}

/* The transport settings of the engine: forced transport, rdma devices and shape. */
static kvp_status_t transport_params(kvp_client_t *c)
{
    const char *tr = c->params.transport ? c->params.transport : c->env.transport;
    if (tr == NULL || tr[0] == '\0' || strcmp(tr, "auto") == 0) {
        c->xfer.forced = KVP_TRANSPORT_AUTO;
    } else if (strcmp(tr, "tcp") == 0) {
        c->xfer.forced = KVP_TRANSPORT_TCP;
    } else if (strcmp(tr, "shm") == 0) {
        c->xfer.forced = KVP_TRANSPORT_SHM;
    } else if (strcmp(tr, "rdma") == 0) {
        c->xfer.forced = KVP_TRANSPORT_RDMA;
    } else {
        KVP_LOG_ERROR("unknown transport '%s' (auto, tcp, shm, rdma)", tr);
        kvp_api_fail("create: unknown transport '%s' (auto, tcp, shm, rdma)", tr);
        return KVP_ERR_INVALID_ARG;
    }
    const char *rdev = c->params.rdma_devices ? c->params.rdma_devices : c->env.rdma_devices;
    const char *rhost = c->params.rdma_host ? c->params.rdma_host : c->env.rdma_host;
    if ((rdev && strlen(rdev) >= sizeof(c->xfer.rdma_devices)) ||
        (rhost && strlen(rhost) >= sizeof(c->xfer.rdma_host))) {
        KVP_LOG_ERROR("rdma device list or host too long");
        kvp_api_fail("create: rdma device list or host too long");
        return KVP_ERR_INVALID_ARG;
    }
    snprintf(c->xfer.rdma_devices, sizeof(c->xfer.rdma_devices), "%s", rdev ? rdev : "");
    snprintf(c->xfer.rdma_host, sizeof(c->xfer.rdma_host), "%s", rhost ? rhost : "");
    if (c->params.rdma_qps_per_peer > 16 ||
        (c->params.rdma_slice_bytes != 0 &&
         (c->params.rdma_slice_bytes < 4096 || c->params.rdma_slice_bytes > (1u << 30)))) {
        KVP_LOG_ERROR("rdma_qps_per_peer must be 0..16 and rdma_slice_bytes 4 KiB..1 GiB");
        kvp_api_fail("create: rdma_qps_per_peer must be 0..16 and rdma_slice_bytes 4 KiB..1 GiB "
                     "(got %u and %llu)",
                     c->params.rdma_qps_per_peer, (unsigned long long)c->params.rdma_slice_bytes);
        return KVP_ERR_INVALID_ARG;
    }
    c->xfer.rdma_qps = c->params.rdma_qps_per_peer;
    c->xfer.rdma_slice = c->params.rdma_slice_bytes;
    c->xfer.rdma_windows = c->env.rdma_windows;
    c->xfer.rdma_qp_cap = c->env.rdma_qp_cap;
    return KVP_OK;
}

/* Who may connect to our data servers: "protected" (this host only) or "none". */
static kvp_status_t auth_param(kvp_client_t *c)
{
    const char *auth = c->params.auth ? c->params.auth : c->env.auth;
    if (auth == NULL || auth[0] == '\0' || strcmp(auth, "protected") == 0) {
        c->protected_mode = true;
        return KVP_OK;
    }
    if (strcmp(auth, "none") == 0) {
        c->protected_mode = false;
        return KVP_OK;
    }
    KVP_LOG_ERROR("auth must be protected or none, got '%s'", auth);
    kvp_api_fail("create: auth (KVPOOL_AUTH) must be protected or none, got '%s'", auth);
    return KVP_ERR_INVALID_ARG;
}

/* A parameter, else its environment variable (client/env.c); an empty one is unset. */
static const char *param_env(const char *v, const char *env)
{
    if (v == NULL)
        v = env;
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* TLS to the master and the token (docs/security.md). */
static kvp_status_t tls_param(kvp_client_t *c)
{
    kvp_tls_params_t tp = {.cert = param_env(c->params.tls_cert, c->env.tls_cert),
                           .key = param_env(c->params.tls_key, c->env.tls_key),
                           .ca = param_env(c->params.tls_ca, c->env.tls_ca)};
    c->token = param_env(c->params.token, c->env.token);
    if (tp.cert == NULL && tp.key == NULL && tp.ca == NULL) {
        if (c->token == NULL)
            return KVP_OK;
        kvp_api_fail("create: a token (KVPOOL_TOKEN) is only ever sent over TLS: give the CA "
                     "of the master's certificate too (KVPOOL_TLS_CA)");
        return KVP_ERR_INVALID_ARG;
    }
    char err[512];
    kvp_status_t st = kvp_tls_create(&tp, false, &c->tls, err, sizeof(err));
    if (st != KVP_OK)
        kvp_api_fail("create: %s", err);
    return st;
}

/* The rest of the parameters: checked, defaults filled in, the engine's copies set. */
static kvp_status_t other_params(kvp_client_t *c)
{
    kvp_client_params_t *p = &c->params;
    if (p->ssd_path != NULL && (p->ssd_path[0] == '\0' || p->ssd_size < (1u << 20))) {
        KVP_LOG_ERROR("an SSD segment needs a path and a size of at least 1 MiB");
        kvp_api_fail("create: an SSD segment needs a path and a size of at least 1 MiB (got "
                     "'%s', %llu bytes)",
                     p->ssd_path, (unsigned long long)p->ssd_size);
        return KVP_ERR_INVALID_ARG;
    }
    /* the DFS directory: read and written in place (a transport before the others), and a
     * DFS segment there with a size */
    p->dfs_path = param_env(p->dfs_path, c->env.dfs_path);
    if (p->dfs_path != NULL && p->dfs_size == 0)
        p->dfs_size = c->env.dfs_size;
    if (p->dfs_path == NULL && p->dfs_size != 0) {
        kvp_api_fail("create: dfs_size needs a dfs_path (KVPOOL_DFS_PATH)");
        return KVP_ERR_INVALID_ARG;
    }
    if (p->dfs_path != NULL && (strlen(p->dfs_path) >= sizeof(c->xfer.dfs_dir) - 300 ||
                                (p->dfs_size != 0 && p->dfs_size < (1u << 20)))) {
        kvp_api_fail("create: a DFS directory needs a path under 700 bytes and a DFS segment a "
                     "size of at least 1 MiB (got '%s', %llu bytes)",
                     p->dfs_path, (unsigned long long)p->dfs_size);
        return KVP_ERR_INVALID_ARG;
    }
    if (p->dfs_path != NULL) {
        snprintf(c->xfer.dfs_dir, sizeof(c->xfer.dfs_dir), "%s", p->dfs_path);
        c->xfer.first = &kvp_transport_dfs_ops;
    }
    /* Mooncake's tenant_id ("default": none, as its default); its scope: key_scope_start */
    p->tenant_id = param_env(p->tenant_id, c->env.tenant_id);
    if (p->tenant_id != NULL && strcmp(p->tenant_id, "default") == 0)
        p->tenant_id = NULL;
    if (p->tenant_id != NULL && !kvp_tenant_name_valid(p->tenant_id, strlen(p->tenant_id))) {
        kvp_api_fail("create: tenant_id (KVPOOL_TENANT_ID) must be a tenant's name of 1..63 bytes "
                     "of A-Z a-z 0-9 . _ - (got %zu bytes that are not)",
                     strlen(p->tenant_id));
        return KVP_ERR_INVALID_ARG;
    }
    if (p->segment_tenant != NULL &&
        (p->segment_tenant[0] == '\0' || strlen(p->segment_tenant) > 63)) {
        kvp_api_fail("create: segment_tenant must be a tenant's name of 1..63 bytes");
        return KVP_ERR_INVALID_ARG;
    }
    if (p->rpc_timeout_ms == 0)
        p->rpc_timeout_ms = 10000;
    if (p->heartbeat_ms == 0)
        p->heartbeat_ms = 1000;
    if (p->drain_timeout_ms == 0)
        p->drain_timeout_ms = 30000;
    if (p->tcp_streams == 0)
        p->tcp_streams = 2;
    if (p->tcp_slice_bytes == 0)
        p->tcp_slice_bytes = 1 << 20;
    if (p->tcp_streams > 64 || p->tcp_slice_bytes < 4096) {
        KVP_LOG_ERROR("tcp_streams must be 1..64 and tcp_slice_bytes at least 4 KiB (got %u and "
                      "%llu)",
                      p->tcp_streams, (unsigned long long)p->tcp_slice_bytes);
        kvp_api_fail("create: tcp_streams must be 1..64 and tcp_slice_bytes at least 4 KiB (got "
                     "%u and %llu)",
                     p->tcp_streams, (unsigned long long)p->tcp_slice_bytes);
        return KVP_ERR_INVALID_ARG;
    }
    c->xfer.timeout_ms = p->rpc_timeout_ms;
    c->xfer.tcp_streams = p->tcp_streams;
    c->xfer.tcp_slice = p->tcp_slice_bytes;
    c->xfer.client_id = c->client_id;
    kvp_host_id(c->xfer.host_id, sizeof(c->xfer.host_id));
    return KVP_OK;
}

/* ---------------- create / destroy ---------------- */

/* A new leader (discovery.c's watch thread): drop a connection to another master now;
 * the next call (or the heartbeat) connects to the leader and remounts there. One that
 * already went to the new leader by itself is kept. */
static void leader_changed(void *arg, const char *leader)
{
    kvp_client_t *c = arg;
    KVP_LOG_INFO("the master's leader is now %s", leader);
    if (c->session != NULL)
        kvp_mconn_follow(kvp_session_mconn(c->session), leader);
    kvp_ssd_owner_follow(c->ssd, leader);
    kvp_ssd_owner_follow(c->dfs, leader);
}

/*
 * The namespace of this client's keys (client/control/key_scope.h), before any call names
 * one. A credential (a certificate or token, over TLS) that a master's ACL names binds the
 * principal's tenant: the master scopes the keys, and a tenant_id that is not that tenant
 * is refused (never ignored). Without one (no TLS, no credential, or a master with no ACL,
 * which answers Auth KVP_ERR_UNSUPPORTED) the tenant_id is the keys' namespace, as in
 * Mooncake, and a client of none has the default one.
 */
static kvp_status_t key_scope_start(kvp_client_t *c)
{
    const char *tid = c->params.tenant_id;
    kvp_key_scope_t scope = {.on = true};
    if (tid != NULL) {
        scope.ns_len = strlen(tid); /* (checked: 1..63 bytes) */
        memcpy(scope.ns, tid, scope.ns_len + 1);
    }
    bool credential = c->tls != NULL &&
                      (c->token != NULL || param_env(c->params.tls_cert, c->env.tls_cert) != NULL);
    if (credential && tid == NULL) {
        scope.on = false;    /* a credential needs an ACL (the master's TLS rule): it scopes */
    } else if (credential) { /* (asked only then: a master before this Auth form refuses it) */
        Kvpool__AuthRequest req = KVPOOL__AUTH_REQUEST__INIT; /* empty: who am I */
        kvp_status_t st;
        Kvpool__AuthResponse *who = kvp_session_call_unpack(
            c->session, KVP_RPC_AUTH, &req.base, &kvpool__auth_response__descriptor, &st);
        if (st == KVP_OK) {
            scope.on = false; /* the master scopes by the credential */
            bool mine = tid == NULL || strcmp(tid, who->tenant) == 0;
            if (!mine)
                kvp_api_fail("create: tenant_id %s is not this client's tenant: its credential "
                             "names principal %s of tenant %s, and the master keeps tenants "
                             "apart by the credential (give tenant_id %s, or none)",
                             tid, who->principal, who->tenant, who->tenant);
            kvpool__auth_response__free_unpacked(who, NULL);
            if (!mine)
                return KVP_ERR_DENIED;
        } else if (st != KVP_ERR_UNSUPPORTED) { /* (UNSUPPORTED: no ACL, no tenants) */
            kvp_api_fail("create: the master did not say which tenant this client's credential "
                         "binds (Auth): %s",
                         kvp_strerror(st));
            return st;
        }
    }
    kvp_session_set_key_scope(c->session, &scope);
    return KVP_OK;
}

/* The session with the master (mounting the segment), the heartbeat, the record thread;
 * the segment takes puts when this returns. */
static kvp_status_t control_start(kvp_client_t *c)
{
    kvp_session_params_t sp = {.master_host = c->master_host,
                               .master_port = c->master_port,
                               .disc = c->disc,
                               .timeout_ms = c->params.rpc_timeout_ms,
                               .client_id = c->client_id,
                               .seg = c->seg,
                               .peers = &c->peers,
                               .tls = c->tls,
                               .token = c->token,
                               .tenant = c->params.segment_tenant};
    char why[320] = "";
    sp.err = why;
    sp.err_len = sizeof(why);
    kvp_status_t st = kvp_session_open(&sp, &c->session);
    if (st != KVP_OK) {
        char etcd_why[512] = "";
        if (c->disc != NULL)
            kvp_discovery_last_error(c->disc, etcd_why, sizeof(etcd_why));
        if (etcd_why[0] != '\0') /* no leader found: etcd's reason says more */
            kvp_api_fail("create: cannot find the master's leader through etcd: %s", etcd_why);
        else if (why[0] != '\0')
            kvp_api_fail("create: %s", why);
        return st;
    }
    st = key_scope_start(c);
    if (st != KVP_OK)
        return st;
    kvp_heartbeat_params_t hp = {.drain = kvp_client_drain_params(c),
                                 .client_id = c->client_id,
                                 .interval_ms = c->params.heartbeat_ms,
                                 .drain_timeout_ms = c->params.drain_timeout_ms};
    st = kvp_heartbeat_start(&hp, &c->hb);
    if (st != KVP_OK && c->disc != NULL)
        kvp_api_fail("create: the leader found through etcd did not answer a heartbeat: %s",
                     kvp_strerror(st));
    else if (st != KVP_OK)
        kvp_api_fail("create: the master at %s:%u did not answer a heartbeat: %s", c->master_host,
                     (unsigned)c->master_port, kvp_strerror(st));
    if (st != KVP_OK || c->seg == NULL)
        return st;
    kvp_record_sync_params_t rp = {.seg = c->seg,
                                   .session = c->session,
                                   .client_id = c->client_id,
                                   .timeout_ms = c->params.rpc_timeout_ms};
    st = kvp_record_sync_start(&rp, &c->rec);
    if (st == KVP_OK)
        st = kvp_record_sync_wait_open(c->rec);
    return st;
}

/* Our SSD segment, with its own master connection. */
static kvp_status_t ssd_start(kvp_client_t *c, const char *host)
{
    kvp_ssd_owner_params_t p = {.path = c->params.ssd_path,
                                .size = c->params.ssd_size,
                                .buffered_io = c->params.ssd_buffered_io != 0,
                                .host = host,
                                .protected_mode = c->protected_mode,
                                .master_host = c->master_host,
                                .master_port = c->master_port,
                                .disc = c->disc,
                                .timeout_ms = c->params.rpc_timeout_ms,
                                .client_id = c->client_id,
                                .xfer = &c->xfer,
                                .peers = &c->peers,
                                .tls = c->tls,
                                .token = c->token,
                                .tenant = c->params.segment_tenant};
    char why[1024] = "";
    kvp_status_t st = kvp_ssd_owner_start(&p, &c->ssd, why, sizeof(why));
    if (st != KVP_OK && why[0] != '\0')
        kvp_api_fail("create: %s", why);
    return st;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Is a shard file free (no live process holds its flock)? A hint only: the owner's own
 * open takes the lock for good (KVP_ERR_IN_USE when another got there first). */
static bool shard_free(int dirfd, const char *name)
{
    int fd = openat(dirfd, name, O_RDWR | O_CLOEXEC); /* (NFS: an exclusive lock needs write) */
    if (fd < 0)
        return false;
    bool free_ = flock(fd, LOCK_EX | LOCK_NB) == 0;
    close(fd); /* (releases it) */
    return free_;
}

/* The free shard files already in the directory, sorted (names[], at most max; their
 * count). */
static size_t dfs_shards(const char *dir, char **names, size_t max)
{
    DIR *d = opendir(dir);
    size_t n = 0;
    if (d == NULL)
        return 0;
    for (struct dirent *e; n < max && (e = readdir(d)) != NULL;) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "shard-", 6) == 0 && len > 13 &&
            strcmp(e->d_name + len - 7, ".kvpdfs") == 0 && shard_free(dirfd(d), e->d_name) &&
            (names[n] = strdup(e->d_name)) != NULL)
            n++;
    }
    closedir(d);
    qsort(names, n, sizeof(names[0]), name_cmp);
    return n;
}

/* Our DFS segment: a shard file of the DFS directory, with its own master connection. First
 * a shard file already there that no live process holds (flock: an owner that died, on this
 * node or another; the master hands the new owner its objects), else shard-<host>-<k>.kvpdfs,
 * the first k no live process holds. */
static kvp_status_t dfs_start(kvp_client_t *c, const char *host)
{
    char id[KVP_DFS_ID_LEN + 1], why[1024] = "", hn[64] = "host", path[1100];
    kvp_status_t st = kvp_dfs_dir_id(c->params.dfs_path, id, why, sizeof(why));
    if (st != KVP_OK) {
        kvp_api_fail("create: %s", why);
        return st;
    }
    gethostname(hn, sizeof(hn) - 1);
    for (char *q = hn; *q; q++)
        if (*q == '/' || *q == '.')
            *q = '-';
    char *have[256];
    size_t n_have = dfs_shards(c->params.dfs_path, have, KVP_ARRAY_SIZE(have));
    for (unsigned k = 0; k < n_have + 64; k++) {
        if (k < n_have)
            snprintf(path, sizeof(path), "%s/%s", c->params.dfs_path, have[k]);
        else
            snprintf(path, sizeof(path), "%s/shard-%s-%u.kvpdfs", c->params.dfs_path, hn,
                     (unsigned)(k - n_have));
        kvp_ssd_owner_params_t p = {.path = path,
                                    .size = c->params.dfs_size,
                                    .buffered_io = true, /* NFS, FUSE: O_DIRECT where it works */
                                    .host = host,
                                    .protected_mode = c->protected_mode,
                                    .master_host = c->master_host,
                                    .master_port = c->master_port,
                                    .disc = c->disc,
                                    .timeout_ms = c->params.rpc_timeout_ms,
                                    .client_id = c->client_id,
                                    .xfer = &c->xfer,
                                    .peers = &c->peers,
                                    .tls = c->tls,
                                    .token = c->token,
                                    .tenant = c->params.segment_tenant,
                                    .dfs_id = id};
        why[0] = '\0';
        st = kvp_ssd_owner_start(&p, &c->dfs, why, sizeof(why));
        if (st == KVP_OK || (st != KVP_ERR_IN_USE && k >= n_have))
            break; /* (one there already that does not open here, another size: the next) */
    }
    for (size_t i = 0; i < n_have; i++)
        free(have[i]);
    if (st != KVP_OK && why[0] != '\0')
        kvp_api_fail("create: DFS %s", why);
    return st;
}

/* Stop and free every part (each NULL or stopped is skipped), in reverse order of creation.
 * unmount: tell the master the segment is gone (destroy; a failed create does not). */
static void client_free(kvp_client_t *c, bool unmount)
{
    kvp_discovery_stop(c->disc); /* no leader-change callback from now on */
    kvp_heartbeat_stop(c->hb);   /* also waits for a drain in progress */
    kvp_ssd_owner_stop(c->ssd);  /* unmounts it: its file keeps the objects */
    c->ssd = NULL;
    kvp_ssd_owner_stop(c->dfs); /* the same for the DFS shard */
    c->dfs = NULL;
    int seg_state = c->seg != NULL ? kvp_segment_set_drained(c->seg) : KVP_SEG_NONE;
    if (unmount && (seg_state == KVP_SEG_MOUNTED || seg_state == KVP_SEG_DRAINING) &&
        c->session != NULL && kvp_mconn_connected(kvp_session_mconn(c->session))) {
        /* no remount races this: the heartbeat has stopped and no call is in progress */
        Kvpool__UnmountRequest req = KVPOOL__UNMOUNT_REQUEST__INIT;
        req.segment_id = kvp_segment_id(c->seg);
        uint8_t *resp = NULL;
        size_t rlen;
        kvp_session_call(c->session, KVP_RPC_UNMOUNT, &req.base, &resp, &rlen); /* best effort */
    }
    /* its stream closes only now, after the Unmount: the master would take a stream closed
     * with changes still queued on a mounted segment for one lost (server.c) */
    kvp_record_sync_stop(c->rec);
    kvp_session_close(c->session);
    kvp_discovery_destroy(c->disc);
    kvp_segment_stop(c->seg);
    kvp_peers_cleanup(&c->peers);   /* detaches them from the transports */
    kvp_transfer_cleanup(&c->xfer); /* deregisters the buffers (and the segment) still registered */
    kvp_segment_destroy(c->seg);    /* unmapped only now */
    kvp_tls_destroy(c->tls);        /* every connection that used it is closed */
    kvp_xsessions_destroy(c->xs);
    kvp_holds_destroy(c->holds);
    free(c);
}

static kvp_status_t client_create_impl(const kvp_client_params_t *params, kvp_client_t **client_p)
{
    kvp_log_init_from_env();
    if (params == NULL || client_p == NULL || params->size < sizeof(size_t))
        return KVP_ERR_INVALID_ARG;
    kvp_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVP_ERR_NOMEM;
    kvp_client_params_init(&c->params);
    memcpy(&c->params, params, KVP_MIN(params->size, sizeof(c->params)));
    c->params.size = sizeof(c->params);
    kvp_client_env_read(&c->env); /* the one read of the library's environment (env.h) */
    kvp_conn_limits_fill(&c->env.data_limits); /* under kvpool serve's flags, before mounts */
    c->client_id = kvp_random_u64();
    kvp_peers_init(&c->peers, &c->xfer, c->client_id);

    kvp_status_t st = master_addr_parse(c, leader_changed);
    if (st == KVP_OK)
        st = transport_params(c);
    if (st == KVP_OK)
        st = auth_param(c);
    if (st == KVP_OK)
        st = tls_param(c);
    if (st == KVP_OK)
        st = other_params(c);
    if (st != KVP_OK)
        goto err_free;
    data_host_param(c);
    c->xfer.list = kvp_transports;
    st = kvp_transfer_init(&c->xfer);
    if (st != KVP_OK) {
        if (c->xfer.why[0] != '\0') /* e.g. a DFS path that is no directory */
            kvp_api_fail("create: %s", c->xfer.why);
        goto err_free;
    }
    c->xs = kvp_xsessions_create();
    c->holds = kvp_holds_create(c->env.put_ahead == KVP_PUT_AHEAD_OFF ? 0
                                : c->env.put_ahead                    ? c->env.put_ahead
                                                                      : KVP_PUT_AHEAD_DEFAULT,
                                c->env.put_ahead_bytes ? c->env.put_ahead_bytes
                                                       : KVP_PUT_AHEAD_BYTES_DEFAULT);
    if (c->xs == NULL || c->holds == NULL) {
        st = KVP_ERR_NOMEM;
        goto err_free;
    }
    if (c->params.segment_size > 0) {
        char why[600] = "";
        kvp_segment_params_t sp = {.size = c->params.segment_size,
                                   .name = c->params.segment_name,
                                   .data_host = c->data_host,
                                   .data_port = c->params.data_port,
                                   .protected_mode = c->protected_mode,
                                   .client_id = c->client_id,
                                   .xfer = &c->xfer,
                                   .file = c->params.segment_file,
                                   .file_offset = c->params.segment_file_offset,
                                   .keep_dumpable = c->env.keep_dumpable,
                                   .err = why,
                                   .err_len = sizeof(why)};
        st = kvp_segment_create(&sp, &c->seg);
        if (st != KVP_OK) {
            if (why[0] != '\0')
                kvp_api_fail("create: %s", why);
            goto err_free;
        }
    } else if (c->params.segment_file != NULL) {
        kvp_api_fail("create: segment_file needs a segment_size");
        st = KVP_ERR_INVALID_ARG;
        goto err_free;
    }
    char ssd_host[256];
    snprintf(ssd_host, sizeof(ssd_host), "%s", c->data_host);
    st = control_start(c);
    if (st == KVP_OK && c->params.ssd_path != NULL)
        st = ssd_start(c, ssd_host);
    if (st == KVP_OK && c->params.dfs_path != NULL && c->params.dfs_size != 0)
        st = dfs_start(c, ssd_host);
    if (st != KVP_OK)
        goto err_free;
    /* keep only what outlives the call: the strings are borrowed */
    c->params.master_addr = NULL;
    c->params.transport = NULL;
    c->params.rdma_devices = NULL;
    c->params.rdma_host = NULL;
    c->params.data_host = NULL;
    c->params.segment_name = NULL;
    c->params.ssd_path = NULL;
    c->params.dfs_path = NULL;
    c->params.auth = NULL;
    c->params.segment_tenant = NULL;
    c->params.segment_file = NULL;
    c->params.tenant_id = NULL;
    *client_p = c;
    return KVP_OK;

err_free:
    client_free(c, false);
    return st;
}

kvp_status_t kvp_client_create(const kvp_client_params_t *params, kvp_client_t **client_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(client_create_impl(params, client_p), "create");
}

void kvp_client_destroy(kvp_client_t *c)
{
    if (c != NULL)
        client_free(c, true);
}
