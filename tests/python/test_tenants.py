"""Tenants of one pool, as their users see them: keys scoped per tenant, quotas of bytes
and objects (kvpool.ERR_QUOTA, refunded when an object goes), segments dedicated to a
tenant, and eviction that takes from the tenants over their share of DRAM first.

Everything runs for real on 127.0.0.1: kvpool-master with TLS 1.3 and an ACL file whose
[principal NAME] sections name each principal's tenant and whose [tenant NAME] sections
give quotas (max-dram, max-objects) and shares, `kvpool serve` segments mounted over
mutual TLS (principal segsrv), and library clients mounting segments of their own. The
machinery (certificates by deploy/make-certs.sh, class SecureMaster, its HTTPS views read
with an admin's bearer token) is test_security.py's.

Covered (in this order):
 1. the same key in two tenants: two objects, each tenant reads its own bytes, exists()
    differs per tenant, one tenant's remove leaves the other's; the admin's list_keys()
    and the HTTP keys view (/api/v1/keys) show both, labelled with their tenant; a
    tenant's remove_by_regex removes its own only, an admin's every tenant's;
 2. a quota of bytes (max-dram = 1MiB): 256 KiB puts fit up to it, the next is refused
    (ERR_QUOTA, naming the tenant and max-dram) and leaves nothing; the tenant's byte and
    object gauges equal what is stored; a remove refunds (a put fits again); another
    tenant is unaffected; a put of 2 replicas is charged twice its size;
 3. a quota of objects (max-objects = 50) from 8 threads with a client each, 160 puts at
    once: exactly 50 stored, 110 refused with ERR_QUOTA, the gauges and the refusal
    counter say so;
 4. refund on eviction: on one 8 MiB segment, a tenant's objects evicted by another
    tenant's puts are no longer charged (the gauges equal what is still readable);
 5. a segment dedicated to team-a: alice's objects are placed there, bob's never; a
    principal of team-b may not mount a segment dedicated to team-a (DENIED), neither
    through the library nor through `kvpool serve --tenant`; unmounting the dedicated
    segment refunds team-a's objects that were on it;
 6. tenant shares under eviction: on one 8 MiB segment, team-a's working set (~40 % of
    DRAM, never read) survives a burst of 3x DRAM of team-b's puts, whose oldest go;
    kvpool_evicted_share_total counts it;
 7. a SIGHUP reload raising max-objects from 5 to 10: puts 6..10 then fit, the 11th not.

Two product bugs found while writing these are fixed and checked here: the HTTP keys
view called a stored object "pending", and a refused dedicated mount was reported with
the generic protected-mode text, not the master's reason.

Each test runs a master of its own (fixture `make_master`): quotas and gauges start at
zero, and reloads touch no one else.
"""

import json
import os
import signal
import subprocess
import threading
import urllib.parse
import uuid

import pytest

import kvpool
from conftest import metric
from test_security import (SecureMaster, acl_text, certs, close_all,  # noqa: F401 (fixtures)
                           denied, no_ambient_credentials, poll)

ERR_QUOTA = getattr(kvpool, "ERR_QUOTA", -39)
DENIED = kvpool.ERR_DENIED
KiB, MiB = 1024, 1024 * 1024

_RUN = uuid.uuid4().hex[:10]
TOKENS = {n: f"{n}-tenant-tok-{_RUN}" for n in ("admin", "alice", "carol", "aseg", "bseg")}

PRINCIPALS = {
    "admin": dict(roles="admin", cn="admin", token=TOKENS["admin"]),
    "segsrv": dict(roles="segment", cn="segsrv"),
    # no key patterns: the tenant, not a pattern, keeps their keys apart
    "alice": dict(tenant="team-a", roles="read, write", token=TOKENS["alice"]),
    "bob": dict(tenant="team-b", roles="read, write", cn="bob"),
    "carol": dict(tenant="team-c", roles="read, write", token=TOKENS["carol"]),
    # segment servers of a tenant
    "aseg": dict(tenant="team-a", roles="segment", token=TOKENS["aseg"]),
    "bseg": dict(tenant="team-b", roles="segment", token=TOKENS["bseg"]),
    "segthief": dict(tenant="team-b", roles="segment", cn="segthief"),
}


