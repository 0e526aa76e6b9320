/*
 * tcp.c - the tcp transport: pipelined, striped, no buffering.
 *
 * Design: a batch is cut into slices of at most tcp_slice bytes; slices are
 * grouped by the peer's endpoint; each group runs on up to tcp_streams
 * connections taken from a per-endpoint pool. The calling thread drives all
 * connections of all groups with one poll() loop: a connection pulls the
 * next slice of its group whenever it has fewer than its depth in flight (PIPE_DEPTH, or
 * its share of a batch of SPREAD_MIN bytes or more),
 * sends the 32-byte header (and a WRITE's payload straight from the
 * caller's buffer, one sendmsg), and receives responses in order (a READ's
 * payload straight into the caller's buffer). The kernel's socket copy is
 * the only copy of object bytes. Dynamic pulling keeps streams balanced.
 *
 * CRC: each slice is checksummed while its bytes are in cache: a READ's as
 * they land (per recv; poll() wakes a connection only once TCP_LOWAT of a
 * payload is queued, SO_RCVLOWAT, so a recv takes a few hundred KiB, not one
 * 64 KiB segment), a WRITE's once the socket has taken its whole request (the
 * CRC goes to the master at PutEnd, not on the wire, so it may come after the
 * bytes: the kernel's copy has just brought them into cache; checksummed
 * before the send, the CRC read them from memory and 4 MiB puts were 7-8 %
 * slower). An op's CRC is its slices' CRCs put together in order with
 * kvp_crc32c_combine, so no second pass over the object is made. Per-batch
 * arrays come from scratches kept on the ctx between calls.
 *
 * Small slices (<= VEC_SMALL) to one endpoint go as chains in one vectored
 * request (READV/WRITEV, docs/protocol.md) with one response: at most KVP_DATA_VEC_MAX
 * entries and tcp_chain bytes (unset: 512 KiB, or tcp_slice when smaller; at least 64
 * KiB; a slice longer than that goes alone). A chain's error status fails every slice in it. A
 * stream holds at most PIPE_DEPTH requests in flight, and from SPREAD_MIN bytes to its peer no
 * more than its share of them (the peer's requests over its streams), so that a batch of a
 * few requests is spread over the streams rather than taken whole by the first to pull.
 *
 * Failure: a connection that errors, closes, or answers garbage fails the
 * slices in flight on it and is discarded; its group's remaining slices go
 * on over the group's other connections. No progress for timeout_ms fails
 * everything left with KVP_ERR_TIMEOUT. Healthy connections go back to
 * the pool. A peer that vanished mid-transfer thus costs at most one
 * timeout, and never yields a half-filled buffer reported as success.
 *
 * Threads: a transfer of at least TCP_THREAD_MIN bytes on two or more connections runs its
 * connections on as many threads (the calling one and workers of the ctx's pool, started
 * once and kept), each its own poll() loop over its share, so that the kernel's copies
 * and the CRCs of the streams run on several cores at once (one thread drove them all
 * before, and was the limit for large objects: issue 29). The slices a group hands out
 * and the ops' statuses are then shared, under the transfer's lock; everything else of a
 * connection is its thread's. A smaller transfer stays on the calling thread (waking a
 * worker costs more than it saves there). From 1 MiB: one thread sending both streams of
 * a 2 MiB batch was its limit (64 KiB x 32 at 48-56 % of the 2-stream pump on a 16-vCPU
 * machine, 77-101 % on two threads; docs/benchmarks.md, "te").
 *
 * Thread: transfer() is called by any client thread; the pool is guarded
 * by ctx->lock, connections are used by one thread at a time.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/transfer/engine.h"
#include "client/transport/hello.h"
#include "client/transport/wire.h"
#include "client/transfer/transport.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/clock.h"
#include "common/grant.h"
#include "common/sock.h"
#include "common/parse.h"
#include "common/rand.h"

#define PIPE_DEPTH 8
/* A transfer of at least this many bytes on two or more connections runs them on as many
 * threads; the workers the ctx keeps for that */
#define TCP_THREAD_MIN (1u << 20)
/* A peer's requests of fewer bytes than this go on its first stream, up to PIPE_DEPTH of them,
 * rather than spread over its streams: spread, 4 KiB x 32 and x 128 batches made 25-35 %
 * fewer objects a second on the 2-vCPU VM (two owner threads woken for a few hundred KiB).
 * From here a batch spread is also one on threads. */
#define SPREAD_MIN TCP_THREAD_MIN
#define TCP_WORKERS_MAX 7
#define POOL_MAX_IDLE 64
/* A new connection an owner closes before it answers the HELLO is tried again so many
 * times (conn_open) */
#define CONN_RETRIES 6u
/* conn_lowat: poll() for a read's payload wakes once this much of it has come */
#define TCP_LOWAT (256u << 10)
#define TCP_LOWAT_MIN (64u << 10)
/* Slices up to this size to one endpoint travel as chains in vectored requests (256 KiB
 * runs alone were a request and a reply each: 256 KiB x 32 at 60-75 % of the pump on a
 * 16-vCPU machine, 77-86 % in chains of two). */
#define VEC_SMALL (256u << 10)
/* Bytes of small slices in one chain unless the client says (kvp_transfer_t.tcp_chain): two
 * or more chains a stream in a batch of a few MiB, so that a stream's pipe does not drain at
 * the end of one request before it gets the next (64 KiB x 32 moved 20-27 % faster than with
 * 1 MiB chains, the engine's and the store's alike; 256 KiB chains were slower again; both
 * measured before a stream's depth was its share, when the first stream took all of such a
 * batch's chains). */
#define CHAIN_BYTES (512u << 10)
/* ... and at least this many, whatever tcp_chain or tcp_slice say */
#define CHAIN_MIN (64u << 10)

typedef struct tcp_pool {
    char endpoint[256];
    uint64_t epoch;          /* the peers' conn_epoch (peer.h) */
    bool retired;            /* a pool of a newer epoch exists: its connections are not kept */
    int idle[POOL_MAX_IDLE]; /* idle connections, a stack (ctx->lock): none allocated per batch */
    unsigned n_idle;
    bool ssd; /* an SSD segment's server: each stream reads the disk one request deep */
    struct tcp_pool *next;
} tcp_pool_t;

/* Streams to an SSD segment at least: its server reads a request's bytes from the disk
 * before it sends them, so the streams are the disk's queue depth (KVP_SSD_IO_DEPTH). */
