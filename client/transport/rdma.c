/*
 * rdma.c - the rdma transport: one-sided RDMA READ/WRITE straight
 * between the caller's registered memory and the peer's segment.
 *
 * Design (docs/architecture.md, "The rdma path"):
 *   - One device per client (client/transport/rdma_verbs.c: device, PD, one CQ with a
 *     completion channel). The device is opened at client create: a device
 *     list ("rxe0,mlx5_0") or auto, port ACTIVE, a RoCE v2 GID for the
 *     listen address, the MTU known.
 *   - Registration once: the client's own segment is registered with remote
 *     READ+WRITE when it is created, and its descriptor (rdma_endpoint,
 *     rdma_addr, rdma_rkey) goes to the master; each kvp_register_buffer
 *     region is registered locally. Nothing is registered per operation; an
 *     op whose local buffer is not registered is staged by transfer.c.
 *   - Connections: the segment owner listens with rdma_cm on its rdma
 *     endpoint (an accept thread takes connections and reaps disconnected
 *     ones; the owner's CPU never touches a transfer). A client connects
 *     lazily on first use, `qps` RC QPs per peer endpoint, and keeps them.
 *     The owner answers a connect with its segment's address and rkey; a
 *     mismatch with the descriptor means the descriptor is stale
 *     (KVP_ERR_SEGMENT_GONE).
 *   - Data path: every op is cut into slices of at most `slice` bytes;
 *     slices go round-robin over the peer's QPs ("lanes"), so one large
 *     object is striped over all of them and many small ones spread too.
 *     Each lane posts chains of up to KVP_RDMA_MAX_CHAIN WRs with one
 *     doorbell, only the last signaled, while its send queue has room
 *     (bounded in-flight per QP) and the device CQ has room for every WR
 *     posted (a flush completes every WR).
 *   - Completion: one thread per device polls the CQ, spins briefly after
 *     work, then sleeps on the completion channel. A WR's wr_id is its
 *     slice; a chain's end finishes its chain record and wakes the batch.
 *   - Errors: an error completion fails the ops of its slice's chain with
 *     a status (remote access -> KVP_ERR_OUT_OF_RANGE, retry exceeded ->
 *     KVP_ERR_CONNECT, flushed/other -> KVP_ERR_IO); the QP is then in
 *     error and the next batch to that peer replaces it (reconnects). A
 *     batch that sees no completion for timeout_ms moves its QPs to the
 *     error state (every WR flushes; the device will not touch the caller's
 *     buffers afterwards), fails what is left with KVP_ERR_TIMEOUT, and
 *     returns once the flushes are back.
 *
 * Lifetime: a lane QP (rqp_t) is referenced by its peer slot and by every
 * batch using it; a batch drops its reference only when all its chains are
 * complete, so the last unref (which destroys the QP) finds nothing in flight.
 *
 * Threads: transfer() from any client thread; posting on a QP under its
 * post_lock; the completion thread owns the CQ and writes op statuses and
 * chain records under ctx->done_lock; peers and slots under ctx->lock; the
 * MR table under mr_lock (read-mostly).
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/transfer/engine.h"
#include "client/mem/gpu.h"
#include "client/transfer/transport.h"
#include "client/transport/hello.h"
#include "client/transport/rdma_ctx.h"
#include "client/transport/rdma_regions.h"
#include "client/transport/rdma_status.h"
#include "client/transport/rdma_verbs.h"
#include "client/transport/wire.h"
#include "common/log.h"
#include "common/clock.h"
#include "common/grant.h"
#include "common/parse.h"
#include "common/sock.h"

#include <openssl/crypto.h>

#define MAX_QPS_PER_PEER 16
#define CONN_MAGIC 0x5250564Bu /* "KVPR" */
#define CONN_VERSION 1
#define CONN_VERSION_PROOF 2 /* data grants on: the connect carries a proof (common/grant.h) */
/* A proof is taken this long after its time (and KVP_GRANT_SKEW_MS before it); its nonce
 * is remembered for as long, so a replayed proof is refused. */
#define PROOF_WINDOW_MS 30000u
#define PROOF_SEEN 1024
/* Queue pairs one principal may hold to this owner (KVPOOL_RDMA_QP_CAP) */
#define QP_CAP_DEFAULT 256
/* Memory windows one queue pair may have bound at once (KVPOOL_RDMA_WINDOWS) */
#define WINDOWS_PER_QP 1024u
#define SPIN_POLLS 64
#define FLUSH_WAIT_MS 5000

/* Private data of the owner's accept: what the connector must see. */
typedef struct accept_pdata {
    uint32_t magic;
    uint32_t version;
    uint64_t addr;
    uint64_t size;
    uint32_t rkey;
    uint32_t pad;
} accept_pdata_t;

typedef struct connect_pdata {
    uint32_t magic;
    uint32_t version;
    kvp_grant_qp_proof_t proof; /* CONN_VERSION_PROOF only */
} connect_pdata_t;
_Static_assert(sizeof(connect_pdata_t) <= KVP_RDMA_CONNECT_PDATA_MAX, "connect data fits");

typedef struct rqp {
    atomic_int refs;
    kvp_rdma_qp_t *qp;
    uint32_t rkey;       /* the owner's, from its accept */
    uint32_t remote_qpn; /* the owner's QP it is connected to (windows are bound there) */
    pthread_mutex_t post_lock;
} rqp_t;

typedef struct rpeer {
    char endpoint[256]; /* the descriptor's rdma endpoint; keyed: the engine's tcp one */
    /* keyed (a transfer engine's peer, rdma_regions.h): its regions' keys come in offers;
     * one rpeer per endpoint and connection epoch, its queue pairs dropped with the last
     * peer that attached it */
    bool keyed;
    uint64_t epoch;
    unsigned users;                 /* keyed: peers attached (ctx->lock) */
    pthread_mutex_t conn_lock;      /* slot[], addr, rkey, the keyed state below; held across a
                                       connect and an offer */
    kvp_data_te_rdma_region_t *tab; /* keyed: the table last offered, sorted */
    size_t n_tab;
    bool no_rdma; /* keyed: the peer offers us none */
    /* keyed: an offer's token not used yet (the table asked without a connect) */
    kvp_rdma_token_pdata_t spare;
    char spare_ip[16];
    uint16_t spare_port;
    uint64_t spare_ms; /* when it was given; 0: none */
    uint64_t addr;
    uint32_t rkey;
    rqp_t *slot[MAX_QPS_PER_PEER];
    /* memory windows (the owner serves through them): a HELLO'd tcp connection to its data
     * server that asks for them, one batch at a time (win_fd -1: none open) */
    pthread_mutex_t win_lock;
    int win_fd;
    struct rpeer *next;
} rpeer_t;

typedef struct mr_ent {
    uintptr_t addr;
    size_t len;
    kvp_rdma_mr_t *mr;
    bool shared; /* a transfer engine's region (rdma_regions.c's: kvp_rdma_ctx_mr_share) */
} mr_ent_t;

/* A memory window of an accepted QP (KVPOOL_RDMA_WINDOWS). */
typedef struct win {
    kvp_rdma_mw_t *mw;
    uint64_t expiry_ms; /* bound until then at the latest (the grants'); 0: free */
    uint64_t off, len;  /* the extent of the segment it opens, while bound */
    bool write;         /* opens it to remote WRITE (else READ) */
} win_t;

/* A chain of window WRs on an accepted QP, waited for (done_lock). */
typedef struct win_wait {
    bool done;
    kvp_status_t status;
    uint32_t nwr;
} win_wait_t;

typedef struct accepted {
    kvp_rdma_qp_t *qp;
    uint64_t tag; /* the principal it proved (0: none, grants off) */
    /* its memory windows (win_lock, held across their work requests: one chain at a time on
     * this QP, no other QP waits on it): n_win allocated, in win[] */
    pthread_mutex_t win_lock;
    win_t *win;
    uint32_t n_win;
    /* windows bound now (win_lock to change; read without it by a write's scan, which a
     * bind's recheck orders against: rdma_windows_written) */
    atomic_uint live;
    win_wait_t wait;
    unsigned users;    /* data servers between finding it and done with it (acc_lock) */
    atomic_bool stuck; /* a window chain never came back: never reaped (the device may still
                          see it) */
    struct accepted *next;
} accepted_t;

typedef struct rdma_ctx {
    kvp_transfer_t *xfer;
    unsigned index; /* in the transfer engine's list: a peer's state is tp_state[index] */
    kvp_rdma_dev_t *dev;
    unsigned nqp;
    uint64_t slice;
    unsigned cq_depth;

    pthread_mutex_t lock; /* peers and their slots */
    rpeer_t *peers;

    pthread_rwlock_t mr_lock;
    mr_ent_t *mrs; /* sorted by addr, disjoint */
    size_t n_mrs, cap_mrs;

    pthread_t cq_thread;
    atomic_bool stop;
    pthread_mutex_t done_lock; /* op statuses, chain records, batch counters */
    pthread_cond_t done_cond;
    unsigned wr_inflight; /* WRs posted on the device and not completed */

    /* the segment we serve */
    kvp_rdma_mr_t *seg_mr;
    kvp_rdma_listener_t *lst;
    accept_pdata_t seg_pdata;
    pthread_t acc_thread;
    bool acc_started;
    /* the accept thread alone adds and reaps (under acc_lock) and reads it without; data
     * servers find their QP under acc_lock and hold it by its `users` */
    accepted_t *accepted;
    pthread_mutex_t acc_lock;
    bool windows; /* the segment is served through memory windows (KVPOOL_RDMA_WINDOWS=1) */
    /* the accept thread's gate (data grants on): its verifier, the nonces it saw, the cap,
     * and the tag of the request it let through last */
    kvp_grant_verifier_t acc_v;
    struct {
        uint64_t nonce, time_ms;
    } seen[PROOF_SEEN];
    unsigned seen_next;
    unsigned qp_cap;
    uint64_t acc_tag;
    /* or a transfer engine's gate (kvp_rdma_ctx_listen): gate(ext) decides, tick(ext) at
     * each turn, ext_free(ext) at cleanup; n_accepted counted for its cap */
    kvp_rdma_gate_fn gate;
    void (*tick)(void *);
    void *ext;
    void (*ext_free)(void *);
    size_t n_accepted;

    /* batches given up on while flushes were outstanding: freed at cleanup */
    struct rbatch *orphans;
} rdma_ctx_t;

struct rchain;

typedef struct rslice {
    kvp_xfer_op_t *op;
    struct rchain *chain;
    uint64_t off; /* within the op */
    uint32_t len;
    uint32_t lane;
    uint32_t lkey; /* of the op's local buffer, looked up once per op */
    uint32_t rkey; /* its window's (the lane's windows) or its region's (keyed), else unused */
} rslice_t;

typedef struct rchain {
    struct rbatch *b;
    uint32_t lane;
    uint32_t beg, end; /* slice range (batch order) */
    uint32_t nwr;
    kvp_status_t err;
} rchain_t;

typedef struct lane {
    rpeer_t *rp;
    bool keyed; /* its slices carry their regions' rkeys (s->rkey), from the peer's offer */
    unsigned slot;
    rqp_t *q;
    kvp_peer_t *peer;
    uint32_t beg, end, next; /* its slices in the batch's order */
    unsigned out;            /* chains posted, not completed (done_lock) */
    bool dead;
    bool windows;                /* its slices use their windows' rkeys (s->rkey) */
    struct kvp_data_window *win; /* the windows bound for it, n_win of them (to unbind) */
    uint32_t n_win;
} lane_t;

typedef struct rbatch {
    rslice_t *slices;
    rchain_t *chains;
    lane_t *lanes;
    size_t n_slices, n_chains, n_lanes;
    unsigned chains_out; /* posted, not completed (done_lock) */
    uint64_t progress;   /* completions seen (done_lock) */
    kvp_status_t flush_status;
    bool orphaned; /* given up on: its ops belong to the caller again */
    struct rbatch *next;
} rbatch_t;

/* ------------------------------------------------------------ utilities */

static void op_fail(kvp_xfer_op_t *op, kvp_status_t st)
{
    if (op->status == KVP_OK)
        op->status = st;
}

