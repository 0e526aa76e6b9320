/*
 * http_views.h - the master's HTTP endpoints: /metrics, /health, /api/v1/stat,
 * /api/v1/segments, /api/v1/keys, /api/v1/tenant_quotas (GET, PUT, DELETE: tenant_quotas.c),
 * /get_all_segments, /query_segment (see http_views.c;
 * every endpoint is described in docs/operations.md).
 *
 * Thread: requests arrive on the HTTP server's threads (common/http.h), which
 * never touch the master's state. Each request is queued for the loop and
 * signalled on an eventfd; the loop answers everything queued when the fd is
 * readable (kvp_master_http_serve), with a bounded amount of work per request
 * (O(segments + methods), a key listing is one page of at most 1000 keys and
 * 65536 hash buckets), and the HTTP thread sends the reply. A request the loop
 * has not taken within KVP_MASTER_HTTP_WAIT_MS is answered 503 by the HTTP
 * thread.
 */
#ifndef KVP_MASTER_OBS_HTTP_H
#define KVP_MASTER_OBS_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "master/obs/events.h"
#include "common/tls.h"
#include "common/acl.h"
#include "master/core/state.h"
#include "master/ha/quota_store.h"

#define KVP_MASTER_HTTP_WAIT_MS 5000

typedef struct kvp_master_http kvp_master_http_t;

/* Call an RPC handler as a client would (no connection, no principal), as
 * kvp_dispatch_handle does: the JSON views (Stat, List) show what the CLI shows. */
typedef kvp_status_t kvp_master_call_cb_t(kvp_master_state_t *st, uint16_t method,
                                          const uint8_t *body, size_t body_len, uint8_t **resp_p,
                                          size_t *resp_len_p, char *errmsg, size_t errmsg_len);

/* What the loop knows beyond the state, for the views: filled by the server (obs/ reads
 * the method table and calls the handlers only through it). */
typedef struct kvp_master_view {
    bool serving;       /* standalone, or the leader sure of its lease */
    bool ha;            /* elected through etcd */
    const char *self;   /* this master's address ("" standalone) */
    const char *reason; /* why it does not serve (a standby: the leader's address) */
    kvp_events_t *events;
    const kvp_acl_t *acl;       /* --acl-file: the views beyond /metrics and /health (and the
                                   per-tenant series of /metrics) need an admin principal's
                                   bearer token or client certificate; NULL: open to whoever
                                   reaches them */
    kvp_quota_store_t *quotas;  /* HA: where tenant quota policies are saved; NULL: standalone */
    kvp_tls_t *tls;             /* the control port's TLS (its CAs and CRL verify the HTTPS door's
                                   client certificates; reloaded with them on SIGHUP) */
    kvp_master_call_cb_t *call; /* the JSON views' RPCs (dispatch.c's path) */
    /* bytes of record changes DRAM owners have not received (server.c's streams; asked only
     * by /metrics: a walk of the segments, a system call per stream) */
    uint64_t (*record_unsent)(const kvp_segment_table_t *segments);
    const char *const *method_names; /* [n_methods], by method id (NULL: no such method):
                                        the method table's, for the per-method metrics */
    size_t n_methods;
} kvp_master_view_t;

/* Listen on "HOST:PORT"; *port_p gets the bound port. KVP_ERR_INVALID_ARG or
 * KVP_ERR_SYSTEM as kvp_http_start. cert/key: HTTPS (TLS 1.3) with the master's own
 * certificate; NULL: plain HTTP. ca (HTTPS): clients are asked for a certificate of it. */
kvp_status_t kvp_master_http_start(const char *hostport, const char *cert, const char *key,
                                   const char *ca, kvp_master_http_t **h_p, uint16_t *port_p);
/* The eventfd the loop polls (readable: requests wait). */
int kvp_master_http_fd(const kvp_master_http_t *h);
/* On the loop: answer every queued request. */
void kvp_master_http_serve(kvp_master_http_t *h, kvp_master_state_t *st,
                           const kvp_master_view_t *view);
/* Answer what waits with 503, stop the server, free. NULL is fine. */
void kvp_master_http_stop(kvp_master_http_t *h);

/* The Prometheus text exposition of the master (prometheus.c). tenant_names: with the
 * per-tenant series, which name the ACL's tenants (an admin's scrape, or --metrics-tenants
 * on); false: every other series, as before. */
struct kvp_http_reply;
void kvp_master_metrics_render(struct kvp_http_reply *r, const kvp_master_state_t *st,
                               const kvp_master_view_t *view, bool tenant_names);

/* /api/v1/tenant_quotas (tenant_quotas.c), for a caller admitted as an admin, on the loop:
 * method "GET" (or "HEAD"), "PUT" or "DELETE"; tenant: ?tenant_id= (NULL: absent), decoded,
 * tenant_len bytes (a NUL in them refuses it); body: a
 * PUT's (body_len bytes). Answers in Mooncake's JSON. *save_p: a policy changed and
 * view->quotas has it staged: the HTTP thread saves it to etcd before it replies. who: the
 * admin's name, for the audit log line of a change. */
void kvp_tenant_quotas_render(struct kvp_http_reply *r, kvp_master_state_t *st,
                              const kvp_master_view_t *view, const char *method, const char *tenant,
                              size_t tenant_len, const char *body, size_t body_len, const char *who,
                              bool *save_p);
/* The reply of a change that etcd did not take (err: why): 500, PERSISTENT_FAIL. */
void kvp_tenant_quotas_unsaved(struct kvp_http_reply *r, const char *err);

/* Mooncake's drain job API (drain_views.c), for a caller admitted as an admin, on the loop:
 * CREATE (POST /api/v1/drain_jobs, its JSON body), QUERY and CANCEL (arg: ?job_id=),
 * SEGMENT_STATUS (arg: ?segment=; NULL: absent). Answers in Mooncake's JSON. */
typedef enum kvp_drain_view {
    KVP_DRAIN_VIEW_CREATE,
    KVP_DRAIN_VIEW_QUERY,
    KVP_DRAIN_VIEW_CANCEL,
    KVP_DRAIN_VIEW_SEGMENT_STATUS,
} kvp_drain_view_t;
void kvp_drain_views_render(struct kvp_http_reply *r, kvp_master_state_t *st,
                            const kvp_master_view_t *view, kvp_drain_view_t kind, const char *arg,
                            const char *body, size_t body_len);

#endif
