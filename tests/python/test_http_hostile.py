"""The HTTP ports against strangers (common/http.c; docs/operations.md, "HTTP limits"):

- a flood of connections that trickle their request head (TLS sessions and raw bytes on the
  master's HTTPS port, plain HTTP on the indexer's) neither keeps /health from answering
  within a second nor outlives the head deadline, however it trickles; the connections the
  caps closed are counted in /metrics;
- strangers' request bodies are refused 401 from the head, before any of the body is read:
  40 of them sending most of a 16 MiB body leave the indexer's memory where it was, while an
  authorised client still posts a large body; the bytes of bodies being received are capped
  over all connections (503 past the budget), and the budget comes back when they end.

Real parts: kvpool-master and kvpool-indexer from the build tree, certificates from
deploy/make-certs.sh (the `certs` fixture of test_security.py), Python's ssl and sockets.
All attackers and the prober share 127.0.0.1: the per-peer cap must not starve the prober.
"""
import json
import os
import socket
import ssl
import threading
import time
import uuid

import pytest

from conftest import Proc, free_port, metric
from test_security import acl_text, certs, no_ambient_credentials  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IDX_BIN = os.environ.get("KVPOOL_INDEXER_BIN",
                         os.path.join(ROOT, "build", "indexer", "kvpool-indexer"))
MASTER_BIN = os.environ.get("KVPOOL_MASTER_BIN",
                            os.path.join(ROOT, "build", "master", "kvpool-master"))

HEAD_S = 8  # KVP_HTTP_HEAD_S (common/http.h)
PER_PEER = 128  # KVP_HTTP_PER_PEER
BODY_MAX = 16 << 20  # the indexer's KVP_API_BODY_MAX
BUDGET = 64 << 20  # KVP_HTTP_BODY_BUDGET (per tenant)

_RUN = uuid.uuid4().hex[:8]
PRINCIPALS = {
    "router-a": dict(tenant="team-a", roles="read, write", token=f"ra-{_RUN}-tok"),
    "b-read": dict(tenant="team-b", roles="read", token=f"br-{_RUN}-tok"),
    "admin": dict(roles="admin", cn="admin", token=f"ad-{_RUN}-tok"),
}
REG = dict(endpoint="tcp://127.0.0.1:1", type="vLLM", modelname="m", block_size=4, dp_rank=0)


def client_ctx(certs):  # noqa: F811
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(certs.ca)
    return ctx


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int([ln for ln in f if ln.startswith("VmRSS:")][0].split()[1])


