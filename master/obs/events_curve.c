/*
 * events_curve.c - the KV events sockets as CURVE servers, with a ZAP handler
 * that lets in only the public keys of an allow-list (events_curve.h).
 *
 * Design. libzmq does the cryptography (CURVE, libsodium); we give it the
 * master's secret key and answer its ZAP requests (RFC 27) on a REP socket
 * bound at inproc://zeromq.zap.01 of the events' own context: 200 with the
 * key's tenant (or "*") as the User-Id, which libzmq attaches to every
 * message of that peer, or 400 for a key not listed (counted: reason key).
 * A peer without CURVE, or whose handshake fails (the wrong server key),
 * never reaches ZAP: a socket monitor on each socket reports the failed
 * handshake, counted as reason curve. Both are logged rate-limited, with the
 * peer's address and, for an unknown key, its public key (never a secret).
 *
 * The publisher thread polls the ZAP socket and the monitors with its own
 * sockets and answers at once: a handshake waits for that answer, so it is
 * served between batches too. The allow-list is read at create and at each
 * reload (SIGHUP, the master's loop); the new list replaces the old under a
 * mutex, the only state the two threads share besides the counters. ZAP is
 * asked at each handshake only, so a connection let in stays in after its
 * key leaves the list; the reload says how many keys left (or changed
 * tenant), and events.c then closes its sockets and opens fresh ones, whose
 * peers all shake hands again (secure() with `like`: the fresh socket takes
 * the old one's key and watch).
 *
 * The secret key is read into a stack buffer, given to libzmq and wiped;
 * errors name the file and the line, never a key. A socket secured after
 * the seal gets the key libzmq keeps in the socket it replaces.
 */
#include "master/obs/events_curve.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "master/meta/tenant.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_DOMAIN "kvpool-events"
#define Z85_KEY_LEN 40
#define ALLOW_BYTES_MAX (4u << 20) /* an allow-list file at most */
#define SECRET_BYTES_MAX 256u      /* a secret key file at most */
#define ZAP_PER_ROUND 64           /* ZAP requests answered per serve */
#define ZAP_FRAMES 7               /* version .. credentials (CURVE: one) */
#define ZAP_FRAME_MAX 256

typedef struct allow_entry {
    uint8_t key[32];
    char tenant[KVP_EVENTS_TENANT_MAX + 1]; /* or "*" */
} allow_entry_t;

typedef struct allow_list {
    allow_entry_t *e;
    size_t n;
} allow_list_t;

/* The failed handshakes of one socket: a PAIR hearing its monitor. */
typedef struct watch {
    char name[8]; /* "pub" or "replay"; "": unused */
    void *mon;    /* NULL: none (a re-secured socket whose monitor could not be made) */
} watch_t;

struct kvp_events_curve {
    void *zctx;
    char *allow_path;
    char secret_z85[Z85_KEY_LEN + 1]; /* until kvp_events_curve_seal, then zeros */
    char public_z85[Z85_KEY_LEN + 1];
    void *zap;
    watch_t watch[2];   /* the pub's and the replay's */
    unsigned watch_gen; /* makes each monitor's inproc endpoint a new one */

    pthread_mutex_t lock; /* allow */
    allow_list_t *allow;

    atomic_uint_fast64_t refused_curve;
    atomic_uint_fast64_t refused_key;
};

/* Read a whole small file into a malloc'd NUL-terminated buffer, refusing it
 * when its mode has any of the bits of bad_mode (why: in err). */
