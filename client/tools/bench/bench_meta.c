/*
 * bench_meta.c - `kvpool-bench meta`: master metadata speed and footprint.
 *
 * DESIGN
 * Only the master is measured, so the bench talks raw control-plane RPC
 * (common/rpc.h + protobuf-c) and no object byte ever moves. One connection
 * mounts a large virtual segment (1 TiB of "dram" whose endpoint nobody
 * dials); every put names it as the preferred segment with one replica, so
 * extents land there even when real segments are mounted too. Closing that
 * connection at the end makes the master unmount the segment and drop every
 * object put here, which is the whole clean-up.
 *
 * For each resident count R (ascending): grow the population to R objects
 * of 4 KiB with PutStart+PutEnd batches of 128, read the master's RSS
 * (local cluster only) and report (RSS(R) - RSS(after mount)) / R, then
 * measure for duration_s each:
 *   put               PutStart+PutEnd of new keys; rounds of a few batches
 *                     per thread between barriers, and only the put part of a
 *                     round is timed: the keys are REMOVEd after each round so
 *                     residency stays within ~10% of R;
 *   exist             EXIST of 128 random resident keys;
 *   get_replica_list  GET_REPLICA_LIST of 128 random resident keys, whose read
 *                     leases are then handed back (LEASE_RELEASE, one-way), as
 *                     a client does after its transfers.
 * Then the cost of eviction: the virtual segment is unmounted (its objects
 * go), a small one (META_EVICT_SEG) is mounted, the pool is filled to 90 %
 * with 4 KiB objects and the plain put rate is timed there (put/remove
 * rounds, as above: nothing is evicted); then it is filled up and new keys
 * are put for duration_s: every put must evict one object first
 * ("put_evicting"). Both rates come from the same pool in the same state,
 * so `evict_ns_per_put` = 1/rate_evicting - 1/rate_put is what eviction
 * adds to a put (the master's loop being what limits both).
 * Object i's key is "model@tp_rank:0@pp_rank:0@group:0@" + 16 hex digits of a
 * 64-bit bijective mix of i (50 bytes), so any thread can name any resident
 * key without storing it. Keys for the put measurement use indices from
 * 2^40 up, disjoint from the population.
 *
 * Threads: several client threads, each with its own connection (a blocking
 * kvp_rpc_call per fd), so that on a small machine the client is not what
 * limits the master's single loop. The caller's thread mounts, starts the
 * workers per phase and joins them.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/tools/bench/bench.h"
#include "common/rpc.h"
#include "common/macros.h"
#include "common/sock.h"
#include "common/parse.h"
#include "common/rand.h"
#include "kvpool.pb-c.h"

#define META_BATCH 128u
#define META_OBJ_SIZE 4096u
#define META_SEG_SIZE (UINT64_C(1) << 40)
#define META_KEY_PREFIX "model@tp_rank:0@pp_rank:0@group:0@"
#define META_KEY_MAX 64u
#define META_PUT_BASE (UINT64_C(1) << 40)
#define META_RPC_TIMEOUT_MS 120000u
#define META_MAX_THREADS 64u
#define META_EVICT_SEG (UINT64_C(256) << 20) /* the eviction point's virtual segment */

typedef enum meta_task {
    TASK_FILL, /* put indices [lo, hi) of the population */
    TASK_PUT,  /* put/remove rounds of new keys */
    TASK_EXIST,
    TASK_GET,
    TASK_PUT_EVICT, /* puts of new keys into a full pool, timed as a whole */
} meta_task_t;

typedef struct meta_shared {
    const kvp_bench_opts_t *opts;
    const char *seg_name;
    meta_task_t task;
    unsigned threads;
    uint64_t resident; /* R: random reads draw from [0, R) */
    uint64_t range_lo; /* TASK_FILL */
    uint64_t range_hi;
    unsigned put_batches;      /* TASK_PUT: batches per thread per round */
    double deadline;           /* measured tasks stop here */
    pthread_mutex_t gate_lock; /* workers start once the barrier is set up */
    pthread_cond_t gate_cond;
    bool gate_open;
    pthread_barrier_t barrier; /* TASK_PUT rounds; counts the threads started */
    atomic_uint_fast64_t done; /* keys done (fill progress) */
    atomic_bool abort;
    bool stop;         /* TASK_PUT: decided by thread 0 between barriers */
    double put_time;   /* TASK_PUT: timed seconds, thread 0 */
    pid_t master_pid;  /* local master: its CPU is read around each task */
    double cpu_master; /* CPU seconds the master and this process used in the last task */
    double cpu_client;
    uint64_t put_keys;
} meta_shared_t;

