/*
 * acl.c - the ACL file: principals, their tenant, roles and key patterns.
 *
 *   # comment
 *   [principal alice]
 *   tenant = team-a               # default "default"
 *   roles = read, write           # read | write | segment | admin | shm
 *   cert-cn = alice.team-a        # client certificate subject CN naming alice
 *   token-sha256 = 9f86d081...    # SHA-256 (hex) of alice's token
 *   keys = llama3@*, shared@*     # fnmatch patterns of the keys she may touch (default *)
 *
 *   [tenant team-a]               # optional: quotas and share of a tenant
 *   max-dram = 64GiB              # bytes of DRAM replicas (default: no quota)
 *   max-ssd = 1TiB                # bytes of SSD replicas
 *   max-objects = 10000000        # objects
 *   share = 25%                   # its share of DRAM under pressure (default: equal)
 *
 * Design: a small line reader of our own (one section kind, one value per
 * line); tokens are stored only as hashes, so the file holds no secret a reader
 * of it could replay. A principal with neither cert-cn nor token-sha256 can
 * never be named and is refused at load, as are duplicate names, CNs or
 * token hashes (two principals for one credential). The master loads the
 * file at start and on SIGHUP into a new kvp_acl_t; the old one stays valid
 * until the loop swaps them (master/auth/credentials.c).
 *
 * Thread: master loop (or main before it); an ACL is never changed once loaded.
 */
#include "common/acl.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "common/parse.h"

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

static bool parse_roles(char *v, uint32_t *roles)
{
    *roles = 0;
    for (char *save = NULL, *t = strtok_r(v, ", \t", &save); t != NULL;
         t = strtok_r(NULL, ", \t", &save)) {
        if (strcmp(t, "read") == 0)
            *roles |= KVP_ROLE_READ;
        else if (strcmp(t, "write") == 0)
            *roles |= KVP_ROLE_WRITE;
        else if (strcmp(t, "segment") == 0)
            *roles |= KVP_ROLE_SEGMENT;
        else if (strcmp(t, "admin") == 0)
            *roles |= KVP_ROLE_ADMIN;
        else if (strcmp(t, "shm") == 0)
            *roles |= KVP_ROLE_SHM;
        else
            return false;
    }
    return true;
}

static bool parse_patterns(kvp_principal_t *p, char *v)
{
    for (char *save = NULL, *t = strtok_r(v, ", \t", &save); t != NULL;
         t = strtok_r(NULL, ", \t", &save)) {
        if (p->n_patterns == KVP_ACL_MAX_PATTERNS)
            return false;
        p->patterns[p->n_patterns] = strdup(t);
        if (p->patterns[p->n_patterns] == NULL)
            return false;
        p->n_patterns++;
    }
    return p->n_patterns > 0;
}

/*
 * A line holding a NUL or another control character (tab and the line's end aside) is
 * refused whole: a name is what it looks like, so `ali\0ce` never becomes principal `ali`,
 * nor a name with an invisible byte a second principal or tenant that prints as the first.
 */
static const char *line_chars_refused(const char *line, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)line[i];
        if (c == '\0')
            return "a NUL byte in the line (names, keys and values are text)";
        if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f)
            return "a control character in the line (names, keys and values are printable "
                   "text)";
    }
    return NULL;
}

