/*
 * async.c - asynchronous batches: kvp_aq_*, a queue that runs put / get / exist
 * batches on a fixed pool of worker threads and posts their completions to an
 * eventfd (the libuv threadpool's shape: work goes out through a queue, results
 * come back through a queue and a wakeup fd the caller's loop watches).
 *
 * Design: every batch a queue can hold is a slot made at create
 * (KVP_AQ_MAX_INFLIGHT of them), so submitting allocates nothing: a slot goes
 * from the free stack to the submitted FIFO (kvp_aq_put/get/exist), to a worker,
 * to the completed FIFO, and back to the free stack when kvp_aq_reap hands its
 * completion out. A batch runs as the synchronous call (kvp_batch_put_from,
 * kvp_batch_get_into, kvp_batch_is_exist) on the worker, with the worker's own
 * scratch arena and last-error record. The put config is copied into the slot
 * with its strings, so the caller's may go away after the submit.
 *
 * Invariant (under lock): the eventfd's counter is non-zero exactly while the
 * completed FIFO is not empty. The worker that makes it non-empty writes 1, the
 * reap that empties it reads the counter down; both under the lock, so a poll()
 * on the fd never wakes for nothing and never misses a completion.
 *
 * Thread: submit and reap from any thread; workers run batches; destroy waits
 * for them (no other call on the queue may be in flight then).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "client/api.h"
#include "common/log.h"
#include "common/macros.h"

#define AQ_WORKERS_DEFAULT 2
#define AQ_WORKERS_MAX 64

typedef enum aq_kind {
    AQ_PUT,
    AQ_GET,
    AQ_EXIST,
} aq_kind_t;

/* One batch, from submit to reap. The arrays are the caller's, borrowed until reaped. */
typedef struct aq_job {
    struct aq_job *next; /* in the free stack or one of the FIFOs */
    aq_kind_t kind;
    const char *const *keys;
    const void *const *bufs; /* put: read; get: written (const dropped when run) */
    const size_t *sizes;     /* put: sizes; get: capacities */
    size_t n;
    void *results; /* kvp_status_t (put), int64_t (get), int (exist) */
    bool has_config;
    kvp_put_config_t config; /* strings pointing at the two below */
    char preferred_segment[256];
    char medium[32];
    char preferred_names[8][256]; /* config.preferred_segments, copied */
    const char *preferred_ptrs[8];
    kvp_aq_completion_t done;
} aq_job_t;

typedef struct aq_fifo {
    aq_job_t *head, *tail;
} aq_fifo_t;

struct kvp_aq {
    kvp_client_t *client; /* borrowed */
    int efd;
    pthread_mutex_t lock; /* everything below */
    pthread_cond_t work;  /* a batch was submitted, or stop */
    aq_job_t *free;       /* stack of unused slots */
    aq_fifo_t submitted;
    aq_fifo_t completed;
    bool closing; /* destroy began: refuse submissions */
    bool stop;    /* workers exit once the submitted FIFO is empty */
    unsigned n_threads;
    pthread_t *threads;
    aq_job_t *slots; /* KVP_AQ_MAX_INFLIGHT */
};

static void fifo_push(aq_fifo_t *f, aq_job_t *job)
{
    job->next = NULL;
    if (f->tail != NULL)
        f->tail->next = job;
    else
        f->head = job;
    f->tail = job;
}

static aq_job_t *fifo_pop(aq_fifo_t *f)
{
    aq_job_t *job = f->head;
    if (job != NULL) {
        f->head = job->next;
        if (f->head == NULL)
            f->tail = NULL;
    }
    return job;
}

/* Worker thread: the batch call, with the config copied at submit. */
static kvp_status_t job_run(kvp_client_t *client, aq_job_t *job)
{
    switch (job->kind) {
    case AQ_PUT:
        return kvp_batch_put_from(client, job->keys, job->bufs, job->sizes, job->n,
                                  job->has_config ? &job->config : NULL, job->results);
    case AQ_GET:
        return kvp_batch_get_into(client, job->keys, (void *const *)job->bufs, job->sizes, job->n,
                                  job->results);
    case AQ_EXIST:
        return kvp_batch_is_exist(client, job->keys, job->n, job->results, NULL);
    }
    return KVP_ERR_INTERNAL;
}

static void *worker_main(void *arg)
{
    kvp_aq_t *aq = arg;
    pthread_mutex_lock(&aq->lock);
    for (;;) {
        while (aq->submitted.head == NULL && !aq->stop)
            pthread_cond_wait(&aq->work, &aq->lock);
        aq_job_t *job = fifo_pop(&aq->submitted);
        if (job == NULL)
            break; /* stop, and nothing left to run */
        pthread_mutex_unlock(&aq->lock);
        job->done.status = job_run(aq->client, job);
        pthread_mutex_lock(&aq->lock);
        if (aq->completed.head == NULL) {
            uint64_t one = 1;
            /* the counter is 0 here (invariant), so this cannot overflow or block */
            if (write(aq->efd, &one, sizeof(one)) != sizeof(one))
                KVP_LOG_ERROR("async queue: eventfd write failed: %m");
        }
        fifo_push(&aq->completed, job);
    }
    pthread_mutex_unlock(&aq->lock);
    return NULL;
}