#define SSD_STREAMS 8u

typedef struct slice {
    kvp_xfer_op_t *op;
    uint64_t off; /* within the op */
    uint64_t len;
    kvp_data_req_t hdr;
    uint32_t crc;     /* CRC32C of [off, off + crc_len) of the op, when it wants one */
    uint64_t crc_len; /* bytes of the slice checksummed so far */
    size_t g;         /* its group */
} slice_t;

/* A transfer's working arrays, kept between calls so that a batch allocates nothing once
 * the pool holds a scratch big enough. One per concurrent transfer. */
typedef struct tcp_scratch {
    size_t cap_slices, cap_groups, cap_conns;
    struct slice *slices;
    struct slice **sorted;
    kvp_data_vec_t *vecs;
    kvp_grant_t *grants; /* grants[i]: slices[i]'s op's grant, when it has one */
    uint32_t *gidx;      /* ... or its extent's index in its op's grant set */
    struct group *groups;
    struct xconn *conns;
    struct pollfd *pfds;
    struct xconn **cptr;  /* the connections in the order the threads take them */
    pthread_mutex_t lock; /* the transfer's shared state when it runs on several threads */
    struct tcp_scratch *next;
} tcp_scratch_t;

/* One thread's share of a transfer's connections (run_conns). */
typedef struct run {
    struct xconn **cs;
    struct pollfd *pfds;
    size_t n;
    uint32_t timeout_ms;
    uint64_t since_ms; /* the last progress before it starts (the batch's connects) */
} run_t;

/* A worker of the ctx's pool: runs the job it is handed, then sets it back to NULL. */
typedef struct tcp_worker {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    run_t *job;
    bool quit;
    struct tcp_worker *next_idle;
} tcp_worker_t;

typedef struct tcp_ctx {
    pthread_mutex_t lock;
    tcp_pool_t *pools;
    tcp_scratch_t *scratch; /* idle scratches */
    kvp_transfer_t *xfer;
    unsigned index; /* ours in the engine's list: a peer's tp_state[index] is its pool */
    tcp_worker_t *workers[TCP_WORKERS_MAX]; /* started on demand, kept (ctx->lock) */
    unsigned n_workers;
    tcp_worker_t *idle_workers;
} tcp_ctx_t;

typedef struct group {
    tcp_pool_t *pool;
    slice_t **slices;     /* this group's slices, in order */
    kvp_data_vec_t *vecs; /* vecs[i]: slices[i] as a vector entry */
    kvp_grant_t *grants;  /* grants[i]: its grant (KVP_DATA_F_GRANT in its header) */
    uint32_t *gidx;       /* gidx[i]: its extent in its grant set (KVP_DATA_F_GRANT_SET) */
    size_t n, next;       /* next: first unassigned */
    unsigned live;        /* live connections */
    unsigned chain;       /* most small slices in one vectored request */
    uint64_t chain_bytes; /* most payload bytes in one vectored request */
    unsigned depth;       /* most requests a stream has in flight: PIPE_DEPTH, or its share */
} group_t;

/* One request on the wire: a single slice (READ/WRITE) or a chain of small ones
 * (READV/WRITEV) whose entries are vec[0..n). */
typedef struct req {
    kvp_data_req_t hdr;
    slice_t **s;
    kvp_data_vec_t *vec;
    kvp_grant_t *grants; /* with KVP_DATA_F_GRANT: n of them */
    uint32_t *gidx;      /* with KVP_DATA_F_GRANT_SET or _SAME: n indices into the set */
    const void *gset;    /* KVP_DATA_F_GRANT_SET: the set sent (gset_len bytes) */
    size_t gset_len;
    unsigned n;
} req_t;

typedef struct xconn {
    int fd;
    group_t *g;
    req_t ring[PIPE_DEPTH];
    unsigned head, count; /* ring[head] is the oldest in flight */
    unsigned sent;        /* how many of the ring are fully sent */
    uint64_t send_off;    /* bytes of ring[head+sent] already sent (header+vector+payload) */
    kvp_data_resp_t resp;
    uint64_t recv_off;      /* bytes of the oldest request's response received */
    const void *gset;       /* the grant set this connection sent last in this transfer (the owner
                               keeps it: later requests naming it send only their indices) */
    pthread_mutex_t *lock;  /* the transfer's, when its connections run on several threads */
    uint64_t first_sent_ns; /* its first request, a read, fully sent (0: not yet, or no read) */
    uint32_t lowat;         /* the socket's SO_RCVLOWAT as last set (conn_lowat) */
    bool timed;             /* that read's answer timed (the peer's read latency) */
    bool fresh;             /* opened for this transfer, nothing answered on it yet */
    bool dead;
} xconn_t;

static tcp_pool_t *pool_get_locked(tcp_ctx_t *ctx, const char *endpoint, uint64_t epoch)
{
    for (tcp_pool_t *p = ctx->pools; p; p = p->next)
        if (strcmp(p->endpoint, endpoint) == 0 && p->epoch == epoch)
            return p;
    tcp_pool_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    /* the endpoint's older pools retire: their idle connections closed, the others closed
     * as they are given back */
    for (tcp_pool_t *o = ctx->pools; o; o = o->next)
        if (strcmp(o->endpoint, endpoint) == 0 && o->epoch < epoch) {
            o->retired = true;
            while (o->n_idle > 0)
                close(o->idle[--o->n_idle]);
        }
    snprintf(p->endpoint, sizeof(p->endpoint), "%s", endpoint);
    p->epoch = epoch;
    p->next = ctx->pools;
    ctx->pools = p;
    return p;
}

/* Is an idle connection still usable? Nothing may wait on it: an end of stream (the owner
 * closed it, e.g. it restarted on the same port) or bytes nobody asked for mean it is not. */
