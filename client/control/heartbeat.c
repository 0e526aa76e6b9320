/*
 * heartbeat.c - the client's liveness heartbeat.
 *
 * A thread sends HEARTBEAT every params.heartbeat_ms on the shared master
 * connection. A broken connection (the master restarted, or dropped us
 * after --client-ttl of silence) is re-established by the call itself,
 * which remounts the segment: its old content is gone from the master's
 * view. The reply may also ask us to remount (the master does not know our
 * segment) or to drain it (kvp_request_drain from anyone): that drain runs
 * on its own thread.
 *
 * Thread: the heartbeat thread; start/stop from create/destroy.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/client_priv.h"
#include "common/log.h"
#include "common/rpc.h"

static void *drain_main(void *arg)
{
    kvp_client_t *c = arg;
    uint64_t moved = 0, lost = 0;
    kvp_status_t st = kvp_drain(c, c->params.drain_timeout_ms, &moved, &lost);
    KVP_LOG_INFO("requested drain of %s: %s, %llu objects moved, %llu lost", c->seg_name,
                 kvp_strerror(st), (unsigned long long)moved, (unsigned long long)lost);
    atomic_store(&c->drain_running, false);
    return NULL;
}

/* One beat; its transport status (the reply's content is acted on, not checked). */
static kvp_status_t heartbeat_once(kvp_client_t *c)
{
    Kvpool__HeartbeatRequest req = KVPOOL__HEARTBEAT_REQUEST__INIT;
    uint64_t seg_id = atomic_load(&c->seg_id);
    int state = atomic_load(&c->seg_state);
    req.client_id = c->client_id;
    req.segments_version = atomic_load(&c->segments_version);
    if (state == KVP_SEG_MOUNTED || state == KVP_SEG_DRAINING) {
        req.segment_ids = &seg_id;
        req.n_segment_ids = 1;
    }
    uint8_t *resp;
    size_t rlen;
    kvp_status_t st = kvp_client_call(c, KVP_RPC_HEARTBEAT, &req.base, &resp, &rlen);
    if (st != KVP_OK)
        return st; /* the next beat reconnects */
    Kvpool__HeartbeatResponse *hr = kvpool__heartbeat_response__unpack(NULL, rlen, resp);
    if (hr == NULL)
        return KVP_ERR_PROTOCOL;
    if (hr->segments_version != 0) {
        /* the table changed: attach the segments now, not at the first transfer */
        kvp_client_peers_update(c, hr->segments, hr->n_segments);
        atomic_store(&c->segments_version, hr->segments_version);
    }
    /* (a remount since the request was built, e.g. by this very call's reconnect, already
     * answered it) */
    if (hr->remount && atomic_load(&c->seg_state) == KVP_SEG_MOUNTED &&
        atomic_load(&c->seg_id) == seg_id) {
        KVP_LOG_WARN("the master does not know segment %s: mounting it again (empty)", c->seg_name);
        kvp_client_mount(c);
    }
    for (size_t i = 0; i < hr->n_drain_segment_ids; i++) {
        if (hr->drain_segment_ids[i] != atomic_load(&c->seg_id) ||
            atomic_load(&c->seg_state) != KVP_SEG_MOUNTED || atomic_load(&c->drain_running))
            continue;
        pthread_mutex_lock(&c->hb_lock);
        if (!c->hb_closing) {
            if (c->drain_thread_started) {
                pthread_join(c->drain_thread, NULL); /* the previous one has finished */
                c->drain_thread_started = false;
            }
            KVP_LOG_INFO("drain of segment %s requested", c->seg_name);
            atomic_store(&c->drain_running, true);
            if (pthread_create(&c->drain_thread, NULL, drain_main, c) == 0)
                c->drain_thread_started = true;
            else
                atomic_store(&c->drain_running, false);
        }
        pthread_mutex_unlock(&c->hb_lock);
    }
    kvpool__heartbeat_response__free_unpacked(hr, NULL);
    return KVP_OK;
}

static void *heartbeat_main(void *arg)
{
    kvp_client_t *c = arg;
    pthread_mutex_lock(&c->hb_lock);
    while (!c->hb_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)c->params.heartbeat_ms * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        int rc = 0;
        while (!c->hb_stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&c->hb_cond, &c->hb_lock, &ts);
        if (c->hb_stop)
            break;
        pthread_mutex_unlock(&c->hb_lock);
        (void)heartbeat_once(c);
        pthread_mutex_lock(&c->hb_lock);
    }
    pthread_mutex_unlock(&c->hb_lock);
    return NULL;
}

kvp_status_t kvp_client_heartbeat_start(kvp_client_t *c)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->hb_cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&c->hb_lock, NULL);
    c->hb_stop = false;
    /* one beat now: learn every mounted segment before the first put or get. It is also
     * the first call a client without a segment makes: a peer that accepts the connection
     * but does not answer it as a master (a hung master, another service) fails create
     * here, as a mount would, instead of every later call */
    kvp_status_t st = heartbeat_once(c);
    if (st != KVP_OK && c->disc != NULL)
        kvp_api_fail("create: the leader found through etcd did not answer a heartbeat: %s",
                     kvp_strerror(st));
    else if (st != KVP_OK)
        kvp_api_fail("create: the master at %s:%u did not answer a heartbeat: %s", c->master_host,
                     (unsigned)c->master_port, kvp_strerror(st));
    else if (pthread_create(&c->hb_thread, NULL, heartbeat_main, c) != 0)
        st = KVP_ERR_SYSTEM;
    if (st != KVP_OK) {
        pthread_cond_destroy(&c->hb_cond);
        pthread_mutex_destroy(&c->hb_lock);
        return st;
    }
    c->hb_started = true;
    return KVP_OK;
}

void kvp_client_heartbeat_stop(kvp_client_t *c)
{
    if (!c->hb_started)
        return;
    /* A drain in progress finishes first, with heartbeats still going (the master
     * would otherwise drop us mid-drain after --client-ttl). */
    pthread_mutex_lock(&c->hb_lock);
    c->hb_closing = true;
    pthread_mutex_unlock(&c->hb_lock);
    while (atomic_load(&c->drain_running))
        usleep(10 * 1000);
    pthread_mutex_lock(&c->hb_lock);
    c->hb_stop = true;
    pthread_cond_signal(&c->hb_cond);
    pthread_mutex_unlock(&c->hb_lock);
    pthread_join(c->hb_thread, NULL);
    if (c->drain_thread_started)
        pthread_join(c->drain_thread, NULL);
    c->drain_thread_started = false;
    pthread_cond_destroy(&c->hb_cond);
    pthread_mutex_destroy(&c->hb_lock);
    c->hb_started = false;
}
