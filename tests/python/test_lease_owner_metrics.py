"""Two hostile cases of the security chapter, played against a real master with TLS 1.3
and an ACL of two tenants (team-a: alice; team-b: bob), an admin and a `kvpool serve`
segment (test_security.py's machinery: certificates by deploy/make-certs.sh, SecureMaster):

 1. bob releases alice's read lease: he holds a lease of his own (a raw GetReplicaList),
    sends LeaseRelease with ids near his own (the next and previous slots, nearby random
    bits, the first indexes) and with alice's exact id (as if he had predicted or seen
    it). Alice's lease still holds: her plain remove is refused (KVP_ERR_LEASED) while she
    reads, her bytes read back exact, bob's and her calls are answered within their
    timeout, the master's RSS stays bounded, and every release of his is counted
    (kvpool_lease_releases_refused_total, not_owner for her id). Alice's own release,
    from another connection of hers, ends it: her remove then goes through.
 2. /metrics names no tenant to a stranger: with no credential, or a tenant's token, the
    per-tenant series (kvpool_tenant_*) are absent and no tenant's name appears; an
    admin's bearer token or client certificate gets them; with --metrics-tenants on
    everyone does. Every other series is served to all, as before.

Each test runs a master of its own (read leases on: --lease-ttl 30).
"""
import os
import time
import uuid

import pytest

import kvpool
from conftest import metric
from test_data_grants import M_GET_REPLICA_LIST, M_LEASE_RELEASE, pb
from test_security import (M_AUTH, M_PING, SecureMaster, auth_body,  # noqa: F401 (fixtures)
                           certs, close_all, frame, http_get, keys_body, no_ambient_credentials,
                           poll, read_frame, tls_client_ctx, tls_connect, varint)

LEASED = kvpool.ERR_LEASED
_RUN = uuid.uuid4().hex[:10]
TOKENS = {n: f"{n}-lease-tok-{_RUN}" for n in ("admin", "alice", "bob")}
TENANTS = ("team-a", "team-b")

PRINCIPALS = {
    "admin": dict(roles="admin", cn="admin", token=TOKENS["admin"]),
    "segsrv": dict(roles="segment", cn="segsrv"),
    "alice": dict(tenant="team-a", roles="read, write", token=TOKENS["alice"]),
    "bob": dict(tenant="team-b", roles="read, write", token=TOKENS["bob"]),
}


class LeaseMaster(SecureMaster):
    """SecureMaster with read leases on (30 s: only a release ends one within a test) and
    extra flags; clients by this module's principals."""

    def __init__(self, certs, workdir, extra=()):
        self.extra_args = ["--lease-ttl", "30", *extra]
        super().__init__(certs, workdir, PRINCIPALS)

    def client(self, name, **kw):
        return kvpool.Client(self.addr, rpc_timeout_ms=5000, tls_ca=self.certs.ca,
                             token=TOKENS[name], **kw)


@pytest.fixture
def make_master(certs, tmp_path):
    """make_master(extra flags) -> a LeaseMaster of this test's own, with one segment."""
    made = []

    def make(extra=()):
        d = tmp_path / f"m{len(made)}"
        d.mkdir()
        m = LeaseMaster(certs, str(d), extra)
        made.append(m)
        m.add_segment()
        return m

    yield make
    close_all(made)


class Raw:
    """A raw TLS control connection that authenticated as a principal (by its token)."""

    def __init__(self, m, name):
        self.s = tls_connect(m)
        self.s.sendall(frame(M_AUTH, auth_body(TOKENS[name])))
        r = read_frame(self.s)
        assert r is not None and r[1] == 0, r
        self.req = 100

    def lease(self, key):
        """GetReplicaList of key: its lease id (the lease is held until released)."""
        self.req += 1
        self.s.sendall(frame(M_GET_REPLICA_LIST, keys_body(key), req_id=self.req))
        r = read_frame(self.s)
        assert r is not None and r[1] == 0, r
        res = pb(pb(r[2])[2][0])
        assert res.get(1, [0])[0] == 0, res
        lease = res.get(5, [0])[0]
        assert lease != 0, "the master granted no lease (--lease-ttl 30)"
        return lease

    def release(self, ids):
        """LeaseRelease of ids (one-way), then a Ping answered: the release was handled."""
        packed = b"".join(i.to_bytes(8, "little") for i in ids)
        body = b"\x0a" + varint(len(packed)) + packed
        self.req += 1
        t0 = time.monotonic()
        self.s.sendall(frame(M_LEASE_RELEASE, body, req_id=self.req) +
                       frame(M_PING, req_id=self.req + 1))
        self.req += 1
        r = read_frame(self.s)
        assert r is not None and r[1] == 0, r
        return time.monotonic() - t0

    def close(self):
        self.s.close()


