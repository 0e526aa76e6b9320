/*
 * ssd_owner.c - this client's SSD segment: its file (ssd_file.c), its data
 * server (ssd_server.c), its mount, and the worker that does the master's
 * tasks for it.
 *
 * Design (docs/architecture.md, "Tiers"):
 *   - The SSD segment has its own master connection (a kvp_mconn of its
 *     own): the mount is bound to it, and its on_ready, run on every new
 *     connection before anything else, mounts the segment and offers the
 *     file's objects to the master (Adopt, in batches: control/record_sync.c); the ones the
 *     master refuses (removed, overwritten meanwhile) are forgotten in the
 *     file. So a restart (kill -9 included), a master restart and a lost
 *     connection all come back the same way, with the objects.
 *   - One worker thread asks for tasks (SsdTasks: a long poll the master
 *     answers as soon as it queues one) and reports the finished ones with
 *     its next ask. OFFLOAD: READ the object from its DRAM segment with the
 *     transfer engine into an aligned staging buffer (checking its CRC32C),
 *     write it with io_uring (O_DIRECT), record the entries (data synced
 *     first, then the entries: ssd_file.c). PROMOTE: read the extent from
 *     the file, check the CRC32C, WRITE it to the DRAM extent. RECORD (a
 *     put straight to SSD, written through the data server): record; on a
 *     segment whose objects have been two tenants' (their keys' prefixes),
 *     first read the extent back and check it against the CRC32C its writer
 *     declared: a put ended without writing would otherwise read back what
 *     the extent held before, another tenant's removed object (docs/security.md,
 *     "An object ended unwritten"); one that does not match is not recorded,
 *     its extent is zeroed, its reads refused and its offset reported bad.
 *     FORGET: clear the entry.
 *   - Gets from other clients never come here: they READ the SSD segment
 *     through its data server like any tcp segment.
 *
 * Thread: the worker; create/destroy from the client's thread.
 */
#include "client/ssd/ssd_owner.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/control/mconn.h"
#include "client/control/record_sync.h"
#include "client/ssd/dfs.h"
#include "client/ssd/ssd_io.h"
#include "client/ssd/ssd_server.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/rpc.h"
#include "kvpool.pb-c.h"

/* Tasks asked for per round, staging per copy batch. */
#define TASKS_PER_ASK 64u
#define STAGING_BYTES (64u << 20)

struct kvp_ssd_owner {
    uint64_t client_id;
    char tenant[64]; /* the segment's tenant (MountRequest.tenant); "": shared */
    kvp_transfer_t *xfer;
    kvp_peers_t *peers;
    kvp_ssd_file_t *file;
    kvp_data_server_t *srv;
    kvp_mconn_t *mc;
    char name[300];
    char endpoint[280];
    bool dfs; /* a DFS segment's shard file (medium "dfs") */
    _Atomic uint64_t seg_id;
    _Atomic bool stop;
    pthread_t thread;
    bool started;
    /* the tenants of the keys seen (worker; at create, the file's): two, and each RECORD is
     * checked */
    bool tenants, mixed;
    uint8_t first_len;
    char first[64];
    /* worker state */
    kvp_ssd_io_t *io;
    uint8_t *staging;
    Kvpool__SsdTaskResult *done;
    Kvpool__SsdTaskResult **donep;
    size_t n_done;
};

/* ---- mount and adoption (on_ready, on the new connection) ---- */

typedef struct entries {
    kvp_record_entry_t *e;
    size_t n, cap;
    bool nomem;
} entries_t;

/* Keys are copied: the file's table may change while they are offered. */
static void collect_cb(const kvp_ssd_entry_t *e, void *arg)
{
    entries_t *es = arg;
    if (es->nomem)
        return;
    if (es->n == es->cap) {
        size_t cap = es->cap ? es->cap * 2 : 1024;
        kvp_record_entry_t *ne = realloc(es->e, cap * sizeof(*ne));
        if (ne == NULL) {
            es->nomem = true;
            return;
        }
        es->e = ne;
        es->cap = cap;
    }
    char *k = malloc(e->key_len ? e->key_len : 1);
    if (k == NULL) {
        es->nomem = true;
        return;
    }
    memcpy(k, e->key, e->key_len);
    es->e[es->n++] = (kvp_record_entry_t){.key = k,
                                          .key_len = e->key_len,
                                          .version = e->version,
                                          .offset = e->offset,
                                          .size = e->size,
                                          .crc32c = e->crc32c};
}

