/*
 * heartbeat.c - the client's liveness heartbeat.
 *
 * A thread sends HEARTBEAT every params.heartbeat_ms on the shared master
 * connection. A broken connection (the master restarted, or dropped us
 * after --client-ttl of silence) is re-established by the call itself,
 * which remounts the segment: its old content is gone from the master's
 * view. The reply may also ask us to remount (the master does not know our
 * segment) or to drain it (kvp_request_drain from anyone): that drain runs
 * on its own thread; and offer copy and move tasks from our segment, run here (task.c).
 *
 * Thread: the heartbeat thread; start/stop from create/destroy. Its state is
 * its own (struct kvp_heartbeat): nothing else reads or writes it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/control/heartbeat.h"
#include "client/control/task.h"
#include "common/log.h"
#include "common/rpc.h"

struct kvp_heartbeat {
    kvp_heartbeat_params_t p;
    /* the master's segment table version we last received */
    uint64_t segments_version;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;
    bool closing;   /* stop began: start no new drain */
    bool tasks_ran; /* the last beat ran tasks: beat again at once (more may wait) */
    /* a drain asked for by someone else runs on its own thread */
    pthread_t drain_thread;
    _Atomic bool drain_running;
    bool drain_thread_started;
};

static void *drain_main(void *arg)
{
    kvp_heartbeat_t *hb = arg;
    uint64_t moved = 0, lost = 0;
    kvp_status_t st = kvp_drain_run(&hb->p.drain, hb->p.drain_timeout_ms, &moved, &lost);
    KVP_LOG_INFO("requested drain of %s: %s, %llu objects moved, %llu lost",
                 kvp_segment_name(hb->p.drain.seg), kvp_strerror(st), (unsigned long long)moved,
                 (unsigned long long)lost);
    atomic_store(&hb->drain_running, false);
    return NULL;
}

/* Start the drain someone asked for on its own thread (the heartbeat thread). */
static void drain_start(kvp_heartbeat_t *hb)
{
    pthread_mutex_lock(&hb->lock);
    if (!hb->closing) {
        if (hb->drain_thread_started) {
            pthread_join(hb->drain_thread, NULL); /* the previous one has finished */
            hb->drain_thread_started = false;
        }
        KVP_LOG_INFO("drain of segment %s requested", kvp_segment_name(hb->p.drain.seg));
        atomic_store(&hb->drain_running, true);
        if (pthread_create(&hb->drain_thread, NULL, drain_main, hb) == 0)
            hb->drain_thread_started = true;
        else
            atomic_store(&hb->drain_running, false);
    }
    pthread_mutex_unlock(&hb->lock);
}

/* One beat; its transport status (the reply's content is acted on, not checked). */
static kvp_status_t heartbeat_once(kvp_heartbeat_t *hb)
{
    kvp_segment_t *seg = hb->p.drain.seg;
    Kvpool__HeartbeatRequest req = KVPOOL__HEARTBEAT_REQUEST__INIT;
    uint64_t seg_id = seg != NULL ? kvp_segment_id(seg) : 0;
    int state = kvp_segment_state(seg);
    req.client_id = hb->p.client_id;
    req.segments_version = hb->segments_version;
    if (state == KVP_SEG_MOUNTED || state == KVP_SEG_DRAINING) {
        req.segment_ids = &seg_id;
        req.n_segment_ids = 1;
    }
    uint8_t *resp;
    size_t rlen;
    kvp_status_t st =
        kvp_session_call(hb->p.drain.session, KVP_RPC_HEARTBEAT, &req.base, &resp, &rlen);
    if (st != KVP_OK)
        return st; /* the next beat reconnects */
    Kvpool__HeartbeatResponse *hr = kvpool__heartbeat_response__unpack(NULL, rlen, resp);
    if (hr == NULL)
        return KVP_ERR_PROTOCOL;
    if (hr->segments_version != 0) {
        /* the table changed: attach the segments now, not at the first transfer */
        kvp_peers_update(hb->p.drain.peers, hr->segments, hr->n_segments);
        hb->segments_version = hr->segments_version;
    }
    /* (a remount since the request was built, e.g. by this very call's reconnect, already
     * answered it) */
    if (hr->remount && kvp_segment_state(seg) == KVP_SEG_MOUNTED && kvp_segment_id(seg) == seg_id) {
        KVP_LOG_WARN("the master does not know segment %s: mounting it again (empty)",
                     kvp_segment_name(seg));
        kvp_session_mount(hb->p.drain.session);
    }
    for (size_t i = 0; i < hr->n_drain_segment_ids; i++)
        if (kvp_segment_state(seg) == KVP_SEG_MOUNTED &&
            hr->drain_segment_ids[i] == kvp_segment_id(seg) && !atomic_load(&hb->drain_running))
            drain_start(hb);
    /* copy and move tasks from our segment (task.c): run here, together (a batch is the
     * time of its bytes on the wire, far below --client-ttl); more may wait: beat again */
    hb->tasks_ran = false;
    uint64_t ids[2 * 64];
    size_t n = 0;
    for (size_t i = 0; i < hr->n_tasks && n < 64; i++)
        if (kvp_segment_state(seg) == KVP_SEG_MOUNTED &&
            hr->tasks[i]->segment_id == kvp_segment_id(seg)) {
            ids[2 * n] = hr->tasks[i]->id_hi;
            ids[2 * n + 1] = hr->tasks[i]->id_lo;
            n++;
        }
    if (n > 0)
        hb->tasks_ran = kvp_task_run(&hb->p.drain, ids, n) > 0;
    kvpool__heartbeat_response__free_unpacked(hr, NULL);
    return KVP_OK;
}

