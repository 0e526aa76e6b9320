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
# How long after a new leader's election the HA tests wait for every owner to offer its
# record to it: twice the documented bound (docs/operations.md, "High availability":
# "Owners follow a new leader within about 3 s of its election"), a margin for a machine
# starved of CPU (measured there: at most 1.4 s).
FOLLOW_BOUND_S = 6.0


# owners that log what they do (their drains, remounts and offers) in their logs
INFO = {**os.environ, "KVPOOL_LOG_LEVEL": "info"}


def ready_start(bed, host, argv, timeout=15.0, log=None, env=None):
    """Start argv (with "{fd}" for its --ready-fd) in host; (Popen, its ready line)."""
    r, w = os.pipe()
    argv = [a if a != "{fd}" else str(w) for a in argv]
    p = bed.start(host, argv, pass_fds=(w,), stdin=subprocess.DEVNULL,
                  stdout=subprocess.DEVNULL, stderr=log or subprocess.DEVNULL, env=env)
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
    --auth none (other hosts are let in: a trusted network, docs/security.md)."""

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
            "--timeout-ms", str(kw.get("timeout_ms", 2000)),
            "--registers", str(kw.get("registers", 4)),
            "--replicas", str(kw.get("replicas", 1))]
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


# What the daemons said about objects leaving or coming back (a failed scenario's report
# carries these lines, so that a loss seen once in CI names its cause).
EVIDENCE = ("left the pool", "lost their last replica", "refused", "applied after the",
            "adopted back", "drain", "elected leader", "offer", "record")


def evidence(tmp, limit=80):
    out = []
    for name in sorted(os.listdir(tmp)):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(tmp, name), errors="replace") as f:
            out += [f"{name}: {x.rstrip()}" for x in f if any(e in x for e in EVIDENCE)]
    return out[-limit:]


def ok_count(log, op):
    return sum(1 for c in checker.read(log) if c["op"] == op and c["ok"])


def wait_calls(log, n, timeout=30):
    netbed.wait_for(lambda: os.path.exists(log) and ok_count(log, "put") >= n, timeout,
                    f"{n} acknowledged puts in {log}")


def settle_and_check(bed, host, cl, tmp, p, log, stop, **check):
    """After a scenario's fault: wait for 50 more acknowledged puts, stop the workload
    (asserting it ended cleanly), read every key back, and run the checker over the log
    (check: lost_ok / missing_ok). (violations, stats, every call logged)."""
    wait_calls(log, ok_count(log, "put") + 50)
    assert finish(bed, p, stop) == 0
    ver = verify(bed, host, cl, tmp, [log])
    bad, stats = checker.check([log], ver, SIZE, **check)
    return bad, stats, checker.read(log)


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


# ---- the congestion control of data connections ---------------------------------------------

# A client on host argv[2] (a name for its keys): 8 x 64 KiB put and got over tcp,
# byte-exact; then, while its connections are open, its established tcp sockets as the
# kernel has them (ss -tinp in its own namespace): [[local addr, peer addr, algorithm]].
CC_CLIENT = r"""
import json, os, subprocess, sys
import kvpool
kv = {"cc-%s-%d" % (sys.argv[2], i): os.urandom(64 * 1024) for i in range(8)}
keys = list(kv)
with kvpool.Client(sys.argv[1], transport="tcp") as c:
    assert c.batch_put(keys, [kv[k] for k in keys]) == [0] * len(keys)
    assert c.batch_get(keys) == [kv[k] for k in keys]
    out = subprocess.run(["ss", "-tinpH", "state", "established"], check=True,
                         capture_output=True, text=True).stdout
    print(json.dumps(out), flush=True)
    sys.stdin.readline()  # connections held open while the test reads the owner's
"""


def cc_sockets(ss_out, pid):
    """[(local addr, peer addr, algorithm)] of pid's sockets in `ss -tinpH` output."""
    found, cur = [], None
    for line in ss_out.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # a socket: recv-q send-q local peer users:((...))
            f = line.split()
            cur = (f[2].rsplit(":", 1)[0], f[3].rsplit(":", 1)[0]) \
                if f"pid={pid}," in line else None
        elif cur is not None:  # its details, the algorithm first
            found.append((*cur, line.split()[0]))
            cur = None
    return found


