"""kvpool-indexer with TLS 1.3 and the ACL (docs/indexer.md, "Security and limits"):
every request but /health and /metrics names a principal (a bearer token or a client
certificate the ACL names); /register and /unregister need role write, /query and
/instances role read; a principal of a tenant registers, unregisters, queries and lists
only in its own tenant (an admin in any). Strangers and the wrong principals get 401 / 403
with the reason, counted in /metrics, and nothing is applied; the plaintext port is gone.

Real parts: the kvpool-indexer binary, certificates from deploy/make-certs.sh (the
`certs` fixture of test_security.py), HTTPS with Python's ssl module.
"""
import json
import os
import ssl
import urllib.error
import urllib.request
import uuid

import pytest

from conftest import Proc
from test_security import acl_text, certs, no_ambient_credentials  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("KVPOOL_INDEXER_BIN", os.path.join(ROOT, "build", "indexer",
                                                         "kvpool-indexer"))
pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK),
                                reason=f"no kvpool-indexer binary at {BIN}")

_RUN = uuid.uuid4().hex[:8]
PRINCIPALS = {
    "router-a": dict(tenant="team-a", roles="read, write", token=f"ra-{_RUN}-tok"),
    "router-b": dict(tenant="team-b", roles="read, write", cn="bob"),
    "reader-a": dict(tenant="team-a", roles="read", token=f"rd-{_RUN}-tok"),
    "admin": dict(roles="admin", cn="admin"),
}
REG = dict(endpoint="tcp://127.0.0.1:1", type="vLLM", modelname="m", block_size=4, dp_rank=0)


