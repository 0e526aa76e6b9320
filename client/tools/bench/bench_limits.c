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
 * thread each receiving into a `size` buffer; bandwidth is bytes received / time. The "ws"
 * pump does the same over a batch's working set (each thread cycles through WS_BUFS buffers,
 * fewer for big objects), as memcpy's limit does: a batch of 32 objects moves 32 distinct
 * buffers through the caches, one reused buffer stays in L2 (measured here: the one-buffer
 * pump 1.4-1.8x the working-set one at 1-4 MiB). The "ws-splice" pump (2 streams, objects of
 * SPLICE_MIN or more) is the ws pump with the sender's copy taken away: it hands its pages to
 * the socket by reference (vmsplice into a pipe, splice from it), so only the receiver copies;
 * what a tcp path with a copy fewer on the sending side could reach (docs/benchmarks.md).
 *
 * Disk: the SSD tier's ceiling, with the SSD path's own I/O code (client/ssd/ssd_io.h): a file
 * of --ssd-file-size in --ssd-dir (tmpfs and ramfs refused), opened O_DIRECT and preallocated
 * with fallocate as an SSD segment's file is (not timed), written fully, then read fully twice
 * (the better pass counts), in
 * KVP_SSD_IO_CHUNK (1 MiB) blocks with KVP_SSD_IO_DEPTH in flight (kvp_ssd_io_start/wait in a
 * ring of aligned buffers); the write's time includes the closing fdatasync (the offload path
 * syncs each batch too). The file is removed after. Bandwidth is bytes / time.
 *
 * The figures are kept for the rest of the run (one table per kind, read by the data and ssd
 * modes for pct_of_limit) and measured once: kvp_bench_limits_ensure and
 * kvp_bench_disk_limits_ensure measure only what is not there yet. Thread: the tables are read
 * and written on the main thread; a tcp measurement runs its own sender and receiver threads.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <netinet/in.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/ssd/ssd_io.h"
#include "client/tools/bench/bench.h"
#include "common/sock.h"

#define WORKING_SET 64
#define WS_BUFS 16              /* the ws pump's buffers per thread: a batch of 32 on 2 streams */
#define WS_STREAMS_KEY 1000u    /* the ws pump's entries in the table: streams + this */
#define SPLICE_MIN (256u << 10) /* objects it is measured for: the copy-bound sizes */
#define SPLICE_PIPE (1u << 20)  /* the pipe's capacity asked for (pipe-max-size's default) */

/* ---------------- memcpy and tcp limits measured in this run ---------------- */

typedef struct limit_entry {
    uint64_t size;
    unsigned streams; /* 0: memcpy */
    double gbps;
} limit_entry_t;

/* The rtt limits' request: about a batch of 128 keys' call to the master (an Exist's or a
 * PutStart's request is 2.8-3.4 KB; its answer, RTT_REPLY in bench_common.c, 131 B). */
#define RTT_REQ_BYTES 3072u

static limit_entry_t limits[64];
static size_t n_limits;

static void limit_set(uint64_t size, unsigned streams, double gbps)
{
    for (size_t i = 0; i < n_limits; i++) {
        if (limits[i].size == size && limits[i].streams == streams) {
            limits[i].gbps = gbps;
            return;
        }
    }
    if (n_limits < sizeof(limits) / sizeof(limits[0]))
        limits[n_limits++] = (limit_entry_t){size, streams, gbps};
}

static double limit_get(uint64_t size, unsigned streams)
{
    for (size_t i = 0; i < n_limits; i++)
        if (limits[i].size == size && limits[i].streams == streams)
            return limits[i].gbps;
    return 0;
}

double kvp_bench_limit_memcpy_gbps(uint64_t size)
{
    return limit_get(size, 0);
}

double kvp_bench_limit_tcp_gbps(uint64_t size, unsigned streams)
{
    return limit_get(size, streams ? streams : 1);
}