def tenant_text(tenants):
    out = []
    for name, t in tenants.items():
        out.append(f"[tenant {name}]")
        out += [f"{k} = {v}" for k, v in t.items()]
        out.append("")
    return "\n".join(out)


class TenantMaster(SecureMaster):
    """SecureMaster with [tenant NAME] sections in its ACL and this module's principals."""

    def __init__(self, certs, workdir, principals, tenants):
        self.tenants = dict(tenants)
        super().__init__(certs, workdir, principals)

    def _start_master(self, certs):
        with open(self.acl_path, "w") as f:  # (SecureMaster wrote the principals only)
            f.write(acl_text(self.principals) + "\n" + tenant_text(self.tenants))
        return super()._start_master(certs)

    def client(self, name, **kw):
        p = PRINCIPALS[name]
        if "cn" in p:
            crt, key = self.certs.pair(p["cn"])
            return kvpool.Client(self.addr, tls_ca=self.certs.ca, tls_cert=crt, tls_key=key, **kw)
        return kvpool.Client(self.addr, tls_ca=self.certs.ca, token=p["token"], **kw)

    def reload_tenants(self, tenants):
        """Rewrite the ACL with new tenant sections, SIGHUP, and wait until a canary
        principal only the new file names gets in."""
        self._reloads += 1
        canary = f"tenant-canary-{_RUN}-{self._reloads}"
        self.tenants = dict(tenants)
        tmp = self.acl_path + ".new"
        with open(tmp, "w") as f:
            f.write(acl_text({**self.principals, f"reload-canary-{self._reloads}":
                              dict(roles="read", token=canary)}) + "\n" + tenant_text(tenants))
        os.replace(tmp, self.acl_path)
        os.kill(self.pid, signal.SIGHUP)
        poll(lambda: self.auth_status(canary) == 0, "the master reloaded its ACL")

    def metrics(self):
        """/metrics as an admin scrapes it: the per-tenant series are an admin's (with an
        ACL and --metrics-tenants off, the default)."""
        status, text = self.http("/metrics", token=TOKENS["admin"])
        assert status == 200, text
        return text

    def admin_http(self, path):
        status, body = self.http(path, token=TOKENS["admin"])
        assert status == 200, (path, status, body)
        return json.loads(body)

    def http_keys(self, regex):
        """Every page of /api/v1/keys for regex, walked by cursor as the docs say (the
        master may cut a page short on its time budget): {"keys": all of them}."""
        keys, cursor = [], 0
        for _ in range(10000):
            q = "/api/v1/keys?" + urllib.parse.urlencode(
                {"regex": regex, "limit": 1000, "cursor": cursor})
            page = self.admin_http(q)
            keys += page["keys"]
            cursor = page["next_cursor"]
            if cursor == 0:
                return {"keys": keys, "count": len(keys)}
        raise AssertionError("/api/v1/keys never reached its end")

    def tm(self, name, tenant, tier=None, text=None):
        """A per-tenant metric's value (tier: dram/ssd where the metric has one)."""
        labels = {"tenant": tenant}
        if tier:
            labels["tier"] = tier
        return metric(text or self.metrics(), name, labels)


@pytest.fixture
def make_master(certs, tmp_path):
    """make_master(tenants, segments=("64MiB",)) -> a TenantMaster of this test's own."""
    made = []

    def make(tenants=None, segments=("64MiB",)):
        d = tmp_path / f"m{len(made)}"
        d.mkdir()
        m = TenantMaster(certs, str(d), PRINCIPALS, tenants or {})
        made.append(m)
        for size in segments:
            m.add_segment(size)
        return m

    yield make
    close_all(made)


def quota_error(fn, *args, **kw):
    """fn(*args) must raise kvpool.Error ERR_QUOTA; its message."""
    with pytest.raises(kvpool.Error) as ei:
        fn(*args, **kw)
    assert ei.value.status == ERR_QUOTA, f"{fn}: {ei.value.status} {ei.value}"
    return str(ei.value)


def by_tenant(entries):
    return {e["tenant"]: e for e in entries}


# ---- 1. the same key in two tenants ----

