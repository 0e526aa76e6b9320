/*
 * bench_tasks.c - kvpool-bench tasks: copy and move tasks (issue 47) on a cluster of its own.
 *
 * Per transport of --transport (default tcp,shm): a master and three `kvpool serve`
 * processes of --segment-size (default 1 GiB) on 127.0.0.1, every process of it and this
 * client on that transport ($KVPOOL_TRANSPORT). Per size of --sizes (default
 * 64KiB,1MiB,4MiB): N objects (256 MiB of them, 4096 at most) put on the first segment
 * (preferred_segment), in batches of 32, timed: the put rate, one client's writes to one
 * owner over that transport, is the baseline a copy is compared with (a copy is one owner's
 * writes to another). Then a copy task per object to the second segment, timed from the
 * first task seen started to the last seen SUCCESS (polled; the wait for the owner's
 * heartbeat, up to a second, is reported apart); then a move task per object from the first
 * segment to the third, timed the same way. Checked, or the run fails: every task SUCCESS, each
 * object's replicas where the tasks put them, and every object read back byte for byte
 * after the moves. The objects are removed before the next size.
 *
 * Then the hot-key fanout (the master runs with --hot-key-reads 200 --hot-key-replicas 2):
 * one 1 MiB object read back to back (each read checked) until it has its 2 more replicas,
 * timed from the first read, then left until they are taken back (run_fanout).
 *
 * Reported per point: put, copy and move GB/s and tasks/s, the copy's and the move's ratio
 * to the put rate, and for tcp the socket pump's limit of `kvpool-bench limits` (2 streams)
 * for that size. No target fails the run; a wrong byte or a failed task does.
 *
 * Thread: the caller's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/tools/bench/bench.h"

#define TASKS_BYTES (256ull << 20) /* per point: objects of this much */
#define TASKS_MAX 4096u
#define TASKS_BATCH 32u
#define TASKS_WAIT_S 120.0 /* a point's tasks all ended by then, or it fails */

typedef struct tpoint {
    double put_s, copy_s, move_s;        /* from the first started to the last ended */
    double copy_start_ms, move_start_ms; /* from the first created to the first started */
    uint64_t n, size;
} tpoint_t;

static void fill(uint8_t *p, uint64_t size, uint64_t i)
{
    uint64_t x = kvp_bench_mix64(i + 1);
    for (uint64_t k = 0; k + 8 <= size; k += 8) {
        x = kvp_bench_mix64(x);
        memcpy(p + k, &x, 8);
    }
}

/* Wait until every task of ids[0..n) ended; 0 when all succeeded. *start_p: when the first
 * one was seen started (the newest: the master offers the newest first), which is up to a
 * heartbeat (1 s) after its creation. */
static int wait_tasks(kvp_client_t *c, const kvp_task_id_t *ids, uint64_t n, const char *what,
                      double *start_p)
{
    double deadline = kvp_bench_now() + TASKS_WAIT_S;
    *start_p = 0;
    for (;;) {
        kvp_task_info_t info;
        if (kvp_query_task(c, ids[n - 1], &info) != KVP_OK || info.status != KVP_TASK_PENDING ||
            kvp_bench_now() > deadline)
            break;
        usleep(200);
    }
    *start_p = kvp_bench_now();
    uint64_t done = 0; /* ids[0..done) are over (tasks run newest first: polled from the end) */
    while (done < n) {
        kvp_task_info_t info;
        kvp_status_t st = kvp_query_task(c, ids[done], &info);
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench tasks: %s: query: %s\n", what, kvp_strerror(st));
            return -1;
        }
        if (info.status == KVP_TASK_FAILED) {
            fprintf(stderr, "kvpool-bench tasks: %s: a task failed: %s\n", what, info.message);
            return -1;
        }
        if (info.status == KVP_TASK_SUCCESS) {
            done++;
            continue;
        }
        if (kvp_bench_now() > deadline) {
            fprintf(stderr,
                    "kvpool-bench tasks: %s: %" PRIu64 " of %" PRIu64 " tasks ended in %.0f s\n",
                    what, done, n, TASKS_WAIT_S);
            return -1;
        }
        usleep(1000);
    }
    return 0;
}

