/*
 * harness.c - process control for integration tests (see harness.h).
 */
#include "tests/harness.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/rand.h"
#include "common/sock.h"

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

const char *kvp_test_tls_dir(void)
{
    const char *d = getenv("KVPOOL_TEST_TLS_DIR");
    return d != NULL && d[0] != '\0' ? d : NULL;
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
    /* the TLS pass (deploy/test.sh): every master with TLS 1.3 and the pass's ACL; the
     * clients, serve and CLI name their principal through $KVPOOL_TLS_* */
    static char tls[5][600];
    static const char *const files[5] = {"server.crt", "server.key", "ca.crt", "crl.pem",
                                         "acl.conf"};
    static const char *const flags[5] = {"--tls-cert", "--tls-key", "--tls-ca", "--tls-crl",
                                         "--acl-file"};
    const char *dir = kvp_test_tls_dir();
    for (int i = 0; dir != NULL && i < 5; i++) {
        snprintf(tls[i], sizeof(tls[i]), "%s/%s", dir, files[i]);
        argv[n++] = (char *)flags[i];
        argv[n++] = tls[i];
    }
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

bool kvp_wait_flag(atomic_bool *flag, int ms)
{
    for (int i = 0; i < ms && !atomic_load(flag); i++)
        usleep(1000);
    return atomic_load(flag);
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

/* ---- a private etcd ---- */

bool kvp_etcd_available(void)
{
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", path != NULL ? path : "/usr/bin:/bin");
    char *save = NULL;
    for (char *d = strtok_r(buf, ":", &save); d != NULL; d = strtok_r(NULL, ":", &save)) {
        char exe[4200];
        snprintf(exe, sizeof(exe), "%s/etcd", d);
        if (access(exe, X_OK) == 0)
            return true;
    }
    return false;
}

static bool etcd_port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

int kvp_etcd_free_port(void)
{
    for (int i = 0; i < 1000; i++) {
        int port = 20000 + (int)(kvp_random_u64() % 12768);
        if (etcd_port_free(port))
            return port;
    }
    return -1;
}

typedef struct {
    char *buf;
    size_t cap, got;
} http_sink_t;

static size_t http_sink(char *data, size_t size, size_t n, void *arg)
{
    http_sink_t *k = arg;
    size_t len = size * n, room = k->cap - 1 - k->got;
    memcpy(k->buf + k->got, data, len < room ? len : room);
    k->got += len < room ? len : room;
    return len;
}

size_t kvp_http_get(int port, const char *path, bool tls, char *buf, size_t cap)
{
    http_sink_t k = {.buf = buf, .cap = cap};
    buf[0] = '\0';
    CURL *h = curl_easy_init();
    if (h == NULL)
        return 0;
    char url[600], ca[600], cert[600], key[600];
    snprintf(url, sizeof(url), "%s://127.0.0.1:%d%s", tls ? "https" : "http", port, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_HEADER, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, http_sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &k);
    const char *dir = kvp_test_tls_dir();
    if (tls && dir != NULL) {
        snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
        snprintf(cert, sizeof(cert), "%s/admin.crt", dir);
        snprintf(key, sizeof(key), "%s/admin.key", dir);
        curl_easy_setopt(h, CURLOPT_CAINFO, ca);
        curl_easy_setopt(h, CURLOPT_SSLCERT, cert);
        curl_easy_setopt(h, CURLOPT_SSLKEY, key);
    }
    CURLcode rc = curl_easy_perform(h);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK)
        k.got = 0; /* (etcd's /health is asked until it listens: no noise) */
    buf[k.got] = '\0';
    return k.got;
}

double kvp_http_metric(int port, const char *name)
{
    size_t cap = 1 << 20, nlen = strlen(name);
    char *buf = malloc(cap);
    double v = -1;
    if (buf == NULL)
        return v;
    kvp_http_get(port, "/metrics", kvp_test_tls_dir() != NULL, buf, cap);
    const char *l = buf;
    while (l != NULL && *l != '\0') {
        if (strncmp(l, name, nlen) == 0 && l[nlen] == ' ') {
            v = strtod(l + nlen + 1, NULL);
            break;
        }
        l = strchr(l, '\n');
        if (l != NULL)
            l++;
    }
    free(buf);
    return v;
}

/* GET /health on 127.0.0.1:port: true when it says {"health":"true"}. */
static bool etcd_healthy(int port)
{
    char buf[2048];
    kvp_http_get(port, "/health", false, buf, sizeof(buf));
    return strstr(buf, "\"health\":\"true\"") != NULL;
}

static void etcd_print_log(const kvp_etcd_proc_t *p, int i)
{
    char path[320], line[1024];
    snprintf(path, sizeof(path), "%s/m%d.log", p->dir, i);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return;
    fprintf(stderr, "harness: --- %s (last lines) ---\n", path);
    long lines = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        lines++;
    rewind(f);
    for (long l = 0; fgets(line, sizeof(line), f) != NULL; l++)
        if (l >= lines - 15)
            fputs(line, stderr);
    fclose(f);
}

static pid_t etcd_spawn(kvp_etcd_proc_t *p, int i, const char *cluster)
{
    char name[16], data[300], log[320], curl[64], purl[64], token[300];
    snprintf(name, sizeof(name), "m%d", i);
    snprintf(data, sizeof(data), "%s/m%d", p->dir, i);
    snprintf(log, sizeof(log), "%s/m%d.log", p->dir, i);
    snprintf(curl, sizeof(curl), "http://127.0.0.1:%d", p->client_port[i]);
    snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", p->peer_port[i]);
    snprintf(token, sizeof(token), "kvpool-test-%d-%d", (int)getpid(), p->peer_port[0]);
    char *argv[] = {"etcd",
                    "--name",
                    name,
                    "--data-dir",
                    data,
                    "--listen-client-urls",
                    curl,
                    "--advertise-client-urls",
                    curl,
                    "--listen-peer-urls",
                    purl,
                    "--initial-advertise-peer-urls",
                    purl,
                    "--initial-cluster",
                    (char *)cluster,
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    token,
                    "--logger=zap",
                    "--log-outputs=stderr",
                    NULL};
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a crashed test */
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
        _exit(127);
    execvp(argv[0], argv);
    fprintf(stderr, "harness: cannot exec etcd: %s\n", strerror(errno));
    _exit(127);
}

/* --initial-cluster: "m0=http://127.0.0.1:PEER0,m1=..." */
static void etcd_cluster_string(const kvp_etcd_proc_t *p, char *buf, size_t cap)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->n; i++)
        off += (size_t)snprintf(buf + off, cap - off, "%sm%d=http://127.0.0.1:%d", i ? "," : "", i,
                                p->peer_port[i]);
}