static int newest_first(const void *a, const void *b)
{
    const kvp_record_entry_t *x = a, *y = b;
    return x->version < y->version ? 1 : x->version > y->version ? -1 : 0;
}

static void forget_cb(void *arg, const kvp_record_entry_t *e)
{
    kvp_ssd_owner_t *o = arg;
    kvp_ssd_file_forget(o->file, e->offset, e->version);
}

/* Offer the file's objects, newest first; forget the refused ones. */
static kvp_status_t adopt(kvp_ssd_owner_t *o, kvp_mconn_t *m, kvp_chan_t *ch, uint64_t seg_id)
{
    entries_t es = {0};
    kvp_ssd_file_foreach(o->file, collect_cb, &es);
    if (es.nomem)
        es.n = 0; /* the offer still ends, so the segment takes new copies */
    if (es.n > 1)
        qsort(es.e, es.n, sizeof(*es.e), newest_first);
    size_t adopted = 0, refused = 0;
    kvp_status_t st = kvp_record_offer(m, ch, seg_id, es.e, es.n, forget_cb, o, &adopted, &refused);
    if (es.n > 0)
        KVP_LOG_INFO("SSD segment %s: %zu objects back in the pool, %zu refused (removed or "
                     "overwritten meanwhile) and forgotten%s",
                     o->name, adopted, refused, st == KVP_OK ? "" : " (offer cut short)");
    for (size_t i = 0; i < es.n; i++)
        free((char *)es.e[i].key);
    free(es.e);
    return es.nomem ? KVP_ERR_NOMEM : st;
}

static kvp_status_t on_ready(void *arg, kvp_mconn_t *m, kvp_chan_t *ch, bool first)
{
    (void)first;
    kvp_ssd_owner_t *o = arg;
    Kvpool__SegmentDesc d = KVPOOL__SEGMENT_DESC__INIT;
    d.name = o->name;
    d.medium = o->dfs ? "dfs" : "ssd";
    d.size = kvp_ssd_file_size(o->file);
    d.owner_client_id = o->client_id;
    d.host_id = o->xfer->host_id;
    d.tcp_endpoint = o->endpoint;
    d.shm_path = "";
    d.rdma_endpoint = "";
    Kvpool__MountRequest req = KVPOOL__MOUNT_REQUEST__INIT;
    req.client_id = o->client_id;
    req.segment = &d;
    req.adopting = true; /* the file's objects are offered next */
    req.tenant = o->tenant;
    uint8_t secret[KVP_PROVE_SECRET_LEN]; /* the master asks our server to prove it */
    kvp_data_server_proof(o->srv, o->name, secret);
    req.proof_secret.data = secret;
    req.proof_secret.len = sizeof(secret);
    size_t len = kvpool__mount_request__get_packed_size(&req);
    uint8_t *body = malloc(len ? len : 1), *resp = NULL;
    size_t rlen = 0;
    if (body != NULL)
        kvpool__mount_request__pack(&req, body);
    explicit_bzero(secret, sizeof(secret));
    if (body == NULL)
        return KVP_ERR_NOMEM;
    kvp_status_t st = kvp_mconn_ready_call(m, ch, KVP_RPC_MOUNT, body, len, &resp, &rlen);
    free(body);
    if (st != KVP_OK)
        return st;
    Kvpool__MountResponse *mr = kvpool__mount_response__unpack(NULL, rlen, resp);
    free(resp);
    if (mr == NULL)
        return KVP_ERR_PROTOCOL;
    st = mr->status;
    if (st != KVP_OK) {
        KVP_LOG_ERROR("master refused to mount SSD segment %s: %s (%s)", o->name, kvp_strerror(st),
                      mr->message);
        kvpool__mount_response__free_unpacked(mr, NULL);
        return st;
    }
    uint64_t id = mr->segment_id;
    /* the new key before the new id: no request for the new mount is served unchecked */
    kvp_data_server_set_grants(o->srv, mr->grant_key.data, mr->grant_key.len, mr->grant_epoch);
    kvpool__mount_response__free_unpacked(mr, NULL);
    kvp_data_server_set_id(o->srv, id);
    atomic_store(&o->seg_id, id);
    KVP_LOG_INFO("mounted SSD segment %s (%llu bytes, file %s) as %#llx", o->name,
                 (unsigned long long)kvp_ssd_file_size(o->file), kvp_ssd_file_path(o->file),
                 (unsigned long long)id);
    return adopt(o, m, ch, id);
}

