/*
 * mconn.c - the master connection shared by all of a client's threads.
 *
 * Design: a caller packs its request, registers a waiter (on its own stack)
 * under the id it sends, writes the frame under the connection's send lock
 * (one writev of a small frame), and waits. Replies are read by the waiters
 * themselves, one at a time ("leader/follower"): the waiter holding the
 * reader role polls the socket until its own deadline, reads whole frames,
 * and hands each reply to the waiter whose id it carries (signalling that
 * waiter's condition variable). When its own reply arrives it gives the role
 * to another waiter. A lone caller thus reads its own reply with no thread
 * switch, and no lock is held across the network: m->lock guards only the
 * waiter list and the connection pointer, for a few instructions at a time.
 *
 * Connections: at most one current connection (refcounted: callers and the
 * reader hold references while they use its fd). When none is open, the first
 * caller connects (and runs on_ready, which remounts the client's segment)
 * without holding the lock; the others wait for it within their deadlines.
 * A connection that fails (send/recv error, bad frame, EOF) is shut down:
 * every call waiting on it fails with KVP_ERR_IO and is sent once more on a
 * new connection. A call that times out leaves the connection open when
 * other frames arrived meanwhile (its late reply is dropped on arrival);
 * when nothing at all arrived since it was sent, the master is judged stuck
 * and the connection is closed, as before pipelining: the master revokes
 * what was bound to it.
 *
 * Thread: any thread; on_ready runs on the thread that connects.
 */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "client/control/mconn.h"
#include "client/mem/scratch.h"
#include "common/clock.h"
#include "kvpool.pb-c.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/sock.h"

/* One method's calls (kvp_mconn_rpc_stats): bumped with relaxed atomics after each call. */
typedef struct rpc_count {
    _Atomic uint64_t calls, failed, wait_ns;
} rpc_count_t;

typedef struct mc_conn {
    kvp_chan_t *ch;
    int refs; /* m->lock */
    bool broken;
    uint64_t rx_frames; /* m->lock: frames received so far */
    uint64_t rx_ms;     /* m->lock: when the last one came (monotonic ms; 0: none yet) */
    uint64_t gen;       /* m->stats.connects once it was opened */
    pthread_mutex_t send_lock;
} mc_conn_t;

typedef struct waiter {
    uint64_t id;
    uint16_t method;
    mc_conn_t *conn;
    uint64_t rx_at_send; /* conn->rx_frames when the request was sent */
    bool done;
    bool conn_failed; /* ended by the connection failing: may be sent again */
    bool filling;     /* the reader is receiving the body into rx: do not leave */
    bool refused;     /* a frame-level error: rx holds the master's text */
    kvp_status_t st;
    kvp_thread_buf_t *rx; /* the waiting thread's reply buffer */
    size_t len;
    pthread_cond_t cv;
    struct waiter *prev, *next;
} waiter_t;

struct kvp_mconn {
    char host[256];
    uint16_t port;
    uint32_t timeout_ms;
    kvp_mconn_ready_cb_t on_ready;
    void *arg;

