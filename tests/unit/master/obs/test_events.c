/*
 * test_events.c - master/obs/events.c against real ZeroMQ sockets on
 * 127.0.0.1 (ephemeral ports): a SUB socket and a DEALER replay client in
 * the test, batches decoded with msgpack-c.
 *
 * A SUB socket hears nothing until its subscription reached the publisher;
 * rather than sleeping, each test publishes "cleared" events on the disk
 * medium until the first one arrives, waits until every one of them is sent
 * (the counters) and drains them: from then on every batch is heard.
 *
 * Tenants: keys TENANT 0x1f KEY are pushed as the master's loop pushes them
 * with an ACL; with CURVE (key pairs made here with zmq_curve_keypair, files
 * in a temporary folder) the test's sockets are CURVE clients, and a
 * tenant's subscriber, a "*" one, one asking for another tenant's topic and
 * one without CURVE are compared.
 *
 * To hold the publisher thread still (a slow or stalled publisher), this
 * binary defines zmq_send, which the static master library's calls bind to:
 * it passes to libzmq's (dlsym RTLD_NEXT) and, on threads other than the
 * test's own, waits while the gate is closed.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <msgpack.h>
#include <zmq.h>

#include "master/obs/events.h"

/* ---- the gate in front of the publisher's zmq_send ------------------------------------------ */

static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static bool gate_closed;
static int gate_waiting;
static pthread_t test_thread;

int zmq_send(void *s, const void *buf, size_t len, int flags)
{
    static int (*real)(void *, const void *, size_t, int);
    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "zmq_send");
    if (!pthread_equal(pthread_self(), test_thread)) {
        pthread_mutex_lock(&gate_lock);
        while (gate_closed) {
            gate_waiting++;
            pthread_cond_broadcast(&gate_cond);
            pthread_cond_wait(&gate_cond, &gate_lock);
            gate_waiting--;
        }
        pthread_mutex_unlock(&gate_lock);
    }
    return real(s, buf, len, flags);
}

static void gate_close(void)
{
    pthread_mutex_lock(&gate_lock);
    gate_closed = true;
    pthread_mutex_unlock(&gate_lock);
}

/* Wait until the publisher is held at the gate. */
static void gate_wait_held(void)
{
    pthread_mutex_lock(&gate_lock);
    while (gate_waiting == 0)
        pthread_cond_wait(&gate_cond, &gate_lock);
    pthread_mutex_unlock(&gate_lock);
}

static void gate_open(void)
{
    pthread_mutex_lock(&gate_lock);
    gate_closed = false;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_lock);
}

/* ---- helpers -------------------------------------------------------------------------------- */

static void *zctx;

static void pause_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static kvp_events_t *make_events(kvp_events_params_t *p)
{
    p->bind = "tcp://127.0.0.1:*";
    if (p->replay_bind == NULL)
        p->replay_bind = "tcp://127.0.0.1:*";
    kvp_events_t *ev = NULL;
    char err[256] = "";
    kvp_status_t st = kvp_events_create(p, &ev, err, sizeof(err));
    if (st != KVP_OK)
        fail_msg("kvp_events_create: %d %s", st, err);
    assert_non_null(ev);
    assert_true(strncmp(kvp_events_endpoint(ev, 0), "tcp://127.0.0.1:", 16) == 0);
    return ev;
}

static void *sub_open(kvp_events_t *ev)
{
    void *sub = zmq_socket(zctx, ZMQ_SUB);
    assert_non_null(sub);
    int timeout = 5000, linger = 0;
    assert_int_equal(zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout, sizeof(timeout)), 0);
    assert_int_equal(zmq_setsockopt(sub, ZMQ_LINGER, &linger, sizeof(linger)), 0);
    assert_int_equal(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
    assert_int_equal(zmq_connect(sub, kvp_events_endpoint(ev, 0)), 0);
    return sub;
}

static void *dealer_open(kvp_events_t *ev)
{
    void *d = zmq_socket(zctx, ZMQ_DEALER);
    assert_non_null(d);
    int timeout = 5000, linger = 0;
    assert_int_equal(zmq_setsockopt(d, ZMQ_RCVTIMEO, &timeout, sizeof(timeout)), 0);
    assert_int_equal(zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger)), 0);
    assert_int_equal(zmq_connect(d, kvp_events_endpoint(ev, 1)), 0);
    return d;
}

static uint64_t be64(const void *p)
{
    const uint8_t *b = p;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | b[i];
    return v;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

/* One batch as decoded; the objects point into payload. */
typedef struct batch {
    uint64_t seq;
    char *payload;
    size_t len;
    msgpack_unpacked up;
    const msgpack_object_array *events;
    double ts;
    int64_t dp_rank;
} batch_t;

static void batch_decode(batch_t *b, const void *data, size_t len)
{
    b->payload = malloc(len > 0 ? len : 1);
    assert_non_null(b->payload);
    memcpy(b->payload, data, len);
    b->len = len;
    msgpack_unpacked_init(&b->up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&b->up, b->payload, len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, len);
    const msgpack_object *o = &b->up.data;
    assert_int_equal(o->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(o->via.array.size, 3);
    assert_int_equal(o->via.array.ptr[0].type, MSGPACK_OBJECT_FLOAT64);
    b->ts = o->via.array.ptr[0].via.f64;
    assert_int_equal(o->via.array.ptr[1].type, MSGPACK_OBJECT_ARRAY);
    b->events = &o->via.array.ptr[1].via.array;
    const msgpack_object *dp = &o->via.array.ptr[2];
    assert_true(dp->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
                dp->type == MSGPACK_OBJECT_NEGATIVE_INTEGER);
    b->dp_rank = dp->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int64_t)dp->via.u64 : dp->via.i64;
}

static void batch_free(batch_t *b)
{
    msgpack_unpacked_destroy(&b->up);
    free(b->payload);
}

static size_t recv_frame(void *sock, void *buf, size_t cap, bool *more)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    int rc = zmq_msg_recv(&m, sock, 0);
    if (rc < 0)
        fail_msg("zmq_msg_recv: %s", zmq_strerror(zmq_errno()));
    size_t n = zmq_msg_size(&m);
    assert_true(n <= cap);
    memcpy(buf, zmq_msg_data(&m), n);
    *more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    return n;
}

static char frame_buf[4 << 20];

/* The next batch on the SUB socket (5 s at most). */
static void recv_batch(void *sub, const char *topic, batch_t *b)
{
    bool more;
    size_t n = recv_frame(sub, frame_buf, sizeof(frame_buf), &more);
    assert_true(more);
    assert_int_equal(n, strlen(topic));
    assert_memory_equal(frame_buf, topic, n);
    n = recv_frame(sub, frame_buf, sizeof(frame_buf), &more);
    assert_true(more);
    assert_int_equal(n, 8);
    b->seq = be64(frame_buf);
    n = recv_frame(sub, frame_buf, sizeof(frame_buf), &more);
    assert_false(more);
    batch_decode(b, frame_buf, n);
}

static bool readable(void *sock, int ms)
{
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    return zmq_poll(&it, 1, ms) == 1;
}

/* Wait until `events` events were handed to ZeroMQ or dropped. */
static void wait_sent(kvp_events_t *ev, uint64_t events)
{
    for (int i = 0; i < 10000; i++) {
        kvp_events_stats_t st;
        kvp_events_stats(ev, &st);
        if (st.published + st.dropped >= events && st.queued == 0)
            return;
        pause_ms(1);
    }
    fail_msg("events not sent within 10 s");
}

static uint64_t sync_pushed;  /* events sub_sync pushed */
static uint64_t sync_dropped; /* ... and the drops counted then */

/* Make sub hear every batch from now on (see the top); the next seq, and the
 * next disk event_id into disk_ids. */
