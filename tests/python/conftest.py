"""Fixtures: real kvpool-master and `kvpool serve` processes on 127.0.0.1.

As tests/harness.c does: a process writes its address on a ready fd when it
listens (no sleeps, no log scraping); every child is killed by the PID we
started and reaped, and one that exits non-zero fails the test that owns it.

Run from the repository root:
    PYTHONPATH=build/client/python KVPOOL_MASTER_BIN=build/master/kvpool-master \\
    KVPOOL_CLI_BIN=build/client/kvpool python3 -m pytest -q tests/python
"""

import os
import random
import select
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

import kvpool

# tests/pip/test_pip.sh runs this suite against a pip-installed kvpool: the modules must
# then come from that site-packages directory, not from a build tree on the path.
_MODULE_PREFIX = os.environ.get("KVPOOL_TEST_MODULE_PREFIX")
if _MODULE_PREFIX:
    import mooncake.store

    for _m in (kvpool, mooncake.store):
        assert _m.__file__.startswith(_MODULE_PREFIX + os.sep), \
            f"{_m.__name__} comes from {_m.__file__}, not from {_MODULE_PREFIX}"


# The TLS pass (deploy/test.sh runs the suite a second time so): KVPOOL_TEST_TLS_DIR names a
# directory of deploy/make-certs.sh's certificates and an ACL (acl.conf); every master this
# suite starts runs with TLS 1.3 and that ACL, and every client, `kvpool serve` and CLI of
# the tests names its principal through $KVPOOL_TLS_CA/_CERT/_KEY, which the TLS pass sets.
TLS_DIR = os.environ.get("KVPOOL_TEST_TLS_DIR") or None


def master_security_args():
    """The flags a master of this suite adds in the TLS pass (none otherwise)."""
    if TLS_DIR is None:
        return []
    return ["--tls-cert", os.path.join(TLS_DIR, "server.crt"),
            "--tls-key", os.path.join(TLS_DIR, "server.key"),
            "--tls-ca", os.path.join(TLS_DIR, "ca.crt"),
            "--tls-crl", os.path.join(TLS_DIR, "crl.pem"),
            "--acl-file", os.path.join(TLS_DIR, "acl.conf")]


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out = set()


def free_port():
    """A TCP port of 127.0.0.1 free a moment ago, drawn below the kernel's ephemeral range:
    a port the kernel hands out itself (bind to 0) may be taken by any connection's local
    end before the process it is meant for binds it (a master failed to start so in CI)."""
    low = _ephemeral_low()
    if low > 12000:
        # Under pytest-xdist (deploy/test.sh runs the suite with -n 2) each worker draws
        # from its own slice of the range: two workers cannot hand out the same port.
        lo, hi = 10000, low
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
        if worker.startswith("gw") and worker[2:].isdigit() and workers > 1:
            span = (hi - lo) // workers
            lo += int(worker[2:]) % workers * span
            hi = lo + span
        for _ in range(200):
            port = random.randrange(lo, hi)
            # Random draws collide (one test asked two ports and got the same one twice for
            # --listen and --http-listen in CI): a port handed out once is never handed out again.
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                _handed_out.add(port)
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(text, name, labels=None):
    """The value of one sample of the exposition text (None: absent)."""
    want = name
    if labels:
        want += "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == want:
            return float(value)
    return None


def http_get(port, path, timeout=10.0):
    """(status, body) of GET http://127.0.0.1:port/path."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def master_metrics(port):
    """The /metrics text of the master whose --http-listen is 127.0.0.1:port (HTTPS in the
    suite's TLS pass)."""
    if not TLS_DIR:
        status, text = http_get(port, "/metrics")
        assert status == 200, text
        return text
    ctx = ssl.create_default_context(cafile=os.path.join(TLS_DIR, "ca.crt"))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=10,
                                context=ctx) as r:
        assert r.status == 200
        return r.read().decode()


def master_metric_at(port, name, **labels):
    """One metric of master_metrics(port)."""
    return metric(master_metrics(port), name, labels or None)


def wait_recorded(master_metric):
    """Every DFS/SSD task the master handed out answered (kvpool_ssd_tasks 0): the owner has
    recorded the puts' entries in its shard file (RECORD tasks), so a kill -9 keeps them."""
    deadline = time.monotonic() + 10
    while (n := master_metric("kvpool_ssd_tasks")) != 0:
        assert time.monotonic() < deadline, f"kvpool_ssd_tasks still {n} after 10 s"
        time.sleep(0.01)


