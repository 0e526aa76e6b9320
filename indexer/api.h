/*
 * api.h - kvpool-indexer's HTTP API (api.c; docs/indexer.md, "HTTP API").
 *
 * Thread: the handler runs on the HTTP server's threads.
 */
#ifndef KVP_INDEXER_API_H
#define KVP_INDEXER_API_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/acl.h"
#include "common/http.h"
#include "common/tls.h"
#include "indexer/index.h"
#include "indexer/sub.h"

#define KVP_API_BODY_MAX (16u << 20) /* bytes of a request body */
#define KVP_API_ALLOW_MAX 64         /* networks of --publisher-allow */
#define KVP_API_SYNC_MS 5000         /* a /register waits this long for its socket */

/* A network of --publisher-allow: family AF_INET or AF_INET6, its first prefix bits. */
typedef struct kvp_api_net {
    int family;
    uint8_t addr[16];
    unsigned prefix;
} kvp_api_net_t;

/* Why registrations were refused (kvpool_indexer_registrations_refused_total{reason}; the
 * names in api.c) */
enum {
    KVP_API_REG_endpoint,
    KVP_API_REG_publisher_allow,
    KVP_API_REG_tenant_registrations,
    KVP_API_REG_tenant_subscriptions,
    KVP_API_REG_registrations,
    KVP_API_REG_subscriptions,
    KVP_API_REG_publishers,
    KVP_API_REG_scopes,
    KVP_API_REG_tenant_scopes,
    KVP_API_REG_subscribe,
    KVP_API_REG_N
};

typedef struct kvp_api {
    kvp_idx_t *idx;
    kvp_sub_t *sub;      /* woken after a registration changed */
    bool protected_mode; /* requests from this host only */
    uint64_t seed;       /* the standard hash's seed (--hash-seed) */
    const char *state;   /* --state-dir's registrations file, or NULL */
    /* --acl-file: every request but /health and /metrics names a principal; NULL: none.
     * Swapped by a reload (SIGHUP) under acl_lock, which every request holds for reading */
    kvp_acl_t *acl;
    pthread_rwlock_t acl_lock;
    bool curve_on;  /* --curve-secret: publishers may be registered with a curve_server_key */
    kvp_tls_t *tls; /* verifies client certificates (--tls-ca); NULL: none */
    pthread_mutex_t state_lock; /* one writer of it at a time */
    /* --publisher-allow: the networks endpoints may name (IP addresses only); none: any */
    kvp_api_net_t allow[KVP_API_ALLOW_MAX];
    unsigned n_allow;
    _Atomic uint64_t reg_refused[KVP_API_REG_N];
} kvp_api_t;

/* Parse --publisher-allow's CIDR[,CIDR...] (ADDR or ADDR/BITS, IPv4 or IPv6) into api->allow
 * ("": none, every tcp endpoint). false: err says why. */
bool kvp_api_set_publisher_allow(kvp_api_t *api, const char *list, char *err, size_t err_len);

/* Write the registrations to api->state (NULL: nothing), atomically (a new file renamed over
 * the old, fsynced): false when it could not be written (logged). */
bool kvp_api_save(kvp_api_t *api);

/* The kvp_http_handler_fn of the API (arg: a kvp_api_t). */
void kvp_api_handle(void *arg, const char *path, const kvp_http_request_t *req,
                    kvp_http_reply_t *reply);

/* The kvp_http_admit_fn of the API: a request's peer, principal and role checked from its
 * head, before any body is read (a stranger's body is never buffered); a request that
 * takes no body is answered here. */
bool kvp_api_admit(void *arg, const char *path, const kvp_http_request_t *req,
                   kvp_http_reply_t *reply);

/* Read --acl-file again (SIGHUP; main thread): the new ACL serves the next requests, the
 * old one is freed once no request uses it; a file that does not parse leaves the old one
 * (logged). */
void kvp_api_reload_acl(kvp_api_t *api, const char *path);

/* A body over KVP_API_BODY_MAX refused by the HTTP layer before it was read: counted
 * (reason "body"; arg: a kvp_api_t). */
void kvp_api_too_big(void *arg);

/* Register one publisher from a JSON object's text (the config file's entries, and POST
 * /register); default_instance: the instance id when the object has none (NULL: it must);
 * who: the caller's principal (NULL: none, or no ACL), which may register into its tenant
 * only unless an admin.
 * 0, or the HTTP status of a refusal with its sentence in err. */
unsigned kvp_api_register_json(kvp_api_t *api, const char *text, size_t len,
                               const char *default_instance, const kvp_principal_t *who, char *err,
                               size_t err_len);

#endif
