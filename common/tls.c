/*
 * tls.c - TLS 1.3 for the control plane, over OpenSSL.
 *
 * Design: OpenSSL does the protocol; this file chooses its settings once
 * (TLS 1.3 only, peer verification always on, a CRL when given, no session
 * tickets: clients do not resume) and adapts its calls to our two kinds of
 * socket. The master's loop is non-blocking and level-triggered: it calls
 * kvp_tls_read/kvp_tls_write and waits for what OpenSSL asks for (WANT_READ,
 * WANT_WRITE). A client's kvp_chan_t is shared by the threads of its master
 * connection (one reader, several writers: client/control/mconn.c), which
 * OpenSSL does not allow on one SSL at once, so every SSL call is made under
 * the channel's lock on a non-blocking socket, and the waiting (poll) is done
 * outside it. Writes go through a socket BIO of our own that sends with
 * MSG_NOSIGNAL: a peer that vanished must give an error, never a SIGPIPE that
 * kills the process (OpenSSL's own socket BIO uses write(2)).
 *
 * Secrets: a key file's bytes never reach an error text or a log line; OpenSSL
 * wipes its key material when the context is freed.
 *
 * Thread: see tls.h.
 */
#include "common/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "common/sock.h"

struct kvp_tls {
    SSL_CTX *ctx;
    bool server;
};

struct kvp_chan {
    int fd;
    SSL *ssl; /* NULL: plain */
    uint32_t timeout_ms;
    bool ticket;           /* the server's ticket came: it took our certificate */
    _Atomic bool readable; /* kvp_chan_wait_readable just saw bytes: the next read skips
                              its own wait */
    pthread_mutex_t lock;  /* every SSL call on ssl */
};

/* A client context's new-session callback: the server's ticket (kvp_chan_open waits for it). */
static int on_ticket(SSL *ssl, SSL_SESSION *sess)
{
    (void)sess;
    kvp_chan_t *ch = SSL_get_app_data(ssl);
    if (ch != NULL)
        ch->ticket = true;
    return 0; /* not kept: we never resume */
}

/* ---- a socket BIO that never raises SIGPIPE ---- */

static BIO_METHOD *nosig_method;
static pthread_once_t nosig_once = PTHREAD_ONCE_INIT;

static int nosig_write(BIO *b, const char *buf, int len)
{
    int fd = (int)BIO_get_fd(b, NULL);
    ssize_t n = send(fd, buf, (size_t)len, MSG_NOSIGNAL);
    BIO_clear_retry_flags(b);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)n;
}

static void nosig_init(void)
{
    const BIO_METHOD *sock = BIO_s_socket();
    BIO_METHOD *m = BIO_meth_new(BIO_TYPE_SOCKET, "kvpool socket");
    if (m == NULL)
        return;
    BIO_meth_set_write(m, nosig_write);
    BIO_meth_set_read(m, BIO_meth_get_read(sock));
    BIO_meth_set_puts(m, BIO_meth_get_puts(sock));
    BIO_meth_set_ctrl(m, BIO_meth_get_ctrl(sock));
    BIO_meth_set_create(m, BIO_meth_get_create(sock));
    BIO_meth_set_destroy(m, BIO_meth_get_destroy(sock));
    nosig_method = m;
}

static bool attach_fd(SSL *ssl, int fd)
{
    pthread_once(&nosig_once, nosig_init);
    if (nosig_method == NULL)
        return false;
    BIO *bio = BIO_new(nosig_method);
    if (bio == NULL)
        return false;
    BIO_set_fd(bio, fd, BIO_NOCLOSE);
    SSL_set_bio(ssl, bio, bio);
    return true;
}

/* ---- contexts ---- */

/* The first error on OpenSSL's queue as text (no key material is ever in it). */
static void ssl_err(char *err, size_t len, const char *what, const char *file)
{
    char buf[200] = "";
    unsigned long e = ERR_peek_last_error();
    if (e != 0)
        ERR_error_string_n(e, buf, sizeof(buf));
    ERR_clear_error();
    snprintf(err, len, "%s %s: %s", what, file, buf[0] ? buf : "failed");
}