def request(port, method, path, ctx=None, token=None, body=b"", timeout=5.0):
    """(status, body text) of one request on a fresh connection (HTTPS when ctx)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        if ctx is not None:
            s = ctx.wrap_socket(s, server_hostname="localhost")
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        if body or method in ("POST", "PUT"):
            head += f"Content-Length: {len(body)}\r\n"
        s.sendall(head.encode() + b"\r\n" + body)
        return read_reply(s)
    finally:
        s.close()


def read_reply(s):
    buf = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            break
        if not chunk:
            break
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), buf[:200]
    return int(head.split()[1]), body.decode(errors="replace")


class Trickler:
    """Connections that each send a request head one byte at a time, never finishing it;
    when each was opened and when the server closed it (a send failed)."""

    def __init__(self, port, n, ctx=None, raw_tls=False, src="127.0.0.1"):
        self.socks, self.opened, self.closed, self.src = [], [], [], src
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run)  # trickles while the others open
        self.t.start()
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(src, 0))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.opened.append(time.monotonic())
            self.closed.append(None)
            try:
                if ctx is not None:
                    s = ctx.wrap_socket(s, server_hostname="localhost")
                # raw_tls: a TLS record header (a 512-byte handshake record), never finished
                s.sendall(b"\x16\x03\x01\x02\x00" if raw_tls else
                          b"GET /health HTTP/1.1\r\nHost: x\r\n")
            except OSError:  # closed already: the per-peer cap made room with it
                self.closed[i] = time.monotonic()
            self.socks.append(s)

    def _run(self):
        while not self.stop.is_set():
            for i in range(len(self.socks)):
                s = self.socks[i]
                if self.closed[i] is None:
                    try:
                        s.send(b"X")
                    except (OSError, ssl.SSLError):
                        self.closed[i] = time.monotonic()
            self.stop.wait(0.25)

    def all_closed(self):
        return all(c is not None for c in self.closed)

    def close(self):
        self.stop.set()
        self.t.join(10)
        for s in self.socks:
            s.close()


def probe_while(port, ctx, cond, limit_s):
    """GET /health every 100 ms until cond() or limit_s: the latency of each (s)."""
    lat = []
    end = time.monotonic() + limit_s
    while not cond() and time.monotonic() < end:
        t0 = time.monotonic()
        try:
            st, _ = request(port, "GET", "/health", ctx=ctx, timeout=5)
        except OSError as e:
            st = f"failed: {e!r}"
        lat.append((time.monotonic() - t0, st))
        time.sleep(0.1)
    return lat


def check_flood(port, ctx, floods, metrics):
    """Probe /health through the floods until the server closed every attacker; every probe
    answered 200 within 2 s (in ms, unloaded), every attacker closed within the head deadline (plus the
    sweep and the trickler's own period), the closures counted."""
    try:
        lat = probe_while(port, ctx, lambda: all(f.all_closed() for f in floods), HEAD_S + 8)
    finally:
        for f in floods:
            f.close()
    bad = [x for x in lat if x[1] != 200 or x[0] > 2.0]
    assert len(lat) > 20 and not bad, f"probes slow or failed: {bad[:5]} of {len(lat)}"
    for f in floods:
        assert f.all_closed(), f"{sum(c is None for c in f.closed)} attackers still open"
        held = max(c - o for o, c in zip(f.opened, f.closed))
        assert held < HEAD_S + 2.0, f"an attacker held its connection {held:.1f} s"
    text = metrics()
    n = sum(len(f.socks) for f in floods)
    peer = metric(text, metrics.prefix + "_connections_refused_total", {"reason": "peer"})
    late = metric(text, metrics.prefix + "_connections_refused_total",
                  {"reason": "head_deadline"})
    pool = metric(text, metrics.prefix + "_connections_refused_total", {"reason": "pool"})
    if len({f.src for f in floods}) == 1:  # one peer: its cap, then the deadline
        assert peer >= n - PER_PEER - 1 and late >= 1, (peer, late)
    else:  # many peers: the pool's cap as well
        assert pool >= 1 and late >= 1, (peer, pool, late)
    assert peer + pool + late >= 0.9 * n, (peer, pool, late)
    print(f"{n} trickling attackers: {len(lat)} probes, slowest {max(x[0] for x in lat):.3f} s;"
          f" closed for the per-peer cap {peer:.0f}, the pool's {pool:.0f}, the head deadline"
          f" {late:.0f}")


@pytest.mark.skipif(not os.access(MASTER_BIN, os.X_OK), reason=f"no kvpool-master at {MASTER_BIN}")
def test_master_https_holds_against_trickled_heads(certs, tmp_path):  # noqa: F811
    acl = tmp_path / "acl.conf"
    acl.write_text(acl_text(PRINCIPALS))
    port = free_port()
    m = Proc([MASTER_BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--lease-ttl", "0",
              "--http-listen", f"127.0.0.1:{port}", "--tls-cert", certs.server_crt, "--tls-key",
              certs.server_key, "--tls-ca", certs.ca, "--tls-crl", certs.crl, "--acl-file",
              str(acl)])
    try:
        ctx = client_ctx(certs)
        assert request(port, "GET", "/health", ctx=ctx)[0] == 200

        def metrics():
            st, text = request(port, "GET", "/metrics", ctx=ctx)
            assert st == 200
            return text
        metrics.prefix = "kvpool_master_http"
        # 200 TLS sessions trickling a header, 120 raw sockets trickling a handshake
        floods = [Trickler(port, 200, ctx=ctx), Trickler(port, 120, raw_tls=True)]
        check_flood(port, ctx, floods, metrics)
        assert m.p.poll() is None
    finally:
        m.stop()


@pytest.mark.skipif(not os.access(MASTER_BIN, os.X_OK), reason=f"no kvpool-master at {MASTER_BIN}")
def test_master_reads_no_strangers_quota_body(certs, tmp_path):  # noqa: F811
    acl = tmp_path / "acl.conf"
    acl.write_text(acl_text(PRINCIPALS))
    port = free_port()
    m = Proc([MASTER_BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--lease-ttl", "0",
              "--http-listen", f"127.0.0.1:{port}", "--tls-cert", certs.server_crt, "--tls-key",
              certs.server_key, "--tls-ca", certs.ca, "--tls-crl", certs.crl, "--acl-file",
              str(acl)])
    try:
        ctx = client_ctx(certs)
        path = "/api/v1/tenant_quotas?tenant_id=team-a"
        unauth = 'kvpool_http_refused_total{reason="unauthenticated"}'
        before = metric(request(port, "GET", "/metrics", ctx=ctx)[1], unauth)
        for token in (None, PRINCIPALS["router-a"]["token"] + "x"):  # none, a wrong one
            s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                                server_hostname="localhost")
            auth = f"Authorization: Bearer {token}\r\n" if token else ""
            s.sendall(f"PUT {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 4000\r\n"
                      "\r\n".encode())  # the head alone: the answer cannot wait for a body
            st, text = read_reply(s)
            s.close()
            assert st == 401 and "authentication required" in text, (st, text)
        # a non-admin's credential: 403, from the head as well
        st, text = request(port, "PUT", path, ctx=ctx, token=PRINCIPALS["router-a"]["token"],
                           body=b'{"requested_quota_bytes":1048576}')
        assert st == 403, (st, text)
        after = metric(request(port, "GET", "/metrics", ctx=ctx)[1], unauth)
        assert after == before + 2
        # the admin's body is read and applied
        st, text = request(port, "PUT", path, ctx=ctx, token=PRINCIPALS["admin"]["token"],
                           body=b'{"requested_quota_bytes":1048576}')
        assert st == 200 and '"requested_quota_bytes":1048576' in text, (st, text)
        assert m.p.poll() is None
    finally:
        m.stop()