def test_data_connections_keep_bbr_across_hosts(bed, tmp_path):
    """KVPOOL_TCP_CONGESTION unset, every host's system algorithm BBR (set in each
    namespace): a data connection between two hosts keeps BBR at both ends, one between a
    client and the owner on the owner's own host (through the owner's own address, as the
    master hands it out) runs cubic at both ends; the connections to the master keep the
    system's (docs/operations.md, "TCP congestion control of data connections")."""
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
        if "bbr" not in f.read().split():
            subprocess.run(["modprobe", "tcp_bbr"], capture_output=True)
    b = bed(3)
    master, owner, far = b.hosts
    for h in b.hosts:  # the namespaces' own default, whatever the machine's
        r = h.run(["sysctl", "-qw", "net.ipv4.tcp_congestion_control=bbr"])
        if r.returncode != 0:
            pytest.skip(f"this kernel has no bbr: {r.stderr.strip()}")
    env = {k: v for k, v in os.environ.items() if k != "KVPOOL_TCP_CONGESTION"}
    cl = Cluster(b, str(tmp_path), [owner])
    owner_pid = cl.owners[0][1].pid
    clients, seen = [], {}
    try:
        for h in (far, owner):
            c = b.start(h, [sys.executable, "-c", CC_CLIENT, cl.addr, h.name], env=env,
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
            clients.append(c)
            line = c.stdout.readline()
            assert line, c.stderr.read()[-2000:] if c.poll() is not None else "no answer"
            seen[h.name] = cc_sockets(json.loads(line), c.pid)
        r = owner.run(["ss", "-tinpH", "state", "established"], check=True)
        seen["owner"] = cc_sockets(r.stdout, owner_pid)
    finally:
        for c in clients:
            if c.poll() is None:
                c.stdin.write("\n")
                c.stdin.flush()
            assert c.wait(30) == 0, c.stderr.read()[-2000:]
    print("\nsockets:", json.dumps(seen))
    m, o, fa = master.addr, owner.addr, far.addr

    def ccs(who, peer):
        return sorted({cc for _, p, cc in seen[who] if p == peer})

    assert ccs(far.name, o) == ["bbr"], seen  # across hosts: the system's
    assert ccs(owner.name, o) == ["cubic"], seen  # on the owner's host: cubic
    assert ccs("owner", fa) == ["bbr"], seen  # the owner's ends of both
    assert ccs("owner", o) == ["cubic"], seen
    for who in (far.name, owner.name, "owner"):  # to the master: untouched
        assert ccs(who, m) == ["bbr"], seen


# ---- partitions ------------------------------------------------------------------------------

def test_owner_cut_from_client_not_from_master(bed, tmp_path):
    """Two owners; one is cut from the client host (both ways) for 4 s while the client
    puts and gets, then healed. The master still sees that owner, so nothing it holds
    leaves the pool: every acknowledged put reads back byte-exact afterwards, no get
    ever returns other bytes, the calls that meet the cut fail within their timeout (no
    hang), and the client goes on through the other owner meanwhile: after a write to the
    cut owner failed, its puts ask the master to place elsewhere (PutConfig
    avoid_segments), so no second put waits on that owner (gets of what it holds still
    do: it has the only replica)."""
    b = bed(4)
    master, o1, o2, client = b.hosts
    cl = Cluster(b, str(tmp_path), [o1, o2])
    # no registers here: a round's in-place upsert of one the cut owner holds, and its get,
    # would each wait out their timeout there, hiding what this measures (the puts going
    # around it); the other scenarios check the registers
    p, log, stop = workload(b, client, cl, str(tmp_path), "cutowner", registers=0)
    wait_calls(log, 50)
    b.cut(o1, client)
    t_cut = time.time()
    time.sleep(4)
    b.heal(o1, client)
    t_heal = time.time()
    bad, stats, calls = settle_and_check(b, client, cl, str(tmp_path), p, log, stop)
    during = [c for c in calls if t_cut <= c["t0"] and c["t1"] <= t_heal]
    report("owner cut from a client (4 s)", bad, stats,
           ok_during_cut=sum(1 for c in during if c["ok"]),
           failed_during_cut=sum(1 for c in during if not c["ok"]))
    assert bad == []
    assert stats["longest_call_s"] < 2 + 1.5  # every call that met the cut gave up in time
    assert stats["longest_gap_s"] < 4 + 2 + 2  # the cut, and a call's timeout at each end
    # puts went around the cut owner: at most one get's timeout between two acknowledged
    # puts (5 s before avoid_segments: every put placed on it waited out its timeout)
    assert stats["longest_put_gap_s"] < 2 + 2 + 0.5
    assert any(c["ok"] and c["op"] == "put" for c in during)


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
    bad, stats, calls = settle_and_check(b, client, cl, str(tmp_path), p, log, stop,
                                         missing_ok=lambda c: t_cut <= c["t0"] <= t_heal + 10)
    report("owner cut from the master (5 s, --client-ttl 2)", bad, stats)
    assert bad == []
    assert stats["longest_call_s"] < 2 + 1.5


# ---- HA: three etcd members and three masters on hosts of their own -------------------------

class HaCluster:
    """etcd member and master i on hosts[i] (i < 3), `kvpool serve` owners on owner_hosts;
    clients use etcd://A0:2379,A1:2379,A2:2379/net."""

    def __init__(self, bed, tmp, owner_hosts, leader_ttl=2):
        self.bed, self.tmp = bed, tmp
        self.mh = bed.hosts[:3]
        exe = "/usr/bin/etcd"
        if not os.access(exe, os.X_OK):
            pytest.fail("etcd is not installed (deploy/install-deps.sh installs etcd-server)")
        peers = ",".join(f"e{i}=http://{h.addr}:2380" for i, h in enumerate(self.mh))
        self.etcd = []
        for i, h in enumerate(self.mh):
            self.etcd.append(bed.start(h, [
                exe, "--name", f"e{i}", "--data-dir", os.path.join(tmp, f"etcd{i}"),
                "--listen-client-urls", f"http://{h.addr}:2379",
                "--advertise-client-urls", f"http://{h.addr}:2379",
                "--listen-peer-urls", f"http://{h.addr}:2380",
                "--initial-advertise-peer-urls", f"http://{h.addr}:2380",
                "--initial-cluster", peers, "--initial-cluster-state", "new",
                "--initial-cluster-token", f"kvpool-net-{os.getpid()}",
                "--heartbeat-interval", "100", "--election-timeout", "1000",
                # etcd 3.5's default, off in Debian's 3.4: a member cut off for a while
                # (test_leader_cut_from_everything cuts the leader's host, its member
                # too) campaigns with ever higher terms, and without pre-vote it deposes
                # the healthy leader when it rejoins. One CI run's verify client then
                # found no etcd member answering for its whole 5 s (docs/operations.md).
                "--pre-vote",
                "--logger=zap", "--log-outputs=stderr"],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, f"etcd{i}.log"), "ab"),
                stdin=subprocess.DEVNULL))
        self.endpoints = ",".join(f"{h.addr}:2379" for h in self.mh)
        netbed.wait_for(lambda: all(self.etcd_healthy(h) for h in self.mh), 30,
                        "the three etcd members to answer")
        self.addr = f"etcd://{self.endpoints}/net"
        self.masters, self.mlogs = [], []
        for i, h in enumerate(self.mh):
            path = os.path.join(tmp, f"master{i}.log")
            self.mlogs.append(path)
            p, _ = ready_start(bed, h, [
                MASTER_BIN, "--listen", f"{h.addr}:5005{i}", "--ready-fd", "{fd}", "--auth",
                "none", "--etcd", self.endpoints, "--cluster", "net", "--leader-ttl",
                str(leader_ttl), "--http-listen", f"{h.addr}:9100"], log=open(path, "ab"))
            self.masters.append(p)
        netbed.wait_for(lambda: self.leader() is not None, 30, "a leader")
        self.owners = []
        for h in owner_hosts:
            log = open(os.path.join(tmp, f"owner-{h.name}.log"), "ab")
            p, _ = ready_start(bed, h, [CLI_BIN, "--master", self.addr, "serve",
                                        "--segment-size", "64MiB", "--auth", "none",
                                        "--ready-fd", "{fd}"], log=log, timeout=30, env=INFO)
            self.owners.append(p)

    def etcd_healthy(self, h):
        r = h.run(["curl", "-s", "-m", "2", f"http://{h.addr}:2379/health"])
        return '"health":"true"' in r.stdout

    def leads(self, i):
        h = self.mh[i]
        r = h.run(["curl", "-s", "-m", "2", "-o", "/dev/null", "-w", "%{http_code}",
                   f"http://{h.addr}:9100/health"])
        return r.stdout.strip() == "200"

    def leader(self):
        leading = [i for i in range(3) if self.leads(i)]
        return leading[0] if len(leading) == 1 else None

    def log(self, i):
        with open(self.mlogs[i], errors="replace") as f:
            return f.read()