static bool conn_alive(int fd)
{
    char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* A connection to the abstract Unix socket name, whose listener is our uid or root; with no
 * socket timeouts (the streams poll with their own). */
static kvp_status_t unix_open(const char *name, uint32_t timeout_ms, int *fd_p)
{
    int fd, pid;
    uint32_t uid;
    kvp_status_t st = kvp_unix_connect(name, timeout_ms, &fd);
    if (st != KVP_OK)
        return st;
    if (!kvp_unix_peer(fd, &pid, &uid) || (uid != 0 && uid != (uint32_t)getuid())) {
        KVP_LOG_WARN_LIMITED("tcp: @%s is served by another user (pid %d); not used", name, pid);
        close(fd);
        return KVP_ERR_DENIED;
    }
    kvp_sock_set_timeout(fd, 0);
    *fd_p = fd;
    return KVP_OK;
}

/* A new connection to pool's owner, its principal proved (data grants on). An owner at its
 * connection limits (docs/security.md, "Owner data servers") closes a new one before it
 * answers the HELLO: tried again CONN_RETRIES times after a pause from 10 ms doubling
 * (about 0.6 s in all; each pause drawn between half and all of it, so that a burst's
 * threads do not come back together), within the transfer's timeout, then reported;
 * never a request sent on it. Without a HELLO to answer, such a close shows as the first
 * request's I/O error (conn_kill logs it). */
static kvp_status_t conn_open(tcp_ctx_t *ctx, tcp_pool_t *pool, const kvp_peer_t *peer, int *fd_p)
{
    char host[256];
    uint16_t port = 0;
    /* "@NAME": an abstract Unix socket of this host (a transfer engine's shm socket,
     * client/te/te.c), served by the same data server code; its owner must be our uid or root
     * (anyone may bind an abstract name) */
    bool unix_sock = pool->endpoint[0] == '@';
    kvp_status_t st =
        unix_sock ? KVP_OK : kvp_parse_hostport(pool->endpoint, host, sizeof(host), &port);
    if (st != KVP_OK)
        return st;
    uint64_t give_up = kvp_now_ms() + ctx->xfer->timeout_ms;
    for (unsigned attempt = 0;; attempt++) {
        int fd;
        st = unix_sock ? unix_open(pool->endpoint + 1, ctx->xfer->timeout_ms, &fd)
                       : kvp_tcp_connect(host, port, ctx->xfer->timeout_ms, &fd);
        if (st != KVP_OK)
            return st;
        if (!unix_sock)
            kvp_sock_data_congestion(fd);
        if (peer->hello != NULL)
            st = peer->hello(peer->hello_arg, fd, ctx->xfer->timeout_ms);
        if (st == KVP_OK &&
            (!peer->has_conn_key ||
             (st = kvp_data_hello_prove(fd, peer, ctx->xfer->timeout_ms)) == KVP_OK)) {
            *fd_p = fd;
            return KVP_OK;
        }
        close(fd);
        uint64_t pause_us = (10000u << attempt) / 2 + kvp_random_u64() % ((10000u << attempt) / 2);
        if (st != KVP_ERR_IO || attempt == CONN_RETRIES ||
            kvp_now_ms() + pause_us / 1000 >= give_up)
            break;
        struct timespec pause = {.tv_sec = 0, .tv_nsec = (long)pause_us * 1000L};
        nanosleep(&pause, NULL);
    }
    if (st == KVP_ERR_IO)
        KVP_LOG_WARN_LIMITED("tcp: %s closed new connections before it answered their HELLO, "
                             "%u times: it is at its connection limits (its "
                             "kvpool_connections_refused_total), or restarting",
                             pool->endpoint, CONN_RETRIES + 1);
    else if (st != KVP_ERR_SEGMENT_GONE) /* gone: our descriptor is from before a remount */
        KVP_LOG_WARN_LIMITED("tcp: %s did not take our principal's proof: %s", pool->endpoint,
                             kvp_strerror(st));
    return st;
}

/* A connection to pool's owner: an idle one of the pool, else a new one (*fresh_p). */
static kvp_status_t conn_acquire(tcp_ctx_t *ctx, tcp_pool_t *pool, const kvp_peer_t *peer,
                                 int *fd_p, bool *fresh_p)
{
    for (;;) {
        pthread_mutex_lock(&ctx->lock);
        int fd = pool->n_idle > 0 ? pool->idle[--pool->n_idle] : -1;
        pthread_mutex_unlock(&ctx->lock);
        if (fd < 0)
            break;
        if (conn_alive(fd)) {
            *fd_p = fd;
            *fresh_p = false;
            return KVP_OK;
        }
        close(fd); /* dead while idle: take the next, or open one */
    }
    int fd;
    kvp_status_t st = conn_open(ctx, pool, peer, &fd);
    if (st != KVP_OK)
        return st;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    *fd_p = fd;
    *fresh_p = true;
    return KVP_OK;
}

static void conn_release(tcp_ctx_t *ctx, tcp_pool_t *pool, int fd)
{
    pthread_mutex_lock(&ctx->lock);
    if (pool->n_idle < POOL_MAX_IDLE && !pool->retired) {
        pool->idle[pool->n_idle++] = fd;
        fd = -1;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (fd >= 0)
        close(fd);
}

static void slice_fail(slice_t *s, kvp_status_t st)
{
    if (s->op->status == KVP_OK)
        s->op->status = st;
}

static void req_fail(req_t *r, kvp_status_t st)
{
    for (unsigned i = 0; i < r->n; i++)
        slice_fail(r->s[i], st);
}

static void shared_lock(const xconn_t *c)
{
    if (c->lock != NULL)
        pthread_mutex_lock(c->lock);
}

static void shared_unlock(const xconn_t *c)
{
    if (c->lock != NULL)
        pthread_mutex_unlock(c->lock);
}

/* A response's error fails the ops of its request's slices (shared with other streams). */
static void conn_req_fail(xconn_t *c, req_t *r, kvp_status_t st)
{
    shared_lock(c);
    req_fail(r, st);
    shared_unlock(c);
}

static void conn_kill(xconn_t *c, kvp_status_t st)
{
    if (c->dead)
        return;
    if (c->fresh && st == KVP_ERR_IO)
        KVP_LOG_WARN_LIMITED("tcp: %s closed a new connection before its first answer: it is at "
                             "its connection limits (its kvpool_connections_refused_total), or "
                             "restarting; its requests fail (KVP_ERR_IO), no byte of them is "
                             "taken as read",
                             c->g->pool->endpoint);
    shared_lock(c);
    for (unsigned i = 0; i < c->count; i++)
        req_fail(&c->ring[(c->head + i) % PIPE_DEPTH], st);
    c->count = c->sent = 0;
    c->dead = true;
    c->g->live--;
    if (c->g->live == 0) {
        /* nobody left to carry this group's remaining slices */
        for (; c->g->next < c->g->n; c->g->next++)
            slice_fail(c->g->slices[c->g->next], st);
    }
    shared_unlock(c);
    /* Abort it (RST), never a graceful close: the kernel would go on sending what is queued
     * (a write the caller was told failed) once the link heals, after the master may have
     * given its extent to another object. */
    struct linger abort_it = {.l_onoff = 1, .l_linger = 0};
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &abort_it, sizeof(abort_it));
    close(c->fd);
    c->fd = -1;
}

/* The request that starts at the group's slice j: that slice alone, or the chain of small
 * ones of one kind that follows it (how many; *bytes_p: their payload). */
static unsigned req_span(const group_t *g, size_t j, uint64_t *bytes_p)
{
    const slice_t *s0 = g->slices[j];
    uint64_t bytes = s0->len;
    unsigned m = 1;
    if (s0->len <= VEC_SMALL) {
        while (m < g->chain && j + m < g->n) {
            const slice_t *s = g->slices[j + m];
            if (s->len > VEC_SMALL || s->hdr.op != s0->hdr.op || s->hdr.flags != s0->hdr.flags ||
                s->op->grant_set != s0->op->grant_set || bytes + s->len > g->chain_bytes)
                break;
            bytes += s->len;
            m++;
        }
    }
    *bytes_p = bytes;
    return m;
}

/* Next request from the group: one big slice, or a chain of small ones of one kind. A
 * stream holds at most its group's depth in flight, so that the first stream to fill does
 * not take a small batch's every request while the others stay idle. */
static void conn_fill(xconn_t *c)
{
    group_t *g = c->g;
    while (!c->dead && c->count < g->depth) {
        req_t *r = &c->ring[(c->head + c->count) % PIPE_DEPTH];
        shared_lock(c); /* the group's next slices are this stream's */
        size_t j = g->next;
        if (j >= g->n) {
            shared_unlock(c);
            break;
        }
        slice_t *s0 = g->slices[j];
        uint64_t bytes;
        unsigned m = req_span(g, j, &bytes);
        g->next += m;
        shared_unlock(c);
        r->s = &g->slices[j];
        r->vec = &g->vecs[j];
        r->grants = &g->grants[j];
        r->gidx = &g->gidx[j];
        r->n = m;
        if (m == 1)
            r->hdr = s0->hdr;
        else
            r->hdr = (kvp_data_req_t){.magic = KVP_DATA_MAGIC,
                                      .op = s0->hdr.op == KVP_DATA_WRITE ? KVP_DATA_WRITEV
                                                                         : KVP_DATA_READV,
                                      .flags = s0->hdr.flags,
                                      .offset = m,
                                      .length = bytes};
        r->gset = NULL;
        if (r->hdr.flags & KVP_DATA_F_GRANT_SET) {
            if (c->gset == s0->op->grant_set) { /* the owner holds it: name it again */
                r->hdr.flags =
                    (uint16_t)((r->hdr.flags & ~KVP_DATA_F_GRANT_SET) | KVP_DATA_F_GRANT_SAME);
            } else {
                kvp_grant_set_hdr_t h;
                memcpy(&h, s0->op->grant_set, sizeof(h)); /* its length checked by the planner */
                r->gset = s0->op->grant_set;
                r->gset_len = kvp_grant_set_len(h.count);
                c->gset = r->gset;
            }
        }
        c->count++;
    }
}

static bool req_writes(const req_t *r)
{
    return r->hdr.op == KVP_DATA_WRITE || r->hdr.op == KVP_DATA_WRITEV;
}

static bool req_reads(const req_t *r)
{
    return r->hdr.op == KVP_DATA_READ || r->hdr.op == KVP_DATA_READV;
}

/* Append [p, p+len) to an iovec, skipping the first *skip bytes of the request. */
static void iov_add(struct iovec *iov, int *cnt, uint64_t *skip, void *p, uint64_t len)
{
    if (*skip >= len) {
        *skip -= len;
        return;
    }
    iov[*cnt].iov_base = (char *)p + *skip;
    iov[(*cnt)++].iov_len = len - *skip;
    *skip = 0;
}

/* Push out as much of the unsigned requests as the socket takes. */
static void conn_send(xconn_t *c)
{
    struct iovec iov[KVP_DATA_VEC_MAX + 5];
    while (!c->dead && c->sent < c->count) {
        req_t *r = &c->ring[(c->head + c->sent) % PIPE_DEPTH];
        int iovcnt = 0;
        uint64_t skip = c->send_off;
        uint64_t hl = sizeof(r->hdr);
        uint64_t total = hl;
        iov_add(iov, &iovcnt, &skip, &r->hdr, hl);
        if (r->n > 1) {
            iov_add(iov, &iovcnt, &skip, r->vec, r->n * sizeof(*r->vec));
            total += r->n * sizeof(*r->vec);
        }
        if (r->hdr.flags & KVP_DATA_F_GRANT) {
            iov_add(iov, &iovcnt, &skip, r->grants, r->n * sizeof(*r->grants));
            total += r->n * sizeof(*r->grants);
        }
        if (r->hdr.flags & KVP_DATA_F_GRANT_SET) {
            iov_add(iov, &iovcnt, &skip, (void *)r->gset, r->gset_len);
            total += r->gset_len;
        }
        if (r->hdr.flags & (KVP_DATA_F_GRANT_SET | KVP_DATA_F_GRANT_SAME)) {
            iov_add(iov, &iovcnt, &skip, r->gidx, r->n * sizeof(*r->gidx));
            total += r->n * sizeof(*r->gidx);
        }
        for (unsigned i = 0; i < r->n && req_writes(r); i++) {
            slice_t *s = r->s[i];
            iov_add(iov, &iovcnt, &skip, (char *)s->op->local + s->off, s->len);
            total += s->len;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn_kill(c, KVP_ERR_IO);
            return;
        }
        c->send_off += (uint64_t)n;
        if (c->send_off < total)
            return; /* the socket is full */
        c->send_off = 0;
        if (c->sent == 0 && !c->timed && req_reads(r))
            c->first_sent_ns = kvp_now_ns();
        c->sent++;
        /* a write's payload is checksummed now that the socket has it: the kernel's copy
         * has just brought it into this core's cache (checksummed first, the CRC read it
         * from memory and the copy from the cache: 4 MiB puts 7-8 % slower) */
        for (unsigned i = 0; i < r->n && req_writes(r); i++) {
            slice_t *s = r->s[i];
            if (s->op->want_crc && s->crc_len < s->len) {
                s->crc = kvp_crc32c(0, (char *)s->op->local + s->off, s->len);
                s->crc_len = s->len;
            }
        }
    }
}

/* Checksum payload bytes [from, to) of a read request that just landed, while in cache. */
static void req_crc_landed(req_t *r, uint64_t from, uint64_t to)
{
    uint64_t pos = 0;
    for (unsigned i = 0; i < r->n && pos < to; i++) {
        slice_t *s = r->s[i];
        uint64_t a = KVP_MAX(from, pos), b = KVP_MIN(to, pos + s->len);
        if (a < b && s->op->want_crc) {
            s->crc = kvp_crc32c(s->crc, (char *)s->op->local + s->off + (a - pos), b - a);
            s->crc_len += b - a;
        }
        pos += s->len;
    }
}

static void conn_pop(xconn_t *c)
{
    c->fresh = false;
    c->head = (c->head + 1) % PIPE_DEPTH;
    c->count--;
    c->sent--;
    c->recv_off = 0;
}

/* Receive responses (and READ payloads) for sent requests, in order. */
static void conn_recv(xconn_t *c)
{
    struct iovec iov[KVP_DATA_VEC_MAX + 1];
    while (!c->dead && c->sent > 0) {
        req_t *r = &c->ring[c->head];
        uint64_t hl = sizeof(c->resp);
        int iovcnt = 0;
        uint64_t skip = c->recv_off;
        iov_add(iov, &iovcnt, &skip, &c->resp, hl);
        if (c->recv_off >= hl) /* the header is in and said the payload follows */
            for (unsigned i = 0; i < r->n; i++)
                iov_add(iov, &iovcnt, &skip, (char *)r->s[i]->op->local + r->s[i]->off,
                        r->s[i]->len);
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t n = recvmsg(c->fd, &msg, MSG_DONTWAIT);
        if (n == 0) {
            conn_kill(c, KVP_ERR_IO);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn_kill(c, KVP_ERR_IO);
            return;
        }
        if (c->recv_off >= hl)
            req_crc_landed(r, c->recv_off - hl, c->recv_off - hl + (uint64_t)n);
        c->recv_off += (uint64_t)n;
        if (c->recv_off < hl)
            continue;
        if (c->recv_off == hl) {
            if (c->first_sent_ns != 0 && !c->timed) {
                /* the stream's first read answered: how far its owner is, for the order in
                 * which a get tries replicas (object.c) */
                uint64_t now = kvp_now_ns();
                kvp_peer_read_latency(r->s[0]->op->peer, (now - c->first_sent_ns) / 1000,
                                      now / 1000000);
            }
            c->timed = true;
            if (c->resp.magic != KVP_DATA_MAGIC || c->resp.status > 0 ||
                c->resp.status < KVP_STATUS_MIN ||
                (c->resp.status == 0 && req_reads(r) && c->resp.length != r->hdr.length)) {
                KVP_LOG_WARN_LIMITED("tcp: malformed response from %s", c->g->pool->endpoint);
                conn_kill(c, KVP_ERR_PROTOCOL);
                return;
            }
            if (c->resp.status != 0) {
                kvp_status_t st = (kvp_status_t)c->resp.status;
                conn_req_fail(c, r, st);
                /* the server closes after a bad write, and may after a refusal (a peer that
                 * proved nothing: the requests behind it are refused too) */
                bool fatal = req_writes(r) || st == KVP_ERR_DENIED;
                conn_pop(c);
                if (fatal) {
                    conn_kill(c, st == KVP_ERR_DENIED ? st : KVP_ERR_IO);
                    return;
                }
                continue;
            }
        }
        uint64_t total = hl + (req_reads(r) ? r->hdr.length : 0);
        if (c->recv_off < total)
            continue;
        conn_pop(c);
    }
}

/* While a read's payload streams in, poll() wakes this connection only once TCP_LOWAT of it
 * (or what is left of it) is queued: a few large copies per slice instead of one poll, a
 * recvmsg and an EAGAIN per 64 KiB segment the kernel delivers. 1 otherwise (a header). */
static void conn_lowat(xconn_t *c)
{
    uint32_t want = 1;
    if (c->sent > 0 && c->recv_off >= sizeof(c->resp)) {
        const req_t *r = &c->ring[c->head];
        uint64_t left = sizeof(c->resp) + r->hdr.length - c->recv_off;
        if (req_reads(r) && left >= TCP_LOWAT_MIN)
            want = (uint32_t)KVP_MIN(left, (uint64_t)TCP_LOWAT);
    }
    if (want != c->lowat && setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) == 0)
        c->lowat = want;
}

