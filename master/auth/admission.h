/*
 * admission.h - who is calling the master and whether it may send a request:
 * protected mode, a token (Auth) or a client certificate the ACL names, the small
 * limit before authentication, principals a reload removed (see admission.c).
 *
 * The server keeps a kvp_caller_t per connection and asks here before it dispatches a
 * frame; what admission answers in the dispatcher's place comes back in a
 * kvp_admission_reply_t that the server queues (admission writes to no socket).
 *
 * Thread: the master's loop.
 */
#ifndef KVP_MASTER_AUTH_ADMISSION_H
#define KVP_MASTER_AUTH_ADMISSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rpc.h"
#include "common/status.h"
#include "common/tls.h"
#include "master/auth/acl.h"
#include "master/core/state.h"

/* The largest request a connection may send before it names a principal (an AuthRequest
 * is a token): a stranger's length prefix never makes the master allocate more. */
#define KVP_PREAUTH_MAX_BODY 4096u

/* Who is on a connection (one per connection, the server's). */
typedef struct kvp_caller {
    uint64_t conn_id;             /* for the logs */
    int fd;                       /* ... the peer's address */
    bool cert_checked;            /* the handshake ended and its certificate was looked up */
    const kvp_principal_t *who;   /* who is calling (the ACL's); NULL: not yet known */
    bool removed;                 /* its principal left the ACL (a reload): refused, closed */
    char pname[KVP_ACL_NAME_MAX]; /* who->name, kept across ACL reloads */
} kvp_caller_t;

/* An answer admission gives in the dispatcher's place. */
typedef struct kvp_admission_reply {
    kvp_status_t status; /* KVP_OK: body[len] is the response; else msg says why */
    bool close;          /* the connection ends once it is written */
    size_t len;
    uint8_t body[512];
    char msg[256];
} kvp_admission_reply_t;

/* Protected mode (--auth protected, no --tls-cert): is a fresh connection on fd one to
 * refuse at its first header (a peer of another host)? */
bool kvp_admission_refuses(const kvp_master_config_t *cfg, bool tls, int fd);
/* ... its refusal: logged, counted, KVP_ERR_DENIED and the connection closes. */
void kvp_admission_refuse_protected(const kvp_caller_t *c, kvp_master_stats_t *stats,
                                    kvp_admission_reply_t *reply);

/* The largest body c may send now (KVP_PREAUTH_MAX_BODY until it names a principal). */
uint32_t kvp_admission_max_body(const kvp_acl_t *acl, const kvp_caller_t *c);

/*
 * With an ACL (acl not NULL), before a frame is dispatched: may c send it? Answers Auth
 * itself (the token's bytes in body are wiped). false: *reply answers the frame (a refusal
 * is logged and counted), the frame is not dispatched.
 */
bool kvp_admission_admit(const kvp_acl_t *acl, kvp_caller_t *c, kvp_master_stats_t *stats,
                         const kvp_rpc_hdr_t *h, uint8_t *body, kvp_admission_reply_t *reply);
/* A request held since (a long poll), called again: false when its principal was removed
 * meanwhile (*reply refuses it, counted). */
bool kvp_admission_still_admitted(const kvp_acl_t *acl, const kvp_caller_t *c,
                                  kvp_master_stats_t *stats, kvp_admission_reply_t *reply);

/* The TLS handshake of c just ended: a certificate the ACL names makes its principal. */
void kvp_admission_check_cert(const kvp_acl_t *acl, kvp_caller_t *c, kvp_ssl_t *ssl);

#endif
