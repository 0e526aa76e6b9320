/*
 * conn_server.c - a tcp (or Unix socket) listener with a thread per connection,
 * within limits on what one peer may hold (conn_server.h, kvp_conn_limits_t).
 *
 * Design: an accept thread plus one thread per connection, each running the
 * server's serve function until the connection ends. The accept thread
 * waits in poll() on the listening socket and an eventfd (a connection that
 * ended, or destroy), at most a tick at a time, and on every wake sweeps the
 * list: joins the threads that finished, and shuts down the connections past
 * their deadline (their blocking calls return, the serve function ends).
 * A connection's own thread closes its fd as it ends (under `lock`, so that
 * a sweep never shuts down a number reused since), so descriptors come back
 * whatever the accept thread is doing.
 *
 * Admission (docs/security.md, "Owner data servers"): a new connection is
 * counted against the server's caps (in all, per peer: an address, a uid on
 * the Unix socket; and the smaller ones of connections not yet authenticated)
 * by a walk of the list, before any thread starts for it; one past a cap is
 * closed at once, nothing read, and counted by reason. When a cap in all is
 * reached, the oldest unauthenticated connection makes way for the new one:
 * strangers holding them cannot keep an honest peer's handshake (one round
 * trip) out. (Those shut down and not yet gone count apart, up to as many
 * again as the cap.) Deadlines: from accept to
 * kvp_conn_admit (handshake_ms, bytes or not), and from a frame's first byte to
 * its end (frame_ms plus its bytes' time), kept in one atomic per connection
 * that the connection's thread sets and the sweep reads; a trickle of bytes
 * extends neither.
 *
 * Descriptors: a tcp server takes at most a quarter of the process's
 * RLIMIT_NOFILE, a Unix socket a sixteenth. When accept still fails for want
 * of descriptors (the rest of the process took them), the server closes a
 * spare descriptor it holds, accepts the waiting connection on it and closes
 * it at once (counted: resources), so the backlog drains instead of keeping
 * the listener readable; any other failure backs off (10 ms doubling to 1 s,
 * waiting on the eventfd only) rather than spin or sleep blind.
 *
 * Who may connect: anyone who reaches the port, or (protected mode, the
 * default when no credentials are configured) peers of this host only; a
 * refused peer's connection thread reads its first 32-byte request header
 * at most, answers KVP_ERR_DENIED and closes.
 *
 * Threads: the accept thread and the connection threads; the list of
 * connections and each one's fd, done, admitted and cut are guarded by `lock`;
 * a connection's deadline is an atomic its thread stores and the sweep loads.
 */
#include "client/segment/conn_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "client/transport/wire.h"
#include "common/clock.h"
#include "common/log.h"

/* Why a connection was closed by the server (kvp_conn_refusals_t's fields, in order). */
enum { CUT_CONN, CUT_PEER, CUT_UNAUTH, CUT_HANDSHAKE, CUT_FRAME, CUT_RESOURCES, CUT_COUNT };
static const char *const cut_why[CUT_COUNT] = {
    [CUT_CONN] = "the server's cap of connections is reached",
    [CUT_PEER] = "the peer's cap of connections is reached",
    [CUT_UNAUTH] = "too many connections not yet authenticated",
    [CUT_HANDSHAKE] = "not authenticated in time",
    [CUT_FRAME] = "a request not completed in time",
    [CUT_RESOURCES] = "no descriptor or thread left",
};

/* A peer, for the caps: an IPv4 or IPv6 address, or a uid (Unix socket). */
typedef struct peer_key {
    uint8_t kind; /* 0: unknown (never matches), 4, 6, or 'u' */
    uint8_t b[16];
} peer_key_t;

struct kvp_conn {
    int fd; /* -1 once its thread closed it */
    pthread_t thread;
    bool done;     /* its thread has left (join it) */
    bool admitted; /* kvp_conn_admit */
    bool cut;      /* shut down by the server (counted once) */
    peer_key_t peer;
    uint64_t accepted_ms;
    uint64_t handshake_deadline; /* ms; the thread's own */
    uint64_t frame_deadline;     /* ms, 0: no frame; the thread's own */
    _Atomic uint64_t deadline;   /* what the sweep checks (0: none) */
    struct kvp_conn *next;
    struct kvp_conn_server *srv;
};

