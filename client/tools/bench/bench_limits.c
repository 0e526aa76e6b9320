/*
 * bench_limits.c - the machine's own ceilings, measured in the same run:
 * single-thread memcpy bandwidth per object size, and loopback TCP
 * bandwidth with a given number of streams (a plain socket pump written
 * here, and iperf3 when it is installed).
 *
 * memcpy: copies `size` bytes between two working sets of 64 objects each
 * (cycled, contiguous, destination skewed to avoid 4 KiB aliasing), as a
 * batch get copies into distinct buffers; bandwidth is bytes copied / time. TCP: `streams`
 * connections over 127.0.0.1, one sender thread each sending `size`-byte messages, one receiver
 * thread each receiving into a `size` buffer; bandwidth is bytes received / time.
 */
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/tools/bench/bench.h"
#include "common/sock.h"

#define WORKING_SET 64

static double measure_memcpy(uint64_t size, double duration)
{
    size_t n = WORKING_SET;
    /* big objects: the working set of a batch of 32 (what the data mode moves) */
    while (n > 32 && (uint64_t)n * size > (512ull << 20))
        n /= 2;
    /* Two contiguous arenas; the destination is offset by 2 KiB + 64 so that a copy's
     * loads never alias its own recent stores modulo 4 KiB (a CPU stall that would make
     * the "limit" a measure of address luck rather than of the machine). */
    size_t skew = 2048 + 64;
    char *src = malloc(n * size), *dst = malloc(n * size + skew);
    if (src == NULL || dst == NULL) {
        free(src);
        free(dst);
        return 0;
    }
    memset(src, 1, n * size);
    memset(dst, 0, n * size + skew);
    uint64_t bytes = 0;
    double t0 = kvp_bench_now(), t;
    size_t i = 0;
    do {
        for (int k = 0; k < 16; k++) {
            memcpy(dst + skew + i * size, src + i * size, size);
            i = (i + 1) % n;
            bytes += size;
        }
        t = kvp_bench_now();
    } while (t - t0 < duration);
    volatile char sink = dst[skew + size - 1];
    (void)sink;
    free(src);
    free(dst);
    return (double)bytes / (t - t0) / 1e9;
}

typedef struct pump {
    int fd;
    uint64_t size;
    double deadline;
    uint64_t bytes;
    bool failed;  /* the thread could not run (allocation) */
    bool started; /* its thread was created */
    pthread_t thread;
} pump_t;

static void *sender(void *arg)
{
    pump_t *p = arg;
    char *buf = malloc(p->size);
    if (buf == NULL) {
        p->failed = true;
        shutdown(p->fd, SHUT_WR);
        return NULL;
    }
    memset(buf, 7, p->size);
    while (kvp_bench_now() < p->deadline)
        if (kvp_send_all(p->fd, buf, p->size) != KVP_OK)
            break;
    shutdown(p->fd, SHUT_WR);
    free(buf);
    return NULL;
}

static void *receiver(void *arg)
{
    pump_t *p = arg;
    char *buf = malloc(p->size);
    if (buf == NULL) {
        p->failed = true;
        close(p->fd); /* a reset: the sender's next send fails */
        p->fd = -1;
        return NULL;
    }
    for (;;) {
        ssize_t n = recv(p->fd, buf, p->size, MSG_WAITALL);
        if (n <= 0)
            break;
        p->bytes += (uint64_t)n;
    }
    free(buf);
    return NULL;
}

static double measure_tcp(uint64_t size, unsigned streams, double duration)
{
    int lfd;
    uint16_t port;
    if (kvp_tcp_listen("127.0.0.1", 0, 64, &lfd, &port) != KVP_OK)
        return 0;
    pump_t *tx = calloc(streams, sizeof(*tx)), *rx = calloc(streams, sizeof(*rx));
    double t0 = kvp_bench_now();
    unsigned ok = 0;
    for (unsigned s = 0; s < streams && tx != NULL && rx != NULL; s++) {
        int cfd, afd;
        if (kvp_tcp_connect("127.0.0.1", port, 5000, &cfd) != KVP_OK)
            break;
        afd = accept(lfd, NULL, NULL);
        if (afd < 0) {
            close(cfd);
            break;
        }
        tx[s] = (pump_t){.fd = cfd, .size = size, .deadline = t0 + duration};
        rx[s] = (pump_t){.fd = afd, .size = size};
        ok++;
    }
    t0 = kvp_bench_now();
    bool failed = ok < streams;
    for (unsigned s = 0; s < ok; s++) {
        tx[s].deadline = t0 + duration;
        rx[s].started = pthread_create(&rx[s].thread, NULL, receiver, &rx[s]) == 0;
        if (!rx[s].started) { /* a reset, or the sender would block on a full socket */
            close(rx[s].fd);
            rx[s].fd = -1;
        }
        tx[s].started = pthread_create(&tx[s].thread, NULL, sender, &tx[s]) == 0;
        if (!tx[s].started)
            shutdown(tx[s].fd, SHUT_WR); /* the receiver sees the end */
    }
    uint64_t bytes = 0;
    for (unsigned s = 0; s < ok; s++) {
        if (tx[s].started)
            pthread_join(tx[s].thread, NULL);
        if (rx[s].started)
            pthread_join(rx[s].thread, NULL);
        failed |= !tx[s].started || !rx[s].started || tx[s].failed || rx[s].failed;
        bytes += rx[s].bytes;
        close(tx[s].fd);
        if (rx[s].fd >= 0)
            close(rx[s].fd);
    }
    double t = kvp_bench_now() - t0;
    close(lfd);
    free(tx);
    free(rx);
    return failed ? 0 : (double)bytes / t / 1e9;
}

