/*
 * test_concurrency.c - many threads on one client, and many clients at once,
 * against a real kvpool-master and two real `kvpool serve` segment processes.
 *
 * Group 1 (test_shared_client): one kvp_client_t shared by 100 threads, each
 * in its own key namespace doing put (batch of 4, 1 B .. 256 KiB), exist
 * (all 1, prefix 4), get (byte-exact, nothing written past the object) and
 * remove, 30 times. Group 2 (test_own_clients): 8 threads each create their
 * own client (tcp) at the same moment, do the same work, destroy it; the
 * fds of this process and the master's return to what they were. Every case
 * ends with an empty pool: 0 objects, 0 pending, 0 bytes used.
 *
 * cmocka's asserts are not thread-safe, so worker threads only record their
 * first failure; the main thread asserts after joining them.
 *
 * The whole set runs twice: shared client forced to tcp, then to shm.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "tests/harness_pool.h"

#define SEG_SIZE "128MiB"
#define N_SHARED_THREADS 100
#define N_OWN_THREADS 8
#define N_ITERS 30
#define N_KEYS 4
#define MAX_OBJ (256u << 10)
#define GUARD 16

/* 1 B .. 256 KiB; odd sizes to catch off-by-one and alignment slips. */
static const size_t obj_sizes[] = {1, 7, 100, 1000, 4096, 10007, 65536 + 1, 100000, MAX_OBJ};
#define N_SIZES (sizeof(obj_sizes) / sizeof(obj_sizes[0]))

typedef struct env {
    kvp_test_pool_t p; /* master, segments, client (harness_pool.h) */
    const char *transport;
    int run;
} env_t;

typedef struct worker {
    env_t *e;
    pthread_t thread;
    int id;
    int run;                  /* key namespace and pattern seeds of this run */
    bool own_client;          /* create and destroy a client of its own */
    pthread_barrier_t *start; /* all workers begin at once */
    char fail[512];           /* first failure, "" if none */
} worker_t;

static int setup(void **state, const char *transport)
{
    env_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return -1;
    e->transport = transport;
    *state = e;
    char *args[] = {"--lease-ttl", "0", NULL}; /* kvp_start_master's: no read leases */
    return kvp_test_pool_start(&e->p, args, 2, SEG_SIZE, transport) ? 0 : -1;
}

static int setup_tcp(void **state)
{
    return setup(state, "tcp");
}

static int setup_shm(void **state)
{
    return setup(state, "shm");
}

static int setup_forced(void **state)
{
    return setup(state, kvp_test_transport());
}

static int teardown(void **state)
{
    env_t *e = *state;
    if (e == NULL)
        return -1;
    int rc = kvp_test_pool_stop(&e->p);
    free(e);
    return rc;
}

