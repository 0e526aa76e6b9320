/*
 * test_leases.c - read leases as a user sees them (issue 10), with real
 * processes: a kvpool-master, one `kvpool serve` segment owner, this process
 * as the clients (and the `kvpool` CLI as a separate reader process).
 *
 * The contract under test:
 * - a get releases its read lease as soon as its transfer ends (success or
 *   failure): a plain remove right after a finished get succeeds at once,
 *   through the API and through the CLI, over tcp and over shm;
 * - while a read is in flight a plain remove is KVP_ERR_LEASED; a forced
 *   remove makes the key disappear at once but keeps the extent (pool `used`)
 *   until the last in-flight read of it ends, and then frees it promptly,
 *   not a lease TTL later;
 * - the TTL is only a safety net: a reader killed with -9 mid-read holds its
 *   lease until about --lease-ttl (its connection closing does not end it),
 *   then the object can be removed;
 * - put / get / forced remove at full speed never fills the pool (no
 *   KVP_ERR_POOL_FULL), gets return exact bytes, the pool ends empty; a
 *   concurrent reader of the same keys sees whole versions or NOT_FOUND,
 *   never a checksum error (an extent freed under a read would show so);
 * - a full pool whose room is held only by in-flight reads makes a put wait
 *   for those reads, not fail;
 * - an upsert while the old value is being read never overwrites the bytes
 *   being read, and the old extent goes when that read ends.
 *
 * How a read is held "in flight": the segment owner is frozen with SIGSTOP
 * (every thread stopped) before the reader starts; a reader forced to tcp
 * then gets its lease from the master and blocks on the owner's data
 * server until SIGCONT (its rpc_timeout is far longer than the freeze). The
 * master is never stopped. --client-ttl is long so a frozen owner is not
 * dropped. shm reads do not involve the owner's process, so the in-flight
 * tests use tcp readers.
 *
 * Threads: cmocka assertions run on the main thread only; background readers
 * and writers record what they saw and the main thread checks it. Every test
 * registers its environment in g_env so the teardown thaws the owner, joins
 * the threads, reaps the CLI child and stops the processes even when a test
 * fails midway.
 *
 * Knobs: KVPOOL_TEST_SOAK_S (seconds per transport for the full-speed loop;
 * default 30, 10 under ASan).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "common/clock.h"
#include "tests/harness.h"

extern char **environ;

#if defined(__SANITIZE_ADDRESS__)
#define LT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LT_ASAN 1
#endif
#endif
#ifndef LT_ASAN
#define LT_ASAN 0
#endif

#define MIB (1024ull * 1024ull)
/* Readers and writers wait far longer than any freeze in these tests. */
#define LT_RPC_TIMEOUT_MS 60000
#define LT_MAX_BG 4
#define LT_MAX_CLIENTS 8

/* ---- environment ---- */

/* A reader (batch get) or writer (put) running on its own thread and client. */
typedef struct bg {
    pthread_t thread;
    bool running; /* created and not joined yet */
    kvp_client_t *client;
    bool is_put;
    size_t n;
    const char *const *keys;
    void *const *bufs;           /* reader: destinations */
    const size_t *caps;          /* reader: capacities; writer: sizes */
    const void *put_buf;         /* writer */
    const kvp_put_config_t *cfg; /* writer */
    int64_t results[64];         /* reader: per key */
    kvp_status_t rc;             /* the call's return */
    atomic_bool done;
    _Atomic uint64_t end_ms;
} bg_t;

typedef struct env {
    kvp_proc_t master;
    kvp_proc_t seg;
    kvp_client_t *admin; /* the "second client": removes, stats, lists */
    kvp_client_t *clients[LT_MAX_CLIENTS];
    unsigned n_clients;
    bg_t *bg[LT_MAX_BG];
    unsigned n_bg;
    pid_t child; /* a CLI reader, killed and reaped by the test (or the teardown) */
    char dir[64];
} env_t;

static env_t *g_env;

/* A master with `flags`, one `kvpool serve` segment of `seg_size` (auto: tcp and shm). */
static env_t *env_start(char *const flags[], const char *seg_size)
{
    env_t *e = calloc(1, sizeof(*e));
    assert_non_null(e);
    g_env = e;
    snprintf(e->dir, sizeof(e->dir), "/tmp/kvp-leases-XXXXXX");
    assert_non_null(mkdtemp(e->dir));
    assert_true(kvp_start_master_args(&e->master, flags));
    assert_true(kvp_start_segment(&e->seg, e->master.ready, seg_size, "auto"));
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = e->master.ready;
    p.transport = "tcp";
    p.rpc_timeout_ms = LT_RPC_TIMEOUT_MS;
    assert_int_equal(kvp_client_create(&p, &e->admin), KVP_OK);
    return e;
}

/* Another client of the pool, forced to `transport`; destroyed with the env. */
static kvp_client_t *env_client(env_t *e, const char *transport)
{
    assert_true(e->n_clients < LT_MAX_CLIENTS);
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = e->master.ready;
    p.transport = transport;
    p.rpc_timeout_ms = LT_RPC_TIMEOUT_MS;
    kvp_client_t *c = NULL;
    assert_int_equal(kvp_client_create(&p, &c), KVP_OK);
    e->clients[e->n_clients++] = c;
    return c;
}

static void env_path(const env_t *e, const char *name, char *out, size_t len)
{
    snprintf(out, len, "%s/%s", e->dir, name);
}

static void bg_join(bg_t *b)
{
    if (b->running) {
        pthread_join(b->thread, NULL);
        b->running = false;
    }
}

