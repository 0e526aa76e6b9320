/*
 * harness.c - process control for integration tests (see harness.h).
 */
#include "tests/harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

const char *kvp_test_master_bin(void)
{
    const char *p = getenv("KVPOOL_MASTER_BIN");
    return p ? p : "kvpool-master";
}

const char *kvp_test_transport(void)
{
    const char *t = getenv("KVPOOL_TRANSPORT");
    return t != NULL && t[0] != '\0' ? t : NULL;
}

const char *kvp_test_cli_bin(void)
{
    const char *p = getenv("KVPOOL_CLI_BIN");
    return p ? p : "kvpool";
}

bool kvp_proc_start(kvp_proc_t *p, char *const argv[], int timeout_ms)
{
    memset(p, 0, sizeof(*p));
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return false;
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return false;
    }
    if (pid == 0) {
        if (dup2(pfd[1], 3) < 0)
            _exit(127);
        execv(argv[0], argv);
        fprintf(stderr, "harness: cannot exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    p->pid = pid;
    size_t got = 0;
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    bool ok = false;
    while (got < sizeof(p->ready) - 1) {
        int left = (int)(deadline - kvp_now_ms());
        if ((int64_t)(deadline - kvp_now_ms()) <= 0)
            break;
        struct pollfd pf = {.fd = pfd[0], .events = POLLIN};
        int rc = poll(&pf, 1, left);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            break;
        ssize_t n = read(pfd[0], p->ready + got, sizeof(p->ready) - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
        p->ready[got] = '\0';
        char *nl = strchr(p->ready, '\n');
        if (nl != NULL) {
            *nl = '\0';
            ok = true;
            break;
        }
    }
    close(pfd[0]);
    if (!ok) {
        fprintf(stderr, "harness: %s did not become ready\n", argv[0]);
        kvp_proc_kill9(p);
    }
    return ok;
}

bool kvp_start_master(kvp_proc_t *p)
{
    /* No read leases by default: these tests remove what they just read. The lease
     * tests start their master with kvp_start_master_args. */
    char *args[] = {"--lease-ttl", "0", NULL};
    return kvp_start_master_args(p, args);
}

bool kvp_start_master_args(kvp_proc_t *p, char *const extra[])
{
    char *argv[32] = {(char *)kvp_test_master_bin(),
                      "--listen",
                      "127.0.0.1:0",
                      "--ready-fd",
                      "3",
                      "--log-level",
                      "warn"};
    int n = 7;
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    return kvp_proc_start(p, argv, 10000);
}

bool kvp_start_segment(kvp_proc_t *p, const char *master, const char *size, const char *transport)
{
    char *argv[] = {(char *)kvp_test_cli_bin(),
                    "--master",
                    (char *)master,
                    "--transport",
                    (char *)(transport ? transport : "auto"),
                    "serve",
                    "--segment-size",
                    (char *)size,
                    "--ready-fd",
                    "3",
                    NULL};
    return kvp_proc_start(p, argv, 10000);
}

static int wait_for(pid_t pid, int *status, int timeout_ms)
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
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int kvp_proc_stop(kvp_proc_t *p, int sig, int timeout_ms)
{
    if (p->pid <= 0)
        return 0;
    int status = 0;
    kill(p->pid, sig ? sig : SIGTERM);
    int w = wait_for(p->pid, &status, timeout_ms);
    if (w == 1) {
        fprintf(stderr, "harness: pid %d ignored signal %d for %d ms; SIGKILL\n", (int)p->pid,
                sig ? sig : SIGTERM, timeout_ms);
        kill(p->pid, SIGKILL);
        wait_for(p->pid, &status, 5000);
        p->pid = 0;
        return -1;
    }
    p->pid = 0;
    if (w < 0)
        return -1;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

int kvp_proc_wait_exit(kvp_proc_t *p, int timeout_ms)
{
    if (p->pid <= 0)
        return -1;
    int status = 0;
    int w = wait_for(p->pid, &status, timeout_ms);
    if (w != 0) {
        if (w == 1)
            fprintf(stderr, "harness: pid %d still running after %d ms; SIGKILL\n", (int)p->pid,
                    timeout_ms);
        kill(p->pid, SIGKILL);
        wait_for(p->pid, &status, 5000);
        p->pid = 0;
        return -1;
    }
    p->pid = 0;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

void kvp_proc_kill9(kvp_proc_t *p)
{
    if (p->pid <= 0)
        return;
    int status;
    kill(p->pid, SIGKILL);
    wait_for(p->pid, &status, 5000);
    p->pid = 0;
}

int kvp_run(char *const argv[], const char *stdin_path, char *out, size_t out_len, int timeout_ms)
{
    int opipe[2] = {-1, -1};
    if (out != NULL && pipe2(opipe, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (stdin_path != NULL) {
            int fd = open(stdin_path, O_RDONLY);
            if (fd < 0 || dup2(fd, 0) < 0)
                _exit(127);
        }
        if (out != NULL && dup2(opipe[1], 1) < 0)
            _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    size_t got = 0;
    if (out != NULL) {
        close(opipe[1]);
        for (;;) {
            char tmp[4096];
            ssize_t n = read(opipe[0], tmp, sizeof(tmp));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            size_t c = (size_t)n;
            if (got + c > out_len - 1)
                c = out_len - 1 - got;
            memcpy(out + got, tmp, c);
            got += c;
        }
        out[got] = '\0';
        close(opipe[0]);
    }
    int status = 0;
    if (wait_for(pid, &status, timeout_ms) != 0) {
        kill(pid, SIGKILL);
        wait_for(pid, &status, 5000);
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

long kvp_proc_rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    long kib = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

int kvp_proc_fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

void kvp_fill_pattern(void *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    uint8_t *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    for (; i < len; i++)
        p[i] = (uint8_t)(x >> (8 * (i & 7)));
}

bool kvp_proc_freeze(pid_t pid, int timeout_ms)
{
    if (kill(pid, SIGSTOP) != 0)
        return false;
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        DIR *d = opendir(dir);
        if (d == NULL)
            return false;
        bool all = true;
        struct dirent *de;
        while ((de = readdir(d)) != NULL && all) {
            if (de->d_name[0] == '.')
                continue;
            char path[600], buf[512];
            snprintf(path, sizeof(path), "%s/%s/stat", dir, de->d_name);
            FILE *f = fopen(path, "r");
            if (f == NULL)
                continue;
            size_t n = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            buf[n] = '\0';
            const char *p = strrchr(buf, ')'); /* "pid (comm) S ..." */
            all = p != NULL && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
        }
        closedir(d);
        if (all)
            return true;
        if (kvp_now_ms() >= deadline)
            return false;
        usleep(1000);
    }
}
