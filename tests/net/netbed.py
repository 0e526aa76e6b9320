"""A test bed of hosts in network namespaces (issue 27).

NetBed(n) makes n network namespaces ("hosts") on one bridge of the root namespace, each
with its own address on a private /24 that only this bed's links carry, and starts
processes in them (`ip netns exec`: the process we get the PID of is the program itself).
It cuts and heals links with nftables rules inside the hosts (both ways, or one way),
and stops what it started by PID. close() (also on a failed test: use it as a context
manager or a fixture) kills every process it started, then deletes the veths, the bridge
and the namespaces.

What a link can be made to do besides being cut, here: lose packets at random (lossy(),
lossy_all(): an nftables rule, `numgen random mod 100 < pct drop`, each way); and delay
the TCP connections a host opens, with jitter if asked (delay(): they go through a
delaying proxy of our own in that host, tests/net/netdelay.c, which holds every chunk a
fixed time plus a uniformly random extra in [0, jitter], never releasing a chunk before
the one ahead of it, so each stream stays in order). This machine kind's kernel has no
netem (../shared/notes/network-namespaces.md), so neither uses it. Reordering is NOT
offered by this module: a stream proxy cannot reorder TCP segments (the kernels at both
ends hand the bytes over in order), and these nftables rules drop or pass packets, they
never hold one back. Packet-level delay, jitter, reordering and loss are
tests/net/netqueue.c's, through NFQUEUE (queue_link() in tests/net/test_net.py).

Needs root, iproute2 and nftables. Names carry this process's PID, so two beds of two
test processes do not meet; the subnet is 10.252.<k>.0/24 with k from the PID as well.
"""

import os
import signal
import subprocess
import time


# Local ports no outgoing connection in a host may take: those the scenarios listen on
# (etcd client and peer, the masters' HTTP, the masters' rpc ports 50050 + i).
RESERVED_PORTS = "2379-2380,9100,50050-50059"