static void rqp_unref(rqp_t *q)
{
    if (q == NULL || atomic_fetch_sub(&q->refs, 1) != 1)
        return;
    kvp_rdma_qp_destroy(q->qp);
    pthread_mutex_destroy(&q->post_lock);
    free(q);
}

/* ----------------------------------------------------------- MR table */

/* Index of the entry containing addr, or -1. mr_lock held. */
static ssize_t mr_find_locked(rdma_ctx_t *ctx, uintptr_t addr)
{
    size_t lo = 0, hi = ctx->n_mrs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ctx->mrs[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    mr_ent_t *e = &ctx->mrs[lo - 1];
    return addr - e->addr < e->len ? (ssize_t)(lo - 1) : -1;
}

static kvp_status_t mr_insert(rdma_ctx_t *ctx, void *addr, size_t len, kvp_rdma_mr_t *mr,
                              bool shared)
{
    uintptr_t a = (uintptr_t)addr;
    kvp_status_t st = KVP_OK;
    pthread_rwlock_wrlock(&ctx->mr_lock);
    size_t pos = 0;
    while (pos < ctx->n_mrs && ctx->mrs[pos].addr < a)
        pos++;
    if ((pos > 0 && ctx->mrs[pos - 1].addr + ctx->mrs[pos - 1].len > a) ||
        (pos < ctx->n_mrs && ctx->mrs[pos].addr < a + len)) {
        st = KVP_ERR_EXISTS;
    } else if (ctx->n_mrs == ctx->cap_mrs) {
        size_t cap = ctx->cap_mrs ? ctx->cap_mrs * 2 : 8;
        mr_ent_t *t = realloc(ctx->mrs, cap * sizeof(*t));
        if (t == NULL) {
            st = KVP_ERR_NOMEM;
        } else {
            ctx->mrs = t;
            ctx->cap_mrs = cap;
        }
    }
    if (st == KVP_OK) {
        memmove(&ctx->mrs[pos + 1], &ctx->mrs[pos], (ctx->n_mrs - pos) * sizeof(*ctx->mrs));
        ctx->mrs[pos] = (mr_ent_t){.addr = a, .len = len, .mr = mr, .shared = shared};
        ctx->n_mrs++;
    }
    pthread_rwlock_unlock(&ctx->mr_lock);
    return st;
}

typedef struct kvp_dmabuf {
    int fd;
    uint64_t offset; /* of the registered address within the dma-buf */
} kvp_dmabuf_t;

/* Register [addr, addr+len) for local access (dmabuf: device memory exported
 * as a dma-buf, else NULL). KVP_ERR_EXISTS if it overlaps a registration. */
static kvp_status_t rdma_reg(rdma_ctx_t *ctx, void *addr, size_t len, const kvp_dmabuf_t *db)
{
    kvp_rdma_mr_t *mr;
    int rc;
    if (db != NULL)
        rc = kvp_rdma_mr_reg_dmabuf(ctx->dev, addr, len, db->fd, db->offset, false, &mr);
    else
        rc = kvp_rdma_mr_reg(ctx->dev, addr, len, false, &mr);
    if (rc != 0) {
        KVP_LOG_WARN("rdma: cannot register %zu bytes at %p: %s", len, addr, kvp_rdma_last_error());
        return rc == -ENOMEM ? KVP_ERR_NOMEM : KVP_ERR_TRANSPORT;
    }
    kvp_status_t st = mr_insert(ctx, addr, len, mr, false);
    if (st != KVP_OK)
        kvp_rdma_mr_dereg(mr);
    return st;
}

static void rdma_mem_dereg(void *vctx, void *addr)
{
    rdma_ctx_t *ctx = vctx;
    kvp_rdma_mr_t *mr = NULL;
    pthread_rwlock_wrlock(&ctx->mr_lock);
    for (size_t i = 0; i < ctx->n_mrs; i++) {
        if (ctx->mrs[i].addr == (uintptr_t)addr && ctx->mrs[i].mr != ctx->seg_mr &&
            !ctx->mrs[i].shared) {
            mr = ctx->mrs[i].mr;
            memmove(&ctx->mrs[i], &ctx->mrs[i + 1], (ctx->n_mrs - i - 1) * sizeof(*ctx->mrs));
            ctx->n_mrs--;
            break;
        }
    }
    pthread_rwlock_unlock(&ctx->mr_lock);
    if (mr != NULL)
        kvp_rdma_mr_dereg(mr);
}

/* A buffer the application registers (or a staging buffer). GPU memory: GPUDirect by a
 * dma-buf of the range, else the peer-memory path of ibv_reg_mr, else an error (its
 * transfers are staged through host memory). */
static kvp_status_t rdma_mem_reg(void *vctx, void *addr, size_t len, kvp_mem_kind_t kind)
{
    rdma_ctx_t *ctx = vctx;
    /* a transfer engine's range is its region already: the same one serves both ends */
    pthread_rwlock_rdlock(&ctx->mr_lock);
    ssize_t at = mr_find_locked(ctx, (uintptr_t)addr);
    bool shared = at >= 0 && ctx->mrs[at].shared &&
                  len <= ctx->mrs[at].len - ((uintptr_t)addr - ctx->mrs[at].addr);
    pthread_rwlock_unlock(&ctx->mr_lock);
    if (shared)
        return KVP_OK;
    if (kind == KVP_MEM_CUDA) {
        kvp_dmabuf_t db;
        if (kvp_gpu_dmabuf_fd(addr, len, &db.fd, &db.offset) == KVP_OK) {
            kvp_status_t st = rdma_reg(ctx, addr, len, &db);
            close(db.fd);
            if (st == KVP_OK || st == KVP_ERR_EXISTS)
                return st;
        }
    }
    return rdma_reg(ctx, addr, len, NULL);
}

/* lkey of the region holding addr; the caller checked coverage. */
static uint32_t lkey_of(rdma_ctx_t *ctx, const void *addr)
{
    pthread_rwlock_rdlock(&ctx->mr_lock);
    ssize_t i = mr_find_locked(ctx, (uintptr_t)addr);
    uint32_t lkey = i >= 0 ? ctx->mrs[i].mr->lkey : 0;
    pthread_rwlock_unlock(&ctx->mr_lock);
    return lkey;
}

/* ------------------------------------------------------ completion thread */

/* done_lock held */
static void handle_wc(rdma_ctx_t *ctx, const kvp_rdma_wc_t *wc)
{
    if (wc->wr_id & 1) { /* an owner's window chain (win_post) */
        win_wait_t *w = (win_wait_t *)(uintptr_t)(wc->wr_id & ~(uint64_t)1);
        if (wc->status != KVP_RDMA_WC_OK && w->status == KVP_OK) {
            w->status = KVP_ERR_IO;
            if (wc->status != KVP_RDMA_WC_FLUSHED)
                KVP_LOG_WARN("rdma: a memory window bind or invalidation failed: %s (ibv "
                             "status %d)",
                             kvp_rdma_wc_status_str(wc->status), wc->ibv_status);
        }
        if (wc->chain_end) {
            ctx->wr_inflight -= w->nwr;
            w->done = true;
        }
        return;
    }
    rslice_t *s = (rslice_t *)(uintptr_t)wc->wr_id;
    rchain_t *ch = s->chain;
    rbatch_t *b = ch->b;
    b->progress++;
    if (b->orphaned) { /* accounting only: the ops are no longer ours to touch */
        if (wc->chain_end) {
            ctx->wr_inflight -= ch->nwr;
            b->chains_out--;
            b->lanes[ch->lane].out--;
        }
        return;
    }
    if (wc->status != KVP_RDMA_WC_OK) {
        kvp_status_t st = b->flush_status != KVP_OK && wc->status == KVP_RDMA_WC_FLUSHED
                              ? b->flush_status
                              : kvp_rdma_wc_to_status(wc->status);
        if (ch->err == KVP_OK || (ch->err == KVP_ERR_IO && st != KVP_ERR_IO))
            ch->err = st;
        if (wc->status != KVP_RDMA_WC_FLUSHED)
            KVP_LOG_WARN("rdma: %s of %u bytes on segment %s failed: %s (ibv status %d)",
                         s->op->kind == KVP_XFER_READ ? "READ" : "WRITE", s->len, s->op->peer->name,
                         kvp_rdma_wc_status_str(wc->status), wc->ibv_status);
    }
    if (!wc->chain_end)
        return;
    /* the whole chain is finished: account it, fail its ops on error */
    if (ch->err != KVP_OK)
        for (uint32_t i = ch->beg; i < ch->end; i++)
            op_fail(b->slices[i].op, ch->err);
    ctx->wr_inflight -= ch->nwr;
    b->chains_out--;
    b->lanes[ch->lane].out--;
}

static void *cq_thread_main(void *arg)
{
    rdma_ctx_t *ctx = arg;
    kvp_rdma_wc_t wcs[64];
    unsigned idle = 0;
    while (!atomic_load(&ctx->stop)) {
        int n = idle < SPIN_POLLS ? kvp_rdma_poll(ctx->dev, wcs, 64)
                                  : kvp_rdma_wait(ctx->dev, wcs, 64, 100);
        if (n < 0) {
            KVP_LOG_ERROR("rdma: completion queue: %s", kvp_rdma_last_error());
            usleep(10000);
            continue;
        }
        if (n == 0) {
            idle++;
            continue;
        }
        idle = 0;
        pthread_mutex_lock(&ctx->done_lock);
        for (int i = 0; i < n; i++)
            handle_wc(ctx, &wcs[i]);
        pthread_cond_broadcast(&ctx->done_cond);
        pthread_mutex_unlock(&ctx->done_lock);
    }
    return NULL;
}

/* Wait on done_cond for completions, 20 ms at most. done_lock held. */
static void done_wait(rdma_ctx_t *ctx)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 20 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&ctx->done_cond, &ctx->done_lock, &ts);
}

/* ------------------------------------------------------- segment serving */

/* An accepted QP goes: its windows first (a bound one holds the QP and the segment's MR),
 * then the QP (no work of ours is left on it). */
static void accepted_free(accepted_t *a)
{
    for (uint32_t i = 0; i < a->n_win; i++)
        kvp_rdma_mw_free(a->win[i].mw);
    free(a->win);
    pthread_mutex_destroy(&a->win_lock);
    kvp_rdma_qp_destroy(a->qp);
    free(a);
}

static void reap_accepted(rdma_ctx_t *ctx)
{
    pthread_mutex_lock(&ctx->acc_lock);
    for (accepted_t **pp = &ctx->accepted; *pp;) {
        accepted_t *a = *pp;
        if (kvp_rdma_qp_in_error(a->qp) && !atomic_load(&a->stuck) && a->users == 0) {
            *pp = a->next;
            accepted_free(a);
            ctx->n_accepted--;
        } else {
            pp = &a->next;
        }
    }
    pthread_mutex_unlock(&ctx->acc_lock);
}

/* ------------------------------------------------------- memory windows (owner) */

/*
 * Post n window WRs (binds, invalidations) on accepted QP a, in chains, and wait for each.
 * a->win_lock held (one window chain per QP at a time). A chain that does not come back within
 * the timeout flushes the QP; one whose flush does not come back leaves a stuck (never
 * reaped: its wait record may still be written). KVP_OK or why not (the QP is then in error).
 */
