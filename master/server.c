/*
 * server.c - the master's epoll loop: accept, read frames, dispatch, write.
 *
 * One thread owns everything (STYLE.md, Threads): connections, buffers and
 * all metadata behind kvp_dispatch_handle. Sockets are non-blocking; a
 * connection's input is scanned for whole frames (bounded by
 * KVP_RPC_MAX_BODY, checked from the header before any allocation) and its
 * replies are queued in an output buffer flushed as the socket allows. A
 * peer that sends a bad frame gets an error reply (when it speaks our
 * magic) and is closed; a peer that stops reading its replies is closed
 * when its queue passes KVP_MASTER_MAX_OUTBUF. Either way every other
 * connection is unaffected. SIGTERM/SIGINT arrive on a signalfd and end
 * the loop; everything is freed on the way out.
 */
#include "master/server.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "common/log.h"
#include "common/rpc.h"
#include "common/macros.h"
#include "common/clock.h"
#include "common/sock.h"
#include "common/parse.h"
#include "common/grant.h"
#include "common/tls.h"
#include "master/auth/acl.h"
#include "master/dispatch.h"
#include "master/rpc/segment_calls.h"
#include "master/policy/eviction.h"
#include "common/election.h"
#include "master/meta/record.h"
#include "master/policy/lease.h"
#include "master/obs/events.h"
#include "master/obs/http.h"
#include "kvpool.pb-c.h"

#define KVP_MASTER_MAX_OUTBUF (256u << 20)
#define READ_CHUNK (256u << 10)
#define TICK_MS 500
/* The largest request a connection may send before it names a principal (an AuthRequest
 * is a token): a stranger's length prefix never makes the master allocate more. */
#define PREAUTH_MAX_BODY 4096u

typedef struct conn {
    int fd;
    uint64_t id;
    uint8_t *in;
    size_t in_len, in_cap;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    bool want_out;     /* EPOLLOUT armed */
    bool close_after;  /* close once the output queue is flushed */
    bool refuse;       /* protected mode, a peer of another host: refused at its first header */
    kvp_ssl_t *ssl;    /* TLS (--tls-cert): every byte goes through it; NULL: plain */
    bool cert_checked; /* the handshake ended and its certificate was looked up */
    const kvp_principal_t *who;   /* who is calling (srv->acl's); NULL: not yet known */
    bool removed;                 /* its principal left the ACL (a reload): refused, closed */
    char pname[KVP_ACL_NAME_MAX]; /* who->name, kept across ACL reloads */
    uint64_t last_rx_ms;          /* when a byte last arrived: liveness for --client-ttl */
    struct conn *next;            /* all connections, for shutdown */
    struct conn *prev;
} conn_t;

/* A request held without an answer (SsdTasks with no task yet: a long poll). */
typedef struct parked {
    struct parked *next;
    uint64_t conn_id;
    uint64_t req_id;
    uint64_t deadline_ms; /* answer by then, even with nothing */
    uint16_t method;
    size_t len;
    uint8_t body[];
} parked_t;

/* How long a held request waits at most (the tick answers it: up to TICK_MS later). */
#define PARK_MS 1000

struct kvp_master_server {
    int epfd;
    int listen_fd;
    int sig_fd;
    uint64_t next_conn_id;
    conn_t *conns;
    unsigned n_conns;
    kvp_master_state_t state;
    parked_t *parked;
    bool stop;
    /* high availability (kvp_master_server_elect): NULL when standalone */
    kvp_election_t *el;
    uint64_t epoch;      /* the epoch this master leads (led) under; 0: never led */
    bool reset_pending;  /* it leads again under a new epoch: drop the old state first */
    char self[300];      /* its address in etcd */
    pthread_t ha_thread; /* lists the standbys for Stat, once a second */
    bool ha_started;
    pthread_mutex_t ha_lock;
    pthread_cond_t ha_cond;
    bool ha_stop;
    char standbys[1024]; /* ha_lock */
    /* operations (master/obs/) */
    kvp_master_http_t *http; /* NULL: --http-listen off (or its default was taken) */
    int http_fd;             /* its eventfd (epoll marker: &http_fd) */
    kvp_events_t *events;    /* NULL: no --kv-events-bind */
    kvp_rpc_hist_t hist[KVP_RPC_METHOD_MAX + 1];
    /* security (master/auth/): both NULL without --tls-cert; SIGHUP reloads both */
    kvp_tls_t *tls;
    kvp_acl_t *acl;
};

/* What the state holds of the server's (again after drop_all re-creates the state). */
static void attach_obs(kvp_master_server_t *srv)
{
    srv->state.events = srv->events;
    srv->state.rpc_hist = srv->hist;
    srv->state.clients = srv->n_conns;
}

static void conn_close(kvp_master_server_t *srv, conn_t *c)
{
    for (parked_t **pp = &srv->parked; *pp != NULL;) {
        parked_t *p = *pp;
        if (p->conn_id == c->id) {
            *pp = p->next;
            free(p);
        } else {
            pp = &p->next;
        }
    }
    kvp_segment_table_t *t = &srv->state.segments;
    for (uint32_t i = 0; i < t->n_slots; i++)
        if (t->slots[i] != NULL && t->slots[i]->record_stream == c)
            t->slots[i]->record_stream = NULL; /* its changes wait for the next stream */
    kvp_dispatch_conn_closed(&srv->state, c->id);
    epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    kvp_tls_free(c->ssl);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->n_conns--;
    srv->state.clients = srv->n_conns;
    KVP_LOG_DEBUG("connection %llu closed", (unsigned long long)c->id);
    free(c->in);
    free(c->out);
    free(c);
}

static bool out_reserve(conn_t *c, size_t n)
{
    if (c->out_off > 0 && c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->out_len + n <= c->out_cap)
        return true;
    if (c->out_off > 0) {
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
        if (c->out_len + n <= c->out_cap)
            return true;
    }
    if (c->out_len + n > KVP_MASTER_MAX_OUTBUF)
        return false;
    size_t cap = KVP_MAX(c->out_cap * 2, c->out_len + n);
    uint8_t *p = realloc(c->out, cap);
    if (p == NULL)
        return false;
    c->out = p;
    c->out_cap = cap;
    return true;
}

/* Queue one frame. false: the peer is not draining its replies, close it. */
static bool queue_frame(kvp_master_server_t *srv, conn_t *c, uint16_t method, uint64_t req_id,
                        int32_t status, const void *body, size_t len)
{
    if (!out_reserve(c, KVP_RPC_HDR_LEN + len))
        return false;
    kvp_rpc_hdr_t h = {.method = method,
                       .request_id = req_id,
                       .body_len = (uint32_t)len,
                       .status = status,
                       .epoch = srv->epoch};
    kvp_rpc_hdr_pack(&h, c->out + c->out_len);
    if (len)
        memcpy(c->out + c->out_len + KVP_RPC_HDR_LEN, body, len);
    c->out_len += KVP_RPC_HDR_LEN + len;
    return true;
}