@pytest.mark.skipif(not os.access(IDX_BIN, os.X_OK), reason=f"no kvpool-indexer at {IDX_BIN}")
def test_indexer_holds_against_trickled_heads():
    idx = Proc([IDX_BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}"])
    port = int(idx.ready.rsplit(":", 1)[1])
    try:
        def metrics():
            st, text = request(port, "GET", "/metrics")
            assert st == 200
            return text
        metrics.prefix = "kvpool_indexer_http"
        check_flood(port, None, [Trickler(port, 320)], metrics)
        assert idx.p.poll() is None
    finally:
        idx.stop()


@pytest.mark.skipif(not os.access(IDX_BIN, os.X_OK), reason=f"no kvpool-indexer at {IDX_BIN}")
def test_indexer_pool_full_of_heads_from_many_peers():
    """1 080 trickling connections from 9 other addresses fill the pool of 1 024: the oldest
    unfinished heads make room, and the prober's /health still gets in."""
    idx = Proc([IDX_BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}"])
    port = int(idx.ready.rsplit(":", 1)[1])
    try:
        def metrics():
            st, text = request(port, "GET", "/metrics")
            assert st == 200
            return text
        metrics.prefix = "kvpool_indexer_http"
        floods = [Trickler(port, 120, src=f"127.0.0.{k}") for k in range(2, 11)]
        check_flood(port, None, floods, metrics)
        assert idx.p.poll() is None
    finally:
        idx.stop()


@pytest.fixture
def secure_idx(certs, tmp_path):  # noqa: F811
    acl = tmp_path / "acl.conf"
    acl.write_text(acl_text(PRINCIPALS))
    p = Proc([IDX_BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--tls-cert",
              certs.server_crt, "--tls-key", certs.server_key, "--tls-ca", certs.ca,
              "--tls-crl", certs.crl, "--acl-file", str(acl)])
    yield p, int(p.ready.rsplit(":", 1)[1])
    p.stop()


def idx_metric(port, ctx, name, labels=None):
    st, text = request(port, "GET", "/metrics", ctx=ctx)
    assert st == 200
    return metric(text, name, labels)


@pytest.mark.skipif(not os.access(IDX_BIN, os.X_OK), reason=f"no kvpool-indexer at {IDX_BIN}")
def test_strangers_bodies_are_refused_before_they_are_read(certs, secure_idx):  # noqa: F811
    p, port = secure_idx
    ctx = client_ctx(certs)
    token = PRINCIPALS["router-a"]["token"]
    refused0 = idx_metric(port, ctx, "kvpool_indexer_http_refused_total",
                          {"reason": "unauthenticated"})
    rss0 = rss_kib(p.pid)
    chunk = b" " * (1 << 20)
    socks, early, sent = [], [], []
    for i in range(40):
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                            server_hostname="localhost")
        s.sendall(f"POST /register HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY_MAX}\r\n"
                  "\r\n".encode())
        # the answer comes from the head alone: nothing of the body was sent yet
        t0 = time.monotonic()
        st, body = read_reply(s)
        early.append((st, time.monotonic() - t0, body))
        n = 0
        try:  # the rest of the body, most of 16 MiB, as the attack sent it: refused
            for _ in range(15):
                s.sendall(chunk)
                n += len(chunk)
        except (OSError, ssl.SSLError):
            pass
        sent.append(n)
        socks.append(s)
    rss1 = rss_kib(p.pid)
    for s in socks:
        s.close()
    assert all(st == 401 and dt < 2.0 for st, dt, _ in early), early[:3]
    assert "authentication required" in early[0][2]
    assert max(sent) < 15 * len(chunk), "a stranger could send a whole body"
    grown = (rss1 - rss0) / 1024
    print(f"40 strangers' 16 MiB bodies: RSS {rss0 // 1024} -> {rss1 // 1024} MiB")
    assert grown < 32, f"the indexer grew {grown:.0f} MiB"
    assert idx_metric(port, ctx, "kvpool_indexer_http_refused_total",
                      {"reason": "unauthenticated"}) == refused0 + 40
    # an authorised client's large body is read and served (12 MiB of JSON whitespace)
    reg = dict(REG, instance_id=f"big-{_RUN}")
    body = json.dumps(reg).encode()
    body = body[:-1] + b" " * (12 << 20) + b"}"
    st, text = request(port, "POST", "/register", ctx=ctx, token=token, body=body, timeout=30)
    assert st == 200, text
    st, text = request(port, "GET", "/instances", ctx=ctx, token=token)
    assert st == 200 and f"big-{_RUN}" in text


def hold_bodies(port, ctx, token, method, path, n, length, src="127.0.0.1"):
    """n connections each sending a head announcing length bytes and one byte of the body."""
    held = []
    head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()
    for _ in range(n):
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5,
                                                     source_address=(src, 0)),
                            server_hostname="localhost")
        s.sendall(head + b"{")
        held.append(s)
    return held, head