    pthread_mutex_t lock;
    pthread_condattr_t cattr; /* CLOCK_MONOTONIC */
    pthread_cond_t conn_cv;   /* a connect attempt ended */
    mc_conn_t *conn;          /* current; NULL: none */
    bool connecting;
    bool reading; /* a waiter holds the reader role */
    kvp_mconn_resolve_cb_t resolve;
    void *resolve_arg;
    uint64_t epoch_max; /* the largest leader epoch a reply carried */
    uint64_t next_id;
    waiter_t *waiters;
    kvp_mconn_stats_t stats;
    kvp_tls_t *tls; /* borrowed; NULL: plain */
    char *token;    /* NULL: none */
    size_t token_len;
    char conn_err[320];                      /* lock: why the last connect failed */
    rpc_count_t rpc[KVP_RPC_METHOD_MAX + 1]; /* by method; no lock */
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A call of `method` that began at t0 (kvp_now_ns) ended with st. */
static void rpc_count(kvp_mconn_t *m, uint16_t method, uint64_t t0, kvp_status_t st)
{
    if (method > KVP_RPC_METHOD_MAX)
        return;
    rpc_count_t *r = &m->rpc[method];
    atomic_fetch_add_explicit(&r->calls, 1, memory_order_relaxed);
    if (st != KVP_OK)
        atomic_fetch_add_explicit(&r->failed, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->wait_ns, kvp_now_ns() - t0, memory_order_relaxed);
}

void kvp_mconn_rpc_stats(kvp_mconn_t *m, unsigned method, uint64_t *calls, uint64_t *failed,
                         uint64_t *wait_ns)
{
    *calls = *failed = *wait_ns = 0;
    if (m == NULL || method > KVP_RPC_METHOD_MAX)
        return;
    const rpc_count_t *r = &m->rpc[method];
    *calls = atomic_load_explicit(&r->calls, memory_order_relaxed);
    *failed = atomic_load_explicit(&r->failed, memory_order_relaxed);
    *wait_ns = atomic_load_explicit(&r->wait_ns, memory_order_relaxed);
}

static struct timespec abs_ts(uint64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    return ts;
}

kvp_status_t kvp_mconn_create(const kvp_mconn_params_t *params, kvp_mconn_t **m_p)
{
    kvp_mconn_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return KVP_ERR_NOMEM;
    snprintf(m->host, sizeof(m->host), "%s", params->host ? params->host : "127.0.0.1");
    m->port = params->port;
    m->timeout_ms = params->timeout_ms ? params->timeout_ms : 5000;
    m->on_ready = params->on_ready;
    m->arg = params->arg;
    m->resolve = params->resolve;
    m->resolve_arg = params->resolve_arg;
    m->tls = params->tls;
    if (params->token != NULL && params->token[0] != '\0') {
        m->token_len = strlen(params->token);
        m->token = strdup(params->token);
        if (m->token == NULL) {
            free(m);
            return KVP_ERR_NOMEM;
        }
    }
    pthread_mutex_init(&m->lock, NULL);
    pthread_condattr_init(&m->cattr);
    pthread_condattr_setclock(&m->cattr, CLOCK_MONOTONIC);
    pthread_cond_init(&m->conn_cv, &m->cattr);
    *m_p = m;
    return KVP_OK;
}

static void conn_unref_locked(mc_conn_t *c)
{
    if (--c->refs > 0)
        return;
    kvp_chan_close(c->ch);
    pthread_mutex_destroy(&c->send_lock);
    free(c);
}

/* The connection failed: wake and fail every call waiting on it, drop it as current. */
static void broken_locked(kvp_mconn_t *m, mc_conn_t *c, kvp_status_t st)
{
    if (c->broken)
        return;
    c->broken = true;
    kvp_chan_shutdown(c->ch); /* wakes a reader polling it; it closes with the last ref */
    for (waiter_t *w = m->waiters; w != NULL; w = w->next)
        if (w->conn == c && !w->done && !w->filling) {
            w->done = true;
            w->conn_failed = true;
            w->st = st;
            pthread_cond_signal(&w->cv);
        }
    if (m->conn == c) {
        m->conn = NULL;
        conn_unref_locked(c);
    }
}

void kvp_mconn_disconnect(kvp_mconn_t *m)
{
    pthread_mutex_lock(&m->lock);
    if (m->conn != NULL)
        broken_locked(m, m->conn, KVP_ERR_IO);
    pthread_mutex_unlock(&m->lock);
}

void kvp_mconn_destroy(kvp_mconn_t *m)
{
    if (m == NULL)
        return;
    kvp_mconn_disconnect(m);
    pthread_cond_destroy(&m->conn_cv);
    pthread_condattr_destroy(&m->cattr);
    pthread_mutex_destroy(&m->lock);
    if (m->token != NULL) {
        OPENSSL_cleanse(m->token, m->token_len);
        free(m->token);
    }
    free(m);
}

kvp_status_t kvp_mconn_ready_call(kvp_mconn_t *m, kvp_chan_t *ch, uint16_t method, const void *body,
                                  size_t len, uint8_t **resp_p, size_t *resp_len_p)
{
    pthread_mutex_lock(&m->lock);
    uint64_t id = ++m->next_id;
    pthread_mutex_unlock(&m->lock);
    return kvp_rpc_chan_call(ch, method, id, body, len, resp_p, resp_len_p);
}

kvp_status_t kvp_mconn_ready_send(kvp_mconn_t *m, kvp_chan_t *ch, uint16_t method, const void *body,
                                  size_t len)
{
    pthread_mutex_lock(&m->lock);
    uint64_t id = ++m->next_id;
    pthread_mutex_unlock(&m->lock);
    return kvp_rpc_chan_send(ch, method, id, body, len);
}

void kvp_mconn_last_error(kvp_mconn_t *m, char *buf, size_t len)
{
    pthread_mutex_lock(&m->lock);
    snprintf(buf, len, "%s", m->conn_err);
    pthread_mutex_unlock(&m->lock);
}

static void set_conn_err(kvp_mconn_t *m, const char *msg)
{
    pthread_mutex_lock(&m->lock);
    snprintf(m->conn_err, sizeof(m->conn_err), "%s", msg);
    pthread_mutex_unlock(&m->lock);
}

/* Auth: the token names our principal (the first request on a connection). */
static kvp_status_t authenticate(kvp_mconn_t *m, kvp_chan_t *ch)
{
    Kvpool__AuthRequest req = KVPOOL__AUTH_REQUEST__INIT;
    req.token.data = (uint8_t *)m->token;
    req.token.len = m->token_len;
    uint8_t body[1024];
    if (kvpool__auth_request__get_packed_size(&req) > sizeof(body)) {
        set_conn_err(m, "KVPOOL_TOKEN is too long (at most 1000 bytes)");
        return KVP_ERR_INVALID_ARG;
    }
    size_t len = kvpool__auth_request__pack(&req, body);
    uint8_t *resp = NULL;
    size_t rlen = 0;
    kvp_status_t st = kvp_mconn_ready_call(m, ch, KVP_RPC_AUTH, body, len, &resp, &rlen);
    OPENSSL_cleanse(body, len);
    if (st == KVP_ERR_DENIED)
        set_conn_err(m, "the master refused the token (KVPOOL_TOKEN): no principal has it");
    else if (st != KVP_OK)
        set_conn_err(m, "the master did not answer the token (Auth)");
    free(resp);
    return st;
}

/* Connect to host:port, TLS and Auth included. */
static kvp_status_t dial(kvp_mconn_t *m, const char *host, uint16_t port, kvp_chan_t **ch_p)
{
    int fd;
    kvp_status_t st = kvp_tcp_connect(host, port, m->timeout_ms, &fd);
    if (st != KVP_OK) {
        char msg[320];
        snprintf(msg, sizeof(msg), "cannot connect to master %s:%u: %s", host, port,
                 kvp_strerror(st));
        set_conn_err(m, msg);
        if (m->resolve == NULL) /* (every caller's call tries again while the master is
                                 * down: a line a second, not one a call) */
            KVP_LOG_WARN_LIMITED("%s", msg);
        return st == KVP_ERR_TIMEOUT ? KVP_ERR_TIMEOUT : KVP_ERR_CONNECT;
    }
    /* bounds a frame that stops half-way, and on_ready's blocking calls */
    kvp_sock_set_timeout(fd, m->timeout_ms);
    char err[256] = "";
    kvp_chan_t *ch;
    st = kvp_chan_open(m->tls, fd, host, m->timeout_ms, &ch, err, sizeof(err));
    if (st != KVP_OK) {
        set_conn_err(m, err);
        KVP_LOG_WARN("master %s:%u: %s", host, port, err);
        return st;
    }
    if (m->token != NULL && m->tls != NULL) {
        st = authenticate(m, ch);
        if (st != KVP_OK) {
            kvp_chan_close(ch);
            return st;
        }
    }
    *ch_p = ch;
    return KVP_OK;
}

kvp_status_t kvp_mconn_dial(kvp_mconn_t *m, kvp_chan_t **ch_p)
{
    char host[256];
    uint16_t port;
    kvp_mconn_addr(m, host, sizeof(host), &port);
    return dial(m, host, port, ch_p);
}

/* Open a connection and make it ready (no lock held). */
static kvp_status_t open_conn(kvp_mconn_t *m, bool first, mc_conn_t **c_p)
{
    char host[256];
    uint16_t port;
    kvp_status_t st = KVP_OK;
    if (m->resolve != NULL) {
        st = m->resolve(m->resolve_arg, host, sizeof(host), &port);
        if (st != KVP_OK)
            return KVP_ERR_CONNECT; /* no leader now (an election in progress) */
        pthread_mutex_lock(&m->lock);
        snprintf(m->host, sizeof(m->host), "%s", host);
        m->port = port;
        pthread_mutex_unlock(&m->lock);
    } else {
        snprintf(host, sizeof(host), "%s", m->host);
        port = m->port;
    }
    kvp_chan_t *ch;
    st = dial(m, host, port, &ch);
    if (st != KVP_OK)
        return st;
    if (m->on_ready != NULL) {
        st = m->on_ready(m->arg, m, ch, first);
        if (st != KVP_OK) {
            kvp_chan_close(ch);
            return st;
        }
    }
    mc_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        kvp_chan_close(ch);
        return KVP_ERR_NOMEM;
    }
    c->ch = ch;
    c->refs = 1; /* m->conn's */
    pthread_mutex_init(&c->send_lock, NULL);
    *c_p = c;
    return KVP_OK;
}

