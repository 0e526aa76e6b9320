/*
 * te_rdma.c - the transfer engine's rdma: the target's regions, keys and tokens, and the
 * initiator's transport (te_rdma.h; docs/architecture.md, "Transfer engine").
 *
 * Target: every registered range is a memory region of its own (remote READ+WRITE over that
 * range only), so its rkey opens nothing else; the table of (addr, len, rkey) is handed to
 * admitted peers (TE_RDMA over the engine's tcp connection, wire.h) with a one-time token,
 * and the accept thread lets a queue pair in only for a token it handed out (at most
 * TOKENS_MAX outstanding, each good for KVP_DATA_TE_RDMA_TOKEN_MS). Deregistering a range
 * deregisters its region: the NIC refuses any later access to it (a remote access error at
 * the initiator).
 *
 * Initiator (kvp_te_rdma_ops, a transport of the engine's transfer engine): one RC queue pair
 * per target, connected at its first batch; each batch checks every range against the
 * advertised table (asking it again once on a miss; a range still not in it is handed on to
 * the next transport, op->pass), takes each local buffer's lkey (a range the engine
 * registered, or a staging buffer: a local-only region of mem_reg's), cuts the
 * ranges into work requests of at most SLICE bytes and posts them in chains of up to
 * KVP_RDMA_MAX_CHAIN with one doorbell, only each chain's last signaled, while the send
 * queue has room; a completion thread (started at the first batch) takes the device's
 * completions and hands each to the batch of its queue pair, which waits for its own. Nothing is
 * allocated per batch (chain records and statuses live on the stack, TE_RDMA_CHUNK ranges at
 * a time). A batch with no completion for the engine's timeout flushes its queue pair and
 * fails what is left with KVP_ERR_TIMEOUT; a queue pair that saw an error is replaced at the
 * next batch.
 *
 * Thread: a peer's batches one at a time, under its lock (its queue pair, its table and the
 * hello that asks for them: a peer that does not answer holds up its own batches only, for
 * the engine's timeout at most); the batches in flight, their chain records and statuses,
 * and the posting under xfer_lock, which a batch lets go of while it waits for its
 * completions (so a peer whose completions stop holds up its own batch only; peer lock
 * before xfer_lock); the region table under mr_lock, held only to look it up or change it
 * (a batch pins its local regions by count; a deregistration waits for its own region's
 * pins alone); tokens and accepted queue pairs under acc_lock.
 */
#include "client/te/te_rdma.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "client/include/kvpool_te.h"
#include "client/segment/conn_server.h"
#include "client/te/te_tp.h"
#include "client/transfer/engine.h"
#include "client/transfer/peer.h"
#include "client/transfer/xfer.h"
#include "client/transport/rdma_status.h"
#include "client/transport/rdma_verbs.h"
#include "client/transport/wire.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sock.h"

#define TE_RDMA_MAGIC 0x5450564Bu /* "KVPT" */
#define TE_RDMA_VERSION 1u
#define TOKENS_MAX 256
#define ACCEPTED_MAX 1024
#define SLICE (1u << 20) /* bytes per work request */
#define TE_RDMA_CHUNK 256
#define CHAINS_RING 512 /* >= the send queue's depth: chains in flight */
#define QP_DEPTH 256
#define FLUSH_WAIT_MS 5000

typedef struct conn_pdata {
    uint32_t magic, version;
    uint8_t token[16];
} conn_pdata_t;

typedef struct token {
    uint8_t token[16];
    uint64_t expiry_ms; /* 0: free */
} token_t;

typedef struct accepted {
    kvp_rdma_qp_t *qp;
    struct accepted *next;
} accepted_t;

struct te_rdma {
    kvp_rdma_dev_t *dev;
    uint32_t timeout_ms;
    char ipv4[16];
    uint16_t port;
    char where[96];
    kvp_rdma_listener_t *lst;
    pthread_t acc_thread;
    atomic_bool stop;
    /* the regions: wire entries (rkeys) and their memory regions, sorted by addr, disjoint */
    pthread_rwlock_t mr_lock;
    /* a deregistration waiting for its region's pins (pin_waiters: how many) */
    pthread_mutex_t pin_lock;
    pthread_cond_t pin_cond;
    atomic_uint pin_waiters;
    kvp_data_te_rdma_region_t *ents;
    struct mr_rec **mrs;
    size_t n, cap;
    /* local-only regions (the transfer engine's staging buffers: mem_reg), sorted, disjoint:
     * never advertised, their rkeys open nothing (no remote access) */
    struct loc_mr *loc;
    size_t n_loc, cap_loc;
    /* tokens handed out and the queue pairs they let in */
    pthread_mutex_t acc_lock;
    token_t tokens[TOKENS_MAX];
    accepted_t *accepted;
    size_t n_accepted;
    _Atomic uint64_t access_errors, refused_connects;
    /* called by the accept thread at each turn (at least every 200 ms); NULL: none */
    te_rdma_tick_fn tick;
    void *tick_arg;
    /* the batches in flight (one per peer at most) and the completion thread that takes
     * the device's completions and hands each to its batch: all under xfer_lock */
    pthread_mutex_t xfer_lock;
    pthread_cond_t cq_cond; /* a batch's chains came back */
    struct te_batch *batches;
    bool cq_started;
    pthread_t cq_thread;
    uint64_t chain_seq;
};

/* A batch in flight on one queue pair (chunk_run's, on its stack): what the completion
 * thread updates as its chains come back (under xfer_lock). */
typedef struct te_batch {
    kvp_rdma_qp_t *qp;
    struct chain_rec *ring;
    kvp_status_t *st;
    unsigned out;            /* chains in flight */
    uint64_t progress;       /* completions taken */
    kvp_status_t flushed_as; /* a flushed completion's status (KVP_OK: as the device says) */
    struct te_batch *next;
} te_batch_t;