static kvp_status_t win_post(rdma_ctx_t *ctx, accepted_t *a, const kvp_rdma_mw_wr_t *wrs, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = n - i < KVP_RDMA_MAX_CHAIN ? n - i : KVP_RDMA_MAX_CHAIN;
        pthread_mutex_lock(&ctx->done_lock);
        if (ctx->wr_inflight + k > ctx->cq_depth) {
            pthread_mutex_unlock(&ctx->done_lock);
            if (i > 0) /* windows of the chains before are bound, and taken for free */
                kvp_rdma_qp_flush(a->qp);
            return KVP_ERR_TOO_MANY;
        }
        ctx->wr_inflight += (unsigned)k;
        a->wait = (win_wait_t){.done = false, .status = KVP_OK, .nwr = (uint32_t)k};
        pthread_mutex_unlock(&ctx->done_lock);
        size_t posted = 0;
        int rc =
            kvp_rdma_post_windows(a->qp, ctx->seg_mr, wrs + i, k, (uintptr_t)&a->wait | 1, &posted);
        pthread_mutex_lock(&ctx->done_lock);
        ctx->wr_inflight -= (unsigned)(k - posted);
        a->wait.nwr = (uint32_t)posted;
        if (posted == 0) {
            pthread_mutex_unlock(&ctx->done_lock);
            KVP_LOG_WARN("rdma: cannot post memory window work: %s", kvp_rdma_last_error());
            kvp_rdma_qp_flush(a->qp); /* its windows' state is unknown now: the QP goes */
            return rc == -ENOTCONN ? KVP_ERR_CONNECT : KVP_ERR_IO;
        }
        uint64_t start = kvp_now_ms();
        bool flushed = false;
        while (!a->wait.done) {
            done_wait(ctx);
            uint64_t waited = kvp_now_ms() - start;
            if (!a->wait.done && !flushed && waited >= ctx->xfer->timeout_ms) {
                flushed = true;
                kvp_rdma_qp_flush(a->qp);
            } else if (!a->wait.done && waited >= ctx->xfer->timeout_ms + FLUSH_WAIT_MS) {
                atomic_store(&a->stuck, true);
                pthread_mutex_unlock(&ctx->done_lock);
                KVP_LOG_ERROR("rdma: memory window work did not complete; abandoning its QP");
                return KVP_ERR_TIMEOUT;
            }
        }
        kvp_status_t st = a->wait.status;
        pthread_mutex_unlock(&ctx->done_lock);
        if (st == KVP_OK && rc != 0)
            st = KVP_ERR_IO; /* part of the chain went out, the rest did not: QP in error */
        if (st != KVP_OK) {
            kvp_rdma_qp_flush(a->qp); /* its windows' state is unknown now: the QP goes */
            return st;
        }
        i += k;
    }
    return KVP_OK;
}

/* Invalidate a's windows whose expiry has passed. a->win_lock held. */
static void win_sweep(rdma_ctx_t *ctx, accepted_t *a, uint64_t now)
{
    kvp_rdma_mw_wr_t wrs[KVP_RDMA_MAX_CHAIN];
    size_t k = 0;
    for (uint32_t i = 0; i < a->n_win; i++) {
        if (a->win[i].expiry_ms == 0 || a->win[i].expiry_ms >= now)
            continue;
        wrs[k++] = (kvp_rdma_mw_wr_t){.mw = a->win[i].mw};
        a->win[i].expiry_ms = 0;
        atomic_fetch_sub(&a->live, 1);
        if (k == KVP_RDMA_MAX_CHAIN) {
            if (win_post(ctx, a, wrs, k) != KVP_OK)
                return;
            k = 0;
        }
    }
    if (k > 0)
        win_post(ctx, a, wrs, k);
}

/* The accept thread's: it alone adds and reaps, so it walks the list without acc_lock. */
static void sweep_windows(rdma_ctx_t *ctx)
{
    uint64_t now = kvp_grant_now_ms();
    for (accepted_t *a = ctx->accepted; a != NULL; a = a->next) {
        pthread_mutex_lock(&a->win_lock);
        if (!atomic_load(&a->stuck) && !kvp_rdma_qp_in_error(a->qp))
            win_sweep(ctx, a, now);
        pthread_mutex_unlock(&a->win_lock);
    }
}

/* n free windows of a (allocating up to WINDOWS_PER_QP), their slots into slot[]; false:
 * that many are bound already. a->win_lock held. */
static bool win_take(rdma_ctx_t *ctx, accepted_t *a, size_t n, uint32_t *slot)
{
    size_t got = 0;
    for (uint32_t i = 0; i < a->n_win && got < n; i++)
        if (a->win[i].expiry_ms == 0)
            slot[got++] = i;
    if (got < n && a->win == NULL) {
        a->win = calloc(WINDOWS_PER_QP, sizeof(*a->win));
        if (a->win == NULL)
            return false;
    }
    while (got < n && a->n_win < WINDOWS_PER_QP) {
        if (kvp_rdma_mw_alloc(ctx->dev, &a->win[a->n_win].mw) != 0) {
            KVP_LOG_WARN("rdma: cannot allocate a memory window: %s", kvp_rdma_last_error());
            return false;
        }
        a->win[a->n_win].expiry_ms = 0;
        slot[got++] = a->n_win++;
    }
    return got == n;
}

/* Does [off, off + len) overlap one of the n extents? */
static bool win_overlaps(const win_t *w, const uint64_t *offs, const uint64_t *lens, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (w->off < offs[i] + lens[i] && offs[i] < w->off + w->len)
            return true;
    return false;
}

/*
 * A write at the n extents was let in for principal tag (the windows op with rkeys NULL):
 * every bound window that overlaps one goes, on every QP, but tag's own write windows (its
 * put's other lanes). A window outlives the check of its grant (it is bound until the
 * grant's expiry): without this, one kept after its object was removed would open the next
 * object put at that extent, another principal's, to its holder. The data server notes the
 * write (data_grant.h, the begun puts) before calling this, and checks a bind's extents
 * again after the bind (serve_windows): a bind that this scan misses (not yet counted in
 * `live`) sees the note then and is undone.
 */
static kvp_status_t rdma_windows_written(rdma_ctx_t *ctx, uint64_t tag, const uint64_t *offs,
                                         const uint64_t *lens, size_t n)
{
    unsigned revoked = 0;
    pthread_mutex_lock(&ctx->acc_lock); /* nesting acc_lock -> win_lock: nobody the other way */
    for (accepted_t *a = ctx->accepted; a != NULL; a = a->next) {
        if (atomic_load(&a->live) == 0)
            continue;
        kvp_rdma_mw_wr_t wrs[KVP_RDMA_MAX_CHAIN];
        size_t k = 0;
        pthread_mutex_lock(&a->win_lock);
        bool usable = !kvp_rdma_qp_in_error(a->qp) && !atomic_load(&a->stuck);
        for (uint32_t i = 0; i < a->n_win; i++) {
            win_t *w = &a->win[i];
            if (w->expiry_ms == 0 || (w->write && a->tag == tag) || !win_overlaps(w, offs, lens, n))
                continue;
            w->expiry_ms = 0;
            atomic_fetch_sub(&a->live, 1);
            revoked++;
            wrs[k++] = (kvp_rdma_mw_wr_t){.mw = w->mw};
            if (k == KVP_RDMA_MAX_CHAIN) {
                if (usable && win_post(ctx, a, wrs, k) != KVP_OK)
                    usable = false; /* the QP is flushed: its windows open nothing */
                k = 0;
            }
        }
        if (k > 0 && usable)
            win_post(ctx, a, wrs, k);
        pthread_mutex_unlock(&a->win_lock);
    }
    pthread_mutex_unlock(&ctx->acc_lock);
    if (revoked > 0)
        KVP_LOG_WARN_LIMITED("rdma: %u memory window(s) over an extent a new put writes revoked "
                             "(their objects were removed; their holders lose access)",
                             revoked);
    return KVP_OK;
}

/* The windows op (transfer/transport.h), the owner's side of wire.h's BIND and UNBIND. */
static kvp_status_t rdma_windows(void *vctx, uint32_t qp_num, uint64_t tag, const uint64_t *offs,
                                 const uint64_t *lens, size_t n_bind, bool write,
                                 uint64_t expiry_ms, uint32_t *rkeys, uint32_t *slots,
                                 size_t n_unbind)
{
    rdma_ctx_t *ctx = vctx;
    if (!ctx->windows || ctx->seg_mr == NULL)
        return KVP_ERR_INVALID_ARG;
    if (n_bind > KVP_DATA_VEC_MAX || n_unbind > KVP_DATA_VEC_MAX)
        return KVP_ERR_INVALID_ARG;
    if (rkeys == NULL)
        return rdma_windows_written(ctx, tag, offs, lens, n_bind);
    kvp_rdma_mw_wr_t wrs[KVP_DATA_VEC_MAX];
    accepted_t *a = NULL;
    kvp_status_t st = KVP_ERR_NOT_FOUND;
    /* a QP just connected may reach the list a moment after its peer sees it established */
    for (int tries = 0; st == KVP_ERR_NOT_FOUND; tries++) {
        if (tries > 0)
            usleep(2000);
        pthread_mutex_lock(&ctx->acc_lock);
        for (a = ctx->accepted; a != NULL && kvp_rdma_qp_num(a->qp) != qp_num;)
            a = a->next;
        st = a == NULL ? KVP_ERR_NOT_FOUND : a->tag != tag ? KVP_ERR_DENIED : KVP_OK;
        if (st == KVP_OK)
            a->users++; /* not reaped while we use it */
        pthread_mutex_unlock(&ctx->acc_lock);
        if (tries == 100 || n_bind == 0)
            break;
    }
    if (st != KVP_OK)
        return st;
    /* this QP's windows only: binds on other QPs and the accept thread go on meanwhile */
    pthread_mutex_lock(&a->win_lock);
    if (kvp_rdma_qp_in_error(a->qp) || atomic_load(&a->stuck))
        st = KVP_ERR_NOT_FOUND;
    if (st == KVP_OK && n_unbind > 0) {
        size_t k = 0;
        for (size_t i = 0; i < n_unbind; i++) {
            uint32_t s = slots[i];
            if (s < a->n_win && a->win[s].expiry_ms != 0 &&
                kvp_rdma_mw_rkey(a->win[s].mw) == rkeys[i]) {
                wrs[k++] = (kvp_rdma_mw_wr_t){.mw = a->win[s].mw};
                a->win[s].expiry_ms = 0;
                atomic_fetch_sub(&a->live, 1);
            }
        }
        st = k > 0 ? win_post(ctx, a, wrs, k) : KVP_OK;
    } else if (st == KVP_OK && n_bind > 0) {
        uint64_t now = kvp_grant_now_ms();
        if (expiry_ms <= now)
            st = KVP_ERR_DENIED;
        else if (!win_take(ctx, a, n_bind, slots)) {
            win_sweep(ctx, a, now); /* the expired ones, and again */
            if (!win_take(ctx, a, n_bind, slots))
                st = KVP_ERR_TOO_MANY;
        }
        for (size_t i = 0; st == KVP_OK && i < n_bind; i++)
            wrs[i] = (kvp_rdma_mw_wr_t){.mw = a->win[slots[i]].mw,
                                        .addr = (uintptr_t)ctx->seg_mr->addr + offs[i],
                                        .len = lens[i],
                                        .write = write};
        if (st == KVP_OK)
            st = win_post(ctx, a, wrs, n_bind);
        for (size_t i = 0; st == KVP_OK && i < n_bind; i++) {
            win_t *w = &a->win[slots[i]];
            *w = (win_t){.mw = w->mw,
                         .expiry_ms = expiry_ms,
                         .off = offs[i],
                         .len = lens[i],
                         .write = write};
            atomic_fetch_add(&a->live, 1);
            rkeys[i] = kvp_rdma_mw_rkey(w->mw);
        }
    }
    pthread_mutex_unlock(&a->win_lock);
    pthread_mutex_lock(&ctx->acc_lock);
    a->users--;
    pthread_mutex_unlock(&ctx->acc_lock);
    if (st != KVP_OK && st != KVP_ERR_DENIED && st != KVP_ERR_NOT_FOUND)
        KVP_LOG_WARN_LIMITED("rdma: memory windows on QP %u: %s", qp_num, kvp_strerror(st));
    return st;
}

/*
 * The owner's gate on a connection request (data grants on: the segment's keyring holds a
 * key): the connector must prove the rdma key of its principal (common/grant.h), which the
 * master gives only to principals whose grants cover all the segment can hold; the proof
 * must be recent and new; the principal must hold fewer than the cap of queue pairs. 0:
 * accept (ctx->acc_tag: the principal). Grants off: every request is accepted, as before.
 */