kvp_status_t kvp_tls_create(const kvp_tls_params_t *p, bool server, kvp_tls_t **tls_p, char *err,
                            size_t err_len)
{
    if (server && (p->cert == NULL || p->key == NULL)) {
        snprintf(err, err_len, "TLS needs a certificate and its key (--tls-cert, --tls-key)");
        return KVP_ERR_INVALID_ARG;
    }
    if (!server && p->ca == NULL) {
        snprintf(err, err_len,
                 "TLS needs the CA that signs the master's certificate "
                 "(KVPOOL_TLS_CA, --tls-ca)");
        return KVP_ERR_INVALID_ARG;
    }
    if ((p->cert == NULL) != (p->key == NULL)) {
        snprintf(err, err_len, "a TLS certificate needs its key and a key its certificate");
        return KVP_ERR_INVALID_ARG;
    }
    kvp_tls_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return KVP_ERR_NOMEM;
    t->server = server;
    t->ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (t->ctx == NULL) {
        ssl_err(err, err_len, "TLS", "context");
        goto err_free;
    }
    SSL_CTX_set_min_proto_version(t->ctx, TLS1_3_VERSION);
    /* a peer that closes without close_notify (a client that exited) ends the session as
     * a close, not as an error: it is not a refusal */
    SSL_CTX_set_options(t->ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    /* speed: read whole records (and the next ones) in one read(2), not a header then a
     * body; AES-128-GCM first (AES-NI), the other TLS 1.3 suites after it */
    SSL_CTX_set_read_ahead(t->ctx, 1);
    SSL_CTX_set_ciphersuites(t->ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                                     "TLS_CHACHA20_POLY1305_SHA256");
    SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* One ticket, never used to resume: it is the server's word that it took our
     * certificate (TLS 1.3 ends the client's handshake before the server has checked it;
     * kvp_chan_open waits for the ticket, so a refusal is an error there, with its reason) */
    SSL_CTX_set_num_tickets(t->ctx, server ? 1 : 0);
    SSL_CTX_set_session_cache_mode(t->ctx, server ? SSL_SESS_CACHE_OFF : SSL_SESS_CACHE_CLIENT);
    if (!server)
        SSL_CTX_sess_set_new_cb(t->ctx, on_ticket);
    if (p->cert != NULL) {
        if (SSL_CTX_use_certificate_chain_file(t->ctx, p->cert) != 1) {
            ssl_err(err, err_len, "TLS certificate", p->cert);
            goto err_ctx;
        }
        if (SSL_CTX_use_PrivateKey_file(t->ctx, p->key, SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(t->ctx) != 1) {
            ssl_err(err, err_len, "TLS key (not the certificate's, or unreadable)", p->key);
            goto err_ctx;
        }
    }
    if (p->ca != NULL) {
        if (SSL_CTX_load_verify_locations(t->ctx, p->ca, NULL) != 1) {
            ssl_err(err, err_len, "TLS CA", p->ca);
            goto err_ctx;
        }
        if (server) {
            STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(p->ca);
            if (names != NULL)
                SSL_CTX_set_client_CA_list(t->ctx, names);
        }
        /* a server asks for a certificate but takes a client without one (it may send a
         * token instead); a certificate it gets must verify */
        SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER, NULL);
    }
    if (p->crl != NULL) {
        X509_STORE *store = SSL_CTX_get_cert_store(t->ctx);
        X509_LOOKUP *lu = X509_STORE_add_lookup(store, X509_LOOKUP_file());
        if (lu == NULL || X509_load_crl_file(lu, p->crl, X509_FILETYPE_PEM) <= 0) {
            ssl_err(err, err_len, "TLS CRL", p->crl);
            goto err_ctx;
        }
        X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
    }
    *tls_p = t;
    return KVP_OK;

err_ctx:
    SSL_CTX_free(t->ctx);
err_free:
    free(t);
    return KVP_ERR_INVALID_ARG;
}

void kvp_tls_destroy(kvp_tls_t *t)
{
    if (t == NULL)
        return;
    SSL_CTX_free(t->ctx); /* sessions still open hold their own reference */
    free(t);
}

/* ---- server side ---- */

kvp_status_t kvp_tls_accept(kvp_tls_t *t, int fd, kvp_ssl_t **ssl_p)
{
    SSL *ssl = SSL_new(t->ctx);
    if (ssl == NULL)
        return KVP_ERR_NOMEM;
    if (!attach_fd(ssl, fd)) {
        SSL_free(ssl);
        return KVP_ERR_NOMEM;
    }
    SSL_set_accept_state(ssl);
    *ssl_p = ssl;
    return KVP_OK;
}

void kvp_tls_free(kvp_ssl_t *ssl)
{
    SSL_free(ssl);
}

/* Why a session failed, for a log line or an error text. */
static void session_err(SSL *ssl, int code, char *err, size_t len)
{
    long v = SSL_get_verify_result(ssl);
    char buf[200] = "";
    unsigned long e = ERR_peek_last_error();
    if (e != 0)
        ERR_error_string_n(e, buf, sizeof(buf));
    ERR_clear_error();
    if (v != X509_V_OK)
        snprintf(err, len, "certificate refused: %s", X509_verify_cert_error_string(v));
    else if (buf[0])
        snprintf(err, len, "TLS: %s", buf);
    else if (code == SSL_ERROR_SYSCALL)
        snprintf(err, len, "TLS: the connection broke (%s)", errno ? strerror(errno) : "eof");
    else
        snprintf(err, len, "TLS error %d", code);
}

static ssize_t io_result(SSL *ssl, int r, size_t n, bool reading, char *err, size_t err_len)
{
    if (r == 1)
        return (ssize_t)n;
    int e = SSL_get_error(ssl, r);
    switch (e) {
    case SSL_ERROR_WANT_READ:
        return KVP_TLS_WANT_READ;
    case SSL_ERROR_WANT_WRITE:
        return KVP_TLS_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN:
        if (reading)
            return 0;
        break;
    case SSL_ERROR_SYSCALL:
        if (reading && ERR_peek_error() == 0 && SSL_is_init_finished(ssl))
            return 0; /* closed without close_notify: a client that exited */
        if (reading && ERR_peek_error() == 0 && errno == 0) {
            ERR_clear_error();
            return 0; /* closed before a handshake began (a port probe) */
        }
        break;
    default:
        break;
    }
    session_err(ssl, e, err, err_len);
    return -1;
}

ssize_t kvp_tls_read(kvp_ssl_t *ssl, void *buf, size_t len, char *err, size_t err_len)
{
    size_t n = 0;
    ERR_clear_error();
    errno = 0;
    int r = SSL_read_ex(ssl, buf, len, &n);
    return io_result(ssl, r, n, true, err, err_len);
}

ssize_t kvp_tls_write(kvp_ssl_t *ssl, const void *buf, size_t len, char *err, size_t err_len)
{
    size_t n = 0;
    ERR_clear_error();
    errno = 0;
    int r = SSL_write_ex(ssl, buf, len, &n);
    return io_result(ssl, r, n, false, err, err_len);
}

bool kvp_tls_pending(kvp_ssl_t *ssl)
{
    return SSL_has_pending(ssl) == 1; /* decrypted or read ahead (see kvp_chan_wait_readable) */
}

bool kvp_tls_established(kvp_ssl_t *ssl)
{
    return SSL_is_init_finished(ssl);
}

bool kvp_tls_peer_cn(kvp_ssl_t *ssl, char *buf, size_t len)
{
    X509 *cert = SSL_get1_peer_certificate(ssl);
    if (cert == NULL)
        return false;
    bool ok =
        SSL_get_verify_result(ssl) == X509_V_OK &&
        X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf, (int)len) > 0;
    X509_free(cert);
    return ok;
}

