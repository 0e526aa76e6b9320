"""KV events behind ZeroMQ CURVE (kvpool-master --kv-events-curve-secret /
--kv-events-curve-allow), end to end: a real master and `kvpool serve` segment, puts
through kvpool.Client, key pairs made by deploy/make-curve-keys.sh, and python3-zmq
subscribers here, some with the right keys, some without CURVE, some with a key the
allow-list does not name.

What a user checks:
 1. a subscriber without CURVE, or with a key not in the allow-list, hears nothing live
    and gets no replay; each refusal is counted in /metrics
    (kvpool_kv_events_refused_total{reason="curve"|"key"}); an allowed key hears the
    events with the keys that were put, live and by replay; the master's log names its
    public key and never its secret;
 2. the master refuses to start with a secret key readable by others, a malformed key
    file or allow-list, or half of the settings, saying why without printing a key;
 3. SIGHUP reloads the allow-list: a key added is let in without a restart, and
    subscribers connected then miss nothing and stay connected; a key removed is cut off
    at once: nothing put after the reload reaches it (the master closes every connection
    and binds again), its reconnections are refused and counted, and the subscribers
    still allowed reconnect by themselves and hear on (a gap, if any, by replay);
 4. with an ACL and two tenants, a tenant's subscriber hears only its tenant's events
    (live, replay, and when it asks for the other's topic), a "*" subscriber hears both,
    told apart by topic and tenant_id, and both see the keys they put (not the master's
    TENANT 0x1f KEY).

A SUB socket hears nothing until its handshake and subscription reached the master, so
an allowed subscriber is first made to hear a probe key (put again until it does); the
refused subscribers were connected before that probe, so they had the same chance.
"""

import hashlib
import os
import signal
import ssl
import stat
import subprocess
import time
import urllib.request
import uuid

import msgpack
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

import kvpool
from conftest import TLS_DIR, Proc, _bin, free_port, master_security_args, metric, stop_all

END = b"\xff" * 8
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
NAMES = ("master", "all", "team-a", "team-b", "stranger", "late")


