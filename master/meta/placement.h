/*
 * placement.h - where a new object's replicas go (see placement.c).
 */
#ifndef KVP_MASTER_META_PLACEMENT_H
#define KVP_MASTER_META_PLACEMENT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "master/meta/segment_table.h"

typedef struct kvp_placement_req {
    uint64_t size;
    unsigned replica_num;
    const kvp_segment_t *preferred; /* may be NULL */
    /* replica i on preferred_list[i] while it has room (Mooncake's preferred_segments): when
     * given, it replaces preferred */
    const kvp_segment_t *preferred_list[8];
    unsigned n_preferred_list;
    unsigned pin;            /* kvp_pin_t for the new object */
    uint32_t soft_pin_ttl_s; /* 0: the master's default */
    bool upsert;             /* replace an existing object (PutStart only) */
    bool ssd;                /* on SSD segments (else DRAM ones): one tier per call */
    bool dfs;                /* on DFS segments (ssd set too) */
    bool dfs_extra;          /* PutStart: one more replica on a DFS segment (dfs_replica_num) */
    const char *near_host;   /* prefer segments on this host id when no preferred one */
    uint16_t tenant;         /* whose object: never on another tenant's dedicated
                                segment */
    bool dedicated_first;    /* the tenant has dedicated segments: draw there first */
    const uint64_t *avoid;   /* segments the writer could not reach lately: used only */
    unsigned n_avoid;        /* ... for replicas no other segment has room for */
} kvp_placement_req_t;

/* Does req name segment id among those the writer could not reach lately (avoid)? */
bool kvp_placement_avoids(const kvp_placement_req_t *req, uint64_t id);

/*
 * Allocate up to replica_num extents for one object on distinct segments
 * (distinct hosts first). Writes *n_p >= 1 replicas on success. Errors:
 * KVP_ERR_NO_SEGMENT, KVP_ERR_TOO_LARGE (bigger than every segment),
 * KVP_ERR_POOL_FULL.
 */
kvp_status_t kvp_placement_alloc(kvp_segment_table_t *table, const kvp_placement_req_t *req,
                                 uint64_t *rng_state, kvp_replica_t *out, unsigned *n_p);

/*
 * One extent of `size` on seg itself (a copy task's target): open (not draining or
 * adopting), of the tier asked, and not dedicated to another tenant. KVP_ERR_INVALID_ARG
 * (it may not take it), KVP_ERR_POOL_FULL (no room there).
 */
kvp_status_t kvp_placement_alloc_on(kvp_segment_t *seg, uint64_t size, uint16_t tenant,
                                    kvp_replica_t *out);

#endif