static uint64_t sub_sync(kvp_events_t *ev, void *sub, const char *topic, uint64_t *disk_ids)
{
    uint64_t pushed = 0;
    while (!readable(sub, 10)) {
        kvp_events_cleared(ev, KVP_MEDIUM_DISK);
        pushed++;
        assert_true(pushed < 2000);
    }
    wait_sent(ev, pushed);
    kvp_events_stats_t st;
    kvp_events_stats(ev, &st);
    for (;;) {
        batch_t b;
        recv_batch(sub, topic, &b);
        batch_free(&b);
        if (b.seq + 1 == st.batches)
            break;
    }
    sync_pushed = pushed;
    sync_dropped = st.dropped;       /* a slow start may drop some (a small queue) */
    *disk_ids = pushed - st.dropped; /* the ids they took */
    return st.batches;
}

static const msgpack_object *map_get(const msgpack_object *map, const char *key)
{
    assert_int_equal(map->type, MSGPACK_OBJECT_MAP);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
            memcmp(kv->key.via.str.ptr, key, kv->key.via.str.size) == 0)
            return &kv->val;
    }
    fail_msg("no field %s", key);
    return NULL;
}

static bool map_has(const msgpack_object *map, const char *key)
{
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.via.str.size == strlen(key) &&
            memcmp(kv->key.via.str.ptr, key, kv->key.via.str.size) == 0)
            return true;
    }
    return false;
}

static void assert_str_field(const msgpack_object *map, const char *key, const char *want)
{
    const msgpack_object *v = map_get(map, key);
    if (want == NULL) {
        assert_int_equal(v->type, MSGPACK_OBJECT_NIL);
        return;
    }
    assert_int_equal(v->type, MSGPACK_OBJECT_STR);
    assert_int_equal(v->via.str.size, strlen(want));
    assert_memory_equal(v->via.str.ptr, want, v->via.str.size);
}

static uint64_t u64_field(const msgpack_object *map, const char *key)
{
    const msgpack_object *v = map_get(map, key);
    assert_int_equal(v->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    return v->via.u64;
}

static void assert_nil_field(const msgpack_object *map, const char *key)
{
    assert_int_equal(map_get(map, key)->type, MSGPACK_OBJECT_NIL);
}

static int test_setup(void **state)
{
    (void)state;
    gate_open();
    return 0;
}

/* ---- key hashes ----------------------------------------------------------------------------- */

static void assert_hash(const char *key, uint64_t want)
{
    uint64_t h = 0;
    if (!kvp_events_key_hash(key, strlen(key), &h))
        fail_msg("no hash found in %s", key);
    if (h != want)
        fail_msg("%s: hash %#llx, want %#llx", key, (unsigned long long)h,
                 (unsigned long long)want);
}

static void assert_no_hash(const char *key)
{
    uint64_t h = 0x5a5a;
    if (kvp_events_key_hash(key, strlen(key), &h))
        fail_msg("%s: took %#llx for a hash", key, (unsigned long long)h);
    assert_int_equal(h, 0x5a5a);
}

#define SHA256_HEX "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

static void test_key_hash_formats(void **state)
{
    (void)state;
    /* vLLM: hash.hex() of a 32-byte digest last: its last 8 bytes, as vLLM's events */
    assert_hash("vllm@Qwen/Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" SHA256_HEX,
                0xd15d6c15b0f00a08ull);
    /* a 16-byte (xxh128) digest */
    assert_hash("p@m@tp_rank:3@pcp0@dcp0@pp_rank:1@group:2@00112233445566778899aabbccddeeff",
                0x8899aabbccddeeffull);
    /* LMCache: {chunk_hash:x} then @dtype, also negative and short-lived dtype names */
    assert_hash("llama@8@3@1f2e3d4c5b6a7988@bfloat16", 0x1f2e3d4c5b6a7988ull);
    assert_hash("llama@8@3@1f2e3d4c5b6a7988@bf16", 0x1f2e3d4c5b6a7988ull);
    assert_hash("llama@8@3@1234567890123456@bf16", 0x1234567890123456ull); /* hex there */
    assert_hash("llama@8@3@12345678@bf16", 0x12345678ull);
    assert_hash("llama@1@0@-1f2e3d4c5b6a7988@torch.float16", (uint64_t)0 - 0x1f2e3d4c5b6a7988ull);
    assert_hash("vllm@llama@1@0@" SHA256_HEX "@float8_e4m3fn", 0xd15d6c15b0f00a08ull);
    /* SGLang: sha256 hex + _{tp}_k / _{tp}_v, and the MLA form without a rank */
    assert_hash(SHA256_HEX "_0_k", 0xd15d6c15b0f00a08ull);
    assert_hash(SHA256_HEX "_7_v", 0xd15d6c15b0f00a08ull);
    assert_hash(SHA256_HEX "_k", 0xd15d6c15b0f00a08ull);
    /* vllm-ascend: ...@{hash}, hex or decimal */
    assert_hash("qwen@pcp0@dcp0@head_or_tp_rank:1@pp_rank:0@group:0@cache_role:k@cache_family:"
                "full@" SHA256_HEX,
                0xd15d6c15b0f00a08ull);
    assert_hash("qwen@pcp0@dcp0@head_or_tp_rank:1@pp_rank:0@group:0@cache_role:k@cache_family:"
                "full@123456789012",
                123456789012ull);
    /* plain keys: decimal (8..20 digits, fits u64), hex, 0x */
    assert_hash("12345678", 12345678ull);
    assert_hash("18446744073709551615", UINT64_MAX);
    assert_hash("18446744073709551616", 0x6744073709551616ull);  /* past u64: hex */
    assert_hash("123456789012345678901", 0x6789012345678901ull); /* 21 digits: hex */
    assert_hash("-1234567890", (uint64_t)0 - 1234567890ull);
    assert_hash("deadbeefcafef00d", 0xdeadbeefcafef00dull);
    assert_hash("DEADBEEF", 0xdeadbeefull);
    assert_hash("0x1f", 0x1f);
    assert_hash("obj_0xABC", 0xabc);
    assert_hash("user@doc_12345678", 12345678ull);
    assert_hash("user@doc_12345678_v", 0x12345678ull);

    /* not hashes: tp ranks, dtypes, short words, too many or too long suffixes */
    assert_no_hash("");
    assert_no_hash("bf16");
    assert_no_hash("foo");
    assert_no_hash("hello_world");
    assert_no_hash("model@8@3@bfloat16");
    assert_no_hash("key_0_k");
    assert_no_hash("1234567");
    assert_no_hash("abcdef1");
    assert_no_hash("facade");
    assert_no_hash("0x");
    assert_no_hash("-");
    assert_no_hash("m@group:0@tp_rank:0");
    assert_no_hash(SHA256_HEX "_a_b_c_d");                     /* four suffixes: too many */
    assert_no_hash("12345678@a_very_long_suffix_component_x"); /* > 24 bytes: not a suffix */
    assert_no_hash("abcdefgh12345678");                        /* not all hex */
    assert_no_hash("m@group:0@12345678z");
    /* a key given with its length, not its NUL */
    uint64_t h;
    assert_int_equal(kvp_events_key_hash("12345678901", 7, &h), 0);
    assert_int_equal(kvp_events_key_hash("12345678901", 8, &h), 1);
    assert_int_equal(h, 12345678);
    assert_int_equal(kvp_events_key_hash(NULL, 0, &h), 0);
}

/* ---- create ---------------------------------------------------------------------------------- */

static void test_create_errors(void **state)
{
    (void)state;
    kvp_events_params_t p;
    kvp_events_t *ev = (kvp_events_t *)0x1;
    char err[256];

    kvp_events_params_init(&p);
    assert_string_equal(p.topic, "kvpool");
    assert_int_equal(p.queue_max, 65536);
    assert_int_equal(p.replay_batches, 4096);
    assert_int_equal(p.batch_max, 256);
    err[0] = '\0';
    assert_int_equal(kvp_events_create(&p, &ev, err, sizeof(err)), KVP_ERR_INVALID_ARG);
    assert_true(strlen(err) > 0);
    assert_ptr_equal(ev, (kvp_events_t *)0x1);

    p.bind = "nonsense";
    err[0] = '\0';
    assert_int_equal(kvp_events_create(&p, &ev, err, sizeof(err)), KVP_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "nonsense"));

    p.bind = "tcp://127.0.0.1:*";
    p.queue_max = 0;
    assert_int_equal(kvp_events_create(&p, &ev, err, sizeof(err)), KVP_ERR_INVALID_ARG);
    p.queue_max = 16;
    p.batch_max = 0;
    assert_int_equal(kvp_events_create(&p, &ev, err, sizeof(err)), KVP_ERR_INVALID_ARG);
    p.batch_max = 4;

    /* an address in use */
    kvp_events_t *a = make_events(&p);
    kvp_events_params_t q;
    kvp_events_params_init(&q);
    q.bind = kvp_events_endpoint(a, 0);
    err[0] = '\0';
    assert_int_equal(kvp_events_create(&q, &ev, err, sizeof(err)), KVP_ERR_SYSTEM);
    assert_non_null(strstr(err, kvp_events_endpoint(a, 0)));
    q.bind = "tcp://127.0.0.1:*";
    q.replay_bind = kvp_events_endpoint(a, 1);
    assert_int_equal(kvp_events_create(&q, &ev, NULL, 0), KVP_ERR_SYSTEM);
    assert_ptr_equal(ev, (kvp_events_t *)0x1);
    kvp_events_destroy(a);

    /* without a replay socket */
    kvp_events_params_init(&p);
    p.replay_bind = "";
    p.bind = "tcp://127.0.0.1:*";
    kvp_events_t *b = NULL;
    assert_int_equal(kvp_events_create(&p, &b, err, sizeof(err)), KVP_OK);
    assert_string_equal(kvp_events_endpoint(b, 1), "");
    kvp_events_stored(b, KVP_MEDIUM_CPU, "k", 1);
    kvp_events_destroy(b);

    /* NULL is a no-op everywhere */
    kvp_events_stored(NULL, KVP_MEDIUM_CPU, "k", 1);
    kvp_events_removed(NULL, KVP_MEDIUM_DISK, "k", 1);
    kvp_events_cleared(NULL, KVP_MEDIUM_CPU);
    kvp_events_stats_t st = {.queued = 9};
    kvp_events_stats(NULL, &st);
    assert_int_equal(st.queued + st.published + st.dropped + st.batches + st.replay_requests, 0);
    assert_string_equal(kvp_events_endpoint(NULL, 0), "");
    kvp_events_destroy(NULL);
}

