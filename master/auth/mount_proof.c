/*
 * mount_proof.c - the master's prover of mounts (mount_proof.h).
 *
 * Design: a fixed set of worker threads takes jobs from a queue of at most queue_max (the
 * loop never waits: a full queue refuses the job), oldest first, but never more than
 * per_tag at once for one principal: one principal's black holes hold that many workers
 * for the timeout, the others go on proving everyone else's. Each worker resolves the endpoint
 * (getaddrinfo: an address as written, a host name as the system resolves it), connects
 * to each address in turn on a non-blocking socket, sends a PROVE (common/grant.h) with a
 * nonce drawn for this probe and waits for the answer, all within one deadline (poll);
 * then checks the proof against the secret with a constant-time compare, wipes the
 * secret, queues the result (in the job's own node) and wakes the loop through the eventfd.
 *
 * Thread: the loop (submit, take, fd, busy) and the workers; the queue, the results and
 * what each worker runs are guarded by `lock`.
 */
#include "master/auth/mount_proof.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <openssl/crypto.h>

#include "common/clock.h"
#include "common/log.h"

#define MAX_THREADS 64

/* A job, then its result (the same node: a result never needs memory of its own). */
typedef struct node {
    struct node *next;
    kvp_proof_job_t job;
    kvp_proof_result_t r;
} node_t;

struct kvp_prover {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;
    node_t *queue, **queue_tail; /* waiting, oldest first */
    unsigned n, cap;
    node_t *done, **done_tail; /* results, for the loop */
    int efd;
    uint32_t timeout_ms;
    unsigned per_tag; /* probes of one principal run at once at most */
    _Atomic unsigned busy;
    unsigned n_threads;
    pthread_t threads[MAX_THREADS];
    uint64_t running[MAX_THREADS]; /* the tag each worker's probe is for (0: none) */
};

/* The 32-byte data request header (transport/wire.h's kvp_data_req_t, little-endian). */
static void pack_header(uint8_t h[32], uint64_t length)
{
    uint32_t magic = KVP_PROVE_MAGIC;
    uint16_t op = KVP_PROVE_OP, flags = 0;
    uint64_t zero = 0;
    memcpy(h, &magic, 4);
    memcpy(h + 4, &op, 2);
    memcpy(h + 6, &flags, 2);
    memcpy(h + 8, &zero, 8);
    memcpy(h + 16, &zero, 8);
    memcpy(h + 24, &length, 8);
}

/* Wait for ev on fd until deadline_ms. true: ready. */
static bool wait_fd(int fd, short ev, uint64_t deadline_ms)
{
    for (;;) {
        uint64_t now = kvp_now_ms();
        if (now >= deadline_ms)
            return false;
        struct pollfd p = {.fd = fd, .events = ev};
        int n = poll(&p, 1, (int)(deadline_ms - now));
        if (n > 0)
            return true;
        if (n < 0 && errno != EINTR)
            return false;
    }
}

/* Exchange buf out, len in on a connected non-blocking fd before deadline_ms. 0: done;
 * 1: timed out; -1: closed or failed. */
