/*
 * tls.h - TLS 1.3 on the control plane (OpenSSL): contexts for the master (a
 * server that asks for a client certificate) and for clients, the master's
 * non-blocking record I/O, and kvp_chan_t, a client connection that several
 * threads may read and write at once (docs/protocol.md, "Security").
 *
 * Thread: a context is immutable once made and may be shared; a kvp_chan_t may
 * be used by one reader and any number of writers at once (an internal lock
 * guards every OpenSSL call, never held while waiting on the network); a
 * server-side SSL belongs to the master's loop thread.
 */
#ifndef KVP_COMMON_TLS_H
#define KVP_COMMON_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/status.h"

typedef struct ssl_st kvp_ssl_t; /* OpenSSL's SSL, opaque here */
typedef struct kvp_tls kvp_tls_t;

typedef struct kvp_tls_params {
    const char *cert; /* PEM certificate (chain) presented to the peer; client: optional */
    const char *key;  /* its private key */
    const char *ca;   /* PEM CA bundle that signs the peer's certificate */
    const char *crl;  /* PEM CRL(s) of that CA; NULL: no revocation check */
} kvp_tls_params_t;

/*
 * A context. Server: cert and key required; with ca, clients are asked for a
 * certificate (verified against ca and crl when they send one; one that fails
 * ends the handshake). Client: ca required (the master's certificate is
 * verified, its name too), cert/key optional (mutual TLS). TLS 1.3 only.
 * KVP_ERR_INVALID_ARG with a sentence in err (which file, what is wrong; never a key's
 * bytes).
 */
kvp_status_t kvp_tls_create(const kvp_tls_params_t *params, bool server, kvp_tls_t **tls_p,
                            char *err, size_t err_len);
void kvp_tls_destroy(kvp_tls_t *tls);

/* ---- server side: non-blocking, on an accepted fd ---- */

/* A new server-side TLS session on fd (the handshake runs inside the first reads). */
kvp_status_t kvp_tls_accept(kvp_tls_t *tls, int fd, kvp_ssl_t **ssl_p);
void kvp_tls_free(kvp_ssl_t *ssl);

#define KVP_TLS_WANT_READ (-2)
#define KVP_TLS_WANT_WRITE (-3)
/*
 * Read / write up to len bytes. > 0: bytes moved; 0 (read only): the peer closed;
 * KVP_TLS_WANT_READ / KVP_TLS_WANT_WRITE: try again when the socket is readable /
 * writable; -1: the session failed (a handshake refused: unknown CA, expired,
 * revoked, not TLS 1.3, not TLS at all), why in err.
 */
ssize_t kvp_tls_read(kvp_ssl_t *ssl, void *buf, size_t len, char *err, size_t err_len);
ssize_t kvp_tls_write(kvp_ssl_t *ssl, const void *buf, size_t len, char *err, size_t err_len);
/* Bytes decrypted, or read ahead from the socket, and not yet read (epoll cannot see them). */
bool kvp_tls_pending(kvp_ssl_t *ssl);
/* The handshake is done. */
bool kvp_tls_established(kvp_ssl_t *ssl);
/* The subject CN of the peer's verified certificate. false: the peer sent none. */
bool kvp_tls_peer_cn(kvp_ssl_t *ssl, char *buf, size_t len);
/* Verify a certificate a peer presented elsewhere (DER; the HTTPS door's) against this
 * context's CAs and CRL, as a handshake would, and put its subject CN in buf. false:
 * refused, *why_p (static or OpenSSL's text) says why. */
bool kvp_tls_verify_der(kvp_tls_t *tls, const void *der, size_t der_len, char *buf, size_t len,
                        const char **why_p);

/* ---- client side: a blocking channel ---- */

typedef struct kvp_chan kvp_chan_t;

/*
 * Take fd (a connected, blocking socket) as a channel: plain when tls is NULL, else
 * the TLS handshake runs now (host: the name or address the master's certificate must
 * name). timeout_ms bounds each wait on the network (0: none). The channel owns fd from
 * here on, on failure too. KVP_ERR_DENIED (with err) when the handshake is refused;
 * KVP_ERR_TIMEOUT; KVP_ERR_IO.
 */
kvp_status_t kvp_chan_open(kvp_tls_t *tls, int fd, const char *host, uint32_t timeout_ms,
                           kvp_chan_t **ch_p, char *err, size_t err_len);
/* Close fd and free. */
void kvp_chan_close(kvp_chan_t *ch);
/* shutdown(2) both ways: a thread waiting on the channel wakes with an error. */
void kvp_chan_shutdown(kvp_chan_t *ch);
int kvp_chan_fd(const kvp_chan_t *ch);
bool kvp_chan_is_tls(const kvp_chan_t *ch);

/* Exactly len bytes. KVP_ERR_IO (peer closed, broken), KVP_ERR_TIMEOUT. */
kvp_status_t kvp_chan_send_all(kvp_chan_t *ch, const void *buf, size_t len);
/* Header and body as one write where small (one TLS record). */
kvp_status_t kvp_chan_send2(kvp_chan_t *ch, const void *a, size_t alen, const void *b, size_t blen);
kvp_status_t kvp_chan_recv_all(kvp_chan_t *ch, void *buf, size_t len);
/*
 * Wait until the channel has bytes to read (decrypted ones and whole records OpenSSL read
 * ahead count) or timeout_ms passes. KVP_OK, KVP_ERR_TIMEOUT, KVP_ERR_IO.
 */
kvp_status_t kvp_chan_wait_readable(kvp_chan_t *ch, int timeout_ms);

#endif
