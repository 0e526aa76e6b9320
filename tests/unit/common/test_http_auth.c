/*
 * test_http_auth.c - unit tests for common/http_auth.c, the HTTP doors' one credential
 * check: a bearer token, or else (only without an Authorization header) a client
 * certificate verified against the CA and CRL, each looked up in an ACL.
 *
 * Real parts: certificates from deploy/make-certs.sh (with the hostile ones:
 * KVPOOL_TEST_CERTS=1), an ACL file read by kvp_acl_load, and an HTTPS server
 * (kvp_http_start_tls) whose handler names the principal both ways (kvp_http_principal, and
 * kvp_http_cred_take then kvp_http_cred_check as the master does), asked with libcurl.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <curl/curl.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "common/acl.h"
#include "common/http.h"
#include "common/http_auth.h"
#include "common/tls.h"

#define TOKEN "t0ken-of-the-router"

static char dir[64];
static kvp_acl_t *acl;
static kvp_tls_t *tls;

static void path_of(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static int setup(void **state)
{
    (void)state;
    const char *root = getenv("KVPOOL_SOURCE_ROOT");
    snprintf(dir, sizeof(dir), "/tmp/kvp-test-http-auth-XXXXXX");
    if (root == NULL || mkdtemp(dir) == NULL)
        return -1;
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "KVPOOL_TEST_CERTS=1 bash %s/deploy/make-certs.sh %s admin bob >/dev/null 2>&1", root,
             dir);
    if (system(cmd) != 0)
        return -1;
    /* TOKEN's SHA-256, as the ACL holds it */
    snprintf(cmd, sizeof(cmd),
             "cd %s && h=$(printf %%s '" TOKEN "' | sha256sum | cut -d' ' -f1) && "
             "printf '[principal router]\\nroles = read\\ntoken-sha256 = %%s\\n\\n"
             "[principal bob]\\nroles = read\\ncert-cn = bob\\n\\n"
             "[principal boss]\\nroles = admin\\ncert-cn = admin\\n' \"$h\" >acl.conf",
             dir);
    if (system(cmd) != 0)
        return -1;
    char path[128], ca[128], crl[128], cert[128], key[128], err[512];
    path_of(path, sizeof(path), "acl.conf");
    if (kvp_acl_load(path, &acl, err, sizeof(err)) != KVP_OK) {
        fprintf(stderr, "acl: %s\n", err);
        return -1;
    }
    path_of(ca, sizeof(ca), "ca.crt");
    path_of(crl, sizeof(crl), "crl.pem");
    path_of(cert, sizeof(cert), "server.crt");
    path_of(key, sizeof(key), "server.key");
    kvp_tls_params_t tp = {.cert = cert, .key = key, .ca = ca, .crl = crl};
    if (kvp_tls_create(&tp, true, &tls, err, sizeof(err)) != KVP_OK) {
        fprintf(stderr, "tls: %s\n", err);
        return -1;
    }
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    curl_global_cleanup();
    kvp_tls_destroy(tls);
    kvp_acl_destroy(acl);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* NAME.crt as DER into cred (cert_len 0 when it cannot be read). */
static void der_of(kvp_http_cred_t *cred, const char *name)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s.crt", dir, name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    assert_non_null(x);
    int n = i2d_X509(x, NULL);
    assert_true(n > 0 && (size_t)n <= sizeof(cred->cert));
    unsigned char *p = cred->cert;
    cred->cert_len = (size_t)i2d_X509(x, &p);
    X509_free(x);
}

static const char *who(const kvp_principal_t *p)
{
    return p != NULL ? p->name : "-";
}

static bool all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0)
            return false;
    return true;
}

