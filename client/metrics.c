/*
 * metrics.c - kvp_metrics_snapshot (the client's counters as one plain struct) and their
 * Prometheus text exposition.
 *
 * Design: the counters live where the work happens and are bumped there with relaxed
 * atomics, never under a lock: the transfer engine's (client/transfer/engine.c, one add
 * per transport and direction per batch), each data server's (segment/segment_server.c,
 * ssd/ssd_server.c, one add per request), the SSD file's I/O (ssd/ssd_io.c, one add per
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
#include "common/rpc.h"

static const char *const tp_names[KVP_METRICS_TP_COUNT] = {
    [KVP_METRICS_TP_TCP] = "tcp",
    [KVP_METRICS_TP_SHM] = "shm",
    [KVP_METRICS_TP_RDMA] = "rdma",
    [KVP_METRICS_TP_SSD] = "ssd",
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
    if (c->ssd != NULL)
        kvp_ssd_owner_metrics(c->ssd, &m);

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

static void family(out_t *o, const char *name, const char *type, const char *help)
{
    put_fmt(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static const char *const dir_names[2] = {"put", "get"};

size_t kvp_metrics_format_prometheus(const kvp_metrics_t *m, char *buf, size_t cap)
{
    out_t o = {.buf = buf, .cap = buf != NULL ? cap : 0, .len = 0};
    if (o.cap > 0)
        buf[0] = '\0';

    family(&o, "kvpool_client_ops_total", "counter",
           "Transfers this client completed as initiator (one per object extent moved).");
    for (int t = 0; t < KVP_METRICS_TP_COUNT; t++)
        for (int d = 0; d < 2; d++)
            put_fmt(&o, "kvpool_client_ops_total{transport=\"%s\",op=\"%s\"} %llu\n", tp_names[t],
                    dir_names[d],
                    (unsigned long long)(d == 0 ? m->client[t].put.ops : m->client[t].get.ops));
    family(&o, "kvpool_client_bytes_total", "counter",
           "Bytes this client moved as initiator, by transport and direction.");
    for (int t = 0; t < KVP_METRICS_TP_COUNT; t++)
        for (int d = 0; d < 2; d++)
            put_fmt(&o, "kvpool_client_bytes_total{transport=\"%s\",op=\"%s\"} %llu\n", tp_names[t],
                    dir_names[d],
                    (unsigned long long)(d == 0 ? m->client[t].put.bytes : m->client[t].get.bytes));
    family(&o, "kvpool_client_errors_total", "counter",
           "Transfers this client made that failed, and gets that failed their checksum.");
    put_fmt(&o, "kvpool_client_errors_total{op=\"put\"} %llu\n", (unsigned long long)m->put_errors);
    put_fmt(&o, "kvpool_client_errors_total{op=\"get\"} %llu\n", (unsigned long long)m->get_errors);
    family(&o, "kvpool_client_staged_ops_total", "counter",
           "Transfers copied through staging buffers (host: memory the NIC has not "
           "registered; gpu: CUDA device memory).");
    put_fmt(&o, "kvpool_client_staged_ops_total{kind=\"host\"} %llu\n",
            (unsigned long long)m->staged[0].ops);
    put_fmt(&o, "kvpool_client_staged_ops_total{kind=\"gpu\"} %llu\n",
            (unsigned long long)m->staged[1].ops);
    family(&o, "kvpool_client_staged_bytes_total", "counter", "Bytes of the staged transfers.");
    put_fmt(&o, "kvpool_client_staged_bytes_total{kind=\"host\"} %llu\n",
            (unsigned long long)m->staged[0].bytes);
    put_fmt(&o, "kvpool_client_staged_bytes_total{kind=\"gpu\"} %llu\n",
            (unsigned long long)m->staged[1].bytes);

    /* where a batch's time goes: its master calls and its transfers */
    static const bool data_path[KVP_METRICS_RPC_MAX] = {
        [KVP_RPC_PUT_START] = true,        [KVP_RPC_PUT_END] = true, [KVP_RPC_EXIST] = true,
        [KVP_RPC_GET_REPLICA_LIST] = true, [KVP_RPC_REMOVE] = true,  [KVP_RPC_LEASE_RELEASE] = true,
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
        family(&o, rpc_fam[f].name, "counter", rpc_fam[f].help);
        for (unsigned i = 0; i < KVP_METRICS_RPC_MAX; i++) {
            const kvp_metrics_rpc_t *r = &m->master_rpc[i];
            if (rpc_names[i] == NULL || (!data_path[i] && r->calls == 0))
                continue;
            if (f < 2)
                put_fmt(&o, "%s{method=\"%s\"} %llu\n", rpc_fam[f].name, rpc_names[i],
                        (unsigned long long)(f == 0 ? r->calls : r->failed));
            else
                put_fmt(&o, "%s{method=\"%s\"} %.9f\n", rpc_fam[f].name, rpc_names[i],
                        (double)r->wait_ns / 1e9);
        }
    }
    family(&o, "kvpool_client_transfer_batches_total", "counter",
           "Batches of transfers this client ran as initiator (a get's every round of "
           "replicas counts), by direction.");
    for (int d = 0; d < 2; d++)
        put_fmt(&o, "kvpool_client_transfer_batches_total{op=\"%s\"} %llu\n", dir_names[d],
                (unsigned long long)m->transfer_runs[d]);
    family(&o, "kvpool_client_transfer_seconds_total", "counter",
           "Wall time of those batches, summed (threads add up).");
    for (int d = 0; d < 2; d++)
        put_fmt(&o, "kvpool_client_transfer_seconds_total{op=\"%s\"} %.9f\n", dir_names[d],
                (double)m->transfer_ns[d] / 1e9);

    /* only the data servers see requests: one-sided shm and rdma never reach the owner */
    static const int served_tps[] = {KVP_METRICS_TP_TCP, KVP_METRICS_TP_SSD};
    family(&o, "kvpool_served_ops_total", "counter",
           "Requests (extents read or written) this process's data servers served to peers; "
           "one-sided shm and rdma transfers are not seen by the owner.");
    for (size_t i = 0; i < sizeof(served_tps) / sizeof(served_tps[0]); i++) {
        int t = served_tps[i];
        put_fmt(&o, "kvpool_served_ops_total{transport=\"%s\"} %llu\n", tp_names[t],
                (unsigned long long)(m->served[t].put.ops + m->served[t].get.ops));
    }
    family(&o, "kvpool_served_bytes_total", "counter",
           "Bytes this process's data servers read or wrote for peers.");
    for (size_t i = 0; i < sizeof(served_tps) / sizeof(served_tps[0]); i++) {
        int t = served_tps[i];
        put_fmt(&o, "kvpool_served_bytes_total{transport=\"%s\"} %llu\n", tp_names[t],
                (unsigned long long)(m->served[t].put.bytes + m->served[t].get.bytes));
    }

    family(&o, "kvpool_connections_refused_total", "counter",
           "Connections this process's data servers refused, by reason (protected_mode: a "
           "peer of another host while no credentials are configured; grant: a data "
           "request without a valid grant from the master, whose connection was closed; shm: "
           "a request for a segment's memory from another user or without a valid MAP "
           "grant; rdma: a queue pair without a valid proof of a principal that may hold the "
           "segment, or past its cap).");
    put_fmt(&o, "kvpool_connections_refused_total{reason=\"protected_mode\"} %llu\n",
            (unsigned long long)m->refused_protected);
    put_fmt(&o, "kvpool_connections_refused_total{reason=\"grant\"} %llu\n",
            (unsigned long long)m->refused_grant);
    put_fmt(&o, "kvpool_connections_refused_total{reason=\"shm\"} %llu\n",
            (unsigned long long)m->refused_shm);
    put_fmt(&o, "kvpool_connections_refused_total{reason=\"rdma\"} %llu\n",
            (unsigned long long)m->refused_rdma);
    family(&o, "kvpool_rdma_remote_access_errors_total", "counter",
           "Remote access errors peers caused on this process's segment over rdma (a bad "
           "rkey, address or permission): source qp_event, the queue pairs' asynchronous "
           "events; source nic, the device's own counter, where it keeps one.");
    put_fmt(&o, "kvpool_rdma_remote_access_errors_total{source=\"qp_event\"} %llu\n",
            (unsigned long long)m->rdma_access_errors);
    if (m->rdma_nic_access_errors >= 0)
        put_fmt(&o, "kvpool_rdma_remote_access_errors_total{source=\"nic\"} %lld\n",
                (long long)m->rdma_nic_access_errors);
    family(&o, "kvpool_ssd_io_ops_total", "counter",
           "Reads and writes of this process's SSD segment file that completed.");
    put_fmt(&o, "kvpool_ssd_io_ops_total{op=\"read\"} %llu\n", (unsigned long long)m->ssd_read.ops);
    put_fmt(&o, "kvpool_ssd_io_ops_total{op=\"write\"} %llu\n",
            (unsigned long long)m->ssd_write.ops);
    family(&o, "kvpool_ssd_io_bytes_total", "counter",
           "Bytes read from and written to this process's SSD segment file.");
    put_fmt(&o, "kvpool_ssd_io_bytes_total{op=\"read\"} %llu\n",
            (unsigned long long)m->ssd_read.bytes);
    put_fmt(&o, "kvpool_ssd_io_bytes_total{op=\"write\"} %llu\n",
            (unsigned long long)m->ssd_write.bytes);
    family(&o, "kvpool_ssd_io_errors_total", "counter",
           "Reads and writes of this process's SSD segment file that failed.");
    put_fmt(&o, "kvpool_ssd_io_errors_total %llu\n", (unsigned long long)m->ssd_io_errors);

    if (m->dram_segment[0] != '\0' || m->ssd_segment[0] != '\0') {
        family(&o, "kvpool_segment_capacity_bytes", "gauge",
               "Bytes of the segments this process mounts (0 once drained).");
        if (m->dram_segment[0] != '\0') {
            put_str(&o, "kvpool_segment_capacity_bytes{segment=\"");
            put_label_value(&o, m->dram_segment);
            put_fmt(&o, "\",tier=\"dram\"} %llu\n", (unsigned long long)m->dram_capacity);
        }
        if (m->ssd_segment[0] != '\0') {
            put_str(&o, "kvpool_segment_capacity_bytes{segment=\"");
            put_label_value(&o, m->ssd_segment);
            put_fmt(&o, "\",tier=\"ssd\"} %llu\n", (unsigned long long)m->ssd_capacity);
        }
    }
    return o.len;
}
