/*
 * quota_store.h - the tenant quota admin API's policies in etcd, so that they survive a
 * failover (see quota_store.c).
 */
#ifndef KVP_MASTER_HA_QUOTA_STORE_H
#define KVP_MASTER_HA_QUOTA_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/election.h"
#include "common/status.h"

typedef struct kvp_quota_store kvp_quota_store_t;

/* A store at /kvpool/<p->cluster>/tenant_quotas on p's etcd (nothing is contacted yet).
 * KVP_ERR_INVALID_ARG (why in p->err) as kvp_etcd_create_ex. */
kvp_status_t kvp_quota_store_create(const kvp_election_params_t *p, kvp_quota_store_t **qs_p);
/* NULL is fine. */
void kvp_quota_store_destroy(kvp_quota_store_t *qs);

/* The loop: the policies' text (kvp_tenant_policy_dump's, taken) as the next to save,
 * changed under epoch (the leader key's create revision this master leads under). */
void kvp_quota_store_stage(kvp_quota_store_t *qs, char *text, uint64_t epoch);
/* Any thread (the HTTP one that answers a change): write the latest staged text to etcd,
 * unless it is written already, only while the leader key is still epoch's. Blocks for
 * etcd. KVP_OK; KVP_ERR_NOT_OWNER: this master no longer leads (nothing written); or etcd's
 * failure (why in err). */
kvp_status_t kvp_quota_store_save(kvp_quota_store_t *qs, char *err, size_t err_len);
/* The loop, once when it begins to lead: the text etcd keeps (*text_p malloc'd, "" when the
 * key is absent). Blocks for etcd (one read). KVP_ERR_CONNECT / _TIMEOUT / _DENIED as
 * kvp_etcd_get (why in err). */
kvp_status_t kvp_quota_store_load(kvp_quota_store_t *qs, char **text_p, size_t *len_p, char *err,
                                  size_t err_len);

#endif