struct kvp_conn_server {
    const char *name;
    bool protected_mode;
    bool is_unix;
    kvp_conn_limits_t lim;
    unsigned tick_ms; /* the longest the accept thread sleeps */
    _Atomic uint64_t refused;
    _Atomic uint64_t cuts[CUT_COUNT];
    kvp_conn_serve_fn serve;
    void *arg;
    int listen_fd;
    int wake_fd;    /* eventfd: a connection ended, or stop */
    int reserve_fd; /* a spare descriptor for accept-and-close (-1: none now) */
    pthread_t accept_thread;
    pthread_mutex_t lock;
    pthread_cond_t ended; /* a connection's thread has left */
    struct kvp_conn *conns;
    bool stopping;
};

/* ---- the process's limits ---- */

static pthread_mutex_t g_limits_lock = PTHREAD_MUTEX_INITIALIZER;
static kvp_conn_limits_t g_limits; /* zeros: the defaults */

void kvp_conn_limits_set_default(const kvp_conn_limits_t *limits)
{
    pthread_mutex_lock(&g_limits_lock);
    if (limits != NULL)
        g_limits = *limits;
    else
        memset(&g_limits, 0, sizeof(g_limits));
    pthread_mutex_unlock(&g_limits_lock);
}

static uint32_t or_default(uint32_t v, uint32_t def)
{
    return v != 0 ? v : def;
}

void kvp_conn_limits_fill(const kvp_conn_limits_t *limits)
{
    pthread_mutex_lock(&g_limits_lock);
    kvp_conn_limits_t *g = &g_limits;
    g->max_conns = or_default(g->max_conns, limits->max_conns);
    g->max_per_peer = or_default(g->max_per_peer, limits->max_per_peer);
    g->max_unauth = or_default(g->max_unauth, limits->max_unauth);
    g->max_unauth_per_peer = or_default(g->max_unauth_per_peer, limits->max_unauth_per_peer);
    g->handshake_ms = or_default(g->handshake_ms, limits->handshake_ms);
    g->frame_ms = or_default(g->frame_ms, limits->frame_ms);
    pthread_mutex_unlock(&g_limits_lock);
}

static uint32_t min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

void kvp_conn_limits_get_default(kvp_conn_limits_t *out)
{
    pthread_mutex_lock(&g_limits_lock);
    kvp_conn_limits_t l = g_limits;
    pthread_mutex_unlock(&g_limits_lock);
    l.max_conns = or_default(l.max_conns, KVP_CONN_DEFAULT_MAX_CONNS);
    l.max_per_peer = or_default(l.max_per_peer, KVP_CONN_DEFAULT_MAX_PER_PEER);
    l.max_unauth = or_default(l.max_unauth, KVP_CONN_DEFAULT_MAX_UNAUTH);
    l.max_unauth_per_peer =
        or_default(l.max_unauth_per_peer, l.max_unauth / 4 ? l.max_unauth / 4 : 1);
    l.handshake_ms = or_default(l.handshake_ms, KVP_CONN_DEFAULT_HANDSHAKE_MS);
    l.frame_ms = or_default(l.frame_ms, KVP_CONN_DEFAULT_FRAME_MS);
    *out = l;
}

/* The process's limits, cut to what this server's kind and the descriptor limit allow. */
static void limits_for(const char *name, bool is_unix, kvp_conn_limits_t *l)
{
    kvp_conn_limits_get_default(l);
    uint32_t asked = l->max_conns;
    if (is_unix)
        l->max_conns = min_u32(l->max_conns, KVP_CONN_UNIX_MAX_CONNS);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        rlim_t share = rl.rlim_cur / (is_unix ? 16 : 4);
        uint32_t fit = share < 8 ? 8 : share > UINT32_MAX ? UINT32_MAX : (uint32_t)share;
        if (fit < l->max_conns) {
            l->max_conns = fit;
            KVP_LOG_INFO("%s: takes %u connections at once, not %u: the process may open %llu "
                         "descriptors (ulimit -n)",
                         name, fit, asked, (unsigned long long)rl.rlim_cur);
        }
    }
    if (is_unix) /* one uid (another user's) never holds all of it */
        l->max_per_peer = min_u32(l->max_per_peer, l->max_conns / 4 ? l->max_conns / 4 : 1);
    l->max_per_peer = min_u32(l->max_per_peer, l->max_conns);
    l->max_unauth = min_u32(l->max_unauth, l->max_conns);
    l->max_unauth_per_peer =
        min_u32(min_u32(l->max_unauth_per_peer, l->max_unauth), l->max_per_peer);
}

