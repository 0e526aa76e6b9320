/*
 * task_table.c - the master's copy and move tasks, indexed by what their calls look up.
 *
 * Design. Every task is in four places, each kept by the table's own functions so that they
 * cannot drift from the task's status:
 * - a chained hash by id (id_next): TaskQuery, each task a TaskStart or TaskEnd names, the
 *   hot-key fanout's check of its task: O(1). Ids are 64 random bits (id_lo) and the master's
 *   incarnation, so they spread without a better hash; the buckets double when the tasks
 *   outnumber them (load at most 1; a failed growth only makes the chains longer);
 * - its runner's lists (run_prev, run_next): a runner is the connection that owns the
 *   task's source segment, found in a second chained hash by connection id, with a list of
 *   the tasks waiting to be started (PENDING, newest first: the heartbeat's offers, in the
 *   order they were always offered) and one of those started (PROCESSING, the move whose
 *   source waits for its read leases to end not among them: that one no longer needs its
 *   runner). A heartbeat costs what it offers, a closed connection what it fails. A runner
 *   with neither is freed;
 * - the live list (PENDING and PROCESSING, newest first: the timer's deadlines) or its
 *   tenant's ended list (FAILED and SUCCESS, in the order they ended: kept for TaskQuery).
 * Tenants. Each tenant's tasks are counted (live, ended) in a slot of its own, an array by
 * tenant id grown to the largest id added, so the caps of rpc/task_calls.c are O(1) and a
 * trim frees what a tenant holds, never another's for it: kvp_task_table_trim_tenant takes
 * one tenant's oldest ended, and kvp_task_table_trim, which bounds the table's ended tasks in
 * all, cuts the tenants that keep the most down to one level (found by bisection: the
 * highest that frees enough), so that a tenant keeping few loses nothing to another's
 * flood. Without tenants every task is tenant 0's, and the two trims are the one of old: the
 * oldest ended first.
 * Nothing is walked over all the tasks but the cleanup.
 *
 * Thread: master loop only.
 */
#include "master/meta/task_table.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rand.h"

struct kvp_task_runner {
    uint64_t conn_id;
    kvp_task_runner_t *next; /* its bucket's chain */
    kvp_task_t *waiting;     /* PENDING, newest first */
    kvp_task_t *running;     /* PROCESSING and not drop_pending, the last started first */
};

#define BUCKETS_MIN 64u

/* What a task's created_ms and updated_ms say (TaskQuery): the wall clock. */
static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static uint32_t id_slot(uint64_t hi, uint64_t lo, uint32_t mask)
{
    return (uint32_t)mix(lo ^ (hi << 17 | hi >> 47)) & mask;
}

static uint32_t conn_slot(uint64_t conn_id, uint32_t mask)
{
    return (uint32_t)mix(conn_id) & mask;
}

/* ---------------- the two hashes ---------------- */

/* Room for one more task in the id hash: false only when there are no buckets at all. */
static bool id_room(kvp_task_table_t *tt)
{
    uint32_t n_buckets = tt->by_id != NULL ? tt->id_mask + 1 : 0;
    if (tt->n < n_buckets)
        return true;
    uint32_t grown = n_buckets != 0 ? n_buckets * 2 : BUCKETS_MIN;
    kvp_task_t **b = calloc(grown, sizeof(*b));
    if (b == NULL)
        return tt->by_id != NULL; /* longer chains, still right */
    for (uint32_t i = 0; i < n_buckets; i++) {
        for (kvp_task_t *t = tt->by_id[i], *nx; t != NULL; t = nx) {
            nx = t->id_next;
            uint32_t s = id_slot(t->id_hi, t->id_lo, grown - 1);
            t->id_next = b[s];
            b[s] = t;
        }
    }
    free(tt->by_id);
    tt->by_id = b;
    tt->id_mask = grown - 1;
    return true;
}

static void id_unlink(kvp_task_table_t *tt, kvp_task_t *t)
{
    kvp_task_t **pp = &tt->by_id[id_slot(t->id_hi, t->id_lo, tt->id_mask)];
    while (*pp != t)
        pp = &(*pp)->id_next;
    *pp = t->id_next;
    t->id_next = NULL;
}