bool kvp_tls_verify_der(kvp_tls_t *tls, const void *der, size_t der_len, char *buf, size_t len,
                        const char **why_p)
{
    const unsigned char *p = der;
    X509 *cert = d2i_X509(NULL, &p, (long)der_len);
    X509_STORE_CTX *vc = X509_STORE_CTX_new();
    bool ok = false;
    *why_p = "not a certificate";
    if (cert != NULL && vc != NULL &&
        X509_STORE_CTX_init(vc, SSL_CTX_get_cert_store(tls->ctx), cert, NULL) == 1) {
        X509_STORE_CTX_set_purpose(vc, X509_PURPOSE_SSL_CLIENT);
        ok = X509_verify_cert(vc) == 1;
        *why_p = ok ? NULL : X509_verify_cert_error_string(X509_STORE_CTX_get_error(vc));
        if (ok && X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf,
                                            (int)len) <= 0) {
            ok = false;
            *why_p = "no subject CN";
        }
    }
    X509_STORE_CTX_free(vc);
    X509_free(cert);
    return ok;
}

/* ---- client side ---- */

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Wait for fd to be readable / writable until deadline (0: none). */
static kvp_status_t wait_fd(int fd, bool wr, uint64_t deadline)
{
    for (;;) {
        int ms = -1;
        if (deadline != 0) {
            uint64_t now = mono_ms();
            ms = now >= deadline ? 0 : (int)(deadline - now);
        }
        struct pollfd p = {.fd = fd, .events = wr ? POLLOUT : POLLIN};
        int r = poll(&p, 1, ms);
        if (r > 0)
            return (p.revents & (POLLERR | POLLNVAL)) && !(p.revents & (POLLIN | POLLOUT))
                       ? KVP_ERR_IO
                       : KVP_OK;
        if (r == 0)
            return KVP_ERR_TIMEOUT;
        if (errno != EINTR)
            return KVP_ERR_IO;
    }
}

