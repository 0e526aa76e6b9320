/*
 * acl.h - who may do what: principals, their tenant, roles and key patterns,
 * read from the master's --acl-file (docs/security.md).
 */
#ifndef KVP_COMMON_ACL_H
#define KVP_COMMON_ACL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Roles: what a principal may call (master/dispatch.c names the role of each method). */
enum {
    KVP_ROLE_READ = 1u << 0,    /* exist, get, size, list its keys (ping, stat, heartbeat: any) */
    KVP_ROLE_WRITE = 1u << 1,   /* put, remove, remove-by-regex of its keys */
    KVP_ROLE_SEGMENT = 1u << 2, /* mount, serve and drain its own segments (kvpool serve) */
    KVP_ROLE_ADMIN = 1u << 3,   /* every method (remove-all, drain of any segment), every key */
    /* a trusted local worker: is handed the memory of any segment on its host (shm), so
     * reads and writes every object in it, of every tenant (docs/security.md) */
    KVP_ROLE_SHM = 1u << 4,
};

#define KVP_ACL_NAME_MAX 128
#define KVP_ACL_MAX_PATTERNS 16
/* A tenant's name: 1..63 bytes of [A-Za-z0-9._-] (it prefixes its keys, master/meta/tenant.h) */
#define KVP_TENANT_NAME_MAX 64

/* A [tenant NAME] section: its quotas (0: none) and its share of DRAM under pressure. */
typedef struct kvp_tenant_conf {
    char name[KVP_TENANT_NAME_MAX];
    uint64_t max_dram;       /* bytes of DRAM replicas */
    uint64_t max_ssd;        /* bytes of SSD replicas */
    uint64_t max_objects;    /* objects (PENDING ones included) */
    uint32_t share_permille; /* its share of DRAM; 0: an equal share of what is left */
} kvp_tenant_conf_t;

typedef struct kvp_principal {
    char name[KVP_ACL_NAME_MAX];
    char tenant[KVP_TENANT_NAME_MAX]; /* "default" unless the file says */
    uint16_t tenant_id;               /* the master's id of it (master/meta/tenant.h) */
    uint32_t roles;
    uint64_t tag;           /* names it in data grants (common/grant.h): from its name */
    char cert_cn[256];      /* the client certificate subject CN that names it; "": none */
    uint8_t token_hash[32]; /* SHA-256 of its token */
    bool has_token;
    /* fnmatch(3) patterns of the keys it may touch; none: every key */
    char *patterns[KVP_ACL_MAX_PATTERNS];
    unsigned n_patterns;
} kvp_principal_t;

typedef struct kvp_acl {
    kvp_principal_t *p;
    size_t n;
    kvp_tenant_conf_t *t; /* the [tenant NAME] sections */
    size_t n_tenants;
} kvp_acl_t;

/*
 * Read an ACL file. KVP_ERR_INVALID_ARG with "FILE:LINE: what is wrong" in err (the line's
 * value is never echoed: it may be a secret's hash). An empty file is valid (nobody may
 * do anything).
 */
kvp_status_t kvp_acl_load(const char *path, kvp_acl_t **acl_p, char *err, size_t err_len);
void kvp_acl_destroy(kvp_acl_t *acl);

/* The [tenant NAME] section of this name; NULL: none (no quota, the default share). */
const kvp_tenant_conf_t *kvp_acl_tenant(const kvp_acl_t *acl, const char *name);

const kvp_principal_t *kvp_acl_by_name(const kvp_acl_t *acl, const char *name);
const kvp_principal_t *kvp_acl_by_cn(const kvp_acl_t *acl, const char *cn);
/* The principal whose token this is: compared in constant time against every hash. */
const kvp_principal_t *kvp_acl_by_token(const kvp_acl_t *acl, const void *token, size_t len);

/* May p touch this key (its patterns; admins any)? */
bool kvp_principal_may_key(const kvp_principal_t *p, const void *key, size_t len);

/* "read,write" for roles (into buf). */
const char *kvp_roles_str(uint32_t roles, char *buf, size_t len);

/* Is this a valid tenant name (1..63 bytes of [A-Za-z0-9._-])? */
bool kvp_tenant_name_valid(const char *name, size_t len);

#endif
