/*
 * tenant.c - the master's table of tenants.
 *
 * Design. With an ACL (--acl-file) every principal belongs to a tenant, and
 * the keys a principal names are its tenant's: the master stores them as
 * TENANT 0x1f KEY (master/dispatch.c adds the prefix to every key a request
 * names and master/rpc/admin.c takes it off in listings), so tenant A's
 * `m@blk-1` and tenant B's are two objects, and nothing a client sends can
 * name another tenant's key (a tenant name has no 0x1f, and the prefix is
 * always the caller's). An object carries its tenant's id (obj->tenant, 16
 * bits that were padding), from which the charges are kept here: bytes per
 * tier and objects (master/state.c, kvp_state_charge), checked against the
 * quotas of the tenant's [tenant NAME] section when a put starts
 * (rpc/object.c) and used by eviction to take from tenants over their share
 * first (policy/eviction.c).
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
    tt->n = 1; /* id 0: keys of no tenant */
    return KVP_OK;
}

void kvp_tenant_table_cleanup(kvp_tenant_table_t *tt)
{
    free(tt->t);
    memset(tt, 0, sizeof(*tt));
}

bool kvp_tenant_name_valid(const char *name, size_t len)
{
    if (len == 0 || len >= sizeof(((kvp_tenant_t *)0)->name))
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') && !(c >= '0' && c <= '9') &&
            c != '.' && c != '_' && c != '-')
            return false;
    }
    return true;
}

uint16_t kvp_tenant_id(kvp_tenant_table_t *tt, const char *name, size_t len, bool create)
{
    if (!kvp_tenant_name_valid(name, len))
        return 0;
    for (uint32_t i = 1; i < tt->n; i++)
        if (strncmp(tt->t[i].name, name, len) == 0 && tt->t[i].name[len] == '\0')
            return (uint16_t)i;
    if (!create || tt->n >= KVP_TENANT_MAX)
        return 0;
    if (tt->n == tt->cap) {
        kvp_tenant_t *nt = realloc(tt->t, tt->cap * 2 * sizeof(*nt));
        if (nt == NULL)
            return 0;
        memset(nt + tt->cap, 0, tt->cap * sizeof(*nt));
        tt->t = nt;
        tt->cap *= 2;
    }
    kvp_tenant_t *t = &tt->t[tt->n];
    memcpy(t->name, name, len);
    t->name[len] = '\0';
    return (uint16_t)tt->n++;
}

uint16_t kvp_tenant_of_key(kvp_tenant_table_t *tt, const char *key, size_t len)
{
    size_t ulen;
    const char *user = kvp_tenant_user_key(key, len, &ulen);
    return user == key ? 0 : kvp_tenant_id(tt, key, (size_t)(user - key - 1), true);
}
