/*
 * admin.c - the client's liveness heartbeat, graceful drain, key listing and
 * bulk remove.
 *
 * Heartbeat: a thread sends HEARTBEAT every params.heartbeat_ms on the
 * shared master connection. A broken connection (the master restarted, or
 * dropped us after --client-ttl of silence) is re-established by the call
 * itself, which remounts the segment: its old content is gone from the
 * master's view. The reply may also ask us to remount (the master does not
 * know our segment) or to drain it (kvp_request_drain from anyone).
 *
 * Drain: mark the segment draining (no new placements), then page through
 * the objects with a replica on it; those with other replicas need nothing,
 * the others get a new extent elsewhere (MoveStart), are written there
 * straight from segment memory through the transfer engine with their CRC
 * checked on the way, and swapped in (MoveEnd). Then unmount: what could not
 * be moved in time leaves the pool.
 *
 * Thread: the heartbeat and a requested drain run on their own threads; all
 * master traffic goes through kvp_client_call (serialised by master_lock).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/client_priv.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/util.h"

/* ---------------- heartbeat ---------------- */

static void *drain_main(void *arg)
{
    kvp_client_t *c = arg;
    uint64_t moved = 0, lost = 0;
    kvp_status_t st = kvp_drain(c, c->params.drain_timeout_ms, &moved, &lost);
    KVP_LOG_INFO("requested drain of %s: %s, %llu objects moved, %llu lost", c->seg_name,
                 kvp_strerror(st), (unsigned long long)moved, (unsigned long long)lost);
    atomic_store(&c->drain_running, false);
    return NULL;
}

static void heartbeat_once(kvp_client_t *c)
{
    Kvpool__HeartbeatRequest req = KVPOOL__HEARTBEAT_REQUEST__INIT;
    uint64_t seg_id = atomic_load(&c->seg_id);
    int state = atomic_load(&c->seg_state);
    req.client_id = c->client_id;
    if (state == KVP_SEG_MOUNTED || state == KVP_SEG_DRAINING) {
        req.segment_ids = &seg_id;
        req.n_segment_ids = 1;
    }
    uint8_t *resp;
    size_t rlen;
    if (kvp_client_call(c, KVP_RPC_HEARTBEAT, &req.base, &resp, &rlen) != KVP_OK)
        return; /* the next beat reconnects */
    Kvpool__HeartbeatResponse *hr = kvpool__heartbeat_response__unpack(NULL, rlen, resp);
    free(resp);
    if (hr == NULL)
        return;
    if (hr->remount && atomic_load(&c->seg_state) == KVP_SEG_MOUNTED) {
        KVP_LOG_WARN("the master does not know segment %s: mounting it again (empty)", c->seg_name);
        pthread_mutex_lock(&c->master_lock);
        if (c->master_fd >= 0 && atomic_load(&c->seg_state) == KVP_SEG_MOUNTED)
            kvp_client_mount_locked(c);
        kvp_client_master_unlock(c);
    }
    for (size_t i = 0; i < hr->n_drain_segment_ids; i++) {
        if (hr->drain_segment_ids[i] != atomic_load(&c->seg_id) ||
            atomic_load(&c->seg_state) != KVP_SEG_MOUNTED || atomic_load(&c->drain_running))
            continue;
        pthread_mutex_lock(&c->hb_lock);
        if (!c->hb_closing) {
            if (c->drain_thread_started) {
                pthread_join(c->drain_thread, NULL); /* the previous one has finished */
                c->drain_thread_started = false;
            }
            KVP_LOG_INFO("drain of segment %s requested", c->seg_name);
            atomic_store(&c->drain_running, true);
            if (pthread_create(&c->drain_thread, NULL, drain_main, c) == 0)
                c->drain_thread_started = true;
            else
                atomic_store(&c->drain_running, false);
        }
        pthread_mutex_unlock(&c->hb_lock);
    }
    kvpool__heartbeat_response__free_unpacked(hr, NULL);
}

static void *heartbeat_main(void *arg)
{
    kvp_client_t *c = arg;
    pthread_mutex_lock(&c->hb_lock);
    while (!c->hb_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)c->params.heartbeat_ms * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        int rc = 0;
        while (!c->hb_stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&c->hb_cond, &c->hb_lock, &ts);
        if (c->hb_stop)
            break;
        pthread_mutex_unlock(&c->hb_lock);
        heartbeat_once(c);
        pthread_mutex_lock(&c->hb_lock);
    }
    pthread_mutex_unlock(&c->hb_lock);
    return NULL;
}

