/*
 * te.c - the transfer engine (kvpool_te.h): Mooncake's point-to-point
 * TransferEngine on kvpool's data plane (docs/architecture.md, "Transfer
 * engine").
 *
 * Design: the engine is a segment's data server (segment/data_server.c) whose
 * "segment" is this process's whole address space, id KVP_TE_SEGMENT_ID, and
 * whose backend (below) lets a peer at none of it but the ranges the process
 * registered: an extent's offset is a virtual address. The data server reads
 * and checks each request (every extent through the backend's check before any
 * byte moves) and the backend moves the payload in place, a WRITE received
 * straight into the registered memory (one recvmsg over an iovec), a READ sent
 * straight out of it: no copy in user space, nothing allocated per transfer.
 * It listens on the rpc port (tcp, protected mode as KVPOOL_AUTH says) and on
 * the abstract Unix socket "kvpool-te-<port>" (the shm protocol: the same
 * frames between processes of one host; a peer of another uid is refused).
 *
 * The initiator side is a transfer engine (transfer/engine.c) holding the
 * engine's own transports: rdma (te_rdma.h, where this host has a device), the
 * one-copy shm path (te_shm.h) and tcp. A target "host:port" is a peer whose
 * endpoint is that address (rdma, tcp) or "@kvpool-te-<port>" (shm); its
 * transport is chosen once, as a store's peers' are, and a batch runs on it (on
 * tcp: its streams, slices, vectored chains and timeouts as a store's transfer
 * does). No route is chosen here.
 *
 * No lock is held while bytes cross a socket or a peer copies: a request's
 * extents are rechecked under the regions' read lock just before its bytes
 * move and their regions pinned (a count each, te_pin_t), then the lock is
 * left. Unregistering a range takes it out under the write lock (from then on
 * every request naming it is refused) and then waits, holding nothing, for the
 * transfers pinning that region alone: one stalled peer delays the unregister
 * of the range it is stalled on, and nothing else. Registering pins a range's
 * pages for rdma before the write lock; registrations and unregistrations run
 * one at a time (reg_lock), transfers never take that lock.
 *
 * Thread: any; the regions under a writer-preferring rwlock held only to look
 * them up or change them, the peers under a mutex, the async batches on one
 * worker thread of the engine's.
 */
#include "client/include/kvpool_te.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>
#include <netinet/in.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include "client/segment/data_backend.h"
#include "client/te/te_rdma.h"
#include "client/transport/rdma_regions.h"
#include "client/transport/transports.h"
#include "client/segment/conn_server.h"
#include "client/segment/data_server.h"
#include "client/te/te_copy.h"
#include "client/transfer/engine.h"
#include "client/transfer/peer.h"
#include "client/te/te_cuda.h"
#include "client/te/te_lease.h"
#include "client/te/te_shm.h"
#include "client/te_registry.h"
#include "client/api.h"
#include "client/env.h"
#include "client/mem/gpu.h"
#include "client/transport/hello.h"
#include "client/transport/transports.h"
#include "client/transport/wire.h"
#include "common/acl.h"
#include "common/log.h"
#include "common/tls.h"
#include "common/sock.h"
#include "common/clock.h"
#include "common/parse.h"

/* The id every request to an engine carries (a data server serves one segment). */
/* Ranges per kvp_transfer_run (the ops live on the stack). */
#define TE_CHUNK 256
/* Ranges per TE_CMA request: IOV_MAX, one round trip for a batch of up to 1024 runs. */
#define TE_PEERS_MAX 1024
/* Bytes of small runs chained into one request on a tcp stream (KVPOOL_TE_CHAIN): 0, the
 * transport's default. */
#define TE_CHAIN_DEF 0
/* Bytes of one of the initiator's pinned staging buffers for device memory
 * (KVPOOL_TE_STAGE_CHUNK), two a stager (transfer/engine.c): each is one batch on the
 * streams, the next copied while it moves. Measured on an H200 over loopback (two engines
 * in one process, 512 runs of 64 KiB and 128 runs of 1 MiB, device or host memory at each
 * end): buffers of 1 MiB and 4 MiB ran device memory at about half the rate of host memory,
 * 16 MiB near it; four buffers a stager did no better than two, and 32 or 64 MiB gained
 * no more than the run-to-run spread. */
#define TE_STAGE_CHUNK_DEF ((uint64_t)16 << 20)
#define TE_ALLOWED_MAX 64

/* Credentials (KVPOOL_TLS_CA, _CERT, _KEY): what an engine proves to its targets, and the
 * CA its own peers' certificates must come from, checked by the common TLS code against the
 * CRL too (KVPOOL_TLS_CRL) (TE_AUTH, wire.h). */
typedef struct te_auth {
    kvp_tls_t *tls; /* the CA (and CRL) a peer's certificate is verified against */
    EVP_PKEY *key;
    uint8_t *cert_der;
    int cert_len;
    char cn[128];
    char allowed[TE_ALLOWED_MAX][128]; /* KVPOOL_TE_PEERS; n_allowed 0: any of the CA */
    size_t n_allowed;
    /* KVPOOL_TE_ACL: a peer's roles and tenant (NULL: every admitted peer rw); taken again
     * when the file changes (acl_refresh), under acl_lock */
    pthread_mutex_t acl_lock;
    kvp_acl_t *acl;
    char tenant[KVP_TENANT_NAME_MAX]; /* with acl: our own principal's */
    char acl_path[4096];              /* "": none */
    struct stat acl_st;               /* the file as last read (its inode, size, mtime) */
    _Atomic uint64_t acl_gen;         /* bumped at each reload */
    _Atomic uint64_t acl_checked_ms;  /* when the file was last looked at */
    pthread_mutex_t refresh_lock;     /* one acl_refresh at a time (acl_st is its); before
                                       * acl_lock */
} te_auth_t;

/* How often a changed KVPOOL_TE_ACL is looked for (at a request, at most this often). */
#define TE_ACL_CHECK_MS 1000

/* What a connection's proved principal may do here (te_conn_t.rights). */
#define TE_MAY_READ 1u
#define TE_MAY_WRITE 2u

typedef struct te_region {
    uintptr_t addr;
    uint64_t len;
} te_region_t;

/* A registered region's transfers in flight: taken under the regions' read lock (the
 * region found), given back with no lock once the bytes moved; the region's unregister
 * waits for it to fall to 0. Made by the registration, freed by the unregister. */
typedef struct te_pin {
    _Atomic uint32_t n;
} te_pin_t;

typedef struct te_peer {
    char target[256];
    bool shm;
    kvp_peer_t *peer;
    _Atomic uint64_t transfers, bytes, failures; /* as initiator, relaxed */
    uint64_t gen; /* credentials and KVPOOL_TE_ACL on: the ACL's generation peer's connections
                   * proved their target under (peers_lock) */
} te_peer_t;

#define TE_NOTIFIES_MAX 4096 /* pending notifies a target keeps */

typedef struct te_notify {
    struct te_notify *next;
    size_t name_len, msg_len;
    char data[]; /* name, then msg */
} te_notify_t;

typedef struct te_batch {
    struct te_batch *next;
    uint64_t id;
    char target[256];
    int opcode;
    size_t n;
    void **locals;
    uint64_t *remotes, *lens;
    int status; /* 0 running, 1 done, < 0 failed */
} te_batch_t;

struct kvp_te {
    kvp_transfer_t xfer;
    kvp_data_server_t *srv;
    uint16_t port;
    int protocol; /* KVP_TRANSPORT_AUTO, _TCP, _SHM, _RDMA */
    /* our registered ranges served on the rdma transport of xfer (transport/rdma_regions.h);
     * NULL: none (no device, or not asked for) */
    kvp_rdma_regions_t *rdma;
    bool protected_mode; /* KVPOOL_AUTH: peers of this host, of our user or root, only */
    bool shm_served;
    te_auth_t *auth;        /* credentials configured: every peer proves a principal */
    bool cma;               /* KVPOOL_TE_SHM=cma (default): shm peers copy with process_vm_* */
    bool cma_lease;         /* ... under a standing lease where allowed (not cma-checked) */
    kvp_te_tp_cfg_t tp_cfg; /* its own transports' (te_tp.h: shm): xfer.own_cfg */
    const kvp_transport_ops_t *tp_list[4]; /* xfer.list: te_transports() */
    /* as target: the leases' memfds (te_lease.h), made at the first grant under the regions'
     * write lock, freed at destroy; closing (under it too): no more grants */
    kvp_te_lease_host_t *_Atomic lease;
    bool closing;
    pthread_mutex_t notify_lock; /* the notifies peers sent, oldest first */
    te_notify_t *notify_head, **notify_tail;
    size_t n_notifies;
    pthread_rwlock_t lock; /* the regions */
    te_cuda_t *cuda;       /* device memory among them (te_cuda.c); NULL: none yet (lock) */
    te_region_t *regions;  /* sorted by addr, disjoint */
    bool *region_dev;      /* [i]: regions[i] is device memory (the leases leave it out) */
    te_pin_t **region_pin; /* [i]: regions[i]'s transfers in flight */
    size_t n_regions, cap_regions;
    pthread_mutex_t reg_lock; /* one registration or unregistration at a time; before lock */
    /* an unregister waiting for its region's pins: the last pin given back wakes it */
    pthread_mutex_t pin_lock;
    pthread_cond_t pin_cond;
    _Atomic uint32_t pin_waiters;
    bool ptracer_window; /* Yama's ptrace_scope 1: a shm peer's copy needs PR_SET_PTRACER */
    pthread_mutex_t peers_lock;
    te_peer_t peers[TE_PEERS_MAX];
    size_t n_peers;
    /* async batches */
    pthread_mutex_t q_lock;
    pthread_cond_t q_cond;
    te_batch_t *queue, *done;
    uint64_t next_id;
    bool worker_on, stop;
    pthread_t worker;
    /* counters (relaxed) */
    _Atomic uint64_t transfers[2], bytes[2], failures, refused_range, refused_user, refused_auth,
        refused_role, refused_tenant, cma_served[2], cma_bytes[2], notifies, notifies_dropped;
};

/* ---- the backend: registered memory by virtual address ---- */

/* The registered region holding [off, off + len) whole, or -1 (lock held). */
static ptrdiff_t region_at_locked(const kvp_te_t *te, uint64_t off, uint64_t len)
{
    size_t lo = 0, hi = te->n_regions;
    while (lo < hi) { /* the last region starting at or below off */
        size_t mid = lo + (hi - lo) / 2;
        if (te->regions[mid].addr <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    const te_region_t *r = &te->regions[lo - 1];
    return off - r->addr <= r->len && len <= r->len - (off - r->addr) ? (ptrdiff_t)lo - 1 : -1;
}

static kvp_status_t te_check(void *backend, uint64_t off, uint64_t len, bool write)
{
    (void)write;
    kvp_te_t *te = backend;
    pthread_rwlock_rdlock(&te->lock);
    bool ok = region_at_locked(te, off, len) >= 0;
    pthread_rwlock_unlock(&te->lock);
    if (!ok) {
        atomic_fetch_add_explicit(&te->refused_range, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("transfer engine: a peer named [0x%llx, +%llu), not registered here; "
                             "refused",
                             (unsigned long long)off, (unsigned long long)len);
        return KVP_ERR_OUT_OF_RANGE;
    }
    return KVP_OK;
}

/* A connection's state (data_backend.h conn_open): whether its peer was admitted. */
typedef struct te_conn {
    int admitted;   /* 0: not asked yet, 1: yes, -1: no */
    bool authed;    /* credentials on: a TE_AUTH proved an allowed principal */
    uint8_t rights; /* credentials on: TE_MAY_* of that principal */
    bool own;       /* credentials on: that principal is ours (the one-copy shm path) */
    char cn[128];   /* credentials on: the proved certificate's CN */
    uint64_t gen;   /* the ACL generation rights was taken from */
    int slot;       /* its lease's slot (te_lease.h), -1: none */
} te_conn_t;

static kvp_status_t te_conn_open(void *backend, void **conn_p)
{
    (void)backend;
    te_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVP_ERR_NOMEM;
    c->slot = -1;
    *conn_p = c;
    return KVP_OK;
}

static void te_conn_close(void *backend, void *conn)
{
    kvp_te_t *te = backend;
    te_conn_t *c = conn;
    if (c->slot >= 0)
        kvp_te_lease_host_give(atomic_load(&te->lease), c->slot);
    free(conn);
}

/* The leased peers' copy of our host regions (device memory the kernel cannot reach is
 * left out: such ranges ask per batch, and are refused there; none once the engine is
 * closing), rewritten: its generation, 0 when nothing is leased. The regions' write lock
 * held. */
static uint64_t lease_publish_locked(kvp_te_t *te)
{
    kvp_te_lease_host_t *h = atomic_load(&te->lease);
    if (h == NULL)
        return 0;
    size_t cap, n = 0;
    uint64_t *out = kvp_te_lease_host_begin(h, &cap);
    for (size_t i = 0; i < te->n_regions && n < cap && !te->closing; i++) {
        if (te->region_dev[i])
            continue;
        out[2 * n] = te->regions[i].addr;
        out[2 * n + 1] = te->regions[i].len;
        n++;
    }
    return kvp_te_lease_host_end(h, n);
}

/* An address as /proc/net/tcp{,6} prints it: "0100007F:1F90" (the 32-bit words of the
 * address as the kernel holds them, in hex, then the port). A v4-mapped v6 address is
 * printed as v4 (a v4 socket's row). false: another family. */
static bool proc_net_addr(const struct sockaddr_storage *ss, char *buf, size_t len, bool *v6_p)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        snprintf(buf, len, "%08X:%04X", (unsigned)a->sin_addr.s_addr, ntohs(a->sin_port));
        *v6_p = false;
        return true;
    }
    if (ss->ss_family != AF_INET6)
        return false;
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    uint32_t w[4];
    memcpy(w, &a->sin6_addr, sizeof(w));
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
        snprintf(buf, len, "%08X:%04X", (unsigned)w[3], ntohs(a->sin6_port));
        *v6_p = false;
    } else {
        snprintf(buf, len, "%08X%08X%08X%08X:%04X", (unsigned)w[0], (unsigned)w[1], (unsigned)w[2],
                 (unsigned)w[3], ntohs(a->sin6_port));
        *v6_p = true;
    }
    return true;
}

