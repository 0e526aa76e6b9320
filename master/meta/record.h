/*
 * record.h - the changes a DRAM segment's owner must apply to its record of
 * the objects on the segment (see record.c).
 */
#ifndef KVP_MASTER_META_RECORD_H
#define KVP_MASTER_META_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "master/meta/object.h"
#include "master/meta/segment_table.h"

#define KVP_RECORD_ADD 1u
#define KVP_RECORD_ADD_GROUPED 3u /* ADD, then u16 group_len and the group id */
#define KVP_RECORD_DEL 2u
/* A segment whose unsent changes pass this stops being recorded (the owner is told). */
#define KVP_RECORD_MAX_QUEUED (64u << 20)

/* obj is COMPLETE with replica rep on seg (a DRAM segment that keeps a record). */
void kvp_record_add(kvp_segment_table_t *table, kvp_segment_t *seg, const kvp_object_t *obj,
                    const kvp_replica_t *rep);
/* The extent at `offset` on seg is no longer an object's. */
void kvp_record_del(kvp_segment_table_t *table, kvp_segment_t *seg, uint64_t offset);
/* kvp_record_add for replica rep of obj, when its segment is recorded. */
void kvp_record_replica(kvp_segment_table_t *table, const kvp_object_t *obj,
                        const kvp_replica_t *rep);
/* kvp_record_add for every replica of obj on a recorded segment. */
void kvp_record_object(kvp_segment_table_t *table, const kvp_object_t *obj);
/* kvp_record_del for every replica of obj (it is leaving the index; its extents may stay
 * held a while, by a read lease). */
void kvp_record_forget(kvp_segment_table_t *table, const kvp_object_t *obj);
/* List seg again (the server subscribed a stream, or could not write the changes). */
void kvp_record_relist(kvp_segment_table_t *table, kvp_segment_t *seg);
/* SegRecord: seg's record changes go on `stream` (a connection of the server's) from now
 * on, in frames of request id req_id; the first goes out at once (the owner waits for it
 * before it opens the segment). */
void kvp_record_stream_open(kvp_segment_table_t *table, kvp_segment_t *seg, void *stream,
                            uint64_t req_id);
/* The connection `stream` closed: its segments' changes wait for their next stream. */
void kvp_record_stream_closed(kvp_segment_table_t *table, const void *stream);

/* Write seg's changes (seg->rec[rec_len], seg->record_broken) as one frame on its stream
 * (seg->record_stream, request id seg->record_req_id). false: it could not (out of memory;
 * the changes stay queued and the segment is listed again). */
typedef bool kvp_record_write_cb_t(void *arg, kvp_segment_t *seg);
/* Each listed segment with a stream and something to say goes to write; what it wrote is
 * dropped from the queue (a broken record is said once: the owner starts afresh). The
 * server calls it before it flushes the replies of the requests that made the changes. */
void kvp_record_push(kvp_segment_table_t *table, kvp_record_write_cb_t *write, void *arg);
/* Free one extent in its segment, if the segment is still mounted (and, when the segment
 * is recorded, queue its deletion from the owner's record). */
void kvp_segment_table_free_extent(kvp_segment_table_t *table, const kvp_replica_t *rep);
/* Hand over seg's queued changes: *buf_p (malloc'd, the caller frees), *len_p bytes. */
void kvp_record_take(kvp_segment_t *seg, uint8_t **buf_p, size_t *len_p);

#endif