def _run(*argv, check=True, input=None):
    r = subprocess.run(argv, input=input, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


def available():
    """(True, "") when this process can make a bed, else (False, why)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    for tool in ("ip", "nft"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            return False, f"{tool} is not installed (iproute2, nftables)"
    return True, ""


class Host:
    def __init__(self, bed, i):
        self.bed = bed
        self.i = i
        self.name = f"{bed.tag}h{i}"
        self.addr = f"10.252.{bed.net}.{i + 1}"
        self.veth = f"{bed.tag}v{i}"

    def argv(self, argv):
        return ["ip", "netns", "exec", self.name] + list(argv)

    def run(self, argv, **kw):
        """Run argv in this host to its end (subprocess.run, text, output captured)."""
        return subprocess.run(self.argv(argv), capture_output=True, text=True, **kw)

    def __repr__(self):
        return f"<{self.name} {self.addr}>"


class NetBed:
    def __init__(self, n):
        ok, why = available()
        if not ok:
            raise RuntimeError(why)
        pid = os.getpid()
        self.tag = f"kn{pid % 100000}"  # interface names stay under 15 characters
        self.net = 1 + pid % 250
        self.bridge = f"{self.tag}br"
        self.hosts = []
        self.procs = []  # every Popen we started, killed by PID at close
        self.cuts = set()  # (from host index, to host index): packets from -> to dropped
        self.loss = {}  # (from host index, to host index): percent of its packets dropped
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "link", "set", self.bridge, "up")
            for i in range(n):
                h = Host(self, i)
                _run("ip", "netns", "add", h.name)
                self.hosts.append(h)
                _run("ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0",
                     "netns", h.name)
                _run("ip", "link", "set", h.veth, "master", self.bridge)
                _run("ip", "link", "set", h.veth, "up")
                _run("ip", "netns", "exec", h.name, "ip", "addr", "add", f"{h.addr}/24",
                     "dev", "eth0")
                _run("ip", "netns", "exec", h.name, "ip", "link", "set", "eth0", "up")
                _run("ip", "netns", "exec", h.name, "ip", "link", "set", "lo", "up")
                # the fixed ports the scenarios listen on (etcd, the masters' rpc and HTTP)
                # are never handed out as a connection's local port (one was: an etcd
                # member's connection to a peer took 50052 before its host's master bound it)
                _run("ip", "netns", "exec", h.name, "sh", "-c",
                     f"echo {RESERVED_PORTS} > /proc/sys/net/ipv4/ip_local_reserved_ports")
                self._rules(h)
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- processes ----

    def start(self, host, argv, **popen):
        """Start argv in host; the Popen is killed by its PID at close()."""
        p = subprocess.Popen(host.argv(argv), **popen)
        self.procs.append(p)
        return p

    def stop(self, p, sig=signal.SIGTERM, timeout=10.0):
        """Signal one process we started and reap it; its exit status (None: it would not
        die even of SIGKILL within timeout)."""
        if p.poll() is None:
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            try:
                return p.wait(timeout)
            except subprocess.TimeoutExpired:
                return None

    # ---- links ----

    def _rules(self, h):
        """Write host h's nftables table from self.cuts: what h sends to a host it is cut
        from, and what it gets from a host cut from it, is dropped."""
        lines = [f"table inet kvpnet {{",
                 "  chain input { type filter hook input priority 0; policy accept;"]
        lines += [f"    ip saddr {self.hosts[a].addr} drop;" for a, b in sorted(self.cuts)
                  if b == h.i]
        lines += ["  }", "  chain output { type filter hook output priority 0; policy accept;"]
        lines += [f"    ip daddr {self.hosts[b].addr} drop;" for a, b in sorted(self.cuts)
                  if a == h.i]
        # a lossy link: each packet h sends to b dropped with probability pct / 100
        lines += [f"    ip daddr {self.hosts[b].addr} numgen random mod 100 < {pct} drop;"
                  for (a, b), pct in sorted(self.loss.items()) if a == h.i]
        lines += ["  }", "}"]
        # replace the table whole: add (so that delete finds one), delete, write anew
        script = "add table inet kvpnet\ndelete table inet kvpnet\n" + "\n".join(lines) + "\n"
        _run("ip", "netns", "exec", h.name, "nft", "-f", "-", input=script)

    def cut(self, a, b, oneway=False):
        """Drop what a sends to b (and, unless oneway, what b sends to a)."""
        pairs = {(a.i, b.i)} if oneway else {(a.i, b.i), (b.i, a.i)}
        self.cuts |= pairs
        self._rules(a)
        self._rules(b)

    def rto_min(self, value):
        """Set the bed's route's minimum TCP retransmission timeout in every host (e.g.
        "10ms"; Linux's default is 200 ms): what an operator can do on a lossy fabric."""
        for h in self.hosts:
            _run("ip", "netns", "exec", h.name, "ip", "route", "change",
                 f"10.252.{self.net}.0/24", "dev", "eth0", "proto", "kernel", "scope", "link",
                 "src", h.addr, "rto_min", value)

    def delay(self, h, us, netdelay, to=None, jitter_us=0):
        """Add us microseconds each way to every TCP connection host h opens to the bed's
        other hosts (to: a list of hosts, those only; the round trip grows by 2 x us), plus
        with jitter_us a uniformly random extra in [0, jitter_us] drawn for every chunk
        (each direction its own draws: the round trip grows by 2 x us to 2 x (us +
        jitter_us)); a chunk is never released before the one ahead of it, so a stream stays
        in order (a chunk that drew less waits behind one that drew more). h's new
        connections are redirected (nftables, nat output) to a netdelay proxy in h (the
        program at path netdelay), which forwards them with every chunk held so; its own
        connections carry mark 42, which the rule lets through. Connections opened before
        are not delayed; a second call replaces the proxy. 0 still goes through the proxy
        (its copy's own cost)."""
        old = getattr(h, "delay_proxy", None)
        if old is not None:
            self.stop(old, signal.SIGKILL)
        argv = [netdelay, "proxy", "0", str(int(us)), "42"]
        if jitter_us:
            argv.append(str(int(jitter_us)))
        p = self.start(h, argv, stdout=subprocess.PIPE, text=True)
        port = int(p.stdout.readline())
        h.delay_proxy = p
        dests = [f"10.252.{self.net}.0/24"] if to is None else [x.addr for x in to]
        rules = "".join(f"    ip daddr {d} meta mark != 42 meta l4proto tcp redirect to :{port};\n"
                        for d in dests)
        script = ("add table ip kvpdelay\ndelete table ip kvpdelay\n"
                  "table ip kvpdelay {\n"
                  "  chain out { type nat hook output priority -100; policy accept;\n"
                  f"{rules}  }}\n}}\n")
        _run("ip", "netns", "exec", h.name, "nft", "-f", "-", input=script)
        return port

    def lossy(self, a, b, pct):
        """Drop pct % of the packets a sends to b and b sends to a, at random (an nftables
        numgen rule: netem is not available here); 0 ends it."""
        assert 0 <= pct < 100 and pct == int(pct)
        for pair in ((a.i, b.i), (b.i, a.i)):
            if pct:
                self.loss[pair] = int(pct)
            else:
                self.loss.pop(pair, None)
        self._rules(a)
        self._rules(b)

    def lossy_all(self, pct, hosts=None):
        """lossy(a, b, pct) for every pair of hosts (default: all of the bed's), each host's
        rules written once (36 pairs of 9 hosts in 9 nft runs, not 72)."""
        assert 0 <= pct < 100 and pct == int(pct)
        hosts = self.hosts if hosts is None else hosts
        for a in hosts:
            for b in hosts:
                if a is not b:
                    if pct:
                        self.loss[(a.i, b.i)] = int(pct)
                    else:
                        self.loss.pop((a.i, b.i), None)
        for h in hosts:
            self._rules(h)

    def isolate(self, a):
        """Cut a from every other host, both ways."""
        for h in self.hosts:
            if h is not a:
                self.cuts |= {(a.i, h.i), (h.i, a.i)}
        for h in self.hosts:
            self._rules(h)

    def heal(self, a=None, b=None):
        """Heal the link a-b both ways (no arguments: every link)."""
        if a is None:
            self.cuts.clear()
            self.loss.clear()
        else:
            self.cuts -= {(a.i, b.i), (b.i, a.i)}
        for h in self.hosts:
            self._rules(h)

    # ---- the end ----

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []
        for h in self.hosts:
            _run("ip", "link", "del", h.veth, check=False)
            _run("ip", "netns", "del", h.name, check=False)
        self.hosts = []
        _run("ip", "link", "del", self.bridge, check=False)


def wait_for(pred, timeout, what, step=0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)