/* Stop everything; false if a child exited badly (a crash, a sanitizer report). */
static bool env_stop_all(env_t *e)
{
    bool ok = true;
    if (e->seg.pid > 0)
        kill(e->seg.pid, SIGCONT); /* a frozen owner would hold readers and ignore SIGTERM */
    for (unsigned i = 0; i < e->n_bg; i++) {
        bg_join(e->bg[i]);
        free(e->bg[i]);
    }
    if (e->child > 0) {
        int status;
        kill(e->child, SIGKILL);
        waitpid(e->child, &status, 0);
    }
    for (unsigned i = 0; i < e->n_clients; i++)
        kvp_client_destroy(e->clients[i]);
    kvp_client_destroy(e->admin);
    if (e->seg.pid > 0 && kvp_proc_stop(&e->seg, SIGTERM, 20000) != 0)
        ok = false;
    if (e->master.pid > 0 && kvp_proc_stop(&e->master, SIGTERM, 10000) != 0)
        ok = false;
    DIR *d = opendir(e->dir);
    if (d != NULL) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.')
                continue;
            char path[512];
            snprintf(path, sizeof(path), "%s/%s", e->dir, de->d_name);
            unlink(path);
        }
        closedir(d);
        rmdir(e->dir);
    }
    free(e);
    return ok;
}

static void env_stop(env_t *e)
{
    g_env = NULL;
    assert_true(env_stop_all(e));
}

static int teardown(void **state)
{
    (void)state;
    if (g_env != NULL) { /* the test failed before its own env_stop */
        env_t *e = g_env;
        g_env = NULL;
        env_stop_all(e);
    }
    return 0;
}

/* ---- helpers ---- */

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static kvp_pool_stat_t *stat_of(env_t *e)
{
    kvp_pool_stat_t *s = NULL;
    assert_int_equal(kvp_pool_stat(e->admin, &s), KVP_OK);
    return s;
}

static uint64_t used_of(env_t *e)
{
    kvp_pool_stat_t *s = stat_of(e);
    uint64_t used = s->used;
    kvp_pool_stat_free(s);
    return used;
}

/* Poll until the pool's used bytes are `want`; ms waited, or -1 after timeout_ms. */
static int64_t wait_used(env_t *e, uint64_t want, int timeout_ms)
{
    uint64_t t0 = kvp_now_ms();
    for (;;) {
        if (used_of(e) == want)
            return (int64_t)(kvp_now_ms() - t0);
        if (kvp_now_ms() - t0 >= (uint64_t)timeout_ms)
            return -1;
        sleep_ms(5);
    }
}

/* The read lease left on `key` (ms, 0: none), or -1 when the key is not listed. */
static int64_t lease_ms_of(env_t *e, const char *key)
{
    char re[256];
    snprintf(re, sizeof(re), "^%s$", key);
    kvp_key_info_t *ks = NULL;
    size_t n = 0;
    assert_int_equal(kvp_list_keys(e->admin, re, 4, &ks, &n), KVP_OK);
    int64_t lease = -1;
    for (size_t i = 0; i < n; i++)
        if (strcmp(ks[i].key, key) == 0)
            lease = ks[i].lease_ms;
    kvp_key_list_free(ks, n);
    return lease;
}

/* Wait until every key carries a read lease (its reader got it from the master). */
static void wait_leased(env_t *e, const char *const *keys, size_t n, int timeout_ms)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    for (size_t i = 0; i < n; i++) {
        while (lease_ms_of(e, keys[i]) <= 0) {
            if (kvp_now_ms() >= deadline)
                fail_msg("no read lease on %s within %d ms: the reader never reached the master",
                         keys[i], timeout_ms);
            sleep_ms(2);
        }
    }
}

/* SIGSTOP pid and wait until every one of its threads is stopped. */
static void freeze(pid_t pid)
{
    assert_true(kvp_proc_freeze(pid, 5000));
}

static void thaw(pid_t pid)
{
    assert_int_equal(kill(pid, SIGCONT), 0);
}

static void *bg_main(void *arg)
{
    bg_t *b = arg;
    if (b->is_put)
        b->rc = kvp_put(b->client, b->keys[0], b->put_buf, b->caps[0], b->cfg);
    else
        b->rc = kvp_batch_get_into(b->client, b->keys, b->bufs, b->caps, b->n, b->results);
    atomic_store(&b->end_ms, kvp_now_ms());
    atomic_store(&b->done, true);
    return NULL;
}

static bg_t *bg_start(env_t *e, bg_t *b)
{
    assert_true(e->n_bg < LT_MAX_BG);
    bg_t *own = malloc(sizeof(*own));
    assert_non_null(own);
    *own = *b;
    atomic_init(&own->done, false);
    atomic_init(&own->end_ms, 0);
    own->running = false;
    e->bg[e->n_bg++] = own;
    assert_int_equal(pthread_create(&own->thread, NULL, bg_main, own), 0);
    own->running = true;
    return own;
}

/* A reader on its own tcp client: batch_get_into(keys) into bufs of caps. */
static bg_t *start_reader(env_t *e, const char *const *keys, void *const *bufs, const size_t *caps,
                          size_t n)
{
    assert_true(n <= 64);
    bg_t b = {.client = env_client(e, "tcp"), .n = n, .keys = keys, .bufs = bufs, .caps = caps};
    return bg_start(e, &b);
}

/* A writer on its own tcp client: put(keys[0], buf, *len, cfg). */
static bg_t *start_writer(env_t *e, const char *const *key, const void *buf, const size_t *len,
                          const kvp_put_config_t *cfg)
{
    bg_t b = {.client = env_client(e, "tcp"),
              .is_put = true,
              .n = 1,
              .keys = key,
              .put_buf = buf,
              .caps = len,
              .cfg = cfg};
    return bg_start(e, &b);
}

/* Wait for a background call to return; false after timeout_ms (it is still running). */
static bool bg_wait(bg_t *b, int timeout_ms)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)timeout_ms;
    while (!atomic_load(&b->done)) {
        if (kvp_now_ms() >= deadline)
            return false;
        sleep_ms(2);
    }
    bg_join(b);
    return true;
}