static void set_events(kvp_master_server_t *srv, conn_t *c, bool want_out)
{
    if (c->want_out == want_out)
        return;
    struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(srv->epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = want_out;
}

/* Write what the socket takes. false: the connection failed, close it. */
static bool flush_out(kvp_master_server_t *srv, conn_t *c)
{
    while (c->out_off < c->out_len) {
        if (c->ssl != NULL) {
            char err[256];
            ssize_t n = kvp_tls_write(c->ssl, c->out + c->out_off, c->out_len - c->out_off, err,
                                      sizeof(err));
            if (n == KVP_TLS_WANT_WRITE || n == KVP_TLS_WANT_READ) {
                set_events(srv, c, true);
                return true;
            }
            if (n < 0)
                return false;
            c->out_off += (size_t)n;
            continue;
        }
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                set_events(srv, c, true);
                return true;
            }
            return false;
        }
        c->out_off += (size_t)n;
    }
    c->out_off = c->out_len = 0;
    set_events(srv, c, false);
    return !c->close_after;
}

static void reply_error(kvp_master_server_t *srv, conn_t *c, const kvp_rpc_hdr_t *h,
                        kvp_status_t status, const char *msg)
{
    queue_frame(srv, c, (uint16_t)(h->method | KVP_RPC_RESPONSE_BIT), h->request_id, status, msg,
                strlen(msg));
}

/* ---- high availability ---- */

/* Close every connection and let go of every held request. */
static void close_all(kvp_master_server_t *srv)
{
    while (srv->conns != NULL)
        conn_close(srv, srv->conns);
    while (srv->parked != NULL) {
        parked_t *p = srv->parked;
        srv->parked = p->next;
        free(p);
    }
}

/* Forget everything this master knew as a leader: every connection closes (clients find
 * the leader again and remount there), the metadata starts empty. */
static void drop_all(kvp_master_server_t *srv)
{
    close_all(srv);
    kvp_master_config_t cfg = srv->state.config;
    kvp_master_state_cleanup(&srv->state);
    kvp_master_state_init(&srv->state);
    srv->state.config = cfg;
    attach_obs(srv);
}

/*
 * May this master answer requests now? Standalone: always. With an election: only while
 * it leads and its lease is surely alive (kvp_election_leading: a master paused past its
 * TTL gets false on its first call after waking). A new epoch (this master just won)
 * starts from an empty index: the owners remount and offer their records.
 */
static bool may_serve(kvp_master_server_t *srv)
{
    if (srv->el == NULL)
        return true;
    uint64_t epoch;
    if (!kvp_election_leading(srv->el, kvp_now_ms(), &epoch))
        return false;
    if (epoch != srv->epoch) {
        if (srv->epoch != 0) {
            /* led before, under another epoch: that index is stale. Dropped by the loop
             * (ha_tick), never here: a connection is being served. */
            srv->reset_pending = true;
            return false;
        }
        srv->epoch = epoch;
        srv->state.epoch = epoch;
        snprintf(srv->state.leader, sizeof(srv->state.leader), "%s", srv->self);
        srv->state.rebuild_until_ms = kvp_now_ms() + KVP_REBUILD_GRACE_MS;
        KVP_LOG_INFO("leading cluster as %s, epoch %llu: the index starts empty; segment owners "
                     "remount and offer their records",
                     srv->self, (unsigned long long)epoch);
    }
    return true;
}

static void not_leader_msg(kvp_master_server_t *srv, char *buf, size_t len)
{
    char leader[300];
    uint64_t epoch = 0;
    if (kvp_election_leader(srv->el, leader, sizeof(leader), &epoch) == KVP_OK &&
        strcmp(leader, srv->self) != 0)
        snprintf(buf, len, "%.100s is a standby: the leader is %.100s (epoch %llu)", srv->self,
                 leader, (unsigned long long)epoch);
    else if (srv->epoch == 0)
        snprintf(buf, len, "%.100s is a standby: campaigning, no leader known yet", srv->self);
    else
        snprintf(buf, len, "%.100s is not sure it still leads (its etcd lease is unconfirmed)",
                 srv->self);
}

/* Twice a second: a leader that lost for good (another master leads now) steps down; the
 * standby list Stat shows is refreshed. */
static void ha_tick(kvp_master_server_t *srv)
{
    if (srv->el == NULL)
        return;
    char leader[300] = "";
    uint64_t epoch = 0;
    bool known = kvp_election_leader(srv->el, leader, sizeof(leader), &epoch) == KVP_OK;
    if (srv->reset_pending ||
        (srv->epoch != 0 && known && (strcmp(leader, srv->self) != 0 || epoch != srv->epoch) &&
         !kvp_election_leading(srv->el, kvp_now_ms(), NULL))) {
        KVP_LOG_WARN("stepping down: %s leads now (epoch %llu, was %llu here); dropping %llu "
                     "objects and %u connections",
                     leader, (unsigned long long)epoch, (unsigned long long)srv->epoch,
                     (unsigned long long)srv->state.index.count, srv->n_conns);
        drop_all(srv);
        srv->epoch = 0;
        srv->state.epoch = 0;
        srv->reset_pending = false;
    }
    snprintf(srv->state.leader, sizeof(srv->state.leader), "%s", known ? leader : "");
    pthread_mutex_lock(&srv->ha_lock);
    snprintf(srv->state.standbys, sizeof(srv->state.standbys), "%s", srv->standbys);
    pthread_mutex_unlock(&srv->ha_lock);
}

static void standby_cb(const char *addr, void *arg)
{
    char *buf = arg;
    size_t n = strlen(buf);
    if (n + strlen(addr) + 2 < 1024)
        snprintf(buf + n, 1024 - n, "%s%s", n ? "," : "", addr);
}

/* The standbys, listed from etcd once a second off the loop thread (a blocking read). */
static void *ha_main(void *arg)
{
    kvp_master_server_t *srv = arg;
    pthread_mutex_lock(&srv->ha_lock);
    while (!srv->ha_stop) {
        pthread_mutex_unlock(&srv->ha_lock);
        char buf[1024] = "";
        bool ok = kvp_election_standbys(srv->el, standby_cb, buf) == KVP_OK;
        pthread_mutex_lock(&srv->ha_lock);
        if (ok)
            snprintf(srv->standbys, sizeof(srv->standbys), "%s", buf);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        if (!srv->ha_stop)
            pthread_cond_timedwait(&srv->ha_cond, &srv->ha_lock, &ts);
    }
    pthread_mutex_unlock(&srv->ha_lock);
    return NULL;
}

