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
 * The tenant quota admin API (master/obs/tenant_quotas.c) sets a policy over the ACL's
 * max-dram: a quota of its own (_SET) or none and admission closed (_CLOSED, Mooncake's
 * DELETE). The ACL's figure is kept (acl_max_dram), so an ACL reload changes what the API
 * did not set and leaves what it did (kvp_tenant_policy_apply after each load).
 *
 * Ids are given in order of first sight and never reused while the master
 * runs (the ACL may be reloaded: quotas change, ids and charges stay).
 * Lookups by name are linear: they happen at ACL loads, at mounts and when
 * segments offer what they hold (ha/rebuild.c), never per request.
 *
 * Thread: master loop only.
 */
#include "master/meta/tenant.h"

#include <inttypes.h>
#include <stdio.h>
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
    if (len == 0)
        return 0; /* (an empty key's data may be NULL: protobuf-c's empty bytes) */
    const char *sep = memchr(key, KVP_TENANT_SEP, len < 64 ? len : 64);
    return sep != NULL && kvp_tenant_name_valid(key, (size_t)(sep - key)) ? (size_t)(sep - key) : 0;
}

uint16_t kvp_tenant_of_key(kvp_tenant_table_t *tt, const char *key, size_t len)
{
    size_t p = kvp_tenant_prefix_len(key, len);
    int32_t id = p > 0 ? kvp_tenant_id(tt, key, p, true) : 0;
    return id > 0 ? (uint16_t)id : 0;
}

void kvp_tenant_policy_apply(kvp_tenant_t *t)
{
    t->max_dram = t->policy == KVP_TENANT_POLICY_SET      ? t->policy_dram
                  : t->policy == KVP_TENANT_POLICY_CLOSED ? 0
                                                          : t->acl_max_dram;
    t->closed = t->policy == KVP_TENANT_POLICY_CLOSED;
}

char *kvp_tenant_policy_dump(const kvp_tenant_table_t *tt)
{
    size_t cap = 1, len = 0;
    for (uint32_t i = 0; i < tt->n; i++)
        if (tt->t[i].policy != KVP_TENANT_POLICY_ACL)
            cap += sizeof(tt->t[i].name) + 24;
    char *text = malloc(cap);
    if (text == NULL)
        return NULL;
    text[0] = '\0';
    for (uint32_t i = 0; i < tt->n; i++) {
        const kvp_tenant_t *t = &tt->t[i];
        if (t->policy == KVP_TENANT_POLICY_SET)
            len += (size_t)snprintf(text + len, cap - len, "%s %" PRIu64 "\n", t->name,
                                    t->policy_dram);
        else if (t->policy == KVP_TENANT_POLICY_CLOSED)
            len += (size_t)snprintf(text + len, cap - len, "%s closed\n", t->name);
    }
    return text;
}

/* One line of a policy text: the name's length, and the quota (0: closed). */
static bool policy_line(const char *s, size_t len, size_t *name_len_p, uint64_t *bytes_p)
{
    const char *sp = memchr(s, ' ', len);
    if (sp == NULL || !kvp_tenant_name_valid(s, (size_t)(sp - s)))
        return false;
    *name_len_p = (size_t)(sp - s);
    const char *v = sp + 1;
    size_t vlen = len - *name_len_p - 1;
    if (vlen == 6 && memcmp(v, "closed", 6) == 0) {
        *bytes_p = 0;
        return true;
    }
    uint64_t n = 0;
    if (vlen == 0 || vlen > 19)
        return false;
    for (size_t i = 0; i < vlen; i++) {
        if (v[i] < '0' || v[i] > '9')
            return false;
        n = n * 10 + (uint64_t)(v[i] - '0'); /* 19 digits: no overflow */
    }
    if (n == 0 || n > KVP_TENANT_QUOTA_MAX)
        return false;
    *bytes_p = n;
    return true;
}

bool kvp_tenant_policy_load(kvp_tenant_table_t *tt, const char *text, size_t len)
{
    for (int pass = 0; pass < 2; pass++) { /* 0: check every line, 1: apply */
        if (pass == 1)
            for (uint32_t i = 0; i < tt->n; i++) {
                tt->t[i].policy = KVP_TENANT_POLICY_ACL;
                kvp_tenant_policy_apply(&tt->t[i]);
            }
        for (size_t off = 0; off < len;) {
            const char *nl = memchr(text + off, '\n', len - off);
            size_t l = nl != NULL ? (size_t)(nl - (text + off)) : len - off;
            size_t name_len;
            uint64_t bytes;
            if (l > 0) {
                if (!policy_line(text + off, l, &name_len, &bytes))
                    return false;
                if (pass == 1) {
                    int32_t id = kvp_tenant_id(tt, text + off, name_len, true);
                    if (id >= 0) { /* (a full table: that tenant keeps its ACL's) */
                        kvp_tenant_t *t = &tt->t[id];
                        t->policy = bytes ? KVP_TENANT_POLICY_SET : KVP_TENANT_POLICY_CLOSED;
                        t->policy_dram = bytes;
                        kvp_tenant_policy_apply(t);
                    }
                }
            }
            off += l + 1;
        }
    }
    return true;
}
