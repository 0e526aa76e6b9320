/*
 * object.c - the object flows: put, get, exist, remove, size, stat.
 *
 * Put (batch_put_ex): PutStart -> the master allocates extents (PENDING)
 * -> WRITE every replica through the transfer engine, CRC32C of the source
 * computed on the way -> PutEnd(crc) for keys whose every replica landed,
 * PutRevoke for the others. A key is visible only after PutEnd.
 *
 * Get (read_batch): GetReplicaList -> READ into the caller's buffer
 * from a same-host replica first -> on a transfer error, the next replica
 * -> CRC32C of what arrived compared with the one stored at PutEnd; a
 * mismatch is KVP_ERR_CHECKSUM, never a success with wrong bytes.
 *
 * Both flows are written once over pieces (pieces_t): object i is the concatenation of its
 * pieces, one per object for the plain calls, several for the scatter/gather ones
 * (kvp_batch_put_from_multi, kvp_batch_get_into_multi). Each piece is one transfer op at
 * its running offset in the extent, so scatter/gather is as zero-copy as the plain calls;
 * the ops of one object and replica form a group whose statuses and CRCs are folded in
 * order (kvp_crc32c_combine) into the object's. Ranged reads (kvp_get_into_ranges) are
 * the get flow from an offset, cut at the object's end, with no CRC (it covers whole
 * objects); ranges of one key share its GetReplicaList entry.
 *
 * Replies are unpacked into the calling thread's scratch arena (mem/scratch.h):
 * never freed one by one, given back when the public call returns.
 *
 * Thread: any client thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/api.h"
#include "client/client_priv.h"
#include "client/object_priv.h"
#include "client/mem/gpu.h"
#include "client/mem/scratch.h"
#include "client/put_holds.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/macros.h"
#include "common/clock.h"
#include "common/key.h"
#include "kvpool.pb-c.h"

/* ---------------- helpers for batches ---------------- */

/* Check a batch's keys locally; valid ones are gathered into `idx`. */
static size_t gather_valid(const char *const *keys, size_t n, size_t *idx, int32_t *early)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        early[i] = KVP_OK;
        if (keys[i] == NULL || !kvp_key_valid(keys[i], strnlen(keys[i], KVP_MAX_KEY_LEN + 1))) {
            early[i] = KVP_ERR_BAD_KEY;
            continue;
        }
        idx[m++] = i;
    }
    return m;
}

static kvp_status_t first_error(const int32_t *st, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (st[i] < 0)
            return (kvp_status_t)st[i];
    return KVP_OK;
}

/* Keys as the wire carries them: bytes with a length (pointing into the caller's strings). */
static ProtobufCBinaryData *wire_keys(const char *const *keys, const size_t *idx, size_t m)
{
    ProtobufCBinaryData *kp = kvp_scratch_alloc((m ? m : 1) * sizeof(*kp));
    if (kp == NULL)
        return NULL;
    for (size_t j = 0; j < m; j++) {
        const char *k = idx ? keys[idx[j]] : keys[j];
        kp[j].data = (uint8_t *)k;
        kp[j].len = strlen(k);
    }
    return kp;
}

/* Send a KeysRequest-shaped RPC for keys[idx[0..m)], returning the body. versions (NULL:
 * none): PUT_REVOKE's, the version each key's PutStart answered. */
static kvp_status_t keys_call_versions(kvp_client_t *c, uint16_t method, const char *const *keys,
                                       const size_t *idx, const uint64_t *versions, size_t m,
                                       bool force, uint8_t **resp_p, size_t *rlen_p)
{
    ProtobufCBinaryData *kp = wire_keys(keys, idx, m);
    if (kp == NULL)
        return KVP_ERR_NOMEM;
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = kp;
    req.n_keys = m;
    req.force = force;
    req.versions = (uint64_t *)versions;
    req.n_versions = versions != NULL ? m : 0;
    return kvp_session_call(c->session, method, &req.base, resp_p, rlen_p);
}

static kvp_status_t keys_call(kvp_client_t *c, uint16_t method, const char *const *keys,
                              const size_t *idx, size_t m, bool force, uint8_t **resp_p,
                              size_t *rlen_p)
{
    return keys_call_versions(c, method, keys, idx, NULL, m, force, resp_p, rlen_p);
}

/* A key a PUT_COMMIT or PutEnd sent a second time no longer found PENDING (or held): the
 * first, whose answer went with its broken connection, may have stored it
 * (stored_by_first_send says). */
#define PUT_MAYBE_STORED (-100002)

static void stored_by_first_send(kvp_client_t *c, const char *const *keys, const size_t *idx,
                                 const uint64_t *sizes, const uint32_t *crcs, size_t m,
                                 int32_t *out, uint32_t *replicas_written, int32_t otherwise);

static const char REVOKED_WHY[] = "put %s: the master dropped the unfinished put (it restarted, "
                                  "lost this client's connection, or the segment went away); "
                                  "nothing is stored, retry";

/* PutEnd or PutRevoke for a subset; per-key statuses go to out[idx[j]]. versions[j] (NULL:
 * none): the version key j's PutStart answered, so that only that put is ended (another
 * thread's put of the key on the shared connection is not). PutEnd: sizes[j] and crcs[j]
 * what key j's put wrote. */
static void end_or_revoke(kvp_client_t *c, uint16_t method, const char *const *keys,
                          const size_t *idx, const uint64_t *versions, const uint64_t *sizes,
                          const uint32_t *crcs, const uint32_t *masks, size_t m, int32_t *out)
{
    if (m == 0)
        return;
    uint8_t *resp = NULL;
    size_t rlen = 0;
    kvp_status_t st;
    if (method == KVP_RPC_PUT_END) {
        ProtobufCBinaryData *kp = wire_keys(keys, idx, m);
        if (kp == NULL) {
            st = KVP_ERR_NOMEM;
            goto fail;
        }
        Kvpool__PutEndRequest req = KVPOOL__PUT_END_REQUEST__INIT;
        req.keys = kp;
        req.n_keys = m;
        req.crc32c = (uint32_t *)crcs;
        req.n_crc32c = m;
        req.written_mask = (uint32_t *)masks;
        req.n_written_mask = m;
        req.versions = (uint64_t *)versions;
        req.n_versions = versions != NULL ? m : 0;
        st = kvp_session_call(c->session, method, &req.base, &resp, &rlen);
    } else {
        st = kvp_obj_revoke_call(c, keys, idx, versions, m, &resp, &rlen);
    }
    if (st != KVP_OK)
        goto fail;
    Kvpool__StatusesResponse *sr = kvpool__statuses_response__unpack(&kvp_scratch_pb, rlen, resp);
    if (sr == NULL || sr->status != KVP_OK || sr->n_statuses != m) {
        st = sr == NULL ? KVP_ERR_PROTOCOL : sr->status != KVP_OK ? sr->status : KVP_ERR_PROTOCOL;
        goto fail;
    }
    if (method == KVP_RPC_PUT_END) {
        bool again = kvp_mconn_call_sent_again();
        for (size_t j = 0; j < m; j++) {
            int32_t s = sr->statuses[j];
            /* the master no longer has our PENDING object: it restarted, it revoked
             * the put with a lost connection or a gone segment, or the put timed out
             * (or the first of two sends ended it) */
            if ((s == KVP_ERR_NOT_FOUND || s == KVP_ERR_NOT_PENDING) && again) {
                s = PUT_MAYBE_STORED;
            } else if (s == KVP_ERR_NOT_FOUND || s == KVP_ERR_NOT_PENDING) {
                s = KVP_ERR_PUT_REVOKED;
                kvp_api_fail_key(keys[idx[j]], REVOKED_WHY, keys[idx[j]]);
            }
            out[idx[j]] = s;
        }
        if (again)
            stored_by_first_send(c, keys, idx, sizes, crcs, m, out, NULL, KVP_ERR_PUT_REVOKED);
    }
    return;
fail:
    if (method == KVP_RPC_PUT_END)
        for (size_t j = 0; j < m; j++)
            out[idx[j]] = st;
    /* a failed revoke leaves PENDING objects the master reclaims with our connection */
}

/*
 * Where a batch's object bytes are (a put reads them, a get writes them): object i is the
 * concatenation of its pieces, in order. The single-buffer calls give one buffer per object
 * (`one`), the scatter/gather calls n_bufs[i] buffers (a piece of size 0 is skipped), so
 * neither builds arrays to call the other.
 */
typedef struct pieces {
    const void *const *one; /* one buffer per object, of one_size[i]; NULL: the next three */
    const size_t *one_size;
    const void *const *const *bufs;
    const size_t *const *sizes;
    const size_t *n_bufs;
} pieces_t;

static bool pieces_ok(const pieces_t *p)
{
    return p->one != NULL ? p->one_size != NULL
                          : p->bufs != NULL && p->sizes != NULL && p->n_bufs != NULL;
}

static size_t pieces_n(const pieces_t *p, size_t i)
{
    return p->one != NULL ? 1 : p->n_bufs[i];
}

static void *piece_buf(const pieces_t *p, size_t i, size_t b)
{
    return (void *)(p->one != NULL ? p->one[i] : p->bufs[i][b]);
}

static size_t piece_size(const pieces_t *p, size_t i, size_t b)
{
    return p->one != NULL ? p->one_size[i] : p->sizes[i][b];
}

/* Object i's bytes in *total_p, and how many pieces are not empty in *used_p;
 * KVP_ERR_INVALID_ARG when it has no pieces or a piece has no buffer (an empty one of
 * several may be NULL). */
static kvp_status_t pieces_total(const pieces_t *p, size_t i, uint64_t *total_p, size_t *used_p)
{
    if (p->one == NULL && (p->bufs[i] == NULL || p->sizes[i] == NULL || p->n_bufs[i] == 0))
        return KVP_ERR_INVALID_ARG;
    uint64_t total = 0;
    size_t used = 0;
    for (size_t b = 0; b < pieces_n(p, i); b++) {
        size_t s = piece_size(p, i, b);
        if (piece_buf(p, i, b) == NULL && (s > 0 || p->one != NULL))
            return KVP_ERR_INVALID_ARG;
        total += s;
        used += s > 0;
    }
    *total_p = total;
    *used_p = used;
    return KVP_OK;
}

/* Objects at[0..m) of p, as their own pieces (the busy-pool retries of a put). */
static bool pieces_subset(const pieces_t *p, const size_t *at, size_t m, pieces_t *out)
{
    memset(out, 0, sizeof(*out));
    if (p->one != NULL) {
        const void **one = kvp_scratch_alloc((m ? m : 1) * sizeof(*one));
        size_t *one_size = kvp_scratch_alloc((m ? m : 1) * sizeof(*one_size));
        if (one == NULL || one_size == NULL)
            return false;
        for (size_t j = 0; j < m; j++) {
            one[j] = p->one[at[j]];
            one_size[j] = p->one_size[at[j]];
        }
        out->one = one;
        out->one_size = one_size;
        return true;
    }
    const void *const **bufs = kvp_scratch_alloc((m ? m : 1) * sizeof(*bufs));
    const size_t **sizes = kvp_scratch_alloc((m ? m : 1) * sizeof(*sizes));
    size_t *n_bufs = kvp_scratch_alloc((m ? m : 1) * sizeof(*n_bufs));
    if (bufs == NULL || sizes == NULL || n_bufs == NULL)
        return false;
    for (size_t j = 0; j < m; j++) {
        bufs[j] = p->bufs[at[j]];
        sizes[j] = p->sizes[at[j]];
        n_bufs[j] = p->n_bufs[at[j]];
    }
    out->bufs = bufs;
    out->sizes = sizes;
    out->n_bufs = n_bufs;
    return true;
}

/* Is any piece of object i device memory (its CRC then computed by the staged transfers)? */
/* Find the memory of each of object i's pieces once (mems[b], for the ops of every replica);
 * true when any is device memory. */
static bool pieces_mem(kvp_client_t *c, const pieces_t *p, size_t i, kvp_xfer_mem_t *mems)
{
    bool gpu = false;
    for (size_t b = 0; b < pieces_n(p, i); b++) {
        mems[b].known = false;
        if (piece_size(p, i, b) == 0)
            continue;
        const kvp_mem_region_t *r;
        kvp_mem_kind_t kind =
            kvp_transfer_mem_find(&c->xfer, piece_buf(p, i, b), piece_size(p, i, b), &r);
        mems[b] = (kvp_xfer_mem_t){.region = r, .kind = (uint8_t)kind, .known = true};
        gpu |= kind == KVP_MEM_CUDA;
    }
    return gpu;
}