kvp_status_t kvp_master_server_elect(kvp_master_server_t *srv, const kvp_election_params_t *p)
{
    snprintf(srv->self, sizeof(srv->self), "%s", p->self);
    kvp_status_t st = kvp_election_start(p, &srv->el);
    if (st != KVP_OK)
        return st;
    if (pthread_create(&srv->ha_thread, NULL, ha_main, srv) == 0)
        srv->ha_started = true;
    return KVP_OK;
}

/* Protected mode: a peer of another host gets KVP_ERR_DENIED for its first request, as soon
 * as its header is in (its body is never read), and the connection closes. */
static void refuse_protected(kvp_master_server_t *srv, conn_t *c)
{
    kvp_rpc_hdr_t h = {0};
    (void)kvp_rpc_hdr_unpack(c->in, KVP_RPC_MAX_BODY, &h); /* its id and method, if a frame */
    char peer[80];
    kvp_sock_peer_name(c->fd, peer, sizeof(peer));
    KVP_LOG_WARN_LIMITED("connection %llu from %s refused: protected mode takes connections from "
                         "this host only (--auth none opens the port to a trusted network)",
                         (unsigned long long)c->id, peer);
    srv->state.stats.refused_protected++;
    reply_error(srv, c, &h, KVP_ERR_DENIED,
                "protected mode: this master takes connections from its own host only; start it "
                "with --auth none on a trusted network");
    c->in_len = 0;
    c->close_after = true;
}

/* ---- who is calling (--acl-file) ---- */

/* A refusal of the ACL: logged (rate-limited, with the peer and the principal, never a
 * secret), answered with KVP_ERR_DENIED and msg; close: the connection ends after it. */
static void deny(kvp_master_server_t *srv, conn_t *c, const kvp_rpc_hdr_t *h, const char *msg,
                 bool close)
{
    char peer[80];
    kvp_sock_peer_name(c->fd, peer, sizeof(peer));
    KVP_LOG_WARN_LIMITED("connection %llu from %s (principal %s) refused: %s",
                         (unsigned long long)c->id, peer, c->pname[0] ? c->pname : "none", msg);
    reply_error(srv, c, h, KVP_ERR_DENIED, msg);
    if (close)
        c->close_after = true;
}

static void set_who(conn_t *c, const kvp_principal_t *who)
{
    c->who = who;
    snprintf(c->pname, sizeof(c->pname), "%s", who->name);
}

/* Auth: a token names the connection's principal. */
static void handle_auth(kvp_master_server_t *srv, conn_t *c, const kvp_rpc_hdr_t *h,
                        const uint8_t *body)
{
    Kvpool__AuthRequest *req = kvpool__auth_request__unpack(NULL, h->body_len, body);
    const kvp_principal_t *who =
        req != NULL ? kvp_acl_by_token(srv->acl, req->token.data, req->token.len) : NULL;
    if (req != NULL) {
        OPENSSL_cleanse(req->token.data, req->token.len);
        kvpool__auth_request__free_unpacked(req, NULL);
    }
    OPENSSL_cleanse((uint8_t *)body, h->body_len); /* the token's bytes in the input buffer */
    if (who == NULL || (c->who != NULL && c->who != who)) {
        srv->state.stats.refused_token++;
        deny(srv, c, h,
             who == NULL ? "authentication failed: no principal has this token"
                         : "authentication failed: the token names another principal than the "
                           "one this connection already has",
             true);
        return;
    }
    set_who(c, who);
    Kvpool__AuthResponse resp = KVPOOL__AUTH_RESPONSE__INIT;
    resp.principal = (char *)who->name;
    resp.tenant = (char *)who->tenant;
    resp.roles = who->roles;
    uint8_t buf[512];
    size_t len = kvpool__auth_response__get_packed_size(&resp);
    if (len > sizeof(buf)) {
        reply_error(srv, c, h, KVP_ERR_NOMEM, "auth response too large");
        return;
    }
    kvpool__auth_response__pack(&resp, buf);
    queue_frame(srv, c, (uint16_t)(h->method | KVP_RPC_RESPONSE_BIT), h->request_id, 0, buf, len);
    KVP_LOG_DEBUG("connection %llu: principal %s (token)", (unsigned long long)c->id, who->name);
}

/*
 * Before a request is dispatched with an ACL on: may this connection send it? Answers
 * Auth itself. false: the frame is answered (or the connection is closing): skip it.
 */
static bool admit(kvp_master_server_t *srv, conn_t *c, const kvp_rpc_hdr_t *h, const uint8_t *body)
{
    if (c->removed) {
        srv->state.stats.refused_removed++;
        char msg[256];
        snprintf(msg, sizeof(msg), "principal %s was removed from the ACL", c->pname);
        deny(srv, c, h, msg, true);
        return false;
    }
    if (h->method == KVP_RPC_AUTH) {
        handle_auth(srv, c, h, body);
        return false;
    }
    if (c->who == NULL) {
        srv->state.stats.refused_unauth++;
        deny(srv, c, h,
             "authentication required: present a client certificate the ACL names "
             "(KVPOOL_TLS_CERT) or send a token (KVPOOL_TOKEN)",
             true);
        return false;
    }
    return true;
}

