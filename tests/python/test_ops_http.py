"""The master's HTTP endpoints (issue 15): /metrics scraped by a real Prometheus,
promtool's lint, /health, the JSON admin views, Mooncake's /get_all_segments, and
hostile HTTP clients that must not slow the control plane.

Everything runs for real on 127.0.0.1: kvpool-master with --http-listen, `kvpool
serve` segments, Debian's prometheus and promtool (deploy/install-deps.sh).
"""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

import kvpool
from conftest import TLS_DIR, Proc, _bin, free_port, http_get, metric

# The master's HTTP views over plain HTTP and without a credential, as an operator of a
# trusted network uses them. In the TLS pass they are HTTPS and need an admin's token:
# test_security.py covers that door; this module runs in the plain pass only.
pytestmark = pytest.mark.skipif(TLS_DIR is not None,
                                reason="plain-HTTP views: run in the plain pass only")


@pytest.fixture
def hpool(make_pool):
    """make(segments=..., master_args=...) -> conftest's Pool, its master with HTTP on a port
    of its own: .http_port, .names (the segments'), .get(path)."""

    def make(segments=("64MiB",), master_args=()):
        port = free_port()
        p = make_pool(segments=segments, master_args=("--lease-ttl", "0", "--http-listen",
                                                      f"127.0.0.1:{port}", *master_args))
        p.http_port = port
        p.names = [s.ready for s in p.segments]
        p.get = lambda path, timeout=10.0: http_get(port, path, timeout)
        return p

    return make


def terminate(p):
    """SIGTERM a child we started (by its PID, through Popen) and reap it; SIGKILL after 10 s."""
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


def promtool_check(text):
    r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                       capture_output=True, timeout=30)
    assert r.returncode == 0, (r.stdout + r.stderr).decode()


def test_metrics_count_what_the_test_did(hpool, prefix):
    p = hpool()
    size = 100_000
    with kvpool.Client(p.addr) as c:
        for i in range(10):
            c.put(f"{prefix}{i}", bytes([i]) * size)
        for i in range(10):
            assert c.get(f"{prefix}{i}") == bytes([i]) * size
        with pytest.raises(kvpool.Error):
            c.get(f"{prefix}missing")
        assert c.exists(f"{prefix}3") and not c.exists(f"{prefix}nope")
        c.remove(f"{prefix}9")
    status, text = p.get("/metrics")
    assert status == 200
    promtool_check(text)
    assert metric(text, "kvpool_puts_total") == 10
    assert metric(text, "kvpool_gets_total") == 11
    assert metric(text, "kvpool_get_misses_total") == 1
    assert metric(text, "kvpool_get_hits_total", {"tier": "dram"}) == 10
    assert metric(text, "kvpool_exists_total") == 2
    assert metric(text, "kvpool_removes_total") == 1
    assert metric(text, "kvpool_objects", {"tier": "dram"}) == 9
    used = metric(text, "kvpool_used_bytes", {"tier": "dram"})
    assert 9 * size <= used <= 9 * (size + 64 * 1024)
    assert metric(text, "kvpool_capacity_bytes", {"tier": "dram"}) == 64 << 20
    assert metric(text, "kvpool_segments", {"tier": "dram"}) == 1
    seg = p.names[0]
    assert metric(text, "kvpool_segment_used_bytes", {"segment": seg, "tier": "dram"}) == used
    assert metric(text, "kvpool_segment_objects", {"segment": seg, "tier": "dram"}) == 9
    # ten puts of one size: the first places its object (PutStart), each ends with PutCommit,
    # which holds room for the next (docs/architecture.md "A put in one round trip")
    assert metric(text, "kvpool_rpc_duration_seconds_count", {"method": "PutStart"}) >= 1
    assert metric(text, "kvpool_rpc_duration_seconds_bucket",
                  {"method": "PutCommit", "le": "+Inf"}) >= 10
    assert metric(text, "kvpool_leader") == 1
    assert metric(text, "kvpool_epoch") == 0
    assert metric(text, "kvpool_clients") >= 1
    assert metric(text, "kvpool_kv_events_enabled") == 0


