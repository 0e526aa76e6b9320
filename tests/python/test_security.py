"""The authenticated control plane (TLS 1.3, client certificates, tokens, the ACL)
attacked as a hostile user would: every attack must fail, and the victim's objects
must read back byte-identical afterwards.

Everything runs for real on 127.0.0.1: kvpool-master with --tls-cert/--tls-key/
--tls-ca/--tls-crl/--acl-file/--http-listen, `kvpool serve` mounting the segment
over mutual TLS, certificates made by deploy/make-certs.sh (KVPOOL_TEST_CERTS=1),
and raw attackers speaking TCP, TLS and our frame format from Python.

Covered (in this order; a case may take more than one test function):
 1. legitimate round trips: a token principal, a certificate principal, and
    mooncake.store configured only through KVPOOL_TLS_* / KVPOOL_TOKEN;
 2. plain TCP to the TLS port (raw Ping frame, and a client with no TLS settings);
 3. certificates of an unknown CA (CN admin), expired, revoked: refused, reason given,
    kvpool_connections_refused_total{reason="tls"} up;
 4. TLS 1.2 cannot handshake;
 5. a wrong token (DENIED, bad_token up); a token without a CA is refused locally and
    never sent; a token is never handed to an impostor master (plaintext, a rogue CA, or
    another principal's valid client certificate);
 6. 10 000 wrong tokens from several threads: none accepted, the master keeps answering
    a legitimate client at normal latency;
 7. an unauthenticated 1 GiB length prefix (error reply / close, no memory grows), a
    request before Auth (DENIED, closed, unauthenticated up), response-bit frames
    before Auth (closed too);
 8. a principal deleted while connected (SIGHUP): refused from its next call on,
    others unaffected, principal_removed up (token and certificate principals);
 9. a role narrowed mid-session: put refused, get still served;
10. key isolation between two tenants (get, exist, size, remove, put, upsert, batches,
    remove_by_regex, list) and a write outside the key patterns leaves nothing; nor do
    the master's HTTP JSON views show a tenant's keys to anyone but an admin;
11. a reader putting and removing;
12. a non-admin remove_all, and `kvpool drain` of someone else's segment via the CLI;
13. mounting a segment without the segment role (library client and `kvpool serve`);
14. no token (right or wrong) or private key in the master's log or /metrics, and no
    object key in /metrics;
and the words of refusals: the pre-auth frame-size refusal in whole, a removed
principal told why, `kvpool drain`'s refusal as the master put it, and the audit
trail of refused remove-all / drain (not "success").

The module's master (fixture `sec`) is shared by cases 1-7 and 10-14; cases 8 and 9
rewrite the ACL and SIGHUP, so each runs a master of its own (fixture `make_secure`).
A reload is asynchronous to the signal: its end is seen by polling (bounded) for a
canary principal that only the new ACL names. The master's HTTP port is read over
HTTPS (verified against our CA, an admin's bearer token for /api/v1) where the master
serves HTTPS, else over plain HTTP. No credential comes from the environment: the
suite's TLS pass sets $KVPOOL_TLS_*, which fixture `no_ambient_credentials` unsets.
"""

import hashlib
import json
import os
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

import kvpool
from conftest import Proc, _bin, free_port, metric

# ---- principals and their credentials ----

# Secrets are made fresh per run (they must never show up anywhere; see case 14).
_RUN = uuid.uuid4().hex[:10]
TOKENS = {
    "admin": f"admin-tok-{_RUN}-5e0c17",
    "alice": f"alice-tok-{_RUN}-7f3a9c",
    "reader": f"reader-tok-{_RUN}-0b51e2",
    "carol": f"carol-tok-{_RUN}-94d6aa",
}
WRONG_TOKEN = f"wrong-tok-{_RUN}-d00d"
FLOOD_PREFIX = f"flood-tok-{_RUN}-"  # case 6: FLOOD_PREFIX + a number
# client certificate CNs made by make-certs.sh (plus expired, revoked, rogue)
CERT_CNS = ("admin", "segsrv", "bob", "segthief", "alice")

# name -> ACL settings; "cn" or "token" names the principal
PRINCIPALS = {
    "admin": dict(roles="admin", cn="admin", token=TOKENS["admin"]),
    "segsrv": dict(roles="segment", cn="segsrv"),
    "alice": dict(tenant="team-a", roles="read, write", token=TOKENS["alice"], keys="a@*"),
    "bob": dict(tenant="team-b", roles="read, write", cn="bob", keys="b@*"),
    "reader": dict(roles="read", token=TOKENS["reader"]),
    "carol": dict(tenant="team-c", roles="read, write", token=TOKENS["carol"], keys="c@*"),
    "segthief": dict(roles="segment", cn="segthief"),
    # only TLS can refuse these: the ACL would take them (as admins, even)
    "expired": dict(roles="admin", cn="expired"),
    "revoked": dict(roles="admin", cn="revoked"),
}

DENIED = kvpool.ERR_DENIED


def sha256_hex(s):
    return hashlib.sha256(s.encode()).hexdigest()


def acl_text(principals):
    out = []
    for name, p in principals.items():
        out.append(f"[principal {name}]")
        if "tenant" in p:
            out.append(f"tenant = {p['tenant']}")
        out.append(f"roles = {p['roles']}")
        if "cn" in p:
            out.append(f"cert-cn = {p['cn']}")
        if "token" in p:
            out.append(f"token-sha256 = {sha256_hex(p['token'])}")
        if "keys" in p:
            out.append(f"keys = {p['keys']}")
        out.append("")
    return "\n".join(out)


# ---- small helpers (the ideas of test_ops_http.py's) ----

def http_get(url, timeout=10.0, context=None, headers=None):
    """(status, body) of GET url."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def poll(cond, what, timeout=10.0, step=0.01):
    """Call cond() until it returns a true value (returned); AssertionError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(step)


def denied(fn, *args, **kw):
    """fn(*args) must raise kvpool.Error DENIED; its message."""
    with pytest.raises(kvpool.Error) as ei:
        fn(*args, **kw)
    assert ei.value.status == DENIED, f"{fn}: {ei.value.status} {ei.value}"
    return str(ei.value)


# ---- raw attackers: our frame format ----

MAGIC, VERSION = 0x3150564B, 2
HDR = struct.Struct("<IHHQIiQ")  # magic, version, method, request_id, body_len, status, epoch
M_PING, M_EXIST, M_AUTH = 1, 8, 22
RESPONSE_BIT = 0x8000


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def frame(method, body=b"", req_id=1, body_len=None):
    n = len(body) if body_len is None else body_len
    return HDR.pack(MAGIC, VERSION, method, req_id, n, 0, 0) + body