/* Admin actions go to the audit log: who, from where, what, and how it ended. */
static void audit(conn_t *c, uint16_t method, const uint8_t *body, size_t len, kvp_status_t s,
                  const uint8_t *resp, size_t rlen)
{
    char what[600], outcome[400];
    if (method == KVP_RPC_DRAIN) {
        Kvpool__DrainRequest *r = kvpool__drain_request__unpack(NULL, len, body);
        snprintf(what, sizeof(what), "drain of segment %.200s",
                 r == NULL            ? "?"
                 : r->segment_name[0] ? r->segment_name
                                      : "(by id)");
        if (r != NULL)
            kvpool__drain_request__free_unpacked(r, NULL);
        Kvpool__DrainResponse *a =
            s == KVP_OK ? kvpool__drain_response__unpack(NULL, rlen, resp) : NULL;
        if (a != NULL)
            s = a->status;
        snprintf(outcome, sizeof(outcome), "%.390s",
                 a != NULL && a->message[0] ? a->message
                 : s == KVP_OK              ? "draining"
                                            : kvp_strerror(s));
        if (a != NULL)
            kvpool__drain_response__free_unpacked(a, NULL);
    } else if (method == KVP_RPC_REMOVE_BY_REGEX) {
        Kvpool__RemoveByRegexRequest *r = kvpool__remove_by_regex_request__unpack(NULL, len, body);
        if (r != NULL && r->all)
            snprintf(what, sizeof(what), "remove-all%s", r->force ? " --force" : "");
        else
            snprintf(what, sizeof(what), "remove-by-regex '%.300s'%s", r ? r->pattern : "?",
                     r && r->force ? " --force" : "");
        if (r != NULL)
            kvpool__remove_by_regex_request__free_unpacked(r, NULL);
        Kvpool__RemoveByRegexResponse *a =
            s == KVP_OK ? kvpool__remove_by_regex_response__unpack(NULL, rlen, resp) : NULL;
        if (a != NULL)
            s = a->status;
        if (a != NULL && s == KVP_OK)
            snprintf(outcome, sizeof(outcome), "%llu objects removed",
                     (unsigned long long)a->removed);
        else
            snprintf(outcome, sizeof(outcome), "%.390s",
                     a != NULL && a->message[0] ? a->message : kvp_strerror(s));
        if (a != NULL)
            kvpool__remove_by_regex_response__free_unpacked(a, NULL);
    } else {
        return;
    }
    char peer[80];
    kvp_sock_peer_name(c->fd, peer, sizeof(peer));
    KVP_LOG_INFO("audit: %s by principal %s (connection %llu from %s): %s", what,
                 c->pname[0] ? c->pname : "(no ACL)", (unsigned long long)c->id, peer, outcome);
}

/* The handshake just ended: a certificate the ACL names makes the connection's principal. */
static void check_cert(kvp_master_server_t *srv, conn_t *c)
{
    c->cert_checked = true;
    char cn[256];
    const kvp_principal_t *who;
    if (kvp_tls_peer_cn(c->ssl, cn, sizeof(cn)) && (who = kvp_acl_by_cn(srv->acl, cn)) != NULL) {
        set_who(c, who);
        KVP_LOG_DEBUG("connection %llu: principal %s (certificate)", (unsigned long long)c->id,
                      who->name);
    }
}

/* SIGHUP: read the ACL (and the TLS files) again. Live connections keep their principal by
 * name: a narrowed one is held to its new roles from its next request, a removed one is
 * refused and closed at its next. A file that does not load changes nothing. */
/* Read the TLS files and the ACL of cfg (at start and at each SIGHUP): both or neither;
 * why in err (a file and what is wrong with it, never a key's bytes). */
static kvp_status_t security_read(const kvp_master_config_t *cfg, kvp_tls_t **tls_p,
                                  kvp_acl_t **acl_p, char *err, size_t err_len)
{
    kvp_tls_params_t tp = {.cert = cfg->tls_cert,
                           .key = cfg->tls_key,
                           .ca = cfg->tls_ca[0] ? cfg->tls_ca : NULL,
                           .crl = cfg->tls_crl[0] ? cfg->tls_crl : NULL};
    kvp_status_t st = kvp_tls_create(&tp, true, tls_p, err, err_len);
    if (st != KVP_OK)
        return st;
    st = kvp_acl_load(cfg->acl_file, acl_p, err, err_len);
    if (st != KVP_OK) {
        kvp_tls_destroy(*tls_p);
        *tls_p = NULL;
    }
    return st;
}

/* The ACL's tenants into the master's table: each principal's tenant id, each tenant's
 * quotas and share (those the file no longer names have none). Keys are scoped by tenant
 * from now on. false: the table is full (KVP_TENANT_MAX). */
static bool install_tenants(kvp_master_state_t *st, kvp_acl_t *acl)
{
    for (size_t i = 0; i < acl->n; i++) {
        kvp_principal_t *p = &acl->p[i];
        int32_t id = kvp_tenant_id(&st->tenants, p->tenant, strlen(p->tenant), true);
        if (id < 0)
            return false;
        p->tenant_id = (uint16_t)id;
    }
    for (uint32_t i = 0; i < st->tenants.n; i++) {
        kvp_tenant_t *t = &st->tenants.t[i];
        t->max_dram = t->max_ssd = t->max_objects = 0;
        t->share_permille = 0;
    }
    for (size_t i = 0; i < acl->n_tenants; i++) {
        const kvp_tenant_conf_t *c = &acl->t[i];
        int32_t id = kvp_tenant_id(&st->tenants, c->name, strlen(c->name), true);
        if (id < 0)
            return false;
        kvp_tenant_t *t = &st->tenants.t[id];
        t->max_dram = c->max_dram;
        t->max_ssd = c->max_ssd;
        t->max_objects = c->max_objects;
        t->share_permille = c->share_permille;
    }
    st->tenants_on = true;
    return true;
}

static void reload_security(kvp_master_server_t *srv)
{
    const kvp_master_config_t *cfg = &srv->state.config;
    kvp_events_reload(srv->events); /* the KV events' CURVE allow-list */
    if (srv->acl == NULL) {
        KVP_LOG_INFO("SIGHUP: no --acl-file to reload");
        return;
    }
    char err[512];
    kvp_acl_t *acl;
    kvp_tls_t *tls;
    if (security_read(cfg, &tls, &acl, err, sizeof(err)) != KVP_OK) {
        KVP_LOG_ERROR("audit: ACL reload failed, the old ACL stays: %s", err);
        return;
    }
    if (!install_tenants(&srv->state, acl)) {
        KVP_LOG_ERROR("audit: ACL reload failed, the old ACL stays: more than %u tenants",
                      KVP_TENANT_MAX - 1);
        kvp_acl_destroy(acl);
        kvp_tls_destroy(tls);
        return;
    }
    unsigned removed = 0;
    for (conn_t *c = srv->conns; c != NULL; c = c->next) {
        if (c->who == NULL)
            continue;
        c->who = kvp_acl_by_name(acl, c->pname);
        if (c->who == NULL) {
            c->removed = true;
            removed++;
        }
    }
    kvp_acl_destroy(srv->acl);
    srv->acl = acl;
    kvp_tls_destroy(srv->tls); /* sessions open keep the old context's reference */
    srv->tls = tls;
    KVP_LOG_INFO("audit: ACL reloaded from %s: %zu principals; %u connections of removed "
                 "principals will be refused",
                 cfg->acl_file, acl->n, removed);
}