/* Make sure a connection is open (lock held, dropped while connecting). */
static kvp_status_t ensure_conn_locked(kvp_mconn_t *m, uint64_t deadline, bool first)
{
    while (m->conn == NULL) {
        if (m->connecting) {
            struct timespec ts = abs_ts(deadline);
            if (pthread_cond_timedwait(&m->conn_cv, &m->lock, &ts) == ETIMEDOUT && m->conn == NULL)
                return KVP_ERR_TIMEOUT;
            continue;
        }
        m->connecting = true;
        pthread_mutex_unlock(&m->lock);
        mc_conn_t *c = NULL;
        kvp_status_t st = open_conn(m, first, &c);
        pthread_mutex_lock(&m->lock);
        m->connecting = false;
        pthread_cond_broadcast(&m->conn_cv);
        if (st != KVP_OK)
            return st;
        m->conn = c;
        c->gen = ++m->stats.connects;
    }
    return KVP_OK;
}

kvp_status_t kvp_mconn_connect(kvp_mconn_t *m)
{
    uint64_t deadline = mono_ms() + m->timeout_ms;
    unsigned nap_ms = 25;
    for (;;) {
        pthread_mutex_lock(&m->lock);
        kvp_status_t st = ensure_conn_locked(m, deadline, true);
        pthread_mutex_unlock(&m->lock);
        /* following a leader: none reachable yet (a failover), or a standby answered */
        if (m->resolve == NULL || (st != KVP_ERR_CONNECT && st != KVP_ERR_NOT_LEADER) ||
            mono_ms() + nap_ms >= deadline)
            return st;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)nap_ms * 1000000L};
        nanosleep(&ts, NULL);
        nap_ms = nap_ms < 200 ? nap_ms * 2 : 200;
    }
}

