/*
 * events.c - KV events on a ZeroMQ PUB socket, in vLLM's framing (events.h).
 *
 * Design. The master's loop calls kvp_events_stored/removed/cleared on its
 * hot path. Each copies the event (type, medium, wall-clock ms, key) into a
 * FIFO allocated once at create, under a mutex, and returns: no I/O, no
 * allocation. The FIFO is two rings: queue_max slots, and an arena of
 * queue_max * 256 + 4096 bytes where the keys lie back to back (a key that
 * does not fit before the arena's end starts again at 0, the bytes skipped
 * being counted with it). When either ring is full the oldest events are
 * dropped, and counted, until the new one fits.
 *
 * One publisher thread owns the ZeroMQ sockets. It copies up to batch_max
 * events (and at most 64 KiB of keys) out of the FIFO under the mutex, then
 * without it: gives event_ids (per stream and medium, consecutive from 0;
 * drops happen before, so the ids a subscriber sees stay consecutive), reads each key's
 * block hash, encodes the batch with msgpack into one reused buffer, sends
 * [topic, seq, payload] on PUB and keeps a copy of the payload in the replay
 * ring. While idle it waits in zmq_poll on the ROUTER and on an eventfd that
 * a caller writes only when the thread said it was going to sleep (one write
 * per wake-up, not one per event). Replay requests are answered between
 * batches; ROUTER_MANDATORY with a HWM above the ring's size means a replay
 * is never cut silently (a client that cannot take it is logged and skipped).
 *
 * Streams. A batch is sent to one stream: its topic, seq and event_ids are
 * the stream's (ev_stream_t). Without CURVE there is one, stream 0, and the
 * wire is what it always was (tenant keys only lose their TENANT 0x1f
 * prefix). With CURVE (events_curve.c: the ZAP handler, the allow-list)
 * each tenant met in a key gets a stream, made by this thread at its first
 * event, and the events taken are split by stream (a cleared goes to every
 * one); the PUB is an XPUB in manual mode whose subscriptions this thread
 * applies after checking them against the subscriber's ZAP User-Id (its
 * tenant). The replay ring is one for all streams, indexed by g, the batch's
 * number among every stream's; a stream's seq is never above g, so a replay
 * from seq s starts at g = s.
 *
 * Cuts (CURVE). ZAP is asked at a handshake only, and libzmq cannot drop one
 * connection of an XPUB or a ROUTER; so when a reload (the master's loop)
 * removes a key, it sets ev->cut, and this thread, before its next batch,
 * closes both sockets and binds fresh ones on the same endpoints
 * (cut_subscribers): every connection shakes hands again against the new
 * list. Streams, seqs, event_ids and the replay ring are this thread's, not
 * the sockets', so they go on; batches wait CUT_HOLD_NS for the allowed
 * subscribers to come back.
 *
 * Memory: the FIFO (above) + the replay ring (replay_batches payloads, at
 * most REPLAY_BYTES_MAX) + the streams (STREAMS_MAX at most) + per
 * subscriber ZeroMQ's send HWM of PUB_SNDHWM batches (at most ~64 KiB of
 * keys + their maps each).
 *
 * Threads: kvp_events_stored/removed/cleared/stats/reload from any thread
 * (the master's loop); the sockets are bound in create before the thread
 * starts and closed in destroy after it is joined, and used (replaced in a
 * cut) only by the thread in between.
 */
#include "master/obs/events.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>
#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/parse.h"
#include "master/meta/tenant.h"
#include "master/obs/events_curve.h"

#define KEY_MAX 4096u                  /* longest key kept (the pool's key limit) */
#define ARENA_BYTES_PER_EVENT 256u     /* key bytes the FIFO keeps per queue_max slot */
#define BATCH_KEY_BYTES (64u << 10)    /* keys per batch at most (one key always fits) */
#define PUB_SNDHWM 1000                /* batches a subscriber may lag before ZMQ drops */
#define REPLAY_BYTES_MAX (32ull << 20) /* payload bytes the replay ring keeps at most */
#define FLUSH_NS 1000000000ull         /* destroy: time given to send what is queued */
#define IDLE_POLL_MS 1000              /* idle wait (the eventfd wakes it earlier) */
#define PUB_LINGER_MS 200              /* close: time given to deliver the last batches */
#define REPLAYS_PER_ROUND 16           /* replay requests served between two batches */
#define QUEUE_MAX_LIMIT (1u << 22)
#define BATCH_MAX_LIMIT (1u << 16)
#define REPLAY_BATCHES_LIMIT (1u << 20)
#define WARN_EVERY_NS 10000000000ull /* rate of the warnings of a failing send */
#define STREAMS_MAX 4096u            /* tenant streams at most (CURVE) */
#define STREAM_NONE UINT32_MAX       /* an event of no stream (dropped) */
#define STREAM_ALL (UINT32_MAX - 1)  /* an event of every stream (cleared) */
#define SUBS_PER_ROUND 64            /* (un)subscriptions applied between two batches */
#define TOPIC_MAX 256                /* a topic a replay request names, at most */
#define CUT_HOLD_NS 300000000ull     /* after a cut: batches wait for subscribers to reconnect */
#define CLOSE_WAIT_NS 1000000000ull  /* a cut: time given to libzmq to tear a socket down */
#define REBIND_WAIT_NS 1000000000ull /* a cut: binding again retried in place this long */
#define REBIND_EVERY_NS 100000000ull /* then again between batches, this often */
#define REBIND_POLL_MS 100           /* the idle wait while a socket is not bound */

typedef enum ev_type {
    EV_STORED = 0,
    EV_REMOVED = 1,
    EV_CLEARED = 2,
} ev_type_t;

static const char *const type_names[] = {"stored", "removed", "cleared"};
static const char *const medium_names[KVP_MEDIUM_COUNT] = {"cpu", "disk"};

/* One queued event; its key is key_len bytes at key_off of the arena (of the
 * publisher's batch buffer once taken), after `skipped` bytes left unused at
 * the arena's end when it wrapped. */
typedef struct ev_slot {
    uint64_t ts_ms;
    uint32_t key_off;
    uint16_t key_len;
    uint16_t skipped;
    uint8_t type;
    uint8_t medium;
} ev_slot_t;

/* The batches of one tenant (CURVE), or all (no CURVE: the only stream). */
typedef struct ev_stream {
    char tenant[KVP_EVENTS_TENANT_MAX + 1]; /* "": keys of no tenant */
    char *topic;                            /* "<topic>/<tenant>/" ("<topic>" for stream 0) */
    size_t topic_len;
    uint64_t next_seq;
    uint64_t next_id[KVP_MEDIUM_COUNT];
    uint64_t round; /* the last publish_batch that sent it a batch */
} ev_stream_t;

typedef struct replay_entry {
    uint64_t g;      /* the batch's number among every stream's (UINT64_MAX: none) */
    uint64_t seq;    /* its seq in its stream */
    uint32_t stream; /* its stream */
    char *data;      /* NULL: this batch could not be kept */
    size_t len;
} replay_entry_t;

struct kvp_events {
    kvp_event_sink_t sink; /* what kvp_events_sink hands out: ops on this publisher */
    /* settings, owned copies; read-only after create */
    bool tenants; /* an ACL is on: a key with no tenant prefix is the default tenant's */
    char *topic;
    size_t topic_len;
    char *model_name;
    char *additional_salt; /* NULL: nil */
    char *lora_name;       /* NULL: nil */
    char *tenant_id;
    char *backend_id;
    uint32_t block_size;
    int32_t dp_rank;
    uint32_t batch_max;
    char endpoint[2][256];

