"""Admission limits of the master (issue 45, rows 4, 5 and 10), attacked as a stranger or
a principal would, with a legitimate client working meanwhile:

 1. connections past --max-unauthenticated-per-peer, --max-connections-per-peer and
    --max-connections: the oldest unauthenticated connection makes room or the new one is
    refused, each counted by its cap; the loop does not spin; the client is answered;
 2. descriptors running out (the master's RLIMIT_NOFILE lowered under it while strangers
    connect): pending connections are accepted and closed through a reserved descriptor,
    counted (descriptors), the loop does not spin, and the master takes connections again
    once descriptors are back;
 3. strangers trickling a frame header one byte at a time: closed at --auth-timeout,
    whatever they send (counted auth_timeout);
 4. an authenticated connection trickling a frame: closed at --frame-timeout, told why
    (KVP_ERR_TIMEOUT), counted frame_timeout;
 5. authenticated connections each holding most of a 64 MiB frame: the input buffers stay
    under --max-input-buffers (the master's RSS with them; counted input_buffers), the
    rest are closed at --frame-timeout.

Strangers connect from 127.0.0.2 (and 127.0.0.3, 127.0.0.4: other peers), the legitimate
client from 127.0.0.1, so that the per-peer caps part them. In the suite's TLS pass
(KVPOOL_TEST_TLS_DIR) the master runs with TLS and the ACL: strangers speak plain TCP to
the TLS port or TLS without a certificate, authenticated attackers TLS with the admin's
certificate; otherwise "authenticated" is a connection whose first whole frame came in.
"""

import os
import random
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import kvpool
from conftest import TLS_DIR, free_port, metric
from test_security import (M_PING, _CRED_ENV, at_eof, certs, close_all, frame,  # noqa: F401
                           poll, read_frame, varint)
from test_tenants import PRINCIPALS

ERR_TIMEOUT = -15
MiB = 1 << 20


def tls_ctx(cert):
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    c.load_verify_locations(os.path.join(TLS_DIR, "ca.crt"))
    if cert:
        c.load_cert_chain(os.environ.get("KVPOOL_TLS_CERT", os.path.join(TLS_DIR, "admin.crt")),
                          os.environ.get("KVPOOL_TLS_KEY", os.path.join(TLS_DIR, "admin.key")))
    return c