/* ---- a connection's side ---- */

int kvp_conn_fd(const kvp_conn_t *conn)
{
    return conn->fd;
}

/* What the sweep checks: the handshake's deadline until admitted, and the frame's. */
static void deadline_update(kvp_conn_t *c)
{
    uint64_t d = c->frame_deadline;
    if (!c->admitted && (d == 0 || c->handshake_deadline < d))
        d = c->handshake_deadline;
    atomic_store_explicit(&c->deadline, d, memory_order_relaxed);
}

void kvp_conn_admit(kvp_conn_t *c)
{
    if (c->admitted)
        return;
    struct kvp_conn_server *srv = c->srv;
    pthread_mutex_lock(&srv->lock);
    if (!c->cut) /* made way for a newer one meanwhile: it stays cut */
        c->admitted = true;
    pthread_mutex_unlock(&srv->lock);
    deadline_update(c);
}

bool kvp_conn_admitted(const kvp_conn_t *c)
{
    return c->admitted;
}

kvp_status_t kvp_conn_recv_head(kvp_conn_t *c, void *buf, size_t len)
{
    ssize_t n;
    do
        n = recv(c->fd, buf, len, 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return KVP_ERR_IO;
    c->frame_deadline = kvp_now_ms() + c->srv->lim.frame_ms;
    deadline_update(c);
    if ((size_t)n == len)
        return KVP_OK;
    return kvp_recv_all(c->fd, (char *)buf + n, len - (size_t)n);
}

void kvp_conn_frame_extend(kvp_conn_t *c, uint64_t bytes)
{
    if (c->frame_deadline == 0)
        return;
    uint64_t ms = bytes / KVP_CONN_FRAME_RATE * 1000 +
                  bytes % KVP_CONN_FRAME_RATE * 1000 / KVP_CONN_FRAME_RATE;
    c->frame_deadline =
        ms > UINT64_MAX / 2 - c->frame_deadline ? UINT64_MAX / 2 : c->frame_deadline + ms;
    deadline_update(c);
}

void kvp_conn_frame_end(kvp_conn_t *c)
{
    c->frame_deadline = 0;
    deadline_update(c);
}

/* ---- the accept thread's side ---- */

static void peer_of(const struct kvp_conn_server *srv, int fd, const struct sockaddr_storage *sa,
                    peer_key_t *k)
{
    memset(k, 0, sizeof(*k));
    if (srv->is_unix) {
        struct ucred cred;
        socklen_t cl = sizeof(cred);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 && cl == sizeof(cred)) {
            k->kind = 'u';
            memcpy(k->b, &cred.uid, sizeof(cred.uid));
        }
    } else if (sa->ss_family == AF_INET) {
        k->kind = 4;
        memcpy(k->b, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) {
            k->kind = 4;
            memcpy(k->b, &a->s6_addr[12], 4);
        } else {
            k->kind = 6;
            memcpy(k->b, a, 16);
        }
    }
}

static bool peer_eq(const peer_key_t *a, const peer_key_t *b)
{
    return a->kind != 0 && a->kind == b->kind && memcmp(a->b, b->b, sizeof(a->b)) == 0;
}

static void peer_str(const peer_key_t *k, char *buf, size_t len)
{
    uint32_t uid;
    switch (k->kind) {
    case 4:
        inet_ntop(AF_INET, k->b, buf, (socklen_t)len);
        break;
    case 6:
        inet_ntop(AF_INET6, k->b, buf, (socklen_t)len);
        break;
    case 'u':
        memcpy(&uid, k->b, sizeof(uid));
        snprintf(buf, len, "uid %u", uid);
        break;
    default:
        snprintf(buf, len, "an unknown peer");
    }
}

static void count_cut(struct kvp_conn_server *srv, int why, const peer_key_t *peer)
{
    atomic_fetch_add_explicit(&srv->cuts[why], 1, memory_order_relaxed);
    char p[INET6_ADDRSTRLEN + 16];
    peer_str(peer, p, sizeof(p));
    KVP_LOG_WARN_LIMITED("%s: a connection from %s closed: %s", srv->name, p, cut_why[why]);
}

static void wake(struct kvp_conn_server *srv)
{
    uint64_t one = 1;
    ssize_t n = write(srv->wake_fd, &one, sizeof(one));
    (void)n; /* a full counter wakes the thread as well */
}