/* CRC32C of object i's host-memory pieces, in order. */
static uint32_t pieces_crc(const pieces_t *p, size_t i)
{
    uint32_t crc = 0;
    for (size_t b = 0; b < pieces_n(p, i); b++)
        if (piece_size(p, i, b) > 0)
            crc = kvp_crc32c(crc, piece_buf(p, i, b), piece_size(p, i, b));
    return crc;
}

/* rep's grant in an answer with descriptors segs: its own, or its extent of the grant set
 * its segment's descriptor carries (a set whose length disagrees with its count, or an index
 * past it: none, and the owner refuses the request). */
static kvp_xfer_grant_t rep_grant(const Kvpool__Replica *rep, Kvpool__SegmentDesc *const *segs,
                                  size_t n_segs)
{
    kvp_xfer_grant_t g = {.one = KVP_XFER_GRANT(rep->grant)};
    if (g.one != NULL || rep->grant_set == 0 || rep->grant_set > n_segs)
        return g;
    const ProtobufCBinaryData *b = &segs[rep->grant_set - 1]->grant_set;
    if (rep->grant_index >= kvp_grant_set_count(b->data, b->len))
        return g;
    g.set = b->data;
    g.index = rep->grant_index;
    return g;
}

/*
 * Append the ops moving the first `len` bytes of object i's pieces to or from `peer` at
 * `offset` (the extent's, plus where a range starts): one op per piece not empty, at the
 * running offset, all in group `grp_id`, each with its piece's memory from mems (NULL: the
 * engine finds it). The caller's reference on peer goes to the first op; each further op
 * takes its own. Returns the new op count.
 */
static size_t add_piece_ops(kvp_xfer_op_t *ops, size_t *grp, size_t k, size_t grp_id,
                            kvp_xfer_kind_t kind, const pieces_t *p, size_t i, uint64_t offset,
                            uint64_t len, kvp_peer_t *peer, bool want_crc,
                            const kvp_xfer_mem_t *mems, kvp_xfer_grant_t grant)
{
    bool first = true;
    bool stream = len >= KVP_CRC32C_STREAM_MIN; /* each piece copied as the whole would be */
    for (size_t b = 0; b < pieces_n(p, i) && len > 0; b++) {
        uint64_t s = KVP_MIN((uint64_t)piece_size(p, i, b), len);
        if (s == 0)
            continue;
        if (!first)
            kvp_peer_ref(peer);
        first = false;
        ops[k] = (kvp_xfer_op_t){.kind = kind,
                                 .local = piece_buf(p, i, b),
                                 .offset = offset,
                                 .length = s,
                                 .peer = peer,
                                 .want_crc = want_crc,
                                 .stream = stream,
                                 .mem = mems != NULL ? mems[b] : (kvp_xfer_mem_t){0},
                                 .grant = grant.one,
                                 .grant_set = grant.set,
                                 .grant_index = grant.index};
        grp[k++] = grp_id;
        offset += s;
        len -= s;
    }
    if (first)
        kvp_peer_unref(peer);
    return k;
}

/*
 * The ops [q, end) of one group (one object to or from one replica, a piece each), run:
 * *st_p their first failure (KVP_OK: all moved), *crc_p the CRC of the whole in piece order
 * (when they wanted one). Returns end.
 */
static size_t fold_ops(const kvp_xfer_op_t *ops, const size_t *grp, size_t q, size_t k,
                       kvp_status_t *st_p, uint32_t *crc_p)
{
    kvp_status_t st = KVP_OK;
    uint32_t crc = ops[q].crc;
    size_t e = q;
    for (; e < k && grp[e] == grp[q]; e++) {
        if (st == KVP_OK)
            st = ops[e].status;
        if (e > q)
            crc = kvp_crc32c_combine(crc, ops[e].crc, ops[e].length);
    }
    *st_p = st;
    *crc_p = crc;
    return e;
}

static void unref_ops(kvp_xfer_op_t *ops, size_t q, size_t e)
{
    for (; q < e; q++)
        kvp_peer_unref(ops[q].peer);
}

/* ---------------- put ---------------- */

static kvp_status_t batch_put_ex(kvp_client_t *c, const char *const *keys, const pieces_t *src,
                                 size_t n, const kvp_put_config_t *config, kvp_status_t *results,
                                 uint32_t *replicas_written);

kvp_status_t kvp_batch_put_from(kvp_client_t *c, const char *const *keys, const void *const *bufs,
                                const size_t *sizes, size_t n, const kvp_put_config_t *config,
                                kvp_status_t *results)
{
    kvp_api_enter();
    pieces_t src = {.one = bufs, .one_size = sizes};
    return (kvp_status_t)kvp_api_leave(batch_put_ex(c, keys, &src, n, config, results, NULL),
                                       "put");
}

/* Replicas per object, at most (PutStart answers more: a protocol error). */
#define REPLICAS_MAX 8

/* One put attempt's state, from the thread's scratch arena: the keys that start (idx[0..m),
 * their sizes and wire keys), the master's answer, and the writes planned from it. */
typedef struct put_batch {
    kvp_client_t *c;
    const char *const *keys;
    const char *const *groups; /* [n] the config's group_ids, or NULL */
    const pieces_t *src;
    int32_t *st;   /* [n] per key */
    size_t *idx;   /* [m] the key of each started slot */
    uint64_t *szs; /* [m] its size */
    size_t *used;  /* [m] how many of its pieces hold bytes */
    ProtobufCBinaryData *kp;
    ProtobufCBinaryData *gp; /* [m] their group ids (config's group_ids; NULL: none) */
    size_t m;
    Kvpool__PutStartResponse *sr;
    kvp_xfer_op_t *ops; /* [k] one per replica and piece; NULL: none could be made */
    size_t *op_grp;     /* key j's replica q: group j * REPLICAS_MAX + q */
    size_t k;
    uint32_t *crcs;       /* [m] the CRC of each key's bytes */
    uint32_t *masks;      /* [m] bit q: replica q written */
    kvp_xfer_mem_t *mems; /* the current key's pieces' memory (room for any key's pieces) */
    kvp_hold_t *holds;    /* [m] each key's hold (the batch is held: no PutStart); NULL: none */
    uint64_t fp, gen;     /* the holds' placement fingerprint and master connection */
    bool commit;          /* ends with PUT_COMMIT (which asks for holds), not PutEnd */
    bool shun;            /* a put again after a write timed out: no write to a suspect */
    bool *timed;          /* [m] a write of key j timed out; NULL: none did */
} put_batch_t;

/* Is key i (len bytes) named by a key gathered before it (slots: an open table of nslots,
 * a power of two, of gathered index + 1; NULL: no room, not checked)? If not, it is noted. */
static bool put_seen(put_batch_t *b, size_t *slots, size_t nslots, size_t i, size_t len)
{
    if (slots == NULL)
        return false;
    for (size_t s = kvp_key_hash(b->keys[i], len) & (nslots - 1);; s = (s + 1) & (nslots - 1)) {
        if (slots[s] == 0) {
            slots[s] = i + 1;
            return false;
        }
        const char *k = b->keys[slots[s] - 1];
        if (strncmp(k, b->keys[i], len) == 0 && k[len] == '\0')
            return true;
    }
}

/* The keys that can start: a valid key whose pieces hold bytes; the rest get their status.
 * A key named again in the batch is put once, by its first such entry: the others answer
 * KVP_ERR_PENDING (its put is under way) and write nothing, as PutStart answers them, so a
 * batch put on held room and one that is not end alike. */
static void put_gather(put_batch_t *b, size_t n)
{
    size_t m = gather_valid(b->keys, n, b->idx, b->st);
    size_t mm = 0, nslots = 2;
    while (nslots < 2 * m)
        nslots *= 2;
    size_t *slots = m > 1 ? kvp_scratch_alloc(nslots * sizeof(*slots)) : NULL;
    if (slots != NULL)
        memset(slots, 0, nslots * sizeof(*slots));
    for (size_t j = 0; j < m; j++) {
        size_t i = b->idx[j];
        uint64_t total = 0;
        if (pieces_total(b->src, i, &total, &b->used[mm]) != KVP_OK || total == 0) {
            b->st[i] = KVP_ERR_INVALID_ARG;
            continue;
        }
        size_t len = strlen(b->keys[i]);
        if (put_seen(b, slots, nslots, i, len)) {
            b->st[i] = KVP_ERR_PENDING;
            continue;
        }
        b->idx[mm] = i;
        b->kp[mm].data = (uint8_t *)b->keys[i];
        b->kp[mm].len = len;
        if (b->gp != NULL) {
            b->gp[mm].data = (uint8_t *)b->groups[i];
            b->gp[mm].len = strlen(b->groups[i]);
        }
        b->szs[mm] = total;
        mm++;
    }
    b->m = mm;
}

/* The PutConfig of cfg on the wire (strings borrowed from cfg; avoid: room for
 * KVP_PEERS_SUSPECTS segment ids, the caller's). */
void kvp_obj_put_config_wire(kvp_client_t *c, const kvp_put_config_t *cfg, Kvpool__PutConfig *pc,
                             uint64_t *avoid)
{
    Kvpool__PutConfig init = KVPOOL__PUT_CONFIG__INIT;
    *pc = init;
    pc->replica_num = cfg->replica_num;
    pc->pin = cfg->pin;
    pc->soft_pin_ttl_s = cfg->soft_pin_ttl_s;
    pc->upsert = cfg->mode == KVP_PUT_UPSERT;
    pc->medium = cfg->medium != NULL ? (char *)cfg->medium : "";
    pc->dfs_replica_num =
        cfg->size >= offsetof(kvp_put_config_t, dfs_replica_num) + sizeof(uint32_t)
            ? cfg->dfs_replica_num
            : 0;
    pc->preferred_segment = "";
    if (cfg->preferred_segment != NULL) {
        if (strcmp(cfg->preferred_segment, KVP_SEGMENT_LOCAL) == 0)
            pc->preferred_segment = c->seg ? (char *)kvp_segment_name(c->seg) : "";
        else
            pc->preferred_segment = (char *)cfg->preferred_segment;
    }
    pc->preferred_segments = (char **)cfg->preferred_segments;
    pc->n_preferred_segments = cfg->preferred_segments != NULL ? cfg->n_preferred_segments : 0;
    /* segments we failed to reach lately: the master places elsewhere while it can */
    pc->n_avoid_segments = kvp_peers_suspects(&c->peers, kvp_now_ms(), avoid, KVP_PEERS_SUSPECTS);
    pc->avoid_segments = avoid;
}

/* PutStart for the gathered keys; b->sr the answer (its segments learnt). */
static kvp_status_t put_start(put_batch_t *b, const kvp_put_config_t *cfg)
{
    kvp_client_t *c = b->c;
    Kvpool__PutConfig pc = KVPOOL__PUT_CONFIG__INIT;
    uint64_t avoid[KVP_PEERS_SUSPECTS];
    kvp_obj_put_config_wire(c, cfg, &pc, avoid);
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    req.keys = b->kp;
    req.n_keys = b->m;
    req.sizes = b->szs;
    req.n_sizes = b->m;
    req.config = &pc;
    req.group_ids = b->gp;
    req.n_group_ids = b->gp != NULL ? b->m : 0;
    uint8_t *resp;
    size_t rlen;
    kvp_status_t rc = kvp_session_call(c->session, KVP_RPC_PUT_START, &req.base, &resp, &rlen);
    if (rc != KVP_OK)
        return rc;
    Kvpool__PutStartResponse *sr = kvpool__put_start_response__unpack(&kvp_scratch_pb, rlen, resp);
    b->sr = sr;
    if (sr == NULL || sr->status != KVP_OK || sr->n_results != b->m)
        return sr == NULL || sr->status == KVP_OK ? KVP_ERR_PROTOCOL : sr->status;
    kvp_peers_update(&c->peers, sr->segments, sr->n_segments);
    if (sr->message != NULL && sr->message[0] != '\0') {
        bool full = false;
        for (size_t j = 0; j < b->m; j++)
            full |= sr->results[j]->status == KVP_ERR_POOL_FULL ||
                    sr->results[j]->status == KVP_ERR_QUOTA ||
                    sr->results[j]->status == KVP_ERR_TOO_LARGE ||
                    sr->results[j]->status == KVP_ERR_UNSUPPORTED; /* no DFS segment */
        if (full) {
            KVP_LOG_WARN("put: %s", sr->message);
            kvp_api_fail("put: %s", sr->message);
        } else
            KVP_LOG_DEBUG("put: waiting for reads in flight: %s", sr->message);
    }
    return KVP_OK;
}

/* ---------------- a put in one round trip: holds (put_holds.h) ---------------- */

