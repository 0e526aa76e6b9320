"""mooncake.engine.TransferEngine on kvpool (issue 48): vLLM MooncakeConnector's call
sequence between two real processes, prefill and decode (tests/python/te_peer.py):
initialize(host, "P2PHANDSHAKE", protocol, ""), get_rpc_port(), batch_register_memory of
KV caches of vLLM's host layout, then the prefill's batch_transfer_sync_write of block
lists as merged contiguous runs into the decode's cache; byte-exact on tcp and shm. And
what a target refuses: ranges it did not register (its bytes intact, counted), peers of
another host in protected mode (network namespaces, as root); a decode that vanished or
stopped fails the transfer in bounded time."""

import json
import os
import pathlib
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

from kvpool import _kvpool
from mooncake import engine as engine_mod
from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "te_peer.py")
LAYERS, BLOCKS, BLOCK_BYTES, SEED = 4, 64, 16384, 1234
S = _kvpool.STATUS
CRED_VARS = ("KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_TLS_CRL",
             "KVPOOL_TE_PEERS", "KVPOOL_TOKEN")


class Peer:
    """A te_peer.py process, killed by its PID at the end."""

    def __init__(self, role, proto, host="127.0.0.1", env=None, argv_prefix=()):
        # credentials only where a test gives them (the suite's TLS pass sets them for all)
        e = {k: v for k, v in os.environ.items() if k not in CRED_VARS}
        e.update(env or {})
        self.p = subprocess.Popen(
            list(argv_prefix) + [sys.executable, PEER, role, proto, host],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=e)
        self.info = json.loads(self.p.stdout.readline())
        assert "error" not in self.info, self.info

    def ask(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def kill(self, sig=signal.SIGKILL):
        if self.p.poll() is None:
            os.kill(self.p.pid, sig)
        if sig == signal.SIGKILL:
            self.p.wait(10)

    def close(self):
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGCONT)
            os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait(10)


@pytest.fixture
def peers():
    made = []

    def make(*a, **kw):
        p = Peer(*a, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def prefill_cache():
    return np.stack([np.random.default_rng(SEED + l).integers(0, 256, (2, BLOCKS, BLOCK_BYTES),
                                                              np.uint8) for l in range(LAYERS)])


def expected(pblocks, dblocks):
    want = np.full((LAYERS, 2, BLOCKS, BLOCK_BYTES), 0xEE, np.uint8)
    src = prefill_cache()
    for p, d in zip(pblocks, dblocks):
        want[:, :, d] = src[:, :, p]
    return want


def dump(decode, tmp_path, name="dump.npy"):
    path = str(tmp_path / name)
    assert decode.ask(op="dump", path=path) == {"ok": True}
    return np.load(path)


def shm_conns(port):
    """Sockets of /proc/net/unix bound to the engine's shm name (its listener and the
    connections it accepted)."""
    with open("/proc/net/unix") as f:
        return sum(1 for line in f if line.rstrip().endswith(f"@kvpool-te-{port}"))


# vLLM hands over scattered block ids; runs of consecutive ids on both sides merge.
def leases_here():
    """Does this host let an engine grant standing leases (client/te/te_lease.h)? Not under
    Yama's ptrace_scope above 0."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip() or 1) == 0
    except FileNotFoundError:
        return True


LEASES_HERE = leases_here()

PBLOCKS = [0, 1, 2, 3, 10, 11, 12, 30, 40, 41, 42, 43, 44, 45, 46, 47, 63]
DBLOCKS = [5, 6, 7, 8, 20, 21, 9, 0, 48, 49, 50, 51, 52, 53, 54, 55, 1]


@pytest.mark.parametrize("proto", ["tcp", "shm", "auto"])
def test_prefill_writes_decode_kv_cache_byte_exact(peers, tmp_path, proto):
    decode = peers("decode", proto)
    prefill = peers("prefill", proto)
    port = decode.info["port"]
    target = f"127.0.0.1:{port}"
    before = shm_conns(port)
    r = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"],
                    pblocks=PBLOCKS, dblocks=DBLOCKS)
    assert (r["rc"], r["status"]) == (0, 0), r
    assert r["runs"] == LAYERS * 2 * 6  # 6 merged runs per layer and K/V
    got = dump(decode, tmp_path)
    want = expected(PBLOCKS, DBLOCKS)
    assert np.array_equal(got, want)
    if proto == "tcp":
        assert shm_conns(port) == before  # the shm socket carried nothing
    else:
        assert shm_conns(port) > before  # the prefill's streams came on the Unix socket
    pm = prefill.ask(op="metrics")["peers"][target]
    assert pm == {"route": "tcp" if proto == "tcp" else "shm-cma", "transfers": LAYERS * 2 * 6,
                  "bytes": len(PBLOCKS) * 2 * LAYERS * BLOCK_BYTES, "failures": 0}, pm
    m = decode.ask(op="metrics")
    assert m["served_writes"] >= 1 and m["served_write_bytes"] == len(PBLOCKS) * 2 * LAYERS * BLOCK_BYTES
    assert m["refused_range"] == 0
    # and read back: the prefill's batch_transfer_sync_read of the same runs gives the same
    # bytes (its own blocks, overwritten with what it wrote: unchanged)
    r = prefill.ask(op="read", target=target, remote_ptrs=decode.info["ptrs"],
                    pblocks=PBLOCKS, dblocks=DBLOCKS)
    assert (r["rc"], r["status"]) == (0, 0), r


def test_large_runs_and_many_ranges(peers, tmp_path):
    """Every block, one run per layer and K/V of 1 MiB, then every block on its own (512
    ranges in one batch: past the engine's 256 per run)."""
    decode = peers("decode", "tcp")
    prefill = peers("prefill", "tcp")
    target = f"127.0.0.1:{decode.info['port']}"
    allb = list(range(BLOCKS))
    r = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"], pblocks=allb,
                    dblocks=allb)
    assert (r["rc"], r["runs"]) == (0, LAYERS * 2), r
    assert np.array_equal(dump(decode, tmp_path), prefill_cache())
    rev = allb[::-1]  # nothing merges: 64 ranges per layer and K/V
    r = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"], pblocks=allb,
                    dblocks=rev)
    assert (r["rc"], r["runs"]) == (0, LAYERS * 2 * BLOCKS), r
    assert np.array_equal(dump(decode, tmp_path), prefill_cache()[:, :, ::-1])


@pytest.mark.parametrize("proto", ["tcp", "shm"])
def test_write_outside_registered_memory_is_refused_bytes_intact(peers, tmp_path, proto):
    decode = peers("decode", proto)
    prefill = peers("prefill", proto)
    target = f"127.0.0.1:{decode.info['port']}"
    ptrs, sizes = decode.info["ptrs"], decode.info["sizes"]
    r = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[0], dblocks=[0])
    assert r["rc"] == 0
    before = dump(decode, tmp_path, "before.npy")
    # past the end of a layer's tensor (its last 100 bytes and 3996 beyond), and before it
    for remote in (ptrs[0] + sizes[0] - 100, ptrs[0] - 4096, 4096):
        r = prefill.ask(op="raw", target=target, remote=remote, length=4096, write=True)
        assert (r["rc"], r["status"]) == (-1, S["KVP_ERR_OUT_OF_RANGE"]), r
        r = prefill.ask(op="raw", target=target, remote=remote, length=4096, write=False)
        assert (r["rc"], r["status"]) == (-1, S["KVP_ERR_OUT_OF_RANGE"]), r
    assert np.array_equal(dump(decode, tmp_path, "after.npy"), before)
    assert decode.ask(op="metrics")["refused_range"] == 6
    # the decode keeps serving
    r = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[1], dblocks=[2])
    assert r["rc"] == 0


@pytest.mark.parametrize("proto", ["tcp", "shm"])
def test_write_to_a_vanished_decode_fails_fast(peers, proto):
    """A decode killed after a first write: the next fails fast with a clear code (shm: the
    prefill sees the decode's socket closed before it would copy under its lease, so never
    into a process that took the dead one's pid)."""
    decode = peers("decode", proto)
    prefill = peers("prefill", proto)
    target = f"127.0.0.1:{decode.info['port']}"
    ptrs = decode.info["ptrs"]
    assert prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[0], dblocks=[0])["rc"] == 0
    decode.kill()
    r = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[0, 1], dblocks=[3, 4])
    assert r["rc"] == -1 and r["status"] in (S["KVP_ERR_CONNECT"], S["KVP_ERR_IO"]), r
    assert r["secs"] < 5, r
    pm = prefill.ask(op="metrics")["peers"][target]
    assert pm["transfers"] == LAYERS * 2 and pm["failures"] == LAYERS * 2, pm  # one run each