/* Take an idle scratch with room for the batch, growing one if needed (NULL: no memory). */
static tcp_scratch_t *scratch_get(tcp_ctx_t *ctx, size_t n_slices, size_t n_groups, size_t n_conns)
{
    pthread_mutex_lock(&ctx->lock);
    tcp_scratch_t *sc = ctx->scratch;
    if (sc != NULL)
        ctx->scratch = sc->next;
    pthread_mutex_unlock(&ctx->lock);
    if (sc == NULL) {
        if ((sc = calloc(1, sizeof(*sc))) == NULL)
            return NULL;
        pthread_mutex_init(&sc->lock, NULL);
    }
    if (sc->cap_slices < n_slices) {
        free(sc->slices);
        free(sc->sorted);
        free(sc->vecs);
        free(sc->grants);
        free(sc->gidx);
        sc->slices = malloc(n_slices * sizeof(*sc->slices));
        sc->sorted = malloc(n_slices * sizeof(*sc->sorted));
        sc->vecs = malloc(n_slices * sizeof(*sc->vecs));
        sc->grants = malloc(n_slices * sizeof(*sc->grants));
        sc->gidx = malloc(n_slices * sizeof(*sc->gidx));
        sc->cap_slices =
            sc->slices && sc->sorted && sc->vecs && sc->grants && sc->gidx ? n_slices : 0;
    }
    if (sc->cap_groups < n_groups) {
        free(sc->groups);
        sc->groups = malloc(n_groups * sizeof(*sc->groups));
        sc->cap_groups = sc->groups ? n_groups : 0;
    }
    if (sc->cap_conns < n_conns) {
        free(sc->conns);
        free(sc->pfds);
        free(sc->cptr);
        sc->conns = malloc(n_conns * sizeof(*sc->conns));
        sc->pfds = malloc(n_conns * sizeof(*sc->pfds));
        sc->cptr = malloc(n_conns * sizeof(*sc->cptr));
        sc->cap_conns = sc->conns && sc->pfds && sc->cptr ? n_conns : 0;
    }
    if (sc->cap_slices < n_slices || sc->cap_groups < n_groups || sc->cap_conns < n_conns) {
        pthread_mutex_lock(&ctx->lock);
        sc->next = ctx->scratch;
        ctx->scratch = sc;
        pthread_mutex_unlock(&ctx->lock);
        return NULL;
    }
    return sc;
}