/*
 * A read that overlapped a remove or an upsert: exact bytes, or a clean
 * error. Never success with other bytes.
 */
static void expect_bytes_or_clean_error(const char *key, int64_t got, const void *buf,
                                        const void *want, size_t len)
{
    if (got >= 0) {
        if (got != (int64_t)len)
            fail_msg("read of %s returned %lld bytes, want %zu", key, (long long)got, len);
        assert_memory_equal(buf, want, len);
    } else {
        fprintf(stderr, "note: the read of %s ended with %s (a clean error)\n", key,
                kvp_strerror((kvp_status_t)got));
    }
}

static void put_pattern(kvp_client_t *c, const char *key, size_t len, uint64_t seed)
{
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    kvp_fill_pattern(buf, len, seed);
    kvp_status_t st = kvp_put(c, key, buf, len, NULL);
    if (st != KVP_OK)
        fail_msg("put %s (%zu bytes): %s", key, len, kvp_strerror(st));
    free(buf);
}

static void expect_pattern(kvp_client_t *c, const char *key, size_t len, uint64_t seed)
{
    uint8_t *want = malloc(len), *got = malloc(len + 1);
    assert_non_null(want);
    assert_non_null(got);
    kvp_fill_pattern(want, len, seed);
    int64_t n = kvp_get_into(c, key, got, len + 1);
    if (n != (int64_t)len)
        fail_msg("get %s: %lld (%s), want %zu bytes", key, (long long)n,
                 n < 0 ? kvp_strerror((kvp_status_t)n) : "size", len);
    assert_memory_equal(got, want, len);
    free(want);
    free(got);
}

static void expect_remove(kvp_client_t *c, const char *key, bool force, kvp_status_t want,
                          const char *why)
{
    kvp_status_t st = force ? kvp_remove_force(c, key) : kvp_remove(c, key);
    if (st != want)
        fail_msg("%sremove %s: %s, want %s (%s)", force ? "forced " : "", key, kvp_strerror(st),
                 kvp_strerror(want), why);
}

static void write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "we");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* The whole file at path, exactly len bytes of want. */
static void expect_file(const char *path, const void *want, size_t len)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        fail_msg("%s: %s", path, strerror(errno));
    uint8_t *got = malloc(len + 1);
    assert_non_null(got);
    size_t n = fread(got, 1, len + 1, f);
    fclose(f);
    assert_int_equal(n, len);
    assert_memory_equal(got, want, len);
    free(got);
}

/* Run the CLI: kvpool --master M --transport T --timeout-ms N ARGS...; its exit status. */
static int cli(env_t *e, const char *transport, const char *a0, const char *a1, const char *a2)
{
    char *argv[] = {(char *)kvp_test_cli_bin(),
                    "--master",
                    e->master.ready,
                    "--transport",
                    (char *)transport,
                    "--timeout-ms",
                    "30000",
                    (char *)a0,
                    (char *)a1,
                    (char *)a2,
                    NULL};
    return kvp_run(argv, NULL, NULL, 0, 60000);
}

/* ---- 1. a finished get leaves no lease behind ---- */

static void get_then_remove(const char *transport)
{
    char *flags[] = {"--lease-ttl", "20", "--client-ttl", "60", NULL};
    env_t *e = env_start(flags, "64MiB");
    kvp_client_t *c = env_client(e, transport);

    /* one object at a time, small and large: get, then remove at once */
    const size_t sizes[] = {4096, 1 * MIB, 3 * MIB + 17};
    for (unsigned i = 0; i < 3; i++) {
        put_pattern(c, "one", sizes[i], i + 1);
        expect_pattern(c, "one", sizes[i], i + 1);
        expect_remove(c, "one", false, KVP_OK, "the get has finished: its lease must be gone");
        assert_int_equal(kvp_is_exist(c, "one"), 0);
        assert_int_equal(used_of(e), 0); /* the extent is free at once, not after the TTL */
    }

    /* read twice, then remove (the second read must not leave a lease either) */
    put_pattern(c, "twice", 65536, 9);
    expect_pattern(c, "twice", 65536, 9);
    expect_pattern(c, "twice", 65536, 9);
    expect_remove(c, "twice", false, KVP_OK, "two finished gets");

    /* a get that moved no bytes (buffer too small) still gives its lease back */
    put_pattern(c, "small", 65536, 10);
    uint8_t tiny[16];
    assert_int_equal(kvp_get_into(c, "small", tiny, sizeof(tiny)), KVP_ERR_BUFFER_TOO_SMALL);
    expect_remove(c, "small", false, KVP_OK, "a get that failed before its transfer");

    /* a remove from another client right after the get (the admin client, tcp) */
    put_pattern(c, "other", 65536, 11);
    expect_pattern(c, "other", 65536, 11);
    expect_remove(e->admin, "other", false, KVP_OK, "another client, after a finished get");

    /* a batch of 32: batch get, then a plain batch remove */
    enum { N = 32 };
    char keys[N][16];
    const char *kp[N];
    const void *bp[N];
    void *op[N];
    size_t sz[N];
    uint8_t *in = malloc(N * 65536), *out = malloc(N * 65536);
    assert_non_null(in);
    assert_non_null(out);
    for (unsigned i = 0; i < N; i++) {
        snprintf(keys[i], sizeof(keys[i]), "b%u", i);
        kp[i] = keys[i];
        sz[i] = i % 2 ? 65536 : 4096 + i;
        kvp_fill_pattern(in + i * 65536, sz[i], 500 + i);
        bp[i] = in + i * 65536;
        op[i] = out + i * 65536;
    }
    kvp_status_t res[N];
    int64_t got[N];
    assert_int_equal(kvp_batch_put_from(c, kp, bp, sz, N, NULL, res), KVP_OK);
    assert_int_equal(kvp_batch_get_into(c, kp, op, sz, N, got), KVP_OK);
    for (unsigned i = 0; i < N; i++) {
        assert_int_equal(got[i], (int64_t)sz[i]);
        assert_memory_equal(op[i], bp[i], sz[i]);
    }
    kvp_status_t rst = kvp_batch_remove(c, kp, N, res);
    for (unsigned i = 0; i < N; i++)
        if (res[i] != KVP_OK)
            fail_msg("batch remove after a finished batch get: %s: %s", keys[i],
                     kvp_strerror(res[i]));
    assert_int_equal(rst, KVP_OK);
    assert_int_equal(used_of(e), 0);
    free(in);
    free(out);

    /* the CLI, back to back: put, get, rm all exit 0 (issue 10's reproducer) */
    size_t len = 256 * 1024 + 3;
    uint8_t *val = malloc(len);
    assert_non_null(val);
    char inp[128], outp[128];
    env_path(e, "in.bin", inp, sizeof(inp));
    env_path(e, "out.bin", outp, sizeof(outp));
    for (unsigned r = 0; r < 10; r++) {
        kvp_fill_pattern(val, len, 1000 + r);
        write_file(inp, val, len);
        assert_int_equal(cli(e, transport, "put", "clikey", inp), 0);
        assert_int_equal(cli(e, transport, "get", "clikey", outp), 0);
        int rc = cli(e, transport, "rm", "clikey", NULL);
        if (rc != 0)
            fail_msg("round %u: `kvpool rm clikey` right after `kvpool get` exited %d, want 0", r,
                     rc);
        expect_file(outp, val, len);
        unlink(outp);
    }
    free(val);
    kvp_pool_stat_t *s = stat_of(e);
    assert_int_equal(s->used, 0);
    assert_int_equal(s->objects, 0);
    assert_int_equal(s->pending, 0);
    kvp_pool_stat_free(s);
    env_stop(e);
}