kvp_status_t kvp_chan_open(kvp_tls_t *tls, int fd, const char *host, uint32_t timeout_ms,
                           kvp_chan_t **ch_p, char *err, size_t err_len)
{
    kvp_chan_t *ch = calloc(1, sizeof(*ch));
    if (ch == NULL) {
        close(fd);
        return KVP_ERR_NOMEM;
    }
    ch->fd = fd;
    ch->timeout_ms = timeout_ms;
    pthread_mutex_init(&ch->lock, NULL);
    if (tls == NULL) {
        *ch_p = ch;
        return KVP_OK;
    }
    kvp_status_t st = KVP_ERR_NOMEM;
    ch->ssl = SSL_new(tls->ctx);
    if (ch->ssl == NULL || !attach_fd(ch->ssl, fd))
        goto err_close;
    SSL_set_app_data(ch->ssl, ch);
    /* the master's certificate must name the address we dialled */
    unsigned char ip[16];
    if (inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ch->ssl), host);
    } else {
        SSL_set1_host(ch->ssl, host);
        SSL_set_tlsext_host_name(ch->ssl, host);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    uint64_t deadline = timeout_ms ? mono_ms() + timeout_ms : 0;
    for (;;) {
        ERR_clear_error();
        errno = 0;
        int r = SSL_connect(ch->ssl);
        if (r == 1)
            break;
        int e = SSL_get_error(ch->ssl, r);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            st = wait_fd(fd, e == SSL_ERROR_WANT_WRITE, deadline);
            if (st != KVP_OK) {
                snprintf(err, err_len, "TLS handshake with %s: %s", host,
                         st == KVP_ERR_TIMEOUT ? "no answer (is it a TLS port?)" : "broken");
                goto err_close;
            }
            continue;
        }
        char why[256];
        /* the peer just closed: not a TLS port (a master without --tls-cert drops what is
         * not a kvpool frame) */
        bool eof = e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN ||
                   ERR_GET_REASON(ERR_peek_last_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING;
        session_err(ch->ssl, e, why, sizeof(why));
        if (eof && SSL_get_verify_result(ch->ssl) == X509_V_OK) {
            snprintf(err, err_len,
                     "TLS handshake with %s: the master closed the connection (does it run "
                     "with --tls-cert? %s)",
                     host, why);
            st = KVP_ERR_IO;
        } else {
            snprintf(err, err_len, "TLS handshake with %s refused: %s", host, why);
            st = KVP_ERR_DENIED;
        }
        goto err_close;
    }
    /* the server's verdict on our certificate: its ticket, or an alert */
    while (!ch->ticket) {
        char b;
        ERR_clear_error();
        errno = 0;
        int r = SSL_peek(ch->ssl, &b, 1);
        if (r > 0 || ch->ticket) /* (the ticket came in this very read) */
            break;
        int e = SSL_get_error(ch->ssl, r);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
            st = wait_fd(fd, e == SSL_ERROR_WANT_WRITE, deadline);
            if (st == KVP_OK)
                continue;
            snprintf(err, err_len,
                     "TLS handshake with %s: no word from the master on our "
                     "certificate",
                     host);
            goto err_close;
        }
        char why[256];
        session_err(ch->ssl, e, why, sizeof(why));
        snprintf(err, err_len, "the master at %s refused our TLS session: %s", host, why);
        st = KVP_ERR_DENIED;
        goto err_close;
    }
    *ch_p = ch;
    return KVP_OK;

err_close:
    kvp_chan_close(ch);
    return st;
}

void kvp_chan_close(kvp_chan_t *ch)
{
    if (ch == NULL)
        return;
    if (ch->ssl != NULL && SSL_is_init_finished(ch->ssl))
        (void)SSL_shutdown(ch->ssl); /* close_notify, best effort: we do not wait for its */
    SSL_free(ch->ssl);
    close(ch->fd);
    pthread_mutex_destroy(&ch->lock);
    free(ch);
}

void kvp_chan_shutdown(kvp_chan_t *ch)
{
    shutdown(ch->fd, SHUT_RDWR);
}

int kvp_chan_fd(const kvp_chan_t *ch)
{
    return ch->fd;
}

bool kvp_chan_is_tls(const kvp_chan_t *ch)
{
    return ch->ssl != NULL;
}

