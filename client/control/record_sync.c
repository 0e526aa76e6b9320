/*
 * record_sync.c - segments describe themselves, the owner's side.
 *
 * Offer: after a mount flagged `adopting`, the owner offers what its segment
 * holds (a DRAM segment its record, segment/seg_record.c; an SSD segment its
 * file's table, ssd/ssd_owner.c) in Adopt batches, newest first; the master
 * adopts or refuses each entry (master/ha/rebuild.c) and the owner forgets
 * the refused ones. The last call opens the segment to new replicas.
 *
 * Record thread: a DRAM segment's owner subscribes to the changes to its
 * record on a connection of its own (SegRecord: the master streams them,
 * each batch written before the replies of the requests that made it, so
 * the record has an object before its writer hears that the put ended) and
 * applies them.
 * The same thread offers a DRAM segment's record after each remount (the
 * mount only flags it, kvp_segment_mounted): a poll's changes for
 * the previous mount that were still in flight are applied first, so the
 * offer misses none of them; a reply for an earlier mount that arrives
 * afterwards is ignored (seg_record.c binds the record to the mount). A
 * client's very first mount has nothing to offer and opens at once.
 *
 * Thread: kvp_record_offer on the caller's (an SSD owner's on_ready); the
 * record thread.
 */
#include "client/control/record_sync.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/rpc.h"
#include "common/sock.h"
#include "kvpool.pb-c.h"

struct kvp_record_sync {
    kvp_segment_t *seg;
    struct kvp_seg_record *record;
    kvp_session_t *session;
    uint64_t client_id;
    uint32_t timeout_ms;
    pthread_t thread;
    _Atomic bool stop;
};

static kvp_status_t offer_call(kvp_mconn_t *m, kvp_chan_t *ch, const Kvpool__AdoptRequest *req,
                               Kvpool__AdoptResponse **ar_p)
{
    size_t len = kvpool__adopt_request__get_packed_size(req);
    uint8_t *body = malloc(len ? len : 1), *resp = NULL;
    size_t rlen = 0;
    if (body == NULL)
        return KVP_ERR_NOMEM;
    kvpool__adopt_request__pack(req, body);
    kvp_status_t st = ch != NULL
                          ? kvp_mconn_ready_call(m, ch, KVP_RPC_ADOPT, body, len, &resp, &rlen)
                          : kvp_mconn_call(m, KVP_RPC_ADOPT, body, len, &resp, &rlen);
    free(body);
    if (st != KVP_OK)
        return st;
    *ar_p = kvpool__adopt_response__unpack(NULL, rlen, resp);
    if (ch != NULL)
        free(resp); /* ready_call's reply is ours; mconn_call's is the thread's buffer */
    if (*ar_p == NULL)
        return KVP_ERR_PROTOCOL;
    if ((*ar_p)->status != KVP_OK || (*ar_p)->n_statuses != req->n_entries) {
        st = (*ar_p)->status != KVP_OK ? (*ar_p)->status : KVP_ERR_PROTOCOL;
        kvpool__adopt_response__free_unpacked(*ar_p, NULL);
        return st;
    }
    return KVP_OK;
}

kvp_status_t kvp_record_offer(kvp_mconn_t *m, kvp_chan_t *ch, uint64_t seg_id,
                              const kvp_record_entry_t *e, size_t n,
                              kvp_record_refused_cb_t refused, void *arg, size_t *adopted_p,
                              size_t *refused_p)
{
    size_t adopted = 0, n_refused = 0;
    Kvpool__AdoptEntry *me = calloc(KVP_RECORD_OFFER_BATCH, sizeof(*me));
    Kvpool__AdoptEntry **mp = calloc(KVP_RECORD_OFFER_BATCH, sizeof(*mp));
    kvp_status_t st = me == NULL || mp == NULL ? KVP_ERR_NOMEM : KVP_OK;
    size_t at = 0;
    do {
        size_t k = KVP_MIN((size_t)KVP_RECORD_OFFER_BATCH, n - at);
        for (size_t i = 0; st == KVP_OK && i < k; i++) {
            const kvp_record_entry_t *x = &e[at + i];
            kvpool__adopt_entry__init(&me[i]);
            me[i].key.data = (uint8_t *)x->key;
            me[i].key.len = x->key_len;
            me[i].version = x->version;
            me[i].offset = x->offset;
            me[i].size = x->size;
            me[i].crc32c = x->crc32c;
            me[i].pin = x->pin;
            me[i].group_id.data = (uint8_t *)x->group;
            me[i].group_id.len = x->group_len;
            mp[i] = &me[i];
        }
        Kvpool__AdoptRequest req = KVPOOL__ADOPT_REQUEST__INIT;
        req.segment_id = seg_id;
        req.entries = mp;
        req.n_entries = st == KVP_OK ? k : 0;
        req.last = st != KVP_OK || at + k == n; /* a failed offer still opens the segment */
        Kvpool__AdoptResponse *ar = NULL;
        kvp_status_t cs = offer_call(m, ch, &req, &ar);
        if (cs != KVP_OK) {
            st = cs;
            break;
        }
        for (size_t i = 0; i < req.n_entries; i++) {
            if (ar->statuses[i] == KVP_OK) {
                adopted++;
            } else {
                n_refused++;
                if (refused != NULL)
                    refused(arg, &e[at + i]);
            }
        }
        kvpool__adopt_response__free_unpacked(ar, NULL);
        if (req.last)
            break;
        at += k;
    } while (true);
    free(me);
    free(mp);
    if (adopted_p != NULL)
        *adopted_p = adopted;
    if (refused_p != NULL)
        *refused_p = n_refused;
    return st;
}