static void test_get_then_remove_tcp(void **state)
{
    (void)state;
    get_then_remove("tcp");
}

static void test_get_then_remove_shm(void **state)
{
    (void)state;
    get_then_remove("shm");
}

/* ---- 2. forced remove while a read is in flight ---- */

static void test_force_remove_during_read(void **state)
{
    (void)state;
    /* a long TTL, so an extent freed by the TTL rather than by the read's end shows */
    char *flags[] = {"--lease-ttl", "20", "--client-ttl", "60", NULL};
    env_t *e = env_start(flags, "128MiB");
    const size_t len = 64 * MIB;
    uint8_t *val = malloc(len), *out = malloc(len);
    assert_non_null(val);
    assert_non_null(out);
    kvp_fill_pattern(val, len, 42);
    assert_int_equal(kvp_put(e->admin, "big", val, len, NULL), KVP_OK);
    uint64_t used0 = used_of(e);
    assert_true(used0 >= len);

    freeze(e->seg.pid);
    static const char *keys[] = {"big"};
    void *bufs[] = {out};
    size_t caps[] = {len};
    bg_t *rd = start_reader(e, keys, bufs, caps, 1);
    wait_leased(e, keys, 1, 10000);
    assert_false(atomic_load(&rd->done)); /* the owner is frozen: the read cannot end */

    expect_remove(e->admin, "big", false, KVP_ERR_LEASED, "a read is in flight");
    assert_int_equal(kvp_is_exist(e->admin, "big"), 1);
    expect_remove(e->admin, "big", true, KVP_OK, "force removes an object being read");
    /* the key is gone for everyone else at once */
    assert_int_equal(kvp_is_exist(e->admin, "big"), 0);
    assert_int_equal(kvp_get_size(e->admin, "big"), KVP_ERR_NOT_FOUND);
    uint8_t small[64];
    assert_int_equal(kvp_get_into(e->admin, "big", small, sizeof(small)), KVP_ERR_NOT_FOUND);
    assert_int_equal(lease_ms_of(e, "big"), -1);
    /* ... but its extent is still being read: not freed (watched for a while) */
    for (unsigned i = 0; i < 10; i++) {
        uint64_t u = used_of(e);
        if (u != used0)
            fail_msg("used %llu bytes while the read is in flight, want %llu: the extent "
                     "under the reader was freed",
                     (unsigned long long)u, (unsigned long long)used0);
        sleep_ms(30);
    }
    assert_false(atomic_load(&rd->done));

    thaw(e->seg.pid);
    assert_true(bg_wait(rd, 30000));
    /* the extent goes as soon as the read has ended, not --lease-ttl (20 s) later */
    uint64_t ended = atomic_load(&rd->end_ms);
    int64_t waited = wait_used(e, 0, 8000);
    int64_t after_end = (int64_t)(kvp_now_ms() - ended);
    if (waited < 0)
        fail_msg("the force-removed extent (%llu bytes used) was not freed within %lld ms of "
                 "the read's end (lease ttl 20 s)",
                 (unsigned long long)used_of(e), (long long)after_end);
    fprintf(stderr, "note: extent freed within %lld ms of the read's end\n", (long long)after_end);
    assert_true(after_end < 5000);
    expect_bytes_or_clean_error("big", rd->results[0], out, val, len);

    /* the pool is usable: the same key again, exact bytes, removable */
    kvp_fill_pattern(val, len, 43);
    assert_int_equal(kvp_put(e->admin, "big", val, len, NULL), KVP_OK);
    assert_int_equal(kvp_get_into(e->admin, "big", out, len), (int64_t)len);
    assert_memory_equal(out, val, len);
    expect_remove(e->admin, "big", false, KVP_OK, "after a finished get");
    kvp_pool_stat_t *s = stat_of(e);
    assert_int_equal(s->used, 0);
    assert_int_equal(s->pending, 0);
    kvp_pool_stat_free(s);
    free(val);
    free(out);
    env_stop(e);
}