/* One "key = value" line of a principal's section. A sentence when it is wrong. */
static const char *set_field(kvp_principal_t *p, const char *k, char *v)
{
    if (strcmp(k, "tenant") == 0) {
        if (!kvp_tenant_name_valid(v, strlen(v)))
            return "tenant needs a name of 1..63 bytes of A-Z a-z 0-9 . _ -";
        snprintf(p->tenant, sizeof(p->tenant), "%s", v);
    } else if (strcmp(k, "roles") == 0) {
        if (!parse_roles(v, &p->roles))
            return "roles are read, write, segment, admin (comma-separated)";
    } else if (strcmp(k, "cert-cn") == 0) {
        if (v[0] == '\0' || strlen(v) >= sizeof(p->cert_cn))
            return "cert-cn needs a name of 1..255 bytes";
        if (strchr(v, '\t') != NULL)
            return "cert-cn holds a tab (a certificate's CN is printable text)";
        snprintf(p->cert_cn, sizeof(p->cert_cn), "%s", v);
    } else if (strcmp(k, "token-sha256") == 0) {
        if (strlen(v) != 64)
            return "token-sha256 needs 64 hex digits (printf %s \"$TOKEN\" | sha256sum)";
        for (int i = 0; i < 32; i++) {
            int hi = kvp_parse_hex_digit(v[2 * i]), lo = kvp_parse_hex_digit(v[2 * i + 1]);
            if (hi < 0 || lo < 0)
                return "token-sha256 needs 64 hex digits";
            p->token_hash[i] = (uint8_t)(hi << 4 | lo);
        }
        p->has_token = true;
    } else if (strcmp(k, "keys") == 0) {
        if (p->n_patterns > 0 || !parse_patterns(p, v))
            return "keys needs 1..16 patterns, given once";
    } else {
        return "unknown setting (tenant, roles, cert-cn, token-sha256, keys)";
    }
    return NULL;
}

/* One "key = value" line of a [tenant NAME] section. */
static const char *set_tenant_field(kvp_tenant_conf_t *t, const char *k, const char *v)
{
    if (strcmp(k, "max-dram") == 0 || strcmp(k, "max-ssd") == 0) {
        uint64_t *dst = k[4] == 'd' ? &t->max_dram : &t->max_ssd;
        if (!kvp_parse_size(v, dst) || *dst == 0)
            return "max-dram and max-ssd need a size above 0 (64MiB, 1GiB, 1TiB...)";
    } else if (strcmp(k, "max-objects") == 0) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(v, &end, 10);
        if (v[0] == '\0' || v[0] == '-' || *end != '\0' || errno != 0 || n == 0)
            return "max-objects needs a count above 0";
        t->max_objects = n;
    } else if (strcmp(k, "share") == 0) {
        char *end;
        double pct = strtod(v, &end);
        if (end == v || strcmp(end, "%") != 0 || !(pct > 0 && pct <= 100))
            return "share needs a percentage of DRAM, above 0 and at most 100 (25%)";
        t->share_permille = (uint32_t)(pct * 10 + 0.5);
        if (t->share_permille == 0)
            t->share_permille = 1;
    } else {
        return "unknown setting (max-dram, max-ssd, max-objects, share)";
    }
    return NULL;
}

static const char *add_tenant(kvp_acl_t *acl, const char *name, kvp_tenant_conf_t **t_p)
{
    if (!kvp_tenant_name_valid(name, strlen(name)))
        return "a tenant needs a name of 1..63 bytes of A-Z a-z 0-9 . _ -";
    if (kvp_acl_tenant(acl, name) != NULL)
        return "a tenant of this name is already defined";
    kvp_tenant_conf_t *nt = realloc(acl->t, (acl->n_tenants + 1) * sizeof(*nt));
    if (nt == NULL)
        return "out of memory";
    acl->t = nt;
    *t_p = &acl->t[acl->n_tenants++];
    memset(*t_p, 0, sizeof(**t_p));
    snprintf((*t_p)->name, sizeof((*t_p)->name), "%s", name);
    return NULL;
}

/* The shares the file gives add up to at most 100 %. */
static const char *check_shares(const kvp_acl_t *acl)
{
    uint32_t sum = 0;
    for (size_t i = 0; i < acl->n_tenants; i++)
        sum += acl->t[i].share_permille;
    return sum > 1000 ? "the tenants' shares add up to more than 100%" : NULL;
}