def log_time(line):
    """The wall-clock time of a master log line ("HH:MM:SS.mmm ..."), today."""
    hms = line.split()[0]
    h, m, s = hms.split(":")
    t = time.localtime()
    day = time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))
    return day + int(h) * 3600 + int(m) * 60 + float(s)


def probe_leader(bed, host, addr, out, stop):
    """A client pinned to one master (not through etcd), asking it every 20 ms: a JSON line
    per answer (t, ok or the error name) in out."""
    code = ("import json,os,sys,time,kvpool\n"
            "out, stop = open(sys.argv[2], 'a', buffering=1), sys.argv[3]\n"
            "c = kvpool.Client(sys.argv[1], rpc_timeout_ms=500)\n"
            "while not os.path.exists(stop):\n"
            "    t0 = time.time()\n"
            "    try:\n"
            "        c.batch_exists(['probe']); r = 'ok'\n"
            "    except kvpool.Error as e:\n"
            "        r = e.name\n"
            "    out.write(json.dumps({'t0': t0, 't1': time.time(), 'r': r}) + '\\n')\n"
            "    time.sleep(0.02)\n")
    return bed.start(host, [sys.executable, "-c", code, addr, out, stop], env={**os.environ},
                     stderr=open(out + ".err", "ab"))


def elections(ha, i, since):
    """The times master i logged its election as leader, at or after since."""
    return [log_time(x) for x in ha.log(i).splitlines()
            if "elected leader" in x and log_time(x) >= since]


def offers(ha, i, since):
    """{segment: when its record was offered} to master i at or after since (its log's
    "segment S (dram): N objects adopted back" lines; the first per segment)."""
    out = {}
    for x in ha.log(i).splitlines():
        if "adopted back" in x and log_time(x) >= since:
            seg = x.split(" segment ", 1)[1].split(" ", 1)[0]
            out.setdefault(seg, log_time(x))
    return out


