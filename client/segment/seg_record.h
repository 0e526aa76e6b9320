/*
 * seg_record.h - a DRAM segment owner's record of the objects on its segment
 * (see seg_record.c).
 */
#ifndef KVP_CLIENT_SEGMENT_SEG_RECORD_H
#define KVP_CLIENT_SEGMENT_SEG_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* One object the segment holds, as offered back to a master (ADOPT). */
typedef struct kvp_record_entry {
    const char *key;
    size_t key_len;
    uint64_t version;
    uint64_t offset;
    uint64_t size;
    uint32_t crc32c;
    uint32_t pin;
    const char *group; /* its object group (group_len bytes; 0: none) */
    size_t group_len;
} kvp_record_entry_t;

typedef struct kvp_seg_record kvp_seg_record_t;

kvp_status_t kvp_seg_record_create(kvp_seg_record_t **r_p);
void kvp_seg_record_destroy(kvp_seg_record_t *r);

/* The segment was (re)mounted as segment_id: changes for any other id are ignored from
 * now on. */
void kvp_seg_record_bind(kvp_seg_record_t *r, uint64_t segment_id);
/*
 * Apply the master's changes for segment_id (the SegRecordResponse.changes format,
 * proto/kvpool.proto). Ignored (KVP_OK) when the segment was remounted since. A
 * malformed stream clears the record: KVP_ERR_PROTOCOL.
 */
kvp_status_t kvp_seg_record_apply(kvp_seg_record_t *r, uint64_t segment_id, const uint8_t *buf,
                                  size_t len);
/* Forget everything (the master said the record is broken). */
void kvp_seg_record_clear(kvp_seg_record_t *r);
struct kvp_data_pending;
/* The data server's table of begun puts (data_grant.h): each ADD applied ends its put's
 * note there. NULL: none. */
void kvp_seg_record_set_pending(kvp_seg_record_t *r, struct kvp_data_pending *p);
/* Forget the entry at offset if it still has that version (the master refused it). */
void kvp_seg_record_forget(kvp_seg_record_t *r, uint64_t offset, uint64_t version);
/* The version of the object the record has at this extent offset; 0: none. */
uint64_t kvp_seg_record_version_at(kvp_seg_record_t *r, uint64_t offset);
/* The same for n offsets under one lock (a data request's entries): versions[i]. */
void kvp_seg_record_versions_at(kvp_seg_record_t *r, const uint64_t *offsets, uint64_t *versions,
                                size_t n);
size_t kvp_seg_record_count(kvp_seg_record_t *r);

/* The segment's bytes, for checking what an ADD declares (seg_record.c, "An object ended
 * without its bytes"). NULL: not checked. */
void kvp_seg_record_set_memory(kvp_seg_record_t *r, const void *base, uint64_t size);

/*
 * Once a key with a tenant's prefix was recorded: wait (at most 500 ms) until each of the
 * n objects (offsets[i], versions[i]) is recorded (its ADD applied and checked) or was and
 * is removed since. true: all are; false: not in time. Without tenants: true at once.
 * Thread: a data server's connection thread.
 */
bool kvp_seg_record_wait(kvp_seg_record_t *r, const uint64_t *offsets, const uint64_t *versions,
                         size_t n);

/* ADDs found without their bytes, since the record was made. */
uint64_t kvp_seg_record_bad(kvp_seg_record_t *r);
/*
 * Every entry, newest (largest version) first: *e_p (malloc'd, with the keys after
 * the array: one free), *n_p entries.
 */
kvp_status_t kvp_seg_record_snapshot(kvp_seg_record_t *r, kvp_record_entry_t **e_p, size_t *n_p);

#endif
