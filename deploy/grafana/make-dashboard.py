#!/usr/bin/env python3
"""Writes kvpool-dashboard.json, the Grafana dashboard of kvpool's metrics.

    python3 deploy/grafana/make-dashboard.py > deploy/grafana/kvpool-dashboard.json

The JSON is the deliverable (import it in Grafana: Dashboards > Import, pick
a Prometheus data source); this script is its source, kept so that panels
are edited in one place. tests/deploy/test_deploy.sh checks the two agree.

Gauges of the master (capacity, objects, ...) are taken with max(): every
master of an HA pool is scraped, and standbys report an empty pool; counters
are summed (standbys count nothing).
"""
import json
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"

panels = []
_next_id = [1]
_y = [0]


def _id():
    i = _next_id[0]
    _next_id[0] += 1
    return i


def row(title):
    panels.append({"type": "row", "title": title, "id": _id(), "collapsed": False,
                   "gridPos": {"h": 1, "w": 24, "x": 0, "y": _y[0]}, "panels": []})
    _y[0] += 1


def target(expr, legend, ref):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref,
            "range": True}


def panel(kind, title, exprs, x, w, h=8, unit="short", desc="", extra=None, newline=False):
    """exprs: [(expr, legend)]; places the panel at (x, current row y)."""
    p = {
        "type": kind, "title": title, "id": _id(), "datasource": DS,
        "description": desc,
        "gridPos": {"h": h, "w": w, "x": x, "y": _y[0]},
        "targets": [target(e, l, chr(ord("A") + i)) for i, (e, l) in enumerate(exprs)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
    }
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {"drawStyle": "line", "lineWidth": 1,
                                                  "fillOpacity": 10, "showPoints": "never"}
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom",
                                   "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    elif kind in ("stat", "gauge", "bargauge"):
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                          "values": False}}
        if kind == "bargauge":
            p["options"].update({"orientation": "horizontal", "displayMode": "gradient"})
    if extra:
        for k, v in extra.items():
            if isinstance(v, dict) and isinstance(p.get(k), dict):
                p[k].update(v)
            else:
                p[k] = v
    panels.append(p)
    if newline or x + w >= 24:
        _y[0] += h


def rate(metric, by=None):
    return (f"sum by ({by}) (rate({metric}[{RI}]))" if by else f"sum(rate({metric}[{RI}]))")


PCT = {"fieldConfig": {"defaults": {"unit": "percentunit", "min": 0, "max": 1}}}

# ---------------------------------------------------------------- the pool
row("Pool (master)")
panel("stat", "Leader", [("kvpool_leader == 1", "{{instance}}")], 0, 4, 4,
      desc="The master serving now (kvpool_leader 1). Standbys show 0.",
      extra={"options": {"textMode": "name", "colorMode": "none"}})
panel("stat", "Epoch", [("max(kvpool_epoch)", "epoch")], 4, 3, 4,
      desc="Grows with every new leader (etcd leader key's create revision).")
panel("stat", "Standbys", [("max(kvpool_standbys)", "standbys")], 7, 3, 4)
panel("stat", "Clients", [("max(kvpool_clients)", "clients")], 10, 3, 4)
panel("stat", "Segments", [("max by (tier) (kvpool_segments)", "{{tier}}")], 13, 5, 4)
panel("stat", "Objects", [("max by (tier) (kvpool_objects)", "{{tier}}")], 18, 6, 4,
      newline=True)
panel("timeseries", "Capacity and used bytes per tier",
      [("max by (tier) (kvpool_capacity_bytes)", "capacity {{tier}}"),
       ("max by (tier) (kvpool_used_bytes)", "used {{tier}}")], 0, 10, unit="bytes")
panel("gauge", "Used / capacity per tier",
      [("max by (tier) (kvpool_used_bytes) / max by (tier) (kvpool_capacity_bytes)",
        "{{tier}}")], 10, 5, extra=PCT)
panel("timeseries", "Objects per tier", [("max by (tier) (kvpool_objects)", "{{tier}}")],
      15, 9, newline=True)

# ---------------------------------------------------------------- operations
row("Operations (master)")
panel("timeseries", "Requests / s",
      [(rate("kvpool_puts_total"), "put"), (rate("kvpool_gets_total"), "get"),
       (rate("kvpool_exists_total"), "exist"), (rate("kvpool_removes_total"), "remove"),
       (rate("kvpool_get_misses_total"), "get miss")], 0, 8, unit="ops")