/* The segment names of the pool (three at least): names[0..3). */
static int segment_names(kvp_client_t *c, char names[3][256])
{
    kvp_pool_stat_t *ps = NULL;
    kvp_status_t st = kvp_pool_stat(c, &ps);
    if (st != KVP_OK || ps == NULL || ps->n_segments < 3) {
        fprintf(stderr, "kvpool-bench tasks: stat: %s\n",
                st != KVP_OK ? kvp_strerror(st) : "fewer than 3 segments");
        kvp_pool_stat_free(ps);
        return -1;
    }
    for (int i = 0; i < 3; i++)
        snprintf(names[i], 256, "%s", ps->segments[i].name);
    kvp_pool_stat_free(ps);
    return 0;
}

/* One size on a running cluster: put, copy, move, check. */
static int run_point(kvp_client_t *c, char names[3][256], uint64_t size, tpoint_t *p)
{
    uint64_t n = TASKS_BYTES / size;
    n = n > TASKS_MAX ? TASKS_MAX : n < TASKS_BATCH ? TASKS_BATCH : n;
    p->n = n;
    p->size = size;
    uint8_t *buf = malloc(TASKS_BATCH * size), *back = malloc(size);
    char(*keys)[48] = calloc(n, sizeof(*keys));
    kvp_task_id_t *ids = calloc(n, sizeof(*ids));
    int rc = -1;
    if (buf == NULL || back == NULL || keys == NULL || ids == NULL)
        goto out;
    for (uint64_t i = 0; i < n; i++)
        snprintf(keys[i], sizeof(keys[i]), "bench-tasks/%" PRIu64 "/%" PRIu64, size, i);
    kvp_put_config_t cfg = {.size = sizeof(cfg), .replica_num = 1, .preferred_segment = names[0]};
    double t0;
    p->put_s = 0;
    for (uint64_t b = 0; b < n; b += TASKS_BATCH) {
        const char *k[TASKS_BATCH];
        const void *ptrs[TASKS_BATCH];
        size_t sizes[TASKS_BATCH];
        kvp_status_t res[TASKS_BATCH];
        uint64_t m = n - b < TASKS_BATCH ? n - b : TASKS_BATCH;
        for (uint64_t j = 0; j < m; j++) {
            fill(buf + j * size, size, b + j);
            k[j] = keys[b + j];
            ptrs[j] = buf + j * size;
            sizes[j] = size;
        }
        t0 = kvp_bench_now(); /* (the puts alone: not the making of their bytes) */
        kvp_status_t st = kvp_batch_put_from(c, k, ptrs, sizes, m, &cfg, res);
        p->put_s += kvp_bench_now() - t0;
        for (uint64_t j = 0; st == KVP_OK && j < m; j++)
            st = res[j];
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench tasks: put: %s\n", kvp_strerror(st));
            goto out;
        }
    }
    const char *copy_to[1] = {names[1]};
    t0 = kvp_bench_now();
    for (uint64_t i = 0; i < n; i++) {
        kvp_status_t st = kvp_create_copy_task(c, keys[i], copy_to, 1, &ids[i]);
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench tasks: copy: %s\n", kvp_strerror(st));
            goto out;
        }
    }
    double started;
    if (wait_tasks(c, ids, n, "copy", &started) != 0)
        goto out;
    p->copy_s = kvp_bench_now() - started;
    p->copy_start_ms = (started - t0) * 1e3;
    t0 = kvp_bench_now();
    for (uint64_t i = 0; i < n; i++) {
        kvp_status_t st = kvp_create_move_task(c, keys[i], names[0], names[2], &ids[i]);
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool-bench tasks: move: %s\n", kvp_strerror(st));
            goto out;
        }
    }
    if (wait_tasks(c, ids, n, "move", &started) != 0)
        goto out;
    p->move_s = kvp_bench_now() - started;
    p->move_start_ms = (started - t0) * 1e3;
    /* every object: its bytes, from the two replicas the tasks made (its first went) */
    for (uint64_t i = 0; i < n; i++) {
        fill(buf, size, i);
        int64_t got = kvp_get_into(c, keys[i], back, size);
        if (got != (int64_t)size || memcmp(back, buf, size) != 0) {
            fprintf(stderr, "kvpool-bench tasks: object %" PRIu64 " read back wrong (%s)\n", i,
                    got < 0 ? kvp_strerror((kvp_status_t)got) : "other bytes");
            goto out;
        }
    }
    kvp_pool_stat_t *ps = NULL;
    if (kvp_pool_stat(c, &ps) == KVP_OK && ps != NULL) {
        for (size_t s = 0; s < ps->n_segments; s++)
            if (strcmp(ps->segments[s].name, names[0]) == 0 && ps->segments[s].objects != 0) {
                fprintf(stderr,
                        "kvpool-bench tasks: %" PRIu64 " replicas left on the moves' source\n",
                        ps->segments[s].objects);
                kvp_pool_stat_free(ps);
                goto out;
            }
        kvp_pool_stat_free(ps);
    }
    rc = 0;
