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
 * Replays are asynchronous: the request is sent on a DEALER that is polled with every
 * SUB, each with its own deadline (replay_timeout_ms). While a publisher's replay is queued
 * or pending its SUB is not read (its batches are held, in order, in the socket's queue)
 * and the batch that showed the gap waits with it, applied when the replay ends; every
 * other publisher goes on meanwhile. At most REPLAYS_PER_TENANT replays of one tenant are
 * pending (REPLAYS_MAX in all); the rest wait their turn, oldest first, so one tenant's
 * replays never delay another tenant's sockets, batches or replays.
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
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "common/clock.h"
#include "common/log.h"
#include "indexer/decode.h"

#define SUBS_OPEN_MAX 4096
#define REPLAYS_MAX 64       /* replays pending at once, all tenants */
#define REPLAYS_PER_TENANT 2 /* replays of one tenant pending at once */
/* the context's socket limit, set explicitly (libzmq's default, 1023, was below what the
 * index allows): every subscription's SUB, the replay DEALERs pending, and room */
#define ZMQ_SOCKETS_MAX (SUBS_OPEN_MAX + REPLAYS_MAX + 64)
_Static_assert(SUBS_OPEN_MAX >= KVP_IDX_SUBS_MAX, "a socket for every subscription");
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

/* A publisher's replay: queued (waiting for its tenant's turn) or pending (asked, polled). */
typedef enum { RP_NONE, RP_QUEUED, RP_PENDING } rp_state_t;

typedef struct replay {
    rp_state_t state;
    void *z;         /* the DEALER, while pending */
    unsigned stream; /* the stream replayed (an index of conn.streams) */
    uint64_t until, deadline_ms, ticket;
    const char *gap; /* the reason to resync with when it ends short; NULL: none */
    bool resynced;
    zmq_msg_t held; /* the batch that showed the gap: applied when the replay ends */
    uint64_t held_seq;
} replay_t;

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
    char tenant[KVP_IDX_NAME_MAX];         /* whose subscription (replays are capped per tenant) */
    replay_t rp;
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
    size_t *item_conn; /* items[i] polls conns[item_conn[i]]' SUB or replay DEALER */
    unsigned n_pending, n_queued;
    uint64_t tickets;
    bool resched; /* a replay ended or was queued: start those that may */
    /* kvp_sub_sync: asked counts the requests, synced the last one a sync_conns served */
    _Atomic uint64_t asked;
    uint64_t synced;
    pthread_mutex_t sync_lock;
    pthread_cond_t sync_cond;
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

/* Tell the index whether subscription in's socket could be made. */
static void opened(kvp_sub_t *s, const kvp_idx_sub_info_t *in, bool ok)
{
    kvp_idx_wrlock(s->p.idx);
    kvp_idx_sub_open(s->p.idx, in->id, in->gen, ok);
    kvp_idx_unlock(s->p.idx);
}

/* A socket for subscription in (not open yet). */
static void conn_open(kvp_sub_t *s, const kvp_idx_sub_info_t *in)
{
    conn_t *cn = &s->conns[s->n_conns];
    memset(cn, 0, sizeof(*cn));
    cn->id = in->id;
    cn->gen = in->gen;
    cn->live = true;
    cn->topic_replay = in->topic_replay;
    memcpy(cn->endpoint, in->endpoint, sizeof(cn->endpoint));
    memcpy(cn->replay, in->replay, sizeof(cn->replay));
    memcpy(cn->curve, in->curve, sizeof(cn->curve));
    snprintf(cn->tenant, sizeof(cn->tenant), "%s", in->tenant);
    if ((cn->sock = sock_new(s, ZMQ_SUB, cn)) == NULL) {
        opened(s, in, false); /* tried again at the next change */
        return;
    }
    opened(s, in, true);
    s->n_conns++;
    KVP_LOG_INFO("indexer: subscribed to %s for tenant %s%s%s%s", cn->endpoint, in->tenant,
                 cn->replay[0] ? " (replay " : "", cn->replay, cn->replay[0] ? ")" : "");
}

/* Close cn's sockets, and drop its replay (queued or pending) with the batch it held. */
static void conn_close(kvp_sub_t *s, conn_t *cn)
{
    zmq_close(cn->sock);
    if (cn->rp.state == RP_NONE)
        return;
    if (cn->rp.state == RP_PENDING) {
        if (cn->rp.z != NULL)
            zmq_close(cn->rp.z);
        s->n_pending--;
    } else {
        s->n_queued--;
    }
    zmq_msg_close(&cn->rp.held);
    cn->rp.state = RP_NONE;
    s->resched = true;
}

/* Make the sockets match the index's subscriptions (those gone closed before new ones are
 * made, so that their sockets and descriptors are free for them); then the kvp_sub_sync
 * callers that asked before it read them are answered. */
static void sync_conns(kvp_sub_t *s)
{
    uint64_t asked = atomic_load(&s->asked); /* read before the index is */
    kvp_idx_rdlock(s->p.idx);
    size_t n = kvp_idx_subs(s->p.idx, s->infos, SUBS_OPEN_MAX);
    kvp_idx_unlock(s->p.idx);
    if (n > SUBS_OPEN_MAX)
        n = SUBS_OPEN_MAX;
    for (size_t c = 0; c < s->n_conns; c++)
        s->conns[c].live = false;
    for (size_t i = 0; i < n; i++) {
        kvp_idx_sub_info_t *in = &s->infos[i];
        for (size_t c = 0; c < s->n_conns; c++)
            if (s->conns[c].id == in->id && s->conns[c].gen == in->gen &&
                strcmp(s->conns[c].endpoint, in->endpoint) == 0) {
                s->conns[c].live = true;
                s->conns[c].topic_replay = in->topic_replay;
                in->id = UINT32_MAX; /* has its socket */
                break;
            }
    }
    size_t k = 0;
    for (size_t c = 0; c < s->n_conns; c++) {
        if (s->conns[c].live) {
            if (k != c) /* a held zmq_msg_t moves with it, as zmq_msg_move moves one */
                s->conns[k] = s->conns[c];
            k++;
            continue;
        }
        KVP_LOG_INFO("indexer: unsubscribed from %s", s->conns[c].endpoint);
        conn_close(s, &s->conns[c]);
    }
    s->n_conns = k;
    for (size_t i = 0; i < n; i++)
        if (s->infos[i].id != UINT32_MAX)
            conn_open(s, &s->infos[i]);
    pthread_mutex_lock(&s->sync_lock);
    if (asked > s->synced)
        s->synced = asked;
    pthread_cond_broadcast(&s->sync_cond);
    pthread_mutex_unlock(&s->sync_lock);
}

bool kvp_sub_sync(kvp_sub_t *s, uint32_t timeout_ms)
{
    uint64_t want = atomic_fetch_add(&s->asked, 1) + 1;
    kvp_sub_wake(s);
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->sync_lock);
    while (s->synced < want && pthread_cond_timedwait(&s->sync_cond, &s->sync_lock, &dl) == 0)
        ;
    bool done = s->synced >= want;
    pthread_mutex_unlock(&s->sync_lock);
    return done;
}

