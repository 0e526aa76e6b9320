/*
 * segment_calls.c - the master's segment RPCs: Mount, Unmount, Heartbeat, and the
 * unmount of a closed connection's segments.
 *
 * Design: a segment is mounted by one connection and lives as long as it:
 * when the connection closes (or the owner unmounts) its replicas are
 * dropped and objects left with none are removed, so a dead owner's bytes
 * are never handed out. Heartbeat: a client says it is alive (any frame
 * does; the server closes connections silent past --client-ttl) and lists
 * the segments it believes mounted; the answer says whether it must
 * remount and which of its segments to drain.
 *
 * Authority follows the principal (with an ACL): a mount may not advertise a data endpoint
 * (tcp, rdma, shm) that a live segment of another principal advertises, nor take a name
 * the master holds for another principal (what its segment held when it was dropped,
 * meta/limbo.c); a Heartbeat hands a principal only the descriptors it can use, and the
 * owner's client id only to the owner (call.c).
 *
 * Thread: master loop only.
 */
#include "master/rpc/segment_calls.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/grant.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/parse.h"
#include "common/sock.h"
#include "master/meta/limbo.h"
#include "master/policy/drain_jobs.h"
#include "master/policy/lease.h"
#include "master/policy/tier.h"
#include "master/rpc/reply.h"
#include "master/rpc/task_calls.h"

static void limbo_attach(kvp_master_state_t *st, kvp_segment_t *seg);
static void dfs_take_over(kvp_master_state_t *st, kvp_segment_t *seg);

/* Is d a segment one may mount? */
static bool desc_valid(const Kvpool__SegmentDesc *d)
{
    char host[256];
    uint16_t port;
    return d != NULL && d->size >= KVP_SEGMENT_MIN_SIZE && d->size <= KVP_SEGMENT_MAX_SIZE &&
           d->name[0] != '\0' && strlen(d->name) <= 255 &&
           (strcmp(d->medium, "dram") == 0 || strcmp(d->medium, "ssd") == 0 ||
            strcmp(d->medium, "dfs") == 0) &&
           d->host_id[0] != '\0' &&
           kvp_parse_hostport(d->tcp_endpoint, host, sizeof(host), &port) == KVP_OK &&
           (d->rdma_endpoint[0] == '\0' ||
            kvp_parse_hostport(d->rdma_endpoint, host, sizeof(host), &port) == KVP_OK);
}

/*
 * A segment's name is what it looks like: no NUL or control character (a tab, an escape
 * sequence, a DEL) and no whitespace at either end, so two segments never differ by an
 * invisible byte (`kvpool stat` escapes what is left: client/tools/cli). Names differing by
 * case are two segments, and print as two. NULL: the name is fine; else why not, the name
 * written with C escapes into buf.
 */
static const char *segment_name_refused(const char *name, char *buf, size_t cap)
{
    size_t len = strlen(name), at = 0;
    const char *why = NULL;
    for (size_t i = 0; i < len && why == NULL; i++)
        if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] == 0x7f)
            why = "holds a control character";
    if (why == NULL && (name[0] == ' ' || name[len - 1] == ' '))
        why = "starts or ends with a space";
    if (why == NULL)
        return NULL;
    for (size_t i = 0; i < len && at + 5 < cap; i++) {
        unsigned char c = (unsigned char)name[i];
        at += c < 0x20 || c == 0x7f || c == '"' || c == '\\'
                  ? (size_t)snprintf(buf + at, cap - at, "\\x%02x", c)
                  : (size_t)snprintf(buf + at, cap - at, "%c", c);
    }
    buf[at < cap ? at : cap - 1] = '\0';
    return why;
}

/*
 * The tenant a mount dedicates its segment to (name; empty: none, *tenant_p -1): the
 * caller's own (an admin's: any); tenants need an ACL. Otherwise a status, why in r->text.
 */
