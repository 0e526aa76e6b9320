"""Mooncake's tenant quota admin API, /api/v1/tenant_quotas, on the master's HTTP port.

Everything runs for real on 127.0.0.1: kvpool-master with TLS 1.3, an ACL whose [tenant
NAME] sections give quotas (test_tenants.py's TenantMaster and principals), `kvpool
serve` segments, library clients of tenant principals, and the HTTPS port read and
written with an admin's bearer token. Mooncake's memory quota is kvpool's max-dram.

Covered:
 1. GET (the list, one tenant) shows what is charged: charged_bytes equals the bytes put
    x replicas, per tenant, as /metrics says; an unknown tenant 404 OBJECT_NOT_FOUND;
 2. PUT lowers a quota below usage: the next put fails (kvpool.ERR_QUOTA; -200
    NO_AVAILABLE_HANDLE through mooncake.store), every object still reads back its
    bytes; PUT raises it: puts succeed again; a SIGHUP reload of an ACL with another
    max-dram leaves the API's quota (and takes the file's other changes);
 3. DELETE of a tenant with objects: 409 TENANT_NOT_EMPTY, nothing changes; of an empty
    one: 200, admission closed, every put refused (and counted) until a PUT reopens it;
    DELETE of a tenant with no explicit policy: 404;
 4. bad requests: a body without the field, 0, 2^63, 2^64, -1, 1.5, not JSON, another
    field; a tenant_id missing, with bad characters, too long: 400 INVALID_PARAMS in
    Mooncake's shape, and the master goes on serving; 2^63 - 1 is taken; other methods
    405;
 5. who may: a tenant principal (token) 403, no token or a wrong one 401, each counted in
    kvpool_http_refused_total; nothing changed; no token in a reply or the log;
 6. without an ACL (no tenants: Mooncake's multi-tenant mode off): 409
    UNAVAILABLE_IN_CURRENT_MODE for GET, PUT and DELETE;
 7. HA: a policy set and one deleted on the leader survive its death: the standby answers
    503 while it stands by, then, leading, has both (from etcd) and enforces them; a change
    etcd does not take (etcd frozen) is 500 PERSISTENT_FAIL; a leader paused past its lease
    that steps down and later leads again has the ACL's tenants and the newer policies.
"""

import json
import os
import signal
import urllib.error
import urllib.request

import pytest

import kvpool
from conftest import Proc, _bin, free_port, freeze, metric
from test_ops_http import etcd  # noqa: F401 (fixture)
from test_security import (certs, close_all, no_ambient_credentials,  # noqa: F401 (fixtures)
                           poll, tls_client_ctx)
from test_tenants import (PRINCIPALS, TOKENS, TenantMaster, make_master,  # noqa: F401
                          quota_error)

ERR_QUOTA = getattr(kvpool, "ERR_QUOTA", -39)
KiB, MiB = 1024, 1024 * 1024
API = "/api/v1/tenant_quotas"
Q63 = 2 ** 63


def call(m, method, query="", body=None, token=TOKENS["admin"], raw=None):
    """(status, parsed JSON or text) of METHOD /api/v1/tenant_quotas?QUERY on m's HTTPS
    port. body: a dict sent as JSON; raw: bytes sent as they are."""
    m.http("/health")  # finds out whether the port speaks TLS
    url = f"{'https' if m._https else 'http'}://127.0.0.1:{m.http_port}{API}"
    if query:
        url += "?" + query
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if token and m._https:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    ctx = tls_client_ctx(m.certs.ca) if m._https else None
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def ok(m, method, query="", body=None):
    status, j = call(m, method, query, body)
    assert status == 200, (method, query, body, status, j)
    assert j["success"] is True, j
    return j["data"]


def mc_error(status_body, status, code, message=None):
    """A Mooncake error reply: HTTP status, {"success":false,"error_code","error_message"}."""
    st, j = status_body
    assert st == status, (st, j)
    assert isinstance(j, dict) and set(j) == {"success", "error_code", "error_message"}, j
    assert j["success"] is False and j["error_code"] == code, j
    if message is not None:
        assert message in j["error_message"], j
    return j["error_message"]


