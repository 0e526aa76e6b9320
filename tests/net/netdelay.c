/*
 * netdelay.c - the net test bed's latency, jitter and socket pump (issue 27; tests/net).
 *
 * This machine kind's kernel has no netem, so the bed adds latency in user space: a host's
 * outgoing TCP to the bed's subnet is redirected (an nftables `redirect` in its nat output
 * chain, netbed.py) to this proxy in the same host, which learns the original destination
 * (SO_ORIGINAL_DST), connects to it with a socket mark the redirect rule lets through, and
 * forwards each direction with every chunk (what one read() returned) held until `delay`
 * after it was read, plus, with JITTER_US, a uniformly random extra hold in [0, JITTER_US]
 * drawn per chunk. A TCP stream stays in order: a chunk is released no earlier than the
 * chunk before it in its direction (its due time is raised to the previous one's), so a
 * chunk that drew a short hold behind one that drew a long one waits for it; what jitter
 * changes is when bytes arrive, never their order. Reordering is not something a stream
 * proxy can do (the kernels at both ends put TCP's bytes back in order before any program
 * sees them): packet-level reordering is tests/net/netqueue.c's (NFQUEUE).
 * Both directions are delayed: the round trip grows by 2 x delay, plus up to 2 x jitter.
 * Reads go into a ring of chunks per direction (a stalled writer stops the reader: TCP's
 * own flow control); a writer sleeps to each chunk's due time (timer slack 1 ns). A copy
 * through user space costs time and bandwidth of its own, so the bed's pump goes through
 * it too: compare against that, not the bare link.
 *
 *   netdelay proxy PORT DELAY_US MARK [JITTER_US]
 *                                       listen on 127.0.0.1:PORT (0: any; the port is
 *                                       printed as the first line), forward with DELAY_US
 *                                       (+ 0..JITTER_US per chunk, default 0)
 *   netdelay sink PORT                  accept and discard (the pump's far end); prints
 *                                       the port
 *   netdelay pump HOST PORT STREAMS SECONDS   send for SECONDS on STREAMS connections;
 *                                       prints {"gbps": ...}
 *
 * Threads: proxy: an accept loop; per connection a reader and a writer per direction.
 * Test tool: runs as root inside a bed host, until killed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (64u << 10)
#define RING 128u /* chunks in flight per direction: 8 MiB, ~2.7 ms at 3 GB/s */

typedef struct chunk {
    uint64_t due_ns;
    uint32_t len;
    char buf[CHUNK];
} chunk_t;

typedef struct conn conn_t;

typedef struct dir {
    int src, dst;
    chunk_t *ring;
    uint32_t head, count; /* guarded by lock */
    bool eof, broken;
    uint64_t last_due_ns; /* the due time of the chunk read before (reader only) */
    uint64_t rng;         /* xorshift64 state for this direction's jitter (reader only) */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    conn_t *conn;
} dir_t;

struct conn {
    dir_t d[2];
    atomic_int live; /* threads still running; the last one frees */
    uint64_t delay_ns, jitter_ns;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A uniform draw in [0, max] (xorshift64; max + 1 is far below 2^64, so the modulo's bias
 * is negligible for a test bed). */
static uint64_t draw(uint64_t *state, uint64_t max)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return max == 0 ? 0 : x % (max + 1);
}

static void conn_put(conn_t *c)
{
    if (atomic_fetch_sub(&c->live, 1) != 1)
        return;
    close(c->d[0].src);
    close(c->d[0].dst);
    for (int i = 0; i < 2; i++) {
        free(c->d[i].ring);
        pthread_mutex_destroy(&c->d[i].lock);
        pthread_cond_destroy(&c->d[i].cond);
    }
    free(c);
}

static void *reader(void *arg)
{
    dir_t *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->lock);
        while (d->count == RING && !d->broken)
            pthread_cond_wait(&d->cond, &d->lock);
        bool stop = d->broken;
        chunk_t *ch = &d->ring[(d->head + d->count) % RING];
        pthread_mutex_unlock(&d->lock);
        if (stop)
            break;
        ssize_t n = read(d->src, ch->buf, CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        pthread_mutex_lock(&d->lock);
        if (n <= 0) {
            d->eof = true;
            pthread_cond_broadcast(&d->cond);
            pthread_mutex_unlock(&d->lock);
            break;
        }
        ch->len = (uint32_t)n;
        uint64_t due = now_ns() + d->conn->delay_ns + draw(&d->rng, d->conn->jitter_ns);
        if (due < d->last_due_ns) /* in order: never before the chunk ahead of it */
            due = d->last_due_ns;
        ch->due_ns = d->last_due_ns = due;
        d->count++;
        pthread_cond_broadcast(&d->cond);
        pthread_mutex_unlock(&d->lock);
    }
    conn_put(d->conn);
    return NULL;
}

static void *writer(void *arg)
{
    dir_t *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->lock);
        while (d->count == 0 && !d->eof)
            pthread_cond_wait(&d->cond, &d->lock);
        if (d->count == 0) { /* the source ended and all of it is out */
            pthread_mutex_unlock(&d->lock);
            shutdown(d->dst, SHUT_WR);
            break;
        }
        chunk_t *ch = &d->ring[d->head];
        pthread_mutex_unlock(&d->lock);
        struct timespec due = {.tv_sec = (time_t)(ch->due_ns / 1000000000u),
                               .tv_nsec = (long)(ch->due_ns % 1000000000u)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, NULL) == EINTR)
            ;
        bool ok = true;
        for (uint32_t off = 0; off < ch->len && ok;) {
            ssize_t n = write(d->dst, ch->buf + off, ch->len - off);
            if (n < 0 && errno == EINTR)
                continue;
            ok = n > 0;
            off += n > 0 ? (uint32_t)n : 0;
        }
        pthread_mutex_lock(&d->lock);
        d->head = (d->head + 1) % RING;
        d->count--;
        if (!ok)
            d->broken = true;
        pthread_cond_broadcast(&d->cond);
        pthread_mutex_unlock(&d->lock);
        if (!ok) { /* the far end is gone: end both sides of this direction */
            shutdown(d->src, SHUT_RDWR);
            shutdown(d->dst, SHUT_RDWR);
            break;
        }
    }
    conn_put(d->conn);
    return NULL;
}

