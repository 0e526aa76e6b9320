/*
 * drain_jobs.c - Mooncake's drain jobs (its master's /api/v1/drain_jobs) over kvpool's drain.
 *
 * Design: a job marks its segments draining, as Drain does (rpc/drain_calls.c): placement
 * skips them, and each owner, told through its heartbeat, moves the objects whose only
 * replica is there (MoveStart: placed on the job's targets first, MoveEnd) and unmounts.
 * The job counts what its owners move (kvp_drain_jobs_moved) and what its segments take
 * with them when they go (kvp_drain_jobs_segment_gone: objects whose last replica they
 * were); it has succeeded once every segment is gone with nothing lost, failed once they
 * are all gone and something was. Its status is worked out when asked (the moves in flight
 * from its segments are counted then). Mooncake keeps a drained segment mounted (DRAINED)
 * until it is unmounted; kvpool's owner unmounts it at once, so a segment a kept job
 * emptied reads DRAINED until a segment of its name mounts again.
 *
 * What it costs: at most KVP_DRAIN_JOBS_MAX jobs kept, each of at most
 * KVP_DRAIN_JOB_SEGMENTS_MAX segments and KVP_DRAIN_JOB_TARGETS_MAX targets; a query walks
 * its job and the moves in flight. Jobs are the leader's: a failover forgets them (the
 * owners' drains go on).
 *
 * Thread: master loop only.
 */
#include "master/policy/drain_jobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/rand.h"

typedef struct job_seg {
    uint64_t id;
    char *name;
    bool gone;
} job_seg_t;

typedef struct job {
    char id[KVP_DRAIN_JOB_ID_LEN + 1];
    int status; /* CREATED, RUNNING, or final: SUCCEEDED, FAILED, CANCELED */
    uint64_t created_ms, updated_ms;
    job_seg_t segs[KVP_DRAIN_JOB_SEGMENTS_MAX];
    unsigned n_segs;
    uint64_t targets[KVP_DRAIN_JOB_TARGETS_MAX];
    unsigned n_targets;
    uint64_t succeeded, failed, bytes;
    char message[160];
} job_t;

struct kvp_drain_jobs {
    job_t *jobs[KVP_DRAIN_JOBS_MAX]; /* oldest first */
    unsigned n;
};

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static bool refuse(kvp_drain_err_t *e, int code, unsigned http, const char *fmt, const char *arg)
{
    e->code = code;
    e->http = http;
    snprintf(e->msg, sizeof(e->msg), fmt, arg);
    return false;
}

static bool final(int status)
{
    return status == KVP_JOB_SUCCEEDED || status == KVP_JOB_FAILED || status == KVP_JOB_CANCELED;
}

static void job_free(job_t *j)
{
    for (unsigned i = 0; i < j->n_segs; i++)
        free(j->segs[i].name);
    free(j);
}

/* Room for one more job: the oldest ended one goes when all are kept. false: all running. */
static bool room(struct kvp_drain_jobs *t)
{
    if (t->n < KVP_DRAIN_JOBS_MAX)
        return true;
    for (unsigned i = 0; i < t->n; i++)
        if (final(t->jobs[i]->status)) {
            job_free(t->jobs[i]);
            memmove(&t->jobs[i], &t->jobs[i + 1], (t->n - i - 1) * sizeof(t->jobs[0]));
            t->n--;
            return true;
        }
    return false;
}

/* A job's id: a random UUID (version 4) in Mooncake's text form. */
static void new_id(char *out)
{
    uint64_t a = kvp_random_u64(), b = kvp_random_u64();
    a = (a & ~0xf000ull) | 0x4000ull;       /* version 4 */
    b = (b & ~(3ull << 62)) | (2ull << 62); /* variant 10 */
    snprintf(out, KVP_DRAIN_JOB_ID_LEN + 1, "%08x-%04x-%04x-%04x-%012llx", (unsigned)(a >> 32),
             (unsigned)(a >> 16) & 0xffffu, (unsigned)a & 0xffffu, (unsigned)(b >> 48),
             (unsigned long long)(b & 0xffffffffffffull));
}

