/*
 * record.c - what keeps a DRAM segment's owner's record current.
 *
 * A segment's owner keeps a record of the COMPLETE objects on it (key,
 * extent, size, CRC, version, pin), so that a restarted master, or a new
 * leader, rebuilds its index from the owners' remounts (ha/rebuild.c). The
 * master never waits for the owner: each change is appended, encoded as
 * the owner reads it (SegRecordResponse.changes in proto/kvpool.proto), to
 * the segment's queue, and the owner's long poll (rpc/record_calls.c) takes the
 * whole queue at once. `table->records_dirty` tells the server to answer the
 * waiting polls; it does so before it writes the replies of the requests
 * that caused the changes, so an owner has an object's record no later than
 * its writer has the acknowledgement.
 *
 * A queue that passes KVP_RECORD_MAX_QUEUED (an owner that stopped asking)
 * is dropped and the segment no longer recorded: the owner is told its
 * record is broken, and its objects will not survive a master restart.
 *
 * Thread: master loop only.
 */
#include "master/meta/record.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "master/meta/group.h"

/* Put seg on the table's dirty list (once). */
static void list(kvp_segment_table_t *table, kvp_segment_t *seg)
{
    if (seg->record_listed)
        return;
    if (table->n_dirty == table->dirty_cap) {
        size_t cap = table->dirty_cap ? table->dirty_cap * 2 : 64;
        uint64_t *p = realloc(table->dirty_ids, cap * sizeof(*p));
        if (p == NULL)
            return; /* not listed: its changes go with its next listing */
        table->dirty_ids = p;
        table->dirty_cap = cap;
    }
    table->dirty_ids[table->n_dirty++] = seg->id;
    seg->record_listed = true;
}

static uint8_t *reserve(kvp_segment_table_t *table, kvp_segment_t *seg, size_t n)
{
    if (!seg->record)
        return NULL;
    if (seg->rec_len + n > seg->rec_cap) {
        size_t cap = seg->rec_cap ? seg->rec_cap * 2 : 4096;
        while (cap < seg->rec_len + n)
            cap *= 2;
        uint8_t *p = seg->rec_len + n <= KVP_RECORD_MAX_QUEUED ? realloc(seg->rec, cap) : NULL;
        if (p == NULL) {
            KVP_LOG_WARN("segment %s: its owner does not take its record's changes (%zu bytes "
                         "queued): no longer recorded, its objects will not survive a master "
                         "restart",
                         seg->name, seg->rec_len);
            free(seg->rec);
            seg->rec = NULL;
            seg->rec_len = seg->rec_cap = 0;
            seg->record = false;
            seg->record_broken = true;
            table->records_dirty = true;
            list(table, seg);
            return NULL;
        }
        seg->rec = p;
        seg->rec_cap = cap;
    }
    uint8_t *at = seg->rec + seg->rec_len;
    seg->rec_len += n;
    table->records_dirty = true;
    list(table, seg);
    return at;
}

static uint8_t *put(uint8_t *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + n;
}

void kvp_record_add(kvp_segment_table_t *table, kvp_segment_t *seg, const kvp_object_t *obj,
                    const kvp_replica_t *rep)
{
    const kvp_group_t *g = table->groups != NULL ? kvp_group_get((kvp_group_table_t *)table->groups,
                                                                 kvp_object_group(obj))
                                                 : NULL;
    size_t glen = g != NULL ? 2 + g->name_len : 0;
    uint8_t *p = reserve(table, seg, 1 + 8 + 8 + 8 + 4 + 1 + 2 + obj->key_len + glen);
    if (p == NULL)
        return;
    p = put(p, g != NULL ? KVP_RECORD_ADD_GROUPED : KVP_RECORD_ADD, 1);
    p = put(p, rep->offset, 8);
    p = put(p, obj->size, 8);
    p = put(p, obj->version, 8);
    p = put(p, obj->crc32c, 4);
    p = put(p, obj->pin, 1);
    p = put(p, obj->key_len, 2);
    memcpy(p, kvp_object_key(obj), obj->key_len);
    if (g != NULL) {
        p = put(p + obj->key_len, g->name_len, 2);
        memcpy(p, g->name, g->name_len);
    }
}

