/*
 * admission.c - who is calling the master and whether it may send a request (see
 * admission.h).
 *
 * Design: protected mode refuses a peer of another host at its first header (its body is
 * never read). With an ACL a connection names its principal by a client certificate the
 * ACL names (checked when the handshake ends) or by a token (the Auth method, answered
 * here); until then it may send only KVP_PREAUTH_MAX_BODY bytes a request. A refusal is
 * logged (rate-limited, with the peer and the principal, never a secret), counted by
 * reason (kvpool_connections_refused_total) and answered KVP_ERR_DENIED.
 *
 * The connection limits count every connection in all and by peer address (a hash table
 * keyed with a random seed, open addressing with backward-shift deletion) and keep the
 * unauthenticated ones in a list, oldest first: a new connection past a cap closes the
 * oldest unauthenticated connection in that cap's scope, or is refused when there is none
 * (admission.h). Each is logged (rate-limited, with the peer) and counted by the cap.
 *
 * Thread: the master's loop.
 */
#include "master/auth/admission.h"

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/rand.h"
#include "common/sock.h"
#include "kvpool.pb-c.h"

bool kvp_admission_refuses(const kvp_master_config_t *cfg, bool tls, int fd)
{
    /* credentials configured: anyone may connect, and must name a principal */
    return !tls && strcmp(cfg->auth, "protected") == 0 && !kvp_sock_peer_local(fd);
}

void kvp_admission_refuse_protected(const kvp_caller_t *c, kvp_master_stats_t *stats,
                                    kvp_admission_reply_t *reply)
{
    char peer[80];
    kvp_sock_peer_name(c->fd, peer, sizeof(peer));
    KVP_LOG_WARN_LIMITED("connection %llu from %s refused: protected mode takes connections from "
                         "this host only (--auth none opens the port to a trusted network)",
                         (unsigned long long)c->conn_id, peer);
    stats->refused_protected++;
    reply->status = KVP_ERR_DENIED;
    reply->close = true;
    reply->len = 0;
    snprintf(reply->msg, sizeof(reply->msg), "%s",
             "protected mode: this master takes connections from its own host only; start it "
             "with --auth none on a trusted network");
}

uint32_t kvp_admission_max_body(const kvp_acl_t *acl, const kvp_caller_t *c)
{
    return acl != NULL && c->who == NULL && !c->removed ? KVP_PREAUTH_MAX_BODY : KVP_RPC_MAX_BODY;
}

/* A refusal of the ACL: logged (rate-limited, with the peer and the principal, never a
 * secret), answered with KVP_ERR_DENIED and msg; close: the connection ends after it. */
static void deny(const kvp_caller_t *c, const char *msg, bool close, kvp_admission_reply_t *reply)
{
    char peer[80];
    kvp_sock_peer_name(c->fd, peer, sizeof(peer));
    KVP_LOG_WARN_LIMITED("connection %llu from %s (principal %s) refused: %s",
                         (unsigned long long)c->conn_id, peer, c->pname[0] ? c->pname : "none",
                         msg);
    reply->status = KVP_ERR_DENIED;
    reply->close = close;
    reply->len = 0;
    snprintf(reply->msg, sizeof(reply->msg), "%s", msg);
}

static void set_who(kvp_caller_t *c, const kvp_principal_t *who)
{
    c->who = who;
    snprintf(c->pname, sizeof(c->pname), "%s", who->name);
}