typedef struct meta_worker {
    meta_shared_t *sh;
    unsigned id;
    kvp_chan_t *ch; /* TLS with --tls-dir */
    uint64_t req_id;
    uint64_t rng;
    uint64_t keys;   /* keys completed in the measured task */
    uint64_t misses; /* exist/get answers that did not find a resident key */
    kvp_status_t status;
    char keybuf[META_BATCH][META_KEY_MAX];
    ProtobufCBinaryData keys_pb[META_BATCH];
    uint64_t sizes[META_BATCH];
    uint32_t crcs[META_BATCH];
    uint8_t *req_buf;
    size_t req_cap;
    uint64_t lease_ids[META_BATCH];
    uint8_t rel_buf[16 + 8 * META_BATCH]; /* a packed LeaseReleaseRequest */
} meta_worker_t;

static size_t key_make(char *buf, uint64_t idx)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = sizeof(META_KEY_PREFIX) - 1;
    memcpy(buf, META_KEY_PREFIX, n);
    uint64_t h = kvp_bench_mix64(idx);
    for (int i = 15; i >= 0; i--) {
        buf[n + (size_t)i] = hex[h & 0xf];
        h >>= 4;
    }
    return n + 16;
}

static size_t key_len(void)
{
    return sizeof(META_KEY_PREFIX) - 1 + 16;
}

/* Fill the worker's key array with `n` keys of indices idx[0..n). */
static void keys_set(meta_worker_t *w, const uint64_t *idx, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        w->keys_pb[i].data = (uint8_t *)w->keybuf[i];
        w->keys_pb[i].len = key_make(w->keybuf[i], idx[i]);
    }
}

/* Keys of objects first .. first+n-1. */
static void keys_range(meta_worker_t *w, uint64_t first, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        w->keys_pb[i].data = (uint8_t *)w->keybuf[i];
        w->keys_pb[i].len = key_make(w->keybuf[i], first + i);
    }
}

/* Pack `msg`, call `method` on the worker's connection; *resp_p is malloc'd. */
static kvp_status_t call(meta_worker_t *w, uint16_t method, const ProtobufCMessage *msg,
                         uint8_t **resp_p, size_t *resp_len_p)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    if (n > w->req_cap) {
        uint8_t *b = realloc(w->req_buf, n);
        if (b == NULL)
            return KVP_ERR_NOMEM;
        w->req_buf = b;
        w->req_cap = n;
    }
    protobuf_c_message_pack(msg, w->req_buf);
    return kvp_rpc_chan_call(w->ch, method, ++w->req_id, w->req_buf, n, resp_p, resp_len_p);
}

/* KeysRequest method (EXIST, REMOVE, PUT_END via its own message) -> per-key statuses. */
static kvp_status_t call_statuses(meta_worker_t *w, uint16_t method, size_t n, int want,
                                  uint64_t *bad_p)
{
    uint8_t *resp = NULL;
    size_t len = 0;
    kvp_status_t st;
    if (method == KVP_RPC_PUT_END) {
        Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
        req.n_keys = n;
        req.keys = w->keys_pb;
        req.n_crc32c = n;
        req.crc32c = w->crcs;
        st = call(w, method, &req.base, &resp, &len);
    } else {
        Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
        req.n_keys = n;
        req.keys = w->keys_pb;
        st = call(w, method, &req.base, &resp, &len);
    }
    if (st != KVP_OK)
        return st;
    Kvpool__StatusesResponse *r = kvpool__statuses_response__unpack(NULL, len, resp);
    free(resp);
    if (r == NULL)
        return KVP_ERR_PROTOCOL;
    st = r->status;
    if (st == KVP_OK && r->n_statuses != n)
        st = KVP_ERR_PROTOCOL;
    uint64_t bad = 0;
    for (size_t i = 0; st == KVP_OK && i < n; i++)
        if (r->statuses[i] != want)
            bad++;
    kvpool__statuses_response__free_unpacked(r, NULL);
    if (st == KVP_OK && bad_p != NULL)
        *bad_p += bad;
    else if (st == KVP_OK && bad > 0)
        st = KVP_ERR_INTERNAL;
    return st;
}

/* PutStart + PutEnd of the keys already in the worker's key array. */
static kvp_status_t put_batch(meta_worker_t *w, size_t n)
{
    Kvpool__PutConfig cfg = KVPOOL__PUT_CONFIG__INIT;
    cfg.replica_num = 1;
    cfg.preferred_segment = (char *)w->sh->seg_name;
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    req.n_keys = n;
    req.keys = w->keys_pb;
    req.n_sizes = n;
    req.sizes = w->sizes;
    req.config = &cfg;
    uint8_t *resp = NULL;
    size_t len = 0;
    kvp_status_t st = call(w, KVP_RPC_PUT_START, &req.base, &resp, &len);
    if (st != KVP_OK)
        return st;
    Kvpool__PutStartResponse *r = kvpool__put_start_response__unpack(NULL, len, resp);
    free(resp);
    if (r == NULL)
        return KVP_ERR_PROTOCOL;
    st = r->status;
    if (st == KVP_OK && r->n_results != n)
        st = KVP_ERR_PROTOCOL;
    for (size_t i = 0; st == KVP_OK && i < n; i++)
        st = r->results[i]->status;
    kvpool__put_start_response__free_unpacked(r, NULL);
    if (st != KVP_OK)
        return st;
    return call_statuses(w, KVP_RPC_PUT_END, n, KVP_OK, NULL);
}

