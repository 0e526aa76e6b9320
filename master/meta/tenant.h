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
    uint64_t held_bytes; /* its holds' (PUT_COMMIT's room placed ahead), apart from dram_bytes */
    uint64_t holds;      /* ... how many (apart from objects) */
    /* from the ACL's [tenant NAME] section: 0 = no quota / the default share */
    uint64_t max_dram, max_ssd, max_objects;
    uint32_t share_permille;
    uint64_t share_bytes;   /* its share of DRAM in the eviction run under way (eviction.c) */
    uint64_t refused_quota; /* puts refused for a quota */
    uint64_t dedicated;     /* segments mounted for it alone (kvpool serve --tenant) */
    /* the tenant quota admin API's policy (/api/v1/tenant_quotas, master/obs/tenant_quotas.c),
     * applied over the ACL's max-dram by kvp_tenant_policy_apply */
    uint8_t policy;        /* KVP_TENANT_POLICY_* */
    uint64_t policy_dram;  /* _SET: the max-dram the API gave */
    uint64_t acl_max_dram; /* the ACL's max-dram (0: none), kept to apply the policy over */
    uint64_t closed;       /* 1: admission closed (_CLOSED): no put of it is admitted */
} kvp_tenant_t;

/* Where a tenant's max-dram comes from. */
enum {
    KVP_TENANT_POLICY_ACL = 0, /* the ACL's [tenant NAME] max-dram (or none) */
    KVP_TENANT_POLICY_SET,     /* PUT: policy_dram */
    KVP_TENANT_POLICY_CLOSED,  /* DELETE: no quota and admission closed */
};
#define KVP_TENANT_QUOTA_MAX 0x7fffffffffffffffull /* 2^63 - 1: a policy's largest */

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

/* max_dram and closed from acl_max_dram and the policy (after an ACL load and a change of
 * policy). */
void kvp_tenant_policy_apply(kvp_tenant_t *t);

/* The policies set through the admin API as text, one tenant a line: "NAME BYTES\n" (_SET)
 * or "NAME closed\n" (_CLOSED), in id order; what etcd keeps (master/ha/quota_store.c). A
 * malloc'd NUL-terminated string (NULL: out of memory). */
char *kvp_tenant_policy_dump(const kvp_tenant_table_t *tt);
/* Take such a text as the policies of the table's tenants (those it does not name go back
 * to their ACL's), making the tenants it names. false: a line that is not one of those
 * (nothing changed then). */
bool kvp_tenant_policy_load(kvp_tenant_table_t *tt, const char *text, size_t len);

/* The tenant of a stored key (its prefix, made when new); 0 (the default tenant): none. */
uint16_t kvp_tenant_of_key(kvp_tenant_table_t *tt, const char *key, size_t len);

/* The length of the tenant prefix a stored key starts with (a valid name before the
 * separator); 0: none (a key of the default tenant as its user gave it). */
size_t kvp_tenant_prefix_len(const char *key, size_t len);

/* Do `bytes` more of DRAM fit t's max-dram (0: no quota)? Its objects and the room its holds
 * take count. Admission (closed) apart. */
static inline bool kvp_tenant_dram_fits(const kvp_tenant_t *t, uint64_t bytes)
{
    uint64_t used = t->dram_bytes + t->held_bytes;
    return t->max_dram == 0 || (bytes <= t->max_dram && used <= t->max_dram - bytes);
}

/* The user's part of a stored key (after its tenant's prefix, if any). */
static inline const char *kvp_tenant_user_key(const char *key, size_t len, size_t *ulen_p)
{
    size_t p = kvp_tenant_prefix_len(key, len);
    *ulen_p = p > 0 ? len - p - 1 : len;
    return p > 0 ? key + p + 1 : key;
}

#endif
