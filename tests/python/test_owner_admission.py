"""What a stranger can hold of a segment owner's data servers (issue 45, row 9): idle
connections to the owner's tcp data port and to its shm socket (the Unix socket of the
shm hand-off), no HELLO, no byte.

Before: 1 100 idle tcp connections and 300 on the shm socket took the owner from 5 to
1 020 threads and 1 023 descriptors; honest gets timed out, and still failed once the
stranger had closed everything. Now each data server caps connections in all, per peer
(an address; a uid on the shm socket) and, smaller, those not yet authenticated (no HELLO
proven; without data grants, no request header yet), closes an unauthenticated one at the
handshake deadline, and takes at most a share of the descriptor limit.

Real processes on 127.0.0.1: kvpool-master and `kvpool serve` with small caps set by its
flags (--data-max-conns 64, --data-max-conns-per-peer 24, --data-max-unauth 32: 8 per
address, --data-handshake-timeout 2), or with a descriptor limit of 160 (ulimit -n). The
stranger connects from 127.0.0.2 (and 127.0.0.3...: an address each, all of this host),
the honest client from 127.0.0.1; on the shm socket the stranger runs as nobody when we
are root (CI), else as our own user. Checked during the flood and after it closed: the
honest client's put and get answer (a new client too: new connections, a new HELLO), the
owner's threads, descriptors and RSS stay bounded, the stranger's connections are closed
at once past the caps and the held ones at the deadline, and every closing is counted on
the owner's /metrics (kvpool_connections_refused_total{reason=...}). In the TLS pass
(KVPOOL_TEST_TLS_DIR) the master has TLS and an ACL and the owner data grants: the
honest client proves its principal in a HELLO.
"""
import inspect
import os
import re
import select
import socket
import struct
import subprocess
import sys
import time
import uuid

import pytest

import kvpool
from conftest import (TLS_DIR, Proc, _bin, free_port, http_get, master_security_args, metric,
                      shm_name, stop_all)

CAPS = ["--data-max-conns", "64", "--data-max-conns-per-peer", "24",
        "--data-max-unauth", "32", "--data-handshake-timeout", "2"]
HANDSHAKE_S = 2.0
UNAUTH_PER_PEER = 8  # a quarter of --data-max-unauth
NOBODY = 65534


class Owner:
    """A master and one `kvpool serve` owner (its data port and /metrics known)."""

    def __init__(self, serve_args=(), nofile=None, ssd=None):
        self.master = Proc([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0",
                            "--ready-fd", "{fd}", "--log-level", "error", "--lease-ttl", "0",
                            *master_security_args()])
        self.addr = self.master.ready
        self.data_port = free_port()
        # ssd: an SSD segment in that file, and no DRAM one
        seg = (["--segment-size", "32MiB"] if ssd is None else
               ["--segment-size", "0", "--ssd-path", str(ssd), "--ssd-size", "32MiB",
                "--ssd-buffered-io"])
        argv = [_bin("KVPOOL_CLI_BIN"), "--master", self.addr, "serve", *seg,
                "--data-host", "127.0.0.1",
                "--data-port", str(self.data_port), "--http-listen", "127.0.0.1:0",
                "--ready-fd", "{fd}", *serve_args]
        if nofile is not None:  # soft and hard: serve cannot raise it
            argv = ["sh", "-c", f'ulimit -n {nofile} && exec "$@"', "sh", *argv]
        try:
            self.serve = Proc(argv, lines=2)
        except BaseException:
            self.master.stop()
            raise
        self.http_port = int(self.serve.lines[1].rsplit(":", 1)[1])

    @property
    def pid(self):
        return self.serve.pid

    def _status(self, field):
        """A number of /proc/PID/status (Threads, VmRSS in KiB)."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise AssertionError(f"no {field} line")

    def threads(self):
        return self._status("Threads")

    def fds(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss_kib(self):
        return self._status("VmRSS")

    def refused(self, reason):
        status, text = http_get(self.http_port, "/metrics")
        assert status == 200, text
        v = metric(text, "kvpool_connections_refused_total", {"reason": reason})
        assert v is not None, f"no kvpool_connections_refused_total{{reason={reason!r}}}"
        return v

    def ssd_port(self):
        """The SSD segment's data port (its name on /metrics is HOST:PORT/ssd)."""
        status, text = http_get(self.http_port, "/metrics")
        assert status == 200, text
        m = re.search(r'kvpool_segment_capacity_bytes\{segment="127\.0\.0\.1:(\d+)/ssd"', text)
        assert m, "no SSD segment on the owner's /metrics"
        return int(m.group(1))

    def shm_name(self):
        """The abstract name of its shm socket."""
        return shm_name(self.pid)

    def close(self):
        return stop_all((self.serve, self.master))