static kvp_status_t mount_tenant(kvp_reply_t *r, const char *name, int32_t *tenant_p)
{
    kvp_master_state_t *st = r->call->st;
    const kvp_principal_t *who = r->call->who;
    *tenant_p = -1;
    if (name[0] == '\0')
        return KVP_OK;
    if (!st->tenants_on || who == NULL) {
        snprintf(r->text, r->text_max,
                 "a segment dedicated to tenant %.64s needs a master with an ACL "
                 "(--acl-file): without one there are no tenants",
                 name);
        return KVP_ERR_INVALID_ARG;
    }
    if (!(who->roles & KVP_ROLE_ADMIN) && strcmp(who->tenant, name) != 0) {
        st->stats.refused_role++;
        snprintf(r->text, r->text_max,
                 "principal %s (tenant %s) may not dedicate a segment to tenant %.64s", who->name,
                 who->tenant, name);
        KVP_LOG_WARN_LIMITED("mount refused: %s", r->text);
        return KVP_ERR_DENIED;
    }
    *tenant_p = kvp_tenant_id(&st->tenants, name, strlen(name), true);
    if (*tenant_p < 0) {
        snprintf(r->text, r->text_max, "%.64s is no tenant name (1..63 of A-Z a-z 0-9 . _ -)",
                 name);
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}

/* The segment a mount describes, owned by the caller's connection, not yet in the table;
 * NULL: out of memory. */
static kvp_segment_t *segment_new(const kvp_call_t *call, const Kvpool__MountRequest *req)
{
    const kvp_master_state_t *st = call->st;
    const Kvpool__SegmentDesc *d = req->segment;
    kvp_segment_t *seg = calloc(1, sizeof(*seg));
    if (seg == NULL)
        return NULL;
    seg->name = strdup(d->name);
    seg->medium = strdup(d->medium);
    seg->host_id = strdup(d->host_id);
    seg->tcp_endpoint = strdup(d->tcp_endpoint);
    seg->shm_path = strdup(d->shm_path);
    seg->rdma_endpoint = strdup(d->rdma_endpoint);
    seg->rdma_addr = d->rdma_addr;
    seg->rdma_rkey = d->rdma_rkey;
    seg->rdma_windows = d->rdma_windows;
    seg->size = d->size;
    seg->owner_client_id = req->client_id;
    seg->owner_conn_id = call->conn_id;
    seg->owner_tag = call->who != NULL ? call->who->tag : 0;
    seg->owner_tenant = call->who != NULL ? call->who->tenant_id : 0;
    if (!seg->name || !seg->medium || !seg->host_id || !seg->tcp_endpoint || !seg->shm_path ||
        !seg->rdma_endpoint) {
        kvp_segment_destroy(seg);
        return NULL;
    }
    seg->dfs = strcmp(d->medium, "dfs") == 0; /* a file tier like SSD, placed apart */
    seg->ssd = seg->dfs || strcmp(d->medium, "ssd") == 0;
    seg->adopting = req->adopting;
    seg->mounted_ms = st->now_ms;
    if (req->remount) /* bytes under the earlier mount's holds may still come */
        seg->quiet_until_ms = kvp_now_ms() + KVP_REMOUNT_QUIET_MS;
    /* with data grants the owner needs the record's put ends even with --segment-records
     * off (they end write grants); then its offers are refused (record_calls.c): nothing adopted */
    seg->record = !seg->ssd && (st->config.segment_records || st->grants_on);
    return seg;
}

/* Give seg its allocator and its place in the table; otherwise destroy it: a status, why
 * in r->text. */
static kvp_status_t segment_place(kvp_reply_t *r, kvp_segment_t *seg)
{
    kvp_master_state_t *st = r->call->st;
    /* DRAM: 64-byte granularity (cache-line aligned extents, small metadata); SSD:
     * 4 KiB, the unit of O_DIRECT I/O */
    kvp_status_t status =
        kvp_offset_alloc_create(seg->size, seg->ssd ? 4096 : KVP_SEGMENT_ALIGN, &seg->alloc);
    if (status == KVP_OK)
        status = kvp_segment_table_add(&st->segments, seg);
    /* its memory mounted again while readers of the objects it held when it was dropped
     * may still copy from it: nothing new is placed there before their leases end (after
     * kvp_segment_table_add: a wait for this one segment, not the pool's remount quiet) */
    uint64_t reads = status == KVP_OK && !seg->ssd
                         ? kvp_segment_table_cut_until(&st->segments, seg->name, kvp_now_ms())
                         : 0;
    if (reads > seg->quiet_until_ms) {
        seg->quiet_until_ms = reads;
        KVP_LOG_INFO("segment %s mounted again: no new object there for %llu ms, until the "
                     "reads its earlier mount had when it was dropped are over",
                     seg->name, (unsigned long long)(reads - kvp_now_ms()));
    }
    if (status != KVP_OK) {
        snprintf(r->text, r->text_max, "cannot set up segment %s: %s", seg->name,
                 kvp_strerror(status));
        kvp_segment_destroy(seg);
    }
    return status;
}

/* A segment mounted from another host that advertises a loopback endpoint: say so. */
static void warn_loopback(const kvp_master_state_t *st, const kvp_segment_t *seg)
{
    char host[256];
    uint16_t port;
    if (st->call_has_fd &&
        kvp_parse_hostport(seg->tcp_endpoint, host, sizeof(host), &port) == KVP_OK &&
        kvp_host_is_loopback(host) && !kvp_sock_peer_local(st->call_fd)) {
        char peer[80];
        kvp_sock_peer_name(st->call_fd, peer, sizeof(peer));
        KVP_LOG_WARN("segment %s mounted from %s advertises the loopback endpoint %s: clients "
                     "on other hosts cannot reach it (start its owner with --data-host ADDRESS, "
                     "or without --data-host to advertise the address it reaches this master "
                     "from)",
                     seg->name, peer, seg->tcp_endpoint);
    }
}

/* An advertised host, as the master can compare it without asking anyone: IP literals
 * written one way (inet_aton's forms for IPv4, an IPv4-mapped IPv6 as its IPv4); every
 * loopback or wildcard address and "localhost" as one; other names by their spelling,
 * case and a final dot aside. */
static void host_canon(const char *host, char *out, size_t out_len)
{
    struct in_addr a4;
    struct in6_addr a6;
    char h[256];
    snprintf(h, sizeof(h), "%s", host);
    size_t n = strlen(h);
    if (n > 1 && h[n - 1] == '.')
        h[n - 1] = '\0';
    for (char *p = h; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    if (inet_aton(h, &a4) != 0)
        inet_ntop(AF_INET, &a4, h, sizeof(h));
    else if (inet_pton(AF_INET6, h, &a6) == 1 && IN6_IS_ADDR_V4MAPPED(&a6))
        inet_ntop(AF_INET, &a6.s6_addr[12], h, sizeof(h));
    else if (inet_pton(AF_INET6, h, &a6) == 1)
        inet_ntop(AF_INET6, &a6, h, sizeof(h));
    if (kvp_host_is_loopback(h) || strcmp(h, "0.0.0.0") == 0 || strcmp(h, "::") == 0)
        snprintf(out, out_len, "loopback");
    else
        snprintf(out, out_len, "%s", h);
}

/* Do two advertised host:port endpoints name the same listener (host_canon)? */
static bool same_endpoint(const char *a, const char *b)
{
    char ha[256], hb[256], ca[256], cb[256];
    uint16_t pa, pb;
    if (a[0] == '\0' || b[0] == '\0')
        return false;
    if (kvp_parse_hostport(a, ha, sizeof(ha), &pa) != KVP_OK ||
        kvp_parse_hostport(b, hb, sizeof(hb), &pb) != KVP_OK)
        return strcmp(a, b) == 0;
    if (pa != pb)
        return false;
    host_canon(ha, ca, sizeof(ca));
    host_canon(hb, cb, sizeof(cb));
    return strcmp(ca, cb) == 0;
}

/* Which of d's data endpoints a segment that advertised tcp, rdma and shm also
 * advertises (NULL: none). */
static const char *shared_endpoint(const Kvpool__SegmentDesc *d, const char *tcp, const char *rdma,
                                   const char *shm)
{
    if (same_endpoint(tcp, d->tcp_endpoint))
        return "tcp endpoint";
    if (same_endpoint(rdma, d->rdma_endpoint))
        return "rdma endpoint";
    if (d->shm_path[0] != '\0' && strcmp(shm, d->shm_path) == 0)
        return "shm path";
    return NULL;
}

/*
 * With an ACL: the name of a segment of another principal, live or held in limbo, that
 * advertises one of the data endpoints d advertises (*what_p: which), or NULL. Clients
 * reach a segment at what its descriptor says; a mount that names another owner's server
 * sends them there, where every request for the impostor's segment fails. The master
 * cannot ask the server who it is (it does not connect to owners), so this catches a
 * claim on an endpoint served now or held for its owner, by its spelling
 * (same_endpoint), not an endpoint claimed before its owner first mounts, nor one named
 * by another of its host's addresses or names (docs/security.md).
 */
static const char *endpoint_taken(const kvp_call_t *call, const Kvpool__SegmentDesc *d,
                                  const char **what_p)
{
    const kvp_master_state_t *st = call->st;
    if (call->who == NULL)
        return NULL;
    for (uint32_t i = 0; i < st->segments.n_slots; i++) {
        const kvp_segment_t *seg = st->segments.slots[i];
        if (seg == NULL || seg->owner_tag == call->who->tag)
            continue;
        *what_p = shared_endpoint(d, seg->tcp_endpoint, seg->rdma_endpoint, seg->shm_path);
        if (*what_p != NULL)
            return seg->name;
    }
    for (const kvp_limbo_t *l = st->limbo; l != NULL; l = l->next) {
        if (kvp_limbo_held_by(l, call->who->tag))
            continue;
        *what_p = shared_endpoint(d, l->tcp_endpoint, l->rdma_endpoint, l->shm_path);
        if (*what_p != NULL)
            return l->name;
    }
    return NULL;
}

/* With an ACL: what the master holds for a dropped segment of this name that another
 * principal mounted (meta/limbo.c), or NULL. */
static const kvp_limbo_t *name_held(const kvp_call_t *call, const char *name)
{
    if (call->who == NULL)
        return NULL;
    for (const kvp_limbo_t *l = call->st->limbo; l != NULL; l = l->next)
        if (strcmp(l->name, name) == 0 && !kvp_limbo_held_by(l, call->who->tag))
            return l;
    return NULL;
}

/* A mount that claims another principal's segment (its endpoint, or its name while the
 * master holds what it held): refused, counted, logged, why in r->text. KVP_OK: none. */
static kvp_status_t mount_claims(kvp_reply_t *r, const Kvpool__SegmentDesc *d)
{
    const kvp_call_t *call = r->call;
    kvp_master_state_t *st = call->st;
    const char *what = NULL;
    const kvp_limbo_t *held = name_held(call, d->name);
    const char *other = held == NULL ? endpoint_taken(call, d, &what) : NULL;
    if (other != NULL) {
        st->stats.refused_seg_endpoint++;
        snprintf(r->text, r->text_max,
                 "principal %s may not mount segment %.255s: its %s is advertised by segment "
                 "%.255s, which another principal mounted",
                 call->who->name, d->name, what, other);
    } else if (held != NULL) {
        st->stats.refused_seg_held++;
        snprintf(r->text, r->text_max,
                 "principal %s may not mount segment %.255s: the master holds what a segment "
                 "of that name held when it was dropped, for the principal that mounted it, "
                 "for %llu s more (--segment-grace)",
                 call->who->name, d->name,
                 (unsigned long long)(held->until_ms > st->now_ms
                                          ? (held->until_ms - st->now_ms + 999) / 1000
                                          : 0));
    } else {
        return KVP_OK;
    }
    KVP_LOG_WARN_LIMITED("connection %llu: mount refused: %s", (unsigned long long)call->conn_id,
                         r->text);
    return KVP_ERR_DENIED;
}

/* The host the master probes for an advertised tcp endpoint's host: as written, or for a
 * wildcard (an owner listening on every address) the address the mount came from. */
static void probe_host(const kvp_master_state_t *st, const char *host, char *out, size_t out_len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    snprintf(out, out_len, "%s", host);
    if (host[0] != '\0' && strcmp(host, "0.0.0.0") != 0 && strcmp(host, "::") != 0)
        return;
    if (!st->call_has_fd || getpeername(st->call_fd, (struct sockaddr *)&ss, &sl) != 0)
        return;
    if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, out, (socklen_t)out_len);
    else if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, out, (socklen_t)out_len);
}