#define COMMIT_KEYS_MAX 1024 /* keys one PUT_COMMIT may name (the master's bound) */
/* A key's status inside a put: its hold was gone at the master (a restart, a closed
 * connection, its put timeout); batch_put_ex puts it again, and a caller never sees it. */
#define PUT_HOLD_GONE (-100000)
/* A held key whose write timed out: batch_put_ex puts it again once, placed anew, and
 * writes no replica to a segment a transfer failed on lately (so the call waits out no
 * second timeout); a caller never sees it. */
#define PUT_TIMED_OUT (-100001)

/* The placement a batch's holds are for, as one number. */
static uint64_t put_fp(const Kvpool__PutConfig *pc)
{
    uint64_t h = 1469598103934665603ull;
#define FP_MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    FP_MIX(pc->replica_num);
    for (const char *p = pc->preferred_segment; p != NULL && *p != '\0'; p++)
        FP_MIX((unsigned char)*p);
    for (size_t i = 0; i < pc->n_preferred_segments; i++) {
        FP_MIX(0x100 + i);
        for (const char *p = pc->preferred_segments[i]; p != NULL && *p != '\0'; p++)
            FP_MIX((unsigned char)*p);
    }
#undef FP_MIX
    return h;
}

/* A hold is used only while the master connection that got it answered within this long:
 * a master that died (its holds gone with it) may be replaced and a new one place other
 * objects in their extents once the owners have mounted again, which takes longer; a client
 * that heard nothing that recently puts the two-call way (PutStart asks afresh). */
#define HOLD_FRESH_MS 200

/* The master connection's generation (holds are bound to the connection they came on);
 * *fresh_p (may be NULL): it answered within HOLD_FRESH_MS. */
static uint64_t conn_gen(kvp_client_t *c, bool *fresh_p)
{
    uint64_t gen;
    bool fresh = kvp_mconn_fresh(kvp_session_mconn(c->session), HOLD_FRESH_MS, &gen);
    if (fresh_p != NULL)
        *fresh_p = fresh;
    return gen;
}

/* Does a batch of m keys end with PUT_COMMIT (and so hold room ahead)? DRAM puts with no
 * DFS replica, of at most COMMIT_KEYS_MAX keys, while this client holds room at all. */
static bool put_commits(kvp_client_t *c, const kvp_put_config_t *cfg, size_t m)
{
    bool dfs = cfg->size >= offsetof(kvp_put_config_t, dfs_replica_num) + sizeof(uint32_t) &&
               cfg->dfs_replica_num > 0;
    return m <= COMMIT_KEYS_MAX && !dfs &&
           (cfg->medium == NULL || cfg->medium[0] == '\0' || strcmp(cfg->medium, "dram") == 0) &&
           kvp_holds_on(c->holds);
}

/* Each key a hold of its size, or none: true and b->sr the answer a PutStart would have
 * given (each key's extents the hold's, with its grants), with no master call. */
static bool put_hold_take(put_batch_t *b)
{
    size_t m = b->m;
    b->holds = kvp_scratch_alloc(m * sizeof(*b->holds));
    if (b->holds == NULL || !kvp_holds_take(b->c->holds, b->fp, b->gen, b->szs, m, b->holds)) {
        b->holds = NULL;
        return false;
    }
    /* (from here the batch's holds are let go of in put_finish, after its commit) */
    size_t nrep = 0;
    for (size_t j = 0; j < m; j++)
        nrep += b->holds[j].n_replicas;
    Kvpool__PutStartResponse *sr = kvp_scratch_alloc(sizeof(*sr));
    Kvpool__PutStartResult *res = kvp_scratch_alloc(m * sizeof(*res));
    Kvpool__PutStartResult **rp = kvp_scratch_alloc(m * sizeof(*rp));
    Kvpool__Replica *reps = kvp_scratch_alloc(nrep * sizeof(*reps));
    Kvpool__Replica **pp = kvp_scratch_alloc(nrep * sizeof(*pp));
    if (!sr || !res || !rp || !reps || !pp) {
        kvp_holds_put_back(b->c->holds, b->fp, b->gen, b->holds, m);
        kvp_holds_release(b->holds, m);
        b->holds = NULL;
        return false;
    }
    kvpool__put_start_response__init(sr);
    size_t k = 0;
    for (size_t j = 0; j < m; j++) {
        kvp_hold_t *h = &b->holds[j];
        kvpool__put_start_result__init(&res[j]);
        res[j].status = KVP_OK;
        res[j].replicas = &pp[k];
        res[j].n_replicas = h->n_replicas;
        for (uint32_t q = 0; q < h->n_replicas; q++, k++) {
            kvpool__replica__init(&reps[k]);
            reps[k].segment_id = h->reps[q].segment_id;
            reps[k].offset = h->reps[q].offset;
            reps[k].length = h->size; /* (its write grant: hold_grant) */
            pp[k] = &reps[k];
        }
        rp[j] = &res[j];
    }
    sr->results = rp;
    sr->n_results = m;
    b->sr = sr;
    return true;
}

/* Replica q of hold h's write grant: its own, or its extent of the set it keeps. */
static kvp_xfer_grant_t hold_grant(const kvp_hold_t *h, size_t q)
{
    if (h->reps[q].set != NULL)
        return (kvp_xfer_grant_t){.set = h->reps[q].set->data, .index = h->reps[q].set_index};
    return (kvp_xfer_grant_t){.one = h->reps[q].grant_len ? h->reps[q].grant : NULL};
}

/* One op per replica and piece (each piece lands at its running offset in the extent); each
 * key's status from PutStart. KVP_ERR_NOMEM: no ops (b->ops NULL; what PutStart reserved is
 * revoked by put_finish). */
static kvp_status_t put_plan(put_batch_t *b)
{
    const Kvpool__PutStartResponse *sr = b->sr;
    size_t n_ops = 0;
    for (size_t j = 0; j < b->m; j++)
        if (sr->results[j]->status == KVP_OK)
            n_ops += sr->results[j]->n_replicas * b->used[j];
    b->ops = kvp_scratch_calloc(n_ops + 1, sizeof(*b->ops));
    b->op_grp = kvp_scratch_alloc((n_ops + 1) * sizeof(*b->op_grp));
    b->crcs = kvp_scratch_alloc(b->m * sizeof(*b->crcs));
    b->masks = kvp_scratch_calloc(b->m + 1, sizeof(*b->masks));
    size_t max_pieces = 1;
    for (size_t j = 0; j < b->m; j++)
        max_pieces = KVP_MAX(max_pieces, pieces_n(b->src, b->idx[j]));
    b->mems = kvp_scratch_alloc(max_pieces * sizeof(*b->mems));
    kvp_status_t rc = KVP_OK;
    if (!b->ops || !b->op_grp || !b->crcs || !b->masks || !b->mems) {
        rc = KVP_ERR_NOMEM;
        b->ops = NULL;
    }
    b->k = 0;
    uint64_t now = b->shun ? kvp_now_ms() : 0;
    for (size_t j = 0; j < b->m; j++) {
        const Kvpool__PutStartResult *r = sr->results[j];
        size_t i = b->idx[j];
        b->st[i] = r->status;
        if (r->status != KVP_OK || b->ops == NULL)
            continue;
        if (r->n_replicas == 0 || r->n_replicas > REPLICAS_MAX) {
            b->st[i] = KVP_ERR_PROTOCOL;
            continue;
        }
        /* each piece's memory, found once for every replica's ops; device memory: the CPU
         * cannot checksum it afterwards, so every replica's staged transfer computes the CRC
         * on the way */
        bool gpu = pieces_mem(b->c, b->src, i, b->mems);
        size_t planned = 0;
        bool shunned = false;
        for (size_t q = 0; q < r->n_replicas; q++) {
            kvp_peer_t *peer = kvp_peers_get(&b->c->peers, r->replicas[q]->segment_id);
            if (peer == NULL)
                continue; /* an unknown segment: that replica is not written */
            if (b->shun && kvp_peers_failed_lately(peer, now)) {
                shunned = true; /* placed again where a write timed out: not written */
                kvp_peer_unref(peer);
                continue;
            }
            planned++;
            kvp_xfer_grant_t g = b->holds != NULL
                                     ? hold_grant(&b->holds[j], q)
                                     : rep_grant(r->replicas[q], sr->segments, sr->n_segments);
            b->k = add_piece_ops(b->ops, b->op_grp, b->k, j * REPLICAS_MAX + q, KVP_XFER_WRITE,
                                 b->src, i, r->replicas[q]->offset, b->szs[j], peer, q == 0 || gpu,
                                 b->mems, g);
        }
        /* placed again only where its writes timed out (the master had no other room):
         * it keeps that failure (its message noted then), revoked by put_finish */
        if (planned == 0 && shunned && b->ops != NULL)
            b->st[i] = r->n_replicas > 1 ? KVP_ERR_NO_REPLICA : KVP_ERR_TIMEOUT;
    }
    return rc;
}

/* The planned writes' outcome: a key is stored if any replica was written (its bit in
 * masks, its CRC in crcs); one with none gets the last failure. */
static void put_collect(put_batch_t *b)
{
    const char *const *keys = b->keys;
    int32_t *fail = kvp_scratch_alloc(b->m * sizeof(*fail));
    for (size_t j = 0; fail != NULL && j < b->m; j++)
        fail[j] = KVP_ERR_UNKNOWN_SEGMENT; /* stays so when no replica had a known peer */
    bool *have_crc = kvp_scratch_calloc(b->m + 1, sizeof(*have_crc));
    for (size_t q = 0; q < b->k;) {
        size_t j = b->op_grp[q] / REPLICAS_MAX;
        kvp_status_t s;
        uint32_t crc;
        size_t end = fold_ops(b->ops, b->op_grp, q, b->k, &s, &crc);
        if (s == KVP_OK) {
            b->masks[j] |= 1u << (b->op_grp[q] % REPLICAS_MAX);
            if (b->ops[q].want_crc && have_crc != NULL) {
                b->crcs[j] = crc;
                have_crc[j] = true;
            }
        } else {
            if (fail != NULL)
                fail[j] = s;
            if (s == KVP_ERR_TIMEOUT) {
                if (b->timed == NULL)
                    b->timed = kvp_scratch_calloc(b->m, sizeof(*b->timed));
                if (b->timed != NULL)
                    b->timed[j] = true;
            }
            const char *key = keys[b->idx[j]], *seg = b->ops[q].peer->name;
            KVP_LOG_WARN_LIMITED("put %s: write to segment %s failed: %s", key, seg,
                                 kvp_strerror(s));
            kvp_api_fail_key(key, "put %s: write to segment %s failed: %s", key, seg,
                             kvp_strerror(s));
            kvp_peers_suspect(&b->c->peers, b->ops[q].peer);
            kvp_holds_drop_segment(b->c->holds, b->ops[q].peer->segment_id);
        }
        unref_ops(b->ops, q, end);
        q = end;
    }
    for (size_t j = 0; j < b->m; j++) {
        size_t i = b->idx[j];
        if (b->st[i] != KVP_OK)
            continue;
        if (b->masks[j] == 0) {
            b->st[i] = fail != NULL ? fail[j] : KVP_ERR_NOMEM;
            if (b->st[i] == KVP_ERR_UNKNOWN_SEGMENT)
                kvp_api_fail_key(keys[i],
                                 "put %s: the master placed it only on segments this client "
                                 "has no descriptor for",
                                 keys[i]);
            else if (b->sr->results[j]->n_replicas > 1 && fail != NULL)
                b->st[i] = KVP_ERR_NO_REPLICA; /* every copy failed (why: logged) */
        } else if (have_crc == NULL || !have_crc[j]) {
            /* the replica that computed the CRC on the way failed: compute it here
             * (host memory only: device buffers had every replica compute it) */
            b->crcs[j] = pieces_crc(b->src, i);
        }
    }
}

