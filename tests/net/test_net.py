"""Scenarios on hosts in network namespaces (issue 27): tests/net/netbed.py makes the hosts,
tests/net/workload.py runs a client host's calls and logs them, tests/net/checker.py names
the promises they broke. Each scenario ends with the checker's verdict (a test fails on
any broken promise) and its measured unavailability, written to $KVPOOL_NET_REPORT (a
JSON line per scenario) when that is set.

Run as root from the repository root (deploy/test.sh and `meson test --suite net` do):
    PYTHONPATH=build/client/python KVPOOL_MASTER_BIN=build/master/kvpool-master \\
    KVPOOL_CLI_BIN=build/client/kvpool python3 -m pytest -q tests/net
"""

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checker  # noqa: E402
import netbed  # noqa: E402

OK, WHY = netbed.available()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)

HERE = os.path.dirname(os.path.abspath(__file__))
MASTER_BIN = os.path.abspath(os.environ.get("KVPOOL_MASTER_BIN", "build/master/kvpool-master"))
CLI_BIN = os.path.abspath(os.environ.get("KVPOOL_CLI_BIN", "build/client/kvpool"))
SIZE = 16384


def ready_start(bed, host, argv, timeout=15.0, log=None):
    """Start argv (with "{fd}" for its --ready-fd) in host; (Popen, its ready line)."""
    r, w = os.pipe()
    argv = [a if a != "{fd}" else str(w) for a in argv]
    p = bed.start(host, argv, pass_fds=(w,), stdin=subprocess.DEVNULL,
                  stdout=subprocess.DEVNULL, stderr=log or subprocess.DEVNULL)
    os.close(w)
    buf = b""
    deadline = time.monotonic() + timeout
    try:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                break
            chunk = os.read(r, 512)
            if not chunk:
                break
            buf += chunk
    finally:
        os.close(r)
    if b"\n" not in buf:
        bed.stop(p, signal.SIGKILL)
        raise RuntimeError(f"{argv} in {host} did not become ready: {buf!r}")
    return p, buf.decode().split("\n")[0]


class Cluster:
    """A master on hosts[0] and a `kvpool serve` owner on each of owner_hosts, all with
    --auth none (other hosts are let in: a trusted network, operations.md)."""

    def __init__(self, bed, tmp, owner_hosts, master_args=(), serve_args=()):
        self.bed, self.tmp = bed, tmp
        self.mhost = bed.hosts[0]
        self.mlog_path = os.path.join(tmp, "master.log")
        self.mlog = open(self.mlog_path, "ab")
        self.master, self.addr = ready_start(
            bed, self.mhost, [MASTER_BIN, "--listen", f"{self.mhost.addr}:0", "--ready-fd",
                              "{fd}", "--auth", "none", *master_args], log=self.mlog)
        self.owners = []
        for h in owner_hosts:
            self.add_owner(h, serve_args)

    def add_owner(self, h, serve_args=()):
        log = open(os.path.join(self.tmp, f"owner-{h.name}.log"), "ab")
        p, line = ready_start(self.bed, h, [CLI_BIN, "--master", self.addr, "serve",
                                            "--segment-size", "64MiB", "--auth", "none",
                                            "--ready-fd", "{fd}", *serve_args], log=log)
        self.owners.append((h, p, line))
        return p, line

    def master_log(self):
        self.mlog.flush()
        with open(self.mlog_path, errors="replace") as f:
            return f.read()

    def cli(self, host, *args, transport="tcp"):
        return host.run([CLI_BIN, "--master", self.addr, "--transport", transport,
                         "--timeout-ms", "3000", *args], timeout=30)


def workload(bed, host, cl, tmp, name, **kw):
    """Start tests/net/workload.py run in host; (Popen, its log path, its stop file)."""
    log = os.path.join(tmp, f"{name}.jsonl")
    stop = os.path.join(tmp, f"{name}.stop")
    argv = [sys.executable, os.path.join(HERE, "workload.py"), "run", cl.addr, log, name,
            "--size", str(SIZE), "--stop", stop, "--duration", str(kw.get("duration", 120)),
            "--timeout-ms", str(kw.get("timeout_ms", 2000))]
    p = bed.start(host, argv, env={**os.environ}, stderr=open(log + ".err", "ab"))
    return p, log, stop


def finish(bed, p, stop, timeout=30):
    open(stop, "w").close()
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        bed.stop(p, signal.SIGKILL)
        raise AssertionError("the workload did not stop within 30 s of being asked (a hang)")