/* The request's segments and targets, checked: mounted, distinct, drainable / open. */
static bool check(kvp_master_state_t *st, const char *const *segs, unsigned n,
                  const char *const *targets, unsigned nt, uint32_t max_concurrency,
                  kvp_drain_err_t *e)
{
    if (n == 0 || max_concurrency == 0)
        return refuse(e, KVP_MC_INVALID_PARAMS, 400, "%s",
                      n == 0 ? "\"segments\" names no segment" : "\"max_concurrency\" is 0");
    if (n > KVP_DRAIN_JOB_SEGMENTS_MAX || nt > KVP_DRAIN_JOB_TARGETS_MAX)
        return refuse(e, KVP_MC_INVALID_PARAMS, 400, "%s",
                      "at most 16 segments and 8 target segments a job");
    for (unsigned i = 0; i < n; i++) {
        for (unsigned k = 0; k < i; k++)
            if (strcmp(segs[k], segs[i]) == 0)
                return refuse(e, KVP_MC_INVALID_PARAMS, 400, "segment %.150s named twice", segs[i]);
        const kvp_segment_t *seg = kvp_segment_table_find_name(&st->segments, segs[i]);
        if (seg == NULL)
            return refuse(e, KVP_MC_SEGMENT_NOT_FOUND, 404, "no segment %.150s is mounted",
                          segs[i]);
        if (seg->ssd || seg->draining || !kvp_segment_open(seg))
            return refuse(e, KVP_MC_UNAVAILABLE_IN_CURRENT_STATUS, 409,
                          seg->ssd        ? "%.150s is an SSD segment: it is not drained"
                          : seg->draining ? "%.150s is draining already"
                                          : "%.150s is not open (its owner is offering its "
                                            "objects back)",
                          segs[i]);
    }
    for (unsigned i = 0; i < nt; i++) {
        for (unsigned k = 0; k < n; k++)
            if (strcmp(segs[k], targets[i]) == 0)
                return refuse(e, KVP_MC_INVALID_PARAMS, 400, "%.150s is both drained and a target",
                              targets[i]);
        const kvp_segment_t *seg = kvp_segment_table_find_name(&st->segments, targets[i]);
        if (seg == NULL)
            return refuse(e, KVP_MC_SEGMENT_NOT_FOUND, 404, "no target segment %.150s is mounted",
                          targets[i]);
        if (!kvp_segment_open(seg))
            return refuse(e, KVP_MC_UNAVAILABLE_IN_CURRENT_STATUS, 409,
                          "target segment %.150s takes no new objects", targets[i]);
    }
    return true;
}

bool kvp_drain_job_create(kvp_master_state_t *st, const char *const *segments, unsigned n,
                          const char *const *targets, unsigned nt, uint32_t max_concurrency,
                          char *id, kvp_drain_err_t *e)
{
    if (!check(st, segments, n, targets, nt, max_concurrency, e))
        return false;
    if (st->drain_jobs == NULL) {
        if ((st->drain_jobs = calloc(1, sizeof(*st->drain_jobs))) == NULL)
            return refuse(e, KVP_MC_INTERNAL_ERROR, 500, "%s", "out of memory");
        st->drain_jobs_free = kvp_drain_jobs_free;
    }
    if (!room(st->drain_jobs))
        return refuse(e, KVP_MC_UNAVAILABLE_IN_CURRENT_STATUS, 409, "%s",
                      "64 drain jobs are running: wait for one to end");
    job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return refuse(e, KVP_MC_INTERNAL_ERROR, 500, "%s", "out of memory");
    for (unsigned i = 0; i < n; i++) {
        kvp_segment_t *seg = kvp_segment_table_find_name(&st->segments, segments[i]);
        j->segs[i] = (job_seg_t){.id = seg->id, .name = strdup(seg->name)};
        j->n_segs = i + 1;
        if (j->segs[i].name == NULL) {
            job_free(j);
            return refuse(e, KVP_MC_INTERNAL_ERROR, 500, "%s", "out of memory");
        }
    }
    for (unsigned i = 0; i < nt; i++)
        j->targets[i] = kvp_segment_table_find_name(&st->segments, targets[i])->id;
    j->n_targets = nt;
    new_id(j->id);
    j->status = KVP_JOB_CREATED;
    j->created_ms = j->updated_ms = wall_ms();
    snprintf(j->message, sizeof(j->message), "Drain job created");
    for (unsigned i = 0; i < n; i++) { /* as Drain: placement skips them from now on */
        kvp_segment_t *seg = kvp_segment_table_get(&st->segments, j->segs[i].id);
        seg->draining = true;
        KVP_LOG_INFO("segment %s (id %#llx) is draining (drain job %s): %llu objects to move "
                     "or drop",
                     seg->name, (unsigned long long)seg->id, j->id,
                     (unsigned long long)seg->objects);
    }
    st->drain_jobs->jobs[st->drain_jobs->n++] = j;
    memcpy(id, j->id, sizeof(j->id));
    return true;
}

