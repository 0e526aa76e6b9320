"""Mooncake's tenant_id, honoured: a key namespace without a credential that binds a tenant,
the principal's own tenant (or refused) with one.

Everything runs for real on 127.0.0.1: kvpool-master and a `kvpool serve` segment, with no
TLS for the namespaces (a master of this module's own, whatever the suite's TLS pass sets),
and with TLS 1.3 and an ACL (test_tenants.py's TenantMaster and principals) for the
credential cases.

Covered:
 1. mooncake.store, as SGLang's MooncakeStore uses it: stores of tenant_id x and y on one
    pool; y's is_exist and get of x's key miss, y's put of the same key is its own object
    (not "exists"), each reads its own bytes back, y's remove leaves x's; a store of no
    tenant_id sees neither; batch_is_exist likewise; KVPOOL_TENANT_ID names the tenant of
    a store that gives none;
 2. kvpool.Client(tenant_id=): get, size, exists, batch_exists, remove, list_keys,
    remove_by_regex and remove_all of x never see y's or the default namespace's keys,
    and list_keys shows x's keys as x gave them; a key of 4096 bytes is one in x too;
 3. no key is another namespace's: a client of no tenant_id that writes x's stored form
    (`x\\x1fk`) and a client of y that writes it both get objects of their own, and x's
    `k` keeps its bytes;
 4. a tenant_id that is no tenant name is refused at create (INVALID_ARG, the message);
 5. with TLS and an ACL: a tenant_id other than the credential's tenant is refused at
    create with DENIED and a message naming both tenants, for a token (alice) and for a
    certificate (bob); the credential's own tenant_id is taken and sees the tenant's
    keys; mooncake.store's setup() returns -601 and logs why; the master serves on.
"""

import logging
import os

import pytest

import kvpool
from conftest import Proc, _bin, stop_all
from test_security import certs, no_ambient_credentials, poll  # noqa: F401 (fixtures)
from test_tenants import PRINCIPALS, TOKENS, make_master  # noqa: F401 (fixture)

SEP = "\x1f"


@pytest.fixture(autouse=True)
def no_tenant_env(monkeypatch):
    monkeypatch.delenv("KVPOOL_TENANT_ID", raising=False)


@pytest.fixture
def plain_pool(request):
    """A master with no TLS and no ACL (this test's own) and one 64 MiB segment."""
    master = Proc([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
                   "--log-level", "error", "--lease-ttl", "0"])
    procs = [master]
    try:
        procs.insert(0, Proc([_bin("KVPOOL_CLI_BIN"), "--master", master.ready, "serve",
                              "--segment-size", "64MiB", "--ready-fd", "{fd}"]))
    except Exception:
        stop_all(procs)
        raise

    def fin():
        bad = stop_all(procs)
        assert not bad, f"children exited non-zero: {bad}"

    request.addfinalizer(fin)
    return master.ready


def mc_store(addr, **kw):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", addr, **kw)
    return s, rc


# ---- 1. mooncake.store ----

def test_mooncake_stores_of_two_tenant_ids(plain_pool, monkeypatch):
    (sx, rx), (sy, ry), (sd, rd) = (mc_store(plain_pool, tenant_id="x"),
                                    mc_store(plain_pool, tenant_id="y"), mc_store(plain_pool))
    try:
        assert (rx, ry, rd) == (0, 0, 0)
        key = "sglang@page-0001"
        bx, by = os.urandom(50_001), os.urandom(40_003)
        assert sx.put(key, bx) == 0
        # SGLang's check before its write: y must not see x's page
        assert sy.is_exist(key) == 0
        assert sy.batch_is_exist([key, "nope"]) == [0, 0]
        assert sy.get(key) == b""
        assert sd.is_exist(key) == 0
        assert sy.put(key, by) == 0
        assert sx.get(key) == bx and sy.get(key) == by
        assert sx.get_size(key) == len(bx) and sy.get_size(key) == len(by)
        assert sy.remove(key) == 0
        assert sy.is_exist(key) == 0 and sx.get(key) == bx
        # KVPOOL_TENANT_ID names the tenant of a store that gives none
        monkeypatch.setenv("KVPOOL_TENANT_ID", "x")
        se, re_ = mc_store(plain_pool)
        try:
            assert re_ == 0 and se.get(key) == bx
        finally:
            se.close()
    finally:
        for s in (sx, sy, sd):
            s.close()


# ---- 2. and 3. kvpool.Client ----