@pytest.fixture
def owner(request):
    def make(**kw):
        o = Owner(**kw)

        def fin():
            assert not o.close()

        request.addfinalizer(fin)
        return o

    return make


def honest_roundtrip(owner, key, transport="tcp", timeout_s=10.0):
    """A new client's put and get of key (its own connections, HELLO in the TLS pass),
    each answered within timeout_s."""
    data = os.urandom(256 * 1024)
    with kvpool.Client(owner.addr, transport=transport) as c:
        t0 = time.monotonic()
        c.put(key, data)
        assert c.get(key) == data
        assert time.monotonic() - t0 < timeout_s
    return data


def idle_tcp(port, n, src="127.0.0.2"):
    """n connections to 127.0.0.1:port from src, nothing sent."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((src, 0))
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        socks.append(s)
    return socks


def closed(s):
    """Did the server close it (EOF or reset)?"""
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(1, socket.MSG_DONTWAIT) == b""
    except ConnectionResetError:
        return True
    except BlockingIOError:
        return False


def count_closed(socks, want, timeout_s):
    """How many of socks the server closed, waiting up to timeout_s for `want` of them."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [s for s in socks if not closed(s)]
        if len(socks) - len(left) >= want or time.monotonic() >= deadline:
            return len(socks) - len(left)
        select.select(left, [], [], 0.05)


def bounded(owner, threads0, fds0, held, cap=64):
    """The owner holds at most `held` connections of the stranger (a thread and a
    descriptor each) beside what it had (and the honest clients' few): at once, and always
    at most twice its cap in all (those it just closed, their threads on their way out)."""
    slack = 12

    def counts():
        return owner.threads() - threads0, owner.fds() - fds0

    extra = counts()
    assert max(extra) <= 2 * cap + slack, extra
    deadline = time.monotonic() + 3.0
    while max(extra) > held + slack and time.monotonic() < deadline:
        time.sleep(0.02)
        extra = counts()
    assert max(extra) <= held + slack, (extra, held)


def test_idle_tcp_flood_from_one_address(owner):
    o = owner(serve_args=CAPS)
    k = f"adm-tcp-{uuid.uuid4().hex[:8]}"
    honest_roundtrip(o, k + "-0")
    threads0, fds0, rss0 = o.threads(), o.fds(), o.rss_kib()
    before = {r: o.refused(r) for r in ("unauth_limit", "handshake_timeout")}
    with kvpool.Client(o.addr, transport="tcp") as old:  # connected before the flood
        data = os.urandom(64 * 1024)
        old.put(k + "-old", data)
        flood = idle_tcp(o.data_port, 300)
        try:
            # past the address's share, closed as they come, nothing read
            assert count_closed(flood, 300 - UNAUTH_PER_PEER, 1.0) >= 300 - UNAUTH_PER_PEER
            bounded(o, threads0, fds0, UNAUTH_PER_PEER)
            # the honest client is served meanwhile, old connections and new ones
            assert old.get(k + "-old") == data
            honest_roundtrip(o, k + "-1")
            # the held ones are closed at the handshake deadline, though never sent a byte
            assert count_closed(flood, len(flood), HANDSHAKE_S + 4) == len(flood)
            bounded(o, threads0, fds0, 0)
            honest_roundtrip(o, k + "-2")
        finally:
            for s in flood:
                s.close()
        # and after the stranger closed everything
        assert old.get(k + "-old") == data
    honest_roundtrip(o, k + "-3")
    bounded(o, threads0, fds0, 0)
    assert o.rss_kib() < rss0 + 64 * 1024
    assert o.refused("unauth_limit") - before["unauth_limit"] >= 300 - UNAUTH_PER_PEER - 2
    assert o.refused("handshake_timeout") - before["handshake_timeout"] >= UNAUTH_PER_PEER - 2