static kvp_status_t read_file(const char *path, const char *what, mode_t bad_mode, const char *fix,
                              size_t max, char **buf_p, size_t *len_p, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kvp_errf(err, err_len, "%s %s: %s", what, path, strerror(errno));
        return KVP_ERR_INVALID_ARG;
    }
    kvp_status_t status = KVP_ERR_INVALID_ARG;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        kvp_errf(err, err_len, "%s %s: not a regular file", what, path);
        goto err_close;
    }
    if (st.st_mode & bad_mode) {
        kvp_errf(err, err_len, "%s %s is %s by group or others: %s", what, path,
                 (bad_mode & S_IROTH) ? "readable" : "writable", fix);
        goto err_close;
    }
    if ((size_t)st.st_size > max) {
        kvp_errf(err, err_len, "%s %s: larger than %zu bytes", what, path, max);
        goto err_close;
    }
    char *buf = malloc(max + 1);
    if (buf == NULL) {
        status = KVP_ERR_NOMEM;
        kvp_errf(err, err_len, "%s %s: out of memory", what, path);
        goto err_close;
    }
    size_t len = 0;
    ssize_t r;
    while (len < max && (r = read(fd, buf + len, max - len)) != 0) {
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            kvp_errf(err, err_len, "%s %s: %s", what, path, strerror(errno));
            explicit_bzero(buf, len);
            free(buf);
            goto err_close;
        }
        len += (size_t)r;
    }
    buf[len] = '\0';
    close(fd);
    *buf_p = buf;
    *len_p = len;
    return KVP_OK;

err_close:
    close(fd);
    return status;
}

/* s[0..n) with blanks at both ends cut off (returns the new start, *n the new length). */
static char *trim(char *s, size_t *n)
{
    while (*n > 0 && (s[0] == ' ' || s[0] == '\t' || s[0] == '\r'))
        s++, (*n)--;
    while (*n > 0 &&
           (s[*n - 1] == ' ' || s[*n - 1] == '\t' || s[*n - 1] == '\r' || s[*n - 1] == '\n'))
        (*n)--;
    return s;
}

/* A Z85 key of 40 characters into its 32 bytes; false when it is not one. */
static bool z85_key(const char *s, size_t n, uint8_t out[32])
{
    char z[Z85_KEY_LEN + 1];
    if (n != Z85_KEY_LEN)
        return false;
    memcpy(z, s, n);
    z[n] = '\0';
    bool ok = zmq_z85_decode(out, z) != NULL;
    explicit_bzero(z, sizeof(z));
    return ok;
}

static void allow_free(allow_list_t *a)
{
    if (a == NULL)
        return;
    free(a->e);
    free(a);
}

static int entry_cmp(const void *a, const void *b)
{
    return memcmp(((const allow_entry_t *)a)->key, ((const allow_entry_t *)b)->key, 32);
}

/* The entry of key in a (sorted by key), or NULL. */
static const allow_entry_t *allow_find(const allow_list_t *a, const uint8_t key[32])
{
    allow_entry_t probe;
    memcpy(probe.key, key, sizeof(probe.key));
    return a->n == 0 ? NULL : bsearch(&probe, a->e, a->n, sizeof(*a->e), entry_cmp);
}

/* Parse the allow-list file at path (its entries sorted by key). */
static kvp_status_t allow_read(const char *path, allow_list_t **a_p, char *err, size_t err_len)
{
    char *buf;
    size_t len;
    kvp_status_t status = read_file(path, "--kv-events-curve-allow", S_IWGRP | S_IWOTH,
                                    "chmod go-w it", ALLOW_BYTES_MAX, &buf, &len, err, err_len);
    if (status != KVP_OK)
        return status;
    status = KVP_ERR_NOMEM;
    allow_list_t *a = calloc(1, sizeof(*a));
    size_t cap = 16;
    if (a == NULL || (a->e = calloc(cap, sizeof(*a->e))) == NULL)
        goto err_free;
    status = KVP_ERR_INVALID_ARG;
    unsigned line = 0;
    for (char *p = buf, *next; p < buf + len; p = next) {
        line++;
        char *nl = memchr(p, '\n', (size_t)(buf + len - p));
        next = nl != NULL ? nl + 1 : buf + len;
        /* '#' starts a comment at a line's start or after a blank: Z85 has '#' too */
        char *hash = p;
        while (hash < next && !(*hash == '#' && (hash == p || hash[-1] == ' ' || hash[-1] == '\t')))
            hash++;
        size_t n = (size_t)(hash - p);
        char *s = trim(p, &n);
        if (n == 0)
            continue;
        size_t klen = strcspn(s, " \t");
        if (klen > n)
            klen = n;
        size_t tn = n - klen;
        char *t = trim(s + klen, &tn);
        uint8_t key[32];
        if (!z85_key(s, klen, key)) {
            kvp_errf(err, err_len,
                     "--kv-events-curve-allow %s line %u: not a CURVE public key (40 Z85 "
                     "characters, as deploy/make-curve-keys.sh writes in NAME.pub)",
                     path, line);
            goto err_free;
        }
        if (tn == 0 || (!(tn == 1 && t[0] == '*') && !kvp_tenant_name_valid(t, tn))) {
            kvp_errf(err, err_len,
                     "--kv-events-curve-allow %s line %u: give KEY TENANT (TENANT: "
                     "[A-Za-z0-9._-]{1,63}, or * for every tenant)",
                     path, line);
            goto err_free;
        }
        for (size_t i = 0; i < a->n; i++)
            if (memcmp(a->e[i].key, key, sizeof(key)) == 0) {
                kvp_errf(err, err_len, "--kv-events-curve-allow %s line %u: key listed twice", path,
                         line);
                goto err_free;
            }
        if (a->n == cap) {
            allow_entry_t *e = realloc(a->e, 2 * cap * sizeof(*e));
            if (e == NULL) {
                status = KVP_ERR_NOMEM;
                goto err_free;
            }
            a->e = e;
            cap *= 2;
        }
        memcpy(a->e[a->n].key, key, sizeof(key));
        memcpy(a->e[a->n].tenant, t, tn);
        a->e[a->n].tenant[tn] = '\0';
        a->n++;
    }
    free(buf);
    qsort(a->e, a->n, sizeof(*a->e), entry_cmp); /* for allow_find */
    *a_p = a;
    return KVP_OK;

err_free:
    if (status == KVP_ERR_NOMEM)
        kvp_errf(err, err_len, "--kv-events-curve-allow %s: out of memory", path);
    allow_free(a);
    free(buf);
    return status;
}

