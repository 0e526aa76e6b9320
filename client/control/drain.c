/*
 * drain.c - graceful drain of the client's own segment.
 *
 * Mark the segment draining (no new placements), then page through the
 * objects with a replica on it; those with other replicas need nothing,
 * the others get a new extent elsewhere (MoveStart), are written there
 * straight from segment memory through the transfer engine with their CRC
 * checked on the way, and swapped in (MoveEnd). Then unmount: what could
 * not be moved in time leaves the pool.
 *
 * Thread: the caller's (kvp_drain) or the drain thread started by the
 * heartbeat (heartbeat.c) when someone asked for a drain.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/control/drain.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/clock.h"

/* ---------------- drain ---------------- */

#define DRAIN_PAGE 256u

/*
 * Move one page of listed objects. Returns how many were moved; *to_copy_p
 * counts the objects that needed a copy (moved or not), *failed_p those that
 * could not be moved.
 */
static uint64_t drain_page(const kvp_drain_params_t *p, uint64_t seg_id, Kvpool__ListResponse *lr,
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
        if (e->state != 2 || mine == NULL ||
            kvp_segment_extent(p->seg, mine->offset, e->size) == NULL)
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
    mr = kvp_session_call_unpack(p->session, KVP_RPC_MOVE_START, &req.base,
                                 &kvpool__move_start_response__descriptor, &st);
    if (mr == NULL || mr->status != KVP_OK || mr->n_results != m) {
        KVP_LOG_WARN("drain %s: move start failed: %s", kvp_segment_name(p->seg),
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
    kvp_peers_update(p->peers, mr->segments, mr->n_segments);
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
        kvp_peer_t *peer = kvp_peers_get(p->peers, r->replicas[0]->segment_id);
        keys[k] = keys[j];
        sts[k] = KVP_ERR_PROTOCOL; /* unless the write below succeeds */
        if (peer != NULL) {
            ops[w] = (kvp_xfer_op_t){
                .kind = KVP_XFER_WRITE,
                .local = kvp_segment_extent(p->seg, offs[j], lr->entries[ent[j]]->size),
                .offset = r->replicas[0]->offset,
                .length = lr->entries[ent[j]]->size,
                .peer = peer,
                .want_crc = true,
                .grant = KVP_XFER_GRANT(r->replicas[0]->grant)};
            op_slot[w] = k;
            op_crc[w++] = lr->entries[ent[j]]->crc32c;
        }
        k++;
    }
    kvp_transfer_run(p->xfer, ops, w);
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
    Kvpool__StatusesResponse *er = kvp_session_call_unpack(
        p->session, KVP_RPC_MOVE_END, &end.base, &kvpool__statuses_response__descriptor, &st);
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

/* One pass over the objects listed on the segment: moves what has no other replica. */
static kvp_status_t drain_pass(const kvp_drain_params_t *p, uint64_t seg_id, uint64_t deadline,
                               uint64_t *moved_p, uint64_t *to_copy_p, uint64_t *failed_p)
{
    kvp_status_t st = KVP_OK;
    uint64_t cursor = 0;
    do {
        Kvpool__ListRequest lreq = KVPOOL__LIST_REQUEST__INIT;
        lreq.pattern = "";
        lreq.segment_id = seg_id;
        lreq.stored_keys = true; /* MoveStart names them as the master stores them */
        lreq.cursor = cursor;
        lreq.limit = DRAIN_PAGE;
        Kvpool__ListResponse *lr = kvp_session_call_unpack(p->session, KVP_RPC_LIST, &lreq.base,
                                                           &kvpool__list_response__descriptor, &st);
        if (lr == NULL)
            break;
        if (lr->status != KVP_OK) {
            st = lr->status;
            kvpool__list_response__free_unpacked(lr, NULL);
            break;
        }
        *moved_p += drain_page(p, seg_id, lr, to_copy_p, failed_p);
        cursor = lr->next_cursor;
        kvpool__list_response__free_unpacked(lr, NULL);
    } while (cursor != 0 && kvp_now_ms() < deadline);
    return st;
}

/*
 * Passes over the segment while time is left and each one moves something (8 at most). They
 * end when a pass found nothing to copy and nothing failed (all moved). A copy that failed
 * once (a transfer error, an object rewritten under it) is tried again by the next pass,
 * not given up with the rest of the segment. A pass that moved nothing it tried to (no
 * room elsewhere, or every copy failed) ends them (*stuck_p), unless room_wait_ms: then it
 * is asked again every 100 ms for that long first (right after a failover the other
 * segments may not be mounted at the new master yet, or still offering their records: no
 * room until they are).
 */
#define DRAIN_MAX_PASSES 8
#define DRAIN_ROOM_WAIT_MS 5000u
/* times a drain mounts its segment again after the master forgot it, and starts over */
#define DRAIN_REMOUNTS 3

static kvp_status_t drain_passes(const kvp_drain_params_t *p, uint64_t seg_id, uint64_t deadline,
                                 uint32_t room_wait_ms, uint64_t *moved_p, uint64_t *failed_p,
                                 bool *stuck_p)
{
    kvp_status_t st = KVP_OK;
    uint64_t room_until = 0; /* while passes move nothing: when to stop asking */
    int passes = 0;
    while (st == KVP_OK && kvp_now_ms() < deadline) {
        uint64_t to_copy = 0, moved_before = *moved_p, failed_before = *failed_p;
        st = drain_pass(p, seg_id, deadline, moved_p, &to_copy, failed_p);
        if (st != KVP_OK || (to_copy == 0 && *failed_p == failed_before))
            break; /* all moved (or the master said no) */
        if (*moved_p > moved_before) {
            room_until = 0;
            if (++passes >= DRAIN_MAX_PASSES)
                break;
            continue;
        }
        uint64_t now = kvp_now_ms();
        if (room_until == 0)
            room_until = now + room_wait_ms;
        if (now >= room_until || now + 100 >= deadline) {
            *stuck_p = true;
            break;
        }
        usleep(100 * 1000);
    }
    return st;
}

/*
 * Right after a failover the leader may not know yet what the segment holds: the owner
 * offers its record after the remount (record_sync.c), and a drain begun before that would
 * find nothing to move and unmount the rest out of the pool (an owner stopped just after
 * its master was). So first a call on the session (a connection to a master that went
 * away is replaced now, and the segment remounted there), then wait, within the drain's
 * time (SETTLE_MAX_MS at most: no master may answer at all), until the segment is open:
 * mounted at the master that answered and its record offered. stale: an id that master
 * no longer knows (the drain found so), which does not count as mounted: until the mount
 * that replaces it lands (this thread's or the heartbeat's, whichever the master took),
 * it is asked for again. True when it had to wait (or remount): a master changed just now.
 */
#define SETTLE_MAX_MS 10000u

static bool settle(const kvp_drain_params_t *p, uint64_t deadline, uint64_t stale)
{
    uint64_t id = kvp_segment_id(p->seg), until = kvp_now_ms() + SETTLE_MAX_MS;
    if (until > deadline)
        until = deadline;
    for (bool waited = false;; waited = true) {
        uint8_t *resp;
        size_t rlen;
        kvp_status_t st = kvp_session_call(p->session, KVP_RPC_PING, NULL, &resp, &rlen);
        uint64_t now_id = kvp_segment_id(p->seg);
        if (st == KVP_OK && now_id != stale && kvp_segment_is_open(p->seg))
            return waited || now_id != id;
        if (kvp_now_ms() + 20 >= until)
            return true;
        if (st == KVP_OK && now_id == stale && waited)
            (void)kvp_session_mount(p->session); /* refused while another one is under way */
        usleep(20 * 1000);
    }
}

/* DRAIN (again: it only marks the segment): *pending_p the puts still being written with
 * a replica on it. */
static kvp_status_t drain_call(const kvp_drain_params_t *p, uint64_t seg_id, uint64_t *pending_p)
{
    kvp_status_t st;
    Kvpool__DrainRequest dreq = KVPOOL__DRAIN_REQUEST__INIT;
    dreq.segment_id = seg_id;
    Kvpool__DrainResponse *dr = kvp_session_call_unpack(p->session, KVP_RPC_DRAIN, &dreq.base,
                                                        &kvpool__drain_response__descriptor, &st);
    if (dr != NULL) {
        st = dr->status;
        *pending_p = dr->pending;
        kvpool__drain_response__free_unpacked(dr, NULL);
    }
    return st;
}

kvp_status_t kvp_drain_run(const kvp_drain_params_t *p, uint32_t timeout_ms, uint64_t *moved_p,
                           uint64_t *lost_p)
{
    if (moved_p)
        *moved_p = 0;
    if (lost_p)
        *lost_p = 0;
    if (p->seg == NULL)
        return KVP_ERR_INVALID_ARG;
    uint64_t deadline = kvp_now_ms() + timeout_ms, pending = 0, moved = 0, failed = 0, seg_id;
    kvp_status_t st;
    uint32_t room_wait = 0; /* a master changed under the drain: the others may lag */
    uint64_t stale = 0;     /* the id the master forgot, when the drain starts over */
    for (int attempt = 0;; attempt++) {
        if (kvp_segment_state(p->seg) == KVP_SEG_MOUNTED &&
            (settle(p, deadline, stale) || attempt > 0))
            room_wait = DRAIN_ROOM_WAIT_MS;
        st = kvp_segment_drain_begin(p->seg, &seg_id);
        if (st != KVP_OK)
            return st;
        st = drain_call(p, seg_id, &pending);
        if (st == KVP_OK && attempt == 0)
            KVP_LOG_INFO("draining segment %s (%.1f s at most)", kvp_segment_name(p->seg),
                         timeout_ms / 1000.0);
        /* A pass sees every object present throughout; puts that were in flight when the
         * drain began finish later, so pass again while there is time and progress. */
        bool stuck = false;
        if (st == KVP_OK)
            st = drain_passes(p, seg_id, deadline, room_wait, &moved, &failed, &stuck);
        /* Nothing new is placed on a draining segment, but a put placed on it before may
         * end after the last pass listed the segment: once none is left being written (or
         * time is up), more passes move what they wrote, then the segment goes. */
        while (st == KVP_OK && !stuck && kvp_now_ms() < deadline) {
            st = drain_call(p, seg_id, &pending);
            if (st != KVP_OK || pending == 0)
                break;
            usleep(10 * 1000);
        }
        if (st == KVP_OK && !stuck && kvp_now_ms() < deadline)
            st = drain_passes(p, seg_id, deadline, room_wait, &moved, &failed, &stuck);
        if (st == KVP_OK) /* does the master that answers still know it (moves that failed?) */
            st = drain_call(p, seg_id, &pending);
        /* The master the drain began with forgot the segment: a failover or a restart while
         * it drained (its calls go to the new master now, which knows nothing on it until
         * its record is offered). Mount it there again, offer the record, drain anew: the
         * objects not moved yet would otherwise leave the pool with the unmount. */
        if (st == KVP_ERR_SEGMENT_GONE && attempt < DRAIN_REMOUNTS && kvp_now_ms() < deadline &&
            kvp_segment_drain_abort(p->seg)) {
            KVP_LOG_WARN("segment %s: the master no longer knows it (a failover or a restart "
                         "while it drained): mounting it again to drain it there",
                         kvp_segment_name(p->seg));
            (void)kvp_session_mount(p->session); /* a broken connection's reconnect does it */
            stale = seg_id;
            continue;
        }
        break;
    }
    if (st == KVP_ERR_SEGMENT_GONE)
        st = KVP_OK; /* the master no longer has it (restart, ttl): nothing to unmount */
    /* unmount: objects still here with no other replica leave the pool */
    Kvpool__UnmountRequest ureq = KVPOOL__UNMOUNT_REQUEST__INIT;
    ureq.segment_id = seg_id;
    kvp_status_t ust;
    Kvpool__UnmountResponse *ur = kvp_session_call_unpack(
        p->session, KVP_RPC_UNMOUNT, &ureq.base, &kvpool__unmount_response__descriptor, &ust);
    uint64_t lost = 0;
    if (ur != NULL) {
        lost = ur->objects_dropped;
        kvpool__unmount_response__free_unpacked(ur, NULL);
    }
    kvp_segment_set_drained(p->seg);
    if (lost > 0)
        KVP_LOG_WARN("segment %s drained: %llu objects moved, %llu left the pool (%llu copies "
                     "failed or found no room%s)",
                     kvp_segment_name(p->seg), (unsigned long long)moved, (unsigned long long)lost,
                     (unsigned long long)failed,
                     kvp_now_ms() >= deadline ? "; the drain's time ran out" : "");
    else
        KVP_LOG_INFO("segment %s drained: %llu objects moved, none left the pool",
                     kvp_segment_name(p->seg), (unsigned long long)moved);
    if (moved_p)
        *moved_p = moved;
    if (lost_p)
        *lost_p = lost;
    return st;
}

kvp_status_t kvp_drain_request(kvp_session_t *s, const char *segment_name)
{
    if (segment_name == NULL || segment_name[0] == '\0')
        return KVP_ERR_INVALID_ARG;
    Kvpool__DrainRequest req = KVPOOL__DRAIN_REQUEST__INIT;
    req.segment_name = (char *)segment_name;
    kvp_status_t st;
    Kvpool__DrainResponse *dr = kvp_session_call_unpack(s, KVP_RPC_DRAIN, &req.base,
                                                        &kvpool__drain_response__descriptor, &st);
    if (dr == NULL)
        return st;
    st = dr->status;
    if (st != KVP_OK) {
        KVP_LOG_WARN("drain %s: %s", segment_name, dr->message);
        kvp_status_note(dr->message); /* the master's words, for the caller's last error */
    }
    kvpool__drain_response__free_unpacked(dr, NULL);
    return st;
}