double kvp_bench_limit_tcp_ws_gbps(uint64_t size, unsigned streams)
{
    return limit_get(size, (streams ? streams : 1) + WS_STREAMS_KEY);
}

/* ---------------- measurements ---------------- */

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
    unsigned nbufs; /* buffers cycled through (1: one, kept in cache) */
    bool splice;    /* the sender's pages go to the socket by reference (vmsplice + splice) */
    char *buf;      /* its nbufs buffers, allocated and touched before the clock starts */
    double deadline;
    uint64_t bytes;
    bool failed;  /* the sender's pipe or a splice failed (the buffers are the caller's) */
    bool started; /* its thread was created */
    pthread_t thread;
} pump_t;

/* A thread's nbufs buffers of size bytes, one allocation, every page touched (false: no
 * memory). Done before the clock starts: a pump over a batch's 128 MiB spent a tenth of a
 * quarter-second slice faulting its pages in, which the engine it is compared with does not
 * (its buffers are resident, as a KV cache is). */
static bool pump_bufs(pump_t *p, int fill)
{
    p->buf = malloc(p->size * p->nbufs);
    if (p->buf != NULL)
        memset(p->buf, fill, p->size * p->nbufs);
    return p->buf != NULL;
}

/* Send len bytes of buf by reference: vmsplice them into the pipe, splice the pipe into the
 * socket, until all are out. false: a call failed. The pages stay the socket's until the
 * receiver has copied them, so buf is not written meanwhile (the pump only reads it). */
static bool splice_all(int fd, const int pipefd[2], char *buf, uint64_t len)
{
    while (len > 0) {
        struct iovec iov = {.iov_base = buf, .iov_len = len};
        ssize_t in = vmsplice(pipefd[1], &iov, 1, 0);
        if (in <= 0) {
            if (in < 0 && errno == EINTR)
                continue;
            return false;
        }
        for (ssize_t left = in; left > 0;) {
            ssize_t out = splice(pipefd[0], NULL, fd, NULL, (size_t)left, SPLICE_F_MORE);
            if (out <= 0) {
                if (out < 0 && errno == EINTR)
                    continue;
                return false;
            }
            left -= out;
        }
        buf += in;
        len -= (uint64_t)in;
    }
    return true;
}

static void *sender(void *arg)
{
    pump_t *p = arg;
    char *buf = p->buf;
    int pipefd[2] = {-1, -1};
    if (p->splice && pipe2(pipefd, O_CLOEXEC) != 0) {
        p->failed = true;
        shutdown(p->fd, SHUT_WR);
        return NULL;
    }
    if (p->splice)
        (void)fcntl(pipefd[1], F_SETPIPE_SZ, SPLICE_PIPE); /* the default 64 KiB otherwise */
    for (unsigned i = 0; kvp_bench_now() < p->deadline; i = (i + 1) % p->nbufs) {
        char *b = buf + (uint64_t)i * p->size;
        if (p->splice ? !splice_all(p->fd, pipefd, b, p->size)
                      : kvp_send_all(p->fd, b, p->size) != KVP_OK) {
            p->failed = p->splice; /* a failed splice is the limit's failure, not an end */
            break;
        }
    }
    shutdown(p->fd, SHUT_WR);
    if (p->splice) {
        close(pipefd[0]);
        close(pipefd[1]);
    }
    return NULL;
}

static void *receiver(void *arg)
{
    pump_t *p = arg;
    for (unsigned i = 0;; i = (i + 1) % p->nbufs) {
        ssize_t n = recv(p->fd, p->buf + (uint64_t)i * p->size, p->size, MSG_WAITALL);
        if (n <= 0)
            break;
        p->bytes += (uint64_t)n;
    }
    return NULL;
}

/* The ws pumps' buffers per thread for objects of size on streams streams: WS_BUFS, fewer
 * for big objects (at most 128 MiB cycled in all). */
static unsigned ws_bufs(uint64_t size, unsigned streams)
{
    unsigned nbufs = WS_BUFS;
    while (nbufs > 2 && (uint64_t)nbufs * size * (streams ? streams : 1) > (128ull << 20))
        nbufs /= 2;
    return nbufs;
}