void kvp_mconn_addr(kvp_mconn_t *m, char *host, size_t cap, uint16_t *port_p)
{
    pthread_mutex_lock(&m->lock);
    snprintf(host, cap, "%s", m->host);
    *port_p = m->port;
    pthread_mutex_unlock(&m->lock);
}

void kvp_mconn_follow(kvp_mconn_t *m, const char *leader)
{
    char cur[300];
    pthread_mutex_lock(&m->lock);
    snprintf(cur, sizeof(cur), "%s:%u", m->host, m->port);
    if (m->conn != NULL && strcmp(cur, leader) != 0)
        broken_locked(m, m->conn, KVP_ERR_IO);
    pthread_mutex_unlock(&m->lock);
}

uint64_t kvp_mconn_epoch(kvp_mconn_t *m)
{
    pthread_mutex_lock(&m->lock);
    uint64_t e = m->epoch_max;
    pthread_mutex_unlock(&m->lock);
    return e;
}

bool kvp_mconn_connected(kvp_mconn_t *m)
{
    pthread_mutex_lock(&m->lock);
    bool up = m->conn != NULL;
    pthread_mutex_unlock(&m->lock);
    return up;
}

bool kvp_mconn_fresh(kvp_mconn_t *m, uint64_t max_age_ms, uint64_t *gen_p)
{
    pthread_mutex_lock(&m->lock);
    mc_conn_t *c = m->conn;
    bool fresh = c != NULL && !c->broken && c->rx_ms != 0 && mono_ms() - c->rx_ms <= max_age_ms;
    *gen_p = c != NULL ? c->gen : 0;
    pthread_mutex_unlock(&m->lock);
    return fresh;
}