def test_same_key_in_two_tenants(make_master):
    m = make_master()
    key = "shared@blk-1"
    data_a, data_b = os.urandom(100_003), os.urandom(77_777)
    with m.client("admin") as adm, m.client("alice") as alice, m.client("bob") as bob:
        alice.put(key, data_a)
        bob.put(key, data_b)  # not ERR_EXISTS: another tenant's key
        assert alice.get(key) == data_a
        assert bob.get(key) == data_b
        assert alice.size(key) == len(data_a) and bob.size(key) == len(data_b)
        # the admin acts in its own tenant ("default"): neither is its object
        assert not adm.exists(key)

        listed = by_tenant(adm.list_keys("^shared@blk-1$"))
        assert set(listed) == {"team-a", "team-b"}, listed
        assert listed["team-a"]["key"] == key and listed["team-a"]["size"] == len(data_a)
        assert listed["team-b"]["key"] == key and listed["team-b"]["size"] == len(data_b)
        # a non-admin's listing: its own tenant's only, one entry
        assert [(e["key"], e["size"]) for e in alice.list_keys("^shared@")] == [
            (key, len(data_a))]

        body = m.http_keys("^shared@")
        print("\n/api/v1/keys:", json.dumps(body)[:600])
        http = [e for e in body["keys"] if e["key"] == key]
        assert sorted(e["tenant"] for e in http) == ["team-a", "team-b"], body
        assert {e["tenant"]: e["size"] for e in http} == {"team-a": len(data_a),
                                                          "team-b": len(data_b)}

        alice.remove(key)
        assert not alice.exists(key)
        assert bob.exists(key)
        assert bob.get(key) == data_b
        with pytest.raises(kvpool.Error) as ei:
            alice.get(key)
        assert ei.value.status == kvpool.ERR_NOT_FOUND, ei.value
        assert [e["tenant"] for e in adm.list_keys("^shared@blk-1$")] == ["team-b"]
        # bob's remove_by_regex sees his own only
        alice.put(key, data_a)
        assert bob.remove_by_regex("^shared@", force=True) == 1
        assert alice.get(key) == data_a and not bob.exists(key)
        # an admin's remove_by_regex acts on every tenant
        bob.put(key, data_b)
        assert adm.remove_by_regex("^shared@blk-1$", force=True) == 2
        assert not alice.exists(key) and not bob.exists(key)
        assert adm.list_keys("^shared@") == []
        text = m.metrics()
        for t in ("team-a", "team-b"):
            assert m.tm("kvpool_tenant_objects", t, text=text) == 0
            assert m.tm("kvpool_tenant_bytes", t, "dram", text) == 0


def test_default_tenant_cannot_forge_another_tenants_key(make_master):
    """The default tenant's keys are stored as their users gave them (so keys stored
    before an ACL are its own); one that reads like another tenant's stored key
    ("team-a" 0x1f KEY) is kept apart: it stays the default tenant's object."""
    m = make_master()
    forged = "team-a\x1fa@target"
    with m.client("admin") as adm, m.client("alice") as alice:
        alice.put("a@target", b"alice's own")
        adm.put(forged, b"the default tenant's")
        adm.put("plain@default-key", b"as given")
        assert alice.get("a@target") == b"alice's own"
        assert adm.get(forged) == b"the default tenant's"
        assert not adm.exists("a@target") and not alice.exists(forged)
        listed = {(e["tenant"], e["key"]) for e in adm.list_keys("target|default-key")}
        assert listed == {("team-a", "a@target"), ("default", forged),
                          ("default", "plain@default-key")}, listed
        alice.remove("a@target")
        assert adm.get(forged) == b"the default tenant's"
        assert m.tm("kvpool_tenant_objects", "default") == 2


def test_http_keys_view_shows_a_stored_object_complete(make_master):
    m = make_master()
    with m.client("alice") as alice:
        alice.put("st@done", b"stored")
        assert alice.get("st@done") == b"stored"
        [e] = m.http_keys("^st@done$")["keys"]
        assert e["tenant"] == "team-a"
        assert e["state"] == "complete", e


# ---- 2. a quota of bytes ----