    /* the FIFO, shared with the callers: under lock */
    pthread_mutex_t lock;
    ev_slot_t *slots;
    uint32_t slots_cap;
    uint32_t head; /* the oldest event */
    uint32_t count;
    char *arena;
    uint32_t arena_cap;
    uint32_t arena_wpos; /* where the next key goes */
    uint32_t arena_used; /* bytes from the oldest key to arena_wpos, skipped ones included */
    uint64_t dropped;
    bool sleeping; /* the publisher waits for the eventfd */
    bool stopping;
    bool cut; /* a reload removed a key: the publisher reopens the sockets before a batch */
    uint64_t stop_deadline_ns;
    int wake_fd;

    /* the publisher thread's */
    pthread_t thread;
    void *zctx;
    void *pub;     /* PUB, or XPUB (manual) with CURVE; NULL: lost in a cut */
    void *replay;  /* NULL: no replay socket (or lost in a cut) */
    bool bound[2]; /* pub, replay: bound to endpoint[i] (false: a cut, retrying) */
    int replay_hwm;
    uint64_t hold_until_ns;    /* after a cut: no batch before (subscribers reconnect) */
    uint64_t next_bind_ns;     /* after a cut: when to try binding again */
    unsigned closing_gen;      /* makes each closing monitor's endpoint a new one */
    kvp_events_curve_t *curve; /* NULL: no CURVE, one stream */
    ev_stream_t **streams;     /* [0]: keys of no tenant (or all, without CURVE) */
    uint32_t n_streams;
    uint32_t streams_cap;
    uint32_t last_stream; /* the stream found last (a cache) */
    uint64_t round;
    uint32_t *stream_of; /* per event of the batch */
    uint64_t next_g;     /* batches sent, all streams */
    ev_slot_t *batch;
    char *batch_keys;
    msgpack_sbuffer sbuf;
    bool pack_failed;
    replay_entry_t *ring;
    uint32_t ring_cap;
    uint64_t ring_oldest; /* g of the oldest batch kept (== next_g: none) */
    uint64_t ring_bytes;
    uint64_t last_warn_ns;

    atomic_uint_fast64_t published;
    atomic_uint_fast64_t batches;
    atomic_uint_fast64_t replay_requests;
    atomic_uint_fast64_t refused_topic;
    atomic_uint_fast64_t cuts;
};

static uint64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

static uint64_t get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* ---- the block hash of a key ---------------------------------------------------------------- */

/* Whether s[0..n) is a hash by the rules of events.h; its value mod 2^64.
 * may_be_decimal: digits alone may be read as decimal (the key's last
 * component only). */
static bool component_hash(const char *s, size_t n, bool may_be_decimal, uint64_t *hash)
{
    bool neg = false;
    bool prefixed = false;
    if (n > 0 && s[0] == '-') {
        neg = true;
        s++, n--;
    }
    if (n > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        prefixed = true;
        s += 2, n -= 2;
    }
    if (n == 0)
        return false;

    bool all_dec = true;
    for (size_t i = 0; i < n; i++) {
        int v = kvp_parse_hex_digit(s[i]);
        if (v < 0)
            return false;
        if (v > 9)
            all_dec = false;
    }
    if (!prefixed && n < 8)
        return false;

    uint64_t v = 0;
    bool decimal = false;
    if (!prefixed && may_be_decimal && all_dec && n <= 20) {
        decimal = true;
        for (size_t i = 0; i < n && decimal; i++) {
            uint64_t d = (uint64_t)(s[i] - '0');
            if (v > (UINT64_MAX - d) / 10)
                decimal = false; /* does not fit u64: read as hex below */
            else
                v = v * 10 + d;
        }
    }
    if (!decimal) {
        v = 0;
        for (size_t i = n > 16 ? n - 16 : 0; i < n; i++)
            v = v << 4 | (uint64_t)kvp_parse_hex_digit(s[i]);
    }
    *hash = neg ? (uint64_t)0 - v : v;
    return true;
}

int kvp_events_key_hash(const char *key, size_t key_len, uint64_t *hash)
{
    if (key == NULL)
        return 0;
    size_t end = key_len;
    for (int skips = 0; skips <= 3; skips++) {
        size_t start = end;
        while (start > 0 && key[start - 1] != '@' && key[start - 1] != '_')
            start--;
        uint64_t v;
        if (component_hash(key + start, end - start, skips == 0, &v)) {
            *hash = v;
            return 1;
        }
        if (start == 0 || end - start > 24)
            return 0;
        end = start - 1; /* skip this component and its separator */
    }
    return 0;
}

/* ---- the FIFO (under lock) ------------------------------------------------------------------ */

static void fifo_pop(kvp_events_t *ev)
{
    const ev_slot_t *s = &ev->slots[ev->head];
    ev->arena_used -= (uint32_t)s->skipped + s->key_len;
    ev->head = ev->head + 1 == ev->slots_cap ? 0 : ev->head + 1;
    ev->count--;
    if (ev->count == 0) {
        ev->arena_wpos = 0;
        ev->arena_used = 0;
    }
}

/* Where a key of len bytes goes now, and the bytes it skips at the arena's
 * end; false when it does not fit until older events go. */
static bool fifo_fits(const kvp_events_t *ev, uint32_t len, uint32_t *off_p, uint32_t *skip_p)
{
    if (ev->count == ev->slots_cap)
        return false;
    uint32_t free_bytes = ev->arena_cap - ev->arena_used;
    uint32_t to_end = ev->arena_cap - ev->arena_wpos;
    if (len <= to_end) {
        *off_p = ev->arena_wpos;
        *skip_p = 0;
        return len <= free_bytes;
    }
    *off_p = 0;
    *skip_p = to_end;
    return (uint64_t)to_end + len <= free_bytes;
}