def near(own):
    """The ids an attacker tries around its own: the indexes beside it (its random bits),
    its index and those beside it with random bits near its own, the first 256 indexes
    with its bits (its own id left out)."""
    idx, tag = own & 0xFFFFFFFF, own >> 32
    out = []
    for d in range(1, 257):
        for t in (tag, (tag + d) % 2**32, (tag - d) % 2**32):
            for i in (idx + d, idx - d, idx):
                out.append(t << 32 | (i % 2**32))
    out += [tag << 32 | i for i in range(256) if i != idx]
    return [i for i in out if i != own]


def refused(m, reason, text=None):
    return metric(text or m.metrics(), "kvpool_lease_releases_refused_total",
                  {"reason": reason}) or 0


def removal_refused(c, key):
    """A plain remove of key is refused because it is being read (False: it went)."""
    try:
        c.remove(key)
    except kvpool.Error as e:
        return e.status == LEASED
    return False


def removed(c, key):
    try:
        c.remove(key)
        return True
    except kvpool.Error as e:
        assert e.status == LEASED, e
        return False


def test_bob_cannot_release_alices_lease(make_master):
    m = make_master()
    key_a, key_b = f"lease-a-{_RUN}", f"lease-b-{_RUN}"
    data = os.urandom(256 * 1024)
    with m.client("alice") as alice, m.client("bob") as bob:
        alice.put(key_a, data)
        bob.put(key_b, b"b" * 4096)
    rss0 = m.rss_kib()
    ra, rb = Raw(m, "alice"), Raw(m, "bob")
    try:
        alice_id = ra.lease(key_a)  # alice is reading
        bob_id = rb.lease(key_b)
        assert alice_id != bob_id and (alice_id >> 32) != (bob_id >> 32)
        with m.client("alice") as alice:
            assert removal_refused(alice, key_a)  # the lease works
        not_owner0, unknown0 = refused(m, "not_owner"), refused(m, "unknown")

        guesses = near(bob_id)
        waited = [rb.release(guesses[i:i + 4096]) for i in range(0, len(guesses), 4096)]
        waited.append(rb.release([alice_id]))  # her exact id: predicted, or seen
        assert max(waited) < 5, waited  # bob's own calls answered all along

        with m.client("alice") as alice:
            t0 = time.monotonic()
            assert removal_refused(alice, key_a), "bob ended alice's read lease"
            assert alice.get(key_a) == data
            assert time.monotonic() - t0 < 5
        text = m.metrics()
        assert refused(m, "not_owner", text) == not_owner0 + 1
        assert refused(m, "unknown", text) >= unknown0 + len(guesses) - 1
        with m.client("bob") as bob:  # bob's own lease is bob's to end
            assert removal_refused(bob, key_b)
        rb.release([bob_id])
        with m.client("bob") as bob:
            bob.remove(key_b)

        ra.release([alice_id])  # hers: the read is over, on her own connection
        with m.client("alice") as alice:  # (her get's release came on a connection now gone)
            poll(lambda: removed(alice, key_a), "alice's remove once her reads ended", 5)
            assert not alice.exists(key_a)
    finally:
        ra.close()
        rb.close()
    assert m.master.p.poll() is None, "the master died"
    assert m.rss_kib() < rss0 + 64 * 1024, (rss0, m.rss_kib())
    assert "lease releases refused: granted to another principal" in m.log_text()
    assert TOKENS["bob"] not in m.log_text()


