/*
 * http_auth.c - who an HTTP request is (see http_auth.h): a bearer token, or else a client
 * certificate, looked up in the ACL.
 *
 * Design: one check (name()) behind both entry points, so that the master's views and the
 * indexer's API cannot drift apart again: they had a copy each, which differed on whether a
 * request with an Authorization header that is not a usable bearer token may still be named
 * by its certificate (now: no) and on the size of a certificate taken (now: at most
 * KVP_HTTP_CERT_MAX bytes for both).
 *
 * Thread: any; nothing here is shared.
 */
#include "common/http_auth.h"

#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>

#include "common/log.h"

/* The request's bearer token into tok (KVP_HTTP_TOKEN_MAX bytes; "" when none or unusable);
 * whether it had an Authorization header at all. */
static bool bearer(const kvp_http_request_t *req, char *tok)
{
    const char *auth = kvp_http_header(req, "Authorization");
    tok[0] = '\0';
    if (auth == NULL)
        return false;
    if (strncasecmp(auth, "Bearer ", 7) == 0) {
        size_t len = strnlen(auth + 7, KVP_HTTP_TOKEN_MAX);
        if (len < KVP_HTTP_TOKEN_MAX) {
            memcpy(tok, auth + 7, len);
            tok[len] = '\0';
        }
    }
    return true;
}

/* The principal a token (len > 0), or else a certificate of a request without an
 * Authorization header, names. */
static const kvp_principal_t *name(const char *tok, size_t len, bool header, const void *der,
                                   size_t der_len, const kvp_acl_t *acl, kvp_tls_t *tls)
{
    if (acl == NULL)
        return NULL;
    if (len > 0)
        return kvp_acl_by_token(acl, tok, len); /* a wrong token: no one, no certificate */
    if (header || tls == NULL || der_len == 0 || der_len > KVP_HTTP_CERT_MAX)
        return NULL;
    char cn[256];
    const char *why = NULL;
    if (!kvp_tls_verify_der(tls, der, der_len, cn, sizeof(cn), &why)) {
        KVP_LOG_WARN_LIMITED("http: a client certificate not taken: %s", why);
        return NULL;
    }
    return kvp_acl_by_cn(acl, cn);
}

void kvp_http_cred_take(kvp_http_cred_t *cred, const kvp_http_request_t *req)
{
    cred->header = bearer(req, cred->token);
    const void *der = NULL;
    size_t der_len = kvp_http_peer_cert(req, &der);
    cred->cert_len = 0;
    if (der_len > 0 && der_len <= sizeof(cred->cert)) {
        memcpy(cred->cert, der, der_len);
        cred->cert_len = der_len;
    }
}

const kvp_principal_t *kvp_http_cred_check(kvp_http_cred_t *cred, const kvp_acl_t *acl,
                                           kvp_tls_t *tls)
{
    const kvp_principal_t *who =
        name(cred->token, strlen(cred->token), cred->header, cred->cert, cred->cert_len, acl, tls);
    kvp_http_cred_wipe(cred);
    return who;
}

void kvp_http_cred_wipe(kvp_http_cred_t *cred)
{
    OPENSSL_cleanse(cred->token, sizeof(cred->token));
}

const kvp_principal_t *kvp_http_principal(const kvp_http_request_t *req, const kvp_acl_t *acl,
                                          kvp_tls_t *tls)
{
    char tok[KVP_HTTP_TOKEN_MAX];
    bool header = bearer(req, tok);
    const void *der = NULL;
    size_t der_len = header || tls == NULL ? 0 : kvp_http_peer_cert(req, &der);
    const kvp_principal_t *who = name(tok, strlen(tok), header, der, der_len, acl, tls);
    OPENSSL_cleanse(tok, sizeof(tok));
    return who;
}
