"""Client metrics (issue 15): kvpool.Client.metrics(), `kvpool serve --http-listen`
(/metrics, /health) and `kvpool serve --config FILE`.

Real processes only: a kvpool-master and `kvpool serve` started here with --ready-fd
(serve writes its segment's name, then "http HOST:PORT" with --http-listen, in one
write), each killed by the PID we started and reaped. promtool (Debian's prometheus)
checks every scrape.
"""

import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import kvpool
from conftest import Proc, _bin, freeze, master_security_args

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


# A child started with --ready-fd {fd}; .lines: what it wrote (conftest.Proc).
Daemon = Proc


@pytest.fixture
def master_proc(request):
    m = Daemon([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
                "--log-level", "error", "--lease-ttl", "0", *master_security_args()])

    def fin():
        m.p.poll()
        if m.p.returncode is None:
            os.kill(m.pid, signal.SIGCONT)  # a test may have stopped it
        assert m.stop() == 0

    request.addfinalizer(fin)
    return m


@pytest.fixture
def master(master_proc):
    return master_proc.lines[0]


@pytest.fixture
def serve(request, master):
    """serve(*extra_args, global_args=()) -> (daemon, "host:port" of its HTTP server)."""
    started = []

    def start(*args, global_args=()):
        d = Daemon([_bin("KVPOOL_CLI_BIN"), "--master", master, *global_args, "serve",
                    "--http-listen", "127.0.0.1:0", "--ready-fd", "{fd}", *args], lines=2)
        started.append(d)
        assert d.lines[1].startswith("http "), d.lines
        return d, d.lines[1].split(" ", 1)[1]

    def fin():
        bad = [(d.argv, rc) for d in started for rc in [d.stop()] if rc != 0]
        assert not bad, f"serve exited non-zero: {bad}"

    request.addfinalizer(fin)
    return start


def http_get(addr, path):
    """(status, body) of GET http://addr/path."""
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


SAMPLE = re.compile(r'^([a-z_]+)(?:\{(.*)\})? (\S+)$')