/* Shut a connection down for a limit (caller holds lock; logs under it, rate-limited). */
static void cut_locked(struct kvp_conn_server *srv, kvp_conn_t *c, int why)
{
    c->cut = true;
    count_cut(srv, why, &c->peer); /* before the peer can see it */
    if (c->fd >= 0)
        shutdown(c->fd, SHUT_RDWR);
}

/* Join the connections that ended, cut the ones past their deadline. Caller holds lock. */
static void sweep_locked(struct kvp_conn_server *srv, uint64_t now)
{
    kvp_conn_t **pp = &srv->conns;
    while (*pp) {
        kvp_conn_t *c = *pp;
        if (c->done) {
            *pp = c->next;
            pthread_join(c->thread, NULL);
            free(c);
            continue;
        }
        uint64_t d = atomic_load_explicit(&c->deadline, memory_order_relaxed);
        if (!c->cut && d != 0 && now >= d)
            cut_locked(srv, c,
                       !c->admitted && now >= c->handshake_deadline ? CUT_HANDSHAKE : CUT_FRAME);
        pp = &c->next;
    }
}

/* A peer of another host, in protected mode: its first header (if it sends one within a
 * second) gets KVP_ERR_DENIED; nothing else of it is served. What it sent behind the header
 * (a write's payload, up to REFUSE_DRAIN bytes for 200 ms) is read and dropped before the
 * close, so that the close does not reset the connection under the reply: the peer reads
 * KVP_ERR_DENIED, not an I/O error. */
#define REFUSE_DRAIN (1u << 20)
static void refuse(struct kvp_conn_server *srv, int fd)
{
    char peer[80];
    kvp_sock_peer_name(fd, peer, sizeof(peer));
    KVP_LOG_WARN_LIMITED("%s: connection from %s refused: protected mode takes connections from "
                         "this host only (--auth none / KVPOOL_AUTH=none on a trusted network)",
                         srv->name, peer);
    atomic_fetch_add_explicit(&srv->refused, 1, memory_order_relaxed);
    kvp_sock_set_timeout(fd, 1000);
    kvp_data_req_t req;
    if (kvp_recv_all(fd, &req, sizeof(req)) != KVP_OK ||
        kvp_data_reply(fd, KVP_ERR_DENIED, 0) != KVP_OK)
        return;
    kvp_sock_drain_close(fd, 200, REFUSE_DRAIN);
}

static void *conn_main(void *arg)
{
    kvp_conn_t *c = arg;
    struct kvp_conn_server *srv = c->srv;
    if (srv->protected_mode && !kvp_sock_peer_local(c->fd))
        refuse(srv, c->fd);
    else
        srv->serve(srv->arg, c);
    pthread_mutex_lock(&srv->lock);
    close(c->fd); /* the peer is told now, the descriptor is back */
    c->fd = -1;
    c->done = true;
    pthread_cond_broadcast(&srv->ended);
    pthread_mutex_unlock(&srv->lock);
    wake(srv); /* destroy joins us after this, so srv is still there */
    return NULL;
}

