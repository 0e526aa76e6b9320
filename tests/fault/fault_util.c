/*
 * fault_util.c - helpers for the fault-injection suite (see fault_util.h).
 */
#include "tests/fault/fault_util.h"

#include <arpa/inet.h>
#include <errno.h>
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

/* ---- raw sockets ---- */

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

int fault_connect(const char *hostport)
{
    char host[256];
    uint16_t port;
    if (kvp_parse_hostport(hostport, host, sizeof(host), &port) != KVP_OK)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int rc;
    do
        rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

bool fault_send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

ssize_t fault_recv_exact(int fd, void *buf, size_t len, int timeout_ms)
{
    uint8_t *p = buf;
    size_t got = 0;
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    while (got < len) {
        int64_t left = (int64_t)(deadline - kvp_now_ms());
        if (left <= 0)
            return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int rc = poll(&pf, 1, (int)left);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            return -1;
        ssize_t n = recv(fd, p + got, len - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            return got == 0 ? 0 : -1;
        if (n < 0)
            return errno == ECONNRESET && got == 0 ? 0 : -1;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

int fault_wait_closed(int fd, int timeout_ms)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int rc;
    do
        rc = poll(&pf, 1, timeout_ms);
    while (rc < 0 && errno == EINTR);
    if (rc == 0)
        return -1;
    uint8_t b[256];
    ssize_t n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
    if (n > 0)
        return 1;
    if (n == 0 || errno == ECONNRESET)
        return 0;
    return -1;
}

bool fault_read_frame(int fd, fault_frame_t *f, int timeout_ms)
{
    uint8_t h[FAULT_RPC_HDR];
    if (fault_recv_exact(fd, h, sizeof(h), timeout_ms) != FAULT_RPC_HDR)
        return false;
    f->magic = get32(h);
    f->version = (uint16_t)(h[4] | h[5] << 8);
    f->method = (uint16_t)(h[6] | h[7] << 8);
    f->req_id = (uint64_t)get32(h + 8) | (uint64_t)get32(h + 12) << 32;
    f->body_len = get32(h + 16);
    f->status = (int32_t)get32(h + 20);
    if (f->magic != FAULT_RPC_MAGIC || f->body_len > 64 * 1024)
        return false;
    for (uint32_t left = f->body_len; left > 0;) {
        uint8_t sink[1024];
        size_t c = left < sizeof(sink) ? left : sizeof(sink);
        if (fault_recv_exact(fd, sink, c, timeout_ms) != (ssize_t)c)
            return false;
        left -= (uint32_t)c;
    }
    return true;
}
