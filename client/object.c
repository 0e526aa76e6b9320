/*
 * object.c - the object flows: put, get, exist, remove, size, stat.
 *
 * Put (batch_put_from): PutStart -> the master allocates extents (PENDING)
 * -> WRITE every replica through the transfer engine, CRC32C of the source
 * computed on the way -> PutEnd(crc) for keys whose every replica landed,
 * PutRevoke for the others. A key is visible only after PutEnd.
 *
 * Get (batch_get_into): GetReplicaList -> READ into the caller's buffer
 * from a same-host replica first -> on a transfer error, the next replica
 * -> CRC32C of what arrived compared with the one stored at PutEnd; a
 * mismatch is KVP_ERR_CHECKSUM, never a success with wrong bytes.
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

#include "client/client_priv.h"
#include "client/internal.h"
#include "client/mem/gpu.h"
#include "client/mem/scratch.h"
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

/* Send a KeysRequest-shaped RPC for keys[idx[0..m)], returning the body. */
static kvp_status_t keys_call(kvp_client_t *c, uint16_t method, const char *const *keys,
                              const size_t *idx, size_t m, bool force, uint8_t **resp_p,
                              size_t *rlen_p)
{
    ProtobufCBinaryData *kp = wire_keys(keys, idx, m);
    if (kp == NULL)
        return KVP_ERR_NOMEM;
    Kvpool__KeysRequest req = KVPOOL__KEYS_REQUEST__INIT;
    req.keys = kp;
    req.n_keys = m;
    req.force = force;
    kvp_status_t st = kvp_client_call(c, method, &req.base, resp_p, rlen_p);
    return st;
}

/* PutEnd or PutRevoke for a subset; per-key statuses go to out[idx[j]]. */
static void end_or_revoke(kvp_client_t *c, uint16_t method, const char *const *keys,
                          const size_t *idx, const uint32_t *crcs, const uint32_t *masks, size_t m,
                          int32_t *out)
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
        st = kvp_client_call(c, method, &req.base, &resp, &rlen);
    } else {
        st = keys_call(c, method, keys, idx, m, false, &resp, &rlen);
    }
    if (st != KVP_OK)
        goto fail;
    Kvpool__StatusesResponse *sr = kvpool__statuses_response__unpack(&kvp_scratch_pb, rlen, resp);
    if (sr == NULL || sr->status != KVP_OK || sr->n_statuses != m) {
        st = sr == NULL ? KVP_ERR_PROTOCOL : sr->status != KVP_OK ? sr->status : KVP_ERR_PROTOCOL;
        goto fail;
    }
    if (method == KVP_RPC_PUT_END)
        for (size_t j = 0; j < m; j++) {
            int32_t s = sr->statuses[j];
            /* the master no longer has our PENDING object: it restarted, it revoked
             * the put with a lost connection or a gone segment, or the put timed out */
            if (s == KVP_ERR_NOT_FOUND || s == KVP_ERR_NOT_PENDING) {
                s = KVP_ERR_PUT_REVOKED;
                kvp_api_fail_key(keys[idx[j]],
                                 "put %s: the master dropped the unfinished put (it restarted, "
                                 "lost this client's connection, or the segment went away); "
                                 "nothing is stored, retry",
                                 keys[idx[j]]);
            }
            out[idx[j]] = s;
        }
    return;
fail:
    if (method == KVP_RPC_PUT_END)
        for (size_t j = 0; j < m; j++)
            out[idx[j]] = st;
    /* a failed revoke leaves PENDING objects the master reclaims with our connection */
}

/* ---------------- put ---------------- */

static kvp_status_t batch_put_from_impl(kvp_client_t *c, const char *const *keys,
                                        const void *const *bufs, const size_t *sizes, size_t n,
                                        const kvp_put_config_t *config, kvp_status_t *results)
{
    return kvp_batch_put_from_ex(c, keys, bufs, sizes, n, config, results, NULL);
}