static void wake_publisher(kvp_events_t *ev)
{
    uint64_t one = 1;
    if (write(ev->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        KVP_LOG_ERROR("kv events: cannot wake the publisher: %m");
}

static void push(kvp_events_t *ev, ev_type_t type, kvp_medium_t medium, const char *key,
                 size_t key_len)
{
    if (ev == NULL || (unsigned)medium >= KVP_MEDIUM_COUNT)
        return;
    if (key == NULL)
        key_len = 0;
    uint32_t len = key_len > KEY_MAX ? KEY_MAX : (uint32_t)key_len;
    uint64_t ts_ms = wall_ns() / 1000000ull;

    pthread_mutex_lock(&ev->lock);
    uint32_t off, skip;
    while (!fifo_fits(ev, len, &off, &skip)) {
        fifo_pop(ev); /* the arena always holds one KEY_MAX key, so this ends */
        ev->dropped++;
    }
    uint32_t idx = ev->head + ev->count;
    if (idx >= ev->slots_cap)
        idx -= ev->slots_cap;
    ev_slot_t *s = &ev->slots[idx];
    s->ts_ms = ts_ms;
    s->key_off = off;
    s->key_len = (uint16_t)len;
    s->skipped = (uint16_t)skip;
    s->type = (uint8_t)type;
    s->medium = (uint8_t)medium;
    if (len > 0)
        memcpy(ev->arena + off, key, len);
    ev->arena_wpos = off + len;
    ev->arena_used += skip + len;
    ev->count++;
    bool wake = ev->sleeping;
    ev->sleeping = false;
    pthread_mutex_unlock(&ev->lock);

    if (wake)
        wake_publisher(ev);
}

void kvp_events_stored(kvp_events_t *ev, kvp_medium_t medium, const char *key, size_t key_len)
{
    push(ev, EV_STORED, medium, key, key_len);
}

void kvp_events_removed(kvp_events_t *ev, kvp_medium_t medium, const char *key, size_t key_len)
{
    push(ev, EV_REMOVED, medium, key, key_len);
}

void kvp_events_cleared(kvp_events_t *ev, kvp_medium_t medium)
{
    push(ev, EV_CLEARED, medium, NULL, 0);
}

void kvp_events_stats(kvp_events_t *ev, kvp_events_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    if (ev == NULL)
        return;
    pthread_mutex_lock(&ev->lock);
    out->queued = ev->count;
    out->dropped = ev->dropped;
    pthread_mutex_unlock(&ev->lock);
    out->published = atomic_load_explicit(&ev->published, memory_order_acquire);
    out->batches = atomic_load_explicit(&ev->batches, memory_order_relaxed);
    out->replay_requests = atomic_load_explicit(&ev->replay_requests, memory_order_relaxed);
    out->curve = ev->curve != NULL;
    kvp_events_curve_stats(ev->curve, &out->refused_curve, &out->refused_key);
    out->refused_topic = atomic_load_explicit(&ev->refused_topic, memory_order_relaxed);
    out->cuts = atomic_load_explicit(&ev->cuts, memory_order_relaxed);
}

void kvp_events_reload(kvp_events_t *ev)
{
    if (ev == NULL || ev->curve == NULL || kvp_events_curve_reload(ev->curve) == 0)
        return;
    /* the publisher takes no batch before it has seen this (same lock as take_batch): an
     * event pushed after we return goes out on the fresh sockets only */
    pthread_mutex_lock(&ev->lock);
    ev->cut = true;
    ev->sleeping = false;
    pthread_mutex_unlock(&ev->lock);
    wake_publisher(ev);
}

const char *kvp_events_endpoint(const kvp_events_t *ev, int replay)
{
    if (ev == NULL)
        return "";
    return ev->endpoint[replay ? 1 : 0];
}

/* ---- the publisher thread ------------------------------------------------------------------- */

/* Move up to batch_max events (and BATCH_KEY_BYTES of keys) into ev->batch. Under lock. */
static uint32_t take_batch(kvp_events_t *ev)
{
    uint32_t n = 0;
    uint32_t bytes = 0;
    while (ev->count > 0 && n < ev->batch_max) {
        const ev_slot_t *s = &ev->slots[ev->head];
        if (n > 0 && bytes + s->key_len > BATCH_KEY_BYTES)
            break;
        ev->batch[n] = *s;
        ev->batch[n].key_off = bytes;
        memcpy(ev->batch_keys + bytes, ev->arena + s->key_off, s->key_len);
        bytes += s->key_len;
        n++;
        fifo_pop(ev);
    }
    return n;
}

static int pack_write(void *data, const char *buf, size_t len)
{
    kvp_events_t *ev = data;
    if (msgpack_sbuffer_write(&ev->sbuf, buf, len) != 0)
        ev->pack_failed = true;
    return 0;
}

static void pack_str_n(msgpack_packer *pk, const char *s, size_t n)
{
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    if (s == NULL)
        msgpack_pack_nil(pk);
    else
        pack_str_n(pk, s, strlen(s));
}

/* The length of the tenant an internal key starts with (TENANT 0x1f KEY); 0: none. */
static size_t key_tenant_len(const char *key, size_t len)
{
    const char *sep = memchr(key, KVP_TENANT_SEP, len);
    if (sep == NULL || !kvp_tenant_name_valid(key, (size_t)(sep - key)))
        return 0;
    return (size_t)(sep - key);
}

static void pack_event(kvp_events_t *ev, msgpack_packer *pk, const ev_slot_t *s, ev_stream_t *st)
{
    static const uint32_t fields[] = {[EV_STORED] = 16, [EV_REMOVED] = 14, [EV_CLEARED] = 11};
    const char *key = ev->batch_keys + s->key_off;
    size_t key_len = s->key_len;
    size_t tenant_len = s->type == EV_CLEARED ? 0 : key_tenant_len(key, key_len);
    msgpack_pack_map(pk, fields[s->type]);
    pack_str(pk, "event_id");
    msgpack_pack_uint64(pk, st->next_id[s->medium]++);
    pack_str(pk, "timestamp");
    msgpack_pack_uint64(pk, s->ts_ms);
    pack_str(pk, "event_type");
    pack_str(pk, type_names[s->type]);
    pack_str(pk, "model_name");
    pack_str(pk, ev->model_name);
    pack_str(pk, "block_size");
    msgpack_pack_uint32(pk, ev->block_size);
    pack_str(pk, "additional_salt");
    pack_str(pk, ev->additional_salt);
    pack_str(pk, "lora_name");
    pack_str(pk, ev->lora_name);
    /* the tenant's name; keys of no tenant and those of the ACL's "default" tenant (its
     * principals name none, master/auth/acl.c): the tenant_id setting, as before an ACL */
    const char *tenant = tenant_len > 0 ? key : st->tenant;
    size_t tn = tenant_len > 0 ? tenant_len : strlen(st->tenant);
    if (tn == 0 || (tn == 7 && memcmp(tenant, "default", 7) == 0)) {
        tenant = ev->tenant_id;
        tn = strlen(tenant);
    }
    pack_str(pk, "tenant_id");
    pack_str_n(pk, tenant, tn);
    pack_str(pk, "backend_id");
    pack_str(pk, ev->backend_id);
    pack_str(pk, "medium");
    pack_str(pk, medium_names[s->medium]);
    pack_str(pk, "dp_rank");
    msgpack_pack_int32(pk, ev->dp_rank);
    if (s->type == EV_CLEARED)
        return;

    if (tenant_len > 0) { /* the key its user gave */
        key += tenant_len + 1;
        key_len -= tenant_len + 1;
    }
    uint64_t hash;
    pack_str(pk, "seq_hashes");
    if (kvp_events_key_hash(key, key_len, &hash)) {
        msgpack_pack_array(pk, 1);
        msgpack_pack_uint64(pk, hash);
    } else {
        msgpack_pack_array(pk, 0);
    }
    pack_str(pk, "base_block_idx");
    msgpack_pack_nil(pk);
    if (s->type == EV_STORED) {
        pack_str(pk, "parent_hash");
        msgpack_pack_nil(pk);
        pack_str(pk, "token_ids");
        msgpack_pack_nil(pk);
    }
    pack_str(pk, "object_key");
    pack_str_n(pk, key, key_len);
}

static bool warn_now(kvp_events_t *ev)
{
    uint64_t now = kvp_now_ns();
    if (ev->last_warn_ns != 0 && now - ev->last_warn_ns < WARN_EVERY_NS)
        return false;
    ev->last_warn_ns = now;
    return true;
}

/* Keep a copy of batch g (seq in stream) for replays, dropping the oldest
 * past the ring's size or REPLAY_BYTES_MAX. */
static void ring_keep(kvp_events_t *ev, uint64_t g, uint32_t stream, uint64_t seq,
                      const char *payload, size_t len)
{
    if (ev->ring_cap == 0) {
        ev->ring_oldest = g + 1;
        return;
    }
    while (ev->ring_oldest < g &&
           (g - ev->ring_oldest >= ev->ring_cap || ev->ring_bytes + len > REPLAY_BYTES_MAX)) {
        replay_entry_t *old = &ev->ring[ev->ring_oldest % ev->ring_cap];
        ev->ring_bytes -= old->len;
        free(old->data);
        old->data = NULL;
        old->len = 0;
        ev->ring_oldest++;
    }
    replay_entry_t *e = &ev->ring[g % ev->ring_cap];
    e->g = g;
    e->seq = seq;
    e->stream = stream;
    e->data = malloc(len);
    e->len = 0;
    if (e->data == NULL) {
        if (warn_now(ev))
            KVP_LOG_WARN("kv events: out of memory keeping batch %llu for replays",
                         (unsigned long long)seq);
        return;
    }
    memcpy(e->data, payload, len);
    e->len = len;
    ev->ring_bytes += len;
}

/* The stream of tenant[0..n), made at its first event; STREAM_NONE when no
 * more fit (the event is dropped). */
static uint32_t stream_get(kvp_events_t *ev, const char *tenant, size_t n)
{
    const ev_stream_t *last = ev->streams[ev->last_stream];
    if (strlen(last->tenant) == n && memcmp(last->tenant, tenant, n) == 0)
        return ev->last_stream;
    for (uint32_t i = 1; i < ev->n_streams; i++)
        if (strlen(ev->streams[i]->tenant) == n && memcmp(ev->streams[i]->tenant, tenant, n) == 0)
            return ev->last_stream = i;
    ev_stream_t *st = ev->n_streams < ev->streams_cap ? calloc(1, sizeof(*st)) : NULL;
    char *topic = st != NULL ? malloc(ev->topic_len + n + 3) : NULL;
    if (topic == NULL) {
        free(st);
        KVP_LOG_WARN_LIMITED("kv events: no stream for tenant %.*s (%u streams, or out of "
                             "memory): its events are dropped",
                             (int)n, tenant, ev->n_streams);
        return STREAM_NONE;
    }
    memcpy(st->tenant, tenant, n);
    st->topic = topic;
    st->topic_len = (size_t)sprintf(topic, "%s/%.*s/", ev->topic, (int)n, tenant);
    ev->streams[ev->n_streams] = st;
    return ev->last_stream = ev->n_streams++;
}

/* Send the events of the batch that belong to stream sid as one message of
 * it; the number of events lost (out of memory), 0 when sent or none. */
static uint32_t publish_stream(kvp_events_t *ev, uint32_t sid, uint32_t n)
{
    ev_stream_t *st = ev->streams[sid];
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        k += ev->stream_of[i] == sid || ev->stream_of[i] == STREAM_ALL;
    if (k == 0)
        return 0;
    msgpack_sbuffer_clear(&ev->sbuf);
    ev->pack_failed = false;
    msgpack_packer pk;
    msgpack_packer_init(&pk, ev, pack_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, (double)wall_ns() / 1e9);
    msgpack_pack_array(&pk, k);
    for (uint32_t i = 0; i < n; i++)
        if (ev->stream_of[i] == sid || ev->stream_of[i] == STREAM_ALL)
            pack_event(ev, &pk, &ev->batch[i], st);
    msgpack_pack_int32(&pk, ev->dp_rank);
    if (ev->pack_failed) {
        /* the ids given are lost with the batch; subscribers see the gap */
        KVP_LOG_ERROR("kv events: out of memory encoding a batch of %u events; dropped", k);
        return k;
    }

    uint64_t seq = st->next_seq++;
    uint64_t g = ev->next_g++;
    uint8_t seq_be[8];
    put_be64(seq_be, seq);
    if (ev->pub == NULL) {
        /* lost in a cut (logged there): only the replay ring keeps it */
    } else if (zmq_send(ev->pub, st->topic, st->topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
               zmq_send(ev->pub, seq_be, sizeof(seq_be), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
               zmq_send(ev->pub, ev->sbuf.data, ev->sbuf.size, ZMQ_DONTWAIT) < 0) {
        /* kept for replay all the same: a subscriber sees the gap and asks */
        if (warn_now(ev))
            KVP_LOG_WARN("kv events: cannot send batch %llu: %s", (unsigned long long)seq,
                         zmq_strerror(zmq_errno()));
    }
    ring_keep(ev, g, sid, seq, ev->sbuf.data, ev->sbuf.size);
    atomic_fetch_add_explicit(&ev->batches, 1, memory_order_relaxed);
    return 0;
}

/* Publish the n events of ev->batch: one message without CURVE, else one
 * per stream they belong to (in the order of their first event). */
static void publish_batch(kvp_events_t *ev, uint32_t n)
{
    uint32_t lost = 0;
    bool cleared = false;
    for (uint32_t i = 0; i < n; i++) {
        const ev_slot_t *s = &ev->batch[i];
        size_t tl = 0;
        if (ev->curve == NULL)
            ev->stream_of[i] = 0;
        else if (s->type == EV_CLEARED)
            ev->stream_of[i] = STREAM_ALL, cleared = true;
        else if ((tl = key_tenant_len(ev->batch_keys + s->key_off, s->key_len)) == 0)
            /* the default tenant's keys are stored as given (master/meta/tenant.h) */
            ev->stream_of[i] = ev->tenants ? stream_get(ev, KVP_TENANT_DEFAULT, 7) : 0;
        else
            ev->stream_of[i] = stream_get(ev, ev->batch_keys + s->key_off, tl);
        lost += ev->stream_of[i] == STREAM_NONE;
    }
    ev->round++;
    for (uint32_t i = 0; i < (cleared ? ev->n_streams : n); i++) {
        uint32_t sid = cleared ? i : ev->stream_of[i];
        if (sid == STREAM_NONE || ev->streams[sid]->round == ev->round)
            continue;
        ev->streams[sid]->round = ev->round;
        lost += publish_stream(ev, sid, n);
    }
    if (lost > n)
        lost = n; /* a cleared lost in several streams counts once */
    if (lost > 0) {
        pthread_mutex_lock(&ev->lock);
        ev->dropped += lost;
        pthread_mutex_unlock(&ev->lock);
    }
    /* batches first: a reader that sees these events published sees their batch */
    atomic_fetch_add_explicit(&ev->published, n - lost, memory_order_release);
}

/* ---- subscriptions (CURVE: the XPUB's, checked against the subscriber's tenant) ------------- */

/* Apply the (un)subscriptions waiting on the XPUB. A "*" subscriber's as
 * given; a tenant's, when a prefix of its own stream's topic, as that topic
 * (so it hears its stream alone); any other is refused. */
static void subs_serve(kvp_events_t *ev)
{
    for (int i = 0; ev->pub != NULL && i < SUBS_PER_ROUND; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, ev->pub, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        const uint8_t *d = zmq_msg_data(&m);
        size_t size = zmq_msg_size(&m);
        /* no User-Id: libzmq's own unsubscription when a subscriber leaves (its
         * subscriptions go with it) */
        const char *uid = zmq_msg_gets(&m, "User-Id");
        if (size == 0 || d[0] > 1 || uid == NULL || uid[0] == '\0') {
            zmq_msg_close(&m);
            continue;
        }
        int opt = d[0] == 1 ? ZMQ_SUBSCRIBE : ZMQ_UNSUBSCRIBE;
        const char *topic = (const char *)d + 1;
        size_t topic_len = size - 1;
        char own[TOPIC_MAX + KVP_EVENTS_TENANT_MAX + 3];
        if (strcmp(uid, "*") != 0) {
            int own_len = snprintf(own, sizeof(own), "%s/%s/", ev->topic, uid);
            if (topic_len > (size_t)own_len || memcmp(topic, own, topic_len) != 0) {
                atomic_fetch_add_explicit(&ev->refused_topic, 1, memory_order_relaxed);
                KVP_LOG_WARN_LIMITED("kv events: refused a subscription of a tenant %s "
                                     "subscriber to a topic of %zu bytes outside its own (%s)",
                                     uid, topic_len, own);
                zmq_msg_close(&m);
                continue;
            }
            topic = own;
            topic_len = (size_t)own_len;
        }
        if (zmq_setsockopt(ev->pub, opt, topic, topic_len) != 0)
            KVP_LOG_WARN_LIMITED("kv events: cannot apply a subscription: %s",
                                 zmq_strerror(zmq_errno()));
        zmq_msg_close(&m);
    }
}

/* ---- replays -------------------------------------------------------------------------------- */

/* Send frames of one reply; false when the client cannot take it now. */
static bool replay_send(kvp_events_t *ev, const char *id, size_t id_len, bool delim,
                        const uint8_t seq_be[8], const void *payload, size_t len)
{
    if (zmq_send(ev->replay, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return false;
    if (delim && zmq_send(ev->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return false;
    if (zmq_send(ev->replay, seq_be, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return false;
    return zmq_send(ev->replay, payload, len, ZMQ_DONTWAIT) >= 0;
}

/* The stream a replay request asks for (topic NULL: none named), for a
 * subscriber of tenant uid (NULL: no CURVE); STREAM_NONE: none yet (the
 * answer is empty); STREAM_ALL: refused. */
static uint32_t replay_stream(kvp_events_t *ev, const char *uid, const char *topic,
                              size_t topic_len)
{
    if (ev->curve == NULL)
        return topic == NULL ||
                       (topic_len == ev->topic_len && memcmp(topic, ev->topic, topic_len) == 0)
                   ? 0
                   : STREAM_NONE;
    if (uid == NULL || uid[0] == '\0')
        return STREAM_ALL;
    bool all = strcmp(uid, "*") == 0;
    if (topic == NULL && all)
        return 0;
    for (uint32_t i = 0; i < ev->n_streams; i++) {
        const ev_stream_t *st = ev->streams[i];
        bool mine = all || strcmp(st->tenant, uid) == 0;
        if (topic == NULL ? mine
                          : topic_len == st->topic_len && memcmp(topic, st->topic, topic_len) == 0)
            return mine ? i : STREAM_ALL;
    }
    if (all || topic == NULL)
        return STREAM_NONE;
    char own[TOPIC_MAX + KVP_EVENTS_TENANT_MAX + 3];
    int own_len = snprintf(own, sizeof(own), "%s/%s/", ev->topic, uid);
    bool mine = topic_len == (size_t)own_len && memcmp(topic, own, topic_len) == 0;
    return mine ? STREAM_NONE : STREAM_ALL;
}

/* Answer one request waiting on the ROUTER: false when there is none. */
static bool replay_serve_one(kvp_events_t *ev)
{
    char id[256];
    size_t id_len = 0;
    char frames[3][TOPIC_MAX];
    size_t sizes[3] = {0, 0, 0};
    char uid[KVP_EVENTS_TENANT_MAX + 2] = "";
    int nframes = 0;
    zmq_msg_t m;
    for (;;) {
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, ev->replay, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            if (nframes == 0)
                return false;
            break; /* cannot happen: ZeroMQ delivers whole messages */
        }
        size_t size = zmq_msg_size(&m);
        if (nframes == 0) {
            id_len = size < sizeof(id) ? size : sizeof(id);
            memcpy(id, zmq_msg_data(&m), id_len);
        } else {
            const char *u = ev->curve != NULL ? zmq_msg_gets(&m, "User-Id") : NULL;
            if (u != NULL)
                snprintf(uid, sizeof(uid), "%s", u);
            if (nframes <= 3) {
                sizes[nframes - 1] = size;
                if (size <= TOPIC_MAX)
                    memcpy(frames[nframes - 1], zmq_msg_data(&m), size);
            }
        }
        nframes++;
        bool more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        if (!more)
            break;
    }

    /* [id, ["",] [topic,] seq]: REQ (or a DEALER as vLLM's clients) sends the "" */
    int k = nframes - 1;
    bool delim = k >= 2 && sizes[0] == 0;
    int first = delim ? 1 : 0;
    const char *topic = NULL;
    size_t topic_len = 0;
    const uint8_t *start_be = NULL;
    if (k - first == 1 && sizes[first] == 8) {
        start_be = (const uint8_t *)frames[first];
    } else if (k - first == 2 && sizes[first] > 0 && sizes[first] <= TOPIC_MAX &&
               sizes[first + 1] == 8) {
        topic = frames[first];
        topic_len = sizes[first];
        start_be = (const uint8_t *)frames[first + 1];
    } else {
        if (warn_now(ev))
            KVP_LOG_WARN("kv events: ignored a replay request of %d frames; send [8-byte "
                         "big-endian start seq] from a REQ socket",
                         k);
        return true;
    }
    uint64_t start = get_be64(start_be);
    uint32_t sid = replay_stream(ev, ev->curve != NULL ? uid : NULL, topic, topic_len);
    if (sid == STREAM_ALL) {
        atomic_fetch_add_explicit(&ev->refused_topic, 1, memory_order_relaxed);
        KVP_LOG_WARN_LIMITED("kv events: refused a replay of a stream outside the tenant %s "
                             "of its subscriber (answered with nothing)",
                             uid);
        sid = STREAM_NONE;
    }
    atomic_fetch_add_explicit(&ev->replay_requests, 1, memory_order_relaxed);

    /* a stream's seq never passes the batch's g: batches before g = start hold none asked */
    uint64_t g = start > ev->ring_oldest ? start : ev->ring_oldest;
    uint8_t seq_be[8];
    for (; sid != STREAM_NONE && ev->ring_cap > 0 && g < ev->next_g; g++) {
        const replay_entry_t *e = &ev->ring[g % ev->ring_cap];
        if (e->g != g || e->data == NULL || e->stream != sid || e->seq < start)
            continue;
        put_be64(seq_be, e->seq);
        if (!replay_send(ev, id, id_len, delim, seq_be, e->data, e->len))
            goto err_client;
    }
    memset(seq_be, 0xff, sizeof(seq_be)); /* -1: the end */
    if (!replay_send(ev, id, id_len, delim, seq_be, "", 0))
        goto err_client;
    return true;

err_client:
    if (warn_now(ev))
        KVP_LOG_WARN("kv events: replay from %llu cut: the client is gone or has a "
                     "replay unread (%s)",
                     (unsigned long long)start, zmq_strerror(zmq_errno()));
    return true;
}

static void replay_serve(kvp_events_t *ev)
{
    if (ev->replay == NULL)
        return;
    for (int i = 0; i < REPLAYS_PER_ROUND; i++)
        if (!replay_serve_one(ev))
            return;
}

/* Between batches: handshakes, subscriptions and replays that wait. */
static void serve_sockets(kvp_events_t *ev)
{
    if (ev->curve != NULL) {
        kvp_events_curve_serve(ev->curve);
        subs_serve(ev);
    }
    replay_serve(ev);
}

/* ---- the sockets: open, bind, and reopen after a cut ---------------------------------------- */

static const char *const sock_names[2] = {"pub", "replay"};

/* A fresh socket i (0: pub, 1: replay), not bound; a CURVE server when ev->curve is set,
 * with the key of like (the socket it replaces; NULL: the key read at create). */
static kvp_status_t open_socket(kvp_events_t *ev, int i, void *like, void **sock_p, char *err,
                                size_t err_len)
{
    int type = i == 1 ? ZMQ_ROUTER : ev->curve != NULL ? ZMQ_XPUB : ZMQ_PUB;
    int hwm = i == 1 ? ev->replay_hwm : PUB_SNDHWM;
    int linger = i == 1 ? 0 : PUB_LINGER_MS;
    void *sock = zmq_socket(ev->zctx, type);
    if (sock == NULL) {
        kvp_errf(err, err_len, "kv events: cannot create a ZeroMQ socket: %s",
                 zmq_strerror(zmq_errno()));
        return KVP_ERR_SYSTEM;
    }
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof(hwm)) != 0 ||
        zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        (type == ZMQ_ROUTER &&
         zmq_setsockopt(sock, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)) != 0) ||
        (type == ZMQ_XPUB && zmq_setsockopt(sock, ZMQ_XPUB_MANUAL, &one, sizeof(one)) != 0)) {
        kvp_errf(err, err_len, "kv events: cannot set socket options: %s",
                 zmq_strerror(zmq_errno()));
        zmq_close(sock);
        return KVP_ERR_SYSTEM;
    }
    if (ev->curve != NULL) {
        kvp_status_t status =
            kvp_events_curve_secure(ev->curve, sock, like, sock_names[i], err, err_len);
        if (status != KVP_OK) {
            zmq_close(sock);
            return status;
        }
    }
    *sock_p = sock;
    return KVP_OK;
}

/* Bind socket i at create; the address bound (the port resolved) into ev->endpoint[i]. */
static kvp_status_t bind_first(kvp_events_t *ev, int i, const char *endpoint, char *err,
                               size_t err_len)
{
    void *sock = i == 0 ? ev->pub : ev->replay;
    if (zmq_bind(sock, endpoint) != 0) {
        int e = zmq_errno();
        bool bad = e == EINVAL || e == EPROTONOSUPPORT || e == ENOCOMPATPROTO;
        kvp_errf(err, err_len, "kv events: cannot bind %s: %s; %s", endpoint, zmq_strerror(e),
                 bad ? "give an endpoint such as tcp://127.0.0.1:5557 or ipc:///path"
                     : "pick a free port or address");
        return bad ? KVP_ERR_INVALID_ARG : KVP_ERR_SYSTEM;
    }
    size_t len = sizeof(ev->endpoint[i]);
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ev->endpoint[i], &len) != 0)
        snprintf(ev->endpoint[i], sizeof(ev->endpoint[i]), "%s", endpoint);
    ev->bound[i] = true;
    return KVP_OK;
}

/* Wait up to ms for sock (NULL: none) to be readable, answering the ZAP handler (and the
 * monitors) meanwhile: true when sock is. A connection's teardown waits for the ZAP
 * socket, which libzmq hands its part of the work only when this thread calls it. */
static bool serve_curve_for(kvp_events_t *ev, void *sock, long ms)
{
    zmq_pollitem_t items[1 + KVP_EVENTS_CURVE_ITEMS];
    int n = 0;
    if (sock != NULL)
        items[n++] = (zmq_pollitem_t){.socket = sock, .events = ZMQ_POLLIN};
    if (ev->curve != NULL)
        n += kvp_events_curve_poll_items(ev->curve, items + n);
    int rc = zmq_poll(items, n, ms);
    if (ev->curve != NULL)
        kvp_events_curve_serve(ev->curve);
    return rc > 0 && sock != NULL && (items[0].revents & ZMQ_POLLIN);
}

/* Close sock at once (linger 0: what it still queues is dropped) and wait, up to
 * CLOSE_WAIT_NS, until libzmq has torn it down, listener and connections included:
 * zmq_close only hands it to the reaper thread, and its endpoint is taken until then (a
 * tcp port refuses a bind; an ipc file could be unlinked under the fresh socket by an old
 * listener's close). The socket's destructor says so on a monitor of its own
 * (ZMQ_EVENT_MONITOR_STOPPED; it replaces CURVE's, stopped already). */
static void close_and_wait(kvp_events_t *ev, void *sock)
{
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
    char ep[64];
    snprintf(ep, sizeof(ep), "inproc://kvp-events-closing-%u", ev->closing_gen++);
    void *mon = NULL;
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_MONITOR_STOPPED) == 0 &&
        (mon = zmq_socket(ev->zctx, ZMQ_PAIR)) != NULL &&
        (zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof(zero)) != 0 || zmq_connect(mon, ep) != 0)) {
        zmq_close(mon);
        mon = NULL;
    }
    zmq_close(sock);
    if (mon == NULL)
        return; /* the bind is retried all the same */
    uint64_t deadline = kvp_now_ns() + CLOSE_WAIT_NS;
    bool stopped = false;
    for (uint64_t now = kvp_now_ns(); !stopped && now < deadline; now = kvp_now_ns()) {
        if (!serve_curve_for(ev, mon, (long)((deadline - now) / 1000000ull) + 1))
            continue;
        uint8_t head[6] = {0};
        for (int k = 0;; k++) { /* [event u16 + value u32, endpoint] */
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, mon, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                break;
            }
            if (k == 0 && zmq_msg_size(&m) >= sizeof(head))
                memcpy(head, zmq_msg_data(&m), sizeof(head));
            bool more = zmq_msg_more(&m);
            zmq_msg_close(&m);
            if (!more)
                break;
        }
        uint16_t event;
        memcpy(&event, head, sizeof(event)); /* host order, as libzmq writes it */
        stopped = event == ZMQ_EVENT_MONITOR_STOPPED;
    }
    if (!stopped)
        KVP_LOG_WARN("kv events: a socket closed was not torn down within %llu ms; binding its "
                     "endpoint again may take retries",
                     (unsigned long long)(CLOSE_WAIT_NS / 1000000ull));
    zmq_close(mon);
}