def test_health_and_json_views(hpool, prefix):
    p = hpool()
    assert p.get("/health") == (200, "ok\n")
    with kvpool.Client(p.addr) as c:
        for i in range(5):
            c.put(f"{prefix}k{i}", b"v" * 1000)
    status, body = p.get("/api/v1/stat")
    assert status == 200
    stat = json.loads(body)
    assert stat["objects"] == 5 and stat["segments"] == 1 and stat["serving"] is True
    status, body = p.get("/api/v1/segments")
    segs = json.loads(body)
    assert segs["total_segments"] == 1
    assert segs["segments"][0]["name"] == p.names[0]
    assert segs["segments"][0]["objects"] == 5 and segs["segments"][0]["tier"] == "dram"
    # keys: a regex, paged by cursor, every key exactly once
    seen = []
    cursor = 0
    for _ in range(100):
        q = urllib.parse.urlencode({"regex": "^" + prefix + "k", "limit": 2, "cursor": cursor})
        status, body = p.get("/api/v1/keys?" + q)
        assert status == 200, body
        page = json.loads(body)
        assert page["count"] <= 2 + 64
        seen += [k["key"] for k in page["keys"]]
        for k in page["keys"]:
            assert k["size"] == 1000 and k["replicas"][0]["segment"] == p.names[0]
        cursor = page["next_cursor"]
        if cursor == 0:
            break
    assert sorted(seen) == sorted(f"{prefix}k{i}" for i in range(5))
    status, body = p.get("/api/v1/keys?regex=" + urllib.parse.quote("(unclosed"))
    assert status == 400 and "regular expression" in json.loads(body)["error"]
    assert p.get("/api/v1/keys?limit=0")[0] == 400
    assert p.get("/api/v1/keys?cursor=abc")[0] == 400
    # Mooncake's views (SGLang's check_server polls /get_all_segments)
    assert p.get("/get_all_segments") == (200, p.names[0] + "\n")
    status, body = p.get("/query_segment?segment=" + urllib.parse.quote(p.names[0]))
    assert status == 200 and body.startswith(p.names[0] + "\nUsed(bytes): ")
    assert p.get("/query_segment?segment=nope")[0] == 404
    assert p.get("/no/such/thing")[0] == 404


