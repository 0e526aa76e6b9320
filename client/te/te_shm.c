/*
 * te_shm.c - the transfer engine's one-copy shm path, a transport (te_shm.h).
 */
#include "client/te/te_shm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include "client/include/kvpool_te.h"
#include "client/te/te_copy.h"
#include "client/te/te_lease.h"
#include "client/transfer/engine.h"
#include "client/transfer/xfer.h"
#include "client/transport/wire.h"
#include "common/log.h"
#include "common/sock.h"

typedef struct te_shm {
    kvp_te_tp_cfg_t cfg;
    unsigned index; /* ours in the engine's list: a peer's tp_state[index] is its state */
    kvp_te_copy_t *_Atomic copy; /* the copy threads, made at the first copy */
} te_shm_t;

/* A peer's one-copy connection: one batch at a time. */
typedef struct te_shm_peer {
    pthread_mutex_t lock;
    int fd, pid;           /* the connection (-1: none) and the target's pid on it */
    kvp_te_lease_t *lease; /* the target's standing lease on fd (te_lease.h); NULL: none */
    bool lease_asked;      /* on this fd */
    bool lease_never;      /* the target does not know the lease frame: never asked again */
    char name[256];        /* the peer's, for the logs */
} te_shm_peer_t;

/* The copy threads (KVPOOL_TE_COPY_THREADS, default 2), made at the first copy. */
static kvp_te_copy_t *copy_pool(te_shm_t *s)
{
    kvp_te_copy_t *c = atomic_load(&s->copy);
    if (c != NULL)
        return c;
    kvp_te_copy_t *mine = kvp_te_copy_create(s->cfg.copy_threads), *none = NULL;
    if (mine == NULL || atomic_compare_exchange_strong(&s->copy, &none, mine))
        return mine;
    kvp_te_copy_destroy(mine); /* another thread made it first */
    return none;
}

/* sp's one-copy connection is done with (broken, or its peer gone): closed, its lease
 * (if any) dropped with it. sp->lock held. */
static void cma_drop(te_shm_peer_t *sp)
{
    if (sp->fd >= 0)
        close(sp->fd);
    sp->fd = -1;
    kvp_te_lease_unmap(sp->lease);
    sp->lease = NULL;
    sp->lease_asked = false;
}

/* Ask sp's target for a standing lease on its fresh connection (wire.h, KVP_DATA_TE_CMA_LEASE). A
 * refusal leaves us asking per batch; a target that does not know the frame (it answers
 * KVP_ERR_PROTOCOL and closes) is not asked again, its connection dropped (sp->lock held). */
static void lease_ask(te_shm_peer_t *sp)
{
    sp->lease_asked = true;
    kvp_data_req_t req = {.magic = KVP_DATA_MAGIC,
                          .op = KVP_DATA_TE_CMA,
                          .flags = KVP_DATA_TE_CMA_LEASE,
                          .segment_id = KVP_TE_SEGMENT_ID};
    kvp_data_resp_t r;
    int fds[2];
    size_t nfd = 0;
    kvp_status_t st = kvp_send_all(sp->fd, &req, sizeof(req));
    if (st == KVP_OK)
        st = kvp_unix_recv_fds(sp->fd, &r, sizeof(r), fds, 2, &nfd);
    if (st == KVP_OK && r.magic == KVP_DATA_MAGIC && r.status == KVP_OK && nfd == 2) {
        if (kvp_te_lease_map(fds[0], fds[1], &sp->lease) != KVP_OK)
            KVP_LOG_WARN_LIMITED("transfer engine: %s sent a lease we cannot use; it is asked "
                                 "per batch",
                                 sp->name);
        return;
    }
    for (size_t i = 0; i < nfd; i++)
        close(fds[i]);
    if (st == KVP_OK && r.magic == KVP_DATA_MAGIC &&
        (r.status == KVP_ERR_UNSUPPORTED || r.status == KVP_ERR_DENIED))
        return; /* not offered: per batch (a denied peer is refused there too) */
    /* the connection is no good now; a target that does not know the frame said so */
    if (st == KVP_OK && r.magic == KVP_DATA_MAGIC && r.status == KVP_ERR_PROTOCOL) {
        sp->lease_never = true;
        KVP_LOG_INFO("transfer engine: %s grants no standing lease (an older engine): its "
                     "one-copy batches ask it per batch",
                     sp->name);
    }
    cma_drop(sp);
}