kvp_status_t kvp_client_heartbeat_start(kvp_client_t *c)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->hb_cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&c->hb_lock, NULL);
    c->hb_stop = false;
    if (pthread_create(&c->hb_thread, NULL, heartbeat_main, c) != 0) {
        pthread_cond_destroy(&c->hb_cond);
        pthread_mutex_destroy(&c->hb_lock);
        return KVP_ERR_SYSTEM;
    }
    c->hb_started = true;
    return KVP_OK;
}

void kvp_client_heartbeat_stop(kvp_client_t *c)
{
    if (!c->hb_started)
        return;
    /* A drain in progress finishes first, with heartbeats still going (the master
     * would otherwise drop us mid-drain after --client-ttl). */
    pthread_mutex_lock(&c->hb_lock);
    c->hb_closing = true;
    pthread_mutex_unlock(&c->hb_lock);
    while (atomic_load(&c->drain_running))
        usleep(10 * 1000);
    pthread_mutex_lock(&c->hb_lock);
    c->hb_stop = true;
    pthread_cond_signal(&c->hb_cond);
    pthread_mutex_unlock(&c->hb_lock);
    pthread_join(c->hb_thread, NULL);
    if (c->drain_thread_started)
        pthread_join(c->drain_thread, NULL);
    c->drain_thread_started = false;
    pthread_cond_destroy(&c->hb_cond);
    pthread_mutex_destroy(&c->hb_lock);
    c->hb_started = false;
}

/* ---------------- drain ---------------- */

#define DRAIN_PAGE 256u

/* Send an RPC and unpack its reply as `desc`; NULL on any failure (*st_p says why). */
static void *call_unpack(kvp_client_t *c, uint16_t method, const ProtobufCMessage *req,
                         const ProtobufCMessageDescriptor *desc, kvp_status_t *st_p)
{
    uint8_t *body;
    size_t len;
    *st_p = kvp_client_call(c, method, req, &body, &len);
    if (*st_p != KVP_OK)
        return NULL;
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, len, body);
    free(body);
    if (msg == NULL)
        *st_p = KVP_ERR_PROTOCOL;
    return msg;
}

/*
 * Move one page of listed objects. Returns how many were moved; *to_copy_p
 * counts the objects that needed a copy (moved or not), *failed_p those that
 * could not be moved.
 */
