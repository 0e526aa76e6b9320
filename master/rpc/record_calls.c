/*
 * record_calls.c - the RPCs by which segments describe themselves (ha/rebuild.c).
 *
 * Adopt: after a mount flagged `adopting`, the owner offers the objects its
 * segment holds, in batches, newest first; each is adopted or refused
 * (kvp_rebuild_adopt) and the owner forgets the refused ones. The batch
 * with `last` ends the offer: the segment then takes new replicas. The
 * master logs the whole offer once, with its counts and how long it took.
 *
 * SegRecord: the owner of a DRAM segment subscribes, on a connection of its
 * own, to the changes to its record (meta/record.c); the server streams
 * them (server.c, push_records), each batch written before the replies of
 * the requests that caused it.
 *
 * Only the connection that mounted a segment may offer for it. Its record stream is on
 * another connection of the same client (the owner dials it, as after each remount,
 * control/record_sync.c), so the connection cannot be the proof there: a subscription
 * must come from the principal that mounted the segment (with an ACL) and name the
 * owning client's id, which the master hands to no other principal but an admin
 * (call.c, kvp_seg_desc_for_caller). Another principal is refused (KVP_ERR_NOT_OWNER,
 * counted and logged) and the owner's stream stays where it is.
 *
 * Thread: master loop only.
 */
#include "master/rpc/record_calls.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "master/ha/rebuild.h"
#include "master/meta/limbo.h"
#include "master/meta/record.h"
#include "master/rpc/reply.h"

static kvp_segment_t *own(kvp_call_t *call, uint64_t segment_id)
{
    kvp_segment_t *seg = kvp_segment_table_get(&call->st->segments, segment_id);
    return seg != NULL && seg->owner_conn_id == call->conn_id ? seg : NULL;
}

/*
 * The offer of a segment that was dropped for silence ended: take back what it held then
 * (meta/limbo.c) and the owner's record lacks (the changes streamed while it was cut off),
 * through the same checks as an offered entry, and stream each to its record.
 */
static void take_back(kvp_master_state_t *st, kvp_segment_t *seg)
{
    kvp_limbo_t *l = seg->limbo;
    if (l == NULL)
        return;
    seg->limbo = NULL;
    uint64_t back = 0, had = 0, refused = 0;
    for (size_t i = 0; i < l->n; i++) {
        const kvp_limbo_entry_t *le = &l->e[i];
        uint64_t hash = kvp_index_hash(le->key, le->key_len);
        kvp_object_t *obj = kvp_index_lookup(&st->index, le->key, le->key_len, hash);
        bool offered = false; /* the owner's record had it: adopted (or refused) already */
        for (unsigned r = 0; obj != NULL && r < obj->n_replicas; r++)
            offered |= obj->replicas[r].segment_id == seg->id;
        if (offered) {
            had++;
            continue;
        }
        uint64_t refused_before = st->stats.adopt_refused;
        kvp_adopt_entry_t e = {.key = le->key,
                               .key_len = le->key_len,
                               .version = le->version,
                               .offset = le->offset,
                               .size = le->size,
                               .crc32c = le->crc32c,
                               .pin = le->pin,
                               .group = le->group,
                               .group_len = le->group_len};
        if (kvp_rebuild_adopt(st, seg, &e) != KVP_OK) {
            st->stats.adopt_refused = refused_before; /* not the owner's offer: counted below */
            refused++;
            continue;
        }
        st->stats.adopted--; /* counted as taken back instead */
        obj = kvp_index_lookup(&st->index, le->key, le->key_len, hash);
        for (unsigned r = 0; obj != NULL && r < obj->n_replicas; r++)
            if (obj->replicas[r].segment_id == seg->id && seg->record)
                kvp_record_add(&st->segments, seg, obj, &obj->replicas[r]);
        back++;
    }
    st->stats.taken_back += back;
    st->stats.limbo_expired += refused;
    KVP_LOG_INFO("segment %s mounted again after it was dropped for silence: %llu of the %zu "
                 "objects it held taken back (%llu its record had, %llu removed, overwritten "
                 "or in the way since)",
                 seg->name, (unsigned long long)back, l->n, (unsigned long long)had,
                 (unsigned long long)refused);
    kvp_limbo_free(l);
}