/* ---- 3. put / get / forced remove at full speed ---- */

#define SOAK_SLOTS 32 /* one batch */
#define SOAK_WORKERS 2
#define SOAK_STAMP 16

static size_t soak_len(unsigned slot)
{
    return slot % 2 == 0 ? 1 * MIB : 64 * 1024;
}

typedef struct soak {
    kvp_client_t *clients[SOAK_WORKERS + 1];
    uint8_t *pattern[SOAK_SLOTS]; /* shared, read-only: slot i's body */
    atomic_bool stop;
    uint64_t deadline_ms;
    pthread_mutex_t lock;
    char failure[512]; /* the first failure seen, "" if none */
    uint64_t iterations, bytes, pool_full, cross_reads, cross_found;
} soak_t;

typedef struct soak_worker {
    soak_t *s;
    unsigned id;
    pthread_t thread;
} soak_worker_t;

static void soak_fail(soak_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void soak_fail(soak_t *s, const char *fmt, ...)
{
    pthread_mutex_lock(&s->lock);
    if (s->failure[0] == '\0') {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->failure, sizeof(s->failure), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&s->lock);
    atomic_store(&s->stop, true);
}

static void soak_stamp(uint8_t *buf, size_t len, unsigned worker, unsigned slot, uint64_t iter)
{
    uint64_t st[2] = {(uint64_t)worker << 32 | slot, iter};
    memcpy(buf, st, SOAK_STAMP);
    memcpy(buf + len - SOAK_STAMP, st, SOAK_STAMP);
}

/* Whether buf is some version of (worker, slot): matching stamps and the slot's body. */
static bool soak_valid(const soak_t *s, const uint8_t *buf, size_t len, unsigned worker,
                       unsigned slot)
{
    uint64_t head[2], tail[2];
    memcpy(head, buf, SOAK_STAMP);
    memcpy(tail, buf + len - SOAK_STAMP, SOAK_STAMP);
    return head[0] == ((uint64_t)worker << 32 | slot) && memcmp(head, tail, SOAK_STAMP) == 0 &&
           memcmp(buf + SOAK_STAMP, s->pattern[slot] + SOAK_STAMP, len - 2 * SOAK_STAMP) == 0;
}

/* "pool used U of C bytes, E evicted": what a failure found the pool like. */
static void soak_pool_note(kvp_client_t *c, char *buf, size_t len)
{
    kvp_pool_stat_t *st = NULL;
    if (kvp_pool_stat(c, &st) != KVP_OK) {
        snprintf(buf, len, "pool stat failed");
        return;
    }
    snprintf(buf, len, "pool used %llu of %llu bytes, %llu objects evicted",
             (unsigned long long)st->used, (unsigned long long)st->capacity,
             (unsigned long long)st->evicted_objects);
    kvp_pool_stat_free(st);
}

/* One writer: put a batch of 32, read it back, force-remove it; again until the deadline. */
static void *soak_worker_main(void *arg)
{
    soak_worker_t *w = arg;
    soak_t *s = w->s;
    kvp_client_t *c = s->clients[w->id];
    char keys[SOAK_SLOTS][32];
    const char *kp[SOAK_SLOTS];
    const void *bp[SOAK_SLOTS];
    void *op[SOAK_SLOTS];
    size_t sz[SOAK_SLOTS];
    uint8_t *in[SOAK_SLOTS], *out[SOAK_SLOTS];
    for (unsigned i = 0; i < SOAK_SLOTS; i++) {
        snprintf(keys[i], sizeof(keys[i]), "w%u/s%u", w->id, i);
        kp[i] = keys[i];
        sz[i] = soak_len(i);
        in[i] = malloc(sz[i]);
        out[i] = malloc(sz[i]);
        if (in[i] == NULL || out[i] == NULL) {
            soak_fail(s, "out of memory");
            return NULL;
        }
        memcpy(in[i], s->pattern[i], sz[i]);
        bp[i] = in[i];
        op[i] = out[i];
    }
    kvp_status_t res[SOAK_SLOTS];
    int64_t got[SOAK_SLOTS];
    uint64_t iter = 0, bytes = 0, pool_full = 0;
    while (!atomic_load(&s->stop) && kvp_now_ms() < s->deadline_ms) {
        iter++;
        for (unsigned i = 0; i < SOAK_SLOTS; i++)
            soak_stamp(in[i], sz[i], w->id, i, iter);
        kvp_batch_put_from(c, kp, bp, sz, SOAK_SLOTS, NULL, res);
        for (unsigned i = 0; i < SOAK_SLOTS; i++) {
            if (res[i] == KVP_ERR_POOL_FULL)
                pool_full++;
            if (res[i] != KVP_OK) {
                char pool[128];
                soak_pool_note(c, pool, sizeof(pool));
                soak_fail(s, "worker %u iteration %llu: put %s (%zu bytes): %s (%s)", w->id,
                          (unsigned long long)iter, kp[i], sz[i], kvp_strerror(res[i]), pool);
                goto out;
            }
        }
        kvp_batch_get_into(c, kp, op, sz, SOAK_SLOTS, got);
        for (unsigned i = 0; i < SOAK_SLOTS; i++) {
            if (got[i] != (int64_t)sz[i]) {
                char pool[128];
                soak_pool_note(c, pool, sizeof(pool));
                soak_fail(s, "worker %u iteration %llu: get %s: %lld (%s), want %zu bytes (%s)",
                          w->id, (unsigned long long)iter, kp[i], (long long)got[i],
                          got[i] < 0 ? kvp_strerror((kvp_status_t)got[i]) : "size", sz[i], pool);
                goto out;
            }
            if (memcmp(out[i], in[i], sz[i]) != 0) {
                soak_fail(s, "worker %u iteration %llu: get %s returned other bytes", w->id,
                          (unsigned long long)iter, kp[i]);
                goto out;
            }
            bytes += sz[i];
        }
        kvp_batch_remove_force(c, kp, SOAK_SLOTS, res);
        for (unsigned i = 0; i < SOAK_SLOTS; i++) {
            if (res[i] != KVP_OK) {
                soak_fail(s, "worker %u iteration %llu: forced remove %s: %s", w->id,
                          (unsigned long long)iter, kp[i], kvp_strerror(res[i]));
                goto out;
            }
        }
    }
out:
    pthread_mutex_lock(&s->lock);
    s->iterations += iter;
    s->bytes += bytes;
    s->pool_full += pool_full;
    pthread_mutex_unlock(&s->lock);
    for (unsigned i = 0; i < SOAK_SLOTS; i++) {
        free(in[i]);
        free(out[i]);
    }
    return NULL;
}

/*
 * Reads the writers' keys while they put and force-remove them: each read
 * is a whole version of that key, or NOT_FOUND. A checksum error here would
 * mean an extent was freed (and rewritten) while this read was on it.
 */
static void *soak_cross_main(void *arg)
{
    soak_worker_t *w = arg;
    soak_t *s = w->s;
    kvp_client_t *c = s->clients[SOAK_WORKERS];
    uint8_t *buf = malloc(1 * MIB);
    if (buf == NULL) {
        soak_fail(s, "out of memory");
        return NULL;
    }
    uint64_t x = 88172645463325252ull, reads = 0, found = 0;
    while (!atomic_load(&s->stop) && kvp_now_ms() < s->deadline_ms) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        unsigned worker = (unsigned)(x % SOAK_WORKERS), slot = (unsigned)(x >> 8) % SOAK_SLOTS;
        char key[32];
        snprintf(key, sizeof(key), "w%u/s%u", worker, slot);
        size_t len = soak_len(slot);
        int64_t r = kvp_get_into(c, key, buf, len);
        reads++;
        if (r == KVP_ERR_NOT_FOUND)
            continue;
        if (r != (int64_t)len) {
            soak_fail(s, "concurrent get %s: %lld (%s), want %zu bytes or NOT_FOUND", key,
                      (long long)r, r < 0 ? kvp_strerror((kvp_status_t)r) : "size", len);
            break;
        }
        if (!soak_valid(s, buf, len, worker, slot)) {
            soak_fail(s, "concurrent get %s returned bytes that are no version of it", key);
            break;
        }
        found++;
    }
    pthread_mutex_lock(&s->lock);
    s->cross_reads += reads;
    s->cross_found += found;
    pthread_mutex_unlock(&s->lock);
    free(buf);
    return NULL;
}

