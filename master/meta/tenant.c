/*
 * tenant.c - the master's table of tenants.
 *
 * Design. With an ACL (--acl-file) every principal belongs to a tenant, and
 * the keys a principal names are its tenant's: the master stores them as
 * TENANT 0x1f KEY (master/dispatch.c adds the prefix to every key a request
 * names and master/rpc/admin_calls.c takes it off in listings), so tenant A's
 * `m@blk-1` and tenant B's are two objects, and nothing a client sends can
 * name another tenant's key (a tenant name has no 0x1f, and the prefix is
 * always the caller's). The tenant "default" (id 0) is the one exception:
 * its keys are stored as given, as without an ACL (so what was stored before
 * an ACL is its own, and a pool of one tenant pays nothing), unless a key
 * itself starts with a valid tenant name and 0x1f: that one is stored as
 * "default" 0x1f KEY. A stored key's tenant is thus its valid-name prefix,
 * or "default" when it has none (kvp_tenant_prefix_len). An object carries its tenant's id
 * (obj->tenant, 16 bits that were padding), from which the charges are kept here: bytes per tier
 * and objects (master/core/state.c, kvp_state_charge), checked against the quotas of the tenant's
 * [tenant NAME] section when a put starts (rpc/object_calls.c) and used by eviction to take from
 * tenants over their share first (policy/eviction.c).
 *
 * Ids are given in order of first sight and never reused while the master
 * runs (the ACL may be reloaded: quotas change, ids and charges stay).
 * Lookups by name are linear: they happen at ACL loads, at mounts and when
 * segments offer what they hold (ha/rebuild.c), never per request.
 *
 * Thread: master loop only.
 */
#include "master/meta/tenant.h"

#include <stdlib.h>
#include <string.h>

kvp_status_t kvp_tenant_table_init(kvp_tenant_table_t *tt)
{
    tt->cap = 16;
    tt->t = calloc(tt->cap, sizeof(*tt->t));
    if (tt->t == NULL)
        return KVP_ERR_NOMEM;
    memcpy(tt->t[0].name, KVP_TENANT_DEFAULT, sizeof(KVP_TENANT_DEFAULT));
    tt->n = 1; /* id 0: the default tenant */
    return KVP_OK;
}

void kvp_tenant_table_cleanup(kvp_tenant_table_t *tt)
{
    free(tt->t);
    memset(tt, 0, sizeof(*tt));
}

int32_t kvp_tenant_id(kvp_tenant_table_t *tt, const char *name, size_t len, bool create)
{
    if (!kvp_tenant_name_valid(name, len))
        return -1;
    for (uint32_t i = 0; i < tt->n; i++)
        if (strncmp(tt->t[i].name, name, len) == 0 && tt->t[i].name[len] == '\0')
            return (int32_t)i;
    if (!create || tt->n >= KVP_TENANT_MAX)
        return -1;
    if (tt->n == tt->cap) {
        kvp_tenant_t *nt = realloc(tt->t, tt->cap * 2 * sizeof(*nt));
        if (nt == NULL)
            return -1;
        memset(nt + tt->cap, 0, tt->cap * sizeof(*nt));
        tt->t = nt;
        tt->cap *= 2;
    }
    kvp_tenant_t *t = &tt->t[tt->n];
    memcpy(t->name, name, len);
    t->name[len] = '\0';
    return (int32_t)tt->n++;
}

size_t kvp_tenant_prefix_len(const char *key, size_t len)
{
    const char *sep = memchr(key, KVP_TENANT_SEP, len < 64 ? len : 64);
    return sep != NULL && kvp_tenant_name_valid(key, (size_t)(sep - key)) ? (size_t)(sep - key) : 0;
}

uint16_t kvp_tenant_of_key(kvp_tenant_table_t *tt, const char *key, size_t len)
{
    size_t p = kvp_tenant_prefix_len(key, len);
    int32_t id = p > 0 ? kvp_tenant_id(tt, key, p, true) : 0;
    return id > 0 ? (uint16_t)id : 0;
}