/* Bind the sockets a cut left unbound to their endpoints again; true when all are bound.
 * first: the try right after the cut (a failure is logged at the retries' end). */
static bool bind_again(kvp_events_t *ev, bool first)
{
    bool all = true;
    for (int i = 0; i < 2; i++) {
        void *sock = i == 0 ? ev->pub : ev->replay;
        if (sock == NULL || ev->bound[i])
            continue;
        if (zmq_bind(sock, ev->endpoint[i]) == 0) {
            ev->bound[i] = true;
            if (!first)
                KVP_LOG_INFO("kv events: %s bound again", ev->endpoint[i]);
            continue;
        }
        all = false;
        if (!first && warn_now(ev))
            KVP_LOG_WARN("kv events: cannot bind %s again after closing it: %s; retrying "
                         "every %llu ms (batches meanwhile go to the replay ring only)",
                         ev->endpoint[i], zmq_strerror(zmq_errno()),
                         (unsigned long long)(REBIND_EVERY_NS / 1000000ull));
    }
    ev->next_bind_ns = kvp_now_ns() + REBIND_EVERY_NS;
    return all;
}

/*
 * A reload removed a key from the allow-list (or moved it to another tenant). libzmq
 * cannot drop one connection of an XPUB or a ROUTER, and asks ZAP at a handshake only, so
 * close both sockets and bind fresh ones on the same endpoints: every subscriber's
 * connection goes, ZeroMQ reconnects them, and ZAP asks the new list (a removed key is
 * refused and counted). Nothing is sent on the old sockets after this starts, and the
 * caller takes no batch before it (ev->cut under the lock): an event pushed after
 * kvp_events_reload returned reaches the fresh sockets only. Streams, seqs, event_ids and
 * the replay ring are the publisher's, not the sockets': they go on. Batches then wait
 * CUT_HOLD_NS so that subscribers reconnecting at ZeroMQ's default interval (100 ms and a
 * random part up to as much again) hear them live; a later one sees a gap in the seqs and
 * replays it. Publisher thread.
 */
