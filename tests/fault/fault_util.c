/*
 * fault_util.c - helpers for the fault-injection suite (see fault_util.h).
 *
 * The raw connections speak TLS through OpenSSL directly, not through common/tls.c's
 * kvp_chan_t: closing a kvp_chan_t sends a close_notify, and the writer of case 4 hands
 * its session to a forked child, so our side must drop its copy of the socket without a
 * word on it. Their I/O is non-blocking with poll(), so every wait has a deadline.
 */
#include "tests/fault/fault_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "common/clock.h"
#include "common/parse.h"

void fault_sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- master flags ---- */

static pthread_mutex_t help_lock = PTHREAD_MUTEX_INITIALIZER;
static char help_text[8192];
static int help_state; /* 0 unknown, 1 read, -1 could not run */

bool fault_master_has_flag(const char *flag)
{
    pthread_mutex_lock(&help_lock);
    if (help_state == 0) {
        char *argv[] = {(char *)kvp_test_master_bin(), "--help", NULL};
        int rc = kvp_run(argv, NULL, help_text, sizeof(help_text), 10000);
        help_state = rc == 0 ? 1 : -1;
        if (rc != 0)
            fprintf(stderr, "fault: '%s --help' exited with %d\n", argv[0], rc);
    }
    bool has = false;
    if (help_state == 1) {
        /* a whole flag: "--client-ttl" must not match "--client-ttl-foo" */
        size_t n = strlen(flag);
        for (const char *p = strstr(help_text, flag); p != NULL && !has; p = strstr(p + 1, flag)) {
            char after = p[n];
            has = after == ' ' || after == '\n' || after == '=' || after == '\t' || after == '\0';
        }
    }
    pthread_mutex_unlock(&help_lock);
    return has;
}

bool fault_start_master(kvp_proc_t *p, const char *const *extra, bool ttl_optional)
{
    char *args[32];
    int n = 0;
    bool have_ttl = fault_master_has_flag("--client-ttl");
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 31; i++) {
        if (strcmp(extra[i], "--client-ttl") == 0 && !have_ttl) {
            if (ttl_optional) {
                fprintf(stderr,
                        "fault: NOTE: this kvpool-master has no --client-ttl; starting it "
                        "without '--client-ttl %s' (this test does not depend on it)\n",
                        extra[i + 1] ? extra[i + 1] : "");
                if (extra[i + 1] != NULL)
                    i++;
                continue;
            }
            fprintf(stderr, "fault: this kvpool-master has no --client-ttl (the client TTL "
                            "feature is not in this build); the test needs it\n");
        }
        args[n++] = (char *)extra[i];
    }
    args[n] = NULL;
    return kvp_start_master_args(p, args);
}

/* ---- processes ---- */

static int wait_status(pid_t pid, int *status, int timeout_ms)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid)
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
        if ((int64_t)(deadline - kvp_now_ms()) <= 0)
            return 1;
        fault_sleep_ms(2);
    }
}

int fault_kill9_pid(pid_t pid)
{
    if (pid <= 0)
        return -1;
    int status = 0;
    kill(pid, SIGKILL);
    if (wait_status(pid, &status, 10000) != 0)
        return -1;
    if (WIFSIGNALED(status))
        return WTERMSIG(status) == SIGKILL ? 0 : 128 + WTERMSIG(status);
    if (WIFEXITED(status))
        return 1000 + WEXITSTATUS(status); /* it exited by itself before our kill */
    return -1;
}

int fault_kill9(kvp_proc_t *p)
{
    int rc = fault_kill9_pid(p->pid);
    p->pid = 0;
    return rc;
}

char fault_proc_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "PID (comm) S ...": comm may contain anything, so look after the last ')' */
    char *rp = strrchr(buf, ')');
    if (rp == NULL || rp[1] != ' ')
        return 0;
    return rp[2];
}

bool fault_wait_state(pid_t pid, char state, int timeout_ms)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        if (fault_proc_state(pid) == state)
            return true;
        if ((int64_t)(deadline - kvp_now_ms()) <= 0)
            return false;
        fault_sleep_ms(1);
    }
}

int fault_wait_fd_count(pid_t pid, int want, int timeout_ms)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    int n;
    for (;;) {
        n = kvp_proc_fd_count(pid);
        if (n == want || (int64_t)(deadline - kvp_now_ms()) <= 0)
            return n;
        fault_sleep_ms(10);
    }
}