/* The pump over streams x nbufs buffers of size: the caller's (src, dst: stream s's at
 * s * nbufs * size; the sender reads src's, the receiver writes dst's), or, with src NULL,
 * its own, allocated and touched before the clock starts and freed after. */
static double measure_tcp(uint64_t size, unsigned streams, unsigned nbufs, bool splice,
                          double duration, uint8_t *src, uint8_t *dst)
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
        kvp_sock_data_congestion(cfd); /* as the data connections it stands for */
        kvp_sock_data_congestion(afd);
        tx[s] = (pump_t){
            .fd = cfd, .size = size, .nbufs = nbufs, .splice = splice, .deadline = t0 + duration};
        rx[s] = (pump_t){.fd = afd, .size = size, .nbufs = nbufs};
        if (src != NULL) {
            tx[s].buf = (char *)src + (uint64_t)s * nbufs * size;
            rx[s].buf = (char *)dst + (uint64_t)s * nbufs * size;
        } else if (!pump_bufs(&tx[s], 7) || !pump_bufs(&rx[s], 0)) {
            free(tx[s].buf);
            close(cfd);
            close(afd);
            break;
        }
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
    for (unsigned s = 0; s < ok && src == NULL; s++) {
        free(tx[s].buf);
        free(rx[s].buf);
    }
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

static double disk_read_gbps, disk_write_gbps;

double kvp_bench_limit_disk_gbps(bool write)
{
    return write ? disk_write_gbps : disk_read_gbps;
}