/* The uid of the process of this host at the other end of tcp connection fd: the row of
 * its socket in /proc/net/tcp (or tcp6), whose local address is our peer's and remote
 * address ours. false: not found (another host or network namespace, or already gone). */
static bool tcp_peer_uid(int fd, uint32_t *uid_p)
{
    struct sockaddr_storage me, peer;
    socklen_t ml = sizeof(me), pl = sizeof(peer);
    char want_local[64], want_rem[64];
    bool v6, v6b;
    if (getsockname(fd, (struct sockaddr *)&me, &ml) != 0 ||
        getpeername(fd, (struct sockaddr *)&peer, &pl) != 0 ||
        !proc_net_addr(&peer, want_local, sizeof(want_local), &v6) ||
        !proc_net_addr(&me, want_rem, sizeof(want_rem), &v6b) || v6 != v6b)
        return false;
    FILE *f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "re");
    if (f == NULL)
        return false;
    char line[512], local[64], rem[64];
    unsigned uid;
    bool found = false;
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = sscanf(line, " %*[^:]: %63s %63s %*s %*s %*s %*s %u", local, rem, &uid) == 3 &&
                strcmp(local, want_local) == 0 && strcmp(rem, want_rem) == 0;
    fclose(f);
    if (found)
        *uid_p = uid;
    return found;
}

/* May this connection's peer touch our memory? A Unix socket's: our uid or root
 * (SO_PEERCRED). A tcp peer's, in protected mode (peers of this host only): the same, by
 * its socket's owner (tcp_peer_uid); with KVPOOL_AUTH=none: anyone. Refusals counted. */
static bool peer_allowed(kvp_te_t *te, te_conn_t *c, int fd)
{
    int pid = 0;
    uint32_t uid = 0;
    bool unix_sock = kvp_unix_peer(fd, &pid, &uid);
    if (te->auth != NULL && !c->authed) {
        /* credentials on: a principal, proved (TE_AUTH), before anything; counted once per
         * connection at its first refused request (te_auth counts a failed proof) */
        if (c->admitted == 0)
            atomic_fetch_add_explicit(&te->refused_auth, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("transfer engine: a peer that proved no principal; refused");
        return false;
    }
    if (te->auth != NULL && !unix_sock)
        return true; /* a proved principal: protected mode lifted (any host) */
    if (!unix_sock && !te->protected_mode)
        return true;
    bool known = unix_sock || tcp_peer_uid(fd, &uid);
    if (known && (uid == 0 || uid == (uint32_t)getuid()))
        return true;
    atomic_fetch_add_explicit(&te->refused_user, 1, memory_order_relaxed);
    if (known)
        KVP_LOG_WARN_LIMITED("transfer engine: a peer of uid %u (%s); refused: protected mode "
                             "takes this user's processes (and root's) only",
                             uid, unix_sock ? "shm socket" : "tcp");
    else
        KVP_LOG_WARN_LIMITED("transfer engine: a tcp peer whose user cannot be found; refused");
    return false;
}

static bool conn_admitted(kvp_te_t *te, te_conn_t *c, int fd)
{
    if (c->admitted == 0)
        c->admitted = peer_allowed(te, c, fd) ? 1 : -1;
    return c->admitted > 0;
}

static uint8_t auth_rights(kvp_te_t *te, const char *cn, const char **why_p,
                           _Atomic uint64_t **count_p);
static void acl_check(kvp_te_t *te);

/* Credentials on: c's rights (TE_MAY_*), as the ACL now says: a KVPOOL_TE_ACL changed since
 * they were taken is read again (at most every TE_ACL_CHECK_MS), and a connection's rights
 * follow it at its next request (a principal removed or narrowed there loses what it lost
 * on the connections it has, not only on new ones). */
static uint8_t conn_rights(kvp_te_t *te, te_conn_t *c)
{
    te_auth_t *a = te->auth;
    if (a->acl_path[0] == '\0' || !c->authed)
        return c->rights;
    acl_check(te);
    uint64_t gen = atomic_load(&a->acl_gen);
    if (c->gen != gen) {
        const char *why = NULL;
        _Atomic uint64_t *count = NULL;
        c->rights = auth_rights(te, c->cn, &why, &count);
        c->gen = gen;
    }
    return c->rights;
}

/* Admitted, and (credentials on) its principal's rights hold need (TE_MAY_*)? A principal
 * refused for its rights is counted (refused_role) once per request. */
static bool conn_may(kvp_te_t *te, te_conn_t *c, int fd, uint8_t need)
{
    if (!conn_admitted(te, c, fd))
        return false;
    if (te->auth == NULL || (conn_rights(te, c) & need) == need)
        return true;
    atomic_fetch_add_explicit(&te->refused_role, 1, memory_order_relaxed);
    KVP_LOG_WARN_LIMITED("transfer engine: a peer whose principal may not %s here (its roles in "
                         "KVPOOL_TE_ACL); refused",
                         need & TE_MAY_WRITE ? "write" : "read");
    return false;
}

/* Under the read lock: is every extent of v[0..n) still registered (not unregistered since
 * its check)? Then each extent's region is pinned (pins[0..*k_p), a region once per run of
 * extents in it) until pins_give; false: one is not, nothing pinned. */
static bool pins_take_locked(kvp_te_t *te, const kvp_data_vec_t *v, size_t n, te_pin_t **pins,
                             size_t *k_p)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        ptrdiff_t r = region_at_locked(te, v[i].offset, v[i].length);
        if (r < 0)
            return false;
        if (k == 0 || pins[k - 1] != te->region_pin[r])
            pins[k++] = te->region_pin[r];
    }
    for (size_t j = 0; j < k; j++)
        atomic_fetch_add(&pins[j]->n, 1);
    *k_p = k;
    return true;
}

/* pins_take_locked under the read lock; *cuda_p: the staging of the device memory among the
 * extents, NULL: none. */
static bool pins_take(kvp_te_t *te, const kvp_data_vec_t *v, size_t n, te_pin_t **pins, size_t *k_p,
                      te_cuda_t **cuda_p)
{
    pthread_rwlock_rdlock(&te->lock);
    bool ok = pins_take_locked(te, v, n, pins, k_p);
    *cuda_p = ok && kvp_te_cuda_vecs(te->cuda, &te->xfer, v, n) ? te->cuda : NULL;
    pthread_rwlock_unlock(&te->lock);
    return ok;
}

/* The pins of pins_take(_locked) given back (no lock held). A pin is not touched after its
 * count falls: its unregister may free it at once; a waiting unregister is woken through
 * the engine's pin_lock. */
static void pins_give(kvp_te_t *te, te_pin_t *const *pins, size_t k)
{
    bool last = false;
    for (size_t j = 0; j < k; j++)
        last |= atomic_fetch_sub(&pins[j]->n, 1) == 1;
    if (last && atomic_load(&te->pin_waiters) > 0) {
        pthread_mutex_lock(&te->pin_lock);
        pthread_cond_broadcast(&te->pin_cond);
        pthread_mutex_unlock(&te->pin_lock);
    }
}

static void te_iov(const kvp_data_vec_t *v, size_t n, struct iovec *iov)
{
    for (size_t i = 0; i < n; i++)
        iov[i] = (struct iovec){.iov_base = (void *)(uintptr_t)v[i].offset, .iov_len = v[i].length};
}

/* A request refused (conn_may): answered KVP_ERR_DENIED, by the server through *reply_p
 * (true: the connection goes on: a proved principal refused for its roles, which the ACL
 * may give back), or here (reply_p NULL, or false: it closes: a peer that proved nothing
 * holds no slot of ours). */
static bool te_refuse(const te_conn_t *c, int fd, kvp_status_t *reply_p)
{
    if (c->authed && reply_p != NULL) {
        *reply_p = KVP_ERR_DENIED;
        return true;
    }
    if (kvp_data_reply(fd, KVP_ERR_DENIED, 0) != KVP_OK)
        return false;
    if (c->authed)
        return true;
    /* what it pipelined behind the request dropped, so that it reads the refusal (not a
     * reset) and closes: a second at most, as the protected-mode refusal (conn_server.c) */
    kvp_sock_drain_close(fd, 1000, (size_t)64 << 20);
    return false;
}

static bool te_read(void *backend, void *conn, int fd, const kvp_data_vec_t *v, size_t n,
                    uint64_t total, kvp_status_t *reply_p)
{
    kvp_te_t *te = backend;
    if (!conn_may(te, conn, fd, TE_MAY_READ))
        return te_refuse(conn, fd, reply_p);
    struct iovec iov[KVP_DATA_VEC_MAX + 1];
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = total};
    iov[0] = (struct iovec){.iov_base = &r, .iov_len = sizeof(r)};
    te_iov(v, n, iov + 1);
    te_pin_t *pins[KVP_DATA_VEC_MAX];
    size_t k;
    te_cuda_t *cuda;
    if (!pins_take(te, v, n, pins, &k, &cuda))
        return false; /* unregistered since its check: closed, as a peer may not rely on it */
    bool ok = cuda != NULL ? kvp_te_cuda_send(cuda, &te->xfer, fd, v, n, total)
                           : kvp_sendv_all(fd, iov, (int)n + 1) == KVP_OK;
    pins_give(te, pins, k);
    return ok;
}

static bool te_write(void *backend, void *conn, int fd, const kvp_data_vec_t *v, size_t n,
                     kvp_status_t *reply_p)
{
    kvp_te_t *te = backend;
    if (!conn_may(te, conn, fd, TE_MAY_WRITE)) {
        /* its payload read and dropped (within the frame's deadline), then KVP_ERR_DENIED:
         * the peer reads the refusal */
        for (size_t i = 0; i < n; i++)
            if (kvp_recv_discard(fd, v[i].length) != KVP_OK)
                return false;
        return te_refuse(conn, fd, reply_p);
    }
    struct iovec iov[KVP_DATA_VEC_MAX];
    te_iov(v, n, iov);
    te_pin_t *pins[KVP_DATA_VEC_MAX];
    size_t k;
    te_cuda_t *cuda;
    if (!pins_take(te, v, n, pins, &k, &cuda))
        return false;
    bool ok = cuda != NULL ? kvp_te_cuda_recv(cuda, &te->xfer, fd, v, n, reply_p)
                           : kvp_recvv_all(fd, iov, (int)n) == KVP_OK;
    pins_give(te, pins, k);
    return ok;
}

/* REGIONS (wire.h): the registered ranges, as they are kept (te_region_t is the wire's pair) */
static bool te_regions(void *backend, void *conn, int fd)
{
    _Static_assert(sizeof(te_region_t) == 16, "te_region_t is the wire's (address, length)");
    kvp_te_t *te = backend;
    if (!conn_admitted(te, conn, fd))
        return te_refuse(conn, fd, NULL);
    /* copied out under the lock, sent without it (a peer that does not read holds nothing) */
    te_region_t *copy = NULL;
    pthread_rwlock_rdlock(&te->lock);
    size_t n = te->n_regions < KVP_DATA_REGIONS_MAX ? te->n_regions : KVP_DATA_REGIONS_MAX;
    if (n > 0 && (copy = malloc(n * sizeof(*copy))) != NULL)
        memcpy(copy, te->regions, n * sizeof(*copy));
    pthread_rwlock_unlock(&te->lock);
    if (n > 0 && copy == NULL)
        return kvp_data_reply(fd, KVP_ERR_NOMEM, 0) == KVP_OK;
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = n * sizeof(te_region_t)};
    struct iovec iov[2] = {{.iov_base = &r, .iov_len = sizeof(r)},
                           {.iov_base = copy, .iov_len = n * sizeof(te_region_t)}};
    bool ok = kvp_sendv_all(fd, iov, n > 0 ? 2 : 1) == KVP_OK;
    free(copy);
    return ok;
}

/* ---- authentication (credentials on): TE_AUTH, wire.h ---- */

/* An end of a connection as TE_AUTH binds it (18 bytes): an IP address as IPv6 (IPv4
 * v4-mapped) and its port (big-endian); a Unix socket's name as the first 18 bytes of its
 * SHA-256, an unnamed one zeros. false: not a socket of those. */
static bool auth_end(const struct sockaddr_storage *ss, socklen_t len, uint8_t out[18])
{
    memset(out, 0, 18);
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &in->sin_addr, 4);
        memcpy(out + 16, &in->sin_port, 2);
        return true;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
        memcpy(out, &in6->sin6_addr, 16);
        memcpy(out + 16, &in6->sin6_port, 2);
        return true;
    }
    if (ss->ss_family != AF_UNIX)
        return false;
    size_t name = len > offsetof(struct sockaddr_un, sun_path)
                      ? (size_t)len - offsetof(struct sockaddr_un, sun_path)
                      : 0;
    if (name > 0) {
        uint8_t h[32];
        SHA256((const uint8_t *)((const struct sockaddr_un *)ss)->sun_path, name, h);
        memcpy(out, h, 18);
    }
    return true;
}

/* What a TE_AUTH signature covers (TE_AUTH_MSG bytes): a tag naming the signer's side, the
 * target's challenge and the initiator's, the engine's segment id, the connection it is made
 * on (the initiator's end and the target's, as each side sees them on fd), and the SHA-256
 * of the other side's certificate (DER): so a proof answers one challenge, for one
 * principal, on one connection. A party the initiator dialled that passes the target's
 * challenge on and the proof back (a relay) has a connection of its own to the target,
 * whose ends differ, and a certificate of its own. signer_initiator: the initiator's proof
 * (tag "kvpool te auth 3"), else the target's ("kvpool te targ 3"); initiator: which side
 * fd is. false: fd's ends unknown. */