static int listen_on(const char *host, int port, int *bound)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 512) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("netdelay: listen");
        exit(1);
    }
    *bound = ntohs(a.sin_port);
    return fd;
}

static void start_dir(conn_t *c, int i, int src, int dst)
{
    dir_t *d = &c->d[i];
    *d = (dir_t){.src = src, .dst = dst, .conn = c, .ring = malloc(RING * sizeof(chunk_t))};
    /* a seed per direction: the time, the connection's address and the direction, mixed
     * (splitmix64's finalizer); never 0, xorshift's fixed point */
    uint64_t z = now_ns() ^ ((uint64_t)(uintptr_t)c << 1) ^ (uint64_t)i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    d->rng = z != 0 ? z : 1;
    if (d->ring == NULL) {
        perror("netdelay: malloc");
        exit(1);
    }
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->cond, NULL);
}

static _Noreturn void proxy(int port, uint64_t delay_us, int mark, uint64_t jitter_us)
{
    int bound, lfd = listen_on("127.0.0.1", port, &bound);
    printf("%d\n", bound);
    fflush(stdout);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64u << 10);
    for (;;) {
        int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (cfd < 0)
            continue;
        struct sockaddr_in orig;
        socklen_t len = sizeof(orig);
        int ufd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        if (getsockopt(cfd, SOL_IP, SO_ORIGINAL_DST, &orig, &len) != 0 || ufd < 0 ||
            setsockopt(ufd, SOL_SOCKET, SO_MARK, &mark, sizeof(mark)) != 0 ||
            connect(ufd, (struct sockaddr *)&orig, sizeof(orig)) != 0) {
            close(cfd);
            if (ufd >= 0)
                close(ufd);
            continue;
        }
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(ufd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conn_t *c = calloc(1, sizeof(*c));
        if (c == NULL)
            exit(1);
        c->delay_ns = delay_us * 1000u;
        c->jitter_ns = jitter_us * 1000u;
        atomic_init(&c->live, 4);
        start_dir(c, 0, cfd, ufd);
        start_dir(c, 1, ufd, cfd);
        pthread_t t;
        for (int i = 0; i < 2; i++)
            if (pthread_create(&t, &attr, reader, &c->d[i]) != 0 ||
                pthread_create(&t, &attr, writer, &c->d[i]) != 0) {
                perror("netdelay: thread");
                exit(1);
            }
    }
}

static void *sink_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    static char buf[1u << 20];
    while (read(fd, buf, sizeof(buf)) > 0)
        ;
    close(fd);
    return NULL;
}

static _Noreturn void sink(int port)
{
    int bound, lfd = listen_on("0.0.0.0", port, &bound);
    printf("%d\n", bound);
    fflush(stdout);
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        pthread_t t;
        if (fd >= 0 && pthread_create(&t, NULL, sink_conn, (void *)(intptr_t)fd) == 0)
            pthread_detach(t);
    }
}

typedef struct pump {
    int fd;
    uint64_t end_ns, bytes;
} pump_t;

static void *pump_one(void *arg)
{
    pump_t *p = arg;
    static char buf[1u << 20];
    while (now_ns() < p->end_ns) {
        ssize_t n = write(p->fd, buf, sizeof(buf));
        if (n <= 0)
            break;
        p->bytes += (uint64_t)n;
    }
    return NULL;
}

static int pump(const char *host, int port, int streams, double seconds)
{
    pump_t p[64];
    pthread_t t[64];
    if (streams < 1 || streams > 64)
        return 2;
    uint64_t t0 = now_ns(), end = t0 + (uint64_t)(seconds * 1e9);
    for (int i = 0; i < streams; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, host, &a.sin_addr);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
            perror("netdelay: pump connect");
            return 1;
        }
        p[i] = (pump_t){.fd = fd, .end_ns = end};
        pthread_create(&t[i], NULL, pump_one, &p[i]);
    }
    uint64_t bytes = 0;
    for (int i = 0; i < streams; i++) {
        pthread_join(t[i], NULL);
        bytes += p[i].bytes;
        close(p[i].fd);
    }
    printf("{\"streams\": %d, \"gbps\": %.4f}\n", streams,
           (double)bytes / ((double)(now_ns() - t0) / 1e9) / 1e9);
    return 0;
}

int main(int argc, char **argv)
{
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "proxy") == 0)
        proxy(atoi(argv[2]), strtoull(argv[3], NULL, 10), atoi(argv[4]),
              argc == 6 ? strtoull(argv[5], NULL, 10) : 0);
    if (argc == 3 && strcmp(argv[1], "sink") == 0)
        sink(atoi(argv[2]));
    if (argc == 6 && strcmp(argv[1], "pump") == 0)
        return pump(argv[2], atoi(argv[3]), atoi(argv[4]), atof(argv[5]));
    fprintf(stderr, "usage: netdelay proxy PORT DELAY_US MARK [JITTER_US] | sink PORT | "
                    "pump HOST PORT STREAMS SECONDS\n");
    return 2;
}
