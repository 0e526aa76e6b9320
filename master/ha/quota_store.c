/*
 * quota_store.c - the tenant quota admin API's policies in etcd (see quota_store.h).
 *
 * Design: one etcd key per cluster, /kvpool/<cluster>/tenant_quotas, holds every policy
 * set through /api/v1/tenant_quotas as kvp_tenant_policy_dump's text (Mooncake's etcd
 * connector keeps its whole policy at one key the same way). The loop changes a policy at
 * once and stages the new text here with a sequence number; the HTTP thread that answers
 * the change then writes the latest staged text (not necessarily its own: a later change
 * may have been staged meanwhile), under a mutex, unless a write of that sequence or a
 * later one went first. So etcd ends with the latest text whatever order the HTTP threads
 * run in, and the loop never waits for etcd on a change. A master that begins to lead
 * reads the key once (kvp_quota_store_load) before it serves its first request. A write is
 * fenced by the leader key (kvp_etcd_put_if): it lands only while the key is still the one
 * of the epoch the change was made under, so a master that lost its leadership (its lease
 * expired in a partition) and has not seen it yet cannot overwrite what its successor
 * wrote; the admin hears that the change was not saved.
 *
 * Thread: stage and load on the loop, save on HTTP threads; everything under qs->lock
 * (the etcd handle is not thread-safe).
 */
#include "master/ha/quota_store.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/etcd.h"

struct kvp_quota_store {
    pthread_mutex_t lock;
    kvp_etcd_t *etcd;
    char *key;
    char *leader_key; /* the election's: its create revision is the epoch */
    char *staged;     /* the latest text staged (NULL: none yet) */
    uint64_t epoch;   /* the epoch it was staged under */
    uint64_t seq;     /* of the latest staged */
    uint64_t written; /* the seq etcd holds (0: none written) */
};

kvp_status_t kvp_quota_store_create(const kvp_election_params_t *p, kvp_quota_store_t **qs_p)
{
    kvp_quota_store_t *qs = calloc(1, sizeof(*qs));
    if (qs == NULL)
        return KVP_ERR_NOMEM;
    if (asprintf(&qs->key, "/kvpool/%s/tenant_quotas", p->cluster) < 0) {
        free(qs);
        return KVP_ERR_NOMEM;
    }
    if (asprintf(&qs->leader_key, "/kvpool/%s/leader", p->cluster) < 0) { /* election.c's */
        free(qs->key);
        free(qs);
        return KVP_ERR_NOMEM;
    }
    kvp_etcd_params_t ep = {.endpoints = p->endpoints,
                            .timeout_ms = p->timeout_ms ? p->timeout_ms : 1000,
                            .security = p->security};
    char why[256] = "";
    kvp_status_t s = kvp_etcd_create_ex(&ep, &qs->etcd, why, sizeof(why));
    if (s != KVP_OK) {
        if (p->err != NULL && p->err_len > 0)
            snprintf(p->err, p->err_len, "%s", why);
        free(qs->leader_key);
        free(qs->key);
        free(qs);
        return s;
    }
    pthread_mutex_init(&qs->lock, NULL);
    *qs_p = qs;
    return KVP_OK;
}

void kvp_quota_store_destroy(kvp_quota_store_t *qs)
{
    if (qs == NULL)
        return;
    kvp_etcd_destroy(qs->etcd);
    pthread_mutex_destroy(&qs->lock);
    free(qs->staged);
    free(qs->leader_key);
    free(qs->key);
    free(qs);
}

void kvp_quota_store_stage(kvp_quota_store_t *qs, char *text, uint64_t epoch)
{
    pthread_mutex_lock(&qs->lock);
    free(qs->staged);
    qs->staged = text;
    qs->epoch = epoch;
    qs->seq++;
    pthread_mutex_unlock(&qs->lock);
}

kvp_status_t kvp_quota_store_save(kvp_quota_store_t *qs, char *err, size_t err_len)
{
    kvp_status_t s = KVP_OK;
    pthread_mutex_lock(&qs->lock);
    if (qs->staged != NULL && qs->written < qs->seq) {
        s = qs->epoch == 0 /* not leading: there is no key to fence with */
                ? KVP_ERR_NOT_OWNER
                : kvp_etcd_put_if(qs->etcd, qs->key, qs->staged, strlen(qs->staged), qs->leader_key,
                                  (int64_t)qs->epoch);
        if (s == KVP_OK)
            qs->written = qs->seq;
        else if (s == KVP_ERR_NOT_OWNER)
            snprintf(err, err_len,
                     "this master no longer leads: the leader key is not the one of epoch "
                     "%" PRIu64 " any more",
                     qs->epoch);
        else
            snprintf(err, err_len, "%s", kvp_etcd_error(qs->etcd));
    }
    pthread_mutex_unlock(&qs->lock);
    return s;
}

kvp_status_t kvp_quota_store_load(kvp_quota_store_t *qs, char **text_p, size_t *len_p, char *err,
                                  size_t err_len)
{
    pthread_mutex_lock(&qs->lock);
    char *val = NULL;
    size_t len = 0;
    kvp_status_t s = kvp_etcd_get(qs->etcd, qs->key, &val, &len, NULL, NULL, NULL);
    if (s == KVP_ERR_NOT_FOUND) {
        val = strdup("");
        s = val != NULL ? KVP_OK : KVP_ERR_NOMEM;
    } else if (s != KVP_OK) {
        snprintf(err, err_len, "%s", kvp_etcd_error(qs->etcd));
    }
    if (s == KVP_OK) { /* what a new leader starts from is what etcd holds */
        free(qs->staged);
        qs->staged = NULL;
        qs->written = qs->seq;
        *text_p = val;
        *len_p = len;
    }
    pthread_mutex_unlock(&qs->lock);
    return s;
}