#define TE_AUTH_MSG (16 + 32 + 32 + 8 + 18 + 18 + 32)
static bool auth_message(const uint8_t target_challenge[32], const uint8_t initiator_challenge[32],
                         const uint8_t *other_der, size_t other_len, int fd, bool initiator,
                         bool signer_initiator, uint8_t msg[TE_AUTH_MSG])
{
    memset(msg, 0, 16);
    memcpy(msg, signer_initiator ? "kvpool te auth 3" : "kvpool te targ 3", 16);
    memcpy(msg + 16, target_challenge, 32);
    memcpy(msg + 48, initiator_challenge, 32);
    uint64_t id = KVP_TE_SEGMENT_ID; /* little-endian hosts only (as the wire) */
    memcpy(msg + 80, &id, 8);
    struct sockaddr_storage l, p;
    socklen_t ll = sizeof(l), pl = sizeof(p);
    if (getsockname(fd, (struct sockaddr *)&l, &ll) != 0 ||
        getpeername(fd, (struct sockaddr *)&p, &pl) != 0)
        return false;
    SHA256(other_der, other_len, msg + 124);
    return auth_end(initiator ? &l : &p, initiator ? ll : pl, msg + 88) &&
           auth_end(initiator ? &p : &l, initiator ? pl : ll, msg + 106);
}

/* Is der a certificate of our CA, not revoked (the common TLS code's check, as the master's
 * and the indexer's), naming a principal KVPOOL_TE_PEERS allows? Its CN into cn. */
static bool auth_cert_ok(const te_auth_t *a, const uint8_t *der, size_t der_len, char *cn,
                         size_t cn_len, const char **why_p)
{
    cn[0] = '\0';
    if (!kvp_tls_verify_der(a->tls, der, der_len, cn, cn_len, why_p)) {
        cn[0] = '\0'; /* (*why_p says why) */
        ERR_clear_error();
        return false;
    }
    bool ok = a->n_allowed == 0;
    for (size_t i = 0; i < a->n_allowed && !ok; i++)
        ok = strcmp(a->allowed[i], cn) == 0;
    *why_p = ok ? NULL : "a principal KVPOOL_TE_PEERS does not name";
    return ok;
}

/* Did der's key (a certificate auth_cert_ok took) sign msg? */
static bool auth_sig_ok(const uint8_t *der, size_t der_len, const uint8_t *sig, size_t sig_len,
                        const uint8_t *msg, size_t msg_len, const char **why_p)
{
    const unsigned char *p = der;
    X509 *cert = d2i_X509(NULL, &p, (long)der_len);
    EVP_PKEY *pub = cert != NULL && p == der + der_len ? X509_get_pubkey(cert) : NULL;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    bool ok = pub != NULL && md != NULL &&
              EVP_DigestVerifyInit(md, NULL, EVP_sha256(), NULL, pub) == 1 &&
              EVP_DigestVerify(md, sig, sig_len, msg, msg_len) == 1;
    if (!ok)
        *why_p = "the signature does not verify with the certificate's key";
    ERR_clear_error();
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(pub);
    X509_free(cert);
    return ok;
}

/* Our key's signature over msg into sig (*sig_len_p: its room, then its length). */
static bool auth_sign(const te_auth_t *a, const uint8_t *msg, size_t msg_len, uint8_t *sig,
                      size_t *sig_len_p)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    bool ok = md != NULL && EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, a->key) == 1 &&
              EVP_DigestSign(md, sig, sig_len_p, msg, msg_len) == 1;
    EVP_MD_CTX_free(md);
    ERR_clear_error();
    return ok;
}

/* Why acl_rights refused (te's counter of it). */
enum { TE_WHY_AUTH, TE_WHY_TENANT, TE_WHY_ROLE };

/* What cn may do under acl (NULL: everything), tenant being our own principal's; 0 with
 * *why_p and *reason_p (TE_WHY_*): nothing. */
static uint8_t acl_rights(const kvp_acl_t *acl, const char *tenant, const char *cn,
                          const char **why_p, int *reason_p)
{
    if (acl == NULL)
        return TE_MAY_READ | TE_MAY_WRITE;
    const kvp_principal_t *p = kvp_acl_by_cn(acl, cn);
    *reason_p = TE_WHY_AUTH;
    if (p == NULL) {
        *why_p = "no principal of KVPOOL_TE_ACL has this cert-cn";
        return 0;
    }
    if (p->roles & KVP_ROLE_ADMIN)
        return TE_MAY_READ | TE_MAY_WRITE;
    *reason_p = TE_WHY_TENANT;
    if (strcmp(p->tenant, tenant) != 0) {
        *why_p = "a principal of another tenant than this engine's";
        return 0;
    }
    *reason_p = TE_WHY_ROLE;
    if (p->n_patterns > 0) {
        *why_p = "a principal with key patterns (an engine's KV is every key of its tenant's)";
        return 0;
    }
    uint8_t r = (p->roles & KVP_ROLE_READ ? TE_MAY_READ : 0) |
                (p->roles & KVP_ROLE_WRITE ? TE_MAY_WRITE : 0);
    if (r == 0)
        *why_p = "a principal with neither role read nor role write";
    return r;
}

/* What the proved principal cn may do here (TE_MAY_*), KVPOOL_TE_ACL's rule: none set,
 * read and write (KVPOOL_TE_PEERS already named it). With it: cn must be a principal's
 * cert-cn; an admin may read and write; anyone else must be of our own principal's tenant
 * and have no key patterns (our memory holds KV of every key of the tenant, as a segment
 * does for role shm's rule), then `read` lets it read and `write` write. 0 with *why_p
 * and the counter to bump in *count_p: refused. */
static uint8_t auth_rights(kvp_te_t *te, const char *cn, const char **why_p,
                           _Atomic uint64_t **count_p)
{
    te_auth_t *a = te->auth;
    int reason = TE_WHY_AUTH;
    pthread_mutex_lock(&a->acl_lock);
    uint8_t r = acl_rights(a->acl, a->tenant, cn, why_p, &reason);
    pthread_mutex_unlock(&a->acl_lock);
    *count_p = reason == TE_WHY_TENANT ? &te->refused_tenant
               : reason == TE_WHY_ROLE ? &te->refused_role
                                       : &te->refused_auth;
    return r;
}

/* TE_AUTH's proof as sent (wire.h): the lengths, the initiator's challenge. */
typedef struct te_auth_head {
    uint32_t cert_len, sig_len;
    uint8_t challenge[32];
} te_auth_head_t;

/* The target's side of TE_AUTH: our challenge and certificate out, the peer's proof in,
 * checked, then our own proof back. A refusal is answered KVP_ERR_DENIED and counted, and
 * the connection closes (a proof that passes admits it: te_proved). */