def test_write_to_a_stopped_decode_times_out(peers):
    """A decode that stops answering (SIGSTOP) mid-session: the write fails within the
    engine's timeout (KVPOOL_TE_TIMEOUT_MS), never hangs."""
    decode = peers("decode", "tcp")
    prefill = peers("prefill", "tcp", env={"KVPOOL_TE_TIMEOUT_MS": "1500"})
    target = f"127.0.0.1:{decode.info['port']}"
    ptrs = decode.info["ptrs"]
    assert prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[0], dblocks=[0])["rc"] == 0
    decode.kill(signal.SIGSTOP)
    allb = list(range(BLOCKS))  # 8 MiB: more than the socket buffers hold
    r = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=allb, dblocks=allb)
    assert r["rc"] == -1 and r["status"] in (S["KVP_ERR_TIMEOUT"], S["KVP_ERR_IO"]), r
    assert 1.0 < r["secs"] < 10, r


def test_in_process_api_async_and_buffers():
    """The rest of the API in one process: managed buffers, single transfers, async batches
    and their status, get_first_buffer_address, TransferOpcode/TransferNotify."""
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "auto", "") == 0
    target = f"127.0.0.1:{a.get_rpc_port()}"
    dst = a.allocate_managed_buffer(1 << 20)
    src = b.allocate_managed_buffer(1 << 20)
    assert dst and src
    assert a.get_first_buffer_address(target) == dst
    assert b.get_first_buffer_address(target) == dst  # asked over the wire (REGIONS)
    assert b.send_probe(target) == 0
    payload = bytes(range(256)) * 4096
    assert b.write_bytes_to_buffer(src, payload, len(payload)) == 0
    assert b.transfer_sync_write(target, src, dst, 1 << 20) == 0
    assert a.read_bytes_from_buffer(dst, 1 << 20) == payload
    assert b.transfer_sync(target, src + 5, dst + 7, 1000, TransferOpcode.READ) == 0
    assert b.read_bytes_from_buffer(src + 5, 1000) == payload[7:1007]
    ids = [b.batch_transfer_async_write(target, [src], [dst + 4096 * i], [4096]) for i in range(4)]
    assert all(ids) and len(set(ids)) == 4
    assert b.get_batch_transfer_status(ids) == 0
    bid = b.transfer_submit_write(target, src, dst, 4096)
    assert bid
    for _ in range(1000):
        st = b.transfer_check_status(bid)
        if st != 0:
            break
        time.sleep(0.01)
    assert st == 1
    bad = b.batch_transfer_async_write(target, [src], [dst + (1 << 20) - 10], [4096])
    assert bad and b.get_batch_transfer_status([bad]) == -1
    assert b.last_status == S["KVP_ERR_OUT_OF_RANGE"]
    assert b.batch_transfer_sync_write(target, [src, src], [dst], [1, 2]) == -1
    assert b.metrics()["failures"] == 1 and a.metrics()["refused_range"] == 1
    # registration: an overlap is refused, an unknown address too
    assert a.register_memory(dst + 10, 100) == -1
    assert a.unregister_memory(dst + 10) == -1
    assert a.free_managed_buffer(dst, 1 << 20) == 0
    assert b.transfer_sync_write(target, src, dst, 4096) == -1  # unregistered: refused
    assert b.last_status == S["KVP_ERR_OUT_OF_RANGE"]
    assert TransferNotify("n", "m").msg == "m" and int(TransferOpcode.Write) == 1
    import mooncake.engine as me
    assert me.Read is TransferOpcode.Read and me.Write is TransferOpcode.Write
    assert not (me.SUPPORT_EFA or me.SUPPORT_HIP or me.SUPPORT_MNNVL or me.SUPPORT_MUSA
                or me.SUPPORT_INTRA_NVLINK)
    a.close()
    b.close()


def test_what_is_not_here_says_so():
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "etcd://127.0.0.1:2379", "tcp", "") == -1
    assert e.last_status == S["KVP_ERR_UNSUPPORTED"]
    if not (os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband")):
        # rdma needs a device (tests/rdma/test_te_rdma.c runs it in the Soft-RoCE VM)
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == -1
        assert e.last_status == S["KVP_ERR_TRANSPORT"]
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "shm", "") == 0
    # shm reaches this host only
    assert e.transfer_sync_write("10.255.255.1:4000", 4096, 4096, 1) == -1
    assert e.last_status == S["KVP_ERR_TRANSPORT"]
    for name, args in [("get_local_topology", ()), ("warmup_efa_segment", ("x",))]:
        with pytest.raises(NotImplementedError, match=name):
            getattr(e, name)(*args)
    if not engine_mod.SUPPORT_CUDA:  # no CUDA driver: the _on_cuda forms say so (tests/gpu/
        # test_gpu_te.py moves device memory with them)
        for name, args in [("transfer_write_on_cuda", ("127.0.0.1:1", 4096, 4096, 1)),
                           ("batch_transfer_read_on_cuda", ("127.0.0.1:1", [4096], [4096], [1]))]:
            with pytest.raises(RuntimeError, match=f"{name}.*KVP_ERR_TRANSPORT"):
                getattr(e, name)(*args)
            assert e.last_status == S["KVP_ERR_TRANSPORT"]
    assert e.send_probe("127.0.0.1:1") == -1  # nobody there
    assert e.last_status == S["KVP_ERR_CONNECT"]
    e.close()


def test_protected_mode_refuses_another_host(peers, tmp_path):
    """The decode in one network namespace, the prefill in another ("hosts" on a bridge):
    refused (KVP_ERR_DENIED, counted, the decode's bytes intact) in protected mode, the
    default; let in with KVPOOL_AUTH=none."""
    sys.path.insert(0, os.path.join(HERE, "..", "net"))
    import netbed

    ok, why = netbed.available()
    if not ok:
        pytest.skip(why)
    with netbed.NetBed(2) as bed:
        d_host, p_host = bed.hosts
        for auth in ("protected", "none"):
            env = {"KVPOOL_AUTH": auth}
            decode = peers("decode", "tcp", host=d_host.addr, env=env,
                           argv_prefix=d_host.argv([])[:4])
            prefill = peers("prefill", "auto", host=p_host.addr, argv_prefix=p_host.argv([])[:4])
            target = f"{d_host.addr}:{decode.info['port']}"
            r = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"],
                            pblocks=[0, 1], dblocks=[0, 1])
            got = dump(decode, tmp_path, f"{auth}.npy")
            if auth == "protected":
                assert (r["rc"], r["status"]) == (-1, S["KVP_ERR_DENIED"]), r
                assert (got == 0xEE).all()
                assert decode.ask(op="metrics")["refused_protected"] >= 1
            else:
                assert (r["rc"], r["status"]) == (0, 0), r
                assert np.array_equal(got, expected([0, 1], [0, 1]))
            decode.close()
            prefill.close()


UPSTREAM = os.path.join(HERE, "..", "mooncake", "upstream")


def mooncake_file(name, tmp_path):
    """Mooncake's mooncake-wheel/tests/NAME, unchanged: the copy in tests/mooncake/upstream
    (Mooncake's commit 3b5a594, Apache-2.0; its README says so)."""
    return os.path.join(UPSTREAM, name)


@pytest.mark.parametrize("proto,metadata", [("tcp", "P2PHANDSHAKE"), ("auto", "P2PHANDSHAKE"),
                                            ("tcp", "http://127.0.0.1:8080/metadata")])