def _bin(env):
    path = os.environ.get(env)
    if not path or not os.access(path, os.X_OK):
        pytest.exit(f"{env} must name the built binary (e.g. {env}="
                    + ("build/master/kvpool-master" if "MASTER" in env else "build/client/kvpool")
                    + f"), got {path!r}", returncode=2)
    return path


def freeze(pid, timeout=5.0):
    """SIGSTOP pid and wait until every one of its threads is stopped, as
    tests/harness.c's kvp_proc_freeze does: kill() returns before the target has
    taken the signal, and until then a running thread may still serve a request."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:  # the thread ended meanwhile
                pass
        if states and all(st in ("T", "t") for st in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} not stopped after {timeout} s: {states}")
        time.sleep(0.002)


class Proc:
    """A child started with --ready-fd: .lines are the first `lines` lines it wrote on it
    (`kvpool serve --http-listen` writes two), .ready the first."""

    def __init__(self, argv, timeout=10.0, lines=1, stderr=None, env=None):
        r, w = os.pipe()
        argv = [a if a != "{fd}" else str(w) for a in argv]
        self.argv = argv
        self.p = subprocess.Popen(argv, pass_fds=(w,), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=stderr,
                                  env=None if env is None else {**os.environ, **env})
        os.close(w)
        buf = b""
        deadline = time.monotonic() + timeout
        try:
            while buf.count(b"\n") < lines:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([r], [], [], left)[0]:
                    break
                chunk = os.read(r, 512)
                if not chunk:
                    break
                buf += chunk
        finally:
            os.close(r)
        if buf.count(b"\n") < lines:
            self.kill()
            raise RuntimeError(f"{argv} did not become ready: {buf!r}")
        self.lines = buf.decode().split("\n")[:lines]
        self.ready = self.lines[0]

    @property
    def pid(self):
        return self.p.pid

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        """Signal our child by its PID and reap it; its exit status."""
        if self.p.returncode is not None:
            return self.p.returncode
        os.kill(self.p.pid, sig)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.p.pid, signal.SIGKILL)
            self.p.wait(5)
            return -signal.SIGKILL

    def kill(self):
        if self.p.returncode is None:
            os.kill(self.p.pid, signal.SIGKILL)
            self.p.wait(5)


def shm_name(pid):
    """The abstract name of owner pid's shm socket ("kvpool-PID-...", /proc/net/unix)."""
    want = f"@kvpool-{pid}-"
    with open("/proc/net/unix") as f:
        for line in f:
            path = line.split()[-1]
            if path.startswith(want):
                return path[1:]
    raise AssertionError(f"no listening socket {want}* in /proc/net/unix")


def stop_all(procs):
    """Stop each Proc in order; [(argv[0], status)] of those that did not exit 0."""
    bad = []
    for p in procs:
        rc = p.stop()
        if rc != 0:
            bad.append((p.argv[0], rc))
    return bad


class Pool:
    """A master and the segments served for it."""

    def __init__(self, segments=("64MiB",), master_args=("--lease-ttl", "0")):
        self.master_bin = _bin("KVPOOL_MASTER_BIN")
        self.cli_bin = _bin("KVPOOL_CLI_BIN")
        self.master = Proc([self.master_bin, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
                            "--log-level", "error", *master_security_args(), *master_args])
        self.addr = self.master.ready
        self.segments = []
        try:
            for size in segments:
                self.add_segment(size)
        except Exception:
            self.close()
            raise

    def add_segment(self, size="64MiB"):
        s = Proc([self.cli_bin, "--master", self.addr, "serve", "--segment-size", size,
                  "--ready-fd", "{fd}"])
        self.segments.append(s)
        return s

    def close(self):
        """Stop everything (segments first); the exit statuses that were not 0."""
        return stop_all(self.segments + [self.master])


def _pool(request, **kw):
    pool = Pool(**kw)

    def fin():
        bad = pool.close()
        assert not bad, f"children exited non-zero: {bad}"

    request.addfinalizer(fin)
    return pool


@pytest.fixture(scope="module")
def pool(request):
    """A master and one 64 MiB segment, shared by a test module."""
    return _pool(request)


@pytest.fixture
def fresh_pool(request):
    """A pool of this test's own (for remove_all, full pools, ...)."""
    return _pool(request)


@pytest.fixture
def make_pool(request):
    """make_pool(segments=(...), master_args=(...)) -> a pool of this test's own."""
    return lambda **kw: _pool(request, **kw)


@pytest.fixture
def client(pool):
    with kvpool.Client(pool.addr) as c:
        yield c


@pytest.fixture
def store(pool):
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "auto", "", pool.addr) == 0
    yield s
    s.close()


@pytest.fixture
def prefix():
    """A key prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}@"
