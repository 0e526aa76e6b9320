/*
 * tcp.c - the tcp transport: pipelined, striped, no buffering.
 *
 * Design: a batch is cut into slices of at most tcp_slice bytes; slices are
 * grouped by the peer's endpoint; each group runs on up to tcp_streams
 * connections taken from a per-endpoint pool. The calling thread drives all
 * connections of all groups with one poll() loop: a connection pulls the
 * next slice of its group whenever it has fewer than PIPE_DEPTH in flight,
 * sends the 32-byte header (and a WRITE's payload straight from the
 * caller's buffer, one sendmsg), and receives responses in order (a READ's
 * payload straight into the caller's buffer). The kernel's socket copy is
 * the only copy of object bytes. Dynamic pulling keeps streams balanced.
 *
 * Failure: a connection that errors, closes, or answers garbage fails the
 * slices in flight on it and is discarded; its group's remaining slices go
 * on over the group's other connections. No progress for timeout_ms fails
 * everything left with KVP_ERR_TIMEOUT. Healthy connections go back to
 * the pool. A peer that vanished mid-transfer thus costs at most one
 * timeout, and never yields a half-filled buffer reported as success.
 *
 * Thread: transfer() is called by any client thread; the pool is guarded
 * by ctx->lock, connections are used by one thread at a time.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/internal.h"
#include "client/transfer/transport.h"
#include "common/log.h"
#include "common/util.h"

#define PIPE_DEPTH 8
#define POOL_MAX_IDLE 64

typedef struct pooled_conn {
    int fd;
    struct pooled_conn *next;
} pooled_conn_t;

typedef struct tcp_pool {
    char endpoint[256];
    pooled_conn_t *idle;
    unsigned n_idle;
    struct tcp_pool *next;
} tcp_pool_t;

typedef struct tcp_ctx {
    pthread_mutex_t lock;
    tcp_pool_t *pools;
    kvp_transfer_t *xfer;
} tcp_ctx_t;

typedef struct slice {
    kvp_xfer_op_t *op;
    uint64_t off; /* within the op */
    uint64_t len;
    kvp_data_req_t hdr;
} slice_t;

typedef struct group {
    tcp_pool_t *pool;
    slice_t **slices; /* this group's slices, in order */
    size_t n, next;   /* next: first unassigned */
    unsigned live;    /* live connections */
} group_t;

typedef struct xconn {
    int fd;
    group_t *g;
    slice_t *ring[PIPE_DEPTH];
    unsigned head, count; /* ring[head] is the oldest in flight */
    unsigned sent;        /* how many of the ring are fully sent */
    uint64_t send_off;    /* bytes of ring[head+sent] already sent (header+payload) */
    kvp_data_resp_t resp;
    uint64_t recv_off; /* bytes of the oldest slice's response received */
    bool dead;
} xconn_t;

static tcp_pool_t *pool_get_locked(tcp_ctx_t *ctx, const char *endpoint)
{
    for (tcp_pool_t *p = ctx->pools; p; p = p->next)
        if (strcmp(p->endpoint, endpoint) == 0)
            return p;
    tcp_pool_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    snprintf(p->endpoint, sizeof(p->endpoint), "%s", endpoint);
    p->next = ctx->pools;
    ctx->pools = p;
    return p;
}