/* ---- the events on the wire ----------------------------------------------------------------- */

static void assert_envelope(const msgpack_object *e, uint64_t id, const char *type,
                            const char *medium)
{
    assert_int_equal(u64_field(e, "event_id"), id);
    assert_str_field(e, "event_type", type);
    assert_str_field(e, "medium", medium);
    assert_str_field(e, "model_name", "llama-3.1-8b");
    assert_int_equal(u64_field(e, "block_size"), 64);
    assert_str_field(e, "additional_salt", "w8a8");
    assert_str_field(e, "lora_name", NULL);
    assert_str_field(e, "tenant_id", "acme");
    assert_str_field(e, "backend_id", "kvpool-master-1");
    assert_int_equal(u64_field(e, "dp_rank"), 2);
    uint64_t ts = u64_field(e, "timestamp");
    uint64_t now_ms = (uint64_t)time(NULL) * 1000;
    assert_true(ts + 60000 > now_ms && ts < now_ms + 60000);
}

static void assert_hashes(const msgpack_object *e, bool has, uint64_t want)
{
    const msgpack_object *h = map_get(e, "seq_hashes");
    assert_int_equal(h->type, MSGPACK_OBJECT_ARRAY);
    if (!has) {
        assert_int_equal(h->via.array.size, 0);
        return;
    }
    assert_int_equal(h->via.array.size, 1);
    assert_int_equal(h->via.array.ptr[0].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    assert_int_equal(h->via.array.ptr[0].via.u64, want);
}

#define VLLM_KEY "vllm@llama@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" SHA256_HEX

static void test_event_maps(void **state)
{
    (void)state;
    kvp_events_params_t p;
    kvp_events_params_init(&p);
    p.topic = "kv@test";
    p.model_name = "llama-3.1-8b";
    p.block_size = 64;
    p.additional_salt = "w8a8";
    p.lora_name = ""; /* empty: nil, the base model */
    p.tenant_id = "acme";
    p.backend_id = "kvpool-master-1";
    p.dp_rank = 2;
    kvp_events_t *ev = make_events(&p);
    void *sub = sub_open(ev);
    uint64_t disk_id;
    uint64_t seq = sub_sync(ev, sub, "kv@test", &disk_id);

    /* one batch: the publisher is held while they queue */
    gate_close();
    kvp_events_cleared(ev, KVP_MEDIUM_DISK); /* taken alone; the rest queue behind it */
    gate_wait_held();
    kvp_events_stored(ev, KVP_MEDIUM_CPU, VLLM_KEY, strlen(VLLM_KEY));
    kvp_events_stored(ev, KVP_MEDIUM_DISK, VLLM_KEY, strlen(VLLM_KEY));
    kvp_events_removed(ev, KVP_MEDIUM_CPU, VLLM_KEY, strlen(VLLM_KEY));
    kvp_events_stored(ev, KVP_MEDIUM_CPU, "plain-key", 9);
    kvp_events_removed(ev, KVP_MEDIUM_DISK, "plain-key", 9);
    kvp_events_cleared(ev, KVP_MEDIUM_CPU);
    gate_open();

    batch_t b;
    recv_batch(sub, "kv@test", &b);
    assert_int_equal(b.seq, seq);
    assert_int_equal(b.dp_rank, 2);
    assert_int_equal(b.events->size, 1);
    assert_envelope(&b.events->ptr[0], disk_id, "cleared", "disk");
    assert_int_equal(b.events->ptr[0].via.map.size, 11); /* the envelope only */
    double now = (double)time(NULL);
    assert_true(b.ts > now - 60 && b.ts < now + 60);
    batch_free(&b);

    recv_batch(sub, "kv@test", &b);
    assert_int_equal(b.seq, seq + 1);
    assert_int_equal(b.events->size, 6);
    const msgpack_object *e = b.events->ptr;

    assert_envelope(&e[0], 0, "stored", "cpu");
    assert_int_equal(e[0].via.map.size, 16);
    assert_hashes(&e[0], true, 0xd15d6c15b0f00a08ull);
    assert_nil_field(&e[0], "base_block_idx");
    assert_nil_field(&e[0], "parent_hash");
    assert_nil_field(&e[0], "token_ids");
    assert_str_field(&e[0], "object_key", VLLM_KEY);

    assert_envelope(&e[1], disk_id + 1, "stored", "disk");
    assert_hashes(&e[1], true, 0xd15d6c15b0f00a08ull);
    assert_str_field(&e[1], "object_key", VLLM_KEY);

    assert_envelope(&e[2], 1, "removed", "cpu");
    assert_int_equal(e[2].via.map.size, 14);
    assert_hashes(&e[2], true, 0xd15d6c15b0f00a08ull);
    assert_nil_field(&e[2], "base_block_idx");
    assert_false(map_has(&e[2], "parent_hash"));
    assert_false(map_has(&e[2], "token_ids"));
    assert_str_field(&e[2], "object_key", VLLM_KEY);

    assert_envelope(&e[3], 2, "stored", "cpu");
    assert_hashes(&e[3], false, 0);
    assert_str_field(&e[3], "object_key", "plain-key");

    assert_envelope(&e[4], disk_id + 2, "removed", "disk");
    assert_hashes(&e[4], false, 0);
    assert_str_field(&e[4], "object_key", "plain-key");

    assert_envelope(&e[5], 3, "cleared", "cpu");
    assert_int_equal(e[5].via.map.size, 11);
    assert_false(map_has(&e[5], "seq_hashes"));
    assert_false(map_has(&e[5], "object_key"));
    batch_free(&b);

    wait_sent(ev, sync_pushed + 7); /* the counters follow the send */
    kvp_events_stats_t st;
    kvp_events_stats(ev, &st);
    assert_int_equal(st.batches, seq + 2);
    assert_int_equal(st.dropped, sync_dropped);
    assert_int_equal(st.queued, 0);
    zmq_close(sub);
    kvp_events_destroy(ev);
}

/* Many events, small batches: every one arrives, ids consecutive per medium,
 * seqs consecutive, batches never larger than batch_max. */
static void test_batches_and_ids(void **state)
{
    (void)state;
    kvp_events_params_t p;
    kvp_events_params_init(&p);
    p.batch_max = 7;
    kvp_events_t *ev = make_events(&p);
    void *sub = sub_open(ev);
    uint64_t next_id[2];
    uint64_t seq = sub_sync(ev, sub, "kvpool", &next_id[1]);
    next_id[0] = 0;

    enum { N = 3000 };
    char key[64];
    for (int i = 0; i < N; i++) {
        int n = snprintf(key, sizeof(key), "k%d@%012d", i, i);
        kvp_medium_t m = i % 3 == 0 ? KVP_MEDIUM_DISK : KVP_MEDIUM_CPU;
        if (i % 2)
            kvp_events_stored(ev, m, key, (size_t)n);
        else
            kvp_events_removed(ev, m, key, (size_t)n);
    }
    int got = 0;
    while (got < N) {
        batch_t b;
        recv_batch(sub, "kvpool", &b);
        assert_int_equal(b.seq, seq++);
        assert_true(b.events->size >= 1 && b.events->size <= 7);
        for (uint32_t j = 0; j < b.events->size; j++, got++) {
            const msgpack_object *e = &b.events->ptr[j];
            int m = got % 3 == 0 ? 1 : 0;
            assert_str_field(e, "medium", m ? "disk" : "cpu");
            assert_int_equal(u64_field(e, "event_id"), next_id[m]++);
            assert_str_field(e, "event_type", got % 2 ? "stored" : "removed");
            snprintf(key, sizeof(key), "k%d@%012d", got, got);
            assert_str_field(e, "object_key", key);
            assert_hashes(e, true, (uint64_t)got);
        }
        batch_free(&b);
    }
    assert_int_equal(got, N);
    assert_false(readable(sub, 50));
    wait_sent(ev, sync_pushed + N);
    kvp_events_stats_t st;
    kvp_events_stats(ev, &st);
    assert_int_equal(st.dropped, sync_dropped);
    assert_int_equal(st.published, next_id[1] - (N + 2) / 3 + N); /* the sync events + N */
    assert_int_equal(st.batches, seq);
    zmq_close(sub);
    kvp_events_destroy(ev);
}

/* ---- replay --------------------------------------------------------------------------------- */

static void replay_request(void *dealer, uint64_t start, bool delim)
{
    uint8_t be[8];
    put_be64(be, start);
    if (delim)
        assert_int_equal(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(dealer, be, 8, 0), 8);
}

/* The replies to one request: their seqs into seqs (the payloads checked
 * against want[seq - first] when want is given); how many. */
static int replay_collect(void *dealer, bool delim, uint64_t *seqs, int cap, char **want,
                          size_t *want_len, uint64_t first)
{
    int n = 0;
    for (;;) {
        bool more;
        size_t len;
        if (delim) {
            len = recv_frame(dealer, frame_buf, sizeof(frame_buf), &more);
            assert_int_equal(len, 0);
            assert_true(more);
        }
        len = recv_frame(dealer, frame_buf, sizeof(frame_buf), &more);
        assert_int_equal(len, 8);
        assert_true(more);
        uint64_t seq = be64(frame_buf);
        len = recv_frame(dealer, frame_buf, sizeof(frame_buf), &more);
        assert_false(more);
        if (seq == UINT64_MAX) {
            assert_int_equal(len, 0);
            return n;
        }
        assert_true(n < cap);
        seqs[n++] = seq;
        if (want != NULL) {
            assert_int_equal(len, want_len[seq - first]);
            assert_memory_equal(frame_buf, want[seq - first], len);
            batch_t b;
            batch_decode(&b, frame_buf, len); /* a whole batch */
            batch_free(&b);
        }
    }
}

static void test_replay(void **state)
{
    (void)state;
    kvp_events_params_t p;
    kvp_events_params_init(&p);
    p.batch_max = 1;
    p.replay_batches = 16;
    kvp_events_t *ev = make_events(&p);
    void *sub = sub_open(ev);
    uint64_t disk_id;
    uint64_t first = sub_sync(ev, sub, "kvpool", &disk_id);

    /* 40 batches of one event; the ring keeps the last 16 */
    enum { N = 40 };
    char *payload[N];
    size_t len[N];
    char key[64];
    for (int i = 0; i < N; i++) {
        int n = snprintf(key, sizeof(key), "replay_%d_%012d", i, i);
        kvp_events_stored(ev, KVP_MEDIUM_CPU, key, (size_t)n);
    }
    for (int i = 0; i < N; i++) {
        batch_t b;
        recv_batch(sub, "kvpool", &b);
        assert_int_equal(b.seq, first + (uint64_t)i);
        payload[i] = b.payload;
        len[i] = b.len;
        msgpack_unpacked_destroy(&b.up);
    }
    uint64_t last = first + N - 1;

    void *d = dealer_open(ev);
    uint64_t seqs[64];
    /* a range inside the ring: from there to the newest, then the end marker */
    replay_request(d, last - 5, true);
    int n = replay_collect(d, true, seqs, 64, payload, len, first);
    assert_int_equal(n, 6);
    for (int i = 0; i < n; i++)
        assert_int_equal(seqs[i], last - 5 + (uint64_t)i);

    /* a start older than the ring: what it holds (the last 16), then the end */
    replay_request(d, 0, true);
    n = replay_collect(d, true, seqs, 64, payload, len, first);
    assert_int_equal(n, 16);
    for (int i = 0; i < n; i++)
        assert_int_equal(seqs[i], last - 15 + (uint64_t)i);

    /* past the newest: the end marker alone */
    replay_request(d, last + 1, true);
    assert_int_equal(replay_collect(d, true, seqs, 64, NULL, NULL, 0), 0);
    replay_request(d, UINT64_MAX - 1, true);
    assert_int_equal(replay_collect(d, true, seqs, 64, NULL, NULL, 0), 0);

    /* [seq] without the empty frame: replies without it */
    replay_request(d, last, false);
    n = replay_collect(d, false, seqs, 64, payload, len, first);
    assert_int_equal(n, 1);
    assert_int_equal(seqs[0], last);

    /* a malformed request is ignored; the socket still serves the next one */
    assert_int_equal(zmq_send(d, "xyz", 3, 0), 3);
    replay_request(d, last, true);
    n = replay_collect(d, true, seqs, 64, NULL, NULL, 0);
    assert_int_equal(n, 1);

    kvp_events_stats_t st;
    kvp_events_stats(ev, &st);
    assert_int_equal(st.replay_requests, 6);

    /* a REQ client (vLLM's example): the first reply */
    void *req = zmq_socket(zctx, ZMQ_REQ);
    int timeout = 5000, linger = 0;
    zmq_setsockopt(req, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
    zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof(linger));
    assert_int_equal(zmq_connect(req, kvp_events_endpoint(ev, 1)), 0);
    uint8_t be[8];
    put_be64(be, last);
    assert_int_equal(zmq_send(req, be, 8, 0), 8);
    bool more;
    assert_int_equal(recv_frame(req, frame_buf, sizeof(frame_buf), &more), 8);
    assert_int_equal(be64(frame_buf), last);
    zmq_close(req);

    for (int i = 0; i < N; i++)
        free(payload[i]);
    zmq_close(d);
    zmq_close(sub);
    kvp_events_destroy(ev);
}

/* ---- back-pressure -------------------------------------------------------------------------- */

static void test_overflow_drops_oldest(void **state)
{
    (void)state;
    kvp_events_params_t p;
    kvp_events_params_init(&p);
    p.queue_max = 8;
    kvp_events_t *ev = make_events(&p);
    void *sub = sub_open(ev);
    uint64_t disk_id;
    uint64_t seq = sub_sync(ev, sub, "kvpool", &disk_id);

    gate_close();
    kvp_events_stored(ev, KVP_MEDIUM_CPU, "key_00000000", 12);
    gate_wait_held(); /* it holds key 0; the queue is empty again */
    char key[32];
    for (int i = 1; i <= 1000; i++) {
        int n = snprintf(key, sizeof(key), "key_%08d", i);
        kvp_events_stored(ev, KVP_MEDIUM_CPU, key, (size_t)n);
        kvp_events_stats_t st;
        kvp_events_stats(ev, &st);
        assert_true(st.queued <= 8); /* bounded */
    }
    kvp_events_stats_t st;
    kvp_events_stats(ev, &st);
    assert_int_equal(st.queued, 8);
    assert_int_equal(st.dropped - sync_dropped, 1000 - 8);
    gate_open();

    /* key 0, then the newest 8 (993..1000), ids consecutive all the same */
    int want_key[9] = {0, 993, 994, 995, 996, 997, 998, 999, 1000};
    int got = 0;
    while (got < 9) {
        batch_t b;
        recv_batch(sub, "kvpool", &b);
        assert_int_equal(b.seq, seq++);
        for (uint32_t j = 0; j < b.events->size; j++, got++) {
            assert_true(got < 9);
            assert_int_equal(u64_field(&b.events->ptr[j], "event_id"), (uint64_t)got);
            snprintf(key, sizeof(key), "key_%08d", want_key[got]);
            assert_str_field(&b.events->ptr[j], "object_key", key);
            assert_hashes(&b.events->ptr[j], true, (uint64_t)want_key[got]);
        }
        batch_free(&b);
    }
    wait_sent(ev, sync_pushed + 1 + 1000);
    kvp_events_stats(ev, &st);
    assert_int_equal(st.published, disk_id + 9);
    assert_int_equal(st.dropped - sync_dropped, 992);
    zmq_close(sub);
    kvp_events_destroy(ev);
}

/* The key bytes are bounded too: queue_max * 256 + 4096 of them. */
static void test_overflow_key_bytes(void **state)
{
    (void)state;
    kvp_events_params_t p;
    kvp_events_params_init(&p);
    p.queue_max = 4; /* 5120 bytes of keys */
    kvp_events_t *ev = make_events(&p);
    void *sub = sub_open(ev);
    uint64_t disk_id;
    uint64_t seq = sub_sync(ev, sub, "kvpool", &disk_id);

    static char big[5000];
    gate_close();
    kvp_events_cleared(ev, KVP_MEDIUM_CPU);
    gate_wait_held();
    for (int i = 0; i < 5; i++) {
        memset(big, 'a' + i, sizeof(big));
        kvp_events_stored(ev, KVP_MEDIUM_CPU, big, 3000); /* one fits at a time */
    }
    kvp_events_stats_t st;
    kvp_events_stats(ev, &st);
    assert_int_equal(st.dropped - sync_dropped, 4);
    assert_int_equal(st.queued, 1);
    kvp_events_stored(ev, KVP_MEDIUM_CPU, "small", 5); /* fits behind it */
    kvp_events_stats(ev, &st);
    assert_int_equal(st.dropped - sync_dropped, 4);
    assert_int_equal(st.queued, 2);
    gate_open();

    int got = 0;
    while (got < 3) {
        batch_t b;
        recv_batch(sub, "kvpool", &b);
        assert_int_equal(b.seq, seq++);
        for (uint32_t j = 0; j < b.events->size; j++, got++) {
            const msgpack_object *e = &b.events->ptr[j];
            assert_int_equal(u64_field(e, "event_id"), (uint64_t)got);
            if (got == 1) {
                const msgpack_object *k = map_get(e, "object_key");
                assert_int_equal(k->via.str.size, 3000);
                assert_int_equal(k->via.str.ptr[0], 'e');
            }
            if (got == 2)
                assert_str_field(e, "object_key", "small");
        }
        batch_free(&b);
    }

    /* a key past 4096 bytes is cut there */
    memset(big, 'z', sizeof(big));
    kvp_events_stored(ev, KVP_MEDIUM_CPU, big, sizeof(big));
    batch_t b;
    recv_batch(sub, "kvpool", &b);
    assert_int_equal(b.seq, seq);
    assert_int_equal(b.events->size, 1);
    const msgpack_object *k = map_get(&b.events->ptr[0], "object_key");
    assert_int_equal(k->via.str.size, 4096);
    assert_int_equal(k->via.str.ptr[4095], 'z');
    batch_free(&b);
    zmq_close(sub);
    kvp_events_destroy(ev);
}

/* ---- destroy and threads -------------------------------------------------------------------- */

static void test_destroy_flushes(void **state)
{
    (void)state;
    kvp_events_params_t p;
    kvp_events_params_init(&p);
    kvp_events_t *ev = make_events(&p);
    void *sub = sub_open(ev);
    uint64_t disk_id;
    uint64_t seq = sub_sync(ev, sub, "kvpool", &disk_id);

    enum { N = 5000 };
    char key[32];
    gate_close();
    kvp_events_removed(ev, KVP_MEDIUM_CPU, "key_00000000", 12);
    gate_wait_held();
    for (int i = 1; i < N; i++) {
        int n = snprintf(key, sizeof(key), "key_%08d", i);
        kvp_events_removed(ev, KVP_MEDIUM_CPU, key, (size_t)n);
    }
    gate_open();
    kvp_events_destroy(ev); /* with nearly all of them queued */

    int got = 0;
    while (got < N) {
        batch_t b;
        recv_batch(sub, "kvpool", &b);
        assert_int_equal(b.seq, seq++);
        for (uint32_t j = 0; j < b.events->size; j++, got++) {
            assert_int_equal(u64_field(&b.events->ptr[j], "event_id"), (uint64_t)got);
            snprintf(key, sizeof(key), "key_%08d", got);
            assert_str_field(&b.events->ptr[j], "object_key", key);
        }
        batch_free(&b);
    }
    zmq_close(sub);
}

typedef struct pusher {
    kvp_events_t *ev;
    int id;
} pusher_t;

static atomic_int pushers_done;

static void *pusher_main(void *arg)
{
    pusher_t *pu = arg;
    char key[64];
    for (int i = 0; i < 20000; i++) {
        int n = snprintf(key, sizeof(key), "t%d_%d_%016x", pu->id, i, i);
        kvp_medium_t m = i % 2 ? KVP_MEDIUM_CPU : KVP_MEDIUM_DISK;
        if (i % 3 == 0)
            kvp_events_removed(pu->ev, m, key, (size_t)n);
        else
            kvp_events_stored(pu->ev, m, key, (size_t)n);
        if (i % 1000 == 0) {
            kvp_events_stats_t st;
            kvp_events_stats(pu->ev, &st);
            assert_true(st.queued <= 512);
        }
    }
    atomic_fetch_add(&pushers_done, 1);
    return NULL;
}

/* Four threads at once against a small queue, the test reading meanwhile:
 * every event is sent or counted as dropped, and what arrives has
 * consecutive ids per medium and consecutive seqs. */
static void test_threads(void **state)
{
    (void)state;
    kvp_events_params_t p;
    kvp_events_params_init(&p);
    p.queue_max = 512;
    p.batch_max = 64;
    kvp_events_t *ev = make_events(&p);
    void *sub = sub_open(ev);
    int hwm = 0; /* no limit on the test's side */
    zmq_setsockopt(sub, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    uint64_t disk_id;
    uint64_t seq = sub_sync(ev, sub, "kvpool", &disk_id);

    atomic_store(&pushers_done, 0);
    pthread_t t[4];
    pusher_t pu[4];
    for (int i = 0; i < 4; i++) {
        pu[i] = (pusher_t){.ev = ev, .id = i};
        assert_int_equal(pthread_create(&t[i], NULL, pusher_main, &pu[i]), 0);
    }
    uint64_t next_id[2] = {0, disk_id};
    uint64_t got = 0;
    kvp_events_stats_t st;
    for (;;) {
        if (atomic_load(&pushers_done) == 4) {
            wait_sent(ev, sync_pushed + 80000);
            kvp_events_stats(ev, &st);
            if (seq == st.batches)
                break;
        } else if (!readable(sub, 10)) {
            continue;
        }
        batch_t b;
        recv_batch(sub, "kvpool", &b);
        assert_int_equal(b.seq, seq++);
        for (uint32_t j = 0; j < b.events->size; j++, got++) {
            const msgpack_object *e = &b.events->ptr[j];
            const msgpack_object *m = map_get(e, "medium");
            int disk = m->via.str.size == 4;
            assert_int_equal(u64_field(e, "event_id"), next_id[disk]++);
        }
        batch_free(&b);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(got, st.published - disk_id);
    assert_int_equal(st.published + st.dropped, sync_pushed + 80000);
    zmq_close(sub);
    kvp_events_destroy(ev);
}

/* ---- tenants (keys TENANT 0x1f KEY) and CURVE ----------------------------------------------- */

typedef struct keypair {
    char pub[41];
    char sec[41];
} keypair_t;

static keypair_t kp_master, kp_a, kp_b, kp_all;
static char curve_dir[64];
static char curve_secret_path[128], curve_allow_path[128];

/* One event as a test looks at it. */
typedef struct seen {
    char topic[64];
    uint64_t seq;
    char type[8];
    char key[64]; /* "" for cleared */
    char tenant[64];
    uint64_t id;
    int disk;
} seen_t;

static void str_field(const msgpack_object *map, const char *key, char *out, size_t cap)
{
    const msgpack_object *v = map_get(map, key);
    assert_int_equal(v->type, MSGPACK_OBJECT_STR);
    assert_true(v->via.str.size < cap);
    memcpy(out, v->via.str.ptr, v->via.str.size);
    out[v->via.str.size] = '\0';
}

/* The events of one payload into out (n of cap used); topic and seq are the batch's. */
static void seen_add(const char *topic, uint64_t seq, const void *payload, size_t len, seen_t *out,
                     int *n, int cap)
{
    batch_t b;
    batch_decode(&b, payload, len);
    for (uint32_t j = 0; j < b.events->size; j++) {
        assert_true(*n < cap);
        const msgpack_object *e = &b.events->ptr[j];
        seen_t *s = &out[(*n)++];
        memset(s, 0, sizeof(*s));
        snprintf(s->topic, sizeof(s->topic), "%s", topic);
        s->seq = seq;
        str_field(e, "event_type", s->type, sizeof(s->type));
        str_field(e, "tenant_id", s->tenant, sizeof(s->tenant));
        if (map_has(e, "object_key"))
            str_field(e, "object_key", s->key, sizeof(s->key));
        char medium[8];
        str_field(e, "medium", medium, sizeof(medium));
        s->disk = strcmp(medium, "disk") == 0;
        s->id = u64_field(e, "event_id");
    }
    batch_free(&b);
}

/* Every batch sub has within ms (then nothing for ms), appended to out. */
static void sub_drain(void *sub, int ms, seen_t *out, int *n, int cap)
{
    while (readable(sub, ms)) {
        char topic[64];
        bool more;
        size_t tn = recv_frame(sub, topic, sizeof(topic) - 1, &more);
        topic[tn] = '\0';
        assert_true(more);
        uint8_t seq[8];
        assert_int_equal(recv_frame(sub, seq, sizeof(seq), &more), 8);
        size_t len = recv_frame(sub, frame_buf, sizeof(frame_buf), &more);
        assert_false(more);
        seen_add(topic, be64(seq), frame_buf, len, out, n, cap);
    }
}

static void write_text(const char *path, const char *text, int mode)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, (mode_t)mode), 0);
}