/* Auth: a token names the connection's principal. */
static void handle_auth(const kvp_acl_t *acl, kvp_caller_t *c, kvp_master_stats_t *stats,
                        const kvp_rpc_hdr_t *h, uint8_t *body, kvp_admission_reply_t *reply)
{
    Kvpool__AuthRequest *req = kvpool__auth_request__unpack(NULL, h->body_len, body);
    /* an empty token on a connection that has its principal (its certificate's): who it is
     * (a client checks its tenant_id against it: client/client.c) */
    const kvp_principal_t *who = req == NULL ? NULL
                                 : req->token.len == 0 && c->who != NULL
                                     ? c->who
                                     : kvp_acl_by_token(acl, req->token.data, req->token.len);
    if (req != NULL) {
        OPENSSL_cleanse(req->token.data, req->token.len);
        kvpool__auth_request__free_unpacked(req, NULL);
    }
    OPENSSL_cleanse(body, h->body_len); /* the token's bytes in the input buffer */
    if (who == NULL || (c->who != NULL && c->who != who)) {
        stats->refused_token++;
        deny(c,
             who == NULL ? "authentication failed: no principal has this token"
                         : "authentication failed: the token names another principal than the "
                           "one this connection already has",
             true, reply);
        return;
    }
    set_who(c, who);
    Kvpool__AuthResponse resp = KVPOOL__AUTH_RESPONSE__INIT;
    resp.principal = (char *)who->name;
    resp.tenant = (char *)who->tenant;
    resp.roles = who->roles;
    reply->close = false;
    reply->len = kvpool__auth_response__get_packed_size(&resp);
    if (reply->len > sizeof(reply->body)) {
        reply->status = KVP_ERR_NOMEM;
        reply->len = 0;
        snprintf(reply->msg, sizeof(reply->msg), "auth response too large");
        return;
    }
    kvpool__auth_response__pack(&resp, reply->body);
    reply->status = KVP_OK;
    KVP_LOG_DEBUG("connection %llu: principal %s (token)", (unsigned long long)c->conn_id,
                  who->name);
}

bool kvp_admission_admit(const kvp_acl_t *acl, kvp_caller_t *c, kvp_master_stats_t *stats,
                         const kvp_rpc_hdr_t *h, uint8_t *body, kvp_admission_reply_t *reply)
{
    if (c->removed) {
        stats->refused_removed++;
        char msg[256];
        snprintf(msg, sizeof(msg), "principal %s was removed from the ACL", c->pname);
        deny(c, msg, true, reply);
        return false;
    }
    if (h->method == KVP_RPC_AUTH) {
        handle_auth(acl, c, stats, h, body, reply);
        return false;
    }
    if (c->who == NULL) {
        stats->refused_unauth++;
        deny(c,
             "authentication required: present a client certificate the ACL names "
             "(KVPOOL_TLS_CERT) or send a token (KVPOOL_TOKEN)",
             true, reply);
        return false;
    }
    return true;
}

bool kvp_admission_still_admitted(const kvp_acl_t *acl, const kvp_caller_t *c,
                                  kvp_master_stats_t *stats, kvp_admission_reply_t *reply)
{
    if (acl == NULL || c->who != NULL)
        return true;
    stats->refused_removed++;
    deny(c, "principal removed from the ACL", true, reply);
    return false;
}

void kvp_admission_check_cert(const kvp_acl_t *acl, kvp_caller_t *c, kvp_ssl_t *ssl)
{
    c->cert_checked = true;
    char cn[256];
    const kvp_principal_t *who;
    if (kvp_tls_peer_cn(ssl, cn, sizeof(cn)) && (who = kvp_acl_by_cn(acl, cn)) != NULL) {
        set_who(c, who);
        KVP_LOG_DEBUG("connection %llu: principal %s (certificate)", (unsigned long long)c->conn_id,
                      who->name);
    }
}

/* ---- connection limits ---- */

struct kvp_peer_slot {
    kvp_peer_key_t key;
    uint32_t conns;  /* 0: a free slot */
    uint32_t unauth; /* of them not authenticated yet */
};

#define SLOTS_MIN 64u

void kvp_admission_limits_init(kvp_admission_limits_t *l, const kvp_master_config_t *cfg,
                               uint32_t fd_room)
{
    memset(l, 0, sizeof(*l));
    l->max_conns = cfg->max_conns;
    if (fd_room != 0 && (l->max_conns == 0 || l->max_conns > fd_room))
        l->max_conns = fd_room;
    l->max_conns_per_peer = cfg->max_conns_per_peer;
    l->max_unauth = cfg->max_unauth;
    l->max_unauth_per_peer = cfg->max_unauth_per_peer;
    l->max_conns_per_principal = cfg->max_conns_per_principal;
    l->seed = kvp_random_u64();
}