def test_mooncakes_own_transfer_engine_test_unchanged(tmp_path, proto, metadata):
    """Mooncake's transfer_engine_target.py and transfer_engine_initiator_test.py (its
    wheel's tests: write/read rounds, batches, async batches, failure sentinels, send_probe)
    unchanged, with P2PHANDSHAKE as their CI's P2P runs set it, and as scripts/run_tests.sh
    runs them: an HTTP metadata URL (no server listens there: kvpool's engines find each
    other peer to peer, each at the port its name gives) and MC_FORCE_TCP."""
    target_py = mooncake_file("transfer_engine_target.py", tmp_path)
    init_py = mooncake_file("transfer_engine_initiator_test.py", tmp_path)
    assert os.path.exists(target_py) and os.path.exists(init_py)
    from conftest import free_port  # below the ephemeral range, this worker's slice
    port = free_port()
    # P2P: the initiator names itself by its rpc port; with a metadata URL by its own name
    initiator = "127.0.0.1:0" if metadata == "P2PHANDSHAKE" else f"127.0.0.1:{free_port()}"
    env = dict(os.environ, TARGET_SERVER_NAME=f"127.0.0.1:{port}",
               INITIATOR_SERVER_NAME=initiator, MC_METADATA_SERVER=metadata,
               MC_FORCE_TCP="true", PROTOCOL=proto, CIRCLE="200")
    target = subprocess.Popen([sys.executable, target_py], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        seen = [target.stdout.readline()]
        while seen[-1] and "ready" not in seen[-1]:
            seen.append(target.stdout.readline())
        assert "Target server ready" in seen[-1], "".join(seen)[-3000:]
        r = subprocess.run([sys.executable, init_py, "-v"], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "Ran 6 tests" in r.stderr and "\nOK" in r.stderr, r.stderr[-3000:]
    finally:
        os.kill(target.pid, signal.SIGKILL)
        target.wait(10)


@pytest.mark.parametrize("proto", ["tcp", "shm"])
def test_another_user_of_this_host_is_refused(peers, tmp_path, proto):
    """Protected mode takes the processes of the engine's own user (and root's): a prefill
    running as `nobody` gets KVP_ERR_DENIED for writes, reads and REGIONS, counted
    (refused_user), the decode's bytes intact; with KVPOOL_AUTH=none its tcp writes land
    (the shm socket still takes our user only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the prefill as another user")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    for auth in ("protected", "none"):
        decode = peers("decode", proto, env={"KVPOOL_AUTH": auth})
        prefill = peers("prefill", proto, argv_prefix=as_nobody)
        target = f"127.0.0.1:{decode.info['port']}"
        w = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"],
                        pblocks=[0, 1], dblocks=[0, 1])
        rd = prefill.ask(op="raw", target=target, remote=decode.info["ptrs"][0], length=4096,
                         write=False)
        got = dump(decode, tmp_path, f"{auth}-{proto}.npy")
        m = decode.ask(op="metrics")
        if auth == "protected" or proto == "shm":
            assert (w["rc"], w["status"]) == (-1, S["KVP_ERR_DENIED"]), w
            assert (rd["rc"], rd["status"]) == (-1, S["KVP_ERR_DENIED"]), rd
            assert (got == 0xEE).all()
            assert m["refused_user"] >= 1 and m["served_writes"] == 0, m
        else:
            assert (w["rc"], w["status"], rd["rc"]) == (0, 0, 0), (w, rd)
            assert np.array_equal(got, expected([0, 1], [0, 1]))
            assert m["refused_user"] == 0, m
        decode.close()
        prefill.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """deploy/make-certs.sh's CA, with principals decode, prefill-a and prefill-b, and (its
    hostile-case certs) rogue: CN admin, of another CA."""
    d = tmp_path_factory.mktemp("te-certs")
    script = os.path.join(HERE, "..", "..", "deploy", "make-certs.sh")
    subprocess.run([script, str(d), "decode", "prefill-a", "prefill-b"], check=True,
                   capture_output=True, env=dict(os.environ, KVPOOL_TEST_CERTS="1"))
    return d


def cred_env(certs, cn, ca="ca.crt"):
    return {"KVPOOL_TLS_CA": str(certs / ca), "KVPOOL_TLS_CERT": str(certs / f"{cn}.crt"),
            "KVPOOL_TLS_KEY": str(certs / f"{cn}.key")}


def all_refused(prefill, decode, tmp_path, name, refused):
    """prefill's write, read and notify to decode all KVP_ERR_DENIED, counted past refused
    (refused_auth, returned), decode's bytes and notifies untouched."""
    target = f"127.0.0.1:{decode.info['port']}"
    w = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"],
                    pblocks=[0, 1], dblocks=[0, 1])
    rd = prefill.ask(op="raw", target=target, remote=decode.info["ptrs"][0], length=4096,
                     write=False)
    nt = prefill.ask(op="notify", target=target, remote=0, name="n", msg=name, only=True)
    assert (w["rc"], w["status"]) == (-1, S["KVP_ERR_DENIED"]), (name, w)
    assert (rd["rc"], rd["status"]) == (-1, S["KVP_ERR_DENIED"]), (name, rd)
    assert (nt["rc"], nt["status"]) == (-1, S["KVP_ERR_DENIED"]), (name, nt)
    assert decode.ask(op="notifies") == {"notifies": []}, name
    assert (dump(decode, tmp_path, f"{name}.npy") == 0xEE).all(), name
    m = decode.ask(op="metrics")
    assert m["refused_auth"] > refused and m["served_writes"] == 0, (name, m)
    return m["refused_auth"]


def writes_exact(peers, proto, certs, decode, tmp_path):
    """prefill-a (of decode's CA) writes its blocks into decode byte-exact; the peer."""
    prefill = peers("prefill", proto, env=cred_env(certs, "prefill-a"))
    w = prefill.ask(op="write", target=f"127.0.0.1:{decode.info['port']}",
                    remote_ptrs=decode.info["ptrs"], pblocks=PBLOCKS, dblocks=DBLOCKS)
    assert (w["rc"], w["status"]) == (0, 0), w
    assert np.array_equal(dump(decode, tmp_path, "a.npy"), expected(PBLOCKS, DBLOCKS))
    return prefill


@pytest.mark.parametrize("proto", ["tcp", "shm"])
def test_credentials_authenticate_peers_and_name_who_may_write(peers, tmp_path, certs, proto):
    """With KVPOOL_TLS_CA/_CERT/_KEY an engine takes only peers that prove a certificate of
    its CA (TE_AUTH), and of those only the principals KVPOOL_TE_PEERS names: a peer with
    no credentials, one of another CA (CN admin, named) and prefill-b (not named) get
    KVP_ERR_DENIED for writes and reads, counted (refused_auth), the decode's bytes intact;
    prefill-a's blocks land byte-exact."""
    denv = dict(cred_env(certs, "decode"), KVPOOL_TE_PEERS="prefill-a, admin")
    decode = peers("decode", proto, env=denv)
    target = f"127.0.0.1:{decode.info['port']}"
    refused = 0
    for name, env in (("none", {}), ("rogue", cred_env(certs, "rogue")),
                      ("prefill-b", cred_env(certs, "prefill-b"))):
        prefill = peers("prefill", proto, env=env)
        refused = all_refused(prefill, decode, tmp_path, name, refused)
        prefill.close()
    prefill = writes_exact(peers, proto, certs, decode, tmp_path)
    m = decode.ask(op="metrics")
    assert m["refused_auth"] == refused and m["served_writes"] > 0, m
    # the peer without credentials sent its notify and was refused; the others' proofs
    # were refused first (refused_auth), their notifies never sent
    assert m["notifies"] == 0 and m["notifies_dropped"] == 1, m
    nt = prefill.ask(op="notify", target=target, remote=decode.info["ptrs"][0] + 7, name="req-1",
                     msg="done")
    assert (nt["rc"], nt["status"]) == (0, 0), nt
    assert decode.ask(op="notifies") == {"notifies": [["req-1", "done"]]}


@pytest.mark.parametrize("proto", ["tcp", "shm"])
def test_revoked_certificate_refused(peers, tmp_path, certs, proto):
    """With KVPOOL_TLS_CRL the engine checks a peer's certificate against the CA's CRL, as the
    master and the indexer do (the common TLS code): a peer proving make-certs' revoked
    certificate (CN revoked, listed in crl.pem) is refused, its write, read and notify
    KVP_ERR_DENIED and counted, the decode's bytes intact; a peer of the same CA not revoked
    writes byte-exact. Without the CRL the same revoked certificate is taken (what the CRL
    changes)."""
    denv = dict(cred_env(certs, "decode"), KVPOOL_TLS_CRL=str(certs / "crl.pem"))
    decode = peers("decode", proto, env=denv)
    prefill = peers("prefill", proto, env=cred_env(certs, "revoked"))
    all_refused(prefill, decode, tmp_path, "revoked", 0)
    prefill.close()
    writes_exact(peers, proto, certs, decode, tmp_path)
    # the same certificate, a decode without the CRL: taken
    plain = peers("decode", proto, env=cred_env(certs, "decode"))
    revoked = peers("prefill", proto, env=cred_env(certs, "revoked"))
    w = revoked.ask(op="write", target=f"127.0.0.1:{plain.info['port']}",
                    remote_ptrs=plain.info["ptrs"], pblocks=[0], dblocks=[0])
    assert (w["rc"], w["status"]) == (0, 0), w