static kvp_status_t get_batch(meta_worker_t *w, size_t n)
{
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.n_keys = n;
    req.keys = w->keys_pb;
    uint8_t *resp = NULL;
    size_t len = 0;
    kvp_status_t st = call(w, KVP_RPC_GET_REPLICA_LIST, &req.base, &resp, &len);
    if (st != KVP_OK)
        return st;
    Kvpool__GetReplicaListResponse *r = kvpool__get_replica_list_response__unpack(NULL, len, resp);
    free(resp);
    if (r == NULL)
        return KVP_ERR_PROTOCOL;
    st = r->status;
    if (st == KVP_OK && r->n_results != n)
        st = KVP_ERR_PROTOCOL;
    size_t nl = 0;
    for (size_t i = 0; st == KVP_OK && i < n; i++) {
        if (r->results[i]->status != KVP_OK || r->results[i]->n_replicas == 0)
            w->misses++;
        else if (r->results[i]->lease_id != 0)
            w->lease_ids[nl++] = r->results[i]->lease_id;
    }
    kvpool__get_replica_list_response__free_unpacked(r, NULL);
    if (st == KVP_OK && nl > 0) {
        /* the "transfer" is over: hand the leases back, no answer to wait for */
        Kvpool__LeaseReleaseRequest rel = KVPOOL__LEASE_RELEASE_REQUEST__INIT;
        rel.lease_ids = w->lease_ids;
        rel.n_lease_ids = nl;
        size_t len = kvpool__lease_release_request__pack(&rel, w->rel_buf);
        st = kvp_rpc_chan_send(w->ch, KVP_RPC_LEASE_RELEASE, ++w->req_id, w->rel_buf, len);
    }
    return st;
}

/* Population indices [lo, hi) this worker owns: a contiguous slice. */
static void slice(const meta_shared_t *sh, unsigned id, uint64_t *lo_p, uint64_t *hi_p)
{
    uint64_t span = sh->range_hi - sh->range_lo;
    *lo_p = sh->range_lo + span * id / sh->threads;
    *hi_p = sh->range_lo + span * (id + 1) / sh->threads;
}

static void fail(meta_worker_t *w, kvp_status_t st)
{
    if (w->status == KVP_OK)
        w->status = st;
    atomic_store(&w->sh->abort, true);
}

static void run_fill(meta_worker_t *w)
{
    meta_shared_t *sh = w->sh;
    uint64_t lo, hi;
    slice(sh, w->id, &lo, &hi);
    double next_report = kvp_bench_now() + 0.5, t0 = kvp_bench_now();
    uint64_t start_done = atomic_load(&sh->done);
    for (uint64_t i = lo; i < hi && !atomic_load(&sh->abort);) {
        size_t n = (size_t)KVP_MIN((uint64_t)META_BATCH, hi - i);
        keys_range(w, i, n);
        kvp_status_t st = put_batch(w, n);
        if (st != KVP_OK) {
            fail(w, st);
            break;
        }
        i += n;
        uint64_t done = atomic_fetch_add(&sh->done, n) + n;
        double now;
        if (w->id == 0 && (now = kvp_bench_now()) >= next_report) {
            double total = (double)(sh->range_hi - sh->range_lo);
            kvp_bench_progress(sh->opts, "meta: filling %" PRIu64 "/%.0f objects, %.0f objects/s",
                               done, total, (double)(done - start_done) / (now - t0));
            next_report = now + 0.5;
        }
    }
}

/* Rounds of put_batches puts per thread (timed between barriers), then removes. */
static void run_put(meta_worker_t *w)
{
    meta_shared_t *sh = w->sh;
    uint64_t base = META_PUT_BASE + ((uint64_t)w->id << 36), seq = 0;
    for (;;) {
        pthread_barrier_wait(&sh->barrier);
        double t0 = kvp_bench_now();
        uint64_t first = seq;
        for (unsigned b = 0; b < sh->put_batches && !atomic_load(&sh->abort); b++) {
            keys_range(w, base + seq, META_BATCH);
            kvp_status_t st = put_batch(w, META_BATCH);
            if (st != KVP_OK) {
                fail(w, st);
                break;
            }
            seq += META_BATCH;
        }
        pthread_barrier_wait(&sh->barrier);
        if (w->id == 0)
            sh->put_time += kvp_bench_now() - t0;
        w->keys += seq - first;
        for (uint64_t s = first; s < seq && !atomic_load(&sh->abort); s += META_BATCH) {
            keys_range(w, base + s, META_BATCH);
            kvp_status_t st = call_statuses(w, KVP_RPC_REMOVE, META_BATCH, KVP_OK, NULL);
            if (st != KVP_OK)
                fail(w, st);
        }
        pthread_barrier_wait(&sh->barrier);
        if (w->id == 0)
            sh->stop = atomic_load(&sh->abort) || kvp_bench_now() >= sh->deadline;
        pthread_barrier_wait(&sh->barrier);
        if (sh->stop)
            break;
    }
}

