/*
 * rebuild.h - a master's index rebuilt from what the segments' owners say
 * they hold (see rebuild.c).
 */
#ifndef KVP_MASTER_HA_REBUILD_H
#define KVP_MASTER_HA_REBUILD_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "master/core/state.h"

typedef struct kvp_adopt_entry {
    const char *key;
    size_t key_len;
    uint64_t version;
    uint64_t offset;
    uint64_t size;
    uint32_t crc32c;
    uint32_t pin;      /* kvp_pin_t */
    const char *group; /* its object group (group_len bytes; 0: none) */
    size_t group_len;
} kvp_adopt_entry_t;

/*
 * One object segment seg holds, offered by its owner after a mount: adopt it (KVP_OK:
 * a new object, one more replica of the same value, or a newer value than the
 * master's, which then goes) or refuse it (the owner forgets it): KVP_ERR_EXISTS (the
 * master has a newer value or a put of the key in flight, or the extent overlaps an
 * object already adopted), KVP_ERR_NOT_FOUND (removed since), KVP_ERR_INVALID_ARG.
 */
kvp_status_t kvp_rebuild_adopt(kvp_master_state_t *st, kvp_segment_t *seg,
                               const kvp_adopt_entry_t *e);

#endif
