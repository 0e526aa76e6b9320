"""Mooncake's drain job API on the master's HTTP port (POST /api/v1/drain_jobs, its query
and cancel, /api/v1/segments/status), as Mooncake's scripts/test_drain_http_api.py drives
it: two stores, objects on the first, a job draining it onto the second; the segment reads
DRAINING, puts meant for it land on the target, the job succeeds with every object moved,
the segment reads DRAINED, every byte reads back from the target. Then each refusal, with
Mooncake's error codes. Real processes on 127.0.0.1 (plain HTTP: the TLS pass checks the
admin-only door in test_security.py)."""

import json
import os
import urllib.error
import urllib.request

import pytest

from conftest import TLS_DIR, free_port, metric
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
from test_security import certs, poll, tls_client_ctx  # noqa: F401 (fixture)
from test_tenants import TOKENS, make_master  # noqa: F401 (fixture)

plain_only = pytest.mark.skipif(TLS_DIR is not None,
                                reason="plain-HTTP views: run in the plain pass only")


def call(port, path, body=None, method=None):
    """(HTTP status, JSON answer)."""
    data = None if body is None else (body if isinstance(body, bytes) else
                                      json.dumps(body).encode())
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text.decode()


@pytest.fixture
def world(make_pool):
    port = free_port()
    pool = make_pool(segments=(), master_args=("--lease-ttl", "0", "--http-listen",
                                               f"127.0.0.1:{port}"))
    stores = []
    for name in (f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"):
        s = MooncakeDistributedStore()
        assert s.setup(name, "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "", pool.addr) == 0
        assert s.get_hostname() == name
        stores.append(s)
    yield port, stores
    for s in stores:
        s.close()


def endpoints(store, key):
    return sorted(d.get_memory_descriptor().buffer_descriptor.transport_endpoint
                  for d in store.get_replica_desc(key) if d.is_memory_replica())


def put(store, key, value, segment):
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    cfg.preferred_segment = segment
    assert store.put(key, value, cfg) == 0


@plain_only
def test_drain_job_moves_a_segment_onto_its_target(world):
    port, (src, dst) = world
    source, target = src.get_hostname(), dst.get_hostname()
    assert call(port, f"/api/v1/segments/status?segment={source}")[1]["status_name"] == "OK"
    pre = {f"drain-pre-{i:02d}": os.urandom(256 * 1024) for i in range(24)}
    for k, v in pre.items():
        put(src, k, v, source)
        assert endpoints(dst, k) == [source]
    status, job = call(port, "/api/v1/drain_jobs",
                       {"segments": [source], "target_segments": [target],
                        "max_concurrency": 1})
    assert status == 200 and job["success"] and job["status"] == "CREATED", job
    job_id = job["job_id"]
    assert len(job_id) == 36 and job_id[14] == "4"  # a random UUID
    seen = call(port, f"/api/v1/segments/status?segment={source}")[1]
    assert seen["success"] and seen["status_name"] in ("DRAINING", "DRAINED"), seen
    # puts meant for the draining segment land on the target
    redirected = {f"drain-redirect-{i}": os.urandom(64 * 1024) for i in range(8)}
    for k, v in redirected.items():
        put(src, k, v, source)
        assert endpoints(dst, k) == [target]
    def ended():
        j = call(port, f"/api/v1/drain_jobs/query?job_id={job_id}")[1]
        return j if j["status_name"] in ("SUCCEEDED", "FAILED", "CANCELED") else None

    final = poll(ended, "the drain job's end", timeout=30, step=0.1)
    assert final["status_name"] == "SUCCEEDED" and final["status"] == 3, final
    assert final["type_name"] == "DRAIN" and final["segments"] == [source]
    assert final["succeeded_units"] == len(pre) and final["failed_units"] == 0
    assert final["active_units"] == 0
    assert final["migrated_bytes"] == sum(len(v) for v in pre.values())
    assert final["last_updated_at_ms_epoch"] >= final["created_at_ms_epoch"] > 0
    seen = call(port, f"/api/v1/segments/status?segment={source}")[1]
    assert seen["status_name"] == "DRAINED" and seen["status"] == 3, seen
    for k, v in {**pre, **redirected}.items():
        assert dst.get(k) == v
        assert endpoints(dst, k) == [target]
    # a job that ended cannot be canceled; nor could it while it ran (kvpool's drains run to
    # their end once the owners were told)
    status, ans = call(port, f"/api/v1/drain_jobs/cancel?job_id={job_id}", b"")
    assert status == 409 and ans["error_code"] == -1010 and not ans["success"]


@plain_only
def test_drain_job_refusals(world):
    port, (src, dst) = world
    source, target = src.get_hostname(), dst.get_hostname()
    cases = [
        (b"not json", 400, -600),
        ({"segments": []}, 400, -600),
        ({"segments": [source], "max_concurrency": 0}, 400, -600),
        ({"segments": [source, source]}, 400, -600),
        ({"segments": [source], "target_segments": [source]}, 400, -600),
        ({"segments": ["nope:1"]}, 404, -101),
        ({"segments": [source], "target_segments": ["nope:1"]}, 404, -101),
        ({"segments": [7]}, 400, -600),
        ({"segments": [f"s{i}" for i in range(17)]}, 400, -600),
    ]
    for body, http, code in cases:
        status, ans = call(port, "/api/v1/drain_jobs", body)
        assert (status, ans["error_code"], ans["success"]) == (http, code, False), (body, ans)
    # nothing was started by any of them
    assert call(port, f"/api/v1/segments/status?segment={source}")[1]["status_name"] == "OK"
    ok, job = call(port, "/api/v1/drain_jobs", {"segments": [source]})
    assert ok == 200, job
    status, ans = call(port, "/api/v1/drain_jobs", {"segments": [source]})
    assert status == 409 and ans["error_code"] == -1010  # draining already
    status, ans = call(port, "/api/v1/drain_jobs", {"segments": [target],
                                                    "target_segments": [source]})
    assert status == 409 and ans["error_code"] == -1010  # a draining target
    for q, http, code in (("", 400, -600), ("?job_id=xyz", 400, -600),
                          ("?job_id=00000000-0000-4000-8000-000000000000", 404, -1402)):
        status, ans = call(port, "/api/v1/drain_jobs/query" + q)
        assert (status, ans["error_code"]) == (http, code), (q, ans)
    status, ans = call(port, "/api/v1/segments/status?segment=nope:1")
    assert (status, ans["error_code"]) == (404, -101)
    assert call(port, "/api/v1/segments/status")[0] == 400
    assert call(port, "/api/v1/drain_jobs", method="GET")[0] == 405
    assert call(port, "/api/v1/drain_jobs/query?job_id=" + job["job_id"], b"{}")[0] == 405
    assert call(port, "/api/v1/drain_jobs/nope")[0] == 404


def test_only_an_admin(make_master):  # noqa: F811
    """With an ACL the drain job API is an admin's, as every admin view: a tenant's
    principal gets 403, no credential 401 (each counted), before any body is read; nothing
    drains; the admin's own request is taken."""
    m = make_master({"team-a": {}}, segments=("32MiB",))
    name = m.segments[0].ready
    m.http("/health")
    base = f"https://127.0.0.1:{m.http_port}"
    ctx = tls_client_ctx(m.certs.ca)

    def post(path, body, token):
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     method="POST", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    text = m.metrics()
    role0 = metric(text, "kvpool_http_refused_total", {"reason": "role"})
    unauth0 = metric(text, "kvpool_http_refused_total", {"reason": "unauthenticated"})
    body = {"segments": [name]}
    for path in ("/api/v1/drain_jobs", "/api/v1/drain_jobs/cancel?job_id=x"):
        st, j = post(path, body, TOKENS["alice"])
        assert st == 403 and "not an admin" in j["error"], (path, st, j)
        st, j = post(path, body, None)
        assert st == 401, (path, st, j)
    st, j = m.http(f"/api/v1/segments/status?segment={name}", token=TOKENS["alice"])
    assert st == 403
    text = m.metrics()
    assert metric(text, "kvpool_http_refused_total", {"reason": "role"}) == role0 + 3
    assert metric(text, "kvpool_http_refused_total", {"reason": "unauthenticated"}) == unauth0 + 2
    st, j = m.http(f"/api/v1/segments/status?segment={name}", token=TOKENS["admin"])
    assert st == 200 and json.loads(j)["status_name"] == "OK", j  # nothing drains
    st, j = post("/api/v1/drain_jobs", body, TOKENS["admin"])
    assert st == 200 and j["success"], j
