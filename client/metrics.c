/*
 * metrics.c - kvp_metrics_snapshot (the client's counters as one plain struct) and their
 * Prometheus text exposition.
 *
 * Design: the counters live where the work happens and are bumped there with relaxed
 * atomics, never under a lock: the transfer engine's (client/transfer/engine.c, one add
 * per transport and direction per batch), each data server's (segment/data_server.c, one
 * add per request, whatever its backend), the SSD file's I/O (ssd/ssd_io.c, one add per
 * call). A snapshot reads them one by one into a struct on the stack and copies out as
 * much as the caller's struct holds (its `size`), so an application built against an
 * older, shorter kvp_metrics_t keeps working.
 *
 * The exposition lives in the library (not in the CLI) so that every embedder can serve
 * it: `kvpool serve --http-listen`, an inference worker with its own HTTP server, the
 * Python module. It formats a snapshot only (no client, no I/O, no allocation), like
 * snprintf.
 *
 * Thread: any; nothing here blocks.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "client/api.h"
#include "client/client_priv.h"
#include "client/control/session.h"
#include "client/te_registry.h"
#include "common/rpc.h"

static const char *const tp_names[KVP_METRICS_TP_COUNT] = {
    [KVP_METRICS_TP_TCP] = "tcp", [KVP_METRICS_TP_SHM] = "shm", [KVP_METRICS_TP_RDMA] = "rdma",
    [KVP_METRICS_TP_SSD] = "ssd", [KVP_METRICS_TP_DFS] = "dfs",
};

const char *kvp_metrics_transport_name(unsigned tp)
{
    return tp < KVP_METRICS_TP_COUNT ? tp_names[tp] : NULL;
}

/* master_rpc[]'s slots: the wire's method numbers (common/rpc.h, docs/protocol.md) */
static const char *const rpc_names[KVP_METRICS_RPC_MAX] = {
    [KVP_RPC_PING] = "ping",
    [KVP_RPC_MOUNT] = "mount",
    [KVP_RPC_UNMOUNT] = "unmount",
    [KVP_RPC_PUT_START] = "put_start",
    [KVP_RPC_PUT_END] = "put_end",
    [KVP_RPC_PUT_REVOKE] = "put_revoke",
    [KVP_RPC_GET_REPLICA_LIST] = "get_replica_list",
    [KVP_RPC_EXIST] = "exist",
    [KVP_RPC_REMOVE] = "remove",
    [KVP_RPC_GET_SIZE] = "get_size",
    [KVP_RPC_STAT] = "stat",
    [KVP_RPC_HEARTBEAT] = "heartbeat",
    [KVP_RPC_LIST] = "list",
    [KVP_RPC_REMOVE_BY_REGEX] = "remove_by_regex",
    [KVP_RPC_DRAIN] = "drain",
    [KVP_RPC_MOVE_START] = "move_start",
    [KVP_RPC_MOVE_END] = "move_end",
    [KVP_RPC_LEASE_RELEASE] = "lease_release",
    [KVP_RPC_SSD_TASKS] = "ssd_tasks",
    [KVP_RPC_ADOPT] = "adopt",
    [KVP_RPC_SEG_RECORD] = "seg_record",
    [KVP_RPC_AUTH] = "auth",
    [KVP_RPC_TASK_CREATE] = "task_create",
    [KVP_RPC_TASK_QUERY] = "task_query",
    [KVP_RPC_TASK_START] = "task_start",
    [KVP_RPC_TASK_END] = "task_end",
    [KVP_RPC_REPLICA_CLEAR] = "replica_clear",
    [KVP_RPC_PUT_COMMIT] = "put_commit",
};
_Static_assert(KVP_RPC_METHOD_MAX < KVP_METRICS_RPC_MAX, "master_rpc[] has a slot per method");

const char *kvp_metrics_rpc_name(unsigned i)
{
    return i < KVP_METRICS_RPC_MAX ? rpc_names[i] : NULL;
}

static void load_count(kvp_metrics_count_t *out, const kvp_count_stats_t *c)
{
    out->ops = atomic_load_explicit(&c->ops, memory_order_relaxed);
    out->bytes = atomic_load_explicit(&c->bytes, memory_order_relaxed);
}