def test_dram_quota_refuses_and_refunds(make_master):
    m = make_master({"team-a": {"max-dram": "1MiB"}})
    chunk = 256 * KiB
    blobs = {f"q@blk-{i}": os.urandom(chunk) for i in range(5)}
    keys = list(blobs)
    with m.client("alice") as alice, m.client("bob") as bob:
        for key in keys[:4]:
            alice.put(key, blobs[key])
        msg = quota_error(alice.put, keys[4], blobs[keys[4]])
        print(f"\nquota refusal: {msg!r}")
        assert "team-a" in msg and "max-dram" in msg, msg
        assert not alice.exists(keys[4])  # nothing left behind
        text = m.metrics()
        assert m.tm("kvpool_tenant_bytes", "team-a", "dram", text) == 4 * chunk
        assert m.tm("kvpool_tenant_objects", "team-a", text=text) == 4
        assert m.tm("kvpool_tenant_quota_bytes", "team-a", "dram", text) == 1 * MiB
        assert m.tm("kvpool_tenant_puts_refused_total", "team-a", text=text) == 1
        # a smaller put does not fit either: the quota is full to the byte
        quota_error(alice.put, "q@tiny", b"x")

        # another tenant is not held to team-a's quota
        big = os.urandom(2 * MiB)
        bob.put("q@blk-0", big)
        assert bob.get("q@blk-0") == big
        assert m.tm("kvpool_tenant_bytes", "team-b", "dram") == 2 * MiB

        # a remove refunds: the refused put fits now
        alice.remove(keys[0])
        assert m.tm("kvpool_tenant_bytes", "team-a", "dram") == 3 * chunk
        alice.put(keys[4], blobs[keys[4]])
        for key in keys[1:]:
            assert alice.get(key) == blobs[key]
        text = m.metrics()
        assert m.tm("kvpool_tenant_bytes", "team-a", "dram", text) == 4 * chunk
        assert m.tm("kvpool_tenant_objects", "team-a", text=text) == 4
        assert m.tm("kvpool_tenant_puts_refused_total", "team-a", text=text) == 2
        assert m.tm("kvpool_tenant_puts_refused_total", "team-b", text=text) == 0


def test_dram_charge_counts_each_replica(make_master):
    m = make_master({"team-a": {"max-dram": "1MiB"}}, segments=("64MiB", "64MiB"))
    chunk = 256 * KiB
    with m.client("alice") as alice, m.client("admin") as adm:
        alice.put("rep@0", os.urandom(chunk), replicas=2)
        assert [e["replicas"] for e in adm.list_keys("^rep@0$")] == [2]
        assert m.tm("kvpool_tenant_bytes", "team-a", "dram") == 2 * chunk
        alice.put("rep@1", os.urandom(chunk), replicas=2)  # 1 MiB: the quota, just
        msg = quota_error(alice.put, "rep@2", os.urandom(chunk))
        assert "team-a" in msg and "max-dram" in msg, msg
        alice.remove("rep@0")
        assert m.tm("kvpool_tenant_bytes", "team-a", "dram") == 2 * chunk
        alice.put("rep@2", os.urandom(chunk))  # one replica fits in what the remove gave back
        text = m.metrics()
        assert m.tm("kvpool_tenant_bytes", "team-a", "dram", text) == 3 * chunk
        assert m.tm("kvpool_tenant_objects", "team-a", text=text) == 2


# ---- 3. a quota of objects, from 8 threads at once ----

def test_object_quota_from_eight_threads(make_master):
    m = make_master({"team-a": {"max-objects": "50"}})
    n_threads, per_thread = 8, 20
    clients = [m.client("alice") for _ in range(n_threads)]
    ok, refused, other = [], [], []
    lock = threading.Lock()
    barrier = threading.Barrier(n_threads)

    def work(i):
        c = clients[i]
        barrier.wait()
        for j in range(per_thread):
            key = f"o@t{i}-{j}"
            try:
                c.put(key, key.encode() * 100)
                r = (ok, key)
            except kvpool.Error as e:
                r = (refused, key) if e.status == ERR_QUOTA else (other, (key, e.status, str(e)))
            with lock:
                r[0].append(r[1])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    finally:
        for c in clients:
            c.close()
    assert other == [], other[:5]
    assert len(ok) == 50 and len(refused) == 110, (len(ok), len(refused))
    text = m.metrics()
    assert m.tm("kvpool_tenant_objects", "team-a", text=text) == 50
    assert m.tm("kvpool_tenant_quota_objects", "team-a", text=text) == 50
    assert m.tm("kvpool_tenant_puts_refused_total", "team-a", text=text) == 110
    with m.client("admin") as adm, m.client("alice") as alice:
        stored = {e["key"] for e in adm.list_keys("^o@") if e["tenant"] == "team-a"}
        assert stored == set(ok)
        for key in ok[:10]:
            assert alice.get(key) == key.encode() * 100
        assert not any(alice.exists(key) for key in refused)