static bool te_auth(void *backend, void *conn, int fd)
{
    kvp_te_t *te = backend;
    te_conn_t *c = conn;
    const te_auth_t *a = te->auth;
    if (a == NULL)
        return kvp_data_reply(fd, KVP_OK, 0) == KVP_OK; /* nothing to prove, nothing proved */
    uint8_t challenge[32];
    if (RAND_bytes(challenge, sizeof(challenge)) != 1)
        return false;
    kvp_data_resp_t r = {
        .magic = KVP_DATA_MAGIC, .status = 0, .length = sizeof(challenge) + (uint64_t)a->cert_len};
    struct iovec iov[3] = {{.iov_base = &r, .iov_len = sizeof(r)},
                           {.iov_base = challenge, .iov_len = sizeof(challenge)},
                           {.iov_base = a->cert_der, .iov_len = (size_t)a->cert_len}};
    te_auth_head_t h;
    if (kvp_sendv_all(fd, iov, 3) != KVP_OK || kvp_recv_all(fd, &h, sizeof(h)) != KVP_OK)
        return false;
    if (h.cert_len == 0 || h.cert_len > KVP_DATA_TE_CERT_MAX || h.sig_len == 0 ||
        h.sig_len > KVP_DATA_TE_SIG_MAX) {
        atomic_fetch_add_explicit(&te->refused_auth, 1, memory_order_relaxed);
        kvp_data_reply(fd, KVP_ERR_PROTOCOL, 0);
        return false;
    }
    uint8_t *buf = malloc((size_t)h.cert_len + h.sig_len);
    if (buf == NULL || kvp_recv_all(fd, buf, (size_t)h.cert_len + h.sig_len) != KVP_OK) {
        free(buf);
        return false;
    }
    uint8_t msg[TE_AUTH_MSG], reply[TE_AUTH_MSG], sig[KVP_DATA_TE_SIG_MAX];
    size_t sig_len = sizeof(sig);
    char cn[128] = "";
    const char *why = "the connection's ends are unknown";
    bool ok = auth_message(challenge, h.challenge, a->cert_der, (size_t)a->cert_len, fd, false,
                           true, msg) &&
              auth_message(challenge, h.challenge, buf, h.cert_len, fd, false, false, reply) &&
              auth_cert_ok(a, buf, h.cert_len, cn, sizeof(cn), &why) &&
              auth_sig_ok(buf, h.cert_len, buf + h.cert_len, h.sig_len, msg, sizeof(msg), &why);
    free(buf);
    _Atomic uint64_t *count = &te->refused_auth;
    if (ok && a->acl_path[0] != '\0')
        acl_check(te);
    c->gen = atomic_load(&a->acl_gen);
    c->rights = ok ? auth_rights(te, cn, &why, &count) : 0;
    snprintf(c->cn, sizeof(c->cn), "%s", ok ? cn : "");
    ok = ok && c->rights != 0;
    c->own = ok && strcmp(cn, a->cn) == 0;
    c->authed = ok;
    c->admitted = 0; /* asked again at the next request */
    if (!ok) {
        atomic_fetch_add_explicit(count, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("transfer engine: a peer's certificate (CN '%s') refused: %s", cn,
                             why);
        kvp_data_reply(fd, KVP_ERR_DENIED, 0);
        return false;
    }
    /* our proof, for the initiator: the same challenges and connection, its certificate */
    if (!auth_sign(a, reply, sizeof(reply), sig, &sig_len)) {
        c->authed = false;
        kvp_data_reply(fd, KVP_ERR_SYSTEM, 0);
        return false;
    }
    r = (kvp_data_resp_t){.magic = KVP_DATA_MAGIC, .status = 0, .length = sig_len};
    struct iovec out[2] = {{.iov_base = &r, .iov_len = sizeof(r)},
                           {.iov_base = sig, .iov_len = sig_len}};
    return kvp_sendv_all(fd, out, 2) == KVP_OK;
}

/* Has the connection proved what it must (the server's admission, conn_server.h: until then
 * it has the handshake's deadline and is the first closed when the slots run out)? With
 * credentials, a TE_AUTH that passed; without, nothing to prove (protected mode's peer check
 * is made at each request). */
static bool te_proved(void *backend, void *conn)
{
    const kvp_te_t *te = backend;
    return te->auth == NULL || ((const te_conn_t *)conn)->authed;
}

/* Send an engine request of op (offset 0, length 0) on fd and read its answer's header:
 * KVP_OK with *r (status 0), or the failure (the answer's status). */
static kvp_status_t te_ask(int fd, uint16_t op, kvp_data_resp_t *r)
{
    kvp_data_req_t req = {.magic = KVP_DATA_MAGIC, .op = op, .segment_id = KVP_TE_SEGMENT_ID};
    return kvp_data_ask(fd, &(struct iovec){.iov_base = &req, .iov_len = sizeof(req)}, 1, r);
}

/* May the initiator move bytes with the target principal cn (its certificate checked)? The
 * rule a target applies to its peers, turned round: KVPOOL_TE_PEERS (auth_cert_ok), and with
 * KVPOOL_TE_ACL a principal of it that may read or write here (our tenant's, or an admin):
 * no KV goes to, or comes from, an engine of another tenant or a stranger. */
static bool target_allowed(kvp_te_t *te, const char *cn, const char **why_p)
{
    if (te->auth->acl_path[0] == '\0')
        return true;
    acl_check(te);
    _Atomic uint64_t *count;
    return auth_rights(te, cn, why_p, &count) != 0;
}

/* The target's half of TE_AUTH as the initiator reads it: its challenge and certificate
 * (der, malloc'd, *len_p; NULL: none). KVP_ERR_DENIED: the target proves nothing. */
static kvp_status_t target_hello(int fd, uint8_t challenge[32], uint8_t **der_p, size_t *len_p)
{
    kvp_data_resp_t r;
    *der_p = NULL;
    kvp_status_t st = te_ask(fd, KVP_DATA_TE_AUTH, &r);
    if (st != KVP_OK)
        return st;
    if (r.length == 0) /* a target with no credentials: it proves nothing either */
        return KVP_ERR_DENIED;
    if (r.length <= 32 || r.length > 32 + KVP_DATA_TE_CERT_MAX)
        return KVP_ERR_PROTOCOL;
    *len_p = (size_t)r.length - 32;
    if ((*der_p = malloc(*len_p)) == NULL)
        return KVP_ERR_NOMEM;
    st = kvp_recv_all(fd, challenge, 32);
    return st == KVP_OK ? kvp_recv_all(fd, *der_p, *len_p) : st;
}

/* The initiator's side (peer->hello of every target, and REGIONS): on a new connection fd,
 * check the target's certificate, prove ours (bound to its certificate and the connection),
 * then check the target's proof. KVP_ERR_DENIED: the target refused us, or proved nothing
 * we take (no credentials, a certificate of another CA, revoked, not named, of another
 * tenant, a proof that does not verify): nothing moves to or from it. */
/* Our proof (h, our certificate, sig) out on fd, the target's answer in: KVP_OK with its
 * signature in sig (*sig_len_p), or its refusal. */
static kvp_status_t proof_exchange(const te_auth_t *a, int fd, const te_auth_head_t *h,
                                   uint8_t sig[KVP_DATA_TE_SIG_MAX], size_t *sig_len_p)
{
    struct iovec iov[3] = {{.iov_base = (void *)h, .iov_len = sizeof(*h)},
                           {.iov_base = a->cert_der, .iov_len = (size_t)a->cert_len},
                           {.iov_base = sig, .iov_len = h->sig_len}};
    kvp_data_resp_t r;
    kvp_status_t st = kvp_data_ask(fd, iov, 3, &r);
    if (st != KVP_OK)
        return st;
    if (r.length == 0 || r.length > KVP_DATA_TE_SIG_MAX)
        return KVP_ERR_PROTOCOL;
    *sig_len_p = (size_t)r.length;
    return kvp_recv_all(fd, sig, *sig_len_p);
}

static kvp_status_t te_auth_prove(void *arg, int fd, uint32_t timeout_ms)
{
    (void)timeout_ms; /* fd's SO_RCVTIMEO / SO_SNDTIMEO are set */
    kvp_te_t *te = arg;
    const te_auth_t *a = te->auth;
    uint8_t *der, tc[32], msg[TE_AUTH_MSG], sig[KVP_DATA_TE_SIG_MAX];
    size_t der_len = 0, sig_len = sizeof(sig);
    te_auth_head_t h = {.cert_len = (uint32_t)a->cert_len};
    char cn[128] = "";
    const char *why = "it proves nothing (no credentials)";
    kvp_status_t st = target_hello(fd, tc, &der, &der_len);
    if (st == KVP_OK &&
        (!auth_cert_ok(a, der, der_len, cn, sizeof(cn), &why) || !target_allowed(te, cn, &why)))
        st = KVP_ERR_DENIED;
    if (st == KVP_OK && (RAND_bytes(h.challenge, sizeof(h.challenge)) != 1 ||
                         !auth_message(tc, h.challenge, der, der_len, fd, true, true, msg) ||
                         !auth_sign(a, msg, sizeof(msg), sig, &sig_len)))
        st = KVP_ERR_SYSTEM;
    if (st == KVP_OK) {
        h.sig_len = (uint32_t)sig_len;
        st = proof_exchange(a, fd, &h, sig, &sig_len);
        why = "it refused our proof";
    }
    if (st == KVP_OK &&
        (!auth_message(tc, h.challenge, a->cert_der, (size_t)a->cert_len, fd, true, false, msg) ||
         !auth_sig_ok(der, der_len, sig, sig_len, msg, sizeof(msg), &why)))
        st = KVP_ERR_DENIED;
    if (st == KVP_ERR_DENIED)
        KVP_LOG_WARN_LIMITED("transfer engine: a target (CN '%s') not taken: %s", cn, why);
    free(der);
    return st;
}

static void auth_free(te_auth_t *a)
{
    if (a == NULL)
        return;
    kvp_tls_destroy(a->tls);
    kvp_acl_destroy(a->acl);
    pthread_mutex_destroy(&a->acl_lock);
    pthread_mutex_destroy(&a->refresh_lock);
    EVP_PKEY_free(a->key);
    OPENSSL_free(a->cert_der);
    free(a);
}

/* The ACL file at path, with our own principal's tenant: *acl_p and tenant, or false (why
 * logged): a file that does not load, or names no principal with our certificate's CN. */
static bool acl_read(const te_auth_t *a, const char *path, kvp_acl_t **acl_p,
                     char tenant[KVP_TENANT_NAME_MAX])
{
    char err[512];
    kvp_acl_t *acl = NULL;
    if (kvp_acl_load(path, &acl, err, sizeof(err)) != KVP_OK) {
        KVP_LOG_ERROR("transfer engine: KVPOOL_TE_ACL %s: %s", path, err);
        return false;
    }
    const kvp_principal_t *me = kvp_acl_by_cn(acl, a->cn);
    if (me == NULL) {
        KVP_LOG_ERROR("transfer engine: KVPOOL_TE_ACL %s has no principal whose cert-cn is our "
                      "certificate's CN '%s' (its tenant is the one peers must be of)",
                      path, a->cn);
        kvp_acl_destroy(acl);
        return false;
    }
    snprintf(tenant, KVP_TENANT_NAME_MAX, "%s", me->tenant);
    *acl_p = acl;
    return true;
}

static bool same_file(const struct stat *x, const struct stat *y)
{
    return x->st_ino == y->st_ino && x->st_dev == y->st_dev && x->st_size == y->st_size &&
           x->st_mtim.tv_sec == y->st_mtim.tv_sec && x->st_mtim.tv_nsec == y->st_mtim.tv_nsec;
}

/* Did a principal that could hold rdma keys under (old, old_tenant) (it may read and write)
 * lose either under (acl, tenant)? */
static bool rdma_narrowed(const kvp_acl_t *old, const char *old_tenant, const kvp_acl_t *acl,
                          const char *tenant)
{
    const uint8_t both = TE_MAY_READ | TE_MAY_WRITE;
    for (size_t i = 0; i < old->n; i++) {
        const char *cn = old->p[i].cert_cn, *why;
        int reason;
        if (cn[0] != '\0' && acl_rights(old, old_tenant, cn, &why, &reason) == both &&
            acl_rights(acl, tenant, cn, &why, &reason) != both)
            return true;
    }
    return false;
}

/* KVPOOL_TE_ACL changed (another inode, size or mtime: an edit, or a new file renamed over
 * it) since it was read? Read it again, at most every TE_ACL_CHECK_MS, one thread at a
 * time; a version that does not load keeps the one before (logged once per change), as
 * the master's SIGHUP reload does. true: read again, and a principal that could hold rdma
 * keys lost read or write (the caller cuts the rdma peers off: kvp_rdma_regions_cut). */
static bool acl_refresh(te_auth_t *a)
{
    uint64_t now = kvp_now_ms(), last = atomic_load(&a->acl_checked_ms);
    if (now - last < TE_ACL_CHECK_MS ||
        !atomic_compare_exchange_strong(&a->acl_checked_ms, &last, now) ||
        pthread_mutex_trylock(&a->refresh_lock) != 0)
        return false;
    struct stat st;
    bool changed = false;
    if (stat(a->acl_path, &st) != 0)
        KVP_LOG_WARN_LIMITED("transfer engine: KVPOOL_TE_ACL %s: %s; the ACL read before stays",
                             a->acl_path, strerror(errno));
    else if (!same_file(&st, &a->acl_st)) {
        a->acl_st = st;
        changed = true;
    }
    kvp_acl_t *acl = NULL;
    char tenant[KVP_TENANT_NAME_MAX];
    if (changed && !acl_read(a, a->acl_path, &acl, tenant)) {
        KVP_LOG_ERROR("transfer engine: KVPOOL_TE_ACL changed but does not load; the ACL read "
                      "before stays");
        changed = false;
    }
    if (!changed) {
        pthread_mutex_unlock(&a->refresh_lock);
        return false;
    }
    pthread_mutex_lock(&a->acl_lock);
    kvp_acl_t *old = a->acl;
    bool narrowed = rdma_narrowed(old, a->tenant, acl, tenant);
    a->acl = acl;
    snprintf(a->tenant, sizeof(a->tenant), "%s", tenant);
    atomic_fetch_add(&a->acl_gen, 1);
    pthread_mutex_unlock(&a->acl_lock);
    pthread_mutex_unlock(&a->refresh_lock);
    kvp_acl_destroy(old);
    KVP_LOG_INFO("transfer engine: KVPOOL_TE_ACL %s read again: its roles apply to every "
                 "connection at its next request (tenant %s)%s",
                 a->acl_path, tenant,
                 narrowed ? "; a principal that could hold rdma keys lost a role: every rdma "
                            "peer's queue pair is cut (each connects again, checked anew)"
                          : "");
    return narrowed;
}

/* acl_refresh, and the rdma peers cut off when it narrowed a principal that could hold rdma
 * keys: an rkey opens its region to whoever holds it, so the only way to take it back from
 * one peer is to close every queue pair (and outstanding token); the others connect again
 * at their next batch, through the admission and the new roles. */
static void acl_check(kvp_te_t *te)
{
    if (acl_refresh(te->auth) && te->rdma != NULL)
        kvp_rdma_regions_cut(te->rdma);
}

/* The rdma accept thread's tick (kvp_rdma_regions_serve's): the ACL is looked at even when no tcp
 * request comes (rdma writes reach no thread of ours). */
static void acl_tick(void *arg)
{
    acl_check(arg);
}

/* KVPOOL_TE_ACL (an ACL file, the master's --acl-file format) into a: one that does not
 * load is KVP_ERR_INVALID_ARG (never an engine that takes anyone). */
static kvp_status_t acl_load(te_auth_t *a, const char *path)
{
    if (path == NULL || path[0] == '\0')
        return KVP_OK;
    if (strlen(path) >= sizeof(a->acl_path)) {
        KVP_LOG_ERROR("transfer engine: KVPOOL_TE_ACL: a path of at most %zu bytes",
                      sizeof(a->acl_path) - 1);
        return KVP_ERR_INVALID_ARG;
    }
    if (stat(path, &a->acl_st) != 0) {
        KVP_LOG_ERROR("transfer engine: KVPOOL_TE_ACL %s: %s", path, strerror(errno));
        return KVP_ERR_INVALID_ARG;
    }
    if (!acl_read(a, path, &a->acl, a->tenant))
        return KVP_ERR_INVALID_ARG;
    snprintf(a->acl_path, sizeof(a->acl_path), "%s", path);
    atomic_store(&a->acl_checked_ms, kvp_now_ms());
    return KVP_OK;
}

/* Credentials from the environment, as the store's client takes them (KVPOOL_TLS_CA,
 * KVPOOL_TLS_CERT, KVPOOL_TLS_KEY: the library's table, client/env.c), and the engine's own
 * (env: KVPOOL_TE_PEERS, KVPOOL_TE_ACL, KVPOOL_TLS_CRL). *a_p NULL: none configured. Some
 * but not all three, or files that do not load: KVP_ERR_INVALID_ARG. */
static kvp_status_t auth_load(const kvp_te_env_t *env, te_auth_t **a_p)
{
    *a_p = NULL;
    kvp_client_env_t cenv;
    kvp_client_env_read(&cenv);
    const char *ca = cenv.tls_ca, *cert = cenv.tls_cert, *key = cenv.tls_key;
    int given = (ca != NULL) + (cert != NULL) + (key != NULL);
    if (given == 0) {
        const char *acl = env->acl;
        if (acl != NULL && acl[0] != '\0') {
            KVP_LOG_ERROR("transfer engine: KVPOOL_TE_ACL needs KVPOOL_TLS_CA, _CERT and _KEY "
                          "(a peer's roles are its proved certificate's)");
            return KVP_ERR_INVALID_ARG;
        }
        const char *tok = cenv.token;
        if (tok != NULL && tok[0] != '\0')
            KVP_LOG_WARN("transfer engine: KVPOOL_TOKEN alone does not authenticate engine "
                         "peers (a token cannot be proved to a peer without the master): "
                         "protected mode; give KVPOOL_TLS_CA, _CERT and _KEY");
        return KVP_OK;
    }
    if (given != 3) {
        KVP_LOG_ERROR("transfer engine: peers authenticate with KVPOOL_TLS_CA, KVPOOL_TLS_CERT "
                      "and KVPOOL_TLS_KEY together; only some are set");
        return KVP_ERR_INVALID_ARG;
    }
    te_auth_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return KVP_ERR_NOMEM;
    pthread_mutex_init(&a->acl_lock, NULL);
    pthread_mutex_init(&a->refresh_lock, NULL);
    FILE *f = NULL;
    X509 *x = NULL;
    const char *bad = NULL;
    const char *crl = env->tls_crl;
    kvp_tls_params_t tp = {.cert = cert, .key = key, .ca = ca, .crl = crl && crl[0] ? crl : NULL};
    char terr[512];
    if (kvp_tls_create(&tp, true, &a->tls, terr, sizeof(terr)) != KVP_OK) {
        KVP_LOG_ERROR("transfer engine: %s", terr);
        bad = ca;
    } else if ((f = fopen(cert, "re")) == NULL ||
               (x = PEM_read_X509(f, NULL, NULL, NULL)) == NULL ||
               (a->cert_len = i2d_X509(x, &a->cert_der)) <= 0 ||
               a->cert_len > KVP_DATA_TE_CERT_MAX ||
               X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, a->cn,
                                         sizeof(a->cn)) <= 0)
        bad = cert;
    if (f != NULL)
        fclose(f);
    f = NULL;
    if (bad == NULL && ((f = fopen(key, "re")) == NULL ||
                        (a->key = PEM_read_PrivateKey(f, NULL, NULL, NULL)) == NULL ||
                        X509_check_private_key(x, a->key) != 1))
        bad = key;
    if (f != NULL)
        fclose(f);
    X509_free(x);
    ERR_clear_error();
    const char *peers = env->peers;
    for (const char *s = peers; bad == NULL && s != NULL && *s != '\0';) {
        size_t n = strcspn(s, ",");
        while (n > 0 && *s == ' ')
            s++, n--;
        size_t m = n;
        while (m > 0 && s[m - 1] == ' ')
            m--;
        if (m > 0) {
            if (a->n_allowed == TE_ALLOWED_MAX || m >= sizeof(a->allowed[0])) {
                KVP_LOG_ERROR("transfer engine: KVPOOL_TE_PEERS: at most %d names of at most "
                              "127 bytes",
                              TE_ALLOWED_MAX);
                auth_free(a);
                return KVP_ERR_INVALID_ARG;
            }
            memcpy(a->allowed[a->n_allowed], s, m);
            a->allowed[a->n_allowed++][m] = '\0';
        }
        s += n;
        if (*s == ',')
            s++;
    }
    if (bad != NULL) {
        KVP_LOG_ERROR("transfer engine: %s does not load (or the key is not the certificate's)",
                      bad);
        auth_free(a);
        return KVP_ERR_INVALID_ARG;
    }
    kvp_status_t st = acl_load(a, env->acl);
    if (st != KVP_OK) {
        auth_free(a);
        return st;
    }
    *a_p = a;
    return KVP_OK;
}

/* ---- the one-copy shm path, target's side (TE_CMA, wire.h) ---- */

/* The ptracer window of every engine of the process: one peer at a time may ptrace-access
 * the process (PR_SET_PTRACER), so two engines in one process never open it to each
 * other's peer nor close it under one. */