/* A connection just accepted: within the caps, on a thread of its own; else closed. */
static void take(struct kvp_conn_server *srv, int fd, const struct sockaddr_storage *sa)
{
    const kvp_conn_limits_t *l = &srv->lim;
    peer_key_t key;
    peer_of(srv, fd, sa, &key);
    if (!srv->is_unix) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        kvp_sock_data_congestion(fd); /* both ends of a data connection alike */
    }
    uint64_t now = kvp_now_ms();
    kvp_conn_t *c = calloc(1, sizeof(*c));
    pthread_mutex_lock(&srv->lock);
    /* live: not cut; cutting: shut down, their threads not yet gone */
    uint32_t live = 0, cutting = 0, of_peer = 0, unauth = 0, unauth_of_peer = 0;
    kvp_conn_t *oldest = NULL;
    for (kvp_conn_t *o = srv->conns; o; o = o->next) {
        if (o->done)
            continue;
        if (o->cut) {
            cutting++;
            continue;
        }
        bool same = peer_eq(&o->peer, &key);
        live++;
        of_peer += same;
        if (o->admitted)
            continue;
        unauth++;
        unauth_of_peer += same;
        if (oldest == NULL || o->accepted_ms <= oldest->accepted_ms) /* newest first */
            oldest = o;
    }
    int why = -1;
    bool full = live >= l->max_conns || unauth >= l->max_unauth;
    if (of_peer >= l->max_per_peer)
        why = CUT_PEER;
    else if (unauth_of_peer >= l->max_unauth_per_peer)
        why = CUT_UNAUTH;
    else if (full && oldest != NULL && live + cutting < 2 * l->max_conns)
        cut_locked(srv, oldest, CUT_UNAUTH); /* the oldest unauthenticated makes way */
    else if (live >= l->max_conns)
        why = CUT_CONN;
    else if (full)
        why = CUT_UNAUTH;
    bool stopping = srv->stopping;
    if (why < 0 && (c == NULL || stopping))
        why = CUT_RESOURCES;
    if (why < 0) {
        c->fd = fd;
        c->peer = key;
        c->accepted_ms = now;
        c->srv = srv;
        c->handshake_deadline = now + l->handshake_ms;
        atomic_init(&c->deadline, c->handshake_deadline);
        if (pthread_create(&c->thread, NULL, conn_main, c) == 0) {
            c->next = srv->conns;
            srv->conns = c;
            pthread_mutex_unlock(&srv->lock);
            return;
        }
        why = CUT_RESOURCES;
    }
    pthread_mutex_unlock(&srv->lock);
    free(c);
    if (!stopping)
        count_cut(srv, why, &key); /* before the peer can see it */
    close(fd);
}

/* Out of descriptors: accept the next waiting connection on the spare one and close it.
 * 1: one was; 0: none waits; -1: cannot (no spare, or accept failed otherwise). */
static int shed_one(struct kvp_conn_server *srv)
{
    if (srv->reserve_fd < 0)
        return -1;
    close(srv->reserve_fd);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    int fd = accept4(srv->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
    int err = errno;
    if (fd >= 0) {
        peer_key_t key;
        peer_of(srv, fd, &sa, &key);
        count_cut(srv, CUT_RESOURCES, &key); /* before the peer can see it */
        close(fd);
    }
    srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd >= 0)
        return 1;
    return err == EAGAIN || err == EWOULDBLOCK ? 0 : -1;
}

/* Accept what waits (a batch at most, the sweep runs between). Returns the back-off to
 * wait before the next try (0: none, wait for the listener). */