/* A PUT_COMMIT's answer for key j of the batch (e: its place in the request). */
static void commit_status(put_batch_t *b, size_t j, int32_t s, bool again,
                          uint32_t *replicas_written, kvp_hold_t *back, size_t *nb)
{
    size_t i = b->idx[j];
    const char *key = b->keys[i];
    /* sent twice (the first answer lost with its connection) and the key's hold or PENDING
     * put no longer there: the first may have stored it (stored_by_first_send) */
    if (again && b->st[i] == KVP_OK &&
        (s == KVP_ERR_NOT_FOUND || (b->holds == NULL && s == KVP_ERR_NOT_PENDING))) {
        b->st[i] = PUT_MAYBE_STORED;
        return;
    }
    if (b->holds != NULL) {
        /* unwritten, a write of it timed out (the master freed its hold: IO): put again
         * once, on no segment that failed lately (PUT_TIMED_OUT), so the call waits out no
         * second timeout on the same silent owner(s) */
        if (b->st[i] != KVP_OK && b->timed != NULL && b->timed[j] && s != KVP_ERR_NOT_FOUND) {
            b->st[i] = PUT_TIMED_OUT;
            return;
        }
        /* its hold gone at the master, or its write failed otherwise (the master freed the
         * hold: IO), as after a master restart whose new segment ids the held extents
         * predate: put again, placed anew the two-call way (batch_put_ex), once */
        if (b->st[i] != KVP_OK || s == KVP_ERR_NOT_FOUND) {
            b->st[i] = PUT_HOLD_GONE;
            return;
        }
        /* the key refused (EXISTS, PENDING, QUOTA, a bad key or group): the hold is still
         * ours. Not after IO: the master took the hold for the key and then found no
         * replica written that it still had (its segment went meanwhile), so the hold is
         * gone and its room free, maybe another object's already */
        if (s != KVP_OK && s != KVP_ERR_IO && back != NULL)
            back[(*nb)++] = b->holds[j];
    } else if (s == KVP_ERR_NOT_FOUND || s == KVP_ERR_NOT_PENDING) {
        s = KVP_ERR_PUT_REVOKED;
        kvp_api_fail_key(key, REVOKED_WHY, key);
    }
    b->st[i] = s;
    if (s == KVP_OK && replicas_written != NULL)
        replicas_written[i] = (uint32_t)__builtin_popcount(b->masks[j]);
}

/* The request's keys: each started key of the batch (a held one whatever its writes did:
 * an unwritten one frees its hold), into pos[]; the classic keys not written into rev[]. */
static size_t commit_keys(put_batch_t *b, Kvpool__PutCommitRequest *req, size_t *pos, size_t *rev,
                          uint64_t *rev_ver, size_t *nr)
{
    size_t ne = 0;
    *nr = 0;
    for (size_t j = 0; j < b->m; j++) {
        size_t i = b->idx[j];
        if (b->sr->results[j]->status != KVP_OK)
            continue;
        bool ok = b->st[i] == KVP_OK && b->ops != NULL;
        uint64_t version = b->holds == NULL ? b->sr->results[j]->version : 0;
        if (b->holds == NULL && !ok) {
            rev_ver[*nr] = version;
            rev[(*nr)++] = i;
            continue;
        }
        pos[ne] = j;
        req->keys[ne] = b->kp[j];
        req->versions[ne] = version; /* (a held key's: none, its hold names it) */
        req->holds[ne] = b->holds != NULL ? b->holds[j].id : 0;
        req->crc32c[ne] = ok ? b->crcs[j] : 0;
        req->written_mask[ne] = ok ? b->masks[j] : 0;
        req->sizes[ne] = b->szs[j];
        if (b->gp != NULL)
            req->group_ids[ne] = b->gp[j];
        ne++;
    }
    req->n_keys = req->n_holds = req->n_crc32c = req->n_written_mask = req->n_sizes = ne;
    req->n_versions = b->holds == NULL ? ne : 0; /* (held keys: their holds name them) */
    req->n_group_ids = b->gp != NULL ? ne : 0;
    return ne;
}

/*
 * End the batch with PUT_COMMIT: every started key (held, or PutStart's) and the holds for
 * the next batch like this one, in one call; classic keys not written are revoked as ever.
 * false: the master does not know PUT_COMMIT (a batch not held ends the classic way, and
 * this client asks no more).
 */
static bool put_commit(put_batch_t *b, const kvp_put_config_t *cfg, uint32_t *replicas_written)
{
    kvp_client_t *c = b->c;
    size_t m = b->m;
    Kvpool__PutCommitRequest req = KVPOOL__PUT_COMMIT_REQUEST__INIT;
    size_t *pos = kvp_scratch_alloc(m * sizeof(*pos)), *rev = kvp_scratch_alloc(m * sizeof(*rev));
    req.keys = kvp_scratch_alloc(m * sizeof(*req.keys));
    req.holds = kvp_scratch_alloc(m * sizeof(*req.holds));
    req.crc32c = kvp_scratch_alloc(m * sizeof(*req.crc32c));
    req.written_mask = kvp_scratch_alloc(m * sizeof(*req.written_mask));
    req.sizes = kvp_scratch_alloc(m * sizeof(*req.sizes));
    req.versions = kvp_scratch_alloc(m * sizeof(*req.versions));
    uint64_t *rev_ver = kvp_scratch_alloc(m * sizeof(*rev_ver));
    req.group_ids = b->gp != NULL ? kvp_scratch_alloc(m * sizeof(*req.group_ids)) : NULL;
    kvp_hold_t *back = b->holds != NULL ? kvp_scratch_alloc(m * sizeof(*back)) : NULL;
    if (!pos || !rev || !req.keys || !req.holds || !req.crc32c || !req.written_mask || !req.sizes ||
        !req.versions || !rev_ver || (b->gp != NULL && !req.group_ids) ||
        (b->holds != NULL && !back)) {
        if (b->holds == NULL)
            return false;              /* (put_finish ends it the classic way) */
        for (size_t j = 0; j < m; j++) /* never committed: none of them is stored */
            if (b->st[b->idx[j]] == KVP_OK)
                b->st[b->idx[j]] = KVP_ERR_NOMEM;
        return true; /* (what it held comes back at the put timeout) */
    }
    size_t nr, ne = commit_keys(b, &req, pos, rev, rev_ver, &nr);
    Kvpool__PutConfig pc;
    uint64_t avoid[KVP_PEERS_SUSPECTS];
    kvp_obj_put_config_wire(c, cfg, &pc, avoid);
    req.config = &pc;
    /* the next batch's holds: as many of this one's size as it had keys of it */
    Kvpool__HoldRequest hr = KVPOOL__HOLD_REQUEST__INIT;
    size_t used = 0;
    for (size_t j = 0; j < m; j++)
        used += b->szs[j] == b->szs[0];
    hr.size = b->szs[0];
    hr.count = kvp_holds_want(c->holds, b->fp, hr.size, used);
    hr.config = &pc;
    if (hr.count > 0)
        req.hold = &hr;
    uint64_t gone[64]; /* holds dropped unwritten: given back */
    uint64_t gen = conn_gen(c, NULL);
    req.release = gone;
    req.n_release = kvp_holds_gone(c->holds, gen, gone, KVP_ARRAY_SIZE(gone));
    uint8_t *resp = NULL;
    size_t rlen = 0;
    kvp_status_t rc = kvp_session_call(c->session, KVP_RPC_PUT_COMMIT, &req.base, &resp, &rlen);
    if (rc == KVP_ERR_UNKNOWN_METHOD && b->holds == NULL) {
        KVP_LOG_INFO("the master does not know PUT_COMMIT: every put makes two calls");
        kvp_holds_off(c->holds);
        return false;
    }
    Kvpool__PutCommitResponse *cr =
        rc == KVP_OK ? kvpool__put_commit_response__unpack(&kvp_scratch_pb, rlen, resp) : NULL;
    if (rc == KVP_OK && (cr == NULL || cr->status != KVP_OK || cr->n_statuses != ne))
        rc = cr == NULL || cr->status == KVP_OK ? KVP_ERR_PROTOCOL : cr->status;
    size_t nb = 0;
    bool again = rc == KVP_OK && kvp_mconn_call_sent_again();
    for (size_t e = 0; e < ne; e++)
        commit_status(b, pos[e], rc == KVP_OK ? cr->statuses[e] : rc, again, replicas_written,
                      rc == KVP_OK ? back : NULL, &nb);
    if (rc == KVP_OK) {
        kvp_peers_update(&c->peers, cr->segments, cr->n_segments);
        if (conn_gen(c, NULL) == gen) /* (else they may be a closed connection's) */
            kvp_holds_add(c->holds, b->fp, gen, cr->holds, cr->n_holds, cr->segments,
                          cr->n_segments, cr->put_timeout_ms);
        if (cr->n_holds < hr.count && cr->message != NULL && cr->message[0] != '\0')
            KVP_LOG_DEBUG("put: %zu of %u holds: %s", cr->n_holds, hr.count, cr->message);
        kvp_holds_put_back(c->holds, b->fp, b->gen, back, nb);
    }
    end_or_revoke(c, KVP_RPC_PUT_REVOKE, b->keys, rev, rev_ver, NULL, NULL, NULL, nr, b->st);
    if (again) /* (after the answer's last use: this call takes the thread's reply buffer) */
        stored_by_first_send(c, b->keys, b->idx, b->szs, b->crcs, m, b->st, replicas_written,
                             b->holds != NULL ? PUT_HOLD_GONE : KVP_ERR_PUT_REVOKED);
    return true;
}

/* PutEnd for keys fully written, PutRevoke for the rest of what started (or PUT_COMMIT). */
static void put_finish(put_batch_t *b, const kvp_put_config_t *cfg, uint32_t *replicas_written)
{
    if (b->commit && put_commit(b, cfg, replicas_written)) {
        kvp_holds_release(b->holds, b->m); /* (their writes are over; kept ones referenced) */
        return;
    }
    size_t m = b->m;
    size_t *end_idx = kvp_scratch_alloc(m * sizeof(*end_idx));
    size_t *rev_idx = kvp_scratch_alloc(m * sizeof(*rev_idx));
    uint32_t *end_crc = kvp_scratch_alloc(m * sizeof(*end_crc));
    uint32_t *end_mask = kvp_scratch_alloc(m * sizeof(*end_mask));
    uint64_t *end_size = kvp_scratch_alloc(m * sizeof(*end_size));
    uint64_t *end_ver = kvp_scratch_alloc(m * sizeof(*end_ver));
    uint64_t *rev_ver = kvp_scratch_alloc(m * sizeof(*rev_ver));
    if (!end_idx || !rev_idx || !end_crc || !end_mask || !end_size || !end_ver || !rev_ver) {
        for (size_t j = 0; j < m; j++)
            if (b->st[b->idx[j]] == KVP_OK)
                b->st[b->idx[j]] = KVP_ERR_NOMEM;
        /* unfinished PENDING objects are reclaimed when they time out or we disconnect */
        return;
    }
    size_t ne = 0, nr = 0;
    for (size_t j = 0; j < m; j++) {
        size_t i = b->idx[j];
        if (b->sr->results[j]->status != KVP_OK)
            continue;
        if (b->st[i] == KVP_OK && b->ops != NULL) {
            end_idx[ne] = i;
            end_mask[ne] = b->masks[j];
            end_size[ne] = b->szs[j];
            end_ver[ne] = b->sr->results[j]->version;
            if (replicas_written != NULL)
                replicas_written[i] = (uint32_t)__builtin_popcount(b->masks[j]);
            end_crc[ne++] = b->crcs[j];
        } else {
            rev_ver[nr] = b->sr->results[j]->version;
            rev_idx[nr++] = i;
        }
    }
    end_or_revoke(b->c, KVP_RPC_PUT_END, b->keys, end_idx, end_ver, end_size, end_crc, end_mask, ne,
                  b->st);
    end_or_revoke(b->c, KVP_RPC_PUT_REVOKE, b->keys, rev_idx, rev_ver, NULL, NULL, NULL, nr, b->st);
}

void kvp_put_config_init(kvp_put_config_t *c)
{
    memset(c, 0, sizeof(*c));
    c->size = sizeof(*c);
    c->replica_num = 1;
}

/* The put config, defaults filled, checked. */
static kvp_status_t put_config(const kvp_put_config_t *config, kvp_put_config_t *cfg)
{
    kvp_put_config_init(cfg);
    if (config != NULL)
        memcpy(cfg, config, KVP_MIN(config->size, sizeof(*cfg)));
    if (cfg->replica_num == 0 || cfg->replica_num > REPLICAS_MAX || cfg->pin > KVP_PIN_HARD ||
        cfg->mode > KVP_PUT_UPSERT || cfg->n_preferred_segments > 8)
        return KVP_ERR_INVALID_ARG;
    for (size_t i = 0; cfg->preferred_segments != NULL && i < cfg->n_preferred_segments; i++)
        if (cfg->preferred_segments[i] == NULL)
            return KVP_ERR_INVALID_ARG;
    return KVP_OK;
}