panel("timeseries", "Get hit ratio",
      [(f"{rate('kvpool_get_hits_total')} / {rate('kvpool_gets_total')}", "all tiers"),
       (f"{rate('kvpool_get_hits_total', 'tier')} / scalar({rate('kvpool_gets_total')})",
        "{{tier}}")], 8, 8, extra=PCT,
      desc="Hits over gets (objects asked for); per tier: where the hit was served.")
panel("timeseries", "Evictions, offloads, promotions / s",
      [(rate("kvpool_evictions_total"), "evictions"),
       (rate("kvpool_ssd_evictions_total"), "SSD evictions"),
       (rate("kvpool_offloads_total"), "offloads DRAM->SSD"),
       (rate("kvpool_promotions_total"), "promotions SSD->DRAM"),
       (rate("kvpool_lease_waits_total"), "lease waits")], 16, 8, unit="ops", newline=True)
panel("timeseries", "RPC latency p50 / p99 by method",
      [(f"histogram_quantile(0.5, sum by (le, method) "
        f"(rate(kvpool_rpc_duration_seconds_bucket[{RI}])))", "p50 {{method}}"),
       (f"histogram_quantile(0.99, sum by (le, method) "
        f"(rate(kvpool_rpc_duration_seconds_bucket[{RI}])))", "p99 {{method}}")],
      0, 12, unit="s")
panel("timeseries", "RPCs / s by method",
      [(rate("kvpool_rpc_duration_seconds_count", "method"), "{{method}}")], 12, 6,
      unit="reqps")
panel("timeseries", "Evicted bytes / s", [(rate("kvpool_evicted_bytes_total"), "evicted")],
      18, 6, unit="Bps", newline=True)
panel("timeseries", "Timeouts, failures, refusals / s",
      [(rate("kvpool_put_timeouts_total"), "puts timed out (revoked)"),
       (rate("kvpool_leases_expired_total"), "read leases expired"),
       (rate("kvpool_offload_failures_total"), "offload failures"),
       (rate("kvpool_offload_dropped_total"), "offloads dropped"),
       (rate("kvpool_adopt_refused_total"), "stale record entries refused")], 0, 12,
      unit="ops", desc="Non-zero rates here point at dying clients, slow readers or a "
                        "full SSD tier.")
panel("timeseries", "Keys and puts in flight",
      [("max(kvpool_keys)", "keys"), ("max(kvpool_pending_objects)", "pending puts")],
      12, 12, newline=True)

# ---------------------------------------------------------------- HA, events
row("High availability and KV events")
panel("timeseries", "Leader per master", [("kvpool_leader", "{{instance}}")], 0, 8,
      desc="1 on the serving leader; a change of line is a failover.",
      extra={"fieldConfig": {"defaults": {"min": 0, "max": 1}}})
panel("timeseries", "Epoch and standbys",
      [("max(kvpool_epoch)", "epoch"), ("max(kvpool_standbys)", "standbys")], 8, 8)
panel("timeseries", "KV events",
      [("max(kvpool_kv_events_queue_depth)", "queue depth"),
       (rate("kvpool_kv_events_published_total"), "published / s"),
       (rate("kvpool_kv_events_dropped_total"), "dropped / s")], 16, 8, newline=True,
      desc="ZeroMQ KV events: a growing queue or any drop means subscribers "
           "(routers) miss cache changes.")

# ---------------------------------------------------------------- segments
row("Segments")
panel("bargauge", "Segment used / capacity",
      [("max by (segment, tier) (kvpool_segment_used_bytes) / "
        "max by (segment, tier) (kvpool_segment_capacity_bytes)", "{{segment}} ({{tier}})")],
      0, 8, 10, extra=PCT)
panel("timeseries", "Used bytes per segment",
      [("max by (segment, tier) (kvpool_segment_used_bytes)", "{{segment}} ({{tier}})")],
      8, 8, 10, unit="bytes")
panel("timeseries", "Objects per segment",
      [("max by (segment, tier) (kvpool_segment_objects)", "{{segment}} ({{tier}})")],
      16, 8, 10, newline=True)

# ---------------------------------------------------------------- owners
row("Segment owners (kvpool serve)")
panel("timeseries", "Client ops / s by transport and op",
      [(rate("kvpool_client_ops_total", "transport, op"), "{{transport}} {{op}}")], 0, 8,
      unit="ops")
