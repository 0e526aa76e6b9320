/*
 * test_ssd.c - the SSD tier against real processes and real files on the
 * machine's disk (a directory under the build directory: never tmpfs, which
 * has no O_DIRECT): a kvpool-master, `kvpool serve` with a DRAM segment and
 * one with an SSD segment (--ssd-path), this process as the client (tcp).
 *
 * - fill 4x the DRAM capacity with 64 KiB and 1 MiB objects: every one reads
 *   back byte-exact, some of them from SSD (offloaded, counted);
 * - promotion: objects first read from SSD are served from DRAM afterwards;
 * - kill -9 of the SSD owner, restart on the same path: every object that
 *   had reached SSD reads back byte-exact; a removed one stays gone after the
 *   next restart; one overwritten while the owner was down reads the new value;
 * - kill -9 of the master: after its restart, SSD objects read back again;
 * - bytes corrupted in the file behind its owner's back: KVP_ERR_CHECKSUM,
 *   never the bytes;
 * - kill -9 of the SSD owner while offloads are in flight (frozen first, so
 *   they are): no object that was in DRAM is lost, every read is byte-exact;
 * - an I/O error on one extent: that object is reported lost and leaves the
 *   pool, the segment keeps serving the others.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/include/kvpool.h"
#include "common/clock.h"
#include "tests/harness.h"

#define DRAM_SIZE "8MiB"
#define SSD_SIZE "96MiB"

typedef struct env {
    kvp_proc_t master;
    kvp_proc_t dram; /* kvpool serve: the DRAM segment */
    kvp_proc_t ssd;  /* kvpool serve --segment-size 0 --ssd-path */
    kvp_client_t *client;
    char dir[256];
    char path[320];
    char master_addr[512];
    char http[32]; /* the master's --http-listen (its /metrics) */
    int http_port;
} env_t;

static env_t *g_env;

/* `kvpool serve` of an SSD segment (the env's file) and no DRAM one, into argv[14]; with
 * a ready fd (3) for kvp_proc_start, or without one for kvp_run. */
static void ssd_argv(env_t *e, char *argv[14], bool ready_fd)
{
    char *const a[] = {(char *)kvp_test_cli_bin(),
                       "--master",
                       e->master_addr,
                       "serve",
                       "--segment-size",
                       "0",
                       "--ssd-path",
                       e->path,
                       "--ssd-size",
                       SSD_SIZE,
                       ready_fd ? "--ready-fd" : NULL,
                       "3",
                       NULL};
    memcpy(argv, a, sizeof(a));
}

static bool start_ssd(env_t *e)
{
    char *argv[14];
    ssd_argv(e, argv, true);
    return kvp_proc_start(&e->ssd, argv, 20000);
}

static bool start_master(env_t *e, bool same_addr)
{
    char *extra[] = {"--listen", e->master_addr, "--http-listen", e->http, NULL};
    return kvp_start_master_args(&e->master, same_addr ? extra : extra + 2);
}

/* Every SSD task the master has handed out answered (kvpool_ssd_tasks 0): the owner has
 * recorded the puts straight to SSD and forgotten the removed objects in its file, so a
 * kill -9 of owner or master keeps what the test expects. */
static void wait_ssd_tasks_done(env_t *e)
{
    uint64_t deadline = kvp_now_ms() + 10000;
    double n;
    while ((n = kvp_http_metric(e->http_port, "kvpool_ssd_tasks")) != 0 && kvp_now_ms() < deadline)
        usleep(10 * 1000);
    if (n != 0)
        fail_msg("kvpool_ssd_tasks still %.0f after 10 s", n);
}

static env_t *env_start(void)
{
    env_t *e = calloc(1, sizeof(*e));
    assert_non_null(e);
    snprintf(e->dir, sizeof(e->dir), "ssdtest.XXXXXX");
    assert_non_null(mkdtemp(e->dir));
    snprintf(e->path, sizeof(e->path), "%s/segment.kvpssd", e->dir);
    e->http_port = kvp_etcd_free_port();
    snprintf(e->http, sizeof(e->http), "127.0.0.1:%d", e->http_port);
    assert_true(start_master(e, false));
    snprintf(e->master_addr, sizeof(e->master_addr), "%s", e->master.ready);
    assert_true(kvp_start_segment(&e->dram, e->master_addr, DRAM_SIZE, "auto"));
    assert_true(start_ssd(e));
    kvp_client_params_t p;
    kvp_client_params_init(&p);
    p.master_addr = e->master_addr;
    p.transport = "tcp";
    assert_int_equal(kvp_client_create(&p, &e->client), KVP_OK);
    g_env = e;
    return e;
}