static kvp_task_runner_t *runner_find(const kvp_task_table_t *tt, uint64_t conn_id)
{
    if (tt->by_conn == NULL)
        return NULL;
    for (kvp_task_runner_t *r = tt->by_conn[conn_slot(conn_id, tt->conn_mask)]; r != NULL;
         r = r->next)
        if (r->conn_id == conn_id)
            return r;
    return NULL;
}

/* Double the runner buckets when the runners outnumber them (a failed growth: longer
 * chains). false only when there are no buckets at all. */
static bool runner_room(kvp_task_table_t *tt)
{
    uint32_t n_buckets = tt->by_conn != NULL ? tt->conn_mask + 1 : 0;
    if (tt->n_runners < n_buckets)
        return true;
    uint32_t grown = n_buckets != 0 ? n_buckets * 2 : BUCKETS_MIN;
    kvp_task_runner_t **b = calloc(grown, sizeof(*b));
    if (b == NULL)
        return tt->by_conn != NULL;
    for (uint32_t i = 0; i < n_buckets; i++) {
        for (kvp_task_runner_t *r = tt->by_conn[i], *nx; r != NULL; r = nx) {
            nx = r->next;
            uint32_t s = conn_slot(r->conn_id, grown - 1);
            r->next = b[s];
            b[s] = r;
        }
    }
    free(tt->by_conn);
    tt->by_conn = b;
    tt->conn_mask = grown - 1;
    return true;
}

/* The runner of conn_id, made when absent; NULL: out of memory. */
static kvp_task_runner_t *runner_get(kvp_task_table_t *tt, uint64_t conn_id)
{
    kvp_task_runner_t *r = runner_find(tt, conn_id);
    if (r != NULL)
        return r;
    if (!runner_room(tt) || (r = calloc(1, sizeof(*r))) == NULL)
        return NULL;
    r->conn_id = conn_id;
    uint32_t s = conn_slot(conn_id, tt->conn_mask);
    r->next = tt->by_conn[s];
    tt->by_conn[s] = r;
    tt->n_runners++;
    return r;
}

static void runner_free(kvp_task_table_t *tt, kvp_task_runner_t *r)
{
    kvp_task_runner_t **pp = &tt->by_conn[conn_slot(r->conn_id, tt->conn_mask)];
    while (*pp != r)
        pp = &(*pp)->next;
    *pp = r->next;
    tt->n_runners--;
    free(r);
}

/* ---------------- the tenants ---------------- */

/* The slot of tenant id `tenant`, the array grown to hold it; NULL: out of memory. */
static kvp_task_tenant_t *tenant_get(kvp_task_table_t *tt, uint16_t tenant)
{
    if (tenant < tt->n_tenants)
        return &tt->tenants[tenant];
    uint32_t n = tt->n_tenants != 0 ? tt->n_tenants : 8;
    while (n <= tenant)
        n *= 2;
    kvp_task_tenant_t *a = realloc(tt->tenants, n * sizeof(*a));
    if (a == NULL)
        return NULL;
    memset(a + tt->n_tenants, 0, (n - tt->n_tenants) * sizeof(*a));
    tt->tenants = a;
    tt->n_tenants = n;
    return &a[tenant];
}

/* Free tn's oldest ended task. */
static void ended_free_oldest(kvp_task_table_t *tt, kvp_task_tenant_t *tn)
{
    kvp_task_t *t = tn->ended_oldest;
    tn->ended_oldest = t->next;
    if (t->next != NULL)
        t->next->prev = NULL;
    else
        tn->ended_newest = NULL;
    tn->n_ended--;
    id_unlink(tt, t);
    tt->n--;
    free(t);
}

/* The ended tasks the tenants keep above `level`, summed. */
static uint64_t ended_above(const kvp_task_table_t *tt, uint32_t level)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < tt->n_tenants; i++)
        if (tt->tenants[i].n_ended > level)
            n += tt->tenants[i].n_ended - level;
    return n;
}

/* ---------------- the lists ---------------- */