static int exchange(int fd, const uint8_t *out, size_t out_len, uint8_t *in, size_t in_len,
                    uint64_t deadline_ms)
{
    size_t off = 0;
    while (off < out_len) {
        ssize_t n = send(fd, out + off, out_len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (!wait_fd(fd, POLLOUT, deadline_ms))
                return 1;
        } else {
            return -1;
        }
    }
    off = 0;
    while (off < in_len) {
        ssize_t n = recv(fd, in + off, in_len - off, 0);
        if (n > 0) {
            off += (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (!wait_fd(fd, POLLIN, deadline_ms))
                return 1;
        } else {
            return -1;
        }
    }
    return 0;
}

/* Connect to ai before deadline_ms: the fd, or -1 (why in r). */
static int connect_one(const struct addrinfo *ai, uint64_t deadline_ms, kvp_proof_result_t *r,
                       const char *where)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        snprintf(r->why, sizeof(r->why), "cannot open a socket: %s", strerror(errno));
        return -1;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
        return fd;
    if (errno != EINPROGRESS) {
        snprintf(r->why, sizeof(r->why), "cannot connect to %s: %s", where, strerror(errno));
        close(fd);
        return -1;
    }
    int err = 0;
    socklen_t el = sizeof(err);
    if (!wait_fd(fd, POLLOUT, deadline_ms)) {
        snprintf(r->why, sizeof(r->why), "no connection to %s within the proof's timeout", where);
        close(fd);
        return -1;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
        snprintf(r->why, sizeof(r->why), "cannot connect to %s: %s", where,
                 strerror(err ? err : errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* One probe of an address: true when proven; otherwise why in r. */
static bool prove_at(const kvp_proof_job_t *job, const struct addrinfo *ai, uint64_t deadline_ms,
                     kvp_proof_result_t *r, const char *where)
{
    int fd = connect_one(ai, deadline_ms, r, where);
    if (fd < 0)
        return false;
    size_t name_len = strlen(job->name);
    uint8_t req[32 + KVP_PROVE_NONCE_LEN + KVP_PROVE_NAME_MAX];
    pack_header(req, KVP_PROVE_NONCE_LEN + name_len);
    uint8_t *nonce = req + 32;
    bool ok = false;
    if (!kvp_grant_random(nonce, KVP_PROVE_NONCE_LEN)) {
        snprintf(r->why, sizeof(r->why), "cannot draw a nonce");
        close(fd);
        return false;
    }
    memcpy(req + 32 + KVP_PROVE_NONCE_LEN, job->name, name_len);
    uint8_t ans[16 + KVP_PROVE_LEN] = {0};
    int x = exchange(fd, req, 32 + KVP_PROVE_NONCE_LEN + name_len, ans, 16, deadline_ms);
    uint32_t magic;
    int32_t status;
    uint64_t length;
    memcpy(&magic, ans, 4);
    memcpy(&status, ans + 4, 4);
    memcpy(&length, ans + 8, 8);
    if (x == 1)
        snprintf(r->why, sizeof(r->why), "no answer from %s within the proof's timeout", where);
    else if (x < 0)
        snprintf(r->why, sizeof(r->why),
                 "%s closed the connection without an answer (not a kvpool data server, or one "
                 "older than mount proofs)",
                 where);
    else if (magic != KVP_PROVE_MAGIC)
        snprintf(r->why, sizeof(r->why), "%s is not a kvpool data server", where);
    else if (status != 0 || length != KVP_PROVE_LEN)
        snprintf(r->why, sizeof(r->why), "the server at %s does not serve segment %.64s", where,
                 job->name);
    else if ((x = exchange(fd, NULL, 0, ans + 16, KVP_PROVE_LEN, deadline_ms)) != 0)
        snprintf(r->why, sizeof(r->why), "%s did not send its proof", where);
    else {
        uint8_t want[KVP_PROVE_LEN];
        ok = kvp_grant_mount_proof(job->secret, nonce, job->name, want) &&
             kvp_grant_equal(want, ans + 16, KVP_PROVE_LEN);
        if (!ok)
            snprintf(r->why, sizeof(r->why),
                     "the server at %s serves a segment %.64s with another secret: another "
                     "owner's",
                     where, job->name);
        explicit_bzero(want, sizeof(want));
    }
    close(fd);
    return ok;
}

/* Run one probe into r. */
static void prove(kvp_prover_t *p, const kvp_proof_job_t *job, kvp_proof_result_t *r)
{
    uint64_t t0 = kvp_now_ms(), deadline_ms = t0 + p->timeout_ms;
    char port[8], where[160];
    snprintf(port, sizeof(port), "%u", job->port);
    snprintf(where, sizeof(where), strchr(job->host, ':') ? "[%.150s]:%u" : "%.150s:%u", job->host,
             job->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(job->host, port, &hints, &res);
    if (rc != 0) {
        snprintf(r->why, sizeof(r->why), "cannot resolve %s: %s", where, gai_strerror(rc));
    } else {
        for (const struct addrinfo *ai = res; ai != NULL && !r->ok; ai = ai->ai_next)
            if (kvp_now_ms() < deadline_ms)
                r->ok = prove_at(job, ai, deadline_ms, r, where);
        freeaddrinfo(res);
    }
    r->ms = (uint32_t)(kvp_now_ms() - t0);
}

/* The oldest waiting job whose principal has fewer than per_tag probes running (lock
 * held), taken off the queue; NULL: none may run now. */
static node_t *next_job(kvp_prover_t *p)
{
    for (node_t **pp = &p->queue; *pp != NULL; pp = &(*pp)->next) {
        unsigned running = 0;
        for (unsigned i = 0; i < p->n_threads; i++)
            running += p->running[i] == (*pp)->job.tag + 1;
        if (running >= p->per_tag)
            continue;
        node_t *nd = *pp;
        *pp = nd->next;
        if (*pp == NULL)
            p->queue_tail = pp;
        nd->next = NULL;
        p->n--;
        return nd;
    }
    return NULL;
}

typedef struct worker_arg {
    kvp_prover_t *p;
    unsigned slot;
} worker_arg_t;

static void *worker(void *arg)
{
    kvp_prover_t *p = ((worker_arg_t *)arg)->p;
    unsigned slot = ((worker_arg_t *)arg)->slot;
    free(arg);
    pthread_mutex_lock(&p->lock);
    for (;;) {
        node_t *nd = NULL;
        while (!p->stop && (nd = next_job(p)) == NULL)
            pthread_cond_wait(&p->cond, &p->lock);
        if (p->stop) {
            if (nd != NULL) {
                explicit_bzero(nd, sizeof(*nd));
                free(nd);
            }
            break;
        }
        p->running[slot] = nd->job.tag + 1;
        pthread_mutex_unlock(&p->lock);
        nd->r.id = nd->job.id;
        prove(p, &nd->job, &nd->r);
        OPENSSL_cleanse(&nd->job, sizeof(nd->job)); /* (explicit_bzero: a false
                                                       stringop-overflow with ASan) */
        pthread_mutex_lock(&p->lock);
        p->running[slot] = 0;
        *p->done_tail = nd;
        p->done_tail = &nd->next;
        atomic_fetch_sub(&p->busy, 1);
        pthread_cond_broadcast(&p->cond); /* a job of the same principal may run now */
        uint64_t one = 1;
        ssize_t w = write(p->efd, &one, sizeof(one));
        (void)w;
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

kvp_status_t kvp_prover_create(unsigned threads, unsigned per_tag, unsigned queue_max,
                               uint32_t timeout_ms, kvp_prover_t **pp)
{
    kvp_prover_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return KVP_ERR_NOMEM;
    p->cap = queue_max > 0 ? queue_max : 1;
    p->per_tag = per_tag > 0 ? per_tag : 1;
    p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    p->timeout_ms = timeout_ms > 0 ? timeout_ms : 1;
    p->queue_tail = &p->queue;
    p->done_tail = &p->done;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    if (p->efd < 0) {
        kvp_prover_destroy(p);
        return KVP_ERR_SYSTEM;
    }
    threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    for (unsigned i = 0; i < threads; i++) {
        worker_arg_t *a = malloc(sizeof(*a));
        if (a != NULL)
            *a = (worker_arg_t){.p = p, .slot = i};
        if (a == NULL || pthread_create(&p->threads[i], NULL, worker, a) != 0) {
            free(a);
            KVP_LOG_ERROR("mount proofs: cannot start a worker thread");
            kvp_prover_destroy(p);
            return KVP_ERR_SYSTEM;
        }
        p->n_threads++;
    }
    *pp = p;
    return KVP_OK;
}

int kvp_prover_fd(const kvp_prover_t *p)
{
    return p->efd;
}

bool kvp_prover_submit(kvp_prover_t *p, const kvp_proof_job_t *job)
{
    node_t *nd = calloc(1, sizeof(*nd));
    if (nd == NULL)
        return false;
    nd->job = *job;
    pthread_mutex_lock(&p->lock);
    bool ok = p->n < p->cap;
    if (ok) {
        *p->queue_tail = nd;
        p->queue_tail = &nd->next;
        p->n++;
        atomic_fetch_add(&p->busy, 1);
        pthread_cond_broadcast(&p->cond);
    }
    pthread_mutex_unlock(&p->lock);
    if (!ok) {
        explicit_bzero(nd, sizeof(*nd));
        free(nd);
    }
    return ok;
}

size_t kvp_prover_take(kvp_prover_t *p, kvp_proof_result_t *out, size_t max)
{
    uint64_t v;
    ssize_t rd = read(p->efd, &v, sizeof(v));
    (void)rd;
    size_t k = 0;
    pthread_mutex_lock(&p->lock);
    while (p->done != NULL && k < max) {
        node_t *d = p->done;
        p->done = d->next;
        out[k++] = d->r;
        free(d);
    }
    if (p->done == NULL)
        p->done_tail = &p->done;
    else { /* more than max: wake the loop again */
        uint64_t one = 1;
        ssize_t w = write(p->efd, &one, sizeof(one));
        (void)w;
    }
    pthread_mutex_unlock(&p->lock);
    return k;
}

unsigned kvp_prover_busy(const kvp_prover_t *p)
{
    return atomic_load(&((kvp_prover_t *)p)->busy);
}

void kvp_prover_destroy(kvp_prover_t *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    for (node_t *lists[2] = {p->queue, p->done}, **l = lists; l < lists + 2; l++)
        while (*l != NULL) {
            node_t *d = *l;
            *l = d->next;
            explicit_bzero(d, sizeof(*d));
            free(d);
        }
    if (p->efd >= 0)
        close(p->efd);
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