def test_lease_released_from_another_connection_of_its_principal(make_master):
    """A principal's lease is its own on every connection of it (a client that reconnects
    hands its leases back on the new connection)."""
    m = make_master()
    key = f"lease-re-{_RUN}"
    with m.client("alice") as alice:
        alice.put(key, b"x" * 8192)
    r1 = Raw(m, "alice")
    lease = r1.lease(key)
    r1.close()
    r2 = Raw(m, "alice")
    try:
        with m.client("alice") as alice:
            assert removal_refused(alice, key)
        r2.release([lease])
        with m.client("alice") as alice:
            alice.remove(key)
    finally:
        r2.close()
    assert refused(m, "not_owner") == 0


def tenant_series(text):
    return [ln for ln in text.splitlines() if ln.startswith("kvpool_tenant_")]


def names_a_tenant(text):
    return any(t in text for t in TENANTS)


def put_per_tenant(m):
    with m.client("alice") as alice, m.client("bob") as bob:
        alice.put(f"m-a-{_RUN}", b"a" * 3000)
        bob.put(f"m-b-{_RUN}", b"b" * 5000)
        bob.put(f"m-b2-{_RUN}", b"b" * 5000)


def test_metrics_name_no_tenant_to_strangers(make_master):
    m = make_master()
    put_per_tenant(m)
    assert m.http("/health")[0] == 200 and m._https
    url = f"https://127.0.0.1:{m.http_port}/metrics"
    http0 = m.metrics()
    refused_http = {r: metric(http0, "kvpool_http_refused_total", {"reason": r})
                    for r in ("unauthenticated", "role")}

    # a stranger (no credential), a tenant's token, a wrong token: served, without tenants
    for who, token in (("stranger", None), ("alice", TOKENS["alice"]),
                       ("wrong", f"wrong-{_RUN}")):
        status, text = m.http("/metrics", token=token)
        assert status == 200, (who, status)
        assert not tenant_series(text), (who, tenant_series(text)[:3])
        assert not names_a_tenant(text), who
        # the rest as before
        assert metric(text, "kvpool_puts_total") >= 3, who
        assert metric(text, "kvpool_evicted_share_total") is not None, who
        assert metric(text, "kvpool_lease_releases_refused_total",
                      {"reason": "not_owner"}) == 0, who
    # bob's certificate (no admin) is no more than a stranger
    crt, key = m.certs.pair("bob")
    status, text = http_get(url, 10, tls_client_ctx(m.certs.ca, crt, key))
    assert status == 200 and not tenant_series(text) and not names_a_tenant(text)

    # an admin, by token or by client certificate: the per-tenant series
    status, text = m.http("/metrics", token=TOKENS["admin"])
    assert status == 200
    assert metric(text, "kvpool_tenant_objects", {"tenant": "team-a"}) == 1
    assert metric(text, "kvpool_tenant_objects", {"tenant": "team-b"}) == 2
    assert metric(text, "kvpool_tenant_bytes", {"tenant": "team-b", "tier": "dram"}) > 0
    crt, key = m.certs.pair("admin")
    status, text = http_get(url, 10, tls_client_ctx(m.certs.ca, crt, key))
    assert status == 200
    assert metric(text, "kvpool_tenant_objects", {"tenant": "team-a"}) == 1

    # /metrics refuses nobody: the HTTP refusal counters did not move
    text = m.metrics()
    for r, v in refused_http.items():
        assert metric(text, "kvpool_http_refused_total", {"reason": r}) == v, r
    assert TOKENS["alice"] not in m.log_text()


def test_metrics_tenants_flag_shows_them_to_all(make_master):
    m = make_master(["--metrics-tenants", "on"])
    put_per_tenant(m)
    text = m.metrics()  # no credential
    assert metric(text, "kvpool_tenant_objects", {"tenant": "team-a"}) == 1
    assert metric(text, "kvpool_tenant_objects", {"tenant": "team-b"}) == 2