/* Dispatch every whole frame in the input buffer. false: close the connection. */
static bool process_input(kvp_master_server_t *srv, conn_t *c)
{
    if (c->refuse) {
        if (c->in_len >= KVP_RPC_HDR_LEN && !c->close_after)
            refuse_protected(srv, c);
        return true;
    }
    size_t off = 0;
    bool ok = true;
    while (!c->close_after) {
        kvp_rpc_hdr_t h;
        size_t flen;
        uint32_t max_body =
            srv->acl != NULL && c->who == NULL && !c->removed ? PREAUTH_MAX_BODY : KVP_RPC_MAX_BODY;
        kvp_status_t s = kvp_rpc_frame_scan(c->in + off, c->in_len - off, max_body, &h, &flen);
        if (s == KVP_ERR_PENDING) {
            /* The buffer grows as bytes arrive (on_readable), not from what a header
             * announces: a peer that sends a header and stalls pins no memory. */
            break;
        }
        if (s == KVP_ERR_PROTOCOL) {
            KVP_LOG_WARN_LIMITED("connection %llu: not a kvpool frame (bad magic); closing",
                                 (unsigned long long)c->id);
            return false;
        }
        if (s != KVP_OK) {
            char msg[256];
            snprintf(msg, sizeof(msg),
                     "%s (version %u, body %u bytes; this master speaks "
                     "version %u, at most %u bytes%s)",
                     kvp_strerror(s), h.version, h.body_len, KVP_RPC_VERSION, max_body,
                     max_body == PREAUTH_MAX_BODY ? " before authentication" : "");
            KVP_LOG_WARN_LIMITED("connection %llu: %s; closing", (unsigned long long)c->id, msg);
            reply_error(srv, c, &h, s, msg);
            c->close_after = true;
            break;
        }
        uint8_t *resp = NULL;
        size_t rlen = 0;
        char errmsg[256] = "";
        const uint8_t *body = c->in + off + KVP_RPC_HDR_LEN;
        if (srv->acl != NULL && !admit(srv, c, &h, body)) {
            off += flen;
            continue;
        }
        if (h.method & KVP_RPC_RESPONSE_BIT) {
            s = KVP_ERR_PROTOCOL;
            snprintf(errmsg, sizeof(errmsg), "a response frame sent to the master");
        } else if (!may_serve(srv)) {
            /* a standby, or a leader not sure of its lease: nothing is answered, nothing
             * changes (fencing) */
            s = KVP_ERR_NOT_LEADER;
            not_leader_msg(srv, errmsg, sizeof(errmsg));
        } else {
            srv->state.may_park = true;
            srv->state.park_retry = false;
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            srv->state.call_has_fd = true;
            srv->state.call_fd = c->fd;
            s = kvp_dispatch_handle(&srv->state, c->id, c->who, h.method, body, h.body_len, &resp,
                                    &rlen, errmsg, sizeof(errmsg));
            srv->state.call_has_fd = false;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (s == KVP_ERR_DENIED) {
                char peer[80];
                kvp_sock_peer_name(c->fd, peer, sizeof(peer));
                KVP_LOG_WARN_LIMITED("connection %llu from %s: %s", (unsigned long long)c->id, peer,
                                     errmsg);
            }
            audit(c, h.method, body, h.body_len, s, resp, rlen);
            srv->state.may_park = false;
            if (h.method <= KVP_RPC_METHOD_MAX) {
                uint64_t ns = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u +
                              (uint64_t)t1.tv_nsec - (uint64_t)t0.tv_nsec;
                kvp_rpc_hist_t *hist = &srv->hist[h.method];
                unsigned b = 0;
                while (b < KVP_RPC_BUCKETS - 1 && ns > kvp_rpc_bucket_us[b] * 1000ull)
                    b++;
                hist->count[b]++;
                hist->sum_ns += ns;
            }
        }
        if (srv->state.stream_segment != 0) {
            /* SegRecord: this connection now carries the segment's record changes */
            kvp_segment_t *seg =
                kvp_segment_table_get(&srv->state.segments, srv->state.stream_segment);
            srv->state.stream_segment = 0;
            if (seg != NULL) {
                seg->record_stream = c;
                seg->record_req_id = h.request_id;
                seg->record_ack = true; /* the owner waits for it before it opens the segment */
                kvp_record_relist(&srv->state.segments, seg); /* what is queued goes now */
            }
        } else if (srv->state.parked) {
            /* no answer yet: hold the request (answer_parked answers it) */
            srv->state.parked = false;
            parked_t *p = malloc(sizeof(*p) + h.body_len);
            if (p == NULL) {
                reply_error(srv, c, &h, KVP_ERR_NOMEM, "out of memory");
            } else {
                p->conn_id = c->id;
                p->req_id = h.request_id;
                p->method = h.method;
                p->deadline_ms = srv->state.now_ms + PARK_MS;
                p->len = h.body_len;
                memcpy(p->body, c->in + off + KVP_RPC_HDR_LEN, h.body_len);
                p->next = srv->parked;
                srv->parked = p;
            }
        } else if (kvp_rpc_is_oneway(h.method)) {
            /* the sender waits for nothing: an error is only logged */
            if (s != KVP_OK)
                KVP_LOG_WARN_LIMITED("connection %llu: one-way method %u: %s",
                                     (unsigned long long)c->id, h.method, errmsg);
        } else if (s == KVP_OK) {
            ok = queue_frame(srv, c, (uint16_t)(h.method | KVP_RPC_RESPONSE_BIT), h.request_id, 0,
                             resp, rlen);
        } else {
            reply_error(srv, c, &h, s, errmsg);
        }
        free(resp);
        off += flen;
        if (!ok)
            return false;
    }
    if (off > 0) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    return true;
}

static void push_records(kvp_master_server_t *srv);