void kvp_admission_limits_cleanup(kvp_admission_limits_t *l)
{
    for (uint32_t b = 0; b < l->n_pbuckets; b++)
        for (kvp_principal_conns_t *p = l->pbuckets[b], *next; p != NULL; p = next) {
            next = p->next;
            free(p);
        }
    free(l->pbuckets);
    l->pbuckets = NULL;
    l->n_pbuckets = l->n_principals = 0;
    free(l->slots);
    l->slots = NULL;
    l->n_slots = l->n_used = 0;
}

static void peer_key(const struct sockaddr_storage *ss, kvp_peer_key_t *k)
{
    memset(k, 0, sizeof(*k));
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        k->b[10] = k->b[11] = 0xff;
        memcpy(&k->b[12], &a->sin_addr, 4);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        /* an IPv4 peer of a dual-stack socket is one address; any other IPv6 peer its /64 */
        memcpy(k->b, &a->sin6_addr, IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) ? 16 : 8);
    }
}

static uint32_t slot_home(const kvp_admission_limits_t *l, const kvp_peer_key_t *k)
{
    return (uint32_t)XXH3_64bits_withSeed(k, sizeof(*k), l->seed) & (l->n_slots - 1);
}

/* The slot of k, or NULL when it holds no connection. */
static struct kvp_peer_slot *slot_find(const kvp_admission_limits_t *l, const kvp_peer_key_t *k)
{
    if (l->n_slots == 0)
        return NULL;
    for (uint32_t i = slot_home(l, k);; i = (i + 1) & (l->n_slots - 1)) {
        struct kvp_peer_slot *s = &l->slots[i];
        if (s->conns == 0)
            return NULL;
        if (memcmp(&s->key, k, sizeof(*k)) == 0)
            return s;
    }
}

static struct kvp_peer_slot *slot_put(kvp_admission_limits_t *l, const kvp_peer_key_t *k)
{
    uint32_t i = slot_home(l, k);
    while (l->slots[i].conns != 0)
        i = (i + 1) & (l->n_slots - 1);
    l->slots[i].key = *k;
    l->slots[i].unauth = 0;
    l->n_used++;
    return &l->slots[i];
}

/* Room for one more peer (at most half the slots used). false: out of memory. */
static bool slots_reserve(kvp_admission_limits_t *l)
{
    if ((l->n_used + 1) * 2 <= l->n_slots)
        return true;
    uint32_t n = l->n_slots ? l->n_slots * 2 : SLOTS_MIN;
    struct kvp_peer_slot *old = l->slots;
    uint32_t old_n = l->n_slots;
    l->slots = calloc(n, sizeof(*l->slots));
    if (l->slots == NULL) {
        l->slots = old;
        return false;
    }
    l->n_slots = n;
    l->n_used = 0;
    for (uint32_t i = 0; i < old_n; i++) {
        if (old[i].conns == 0)
            continue;
        struct kvp_peer_slot *s = slot_put(l, &old[i].key);
        s->conns = old[i].conns;
        s->unauth = old[i].unauth;
    }
    free(old);
    return true;
}

/* Free slot s (its peer holds no connection now): the later slots of its run move back. */
static void slot_delete(kvp_admission_limits_t *l, struct kvp_peer_slot *s)
{
    uint32_t mask = l->n_slots - 1;
    uint32_t i = (uint32_t)(s - l->slots);
    for (uint32_t j = i;;) {
        j = (j + 1) & mask;
        if (l->slots[j].conns == 0)
            break;
        uint32_t h = slot_home(l, &l->slots[j].key);
        /* j stays where it is when its home lies cyclically in (i, j] */
        if (i <= j ? (i < h && h <= j) : (i < h || h <= j))
            continue;
        l->slots[i] = l->slots[j];
        i = j;
    }
    memset(&l->slots[i], 0, sizeof(l->slots[i]));
    l->n_used--;
}

static void unauth_unlink(kvp_admission_limits_t *l, kvp_caller_t *c)
{
    if (c->unauth_prev)
        c->unauth_prev->unauth_next = c->unauth_next;
    else
        l->unauth_head = c->unauth_next;
    if (c->unauth_next)
        c->unauth_next->unauth_prev = c->unauth_prev;
    else
        l->unauth_tail = c->unauth_prev;
    c->unauth_prev = c->unauth_next = NULL;
}