def auth_body(token):
    t = token.encode() if isinstance(token, str) else token
    return b"\x0a" + varint(len(t)) + t


def keys_body(*keys):
    return b"".join(b"\x0a" + varint(len(k)) + k.encode() for k in keys)


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return buf
        buf += chunk
    return buf


def read_frame(s):
    """(method, status, body) of the next frame, or None at end of stream."""
    h = recv_exact(s, HDR.size)
    if len(h) < HDR.size:
        return None
    magic, _ver, method, _rid, blen, status, _epoch = HDR.unpack(h)
    assert magic == MAGIC, h
    return method, status, recv_exact(s, blen)


def at_eof(s, timeout=5.0):
    """True once the peer closed (EOF or reset) within timeout."""
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
        return True
    except (ssl.SSLError, OSError) as e:  # e.g. a TLS alert after the close
        return not isinstance(e, socket.timeout)


def tls_client_ctx(ca, cert=None, key=None, maximum_version=None):
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    c.load_verify_locations(ca)
    if cert:
        c.load_cert_chain(cert, key)
    if maximum_version is not None:
        c.maximum_version = maximum_version
    return c


def tls_connect(sec, ctx=None, timeout=10.0):
    raw = socket.create_connection((sec.host, sec.port), timeout=timeout)
    try:
        return (ctx or tls_client_ctx(sec.certs.ca)).wrap_socket(raw, server_hostname=sec.host)
    except BaseException:
        raw.close()
        raise


# ---- fixtures: certificates, masters, segments ----

# Every object key this module uses goes here (case 14 looks for them in /metrics).
USED_KEYS = set()


def k(key):
    USED_KEYS.add(key)
    return key


_CRED_ENV = ("KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_TOKEN")


@pytest.fixture(scope="module", autouse=True)
def no_ambient_credentials():
    """Every credential here is named by the test itself: none comes from the environment
    (the suite's TLS pass sets $KVPOOL_TLS_*), for our clients and the CLIs we start."""
    with pytest.MonkeyPatch.context() as mp:
        for var in _CRED_ENV:
            mp.delenv(var, raising=False)
        yield


