"""One MooncakeDistributedStore shared by 8 Python threads for 20 s, as vLLM
shares one across its send, receive and lookup threads: a mix of puts, gets
and exists over a shared key space, every byte read checked."""

import os
import random
import threading
import time
import zlib

import numpy as np

from conftest import freeze
from mooncake.store import MooncakeDistributedStore

THREADS, SECONDS, NKEYS = 8, 20.0, 512


def payload(key):
    """The bytes every thread expects under `key` (size and content from the key)."""
    h = zlib.crc32(key.encode())
    size = 1024 + h % (48 << 10)
    return ((np.arange(size, dtype=np.uint32) * (h | 1) + h) >> 7).astype(np.uint8)


def test_threads_share_one_store(make_pool):
    # default master: read leases on, so a remove racing a get is refused (LEASED)
    # instead of pulling the bytes from under it
    pool = make_pool(segments=("64MiB",), master_args=())
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "", 16 << 20, 16 << 20, "auto", "", pool.addr) == 0
    keys = [f"thr@blk-{i}" for i in range(NKEYS)]
    data = {k: payload(k) for k in keys}
    stats = {"ops": 0, "bytes_checked": 0, "hits": 0}
    errors = []
    lock = threading.Lock()
    deadline = time.monotonic() + SECONDS

    def worker(tid):
        rng = random.Random(tid)
        ops = hits = checked = 0
        try:
            while time.monotonic() < deadline:
                op = rng.randrange(8)
                ks = rng.sample(keys, rng.randint(1, 16))
                if op == 0:  # batch put from pointers
                    arrs = [data[k] for k in ks]
                    res = store.batch_put_from(ks, [a.ctypes.data for a in arrs],
                                               [a.nbytes for a in arrs])
                    assert all(r == 0 for r in res), res
                elif op == 1:  # batch get into numpy buffers
                    outs = [np.empty(data[k].nbytes, np.uint8) for k in ks]
                    res = store.batch_get_into(ks, [o.ctypes.data for o in outs],
                                               [o.nbytes for o in outs])
                    for k, o, r in zip(ks, outs, res):
                        assert r == data[k].nbytes or r == -704, (k, r)
                        if r > 0:
                            assert np.array_equal(o, data[k]), k
                            hits += 1
                            checked += r
                elif op == 2:  # exists
                    res = store.batch_is_exist(ks)
                    assert all(r in (0, 1) for r in res), res
                    assert store.is_exist(ks[0]) in (0, 1)
                elif op == 3:  # single put / get
                    k = ks[0]
                    assert store.put(k, data[k]) == 0
                    got = store.get(k)
                    if got:
                        assert got == data[k].tobytes(), k
                        hits += 1
                        checked += len(got)
                elif op == 4:  # multi-buffer put: the object in two halves
                    arrs = [data[k] for k in ks]
                    res = store.batch_put_from_multi_buffers(
                        ks, [[a.ctypes.data, a.ctypes.data + a.nbytes // 2] for a in arrs],
                        [[a.nbytes // 2, a.nbytes - a.nbytes // 2] for a in arrs])
                    assert all(r == 0 for r in res), res
                elif op == 5:  # multi-buffer get: scattered into two buffers
                    outs = [(np.empty(100, np.uint8), np.empty(data[k].nbytes, np.uint8))
                            for k in ks]
                    res = store.batch_get_into_multi_buffers(
                        ks, [[a.ctypes.data, b.ctypes.data] for a, b in outs],
                        [[a.nbytes, b.nbytes] for a, b in outs])
                    for k, (a, b), r in zip(ks, outs, res):
                        assert r == data[k].nbytes or r == -704, (k, r)
                        if r > 0:
                            got = np.concatenate([a, b])[:r]
                            assert np.array_equal(got, data[k]), k
                            hits += 1
                            checked += r
                elif op == 6:  # remove a few (refused while read: -706, or being written: -703)
                    for k in ks[:2]:
                        assert store.remove(k) in (0, -704, -706, -703)
                else:  # get into a buffer handle
                    hs = store.batch_get_buffer(ks[:4])
                    for k, h in zip(ks, hs):
                        if h is not None:
                            assert bytes(h) == data[k].tobytes(), k
                            hits += 1
                            checked += len(h)
                ops += 1
        except BaseException as e:  # reported by the main thread
            with lock:
                errors.append(f"thread {tid}: {e!r}")
        with lock:
            stats["ops"] += ops
            stats["hits"] += hits
            stats["bytes_checked"] += checked

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("threads:", stats)
    assert not errors, errors[:5]
    assert stats["ops"] > 2000 and stats["hits"] > 1000, stats
    assert store.close() == 0


def _max_gap_while(fn):
    """Run fn in a thread; the longest this thread went without running meanwhile."""
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", _catch(fn)))
    t.start()
    last, gap = time.monotonic(), 0.0
    while t.is_alive():
        time.sleep(0.005)
        now = time.monotonic()
        gap, last = max(gap, now - last), now
    t.join()
    return gap, out["r"]


def _catch(fn):
    try:
        return fn()
    except Exception as e:
        return e


def test_gil_released_while_calls_block(make_pool):
    """A call blocked in libkvpool (a master that never answers; a segment
    server stopped with SIGSTOP) does not stop the other Python threads."""
    import signal
    import socket

    import kvpool

    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(1)  # the kernel accepts the connection; nobody ever answers
    try:
        addr = "127.0.0.1:%d" % mute.getsockname()[1]
        gap, r = _max_gap_while(lambda: kvpool.Client(addr, segment_size=1 << 20,
                                                       rpc_timeout_ms=1500))
        assert isinstance(r, kvpool.Error) and r.status == kvpool.ERR_TIMEOUT, r
        assert gap < 0.5, gap
    finally:
        mute.close()

    pool = make_pool()
    with kvpool.Client(pool.addr, transport="tcp", rpc_timeout_ms=1500) as c:
        c.put("gil@k", b"x" * 100000)
        seg = pool.segments[0]
        freeze(seg.pid)  # our child, by its PID; every thread stopped
        try:
            out = bytearray(100000)
            gap, r = _max_gap_while(lambda: c.batch_get_into(["gil@k"], [out]))
        finally:
            os.kill(seg.pid, signal.SIGCONT)
        # the only key timed out: the call failed as a whole, so it raises
        assert isinstance(r, kvpool.Error) and r.status == kvpool.ERR_TIMEOUT, r
        assert "gil@k" in str(r)
        assert gap < 0.5, gap
        assert c.get("gil@k") == b"x" * 100000