/* The oldest unauthenticated connection, of peer k (NULL: of any peer). */
static kvp_caller_t *oldest_unauth(const kvp_admission_limits_t *l, const kvp_peer_key_t *k)
{
    for (kvp_caller_t *c = l->unauth_head; c != NULL; c = c->unauth_next)
        if (k == NULL || memcmp(&c->peer, k, sizeof(*k)) == 0)
            return c;
    return NULL;
}

/* A cap reached: close the oldest unauthenticated connection in its scope (victim, may be
 * NULL: then the new one c is refused). Logged and counted. */
static kvp_admit_verdict_t over_cap(const kvp_caller_t *c, kvp_caller_t *victim, const char *flag,
                                    uint32_t cap, uint64_t *counter, kvp_caller_t **victim_p)
{
    (*counter)++;
    char peer[80];
    if (victim != NULL) {
        kvp_sock_peer_name(victim->fd, peer, sizeof(peer));
        KVP_LOG_WARN_LIMITED("connection %llu from %s closed, not authenticated yet: %s %u "
                             "reached, a new connection takes its place",
                             (unsigned long long)victim->conn_id, peer, flag, cap);
        *victim_p = victim;
        return KVP_ADMIT_EVICT;
    }
    kvp_sock_peer_name(c->fd, peer, sizeof(peer));
    KVP_LOG_WARN_LIMITED("connection %llu from %s refused: %s %u reached",
                         (unsigned long long)c->conn_id, peer, flag, cap);
    return KVP_ADMIT_REFUSE;
}

kvp_admit_verdict_t kvp_admission_open(kvp_admission_limits_t *l, kvp_caller_t *c,
                                       const struct sockaddr_storage *peer, uint64_t now_ms,
                                       kvp_master_stats_t *stats, kvp_caller_t **victim_p)
{
    kvp_peer_key_t k;
    peer_key(peer, &k);
    struct kvp_peer_slot *s = slot_find(l, &k);
    uint32_t p_conns = s ? s->conns : 0, p_unauth = s ? s->unauth : 0;
    *victim_p = NULL;
    if (l->max_unauth_per_peer && p_unauth >= l->max_unauth_per_peer)
        return over_cap(c, oldest_unauth(l, &k), "--max-unauthenticated-per-peer",
                        l->max_unauth_per_peer, &stats->refused_max_unauth_peer, victim_p);
    if (l->max_conns_per_peer && p_conns >= l->max_conns_per_peer)
        return over_cap(c, p_unauth ? oldest_unauth(l, &k) : NULL, "--max-connections-per-peer",
                        l->max_conns_per_peer, &stats->refused_max_conns_peer, victim_p);
    if (l->max_unauth && l->n_unauth >= l->max_unauth)
        return over_cap(c, l->unauth_head, "--max-unauthenticated", l->max_unauth,
                        &stats->refused_max_unauth, victim_p);
    if (l->max_conns && l->n_conns >= l->max_conns)
        return over_cap(c, l->unauth_head, "--max-connections", l->max_conns,
                        &stats->refused_max_conns, victim_p);
    if (s == NULL) {
        if (!slots_reserve(l)) {
            stats->refused_max_conns++;
            KVP_LOG_WARN_LIMITED("connection %llu refused: out of memory for its peer's count",
                                 (unsigned long long)c->conn_id);
            return KVP_ADMIT_REFUSE;
        }
        s = slot_put(l, &k);
    }
    s->conns++;
    s->unauth++;
    l->n_conns++;
    l->n_unauth++;
    c->peer = k;
    c->counted = true;
    c->admitted = false;
    c->accepted_ms = now_ms;
    c->unauth_next = NULL;
    c->unauth_prev = l->unauth_tail;
    if (l->unauth_tail)
        l->unauth_tail->unauth_next = c;
    else
        l->unauth_head = c;
    l->unauth_tail = c;
    return KVP_ADMIT_OK;
}

void kvp_admission_authenticated(kvp_admission_limits_t *l, kvp_caller_t *c)
{
    if (!c->counted || c->admitted)
        return;
    c->admitted = true;
    unauth_unlink(l, c);
    l->n_unauth--;
    struct kvp_peer_slot *s = slot_find(l, &c->peer);
    if (s != NULL)
        s->unauth--;
}