@pytest.mark.parametrize("proto", ["tcp", "shm"])
def test_initiator_takes_only_a_target_that_proves_itself(peers, tmp_path, certs, proto):
    """TE_AUTH is mutual: an initiator with credentials moves bytes only with a target that
    proves a principal it takes, by the rules a target applies to its peers. A decode with no
    credentials, one of another CA (rogue), one whose certificate is revoked (the prefill
    reads KVPOOL_TLS_CRL) and one KVPOOL_TE_PEERS does not name: the prefill's write and read
    fail KVP_ERR_DENIED, the decode's memory untouched and nothing served, and the decode
    refused nothing itself (the initiator refused first: before, the revoked, unnamed and
    credential-less decodes took the write, and the rogue refused the prefill's proof). The
    decode it names writes byte-exact."""
    pre_env = dict(cred_env(certs, "prefill-a"), KVPOOL_TLS_CRL=str(certs / "crl.pem"))
    for name, denv, penv in (("none", {}, {}),
                             ("rogue", cred_env(certs, "rogue"), {}),
                             ("revoked", cred_env(certs, "revoked"), {}),
                             ("unnamed", cred_env(certs, "decode"),
                              {"KVPOOL_TE_PEERS": "prefill-b"})):
        decode = peers("decode", proto, env=denv)
        prefill = peers("prefill", proto, env=dict(pre_env, **penv))
        target = f"127.0.0.1:{decode.info['port']}"
        w = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"],
                        pblocks=[0, 1], dblocks=[0, 1])
        rd = prefill.ask(op="raw", target=target, remote=decode.info["ptrs"][0], length=4096,
                         write=False)
        assert (w["rc"], w["status"]) == (-1, S["KVP_ERR_DENIED"]), (name, w)
        assert (rd["rc"], rd["status"]) == (-1, S["KVP_ERR_DENIED"]), (name, rd)
        assert (dump(decode, tmp_path, f"{name}.npy") == 0xEE).all(), name
        m = decode.ask(op="metrics")
        assert not any(m[k] for k in ("served_writes", "served_reads", "served_cma_writes",
                                      "served_cma_reads", "served_lease_writes",
                                      "served_lease_reads", "refused_auth")), (name, m)
        prefill.close()
        decode.close()
    decode = peers("decode", proto, env=cred_env(certs, "decode"))
    prefill = peers("prefill", proto, env=dict(pre_env, KVPOOL_TE_PEERS="decode"))
    w = prefill.ask(op="write", target=f"127.0.0.1:{decode.info['port']}",
                    remote_ptrs=decode.info["ptrs"], pblocks=PBLOCKS, dblocks=DBLOCKS)
    assert (w["rc"], w["status"]) == (0, 0), w
    assert np.array_equal(dump(decode, tmp_path, "named.npy"), expected(PBLOCKS, DBLOCKS))


def test_a_target_cannot_answer_success_it_did_not_prove(certs, monkeypatch):
    """A party at the target's address that answers the engine's TE_AUTH with status 1 (not a
    status of the wire's list: success for the async API's batch status) proves nothing: the
    initiator's sync and async writes fail KVP_ERR_PROTOCOL. Before: the sync write failed but
    the async batch was reported done, no byte moved."""
    for k, v in cred_env(certs, "prefill-a").items():
        monkeypatch.setenv(k, v)
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    conns = []

    def serve():
        while True:
            try:
                c, _ = lst.accept()
            except OSError:
                return
            conns.append(c)
            if len(c.recv(32)) == 32:  # the TE_AUTH header
                c.sendall(struct.pack("<IiQ", 0x4450564B, 1, 0))

    threading.Thread(target=serve, daemon=True).start()
    te = TransferEngine()
    try:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        buf = te.allocate_managed_buffer(4096)
        target = f"127.0.0.1:{port}"
        assert te.transfer_sync_write(target, buf, 0x10000, 4096) == -1
        assert te.last_status == S["KVP_ERR_PROTOCOL"]
        bid = te.batch_transfer_async_write(target, [buf], [0x10000], [4096])
        assert bid and te.get_batch_transfer_status([bid]) == -1
        assert te.last_status == S["KVP_ERR_PROTOCOL"]
    finally:
        te.close()
        lst.close()
        for c in conns:
            c.close()


@pytest.mark.parametrize("var,value", [("KVPOOL_TE_STREAMS", "0"),
                                       ("KVPOOL_TE_STREAMS", "4294967296"),
                                       ("KVPOOL_TE_STREAMS", "two"),
                                       ("KVPOOL_TE_TIMEOUT_MS", "-5"),
                                       ("KVPOOL_TE_CHAIN", "1g"),
                                       ("KVPOOL_TE_STAGE_CHUNK", "12"),
                                       ("KVPOOL_TE_COPY_THREADS", "9"),
                                       ("KVPOOL_TE_SHM", "mmap"),
                                       ("KVPOOL_RDMA_HOST", "rdma-node-7")])
