/*
 * tier.h - the SSD tier: offload of DRAM victims, promotion of SSD hits,
 * eviction from SSD, the owners' tasks, and the adoption of an SSD
 * segment's objects at its mount (see tier.c).
 */
#ifndef KVP_MASTER_POLICY_TIER_H
#define KVP_MASTER_POLICY_TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "master/core/state.h"

/* Longest key an SSD segment's file records (client/ssd/ssd_file.h, KVP_SSD_KEY_MAX): an
 * object with a longer key is never offloaded (a DRAM victim is dropped). */
#define KVP_TIER_KEY_MAX 4000u

/* Is an SSD segment mounted (offload possible)? */
static inline bool kvp_tier_has_ssd(const kvp_master_state_t *st)
{
    return st->segments.capacity_ssd > 0;
}

/* Is a file tier mounted (SSD or DFS segments: DRAM victims with a copy there keep it)? */
static inline bool kvp_tier_has_file(const kvp_master_state_t *st)
{
    return st->segments.capacity_ssd + st->segments.capacity_dfs > 0;
}

/* A new version for a put (larger than every version given or adopted before). */
uint64_t kvp_tier_next_version(kvp_master_state_t *st);

/* What kvp_tier_victim did with a DRAM victim. */
typedef enum kvp_tier_victim {
    KVP_TIER_DROP = 0,   /* nothing: the caller drops the object (no SSD room) */
    KVP_TIER_FREED = 1,  /* it has an SSD copy: its DRAM extents are free now */
    KVP_TIER_OFFLOAD = 2 /* an offload began: its DRAM extents are freed when it ends */
} kvp_tier_victim_t;

/* A DRAM eviction victim (COMPLETE, on a scanned list, not leased): move it to SSD. */
kvp_tier_victim_t kvp_tier_victim(kvp_master_state_t *st, kvp_object_t *obj);
/* DRAM bytes a put that waits for offloads keeps in flight besides its own need, so the
 * SSD owners always find a batch queued (tier.c). */
uint64_t kvp_tier_offload_ahead(const kvp_master_state_t *st);
/* Offloads in flight are at their bound: DRAM eviction waits for them. */
bool kvp_tier_offload_full(const kvp_master_state_t *st);
/* SSD segments are mounted but none takes replicas yet, one of them adopting (its owner,
 * restarted, is offering what it holds) for less than KVP_TIER_ADOPT_WAIT_MS: DRAM victims
 * would find no SSD room and be dropped, so DRAM eviction waits for the adoption to end (a
 * put gets POOL_BUSY). Past that, victims are dropped as with no SSD tier. */
bool kvp_tier_ssd_adopting(const kvp_master_state_t *st);
#define KVP_TIER_ADOPT_WAIT_MS 30000

/* Drop SSD-only objects, least recently used first, until the SSD tier uses at most
 * target bytes (objects being read are not touched). Returns bytes freed. */
uint64_t kvp_tier_evict_ssd_to(kvp_master_state_t *st, uint64_t target);

/* Free DFS copies, least recently used first, until the DFS tier uses at most target
 * bytes: objects on the file tiers only (the SSD list: they left DRAM, the coldest) lose
 * their DFS copy, removed when it was their last; then objects in DRAM (probation, then
 * protected) lose their DFS copy and keep their memory ones. Never an object being
 * written, read, pinned, offloaded or promoted; only copies on segments a put of tenant
 * could use (-1: any). Returns bytes freed. */
uint64_t kvp_tier_evict_dfs_to(kvp_master_state_t *st, uint64_t target, int32_t tenant);
/* Bytes used on the DFS segments that take new replicas of tenant's (-1: anyone's; not an
 * ownerless segment nor one dedicated to another tenant): what DFS eviction counts and frees
 * (target above is of these bytes). */
uint64_t kvp_tier_dfs_used(const kvp_master_state_t *st, int32_t tenant);

/* A get found obj: count the hit per tier; promote an SSD-only object (promote-on-hit). */
void kvp_tier_on_get(kvp_master_state_t *st, kvp_object_t *obj);
/* obj became COMPLETE with replicas on SSD (a put straight to SSD): have them recorded. */
void kvp_tier_on_put_end(kvp_master_state_t *st, kvp_object_t *obj);

/* An owner finished task `task_id` of its SSD segment `segment_id` with `status`. */
void kvp_tier_task_done(kvp_master_state_t *st, uint64_t segment_id, uint64_t task_id,
                        kvp_status_t status);
/* The owner of SSD segment seg could not read the extent at offset (an I/O error): the
 * object's copy there is lost (the object too, when it was its last). O(objects): rare. */
void kvp_tier_ssd_bad(kvp_master_state_t *st, kvp_segment_t *seg, uint64_t offset);
/* Segment segment_id is being unmounted: end the tasks that involve it. */
void kvp_tier_segment_gone(kvp_master_state_t *st, uint64_t segment_id);

/* Replace obj's replicas by reps[0..n) (same key); returns the object (moved when n
 * differs: hash chain, list and lease follow it). NULL: out of memory (obj unchanged). */
kvp_object_t *kvp_tier_set_replicas(kvp_master_state_t *st, kvp_object_t *obj,
                                    const kvp_replica_t *reps, unsigned n);

#endif