static pthread_mutex_t te_ptracer_lock = PTHREAD_MUTEX_INITIALIZER;

/* TE_CMA with KVP_DATA_TE_CMA_LEASE (wire.h): a standing lease (te_lease.h), only where
 * the kernel already opens all our memory to this peer, so the lease gives it nothing it
 * could not take: a Unix socket's peer of our user (or root), we dumpable and no Yama
 * restriction, and with credentials our own principal with no KVPOOL_TE_ACL that could
 * narrow its rights later. */
static bool te_lease_grant(kvp_te_t *te, te_conn_t *c, int fd)
{
    if (!conn_may(te, c, fd, TE_MAY_READ | TE_MAY_WRITE))
        return kvp_data_reply(fd, KVP_ERR_DENIED, 0) == KVP_OK;
    int pid = 0;
    uint32_t uid;
    if (!te->cma_lease || (te->auth != NULL && (!c->own || te->auth->acl_path[0] != '\0')) ||
        c->slot >= 0 || !kvp_unix_peer(fd, &pid, &uid) || pid <= 0 || !kvp_te_lease_allowed())
        return kvp_data_reply(fd, KVP_ERR_UNSUPPORTED, 0) == KVP_OK;
    kvp_te_lease_host_t *h = atomic_load(&te->lease);
    if (h == NULL) {
        pthread_rwlock_wrlock(&te->lock);
        if (!te->closing && (h = atomic_load(&te->lease)) == NULL &&
            kvp_te_lease_host_create(&h) == KVP_OK) {
            atomic_store(&te->lease, h);
            lease_publish_locked(te);
        }
        pthread_rwlock_unlock(&te->lock);
    }
    int fds[2];
    if (h != NULL)
        c->slot = kvp_te_lease_host_take(h, pid, fds);
    if (c->slot < 0) {
        KVP_LOG_WARN_LIMITED("transfer engine: no standing lease for a shm peer (%d held, or "
                             "no memfd or pidfd here: %s): it asks us per batch",
                             KVP_TE_LEASE_SLOTS, strerror(errno));
        return kvp_data_reply(fd, KVP_ERR_UNSUPPORTED, 0) == KVP_OK;
    }
    kvp_data_resp_t r = {.magic = KVP_DATA_MAGIC, .status = 0, .length = 0};
    return kvp_unix_send_fds(fd, &r, sizeof(r), fds, 2) == KVP_OK;
}

static bool te_cma(void *backend, void *conn, int fd, const kvp_data_req_t *req)
{
    kvp_te_t *te = backend;
    kvp_data_vec_t v[KVP_TE_CMA_VEC_MAX];
    uint64_t n = req->offset, total = 0;
    if (req->flags & KVP_DATA_TE_CMA_LEASE) {
        if (n != 0 || req->length != 0) {
            kvp_data_reply(fd, KVP_ERR_PROTOCOL, 0);
            return false;
        }
        return te_lease_grant(te, conn, fd);
    }
    if (n == 0 || n > KVP_TE_CMA_VEC_MAX) {
        kvp_data_reply(fd, KVP_ERR_PROTOCOL, 0);
        return false;
    }
    if (kvp_recv_all(fd, v, n * sizeof(v[0])) != KVP_OK)
        return false;
    bool write = (req->flags & KVP_DATA_TE_CMA_WRITE) != 0;
    int pid = 0;
    uint32_t uid;
    if (!conn_may(te, conn, fd, write ? TE_MAY_WRITE : TE_MAY_READ))
        return kvp_data_reply(fd, KVP_ERR_DENIED, 0) == KVP_OK;
    /* credentials on: the kernel access would open all our memory, not only the ranges,
     * to the peer for the batch; only our own principal gets it, another the socket frames
     * (the initiator falls back at KVP_ERR_UNSUPPORTED, route "shm") */
    if (te->auth != NULL && !((te_conn_t *)conn)->own)
        return kvp_data_reply(fd, KVP_ERR_UNSUPPORTED, 0) == KVP_OK;
    if (!kvp_unix_peer(fd, &pid, &uid) || pid <= 0)
        return kvp_data_reply(fd, KVP_ERR_UNSUPPORTED, 0) == KVP_OK; /* tcp: not this host */
    for (uint64_t i = 0; i < n; i++) {
        if (v[i].segment_id != KVP_TE_SEGMENT_ID)
            return kvp_data_reply(fd, KVP_ERR_SEGMENT_GONE, 0) == KVP_OK;
        kvp_status_t st =
            v[i].length == 0 ? KVP_ERR_INVALID_ARG : te_check(te, v[i].offset, v[i].length, write);
        if (st != KVP_OK)
            return kvp_data_reply(fd, st, 0) == KVP_OK;
        total += v[i].length;
    }
    if (total != req->length) {
        kvp_data_reply(fd, KVP_ERR_PROTOCOL, 0);
        return false;
    }
    /* the ranges stay registered (pinned: an unregister of theirs waits) until the peer says
     * it is done, no lock held meanwhile; under Yama's ptrace_scope 1 the peer may
     * ptrace-access us for that time, one peer at a time in the process (PR_SET_PTRACER is
     * the process's, whatever engine of it sets it); with no such restriction nothing is
     * opened and peers copy at once */
    te_pin_t *pins[KVP_TE_CMA_VEC_MAX];
    size_t k = 0;
    te_cuda_t *dev = NULL;
    bool pinned = pins_take(te, v, n, pins, &k, &dev);
    bool ok;
    int32_t err = -1;
    if (!pinned)
        ok = kvp_data_reply(fd, KVP_ERR_OUT_OF_RANGE, 0) == KVP_OK;
    else if (dev) /* the kernel cannot reach it */
        ok = kvp_data_reply(fd, KVP_ERR_UNSUPPORTED, 0) == KVP_OK;
    else {
        if (te->ptracer_window) {
            pthread_mutex_lock(&te_ptracer_lock);
            (void)prctl(PR_SET_PTRACER, (unsigned long)pid, 0, 0, 0);
        }
        ok = kvp_data_reply(fd, KVP_OK, 0) == KVP_OK &&
             kvp_recv_all(fd, &err, sizeof(err)) == KVP_OK;
        if (te->ptracer_window) {
            (void)prctl(PR_SET_PTRACER, 0, 0, 0, 0);
            pthread_mutex_unlock(&te_ptracer_lock);
        }
    }
    if (pinned)
        pins_give(te, pins, k);
    if (ok && err == 0) {
        atomic_fetch_add_explicit(&te->cma_served[write ? KVP_TE_WRITE : KVP_TE_READ], n,
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&te->cma_bytes[write ? KVP_TE_WRITE : KVP_TE_READ], total,
                                  memory_order_relaxed);
    }
    return ok;
}

/* ---- notifies (TE_NOTIFY, wire.h) ---- */

static bool te_notify(void *backend, void *conn, int fd, const kvp_data_req_t *req)
{
    kvp_te_t *te = backend;
    if (req->offset > req->length || req->length > KVP_DATA_TE_NOTIFY_MAX) {
        kvp_data_reply(fd, KVP_ERR_PROTOCOL, 0);
        return false;
    }
    te_notify_t *nt = malloc(sizeof(*nt) + req->length + 1);
    if (nt == NULL || kvp_recv_all(fd, nt->data, req->length) != KVP_OK) {
        free(nt);
        return false;
    }
    kvp_status_t st = KVP_OK;
    if (!conn_may(te, conn, fd, TE_MAY_WRITE)) /* "the bytes are there": a writer's word */
        st = KVP_ERR_DENIED;
    else {
        nt->next = NULL;
        nt->name_len = req->offset;
        nt->msg_len = req->length - req->offset;
        pthread_mutex_lock(&te->notify_lock);
        if (te->n_notifies == TE_NOTIFIES_MAX)
            st = KVP_ERR_NO_SPACE;
        else {
            *te->notify_tail = nt;
            te->notify_tail = &nt->next;
            te->n_notifies++;
            nt = NULL;
        }
        pthread_mutex_unlock(&te->notify_lock);
    }
    free(nt);
    atomic_fetch_add_explicit(st == KVP_OK ? &te->notifies : &te->notifies_dropped, 1,
                              memory_order_relaxed);
    return kvp_data_reply(fd, st, 0) == KVP_OK;
}

/* ---- the rdma route's keys (TE_RDMA, wire.h): admitted peers only ---- */

static bool te_rdma_frame(void *backend, void *conn, int fd, const kvp_data_req_t *req)
{
    (void)req;
    kvp_te_t *te = backend;
    if (!conn_admitted(te, conn, fd))
        return kvp_data_reply(fd, KVP_ERR_DENIED, 0) == KVP_OK;
    if (te->rdma == NULL)
        return kvp_data_reply(fd, KVP_ERR_UNSUPPORTED, 0) == KVP_OK;
    /* a region's rkey opens it for remote reads and writes alike: with KVPOOL_TE_ACL, a
     * principal that may only read (or only write) gets no keys and is served over tcp, where
     * each request is checked against its roles */
    const uint8_t both = TE_MAY_READ | TE_MAY_WRITE;
    if (te->auth != NULL && (conn_rights(te, conn) & both) != both) {
        KVP_LOG_WARN_LIMITED("transfer engine: a peer whose principal may not both read and "
                             "write here asked for rdma keys; it is served over tcp");
        return kvp_data_reply(fd, KVP_ERR_UNSUPPORTED, 0) == KVP_OK;
    }
    return kvp_rdma_regions_answer(te->rdma, fd);
}

/* The engine's own frames (wire.h: REGIONS, TE_AUTH, TE_CMA, TE_NOTIFY, TE_RDMA), which the
 * store's data server hands over whole (data_backend.h op_frame). */
static kvp_data_op_t te_frame(void *backend, void *conn, kvp_conn_t *frame, int fd,
                              const kvp_data_req_t *req)
{
    bool plain = req->segment_id == KVP_TE_SEGMENT_ID && req->offset == 0 && req->length == 0;
    bool go_on;
    switch (req->op) {
    case KVP_DATA_REGIONS:
    case KVP_DATA_TE_AUTH:
    case KVP_DATA_TE_RDMA:
        if (!plain) {
            kvp_data_reply(fd, KVP_ERR_PROTOCOL, 0);
            return KVP_DATA_OP_CLOSE;
        }
        go_on = req->op == KVP_DATA_REGIONS   ? te_regions(backend, conn, fd)
                : req->op == KVP_DATA_TE_AUTH ? te_auth(backend, conn, fd)
                                              : te_rdma_frame(backend, conn, fd, req);
        break;
    case KVP_DATA_TE_CMA:
        kvp_conn_frame_extend(frame, req->length); /* the peer moves them meanwhile */
        go_on = te_cma(backend, conn, fd, req);
        break;
    case KVP_DATA_TE_NOTIFY:
        go_on = te_notify(backend, conn, fd, req);
        break;
    default:
        return KVP_DATA_OP_UNKNOWN;
    }
    return go_on ? KVP_DATA_OP_GO_ON : KVP_DATA_OP_CLOSE;
}

static const kvp_data_backend_ops_t te_ops = {
    .name = "transfer engine",
    .op_frame = te_frame,
    .conn_open = te_conn_open,
    .conn_close = te_conn_close,
    .proved = te_proved,
    .check = te_check,
    .read = te_read,
    .write = te_write,
};

/* ---- create / destroy ---- */

/* The engine's transports (its transfer engine's list, in priority order, into
 * te->tp_list): rdma (peers of other hosts: the store's rdma transport, our ranges served on
 * it, transport/rdma_regions.h) when asked for or (auto) where this host has a device, the
 * one-copy shm path (this host's peers, KVPOOL_TE_SHM cma or cma-checked: te_shm.c), tcp (the
 * rest, and this host's peers through the socket frames on their Unix socket). */
static void te_transports(kvp_te_t *te, int proto)
{
    size_t n = 0;
    if (proto == KVP_TRANSPORT_RDMA || (proto == KVP_TRANSPORT_AUTO && kvp_rdma_present()))
        te->tp_list[n++] = &kvp_transport_rdma_ops;
    if (te->cma)
        te->tp_list[n++] = &kvp_te_shm_ops;
    te->tp_list[n++] = &kvp_transport_tcp_ops;
    te->tp_list[n] = NULL;
    te->xfer.list = te->tp_list;
}
static kvp_status_t te_dial_peer(void *arg, const kvp_peer_t *peer, int *fd_p, int *pid_p);

/* kvp_te_create's arguments and KVPOOL_AUTH: the transport asked for (*proto_p), protected
 * mode (*protected_p), and the address to listen on (host, "" for every address; *port_p,
 * 0 for any). KVP_OK, UNSUPPORTED (said) or INVALID_ARG. */
static kvp_status_t te_args(const char *local_hostname, const char *metadata, const char *protocol,
                            int *proto_p, bool *protected_p, char *host, size_t host_len,
                            uint16_t *port_p)
{
    if (metadata != NULL && strcmp(metadata, "P2PHANDSHAKE") != 0) {
        KVP_LOG_ERROR("transfer engine: metadata '%s': only P2PHANDSHAKE is supported", metadata);
        return KVP_ERR_UNSUPPORTED;
    }
    if (protocol == NULL || protocol[0] == '\0' || strcmp(protocol, "auto") == 0)
        *proto_p = KVP_TRANSPORT_AUTO;
    else if (strcmp(protocol, "tcp") == 0)
        *proto_p = KVP_TRANSPORT_TCP;
    else if (strcmp(protocol, "shm") == 0)
        *proto_p = KVP_TRANSPORT_SHM;
    else if (strcmp(protocol, "rdma") == 0)
        *proto_p = KVP_TRANSPORT_RDMA;
    else {
        KVP_LOG_ERROR("transfer engine: protocol '%s' is not supported here (tcp, shm, rdma, "
                      "auto)",
                      protocol);
        return KVP_ERR_UNSUPPORTED;
    }
    *protected_p = true;
    kvp_client_env_t cenv; /* (the library's table, client/env.c) */
    kvp_client_env_read(&cenv);
    const char *auth_env = cenv.auth;
    if (auth_env != NULL && strcmp(auth_env, "none") == 0)
        *protected_p = false;
    else if (auth_env != NULL && auth_env[0] != '\0' && strcmp(auth_env, "protected") != 0)
        return KVP_ERR_INVALID_ARG;
    host[0] = '\0';
    *port_p = 0;
    if (local_hostname != NULL && local_hostname[0] != '\0') {
        if (strchr(local_hostname, ':') != NULL && local_hostname[0] != '[') {
            if (kvp_parse_hostport(local_hostname, host, host_len, port_p) != KVP_OK)
                return KVP_ERR_INVALID_ARG;
        } else
            snprintf(host, host_len, "%s", local_hostname);
    }
    return KVP_OK;
}

