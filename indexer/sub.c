/*
 * sub.c - the subscriber thread (sub.h; docs/indexer.md, "Order and recovery").
 *
 * Design. One thread owns every ZeroMQ socket: a SUB per publisher endpoint (all topics),
 * polled together with an eventfd that kvp_sub_wake writes when registrations change;
 * then the thread compares the index's subscriptions with its sockets, opening and
 * closing. Per publisher it keeps the next seq it expects. A message is
 * [topic, seq (8 bytes big-endian), payload]:
 *   - the first one seen: taken; when its seq is above 0 and the publisher has a replay
 *     endpoint, what it still holds from seq 0 is replayed before it (a subscriber that
 *     joins late learns what was stored before);
 *   - seq as expected: decoded whole, then applied under the index's write lock;
 *   - seq above it (a gap): the replay endpoint is asked from the first missing seq (a
 *     DEALER, vLLM's protocol) and the batches that come are applied in order; when it
 *     cannot fill the gap the publisher's blocks are dropped first (a resync, "gap");
 *   - seq below it: the publisher restarted: resync ("restart"), then taken;
 *   - a message of another shape or a payload that does not decode: resync
 *     ("malformed"), nothing of it applied.
 * Replays are done inline by this thread (bounded by replay_timeout_ms each), so batches
 * of every publisher are applied in their order; other publishers wait meanwhile.
 *
 * Thread: its own; the index is reached only through its lock.
 */
#include "indexer/sub.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "indexer/decode.h"

#define SUBS_OPEN_MAX 4096
#define DRAIN_MAX 256  /* messages taken from one socket per turn */
#define STREAMS_MAX 64 /* topics of one publisher followed */
#define TOPIC_MAX 256

/* A stream of a publisher: its topic, and the seq it is at. A vLLM engine has one; a
 * kvpool master with CURVE one per tenant, each with its own seqs. */
typedef struct stream {
    char topic[TOPIC_MAX];
    size_t len;
    bool has_next;
    uint64_t next; /* the seq expected */
} stream_t;

typedef struct conn {
    uint32_t id;
    uint64_t gen;
    void *sock;
    stream_t streams[STREAMS_MAX];
    unsigned n_streams;
    char endpoint[KVP_IDX_ENDPOINT_MAX], replay[KVP_IDX_ENDPOINT_MAX];
    char curve[KVP_IDX_CURVE_KEY_LEN + 1]; /* the publisher's public key; "": no CURVE */
    bool topic_replay;                     /* a replay names its stream's topic (a kvpool master) */
    bool live;                             /* still in the index (this turn's compare) */
} conn_t;

struct kvp_sub {
    kvp_sub_params_t p;
    void *ctx;
    int wake_fd;
    pthread_t thread;
    _Atomic bool stop;
    conn_t *conns;
    size_t n_conns;
    kvp_decoder_t dec;
    kvp_idx_sub_info_t *infos;
    zmq_pollitem_t *items;
};

