/*
 * te_two_hosts.c - the transfer engine between two hosts: deploy/test-rdma.sh runs it in two
 * Soft-RoCE guests whose NICs share one virtual wire (tests/rdma/rxe-vm.sh, RXE_VM_LINK), the
 * decode in one, the prefill in the other, both with protocol "auto" as vLLM's
 * MooncakeConnector leaves it.
 *
 *   te_two_hosts decode DIR     (in the guest whose RXE_IP the prefill reaches)
 *   te_two_hosts prefill DIR
 *
 * Three rounds, one subdirectory of DIR each, the two sides meeting through files there (DIR
 * is on the host, shared into both guests):
 *   - none: the decode with KVPOOL_AUTH=none. The prefill writes block lists of vLLM's layout
 *     (per layer a K and a V tensor) as merged contiguous runs, reads some back, and checks
 *     that `auto` took rdma to this peer of another host (kvp_te_peer_stats: route "rdma")
 *     and moved every byte; the decode then checks its whole KV cache byte for byte (the
 *     blocks written hold the prefill's bytes, every other block its own) and that its own
 *     server moved none of them (one-sided: the NIC placed them);
 *   - tls: both with the TLS credentials in $KVPOOL_RDMA_TEST_CERTS (principal admin) and the
 *     decode with KVPOOL_TE_PEERS=admin: the same, over rdma, after the proof;
 *   - protected: the decode in its default protected mode (no credentials): the prefill's
 *     write from another host is refused (KVP_ERR_DENIED), the decode counts it
 *     (refused_protected) and its bytes are all its own;
 *   - store: the decode's host runs kvpool-master and `kvpool serve` ($KVPOOL_MASTER_BIN,
 *     $KVPOOL_CLI_BIN; --auth none), the prefill's host a store client with transport
 *     "auto" and registered buffers: its puts and gets to the segment of another host go
 *     over rdma (the client's per-transport bytes: all rdma, none tcp), byte-exact.
 * Exit 0 when every round passed on this side (the decode: its checks; the prefill: its
 * checks and the decode's verdict), 1 otherwise; what failed on stderr.
 */
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "client/include/kvpool_te.h"

#define LAYERS 4
#define TENSORS (LAYERS * 2)
#define NUM_BLOCKS 32
#define BLOCK (32u * 1024)
#define TENSOR ((size_t)NUM_BLOCKS * BLOCK)
#define WAIT_S 120
#define DECODE_SEED 0xa5
#define PREFILL_SEED 0x5a

/* The blocks the prefill writes: runs [first, first + count) */
static const unsigned RUNS[][2] = {{0, 3}, {5, 1}, {8, 8}, {20, 2}, {31, 1}};
#define N_RUNS (sizeof(RUNS) / sizeof(RUNS[0]))

static uint8_t pattern(unsigned seed, unsigned t, unsigned b, size_t i)
{
    return (uint8_t)((seed ^ (t * 131u + b * 7u)) + (unsigned)(i * 13u));
}

static void fill(uint8_t *base, unsigned t, unsigned seed)
{
    for (unsigned b = 0; b < NUM_BLOCKS; b++)
        for (size_t i = 0; i < BLOCK; i++)
            base[(size_t)b * BLOCK + i] = pattern(seed, t, b, i);
}

static bool written(unsigned b)
{
    for (size_t r = 0; r < N_RUNS; r++)
        if (b >= RUNS[r][0] && b < RUNS[r][0] + RUNS[r][1])
            return true;
    return false;
}

static void path(char *out, size_t cap, const char *dir, const char *mode, const char *name)
{
    snprintf(out, cap, "%s/%s/%s", dir, mode, name);
}

/* Write text to DIR/MODE/NAME at once (a temporary file renamed: the other side never reads
 * half of it). */
