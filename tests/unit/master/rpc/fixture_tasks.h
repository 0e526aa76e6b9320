/*
 * fixture_tasks.h - one-call helpers for copy and move tasks, on fixture_leases.h's master:
 * TaskCreate, TaskQuery, TaskStart and TaskEnd of one task, and a heartbeat's offers, each
 * packed, run through kvp_dispatch_handle and unpacked as a client would
 * (rpc/test_task_calls.c, policy/test_hot_keys.c); TaskCreate, TaskQuery and a put also as a
 * principal of a tenant (the ACL's caller).
 */
#ifndef KVP_TESTS_UNIT_MASTER_RPC_FIXTURE_TASKS_H
#define KVP_TESTS_UNIT_MASTER_RPC_FIXTURE_TASKS_H

#include <stddef.h>
#include <stdint.h>

#include "master/core/state.h"
#include "tests/unit/master/rpc/fixture_leases.h"

/* A task's id, as TaskCreate answered (its status and message). */
typedef struct tid {
    int32_t status;
    uint64_t hi, lo;
    char msg[320];
} tid_t;

tid_t create(kvp_master_state_t *st, uint64_t conn, uint32_t kind, const char *key,
             const char *source, const char *const *targets, size_t n);
/* The same as principal who (NULL: no ACL). */
tid_t create_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who, uint32_t kind,
                const char *key, const char *source, const char *const *targets, size_t n);

/* What TaskQuery says of a task. */
typedef struct tq {
    int32_t status;
    uint32_t kind, task_status;
    char assigned[64], msg[200];
} tq_t;

tq_t query(kvp_master_state_t *st, uint64_t conn, tid_t id);
tq_t query_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who, tid_t id);

/* A principal of tenant `tenant` with roles read and write, its tenant made in st's table (the
 * ACL's part: st->tenants_on is the caller's to set). */
kvp_principal_t tenant_principal(kvp_master_state_t *st, const char *name, const char *tenant);
/* PutStart and PutEnd of one key of SZ bytes, one replica on segment `preferred`, as who:
 * both must succeed. */
void put_as(kvp_master_state_t *st, uint64_t conn, const kvp_principal_t *who, const char *key,
            const char *preferred, uint32_t crc);

/* The tasks a heartbeat of conn is offered: their count, the first one's id in *first. */
size_t offers(kvp_master_state_t *st, uint64_t conn, tid_t *first);

/* What TaskStart says of a task. */
typedef struct started {
    int32_t status;
    uint64_t size, source_seg, source_off;
    uint32_t crc;
    size_t n;
    rep_t d[8];
} started_t;

/* A TaskStart of one task: the call's status when it failed whole, else the task's. */
started_t start(kvp_master_state_t *st, uint64_t conn, tid_t id);

/* A TaskEnd of one task: .status its refusal (negative) or 0, .task_status the task's after
 * it, .msg the task's message (TaskQuery). */
tq_t end(kvp_master_state_t *st, uint64_t conn, tid_t id, const int32_t *statuses, size_t n);

#endif