def snap(m, tenant):
    return ok(m, "GET", f"tenant_id={tenant}")


SNAPSHOT_KEYS = {"tenant_id", "requested_quota_bytes", "effective_quota_bytes", "charged_bytes",
                 "admission_closed", "over_quota", "has_explicit_policy"}


# ---- 1. GET shows what is charged ----

def test_list_and_get_match_usage(make_master):
    m = make_master({"team-a": {"max-dram": "4MiB"}}, segments=("32MiB", "32MiB"))
    with m.client("alice") as alice, m.client("bob") as bob:
        objs = {f"u@{i}": os.urandom(100_000 + i) for i in range(3)}
        for k, v in objs.items():
            alice.put(k, v)
        twice = os.urandom(50_000)
        alice.put("u@two", twice, replicas=2)
        bob.put("b@1", os.urandom(70_000))
        want_a = sum(len(v) for v in objs.values()) + 2 * len(twice)

        data = ok(m, "GET")
        print("\nGET", API, json.dumps(data)[:700])
        assert [d["tenant_id"] for d in data] == sorted(d["tenant_id"] for d in data)
        by = {d["tenant_id"]: d for d in data}
        assert {"default", "team-a", "team-b", "team-c"} <= set(by), by
        for d in data:
            assert set(d) == SNAPSHOT_KEYS, d
        assert by["team-a"] == {"tenant_id": "team-a", "requested_quota_bytes": 4 * MiB,
                                "effective_quota_bytes": 4 * MiB, "charged_bytes": want_a,
                                "admission_closed": False, "over_quota": False,
                                "has_explicit_policy": True}
        # no max-dram: no explicit policy, nothing refused
        assert by["team-b"] == {"tenant_id": "team-b", "requested_quota_bytes": 0,
                                "effective_quota_bytes": 0, "charged_bytes": 70_000,
                                "admission_closed": False, "over_quota": False,
                                "has_explicit_policy": False}
        assert snap(m, "team-a") == by["team-a"]
        assert snap(m, "team-a")["charged_bytes"] == m.tm("kvpool_tenant_bytes", "team-a", "dram")
        alice.remove("u@two")
        assert snap(m, "team-a")["charged_bytes"] == want_a - 2 * len(twice)
        mc_error(call(m, "GET", "tenant_id=nobody-here"), 404, -704, "OBJECT_NOT_FOUND")
        mc_error(call(m, "GET", "tenant_id=bad%20name!"), 400, -600, "Invalid tenant_id")
        # ?tenant_id= empty: the list, as Mooncake
        assert ok(m, "GET", "tenant_id=") == ok(m, "GET")


# ---- 2. PUT lowers and raises a quota ----