void kvp_mconn_stats(kvp_mconn_t *m, kvp_mconn_stats_t *out)
{
    pthread_mutex_lock(&m->lock);
    *out = m->stats;
    pthread_mutex_unlock(&m->lock);
}

/* Wait (no lock) until c has bytes or the deadline passes. KVP_ERR_TIMEOUT: nothing. */
static kvp_status_t wait_readable(mc_conn_t *c, uint64_t deadline)
{
    uint64_t now = mono_ms();
    return kvp_chan_wait_readable(c->ch, now >= deadline ? 0 : (int)(deadline - now));
}

/* Read and drop len body bytes nobody waits for. */
static kvp_status_t skip_body(kvp_chan_t *ch, size_t len)
{
    uint8_t sink[4096];
    while (len > 0) {
        size_t k = len < sizeof(sink) ? len : sizeof(sink);
        kvp_status_t st = kvp_chan_recv_all(ch, sink, k);
        if (st != KVP_OK)
            return st;
        len -= k;
    }
    return KVP_OK;
}

/* Receive a body into a waiter's buffer (its thread waits meanwhile: w->filling). */
static kvp_status_t fill_body(kvp_chan_t *ch, waiter_t *w, size_t len)
{
    uint8_t *b = kvp_thread_buf_reserve(w->rx, len + 1);
    if (b == NULL)
        return KVP_ERR_NOMEM;
    kvp_status_t st = len ? kvp_chan_recv_all(ch, b, len) : KVP_OK;
    b[len] = '\0';
    return st;
}

/* The reader's turn (lock held on entry and exit, dropped while reading): read one
 * whole frame from c and give it to the waiter it answers. KVP_ERR_TIMEOUT: nothing
 * arrived before the deadline (the stream is intact); other errors: c is broken. */
static kvp_status_t read_one_locked(kvp_mconn_t *m, mc_conn_t *c, uint64_t deadline)
{
    pthread_mutex_unlock(&m->lock);
    kvp_rpc_hdr_t h;
    uint8_t hb[KVP_RPC_HDR_LEN];
    kvp_status_t st = wait_readable(c, deadline);
    if (st == KVP_OK) {
        st = kvp_chan_recv_all(c->ch, hb, sizeof(hb));
        if (st == KVP_ERR_TIMEOUT)
            st = KVP_ERR_IO; /* half a frame: the stream is lost */
    }
    if (st == KVP_OK)
        st = kvp_rpc_hdr_unpack(hb, KVP_RPC_MAX_BODY, &h);
    pthread_mutex_lock(&m->lock);
    if (st != KVP_OK)
        return st;
    if (h.status == 0 && h.epoch < m->epoch_max) {
        /* a master that led before a newer leader: never take its word (fencing) */
        KVP_LOG_WARN("master: a reply from epoch %llu after epoch %llu was seen: the connection "
                     "is to a former leader; dropped",
                     (unsigned long long)h.epoch, (unsigned long long)m->epoch_max);
        return KVP_ERR_NOT_LEADER;
    }
    if (h.status == 0)
        m->epoch_max = h.epoch; /* (a standby's refusal carries 0: it answers nothing) */
    c->rx_frames++;
    c->rx_ms = mono_ms();
    waiter_t *w = m->waiters;
    while (w != NULL && !(w->id == h.request_id && w->conn == c))
        w = w->next;
    if (w == NULL || w->done) {
        m->stats.late_replies++;
        KVP_LOG_DEBUG("master: reply %llu (method %#x) came after its call ended; dropped",
                      (unsigned long long)h.request_id, h.method);
        pthread_mutex_unlock(&m->lock);
        st = skip_body(c->ch, h.body_len);
        pthread_mutex_lock(&m->lock);
        return st == KVP_ERR_TIMEOUT ? KVP_ERR_IO : st;
    }
    w->filling = true; /* w's thread stays until we are done with its buffer */
    pthread_mutex_unlock(&m->lock);
    st = fill_body(c->ch, w, h.body_len);
    pthread_mutex_lock(&m->lock);
    w->filling = false;
    w->done = true;
    if (st != KVP_OK) {
        w->conn_failed = true;
        w->st = KVP_ERR_IO;
        pthread_cond_signal(&w->cv);
        return st == KVP_ERR_TIMEOUT ? KVP_ERR_IO : st;
    }
    if (h.status != 0) {
        if (h.status == KVP_ERR_NOT_LEADER)
            KVP_LOG_DEBUG("master: %s", h.body_len ? (char *)w->rx->p : "not the leader");
        else
            KVP_LOG_WARN("master refused request (method %u): %s", w->method,
                         h.body_len ? (char *)w->rx->p : kvp_strerror(h.status));
        w->st =
            h.status < KVP_STATUS_MIN || h.status > 0 ? KVP_ERR_PROTOCOL : (kvp_status_t)h.status;
        w->refused = h.body_len > 0;
    } else if (h.method != (w->method | KVP_RPC_RESPONSE_BIT)) {
        w->st = KVP_ERR_PROTOCOL;
    } else {
        w->st = KVP_OK;
        w->len = h.body_len;
    }
    pthread_cond_signal(&w->cv);
    return KVP_OK;
}