static int teardown(void **state)
{
    (void)state;
    env_t *e = g_env;
    if (e == NULL)
        return 0;
    kvp_client_destroy(e->client);
    kvp_proc_stop(&e->ssd, SIGTERM, 10000);
    kvp_proc_stop(&e->dram, SIGTERM, 10000);
    kvp_proc_stop(&e->master, SIGTERM, 10000);
    unlink(e->path);
    rmdir(e->dir);
    free(e);
    g_env = NULL;
    return 0;
}

static kvp_pool_stat_t stat_now(env_t *e)
{
    kvp_pool_stat_t *ps = NULL;
    assert_int_equal(kvp_pool_stat(e->client, &ps), KVP_OK);
    kvp_pool_stat_t copy = *ps;
    copy.segments = NULL;
    copy.n_segments = 0;
    kvp_pool_stat_free(ps);
    return copy;
}

static void key_of(char *buf, size_t len, const char *prefix, unsigned i)
{
    snprintf(buf, len, "%s-%05u", prefix, i);
}

static size_t size_of(unsigned i)
{
    return i % 4 == 3 ? (1u << 20) : (64u << 10); /* 64 KiB and 1 MiB objects */
}

/* Put n objects (prefix-i, seed base+i); returns how many were stored. */
static unsigned put_all(env_t *e, const char *prefix, unsigned n, uint64_t base, const char *medium)
{
    uint8_t *buf = malloc(1u << 20);
    assert_non_null(buf);
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    cfg.medium = medium;
    unsigned ok = 0;
    for (unsigned i = 0; i < n; i++) {
        char key[64];
        key_of(key, sizeof(key), prefix, i);
        kvp_fill_pattern(buf, size_of(i), base + i);
        kvp_status_t st = kvp_put(e->client, key, buf, size_of(i), &cfg);
        if (st != KVP_OK)
            fprintf(stderr, "put %s: %s (%s)\n", key, kvp_strerror(st), kvp_client_last_error());
        ok += st == KVP_OK;
    }
    free(buf);
    return ok;
}

/* Get prefix-i and compare with seed base+i; the status. */
static kvp_status_t get_check(env_t *e, const char *prefix, unsigned i, uint64_t base)
{
    char key[64];
    key_of(key, sizeof(key), prefix, i);
    size_t size = size_of(i);
    uint8_t *want = malloc(size), *got = malloc(size);
    assert_non_null(want);
    assert_non_null(got);
    kvp_fill_pattern(want, size, base + i);
    memset(got, 0xEE, size);
    int64_t n = kvp_get_into(e->client, key, got, size);
    kvp_status_t st = n < 0 ? (kvp_status_t)n : KVP_OK;
    if (st == KVP_OK) {
        assert_int_equal(n, (int64_t)size);
        if (memcmp(want, got, size) != 0)
            fail_msg("%s: wrong bytes", key);
    }
    free(want);
    free(got);
    return st;
}

/* Medium of key's replicas: bit 0 DRAM, bit 1 SSD; -1 when absent. */
static int medium_of(env_t *e, const char *key)
{
    kvp_key_info_t *keys = NULL;
    size_t n = 0;
    char re[96];
    snprintf(re, sizeof(re), "^%s$", key);
    assert_int_equal(kvp_list_keys(e->client, re, 2, &keys, &n), KVP_OK);
    kvp_pool_stat_t *ps = NULL;
    assert_int_equal(kvp_pool_stat(e->client, &ps), KVP_OK);
    int m = n == 1 ? 0 : -1;
    for (uint32_t r = 0; n == 1 && r < keys[0].n_replicas; r++)
        for (size_t g = 0; g < ps->n_segments; g++)
            if (ps->segments[g].id == keys[0].segment_ids[r])
                m |= strcmp(ps->segments[g].medium, "ssd") == 0 ? 2 : 1;
    kvp_pool_stat_free(ps);
    kvp_key_list_free(keys, n);
    return m;
}