static void curve_files(void)
{
    snprintf(curve_dir, sizeof(curve_dir), "/tmp/kvp-test-curve-XXXXXX");
    assert_non_null(mkdtemp(curve_dir));
    keypair_t *kps[] = {&kp_master, &kp_a, &kp_b, &kp_all};
    for (size_t i = 0; i < sizeof(kps) / sizeof(kps[0]); i++)
        assert_int_equal(zmq_curve_keypair(kps[i]->pub, kps[i]->sec), 0);
    snprintf(curve_secret_path, sizeof(curve_secret_path), "%s/master.key", curve_dir);
    snprintf(curve_allow_path, sizeof(curve_allow_path), "%s/allow.conf", curve_dir);
    char text[512];
    snprintf(text, sizeof(text), "%s\n", kp_master.sec);
    write_text(curve_secret_path, text, 0600);
    snprintf(text, sizeof(text), "# who may subscribe\n%s team-a\n  %s\tteam-b # b\n%s *\n",
             kp_a.pub, kp_b.pub, kp_all.pub);
    write_text(curve_allow_path, text, 0644);
}

static void curve_files_remove(void)
{
    unlink(curve_secret_path);
    unlink(curve_allow_path);
    rmdir(curve_dir);
}

/* A socket of the test with kp's CURVE keys (NULL: none), connected to ep. */
static void *curve_open(int type, const keypair_t *kp, const char *ep, const char *subscribe)
{
    void *s = zmq_socket(zctx, type);
    assert_non_null(s);
    int timeout = 5000, linger = 0;
    assert_int_equal(zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout, sizeof(timeout)), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger)), 0);
    if (kp != NULL) {
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, kp_master.pub, 40), 0);
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, kp->pub, 40), 0);
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, kp->sec, 40), 0);
    }
    if (subscribe != NULL)
        assert_int_equal(zmq_setsockopt(s, ZMQ_SUBSCRIBE, subscribe, strlen(subscribe)), 0);
    assert_int_equal(zmq_connect(s, ep), 0);
    return s;
}