/* ---- the worker ---- */

static void report(kvp_ssd_owner_t *o, uint64_t task_id, kvp_status_t status)
{
    Kvpool__SsdTaskResult *r = &o->done[o->n_done];
    kvpool__ssd_task_result__init(r);
    r->task_id = task_id;
    r->status = status;
    o->donep[o->n_done] = r;
    o->n_done++;
}

static uint64_t blocks(uint64_t size)
{
    return (size + KVP_SSD_BLOCK - 1) / KVP_SSD_BLOCK * KVP_SSD_BLOCK;
}

/* Note the tenant of a key (its prefix up to 0x1f; none: tenants are off). */
static void see_tenant(kvp_ssd_owner_t *o, const char *key, size_t len)
{
    const char *sep = memchr(key, 0x1f, len);
    if (sep == NULL)
        return;
    size_t n = (size_t)(sep - key) < sizeof(o->first) ? (size_t)(sep - key) : sizeof(o->first);
    if (!o->tenants) {
        o->tenants = true;
        o->first_len = (uint8_t)n;
        memcpy(o->first, key, n);
        kvp_ssd_server_saw_tenants(o->srv);
    } else if (!o->mixed && (n != o->first_len || memcmp(o->first, key, n) != 0)) {
        o->mixed = true;
    }
}

static void see_entry(const kvp_ssd_entry_t *e, void *arg)
{
    see_tenant(arg, e->key, e->key_len);
}

/* Once two tenants' objects were seen: do the RECORD entries' extents hold the bytes their
 * writers declared (rec[i], KVP_ERR_CHECKSUM: not, the extent zeroed; reads of it refused
 * and its offset reported bad)? Read back through the staging buffer, in batches. */
static void check_written(kvp_ssd_owner_t *o, const kvp_ssd_entry_t *ent, size_t n,
                          kvp_status_t *rec)
{
    int fd = kvp_ssd_file_fd(o->file);
    uint64_t base = kvp_ssd_file_data_base(o->file);
    for (size_t i = 0; i < n; i++)
        rec[i] = KVP_OK;
    for (size_t i = 0; i < n && o->mixed;) {
        kvp_ssd_iov_t iov[TASKS_PER_ASK];
        size_t k = 0;
        uint64_t off = 0;
        for (; i + k < n && off + blocks(ent[i + k].size) <= STAGING_BYTES; k++) {
            iov[k] = (kvp_ssd_iov_t){.buf = o->staging + off,
                                     .file_off = base + ent[i + k].offset,
                                     .len = blocks(ent[i + k].size)};
            off += blocks(ent[i + k].size);
        }
        if (k == 0) { /* larger than the staging buffer: not checked (cannot be put) */
            i++;
            continue;
        }
        kvp_ssd_io_rw(o->io, fd, false, iov, k);
        kvp_ssd_iov_t zero[TASKS_PER_ASK];
        size_t nz = 0;
        for (size_t j = 0; j < k; j++) {
            const kvp_ssd_entry_t *e = &ent[i + j];
            if (iov[j].status != KVP_OK) {
                rec[i + j] = iov[j].status;
                continue;
            }
            if (kvp_crc32c(0, iov[j].buf, e->size) == e->crc32c)
                continue;
            rec[i + j] = KVP_ERR_CHECKSUM;
            memset(iov[j].buf, 0, iov[j].len);
            zero[nz++] = iov[j];
            kvp_ssd_server_unwritten(o->srv, e->offset, e->version);
            KVP_LOG_WARN_LIMITED("SSD segment %s: the object at offset %llu (%llu bytes, version "
                                 "%llu) ended without the bytes its writer declared (CRC "
                                 "mismatch): not recorded, never served, its extent zeroed",
                                 o->name, (unsigned long long)e->offset,
                                 (unsigned long long)e->size, (unsigned long long)e->version);
        }
        if (nz > 0)
            kvp_ssd_io_rw(o->io, fd, true, zero, nz);
        i += k;
    }
}

/* READ tasks t[i0..i1) from their DRAM segments into the staging buffer at off[i], with
 * their CRCs checked (st[i]). */