/* Wait until no offload is in flight (and at least `want` were offloaded). */
static void wait_offloads(env_t *e, uint64_t want)
{
    uint64_t deadline = kvp_now_ms() + 20000;
    for (;;) {
        kvp_pool_stat_t s = stat_now(e);
        if (s.offloading_objects == 0 && s.offloaded_objects >= want)
            return;
        if (kvp_now_ms() > deadline)
            fail_msg("offloads did not settle: %llu in flight, %llu done",
                     (unsigned long long)s.offloading_objects,
                     (unsigned long long)s.offloaded_objects);
        usleep(50 * 1000);
    }
}

/* Wait until the SSD segment is mounted and has adopted at least `want` objects. */
static void wait_adopted(env_t *e, uint64_t want)
{
    uint64_t deadline = kvp_now_ms() + 20000;
    for (;;) {
        kvp_pool_stat_t s = stat_now(e);
        if (s.ssd_capacity > 0 && s.adopted_objects >= want)
            return;
        if (kvp_now_ms() > deadline)
            fail_msg("SSD segment did not come back: capacity %llu, adopted %llu (want %llu)",
                     (unsigned long long)s.ssd_capacity, (unsigned long long)s.adopted_objects,
                     (unsigned long long)want);
        usleep(50 * 1000);
    }
}

/* 8 MiB of DRAM, 32 MiB of objects (4x): 64 KiB and 1 MiB, all read back. */
static unsigned fill_count(void)
{
    /* objects until 4x the DRAM capacity */
    uint64_t bytes = 0;
    unsigned n = 0;
    while (bytes < 4ull * (8u << 20))
        bytes += size_of(n++);
    return n;
}

static void test_fill_4x_dram_reads_back_exact(void **state)
{
    (void)state;
    env_t *e = env_start();
    /* a second owner of the same file is refused while the first lives */
    char *argv[14];
    ssd_argv(e, argv, false);
    char out[256];
    assert_true(kvp_run(argv, NULL, out, sizeof(out), 20000) != 0);
    unsigned n = fill_count();
    assert_int_equal(put_all(e, "fill", n, 1000, NULL), n);
    wait_offloads(e, 1);
    kvp_pool_stat_t before = stat_now(e);
    assert_true(before.offloaded_objects > 0);
    assert_int_equal(before.offload_dropped, 0); /* SSD had room: nothing left the pool */
    unsigned on_ssd = 0;
    for (unsigned i = 0; i < n; i++) {
        char key[64];
        key_of(key, sizeof(key), "fill", i);
        on_ssd += medium_of(e, key) == 2;
    }
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(get_check(e, "fill", i, 1000), KVP_OK);
    kvp_pool_stat_t after = stat_now(e);
    uint64_t from_ssd = after.hits_ssd - before.hits_ssd;
    printf("fill: %u objects (%u on SSD only before the reads), %llu read from SSD, %llu from "
           "DRAM, %llu offloaded\n",
           n, on_ssd, (unsigned long long)from_ssd,
           (unsigned long long)(after.hits_dram - before.hits_dram),
           (unsigned long long)after.offloaded_objects);
    assert_true(on_ssd > 0);
    assert_true(from_ssd >= on_ssd / 2); /* the reads found them there (some promoted meanwhile) */
    assert_int_equal(from_ssd + after.hits_dram - before.hits_dram, n);
}