static uint64_t drain_page(kvp_client_t *c, uint64_t seg_id, Kvpool__ListResponse *lr,
                           uint64_t *to_copy_p, uint64_t *failed_p)
{
    size_t n = lr->n_entries;
    ProtobufCBinaryData *keys = calloc(n + 1, sizeof(*keys));
    uint64_t *offs = calloc(n + 1, sizeof(*offs));
    size_t *ent = calloc(n + 1, sizeof(*ent));
    kvp_xfer_op_t *ops = calloc(n + 1, sizeof(*ops));
    size_t *op_slot = calloc(n + 1, sizeof(*op_slot));
    uint32_t *op_crc = calloc(n + 1, sizeof(*op_crc));
    int32_t *sts = calloc(n + 1, sizeof(*sts));
    uint64_t moved = 0;
    Kvpool__MoveStartResponse *mr = NULL;
    size_t m = 0, k = 0;
    kvp_status_t st;
    if (!keys || !offs || !ent || !ops || !op_slot || !op_crc || !sts)
        goto out;
    for (size_t i = 0; i < n; i++) {
        Kvpool__ListEntry *e = lr->entries[i];
        const Kvpool__Replica *mine = NULL;
        for (size_t r = 0; r < e->n_replicas; r++)
            if (e->replicas[r]->segment_id == seg_id)
                mine = e->replicas[r];
        /* pending objects are not moved; the master skips those kept elsewhere */
        if (e->state != 2 || mine == NULL || mine->offset > c->seg_size ||
            e->size > c->seg_size - mine->offset)
            continue;
        keys[m] = e->key;
        offs[m] = mine->offset;
        ent[m++] = i;
    }
    if (m == 0)
        goto out;
    Kvpool__MoveStartRequest req = KVPOOL__MOVE_START_REQUEST__INIT;
    req.from_segment_id = seg_id;
    req.keys = keys;
    req.n_keys = m;
    mr = call_unpack(c, KVP_RPC_MOVE_START, &req.base, &kvpool__move_start_response__descriptor,
                     &st);
    if (mr == NULL || mr->status != KVP_OK || mr->n_results != m) {
        KVP_LOG_WARN("drain %s: move start failed: %s", c->seg_name,
                     kvp_strerror(mr ? (mr->status ? mr->status : KVP_ERR_PROTOCOL) : st));
        *failed_p += m;
        if (mr == NULL || mr->status != KVP_OK)
            goto out;
        /* a malformed answer after the master recorded moves: give them all back */
        for (size_t j = 0; j < m; j++)
            sts[j] = KVP_ERR_PROTOCOL;
        k = m;
        goto end;
    }
    kvp_client_peers_update(c, mr->segments, mr->n_segments);
    /* Keys that got a destination are compacted to keys[0..k) for MoveEnd; the
     * writes to run are ops[0..w), op_slot[q] naming each one's key slot. */
    size_t w = 0;
    for (size_t j = 0; j < m; j++) {
        Kvpool__PutStartResult *r = mr->results[j];
        if (r->status != KVP_OK || r->n_replicas != 1) {
            if (r->status != KVP_OK && r->status != KVP_ERR_NOT_FOUND)
                (*failed_p)++; /* NOT_FOUND: removed meanwhile, nothing to move */
            continue;          /* no copy needed (kept elsewhere), or no room / gone */
        }
        (*to_copy_p)++;
        kvp_peer_t *peer = kvp_client_peer_get(c, r->replicas[0]->segment_id);
        keys[k] = keys[j];
        sts[k] = KVP_ERR_PROTOCOL; /* unless the write below succeeds */
        if (peer != NULL) {
            ops[w] = (kvp_xfer_op_t){.kind = KVP_XFER_WRITE,
                                     .local = (char *)c->seg_base + offs[j],
                                     .offset = r->replicas[0]->offset,
                                     .length = lr->entries[ent[j]]->size,
                                     .peer = peer,
                                     .want_crc = true};
            op_slot[w] = k;
            op_crc[w++] = lr->entries[ent[j]]->crc32c;
        }
        k++;
    }
    kvp_transfer_run(&c->xfer, ops, w);
    for (size_t q = 0; q < w; q++) {
        kvp_status_t s = ops[q].status;
        if (s == KVP_OK && ops[q].crc != op_crc[q])
            s = KVP_ERR_CHECKSUM; /* rewritten meanwhile: the master refuses the swap too */
        sts[op_slot[q]] = s;
        kvp_peer_unref(ops[q].peer);
    }
end:;
    Kvpool__MoveEndRequest end = KVPOOL__MOVE_END_REQUEST__INIT;
    end.from_segment_id = seg_id;
    end.keys = keys;
    end.n_keys = k;
    end.statuses = sts;
    end.n_statuses = k;
    Kvpool__StatusesResponse *er =
        call_unpack(c, KVP_RPC_MOVE_END, &end.base, &kvpool__statuses_response__descriptor, &st);
    if (er != NULL && er->status == KVP_OK && er->n_statuses == k) {
        for (size_t q = 0; q < k; q++) {
            if (sts[q] == KVP_OK && er->statuses[q] == KVP_OK)
                moved++;
            else
                (*failed_p)++;
        }
    } else {
        *failed_p += k;
    }
    if (er)
        kvpool__statuses_response__free_unpacked(er, NULL);
out:
    if (mr)
        kvpool__move_start_response__free_unpacked(mr, NULL);
    free(keys);
    free(offs);
    free(ent);
    free(ops);
    free(op_slot);
    free(op_crc);
    free(sts);
    return moved;
}

