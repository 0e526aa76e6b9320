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
/* Free one extent in its segment, if the segment is still mounted (and, when the segment
 * is recorded, queue its deletion from the owner's record). */
void kvp_segment_table_free_extent(kvp_segment_table_t *table, const kvp_replica_t *rep);
/* Hand over seg's queued changes: *buf_p (malloc'd, the caller frees), *len_p bytes. */
void kvp_record_take(kvp_segment_t *seg, uint8_t **buf_p, size_t *len_p);

#endif