/* Stop the workers [0, n) started and join them: each runs what is still submitted first. */
static void workers_stop(kvp_aq_t *aq, unsigned n)
{
    pthread_mutex_lock(&aq->lock);
    aq->stop = true;
    pthread_cond_broadcast(&aq->work);
    pthread_mutex_unlock(&aq->lock);
    for (unsigned i = 0; i < n; i++)
        pthread_join(aq->threads[i], NULL);
}

static kvp_status_t aq_create_impl(kvp_client_t *client, unsigned workers, kvp_aq_t **aq_p)
{
    if (client == NULL || aq_p == NULL || workers > AQ_WORKERS_MAX) {
        if (workers > AQ_WORKERS_MAX)
            kvp_api_fail("aq_create: workers must be 0..%d (got %u)", AQ_WORKERS_MAX, workers);
        return KVP_ERR_INVALID_ARG;
    }
    kvp_status_t status = KVP_ERR_NOMEM;
    kvp_aq_t *aq = calloc(1, sizeof(*aq));
    if (aq == NULL)
        return status;
    aq->client = client;
    aq->n_threads = workers ? workers : AQ_WORKERS_DEFAULT;
    aq->slots = calloc(KVP_AQ_MAX_INFLIGHT, sizeof(*aq->slots));
    aq->threads = calloc(aq->n_threads, sizeof(*aq->threads));
    if (aq->slots == NULL || aq->threads == NULL)
        goto err_free_aq;
    for (size_t i = KVP_AQ_MAX_INFLIGHT; i-- > 0;) {
        aq->slots[i].next = aq->free;
        aq->free = &aq->slots[i];
    }

    status = KVP_ERR_SYSTEM;
    aq->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (aq->efd < 0) {
        kvp_api_fail("aq_create: eventfd: %s", strerror(errno));
        goto err_free_aq;
    }
    pthread_mutex_init(&aq->lock, NULL);
    pthread_cond_init(&aq->work, NULL);

    unsigned started = 0;
    for (; started < aq->n_threads; started++) {
        int err = pthread_create(&aq->threads[started], NULL, worker_main, aq);
        if (err != 0) {
            kvp_api_fail("aq_create: cannot start worker thread %u: %s", started, strerror(err));
            goto err_stop_workers;
        }
    }
    *aq_p = aq;
    return KVP_OK;

err_stop_workers:
    workers_stop(aq, started);
    pthread_cond_destroy(&aq->work);
    pthread_mutex_destroy(&aq->lock);
    close(aq->efd);
err_free_aq:
    free(aq->threads);
    free(aq->slots);
    free(aq);
    return status;
}

kvp_status_t kvp_aq_create(kvp_client_t *client, unsigned workers, kvp_aq_t **aq_p)
{
    kvp_api_enter();
    return (kvp_status_t)kvp_api_leave(aq_create_impl(client, workers, aq_p), "aq_create");
}

void kvp_aq_destroy(kvp_aq_t *aq)
{
    if (aq == NULL)
        return;
    pthread_mutex_lock(&aq->lock);
    aq->closing = true;
    pthread_mutex_unlock(&aq->lock);
    workers_stop(aq, aq->n_threads); /* every submitted batch has run when it returns */
    pthread_cond_destroy(&aq->work);
    pthread_mutex_destroy(&aq->lock);
    close(aq->efd);
    free(aq->threads);
    free(aq->slots);
    free(aq);
}

int kvp_aq_fd(kvp_aq_t *aq)
{
    return aq != NULL ? aq->efd : KVP_ERR_INVALID_ARG;
}

/* Copy a config string into the slot's buffer; false when it does not fit. */
static bool copy_config_string(const char **s, char *buf, size_t cap)
{
    if (*s == NULL)
        return true;
    size_t len = strnlen(*s, cap);
    if (len == cap)
        return false;
    memcpy(buf, *s, len + 1);
    *s = buf;
    return true;
}

/* job->config.preferred_segments, copied into the job (8 names of 255 bytes at most). */
static bool copy_config_list(aq_job_t *job)
{
    kvp_put_config_t *c = &job->config;
    if (c->group_ids != NULL) {
        kvp_api_fail("aq: group_ids are not supported by the async queue: use kvp_put");
        return false;
    }
    if (c->preferred_segments == NULL || c->n_preferred_segments == 0) {
        c->preferred_segments = NULL;
        c->n_preferred_segments = 0;
        return true;
    }
    if (c->n_preferred_segments > 8)
        return false;
    for (size_t i = 0; i < c->n_preferred_segments; i++) {
        job->preferred_ptrs[i] = c->preferred_segments[i];
        if (!copy_config_string(&job->preferred_ptrs[i], job->preferred_names[i],
                                sizeof(job->preferred_names[i])))
            return false;
    }
    c->preferred_segments = job->preferred_ptrs;
    return true;
}