def test_put_lowers_below_usage_then_raises(make_master, monkeypatch):
    m = make_master({"team-a": {"max-dram": "4MiB", "max-objects": 100}})
    chunk = 256 * KiB
    with m.client("alice") as alice:
        data = {f"q@{i}": os.urandom(chunk) for i in range(6)}  # 1.5 MiB
        for k, v in data.items():
            alice.put(k, v)
        before = m.tm("kvpool_tenant_puts_refused_total", "team-a")
        d = ok(m, "PUT", "tenant_id=team-a", {"requested_quota_bytes": MiB})
        assert d["requested_quota_bytes"] == d["effective_quota_bytes"] == MiB
        assert d["charged_bytes"] == 6 * chunk
        assert d["over_quota"] is True and d["admission_closed"] is False
        assert d["has_explicit_policy"] is True
        assert m.tm("kvpool_tenant_quota_bytes", "team-a", "dram") == MiB
        msg = quota_error(alice.put, "q@new", b"x")
        assert "team-a" in msg and "max-dram" in msg, msg
        assert not alice.exists("q@new")
        for k, v in data.items():  # charged usage untouched: every object reads back
            assert alice.get(k) == v, k
        assert m.tm("kvpool_tenant_puts_refused_total", "team-a") == before + 1

        # through mooncake.store: Mooncake's code for a full tenant
        from mooncake.store import MooncakeDistributedStore
        monkeypatch.setenv("KVPOOL_TLS_CA", m.certs.ca)
        monkeypatch.setenv("KVPOOL_TOKEN", TOKENS["alice"])
        store = MooncakeDistributedStore()
        assert store.setup("127.0.0.1", "", 0, 16 * MiB, "tcp", "", m.addr) == 0
        try:
            assert store.put("q@mc", b"y" * 1000) == -200  # NO_AVAILABLE_HANDLE
            assert store.get("q@0") == data["q@0"]
            # raised: puts succeed again, on both paths
            d = ok(m, "PUT", "tenant_id=team-a", {"requested_quota_bytes": 8 * MiB})
            assert d["requested_quota_bytes"] == 8 * MiB and d["over_quota"] is False
            assert store.put("q@mc", b"y" * 1000) == 0
        finally:
            store.close()
        alice.put("q@new", b"fits now")
        assert alice.get("q@new") == b"fits now"
        assert snap(m, "team-a")["charged_bytes"] == 6 * chunk + 1000 + len(b"fits now")

        # a SIGHUP reload: the file's max-dram (2 MiB now) does not undo the API's 8 MiB;
        # the file's other settings (max-objects 8) are taken
        m.reload_tenants({"team-a": {"max-dram": "2MiB", "max-objects": 8}})
        d = snap(m, "team-a")
        assert d["requested_quota_bytes"] == 8 * MiB, d
        assert m.tm("kvpool_tenant_quota_objects", "team-a") == 8
        quota_error(alice.put, "q@ninth", b"z")  # 8 objects: at max-objects
        assert TOKENS["alice"] not in m.log_text()


# ---- 3. DELETE ----

def test_delete_needs_an_empty_tenant_then_closes_admission(make_master):
    m = make_master({"team-a": {"max-dram": "4MiB"}})
    with m.client("alice") as alice, m.client("admin") as adm:
        alice.put("d@1", b"one")
        alice.put("d@2", os.urandom(10_000))
        mc_error(call(m, "DELETE", "tenant_id=team-a"), 409, -1702, "TENANT_NOT_EMPTY")
        assert snap(m, "team-a")["requested_quota_bytes"] == 4 * MiB
        alice.put("d@3", b"still admitted")
        # team-b has no max-dram: no explicit policy to delete
        mc_error(call(m, "DELETE", "tenant_id=team-b"), 404, -704, "OBJECT_NOT_FOUND")
        mc_error(call(m, "DELETE", "tenant_id=nobody-here"), 404, -704)

        alice.remove("d@1")
        mc_error(call(m, "DELETE", "tenant_id=team-a"), 409, -1702)  # two left
        assert adm.remove_by_regex("^d@", force=True) == 2  # an admin's: every tenant's
        assert snap(m, "team-a")["charged_bytes"] == 0
        status, j = call(m, "DELETE", "tenant_id=team-a")
        assert (status, j) == (200, {"success": True, "data": None}), (status, j)
        d = snap(m, "team-a")
        assert d["admission_closed"] is True and d["has_explicit_policy"] is False, d
        assert d["requested_quota_bytes"] == d["effective_quota_bytes"] == 0
        assert m.tm("kvpool_tenant_admission_closed", "team-a") == 1
        before = m.tm("kvpool_tenant_puts_refused_total", "team-a")
        msg = quota_error(alice.put, "d@after", b"refused")
        assert "admission is closed" in msg, msg
        assert not alice.exists("d@after")
        assert m.tm("kvpool_tenant_puts_refused_total", "team-a") == before + 1
        # another tenant is not touched
        with m.client("bob") as bob:
            bob.put("b@ok", b"bob's")
            assert bob.get("b@ok") == b"bob's"
        # deleted already: nothing to delete
        mc_error(call(m, "DELETE", "tenant_id=team-a"), 404, -704)
        # a PUT opens it again
        d = ok(m, "PUT", "tenant_id=team-a", {"requested_quota_bytes": MiB})
        assert d["admission_closed"] is False and d["has_explicit_policy"] is True
        assert m.tm("kvpool_tenant_admission_closed", "team-a") == 0
        alice.put("d@after", b"admitted")
        assert alice.get("d@after") == b"admitted"


