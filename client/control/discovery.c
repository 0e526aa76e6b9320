/*
 * discovery.c - finding the leading kvpool-master through etcd.
 *
 * Design (docs/operations.md, "High availability"). A client given
 * etcd://HOST:PORT[,HOST:PORT...]/CLUSTER as its master reads the leader
 * key /kvpool/CLUSTER/leader (the leader's control address; its create
 * revision is the leader's epoch) before each connect: the master
 * connection's resolve callback (control/mconn.c), which also makes calls
 * wait through a failover instead of failing. A watch thread follows the
 * key: when it changes or goes, the callback drops the connections to the
 * old leader at once (a former leader is never asked again, even if it
 * still answers), rather than when a call next fails.
 *
 * etcd's TLS and credentials come from the environment (KVPOOL_ETCD_*,
 * docs/security.md, "etcd"; read by the client when it is
 * created, client/env.c, and handed in), so that the Python drop-in picks
 * them up without new arguments; both handles are made at create, where a
 * setting that cannot be used fails at once.
 *
 * Thread: kvp_discovery_leader from any thread (one etcd handle under a
 * mutex); the watch thread has its own handle.
 */
#include "client/control/discovery.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/etcd.h"
#include "common/log.h"
#include "common/parse.h"

struct kvp_discovery {
    char endpoints[512];
    char key[200];
    uint32_t timeout_ms;
    pthread_mutex_t lock;
    kvp_etcd_t *etcd;       /* lock */
    char last_err[512];     /* lock: why the last leader read failed; "" when it did not */
    kvp_etcd_t *watch_etcd; /* the watch thread's */
    kvp_discovery_change_cb_t cb;
    void *arg;
    pthread_t thread;
    bool started;
    atomic_bool stop;
};

#define PREFIX "etcd://"
#define WATCH_WINDOW_MS 2000

bool kvp_discovery_is_etcd(const char *addr)
{
    return addr != NULL && strncmp(addr, PREFIX, strlen(PREFIX)) == 0;
}

static void nap(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *watch_main(void *arg)
{
    kvp_discovery_t *d = arg;
    kvp_etcd_t *e = d->watch_etcd;
    int64_t seen = -1; /* the last leader's key create revision (its epoch); -1: none yet */
    while (!atomic_load(&d->stop)) {
        int64_t create_rev = 0, rev = 0;
        char *val = NULL;
        kvp_status_t st = kvp_etcd_get(e, d->key, &val, NULL, &create_rev, NULL, &rev);
        if (st != KVP_OK && st != KVP_ERR_NOT_FOUND) {
            nap(200); /* etcd away: the connections find out by themselves */
            continue;
        }
        /* a new leader (not the key going: the old leader is dead or answers nothing) */
        if (st == KVP_OK && create_rev != seen) {
            if (seen >= 0 && d->cb != NULL)
                d->cb(d->arg, val);
            seen = create_rev;
        }
        free(val);
        /* Watched 2 s at a time, then read and watched again: an etcd member cut off from
         * the others (with the old leader, say) gives a silent watch, not an error, so a
         * window is how long a change can go unseen; the next window starts on a member
         * that answers (etcd.c moves on from one that does not within its timeout). One
         * read and one watch a client every 2 s. */
        kvp_etcd_event_t ev;
        st = kvp_etcd_watch(e, d->key, rev + 1, WATCH_WINDOW_MS, &d->stop, &ev);
        if (st == KVP_OK)
            kvp_etcd_event_cleanup(&ev);
        else if (st != KVP_ERR_TIMEOUT && st != KVP_ERR_SHUTDOWN)
            nap(200);
    }
    return NULL;
}

kvp_status_t kvp_discovery_create(const char *addr, uint32_t timeout_ms,
                                  const kvp_etcd_security_t *security, kvp_discovery_change_cb_t cb,
                                  void *arg, kvp_discovery_t **d_p, char *err, size_t err_len)
{
    if (!kvp_discovery_is_etcd(addr))
        return KVP_ERR_INVALID_ARG;
    const char *rest = addr + strlen(PREFIX);
    const char *slash = strrchr(rest, '/');
    if (slash == NULL || slash == rest || slash[1] == '\0' || strlen(slash + 1) > 128 ||
        (size_t)(slash - rest) >= sizeof(((kvp_discovery_t *)0)->endpoints))
        return KVP_ERR_INVALID_ARG;
    kvp_discovery_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return KVP_ERR_NOMEM;
    memcpy(d->endpoints, rest, (size_t)(slash - rest));
    snprintf(d->key, sizeof(d->key), "/kvpool/%s/leader", slash + 1);
    d->timeout_ms = timeout_ms < 1000 ? timeout_ms : 1000;
    d->cb = cb;
    d->arg = arg;
    pthread_mutex_init(&d->lock, NULL);
    kvp_etcd_params_t ep = {
        .endpoints = d->endpoints, .timeout_ms = d->timeout_ms, .security = security};
    kvp_status_t st = kvp_etcd_create_ex(&ep, &d->etcd, err, err_len);
    if (st == KVP_OK)
        st = kvp_etcd_create_ex(&ep, &d->watch_etcd, err, err_len);
    if (st == KVP_OK && pthread_create(&d->thread, NULL, watch_main, d) == 0)
        d->started = true;
    else if (st == KVP_OK)
        st = KVP_ERR_SYSTEM;
    if (st != KVP_OK) {
        kvp_discovery_destroy(d);
        return st;
    }
    *d_p = d;
    return KVP_OK;
}

void kvp_discovery_stop(kvp_discovery_t *d)
{
    if (d == NULL)
        return;
    atomic_store(&d->stop, true);
    if (d->started)
        pthread_join(d->thread, NULL);
    d->started = false;
}

void kvp_discovery_destroy(kvp_discovery_t *d)
{
    if (d == NULL)
        return;
    kvp_discovery_stop(d);
    kvp_etcd_destroy(d->watch_etcd);
    kvp_etcd_destroy(d->etcd);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

kvp_status_t kvp_discovery_leader(void *arg, char *host, size_t cap, uint16_t *port_p)
{
    kvp_discovery_t *d = arg;
    char *val = NULL;
    pthread_mutex_lock(&d->lock);
    kvp_status_t st = kvp_etcd_get(d->etcd, d->key, &val, NULL, NULL, NULL, NULL);
    snprintf(d->last_err, sizeof(d->last_err), "%s",
             st == KVP_OK || st == KVP_ERR_NOT_FOUND ? "" : kvp_etcd_error(d->etcd));
    pthread_mutex_unlock(&d->lock);
    if (st != KVP_OK && st != KVP_ERR_NOT_FOUND)
        KVP_LOG_WARN_LIMITED("cannot find the master's leader in etcd: %s", d->last_err);
    if (st == KVP_OK && kvp_parse_hostport(val, host, cap, port_p) != KVP_OK)
        st = KVP_ERR_PROTOCOL;
    if (st != KVP_OK && st != KVP_ERR_NOT_FOUND)
        st = KVP_ERR_CONNECT;
    free(val);
    return st;
}

void kvp_discovery_last_error(kvp_discovery_t *d, char *buf, size_t cap)
{
    pthread_mutex_lock(&d->lock);
    snprintf(buf, cap, "%s", d->last_err);
    pthread_mutex_unlock(&d->lock);
}