def test_http_flags(tmp_path):
    master = _bin("KVPOOL_MASTER_BIN")
    # an explicit address that cannot be had is fatal, with a message
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        r = subprocess.run([master, "--listen", "127.0.0.1:0", "--http-listen",
                            f"127.0.0.1:{taken}"], capture_output=True, timeout=20)
        assert r.returncode != 0 and b"--http-listen" in r.stderr
    # a value that is no address: refused before anything is bound (the default control
    # port may be another master's), exit 2 as any bad flag
    for bad in ("nonsense", "::1:80", "127.0.0.1"):
        r = subprocess.run([master, "--http-listen", bad], capture_output=True, timeout=20)
        assert r.returncode == 2 and b"--http-listen needs IPV4:PORT or off" in r.stderr, r
    # off: the control port is the master's only listening socket; with a port: two
    # (localhost is taken for 127.0.0.1, at the flag's check as where it is bound)
    for flag, want in (("off", 1), (f"127.0.0.1:{free_port()}", 2),
                       (f"localhost:{free_port()}", 2)):
        m = Proc([master, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--http-listen", flag])
        try:
            assert len(listening_ports(m.pid)) == want, flag
        finally:
            assert m.stop() == 0


def listening_ports(pid):
    """The TCP ports process pid listens on (its socket inodes in /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:
                ports.append(int(cols[1].split(":")[1], 16))
    return ports


def query(prom_port, q):
    status, body = http_get(prom_port, "/api/v1/query?" + urllib.parse.urlencode({"query": q}))
    assert status == 200, body
    res = json.loads(body)["data"]["result"]
    return [float(r["value"][1]) for r in res]


@pytest.fixture
def prometheus(tmp_path):
    """start(targets) -> the port of a real Prometheus scraping those HOST:PORTs each second."""
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is not installed (deploy/install-deps.sh installs it)")
    procs = []

    def start(targets):
        port = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                       "scrape_configs:\n  - job_name: kvpool\n    static_configs:\n"
                       "      - targets: [" + ", ".join(f"'{t}'" for t in targets) + "]\n")
        log = open(tmp_path / "prometheus.log", "wb")
        p = subprocess.Popen(["prometheus", f"--config.file={cfg}",
                              f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                              f"--web.listen-address=127.0.0.1:{port}"],
                             stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        procs.append(p)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if http_get(port, "/-/ready", 2)[0] == 200:
                    return port
            except OSError:
                pass
            time.sleep(0.2)
        pytest.fail("prometheus did not become ready: "
                    + (tmp_path / "prometheus.log").read_text()[-2000:])

    yield start
    for p in procs:
        terminate(p)


def test_prometheus_scrapes_the_master_and_a_segment_owner(hpool, prometheus, prefix):
    # one small segment, so that the puts evict: counters the test itself caused; its owner
    # serves HTTP too, and the client moves bytes over tcp, which the owner sees (shm would
    # be one-sided: only the client would count it)
    p = hpool(segments=())
    owner = Proc([p.cli_bin, "--master", p.addr, "serve", "--segment-size", "8MiB",
                  "--http-listen", "127.0.0.1:0", "--ready-fd", "{fd}"], lines=2)
    p.segments.append(owner)  # the pool's finalizer stops it
    owner_http = owner.lines[1].split(" ", 1)[1]
    prom = prometheus([f"127.0.0.1:{p.http_port}", owner_http])
    size = 1 << 20
    n = 24
    with kvpool.Client(p.addr, transport="tcp") as c:
        for i in range(n):
            c.put(f"{prefix}{i}", bytes([i % 251]) * size)
        for i in range(n - 3, n):
            assert c.get(f"{prefix}{i}") == bytes([i % 251]) * size
    status, body = p.get("/api/v1/stat")
    stat = json.loads(body)
    assert stat["evicted_objects"] > 0
    oport = int(owner_http.rsplit(":", 1)[1])
    status, otext = http_get(oport, "/metrics")
    assert status == 200
    promtool_check(otext)
    served = metric(otext, "kvpool_served_bytes_total", {"transport": "tcp"})
    assert served >= (n + 3) * size, served  # every put and get went through the owner
    want = {
        "kvpool_puts_total": n,
        "kvpool_evictions_total": stat["evicted_objects"],
        'kvpool_objects{tier="dram"}': stat["objects"],
        'kvpool_used_bytes{tier="dram"}': stat["used"],
        'kvpool_served_bytes_total{transport="tcp"}': served,
        'kvpool_segment_capacity_bytes{tier="dram",job="kvpool",instance="%s"}' % owner_http:
            8 << 20,
        'up{instance="127.0.0.1:%d"}' % p.http_port: 1,
        'up{instance="%s"}' % owner_http: 1,
    }
    deadline = time.monotonic() + 30
    got = {}
    while time.monotonic() < deadline:
        got = {q: query(prom, q) for q in want}
        if all(v == [float(want[q])] for q, v in got.items()):
            break
        time.sleep(0.5)
    assert got == {q: [float(v)] for q, v in want.items()}
    # the histogram is usable as Prometheus users use it
    q = 'histogram_quantile(0.99, sum by (le) (kvpool_rpc_duration_seconds_bucket{method="PutCommit"}))'
    v = query(prom, q)
    assert len(v) == 1 and 0 < v[0] < 1


def slowloris(port, n, stop, socks):
    """n connections that send a header one byte a second and never finish it."""
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    while not stop.is_set():
        for s in list(socks):
            try:
                s.sendall(b"X")
            except OSError:
                socks.remove(s)
        stop.wait(1.0)


def garbage(port, n, stop):
    import random
    rnd = random.Random(7)
    while not stop.is_set() and n > 0:
        for kind in range(3):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                if kind == 0:
                    s.sendall(bytes(rnd.getrandbits(8) for _ in range(4096)))
                elif kind == 1:  # a header far over the limit
                    s.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
                else:
                    s.sendall(b"POST /metrics HTTP/1.1\r\nContent-Length: 99999999\r\n\r\nabc")
                s.settimeout(2)
                try:
                    s.recv(4096)
                except OSError:
                    pass
                s.close()
            except OSError:
                pass
            n -= 1


def latencies(addr, prefix, seconds):
    """Latency (s) of a put+get+exists+remove round, rounds for `seconds`."""
    out = []
    with kvpool.Client(addr) as c:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            t0 = time.perf_counter()
            c.put(f"{prefix}{i}", b"x" * 4096)
            c.get(f"{prefix}{i}")
            c.exists(f"{prefix}{i}")
            c.remove(f"{prefix}{i}")
            out.append(time.perf_counter() - t0)
            i += 1
    out.sort()
    return out


def test_hostile_http_clients_do_not_stall_the_control_plane(hpool, prefix):
    p = hpool()
    base = latencies(p.addr, prefix + "a", 3)
    stop = threading.Event()
    socks = []
    threads = [threading.Thread(target=slowloris, args=(p.http_port, 150, stop, socks)),
               threading.Thread(target=garbage, args=(p.http_port, 50, stop))]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        during = latencies(p.addr, prefix + "b", 3)
        # the endpoints still answer a well-behaved client meanwhile
        assert p.get("/health", timeout=10) == (200, "ok\n")
        status, text = p.get("/metrics", timeout=10)
        assert status == 200 and metric(text, "kvpool_leader") == 1
        assert len(socks) >= 100, f"only {len(socks)} slowloris connections held"
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for s in socks:
            s.close()
    p50b, p99b = base[len(base) // 2], base[int(len(base) * 0.99)]
    p50d, p99d = during[len(during) // 2], during[int(len(during) * 0.99)]
    print(f"control round p50 {p50b * 1e6:.0f} us -> {p50d * 1e6:.0f} us, "
          f"p99 {p99b * 1e6:.0f} us -> {p99d * 1e6:.0f} us under 200 hostile connections")
    # unaffected within the noise of a 2-core machine: a stall would be seconds
    assert p50d < 3 * p50b + 0.002
    assert p99d < 5 * p99b + 0.020
    assert len(during) > len(base) / 3


@pytest.fixture
def etcd(tmp_path):
    """A private single-member etcd on 127.0.0.1; its client URL's HOST:PORT."""
    exe = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
    if exe is None:
        pytest.fail("etcd is not installed (deploy/install-deps.sh installs etcd-server)")
    cport, pport = free_port(), free_port()
    curl, purl = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
    log = open(tmp_path / "etcd.log", "wb")
    p = subprocess.Popen([exe, "--name", "m0", "--data-dir", str(tmp_path / "etcd"),
                          "--listen-client-urls", curl, "--advertise-client-urls", curl,
                          "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                          "--initial-cluster", f"m0={purl}", "--initial-cluster-state", "new",
                          "--initial-cluster-token", f"kvpool-ops-{os.getpid()}-{pport}",
                          "--logger=zap", "--log-outputs=stderr"],
                         stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if '"health":"true"' in http_get(cport, "/health", 2)[1]:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or p.poll() is not None:
                pytest.fail("etcd did not start: " + (tmp_path / "etcd.log").read_text()[-2000:])
            time.sleep(0.2)
        yield f"127.0.0.1:{cport}"
    finally:
        terminate(p)


def test_health_and_metrics_of_leader_and_standby(etcd, tmp_path):
    master = _bin("KVPOOL_MASTER_BIN")
    cluster = f"ops{os.getpid()}"
    ms = []
    try:
        for _ in range(2):
            http = free_port()
            ctl = free_port()
            m = Proc([master, "--listen", f"127.0.0.1:{ctl}", "--ready-fd", "{fd}",
                      "--log-level", "error", "--etcd", etcd, "--cluster", cluster,
                      "--leader-ttl", "2", "--http-listen", f"127.0.0.1:{http}"])
            ms.append((m, http))
            if len(ms) == 1:  # the first one leads before the second starts
                deadline = time.monotonic() + 20
                while http_get(http, "/health")[0] != 200 and time.monotonic() < deadline:
                    time.sleep(0.1)
        (leader, lport), (standby, sport) = ms
        status, body = http_get(lport, "/health")
        assert status == 200 and body.startswith("ok: leader 127.0.0.1:")
        deadline = time.monotonic() + 10
        while "the leader is" not in http_get(sport, "/health")[1] and time.monotonic() < deadline:
            time.sleep(0.1)
        status, body = http_get(sport, "/health")
        assert status == 503 and "is a standby: the leader is 127.0.0.1:" in body
        deadline = time.monotonic() + 10
        while True:
            lt = http_get(lport, "/metrics")[1]
            if metric(lt, "kvpool_standbys") == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        st = http_get(sport, "/metrics")[1]
        assert metric(lt, "kvpool_leader") == 1 and metric(lt, "kvpool_epoch") > 0
        assert metric(lt, "kvpool_standbys") == 1
        assert metric(st, "kvpool_leader") == 0
        epoch = metric(lt, "kvpool_epoch")
        # the leader goes: the standby takes over and says so
        assert leader.stop() == 0
        deadline = time.monotonic() + 20
        while http_get(sport, "/health")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        status, body = http_get(sport, "/health")
        assert status == 200, body
        st = http_get(sport, "/metrics")[1]
        assert metric(st, "kvpool_leader") == 1 and metric(st, "kvpool_epoch") > epoch
    finally:
        for m, _ in ms:
            m.stop()


def test_get_all_keys(hpool, prefix):
    """Mooncake's /get_all_keys (mc_meta_cli): every stored key, one a line, over as many
    loop visits as it takes (pages of 1000: 2500 keys are three); a removed key is gone;
    a byte that would break the line is written \\xNN."""
    p = hpool()
    keys = [f"{prefix}{i:05d}" for i in range(2500)]
    odd = prefix + "line\nbreak\\"
    with kvpool.Client(p.addr) as c:
        c.batch_put(keys, [b"v"] * len(keys))
        c.put(odd, b"x")
        c.remove(keys[7])
    status, body = p.get("/get_all_keys")
    assert status == 200 and body.endswith("\n")
    lines = body.split("\n")[:-1]
    assert len(lines) == len(set(lines))
    assert sorted(lines) == sorted(keys[:7] + keys[8:] + [prefix + "line\\x0abreak\\x5c"])
    assert p.get("/get_all_keys?x=1") == (status, body)  # Mooncake's takes no parameters