/* Hand the reader role on to a waiter still waiting (lock held). */
static void wake_reader_locked(kvp_mconn_t *m)
{
    if (m->reading)
        return;
    for (waiter_t *w = m->waiters; w != NULL; w = w->next)
        if (!w->done && !w->conn->broken) {
            pthread_cond_signal(&w->cv);
            return;
        }
}

/* Wait for w's reply, reading for everyone while nobody else does (lock held). */
static void wait_reply_locked(kvp_mconn_t *m, waiter_t *w, uint64_t deadline)
{
    mc_conn_t *c = w->conn;
    while (!w->done) {
        if (mono_ms() >= deadline && !w->filling) {
            w->done = true;
            w->st = KVP_ERR_TIMEOUT;
            if (!c->broken && c->rx_frames == w->rx_at_send) {
                KVP_LOG_WARN("master %s:%u sent nothing for %u ms: closing the connection", m->host,
                             m->port, m->timeout_ms);
                broken_locked(m, c, KVP_ERR_IO);
            }
            break;
        }
        if (!m->reading && !c->broken) {
            m->reading = true;
            c->refs++;
            kvp_status_t st = read_one_locked(m, c, deadline);
            m->reading = false;
            if (st != KVP_OK && st != KVP_ERR_TIMEOUT)
                broken_locked(m, c, st == KVP_ERR_NOMEM ? KVP_ERR_IO : st);
            conn_unref_locked(c);
            continue;
        }
        /* past the deadline only while the reader fills our buffer (bounded by the
         * socket's receive timeout) */
        struct timespec ts = abs_ts(w->filling ? mono_ms() + 50 : deadline);
        pthread_cond_timedwait(&w->cv, &m->lock, &ts);
    }
    wake_reader_locked(m);
}

static kvp_status_t call_once(kvp_mconn_t *m, uint16_t method, const void *body, size_t len,
                              uint64_t deadline, uint8_t **resp_p, size_t *resp_len_p,
                              bool *conn_failed_p)
{
    *conn_failed_p = false;
    waiter_t w = {.method = method, .rx = kvp_thread_buf(KVP_TBUF_RX)};
    if (w.rx == NULL)
        return KVP_ERR_NOMEM;
    pthread_mutex_lock(&m->lock);
    kvp_status_t st = ensure_conn_locked(m, deadline, false);
    if (st != KVP_OK) {
        pthread_mutex_unlock(&m->lock);
        return st;
    }
    pthread_cond_init(&w.cv, &m->cattr);
    mc_conn_t *c = w.conn = m->conn;
    c->refs++;
    w.id = ++m->next_id;
    w.rx_at_send = c->rx_frames;
    w.next = m->waiters;
    if (m->waiters)
        m->waiters->prev = &w;
    m->waiters = &w;
    m->stats.in_flight++;
    pthread_mutex_unlock(&m->lock);

    pthread_mutex_lock(&c->send_lock);
    st = kvp_rpc_chan_send(c->ch, method, w.id, body, len);
    pthread_mutex_unlock(&c->send_lock);

    pthread_mutex_lock(&m->lock);
    if (st != KVP_OK)
        broken_locked(m, c, st == KVP_ERR_TIMEOUT ? KVP_ERR_IO : st);
    wait_reply_locked(m, &w, deadline);
    if (w.prev)
        w.prev->next = w.next;
    else
        m->waiters = w.next;
    if (w.next)
        w.next->prev = w.prev;
    m->stats.in_flight--;
    conn_unref_locked(c);
    pthread_mutex_unlock(&m->lock);
    pthread_cond_destroy(&w.cv);
    *conn_failed_p = w.conn_failed;
    if (w.refused)
        kvp_status_note((const char *)w.rx->p); /* why, for the caller's last error */
    if (w.st == KVP_OK) {
        *resp_p = w.rx->p;
        *resp_len_p = w.len;
    }
    return w.st;
}