static bool put_file(const char *dir, const char *mode, const char *name, const char *text)
{
    char p[512], tmp[560];
    path(p, sizeof(p), dir, mode, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", p);
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return false;
    bool ok = fputs(text, f) >= 0;
    ok = fclose(f) == 0 && ok;
    return ok && rename(tmp, p) == 0;
}

/* Wait for DIR/MODE/NAME and read it (NULL: not there within WAIT_S). */
static char *wait_file(const char *dir, const char *mode, const char *name)
{
    char p[512];
    path(p, sizeof(p), dir, mode, name);
    for (int i = 0; i < WAIT_S * 20; i++) {
        FILE *f = fopen(p, "r");
        if (f != NULL) {
            char *buf = calloc(1, 8192);
            size_t n = buf ? fread(buf, 1, 8191, f) : 0;
            fclose(f);
            (void)n;
            return buf;
        }
        usleep(50 * 1000);
    }
    fprintf(stderr, "te_two_hosts: %s did not appear within %d s\n", p, WAIT_S);
    return NULL;
}

static const char *certs(void)
{
    const char *d = getenv("KVPOOL_RDMA_TEST_CERTS");
    return d != NULL ? d : "build-rdma/tests/rdma-certs";
}

/* The environment the engine reads at its creation, for one round and side. */
static void round_env(const char *mode, bool decode)
{
    static char ca[512], cert[512], key[512];
    unsetenv("KVPOOL_TLS_CA");
    unsetenv("KVPOOL_TLS_CERT");
    unsetenv("KVPOOL_TLS_KEY");
    unsetenv("KVPOOL_TE_PEERS");
    unsetenv("KVPOOL_AUTH");
    if (strcmp(mode, "none") == 0 && decode)
        setenv("KVPOOL_AUTH", "none", 1);
    if (strcmp(mode, "tls") == 0) {
        snprintf(ca, sizeof(ca), "%s/ca.crt", certs());
        snprintf(cert, sizeof(cert), "%s/admin.crt", certs());
        snprintf(key, sizeof(key), "%s/admin.key", certs());
        setenv("KVPOOL_TLS_CA", ca, 1);
        setenv("KVPOOL_TLS_CERT", cert, 1);
        setenv("KVPOOL_TLS_KEY", key, 1);
        if (decode)
            setenv("KVPOOL_TE_PEERS", "admin", 1);
    }
}

static const char *ip(void)
{
    const char *a = getenv("RXE_IP");
    return a != NULL ? a : "127.0.0.1";
}

/* This side's engine for a round, protocol "auto" as the connector leaves it (NULL: said) */
static kvp_te_t *engine(const char *mode, bool decode)
{
    round_env(mode, decode);
    kvp_te_t *te = NULL;
    kvp_status_t st = kvp_te_create(ip(), "P2PHANDSHAKE", "auto", &te);
    if (st != KVP_OK)
        fprintf(stderr, "%s %s: create: %s\n", decode ? "decode" : "prefill", mode,
                kvp_strerror(st));
    return te;
}

static int decode_round(const char *dir, const char *mode)
{
    kvp_te_t *te = engine(mode, true);
    if (te == NULL)
        return 1;
    kvp_status_t st;
    uint8_t *kv[TENSORS];
    char text[4096];
    int at = snprintf(text, sizeof(text), "%s:%u\n", ip(), (unsigned)kvp_te_rpc_port(te));
    for (unsigned t = 0; t < TENSORS; t++) {
        kv[t] = aligned_alloc(4096, TENSOR);
        if (kv[t] == NULL)
            return 1;
        fill(kv[t], t, DECODE_SEED);
        st = kvp_te_register(te, kv[t], TENSOR);
        if (st != KVP_OK) {
            fprintf(stderr, "decode %s: register: %s\n", mode, kvp_strerror(st));
            return 1;
        }
        at += snprintf(text + at, sizeof(text) - (size_t)at, "%llu\n",
                       (unsigned long long)(uintptr_t)kv[t]);
    }
    if (!put_file(dir, mode, "decode.addr", text))
        return 1;
    char *done = wait_file(dir, mode, "prefill.done");
    if (done == NULL)
        return 1;
    bool refused = strcmp(mode, "protected") == 0;
    char why[512] = "";
    for (unsigned t = 0; t < TENSORS && why[0] == '\0'; t++)
        for (unsigned b = 0; b < NUM_BLOCKS && why[0] == '\0'; b++) {
            unsigned seed = !refused && written(b) ? PREFILL_SEED : DECODE_SEED;
            for (size_t i = 0; i < BLOCK; i++)
                if (kv[t][(size_t)b * BLOCK + i] != pattern(seed, t, b, i)) {
                    snprintf(why, sizeof(why),
                             "tensor %u block %u byte %zu: 0x%02x, not the %s's 0x%02x", t, b, i,
                             kv[t][(size_t)b * BLOCK + i],
                             seed == PREFILL_SEED ? "prefill" : "decode", pattern(seed, t, b, i));
                    break;
                }
        }
    kvp_te_counters_t c;
    kvp_te_get_counters(te, &c);
    if (why[0] == '\0' && refused && c.refused_protected == 0)
        snprintf(why, sizeof(why), "another host's connection was not counted as refused");
    /* one-sided: the NIC placed the bytes, the decode's server moved none of them */
    if (why[0] == '\0' && !refused &&
        (c.served_bytes[KVP_TE_WRITE] != 0 || c.served_bytes[KVP_TE_READ] != 0))
        snprintf(why, sizeof(why),
                 "the decode's server moved %llu bytes itself: not one-sided rdma",
                 (unsigned long long)(c.served_bytes[KVP_TE_WRITE] + c.served_bytes[KVP_TE_READ]));
    printf("decode %s: prefill said '%s'; served %llu write bytes, %llu read bytes; refused "
           "(protected) %llu: %s\n",
           mode, strtok(done, "\n"), (unsigned long long)c.served_bytes[KVP_TE_WRITE],
           (unsigned long long)c.served_bytes[KVP_TE_READ], (unsigned long long)c.refused_protected,
           why[0] ? why : "all bytes as expected");
    free(done);
    put_file(dir, mode, "decode.result", why[0] ? why : "ok");
    kvp_te_destroy(te);
    for (unsigned t = 0; t < TENSORS; t++)
        free(kv[t]);
    return why[0] ? 1 : 0;
}

static int prefill_round(const char *dir, const char *mode)
{
    char *addr = wait_file(dir, mode, "decode.addr");
    if (addr == NULL)
        return 1;
    char *save = NULL, *target = strtok_r(addr, "\n", &save);
    uint64_t remote[TENSORS];
    for (unsigned t = 0; t < TENSORS; t++) {
        char *l = strtok_r(NULL, "\n", &save);
        remote[t] = l != NULL ? strtoull(l, NULL, 10) : 0;
    }
    kvp_te_t *te = engine(mode, false);
    if (te == NULL)
        return 1;
    kvp_status_t st;
    uint8_t *kv[TENSORS], *back = aligned_alloc(4096, TENSOR);
    for (unsigned t = 0; t < TENSORS; t++) {
        kv[t] = aligned_alloc(4096, TENSOR);
        if (kv[t] == NULL || back == NULL)
            return 1;
        fill(kv[t], t, PREFILL_SEED);
        if (kvp_te_register(te, kv[t], TENSOR) != KVP_OK)
            return 1;
    }
    if (kvp_te_register(te, back, TENSOR) != KVP_OK)
        return 1;
    /* the block lists, as the connector writes them: one range per merged run and tensor */
    void *locals[TENSORS * N_RUNS];
    uint64_t remotes[TENSORS * N_RUNS], lens[TENSORS * N_RUNS];
    size_t n = 0;
    for (unsigned t = 0; t < TENSORS; t++)
        for (size_t r = 0; r < N_RUNS; r++) {
            size_t off = (size_t)RUNS[r][0] * BLOCK;
            locals[n] = kv[t] + off;
            remotes[n] = remote[t] + off;
            lens[n++] = (uint64_t)RUNS[r][1] * BLOCK;
        }
    char why[512] = "";
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = kvp_te_transfer(te, target, KVP_TE_WRITE, n, locals, remotes, lens);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    bool refused = strcmp(mode, "protected") == 0;
    if (refused && st != KVP_ERR_DENIED)
        snprintf(why, sizeof(why),
                 "a write from another host into a protected decode: %s, "
                 "not KVP_ERR_DENIED",
                 kvp_strerror(st));
    if (!refused && st != KVP_OK)
        snprintf(why, sizeof(why), "write: %s", kvp_strerror(st));
    if (!refused && why[0] == '\0') {
        /* tensor 3's blocks 8..15 back: the prefill's bytes */
        void *bl = back;
        uint64_t rr = remote[3] + 8 * (uint64_t)BLOCK, rl = 8 * (uint64_t)BLOCK;
        st = kvp_te_transfer(te, target, KVP_TE_READ, 1, &bl, &rr, &rl);
        if (st != KVP_OK)
            snprintf(why, sizeof(why), "read: %s", kvp_strerror(st));
        else if (memcmp(back, kv[3] + 8 * (size_t)BLOCK, 8 * (size_t)BLOCK) != 0)
            snprintf(why, sizeof(why), "read back: not the bytes written");
    }
    kvp_te_peer_stat_t ps[4];
    size_t np = kvp_te_peer_stats(te, ps, 4);
    if (why[0] == '\0' && !refused) {
        uint64_t want = 0;
        for (size_t i = 0; i < n; i++)
            want += lens[i];
        want += 8 * (uint64_t)BLOCK;
        if (np != 1 || strcmp(ps[0].route, "rdma") != 0)
            snprintf(why, sizeof(why), "auto took route '%s' to a peer of another host, not rdma",
                     np > 0 ? ps[0].route : "(none)");
        else if (ps[0].bytes != want || ps[0].failures != 0)
            snprintf(why, sizeof(why), "the peer's counts: %llu bytes (want %llu), %llu failures",
                     (unsigned long long)ps[0].bytes, (unsigned long long)want,
                     (unsigned long long)ps[0].failures);
    }
    printf("prefill %s: write of %zu ranges to %s: %s in %.1f ms, route %s: %s\n", mode, n, target,
           kvp_strerror(st), ms, np > 0 ? ps[0].route : "(none)", why[0] ? why : "as expected");
    put_file(dir, mode, "prefill.done", why[0] ? why : "ok");
    char *verdict = wait_file(dir, mode, "decode.result");
    if (verdict == NULL || strcmp(verdict, "ok") != 0) {
        fprintf(stderr, "prefill %s: the decode says: %s\n", mode, verdict ? verdict : "(nothing)");
        if (why[0] == '\0')
            snprintf(why, sizeof(why), "the decode's check");
    }
    free(verdict);
    free(addr);
    kvp_te_destroy(te);
    for (unsigned t = 0; t < TENSORS; t++)
        free(kv[t]);
    free(back);
    return why[0] ? 1 : 0;
}

/* ---- the store across the two hosts ---- */

#define STORE_OBJS 16
#define STORE_OBJ (256u * 1024)

/* Start argv, whose "FD" argument becomes the write end of a pipe (its --ready-fd); wait
 * for its ready line into ready. Its pid, or -1 (said). */
static pid_t spawn_ready(char **argv, char *ready, size_t cap)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    char fd[16];
    snprintf(fd, sizeof(fd), "%d", fds[1]);
    for (char **a = argv; *a != NULL; a++)
        if (strcmp(*a, "FD") == 0)
            *a = fd;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    struct pollfd pf = {.fd = fds[0], .events = POLLIN};
    while (pid > 0 && n + 1 < cap && (n == 0 || ready[n - 1] != '\n') && poll(&pf, 1, 30000) == 1) {
        ssize_t r = read(fds[0], ready + n, cap - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fds[0]);
    ready[n] = '\0';
    char *nl = strchr(ready, '\n');
    if (pid < 0 || nl == NULL) {
        fprintf(stderr, "store: %s did not become ready\n", argv[0]);
        if (pid > 0)
            kill(pid, SIGKILL);
        return -1;
    }
    *nl = '\0';
    return pid;
}

static int stop_pid(pid_t pid)
{
    int status = 0;
    if (pid <= 0)
        return -1;
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int decode_store(const char *dir)
{
    const char *mbin = getenv("KVPOOL_MASTER_BIN"), *cbin = getenv("KVPOOL_CLI_BIN");
    if (mbin == NULL || cbin == NULL) {
        fprintf(stderr, "store: KVPOOL_MASTER_BIN and KVPOOL_CLI_BIN must name the binaries\n");
        put_file(dir, "store", "master.addr", "none");
        put_file(dir, "store", "decode.result", "no binaries");
        return 1;
    }
    unsetenv("KVPOOL_AUTH");
    char listen[64], maddr[256], sready[512];
    snprintf(listen, sizeof(listen), "%s:0", ip());
    char *margv[] = {(char *)mbin,  "--listen", listen,       "--auth", "none",
                     "--log-level", "warn",     "--ready-fd", "FD",     NULL};
    pid_t m = spawn_ready(margv, maddr, sizeof(maddr));
    char *sargv[] = {(char *)cbin,     "--master", maddr,    "serve",
                     "--segment-size", "64MiB",    "--auth", "none",
                     "--ready-fd",     "FD",       NULL};
    pid_t sv = m > 0 ? spawn_ready(sargv, sready, sizeof(sready)) : -1;
    put_file(dir, "store", "master.addr", sv > 0 ? maddr : "none");
    char *done = sv > 0 ? wait_file(dir, "store", "client.done") : NULL;
    int src = stop_pid(sv), mrc = stop_pid(m);
    char why[256] = "";
    if (done == NULL)
        snprintf(why, sizeof(why), "no master and segment, or no word from the client");
    else if (src != 0 || mrc != 0)
        snprintf(why, sizeof(why), "kvpool serve exited %d, kvpool-master %d", src, mrc);
    printf("decode store: master %s, segment served; the client said '%s': %s\n", maddr,
           done ? done : "(nothing)", why[0] ? why : "ok");
    free(done);
    put_file(dir, "store", "decode.result", why[0] ? why : "ok");
    return why[0] ? 1 : 0;
}

static int prefill_store(const char *dir)
{
    char *addr = wait_file(dir, "store", "master.addr");
    if (addr == NULL)
        return 1;
    char why[512] = "";
    kvp_client_t *c = NULL;
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = addr;
    p.transport = "auto";
    kvp_status_t st = strcmp(addr, "none") == 0 ? KVP_ERR_CONNECT : kvp_client_create(&p, &c);
    uint8_t *src = aligned_alloc(4096, (size_t)STORE_OBJS * STORE_OBJ);
    uint8_t *dst = aligned_alloc(4096, (size_t)STORE_OBJS * STORE_OBJ);
    if (st != KVP_OK)
        snprintf(why, sizeof(why), "client on %s: %s", addr, kvp_strerror(st));
    else if (src == NULL || dst == NULL ||
             kvp_register_buffer(c, src, (size_t)STORE_OBJS * STORE_OBJ) != KVP_OK ||
             kvp_register_buffer(c, dst, (size_t)STORE_OBJS * STORE_OBJ) != KVP_OK)
        snprintf(why, sizeof(why), "buffers: %s", kvp_client_last_error());
    for (unsigned i = 0; i < STORE_OBJS && why[0] == '\0'; i++) {
        char key[32];
        snprintf(key, sizeof(key), "two-hosts-%u", i);
        for (size_t j = 0; j < STORE_OBJ; j++)
            src[(size_t)i * STORE_OBJ + j] = pattern(PREFILL_SEED, i, (unsigned)(j / BLOCK), j);
        memset(dst + (size_t)i * STORE_OBJ, 0, STORE_OBJ);
        st = kvp_put(c, key, src + (size_t)i * STORE_OBJ, STORE_OBJ, NULL);
        int64_t r = st == KVP_OK ? kvp_get_into(c, key, dst + (size_t)i * STORE_OBJ, STORE_OBJ)
                                 : (int64_t)st;
        if (st != KVP_OK)
            snprintf(why, sizeof(why), "put %s: %s (%s)", key, kvp_strerror(st),
                     kvp_client_last_error());
        else if (r != STORE_OBJ)
            snprintf(why, sizeof(why), "get %s: %lld", key, (long long)r);
        else if (memcmp(src + (size_t)i * STORE_OBJ, dst + (size_t)i * STORE_OBJ, STORE_OBJ) != 0)
            snprintf(why, sizeof(why), "get %s: not the bytes put", key);
    }
    kvp_metrics_t mt;
    memset(&mt, 0, sizeof(mt));
    mt.size = sizeof(mt);
    if (c != NULL && kvp_metrics_snapshot(c, &mt) != KVP_OK && why[0] == '\0')
        snprintf(why, sizeof(why), "metrics: %s", kvp_client_last_error());
    uint64_t want = (uint64_t)STORE_OBJS * STORE_OBJ;
    const kvp_metrics_count_t *rp = &mt.client[KVP_METRICS_TP_RDMA].put,
                              *rg = &mt.client[KVP_METRICS_TP_RDMA].get,
                              *tp = &mt.client[KVP_METRICS_TP_TCP].put,
                              *tg = &mt.client[KVP_METRICS_TP_TCP].get;
    if (why[0] == '\0' &&
        (rp->bytes != want || rg->bytes != want || tp->bytes != 0 || tg->bytes != 0))
        snprintf(why, sizeof(why),
                 "auto to a segment of another host: rdma put %llu / get %llu bytes, tcp put "
                 "%llu / get %llu (want all %llu on rdma)",
                 (unsigned long long)rp->bytes, (unsigned long long)rg->bytes,
                 (unsigned long long)tp->bytes, (unsigned long long)tg->bytes,
                 (unsigned long long)want);
    printf("prefill store: %u puts and gets of %u KiB through %s, rdma %llu/%llu bytes, tcp "
           "%llu/%llu: %s\n",
           STORE_OBJS, STORE_OBJ >> 10, addr, (unsigned long long)rp->bytes,
           (unsigned long long)rg->bytes, (unsigned long long)tp->bytes,
           (unsigned long long)tg->bytes, why[0] ? why : "as expected");
    kvp_client_destroy(c);
    put_file(dir, "store", "client.done", why[0] ? why : "ok");
    char *verdict = wait_file(dir, "store", "decode.result");
    if ((verdict == NULL || strcmp(verdict, "ok") != 0) && why[0] == '\0')
        snprintf(why, sizeof(why), "the decode's side: %s", verdict ? verdict : "(nothing)");
    free(verdict);
    free(src);
    free(dst);
    free(addr);
    return why[0] ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "decode") != 0 && strcmp(argv[1], "prefill") != 0)) {
        fprintf(stderr, "usage: te_two_hosts decode|prefill DIR\n");
        return 2;
    }
    static const char *modes[] = {"none", "tls", "protected"};
    bool decode = strcmp(argv[1], "decode") == 0;
    int failed = 0;
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
        if (decode) {
            char d[512];
            snprintf(d, sizeof(d), "%s/%s", argv[2], modes[m]);
            mkdir(d, 0700);
        }
        int rc = decode ? decode_round(argv[2], modes[m]) : prefill_round(argv[2], modes[m]);
        if (rc != 0)
            fprintf(stderr, "te_two_hosts %s: round %s failed\n", argv[1], modes[m]);
        failed += rc;
    }
    if (decode) {
        char d[512];
        snprintf(d, sizeof(d), "%s/store", argv[2]);
        mkdir(d, 0700);
    }
    int rc = decode ? decode_store(argv[2]) : prefill_store(argv[2]);
    if (rc != 0)
        fprintf(stderr, "te_two_hosts %s: round store failed\n", argv[1]);
    failed += rc;
    printf("te_two_hosts %s: %d of 4 rounds failed\n", argv[1], failed);
    return failed ? 1 : 0;
}