/*
 * --mount-proof (docs/security.md, "A mount's endpoint is proven"): before a mount is
 * answered the server at its tcp endpoint proves it serves the segment, with the secret
 * the owner sent (auth/mount_proof.h; the server runs the probe off the loop and calls the
 * mount again with st->proof_result). KVP_OK and *asked_p: the probe is asked (no answer
 * now); KVP_OK alone: proven, or no proof wanted; otherwise refused, counted, logged (never
 * the secret), why in r->text.
 */
static kvp_status_t mount_proven(kvp_reply_t *r, const Kvpool__MountRequest *req, bool *asked_p)
{
    const kvp_call_t *call = r->call;
    kvp_master_state_t *st = call->st;
    const Kvpool__SegmentDesc *d = req->segment;
    *asked_p = false;
    if (!st->mount_proof || st->proof_result > 0)
        return KVP_OK;
    const char *who = call->who != NULL ? call->who->name : "(no ACL)";
    if (st->proof_result < 0)
        snprintf(r->text, r->text_max,
                 "principal %s may not mount segment %.128s: the server at its tcp endpoint %s "
                 "did not prove it serves that segment: %s (a mount may only advertise an "
                 "endpoint its owner serves; --mount-proof)",
                 who, d->name, d->tcp_endpoint, st->proof_why);
    else if (req->proof_secret.len != KVP_PROVE_SECRET_LEN)
        snprintf(r->text, r->text_max,
                 "principal %s may not mount segment %.128s: the mount carries no proof secret "
                 "(its owner's kvpool predates mount proofs: upgrade it, or start the master "
                 "with --mount-proof off)",
                 who, d->name);
    else if (!st->may_park)
        snprintf(r->text, r->text_max, "segment %.255s: its proof cannot be asked now", d->name);
    else {
        char host[256];
        uint16_t port;
        if (kvp_parse_hostport(d->tcp_endpoint, host, sizeof(host), &port) != KVP_OK)
            return KVP_ERR_INVALID_ARG; /* desc_valid checked it */
        /* a loopback endpoint mounted from another host (warn_loopback): served on that
         * host only, out of this master's reach; compared instead (every loopback endpoint
         * of a port compares as one: endpoint_taken) */
        if (kvp_host_is_loopback(host) && st->call_has_fd && !kvp_sock_peer_local(st->call_fd))
            return KVP_OK;
        probe_host(st, host, st->proof_ask.host, sizeof(st->proof_ask.host));
        st->proof_ask.port = port;
        snprintf(st->proof_ask.name, sizeof(st->proof_ask.name), "%s", d->name);
        memcpy(st->proof_ask.secret, req->proof_secret.data, KVP_PROVE_SECRET_LEN);
        st->proof_asked = true;
        st->parked = true; /* the server holds the request: no answer now */
        *asked_p = true;
        return KVP_OK;
    }
    st->stats.refused_seg_proof++;
    KVP_LOG_WARN_LIMITED("connection %llu: mount refused: %s", (unsigned long long)call->conn_id,
                         r->text);
    return KVP_ERR_DENIED;
}