int kvp_bench_ssd_dir_check(const char *dir)
{
    struct statfs sf;
    if (statfs(dir, &sf) != 0) {
        fprintf(stderr, "kvpool-bench: --ssd-dir %s: %s\n", dir, strerror(errno));
        return -1;
    }
    if (sf.f_type == TMPFS_MAGIC || sf.f_type == RAMFS_MAGIC) {
        fprintf(stderr,
                "kvpool-bench: --ssd-dir %s is on %s: memory, no disk behind it, so its figures "
                "would not be a disk's; give --ssd-dir a directory on a disk filesystem (the "
                "build directory, for one)\n",
                dir, sf.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs");
        return -1;
    }
    return 0;
}

/* Move n_chunks 1 MiB blocks of fd from offset 0, `depth` in flight; KVP_OK or the first failure.
 */
static kvp_status_t disk_pass(kvp_ssd_io_t *io, int fd, bool write, void **bufs, unsigned depth,
                              uint64_t n_chunks)
{
    kvp_ssd_iov_t ops[KVP_SSD_IO_DEPTH];
    kvp_status_t first = KVP_OK;
    uint64_t next = 0, waited = 0;
    while (waited < n_chunks) {
        while (next < n_chunks && next - waited < depth && first == KVP_OK) {
            kvp_ssd_iov_t *op = &ops[next % depth];
            *op = (kvp_ssd_iov_t){.buf = bufs[next % depth],
                                  .file_off = next * KVP_SSD_IO_CHUNK,
                                  .len = KVP_SSD_IO_CHUNK};
            kvp_status_t st = kvp_ssd_io_start(io, fd, write, op);
            if (st != KVP_OK) {
                first = st;
                break;
            }
            next++;
        }
        if (waited == next)
            break; /* nothing in flight: a start failed */
        kvp_status_t st = kvp_ssd_io_wait(io, &ops[waited % depth]);
        if (st != KVP_OK && first == KVP_OK)
            first = st;
        waited++;
    }
    return first;
}

int kvp_bench_disk_limits_remeasure(const kvp_bench_opts_t *o)
{
    disk_read_gbps = disk_write_gbps = 0;
    return kvp_bench_disk_limits_ensure(o);
}

int kvp_bench_disk_limits_ensure(const kvp_bench_opts_t *o)
{
    if (disk_read_gbps > 0 && disk_write_gbps > 0)
        return 0;
    const char *dir = o->ssd_dir ? o->ssd_dir : ".";
    if (kvp_bench_ssd_dir_check(dir) != 0)
        return -1;
    uint64_t n_chunks = o->ssd_file_size / KVP_SSD_IO_CHUNK;
    if (n_chunks == 0)
        n_chunks = 1;
    unsigned depth = KVP_SSD_IO_DEPTH;
    char path[4096];
    snprintf(path, sizeof(path), "%s/kvpool-bench-disk-%d.tmp", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "kvpool-bench: limits: disk: cannot create %s with O_DIRECT: %s%s\n", path,
                strerror(errno),
                errno == EINVAL ? " (the filesystem refuses O_DIRECT: choose another --ssd-dir)"
                                : "");
        return -1;
    }
    int rc = -1;
    void *bufs[KVP_SSD_IO_DEPTH] = {0};
    kvp_ssd_io_t *io = NULL;
    uint64_t bytes = n_chunks * KVP_SSD_IO_CHUNK;
    if (fallocate(fd, 0, 0, (off_t)bytes) != 0 && errno != EOPNOTSUPP) {
        fprintf(stderr, "kvpool-bench: limits: disk: fallocate of %llu bytes in %s: %s\n",
                (unsigned long long)bytes, dir, strerror(errno));
        goto out;
    }
    for (unsigned i = 0; i < depth; i++) {
        bufs[i] = kvp_ssd_buf_alloc(KVP_SSD_IO_CHUNK);
        if (bufs[i] == NULL) {
            fprintf(stderr, "kvpool-bench: limits: disk: out of memory\n");
            goto out;
        }
        memset(bufs[i], 0x5a + (int)i, KVP_SSD_IO_CHUNK);
    }
    kvp_status_t st = kvp_ssd_io_create(depth, &io);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench: limits: disk: io_uring: %s\n", kvp_strerror(st));
        goto out;
    }
    kvp_bench_progress(o, "limits: disk write %llu MiB in %s", (unsigned long long)n_chunks, dir);
    double t0 = kvp_bench_now();
    st = disk_pass(io, fd, true, bufs, depth, n_chunks);
    if (st == KVP_OK)
        st = kvp_ssd_io_datasync(io, fd);
    double t1 = kvp_bench_now();
    if (st != KVP_OK) {
        kvp_bench_progress_done(o);
        fprintf(stderr, "kvpool-bench: limits: disk write of %s: %s\n", path, kvp_strerror(st));
        goto out;
    }
    /* two read passes, the better one counts: the ssd mode's get_ssd reads its objects over
     * and over too, so a cache in front of the disk (a VM host's) helps both alike */
    double best_read = 0;
    for (int pass = 0; pass < 2; pass++) {
        kvp_bench_progress(o, "limits: disk read %llu MiB in %s (pass %d)",
                           (unsigned long long)n_chunks, dir, pass + 1);
        double r0 = kvp_bench_now();
        st = disk_pass(io, fd, false, bufs, depth, n_chunks);
        double r1 = kvp_bench_now();
        if (st != KVP_OK) {
            kvp_bench_progress_done(o);
            fprintf(stderr, "kvpool-bench: limits: disk read of %s: %s\n", path, kvp_strerror(st));
            goto out;
        }
        if (r1 - r0 > 0 && (double)bytes / (r1 - r0) / 1e9 > best_read)
            best_read = (double)bytes / (r1 - r0) / 1e9;
    }
    kvp_bench_progress_done(o);
    disk_write_gbps = (double)bytes / (t1 - t0) / 1e9;
    disk_read_gbps = best_read;
    rc = 0;
out:
    kvp_ssd_io_destroy(io);
    for (unsigned i = 0; i < depth; i++)
        free(bufs[i]);
    close(fd);
    unlink(path);
    return rc;
}