static void scratch_put(tcp_ctx_t *ctx, tcp_scratch_t *sc)
{
    pthread_mutex_lock(&ctx->lock);
    sc->next = ctx->scratch;
    ctx->scratch = sc;
    pthread_mutex_unlock(&ctx->lock);
}

static void scratch_free(tcp_scratch_t *sc)
{
    free(sc->slices);
    free(sc->sorted);
    free(sc->vecs);
    free(sc->grants);
    free(sc->gidx);
    free(sc->groups);
    free(sc->conns);
    free(sc->pfds);
    free(sc->cptr);
    pthread_mutex_destroy(&sc->lock);
    free(sc);
}

/* ---- running the connections: on the calling thread, or on several ---- */

/* Drive connections cs[0..n) until none has work left or nothing moved for timeout_ms
 * (then every request still in flight fails with KVP_ERR_TIMEOUT). */
static void run_conns(run_t *run)
{
    xconn_t **cs = run->cs;
    struct pollfd *pfds = run->pfds;
    size_t n = run->n;
    uint64_t last_progress = run->since_ms;
    for (;;) {
        nfds_t np = 0;
        for (size_t c = 0; c < n; c++) {
            xconn_t *x = cs[c];
            conn_fill(x);
            conn_send(x);
            if (x->dead || x->count == 0) {
                pfds[c].fd = -1;
                continue;
            }
            if (x->sent > 0)
                conn_lowat(x);
            pfds[c].fd = x->fd;
            pfds[c].events =
                (short)((x->sent > 0 ? POLLIN : 0) | (x->sent < x->count ? POLLOUT : 0));
            pfds[c].revents = 0;
            np++;
        }
        if (np == 0)
            break;
        uint64_t idle = kvp_now_ms() - last_progress;
        int timeout = idle >= run->timeout_ms ? 0 : (int)(run->timeout_ms - idle);
        int rc = poll(pfds, n, timeout);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0) {
            if (rc == 0 || kvp_now_ms() - last_progress >= run->timeout_ms) {
                KVP_LOG_WARN_LIMITED("tcp: no progress for %u ms; failing the rest of the batch",
                                     run->timeout_ms);
                for (size_t c = 0; c < n; c++)
                    if (!cs[c]->dead && cs[c]->count > 0)
                        conn_kill(cs[c], KVP_ERR_TIMEOUT);
                break;
            }
            continue;
        }
        last_progress = kvp_now_ms();
        for (size_t c = 0; c < n; c++) {
            if (pfds[c].fd < 0 || pfds[c].revents == 0)
                continue;
            if (pfds[c].revents & (POLLIN | POLLERR | POLLHUP))
                conn_recv(cs[c]);
            if (pfds[c].revents & POLLOUT)
                conn_send(cs[c]);
        }
    }
}