static unsigned accept_some(struct kvp_conn_server *srv, unsigned backoff_ms)
{
    if (srv->reserve_fd < 0)
        srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof(sa);
        int fd = accept4(srv->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
        if (fd >= 0) {
            take(srv, fd, &sa);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        if (errno == EMFILE || errno == ENFILE) {
            int shed = shed_one(srv);
            if (shed > 0)
                continue;
            if (shed == 0)
                return 0;
            errno = EMFILE;
        }
        unsigned next = backoff_ms == 0 ? 10 : backoff_ms >= 500 ? 1000 : backoff_ms * 2;
        KVP_LOG_WARN_LIMITED("%s: accept failed: %m; trying again in %u ms", srv->name, next);
        return next;
    }
    return 0;
}

static void *accept_main(void *arg)
{
    struct kvp_conn_server *srv = arg;
    unsigned backoff_ms = 0;
    for (;;) {
        struct pollfd p[2] = {{.fd = srv->wake_fd, .events = POLLIN},
                              {.fd = srv->listen_fd, .events = POLLIN}};
        /* backing off: the listener is readable, only the eventfd and the clock wake us */
        int r = poll(p, backoff_ms ? 1 : 2, (int)(backoff_ms ? backoff_ms : srv->tick_ms));
        if (r > 0 && (p[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t n = read(srv->wake_fd, &v, sizeof(v));
            (void)n;
        }
        pthread_mutex_lock(&srv->lock);
        bool stop = srv->stopping;
        sweep_locked(srv, kvp_now_ms());
        pthread_mutex_unlock(&srv->lock);
        if (stop)
            break;
        if (backoff_ms || (r > 0 && p[1].revents != 0))
            backoff_ms = accept_some(srv, backoff_ms);
    }
    return NULL;
}

/* Serve what listen_fd accepts (the server owns it from here, even on failure). */
static kvp_status_t start(const char *name, int listen_fd, bool protected_mode, bool is_unix,
                          kvp_conn_serve_fn serve, void *arg, kvp_conn_server_t **srv_p)
{
    struct kvp_conn_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL) {
        close(listen_fd);
        return KVP_ERR_NOMEM;
    }
    srv->name = name;
    srv->protected_mode = protected_mode;
    srv->is_unix = is_unix;
    limits_for(name, is_unix, &srv->lim);
    unsigned shortest = min_u32(srv->lim.handshake_ms, srv->lim.frame_ms) / 4;
    srv->tick_ms = shortest < 10 ? 10 : shortest > 1000 ? 1000 : shortest;
    srv->serve = serve;
    srv->arg = arg;
    srv->listen_fd = listen_fd;
    srv->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
    pthread_mutex_init(&srv->lock, NULL);
    pthread_cond_init(&srv->ended, NULL);
    if (srv->wake_fd < 0 || pthread_create(&srv->accept_thread, NULL, accept_main, srv) != 0) {
        if (srv->wake_fd >= 0)
            close(srv->wake_fd);
        if (srv->reserve_fd >= 0)
            close(srv->reserve_fd);
        close(listen_fd);
        pthread_cond_destroy(&srv->ended);
        pthread_mutex_destroy(&srv->lock);
        free(srv);
        return KVP_ERR_SYSTEM;
    }
    *srv_p = srv;
    return KVP_OK;
}

kvp_status_t kvp_conn_server_create(const char *name, const char *host, uint16_t port,
                                    bool protected_mode, kvp_conn_serve_fn serve, void *arg,
                                    kvp_conn_server_t **srv_p, uint16_t *bound_port_p)
{
    int fd;
    kvp_status_t status = kvp_tcp_listen(host, port, 256, &fd, bound_port_p);
    if (status != KVP_OK)
        return status;
    return start(name, fd, protected_mode, false, serve, arg, srv_p);
}

kvp_status_t kvp_conn_server_create_unix(const char *name, const char *sock_name,
                                         kvp_conn_serve_fn serve, void *arg,
                                         kvp_conn_server_t **srv_p)
{
    int fd;
    kvp_status_t status = kvp_unix_listen(sock_name, 64, &fd);
    if (status != KVP_OK)
        return status;
    return start(name, fd, false, true, serve, arg, srv_p);
}

void kvp_conn_server_destroy(kvp_conn_server_t *srv)
{
    if (srv == NULL)
        return;
    pthread_mutex_lock(&srv->lock);
    srv->stopping = true;
    pthread_mutex_unlock(&srv->lock);
    wake(srv);
    pthread_join(srv->accept_thread, NULL);
    pthread_mutex_lock(&srv->lock);
    for (kvp_conn_t *c = srv->conns; c; c = c->next)
        if (c->fd >= 0)
            shutdown(c->fd, SHUT_RDWR);
    /* wait for every connection thread to leave its loop, then join them all */
    for (;;) {
        bool all_done = true;
        for (kvp_conn_t *c = srv->conns; c && all_done; c = c->next)
            all_done = c->done;
        if (all_done)
            break;
        pthread_cond_wait(&srv->ended, &srv->lock);
    }
    sweep_locked(srv, 0);
    pthread_mutex_unlock(&srv->lock);
    close(srv->listen_fd);
    close(srv->wake_fd);
    if (srv->reserve_fd >= 0)
        close(srv->reserve_fd);
    pthread_cond_destroy(&srv->ended);
    pthread_mutex_destroy(&srv->lock);
    free(srv);
}

void kvp_conn_server_limits(const kvp_conn_server_t *srv, kvp_conn_limits_t *out)
{
    *out = srv->lim;
}

uint64_t kvp_conn_server_refused(const kvp_conn_server_t *srv)
{
    return atomic_load_explicit(&srv->refused, memory_order_relaxed);
}

void kvp_conn_server_refusals(const kvp_conn_server_t *srv, kvp_conn_refusals_t *sum)
{
    if (srv == NULL)
        return;
    uint64_t v[CUT_COUNT];
    for (int i = 0; i < CUT_COUNT; i++)
        v[i] = atomic_load_explicit(&srv->cuts[i], memory_order_relaxed);
    sum->conn_limit += v[CUT_CONN];
    sum->peer_limit += v[CUT_PEER];
    sum->unauth_limit += v[CUT_UNAUTH];
    sum->handshake_timeout += v[CUT_HANDSHAKE];
    sum->frame_timeout += v[CUT_FRAME];
    sum->resources += v[CUT_RESOURCES];
}