/* The check on a credential already taken (the master's loop): each rule. */
static void test_check(void **state)
{
    (void)state;
    kvp_http_cred_t c;

    memset(&c, 0, sizeof(c)); /* nothing: no one */
    assert_null(kvp_http_cred_check(&c, acl, tls));

    memset(&c, 0, sizeof(c)); /* the right token; wiped once checked */
    snprintf(c.token, sizeof(c.token), TOKEN);
    c.header = true;
    assert_string_equal(who(kvp_http_cred_check(&c, acl, tls)), "router");
    assert_true(all_zero(c.token, sizeof(c.token)));

    memset(&c, 0, sizeof(c)); /* a wrong token: no one, and its certificate is not tried */
    snprintf(c.token, sizeof(c.token), TOKEN "x");
    c.header = true;
    der_of(&c, "bob");
    assert_null(kvp_http_cred_check(&c, acl, tls));
    assert_true(all_zero(c.token, sizeof(c.token)));

    memset(&c, 0, sizeof(c)); /* a certificate without an Authorization header: its CN */
    der_of(&c, "bob");
    assert_string_equal(who(kvp_http_cred_check(&c, acl, tls)), "bob");
    der_of(&c, "admin");
    assert_string_equal(who(kvp_http_cred_check(&c, acl, tls)), "boss");

    /* an Authorization header that is no usable bearer token (another scheme, a token too
     * long): the certificate beside it is not taken (the master's copy took it) */
    c.header = true;
    assert_null(kvp_http_cred_check(&c, acl, tls));
    c.header = false;

    /* no CA to verify with: no certificate taken */
    assert_null(kvp_http_cred_check(&c, acl, NULL));
    /* no ACL: no one */
    assert_null(kvp_http_cred_check(&c, NULL, tls));

    /* certificates the CA and CRL refuse, or that name no principal */
    static const char *refused[] = {"revoked", "expired", "rogue", "server"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        memset(&c, 0, sizeof(c));
        der_of(&c, refused[i]);
        if (kvp_http_cred_check(&c, acl, tls) != NULL)
            fail_msg("took %s.crt", refused[i]);
    }
    /* garbage for a certificate */
    memset(&c, 0, sizeof(c));
    memset(c.cert, 0x30, 100);
    c.cert_len = 100;
    assert_null(kvp_http_cred_check(&c, acl, tls));
}

/* The handler: "DIRECT|TWO-STEP", the principal each way names. */
static void handler(void *arg, const char *path, const kvp_http_request_t *req,
                    kvp_http_reply_t *reply)
{
    (void)arg, (void)path;
    kvp_http_cred_t c;
    kvp_http_cred_take(&c, req);
    const kvp_principal_t *two = kvp_http_cred_check(&c, acl, tls);
    if (!all_zero(c.token, sizeof(c.token)))
        reply->status = 500;
    kvp_http_printf(reply, "%s|%s", who(kvp_http_principal(req, acl, tls)), who(two));
}

typedef struct body {
    char s[256];
    size_t n;
} body_t;

static size_t body_put(char *data, size_t size, size_t nmemb, void *arg)
{
    body_t *b = arg;
    size_t n = size * nmemb;
    if (b->n + n >= sizeof(b->s))
        return 0;
    memcpy(b->s + b->n, data, n);
    b->n += n;
    b->s[b->n] = '\0';
    return n;
}

/* GET / over HTTPS with an Authorization header (NULL: none) and client certificate NAME
 * (NULL: none): the body. */
static void ask(uint16_t port, const char *auth, const char *cert, body_t *b)
{
    CURL *h = curl_easy_init();
    assert_non_null(h);
    char url[64], ca[128], crt[128], key[128];
    snprintf(url, sizeof(url), "https://127.0.0.1:%u/", port);
    path_of(ca, sizeof(ca), "ca.crt");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CAINFO, ca);
    curl_easy_setopt(h, CURLOPT_CAPATH, NULL);
    if (cert != NULL) {
        snprintf(crt, sizeof(crt), "%s/%s.crt", dir, cert);
        snprintf(key, sizeof(key), "%s/%s.key", dir, cert);
        curl_easy_setopt(h, CURLOPT_SSLCERT, crt);
        curl_easy_setopt(h, CURLOPT_SSLKEY, key);
    }
    struct curl_slist *hdr = NULL;
    char *line = NULL;
    if (auth != NULL) {
        assert_true(asprintf(&line, "Authorization: %s", auth) > 0);
        hdr = curl_slist_append(NULL, line);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, body_put);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    memset(b, 0, sizeof(*b));
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdr);
    free(line);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK || status != 200)
        fail_msg("GET %s: %s, HTTP %ld", url, curl_easy_strerror(rc), status);
}