/* Is seg an ownerless DFS segment the caller's mount of d (dedicated to tenant, -1: none)
 * takes over (dfs_take_over)? Its owner back under the same name: a reconnect after it was
 * dropped for silence. */
static bool own_orphan(const kvp_call_t *call, const kvp_segment_t *seg,
                       const Kvpool__SegmentDesc *d, int32_t tenant)
{
    const kvp_principal_t *who = call->who;
    return seg->orphan && strcmp(d->medium, "dfs") == 0 && seg->size == d->size &&
           seg->owner_tag == (who != NULL ? who->tag : 0) &&
           seg->owner_tenant == (who != NULL ? who->tenant_id : 0) &&
           seg->dedicated == (tenant >= 0) && (!seg->dedicated || seg->tenant == tenant);
}

kvp_status_t kvp_handle_mount(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__MountRequest *req = (Kvpool__MountRequest *)req_msg;
    Kvpool__MountResponse resp = KVPOOL__MOUNT_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 400);
    const Kvpool__SegmentDesc *d = req->segment;
    if (!desc_valid(d))
        return kvp_reply_fail(
            &r, KVP_ERR_INVALID_ARG,
            "mount needs a size of %u bytes to 1 PiB, a name of 1..255 bytes, medium "
            "\"dram\", \"ssd\" or \"dfs\", a host id, a tcp endpoint host:port and an empty or "
            "host:port "
            "rdma endpoint",
            KVP_SEGMENT_MIN_SIZE);
    char shown[4 * 255 + 8];
    const char *bad_name = segment_name_refused(d->name, shown, sizeof(shown));
    if (bad_name != NULL) {
        st->stats.refused_name_segment++;
        KVP_LOG_WARN_LIMITED("mount of segment \"%s\" by principal %s refused: its name %s", shown,
                             call->who != NULL ? call->who->name : "(no ACL)", bad_name);
        return kvp_reply_fail(&r, KVP_ERR_INVALID_ARG,
                              "segment name \"%.400s\" %s: a segment's name is printable text "
                              "with no space at either end",
                              shown, bad_name);
    }
    /* a dedicated segment: the caller's own tenant (an admin's: any); tenants need an ACL */
    int32_t tenant;
    kvp_status_t status = mount_tenant(&r, req->tenant, &tenant);
    if (status != KVP_OK)
        return kvp_reply_fail(&r, status, NULL);
    const kvp_segment_t *same = kvp_segment_table_find_name(&st->segments, d->name);
    if (same != NULL && !own_orphan(call, same, d, tenant))
        return kvp_reply_fail(&r, KVP_ERR_EXISTS, "a segment named %s is already mounted", d->name);
    status = mount_claims(&r, d);
    if (status != KVP_OK)
        return kvp_reply_fail(&r, status, NULL);
    bool asked;
    status = mount_proven(&r, req, &asked);
    if (status != KVP_OK)
        return kvp_reply_fail(&r, status, NULL);
    if (asked)
        return KVP_OK; /* called again once its endpoint answered (or did not) */
    kvp_segment_t *seg = segment_new(call, req);
    if (seg == NULL)
        return kvp_reply_fail(&r, KVP_ERR_NOMEM, NULL);
    st->segments.records_dirty = true; /* a held SegRecord of the owner's is answered */
    status = segment_place(&r, seg);
    if (status != KVP_OK)
        return kvp_reply_fail(&r, status, NULL);
    uint8_t key[KVP_GRANT_KEY_LEN];
    if (st->grants_on) { /* a key of its own, drawn now: its owner's data server checks
                            every request's grant with it */
        if (!kvp_grant_random(key, sizeof(key)) ||
            kvp_grant_mac_create(key, &seg->grant_mac) != KVP_OK) {
            kvp_segment_table_remove(&st->segments, seg);
            kvp_segment_destroy(seg);
            return kvp_reply_fail(&r, KVP_ERR_INTERNAL, "cannot draw segment %s's grant key",
                                  d->name);
        }
        resp.grant_key.data = key;
        resp.grant_key.len = sizeof(key);
        resp.grant_epoch = st->grant_epoch;
    }
    resp.segment_id = seg->id;
    seg->dedicated = tenant >= 0;
    seg->tenant = tenant >= 0 ? (uint16_t)tenant : 0;
    st->tenants.t[seg->tenant].dedicated += seg->dedicated;
    limbo_attach(st, seg);
    if (seg->dfs)
        dfs_take_over(st, seg);
    warn_loopback(st, seg);
    KVP_LOG_INFO("mounted segment %s (id %#llx, %llu bytes, endpoint %s%s%s)", seg->name,
                 (unsigned long long)seg->id, (unsigned long long)seg->size, seg->tcp_endpoint,
                 seg->dedicated ? ", dedicated to tenant " : "", seg->dedicated ? req->tenant : "");
    return kvp_reply_send(&r);
}