static void cut_subscribers(kvp_events_t *ev)
{
    uint64_t t0 = kvp_now_ns();
    for (int i = 0; i < 2; i++) {
        void **sock_p = i == 0 ? &ev->pub : &ev->replay;
        if (*sock_p == NULL)
            continue;
        void *fresh = NULL;
        char err[256];
        if (open_socket(ev, i, *sock_p, &fresh, err, sizeof(err)) != KVP_OK)
            KVP_LOG_ERROR("kv events: %s; the %s socket is closed (the removed keys must go) "
                          "and stays closed: restart the master to publish there again",
                          err, ev->endpoint[i]);
        close_and_wait(ev, *sock_p); /* fails closed: the old one goes in any case */
        *sock_p = fresh;
        ev->bound[i] = false;
    }
    bool all = bind_again(ev, true);
    while (!all && kvp_now_ns() - t0 < REBIND_WAIT_NS) {
        serve_curve_for(ev, NULL, 2); /* the endpoint may be held a little longer */
        all = bind_again(ev, true);
    }
    if (!all)
        bind_again(ev, false); /* logs why; the loop retries every REBIND_EVERY_NS */
    atomic_fetch_add_explicit(&ev->cuts, 1, memory_order_relaxed);
    ev->hold_until_ns = kvp_now_ns() + CUT_HOLD_NS;
    KVP_LOG_INFO("kv events: a key left the allow-list: every subscriber connection closed, "
                 "%s%s%s opened again in %llu ms; allowed keys reconnect by themselves "
                 "(batches wait %llu ms for them; a gap in the seqs is replayed), removed ones "
                 "are refused",
                 ev->endpoint[0], ev->replay != NULL ? " and " : "",
                 ev->replay != NULL ? ev->endpoint[1] : "",
                 (unsigned long long)((kvp_now_ns() - t0) / 1000000ull),
                 (unsigned long long)(CUT_HOLD_NS / 1000000ull));
}