/* Adopt one offered entry (or refuse it), counted on seg. */
static int32_t adopt_one(kvp_master_state_t *st, kvp_segment_t *seg, const Kvpool__AdoptEntry *m)
{
    kvp_object_t *dummy;
    int32_t status = kvp_call_key_lookup(st, &m->key, &dummy, NULL);
    if (status == KVP_OK && !seg->ssd && !st->config.segment_records)
        status = KVP_ERR_UNSUPPORTED; /* kept for data grants only: not adopted */
    const kvp_limbo_entry_t *le = NULL;
    if (status == KVP_OK && seg->limbo != NULL && !seg->limbo->partial) {
        /* the segment comes back from the limbo, the master's whole and newer view of it:
         * only what it holds at that extent is adopted (meta/limbo.c) */
        le = kvp_limbo_at(seg->limbo, m->offset);
        if (le == NULL || le->key_len != m->key.len || memcmp(le->key, m->key.data, le->key_len) ||
            le->version != m->version || le->size != m->size || le->crc32c != m->crc32c) {
            status = KVP_ERR_NOT_FOUND; /* removed, replaced or evicted while it was dropped */
            le = NULL;
        }
    }
    if (status == KVP_OK) {
        kvp_adopt_entry_t e = {.key = (const char *)m->key.data,
                               .key_len = m->key.len,
                               .version = m->version,
                               .offset = m->offset,
                               .size = m->size,
                               .crc32c = m->crc32c,
                               .pin = le != NULL ? le->pin : m->pin,
                               .group = (const char *)m->group_id.data,
                               .group_len = m->group_id.len};
        status = kvp_rebuild_adopt(st, seg, &e);
    } else {
        st->stats.adopt_refused++;
    }
    if (status == KVP_OK)
        seg->adopt_ok++;
    else
        seg->adopt_refused++;
    return status;
}

kvp_status_t kvp_handle_adopt(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__AdoptRequest *req = (Kvpool__AdoptRequest *)req_msg;
    Kvpool__AdoptResponse resp = KVPOOL__ADOPT_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    kvp_segment_t *seg = own(call, req->segment_id);
    int32_t status = seg == NULL ? KVP_ERR_SEGMENT_GONE : kvp_call_check_batch(req->n_entries);
    if (status != KVP_OK)
        return kvp_reply_fail(&r, status, NULL);
    int32_t *out = kvp_reply_statuses(&r, req->n_entries);
    if (out == NULL)
        return kvp_reply_abort(&r);
    for (size_t i = 0; i < req->n_entries; i++)
        out[i] = adopt_one(st, seg, req->entries[i]);
    if (req->last && seg->adopting) {
        take_back(st, seg);
        seg->adopting = false;
        KVP_LOG_INFO("segment %s (%s): %llu objects adopted back, %llu stale entries "
                     "refused, in %llu ms",
                     seg->name, seg->medium, (unsigned long long)seg->adopt_ok,
                     (unsigned long long)seg->adopt_refused,
                     (unsigned long long)(st->now_ms - seg->mounted_ms));
    }
    return kvp_reply_send(&r);
}

kvp_status_t kvp_handle_seg_record(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__SegRecordRequest *req = (Kvpool__SegRecordRequest *)req_msg;
    Kvpool__SegRecordResponse resp = KVPOOL__SEG_RECORD_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    kvp_segment_t *seg = kvp_segment_table_get(&st->segments, req->segment_id);
    if (seg != NULL && !kvp_call_owns_segment(call, seg, false)) {
        /* not even an admin: the stream is the owner's, and moving it cuts the owner off
         * from its put ends */
        st->stats.refused_seg_record++;
        KVP_LOG_WARN_LIMITED("connection %llu: SegRecord of segment %s refused: principal %s "
                             "did not mount it",
                             (unsigned long long)call->conn_id, seg->name, call->who->name);
        return kvp_reply_fail(&r, KVP_ERR_NOT_OWNER, NULL);
    }
    if (seg == NULL || seg->owner_client_id != req->client_id)
        return kvp_reply_fail(&r, KVP_ERR_SEGMENT_GONE, NULL);
    /* an SSD segment (its file is its record), or --segment-records off */
    if (!seg->record && !seg->record_broken)
        return kvp_reply_fail(&r, KVP_ERR_UNSUPPORTED, NULL);
    /* no answer now (the reply holds nothing): the server streams the changes on this
     * connection */
    st->stream_segment = seg->id;
    return KVP_OK;
}