static void on_readable(kvp_master_server_t *srv, conn_t *c)
{
    for (;;) {
        if (c->in_cap - c->in_len < READ_CHUNK / 4) {
            size_t cap = KVP_MAX(c->in_cap * 2, (size_t)READ_CHUNK);
            if (cap > KVP_RPC_HDR_LEN + (size_t)KVP_RPC_MAX_BODY + READ_CHUNK)
                cap = KVP_RPC_HDR_LEN + (size_t)KVP_RPC_MAX_BODY + READ_CHUNK;
            if (cap > c->in_cap) {
                uint8_t *p = realloc(c->in, cap);
                if (p == NULL) {
                    conn_close(srv, c);
                    return;
                }
                c->in = p;
                c->in_cap = cap;
            }
        }
        ssize_t n;
        if (c->ssl != NULL) {
            char err[256];
            n = kvp_tls_read(c->ssl, c->in + c->in_len, c->in_cap - c->in_len, err, sizeof(err));
            if (n == KVP_TLS_WANT_READ || n == KVP_TLS_WANT_WRITE) {
                if (n == KVP_TLS_WANT_WRITE)
                    set_events(srv, c, true);
                if (!c->cert_checked && kvp_tls_established(c->ssl))
                    check_cert(srv, c);
                break;
            }
            if (n < 0) {
                char peer[80];
                kvp_sock_peer_name(c->fd, peer, sizeof(peer));
                srv->state.stats.refused_tls++;
                KVP_LOG_WARN_LIMITED("connection %llu from %s refused: %s",
                                     (unsigned long long)c->id, peer, err);
                conn_close(srv, c);
                return;
            }
            if (n > 0 && !c->cert_checked)
                check_cert(srv, c);
        } else {
            n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        }
        if (n == 0) {
            conn_close(srv, c);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            conn_close(srv, c);
            return;
        }
        c->in_len += (size_t)n;
        c->last_rx_ms = srv->state.now_ms;
        if (!process_input(srv, c)) {
            conn_close(srv, c);
            return;
        }
        if (c->close_after)
            break;
    }
    /* An owner's record learns of the puts that just ended before their writers do: its
     * stream is written first (meta/record.c). */
    push_records(srv);
    if (c->in_len == 0 && c->in_cap > 4 * READ_CHUNK) {
        /* a big request went through: give its buffer back */
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
    if (!flush_out(srv, c))
        conn_close(srv, c);
}

static void on_accept(kvp_master_server_t *srv)
{
    for (;;) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                KVP_LOG_WARN_LIMITED("accept failed: %m");
            return;
        }
        conn_t *c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->id = ++srv->next_conn_id;
        /* replies go out at once: over TLS a large reply is several records, and Nagle
         * would hold each record's last partial segment for the client's delayed ACK */
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        /* credentials configured: anyone may connect, and must name a principal */
        c->refuse = srv->tls == NULL && strcmp(srv->state.config.auth, "protected") == 0 &&
                    !kvp_sock_peer_local(fd);
        if (srv->tls != NULL && kvp_tls_accept(srv->tls, fd, &c->ssl) != KVP_OK) {
            close(fd);
            free(c);
            continue;
        }
        c->last_rx_ms = srv->state.now_ms;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            kvp_tls_free(c->ssl);
            close(fd);
            free(c);
            continue;
        }
        c->next = srv->conns;
        if (srv->conns)
            srv->conns->prev = c;
        srv->conns = c;
        srv->n_conns++;
        srv->state.clients = srv->n_conns;
        KVP_LOG_DEBUG("connection %llu accepted", (unsigned long long)c->id);
    }
}

/* --http-listen and --kv-events-bind (master/obs/). */
static kvp_status_t start_obs(kvp_master_server_t *srv)
{
    const kvp_master_config_t *cfg = &srv->state.config;
    srv->http_fd = -1;
    if (strcmp(cfg->http_listen, "off") != 0) {
        uint16_t port = 0;
        bool tls = cfg->tls_cert[0] != '\0'; /* HTTPS with the same certificate */
        kvp_status_t s = kvp_master_http_start(
            cfg->http_listen, tls ? cfg->tls_cert : NULL, tls ? cfg->tls_key : NULL,
            tls && cfg->tls_ca[0] != '\0' ? cfg->tls_ca : NULL, &srv->http, &port);
        if (s != KVP_OK && cfg->http_listen_given) {
            KVP_LOG_ERROR("--http-listen %s: %s", cfg->http_listen,
                          s == KVP_ERR_INVALID_ARG ? "needs IPV4:PORT (or off)"
                                                   : "cannot listen there");
            return s;
        }
        if (s != KVP_OK) {
            KVP_LOG_WARN("HTTP (/metrics, /health) not served: cannot listen on the default %s "
                         "(taken?); give --http-listen HOST:PORT or off",
                         cfg->http_listen);
        } else {
            srv->http_fd = kvp_master_http_fd(srv->http);
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &srv->http_fd};
            epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->http_fd, &ev);
            char host[256];
            uint16_t p0;
            kvp_parse_hostport(cfg->http_listen, host, sizeof(host), &p0);
            KVP_LOG_INFO("HTTP on %s:%u (/metrics, /health, /api/v1/...)", host, port);
        }
    }
    if (cfg->kv_events_bind[0] != '\0') {
        kvp_events_params_t p;
        kvp_events_params_init(&p);
        p.bind = cfg->kv_events_bind;
        p.replay_bind = cfg->kv_events_replay[0] ? cfg->kv_events_replay : NULL;
        p.topic = cfg->kv_events_topic;
        p.queue_max = cfg->kv_events_queue;
        p.replay_batches = cfg->kv_events_replay_batches;
        p.model_name = cfg->kv_events_model;
        p.block_size = cfg->kv_events_block_size;
        p.tenant_id = cfg->kv_events_tenant;
        p.backend_id = cfg->kv_events_backend_id;
        p.dp_rank = (int32_t)cfg->kv_events_dp_rank;
        p.curve_secret = cfg->kv_events_curve_secret;
        p.curve_allow = cfg->kv_events_curve_allow;
        p.tenants = cfg->acl_file[0] != '\0';
        char err[256] = "";
        kvp_status_t s = kvp_events_create(&p, &srv->events, err, sizeof(err));
        if (s != KVP_OK) {
            KVP_LOG_ERROR("--kv-events-bind %s: %s", cfg->kv_events_bind,
                          err[0] ? err : kvp_strerror(s));
            kvp_master_http_stop(srv->http);
            srv->http = NULL;
            return s;
        }
        const char *replay = kvp_events_endpoint(srv->events, 1);
        KVP_LOG_INFO("KV events on %s (replay: %s)", kvp_events_endpoint(srv->events, 0),
                     replay != NULL && replay[0] ? replay : "none");
    }
    return KVP_OK;
}

/* For /health and /metrics: does this master serve? (No side effects, unlike may_serve.) */
static void fill_view(kvp_master_server_t *srv, kvp_master_view_t *v, char *reason, size_t len)
{
    uint64_t epoch = 0;
    v->ha = srv->el != NULL;
    v->self = srv->self;
    v->events = srv->events;
    v->acl = srv->acl;
    v->tls = srv->tls;
    v->serving = srv->el == NULL || (kvp_election_leading(srv->el, kvp_now_ms(), &epoch) &&
                                     epoch == srv->epoch && !srv->reset_pending);
    reason[0] = '\0';
    if (!v->serving)
        not_leader_msg(srv, reason, len);
    v->reason = reason;
}