static int accept_check(void *arg, const void *pdata, size_t len)
{
    rdma_ctx_t *ctx = arg;
    ctx->acc_tag = 0;
    if (ctx->gate != NULL) { /* a transfer engine's (rdma_regions.c) */
        if (ctx->n_accepted >= KVP_RDMA_ACCEPTED_MAX) {
            atomic_fetch_add_explicit(&ctx->xfer->serve_refused, 1, memory_order_relaxed);
            KVP_LOG_WARN_LIMITED("rdma: a connection request refused: %d queue pairs held",
                                 KVP_RDMA_ACCEPTED_MAX);
            return -1;
        }
        return ctx->gate(ctx->ext, pdata, len);
    }
    if (!kvp_grant_verifier_sync(&ctx->acc_v, &ctx->xfer->seg_grants))
        return -1;
    if (!ctx->acc_v.on)
        return 0;
    const char *why = NULL;
    connect_pdata_t cp;
    uint8_t key[KVP_GRANT_KEY_LEN];
    uint64_t now = kvp_grant_now_ms();
    if (len < sizeof(cp))
        why = "no proof of a principal";
    if (why == NULL) {
        memcpy(&cp, pdata, sizeof(cp));
        kvp_grant_qp_proof_t want = cp.proof;
        if (cp.magic != CONN_MAGIC || cp.version != CONN_VERSION_PROOF)
            why = "no proof of a principal";
        else if (!kvp_grant_rdma_key(ctx->acc_v.mac, cp.proof.tag, key) ||
                 !kvp_grant_qp_proof(key, &want))
            why = "the owner cannot check proofs";
        else if (CRYPTO_memcmp(want.mac, cp.proof.mac, sizeof(want.mac)) != 0)
            why = "a proof that does not match";
        else if (cp.proof.time_ms + PROOF_WINDOW_MS < now ||
                 cp.proof.time_ms > now + KVP_GRANT_SKEW_MS)
            why = "a proof out of its time window";
        OPENSSL_cleanse(key, sizeof(key));
    }
    for (unsigned i = 0; why == NULL && i < PROOF_SEEN; i++)
        if (ctx->seen[i].nonce == cp.proof.nonce && ctx->seen[i].time_ms + PROOF_WINDOW_MS >= now)
            why = "a proof seen before (replayed)";
    unsigned held = 0;
    for (accepted_t *a = ctx->accepted; why == NULL && a != NULL; a = a->next)
        held += a->tag == cp.proof.tag;
    if (why == NULL && held >= ctx->qp_cap)
        why = "its principal holds as many queue pairs as it may (KVPOOL_RDMA_QP_CAP)";
    if (why != NULL) {
        atomic_fetch_add_explicit(&ctx->xfer->serve_refused, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("rdma: a connection request refused: %s", why);
        return -1;
    }
    ctx->seen[ctx->seen_next].nonce = cp.proof.nonce;
    ctx->seen[ctx->seen_next].time_ms = now;
    ctx->seen_next = (ctx->seen_next + 1) % PROOF_SEEN;
    ctx->acc_tag = cp.proof.tag;
    return 0;
}

static void *accept_thread_main(void *arg)
{
    rdma_ctx_t *ctx = arg;
    for (unsigned round = 0; !atomic_load(&ctx->stop); round++) {
        kvp_rdma_qp_t *qp;
        if (ctx->tick != NULL)
            ctx->tick(ctx->ext);
        reap_accepted(ctx);
        if (ctx->windows)
            sweep_windows(ctx); /* windows past their grants' expiry */
        /* what peers did wrong on our QPs: their async events, and the NIC's counter */
        int bad = kvp_rdma_dev_access_errors(ctx->dev);
        if (bad > 0) {
            atomic_fetch_add(&ctx->xfer->serve_access_errors, (uint64_t)bad);
            KVP_LOG_WARN_LIMITED("rdma: %d remote access error(s) on the segment's queue pairs "
                                 "(a peer used a bad rkey, address or permission)",
                                 bad);
        }
        if (round % 5 == 0)
            atomic_store(&ctx->xfer->nic_access_errors, kvp_rdma_dev_nic_access_errors(ctx->dev));
        int rc = ctx->gate != NULL
                     ? kvp_rdma_accept(ctx->lst, 200, NULL, 0, accept_check, ctx, &qp)
                     : kvp_rdma_accept(ctx->lst, 200, &ctx->seg_pdata, sizeof(ctx->seg_pdata),
                                       accept_check, ctx, &qp);
        if (rc == -ETIMEDOUT || rc == -EACCES)
            continue;
        if (rc != 0) {
            KVP_LOG_WARN("rdma: accept: %s", kvp_rdma_last_error());
            usleep(50000);
            continue;
        }
        accepted_t *a = malloc(sizeof(*a));
        if (a == NULL) {
            kvp_rdma_qp_destroy(qp);
            continue;
        }
        *a = (accepted_t){.qp = qp, .tag = ctx->acc_tag};
        pthread_mutex_init(&a->win_lock, NULL);
        atomic_init(&a->stuck, false);
        atomic_init(&a->live, 0);
        pthread_mutex_lock(&ctx->acc_lock);
        a->next = ctx->accepted;
        ctx->accepted = a;
        ctx->n_accepted++;
        pthread_mutex_unlock(&ctx->acc_lock);
    }
    return NULL;
}

/* ------------------------------------------- a transfer engine's serving (rdma_ctx.h) */

extern const kvp_transport_ops_t kvp_transport_rdma_ops;

void *kvp_rdma_ctx_of(kvp_transfer_t *xfer)
{
    for (unsigned i = 0; i < xfer->n_tps; i++)
        if (xfer->tps[i].ops == &kvp_transport_rdma_ops)
            return xfer->tps[i].ctx;
    return NULL;
}

kvp_rdma_dev_t *kvp_rdma_ctx_dev(void *vctx)
{
    return ((rdma_ctx_t *)vctx)->dev;
}

/* The address to serve on: rdma_host, else the device's. */
static kvp_status_t serve_ip(rdma_ctx_t *ctx, char *ip, size_t len)
{
    if (ctx->xfer->rdma_host[0] != '\0') {
        snprintf(ip, len, "%s", ctx->xfer->rdma_host);
        return KVP_OK;
    }
    if (kvp_rdma_dev_ipv4(ctx->dev, ip, len) == 0)
        return KVP_OK;
    KVP_LOG_ERROR("rdma: device %s has no IPv4 address to serve on (%s); set rdma_host / "
                  "KVPOOL_RDMA_HOST",
                  kvp_rdma_dev_info(ctx->dev)->name, kvp_rdma_last_error());
    return KVP_ERR_TRANSPORT;
}

kvp_status_t kvp_rdma_ctx_listen(void *vctx, kvp_rdma_gate_fn gate, void (*tick)(void *), void *ext,
                                 void (*ext_free)(void *), char *ip_out, size_t ip_len,
                                 uint16_t *port_p)
{
    rdma_ctx_t *ctx = vctx;
    if (ctx->lst != NULL || ctx->acc_started)
        return KVP_ERR_EXISTS; /* (it serves a segment, or listens already) */
    kvp_status_t st = serve_ip(ctx, ip_out, ip_len);
    if (st != KVP_OK)
        return st;
    if (kvp_rdma_listen(ctx->dev, ip_out, 0, 128, &ctx->lst, port_p) != 0) {
        KVP_LOG_ERROR("rdma: cannot listen on %s: %s", ip_out, kvp_rdma_last_error());
        return KVP_ERR_TRANSPORT;
    }
    ctx->gate = gate;
    ctx->tick = tick;
    ctx->ext = ext;
    ctx->ext_free = ext_free;
    if (pthread_create(&ctx->acc_thread, NULL, accept_thread_main, ctx) != 0) {
        kvp_rdma_listener_destroy(ctx->lst);
        ctx->lst = NULL;
        ctx->gate = NULL;
        ctx->tick = NULL;
        ctx->ext = NULL;
        ctx->ext_free = NULL;
        return KVP_ERR_SYSTEM;
    }
    ctx->acc_started = true;
    return KVP_OK;
}

kvp_status_t kvp_rdma_ctx_mr_share(void *vctx, void *addr, size_t len, kvp_rdma_mr_t *mr)
{
    return mr_insert(vctx, addr, len, mr, true);
}

void kvp_rdma_ctx_mr_unshare(void *vctx, void *addr)
{
    rdma_ctx_t *ctx = vctx;
    pthread_rwlock_wrlock(&ctx->mr_lock);
    for (size_t i = 0; i < ctx->n_mrs; i++)
        if (ctx->mrs[i].addr == (uintptr_t)addr && ctx->mrs[i].shared) {
            memmove(&ctx->mrs[i], &ctx->mrs[i + 1], (ctx->n_mrs - i - 1) * sizeof(*ctx->mrs));
            ctx->n_mrs--;
            break;
        }
    pthread_rwlock_unlock(&ctx->mr_lock);
}

unsigned kvp_rdma_ctx_cut(void *vctx)
{
    rdma_ctx_t *ctx = vctx;
    unsigned cut = 0;
    pthread_mutex_lock(&ctx->acc_lock);
    for (accepted_t *a = ctx->accepted; a != NULL; a = a->next)
        if (!kvp_rdma_qp_in_error(a->qp)) {
            (void)kvp_rdma_qp_flush(a->qp); /* the error state: no access through it */
            cut++;
        }
    pthread_mutex_unlock(&ctx->acc_lock);
    return cut;
}

/* Take the segment's MR out of the table and deregister it. */
static void seg_unregister(rdma_ctx_t *ctx)
{
    if (ctx->seg_mr == NULL)
        return;
    pthread_rwlock_wrlock(&ctx->mr_lock);
    for (size_t i = 0; i < ctx->n_mrs; i++) {
        if (ctx->mrs[i].mr == ctx->seg_mr) {
            memmove(&ctx->mrs[i], &ctx->mrs[i + 1], (ctx->n_mrs - i - 1) * sizeof(*ctx->mrs));
            ctx->n_mrs--;
            break;
        }
    }
    pthread_rwlock_unlock(&ctx->mr_lock);
    kvp_rdma_mr_dereg(ctx->seg_mr);
    ctx->seg_mr = NULL;
}

/* Register the segment for remote READ+WRITE, listen for peers; fills the descriptor's
 * rdma endpoint, address and rkey. */
static kvp_status_t rdma_serve(void *vctx, void *base, uint64_t size, kvp_serve_desc_t *desc)
{
    rdma_ctx_t *ctx = vctx;
    char ip[64];
    if (ctx->gate != NULL)
        return KVP_ERR_EXISTS; /* a transfer engine's: no segment */
    if (serve_ip(ctx, ip, sizeof(ip)) != KVP_OK)
        return KVP_ERR_TRANSPORT;
    /* through memory windows: the region opens nothing remotely, its rkey neither; a peer
     * asks the data server for a window per granted extent on its own queue pair */
    ctx->windows = ctx->xfer->rdma_windows != 0; /* KVPOOL_RDMA_WINDOWS: 1 or unbounded */
    const char *dev_name = kvp_rdma_dev_info(ctx->dev)->name;
    if (ctx->windows && ctx->xfer->rdma_windows != KVP_RDMA_WINDOWS_UNBOUNDED &&
        (strncmp(dev_name, "rxe", 3) == 0 || strncmp(dev_name, "siw", 3) == 0)) {
        /* Soft-RoCE's responder checks an access through a window against the region's
         * range, not the window's (rxe_resp.c, check_rkey): its rkey, queue pair, op and
         * lifetime hold, its extent does not */
        KVP_LOG_ERROR("rdma: KVPOOL_RDMA_WINDOWS=1 refused on %s: this device does not keep "
                      "an access through a memory window inside the window's extent; the "
                      "segment is served without windows (KVPOOL_RDMA_WINDOWS=unbounded uses "
                      "them anyway: docs/security.md)",
                      dev_name);
        ctx->windows = false;
    }
    int rc = ctx->windows ? kvp_rdma_mr_reg_windows(ctx->dev, base, size, &ctx->seg_mr)
                          : kvp_rdma_mr_reg(ctx->dev, base, size, true, &ctx->seg_mr);
    if (rc != 0) {
        KVP_LOG_ERROR("rdma: cannot register the segment: %s", kvp_rdma_last_error());
        return rc == -ENOMEM ? KVP_ERR_NOMEM : KVP_ERR_TRANSPORT;
    }
    kvp_status_t st = mr_insert(ctx, base, size, ctx->seg_mr, false);
    if (st != KVP_OK)
        goto err_dereg;
    uint16_t port;
    rc = kvp_rdma_listen(ctx->dev, ip, 0, 128, &ctx->lst, &port);
    if (rc != 0) {
        KVP_LOG_ERROR("rdma: cannot listen on %s: %s", ip, kvp_rdma_last_error());
        st = KVP_ERR_TRANSPORT;
        goto err_remove;
    }
    ctx->seg_pdata = (accept_pdata_t){.magic = CONN_MAGIC,
                                      .version = CONN_VERSION,
                                      .addr = (uintptr_t)base,
                                      .size = size,
                                      .rkey = ctx->windows ? 0 : ctx->seg_mr->rkey};
    if (pthread_create(&ctx->acc_thread, NULL, accept_thread_main, ctx) != 0) {
        st = KVP_ERR_SYSTEM;
        goto err_listen;
    }
    ctx->acc_started = true;
    snprintf(desc->rdma_endpoint, sizeof(desc->rdma_endpoint), "%s:%u", ip, port);
    desc->rdma_addr = (uintptr_t)base;
    desc->rdma_rkey = ctx->windows ? 0 : ctx->seg_mr->rkey;
    desc->rdma_windows = ctx->windows;
    KVP_LOG_INFO("rdma: serving the segment on %s (device %s, %s)", desc->rdma_endpoint,
                 kvp_rdma_dev_info(ctx->dev)->name,
                 ctx->windows ? "through memory windows only" : "one rkey");
    return KVP_OK;

err_listen:
    kvp_rdma_listener_destroy(ctx->lst);
    ctx->lst = NULL;
err_remove:
    seg_unregister(ctx);
    return st;
err_dereg:
    kvp_rdma_mr_dereg(ctx->seg_mr);
    ctx->seg_mr = NULL;
    return st;
}

/* ------------------------------------------------------------ connections */

/* A store's peers share an rpeer by rdma endpoint; a keyed one (a transfer engine's) is its
 * tcp endpoint's within one connection epoch. */
static rpeer_t *rpeer_get_locked(rdma_ctx_t *ctx, const kvp_peer_t *peer)
{
    bool keyed = peer->rdma_endpoint[0] == '\0';
    const char *ep = keyed ? peer->endpoint : peer->rdma_endpoint;
    for (rpeer_t *rp = ctx->peers; rp; rp = rp->next)
        if (rp->keyed == keyed && strcmp(rp->endpoint, ep) == 0 &&
            (!keyed || rp->epoch == peer->conn_epoch))
            return rp;
    rpeer_t *rp = calloc(1, sizeof(*rp));
    if (rp == NULL)
        return NULL;
    snprintf(rp->endpoint, sizeof(rp->endpoint), "%s", ep);
    rp->keyed = keyed;
    rp->epoch = keyed ? peer->conn_epoch : 0;
    pthread_mutex_init(&rp->conn_lock, NULL);
    pthread_mutex_init(&rp->win_lock, NULL);
    rp->win_fd = -1;
    rp->next = ctx->peers;
    ctx->peers = rp;
    return rp;
}

/* Connect one QP to the peer's endpoint and check that the owner serves the
 * segment the descriptor names. */
static kvp_status_t qp_connect_keyed(rdma_ctx_t *ctx, rpeer_t *rp, const kvp_peer_t *peer,
                                     rqp_t **q_p);

static kvp_status_t qp_connect(rdma_ctx_t *ctx, rpeer_t *rp, const kvp_peer_t *peer, rqp_t **q_p)
{
    if (rp->keyed)
        return qp_connect_keyed(ctx, rp, peer, q_p);
    char host[64];
    uint16_t port;
    if (kvp_parse_hostport(peer->rdma_endpoint, host, sizeof(host), &port) != KVP_OK)
        return KVP_ERR_TRANSPORT;
    connect_pdata_t cp = {.magic = CONN_MAGIC, .version = CONN_VERSION};
    size_t cp_len = offsetof(connect_pdata_t, proof);
    if (peer->has_rdma_key) { /* data grants on: prove our principal */
        cp.version = CONN_VERSION_PROOF;
        cp.proof = (kvp_grant_qp_proof_t){
            .segment_id = peer->segment_id, .tag = peer->conn_tag, .time_ms = kvp_grant_now_ms()};
        if (!kvp_grant_random(&cp.proof.nonce, sizeof(cp.proof.nonce)) ||
            !kvp_grant_qp_proof(peer->rdma_key, &cp.proof))
            return KVP_ERR_INTERNAL;
        cp_len = sizeof(cp);
    }
    kvp_rdma_qp_t *qp;
    int rc = kvp_rdma_connect(ctx->dev, host, port, (int)ctx->xfer->timeout_ms, &cp, cp_len, &qp);
    if (rc != 0) {
        KVP_LOG_WARN("rdma: cannot connect to segment %s at %s: %s", peer->name,
                     peer->rdma_endpoint, kvp_rdma_last_error());
        return rc == -ETIMEDOUT ? KVP_ERR_TIMEOUT : KVP_ERR_CONNECT;
    }
    size_t len;
    const accept_pdata_t *ap = kvp_rdma_qp_peer_pdata(qp, &len);
    if (len < sizeof(*ap) || ap->magic != CONN_MAGIC || ap->version != CONN_VERSION) {
        KVP_LOG_WARN("rdma: %s is not a kvpool segment (bad accept data)", peer->rdma_endpoint);
        kvp_rdma_qp_destroy(qp);
        return KVP_ERR_PROTOCOL;
    }
    /* (data grants on, the descriptor has no rkey: the accept's is the one) */
    if (ap->addr != peer->rdma_addr || (peer->rdma_rkey != 0 && ap->rkey != peer->rdma_rkey) ||
        ap->size < peer->size) {
        KVP_LOG_WARN("rdma: %s now serves another segment than %s (restarted?)",
                     peer->rdma_endpoint, peer->name);
        kvp_rdma_qp_destroy(qp);
        return KVP_ERR_SEGMENT_GONE;
    }
    rqp_t *q = calloc(1, sizeof(*q));
    if (q == NULL) {
        kvp_rdma_qp_destroy(qp);
        return KVP_ERR_NOMEM;
    }
    atomic_init(&q->refs, 1);
    q->qp = qp;
    q->rkey = ap->rkey;
    q->remote_qpn = kvp_rdma_qp_remote_num(qp);
    pthread_mutex_init(&q->post_lock, NULL);
    *q_p = q;
    return KVP_OK;
}

/* ------------------------------------------------ keyed peers (rdma_regions.h) */

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

/* Ask the keyed peer for an offer: its table replaces rp's, its token is kept for the next
 * connect. KVP_ERR_UNSUPPORTED: it offers us no rdma (rp->no_rdma from now on).
 * rp->conn_lock held. */
static kvp_status_t offer_take(rdma_ctx_t *ctx, rpeer_t *rp, const kvp_peer_t *peer)
{
    kvp_rdma_offer_t of = {.tab = NULL};
    kvp_status_t st = ctx->xfer->rdma_offer(ctx->xfer->rdma_offer_arg, peer, &of);
    if (st == KVP_ERR_UNSUPPORTED)
        rp->no_rdma = true;
    if (st != KVP_OK) {
        free(of.tab);
        return st;
    }
    free(rp->tab);
    rp->tab = of.tab;
    rp->n_tab = of.n;
    rp->spare =
        (kvp_rdma_token_pdata_t){.magic = KVP_RDMA_TOKEN_MAGIC, .version = KVP_RDMA_TOKEN_VERSION};
    memcpy(rp->spare.token, of.token, sizeof(of.token));
    memcpy(rp->spare_ip, of.ipv4, sizeof(rp->spare_ip));
    rp->spare_port = of.port;
    rp->spare_ms = kvp_now_ms();
    return KVP_OK;
}

/* A keyed peer's queue pair: with the token of an offer (the spare one while it is fresh,
 * else a new offer: the table comes with it). rp->conn_lock held. */
static kvp_status_t qp_connect_keyed(rdma_ctx_t *ctx, rpeer_t *rp, const kvp_peer_t *peer,
                                     rqp_t **q_p)
{
    if (rp->no_rdma)
        return KVP_ERR_TRANSPORT;
    /* a token is good for KVP_DATA_TE_RDMA_TOKEN_MS: take a spare one with half of it left */
    if (rp->spare_ms == 0 || kvp_now_ms() - rp->spare_ms > KVP_DATA_TE_RDMA_TOKEN_MS / 2) {
        kvp_status_t st = offer_take(ctx, rp, peer);
        if (st != KVP_OK)
            return st == KVP_ERR_UNSUPPORTED ? KVP_ERR_TRANSPORT : st;
    }
    kvp_rdma_token_pdata_t cp = rp->spare;
    rp->spare_ms = 0; /* once */
    kvp_rdma_qp_t *qp;
    int rc = kvp_rdma_connect(ctx->dev, rp->spare_ip, rp->spare_port, (int)ctx->xfer->timeout_ms,
                              &cp, sizeof(cp), &qp);
    OPENSSL_cleanse(&cp, sizeof(cp));
    if (rc != 0) {
        KVP_LOG_WARN_LIMITED("rdma: cannot connect to %s at %s:%u: %s", peer->name, rp->spare_ip,
                             rp->spare_port, kvp_rdma_last_error());
        return rc == -ETIMEDOUT ? KVP_ERR_TIMEOUT : KVP_ERR_CONNECT;
    }
    rqp_t *q = calloc(1, sizeof(*q));
    if (q == NULL) {
        kvp_rdma_qp_destroy(qp);
        return KVP_ERR_NOMEM;
    }
    atomic_init(&q->refs, 1);
    q->qp = qp;
    q->remote_qpn = kvp_rdma_qp_remote_num(qp);
    pthread_mutex_init(&q->post_lock, NULL);
    *q_p = q;
    return KVP_OK;
}

/*
 * Before a batch: each op to a keyed peer gets its region's rkey (rkeys[i]) from the peer's
 * table (asked for when there is none, and once more on a miss: the peer may have registered
 * the range since); an op whose range is still in none is handed on (op->pass: the next
 * transport, tcp, where the peer says whether it is out of range or memory it serves
 * staged); a peer that offers no rdma fails its ops with KVP_ERR_TRANSPORT (the transfer
 * engine moves it on), one whose offer fails with that failure.
 */
static void keyed_prepare(rdma_ctx_t *ctx, kvp_xfer_op_t **ops, size_t n, uint32_t *rkeys)
{
    for (size_t i = 0; i < n; i++) {
        rpeer_t *rp = kvp_peer_tp_state(ops[i]->peer, ctx->index);
        if (rp == NULL || !rp->keyed || ops[i]->status != KVP_OK ||
            (i > 0 && ops[i - 1]->peer == ops[i]->peer))
            continue; /* (a run of one peer's ops is done from its first) */
        /* this op and the later ones of its peer, under its lock */
        pthread_mutex_lock(&rp->conn_lock);
        kvp_status_t st = rp->no_rdma ? KVP_ERR_UNSUPPORTED : KVP_OK;
        if (st == KVP_OK && rp->tab == NULL)
            st = offer_take(ctx, rp, ops[i]->peer);
        bool asked = false;
        for (size_t j = i; j < n; j++) {
            kvp_xfer_op_t *op = ops[j];
            if (op->peer != ops[i]->peer || (j > i && op->status != KVP_OK))
                continue;
            if (st != KVP_OK) {
                op->status = st == KVP_ERR_UNSUPPORTED ? KVP_ERR_TRANSPORT : st;
                continue;
            }
            const kvp_data_te_rdma_region_t *e =
                tab_find(rp->tab, rp->n_tab, op->offset, op->length);
            if (e == NULL && !asked) {
                asked = true;
                kvp_status_t as = offer_take(ctx, rp, op->peer);
                if (as == KVP_ERR_UNSUPPORTED) {
                    st = as;
                    j = i - 1; /* every op of the peer fails over */
                    continue;
                }
                if (as == KVP_OK) {
                    j = i - 1; /* from its first op, against the new table */
                    continue;
                }
            }
            if (e == NULL) {
                op->status = KVP_ERR_TRANSPORT;
                op->pass = true;
                continue;
            }
            rkeys[j] = e->rkey;
            op->status = KVP_OK;
        }
        pthread_mutex_unlock(&rp->conn_lock);
    }
}

/* A usable QP in slot `slot` of rp (reconnecting one that failed), with a
 * reference for the caller. */
static kvp_status_t lane_acquire(rdma_ctx_t *ctx, rpeer_t *rp, unsigned slot,
                                 const kvp_peer_t *peer, rqp_t **q_p)
{
    /* per peer: a peer that does not answer stalls only batches to it */
    pthread_mutex_lock(&rp->conn_lock);
    rqp_t *q = rp->slot[slot];
    if (q != NULL) {
        pthread_mutex_lock(&q->post_lock);
        kvp_rdma_qp_poll_cm(q->qp);
        bool bad = kvp_rdma_qp_in_error(q->qp);
        pthread_mutex_unlock(&q->post_lock);
        if (bad || rp->addr != peer->rdma_addr || rp->rkey != peer->rdma_rkey) {
            rp->slot[slot] = NULL;
            rqp_unref(q); /* destroyed once batches still on it are done */
            q = NULL;
        }
    }
    kvp_status_t st = KVP_OK;
    if (q == NULL) {
        /* connect under the peer's lock: concurrent batches to a new peer
         * wait for one connection instead of racing to make several */
        st = qp_connect(ctx, rp, peer, &q);
        if (st == KVP_OK) {
            rp->slot[slot] = q;
            rp->addr = peer->rdma_addr;
            rp->rkey = peer->rdma_rkey;
        }
    }
    if (st == KVP_OK) {
        atomic_fetch_add(&q->refs, 1);
        *q_p = q;
    }
    pthread_mutex_unlock(&rp->conn_lock);
    return st;
}

/* ---------------------------------------------------------------- batches */

/* Build lanes and slices: ops grouped by endpoint, slices round-robin over
 * the endpoint's QPs, each lane's slices contiguous. */
static kvp_status_t batch_build(rdma_ctx_t *ctx, kvp_xfer_op_t **ops, size_t n,
                                const uint32_t *rkeys, rbatch_t *b)
{
    size_t n_slices = 0;
    for (size_t i = 0; i < n; i++)
        if (ops[i]->status == KVP_OK) /* (not one keyed_prepare failed or handed on) */
            n_slices += (ops[i]->length + ctx->slice - 1) / ctx->slice;
    /* lanes: nqp per distinct segment; grown as segments show up */
    size_t lanes_cap = n * ctx->nqp < 64 ? n * ctx->nqp : 64;
    b->lanes = calloc(lanes_cap, sizeof(*b->lanes));
    b->slices = malloc((n_slices ? n_slices : 1) * sizeof(*b->slices));
    uint32_t *lane_of = malloc((n_slices ? n_slices : 1) * sizeof(*lane_of));
    if (b->lanes == NULL || b->slices == NULL || lane_of == NULL) {
        free(lane_of);
        return KVP_ERR_NOMEM;
    }
    /* pass 1: lane of every slice */
    pthread_mutex_lock(&ctx->lock);
    size_t k = 0;
    unsigned rr = 0;
    rpeer_t *last_rp = NULL;
    size_t last_base = 0;
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = ops[i];
        if (op->status != KVP_OK)
            continue;
        rpeer_t *rp = rpeer_get_locked(ctx, op->peer);
        if (rp == NULL) {
            pthread_mutex_unlock(&ctx->lock);
            free(lane_of);
            return KVP_ERR_NOMEM;
        }
        size_t base;
        if (rp == last_rp && b->lanes[last_base].peer == op->peer) {
            base = last_base;
        } else {
            base = SIZE_MAX;
            for (size_t l = 0; l < b->n_lanes; l += ctx->nqp)
                if (b->lanes[l].peer == op->peer)
                    base = l;
            if (base == SIZE_MAX) {
                if (b->n_lanes + ctx->nqp > lanes_cap) {
                    size_t cap = lanes_cap * 2 + ctx->nqp;
                    lane_t *t = realloc(b->lanes, cap * sizeof(*t));
                    if (t == NULL) {
                        pthread_mutex_unlock(&ctx->lock);
                        free(lane_of);
                        return KVP_ERR_NOMEM;
                    }
                    b->lanes = t;
                    lanes_cap = cap;
                }
                base = b->n_lanes;
                for (unsigned q = 0; q < ctx->nqp; q++)
                    b->lanes[base + q] = (lane_t){.rp = rp,
                                                  .keyed = rp->keyed,
                                                  .slot = q,
                                                  .peer = op->peer,
                                                  .beg = 0,
                                                  .end = 0};
                b->n_lanes += ctx->nqp;
            }
            last_rp = rp;
            last_base = base;
        }
        uint32_t lkey = lkey_of(ctx, op->local);
        for (uint64_t off = 0; off < op->length; off += ctx->slice) {
            uint64_t len = op->length - off < ctx->slice ? op->length - off : ctx->slice;
            uint32_t lane = (uint32_t)(base + rr++ % ctx->nqp);
            lane_of[k] = lane;
            b->slices[k++] = (rslice_t){.op = op,
                                        .off = off,
                                        .len = (uint32_t)len,
                                        .lane = lane,
                                        .lkey = lkey,
                                        .rkey = rp->keyed ? rkeys[i] : 0};
            b->lanes[lane].end++; /* count for now */
        }
    }
    pthread_mutex_unlock(&ctx->lock);
    /* pass 2: counting sort by lane */
    uint32_t at = 0;
    for (size_t l = 0; l < b->n_lanes; l++) {
        uint32_t cnt = b->lanes[l].end;
        b->lanes[l].beg = b->lanes[l].next = at;
        b->lanes[l].end = at; /* grows back while placing */
        at += cnt;
    }
    rslice_t *sorted = malloc((n_slices ? n_slices : 1) * sizeof(*sorted));
    if (sorted == NULL) {
        free(lane_of);
        return KVP_ERR_NOMEM;
    }
    for (size_t i = 0; i < n_slices; i++)
        sorted[b->lanes[lane_of[i]].end++] = b->slices[i];
    free(b->slices);
    free(lane_of);
    b->slices = sorted;
    b->n_slices = n_slices;
    b->chains = calloc(n_slices ? n_slices : 1, sizeof(*b->chains));
    return b->chains ? KVP_OK : KVP_ERR_NOMEM;
}

