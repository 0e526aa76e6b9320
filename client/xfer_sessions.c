/*
 * xfer_sessions.c - transfer sessions: Mooncake's batch_get_session_* and batch_put_session_*
 * (SGLang's layer-wise KV path). The master is asked once per key when a session starts;
 * every ranged multi-buffer transfer in between goes straight to the replicas with no
 * master call; end (or revoke) closes it.
 *
 * Get: GetReplicaList once (replicas in the order to read them, and a read lease); each
 * range call checks the lease on the client's clock (from before the request: the client's
 * view ends first) and reads each range from the first replica, the next on a failure. A
 * read that ends past the lease is KVP_ERR_LEASE_EXPIRED and drops the session: the extent
 * may have been reused, so its bytes are not trusted. End hands the leases back.
 *
 * Put: PutStart once (PENDING objects, extents reserved, write grants good for the master's
 * --put-timeout, which PutStartResponse.put_timeout_ms carries); each range call writes its
 * ranges straight from the caller's buffers into every replica still good (zero-copy, as a
 * put), each op computing the CRC32C of its bytes on the way. The CRCs of the ranges written
 * are kept as sorted disjoint intervals (the same range written again replaces its CRC),
 * merged when SESS_IV_MAX are held and at the end (kvp_crc32c_combine): end wants one
 * interval covering the object, whose CRC goes to PutEnd (the object's stored CRC, which
 * every get checks). A range that overlaps one written before (other than the same range
 * again, while unmerged), or too many pieces apart, loses the CRC: end refuses, as it refuses
 * an object with bytes never written (KVP_ERR_INVALID_ARG; the session stays, to write the
 * rest or revoke). A replica a range failed to reach is left out of PutEnd (written_mask).
 * No range is written past the put's deadline (less a margin): the master revokes a put
 * not ended by then (a client that dies holding a session too: its connection closes), and
 * its extents may hold another object afterwards.
 *
 * Memory: an entry per key, allocated at start (with the answer it points into: the
 * grants); a range call takes its per-call arrays from the thread's scratch arena.
 *
 * Thread: any client thread. One mutex guards both tables and every entry's fields; it is
 * never held across a master call or a transfer. A range call holds a reference on each
 * entry it uses; end and revoke seal theirs (no new range call starts on them) and wait on
 * `idle` for the calls in flight before they talk to the master.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "client/api.h"
#include "client/client_priv.h"
#include "client/mem/scratch.h"
#include "client/object_priv.h"
#include "client/xfer_sessions.h"
#include "common/clock.h"
#include "common/key.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/rpc.h"
#include "kvpool.pb-c.h"

/* Ranges of a put session's object kept apart, at most (then the runs that touch merge):
 * 3 KiB per key, allocated at start. */
#define SESS_IV_MAX 128
/* A put session writes nothing this close to its deadline: a write may take this long. */
#define SESS_PUT_MARGIN_MS 1000u

/* An unpacked master answer the entries' grants point into; freed with the last entry. */
typedef struct sess_resp {
    unsigned refs;
    ProtobufCMessage *msg;
} sess_resp_t;

typedef struct sess_rep {
    uint64_t segment_id, offset;
    kvp_xfer_grant_t grant;
} sess_rep_t;

typedef struct sess_iv {
    uint64_t off, len;
    uint32_t crc;
} sess_iv_t;

typedef struct sess_ent {
    struct sess_ent *next;
    uint64_t hash;
    unsigned refs; /* the table's while linked, and each call using it */
    bool linked;
    bool closing;  /* put: an end or revoke is under way */
    bool crc_lost; /* put: a range overlapped, or too many pieces */
    uint8_t n_rep;
    uint32_t mask; /* put: the replicas every range so far reached */
    uint64_t size;
    uint64_t version;     /* put: its PutStart's (its end or revoke names it) */
    uint64_t deadline_ms; /* get: the lease's end; put: the last moment to write; 0: none */
    uint64_t lease_id;    /* get */
    sess_resp_t *resp;
    sess_rep_t rep[KVP_OBJ_REPLICAS_MAX]; /* get: in the order to read them */
    uint32_t n_iv;
    sess_iv_t *iv; /* put: [SESS_IV_MAX], sorted, disjoint */
    size_t key_len;
    char key[];
} sess_ent_t;

typedef struct sess_table {
    sess_ent_t **b;
    size_t nb, n;
} sess_table_t;

struct kvp_xsessions {
    pthread_mutex_t lock;
    pthread_cond_t idle;
    sess_table_t get, put;
};

static sess_ent_t *table_find(const sess_table_t *t, const char *key, size_t len, uint64_t h)
{
    if (t->nb == 0)
        return NULL;
    for (sess_ent_t *e = t->b[h & (t->nb - 1)]; e != NULL; e = e->next)
        if (e->hash == h && e->key_len == len && memcmp(e->key, key, len) == 0)
            return e;
    return NULL;
}

/* Link e (its key not in t). False: no memory to grow (e not linked). */
static bool table_link(sess_table_t *t, sess_ent_t *e)
{
    if (t->n + 1 > t->nb) {
        size_t nb = t->nb ? t->nb * 2 : 64;
        sess_ent_t **b = calloc(nb, sizeof(*b));
        if (b == NULL)
            return false;
        for (size_t i = 0; i < t->nb; i++)
            for (sess_ent_t *x = t->b[i], *nx; x != NULL; x = nx) {
                nx = x->next;
                x->next = b[x->hash & (nb - 1)];
                b[x->hash & (nb - 1)] = x;
            }
        free(t->b);
        t->b = b;
        t->nb = nb;
    }
    sess_ent_t **head = &t->b[e->hash & (t->nb - 1)];
    e->next = *head;
    *head = e;
    e->linked = true;
    e->refs++;
    t->n++;
    return true;
}

static void resp_unref(sess_resp_t *r)
{
    if (r != NULL && --r->refs == 0) {
        protobuf_c_message_free_unpacked(r->msg, NULL);
        free(r);
    }
}