static void offload_read(kvp_ssd_owner_t *o, Kvpool__SsdTask **t, const uint64_t *off,
                         kvp_status_t *st, size_t i0, size_t i1)
{
    kvp_xfer_op_t run[TASKS_PER_ASK];
    kvp_peer_t *peers[TASKS_PER_ASK];
    size_t map[TASKS_PER_ASK], nr = 0;
    for (size_t i = i0; i < i1; i++) {
        uint64_t len = blocks(t[i]->size);
        memset(o->staging + off[i] + t[i]->size, 0, len - t[i]->size);
        peers[i] = kvp_peers_get(o->peers, t[i]->dram->segment_id);
        st[i] = KVP_ERR_UNKNOWN_SEGMENT;
        if (peers[i] == NULL)
            continue;
        map[nr] = i;
        run[nr++] = (kvp_xfer_op_t){.kind = KVP_XFER_READ,
                                    .local = o->staging + off[i],
                                    .offset = t[i]->dram->offset,
                                    .length = t[i]->size,
                                    .peer = peers[i],
                                    .want_crc = true,
                                    .grant = KVP_XFER_GRANT(t[i]->dram->grant)};
    }
    if (nr > 0)
        kvp_transfer_run(o->xfer, run, nr);
    for (size_t j = 0; j < nr; j++) {
        size_t i = map[j];
        st[i] = run[j].status;
        if (st[i] == KVP_OK && run[j].crc != t[i]->crc32c)
            st[i] = KVP_ERR_CHECKSUM; /* the DRAM extent no longer holds this object */
        kvp_peer_unref(peers[i]);
    }
}

/*
 * OFFLOAD tasks t[0..n) whose blocks fit the staging buffer: DRAM -> staging -> file ->
 * recorded. Pipelined: the file writes (io_uring, KVP_SSD_IO_DEPTH chunks of 1 MiB in
 * flight) of the objects already read go on while the next objects are read from DRAM,
 * so the disk does not wait for the memory copies; then one record call (data synced,
 * entries written and synced) for the batch.
 */
static void offload_batch(kvp_ssd_owner_t *o, Kvpool__SsdTask **t, size_t n)
{
    kvp_status_t st[TASKS_PER_ASK], rec[TASKS_PER_ASK];
    uint64_t off[TASKS_PER_ASK];
    kvp_ssd_iov_t ring[KVP_SSD_IO_DEPTH];
    size_t ring_task[KVP_SSD_IO_DEPTH];
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        off[i] = at;
        at += blocks(t[i]->size);
    }
    int fd = kvp_ssd_file_fd(o->file);
    uint64_t base = kvp_ssd_file_data_base(o->file);
    size_t read_upto = 0, wr = 0, head = 0, inflight = 0;
    uint64_t wr_at = 0; /* next byte of task wr to write */
    for (;;) {
        /* keep the ring full with chunks of objects already read */
        while (inflight < KVP_SSD_IO_DEPTH && wr < read_upto) {
            if (st[wr] != KVP_OK || wr_at >= blocks(t[wr]->size)) {
                wr++;
                wr_at = 0;
                continue;
            }
            uint64_t len = KVP_MIN(blocks(t[wr]->size) - wr_at, (uint64_t)KVP_SSD_IO_CHUNK);
            size_t k = (head + inflight) % KVP_SSD_IO_DEPTH;
            ring[k] = (kvp_ssd_iov_t){.buf = o->staging + off[wr] + wr_at,
                                      .file_off = base + t[wr]->ssd_offset + wr_at,
                                      .len = len};
            ring_task[k] = wr;
            if (kvp_ssd_io_start(o->io, fd, true, &ring[k]) != KVP_OK) {
                st[wr] = KVP_ERR_IO;
                continue;
            }
            inflight++;
            wr_at += len;
        }
        if (read_upto < n && (inflight == KVP_SSD_IO_DEPTH || wr >= read_upto)) {
            /* the next few objects (about the ring's worth) while the disk writes */
            size_t i1 = read_upto;
            uint64_t bytes = 0;
            while (i1 < n && (i1 == read_upto || bytes < KVP_SSD_IO_DEPTH * KVP_SSD_IO_CHUNK))
                bytes += blocks(t[i1++]->size);
            offload_read(o, t, off, st, read_upto, i1);
            read_upto = i1;
            continue;
        }
        if (inflight > 0) {
            kvp_status_t ws = kvp_ssd_io_wait(o->io, &ring[head]);
            if (ws != KVP_OK && st[ring_task[head]] == KVP_OK)
                st[ring_task[head]] = ws;
            head = (head + 1) % KVP_SSD_IO_DEPTH;
            inflight--;
            continue;
        }
        if (read_upto == n && wr >= n)
            break;
    }
    kvp_ssd_entry_t ent[TASKS_PER_ASK];
    size_t ne = 0, eidx[TASKS_PER_ASK];
    for (size_t i = 0; i < n; i++) {
        if (st[i] != KVP_OK)
            continue;
        ent[ne] = (kvp_ssd_entry_t){.version = t[i]->version,
                                    .offset = t[i]->ssd_offset,
                                    .size = t[i]->size,
                                    .crc32c = t[i]->crc32c,
                                    .key_len = (uint16_t)t[i]->key.len,
                                    .key = (const char *)t[i]->key.data};
        eidx[ne++] = i;
    }
    if (ne > 0) {
        kvp_ssd_file_record(o->file, ent, ne, rec);
        for (size_t k = 0; k < ne; k++) {
            st[eidx[k]] = rec[k];
            if (rec[k] == KVP_OK)
                kvp_ssd_server_recorded(o->srv, ent[k].offset, ent[k].version);
        }
    }
    for (size_t i = 0; i < n; i++)
        report(o, t[i]->task_id, st[i]);
}