static void test_promotion_brings_hot_set_back_to_dram(void **state)
{
    (void)state;
    env_t *e = env_start();
    unsigned n = fill_count();
    assert_int_equal(put_all(e, "hot", n, 2000, NULL), n);
    wait_offloads(e, 1);
    /* a hot set: the first 4 objects on SSD only */
    unsigned hot[4], nh = 0;
    for (unsigned i = 0; i < n && nh < 4; i++) {
        char key[64];
        key_of(key, sizeof(key), "hot", i);
        if (medium_of(e, key) == 2 && size_of(i) == (64u << 10))
            hot[nh++] = i;
    }
    assert_int_equal(nh, 4);
    /* make room in DRAM: promotion only uses free room */
    for (unsigned i = 0; i < n; i++) {
        char key[64];
        key_of(key, sizeof(key), "hot", i);
        if (medium_of(e, key) & 1)
            assert_int_equal(kvp_remove(e->client, key), KVP_OK);
    }
    kvp_pool_stat_t s0 = stat_now(e);
    for (unsigned h = 0; h < nh; h++)
        assert_int_equal(get_check(e, "hot", hot[h], 2000), KVP_OK);
    kvp_pool_stat_t s1 = stat_now(e);
    assert_int_equal(s1.hits_ssd - s0.hits_ssd, nh);
    uint64_t deadline = kvp_now_ms() + 10000;
    while (stat_now(e).promoted_objects < s0.promoted_objects + nh && kvp_now_ms() < deadline)
        usleep(50 * 1000);
    assert_true(stat_now(e).promoted_objects >= s0.promoted_objects + nh);
    for (unsigned h = 0; h < nh; h++) {
        char key[64];
        key_of(key, sizeof(key), "hot", hot[h]);
        assert_int_equal(medium_of(e, key), 3); /* both tiers now */
        assert_int_equal(get_check(e, "hot", hot[h], 2000), KVP_OK);
    }
    kvp_pool_stat_t s2 = stat_now(e);
    assert_int_equal(s2.hits_dram - s1.hits_dram, nh); /* served from DRAM */
    assert_int_equal(s2.hits_ssd, s1.hits_ssd);
}

static void test_owner_kill9_restart_keeps_ssd_objects(void **state)
{
    (void)state;
    env_t *e = env_start();
    const unsigned n = 24;
    assert_int_equal(put_all(e, "keep", n, 3000, "ssd"), n); /* straight to SSD */
    wait_ssd_tasks_done(e); /* RECORD tasks: the owner has recorded them */
    for (unsigned i = 0; i < n; i++) {
        char key[64];
        key_of(key, sizeof(key), "keep", i);
        assert_int_equal(medium_of(e, key), 2);
    }
    kvp_proc_kill9(&e->ssd);
    /* gone with its owner: not readable, not listed */
    uint64_t deadline = kvp_now_ms() + 5000;
    while (stat_now(e).ssd_capacity > 0 && kvp_now_ms() < deadline)
        usleep(20 * 1000);
    assert_int_equal(get_check(e, "keep", 0, 3000), KVP_ERR_NOT_FOUND);
    /* overwrite one while the owner is down (into DRAM) */
    assert_int_equal(put_all(e, "keep", 1, 9000, NULL), 1); /* keep-00000, new value */
    uint64_t adopted0 = stat_now(e).adopted_objects;
    assert_true(start_ssd(e));
    wait_adopted(e, adopted0 + n - 1);
    assert_int_equal(get_check(e, "keep", 0, 9000), KVP_OK); /* the new value won */
    for (unsigned i = 1; i < n; i++)
        assert_int_equal(get_check(e, "keep", i, 3000), KVP_OK);
    /* remove one, restart again: it stays gone */
    char key[64];
    key_of(key, sizeof(key), "keep", 5);
    assert_int_equal(kvp_remove(e->client, key), KVP_OK);
    wait_ssd_tasks_done(e); /* the owner has forgotten it (FORGET task) */
    kvp_proc_kill9(&e->ssd);
    deadline = kvp_now_ms() + 5000;
    while (stat_now(e).ssd_capacity > 0 && kvp_now_ms() < deadline)
        usleep(20 * 1000);
    /* and one removed while the owner is down stays gone too (it may still be in DRAM:
     * the reads above promoted the objects they found on SSD) */
    key_of(key, sizeof(key), "keep", 6);
    kvp_status_t rs = kvp_remove(e->client, key);
    assert_true(rs == KVP_OK || rs == KVP_ERR_NOT_FOUND);
    adopted0 = stat_now(e).adopted_objects;
    assert_true(start_ssd(e));
    wait_adopted(e, adopted0 + n - 3);
    assert_int_equal(get_check(e, "keep", 5, 3000), KVP_ERR_NOT_FOUND);
    assert_int_equal(get_check(e, "keep", 6, 3000), KVP_ERR_NOT_FOUND);
    assert_int_equal(get_check(e, "keep", 0, 9000), KVP_OK);
    for (unsigned i = 1; i < n; i++)
        if (i != 5 && i != 6)
            assert_int_equal(get_check(e, "keep", i, 3000), KVP_OK);
}