def parse_metrics(text):
    """{(name, frozenset(labels)): value} of a Prometheus text scrape."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def sample(metrics, name, **labels):
    return metrics[(name, frozenset(labels.items()))]


def promtool_ok(text):
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True,
                       timeout=30)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


def scrape(addr):
    status, body = http_get(addr, "/metrics")
    assert status == 200, body
    promtool_ok(body)
    return parse_metrics(body)


# ---- the library's snapshot, through Python ----


def test_metrics_dict_counts_exactly_what_the_client_did(master, serve):
    _, http = serve("--segment-size", "64MiB")
    sizes = [1000, 70000, 3 << 20]
    blobs = [os.urandom(n) for n in sizes]
    with kvpool.Client(master, transport="tcp") as c:
        m0 = c.metrics()
        assert m0["version"] >= 1
        assert set(m0["client"]) == {"tcp", "shm", "rdma", "ssd", "dfs"}
        assert m0["client"]["tcp"] == {"put": {"ops": 0, "bytes": 0}, "get": {"ops": 0, "bytes": 0}}
        assert m0["segments"] == []  # this client mounts nothing
        served0 = sample(scrape(http), "kvpool_served_bytes_total", transport="tcp")

        for i, b in enumerate(blobs):
            c.put(f"m{i}", b)
        for _ in range(2):
            for i, b in enumerate(blobs):
                assert c.get(f"m{i}") == b
        with pytest.raises(kvpool.Error):
            c.get("no-such-key")  # refused by the master: no transfer, no error counted

        m = c.metrics()
        tcp = m["client"]["tcp"]
        assert tcp["put"] == {"ops": 3, "bytes": sum(sizes)}
        assert tcp["get"] == {"ops": 6, "bytes": 2 * sum(sizes)}
        for tp in ("shm", "rdma", "ssd"):
            assert m["client"][tp]["put"]["ops"] == 0 and m["client"][tp]["get"]["ops"] == 0
        assert m["errors"] == {"put": 0, "get": 0}
        assert m["served"]["tcp"]["get"]["bytes"] == 0  # it serves nothing

        # the text form of the same snapshot is valid exposition
        text = c.metrics_text()
        promtool_ok(text)
        pm = parse_metrics(text)
        assert sample(pm, "kvpool_client_ops_total", transport="tcp", op="put") == 3
        assert sample(pm, "kvpool_client_bytes_total", transport="tcp", op="get") == 2 * sum(sizes)

    # the owner served every byte over its tcp data server: 1 put + 2 gets of each
    served = sample(scrape(http), "kvpool_served_bytes_total", transport="tcp") - served0
    assert served == 3 * sum(sizes)


def test_where_a_batch_time_goes(master, serve):
    """master_rpc and transfer: every call to the master counted by method, with the
    time it waited, and every batch of transfers with its time; never more time than
    the calls took on the wall clock (one thread)."""
    serve("--segment-size", "64MiB")
    blobs = [os.urandom(n) for n in (4096, 70000, 1 << 20)]
    with kvpool.Client(master, transport="tcp") as c:
        m0 = c.metrics()
        assert m0["version"] >= 2
        for name in ("put_start", "put_end", "put_commit", "get_replica_list", "exist",
                     "remove", "lease_release"):
            assert name in m0["master_rpc"], name
        t0 = time.monotonic()
        for i, b in enumerate(blobs):
            c.put(f"w{i}", b)
        t_put = time.monotonic() - t0
        t0 = time.monotonic()
        for i, b in enumerate(blobs):
            assert c.get(f"w{i}") == b
        with pytest.raises(kvpool.Error):
            c.get("no-such-key")  # refused by the master, nothing to move
        t_get = time.monotonic() - t0
        t0 = time.monotonic()
        assert c.exists("w0") and not c.exists("no-such-key")
        t_exist = time.monotonic() - t0
        m = c.metrics()

        def d(method, field):
            return m["master_rpc"][method][field] - m0["master_rpc"][method][field]

        # three sizes: each put places its own (PutStart) and ends with PUT_COMMIT, which also
        # asks room ahead for the next put of its size (none of these comes)
        assert (d("put_start", "calls"), d("put_commit", "calls"), d("put_end", "calls")) == \
            (3, 3, 0)
        # Client.get asks the object's size, then reads it: the missing key ends at the size
        assert (d("get_size", "calls"), d("get_replica_list", "calls")) == (4, 3)
        assert d("exist", "calls") == 2
        for name in m["master_rpc"]:
            assert d(name, "failed") == 0, name
        # each call waited for something, and no longer than the calls themselves took
        assert 0 < d("put_start", "wait_s") + d("put_commit", "wait_s") < t_put
        assert 0 < d("get_replica_list", "wait_s") + d("get_size", "wait_s") < t_get
        assert 0 < d("exist", "wait_s") < t_exist
        xp = m["transfer"]["put"]["batches"] - m0["transfer"]["put"]["batches"]
        xg = m["transfer"]["get"]["batches"] - m0["transfer"]["get"]["batches"]
        assert (xp, xg) == (3, 3)  # the missing key moved nothing
        put_s = m["transfer"]["put"]["seconds"] - m0["transfer"]["put"]["seconds"]
        get_s = m["transfer"]["get"]["seconds"] - m0["transfer"]["get"]["seconds"]
        assert 0 < put_s + d("put_start", "wait_s") + d("put_commit", "wait_s") < t_put
        assert 0 < get_s + d("get_replica_list", "wait_s") + d("get_size", "wait_s") < t_get

        # the same in the text form: valid exposition, the same counts
        text = c.metrics_text()
        promtool_ok(text)
        pm = parse_metrics(text)
        assert sample(pm, "kvpool_client_master_rpc_calls_total",
                      method="put_start") == m["master_rpc"]["put_start"]["calls"]
        assert sample(pm, "kvpool_client_master_rpc_failed_total", method="put_end") == 0
        assert sample(pm, "kvpool_client_master_rpc_wait_seconds_total",
                      method="exist") == pytest.approx(m["master_rpc"]["exist"]["wait_s"],
                                                       abs=1e-6)
        assert sample(pm, "kvpool_client_transfer_batches_total", op="get") == \
            m["transfer"]["get"]["batches"]
        assert sample(pm, "kvpool_client_transfer_seconds_total", op="put") > 0


def test_a_master_that_is_gone_counts_failed_calls(master_proc, serve):
    """Calls that get no answer are counted as failed, with the time they waited."""
    serve("--segment-size", "16MiB")
    with kvpool.Client(master_proc.lines[0], transport="tcp", rpc_timeout_ms=1500) as c:
        c.put("f0", b"x" * 100)
        m0 = c.metrics()
        os.kill(master_proc.pid, signal.SIGSTOP)  # alive, silent: every call times out
        try:
            with pytest.raises(kvpool.Error):
                c.exists("f0")
        finally:
            os.kill(master_proc.pid, signal.SIGCONT)
        m = c.metrics()
        e0, e = m0["master_rpc"]["exist"], m["master_rpc"]["exist"]
        assert e["calls"] - e0["calls"] >= 1
        assert e["failed"] - e0["failed"] >= 1
        assert e["wait_s"] - e0["wait_s"] >= 1.0  # it waited for its timeout


def test_shm_is_counted_by_the_initiator_only(master, serve):
    _, http = serve("--segment-size", "64MiB")
    before = scrape(http)
    with kvpool.Client(master, transport="shm") as c:
        c.put("s", b"x" * 123456)
        assert c.get("s") == b"x" * 123456
        m = c.metrics()
    assert m["client"]["shm"]["put"] == {"ops": 1, "bytes": 123456}
    assert m["client"]["shm"]["get"] == {"ops": 1, "bytes": 123456}
    assert m["client"]["tcp"]["put"]["ops"] == 0
    after = scrape(http)
    key = ("kvpool_served_bytes_total", frozenset({("transport", "tcp")}))
    assert after[key] == before[key]  # one-sided: the owner never sees it


def test_segment_owner_metrics_in_the_dict(master):
    with kvpool.Client(master, segment_size="16MiB", transport="tcp") as owner:
        with kvpool.Client(master, transport="tcp") as c:
            c.put("o", b"y" * 5000)
            assert c.get("o") == b"y" * 5000
        m = owner.metrics()
        assert m["served"]["tcp"]["put"] == {"ops": 1, "bytes": 5000}
        assert m["served"]["tcp"]["get"] == {"ops": 1, "bytes": 5000}
        assert m["segments"] == [{"name": owner.segment_name, "tier": "dram",
                                  "capacity": 16 << 20, "mounted": True, "draining": False}]


def test_ssd_segment_io_and_capacity(master, serve, tmp_path):
    path = tmp_path / "seg.ssd"
    _, http = serve("--segment-size", "0", "--ssd-path", str(path), "--ssd-size", "8MiB",
                    "--ssd-buffered-io")
    m0 = scrape(http)
    assert sample(m0, "kvpool_segment_capacity_bytes", segment=_ssd_name(m0), tier="ssd") == 8 << 20
    data = os.urandom(200000)
    with kvpool.Client(master, transport="tcp") as c:
        c.put("d", data, medium="ssd")
        assert c.get("d") == data
        m = c.metrics()
    assert m["client"]["ssd"]["put"] == {"ops": 1, "bytes": len(data)}
    assert m["client"]["ssd"]["get"] == {"ops": 1, "bytes": len(data)}
    assert m["client"]["tcp"]["put"]["ops"] == 0
    m1 = scrape(http)

    def delta(name, **lb):
        return sample(m1, name, **lb) - sample(m0, name, **lb)

    assert delta("kvpool_served_bytes_total", transport="ssd") == 2 * len(data)
    # the object's blocks (4 KiB-rounded) were written and read back at least once
    assert delta("kvpool_ssd_io_bytes_total", op="write") >= len(data)
    assert delta("kvpool_ssd_io_bytes_total", op="read") >= len(data)
    assert delta("kvpool_ssd_io_ops_total", op="write") >= 1
    assert sample(m1, "kvpool_ssd_io_errors_total") == 0


def _ssd_name(metrics):
    (name,) = [dict(lb)["segment"] for (n, lb) in metrics
               if n == "kvpool_segment_capacity_bytes" and dict(lb)["tier"] == "ssd"]
    return name


# ---- /health ----


def test_health_ok_then_503_while_leaving(master_proc, serve):
    d, http = serve("--segment-size", "16MiB", global_args=("--timeout-ms", "3000"))
    assert http_get(http, "/health") == (200, "ok\n")
    assert http_get(http, "/nope")[0] == 404
    # hold the master so serve's drain on SIGTERM cannot finish: /health must say 503
    mpid = master_proc.pid
    freeze(mpid)
    try:
        os.kill(d.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        status = None
        while time.monotonic() < deadline:
            status, body = http_get(http, "/health")
            if status == 503:
                break
            time.sleep(0.05)
        assert status == 503, body
        assert "draining" in body or "shutting down" in body
    finally:
        os.kill(mpid, signal.SIGCONT)
    assert d.stop() == 0


# ---- serve --config ----


def _run_serve(argv, timeout=10):
    """serve that must fail at once: (rc, stderr)."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stderr