static void *worker_main(void *arg)
{
    tcp_worker_t *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->job == NULL && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit)
            break;
        run_t *job = w->job;
        pthread_mutex_unlock(&w->mu);
        run_conns(job);
        pthread_mutex_lock(&w->mu);
        w->job = NULL;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* An idle worker of the pool, started if none is idle and the pool has room; NULL: none
 * (the caller runs that share itself). */
static tcp_worker_t *worker_take(tcp_ctx_t *ctx)
{
    pthread_mutex_lock(&ctx->lock);
    tcp_worker_t *w = ctx->idle_workers;
    if (w != NULL) {
        ctx->idle_workers = w->next_idle;
        pthread_mutex_unlock(&ctx->lock);
        return w;
    }
    if (ctx->n_workers == TCP_WORKERS_MAX || (w = calloc(1, sizeof(*w))) == NULL) {
        pthread_mutex_unlock(&ctx->lock);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    /* the library's threads take no signals: the application's own handlers stay where
     * it put them */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&w->th, NULL, worker_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        pthread_mutex_unlock(&ctx->lock);
        return NULL;
    }
    ctx->workers[ctx->n_workers++] = w;
    pthread_mutex_unlock(&ctx->lock);
    return w;
}

static void worker_give(tcp_worker_t *w, run_t *job)
{
    pthread_mutex_lock(&w->mu);
    w->job = job;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Wait for w's job to end, then put it back in the pool. */
static void worker_join_job(tcp_ctx_t *ctx, tcp_worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->job != NULL)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&ctx->lock);
    w->next_idle = ctx->idle_workers;
    ctx->idle_workers = w;
    pthread_mutex_unlock(&ctx->lock);
}

/* Run the transfer's n connections: on threads = min(n, workers to be had + 1) threads,
 * connection c on thread c % threads (streams of one group spread over them), when the
 * transfer moves at least TCP_THREAD_MIN bytes; else all on the calling thread. */
static void run_transfer(tcp_ctx_t *ctx, tcp_scratch_t *sc, size_t n, uint64_t bytes,
                         uint64_t since_ms)
{
    uint32_t timeout_ms = ctx->xfer->timeout_ms;
    tcp_worker_t *w[TCP_WORKERS_MAX];
    size_t nw = 0;
    if (n >= 2 && bytes >= TCP_THREAD_MIN) {
        while (nw + 1 < n && nw < TCP_WORKERS_MAX && (w[nw] = worker_take(ctx)) != NULL)
            nw++;
    }
    size_t T = nw + 1, k = 0;
    run_t runs[TCP_WORKERS_MAX + 1];
    for (size_t t = 0; t < T; t++) {
        runs[t] = (run_t){.cs = &sc->cptr[k],
                          .pfds = &sc->pfds[k],
                          .timeout_ms = timeout_ms,
                          .since_ms = since_ms};
        for (size_t c = t; c < n; c += T) {
            sc->conns[c].lock = T > 1 ? &sc->lock : NULL;
            sc->cptr[k++] = &sc->conns[c];
            runs[t].n++;
        }
    }
    for (size_t i = 0; i < nw; i++)
        worker_give(w[i], &runs[i + 1]);
    run_conns(&runs[0]);
    for (size_t i = 0; i < nw; i++)
        worker_join_job(ctx, w[i]);
}