# ---- 4. bad requests ----

@pytest.mark.parametrize("raw, why", [
    (b"{}", "requested_quota_bytes is missing"),
    (b'{"requested_quota_bytes":0}', "[1, 2^63 - 1]"),
    (b'{"requested_quota_bytes":%d}' % Q63, "[1, 2^63 - 1]"),
    (b'{"requested_quota_bytes":%d}' % (2 ** 64), "out of range"),
    (b'{"requested_quota_bytes":-1}', "unsigned integer"),
    (b'{"requested_quota_bytes":1.5}', "unsigned integer"),
    (b'{"requested_quota_bytes":"1024"}', "unsigned integer"),
    (b'{"requested_quota_bytes":1024,"extra":1}', "unknown field"),
    (b"requested_quota_bytes=1024", "Invalid JSON body"),
    (b"", "Invalid JSON body"),
    (b'{"requested_quota_bytes":1024} x', "Invalid JSON body"),
])
def test_bad_body_is_400(make_master, raw, why):
    m = make_master({"team-a": {"max-dram": "4MiB"}}, segments=())
    msg = mc_error(call(m, "PUT", "tenant_id=team-a", raw=raw), 400, -600, why)
    assert "Invalid JSON body" in msg or "Tenant quota must be in" in msg, msg
    assert snap(m, "team-a")["requested_quota_bytes"] == 4 * MiB  # unchanged
    assert m.master.p.poll() is None


def test_bad_tenant_and_method(make_master):
    m = make_master({"team-a": {"max-dram": "4MiB"}}, segments=())
    body = {"requested_quota_bytes": MiB}
    for q in ("", "tenant_id=", "tenant_id=bad%20name!", "tenant_id=a%2Fb", "tenant_id=%1Fx",
              "tenant_id=" + "t" * 64):
        for method in ("PUT", "DELETE"):
            mc_error(call(m, method, q, body if method == "PUT" else None), 400, -600,
                     "Missing or invalid tenant_id")
    mc_error(call(m, "GET", "tenant_id=" + "t" * 64), 400, -600, "Invalid tenant_id")
    # the largest quota is taken; a new (valid) tenant name is made
    d = ok(m, "PUT", "tenant_id=team-new", {"requested_quota_bytes": Q63 - 1})
    assert d["tenant_id"] == "team-new" and d["requested_quota_bytes"] == Q63 - 1
    assert "team-new" in {x["tenant_id"] for x in ok(m, "GET")}
    status, text = call(m, "POST", "tenant_id=team-a", body)
    assert status == 405, (status, text)
    status, _ = call(m, "PATCH", "tenant_id=team-a", body)
    assert status == 405
    # the other views take no PUT or DELETE
    st, _ = m.http("/health")
    assert st == 200
    req = urllib.request.Request(f"https://127.0.0.1:{m.http_port}/api/v1/keys", method="DELETE",
                                 headers={"Authorization": f"Bearer {TOKENS['admin']}"})
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=10, context=tls_client_ctx(m.certs.ca))
    assert ei.value.code == 405
    assert snap(m, "team-a")["requested_quota_bytes"] == 4 * MiB


# ---- 5. who may ----