/* Wait up to timeout_ms for an event pushed or a socket to serve, and serve them. */
static void wait_for_work(kvp_events_t *ev, long timeout_ms)
{
    zmq_pollitem_t items[3 + KVP_EVENTS_CURVE_ITEMS] = {
        {.socket = NULL, .fd = ev->wake_fd, .events = ZMQ_POLLIN},
    };
    int n = 1;
    if (ev->replay != NULL)
        items[n++] = (zmq_pollitem_t){.socket = ev->replay, .events = ZMQ_POLLIN};
    if (ev->curve != NULL) {
        if (ev->pub != NULL)
            items[n++] = (zmq_pollitem_t){.socket = ev->pub, .events = ZMQ_POLLIN};
        n += kvp_events_curve_poll_items(ev->curve, items + n);
    }
    int rc = zmq_poll(items, n, timeout_ms);
    if (rc < 0) {
        if (zmq_errno() != EINTR && warn_now(ev))
            KVP_LOG_WARN("kv events: zmq_poll: %s", zmq_strerror(zmq_errno()));
        return;
    }
    if (items[0].revents & ZMQ_POLLIN) {
        uint64_t v;
        if (read(ev->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
            KVP_LOG_ERROR("kv events: cannot read the wake-up eventfd: %m");
    }
    /* (every socket is served: a non-blocking read finds what the poll saw) */
    serve_sockets(ev);
}

static void *publisher_main(void *arg)
{
    kvp_events_t *ev = arg;
    for (;;) {
        bool unbound = (ev->pub != NULL && !ev->bound[0]) || (ev->replay != NULL && !ev->bound[1]);
        if (unbound && kvp_now_ns() >= ev->next_bind_ns)
            unbound = !bind_again(ev, false);
        pthread_mutex_lock(&ev->lock);
        bool stop = ev->stopping;
        if (ev->cut) {
            ev->cut = false;
            pthread_mutex_unlock(&ev->lock);
            cut_subscribers(ev);
            continue;
        }
        uint64_t now = kvp_now_ns();
        if (!stop && now < ev->hold_until_ns) { /* queued events wait; pushes need no wake-up */
            pthread_mutex_unlock(&ev->lock);
            wait_for_work(ev, (long)((ev->hold_until_ns - now) / 1000000ull) + 1);
            continue;
        }
        if (stop && now > ev->stop_deadline_ns && ev->count > 0) {
            KVP_LOG_WARN("kv events: %u events not sent within %llu ms of shutdown; dropped",
                         ev->count, (unsigned long long)(FLUSH_NS / 1000000ull));
            while (ev->count > 0) {
                fifo_pop(ev);
                ev->dropped++;
            }
        }
        uint32_t n = take_batch(ev);
        ev->sleeping = n == 0 && !stop;
        pthread_mutex_unlock(&ev->lock);

        if (n > 0) {
            publish_batch(ev, n);
            serve_sockets(ev);
            continue;
        }
        if (stop)
            break;
        wait_for_work(ev, unbound ? REBIND_POLL_MS : IDLE_POLL_MS);
    }
    return NULL;
}

/* ---- create / destroy ----------------------------------------------------------------------- */

void kvp_events_params_init(kvp_events_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->topic = "kvpool";
    p->queue_max = 65536;
    p->replay_batches = 4096;
    p->batch_max = 256;
    p->model_name = "kvpool";
    p->tenant_id = "default";
    p->backend_id = "kvpool-master";
}

/* A copy of s, or of dflt when s is NULL; NULL stays NULL when dflt is too
 * (nil fields), and so does "" for them. false: out of memory. */
static bool dup_setting(const char *s, const char *dflt, char **out)
{
    if (s == NULL)
        s = dflt;
    if (s == NULL || (dflt == NULL && s[0] == '\0')) {
        *out = NULL;
        return true;
    }
    *out = strdup(s);
    return *out != NULL;
}

static void free_settings(kvp_events_t *ev)
{
    free(ev->topic);
    free(ev->model_name);
    free(ev->additional_salt);
    free(ev->lora_name);
    free(ev->tenant_id);
    free(ev->backend_id);
}

static void free_buffers(kvp_events_t *ev)
{
    for (uint32_t i = 0; i < ev->n_streams; i++) {
        if (ev->streams[i]->topic != ev->topic)
            free(ev->streams[i]->topic);
        free(ev->streams[i]);
    }
    free(ev->streams);
    free(ev->stream_of);
    for (uint32_t i = 0; i < ev->ring_cap; i++)
        free(ev->ring[i].data);
    free(ev->ring);
    free(ev->batch_keys);
    free(ev->batch);
    free(ev->arena);
    free(ev->slots);
    msgpack_sbuffer_destroy(&ev->sbuf);
}

/* What kvp_events_create refuses before it allocates anything. */
static kvp_status_t check_params(const kvp_events_params_t *p, bool curve, char *err,
                                 size_t err_len)
{
    if (curve != (p->curve_allow != NULL && p->curve_allow[0] != '\0')) {
        kvp_errf(err, err_len,
                 "kv events: CURVE needs both the master's secret key "
                 "(--kv-events-curve-secret) and the subscribers' allow-list "
                 "(--kv-events-curve-allow)");
        return KVP_ERR_INVALID_ARG;
    }
    if (curve && p->topic != NULL && strlen(p->topic) > TOPIC_MAX - KVP_EVENTS_TENANT_MAX - 3) {
        kvp_errf(err, err_len, "kv events: a topic of %d bytes at most with CURVE",
                 TOPIC_MAX - KVP_EVENTS_TENANT_MAX - 3);
        return KVP_ERR_INVALID_ARG;
    }
    if (p->queue_max < 1 || p->queue_max > QUEUE_MAX_LIMIT || p->batch_max < 1 ||
        p->batch_max > BATCH_MAX_LIMIT || p->replay_batches > REPLAY_BATCHES_LIMIT) {
        kvp_errf(err, err_len,
                 "kv events: queue %u, batch %u, replay batches %u: give 1..%u, 1..%u and 0..%u",
                 p->queue_max, p->batch_max, p->replay_batches, QUEUE_MAX_LIMIT, BATCH_MAX_LIMIT,
                 REPLAY_BATCHES_LIMIT);
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}

/* The settings' copies, the queue, the batch, the replay ring and the first stream.
 * false: out of memory (free_buffers and free_settings undo what was done). */
static bool alloc_queue(kvp_events_t *ev, const kvp_events_params_t *p, bool curve)
{
    if (!dup_setting(p->topic, "kvpool", &ev->topic) ||
        !dup_setting(p->model_name, "kvpool", &ev->model_name) ||
        !dup_setting(p->additional_salt, NULL, &ev->additional_salt) ||
        !dup_setting(p->lora_name, NULL, &ev->lora_name) ||
        !dup_setting(p->tenant_id, "default", &ev->tenant_id) ||
        !dup_setting(p->backend_id, "kvpool-master", &ev->backend_id))
        return false;
    ev->topic_len = strlen(ev->topic);
    ev->block_size = p->block_size;
    ev->dp_rank = p->dp_rank;
    ev->batch_max = p->batch_max;

    ev->slots_cap = p->queue_max;
    ev->arena_cap = p->queue_max * ARENA_BYTES_PER_EVENT + KEY_MAX;
    ev->ring_cap = p->replay_batches;
    ev->slots = calloc(ev->slots_cap, sizeof(*ev->slots));
    ev->arena = malloc(ev->arena_cap);
    ev->batch = calloc(ev->batch_max, sizeof(*ev->batch));
    ev->batch_keys = malloc(BATCH_KEY_BYTES);
    ev->ring = ev->ring_cap > 0 ? calloc(ev->ring_cap, sizeof(*ev->ring)) : NULL;
    ev->streams_cap = curve ? STREAMS_MAX : 1;
    ev->streams = calloc(ev->streams_cap, sizeof(*ev->streams));
    ev->stream_of = calloc(ev->batch_max, sizeof(*ev->stream_of));
    if (ev->slots == NULL || ev->arena == NULL || ev->batch == NULL || ev->batch_keys == NULL ||
        (ev->ring_cap > 0 && ev->ring == NULL) || ev->streams == NULL || ev->stream_of == NULL ||
        (ev->streams[0] = calloc(1, sizeof(*ev->streams[0]))) == NULL)
        return false;
    ev->n_streams = 1;
    ev->streams[0]->topic = ev->topic; /* the stream of no tenant (of all without CURVE) */
    ev->streams[0]->topic_len = ev->topic_len;
    for (uint32_t i = 0; i < ev->ring_cap; i++)
        ev->ring[i].g = UINT64_MAX;
    return true;
}

/* Open and bind the PUB socket and, when asked for, the replay socket. On failure neither
 * stays open. */
static kvp_status_t bind_sockets(kvp_events_t *ev, const kvp_events_params_t *p, char *err,
                                 size_t err_len)
{
    kvp_status_t status = open_socket(ev, 0, NULL, &ev->pub, err, err_len);
    if (status != KVP_OK)
        return status;
    status = bind_first(ev, 0, p->bind, err, err_len);
    if (status != KVP_OK)
        goto err_close_pub;
    if (p->replay_bind != NULL && p->replay_bind[0] != '\0') {
        status = open_socket(ev, 1, NULL, &ev->replay, err, err_len);
        if (status != KVP_OK)
            goto err_close_pub;
        status = bind_first(ev, 1, p->replay_bind, err, err_len);
        if (status != KVP_OK)
            goto err_close_replay;
    }
    return KVP_OK;

err_close_replay:
    zmq_close(ev->replay);
    ev->replay = NULL;
err_close_pub:
    zmq_close(ev->pub);
    ev->pub = NULL;
    return status;
}

/* The publisher thread, with every signal blocked: signals go to the master's own threads
 * (its signalfd), never to this one. */
static kvp_status_t start_publisher(kvp_events_t *ev, char *err, size_t err_len)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&ev->thread, NULL, publisher_main, ev);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        kvp_errf(err, err_len, "kv events: cannot start the publisher thread: %s", strerror(rc));
        return KVP_ERR_SYSTEM;
    }
    return KVP_OK;
}