static double soak_seconds(void)
{
    const char *v = getenv("KVPOOL_TEST_SOAK_S");
    if (v != NULL && v[0] != '\0') {
        char *end;
        double d = strtod(v, &end);
        if (*end == '\0' && d > 0)
            return d;
        fprintf(stderr, "ignoring KVPOOL_TEST_SOAK_S='%s' (want seconds > 0)\n", v);
    }
    return LT_ASAN ? 10.0 : 30.0;
}

static void soak(const char *transport)
{
    char *flags[] = {"--lease-ttl", "5", "--client-ttl", "60", NULL};
    env_t *e = env_start(flags, "256MiB");
    soak_t *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    pthread_mutex_init(&s->lock, NULL);
    for (unsigned i = 0; i < SOAK_SLOTS; i++) {
        s->pattern[i] = malloc(soak_len(i));
        assert_non_null(s->pattern[i]);
        kvp_fill_pattern(s->pattern[i], soak_len(i), 7000 + i);
    }
    for (unsigned i = 0; i <= SOAK_WORKERS; i++)
        s->clients[i] = env_client(e, transport);
    double secs = soak_seconds();
    uint64_t t0 = kvp_now_ms();
    s->deadline_ms = t0 + (uint64_t)(secs * 1000);
    soak_worker_t w[SOAK_WORKERS + 1];
    for (unsigned i = 0; i <= SOAK_WORKERS; i++) {
        w[i] = (soak_worker_t){.s = s, .id = i};
        assert_int_equal(pthread_create(&w[i].thread, NULL,
                                        i < SOAK_WORKERS ? soak_worker_main : soak_cross_main,
                                        &w[i]),
                         0);
    }
    for (unsigned i = 0; i <= SOAK_WORKERS; i++)
        pthread_join(w[i].thread, NULL);
    uint64_t took = kvp_now_ms() - t0;
    fprintf(stderr,
            "note: %s loop, %.0f s: %llu batches of %u (%.1f GiB read back, %.1f GiB/s), "
            "%llu concurrent gets (%llu found), %llu POOL_FULL\n",
            transport, took / 1000.0, (unsigned long long)s->iterations, SOAK_SLOTS,
            s->bytes / (double)(1ull << 30), s->bytes / (double)(1ull << 30) / (took / 1000.0),
            (unsigned long long)s->cross_reads, (unsigned long long)s->cross_found,
            (unsigned long long)s->pool_full);
    if (s->failure[0] != '\0')
        fail_msg("%s", s->failure);
    assert_int_equal(s->pool_full, 0);
    assert_true(s->iterations > 0);

    /* the pool ends empty at once: nothing pending, nothing waiting for a lease */
    int64_t waited = wait_used(e, 0, 1000);
    kvp_pool_stat_t *st = stat_of(e);
    if (waited < 0)
        fail_msg("pool used %llu bytes (%llu objects) 1 s after the last forced remove, want 0",
                 (unsigned long long)st->used, (unsigned long long)st->objects);
    assert_int_equal(st->objects, 0);
    assert_int_equal(st->pending, 0);
    assert_int_equal(st->evicted_objects, 0); /* freed extents came back: no eviction needed */
    kvp_pool_stat_free(st);
    for (unsigned i = 0; i < SOAK_SLOTS; i++)
        free(s->pattern[i]);
    pthread_mutex_destroy(&s->lock);
    free(s);
    env_stop(e);
}