int kvp_bench_limits_ensure(const kvp_bench_opts_t *o, uint64_t size, unsigned streams)
{
    double d = o->duration_s < 1 ? o->duration_s : 1;
    int rc = 0;
    if (kvp_bench_limit_memcpy_gbps(size) == 0) {
        kvp_bench_progress(o, "limits: memcpy %llu B", (unsigned long long)size);
        limit_set(size, 0, measure_memcpy(size, d));
        if (kvp_bench_limit_memcpy_gbps(size) == 0) {
            kvp_bench_progress_done(o);
            fprintf(stderr, "kvpool-bench: limits: memcpy of %llu-byte objects failed\n",
                    (unsigned long long)size);
            rc = -1;
        }
    }
    if (kvp_bench_limit_tcp_gbps(size, streams) == 0) {
        kvp_bench_progress(o, "limits: tcp %u streams %llu B", streams, (unsigned long long)size);
        limit_set(size, streams ? streams : 1, measure_tcp(size, streams, 1, false, d, NULL, NULL));
        if (kvp_bench_limit_tcp_gbps(size, streams) == 0) {
            kvp_bench_progress_done(o);
            fprintf(stderr, "kvpool-bench: limits: loopback tcp pump (%u streams, %llu B) failed\n",
                    streams, (unsigned long long)size);
            rc = -1;
        }
    }
    if (kvp_bench_limit_tcp_ws_gbps(size, streams) == 0) {
        unsigned nbufs = ws_bufs(size, streams);
        kvp_bench_progress(o, "limits: tcp %u streams %llu B over %u buffers", streams,
                           (unsigned long long)size, nbufs);
        limit_set(size, (streams ? streams : 1) + WS_STREAMS_KEY,
                  measure_tcp(size, streams, nbufs, false, d, NULL, NULL));
        if (kvp_bench_limit_tcp_ws_gbps(size, streams) == 0) {
            kvp_bench_progress_done(o);
            fprintf(stderr,
                    "kvpool-bench: limits: loopback tcp pump over a working set (%u "
                    "streams, %llu B) failed\n",
                    streams, (unsigned long long)size);
            rc = -1;
        }
    }
    kvp_bench_progress_done(o);
    return rc;
}

double kvp_bench_measure_tcp_pump_gbps(uint64_t size, unsigned streams, unsigned nbufs,
                                       double duration, uint8_t *src, uint8_t *dst)
{
    return measure_tcp(size, streams ? streams : 1, nbufs ? nbufs : 1, false, duration,
                       dst != NULL ? src : NULL, src != NULL ? dst : NULL);
}

/* One tcp limit: a line of the table and a result. */
static void limit_print(kvp_bench_out_t *out, const char *label, const char *name, uint64_t size,
                        unsigned streams, double gbps)
{
    printf("%-11s %-7u %8llu %12.2f\n", label, streams, (unsigned long long)size, gbps);
    kvp_bench_result_begin(out, "limits");
    kvp_bench_result_str(out, "limit", name);
    kvp_bench_result_int(out, "size", (int64_t)size);
    kvp_bench_result_int(out, "streams", streams);
    kvp_bench_result_num(out, "gbps", gbps);
    kvp_bench_result_end(out);
}