/* One SSL read or write of all len bytes, waiting outside the lock. */
static kvp_status_t chan_io(kvp_chan_t *ch, bool wr, void *buf, size_t len)
{
    uint64_t deadline = ch->timeout_ms ? mono_ms() + ch->timeout_ms : 0;
    char *p = buf;
    while (len > 0) {
        size_t n = 0;
        if (!wr && !atomic_exchange(&ch->readable, false)) {
            /* nothing decrypted or buffered: wait for the socket first (a read that would
             * only say WANT_READ is a system call for nothing) */
            pthread_mutex_lock(&ch->lock);
            bool buffered = SSL_has_pending(ch->ssl);
            pthread_mutex_unlock(&ch->lock);
            kvp_status_t st = buffered ? KVP_OK : wait_fd(ch->fd, false, deadline);
            if (st != KVP_OK)
                return st;
        }
        pthread_mutex_lock(&ch->lock);
        ERR_clear_error();
        errno = 0;
        int r = wr ? SSL_write_ex(ch->ssl, p, len, &n) : SSL_read_ex(ch->ssl, p, len, &n);
        int e = r == 1 ? SSL_ERROR_NONE : SSL_get_error(ch->ssl, r);
        char why[256] = "";
        if (e == SSL_ERROR_SSL) /* an alert: the master refused our certificate (TLS 1.3 says
                                   so after our side of the handshake ended) */
            session_err(ch->ssl, e, why, sizeof(why));
        else if (e != SSL_ERROR_NONE && e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
            ERR_clear_error();
        pthread_mutex_unlock(&ch->lock);
        if (e == SSL_ERROR_SSL) {
            char note[300];
            snprintf(note, sizeof(note), "the master ended the TLS session: %s", why);
            kvp_status_note(note);
            return KVP_ERR_DENIED;
        }
        if (e == SSL_ERROR_NONE) {
            p += n;
            len -= n;
            continue;
        }
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
            return KVP_ERR_IO;
        kvp_status_t st = wait_fd(ch->fd, e == SSL_ERROR_WANT_WRITE, deadline);
        if (st != KVP_OK)
            return st;
    }
    return KVP_OK;
}

kvp_status_t kvp_chan_send_all(kvp_chan_t *ch, const void *buf, size_t len)
{
    if (ch->ssl == NULL)
        return kvp_send_all(ch->fd, buf, len);
    return chan_io(ch, true, (void *)buf, len);
}

kvp_status_t kvp_chan_send2(kvp_chan_t *ch, const void *a, size_t alen, const void *b, size_t blen)
{
    if (ch->ssl == NULL) {
        struct iovec iov[2] = {{(void *)a, alen}, {(void *)b, blen}};
        return kvp_sendv_all(ch->fd, iov, blen ? 2 : 1);
    }
    uint8_t small[16384]; /* one TLS record at most: a request and its header go as one */
    if (alen + blen <= sizeof(small)) {
        memcpy(small, a, alen);
        if (blen)
            memcpy(small + alen, b, blen);
        return chan_io(ch, true, small, alen + blen);
    }
    kvp_status_t st = chan_io(ch, true, (void *)a, alen);
    return st == KVP_OK && blen ? chan_io(ch, true, (void *)b, blen) : st;
}

kvp_status_t kvp_chan_recv_all(kvp_chan_t *ch, void *buf, size_t len)
{
    if (ch->ssl == NULL)
        return kvp_recv_all(ch->fd, buf, len);
    return chan_io(ch, false, buf, len);
}

kvp_status_t kvp_chan_wait_readable(kvp_chan_t *ch, int timeout_ms)
{
    if (ch->ssl != NULL) {
        /* SSL_has_pending, not SSL_pending: with read-ahead on, a whole record after the
         * one just read sits in OpenSSL's buffer unprocessed, which SSL_pending does not
         * count and poll cannot see: a reply waited there for the next bytes to arrive
         * (a heartbeat's answer, up to a second later) */
        pthread_mutex_lock(&ch->lock);
        bool pending = SSL_has_pending(ch->ssl) == 1;
        pthread_mutex_unlock(&ch->lock);
        if (pending)
            return KVP_OK;
    }
    struct pollfd p = {.fd = ch->fd, .events = POLLIN};
    int r = poll(&p, 1, timeout_ms < 0 ? 0 : timeout_ms);
    if (r == 0)
        return KVP_ERR_TIMEOUT;
    if (r < 0)
        return errno == EINTR ? KVP_ERR_TIMEOUT : KVP_ERR_IO;
    if (ch->ssl != NULL)
        atomic_store(&ch->readable, true);
    return KVP_OK;
}