/* The config's group ids, one per key, each a string of at most KVP_GROUP_ID_MAX bytes. */
static kvp_status_t groups_check(const kvp_put_config_t *cfg, size_t n)
{
    if (cfg->group_ids == NULL)
        return KVP_OK;
    if (cfg->n_group_ids != n) {
        kvp_api_fail("put: %zu group_ids for %zu keys: one per key", cfg->n_group_ids, n);
        return KVP_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n; i++)
        if (cfg->group_ids[i] == NULL || strlen(cfg->group_ids[i]) > KVP_GROUP_ID_MAX) {
            kvp_api_fail("put: group_ids[%zu] is %s", i,
                         cfg->group_ids[i] == NULL ? "NULL" : "longer than 1024 bytes");
            return KVP_ERR_INVALID_ARG;
        }
    return KVP_OK;
}

/* One put attempt: gather, PutStart, write every replica, PutEnd / PutRevoke. */
static kvp_status_t put_batch_once_body(kvp_client_t *c, const char *const *keys,
                                        const pieces_t *src, size_t n,
                                        const kvp_put_config_t *config, kvp_status_t *results,
                                        uint32_t *replicas_written, kvp_status_t again)
{
    if (c == NULL || keys == NULL || !pieces_ok(src) || results == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    if (n == 0)
        return KVP_OK;
    kvp_put_config_t cfg;
    if (put_config(config, &cfg) != KVP_OK || groups_check(&cfg, n) != KVP_OK)
        return KVP_ERR_INVALID_ARG;
    if (replicas_written != NULL)
        memset(replicas_written, 0, n * sizeof(*replicas_written));

    put_batch_t b = {.c = c, .keys = keys, .groups = cfg.group_ids, .src = src};
    /* (a key put again after its hold: placed anew, the two-call way) */
    bool may_hold = again != PUT_HOLD_GONE && again != PUT_TIMED_OUT;
    b.shun = again == PUT_TIMED_OUT;
    b.st = kvp_scratch_alloc(n * sizeof(*b.st));
    b.idx = kvp_scratch_alloc(n * sizeof(*b.idx));
    b.szs = kvp_scratch_alloc(n * sizeof(*b.szs));
    b.used = kvp_scratch_alloc(n * sizeof(*b.used));
    b.kp = kvp_scratch_alloc(n * sizeof(*b.kp));
    b.gp = b.groups != NULL ? kvp_scratch_alloc(n * sizeof(*b.gp)) : NULL;
    kvp_status_t rc = KVP_ERR_NOMEM;
    if (!b.st || !b.idx || !b.szs || !b.used || !b.kp || (b.groups != NULL && !b.gp))
        goto out_all;
    put_gather(&b, n);
    if (b.m > 0) {
        /* held room for every key: no PutStart (one master call for the batch) */
        b.commit = put_commits(c, &cfg, b.m);
        if (b.commit) {
            Kvpool__PutConfig pc;
            uint64_t avoid[KVP_PEERS_SUSPECTS];
            kvp_obj_put_config_wire(c, &cfg, &pc, avoid);
            b.fp = put_fp(&pc);
        }
        bool fresh = false;
        if (b.commit)
            b.gen = conn_gen(c, &fresh);
        if (!b.commit || !may_hold || !fresh || !put_hold_take(&b)) {
            rc = put_start(&b, &cfg);
            if (rc != KVP_OK)
                goto out_all;
        }
        rc = put_plan(&b);
        if (b.ops != NULL) {
            kvp_transfer_run(&c->xfer, b.ops, b.k);
            put_collect(&b);
        }
        put_finish(&b, &cfg, replicas_written);
        if (rc == KVP_ERR_NOMEM)
            goto out_all;
    }
    for (size_t i = 0; i < n; i++)
        results[i] = (kvp_status_t)b.st[i];
    return first_error(b.st, n);

out_all:
    for (size_t i = 0; i < n; i++)
        results[i] = b.st && b.st[i] != KVP_OK ? (kvp_status_t)b.st[i] : rc;
    if (rc == KVP_OK)
        rc = b.st ? first_error(b.st, n) : KVP_ERR_NOMEM;
    return rc;
}

/* One attempt; what it took from the thread's scratch arena is given back (the
 * busy-pool retries call it many times within one public call). */
static kvp_status_t put_batch_once(kvp_client_t *c, const char *const *keys, const pieces_t *src,
                                   size_t n, const kvp_put_config_t *config, kvp_status_t *results,
                                   uint32_t *replicas_written, kvp_status_t again)
{
    size_t mark = kvp_scratch_mark();
    kvp_status_t rc =
        put_batch_once_body(c, keys, src, n, config, results, replicas_written, again);
    kvp_scratch_release(mark);
    return rc;
}

/* Give every hold this client keeps back to the master (PUT_COMMIT naming no key); whether
 * any was. A put that found the pool, or its tenant's quota, full may find room then. */
static bool put_holds_release(kvp_client_t *c)
{
    uint64_t gen = conn_gen(c, NULL);
    if (kvp_holds_give_all(c->holds, gen) == 0)
        return false;
    uint64_t ids[COMMIT_KEYS_MAX];
    size_t n;
    while ((n = kvp_holds_gone(c->holds, gen, ids, COMMIT_KEYS_MAX)) > 0) {
        Kvpool__PutCommitRequest req = KVPOOL__PUT_COMMIT_REQUEST__INIT;
        req.release = ids;
        req.n_release = n;
        uint8_t *resp;
        size_t rlen;
        if (kvp_session_call(c->session, KVP_RPC_PUT_COMMIT, &req.base, &resp, &rlen) != KVP_OK)
            break; /* (what is left goes at the master's put timeout) */
    }
    return true;
}

/* The keys whose results[] are `which` put again (one attempt), their results and
 * replicas_written[] replaced; how many of them are `which` still. SIZE_MAX: no memory (the
 * results stay). */
static size_t put_again(kvp_client_t *c, const char *const *keys, const pieces_t *src, size_t n,
                        const kvp_put_config_t *config, kvp_status_t *results,
                        uint32_t *replicas_written, kvp_status_t which)
{
    size_t mark = kvp_scratch_mark();
    size_t *at = kvp_scratch_alloc(n * sizeof(*at));
    const char **k2 = kvp_scratch_alloc(n * sizeof(*k2));
    kvp_status_t *r2 = kvp_scratch_alloc(n * sizeof(*r2));
    uint32_t *w2 = kvp_scratch_alloc(n * sizeof(*w2));
    size_t m = 0, left = SIZE_MAX;
    pieces_t src2;
    if (!at || !k2 || !r2 || !w2)
        goto out;
    for (size_t i = 0; i < n; i++) {
        if (results[i] != which)
            continue;
        at[m] = i;
        k2[m++] = keys[i];
    }
    if (!pieces_subset(src, at, m, &src2))
        goto out;
    /* the keys' group ids (config's are the whole call's) */
    kvp_put_config_t cfg2;
    const kvp_put_config_t *config2 = config;
    if (config != NULL &&
        config->size >= offsetof(kvp_put_config_t, n_group_ids) + sizeof(config->n_group_ids) &&
        config->group_ids != NULL) {
        const char **g2 = kvp_scratch_alloc(m * sizeof(*g2));
        if (g2 == NULL)
            goto out;
        for (size_t j = 0; j < m; j++)
            g2[j] = config->group_ids[at[j]];
        memcpy(&cfg2, config, sizeof(cfg2));
        cfg2.group_ids = g2;
        cfg2.n_group_ids = m;
        config2 = &cfg2;
    }
    put_batch_once(c, k2, &src2, m, config2, r2, w2, which);
    left = 0;
    for (size_t j = 0; j < m; j++) {
        results[at[j]] = r2[j];
        if (replicas_written != NULL)
            replicas_written[at[j]] = w2[j];
        left += r2[j] == which;
    }
out:
    kvp_scratch_release(mark);
    return left;
}

/*
 * A put whose keys found the pool full with the room held by reads in flight
 * (KVP_ERR_POOL_BUSY) waits for those reads to end and asks again, for at
 * most the RPC timeout; then the keys get KVP_ERR_POOL_FULL. Only the busy
 * keys are retried; the allocations here are on that rare path only. A key whose
 * hold was gone at the master (PUT_HOLD_GONE: its bytes went to room the master no
 * longer held for it) is put again once, at once; so is one whose held write timed out
 * (PUT_TIMED_OUT), on no segment that failed lately.
 */
static kvp_status_t batch_put_ex(kvp_client_t *c, const char *const *keys, const pieces_t *src,
                                 size_t n, const kvp_put_config_t *config, kvp_status_t *results,
                                 uint32_t *replicas_written)
{
    if (results == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    /* what the call leaves untouched (arguments refused outright) reads as refused */
    for (size_t i = 0; i < n; i++)
        results[i] = KVP_ERR_INVALID_ARG;
    kvp_status_t rc = put_batch_once(c, keys, src, n, config, results, replicas_written, KVP_OK);
    size_t nb = 0, ng = 0, nt = 0;
    for (size_t i = 0; rc != KVP_OK && i < n; i++) {
        nb += results[i] == KVP_ERR_POOL_BUSY;
        ng += results[i] == PUT_HOLD_GONE;
        nt += results[i] == PUT_TIMED_OUT;
    }
    if (nt > 0 &&
        put_again(c, keys, src, n, config, results, replicas_written, PUT_TIMED_OUT) == SIZE_MAX)
        for (size_t i = 0; i < n; i++)
            if (results[i] == PUT_TIMED_OUT)
                results[i] = KVP_ERR_TIMEOUT; /* (no memory to put it again) */
    if (ng > 0 || nt > 0) {
        if (ng > 0)
            put_again(c, keys, src, n, config, results, replicas_written, PUT_HOLD_GONE);
        nb = 0;
        for (size_t i = 0; i < n; i++) {
            if (results[i] == PUT_HOLD_GONE) {
                kvp_api_fail_key(keys[i],
                                 "put %s: the master no longer held the room it had placed "
                                 "for it, twice (it restarted or lost this client's "
                                 "connection); nothing is stored, retry",
                                 keys[i]);
                results[i] = KVP_ERR_PUT_REVOKED;
            }
            nb += results[i] == KVP_ERR_POOL_BUSY;
        }
        rc = KVP_OK;
        for (size_t i = 0; i < n && rc == KVP_OK; i++)
            rc = results[i];
    }
    /* no room: the holds this client keeps may be what fills (or cuts up) the pool. (Not
     * for a quota: a tenant's holds take at most an eighth of it, none in its last eighth,
     * and a put refused by it is refused once.) */
    size_t nf = 0;
    for (size_t i = 0; rc != KVP_OK && i < n; i++)
        nf += results[i] == KVP_ERR_POOL_FULL || results[i] == KVP_ERR_POOL_BUSY;
    if (nf > 0 && put_holds_release(c)) {
        put_again(c, keys, src, n, config, results, replicas_written, KVP_ERR_POOL_FULL);
        put_again(c, keys, src, n, config, results, replicas_written, KVP_ERR_POOL_BUSY);
        rc = KVP_OK;
        nb = 0;
        for (size_t i = 0; i < n; i++) {
            if (rc == KVP_OK)
                rc = results[i];
            nb += results[i] == KVP_ERR_POOL_BUSY;
        }
    }
    if (nb == 0) {
        if (rc != KVP_OK && rc != KVP_ERR_INVALID_ARG)
            kvp_api_fail_keys("put", keys, (const int32_t *)results, n);
        return rc;
    }
    uint64_t deadline =
        kvp_now_ms() + (c->params.rpc_timeout_ms ? c->params.rpc_timeout_ms : 10000);
    unsigned sleep_ms = 1;
    while (nb > 0 && nb != SIZE_MAX && kvp_now_ms() < deadline) {
        usleep(sleep_ms * 1000u);
        sleep_ms = KVP_MIN(sleep_ms * 2, 8u); /* room held by offloads comes back within ms */
        nb = put_again(c, keys, src, n, config, results, replicas_written, KVP_ERR_POOL_BUSY);
    }
    rc = KVP_OK;
    for (size_t i = 0; i < n; i++) {
        if (results[i] == PUT_HOLD_GONE)
            results[i] = KVP_ERR_PUT_REVOKED;
        if (results[i] == KVP_ERR_POOL_BUSY) {
            kvp_api_fail("put %s: the pool stayed full (of objects being read, or of segments "
                         "still remounting after a master restart) for the whole %u ms timeout",
                         keys[i], c->params.rpc_timeout_ms);
            KVP_LOG_WARN("put %s: the pool stayed full (of objects being read, or of segments "
                         "still remounting) for the whole timeout",
                         keys[i]);
            results[i] = KVP_ERR_POOL_FULL;
        }
        if (rc == KVP_OK && results[i] != KVP_OK)
            rc = results[i];
    }
    if (rc != KVP_OK)
        kvp_api_fail_keys("put", keys, (const int32_t *)results, n);
    return rc;
}

kvp_status_t kvp_batch_put_from_ex(kvp_client_t *c, const char *const *keys,
                                   const void *const *bufs, const size_t *sizes, size_t n,
                                   const kvp_put_config_t *config, kvp_status_t *results,
                                   uint32_t *replicas_written)
{
    kvp_api_enter();
    pieces_t src = {.one = bufs, .one_size = sizes};
    return (kvp_status_t)kvp_api_leave(
        batch_put_ex(c, keys, &src, n, config, results, replicas_written), "put");
}

kvp_status_t kvp_batch_put_from_multi(kvp_client_t *c, const char *const *keys,
                                      const void *const *const *bufs, const size_t *const *sizes,
                                      const size_t *n_bufs, size_t n,
                                      const kvp_put_config_t *config, kvp_status_t *results)
{
    kvp_api_enter();
    pieces_t src = {.bufs = bufs, .sizes = sizes, .n_bufs = n_bufs};
    return (kvp_status_t)kvp_api_leave(batch_put_ex(c, keys, &src, n, config, results, NULL),
                                       "put");
}

/* One key: the batch flow with a batch of one. */
kvp_status_t kvp_put(kvp_client_t *c, const char *key, const void *buf, size_t len,
                     const kvp_put_config_t *config)
{
    kvp_api_enter();
    pieces_t src = {.one = &buf, .one_size = &len};
    kvp_status_t r = KVP_OK; /* stays OK if the batch refused its arguments outright */
    kvp_status_t st = batch_put_ex(c, &key, &src, 1, config, &r, NULL);
    st = st == KVP_OK ? KVP_OK : (r != KVP_OK ? r : st);
    return (kvp_status_t)kvp_api_leave(st, "put");
}

/* ---------------- get ---------------- */

/* A replica whose owner answers reads this much slower than another's (and more than
 * twice as slow) is tried after it: a far or slow owner (docs/architecture.md, "Reads"). */
#define PEER_SLOW_MARGIN_US 1000

/*
 * Order replicas: same host (shm) first, then other DRAM peers with no recent transfer
 * failure (those whose owner answers reads far slower than another's, by the peers'
 * recent read latencies, after the others; one not read from in the last
 * KVP_PEER_LAT_STALE_MS counts as near, so it is tried and learnt), then SSD segments,
 * then the recently failed ones (they are still tried, last). Ties keep the master's order.
 */
static void order_replicas(kvp_client_t *c, Kvpool__GetReplicaResult *r, size_t *order)
{
    size_t n = KVP_MIN(r->n_replicas, (size_t)8);
    unsigned rank[8];
    uint32_t lat[8];
    uint32_t best = 0;
    bool any = false;
    uint64_t now = kvp_now_ms();
    for (size_t q = 0; q < n; q++) {
        kvp_peer_t *p = kvp_peers_get(&c->peers, r->replicas[q]->segment_id);
        rank[q] = 1;
        lat[q] = 0;
        if (p != NULL) {
            if (kvp_peers_failed_lately(p, now))
                rank[q] = 4; /* (tried after the others) */
            else if (kvp_transfer_route(&c->xfer, p) == KVP_TRANSPORT_SHM)
                rank[q] = 0;
            else if (p->ssd)
                rank[q] = 3; /* DRAM anywhere before SSD */
            else if (now - atomic_load_explicit(&p->read_lat_ms, memory_order_relaxed) <=
                     KVP_PEER_LAT_STALE_MS)
                lat[q] = atomic_load_explicit(&p->read_lat_us, memory_order_relaxed);
            kvp_peer_unref(p);
        }
        if (rank[q] == 1 && (!any || lat[q] < best))
            best = lat[q];
        any |= rank[q] == 1;
    }
    /* a peer not heard from lately counts as near (0): it is tried before a known slow one,
     * and so learnt */
    for (size_t q = 0; q < n && n > 1; q++)
        if (rank[q] == 1 && lat[q] > 2 * (uint64_t)best + PEER_SLOW_MARGIN_US)
            rank[q] = 2;
    size_t k = 0;
    for (unsigned want = 0; want < 5; want++)
        for (size_t q = 0; q < n; q++)
            if (rank[q] == want)
                order[k++] = q;
}

/* Every read of a GetReplicaList answer is over (done, failed or never started): hand its
 * leases back, last key first: the master's eviction policy takes a read as done when its
 * lease ends, and wants a chain's first block to end up the most recent. */
static void release_leases(kvp_client_t *c, const Kvpool__GetReplicaListResponse *gr)
{
    uint64_t ids[256];
    size_t k = 0;
    for (size_t j = gr != NULL ? gr->n_results : 0; j-- > 0;) {
        if (gr->results[j]->status != KVP_OK || gr->results[j]->lease_id == 0)
            continue;
        ids[k++] = gr->results[j]->lease_id;
        if (k == KVP_ARRAY_SIZE(ids)) {
            kvp_session_lease_release(c->session, ids, k);
            k = 0;
        }
    }
    kvp_session_lease_release(c->session, ids, k);
}

/*
 * The keys out[idx[j]] == PUT_MAYBE_STORED (j < m): a PUT_COMMIT or PutEnd sent a second
 * time, on a new connection, no longer found them held or PENDING, and the first send,
 * whose answer went with the broken connection, may have stored them. Those the master has
 * now with this put's size (sizes[j]) and CRC32C (crcs[j]) hold the bytes this put wrote:
 * OK (replicas_written[idx[j]], when given, from the answer). The rest, and all of them
 * when the master cannot be asked: `otherwise`.
 */
static void stored_by_first_send(kvp_client_t *c, const char *const *keys, const size_t *idx,
                                 const uint64_t *sizes, const uint32_t *crcs, size_t m,
                                 int32_t *out, uint32_t *replicas_written, int32_t otherwise)
{
    size_t *at = kvp_scratch_alloc((m ? m : 1) * sizeof(*at));
    size_t *ki = kvp_scratch_alloc((m ? m : 1) * sizeof(*ki));
    size_t n = 0;
    for (size_t j = 0; j < m && at != NULL && ki != NULL; j++)
        if (out[idx[j]] == PUT_MAYBE_STORED) {
            at[n] = j;
            ki[n++] = idx[j];
        }
    uint8_t *resp = NULL;
    size_t rlen = 0;
    Kvpool__GetReplicaListResponse *gr = NULL;
    if (n > 0 && keys_call(c, KVP_RPC_GET_REPLICA_LIST, keys, ki, n, false, &resp, &rlen) == KVP_OK)
        gr = kvpool__get_replica_list_response__unpack(&kvp_scratch_pb, rlen, resp);
    bool answered = gr != NULL && gr->status == KVP_OK && gr->n_results == n;
    for (size_t q = 0; q < n; q++) {
        size_t j = at[q];
        const Kvpool__GetReplicaResult *r = answered ? gr->results[q] : NULL;
        if (r != NULL && r->status == KVP_OK && r->size == sizes[j] && r->crc32c == crcs[j]) {
            out[idx[j]] = KVP_OK;
            if (replicas_written != NULL)
                replicas_written[idx[j]] = (uint32_t)r->n_replicas;
            continue;
        }
        out[idx[j]] = otherwise;
        if (otherwise == KVP_ERR_PUT_REVOKED)
            kvp_api_fail_key(keys[idx[j]], REVOKED_WHY, keys[idx[j]]);
    }
    for (size_t j = 0; j < m; j++) /* (no memory to ask) */
        if (out[idx[j]] == PUT_MAYBE_STORED)
            out[idx[j]] = otherwise;
    release_leases(c, answered ? gr : NULL);
}

/* Order items by key (qsort_r): the ranges of one key share its GetReplicaList entry. */
static int cmp_item_key(const void *a, const void *b, void *keys)
{
    const char *const *k = keys;
    return strcmp(k[*(const size_t *)a], k[*(const size_t *)b]);
}

/*
 * The read flow behind every get. Item t reads object keys[t] into the pieces of dst's
 * object t: with offsets NULL the whole object (it must fit: KVP_ERR_BUFFER_TOO_SMALL, and
 * its CRC is checked over the pieces in order); else the bytes from offsets[t] on, as many
 * as the pieces hold, up to the object's end (no CRC: it covers whole objects only). Items
 * naming the same key share one GetReplicaList entry when ranged (whole gets send their
 * keys as given). results[t]: the bytes read, or a negative status.
 */
/* One read batch's state, from the thread's scratch arena. */
typedef struct read_batch {
    kvp_client_t *c;
    const char *const *keys;
    const pieces_t *dst;
    const uint64_t *offsets; /* NULL: whole objects */
    bool whole;
    size_t n;
    int32_t *st;   /* [n] per item */
    size_t *idx;   /* [n_ent] the item whose key each GetReplicaList entry asks for */
    size_t *slot;  /* [n] item -> its entry */
    uint64_t *len; /* [n] the bytes to read */
    size_t m, n_ent, max_ops;
    Kvpool__GetReplicaListResponse *gr;
    uint64_t lease_start;
    kvp_xfer_op_t *ops; /* [max_ops] one per piece of an item's replica in this round */
    size_t *op_item;
    size_t (*order)[REPLICAS_MAX]; /* [n_ent] the replicas in the order to try */
    unsigned *tried;               /* [n] replicas tried */
} read_batch_t;

/* The items to ask about (valid key, room for their bytes), made into GetReplicaList
 * entries: one per distinct key when ranged, sorted so that equal keys are neighbours. */
static void read_gather(read_batch_t *b)
{
    size_t m = gather_valid(b->keys, b->n, b->idx, b->st);
    size_t mm = 0;
    for (size_t j = 0; j < m; j++) {
        size_t used = 0, i = b->idx[j];
        if (pieces_total(b->dst, i, &b->len[i], &used) != KVP_OK || (!b->whole && b->len[i] == 0)) {
            b->st[i] = KVP_ERR_INVALID_ARG;
            continue;
        }
        b->max_ops += used;
        b->idx[mm++] = i;
    }
    b->m = mm;
    if (!b->whole && b->m > 1)
        qsort_r(b->idx, b->m, sizeof(*b->idx), cmp_item_key, (void *)b->keys);
    for (size_t j = 0; j < b->m; j++) {
        size_t t = b->idx[j];
        if (b->whole || b->n_ent == 0 || strcmp(b->keys[t], b->keys[b->idx[b->n_ent - 1]]) != 0)
            b->idx[b->n_ent++] = t; /* n_ent <= j: only places already read are written */
        b->slot[t] = b->n_ent - 1;
    }
}

/* GetReplicaList for the entries (their segments learnt), and the arrays for the reads. */
static kvp_status_t read_ask(read_batch_t *b)
{
    uint8_t *resp;
    size_t rlen;
    /* the lease runs from the master's reply; measuring from before the request
     * makes the client's view of it conservative */
    b->lease_start = kvp_now_ms();
    kvp_status_t rc =
        keys_call(b->c, KVP_RPC_GET_REPLICA_LIST, b->keys, b->idx, b->n_ent, false, &resp, &rlen);
    if (rc != KVP_OK)
        return rc;
    Kvpool__GetReplicaListResponse *gr =
        kvpool__get_replica_list_response__unpack(&kvp_scratch_pb, rlen, resp);
    b->gr = gr;
    if (gr == NULL || gr->status != KVP_OK || gr->n_results != b->n_ent)
        return gr == NULL || gr->status == KVP_OK ? KVP_ERR_PROTOCOL : gr->status;
    kvp_peers_update(&b->c->peers, gr->segments, gr->n_segments);
    b->ops = kvp_scratch_calloc(b->max_ops + 1, sizeof(*b->ops));
    b->op_item = kvp_scratch_alloc((b->max_ops + 1) * sizeof(*b->op_item));
    b->order = kvp_scratch_alloc(b->n_ent * sizeof(*b->order));
    b->tried = kvp_scratch_calloc(b->n, sizeof(*b->tried));
    if (!b->ops || !b->op_item || !b->order || !b->tried)
        return KVP_ERR_NOMEM;
    return KVP_OK;
}

/* Each item's status from the master's answer, and the length to read; each entry's
 * replicas in the order to try. */
static void read_check(read_batch_t *b)
{
    const Kvpool__GetReplicaListResponse *gr = b->gr;
    for (size_t e = 0; e < b->n_ent; e++) {
        Kvpool__GetReplicaResult *r = gr->results[e];
        if (r->status == KVP_OK && r->n_replicas >= 1 && r->n_replicas <= REPLICAS_MAX)
            order_replicas(b->c, r, b->order[e]);
    }
    for (size_t t = 0; t < b->n; t++) {
        if (b->st[t] != KVP_OK)
            continue;
        const Kvpool__GetReplicaResult *r = gr->results[b->slot[t]];
        b->st[t] = r->status;
        if (r->status != KVP_OK)
            continue;
        if (r->n_replicas == 0 || r->n_replicas > REPLICAS_MAX)
            b->st[t] = KVP_ERR_PROTOCOL;
        else if (b->whole && r->size > b->len[t])
            b->st[t] = KVP_ERR_BUFFER_TOO_SMALL;
        else if (!b->whole && b->offsets[t] >= r->size)
            b->st[t] = KVP_ERR_OUT_OF_RANGE;
        else
            b->len[t] = b->whole ? r->size : KVP_MIN(b->len[t], r->size - b->offsets[t]);
    }
}

/* The reads of one round: each item not done yet from its replica of this rank (round 0:
 * every item the master answered). Returns the op count. */
static size_t read_plan_round(read_batch_t *b, unsigned round)
{
    size_t k = 0;
    for (size_t t = 0; t < b->n; t++) {
        if (round == 0 ? b->st[t] != KVP_OK : b->st[t] == KVP_OK || b->tried[t] != round)
            continue; /* refused, not asked, too small... or done */
        const Kvpool__GetReplicaResult *r = b->gr->results[b->slot[t]];
        if (r->status != KVP_OK || round >= r->n_replicas)
            continue;
        const Kvpool__Replica *rep = r->replicas[b->order[b->slot[t]][round]];
        kvp_peer_t *peer = kvp_peers_get(&b->c->peers, rep->segment_id);
        b->tried[t]++;
        if (peer == NULL) {
            b->st[t] = KVP_ERR_UNKNOWN_SEGMENT;
            kvp_api_fail_key(b->keys[t],
                             "get %s: replica on segment %#llx, which this client has no "
                             "descriptor for",
                             b->keys[t], (unsigned long long)rep->segment_id);
            continue;
        }
        k = add_piece_ops(b->ops, b->op_item, k, t, KVP_XFER_READ, b->dst, t,
                          rep->offset + (b->whole ? 0 : b->offsets[t]), b->len[t], peer,
                          b->whole && b->c->params.verify_crc != 0, NULL,
                          rep_grant(rep, b->gr->segments, b->gr->n_segments));
    }
    return k;
}

/* The outcome of a round's k reads: each item's status (a read that outlasted the lease, or
 * whose CRC differs from the master's, is not trusted). */
static void read_collect_round(read_batch_t *b, size_t k)
{
    const char *const *keys = b->keys;
    kvp_xfer_op_t *ops = b->ops;
    bool lease_over =
        b->gr->lease_ttl_ms > 0 && kvp_now_ms() - b->lease_start >= b->gr->lease_ttl_ms;
    for (size_t q = 0; q < k;) {
        size_t t = b->op_item[q];
        kvp_status_t s;
        uint32_t crc;
        size_t end = fold_ops(ops, b->op_item, q, k, &s, &crc);
        if (s == KVP_OK && lease_over) {
            /* the extent may have been reused after the lease: do not trust it */
            KVP_LOG_WARN_LIMITED("get %s: transfer outlasted the %u ms read lease", keys[t],
                                 b->gr->lease_ttl_ms);
            s = KVP_ERR_LEASE_EXPIRED;
        }
        if (s == KVP_OK && ops[q].want_crc && crc != b->gr->results[b->slot[t]]->crc32c) {
            KVP_LOG_WARN_LIMITED("get %s: checksum mismatch reading from segment %s", keys[t],
                                 ops[q].peer->name);
            kvp_api_fail_key(keys[t], "get %s: checksum mismatch reading from segment %s", keys[t],
                             ops[q].peer->name);
            s = KVP_ERR_CHECKSUM;
            atomic_fetch_add_explicit(&b->c->xfer.stats.errors[1], 1, memory_order_relaxed);
        } else if (s != KVP_OK) {
            KVP_LOG_WARN_LIMITED("get %s: read from segment %s failed: %s", keys[t],
                                 ops[q].peer->name, kvp_strerror(s));
            kvp_api_fail_key(keys[t], "get %s: read from segment %s failed: %s", keys[t],
                             ops[q].peer->name, kvp_strerror(s));
            if (s != KVP_ERR_LEASE_EXPIRED)
                kvp_peers_suspect(&b->c->peers, ops[q].peer);
        }
        b->st[t] = s;
        unref_ops(ops, q, end);
        q = end;
    }
}

/* An object with several copies, none of which could be read: say so (each copy's own
 * failure was logged and the first recorded for last_error). */
static void read_no_replica(read_batch_t *b)
{
    for (size_t t = 0; t < b->n; t++) {
        int32_t s = b->st[t];
        if (s == KVP_OK || b->tried[t] == 0)
            continue;
        const Kvpool__GetReplicaResult *r = b->gr->results[b->slot[t]];
        if (r->n_replicas > 1 && b->tried[t] >= r->n_replicas && s != KVP_ERR_CHECKSUM &&
            s != KVP_ERR_LEASE_EXPIRED)
            b->st[t] = KVP_ERR_NO_REPLICA;
    }
}

static kvp_status_t read_batch(kvp_client_t *c, const char *const *keys, const pieces_t *dst,
                               const uint64_t *offsets, size_t n, int64_t *results)
{
    if (c == NULL || keys == NULL || !pieces_ok(dst) || results == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    if (n == 0)
        return KVP_OK;
    read_batch_t b = {
        .c = c, .keys = keys, .dst = dst, .offsets = offsets, .whole = offsets == NULL, .n = n};
    b.st = kvp_scratch_alloc(n * sizeof(*b.st));
    b.idx = kvp_scratch_alloc(n * sizeof(*b.idx));
    b.slot = kvp_scratch_alloc(n * sizeof(*b.slot));
    b.len = kvp_scratch_alloc(n * sizeof(*b.len));
    kvp_status_t rc = KVP_ERR_NOMEM;
    if (!b.st || !b.idx || !b.slot || !b.len)
        goto out;
    read_gather(&b);
    if (b.m > 0) {
        rc = read_ask(&b);
        if (rc != KVP_OK)
            goto out;
        read_check(&b);
        /* one round per replica rank: items whose read failed try their next replica */
        for (unsigned round = 0; round < REPLICAS_MAX; round++) {
            size_t k = read_plan_round(&b, round);
            if (k == 0)
                break;
            kvp_transfer_run(&c->xfer, b.ops, k);
            read_collect_round(&b, k);
        }
        read_no_replica(&b);
    }
    release_leases(c, b.gr);
    kvp_api_fail_keys("get", keys, b.st, n);
    for (size_t t = 0; t < n; t++)
        results[t] = b.st[t] == KVP_OK ? (int64_t)b.len[t] : b.st[t];
    return first_error(b.st, n);
out:
    release_leases(c, b.gr);
    for (size_t t = 0; t < n; t++)
        results[t] = b.st && b.st[t] != KVP_OK ? b.st[t] : rc;
    return rc;
}

kvp_status_t kvp_batch_get_into(kvp_client_t *c, const char *const *keys, void *const *bufs,
                                const size_t *caps, size_t n, int64_t *results)
{
    kvp_api_enter();
    pieces_t dst = {.one = (const void *const *)bufs, .one_size = caps};
    return (kvp_status_t)kvp_api_leave(read_batch(c, keys, &dst, NULL, n, results), "get");
}

kvp_status_t kvp_batch_get_into_multi(kvp_client_t *c, const char *const *keys,
                                      void *const *const *bufs, const size_t *const *sizes,
                                      const size_t *n_bufs, size_t n, int64_t *results)
{
    kvp_api_enter();
    pieces_t dst = {.bufs = (const void *const *const *)bufs, .sizes = sizes, .n_bufs = n_bufs};
    return (kvp_status_t)kvp_api_leave(read_batch(c, keys, &dst, NULL, n, results), "get");
}

static kvp_status_t get_into_ranges_impl(kvp_client_t *c, const kvp_range_t *ranges, size_t n,
                                         int64_t *results)
{
    if (ranges == NULL || results == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    const char **keys = kvp_scratch_alloc((n ? n : 1) * sizeof(*keys));
    const void **bufs = kvp_scratch_alloc((n ? n : 1) * sizeof(*bufs));
    size_t *lens = kvp_scratch_alloc((n ? n : 1) * sizeof(*lens));
    uint64_t *offsets = kvp_scratch_alloc((n ? n : 1) * sizeof(*offsets));
    if (!keys || !bufs || !lens || !offsets)
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        keys[i] = ranges[i].key;
        bufs[i] = ranges[i].buf;
        /* a length past what a buffer can be is cut to the object's end anyway */
        lens[i] = (size_t)KVP_MIN(ranges[i].length, (uint64_t)SIZE_MAX);
        offsets[i] = ranges[i].offset;
    }
    pieces_t dst = {.one = bufs, .one_size = lens};
    return read_batch(c, keys, &dst, offsets, n, results);
}

kvp_status_t kvp_get_into_ranges(kvp_client_t *c, const kvp_range_t *ranges, size_t n,
                                 int64_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(get_into_ranges_impl(c, ranges, n, results), "get");
}

static int64_t get_into_impl(kvp_client_t *c, const char *key, void *buf, size_t cap)
{
    int64_t r = 0;
    kvp_status_t st = kvp_batch_get_into(c, &key, &buf, &cap, 1, &r);
    return st == KVP_OK ? r : (r < 0 ? r : st);
}

int64_t kvp_get_into(kvp_client_t *c, const char *key, void *buf, size_t cap)
{
    kvp_api_enter();
    return kvp_api_leave(get_into_impl(c, key, buf, cap), "get");
}

/* ---------------- exist / remove / size / stat ---------------- */

/*
 * A per-key RPC answered with a StatusesResponse (EXIST, REMOVE). st[i]
 * receives each key's answer (invalid keys answered locally). Returns a
 * whole-call error (master unreachable, bad reply) or KVP_OK.
 */
/* REPLICA_CLEAR's request for keys[idx[0..m)]: the keys and the segment's name. */
static kvp_status_t replica_clear_call(kvp_client_t *c, const char *const *keys, const size_t *idx,
                                       size_t m, const char *segment, uint8_t **resp_p,
                                       size_t *rlen_p)
{
    ProtobufCBinaryData *kp = wire_keys(keys, idx, m);
    if (kp == NULL)
        return KVP_ERR_NOMEM;
    Kvpool__ReplicaClearRequest req = KVPOOL__REPLICA_CLEAR_REQUEST__INIT;
    req.keys = kp;
    req.n_keys = m;
    req.segment = (char *)segment;
    return kvp_session_call(c->session, KVP_RPC_REPLICA_CLEAR, &req.base, resp_p, rlen_p);
}

/* Per-key statuses of EXIST, REMOVE or REPLICA_CLEAR (segment: its segment name). */
static kvp_status_t statuses_call(kvp_client_t *c, uint16_t method, const char *const *keys,
                                  size_t n, bool force, const char *segment, int32_t *st)
{
    size_t *idx = kvp_scratch_alloc((n ? n : 1) * sizeof(*idx));
    if (idx == NULL)
        return KVP_ERR_NOMEM;
    size_t m = gather_valid(keys, n, idx, st);
    kvp_status_t rc = KVP_OK;
    if (m > 0) {
        uint8_t *resp;
        size_t rlen;
        rc = method == KVP_RPC_REPLICA_CLEAR
                 ? replica_clear_call(c, keys, idx, m, segment, &resp, &rlen)
                 : keys_call(c, method, keys, idx, m, force, &resp, &rlen);
        if (rc == KVP_OK) {
            Kvpool__StatusesResponse *sr =
                kvpool__statuses_response__unpack(&kvp_scratch_pb, rlen, resp);
            if (sr == NULL || sr->status != KVP_OK || sr->n_statuses != m)
                rc = sr == NULL || sr->status == KVP_OK ? KVP_ERR_PROTOCOL : sr->status;
            else
                for (size_t j = 0; j < m; j++)
                    st[idx[j]] = sr->statuses[j];
        }
    }
    if (rc == KVP_OK)
        kvp_api_fail_keys(method == KVP_RPC_EXIST ? "exist" : "remove", keys, st, n);
    return rc;
}

static kvp_status_t batch_is_exist_impl(kvp_client_t *c, const char *const *keys, size_t n,
                                        int *results, size_t *prefix_len_p)
{
    if (c == NULL || keys == NULL || results == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    int32_t *st = kvp_scratch_alloc((n ? n : 1) * sizeof(*st));
    kvp_status_t rc =
        st ? statuses_call(c, KVP_RPC_EXIST, keys, n, false, NULL, st) : KVP_ERR_NOMEM;
    size_t prefix = 0;
    for (size_t i = 0; i < n; i++)
        results[i] = rc == KVP_OK ? st[i] : rc;
    while (rc == KVP_OK && prefix < n && st[prefix] == 1)
        prefix++;
    if (rc == KVP_OK && prefix_len_p)
        *prefix_len_p = prefix;
    return rc;
}

kvp_status_t kvp_batch_is_exist(kvp_client_t *c, const char *const *keys, size_t n, int *results,
                                size_t *prefix_len_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(batch_is_exist_impl(c, keys, n, results, prefix_len_p),
                                       "exist");
}

static int is_exist_impl(kvp_client_t *c, const char *key)
{
    int r = 0;
    kvp_status_t st = kvp_batch_is_exist(c, &key, 1, &r, NULL);
    return st == KVP_OK ? r : st;
}

int kvp_is_exist(kvp_client_t *c, const char *key)
{
    kvp_api_enter();
    return (int)kvp_api_leave(is_exist_impl(c, key), "exist");
}

static kvp_status_t batch_remove(kvp_client_t *c, const char *const *keys, size_t n, bool force,
                                 kvp_status_t *results)
{
    if (c == NULL || keys == NULL || results == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    int32_t *st = kvp_scratch_alloc((n ? n : 1) * sizeof(*st));
    kvp_status_t rc =
        st ? statuses_call(c, KVP_RPC_REMOVE, keys, n, force, NULL, st) : KVP_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        results[i] = rc == KVP_OK ? (kvp_status_t)st[i] : rc;
    if (rc == KVP_OK)
        rc = first_error(st, n);
    return rc;
}

static kvp_status_t batch_replica_clear(kvp_client_t *c, const char *const *keys, size_t n,
                                        const char *segment, kvp_status_t *results)
{
    if (c == NULL || keys == NULL || results == NULL || n > KVP_MAX_BATCH ||
        (segment != NULL && strlen(segment) > 255))
        return KVP_ERR_INVALID_ARG;
    int32_t *st = kvp_scratch_alloc((n ? n : 1) * sizeof(*st));
    kvp_status_t rc = st ? statuses_call(c, KVP_RPC_REPLICA_CLEAR, keys, n, false,
                                         segment != NULL ? segment : "", st)
                         : KVP_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        results[i] = rc == KVP_OK ? (kvp_status_t)st[i] : rc;
    if (rc == KVP_OK)
        rc = first_error(st, n);
    return rc;
}

kvp_status_t kvp_batch_replica_clear(kvp_client_t *c, const char *const *keys, size_t n,
                                     const char *segment, kvp_status_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(batch_replica_clear(c, keys, n, segment, results),
                                       "replica_clear");
}

kvp_status_t kvp_batch_remove(kvp_client_t *c, const char *const *keys, size_t n,
                              kvp_status_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(batch_remove(c, keys, n, false, results), "remove");
}

kvp_status_t kvp_batch_remove_force(kvp_client_t *c, const char *const *keys, size_t n,
                                    kvp_status_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(batch_remove(c, keys, n, true, results), "remove");
}

static kvp_status_t remove_force_impl(kvp_client_t *c, const char *key)
{
    kvp_status_t r = KVP_OK;
    kvp_status_t st = batch_remove(c, &key, 1, true, &r);
    return st == KVP_OK ? KVP_OK : (r != KVP_OK ? r : st);
}

kvp_status_t kvp_remove_force(kvp_client_t *c, const char *key)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(remove_force_impl(c, key), "remove");
}

static kvp_status_t remove_impl(kvp_client_t *c, const char *key)
{
    kvp_status_t r = KVP_OK;
    kvp_status_t st = kvp_batch_remove(c, &key, 1, &r);
    return st == KVP_OK ? KVP_OK : (r != KVP_OK ? r : st);
}

kvp_status_t kvp_remove(kvp_client_t *c, const char *key)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(remove_impl(c, key), "remove");
}

static int64_t get_size_impl(kvp_client_t *c, const char *key)
{
    if (c == NULL || key == NULL || !kvp_key_valid(key, strnlen(key, KVP_MAX_KEY_LEN + 1)))
        return c == NULL ? KVP_ERR_INVALID_ARG : KVP_ERR_BAD_KEY;
    size_t idx = 0;
    uint8_t *resp;
    size_t rlen;
    kvp_status_t rc = keys_call(c, KVP_RPC_GET_SIZE, &key, &idx, 1, false, &resp, &rlen);
    if (rc != KVP_OK)
        return rc;
    Kvpool__GetSizeResponse *gr = kvpool__get_size_response__unpack(&kvp_scratch_pb, rlen, resp);
    int64_t out = KVP_ERR_PROTOCOL;
    if (gr != NULL && gr->status != KVP_OK)
        out = gr->status;
    else if (gr != NULL && gr->n_sizes == 1)
        out = gr->sizes[0];
    if (out < 0) /* as a batch names its failing key */
        kvp_api_fail_key(key, "get_size %s: %s", key, kvp_strerror((kvp_status_t)out));
    return out;
}

int64_t kvp_get_size(kvp_client_t *c, const char *key)
{
    kvp_api_enter();
    return kvp_api_leave(get_size_impl(c, key), "get_size");
}

static kvp_status_t batch_get_size_impl(kvp_client_t *c, const char *const *keys, size_t n,
                                        int64_t *sizes)
{
    if (c == NULL || keys == NULL || sizes == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    int32_t *early = kvp_scratch_alloc((n ? n : 1) * sizeof(*early));
    size_t *idx = kvp_scratch_alloc((n ? n : 1) * sizeof(*idx));
    if (early == NULL || idx == NULL)
        return KVP_ERR_NOMEM;
    size_t m = gather_valid(keys, n, idx, early);
    for (size_t i = 0; i < n; i++)
        sizes[i] = early[i];
    kvp_status_t rc = KVP_OK;
    if (m > 0) {
        uint8_t *resp;
        size_t rlen;
        rc = keys_call(c, KVP_RPC_GET_SIZE, keys, idx, m, false, &resp, &rlen);
        Kvpool__GetSizeResponse *gr =
            rc == KVP_OK ? kvpool__get_size_response__unpack(&kvp_scratch_pb, rlen, resp) : NULL;
        if (rc == KVP_OK && (gr == NULL || gr->status != KVP_OK || gr->n_sizes != m))
            rc = gr == NULL || gr->status == KVP_OK ? KVP_ERR_PROTOCOL : gr->status;
        for (size_t j = 0; rc == KVP_OK && j < m; j++)
            sizes[idx[j]] = gr->sizes[j];
    }
    for (size_t i = 0; i < n; i++) {
        if (rc != KVP_OK)
            sizes[i] = rc;
        else if (sizes[i] < 0) { /* as a batch names its failing key */
            kvp_api_fail_key(keys[i] != NULL ? keys[i] : "(null)", "get_size %s: %s",
                             keys[i] != NULL ? keys[i] : "(null)",
                             kvp_strerror((kvp_status_t)sizes[i]));
            break;
        }
    }
    return rc;
}

kvp_status_t kvp_batch_get_size(kvp_client_t *c, const char *const *keys, size_t n, int64_t *sizes)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(batch_get_size_impl(c, keys, n, sizes), "get_size");
}

static kvp_status_t pool_stat_impl(kvp_client_t *c, kvp_pool_stat_t **stat_p)
{
    if (c == NULL || stat_p == NULL)
        return KVP_ERR_INVALID_ARG;
    Kvpool__StatRequest req = KVPOOL__STAT_REQUEST__INIT;
    uint8_t *resp;
    size_t rlen;
    kvp_status_t rc = kvp_session_call(c->session, KVP_RPC_STAT, &req.base, &resp, &rlen);
    if (rc != KVP_OK)
        return rc;
    Kvpool__StatResponse *sr = kvpool__stat_response__unpack(NULL, rlen, resp);
    if (sr == NULL)
        return KVP_ERR_PROTOCOL;
    kvp_pool_stat_t *s = calloc(1, sizeof(*s));
    if (s != NULL)
        s->segments = calloc(sr->n_segments + 1, sizeof(*s->segments));
    if (s == NULL || s->segments == NULL) {
        free(s);
        kvpool__stat_response__free_unpacked(sr, NULL);
        return KVP_ERR_NOMEM;
    }
    s->capacity = sr->capacity;
    s->used = sr->used;
    s->objects = sr->objects;
    s->pending = sr->pending;
    s->evicted_objects = sr->evicted_objects;
    s->evicted_bytes = sr->evicted_bytes;
    s->put_timeouts = sr->put_timeouts;
    s->reading_objects = sr->reading_objects;
    s->reading_bytes = sr->reading_bytes;
    s->leases_released = sr->leases_released;
    s->leases_expired = sr->leases_expired;
    s->ssd_capacity = sr->ssd_capacity;
    s->ssd_used = sr->ssd_used;
    s->offloaded_objects = sr->offloaded_objects;
    s->offload_dropped = sr->offload_dropped;
    s->offload_failed = sr->offload_failed;
    s->offloading_objects = sr->offloading_objects;
    s->promoted_objects = sr->promoted_objects;
    s->hits_dram = sr->hits_dram;
    s->hits_ssd = sr->hits_ssd;
    s->ssd_evicted_objects = sr->ssd_evicted_objects;
    s->adopted_objects = sr->adopted_objects;
    s->ssd_lost_objects = sr->ssd_lost_objects;
    s->adopt_refused = sr->adopt_refused;
    s->taken_back = sr->taken_back;
    s->limbo_expired = sr->limbo_expired;
    snprintf(s->leader, sizeof(s->leader), "%s", sr->leader ? sr->leader : "");
    s->epoch = sr->epoch;
    snprintf(s->standbys, sizeof(s->standbys), "%s", sr->standbys ? sr->standbys : "");
    s->moved_objects = sr->moved_objects;
    s->n_segments = sr->n_segments;
    for (size_t i = 0; i < sr->n_segments; i++) {
        const Kvpool__SegmentStat *ss = sr->segments[i];
        kvp_segment_info_t *d = &s->segments[i];
        if (ss->desc != NULL) {
            d->id = ss->desc->id;
            snprintf(d->name, sizeof(d->name), "%s", ss->desc->name);
            snprintf(d->medium, sizeof(d->medium), "%s", ss->desc->medium);
            snprintf(d->endpoint, sizeof(d->endpoint), "%s", ss->desc->tcp_endpoint);
            d->size = ss->desc->size;
            d->draining = ss->desc->draining;
        }
        d->used = ss->used;
        d->objects = ss->objects;
    }
    kvpool__stat_response__free_unpacked(sr, NULL);
    *stat_p = s;
    return KVP_OK;
}

kvp_status_t kvp_pool_stat(kvp_client_t *c, kvp_pool_stat_t **stat_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(pool_stat_impl(c, stat_p), "stat");
}

void kvp_pool_stat_free(kvp_pool_stat_t *stat)
{
    if (stat == NULL)
        return;
    free(stat->segments);
    free(stat);
}

/* ---------------- for the transfer sessions (object_priv.h) ---------------- */

kvp_status_t kvp_obj_keys_call(kvp_client_t *c, uint16_t method, const char *const *keys,
                               const size_t *idx, size_t m, bool force, uint8_t **resp_p,
                               size_t *rlen_p)
{
    return keys_call(c, method, keys, idx, m, force, resp_p, rlen_p);
}

kvp_status_t kvp_obj_revoke_call(kvp_client_t *c, const char *const *keys, const size_t *idx,
                                 const uint64_t *versions, size_t m, uint8_t **resp_p,
                                 size_t *rlen_p)
{
    return keys_call_versions(c, KVP_RPC_PUT_REVOKE, keys, idx, versions, m, false, resp_p, rlen_p);
}

void kvp_obj_end_or_revoke(kvp_client_t *c, uint16_t method, const char *const *keys,
                           const size_t *idx, const uint64_t *versions, const uint64_t *sizes,
                           const uint32_t *crcs, const uint32_t *masks, size_t m, int32_t *out)
{
    end_or_revoke(c, method, keys, idx, versions, sizes, crcs, masks, m, out);
}

kvp_status_t kvp_obj_put_config(const kvp_put_config_t *config, kvp_put_config_t *cfg)
{
    return put_config(config, cfg);
}

kvp_xfer_grant_t kvp_obj_rep_grant(const Kvpool__Replica *rep, Kvpool__SegmentDesc *const *segs,
                                   size_t n_segs)
{
    return rep_grant(rep, segs, n_segs);
}

void kvp_obj_order_replicas(kvp_client_t *c, Kvpool__GetReplicaResult *r, size_t *order)
{
    order_replicas(c, r, order);
}
