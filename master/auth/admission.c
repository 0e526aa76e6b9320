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
 * Thread: the master's loop.
 */
#include "master/auth/admission.h"

#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>

#include "common/log.h"
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
    const kvp_principal_t *who =
        req != NULL ? kvp_acl_by_token(acl, req->token.data, req->token.len) : NULL;
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