/* The secret key file: exactly one Z85 key (blanks around it allowed). */
static kvp_status_t secret_read(const char *path, char secret[Z85_KEY_LEN + 1], char *err,
                                size_t err_len)
{
    char *buf;
    size_t len;
    kvp_status_t status = read_file(path, "--kv-events-curve-secret", S_IRWXG | S_IRWXO,
                                    "chmod 600 it", SECRET_BYTES_MAX, &buf, &len, err, err_len);
    if (status != KVP_OK)
        return status;
    size_t n = len;
    char *s = trim(buf, &n);
    uint8_t key[32];
    bool ok = z85_key(s, n, key);
    if (ok) {
        memcpy(secret, s, Z85_KEY_LEN);
        secret[Z85_KEY_LEN] = '\0';
    }
    explicit_bzero(key, sizeof(key));
    explicit_bzero(buf, len);
    free(buf);
    if (!ok) {
        kvp_errf(err, err_len,
                 "--kv-events-curve-secret %s: not a CURVE secret key (40 Z85 characters on "
                 "one line, as deploy/make-curve-keys.sh writes in NAME.key)",
                 path);
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}

static void log_allow(const kvp_events_curve_t *cv, const allow_list_t *a, const char *when)
{
    size_t all = 0;
    for (size_t i = 0; i < a->n; i++)
        all += strcmp(a->e[i].tenant, "*") == 0;
    if (a->n == 0)
        KVP_LOG_WARN("kv events: %s %s lists no subscriber: nobody may subscribe", when,
                     cv->allow_path);
    else
        KVP_LOG_INFO("kv events: %s %s: %zu subscriber keys (%zu of every tenant)", when,
                     cv->allow_path, a->n, all);
}

kvp_status_t kvp_events_curve_create(void *zctx, const char *secret_path, const char *allow_path,
                                     kvp_events_curve_t **cv_p, char *err, size_t err_len)
{
    if (!zmq_has("curve")) {
        kvp_errf(err, err_len, "kv events: this libzmq has no CURVE (built without libsodium)");
        return KVP_ERR_INVALID_ARG;
    }
    kvp_events_curve_t *cv = calloc(1, sizeof(*cv));
    if (cv == NULL || (cv->allow_path = strdup(allow_path)) == NULL) {
        free(cv);
        kvp_errf(err, err_len, "kv events: out of memory");
        return KVP_ERR_NOMEM;
    }
    cv->zctx = zctx;
    kvp_status_t status = secret_read(secret_path, cv->secret_z85, err, err_len);
    if (status != KVP_OK)
        goto err_free;
    if (zmq_curve_public(cv->public_z85, cv->secret_z85) != 0) {
        kvp_errf(err, err_len, "--kv-events-curve-secret %s: cannot derive its public key: %s",
                 secret_path, zmq_strerror(zmq_errno()));
        status = KVP_ERR_INVALID_ARG;
        goto err_free;
    }
    status = allow_read(allow_path, &cv->allow, err, err_len);
    if (status != KVP_OK)
        goto err_free;
    if (pthread_mutex_init(&cv->lock, NULL) != 0) {
        kvp_errf(err, err_len, "kv events: cannot create a mutex");
        status = KVP_ERR_SYSTEM;
        goto err_free_allow;
    }
    status = KVP_ERR_SYSTEM;
    int linger = 0;
    cv->zap = zmq_socket(zctx, ZMQ_REP);
    if (cv->zap == NULL || zmq_setsockopt(cv->zap, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_bind(cv->zap, ZAP_ENDPOINT) != 0) {
        kvp_errf(err, err_len, "kv events: cannot bind the ZAP handler: %s",
                 zmq_strerror(zmq_errno()));
        goto err_close_zap;
    }
    log_allow(cv, cv->allow, "allow-list");
    *cv_p = cv;
    return KVP_OK;

err_close_zap:
    if (cv->zap != NULL)
        zmq_close(cv->zap);
    pthread_mutex_destroy(&cv->lock);
err_free_allow:
    allow_free(cv->allow);
err_free:
    explicit_bzero(cv->secret_z85, sizeof(cv->secret_z85));
    free(cv->allow_path);
    free(cv);
    return status;
}

void kvp_events_curve_destroy(kvp_events_curve_t *cv)
{
    if (cv == NULL)
        return;
    for (int i = 0; i < 2; i++)
        if (cv->watch[i].mon != NULL)
            zmq_close(cv->watch[i].mon);
    zmq_close(cv->zap);
    pthread_mutex_destroy(&cv->lock);
    allow_free(cv->allow);
    explicit_bzero(cv->secret_z85, sizeof(cv->secret_z85));
    free(cv->allow_path);
    free(cv);
}

void kvp_events_curve_seal(kvp_events_curve_t *cv)
{
    explicit_bzero(cv->secret_z85, sizeof(cv->secret_z85));
}

const char *kvp_events_curve_public(const kvp_events_curve_t *cv)
{
    return cv->public_z85;
}

kvp_status_t kvp_events_curve_secure(kvp_events_curve_t *cv, void *sock, void *like,
                                     const char *name, char *err, size_t err_len)
{
    watch_t *w = NULL;
    for (int i = 0; i < 2 && w == NULL; i++)
        if (strcmp(cv->watch[i].name, name) == 0)
            w = &cv->watch[i];
    for (int i = 0; i < 2 && w == NULL; i++)
        if (cv->watch[i].name[0] == '\0')
            w = &cv->watch[i];
    if (w == NULL || strlen(name) >= sizeof(w->name)) {
        kvp_errf(err, err_len, "kv events: two sockets at most");
        return KVP_ERR_INVALID_ARG;
    }
    /* the secret: ours until sealed, else the copy libzmq keeps in the socket replaced */
    char secret[Z85_KEY_LEN + 1];
    size_t secret_len = sizeof(secret);
    if (like != NULL) {
        if (zmq_getsockopt(like, ZMQ_CURVE_SECRETKEY, secret, &secret_len) != 0 ||
            secret_len != sizeof(secret)) {
            explicit_bzero(secret, sizeof(secret));
            kvp_errf(err, err_len, "kv events: cannot read the CURVE key of the %s socket back: %s",
                     name, zmq_strerror(zmq_errno()));
            return KVP_ERR_SYSTEM;
        }
    } else if (cv->secret_z85[0] == '\0') {
        kvp_errf(err, err_len, "kv events: the CURVE secret key was wiped already");
        return KVP_ERR_INVALID_ARG;
    } else {
        memcpy(secret, cv->secret_z85, sizeof(secret));
    }
    int one = 1;
    int rc = zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
             zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, secret, Z85_KEY_LEN) != 0 ||
             zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN)) != 0;
    explicit_bzero(secret, sizeof(secret));
    if (rc != 0) {
        kvp_errf(err, err_len, "kv events: cannot make the %s socket a CURVE server: %s", name,
                 zmq_strerror(zmq_errno()));
        return KVP_ERR_SYSTEM;
    }

    /* the watch moves to sock: the old socket's monitor stops, its reader goes */
    if (like != NULL)
        zmq_socket_monitor(like, NULL, 0);
    if (w->mon != NULL)
        zmq_close(w->mon);
    w->mon = NULL;
    snprintf(w->name, sizeof(w->name), "%s", name);
    char ep[64];
    snprintf(ep, sizeof(ep), "inproc://kvp-events-monitor-%s-%u", name, cv->watch_gen++);
    int events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL;
    void *mon = NULL;
    int linger = 0;
    if (zmq_socket_monitor(sock, ep, events) != 0 ||
        (mon = zmq_socket(cv->zctx, ZMQ_PAIR)) == NULL ||
        zmq_setsockopt(mon, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_connect(mon, ep) != 0) {
        kvp_errf(err, err_len, "kv events: cannot watch the %s socket's handshakes: %s", name,
                 zmq_strerror(zmq_errno()));
        if (mon != NULL)
            zmq_close(mon);
        return KVP_ERR_SYSTEM;
    }
    w->mon = mon;
    return KVP_OK;
}