/* PROMOTE tasks t[0..n): file -> staging (CRC checked) -> DRAM. */
static void promote_batch(kvp_ssd_owner_t *o, Kvpool__SsdTask **t, size_t n)
{
    kvp_ssd_iov_t iov[TASKS_PER_ASK];
    kvp_status_t st[TASKS_PER_ASK];
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        iov[i] = (kvp_ssd_iov_t){.buf = o->staging + off,
                                 .file_off = kvp_ssd_file_data_base(o->file) + t[i]->ssd_offset,
                                 .len = blocks(t[i]->size)};
        off += blocks(t[i]->size);
    }
    kvp_ssd_io_rw(o->io, kvp_ssd_file_fd(o->file), false, iov, n);
    kvp_xfer_op_t run[TASKS_PER_ASK];
    kvp_peer_t *peers[TASKS_PER_ASK];
    size_t map[TASKS_PER_ASK], nr = 0;
    for (size_t i = 0; i < n; i++) {
        st[i] = iov[i].status;
        peers[i] = NULL;
        if (st[i] == KVP_OK && kvp_crc32c(0, iov[i].buf, t[i]->size) != t[i]->crc32c)
            st[i] = KVP_ERR_CHECKSUM; /* the file's bytes are not the object's */
        if (st[i] != KVP_OK)
            continue;
        peers[i] = kvp_peers_get(o->peers, t[i]->dram->segment_id);
        if (peers[i] == NULL) {
            st[i] = KVP_ERR_UNKNOWN_SEGMENT;
            continue;
        }
        map[nr] = i;
        run[nr++] = (kvp_xfer_op_t){.kind = KVP_XFER_WRITE,
                                    .local = iov[i].buf,
                                    .offset = t[i]->dram->offset,
                                    .length = t[i]->size,
                                    .peer = peers[i],
                                    .grant = KVP_XFER_GRANT(t[i]->dram->grant)};
    }
    if (nr > 0)
        kvp_transfer_run(o->xfer, run, nr);
    for (size_t j = 0; j < nr; j++) {
        /* a DRAM side failure is not the SSD copy's fault */
        st[map[j]] = run[j].status == KVP_OK ? KVP_OK : KVP_ERR_TRANSPORT;
    }
    for (size_t i = 0; i < n; i++) {
        if (peers[i] != NULL)
            kvp_peer_unref(peers[i]);
        if (st[i] == KVP_ERR_CHECKSUM || st[i] == KVP_ERR_IO)
            KVP_LOG_WARN("SSD segment %s: object %.*s at offset %llu is unreadable: %s", o->name,
                         (int)t[i]->key.len, (const char *)t[i]->key.data,
                         (unsigned long long)t[i]->ssd_offset, kvp_strerror(st[i]));
        report(o, t[i]->task_id, st[i]);
    }
}