/* A section's principal is whole: it can be named, and names nobody else's credential. */
static const char *check_principal(const kvp_acl_t *acl, const kvp_principal_t *p)
{
    if (p->cert_cn[0] == '\0' && !p->has_token)
        return "needs cert-cn or token-sha256 (nothing could name it)";
    for (size_t i = 0; i + 1 < acl->n; i++) {
        const kvp_principal_t *q = &acl->p[i];
        if (strcmp(q->name, p->name) == 0)
            return "a principal of this name is already defined";
        if (p->cert_cn[0] && strcmp(q->cert_cn, p->cert_cn) == 0)
            return "another principal has this cert-cn";
        if (p->has_token && q->has_token && memcmp(q->token_hash, p->token_hash, 32) == 0)
            return "another principal has this token";
    }
    return NULL;
}

static kvp_principal_t *add_principal(kvp_acl_t *acl, const char *name)
{
    kvp_principal_t *np = realloc(acl->p, (acl->n + 1) * sizeof(*np));
    if (np == NULL)
        return NULL;
    kvp_principal_t *p = np + acl->n;
    acl->p = np;
    acl->n++;
    memset(p, 0, sizeof(*p));
    size_t len = strnlen(name, sizeof(p->name) - 1); /* (the caller checked: < 128) */
    memcpy(p->name, name, len);
    memcpy(p->tenant, "default", sizeof("default"));
    /* its tag in data grants: the first 8 bytes of SHA-256 of its name (never 0) */
    uint8_t md[32];
    unsigned int md_len = 0;
    if (EVP_Digest(p->name, len, md, &md_len, EVP_sha256(), NULL) == 1)
        memcpy(&p->tag, md, sizeof(p->tag));
    p->tag |= 1;
    return p;
}

kvp_status_t kvp_acl_load(const char *path, kvp_acl_t **acl_p, char *err, size_t err_len)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, err_len, "%s: cannot read: %m", path);
        return KVP_ERR_INVALID_ARG;
    }
    kvp_acl_t *acl = calloc(1, sizeof(*acl));
    if (acl == NULL) {
        fclose(f);
        return KVP_ERR_NOMEM;
    }
    char *line = NULL;
    size_t cap = 0;
    unsigned lineno = 0;
    const char *why = NULL;
    kvp_principal_t *cur = NULL;
    kvp_tenant_conf_t *cur_t = NULL;
    ssize_t got;
    while (why == NULL && (got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if ((why = line_chars_refused(line, (size_t)got)) != NULL)
            break;
        char *s = trim(line);
        if (s[0] == '\0' || s[0] == '#' || s[0] == ';')
            continue;
        if (s[0] == '[') {
            if (cur != NULL && (why = check_principal(acl, cur)) != NULL) {
                lineno--; /* the section that just ended: say where it is wrong at its end */
                break;
            }
            char *end = strchr(s, ']');
            char *name = s + 1;
            if (end == NULL || end[1] != '\0' ||
                ((strncmp(name, "principal", 9) != 0 || !isspace((unsigned char)name[9])) &&
                 (strncmp(name, "tenant", 6) != 0 || !isspace((unsigned char)name[6])))) {
                why = "sections are [principal NAME] and [tenant NAME]";
                break;
            }
            *end = '\0';
            cur = NULL;
            cur_t = NULL;
            if (strncmp(name, "tenant", 6) == 0 && isspace((unsigned char)name[6])) {
                why = add_tenant(acl, trim(name + 6), &cur_t);
                continue;
            }
            name = trim(name + 9);
            if (name[0] == '\0' || strlen(name) >= KVP_ACL_NAME_MAX) {
                why = "a principal needs a name of 1..127 bytes";
                break;
            }
            if (strchr(name, '\t') != NULL) {
                why = "a principal's name holds a tab (names are printable text)";
                break;
            }
            cur = add_principal(acl, name);
            if (cur == NULL)
                why = "out of memory";
            continue;
        }
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            why = "expected KEY = VALUE";
            break;
        }
        if (cur == NULL && cur_t == NULL) {
            why = "a setting before any [principal NAME] or [tenant NAME]";
            break;
        }
        *eq = '\0';
        char *v = trim(eq + 1);
        char *hash = strchr(v, '#'); /* a comment after the value */
        if (hash != NULL) {
            *hash = '\0';
            v = trim(v);
        }
        why = cur != NULL ? set_field(cur, trim(s), v) : set_tenant_field(cur_t, trim(s), v);
    }
    if (why == NULL && cur != NULL)
        why = check_principal(acl, cur);
    if (why == NULL)
        why = check_shares(acl);
    free(line);
    fclose(f);
    if (why != NULL) {
        snprintf(err, err_len, "%s:%u: %s", path, lineno, why);
        kvp_acl_destroy(acl);
        return KVP_ERR_INVALID_ARG;
    }
    *acl_p = acl;
    return KVP_OK;
}