/* Ask for a replay (["", [topic,] start]); the events answered into out. */
static void replay_ask(kvp_events_t *ev, const keypair_t *kp, const char *topic, seen_t *out,
                       int *n, int cap)
{
    void *d = curve_open(ZMQ_DEALER, kp, kvp_events_endpoint(ev, 1), NULL);
    uint8_t start[8];
    put_be64(start, 0);
    assert_int_equal(zmq_send(d, "", 0, ZMQ_SNDMORE), 0);
    if (topic != NULL)
        assert_int_equal(zmq_send(d, topic, strlen(topic), ZMQ_SNDMORE), (int)strlen(topic));
    assert_int_equal(zmq_send(d, start, 8, 0), 8);
    for (;;) {
        bool more;
        uint8_t seq[8];
        assert_int_equal(recv_frame(d, frame_buf, sizeof(frame_buf), &more), 0);
        assert_int_equal(recv_frame(d, seq, sizeof(seq), &more), 8);
        size_t len = recv_frame(d, frame_buf, sizeof(frame_buf), &more);
        assert_false(more);
        if (be64(seq) == UINT64_MAX)
            break;
        seen_add(topic != NULL ? topic : "", be64(seq), frame_buf, len, out, n, cap);
    }
    zmq_close(d);
}

static void push_key(kvp_events_t *ev, const char *key)
{
    kvp_events_stored(ev, KVP_MEDIUM_CPU, key, strlen(key));
}

