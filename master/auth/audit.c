/*
 * audit.c - the audit log: each admin action (drain, remove-by-regex, remove-all) with
 * who asked (the principal, or "(no ACL)"), from where, and how it ended (see audit.h).
 *
 * Thread: the master's loop.
 */
#include "master/auth/audit.h"

#include <stdio.h>

#include "common/log.h"
#include "common/rpc.h"
#include "common/sock.h"
#include "kvpool.pb-c.h"

/* Admin actions go to the audit log: who, from where, what, and how it ended. */
void kvp_audit_request(const kvp_caller_t *c, uint16_t method, const uint8_t *body, size_t len,
                       kvp_status_t s, const uint8_t *resp, size_t rlen)
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
                 c->pname[0] ? c->pname : "(no ACL)", (unsigned long long)c->conn_id, peer,
                 outcome);
}
