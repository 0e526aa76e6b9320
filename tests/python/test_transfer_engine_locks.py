"""The transfer engine holds no lock while bytes cross a socket or a peer copies (issue 65):
a stalled peer delays only the unregister of the region it is stalled on; other regions'
unregisters and other peers' batches go on at once; two engines of one process serve the
shm one-copy path at the same time. Engines in this process (mooncake.engine), the stalled
peers raw sockets speaking the data frames (client/transport/wire.h)."""

import socket
import struct
import threading
import time

import numpy as np
import pytest

from kvpool import _kvpool
from mooncake.engine import TransferEngine

S = _kvpool.STATUS
CRED_VARS = ("KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_TLS_CRL",
             "KVPOOL_TE_PEERS", "KVPOOL_TE_ACL", "KVPOOL_TOKEN")
MAGIC, TE_ID = 0x4450564B, 0x4b56505445  # "KVPD"; "KVPTE": the engine's segment id
OP_READ, OP_TE_CMA, CMA_WRITE = 1, 13, 0x1
MIB = 1 << 20


@pytest.fixture
def plain_env(monkeypatch):
    """Engines without credentials (the suite's TLS pass sets them for all): the stalled
    peers here are raw sockets that prove nothing."""
    for v in CRED_VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def req(op, offset, length, flags=0):
    return struct.pack("<IHHQQQ", MAGIC, op, flags, TE_ID, offset, length)


def recv_exact(s, n):
    got = b""
    while len(got) < n:
        b = s.recv(n - len(got))
        assert b, "closed"
        got += b
    return got