static void batch_free(rbatch_t *b)
{
    for (size_t i = 0; i < b->n_lanes; i++)
        free(b->lanes[i].win);
    free(b->slices);
    free(b->chains);
    free(b->lanes);
    free(b);
}

/* Fail a lane's unposted slices. done_lock held. */
static void lane_fail_rest(rbatch_t *b, lane_t *l, kvp_status_t st)
{
    for (; l->next < l->end; l->next++)
        op_fail(b->slices[l->next].op, st);
    l->dead = true;
}

/* Post as much of the lane as its QP and the CQ take. Returns true if it
 * posted anything. done_lock NOT held. */
static bool lane_post(rdma_ctx_t *ctx, rbatch_t *b, lane_t *l)
{
    bool posted = false;
    while (!l->dead && l->next < l->end) {
        /* skip slices of ops that already failed */
        pthread_mutex_lock(&ctx->done_lock);
        while (l->next < l->end && b->slices[l->next].op->status != KVP_OK)
            l->next++;
        uint32_t beg = l->next;
        /* a chain: up to KVP_RDMA_MAX_CHAIN slices of one kind (READ or WRITE) */
        enum kvp_xfer_kind kind = beg < l->end ? b->slices[beg].op->kind : KVP_XFER_READ;
        uint32_t n = 0;
        while (n < KVP_RDMA_MAX_CHAIN && beg + n < l->end && b->slices[beg + n].op->kind == kind)
            n++;
        bool cq_room = ctx->wr_inflight + n <= ctx->cq_depth;
        if (cq_room && n > 0)
            ctx->wr_inflight += n; /* reserve */
        pthread_mutex_unlock(&ctx->done_lock);
        if (n == 0 || !cq_room)
            break;
        kvp_rdma_wr_t wrs[KVP_RDMA_MAX_CHAIN];
        rchain_t *ch = &b->chains[b->n_chains];
        *ch = (rchain_t){
            .b = b, .lane = (uint32_t)(l - b->lanes), .beg = beg, .end = beg + n, .nwr = n};
        for (uint32_t i = 0; i < n; i++) {
            rslice_t *s = &b->slices[beg + i];
            s->chain = ch;
            wrs[i] = (kvp_rdma_wr_t){.local = (char *)s->op->local + s->off,
                                     .lkey = s->lkey,
                                     .len = s->len,
                                     .remote = s->op->peer->rdma_addr + s->op->offset + s->off,
                                     .rkey = l->windows || l->keyed ? s->rkey : l->q->rkey,
                                     .wr_id = (uintptr_t)s};
        }
        kvp_rdma_op_t op = kind == KVP_XFER_READ ? KVP_RDMA_READ : KVP_RDMA_WRITE;
        pthread_mutex_lock(&l->q->post_lock);
        size_t k = 0;
        int rc = kvp_rdma_post_chain(l->q->qp, op, wrs, n, &k);
        pthread_mutex_unlock(&l->q->post_lock);
        pthread_mutex_lock(&ctx->done_lock);
        if (k > 0) {
            /* all of it, or (post failure) its first k WRs as a chain of
             * their own that the device completes (flushed) */
            ch->end = beg + (uint32_t)k;
            ch->nwr = (uint32_t)k;
            ctx->wr_inflight -= n - (uint32_t)k;
            b->n_chains++;
            b->chains_out++;
            l->out++;
            l->next = beg + (uint32_t)k;
            posted = true;
        } else {
            ctx->wr_inflight -= n;
        }
        if (rc != 0) {
            if (rc == -EAGAIN) {
                pthread_mutex_unlock(&ctx->done_lock);
                break;
            }
            /* -ENOTCONN (QP in error) or a post failure: this lane is done;
             * the next batch reconnects */
            lane_fail_rest(b, l, rc == -ENOTCONN ? KVP_ERR_CONNECT : KVP_ERR_IO);
        }
        pthread_mutex_unlock(&ctx->done_lock);
    }
    return posted;
}