class Keys:
    def __init__(self, d):
        self.dir = str(d)

    def path(self, name, ext):
        return os.path.join(self.dir, f"{name}.{ext}")

    def pub(self, name):
        with open(self.path(name, "pub"), "rb") as f:
            return f.read().strip()

    def sec(self, name):
        with open(self.path(name, "key"), "rb") as f:
            return f.read().strip()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("curve") / "keys"
    r = subprocess.run(["bash", os.path.join(ROOT, "deploy", "make-curve-keys.sh"), str(d),
                        *NAMES], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    k = Keys(d)
    for n in NAMES:
        assert stat.S_IMODE(os.stat(k.path(n, "key")).st_mode) == 0o600
        assert len(k.sec(n)) == 40 and len(k.pub(n)) == 40
    assert k.sec("master") != k.sec("all")
    return k


def write_allow(path, lines):
    with open(path, "w") as f:
        f.write("# subscribers of the KV events\n" + "".join(line + "\n" for line in lines))
    os.chmod(path, 0o644)


def http_get(port, path, ca):
    """GET over HTTPS verified against ca where the master has TLS, else HTTP."""
    if ca:
        ctx = ssl.create_default_context(cafile=ca)
        url = f"https://127.0.0.1:{port}{path}"
    else:
        ctx, url = None, f"http://127.0.0.1:{port}{path}"
    with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
        return r.read().decode()


class CurvePool:
    """A master with CURVE on its KV events (its log in a file, HTTP on a port of its
    own) and one `kvpool serve` segment."""

    def __init__(self, keys, workdir, allow_lines, security_args=None, ca=None):
        self.keys = keys
        self.allow = os.path.join(workdir, "allow.conf")
        write_allow(self.allow, allow_lines)
        self.log_path = os.path.join(workdir, f"master-{uuid.uuid4().hex[:6]}.log")
        self.pub_ep = f"tcp://127.0.0.1:{free_port()}"
        self.rep_ep = f"tcp://127.0.0.1:{free_port()}"
        self.http_port = free_port()
        sec = master_security_args() if security_args is None else security_args
        # the CA of the master's certificate: its HTTP port speaks HTTPS then
        self.ca = ca if security_args is not None else (
            os.path.join(TLS_DIR, "ca.crt") if TLS_DIR else None)
        self._log = open(self.log_path, "wb")
        self.segments = []
        self.master = Proc([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0",
                            "--ready-fd", "{fd}", "--log-level", "info", "--lease-ttl", "0",
                            "--http-listen", f"127.0.0.1:{self.http_port}", *sec,
                            "--kv-events-bind", self.pub_ep,
                            "--kv-events-replay-bind", self.rep_ep,
                            "--kv-events-curve-secret", keys.path("master", "key"),
                            "--kv-events-curve-allow", self.allow],
                           stderr=self._log)
        self.addr = self.master.ready

    def add_segment(self, *cred):
        self.segments.append(Proc([_bin("KVPOOL_CLI_BIN"), "--master", self.addr, *cred,
                                   "serve", "--segment-size", "64MiB", "--ready-fd", "{fd}"]))

    def metrics(self):
        return http_get(self.http_port, "/metrics", self.ca)

    def refused(self, reason, text=None):
        return metric(text or self.metrics(), "kvpool_kv_events_refused_total",
                      {"reason": reason})

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def close(self):
        bad = stop_all(self.segments + [self.master])
        self._log.close()
        return bad


@pytest.fixture
def make_curve_pool(request, keys, tmp_path):
    pools = []

    def make(allow_lines, **kw):
        p = CurvePool(keys, str(tmp_path), allow_lines, **kw)
        pools.append(p)
        if kw.get("security_args") is None:
            p.add_segment()
        return p

    yield make
    for p in pools:
        assert not p.close(), "a child exited non-zero"


class Zmq:
    """Sockets of one context, closed at the end; name None: no CURVE."""

    def __init__(self, keys):
        self.keys = keys
        self.ctx = zmq.Context()
        self.socks = []

    def socket(self, kind, name):
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        if name is not None:
            s.curve_secretkey = self.keys.sec(name)
            s.curve_publickey = self.keys.pub(name)
            s.curve_serverkey = self.keys.pub("master")
        self.socks.append(s)
        return s

    def sub(self, ep, name, topic=b""):
        s = self.socket(zmq.SUB, name)
        s.setsockopt(zmq.SUBSCRIBE, topic)
        s.connect(ep)
        return s

    def close(self):
        for s in self.socks:
            s.close()
        self.ctx.term()


@pytest.fixture
def zsock(keys):
    z = Zmq(keys)
    yield z
    z.close()


def heard(sub, timeout=0.3):
    """[(topic, seq, [events])] the SUB socket has, waiting up to timeout for the first."""
    out = []
    while sub.poll(int(timeout * 1000)):
        topic, seq, payload = sub.recv_multipart()
        assert len(seq) == 8
        batch = msgpack.unpackb(payload, raw=False)
        out.append((topic, int.from_bytes(seq, "big"), batch[1]))
        timeout = 0
    return out


def keys_of(batches):
    return [e["object_key"] for _, _, evs in batches for e in evs if "object_key" in e]


def replay(z, ep, name, start=0, topic=None, timeout=3.0):
    """[(seq, [events])] the replay socket answers a DEALER (curve key `name`); None when
    it does not answer within timeout."""
    d = z.socket(zmq.DEALER, name)
    d.connect(ep)
    d.send_multipart([b""] + ([topic] if topic is not None else []) +
                     [start.to_bytes(8, "big")])
    out = []
    while True:
        if not d.poll(int(timeout * 1000)):
            return None
        empty, seq, payload = d.recv_multipart()
        assert empty == b""
        if seq == END:
            return out
        out.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False)[1]))