def accept_queue(port):
    """Connections to 127.0.0.1:port the kernel completed and the owner has not accepted yet
    (the listening socket's rx_queue in /proc/net/tcp)."""
    local = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1] == local and fields[3] == "0A":
                return int(fields[4].split(":")[1], 16)
    return 0


def flood_from_addresses(o, key, hosts, per_host, held, cap=64, during=lambda: None):
    """per_host idle connections from each 127.0.0.<host>: the owner holds at most `held`,
    the honest client is served (then `during` checks more), every one of the stranger's
    is closed by the handshake deadline, and once they are gone the owner is back. The
    honest client connects once the owner has taken every connection of the flood from its
    accept queue: without TLS it is unauthenticated until its first request is read, and a
    stranger's connection accepted after it would make it the oldest to make way."""
    threads0, fds0 = o.threads(), o.fds()
    flood = []
    try:
        for host in hosts:
            flood += idle_tcp(o.data_port, per_host, src=f"127.0.0.{host}")
        deadline = time.monotonic() + 5.0
        while accept_queue(o.data_port) > 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert accept_queue(o.data_port) == 0, "the owner did not take the flood in 5 s"
        bounded(o, threads0, fds0, held, cap=cap)
        honest_roundtrip(o, key + "-1")
        during()
        assert count_closed(flood, len(flood), HANDSHAKE_S + 4) == len(flood)
    finally:
        for s in flood:
            s.close()
    honest_roundtrip(o, key + "-2")
    bounded(o, threads0, fds0, 0, cap=cap)


def test_idle_tcp_flood_from_many_addresses(owner):
    """Each address within its share, together past the cap of unauthenticated connections
    (32): the oldest make way; an honest client's HELLO gets through."""
    o = owner(serve_args=CAPS)
    k = f"adm-many-{uuid.uuid4().hex[:8]}"
    honest_roundtrip(o, k + "-0")
    before = o.refused("unauth_limit")

    def made_way():  # 20 addresses x 8 = 160, 32 held
        assert o.refused("unauth_limit") - before >= 160 - 32 - 2

    flood_from_addresses(o, k, range(2, 22), UNAUTH_PER_PEER, 32, during=made_way)


# The stranger on the shm socket, in a process of its own (another uid): its helpers are
# this module's own (closed, count_closed), their source put before its main part.
FLOOD_UNIX_MAIN = r"""
name, n, want, wait_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + name)  # blocking: waits while the backlog is full
    socks.append(s)
print(count_closed(socks, want, 1.0), flush=True)  # past the caps: at once
sys.stdin.readline()  # then hold the rest until told, and see them go at the deadline
print(count_closed(socks, n, wait_s), flush=True)
"""


def flood_unix_script():
    return ("import select, socket, sys, time\n" + inspect.getsource(closed)
            + inspect.getsource(count_closed) + FLOOD_UNIX_MAIN)