static void forget_cb(void *arg, const kvp_record_entry_t *e)
{
    kvp_seg_record_forget(arg, e->offset, e->version);
}

/* Offer the record for mount seg_id, which opens the segment (the record thread). */
static kvp_status_t record_offer(kvp_record_sync_t *rs, uint64_t seg_id)
{
    kvp_record_entry_t *e = NULL;
    size_t n = 0, adopted = 0, refused = 0;
    kvp_status_t st = kvp_seg_record_snapshot(rs->record, &e, &n);
    if (st != KVP_OK)
        n = 0; /* the offer still ends, so the segment takes new replicas */
    uint64_t t0 = kvp_now_ms();
    kvp_status_t os = kvp_record_offer(kvp_session_mconn(rs->session), NULL, seg_id, e, n,
                                       forget_cb, rs->record, &adopted, &refused);
    if (n > 0)
        KVP_LOG_INFO("segment %s: %zu objects of its record adopted back, %zu refused (stale) "
                     "and forgotten, in %llu ms%s",
                     kvp_segment_name(rs->seg), adopted, refused,
                     (unsigned long long)(kvp_now_ms() - t0),
                     os == KVP_OK ? "" : " (offer cut short)");
    free(e);
    if (st == KVP_OK)
        st = os;
    if (st != KVP_OK)
        KVP_LOG_WARN("segment %s: its record could not be offered to the master (%s): objects "
                     "on it are not in the pool",
                     kvp_segment_name(rs->seg), kvp_strerror(st));
    kvp_segment_set_open(rs->seg, seg_id); /* kvp_record_sync_wait_open */
    return st;
}

/* ---- the record thread ---- */

static void nap(unsigned ms)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* One whole frame from ch (blocking once it began); *body_p malloc'd (NUL-terminated). */
static kvp_status_t read_frame(kvp_chan_t *ch, kvp_rpc_hdr_t *h, uint8_t **body_p)
{
    uint8_t hb[KVP_RPC_HDR_LEN];
    kvp_status_t st = kvp_chan_recv_all(ch, hb, sizeof(hb));
    if (st == KVP_OK)
        st = kvp_rpc_hdr_unpack(hb, KVP_RPC_MAX_BODY, h);
    if (st != KVP_OK)
        return st;
    uint8_t *b = malloc(h->body_len + 1u);
    if (b == NULL)
        return KVP_ERR_NOMEM;
    st = h->body_len > 0 ? kvp_chan_recv_all(ch, b, h->body_len) : KVP_OK;
    if (st != KVP_OK) {
        free(b);
        return st;
    }
    b[h->body_len] = '\0';
    *body_p = b;
    return KVP_OK;
}

/* Why a stream ended. */
typedef enum stream_end {
    STREAM_LOST,        /* no master, or the connection broke: try again */
    STREAM_REMOUNT,     /* the segment was mounted again (or is going) */
    STREAM_UNSUPPORTED, /* the master keeps no record of this segment */
} stream_end_t;

#define STREAM_REQ_ID 1u
/*
 * Pings: the master drops a connection it has not heard from for --client-ttl, so a
 * quiet stream is pinged every PING_MS; a busy one needs none (the master counts a stream
 * whose socket takes its changes as alive). A ping goes only once the stream has been
 * quiet for PING_QUIET_MS (nothing to read): a master killed with changes still in its
 * socket's send queue leaves them to its kernel, which sends them after it, but any byte
 * arriving on that orphaned socket makes the kernel reset it and drop what it had not
 * sent (TCP's abort on data). An owner waking from a stop, its socket full, would
 * otherwise ping at once, before it read the changes, and lose them.
 */
#define PING_MS 1000u
#define PING_QUIET_MS 100u

/* One frame of the stream applied. KVP_OK; KVP_ERR_PENDING (a ping's answer);
 * KVP_ERR_UNSUPPORTED / _SEGMENT_GONE (the stream ends: no record kept for this segment /
 * not this mount); other errors: the stream broke. */
