/*
 * tenant.h - tenants: whose keys an object's are, what each tenant holds, and its quotas
 * (see tenant.c).
 */
#ifndef KVP_MASTER_META_TENANT_H
#define KVP_MASTER_META_TENANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/acl.h"
#include "common/status.h"

/* An object key of a tenant is stored as TENANT KVP_TENANT_SEP KEY (docs/architecture.md,
 * "Tenants"), except the default tenant's: as its user gave it (so the keys stored before
 * an ACL are the default tenant's), or, when that key itself starts with a valid tenant
 * name and the separator, as "default" KVP_TENANT_SEP KEY. */
#define KVP_TENANT_SEP '\x1f'
#define KVP_TENANT_MAX 4096u         /* tenants the master knows at most (ids 0..4095) */
#define KVP_TENANT_DEFAULT "default" /* id 0: a principal's tenant unless the ACL says */

typedef struct kvp_tenant {
    char name[64]; /* id 0: "default" */
    /* charged: what its objects take now (master/core/state.c keeps these) */
    uint64_t dram_bytes; /* object bytes x DRAM replicas */
    uint64_t ssd_bytes;  /* object bytes x SSD replicas */
    uint64_t objects;    /* objects in the index (PENDING ones included) */
    /* from the ACL's [tenant NAME] section: 0 = no quota / the default share */
    uint64_t max_dram, max_ssd, max_objects;
    uint32_t share_permille;
    uint64_t share_bytes;   /* its share of DRAM in the eviction run under way (eviction.c) */
    uint64_t refused_quota; /* puts refused for a quota */
    uint64_t dedicated;     /* segments mounted for it alone (kvpool serve --tenant) */
} kvp_tenant_t;

typedef struct kvp_tenant_table {
    kvp_tenant_t *t; /* [n]; t[0] is the default tenant */
    uint32_t n;
    uint32_t cap;
} kvp_tenant_table_t;

kvp_status_t kvp_tenant_table_init(kvp_tenant_table_t *tt);
void kvp_tenant_table_cleanup(kvp_tenant_table_t *tt);

/* The id of a tenant by name, made when `create` and the name is new; -1: none (unknown
 * name without create, an invalid name, a table full, or out of memory). */
int32_t kvp_tenant_id(kvp_tenant_table_t *tt, const char *name, size_t len, bool create);

/* The tenant of a stored key (its prefix, made when new); 0 (the default tenant): none. */
uint16_t kvp_tenant_of_key(kvp_tenant_table_t *tt, const char *key, size_t len);

/* The length of the tenant prefix a stored key starts with (a valid name before the
 * separator); 0: none (a key of the default tenant as its user gave it). */
size_t kvp_tenant_prefix_len(const char *key, size_t len);

/* The user's part of a stored key (after its tenant's prefix, if any). */
static inline const char *kvp_tenant_user_key(const char *key, size_t len, size_t *ulen_p)
{
    size_t p = kvp_tenant_prefix_len(key, len);
    *ulen_p = p > 0 ? len - p - 1 : len;
    return p > 0 ? key + p + 1 : key;
}

#endif