out:
    for (uint64_t i = 0; keys != NULL && i < n; i++)
        kvp_remove(c, keys[i]);
    free(buf);
    free(back);
    free(keys);
    free(ids);
    return rc;
}

/* ---- hot-key fanout (the master's --hot-key-reads) ---- */

#define FANOUT_READS 200u  /* the cluster's master: --hot-key-reads (reads in one window) */
#define FANOUT_REPLICAS 2u /* ... and --hot-key-replicas */
#define FANOUT_SIZE (1u << 20)
#define FANOUT_WAIT_S 15.0

typedef struct fpoint {
    double first_ms, all_ms, cool_ms; /* from the first read: 1 more replica, all; back to 1 */
    double reads_per_s;               /* the reader's rate meanwhile */
    unsigned replicas;                /* the most seen */
} fpoint_t;

static unsigned replicas_of(kvp_client_t *c, const char *key)
{
    char pattern[96];
    snprintf(pattern, sizeof(pattern), "^%s$", key);
    kvp_key_info_t *keys = NULL;
    size_t n = 0;
    unsigned r = 0;
    if (kvp_list_keys(c, pattern, 1, &keys, &n) == KVP_OK && n == 1)
        r = keys[0].n_replicas;
    kvp_key_list_free(keys, n);
    return r;
}

/*
 * One object put on the first segment, read back to back (every read checked byte for
 * byte) until the master has given it its FANOUT_REPLICAS more replicas, then left alone
 * until it has taken them back. Timed from the first read; fails on a wrong byte or when
 * the replicas do not come (or go) within FANOUT_WAIT_S.
 */