/* --tls-* and --acl-file, at start. */
static kvp_status_t load_security(kvp_master_server_t *srv)
{
    const kvp_master_config_t *cfg = &srv->state.config;
    if (cfg->tls_cert[0] == '\0')
        return KVP_OK;
    char err[512];
    kvp_status_t st = security_read(cfg, &srv->tls, &srv->acl, err, sizeof(err));
    if (st != KVP_OK) {
        KVP_LOG_ERROR("%s", err);
        return st;
    }
    if (srv->acl != NULL && !install_tenants(&srv->state, srv->acl)) {
        KVP_LOG_ERROR("%s: more than %u tenants", cfg->acl_file, KVP_TENANT_MAX - 1);
        return KVP_ERR_INVALID_ARG;
    }
    KVP_LOG_INFO("TLS 1.3 on the control port (client certificates %s); ACL %s: %zu principals",
                 cfg->tls_ca[0] ? "verified against --tls-ca" : "not asked for", cfg->acl_file,
                 srv->acl->n);
    /* data grants: a new epoch each start, so no grant of an earlier master is taken */
    if (cfg->data_grants) {
        if (!kvp_grant_random(&srv->state.grant_epoch, sizeof(srv->state.grant_epoch))) {
            KVP_LOG_ERROR("cannot draw the data grants' epoch (no randomness)");
            return KVP_ERR_INTERNAL;
        }
        srv->state.grants_on = true;
        KVP_LOG_INFO("data grants on: tcp data requests to segments mounted here need a grant "
                     "this master sealed (--data-grants off to serve any)");
    } else {
        KVP_LOG_WARN("data grants off (--data-grants off): any peer that reaches a segment's "
                     "data port may read and write it");
    }
    return KVP_OK;
}

kvp_status_t kvp_master_server_create(const char *host, uint16_t port,
                                      const kvp_master_config_t *config,
                                      kvp_master_server_t **srv_p, uint16_t *bound_port_p)
{
    kvp_master_server_t *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return KVP_ERR_NOMEM;
    pthread_mutex_init(&srv->ha_lock, NULL);
    pthread_cond_init(&srv->ha_cond, NULL);
    kvp_status_t status = kvp_master_state_init(&srv->state);
    if (status != KVP_OK)
        goto err_free;
    if (config != NULL)
        srv->state.config = *config;
    status = load_security(srv);
    if (status != KVP_OK)
        goto err_state;
    /* the owners of a restarted master's segments come back within a heartbeat or so */
    srv->state.rebuild_until_ms = kvp_now_ms() + KVP_REBUILD_GRACE_MS;
    status = kvp_tcp_listen(host, port, 1024, &srv->listen_fd, bound_port_p);
    if (status != KVP_OK) {
        KVP_LOG_ERROR("--listen %s:%u: cannot listen there: %s", host, port, kvp_strerror(status));
        goto err_state;
    }
    if (fcntl(srv->listen_fd, F_SETFL, fcntl(srv->listen_fd, F_GETFL) | O_NONBLOCK) != 0) {
        status = KVP_ERR_SYSTEM;
        goto err_listen;
    }
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP); /* reloads the ACL */
    pthread_sigmask(SIG_BLOCK, &mask, NULL);
    srv->sig_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    srv->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (srv->sig_fd < 0 || srv->epfd < 0) {
        status = KVP_ERR_SYSTEM;
        goto err_fds;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &srv->listen_fd};
    epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->listen_fd, &ev);
    ev.data.ptr = &srv->sig_fd;
    epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->sig_fd, &ev);
    /* threads of their own from here on: they inherit the blocked signals */
    status = start_obs(srv);
    if (status != KVP_OK)
        goto err_fds;
    attach_obs(srv);
    *srv_p = srv;
    return KVP_OK;

err_fds:
    if (srv->sig_fd >= 0)
        close(srv->sig_fd);
    if (srv->epfd >= 0)
        close(srv->epfd);
err_listen:
    close(srv->listen_fd);
err_state:
    kvp_acl_destroy(srv->acl);
    kvp_tls_destroy(srv->tls);
    kvp_master_state_cleanup(&srv->state);
err_free:
    free(srv);
    return status;
}

/*
 * Liveness: clients heartbeat every second, so a connection that has sent
 * nothing for --client-ttl belongs to a dead, frozen or cut-off client. Closing
 * it unmounts its segments and revokes its puts; a client that was only slow
 * reconnects and remounts on its next heartbeat.
 */
static void expire_silent(kvp_master_server_t *srv)
{
    uint32_t ttl = srv->state.config.client_ttl_ms;
    if (ttl == 0)
        return;
    conn_t *c = srv->conns;
    while (c != NULL) {
        conn_t *next = c->next;
        uint64_t silent = srv->state.now_ms - c->last_rx_ms;
        char byte;
        if (silent > ttl && recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 1) {
            /* bytes are waiting: the loop was busy (a long request), not the client */
            c->last_rx_ms = srv->state.now_ms;
            silent = 0;
        }
        if (silent > ttl) {
            KVP_LOG_WARN("connection %llu silent for %llu ms (client ttl %u ms): dropping it, "
                         "its segments and its unfinished puts",
                         (unsigned long long)c->id, (unsigned long long)silent, ttl);
            conn_close(srv, c);
        }
        c = next;
    }
}