/* Tasks of one kind, cut into batches whose blocks fit the staging buffer. */
static void run_kind(kvp_ssd_owner_t *o, Kvpool__SsdTasksResponse *r, uint32_t kind)
{
    Kvpool__SsdTask *b[TASKS_PER_ASK];
    size_t n = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i <= r->n_tasks; i++) {
        Kvpool__SsdTask *t = i < r->n_tasks ? r->tasks[i] : NULL;
        if (t != NULL && t->kind != kind)
            continue;
        if (t != NULL && (t->dram == NULL || t->size == 0 || blocks(t->size) > STAGING_BYTES)) {
            report(o, t->task_id, KVP_ERR_INVALID_ARG);
            continue;
        }
        if (n > 0 && (t == NULL || n == TASKS_PER_ASK || bytes + blocks(t->size) > STAGING_BYTES)) {
            if (kind == KVP_SSD_TASK_OFFLOAD)
                offload_batch(o, b, n);
            else
                promote_batch(o, b, n);
            n = 0;
            bytes = 0;
        }
        if (t != NULL) {
            b[n++] = t;
            bytes += blocks(t->size);
        }
    }
}

static void run_tasks(kvp_ssd_owner_t *o, Kvpool__SsdTasksResponse *r)
{
    kvp_peers_update(o->peers, r->segments, r->n_segments);
    kvp_ssd_entry_t ent[TASKS_PER_ASK];
    uint64_t rid[TASKS_PER_ASK];
    size_t ne = 0;
    for (size_t i = 0; i < r->n_tasks; i++) {
        Kvpool__SsdTask *t = r->tasks[i];
        if (t->key.len > 0)
            see_tenant(o, (const char *)t->key.data, t->key.len);
        if (t->kind == KVP_SSD_TASK_FORGET) {
            kvp_ssd_file_forget(o->file, t->ssd_offset, t->version);
            kvp_ssd_server_forgot(o->srv, t->ssd_offset, t->version);
        } else if (t->kind == KVP_SSD_TASK_RECORD && ne < TASKS_PER_ASK) {
            ent[ne] = (kvp_ssd_entry_t){.version = t->version,
                                        .offset = t->ssd_offset,
                                        .size = t->size,
                                        .crc32c = t->crc32c,
                                        .key_len = (uint16_t)t->key.len,
                                        .key = (const char *)t->key.data};
            rid[ne++] = t->task_id;
        } else if (t->kind != KVP_SSD_TASK_OFFLOAD && t->kind != KVP_SSD_TASK_PROMOTE) {
            report(o, t->task_id, KVP_ERR_INVALID_ARG);
        }
    }
    if (ne > 0) {
        kvp_status_t checked[TASKS_PER_ASK];
        check_written(o, ent, ne, checked);
        kvp_ssd_entry_t ok[TASKS_PER_ASK];
        size_t nok = 0, at[TASKS_PER_ASK];
        for (size_t k = 0; k < ne; k++)
            if (checked[k] == KVP_OK) {
                at[nok] = k;
                ok[nok++] = ent[k];
            }
        kvp_status_t okrec[TASKS_PER_ASK];
        if (nok > 0)
            kvp_ssd_file_record(o->file, ok, nok, okrec);
        for (size_t j = 0; j < nok; j++)
            checked[at[j]] = okrec[j];
        for (size_t k = 0; k < ne; k++) {
            if (checked[k] == KVP_OK)
                kvp_ssd_server_recorded(o->srv, ent[k].offset, ent[k].version);
            report(o, rid[k], checked[k]);
        }
    }
    run_kind(o, r, KVP_SSD_TASK_OFFLOAD);
    run_kind(o, r, KVP_SSD_TASK_PROMOTE);
}