typedef struct drop_ctx {
    kvp_master_state_t *st;
    uint64_t segment_id;
    uint64_t dropped;
    kvp_limbo_t *limbo; /* where its COMPLETE objects are kept (a segment dropped for silence) */
    uint64_t limbo_failed;
    uint64_t read_until_ms; /* the latest lease on an object read there (kvp_now_ms; 0: none) */
} drop_ctx_t;

/*
 * Drop the replica on ctx->segment_id; remove the object when none is left.
 * A PENDING object keeps its replica positions (the dropped one becomes a
 * tombstone, segment id 0): PutEnd's written_mask refers to them by index.
 */
static bool drop_replica_cb(kvp_object_t *obj, void *arg)
{
    drop_ctx_t *ctx = arg;
    unsigned live = 0;
    bool hit = false;
    for (unsigned i = 0; i < obj->n_replicas; i++) {
        if (obj->replicas[i].segment_id == ctx->segment_id)
            hit = true;
        else if (obj->replicas[i].segment_id != 0)
            live++;
    }
    if (!hit)
        return false;
    if (kvp_leased(ctx->st, obj)) /* read now, maybe from this segment's memory (shm) */
        ctx->read_until_ms =
            KVP_MAX(ctx->read_until_ms, ctx->st->now_ms + kvp_lease_left_ms(ctx->st, obj));
    const kvp_group_t *g = kvp_group_get(&ctx->st->groups, kvp_object_group(obj));
    if (ctx->limbo != NULL && obj->state == KVP_OBJ_COMPLETE)
        for (unsigned i = 0; i < obj->n_replicas; i++)
            if (obj->replicas[i].segment_id == ctx->segment_id &&
                !kvp_limbo_add(ctx->limbo, kvp_object_key(obj), obj->key_len, obj->version,
                               obj->replicas[i].offset, obj->size, obj->crc32c, obj->pin,
                               g != NULL ? g->name : NULL, g != NULL ? g->name_len : 0))
                ctx->limbo_failed++;
    if (live == 0) {
        ctx->dropped++;
        kvp_state_object_gone(ctx->st, obj); /* KV events: its last replica is lost */
        /* over tcp its readers fail (the owner refuses the old segment id); over shm they may
         * still copy from the owner's memory (kvp_segment_table_cut_lease) */
        kvp_lease_forget(ctx->st, obj);
        return true; /* its only extent was on the segment being destroyed */
    }
    kvp_index_charge(&ctx->st->index, obj, -1); /* one replica less: charged again below */
    if (obj->state == KVP_OBJ_PENDING) {
        for (unsigned i = 0; i < obj->n_replicas; i++)
            if (obj->replicas[i].segment_id == ctx->segment_id)
                obj->replicas[i].segment_id = 0;
        kvp_index_charge(&ctx->st->index, obj, +1);
        return false;
    }
    unsigned before =
        ctx->st->events ? kvp_state_media(ctx->st, obj->replicas, obj->n_replicas) : 0;
    unsigned w = 0;
    for (unsigned i = 0; i < obj->n_replicas; i++) {
        if (obj->replicas[i].segment_id == ctx->segment_id)
            continue;
        obj->replicas[w++] = obj->replicas[i];
    }
    if (ctx->st->events != NULL)
        kvp_state_media_event(ctx->st, obj, before, kvp_state_media(ctx->st, obj->replicas, w));
    /* Shift the key down behind the shortened replica array. */
    memmove((char *)&obj->replicas[w], kvp_object_key(obj), kvp_object_tail_len(obj));
    obj->n_replicas = (uint8_t)w;
    kvp_index_charge(&ctx->st->index, obj, +1);
    return false;
}