static void test_master_kill9_ssd_objects_come_back(void **state)
{
    (void)state;
    env_t *e = env_start();
    const unsigned n = 16;
    assert_int_equal(put_all(e, "mk", n, 4000, "ssd"), n);
    wait_ssd_tasks_done(e);
    kvp_proc_kill9(&e->master);
    assert_true(start_master(e, true));
    wait_adopted(e, n);
    for (unsigned i = 0; i < n; i++) {
        kvp_status_t st = get_check(e, "mk", i, 4000);
        if (st != KVP_OK)
            fail_msg("mk-%05u after the master's restart: %s (%s)", i, kvp_strerror(st),
                     kvp_client_last_error());
    }
}

/* Flip a byte of the object whose bytes start with `head` in the file. */
static void corrupt_in_file(const char *path, const uint8_t *head, size_t head_len)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    uint8_t *buf = malloc(1u << 20);
    assert_non_null(buf);
    bool done = false;
    for (off_t at = 0; at < sb.st_size && !done; at += 1 << 20) {
        ssize_t r = pread(fd, buf, 1u << 20, at);
        assert_true(r > 0);
        for (ssize_t i = 0; i + (ssize_t)head_len <= r && !done; i += 4096) {
            if (memcmp(buf + i, head, head_len) != 0)
                continue;
            uint8_t b = buf[i + 100] ^ 0x5a;
            assert_int_equal(pwrite(fd, &b, 1, at + i + 100), 1);
            done = true;
        }
    }
    assert_true(done);
    fsync(fd);
    close(fd);
    free(buf);
}

static void test_corrupt_file_gives_checksum_error(void **state)
{
    (void)state;
    env_t *e = env_start();
    assert_int_equal(put_all(e, "bad", 2, 5000, "ssd"), 2);
    wait_ssd_tasks_done(e);
    uint8_t head[256];
    kvp_fill_pattern(head, sizeof(head), 5000); /* bad-00000's first bytes */
    corrupt_in_file(e->path, head, sizeof(head));
    assert_int_equal(get_check(e, "bad", 0, 5000), KVP_ERR_CHECKSUM);
    assert_int_equal(get_check(e, "bad", 1, 5001 - 1), KVP_OK); /* the other is intact */
}

/* An I/O error on one extent (the file cut short behind its owner's back, so reading that
 * extent fails): the get fails, the object is reported lost and leaves the pool, the
 * segment keeps serving the others. */
static void test_io_error_loses_that_object_only(void **state)
{
    (void)state;
    env_t *e = env_start();
    assert_int_equal(put_all(e, "eio", 3, 7000, "ssd"), 3);
    wait_ssd_tasks_done(e);
    /* the header's data base (bytes 40..47) and the extents of the three 64 KiB objects */
    int fd = open(e->path, O_RDWR);
    assert_true(fd >= 0);
    uint64_t base = 0;
    assert_int_equal(pread(fd, &base, sizeof(base), 40), (ssize_t)sizeof(base));
    assert_true(base >= 8192 && base % 4096 == 0);
    kvp_key_info_t *keys = NULL;
    size_t n = 0;
    assert_int_equal(kvp_list_keys(e->client, "^eio-", 8, &keys, &n), KVP_OK);
    assert_int_equal(n, 3);
    kvp_key_list_free(keys, n);
    /* the objects went to the first extents: cut the file after the second one */
    assert_int_equal(ftruncate(fd, (off_t)(base + 2 * (64u << 10))), 0);
    close(fd);
    kvp_status_t st = get_check(e, "eio", 2, 7000);
    assert_true(st != KVP_OK);
    uint64_t deadline = kvp_now_ms() + 5000;
    while (stat_now(e).ssd_lost_objects == 0 && kvp_now_ms() < deadline)
        usleep(50 * 1000);
    assert_int_equal(stat_now(e).ssd_lost_objects, 1);
    assert_int_equal(get_check(e, "eio", 2, 7000), KVP_ERR_NOT_FOUND);
    assert_int_equal(get_check(e, "eio", 0, 7000), KVP_OK);
    assert_int_equal(get_check(e, "eio", 1, 7000), KVP_OK);
}