def test_only_an_admin(make_master):
    m = make_master({"team-a": {"max-dram": "4MiB"}}, segments=())
    text = m.metrics()
    role0 = metric(text, "kvpool_http_refused_total", {"reason": "role"})
    unauth0 = metric(text, "kvpool_http_refused_total", {"reason": "unauthenticated"})
    body = {"requested_quota_bytes": 1}
    for method, b in (("GET", None), ("PUT", body), ("DELETE", None)):
        st, j = call(m, method, "tenant_id=team-a", b, token=TOKENS["alice"])
        assert st == 403 and "not an admin" in j["error"], (method, st, j)
        assert TOKENS["alice"] not in json.dumps(j)
        st, j = call(m, method, "", b, token=TOKENS["carol"])  # the list too
        assert st == 403, (method, st, j)
        st, j = call(m, method, "tenant_id=team-a", b, token=None)
        assert st == 401 and "authentication required" in j["error"], (method, st, j)
        st, j = call(m, method, "tenant_id=team-a", b, token="not-a-token-" + TOKENS["alice"])
        assert st == 401, (method, st, j)
        assert TOKENS["alice"] not in json.dumps(j)
    text = m.metrics()
    assert metric(text, "kvpool_http_refused_total", {"reason": "role"}) == role0 + 6
    assert metric(text, "kvpool_http_refused_total", {"reason": "unauthenticated"}) == unauth0 + 6
    d = snap(m, "team-a")  # nothing changed
    assert d["requested_quota_bytes"] == 4 * MiB and d["admission_closed"] is False
    log = m.log_text()
    for t in TOKENS.values():
        assert t not in log
    assert "audit: tenant" not in log  # no change was made


# ---- 6. without an ACL ----

def test_without_an_acl_409(tmp_path):
    port = free_port()
    p = Proc([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
              "--log-level", "error", "--http-listen", f"127.0.0.1:{port}"])
    try:
        class Plain:
            http_port, _https, certs = port, False, None

            def http(self, path):
                return 200, ""
        m = Plain()
        for method, q, b in (("GET", "", None), ("GET", "tenant_id=team-a", None),
                             ("PUT", "tenant_id=team-a", {"requested_quota_bytes": MiB}),
                             ("DELETE", "tenant_id=team-a", None)):
            st, j = call(m, method, q, b, token=None)
            assert (st, j) == (409, {"success": False, "error_code": -1011,
                                     "error_message": "UNAVAILABLE_IN_CURRENT_MODE"}), (method, j)
        with kvpool.Client(p.ready) as c:  # and the master serves on
            assert not c.exists("plain@1")
    finally:
        assert p.stop() == 0


# ---- 7. HA: the policies survive a failover ----

class HAMaster(TenantMaster):
    extra_args = ()

    def __init__(self, certs, workdir, tenants, etcd, cluster):
        self.extra_args = ("--etcd", etcd, "--cluster", cluster, "--leader-ttl", "2")
        super().__init__(certs, workdir, PRINCIPALS, tenants)


def test_policies_survive_a_failover(certs, etcd, tmp_path):  # noqa: F811
    tenants = {"team-a": {"max-dram": "4MiB"}, "team-c": {"max-dram": "4MiB"}}
    cluster = f"tq{os.getpid()}"
    made, killed = [], []
    try:
        for i in range(2):
            d = tmp_path / f"m{i}"
            d.mkdir()
            made.append(HAMaster(certs, str(d), tenants, etcd, cluster))
            if i == 0:
                poll(lambda: made[0].http("/health")[0] == 200, "the first master leads", 20)
        leader, standby = made
        d = ok(leader, "PUT", "tenant_id=team-a", {"requested_quota_bytes": 3 * MiB})
        assert d["requested_quota_bytes"] == 3 * MiB
        status, j = call(leader, "DELETE", "tenant_id=team-c")
        assert (status, j) == (200, {"success": True, "data": None})
        # a standby: 503, Mooncake's words
        mc_error(call(standby, "GET"), 503, -1011, "service plane is not active")
        mc_error(call(standby, "PUT", "tenant_id=team-a", {"requested_quota_bytes": 1}), 503,
                 -1011)
        leader.master.kill()  # SIGKILL: no resignation, the lease has to run out
        killed.append(leader)
        poll(lambda: standby.http("/health")[0] == 200, "the standby leads", 30, 0.1)
        a, c = snap(standby, "team-a"), snap(standby, "team-c")
        assert a["requested_quota_bytes"] == 3 * MiB and a["has_explicit_policy"], a
        assert c["admission_closed"] is True and c["has_explicit_policy"] is False, c
        assert "tenant quota policies from etcd" in standby.log_text()
        with standby.client("alice") as alice:
            quota_error(alice.put, "ha@big", os.urandom(3 * MiB + 1))
        with standby.client("carol") as carol:
            assert "admission is closed" in quota_error(carol.put, "c@x", b"x")
    finally:
        for m in killed:
            m._log.close()
        close_all([m for m in made if m not in killed])