/* Who held seg, for its limbo. */
static kvp_limbo_owner_t limbo_owner(const kvp_segment_t *seg)
{
    return (kvp_limbo_owner_t){.tag = seg->owner_tag,
                               .tenant = seg->owner_tenant,
                               .dedicated = seg->dedicated,
                               .dedicated_to = seg->dedicated ? seg->tenant : 0};
}

/*
 * silent: its owner's connection closed or went silent (not an Unmount): a DRAM segment
 * whose owner keeps a record leaves its COMPLETE objects in limbo for --segment-grace,
 * taken back if the same segment mounts again (meta/limbo.c).
 */
static uint64_t unmount_segment(kvp_master_state_t *st, kvp_segment_t *seg, bool silent)
{
    if (silent && seg->dfs && !seg->orphan && !seg->draining && st->config.segment_grace_ms > 0) {
        /* a DFS segment: its shard file is in the shared directory, its objects readable
         * there without an owner. Kept for --segment-grace, ownerless: no new replicas;
         * tasks sent to the dead owner are sent again to the next (its shard's next mount
         * takes it over: dfs_take_over) */
        seg->orphan = true;
        seg->orphan_until_ms = st->now_ms + st->config.segment_grace_ms;
        seg->owner_conn_id = 0;
        for (kvp_ssd_task_t *t = st->tasks; t != NULL; t = t->next)
            if (t->segment_id == seg->id)
                t->sent = false;
        st->stats.dfs_orphaned++;
        KVP_LOG_WARN("DFS segment %s (id %#llx): its owner went silent; its %llu objects stay "
                     "readable in the directory for %u s (--segment-grace) until a mount of its "
                     "shard file takes it over",
                     seg->name, (unsigned long long)seg->id, (unsigned long long)seg->objects,
                     st->config.segment_grace_ms / 1000);
        return 0;
    }
    drop_ctx_t ctx = {.st = st, .segment_id = seg->id};
    kvp_limbo_owner_t owner = limbo_owner(seg);
    kvp_limbo_t *again = NULL; /* dropped again during the offer it came back from a limbo with */
    /* (an empty segment's too: its offer is checked against it, meta/limbo.c) */
    if (silent && !seg->ssd && seg->record && st->config.segment_grace_ms > 0 && !seg->draining) {
        if (seg->adopting && seg->limbo != NULL) {
            /* that limbo is still the whole view (nothing new lands while it adopts; what was
             * removed since, the tombstones and the index refuse): kept again, as it is */
            again = seg->limbo;
            seg->limbo = NULL;
            again->until_ms = st->now_ms + st->config.segment_grace_ms;
        } else {
            ctx.limbo =
                kvp_limbo_new(seg->name, seg->host_id, seg->shm_path, seg->tcp_endpoint,
                              seg->rdma_endpoint, &owner, st->now_ms + st->config.segment_grace_ms);
        }
    }
    kvp_tier_segment_gone(st, seg->id); /* tasks of its owner, copies to or from it */
    if (seg->objects > 0)
        kvp_index_foreach_remove(&st->index, drop_replica_cb, &ctx);
    /* its memory may come back under the same name: empty to us, read by them still */
    if (ctx.read_until_ms > st->now_ms && !seg->ssd)
        kvp_segment_table_cut_lease(&st->segments, seg->name, ctx.read_until_ms, st->now_ms);
    KVP_LOG_INFO("unmounted segment %s (id %#llx): %llu objects lost their last replica", seg->name,
                 (unsigned long long)seg->id, (unsigned long long)ctx.dropped);
    if (again != NULL) {
        again->next = st->limbo;
        st->limbo = again;
    } else if (ctx.limbo != NULL) {
        /* an offer under way (after a master restart): the index holds only what was adopted
         * so far, not the segment; the next offer is checked as after a restart, and this
         * only adds what it lacks (meta/limbo.c) */
        ctx.limbo->partial = ctx.limbo_failed > 0 || seg->adopting;
        if (ctx.limbo->n > 0)
            KVP_LOG_INFO("segment %s: %zu objects it held kept for %u s, to be taken back if it "
                         "mounts again%s",
                         seg->name, ctx.limbo->n, st->config.segment_grace_ms / 1000,
                         ctx.limbo_failed ? " (some not kept: out of memory)" : "");
        ctx.limbo->next = st->limbo;
        st->limbo = ctx.limbo;
    } else {
        kvp_limbo_free(ctx.limbo);
    }
    if (seg->dedicated && seg->tenant < st->tenants.n)
        st->tenants.t[seg->tenant].dedicated--;
    kvp_drain_jobs_segment_gone(st, seg, ctx.dropped); /* a drain job's segment ends */
    kvp_segment_table_remove(&st->segments, seg);
    return ctx.dropped;
}