/* The calling thread's last kvp_mconn_call was sent again after its connection broke. */
static _Thread_local bool tl_sent_again;

bool kvp_mconn_call_sent_again(void)
{
    return tl_sent_again;
}

kvp_status_t kvp_mconn_call(kvp_mconn_t *m, uint16_t method, const void *body, size_t len,
                            uint8_t **resp_p, size_t *resp_len_p)
{
    tl_sent_again = false;
    if (len > KVP_RPC_MAX_BODY)
        return KVP_ERR_FRAME_TOO_LARGE;
    uint64_t t0 = kvp_now_ns();
    uint64_t deadline = mono_ms() + m->timeout_ms;
    kvp_status_t st = KVP_ERR_CONNECT;
    unsigned nap_ms = 25;
    for (int attempt = 0;; attempt++) {
        bool conn_failed;
        st = call_once(m, method, body, len, deadline, resp_p, resp_len_p, &conn_failed);
        /* the connection broke under the call: once more on a new one (the master
         * dropped what was bound to the old one, so a PutStart may be sent again) */
        bool again = conn_failed && attempt == 0;
        /* following a leader: no leader reachable yet, or this one is not (any more) the
         * leader: wait for the failover, within the call's time */
        if (m->resolve != NULL &&
            (conn_failed || st == KVP_ERR_CONNECT || st == KVP_ERR_NOT_LEADER)) {
            if (st == KVP_ERR_NOT_LEADER) {
                /* another master leads now: go there. The same one (not sure of its lease
                 * for a moment, e.g. etcd away): keep the connection, and with it what is
                 * bound to it (the segment's mount), and ask again. */
                char host[256], lead[300];
                uint16_t port;
                if (m->resolve(m->resolve_arg, host, sizeof(host), &port) == KVP_OK) {
                    snprintf(lead, sizeof(lead), "%s:%u", host, port);
                    kvp_mconn_follow(m, lead);
                }
            }
            uint64_t now = mono_ms();
            if (now + nap_ms >= deadline)
                break;
            struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)nap_ms * 1000000L};
            nanosleep(&ts, NULL);
            nap_ms = nap_ms < 200 ? nap_ms * 2 : 200;
            again = true;
        }
        if (!again)
            break;
        tl_sent_again |= conn_failed; /* the first may have reached the master */
    }
    rpc_count(m, method, t0, st);
    return st;
}

kvp_status_t kvp_mconn_send(kvp_mconn_t *m, uint16_t method, const void *body, size_t len)
{
    uint64_t t0 = kvp_now_ns();
    pthread_mutex_lock(&m->lock);
    mc_conn_t *c = m->conn;
    if (c == NULL) {
        pthread_mutex_unlock(&m->lock);
        rpc_count(m, method, t0, KVP_ERR_CONNECT);
        return KVP_ERR_CONNECT;
    }
    c->refs++;
    uint64_t id = ++m->next_id;
    pthread_mutex_unlock(&m->lock);
    pthread_mutex_lock(&c->send_lock);
    kvp_status_t st = kvp_rpc_chan_send(c->ch, method, id, body, len);
    pthread_mutex_unlock(&c->send_lock);
    pthread_mutex_lock(&m->lock);
    if (st != KVP_OK)
        broken_locked(m, c, KVP_ERR_IO);
    conn_unref_locked(c);
    pthread_mutex_unlock(&m->lock);
    rpc_count(m, method, t0, st);
    return st;
}