/* A new engine's locks, queue and transfer settings (KVPOOL_TE_TIMEOUT_MS, _STREAMS, _CHAIN,
 * _STAGE_CHUNK); nothing that can fail. */
static void te_init_state(kvp_te_t *te, const kvp_te_env_t *env, bool protected_mode)
{
    pthread_mutex_init(&te->notify_lock, NULL);
    te->notify_tail = &te->notify_head;
    te->protected_mode = protected_mode;
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&te->lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&te->peers_lock, NULL);
    pthread_mutex_init(&te->q_lock, NULL);
    pthread_cond_init(&te->q_cond, NULL);
    pthread_mutex_init(&te->reg_lock, NULL);
    pthread_mutex_init(&te->pin_lock, NULL);
    pthread_cond_init(&te->pin_cond, NULL);
    te->ptracer_window = kvp_te_ptracer_window();
    te->next_id = 1;
    te->xfer.forced = KVP_TRANSPORT_AUTO; /* its own list (te_transports_*) */
    kvp_host_id(te->xfer.host_id, sizeof(te->xfer.host_id));
    te->xfer.timeout_ms = env->timeout_ms;
    te->xfer.tcp_streams = env->streams;
    te->xfer.tcp_slice = 1 << 20;
    te->xfer.tcp_chain = env->chain;
    te->xfer.stage_chunk = env->stage_chunk;
}

/* The engine's data server on host:port (host "" listens on every address, "localhost" on
 * the loopback one, a name binds that one): te->srv and te->port. */
static kvp_status_t te_listen(kvp_te_t *te, const char *host, uint16_t port, bool protected_mode)
{
    const char *bind = host[0] != '\0' && strcmp(host, "localhost") != 0 ? host : NULL;
    if (host[0] != '\0' && strcmp(host, "localhost") == 0)
        bind = "127.0.0.1";
    kvp_data_server_params_t p = {.ops = &te_ops,
                                  .backend = te,
                                  .size = UINT64_MAX,
                                  .segment_id = KVP_TE_SEGMENT_ID,
                                  .host = bind,
                                  .port = port,
                                  .protected_mode = protected_mode};
    kvp_status_t st = kvp_data_server_create(&p, &te->srv, &te->port);
    if (st != KVP_OK)
        KVP_LOG_ERROR("transfer engine: cannot listen on %s:%u: %s", bind ? bind : "*", port,
                      kvp_strerror(st));
    return st;
}

/* Our ranges served on the rdma transport (when the list has one: te_transports): te->rdma.
 * A failure fails the engine only when rdma was asked for; auto goes on with tcp and shm. */
static kvp_status_t te_rdma_start(kvp_te_t *te, int proto)
{
    if (proto != KVP_TRANSPORT_RDMA && proto != KVP_TRANSPORT_AUTO)
        return KVP_OK;
    bool acl = te->auth != NULL && te->auth->acl_path[0] != '\0';
    kvp_status_t st = kvp_rdma_regions_serve(&te->xfer, acl ? acl_tick : NULL, te, &te->rdma);
    if (st == KVP_OK) {
        KVP_LOG_INFO("transfer engine: rdma on %s", kvp_rdma_regions_where(te->rdma));
        return KVP_OK;
    }
    if (proto == KVP_TRANSPORT_RDMA) {
        KVP_LOG_ERROR("transfer engine: protocol rdma, and no rdma here: %s",
                      st == KVP_ERR_NOT_FOUND && te->xfer.why[0] ? te->xfer.why : kvp_strerror(st));
        return st == KVP_ERR_NOT_FOUND ? KVP_ERR_TRANSPORT : st;
    }
    if (st != KVP_ERR_NOT_FOUND)
        KVP_LOG_WARN("transfer engine: rdma cannot serve here (auto): %s; peers reach us over "
                     "tcp and shm",
                     kvp_strerror(st));
    return KVP_OK;
}

/* rdma_regions.h's offer of a peer, for the rdma transport (kvp_transfer_t.rdma_offer): a
 * connection of ours to it, admitted there, and its answer to TE_RDMA. */
static kvp_status_t te_connect(kvp_te_t *te, const kvp_peer_t *peer, int *fd_p, int *pid_p);

static kvp_status_t te_rdma_offer(void *arg, const kvp_peer_t *peer, kvp_rdma_offer_t *offer)
{
    int fd, pid;
    kvp_status_t st = te_connect(arg, peer, &fd, &pid);
    if (st != KVP_OK)
        return st;
    st = kvp_rdma_regions_ask(fd, offer);
    close(fd);
    return st;
}

/* A started engine: who may reach it (logged), its shm socket, its place in the registry. */
static void te_announce(kvp_te_t *te)
{
    const te_auth_t *auth = te->auth;
    if (auth != NULL)
        KVP_LOG_INFO("transfer engine: peers prove a certificate of our CA (ours: CN '%s'); "
                     "admitted: %s%s%s",
                     auth->cn,
                     auth->n_allowed ? "the principals KVPOOL_TE_PEERS names"
                                     : "any principal of that CA",
                     auth->acl ? ", as the roles of KVPOOL_TE_ACL allow, tenant " : "",
                     auth->acl ? auth->tenant : "");
    char sock[64];
    snprintf(sock, sizeof(sock), "kvpool-te-%u", te->port);
    if (kvp_data_server_share(te->srv, -1, sock) == KVP_OK)
        te->shm_served = true;
    else
        KVP_LOG_WARN("transfer engine: the shm socket @%s is taken: peers reach us over tcp", sock);
    /* its counts: metrics() only, not the client's */
    if (kvp_te_registry_add(te, kvp_te_get_counters) != KVP_OK)
        KVP_LOG_WARN("transfer engine: out of memory: not counted in the client's metrics");
}

static kvp_status_t te_create(const char *local_hostname, const char *metadata,
                              const char *protocol, kvp_te_t **te_p)
{
    *te_p = NULL;
    int proto;
    bool protected_mode;
    char host[256];
    uint16_t port;
    kvp_status_t st = te_args(local_hostname, metadata, protocol, &proto, &protected_mode, host,
                              sizeof(host), &port);
    if (st != KVP_OK)
        return st;
    kvp_te_env_t env; /* KVPOOL_TE_*: a bad value fails the engine, named */
    char err[320];
    if (kvp_te_env_read(&env, err, sizeof(err)) != KVP_OK) {
        KVP_LOG_ERROR("transfer engine: %s", err);
        kvp_api_fail("transfer engine: %s", err); /* (kvp_client_last_error) */
        return KVP_ERR_INVALID_ARG;
    }
    te_auth_t *auth;
    st = auth_load(&env, &auth);
    if (st != KVP_OK)
        return st;
    kvp_te_t *te = calloc(1, sizeof(*te));
    if (te == NULL) {
        auth_free(auth);
        return KVP_ERR_NOMEM;
    }
    te->auth = auth;
    if (auth != NULL) /* a proved principal from any host; protected mode lifted */
        protected_mode = false;
    te->protocol = proto;
    te->cma_lease = strcmp(env.shm, "cma") == 0; /* (the table took only its three) */
    te->cma = te->cma_lease || strcmp(env.shm, "cma-checked") == 0;
    te_init_state(te, &env, protected_mode);
    te->tp_cfg = (kvp_te_tp_cfg_t){.dial = te_dial_peer,
                                   .dial_arg = te,
                                   .lease = te->cma_lease,
                                   .copy_threads = env.copy_threads};
    te->xfer.own_cfg = &te->tp_cfg;
    /* rdma: KVPOOL_RDMA_DEVICE, _HOST; 1 MiB work requests; peers' offers through us */
    snprintf(te->xfer.rdma_devices, sizeof(te->xfer.rdma_devices), "%s",
             env.rdma_device ? env.rdma_device : "");
    snprintf(te->xfer.rdma_host, sizeof(te->xfer.rdma_host), "%s",
             env.rdma_host ? env.rdma_host : "");
    te->xfer.rdma_slice = 1 << 20;
    te->xfer.rdma_offer = te_rdma_offer;
    te->xfer.rdma_offer_arg = te;
    te_transports(te, proto);
    st = kvp_transfer_init(&te->xfer);
    if (st != KVP_OK)
        goto err_free_te;
    st = te_rdma_start(te, proto);
    if (st != KVP_OK)
        goto err_cleanup_xfer;
    st = te_listen(te, host, port, protected_mode);
    if (st != KVP_OK)
        goto err_cleanup_xfer;
    te_announce(te);
    *te_p = te;
    return KVP_OK;

err_cleanup_xfer:
    kvp_transfer_cleanup(&te->xfer);
err_free_te:
    auth_free(te->auth);
    free(te);
    return st;
}

kvp_status_t kvp_te_create(const char *local_hostname, const char *metadata, const char *protocol,
                           kvp_te_t **te_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(te_create(local_hostname, metadata, protocol, te_p),
                                       "transfer engine create");
}

void kvp_te_destroy(kvp_te_t *te)
{
    if (te == NULL)
        return;
    kvp_te_registry_remove(te); /* its counts kept in the client's metrics */
    pthread_mutex_lock(&te->q_lock);
    te->stop = true;
    pthread_cond_broadcast(&te->q_cond);
    pthread_mutex_unlock(&te->q_lock);
    if (te->worker_on)
        pthread_join(te->worker, NULL);
    /* leased peers: nothing is registered any more, and no lease is granted from now on */
    pthread_rwlock_wrlock(&te->lock);
    te->closing = true;
    kvp_te_lease_host_t *lease = atomic_load(&te->lease);
    uint64_t g = lease_publish_locked(te); /* the empty list */
    pthread_rwlock_unlock(&te->lock);
    if (g != 0)
        kvp_te_lease_host_wait(lease, g);
    kvp_data_server_destroy(te->srv); /* ends every connection first */
    for (size_t i = 0; i < te->n_peers; i++)
        kvp_peer_unref(te->peers[i].peer); /* the last reference: its transports let go */
    kvp_te_lease_host_destroy(lease);      /* after the connections that held its slots */
    kvp_transfer_cleanup(&te->xfer);       /* its rdma serving and regions too */
    for (te_batch_t *lists[2] = {te->queue, te->done}, **l = lists; l < lists + 2; l++)
        for (te_batch_t *b = *l, *next; b != NULL; b = next) {
            next = b->next;
            free(b);
        }
    for (size_t i = 0; i < te->n_regions; i++)
        free(te->region_pin[i]); /* no request in flight: the server is gone */
    free(te->regions);
    free(te->region_dev);
    free(te->region_pin);
    kvp_te_cuda_free(te->cuda);
    auth_free(te->auth);
    pthread_rwlock_destroy(&te->lock);
    pthread_mutex_destroy(&te->peers_lock);
    for (te_notify_t *nt = te->notify_head, *next; nt != NULL; nt = next) {
        next = nt->next;
        free(nt);
    }
    pthread_mutex_destroy(&te->notify_lock);
    pthread_mutex_destroy(&te->q_lock);
    pthread_cond_destroy(&te->q_cond);
    pthread_mutex_destroy(&te->reg_lock);
    pthread_mutex_destroy(&te->pin_lock);
    pthread_cond_destroy(&te->pin_cond);
    free(te);
}

uint16_t kvp_te_rpc_port(const kvp_te_t *te)
{
    return te->port;
}

const char *kvp_te_rdma_where(kvp_te_t *te)
{
    return te->rdma != NULL ? kvp_rdma_regions_where(te->rdma) : NULL;
}

/* ---- registration ---- */

/* Would [a, a + len) overlap a registered region? (reg_lock held: the regions do not change) */
static bool overlaps_reg_locked(const kvp_te_t *te, uintptr_t a, size_t len, size_t *at_p)
{
    size_t i = 0;
    while (i < te->n_regions && te->regions[i].addr < a)
        i++;
    *at_p = i;
    return (i > 0 && te->regions[i - 1].addr + te->regions[i - 1].len > a) ||
           (i < te->n_regions && te->regions[i].addr < a + len);
}