static void failf(worker_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void failf(worker_t *w, const char *fmt, ...)
{
    if (w->fail[0] != '\0')
        return;
    int n = snprintf(w->fail, sizeof(w->fail), "worker %d: ", w->id);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->fail + n, sizeof(w->fail) - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Seed of key k in iteration it of worker id: distinct for every object put. */
static uint64_t seed_of(int run, int id, int it, int k)
{
    return ((uint64_t)run << 40) | ((uint64_t)id << 20) | ((uint64_t)it << 4) | (uint64_t)k;
}

/* One iteration: put 4, exist, get 4 byte-exact, remove 4. false on failure. */
static bool one_round(worker_t *w, kvp_client_t *c, int it, uint8_t *src[N_KEYS],
                      uint8_t *dst[N_KEYS])
{
    env_t *e = w->e;
    char kb[N_KEYS][128];
    const char *keys[N_KEYS];
    size_t sizes[N_KEYS], caps[N_KEYS];
    for (int k = 0; k < N_KEYS; k++) {
        /* own namespace per worker (and per client kind and run) */
        snprintf(kb[k], sizeof(kb[k]), "conc/%s/r%d/%s%d/it%d/k%d", e->transport, w->run,
                 w->own_client ? "own" : "shared", w->id, it, k);
        keys[k] = kb[k];
        sizes[k] = obj_sizes[((size_t)w->id * 5 + (size_t)it * 3 + (size_t)k * 2) % N_SIZES];
        caps[k] = sizes[k] + GUARD;
        kvp_fill_pattern(src[k], sizes[k], seed_of(w->run, w->id, it, k));
        memset(dst[k], 0xAB, sizes[k] + GUARD);
    }

    kvp_status_t res[N_KEYS];
    for (int k = 0; k < N_KEYS; k++)
        res[k] = (kvp_status_t)1;
    kvp_status_t st =
        kvp_batch_put_from(c, keys, (const void *const *)src, sizes, N_KEYS, NULL, res);
    if (st != KVP_OK) {
        failf(w, "it %d: batch_put_from: %s (per key %d %d %d %d)", it, kvp_strerror(st), res[0],
              res[1], res[2], res[3]);
        return false;
    }
    for (int k = 0; k < N_KEYS; k++)
        if (res[k] != KVP_OK) {
            failf(w, "it %d: put %s returned OK but key %d has %d", it, keys[k], k, res[k]);
            return false;
        }

    int ex[N_KEYS] = {-100, -100, -100, -100};
    size_t prefix = 99;
    st = kvp_batch_is_exist(c, keys, N_KEYS, ex, &prefix);
    if (st != KVP_OK || prefix != N_KEYS) {
        failf(w, "it %d: batch_is_exist: %s, prefix %zu", it, kvp_strerror(st), prefix);
        return false;
    }
    for (int k = 0; k < N_KEYS; k++)
        if (ex[k] != 1) {
            failf(w, "it %d: exist %s = %d", it, keys[k], ex[k]);
            return false;
        }

    int64_t got[N_KEYS] = {-100, -100, -100, -100};
    st = kvp_batch_get_into(c, keys, (void *const *)dst, caps, N_KEYS, got);
    if (st != KVP_OK) {
        failf(w, "it %d: batch_get_into: %s", it, kvp_strerror(st));
        return false;
    }
    for (int k = 0; k < N_KEYS; k++) {
        if (got[k] != (int64_t)sizes[k]) {
            failf(w, "it %d: get %s: %lld bytes, want %zu", it, keys[k], (long long)got[k],
                  sizes[k]);
            return false;
        }
        if (memcmp(dst[k], src[k], sizes[k]) != 0) {
            size_t at = 0;
            while (dst[k][at] == src[k][at])
                at++;
            failf(w, "it %d: get %s (%zu B): bytes differ from offset %zu", it, keys[k], sizes[k],
                  at);
            return false;
        }
        for (size_t g = 0; g < GUARD; g++)
            if (dst[k][sizes[k] + g] != 0xAB) {
                failf(w, "it %d: get %s wrote past the object (byte %zu)", it, keys[k],
                      sizes[k] + g);
                return false;
            }
    }

    kvp_status_t rm[N_KEYS];
    st = kvp_batch_remove(c, keys, N_KEYS, rm);
    if (st != KVP_OK) {
        failf(w, "it %d: batch_remove: %s", it, kvp_strerror(st));
        return false;
    }
    /* gone for this client at once */
    int left = kvp_is_exist(c, keys[it % N_KEYS]);
    if (left != 0) {
        failf(w, "it %d: %s still exists after remove (%d)", it, keys[it % N_KEYS], left);
        return false;
    }
    return true;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    uint8_t *src[N_KEYS] = {0}, *dst[N_KEYS] = {0};
    kvp_client_t *c = w->e->p.client;
    bool ok = true;
    for (int k = 0; k < N_KEYS; k++) {
        src[k] = malloc(MAX_OBJ);
        dst[k] = malloc(MAX_OBJ + GUARD);
        if (src[k] == NULL || dst[k] == NULL) {
            failf(w, "out of memory");
            ok = false;
        }
    }
    pthread_barrier_wait(w->start);
    if (ok && w->own_client) {
        kvp_client_params_t p;
        kvp_client_params_init(&p);
        p.master_addr = w->e->p.master.ready;
        p.transport = "tcp";
        kvp_status_t st = kvp_client_create(&p, &c);
        if (st != KVP_OK) {
            failf(w, "kvp_client_create: %s", kvp_strerror(st));
            ok = false;
            c = NULL;
        }
    }
    for (int it = 0; ok && it < N_ITERS; it++)
        ok = one_round(w, c, it, src, dst);
    if (w->own_client)
        kvp_client_destroy(c);
    for (int k = 0; k < N_KEYS; k++) {
        free(src[k]);
        free(dst[k]);
    }
    return NULL;
}

/* Start n workers behind `start` (initialised for n), all with run number `run`. */
static void start_workers(env_t *e, worker_t *w, int n, bool own_client, int run,
                          pthread_barrier_t *start)
{
    for (int i = 0; i < n; i++) {
        w[i].e = e;
        w[i].id = i;
        w[i].run = run;
        w[i].own_client = own_client;
        w[i].start = start;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256u << 10);
        int rc = pthread_create(&w[i].thread, &attr, worker_main, &w[i]);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            /* the others wait at the barrier forever: nothing sane to do but stop */
            fprintf(stderr, "pthread_create: %s\n", strerror(rc));
            abort();
        }
    }
}