class Master:
    """A pool of this test's own: the master (with flags), one segment, its /metrics."""

    def __init__(self, make_pool, *flags):
        self.http_port = free_port()
        self.pool = make_pool(segments=("16MiB",),
                              master_args=("--lease-ttl", "0", "--http-listen",
                                           f"127.0.0.1:{self.http_port}", *flags))
        self.addr = self.pool.addr
        host, port = self.addr.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.pid = self.pool.master.pid

    def metrics(self):
        if TLS_DIR:
            url, ctx = f"https://127.0.0.1:{self.http_port}/metrics", tls_ctx(False)
        else:
            url, ctx = f"http://127.0.0.1:{self.http_port}/metrics", None
        with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
            return r.read().decode()

    def refused(self, reason, text=None):
        return metric(text or self.metrics(), "kvpool_connections_refused_total",
                      {"reason": reason}) or 0

    def raw(self, src="127.0.0.2", timeout=5.0):
        """A plain TCP connection from src."""
        return socket.create_connection((self.host, self.port), timeout=timeout,
                                        source_address=(src, 0))

    def stranger(self, src="127.0.0.2"):
        """A connection that names nobody: TLS with no certificate (TLS pass), else TCP."""
        s = self.raw(src)
        if TLS_DIR:
            try:
                s = tls_ctx(False).wrap_socket(s, server_hostname=self.host)
            except BaseException:
                s.close()
                raise
        return s

    def authenticated(self, src):
        """A connection past authentication (the admin's certificate in the TLS pass; a whole
        Ping answered), or None when the master closed it."""
        s = None
        try:
            s = self.raw(src)
            if TLS_DIR:
                s = tls_ctx(True).wrap_socket(s, server_hostname=self.host)
            s.sendall(frame(M_PING))
            r = read_frame(s)
            if r is not None and r[1] == 0:
                return s
        except (OSError, ssl.SSLError):
            pass
        if s is not None:
            s.close()
        return None

    def loop_cpu_s(self):
        """CPU seconds of the master's loop thread (its main thread)."""
        with open(f"/proc/{self.pid}/task/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def open_fds(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))


def answered(client, key, data, bound_s=2.0):
    """The client's get returns the bytes, within bound_s."""
    t0 = time.monotonic()
    assert client.get(key) == data
    took = time.monotonic() - t0
    assert took < bound_s, f"get took {took:.2f} s"


def not_spinning(m, seconds=2.0, limit=0.5):
    """The master's loop uses less than `limit` CPU seconds over `seconds`."""
    c0 = m.loop_cpu_s()
    time.sleep(seconds)
    used = m.loop_cpu_s() - c0
    assert used < limit, f"the master's loop used {used:.2f} s of CPU in {seconds} s"


def close_all(socks):
    for s in socks:
        if s is not None:
            s.close()


# ---- 1. connections past the caps ----

def test_connection_flood_is_capped_and_the_master_keeps_answering(make_pool):
    m = Master(make_pool, "--max-connections", "64", "--max-connections-per-peer", "24",
               "--max-unauthenticated", "32", "--max-unauthenticated-per-peer", "12",
               "--auth-timeout", "30")
    key, data = "adm/flood", os.urandom(200_000)
    held = []
    with kvpool.Client(m.addr, rpc_timeout_ms=3000) as alice:
        alice.put(key, data)
        try:
            # a stranger: 150 connections that never authenticate (plain TCP, even to a TLS
            # port): past 12 the oldest of them makes room, never another peer's
            for _ in range(150):
                held.append(m.raw("127.0.0.2"))
            poll(lambda: m.refused("max_unauthenticated_per_peer") >= 130,
                 "the stranger's connections past its cap closed")
            answered(alice, key, data)
            not_spinning(m)
            # a peer of authenticated connections: past 24 the new ones are refused
            mine = [m.authenticated("127.0.0.3") for _ in range(30)]
            held += mine
            assert sum(s is not None for s in mine) == 24, mine
            assert m.refused("max_connections_per_peer") >= 6
            # two more peers past the cap in all: the stranger's unauthenticated ones go
            # first, then new ones are refused
            more = [m.authenticated(src) for src in ("127.0.0.4", "127.0.0.5")
                    for _ in range(20)]
            held += more
            assert sum(s is None for s in more) >= 1
            text = m.metrics()
            assert m.refused("max_connections", text) >= 13, text
            assert metric(text, "kvpool_clients") <= 64
            answered(alice, key, data)
            alice.put(key + "/2", data)
            not_spinning(m)
        finally:
            close_all(held)
        # the caps free up with the connections
        poll(lambda: metric(m.metrics(), "kvpool_clients") < 16, "the attackers' connections "
             "closed")
        with kvpool.Client(m.addr, rpc_timeout_ms=3000) as bob:
            answered(bob, key, data)


# ---- 2. descriptors run out ----

def test_descriptors_run_out_without_spinning(make_pool):
    import resource
    m = Master(make_pool)
    key, data = "adm/fds", os.urandom(100_000)
    held = []
    with kvpool.Client(m.addr, rpc_timeout_ms=3000) as alice:
        alice.put(key, data)
        soft, hard = resource.prlimit(m.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(m.pid, resource.RLIMIT_NOFILE, (m.open_fds() + 2, hard))
        try:
            for _ in range(60):
                held.append(m.raw("127.0.0.2"))
            # the loop's thread only: the HTTP thread may want descriptors too
            not_spinning(m)
            answered(alice, key, data)
        finally:
            resource.prlimit(m.pid, resource.RLIMIT_NOFILE, (soft, hard))
        try:
            refused = poll(lambda: m.refused("descriptors"), "refusals counted")
            assert refused >= 40, refused
        finally:
            close_all(held)
        with kvpool.Client(m.addr, rpc_timeout_ms=3000) as bob:
            answered(bob, key, data)


# ---- 3. a deadline to authenticate ----

def test_trickling_strangers_are_closed_at_the_auth_deadline(make_pool):
    m = Master(make_pool, "--client-ttl", "3", "--auth-timeout", "1.5")
    before = m.refused("auth_timeout")
    socks = [m.stranger() for _ in range(5)]
    header = frame(M_PING)
    open_ = list(socks)
    t0 = time.monotonic()
    try:
        # one byte of a header each 0.3 s on every connection, as long as it stays open
        for i in range(len(header)):
            for s in list(open_):
                try:
                    s.sendall(header[i:i + 1])
                    s.settimeout(0.01)
                    if s.recv(4096) == b"":
                        open_.remove(s)
                except socket.timeout:
                    pass
                except (OSError, ssl.SSLError):
                    open_.remove(s)
            if not open_ or time.monotonic() - t0 > 4.0:
                break
            time.sleep(0.3)
        took = time.monotonic() - t0
        assert not open_, f"{len(open_)} trickling strangers still open after {took:.1f} s"
    finally:
        close_all(socks)
    assert m.refused("auth_timeout") - before >= 5
    with kvpool.Client(m.addr, rpc_timeout_ms=3000) as alice:
        alice.put("adm/after-trickle", b"x" * 1000)


# ---- 4. a deadline per frame ----

def test_trickled_frame_is_closed_at_the_frame_deadline(make_pool):
    m = Master(make_pool, "--client-ttl", "30", "--frame-timeout", "1.5")
    s = m.authenticated("127.0.0.2")
    assert s is not None
    try:
        header = frame(M_PING, req_id=7)
        t0 = time.monotonic()
        closed = False
        for i in range(len(header)):  # one byte each 0.25 s: 8 s for the whole header
            try:
                s.sendall(header[i:i + 1])
            except (OSError, ssl.SSLError):
                closed = True
                break
            s.settimeout(0.25)
            try:
                r = read_frame(s)
            except socket.timeout:
                continue
            except (OSError, ssl.SSLError):
                closed = True
                break
            assert r is None or r[1] == ERR_TIMEOUT, r
            closed = True
            break
        took = time.monotonic() - t0
        assert closed, "the trickled frame's connection still open"
        assert took < 3.5, f"closed after {took:.1f} s"
    finally:
        s.close()
    assert m.refused("frame_timeout") >= 1


# ---- 5. partial frames hold no more than the cap ----

def test_partial_frames_stay_under_the_input_cap(make_pool):
    m = Master(make_pool, "--frame-timeout", "3", "--max-input-buffers", "24MiB")
    key, data = "adm/partial", os.urandom(100_000)
    with kvpool.Client(m.addr, rpc_timeout_ms=3000) as alice:
        alice.put(key, data)
        rss0 = m.rss_mib()
        socks = [m.authenticated("127.0.0.2") for _ in range(8)]
        assert all(s is not None for s in socks)
        peak = [rss0]
        try:
            chunk = os.urandom(MiB)
            for s in socks:  # a 64 MiB frame announced, 10 MiB of it sent
                try:
                    s.sendall(frame(M_PING, req_id=9, body_len=64 * MiB))
                    for _ in range(10):
                        s.sendall(chunk)
                except (OSError, ssl.SSLError):
                    pass  # closed by the cap
                peak[0] = max(peak[0], m.rss_mib())
            answered(alice, key, data)
            # then a byte now and then: each remaining one closed at --frame-timeout
            t0 = time.monotonic()
            open_ = list(socks)
            while open_ and time.monotonic() - t0 < 5.0:
                for s in list(open_):
                    try:
                        s.sendall(b"\0")
                    except (OSError, ssl.SSLError):
                        open_.remove(s)
                peak[0] = max(peak[0], m.rss_mib())
                time.sleep(0.25)
            assert not open_, f"{len(open_)} partial frames still open after 5 s"
        finally:
            close_all(socks)
        grew = peak[0] - rss0
        print(f"\nRSS {rss0:.0f} MiB, peak {peak[0]:.0f} MiB with 8 x 10 MiB of partial frames")
        assert grew < 48, f"the master's RSS grew by {grew:.0f} MiB (cap 24 MiB)"
        text = m.metrics()
        assert m.refused("input_buffers", text) >= 1, text
        assert m.refused("frame_timeout", text) >= 1, text
        answered(alice, key, data)


# ---- 6. replies never read, requests pipelined ----

M_LIST = 13


def list_body(pattern, limit=1000):
    p = pattern.encode()
    return b"\x0a" + varint(len(p)) + p + b"\x20" + varint(limit)


def read_all(s, n, timeout=60.0):
    """The statuses of the next n frames on s."""
    s.settimeout(timeout)
    out = []
    for _ in range(n):
        r = read_frame(s)
        assert r is not None, f"closed after {len(out)} of {n} replies"
        out.append(r[1])
    return out


def test_unread_replies_pause_the_connection_and_nothing_is_lost(make_pool):
    """Four connections each pipeline 120 Lists of about 0.8 MB replies (380 MB in all) and
    read none: the master stops reading each once 4 MiB are queued for it (and any with
    replies queued past --max-output-buffers), so its RSS stays far under what they asked
    for, counted; alice is answered meanwhile; then they read, and every reply arrives."""
    m = Master(make_pool, "--max-output-buffers", "12MiB")
    key, data = "adm/out", os.urandom(50_000)
    n_req = 120
    with kvpool.Client(m.addr, rpc_timeout_ms=3000) as alice:
        alice.put(key, data)
        for i in range(200):
            k = f"adm/long/{i}/"
            alice.put(k + "x" * (4000 - len(k)), b"v")
        rss0 = m.rss_mib()
        socks = [m.authenticated("127.0.0.2") for _ in range(4)]
        try:
            assert all(s is not None for s in socks)
            body = list_body("^adm/long/")
            for s in socks:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
                s.sendall(b"".join(frame(M_LIST, body, req_id=i + 1) for i in range(n_req)))
            text = poll(lambda: (lambda t: t if metric(t, "kvpool_output_paused_total") >= 4
                                 else None)(m.metrics()), "four connections paused")
            answered(alice, key, data)
            grew = m.rss_mib() - rss0
            print(f"\nRSS {rss0:.0f} MiB, +{grew:.0f} MiB with 4 x {n_req} unread List replies; "
                  f"{metric(text, 'kvpool_output_queued_bytes') / MiB:.1f} MiB queued")
            assert grew < 64, f"the master's RSS grew by {grew:.0f} MiB"
            for s in socks:  # now they read: every reply, in order, none lost
                assert read_all(s, n_req) == [0] * n_req
        finally:
            close_all(socks)
        answered(alice, key, data)
        assert metric(m.metrics(), "kvpool_output_queued_bytes") == 0


def test_pipelined_costly_requests_take_turns(make_pool):
    """One connection sends 150 Lists at once whose pattern costs microseconds per key byte
    (each page ends at its 10 ms budget): the master handles them a turn at a time, the
    others' requests between them, so alice's calls wait for a page, not for 150."""
    m = Master(make_pool)
    key, data = "adm/turns", os.urandom(20_000)
    n_req = 150
    with kvpool.Client(m.addr, rpc_timeout_ms=3000) as alice:
        alice.put(key, data)
        rnd = random.Random(7)
        for i in range(40):
            k = f"w{i}-" + "".join(rnd.choice("ab") for _ in range(2000))
            alice.put(k + "a" + "b" * 40 + "c", b"v")
        s = m.authenticated("127.0.0.2")
        assert s is not None
        replies = []
        reader = threading.Thread(target=lambda: replies.extend(read_all(s, n_req)),
                                  daemon=True)
        try:
            t0 = time.monotonic()
            s.sendall(b"".join(frame(M_LIST, list_body("a[ab]{40}c"), req_id=i + 1)
                               for i in range(n_req)))
            reader.start()
            slowest = 0.0
            while reader.is_alive() and time.monotonic() - t0 < 60:
                t1 = time.monotonic()
                assert alice.get(key) == data
                slowest = max(slowest, time.monotonic() - t1)
            reader.join(60)
            took = time.monotonic() - t0
        finally:
            s.close()
        statuses = replies
        print(f"\n{n_req} pipelined costly Lists took {took:.2f} s; alice's slowest get "
              f"{slowest * 1000:.0f} ms")
        assert statuses == [0] * n_req
        assert took > 1.0  # the Lists were costly: without turns, alice would wait for them
        assert slowest < 0.5, f"alice's get waited {slowest:.2f} s"


# ---- turns per principal, connections per principal ----

# bob's attack, in a process of its own: `conns` TLS connections with his certificate, each
# sending `per` costly Lists at once and reading their answers; prints the answers' statuses
# counted, one line of "status count" each (every List must be answered)
_BOB = r"""
import collections, socket, ssl, struct, sys, threading
host, port, ca, crt, key, conns, per, pattern = sys.argv[1:9]
conns, per = int(conns), int(per)
HDR = struct.Struct("<IHHQIiQ")
def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)
p = pattern.encode()
body = b"\x0a" + varint(len(p)) + p + b"\x20" + varint(1000)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.load_verify_locations(ca)
ctx.load_cert_chain(crt, key)
socks = [ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=120),
                         server_hostname=host) for _ in range(conns)]
counts = collections.Counter()
lock = threading.Lock()
def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            return b
        b += c
    return b
def run(s):
    s.sendall(b"".join(HDR.pack(0x3150564B, 2, 13, i + 1, len(body), 0, 0) + body
                       for i in range(per)))
    for _ in range(per):
        h = recv_exact(s, HDR.size)
        if len(h) < HDR.size:
            with lock:
                counts["closed"] += 1
            return
        st, n = HDR.unpack(h)[5], HDR.unpack(h)[4]
        recv_exact(s, n)
        with lock:
            counts[st] += 1
print("ready", flush=True)
sys.stdin.readline()
ts = [threading.Thread(target=run, args=(s,)) for s in socks]
for t in ts:
    t.start()
for t in ts:
    t.join()
for k, v in sorted(counts.items(), key=str):
    print(k, v, flush=True)
"""

M_CAP = 64  # --max-connections-per-principal of these masters


@pytest.fixture
def capped_master(certs, tmp_path, monkeypatch):
    """A TLS+ACL master (test_tenants.py's principals: alice by token, bob by certificate)
    with --max-connections-per-principal M_CAP and a 64 MiB segment. Every credential is
    the test's own: none from the environment (the suite's TLS pass sets $KVPOOL_TLS_*)."""
    from test_tenants import TenantMaster

    for var in _CRED_ENV:
        monkeypatch.delenv(var, raising=False)

    class Capped(TenantMaster):
        extra_args = ("--max-connections-per-principal", str(M_CAP))

    m = Capped(certs, str(tmp_path), PRINCIPALS, {})
    try:
        m.add_segment("64MiB")
        yield m
    finally:
        close_all([m])


def bob_lists(m, bob, rnd):
    """bob's keys whose List pattern costs microseconds per key byte (each page ends at its
    10 ms budget, as in test_pipelined_costly_requests_take_turns)."""
    for i in range(40):
        k = f"w{i}-" + "".join(rnd.choice("ab") for _ in range(2000))
        bob.put(k + "a" + "b" * 40 + "c", b"v")
    return "a[ab]{40}c"


def test_many_connections_of_one_principal_share_one_turn(capped_master):
    """bob opens 60 connections, each pipelining 4 Lists that each take a page's whole
    10 ms budget: with a turn per connection the loop went round 60 of them (0.6 s) between
    two of alice's calls; with one turn per principal alice's gets take a median under
    100 ms and at most 1 s, her new connection's TLS handshake and Auth finish within 1 s,
    and every one of bob's Lists is answered."""
    m = capped_master
    crt, key = m.certs.pair(PRINCIPALS["bob"]["cn"])
    with m.client("bob") as bob:
        pattern = bob_lists(m, bob, random.Random(7))
    n_conns, per = 60, 4
    attack = subprocess.Popen([sys.executable, "-c", _BOB, m.host, str(m.port), m.certs.ca, crt,
                               key, str(n_conns), str(per), pattern],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert attack.stdout.readline().strip() == "ready"
        with m.client("alice", rpc_timeout_ms=5000) as alice:
            data = os.urandom(20_000)
            alice.put("adm/mine", data)
            attack.stdin.write("go\n")
            attack.stdin.flush()
            time.sleep(0.2)  # bob's Lists under way (the loop is busy with them)
            lat = []
            t_end = time.monotonic() + 2.5
            while time.monotonic() < t_end and attack.poll() is None:
                t1 = time.monotonic()
                assert alice.get("adm/mine") == data
                lat.append(time.monotonic() - t1)
            t1 = time.monotonic()  # a new connection: TLS, Auth and a get
            with m.client("alice", rpc_timeout_ms=5000) as again:
                assert again.get("adm/mine") == data
            fresh = time.monotonic() - t1
        out, _ = attack.communicate(timeout=120)
    finally:
        if attack.poll() is None:
            attack.kill()
            attack.wait()
    lat.sort()
    med, worst = lat[len(lat) // 2], lat[-1]
    print(f"\nalice: {len(lat)} gets, median {med * 1000:.1f} ms, slowest {worst * 1000:.0f} ms; "
          f"a new connection {fresh * 1000:.0f} ms; bob: {out.split()}")
    assert len(lat) >= 10
    assert med < 0.1, f"alice's median get {med:.3f} s"
    assert worst < 1.0, f"alice's slowest get {worst:.3f} s"
    assert fresh < 1.0, f"alice's new connection took {fresh:.3f} s"
    assert out.split() == ["0", str(n_conns * per)], out


def test_connections_per_principal_are_capped(capped_master):
    """bob holds M_CAP connections: the next one that names him (his certificate) is
    refused with why, counted max_connections_per_principal, the ones he holds keep
    working, alice (another principal, the same peer address) still connects, and once bob
    closes one a new one of his gets in."""
    m = capped_master
    crt, key = m.certs.pair(PRINCIPALS["bob"]["cn"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(m.certs.ca)
    ctx.load_cert_chain(crt, key)

    def bob_conn():
        s = ctx.wrap_socket(socket.create_connection((m.host, m.port), timeout=10),
                            server_hostname=m.host)
        s.sendall(frame(M_PING))
        return s, read_frame(s)

    held = []
    try:
        for _ in range(M_CAP):
            s, r = bob_conn()
            held.append(s)
            assert r is not None and r[1] == 0, r
        s, r = bob_conn()  # one past the cap
        with s:
            assert r is not None and r[1] == kvpool.ERR_DENIED, r
            assert b"--max-connections-per-principal 64" in r[2], r[2]
            assert at_eof(s)
        text = m.metrics()
        assert metric(text, "kvpool_connections_refused_total",
                      {"reason": "max_connections_per_principal"}) == 1
        for s in held[:3]:  # his others keep working
            s.sendall(frame(M_PING, req_id=2))
            assert read_frame(s)[1] == 0
        with m.client("alice") as alice:
            alice.put("adm/cap", b"x" * 100)
            assert alice.get("adm/cap") == b"x" * 100
        held.pop().close()
        poll(lambda: bob_conn()[1][1] == 0, "bob's connection after he closed one", timeout=10)
    finally:
        for s in held:
            s.close()