@pytest.fixture(scope="module")
def idx(certs, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp("idxsec")
    acl = d / "acl.conf"
    acl.write_text(acl_text(PRINCIPALS))
    p = Proc([BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--tls-cert",
              certs.server_crt, "--tls-key", certs.server_key, "--tls-ca", certs.ca,
              "--tls-crl", certs.crl, "--acl-file", str(acl)])
    yield p, int(p.ready.rsplit(":", 1)[1])
    p.stop()


def call(certs, port, path, body=None, who=None, token=None):  # noqa: F811
    """(status, JSON or text) of a request as principal `who` (its token or certificate)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(certs.ca)
    headers = {}
    p = PRINCIPALS.get(who, {})
    if "cn" in p:
        ctx.load_cert_chain(*certs.pair(p["cn"]))
    if "token" in p or token:
        headers["Authorization"] = f"Bearer {token or p['token']}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=data, headers=headers,
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            text = r.read().decode()
            return r.status, (text if path == "/metrics" else json.loads(text))
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


def refused(certs, port, reason):  # noqa: F811
    _, text = call(certs, port, "/metrics")
    want = f'kvpool_indexer_http_refused_total{{reason="{reason}"}} '
    return int(float([ln for ln in text.splitlines() if ln.startswith(want)][0].split()[1]))


def test_strangers_and_roles(idx, certs):  # noqa: F811
    _, port = idx
    # /health and /metrics hold no tenant's data: open; everything else needs a principal
    assert call(certs, port, "/health")[0] == 200
    before = refused(certs, port, "unauthenticated")
    for path, body in (("/register", dict(REG, instance_id="x")), ("/instances", None),
                       ("/query", {"model": "m", "block_size": 4, "token_ids": [1, 2, 3, 4]})):
        s, a = call(certs, port, path, body)
        assert s == 401 and "authentication required" in a["error"], (path, s, a)
        s, a = call(certs, port, path, body, token=f"wrong-{_RUN}")
        assert s == 401, (path, s, a)
    assert refused(certs, port, "unauthenticated") == before + 6
    # no plaintext: the port speaks TLS only
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
    # a reader may not register
    s, a = call(certs, port, "/register", dict(REG, instance_id="r"), who="reader-a")
    assert s == 403 and "needs role write" in a["error"]
    assert refused(certs, port, "role") >= 1
    _, inst = call(certs, port, "/instances", who="admin")
    assert all(i["instance_id"] != "r" for i in inst["instances"])


def test_tenants_kept_apart(idx, certs):  # noqa: F811
    _, port = idx
    # each router registers in its own tenant (tenant_id left out: the principal's)
    s, a = call(certs, port, "/register", dict(REG, instance_id="engine-a"), who="router-a")
    assert s == 200, a
    s, a = call(certs, port, "/register", dict(REG, instance_id="engine-b"), who="router-b")
    assert s == 200, a
    # ... and not in another's
    before = refused(certs, port, "tenant")
    s, a = call(certs, port, "/register", dict(REG, instance_id="evil", tenant_id="team-b"),
                who="router-a")
    assert s == 403 and "may not name tenant team-b" in a["error"]
    s, a = call(certs, port, "/unregister", {"instance_id": "engine-b", "tenant_id": "team-b"},
                who="router-a")
    assert s == 403
    s, a = call(certs, port, "/query", {"model": "m", "block_size": 4, "token_ids": [1] * 8,
                                        "tenant_id": "team-b"}, who="reader-a")
    assert s == 403
    assert refused(certs, port, "tenant") == before + 3
    # each sees its tenant's registrations only; the admin sees both
    _, a = call(certs, port, "/instances", who="router-b")
    assert [(i["instance_id"], i["tenant_id"]) for i in a["instances"]] == [("engine-b",
                                                                            "team-b")]
    _, a = call(certs, port, "/instances", who="reader-a")
    assert [(i["instance_id"], i["tenant_id"]) for i in a["instances"]] == [("engine-a",
                                                                            "team-a")]
    _, a = call(certs, port, "/instances", who="admin")
    assert {(i["instance_id"], i["tenant_id"]) for i in a["instances"]} >= {
        ("engine-a", "team-a"), ("engine-b", "team-b")}
    # a query answers the caller's tenant
    s, a = call(certs, port, "/query", {"model": "m", "block_size": 4, "token_ids": [1] * 8},
                who="reader-a")
    assert s == 200 and list(a) == ["team-a"] and list(a["team-a"]) == ["engine-a"], a
    # engine-b is still there after router-a's refused unregister
    s, a = call(certs, port, "/unregister", {"instance_id": "engine-b"}, who="router-b")
    assert s == 200 and a["removed_instances"] == ["engine-b|team-b|0"], a


def test_acl_needs_tls(tmp_path):
    import subprocess
    acl = tmp_path / "acl.conf"
    acl.write_text(acl_text(PRINCIPALS))
    r = subprocess.run([BIN, "--listen", "127.0.0.1:0", "--acl-file", str(acl)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "--acl-file needs --tls-cert" in r.stderr


def test_acl_reloaded_on_sighup(certs, tmp_path):  # noqa: F811
    import signal
    import time
    acl = tmp_path / "acl.conf"
    acl.write_text(acl_text(PRINCIPALS))
    p = Proc([BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--tls-cert",
              certs.server_crt, "--tls-key", certs.server_key, "--acl-file", str(acl)])
    port = int(p.ready.rsplit(":", 1)[1])
    late = f"late-{_RUN}-tok"
    try:
        assert call(certs, port, "/instances", token=late)[0] == 401
        more = dict(PRINCIPALS, late=dict(tenant="team-c", roles="read", token=late))
        acl.write_text(acl_text(more))
        os.kill(p.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while call(certs, port, "/instances", token=late)[0] != 200:
            assert time.monotonic() < deadline, "the new principal was never taken"
            time.sleep(0.05)
        # a file that does not parse: the ACL in force stays
        acl.write_text("[principal broken]\nroles = nonsense\n")
        os.kill(p.pid, signal.SIGHUP)
        time.sleep(0.3)  # nothing to wait for: nothing may change
        assert call(certs, port, "/instances", token=late)[0] == 200
        assert call(certs, port, "/instances", who="reader-a")[0] == 200
    finally:
        assert p.stop() == 0