kvp_status_t kvp_te_register(kvp_te_t *te, void *addr, size_t len)
{
    uintptr_t a = (uintptr_t)addr;
    if (addr == NULL || len == 0 || a + len < a)
        return KVP_ERR_INVALID_ARG;
    const kvp_mem_region_t *region;
    /* device memory: served through pinned staging (te_cuda.c) */
    bool dev = kvp_transfer_mem_find(&te->xfer, addr, len, &region) == KVP_MEM_CUDA;
    pthread_mutex_lock(&te->reg_lock);
    size_t i;
    kvp_status_t st = KVP_OK;
    te_pin_t *pin = NULL;
    if (overlaps_reg_locked(te, a, len, &i))
        st = KVP_ERR_INVALID_ARG;
    else if ((pin = calloc(1, sizeof(*pin))) == NULL)
        st = KVP_ERR_NOMEM;
    /* room for it first (registrations are one at a time: it stays) */
    if (st == KVP_OK) {
        pthread_rwlock_wrlock(&te->lock);
        if (dev && te->cuda == NULL && kvp_te_cuda_new(&te->cuda) != KVP_OK)
            st = KVP_ERR_NOMEM;
        else if (te->n_regions == te->cap_regions) {
            size_t cap = te->cap_regions ? te->cap_regions * 2 : 16;
            te_region_t *r = realloc(te->regions, cap * sizeof(*r));
            if (r != NULL)
                te->regions = r;
            bool *d = r == NULL ? NULL : realloc(te->region_dev, cap * sizeof(*d));
            if (d != NULL)
                te->region_dev = d;
            te_pin_t **pp = d == NULL ? NULL : realloc(te->region_pin, cap * sizeof(*pp));
            if (pp == NULL)
                st = KVP_ERR_NOMEM;
            else {
                te->region_pin = pp;
                te->cap_regions = cap;
            }
        }
        pthread_rwlock_unlock(&te->lock);
    }
    /* rdma: the range is a memory region of its own (its rkey opens it and nothing else),
     * its pages pinned here, before the write lock: transfers go on meanwhile; nothing can
     * fail after it */
    /* (no GPUDirect RDMA: device memory is no memory region, a peer's batch that touches it
     * goes over tcp, staged) */
    if (st == KVP_OK && te->rdma != NULL && !dev) {
        st = kvp_rdma_regions_add(te->rdma, addr, len);
        /* and the transfer engine knows the range as rdma's (its ops from it zero-copy: the
         * rdma transport's mem_reg finds the region, it makes none) */
        if (st == KVP_OK && (st = kvp_transfer_register_buffer(&te->xfer, addr, len)) != KVP_OK)
            kvp_rdma_regions_remove(te->rdma, addr);
    }
    if (st == KVP_OK) {
        pthread_rwlock_wrlock(&te->lock);
        size_t tail = te->n_regions - i;
        memmove(&te->regions[i + 1], &te->regions[i], tail * sizeof(te_region_t));
        memmove(&te->region_dev[i + 1], &te->region_dev[i], tail * sizeof(bool));
        memmove(&te->region_pin[i + 1], &te->region_pin[i], tail * sizeof(te_pin_t *));
        te->regions[i] = (te_region_t){.addr = a, .len = len};
        te->region_dev[i] = dev;
        te->region_pin[i] = pin;
        pin = NULL;
        te->n_regions++;
        if (dev)
            kvp_te_cuda_registered(te->cuda);
        lease_publish_locked(te); /* leased peers may write there from their next batch */
        pthread_rwlock_unlock(&te->lock);
    }
    pthread_mutex_unlock(&te->reg_lock);
    free(pin);
    return st;
}

kvp_status_t kvp_te_unregister(kvp_te_t *te, void *addr)
{
    pthread_mutex_lock(&te->reg_lock);
    size_t i = 0;
    while (i < te->n_regions && te->regions[i].addr != (uintptr_t)addr)
        i++;
    if (i == te->n_regions) {
        pthread_mutex_unlock(&te->reg_lock);
        return KVP_ERR_NOT_FOUND;
    }
    if (te->rdma != NULL && !te->region_dev[i]) {
        kvp_transfer_unregister_buffer(&te->xfer, addr); /* no new batch takes it zero-copy */
        kvp_rdma_regions_remove(te->rdma, addr);         /* the NIC refuses the range from now on */
    }
    pthread_rwlock_wrlock(&te->lock);
    te_pin_t *pin = te->region_pin[i];
    kvp_te_cuda_unregistered(te->cuda, &te->xfer, te->regions[i].addr, te->regions[i].len);
    size_t tail = te->n_regions - i - 1;
    memmove(&te->regions[i], &te->regions[i + 1], tail * sizeof(te_region_t));
    memmove(&te->region_dev[i], &te->region_dev[i + 1], tail * sizeof(bool));
    memmove(&te->region_pin[i], &te->region_pin[i + 1], tail * sizeof(te_pin_t *));
    te->n_regions--;
    uint64_t g = lease_publish_locked(te);
    pthread_rwlock_unlock(&te->lock);
    pthread_mutex_unlock(&te->reg_lock);
    /* no request takes the region from now on; those moving bytes in it still may: the
     * range is the caller's again once they are done (a stalled peer's until its frame's
     * deadline), and a leased peer copying under the regions of before */
    atomic_fetch_add(&te->pin_waiters, 1);
    pthread_mutex_lock(&te->pin_lock);
    while (atomic_load(&pin->n) > 0)
        pthread_cond_wait(&te->pin_cond, &te->pin_lock);
    pthread_mutex_unlock(&te->pin_lock);
    atomic_fetch_sub(&te->pin_waiters, 1);
    free(pin);
    if (g != 0)
        kvp_te_lease_host_wait(atomic_load(&te->lease), g);
    return KVP_OK;
}

kvp_status_t kvp_te_register_batch(kvp_te_t *te, void *const *addrs, const size_t *lens, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvp_status_t st = kvp_te_register(te, addrs[i], lens[i]);
        if (st != KVP_OK)
            return st;
    }
    return KVP_OK;
}

kvp_status_t kvp_te_unregister_batch(kvp_te_t *te, void *const *addrs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvp_status_t st = kvp_te_unregister(te, addrs[i]);
        if (st != KVP_OK)
            return st;
    }
    return KVP_OK;
}

uintptr_t kvp_te_first_buffer(kvp_te_t *te)
{
    pthread_rwlock_rdlock(&te->lock);
    uintptr_t a = te->n_regions > 0 ? te->regions[0].addr : 0;
    pthread_rwlock_unlock(&te->lock);
    return a;
}

/* ---- transfers ---- */

/* Does host name this host (shm may reach it)? Loopback, or the address our routes send
 * from toward it. */
static bool host_is_local(const char *host)
{
    if (kvp_host_is_loopback(host))
        return true;
    char src[64];
    return kvp_sock_route_addr(host, 1, src, sizeof(src)) == KVP_OK && strcmp(src, host) == 0;
}

/* The peer for target ("host:port"), made at its first transfer and kept. */
static kvp_status_t peer_get(kvp_te_t *te, const char *target, te_peer_t **peer_p)
{
    pthread_mutex_lock(&te->peers_lock);
    for (size_t i = 0; i < te->n_peers; i++)
        if (strcmp(te->peers[i].target, target) == 0) {
            *peer_p = &te->peers[i];
            pthread_mutex_unlock(&te->peers_lock);
            return KVP_OK;
        }
    char host[256];
    uint16_t port;
    kvp_status_t st = kvp_parse_hostport(target, host, sizeof(host), &port);
    if (st != KVP_OK || port == 0 || strlen(target) >= sizeof(te->peers[0].target))
        st = KVP_ERR_INVALID_ARG;
    bool shm = false;
    char src[64];
    if (st == KVP_OK && kvp_sock_route_addr(host, port, src, sizeof(src)) == KVP_ERR_INVALID_ARG) {
        KVP_LOG_WARN_LIMITED("transfer engine: %s: its host does not resolve", target);
        st = KVP_ERR_CONNECT; /* Mooncake's openSegment fails here too, before any transfer */
    }
    if (st == KVP_OK && te->protocol != KVP_TRANSPORT_TCP) {
        shm = host_is_local(host);
        if (!shm && te->protocol == KVP_TRANSPORT_SHM) {
            KVP_LOG_ERROR("transfer engine: protocol shm, and %s is not this host", target);
            st = KVP_ERR_TRANSPORT;
        }
    }
    /* rdma (the transport takes tcp endpoints where this host has a device): every peer
     * with protocol rdma, a peer of another host with auto (this host's have shm); one that
     * offers none moves to tcp at its first batch */
    if (te->protocol == KVP_TRANSPORT_RDMA)
        shm = false;
    if (st == KVP_OK && te->n_peers == TE_PEERS_MAX)
        st = KVP_ERR_TOO_MANY;
    kvp_peer_t *peer = NULL;
    if (st == KVP_OK && (peer = kvp_peer_create(KVP_TE_SEGMENT_ID)) == NULL)
        st = KVP_ERR_NOMEM;
    if (st == KVP_OK) {
        peer->size = UINT64_MAX;
        if (shm)
            snprintf(peer->endpoint, sizeof(peer->endpoint), "@kvpool-te-%u", port);
        else
            snprintf(peer->endpoint, sizeof(peer->endpoint), "%s", target);
        snprintf(peer->name, sizeof(peer->name), "%s", target);
        if (te->auth != NULL) {
            peer->hello = te_auth_prove;
            peer->hello_arg = te;
        }
        kvp_transfer_attach(&te->xfer, peer);
        te_peer_t *tp = &te->peers[te->n_peers++];
        snprintf(tp->target, sizeof(tp->target), "%s", target);
        tp->shm = shm;
        tp->peer = peer;
        tp->gen =
            te->auth != NULL && te->auth->acl_path[0] != '\0' ? atomic_load(&te->auth->acl_gen) : 0;
        *peer_p = tp;
    }
    pthread_mutex_unlock(&te->peers_lock);
    return st;
}

/* tp's peer for a batch, with a reference of the caller's (kvp_peer_unref after). With
 * KVPOOL_TE_ACL: once our ACL changed since its connections proved their target (a
 * principal we took may be one we no longer take), a fresh peer first: its connections
 * prove the target again under the ACL as it is now, and the old one's close with their
 * last batch (its rdma queue pair is dropped too). */
static kvp_peer_t *peer_take(kvp_te_t *te, te_peer_t *tp)
{
    bool acl = te->auth != NULL && te->auth->acl_path[0] != '\0';
    if (acl)
        acl_check(te);
    uint64_t g = acl ? atomic_load(&te->auth->acl_gen) : 0;
    pthread_mutex_lock(&te->peers_lock);
    kvp_peer_t *old = NULL;
    if (g != tp->gen) {
        kvp_peer_t *fresh = kvp_peer_create(KVP_TE_SEGMENT_ID);
        if (fresh != NULL) {
            fresh->size = tp->peer->size;
            memcpy(fresh->endpoint, tp->peer->endpoint, sizeof(fresh->endpoint));
            memcpy(fresh->name, tp->peer->name, sizeof(fresh->name));
            fresh->hello = tp->peer->hello;
            fresh->hello_arg = tp->peer->hello_arg;
            fresh->conn_epoch = tp->peer->conn_epoch + 1; /* not the old one's connections */
            kvp_transfer_attach(&te->xfer, fresh);
            old = tp->peer;
            tp->peer = fresh; /* (its rdma queue pair, if any, is its own: a new one) */
            tp->gen = g;
        } /* (no memory: the old one once more, asked again at the next batch) */
    }
    kvp_peer_t *p = tp->peer;
    kvp_peer_ref(p);
    pthread_mutex_unlock(&te->peers_lock);
    if (old != NULL)
        kvp_peer_unref(old);
    return p;
}

/* A connection of our own to tp (its endpoint: tcp, or "@NAME" a Unix socket whose owner
 * must be of our uid or root; *pid_p its pid there, else 0), timeouts set, our principal
 * proved (credentials on). */
static kvp_status_t te_connect(kvp_te_t *te, const kvp_peer_t *peer, int *fd_p, int *pid_p)
{
    const char *ep = peer->endpoint;
    uint32_t timeout = te->xfer.timeout_ms;
    int fd = -1;
    kvp_status_t st;
    *pid_p = 0;
    if (ep[0] == '@') {
        uint32_t uid;
        st = kvp_unix_connect(ep + 1, timeout, &fd);
        if (st == KVP_OK && (!kvp_unix_peer(fd, pid_p, &uid) || (uid != 0 && uid != getuid())))
            st = KVP_ERR_DENIED;
    } else {
        char host[256];
        uint16_t port;
        st = kvp_parse_hostport(ep, host, sizeof(host), &port);
        if (st == KVP_OK && (st = kvp_tcp_connect(host, port, timeout, &fd)) == KVP_OK)
            kvp_sock_data_congestion(fd);
    }
    if (st == KVP_OK) {
        kvp_sock_set_timeout(fd, timeout);
        if (te->auth != NULL)
            st = te_auth_prove(te, fd, timeout);
    }
    if (st != KVP_OK && fd >= 0)
        close(fd);
    else if (st == KVP_OK)
        *fd_p = fd;
    return st;
}

/* The one-copy shm transport's dial (te_shm.h). */
static kvp_status_t te_dial_peer(void *arg, const kvp_peer_t *peer, int *fd_p, int *pid_p)
{
    return te_connect(arg, peer, fd_p, pid_p);
}

kvp_status_t kvp_te_transfer(kvp_te_t *te, const char *target, int opcode, size_t n,
                             void *const *locals, const uint64_t *remotes, const uint64_t *lens)
{
    if (target == NULL || (opcode != KVP_TE_READ && opcode != KVP_TE_WRITE) ||
        (n > 0 && (locals == NULL || remotes == NULL || lens == NULL)))
        return KVP_ERR_INVALID_ARG;
    for (size_t i = 0; i < n; i++)
        if (lens[i] == 0 || remotes[i] + lens[i] < remotes[i])
            return KVP_ERR_INVALID_ARG;
    te_peer_t *tp;
    kvp_status_t st = peer_get(te, target, &tp);
    if (st != KVP_OK) {
        atomic_fetch_add_explicit(&te->failures, n, memory_order_relaxed);
        return st;
    }
    kvp_peer_t *peer = peer_take(te, tp);
    /* the peer's transport (chosen at its first use: rdma, the one-copy shm path, else tcp;
     * a peer rdma or the shm path can no longer carry moves to tcp, its ops retried there) */
    kvp_xfer_op_t ops[TE_CHUNK];
    kvp_status_t first = KVP_OK;
    for (size_t base = 0; base < n; base += TE_CHUNK) {
        size_t m = n - base < TE_CHUNK ? n - base : TE_CHUNK;
        uint64_t bytes = 0, failed = 0;
        for (size_t i = 0; i < m; i++)
            ops[i] = (kvp_xfer_op_t){
                .kind = opcode == KVP_TE_WRITE ? KVP_XFER_WRITE : KVP_XFER_READ,
                .local = locals[base + i],
                .offset = remotes[base + i],
                .length = lens[base + i],
                .peer = peer,
            };
        kvp_transfer_run(&te->xfer, ops, m);
        for (size_t i = 0; i < m; i++) {
            if (ops[i].status == KVP_OK)
                bytes += ops[i].length;
            else {
                failed++;
                if (first == KVP_OK)
                    first = ops[i].status;
            }
        }
        atomic_fetch_add_explicit(&te->transfers[opcode], m - failed, memory_order_relaxed);
        atomic_fetch_add_explicit(&te->bytes[opcode], bytes, memory_order_relaxed);
        atomic_fetch_add_explicit(&te->failures, failed, memory_order_relaxed);
        atomic_fetch_add_explicit(&tp->transfers, m - failed, memory_order_relaxed);
        atomic_fetch_add_explicit(&tp->bytes, bytes, memory_order_relaxed);
        atomic_fetch_add_explicit(&tp->failures, failed, memory_order_relaxed);
    }
    kvp_peer_unref(peer);
    return first;
}