static void run_push(kvp_task_runner_t *r, kvp_task_t **head, kvp_task_t *t)
{
    t->runner = r;
    t->run_prev = NULL;
    t->run_next = *head;
    if (*head != NULL)
        (*head)->run_prev = t;
    *head = t;
}

/* t off the list of its runner r it is on (the runner kept). */
static void run_remove(kvp_task_runner_t *r, kvp_task_t *t)
{
    if (t->run_prev != NULL)
        t->run_prev->run_next = t->run_next;
    else if (r->waiting == t)
        r->waiting = t->run_next;
    else
        r->running = t->run_next;
    if (t->run_next != NULL)
        t->run_next->run_prev = t->run_prev;
    t->run_prev = t->run_next = NULL;
    t->runner = NULL;
}

/* t off its runner's lists; the runner freed when it has no task left. */
static void run_unlink(kvp_task_table_t *tt, kvp_task_t *t)
{
    kvp_task_runner_t *r = t->runner;
    if (r == NULL)
        return;
    run_remove(r, t);
    if (r->waiting == NULL && r->running == NULL)
        runner_free(tt, r);
}

static void live_unlink(kvp_task_table_t *tt, kvp_task_t *t)
{
    if (t->prev != NULL)
        t->prev->next = t->next;
    else
        tt->live = t->next;
    if (t->next != NULL)
        t->next->prev = t->prev;
    t->prev = t->next = NULL;
}

/* ---------------- the table ---------------- */

uint64_t kvp_task_id_check(uint64_t incarnation, uint64_t id_lo)
{
    uint64_t x = (incarnation ^ id_lo) * 0x9E3779B97F4A7C15ull;
    return (x ^ (x >> 29)) >> 48;
}

bool kvp_task_id_genuine(uint64_t id_hi, uint64_t id_lo)
{
    return (id_hi >> 16) != 0 && (id_hi & 0xffffu) == kvp_task_id_check(id_hi >> 16, id_lo);
}

bool kvp_task_id_earlier(const kvp_task_table_t *tt, uint64_t id_hi, uint64_t id_lo)
{
    return kvp_task_id_genuine(id_hi, id_lo) && id_hi >> 16 != tt->incarnation;
}

kvp_task_t *kvp_task_table_find(const kvp_task_table_t *tt, uint64_t id_hi, uint64_t id_lo)
{
    if (tt->by_id == NULL)
        return NULL;
    for (kvp_task_t *t = tt->by_id[id_slot(id_hi, id_lo, tt->id_mask)]; t != NULL; t = t->id_next)
        if (t->id_hi == id_hi && t->id_lo == id_lo)
            return t;
    return NULL;
}

bool kvp_task_table_add(kvp_task_table_t *tt, kvp_task_t *t)
{
    /* (the runner last: one made for t is freed only with a task) */
    kvp_task_tenant_t *tn = tenant_get(tt, t->tenant);
    if (tn == NULL || !id_room(tt))
        return false;
    kvp_task_runner_t *r = runner_get(tt, t->exec_conn);
    if (r == NULL)
        return false;
    while (tt->incarnation == 0) /* this master's: its ids say it (TaskQuery) */
        tt->incarnation = kvp_random_u64() >> 16;
    do {
        t->id_lo = kvp_random_u64();
        t->id_hi = tt->incarnation << 16 | kvp_task_id_check(tt->incarnation, t->id_lo);
    } while (kvp_task_table_find(tt, t->id_hi, t->id_lo) != NULL);
    t->status = KVP_TASK_PENDING;
    t->drop_pending = false;
    t->created_ms = t->updated_ms = wall_ms();
    uint32_t s = id_slot(t->id_hi, t->id_lo, tt->id_mask);
    t->id_next = tt->by_id[s];
    tt->by_id[s] = t;
    run_push(r, &r->waiting, t);
    t->prev = NULL;
    t->next = tt->live;
    if (tt->live != NULL)
        tt->live->prev = t;
    tt->live = t;
    tt->n++;
    tt->n_live++;
    tn->n_live++;
    return true;
}

void kvp_task_table_start(kvp_task_t *t)
{
    kvp_task_runner_t *r = t->runner; /* (a PENDING task always has one) */
    t->status = KVP_TASK_PROCESSING;
    t->updated_ms = wall_ms();
    run_remove(r, t); /* the runner kept: it runs t still */
    run_push(r, &r->running, t);
}