@pytest.mark.skipif(not os.access(IDX_BIN, os.X_OK), reason=f"no kvpool-indexer at {IDX_BIN}")
def test_bodies_being_received_have_a_budget_per_tenant(certs, secure_idx):  # noqa: F811
    """b-read (team-b, role read) holds four unfinished 16 MiB /query bodies: team-b's whole
    budget. Its fifth is refused 503 and counted; router-a's (team-a) /query and /register
    are still read and answered."""
    p, port = secure_idx
    ctx = client_ctx(certs)
    token, btok = PRINCIPALS["router-a"]["token"], PRINCIPALS["b-read"]["token"]
    refused = ("kvpool_indexer_http_connections_refused_total", {"reason": "body_budget"})
    held = []
    try:
        held, head = hold_bodies(port, ctx, btok, "POST", "/query", BUDGET // BODY_MAX,
                                 BODY_MAX, src="127.0.0.2")
        # the server reserved their bodies when it read their heads: wait for it to say so
        end = time.monotonic() + 10
        while idx_metric(port, ctx, "kvpool_indexer_http_body_bytes") < BUDGET:
            assert time.monotonic() < end, "the held bodies were not reserved"
            time.sleep(0.05)
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                            server_hostname="localhost")
        s.sendall(head)  # team-b's fifth: over its budget, refused from the head
        st, text = read_reply(s)
        s.close()
        assert st == 503 and "this tenant's request bodies" in text and "64 MiB" in text, \
            (st, text)
        assert "try again later" in text
        assert idx_metric(port, ctx, *refused) == 1
        # team-a's bodies are read as before, while team-b's four are held
        q = json.dumps(dict(model="m", block_size=4, token_ids=[1, 2, 3, 4])).encode()
        st, text = request(port, "POST", "/query", ctx=ctx, token=token, body=q)
        assert st == 200, (st, text)
        reg = dict(REG, instance_id=f"held-{_RUN}")
        st, text = request(port, "POST", "/register", ctx=ctx, token=token,
                           body=json.dumps(reg).encode())
        assert st == 200, (st, text)
        assert idx_metric(port, ctx, *refused) == 1  # team-a's were not refused
        # a request that takes no body is answered from its head meanwhile
        st, _ = request(port, "POST", "/instances", ctx=ctx, token=btok, body=b"{}")
        assert st == 405  # answered from the head (no body needed), not held by the budget
    finally:
        for s in held:
            s.close()
    # the budget comes back as those connections end
    end = time.monotonic() + 10
    while idx_metric(port, ctx, "kvpool_indexer_http_body_bytes") != 0:
        assert time.monotonic() < end, "the budget did not come back"
        time.sleep(0.05)
    st, text = request(port, "POST", "/query", ctx=ctx, token=btok,
                       body=json.dumps(dict(model="m", block_size=4, token_ids=[1])).encode())
    assert st == 200, text  # team-b's own budget is back too
    assert p.p.poll() is None


