/*
 * credentials.c - the control port's TLS context and the ACL (see credentials.h).
 *
 * Design: both are read together, at start and at each SIGHUP, into fresh objects; only
 * when both load (and the ACL's tenants fit the table) do they replace the old ones, so a
 * file that does not load changes nothing. Callers keep their principal by name across a
 * reload. TLS sessions open keep a reference to the context they began with.
 *
 * Thread: the master's loop.
 */
#include "master/auth/credentials.h"

#include <string.h>

#include "common/grant.h"
#include "common/log.h"

/* Read the TLS files and the ACL of cfg (at start and at each SIGHUP): both or neither;
 * why in err (a file and what is wrong with it, never a key's bytes). */
static kvp_status_t security_read(const kvp_master_config_t *cfg, kvp_tls_t **tls_p,
                                  kvp_acl_t **acl_p, char *err, size_t err_len)
{
    kvp_tls_params_t tp = {.cert = cfg->tls_cert,
                           .key = cfg->tls_key,
                           .ca = cfg->tls_ca[0] ? cfg->tls_ca : NULL,
                           .crl = cfg->tls_crl[0] ? cfg->tls_crl : NULL};
    kvp_status_t st = kvp_tls_create(&tp, true, tls_p, err, err_len);
    if (st != KVP_OK)
        return st;
    st = kvp_acl_load(cfg->acl_file, acl_p, err, err_len);
    if (st != KVP_OK) {
        kvp_tls_destroy(*tls_p);
        *tls_p = NULL;
    }
    return st;
}

/* The ACL's tenants into the master's table: each principal's tenant id, each tenant's
 * quotas and share (those the file no longer names have none), except a max-dram the
 * tenant quota admin API set or deleted: that stays (docs/security.md). Keys are scoped by tenant
 * from now on. false: the table is full (KVP_TENANT_MAX). */
static bool install_tenants(kvp_master_state_t *st, kvp_acl_t *acl)
{
    static uint8_t seen[KVP_TENANT_MAX / 8]; /* master loop only */
    memset(seen, 0, sizeof(seen));
    uint32_t n_tenants = 0;
    for (size_t i = 0; i < acl->n; i++) {
        kvp_principal_t *p = &acl->p[i];
        int32_t id = kvp_tenant_id(&st->tenants, p->tenant, strlen(p->tenant), true);
        if (id < 0)
            return false;
        p->tenant_id = (uint16_t)id;
        if (!(seen[id / 8] & (1u << (id % 8)))) {
            seen[id / 8] |= (uint8_t)(1u << (id % 8));
            n_tenants++;
        }
    }
    for (uint32_t i = 0; i < st->tenants.n; i++) {
        kvp_tenant_t *t = &st->tenants.t[i];
        t->acl_max_dram = t->max_ssd = t->max_objects = 0;
        t->share_permille = 0;
    }
    for (size_t i = 0; i < acl->n_tenants; i++) {
        const kvp_tenant_conf_t *c = &acl->t[i];
        int32_t id = kvp_tenant_id(&st->tenants, c->name, strlen(c->name), true);
        if (id < 0)
            return false;
        kvp_tenant_t *t = &st->tenants.t[id];
        t->acl_max_dram = c->max_dram;
        t->max_ssd = c->max_ssd;
        t->max_objects = c->max_objects;
        t->share_permille = c->share_permille;
    }
    /* the admin API's policies (/api/v1/tenant_quotas) stay over the file's max-dram */
    for (uint32_t i = 0; i < st->tenants.n; i++)
        kvp_tenant_policy_apply(&st->tenants.t[i]);
    st->acl_tenants = n_tenants;
    st->tenants_on = true;
    return true;
}