static kvp_status_t tcp_init(kvp_transfer_t *xfer, unsigned index, void **ctx_p)
{
    tcp_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return KVP_ERR_NOMEM;
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->xfer = xfer;
    ctx->index = index;
    *ctx_p = ctx;
    return KVP_OK;
}

static void tcp_cleanup(void *arg)
{
    tcp_ctx_t *ctx = arg;
    if (ctx == NULL)
        return;
    /* no transfer runs now: every worker is idle, waiting for a job */
    for (unsigned i = 0; i < ctx->n_workers; i++) {
        tcp_worker_t *w = ctx->workers[i];
        pthread_mutex_lock(&w->mu);
        w->quit = true;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->th, NULL);
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
    }
    tcp_pool_t *p = ctx->pools;
    while (p) {
        tcp_pool_t *pn = p->next;
        for (unsigned i = 0; i < p->n_idle; i++)
            close(p->idle[i]);
        free(p);
        p = pn;
    }
    while (ctx->scratch) {
        tcp_scratch_t *sn = ctx->scratch->next;
        scratch_free(ctx->scratch);
        ctx->scratch = sn;
    }
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

/* Check each op's extent against its segment (an op outside gets KVP_ERR_OUT_OF_RANGE, the
 * others KVP_OK) and count the slices of the ops that move. */
static size_t ops_check(kvp_xfer_op_t **ops, size_t n, uint64_t slice_len)
{
    size_t n_slices = 0;
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = ops[i];
        /* The whole extent inside the segment before any byte moves: the server checks each
         * slice alone, so a slice past the end would fail after the ones before it landed, and
         * an extent that wraps past 2^64 would land its later slices at the segment's start. */
        if (op->offset > op->peer->size || op->length > op->peer->size - op->offset) {
            op->status = KVP_ERR_OUT_OF_RANGE;
            continue;
        }
        op->status = KVP_OK;
        n_slices += (op->length + slice_len - 1) / slice_len;
    }
    return n_slices;
}

/* Slice the ops into sc->slices, giving each distinct endpoint a group in sc->groups (counted
 * in *n_groups_p; *bytes_p: the bytes to move). Returns the number of slices. */
static size_t ops_slice(tcp_ctx_t *ctx, tcp_scratch_t *sc, kvp_xfer_op_t **ops, size_t n,
                        uint64_t slice_len, size_t *n_groups_p, uint64_t *bytes_p)
{
    group_t *groups = sc->groups;
    size_t n_groups = 0, k = 0;
    uint64_t total_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = ops[i];
        if (op->status != KVP_OK)
            continue; /* out of range: nothing sent */
        /* the peer's connection pool, found when tcp attached it */
        tcp_pool_t *pool = kvp_peer_tp_state(op->peer, ctx->index);
        if (pool == NULL) {
            op->status = KVP_ERR_NOMEM;
            continue;
        }
        size_t g = 0;
        total_bytes += op->length;
        while (g < n_groups && groups[g].pool != pool)
            g++;
        if (g == n_groups)
            groups[n_groups++] = (group_t){.pool = pool};
        for (uint64_t off = 0; off < op->length; off += slice_len) {
            slice_t *s = &sc->slices[k++];
            s->op = op;
            s->off = off;
            s->len = KVP_MIN(slice_len, op->length - off);
            s->hdr = (kvp_data_req_t){.magic = KVP_DATA_MAGIC,
                                      .op = (uint16_t)op->kind,
                                      .flags = op->grant != NULL       ? KVP_DATA_F_GRANT
                                               : op->grant_set != NULL ? KVP_DATA_F_GRANT_SET
                                                                       : 0,
                                      .segment_id = op->peer->segment_id,
                                      .offset = op->offset + off,
                                      .length = s->len};
            s->crc = 0;
            s->crc_len = 0;
            s->g = g;
            groups[g].n++;
        }
    }
    *n_groups_p = n_groups;
    *bytes_p = total_bytes;
    return k;
}

/* Lay each group's k slices out contiguously in sc->sorted (with their vector entries,
 * grants and grant indexes beside them), keeping order. */
static void groups_lay_out(tcp_scratch_t *sc, size_t n_groups, size_t k)
{
    group_t *groups = sc->groups;
    slice_t *slices = sc->slices;
    size_t base = 0;
    for (size_t g = 0; g < n_groups; g++) {
        groups[g].slices = &sc->sorted[base];
        groups[g].vecs = &sc->vecs[base];
        groups[g].grants = &sc->grants[base];
        groups[g].gidx = &sc->gidx[base];
        base += groups[g].n;
        groups[g].n = 0;
    }
    for (size_t s = 0; s < k; s++) {
        group_t *gr = &groups[slices[s].g];
        gr->vecs[gr->n] = (kvp_data_vec_t){.segment_id = slices[s].hdr.segment_id,
                                           .offset = slices[s].hdr.offset,
                                           .length = slices[s].len};
        if (slices[s].op->grant != NULL) /* 80 bytes of the master's, next to its entry */
            memcpy(&gr->grants[gr->n], slices[s].op->grant, sizeof(kvp_grant_t));
        gr->gidx[gr->n] = slices[s].op->grant_index;
        gr->slices[gr->n++] = &slices[s];
    }
}

/* Open each group's streams into sc->conns (counted in *n_conns_p); a group that reaches its
 * owner on none fails its slices. Returns the time of the last progress, in ms: the batch's
 * no-progress clock starts here, as opening a stream (connect, HELLO) to an owner that does
 * not answer uses up the same timeout as a transfer that stalls, so a silent owner costs one
 * timeout, not one per step. */