def test_kvpool_namespaces_see_their_own_keys(plain_pool):
    with kvpool.Client(plain_pool, tenant_id="x") as x, \
            kvpool.Client(plain_pool, tenant_id="y") as y, kvpool.Client(plain_pool) as d:
        data = {c: os.urandom(1000 + i) for i, c in enumerate("xyd")}
        for c, cl in (("x", x), ("y", y), ("d", d)):
            cl.put("ns@a", data[c])
            cl.put(f"ns@only-{c}", data[c])
        for c, cl in (("x", x), ("y", y), ("d", d)):
            assert cl.get("ns@a") == data[c]
            assert cl.size("ns@a") == len(data[c])
            assert cl.batch_exists([f"ns@only-{o}" for o in "xyd"]) == [o == c for o in "xyd"]
        # listings of a tenant_id: its keys, as it gave them
        assert sorted(e["key"] for e in x.list_keys("^ns@")) == ["ns@a", "ns@only-x"]
        assert sorted(e["key"] for e in y.list_keys("only")) == ["ns@only-y"]
        # removal by pattern and of all: the namespace's own keys only
        assert y.remove_by_regex("^ns@a$") == 1
        assert x.get("ns@a") == data["x"] and d.get("ns@a") == data["d"]
        assert x.remove_all() == 2
        assert not x.exists("ns@only-x")
        assert y.get("ns@only-y") == data["y"] and d.get("ns@a") == data["d"]
        y.remove("ns@only-y")
        assert d.get("ns@only-d") == data["d"]
        # the longest key is one in a namespace too (its prefix is not the key's)
        long_key = "L" * 4096
        x.put(long_key, b"long")
        assert x.get(long_key) == b"long" and not y.exists(long_key)


def test_no_key_is_another_namespaces(plain_pool):
    with kvpool.Client(plain_pool, tenant_id="x") as x, \
            kvpool.Client(plain_pool, tenant_id="y") as y, kvpool.Client(plain_pool) as d:
        mine = os.urandom(4096)
        x.put("k", mine)
        forged = "x" + SEP + "k"  # x's key as the master stores it
        d.put(forged, b"from default")  # not ERR_EXISTS: an object of the default namespace
        y.put(forged, b"from y")
        assert x.get("k") == mine
        assert d.get(forged) == b"from default" and y.get(forged) == b"from y"
        assert not x.exists(forged)
        d.remove(forged)
        y.remove(forged)
        assert x.get("k") == mine


def test_a_tenant_id_that_is_no_name_is_refused(plain_pool):
    for bad in ("team a", "a\x01b", "x" * 64, "caf\u00e9", "a/b"):
        with pytest.raises(kvpool.Error) as ei:
            kvpool.Client(plain_pool, tenant_id=bad)
        assert ei.value.status == kvpool.ERR_INVALID_ARG
        assert "tenant_id (KVPOOL_TENANT_ID) must be a tenant's name" in str(ei.value)
    with kvpool.Client(plain_pool, tenant_id="default") as c:  # Mooncake's default: none
        c.put("dflt@1", b"1")
        with kvpool.Client(plain_pool) as d:
            assert d.get("dflt@1") == b"1"


# ---- 5. with a credential that binds a tenant ----

def test_tenant_id_against_the_credential(make_master, caplog, monkeypatch):
    m = make_master()
    with m.client("alice") as alice:
        alice.put("cred@1", b"team-a's")
        for name, other in (("alice", "team-b"), ("bob", "team-a")):
            mine = PRINCIPALS[name]["tenant"]
            with pytest.raises(kvpool.Error) as ei:
                m.client(name, tenant_id=other)
            msg = str(ei.value)
            print(f"\n{name}, tenant_id {other}: {msg}")
            assert ei.value.status == kvpool.ERR_DENIED, msg
            assert f"tenant_id {other} is not this client's tenant" in msg
            assert f"principal {name} of tenant {mine}" in msg
        with m.client("alice", tenant_id="team-a") as a2, m.client("bob", tenant_id="team-b") as b:
            assert a2.get("cred@1") == b"team-a's"  # the tenant's own keys, as without it
            assert not b.exists("cred@1")
        # mooncake.store: the same refusal, as its code, and why in the log
        monkeypatch.setenv("KVPOOL_TLS_CA", m.certs.ca)
        monkeypatch.setenv("KVPOOL_TOKEN", TOKENS["alice"])
        with caplog.at_level(logging.WARNING, logger="mooncake.store"):
            s, rc = mc_store(m.addr, tenant_id="team-b")
        s.close()
        assert rc == -601, rc
        assert "tenant_id team-b is not this client's tenant" in caplog.text
        s, rc = mc_store(m.addr, tenant_id="team-a")
        try:
            assert rc == 0 and s.get("cred@1") == b"team-a's"
        finally:
            s.close()
        assert alice.get("cred@1") == b"team-a's"  # the master serves on