static int run_fanout(kvp_client_t *c, char names[3][256], fpoint_t *f)
{
    const char *key = "bench-tasks/hot";
    uint8_t *buf = malloc(FANOUT_SIZE), *back = malloc(FANOUT_SIZE);
    int rc = -1;
    memset(f, 0, sizeof(*f));
    if (buf == NULL || back == NULL)
        goto out;
    fill(buf, FANOUT_SIZE, 7);
    kvp_put_config_t cfg = {.size = sizeof(cfg), .replica_num = 1, .preferred_segment = names[0]};
    kvp_status_t st = kvp_put(c, key, buf, FANOUT_SIZE, &cfg);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool-bench tasks: fanout: put: %s\n", kvp_strerror(st));
        goto out;
    }
    double t0 = kvp_bench_now(), next_look = t0, end = t0 + FANOUT_WAIT_S;
    uint64_t reads = 0;
    f->replicas = 1;
    while (kvp_bench_now() < end) {
        int64_t got = kvp_get_into(c, key, back, FANOUT_SIZE);
        if (got != (int64_t)FANOUT_SIZE || memcmp(back, buf, FANOUT_SIZE) != 0) {
            fprintf(stderr, "kvpool-bench tasks: fanout: read back wrong (%s)\n",
                    got < 0 ? kvp_strerror((kvp_status_t)got) : "other bytes");
            goto out;
        }
        reads++;
        double now = kvp_bench_now();
        if (now < next_look)
            continue;
        next_look = now + 0.01;
        unsigned r = replicas_of(c, key);
        if (r > f->replicas)
            f->replicas = r;
        if (r >= 2 && f->first_ms == 0)
            f->first_ms = (now - t0) * 1e3;
        if (r >= 1 + FANOUT_REPLICAS) {
            f->all_ms = (now - t0) * 1e3;
            break;
        }
    }
    f->reads_per_s = (double)reads / (kvp_bench_now() - t0);
    if (f->all_ms == 0) {
        fprintf(stderr, "kvpool-bench tasks: fanout: %u replicas after %.0f s of %.0f reads/s\n",
                f->replicas, FANOUT_WAIT_S, f->reads_per_s);
        goto out;
    }
    double cool0 = kvp_bench_now();
    for (;;) {
        unsigned r = replicas_of(c, key);
        if (r == 1)
            break;
        if (kvp_bench_now() - cool0 > FANOUT_WAIT_S) {
            fprintf(stderr, "kvpool-bench tasks: fanout: %u replicas %.0f s after the reads\n", r,
                    FANOUT_WAIT_S);
            goto out;
        }
        usleep(10 * 1000);
    }
    f->cool_ms = (kvp_bench_now() - cool0) * 1e3;
    int64_t got = kvp_get_into(c, key, back, FANOUT_SIZE);
    if (got != (int64_t)FANOUT_SIZE || memcmp(back, buf, FANOUT_SIZE) != 0) {
        fprintf(stderr, "kvpool-bench tasks: fanout: read back wrong after it cooled\n");
        goto out;
    }
    rc = 0;
out:
    kvp_remove(c, key);
    free(buf);
    free(back);
    return rc;
}

static void report_fanout(kvp_bench_out_t *out, const char *transport, const fpoint_t *f)
{
    printf("  %-4s fanout: %u B read %.0f/s (--hot-key-reads %u): +1 replica after %.0f ms, "
           "+%u after %.0f ms; back to 1 %.0f ms after the reads stopped\n",
           transport, FANOUT_SIZE, f->reads_per_s, FANOUT_READS, f->first_ms, FANOUT_REPLICAS,
           f->all_ms, f->cool_ms);
    kvp_bench_result_begin(out, "tasks_fanout");
    kvp_bench_result_str(out, "transport", transport);
    kvp_bench_result_int(out, "size", FANOUT_SIZE);
    kvp_bench_result_int(out, "hot_key_reads", FANOUT_READS);
    kvp_bench_result_int(out, "hot_key_replicas", FANOUT_REPLICAS);
    kvp_bench_result_num(out, "reads_per_s", f->reads_per_s);
    kvp_bench_result_num(out, "first_replica_ms", f->first_ms);
    kvp_bench_result_num(out, "all_replicas_ms", f->all_ms);
    kvp_bench_result_num(out, "cool_ms", f->cool_ms);
    kvp_bench_result_end(out);
}

static void report(kvp_bench_out_t *out, const char *transport, const tpoint_t *p,
                   double limit_gbps)
{
    double bytes = (double)p->n * (double)p->size;
    double put = bytes / p->put_s / 1e9, copy = bytes / p->copy_s / 1e9,
           move = bytes / p->move_s / 1e9;
    printf("  %-4s %8" PRIu64 " B x %5" PRIu64 "  put %6.2f GB/s  copy %6.2f GB/s (%5.0f/s, %.2fx "
           "put)  move %6.2f GB/s (%.2fx put)",
           transport, p->size, p->n, put, copy, (double)p->n / p->copy_s, copy / put, move,
           move / put);
    if (limit_gbps > 0)
        printf("  tcp pump %.2f GB/s", limit_gbps);
    printf("  (first started after %.0f / %.0f ms)\n", p->copy_start_ms, p->move_start_ms);
    kvp_bench_result_begin(out, "tasks");
    kvp_bench_result_str(out, "transport", transport);
    kvp_bench_result_int(out, "size", (int64_t)p->size);
    kvp_bench_result_int(out, "objects", (int64_t)p->n);
    kvp_bench_result_num(out, "put_gbps", put);
    kvp_bench_result_num(out, "copy_gbps", copy);
    kvp_bench_result_num(out, "copy_tasks_per_s", (double)p->n / p->copy_s);
    kvp_bench_result_num(out, "move_gbps", move);
    kvp_bench_result_num(out, "move_tasks_per_s", (double)p->n / p->move_s);
    kvp_bench_result_num(out, "copy_ratio_to_put", copy / put);
    kvp_bench_result_num(out, "move_ratio_to_put", move / put);
    kvp_bench_result_num(out, "copy_start_ms", p->copy_start_ms);
    kvp_bench_result_num(out, "move_start_ms", p->move_start_ms);
    if (limit_gbps > 0)
        kvp_bench_result_num(out, "tcp_pump_gbps", limit_gbps);
    kvp_bench_result_end(out);
}