/* ------------------------------------------------------ memory windows (client) */

/* One BIND request: entries [first, first + n) of lane l's windows. */
typedef struct win_req {
    lane_t *l;
    uint32_t first, n;
} win_req_t;

/* How long the windows' next step may wait: what is left of timeout_ms since the batch's
 * last progress (a queue pair connected, an answer read), as the tcp transport's
 * no-progress clock; 0: nothing left. */
static uint32_t win_left(const rdma_ctx_t *ctx, uint64_t progress_ms)
{
    uint64_t now = kvp_now_ms(), end = progress_ms + ctx->xfer->timeout_ms;
    return now < end ? (uint32_t)(end - now) : 0;
}

/* The HELLO'd connection to rp's data server that windows are asked for on, its receive
 * timeout set to `left` ms (win_lock held). */
static kvp_status_t win_conn(rpeer_t *rp, const kvp_peer_t *peer, uint32_t left)
{
    if (left == 0)
        return KVP_ERR_TIMEOUT;
    if (rp->win_fd >= 0) {
        kvp_sock_set_timeout(rp->win_fd, left);
        return KVP_OK;
    }
    char host[256];
    uint16_t port;
    kvp_status_t st = kvp_parse_hostport(peer->endpoint, host, sizeof(host), &port);
    int fd = -1;
    if (st == KVP_OK)
        st = kvp_tcp_connect(host, port, left, &fd);
    if (st == KVP_OK && (st = kvp_data_hello_prove(fd, peer, left)) != KVP_OK)
        close(fd);
    if (st == KVP_OK)
        rp->win_fd = fd;
    return st;
}

static void win_close(rpeer_t *rp)
{
    if (rp->win_fd >= 0)
        close(rp->win_fd);
    rp->win_fd = -1;
}

/* Send one BIND for ops[0..n) (one kind, one source of grants) on fd: the entries, then the
 * grants as the tcp transport sends them (wire.h). */