static kvp_status_t drain_impl(kvp_client_t *c, uint32_t timeout_ms, uint64_t *moved_p,
                               uint64_t *lost_p)
{
    if (moved_p)
        *moved_p = 0;
    if (lost_p)
        *lost_p = 0;
    if (c == NULL)
        return KVP_ERR_INVALID_ARG;
    /* under master_lock: a reconnect's remount (which holds it) cannot slip a new
     * segment id in between the state change and the id we drain */
    pthread_mutex_lock(&c->master_lock);
    int expect = KVP_SEG_MOUNTED;
    bool ok = atomic_compare_exchange_strong(&c->seg_state, &expect, KVP_SEG_DRAINING);
    uint64_t seg_id = atomic_load(&c->seg_id);
    kvp_client_master_unlock(c);
    if (!ok)
        return expect == KVP_SEG_DRAINING ? KVP_ERR_PENDING : KVP_ERR_INVALID_ARG;
    uint64_t deadline = kvp_now_ms() + timeout_ms;
    kvp_status_t st;
    Kvpool__DrainRequest dreq = KVPOOL__DRAIN_REQUEST__INIT;
    dreq.segment_id = seg_id;
    Kvpool__DrainResponse *dr =
        call_unpack(c, KVP_RPC_DRAIN, &dreq.base, &kvpool__drain_response__descriptor, &st);
    if (dr != NULL) {
        st = dr->status;
        kvpool__drain_response__free_unpacked(dr, NULL);
    }
    uint64_t moved = 0, failed = 0;
    if (st == KVP_OK)
        KVP_LOG_INFO("draining segment %s (%.1f s at most)", c->seg_name, timeout_ms / 1000.0);
    /* A pass sees every object present throughout; puts that were in flight when the
     * drain began finish later, so pass again while there is time and progress. */
    for (int pass = 0; pass < 3 && st == KVP_OK && kvp_now_ms() < deadline; pass++) {
        uint64_t cursor = 0, to_copy = 0, failed_before = failed;
        do {
            Kvpool__ListRequest lreq = KVPOOL__LIST_REQUEST__INIT;
            lreq.pattern = "";
            lreq.segment_id = seg_id;
            lreq.cursor = cursor;
            lreq.limit = DRAIN_PAGE;
            Kvpool__ListResponse *lr =
                call_unpack(c, KVP_RPC_LIST, &lreq.base, &kvpool__list_response__descriptor, &st);
            if (lr == NULL)
                break;
            if (lr->status != KVP_OK) {
                st = lr->status;
                kvpool__list_response__free_unpacked(lr, NULL);
                break;
            }
            moved += drain_page(c, seg_id, lr, &to_copy, &failed);
            cursor = lr->next_cursor;
            kvpool__list_response__free_unpacked(lr, NULL);
        } while (cursor != 0 && kvp_now_ms() < deadline);
        if (to_copy == 0 || failed > failed_before)
            break; /* nothing left, or no room elsewhere: more passes would not help */
    }
    if (st == KVP_ERR_SEGMENT_GONE)
        st = KVP_OK; /* the master no longer has it (restart, ttl): nothing to unmount */
    /* unmount: objects still here with no other replica leave the pool */
    Kvpool__UnmountRequest ureq = KVPOOL__UNMOUNT_REQUEST__INIT;
    ureq.segment_id = seg_id;
    kvp_status_t ust;
    Kvpool__UnmountResponse *ur =
        call_unpack(c, KVP_RPC_UNMOUNT, &ureq.base, &kvpool__unmount_response__descriptor, &ust);
    uint64_t lost = 0;
    if (ur != NULL) {
        lost = ur->objects_dropped;
        kvpool__unmount_response__free_unpacked(ur, NULL);
    }
    atomic_store(&c->seg_state, KVP_SEG_DRAINED);
    KVP_LOG_INFO("segment %s drained: %llu objects moved, %llu left the pool", c->seg_name,
                 (unsigned long long)moved, (unsigned long long)lost);
    if (moved_p)
        *moved_p = moved;
    if (lost_p)
        *lost_p = lost;
    return st;
}

kvp_status_t kvp_drain(kvp_client_t *c, uint32_t timeout_ms, uint64_t *moved_p, uint64_t *lost_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(drain_impl(c, timeout_ms, moved_p, lost_p), "drain");
}

static kvp_status_t request_drain_impl(kvp_client_t *c, const char *segment_name)
{
    if (c == NULL || segment_name == NULL || segment_name[0] == '\0')
        return KVP_ERR_INVALID_ARG;
    Kvpool__DrainRequest req = KVPOOL__DRAIN_REQUEST__INIT;
    req.segment_name = (char *)segment_name;
    kvp_status_t st;
    Kvpool__DrainResponse *dr =
        call_unpack(c, KVP_RPC_DRAIN, &req.base, &kvpool__drain_response__descriptor, &st);
    if (dr == NULL)
        return st;
    st = dr->status;
    if (st != KVP_OK)
        KVP_LOG_WARN("drain %s: %s", segment_name, dr->message);
    kvpool__drain_response__free_unpacked(dr, NULL);
    return st;
}

kvp_status_t kvp_request_drain(kvp_client_t *c, const char *segment_name)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(request_drain_impl(c, segment_name), "request_drain");
}

int kvp_client_segment_mounted(kvp_client_t *c)
{
    int s = c ? atomic_load(&c->seg_state) : KVP_SEG_NONE;
    return s == KVP_SEG_MOUNTED || s == KVP_SEG_DRAINING;
}

/* ---------------- list / bulk remove ---------------- */