@pytest.mark.skipif(not os.access(MASTER_BIN, os.X_OK), reason=f"no kvpool-master at {MASTER_BIN}")
def test_master_admins_quota_put_with_others_bodies_held(certs, tmp_path):  # noqa: F811
    """Another admin holds 64 unfinished quota PUTs (their bodies admitted) and b-read 64
    more (refused from the head, 403): the admin's own PUT is still read and applied."""
    principals = dict(PRINCIPALS, **{"admin-b": dict(roles="admin", token=f"ab-{_RUN}-tok")})
    acl = tmp_path / "acl.conf"
    acl.write_text(acl_text(principals))
    port = free_port()
    m = Proc([MASTER_BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--lease-ttl", "0",
              "--http-listen", f"127.0.0.1:{port}", "--tls-cert", certs.server_crt, "--tls-key",
              certs.server_key, "--tls-ca", certs.ca, "--tls-crl", certs.crl, "--acl-file",
              str(acl)])
    held = []
    try:
        ctx = client_ctx(certs)
        path = "/api/v1/tenant_quotas?tenant_id=team-a"
        held, _ = hold_bodies(port, ctx, principals["admin-b"]["token"], "PUT", path, 64, 4000,
                              src="127.0.0.2")
        b, _ = hold_bodies(port, ctx, principals["b-read"]["token"], "PUT", path, 64, 4000,
                           src="127.0.0.3")
        held += b
        end = time.monotonic() + 10  # admin-b's bodies reserved as their heads were admitted
        while metric(request(port, "GET", "/metrics", ctx=ctx)[1],
                     "kvpool_master_http_body_bytes") < 64 * 4000:
            assert time.monotonic() < end, "the held bodies were not reserved"
            time.sleep(0.05)
        st, text = request(port, "PUT", path, ctx=ctx, token=PRINCIPALS["admin"]["token"],
                           body=b'{"requested_quota_bytes":2097152}')
        assert st == 200 and '"requested_quota_bytes":2097152' in text, (st, text)
        assert metric(request(port, "GET", "/metrics", ctx=ctx)[1],
                      "kvpool_master_http_connections_refused_total",
                      {"reason": "body_budget"}) == 0
        assert m.p.poll() is None
    finally:
        for s in held:
            s.close()
        m.stop()
