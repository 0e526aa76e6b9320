/*
 * election.c - leader election on etcd, one thread per election (see election.h).
 *
 * DESIGN
 * One thread, one kvp_etcd_t. Each turn of its loop:
 *   1. no lease: grant one (TTL ttl_s) and put the member key with it;
 *   2. keepalive due (every ttl/3): renew the lease; a lease etcd no longer
 *      knows means our keys are gone: step down, grant a new one, campaign;
 *   3. nothing known about the leader key (watch_rev == 0): campaign with a
 *      create-if-absent txn; lost: read the holder and watch from the read's
 *      revision + 1. A leader that met an etcd error re-reads its key here
 *      before `leading` can be true again;
 *   4. watch the leader key until the next keepalive is due: a DELETE means
 *      the leader is gone (campaign at once), a PUT with another create
 *      revision means another leader (a leader steps down).
 * A leader watches its own key too, so it sees the key vanish or change.
 * Every etcd error sends the loop back to step 3 after a pause of at most
 * 500 ms, and is logged once per change of etcd's state.
 *
 * Fencing: valid_until_ms (atomic) = the send time of the last successful
 * keepalive or grant + ttl - ttl/5, published only while leader and only once
 * the leader key is known to hold our epoch. etcd can only renew the lease
 * after receiving our request, so the lease cannot expire before send time +
 * TTL. leading() compares the caller's clock with it: no lock, no dependence
 * on this thread running. Stepping down clears it before anything else.
 *
 * Threads: the election thread owns everything below "election thread only";
 * leading() reads two atomics; leader() copies under `mu`.
 */
#include "common/election.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/etcd.h"
#include "common/log.h"
#include "common/macros.h"

#define ELECTION_RETRY_MS 500
#define ELECTION_ADDR_MAX 256

typedef enum election_etcd_state {
    ETCD_STATE_UNKNOWN,
    ETCD_STATE_UP,
    ETCD_STATE_DOWN,
} election_etcd_state_t;

struct kvp_election {
    char *endpoints;
    char *cluster;
    char *self;
    char *leader_key;
    char *members_prefix;
    char *member_key;
    uint64_t ttl_ms;
    uint64_t margin_ms;
    kvp_election_change_cb_t on_change;
    void *arg;
    pthread_t thread;

    atomic_bool stop;
    atomic_bool paused;
    atomic_bool interrupt; /* stop || paused: cuts a watch short */

    /* published for any thread */
    _Atomic uint64_t valid_until_ms; /* 0: not leading */
    _Atomic uint64_t epoch;
    pthread_mutex_t mu; /* guards the leader as seen */
    char leader_addr[ELECTION_ADDR_MAX];
    uint64_t leader_epoch; /* 0: no leader known */

    pthread_mutex_t list_mu; /* guards list_etcd */
    kvp_etcd_t *list_etcd;   /* kvp_election_standbys' handle */

    /* election thread only */
    kvp_etcd_t *etcd;
    int64_t lease;       /* 0: none */
    bool member_put;     /* the member key is in place for this lease */
    uint64_t ka_sent_ms; /* send time of the last successful keepalive/grant */
    uint64_t next_ka_ms; /* when to renew next */
    bool leader;         /* role */
    int64_t watch_rev;   /* watch the leader key from here; 0: read it first */
    uint64_t role_since_ms;
    uint64_t campaign_start_ms; /* when this campaign began; 0: none under way */
    election_etcd_state_t etcd_state;
    uint64_t etcd_down_since_ms;
    kvp_status_t etcd_down_status; /* of the failure last logged */
};

/* ---- published state ---- */

bool kvp_election_leading(kvp_election_t *el, uint64_t now_ms, uint64_t *epoch_p)
{
    for (;;) {
        uint64_t epoch = atomic_load(&el->epoch);
        uint64_t until = atomic_load(&el->valid_until_ms);
        if (now_ms >= until)
            return false;
        if (atomic_load(&el->epoch) != epoch)
            continue; /* a new term began while we read: read it again */
        if (epoch_p != NULL)
            *epoch_p = epoch;
        return true;
    }
}

