/*
 * etcd.h - a small synchronous etcd v3 client over etcd's JSON gateway.
 *
 * DESIGN
 * Every call is one blocking HTTP POST to /v3/... on the endpoint that last
 * answered (libcurl, one easy handle per kvp_etcd_t); keys and values travel
 * as base64, int64s come back as JSON strings and zero fields are omitted
 * (etcd 3.4's gateway; see common/etcd.c). Only what kvpool's leader election
 * and `kvpool stat` need: leases, create-if-absent, conditional delete, get,
 * prefix list, plain put and a one-event watch.
 *
 * Endpoints: "host:port[,host:port...]"; "http://host:port" and
 * "https://host:port" are accepted too. A CA (kvp_etcd_security_t.ca) makes
 * every endpoint without a scheme https and refuses an explicit http:// one.
 *
 * Security (kvp_etcd_create_ex, docs/security.md, "etcd"): TLS
 * that verifies etcd's certificate against the CA and its name against the
 * endpoint's host, a client certificate for etcd's --client-cert-auth, and
 * etcd's own authentication: POST /v3/auth/authenticate with user and
 * password gives a token that every later request carries in its
 * Authorization header. A request refused for its token (expired: simple
 * tokens die after --auth-token-ttl idle, 300 s by default; or the auth store
 * changed) authenticates again once and is retried. The password is read
 * from a file at create and again at each authentication (a password rotated
 * in etcd and written to the file is taken at the next one; a file unreadable
 * then leaves the last one read), kept in the handle and wiped (explicit_bzero)
 * with the token at destroy; neither ever enters an error text or a log line.
 * A request that cannot connect, times out, or meets a member that has no
 * quorum ("etcdserver: no leader", gRPC code 14) is tried on the next
 * endpoint; the one that answered is remembered for the next call. Each
 * endpoint tried gets timeout_ms, so a call takes at most
 * endpoints × timeout_ms. Such retries may apply a write twice: put and the
 * lease calls are idempotent enough for kvpool, and kvp_etcd_create_key
 * recognises its own earlier success (see there).
 *
 * Threads: a kvp_etcd_t is NOT thread-safe: use one per thread (two threads
 * need two handles). Distinct handles may be used concurrently.
 *
 * Errors: a failed call returns a status and keeps etcd's (or libcurl's)
 * text, readable with kvp_etcd_error(); it is logged at debug level only,
 * because callers that retry (the election) log once per state change.
 * KVP_ERR_CONNECT: no endpoint could be reached (the text lists each one's
 *   failure);
 * KVP_ERR_TIMEOUT: the last endpoint tried did not answer in time;
 * KVP_ERR_PROTOCOL: an answer that is not what etcd's gateway sends, or an
 * error etcd reports for a bad request (the text says which);
 * KVP_ERR_DENIED: etcd refused the credentials: a wrong user or password, a
 *   token refused again right after a new one was obtained, a user without
 *   permission on the key, authentication required and no user configured.
 * A TLS failure (etcd's certificate not verified by the CA, our client
 * certificate refused) is KVP_ERR_CONNECT, tried on the next endpoint, with
 * the TLS library's reason in the text.
 */
#ifndef KVP_COMMON_ETCD_H
#define KVP_COMMON_ETCD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct kvp_etcd kvp_etcd_t;

/*
 * How to reach a secured etcd; every field may be NULL (unset). Strings are
 * borrowed for the create call only.
 *  ca:            PEM file of the CA that signs etcd's server certificate;
 *                 turns https on for endpoints without a scheme
 *  cert, key:     PEM client certificate and its key (etcd --client-cert-auth);
 *                 one needs the other
 *  user:          etcd user to authenticate as; needs password_file
 *  password_file: file holding the user's password (one trailing newline
 *                 stripped; a warning when group or others may read it)
 */
typedef struct kvp_etcd_security {
    const char *ca;
    const char *cert;
    const char *key;
    const char *user;
    const char *password_file;
} kvp_etcd_security_t;

