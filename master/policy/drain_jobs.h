/*
 * drain_jobs.h - Mooncake's drain jobs over kvpool's drain (see drain_jobs.c): a job drains
 * named segments onto others (their owners move the objects: rpc/drain_calls.c), and is
 * asked after by id; the master's HTTP views serve it (/api/v1/drain_jobs,
 * /api/v1/segments/status: obs/http_views.c).
 *
 * Thread: master loop only.
 */
#ifndef KVP_MASTER_POLICY_DRAIN_JOBS_H
#define KVP_MASTER_POLICY_DRAIN_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "master/core/state.h"

#define KVP_DRAIN_JOBS_MAX 64u         /* kept, running or ended; the oldest ended goes first */
#define KVP_DRAIN_JOB_SEGMENTS_MAX 16u /* segments one job drains */
#define KVP_DRAIN_JOB_TARGETS_MAX 8u   /* segments it moves their objects to (none: any) */
#define KVP_DRAIN_JOB_ID_LEN 36u       /* a UUID's text */

/* Mooncake's numbers (JobStatus, SegmentStatus) */
enum {
    KVP_JOB_CREATED = 0,
    KVP_JOB_PLANNING = 1,
    KVP_JOB_RUNNING = 2,
    KVP_JOB_SUCCEEDED = 3,
    KVP_JOB_FAILED = 4,
    KVP_JOB_CANCELED = 5,
};
enum {
    KVP_SEG_STATUS_OK = 1,
    KVP_SEG_STATUS_DRAINING = 2,
    KVP_SEG_STATUS_DRAINED = 3,
};

/* Mooncake's codes of a refusal, and the HTTP status it is answered with */
#define KVP_MC_INVALID_PARAMS (-600)
#define KVP_MC_SEGMENT_NOT_FOUND (-101)
#define KVP_MC_UNAVAILABLE_IN_CURRENT_STATUS (-1010)
#define KVP_MC_JOB_NOT_FOUND (-1402)
#define KVP_MC_INTERNAL_ERROR (-1)

/* What a job says of itself (QueryDrainJob's answer). */
typedef struct kvp_drain_job_view {
    char id[KVP_DRAIN_JOB_ID_LEN + 1];
    int status;
    uint64_t created_ms, updated_ms; /* wall clock, ms since the epoch */
    const char *segments[KVP_DRAIN_JOB_SEGMENTS_MAX];
    unsigned n_segments;
    uint64_t succeeded, failed, active, migrated_bytes;
    const char *message;
} kvp_drain_job_view_t;

/* A refusal: Mooncake's code, the HTTP status and why (into err). */
typedef struct kvp_drain_err {
    int code;
    unsigned http;
    char msg[200];
} kvp_drain_err_t;

/* Start a job draining segments[0..n) (mounted DRAM segments, none draining) onto
 * targets[0..nt) (mounted segments taking new objects; none: wherever placement puts them).
 * true: its id in id (KVP_DRAIN_JOB_ID_LEN + 1 bytes), the segments draining from now on. */
bool kvp_drain_job_create(kvp_master_state_t *st, const char *const *segments, unsigned n,
                          const char *const *targets, unsigned nt, uint32_t max_concurrency,
                          char *id, kvp_drain_err_t *e);

/* The job of that id as it stands now; false: none (e set). */
bool kvp_drain_job_query(kvp_master_state_t *st, const char *id, kvp_drain_job_view_t *v,
                         kvp_drain_err_t *e);

/* Cancel a job: refused (a kvpool drain, once its owners were told, runs to its end). */
bool kvp_drain_job_cancel(kvp_master_state_t *st, const char *id, kvp_drain_err_t *e);

/* Mooncake's status of the segment named name (KVP_SEG_STATUS_*); false: none (e set). A
 * segment a job emptied reads DRAINED after its owner unmounted it, until a segment of that
 * name mounts again or the job is no longer kept. */
bool kvp_drain_segment_status(kvp_master_state_t *st, const char *name, int *status,
                              kvp_drain_err_t *e);

/* Hooks: a move off segment from finished (its object's size); a segment leaving, `lost`
 * of its objects gone with it (their last replica). */
void kvp_drain_jobs_moved(kvp_master_state_t *st, uint64_t from, uint64_t size);
void kvp_drain_jobs_segment_gone(kvp_master_state_t *st, const kvp_segment_t *seg, uint64_t lost);

/* The segments a move off `from` should go to first (a running job's targets that take new
 * objects): into list, at most max; how many. */
unsigned kvp_drain_jobs_targets(kvp_master_state_t *st, uint64_t from, const kvp_segment_t **list,
                                unsigned max);

void kvp_drain_jobs_free(kvp_master_state_t *st);

#endif