# ---- 4. refund on eviction ----

def test_evicted_objects_are_refunded(make_master):
    m = make_master({}, segments=("8MiB",))
    size = 1 * MiB
    a_keys = [f"ev@a-{i}" for i in range(6)]
    b_keys = [f"ev@b-{i}" for i in range(16)]
    blob = {key: os.urandom(size) for key in a_keys + b_keys}
    with m.client("alice") as alice, m.client("bob") as bob:
        for key in a_keys:
            alice.put(key, blob[key])
        assert m.tm("kvpool_tenant_bytes", "team-a", "dram") == 6 * size
        for key in b_keys:
            bob.put(key, blob[key])
        a_left = [key for key in a_keys if alice.exists(key)]
        b_left = [key for key in b_keys if bob.exists(key)]
        print(f"\nafter eviction: team-a {len(a_left)} of 6, team-b {len(b_left)} of 16")
        assert len(a_left) < len(a_keys), "nothing of team-a's was evicted"
        text = m.metrics()
        assert m.tm("kvpool_tenant_bytes", "team-a", "dram", text) == len(a_left) * size
        assert m.tm("kvpool_tenant_objects", "team-a", text=text) == len(a_left)
        assert m.tm("kvpool_tenant_bytes", "team-b", "dram", text) == len(b_left) * size
        assert m.tm("kvpool_tenant_objects", "team-b", text=text) == len(b_left)
        for key in a_left:
            assert alice.get(key) == blob[key]
        for key in b_left:
            assert bob.get(key) == blob[key]


# ---- 5. a dedicated segment ----