/* Join n workers; returns how many failed, each failure printed. */
static int join_workers(worker_t *w, int n, char *first, size_t first_len)
{
    int failed = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(w[i].thread, NULL);
        if (w[i].fail[0] != '\0') {
            fprintf(stderr, "%s%s\n", w[i].own_client ? "own client " : "", w[i].fail);
            if (failed++ == 0)
                snprintf(first, first_len, "%s", w[i].fail);
        }
    }
    return failed;
}

/* Run n workers to the end; fail the test on the first recorded failure. */
static void run_workers(env_t *e, int n, bool own_client)
{
    worker_t *w = calloc((size_t)n, sizeof(*w));
    assert_non_null(w);
    pthread_barrier_t start;
    assert_int_equal(pthread_barrier_init(&start, NULL, (unsigned)n), 0);
    start_workers(e, w, n, own_client, ++e->run, &start);
    char first[512] = "";
    int failed = join_workers(w, n, first, sizeof(first));
    pthread_barrier_destroy(&start);
    free(w);
    if (failed > 0)
        fail_msg("%d of %d workers failed; first: %s", failed, n, first);
}

static void assert_pool_empty(env_t *e)
{
    kvp_pool_stat_t *s = NULL;
    assert_int_equal(kvp_pool_stat(e->p.client, &s), KVP_OK);
    assert_int_equal(s->n_segments, 2);
    assert_int_equal(s->objects, 0);
    assert_int_equal(s->pending, 0);
    assert_int_equal(s->used, 0);
    for (size_t i = 0; i < s->n_segments; i++) {
        assert_int_equal(s->segments[i].used, 0);
        assert_int_equal(s->segments[i].objects, 0);
    }
    kvp_pool_stat_free(s);
}

static void test_shared_client(void **state)
{
    env_t *e = *state;
    assert_pool_empty(e);
    run_workers(e, N_SHARED_THREADS, false);
    assert_pool_empty(e);
}

/* Wait (bounded) until pid's fd count is `want`; returns the last count seen. */
static int wait_fd_count(pid_t pid, int want, int timeout_ms)
{
    int n = -1;
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        n = kvp_proc_fd_count(pid);
        if (n == want)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return n;
}

static void test_own_clients(void **state)
{
    env_t *e = *state;
    int my_fds = kvp_proc_fd_count(getpid());
    int master_fds = kvp_proc_fd_count(e->p.master.pid);
    assert_true(my_fds > 0);
    assert_true(master_fds > 0);
    run_workers(e, N_OWN_THREADS, true);
    assert_pool_empty(e);
    /* every destroyed client closed all its sockets; the master saw them go */
    assert_int_equal(kvp_proc_fd_count(getpid()), my_fds);
    assert_int_equal(wait_fd_count(e->p.master.pid, master_fds, 5000), master_fds);
}

/* Both at once: the shared client under load while 8 private clients come and go. */
static void test_mixed(void **state)
{
    env_t *e = *state;
    enum { N_SHARED = N_SHARED_THREADS / 4, N = N_SHARED + N_OWN_THREADS };
    worker_t *w = calloc(N, sizeof(*w));
    assert_non_null(w);
    pthread_barrier_t start;
    assert_int_equal(pthread_barrier_init(&start, NULL, N), 0);
    int run = ++e->run;
    start_workers(e, w, N_SHARED, false, run, &start);
    start_workers(e, w + N_SHARED, N_OWN_THREADS, true, run, &start);
    char first[512] = "";
    int failed = join_workers(w, N, first, sizeof(first));
    pthread_barrier_destroy(&start);
    free(w);
    if (failed > 0)
        fail_msg("%d of %d workers failed; first: %s", failed, (int)N, first);
    assert_pool_empty(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_client),
        cmocka_unit_test(test_own_clients),
        cmocka_unit_test(test_mixed),
    };
    if (kvp_test_transport() != NULL) /* the same suite on the transport under test */
        return cmocka_run_group_tests_name("concurrency_forced", tests, setup_forced, teardown);
    int fails = cmocka_run_group_tests_name("concurrency_tcp", tests, setup_tcp, teardown);
    fails += cmocka_run_group_tests_name("concurrency_shm", tests, setup_shm, teardown);
    return fails;
}