def test_bad_engine_variable_fails_initialize(var, value):
    """The engine's variables are read through one typed table (client/env.c): a value out of
    range or not of its type fails initialize (KVP_ERR_INVALID_ARG) with a message naming the
    variable, never an engine that silently takes a default (KVPOOL_TE_STREAMS took 1 to
    2^32-1 and ignored the rest)."""
    env = {k: v for k, v in os.environ.items() if k not in CRED_VARS}
    env[var] = value
    env["KVPOOL_LOG_LEVEL"] = "error"
    p = subprocess.run([sys.executable, PEER, "decode", "tcp"], env=env, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert json.loads(p.stdout.splitlines()[0]) == {"error": S["KVP_ERR_INVALID_ARG"]}, p.stdout
    assert var in p.stderr, p.stderr


def test_good_engine_variables_taken(peers, tmp_path):
    """In range, the same variables are taken: an engine of 64 streams, a 4 KiB chain and the
    socket shm mode moves the blocks byte-exact."""
    env = {"KVPOOL_TE_STREAMS": "64", "KVPOOL_TE_CHAIN": "4KiB", "KVPOOL_TE_SHM": "socket",
           "KVPOOL_TE_TIMEOUT_MS": "20000"}
    decode = peers("decode", "tcp", env=env)
    prefill = peers("prefill", "tcp", env=env)
    w = prefill.ask(op="write", target=f"127.0.0.1:{decode.info['port']}",
                    remote_ptrs=decode.info["ptrs"], pblocks=PBLOCKS, dblocks=DBLOCKS)
    assert (w["rc"], w["status"]) == (0, 0), w
    assert np.array_equal(dump(decode, tmp_path, "a.npy"), expected(PBLOCKS, DBLOCKS))


def test_bad_crl_fails_initialize(certs, tmp_path):
    """A KVPOOL_TLS_CRL that does not load: initialize fails (KVP_ERR_INVALID_ARG), never an
    engine that skips the revocation check."""
    bad = tmp_path / "bad-crl.pem"
    bad.write_text("not a CRL\n")
    env = {k: v for k, v in os.environ.items() if k not in CRED_VARS}
    env.update(cred_env(certs, "decode"), KVPOOL_TLS_CRL=str(bad))
    p = subprocess.run([sys.executable, PEER, "decode", "tcp"], env=env, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert json.loads(p.stdout.splitlines()[0]) == {"error": S["KVP_ERR_INVALID_ARG"]}, p.stdout


def test_credentials_half_given_fail_initialize(certs):
    """KVPOOL_TLS_CERT without _KEY and _CA: initialize fails (KVP_ERR_INVALID_ARG), never
    an engine that silently takes anyone."""
    env = {k: v for k, v in os.environ.items() if k not in CRED_VARS}
    env["KVPOOL_TLS_CERT"] = str(certs / "decode.crt")
    p = subprocess.run([sys.executable, PEER, "decode", "tcp"], env=env, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert json.loads(p.stdout.splitlines()[0]) == {"error": S["KVP_ERR_INVALID_ARG"]}, p.stdout


@pytest.mark.parametrize("mode", ["cma", "cma-checked", "socket"])
def test_shm_one_copy_and_socket_paths_byte_exact(peers, tmp_path, mode):
    """shm: by default the prefill copies with process_vm_writev / readv under the decode's
    standing lease (the same user, no Yama restriction here: no round trip a batch);
    KVPOOL_TE_SHM=cma-checked, once the decode checked each batch's ranges (served_cma_*
    either way); socket, the frames over the Unix socket. All byte-exact, writes and reads;
    a range outside what the decode registered is refused on each before any byte moves."""
    env = {"KVPOOL_TE_SHM": mode}
    decode = peers("decode", "shm", env=env)
    prefill = peers("prefill", "shm", env=env)
    target = f"127.0.0.1:{decode.info['port']}"
    w = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"],
                    pblocks=PBLOCKS, dblocks=DBLOCKS)
    assert (w["rc"], w["status"]) == (0, 0), w
    assert np.array_equal(dump(decode, tmp_path, "w.npy"), expected(PBLOCKS, DBLOCKS))
    # read the decode's block 5 (every layer, K and V) into the prefill's block 9
    r = prefill.ask(op="read", target=target, remote_ptrs=decode.info["ptrs"], pblocks=[9],
                    dblocks=[5])
    assert (r["rc"], r["status"]) == (0, 0), r
    bad = prefill.ask(op="raw", target=target, remote=decode.info["ptrs"][0] + decode.info[
        "sizes"][0] - 100, length=4096, write=True)
    assert (bad["rc"], bad["status"]) == (-1, S["KVP_ERR_OUT_OF_RANGE"]), bad
    assert np.array_equal(dump(decode, tmp_path, "w2.npy"), expected(PBLOCKS, DBLOCKS))
    m = decode.ask(op="metrics")
    route = prefill.ask(op="metrics")["peers"][target]
    assert route["route"] == ("shm" if mode == "socket" else "shm-cma"), route
    assert route["transfers"] >= 2 and route["failures"] == 1, route
    if mode != "socket":
        assert m["served_cma_writes"] > 0 and m["served_cma_reads"] > 0, m
    else:
        assert m["served_cma_writes"] == 0 and m["served_cma_reads"] == 0, m
        assert m["served_writes"] > 0, m
    if mode == "cma" and LEASES_HERE:  # no round trip a batch: the decode's standing lease
        assert m["served_lease_writes"] > 0 and m["served_lease_reads"] > 0, m
        assert m["leases"] == 1, m
    else:
        assert m["served_lease_writes"] == 0 and m["leases"] == 0, m
    assert m["refused_range"] >= 1, m
    # the read put the decode's block 5 (the prefill's block 0: PBLOCKS[0] -> DBLOCKS[0])
    # into the prefill's block 9; written back to the decode's block 63, it is block 0
    p = prefill_cache()
    w = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"], pblocks=[9],
                    dblocks=[63])
    assert (w["rc"], w["status"]) == (0, 0), w
    got = dump(decode, tmp_path, "w3.npy")
    assert np.array_equal(got[:, :, 63], p[:, :, 0])


@pytest.mark.parametrize("threads", ["1", "3"])
def test_shm_copy_threads_split_a_batch_byte_exact(peers, tmp_path, threads):
    """The same-host copy splits a batch of 2 MiB or more by bytes over the engine's copy
    threads (KVPOOL_TE_COPY_THREADS; 3: parts that end inside a run), up to 1024 ranges per
    request to the decode: 8 runs of 1 MiB, then 512 ranges of 16 KiB, written and read
    back, byte-exact; a range past what the decode registered moves nothing."""
    env = {"KVPOOL_TE_COPY_THREADS": threads}
    decode = peers("decode", "shm", env=env)
    prefill = peers("prefill", "shm", env=env)
    target = f"127.0.0.1:{decode.info['port']}"
    allb = list(range(BLOCKS))
    w = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"], pblocks=allb,
                    dblocks=allb)
    assert (w["rc"], w["runs"]) == (0, LAYERS * 2), w
    assert np.array_equal(dump(decode, tmp_path, "a.npy"), prefill_cache())
    rev = allb[::-1]
    w = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"], pblocks=allb,
                    dblocks=rev)
    assert (w["rc"], w["runs"]) == (0, LAYERS * 2 * BLOCKS), w
    assert np.array_equal(dump(decode, tmp_path, "b.npy"), prefill_cache()[:, :, ::-1])
    # read the decode's (reversed) cache into the prefill's, 512 ranges, then write it back
    # reversed: the decode holds the prefill's original cache again
    r = prefill.ask(op="read", target=target, remote_ptrs=decode.info["ptrs"], pblocks=allb,
                    dblocks=allb)
    assert (r["rc"], r["status"]) == (0, 0), r
    w = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"], pblocks=allb,
                    dblocks=rev)
    assert (w["rc"], w["status"]) == (0, 0), w
    assert np.array_equal(dump(decode, tmp_path, "c.npy"), prefill_cache())
    m = decode.ask(op="metrics")
    assert m["served_cma_writes"] >= LAYERS * 2 * (1 + 2 * BLOCKS), m
    assert m["served_cma_reads"] >= LAYERS * 2, m
    bad = prefill.ask(op="raw", target=target, remote=decode.info["ptrs"][0] + decode.info[
        "sizes"][0] - 100, length=1 << 20, write=True)
    assert (bad["rc"], bad["status"]) == (-1, S["KVP_ERR_OUT_OF_RANGE"]), bad
    assert np.array_equal(dump(decode, tmp_path, "d.npy"), prefill_cache())
    assert prefill.ask(op="metrics")["peers"][target]["route"] == "shm-cma"


def test_notifies_in_process():
    """transfer_sync / batch_transfer_sync with a notify: after the bytes moved, the target's
    get_notifies() returns TransferNotify(name, msg), oldest first, each once; a transfer
    that fails sends none (tcp and shm)."""
    for proto in ("tcp", "shm"):
        a, b = TransferEngine(), TransferEngine()
        assert a.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0
        assert b.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0
        target = f"127.0.0.1:{a.get_rpc_port()}"
        dst, src = a.allocate_managed_buffer(1 << 16), b.allocate_managed_buffer(1 << 16)
        assert b.write_bytes_to_buffer(src, b"\x5a" * 4096, 4096) == 0
        assert a.get_notifies() == []
        assert b.transfer_sync(target, src, dst, 4096, TransferOpcode.WRITE,
                               TransferNotify("req-1", "kv ready")) == 0
        assert b.batch_transfer_sync(target, [src], [dst + 4096], [100], TransferOpcode.WRITE,
                                     TransferNotify("req-2", "\u00e9" * 1000)) == 0
        assert b.transfer_sync(target, src, dst + (1 << 16) - 10, 4096, TransferOpcode.WRITE,
                               TransferNotify("req-3", "never")) == -1
        assert b.last_status == S["KVP_ERR_OUT_OF_RANGE"]
        got = [(n.name, n.msg) for n in a.get_notifies()]
        assert got == [("req-1", "kv ready"), ("req-2", "\u00e9" * 1000)], proto
        assert a.read_bytes_from_buffer(dst, 4096) == b"\x5a" * 4096
        assert a.get_notifies() == []
        assert a.metrics()["notifies"] == 2
        a.close()
        b.close()