def test_serve_config_file_and_overrides(master, request, tmp_path):
    cli = _bin("KVPOOL_CLI_BIN")
    conf = tmp_path / "kvpool.conf"
    conf.write_text(f"""# kvpool serve settings
master = {master}
[master]
lease-ttl = 5
[serve]
segment-size = 24MiB
name = from-file
http-listen = 127.0.0.1:0
""")
    started = []
    request.addfinalizer(lambda: [d.stop() for d in started])

    # every setting from the file: the master address (a global flag) included
    d = Daemon([cli, "serve", "--config", str(conf), "--ready-fd", "{fd}"], lines=2)
    started.append(d)
    assert d.lines[0] == "from-file"
    http = d.lines[1].split(" ", 1)[1]
    m = scrape(http)
    assert sample(m, "kvpool_segment_capacity_bytes", segment="from-file", tier="dram") == 24 << 20
    assert d.stop() == 0

    # command-line flags override the file (also --config=FILE)
    d = Daemon([cli, "serve", f"--config={conf}", "--name", "from-cli", "--segment-size",
                "8MiB", "--ready-fd", "{fd}"], lines=2)
    started.append(d)
    assert d.lines[0] == "from-cli"
    m = scrape(d.lines[1].split(" ", 1)[1])
    assert sample(m, "kvpool_segment_capacity_bytes", segment="from-cli", tier="dram") == 8 << 20
    assert d.stop() == 0

    # an unknown key is a usage error (exit 2) naming the file and line
    bad = tmp_path / "bad.conf"
    bad.write_text("[serve]\nsegment-size = 8MiB\nno-such-flag = 1\n")
    rc, err = _run_serve([cli, "--master", master, "serve", "--config", str(bad)])
    assert rc == 2, err
    assert f"{bad}:3" in err, err
    # and a bad value is the same usage error as the flag's
    worse = tmp_path / "worse.conf"
    worse.write_text("[serve]\nsegment-size = lots\n")
    rc, err = _run_serve([cli, "--master", master, "serve", "--config", str(worse)])
    assert rc == 2 and "--segment-size" in err, err


def test_http_listen_bad_address_is_a_usage_error(master):
    rc, err = _run_serve([_bin("KVPOOL_CLI_BIN"), "--master", master, "serve", "--segment-size",
                          "8MiB", "--http-listen", "nowhere"])
    assert rc == 2 and "--http-listen" in err, err