static kvp_status_t take_frame(kvp_record_sync_t *rs, kvp_chan_t *ch, uint64_t id)
{
    kvp_rpc_hdr_t h;
    uint8_t *b = NULL;
    kvp_status_t st = read_frame(ch, &h, &b);
    if (st != KVP_OK)
        return st;
    if (h.request_id != STREAM_REQ_ID || h.status != 0) {
        free(b); /* a ping's answer; or an error frame (a standby: NOT_LEADER) */
        return h.status != 0 ? KVP_ERR_IO : KVP_ERR_PENDING;
    }
    Kvpool__SegRecordResponse *r = kvpool__seg_record_response__unpack(NULL, h.body_len, b);
    free(b);
    if (r == NULL)
        return KVP_ERR_PROTOCOL;
    st = r->status;
    if (r->broken) {
        KVP_LOG_WARN("segment %s: the master stopped keeping its record for a while: "
                     "objects on it before now will not survive a master restart",
                     kvp_segment_name(rs->seg));
        kvp_seg_record_clear(rs->record);
    }
    if (st == KVP_OK &&
        kvp_seg_record_apply(rs->record, id, r->changes.data, r->changes.len) != KVP_OK)
        KVP_LOG_WARN("segment %s: a malformed record change from the master: record cleared",
                     kvp_segment_name(rs->seg));
    kvpool__seg_record_response__free_unpacked(r, NULL);
    return st;
}

/*
 * The segment was mounted again (or began draining) while this stream was open: what the
 * master wrote on it before is still to be applied, or the next offer would miss it (a put
 * the old leader acknowledged just before it stopped: its change is in our socket, unread,
 * when another thread's call has already remounted at the new leader). Read until the
 * stream ends (the old master closed it: a stop, a failover, a kill), or nothing more came
 * for REST_QUIET_MS (the same master, which keeps the connection), REST_MAX_MS at most.
 */
#define REST_QUIET_MS 50
#define REST_MAX_MS 1000u

static void take_rest(kvp_record_sync_t *rs, kvp_chan_t *ch, uint64_t id)
{
    uint64_t end = kvp_now_ms() + REST_MAX_MS;
    unsigned frames = 0;
    while (kvp_now_ms() < end && !atomic_load(&rs->stop)) {
        if (kvp_chan_wait_readable(ch, REST_QUIET_MS) != KVP_OK)
            break;
        kvp_status_t st = take_frame(rs, ch, id);
        if (st == KVP_OK)
            frames++;
        else if (st != KVP_ERR_PENDING)
            break;
    }
    if (frames > 0)
        KVP_LOG_INFO("segment %s: %u record change(s) still in flight applied after the "
                     "segment was remounted or began draining",
                     kvp_segment_name(rs->seg), frames);
}

/*
 * Subscribe to mount id's record changes and wait for the master's first frame: from then
 * on every change is streamed ahead of the reply that causes it. *offer: the mount waits
 * for the record (record_offer, which opens the segment), offered only now, so no object
 * lands on the segment before its changes are streamed. Then apply changes until the
 * stream ends.
 */
static stream_end_t stream(kvp_record_sync_t *rs, uint64_t id, bool *offer)
{
    kvp_chan_t *ch; /* to the leader the mount went to; TLS and Auth as every connection */
    if (kvp_mconn_dial(kvp_session_mconn(rs->session), &ch) != KVP_OK)
        return STREAM_LOST;
    Kvpool__SegRecordRequest req = KVPOOL__SEG_RECORD_REQUEST__INIT;
    req.segment_id = id;
    req.client_id = rs->client_id;
    uint8_t body[32];
    size_t len = kvpool__seg_record_request__pack(&req, body);
    stream_end_t end = STREAM_LOST;
    uint64_t last_rx = kvp_now_ms(), ping_id = STREAM_REQ_ID;
    if (kvp_rpc_chan_send(ch, KVP_RPC_SEG_RECORD, STREAM_REQ_ID, body, len) != KVP_OK)
        goto out;
    kvp_seg_record_bind(rs->record, id);
    kvp_status_t st = take_frame(rs, ch, id); /* the first frame: subscribed (or refused) */
    if (*offer && (st == KVP_OK || st == KVP_ERR_UNSUPPORTED)) {
        *offer = false;
        record_offer(rs, id);
    }
    while (st == KVP_OK || st == KVP_ERR_PENDING) {
        if (atomic_load(&rs->stop))
            break;
        int state = kvp_segment_state(rs->seg);
        if (kvp_segment_id(rs->seg) != id || kvp_segment_offer_waiting(rs->seg) ||
            (state != KVP_SEG_MOUNTED && state != KVP_SEG_DRAINED)) {
            end = STREAM_REMOUNT;
            break;
        }
        /* (drained: the segment is leaving, unmounted by the client's destroy or the drain;
         * the stream stays until this thread stops, so that the master sees it close only
         * after the Unmount, not as a stream lost with changes, server.c) */
        kvp_status_t ws = kvp_chan_wait_readable(ch, PING_QUIET_MS);
        if (ws == KVP_ERR_IO)
            break;
        if (ws == KVP_OK) {
            st = take_frame(rs, ch, id);
            last_rx = kvp_now_ms();
        } else if (kvp_now_ms() - last_rx >= PING_MS) {
            /* quiet for PING_MS, nothing to read for PING_QUIET_MS: liveness (above); not
             * if something came meanwhile (this thread was stopped right after the wait) */
            if (kvp_chan_wait_readable(ch, 0) != KVP_ERR_TIMEOUT)
                continue;
            if (kvp_rpc_chan_send(ch, KVP_RPC_PING, ++ping_id, NULL, 0) != KVP_OK)
                break;
            last_rx = kvp_now_ms(); /* (its answer comes within the next wait) */
        }
    }
    if (st == KVP_ERR_UNSUPPORTED)
        end = STREAM_UNSUPPORTED; /* --segment-records off */
    else if (st == KVP_ERR_SEGMENT_GONE)
        end = STREAM_REMOUNT; /* the master does not know this mount (any more) */
    if (end == STREAM_REMOUNT && (st == KVP_OK || st == KVP_ERR_PENDING))
        take_rest(rs, ch, id);
out:
    kvp_chan_close(ch);
    return end;
}