static kvp_status_t win_send(int fd, uint32_t qpn, kvp_xfer_op_t *const *ops, uint32_t n)
{
    kvp_data_vec_t vec[KVP_DATA_VEC_MAX];
    kvp_grant_t g[KVP_DATA_VEC_MAX];
    uint32_t idx[KVP_DATA_VEC_MAX];
    kvp_data_req_t h = {.magic = KVP_DATA_MAGIC,
                        .op = ops[0]->kind == KVP_XFER_READ ? KVP_DATA_BIND_READ
                                                            : KVP_DATA_BIND_WRITE,
                        .segment_id = qpn,
                        .offset = n};
    for (uint32_t i = 0; i < n; i++) {
        vec[i] = (kvp_data_vec_t){.segment_id = ops[i]->peer->segment_id,
                                  .offset = ops[i]->offset,
                                  .length = ops[i]->length};
        h.length += ops[i]->length;
        if (ops[0]->grant_set != NULL)
            idx[i] = ops[i]->grant_index;
        else if (ops[0]->grant != NULL)
            memcpy(&g[i], ops[i]->grant, sizeof(g[i]));
    }
    struct iovec iov[4] = {{&h, sizeof(h)}, {vec, n * sizeof(*vec)}};
    int k = 2;
    if (ops[0]->grant_set != NULL) {
        kvp_grant_set_hdr_t sh;
        memcpy(&sh, ops[0]->grant_set, sizeof(sh)); /* its length checked by the planner */
        h.flags = KVP_DATA_F_GRANT_SET;
        iov[k++] = (struct iovec){(void *)ops[0]->grant_set, kvp_grant_set_len(sh.count)};
        iov[k++] = (struct iovec){idx, n * sizeof(*idx)};
    } else if (ops[0]->grant != NULL) {
        h.flags = KVP_DATA_F_GRANT;
        iov[k++] = (struct iovec){g, n * sizeof(*g)};
    }
    return kvp_sendv_all(fd, iov, k);
}

/* Do ops a and b go in one BIND? */
static bool win_same(const kvp_xfer_op_t *a, const kvp_xfer_op_t *b)
{
    return a->kind == b->kind && a->grant_set == b->grant_set &&
           (a->grant == NULL) == (b->grant == NULL);
}

/* Send the BINDs of lane l (its distinct ops in order, grouped by win_same) on its peer's
 * window connection, each recorded in reqs[*nreq_p]; st is the peer's status so far (once it
 * failed nothing more is sent). Returns the peer's status after. Caller holds rp->win_lock. */
static kvp_status_t lane_windows_send(rdma_ctx_t *ctx, rbatch_t *b, lane_t *l, rpeer_t *rp,
                                      kvp_status_t st, uint64_t progress_ms, win_req_t *reqs,
                                      size_t *nreq_p)
{
    l->windows = true;
    if (l->dead || l->beg == l->end)
        return st;
    /* the lane's distinct ops, in order (an op's slices in a lane are adjacent) */
    uint32_t cnt = 0;
    for (uint32_t s = l->beg; s < l->end; s++)
        cnt += s == l->beg || b->slices[s].op != b->slices[s - 1].op;
    kvp_xfer_op_t **lops = malloc(cnt * sizeof(*lops));
    l->win = calloc(cnt, sizeof(*l->win));
    if (lops == NULL || l->win == NULL) {
        free(lops);
        pthread_mutex_lock(&ctx->done_lock);
        lane_fail_rest(b, l, KVP_ERR_NOMEM);
        pthread_mutex_unlock(&ctx->done_lock);
        return st;
    }
    uint32_t e = 0;
    for (uint32_t s = l->beg; s < l->end; s++) {
        if (s == l->beg || b->slices[s].op != b->slices[s - 1].op)
            lops[e++] = b->slices[s].op;
        b->slices[s].rkey = e - 1; /* its entry, for now */
    }
    l->n_win = cnt;
    if (st == KVP_OK)
        st = win_conn(rp, l->peer, win_left(ctx, progress_ms));
    for (uint32_t f = 0; st == KVP_OK && f < cnt;) {
        uint32_t m = 1;
        while (f + m < cnt && m < KVP_DATA_VEC_MAX && win_same(lops[f], lops[f + m]))
            m++;
        st = win_send(rp->win_fd, l->q->remote_qpn, lops + f, m);
        reqs[(*nreq_p)++] = (win_req_t){.l = l, .first = f, .n = m};
        f += m;
    }
    free(lops);
    return st;
}

/* Read the answer to BIND request `req` into its lane's windows; on a refusal (or st, the
 * peer's status so far, not OK) its ops fail. Returns the peer's status after: a connection
 * that cannot be trusted (or was closed) fails the rest. *progress_ms: bumped by an answer.
 * Caller holds rp->win_lock. */
static kvp_status_t window_answer(rdma_ctx_t *ctx, rbatch_t *b, rpeer_t *rp, const win_req_t *req,
                                  kvp_status_t st, uint64_t *progress_ms)
{
    lane_t *l = req->l;
    kvp_data_resp_t resp;
    kvp_status_t rst = st;
    uint32_t left = win_left(ctx, *progress_ms);
    if (rst == KVP_OK && left == 0)
        rst = KVP_ERR_TIMEOUT;
    else if (rst == KVP_OK)
        kvp_sock_set_timeout(rp->win_fd, left);
    if (rst == KVP_OK)
        rst =
            kvp_recv_all(rp->win_fd, &resp, sizeof(resp)) != KVP_OK || resp.magic != KVP_DATA_MAGIC
                ? KVP_ERR_IO
                : (kvp_status_t)resp.status;
    if (rst == KVP_OK && resp.length != req->n * sizeof(kvp_data_window_t))
        rst = KVP_ERR_PROTOCOL;
    if (rst == KVP_OK && kvp_recv_all(rp->win_fd, &l->win[req->first], resp.length) != KVP_OK)
        rst = KVP_ERR_IO;
    if (rst == KVP_ERR_IO || rst == KVP_ERR_PROTOCOL || rst == KVP_ERR_DENIED ||
        rst == KVP_ERR_TIMEOUT)
        st = rst; /* the connection cannot be trusted (or was closed): the rest fail */
    if (rst == KVP_OK) {
        *progress_ms = kvp_now_ms();
        return st;
    }
    if (rst == KVP_ERR_NOT_FOUND) { /* the owner knows no such QP: connect again */
        pthread_mutex_lock(&l->q->post_lock);
        kvp_rdma_qp_flush(l->q->qp);
        pthread_mutex_unlock(&l->q->post_lock);
        rst = KVP_ERR_CONNECT;
    }
    pthread_mutex_lock(&ctx->done_lock);
    for (uint32_t s = l->beg; s < l->end; s++)
        if (b->slices[s].rkey >= req->first && b->slices[s].rkey < req->first + req->n)
            op_fail(b->slices[s].op, rst);
    pthread_mutex_unlock(&ctx->done_lock);
    for (uint32_t w = req->first; w < req->first + req->n; w++)
        l->win[w] = (kvp_data_window_t){.rkey = 0, .slot = UINT32_MAX};
    return st;
}

/* windows_bind for the lanes [i, j) of one peer, with room for their requests in reqs. */
static void peer_windows_bind(rdma_ctx_t *ctx, rbatch_t *b, size_t i, size_t j, win_req_t *reqs,
                              uint64_t *progress_ms)
{
    rpeer_t *rp = b->lanes[i].rp;
    size_t nreq = 0;
    kvp_status_t st = KVP_OK;
    pthread_mutex_lock(&rp->win_lock);
    for (size_t li = i; li < j; li++)
        st = lane_windows_send(ctx, b, &b->lanes[li], rp, st, *progress_ms, reqs, &nreq);
    /* the answers, in order */
    for (size_t r = 0; r < nreq; r++)
        st = window_answer(ctx, b, rp, &reqs[r], st, progress_ms);
    if (st != KVP_OK) { /* no connection, or one that broke: nothing of the peer goes */
        win_close(rp);
        pthread_mutex_lock(&ctx->done_lock);
        for (size_t l = i; l < j; l++)
            if (!b->lanes[l].dead)
                lane_fail_rest(b, &b->lanes[l], st);
        pthread_mutex_unlock(&ctx->done_lock);
    }
    pthread_mutex_unlock(&rp->win_lock);
    /* the slices' rkeys: their entries' windows */
    for (size_t li = i; li < j; li++) {
        lane_t *l = &b->lanes[li];
        for (uint32_t s = l->beg; l->win != NULL && s < l->end; s++)
            b->slices[s].rkey = l->win[b->slices[s].rkey].rkey;
    }
}

/*
 * Windows for every lane of the batch to a peer that serves through them: per lane, a BIND
 * of its ops (grouped by kind and grant set) to the owner's data server, on the QP the lane
 * uses; the answers' rkeys go to the lane's slices. Every request of a peer is sent before
 * its answers are read (one round trip per peer). An op whose windows are refused fails
 * with the owner's status; a broken connection fails the peer's lanes.
 */
static void windows_bind(rdma_ctx_t *ctx, rbatch_t *b, uint64_t progress_ms)
{
    size_t nreq_cap = b->n_slices + b->n_lanes;
    win_req_t *reqs = NULL;
    for (size_t i = 0; i < b->n_lanes;) {
        size_t j = i + 1;
        while (j < b->n_lanes && b->lanes[j].peer == b->lanes[i].peer)
            j++;
        if (!b->lanes[i].peer->rdma_windows) {
            i = j;
            continue;
        }
        if (reqs == NULL && (reqs = malloc(nreq_cap * sizeof(*reqs))) == NULL) {
            pthread_mutex_lock(&ctx->done_lock);
            for (size_t l = i; l < j; l++)
                lane_fail_rest(b, &b->lanes[l], KVP_ERR_NOMEM);
            pthread_mutex_unlock(&ctx->done_lock);
            i = j;
            continue;
        }
        peer_windows_bind(ctx, b, i, j, reqs, &progress_ms);
        i = j;
    }
    free(reqs);
}

/* The batch is over: its windows go (UNBIND, no answer; what does not reach the owner ends
 * at its grants' expiry). */
static void windows_unbind(rbatch_t *b)
{
    for (size_t i = 0; i < b->n_lanes; i++) {
        lane_t *l = &b->lanes[i];
        if (l->win == NULL || l->q == NULL)
            continue;
        kvp_data_window_t w[KVP_DATA_VEC_MAX];
        rpeer_t *rp = l->rp;
        pthread_mutex_lock(&rp->win_lock);
        for (uint32_t f = 0; rp->win_fd >= 0 && f < l->n_win;) {
            uint32_t m = 0;
            for (; f < l->n_win && m < KVP_DATA_VEC_MAX; f++)
                if (l->win[f].slot != UINT32_MAX)
                    w[m++] = l->win[f];
            if (m == 0)
                break;
            kvp_data_req_t h = {.magic = KVP_DATA_MAGIC,
                                .op = KVP_DATA_UNBIND,
                                .segment_id = l->q->remote_qpn,
                                .offset = m};
            struct iovec iov[2] = {{&h, sizeof(h)}, {w, m * sizeof(*w)}};
            if (kvp_sendv_all(rp->win_fd, iov, 2) != KVP_OK)
                win_close(rp);
        }
        pthread_mutex_unlock(&rp->win_lock);
    }
}