/* Drop a reference; the last frees e, its lease id going to ids[*n_ids] (to hand back
 * once the lock is released). */
static void ent_unref(sess_ent_t *e, uint64_t *ids, size_t *n_ids)
{
    if (--e->refs > 0)
        return;
    if (e->lease_id != 0 && ids != NULL)
        ids[(*n_ids)++] = e->lease_id;
    resp_unref(e->resp);
    free(e->iv);
    free(e);
}

static void table_unlink(sess_table_t *t, sess_ent_t *e, uint64_t *ids, size_t *n_ids)
{
    if (!e->linked)
        return;
    for (sess_ent_t **p = &t->b[e->hash & (t->nb - 1)]; *p != NULL; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    e->linked = false;
    t->n--;
    ent_unref(e, ids, n_ids);
}

static void table_cleanup(sess_table_t *t)
{
    for (size_t i = 0; i < t->nb; i++)
        for (sess_ent_t *e = t->b[i], *nx; e != NULL; e = nx) {
            nx = e->next;
            e->refs = 1;
            ent_unref(e, NULL, NULL);
        }
    free(t->b);
    memset(t, 0, sizeof(*t));
}

kvp_xsessions_t *kvp_xsessions_create(void)
{
    kvp_xsessions_t *xs = calloc(1, sizeof(*xs));
    if (xs == NULL)
        return NULL;
    pthread_mutex_init(&xs->lock, NULL);
    pthread_cond_init(&xs->idle, NULL);
    return xs;
}

void kvp_xsessions_destroy(kvp_xsessions_t *xs)
{
    if (xs == NULL)
        return;
    /* no call is in progress; the master revokes the PENDING puts and ends the leases of a
     * closed connection */
    table_cleanup(&xs->get);
    table_cleanup(&xs->put);
    pthread_cond_destroy(&xs->idle);
    pthread_mutex_destroy(&xs->lock);
    free(xs);
}

static bool key_ok(const char *k)
{
    return k != NULL && kvp_key_valid(k, strnlen(k, KVP_MAX_KEY_LEN + 1));
}

static sess_ent_t *ent_new(const char *key, uint64_t size, sess_resp_t *resp)
{
    size_t len = strlen(key);
    sess_ent_t *e = calloc(1, sizeof(*e) + len + 1);
    if (e == NULL)
        return NULL;
    memcpy(e->key, key, len + 1);
    e->key_len = len;
    e->hash = kvp_key_hash(key, len);
    e->size = size;
    e->refs = 0;
    e->resp = resp;
    resp->refs++;
    return e;
}

static void release_ids(kvp_client_t *c, const uint64_t *ids, size_t n)
{
    if (n > 0)
        kvp_session_lease_release(c->session, ids, n);
}

static kvp_status_t first_error(const kvp_status_t *st, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (st[i] < 0)
            return st[i];
    return KVP_OK;
}

/* ---------------- get sessions ---------------- */

static kvp_status_t get_start(kvp_client_t *c, const char *const *keys, size_t n,
                              kvp_status_t *results)
{
    if (c == NULL || keys == NULL || results == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    if (n == 0)
        return KVP_OK;
    kvp_xsessions_t *xs = c->xs;
    size_t *idx = kvp_scratch_alloc(n * sizeof(*idx));
    sess_ent_t **ents = kvp_scratch_calloc(n, sizeof(*ents));
    uint64_t *ids = kvp_scratch_alloc(2 * n * sizeof(*ids));
    if (idx == NULL || ents == NULL || ids == NULL)
        return KVP_ERR_NOMEM;
    size_t m = 0, n_ids = 0;
    for (size_t i = 0; i < n; i++) {
        results[i] = key_ok(keys[i]) ? KVP_OK : KVP_ERR_BAD_KEY;
        if (results[i] == KVP_OK)
            idx[m++] = i;
    }
    if (m == 0)
        return first_error(results, n);
    uint64_t t0 = kvp_now_ms(); /* the lease runs from the reply: ours ends first */
    uint8_t *body;
    size_t rlen;
    kvp_status_t rc =
        kvp_obj_keys_call(c, KVP_RPC_GET_REPLICA_LIST, keys, idx, m, false, &body, &rlen);
    Kvpool__GetReplicaListResponse *gr =
        rc == KVP_OK ? kvpool__get_replica_list_response__unpack(NULL, rlen, body) : NULL;
    if (rc == KVP_OK && (gr == NULL || gr->status != KVP_OK || gr->n_results != m))
        rc = gr == NULL || gr->status == KVP_OK ? KVP_ERR_PROTOCOL : gr->status;
    sess_resp_t *resp = rc == KVP_OK ? calloc(1, sizeof(*resp)) : NULL;
    if (rc == KVP_OK && resp == NULL)
        rc = KVP_ERR_NOMEM;
    if (rc != KVP_OK) {
        for (size_t j = 0; gr != NULL && j < gr->n_results && j < m; j++)
            if (gr->results[j]->status == KVP_OK && gr->results[j]->lease_id != 0)
                ids[n_ids++] = gr->results[j]->lease_id;
        release_ids(c, ids, n_ids);
        if (gr != NULL)
            kvpool__get_replica_list_response__free_unpacked(gr, NULL);
        for (size_t j = 0; j < m; j++)
            results[idx[j]] = rc;
        return rc;
    }
    resp->msg = &gr->base;
    resp->refs = 1; /* ours, until the entries are linked */
    kvp_peers_update(&c->peers, gr->segments, gr->n_segments);
    for (size_t j = 0; j < m; j++) {
        Kvpool__GetReplicaResult *r = gr->results[j];
        size_t i = idx[j];
        results[i] = r->status;
        if (r->status != KVP_OK)
            continue;
        if (r->n_replicas == 0 || r->n_replicas > KVP_OBJ_REPLICAS_MAX)
            results[i] = KVP_ERR_PROTOCOL;
        else if ((ents[i] = ent_new(keys[i], r->size, resp)) == NULL)
            results[i] = KVP_ERR_NOMEM;
        if (results[i] != KVP_OK) {
            if (r->lease_id != 0)
                ids[n_ids++] = r->lease_id;
            continue;
        }
        sess_ent_t *e = ents[i];
        size_t order[KVP_OBJ_REPLICAS_MAX];
        kvp_obj_order_replicas(c, r, order);
        e->n_rep = (uint8_t)r->n_replicas;
        for (size_t q = 0; q < r->n_replicas; q++) {
            const Kvpool__Replica *rep = r->replicas[order[q]];
            e->rep[q] = (sess_rep_t){.segment_id = rep->segment_id,
                                     .offset = rep->offset,
                                     .grant = kvp_obj_rep_grant(rep, gr->segments, gr->n_segments)};
        }
        e->lease_id = r->lease_id;
        e->deadline_ms = gr->lease_ttl_ms > 0 ? t0 + gr->lease_ttl_ms : 0;
    }
    pthread_mutex_lock(&xs->lock);
    for (size_t i = 0; i < n; i++) {
        size_t len = keys[i] != NULL && results[i] != KVP_ERR_BAD_KEY ? strlen(keys[i]) : 0;
        if (len == 0)
            continue;
        /* a new start replaces the key's session; a failed one ends it (as Mooncake's) */
        sess_ent_t *old = table_find(&xs->get, keys[i], len, kvp_key_hash(keys[i], len));
        if (old != NULL)
            table_unlink(&xs->get, old, ids, &n_ids);
        if (ents[i] != NULL && !table_link(&xs->get, ents[i])) {
            results[i] = KVP_ERR_NOMEM;
            ents[i]->refs = 1;
            ent_unref(ents[i], ids, &n_ids);
        }
    }
    resp_unref(resp);
    pthread_mutex_unlock(&xs->lock);
    release_ids(c, ids, n_ids);
    kvp_api_fail_keys("get_session_start", keys, (const int32_t *)results, n);
    return first_error(results, n);
}

kvp_status_t kvp_batch_get_session_start(kvp_client_t *c, const char *const *keys, size_t n,
                                         kvp_status_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(get_start(c, keys, n, results), "get_session_start");
}

static kvp_status_t get_end(kvp_client_t *c, const char *const *keys, size_t n)
{
    if (c == NULL || (keys == NULL && n > 0) || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    uint64_t *ids = kvp_scratch_alloc((n ? n : 1) * sizeof(*ids));
    if (ids == NULL)
        return KVP_ERR_NOMEM;
    size_t n_ids = 0;
    pthread_mutex_lock(&c->xs->lock);
    for (size_t i = 0; i < n; i++) {
        if (keys[i] == NULL)
            continue;
        size_t len = strlen(keys[i]);
        sess_ent_t *e = table_find(&c->xs->get, keys[i], len, kvp_key_hash(keys[i], len));
        if (e != NULL)
            table_unlink(&c->xs->get, e, ids, &n_ids);
    }
    pthread_mutex_unlock(&c->xs->lock);
    release_ids(c, ids, n_ids);
    return KVP_OK;
}

kvp_status_t kvp_batch_get_session_end(kvp_client_t *c, const char *const *keys, size_t n)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(get_end(c, keys, n), "get_session_end");
}

/* ---------------- range calls (both directions) ---------------- */

/* One range call's state, from the thread's scratch arena. */
typedef struct range_call {
    kvp_client_t *c;
    bool put;
    const char *const *keys;
    void *const *const *bufs;
    const size_t *const *sizes;
    const uint64_t *const *offsets;
    const size_t *n_bufs;
    size_t n;
    int64_t *results;
    sess_ent_t **ents;  /* [n] the session each key uses; NULL: refused */
    uint64_t *bytes;    /* [n] its ranges' bytes */
    kvp_xfer_op_t *ops; /* [max_ops] */
    size_t *grp;        /* [max_ops] key * 8 + replica */
    size_t max_ops;
    uint64_t *ids; /* [n] leases to hand back */
    size_t n_ids;
} range_call_t;

/* Under the lock: each key's session and its ranges checked; a reference taken on each
 * session used. */
static void ranges_take(range_call_t *rc)
{
    kvp_xsessions_t *xs = rc->c->xs;
    sess_table_t *t = rc->put ? &xs->put : &xs->get;
    uint64_t now = kvp_now_ms();
    for (size_t i = 0; i < rc->n; i++) {
        rc->results[i] = KVP_ERR_INVALID_ARG;
        const char *k = rc->keys[i];
        if (k == NULL || (rc->n_bufs[i] > 0 &&
                          (rc->bufs[i] == NULL || rc->sizes[i] == NULL || rc->offsets[i] == NULL)))
            continue;
        size_t len = strnlen(k, KVP_MAX_KEY_LEN + 1);
        sess_ent_t *e = table_find(t, k, len, kvp_key_hash(k, len));
        if (e == NULL || e->closing)
            continue; /* no session, or one being ended: Mooncake's INVALID_PARAMS */
        if (e->deadline_ms != 0 && now >= e->deadline_ms) {
            if (rc->put) {
                rc->results[i] = KVP_ERR_PUT_REVOKED;
                kvp_api_fail_key(k,
                                 "put session %s: past the master's put timeout, the put is "
                                 "revoked; revoke the session and start again",
                                 k);
            } else {
                rc->results[i] = KVP_ERR_LEASE_EXPIRED;
                table_unlink(t, e, rc->ids, &rc->n_ids);
            }
            continue;
        }
        bool bad = false;
        uint64_t bytes = 0;
        for (size_t b = 0; b < rc->n_bufs[i] && !bad; b++) {
            uint64_t s = rc->sizes[i][b], off = rc->offsets[i][b];
            /* off + s past the object, checked without the sum */
            bad = s > e->size || off > e->size - s || (s > 0 && rc->bufs[i][b] == NULL);
            bytes += s;
            rc->max_ops += (s > 0) * (rc->put ? e->n_rep : 1);
        }
        if (bad) {
            kvp_api_fail_key(k, "%s session %s: a range reaches past the object's %llu bytes",
                             rc->put ? "put" : "get", k, (unsigned long long)e->size);
            continue;
        }
        e->refs++;
        rc->ents[i] = e;
        rc->bytes[i] = bytes;
        rc->results[i] = KVP_OK;
    }
}

/* Key i's ranges to or from replica q, as ops from k on (group i * 8 + q). */
static size_t ranges_plan(range_call_t *rc, size_t i, unsigned q, size_t k)
{
    const sess_ent_t *e = rc->ents[i];
    for (size_t b = 0; b < rc->n_bufs[i]; b++) {
        uint64_t s = rc->sizes[i][b];
        if (s == 0)
            continue;
        kvp_peer_t *peer = kvp_peers_get(&rc->c->peers, e->rep[q].segment_id);
        rc->ops[k] = (kvp_xfer_op_t){.kind = rc->put ? KVP_XFER_WRITE : KVP_XFER_READ,
                                     .local = rc->bufs[i][b],
                                     .offset = e->rep[q].offset + rc->offsets[i][b],
                                     .length = s,
                                     .peer = peer,
                                     .want_crc = rc->put,
                                     .stream = s >= KVP_CRC32C_STREAM_MIN,
                                     .grant = e->rep[q].grant.one,
                                     .grant_set = e->rep[q].grant.set,
                                     .grant_index = e->rep[q].grant.index,
                                     .status = peer == NULL ? KVP_ERR_UNKNOWN_SEGMENT : KVP_OK};
        rc->grp[k++] = i * KVP_OBJ_REPLICAS_MAX + q;
    }
    return k;
}

/* Run ops[0..k) (those with no peer are failed already); their first failure per group
 * into st (by group's op index range). */
static void ranges_run(range_call_t *rc, size_t k)
{
    /* ops with no peer are moved out of the way: the engine runs the others */
    size_t live = 0;
    for (size_t q = 0; q < k; q++)
        live += rc->ops[q].peer != NULL;
    if (live == k) {
        kvp_transfer_run(&rc->c->xfer, rc->ops, k);
        return;
    }
    for (size_t q = 0; q < k; q++)
        if (rc->ops[q].peer != NULL)
            kvp_transfer_run(&rc->c->xfer, &rc->ops[q], 1);
}

static kvp_status_t group_status(const range_call_t *rc, size_t q, size_t k, size_t *end_p)
{
    kvp_status_t st = KVP_OK;
    size_t e = q;
    for (; e < k && rc->grp[e] == rc->grp[q]; e++)
        if (st == KVP_OK)
            st = rc->ops[e].status;
    *end_p = e;
    return st;
}

static void unref_peers(range_call_t *rc, size_t q, size_t e)
{
    for (; q < e; q++)
        if (rc->ops[q].peer != NULL)
            kvp_peer_unref(rc->ops[q].peer);
}

/* Get: round r reads each key not done from its replica r. */
static void get_ranges_xfer(range_call_t *rc)
{
    unsigned *tried = kvp_scratch_calloc(rc->n, sizeof(*tried));
    kvp_status_t *last = kvp_scratch_alloc(rc->n * sizeof(*last));
    bool *done = kvp_scratch_calloc(rc->n, sizeof(*done));
    if (tried == NULL || last == NULL || done == NULL) {
        for (size_t i = 0; i < rc->n; i++)
            if (rc->ents[i] != NULL)
                rc->results[i] = KVP_ERR_NOMEM;
        return;
    }
    for (size_t i = 0; i < rc->n; i++) {
        last[i] = KVP_ERR_NO_REPLICA;
        done[i] = rc->ents[i] == NULL || rc->bytes[i] == 0;
    }
    for (unsigned round = 0; round < KVP_OBJ_REPLICAS_MAX; round++) {
        size_t k = 0;
        for (size_t i = 0; i < rc->n; i++)
            if (!done[i] && round < rc->ents[i]->n_rep) {
                k = ranges_plan(rc, i, round, k);
                tried[i]++;
            }
        if (k == 0)
            break;
        ranges_run(rc, k);
        for (size_t q = 0; q < k;) {
            size_t end, i = rc->grp[q] / KVP_OBJ_REPLICAS_MAX;
            kvp_status_t s = group_status(rc, q, k, &end);
            if (s == KVP_OK) {
                done[i] = true;
            } else {
                last[i] = s;
                KVP_LOG_WARN("get session %s: read failed: %s", rc->keys[i], kvp_strerror(s));
                if (rc->ops[q].peer != NULL && s != KVP_ERR_LEASE_EXPIRED)
                    kvp_peers_suspect(&rc->c->peers, rc->ops[q].peer);
            }
            unref_peers(rc, q, end);
            q = end;
        }
    }
    uint64_t now = kvp_now_ms();
    for (size_t i = 0; i < rc->n; i++) {
        sess_ent_t *e = rc->ents[i];
        if (e == NULL)
            continue;
        if (!done[i])
            rc->results[i] = e->n_rep > 1 && tried[i] >= e->n_rep ? KVP_ERR_NO_REPLICA : last[i];
        else if (e->deadline_ms != 0 && now >= e->deadline_ms)
            rc->results[i] = KVP_ERR_LEASE_EXPIRED; /* the extent may have been reused */
        else
            rc->results[i] = (int64_t)rc->bytes[i];
    }
}

/* Merge e's intervals that touch (each run into one, its CRC combined in order). */
static void iv_compact(sess_ent_t *e)
{
    sess_iv_t *iv = e->iv;
    uint32_t w = 0;
    for (uint32_t r = 0; r < e->n_iv; r++) {
        if (w > 0 && iv[w - 1].off + iv[w - 1].len == iv[r].off) {
            iv[w - 1].crc = kvp_crc32c_combine(iv[w - 1].crc, iv[r].crc, iv[r].len);
            iv[w - 1].len += iv[r].len;
        } else {
            iv[w++] = iv[r];
        }
    }
    e->n_iv = w;
}

/*
 * Record a range written (its CRC) in e's intervals: sorted, disjoint, kept apart while
 * there is room, so that the same range written again (a layer rewritten) replaces its
 * CRC; when full, the runs that touch are merged. An overlap with another range (or with
 * part of a merged run), or no room even then, loses the CRC.
 */
static void iv_add(sess_ent_t *e, uint64_t off, uint64_t len, uint32_t crc)
{
    if (e->crc_lost || len == 0)
        return;
    sess_iv_t *iv = e->iv;
    uint32_t p = 0;
    while (p < e->n_iv && iv[p].off < off)
        p++;
    if (p < e->n_iv && iv[p].off == off && iv[p].len == len) {
        iv[p].crc = crc; /* the same range again: its bytes are the new ones */
        return;
    }
    if ((p > 0 && iv[p - 1].off + iv[p - 1].len > off) || (p < e->n_iv && off + len > iv[p].off)) {
        e->crc_lost = true;
        return;
    }
    if (e->n_iv == SESS_IV_MAX) {
        iv_compact(e);
        if (e->n_iv == SESS_IV_MAX) {
            e->crc_lost = true;
            return;
        }
        for (p = 0; p < e->n_iv && iv[p].off < off;)
            p++;
    }
    memmove(&iv[p + 1], &iv[p], (e->n_iv - p) * sizeof(*iv));
    iv[p] = (sess_iv_t){.off = off, .len = len, .crc = crc};
    e->n_iv++;
}

/* Put: every range to every replica still good, at once. */
static void put_ranges_xfer(range_call_t *rc)
{
    size_t k = 0;
    for (size_t i = 0; i < rc->n; i++) {
        sess_ent_t *e = rc->ents[i];
        if (e == NULL)
            continue;
        for (unsigned q = 0; q < e->n_rep; q++)
            if (e->mask & (1u << q))
                k = ranges_plan(rc, i, q, k);
    }
    if (k > 0)
        ranges_run(rc, k);
    /* per key: the replicas reached (the first one's op CRCs are the ranges') */
    uint32_t *ok = kvp_scratch_calloc(rc->n, sizeof(*ok));
    size_t *crc_from = kvp_scratch_alloc(rc->n * sizeof(*crc_from));
    kvp_status_t *last = kvp_scratch_alloc(rc->n * sizeof(*last));
    if (ok == NULL || crc_from == NULL || last == NULL) {
        unref_peers(rc, 0, k);
        for (size_t i = 0; i < rc->n; i++)
            if (rc->ents[i] != NULL) {
                rc->results[i] = KVP_ERR_NOMEM;
                rc->ents[i]->crc_lost = true; /* bytes written and not known: end refuses */
            }
        return;
    }
    for (size_t i = 0; i < rc->n; i++) {
        crc_from[i] = SIZE_MAX;
        last[i] = KVP_ERR_NO_REPLICA;
    }
    for (size_t q = 0; q < k;) {
        size_t end, i = rc->grp[q] / KVP_OBJ_REPLICAS_MAX;
        unsigned r = rc->grp[q] % KVP_OBJ_REPLICAS_MAX;
        kvp_status_t s = group_status(rc, q, k, &end);
        if (s == KVP_OK) {
            ok[i] |= 1u << r;
            if (crc_from[i] == SIZE_MAX)
                crc_from[i] = q;
        } else {
            last[i] = s;
            KVP_LOG_WARN("put session %s: write to replica %u failed: %s", rc->keys[i], r,
                         kvp_strerror(s));
            kvp_api_fail_key(rc->keys[i], "put session %s: write to replica %u failed: %s",
                             rc->keys[i], r, kvp_strerror(s));
            if (rc->ops[q].peer != NULL)
                kvp_peers_suspect(&rc->c->peers, rc->ops[q].peer);
        }
        unref_peers(rc, q, end);
        q = end;
    }
    pthread_mutex_lock(&rc->c->xs->lock);
    for (size_t i = 0; i < rc->n; i++) {
        sess_ent_t *e = rc->ents[i];
        if (e == NULL)
            continue;
        if (rc->bytes[i] == 0) {
            rc->results[i] = 0;
            continue;
        }
        /* a replica a range missed holds wrong bytes there: it is left out of PutEnd */
        e->mask &= ok[i];
        if (ok[i] == 0) {
            rc->results[i] = e->n_rep > 1 ? KVP_ERR_NO_REPLICA : last[i];
            continue;
        }
        for (size_t q = crc_from[i]; q < k && rc->grp[q] == rc->grp[crc_from[i]]; q++)
            iv_add(e, rc->ops[q].offset - e->rep[rc->grp[q] % KVP_OBJ_REPLICAS_MAX].offset,
                   rc->ops[q].length, rc->ops[q].crc);
        rc->results[i] = (int64_t)rc->bytes[i];
    }
    pthread_mutex_unlock(&rc->c->xs->lock);
}

static kvp_status_t ranges_call(kvp_client_t *c, bool put, const char *const *keys,
                                void *const *const *bufs, const size_t *const *sizes,
                                const uint64_t *const *offsets, const size_t *n_bufs, size_t n,
                                int64_t *results)
{
    if (c == NULL || keys == NULL || results == NULL || n > KVP_MAX_BATCH ||
        (n > 0 && (bufs == NULL || sizes == NULL || offsets == NULL || n_bufs == NULL)))
        return KVP_ERR_INVALID_ARG;
    if (n == 0)
        return KVP_OK;
    range_call_t rc = {.c = c,
                       .put = put,
                       .keys = keys,
                       .bufs = bufs,
                       .sizes = sizes,
                       .offsets = offsets,
                       .n_bufs = n_bufs,
                       .n = n,
                       .results = results};
    rc.ents = kvp_scratch_calloc(n, sizeof(*rc.ents));
    rc.bytes = kvp_scratch_calloc(n, sizeof(*rc.bytes));
    rc.ids = kvp_scratch_alloc(n * sizeof(*rc.ids));
    if (rc.ents == NULL || rc.bytes == NULL || rc.ids == NULL)
        return KVP_ERR_NOMEM;
    kvp_xsessions_t *xs = c->xs;
    pthread_mutex_lock(&xs->lock);
    ranges_take(&rc);
    pthread_mutex_unlock(&xs->lock);
    rc.ops = kvp_scratch_calloc(rc.max_ops + 1, sizeof(*rc.ops));
    rc.grp = kvp_scratch_alloc((rc.max_ops + 1) * sizeof(*rc.grp));
    if (rc.ops == NULL || rc.grp == NULL) {
        for (size_t i = 0; i < n; i++)
            if (rc.ents[i] != NULL)
                results[i] = KVP_ERR_NOMEM;
    } else if (put) {
        put_ranges_xfer(&rc);
    } else {
        get_ranges_xfer(&rc);
    }
    pthread_mutex_lock(&xs->lock);
    for (size_t i = 0; i < n; i++) {
        sess_ent_t *e = rc.ents[i];
        if (e == NULL)
            continue;
        if (!put && results[i] == KVP_ERR_LEASE_EXPIRED)
            table_unlink(&xs->get, e, rc.ids, &rc.n_ids);
        ent_unref(e, rc.ids, &rc.n_ids);
    }
    if (put)
        pthread_cond_broadcast(&xs->idle);
    pthread_mutex_unlock(&xs->lock);
    release_ids(c, rc.ids, rc.n_ids);
    kvp_status_t first = KVP_OK;
    for (size_t i = 0; i < n && first == KVP_OK; i++)
        if (results[i] < 0)
            first = (kvp_status_t)results[i];
    return first;
}

kvp_status_t kvp_batch_get_into_multi_ranges(kvp_client_t *c, const char *const *keys,
                                             void *const *const *bufs, const size_t *const *sizes,
                                             const uint64_t *const *offsets, const size_t *n_bufs,
                                             size_t n, int64_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(
        ranges_call(c, false, keys, bufs, sizes, offsets, n_bufs, n, results), "get_ranges");
}

kvp_status_t kvp_batch_put_from_multi_ranges(kvp_client_t *c, const char *const *keys,
                                             const void *const *const *bufs,
                                             const size_t *const *sizes,
                                             const uint64_t *const *offsets, const size_t *n_bufs,
                                             size_t n, int64_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(
        ranges_call(c, true, keys, (void *const *const *)bufs, sizes, offsets, n_bufs, n, results),
        "put_ranges");
}

/* ---------------- put sessions ---------------- */

/* Key j of a PutStart's answer sr (key, size): when the master started it, an entry of the
 * put session table (xs->lock held) with its replicas and their grants, sharing resp, to be
 * written by the deadline. The key's status: the master's; PROTOCOL or NOMEM (to be
 * revoked); INVALID_ARG for a second start of one key in the batch (the master refused it). */
static kvp_status_t put_start_keep(kvp_xsessions_t *xs, const char *key, uint64_t size,
                                   const Kvpool__PutStartResponse *sr, size_t j, sess_resp_t *resp,
                                   uint64_t deadline)
{
    const Kvpool__PutStartResult *r = sr->results[j];
    if (r->status != KVP_OK)
        return r->status;
    kvp_status_t st = KVP_OK;
    sess_ent_t *e = NULL;
    if (r->n_replicas == 0 || r->n_replicas > KVP_OBJ_REPLICAS_MAX)
        st = KVP_ERR_PROTOCOL;
    else if ((e = ent_new(key, size, resp)) == NULL ||
             (e->iv = calloc(SESS_IV_MAX, sizeof(*e->iv))) == NULL)
        st = KVP_ERR_NOMEM;
    /* two starts of one key in one batch: the master refused the second (PENDING) */
    if (st == KVP_OK && table_find(&xs->put, key, strlen(key), e->hash) != NULL)
        st = KVP_ERR_INVALID_ARG;
    if (st == KVP_OK) {
        e->n_rep = (uint8_t)r->n_replicas;
        e->version = r->version;
        e->mask = (1u << r->n_replicas) - 1;
        e->deadline_ms = deadline;
        for (size_t q = 0; q < r->n_replicas; q++)
            e->rep[q] = (sess_rep_t){
                .segment_id = r->replicas[q]->segment_id,
                .offset = r->replicas[q]->offset,
                .grant = kvp_obj_rep_grant(r->replicas[q], sr->segments, sr->n_segments)};
        if (!table_link(&xs->put, e))
            st = KVP_ERR_NOMEM;
    }
    if (st != KVP_OK && e != NULL) {
        e->refs = 1;
        ent_unref(e, NULL, NULL);
    }
    return st;
}

static kvp_status_t put_start(kvp_client_t *c, const char *const *keys, const uint64_t *sizes,
                              size_t n, const kvp_put_config_t *config, kvp_status_t *results)
{
    if (c == NULL || keys == NULL || (sizes == NULL && n > 0) || results == NULL ||
        n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    if (n == 0)
        return KVP_OK;
    kvp_put_config_t cfg;
    if (kvp_obj_put_config(config, &cfg) != KVP_OK) {
        for (size_t i = 0; i < n; i++)
            results[i] = KVP_ERR_INVALID_ARG;
        return KVP_ERR_INVALID_ARG;
    }
    kvp_xsessions_t *xs = c->xs;
    size_t *idx = kvp_scratch_alloc(n * sizeof(*idx));
    ProtobufCBinaryData *kp = kvp_scratch_alloc(n * sizeof(*kp));
    uint64_t *szs = kvp_scratch_alloc(n * sizeof(*szs));
    size_t *rev = kvp_scratch_alloc(n * sizeof(*rev));
    uint64_t *rev_ver = kvp_scratch_alloc(n * sizeof(*rev_ver));
    if (idx == NULL || kp == NULL || szs == NULL || rev == NULL || rev_ver == NULL)
        return KVP_ERR_NOMEM;
    size_t m = 0, n_rev = 0;
    pthread_mutex_lock(&xs->lock);
    for (size_t i = 0; i < n; i++) {
        results[i] = key_ok(keys[i]) ? KVP_OK : KVP_ERR_BAD_KEY;
        if (results[i] != KVP_OK)
            continue;
        size_t len = strlen(keys[i]);
        if (sizes[i] == 0 || table_find(&xs->put, keys[i], len, kvp_key_hash(keys[i], len))) {
            results[i] = KVP_ERR_INVALID_ARG; /* a second start of a key in a session */
            continue;
        }
        kp[m] = (ProtobufCBinaryData){.data = (uint8_t *)keys[i], .len = len};
        szs[m] = sizes[i];
        idx[m++] = i;
    }
    pthread_mutex_unlock(&xs->lock);
    if (m == 0)
        return first_error(results, n);
    Kvpool__PutConfig pc;
    uint64_t avoid[KVP_PEERS_SUSPECTS];
    kvp_obj_put_config_wire(c, &cfg, &pc, avoid);
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    req.keys = kp;
    req.n_keys = m;
    req.sizes = szs;
    req.n_sizes = m;
    req.config = &pc;
    uint8_t *body;
    size_t rlen;
    uint64_t t0 = kvp_now_ms();
    kvp_status_t rc = kvp_session_call(c->session, KVP_RPC_PUT_START, &req.base, &body, &rlen);
    Kvpool__PutStartResponse *sr =
        rc == KVP_OK ? kvpool__put_start_response__unpack(NULL, rlen, body) : NULL;
    if (rc == KVP_OK && (sr == NULL || sr->status != KVP_OK || sr->n_results != m))
        rc = sr == NULL || sr->status == KVP_OK ? KVP_ERR_PROTOCOL : sr->status;
    sess_resp_t *resp = rc == KVP_OK ? calloc(1, sizeof(*resp)) : NULL;
    if (rc == KVP_OK && resp == NULL)
        rc = KVP_ERR_NOMEM;
    if (rc != KVP_OK) {
        /* what started (an answer we could not keep) is revoked; the rest reads rc */
        for (size_t j = 0; sr != NULL && j < m && j < sr->n_results; j++)
            if (sr->results[j]->status == KVP_OK) {
                rev_ver[n_rev] = sr->results[j]->version;
                rev[n_rev++] = idx[j];
            }
        kvp_obj_end_or_revoke(c, KVP_RPC_PUT_REVOKE, keys, rev, rev_ver, NULL, NULL, NULL, n_rev,
                              NULL);
        if (sr != NULL)
            kvpool__put_start_response__free_unpacked(sr, NULL);
        for (size_t j = 0; j < m; j++)
            results[idx[j]] = rc;
        return rc;
    }
    resp->msg = &sr->base;
    resp->refs = 1;
    kvp_peers_update(&c->peers, sr->segments, sr->n_segments);
    if (sr->message != NULL && sr->message[0] != '\0')
        kvp_api_fail("put_session_start: %s", sr->message);
    uint64_t deadline = 0;
    if (sr->put_timeout_ms > 0)
        deadline = t0 + (sr->put_timeout_ms > 2 * SESS_PUT_MARGIN_MS
                             ? sr->put_timeout_ms - SESS_PUT_MARGIN_MS
                             : sr->put_timeout_ms / 2);
    pthread_mutex_lock(&xs->lock);
    for (size_t j = 0; j < m; j++) {
        size_t i = idx[j];
        results[i] = put_start_keep(xs, keys[i], szs[j], sr, j, resp, deadline);
        /* started, but not kept: revoked (a second start of the key was refused already) */
        if (sr->results[j]->status == KVP_OK && results[i] != KVP_OK &&
            results[i] != KVP_ERR_INVALID_ARG) {
            rev_ver[n_rev] = sr->results[j]->version;
            rev[n_rev++] = i;
        }
    }
    resp_unref(resp);
    pthread_mutex_unlock(&xs->lock);
    kvp_obj_end_or_revoke(c, KVP_RPC_PUT_REVOKE, keys, rev, rev_ver, NULL, NULL, NULL, n_rev, NULL);
    kvp_api_fail_keys("put_session_start", keys, (const int32_t *)results, n);
    return first_error(results, n);
}

kvp_status_t kvp_batch_put_session_start(kvp_client_t *c, const char *const *keys,
                                         const uint64_t *sizes, size_t n,
                                         const kvp_put_config_t *config, kvp_status_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(put_start(c, keys, sizes, n, config, results),
                                       "put_session_start");
}

/* Seal the put sessions of keys (results[i] KVP_ERR_INVALID_ARG for a key with none, or
 * one another end or revoke holds) and wait for their range calls in flight; ents[i] the
 * session, with a reference of ours. */
static void put_seal(kvp_client_t *c, const char *const *keys, size_t n, kvp_status_t *results,
                     sess_ent_t **ents)
{
    kvp_xsessions_t *xs = c->xs;
    pthread_mutex_lock(&xs->lock);
    for (size_t i = 0; i < n; i++) {
        results[i] = KVP_ERR_INVALID_ARG;
        ents[i] = NULL;
        if (keys[i] == NULL)
            continue;
        size_t len = strnlen(keys[i], KVP_MAX_KEY_LEN + 1);
        sess_ent_t *e = table_find(&xs->put, keys[i], len, kvp_key_hash(keys[i], len));
        if (e == NULL || e->closing)
            continue;
        e->closing = true;
        e->refs++;
        ents[i] = e;
        results[i] = KVP_OK;
    }
    for (size_t i = 0; i < n; i++)
        while (ents[i] != NULL && ents[i]->refs > 2) /* the table's, ours: none in flight */
            pthread_cond_wait(&xs->idle, &xs->lock);
    pthread_mutex_unlock(&xs->lock);
}

/* After end / revoke: a key whose put is over (drop) leaves its session; the others stay
 * (a retry or a revoke may follow). */
static void put_unseal(kvp_client_t *c, size_t n, sess_ent_t **ents, const bool *drop)
{
    kvp_xsessions_t *xs = c->xs;
    pthread_mutex_lock(&xs->lock);
    for (size_t i = 0; i < n; i++) {
        sess_ent_t *e = ents[i];
        if (e == NULL)
            continue;
        e->closing = false;
        if (drop[i])
            table_unlink(&xs->put, e, NULL, NULL);
        ent_unref(e, NULL, NULL);
    }
    pthread_mutex_unlock(&xs->lock);
}

static kvp_status_t put_end(kvp_client_t *c, const char *const *keys, size_t n,
                            kvp_status_t *results)
{
    if (c == NULL || keys == NULL || results == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    if (n == 0)
        return KVP_OK;
    sess_ent_t **ents = kvp_scratch_alloc(n * sizeof(*ents));
    size_t *idx = kvp_scratch_alloc(n * sizeof(*idx));
    uint32_t *crcs = kvp_scratch_alloc(n * sizeof(*crcs));
    uint32_t *masks = kvp_scratch_alloc(n * sizeof(*masks));
    uint64_t *sizes = kvp_scratch_alloc(n * sizeof(*sizes));
    uint64_t *vers = kvp_scratch_alloc(n * sizeof(*vers));
    bool *drop = kvp_scratch_calloc(n, sizeof(*drop));
    if (ents == NULL || idx == NULL || crcs == NULL || masks == NULL || sizes == NULL ||
        vers == NULL || drop == NULL)
        return KVP_ERR_NOMEM;
    put_seal(c, keys, n, results, ents);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        sess_ent_t *e = ents[i];
        if (e == NULL)
            continue;
        /* the fields are ours: sealed, no range call in flight. No replica left whole: the
         * PutEnd of no replica revokes it (KVP_ERR_IO) */
        iv_compact(e);
        if (e->mask != 0 &&
            (e->crc_lost || e->n_iv != 1 || e->iv[0].off != 0 || e->iv[0].len != e->size)) {
            results[i] = KVP_ERR_INVALID_ARG;
            kvp_api_fail_key(keys[i],
                             "put session %s: %s; write every byte once (or the same range "
                             "again) before the end, or revoke",
                             keys[i],
                             e->crc_lost ? "ranges overlapped, its checksum is not known"
                                         : "some of its bytes were never written");
            continue;
        }
        crcs[m] = e->mask != 0 ? e->iv[0].crc : 0;
        masks[m] = e->mask;
        sizes[m] = e->size;
        vers[m] = e->version;
        idx[m++] = i;
    }
    int32_t *out = kvp_scratch_alloc(n * sizeof(*out));
    if (out == NULL) {
        put_unseal(c, n, ents, drop);
        return KVP_ERR_NOMEM;
    }
    kvp_obj_end_or_revoke(c, KVP_RPC_PUT_END, keys, idx, vers, sizes, crcs, masks, m, out);
    for (size_t j = 0; j < m; j++) {
        size_t i = idx[j];
        results[i] = out[i];
        /* ended, or gone from the master (timed out, or no replica was written: KVP_ERR_IO):
         * nothing to retry */
        drop[i] = out[i] == KVP_OK || out[i] == KVP_ERR_PUT_REVOKED || out[i] == KVP_ERR_IO;
    }
    put_unseal(c, n, ents, drop);
    kvp_api_fail_keys("put_session_end", keys, (const int32_t *)results, n);
    return first_error(results, n);
}

kvp_status_t kvp_batch_put_session_end(kvp_client_t *c, const char *const *keys, size_t n,
                                       kvp_status_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(put_end(c, keys, n, results), "put_session_end");
}

static kvp_status_t put_revoke(kvp_client_t *c, const char *const *keys, size_t n,
                               kvp_status_t *results)
{
    if (c == NULL || keys == NULL || results == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    if (n == 0)
        return KVP_OK;
    sess_ent_t **ents = kvp_scratch_alloc(n * sizeof(*ents));
    size_t *idx = kvp_scratch_alloc(n * sizeof(*idx));
    uint64_t *vers = kvp_scratch_alloc(n * sizeof(*vers));
    bool *drop = kvp_scratch_calloc(n, sizeof(*drop));
    if (ents == NULL || idx == NULL || vers == NULL || drop == NULL)
        return KVP_ERR_NOMEM;
    put_seal(c, keys, n, results, ents);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (ents[i] != NULL) {
            vers[m] = ents[i]->version;
            idx[m++] = i;
        }
    if (m > 0) {
        uint8_t *body;
        size_t rlen;
        kvp_status_t rc = kvp_obj_revoke_call(c, keys, idx, vers, m, &body, &rlen);
        Kvpool__StatusesResponse *sr =
            rc == KVP_OK ? kvpool__statuses_response__unpack(&kvp_scratch_pb, rlen, body) : NULL;
        if (rc == KVP_OK && (sr == NULL || sr->status != KVP_OK || sr->n_statuses != m))
            rc = sr == NULL || sr->status == KVP_OK ? KVP_ERR_PROTOCOL : sr->status;
        for (size_t j = 0; j < m; j++) {
            size_t i = idx[j];
            int32_t s = rc == KVP_OK ? sr->statuses[j] : rc;
            /* the master holds no put of ours under the key any more (it timed out, or the
             * connection that started it closed): nothing is left, as Mooncake's
             * OBJECT_NOT_FOUND */
            if (s == KVP_ERR_NOT_FOUND || s == KVP_ERR_NOT_PENDING || s == KVP_ERR_NOT_OWNER)
                s = KVP_OK;
            results[i] = s;
            drop[i] = s == KVP_OK;
        }
    }
    put_unseal(c, n, ents, drop);
    return first_error(results, n);
}

kvp_status_t kvp_batch_put_session_revoke(kvp_client_t *c, const char *const *keys, size_t n,
                                          kvp_status_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(put_revoke(c, keys, n, results), "put_session_revoke");
}