kvp_status_t kvp_handle_unmount(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__UnmountRequest *req = (Kvpool__UnmountRequest *)req_msg;
    Kvpool__UnmountResponse resp = KVPOOL__UNMOUNT_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    kvp_segment_t *seg = kvp_segment_table_get(&st->segments, req->segment_id);
    if (seg == NULL)
        return kvp_reply_fail(&r, KVP_ERR_SEGMENT_GONE, NULL);
    if (seg->owner_conn_id != call->conn_id)
        return kvp_reply_fail(&r, KVP_ERR_NOT_OWNER, NULL);
    resp.objects_dropped = unmount_segment(st, seg, false);
    return kvp_reply_send(&r);
}

/*
 * Does a Heartbeat hand the caller seg's descriptor (every client gets the segments it
 * may transfer with, to attach them before its first transfer)? Not a segment dedicated
 * to another tenant (it never holds the caller's objects), and for a principal that
 * neither reads nor writes (a segment owner) only its own: what its drain and tasks reach
 * comes in their answers. Without an ACL, to admins and shm workers: every segment.
 */
static bool beat_shows(const kvp_call_t *call, const kvp_segment_t *seg)
{
    const kvp_principal_t *who = call->who;
    if (who == NULL || (who->roles & (KVP_ROLE_ADMIN | KVP_ROLE_SHM)) ||
        kvp_call_owns_segment(call, seg, false))
        return true;
    if (!(who->roles & (KVP_ROLE_READ | KVP_ROLE_WRITE)))
        return false;
    return !call->st->tenants_on || !seg->dedicated || seg->tenant == who->tenant_id;
}

kvp_status_t kvp_handle_heartbeat(kvp_call_t *call, ProtobufCMessage *req_msg)
{
    kvp_master_state_t *st = call->st;
    Kvpool__HeartbeatRequest *req = (Kvpool__HeartbeatRequest *)req_msg;
    Kvpool__HeartbeatResponse resp = KVPOOL__HEARTBEAT_RESPONSE__INIT;
    kvp_reply_t r;
    kvp_reply_init(&r, call, &resp.base, 0);
    if (req->n_segment_ids > 1024)
        return kvp_reply_fail(&r, KVP_ERR_TOO_MANY, NULL);
    uint64_t drain[16];
    size_t n_drain = 0;
    for (size_t i = 0; i < req->n_segment_ids; i++) {
        kvp_segment_t *seg = kvp_segment_table_get(&st->segments, req->segment_ids[i]);
        if (seg == NULL || seg->owner_conn_id != call->conn_id)
            resp.remount = true;
        else if (seg->draining && n_drain < KVP_ARRAY_SIZE(drain))
            drain[n_drain++] = seg->id;
    }
    resp.drain_segment_ids = drain;
    resp.n_drain_segment_ids = n_drain;
    /* copy and move tasks waiting for this owner (rpc/task_calls.c) */
    Kvpool__TaskOffer offers[64], *offp[64];
    resp.n_tasks = kvp_task_offers(st, call->conn_id, offers, KVP_ARRAY_SIZE(offers));
    for (size_t i = 0; i < resp.n_tasks; i++)
        offp[i] = &offers[i];
    resp.tasks = offp;
    /* the segment table changed since the client last looked: all of it (once per
     * mount or unmount per client, not per beat), each descriptor as any other answer
     * gives it to the caller, its connection key included (data grants on): a client takes
     * a descriptor that differs from the one it knows as a new one, and one without the
     * key would have it open data connections that prove no principal (refused) */
    if (req->segments_version != st->segments.version) {
        bool ok = true;
        for (uint32_t i = 0; ok && i < st->segments.n_slots; i++) {
            const kvp_segment_t *seg = st->segments.slots[i];
            if (seg != NULL && beat_shows(call, seg))
                ok = kvp_seg_set_add(&r.segs, seg, NULL);
        }
        if (ok && kvp_reply_segments(&r))
            resp.segments_version = st->segments.version;
        else /* out of memory: the next beat asks again */
            resp.n_segments = 0;
    }
    return kvp_reply_send(&r);
}

void kvp_segment_conn_closed(kvp_master_state_t *st, uint64_t conn_id)
{
    for (uint32_t i = 0; i < st->segments.n_slots; i++) {
        kvp_segment_t *seg = st->segments.slots[i];
        if (seg != NULL && seg->owner_conn_id == conn_id && !seg->orphan)
            unmount_segment(st, seg, true);
    }
}