kvp_status_t kvp_election_leader(kvp_election_t *el, char *addr, size_t cap, uint64_t *epoch_p)
{
    kvp_status_t status = KVP_OK;
    pthread_mutex_lock(&el->mu);
    if (el->leader_epoch == 0)
        status = KVP_ERR_NOT_FOUND;
    else if (addr != NULL && strlen(el->leader_addr) >= cap)
        status = KVP_ERR_BUFFER_TOO_SMALL;
    else {
        if (addr != NULL)
            strcpy(addr, el->leader_addr);
        if (epoch_p != NULL)
            *epoch_p = el->leader_epoch;
    }
    pthread_mutex_unlock(&el->mu);
    return status;
}

static void election_notify(kvp_election_t *el)
{
    if (el->on_change != NULL)
        el->on_change(el->arg);
}

/* Record the leader as seen (addr NULL: none known); tell on_change when its
 * epoch changed. */
static void election_set_leader_seen(kvp_election_t *el, const char *addr, uint64_t epoch)
{
    pthread_mutex_lock(&el->mu);
    bool changed = el->leader_epoch != epoch;
    el->leader_epoch = addr != NULL ? epoch : 0;
    snprintf(el->leader_addr, sizeof(el->leader_addr), "%s", addr != NULL ? addr : "");
    pthread_mutex_unlock(&el->mu);
    if (addr != NULL && !el->leader)
        el->campaign_start_ms = 0; /* someone leads: no campaign under way */
    if (changed && addr != NULL && !el->leader)
        KVP_LOG_INFO("election %s: standing by; the leader is %s (epoch %" PRIu64 ")", el->cluster,
                     addr, epoch);
    if (changed)
        election_notify(el);
}

/* Allow `leading` until the lease's margin runs out, counted from the last
 * successful keepalive's send time. */
static void election_publish(kvp_election_t *el)
{
    if (el->leader)
        atomic_store(&el->valid_until_ms, el->ka_sent_ms + el->ttl_ms - el->margin_ms);
}

static void election_become_leader(kvp_election_t *el, int64_t epoch)
{
    uint64_t now = kvp_now_ms();
    el->leader = true;
    el->role_since_ms = now;
    atomic_store(&el->epoch, (uint64_t)epoch);
    /* the leader record first: whoever sees kvp_election_leading true also finds this
     * master in kvp_election_leader (it was published before, with a log line between:
     * test_election_resign once read NOT_FOUND there on a loaded machine) */
    election_set_leader_seen(el, el->self, (uint64_t)epoch);
    election_publish(el);
    KVP_LOG_INFO("election %s: %s elected leader, epoch %" PRId64 ", after campaigning %" PRIu64
                 " ms",
                 el->cluster, el->self, epoch, now - el->campaign_start_ms);
}

static void election_step_down(kvp_election_t *el, const char *why)
{
    atomic_store(&el->valid_until_ms, 0); /* first: fencing */
    if (!el->leader)
        return;
    uint64_t now = kvp_now_ms();
    el->leader = false;
    el->campaign_start_ms = now;
    KVP_LOG_WARN("election %s: %s steps down as leader (epoch %" PRIu64 ", led %" PRIu64 " ms): %s",
                 el->cluster, el->self, atomic_load(&el->epoch), now - el->role_since_ms, why);
    election_set_leader_seen(el, NULL, 0);
}

/* ---- etcd state ---- */

static void election_etcd_up(kvp_election_t *el)
{
    if (el->etcd_state == ETCD_STATE_DOWN)
        KVP_LOG_INFO("election %s: etcd reachable again at %s after %" PRIu64 " ms", el->cluster,
                     kvp_etcd_endpoint(el->etcd), kvp_now_ms() - el->etcd_down_since_ms);
    else if (el->etcd_state == ETCD_STATE_UNKNOWN)
        KVP_LOG_INFO("election %s: connected to etcd at %s", el->cluster,
                     kvp_etcd_endpoint(el->etcd));
    el->etcd_state = ETCD_STATE_UP;
}

/* An etcd call failed: log once per state change (and when etcd goes from unreachable to
 * refusing our credentials, or back), read the leader key again before trusting
 * it, and pause a little (at most until the next keepalive). */