static kvp_status_t conn_acquire(tcp_ctx_t *ctx, tcp_pool_t *pool, int *fd_p)
{
    pthread_mutex_lock(&ctx->lock);
    pooled_conn_t *pc = pool->idle;
    if (pc != NULL) {
        pool->idle = pc->next;
        pool->n_idle--;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (pc != NULL) {
        *fd_p = pc->fd;
        free(pc);
        return KVP_OK;
    }
    char host[256];
    uint16_t port;
    kvp_status_t st = kvp_parse_hostport(pool->endpoint, host, sizeof(host), &port);
    if (st != KVP_OK)
        return st;
    int fd;
    st = kvp_tcp_connect(host, port, ctx->xfer->timeout_ms, &fd);
    if (st != KVP_OK)
        return st;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    *fd_p = fd;
    return KVP_OK;
}

static void conn_release(tcp_ctx_t *ctx, tcp_pool_t *pool, int fd)
{
    pooled_conn_t *pc = malloc(sizeof(*pc));
    pthread_mutex_lock(&ctx->lock);
    if (pc != NULL && pool->n_idle < POOL_MAX_IDLE) {
        pc->fd = fd;
        pc->next = pool->idle;
        pool->idle = pc;
        pool->n_idle++;
        pc = NULL;
        fd = -1;
    }
    pthread_mutex_unlock(&ctx->lock);
    free(pc);
    if (fd >= 0)
        close(fd);
}

static void slice_fail(slice_t *s, kvp_status_t st)
{
    if (s->op->status == KVP_OK)
        s->op->status = st;
}

static void conn_kill(xconn_t *c, kvp_status_t st)
{
    if (c->dead)
        return;
    for (unsigned i = 0; i < c->count; i++)
        slice_fail(c->ring[(c->head + i) % PIPE_DEPTH], st);
    c->count = c->sent = 0;
    c->dead = true;
    c->g->live--;
    close(c->fd);
    c->fd = -1;
    if (c->g->live == 0) {
        /* nobody left to carry this group's remaining slices */
        for (; c->g->next < c->g->n; c->g->next++)
            slice_fail(c->g->slices[c->g->next], st);
    }
}

static void conn_fill(xconn_t *c)
{
    group_t *g = c->g;
    while (!c->dead && c->count < PIPE_DEPTH && g->next < g->n) {
        c->ring[(c->head + c->count) % PIPE_DEPTH] = g->slices[g->next++];
        c->count++;
    }
}

/* Push out as much of the unsent requests as the socket takes. */
static void conn_send(xconn_t *c)
{
    while (!c->dead && c->sent < c->count) {
        slice_t *s = c->ring[(c->head + c->sent) % PIPE_DEPTH];
        struct iovec iov[2];
        int iovcnt = 0;
        uint64_t hl = sizeof(s->hdr);
        uint64_t total = hl + (s->hdr.op == KVP_DATA_WRITE ? s->len : 0);
        if (c->send_off < hl) {
            iov[iovcnt].iov_base = (char *)&s->hdr + c->send_off;
            iov[iovcnt++].iov_len = hl - c->send_off;
        }
        if (s->hdr.op == KVP_DATA_WRITE) {
            uint64_t po = c->send_off > hl ? c->send_off - hl : 0;
            iov[iovcnt].iov_base = (char *)s->op->local + s->off + po;
            iov[iovcnt++].iov_len = s->len - po;
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
            return;
        c->send_off = 0;
        c->sent++;
    }
}

/* Receive responses (and READ payloads) for sent requests, in order. */
static void conn_recv(xconn_t *c)
{
    while (!c->dead && c->sent > 0) {
        slice_t *s = c->ring[c->head];
        uint64_t hl = sizeof(c->resp);
        void *dst;
        size_t want;
        if (c->recv_off < hl) {
            dst = (char *)&c->resp + c->recv_off;
            want = hl - c->recv_off;
        } else {
            uint64_t po = c->recv_off - hl;
            dst = (char *)s->op->local + s->off + po;
            want = s->len - po;
        }
        ssize_t n = recv(c->fd, dst, want, MSG_DONTWAIT);
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
        c->recv_off += (uint64_t)n;
        if (c->recv_off < hl)
            continue;
        if (c->recv_off == hl) {
            if (c->resp.magic != KVP_DATA_MAGIC || c->resp.status > 0 ||
                c->resp.status < KVP_STATUS_MIN ||
                (c->resp.status == 0 && s->hdr.op == KVP_DATA_READ && c->resp.length != s->len)) {
                KVP_LOG_WARN("tcp: malformed response from %s", c->g->pool->endpoint);
                conn_kill(c, KVP_ERR_PROTOCOL);
                return;
            }
            if (c->resp.status != 0) {
                slice_fail(s, (kvp_status_t)c->resp.status);
                bool fatal = s->hdr.op == KVP_DATA_WRITE; /* server closes after a bad write */
                c->head = (c->head + 1) % PIPE_DEPTH;
                c->count--;
                c->sent--;
                c->recv_off = 0;
                if (fatal) {
                    conn_kill(c, KVP_ERR_IO);
                    return;
                }
                continue;
            }
        }
        uint64_t total = hl + (s->hdr.op == KVP_DATA_READ ? s->len : 0);
        if (c->recv_off < total)
            continue;
        c->head = (c->head + 1) % PIPE_DEPTH;
        c->count--;
        c->sent--;
        c->recv_off = 0;
    }
}

static kvp_status_t tcp_init(kvp_transfer_t *xfer, unsigned index, void **ctx_p)
{
    (void)index; /* no per-peer state yet: the endpoint pools are found by endpoint */
    tcp_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return KVP_ERR_NOMEM;
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->xfer = xfer;
    *ctx_p = ctx;
    return KVP_OK;
}

static void tcp_cleanup(void *arg)
{
    tcp_ctx_t *ctx = arg;
    if (ctx == NULL)
        return;
    tcp_pool_t *p = ctx->pools;
    while (p) {
        tcp_pool_t *pn = p->next;
        pooled_conn_t *c = p->idle;
        while (c) {
            pooled_conn_t *cn = c->next;
            close(c->fd);
            free(c);
            c = cn;
        }
        free(p);
        p = pn;
    }
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

static void tcp_transfer(void *arg, kvp_xfer_op_t **ops, size_t n)
{
    tcp_ctx_t *ctx = arg;
    kvp_transfer_t *xfer = ctx->xfer;
    uint64_t slice_len = xfer->tcp_slice;
    size_t n_slices = 0;
    kvp_xfer_crc_writes(ops, n);
    for (size_t i = 0; i < n; i++) {
        ops[i]->status = KVP_OK;
        n_slices += (ops[i]->length + slice_len - 1) / slice_len;
    }
    slice_t *slices = malloc(n_slices * sizeof(*slices) + 1);
    slice_t **sorted = malloc(n_slices * sizeof(*sorted) + 1);
    group_t *groups = calloc(n + 1, sizeof(*groups));
    xconn_t *conns = NULL;
    struct pollfd *pfds = NULL;
    size_t n_groups = 0, n_conns = 0;
    if (!slices || !sorted || !groups) {
        for (size_t i = 0; i < n; i++)
            ops[i]->status = KVP_ERR_NOMEM;
        goto out;
    }
    /* slice the ops; give each distinct endpoint a group */
    size_t k = 0;
    pthread_mutex_lock(&ctx->lock);
    for (size_t i = 0; i < n; i++) {
        kvp_xfer_op_t *op = ops[i];
        tcp_pool_t *pool = pool_get_locked(ctx, op->peer->endpoint);
        if (pool == NULL) {
            op->status = KVP_ERR_NOMEM;
            continue;
        }
        size_t g = 0;
        while (g < n_groups && groups[g].pool != pool)
            g++;
        if (g == n_groups)
            groups[n_groups++].pool = pool;
        for (uint64_t off = 0; off < op->length; off += slice_len) {
            slice_t *s = &slices[k++];
            s->op = op;
            s->off = off;
            s->len = KVP_MIN(slice_len, op->length - off);
            s->hdr = (kvp_data_req_t){.magic = KVP_DATA_MAGIC,
                                      .op = (uint16_t)op->kind,
                                      .segment_id = op->peer->segment_id,
                                      .offset = op->offset + off,
                                      .length = s->len};
            groups[g].n++;
        }
    }
    pthread_mutex_unlock(&ctx->lock);
    /* lay each group's slices out contiguously in `sorted`, keeping order */
    size_t base = 0;
    for (size_t g = 0; g < n_groups; g++) {
        groups[g].slices = &sorted[base];
        base += groups[g].n;
        groups[g].n = 0;
    }
    for (size_t s = 0; s < k; s++) {
        for (size_t g = 0; g < n_groups; g++) {
            if (strcmp(groups[g].pool->endpoint, slices[s].op->peer->endpoint) == 0) {
                groups[g].slices[groups[g].n++] = &slices[s];
                break;
            }
        }
    }
    size_t max_conns = 0;
    for (size_t g = 0; g < n_groups; g++)
        max_conns += KVP_MIN((size_t)xfer->tcp_streams, groups[g].n);
    conns = calloc(max_conns + 1, sizeof(*conns));
    pfds = calloc(max_conns + 1, sizeof(*pfds));
    if (!conns || !pfds) {
        for (size_t i = 0; i < n; i++)
            ops[i]->status = KVP_ERR_NOMEM;
        goto out;
    }
    for (size_t g = 0; g < n_groups; g++) {
        size_t want = KVP_MIN((size_t)xfer->tcp_streams, groups[g].n);
        kvp_status_t last = KVP_OK;
        for (size_t c = 0; c < want; c++) {
            int fd;
            last = conn_acquire(ctx, groups[g].pool, &fd);
            if (last != KVP_OK)
                break;
            conns[n_conns] = (xconn_t){.fd = fd, .g = &groups[g]};
            groups[g].live++;
            n_conns++;
        }
        if (groups[g].live == 0) {
            KVP_LOG_WARN("tcp: cannot reach %s: %s", groups[g].pool->endpoint, kvp_strerror(last));
            for (; groups[g].next < groups[g].n; groups[g].next++)
                slice_fail(groups[g].slices[groups[g].next], last);
        }
    }

    uint64_t last_progress = kvp_now_ms();
    for (;;) {
        nfds_t np = 0;
        for (size_t c = 0; c < n_conns; c++) {
            xconn_t *x = &conns[c];
            conn_fill(x);
            conn_send(x);
            if (x->dead || x->count == 0) {
                pfds[c].fd = -1;
                continue;
            }
            pfds[c].fd = x->fd;
            pfds[c].events =
                (short)((x->sent > 0 ? POLLIN : 0) | (x->sent < x->count ? POLLOUT : 0));
            pfds[c].revents = 0;
            np++;
        }
        if (np == 0)
            break;
        int timeout = (int)xfer->timeout_ms;
        int rc = poll(pfds, n_conns, timeout);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0) {
            if (rc == 0 || kvp_now_ms() - last_progress >= xfer->timeout_ms) {
                KVP_LOG_WARN("tcp: no progress for %u ms; failing the rest of the batch",
                             xfer->timeout_ms);
                for (size_t c = 0; c < n_conns; c++)
                    if (!conns[c].dead && conns[c].count > 0)
                        conn_kill(&conns[c], KVP_ERR_TIMEOUT);
                break;
            }
            continue;
        }
        last_progress = kvp_now_ms();
        for (size_t c = 0; c < n_conns; c++) {
            if (pfds[c].fd < 0 || pfds[c].revents == 0)
                continue;
            if (pfds[c].revents & (POLLIN | POLLERR | POLLHUP))
                conn_recv(&conns[c]);
            if (pfds[c].revents & POLLOUT)
                conn_send(&conns[c]);
        }
    }
    for (size_t c = 0; c < n_conns; c++)
        if (!conns[c].dead)
            conn_release(ctx, conns[c].g->pool, conns[c].fd);
out:
    kvp_xfer_crc_reads(ops, n);
    free(pfds);
    free(conns);
    free(groups);
    free(sorted);
    free(slices);
}

/* Any peer with a tcp endpoint; no per-peer state (its pool is found by endpoint per batch). */
static kvp_status_t tcp_attach(void *ctx, kvp_peer_t *peer, void **state_p)
{
    (void)ctx;
    *state_p = NULL;
    return peer->endpoint[0] != '\0' ? KVP_OK : KVP_ERR_TRANSPORT;
}

const kvp_transport_ops_t kvp_transport_tcp_ops = {
    .name = "tcp",
    .id = KVP_TRANSPORT_TCP,
    .create = tcp_init,
    .destroy = tcp_cleanup,
    .attach = tcp_attach,
    .submit = tcp_transfer,
};