kvp_status_t kvp_batch_put_from(kvp_client_t *c, const char *const *keys, const void *const *bufs,
                                const size_t *sizes, size_t n, const kvp_put_config_t *config,
                                kvp_status_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(
        batch_put_from_impl(c, keys, bufs, sizes, n, config, results), "put");
}

static kvp_status_t put_batch_once_body(kvp_client_t *c, const char *const *keys,
                                        const void *const *bufs, const size_t *sizes, size_t n,
                                        const kvp_put_config_t *config, kvp_status_t *results,
                                        uint32_t *replicas_written)
{
    if (c == NULL || keys == NULL || bufs == NULL || sizes == NULL || results == NULL ||
        n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    if (n == 0)
        return KVP_OK;
    kvp_put_config_t cfg;
    kvp_put_config_init(&cfg);
    if (config != NULL)
        memcpy(&cfg, config, KVP_MIN(config->size, sizeof(cfg)));
    if (cfg.replica_num == 0 || cfg.replica_num > 8 || cfg.pin > KVP_PIN_HARD ||
        cfg.mode > KVP_PUT_UPSERT)
        return KVP_ERR_INVALID_ARG;
    if (replicas_written != NULL)
        memset(replicas_written, 0, n * sizeof(*replicas_written));

    int32_t *st = kvp_scratch_alloc(n * sizeof(*st));
    size_t *idx = kvp_scratch_alloc(n * sizeof(*idx));
    uint64_t *szs = kvp_scratch_alloc(n * sizeof(*szs));
    ProtobufCBinaryData *kp = kvp_scratch_alloc(n * sizeof(*kp));
    kvp_xfer_op_t *ops = NULL;
    size_t *op_key = NULL;
    unsigned *op_rep = NULL;
    uint32_t *crcs = NULL;
    uint32_t *masks = NULL;
    Kvpool__PutStartResponse *sr = NULL;
    kvp_status_t rc = KVP_ERR_NOMEM;
    if (!st || !idx || !szs || !kp)
        goto out_all;
    size_t m = gather_valid(keys, n, idx, st);
    size_t mm = 0;
    for (size_t j = 0; j < m; j++) {
        size_t i = idx[j];
        if (sizes[i] == 0 || bufs[i] == NULL) {
            st[i] = KVP_ERR_INVALID_ARG;
            continue;
        }
        idx[mm] = i;
        kp[mm].data = (uint8_t *)keys[i];
        kp[mm].len = strlen(keys[i]);
        szs[mm] = sizes[i];
        mm++;
    }
    m = mm;
    if (m == 0) {
        rc = KVP_OK;
        goto done;
    }

    Kvpool__PutConfig pc = KVPOOL__PUT_CONFIG__INIT;
    pc.replica_num = cfg.replica_num;
    pc.pin = cfg.pin;
    pc.soft_pin_ttl_s = cfg.soft_pin_ttl_s;
    pc.upsert = cfg.mode == KVP_PUT_UPSERT;
    pc.medium = cfg.medium != NULL ? (char *)cfg.medium : "";
    pc.preferred_segment = "";
    if (cfg.preferred_segment != NULL) {
        if (strcmp(cfg.preferred_segment, KVP_SEGMENT_LOCAL) == 0)
            pc.preferred_segment = c->seg_base ? c->seg_name : "";
        else
            pc.preferred_segment = (char *)cfg.preferred_segment;
    }
    Kvpool__PutStartRequest req = KVPOOL__PUT_START_REQUEST__INIT;
    req.keys = kp;
    req.n_keys = m;
    req.sizes = szs;
    req.n_sizes = m;
    req.config = &pc;
    uint8_t *resp;
    size_t rlen;
    rc = kvp_client_call(c, KVP_RPC_PUT_START, &req.base, &resp, &rlen);
    if (rc != KVP_OK)
        goto out_all;
    sr = kvpool__put_start_response__unpack(&kvp_scratch_pb, rlen, resp);
    if (sr == NULL || sr->status != KVP_OK || sr->n_results != m) {
        rc = sr == NULL || sr->status == KVP_OK ? KVP_ERR_PROTOCOL : sr->status;
        goto out_all;
    }
    kvp_client_peers_update(c, sr->segments, sr->n_segments);
    if (sr->message != NULL && sr->message[0] != '\0') {
        bool full = false;
        for (size_t j = 0; j < m; j++)
            full |= sr->results[j]->status == KVP_ERR_POOL_FULL;
        if (full) {
            KVP_LOG_WARN("put: %s", sr->message);
            kvp_api_fail("put: %s", sr->message);
        } else
            KVP_LOG_DEBUG("put: waiting for reads in flight: %s", sr->message);
    }

    size_t n_ops = 0;
    for (size_t j = 0; j < m; j++)
        if (sr->results[j]->status == KVP_OK)
            n_ops += sr->results[j]->n_replicas;
    ops = kvp_scratch_calloc(n_ops + 1, sizeof(*ops));
    op_key = kvp_scratch_alloc((n_ops + 1) * sizeof(*op_key));
    op_rep = kvp_scratch_alloc((n_ops + 1) * sizeof(*op_rep));
    crcs = kvp_scratch_alloc(m * sizeof(*crcs));
    masks = kvp_scratch_calloc(m + 1, sizeof(*masks));
    if (!ops || !op_key || !op_rep || !crcs || !masks) {
        rc = KVP_ERR_NOMEM;
        /* what PutStart reserved is revoked below through the revoke list */
    }
    size_t k = 0;
    for (size_t j = 0; j < m; j++) {
        Kvpool__PutStartResult *r = sr->results[j];
        st[idx[j]] = r->status;
        if (r->status != KVP_OK || ops == NULL)
            continue;
        if (r->n_replicas == 0 || r->n_replicas > 8) {
            st[idx[j]] = KVP_ERR_PROTOCOL;
            continue;
        }
        /* device memory: the CPU cannot checksum it afterwards, so every
         * replica's staged transfer computes the CRC on the way */
        bool gpu = kvp_transfer_mem_kind(&c->xfer, bufs[idx[j]], sizes[idx[j]]) == KVP_MEM_CUDA;
        for (size_t q = 0; q < r->n_replicas; q++) {
            kvp_peer_t *peer = kvp_client_peer_get(c, r->replicas[q]->segment_id);
            if (peer == NULL)
                continue; /* an unknown segment: that replica is not written */
            ops[k] = (kvp_xfer_op_t){.kind = KVP_XFER_WRITE,
                                     .local = (void *)bufs[idx[j]],
                                     .offset = r->replicas[q]->offset,
                                     .length = r->replicas[q]->length,
                                     .peer = peer,
                                     .want_crc = q == 0 || gpu};
            op_rep[k] = (unsigned)q;
            op_key[k++] = j;
        }
    }
    if (ops != NULL) {
        kvp_transfer_run(&c->xfer, ops, k);
        /* best effort per replica: a key is stored if any replica was written */
        int32_t *fail = kvp_scratch_alloc(m * sizeof(*fail));
        for (size_t j = 0; fail != NULL && j < m; j++)
            fail[j] = KVP_ERR_UNKNOWN_SEGMENT; /* stays so when no replica had a known peer */
        bool *have_crc = kvp_scratch_calloc(m + 1, sizeof(*have_crc));
        for (size_t q = 0; q < k; q++) {
            size_t j = op_key[q];
            if (ops[q].status == KVP_OK) {
                masks[j] |= 1u << op_rep[q];
                if (ops[q].want_crc && have_crc != NULL) {
                    crcs[j] = ops[q].crc;
                    have_crc[j] = true;
                }
            } else {
                if (fail != NULL)
                    fail[j] = ops[q].status;
                KVP_LOG_WARN("put %s: write to segment %s failed: %s", keys[idx[j]],
                             ops[q].peer->name, kvp_strerror(ops[q].status));
                kvp_api_fail_key(keys[idx[j]], "put %s: write to segment %s failed: %s",
                                 keys[idx[j]], ops[q].peer->name, kvp_strerror(ops[q].status));
                atomic_store(&ops[q].peer->failed_ms, kvp_now_ms());
            }
            kvp_peer_unref(ops[q].peer);
        }
        for (size_t j = 0; j < m; j++) {
            if (st[idx[j]] != KVP_OK)
                continue;
            if (masks[j] == 0) {
                st[idx[j]] = fail != NULL ? fail[j] : KVP_ERR_NOMEM;
                if (st[idx[j]] == KVP_ERR_UNKNOWN_SEGMENT)
                    kvp_api_fail_key(keys[idx[j]],
                                     "put %s: the master placed it only on segments this client "
                                     "has no descriptor for",
                                     keys[idx[j]]);
                else if (sr->results[j]->n_replicas > 1 && fail != NULL)
                    st[idx[j]] = KVP_ERR_NO_REPLICA; /* every copy failed (why: logged) */
            } else if (have_crc == NULL || !have_crc[j]) {
                /* the replica that computed the CRC on the way failed: compute it here
                 * (host memory only: device buffers had every replica compute it) */
                crcs[j] = kvp_crc32c(0, bufs[idx[j]], sizes[idx[j]]);
            }
        }
    }
    /* finish: PutEnd for keys fully written, PutRevoke for the rest of what started */
    size_t *end_idx = kvp_scratch_alloc(m * sizeof(*end_idx));
    size_t *rev_idx = kvp_scratch_alloc(m * sizeof(*rev_idx));
    uint32_t *end_crc = kvp_scratch_alloc(m * sizeof(*end_crc));
    uint32_t *end_mask = kvp_scratch_alloc(m * sizeof(*end_mask));
    if (end_idx && rev_idx && end_crc && end_mask) {
        size_t ne = 0, nr = 0;
        for (size_t j = 0; j < m; j++) {
            if (sr->results[j]->status != KVP_OK)
                continue;
            if (st[idx[j]] == KVP_OK && ops != NULL) {
                end_idx[ne] = idx[j];
                end_mask[ne] = masks[j];
                if (replicas_written != NULL)
                    replicas_written[idx[j]] = (uint32_t)__builtin_popcount(masks[j]);
                end_crc[ne++] = crcs[j];
            } else {
                rev_idx[nr++] = idx[j];
            }
        }
        end_or_revoke(c, KVP_RPC_PUT_END, keys, end_idx, end_crc, end_mask, ne, st);
        end_or_revoke(c, KVP_RPC_PUT_REVOKE, keys, rev_idx, NULL, NULL, nr, st);
    } else {
        for (size_t j = 0; j < m; j++)
            if (st[idx[j]] == KVP_OK)
                st[idx[j]] = KVP_ERR_NOMEM;
        /* unfinished PENDING objects are reclaimed when they time out or we disconnect */
    }
    if (rc == KVP_ERR_NOMEM)
        goto out_all;
done:
    for (size_t i = 0; i < n; i++)
        results[i] = (kvp_status_t)st[i];
    rc = first_error(st, n);
    goto out;
out_all:
    for (size_t i = 0; i < n; i++)
        results[i] = st && st[i] != KVP_OK ? (kvp_status_t)st[i] : rc;
    if (rc == KVP_OK)
        rc = st ? first_error(st, n) : KVP_ERR_NOMEM;
out:
    return rc;
}

/* One attempt; what it took from the thread's scratch arena is given back (the
 * busy-pool retries call it many times within one public call). */
static kvp_status_t put_batch_once(kvp_client_t *c, const char *const *keys,
                                   const void *const *bufs, const size_t *sizes, size_t n,
                                   const kvp_put_config_t *config, kvp_status_t *results,
                                   uint32_t *replicas_written)
{
    size_t mark = kvp_scratch_mark();
    kvp_status_t rc =
        put_batch_once_body(c, keys, bufs, sizes, n, config, results, replicas_written);
    kvp_scratch_release(mark);
    return rc;
}

/*
 * A put whose keys found the pool full with the room held by reads in flight
 * (KVP_ERR_POOL_BUSY) waits for those reads to end and asks again, for at
 * most the RPC timeout; then the keys get KVP_ERR_POOL_FULL. Only the busy
 * keys are retried; the allocations here are on that rare path only.
 */
static kvp_status_t batch_put_from_ex_impl(kvp_client_t *c, const char *const *keys,
                                           const void *const *bufs, const size_t *sizes, size_t n,
                                           const kvp_put_config_t *config, kvp_status_t *results,
                                           uint32_t *replicas_written)
{
    if (results == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    /* what the call leaves untouched (arguments refused outright) reads as refused */
    for (size_t i = 0; i < n; i++)
        results[i] = KVP_ERR_INVALID_ARG;
    kvp_status_t rc = put_batch_once(c, keys, bufs, sizes, n, config, results, replicas_written);
    size_t nb = 0;
    for (size_t i = 0; rc != KVP_OK && i < n; i++)
        nb += results[i] == KVP_ERR_POOL_BUSY;
    if (nb == 0) {
        if (rc != KVP_OK && rc != KVP_ERR_INVALID_ARG)
            kvp_api_fail_keys("put", keys, (const int32_t *)results, n);
        return rc;
    }
    uint64_t deadline =
        kvp_now_ms() + (c->params.rpc_timeout_ms ? c->params.rpc_timeout_ms : 10000);
    size_t *at = kvp_scratch_alloc(nb * sizeof(*at));
    const char **k2 = kvp_scratch_alloc(nb * sizeof(*k2));
    const void **b2 = kvp_scratch_alloc(nb * sizeof(*b2));
    size_t *s2 = kvp_scratch_alloc(nb * sizeof(*s2));
    kvp_status_t *r2 = kvp_scratch_alloc(nb * sizeof(*r2));
    uint32_t *w2 = kvp_scratch_alloc(nb * sizeof(*w2));
    unsigned sleep_ms = 1;
    while (nb > 0 && at && k2 && b2 && s2 && r2 && w2 && kvp_now_ms() < deadline) {
        usleep(sleep_ms * 1000u);
        sleep_ms = KVP_MIN(sleep_ms * 2, 8u); /* room held by offloads comes back within ms */
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            if (results[i] != KVP_ERR_POOL_BUSY)
                continue;
            at[m] = i;
            k2[m] = keys[i];
            b2[m] = bufs[i];
            s2[m++] = sizes[i];
        }
        put_batch_once(c, k2, b2, s2, m, config, r2, w2);
        nb = 0;
        for (size_t j = 0; j < m; j++) {
            results[at[j]] = r2[j];
            if (replicas_written != NULL)
                replicas_written[at[j]] = w2[j];
            nb += r2[j] == KVP_ERR_POOL_BUSY;
        }
    }
    rc = KVP_OK;
    for (size_t i = 0; i < n; i++) {
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
    return (kvp_status_t)kvp_api_leave(
        batch_put_from_ex_impl(c, keys, bufs, sizes, n, config, results, replicas_written), "put");
}

static kvp_status_t put_impl(kvp_client_t *c, const char *key, const void *buf, size_t len,
                             const kvp_put_config_t *config)
{
    kvp_status_t r = KVP_OK; /* stays OK if the batch refused its arguments outright */
    kvp_status_t st = kvp_batch_put_from(c, &key, &buf, &len, 1, config, &r);
    return st == KVP_OK ? KVP_OK : (r != KVP_OK ? r : st);
}

kvp_status_t kvp_put(kvp_client_t *c, const char *key, const void *buf, size_t len,
                     const kvp_put_config_t *config)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(put_impl(c, key, buf, len, config), "put");
}

/* ---------------- get ---------------- */

/* How long a peer whose transfer failed is tried after the others. */
#define PEER_SUSPECT_MS 10000

/*
 * Order replicas: same host (shm) first, then other DRAM peers with no recent
 * transfer failure, then SSD segments, then the recently failed ones (they are
 * still tried, last).
 */
static void order_replicas(kvp_client_t *c, Kvpool__GetReplicaResult *r, size_t *order)
{
    size_t n = KVP_MIN(r->n_replicas, (size_t)8);
    unsigned rank[8];
    uint64_t now = kvp_now_ms();
    for (size_t q = 0; q < n; q++) {
        kvp_peer_t *p = kvp_client_peer_get(c, r->replicas[q]->segment_id);
        rank[q] = 1;
        if (p != NULL) {
            uint64_t failed = atomic_load(&p->failed_ms);
            if (failed != 0 && now - failed < PEER_SUSPECT_MS)
                rank[q] = 3;
            else if (kvp_transfer_route(&c->xfer, p) == KVP_TRANSPORT_SHM)
                rank[q] = 0;
            else if (p->ssd)
                rank[q] = 2; /* DRAM anywhere before SSD */
            kvp_peer_unref(p);
        }
    }
    size_t k = 0;
    for (unsigned want = 0; want < 4; want++)
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
            kvp_client_lease_release(c, ids, k);
            k = 0;
        }
    }
    kvp_client_lease_release(c, ids, k);
}