/* The data servers' closings by reason (conn_server.h), summed with the SSD owner's. */
static void add_admission(kvp_metrics_t *m, const kvp_conn_refusals_t *a)
{
    m->refused_conn_limit += a->conn_limit;
    m->refused_peer_limit += a->peer_limit;
    m->refused_unauth_limit += a->unauth_limit;
    m->refused_handshake_timeout += a->handshake_timeout;
    m->refused_frame_timeout += a->frame_timeout;
    m->refused_resources += a->resources;
}

kvp_status_t kvp_metrics_snapshot(kvp_client_t *c, kvp_metrics_t *out)
{
    if (c == NULL || out == NULL || out->size < offsetof(kvp_metrics_t, client)) {
        kvp_api_enter();
        kvp_api_fail("metrics: %s", c == NULL     ? "no client"
                                    : out == NULL ? "no kvp_metrics_t to fill"
                                                  : "kvp_metrics_t.size is not set (set it "
                                                    "to sizeof(kvp_metrics_t))");
        return (kvp_status_t)kvp_api_leave(KVP_ERR_INVALID_ARG, "metrics");
    }
    kvp_metrics_t m;
    memset(&m, 0, sizeof(m));
    m.rdma_nic_access_errors = -1;
    m.size = out->size;
    m.version = KVP_METRICS_VERSION;

    const kvp_xfer_stats_t *xs = &c->xfer.stats;
    for (int t = 0; t < KVP_METRICS_TP_COUNT; t++) {
        load_count(&m.client[t].put, &xs->tp[t][0]);
        load_count(&m.client[t].get, &xs->tp[t][1]);
    }
    m.put_errors = atomic_load_explicit(&xs->errors[0], memory_order_relaxed);
    m.get_errors = atomic_load_explicit(&xs->errors[1], memory_order_relaxed);
    load_count(&m.staged[0], &xs->staged[0]);
    load_count(&m.staged[1], &xs->staged[1]);
    for (int d = 0; d < 2; d++) {
        kvp_metrics_count_t r;
        load_count(&r, &xs->runs[d]);
        m.transfer_runs[d] = r.ops;
        m.transfer_ns[d] = r.bytes;
    }
    kvp_mconn_t *mc = c->session != NULL ? kvp_session_mconn(c->session) : NULL;
    for (unsigned i = 0; mc != NULL && i < KVP_METRICS_RPC_MAX; i++) {
        kvp_metrics_rpc_t *r = &m.master_rpc[i];
        kvp_mconn_rpc_stats(mc, i, &r->calls, &r->failed, &r->wait_ns);
    }

    const kvp_served_stats_t *sv = c->seg != NULL ? kvp_segment_served(c->seg) : NULL;
    if (sv != NULL) {
        load_count(&m.served[KVP_METRICS_TP_TCP].put, &sv->dir[0]);
        load_count(&m.served[KVP_METRICS_TP_TCP].get, &sv->dir[1]);
    }
    if (c->seg != NULL) {
        kvp_conn_refusals_t adm = {0};
        kvp_segment_admission(c->seg, &adm);
        add_admission(&m, &adm);
        m.refused_protected += kvp_segment_refused(c->seg);
        m.refused_grant += kvp_segment_grants_refused(c->seg);
        m.refused_shm += kvp_segment_shm_refused(c->seg);
        m.refused_rdma += atomic_load_explicit(&c->xfer.serve_refused, memory_order_relaxed);
        m.rdma_access_errors +=
            atomic_load_explicit(&c->xfer.serve_access_errors, memory_order_relaxed);
        m.rdma_nic_access_errors =
            atomic_load_explicit(&c->xfer.nic_access_errors, memory_order_relaxed);
    }
    if (c->seg != NULL) {
        snprintf(m.dram_segment, sizeof(m.dram_segment), "%s", kvp_segment_name(c->seg));
        m.dram_mounted = kvp_client_segment_mounted(c);
        m.dram_draining = kvp_segment_state(c->seg) == KVP_SEG_DRAINING;
        m.dram_capacity = m.dram_mounted ? kvp_segment_size(c->seg) : 0;
    }
    if (c->ssd != NULL) {
        kvp_conn_refusals_t adm = {0};
        kvp_ssd_owner_metrics(c->ssd, &m);
        kvp_ssd_owner_admission(c->ssd, &adm);
        add_admission(&m, &adm);
    }
    if (c->dfs != NULL) {
        kvp_conn_refusals_t adm = {0};
        kvp_ssd_owner_metrics(c->dfs, &m);
        kvp_ssd_owner_admission(c->dfs, &adm);
        add_admission(&m, &adm);
    }
    kvp_te_counters_t te;
    kvp_te_registry_sum(&te);
    m.te_refused_range = te.refused_range;
    m.te_refused_protected = te.refused_protected;
    m.te_refused_user = te.refused_user;
    m.te_refused_auth = te.refused_auth;
    m.te_refused_role = te.refused_role;
    m.te_refused_tenant = te.refused_tenant;

    size_t n = out->size < sizeof(m) ? out->size : sizeof(m);
    memcpy(out, &m, n);
    return KVP_OK;
}