def test_shm_falls_back_to_the_socket_when_the_kernel_refuses(peers, tmp_path):
    """A decode that is not dumpable (PR_SET_DUMPABLE 0), both as `nobody` (no
    CAP_SYS_PTRACE): process_vm_writev gets EPERM, and the prefill's batch goes over the
    socket frames instead, byte-exact; its route to the decode says shm from then on."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the peers as another user")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    out = pathlib.Path(tempfile.mkdtemp(prefix="te-fallback-"))  # tmp_path: root's 0700
    os.chmod(out, 0o777)
    decode = peers("decode", "shm", env={"TE_PEER_UNDUMPABLE": "1"}, argv_prefix=as_nobody)
    prefill = peers("prefill", "shm", argv_prefix=as_nobody)
    target = f"127.0.0.1:{decode.info['port']}"
    w = prefill.ask(op="write", target=target, remote_ptrs=decode.info["ptrs"],
                    pblocks=PBLOCKS, dblocks=DBLOCKS)
    assert (w["rc"], w["status"]) == (0, 0), w
    path = str(out / "d.npy")
    assert decode.ask(op="dump", path=path) == {"ok": True}
    assert np.array_equal(np.load(path), expected(PBLOCKS, DBLOCKS))
    m = decode.ask(op="metrics")
    assert m["served_cma_writes"] == 0 and m["served_writes"] > 0, m
    pm = prefill.ask(op="metrics")["peers"][target]
    assert pm["route"] == "shm" and pm["failures"] == 0, pm
    shutil.rmtree(out)


# ---- who may write into an engine: KVPOOL_TE_ACL's roles, two principals, and which
# shm route a principal other than the target's own gets (issue 48's security bullet) ----

ACL_CNS = ("decode", "prefill-w", "reader", "other-tenant", "patterned", "stranger")
# (principal, cert-cn, tenant, roles, keys)
ACL_PRINCIPALS = (("decode", "decode", "team-a", "read, write, segment", ""),
                  ("prefill", "prefill-w", "team-a", "read, write", ""),
                  ("reader", "reader", "team-a", "read", ""),
                  ("other", "other-tenant", "team-b", "read, write", ""),
                  ("patterned", "patterned", "team-a", "read, write", "llama3@*"))
ACL = "".join(f"[principal {n}]\ntenant = {t}\nroles = {r}\ncert-cn = {cn}\n"
              + (f"keys = {k}\n" if k else "") + "\n" for n, cn, t, r, k in ACL_PRINCIPALS)


@pytest.fixture(scope="module")
def acl_certs(tmp_path_factory):
    """deploy/make-certs.sh's CA with the principals of ACL (stranger: of the CA, not in
    the ACL; rogue: CN admin, another CA), and the ACL file."""
    d = tmp_path_factory.mktemp("te-acl-certs")
    script = os.path.join(HERE, "..", "..", "deploy", "make-certs.sh")
    subprocess.run([script, str(d), *ACL_CNS], check=True, capture_output=True,
                   env=dict(os.environ, KVPOOL_TEST_CERTS="1"))
    (d / "acl.conf").write_text(ACL)
    return d


def served_cma_writes(decode):
    """The decode's served_cma_writes, once its count of the last one-copy batch is in (the
    target counts after the peer's done, which the peer does not wait on): up to 2 s."""
    for _ in range(200):
        n = decode.ask(op="metrics")["served_cma_writes"]
        if n > 0:
            return n
        time.sleep(0.01)
    return 0


def acl_env(certs, cn):
    return dict(cred_env(certs, cn), KVPOOL_TE_ACL=str(certs / "acl.conf"))


@pytest.mark.parametrize("proto", ["tcp", "shm"])
def test_acl_roles_say_who_may_write_into_an_engine(peers, tmp_path, acl_certs, proto):
    """The decode (principal decode, tenant team-a) reads KVPOOL_TE_ACL. Refused whole, the
    decode's bytes intact, nothing learnt of its memory (REGIONS: KVP_ERR_DENIED), counted
    by reason: a peer with no certificate and one of the CA the ACL does not name
    (refused_auth), one of another CA (refused_auth), a principal of tenant team-b
    (refused_tenant), one with key patterns (refused_role). The reader (role read) may read,
    byte-exact, but its writes and notifies are refused (refused_role). prefill-w (read,
    write) writes vLLM's connector sequence byte-exact; on shm over the socket frames, not
    the one-copy path (route "shm", no served_cma_writes), which only the decode's own
    principal gets."""
    decode = peers("decode", proto, env=acl_env(acl_certs, "decode"))
    target = f"127.0.0.1:{decode.info['port']}"
    ptrs = decode.info["ptrs"]
    m0 = decode.ask(op="metrics")
    assert (m0["refused_auth"], m0["refused_role"], m0["refused_tenant"]) == (0, 0, 0), m0
    for name, env, reason in (("none", {}, "refused_auth"),
                              ("stranger", cred_env(acl_certs, "stranger"), "refused_auth"),
                              ("rogue", cred_env(acl_certs, "rogue"),
                               "refused_auth"),
                              ("other-tenant", cred_env(acl_certs, "other-tenant"),
                               "refused_tenant"),
                              ("patterned", cred_env(acl_certs, "patterned"), "refused_role")):
        before = decode.ask(op="metrics")
        prefill = peers("prefill", proto, env=env)
        w = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=PBLOCKS,
                        dblocks=DBLOCKS)
        rd = prefill.ask(op="raw", target=target, remote=ptrs[0], length=4096, write=False)
        rg = prefill.ask(op="regions", target=target)
        nt = prefill.ask(op="notify", target=target, remote=0, name="n", msg=name, only=True)
        assert (w["rc"], w["status"]) == (-1, S["KVP_ERR_DENIED"]), (name, w)
        assert (rd["rc"], rd["status"]) == (-1, S["KVP_ERR_DENIED"]), (name, rd)
        assert rg == {"addr": 0, "status": S["KVP_ERR_DENIED"]}, (name, rg)
        assert (nt["rc"], nt["status"]) == (-1, S["KVP_ERR_DENIED"]), (name, nt)
        assert (dump(decode, tmp_path, f"{name}.npy") == 0xEE).all(), name
        m = decode.ask(op="metrics")
        assert m[reason] > before[reason], (name, reason, m)
        assert m["served_writes"] == 0 and m["served_reads"] == 0, (name, m)
        assert m["notifies"] == 0, (name, m)
        prefill.close()
    assert decode.ask(op="notifies") == {"notifies": []}

    # the reader: reads byte-exact (the decode's blocks, all 0xEE, into its blocks 0..3),
    # its writes and notifies refused
    reader = peers("prefill", proto, env=cred_env(acl_certs, "reader"))
    before = decode.ask(op="metrics")
    w = reader.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=PBLOCKS, dblocks=DBLOCKS)
    assert (w["rc"], w["status"]) == (-1, S["KVP_ERR_DENIED"]), w
    nt = reader.ask(op="notify", target=target, remote=0, name="n", msg="reader", only=True)
    assert (nt["rc"], nt["status"]) == (-1, S["KVP_ERR_DENIED"]), nt
    assert (dump(decode, tmp_path, "reader-w.npy") == 0xEE).all()
    m = decode.ask(op="metrics")
    assert m["refused_role"] >= before["refused_role"] + 2 and m["served_writes"] == 0, m
    r = reader.ask(op="read", target=target, remote_ptrs=ptrs, pblocks=[0, 1, 2, 3],
                   dblocks=[10, 11, 12, 13])
    assert (r["rc"], r["status"]) == (0, 0), r
    got = dump(reader, tmp_path, "reader-r.npy")
    want = prefill_cache()
    want[:, :, 0:4] = 0xEE
    assert np.array_equal(got, want)
    rg = reader.ask(op="regions", target=target)
    assert rg == {"addr": min(ptrs), "status": 0}, rg
    assert reader.ask(op="metrics")["peers"][target]["route"] == ("tcp" if proto == "tcp"
                                                                  else "shm")
    reader.close()

    # prefill-w: the connector's write sequence, byte-exact
    prefill = peers("prefill", proto, env=cred_env(acl_certs, "prefill-w"))
    before = decode.ask(op="metrics")
    w = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=PBLOCKS,
                    dblocks=DBLOCKS)
    assert (w["rc"], w["status"]) == (0, 0), w
    assert np.array_equal(dump(decode, tmp_path, "w.npy"), expected(PBLOCKS, DBLOCKS))
    m = decode.ask(op="metrics")
    for k in ("refused_auth", "refused_role", "refused_tenant"):
        assert m[k] == before[k], (k, m)
    assert m["served_write_bytes"] == len(PBLOCKS) * 2 * LAYERS * BLOCK_BYTES, m
    assert m["served_cma_writes"] == 0, m  # never the one-copy path: another principal
    pm = prefill.ask(op="metrics")["peers"][target]
    assert pm == {"route": "tcp" if proto == "tcp" else "shm", "transfers": LAYERS * 2 * 6,
                  "bytes": len(PBLOCKS) * 2 * LAYERS * BLOCK_BYTES, "failures": 0}, pm
    nt = prefill.ask(op="notify", target=target, remote=ptrs[0] + 7, name="req-1", msg="done")
    assert (nt["rc"], nt["status"]) == (0, 0), nt
    assert decode.ask(op="notifies") == {"notifies": [["req-1", "done"]]}
    prefill.close()

    if proto == "shm":
        # the decode's own principal (another process of it) keeps the one-copy path
        own = peers("prefill", proto, env=cred_env(acl_certs, "decode"))
        w = own.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[9], dblocks=[63])
        assert (w["rc"], w["status"]) == (0, 0), w
        assert own.ask(op="metrics")["peers"][target]["route"] == "shm-cma"
        assert served_cma_writes(decode) > 0
        got = dump(decode, tmp_path, "own.npy")
        assert np.array_equal(got[:, :, 63], prefill_cache()[:, :, 9])