def verify(bed, host, cl, tmp, runs):
    log = os.path.join(tmp, "verify.jsonl")
    r = host.run([sys.executable, os.path.join(HERE, "workload.py"), "verify", cl.addr, log,
                  "verify", *runs, "--size", str(SIZE), "--timeout-ms", "5000"],
                 env={**os.environ}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return log


def report(name, bad, stats, **extra):
    line = {"scenario": name, "broken": bad, **stats, **extra}
    path = os.environ.get("KVPOOL_NET_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
    print(json.dumps(line))


def ok_count(log, op):
    return sum(1 for c in checker.read(log) if c["op"] == op and c["ok"])


def wait_calls(log, n, timeout=30):
    netbed.wait_for(lambda: os.path.exists(log) and ok_count(log, "put") >= n, timeout,
                    f"{n} acknowledged puts in {log}")


@pytest.fixture
def bed(request):
    beds = []

    def make(n):
        b = netbed.NetBed(n)
        beds.append(b)
        return b

    yield make
    for b in beds:
        b.close()


# ---- multi-host by default -------------------------------------------------------------------

def test_owner_on_another_host_is_reachable_by_default(bed, tmp_path):
    """Master, owner and client each on a host of their own, the owner started with no
    --data-host: it advertises the address it reaches the master from, and a tcp client
    on a third host puts and gets through it (on main before issue 27 it advertised
    127.0.0.1 and every tcp get failed with "cannot connect to peer 127.0.0.1:...")."""
    b = bed(3)
    master, owner, client = b.hosts
    cl = Cluster(b, str(tmp_path), [owner])
    src = tmp_path / "value"
    src.write_bytes(b"hello from another host")
    r = cl.cli(client, "put", "net-k1", str(src))
    assert r.returncode == 0, r.stderr
    r = cl.cli(client, "get", "net-k1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "hello from another host"
    assert "advertises the loopback endpoint" not in cl.master_log()


def test_master_warns_of_a_loopback_endpoint_from_another_host(bed, tmp_path):
    """An owner on another host told --data-host 127.0.0.1 mounts (it may have same-host
    clients only), and the master says loudly that other hosts cannot reach it."""
    b = bed(2)
    cl = Cluster(b, str(tmp_path), [])
    cl.add_owner(b.hosts[1], ("--data-host", "127.0.0.1"))
    netbed.wait_for(lambda: "advertises the loopback endpoint" in cl.master_log(), 10,
                    "the master's warning")
    line = [x for x in cl.master_log().splitlines() if "loopback endpoint" in x][0]
    assert b.hosts[1].addr in line and "--data-host" in line


# ---- partitions ------------------------------------------------------------------------------

def test_owner_cut_from_client_not_from_master(bed, tmp_path):
    """Two owners; one is cut from the client host (both ways) for 4 s while the client
    puts and gets, then healed. The master still sees that owner, so nothing it holds
    leaves the pool: every acknowledged put reads back byte-exact afterwards, no get
    ever returns other bytes, the calls that meet the cut fail within their timeout (no
    hang), and the client goes on through the other owner meanwhile."""
    b = bed(4)
    master, o1, o2, client = b.hosts
    cl = Cluster(b, str(tmp_path), [o1, o2])
    p, log, stop = workload(b, client, cl, str(tmp_path), "cutowner")
    wait_calls(log, 50)
    b.cut(o1, client)
    t_cut = time.time()
    time.sleep(4)
    b.heal(o1, client)
    t_heal = time.time()
    wait_calls(log, ok_count(log, "put") + 50)
    assert finish(b, p, stop) == 0
    ver = verify(b, client, cl, str(tmp_path), [log])
    bad, stats = checker.check([log], ver, SIZE)
    during = [c for c in checker.read(log) if t_cut <= c["t0"] and c["t1"] <= t_heal]
    report("owner cut from a client (4 s)", bad, stats,
           ok_during_cut=sum(1 for c in during if c["ok"]),
           failed_during_cut=sum(1 for c in during if not c["ok"]))
    assert bad == []
    assert stats["longest_call_s"] < 2 + 1.5  # every call that met the cut gave up in time
    assert stats["longest_gap_s"] < 4 + 2 + 2  # the cut, and a call's timeout at each end


def test_client_cut_from_master_mid_run(bed, tmp_path):
    """The client host is cut from the master (both ways) for 3 s, owners still reachable:
    calls fail within their timeout while cut and succeed again once healed; nothing
    acknowledged is lost and no wrong byte is returned."""
    b = bed(3)
    master, owner, client = b.hosts
    cl = Cluster(b, str(tmp_path), [owner])
    p, log, stop = workload(b, client, cl, str(tmp_path), "cutmaster")
    wait_calls(log, 50)
    b.cut(client, master)
    time.sleep(3)
    b.heal(client, master)
    t_heal = time.time()
    wait_calls(log, ok_count(log, "put") + 50, timeout=30)
    assert finish(b, p, stop) == 0
    first_ok = min(c["t1"] for c in checker.read(log) if c["ok"] and c["t0"] >= t_heal)
    ver = verify(b, client, cl, str(tmp_path), [log])
    bad, stats = checker.check([log], ver, SIZE)
    report("client cut from the master (3 s)", bad, stats,
           back_after_heal_s=round(first_ok - t_heal, 3))
    assert bad == []
    assert stats["longest_call_s"] < 2 + 1.5  # no call outlived its timeout (no hang)
    assert first_ok - t_heal < 2 + 2  # back within a call's timeout or two of the heal


def test_owner_cut_from_master_not_from_clients(bed, tmp_path):
    """An owner is cut from the master (both ways) for longer than --client-ttl while a
    client that still reaches it puts and gets. The master drops the silent owner's
    segment (its objects leave the index: gets of them answer NOT_FOUND meanwhile); once
    healed the owner mounts again and offers its record, and every acknowledged put
    reads back byte-exact: nothing acknowledged is lost."""
    b = bed(4)
    master, o1, o2, client = b.hosts
    cl = Cluster(b, str(tmp_path), [o1, o2], master_args=("--client-ttl", "2"))
    p, log, stop = workload(b, client, cl, str(tmp_path), "cutfrommaster")
    wait_calls(log, 50)
    t_cut = time.time()
    b.cut(o1, master)
    time.sleep(5)
    b.heal(o1, master)
    t_heal = time.time()
    netbed.wait_for(lambda: "adopt" in cl.master_log().split("unmounted", 1)[-1], 20,
                    "the owner's mount and record offer after the heal")
    wait_calls(log, ok_count(log, "put") + 50)
    assert finish(b, p, stop) == 0
    ver = verify(b, client, cl, str(tmp_path), [log])
    bad, stats = checker.check([log], ver, SIZE,
                               missing_ok=lambda c: t_cut <= c["t0"] <= t_heal + 10)
    report("owner cut from the master (5 s, --client-ttl 2)", bad, stats)
    assert bad == []
    assert stats["longest_call_s"] < 2 + 1.5