/* Indexes i whose objects are 64 KiB (size_of), up to a total of `bytes`. */
static unsigned small_until(uint64_t bytes, unsigned *idx, unsigned cap)
{
    unsigned n = 0;
    uint64_t total = 0;
    for (unsigned i = 0; n < cap && total + (64u << 10) <= bytes; i++)
        if (size_of(i) == (64u << 10)) {
            idx[n++] = i;
            total += 64u << 10;
        }
    return n;
}

static void test_owner_kill9_mid_offload_loses_nothing(void **state)
{
    (void)state;
    env_t *e = env_start();
    /* the owner frozen: the offloads it is sent stay in flight */
    assert_true(kvp_proc_freeze(e->ssd.pid, 5000));
    /* 97 % of DRAM: past the offload watermark (95 %), so offloads begin, without a put
     * ever needing room (none waits for the frozen owner) */
    unsigned idx[256];
    unsigned n = small_until((uint64_t)(0.97 * (8u << 20)), idx, 256);
    uint8_t *buf = malloc(64u << 10);
    assert_non_null(buf);
    for (unsigned j = 0; j < n; j++) {
        char key[64];
        key_of(key, sizeof(key), "mid", idx[j]);
        kvp_fill_pattern(buf, 64u << 10, 6000 + idx[j]);
        assert_int_equal(kvp_put(e->client, key, buf, 64u << 10, NULL), KVP_OK);
    }
    free(buf);
    kvp_pool_stat_t s = stat_now(e);
    printf("mid-offload: %u objects, %llu offloads in flight at the kill\n", n,
           (unsigned long long)s.offloading_objects);
    assert_true(s.offloading_objects > 0);
    /* the gauge counts the offloads the frozen owner has not answered */
    assert_true(kvp_http_metric(e->http_port, "kvpool_ssd_tasks") >= (double)s.offloading_objects);
    kvp_proc_kill9(&e->ssd);
    uint64_t deadline = kvp_now_ms() + 5000;
    while (stat_now(e).ssd_capacity > 0 && kvp_now_ms() < deadline)
        usleep(20 * 1000);
    s = stat_now(e);
    assert_int_equal(s.offloading_objects, 0);
    assert_true(kvp_http_metric(e->http_port, "kvpool_ssd_tasks") == 0); /* ended with it */
    assert_int_equal(s.objects, n); /* nothing that was in DRAM is lost */
    for (unsigned j = 0; j < n; j++)
        assert_int_equal(get_check(e, "mid", idx[j], 6000), KVP_OK);
    /* back on the same path: whatever it recorded before dying is offered again, and
     * everything still reads exact */
    assert_true(start_ssd(e));
    wait_adopted(e, 0);
    for (unsigned j = 0; j < n; j++)
        assert_int_equal(get_check(e, "mid", idx[j], 6000), KVP_OK);
    /* no victim was dropped for want of SSD room, not even while the restarted owner was
     * adopting (no SSD segment took replicas then: eviction waits for the offer's end) */
    s = stat_now(e);
    assert_int_equal(s.offload_dropped, 0);
    assert_int_equal(s.objects, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_fill_4x_dram_reads_back_exact, teardown),
        cmocka_unit_test_teardown(test_promotion_brings_hot_set_back_to_dram, teardown),
        cmocka_unit_test_teardown(test_owner_kill9_restart_keeps_ssd_objects, teardown),
        cmocka_unit_test_teardown(test_master_kill9_ssd_objects_come_back, teardown),
        cmocka_unit_test_teardown(test_corrupt_file_gives_checksum_error, teardown),
        cmocka_unit_test_teardown(test_owner_kill9_mid_offload_loses_nothing, teardown),
        cmocka_unit_test_teardown(test_io_error_loses_that_object_only, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