static uint64_t groups_connect(tcp_ctx_t *ctx, tcp_scratch_t *sc, size_t n_groups,
                               size_t max_streams, uint64_t chain_bytes, size_t *n_conns_p)
{
    kvp_transfer_t *xfer = ctx->xfer;
    group_t *groups = sc->groups;
    size_t n_conns = 0;
    uint64_t last_progress = kvp_now_ms();
    for (size_t g = 0; g < n_groups; g++) {
        size_t streams = groups[g].pool->ssd ? max_streams : (size_t)xfer->tcp_streams;
        size_t want = KVP_MIN(streams, groups[g].n);
        /* chains sized so that each stream gets about one: fewest requests, streams busy */
        size_t per = (groups[g].n + KVP_MAX(want, 1) - 1) / KVP_MAX(want, 1);
        groups[g].chain = (unsigned)KVP_MIN(per, (size_t)KVP_DATA_VEC_MAX);
        groups[g].chain_bytes = KVP_MAX(chain_bytes, CHAIN_MIN); /* a slice over it: alone */
        kvp_status_t last = KVP_OK;
        for (size_t c = 0; c < want; c++) {
            int fd;
            bool fresh;
            last = conn_acquire(ctx, groups[g].pool, groups[g].slices[0]->op->peer, &fd, &fresh);
            if (last != KVP_OK)
                break;
            last_progress = kvp_now_ms(); /* a stream opened (and proved): progress */
            sc->conns[n_conns] = (xconn_t){.fd = fd, .g = &groups[g], .lowat = 1, .fresh = fresh};
            groups[g].live++;
            n_conns++;
        }
        /* each stream's share of the group's requests (over the streams that opened), at most
         * PIPE_DEPTH in flight: with PIPE_DEPTH each, the first stream took all of a batch of
         * a few chains (64 KiB x 32: four of 512 KiB) and the second stayed idle. A group of
         * less than SPREAD_MIN bytes still goes that way, on the first stream */
        size_t reqs = 0;
        uint64_t group_bytes = 0;
        for (size_t j = 0; j < groups[g].n; reqs++) {
            uint64_t bytes;
            j += req_span(&groups[g], j, &bytes);
            group_bytes += bytes;
        }
        size_t streams_open = KVP_MAX((size_t)groups[g].live, 1);
        size_t share =
            group_bytes < SPREAD_MIN ? PIPE_DEPTH : (reqs + streams_open - 1) / streams_open;
        groups[g].depth = (unsigned)KVP_MAX(KVP_MIN(share, (size_t)PIPE_DEPTH), 1);
        if (groups[g].live == 0) {
            KVP_LOG_WARN_LIMITED("tcp: cannot reach %s: %s", groups[g].pool->endpoint,
                                 kvp_strerror(last));
            for (; groups[g].next < groups[g].n; groups[g].next++)
                slice_fail(groups[g].slices[groups[g].next], last);
        }
    }
    *n_conns_p = n_conns;
    return last_progress;
}

/* Give the transfer's live connections back to their pools. */
static void conns_release(tcp_ctx_t *ctx, tcp_scratch_t *sc, size_t n_conns)
{
    xconn_t *conns = sc->conns;
    for (size_t c = 0; c < n_conns; c++) {
        if (conns[c].dead)
            continue;
        if (conns[c].lowat != 1) { /* pooled connections wake at the first byte */
            uint32_t one = 1;
            setsockopt(conns[c].fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof(one));
        }
        conn_release(ctx, conns[c].g->pool, conns[c].fd);
    }
}

/* An op's slices lie in order in `slices`: put their CRCs together. */
static void ops_crc(kvp_xfer_op_t **ops, size_t n, const slice_t *slices, size_t k)
{
    for (size_t i = 0; i < n; i++)
        if (ops[i]->want_crc)
            ops[i]->crc = 0;
    for (size_t s = 0; s < k; s++) {
        kvp_xfer_op_t *op = slices[s].op;
        if (op->want_crc && op->status == KVP_OK) {
            assert(slices[s].crc_len == slices[s].len);
            op->crc = kvp_crc32c_combine(op->crc, slices[s].crc, slices[s].len);
        }
    }
}

static void tcp_transfer(void *arg, kvp_xfer_op_t **ops, size_t n)
{
    tcp_ctx_t *ctx = arg;
    kvp_transfer_t *xfer = ctx->xfer;
    uint64_t slice_len = xfer->tcp_slice;
    size_t n_slices = ops_check(ops, n, slice_len);
    /* at most one group per op, and tcp_streams connections per group */
    size_t max_streams = KVP_MAX((size_t)xfer->tcp_streams, (size_t)SSD_STREAMS);
    tcp_scratch_t *sc =
        scratch_get(ctx, n_slices + 1, n + 1, KVP_MIN(n_slices, n * max_streams) + 1);
    if (sc == NULL) {
        for (size_t i = 0; i < n; i++)
            ops[i]->status = KVP_ERR_NOMEM;
        return;
    }
    size_t n_groups, n_conns;
    uint64_t total_bytes;
    size_t k = ops_slice(ctx, sc, ops, n, slice_len, &n_groups, &total_bytes);
    groups_lay_out(sc, n_groups, k);
    uint64_t chain = xfer->tcp_chain ? xfer->tcp_chain : KVP_MIN(slice_len, CHAIN_BYTES);
    uint64_t last_progress = groups_connect(ctx, sc, n_groups, max_streams, chain, &n_conns);
    run_transfer(ctx, sc, n_conns, total_bytes, last_progress);
    conns_release(ctx, sc, n_conns);
    ops_crc(ops, n, sc->slices, k);
    scratch_put(ctx, sc);
}

/* Any peer with a tcp endpoint; its state is the connection pool of that endpoint and
 * connection epoch (peers of one endpoint and epoch share it; pools live as long as the
 * transport). */
static kvp_status_t tcp_attach(void *arg, kvp_peer_t *peer, void **state_p)
{
    tcp_ctx_t *ctx = arg;
    if (peer->endpoint[0] == '\0')
        return KVP_ERR_TRANSPORT;
    pthread_mutex_lock(&ctx->lock);
    tcp_pool_t *pool = pool_get_locked(ctx, peer->endpoint, peer->conn_epoch);
    pthread_mutex_unlock(&ctx->lock);
    if (pool == NULL)
        return KVP_ERR_NOMEM;
    if (peer->ssd)
        pool->ssd = true; /* set once, before any transfer to it (attach comes first) */
    *state_p = pool;
    return KVP_OK;
}

const kvp_transport_ops_t kvp_transport_tcp_ops = {
    .name = "tcp",
    .id = KVP_TRANSPORT_TCP,
    .create = tcp_init,
    .destroy = tcp_cleanup,
    .attach = tcp_attach,
    .submit = tcp_transfer,
};