static void etcd_kill_all(kvp_etcd_proc_t *p, int sig)
{
    for (int i = 0; i < p->n; i++) {
        if (p->pid[i] <= 0)
            continue;
        kvp_proc_t proc = {.pid = p->pid[i]};
        if (sig == SIGKILL)
            kvp_proc_kill9(&proc);
        else
            kvp_proc_stop(&proc, sig, 5000);
        p->pid[i] = 0;
    }
}

static int etcd_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/*
 * Start p->n members on the ports in p; wait until all are healthy. false
 * when one exits (*conflict_p: its log mentions a port in use) or the wait
 * runs out; everything started is killed then.
 */
static bool etcd_launch(kvp_etcd_proc_t *p, bool *conflict_p)
{
    char cluster[KVP_ETCD_MAX_MEMBERS * 48];
    etcd_cluster_string(p, cluster, sizeof(cluster));
    size_t off = 0;
    p->endpoints[0] = '\0';
    for (int i = 0; i < p->n; i++)
        off += (size_t)snprintf(p->endpoints + off, sizeof(p->endpoints) - off, "%s127.0.0.1:%d",
                                i ? "," : "", p->client_port[i]);
    for (int i = 0; i < p->n; i++) {
        p->pid[i] = etcd_spawn(p, i, cluster);
        if (p->pid[i] < 0) {
            p->pid[i] = 0;
            etcd_kill_all(p, SIGKILL);
            return false;
        }
    }
    *conflict_p = false;
    uint64_t deadline = kvp_now_ms() + 20000;
    bool healthy[KVP_ETCD_MAX_MEMBERS] = {false};
    int left = p->n;
    while (left > 0) {
        for (int i = 0; i < p->n; i++) {
            int status;
            if (waitpid(p->pid[i], &status, WNOHANG) == p->pid[i]) {
                p->pid[i] = 0;
                char path[320], buf[65536];
                snprintf(path, sizeof(path), "%s/m%d.log", p->dir, i);
                FILE *f = fopen(path, "re");
                size_t n = f != NULL ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
                if (f != NULL)
                    fclose(f);
                buf[n] = '\0';
                *conflict_p = strstr(buf, "address already in use") != NULL;
                if (!*conflict_p) {
                    fprintf(stderr, "harness: etcd member %d exited at start\n", i);
                    etcd_print_log(p, i);
                }
                etcd_kill_all(p, SIGKILL);
                return false;
            }
            if (!healthy[i] && etcd_healthy(p->client_port[i])) {
                healthy[i] = true;
                left--;
            }
        }
        if (left > 0 && kvp_now_ms() >= deadline) {
            fprintf(stderr, "harness: etcd not healthy after 20 s\n");
            for (int i = 0; i < p->n; i++)
                etcd_print_log(p, i);
            etcd_kill_all(p, SIGKILL);
            return false;
        }
        if (left > 0)
            usleep(20 * 1000);
    }
    return true;
}