kvp_status_t kvp_credentials_load(kvp_credentials_t *cr, kvp_master_state_t *st)
{
    const kvp_master_config_t *cfg = &st->config;
    if (cfg->tls_cert[0] == '\0')
        return KVP_OK;
    char err[512];
    kvp_status_t status = security_read(cfg, &cr->tls, &cr->acl, err, sizeof(err));
    if (status != KVP_OK) {
        KVP_LOG_ERROR("%s", err);
        return status;
    }
    if (cr->acl != NULL && !install_tenants(st, cr->acl)) {
        KVP_LOG_ERROR("%s: more than %u tenants", cfg->acl_file, KVP_TENANT_MAX - 1);
        return KVP_ERR_INVALID_ARG;
    }
    KVP_LOG_INFO("TLS 1.3 on the control port (client certificates %s); ACL %s: %zu principals",
                 cfg->tls_ca[0] ? "verified against --tls-ca" : "not asked for", cfg->acl_file,
                 cr->acl->n);
    /* data grants: a new epoch each start, so no grant of an earlier master is taken */
    if (cfg->data_grants) {
        if (!kvp_grant_random(&st->grant_epoch, sizeof(st->grant_epoch))) {
            KVP_LOG_ERROR("cannot draw the data grants' epoch (no randomness)");
            return KVP_ERR_INTERNAL;
        }
        st->grants_on = true;
        KVP_LOG_INFO("data grants on: tcp data requests to segments mounted here need a grant "
                     "this master sealed (--data-grants off to serve any)");
    } else {
        KVP_LOG_WARN("data grants off (--data-grants off): any peer that reaches a segment's "
                     "data port may read and write it");
    }
    return KVP_OK;
}

/* A caller's principal, looked up again by name in the new ACL. */
typedef struct rebind {
    const kvp_acl_t *acl;
    unsigned removed;
} rebind_t;

static void rebind_one(kvp_caller_t *c, void *ctx)
{
    rebind_t *rb = ctx;
    if (c->who == NULL)
        return;
    c->who = kvp_acl_by_name(rb->acl, c->pname);
    if (c->who == NULL) {
        c->removed = true;
        rb->removed++;
    }
}

void kvp_credentials_reload(kvp_credentials_t *cr, kvp_master_state_t *st,
                            kvp_callers_walk_cb_t *walk, void *walk_arg)
{
    const kvp_master_config_t *cfg = &st->config;
    if (cr->acl == NULL) {
        KVP_LOG_INFO("SIGHUP: no --acl-file to reload");
        return;
    }
    char err[512];
    kvp_acl_t *acl;
    kvp_tls_t *tls;
    if (security_read(cfg, &tls, &acl, err, sizeof(err)) != KVP_OK) {
        KVP_LOG_ERROR("audit: ACL reload failed, the old ACL stays: %s", err);
        return;
    }
    if (!install_tenants(st, acl)) {
        KVP_LOG_ERROR("audit: ACL reload failed, the old ACL stays: more than %u tenants",
                      KVP_TENANT_MAX - 1);
        kvp_acl_destroy(acl);
        kvp_tls_destroy(tls);
        return;
    }
    rebind_t rb = {.acl = acl, .removed = 0};
    walk(walk_arg, rebind_one, &rb);
    kvp_acl_destroy(cr->acl);
    cr->acl = acl;
    kvp_tls_destroy(cr->tls); /* sessions open keep the old context's reference */
    cr->tls = tls;
    KVP_LOG_INFO("audit: ACL reloaded from %s: %zu principals; %u connections of removed "
                 "principals will be refused",
                 cfg->acl_file, acl->n, rb.removed);
}

void kvp_credentials_restore(kvp_credentials_t *cr, kvp_master_state_t *st)
{
    if (cr->acl == NULL)
        return;
    if (!install_tenants(st, cr->acl))
        KVP_LOG_ERROR("%s: more than %u tenants", st->config.acl_file, KVP_TENANT_MAX - 1);
    if (st->config.data_grants && kvp_grant_random(&st->grant_epoch, sizeof(st->grant_epoch)))
        st->grants_on = true;
}

void kvp_credentials_cleanup(kvp_credentials_t *cr)
{
    kvp_acl_destroy(cr->acl);
    kvp_tls_destroy(cr->tls);
    cr->acl = NULL;
    cr->tls = NULL;
}