static void log_started(const kvp_events_t *ev, const kvp_events_params_t *p, bool curve)
{
    KVP_LOG_INFO("kv events: publishing on %s%s%s", ev->endpoint[0],
                 ev->replay != NULL ? ", replays on " : "", ev->endpoint[1]);
    if (curve)
        KVP_LOG_INFO("kv events: CURVE on, subscribers of the allow-list only; the master's "
                     "public key (the subscribers' server key) is %s",
                     kvp_events_curve_public(ev->curve));
    if (!curve && p->tenants)
        KVP_LOG_WARN("kv events: an ACL is on but KV events have no CURVE: every tenant's keys "
                     "are readable by anyone who reaches %s%s%s; give --kv-events-curve-secret "
                     "and --kv-events-curve-allow (docs/security.md, \"KV events: CURVE\")",
                     ev->endpoint[0], ev->replay != NULL ? " or " : "", ev->endpoint[1]);
}

/* The sink the state emits through (core/event_sink.h): the publisher's queue. */
static void sink_stored(void *ctx, kvp_medium_t medium, const char *key, size_t key_len)
{
    kvp_events_stored(ctx, medium, key, key_len);
}

static void sink_removed(void *ctx, kvp_medium_t medium, const char *key, size_t key_len)
{
    kvp_events_removed(ctx, medium, key, key_len);
}