def wait_owners_follow(ha, candidates, t_cut, n_owners):
    """Wait until n_owners segments offered their records to the master of candidates that
    leads now, each within FOLLOW_BOUND_S of that master's last election after t_cut (the
    event, not a moment: a leader elected again restarts the clock, 60 s in all at most).
    (the leader, its election time, {segment: offer time})."""
    deadline = time.time() + 60
    while True:
        lead = next((i for i in candidates if ha.leads(i)), None)
        since = max(elections(ha, lead, t_cut - 1), default=None) if lead is not None else None
        got = offers(ha, lead, since) if since is not None else {}
        if len(got) >= n_owners:
            return lead, since, got
        now = time.time()
        if since is not None and now > since + FOLLOW_BOUND_S and ha.leads(lead):
            raise AssertionError(
                f"{len(got)} of {n_owners} owners offered their records to the leader "
                f"(master {lead}) within {FOLLOW_BOUND_S} s of its election: "
                f"{sorted(got)}\n" + ha.log(lead)[-3000:])
        if now > deadline:
            raise AssertionError(f"no leader with every owner's record within 60 s: {got}")
        time.sleep(0.05)


def test_leader_cut_from_etcd_not_from_clients(bed, tmp_path):
    """The leader's host is cut from the other two etcd/master hosts (its own etcd member is
    then in the minority) but not from clients or owners. It must stop answering before a
    new leader answers (no two leaders hand out extents): a client pinned to it gets its
    last answer before the new leader's election; the workload through etcd goes on with
    the new leader, nothing acknowledged is lost and no get returns wrong bytes. A get
    answered by the new leader before the owners offered their records reads as absent
    (operations.md, "Master restart": documented, and measured here as the window)."""
    b = bed(6)
    tmp = str(tmp_path)
    ha = HaCluster(b, tmp, b.hosts[3:5])
    client = b.hosts[5]
    old = ha.leader()
    others = [i for i in range(3) if i != old]
    stop = os.path.join(tmp, "probe.stop")
    plog = os.path.join(tmp, "probe.jsonl")
    pinned = probe_leader(b, client, f"{ha.mh[old].addr}:5005{old}", plog, stop)
    w, log, wstop = workload(b, client, ha, tmp, "leadercut", timeout_ms=5000)
    wait_calls(log, 50)
    t_cut = time.time()
    for i in others:
        b.cut(ha.mh[old], ha.mh[i])
    new = netbed.wait_for(lambda: next((i for i in others if ha.leads(i)), None), 30,
                          "a new leader")
    wait_calls(log, ok_count(log, "put") + 50, timeout=30)
    # Both owners offer their records to the leader within the documented bound after its
    # election (FOLLOW_BOUND_S): waited for, not looked at once (the workload goes on with
    # one owner, so its progress says nothing of the other's). On a busy machine the new
    # leader may lose its lease in turn: then the owners follow the one after it.
    new, since, adopted = wait_owners_follow(ha, others, t_cut, len(ha.owners))
    b.heal()
    b.heal()
    wait_calls(log, ok_count(log, "put") + 50, timeout=30)
    open(stop, "w").close()
    assert finish(b, w, wstop) == 0
    assert pinned.wait(10) == 0
    # the first master elected after the cut (the one the old leader must not overlap)
    elected = sorted(t for i in others for t in elections(ha, i, t_cut - 1))
    assert elected, ha.log(new)[-3000:]
    answers = checker.read(plog)
    last_ok_old = max(a["t1"] for a in answers if a["r"] == "ok" and a["t0"] >= t_cut - 5)
    rebuilt = max(adopted.values())
    ver = verify(b, client, ha, tmp, [log])
    bad, stats = checker.check([log], ver, SIZE, missing_ok=lambda c: c["t1"] <= rebuilt + 0.2)
    if last_ok_old >= elected[0]:
        bad.append(f"two leaders: the old one answered at {last_ok_old:.3f}, after the new "
                   f"one was elected at {elected[0]:.3f}")
    report("leader cut from etcd and the other masters, not from clients", bad, stats,
           old_leader_last_answer_after_cut_s=round(last_ok_old - t_cut, 3),
           new_leader_elected_after_cut_s=round(elected[0] - t_cut, 3),
           records_offered_after_cut_s=round(rebuilt - t_cut, 3),
           owners_followed_after_election_s=sorted(round(t - since, 3)
                                                   for t in adopted.values()),
           elections_after_cut=len(elected),
           absent_during_rebuild=stats["not_found"])
    assert bad == []