static job_t *job_find(kvp_master_state_t *st, const char *id)
{
    for (unsigned i = 0; st->drain_jobs != NULL && i < st->drain_jobs->n; i++)
        if (strcmp(st->drain_jobs->jobs[i]->id, id) == 0)
            return st->drain_jobs->jobs[i];
    return NULL;
}

/* The moves in flight off segment id. */
static uint64_t moving(const kvp_master_state_t *st, uint64_t id)
{
    uint64_t n = 0;
    for (const kvp_move_t *mv = st->moves; mv != NULL; mv = mv->next)
        n += mv->from_segment_id == id;
    return n;
}

/* Where a job stands now: RUNNING while a segment is mounted; once all are gone, SUCCEEDED
 * (nothing lost) or FAILED. */
static void job_settle(job_t *j)
{
    if (final(j->status))
        return;
    unsigned left = 0;
    for (unsigned i = 0; i < j->n_segs; i++)
        left += !j->segs[i].gone;
    int status = left > 0 ? KVP_JOB_RUNNING : j->failed > 0 ? KVP_JOB_FAILED : KVP_JOB_SUCCEEDED;
    if (status == j->status)
        return;
    j->status = status;
    j->updated_ms = wall_ms();
    if (status == KVP_JOB_RUNNING)
        snprintf(j->message, sizeof(j->message), "Drain job running");
    else if (status == KVP_JOB_SUCCEEDED)
        snprintf(j->message, sizeof(j->message), "Drain job succeeded: %llu objects moved",
                 (unsigned long long)j->succeeded);
    else
        snprintf(j->message, sizeof(j->message),
                 "Drain job failed: %llu objects moved, %llu left the pool with their segment",
                 (unsigned long long)j->succeeded, (unsigned long long)j->failed);
}

