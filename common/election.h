/*
 * election.h - leader election of kvpool-master on etcd, with fencing.
 *
 * DESIGN
 * One thread per election (started by kvp_election_start) campaigns for the
 * leader key /kvpool/<cluster>/leader (value: this master's control address)
 * with a lease of ttl_s seconds, and keeps the lease alive. It also announces
 * the master under /kvpool/<cluster>/members/<self> with the same lease, so
 * standbys can be listed. The leader key's create revision is the epoch: it
 * grows with every new leader.
 *
 * Fencing: kvp_election_leading() is the only test of "may I act as leader
 * now". It is true only while the lease is surely alive: until the send time
 * of the last successful keepalive (or of the grant) plus the TTL minus a
 * margin of ttl/5, measured on the monotonic clock, so a process paused past
 * its TTL sees false on its first call after waking, before the election
 * thread has run. The role itself (kvp_election_leader) may lag behind.
 *
 * etcd unreachable or restarted: nothing fails; the thread logs the change
 * once, retries every 500 ms, and a leader stops `leading` when its margin
 * runs out. When etcd is back, a leader whose lease survived resumes (after
 * re-reading its key), otherwise everyone campaigns again.
 */
#ifndef KVP_COMMON_ELECTION_H
#define KVP_COMMON_ELECTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/etcd.h"
#include "common/status.h"

typedef struct kvp_election kvp_election_t;

/* Called on the election thread whenever this process's role or the epoch of
 * the leader it knows changes. Do not call kvp_election_stop from it. */
typedef void (*kvp_election_change_cb_t)(void *arg);
/* Called once per standby address by kvp_election_standbys (borrowed). */
typedef void (*kvp_election_member_cb_t)(const char *addr, void *arg);

typedef struct kvp_election_params {
    const char *endpoints; /* etcd: "host:port[,host:port...]" (copied) */
    const char *cluster;   /* keys live under /kvpool/<cluster>/ (copied) */
    const char *self;      /* this master's control address "host:port" (copied) */
    uint32_t ttl_s;        /* lease TTL in seconds; 0: 5; below 2: 2 (etcd's minimum) */
    uint32_t timeout_ms;   /* each etcd request; 0: 1000 */
    kvp_election_change_cb_t on_change; /* optional */
    void *arg;                          /* for on_change */
    /* TLS and credentials for etcd (borrowed for the start call); NULL: plain */
    const kvp_etcd_security_t *security;
    char *err; /* optional: why the start failed (a bad setting), err_len bytes */
    size_t err_len;
} kvp_election_params_t;

/*
 * Start campaigning on a new thread. Succeeds without contacting etcd (an
 * unreachable etcd, or one that refuses our credentials, only delays the
 * first campaign: the election thread logs why); KVP_ERR_INVALID_ARG for
 * missing params, a malformed endpoint list or a security setting that
 * cannot be used (params->err says which).
 */
kvp_status_t kvp_election_start(const kvp_election_params_t *params, kvp_election_t **el_p);

/*
 * Stop the thread and free el. resign = true: give the leadership up now
 * (delete the leader key if it is still ours, revoke the lease: a standby
 * takes over at once). resign = false: just stop, as a crash would; the key
 * lingers until the TTL runs out. `leading` is false from the call on.
 */
void kvp_election_stop(kvp_election_t *el, bool resign);

/*
 * True when this process is leader and its lease is surely alive at now_ms
 * (kvp_now_ms()); *epoch_p (may be NULL) is then the epoch. Any thread,
 * lock-free.
 */
bool kvp_election_leading(kvp_election_t *el, uint64_t now_ms, uint64_t *epoch_p);

/*
 * The leader as last seen: its address into addr[0..cap) and its epoch
 * (either may be NULL/0). This process's own address while it is leader.
 * KVP_ERR_NOT_FOUND when no leader is known, KVP_ERR_BUFFER_TOO_SMALL when
 * cap is short. Any thread (takes a mutex).
 */
kvp_status_t kvp_election_leader(kvp_election_t *el, char *addr, size_t cap, uint64_t *epoch_p);

/*
 * List the standbys now: one etcd read of the members (on a second handle,
 * made at start and kept under a mutex of its own, so any thread may call it
 * without a new etcd authentication each time), every address but the
 * leader's.
 */
kvp_status_t kvp_election_standbys(kvp_election_t *el, kvp_election_member_cb_t cb, void *arg);

/*
 * TEST HOOK: pause = true freezes the election thread as SIGSTOP would (no
 * keepalive, no campaign; a watch in progress is cut short) so tests can
 * watch fencing at work in one process; false resumes it.
 */
void kvp_election_test_pause(kvp_election_t *el, bool pause);

#endif