/* ---- raw connections ---- */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void fault_rpc_hdr(uint8_t out[FAULT_RPC_HDR], uint32_t magic, uint16_t version, uint16_t method,
                   uint64_t req_id, uint32_t body_len)
{
    put32(out, magic);
    put16(out + 4, version);
    put16(out + 6, method);
    put64(out + 8, req_id);
    put32(out + 16, body_len);
    put32(out + 20, 0);
    put64(out + 24, 0); /* epoch */
}

bool fault_tls_pass(void)
{
    return kvp_test_tls_dir() != NULL;
}

/* The client contexts, [0] without a certificate and [1] with $KVPOOL_TLS_CERT's: made at
 * first use, shared by every thread, kept until the process exits. */
static SSL_CTX *tls_ctx[2];
static pthread_mutex_t tls_lock = PTHREAD_MUTEX_INITIALIZER;

static SSL_CTX *tls_ctx_new(bool with_cert)
{
    const char *ca = getenv("KVPOOL_TLS_CA"), *cert = getenv("KVPOOL_TLS_CERT");
    const char *key = getenv("KVPOOL_TLS_KEY");
    if (ca == NULL || (with_cert && (cert == NULL || key == NULL))) {
        fprintf(stderr, "fault: TLS needs KVPOOL_TLS_CA%s\n",
                with_cert ? ", KVPOOL_TLS_CERT and KVPOOL_TLS_KEY" : "");
        return NULL;
    }
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL)
        return NULL;
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF); /* a close is a close */
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    const char *file = ca;
    bool ok = SSL_CTX_load_verify_locations(ctx, ca, NULL) == 1;
    if (ok && with_cert) {
        file = cert;
        ok = SSL_CTX_use_certificate_chain_file(ctx, cert) == 1 &&
             SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) == 1;
    }
    if (!ok) {
        char why[200];
        ERR_error_string_n(ERR_get_error(), why, sizeof(why));
        ERR_clear_error();
        fprintf(stderr, "fault: TLS: cannot load %s (or its key): %s\n", file, why);
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static SSL_CTX *tls_client_ctx(bool with_cert)
{
    pthread_mutex_lock(&tls_lock);
    if (tls_ctx[with_cert] == NULL)
        tls_ctx[with_cert] = tls_ctx_new(with_cert);
    SSL_CTX *ctx = tls_ctx[with_cert];
    pthread_mutex_unlock(&tls_lock);
    return ctx;
}

/* Wait until fd is readable (writable: wr) before deadline; false on timeout or error. */
static bool wait_fd(int fd, bool wr, uint64_t deadline)
{
    for (;;) {
        int64_t left = (int64_t)(deadline - kvp_now_ms());
        if (left <= 0)
            return false;
        struct pollfd pf = {.fd = fd, .events = wr ? POLLOUT : POLLIN};
        int rc = poll(&pf, 1, (int)left);
        if (rc > 0)
            return true;
        if (rc == 0 || errno != EINTR)
            return false;
    }
}

bool fault_conn_open(fault_conn_t *c, const char *hostport, bool tls, bool with_cert,
                     int timeout_ms)
{
    c->fd = -1;
    c->ssl = NULL;
    char host[256];
    uint16_t port;
    if (kvp_parse_hostport(hostport, host, sizeof(host), &port) != KVP_OK)
        return false;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return false;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    int rc;
    do
        rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    while (rc != 0 && errno == EINTR);
    if (rc != 0)
        goto err_close;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    c->fd = fd;
    if (!tls)
        return true;
    SSL_CTX *ctx = tls_client_ctx(with_cert);
    if (ctx == NULL || (c->ssl = SSL_new(ctx)) == NULL || SSL_set_fd(c->ssl, fd) != 1)
        goto err_free_ssl;
    /* the master's certificate must name the address we dialled */
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), host);
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        ERR_clear_error();
        rc = SSL_connect(c->ssl);
        if (rc == 1)
            return true;
        int e = SSL_get_error(c->ssl, rc);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
            char why[200] = "the connection broke";
            if (ERR_peek_error() != 0)
                ERR_error_string_n(ERR_get_error(), why, sizeof(why));
            ERR_clear_error();
            fprintf(stderr, "fault: TLS handshake with %s: %s\n", hostport, why);
            goto err_free_ssl;
        }
        if (!wait_fd(fd, e == SSL_ERROR_WANT_WRITE, deadline)) {
            fprintf(stderr, "fault: TLS handshake with %s: no answer in %d ms\n", hostport,
                    timeout_ms);
            goto err_free_ssl;
        }
    }