def test_idle_shm_socket_flood(owner):
    o = owner(serve_args=CAPS)
    k = f"adm-shm-{uuid.uuid4().hex[:8]}"
    honest_roundtrip(o, k + "-0", transport="auto")
    threads0, fds0 = o.threads(), o.fds()
    before = {r: o.refused(r) for r in ("unauth_limit", "handshake_timeout")}
    # another local user (nobody) when we are root, else our own
    wrap = (["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
            if os.geteuid() == 0 else [])
    p = subprocess.Popen(wrap + [sys.executable, "-c", flood_unix_script(), o.shm_name(), "300",
                                 str(300 - UNAUTH_PER_PEER), str(HANDSHAKE_S + 4)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        # past the uid's share of unauthenticated ones, closed as they come
        assert int(p.stdout.readline()) >= 300 - UNAUTH_PER_PEER
        bounded(o, threads0, fds0, UNAUTH_PER_PEER)
        # served meanwhile: over shm (another uid's flood) or, refused there, over tcp
        honest_roundtrip(o, k + "-1", transport="auto")
        p.stdin.write("\n")
        p.stdin.flush()
        assert int(p.stdout.readline()) == 300  # the held ones too, at the deadline
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
    honest_roundtrip(o, k + "-2", transport="auto")
    bounded(o, threads0, fds0, 0)
    assert o.refused("unauth_limit") - before["unauth_limit"] >= 300 - UNAUTH_PER_PEER - 2
    assert o.refused("handshake_timeout") - before["handshake_timeout"] >= UNAUTH_PER_PEER - 2


def test_descriptor_limit_bounds_what_is_taken(owner):
    """With 160 descriptors (ulimit -n, soft and hard) the tcp data server takes 40
    connections at once (a quarter of them), the oldest unauthenticated one making way for
    a new one: a flood of 300 from 10 addresses cannot run the owner out of descriptors,
    and the honest client is served during and after it."""
    o = owner(serve_args=["--data-handshake-timeout", "2"], nofile=160)
    k = f"adm-nofile-{uuid.uuid4().hex[:8]}"
    honest_roundtrip(o, k + "-0")

    def room_left():
        assert o.fds() < 160 - 16

    flood_from_addresses(o, k, range(2, 12), 30, 40, cap=40, during=room_left)
    assert o.refused("resources") == 0  # never ran out


# ---- the SSD owner's data port (the untried surface) ----

DATA_MAGIC = 0x4450564B
OP_READ, OP_WRITE, OP_READV = 1, 2, 3
F_GRANT_SET = 0x2
GRANT_SET_MAX = 8192
ERR_PROTOCOL, ERR_SEGMENT_GONE, ERR_OUT_OF_RANGE, ERR_DENIED = -16, -19, -20, -38
FRAME_S = 2.0


def data_req(op, flags=0, segment_id=0, offset=0, length=0):
    """A 32-byte data-protocol request header (docs/protocol.md)."""
    return struct.pack("<IHHQQQ", DATA_MAGIC, op, flags, segment_id, offset, length)


def grant_set_hdr(count):
    """A grant set's 64-byte header claiming `count` extents (its MAC is never reached)."""
    return struct.pack("<BBHIQQQQQ16s", 1, 1, 0, count, 0, 0, 0, 0, 0, bytes(16))


def stranger(port, host, first=b""):
    s = socket.socket()
    s.bind((f"127.0.0.{host}", 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    if first:
        s.sendall(first)
    return s


def answer_then_closed(s):
    """The owner's answer to what s sent (its status), and then the end of the stream."""
    s.settimeout(5)
    got = b""
    while len(got) < 16:
        b = s.recv(16 - len(got))
        assert b, f"closed with no answer ({len(got)} bytes)"
        got += b
    magic, status, length = struct.unpack("<IiQ", got)
    assert magic == DATA_MAGIC and length == 0, (magic, status, length)
    try:
        assert s.recv(1) == b""
    except ConnectionResetError:
        pass
    return status


def trickle(socks, every_s, limit_s):
    """A byte to each of socks every every_s until the owner closed them all (or limit_s):
    the seconds it took."""
    t0 = time.monotonic()
    live = list(socks)
    while live and time.monotonic() - t0 < limit_s:
        for s in list(live):
            try:
                s.send(b"\0")
            except OSError:
                live.remove(s)
                continue
            if closed(s):
                live.remove(s)
        select.select(live, [], [], every_s)
    assert not live, f"{len(live)} trickled connections still open after {limit_s} s"
    return time.monotonic() - t0


def test_ssd_owner_data_port_hostile(owner, tmp_path):
    """An SSD segment's data server (the same loop over the file backend): a flood of idle
    connections, frames trickled a byte at a time (one claiming 2^62 bytes), absurd vector
    and grant-set counts, an absurd write length. The victim's SSD-tier objects stay exact
    and its gets answered within 10 s throughout, the owner's threads, descriptors and RSS
    stay bounded, and the closings are counted on its /metrics."""
    o = owner(serve_args=CAPS + ["--data-frame-timeout", str(int(FRAME_S))],
              ssd=tmp_path / "seg.ssd")
    port = o.ssd_port()
    k = f"adm-ssd-{uuid.uuid4().hex[:8]}"
    # the trickled frames: never admitted with data grants on (no HELLO), so the handshake
    # deadline cuts them; without grants a whole header admits, and the frame's does
    trickle_reason = "handshake_timeout" if TLS_DIR else "frame_timeout"
    reasons = ("unauth_limit", "handshake_timeout", "frame_timeout", "grant")
    with kvpool.Client(o.addr, transport="tcp") as victim:
        objs = {f"{k}-{i}": os.urandom(n) for i, n in enumerate((4096, 100_003, 1 << 20))}
        for key, data in objs.items():
            victim.put(key, data, medium="ssd")

        def victim_served():
            for key, data in objs.items():
                t0 = time.monotonic()
                assert victim.get(key) == data
                assert time.monotonic() - t0 < 10.0

        victim_served()
        threads0, fds0, rss0 = o.threads(), o.fds(), o.rss_kib()
        before = {r: o.refused(r) for r in reasons}

        # idle: past the address's share closed at once, the rest at the handshake deadline
        flood = idle_tcp(port, 300)
        try:
            assert count_closed(flood, 300 - UNAUTH_PER_PEER, 1.0) >= 300 - UNAUTH_PER_PEER
            bounded(o, threads0, fds0, UNAUTH_PER_PEER)
            victim_served()
            assert count_closed(flood, len(flood), HANDSHAKE_S + 4) == len(flood)
        finally:
            for s in flood:
                s.close()
        victim_served()

        # trickled, each from an address of its own: a READV of 256 entries whose header
        # claims 2^62 bytes (a claim that must not buy time), a READV of one, and a grant
        # set announcing the most extents, its header whole, then a byte at a time
        tricklers = [
            stranger(port, 3, data_req(OP_READV, offset=256, length=1 << 62)),
            stranger(port, 4, data_req(OP_READV, offset=1, length=4096)),
            stranger(port, 5, data_req(OP_READ, F_GRANT_SET, length=4096)
                     + grant_set_hdr(GRANT_SET_MAX)),
        ]
        try:
            took = trickle(tricklers, 0.2, FRAME_S + 6)
            assert took < FRAME_S + 4, took
        finally:
            for s in tricklers:
                s.close()
        victim_served()

        # absurd counts and sizes: answered and closed, nothing allocated for the claim
        s = stranger(port, 6, data_req(OP_READV, offset=1 << 40, length=4096))
        assert answer_then_closed(s) == ERR_PROTOCOL
        s.close()
        s = stranger(port, 7, data_req(OP_READ, F_GRANT_SET, length=4096)
                     + grant_set_hdr(0xFFFFFFFF))
        assert answer_then_closed(s) == ERR_DENIED  # counted: grant
        s.close()
        s = stranger(port, 8, data_req(OP_WRITE, offset=0, length=1 << 62))
        assert answer_then_closed(s) in (ERR_SEGMENT_GONE, ERR_OUT_OF_RANGE, ERR_DENIED)
        s.close()

        victim_served()
        bounded(o, threads0, fds0, 0)
        assert o.rss_kib() < rss0 + 64 * 1024
        after = {r: o.refused(r) - before[r] for r in reasons}
        assert after["unauth_limit"] >= 300 - UNAUTH_PER_PEER - 2, after
        assert after["handshake_timeout"] >= UNAUTH_PER_PEER - 2, after
        assert after[trickle_reason] >= len(tricklers), after
        assert after["grant"] >= 1, after
    with kvpool.Client(o.addr, transport="tcp") as c:  # new connections, a new HELLO
        data = os.urandom(256 * 1024)
        c.put(k + "-new", data, medium="ssd")
        assert c.get(k + "-new") == data