/* Over a real HTTPS server: what a request carries is what both entry points see. */
static void test_requests(void **state)
{
    (void)state;
    char cert[128], key[128], ca[128];
    path_of(cert, sizeof(cert), "server.crt");
    path_of(key, sizeof(key), "server.key");
    path_of(ca, sizeof(ca), "ca.crt");
    kvp_http_t *http;
    uint16_t port;
    assert_int_equal(kvp_http_start_tls("127.0.0.1:0", cert, key, ca, handler, NULL, &http, &port),
                     KVP_OK);
    char *long_tok = malloc(KVP_HTTP_TOKEN_MAX + 16);
    assert_non_null(long_tok);
    memcpy(long_tok, "Bearer ", 7);
    memset(long_tok + 7, 'a', KVP_HTTP_TOKEN_MAX);
    long_tok[7 + KVP_HTTP_TOKEN_MAX] = '\0';
    static const struct {
        const char *auth, *cert, *want;
    } cases[] = {
        {NULL, NULL, "-|-"},
        {"Bearer " TOKEN, NULL, "router|router"},
        {"bEaReR " TOKEN, NULL, "router|router"},  /* the scheme in any case */
        {"Bearer " TOKEN, "bob", "router|router"}, /* the token first */
        {"Bearer nope", "bob", "-|-"},             /* a wrong token: the certificate unused */
        {"Bearer ", "bob", "-|-"},                 /* an empty one too */
        {NULL, "bob", "bob|bob"},
        {NULL, "admin", "boss|boss"},
        {"Basic Ym9iOmJvYg==", "bob", "-|-"}, /* another scheme beside a certificate */
        {NULL, "revoked", "-|-"},             /* the CRL */
        {NULL, "rogue", "-|-"},               /* signed by another CA (the handshake takes it) */
    };
    body_t b;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ask(port, cases[i].auth, cases[i].cert, &b);
        if (strcmp(b.s, cases[i].want) != 0)
            fail_msg("case %zu (%s, %s): %s, want %s", i, cases[i].auth ? cases[i].auth : "-",
                     cases[i].cert ? cases[i].cert : "-", b.s, cases[i].want);
    }
    ask(port, long_tok, "bob", &b); /* a token too long: no one, and no certificate */
    assert_string_equal(b.s, "-|-");
    long_tok[7 + KVP_HTTP_TOKEN_MAX - 1] = '\0'; /* the longest taken: no principal's */
    ask(port, long_tok, NULL, &b);
    assert_string_equal(b.s, "-|-");
    free(long_tok);
    kvp_http_stop(http);
}

/* The address both the servers and kvpool-master's flag check take (kvp_http_listen_addr). */
static void test_listen_addr(void **state)
{
    (void)state;
    struct sockaddr_in sa;
    assert_true(kvp_http_listen_addr("127.0.0.1:9100", &sa));
    assert_int_equal(ntohs(sa.sin_port), 9100);
    assert_int_equal(ntohl(sa.sin_addr.s_addr), 0x7f000001);
    assert_true(kvp_http_listen_addr("localhost:0", &sa)); /* taken for 127.0.0.1 */
    assert_int_equal(ntohs(sa.sin_port), 0);
    assert_int_equal(ntohl(sa.sin_addr.s_addr), 0x7f000001);
    assert_true(kvp_http_listen_addr("0.0.0.0:80", &sa));
    assert_int_equal(sa.sin_addr.s_addr, 0);
    static const char *const bad[] = {
        "nonsense", "::1:80", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "host.example:80", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (kvp_http_listen_addr(bad[i], &sa))
            fail_msg("'%s' taken as an address to listen on", bad[i]);
    assert_false(kvp_http_listen_addr(NULL, &sa));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listen_addr),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_requests),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