/* Has the peer of a connection of ours closed it (its process gone)? */
static bool peer_hung_up(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

/* The status of a one-copy batch whose copy ended with errno err. */
static kvp_status_t cma_status(te_shm_peer_t *sp, bool write, int32_t err)
{
    if (err == 0)
        return KVP_OK;
    if (err != EPERM)
        return KVP_ERR_IO;
    KVP_LOG_WARN("transfer engine: the kernel refused process_vm_%s to %s (pid %d: "
                 "EPERM; Yama ptrace_scope, or the target is not dumpable): its "
                 "transfers go over its Unix socket from now on",
                 write ? "writev" : "readv", sp->name, sp->pid);
    return KVP_ERR_TRANSPORT;
}

/* Ranges [0, n) to sp over the one-copy path: with the target's standing lease
 * (te_lease.h) when every range lies in what it leased, the whole batch at once; else over
 * TE_CMA (wire.h), up to KVP_TE_CMA_VEC_MAX per request: the target checks them and lets us
 * at its memory. Either way we copy with process_vm_writev / readv (one kernel copy, split
 * over the engine's copy threads: te_copy.c). *moved_p: how many ranges moved.
 * KVP_ERR_TRANSPORT: the kernel refused (EPERM) or the target declines; the rest goes over
 * the next transport (the socket frames). */
static kvp_status_t cma_transfer(te_shm_t *s, te_shm_peer_t *sp, const kvp_peer_t *peer, bool write,
                                 size_t n, void *const *locals, const uint64_t *remotes,
                                 const uint64_t *lens, size_t *moved_p)
{
    *moved_p = 0;
    kvp_status_t st = KVP_OK;
    pthread_mutex_lock(&sp->lock);
    kvp_te_copy_t *pool = copy_pool(s);
    if (pool == NULL)
        st = KVP_ERR_NOMEM;
    if (st == KVP_OK && sp->fd >= 0 && sp->lease != NULL && peer_hung_up(sp->fd))
        cma_drop(sp); /* its pid may be another process's soon: connect anew first */
    for (int connects = 0; *moved_p < n && st == KVP_OK;) {
        size_t base = *moved_p;
        if (sp->fd < 0) {
            if (connects++ == 2) { /* connected twice and lost it each time */
                st = KVP_ERR_IO;
                break;
            }
            if ((st = s->cfg.dial(s->cfg.dial_arg, peer, &sp->fd, &sp->pid)) != KVP_OK)
                break;
        }
        if (s->cfg.lease && !sp->lease_asked && !sp->lease_never) {
            lease_ask(sp);
            if (sp->fd < 0)
                continue;
        }
        kvp_te_lease_go_t go = sp->lease == NULL ? KVP_TE_LEASE_ASK
                                                 : kvp_te_lease_begin(sp->lease, remotes + base,
                                                                      lens + base, n - base);
        if (go == KVP_TE_LEASE_REVOKED) { /* the target closed our connection: anew */
            cma_drop(sp);
            continue;
        }
        if (go == KVP_TE_LEASE_GO) {
            uint64_t total = 0;
            for (size_t i = base; i < n; i++)
                total += lens[i];
            int32_t err = kvp_te_copy_run(pool, sp->pid, write, locals + base, remotes + base,
                                          lens + base, n - base);
            kvp_te_lease_end(sp->lease, err == 0, write ? KVP_TE_WRITE : KVP_TE_READ, n - base,
                             total);
            if ((st = cma_status(sp, write, err)) == KVP_OK)
                *moved_p = n;
            continue;
        }
        size_t m = n - base < KVP_TE_CMA_VEC_MAX ? n - base : KVP_TE_CMA_VEC_MAX;
        kvp_data_vec_t v[KVP_TE_CMA_VEC_MAX];
        uint64_t total = 0;
        for (size_t i = 0; i < m; i++) {
            v[i] = (kvp_data_vec_t){.segment_id = KVP_TE_SEGMENT_ID,
                                    .offset = remotes[base + i],
                                    .length = lens[base + i]};
            total += lens[base + i];
        }
        kvp_data_req_t req = {.magic = KVP_DATA_MAGIC,
                              .op = KVP_DATA_TE_CMA,
                              .flags = write ? KVP_DATA_TE_CMA_WRITE : 0,
                              .segment_id = KVP_TE_SEGMENT_ID,
                              .offset = m,
                              .length = total};
        struct iovec hv[2] = {{.iov_base = &req, .iov_len = sizeof(req)},
                              {.iov_base = v, .iov_len = m * sizeof(v[0])}};
        kvp_data_resp_t r;
        st = kvp_sendv_all(sp->fd, hv, 2);
        if (st == KVP_OK)
            st = kvp_recv_all(sp->fd, &r, sizeof(r));
        if (st == KVP_OK && (r.magic != KVP_DATA_MAGIC || r.length != 0))
            st = KVP_ERR_PROTOCOL;
        if (st != KVP_OK) {
            cma_drop(sp);
            break;
        }
        if (r.status != KVP_OK) { /* refused: the connection goes on */
            st = kvp_status_from_wire(r.status);
            if (st == KVP_ERR_UNSUPPORTED) { /* the target declines the one-copy path */
                st = KVP_ERR_TRANSPORT;
                KVP_LOG_INFO("transfer engine: %s declines the one-copy shm path (another "
                             "principal, not this host, or its device memory): its transfers "
                             "go over its Unix socket",
                             sp->name);
            }
            break;
        }
        int32_t err =
            kvp_te_copy_run(pool, sp->pid, write, locals + base, remotes + base, lens + base, m);
        if (kvp_send_all(sp->fd, &err, sizeof(err)) != KVP_OK) {
            /* the target let go before it heard we were done (its frame's deadline): what
             * we copied may have landed after its ranges were given back: not moved */
            cma_drop(sp);
            st = KVP_ERR_IO;
            break;
        }
        if ((st = cma_status(sp, write, err)) == KVP_OK)
            *moved_p = base + m;
    }
    if (st == KVP_ERR_TRANSPORT)
        cma_drop(sp); /* the peer moves to the next transport: its connection and lease go */
    pthread_mutex_unlock(&sp->lock);
    return st;
}

/* ---- the transport ---- */

static kvp_status_t shm_create(kvp_transfer_t *xfer, unsigned index, void **ctx_p)
{
    if (xfer->own_cfg == NULL)
        return KVP_ERR_NOT_FOUND; /* not a transfer engine's */
    te_shm_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVP_ERR_NOMEM;
    s->cfg = *(const kvp_te_tp_cfg_t *)xfer->own_cfg;
    s->index = index;
    *ctx_p = s;
    return KVP_OK;
}

static void shm_destroy(void *ctx)
{
    te_shm_t *s = ctx;
    kvp_te_copy_destroy(atomic_load(&s->copy));
    free(s);
}

/* Only a peer on its engine's Unix socket. */
static kvp_status_t shm_attach(void *ctx, kvp_peer_t *peer, void **state_p)
{
    (void)ctx;
    if (peer->endpoint[0] != '@')
        return KVP_ERR_TRANSPORT;
    te_shm_peer_t *sp = calloc(1, sizeof(*sp));
    if (sp == NULL)
        return KVP_ERR_NOMEM;
    pthread_mutex_init(&sp->lock, NULL);
    sp->fd = -1;
    snprintf(sp->name, sizeof(sp->name), "%s", peer->name);
    *state_p = sp;
    return KVP_OK;
}

static void shm_detach(void *ctx, kvp_peer_t *peer, void *state)
{
    (void)ctx;
    (void)peer;
    te_shm_peer_t *sp = state;
    cma_drop(sp);
    pthread_mutex_destroy(&sp->lock);
    free(sp);
}

/* A run of ops [0, n) to one peer, in one direction, at most KVP_TE_CMA_VEC_MAX. */
static void shm_run(te_shm_t *s, kvp_xfer_op_t **ops, size_t n)
{
    kvp_peer_t *peer = ops[0]->peer;
    te_shm_peer_t *sp = kvp_peer_tp_state(peer, s->index);
    void *locals[KVP_TE_CMA_VEC_MAX];
    uint64_t remotes[KVP_TE_CMA_VEC_MAX], lens[KVP_TE_CMA_VEC_MAX];
    for (size_t i = 0; i < n; i++) {
        locals[i] = ops[i]->local;
        remotes[i] = ops[i]->offset;
        lens[i] = ops[i]->length;
    }
    size_t moved;
    kvp_status_t st =
        cma_transfer(s, sp, peer, ops[0]->kind == KVP_XFER_WRITE, n, locals, remotes, lens, &moved);
    for (size_t i = 0; i < n; i++)
        ops[i]->status = i < moved ? KVP_OK : st;
}

static void shm_submit(void *ctx, kvp_xfer_op_t **ops, size_t n)
{
    te_shm_t *s = ctx;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && j - i < KVP_TE_CMA_VEC_MAX && ops[j]->peer == ops[i]->peer &&
               ops[j]->kind == ops[i]->kind)
            j++;
        shm_run(s, ops + i, j - i);
        i = j;
    }
}

const kvp_transport_ops_t kvp_te_shm_ops = {
    .name = "te-shm-cma",
    .id = KVP_TRANSPORT_SHM,
    .create = shm_create,
    .destroy = shm_destroy,
    .attach = shm_attach,
    .detach = shm_detach,
    .submit = shm_submit,
};