def etcd_pid(addr):
    """The PID of the etcd this test's fixture started at addr (its command line names it)."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"etcd") and f"http://{addr}".encode() in argv:
                return int(pid)
    raise AssertionError(f"no etcd at {addr}")


def test_a_change_etcd_does_not_take_is_500(certs, etcd, tmp_path):  # noqa: F811
    d = tmp_path / "m"
    d.mkdir()
    m = HAMaster(certs, str(d), {"team-a": {"max-dram": "4MiB"}}, etcd, f"tqp{os.getpid()}")
    pid = etcd_pid(etcd)
    try:
        poll(lambda: m.http("/health")[0] == 200, "the master leads", 20)
        ok(m, "PUT", "tenant_id=team-a", {"requested_quota_bytes": 3 * MiB})
        freeze(pid)
        try:
            msg = mc_error(call(m, "PUT", "tenant_id=team-a", {"requested_quota_bytes": 2 * MiB}),
                           500, -1503, "etcd did not save it")
            assert "new leader would not have it" in msg
        finally:
            os.kill(pid, signal.SIGCONT)
        assert "etcd did not take it" in m.log_text()
        # etcd back: the same PUT goes through (once the master serves again)
        poll(lambda: call(m, "PUT", "tenant_id=team-a",
                          {"requested_quota_bytes": 2 * MiB})[0] == 200, "a PUT saved", 20, 0.2)
    finally:
        close_all([m])


def test_a_master_that_leads_again(certs, etcd, tmp_path):  # noqa: F811
    """A leader paused past its lease steps down when it wakes (its state dropped) and,
    when it leads again, has the ACL's tenants and the API's policies as etcd has them
    (the newer ones, set on the other leader meanwhile)."""
    tenants = {"team-a": {"max-dram": "4MiB"}, "team-b": {"max-objects": 10},
               "team-c": {"max-dram": "4MiB"}}
    cluster = f"tqr{os.getpid()}"
    made, killed = [], []
    try:
        for i in range(2):
            d = tmp_path / f"m{i}"
            d.mkdir()
            made.append(HAMaster(certs, str(d), tenants, etcd, cluster))
            if i == 0:
                poll(lambda: made[0].http("/health")[0] == 200, "the first master leads", 20)
        first, second = made
        ok(first, "PUT", "tenant_id=team-a", {"requested_quota_bytes": 3 * MiB})
        freeze(first.pid)
        try:
            poll(lambda: second.http("/health")[0] == 200, "the second master leads", 30, 0.1)
            ok(second, "PUT", "tenant_id=team-a", {"requested_quota_bytes": 5 * MiB})
            assert call(second, "DELETE", "tenant_id=team-c")[0] == 200
        finally:
            os.kill(first.pid, signal.SIGCONT)
        poll(lambda: "stepping down" in first.log_text(), "the first one steps down", 20, 0.1)
        second.master.kill()
        killed.append(second)
        poll(lambda: first.http("/health")[0] == 200, "the first master leads again", 30, 0.1)
        by = {x["tenant_id"]: x for x in ok(first, "GET")}
        assert by["team-a"]["requested_quota_bytes"] == 5 * MiB, by
        assert by["team-c"]["admission_closed"] is True, by
        # the ACL's tenants are back (a state started afresh knew only "default")
        assert "team-b" in by and by["team-b"]["has_explicit_policy"] is False, by
        assert first.tm("kvpool_tenant_quota_objects", "team-b") == 10
        with first.client("carol") as carol:
            assert "admission is closed" in quota_error(carol.put, "c@x", b"x")
    finally:
        for m in killed:
            m._log.close()
        close_all([m for m in made if m not in killed])
