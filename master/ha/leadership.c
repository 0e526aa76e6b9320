/*
 * leadership.c - the master's side of the election (see leadership.h).
 *
 * Design: the election (common/election.h) campaigns and keeps the lease on threads of
 * its own; here the loop asks it, before each request and twice a second, whether this
 * master leads under which epoch. A master that just won starts from an empty index, one
 * that led before under another epoch drops everything first (from the tick, never while
 * a connection is being served), and a leader that lost for good steps down. The standby
 * list Stat shows is read from etcd once a second by a thread of its own (a blocking
 * read) and copied into the state by the tick.
 *
 * Thread: the loop's, except ha_main (the lister) which touches only l->standbys under
 * l->lock.
 */
#include "master/ha/leadership.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"

void kvp_leadership_init(kvp_leadership_t *l)
{
    memset(l, 0, sizeof(*l));
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->cond, NULL);
}

bool kvp_leadership_may_serve(kvp_leadership_t *l, kvp_master_state_t *st)
{
    if (l->el == NULL)
        return true;
    uint64_t epoch;
    if (!kvp_election_leading(l->el, kvp_now_ms(), &epoch))
        return false;
    if (epoch != l->epoch) {
        if (l->epoch != 0) {
            /* led before, under another epoch: that index is stale. Dropped by the loop
             * (kvp_leadership_tick), never here: a connection is being served. */
            l->reset_pending = true;
            return false;
        }
        if (l->on_lead != NULL) {
            uint64_t now = kvp_now_ms();
            if (now < l->on_lead_retry_ms || !l->on_lead(l->on_lead_arg, st)) {
                if (now >= l->on_lead_retry_ms)
                    l->on_lead_retry_ms = now + 1000;
                return false;
            }
        }
        l->epoch = epoch;
        st->epoch = epoch;
        snprintf(st->leader, sizeof(st->leader), "%s", l->self);
        st->rebuild_until_ms = kvp_now_ms() + KVP_REBUILD_GRACE_MS;
        KVP_LOG_INFO("leading cluster as %s, epoch %llu: the index starts empty; segment owners "
                     "remount and offer their records",
                     l->self, (unsigned long long)epoch);
    }
    return true;
}

bool kvp_leadership_serving(const kvp_leadership_t *l)
{
    uint64_t epoch = 0;
    return l->el == NULL || (kvp_election_leading(l->el, kvp_now_ms(), &epoch) &&
                             epoch == l->epoch && !l->reset_pending);
}

void kvp_leadership_not_leader_msg(const kvp_leadership_t *l, char *buf, size_t len)
{
    char leader[300];
    uint64_t epoch = 0;
    if (kvp_election_leader(l->el, leader, sizeof(leader), &epoch) == KVP_OK &&
        strcmp(leader, l->self) != 0)
        snprintf(buf, len, "%.100s is a standby: the leader is %.100s (epoch %llu)", l->self,
                 leader, (unsigned long long)epoch);
    else if (l->epoch == 0)
        snprintf(buf, len, "%.100s is a standby: campaigning, no leader known yet", l->self);
    else
        snprintf(buf, len, "%.100s is not sure it still leads (its etcd lease is unconfirmed)",
                 l->self);
}

void kvp_leadership_tick(kvp_leadership_t *l, kvp_master_state_t *st, unsigned n_conns,
                         kvp_leadership_drop_cb_t *drop, void *drop_arg)
{
    if (l->el == NULL)
        return;
    char leader[300] = "";
    uint64_t epoch = 0;
    bool known = kvp_election_leader(l->el, leader, sizeof(leader), &epoch) == KVP_OK;
    if (l->reset_pending ||
        (l->epoch != 0 && known && (strcmp(leader, l->self) != 0 || epoch != l->epoch) &&
         !kvp_election_leading(l->el, kvp_now_ms(), NULL))) {
        KVP_LOG_WARN("stepping down: %s leads now (epoch %llu, was %llu here); dropping %llu "
                     "objects and %u connections",
                     leader, (unsigned long long)epoch, (unsigned long long)l->epoch,
                     (unsigned long long)st->index.count, n_conns);
        drop(drop_arg);
        l->epoch = 0;
        st->epoch = 0;
        l->reset_pending = false;
    }
    snprintf(st->leader, sizeof(st->leader), "%s", known ? leader : "");
    pthread_mutex_lock(&l->lock);
    snprintf(st->standbys, sizeof(st->standbys), "%s", l->standbys);
    pthread_mutex_unlock(&l->lock);
}

static void standby_cb(const char *addr, void *arg)
{
    char *buf = arg;
    size_t n = strlen(buf);
    if (n + strlen(addr) + 2 < 1024)
        snprintf(buf + n, 1024 - n, "%s%s", n ? "," : "", addr);
}

/* The standbys, listed from etcd once a second off the loop thread (a blocking read). */
static void *ha_main(void *arg)
{
    kvp_leadership_t *l = arg;
    pthread_mutex_lock(&l->lock);
    while (!l->stop) {
        pthread_mutex_unlock(&l->lock);
        char buf[1024] = "";
        bool ok = kvp_election_standbys(l->el, standby_cb, buf) == KVP_OK;
        pthread_mutex_lock(&l->lock);
        if (ok)
            snprintf(l->standbys, sizeof(l->standbys), "%s", buf);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        if (!l->stop)
            pthread_cond_timedwait(&l->cond, &l->lock, &ts);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

kvp_status_t kvp_leadership_start(kvp_leadership_t *l, const kvp_election_params_t *p)
{
    snprintf(l->self, sizeof(l->self), "%s", p->self);
    kvp_status_t st = kvp_election_start(p, &l->el);
    if (st != KVP_OK)
        return st;
    if (pthread_create(&l->thread, NULL, ha_main, l) == 0)
        l->started = true;
    return KVP_OK;
}

void kvp_leadership_stop(kvp_leadership_t *l)
{
    if (l->started) {
        pthread_mutex_lock(&l->lock);
        l->stop = true;
        pthread_cond_signal(&l->cond);
        pthread_mutex_unlock(&l->lock);
        pthread_join(l->thread, NULL);
        l->started = false;
    }
    if (l->el != NULL)
        kvp_election_stop(l->el, true); /* a standby takes over at once */
    l->el = NULL;
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->cond);
}