/* New keys, put back to back until the deadline (the pool is full: each evicts one). */
static void run_put_evict(meta_worker_t *w)
{
    meta_shared_t *sh = w->sh;
    uint64_t base = META_PUT_BASE + ((uint64_t)w->id << 36) + (UINT64_C(1) << 35), seq = 0;
    while (!atomic_load(&sh->abort) && kvp_bench_now() < sh->deadline) {
        keys_range(w, base + seq, META_BATCH);
        kvp_status_t st = put_batch(w, META_BATCH);
        if (st != KVP_OK) {
            fail(w, st);
            break;
        }
        seq += META_BATCH;
        w->keys += META_BATCH;
    }
}

static void run_read(meta_worker_t *w, bool get)
{
    meta_shared_t *sh = w->sh;
    uint64_t idx[META_BATCH];
    while (!atomic_load(&sh->abort) && kvp_bench_now() < sh->deadline) {
        for (size_t k = 0; k < META_BATCH; k++)
            idx[k] = kvp_rng_next(&w->rng) % sh->resident;
        keys_set(w, idx, META_BATCH);
        kvp_status_t st = get ? get_batch(w, META_BATCH)
                              : call_statuses(w, KVP_RPC_EXIST, META_BATCH, 1, &w->misses);
        if (st != KVP_OK) {
            fail(w, st);
            break;
        }
        w->keys += META_BATCH;
    }
}

static void *worker_main(void *arg)
{
    meta_worker_t *w = arg;
    pthread_mutex_lock(&w->sh->gate_lock);
    while (!w->sh->gate_open)
        pthread_cond_wait(&w->sh->gate_cond, &w->sh->gate_lock);
    pthread_mutex_unlock(&w->sh->gate_lock);
    switch (w->sh->task) {
    case TASK_FILL:
        run_fill(w);
        break;
    case TASK_PUT:
        run_put(w);
        break;
    case TASK_EXIST:
        run_read(w, false);
        break;
    case TASK_GET:
        run_read(w, true);
        break;
    case TASK_PUT_EVICT:
        run_put_evict(w);
        break;
    }
    return NULL;
}

/* Run the shared task on every worker; returns the wall time, or < 0 on failure. */
static double run_task(meta_shared_t *sh, meta_worker_t *ws, meta_task_t task)
{
    pthread_t tid[META_MAX_THREADS];
    sh->task = task;
    sh->stop = false;
    sh->put_time = 0;
    atomic_store(&sh->done, 0);
    for (unsigned i = 0; i < sh->threads; i++) {
        ws[i].keys = 0;
        ws[i].misses = 0;
    }
    sh->gate_open = false;
    unsigned started = 0;
    for (; started < sh->threads; started++)
        if (pthread_create(&tid[started], NULL, worker_main, &ws[started]) != 0)
            break;
    bool short_handed = started < sh->threads;
    if (short_handed) {
        /* the ones started see abort and return at once */
        fprintf(stderr, "kvpool-bench meta: cannot start %u client threads\n", sh->threads);
        atomic_store(&sh->abort, true);
    }
    if (started > 0)
        pthread_barrier_init(&sh->barrier, NULL, started);
    double m0 = sh->master_pid > 0 ? kvp_bench_cpu_s(sh->master_pid) : -1;
    double c0 = kvp_bench_cpu_s(0);
    double t0 = kvp_bench_now();
    pthread_mutex_lock(&sh->gate_lock);
    sh->gate_open = true;
    pthread_cond_broadcast(&sh->gate_cond);
    pthread_mutex_unlock(&sh->gate_lock);
    for (unsigned i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    if (started > 0)
        pthread_barrier_destroy(&sh->barrier);
    if (short_handed)
        return -1;
    double dt = kvp_bench_now() - t0;
    double m1 = m0 >= 0 ? kvp_bench_cpu_s(sh->master_pid) : -1;
    sh->cpu_master = m0 >= 0 && m1 >= 0 ? m1 - m0 : -1;
    sh->cpu_client = kvp_bench_cpu_s(0) - c0;
    for (unsigned i = 0; i < sh->threads; i++) {
        if (ws[i].status != KVP_OK) {
            fprintf(stderr, "kvpool-bench meta: client thread %u failed: %s\n", i,
                    kvp_strerror(ws[i].status));
            return -1;
        }
    }
    return dt;
}

static kvp_status_t mount(kvp_chan_t *ch, const char *name, uint64_t size, uint64_t *seg_id_p)
{
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.name = (char *)name;
    d.medium = "dram";
    d.size = size;
    d.host_id = "bench";
    d.tcp_endpoint = "127.0.0.1:1";
    d.shm_path = "";
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = kvp_random_u64();
    req.segment = &d;
    size_t n = kvpool__mount_request__get_packed_size(&req);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL)
        return KVP_ERR_NOMEM;
    kvpool__mount_request__pack(&req, buf);
    uint8_t *resp = NULL;
    size_t len = 0;
    kvp_status_t st = kvp_rpc_chan_call(ch, KVP_RPC_MOUNT, 1, buf, n, &resp, &len);
    free(buf);
    if (st != KVP_OK)
        return st;
    Kvpool__MountResponse *r = kvpool__mount_response__unpack(NULL, len, resp);
    free(resp);
    if (r == NULL)
        return KVP_ERR_PROTOCOL;
    st = r->status;
    if (st != KVP_OK)
        fprintf(stderr, "kvpool-bench meta: mount refused: %s (%s)\n", kvp_strerror(st),
                r->message);
    else
        *seg_id_p = r->segment_id;
    kvpool__mount_response__free_unpacked(r, NULL);
    return st;
}