static void *worker(void *arg)
{
    kvp_ssd_owner_t *o = arg;
    while (!atomic_load(&o->stop)) {
        Kvpool__SsdTasksRequest req = KVPOOL__SSD_TASKS_REQUEST__INIT;
        req.segment_id = atomic_load(&o->seg_id);
        req.max_tasks = TASKS_PER_ASK;
        req.done = o->donep;
        req.n_done = o->n_done;
        uint64_t bad[KVP_SSD_SERVER_BAD_MAX];
        req.bad_offsets = bad;
        req.n_bad_offsets = kvp_ssd_server_take_bad(o->srv, bad, KVP_SSD_SERVER_BAD_MAX);
        size_t len = kvpool__ssd_tasks_request__get_packed_size(&req);
        uint8_t body[16384], *resp = NULL;
        size_t rlen = 0;
        kvp_status_t st = KVP_ERR_FRAME_TOO_LARGE;
        if (len <= sizeof(body)) {
            kvpool__ssd_tasks_request__pack(&req, body);
            st = kvp_mconn_call(o->mc, KVP_RPC_SSD_TASKS, body, len, &resp, &rlen);
        }
        /* reported, or lost with a connection whose segment (and its tasks) is gone */
        o->n_done = 0;
        Kvpool__SsdTasksResponse *r =
            st == KVP_OK ? kvpool__ssd_tasks_response__unpack(NULL, rlen, resp) : NULL;
        if (r == NULL || r->status != KVP_OK) {
            /* the master forgot our mount: a new connection mounts again (on_ready). Not
             * when the request named an id a reconnect has replaced meanwhile (the call was
             * sent again on the new connection as it was) */
            if (r != NULL && r->status == KVP_ERR_SEGMENT_GONE &&
                req.segment_id == atomic_load(&o->seg_id))
                kvp_mconn_disconnect(o->mc);
            if (r != NULL)
                kvpool__ssd_tasks_response__free_unpacked(r, NULL);
            if (!atomic_load(&o->stop) && req.segment_id == atomic_load(&o->seg_id))
                usleep(100 * 1000);
            continue;
        }
        run_tasks(o, r);
        kvpool__ssd_tasks_response__free_unpacked(r, NULL);
    }
    return NULL;
}

/* ---- life ---- */

kvp_status_t kvp_ssd_owner_start(const kvp_ssd_owner_params_t *p, kvp_ssd_owner_t **o_p,
                                 char *why_p, size_t why_len)
{
    kvp_ssd_owner_t *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return KVP_ERR_NOMEM;
    o->client_id = p->client_id;
    o->xfer = p->xfer;
    o->peers = p->peers;
    const char *host = p->host;
    char why[512] = "";
    kvp_ssd_open_params_t op = {.path = p->path,
                                .size = p->size,
                                .buffered_io = p->buffered_io,
                                .what = p->dfs_id != NULL ? "DFS shard file" : NULL};
    kvp_status_t st = kvp_ssd_file_open(&op, &o->file, why, sizeof(why));
    if (st != KVP_OK) {
        KVP_LOG_ERROR("SSD segment %s: %s", p->path, why);
        snprintf(why_p, why_len, "SSD segment %s: %s", p->path, why);
        free(o);
        return st;
    }
    uint16_t port = 0;
    st = kvp_ssd_server_create(o->file, host, 0, p->protected_mode, &o->srv, &port);
    if (st == KVP_OK) /* the tenants of what the file holds already */
        kvp_ssd_file_foreach(o->file, see_entry, o);
    /* With TLS to the master (principals, and tenants with its ACL), reads wait for their
     * object's RECORD from the first one on: the first tenant key the owner sees may be in
     * the very RECORD a read is waiting for (a put that wrote nothing over another tenant's
     * removed object: until it is checked, the extent still holds that object's bytes). */
    if (st == KVP_OK && p->tls != NULL)
        kvp_ssd_server_saw_tenants(o->srv);
    if (st == KVP_OK) {
        st = kvp_ssd_io_create(KVP_SSD_IO_DEPTH, &o->io);
        if (st == KVP_OK)
            kvp_ssd_io_set_stats(o->io, kvp_ssd_file_io_stats(o->file));
        o->staging = st == KVP_OK ? kvp_ssd_buf_alloc(STAGING_BYTES) : NULL;
        o->done = calloc(TASKS_PER_ASK, sizeof(*o->done));
        o->donep = calloc(TASKS_PER_ASK, sizeof(*o->donep));
        if (st == KVP_OK && (o->staging == NULL || o->done == NULL || o->donep == NULL))
            st = KVP_ERR_NOMEM;
    }
    if (st == KVP_OK) {
        snprintf(o->endpoint, sizeof(o->endpoint), "%s:%u", host, port);
        if (p->dfs_id != NULL) { /* host:port/dfs/<directory id>/<shard file> (dfs.h) */
            const char *base = strrchr(p->path, '/');
            o->dfs = true;
            snprintf(o->name, sizeof(o->name), "%s:%u" KVP_DFS_NAME_TAG "%s/%s", host, port,
                     p->dfs_id, base != NULL ? base + 1 : p->path);
        } else {
            snprintf(o->name, sizeof(o->name), "%s:%u/ssd", host, port);
        }
        snprintf(o->tenant, sizeof(o->tenant), "%s", p->tenant ? p->tenant : "");
        kvp_mconn_params_t mp = {.host = p->master_host,
                                 .port = p->master_port,
                                 .resolve = p->disc ? kvp_discovery_leader : NULL,
                                 .resolve_arg = p->disc,
                                 .timeout_ms = p->timeout_ms,
                                 .on_ready = on_ready,
                                 .arg = o,
                                 .tls = p->tls,
                                 .token = p->token};
        st = kvp_mconn_create(&mp, &o->mc);
        if (st == KVP_OK)
            st = kvp_mconn_connect(o->mc);
    }
    if (st == KVP_OK) {
        if (pthread_create(&o->thread, NULL, worker, o) != 0)
            st = KVP_ERR_SYSTEM;
        else
            o->started = true;
    }
    if (st != KVP_OK) {
        snprintf(why_p, why_len, "cannot mount SSD segment %s: %s", p->path, kvp_strerror(st));
        kvp_ssd_owner_stop(o);
        return st;
    }
    *o_p = o;
    return KVP_OK;
}