void kvp_sub_wake(kvp_sub_t *s)
{
    uint64_t one = 1;
    if (write(s->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        KVP_LOG_WARN("indexer: cannot wake the subscriber thread: %m");
}

/* A SUB (to cn's endpoint) or DEALER (to its replay endpoint) socket, connected; CURVE
 * when the publisher has a key. NULL: it cannot be made (logged). */
static void *sock_new(kvp_sub_t *s, int type, const conn_t *cn)
{
    const char *endpoint = type == ZMQ_SUB ? cn->endpoint : cn->replay;
    void *z = zmq_socket(s->ctx, type);
    if (z == NULL)
        return NULL;
    int zero = 0, hwm = 1000000;
    int64_t maxmsg = (int64_t)s->p.max_message;
    zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(z, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(z, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    if (cn->curve[0] != '\0' &&
        (zmq_setsockopt(z, ZMQ_CURVE_SERVERKEY, cn->curve, KVP_IDX_CURVE_KEY_LEN) != 0 ||
         zmq_setsockopt(z, ZMQ_CURVE_PUBLICKEY, s->p.curve_public, KVP_IDX_CURVE_KEY_LEN) != 0 ||
         zmq_setsockopt(z, ZMQ_CURVE_SECRETKEY, s->p.curve_secret, KVP_IDX_CURVE_KEY_LEN) != 0)) {
        KVP_LOG_WARN("indexer: cannot set CURVE keys for %s: %s", endpoint,
                     zmq_strerror(zmq_errno()));
        zmq_close(z);
        return NULL;
    }
    if (type == ZMQ_SUB)
        zmq_setsockopt(z, ZMQ_SUBSCRIBE, "", 0);
    if (zmq_connect(z, endpoint) != 0) {
        KVP_LOG_WARN("indexer: cannot connect to %s: %s", endpoint, zmq_strerror(zmq_errno()));
        zmq_close(z);
        return NULL;
    }
    return z;
}

/* Make the sockets match the index's subscriptions. */
static void sync_conns(kvp_sub_t *s)
{
    kvp_idx_rdlock(s->p.idx);
    size_t n = kvp_idx_subs(s->p.idx, s->infos, SUBS_OPEN_MAX);
    kvp_idx_unlock(s->p.idx);
    if (n > SUBS_OPEN_MAX)
        n = SUBS_OPEN_MAX;
    for (size_t c = 0; c < s->n_conns; c++)
        s->conns[c].live = false;
    for (size_t i = 0; i < n; i++) {
        const kvp_idx_sub_info_t *in = &s->infos[i];
        size_t c;
        for (c = 0; c < s->n_conns; c++)
            if (s->conns[c].id == in->id && s->conns[c].gen == in->gen &&
                strcmp(s->conns[c].endpoint, in->endpoint) == 0)
                break;
        if (c < s->n_conns) {
            s->conns[c].live = true;
            s->conns[c].topic_replay = in->topic_replay;
            continue;
        }
        conn_t *cn = &s->conns[s->n_conns];
        memset(cn, 0, sizeof(*cn));
        cn->id = in->id;
        cn->gen = in->gen;
        cn->live = true;
        cn->topic_replay = in->topic_replay;
        memcpy(cn->endpoint, in->endpoint, sizeof(cn->endpoint));
        memcpy(cn->replay, in->replay, sizeof(cn->replay));
        memcpy(cn->curve, in->curve, sizeof(cn->curve));
        if ((cn->sock = sock_new(s, ZMQ_SUB, cn)) == NULL)
            continue; /* tried again at the next change */
        s->n_conns++;
        KVP_LOG_INFO("indexer: subscribed to %s%s%s%s", cn->endpoint,
                     cn->replay[0] ? " (replay " : "", cn->replay, cn->replay[0] ? ")" : "");
    }
    size_t k = 0;
    for (size_t c = 0; c < s->n_conns; c++) {
        if (s->conns[c].live) {
            s->conns[k++] = s->conns[c];
            continue;
        }
        KVP_LOG_INFO("indexer: unsubscribed from %s", s->conns[c].endpoint);
        zmq_close(s->conns[c].sock);
    }
    s->n_conns = k;
}

/* Decode and apply one batch of cn's publisher; false when it is malformed (the
 * publisher was resynchronized: nothing of it applied). */
static bool apply(kvp_sub_t *s, conn_t *cn, const void *payload, size_t len, uint64_t seq,
                  bool replayed)
{
    kvp_idx_batch_t b;
    char why[160];
    kvp_status_t st = kvp_decode_batch(&s->dec, payload, len, &b, why, sizeof(why));
    kvp_idx_wrlock(s->p.idx);
    if (st == KVP_OK)
        kvp_idx_apply(s->p.idx, cn->id, &b);
    else
        kvp_idx_resync(s->p.idx, cn->id, "malformed");
    kvp_idx_sub_seen(s->p.idx, cn->id, seq, true);
    kvp_idx_unlock(s->p.idx);
    if (st != KVP_OK) {
        KVP_LOG_WARN_LIMITED("indexer: %s: batch %llu: %s", cn->endpoint, (unsigned long long)seq,
                             why);
        return false;
    }
    kvp_idx_count_batch(s->p.idx, replayed);
    return true;
}

static void resync(kvp_sub_t *s, conn_t *cn, const char *reason)
{
    kvp_idx_wrlock(s->p.idx);
    kvp_idx_resync(s->p.idx, cn->id, reason);
    kvp_idx_unlock(s->p.idx);
}

static uint64_t seq_of(const zmq_msg_t *m)
{
    const uint8_t *b = zmq_msg_data((zmq_msg_t *)m);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | b[i];
    return v;
}

/* Ask cn's replay endpoint for stream st's [from, until) and apply what comes, in order,
 * from st->next == from on. gap: the reason to resync with when the answer does not hold
 * every batch of [from, until) (NULL: nothing to resync, as before the first message); the
 * resync comes before any batch after a hole is applied, so a block the lost batches
 * removed is never left standing. vLLM's request is [start]; a kvpool master's names the
 * stream's topic too, [topic, start] (each after the DEALER's empty frame). */
static void replay(kvp_sub_t *s, conn_t *cn, stream_t *st, uint64_t from, uint64_t until,
                   const char *gap)
{
    bool resynced = false;
    st->next = from;
    void *z = cn->replay[0] != '\0' && from < until ? sock_new(s, ZMQ_DEALER, cn) : NULL;
    uint8_t start[8];
    for (int i = 0; i < 8; i++)
        start[i] = (uint8_t)(from >> (56 - 8 * i));
    uint64_t deadline = kvp_now_ms() + s->p.replay_timeout_ms;
    bool named = cn->topic_replay && st->len > 0;
    if (z != NULL && (zmq_send(z, "", 0, ZMQ_SNDMORE) < 0 ||
                      (named && zmq_send(z, st->topic, st->len, ZMQ_SNDMORE) < 0) ||
                      zmq_send(z, start, 8, 0) < 0)) {
        zmq_close(z);
        z = NULL;
    }
    zmq_msg_t parts[4];
    while (z != NULL && st->next < until) {
        uint64_t now = kvp_now_ms();
        if (now >= deadline)
            break;
        zmq_pollitem_t it = {.socket = z, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, (long)(deadline - now)) <= 0)
            break;
        /* [""]? [seq, payload] */
        int n = 0;
        bool more = true;
        while (more && n < 4) {
            zmq_msg_init(&parts[n]);
            if (zmq_msg_recv(&parts[n], z, 0) < 0) {
                zmq_msg_close(&parts[n]);
                more = false;
                break;
            }
            more = zmq_msg_more(&parts[n]);
            n++;
        }
        int at = n > 0 && zmq_msg_size(&parts[0]) == 0 ? 1 : 0;
        bool ok = !more && n - at == 2 && zmq_msg_size(&parts[at]) == 8;
        uint64_t seq = ok ? seq_of(&parts[at]) : 0;
        bool done = !ok || seq == UINT64_MAX;
        if (!done && seq >= st->next && seq < until) {
            if (seq > st->next && gap != NULL && !resynced) {
                resync(s, cn, gap); /* a hole: what came before it may be undone by it */
                resynced = true;
            }
            if (!apply(s, cn, zmq_msg_data(&parts[at + 1]), zmq_msg_size(&parts[at + 1]), seq,
                       true))
                resynced = done = true; /* apply resynchronized ("malformed") */
            st->next = seq + 1;
        }
        for (int i = 0; i < n; i++)
            zmq_msg_close(&parts[i]);
        while (more) { /* the rest of a message of another shape */
            zmq_msg_t x;
            zmq_msg_init(&x);
            more = zmq_msg_recv(&x, z, 0) >= 0 && zmq_msg_more(&x);
            zmq_msg_close(&x);
        }
        if (done)
            break;
    }
    if (z != NULL)
        zmq_close(z);
    if (st->next < until && gap != NULL && !resynced) {
        KVP_LOG_WARN("indexer: %s: batches %llu..%llu missed and not replayed", cn->endpoint,
                     (unsigned long long)st->next, (unsigned long long)until - 1);
        resync(s, cn, gap);
    }
}

/* The stream of a topic (made at its first message); NULL: too many. */
static stream_t *stream_of(conn_t *cn, const void *topic, size_t len)
{
    for (unsigned i = 0; i < cn->n_streams; i++)
        if (cn->streams[i].len == len && memcmp(cn->streams[i].topic, topic, len) == 0)
            return &cn->streams[i];
    if (cn->n_streams == STREAMS_MAX || len >= TOPIC_MAX)
        return NULL;
    stream_t *st = &cn->streams[cn->n_streams++];
    memcpy(st->topic, topic, len);
    st->len = len;
    st->has_next = false;
    return st;
}

/* One message of cn's publisher. */
static void take(kvp_sub_t *s, conn_t *cn, zmq_msg_t *parts, int n)
{
    stream_t *st = n == 3 && zmq_msg_size(&parts[1]) == 8
                       ? stream_of(cn, zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0]))
                       : NULL;
    if (st == NULL) {
        KVP_LOG_WARN_LIMITED("indexer: %s: a message of %d parts, not [topic, seq, payload] "
                             "(or a topic past the %d followed)",
                             cn->endpoint, n, STREAMS_MAX);
        resync(s, cn, "malformed"); /* its streams go on where they were */
        return;
    }
    uint64_t seq = seq_of(&parts[1]);
    const void *payload = zmq_msg_data(&parts[2]);
    size_t len = zmq_msg_size(&parts[2]);
    if (!st->has_next) {
        st->has_next = true;
        replay(s, cn, st, 0, seq, NULL); /* what it stored before we joined, if it has it */
    } else if (seq > st->next) {
        replay(s, cn, st, st->next, seq, "gap");
    } else if (seq < st->next) {
        KVP_LOG_WARN("indexer: %s: seq went back from %llu to %llu: the publisher restarted",
                     cn->endpoint, (unsigned long long)st->next - 1, (unsigned long long)seq);
        resync(s, cn, "restart");
    }
    /* a batch that does not decode was resynchronized (apply): the stream goes on after it,
     * never asking again for what came before it, which the resync dropped */
    (void)apply(s, cn, payload, len, seq, false);
    st->next = seq + 1;
}

/* Up to DRAIN_MAX messages waiting on cn. */
static void drain(kvp_sub_t *s, conn_t *cn)
{
    zmq_msg_t parts[4];
    for (int k = 0; k < DRAIN_MAX; k++) {
        int n = 0;
        bool more = true;
        while (more) {
            zmq_msg_t *m = &parts[n < 4 ? n : 3];
            if (n >= 4)
                zmq_msg_close(m);
            zmq_msg_init(m);
            if (zmq_msg_recv(m, cn->sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                zmq_msg_close(m);
                for (int i = 0; i < (n < 4 ? n : 4); i++)
                    zmq_msg_close(&parts[i]);
                return; /* nothing more now */
            }
            more = zmq_msg_more(m);
            n++;
        }
        take(s, cn, parts, n);
        for (int i = 0; i < (n < 4 ? n : 4); i++)
            zmq_msg_close(&parts[i]);
    }
}

static void *run(void *arg)
{
    kvp_sub_t *s = arg;
    sync_conns(s);
    while (!atomic_load(&s->stop)) {
        size_t n = s->n_conns;
        for (size_t c = 0; c < n; c++)
            s->items[c] = (zmq_pollitem_t){.socket = s->conns[c].sock, .events = ZMQ_POLLIN};
        s->items[n] = (zmq_pollitem_t){.fd = s->wake_fd, .events = ZMQ_POLLIN};
        int r = zmq_poll(s->items, (int)n + 1, 1000);
        if (r < 0 && zmq_errno() != EINTR) {
            KVP_LOG_ERROR("indexer: zmq_poll: %s", zmq_strerror(zmq_errno()));
            usleep(100000);
            continue;
        }
        if (s->items[n].revents & ZMQ_POLLIN) {
            uint64_t v;
            if (read(s->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                KVP_LOG_WARN("indexer: wake read: %m");
            if (atomic_load(&s->stop))
                break;
            sync_conns(s);
            continue; /* the items no longer match the sockets */
        }
        for (size_t c = 0; c < n; c++)
            if (s->items[c].revents & ZMQ_POLLIN)
                drain(s, &s->conns[c]);
    }
    return NULL;
}

kvp_status_t kvp_sub_start(const kvp_sub_params_t *p, kvp_sub_t **sub_p)
{
    kvp_sub_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return KVP_ERR_NOMEM;
    s->p = *p;
    s->conns = calloc(SUBS_OPEN_MAX, sizeof(*s->conns));
    s->infos = calloc(SUBS_OPEN_MAX, sizeof(*s->infos));
    s->items = calloc(SUBS_OPEN_MAX + 1, sizeof(*s->items));
    s->ctx = zmq_ctx_new();
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    kvp_decoder_init(&s->dec);
    if (s->conns == NULL || s->infos == NULL || s->items == NULL || s->ctx == NULL ||
        s->wake_fd < 0 || pthread_create(&s->thread, NULL, run, s) != 0) {
        if (s->ctx != NULL)
            zmq_ctx_term(s->ctx);
        if (s->wake_fd >= 0)
            close(s->wake_fd);
        free(s->conns);
        free(s->infos);
        free(s->items);
        free(s);
        return KVP_ERR_SYSTEM;
    }
    *sub_p = s;
    return KVP_OK;
}

void kvp_sub_stop(kvp_sub_t *s)
{
    if (s == NULL)
        return;
    atomic_store(&s->stop, true);
    kvp_sub_wake(s);
    pthread_join(s->thread, NULL);
    for (size_t c = 0; c < s->n_conns; c++)
        zmq_close(s->conns[c].sock);
    zmq_ctx_term(s->ctx);
    close(s->wake_fd);
    kvp_decoder_cleanup(&s->dec);
    explicit_bzero(s->p.curve_secret, sizeof(s->p.curve_secret));
    free(s->conns);
    free(s->infos);
    free(s->items);
    free(s);
}