static void test_full_speed_shm(void **state)
{
    (void)state;
    soak("shm");
}

static void test_full_speed_tcp(void **state)
{
    (void)state;
    soak("tcp");
}

/* ---- 4. a reader killed mid-read: the TTL is the safety net ---- */

static void test_reader_killed(void **state)
{
    (void)state;
    const uint64_t ttl_ms = 2000;
    char *flags[] = {"--lease-ttl", "2", "--client-ttl", "60", NULL};
    env_t *e = env_start(flags, "64MiB");
    const size_t len = 4 * MIB;
    put_pattern(e->admin, "k", len, 77);
    uint64_t used0 = used_of(e);

    freeze(e->seg.pid);
    char outp[128];
    env_path(e, "out.bin", outp, sizeof(outp));
    char *argv[] = {(char *)kvp_test_cli_bin(),
                    "--master",
                    e->master.ready,
                    "--transport",
                    "tcp",
                    "--timeout-ms",
                    "60000",
                    "get",
                    "k",
                    outp,
                    NULL};
    uint64_t t_spawn = kvp_now_ms();
    assert_int_equal(posix_spawn(&e->child, argv[0], NULL, NULL, argv, environ), 0);
    static const char *keys[] = {"k"};
    wait_leased(e, keys, 1, 10000);
    uint64_t t_seen = kvp_now_ms();

    int status = 0;
    assert_int_equal(kill(e->child, SIGKILL), 0);
    assert_int_equal(waitpid(e->child, &status, 0), e->child);
    e->child = 0;
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
        fail_msg("the CLI reader ended by itself before the kill (status %#x)", status);

    /* its lease outlives it until the TTL: plain removes are refused, the extent stays */
    unsigned refused = 0;
    uint64_t t_free;
    for (;;) {
        kvp_status_t st = kvp_remove(e->admin, "k");
        t_free = kvp_now_ms();
        if (st == KVP_OK)
            break;
        if (st != KVP_ERR_LEASED)
            fail_msg("plain remove while the dead reader's lease runs: %s", kvp_strerror(st));
        refused++;
        assert_int_equal(used_of(e), used0);
        if (t_free - t_spawn > ttl_ms + 10000)
            fail_msg("the dead reader's lease still blocks removes %llu ms later",
                     (unsigned long long)(t_free - t_spawn));
        sleep_ms(20);
    }
    fprintf(stderr,
            "note: the dead reader's lease ended %llu ms after the reader started, %llu "
            "ms after its lease was seen\n",
            (unsigned long long)(t_free - t_spawn), (unsigned long long)(t_free - t_seen));
    assert_true(refused > 0);
    /* granted after t_spawn and seen by t_seen: it ends in [t_spawn + ttl, t_seen + ttl] */
    assert_true(t_free - t_spawn >= ttl_ms * 9 / 10);
    assert_true(t_free - t_seen <= ttl_ms + 2000);
    assert_int_equal(used_of(e), 0);
    assert_int_equal(kvp_is_exist(e->admin, "k"), 0);
    struct stat sb;
    assert_int_not_equal(stat(outp, &sb), 0); /* the killed get left no partial file */

    thaw(e->seg.pid);
    put_pattern(e->admin, "k", len, 78);
    expect_pattern(e->admin, "k", len, 78);
    expect_remove(e->admin, "k", false, KVP_OK, "after a finished get");
    env_stop(e);
}

/* ---- 5. a full pool whose room is held by in-flight reads makes a put wait ---- */

#define FULL_OBJS 8

