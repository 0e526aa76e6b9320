"""The TCP congestion control of data connections (KVPOOL_TCP_CONGESTION, docs/operations.md
"TCP congestion control of data connections").

A segment's data connections, at the owner (`kvpool serve`) and at the client, run the
algorithm the variable names; "system" leaves the system's; unset, the system's unless it
is BBR, which becomes cubic: every connection here is on one host (loopback; between
hosts BBR stays: tests/net/test_net.py). The connections to the master keep the system's. Each case
starts a real master and `kvpool serve`, and a client in a process of its own (the setting
is read once per process) that puts and gets over tcp, byte-exact, and reports, while its
connections are open, each of its sockets' algorithm as the kernel has it (`ss -tinp`);
the owner's are read the same way.
"""
import inspect
import json
import os
import subprocess
import sys
import tempfile

import pytest

from conftest import Proc, _bin, master_security_args

CLIENT = r"""
import json, os, subprocess, sys
import kvpool
kv = {"cc-%d" % i: os.urandom(64 * 1024) for i in range(8)}
keys = list(kv)
with kvpool.Client(sys.argv[1], transport="tcp") as c:
    assert c.batch_put(keys, [kv[k] for k in keys]) == [0] * len(keys)
    assert c.batch_get(keys) == [kv[k] for k in keys]
    print(json.dumps(sockets(os.getpid())), flush=True)
    sys.stdin.readline()  # connections held open while the test reads the owner's
"""


def sockets(pid):
    """[(local port, peer port, algorithm)] of pid's established tcp sockets (ss -tinp)."""
    out = subprocess.run(["ss", "-tinpH", "state", "established"], check=True,
                         capture_output=True, text=True).stdout
    found, cur = [], None
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # a socket: recv-q send-q local peer users:((...))
            f = line.split()
            cur = None
            if f"pid={pid}," in line:
                cur = (int(f[2].rsplit(":", 1)[1]), int(f[3].rsplit(":", 1)[1]))
        elif cur is not None:  # its details, the algorithm first
            found.append((*cur, line.split()[0]))
            cur = None
    return found


def system_cc():
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        return f.read().strip()


def run_case(setting):
    """A master, a segment and a client with KVPOOL_TCP_CONGESTION=setting (None: unset):
    the owner's and the client's sockets, each split into (to the master, data)."""
    env = dict(os.environ, KVPOOL_LOG_LEVEL="warn")  # the library's warnings on stderr
    env.pop("KVPOOL_TCP_CONGESTION", None)
    if setting is not None:
        env["KVPOOL_TCP_CONGESTION"] = setting
    master = Proc([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
                   "--log-level", "error", *master_security_args()])
    procs = [master]
    try:
        mport = int(master.ready.rsplit(":", 1)[1])
        seg_err = tempfile.TemporaryFile(mode="w+")
        seg = Proc([_bin("KVPOOL_CLI_BIN"), "--master", master.ready, "serve",
                    "--segment-size", "64MiB", "--ready-fd", "{fd}"], env=env, stderr=seg_err)
        procs.insert(0, seg)
        c = subprocess.Popen([sys.executable, "-c", inspect.getsource(sockets) + CLIENT,
                              master.ready], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = c.stdout.readline()
            owner = sockets(seg.pid)  # while the client's connections are open
            out, err = c.communicate("\n", timeout=60)
        finally:
            if c.poll() is None:
                c.kill()
                c.wait()
        assert c.returncode == 0 and line, err[-2000:]
        client = json.loads(line)
    finally:
        for p in procs:
            p.stop()
    seg_err.seek(0)
    err += seg_err.read()

    def split(socks):
        return ([cc for _, peer, cc in socks if peer == mport],
                [cc for _, peer, cc in socks if peer != mport])
    return split(owner), split(client), err


def other_than(name):
    return "cubic" if name == "reno" else "reno"


@pytest.mark.parametrize("setting", ["named", "system", None])
def test_data_connections_run_the_algorithm_set(setting):
    sys_cc = system_cc()
    if setting == "named":
        setting = other_than(sys_cc)  # one the system does not run: the change shows
        want = setting
    elif setting == "system":
        want = sys_cc
    else:
        want = "cubic" if sys_cc.startswith("bbr") else sys_cc
    (owner_m, owner_d), (client_m, client_d), _ = run_case(setting)
    assert owner_d and client_d, (owner_d, client_d)  # the put and get went over tcp
    assert set(owner_d) == {want}, owner_d  # the owner's end (accepted)
    assert set(client_d) == {want}, client_d  # the client's end (connected)
    assert owner_m and set(owner_m) == {sys_cc}, owner_m  # to the master: untouched
    assert client_m and set(client_m) == {sys_cc}, client_m


def test_a_refused_algorithm_leaves_the_connections_working():
    """A name the kernel has no such algorithm for: the put and get still go through, the
    data connections keep the system's, and each process says why, once (several
    connections each)."""
    sys_cc = system_cc()
    (_, owner_d), (_, client_d), err = run_case("no-such-cc")
    assert owner_d and client_d
    assert set(owner_d) == {sys_cc} and set(client_d) == {sys_cc}, (owner_d, client_d)
    # once each, the client and the owner
    assert err.count('refused congestion control "no-such-cc"') == 2, err[-2000:]