/* The stream broke: the master is likely gone. Have the master connection notice now (a
 * call reconnects, and its on_ready remounts) rather than at the next heartbeat, so a
 * restarted master gets this segment's record back within a few hundred ms. */
static void reconnect(kvp_record_sync_t *rs)
{
    for (unsigned ms = 50; ms <= 800 && !atomic_load(&rs->stop); ms *= 2) {
        nap(ms);
        uint8_t *resp;
        size_t rlen;
        if (kvp_segment_offer_waiting(rs->seg) ||
            kvp_session_call(rs->session, KVP_RPC_PING, NULL, &resp, &rlen) == KVP_OK)
            return;
    }
}

static void *record_main(void *arg)
{
    kvp_record_sync_t *rs = arg;
    uint64_t unsupported = 0; /* a mount the master keeps no record for */
    unsigned tries = 0;       /* streams that could not be opened for a mount that waits */
    bool offer = false;
    while (!atomic_load(&rs->stop)) {
        /* A (re)mount waits for its record: offered by stream(), on this thread, after
         * the previous stream's changes were applied, so none is missed or applied late. */
        uint64_t o = kvp_segment_offer_take(rs->seg);
        uint64_t id = kvp_segment_id(rs->seg);
        if (o != 0) {
            offer = o == id;
            tries = 0;
        }
        if (kvp_segment_state(rs->seg) != KVP_SEG_MOUNTED || id == 0 ||
            (id == unsupported && !offer)) {
            nap(50);
            continue;
        }
        if (offer && ++tries > 3) {
            /* no stream to be had: open the segment anyway, unrecorded until one is */
            offer = false;
            kvp_seg_record_bind(rs->record, id);
            record_offer(rs, id);
        }
        stream_end_t end = stream(rs, id, &offer);
        if (end == STREAM_UNSUPPORTED)
            unsupported = id;
        else if (end == STREAM_LOST)
            reconnect(rs);
    }
    return NULL;
}

kvp_status_t kvp_record_sync_start(const kvp_record_sync_params_t *params, kvp_record_sync_t **rs_p)
{
    kvp_record_sync_t *rs = calloc(1, sizeof(*rs));
    if (rs == NULL)
        return KVP_ERR_NOMEM;
    rs->seg = params->seg;
    rs->record = kvp_segment_record(params->seg);
    rs->session = params->session;
    rs->client_id = params->client_id;
    rs->timeout_ms = params->timeout_ms;
    atomic_init(&rs->stop, false);
    if (pthread_create(&rs->thread, NULL, record_main, rs) != 0) {
        free(rs);
        return KVP_ERR_SYSTEM;
    }
    *rs_p = rs;
    return KVP_OK;
}

kvp_status_t kvp_record_sync_wait_open(kvp_record_sync_t *rs)
{
    uint64_t deadline = kvp_now_ms() + rs->timeout_ms;
    while (!kvp_segment_is_open(rs->seg)) {
        if (kvp_now_ms() >= deadline)
            return KVP_ERR_TIMEOUT;
        nap(1);
    }
    return KVP_OK;
}

void kvp_record_sync_stop(kvp_record_sync_t *rs)
{
    if (rs == NULL)
        return;
    atomic_store(&rs->stop, true);
    pthread_join(rs->thread, NULL);
    free(rs);
}