int kvp_bench_limits(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    printf("== limits: this machine's ceilings ==\n");
    printf("%-11s %-7s %8s %12s\n", "limit", "streams", "size", "GB/s");
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
            limit_print(out, "tcp-pump", "tcp", size, s, kvp_bench_limit_tcp_gbps(size, s));
            limit_print(out, "tcp-pump-ws", "tcp-ws", size, s,
                        kvp_bench_limit_tcp_ws_gbps(size, s));
        }
        if (size >= SPLICE_MIN) { /* the ws pump, 2 streams, with no copy on the sending side */
            unsigned nbufs = ws_bufs(size, 2);
            kvp_bench_progress(o, "limits: tcp 2 streams %llu B over %u buffers, spliced",
                               (unsigned long long)size, nbufs);
            double g = measure_tcp(size, 2, nbufs, true, o->duration_s < 1 ? o->duration_s : 1,
                                   NULL, NULL);
            kvp_bench_progress_done(o);
            if (g == 0) {
                fprintf(stderr,
                        "kvpool-bench: limits: loopback tcp pump with vmsplice + splice (2 "
                        "streams, %llu B) failed\n",
                        (unsigned long long)size);
                rc = 1;
            }
            limit_print(out, "tcp-splice", "tcp-ws-splice", size, 2, g);
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
    /* the control plane's floor: a call's round trip, plain and (--tls-dir) with TLS 1.3 */
    for (int tls = 0; tls <= (kvp_bench_tls_on() ? 1 : 0); tls++) {
        double us, cpu_us;
        if (kvp_bench_rtt(RTT_REQ_BYTES, o->duration_s, tls, &us, &cpu_us) != 0) {
            rc = 1;
            continue;
        }
        printf("%-10s %-8s %8u %12s  (%.1f us a round trip, %.1f us of CPU at both ends)\n",
               tls ? "rtt-tls" : "rtt", "1", RTT_REQ_BYTES, "-", us, cpu_us);
        kvp_bench_result_begin(out, "limits");
        kvp_bench_result_str(out, "limit", tls ? "rtt-tls" : "rtt");
        kvp_bench_result_int(out, "size", RTT_REQ_BYTES);
        kvp_bench_result_int(out, "streams", 1);
        kvp_bench_result_num(out, "rtt_us", us);
        kvp_bench_result_num(out, "cpu_us", cpu_us);
        kvp_bench_result_end(out);
    }
    double mem_us;
    if (kvp_bench_tls_on() && kvp_bench_rtt_tls_mem(RTT_REQ_BYTES, o->duration_s, &mem_us) == 0) {
        printf("%-10s %-8s %8u %12s  (%.1f us a round trip: TLS's own work, no socket)\n",
               "rtt-tls-mem", "1", RTT_REQ_BYTES, "-", mem_us);
        kvp_bench_result_begin(out, "limits");
        kvp_bench_result_str(out, "limit", "rtt-tls-mem");
        kvp_bench_result_int(out, "size", RTT_REQ_BYTES);
        kvp_bench_result_int(out, "streams", 1);
        kvp_bench_result_num(out, "rtt_us", mem_us);
        kvp_bench_result_num(out, "cpu_us", mem_us); /* one thread, never waits */
        kvp_bench_result_end(out);
    } else if (kvp_bench_tls_on()) {
        rc = 1;
    }
    if (!kvp_bench_tls_on())
        printf("(rtt-tls, rtt-tls-mem: with --tls-dir DIR, the same round trip through TLS "
               "1.3, and its TLS work alone)\n");
    /* the SSD tier's ceiling: this directory's disk through the SSD path's I/O code */
    if (kvp_bench_disk_limits_ensure(o) != 0) {
        rc = 1;
    } else {
        for (int w = 1; w >= 0; w--) {
            double g = kvp_bench_limit_disk_gbps(w);
            printf("%-10s %-8s %8u %12.2f  (io_uring O_DIRECT, depth %u, %llu MiB file in %s)\n",
                   w ? "disk_write" : "disk_read", "-", KVP_SSD_IO_CHUNK, g, KVP_SSD_IO_DEPTH,
                   (unsigned long long)(o->ssd_file_size >> 20), o->ssd_dir);
            kvp_bench_result_begin(out, "limits");
            kvp_bench_result_str(out, "limit", w ? "disk_write" : "disk_read");
            kvp_bench_result_int(out, "size", KVP_SSD_IO_CHUNK);
            kvp_bench_result_int(out, "depth", KVP_SSD_IO_DEPTH);
            kvp_bench_result_int(out, "file_bytes", (int64_t)o->ssd_file_size);
            kvp_bench_result_str(out, "dir", o->ssd_dir);
            kvp_bench_result_num(out, "gbps", g);
            kvp_bench_result_end(out);
        }
    }
    return rc;
}