/* Keys of from that to lacks, or lists for another tenant. */
static unsigned allow_lost(const allow_list_t *from, const allow_list_t *to)
{
    unsigned lost = 0;
    for (size_t i = 0; i < from->n; i++) {
        const allow_entry_t *e = allow_find(to, from->e[i].key);
        lost += e == NULL || strcmp(e->tenant, from->e[i].tenant) != 0;
    }
    return lost;
}

unsigned kvp_events_curve_reload(kvp_events_curve_t *cv)
{
    if (cv == NULL)
        return 0;
    char err[512];
    allow_list_t *a;
    if (allow_read(cv->allow_path, &a, err, sizeof(err)) != KVP_OK) {
        KVP_LOG_ERROR("kv events: allow-list reload failed, the old list stays: %s", err);
        return 0;
    }
    pthread_mutex_lock(&cv->lock);
    allow_list_t *old = cv->allow;
    cv->allow = a;
    pthread_mutex_unlock(&cv->lock);
    unsigned removed = allow_lost(old, a);
    unsigned added = allow_lost(a, old);
    log_allow(cv, a, "reloaded");
    KVP_LOG_INFO("kv events: allow-list: %u keys added, %u removed or moved to another tenant%s",
                 added, removed,
                 removed > 0 ? ": every subscriber connection will be closed, so that those "
                               "keys are refused when they reconnect"
                             : ": subscribers connected stay connected");
    allow_free(old);
    return removed;
}