def replace_acl(acl, text):
    """A new ACL file renamed over acl, then past the engine's once-a-second look at it."""
    new = acl.with_name(acl.name + ".new")
    new.write_text(text)
    os.replace(new, acl)
    time.sleep(1.2)


def first_write(prefill, decode, tmp_path):
    """prefill writes PBLOCKS into decode byte-exact: (target, decode's ptrs, what it holds)."""
    target = f"127.0.0.1:{decode.info['port']}"
    ptrs = decode.info["ptrs"]
    w = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=PBLOCKS,
                    dblocks=DBLOCKS)
    assert (w["rc"], w["status"]) == (0, 0), w
    want = expected(PBLOCKS, DBLOCKS)
    assert np.array_equal(dump(decode, tmp_path, "a.npy"), want)
    return target, ptrs, want


@pytest.mark.parametrize("proto", ["tcp", "shm"])
def test_acl_file_change_applies_to_open_connections(peers, tmp_path, acl_certs, proto):
    """An engine is as long-lived as the inference server it is in: KVPOOL_TE_ACL is read
    again when the file changes (looked at, at a request, at most once a second), and a
    connection's rights follow it at its next request. prefill-w writes; its role write
    taken away (a new file renamed over the old), its next write on the same connection is
    refused (KVP_ERR_DENIED, refused_role counted, the decode's bytes intact) while its
    reads go on; a version that does not load keeps the one before; write given back, its
    writes land again. Over tcp and the shm socket frames."""
    acl = tmp_path / "acl.conf"
    acl.write_text(ACL)
    decode = peers("decode", proto, env=dict(cred_env(acl_certs, "decode"),
                                             KVPOOL_TE_ACL=str(acl)))
    prefill = peers("prefill", proto, env=cred_env(acl_certs, "prefill-w"))
    target, ptrs, want = first_write(prefill, decode, tmp_path)

    replace_acl(acl, ACL.replace("roles = read, write\ncert-cn = prefill-w",
                            "roles = read\ncert-cn = prefill-w"))
    before = decode.ask(op="metrics")
    w = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[9], dblocks=[63])
    assert (w["rc"], w["status"]) == (-1, S["KVP_ERR_DENIED"]), w
    assert np.array_equal(dump(decode, tmp_path, "b.npy"), want)
    m = decode.ask(op="metrics")
    assert m["refused_role"] > before["refused_role"], m
    assert m["served_writes"] == before["served_writes"], m
    r = prefill.ask(op="read", target=target, remote_ptrs=ptrs, pblocks=[60], dblocks=[5])
    assert (r["rc"], r["status"]) == (0, 0), r
    assert np.array_equal(dump(prefill, tmp_path, "p.npy")[:, :, 60], want[:, :, 5])

    replace_acl(acl, "[principal broken\n")  # does not load: the read-only ACL stays
    w = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[9], dblocks=[63])
    assert (w["rc"], w["status"]) == (-1, S["KVP_ERR_DENIED"]), w

    replace_acl(acl, ACL)
    w = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[9], dblocks=[63])
    assert (w["rc"], w["status"]) == (0, 0), w
    want[:, :, 63] = prefill_cache()[:, :, 9]
    assert np.array_equal(dump(decode, tmp_path, "c.npy"), want)


@pytest.mark.parametrize("proto", ["tcp", "shm"])
def test_initiators_acl_change_applies_to_open_connections(peers, tmp_path, acl_certs, proto):
    """The initiator applies its own KVPOOL_TE_ACL to the target it moves bytes with (TE_AUTH
    is mutual), and a change of it to the connections it already has: prefill-w (with the
    ACL) writes into decode (team-a) byte-exact; the decode's principal moved to team-b in
    prefill-w's ACL (the decode's own ACL unchanged, so only the initiator can refuse), its
    next write fails KVP_ERR_DENIED with the decode's bytes intact and nothing served; moved
    back, its writes land again. Before: the open connections went on carrying KV to a
    principal the initiator no longer takes."""
    acl = tmp_path / "prefill-acl.conf"
    acl.write_text(ACL)
    decode = peers("decode", proto, env=acl_env(acl_certs, "decode"))
    prefill = peers("prefill", proto, env=dict(cred_env(acl_certs, "prefill-w"),
                                               KVPOOL_TE_ACL=str(acl)))
    target, ptrs, want = first_write(prefill, decode, tmp_path)

    replace_acl(acl, ACL.replace("[principal decode]\ntenant = team-a",
                            "[principal decode]\ntenant = team-b"))
    before = decode.ask(op="metrics")
    w = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[9], dblocks=[63])
    assert (w["rc"], w["status"]) == (-1, S["KVP_ERR_DENIED"]), w
    assert np.array_equal(dump(decode, tmp_path, "b.npy"), want)
    m = decode.ask(op="metrics")
    for k in ("served_writes", "served_cma_writes", "served_lease_writes"):
        assert m[k] == before[k], (k, m)

    replace_acl(acl, ACL)
    w = prefill.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[9], dblocks=[63])
    assert (w["rc"], w["status"]) == (0, 0), w
    want[:, :, 63] = prefill_cache()[:, :, 9]
    assert np.array_equal(dump(decode, tmp_path, "c.npy"), want)


def test_strangers_hold_no_slot_an_authorised_peer_needs(peers, tmp_path, acl_certs):
    """An engine with credentials and KVPOOL_TE_ACL, 300 strangers (no certificate) that
    each send a request (REGIONS, then a write of 4 KiB) and 300 that send nothing: each
    request is answered KVP_ERR_DENIED and its connection closed at once (before: answered
    and kept open past the handshake's deadline, the slots held); a stranger that proved
    nothing is not admitted, so those that send nothing are closed at the handshake's
    deadline (10 s) and are the first closed when the slots run out; meanwhile an
    authorised peer writes byte-exact within its timeout, and nothing of a stranger
    reached the decode's memory."""
    decode = peers("decode", "tcp", env=dict(cred_env(acl_certs, "decode"),
                                             KVPOOL_TE_ACL=str(acl_certs / "acl.conf")))
    port = decode.info["port"]
    te_id = 0x4b56505445  # "KVPTE": the engine's segment id on the wire
    magic = 0x4450564B

    def req(op, length=0, offset=0):
        return struct.pack("<IHHQQQ", magic, op, 0, te_id, offset, length)

    asking, idle = [], []
    try:
        for i in range(300):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 2:
                s.sendall(req(11))  # REGIONS
            else:  # a write of 4 KiB into the decode's first block (KVP_DATA_WRITE)
                s.sendall(req(2, 4096, decode.info["ptrs"][0]) + b"\x55" * 4096)
            asking.append(s)
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        for s in asking:
            head = b""
            while len(head) < 16:
                got = s.recv(16 - len(head))
                assert got, "closed before its answer"
                head += got
            m, status, _ = struct.unpack("<IiQ", head)
            assert (m, status) == (magic, S["KVP_ERR_DENIED"])
            assert s.recv(1) == b""  # then closed
        # the idle strangers still held: an authorised peer writes within its timeout
        prefill = peers("prefill", "tcp", env=cred_env(acl_certs, "prefill-w"))
        t0 = time.monotonic()
        w = prefill.ask(op="write", target=f"127.0.0.1:{port}", remote_ptrs=decode.info["ptrs"],
                        pblocks=PBLOCKS, dblocks=DBLOCKS)
        assert (w["rc"], w["status"]) == (0, 0), w
        assert time.monotonic() - t0 < 5
        assert np.array_equal(dump(decode, tmp_path, "a.npy"), expected(PBLOCKS, DBLOCKS))
        m = decode.ask(op="metrics")
        assert m["refused_auth"] >= 300, m
        # the strangers that proved nothing: closed at the handshake's deadline
        deadline = time.monotonic() + 15
        for s in idle:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            assert s.recv(1) == b""
    finally:
        for s in asking + idle:
            s.close()