def test_leader_cut_from_everything(bed, tmp_path):
    """The leader's host is cut from every other host (etcd members, masters, owners and
    clients) for good measure of 10 s, then healed. A standby leads; the owners mount on it
    and offer their records; the workload through etcd goes on with it; nothing
    acknowledged is lost and no get returns wrong bytes (a get answered before the owners'
    records are in reads as absent: the documented window). After the heal the old leader
    does not lead again: exactly one master answers as leader."""
    b = bed(6)
    tmp = str(tmp_path)
    ha = HaCluster(b, tmp, b.hosts[3:5])
    client = b.hosts[5]
    old = ha.leader()
    others = [i for i in range(3) if i != old]
    w, log, wstop = workload(b, client, ha, tmp, "leaderalone", timeout_ms=5000)
    wait_calls(log, 50)
    t_cut = time.time()
    b.isolate(ha.mh[old])
    netbed.wait_for(lambda: next((i for i in others if ha.leads(i)), None), 30, "a new leader")
    wait_calls(log, ok_count(log, "put") + 50, timeout=30)
    new, since, adopted = wait_owners_follow(ha, others, t_cut, len(ha.owners))
    time.sleep(max(0.0, t_cut + 10 - time.time()))
    b.heal()
    t_heal = time.time()
    wait_calls(log, ok_count(log, "put") + 50, timeout=30)
    leaders = netbed.wait_for(lambda: ha.leader() is not None and [ha.leader()], 30,
                              "exactly one leader after the heal")
    assert finish(b, w, wstop) == 0
    elected = sorted(t for i in others for t in elections(ha, i, t_cut - 1))
    assert elected, ha.log(new)[-3000:]
    rebuilt = max(adopted.values())
    ver = verify(b, client, ha, tmp, [log])
    bad, stats = checker.check([log], ver, SIZE, missing_ok=lambda c: c["t1"] <= rebuilt + 0.2)
    report("leader cut from every host (10 s), then healed", bad, stats,
           new_leader_elected_after_cut_s=round(elected[0] - t_cut, 3),
           records_offered_after_cut_s=round(rebuilt - t_cut, 3),
           owners_followed_after_election_s=sorted(round(t - since, 3)
                                                   for t in adopted.values()),
           absent_during_rebuild=stats["not_found"],
           leader_after_heal=("the new one" if leaders[0] == new else
                              "the old one" if leaders[0] == old else "the third"),
           heal_after_cut_s=round(t_heal - t_cut, 3))
    assert bad == []
    assert leaders[0] != old, "the old leader leads again after the heal"


def test_one_way_partition_and_flapping_link(bed, tmp_path):
    """What a client sends to one owner is dropped (its replies would get through) for 3 s;
    then the link between them flaps, cut 1 s of every 2, for 8 s. Calls that meet the
    cut fail within their timeout, nothing acknowledged is lost and no get returns wrong
    bytes; once the link holds, the client is served again."""
    b = bed(4)
    master, o1, o2, client = b.hosts
    cl = Cluster(b, str(tmp_path), [o1, o2])
    p, log, stop = workload(b, client, cl, str(tmp_path), "flap")
    wait_calls(log, 50)
    b.cut(client, o1, oneway=True)
    time.sleep(3)
    b.heal(client, o1)
    for _ in range(4):
        b.cut(client, o1)
        time.sleep(1)
        b.heal(client, o1)
        time.sleep(1)
    t_heal = time.time()
    bad, stats, calls = settle_and_check(b, client, cl, str(tmp_path), p, log, stop)
    first_ok = min(c["t1"] for c in calls if c["ok"] and c["t0"] >= t_heal)
    report("one-way cut client->owner (3 s), then the link flapping (1 s of 2, 8 s)", bad,
           stats, back_after_heal_s=round(first_ok - t_heal, 3))
    assert bad == []
    assert stats["longest_call_s"] < 2 + 1.5


LOSS_PCTS = [int(x) for x in os.environ.get("KVPOOL_NET_LOSS_PCTS", "1").split(",")]