static void rdma_transfer(void *vctx, kvp_xfer_op_t **ops, size_t n)
{
    rdma_ctx_t *ctx = vctx;
    uint64_t progress_ms = kvp_now_ms(); /* the last step that went through (windows) */
    for (size_t i = 0; i < n; i++)
        ops[i]->status = KVP_OK;
    kvp_xfer_crc_writes(ops, n);
    /* keyed peers' ops: their regions' rkeys first (or failed, or handed on) */
    uint32_t *rkeys = NULL;
    if (ctx->xfer->rdma_offer != NULL) {
        rkeys = calloc(n ? n : 1, sizeof(*rkeys));
        if (rkeys != NULL)
            keyed_prepare(ctx, ops, n, rkeys);
    }
    rbatch_t *b = calloc(1, sizeof(*b));
    kvp_status_t st = b == NULL || (ctx->xfer->rdma_offer != NULL && rkeys == NULL)
                          ? KVP_ERR_NOMEM
                          : batch_build(ctx, ops, n, rkeys, b);
    free(rkeys);
    if (st != KVP_OK) {
        for (size_t i = 0; i < n; i++)
            if (ops[i]->status == KVP_OK)
                ops[i]->status = st;
        if (b)
            batch_free(b);
        return;
    }
    /* connect (or reuse) every lane's QP; a peer that cannot be reached
     * fails its ops here, before anything is posted */
    for (size_t i = 0; i < b->n_lanes; i++) {
        lane_t *l = &b->lanes[i];
        if (l->beg == l->end || l->dead)
            continue;
        st = lane_acquire(ctx, l->rp, l->slot, l->peer, &l->q);
        if (st == KVP_OK)
            progress_ms = kvp_now_ms();
        if (st != KVP_OK) {
            pthread_mutex_lock(&ctx->done_lock);
            lane_fail_rest(b, l, st);
            pthread_mutex_unlock(&ctx->done_lock);
            /* the peer's other lanes would fail the same way */
            for (size_t j = i + 1; j < b->n_lanes && b->lanes[j].peer == l->peer; j++) {
                pthread_mutex_lock(&ctx->done_lock);
                lane_fail_rest(b, &b->lanes[j], st);
                pthread_mutex_unlock(&ctx->done_lock);
            }
        }
    }
    windows_bind(ctx, b, progress_ms);
    uint64_t last_progress = 0, last_ms = kvp_now_ms();
    bool flushed = false;
    for (;;) {
        bool pending = false;
        for (size_t i = 0; i < b->n_lanes; i++) {
            lane_t *l = &b->lanes[i];
            if (l->dead || l->next >= l->end)
                continue;
            lane_post(ctx, b, l);
            pending |= !l->dead && l->next < l->end;
        }
        pthread_mutex_lock(&ctx->done_lock);
        if (b->chains_out == 0 && !pending) {
            pthread_mutex_unlock(&ctx->done_lock);
            break;
        }
        if ((b->chains_out > 0 || pending) && b->progress == last_progress)
            done_wait(ctx);
        uint64_t now = kvp_now_ms();
        if (b->progress != last_progress || b->chains_out == 0) {
            /* progress, or nothing of ours on the wire (waiting for room
             * that other batches hold): not a silent peer */
            last_progress = b->progress;
            last_ms = now;
        } else if (!flushed && now - last_ms >= ctx->xfer->timeout_ms) {
            /* the peer stopped answering: stop the device from touching our
             * buffers, fail what is left, collect the flushes */
            flushed = true;
            b->flush_status = KVP_ERR_TIMEOUT;
            for (size_t i = 0; i < b->n_lanes; i++) {
                lane_t *l = &b->lanes[i];
                if (!l->dead)
                    lane_fail_rest(b, l, KVP_ERR_TIMEOUT);
            }
            pthread_mutex_unlock(&ctx->done_lock);
            KVP_LOG_WARN("rdma: no completion for %u ms; flushing the batch's QPs",
                         ctx->xfer->timeout_ms);
            for (size_t i = 0; i < b->n_lanes; i++) {
                pthread_mutex_lock(&ctx->done_lock);
                bool out = b->lanes[i].out > 0;
                pthread_mutex_unlock(&ctx->done_lock);
                if (out) { /* only QPs with our work still on them */
                    pthread_mutex_lock(&b->lanes[i].q->post_lock);
                    kvp_rdma_qp_flush(b->lanes[i].q->qp);
                    pthread_mutex_unlock(&b->lanes[i].q->post_lock);
                }
            }
            last_ms = kvp_now_ms();
            continue;
        } else if (flushed && now - last_ms >= FLUSH_WAIT_MS) {
            /* flushes never came back: keep the batch's memory alive (the
             * completion thread may still see it) and give up on it */
            for (size_t i = 0; i < n; i++)
                op_fail(ops[i], KVP_ERR_TIMEOUT);
            b->orphaned = true;
            b->next = ctx->orphans;
            ctx->orphans = b;
            pthread_mutex_unlock(&ctx->done_lock);
            KVP_LOG_ERROR("rdma: flushed work did not complete within %d ms; abandoning it",
                          FLUSH_WAIT_MS);
            return;
        }
        pthread_mutex_unlock(&ctx->done_lock);
    }
    windows_unbind(b);
    for (size_t i = 0; i < b->n_lanes; i++)
        rqp_unref(b->lanes[i].q);
    batch_free(b);
    kvp_xfer_crc_reads(ops, n);
}

/* --------------------------------------------------------- init / cleanup */

static kvp_status_t rdma_init(kvp_transfer_t *xfer, unsigned index, void **ctx_p)
{
    if (xfer->forced == KVP_TRANSPORT_AUTO && !kvp_rdma_devices_present()) {
        snprintf(xfer->why, sizeof(xfer->why), "no RDMA device on this host");
        return KVP_ERR_NOT_FOUND;
    }
    rdma_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return KVP_ERR_NOMEM;
    ctx->xfer = xfer;
    ctx->index = index;
    ctx->nqp = xfer->rdma_qps ? xfer->rdma_qps : 2;
    /* KVPOOL_RDMA_QP_CAP, read when the client was created */
    ctx->qp_cap = xfer->rdma_qp_cap > 0 ? xfer->rdma_qp_cap : QP_CAP_DEFAULT;
    if (ctx->nqp > MAX_QPS_PER_PEER)
        ctx->nqp = MAX_QPS_PER_PEER;
    ctx->slice = xfer->rdma_slice ? xfer->rdma_slice : 256 * 1024;
    kvp_rdma_dev_params_t dp = {
        .device_names = xfer->rdma_devices[0] ? xfer->rdma_devices : NULL,
        .ipv4 = xfer->rdma_host[0] ? xfer->rdma_host : NULL,
        .cq_depth = 8192,
        .qp_depth = 256,
    };
    int rc = kvp_rdma_dev_open(&dp, &ctx->dev);
    if (rc != 0) {
        snprintf(xfer->why, sizeof(xfer->why), "%s", kvp_rdma_last_error());
        free(ctx);
        return KVP_ERR_TRANSPORT;
    }
    ctx->cq_depth = kvp_rdma_dev_cq_depth(ctx->dev);
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_init(&ctx->acc_lock, NULL);
    pthread_rwlock_init(&ctx->mr_lock, NULL);
    pthread_mutex_init(&ctx->done_lock, NULL);
    pthread_cond_init(&ctx->done_cond, NULL);
    if (pthread_create(&ctx->cq_thread, NULL, cq_thread_main, ctx) != 0) {
        pthread_cond_destroy(&ctx->done_cond);
        pthread_mutex_destroy(&ctx->done_lock);
        pthread_rwlock_destroy(&ctx->mr_lock);
        pthread_mutex_destroy(&ctx->lock);
        kvp_rdma_dev_close(ctx->dev);
        free(ctx);
        return KVP_ERR_SYSTEM;
    }
    const kvp_rdma_dev_info_t *info = kvp_rdma_dev_info(ctx->dev);
    KVP_LOG_INFO("rdma: device %s port %u, MTU %u, %u QPs per peer, %llu-byte slices", info->name,
                 info->port, info->active_mtu, ctx->nqp, (unsigned long long)ctx->slice);
    *ctx_p = ctx;
    return KVP_OK;
}

static void rdma_cleanup(void *vctx)
{
    rdma_ctx_t *ctx = vctx;
    if (ctx == NULL)
        return;
    atomic_store(&ctx->stop, true);
    if (ctx->acc_started)
        pthread_join(ctx->acc_thread, NULL);
    if (ctx->ext_free != NULL)
        ctx->ext_free(ctx->ext); /* a transfer engine's serving: its regions deregistered */
    kvp_grant_verifier_cleanup(&ctx->acc_v);
    while (ctx->accepted) {
        accepted_t *a = ctx->accepted;
        ctx->accepted = a->next;
        accepted_free(a);
    }
    kvp_rdma_listener_destroy(ctx->lst);
    pthread_join(ctx->cq_thread, NULL);
    while (ctx->peers) {
        rpeer_t *rp = ctx->peers;
        ctx->peers = rp->next;
        for (unsigned i = 0; i < MAX_QPS_PER_PEER; i++)
            rqp_unref(rp->slot[i]);
        free(rp->tab);
        pthread_mutex_destroy(&rp->conn_lock);
        pthread_mutex_destroy(&rp->win_lock);
        if (rp->win_fd >= 0)
            close(rp->win_fd);
        free(rp);
    }
    while (ctx->orphans) {
        rbatch_t *b = ctx->orphans;
        ctx->orphans = b->next;
        for (size_t i = 0; i < b->n_lanes; i++)
            rqp_unref(b->lanes[i].q);
        batch_free(b);
    }
    seg_unregister(ctx);
    for (size_t i = 0; i < ctx->n_mrs; i++)
        if (!ctx->mrs[i].shared) /* (ext_free took those out) */
            kvp_rdma_mr_dereg(ctx->mrs[i].mr);
    free(ctx->mrs);
    kvp_rdma_dev_close(ctx->dev);
    pthread_cond_destroy(&ctx->done_cond);
    pthread_mutex_destroy(&ctx->done_lock);
    pthread_rwlock_destroy(&ctx->mr_lock);
    pthread_mutex_destroy(&ctx->acc_lock);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

/* A peer that serves its segment over rdma: its connection slots (made now, connected on
 * first use, kept until cleanup as before). */
static kvp_status_t rdma_attach(void *vctx, kvp_peer_t *peer, void **state_p)
{
    rdma_ctx_t *ctx = vctx;
    if (peer->rdma_endpoint[0] == '\0') {
        /* a transfer engine's peer of another host (this host's are "@" peers, shm's) */
        if (ctx->xfer->rdma_offer == NULL || peer->endpoint[0] == '\0' || peer->endpoint[0] == '@')
            return KVP_ERR_TRANSPORT;
        pthread_mutex_lock(&ctx->lock);
        rpeer_t *rp = rpeer_get_locked(ctx, peer);
        if (rp != NULL)
            rp->users++;
        pthread_mutex_unlock(&ctx->lock);
        if (rp == NULL)
            return KVP_ERR_NOMEM;
        *state_p = rp;
        return KVP_OK;
    }
    if ((peer->grants || peer->has_conn_key) && !peer->has_rdma_key)
        return KVP_ERR_TRANSPORT; /* data grants on, and no rdma key for us: tcp */
    if (peer->rdma_windows && !peer->has_conn_key)
        return KVP_ERR_TRANSPORT; /* windows are asked for on a proven connection: tcp */
    pthread_mutex_lock(&ctx->lock);
    rpeer_t *rp = rpeer_get_locked(ctx, peer);
    pthread_mutex_unlock(&ctx->lock);
    if (rp == NULL)
        return KVP_ERR_NOMEM;
    *state_p = rp;
    return KVP_OK;
}

static void rdma_detach(void *vctx, kvp_peer_t *peer, void *state)
{
    rdma_ctx_t *ctx = vctx;
    (void)peer;
    rpeer_t *rp = state; /* a store's: shared by endpoint, lives until cleanup */
    if (rp == NULL || !rp->keyed)
        return;
    /* a keyed one's last peer is gone (no batch of it runs): its queue pairs and table go
     * (the engine took a new peer, of a new epoch, whose rpeer proves the target anew) */
    pthread_mutex_lock(&ctx->lock);
    bool last = --rp->users == 0;
    pthread_mutex_unlock(&ctx->lock);
    if (!last)
        return;
    pthread_mutex_lock(&rp->conn_lock);
    for (unsigned i = 0; i < MAX_QPS_PER_PEER; i++) {
        rqp_unref(rp->slot[i]);
        rp->slot[i] = NULL;
    }
    free(rp->tab);
    rp->tab = NULL;
    rp->n_tab = 0;
    rp->spare_ms = 0;
    pthread_mutex_unlock(&rp->conn_lock);
}

const kvp_transport_ops_t kvp_transport_rdma_ops = {
    .name = "rdma",
    .id = KVP_TRANSPORT_RDMA,
    .create = rdma_init,
    .destroy = rdma_cleanup,
    .attach = rdma_attach,
    .detach = rdma_detach,
    .mem_reg = rdma_mem_reg,
    .mem_dereg = rdma_mem_dereg,
    .serve = rdma_serve,
    .windows = rdma_windows,
    .submit = rdma_transfer,
};
