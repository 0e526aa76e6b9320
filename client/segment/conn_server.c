/*
 * conn_server.c - a tcp (or Unix socket) listener with a thread per connection.
 *
 * Design: an accept thread plus one thread per connection, each running the
 * server's serve function until the connection ends; the accept thread
 * joins the finished ones as it goes (reap). Stop: shut the listening
 * socket down (the accept thread leaves), then every connection (their
 * blocking calls return), and join them all.
 *
 * Who may connect: anyone who reaches the port, or (protected mode, the
 * default when no credentials are configured) peers of this host only; a
 * refused peer's connection thread reads its first 32-byte request header
 * at most, answers KVP_ERR_DENIED and closes.
 *
 * Threads: the accept thread and the connection threads; the list of
 * connections is guarded by `lock`.
 */
#include "client/segment/conn_server.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "client/transport/wire.h"
#include "common/log.h"

typedef struct srv_conn {
    int fd;
    pthread_t thread;
    bool done;
    struct srv_conn *next;
    struct kvp_conn_server *srv;
} srv_conn_t;

struct kvp_conn_server {
    const char *name;
    bool protected_mode;
    _Atomic uint64_t refused;
    kvp_conn_serve_fn serve;
    void *arg;
    int listen_fd;
    pthread_t accept_thread;
    pthread_mutex_t lock;
    srv_conn_t *conns;
    bool stopping;
};

/* A peer of another host, in protected mode: its first header (if it sends one within a
 * second) gets KVP_ERR_DENIED; nothing else of it is read. */
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
    if (kvp_recv_all(fd, &req, sizeof(req)) == KVP_OK)
        kvp_data_reply(fd, KVP_ERR_DENIED, 0);
}

static void *conn_main(void *arg)
{
    srv_conn_t *c = arg;
    struct kvp_conn_server *srv = c->srv;
    if (srv->protected_mode && !kvp_sock_peer_local(c->fd))
        refuse(srv, c->fd);
    else
        srv->serve(srv->arg, c->fd);
    /* Tell the peer now; the fd itself is closed when the thread is reaped. */
    shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_lock(&srv->lock);
    c->done = true;
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

/* Join and free connections whose threads have finished. Caller holds lock. */
static void reap_locked(struct kvp_conn_server *srv)
{
    srv_conn_t **pp = &srv->conns;
    while (*pp) {
        srv_conn_t *c = *pp;
        if (c->done) {
            *pp = c->next;
            pthread_join(c->thread, NULL);
            close(c->fd);
            free(c);
        } else {
            pp = &c->next;
        }
    }
}

static void *accept_main(void *arg)
{
    struct kvp_conn_server *srv = arg;
    for (;;) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                KVP_LOG_WARN_LIMITED("%s: accept failed: %m", srv->name);
                usleep(10000);
                continue;
            }
            break; /* listen socket shut down */
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        srv_conn_t *c = calloc(1, sizeof(*c));
        pthread_mutex_lock(&srv->lock);
        reap_locked(srv);
        if (c == NULL || srv->stopping) {
            pthread_mutex_unlock(&srv->lock);
            free(c);
            close(fd);
            if (srv->stopping)
                break;
            continue;
        }
        c->fd = fd;
        c->srv = srv;
        if (pthread_create(&c->thread, NULL, conn_main, c) != 0) {
            pthread_mutex_unlock(&srv->lock);
            KVP_LOG_WARN_LIMITED("%s: cannot start a connection thread", srv->name);
            close(fd);
            free(c);
            continue;
        }
        c->next = srv->conns;
        srv->conns = c;
        pthread_mutex_unlock(&srv->lock);
    }
    return NULL;
}

/* Serve what listen_fd accepts (the server owns it from here, even on failure). */
static kvp_status_t start(const char *name, int listen_fd, bool protected_mode,
                          kvp_conn_serve_fn serve, void *arg, kvp_conn_server_t **srv_p)
{
    struct kvp_conn_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL) {
        close(listen_fd);
        return KVP_ERR_NOMEM;
    }
    srv->name = name;
    srv->protected_mode = protected_mode;
    srv->serve = serve;
    srv->arg = arg;
    srv->listen_fd = listen_fd;
    pthread_mutex_init(&srv->lock, NULL);
    if (pthread_create(&srv->accept_thread, NULL, accept_main, srv) != 0) {
        close(listen_fd);
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
    return start(name, fd, protected_mode, serve, arg, srv_p);
}

kvp_status_t kvp_conn_server_create_unix(const char *name, const char *sock_name,
                                         kvp_conn_serve_fn serve, void *arg,
                                         kvp_conn_server_t **srv_p)
{
    int fd;
    kvp_status_t status = kvp_unix_listen(sock_name, 64, &fd);
    if (status != KVP_OK)
        return status;
    return start(name, fd, false, serve, arg, srv_p);
}

void kvp_conn_server_destroy(kvp_conn_server_t *srv)
{
    if (srv == NULL)
        return;
    pthread_mutex_lock(&srv->lock);
    srv->stopping = true;
    pthread_mutex_unlock(&srv->lock);
    shutdown(srv->listen_fd, SHUT_RDWR);
    pthread_join(srv->accept_thread, NULL);
    pthread_mutex_lock(&srv->lock);
    for (srv_conn_t *c = srv->conns; c; c = c->next)
        shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&srv->lock);
    /* wait for every connection thread to leave its loop */
    for (;;) {
        pthread_mutex_lock(&srv->lock);
        reap_locked(srv);
        bool empty = srv->conns == NULL;
        pthread_mutex_unlock(&srv->lock);
        if (empty)
            break;
        usleep(1000);
    }
    close(srv->listen_fd);
    pthread_mutex_destroy(&srv->lock);
    free(srv);
}

uint64_t kvp_conn_server_refused(const kvp_conn_server_t *srv)
{
    return atomic_load_explicit(&srv->refused, memory_order_relaxed);
}