void kvp_acl_destroy(kvp_acl_t *acl)
{
    if (acl == NULL)
        return;
    for (size_t i = 0; i < acl->n; i++) {
        for (unsigned j = 0; j < acl->p[i].n_patterns; j++)
            free(acl->p[i].patterns[j]);
        OPENSSL_cleanse(acl->p[i].token_hash, sizeof(acl->p[i].token_hash));
    }
    free(acl->p);
    free(acl->t);
    free(acl);
}

const kvp_tenant_conf_t *kvp_acl_tenant(const kvp_acl_t *acl, const char *name)
{
    for (size_t i = 0; i < acl->n_tenants; i++)
        if (strcmp(acl->t[i].name, name) == 0)
            return &acl->t[i];
    return NULL;
}

const kvp_principal_t *kvp_acl_by_name(const kvp_acl_t *acl, const char *name)
{
    for (size_t i = 0; i < acl->n; i++)
        if (strcmp(acl->p[i].name, name) == 0)
            return &acl->p[i];
    return NULL;
}

const kvp_principal_t *kvp_acl_by_cn(const kvp_acl_t *acl, const char *cn)
{
    for (size_t i = 0; i < acl->n; i++)
        if (acl->p[i].cert_cn[0] != '\0' && strcmp(acl->p[i].cert_cn, cn) == 0)
            return &acl->p[i];
    return NULL;
}

const kvp_principal_t *kvp_acl_by_token(const kvp_acl_t *acl, const void *token, size_t len)
{
    uint8_t h[32];
    unsigned hl = 0;
    if (len == 0 || EVP_Digest(token, len, h, &hl, EVP_sha256(), NULL) != 1 || hl != 32)
        return NULL;
    const kvp_principal_t *found = NULL;
    for (size_t i = 0; i < acl->n; i++) /* every one, whatever matched: no timing hint */
        if (acl->p[i].has_token && CRYPTO_memcmp(acl->p[i].token_hash, h, 32) == 0)
            found = &acl->p[i];
    OPENSSL_cleanse(h, sizeof(h));
    return found;
}

bool kvp_principal_may_key(const kvp_principal_t *p, const void *key, size_t len)
{
    if (p->n_patterns == 0 || (p->roles & KVP_ROLE_ADMIN))
        return true;
    char buf[4097]; /* a key is at most 4096 bytes (common/key.h) */
    if (len > 4096 || memchr(key, '\0', len) != NULL)
        return false;
    memcpy(buf, key, len);
    buf[len] = '\0';
    for (unsigned i = 0; i < p->n_patterns; i++)
        if (fnmatch(p->patterns[i], buf, 0) == 0)
            return true;
    return false;
}

const char *kvp_roles_str(uint32_t roles, char *buf, size_t len)
{
    static const char *names[] = {"read", "write", "segment", "admin", "shm"};
    size_t off = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (roles & (1u << i))
            off += (size_t)snprintf(buf + off, off < len ? len - off : 0, "%s%s", off ? "," : "",
                                    names[i]);
    if (buf[0] == '\0')
        snprintf(buf, len, "none");
    return buf;
}

bool kvp_tenant_name_valid(const char *name, size_t len)
{
    if (len == 0 || len >= KVP_TENANT_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') && !(c >= '0' && c <= '9') &&
            c != '.' && c != '_' && c != '-')
            return false;
    }
    return true;
}
