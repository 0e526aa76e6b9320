/*
 * admission.h - who is calling the master and whether it may send a request:
 * protected mode, a token (Auth) or a client certificate the ACL names, the small
 * limit before authentication, principals a reload removed, and the caps on connections
 * in all, per peer and before authentication (see admission.c).
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
#include <sys/socket.h>

#include "common/rpc.h"
#include "common/status.h"
#include "common/tls.h"
#include "common/acl.h"
#include "master/core/state.h"

/* The largest request a connection may send before it names a principal (an AuthRequest
 * is a token): a stranger's length prefix never makes the master allocate more. */
#define KVP_PREAUTH_MAX_BODY 4096u

/* A peer address as the connection limits count it: IPv4 whole (as ::ffff:a.b.c.d), IPv6
 * by its /64 (one host may hold a whole /64), a Unix socket as all zeros. */
typedef struct kvp_peer_key {
    uint8_t b[16];
} kvp_peer_key_t;

/* A principal with connections open: how many (--max-connections-per-principal), and what
 * its connections together took of the loop's current turn (server.c: a principal's
 * connections share one turn's budget, however many it opens). One per principal, by
 * name, while it has a connection; the server reads and writes the turn fields. */
typedef struct kvp_principal_conns {
    struct kvp_principal_conns *next; /* hash chain */
    uint64_t hash;
    uint32_t conns;
    uint32_t frames;   /* frames its connections handled in loop turn `turn` */
    uint64_t turn;     /* the loop's turn these count in */
    uint64_t spent_ns; /* ... the time they took of it */
    char name[KVP_ACL_NAME_MAX];
} kvp_principal_conns_t;

/* Who is on a connection (one per connection, the server's). */
typedef struct kvp_caller {
    uint64_t conn_id;             /* for the logs */
    int fd;                       /* ... the peer's address */
    bool cert_checked;            /* the handshake ended and its certificate was looked up */
    const kvp_principal_t *who;   /* who is calling (the ACL's); NULL: not yet known */
    bool removed;                 /* its principal left the ACL (a reload): refused, closed */
    char pname[KVP_ACL_NAME_MAX]; /* who->name, kept across ACL reloads */
    /* the connection limits (kvp_admission_open .. kvp_admission_close) */
    kvp_peer_key_t peer;
    bool counted;         /* counted in the limits */
    bool admitted;        /* authenticated: no longer among the unauthenticated */
    uint64_t accepted_ms; /* when it was accepted: --auth-timeout runs from here */
    struct kvp_caller *unauth_prev, *unauth_next; /* the unauthenticated, oldest first */
    kvp_principal_conns_t *pc; /* its principal's count (kvp_admission_principal); NULL: none */
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

/*
 * Connection limits (--max-connections, --max-connections-per-peer, --max-unauthenticated,
 * --max-unauthenticated-per-peer): how many connections are open, in all and per peer
 * address, and which are not authenticated yet, oldest first. A new connection past a cap
 * takes the place of the oldest unauthenticated connection in that cap's scope (a stranger
 * that stalls cannot keep others out: a client authenticates within milliseconds); with
 * none to take, it is refused. An authenticated connection is never closed for room.
 */
typedef struct kvp_admission_limits {
    uint32_t max_conns;               /* 0: no cap (the descriptor limit's room already in) */
    uint32_t max_conns_per_peer;      /* 0: no cap */
    uint32_t max_unauth;              /* 0: no cap */
    uint32_t max_unauth_per_peer;     /* 0: no cap */
    uint32_t max_conns_per_principal; /* 0: no cap */
    uint32_t n_conns, n_unauth;
    kvp_caller_t *unauth_head, *unauth_tail;
    struct kvp_peer_slot *slots; /* per peer: open addressing, a power of two */
    uint32_t n_slots, n_used;
    uint64_t seed; /* of the slots' hash (random: a peer cannot aim its addresses at one chain) */
    kvp_principal_conns_t **pbuckets; /* principals with connections: chained, a power of two */
    uint32_t n_pbuckets, n_principals;
} kvp_admission_limits_t;

typedef enum kvp_admit_verdict {
    KVP_ADMIT_OK,     /* counted, unauthenticated until kvp_admission_authenticated */
    KVP_ADMIT_EVICT,  /* close *victim_p (counted, logged), then ask again */
    KVP_ADMIT_REFUSE, /* close the new connection (counted, logged) */
} kvp_admit_verdict_t;

/* The caps of cfg; fd_room: connections the descriptor limit leaves room for (caps
 * --max-connections; 0: none). */
void kvp_admission_limits_init(kvp_admission_limits_t *l, const kvp_master_config_t *cfg,
                               uint32_t fd_room);
void kvp_admission_limits_cleanup(kvp_admission_limits_t *l);
/* A connection just accepted from peer (c->conn_id and c->fd set; accepted at now_ms). */
kvp_admit_verdict_t kvp_admission_open(kvp_admission_limits_t *l, kvp_caller_t *c,
                                       const struct sockaddr_storage *peer, uint64_t now_ms,
                                       kvp_master_stats_t *stats, kvp_caller_t **victim_p);
/* c authenticated (a principal, or without an ACL its first whole request): no longer
 * among the unauthenticated. */
void kvp_admission_authenticated(kvp_admission_limits_t *l, kvp_caller_t *c);
/*
 * c just named its principal (c->who set: a certificate or a token): it counts among that
 * principal's connections. false: --max-connections-per-principal reached (logged, counted
 * as refused_max_conns_principal); *reply refuses (KVP_ERR_DENIED, says which cap) and
 * the connection is to close. A no-op (true) for one counted already or without a principal.
 */
bool kvp_admission_principal(kvp_admission_limits_t *l, kvp_caller_t *c, kvp_master_stats_t *stats,
                             kvp_admission_reply_t *reply);
/* c closes: it leaves the counts (a no-op for one never counted). */
void kvp_admission_close(kvp_admission_limits_t *l, kvp_caller_t *c);

#endif