def put(client, key):
    client.put(key, key.encode() * 4)  # raises on failure


def hear_probe(client, sub, prefix, timeout=15.0):
    """Put probe keys until sub hears one: its handshake and subscription are in."""
    deadline = time.monotonic() + timeout
    i = 0
    while time.monotonic() < deadline:
        key = f"{prefix}probe-{i}"
        put(client, key)
        got = heard(sub, 0.3)
        if got:
            return got
        i += 1
    raise AssertionError(f"an allowed subscriber heard nothing within {timeout} s")


def poll_until(cond, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def test_only_allowed_keys_hear(make_curve_pool, zsock, keys, prefix):
    pool = make_curve_pool([f"{keys.pub('all').decode()} *",
                            f"{keys.pub('team-a').decode()} team-a  # a tenant's router"])
    plain = zsock.sub(pool.pub_ep, None)
    stranger = zsock.sub(pool.pub_ep, "stranger")
    allowed = zsock.sub(pool.pub_ep, "all")
    with kvpool.Client(pool.addr) as c:
        hear_probe(c, allowed, prefix)
        want = [f"{prefix}k{i}" for i in range(5)]
        for k in want:
            put(c, k)
        got = []
        deadline = time.monotonic() + 10
        while [k for k in keys_of(got) if k in want] != want:
            assert time.monotonic() < deadline, keys_of(got)
            got += heard(allowed, 0.5)

    # one stream: keys of no tenant ("kvpool"), or in the suite's TLS pass (an ACL) those
    # of the admin's tenant, "default"
    topic = b"kvpool/default/" if TLS_DIR else b"kvpool"
    assert {t for t, _, _ in got} == {topic}
    seqs = [s for _, s, _ in got]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert heard(plain, 0.5) == [] and heard(stranger, 0.1) == []
    poll_until(lambda: (pool.refused("curve") or 0) >= 1 and (pool.refused("key") or 0) >= 1,
               "refusals of the subscribers without CURVE and with an unknown key counted")
    text = pool.metrics()
    assert metric(text, "kvpool_kv_events_curve") == 1

    # replay: the allowed key gets every batch from 0, the others no answer at all
    r = replay(zsock, pool.rep_ep, "all", topic=topic)
    assert r is not None and [s for s, _ in r] == list(range(len(r)))
    assert set(want) <= {e["object_key"] for _, evs in r for e in evs}
    before = pool.refused("key")
    assert replay(zsock, pool.rep_ep, None, timeout=1.5) is None
    assert replay(zsock, pool.rep_ep, "stranger", timeout=1.5) is None
    poll_until(lambda: pool.refused("key") > before, "the replay's unknown key counted")
    # a tenant's key hears no stream of keys of no tenant
    assert replay(zsock, pool.rep_ep, "team-a") == []

    log = pool.log()
    assert keys.pub("master").decode() in log  # operators copy it from there
    assert keys.pub("stranger").decode() in log  # the refused key, to add it if meant
    for name in NAMES:
        assert keys.sec(name).decode() not in log
        assert keys.sec(name).decode() not in text


def run_master(*args, timeout=20):
    r = subprocess.run([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0",
                        "--kv-events-bind", f"tcp://127.0.0.1:{free_port()}", *args],
                       capture_output=True, timeout=timeout)
    return r.returncode, r.stderr.decode()


def test_unsafe_or_malformed_files_refused(keys, tmp_path):
    secret = keys.sec("master").decode()
    allow = tmp_path / "allow.conf"
    write_allow(allow, [f"{keys.pub('all').decode()} *"])
    loose = tmp_path / "loose.key"
    loose.write_text(secret + "\n")
    os.chmod(loose, 0o640)
    bad = tmp_path / "bad.key"
    bad.write_text(secret[:39] + "\n")  # one character short
    os.chmod(bad, 0o600)
    bad_allow = tmp_path / "bad-allow.conf"
    write_allow(bad_allow, [f"{keys.pub('all').decode()} *", f"{secret} team a"])
    writable_allow = tmp_path / "writable-allow.conf"
    write_allow(writable_allow, [f"{keys.pub('all').decode()} *"])
    os.chmod(writable_allow, 0o666)
    good = keys.path("master", "key")
    cases = [
        (["--kv-events-curve-secret", str(loose), "--kv-events-curve-allow", str(allow)],
         "readable by group or others: chmod 600"),
        (["--kv-events-curve-secret", str(bad), "--kv-events-curve-allow", str(allow)],
         "not a CURVE secret key"),
        (["--kv-events-curve-secret", good, "--kv-events-curve-allow", str(bad_allow)],
         "line 3"),
        (["--kv-events-curve-secret", good, "--kv-events-curve-allow", str(writable_allow)],
         "writable by group or others"),
        (["--kv-events-curve-secret", good], "--kv-events-curve-allow"),
        (["--kv-events-curve-secret", str(tmp_path / "absent.key"), "--kv-events-curve-allow",
          str(allow)], "No such file"),
    ]
    for args, words in cases:
        rc, err = run_master(*args)
        assert rc != 0, args
        assert words in err, (args, err)
        assert secret not in err and secret[:39] not in err, err


def test_sighup_reloads_the_allow_list(make_curve_pool, zsock, keys, prefix):
    pool = make_curve_pool([f"{keys.pub('all').decode()} *"])
    allowed = zsock.sub(pool.pub_ep, "all")
    late = zsock.sub(pool.pub_ep, "late")
    with kvpool.Client(pool.addr) as c:
        hear_probe(c, allowed, prefix)
        poll_until(lambda: (pool.refused("key") or 0) >= 1, "the late key refused")
        assert heard(late, 0.2) == []

        write_allow(pool.allow, [f"{keys.pub('all').decode()} *",
                                 f"{keys.pub('late').decode()} *"])
        n = reloads(pool)
        os.kill(pool.master.pid, signal.SIGHUP)
        # a handshake that reaches the master before the reload is refused, and a refused
        # subscriber need not come back by itself: subscribe once the reload is in (on a
        # loaded machine the subscription could otherwise beat the signal's handling)
        poll_until(lambda: reloads(pool) > n, "the allow-list reloaded")
        late2 = zsock.sub(pool.pub_ep, "late")
        hear_probe(c, late2, prefix + "after-")
    assert "reloaded" in pool.log()

    # a broken list is refused and the old one stays
    with open(pool.allow, "a") as f:
        f.write("not-a-key *\n")
    os.kill(pool.master.pid, signal.SIGHUP)
    poll_until(lambda: "allow-list reload failed" in pool.log(), "the failed reload logged")
    with kvpool.Client(pool.addr) as c:
        hear_probe(c, zsock.sub(pool.pub_ep, "late"), prefix + "kept-")


# ---- tenants (an ACL: keys stored as TENANT 0x1f KEY) ----------------------------------------

def test_tenants_hear_only_their_own(make_curve_pool, zsock, keys, tmp_path, prefix,
                                     monkeypatch):
    for var in ("KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_TOKEN"):
        monkeypatch.delenv(var, raising=False)  # the TLS pass's: every credential is ours
    certs = tmp_path / "certs"
    r = subprocess.run(["bash", os.path.join(ROOT, "deploy", "make-certs.sh"), str(certs),
                        "admin", "segsrv"], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    tok = {t: f"{t}-tok-{uuid.uuid4().hex}" for t in ("alice", "bob")}
    acl = tmp_path / "acl.ini"
    acl.write_text(
        "[principal segsrv]\nroles = segment\ncert-cn = segsrv\n"
        "[principal alice]\ntenant = team-a\nroles = read, write\n"
        f"token-sha256 = {hashlib.sha256(tok['alice'].encode()).hexdigest()}\n"
        "[principal bob]\ntenant = team-b\nroles = read, write\n"
        f"token-sha256 = {hashlib.sha256(tok['bob'].encode()).hexdigest()}\n")
    ca = str(certs / "ca.crt")
    pool = make_curve_pool(
        [f"{keys.pub('all').decode()} *", f"{keys.pub('team-a').decode()} team-a",
         f"{keys.pub('team-b').decode()} team-b"],
        security_args=["--tls-cert", str(certs / "server.crt"), "--tls-key",
                       str(certs / "server.key"), "--tls-ca", ca, "--acl-file", str(acl)],
        ca=ca)
    pool.add_segment("--tls-ca", ca, "--tls-cert", str(certs / "segsrv.crt"), "--tls-key",
                     str(certs / "segsrv.key"))
    sub_a = zsock.sub(pool.pub_ep, "team-a")
    sub_b = zsock.sub(pool.pub_ep, "team-b", b"kvpool")
    sub_all = zsock.sub(pool.pub_ep, "all", b"kvpool")
    # a tenant's subscriber asking for the other's topic: refused (it hears its own anyway
    # through its "" subscription above, so use a socket of its own)
    peek = zsock.sub(pool.pub_ep, "team-a", b"kvpool/team-b/")
    a = kvpool.Client(pool.addr, tls_ca=ca, token=tok["alice"])
    b = kvpool.Client(pool.addr, tls_ca=ca, token=tok["bob"])
    try:
        hear_probe(a, sub_a, prefix)
        hear_probe(b, sub_b, prefix)
        same = f"{prefix}same"  # both tenants put the same key: two objects, two streams
        for cl, t in ((a, "a"), (b, "b")):
            for i in range(3):
                put(cl, f"{prefix}{t}{i}")
            put(cl, same)
        got = {}
        for name, s in (("a", sub_a), ("b", sub_b), ("all", sub_all)):
            got[name] = []
            deadline = time.monotonic() + 10
            need = 8 if name == "all" else 4
            while len([k for k in keys_of(got[name]) if "probe" not in k]) < need:
                assert time.monotonic() < deadline, (name, keys_of(got[name]))
                got[name] += heard(s, 0.5)
    finally:
        a.close()
        b.close()

    for t, other in (("a", "b"), ("b", "a")):
        batches = got[t]
        assert {topic for topic, _, _ in batches} == {f"kvpool/team-{t}/".encode()}
        seqs = [s for _, s, _ in batches]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        ks = keys_of(batches)
        assert all(not k.startswith(f"{prefix}{other}") for k in ks), ks
        assert {f"{prefix}{t}{i}" for i in range(3)} | {same} <= set(ks)
        assert all("\x1f" not in k for k in ks)
        assert {e["tenant_id"] for _, _, evs in batches for e in evs} == {f"team-{t}"}
    # "*": both streams, told apart by topic and tenant_id, each with its own seqs
    by_topic = {}
    for topic, seq, evs in got["all"]:
        by_topic.setdefault(topic, []).append((seq, evs))
    assert set(by_topic) >= {b"kvpool/team-a/", b"kvpool/team-b/"}
    for topic, lst in by_topic.items():
        tenant = topic.decode().split("/")[1]
        assert all(e["tenant_id"] == tenant for _, evs in lst for e in evs)
    assert heard(peek, 0.3) == []
    assert pool.refused("topic") >= 1

    # replay: the tenant's own stream, never the other's
    ra = replay(zsock, pool.rep_ep, "team-a")
    assert ra and all(e["tenant_id"] == "team-a" for _, evs in ra for e in evs)
    assert replay(zsock, pool.rep_ep, "team-a", topic=b"kvpool/team-b/") == []
    rb = replay(zsock, pool.rep_ep, "all", topic=b"kvpool/team-b/")
    assert rb and all(e["tenant_id"] == "team-b" for _, evs in rb for e in evs)


# ---- a reload that removes a key cuts its live connection --------------------------------------

MONITORED = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED |
             zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class Watched:
    """A SUB socket and what its own monitor reported (its side of the connection)."""

    def __init__(self, z, ep, name):
        self.name = name
        self.sock = z.sub(ep, name)
        self.mon = self.sock.get_monitor_socket(MONITORED)
        z.socks.append(self.mon)
        self.events = []  # (event, value)
        self.batches = []

    def poll(self, timeout=0.05):
        """Read what the socket and its monitor have (the SUB also sends its subscriptions
        again after a reconnection here: libzmq does that in the thread that calls it)."""
        self.batches += heard(self.sock, timeout)
        while self.mon.poll(0):
            e = recv_monitor_message(self.mon)
            self.events.append((e["event"], e["value"]))

    def count(self, event, value=None):
        return len([1 for e, v in self.events if e == event and (value is None or v == value)])


def sync_all(client, subs, key):
    """Put key and read every sub until each heard it: from then on each has all batches."""
    put(client, key)
    for s in subs:
        deadline = time.monotonic() + 10
        while key not in keys_of(s.batches):
            assert time.monotonic() < deadline, (s.name, key)
            s.poll(0.1)


def reloads(pool):
    return pool.log().count("kv events: reloaded ")


def sighup_and_wait(pool, subs):
    """SIGHUP the master and return once it logged the allow-list reloaded, reading subs
    meanwhile. The reload runs on the master's loop: a request sent after this is served
    after it."""
    n = reloads(pool)
    os.kill(pool.master.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while reloads(pool) == n:
        assert time.monotonic() < deadline, "the allow-list reload not logged"
        for s in subs:
            s.poll(0.02)


def last_seq(batches):
    return max(s for _, s, _ in batches)


def test_sighup_removing_a_key_cuts_its_connection(make_curve_pool, zsock, keys, prefix):
    """Two allowed subscribers hear the events; "late" leaves the allow-list and the master
    is SIGHUPped. Nothing put after the reload reaches "late" (whose connection is closed
    and whose reconnections are refused by ZAP, counted); "all" hears every key put after
    the reload (live, or the gap in its seqs by replay, as the contract's consumers do),
    and the master keeps serving."""
    pool = make_curve_pool([f"{keys.pub('all').decode()} *", f"{keys.pub('late').decode()} *"])
    kept = Watched(zsock, pool.pub_ep, "all")
    removed = Watched(zsock, pool.pub_ep, "late")
    with kvpool.Client(pool.addr) as c:
        hear_probe(c, kept.sock, prefix)
        hear_probe(c, removed.sock, prefix + "r-")
        sync_all(c, (kept, removed), prefix + "sync")
        assert kept.count(zmq.EVENT_HANDSHAKE_SUCCEEDED) == 1
        assert removed.count(zmq.EVENT_HANDSHAKE_SUCCEEDED) == 1
        seq0 = last_seq(kept.batches)
        topic = kept.batches[-1][0]
        before = pool.refused("key") or 0
        assert metric(pool.metrics(), "kvpool_kv_events_cuts_total") == 0


        write_allow(pool.allow, [f"{keys.pub('all').decode()} *"])
        sighup_and_wait(pool, (kept, removed))
        want = [f"{prefix}after-{i}" for i in range(20)]
        kept.batches, removed.batches = [], []
        for k in want:
            put(c, k)

        # both read on for as long as the kept one needs to hear them all, and 2 s more
        deadline = time.monotonic() + 15
        while not set(want) <= set(keys_of(kept.batches)) and time.monotonic() < deadline:
            kept.poll(0.1)
            removed.poll(0)
            if kept.batches and kept.batches[0][1] != seq0 + 1:
                break  # it came back late: a gap, replayed below
        end = time.monotonic() + 2
        while time.monotonic() < end:
            kept.poll(0.1)
            removed.poll(0)
        assert c.get(want[0]) == want[0].encode() * 4  # the master serves on

    # "late": none of the keys put after the reload; cut off, and refused when it retries
    assert [k for k in keys_of(removed.batches) if k in want] == []
    assert removed.count(zmq.EVENT_DISCONNECTED) >= 1
    assert removed.count(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400) >= 1
    assert removed.count(zmq.EVENT_HANDSHAKE_SUCCEEDED) == 1  # never let in again
    poll_until(lambda: pool.refused("key") > before, "the removed key's reconnection counted")
    # nor by replay
    assert replay(zsock, pool.rep_ep, "late", timeout=1.5) is None

    # "all": reconnected by itself, every key after the reload, its seqs going on from
    # before the reload; a gap (it came back after the batches' 300 ms wait) is replayed
    assert kept.count(zmq.EVENT_DISCONNECTED) >= 1
    assert kept.count(zmq.EVENT_HANDSHAKE_SUCCEEDED) >= 2
    seqs = [s for _, s, _ in kept.batches]
    assert seqs == sorted(seqs) and (not seqs or seqs[0] > seq0), (seq0, seqs)
    got = keys_of(kept.batches)
    first = seqs[0] if seqs else None
    if first != seq0 + 1:
        r = replay(zsock, pool.rep_ep, "all", start=seq0 + 1, topic=topic)
        assert r is not None
        got += [e["object_key"] for s, evs in r if first is None or s < first
                for e in evs if "object_key" in e]
    assert sorted(k for k in got if k in want) == sorted(want)

    text = pool.metrics()
    assert metric(text, "kvpool_kv_events_curve") == 1
    assert metric(text, "kvpool_kv_events_cuts_total") == 1  # one reload, one cut
    # the kept key, and a new connection of it, hear on
    with kvpool.Client(pool.addr) as c:
        hear_probe(c, zsock.sub(pool.pub_ep, "all"), prefix + "later-")


def test_sighup_adding_a_key_disturbs_nobody(make_curve_pool, zsock, keys, prefix):
    """A reload that only adds a key keeps every connection: the subscribers hear every
    key put after it live, their seqs going on with no gap, and never reconnect."""
    pool = make_curve_pool([f"{keys.pub('all').decode()} *", f"{keys.pub('late').decode()} *"])
    subs = [Watched(zsock, pool.pub_ep, "all"), Watched(zsock, pool.pub_ep, "late")]
    with kvpool.Client(pool.addr) as c:
        for s in subs:
            hear_probe(c, s.sock, prefix + s.name + "-")
        sync_all(c, subs, prefix + "sync")
        seq0 = {s.name: last_seq(s.batches) for s in subs}

        write_allow(pool.allow, [f"{keys.pub('all').decode()} *",
                                 f"{keys.pub('late').decode()} *",
                                 f"{keys.pub('stranger').decode()} *"])
        sighup_and_wait(pool, subs)
        for s in subs:
            s.batches = []
        want = [f"{prefix}after-{i}" for i in range(20)]
        for k in want:
            put(c, k)
        for s in subs:
            deadline = time.monotonic() + 10
            while not set(want) <= set(keys_of(s.batches)):
                assert time.monotonic() < deadline, (s.name, keys_of(s.batches))
                s.poll(0.1)
        hear_probe(c, zsock.sub(pool.pub_ep, "stranger"), prefix + "added-")
        for s in subs:
            s.poll(0.3)

    for s in subs:
        seqs = [q for _, q, _ in s.batches]
        assert seqs == list(range(seq0[s.name] + 1, seq0[s.name] + 1 + len(seqs))), s.name
        assert [k for k in keys_of(s.batches) if k in want] == want
        assert s.count(zmq.EVENT_DISCONNECTED) == 0, s.name
        assert s.count(zmq.EVENT_HANDSHAKE_SUCCEEDED) == 1, s.name
    assert metric(pool.metrics(), "kvpool_kv_events_cuts_total") == 0