class Certs:
    def __init__(self, d):
        self.dir = str(d)
        self.ca = f"{d}/ca.crt"
        self.crl = f"{d}/crl.pem"
        self.server_crt, self.server_key = f"{d}/server.crt", f"{d}/server.key"

    def pair(self, name):
        return f"{self.dir}/{name}.crt", f"{self.dir}/{name}.key"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "make-certs.sh")
    r = subprocess.run(["bash", script, str(d), *CERT_CNS], env={**os.environ,
                       "KVPOOL_TEST_CERTS": "1"}, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    c = Certs(d)
    for f in [c.ca, c.crl, c.server_crt, c.server_key] + [x for n in CERT_CNS + (
            "expired", "revoked", "rogue") for x in c.pair(n)] + [f"{d}/rogue-ca.crt"]:
        assert os.path.getsize(f) > 0, f
    return c


def creds(certs, name):
    """kvpool.Client keyword arguments naming principal `name` (its token or certificate)."""
    p = PRINCIPALS[name]
    if "cn" not in p:
        return dict(tls_ca=certs.ca, token=p["token"])
    crt, key = certs.pair(p["cn"])
    return dict(tls_ca=certs.ca, tls_cert=crt, tls_key=key)


def cli_creds(certs, name, tmp_path):
    """The same as `kvpool` global flags (a token goes through --token-file)."""
    p = PRINCIPALS[name]
    if "cn" not in p:
        f = tmp_path / f"{name}.token"
        f.write_text(p["token"])
        return ["--tls-ca", certs.ca, "--token-file", str(f)]
    crt, key = certs.pair(p["cn"])
    return ["--tls-ca", certs.ca, "--tls-cert", crt, "--tls-key", key]


class SecureMaster:
    """kvpool-master with TLS and an ACL, its log in a file, /metrics on a port of its own,
    plus the `kvpool serve` segments mounted for it (principal segsrv)."""

    def __init__(self, certs, workdir, principals):
        self.certs = certs
        self.master_bin = _bin("KVPOOL_MASTER_BIN")
        self.cli_bin = _bin("KVPOOL_CLI_BIN")
        self.acl_path = os.path.join(workdir, "acl.ini")
        self.log_path = os.path.join(workdir, "master.log")
        self.principals = dict(principals)
        self._reloads = 0
        with open(self.acl_path, "w") as f:
            f.write(acl_text(self.principals))
        self.http_port = free_port()
        self._https = None  # does the HTTP port speak TLS? (found at the first request)
        self._log = open(self.log_path, "wb")
        self.segments = []
        try:
            self.master = self._start_master(certs)
        except BaseException:
            self._log.close()
            raise
        self.addr = self.master.ready
        self.host, port = self.addr.rsplit(":", 1)
        self.port = int(port)

    extra_args = ()  # flags a subclass adds (a flag given again overrides the one above)

    def _start_master(self, certs):
        return Proc([self.master_bin, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
                            "--log-level", "info", "--lease-ttl", "0",
                            "--http-listen", f"127.0.0.1:{self.http_port}",
                            "--tls-cert", certs.server_crt, "--tls-key", certs.server_key,
                            "--tls-ca", certs.ca, "--tls-crl", certs.crl,
                            "--acl-file", self.acl_path, *self.extra_args], stderr=self._log)

    @property
    def pid(self):
        return self.master.pid

    def add_segment(self, size="64MiB", principal="segsrv"):
        crt, key = self.certs.pair(PRINCIPALS[principal]["cn"])
        s = Proc([self.cli_bin, "--master", self.addr, "--tls-ca", self.certs.ca, "--tls-cert",
                  crt, "--tls-key", key, "serve", "--segment-size", size, "--ready-fd", "{fd}"])
        self.segments.append(s)
        return s

    def client(self, name, **kw):
        return kvpool.Client(self.addr, **creds(self.certs, name), **kw)

    def http(self, path, token=None, timeout=10.0):
        """(status, body) of GET path on the master's HTTP port: HTTPS verified against our
        CA where the master serves HTTPS (with TLS on), else plain HTTP. token: sent as a
        bearer token, over HTTPS only (never in clear)."""
        if self._https is None:  # a plain HTTP server answers a plain request with HTTP
            with socket.create_connection(("127.0.0.1", self.http_port), timeout=10) as raw:
                raw.sendall(b"GET /health HTTP/1.0\r\n\r\n")
                try:
                    first = raw.recv(5)
                except ConnectionResetError:
                    first = b""
            self._https = first != b"HTTP/"
        if self._https:
            return http_get(f"https://127.0.0.1:{self.http_port}{path}", timeout,
                            tls_client_ctx(self.certs.ca),
                            {"Authorization": f"Bearer {token}"} if token else None)
        return http_get(f"http://127.0.0.1:{self.http_port}{path}", timeout)

    def metrics(self):
        status, text = self.http("/metrics")
        assert status == 200, text
        return text

    def refused(self, reason, text=None):
        return metric(text or self.metrics(), "kvpool_connections_refused_total",
                      {"reason": reason})

    def req_refused(self, reason, text=None):
        return metric(text or self.metrics(), "kvpool_requests_refused_total",
                      {"reason": reason})

    def segment_status(self, name):
        status, body = self.http("/api/v1/segments", token=TOKENS["admin"])
        assert status == 200, body
        for s in json.loads(body)["segments"]:
            if s["name"] == name:
                return s["status"]
        return None

    def rss_kib(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def log_text(self):
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def auth_status(self, token):
        """A raw TLS connection sending Auth(token): the reply's frame status."""
        with tls_connect(self) as s:
            s.sendall(frame(M_AUTH, auth_body(token)))
            r = read_frame(s)
            assert r is not None, "no reply to Auth"
            return r[1]

    def reload(self, principals):
        """Rewrite the ACL (atomically), SIGHUP the master and wait until it took the new
        file: a canary principal that only the new file names gets in."""
        self._reloads += 1
        canary = f"canary-{_RUN}-{self._reloads}"
        self.principals = dict(principals)
        tmp = self.acl_path + ".new"
        with open(tmp, "w") as f:
            f.write(acl_text({**self.principals, f"reload-canary-{self._reloads}":
                              dict(roles="read", token=canary)}))
        os.replace(tmp, self.acl_path)
        os.kill(self.pid, signal.SIGHUP)
        poll(lambda: self.auth_status(canary) == 0, "the master reloaded its ACL")

    def close(self):
        bad = []
        for p in self.segments + [self.master]:
            rc = p.stop()
            if rc != 0:
                bad.append((p.argv[0], rc))
        self._log.close()
        return bad


@pytest.fixture(scope="module")
def sec(certs, tmp_path_factory):
    """The module's master (every principal of PRINCIPALS) and one 64 MiB segment."""
    m = SecureMaster(certs, str(tmp_path_factory.mktemp("master")), PRINCIPALS)
    try:
        m.seg = m.add_segment()
    except BaseException:
        m.close()
        raise
    _SEC["m"] = m
    yield m
    _SEC.pop("m", None)
    bad = m.close()
    assert not bad, f"children exited non-zero: {bad}"


@pytest.fixture
def make_secure(certs, tmp_path):
    """make_secure(principals) -> a SecureMaster of this test's own, with one segment."""
    made = []

    def make(principals):
        d = tmp_path / f"m{len(made)}"
        d.mkdir()
        m = SecureMaster(certs, str(d), principals)
        made.append(m)
        m.seg = m.add_segment()
        return m

    yield make
    close_all(made)


def close_all(masters):
    """Close each master a fixture made; fail if any child exited non-zero."""
    bad = []
    for m in masters:
        bad += m.close()
    assert not bad, f"children exited non-zero: {bad}"


@pytest.fixture(scope="module")
def admin(sec):
    with sec.client("admin") as c:
        yield c


@pytest.fixture
def victim(sec, admin):
    """A victim object of bob's, put by bob himself: (key, bytes); checked by intact()."""
    key = k(f"b@victim-{uuid.uuid4().hex[:8]}")
    data = os.urandom(100_000)
    with sec.client("bob") as bob:
        bob.put(key, data)
        assert bob.get(key) == data
    return key, data


# Keys are scoped by tenant: an object is read back by a principal of its own tenant
# (alice team-a, bob team-b, carol team-c, by the key's prefix; others the admin's).
_OWNER_BY_PREFIX = {"a@": "alice", "b@": "bob", "c@": "carol"}
_SEC = {}


def owner_of(key):
    return _OWNER_BY_PREFIX.get(key[:2], "admin")


def intact(admin, key, data):
    """The object reads back byte-identical, as its own tenant sees it."""
    who = owner_of(key)
    if who == "admin":
        c, close = admin, False
    else:  # its own credentials only (a test may have set $KVPOOL_TLS_* for mooncake)
        saved = {v: os.environ.pop(v) for v in _CRED_ENV if v in os.environ}
        try:
            c, close = _SEC["m"].client(who), True
        finally:
            os.environ.update(saved)
    try:
        assert c.exists(key), f"{key} is gone"
        assert c.size(key) == len(data)
        assert c.get(key) == data, f"{key} changed"
    finally:
        if close:
            c.close()


def stored(admin, tenant, key):
    """Does the pool hold `key` of `tenant` (the admin's listing: every tenant's, labelled)?"""
    import re as _re
    return any(e["key"] == key and e["tenant"] == tenant
               for e in admin.list_keys("^" + _re.escape(key) + "$"))


# ---- 1. legitimate round trips ----

def test_legitimate_token_cert_and_mooncake_env(sec, admin, monkeypatch):
    data_a = os.urandom(256 * 1024)
    with sec.client("alice") as alice:  # a token principal
        alice.put(k("a@legit-token"), data_a)
        assert alice.get("a@legit-token") == data_a
        assert alice.exists("a@legit-token") and alice.size("a@legit-token") == len(data_a)
    data_b = os.urandom(300_001)
    with sec.client("bob") as bob:  # a certificate principal
        bob.put(k("b@legit-cert"), data_b)
        assert bob.get("b@legit-cert") == data_b
    intact(admin, "a@legit-token", data_a)
    intact(admin, "b@legit-cert", data_b)

    # mooncake.store: no new arguments, the credentials come from the environment
    from mooncake.store import MooncakeDistributedStore
    for var in ("KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KVPOOL_TLS_CA", sec.certs.ca)
    monkeypatch.setenv("KVPOOL_TOKEN", TOKENS["alice"])
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", sec.addr) == 0
    try:
        data_m = os.urandom(50_000)
        assert s.put(k("a@mooncake-env"), data_m) == 0
        assert s.get("a@mooncake-env") == data_m
        assert s.is_exist("a@mooncake-env") == 1
        # the same store may not write outside alice's keys
        assert s.put(k("b@legit-cert"), b"overwritten") < 0
    finally:
        s.close()
    intact(admin, "b@legit-cert", data_b)
    # a certificate through the environment too
    monkeypatch.delenv("KVPOOL_TOKEN")
    crt, key = sec.certs.pair("bob")
    monkeypatch.setenv("KVPOOL_TLS_CERT", crt)
    monkeypatch.setenv("KVPOOL_TLS_KEY", key)
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", sec.addr) == 0
    try:
        assert s.get("b@legit-cert") == data_b
    finally:
        s.close()
    # and a wrong token in the environment gets no store at all
    monkeypatch.delenv("KVPOOL_TLS_CERT")
    monkeypatch.delenv("KVPOOL_TLS_KEY")
    monkeypatch.setenv("KVPOOL_TOKEN", WRONG_TOKEN)
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", sec.addr) != 0
    s.close()


# ---- 2. plain TCP to the TLS port ----

def test_plain_tcp_to_the_tls_port(sec, admin, victim, monkeypatch):
    before = sec.refused("tls")
    with socket.create_connection((sec.host, sec.port), timeout=10) as s:
        s.sendall(frame(M_PING))
        got = b""
        s.settimeout(10)
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except ConnectionResetError:
            pass
    # whatever came back (a TLS alert at most) is no kvpool frame
    assert struct.pack("<I", MAGIC) not in got, got
    poll(lambda: sec.refused("tls") > before, "the plain connection counted as refused (tls)")

    for var in ("KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    t0 = time.monotonic()
    with pytest.raises(kvpool.Error) as ei:
        kvpool.Client(sec.addr, rpc_timeout_ms=3000)
    print(f"plain client refused in {time.monotonic() - t0:.2f} s: {ei.value}")
    intact(admin, *victim)


# ---- 3. refused certificates ----

@pytest.mark.parametrize("cert, reason", [("rogue", "unknown ca"), ("expired", "expired"),
                                          ("revoked", "revoked")])
def test_refused_certificates(sec, admin, victim, cert, reason):
    before = sec.refused("tls")
    crt, key = sec.certs.pair(cert)
    msg = denied(kvpool.Client, sec.addr, tls_ca=sec.certs.ca, tls_cert=crt, tls_key=key)
    assert reason in msg.lower(), msg
    assert sec.refused("tls") >= before + 1
    # the same with a raw TLS client: the master's verdict is an alert, never a reply
    try:
        with tls_connect(sec, tls_client_ctx(sec.certs.ca, crt, key)) as s:
            s.sendall(frame(M_EXIST, keys_body(victim[0])))
            r = read_frame(s)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        r = None
    assert r is None, f"the master answered a refused certificate: {r}"
    intact(admin, *victim)


# ---- 4. TLS below 1.3 ----

def test_tls12_cannot_handshake(sec):
    ctx = tls_client_ctx(sec.certs.ca, *sec.certs.pair("admin"),
                         maximum_version=ssl.TLSVersion.TLSv1_2)
    with pytest.raises(ssl.SSLError):
        tls_connect(sec, ctx).close()
    # and 1.3 is what a default client gets
    with tls_connect(sec) as s:
        assert s.version() == "TLSv1.3"


# ---- 5. wrong tokens, tokens without TLS, impostor masters ----

def test_wrong_token(sec, admin, victim):
    before = sec.refused("bad_token")
    msg = denied(kvpool.Client, sec.addr, tls_ca=sec.certs.ca, token=WRONG_TOKEN)
    assert "token" in msg, msg
    assert sec.refused("bad_token") == before + 1
    # raw: a DENIED reply in the master's words, then the connection is closed
    with tls_connect(sec) as s:
        s.sendall(frame(M_AUTH, auth_body(WRONG_TOKEN)))
        method, status, body = read_frame(s)
        assert method == M_AUTH | RESPONSE_BIT and status == DENIED, (method, status, body)
        assert b"no principal has this token" in body, body
        assert at_eof(s)
    assert sec.refused("bad_token") == before + 2
    # an empty token names nobody either
    assert sec.auth_status(b"") == DENIED
    intact(admin, *victim)


def test_token_without_ca_is_never_sent(sec, monkeypatch):
    for var in ("KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    # a listener of ours in place of the master: nothing may even connect to it
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(8)
        lst.setblocking(False)
        addr = "127.0.0.1:%d" % lst.getsockname()[1]
        with pytest.raises(kvpool.Error) as ei:
            kvpool.Client(addr, token=TOKENS["alice"])
        assert "TLS" in str(ei.value), ei.value
        monkeypatch.setenv("KVPOOL_TOKEN", TOKENS["alice"])
        with pytest.raises(kvpool.Error):
            kvpool.Client(addr)
        with pytest.raises(BlockingIOError):
            lst.accept()  # nobody connected


def _impostor(ctx, rec):
    """Serve one connection on rec['sock'] as a fake master: TLS with ctx (None: plain);
    records every byte it got (decrypted) and whether a handshake finished."""
    lst = rec["sock"]
    lst.settimeout(20)
    try:
        conn, _ = lst.accept()
    except OSError as e:
        rec["error"] = repr(e)
        return
    conn.settimeout(10)
    got = b""
    try:
        if ctx is not None:
            conn = ctx.wrap_socket(conn, server_side=True)
            rec["handshake"] = True
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
    except (OSError, ssl.SSLError) as e:
        rec["error"] = repr(e)
    finally:
        rec["got"] = got
        conn.close()


@pytest.mark.parametrize("impostor", ["plaintext", "rogue-ca", "tenant-cert"])
def test_token_never_reaches_an_impostor_master(certs, impostor):
    """A client given a token and our CA talks to something that is not our master: the
    token must not leave it (in clear, or to a TLS server our CA did not make a server)."""
    ctx = None
    if impostor == "rogue-ca":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*certs.pair("rogue"))
    elif impostor == "tenant-cert":  # alice's own valid client certificate, from our CA
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*certs.pair("alice"))
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(4)
    rec = {"sock": lst, "handshake": False}
    t = threading.Thread(target=_impostor, args=(ctx, rec), daemon=True)
    t.start()
    try:
        with pytest.raises(kvpool.Error):
            kvpool.Client("127.0.0.1:%d" % lst.getsockname()[1], rpc_timeout_ms=3000,
                          tls_ca=certs.ca, token=TOKENS["carol"])
        t.join(30)
        assert not t.is_alive()
    finally:
        lst.close()
    got = rec.get("got", b"")
    assert TOKENS["carol"].encode() not in got, f"the token reached the {impostor} impostor"
    if impostor == "plaintext":
        assert got[:1] == b"\x16", got[:16]  # a TLS ClientHello, nothing in clear
    else:
        assert not rec["handshake"] or got == b"", rec


# ---- 6. a flood of wrong tokens ----

FLOOD_N = 10_000
FLOOD_THREADS = 8

# Runs in a process of its own (so that the legitimate client's latencies measure the
# master, not this process's GIL): argv host port ca prefix n threads; prints JSON.
_FLOOD_SRC = r"""
import json, socket, ssl, struct, sys, threading, time
host, ca, prefix = sys.argv[1], sys.argv[3], sys.argv[4]
port, n, nthreads = int(sys.argv[2]), int(sys.argv[5]), int(sys.argv[6])
HDR = struct.Struct("<IHHQIiQ")
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.load_verify_locations(ca)
res = {"ok": 0, "denied": 0, "other": {}, "no_reply": 0, "not_closed": 0, "errors": []}
lock = threading.Lock()
def recv_exact(s, k):
    b = b""
    while len(b) < k:
        c = s.recv(k - len(b))
        if not c:
            break
        b += c
    return b
def one(i):
    tok = (prefix + "%06d" % i).encode()
    body = b"\x0a" + bytes([len(tok)]) + tok
    with socket.create_connection((host, port), timeout=30) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as s:
            s.sendall(HDR.pack(0x3150564B, 2, 22, i, len(body), 0, 0) + body)
            h = recv_exact(s, 32)
            if len(h) < 32:
                return "no_reply"
            st = HDR.unpack(h)[5]
            recv_exact(s, HDR.unpack(h)[4])
            try:
                closed = s.recv(1) == b""
            except (ConnectionResetError, ssl.SSLError):
                closed = True
            if st == 0:
                return "ok"
            if st != -38:
                return "status %d" % st
            return "denied" if closed else "not_closed"
def worker(lo, hi):
    for i in range(lo, hi):
        try:
            r = one(i)
        except Exception as e:
            r = "error"
            with lock:
                if len(res["errors"]) < 5:
                    res["errors"].append(repr(e))
        with lock:
            if r in ("ok", "denied", "no_reply", "not_closed"):
                res[r] += 1
            else:
                res["other"][r] = res["other"].get(r, 0) + 1
t0 = time.monotonic()
per = n // nthreads
ths = [threading.Thread(target=worker, args=(j * per, n if j == nthreads - 1 else (j + 1) * per))
       for j in range(nthreads)]
for t in ths: t.start()
for t in ths: t.join()
res["seconds"] = time.monotonic() - t0
print(json.dumps(res), flush=True)
"""


def test_token_flood_is_refused_and_the_master_keeps_answering(sec, admin, victim):
    with sec.client("alice") as alice:
        alice.put(k("a@flood-probe"), b"probe")

        def timed_exist():
            t0 = time.perf_counter()
            assert alice.exists("a@flood-probe")
            return time.perf_counter() - t0

        for _ in range(20):  # warm up
            timed_exist()
        normal = [timed_exist() for _ in range(300)]
        bad_before = sec.refused("bad_token")
        p = subprocess.Popen([sys.executable, "-c", _FLOOD_SRC, sec.host, str(sec.port),
                              sec.certs.ca, FLOOD_PREFIX, str(FLOOD_N), str(FLOOD_THREADS)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        during, failures = [], []
        try:
            while p.poll() is None:
                try:
                    during.append(timed_exist())
                except Exception as e:  # noqa: BLE001 (any failure is the finding)
                    failures.append(repr(e))
                    time.sleep(0.01)
            out, err = p.communicate(timeout=60)
        finally:
            if p.returncode is None:
                p.kill()
                p.wait(10)
    assert p.returncode == 0, err.decode()
    res = json.loads(out)
    print(f"\n{FLOOD_N} wrong tokens from {FLOOD_THREADS} threads took {res['seconds']:.1f} s")
    assert len(during) >= 20, f"only {len(during)} exist calls during the flood"
    med_n, med_d = statistics.median(normal), statistics.median(during)
    p99 = sorted(during)[int(len(during) * 0.99)]
    print(f"exist latency median: normal {med_n * 1e3:.2f} ms, during the flood "
          f"{med_d * 1e3:.2f} ms (p99 {p99 * 1e3:.2f} ms, {len(during)} calls)")
    assert res["ok"] == 0, res
    assert res["denied"] == FLOOD_N, res
    assert not failures, failures[:5]
    assert med_d < 0.050, (med_n, med_d)
    assert sec.refused("bad_token") == bad_before + FLOOD_N
    intact(admin, *victim)
    intact(admin, "a@flood-probe", b"probe")


# ---- 7. oversized and premature frames before authentication ----

def test_preauth_oversized_frame_allocates_nothing(sec, admin, victim):
    rss0 = sec.rss_kib()
    for i in range(20):
        with tls_connect(sec) as s:
            s.sendall(frame(M_AUTH if i % 2 else M_PING, body_len=1 << 30))
            r = read_frame(s)
            if r is not None:  # an error reply (or nothing), then the close
                method, status, body = r
                assert status == kvpool.ERR_FRAME_TOO_LARGE, (status, body)
            assert at_eof(s)
    # one that keeps sending after its header: still closed, nothing kept
    with tls_connect(sec) as s:
        s.sendall(frame(M_AUTH, body_len=1 << 30))
        try:
            for _ in range(64):
                s.sendall(b"\0" * 65536)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
    rss1 = sec.rss_kib()
    print(f"master VmRSS {rss0} KiB -> {rss1} KiB")
    assert rss1 - rss0 < 4 * 1024, (rss0, rss1)
    intact(admin, *victim)


def test_preauth_frame_size_refusal_says_why_in_whole(sec):
    """The FRAME_TOO_LARGE text before authentication must say so in full ("... at most
    4096 bytes before authentication)"), not cut off mid-word."""
    with tls_connect(sec) as s:
        s.sendall(frame(M_PING, body_len=1 << 30))
        r = read_frame(s)
    assert r is not None
    body = r[2].decode()
    assert body.endswith("before authentication)"), body


def test_request_before_auth_is_refused(sec, admin, victim):
    before = sec.refused("unauthenticated")
    for method, body in ((M_EXIST, keys_body(victim[0])), (M_PING, b"")):
        with tls_connect(sec) as s:
            s.sendall(frame(method, body))
            r = read_frame(s)
            assert r is not None, "no reply"
            assert r[0] == method | RESPONSE_BIT and r[1] == DENIED, r
            assert b"authentication required" in r[2], r
            assert at_eof(s)
    assert sec.refused("unauthenticated") == before + 2
    # a certificate the ACL does not name is no principal either (the rogue one is refused
    # by TLS; use a valid certificate whose CN no principal has: alice is a token principal)
    ctx = tls_client_ctx(sec.certs.ca, *sec.certs.pair("alice"))
    with tls_connect(sec, ctx) as s:
        s.sendall(frame(M_EXIST, keys_body("a@legit-token")))
        r = read_frame(s)
        assert r is not None and r[1] == DENIED, r
        assert at_eof(s)
    assert sec.refused("unauthenticated") == before + 3
    intact(admin, *victim)


def test_preauth_response_frames_do_not_keep_a_connection(sec):
    """Before authentication only Auth is taken: a frame with the response bit set is no
    way around that (it must not get answers forever on a connection never authenticated)."""
    with tls_connect(sec) as s:
        replies = 0
        for i in range(3):
            try:
                s.sendall(frame(M_EXIST | RESPONSE_BIT, req_id=i))
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                break
            r = read_frame(s)
            if r is None:
                break
            assert r[1] != 0, r
            replies += 1
        assert replies <= 1, f"an unauthenticated connection got {replies} answers, still open"
        assert at_eof(s)


# ---- 8. a principal deleted while connected ----

RELOAD_PRINCIPALS = {n: PRINCIPALS[n] for n in ("admin", "segsrv", "alice", "bob", "carol")}


@pytest.mark.parametrize("who", ["alice", "bob"])  # a token principal, a certificate one
def test_principal_removed_while_connected(make_secure, who):
    m = make_secure(RELOAD_PRINCIPALS)
    own = k(f"{who[0]}@own-removed")
    data = os.urandom(70_000)
    with m.client("admin") as adm, m.client(who) as x, m.client("carol") as carol:
        x.put(own, data)
        assert x.get(own) == data
        carol.put(k("c@carol-obj"), b"carol")
        adm.put(k("victim@admin-obj"), b"admin's")
        removed0 = m.refused("principal_removed")

        m.reload({n: p for n, p in RELOAD_PRINCIPALS.items() if n != who})

        msg1 = denied(x.get, own)
        msg2 = denied(x.exists, own)
        print(f"\nafter removal: {msg1!r}; then {msg2!r}")
        denied(x.put, f"{who[0]}@after-removal", b"x")
        # others are unaffected
        assert carol.get("c@carol-obj") == b"carol"
        carol.put(k("c@after-reload"), b"still")
        assert adm.get("victim@admin-obj") == b"admin's"
        # removing a principal deletes nothing of its data (its tenant's, in the listing)
        tenant = PRINCIPALS[who]["tenant"]
        assert [e["size"] for e in adm.list_keys("^" + own + "$") if e["tenant"] == tenant] == [
            len(data)]
        assert not stored(adm, tenant, f"{who[0]}@after-removal")
        assert m.refused("principal_removed") >= removed0 + 1
        # and no new connection of its gets in
        with pytest.raises(kvpool.Error) as ei:
            m.client(who)
        assert ei.value.status == DENIED, ei.value


def test_removed_principal_is_told_why(make_secure):
    """The refusal of a removed principal's next call is in the master's own words, on a
    raw connection and through kvpool.Client (not the generic text about protected mode)."""
    m = make_secure(RELOAD_PRINCIPALS)
    with m.client("alice") as alice, tls_connect(m) as raw:
        alice.put(k("a@told-why"), b"v")
        raw.sendall(frame(M_AUTH, auth_body(TOKENS["alice"])))
        r = read_frame(raw)
        assert r is not None and r[1] == 0, r
        m.reload({n: p for n, p in RELOAD_PRINCIPALS.items() if n != "alice"})
        raw.sendall(frame(M_EXIST, keys_body("a@told-why")))
        r = read_frame(raw)
        assert r is not None and r[1] == DENIED, r
        assert b"principal alice was removed from the ACL" in r[2], r
        assert at_eof(raw)
        msg = denied(alice.get, "a@told-why")
        assert "removed" in msg, msg
        assert "protected mode" not in msg, msg


# ---- 9. a role narrowed mid-session ----

def test_role_narrowed_mid_session(make_secure):
    m = make_secure(RELOAD_PRINCIPALS)
    with m.client("admin") as adm, m.client("alice") as alice:
        alice.put(k("a@before-narrowing"), b"v1")
        assert alice.get("a@before-narrowing") == b"v1"
        role0 = m.req_refused("role")

        narrowed = dict(RELOAD_PRINCIPALS)
        narrowed["alice"] = {**PRINCIPALS["alice"], "roles": "read"}
        m.reload(narrowed)

        msg = denied(alice.put, k("a@after-narrowing"), b"v2")
        assert "role" in msg, msg
        denied(alice.put, "a@before-narrowing", b"v2", upsert=True)
        denied(alice.remove, "a@before-narrowing")
        assert alice.get("a@before-narrowing") == b"v1"  # reading still works
        assert alice.exists("a@before-narrowing")
        assert not alice.exists("a@after-narrowing")
        assert not stored(adm, "team-a", "a@after-narrowing")
        assert stored(adm, "team-a", "a@before-narrowing")
        assert m.req_refused("role") >= role0 + 3


# ---- 10. key isolation between tenants ----

def test_key_isolation_between_tenants(sec, admin):
    bob_key, bob_data = k("b@team-b-secret"), os.urandom(123_457)
    bob_keys = [k(f"b@team-b-{i}") for i in range(3)]
    with sec.client("bob") as bob:
        bob.put(bob_key, bob_data)
        for key in bob_keys:
            bob.put(key, key.encode() * 10)
    key0 = sec.req_refused("key")
    with sec.client("alice") as alice:
        alice.put(k("a@team-a-own"), b"alice's")
        denied(alice.get, bob_key)
        denied(alice.exists, bob_key)
        denied(alice.size, bob_key)
        denied(alice.remove, bob_key)
        denied(alice.remove, bob_key, force=True)
        denied(alice.put, bob_key, b"overwritten")
        denied(alice.put, bob_key, b"overwritten", upsert=True)
        # a batch with one of bob's keys among hers is refused whole
        with pytest.raises(kvpool.Error) as ei:
            alice.batch_put([k("a@batch-mixed"), bob_key], [b"x", b"y"], upsert=True)
        assert ei.value.status == DENIED
        with pytest.raises(kvpool.Error) as ei:
            alice.batch_exists(["a@team-a-own", bob_key])
        assert ei.value.status == DENIED
        with pytest.raises(kvpool.Error) as ei:
            alice.batch_get(["a@team-a-own", bob_key])
        assert ei.value.status == DENIED
        with pytest.raises(kvpool.Error) as ei:
            alice.batch_remove(["a@team-a-own", bob_key], force=True)
        assert ei.value.status == DENIED
        buf = bytearray(len(bob_data))
        with pytest.raises(kvpool.Error) as ei:
            alice.get_into(bob_key, buf)
        assert ei.value.status == DENIED and not any(buf)
        # a regex that matches bob's keys removes none of them (hers only)
        assert alice.remove_by_regex("^b@", force=True) == 0
        assert alice.remove_by_regex("^[ab]@team-", force=True) == 1
        # listing shows hers only
        listed = [e["key"] for e in alice.list_keys()]
        assert not [x for x in listed if not x.startswith("a@")], listed
        assert alice.list_keys("^b@") == []
        # a write outside her patterns leaves nothing behind
        denied(alice.put, k("zz@outside-any-pattern"), b"nope")
        denied(alice.put, k("A@case-differs"), b"nope")
    assert not stored(admin, "team-a", "zz@outside-any-pattern")
    assert not stored(admin, "team-a", "A@case-differs")
    assert not stored(admin, "team-a", k("a@batch-mixed"))
    assert not stored(admin, "team-a", k("a@team-a-own"))  # the regex removed hers
    assert stored(admin, "team-b", bob_key)  # (the check above sees what is there)
    assert sec.req_refused("key") >= key0 + 10
    intact(admin, bob_key, bob_data)
    for key in bob_keys:
        intact(admin, key, key.encode() * 10)


def walk_keys(fetch, params):
    """/api/v1/keys walked page by page by its cursor, as the docs say (a page may be cut
    short on the master's time budget): fetch(path) -> (status, body). The first
    non-200 answer as it came, else (200, every page's body joined)."""
    bodies, cursor = [], 0
    for _ in range(10000):
        status, body = fetch("/api/v1/keys?" + urllib.parse.urlencode(
            dict(params, cursor=cursor)))
        if status != 200:
            return status, body
        bodies.append(body)
        cursor = json.loads(body)["next_cursor"]
        if cursor == 0:
            return 200, "\n".join(bodies)
    raise AssertionError("/api/v1/keys never reached its end")


def test_http_views_show_no_tenant_keys_to_non_admins(sec):
    """The master's HTTP JSON views are no way around key isolation: a caller with no
    token, or a tenant's, does not see another tenant's keys there."""
    with sec.client("bob") as bob:
        bob.put(k("b@http-secret"), b"s", upsert=True)
    q = {"regex": "^b@", "limit": 1000}
    status, body = walk_keys(lambda path: sec.http(path, token=TOKENS["admin"]), q)
    assert status == 200 and "b@http-secret" in body, (status, body)  # the query works
    for who, token in (("nobody", None), ("alice", TOKENS["alice"])):
        status, body = walk_keys(lambda path: sec.http(path, token=token), q)
        assert "b@http-secret" not in body, f"{who} reads bob's keys over HTTP: {status} {body}"
    # Mooncake's /get_all_keys: every tenant's keys, so an admin's only
    status, body = sec.http("/get_all_keys", token=TOKENS["admin"])
    assert status == 200 and k("b@http-secret") in body.split("\n"), (status, body[:200])
    for who, token, want in (("nobody", None, 401), ("alice", TOKENS["alice"], 403)):
        status, body = sec.http("/get_all_keys", token=token)
        assert status == want and "b@http-secret" not in body, (who, status, body[:200])


def test_http_admin_by_client_certificate(sec):
    """The HTTPS views take an admin's client certificate in place of a bearer token,
    verified as the control port verifies one (its CA and CRL): the admin's certificate
    alone lists the keys; bob's (no admin) gets 403; an expired, a revoked and a rogue-CA
    certificate, each naming an admin of the ACL, get 401 as no credential at all; each
    refusal counted."""
    if not sec.http("/health")[0] == 200 or not sec._https:
        pytest.skip("the master serves plain HTTP here")  # (never: sec runs TLS)
    with sec.client("bob") as bob:
        bob.put(k("b@http-cert"), b"s", upsert=True)
    q = "/api/v1/keys?" + urllib.parse.urlencode({"regex": "^b@http-cert", "limit": 10})
    url = f"https://127.0.0.1:{sec.http_port}{q}"

    def as_cert(name, ca=None):
        crt, key = sec.certs.pair(name)
        ctx = tls_client_ctx(sec.certs.ca, crt, key)
        return walk_keys(lambda path: http_get(f"https://127.0.0.1:{sec.http_port}{path}", 10,
                                               ctx), {"regex": "^b@http-cert", "limit": 10})

    def refused(reason):
        return metric(sec.metrics(), "kvpool_http_refused_total", {"reason": reason})

    status, body = as_cert("admin")
    assert status == 200 and "b@http-cert" in body, (status, body)
    role0, unauth0 = refused("role"), refused("unauthenticated")
    status, body = as_cert("bob")
    assert status == 403 and "b@http-cert" not in body and "not an admin" in body, (status, body)
    assert refused("role") == role0 + 1
    for bad in ("expired", "revoked", "rogue"):
        status, body = as_cert(bad)
        assert status == 401 and "b@http-cert" not in body, (bad, status, body)
    status, body = http_get(url, 10, tls_client_ctx(sec.certs.ca))  # no certificate
    assert status == 401 and "client certificate" in body, (status, body)
    assert refused("unauthenticated") == unauth0 + 4


# ---- 11. a reader writing ----

def test_reader_cannot_write(sec, admin, victim):
    role0 = sec.req_refused("role")
    admin.put(k("victim@reader-reads"), b"default tenant's", upsert=True)
    with sec.client("reader") as reader:
        # a reader reads every key of its tenant (no patterns): the admin's, both "default"
        assert reader.get("victim@reader-reads") == b"default tenant's"
        assert not reader.exists(victim[0])  # bob's is team-b's: not in its tenant
        denied(reader.put, victim[0], b"overwritten", upsert=True)
        denied(reader.put, k("b@reader-new"), b"new")
        denied(reader.remove, victim[0])
        denied(reader.remove, victim[0], force=True)
        denied(reader.remove_by_regex, "^b@", force=True)
        with pytest.raises(kvpool.Error) as ei:
            reader.batch_remove([victim[0]], force=True)
        assert ei.value.status == DENIED
    assert sec.req_refused("role") >= role0 + 6
    assert not admin.exists("b@reader-new")
    intact(admin, *victim)


# ---- 12. remove_all and drain by non-admins ----

def test_non_admin_remove_all_and_drain(sec, admin, victim, tmp_path):
    with sec.client("alice") as alice:
        alice.put(k("a@survives-remove-all"), b"alice's")
        msg = denied(alice.remove_all)
        assert "admin" in msg, msg
        denied(alice.remove_all, force=True)
    with sec.client("bob") as bob:
        denied(bob.remove_all, force=True)
    with sec.client("reader") as reader:
        denied(reader.remove_all)
    intact(admin, *victim)
    intact(admin, "a@survives-remove-all", b"alice's")

    seg = sec.seg.ready
    assert sec.segment_status(seg) == "mounted"
    for name in ("alice", "segthief", "bob"):  # no role segment; segment, not its owner
        r = subprocess.run([sec.cli_bin, "--master", sec.addr, *cli_creds(sec.certs, name,
                            tmp_path), "drain", "--wait", "5", seg],
                           capture_output=True, timeout=60)
        out = (r.stdout + r.stderr).decode()
        print(f"\nkvpool drain by {name}: exit {r.returncode}: {out.strip()}")
        assert r.returncode != 0, out
        assert "DENIED" in out or "may" in out, out
        assert sec.segment_status(seg) == "mounted", f"{seg} drains after {name}'s refusal"
    # the segment still serves: old objects read back, new ones go in
    intact(admin, *victim)
    admin.put(k("b@after-drain-attempts"), b"fresh", upsert=True)
    assert admin.get("b@after-drain-attempts") == b"fresh"
    assert sec.segment_status(seg) == "mounted"


def test_refused_admin_actions_are_not_audited_as_success(sec, admin, victim, tmp_path):
    """The audit log must not record a refused remove-all or drain as a success."""
    with sec.client("carol") as carol:
        denied(carol.remove_all)
    seg = sec.seg.ready
    r = subprocess.run([sec.cli_bin, "--master", sec.addr, *cli_creds(sec.certs, "segthief",
                        tmp_path), "drain", "--wait", "5", seg], capture_output=True, timeout=60)
    assert r.returncode != 0
    assert sec.segment_status(seg) == "mounted"
    intact(admin, *victim)
    for what, who in (("remove-all", "carol"), ("drain", "segthief")):
        lines = poll(lambda: [ln for ln in sec.log_text().splitlines()
                              if "audit: " + what in ln and f" by principal {who} " in ln],
                     f"an audit line for {who}'s {what}")
        assert not [ln for ln in lines if "): success" in ln], \
            f"a refused {what} is audited as a success: {lines}"


def test_cli_drain_refusal_in_the_masters_words(sec, tmp_path):
    """`kvpool drain` of a segment the caller does not serve: the CLI's error says what the
    master said (not the generic text about protected mode)."""
    seg = sec.seg.ready
    r = subprocess.run([sec.cli_bin, "--master", sec.addr, *cli_creds(sec.certs, "segthief",
                        tmp_path), "drain", "--wait", "5", seg], capture_output=True, timeout=60)
    assert r.returncode == 1
    err = [ln for ln in r.stderr.decode().splitlines() if ln.startswith("kvpool: drain")]
    assert err, r.stderr.decode()
    assert "may drain only the segments it serves itself" in err[-1], err[-1]
    assert "protected mode" not in err[-1], err[-1]


# ---- 13. mounting without the segment role ----

def test_segment_mount_needs_the_segment_role(sec, admin, tmp_path):
    before = json.loads(sec.http("/api/v1/segments", token=TOKENS["admin"])[1])["total_segments"]
    msg = denied(sec.client, "alice", segment_size="16MiB")
    assert "segment" in msg, msg
    denied(sec.client, "bob", segment_size="16MiB")
    denied(sec.client, "reader", segment_size=16 << 20)
    # `kvpool serve` as alice: exits with an error, never serves
    p = subprocess.Popen([sec.cli_bin, "--master", sec.addr, *cli_creds(sec.certs, "alice",
                          tmp_path), "serve", "--segment-size", "16MiB"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = p.communicate(timeout=30)
    finally:
        if p.returncode is None:
            p.kill()
            p.wait(10)
    assert p.returncode not in (0, None), err.decode()
    after = json.loads(sec.http("/api/v1/segments", token=TOKENS["admin"])[1])["total_segments"]
    assert after == before, (before, after)


# ---- 14. no secrets in the log or /metrics ----

def test_no_secrets_in_log_or_metrics(sec):
    # this test's own uses of a right and a wrong token (the earlier tests' also count)
    with sec.client("alice") as alice:
        alice.put(k("a@secret-check"), b"v", upsert=True)
    with pytest.raises(kvpool.Error):
        kvpool.Client(sec.addr, tls_ca=sec.certs.ca, token=WRONG_TOKEN + "-again")
    log = sec.log_text()
    text = sec.metrics()
    assert "ACL" in log and "refused" in log  # the log is the one we think it is
    secrets = list(TOKENS.values()) + [WRONG_TOKEN, FLOOD_PREFIX]
    for s in secrets:
        assert s not in log, f"a token is in the master's log: {s}"
        assert s not in text, f"a token is in /metrics: {s}"
    # the private keys' bytes
    for name in ("server",) + CERT_CNS:
        with open(sec.certs.pair(name)[1]) as f:
            body = [ln for ln in f.read().splitlines() if ln and not ln.startswith("-----")]
        for ln in body:
            assert ln not in log and ln not in text, f"{name}.key is in the log or /metrics"
    assert "PRIVATE KEY" not in log and "PRIVATE KEY" not in text
    # object keys: none in /metrics
    assert USED_KEYS
    for key in USED_KEYS:
        assert key not in text, f"object key {key} is in /metrics"