int kvp_events_curve_poll_items(kvp_events_curve_t *cv, zmq_pollitem_t *items)
{
    int n = 0;
    items[n++] = (zmq_pollitem_t){.socket = cv->zap, .events = ZMQ_POLLIN};
    for (int i = 0; i < 2; i++)
        if (cv->watch[i].mon != NULL)
            items[n++] = (zmq_pollitem_t){.socket = cv->watch[i].mon, .events = ZMQ_POLLIN};
    return n;
}

/* Answer one ZAP request: false when none waits. */
static bool zap_serve_one(kvp_events_curve_t *cv)
{
    uint8_t f[ZAP_FRAMES][ZAP_FRAME_MAX];
    size_t size[ZAP_FRAMES] = {0};
    int n = 0;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, cv->zap, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            if (n == 0)
                return false;
            break; /* cannot happen: ZeroMQ delivers whole messages */
        }
        if (n < ZAP_FRAMES) {
            size[n] = zmq_msg_size(&m) < ZAP_FRAME_MAX ? zmq_msg_size(&m) : ZAP_FRAME_MAX;
            memcpy(f[n], zmq_msg_data(&m), size[n]);
        }
        n++;
        bool more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        if (!more)
            break;
    }

    /* [version, request id, domain, address, routing id, mechanism, public key] */
    const char *tenant = NULL;
    char who[64] = "?";
    char tenant_copy[KVP_EVENTS_TENANT_MAX + 1] = "";
    bool curve = n == ZAP_FRAMES && size[5] == 5 && memcmp(f[5], "CURVE", 5) == 0 && size[6] == 32;
    if (n >= 4)
        snprintf(who, sizeof(who), "%.*s", (int)size[3], (const char *)f[3]);
    if (curve) {
        pthread_mutex_lock(&cv->lock);
        const allow_entry_t *e = allow_find(cv->allow, f[6]);
        if (e != NULL) {
            snprintf(tenant_copy, sizeof(tenant_copy), "%s", e->tenant);
            tenant = tenant_copy;
        }
        pthread_mutex_unlock(&cv->lock);
    }
    if (tenant == NULL) {
        atomic_fetch_add_explicit(&cv->refused_key, 1, memory_order_relaxed);
        char pub[Z85_KEY_LEN + 1] = "(none)";
        if (curve)
            zmq_z85_encode(pub, f[6], 32);
        KVP_LOG_WARN_LIMITED("kv events: refused a subscriber from %s: its CURVE public key %s "
                             "is not in %s",
                             who, pub, cv->allow_path);
    } else {
        KVP_LOG_DEBUG("kv events: subscriber from %s let in (tenant %s)", who, tenant);
    }
    const char *status = tenant != NULL ? "200" : "400";
    const char *text = tenant != NULL ? "OK" : "key not allowed";
    const char *uid = tenant != NULL ? tenant : "";
    int flags = ZMQ_SNDMORE | ZMQ_DONTWAIT;
    if (zmq_send(cv->zap, "1.0", 3, flags) < 0 ||
        zmq_send(cv->zap, n >= 2 ? f[1] : (const uint8_t *)"", n >= 2 ? size[1] : 0, flags) < 0 ||
        zmq_send(cv->zap, status, 3, flags) < 0 ||
        zmq_send(cv->zap, text, strlen(text), flags) < 0 ||
        zmq_send(cv->zap, uid, strlen(uid), flags) < 0 ||
        zmq_send(cv->zap, "", 0, ZMQ_DONTWAIT) < 0)
        KVP_LOG_WARN_LIMITED("kv events: cannot answer a ZAP request: %s",
                             zmq_strerror(zmq_errno()));
    return true;
}