void kvp_record_del(kvp_segment_table_t *table, kvp_segment_t *seg, uint64_t offset)
{
    uint8_t *p = reserve(table, seg, 1 + 8);
    if (p == NULL)
        return;
    p = put(p, KVP_RECORD_DEL, 1);
    put(p, offset, 8);
}

void kvp_record_replica(kvp_segment_table_t *table, const kvp_object_t *obj,
                        const kvp_replica_t *rep)
{
    kvp_segment_t *seg = kvp_segment_table_get(table, rep->segment_id);
    if (seg != NULL && seg->record)
        kvp_record_add(table, seg, obj, rep);
}

void kvp_record_object(kvp_segment_table_t *table, const kvp_object_t *obj)
{
    for (unsigned r = 0; r < obj->n_replicas; r++)
        kvp_record_replica(table, obj, &obj->replicas[r]);
}

void kvp_record_forget(kvp_segment_table_t *table, const kvp_object_t *obj)
{
    for (unsigned r = 0; r < obj->n_replicas; r++) {
        kvp_segment_t *seg = kvp_segment_table_get(table, obj->replicas[r].segment_id);
        if (seg != NULL && seg->record)
            kvp_record_del(table, seg, obj->replicas[r].offset);
    }
}

void kvp_record_relist(kvp_segment_table_t *table, kvp_segment_t *seg)
{
    table->records_dirty = true;
    list(table, seg);
}

void kvp_record_take(kvp_segment_t *seg, uint8_t **buf_p, size_t *len_p)
{
    *buf_p = seg->rec;
    *len_p = seg->rec_len;
    seg->rec = NULL;
    seg->rec_len = seg->rec_cap = 0;
}

void kvp_segment_table_free_extent(kvp_segment_table_t *table, const kvp_replica_t *rep)
{
    kvp_segment_t *seg = kvp_segment_table_get(table, rep->segment_id);
    if (seg != NULL) {
        kvp_offset_alloc_free(seg->alloc, rep->handle);
        seg->objects--;
        if (seg->record)
            kvp_record_del(table, seg, rep->offset);
    }
}

void kvp_record_stream_open(kvp_segment_table_t *table, kvp_segment_t *seg, void *stream,
                            uint64_t req_id)
{
    seg->record_stream = stream;
    seg->record_req_id = req_id;
    seg->record_ack = true;        /* the owner waits for it before it opens the segment */
    kvp_record_relist(table, seg); /* what is queued goes now */
}

void kvp_record_stream_closed(kvp_segment_table_t *table, const void *stream)
{
    for (uint32_t i = 0; i < table->n_slots; i++)
        if (table->slots[i] != NULL && table->slots[i]->record_stream == stream)
            table->slots[i]->record_stream = NULL; /* its changes wait for the next stream */
}

void kvp_record_push(kvp_segment_table_t *table, kvp_record_write_cb_t *write, void *arg)
{
    if (!table->records_dirty)
        return;
    table->records_dirty = false;
    size_t n = table->n_dirty;
    table->n_dirty = 0;
    for (size_t i = 0; i < n; i++) {
        kvp_segment_t *seg = kvp_segment_table_get(table, table->dirty_ids[i]);
        if (seg == NULL)
            continue;
        seg->record_listed = false;
        if (seg->record_stream == NULL ||
            (seg->rec_len == 0 && !seg->record_broken && !seg->record_ack))
            continue; /* no stream yet: the changes wait for one (bounded, above) */
        if (!write(arg, seg)) {
            kvp_record_relist(table, seg); /* out of memory: the next turn tries again */
            continue;
        }
        uint8_t *buf;
        size_t blen;
        kvp_record_take(seg, &buf, &blen);
        free(buf);
        seg->record_ack = false;
        if (seg->record_broken) { /* said: the owner starts its record afresh */
            seg->record_broken = false;
            seg->record = true;
        }
    }
}