static void sink_cleared(void *ctx, kvp_medium_t medium)
{
    kvp_events_cleared(ctx, medium);
}

static const kvp_event_sink_ops_t sink_ops = {
    .stored = sink_stored,
    .removed = sink_removed,
    .cleared = sink_cleared,
};

const kvp_event_sink_t *kvp_events_sink(kvp_events_t *ev)
{
    return ev != NULL ? &ev->sink : NULL;
}

kvp_status_t kvp_events_create(const kvp_events_params_t *p, kvp_events_t **ev_p, char *err,
                               size_t err_len)
{
    if (p == NULL || p->bind == NULL || p->bind[0] == '\0') {
        kvp_errf(err, err_len, "kv events: no endpoint to bind (e.g. tcp://127.0.0.1:5557)");
        return KVP_ERR_INVALID_ARG;
    }
    bool curve = p->curve_secret != NULL && p->curve_secret[0] != '\0';
    kvp_status_t status = check_params(p, curve, err, err_len);
    if (status != KVP_OK)
        return status;

    status = KVP_ERR_NOMEM;
    kvp_events_t *ev = calloc(1, sizeof(*ev));
    if (ev == NULL)
        goto err_nomem;
    msgpack_sbuffer_init(&ev->sbuf);
    ev->wake_fd = -1;
    ev->sink = (kvp_event_sink_t){.ops = &sink_ops, .ctx = ev};
    if (!alloc_queue(ev, p, curve))
        goto err_free;

    status = KVP_ERR_SYSTEM;
    if (pthread_mutex_init(&ev->lock, NULL) != 0) {
        kvp_errf(err, err_len, "kv events: cannot create a mutex");
        goto err_free;
    }
    ev->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ev->wake_fd < 0) {
        kvp_errf(err, err_len, "kv events: eventfd: %s", strerror(errno));
        goto err_destroy_lock;
    }
    ev->zctx = zmq_ctx_new();
    if (ev->zctx == NULL) {
        kvp_errf(err, err_len, "kv events: cannot create a ZeroMQ context: %s",
                 zmq_strerror(zmq_errno()));
        goto err_close_fd;
    }
    if (curve) {
        status = kvp_events_curve_create(ev->zctx, p->curve_secret, p->curve_allow, &ev->curve, err,
                                         err_len);
        if (status != KVP_OK)
            goto err_term_ctx;
    }
    ev->replay_hwm = (int)ev->ring_cap + 16; /* a whole replay fits: never cut silently */
    status = bind_sockets(ev, p, err, err_len);
    if (status != KVP_OK)
        goto err_destroy_curve;
    if (curve)
        kvp_events_curve_seal(ev->curve); /* libzmq holds the secret key now */
    ev->tenants = p->tenants != 0;        /* (read by the thread) */
    status = start_publisher(ev, err, err_len);
    if (status != KVP_OK)
        goto err_close_sockets;
    log_started(ev, p, curve);
    *ev_p = ev;
    return KVP_OK;

err_close_sockets:
    if (ev->replay != NULL)
        zmq_close(ev->replay);
    zmq_close(ev->pub);
err_destroy_curve:
    kvp_events_curve_destroy(ev->curve);
err_term_ctx:
    zmq_ctx_term(ev->zctx);
err_close_fd:
    close(ev->wake_fd);
err_destroy_lock:
    pthread_mutex_destroy(&ev->lock);
err_free:
    free_buffers(ev);
    free_settings(ev);
    free(ev);
err_nomem:
    if (status == KVP_ERR_NOMEM)
        kvp_errf(err, err_len, "kv events: out of memory for a queue of %u events", p->queue_max);
    return status;
}

void kvp_events_destroy(kvp_events_t *ev)
{
    if (ev == NULL)
        return;
    pthread_mutex_lock(&ev->lock);
    ev->stopping = true;
    ev->stop_deadline_ns = kvp_now_ns() + FLUSH_NS;
    pthread_mutex_unlock(&ev->lock);
    wake_publisher(ev);
    pthread_join(ev->thread, NULL);

    if (ev->replay != NULL)
        zmq_close(ev->replay);
    if (ev->pub != NULL)
        zmq_close(ev->pub);
    kvp_events_curve_destroy(ev->curve);
    zmq_ctx_term(ev->zctx); /* waits up to PUB_LINGER_MS for the last batches */
    close(ev->wake_fd);
    pthread_mutex_destroy(&ev->lock);
    free_buffers(ev);
    free_settings(ev);
    free(ev);
}