/* ---- async batches: one worker thread per engine, started at the first submit ---- */

/*
 * Mooncake's `_on_cuda` transfers (transfer_engine_py.cpp, batchTransferOnCuda) enqueue a
 * host function on the caller's CUDA stream (cudaLaunchHostFunc) that runs the transfer
 * once the work before it on the stream is done, return at once, and _exit(1) the process
 * when the transfer fails. Here the call waits for the caller's stream
 * (cuStreamSynchronize: the data the stream's kernels produced is there, and nothing on it
 * still reads a READ's destination), then moves the ranges as kvp_te_transfer does and
 * returns its status: the bytes have moved when it returns, and a failure is an error code,
 * not the end of the process. A host function may make no CUDA call, and staging device
 * memory needs them; a blocking call is what a host function would do to the stream anyway.
 * Device memory among the ranges is staged by the transfer engine (staging.c), host memory
 * moves as in kvp_te_transfer (Mooncake moves whatever address it is given, ordered after
 * the stream).
 */
kvp_status_t kvp_te_transfer_on_cuda(kvp_te_t *te, const char *target, int opcode, size_t n,
                                     void *const *locals, const uint64_t *remotes,
                                     const uint64_t *lens, uintptr_t stream)
{
    if (te == NULL || target == NULL || (n > 0 && locals == NULL))
        return KVP_ERR_INVALID_ARG;
    if (!kvp_gpu_available())
        return KVP_ERR_TRANSPORT; /* Mooncake: cudaLaunchHostFunc fails, RuntimeError */
    const void *dev = NULL;       /* a device range, for the context when the thread has none */
    for (size_t i = 0; i < n && dev == NULL; i++)
        if (kvp_gpu_is_device_ptr(locals[i]))
            dev = locals[i];
    kvp_status_t st = kvp_gpu_caller_stream_sync(stream, dev);
    if (st != KVP_OK)
        return st;
    return kvp_te_transfer(te, target, opcode, n, locals, remotes, lens);
}

static void *worker_main(void *arg)
{
    kvp_te_t *te = arg;
    pthread_mutex_lock(&te->q_lock);
    for (;;) {
        while (te->queue == NULL && !te->stop)
            pthread_cond_wait(&te->q_cond, &te->q_lock);
        if (te->stop)
            break;
        te_batch_t *b = te->queue;
        pthread_mutex_unlock(&te->q_lock);
        kvp_status_t st =
            kvp_te_transfer(te, b->target, b->opcode, b->n, b->locals, b->remotes, b->lens);
        pthread_mutex_lock(&te->q_lock);
        te->queue = b->next;
        b->status = st == KVP_OK ? 1 : st;
        b->next = te->done;
        te->done = b;
        pthread_cond_broadcast(&te->q_cond);
    }
    pthread_mutex_unlock(&te->q_lock);
    return NULL;
}

kvp_status_t kvp_te_submit(kvp_te_t *te, const char *target, int opcode, size_t n,
                           void *const *locals, const uint64_t *remotes, const uint64_t *lens,
                           uint64_t *id_p)
{
    if (target == NULL || strlen(target) >= sizeof(((te_batch_t *)0)->target) ||
        (n > 0 && (locals == NULL || remotes == NULL || lens == NULL)))
        return KVP_ERR_INVALID_ARG;
    te_peer_t *tp; /* a target that cannot be named fails the submit, as Mooncake's does */
    kvp_status_t st = peer_get(te, target, &tp);
    if (st != KVP_OK)
        return st;
    /* one allocation per async batch: its arrays, copied */
    te_batch_t *b = calloc(1, sizeof(*b) + n * (sizeof(void *) + 2 * sizeof(uint64_t)));
    if (b == NULL)
        return KVP_ERR_NOMEM;
    b->locals = (void **)(b + 1);
    b->remotes = (uint64_t *)(b->locals + n);
    b->lens = b->remotes + n;
    if (n > 0) {
        memcpy(b->locals, locals, n * sizeof(void *));
        memcpy(b->remotes, remotes, n * sizeof(uint64_t));
        memcpy(b->lens, lens, n * sizeof(uint64_t));
    }
    snprintf(b->target, sizeof(b->target), "%s", target);
    b->opcode = opcode;
    b->n = n;
    pthread_mutex_lock(&te->q_lock);
    if (!te->worker_on) {
        if (pthread_create(&te->worker, NULL, worker_main, te) != 0) {
            pthread_mutex_unlock(&te->q_lock);
            free(b);
            return KVP_ERR_SYSTEM;
        }
        te->worker_on = true;
    }
    b->id = te->next_id++;
    te_batch_t **tail = &te->queue;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = b;
    *id_p = b->id;
    pthread_cond_broadcast(&te->q_cond);
    pthread_mutex_unlock(&te->q_lock);
    return KVP_OK;
}

int kvp_te_status(kvp_te_t *te, uint64_t id, uint32_t wait_ms)
{
    uint64_t until = kvp_now_ms() + wait_ms;
    pthread_mutex_lock(&te->q_lock);
    for (;;) {
        for (te_batch_t **p = &te->done; *p != NULL; p = &(*p)->next)
            if ((*p)->id == id) {
                te_batch_t *b = *p;
                int status = b->status;
                *p = b->next;
                pthread_mutex_unlock(&te->q_lock);
                free(b);
                return status;
            }
        bool queued = false;
        for (te_batch_t *b = te->queue; b != NULL; b = b->next)
            queued |= b->id == id;
        if (!queued) {
            pthread_mutex_unlock(&te->q_lock);
            return KVP_ERR_NOT_FOUND;
        }
        uint64_t now = kvp_now_ms();
        if (wait_ms == 0 || now >= until)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (until - now) * 1000000ull;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&te->q_cond, &te->q_lock, &ts);
    }
    pthread_mutex_unlock(&te->q_lock);
    return 0;
}

void kvp_te_get_counters(kvp_te_t *te, kvp_te_counters_t *out)
{
    memset(out, 0, sizeof(*out));
    for (int d = 0; d < 2; d++) {
        out->transfers[d] = atomic_load_explicit(&te->transfers[d], memory_order_relaxed);
        out->bytes[d] = atomic_load_explicit(&te->bytes[d], memory_order_relaxed);
    }
    out->failures = atomic_load_explicit(&te->failures, memory_order_relaxed);
    const kvp_served_stats_t *s = kvp_data_server_stats(te->srv);
    /* the server's dir: 0 a peer's WRITE, 1 its READ */
    out->served[KVP_TE_WRITE] = atomic_load_explicit(&s->dir[0].ops, memory_order_relaxed);
    out->served_bytes[KVP_TE_WRITE] = atomic_load_explicit(&s->dir[0].bytes, memory_order_relaxed);
    out->served[KVP_TE_READ] = atomic_load_explicit(&s->dir[1].ops, memory_order_relaxed);
    out->served_bytes[KVP_TE_READ] = atomic_load_explicit(&s->dir[1].bytes, memory_order_relaxed);
    out->refused_range = atomic_load_explicit(&te->refused_range, memory_order_relaxed);
    if (te->rdma != NULL) { /* a peer's rdma access the NIC refused; a connect with no token */
        out->refused_range +=
            atomic_load_explicit(&te->xfer.serve_access_errors, memory_order_relaxed);
        out->refused_auth += atomic_load_explicit(&te->xfer.serve_refused, memory_order_relaxed);
    }
    out->refused_protected = kvp_data_server_refused(te->srv);
    out->refused_user = atomic_load_explicit(&te->refused_user, memory_order_relaxed);
    out->refused_auth += atomic_load_explicit(&te->refused_auth, memory_order_relaxed);
    out->refused_role = atomic_load_explicit(&te->refused_role, memory_order_relaxed);
    out->refused_tenant = atomic_load_explicit(&te->refused_tenant, memory_order_relaxed);
    out->notifies = atomic_load_explicit(&te->notifies, memory_order_relaxed);
    out->notifies_dropped = atomic_load_explicit(&te->notifies_dropped, memory_order_relaxed);
    uint64_t lease_ops[2] = {0, 0}, lease_bytes[2] = {0, 0};
    kvp_te_lease_host_t *lease = atomic_load(&te->lease);
    if (lease != NULL)
        kvp_te_lease_host_moved(lease, lease_ops, lease_bytes, &out->leases);
    for (int d = 0; d < 2; d++) {
        out->served_lease[d] = lease_ops[d];
        uint64_t ops =
            atomic_load_explicit(&te->cma_served[d], memory_order_relaxed) + lease_ops[d];
        out->served[d] += ops;
        out->served_cma[d] = ops;
        out->served_bytes[d] +=
            atomic_load_explicit(&te->cma_bytes[d], memory_order_relaxed) + lease_bytes[d];
    }
}

size_t kvp_te_peer_stats(kvp_te_t *te, kvp_te_peer_stat_t *out, size_t cap)
{
    pthread_mutex_lock(&te->peers_lock);
    size_t n = te->n_peers;
    for (size_t i = 0; i < n && i < cap; i++) {
        te_peer_t *tp = &te->peers[i];
        kvp_te_peer_stat_t *o = &out[i];
        snprintf(o->target, sizeof(o->target), "%s", tp->target);
        const kvp_transport_t *t = atomic_load(&tp->peer->tp);
        snprintf(o->route, sizeof(o->route), "%s",
                 t != NULL && t->ops == &kvp_transport_rdma_ops      ? "rdma"
                 : !tp->shm                                          ? "tcp"
                 : (t == NULL ? te->cma : t->ops == &kvp_te_shm_ops) ? "shm-cma"
                                                                     : "shm");
        o->transfers = atomic_load_explicit(&tp->transfers, memory_order_relaxed);
        o->bytes = atomic_load_explicit(&tp->bytes, memory_order_relaxed);
        o->failures = atomic_load_explicit(&tp->failures, memory_order_relaxed);
    }
    pthread_mutex_unlock(&te->peers_lock);
    return n;
}

kvp_status_t kvp_te_remote_regions(kvp_te_t *te, const char *target, uint64_t *addrs,
                                   uint64_t *lens, size_t cap, size_t *n_p)
{
    *n_p = 0;
    te_peer_t *tp;
    kvp_status_t st = target != NULL ? peer_get(te, target, &tp) : KVP_ERR_INVALID_ARG;
    if (st != KVP_OK)
        return st;
    int fd = -1, pid;
    kvp_peer_t *peer = peer_take(te, tp);
    st = te_connect(te, peer, &fd, &pid);
    kvp_peer_unref(peer);
    if (st == KVP_OK) {
        kvp_data_resp_t r;
        st = te_ask(fd, KVP_DATA_REGIONS, &r);
        if (st == KVP_OK && (r.length % 16 != 0 || r.length / 16 > KVP_DATA_REGIONS_MAX))
            st = KVP_ERR_PROTOCOL;
        for (uint64_t i = 0; st == KVP_OK && i < r.length / 16; i++) {
            uint64_t pair[2];
            st = kvp_recv_all(fd, pair, sizeof(pair));
            if (st == KVP_OK && i < cap) {
                addrs[i] = pair[0];
                lens[i] = pair[1];
            }
            if (st == KVP_OK)
                *n_p = (size_t)i + 1;
        }
    }
    if (fd >= 0)
        close(fd);
    return st;
}

/* ---- notifies ---- */

kvp_status_t kvp_te_notify(kvp_te_t *te, const char *target, const char *name, size_t name_len,
                           const char *msg, size_t msg_len)
{
    if (target == NULL || (name == NULL && name_len > 0) || (msg == NULL && msg_len > 0) ||
        name_len + msg_len > KVP_DATA_TE_NOTIFY_MAX)
        return KVP_ERR_INVALID_ARG;
    te_peer_t *tp;
    kvp_status_t st = peer_get(te, target, &tp);
    int fd = -1, pid;
    if (st == KVP_OK) {
        kvp_peer_t *peer = peer_take(te, tp);
        st = te_connect(te, peer, &fd, &pid);
        kvp_peer_unref(peer);
    }
    if (st != KVP_OK)
        return st;
    kvp_data_req_t req = {.magic = KVP_DATA_MAGIC,
                          .op = KVP_DATA_TE_NOTIFY,
                          .segment_id = KVP_TE_SEGMENT_ID,
                          .offset = name_len,
                          .length = name_len + msg_len};
    struct iovec iov[3] = {{.iov_base = &req, .iov_len = sizeof(req)},
                           {.iov_base = (void *)name, .iov_len = name_len},
                           {.iov_base = (void *)msg, .iov_len = msg_len}};
    kvp_data_resp_t r;
    st = kvp_data_ask(fd, iov, 3, &r);
    close(fd);
    return st;
}

size_t kvp_te_get_notifies(kvp_te_t *te, kvp_te_notify_fn fn, void *arg)
{
    pthread_mutex_lock(&te->notify_lock);
    te_notify_t *nt = te->notify_head;
    te->notify_head = NULL;
    te->notify_tail = &te->notify_head;
    size_t n = te->n_notifies;
    te->n_notifies = 0;
    pthread_mutex_unlock(&te->notify_lock);
    for (te_notify_t *next; nt != NULL; nt = next) {
        next = nt->next;
        fn(arg, nt->data, nt->name_len, nt->data + nt->name_len, nt->msg_len);
        free(nt);
    }
    return n;
}