static conn_t *conn_find(kvp_master_server_t *srv, uint64_t id)
{
    for (conn_t *c = srv->conns; c != NULL; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

/*
 * Write each listed segment's queued record changes on its owner's SegRecord stream
 * (meta/record.c): called before the replies of the requests that made them are
 * flushed, so an owner's record has an object before its writer has the answer.
 */
static void push_records(kvp_master_server_t *srv)
{
    kvp_segment_table_t *t = &srv->state.segments;
    if (!t->records_dirty)
        return;
    t->records_dirty = false;
    size_t n = t->n_dirty;
    t->n_dirty = 0;
    for (size_t i = 0; i < n; i++) {
        kvp_segment_t *seg = kvp_segment_table_get(t, t->dirty_ids[i]);
        if (seg == NULL)
            continue;
        seg->record_listed = false;
        conn_t *c = seg->record_stream;
        if (c == NULL || (seg->rec_len == 0 && !seg->record_broken && !seg->record_ack))
            continue; /* no stream yet: the changes wait for one (bounded, record.c) */
        Kvpool__SegRecordResponse resp = KVPOOL__SEG_RECORD_RESPONSE__INIT;
        resp.changes.data = seg->rec;
        resp.changes.len = seg->rec_len;
        resp.broken = seg->record_broken;
        size_t len = kvpool__seg_record_response__get_packed_size(&resp);
        if (!out_reserve(c, KVP_RPC_HDR_LEN + len)) {
            kvp_record_relist(t, seg); /* out of memory: the next turn tries again */
            continue;
        }
        kvp_rpc_hdr_t h = {.method = KVP_RPC_SEG_RECORD | KVP_RPC_RESPONSE_BIT,
                           .request_id = seg->record_req_id,
                           .body_len = (uint32_t)len,
                           .epoch = srv->epoch};
        kvp_rpc_hdr_pack(&h, c->out + c->out_len);
        kvpool__seg_record_response__pack(&resp, c->out + c->out_len + KVP_RPC_HDR_LEN);
        c->out_len += KVP_RPC_HDR_LEN + len;
        uint8_t *buf;
        size_t blen;
        kvp_record_take(seg, &buf, &blen);
        free(buf);
        seg->record_ack = false;
        if (seg->record_broken) { /* said: the owner starts its record afresh */
            seg->record_broken = false;
            seg->record = true;
        }
        if (!flush_out(srv, c))
            set_events(srv, c, true); /* the loop sees the failure again and closes c */
    }
}

/* Call the held requests again (a task was queued, or their time is up): those that get
 * an answer are answered and let go. */
static void answer_parked(kvp_master_server_t *srv, bool tick)
{
    kvp_master_state_t *st = &srv->state;
    if (srv->parked == NULL || (!st->tasks_ready && !tick))
        return;
    st->tasks_ready = false;
    for (parked_t **pp = &srv->parked; *pp != NULL;) {
        parked_t *p = *pp;
        conn_t *c = conn_find(srv, p->conn_id);
        if (c == NULL) {
            *pp = p->next;
            free(p);
            continue;
        }
        uint8_t *resp = NULL;
        size_t rlen = 0;
        char errmsg[256] = "";
        st->may_park = st->now_ms < p->deadline_ms;
        st->park_retry = true;
        if (srv->acl != NULL && c->who == NULL) { /* its principal was removed meanwhile */
            kvp_rpc_hdr_t h = {.method = p->method, .request_id = p->req_id};
            srv->state.stats.refused_removed++;
            deny(srv, c, &h, "principal removed from the ACL", true);
            set_events(srv, c, true); /* the loop writes it, then closes c */
            *pp = p->next;
            free(p);
            continue;
        }
        kvp_status_t s = kvp_dispatch_handle(st, c->id, c->who, p->method, p->body, p->len, &resp,
                                             &rlen, errmsg, sizeof(errmsg));
        st->may_park = false;
        st->park_retry = false;
        if (st->parked) {
            st->parked = false;
            free(resp);
            pp = &p->next;
            continue;
        }
        kvp_rpc_hdr_t h = {.method = p->method, .request_id = p->req_id};
        if (s == KVP_OK)
            queue_frame(srv, c, (uint16_t)(p->method | KVP_RPC_RESPONSE_BIT), p->req_id, 0, resp,
                        rlen);
        else
            reply_error(srv, c, &h, s, errmsg);
        free(resp);
        set_events(srv, c, true); /* the loop writes it (and closes c if that fails) */
        *pp = p->next;
        free(p);
    }
}

kvp_status_t kvp_master_server_run(kvp_master_server_t *srv)
{
    struct epoll_event evs[128];
    uint64_t next_tick = 0;
    while (!srv->stop) {
        /* Timers: twice a second, reclaim timed-out puts and keep usage under the high
         * watermark (puts also check it, this catches quiet periods). */
        srv->state.now_ms = kvp_now_ms();
        if (srv->state.now_ms >= next_tick || srv->reset_pending) {
            ha_tick(srv);
            expire_silent(srv);
            if (may_serve(srv)) { /* a fenced leader changes nothing by itself either */
                kvp_expire_puts(&srv->state);
                kvp_lease_expire(&srv->state);
                kvp_segment_limbo_expire(&srv->state);
                kvp_evict_if_needed(&srv->state);
                answer_parked(srv, true);
            }
            next_tick = srv->state.now_ms + TICK_MS;
        }
        int n = epoll_wait(srv->epfd, evs, (int)KVP_ARRAY_SIZE(evs),
                           (int)(next_tick - srv->state.now_ms));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            KVP_LOG_ERROR("epoll_wait failed: %m");
            return KVP_ERR_SYSTEM;
        }
        srv->state.now_ms = kvp_now_ms();
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &srv->listen_fd) {
                on_accept(srv);
            } else if (p == &srv->http_fd) {
                kvp_master_view_t view;
                char reason[256];
                fill_view(srv, &view, reason, sizeof(reason));
                kvp_master_http_serve(srv->http, &srv->state, &view);
            } else if (p == &srv->sig_fd) {
                struct signalfd_siginfo si;
                if (read(srv->sig_fd, &si, sizeof(si)) == sizeof(si)) {
                    if (si.ssi_signo == SIGHUP) {
                        reload_security(srv);
                    } else {
                        KVP_LOG_INFO("signal %u: shutting down", si.ssi_signo);
                        srv->stop = true;
                    }
                }
            } else {
                conn_t *c = p;
                if ((evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) ||
                    (c->ssl != NULL && !kvp_tls_established(c->ssl))) {
                    /* (a TLS handshake that waited to write goes on reading) */
                    on_readable(srv, c);
                    /* c may be freed now: never touch it again in this iteration */
                } else if (evs[i].events & EPOLLOUT) {
                    if (!flush_out(srv, c))
                        conn_close(srv, c);
                }
            }
        }
        if (srv->state.tasks_ready && may_serve(srv))
            answer_parked(srv, false); /* tasks queued by what just ran */
        push_records(srv);             /* changes made by timers and by what just ran */
    }
    return KVP_OK;
}

void kvp_master_server_destroy(kvp_master_server_t *srv)
{
    if (srv == NULL)
        return;
    if (srv->ha_started) {
        pthread_mutex_lock(&srv->ha_lock);
        srv->ha_stop = true;
        pthread_cond_signal(&srv->ha_cond);
        pthread_mutex_unlock(&srv->ha_lock);
        pthread_join(srv->ha_thread, NULL);
    }
    if (srv->el != NULL)
        kvp_election_stop(srv->el, true); /* a standby takes over at once */
    kvp_master_http_stop(srv->http);      /* its threads wait for no loop any more */
    close_all(srv);
    close(srv->listen_fd);
    close(srv->sig_fd);
    close(srv->epfd);
    kvp_acl_destroy(srv->acl);
    kvp_tls_destroy(srv->tls);
    kvp_master_state_cleanup(&srv->state);
    kvp_events_destroy(srv->events); /* sends what is still queued */
    pthread_mutex_destroy(&srv->ha_lock);
    pthread_cond_destroy(&srv->ha_cond);
    free(srv);
}