struct te_rdma_peer {
    pthread_mutex_t lock;           /* its batches and hellos, one at a time; all below */
    kvp_rdma_qp_t *qp;              /* NULL: not connected */
    atomic_bool no_rdma;            /* the target offers none (read without the lock) */
    bool leaked;                    /* a flush never came back: the QP is left alone */
    kvp_data_te_rdma_region_t *tab; /* what the target advertised, sorted */
    size_t n_tab;
};

/* A memory region and the batches using it as their local side: pinned by count while their
 * work requests may be on the NIC, so a deregistration (of this region alone) waits for
 * them, and no lock is held across a batch. */
typedef struct mr_rec {
    kvp_rdma_mr_t *mr;
    atomic_uint pins;
} mr_rec_t;

typedef struct loc_mr {
    uintptr_t addr;
    size_t len;
    mr_rec_t *rec;
} loc_mr_t;

typedef struct chain_rec {
    uint64_t seq;
    uint32_t first, last; /* ranges of the chunk it carries */
    bool live;
} chain_rec_t;

bool te_rdma_present(void)
{
    return kvp_rdma_devices_present();
}

/* ---- target: the accept gate ---- */

static int accept_check(void *arg, const void *pdata, size_t len)
{
    te_rdma_t *r = arg;
    conn_pdata_t cp;
    if (pdata == NULL || len < sizeof(cp)) {
        atomic_fetch_add_explicit(&r->refused_connects, 1, memory_order_relaxed);
        return -1;
    }
    memcpy(&cp, pdata, sizeof(cp));
    if (cp.magic != TE_RDMA_MAGIC || cp.version != TE_RDMA_VERSION) {
        atomic_fetch_add_explicit(&r->refused_connects, 1, memory_order_relaxed);
        return -1;
    }
    uint64_t now = kvp_now_ms();
    int ok = -1;
    pthread_mutex_lock(&r->acc_lock);
    for (size_t i = 0; i < TOKENS_MAX && ok != 0; i++) {
        token_t *t = &r->tokens[i];
        if (t->expiry_ms != 0 && now < t->expiry_ms &&
            CRYPTO_memcmp(t->token, cp.token, sizeof(cp.token)) == 0) {
            t->expiry_ms = 0; /* once */
            ok = r->n_accepted < ACCEPTED_MAX ? 0 : -1;
        }
    }
    pthread_mutex_unlock(&r->acc_lock);
    if (ok != 0) {
        atomic_fetch_add_explicit(&r->refused_connects, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("transfer engine: an rdma connect with no valid token (or %d queue "
                             "pairs held); refused",
                             ACCEPTED_MAX);
    }
    return ok;
}

static void reap_accepted(te_rdma_t *r)
{
    pthread_mutex_lock(&r->acc_lock);
    for (accepted_t **pp = &r->accepted; *pp != NULL;) {
        accepted_t *a = *pp;
        if (kvp_rdma_qp_in_error(a->qp)) {
            *pp = a->next;
            kvp_rdma_qp_destroy(a->qp);
            free(a);
            r->n_accepted--;
        } else
            pp = &a->next;
    }
    pthread_mutex_unlock(&r->acc_lock);
}

void te_rdma_cut_peers(te_rdma_t *r)
{
    size_t cut = 0;
    pthread_mutex_lock(&r->acc_lock);
    for (size_t i = 0; i < TOKENS_MAX; i++)
        r->tokens[i].expiry_ms = 0;
    for (accepted_t *a = r->accepted; a != NULL; a = a->next)
        if (!kvp_rdma_qp_in_error(a->qp)) {
            (void)kvp_rdma_qp_flush(a->qp); /* the error state: no access through it */
            cut++;
        }
    pthread_mutex_unlock(&r->acc_lock);
    if (cut > 0)
        KVP_LOG_WARN("transfer engine: %zu rdma queue pair(s) of peers cut off (KVPOOL_TE_ACL "
                     "took a role away): each peer connects again through the new roles",
                     cut);
}

static void *accept_main(void *arg)
{
    te_rdma_t *r = arg;
    while (!atomic_load(&r->stop)) {
        if (r->tick != NULL)
            r->tick(r->tick_arg);
        reap_accepted(r);
        int bad = kvp_rdma_dev_access_errors(r->dev);
        if (bad > 0) {
            atomic_fetch_add_explicit(&r->access_errors, (uint64_t)bad, memory_order_relaxed);
            KVP_LOG_WARN_LIMITED("transfer engine: %d remote access error(s) on our rdma queue "
                                 "pairs (a peer named memory not registered here)",
                                 bad);
        }
        kvp_rdma_qp_t *qp;
        int rc = kvp_rdma_accept(r->lst, 200, NULL, 0, accept_check, r, &qp);
        if (rc == -ETIMEDOUT || rc == -EACCES)
            continue;
        if (rc != 0) {
            KVP_LOG_WARN_LIMITED("transfer engine: rdma accept: %s", kvp_rdma_last_error());
            continue;
        }
        accepted_t *a = malloc(sizeof(*a));
        if (a == NULL) {
            kvp_rdma_qp_destroy(qp);
            continue;
        }
        a->qp = qp;
        pthread_mutex_lock(&r->acc_lock);
        a->next = r->accepted;
        r->accepted = a;
        r->n_accepted++;
        pthread_mutex_unlock(&r->acc_lock);
    }
    return NULL;
}

kvp_status_t te_rdma_open(uint32_t timeout_ms, const char *devs, const char *host,
                          te_rdma_tick_fn tick, void *tick_arg, te_rdma_t **r_p)
{
    *r_p = NULL;
    te_rdma_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return KVP_ERR_NOMEM;
    r->timeout_ms = timeout_ms;
    r->tick = tick;
    r->tick_arg = tick_arg;
    kvp_rdma_dev_params_t dp = {
        .device_names = devs, .ipv4 = host, .cq_depth = 8192, .qp_depth = QP_DEPTH};
    if (kvp_rdma_dev_open(&dp, &r->dev) != 0) {
        KVP_LOG_ERROR("transfer engine: no rdma device: %s", kvp_rdma_last_error());
        free(r);
        return KVP_ERR_TRANSPORT;
    }
    if (dp.ipv4 != NULL)
        snprintf(r->ipv4, sizeof(r->ipv4), "%s", dp.ipv4);
    else if (kvp_rdma_dev_ipv4(r->dev, r->ipv4, sizeof(r->ipv4)) != 0) {
        KVP_LOG_ERROR("transfer engine: rdma device %s has no IPv4 address to serve on (%s); "
                      "set KVPOOL_RDMA_HOST",
                      kvp_rdma_dev_info(r->dev)->name, kvp_rdma_last_error());
        kvp_rdma_dev_close(r->dev);
        free(r);
        return KVP_ERR_TRANSPORT;
    }
    if (kvp_rdma_listen(r->dev, r->ipv4, 0, 128, &r->lst, &r->port) != 0) {
        KVP_LOG_ERROR("transfer engine: rdma listen on %s: %s", r->ipv4, kvp_rdma_last_error());
        kvp_rdma_dev_close(r->dev);
        free(r);
        return KVP_ERR_TRANSPORT;
    }
    pthread_rwlock_init(&r->mr_lock, NULL);
    pthread_mutex_init(&r->pin_lock, NULL);
    pthread_cond_init(&r->pin_cond, NULL);
    pthread_mutex_init(&r->acc_lock, NULL);
    pthread_mutex_init(&r->xfer_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* batch_wait's clock */
    pthread_cond_init(&r->cq_cond, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(r->where, sizeof(r->where), "%s %s:%u", kvp_rdma_dev_info(r->dev)->name, r->ipv4,
             r->port);
    if (pthread_create(&r->acc_thread, NULL, accept_main, r) != 0) {
        kvp_rdma_listener_destroy(r->lst);
        kvp_rdma_dev_close(r->dev);
        pthread_rwlock_destroy(&r->mr_lock);
        pthread_mutex_destroy(&r->pin_lock);
        pthread_cond_destroy(&r->pin_cond);
        pthread_mutex_destroy(&r->acc_lock);
        pthread_mutex_destroy(&r->xfer_lock);
        pthread_cond_destroy(&r->cq_cond);
        free(r);
        return KVP_ERR_SYSTEM;
    }
    *r_p = r;
    return KVP_OK;
}

const char *te_rdma_where(const te_rdma_t *r)
{
    return r->where;
}

/* Peers' queue pairs are gone (te.c freed its peers first). */
void te_rdma_close(te_rdma_t *r)
{
    if (r == NULL)
        return;
    atomic_store(&r->stop, true);
    pthread_join(r->acc_thread, NULL);
    if (r->cq_started)
        pthread_join(r->cq_thread, NULL);
    for (accepted_t *a = r->accepted, *next; a != NULL; a = next) {
        next = a->next;
        kvp_rdma_qp_destroy(a->qp);
        free(a);
    }
    kvp_rdma_listener_destroy(r->lst);
    for (size_t i = 0; i < r->n; i++) {
        kvp_rdma_mr_dereg(r->mrs[i]->mr);
        free(r->mrs[i]);
    }
    for (size_t i = 0; i < r->n_loc; i++) { /* (the transfer engine deregistered its own) */
        kvp_rdma_mr_dereg(r->loc[i].rec->mr);
        free(r->loc[i].rec);
    }
    free(r->ents);
    free(r->mrs);
    free(r->loc);
    kvp_rdma_dev_close(r->dev);
    pthread_rwlock_destroy(&r->mr_lock);
    pthread_mutex_destroy(&r->pin_lock);
    pthread_cond_destroy(&r->pin_cond);
    pthread_mutex_destroy(&r->acc_lock);
    pthread_mutex_destroy(&r->xfer_lock);
    pthread_cond_destroy(&r->cq_cond);
    free(r);
}

uint64_t te_rdma_access_errors(te_rdma_t *r)
{
    return atomic_load_explicit(&r->access_errors, memory_order_relaxed);
}

uint64_t te_rdma_refused_connects(te_rdma_t *r)
{
    return atomic_load_explicit(&r->refused_connects, memory_order_relaxed);
}

/* ---- the region table ---- */

/* A new region's record (NULL: no memory; the region deregistered). */
static mr_rec_t *rec_new(kvp_rdma_mr_t *mr)
{
    mr_rec_t *rec = malloc(sizeof(*rec));
    if (rec == NULL) {
        kvp_rdma_mr_dereg(mr);
        return NULL;
    }
    rec->mr = mr;
    atomic_init(&rec->pins, 0);
    return rec;
}

/* A region taken out of the table: once the batches that pinned it are done (no lock held
 * meanwhile; they end within the engine's timeout), deregistered (the NIC refuses it from
 * then on) and freed. */
static void rec_retire(te_rdma_t *r, mr_rec_t *rec)
{
    if (rec == NULL)
        return;
    atomic_fetch_add(&r->pin_waiters, 1);
    pthread_mutex_lock(&r->pin_lock);
    while (atomic_load(&rec->pins) > 0)
        pthread_cond_wait(&r->pin_cond, &r->pin_lock);
    pthread_mutex_unlock(&r->pin_lock);
    atomic_fetch_sub(&r->pin_waiters, 1);
    kvp_rdma_mr_dereg(rec->mr);
    free(rec);
}

/* A batch's chunk is done with its regions (recs[0, m), NULL ones skipped). */
static void recs_unpin(te_rdma_t *r, mr_rec_t *const *recs, size_t m)
{
    bool last = false;
    for (size_t i = 0; i < m; i++)
        if (recs[i] != NULL && atomic_fetch_sub(&recs[i]->pins, 1) == 1)
            last = true;
    if (last && atomic_load(&r->pin_waiters) > 0) {
        pthread_mutex_lock(&r->pin_lock);
        pthread_cond_broadcast(&r->pin_cond);
        pthread_mutex_unlock(&r->pin_lock);
    }
}

kvp_status_t te_rdma_reg(te_rdma_t *r, void *addr, size_t len)
{
    kvp_rdma_mr_t *mr;
    int rc = kvp_rdma_mr_reg(r->dev, addr, len, true, &mr);
    if (rc != 0) {
        KVP_LOG_ERROR("transfer engine: cannot register [%p, +%zu) with %s: %s", addr, len,
                      kvp_rdma_dev_info(r->dev)->name, kvp_rdma_last_error());
        return rc == -ENOMEM ? KVP_ERR_NOMEM : KVP_ERR_TRANSPORT;
    }
    mr_rec_t *rec = rec_new(mr);
    if (rec == NULL)
        return KVP_ERR_NOMEM;
    uintptr_t a = (uintptr_t)addr;
    kvp_status_t st = KVP_OK;
    pthread_rwlock_wrlock(&r->mr_lock);
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        kvp_data_te_rdma_region_t *e = realloc(r->ents, cap * sizeof(*e));
        if (e != NULL)
            r->ents = e;
        mr_rec_t **m = e != NULL ? realloc(r->mrs, cap * sizeof(*m)) : NULL;
        if (m != NULL) {
            r->mrs = m;
            r->cap = cap;
        } else
            st = KVP_ERR_NOMEM;
    }
    if (st == KVP_OK) {
        size_t i = 0;
        while (i < r->n && r->ents[i].addr < a)
            i++;
        memmove(&r->ents[i + 1], &r->ents[i], (r->n - i) * sizeof(r->ents[0]));
        memmove(&r->mrs[i + 1], &r->mrs[i], (r->n - i) * sizeof(r->mrs[0]));
        r->ents[i] = (kvp_data_te_rdma_region_t){.addr = a, .len = len, .rkey = mr->rkey};
        r->mrs[i] = rec;
        r->n++;
    }
    pthread_rwlock_unlock(&r->mr_lock);
    if (st != KVP_OK)
        rec_retire(r, rec);
    return st;
}

void te_rdma_dereg(te_rdma_t *r, void *addr)
{
    mr_rec_t *rec = NULL;
    pthread_rwlock_wrlock(&r->mr_lock);
    for (size_t i = 0; i < r->n; i++)
        if (r->ents[i].addr == (uintptr_t)addr) {
            rec = r->mrs[i];
            memmove(&r->ents[i], &r->ents[i + 1], (r->n - i - 1) * sizeof(r->ents[0]));
            memmove(&r->mrs[i], &r->mrs[i + 1], (r->n - i - 1) * sizeof(r->mrs[0]));
            r->n--;
            break;
        }
    pthread_rwlock_unlock(&r->mr_lock);
    rec_retire(r, rec); /* the NIC refuses the range from now on */
}

/* The entry of tab[0..n) holding [addr, addr + len) whole, or NULL. */
static const kvp_data_te_rdma_region_t *tab_find(const kvp_data_te_rdma_region_t *tab, size_t n,
                                                 uint64_t addr, uint64_t len)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (tab[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    const kvp_data_te_rdma_region_t *e = &tab[lo - 1];
    return addr - e->addr <= e->len && len <= e->len - (addr - e->addr) ? e : NULL;
}

/* ---- target: TE_RDMA ---- */

bool te_rdma_serve(te_rdma_t *r, int fd)
{
    kvp_data_te_rdma_t info = {.port = r->port};
    memcpy(info.ipv4, r->ipv4, sizeof(info.ipv4));
    if (RAND_bytes(info.token, sizeof(info.token)) != 1)
        return kvp_data_reply(fd, KVP_ERR_SYSTEM, 0) == KVP_OK;
    /* the token: a free (or expired) slot, else the one that expires first */
    uint64_t now = kvp_now_ms();
    pthread_mutex_lock(&r->acc_lock);
    token_t *slot = &r->tokens[0];
    for (size_t i = 0; i < TOKENS_MAX; i++) {
        token_t *t = &r->tokens[i];
        if (t->expiry_ms <= now) {
            slot = t;
            break;
        }
        if (t->expiry_ms < slot->expiry_ms)
            slot = t;
    }
    memcpy(slot->token, info.token, sizeof(info.token));
    slot->expiry_ms = now + KVP_DATA_TE_RDMA_TOKEN_MS;
    pthread_mutex_unlock(&r->acc_lock);
    /* the table copied out under the lock and sent without it: a peer that does not read
     * holds up no registration */
    kvp_data_te_rdma_region_t *copy = NULL;
    pthread_rwlock_rdlock(&r->mr_lock);
    size_t n = r->n < KVP_DATA_REGIONS_MAX ? r->n : KVP_DATA_REGIONS_MAX;
    if (n > 0 && (copy = malloc(n * sizeof(*copy))) != NULL)
        memcpy(copy, r->ents, n * sizeof(*copy));
    pthread_rwlock_unlock(&r->mr_lock);
    if (n > 0 && copy == NULL)
        return kvp_data_reply(fd, KVP_ERR_NOMEM, 0) == KVP_OK;
    info.n = (uint32_t)n;
    kvp_data_resp_t h = {
        .magic = KVP_DATA_MAGIC, .status = 0, .length = sizeof(info) + n * sizeof(copy[0])};
    struct iovec iov[3] = {{.iov_base = &h, .iov_len = sizeof(h)},
                           {.iov_base = &info, .iov_len = sizeof(info)},
                           {.iov_base = copy, .iov_len = n * sizeof(copy[0])}};
    bool ok = kvp_sendv_all(fd, iov, n > 0 ? 3 : 2) == KVP_OK;
    free(copy);
    return ok;
}

/* ---- initiator ---- */

static te_rdma_peer_t *te_rdma_peer_new(void)
{
    te_rdma_peer_t *p = calloc(1, sizeof(te_rdma_peer_t));
    if (p != NULL)
        pthread_mutex_init(&p->lock, NULL);
    return p;
}

static void te_rdma_peer_free(te_rdma_peer_t *p)
{
    if (p == NULL)
        return;
    if (p->qp != NULL && !p->leaked)
        kvp_rdma_qp_destroy(p->qp);
    free(p->tab);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* The transport's context: the device the engine opened, its dial, its place in the list. */
typedef struct te_rdma_tp {
    te_rdma_t *r;
    kvp_te_tp_cfg_t cfg;
    unsigned index;
} te_rdma_tp_t;

/* Ask the target for its table (and a token) on a new admitted connection; connect a queue
 * pair with the token when p has none. KVP_ERR_UNSUPPORTED: the target offers us no rdma
 * (none there, or our principal may not both read and write: keys would open both).
 * p->lock held (not xfer_lock: another peer's batches go on while this one waits for an
 * answer). */
static kvp_status_t peer_hello(te_rdma_tp_t *c, te_rdma_peer_t *p, const kvp_peer_t *peer)
{
    te_rdma_t *r = c->r;
    int fd = -1, pid;
    kvp_status_t st = c->cfg.dial(c->cfg.dial_arg, peer, &fd, &pid);
    if (st != KVP_OK)
        return st;
    kvp_data_req_t req = {
        .magic = KVP_DATA_MAGIC, .op = KVP_DATA_TE_RDMA, .segment_id = KVP_TE_SEGMENT_ID};
    kvp_data_resp_t h;
    kvp_data_te_rdma_t info;
    kvp_data_te_rdma_region_t *tab = NULL;
    st = kvp_send_all(fd, &req, sizeof(req));
    if (st == KVP_OK)
        st = kvp_recv_all(fd, &h, sizeof(h));
    if (st == KVP_OK && h.magic != KVP_DATA_MAGIC)
        st = KVP_ERR_PROTOCOL;
    if (st == KVP_OK && h.status != 0)
        st = kvp_status_from_wire(h.status);
    /* an engine of an older version answers the unknown frame by closing: no rdma there */
    if (st == KVP_ERR_IO || st == KVP_ERR_CONNECT)
        st = KVP_ERR_UNSUPPORTED;
    if (st == KVP_OK &&
        (h.length < sizeof(info) || (h.length - sizeof(info)) % sizeof(tab[0]) != 0 ||
         (h.length - sizeof(info)) / sizeof(tab[0]) > KVP_DATA_REGIONS_MAX))
        st = KVP_ERR_PROTOCOL;
    if (st == KVP_OK)
        st = kvp_recv_all(fd, &info, sizeof(info));
    size_t n = st == KVP_OK ? (size_t)(h.length - sizeof(info)) / sizeof(tab[0]) : 0;
    if (st == KVP_OK && (info.n != n || memchr(info.ipv4, '\0', sizeof(info.ipv4)) == NULL))
        st = KVP_ERR_PROTOCOL;
    if (st == KVP_OK && n > 0 && (tab = malloc(n * sizeof(tab[0]))) == NULL)
        st = KVP_ERR_NOMEM;
    if (st == KVP_OK && n > 0)
        st = kvp_recv_all(fd, tab, n * sizeof(tab[0]));
    for (size_t i = 1; st == KVP_OK && i < n; i++)
        if (tab[i].addr < tab[i - 1].addr + tab[i - 1].len)
            st = KVP_ERR_PROTOCOL; /* not sorted, or overlapping: not a table we search */
    close(fd);
    if (st == KVP_ERR_UNSUPPORTED)
        atomic_store(&p->no_rdma, true);
    if (st != KVP_OK) {
        free(tab);
        return st;
    }
    free(p->tab);
    p->tab = tab;
    p->n_tab = n;
    if (p->qp != NULL)
        return KVP_OK; /* a refresh of the table */
    conn_pdata_t cp = {.magic = TE_RDMA_MAGIC, .version = TE_RDMA_VERSION};
    memcpy(cp.token, info.token, sizeof(cp.token));
    if (kvp_rdma_connect(r->dev, info.ipv4, info.port, (int)r->timeout_ms, &cp, sizeof(cp),
                         &p->qp) != 0) {
        KVP_LOG_WARN_LIMITED("transfer engine: rdma connect to %s:%u: %s", info.ipv4, info.port,
                             kvp_rdma_last_error());
        p->qp = NULL;
        return KVP_ERR_CONNECT;
    }
    p->leaked = false;
    return KVP_OK;
}

/* The local memory region holding [addr, addr + len) whole: a range the engine registered,
 * or one of its transfer engine's staging buffers; NULL: none (mr_lock held). */
static mr_rec_t *local_rec_locked(te_rdma_t *r, const void *addr, uint64_t len)
{
    uintptr_t a = (uintptr_t)addr;
    const kvp_data_te_rdma_region_t *e = tab_find(r->ents, r->n, a, len);
    if (e != NULL)
        return r->mrs[e - r->ents];
    size_t lo = 0, hi = r->n_loc;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->loc[mid].addr <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    const loc_mr_t *l = &r->loc[lo - 1];
    if (a - l->addr > l->len || len > l->len - (a - l->addr))
        return NULL;
    return l->rec;
}

/* The completions wcs[0, n) to their batches (xfer_lock held): each chain's end frees its
 * record, an error marks its ranges (a flushed one as its batch's flushed_as, unless
 * KVP_OK). A completion of a queue pair no batch is on (one that gave up on it) is
 * dropped. */
static void dispatch(te_rdma_t *r, const kvp_rdma_wc_t *wcs, int n)
{
    for (int i = 0; i < n; i++) {
        te_batch_t *b = r->batches;
        while (b != NULL && b->qp != wcs[i].qp)
            b = b->next;
        if (b == NULL)
            continue;
        chain_rec_t *c = &b->ring[wcs[i].wr_id % CHAINS_RING];
        if (!c->live || c->seq != wcs[i].wr_id)
            continue;
        if (wcs[i].status != KVP_RDMA_WC_OK) {
            kvp_status_t e = b->flushed_as != KVP_OK && wcs[i].status == KVP_RDMA_WC_FLUSHED
                                 ? b->flushed_as
                                 : kvp_rdma_wc_to_status(wcs[i].status);
            for (uint32_t k = c->first; k <= c->last; k++)
                if (b->st[k] == KVP_OK)
                    b->st[k] = e;
        }
        if (wcs[i].chain_end) {
            c->live = false;
            b->out--;
        }
        b->progress++;
    }
    if (n > 0)
        pthread_cond_broadcast(&r->cq_cond);
}

#define CQ_SPIN_POLLS 64 /* empty polls before the completion thread sleeps on the channel */

/* The initiator's completion thread (started at the first batch): takes the device's
 * completions (spinning a little after work, then sleeping on the completion channel) and
 * hands them to their batches, so that a peer whose completions stop holds up its own
 * batch only (each batch waits on cq_cond for its own). */
static void *cq_main(void *arg)
{
    te_rdma_t *r = arg;
    unsigned idle = 0;
    while (!atomic_load(&r->stop)) {
        kvp_rdma_wc_t wcs[64];
        int n = idle < CQ_SPIN_POLLS ? kvp_rdma_poll(r->dev, wcs, 64)
                                     : kvp_rdma_wait(r->dev, wcs, 64, 100);
        if (n > 0) {
            pthread_mutex_lock(&r->xfer_lock);
            dispatch(r, wcs, n);
            pthread_mutex_unlock(&r->xfer_lock);
            idle = 0;
        } else
            idle++;
    }
    return NULL;
}

/* Wait up to ms for a completion of b's (xfer_lock held, released while waiting). */
static void batch_wait(te_rdma_t *r, te_batch_t *b, unsigned ms)
{
    uint64_t before = b->progress;
    struct timespec until = kvp_deadline_ms(ms);
    while (b->progress == before &&
           pthread_cond_timedwait(&r->cq_cond, &r->xfer_lock, &until) == 0) {
    }
}

/* Ranges [0, m) (m <= TE_RDMA_CHUNK; those with st[i] KVP_OK go, with lkeys[i], rkeys[i])
 * over p->qp; their outcomes into st. p->lock and xfer_lock held (the latter let go while
 * the batch waits for its completions). */
static void chunk_run(te_rdma_t *r, te_rdma_peer_t *p, kvp_rdma_op_t op, size_t m,
                      void *const *locals, const uint64_t *remotes, const uint64_t *lens,
                      const uint32_t *lkeys, const uint32_t *rkeys, kvp_status_t *st)
{
    chain_rec_t ring[CHAINS_RING];
    kvp_rdma_wr_t wrs[KVP_RDMA_MAX_CHAIN];
    for (size_t k = 0; k < CHAINS_RING; k++)
        ring[k].live = false;
    te_batch_t b = {.qp = p->qp, .ring = ring, .st = st, .next = r->batches};
    r->batches = &b;
    size_t i = 0;     /* the next range to post ... */
    uint64_t off = 0; /* ... from this offset in it */
    uint64_t last_progress = kvp_now_ms();
    for (;;) {
        /* post chains while ranges are left and the send queue takes them */
        while (i < m && b.out < CHAINS_RING) {
            size_t nw = 0, si = i;
            uint64_t soff = off, seq = r->chain_seq;
            uint32_t first = (uint32_t)i, last = (uint32_t)i;
            while (si < m && nw < KVP_RDMA_MAX_CHAIN) {
                if (st[si] != KVP_OK) {
                    si++, soff = 0;
                    continue;
                }
                uint64_t k = lens[si] - soff < SLICE ? lens[si] - soff : SLICE;
                wrs[nw++] = (kvp_rdma_wr_t){.local = (uint8_t *)locals[si] + soff,
                                            .lkey = lkeys[si],
                                            .len = (uint32_t)k,
                                            .remote = remotes[si] + soff,
                                            .rkey = rkeys[si],
                                            .wr_id = seq};
                last = (uint32_t)si;
                soff += k;
                if (soff == lens[si])
                    si++, soff = 0;
            }
            if (nw == 0) { /* only refused ranges were left */
                i = m;
                break;
            }
            size_t posted = 0;
            int rc = kvp_rdma_post_chain(p->qp, op, wrs, nw, &posted);
            if (rc == 0 || posted > 0) {
                ring[seq % CHAINS_RING] =
                    (chain_rec_t){.seq = seq, .first = first, .last = last, .live = true};
                r->chain_seq++;
                b.out++;
            }
            if (rc == 0) {
                i = si, off = soff;
                continue;
            }
            if (rc == -EAGAIN && b.out > 0)
                break; /* the queue is full: completions first */
            /* the QP is in error (or the device refused): what did not go fails; what went
             * in part is flushed and marked as its completions come */
            kvp_status_t broken = rc == -ENOTCONN ? KVP_ERR_CONNECT : KVP_ERR_IO;
            for (size_t k = posted > 0 ? (size_t)last + 1 : first; k < m; k++)
                if (st[k] == KVP_OK)
                    st[k] = broken;
            i = m;
        }
        if (b.out == 0)
            break; /* every chain posted came back */
        uint64_t before = b.progress;
        batch_wait(r, &b, 50);
        uint64_t now = kvp_now_ms();
        if (b.progress != before) {
            last_progress = now;
            continue;
        }
        if (now - last_progress < r->timeout_ms)
            continue;
        /* no completion that long: the device gives the rest up (flushes); we wait for that,
         * so it never touches the caller's buffers afterwards */
        KVP_LOG_WARN_LIMITED("transfer engine: rdma: no completion in %u ms; flushing the "
                             "queue pair",
                             r->timeout_ms);
        kvp_rdma_qp_flush(p->qp);
        b.flushed_as = KVP_ERR_TIMEOUT;
        uint64_t until = kvp_now_ms() + FLUSH_WAIT_MS;
        while (b.out > 0 && kvp_now_ms() < until)
            batch_wait(r, &b, 50);
        for (size_t k = 0; k < m; k++)
            if (st[k] == KVP_OK && (k >= i || b.out > 0))
                st[k] = KVP_ERR_TIMEOUT;
        if (b.out > 0) {
            p->leaked = true; /* work may still be on it: never destroyed */
            KVP_LOG_ERROR("transfer engine: rdma: a flush did not come back; the queue pair is "
                          "abandoned");
        }
        break;
    }
    for (te_batch_t **pp = &r->batches; *pp != NULL; pp = &(*pp)->next)
        if (*pp == &b) {
            *pp = b.next;
            break;
        }
}

/* Every op of ops[0, n) its status (KVP_ERR_TRANSPORT and pass for an op to hand on). */
static void ops_fail(kvp_xfer_op_t **ops, size_t n, kvp_status_t st)
{
    for (size_t i = 0; i < n; i++)
        ops[i]->status = st;
}

/* A queue pair that saw an error is dropped (the next hello connects anew). p->lock held. */
static void qp_drop_broken(te_rdma_peer_t *p)
{
    if (p->qp != NULL && kvp_rdma_qp_in_error(p->qp)) {
        if (!p->leaked)
            kvp_rdma_qp_destroy(p->qp);
        p->qp = NULL;
    }
}

/*
 * ops[0, n): one peer, one direction. Every remote range is checked against the table the
 * target advertised (asked again once on a miss: it may have registered the range since); a
 * range still not in it is handed on (op->pass) to the next transport of the list, tcp, where
 * the target itself says whether it is out of what it registered or memory it serves staged
 * (its device memory is no memory region). A target that offers us no rdma fails every op
 * with KVP_ERR_TRANSPORT: the engine moves the peer on for good.
 */
static void peer_run(te_rdma_tp_t *c, kvp_peer_t *peer, kvp_xfer_op_t **ops, size_t n)
{
    te_rdma_t *r = c->r;
    te_rdma_peer_t *p = peer->tp_state[c->index];
    kvp_rdma_op_t op = ops[0]->kind == KVP_XFER_WRITE ? KVP_RDMA_WRITE : KVP_RDMA_READ;
    pthread_mutex_lock(&p->lock);
    kvp_status_t st = atomic_load(&p->no_rdma) ? KVP_ERR_UNSUPPORTED : KVP_OK;
    if (st == KVP_OK) {
        qp_drop_broken(p);
        if (p->qp == NULL)
            st = peer_hello(c, p, peer);
    }
    if (st != KVP_OK) {
        pthread_mutex_unlock(&p->lock);
        ops_fail(ops, n, st == KVP_ERR_UNSUPPORTED ? KVP_ERR_TRANSPORT : st);
        return;
    }
    bool refreshed = false;
    for (size_t i = 0; i < n; i++) {
        ops[i]->status = KVP_OK;
        if (tab_find(p->tab, p->n_tab, ops[i]->offset, ops[i]->length) != NULL)
            continue;
        if (!refreshed) {
            refreshed = true;
            kvp_status_t hs = peer_hello(c, p, peer);
            if (hs == KVP_ERR_UNSUPPORTED) {
                pthread_mutex_unlock(&p->lock);
                ops_fail(ops, n, KVP_ERR_TRANSPORT);
                return;
            }
            if (hs == KVP_OK) {
                i = (size_t)-1; /* from the start, against the new table */
                continue;
            }
        }
        ops[i]->status = KVP_ERR_TRANSPORT;
        ops[i]->pass = true;
    }
    kvp_xfer_crc_writes(ops, n);
    kvp_status_t cst[TE_RDMA_CHUNK];
    void *locals[TE_RDMA_CHUNK];
    uint64_t remotes[TE_RDMA_CHUNK], lens[TE_RDMA_CHUNK];
    uint32_t lkeys[TE_RDMA_CHUNK], rkeys[TE_RDMA_CHUNK];
    size_t idx[TE_RDMA_CHUNK];
    mr_rec_t *recs[TE_RDMA_CHUNK];
    size_t next = 0;
    while (next < n) {
        /* the next chunk: ops still to go */
        size_t m = 0;
        for (; next < n && m < TE_RDMA_CHUNK; next++) {
            kvp_xfer_op_t *o = ops[next];
            if (o->status != KVP_OK)
                continue;
            const kvp_data_te_rdma_region_t *e = tab_find(p->tab, p->n_tab, o->offset, o->length);
            if (e == NULL) { /* (the table asked again on a new queue pair lost it) */
                o->status = KVP_ERR_TRANSPORT;
                o->pass = true;
                continue;
            }
            idx[m] = next;
            locals[m] = o->local;
            remotes[m] = o->offset;
            lens[m] = o->length;
            rkeys[m] = e->rkey;
            cst[m] = KVP_OK;
            m++;
        }
        if (m == 0)
            break;
        /* each local region pinned for the chunk (not deregistered under the NIC; a
         * deregistration of another one goes on) */
        pthread_rwlock_rdlock(&r->mr_lock);
        for (size_t i = 0; i < m; i++) {
            recs[i] = local_rec_locked(r, locals[i], lens[i]);
            if (recs[i] == NULL) {
                cst[i] = KVP_ERR_INVALID_ARG; /* unregistered meanwhile */
                continue;
            }
            atomic_fetch_add(&recs[i]->pins, 1);
            lkeys[i] = recs[i]->mr->lkey;
        }
        pthread_rwlock_unlock(&r->mr_lock);
        pthread_mutex_lock(&r->xfer_lock);
        if (!r->cq_started)
            r->cq_started = pthread_create(&r->cq_thread, NULL, cq_main, r) == 0;
        if (r->cq_started)
            chunk_run(r, p, op, m, locals, remotes, lens, lkeys, rkeys, cst);
        else
            for (size_t i = 0; i < m; i++)
                cst[i] = KVP_ERR_SYSTEM; /* no completion thread: nothing posted */
        pthread_mutex_unlock(&r->xfer_lock);
        recs_unpin(r, recs, m);
        for (size_t i = 0; i < m; i++)
            ops[idx[i]]->status = cst[i];
        if (p->qp != NULL && kvp_rdma_qp_in_error(p->qp) && next < n) {
            /* the rest of the batch on a new queue pair */
            qp_drop_broken(p);
            kvp_status_t hs = peer_hello(c, p, peer);
            if (hs != KVP_OK) {
                for (size_t k = next; k < n; k++)
                    if (ops[k]->status == KVP_OK)
                        ops[k]->status = hs == KVP_ERR_UNSUPPORTED ? KVP_ERR_TRANSPORT : hs;
                break;
            }
        }
    }
    pthread_mutex_unlock(&p->lock);
    kvp_xfer_crc_reads(ops, n);
}

/* ---- the transport ---- */

static kvp_status_t tp_create(kvp_transfer_t *xfer, unsigned index, void **ctx_p)
{
    const kvp_te_tp_cfg_t *cfg = xfer->own_cfg;
    if (cfg == NULL || cfg->rdma == NULL)
        return KVP_ERR_NOT_FOUND; /* not a transfer engine's, or no device here */
    te_rdma_tp_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVP_ERR_NOMEM;
    c->r = cfg->rdma;
    c->cfg = *cfg;
    c->index = index;
    *ctx_p = c;
    return KVP_OK;
}

static void tp_destroy(void *ctx)
{
    free(ctx); /* the device is the engine's (te_rdma_close) */
}

/* A peer of another host (this host's are "@..." peers, reached on their Unix socket). */
static kvp_status_t tp_attach(void *ctx, kvp_peer_t *peer, void **state_p)
{
    (void)ctx;
    if (peer->endpoint[0] == '@')
        return KVP_ERR_TRANSPORT;
    te_rdma_peer_t *p = te_rdma_peer_new();
    if (p == NULL)
        return KVP_ERR_NOMEM;
    *state_p = p;
    return KVP_OK;
}

static void tp_detach(void *ctx, kvp_peer_t *peer, void *state)
{
    (void)ctx;
    (void)peer;
    te_rdma_peer_free(state); /* its last batch is done: the peer's last reference went */
}

/* A local buffer for our batches: one the engine registered is a region already (its MR
 * serves both ends); any other (the staging buffers) gets a local-only region, never
 * advertised. Device memory: none (no GPUDirect RDMA here; its ops are staged). */
static kvp_status_t tp_mem_reg(void *ctx, void *addr, size_t len, kvp_mem_kind_t kind)
{
    te_rdma_t *r = ((te_rdma_tp_t *)ctx)->r;
    if (kind != KVP_MEM_HOST)
        return KVP_ERR_UNSUPPORTED;
    pthread_rwlock_rdlock(&r->mr_lock);
    bool served = tab_find(r->ents, r->n, (uintptr_t)addr, len) != NULL;
    pthread_rwlock_unlock(&r->mr_lock);
    if (served)
        return KVP_OK;
    kvp_rdma_mr_t *mr;
    int rc = kvp_rdma_mr_reg(r->dev, addr, len, false, &mr);
    if (rc != 0)
        return rc == -ENOMEM ? KVP_ERR_NOMEM : KVP_ERR_TRANSPORT;
    mr_rec_t *rec = rec_new(mr);
    if (rec == NULL)
        return KVP_ERR_NOMEM;
    uintptr_t a = (uintptr_t)addr;
    kvp_status_t st = KVP_OK;
    pthread_rwlock_wrlock(&r->mr_lock);
    if (r->n_loc == r->cap_loc) {
        size_t cap = r->cap_loc ? r->cap_loc * 2 : 16;
        loc_mr_t *l = realloc(r->loc, cap * sizeof(*l));
        if (l != NULL) {
            r->loc = l;
            r->cap_loc = cap;
        } else
            st = KVP_ERR_NOMEM;
    }
    if (st == KVP_OK) {
        size_t i = 0;
        while (i < r->n_loc && r->loc[i].addr < a)
            i++;
        memmove(&r->loc[i + 1], &r->loc[i], (r->n_loc - i) * sizeof(r->loc[0]));
        r->loc[i] = (loc_mr_t){.addr = a, .len = len, .rec = rec};
        r->n_loc++;
    }
    pthread_rwlock_unlock(&r->mr_lock);
    if (st != KVP_OK)
        rec_retire(r, rec);
    return st;
}

static void tp_mem_dereg(void *ctx, void *addr)
{
    te_rdma_t *r = ((te_rdma_tp_t *)ctx)->r;
    mr_rec_t *rec = NULL;
    pthread_rwlock_wrlock(&r->mr_lock);
    for (size_t i = 0; i < r->n_loc; i++)
        if (r->loc[i].addr == (uintptr_t)addr) {
            rec = r->loc[i].rec;
            memmove(&r->loc[i], &r->loc[i + 1], (r->n_loc - i - 1) * sizeof(r->loc[0]));
            r->n_loc--;
            break;
        }
    pthread_rwlock_unlock(&r->mr_lock);
    rec_retire(r, rec); /* after the batches that use it (a range the engine registered:
                           te_rdma_dereg's) */
}

/* Runs of ops to one peer in one direction, each a peer_run. */
static void tp_submit(void *ctx, kvp_xfer_op_t **ops, size_t n)
{
    te_rdma_tp_t *c = ctx;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && ops[j]->peer == ops[i]->peer && ops[j]->kind == ops[i]->kind)
            j++;
        peer_run(c, ops[i]->peer, ops + i, j - i);
        i = j;
    }
}

const kvp_transport_ops_t kvp_te_rdma_ops = {
    .name = "te-rdma",
    .id = KVP_TRANSPORT_RDMA,
    .create = tp_create,
    .destroy = tp_destroy,
    .attach = tp_attach,
    .detach = tp_detach,
    .mem_reg = tp_mem_reg,
    .mem_dereg = tp_mem_dereg,
    .submit = tp_submit,
};
