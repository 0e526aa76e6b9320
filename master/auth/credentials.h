/*
 * credentials.h - the control port's TLS context and the ACL: read at start, read again
 * on SIGHUP, the ACL's tenants installed into the state (see credentials.c).
 */
#ifndef KVP_MASTER_AUTH_CREDENTIALS_H
#define KVP_MASTER_AUTH_CREDENTIALS_H

#include "common/status.h"
#include "common/tls.h"
#include "common/acl.h"
#include "master/auth/admission.h"
#include "master/core/state.h"

typedef struct kvp_credentials {
    kvp_tls_t *tls; /* NULL without --tls-cert */
    kvp_acl_t *acl; /* NULL without --tls-cert (--acl-file comes with it) */
} kvp_credentials_t;

/* Calls visit(c, ctx) for every caller the server has (its connections). */
typedef void kvp_callers_walk_cb_t(void *arg, void (*visit)(kvp_caller_t *c, void *ctx), void *ctx);

/* At start: --tls-* and --acl-file of st->config (nothing without --tls-cert), the ACL's
 * tenants into st, and the data grants' epoch. Logs what it loaded, or why not. */
kvp_status_t kvp_credentials_load(kvp_credentials_t *cr, kvp_master_state_t *st);

/* SIGHUP: read the ACL (and the TLS files) again. Live callers keep their principal by
 * name (walk visits them): a narrowed one is held to its new roles from its next request,
 * a removed one is refused and closed at its next. A file that does not load changes
 * nothing. Every outcome is logged ("audit: ..."). */
void kvp_credentials_reload(kvp_credentials_t *cr, kvp_master_state_t *st,
                            kvp_callers_walk_cb_t *walk, void *walk_arg);

/* After the state was started afresh (a master that led, stepped down and leads again):
 * the ACL's tenants and a new data grants' epoch, as kvp_credentials_load gave them. */
void kvp_credentials_restore(kvp_credentials_t *cr, kvp_master_state_t *st);

/* Free both (either may be NULL). */
void kvp_credentials_cleanup(kvp_credentials_t *cr);

#endif