class Relay:
    """A party an engine dials that passes every byte on to another engine and back (the
    round-3 relay: it owns the connection to the target, so had the proof it passed on
    been taken, that connection would be a principal's it is not)."""

    def __init__(self, target_port):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8)
        self.port = self.lsock.getsockname()[1]
        self.target_port = target_port
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.lsock.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self.target_port))
            self.socks += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(x, y), daemon=True).start()

    @staticmethod
    def _pump(x, y):
        try:
            while True:
                data = x.recv(65536)
                if not data:
                    break
                y.sendall(data)
        except OSError:
            pass
        for z in (x, y):
            try:
                z.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.lsock.close()
        for z in self.socks:
            z.close()


def test_relayed_proof_refused(peers, tmp_path, acl_certs):
    """TE_AUTH's signature covers the connection it is made on (both ends, as each side sees
    them): prefill-w, which may write into the decode, dials a relay that passes the
    decode's challenge to it and its proof back; the decode refuses the proof (its
    connection from the relay has other ends), the write is KVP_ERR_DENIED and counted, the
    decode's bytes intact (before: accepted as prefill-w's principal, the relay could read
    and write the decode's memory on its own connection). The same peer dialling the
    decode itself writes byte-exact."""
    decode = peers("decode", "tcp", env=dict(cred_env(acl_certs, "decode"),
                                             KVPOOL_TE_ACL=str(acl_certs / "acl.conf")))
    relay = Relay(decode.info["port"])
    try:
        prefill = peers("prefill", "tcp", env=cred_env(acl_certs, "prefill-w"))
        w = prefill.ask(op="write", target=f"127.0.0.1:{relay.port}",
                        remote_ptrs=decode.info["ptrs"], pblocks=PBLOCKS, dblocks=DBLOCKS)
        assert (w["rc"], w["status"]) == (-1, S["KVP_ERR_DENIED"]), w
        assert (dump(decode, tmp_path, "relayed.npy") == 0xEE).all()
        m = decode.ask(op="metrics")
        assert m["refused_auth"] >= 1 and m["served_writes"] == 0, m
        w = prefill.ask(op="write", target=f"127.0.0.1:{decode.info['port']}",
                        remote_ptrs=decode.info["ptrs"], pblocks=PBLOCKS, dblocks=DBLOCKS)
        assert (w["rc"], w["status"]) == (0, 0), w
        assert np.array_equal(dump(decode, tmp_path, "a.npy"), expected(PBLOCKS, DBLOCKS))
    finally:
        relay.close()


def test_shm_one_copy_path_only_for_the_targets_own_principal(peers, tmp_path, acl_certs):
    """Credentials without an ACL (KVPOOL_TE_PEERS names both): prefill-w may write, but
    over the shm socket frames (the target writes after its range check), since the
    one-copy path would open all of the decode's memory to it for the batch; the decode's
    own principal gets the one-copy path. Both byte-exact; a read too."""
    denv = dict(cred_env(acl_certs, "decode"), KVPOOL_TE_PEERS="prefill-w,decode")
    decode = peers("decode", "shm", env=denv)
    target = f"127.0.0.1:{decode.info['port']}"
    ptrs = decode.info["ptrs"]
    other = peers("prefill", "shm", env=cred_env(acl_certs, "prefill-w"))
    w = other.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=PBLOCKS, dblocks=DBLOCKS)
    assert (w["rc"], w["status"]) == (0, 0), w
    r = other.ask(op="read", target=target, remote_ptrs=ptrs, pblocks=[9], dblocks=[5])
    assert (r["rc"], r["status"]) == (0, 0), r
    assert np.array_equal(dump(decode, tmp_path, "a.npy"), expected(PBLOCKS, DBLOCKS))
    assert np.array_equal(dump(other, tmp_path, "o.npy")[:, :, 9], prefill_cache()[:, :, 0])
    m = decode.ask(op="metrics")
    assert m["served_cma_writes"] == 0 and m["served_cma_reads"] == 0, m
    assert m["served_writes"] > 0 and m["served_reads"] > 0, m
    assert other.ask(op="metrics")["peers"][target]["route"] == "shm"
    own = peers("prefill", "shm", env=cred_env(acl_certs, "decode"))
    w = own.ask(op="write", target=target, remote_ptrs=ptrs, pblocks=[9], dblocks=[63])
    assert (w["rc"], w["status"]) == (0, 0), w
    assert own.ask(op="metrics")["peers"][target]["route"] == "shm-cma"
    assert served_cma_writes(decode) > 0
    assert np.array_equal(dump(decode, tmp_path, "b.npy")[:, :, 63], prefill_cache()[:, :, 9])


def test_acl_without_credentials_or_own_principal_fails_initialize(acl_certs, tmp_path):
    """KVPOOL_TE_ACL without KVPOOL_TLS_*, with a certificate the ACL names no principal
    for, or a file that does not load: initialize fails (KVP_ERR_INVALID_ARG), never an
    engine that takes anyone."""
    bad = tmp_path / "bad.conf"
    bad.write_text("[principal x]\nroles = fly\ncert-cn = x\n")
    base = {k: v for k, v in os.environ.items() if k not in CRED_VARS}
    for env in ({"KVPOOL_TE_ACL": str(acl_certs / "acl.conf")},
                acl_env(acl_certs, "stranger"),
                dict(cred_env(acl_certs, "decode"), KVPOOL_TE_ACL=str(bad)),
                dict(cred_env(acl_certs, "decode"), KVPOOL_TE_ACL=str(tmp_path / "none.conf"))):
        p = subprocess.run([sys.executable, PEER, "decode", "tcp"], env=dict(base, **env),
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
        assert json.loads(p.stdout.splitlines()[0]) == {"error": S["KVP_ERR_INVALID_ARG"]}, (
            env, p.stdout, p.stderr)


def test_engine_refusals_in_the_store_clients_metrics(client, acl_certs, peers, monkeypatch):
    """What this process's engines refuse is in its store client's exposition
    (metrics_text(): what `kvpool serve --http-listen` and an inference process's /metrics
    serve), kvpool_te_refused_total by reason, the same counts as the engine's metrics(),
    and still there once the engine is destroyed: a peer with no certificate (auth), a
    principal of another tenant (tenant), a reader's write (role), a range not registered
    (range)."""
    from conftest import metric

    reasons = ("auth", "tenant", "role", "range")

    def refused():
        text = client.metrics_text()
        return {r: metric(text, "kvpool_te_refused_total", {"reason": r}) for r in reasons}

    before = refused()
    assert None not in before.values(), before
    procs = {name: peers("prefill", "tcp", env=env) for name, env in (
        ("none", {}), ("other-tenant", cred_env(acl_certs, "other-tenant")),
        ("reader", cred_env(acl_certs, "reader")))}
    te = TransferEngine()
    with monkeypatch.context() as mp:  # the engine's credentials: read at its initialize
        mp.delenv("KVPOOL_TE_PEERS", raising=False)
        for k, v in acl_env(acl_certs, "decode").items():
            mp.setenv(k, v)
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = te.allocate_managed_buffer(1 << 16)
    assert te.write_bytes_to_buffer(buf, b"\x11" * 4096, 4096) == 0
    target = f"127.0.0.1:{te.get_rpc_port()}"
    for name, p in procs.items():
        r = p.ask(op="raw", target=target, remote=buf, length=4096, write=True)
        assert (r["rc"], r["status"]) == (-1, S["KVP_ERR_DENIED"]), (name, r)
    r = procs["reader"].ask(op="raw", target=target, remote=buf + (1 << 16) - 100, length=4096,
                            write=False)
    assert (r["rc"], r["status"]) == (-1, S["KVP_ERR_OUT_OF_RANGE"]), r
    assert te.read_bytes_from_buffer(buf, 4096) == b"\x11" * 4096
    m = te.metrics()
    after = refused()
    got = {r: after[r] - before[r] for r in reasons}
    assert got == {"auth": m["refused_auth"], "tenant": m["refused_tenant"],
                   "role": m["refused_role"], "range": m["refused_range"]}, (got, m)
    assert got["auth"] >= 1 and got["tenant"] >= 1 and got["role"] >= 1 and got["range"] == 1, got
    te.close()
    assert refused() == after  # a destroyed engine's counts stay