/* ---- per principal ---- */

#define PBUCKETS_MIN 64u

static uint64_t principal_hash(const kvp_admission_limits_t *l, const char *name)
{
    return XXH3_64bits_withSeed(name, strlen(name), l->seed);
}

/* Room for one more principal (chains of one on average). false: out of memory. */
static bool pbuckets_reserve(kvp_admission_limits_t *l)
{
    if (l->n_principals < l->n_pbuckets)
        return true;
    uint32_t n = l->n_pbuckets ? l->n_pbuckets * 2 : PBUCKETS_MIN;
    kvp_principal_conns_t **nb = calloc(n, sizeof(*nb));
    if (nb == NULL)
        return l->n_pbuckets > 0; /* longer chains, still correct */
    for (uint32_t b = 0; b < l->n_pbuckets; b++)
        for (kvp_principal_conns_t *p = l->pbuckets[b], *next; p != NULL; p = next) {
            next = p->next;
            p->next = nb[p->hash & (n - 1)];
            nb[p->hash & (n - 1)] = p;
        }
    free(l->pbuckets);
    l->pbuckets = nb;
    l->n_pbuckets = n;
    return true;
}

/* The count of principal `name`, made when new (NULL: out of memory). */
static kvp_principal_conns_t *principal_get(kvp_admission_limits_t *l, const char *name)
{
    uint64_t h = principal_hash(l, name);
    for (kvp_principal_conns_t *p = l->n_pbuckets ? l->pbuckets[h & (l->n_pbuckets - 1)] : NULL;
         p != NULL; p = p->next)
        if (p->hash == h && strcmp(p->name, name) == 0)
            return p;
    kvp_principal_conns_t *p = pbuckets_reserve(l) ? calloc(1, sizeof(*p)) : NULL;
    if (p == NULL)
        return NULL;
    p->hash = h;
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->next = l->pbuckets[h & (l->n_pbuckets - 1)];
    l->pbuckets[h & (l->n_pbuckets - 1)] = p;
    l->n_principals++;
    return p;
}

static void principal_put(kvp_admission_limits_t *l, kvp_principal_conns_t *pc)
{
    if (--pc->conns > 0)
        return;
    kvp_principal_conns_t **pp = &l->pbuckets[pc->hash & (l->n_pbuckets - 1)];
    while (*pp != NULL && *pp != pc)
        pp = &(*pp)->next;
    if (*pp == pc)
        *pp = pc->next;
    l->n_principals--;
    free(pc);
}

bool kvp_admission_principal(kvp_admission_limits_t *l, kvp_caller_t *c, kvp_master_stats_t *stats,
                             kvp_admission_reply_t *reply)
{
    if (c->pc != NULL || c->who == NULL || !c->counted)
        return true;
    kvp_principal_conns_t *pc = principal_get(l, c->pname);
    if (pc != NULL && (l->max_conns_per_principal == 0 || pc->conns < l->max_conns_per_principal)) {
        pc->conns++;
        c->pc = pc;
        return true;
    }
    stats->refused_max_conns_principal++;
    char msg[200];
    if (pc == NULL) {
        snprintf(msg, sizeof(msg), "out of memory for the principal's connection count; retry");
    } else {
        snprintf(msg, sizeof(msg),
                 "this principal has %u connections open, its cap "
                 "(--max-connections-per-principal %u): close one first",
                 pc->conns, l->max_conns_per_principal);
    }
    deny(c, msg, true, reply);
    return false;
}

void kvp_admission_close(kvp_admission_limits_t *l, kvp_caller_t *c)
{
    if (c->pc != NULL) {
        principal_put(l, c->pc);
        c->pc = NULL;
    }
    if (!c->counted)
        return;
    kvp_admission_authenticated(l, c); /* out of the unauthenticated first */
    c->counted = false;
    l->n_conns--;
    struct kvp_peer_slot *s = slot_find(l, &c->peer);
    if (s != NULL && --s->conns == 0)
        slot_delete(l, s);
}