/* Decode and apply one batch of cn's publisher; false when it is malformed (the
 * publisher was resynchronized: nothing of it applied). */
static bool apply(kvp_sub_t *s, conn_t *cn, const void *payload, size_t len, uint64_t seq,
                  bool replayed)
{
    kvp_idx_batch_t b;
    char why[160];
    kvp_idx_yield(s->p.idx); /* queries first (index.h) */
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

/* cn's replay ends (answered, past its deadline, or it could not be asked): when the batches
 * it was to bring are not all there the publisher is resynchronized (unless it was already),
 * then the batch that showed the gap is applied and the SUB is read again. */
static void replay_end(kvp_sub_t *s, conn_t *cn)
{
    replay_t *r = &cn->rp;
    stream_t *st = &cn->streams[r->stream];
    if (r->state == RP_PENDING) {
        if (r->z != NULL)
            zmq_close(r->z);
        s->n_pending--;
    } else {
        s->n_queued--;
    }
    r->z = NULL;
    r->state = RP_NONE;
    s->resched = true;
    if (st->next < r->until && r->gap != NULL && !r->resynced) {
        KVP_LOG_WARN_LIMITED("indexer: %s: batches %llu..%llu missed and not replayed",
                             cn->endpoint, (unsigned long long)st->next,
                             (unsigned long long)r->until - 1);
        resync(s, cn, r->gap);
    }
    /* a batch that does not decode was resynchronized (apply): the stream goes on after it */
    (void)apply(s, cn, zmq_msg_data(&r->held), zmq_msg_size(&r->held), r->held_seq, false);
    st->next = r->held_seq + 1;
    zmq_msg_close(&r->held);
}

/* Ask cn's replay endpoint for its stream's [next, until) on a DEALER polled with the SUBs
 * (replay_recv takes the answers). vLLM's request is [start]; a kvpool master's names the
 * stream's topic too, [topic, start] (each after the DEALER's empty frame). */
static void replay_ask(kvp_sub_t *s, conn_t *cn)
{
    replay_t *r = &cn->rp;
    stream_t *st = &cn->streams[r->stream];
    s->n_queued--;
    s->n_pending++;
    r->state = RP_PENDING;
    r->deadline_ms = kvp_now_ms() + s->p.replay_timeout_ms;
    r->z = sock_new(s, ZMQ_DEALER, cn);
    uint8_t start[8];
    for (int i = 0; i < 8; i++)
        start[i] = (uint8_t)(st->next >> (56 - 8 * i));
    bool named = cn->topic_replay && st->len > 0;
    if (r->z == NULL || zmq_send(r->z, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        (named && zmq_send(r->z, st->topic, st->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) ||
        zmq_send(r->z, start, 8, ZMQ_DONTWAIT) < 0) {
        replay_end(s, cn);
    }
}

/* Is tenant under its cap of pending replays? (pend: the tenants of those pending, np) */
static bool tenant_may(const char *tenant, const char *const *pend, size_t np)
{
    size_t k = 0;
    for (size_t i = 0; i < np; i++)
        k += strcmp(pend[i], tenant) == 0;
    return k < REPLAYS_PER_TENANT;
}

/* Start queued replays, oldest first, while REPLAYS_MAX and each tenant's cap allow. */
static void replay_schedule(kvp_sub_t *s)
{
    s->resched = false;
    const char *pend[REPLAYS_MAX];
    size_t np = 0;
    for (size_t c = 0; c < s->n_conns && np < REPLAYS_MAX; c++)
        if (s->conns[c].rp.state == RP_PENDING)
            pend[np++] = s->conns[c].tenant;
    while (s->n_queued > 0 && np < REPLAYS_MAX) {
        conn_t *best = NULL;
        for (size_t c = 0; c < s->n_conns; c++) {
            conn_t *cn = &s->conns[c];
            if (cn->rp.state == RP_QUEUED && (best == NULL || cn->rp.ticket < best->rp.ticket) &&
                tenant_may(cn->tenant, pend, np))
                best = cn;
        }
        if (best == NULL)
            return; /* those queued wait for their tenant's turn */
        pend[np++] = best->tenant;
        replay_ask(s, best); /* may end at once (it could not be asked) */
    }
}

/* Stream st of cn saw batch msg (seq) with [from, until) missing before it: replayed when
 * the publisher has a replay endpoint (queued; cn's SUB is not read until it ends, true:
 * msg was taken, applied at the end), else resynchronized now (gap; NULL: nothing to heal,
 * as before the first message) and false: the caller applies msg. */
static bool replay_begin(kvp_sub_t *s, conn_t *cn, stream_t *st, uint64_t from, uint64_t until,
                         const char *gap, zmq_msg_t *msg, uint64_t seq)
{
    st->next = from;
    if (cn->replay[0] == '\0' || from >= until) {
        if (gap != NULL && from < until) {
            KVP_LOG_WARN_LIMITED("indexer: %s: batches %llu..%llu missed (no replay endpoint)",
                                 cn->endpoint, (unsigned long long)from,
                                 (unsigned long long)until - 1);
            resync(s, cn, gap);
        }
        return false;
    }
    replay_t *r = &cn->rp;
    r->state = RP_QUEUED;
    r->stream = (unsigned)(st - cn->streams);
    r->until = until;
    r->gap = gap;
    r->resynced = false;
    r->ticket = ++s->tickets;
    r->held_seq = seq;
    zmq_msg_init(&r->held);
    zmq_msg_move(&r->held, msg);
    s->n_queued++;
    s->resched = true;
    return true;
}

/* One answer of cn's pending replay, [""]? [seq, payload]: applied when it is the next
 * batch wanted (a hole before it resynchronizes first, so a block the lost batches removed
 * is never left standing). false: the replay is over (an end marker, a message of another
 * shape, a batch that does not decode, or all of [.., until) came). */
static bool replay_one(kvp_sub_t *s, conn_t *cn, zmq_msg_t *parts, int n, bool more)
{
    replay_t *r = &cn->rp;
    stream_t *st = &cn->streams[r->stream];
    int at = n > 0 && zmq_msg_size(&parts[0]) == 0 ? 1 : 0;
    bool ok = !more && n - at == 2 && zmq_msg_size(&parts[at]) == 8;
    uint64_t seq = ok ? seq_of(&parts[at]) : 0;
    if (!ok || seq == UINT64_MAX)
        return false;
    if (seq >= st->next && seq < r->until) {
        if (seq > st->next && r->gap != NULL && !r->resynced) {
            resync(s, cn, r->gap);
            r->resynced = true;
        }
        bool good =
            apply(s, cn, zmq_msg_data(&parts[at + 1]), zmq_msg_size(&parts[at + 1]), seq, true);
        st->next = seq + 1;
        if (!good) {
            r->resynced = true; /* apply resynchronized ("malformed") */
            return false;
        }
    }
    return st->next < r->until;
}

/* Up to DRAIN_MAX answers waiting on cn's replay DEALER; the replay ends when it is over. */
static void replay_recv(kvp_sub_t *s, conn_t *cn)
{
    zmq_msg_t parts[4];
    for (int k = 0; k < DRAIN_MAX; k++) {
        int n = 0;
        bool more = true;
        while (more && n < 4) {
            zmq_msg_init(&parts[n]);
            if (zmq_msg_recv(&parts[n], cn->rp.z, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                zmq_msg_close(&parts[n]);
                more = false;
                break;
            }
            more = zmq_msg_more(&parts[n]);
            n++;
        }
        if (n == 0)
            return; /* nothing more now */
        bool go_on = replay_one(s, cn, parts, n, more);
        for (int i = 0; i < n; i++)
            zmq_msg_close(&parts[i]);
        while (more) { /* the rest of a message of another shape */
            zmq_msg_t x;
            zmq_msg_init(&x);
            more = zmq_msg_recv(&x, cn->rp.z, 0) >= 0 && zmq_msg_more(&x);
            zmq_msg_close(&x);
        }
        if (!go_on) {
            replay_end(s, cn);
            return;
        }
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
        /* what it stored before we joined, if it has it */
        if (replay_begin(s, cn, st, 0, seq, NULL, &parts[2], seq))
            return;
    } else if (seq > st->next) {
        if (replay_begin(s, cn, st, st->next, seq, "gap", &parts[2], seq))
            return;
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
        if (cn->rp.state != RP_NONE)
            return; /* its next batches wait in the socket until the replay ends */
    }
}

/* The poll items of this turn: each conn's SUB (none while its replay is queued or pending),
 * each pending replay's DEALER, the eventfd last; their number. *timeout_p: until the
 * nearest replay deadline (at most 1 s). */
static size_t poll_items(kvp_sub_t *s, long *timeout_p)
{
    size_t n = 0;
    uint64_t now = kvp_now_ms(), wait = 1000;
    for (size_t c = 0; c < s->n_conns; c++) {
        conn_t *cn = &s->conns[c];
        if (cn->rp.state == RP_QUEUED)
            continue;
        void *z = cn->rp.state == RP_PENDING ? cn->rp.z : cn->sock;
        if (cn->rp.state == RP_PENDING)
            wait = cn->rp.deadline_ms <= now         ? 0
                   : cn->rp.deadline_ms - now < wait ? cn->rp.deadline_ms - now
                                                     : wait;
        s->item_conn[n] = c;
        s->items[n++] = (zmq_pollitem_t){.socket = z, .events = ZMQ_POLLIN};
    }
    s->items[n] = (zmq_pollitem_t){.fd = s->wake_fd, .events = ZMQ_POLLIN};
    *timeout_p = (long)wait;
    return n;
}

/* Replays past their deadline end (the gap stays: resync). */
static void replay_expire(kvp_sub_t *s)
{
    uint64_t now = kvp_now_ms();
    for (size_t c = 0; c < s->n_conns && s->n_pending > 0; c++)
        if (s->conns[c].rp.state == RP_PENDING && s->conns[c].rp.deadline_ms <= now)
            replay_end(s, &s->conns[c]);
}

static void *run(void *arg)
{
    kvp_sub_t *s = arg;
    sync_conns(s);
    while (!atomic_load(&s->stop)) {
        if (s->resched)
            replay_schedule(s);
        long timeout;
        size_t n = poll_items(s, &timeout);
        int r = zmq_poll(s->items, (int)n + 1, timeout);
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
            kvp_idx_wrlock(s->p.idx); /* unregistered blocks go, a slice at a time */
            kvp_idx_reap(s->p.idx);
            kvp_idx_unlock(s->p.idx);
            continue; /* the items no longer match the sockets */
        }
        for (size_t i = 0; i < n; i++) {
            if (!(s->items[i].revents & ZMQ_POLLIN))
                continue;
            conn_t *cn = &s->conns[s->item_conn[i]];
            if (cn->rp.state == RP_PENDING && s->items[i].socket == cn->rp.z)
                replay_recv(s, cn);
            else if (cn->rp.state == RP_NONE && s->items[i].socket == cn->sock)
                drain(s, cn);
        }
        replay_expire(s);
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
    s->item_conn = calloc(SUBS_OPEN_MAX + 1, sizeof(*s->item_conn));
    s->ctx = zmq_ctx_new();
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    kvp_decoder_init(&s->dec);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->sync_cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->sync_lock, NULL);
    if (s->ctx != NULL && zmq_ctx_set(s->ctx, ZMQ_MAX_SOCKETS, ZMQ_SOCKETS_MAX) != 0)
        KVP_LOG_ERROR("indexer: cannot set ZMQ_MAX_SOCKETS to %d: %s", ZMQ_SOCKETS_MAX,
                      zmq_strerror(zmq_errno()));
    if (s->conns == NULL || s->infos == NULL || s->items == NULL || s->item_conn == NULL ||
        s->ctx == NULL || s->wake_fd < 0 || pthread_create(&s->thread, NULL, run, s) != 0) {
        if (s->ctx != NULL)
            zmq_ctx_term(s->ctx);
        if (s->wake_fd >= 0)
            close(s->wake_fd);
        pthread_cond_destroy(&s->sync_cond);
        pthread_mutex_destroy(&s->sync_lock);
        free(s->conns);
        free(s->infos);
        free(s->items);
        free(s->item_conn);
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
        conn_close(s, &s->conns[c]);
    zmq_ctx_term(s->ctx);
    close(s->wake_fd);
    kvp_decoder_cleanup(&s->dec);
    explicit_bzero(s->p.curve_secret, sizeof(s->p.curve_secret));
    pthread_cond_destroy(&s->sync_cond);
    pthread_mutex_destroy(&s->sync_lock);
    free(s->conns);
    free(s->infos);
    free(s->items);
    free(s->item_conn);
    free(s);
}