static void *heartbeat_main(void *arg)
{
    kvp_heartbeat_t *hb = arg;
    pthread_mutex_lock(&hb->lock);
    while (!hb->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)hb->p.interval_ms * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        int rc = hb->tasks_ran ? ETIMEDOUT : 0; /* tasks ran: the next ones now */
        while (!hb->stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&hb->cond, &hb->lock, &ts);
        if (hb->stop)
            break;
        pthread_mutex_unlock(&hb->lock);
        (void)heartbeat_once(hb);
        pthread_mutex_lock(&hb->lock);
    }
    pthread_mutex_unlock(&hb->lock);
    return NULL;
}

kvp_status_t kvp_heartbeat_start(const kvp_heartbeat_params_t *params, kvp_heartbeat_t **hb_p)
{
    kvp_heartbeat_t *hb = calloc(1, sizeof(*hb));
    if (hb == NULL)
        return KVP_ERR_NOMEM;
    hb->p = *params;
    atomic_init(&hb->drain_running, false);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&hb->cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&hb->lock, NULL);
    /* one beat now: learn every mounted segment before the first put or get. It is also
     * the first call a client without a segment makes: a peer that accepts the connection
     * but does not answer it as a master (a hung master, another service) fails create
     * here, as a mount would, instead of every later call */
    kvp_status_t st = heartbeat_once(hb);
    if (st == KVP_OK && pthread_create(&hb->thread, NULL, heartbeat_main, hb) != 0)
        st = KVP_ERR_SYSTEM;
    if (st != KVP_OK) {
        pthread_cond_destroy(&hb->cond);
        pthread_mutex_destroy(&hb->lock);
        free(hb);
        return st;
    }
    *hb_p = hb;
    return KVP_OK;
}

void kvp_heartbeat_stop(kvp_heartbeat_t *hb)
{
    if (hb == NULL)
        return;
    /* A drain in progress finishes first, with heartbeats still going (the master
     * would otherwise drop us mid-drain after --client-ttl). */
    pthread_mutex_lock(&hb->lock);
    hb->closing = true;
    pthread_mutex_unlock(&hb->lock);
    while (atomic_load(&hb->drain_running))
        usleep(10 * 1000);
    pthread_mutex_lock(&hb->lock);
    hb->stop = true;
    pthread_cond_signal(&hb->cond);
    pthread_mutex_unlock(&hb->lock);
    pthread_join(hb->thread, NULL);
    if (hb->drain_thread_started)
        pthread_join(hb->drain_thread, NULL);
    pthread_cond_destroy(&hb->cond);
    pthread_mutex_destroy(&hb->lock);
    free(hb);
}
