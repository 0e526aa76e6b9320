/*
 * netqueue - packet-level delay, jitter, reordering and loss for the network test bed
 * (tests/net, issue 27), where the kernel has no netem qdisc but has NFQUEUE: the bed's
 * host sends the packets of a link to queue QNUM (iptables-legacy -t mangle ... -j NFQUEUE;
 * nftables' own `queue` is not built into this kernel), and this program, in the same
 * network namespace, holds each packet and lets it go (NF_ACCEPT) when it is due:
 *
 *   netqueue QNUM DELAY_US [JITTER_US [REORDER_PCT [LOSS_PCT [SEED]]]]
 *
 * - every packet is held DELAY_US plus a uniform draw in [0, JITTER_US]; packets go out in
 *   the order they fall due, so a jitter wider than the gap between two packets reorders
 *   them (as netem's jitter does);
 * - REORDER_PCT % of the packets are held a further max(DELAY_US, 1 ms), so that the ones
 *   queued after them overtake them;
 * - LOSS_PCT % are dropped (NF_DROP).
 * Packets are taken as metadata only (no payload is copied). If the queue fills, the
 * kernel lets packets through unqueued (fail-open) rather than dropping them. It prints
 * "ready" once bound, and on SIGTERM/SIGINT releases every held packet, prints what it
 * did ("queued N released N dropped N reordered N") and exits 0.
 *
 * Who may use it: its only socket is the netfilter queue's netlink socket in the network
 * namespace it runs in, which the kernel lets only CAP_NET_ADMIN there bind (root, in a
 * namespace the bed made); it listens on no address, so nothing on a network reaches it.
 * A test tool, not a kvpool endpoint: no credential or /metrics count applies.
 *
 * Thread: one. Root only (CAP_NET_ADMIN in the namespace).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libnetfilter_queue/libnetfilter_queue.h>

#define HELD_MAX 65536

typedef struct held {
    uint64_t due_ns;
    uint64_t seq; /* arrival order: ties go out in it */
    uint32_t id;
} held_t;

static held_t heap[HELD_MAX];
static size_t n_held;
static uint64_t delay_ns, jitter_ns, extra_ns, seq;
static unsigned reorder_pct, loss_pct;
static uint64_t rng;
static uint64_t n_queued, n_released, n_dropped, n_reordered;
static volatile sig_atomic_t stop;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t next_rand(void) /* splitmix64 */
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static bool before(const held_t *a, const held_t *b)
{
    return a->due_ns < b->due_ns || (a->due_ns == b->due_ns && a->seq < b->seq);
}

static void heap_push(held_t h)
{
    size_t i = n_held++;
    heap[i] = h;
    while (i > 0 && before(&heap[i], &heap[(i - 1) / 2])) {
        held_t t = heap[i];
        heap[i] = heap[(i - 1) / 2];
        heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static held_t heap_pop(void)
{
    held_t top = heap[0];
    heap[0] = heap[--n_held];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n_held && before(&heap[l], &heap[m]))
            m = l;
        if (r < n_held && before(&heap[r], &heap[m]))
            m = r;
        if (m == i)
            break;
        held_t t = heap[i];
        heap[i] = heap[m];
        heap[m] = t;
        i = m;
    }
    return top;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *arg)
{
    (void)msg;
    (void)arg;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (ph == NULL)
        return 0;
    uint32_t id = ntohl(ph->packet_id);
    n_queued++;
    if (loss_pct > 0 && next_rand() % 100 < loss_pct) {
        n_dropped++;
        return nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
    }
    if (n_held == HELD_MAX) { /* cannot hold it: let it go now */
        n_released++;
        return nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL);
    }
    uint64_t due = now_ns() + delay_ns + (jitter_ns ? next_rand() % (jitter_ns + 1) : 0);
    if (reorder_pct > 0 && next_rand() % 100 < reorder_pct) {
        due += extra_ns;
        n_reordered++;
    }
    heap_push((held_t){.due_ns = due, .seq = seq++, .id = id});
    return 0;
}

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 7) {
        fprintf(stderr, "usage: netqueue QNUM DELAY_US [JITTER_US [REORDER_PCT [LOSS_PCT "
                        "[SEED]]]]\n");
        return 2;
    }
    unsigned qnum = (unsigned)strtoul(argv[1], NULL, 10);
    delay_ns = strtoull(argv[2], NULL, 10) * 1000;
    jitter_ns = argc > 3 ? strtoull(argv[3], NULL, 10) * 1000 : 0;
    reorder_pct = argc > 4 ? (unsigned)strtoul(argv[4], NULL, 10) : 0;
    loss_pct = argc > 5 ? (unsigned)strtoul(argv[5], NULL, 10) : 0;
    rng = argc > 6 ? strtoull(argv[6], NULL, 10) : (uint64_t)getpid();
    extra_ns = delay_ns > 1000000 ? delay_ns : 1000000;
    if (reorder_pct > 100 || loss_pct > 100) {
        fprintf(stderr, "netqueue: percentages are 0..100\n");
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    struct nfq_handle *h = nfq_open();
    if (h == NULL) {
        perror("netqueue: nfq_open");
        return 1;
    }
    struct nfq_q_handle *qh = nfq_create_queue(h, (uint16_t)qnum, on_packet, NULL);
    if (qh == NULL) {
        perror("netqueue: nfq_create_queue");
        return 1;
    }
    if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) {
        perror("netqueue: nfq_set_mode");
        return 1;
    }
    nfq_set_queue_maxlen(qh, HELD_MAX);
    nfq_set_queue_flags(qh, NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_FAIL_OPEN);
    int fd = nfq_fd(h);
    int rcvbuf = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
    printf("ready\n");
    fflush(stdout);

    char buf[65536] __attribute__((aligned));
    while (!stop) {
        struct timespec ts, *tsp = NULL;
        if (n_held > 0) {
            uint64_t now = now_ns(), wait = heap[0].due_ns > now ? heap[0].due_ns - now : 0;
            ts = (struct timespec){(time_t)(wait / 1000000000u), (long)(wait % 1000000000u)};
            tsp = &ts;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int rc = ppoll(&p, 1, tsp, NULL);
        if (rc < 0 && errno != EINTR) {
            perror("netqueue: poll");
            return 1;
        }
        if (rc > 0) {
            ssize_t n;
            while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
                nfq_handle_packet(h, buf, (int)n);
            if (n < 0 && errno == ENOBUFS)
                fprintf(stderr, "netqueue: the kernel dropped queue messages (ENOBUFS)\n");
        }
        uint64_t now = now_ns();
        while (n_held > 0 && heap[0].due_ns <= now) {
            held_t x = heap_pop();
            nfq_set_verdict(qh, x.id, NF_ACCEPT, 0, NULL);
            n_released++;
        }
    }
    while (n_held > 0) {
        held_t x = heap_pop();
        nfq_set_verdict(qh, x.id, NF_ACCEPT, 0, NULL);
        n_released++;
    }
    printf("queued %llu released %llu dropped %llu reordered %llu\n", (unsigned long long)n_queued,
           (unsigned long long)n_released, (unsigned long long)n_dropped,
           (unsigned long long)n_reordered);
    nfq_destroy_queue(qh);
    nfq_close(h);
    return 0;
}