/* Without CURVE: one stream as before, the user's key and the tenant in the map. */
static void test_tenant_keys_without_curve(void **state)
{
    (void)state;
    kvp_events_params_t p;
    kvp_events_params_init(&p);
    p.tenant_id = "acme";
    p.tenants = 1;
    kvp_events_t *ev = make_events(&p);
    void *sub = sub_open(ev);
    uint64_t disk_id;
    uint64_t seq = sub_sync(ev, sub, "kvpool", &disk_id);

    const char k1[] = "team-a\x1fm@0x1234";
    const char k3[] = "\x1fodd"; /* an empty tenant is none: the key as it is */
    push_key(ev, k1);
    push_key(ev, "plain@0x99");
    kvp_events_stored(ev, KVP_MEDIUM_CPU, k3, sizeof(k3) - 1);
    push_key(ev, "default\x1f"
                 "d"); /* the ACL's tenant of principals naming none */
    wait_sent(ev, sync_pushed + 4);
    seen_t s[8];
    int n = 0;
    sub_drain(sub, 200, s, &n, 8);
    assert_int_equal(n, 4);
    const char *keys[] = {"m@0x1234", "plain@0x99", k3, "d"};
    const char *tenants[] = {"team-a", "acme", "acme", "acme"};
    for (int i = 0; i < 4; i++) {
        assert_string_equal(s[i].topic, "kvpool");
        assert_true(s[i].seq >= seq);
        assert_string_equal(s[i].key, keys[i]);
        assert_string_equal(s[i].tenant, tenants[i]);
        assert_int_equal(s[i].id, (uint64_t)i); /* one stream: cpu ids 0, 1, 2, 3 */
    }
    kvp_events_stats_t st;
    kvp_events_stats(ev, &st);
    assert_int_equal(st.curve, 0);
    zmq_close(sub);
    kvp_events_destroy(ev);
}