static void election_etcd_down(kvp_election_t *el, const char *what, kvp_status_t status)
{
    bool refused = status == KVP_ERR_DENIED;
    if (el->etcd_state != ETCD_STATE_DOWN || refused != (el->etcd_down_status == KVP_ERR_DENIED)) {
        if (el->etcd_state != ETCD_STATE_DOWN)
            el->etcd_down_since_ms = kvp_now_ms();
        el->etcd_down_status = status;
        KVP_LOG_WARN(
            "election %s: etcd at %s failed (%s: %s: %s); retrying every %d ms%s", el->cluster,
            el->endpoints, what,
            status == KVP_ERR_DENIED ? "refused" : kvp_strerror(status), /* not the ACL's text */
            kvp_etcd_error(el->etcd), ELECTION_RETRY_MS,
            el->leader ? "; leading stops when the lease's margin runs out" : "; standing by");
    }
    el->etcd_state = ETCD_STATE_DOWN;
    el->watch_rev = 0;
    uint64_t until = kvp_now_ms() + ELECTION_RETRY_MS;
    if (el->lease != 0)
        until = KVP_MIN(until, el->next_ka_ms);
    while (!atomic_load(&el->interrupt) && kvp_now_ms() < until) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* ---- the loop's steps; each returns false after an etcd error ---- */

static bool election_grant(kvp_election_t *el)
{
    uint64_t sent = kvp_now_ms();
    int64_t lease;
    kvp_status_t status = kvp_etcd_lease_grant(el->etcd, (int64_t)(el->ttl_ms / 1000), &lease);
    if (status != KVP_OK) {
        election_etcd_down(el, "lease grant", status);
        return false;
    }
    election_etcd_up(el);
    el->lease = lease;
    el->member_put = false;
    el->ka_sent_ms = sent;
    el->next_ka_ms = sent + el->ttl_ms / 3;
    el->watch_rev = 0;
    return true;
}

static bool election_put_member(kvp_election_t *el)
{
    kvp_status_t status =
        kvp_etcd_put(el->etcd, el->member_key, el->self, strlen(el->self), el->lease);
    if (status == KVP_ERR_NOT_FOUND) { /* the lease expired before the put */
        el->lease = 0;
        return true;
    }
    if (status != KVP_OK) {
        election_etcd_down(el, "member put", status);
        return false;
    }
    el->member_put = true;
    return true;
}

static bool election_keepalive(kvp_election_t *el)
{
    uint64_t sent = kvp_now_ms();
    int64_t ttl = 0;
    kvp_status_t status = kvp_etcd_lease_keepalive(el->etcd, el->lease, &ttl);
    if (status != KVP_OK) {
        el->next_ka_ms = sent + ELECTION_RETRY_MS;
        election_etcd_down(el, "lease keepalive", status);
        return false;
    }
    election_etcd_up(el);
    if (ttl <= 0) {
        KVP_LOG_WARN("election %s: lease %" PRIx64 " of %s expired (no keepalive in %" PRIu64
                     " ms)",
                     el->cluster, (uint64_t)el->lease, el->self, sent - el->ka_sent_ms);
        election_step_down(el, "its lease expired");
        el->lease = 0;
        el->watch_rev = 0;
        return true;
    }
    el->ka_sent_ms = sent;
    el->next_ka_ms = sent + el->ttl_ms / 3;
    if ((uint64_t)ttl * 1000 < el->ttl_ms)
        KVP_LOG_WARN("election %s: etcd renewed the lease for %" PRId64 " s only", el->cluster,
                     ttl);
    if (el->watch_rev != 0) /* the key is known to be ours */
        election_publish(el);
    return true;
}

/* Campaign (standby) or confirm our key (leader); sets watch_rev. */
static bool election_campaign(kvp_election_t *el)
{
    if (!el->leader) {
        if (el->campaign_start_ms == 0)
            el->campaign_start_ms = kvp_now_ms();
        bool created = false;
        int64_t rev = 0;
        kvp_status_t status = kvp_etcd_create_key(el->etcd, el->leader_key, el->self,
                                                  strlen(el->self), el->lease, &created, &rev);
        if (status == KVP_ERR_NOT_FOUND) { /* our lease is gone */
            el->lease = 0;
            return true;
        }
        if (status != KVP_OK) {
            election_etcd_down(el, "campaign", status);
            return false;
        }
        if (created) {
            el->watch_rev = rev + 1;
            election_become_leader(el, rev);
            return true;
        }
    }
    char *val = NULL;
    int64_t create_rev = 0, rev = 0;
    kvp_status_t status =
        kvp_etcd_get(el->etcd, el->leader_key, &val, NULL, &create_rev, NULL, &rev);
    if (status == KVP_ERR_NOT_FOUND) {
        election_step_down(el, "the leader key is gone");
        return true; /* watch_rev stays 0: campaign again at once */
    }
    if (status != KVP_OK) {
        election_etcd_down(el, "leader read", status);
        return false;
    }
    if (el->leader && create_rev != (int64_t)atomic_load(&el->epoch)) {
        election_step_down(el, "the leader key now belongs to another master");
    } else if (el->leader) {
        election_publish(el); /* confirmed: ours still */
    }
    if (!el->leader)
        election_set_leader_seen(el, val, (uint64_t)create_rev);
    free(val);
    el->watch_rev = rev + 1;
    return true;
}

/* Watch the leader key until the next keepalive is due. */
static bool election_wait(kvp_election_t *el)
{
    uint64_t now = kvp_now_ms();
    if (now >= el->next_ka_ms)
        return true;
    kvp_etcd_event_t ev;
    kvp_status_t status = kvp_etcd_watch(el->etcd, el->leader_key, el->watch_rev,
                                         (uint32_t)(el->next_ka_ms - now), &el->interrupt, &ev);
    switch (status) {
    case KVP_OK:
        break;
    case KVP_ERR_TIMEOUT:
    case KVP_ERR_SHUTDOWN:
        return true;
    case KVP_ERR_OUT_OF_RANGE: /* compacted: read it again */
        el->watch_rev = 0;
        return true;
    default:
        election_etcd_down(el, "leader watch", status);
        return false;
    }
    el->watch_rev = ev.mod_rev + 1;
    if (ev.type == KVP_ETCD_EVENT_DELETE) {
        if (el->leader) {
            election_step_down(el, "the leader key was deleted");
        } else {
            KVP_LOG_INFO("election %s: the leader is gone; campaigning", el->cluster);
            el->campaign_start_ms = kvp_now_ms();
            election_set_leader_seen(el, NULL, 0);
        }
        el->watch_rev = 0;
    } else if (el->leader && ev.create_rev != (int64_t)atomic_load(&el->epoch)) {
        election_step_down(el, "the leader key now belongs to another master");
        el->watch_rev = 0;
    } else if (!el->leader) {
        election_set_leader_seen(el, ev.val, (uint64_t)ev.create_rev);
    }
    kvp_etcd_event_cleanup(&ev);
    return true;
}

static void *election_main(void *arg)
{
    kvp_election_t *el = arg;
    while (!atomic_load(&el->stop)) {
        if (atomic_load(&el->paused)) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (el->lease == 0 && !election_grant(el))
            continue;
        if (kvp_now_ms() >= el->next_ka_ms && !election_keepalive(el))
            continue;
        if (el->lease == 0)
            continue;
        if (!el->member_put && !election_put_member(el))
            continue;
        if (el->lease == 0)
            continue;
        if (el->watch_rev == 0 && !election_campaign(el))
            continue;
        if (el->watch_rev != 0)
            election_wait(el);
    }
    return NULL;
}

/* ---- start / stop ---- */

static void election_free(kvp_election_t *el)
{
    kvp_etcd_destroy(el->etcd);
    kvp_etcd_destroy(el->list_etcd);
    pthread_mutex_destroy(&el->list_mu);
    pthread_mutex_destroy(&el->mu);
    free(el->endpoints);
    free(el->cluster);
    free(el->self);
    free(el->leader_key);
    free(el->members_prefix);
    free(el->member_key);
    free(el);
}

kvp_status_t kvp_election_start(const kvp_election_params_t *params, kvp_election_t **el_p)
{
    if (params == NULL || params->endpoints == NULL || params->cluster == NULL ||
        params->cluster[0] == '\0' || params->self == NULL || params->self[0] == '\0' ||
        strlen(params->self) >= ELECTION_ADDR_MAX)
        return KVP_ERR_INVALID_ARG;
    kvp_election_t *el = calloc(1, sizeof(*el));
    if (el == NULL)
        return KVP_ERR_NOMEM;
    pthread_mutex_init(&el->mu, NULL);
    pthread_mutex_init(&el->list_mu, NULL);
    uint32_t ttl_s = params->ttl_s == 0 ? 5 : KVP_MAX(params->ttl_s, 2u);
    el->ttl_ms = (uint64_t)ttl_s * 1000;
    el->margin_ms = el->ttl_ms / 5;
    el->on_change = params->on_change;
    el->arg = params->arg;
    el->endpoints = strdup(params->endpoints);
    el->cluster = strdup(params->cluster);
    el->self = strdup(params->self);
    if (asprintf(&el->leader_key, "/kvpool/%s/leader", params->cluster) < 0)
        el->leader_key = NULL;
    if (asprintf(&el->members_prefix, "/kvpool/%s/members/", params->cluster) < 0)
        el->members_prefix = NULL;
    if (asprintf(&el->member_key, "/kvpool/%s/members/%s", params->cluster, params->self) < 0)
        el->member_key = NULL;
    kvp_status_t status = KVP_ERR_NOMEM;
    if (el->endpoints == NULL || el->cluster == NULL || el->self == NULL ||
        el->leader_key == NULL || el->members_prefix == NULL || el->member_key == NULL)
        goto err_free;
    kvp_etcd_params_t ep = {.endpoints = params->endpoints,
                            .timeout_ms = params->timeout_ms != 0 ? params->timeout_ms : 1000,
                            .security = params->security};
    status = kvp_etcd_create_ex(&ep, &el->etcd, params->err, params->err_len);
    if (status != KVP_OK)
        goto err_free;
    ep.timeout_ms = 1000;
    status = kvp_etcd_create_ex(&ep, &el->list_etcd, params->err, params->err_len);
    if (status != KVP_OK)
        goto err_free;
    el->campaign_start_ms = kvp_now_ms();
    if (pthread_create(&el->thread, NULL, election_main, el) != 0) {
        status = KVP_ERR_SYSTEM;
        goto err_free;
    }
    *el_p = el;
    return KVP_OK;

err_free:
    election_free(el);
    return status;
}

void kvp_election_stop(kvp_election_t *el, bool resign)
{
    if (el == NULL)
        return;
    atomic_store(&el->valid_until_ms, 0);
    atomic_store(&el->stop, true);
    atomic_store(&el->interrupt, true);
    pthread_join(el->thread, NULL);
    if (resign && el->lease != 0) {
        kvp_status_t status = KVP_OK;
        if (el->leader)
            status = kvp_etcd_delete_if(el->etcd, el->leader_key, (int64_t)atomic_load(&el->epoch));
        kvp_status_t revoked = kvp_etcd_lease_revoke(el->etcd, el->lease);
        if (el->leader)
            KVP_LOG_INFO("election %s: %s resigned as leader (epoch %" PRIu64 "): key %s, lease %s",
                         el->cluster, el->self, atomic_load(&el->epoch),
                         status == KVP_OK ? "deleted" : kvp_strerror(status),
                         revoked == KVP_OK ? "revoked" : kvp_strerror(revoked));
    }
    election_free(el);
}

void kvp_election_test_pause(kvp_election_t *el, bool pause)
{
    atomic_store(&el->paused, pause);
    atomic_store(&el->interrupt, pause || atomic_load(&el->stop));
}

/* ---- standbys ---- */

typedef struct election_list {
    const char *leader;
    kvp_election_member_cb_t cb;
    void *arg;
} election_list_t;

static void election_member(const char *key, const char *val, size_t len, void *arg)
{
    (void)key;
    (void)len;
    election_list_t *l = arg;
    if (l->leader == NULL || strcmp(val, l->leader) != 0)
        l->cb(val, l->arg);
}

kvp_status_t kvp_election_standbys(kvp_election_t *el, kvp_election_member_cb_t cb, void *arg)
{
    pthread_mutex_lock(&el->list_mu);
    char *leader = NULL;
    kvp_status_t status =
        kvp_etcd_get(el->list_etcd, el->leader_key, &leader, NULL, NULL, NULL, NULL);
    if (status == KVP_OK || status == KVP_ERR_NOT_FOUND) {
        election_list_t l = {.leader = leader, .cb = cb, .arg = arg};
        status = kvp_etcd_list(el->list_etcd, el->members_prefix, election_member, &l);
    }
    pthread_mutex_unlock(&el->list_mu);
    free(leader);
    return status;
}
