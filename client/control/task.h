/*
 * task.h - copy and move tasks, the client's part (task.c): asking the master for one,
 * asking how it goes, and running those the master offers this client (the owner of their
 * source segment) through its heartbeat.
 */
#ifndef KVP_CLIENT_CONTROL_TASK_H
#define KVP_CLIENT_CONTROL_TASK_H

#include <stddef.h>
#include <stdint.h>

#include "client/control/drain.h"
#include "client/include/kvpool.h"
#include "common/status.h"

/* TaskCreate: kind KVP_COPY_TASK (targets) or KVP_MOVE_TASK (source, one target); the id. */
kvp_status_t kvp_task_create(kvp_session_t *s, uint32_t kind, const char *key, const char *source,
                             const char *const *targets, size_t n_targets, kvp_task_id_t *id_p);
/* TaskQuery. KVP_ERR_NOT_FOUND: no task of the caller's tenant has this id. */
kvp_status_t kvp_task_query(kvp_session_t *s, kvp_task_id_t id, kvp_task_info_t *info);
/* Run the n tasks offered to this client (ids: hi, lo pairs): TaskStart each, all their
 * copies written from its segment's memory in one transfer run (their CRC checked), TaskEnd
 * each. Returns how many started. Thread: the heartbeat's. */
size_t kvp_task_run(const kvp_drain_params_t *p, const uint64_t *ids, size_t n);

#endif