void kvp_segment_limbo_expire(kvp_master_state_t *st)
{
    for (uint32_t i = 0; i < st->segments.n_slots; i++) {
        kvp_segment_t *seg = st->segments.slots[i];
        if (seg != NULL && seg->orphan && seg->orphan_until_ms <= st->now_ms) {
            KVP_LOG_WARN("DFS segment %s: no owner took its shard file over within "
                         "--segment-grace: unmounted",
                         seg->name);
            unmount_segment(st, seg, false);
        }
    }
    for (kvp_limbo_t **pp = &st->limbo; *pp != NULL;) {
        kvp_limbo_t *l = *pp;
        if (l->until_ms > st->now_ms) {
            pp = &l->next;
            continue;
        }
        if (l->n > 0)
            KVP_LOG_WARN("segment %s did not mount again within --segment-grace: the %zu "
                         "objects it held when dropped are gone",
                         l->name, l->n);
        st->stats.limbo_expired += l->n;
        *pp = l->next;
        kvp_limbo_free(l);
    }
}

/* The shard a DFS segment's name names: "/dfs/<directory id>/<shard file>" (NULL: none). */
static const char *dfs_shard(const char *name)
{
    return strstr(name, "/dfs/");
}

typedef struct take_ctx {
    kvp_master_state_t *st;
    kvp_segment_t *from, *to;
} take_ctx_t;

/* An object's replica on the ownerless segment moves to the new one (the same extent of the
 * same file); when its extent cannot be reserved there, the replica is dropped. */
static bool take_cb(kvp_object_t *obj, void *arg)
{
    take_ctx_t *c = arg;
    for (unsigned i = 0; i < obj->n_replicas; i++) {
        kvp_replica_t *rep = &obj->replicas[i];
        if (rep->segment_id != c->from->id)
            continue;
        uint32_t h;
        if (kvp_offset_alloc_reserve(c->to->alloc, rep->offset, obj->size, &h) != KVP_OK) {
            drop_ctx_t d = {.st = c->st, .segment_id = c->from->id};
            return drop_replica_cb(obj, &d);
        }
        kvp_index_charge(&c->st->index, obj, -1);
        rep->segment_id = c->to->id;
        rep->handle = h;
        kvp_index_charge(&c->st->index, obj, +1);
        c->to->objects++;
        c->st->stats.dfs_taken_over++;
    }
    return false;
}

/* A mount of a DFS segment: an ownerless DFS segment of the same shard file (directory and
 * file, the same size; the same principal, tenant and dedication) is taken over: its objects'
 * replicas and its queued tasks move to the new segment, the old one goes. The new owner's
 * offer then finds them there already (ha/rebuild.c). */
static void dfs_take_over(kvp_master_state_t *st, kvp_segment_t *seg)
{
    const char *shard = dfs_shard(seg->name);
    kvp_limbo_owner_t owner = limbo_owner(seg), prev;
    for (uint32_t i = 0; shard != NULL && i < st->segments.n_slots; i++) {
        kvp_segment_t *o = st->segments.slots[i];
        if (o == NULL || o == seg || !o->orphan || o->size != seg->size ||
            dfs_shard(o->name) == NULL || strcmp(dfs_shard(o->name), shard) != 0)
            continue;
        prev = limbo_owner(o);
        if (prev.tag != owner.tag || prev.tenant != owner.tenant ||
            prev.dedicated != owner.dedicated || prev.dedicated_to != owner.dedicated_to)
            continue;
        take_ctx_t c = {.st = st, .from = o, .to = seg};
        uint64_t before = st->stats.dfs_taken_over;
        if (o->objects > 0)
            kvp_index_foreach_remove(&st->index, take_cb, &c);
        for (kvp_ssd_task_t *t = st->tasks; t != NULL; t = t->next) {
            if (t->segment_id == o->id)
                t->segment_id = seg->id;
            if (t->ssd.segment_id == o->id)
                t->ssd.segment_id = seg->id;
        }
        KVP_LOG_INFO("DFS segment %s takes over the shard of %s: %llu objects handed over",
                     seg->name, o->name, (unsigned long long)(st->stats.dfs_taken_over - before));
        kvp_segment_table_remove(&st->segments, o);
        return;
    }
}

/* A mount: the segment's limbo, if this is the same segment (name, host, memory, and the
 * same principal, tenant and dedication) and it offers what it holds; any other limbo of
 * that name the same principal held goes (its memory is not there). Another principal's
 * stays (mount_claims refused such a mount already). */
static void limbo_attach(kvp_master_state_t *st, kvp_segment_t *seg)
{
    kvp_limbo_owner_t owner = limbo_owner(seg);
    for (kvp_limbo_t **pp = &st->limbo; *pp != NULL;) {
        kvp_limbo_t *l = *pp;
        if (strcmp(l->name, seg->name) != 0 || !kvp_limbo_held_by(l, seg->owner_tag)) {
            pp = &l->next;
            continue;
        }
        *pp = l->next;
        l->next = NULL;
        if (seg->adopting && !seg->ssd &&
            kvp_limbo_is(l, seg->name, seg->host_id, seg->shm_path, &owner)) {
            kvp_limbo_free(seg->limbo);
            seg->limbo = l;
        } else {
            if (l->n > 0)
                KVP_LOG_WARN("segment %s mounted again as another segment (restarted, or other "
                             "memory): the %zu objects it held when dropped are gone",
                             l->name, l->n);
            st->stats.limbo_expired += l->n;
            kvp_limbo_free(l);
        }
    }
}
