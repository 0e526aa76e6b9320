"""Mooncake's BufferPool on kvpool (mooncake.store.BufferPool, mooncake.BufferPool):
leases of registered memory that carry a batch's bytes to and from a real pool, the
pool's bounds and refusals as Mooncake's (buffer_pool.cpp), and memory that a view
still reads never handed to another lease."""

import ctypes
import gc
import os
import threading
import time

import pytest

from mooncake.store import BufferLease, BufferPool, MooncakeDistributedStore

MIB = 1 << 20


@pytest.fixture
def store(pool):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 4 * MIB, "tcp", "", pool.addr) == 0
    yield s
    s.close()


def test_leases_carry_a_batch_both_ways(store, prefix):
    bp = BufferPool(store, min_size_class=4096, alignment=4096)
    sizes = [1, 4096, 300000, 1 * MIB]
    data = [os.urandom(n) for n in sizes]
    keys = [f"{prefix}{i}" for i in range(len(sizes))]
    put = [bp.acquire(n) for n in sizes]
    for lease, d in zip(put, data):
        assert lease.size == len(d) and lease.ptr % 64 == 0
        view = lease.buffer
        view[:] = d
        del view
    assert store.batch_put_from(keys, [x.ptr for x in put], sizes) == [0] * len(sizes)
    for lease in put:
        lease.release()
    got = [bp.acquire(n) for n in sizes]
    assert store.batch_get_into(keys, [x.ptr for x in got], sizes) == sizes
    for lease, d in zip(got, data):
        assert bytes(lease.buffer) == d
    # leases are disjoint memory
    spans = sorted((x.ptr, x.ptr + x.size) for x in got)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    for lease in got:
        lease.release()
    bp.close()


def test_overflow_past_the_local_buffer_and_the_pool_bound(store):
    bp = BufferPool(store, block_on_exhaustion=False)  # 4 MiB local: 8 MiB in all
    local = bp.acquire(4 * MIB)
    over = bp.acquire(3 * MIB)  # the local buffer is full: a region of its own
    assert not (local.ptr <= over.ptr < local.ptr + 4 * MIB)
    ctypes.memset(over.ptr, 0x5A, over.size)
    assert bytes(over.buffer[:3]) == b"ZZZ"
    with pytest.raises(RuntimeError, match="exhausted"):
        bp.acquire(2 * MIB)
    with pytest.raises(RuntimeError, match="capacity"):
        bp.acquire(8 * MIB + 1)
    over.release()
    again = bp.acquire(2 * MIB)
    again.release()
    local.release()
    bp.close()


def test_views_hold_their_lease(store):
    bp = BufferPool(store, min_size_class=4096, alignment=4096)
    lease = bp.acquire(64)
    view = lease.buffer
    view[:4] = b"keep"
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()
    with pytest.raises(RuntimeError, match="active leases"):
        bp.close()
    # the lease dropped while its view lives: its memory is not given to another lease
    held = lease.ptr
    del lease
    gc.collect()
    others = [bp.acquire(64) for _ in range(8)]
    assert held not in {o.ptr for o in others}
    assert bytes(view[:4]) == b"keep"
    for o in others:
        o.release()
    del view
    gc.collect()
    with bp.acquire(64) as back:  # given back once the view went
        assert back.size == 64
    bp.close()
    with pytest.raises(RuntimeError, match="closed"):
        bp.acquire(1)


def test_waiters_wake_on_release_and_time_out(store):
    bp = BufferPool(store, min_size_class=4096, max_size_class=4096, alignment=4096,
                    max_regions=1)
    lease = bp.acquire(1)
    with pytest.raises(RuntimeError, match="timed out"):
        bp.acquire(1, timeout=0.05)
    with pytest.raises(RuntimeError, match="exhausted"):
        bp.acquire(1, block=False)
    got = []
    t = threading.Thread(target=lambda: got.append(bp.acquire(1)))
    t.start()
    time.sleep(0.1)
    assert not got
    lease.release()
    t.join(5)
    assert len(got) == 1 and isinstance(got[0], BufferLease)
    got[0].release()
    bp.close()


def test_refusals(pool):
    s = MooncakeDistributedStore()
    with pytest.raises(RuntimeError, match="not initialized"):
        BufferPool(s)
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", pool.addr) == 0
    try:
        with pytest.raises(RuntimeError, match="local buffer"):
            BufferPool(s)
    finally:
        s.close()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, MIB, "tcp", "", pool.addr) == 0
    try:
        with pytest.raises(RuntimeError, match="alignment"):
            BufferPool(s, alignment=12345)
        bp = BufferPool(s)
        with pytest.raises(TypeError):
            bp.acquire(-1)
        with pytest.raises(RuntimeError, match="capacity"):
            bp.acquire((1 << 64) - 1)
        bp.close()
    finally:
        s.close()


def test_top_level_names():
    import mooncake
    from mooncake import BufferPool as Top
    from mooncake import RegisteredBufferPool
    from mooncake.buffer_pool import BufferPool as Mod

    assert Top is RegisteredBufferPool is Mod is BufferPool
    assert set(mooncake.__all__) == {"BufferPool", "RegisteredBufferPool"}
    with pytest.raises(AttributeError):
        mooncake.NoSuchName  # noqa: B018
