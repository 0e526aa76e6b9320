/*
 * copy_tasks.h - the life of copy and move tasks: made (TaskCreate, the hot-key fanout),
 * ended, failed or finished by the timer (see copy_tasks.c; their calls: rpc/task_calls.c;
 * their table: meta/task_table.h).
 */
#ifndef KVP_MASTER_POLICY_COPY_TASKS_H
#define KVP_MASTER_POLICY_COPY_TASKS_H

#include <stdbool.h>
#include <stdint.h>

#include "master/core/state.h"

/* Tasks the master holds at most: waiting or running (TaskCreate is refused past it), and
 * ended ones kept for TaskQuery, over all tenants. */
#define KVP_TASKS_LIVE_MAX 4096u
#define KVP_TASKS_KEPT_MAX 4096u

/* What one tenant may hold at most, of each: tasks waiting or running (TaskCreate), and
 * ended ones kept for TaskQuery. --max-tasks-per-tenant, or 0 there: an equal share of
 * KVP_TASKS_LIVE_MAX among the tenants the master knows (the ACL's, "default" included; at
 * least 1), so that the tenants together never pass the master's cap. Without an ACL (one
 * tenant): KVP_TASKS_LIVE_MAX. */
uint32_t kvp_task_tenant_max(const kvp_master_state_t *st);

/* Record a task of kind on obj, PENDING, for the owner of `source` (checked by the caller:
 * a DRAM segment with a replica; targets: ids of segments that may take one), obj's tenant's;
 * the oldest ended tasks past those kept for TaskQuery go (that tenant's past its share, then
 * the largest keepers' past the master's). NULL: out of memory. */
kvp_task_t *kvp_task_add(kvp_master_state_t *st, const kvp_object_t *obj, uint8_t kind,
                         const kvp_segment_t *source, const uint64_t *targets, unsigned n_targets);
/* A DRAM segment holding a replica of obj to copy from (one not draining first); NULL. */
kvp_segment_t *kvp_task_source(kvp_master_state_t *st, const kvp_object_t *obj);
/* Take obj's replica on segment_id out of it and free its extent (the caller checked that no
 * read leases obj); none there, or its last replica: nothing. false: out of memory. */
bool kvp_task_drop_replica(kvp_master_state_t *st, kvp_object_t *obj, uint64_t segment_id);
/* The object t copies, if it is in the index and COMPLETE; NULL. */
kvp_object_t *kvp_task_object(kvp_master_state_t *st, const kvp_task_t *t);

/* End t (live) with status: FAILED frees the extents it holds, why in fmt (NULL: none);
 * counted, a failure logged. Nothing if t has ended already. */
void kvp_task_end(kvp_master_state_t *st, kvp_task_t *t, uint8_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A MOVE whose copy is obj's: take its source replica out of obj (no read leases it) and end
 * it (SUCCESS; FAILED when out of memory, the object keeping both). */
void kvp_task_drop_source(kvp_master_state_t *st, kvp_task_t *t, kvp_object_t *obj);

/* The timer: tasks past their deadline fail; moves whose source replica waits for its read
 * leases to end finish once they have. O(live tasks). */
void kvp_task_tick(kvp_master_state_t *st);

#endif