static kvp_status_t list_keys_impl(kvp_client_t *c, const char *pattern, size_t max,
                                   kvp_key_info_t **keys_p, size_t *n_p)
{
    if (c == NULL || keys_p == NULL || n_p == NULL)
        return KVP_ERR_INVALID_ARG;
    *keys_p = NULL;
    *n_p = 0;
    kvp_key_info_t *out = NULL;
    size_t n = 0, cap = 0;
    uint64_t cursor = 0;
    kvp_status_t st = KVP_OK;
    while (n < max) {
        Kvpool__ListRequest req = KVPOOL__LIST_REQUEST__INIT;
        req.pattern = pattern ? (char *)pattern : "";
        req.cursor = cursor;
        req.limit = (uint32_t)KVP_MIN(max - n, (size_t)1000);
        Kvpool__ListResponse *lr =
            call_unpack(c, KVP_RPC_LIST, &req.base, &kvpool__list_response__descriptor, &st);
        if (lr == NULL)
            break;
        if (lr->status != KVP_OK) {
            st = lr->status;
            KVP_LOG_WARN("list: %s", lr->message);
            kvpool__list_response__free_unpacked(lr, NULL);
            break;
        }
        for (size_t i = 0; i < lr->n_entries && n < max; i++) {
            if (n == cap) {
                size_t ncap = cap ? cap * 2 : 64;
                kvp_key_info_t *p = realloc(out, ncap * sizeof(*p));
                if (p == NULL) {
                    st = KVP_ERR_NOMEM;
                    break;
                }
                out = p;
                cap = ncap;
            }
            const Kvpool__ListEntry *e = lr->entries[i];
            kvp_key_info_t *k = &out[n];
            memset(k, 0, sizeof(*k));
            k->key = strndup((const char *)e->key.data, e->key.len);
            if (k->key == NULL) {
                st = KVP_ERR_NOMEM;
                break;
            }
            k->size = e->size;
            k->complete = e->state == 2;
            k->n_replicas = (uint32_t)KVP_MIN(e->n_replicas, (size_t)8);
            for (uint32_t r = 0; r < k->n_replicas; r++)
                k->segment_ids[r] = e->replicas[r]->segment_id;
            k->lease_ms = e->lease_ms;
            k->pin = e->pin;
            n++;
        }
        cursor = lr->next_cursor;
        kvpool__list_response__free_unpacked(lr, NULL);
        if (st != KVP_OK || cursor == 0)
            break;
    }
    if (st != KVP_OK) {
        kvp_key_list_free(out, n);
        return st;
    }
    *keys_p = out;
    *n_p = n;
    return KVP_OK;
}

kvp_status_t kvp_list_keys(kvp_client_t *c, const char *pattern, size_t max,
                           kvp_key_info_t **keys_p, size_t *n_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(list_keys_impl(c, pattern, max, keys_p, n_p), "list");
}

void kvp_key_list_free(kvp_key_info_t *keys, size_t n)
{
    for (size_t i = 0; keys != NULL && i < n; i++)
        free(keys[i].key);
    free(keys);
}

static kvp_status_t remove_regex(kvp_client_t *c, const char *pattern, bool all, int force,
                                 uint64_t *removed_p)
{
    if (removed_p)
        *removed_p = 0;
    if (c == NULL || (!all && (pattern == NULL || pattern[0] == '\0')))
        return KVP_ERR_INVALID_ARG;
    Kvpool__RemoveByRegexRequest req = KVPOOL__REMOVE_BY_REGEX_REQUEST__INIT;
    req.pattern = all ? "" : (char *)pattern;
    req.all = all;
    req.force = force != 0;
    kvp_status_t st;
    Kvpool__RemoveByRegexResponse *rr = call_unpack(
        c, KVP_RPC_REMOVE_BY_REGEX, &req.base, &kvpool__remove_by_regex_response__descriptor, &st);
    if (rr == NULL)
        return st;
    st = rr->status;
    if (st != KVP_OK)
        KVP_LOG_WARN("remove by regex: %s", rr->message);
    if (removed_p)
        *removed_p = rr->removed;
    kvpool__remove_by_regex_response__free_unpacked(rr, NULL);
    return st;
}

static kvp_status_t remove_by_regex_impl(kvp_client_t *c, const char *pattern, int force,
                                         uint64_t *removed_p)
{
    return remove_regex(c, pattern, false, force, removed_p);
}

kvp_status_t kvp_remove_by_regex(kvp_client_t *c, const char *pattern, int force,
                                 uint64_t *removed_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(remove_by_regex_impl(c, pattern, force, removed_p),
                                       "remove_by_regex");
}

static kvp_status_t remove_all_impl(kvp_client_t *c, int force, uint64_t *removed_p)
{
    return remove_regex(c, NULL, true, force, removed_p);
}

kvp_status_t kvp_remove_all(kvp_client_t *c, int force, uint64_t *removed_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(remove_all_impl(c, force, removed_p), "remove_all");
}