/* Take a slot, fill it from `tmpl` (and the config), queue it for a worker. */
static kvp_status_t submit(kvp_aq_t *aq, const aq_job_t *tmpl, const kvp_put_config_t *config)
{
    if (aq == NULL)
        return KVP_ERR_INVALID_ARG;
    kvp_put_config_t cfg;
    if (config != NULL) {
        kvp_put_config_init(&cfg);
        memcpy(&cfg, config, KVP_MIN(config->size, sizeof(cfg)));
        cfg.size = sizeof(cfg);
    }
    pthread_mutex_lock(&aq->lock);
    kvp_status_t status = KVP_ERR_SHUTDOWN;
    aq_job_t *job = aq->free;
    if (aq->closing)
        goto out_unlock;
    status = KVP_ERR_TOO_MANY;
    if (job == NULL) {
        kvp_api_fail("aq: %d batches submitted and not reaped: reap completions first",
                     KVP_AQ_MAX_INFLIGHT);
        goto out_unlock;
    }
    aq->free = job->next;
    *job = *tmpl;
    job->has_config = config != NULL;
    if (config != NULL) {
        job->config = cfg;
        if (!copy_config_string(&job->config.preferred_segment, job->preferred_segment,
                                sizeof(job->preferred_segment)) ||
            !copy_config_string(&job->config.medium, job->medium, sizeof(job->medium)) ||
            !copy_config_list(job)) {
            kvp_api_fail("aq_put: a config string is too long (preferred_segment: at most %zu "
                         "bytes, medium: %zu)",
                         sizeof(job->preferred_segment) - 1, sizeof(job->medium) - 1);
            job->next = aq->free;
            aq->free = job;
            status = KVP_ERR_INVALID_ARG;
            goto out_unlock;
        }
    }
    fifo_push(&aq->submitted, job);
    pthread_cond_signal(&aq->work);
    status = KVP_OK;
out_unlock:
    pthread_mutex_unlock(&aq->lock);
    return status;
}

kvp_status_t kvp_aq_put(kvp_aq_t *aq, const char *const *keys, const void *const *bufs,
                        const size_t *sizes, size_t n, const kvp_put_config_t *config,
                        kvp_status_t *results, void *user_data)
{
    kvp_api_enter();
    aq_job_t tmpl = {.kind = AQ_PUT,
                     .keys = keys,
                     .bufs = bufs,
                     .sizes = sizes,
                     .n = n,
                     .results = results,
                     .done.user_data = user_data};
    return (kvp_status_t)kvp_api_leave(submit(aq, &tmpl, config), "aq_put");
}

kvp_status_t kvp_aq_get(kvp_aq_t *aq, const char *const *keys, void *const *bufs,
                        const size_t *caps, size_t n, int64_t *results, void *user_data)
{
    kvp_api_enter();
    aq_job_t tmpl = {.kind = AQ_GET,
                     .keys = keys,
                     .bufs = (const void *const *)bufs,
                     .sizes = caps,
                     .n = n,
                     .results = results,
                     .done.user_data = user_data};
    return (kvp_status_t)kvp_api_leave(submit(aq, &tmpl, NULL), "aq_get");
}

kvp_status_t kvp_aq_exist(kvp_aq_t *aq, const char *const *keys, size_t n, int *results,
                          void *user_data)
{
    kvp_api_enter();
    aq_job_t tmpl = {
        .kind = AQ_EXIST, .keys = keys, .n = n, .results = results, .done.user_data = user_data};
    return (kvp_status_t)kvp_api_leave(submit(aq, &tmpl, NULL), "aq_exist");
}

size_t kvp_aq_reap(kvp_aq_t *aq, kvp_aq_completion_t *out, size_t max)
{
    if (aq == NULL || out == NULL)
        return 0;
    size_t k = 0;
    pthread_mutex_lock(&aq->lock);
    aq_job_t *job;
    while (k < max && (job = fifo_pop(&aq->completed)) != NULL) {
        out[k++] = job->done;
        job->next = aq->free;
        aq->free = job;
    }
    if (k > 0 && aq->completed.head == NULL) {
        uint64_t count;
        /* the counter is non-zero here (invariant): the read cannot fail with EAGAIN */
        if (read(aq->efd, &count, sizeof(count)) != sizeof(count))
            KVP_LOG_ERROR("async queue: eventfd read failed: %m");
    }
    pthread_mutex_unlock(&aq->lock);
    return k;
}
