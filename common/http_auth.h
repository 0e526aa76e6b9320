/*
 * http_auth.h - who an HTTP request is (http_auth.c): the ACL principal its bearer token, or
 * else its client certificate, names. The one credential check of the HTTP doors: the
 * master's views (master/obs/http_views.c) and kvpool-indexer's API (indexer/api.c). Each
 * door decides what the principal may do and counts its refusals; this only says who.
 *
 * The rules:
 *  - "Authorization: Bearer TOKEN" (the scheme in any case; a token of at most
 *    KVP_HTTP_TOKEN_MAX - 1 bytes): the principal whose token it is (kvp_acl_by_token:
 *    compared in constant time against every hash). A token no principal holds names no
 *    one, and the certificate is not tried.
 *  - A request with no Authorization header at all (not even an unusable one: another
 *    scheme, an empty or too long token) may be named by its client certificate: over
 *    HTTPS, at most KVP_HTTP_CERT_MAX bytes of DER, verified against tls's CAs and CRL as a
 *    handshake would (kvp_tls_verify_der), its subject CN an ACL cert-cn. tls NULL: no
 *    certificate is taken.
 *  - The copy of the token is wiped (OPENSSL_cleanse) once checked; it never reaches a log.
 *
 * Two steps for a door that checks elsewhere than on the request's thread (the master, on
 * its loop, which owns the ACL): kvp_http_cred_take copies the credential off the request
 * on its thread, kvp_http_cred_check names the principal later; kvp_http_principal does both
 * at once, without copying the certificate.
 *
 * Thread: the request's (take, principal); check on whichever thread owns acl and tls.
 */
#ifndef KVP_COMMON_HTTP_AUTH_H
#define KVP_COMMON_HTTP_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/acl.h"
#include "common/http.h"
#include "common/tls.h"

#define KVP_HTTP_TOKEN_MAX 1024 /* a bearer token's bytes, its NUL included */
#define KVP_HTTP_CERT_MAX 8192  /* a client certificate's bytes (DER) */

/* A request's credential, copied off it (kvp_http_cred_take). */
typedef struct kvp_http_cred {
    char token[KVP_HTTP_TOKEN_MAX];  /* the bearer token (secret: wiped once checked); "": none */
    bool header;                     /* the request had an Authorization header, usable or not */
    uint8_t cert[KVP_HTTP_CERT_MAX]; /* the client certificate (DER), not verified yet */
    size_t cert_len;                 /* 0: none (or one too big to be taken) */
} kvp_http_cred_t;

/* Copy req's bearer token and client certificate into cred (all of it written). */
void kvp_http_cred_take(kvp_http_cred_t *cred, const kvp_http_request_t *req);
/* The principal cred names in acl (borrowed from acl: valid while acl is), or NULL: none,
 * a token no principal holds, or a certificate tls does not verify (logged, rate-limited).
 * The token is wiped. */
const kvp_principal_t *kvp_http_cred_check(kvp_http_cred_t *cred, const kvp_acl_t *acl,
                                           kvp_tls_t *tls);
/* Wipe the token (a credential not checked, on every way out). */
void kvp_http_cred_wipe(kvp_http_cred_t *cred);

/* Both steps at once, on the request's thread: the principal req names in acl, or NULL. */
const kvp_principal_t *kvp_http_principal(const kvp_http_request_t *req, const kvp_acl_t *acl,
                                          kvp_tls_t *tls);

#endif