static void full_pool_waits(bool force_removed)
{
    /* eviction on, but only when a put does not fit: the pool can be exactly full */
    char *flags[] = {"--lease-ttl",
                     "20",
                     "--client-ttl",
                     "60",
                     "--evict-high-watermark",
                     "1",
                     "--evict-low-watermark",
                     "1",
                     NULL};
    env_t *e = env_start(flags, "8MiB");
    const size_t len = 1 * MIB;
    char keys[FULL_OBJS][16];
    const char *kp[FULL_OBJS];
    void *bufs[FULL_OBJS];
    size_t caps[FULL_OBJS];
    for (unsigned i = 0; i < FULL_OBJS; i++) {
        snprintf(keys[i], sizeof(keys[i]), "f%u", i);
        kp[i] = keys[i];
        put_pattern(e->admin, keys[i], len, 300 + i);
        bufs[i] = malloc(len);
        assert_non_null(bufs[i]);
        caps[i] = len;
    }
    kvp_pool_stat_t *s = stat_of(e);
    assert_int_equal(s->objects, FULL_OBJS);
    assert_int_equal(s->used, s->capacity); /* precondition: not one more byte fits */
    assert_int_equal(s->evicted_objects, 0);
    uint64_t cap = s->capacity;
    kvp_pool_stat_free(s);

    /* every object is being read: nothing can be evicted or freed until the reads end */
    freeze(e->seg.pid);
    bg_t *rd = start_reader(e, kp, bufs, caps, FULL_OBJS);
    wait_leased(e, kp, FULL_OBJS, 10000);
    if (force_removed) {
        kvp_status_t res[FULL_OBJS];
        assert_int_equal(kvp_batch_remove_force(e->admin, kp, FULL_OBJS, res), KVP_OK);
        uint64_t u = used_of(e);
        if (u != cap)
            fail_msg("used %llu bytes after force-removing %u objects being read, want %llu: "
                     "their extents must stay until the reads end",
                     (unsigned long long)u, FULL_OBJS, (unsigned long long)cap);
    }

    static const char *newkey[] = {"newcomer"};
    uint8_t *val = malloc(len);
    assert_non_null(val);
    kvp_fill_pattern(val, len, 999);
    static const size_t newlen[] = {1 * MIB};
    bg_t *wr = start_writer(e, newkey, val, newlen, NULL);
    /* the put may not fail while a finishing read can make room: watch it for a while */
    if (bg_wait(wr, 1500) && wr->rc == KVP_ERR_POOL_FULL)
        fail_msg("put into a pool full of objects under in-flight reads: %s, want it to "
                 "wait for the reads",
                 kvp_strerror(wr->rc));
    assert_false(atomic_load(&rd->done));

    thaw(e->seg.pid);
    assert_true(bg_wait(rd, 30000));
    assert_true(bg_wait(wr, 30000));
    if (wr->rc != KVP_OK)
        fail_msg("put once the reads ended: %s, want KVP_OK", kvp_strerror(wr->rc));
    for (unsigned i = 0; i < FULL_OBJS; i++) {
        uint8_t *want = malloc(len);
        kvp_fill_pattern(want, len, 300 + i);
        expect_bytes_or_clean_error(keys[i], rd->results[i], bufs[i], want, len);
        free(want);
    }
    expect_pattern(e->admin, "newcomer", len, 999);
    s = stat_of(e);
    if (force_removed) {
        /* the removed objects' extents went with their reads */
        assert_int_equal(s->objects, 1);
        assert_int_equal(s->used, len);
    } else {
        /* once the reads ended an old object was evicted for the newcomer */
        assert_int_equal(s->objects, FULL_OBJS);
        assert_int_equal(s->used, cap);
        assert_true(s->evicted_objects >= 1);
    }
    assert_int_equal(s->pending, 0);
    kvp_pool_stat_free(s);
    for (unsigned i = 0; i < FULL_OBJS; i++)
        free(bufs[i]);
    free(val);
    env_stop(e);
}

static void test_full_pool_waits_for_reads(void **state)
{
    (void)state;
    full_pool_waits(false);
}

static void test_full_pool_waits_for_removed_reads(void **state)
{
    (void)state;
    full_pool_waits(true);
}

/* ---- 6. upsert while the old value is being read ---- */

static void test_upsert_during_read(void **state)
{
    (void)state;
    char *flags[] = {"--lease-ttl", "20", "--client-ttl", "60", NULL};
    env_t *e = env_start(flags, "64MiB");
    const size_t len = 4 * MIB;
    uint8_t *old = malloc(len), *neu = malloc(len), *out = malloc(len);
    assert_non_null(old);
    assert_non_null(neu);
    assert_non_null(out);
    kvp_fill_pattern(old, len, 1);
    kvp_fill_pattern(neu, len, 2);
    assert_int_equal(kvp_put(e->admin, "u", old, len, NULL), KVP_OK);
    uint64_t used0 = used_of(e);

    freeze(e->seg.pid);
    static const char *keys[] = {"u"};
    void *bufs[] = {out};
    size_t caps[] = {len};
    bg_t *rd = start_reader(e, keys, bufs, caps, 1);
    wait_leased(e, keys, 1, 10000);

    /* same size, but being read: the new value must get an extent of its own (its
     * bytes then go to the frozen owner, so the upsert runs on a thread) */
    kvp_put_config_t up;
    kvp_put_config_init(&up);
    up.mode = KVP_PUT_UPSERT;
    bg_t *wr = start_writer(e, keys, neu, caps, &up);
    if (wait_used(e, 2 * used0, 10000) < 0)
        fail_msg("used %llu bytes during an upsert of a key being read, want %llu: the new "
                 "value must not be written over the extent under the reader",
                 (unsigned long long)used_of(e), (unsigned long long)(2 * used0));
    assert_false(atomic_load(&rd->done));

    thaw(e->seg.pid);
    assert_true(bg_wait(rd, 30000));
    assert_true(bg_wait(wr, 30000));
    assert_int_equal(wr->rc, KVP_OK);
    /* the old extent goes with its reader, not --lease-ttl (20 s) later */
    uint64_t ended = atomic_load(&rd->end_ms);
    if (atomic_load(&wr->end_ms) > ended)
        ended = atomic_load(&wr->end_ms);
    int64_t waited = wait_used(e, used0, 8000);
    int64_t after_end = (int64_t)(kvp_now_ms() - ended);
    if (waited < 0)
        fail_msg("used %llu bytes %lld ms after the upsert and the read ended, want %llu",
                 (unsigned long long)used_of(e), (long long)after_end, (unsigned long long)used0);
    assert_true(after_end < 5000);
    expect_bytes_or_clean_error("u", rd->results[0], out, old, len); /* the old value */
    expect_pattern(e->admin, "u", len, 2);
    expect_remove(e->admin, "u", false, KVP_OK, "after a finished get");
    free(old);
    free(neu);
    free(out);
    env_stop(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_get_then_remove_tcp, teardown),
        cmocka_unit_test_teardown(test_get_then_remove_shm, teardown),
        cmocka_unit_test_teardown(test_force_remove_during_read, teardown),
        cmocka_unit_test_teardown(test_reader_killed, teardown),
        cmocka_unit_test_teardown(test_full_pool_waits_for_reads, teardown),
        cmocka_unit_test_teardown(test_full_pool_waits_for_removed_reads, teardown),
        cmocka_unit_test_teardown(test_upsert_during_read, teardown),
        cmocka_unit_test_teardown(test_full_speed_shm, teardown),
        cmocka_unit_test_teardown(test_full_speed_tcp, teardown),
    };
    return cmocka_run_group_tests_name("leases", tests, NULL, NULL);
}