/* The mounting connection is otherwise idle: heartbeat on it so that the master's
 * --client-ttl does not take the virtual segment away mid-run. */
typedef struct pinger {
    kvp_chan_t *ch;
    atomic_bool stop;
    pthread_t thread;
    bool started;
} pinger_t;

static void *pinger_main(void *arg)
{
    pinger_t *p = arg;
    uint64_t req_id = 1ull << 40;
    while (!atomic_load(&p->stop)) {
        for (int i = 0; i < 20 && !atomic_load(&p->stop); i++)
            usleep(50 * 1000);
        uint8_t *resp = NULL;
        size_t rlen;
        if (kvp_rpc_chan_call(p->ch, KVP_RPC_HEARTBEAT, ++req_id, NULL, 0, &resp, &rlen) == KVP_OK)
            free(resp);
    }
    return NULL;
}

static int connect_master(const char *addr, kvp_chan_t **ch_p)
{
    *ch_p = kvp_bench_dial(addr, META_RPC_TIMEOUT_MS); /* TLS with --tls-dir */
    return *ch_p != NULL ? 0 : -1;
}

static uint64_t sum_keys(const meta_worker_t *ws, unsigned n, uint64_t *misses_p);

/* Unmount the big virtual segment (its objects go with it), mount a small one, time plain
 * puts in the pool filled to 90 % (*plain_p), then fill it up and time puts that each evict.
 * Runs with the pinger stopped (it shares the mounting connection). Returns the evicting
 * put rate, or < 0 on failure. */