typedef struct kvp_etcd_params {
    const char *endpoints;               /* "host:port[,host:port...]" (copied) */
    uint32_t timeout_ms;                 /* > 0: each request on each endpoint */
    const kvp_etcd_security_t *security; /* NULL: plain http, no credential */
} kvp_etcd_params_t;

/* Why etcd requests failed, counted process-wide (kvp_etcd_stats). */
typedef enum kvp_etcd_fail_reason {
    KVP_ETCD_FAIL_AUTH,    /* refused: bad user or password, no permission, token refused */
    KVP_ETCD_FAIL_TLS,     /* TLS: certificate not verified, client certificate refused */
    KVP_ETCD_FAIL_CONNECT, /* no endpoint reachable, or none answered in time */
    KVP_ETCD_FAIL_OTHER,   /* an answer etcd's gateway should not give, a bad request */
    KVP_ETCD_FAIL_REASONS,
} kvp_etcd_fail_reason_t;

typedef struct kvp_etcd_stats {
    uint64_t failed[KVP_ETCD_FAIL_REASONS]; /* requests that failed, by reason */
    uint64_t authentications;               /* tokens obtained (first ones and renewals) */
    uint64_t reauthentications;             /* of those: after etcd refused a token */
} kvp_etcd_stats_t;

typedef enum kvp_etcd_event_type {
    KVP_ETCD_EVENT_PUT = 0,
    KVP_ETCD_EVENT_DELETE = 1,
} kvp_etcd_event_type_t;

/* One watch event. val is malloc'd and NUL-terminated (NULL for a DELETE);
 * release it with kvp_etcd_event_cleanup. */
typedef struct kvp_etcd_event {
    kvp_etcd_event_type_t type;
    int64_t mod_rev;    /* the revision of the change */
    int64_t create_rev; /* PUT: the key's create revision; DELETE: 0 */
    char *val;
    size_t len;
} kvp_etcd_event_t;

/* Called once per key by kvp_etcd_list, in key order; key and val are
 * NUL-terminated and borrowed for the call only. */
typedef void (*kvp_etcd_list_cb_t)(const char *key, const char *val, size_t len, void *arg);

/*
 * Create a client for `endpoints` (copied). Nothing is contacted yet, so an
 * unreachable etcd is not an error here. timeout_ms (> 0) bounds each
 * request on each endpoint. KVP_ERR_INVALID_ARG for an empty or malformed
 * endpoint list.
 *
 * libcurl's global state is set up by the first create of the process and
 * torn down by the last destroy (a counted, mutex-guarded
 * curl_global_init/curl_global_cleanup pair in etcd.c).
 */
kvp_status_t kvp_etcd_create(const char *endpoints, uint32_t timeout_ms, kvp_etcd_t **e_p);

/*
 * kvp_etcd_create with security settings (params->security may be NULL).
 * Checked here, without contacting etcd: the files can be read, a cert has
 * its key, a user has a password file and the other way round, no http://
 * endpoint with a CA. KVP_ERR_INVALID_ARG (or KVP_ERR_NOMEM) with a sentence
 * in err[0..err_len) that names the file or setting, never the password.
 * An error of etcd's (wrong password, certificate not verified) shows at
 * the first request, in kvp_etcd_error().
 */
kvp_status_t kvp_etcd_create_ex(const kvp_etcd_params_t *params, kvp_etcd_t **e_p, char *err,
                                size_t err_len);
/* Also wipes the password and the token. */
void kvp_etcd_destroy(kvp_etcd_t *e);

/* The process-wide counters (any thread; relaxed atomics). */
void kvp_etcd_stats(kvp_etcd_stats_t *stats);

/* The text of the last failure on this handle ("" before any). */
const char *kvp_etcd_error(const kvp_etcd_t *e);
/* The endpoint ("http://host:port") the next call tries first. */
const char *kvp_etcd_endpoint(const kvp_etcd_t *e);

/* Grant a lease of ttl_s seconds (etcd raises anything under 2 s to 2 s). */
kvp_status_t kvp_etcd_lease_grant(kvp_etcd_t *e, int64_t ttl_s, int64_t *id_p);
/*
 * Renew lease `id` once. *ttl_p = its TTL after renewal in seconds, or 0 when
 * the lease no longer exists (expired or revoked): that is KVP_OK too, as
 * etcd answers it with success and no TTL.
 */