static bool etcd_start(kvp_etcd_proc_t *p, int n, int client_port)
{
    memset(p, 0, sizeof(*p));
    if (n < 1 || n > KVP_ETCD_MAX_MEMBERS)
        return false;
    if (!kvp_etcd_available()) {
        fprintf(stderr, "harness: no etcd binary on PATH (Debian: apt-get install etcd-server)\n");
        return false;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(p->dir, sizeof(p->dir), "%s/kvpool-etcd.XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(p->dir) == NULL) {
        fprintf(stderr, "harness: mkdtemp %s: %s\n", p->dir, strerror(errno));
        return false;
    }
    p->n = n;
    for (int attempt = 0; attempt < 5; attempt++) {
        for (int i = 0; i < n; i++) {
            do {
                p->client_port[i] = i == 0 && client_port > 0 ? client_port : kvp_etcd_free_port();
                p->peer_port[i] = kvp_etcd_free_port();
            } while (p->client_port[i] == p->peer_port[i]);
        }
        bool conflict = false;
        if (etcd_launch(p, &conflict))
            return true;
        if (!conflict || client_port > 0)
            break;
        /* a port was taken between the check and etcd's bind: new ports, new data */
        nftw(p->dir, etcd_rm, 16, FTW_DEPTH | FTW_PHYS);
        mkdir(p->dir, 0700);
    }
    nftw(p->dir, etcd_rm, 16, FTW_DEPTH | FTW_PHYS);
    p->dir[0] = '\0';
    return false;
}

bool kvp_start_etcd(kvp_etcd_proc_t *p)
{
    return etcd_start(p, 1, 0);
}

bool kvp_start_etcd_port(kvp_etcd_proc_t *p, int client_port)
{
    return etcd_start(p, 1, client_port);
}

bool kvp_start_etcd_cluster(kvp_etcd_proc_t *p, int n)
{
    return etcd_start(p, n, 0);
}

void kvp_kill_etcd_member(kvp_etcd_proc_t *p, int i)
{
    if (i < 0 || i >= p->n || p->pid[i] <= 0)
        return;
    kvp_proc_t proc = {.pid = p->pid[i]};
    kvp_proc_kill9(&proc);
    p->pid[i] = 0;
}

bool kvp_restart_etcd_member(kvp_etcd_proc_t *p, int i)
{
    if (i < 0 || i >= p->n || p->pid[i] > 0)
        return false;
    /* The data dir exists: etcd rejoins with it and ignores --initial-cluster. */
    char cluster[KVP_ETCD_MAX_MEMBERS * 48];
    etcd_cluster_string(p, cluster, sizeof(cluster));
    p->pid[i] = etcd_spawn(p, i, cluster);
    if (p->pid[i] < 0) {
        p->pid[i] = 0;
        return false;
    }
    uint64_t deadline = kvp_now_ms() + 20000;
    while (!etcd_healthy(p->client_port[i])) {
        int status;
        if (waitpid(p->pid[i], &status, WNOHANG) == p->pid[i] || kvp_now_ms() >= deadline) {
            fprintf(stderr, "harness: etcd member %d did not come back\n", i);
            etcd_print_log(p, i);
            kvp_kill_etcd_member(p, i);
            return false;
        }
        usleep(20 * 1000);
    }
    return true;
}

void kvp_stop_etcd_member(kvp_etcd_proc_t *p, int i)
{
    if (i < 0 || i >= p->n || p->pid[i] <= 0)
        return;
    kvp_proc_t proc = {.pid = p->pid[i]};
    kvp_proc_stop(&proc, SIGTERM, 5000);
    p->pid[i] = 0;
}

void kvp_stop_etcd(kvp_etcd_proc_t *p)
{
    etcd_kill_all(p, SIGTERM);
    if (p->dir[0] != '\0')
        nftw(p->dir, etcd_rm, 16, FTW_DEPTH | FTW_PHYS);
    p->dir[0] = '\0';
    p->n = 0;
}