void kvp_ssd_owner_metrics(kvp_ssd_owner_t *o, kvp_metrics_t *m)
{
    const kvp_served_stats_t *sv = kvp_data_server_stats(o->srv);
    int tp = o->dfs ? KVP_METRICS_TP_DFS : KVP_METRICS_TP_SSD;
    for (int d = 0; d < 2; d++) {
        kvp_metrics_count_t *out = d == 0 ? &m->served[tp].put : &m->served[tp].get;
        out->ops = atomic_load_explicit(&sv->dir[d].ops, memory_order_relaxed);
        out->bytes = atomic_load_explicit(&sv->dir[d].bytes, memory_order_relaxed);
    }
    if (o->dfs) {
        m->refused_protected += kvp_data_server_refused(o->srv);
        m->refused_grant += kvp_data_server_grants_refused(o->srv);
        return;
    }
    const kvp_ssd_io_stats_t *io = kvp_ssd_file_io_stats(o->file);
    m->ssd_read.ops = atomic_load_explicit(&io->reads, memory_order_relaxed);
    m->ssd_read.bytes = atomic_load_explicit(&io->read_bytes, memory_order_relaxed);
    m->ssd_write.ops = atomic_load_explicit(&io->writes, memory_order_relaxed);
    m->ssd_write.bytes = atomic_load_explicit(&io->write_bytes, memory_order_relaxed);
    m->ssd_io_errors = atomic_load_explicit(&io->errors, memory_order_relaxed);
    snprintf(m->ssd_segment, sizeof(m->ssd_segment), "%s", o->name);
    m->ssd_capacity = kvp_ssd_file_size(o->file);
    m->ssd_mounted = 1;
    m->refused_protected += kvp_data_server_refused(o->srv);
    m->refused_grant += kvp_data_server_grants_refused(o->srv);
}

void kvp_ssd_owner_admission(const kvp_ssd_owner_t *o, kvp_conn_refusals_t *sum)
{
    kvp_data_server_admission(o->srv, sum);
}

const char *kvp_ssd_owner_name(const kvp_ssd_owner_t *o)
{
    return o->name;
}

void kvp_ssd_owner_follow(kvp_ssd_owner_t *o, const char *leader)
{
    if (o != NULL && o->mc != NULL)
        kvp_mconn_follow(o->mc, leader);
}

void kvp_ssd_owner_stop(kvp_ssd_owner_t *o)
{
    if (o == NULL)
        return;
    atomic_store(&o->stop, true);
    if (o->started)
        pthread_join(o->thread, NULL); /* its long poll ends within ~1.5 s */
    /* Unmount: the master drops the objects from its index; the file keeps them, and
     * the next mount of the same path brings them back. */
    uint64_t id = atomic_load(&o->seg_id);
    if (o->mc != NULL && id != 0 && kvp_mconn_connected(o->mc)) {
        Kvpool__UnmountRequest req = KVPOOL__UNMOUNT_REQUEST__INIT;
        req.segment_id = id;
        uint8_t body[64], *resp;
        size_t rlen, len = kvpool__unmount_request__get_packed_size(&req);
        kvpool__unmount_request__pack(&req, body);
        kvp_mconn_call(o->mc, KVP_RPC_UNMOUNT, body, len, &resp, &rlen); /* best effort */
    }
    kvp_mconn_destroy(o->mc);
    kvp_data_server_destroy(o->srv);
    kvp_ssd_io_destroy(o->io);
    kvp_ssd_file_close(o->file);
    free(o->staging);
    free(o->done);
    free(o->donep);
    free(o);
}