void kvp_task_table_release(kvp_task_table_t *tt, kvp_task_t *t)
{
    t->drop_pending = true;
    t->updated_ms = wall_ms();
    run_unlink(tt, t);
}

void kvp_task_table_end(kvp_task_table_t *tt, kvp_task_t *t, uint8_t status)
{
    kvp_task_tenant_t *tn = &tt->tenants[t->tenant]; /* (its slot is there since its add) */
    run_unlink(tt, t);
    live_unlink(tt, t);
    t->status = status;
    t->drop_pending = false;
    t->updated_ms = wall_ms();
    t->prev = tn->ended_newest;
    if (tn->ended_newest != NULL)
        tn->ended_newest->next = t;
    else
        tn->ended_oldest = t;
    tn->ended_newest = t;
    tn->n_live--;
    tn->n_ended++;
    tt->n_live--;
}

void kvp_task_table_trim_tenant(kvp_task_table_t *tt, uint16_t tenant, uint32_t keep)
{
    if (tenant >= tt->n_tenants)
        return;
    kvp_task_tenant_t *tn = &tt->tenants[tenant];
    while (tn->n_ended > keep)
        ended_free_oldest(tt, tn);
}

void kvp_task_table_trim(kvp_task_table_t *tt, uint32_t keep)
{
    uint32_t ended = tt->n - tt->n_live;
    if (ended <= keep)
        return;
    uint64_t excess = ended - keep;
    /* the level `hi`: the tenants above it keep less than the excess (ended_above(hi) <
     * excess <= ended_above(hi - 1)); lo < hi stays a level that frees enough */
    uint32_t lo = 0, hi = 0;
    for (uint32_t i = 0; i < tt->n_tenants; i++)
        if (tt->tenants[i].n_ended > hi)
            hi = tt->tenants[i].n_ended;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ended_above(tt, mid) >= excess)
            lo = mid;
        else
            hi = mid;
    }
    for (uint32_t i = 0; i < tt->n_tenants; i++)
        kvp_task_table_trim_tenant(tt, (uint16_t)i, hi);
    /* the rest, one each from tenants at the level (there are enough: the excess is at most
     * what the level below it frees) */
    for (uint32_t i = 0; i < tt->n_tenants && tt->n - tt->n_live > keep; i++)
        if (tt->tenants[i].n_ended == hi)
            ended_free_oldest(tt, &tt->tenants[i]);
}

uint32_t kvp_task_table_tenant_live(const kvp_task_table_t *tt, uint16_t tenant)
{
    return tenant < tt->n_tenants ? tt->tenants[tenant].n_live : 0;
}

uint32_t kvp_task_table_tenant_ended(const kvp_task_table_t *tt, uint16_t tenant)
{
    return tenant < tt->n_tenants ? tt->tenants[tenant].n_ended : 0;
}

kvp_task_t *kvp_task_table_waiting(const kvp_task_table_t *tt, uint64_t conn_id)
{
    const kvp_task_runner_t *r = runner_find(tt, conn_id);
    return r != NULL ? r->waiting : NULL;
}

kvp_task_t *kvp_task_table_running(const kvp_task_table_t *tt, uint64_t conn_id)
{
    const kvp_task_runner_t *r = runner_find(tt, conn_id);
    return r != NULL ? r->running : NULL;
}

void kvp_task_table_cleanup(kvp_task_table_t *tt)
{
    for (uint32_t i = 0; tt->by_id != NULL && i <= tt->id_mask; i++) {
        for (kvp_task_t *t = tt->by_id[i], *nx; t != NULL; t = nx) {
            nx = t->id_next;
            free(t);
        }
    }
    for (uint32_t i = 0; tt->by_conn != NULL && i <= tt->conn_mask; i++) {
        for (kvp_task_runner_t *r = tt->by_conn[i], *nx; r != NULL; r = nx) {
            nx = r->next;
            free(r);
        }
    }
    free(tt->by_id);
    free(tt->by_conn);
    free(tt->tenants);
    *tt = (kvp_task_table_t){0};
}