def test_dedicated_segment(make_master, tmp_path):
    m = make_master()  # segsrv's 64 MiB, shared
    ded = f"ded-a-{_RUN}"
    with m.client("aseg", segment_size="16MiB", segment_tenant="team-a",
                  segment_name=ded):
        segs = m.admin_http("/api/v1/segments")["segments"]
        names = [s["name"] for s in segs]
        assert ded in names and len(names) == 2, segs
        text = m.metrics()
        assert m.tm("kvpool_tenant_dedicated_segments", "team-a", text=text) == 1

        alice, bob = m.client("alice"), m.client("bob")
        try:
            for i in range(8):
                alice.put(f"d@a-{i}", os.urandom(300_000))
                bob.put(f"d@b-{i}", os.urandom(300_000))
            body = m.http_keys("^d@")
            print("\nkeys view:", json.dumps(body["keys"][:2]))
            where = {}
            for e in body["keys"]:
                segs_of = [r["segment"] for r in e["replicas"]]
                where[(e["tenant"], e["key"])] = segs_of
            for i in range(8):
                assert where[("team-a", f"d@a-{i}")] == [ded], where
                assert ded not in where[("team-b", f"d@b-{i}")], where
            assert m.tm("kvpool_tenant_bytes", "team-a", "dram") == 8 * 300_000
        except BaseException:
            alice.close()
            bob.close()
            raise

        # team-b's segment server may not dedicate a segment to team-a
        msg = denied(m.client, "bseg", segment_size="16MiB", segment_tenant="team-a")
        print(f"mount refusal: {msg!r}")
        # nor through `kvpool serve --tenant` (a certificate principal of team-b)
        crt, key = m.certs.pair("segthief")
        p = subprocess.run([m.cli_bin, "--master", m.addr, "--tls-ca", m.certs.ca,
                            "--tls-cert", crt, "--tls-key", key, "serve", "--segment-size",
                            "16MiB", "--tenant", "team-a"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=30)
        assert p.returncode != 0, p.stderr.decode()
        text = m.metrics()
        assert m.tm("kvpool_tenant_dedicated_segments", "team-a", text=text) == 1
        assert m.tm("kvpool_tenant_dedicated_segments", "team-b", text=text) == 0
        assert len(m.admin_http("/api/v1/segments")["segments"]) == 2

    # the dedicated segment unmounted: team-a's objects there left the pool, and are
    # refunded; team-b's (on the shared segment) are still there and still charged
    try:
        poll(lambda: not alice.exists("d@a-0"), "alice's objects left with their segment")
        assert not any(alice.exists(f"d@a-{i}") for i in range(8))
        assert all(bob.exists(f"d@b-{i}") for i in range(8))
        text = m.metrics()
        assert m.tm("kvpool_tenant_bytes", "team-a", "dram", text) == 0
        assert m.tm("kvpool_tenant_objects", "team-a", text=text) == 0
        assert m.tm("kvpool_tenant_dedicated_segments", "team-a", text=text) == 0
        assert m.tm("kvpool_tenant_bytes", "team-b", "dram", text) == 8 * 300_000
        assert m.tm("kvpool_tenant_objects", "team-b", text=text) == 8
    finally:
        alice.close()
        bob.close()


def test_dedicated_mount_refusal_says_why(make_master):
    m = make_master()
    msg = denied(m.client, "bseg", segment_size="16MiB", segment_tenant="team-a")
    assert "team-a" in msg and "protected mode" not in msg, msg


# ---- 6. tenant shares under eviction ----

def test_share_keeps_a_working_set_through_a_burst(make_master):
    m = make_master({}, segments=("8MiB",))
    size = 256 * KiB
    a_keys = [f"ws@a-{i}" for i in range(13)]  # 3.25 MiB: ~40 % of DRAM
    b_keys = [f"ws@b-{i}" for i in range(96)]  # 24 MiB: 3x DRAM
    a_blob = {key: os.urandom(size) for key in a_keys}
    with m.client("alice") as alice, m.client("bob") as bob:
        for key in a_keys:  # put, never read: the oldest on probation
            alice.put(key, a_blob[key])
        share0 = metric(m.metrics(), "kvpool_evicted_share_total")
        for i, key in enumerate(b_keys):
            bob.put(key, i.to_bytes(4, "little") * (size // 4))
        for key in a_keys:
            assert alice.get(key) == a_blob[key], f"{key} of team-a's working set is gone"
        b_left = [key for key in b_keys if bob.exists(key)]
        print(f"\nteam-b kept {len(b_left)} of {len(b_keys)}")
        assert not bob.exists(b_keys[0]) and bob.exists(b_keys[-1])
        assert len(b_left) < len(b_keys) // 3
        text = m.metrics()
        assert metric(text, "kvpool_evicted_share_total") > share0
        assert m.tm("kvpool_tenant_bytes", "team-a", "dram", text) == len(a_keys) * size
        assert m.tm("kvpool_tenant_bytes", "team-b", "dram", text) == len(b_left) * size


# ---- 7. a reload changes a quota ----

def test_reload_raises_the_object_quota(make_master):
    m = make_master({"team-a": {"max-objects": "5"}})
    with m.client("alice") as alice:
        for i in range(5):
            alice.put(f"r@{i}", b"v%d" % i)
        msg = quota_error(alice.put, "r@5", b"v5")
        print(f"\nobject quota refusal: {msg!r}")
        assert "team-a" in msg and "objects" in msg, msg
        assert m.tm("kvpool_tenant_quota_objects", "team-a") == 5

        m.reload_tenants({"team-a": {"max-objects": "10"}})
        assert m.tm("kvpool_tenant_quota_objects", "team-a") == 10
        for i in range(5, 10):
            alice.put(f"r@{i}", b"v%d" % i)  # the same connection
        quota_error(alice.put, "r@10", b"v10")
        for i in range(10):
            assert alice.get(f"r@{i}") == b"v%d" % i
        text = m.metrics()
        assert m.tm("kvpool_tenant_objects", "team-a", text=text) == 10
        assert m.tm("kvpool_tenant_puts_refused_total", "team-a", text=text) == 2