/* iperf3 -P streams over loopback, when installed: GB/s received, or 0. */
static double measure_iperf3(unsigned streams, double duration)
{
    if (system("command -v iperf3 >/dev/null 2>&1") != 0)
        return 0;
    int port = 20000 + (int)(getpid() % 20000);
    pid_t srv = fork();
    if (srv == 0) {
        char p[16];
        snprintf(p, sizeof(p), "%d", port);
        int devnull = open("/dev/null", 1);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execlp("iperf3", "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", p, (char *)NULL);
        _exit(127);
    }
    usleep(300000);
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "iperf3 -c 127.0.0.1 -p %d -P %u -t %d -f g 2>/dev/null | "
             "awk '/receiver/ {v=$(NF-2); u=$(NF-1)} END {print v, u}'",
             port, streams, (int)(duration < 1 ? 1 : duration));
    FILE *f = popen(cmd, "r");
    double v = 0;
    char unit[32] = "";
    if (f != NULL) {
        if (fscanf(f, "%lf %31s", &v, unit) != 2)
            v = 0;
        pclose(f);
    }
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    /* Gbits/sec -> GB/s */
    if (strncmp(unit, "Gbits", 5) == 0)
        return v / 8;
    if (strncmp(unit, "Mbits", 5) == 0)
        return v / 8000;
    return 0;
}

int kvp_bench_limits_ensure(const kvp_bench_opts_t *o, uint64_t size, unsigned streams)
{
    double d = o->duration_s < 1 ? o->duration_s : 1;
    int rc = 0;
    if (kvp_bench_limit_memcpy_gbps(size) == 0) {
        kvp_bench_progress(o, "limits: memcpy %llu B", (unsigned long long)size);
        kvp_bench_limit_set_memcpy(size, measure_memcpy(size, d));
        if (kvp_bench_limit_memcpy_gbps(size) == 0) {
            kvp_bench_progress_done(o);
            fprintf(stderr, "kvpool-bench: limits: memcpy of %llu-byte objects failed\n",
                    (unsigned long long)size);
            rc = -1;
        }
    }
    if (kvp_bench_limit_tcp_gbps(size, streams) == 0) {
        kvp_bench_progress(o, "limits: tcp %u streams %llu B", streams, (unsigned long long)size);
        kvp_bench_limit_set_tcp(size, streams, measure_tcp(size, streams, d));
        if (kvp_bench_limit_tcp_gbps(size, streams) == 0) {
            kvp_bench_progress_done(o);
            fprintf(stderr, "kvpool-bench: limits: loopback tcp pump (%u streams, %llu B) failed\n",
                    streams, (unsigned long long)size);
            rc = -1;
        }
    }
    kvp_bench_progress_done(o);
    return rc;
}

int kvp_bench_limits(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    printf("== limits: this machine's ceilings ==\n");
    printf("%-10s %-8s %8s %12s\n", "limit", "streams", "size", "GB/s");
    int rc = 0;
    for (size_t i = 0; i < o->n_sizes; i++) {
        uint64_t size = o->sizes[i];
        if (kvp_bench_limits_ensure(o, size, 2) != 0 || kvp_bench_limits_ensure(o, size, 1) != 0)
            rc = 1;
        double m = kvp_bench_limit_memcpy_gbps(size);
        printf("%-10s %-8s %8llu %12.2f\n", "memcpy", "-", (unsigned long long)size, m);
        kvp_bench_result_begin(out, "limits");
        kvp_bench_result_str(out, "limit", "memcpy");
        kvp_bench_result_int(out, "size", (int64_t)size);
        kvp_bench_result_int(out, "streams", 0);
        kvp_bench_result_num(out, "gbps", m);
        kvp_bench_result_end(out);
        for (unsigned s = 1; s <= 2; s++) {
            double t = kvp_bench_limit_tcp_gbps(size, s);
            printf("%-10s %-8u %8llu %12.2f\n", "tcp-pump", s, (unsigned long long)size, t);
            kvp_bench_result_begin(out, "limits");
            kvp_bench_result_str(out, "limit", "tcp");
            kvp_bench_result_int(out, "size", (int64_t)size);
            kvp_bench_result_int(out, "streams", s);
            kvp_bench_result_num(out, "gbps", t);
            kvp_bench_result_end(out);
        }
    }
    for (unsigned s = 1; s <= 2; s++) {
        double ip = measure_iperf3(s, o->duration_s);
        if (ip > 0) {
            printf("%-10s %-8u %8s %12.2f\n", "iperf3", s, "-", ip);
            kvp_bench_result_begin(out, "limits");
            kvp_bench_result_str(out, "limit", "iperf3");
            kvp_bench_result_int(out, "streams", s);
            kvp_bench_result_num(out, "gbps", ip);
            kvp_bench_result_end(out);
        } else if (s == 1) {
            printf("(iperf3 not installed: apt-get install iperf3 to add its figure)\n");
        }
    }
    return rc;
}