def in_thread(fn, *a):
    """fn(*a) on a thread of its own: (thread, result list)."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*a)), daemon=True)
    t.start()
    return t, out


def array(nbytes, fill):
    return np.full(nbytes, fill, np.uint8)


def test_a_stalled_peer_holds_only_its_own_region(plain_env):
    """A peer asks a READ of a 64 MiB region and never reads the answer (the target's send
    blocks on a full socket): an unregister of another region returns at once, another
    peer's writes and reads of a third region are byte-exact at once, and the stalled
    region's own unregister waits until the stalled peer leaves, then refuses the range.
    Before: the target held the regions' read lock while it sent, so the unregister waited
    for the stalled send (its frame's deadline, 30 s and more) and, the lock preferring
    writers, every other connection's request queued behind it."""
    tgt, ini = TransferEngine(), TransferEngine()
    assert tgt.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert ini.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    target = f"127.0.0.1:{tgt.get_rpc_port()}"
    a, b, c = array(64 * MIB, 0xA1), array(MIB, 0xB2), array(MIB, 0xC3)
    for buf in (a, b, c):
        assert tgt.register_memory(buf.ctypes.data, buf.nbytes) == 0
    src = array(MIB, 0)
    src[:] = np.random.default_rng(7).integers(0, 256, MIB, np.uint8)
    back = array(MIB, 0)
    assert ini.register_memory(src.ctypes.data, MIB) == 0
    assert ini.register_memory(back.ctypes.data, MIB) == 0

    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", tgt.get_rpc_port()))
    try:
        stalled.sendall(req(OP_READ, a.ctypes.data, a.nbytes))
        head = recv_exact(stalled, 16)  # the answer began: the target is sending, blocked
        assert struct.unpack("<IiQ", head) == (MAGIC, 0, a.nbytes)
        time.sleep(0.3)

        t, out = in_thread(tgt.unregister_memory, b.ctypes.data)
        t.join(3)
        assert not t.is_alive(), "an unregister of another region waited for the stalled peer"
        assert out == [0]

        t0 = time.monotonic()
        t, out = in_thread(ini.transfer_sync_write, target, src.ctypes.data, c.ctypes.data, MIB)
        t.join(5)
        assert not t.is_alive() and out == [0], "another peer's write waited"
        assert np.array_equal(c, src)
        t, out = in_thread(ini.transfer_sync_read, target, back.ctypes.data, c.ctypes.data + 5,
                           MIB - 5)
        t.join(5)
        assert not t.is_alive() and out == [0], "another peer's read waited"
        assert np.array_equal(back[:MIB - 5], src[5:])
        assert time.monotonic() - t0 < 5
        # the unregistered region: refused, its bytes intact
        assert ini.transfer_sync_write(target, src.ctypes.data, b.ctypes.data, 4096) == -1
        assert ini.last_status == S["KVP_ERR_OUT_OF_RANGE"]
        assert (b == 0xB2).all()

        # the stalled region's own unregister waits for the stalled peer, and for it only
        t, out = in_thread(tgt.unregister_memory, a.ctypes.data)
        t.join(1)
        assert t.is_alive(), "the unregister did not wait for the bytes being sent from it"
        assert ini.transfer_sync_write(target, src.ctypes.data, c.ctypes.data, MIB) == 0
    finally:
        stalled.close()
    t.join(10)
    assert not t.is_alive() and out == [0]
    assert ini.transfer_sync_read(target, back.ctypes.data, a.ctypes.data, 4096) == -1
    assert ini.last_status == S["KVP_ERR_OUT_OF_RANGE"]
    # the target serves on
    assert ini.transfer_sync_read(target, back.ctypes.data, c.ctypes.data, MIB) == 0
    assert np.array_equal(back, src)
    ini.close()
    tgt.close()


def test_two_engines_of_one_process_serve_the_shm_copy_at_once(plain_env):
    """Two target engines in this process; a peer asks engine X for a one-copy shm write
    (TE_CMA) and, answered, never says it is done. Meanwhile an initiator's one-copy batches
    (KVPOOL_TE_SHM=cma-checked: one TE_CMA a batch) into engine Y, and into another region of
    X, are byte-exact at once and served by the copy (counted), and X's other region
    unregisters at once. Before: the stalled copy held a lock of the whole process (the
    ptracer window, taken even with no Yama restriction) and X's regions' read lock, so Y's
    batches and X's waited for the stalled peer's deadline."""
    plain_env.setenv("KVPOOL_TE_SHM", "cma-checked")
    x, y, ini = TransferEngine(), TransferEngine(), TransferEngine()
    for e in (x, y, ini):
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "shm", "") == 0
    xa, xb, xc, ya = array(MIB, 0x11), array(MIB, 0x22), array(MIB, 0x33), array(MIB, 0x44)
    for e, buf in ((x, xa), (x, xb), (x, xc), (y, ya)):
        assert e.register_memory(buf.ctypes.data, buf.nbytes) == 0
    src = np.random.default_rng(8).integers(0, 256, MIB, np.uint8)
    assert ini.register_memory(src.ctypes.data, MIB) == 0

    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.connect(f"\0kvpool-te-{x.get_rpc_port()}")
    try:
        stalled.sendall(req(OP_TE_CMA, 1, MIB, CMA_WRITE) +
                        struct.pack("<QQQ", TE_ID, xa.ctypes.data, MIB))
        assert struct.unpack("<IiQ", recv_exact(stalled, 16))[:2] == (MAGIC, 0)
        # answered: it may copy now, and never says it is done

        for e, dst in ((y, ya), (x, xc)):
            before = e.metrics()["served_cma_writes"]
            t, out = in_thread(ini.transfer_sync_write, f"127.0.0.1:{e.get_rpc_port()}",
                               src.ctypes.data, dst.ctypes.data, MIB)
            t.join(5)
            assert not t.is_alive() and out == [0], "a one-copy batch waited for the stalled peer"
            assert np.array_equal(dst, src)
            # the copy, not the socket (counted when the target reads the peer's done, which
            # the peer does not wait for: a moment later on a loaded machine)
            until = time.monotonic() + 5
            while e.metrics()["served_cma_writes"] != before + 1 and time.monotonic() < until:
                time.sleep(0.01)
            assert e.metrics()["served_cma_writes"] == before + 1
        t, out = in_thread(x.unregister_memory, xb.ctypes.data)
        t.join(3)
        assert not t.is_alive() and out == [0]
        t, out = in_thread(x.unregister_memory, xa.ctypes.data)
        t.join(1)
        assert t.is_alive(), "the stalled copy's region unregistered under it"
    finally:
        stalled.close()
    t.join(10)
    assert not t.is_alive() and out == [0]
    assert (xa == 0x11).all() and (xb == 0x22).all()  # the stalled peer wrote nothing
    for e in (ini, x, y):
        e.close()