err_free_ssl:
    SSL_free(c->ssl);
    c->ssl = NULL;
    c->fd = -1;
err_close:
    close(fd);
    return false;
}

void fault_conn_close(fault_conn_t *c)
{
    SSL_free(c->ssl); /* no SSL_shutdown: nothing is sent */
    c->ssl = NULL;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

/*
 * One send or receive of at most len bytes (plain or TLS) before deadline: how many bytes
 * moved; 0 when the peer has closed (FIN, reset, close_notify); -1 on timeout or error.
 */
static ssize_t conn_io(fault_conn_t *c, bool wr, void *buf, size_t len, uint64_t deadline)
{
    for (;;) {
        bool want_wr = wr;
        if (c->ssl == NULL) {
            ssize_t n = wr ? send(c->fd, buf, len, MSG_NOSIGNAL) : recv(c->fd, buf, len, 0);
            if (n > 0 || (n == 0 && !wr))
                return n;
            if (n < 0 && (errno == ECONNRESET || errno == EPIPE))
                return 0;
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return -1;
        } else {
            size_t n = 0;
            ERR_clear_error();
            errno = 0;
            int r = wr ? SSL_write_ex(c->ssl, buf, len, &n) : SSL_read_ex(c->ssl, buf, len, &n);
            if (r == 1)
                return (ssize_t)n;
            int e = SSL_get_error(c->ssl, r);
            bool eof =
                e == SSL_ERROR_ZERO_RETURN ||
                (e == SSL_ERROR_SYSCALL && (errno == 0 || errno == ECONNRESET || errno == EPIPE));
            if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
                ERR_clear_error();
                return eof ? 0 : -1;
            }
            want_wr = e == SSL_ERROR_WANT_WRITE;
        }
        if (!wait_fd(c->fd, want_wr, deadline))
            return -1;
    }
}

bool fault_conn_send(fault_conn_t *c, const void *buf, size_t len, int timeout_ms)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = conn_io(c, true, (void *)p, len, deadline);
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

ssize_t fault_conn_recv_exact(fault_conn_t *c, void *buf, size_t len, int timeout_ms)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    uint8_t *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t n = conn_io(c, false, p + got, len - got, deadline);
        if (n <= 0)
            return n == 0 && got == 0 ? 0 : -1;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

ssize_t fault_conn_until_closed(fault_conn_t *c, void *buf, size_t cap, int timeout_ms)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    size_t got = 0;
    for (;;) {
        uint8_t sink[4096];
        bool keep = got < cap;
        uint8_t *dst = keep ? (uint8_t *)buf + got : sink;
        size_t room = keep ? cap - got : sizeof(sink);
        ssize_t n = conn_io(c, false, dst, room, deadline);
        if (n == 0)
            return (ssize_t)got;
        if (n < 0)
            return -1;
        got += (size_t)n;
    }
}

bool fault_conn_read_frame(fault_conn_t *c, fault_frame_t *f, void *body, size_t cap,
                           int timeout_ms)
{
    uint8_t h[FAULT_RPC_HDR];
    if (fault_conn_recv_exact(c, h, sizeof(h), timeout_ms) != FAULT_RPC_HDR)
        return false;
    f->magic = get32(h);
    f->version = (uint16_t)(h[4] | h[5] << 8);
    f->method = (uint16_t)(h[6] | h[7] << 8);
    f->req_id = (uint64_t)get32(h + 8) | (uint64_t)get32(h + 12) << 32;
    f->body_len = get32(h + 16);
    f->status = (int32_t)get32(h + 20);
    if (f->magic != FAULT_RPC_MAGIC || f->body_len > (body != NULL ? cap : 64 * 1024))
        return false;
    if (body != NULL)
        return f->body_len == 0 ||
               fault_conn_recv_exact(c, body, f->body_len, timeout_ms) == (ssize_t)f->body_len;
    for (uint32_t left = f->body_len; left > 0;) {
        uint8_t sink[1024];
        size_t n = left < sizeof(sink) ? left : sizeof(sink);
        if (fault_conn_recv_exact(c, sink, n, timeout_ms) != (ssize_t)n)
            return false;
        left -= (uint32_t)n;
    }
    return true;
}