@pytest.mark.parametrize("pct", LOSS_PCTS)
def test_lossy_links(bed, tmp_path, pct):
    """pct % ($KVPOOL_NET_LOSS_PCTS, default 1; docs: 1,5) of the packets between the client and each owner, and between the client and
    the master, dropped at random both ways for 6 s (TCP retransmits them: a lost segment
    costs at least the 200 ms minimum RTO). Nothing acknowledged is lost, no get returns
    wrong bytes, no call outlives its timeout by more than 1.5 s, and the client is served
    throughout: puts are acknowledged during the loss, none of its seconds without one.
    $KVPOOL_NET_RTO_MIN (e.g. 10ms): the hosts' route's rto_min, to measure that knob."""
    b = bed(4)
    master, o1, o2, client = b.hosts
    rto_min = os.environ.get("KVPOOL_NET_RTO_MIN")
    if rto_min:
        b.rto_min(rto_min)
    cl = Cluster(b, str(tmp_path), [o1, o2])
    p, log, stop = workload(b, client, cl, str(tmp_path), f"lossy{pct}")
    wait_calls(log, 50)
    t_on = time.time()
    for h in (o1, o2, master):
        b.lossy(client, h, pct)
    time.sleep(6)
    b.heal()
    t_off = time.time()
    bad, stats, calls = settle_and_check(b, client, cl, str(tmp_path), p, log, stop)
    before = [c for c in calls if c["t1"] < t_on]
    during = [c for c in calls if t_on <= c["t0"] and c["t1"] <= t_off]

    def per_s(cs, secs):
        return round(sum(1 for c in cs if c["ok"]) / secs, 1)

    def p50_ms(cs):
        d = sorted(c["t1"] - c["t0"] for c in cs if c["ok"])
        return round(1000 * d[len(d) // 2], 1) if d else None

    t_first = min(c["t0"] for c in calls)
    report(f"{pct} % loss client<->owners and client<->master (6 s)", bad, stats,
           ok_per_s_before=per_s(before, max(t_on - t_first, 0.001)),
           ok_per_s_during=per_s(during, t_off - t_on),
           p50_ms_before=p50_ms(before), p50_ms_during=p50_ms(during),
           failed_during=sum(1 for c in during if not c["ok"]), rto_min=rto_min or "200ms")
    assert bad == []
    assert stats["longest_call_s"] < 2 + 1.5
    puts = [c for c in during if c["op"] == "put" and c["ok"]]
    assert puts, "no put acknowledged during the loss"
    assert checker.longest_gap([c for c in calls if c["op"] == "put"], t_on, t_off) < 2 + 1


def test_stalling_owner(bed, tmp_path):
    """One of two owners stalls: stopped (SIGSTOP) 150 ms of every 250 ms for 6 s, as a
    node in long GC-like pauses or starved of CPU answers late (without netem, the bed's
    stand-in for a slow peer). Its calls slow down but none fails (a stall is far below a
    call's 2 s timeout and the master's client TTL), nothing is lost or wrong, and the
    client is served throughout."""
    b = bed(4)
    master, o1, o2, client = b.hosts
    cl = Cluster(b, str(tmp_path), [o1, o2])
    slow = cl.owners[0][1]
    p, log, stop = workload(b, client, cl, str(tmp_path), "stall")
    wait_calls(log, 50)
    t_on = time.time()
    try:
        while time.time() - t_on < 6:
            os.kill(slow.pid, signal.SIGSTOP)
            time.sleep(0.15)
            os.kill(slow.pid, signal.SIGCONT)
            time.sleep(0.1)
    finally:
        os.kill(slow.pid, signal.SIGCONT)
    t_off = time.time()
    bad, stats, calls = settle_and_check(b, client, cl, str(tmp_path), p, log, stop)
    during = [c for c in calls if t_on <= c["t0"] and c["t1"] <= t_off]
    slowest = sorted(c["t1"] - c["t0"] for c in during)
    report("an owner stalled 150 ms of every 250 ms (6 s)", bad, stats,
           ok_during=sum(1 for c in during if c["ok"]),
           failed_during=sum(1 for c in during if not c["ok"]),
           p50_ms_during=round(1000 * slowest[len(slowest) // 2], 1) if slowest else None,
           p99_ms_during=round(1000 * slowest[int(len(slowest) * 0.99)], 1) if slowest else None)
    assert bad == []
    assert stats["failed"] == 0
    assert stats["longest_call_s"] < 1.0
    assert checker.longest_gap(calls, t_on, t_off) < 1.0


NETDELAY = os.path.join(os.path.dirname(CLI_BIN), "..", "tests", "netdelay")


def test_owner_at_200ms_rtt(bed, tmp_path):
    """One of two owners is 200 ms of round trip away from the client (the bed's delaying
    proxy on the client host, its connections to that owner only; the master and the other
    owner are near). Every call that moves bytes to or from it takes a round trip or more
    and stays within its timeout; none fails, nothing is lost or wrong; calls through the
    other owner keep their speed."""
    b = bed(4)
    master, o1, o2, client = b.hosts
    b.delay(client, 100000, NETDELAY, to=[o1])
    cl = Cluster(b, str(tmp_path), [o1, o2])
    p, log, stop = workload(b, client, cl, str(tmp_path), "farowner")
    wait_calls(log, 40, timeout=60)
    assert finish(b, p, stop) == 0
    ver = verify(b, client, cl, str(tmp_path), [log])
    bad, stats = checker.check([log], ver, SIZE)
    calls = [c for c in checker.read(log) if c["ok"]]
    d = sorted(c["t1"] - c["t0"] for c in calls)
    slow = sum(1 for x in d if x >= 0.2)
    report("an owner 200 ms of RTT from the client (the rest near)", bad, stats,
           calls_ok=len(d), calls_over_200ms=slow, p50_ms=round(1000 * d[len(d) // 2], 1),
           max_ms=round(1000 * d[-1], 1))
    assert bad == []
    assert stats["failed"] == 0
    assert stats["longest_call_s"] < 2  # within the calls' timeout
    assert slow > 0, "no call met the far owner's round trip: was the delay in place?"
    assert slow < len(d), "every call was slow: the near owner should answer fast"


def test_gets_go_to_the_near_replica(bed, tmp_path):
    """Every object has a replica on each of two owners, one of them 200 ms of round trip
    from the client (the delaying proxy, as above). Puts write both replicas, so each takes
    the far owner's round trip; gets go to the near replica once the client has met the far
    owner (a peer's read latency orders the replicas a get tries: docs/architecture.md,
    "Reads"): after the first seconds no get takes the far round trip but the few that
    probe it again (an estimate is believed 10 s), none fails, nothing is lost or wrong."""
    b = bed(4)
    master, o1, o2, client = b.hosts
    b.delay(client, 100000, NETDELAY, to=[o1])
    cl = Cluster(b, str(tmp_path), [o1, o2])
    p, log, stop = workload(b, client, cl, str(tmp_path), "nearreplica", replicas=2,
                            registers=0, timeout_ms=3000)
    wait_calls(log, 30, timeout=60)
    t_learnt = time.time()
    wait_calls(log, ok_count(log, "put") + 30, timeout=60)
    assert finish(b, p, stop) == 0
    ver = verify(b, client, cl, str(tmp_path), [log])
    bad, stats = checker.check([log], ver, SIZE)
    calls = checker.read(log)
    gets = sorted(c["t1"] - c["t0"] for c in calls
                  if c["op"] == "get" and c["ok"] and c["t0"] >= t_learnt)
    puts = sorted(c["t1"] - c["t0"] for c in calls if c["op"] == "put" and c["ok"])
    far_gets = sum(1 for x in gets if x >= 0.2)
    report("two replicas, one owner 200 ms of RTT away: gets go to the near one", bad, stats,
           gets_after_learning=len(gets), gets_over_200ms=far_gets,
           get_p50_ms=round(1000 * gets[len(gets) // 2], 1) if gets else None,
           put_p50_ms=round(1000 * puts[len(puts) // 2], 1) if puts else None)
    assert bad == []
    assert stats["failed"] == 0
    assert puts and puts[len(puts) // 2] >= 0.2, "puts should write the far replica too"
    assert len(gets) >= 20
    # the near owner serves them: at most a re-probe of the far one per 10 s
    assert far_gets <= 2 + len(gets) // 50, (far_gets, len(gets))
    assert gets[len(gets) // 2] < 0.1


NETQUEUE = os.path.join(os.path.dirname(CLI_BIN), "..", "tests", "netqueue")


def queue_link(b, a, c, qnum, delay_us, jitter_us=0, reorder_pct=0, loss_pct=0, seed=1):
    """The packets host a sends to host c go through tests/net/netqueue in a (NFQUEUE
    queue qnum: held delay_us plus up to jitter_us, reorder_pct % of them held longer so
    that later ones overtake them, loss_pct % dropped). Returns the netqueue Popen; stop it
    with SIGTERM and read its counters from its stdout. With the program gone, the rule's
    queue-bypass lets packets through."""
    if not os.access(NETQUEUE, os.X_OK):
        pytest.fail(f"{NETQUEUE} was not built: install libnetfilter-queue-dev "
                    "(deploy/install-deps.sh) and rebuild")
    p = b.start(a, [NETQUEUE, str(qnum), str(delay_us), str(jitter_us), str(reorder_pct),
                    str(loss_pct), str(seed)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    r = a.run(["iptables-legacy", "-t", "mangle", "-A", "OUTPUT", "-d", c.addr, "-j",
               "NFQUEUE", "--queue-num", str(qnum), "--queue-bypass"])
    assert r.returncode == 0, r.stderr
    return p


def tcp_counters(host, names):
    """The host's TCP MIB counters (nstat -az, absolute) for names."""
    r = host.run(["nstat", "-az"])
    out = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 2 and f[0] in names:
            out[f[0]] = int(f[1])
    return out


REORDER = ("TcpExtTCPSACKReorder", "TcpExtTCPTSReorder", "TcpExtTCPOFOQueue",
           "TcpExtTCPRetransFail", "TcpRetransSegs")


def test_reordering_jitter_and_loss_on_a_link(bed, tmp_path):
    """The link between the client and one of two owners, both ways, through a packet queue
    of our own (tests/net/netqueue.c over NFQUEUE: this kernel has no netem): every packet
    held 2 ms plus up to 3 ms of jitter, 5 % of them held a further 2 ms so that later ones
    overtake them (packets reach the other side out of order: the kernels' reordering
    counters say so), and 1 % dropped, for 8 s. TCP puts the bytes back in order; nothing
    acknowledged is lost, no get returns wrong bytes, no call fails or outlives its
    timeout, and puts are acknowledged throughout."""
    b = bed(4)
    master, o1, o2, client = b.hosts
    cl = Cluster(b, str(tmp_path), [o1, o2])
    p, log, stop = workload(b, client, cl, str(tmp_path), "reorder")
    wait_calls(log, 50)
    before = {h.name: tcp_counters(h, REORDER) for h in (client, o1)}
    t_on = time.time()
    qs = [queue_link(b, client, o1, 11, 2000, 3000, 5, 1, seed=1),
          queue_link(b, o1, client, 12, 2000, 3000, 5, 1, seed=2)]
    time.sleep(8)
    counts = []
    for q in qs:
        b.stop(q)
        counts.append(q.stdout.read().strip())
    t_off = time.time()
    after = {h.name: tcp_counters(h, REORDER) for h in (client, o1)}
    bad, stats, calls = settle_and_check(b, client, cl, str(tmp_path), p, log, stop)
    during = [c for c in calls if t_on <= c["t0"] and c["t1"] <= t_off]
    d = sorted(c["t1"] - c["t0"] for c in during if c["ok"])
    reordered = {h: {k: after[h].get(k, 0) - before[h].get(k, 0) for k in REORDER}
                 for h in after}
    report("reordering (5 %), jitter (2 + 0-3 ms) and 1 % loss on the client<->owner link (8 s)",
           bad, stats, netqueue=counts, tcp_counters=reordered,
           ok_during=len(d), failed_during=sum(1 for c in during if not c["ok"]),
           p50_ms_during=round(1000 * d[len(d) // 2], 1) if d else None,
           p99_ms_during=round(1000 * d[int(len(d) * 0.99)], 1) if d else None)
    assert bad == []
    assert stats["failed"] == 0
    assert stats["longest_call_s"] < 2 + 1.5
    # the packets really went through the queue and were reordered
    for line in counts:
        f = line.split()
        assert f[0] == "queued" and int(f[1]) > 100 and int(f[7]) > 0, line
    seen = sum(v["TcpExtTCPSACKReorder"] + v["TcpExtTCPTSReorder"] + v["TcpExtTCPOFOQueue"]
               for v in reordered.values())
    assert seen > 0, reordered
    assert [c for c in during if c["op"] == "put" and c["ok"]], "no put acknowledged"


def test_rolling_restart_under_load(bed, tmp_path):
    """Every process in turn, as an upgrade does it, while a client puts and gets through
    etcd: each master (SIGTERM, started again; the leader last), each owner (SIGTERM: it
    drains its objects to the other before it leaves, then a new one starts), each etcd
    member (SIGTERM, started again). Nothing acknowledged is lost, no get returns wrong
    bytes; the unavailability is measured."""
    b = bed(6)
    tmp = str(tmp_path)
    ha = HaCluster(b, tmp, b.hosts[3:5])
    client = b.hosts[5]
    w, log, wstop = workload(b, client, ha, tmp, "rolling", timeout_ms=5000)
    wait_calls(log, 100)
    steps = []

    def step(what, fn):
        t0 = time.time()
        fn()
        wait_calls(log, ok_count(log, "put") + 30, timeout=60)
        steps.append((what, round(time.time() - t0, 3)))

    leader = ha.leader()
    for i in [i for i in range(3) if i != leader] + [leader]:
        def restart_master(i=i):
            assert b.stop(ha.masters[i]) == 0
            h = ha.mh[i]
            ha.masters[i], _ = ready_start(b, h, [
                MASTER_BIN, "--listen", f"{h.addr}:5005{i}", "--ready-fd", "{fd}", "--auth",
                "none", "--etcd", ha.endpoints, "--cluster", "net", "--leader-ttl", "2",
                "--http-listen", f"{h.addr}:9100"], log=open(ha.mlogs[i], "ab"))
            netbed.wait_for(lambda: ha.leader() is not None, 30, "a leader")
        step(f"master {i}{' (the leader)' if i == leader else ''}", restart_master)
    for j, h in enumerate(b.hosts[3:5]):
        def restart_owner(j=j, h=h):
            assert b.stop(ha.owners[j], timeout=60) == 0  # drains first
            log_ = open(os.path.join(tmp, f"owner-{h.name}.log"), "ab")
            ha.owners[j], _ = ready_start(b, h, [CLI_BIN, "--master", ha.addr, "serve",
                                                 "--segment-size", "64MiB", "--auth", "none",
                                                 "--ready-fd", "{fd}"], log=log_, timeout=30,
                                          env=INFO)
        step(f"owner {j}", restart_owner)
    for i in range(3):
        def restart_etcd(i=i):
            p = ha.etcd[i]
            args = p.args[4:]  # after "ip netns exec NS"
            assert b.stop(p) in (0, -signal.SIGTERM)  # etcd dies of it, as designed
            ha.etcd[i] = b.start(ha.mh[i], args, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                 stderr=open(os.path.join(tmp, f"etcd{i}.log"), "ab"))
            netbed.wait_for(lambda: ha.etcd_healthy(ha.mh[i]), 30, f"etcd member {i}")
        step(f"etcd member {i}", restart_etcd)
    assert finish(b, w, wstop) == 0
    ver = verify(b, client, ha, tmp, [log])
    # a new leader reads as empty until the owners offered their records (documented)
    rebuilds = []
    for i in range(3):
        lines = ha.log(i).splitlines()
        for k, x in enumerate(lines):
            if "elected leader" in x:
                done = [log_time(y) for y in lines[k:] if "adopted back" in y]
                rebuilds.append((log_time(x), max(done[:2]) if done else log_time(x) + 5))
    bad, stats = checker.check([log], ver, SIZE, missing_ok=lambda c: any(
        a - 0.5 <= c["t1"] <= z + 0.2 for a, z in rebuilds))
    report("rolling restart: 3 masters, 2 owners (drained), 3 etcd members", bad, stats,
           steps=steps, **({"evidence": evidence(tmp)} if bad else {}))
    assert bad == []