static double evict_point(meta_shared_t *sh, meta_worker_t *ws, kvp_chan_t *mount_ch,
                          uint64_t seg_id, const char *name, double *plain_p)
{
    Kvpool__UnmountRequest ur = KVPOOL__UNMOUNT_REQUEST__INIT;
    ur.segment_id = seg_id;
    uint8_t body[32], *resp = NULL;
    size_t len = kvpool__unmount_request__pack(&ur, body), rlen = 0;
    if (kvp_rpc_chan_call(mount_ch, KVP_RPC_UNMOUNT, 2, body, len, &resp, &rlen) != KVP_OK)
        return -1;
    free(resp);
    uint64_t id;
    if (mount(mount_ch, name, META_EVICT_SEG, &id) != KVP_OK)
        return -1;
    /* the whole pool: real segments of a local cluster count too */
    if (kvp_rpc_chan_call(mount_ch, KVP_RPC_STAT, 3, NULL, 0, &resp, &rlen) != KVP_OK)
        return -1;
    Kvpool__StatResponse *st = kvpool__stat_response__unpack(NULL, rlen, resp);
    free(resp);
    if (st == NULL)
        return -1;
    uint64_t fill = (st->capacity - st->used) / META_OBJ_SIZE;
    kvpool__stat_response__free_unpacked(st, NULL);
    double dur = sh->opts->duration_s > 0 ? sh->opts->duration_s : 2.0;
    uint64_t part = fill / 10 * 9;
    sh->seg_name = name;
    sh->resident = part;
    sh->range_lo = 0;
    sh->range_hi = part;
    kvp_bench_progress(sh->opts, "meta: filling the pool to 90 %% (%" PRIu64 " objects)", part);
    if (run_task(sh, ws, TASK_FILL) < 0)
        return -1;
    /* plain puts: rounds that stay within the 10 % left, removed after each round */
    uint64_t per_round = (fill - part) / 2 / ((uint64_t)META_BATCH * sh->threads);
    sh->put_batches = (unsigned)KVP_MAX(UINT64_C(1), KVP_MIN(per_round, UINT64_C(64)));
    sh->deadline = kvp_bench_now() + dur;
    if (run_task(sh, ws, TASK_PUT) < 0 || sh->put_time <= 0)
        return -1;
    uint64_t misses;
    *plain_p = (double)sum_keys(ws, sh->threads, &misses) / sh->put_time;
    sh->resident = fill;
    sh->range_lo = part;
    sh->range_hi = fill;
    kvp_bench_progress(sh->opts, "meta: filling the pool up (%" PRIu64 " objects)", fill);
    if (run_task(sh, ws, TASK_FILL) < 0)
        return -1;
    sh->deadline = kvp_bench_now() + dur;
    double dt = run_task(sh, ws, TASK_PUT_EVICT);
    kvp_bench_progress_done(sh->opts);
    if (dt <= 0)
        return -1;
    return (double)sum_keys(ws, sh->threads, &misses) / dt;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Print and record one figure. Returns -1 (message on stderr) when resident keys were
 * not found: the master lost objects, an error. */
static int report(kvp_bench_out_t *out, const meta_shared_t *sh, const char *op, double kps,
                  double bpo, long long rss, double fill_kps, uint64_t misses, uint64_t keys)
{
    /* CPU per 1000 keys over the whole task (put: its removes too), master and this process */
    double mk = keys && sh->cpu_master >= 0 ? sh->cpu_master * 1e9 / (double)keys : -1;
    double ck = keys ? sh->cpu_client * 1e9 / (double)keys : -1;
    printf("%10" PRIu64 " %-16s %12.0f %12.1f %8zu %8u %12.0f %10.0f %10.0f%s\n", sh->resident, op,
           kps, bpo, key_len(), sh->threads, fill_kps, mk, ck,
           misses ? "  <- keys not found!" : "");
    kvp_bench_result_begin(out, "meta");
    kvp_bench_result_str(out, "op", op);
    kvp_bench_result_str(out, "tls", kvp_bench_tls_on() ? "on" : "off");
    kvp_bench_result_int(out, "objects_resident", (int64_t)sh->resident);
    kvp_bench_result_num(out, "keys_per_s", kps);
    kvp_bench_result_num(out, "bytes_per_object", bpo);
    kvp_bench_result_int(out, "key_bytes", (int64_t)key_len());
    kvp_bench_result_int(out, "master_rss_bytes", rss);
    kvp_bench_result_int(out, "object_size", META_OBJ_SIZE);
    kvp_bench_result_int(out, "batch", META_BATCH);
    kvp_bench_result_int(out, "threads", sh->threads);
    kvp_bench_result_num(out, "fill_keys_per_s", fill_kps);
    kvp_bench_result_int(out, "misses", (int64_t)misses);
    kvp_bench_result_num(out, "master_cpu_us_per_1k_keys", mk);
    kvp_bench_result_num(out, "client_cpu_us_per_1k_keys", ck);
    kvp_bench_result_end(out);
    if (misses == 0)
        return 0;
    fprintf(stderr,
            "kvpool-bench meta: %s: %" PRIu64 " of the resident keys asked for were not found\n",
            op, misses);
    return -1;
}

static uint64_t sum_keys(const meta_worker_t *ws, unsigned n, uint64_t *misses_p)
{
    uint64_t k = 0, m = 0;
    for (unsigned i = 0; i < n; i++) {
        k += ws[i].keys;
        m += ws[i].misses;
    }
    *misses_p = m;
    return k;
}

/* kvp_bench_meta's run: the shared state, the workers and the mounting connection. */
typedef struct meta_run {
    const kvp_bench_opts_t *o;
    kvp_bench_out_t *out;
    meta_shared_t sh;
    meta_worker_t *ws;
    kvp_chan_t *mount_ch; /* mounts the virtual segment; the master drops it when this closes */
    pinger_t pinger;
    uint64_t seg_id;
    char seg_name[64];
    double dur;     /* per point */
    pid_t mpid;     /* a local master, or <= 0 */
    long long rss0; /* its RSS before the fill; -1: unknown */
    bool bad;       /* a figure found keys missing */
} meta_run_t;

/* The resident object counts asked for (0s dropped), ascending; their number. */
static size_t meta_counts(const kvp_bench_opts_t *o, uint64_t counts[KVP_BENCH_MAX_LIST])
{
    size_t n_counts = 0;
    for (size_t i = 0; i < o->n_meta_objects; i++)
        if (o->meta_objects[i] > 0)
            counts[n_counts++] = o->meta_objects[i];
    qsort(counts, n_counts, sizeof(counts[0]), cmp_u64);
    return n_counts;
}

/* Connect, mount the virtual segment (heartbeats on its connection from the pinger) and give
 * each worker its connection. *connect_us_p: what a connection costs (TCP, and the TLS 1.3
 * handshake with --tls-dir). 0, or -1. */
static int meta_connect(meta_run_t *m, double *connect_us_p)
{
    const kvp_bench_opts_t *o = m->o;
    if (connect_master(o->master, &m->mount_ch) != 0)
        return -1;
    *connect_us_p = kvp_bench_connect_us(o->master, 50);
    if (mount(m->mount_ch, m->seg_name, META_SEG_SIZE, &m->seg_id) != KVP_OK) {
        fprintf(stderr, "kvpool-bench meta: cannot mount the virtual segment %s\n", m->seg_name);
        return -1;
    }
    m->pinger.ch = m->mount_ch;
    m->pinger.started = pthread_create(&m->pinger.thread, NULL, pinger_main, &m->pinger) == 0;
    for (unsigned i = 0; i < m->sh.threads; i++) {
        meta_worker_t *w = &m->ws[i];
        w->sh = &m->sh;
        w->id = i;
        w->rng = kvp_bench_mix64(0x5EED0000u + i) | 1;
        for (size_t k = 0; k < META_BATCH; k++)
            w->sizes[k] = META_OBJ_SIZE;
        if (connect_master(o->master, &w->ch) != 0)
            return -1;
    }
    return 0;
}

/* The run's header lines and the connect figure. */
static void meta_header(meta_run_t *m, double connect_us)
{
    printf("master metadata: %u client threads (one connection each), batches of %u, %u-byte "
           "objects on virtual segment %s, %zu-byte keys, %.1f s per point\n",
           m->sh.threads, META_BATCH, META_OBJ_SIZE, m->seg_name, key_len(), m->dur);
    if (m->rss0 < 0)
        printf("master RSS unknown (not a local master): bytes/object reported as -1\n");
    printf("a connection to the master (TCP%s): %.0f us (median of 50)\n",
           kvp_bench_tls_on() ? " and the TLS 1.3 handshake" : "", connect_us);
    kvp_bench_result_begin(m->out, "meta");
    kvp_bench_result_str(m->out, "op", "connect");
    kvp_bench_result_str(m->out, "tls", kvp_bench_tls_on() ? "on" : "off");
    kvp_bench_result_num(m->out, "connect_us", connect_us);
    kvp_bench_result_end(m->out);
    printf("%10s %-16s %12s %12s %8s %8s %12s %10s %10s\n", "resident", "op", "keys/s", "B/object",
           "key B", "threads", "fill keys/s", "master us", "client us");
    printf("(us: CPU per 1000 keys, the master's and this process's)\n");
}

/* The figures of one resident count: put rounds that keep the extra residency within ~10% of
 * it, then exist and get_replica_list of resident keys, for the duration each. 0, or -1 when
 * a task failed. */
static int meta_point(meta_run_t *m, double bpo, long long rss, double fill_kps)
{
    meta_shared_t *sh = &m->sh;
    uint64_t r = sh->resident, misses;
    uint64_t per_round = r / 10 / ((uint64_t)META_BATCH * sh->threads);
    sh->put_batches = (unsigned)KVP_MAX(UINT64_C(1), KVP_MIN(per_round, UINT64_C(64)));
    kvp_bench_progress(m->o, "meta: %" PRIu64 " resident: put", r);
    sh->deadline = kvp_bench_now() + m->dur;
    if (run_task(sh, m->ws, TASK_PUT) < 0)
        return -1;
    kvp_bench_progress_done(m->o);
    uint64_t k = sum_keys(m->ws, sh->threads, &misses);
    m->bad |= report(m->out, sh, "put", sh->put_time > 0 ? (double)k / sh->put_time : 0, bpo, rss,
                     fill_kps, misses, k) != 0;
    static const struct {
        meta_task_t task;
        const char *op;
    } reads[] = {{TASK_EXIST, "exist"}, {TASK_GET, "get_replica_list"}};
    for (size_t i = 0; i < sizeof(reads) / sizeof(reads[0]); i++) {
        kvp_bench_progress(m->o, "meta: %" PRIu64 " resident: %s", r, reads[i].op);
        sh->deadline = kvp_bench_now() + m->dur;
        double dt = run_task(sh, m->ws, reads[i].task);
        kvp_bench_progress_done(m->o);
        if (dt < 0)
            return -1;
        k = sum_keys(m->ws, sh->threads, &misses);
        m->bad |=
            report(m->out, sh, reads[i].op, (double)k / dt, bpo, rss, fill_kps, misses, k) != 0;
    }
    fflush(stdout);
    return 0;
}

/* Fill the pool from *resident_p up to r objects, then measure meta_point there. 0, or -1. */
static int meta_resident(meta_run_t *m, uint64_t r, uint64_t *resident_p)
{
    meta_shared_t *sh = &m->sh;
    uint64_t resident = *resident_p;
    sh->resident = r;
    sh->range_lo = resident;
    sh->range_hi = r;
    double fill_kps = 0;
    if (r > resident) {
        double dt = run_task(sh, m->ws, TASK_FILL);
        kvp_bench_progress_done(m->o);
        if (dt < 0)
            return -1;
        fill_kps = (double)(r - resident) / dt;
        if (fill_kps < 200e3)
            fprintf(stderr,
                    "kvpool-bench meta: filling ran at %.0f objects/s (%" PRIu64
                    " objects in %.1f s)\n",
                    fill_kps, r - resident, dt);
    }
    *resident_p = r;
    long long rss = m->rss0 >= 0 ? kvp_bench_rss_bytes(m->mpid) : -1;
    double bpo = rss >= 0 && m->rss0 >= 0 ? (double)(rss - m->rss0) / (double)r : -1.0;
    return meta_point(m, bpo, rss, fill_kps);
}

/* The eviction point: a full pool where every put evicts one object first (the pinger is
 * stopped: evict_point uses its connection). 0, or -1. */
static int meta_evict(meta_run_t *m)
{
    meta_shared_t *sh = &m->sh;
    atomic_store(&m->pinger.stop, true);
    pthread_join(m->pinger.thread, NULL);
    m->pinger.started = false;
    char evict_name[80];
    snprintf(evict_name, sizeof(evict_name), "%s-evict", m->seg_name);
    double plain = 0;
    double ev = evict_point(sh, m->ws, m->mount_ch, m->seg_id, evict_name, &plain);
    if (ev < 0) {
        fprintf(stderr, "kvpool-bench meta: the eviction point failed\n");
        return -1;
    }
    double cost_ns = plain > 0 && ev > 0 ? 1e9 / ev - 1e9 / plain : -1;
    uint64_t misses_ev;
    uint64_t keys_ev = sum_keys(m->ws, sh->threads, &misses_ev);
    m->bad |= report(m->out, sh, "put_evicting", ev, -1, -1, 0, misses_ev, keys_ev) != 0;
    printf("eviction: %.0f puts/s into a full pool of %" PRIu64 " objects (every put evicts one) "
           "vs %.0f puts/s into the same pool at 90 %% (no eviction): %.0f ns of eviction per "
           "put\n",
           ev, sh->resident, plain, cost_ns);
    kvp_bench_result_begin(m->out, "meta");
    kvp_bench_result_str(m->out, "op", "evict_cost");
    kvp_bench_result_int(m->out, "objects_resident", (int64_t)sh->resident);
    kvp_bench_result_num(m->out, "put_evicting_per_s", ev);
    kvp_bench_result_num(m->out, "put_per_s", plain);
    kvp_bench_result_int(m->out, "put_objects_resident", (int64_t)(sh->resident / 10 * 9));
    kvp_bench_result_num(m->out, "evict_ns_per_put", cost_ns);
    kvp_bench_result_end(m->out);
    return 0;
}

int kvp_bench_meta(const kvp_bench_opts_t *o, kvp_bench_out_t *out)
{
    if (o->master == NULL) {
        fprintf(stderr, "kvpool-bench meta: needs --master HOST:PORT or --local\n");
        return 1;
    }
    uint64_t counts[KVP_BENCH_MAX_LIST];
    size_t n_counts = meta_counts(o, counts);
    if (n_counts == 0) {
        fprintf(stderr, "kvpool-bench meta: no resident object counts given\n");
        return 1;
    }
    meta_run_t m = {.o = o,
                    .out = out,
                    .sh = {.opts = o,
                           .gate_lock = PTHREAD_MUTEX_INITIALIZER,
                           .gate_cond = PTHREAD_COND_INITIALIZER},
                    .pinger = {.ch = NULL},
                    .dur = o->duration_s > 0 ? o->duration_s : 2.0};
    m.sh.threads = o->threads > 1 ? o->threads : 2;
    if (m.sh.threads > META_MAX_THREADS)
        m.sh.threads = META_MAX_THREADS;
    snprintf(m.seg_name, sizeof(m.seg_name), "bench-meta-%ld", (long)getpid());
    m.sh.seg_name = m.seg_name;

    int rc = 1;
    m.ws = calloc(m.sh.threads, sizeof(*m.ws));
    if (m.ws == NULL) {
        fprintf(stderr, "kvpool-bench meta: out of memory\n");
        return 1;
    }
    double connect_us = 0;
    if (meta_connect(&m, &connect_us) != 0)
        goto out;
    m.mpid = kvp_bench_master_pid();
    m.rss0 = m.mpid > 0 ? kvp_bench_rss_bytes(m.mpid) : -1;
    m.sh.master_pid = m.mpid;
    meta_header(&m, connect_us);
    uint64_t resident = 0;
    for (size_t c = 0; c < n_counts; c++)
        if (meta_resident(&m, counts[c], &resident) != 0)
            goto out;
    if (meta_evict(&m) != 0)
        goto out;
    rc = m.bad ? 1 : 0;
out:
    if (m.pinger.started) {
        atomic_store(&m.pinger.stop, true);
        pthread_join(m.pinger.thread, NULL);
    }
    kvp_bench_progress_done(o);
    for (unsigned i = 0; i < m.sh.threads; i++) {
        kvp_chan_close(m.ws[i].ch);
        free(m.ws[i].req_buf);
    }
    /* The master unmounts the segment and drops its objects when this closes. */
    kvp_chan_close(m.mount_ch);
    free(m.ws);
    return rc;
}