/* Hear a's, b's and no tenant's events until sub has one of topic. */
static void curve_sync(kvp_events_t *ev, void **subs, int nsubs)
{
    for (int i = 0; i < nsubs; i++) {
        int tries = 0;
        while (!readable(subs[i], 10)) {
            push_key(ev, "team-a\x1fsync");
            push_key(ev, "team-b\x1fsync");
            push_key(ev, "sync");
            assert_true(++tries < 2000);
        }
    }
    kvp_events_stats_t st;
    kvp_events_stats(ev, &st);
    wait_sent(ev, st.published + st.queued);
    seen_t junk[1024];
    for (int i = 0; i < nsubs; i++) {
        int n = 0;
        sub_drain(subs[i], 100, junk, &n, 1024);
    }
}

static int count_of(const seen_t *s, int n, const char *topic, const char *key)
{
    int c = 0;
    for (int i = 0; i < n; i++)
        c += (topic == NULL || strcmp(s[i].topic, topic) == 0) && strcmp(s[i].key, key) == 0;
    return c;
}

/* With CURVE: a stream per tenant; a tenant's subscriber hears its own alone. */
static void test_tenant_streams(void **state)
{
    (void)state;
    curve_files();
    kvp_events_params_t p;
    kvp_events_params_init(&p);
    p.curve_secret = curve_secret_path;
    p.curve_allow = curve_allow_path;
    p.tenants = 1;
    kvp_events_t *ev = make_events(&p);
    const char *ep = kvp_events_endpoint(ev, 0);
    void *sub_a = curve_open(ZMQ_SUB, &kp_a, ep, "");
    void *sub_all = curve_open(ZMQ_SUB, &kp_all, ep, "kvpool");
    void *peek = curve_open(ZMQ_SUB, &kp_a, ep, "kvpool/team-b/"); /* another tenant's */
    void *plain = curve_open(ZMQ_SUB, NULL, ep, "");
    void *subs[] = {sub_a, sub_all};
    curve_sync(ev, subs, 2);
    kvp_events_stats_t st;
    for (int i = 0;; i++) { /* the refusals are counted as they happen */
        kvp_events_stats(ev, &st);
        if (st.refused_topic >= 1 && st.refused_curve >= 1)
            break;
        assert_true(i < 5000);
        pause_ms(1);
    }
    assert_int_equal(st.curve, 1);

    /* the events of a stream are consecutive: its seq and its cpu ids go on from the sync */
    push_key(ev, "team-a\x1fk1");
    push_key(ev, "team-b\x1fk1");
    push_key(ev, "nobody@1");
    push_key(ev, "team-a\x1fk2");
    kvp_events_cleared(ev, KVP_MEDIUM_CPU);
    kvp_events_stats(ev, &st);
    wait_sent(ev, st.published + st.queued);

    seen_t a[64], all[64], none[8];
    int na = 0, nall = 0, nnone = 0;
    sub_drain(sub_a, 200, a, &na, 64);
    sub_drain(sub_all, 200, all, &nall, 64);
    sub_drain(peek, 50, none, &nnone, 8);
    sub_drain(plain, 50, none, &nnone, 8);
    assert_int_equal(nnone, 0);

    assert_int_equal(na, 3); /* k1, k2, cleared */
    const char *want_a[] = {"k1", "k2", ""};
    for (int i = 0; i < na; i++) {
        assert_string_equal(a[i].topic, "kvpool/team-a/");
        assert_string_equal(a[i].tenant, "team-a");
        assert_string_equal(a[i].key, want_a[i]);
        if (i > 0) {
            assert_true(a[i].seq == a[i - 1].seq || a[i].seq == a[i - 1].seq + 1);
            assert_int_equal(a[i].id, a[i - 1].id + 1);
        }
    }
    assert_string_equal(a[2].type, "cleared");
    /* "*": every stream, told apart by topic and tenant_id */
    assert_int_equal(count_of(all, nall, "kvpool/team-a/", "k1"), 1);
    assert_int_equal(count_of(all, nall, "kvpool/team-a/", "k2"), 1);
    assert_int_equal(count_of(all, nall, "kvpool/team-b/", "k1"), 1);
    /* with an ACL, a key with no tenant prefix is the default tenant's: its own stream */
    assert_int_equal(count_of(all, nall, "kvpool/default/", "nobody@1"), 1);
    assert_int_equal(count_of(all, nall, "kvpool", "nobody@1"), 0);
    /* cleared: in each of the 4 streams (the one of keys of no tenant, unused here, too) */
    assert_int_equal(count_of(all, nall, NULL, ""), 4);
    for (int i = 0; i < nall; i++) {
        const char *want = strcmp(all[i].topic, "kvpool/team-a/") == 0   ? "team-a"
                           : strcmp(all[i].topic, "kvpool/team-b/") == 0 ? "team-b"
                                                                         : "default";
        assert_string_equal(all[i].tenant, want);
    }

    /* replays: a's own stream by default; another tenant's topic gives nothing, counted */
    seen_t r[1024];
    int nr = 0;
    replay_ask(ev, &kp_a, NULL, r, &nr, 1024);
    assert_true(nr > 3);
    for (int i = 0; i < nr; i++)
        assert_string_equal(r[i].tenant, "team-a");
    assert_int_equal(count_of(r, nr, NULL, "k2"), 1);
    kvp_events_stats(ev, &st);
    uint64_t refused = st.refused_topic;
    nr = 0;
    replay_ask(ev, &kp_a, "kvpool/team-b/", r, &nr, 1024);
    assert_int_equal(nr, 0);
    kvp_events_stats(ev, &st);
    assert_int_equal(st.refused_topic, refused + 1);
    nr = 0;
    replay_ask(ev, &kp_all, "kvpool/team-b/", r, &nr, 1024);
    assert_true(nr > 1);
    for (int i = 0; i < nr; i++)
        assert_string_equal(r[i].tenant, "team-b");
    assert_int_equal(count_of(r, nr, NULL, "k1"), 1);

    zmq_close(plain);
    zmq_close(peek);
    zmq_close(sub_all);
    zmq_close(sub_a);
    kvp_events_destroy(ev);
    curve_files_remove();
}

