/*
 * task_table.h - the master's copy and move tasks, indexed by what their calls look up
 * (see task_table.c): by id (TaskQuery, TaskStart, TaskEnd, the hot-key fanout), by the
 * connection that runs them (the heartbeat's offers, a closed connection's tasks), the
 * live ones (the timer) and each tenant's ended ones in the order they ended (trimmed oldest
 * first, a tenant's own).
 */
#ifndef KVP_MASTER_META_TASK_TABLE_H
#define KVP_MASTER_META_TASK_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "master/meta/object.h"

/*
 * A copy or move task (Mooncake's create_copy_task / create_move_task): new replicas of an
 * object on named segments, written by the owner of its source replica (policy/copy_tasks.c,
 * rpc/task_calls.c). kind and status are Mooncake's numbers. The key (as stored) follows the
 * struct.
 */
#define KVP_TASK_COPY 0
#define KVP_TASK_MOVE 1
#define KVP_TASK_PENDING 0
#define KVP_TASK_PROCESSING 1
#define KVP_TASK_FAILED 2
#define KVP_TASK_SUCCESS 3
#define KVP_TASK_TARGETS_MAX 8

typedef struct kvp_task_runner kvp_task_runner_t;

typedef struct kvp_task {
    /* the table's links (task_table.c): not for its users to change */
    struct kvp_task *id_next;             /* its id bucket's chain */
    struct kvp_task *prev, *next;         /* the live list (newest first) or its tenant's ended
                                           * one (oldest first) */
    struct kvp_task *run_prev, *run_next; /* its runner's waiting or running list */
    kvp_task_runner_t *runner;            /* NULL: on neither (ended, or drop_pending) */
    uint64_t id_hi, id_lo;
    uint8_t kind, status;
    bool drop_pending; /* MOVE: the new replica is in; the source's goes once no read leases it */
    uint16_t tenant;
    uint64_t created_ms, updated_ms; /* wall clock */
    uint64_t deadline_ms;            /* master clock: not ended by then, it fails */
    uint64_t source_seg;             /* the source replica's segment; its owner runs the task */
    uint64_t exec_conn;              /* ... that owner's connection: the task's runner */
    uint64_t version, size;          /* the object when the task started */
    uint32_t crc32c;
    uint8_t n_targets, n_dests;
    uint64_t targets[KVP_TASK_TARGETS_MAX];    /* segment ids */
    kvp_replica_t dests[KVP_TASK_TARGETS_MAX]; /* PROCESSING: new extents, held by the task */
    char assigned[128];                        /* the source segment's name */
    char message[160];
    uint16_t key_len;
    char key[];
} kvp_task_t;

/* What one tenant (a task's `tenant`) holds of the table. */
typedef struct kvp_task_tenant {
    kvp_task_t *ended_oldest; /* its FAILED and SUCCESS tasks in the order they ended (next) */
    kvp_task_t *ended_newest;
    uint32_t n_live, n_ended; /* its tasks not ended; ended and kept */
} kvp_task_tenant_t;

/* The tasks. A zeroed table is an empty one; the table owns the tasks added to it. */
typedef struct kvp_task_table {
    kvp_task_t **by_id;          /* chains by id (id_next) */
    uint32_t id_mask;            /* buckets - 1, a power of two */
    kvp_task_runner_t **by_conn; /* runners by connection id */
    uint32_t conn_mask;
    uint32_t n_runners;
    kvp_task_t *live;           /* PENDING and PROCESSING tasks, newest first (next) */
    kvp_task_tenant_t *tenants; /* [n_tenants], by tenant id: up to the largest id added */
    uint32_t n_tenants;
    uint32_t n, n_live;   /* tasks kept; not ended */
    uint64_t incarnation; /* 48 random bits naming this master's tasks (0: none yet) */
    /* TaskCreates refused (rpc/task_calls.c): at its tenant's cap; at the master's */
    uint64_t refused_tenant, refused_master;
} kvp_task_table_t;

void kvp_task_table_cleanup(kvp_task_table_t *tt);

/*
 * Add t (calloc'd by the caller, its fields filled; exec_conn is its runner, tenant its
 * tenant's id): it gets an id no task of the table has, in this master's incarnation (id_hi:
 * the incarnation, then a 16-bit check of (incarnation, id_lo)), is PENDING, counted live for
 * its tenant, offered to its runner, and created now
 * (created_ms and updated_ms: the wall clock, as every change below sets updated_ms). true: the
 * table's now. false: out of memory, t untouched and still the caller's. O(1) amortized.
 */
bool kvp_task_table_add(kvp_task_table_t *tt, kvp_task_t *t);
/* The task of that id, or NULL. O(1). */
kvp_task_t *kvp_task_table_find(const kvp_task_table_t *tt, uint64_t id_hi, uint64_t id_lo);

/* t (PENDING) is started: PROCESSING, on its runner's running list. O(1). */
void kvp_task_table_start(kvp_task_t *t);
/* t (PROCESSING, a move whose copy is in) waits for the master only, to drop its source:
 * drop_pending, off its runner's lists (a closed runner no longer fails it). O(1). */
void kvp_task_table_release(kvp_task_table_t *tt, kvp_task_t *t);
/* t (live) ends with status (FAILED or SUCCESS): off the live and runner lists, its
 * tenant's newest ended. O(1). */
void kvp_task_table_end(kvp_task_table_t *tt, kvp_task_t *t, uint8_t status);
/* Free tenant's ended tasks that ended first until it keeps at most `keep`: no other
 * tenant's. O(freed). */
void kvp_task_table_trim_tenant(kvp_task_table_t *tt, uint16_t tenant, uint32_t keep);
/* Free ended tasks until at most `keep` are left in all, from the tenants that keep the most,
 * each one's that ended first: every tenant is cut to one level, the highest that frees
 * enough (those under it lose nothing), and a few at it one more for the exact count. So a
 * tenant's flood takes its own, never those of a tenant keeping fewer. O(1) when at most
 * `keep` are kept; else O(freed + tenants x log2(the most a tenant keeps)). */
void kvp_task_table_trim(kvp_task_table_t *tt, uint32_t keep);

/* The tasks of tenant not ended; its ended ones kept. O(1). */
uint32_t kvp_task_table_tenant_live(const kvp_task_table_t *tt, uint16_t tenant);
uint32_t kvp_task_table_tenant_ended(const kvp_task_table_t *tt, uint16_t tenant);

/* The PENDING tasks connection conn_id runs, newest first (then t->run_next); NULL: none.
 * O(1). */
kvp_task_t *kvp_task_table_waiting(const kvp_task_table_t *tt, uint64_t conn_id);
/* The PROCESSING tasks it runs (drop_pending ones not among them), the last started first
 * (then t->run_next); NULL: none. O(1). */
kvp_task_t *kvp_task_table_running(const kvp_task_table_t *tt, uint64_t conn_id);

/* Did some master give this id (its incarnation, and the check right)? */
bool kvp_task_id_genuine(uint64_t id_hi, uint64_t id_lo);
/* Did an earlier master give it (genuine, another incarnation than this table's)? */
bool kvp_task_id_earlier(const kvp_task_table_t *tt, uint64_t id_hi, uint64_t id_lo);
/* The check of an id: its low 16 bits of id_hi (tests forge ids of other incarnations). */
uint64_t kvp_task_id_check(uint64_t incarnation, uint64_t id_lo);

#endif