int kvp_bench_tasks(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    static const uint64_t def_sizes[] = {64u << 10, 1u << 20, 4u << 20};
    const uint64_t *sizes = o->n_sizes > 0 ? o->sizes : def_sizes;
    size_t n_sizes = o->n_sizes > 0 ? o->n_sizes : 3;
    static const char *def_transports[] = {"tcp", "shm"};
    const char *const *transports = o->n_transports > 0 ? o->transports : def_transports;
    size_t n_transports = o->n_transports > 0 ? o->n_transports : 2;
    uint64_t seg = o->segment_size_set ? o->segment_size : 1ull << 30;
    int rc = 0;
    printf("tasks: copy and move tasks, 3 segments of %" PRIu64 " MiB per transport\n", seg >> 20);
    for (size_t t = 0; t < n_transports; t++) {
        const char *tr = transports[t];
        if (strcmp(tr, "tcp") != 0 && strcmp(tr, "shm") != 0)
            continue; /* (rdma: the VM's runs) */
        for (size_t s = 0; strcmp(tr, "tcp") == 0 && s < n_sizes; s++)
            if (kvp_bench_limits_ensure(o, sizes[s], 2) != 0)
                return 1;
        setenv("KVPOOL_TRANSPORT", tr, 1); /* the serve processes', as ours */
        kvp_bench_cluster_t cl;
        /* hot keys on (nothing is read that often while the copies and moves run) */
        static const char *const hot_flags[] = {"--hot-key-reads", "200", "--hot-key-replicas", "2",
                                                NULL};
        kvp_bench_cluster_params_t cp = {.n = 3, .seg_size = seg, .master_flags = hot_flags};
        if (kvp_bench_cluster_start_params(&cl, &cp) != 0) {
            unsetenv("KVPOOL_TRANSPORT");
            return 1;
        }
        unsetenv("KVPOOL_TRANSPORT");
        kvp_client_params_t p;
        kvp_client_params_init(&p);
        p.master_addr = cl.master_addr;
        p.transport = tr;
        kvp_client_t *c = NULL;
        char names[3][256];
        kvp_status_t st = kvp_client_create(&p, &c);
        if (st != KVP_OK || segment_names(c, names) != 0) {
            fprintf(stderr, "kvpool-bench tasks: client: %s\n", kvp_strerror(st));
            rc = 1;
        }
        for (size_t s = 0; rc == 0 && s < n_sizes; s++) {
            tpoint_t pt;
            if (run_point(c, names, sizes[s], &pt) != 0) {
                rc = 1;
                break;
            }
            report(out, tr, &pt,
                   strcmp(tr, "tcp") == 0 ? kvp_bench_limit_tcp_gbps(sizes[s], 2) : 0);
        }
        fpoint_t fp;
        if (rc == 0 && run_fanout(c, names, &fp) != 0)
            rc = 1;
        else if (rc == 0)
            report_fanout(out, tr, &fp);
        kvp_client_destroy(c);
        kvp_bench_cluster_stop(&cl);
        if (rc != 0)
            break;
    }
    return rc;
}