static bool job_id_ok(const char *id, kvp_drain_err_t *e)
{
    bool ok = id != NULL && strlen(id) == KVP_DRAIN_JOB_ID_LEN;
    for (unsigned i = 0; ok && i < KVP_DRAIN_JOB_ID_LEN; i++)
        ok = (i == 8 || i == 13 || i == 18 || i == 23)
                 ? id[i] == '-'
                 : (id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f') ||
                       (id[i] >= 'A' && id[i] <= 'F');
    return ok || refuse(e, KVP_MC_INVALID_PARAMS, 400, "%s", "Missing or invalid job_id");
}

/* The job of id (a UUID's text), settled; NULL: none, or no id (e set). */
static job_t *job_asked(kvp_master_state_t *st, const char *id, kvp_drain_err_t *e)
{
    if (!job_id_ok(id, e))
        return NULL;
    job_t *j = job_find(st, id);
    if (j == NULL) {
        refuse(e, KVP_MC_JOB_NOT_FOUND, 404, "no drain job %.40s (or no longer kept)", id);
        return NULL;
    }
    job_settle(j);
    return j;
}

bool kvp_drain_job_query(kvp_master_state_t *st, const char *id, kvp_drain_job_view_t *v,
                         kvp_drain_err_t *e)
{
    job_t *j = job_asked(st, id, e);
    if (j == NULL)
        return false;
    memset(v, 0, sizeof(*v));
    memcpy(v->id, j->id, sizeof(v->id));
    v->status = j->status;
    v->created_ms = j->created_ms;
    v->updated_ms = j->updated_ms;
    for (unsigned i = 0; i < j->n_segs; i++) {
        v->segments[i] = j->segs[i].name;
        if (!j->segs[i].gone)
            v->active += moving(st, j->segs[i].id);
    }
    v->n_segments = j->n_segs;
    v->succeeded = j->succeeded;
    v->failed = j->failed;
    v->migrated_bytes = j->bytes;
    v->message = j->message;
    return true;
}

bool kvp_drain_job_cancel(kvp_master_state_t *st, const char *id, kvp_drain_err_t *e)
{
    job_t *j = job_asked(st, id, e);
    if (j == NULL)
        return false;
    return refuse(e, KVP_MC_UNAVAILABLE_IN_CURRENT_STATUS, 409, "%s",
                  final(j->status) ? "the drain job has ended"
                                   : "a kvpool drain runs to its end once its segments' owners "
                                     "were told: it cannot be canceled");
}

bool kvp_drain_segment_status(kvp_master_state_t *st, const char *name, int *status,
                              kvp_drain_err_t *e)
{
    const kvp_segment_t *seg = kvp_segment_table_find_name(&st->segments, name);
    if (seg != NULL) {
        *status = seg->draining ? KVP_SEG_STATUS_DRAINING : KVP_SEG_STATUS_OK;
        return true;
    }
    for (unsigned i = st->drain_jobs != NULL ? st->drain_jobs->n : 0; i-- > 0;) {
        const job_t *j = st->drain_jobs->jobs[i];
        for (unsigned k = 0; k < j->n_segs; k++)
            if (j->segs[k].gone && strcmp(j->segs[k].name, name) == 0) {
                *status = KVP_SEG_STATUS_DRAINED;
                return true;
            }
    }
    return refuse(e, KVP_MC_SEGMENT_NOT_FOUND, 404, "no segment %.150s is mounted", name);
}

void kvp_drain_jobs_moved(kvp_master_state_t *st, uint64_t from, uint64_t size)
{
    for (unsigned i = 0; st->drain_jobs != NULL && i < st->drain_jobs->n; i++) {
        job_t *j = st->drain_jobs->jobs[i];
        for (unsigned k = 0; k < j->n_segs && !final(j->status); k++)
            if (j->segs[k].id == from && !j->segs[k].gone) {
                j->succeeded++;
                j->bytes += size;
                j->updated_ms = wall_ms();
            }
    }
}

void kvp_drain_jobs_segment_gone(kvp_master_state_t *st, const kvp_segment_t *seg, uint64_t lost)
{
    for (unsigned i = 0; st->drain_jobs != NULL && i < st->drain_jobs->n; i++) {
        job_t *j = st->drain_jobs->jobs[i];
        for (unsigned k = 0; k < j->n_segs && !final(j->status); k++)
            if (j->segs[k].id == seg->id && !j->segs[k].gone) {
                j->segs[k].gone = true;
                j->failed += lost;
                j->updated_ms = wall_ms();
                job_settle(j);
            }
    }
}

unsigned kvp_drain_jobs_targets(kvp_master_state_t *st, uint64_t from, const kvp_segment_t **list,
                                unsigned max)
{
    unsigned n = 0;
    for (unsigned i = 0; st->drain_jobs != NULL && i < st->drain_jobs->n; i++) {
        const job_t *j = st->drain_jobs->jobs[i];
        bool ours = false;
        for (unsigned k = 0; k < j->n_segs && !final(j->status); k++)
            ours |= j->segs[k].id == from;
        for (unsigned t = 0; ours && t < j->n_targets && n < max; t++) {
            const kvp_segment_t *seg = kvp_segment_table_get(&st->segments, j->targets[t]);
            if (seg != NULL && kvp_segment_open(seg))
                list[n++] = seg;
        }
    }
    return n;
}

void kvp_drain_jobs_free(kvp_master_state_t *st)
{
    if (st->drain_jobs == NULL)
        return;
    for (unsigned i = 0; i < st->drain_jobs->n; i++)
        job_free(st->drain_jobs->jobs[i]);
    free(st->drain_jobs);
    st->drain_jobs = NULL;
}