kvp_status_t kvp_etcd_lease_keepalive(kvp_etcd_t *e, int64_t id, int64_t *ttl_p);
/* Revoke lease `id`, deleting every key attached to it. KVP_ERR_NOT_FOUND when
 * the lease is already gone. */
kvp_status_t kvp_etcd_lease_revoke(kvp_etcd_t *e, int64_t id);

/*
 * Create `key` with val[0..len) attached to `lease` (0: none) only if the key
 * does not exist (one txn: create_revision(key) == 0). *created_p says
 * whether this call created it; *create_rev_p is the key's create revision
 * either way (ours when created, the holder's otherwise). A key that exists
 * already but is attached to this same non-zero lease counts as created by
 * us: that is an earlier attempt of ours whose answer was lost.
 */
kvp_status_t kvp_etcd_create_key(kvp_etcd_t *e, const char *key, const void *val, size_t len,
                                 int64_t lease, bool *created_p, int64_t *create_rev_p);

/* Put val[0..len) at key, attached to `lease` (0: none). */
kvp_status_t kvp_etcd_put(kvp_etcd_t *e, const char *key, const void *val, size_t len,
                          int64_t lease);

/*
 * Put val[0..len) at key (no lease) only while guard_key exists with create revision
 * guard_rev (one txn): a leader's write, fenced by its leader key, so that a master that
 * lost its leadership and has not seen it yet cannot overwrite what its successor wrote.
 * KVP_OK when written, KVP_ERR_NOT_OWNER when guard_key is absent or another's (nothing
 * written).
 */
kvp_status_t kvp_etcd_put_if(kvp_etcd_t *e, const char *key, const void *val, size_t len,
                             const char *guard_key, int64_t guard_rev);

/*
 * Read `key`. *val_p: malloc'd, NUL-terminated copy of the value (the caller
 * frees it), *len_p its length; *create_rev_p / *mod_rev_p the key's
 * revisions; *rev_p the store's revision at the read (watch from *rev_p + 1
 * to see every later change). Any out-pointer may be NULL. KVP_ERR_NOT_FOUND
 * when the key is absent (nothing is written then).
 */
kvp_status_t kvp_etcd_get(kvp_etcd_t *e, const char *key, char **val_p, size_t *len_p,
                          int64_t *create_rev_p, int64_t *mod_rev_p, int64_t *rev_p);

/* Call cb for every key that starts with `prefix` (non-empty). */
kvp_status_t kvp_etcd_list(kvp_etcd_t *e, const char *prefix, kvp_etcd_list_cb_t cb, void *arg);

/*
 * Delete `key` only while its create revision is still create_rev, so that an
 * old holder never deletes a successor's key. KVP_OK when deleted,
 * KVP_ERR_NOT_FOUND when absent, KVP_ERR_NOT_OWNER when the key now has
 * another create revision.
 */
kvp_status_t kvp_etcd_delete_if(kvp_etcd_t *e, const char *key, int64_t create_rev);

/*
 * Wait for the first change of `key` at revision >= start_rev (> 0) and
 * return it in *ev_p (release with kvp_etcd_event_cleanup). Changes already
 * made at or after start_rev are returned at once.
 * KVP_ERR_TIMEOUT: no change within timeout_ms.
 * KVP_ERR_SHUTDOWN: *stop became true (checked at least every 100 ms; stop
 *   may be NULL).
 * KVP_ERR_OUT_OF_RANGE: start_rev is compacted away; read the key again with
 *   kvp_etcd_get and watch from its revision + 1.
 * KVP_ERR_CONNECT: no endpoint reachable, or the stream broke or ended (etcd
 *   stopped) and no other endpoint could take the watch over (a broken
 *   stream goes on at the next endpoint from the same start revision).
 */
kvp_status_t kvp_etcd_watch(kvp_etcd_t *e, const char *key, int64_t start_rev, uint32_t timeout_ms,
                            const atomic_bool *stop, kvp_etcd_event_t *ev_p);
void kvp_etcd_event_cleanup(kvp_etcd_event_t *ev);

#endif