/* ---- Prometheus text format ---- */

/* An snprintf-like writer: counts every byte, stores what fits (and a NUL). */
typedef struct out {
    char *buf;
    size_t cap, len;
} out_t;

static void put_raw(out_t *o, const char *s, size_t n)
{
    if (o->len < o->cap) {
        size_t room = o->cap - o->len - 1; /* keep one byte for the NUL */
        size_t k = n < room ? n : room;
        memcpy(o->buf + o->len, s, k);
        o->buf[o->len + k] = '\0';
    }
    o->len += n;
}

static void put_str(out_t *o, const char *s)
{
    put_raw(o, s, strlen(s));
}

static void put_fmt(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put_fmt(out_t *o, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        put_raw(o, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* A label value, escaped as the format wants (\\, \", \n). */
static void put_label_value(out_t *o, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '\\')
            put_raw(o, "\\\\", 2);
        else if (*s == '"')
            put_raw(o, "\\\"", 2);
        else if (*s == '\n')
            put_raw(o, "\\n", 2);
        else
            put_raw(o, s, 1);
    }
}

/* In pieces, not through put_fmt: a help text may be longer than its buffer. */
static void family(out_t *o, const char *name, const char *type, const char *help)
{
    const char *parts[] = {"# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n"};
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        put_str(o, parts[i]);
}

static const char *const dir_names[2] = {"put", "get"};

/* How a row shows its field. */
enum { ROW_U64, ROW_NS_AS_S, ROW_I64_IF_SET };

/* One sample of the exposition: the row that has a help text starts its family (# HELP and
 * # TYPE lines); the rows below it without one add samples to the same family. */
typedef struct metric_row {
    const char *name;
    const char *type; /* NULL: a further sample of the family above */
    const char *help;
    const char *labels; /* the label pairs inside {}, or NULL */
    size_t off;         /* offsetof(kvp_metrics_t, the field) */
    int kind;           /* ROW_U64: a uint64_t (%llu); ROW_NS_AS_S: a uint64_t of ns shown in s
                         * (%.9f); ROW_I64_IF_SET: an int64_t (%lld), no sample when < 0 */
} metric_row_t;

#define M_FAMILY(name, help, labels, field, kind)                                                  \
    {                                                                                              \
        name, "counter", help, labels, offsetof(kvp_metrics_t, field), kind                        \
    }
#define M_SAMPLE(name, labels, field, kind)                                                        \
    {                                                                                              \
        name, NULL, NULL, labels, offsetof(kvp_metrics_t, field), kind                             \
    }

/* the client's errors and staged transfers */
static const metric_row_t client_rows[] = {
    M_FAMILY("kvpool_client_errors_total",
             "Transfers this client made that failed, and gets that failed their checksum.",
             "op=\"put\"", put_errors, ROW_U64),
    M_SAMPLE("kvpool_client_errors_total", "op=\"get\"", get_errors, ROW_U64),
    M_FAMILY("kvpool_client_staged_ops_total",
             "Transfers copied through staging buffers (host: memory the NIC has not "
             "registered; gpu: CUDA device memory).",
             "kind=\"host\"", staged[0].ops, ROW_U64),
    M_SAMPLE("kvpool_client_staged_ops_total", "kind=\"gpu\"", staged[1].ops, ROW_U64),
    M_FAMILY("kvpool_client_staged_bytes_total", "Bytes of the staged transfers.", "kind=\"host\"",
             staged[0].bytes, ROW_U64),
    M_SAMPLE("kvpool_client_staged_bytes_total", "kind=\"gpu\"", staged[1].bytes, ROW_U64),
};

/* where a batch's time goes, after its master calls: its transfers */
static const metric_row_t transfer_rows[] = {
    M_FAMILY("kvpool_client_transfer_batches_total",
             "Batches of transfers this client ran as initiator (a get's every round of "
             "replicas counts), by direction.",
             "op=\"put\"", transfer_runs[0], ROW_U64),
    M_SAMPLE("kvpool_client_transfer_batches_total", "op=\"get\"", transfer_runs[1], ROW_U64),
    M_FAMILY("kvpool_client_transfer_seconds_total",
             "Wall time of those batches, summed (threads add up).", "op=\"put\"", transfer_ns[0],
             ROW_NS_AS_S),
    M_SAMPLE("kvpool_client_transfer_seconds_total", "op=\"get\"", transfer_ns[1], ROW_NS_AS_S),
};

/* the data servers' refusals and the SSD segment file's I/O */
static const metric_row_t server_rows[] = {
    M_FAMILY("kvpool_connections_refused_total",
             "Connections this process's data servers refused, by reason (protected_mode: a "
             "peer of another host while no credentials are configured; grant: a data "
             "request without a valid grant from the master, whose connection was closed; shm: "
             "a request for a segment's memory from another user or without a valid MAP "
             "grant; rdma: a queue pair without a valid proof of a principal that may hold the "
             "segment, or past its cap; conn_limit, peer_limit, unauth_limit: past a cap of "
             "connections, in all, of a peer, unauthenticated; handshake_timeout, "
             "frame_timeout: too slow; resources: no fd or thread left).",
             "reason=\"protected_mode\"", refused_protected, ROW_U64),
    M_SAMPLE("kvpool_connections_refused_total", "reason=\"grant\"", refused_grant, ROW_U64),
    M_SAMPLE("kvpool_connections_refused_total", "reason=\"shm\"", refused_shm, ROW_U64),
    M_SAMPLE("kvpool_connections_refused_total", "reason=\"rdma\"", refused_rdma, ROW_U64),
    M_SAMPLE("kvpool_connections_refused_total", "reason=\"conn_limit\"", refused_conn_limit,
             ROW_U64),
    M_SAMPLE("kvpool_connections_refused_total", "reason=\"peer_limit\"", refused_peer_limit,
             ROW_U64),
    M_SAMPLE("kvpool_connections_refused_total", "reason=\"unauth_limit\"", refused_unauth_limit,
             ROW_U64),
    M_SAMPLE("kvpool_connections_refused_total", "reason=\"handshake_timeout\"",
             refused_handshake_timeout, ROW_U64),
    M_SAMPLE("kvpool_connections_refused_total", "reason=\"frame_timeout\"", refused_frame_timeout,
             ROW_U64),
    M_SAMPLE("kvpool_connections_refused_total", "reason=\"resources\"", refused_resources,
             ROW_U64),
    M_FAMILY("kvpool_rdma_remote_access_errors_total",
             "Remote access errors peers caused on this process's segment over rdma (a bad "
             "rkey, address or permission): source qp_event, the queue pairs' asynchronous "
             "events; source nic, the device's own counter, where it keeps one.",
             "source=\"qp_event\"", rdma_access_errors, ROW_U64),
    M_SAMPLE("kvpool_rdma_remote_access_errors_total", "source=\"nic\"", rdma_nic_access_errors,
             ROW_I64_IF_SET),
    M_FAMILY("kvpool_ssd_io_ops_total",
             "Reads and writes of this process's SSD segment file that completed.", "op=\"read\"",
             ssd_read.ops, ROW_U64),
    M_SAMPLE("kvpool_ssd_io_ops_total", "op=\"write\"", ssd_write.ops, ROW_U64),
    M_FAMILY("kvpool_ssd_io_bytes_total",
             "Bytes read from and written to this process's SSD segment file.", "op=\"read\"",
             ssd_read.bytes, ROW_U64),
    M_SAMPLE("kvpool_ssd_io_bytes_total", "op=\"write\"", ssd_write.bytes, ROW_U64),
    M_FAMILY("kvpool_te_refused_total",
             "Requests and connections this process's transfer engines (mooncake.engine) "
             "refused, by reason (range: a range the engine did not register; "
             "protected_mode: a peer of another host; user: a peer of this host of another "
             "user; auth: no proved principal, or one not admitted; role: a request its "
             "principal's roles (KVPOOL_TE_ACL) do not allow; tenant: a principal of another "
             "tenant).",
             "reason=\"range\"", te_refused_range, ROW_U64),
    M_SAMPLE("kvpool_te_refused_total", "reason=\"protected_mode\"", te_refused_protected, ROW_U64),
    M_SAMPLE("kvpool_te_refused_total", "reason=\"user\"", te_refused_user, ROW_U64),
    M_SAMPLE("kvpool_te_refused_total", "reason=\"auth\"", te_refused_auth, ROW_U64),
    M_SAMPLE("kvpool_te_refused_total", "reason=\"role\"", te_refused_role, ROW_U64),
    M_SAMPLE("kvpool_te_refused_total", "reason=\"tenant\"", te_refused_tenant, ROW_U64),
    M_FAMILY("kvpool_ssd_io_errors_total",
             "Reads and writes of this process's SSD segment file that failed.", NULL,
             ssd_io_errors, ROW_U64),
};

static void put_rows(out_t *o, const kvp_metrics_t *m, const metric_row_t *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const metric_row_t *r = &rows[i];
        const char *field = (const char *)m + r->off;
        const char *lo = r->labels != NULL ? "{" : "", *lc = r->labels != NULL ? "}" : "";
        const char *labels = r->labels != NULL ? r->labels : "";
        uint64_t u;
        int64_t s;
        if (r->type != NULL)
            family(o, r->name, r->type, r->help);
        switch (r->kind) {
        case ROW_U64:
            memcpy(&u, field, sizeof(u));
            put_fmt(o, "%s%s%s%s %llu\n", r->name, lo, labels, lc, (unsigned long long)u);
            break;
        case ROW_NS_AS_S:
            memcpy(&u, field, sizeof(u));
            put_fmt(o, "%s%s%s%s %.9f\n", r->name, lo, labels, lc, (double)u / 1e9);
            break;
        case ROW_I64_IF_SET:
            memcpy(&s, field, sizeof(s));
            if (s >= 0)
                put_fmt(o, "%s%s%s%s %lld\n", r->name, lo, labels, lc, (long long)s);
            break;
        }
    }
}

/* What this client moved as initiator, by transport and direction: ops, or bytes. */
static void put_client_transports(out_t *o, const kvp_metrics_t *m, const char *name,
                                  const char *help, bool bytes)
{
    family(o, name, "counter", help);
    for (int t = 0; t < KVP_METRICS_TP_COUNT; t++) {
        for (int d = 0; d < 2; d++) {
            const kvp_metrics_count_t *c = d == 0 ? &m->client[t].put : &m->client[t].get;
            put_fmt(o, "%s{transport=\"%s\",op=\"%s\"} %llu\n", name, tp_names[t], dir_names[d],
                    (unsigned long long)(bytes ? c->bytes : c->ops));
        }
    }
}

/* What this process's data servers served to peers, by transport: requests, or bytes. Only
 * the data servers see requests: one-sided shm and rdma never reach the owner. */
static void put_served(out_t *o, const kvp_metrics_t *m, const char *name, const char *help,
                       bool bytes)
{
    static const int served_tps[] = {KVP_METRICS_TP_TCP, KVP_METRICS_TP_SSD, KVP_METRICS_TP_DFS};
    family(o, name, "counter", help);
    for (size_t i = 0; i < sizeof(served_tps) / sizeof(served_tps[0]); i++) {
        int t = served_tps[i];
        const kvp_metrics_count_t *p = &m->served[t].put, *g = &m->served[t].get;
        put_fmt(o, "%s{transport=\"%s\"} %llu\n", name, tp_names[t],
                (unsigned long long)(bytes ? p->bytes + g->bytes : p->ops + g->ops));
    }
}

/* Where a batch's time goes: its master calls, by method (the data path's always, others
 * once used). */
static void put_master_rpc(out_t *o, const kvp_metrics_t *m)
{
    static const bool data_path[KVP_METRICS_RPC_MAX] = {
        [KVP_RPC_PUT_START] = true,        [KVP_RPC_PUT_END] = true, [KVP_RPC_EXIST] = true,
        [KVP_RPC_GET_REPLICA_LIST] = true, [KVP_RPC_REMOVE] = true,  [KVP_RPC_LEASE_RELEASE] = true,
        [KVP_RPC_PUT_COMMIT] = true,
    };
    static const struct {
        const char *name, *help;
    } rpc_fam[3] = {
        {"kvpool_client_master_rpc_calls_total",
         "Calls this client made on its master connection, by method (a one-way "
         "lease_release: messages sent). The data path's methods are always listed, others "
         "once used."},
        {"kvpool_client_master_rpc_failed_total",
         "Of those calls, the ones that got no answer (connection lost or not made, timed "
         "out, frame refused)."},
        {"kvpool_client_master_rpc_wait_seconds_total",
         "Wall time those calls waited for their answers, summed (threads add up)."},
    };
    for (int f = 0; f < 3; f++) {
        family(o, rpc_fam[f].name, "counter", rpc_fam[f].help);
        for (unsigned i = 0; i < KVP_METRICS_RPC_MAX; i++) {
            const kvp_metrics_rpc_t *r = &m->master_rpc[i];
            if (rpc_names[i] == NULL || (!data_path[i] && r->calls == 0))
                continue;
            if (f < 2)
                put_fmt(o, "%s{method=\"%s\"} %llu\n", rpc_fam[f].name, rpc_names[i],
                        (unsigned long long)(f == 0 ? r->calls : r->failed));
            else
                put_fmt(o, "%s{method=\"%s\"} %.9f\n", rpc_fam[f].name, rpc_names[i],
                        (double)r->wait_ns / 1e9);
        }
    }
}

/* The segments this process mounts, when it mounts any (their names are label values). */
static void put_segments(out_t *o, const kvp_metrics_t *m)
{
    if (m->dram_segment[0] == '\0' && m->ssd_segment[0] == '\0')
        return;
    family(o, "kvpool_segment_capacity_bytes", "gauge",
           "Bytes of the segments this process mounts (0 once drained).");
    if (m->dram_segment[0] != '\0') {
        put_str(o, "kvpool_segment_capacity_bytes{segment=\"");
        put_label_value(o, m->dram_segment);
        put_fmt(o, "\",tier=\"dram\"} %llu\n", (unsigned long long)m->dram_capacity);
    }
    if (m->ssd_segment[0] != '\0') {
        put_str(o, "kvpool_segment_capacity_bytes{segment=\"");
        put_label_value(o, m->ssd_segment);
        put_fmt(o, "\",tier=\"ssd\"} %llu\n", (unsigned long long)m->ssd_capacity);
    }
}

#define N_ROWS(rows) (sizeof(rows) / sizeof(rows[0]))

size_t kvp_metrics_format_prometheus(const kvp_metrics_t *m, char *buf, size_t cap)
{
    out_t o = {.buf = buf, .cap = buf != NULL ? cap : 0, .len = 0};
    if (o.cap > 0)
        buf[0] = '\0';
    put_client_transports(
        &o, m, "kvpool_client_ops_total",
        "Transfers this client completed as initiator (one per object extent moved).", false);
    put_client_transports(&o, m, "kvpool_client_bytes_total",
                          "Bytes this client moved as initiator, by transport and direction.",
                          true);
    put_rows(&o, m, client_rows, N_ROWS(client_rows));
    put_master_rpc(&o, m);
    put_rows(&o, m, transfer_rows, N_ROWS(transfer_rows));
    put_served(&o, m, "kvpool_served_ops_total",
               "Requests (extents read or written) this process's data servers served to peers; "
               "one-sided shm and rdma transfers are not seen by the owner.",
               false);
    put_served(&o, m, "kvpool_served_bytes_total",
               "Bytes this process's data servers read or wrote for peers.", true);
    put_rows(&o, m, server_rows, N_ROWS(server_rows));
    put_segments(&o, m);
    return o.len;
}
