"""mooncake.engine's RpcInterface on kvpool (Mooncake's channel for bytes and tensors between
processes): bytes and tensors delivered exactly to the server's callbacks, 0 once they ran,
-1 (or a failed future) for a peer that is not there; what a stranger gets: another user of
this host refused in protected mode, a client without the CA's certificate (or a revoked one)
refused with TLS, a frame that is not ours or trickles closed within the timeout, each
counted, the server serving on. Real processes and sockets on 127.0.0.1."""

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import free_port
from mooncake.engine import (CoroRPCInterface, ReceivedTensor, RpcInterface, create_rpc_client,
                             create_rpc_server)
from test_security import certs  # noqa: F401 (fixture)

TLS_VARS = ("KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_TLS_CA", "KVPOOL_TLS_CRL")


@pytest.fixture
def no_tls(monkeypatch):
    for v in TLS_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.delenv("KVPOOL_AUTH", raising=False)


def server(timeout=5):
    """(server, its address, what its callbacks got)."""
    got = []
    port = free_port()
    s = RpcInterface()
    assert s.initialize_server(f"127.0.0.1:{port}", 4, timeout)
    s.set_data_receive_callback(got.append)
    s.set_tensor_receive_callback(got.append)
    assert s.start_server_async()
    return s, f"127.0.0.1:{port}", got


def test_bytes_and_tensors_arrive_exactly(no_tls):
    torch = pytest.importorskip("torch")
    s, addr, got = server()
    c = create_rpc_client()
    try:
        big = os.urandom(8 << 20)
        assert c.send_data(addr, b"hello") == 0
        assert c.send_data(addr, big) == 0
        assert c.send_data(addr, bytearray(b"")) == 0
        assert got[:3] == [{"source": "", "data": b"hello"}, {"source": "", "data": big},
                           {"source": "", "data": b""}]
        t = torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, ::2]  # not contiguous
        assert c.send_tensor(addr, t) == 0
        r = got[3]
        assert isinstance(r, ReceivedTensor) and r.shape == [3, 2] and r.dtype == "float32"
        assert r.get_data_as_bytes() == t.contiguous().numpy().tobytes() == bytes(
            r.get_memory_view()) and r.total_bytes == r.get_data_size() == 24
        bf = torch.ones(5, dtype=torch.bfloat16)
        assert c.send_tensor(addr, bf) == 0 and got[4].dtype == "bfloat16"
        # a server that listens names itself as the source
        s2, addr2, got2 = server()
        assert s2.send_data(addr, b"from s2") == 0
        assert got[5] == {"source": addr2, "data": b"from s2"}
        s2.stop_server()
        # the async forms: a future of the loop given
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(c.send_data_async(addr, b"a", loop)) == 0
            dead = f"127.0.0.1:{free_port()}"
            with pytest.raises(RuntimeError):
                loop.run_until_complete(c.send_data_async(dead, b"a", loop))
        finally:
            loop.close()
        assert got[6] == {"source": "", "data": b"a"}
        assert c.send_data(dead, b"x") == -1 and c.send_tensor(dead, t) == -1
        assert c.send_tensor(addr, [1, 2]) == -1  # not a tensor
        assert CoroRPCInterface is RpcInterface
        assert create_rpc_server()._listen == "0.0.0.0:8080"  # Mooncake's (not started)
    finally:
        s.stop_server()
        c.close()


def test_bad_frames_and_trickles_are_closed(no_tls):
    s, addr, got = server(timeout=2)
    host, port = addr.split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=10) as k:
            k.sendall(b"NOPE" + bytes(15))
            assert k.recv(16) == b""  # closed, nothing answered
        t0 = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=10) as k:
            k.sendall(b"K")  # then nothing more: cut at the timeout
            try:
                assert k.recv(16) == b""
            except ConnectionResetError:
                pass
        assert time.monotonic() - t0 < 2 + 2
        assert s.refused >= 1 and got == []
        c = RpcInterface()
        assert c.initialize_client()
        assert c.send_data(addr, b"still serving") == 0
        assert got == [{"source": "", "data": b"still serving"}]
    finally:
        s.stop_server()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a peer as another user")
def test_another_user_of_this_host_is_refused(no_tls):
    s, addr, got = server()
    try:
        code = ("import sys; from mooncake.engine import RpcInterface as R; c = R(); "
                "c.initialize_client(); sys.exit(0 if c.send_data(sys.argv[1], b'x') == -1 "
                "else 3)")
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            sys.executable, "-c", code, addr], env=dict(os.environ),
                           capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        assert got == [] and s.refused == 1
    finally:
        s.stop_server()


def test_with_tls_only_the_cas_certificates(certs, monkeypatch):  # noqa: F811
    # the receiving side presents a server certificate (make-certs.sh's server.crt), the
    # sender a principal's client certificate
    for var, v in (("KVPOOL_TLS_CERT", certs.server_crt), ("KVPOOL_TLS_KEY", certs.server_key),
                   ("KVPOOL_TLS_CA", certs.ca), ("KVPOOL_TLS_CRL", certs.crl)):
        monkeypatch.setenv(var, v)
    s, addr, got = server()
    crt, key = certs.pair("alice")
    monkeypatch.setenv("KVPOOL_TLS_CERT", crt)
    monkeypatch.setenv("KVPOOL_TLS_KEY", key)
    try:
        c = RpcInterface()
        assert c.initialize_client()
        assert c.send_data(addr, b"over tls") == 0
        assert got == [{"source": "", "data": b"over tls"}]
        refused = s.refused
        for who in ("revoked", "rogue", None):  # a revoked one, another CA's, none at all
            if who is None:
                monkeypatch.delenv("KVPOOL_TLS_CERT")
            else:
                monkeypatch.setenv("KVPOOL_TLS_CERT", certs.pair(who)[0])
                monkeypatch.setenv("KVPOOL_TLS_KEY", certs.pair(who)[1])
            stranger = RpcInterface()
            assert stranger.initialize_client(timeout_seconds=5)
            assert stranger.send_data(addr, b"let me in") == -1
        deadline = time.monotonic() + 5
        while s.refused < refused + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.refused == refused + 3 and len(got) == 1
        # and a sender does not send to a receiver of another CA
        monkeypatch.setenv("KVPOOL_TLS_CERT", certs.pair("rogue")[0])
        monkeypatch.setenv("KVPOOL_TLS_KEY", certs.pair("rogue")[1])
        rogue, rogue_addr, rogue_got = server()
        monkeypatch.setenv("KVPOOL_TLS_CERT", crt)
        monkeypatch.setenv("KVPOOL_TLS_KEY", key)
        assert c.send_data(rogue_addr, b"secret") == -1 and rogue_got == []
        rogue.stop_server()
    finally:
        s.stop_server()


def test_connections_past_the_cap_are_closed(no_tls):
    s, addr, got = server()
    host, port = addr.split(":")
    held = []
    try:
        for _ in range(8):  # the cap (thread_count 4 -> 8 at least)
            held.append(socket.create_connection((host, int(port)), timeout=10))
        time.sleep(0.3)
        with socket.create_connection((host, int(port)), timeout=10) as k:
            assert k.recv(1) == b""  # closed at once
        assert s.refused >= 1
    finally:
        for k in held:
            k.close()
        s.stop_server()
