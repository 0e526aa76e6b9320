/*
 * leadership.h - the master's side of the election (common/election.h): whether it may
 * serve now, what a standby answers, stepping down, the standby list Stat shows (see
 * leadership.c).
 */
#ifndef KVP_MASTER_HA_LEADERSHIP_H
#define KVP_MASTER_HA_LEADERSHIP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/election.h"
#include "common/status.h"
#include "master/core/state.h"

typedef struct kvp_leadership {
    kvp_election_t *el; /* NULL: standalone */
    uint64_t epoch;     /* the epoch this master leads (led) under; 0: never led */
    bool reset_pending; /* it leads again under a new epoch: drop the old state first */
    char self[300];     /* its address in etcd */
    pthread_t thread;   /* lists the standbys for Stat, once a second */
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;           /* lock */
    char standbys[1024]; /* lock */

    /* called on the loop when this master begins to lead (a new epoch), before its first
     * request is served (NULL: none); false: not ready, tried again a second later and
     * nothing is served meanwhile (the tenant quota policies from etcd, server.c) */
    bool (*on_lead)(void *arg, kvp_master_state_t *st);
    void *on_lead_arg;
    uint64_t on_lead_retry_ms; /* not before then after a false */
} kvp_leadership_t;

/* Standalone until kvp_leadership_start. */
void kvp_leadership_init(kvp_leadership_t *l);
/* Campaign through etcd (p->self is this master's address) and start the standby lister. */
kvp_status_t kvp_leadership_start(kvp_leadership_t *l, const kvp_election_params_t *p);
/* Stop the lister, resign (a standby takes over at once), free. */
void kvp_leadership_stop(kvp_leadership_t *l);

/*
 * May this master answer requests now? Standalone: always. With an election: only while
 * it leads and its lease is surely alive (kvp_election_leading: a master paused past its
 * TTL gets false on its first call after waking). A new epoch (this master just won)
 * starts from an empty index (st's epoch, leader and rebuild grace are set): the owners
 * remount and offer their records.
 */
bool kvp_leadership_may_serve(kvp_leadership_t *l, kvp_master_state_t *st);
/* The same for /health and /metrics, without side effects. */
bool kvp_leadership_serving(const kvp_leadership_t *l);
/* What a request gets while this master may not serve (KVP_ERR_NOT_LEADER's words). */
void kvp_leadership_not_leader_msg(const kvp_leadership_t *l, char *buf, size_t len);

/* Drops every connection and starts the state afresh (the server's). */
typedef void kvp_leadership_drop_cb_t(void *arg);
/* Twice a second, on the loop: a leader that lost for good (another master leads now)
 * steps down (drop; n_conns is for the log); the leader and standbys Stat shows are
 * refreshed in st. */
void kvp_leadership_tick(kvp_leadership_t *l, kvp_master_state_t *st, unsigned n_conns,
                         kvp_leadership_drop_cb_t *drop, void *drop_arg);

#endif