panel("timeseries", "Client bytes / s by transport and op",
      [(rate("kvpool_client_bytes_total", "transport, op"), "{{transport}} {{op}}")], 8, 8,
      unit="Bps")
panel("timeseries", "Served by this node's segments / s",
      [(rate("kvpool_served_bytes_total", "instance, transport"), "{{instance}} {{transport}}")],
      16, 8, unit="Bps", newline=True,
      desc="Bytes peers read from and wrote to the segments each owner serves.")
panel("timeseries", "Served ops / s",
      [(rate("kvpool_served_ops_total", "instance, transport"), "{{instance}} {{transport}}")],
      0, 8, unit="ops")
panel("timeseries", "SSD I/O",
      [(rate("kvpool_ssd_io_bytes_total", "op"), "{{op}} bytes/s")], 8, 8, unit="Bps")
panel("timeseries", "SSD I/O ops and errors / s",
      [(rate("kvpool_ssd_io_ops_total", "op"), "{{op}}"),
       (rate("kvpool_ssd_io_errors_total"), "errors")], 16, 8, unit="ops", newline=True)

# ---------------------------------------------------------------- the indexer
row("Indexer (kvpool-indexer)")
panel("stat", "Blocks indexed", [("max(kvpool_indexer_blocks)", "blocks")], 0, 4, 4)
panel("stat", "Holders", [("max(kvpool_indexer_block_holders)", "holders")], 4, 4, 4,
      desc="(block, registration, publisher, medium) entries.")
panel("stat", "Registrations", [("max(kvpool_indexer_registrations)", "registrations")], 8, 4,
      4)
panel("stat", "Publishers", [("max(kvpool_indexer_subscriptions)", "subscribed"),
                             ("max(kvpool_indexer_stale_publishers)", "stale")], 12, 6, 4)
panel("stat", "Evicted blocks", [("max(kvpool_indexer_evicted_blocks_total)", "evicted")], 18,
      6, 4, desc="Blocks dropped past --max-blocks.")
panel("timeseries", "Events / s by type",
      [(rate("kvpool_indexer_events_total", "type"), "{{type}}"),
       (rate("kvpool_indexer_batches_total"), "batches"),
       (rate("kvpool_indexer_replayed_batches_total"), "replayed batches")], 0, 8, unit="ops")
panel("timeseries", "Queries / s",
      [(rate("kvpool_indexer_queries_total", "kind"), "{{kind}}")], 8, 8, unit="reqps")
panel("timeseries", "Resyncs, unplaced, refusals / s",
      [(rate("kvpool_indexer_resyncs_total", "reason"), "resync {{reason}}"),
       (rate("kvpool_indexer_unplaced_blocks_total"), "unplaced blocks"),
       (rate("kvpool_indexer_http_refused_total", "reason"), "refused {{reason}}")], 16, 8,
      unit="ops", newline=True,
      desc="A resync drops a publisher's blocks (a gap no replay healed, a restart, a "
           "malformed batch); unplaced: stored blocks whose parent was never seen.")

dashboard = {
    "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                  "pluginId": "prometheus", "pluginName": "Prometheus"}],
    "__requires": [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "9.0.0"},
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
        {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
        {"type": "panel", "id": "gauge", "name": "Gauge", "version": ""},
        {"type": "panel", "id": "bargauge", "name": "Bar gauge", "version": ""},
    ],
    "id": None,
    "uid": "kvpool-overview",
    "title": "kvpool",
    "description": "kvpool: pool capacity and use per tier, operations, hit ratio, "
                   "eviction/tiering, RPC latency, HA, KV events, segments, segment owners, "
                   "the indexer.",
    "tags": ["kvpool", "kv-cache"],
    "timezone": "browser",
    "editable": True,
    "graphTooltip": 1,
    "schemaVersion": 37,
    "version": 1,
    "refresh": "30s",
    "time": {"from": "now-1h", "to": "now"},
    "timepicker": {},
    "annotations": {"list": []},
    "links": [],
    "templating": {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource",
         "query": "prometheus", "current": {}, "hide": 0, "refresh": 1,
         "regex": "", "options": []},
    ]},
    "panels": panels,
}

json.dump(dashboard, sys.stdout, indent=2)
sys.stdout.write("\n")