static uint64_t stat_cuts(kvp_events_t *ev)
{
    kvp_events_stats_t st;
    kvp_events_stats(ev, &st);
    return st.cuts;
}

static void allow_write(const char *lines)
{
    char text[1024];
    snprintf(text, sizeof(text), "# who may subscribe\n%s", lines);
    write_text(curve_allow_path, text, 0644);
}

/* Whether a replay request of kp gets an answer within ms (a refused key gets none). */
static bool replay_answered(kvp_events_t *ev, const keypair_t *kp, int ms)
{
    void *d = curve_open(ZMQ_DEALER, kp, kvp_events_endpoint(ev, 1), NULL);
    uint8_t start[8];
    put_be64(start, 0);
    assert_int_equal(zmq_send(d, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(d, start, 8, 0), 8);
    bool answered = readable(d, ms);
    zmq_close(d);
    return answered;
}

/* A reload that removes a key closes every connection: the removed key hears nothing
 * pushed after kvp_events_reload returned and is refused when it reconnects; the kept one
 * reconnects and hears on (what it missed, if anything, by replay). A reload that adds a
 * key, or fails, touches no connection. */
static void test_reload_cuts_removed_keys(void **state)
{
    (void)state;
    curve_files();
    kvp_events_params_t p;
    kvp_events_params_init(&p);
    p.curve_secret = curve_secret_path;
    p.curve_allow = curve_allow_path;
    p.tenants = 1;
    kvp_events_t *ev = make_events(&p);
    const char *ep = kvp_events_endpoint(ev, 0);
    char ep_before[2][256];
    snprintf(ep_before[0], sizeof(ep_before[0]), "%s", ep);
    snprintf(ep_before[1], sizeof(ep_before[1]), "%s", kvp_events_endpoint(ev, 1));
    void *sub_a = curve_open(ZMQ_SUB, &kp_a, ep, "");
    void *sub_all = curve_open(ZMQ_SUB, &kp_all, ep, "kvpool/team-a/");
    void *subs[] = {sub_a, sub_all};
    curve_sync(ev, subs, 2);
    assert_true(replay_answered(ev, &kp_a, 5000));
    kvp_events_stats_t st;
    kvp_events_stats(ev, &st);
    uint64_t refused_key = st.refused_key;

    /* a reload that fails, and one that only adds a key: nobody is cut */
    allow_write("not-a-key *\n");
    kvp_events_reload(ev);
    char lines[512];
    snprintf(lines, sizeof(lines), "%s team-a\n%s team-b\n%s *\n%s team-b\n", kp_a.pub, kp_b.pub,
             kp_all.pub, kp_master.pub);
    allow_write(lines);
    kvp_events_reload(ev);
    for (int i = 0; i < 5; i++) {
        char key[32];
        snprintf(key, sizeof(key),
                 "team-a\x1f"
                 "add-%d",
                 i);
        push_key(ev, key);
    }
    kvp_events_stats(ev, &st);
    wait_sent(ev, st.published + st.queued);
    seen_t s[64];
    for (int k = 0; k < 2; k++) {
        int n = 0;
        sub_drain(subs[k], 200, s, &n, 64);
        assert_int_equal(n, 5); /* live, at once, with no gap */
        for (int i = 1; i < n; i++)
            assert_true(s[i].seq == s[i - 1].seq || s[i].seq == s[i - 1].seq + 1);
    }
    uint64_t last_seq = s[4].seq;
    assert_int_equal(stat_cuts(ev), 0);

    /* a's key goes: both connections are closed (both sockets reopened) */
    snprintf(lines, sizeof(lines), "%s team-b\n%s *\n", kp_b.pub, kp_all.pub);
    allow_write(lines);
    kvp_events_reload(ev);
    enum { AFTER = 20 };
    for (int i = 0; i < AFTER; i++) {
        char key[32];
        snprintf(key, sizeof(key),
                 "team-a\x1f"
                 "after-%d",
                 i);
        push_key(ev, key);
    }
    /* the kept one: every key after the reload, live or by replay of its gap. Its SUB
     * subscribes again when it reconnects, which libzmq does in the thread that calls it:
     * a subscriber is read while the sockets are reopened, as any subscriber loop reads */
    seen_t got[256];
    int n = 0;
    sub_drain(sub_all, 1000, got, &n, 256);
    kvp_events_stats(ev, &st);
    wait_sent(ev, st.published + st.queued);
    assert_int_equal(stat_cuts(ev), 1);
    /* the same endpoints (ports resolved at create) */
    assert_string_equal(kvp_events_endpoint(ev, 0), ep_before[0]);
    assert_string_equal(kvp_events_endpoint(ev, 1), ep_before[1]);
    sub_drain(sub_all, 200, got, &n, 256);
    for (int i = 0; i < n; i++)
        assert_true(got[i].seq > last_seq);
    uint64_t first = n > 0 ? got[0].seq : UINT64_MAX;
    if (n < AFTER || first != last_seq + 1) { /* it reconnected late: the gap, replayed */
        seen_t r[1024];
        int nr = 0;
        replay_ask(ev, &kp_all, "kvpool/team-a/", r, &nr, 1024);
        for (int i = 0; i < nr; i++)
            if (r[i].seq > last_seq && r[i].seq < first && n < 256)
                got[n++] = r[i];
    }
    for (int i = 0; i < AFTER; i++) {
        char key[32];
        snprintf(key, sizeof(key), "after-%d", i);
        assert_int_equal(count_of(got, n, "kvpool/team-a/", key) + count_of(got, n, "", key), 1);
    }

    /* the removed one: nothing after the reload, its reconnections refused and counted */
    int nn = 0;
    sub_drain(sub_a, 1000, s, &nn, 64);
    assert_int_equal(nn, 0);
    for (int i = 0;; i++) {
        kvp_events_stats(ev, &st);
        if (st.refused_key > refused_key)
            break;
        assert_true(i < 5000);
        pause_ms(1);
    }
    assert_false(replay_answered(ev, &kp_a, 500));

    /* the master's key moves to another tenant: a cut too */
    snprintf(lines, sizeof(lines), "%s team-b\n%s team-a\n", kp_b.pub, kp_all.pub);
    allow_write(lines);
    kvp_events_reload(ev);
    for (int i = 0; stat_cuts(ev) < 2; i++) {
        assert_true(i < 5000);
        pause_ms(1);
    }

    zmq_close(sub_all);
    zmq_close(sub_a);
    kvp_events_destroy(ev);
    curve_files_remove();
}

int main(void)
{
    test_thread = pthread_self();
    zctx = zmq_ctx_new();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_hash_formats),
        cmocka_unit_test_setup(test_create_errors, test_setup),
        cmocka_unit_test_setup(test_event_maps, test_setup),
        cmocka_unit_test_setup(test_batches_and_ids, test_setup),
        cmocka_unit_test_setup(test_replay, test_setup),
        cmocka_unit_test_setup(test_overflow_drops_oldest, test_setup),
        cmocka_unit_test_setup(test_overflow_key_bytes, test_setup),
        cmocka_unit_test_setup(test_destroy_flushes, test_setup),
        cmocka_unit_test_setup(test_threads, test_setup),
        cmocka_unit_test_setup(test_tenant_keys_without_curve, test_setup),
        cmocka_unit_test_setup(test_tenant_streams, test_setup),
        cmocka_unit_test_setup(test_reload_cuts_removed_keys, test_setup),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0)
        zmq_ctx_term(zctx); /* a failed test may leave a socket open: term would wait */
    return rc;
}