/* Read one monitor event of mon (a failed handshake is counted): false when none waits. */
static bool monitor_serve_one(kvp_events_curve_t *cv, void *mon)
{
    uint8_t head[6] = {0};
    char ep[128] = "";
    size_t got[2] = {0, 0};
    for (int i = 0;; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return i > 0;
        }
        if (i < 2) {
            size_t cap = i == 0 ? sizeof(head) : sizeof(ep) - 1;
            got[i] = zmq_msg_size(&m) < cap ? zmq_msg_size(&m) : cap;
            memcpy(i == 0 ? (void *)head : (void *)ep, zmq_msg_data(&m), got[i]);
        }
        bool more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        if (!more)
            break;
    }
    uint16_t event;
    memcpy(&event, head, sizeof(event)); /* host order, as libzmq writes it */
    if (got[0] < sizeof(head) || (event != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL &&
                                  event != ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL))
        return true;
    atomic_fetch_add_explicit(&cv->refused_curve, 1, memory_order_relaxed);
    KVP_LOG_WARN_LIMITED("kv events: refused a subscriber on %s: no CURVE, or a CURVE handshake "
                         "that failed (the wrong server key?)",
                         ep);
    return true;
}

void kvp_events_curve_serve(kvp_events_curve_t *cv)
{
    for (int i = 0; i < ZAP_PER_ROUND && zap_serve_one(cv); i++)
        ;
    for (int i = 0; i < 2; i++)
        for (int k = 0; cv->watch[i].mon != NULL && k < ZAP_PER_ROUND &&
                        monitor_serve_one(cv, cv->watch[i].mon);
             k++)
            ;
}

void kvp_events_curve_stats(kvp_events_curve_t *cv, uint64_t *refused_curve, uint64_t *refused_key)
{
    *refused_curve =
        cv != NULL ? atomic_load_explicit(&cv->refused_curve, memory_order_relaxed) : 0;
    *refused_key = cv != NULL ? atomic_load_explicit(&cv->refused_key, memory_order_relaxed) : 0;
}