static kvp_status_t batch_get_into_impl(kvp_client_t *c, const char *const *keys, void *const *bufs,
                                        const size_t *caps, size_t n, int64_t *results)
{
    if (c == NULL || keys == NULL || bufs == NULL || caps == NULL || results == NULL ||
        n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    if (n == 0)
        return KVP_OK;
    int32_t *st = kvp_scratch_alloc(n * sizeof(*st));
    size_t *idx = kvp_scratch_alloc(n * sizeof(*idx));
    kvp_xfer_op_t *ops = NULL;
    size_t *op_key = NULL;
    size_t(*order)[8] = NULL;
    unsigned *tried = NULL;
    Kvpool__GetReplicaListResponse *gr = NULL;
    kvp_status_t rc = KVP_ERR_NOMEM;
    if (!st || !idx)
        goto out;
    size_t m = gather_valid(keys, n, idx, st);
    size_t mm = 0;
    for (size_t j = 0; j < m; j++) {
        if (bufs[idx[j]] == NULL)
            st[idx[j]] = KVP_ERR_INVALID_ARG;
        else
            idx[mm++] = idx[j];
    }
    m = mm;
    if (m > 0) {
        uint8_t *resp;
        size_t rlen;
        /* the lease runs from the master's reply; measuring from before the request
         * makes the client's view of it conservative */
        uint64_t lease_start = kvp_now_ms();
        rc = keys_call(c, KVP_RPC_GET_REPLICA_LIST, keys, idx, m, false, &resp, &rlen);
        if (rc != KVP_OK)
            goto out;
        gr = kvpool__get_replica_list_response__unpack(&kvp_scratch_pb, rlen, resp);
        if (gr == NULL || gr->status != KVP_OK || gr->n_results != m) {
            rc = gr == NULL || gr->status == KVP_OK ? KVP_ERR_PROTOCOL : gr->status;
            goto out;
        }
        kvp_client_peers_update(c, gr->segments, gr->n_segments);
        ops = kvp_scratch_calloc(m, sizeof(*ops));
        op_key = kvp_scratch_alloc(m * sizeof(*op_key));
        order = kvp_scratch_alloc(m * sizeof(*order));
        tried = kvp_scratch_calloc(m, sizeof(*tried));
        rc = KVP_ERR_NOMEM;
        if (!ops || !op_key || !order || !tried)
            goto out;
        for (size_t j = 0; j < m; j++) {
            Kvpool__GetReplicaResult *r = gr->results[j];
            st[idx[j]] = r->status;
            if (r->status != KVP_OK)
                continue;
            if (r->n_replicas == 0 || r->n_replicas > 8) {
                st[idx[j]] = KVP_ERR_PROTOCOL;
                continue;
            }
            if (r->size > caps[idx[j]]) {
                st[idx[j]] = KVP_ERR_BUFFER_TOO_SMALL;
                continue;
            }
            order_replicas(c, r, order[j]);
        }
        /* one round per replica rank: keys whose read failed try their next replica */
        for (unsigned round = 0; round < 8; round++) {
            size_t k = 0;
            for (size_t j = 0; j < m; j++) {
                Kvpool__GetReplicaResult *r = gr->results[j];
                if (r->status != KVP_OK || tried[j] != round || round >= r->n_replicas)
                    continue;
                if (st[idx[j]] != KVP_OK && round == 0)
                    continue; /* too small, bad reply: no transfer at all */
                if (round > 0 && st[idx[j]] == KVP_OK)
                    continue; /* done */
                Kvpool__Replica *rep = r->replicas[order[j][round]];
                kvp_peer_t *peer = kvp_client_peer_get(c, rep->segment_id);
                tried[j]++;
                if (peer == NULL) {
                    st[idx[j]] = KVP_ERR_UNKNOWN_SEGMENT;
                    kvp_api_fail_key(keys[idx[j]],
                                     "get %s: replica on segment %#llx, which this client has no "
                                     "descriptor for",
                                     keys[idx[j]], (unsigned long long)rep->segment_id);
                    continue;
                }
                ops[k] = (kvp_xfer_op_t){.kind = KVP_XFER_READ,
                                         .local = bufs[idx[j]],
                                         .offset = rep->offset,
                                         .length = r->size,
                                         .peer = peer,
                                         .want_crc = c->params.verify_crc != 0};
                op_key[k++] = j;
            }
            if (k == 0)
                break;
            kvp_transfer_run(&c->xfer, ops, k);
            bool lease_over =
                gr->lease_ttl_ms > 0 && kvp_now_ms() - lease_start >= gr->lease_ttl_ms;
            for (size_t q = 0; q < k; q++) {
                size_t j = op_key[q];
                kvp_status_t s = ops[q].status;
                if (s == KVP_OK && lease_over) {
                    /* the extent may have been reused after the lease: do not trust it */
                    KVP_LOG_WARN("get %s: transfer outlasted the %u ms read lease", keys[idx[j]],
                                 gr->lease_ttl_ms);
                    s = KVP_ERR_LEASE_EXPIRED;
                }
                if (s == KVP_OK && ops[q].want_crc && ops[q].crc != gr->results[j]->crc32c) {
                    KVP_LOG_WARN("get %s: checksum mismatch reading from segment %s", keys[idx[j]],
                                 ops[q].peer->name);
                    kvp_api_fail_key(keys[idx[j]],
                                     "get %s: checksum mismatch reading from segment %s",
                                     keys[idx[j]], ops[q].peer->name);
                    s = KVP_ERR_CHECKSUM;
                } else if (s != KVP_OK) {
                    KVP_LOG_WARN("get %s: read from segment %s failed: %s", keys[idx[j]],
                                 ops[q].peer->name, kvp_strerror(s));
                    kvp_api_fail_key(keys[idx[j]], "get %s: read from segment %s failed: %s",
                                     keys[idx[j]], ops[q].peer->name, kvp_strerror(s));
                    if (s != KVP_ERR_LEASE_EXPIRED)
                        atomic_store(&ops[q].peer->failed_ms, kvp_now_ms());
                }
                st[idx[j]] = s;
                kvp_peer_unref(ops[q].peer);
            }
        }
        /* an object with several copies, none of which could be read: say so (each
         * copy's own failure was logged and the first recorded for last_error) */
        for (size_t j = 0; gr != NULL && j < m; j++) {
            Kvpool__GetReplicaResult *r = gr->results[j];
            int32_t s = st[idx[j]];
            if (r->status == KVP_OK && r->n_replicas > 1 && tried[j] >= r->n_replicas &&
                s != KVP_OK && s != KVP_ERR_CHECKSUM && s != KVP_ERR_LEASE_EXPIRED &&
                s != KVP_ERR_BUFFER_TOO_SMALL && s != KVP_ERR_PROTOCOL)
                st[idx[j]] = KVP_ERR_NO_REPLICA;
        }
    }
    release_leases(c, gr);
    kvp_api_fail_keys("get", keys, st, n);
    for (size_t i = 0; i < n; i++)
        results[i] = st[i];
    for (size_t j = 0; j < m; j++)
        if (st[idx[j]] == KVP_OK)
            results[idx[j]] = (int64_t)gr->results[j]->size;
    rc = first_error(st, n);
    return rc;
out:
    release_leases(c, gr);
    for (size_t i = 0; i < n; i++)
        results[i] = st && st[i] != KVP_OK ? st[i] : rc;
    return rc;
}

kvp_status_t kvp_batch_get_into(kvp_client_t *c, const char *const *keys, void *const *bufs,
                                const size_t *caps, size_t n, int64_t *results)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(batch_get_into_impl(c, keys, bufs, caps, n, results), "get");
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
static kvp_status_t statuses_call(kvp_client_t *c, uint16_t method, const char *const *keys,
                                  size_t n, bool force, int32_t *st)
{
    size_t *idx = kvp_scratch_alloc((n ? n : 1) * sizeof(*idx));
    if (idx == NULL)
        return KVP_ERR_NOMEM;
    size_t m = gather_valid(keys, n, idx, st);
    kvp_status_t rc = KVP_OK;
    if (m > 0) {
        uint8_t *resp;
        size_t rlen;
        rc = keys_call(c, method, keys, idx, m, force, &resp, &rlen);
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
        kvp_api_fail_keys(method == KVP_RPC_REMOVE ? "remove" : "exist", keys, st, n);
    return rc;
}

static kvp_status_t batch_is_exist_impl(kvp_client_t *c, const char *const *keys, size_t n,
                                        int *results, size_t *prefix_len_p)
{
    if (c == NULL || keys == NULL || results == NULL || n > KVP_MAX_BATCH)
        return KVP_ERR_INVALID_ARG;
    int32_t *st = kvp_scratch_alloc((n ? n : 1) * sizeof(*st));
    kvp_status_t rc = st ? statuses_call(c, KVP_RPC_EXIST, keys, n, false, st) : KVP_ERR_NOMEM;
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
    kvp_status_t rc = st ? statuses_call(c, KVP_RPC_REMOVE, keys, n, force, st) : KVP_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        results[i] = rc == KVP_OK ? (kvp_status_t)st[i] : rc;
    if (rc == KVP_OK)
        rc = first_error(st, n);
    return rc;
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
    return out;
}

int64_t kvp_get_size(kvp_client_t *c, const char *key)
{
    kvp_api_enter();
    return kvp_api_leave(get_size_impl(c, key), "get_size");
}

static kvp_status_t pool_stat_impl(kvp_client_t *c, kvp_pool_stat_t **stat_p)
{
    if (c == NULL || stat_p == NULL)
        return KVP_ERR_INVALID_ARG;
    Kvpool__StatRequest req = KVPOOL__STAT_REQUEST__INIT;
    uint8_t *resp;
    size_t rlen;
    kvp_status_t rc = kvp_client_call(c, KVP_RPC_STAT, &req.base, &resp, &rlen);
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
