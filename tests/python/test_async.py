"""asyncio on the async C queue: aget, aput, aexists, abatch_*."""

import asyncio
import threading

import numpy as np
import pytest

import kvpool


def run(coro):
    return asyncio.run(coro)


def test_1000_concurrent_gets_one_loop(client, prefix):
    keys = [f"{prefix}{i}" for i in range(1000)]
    vals = [f"value-{i}-".encode() * (1 + i % 50) for i in range(1000)]
    assert client.batch_put(keys, vals) == [0] * 1000

    async def main():
        threads_before = threading.active_count()
        tasks = [asyncio.ensure_future(client.aget(k)) for k in keys]
        # no thread per call: the batches run on the queue's fixed C workers
        assert threading.active_count() == threads_before
        return await asyncio.gather(*tasks)

    assert run(main()) == vals


def test_async_methods(client, prefix):
    async def main():
        k = prefix + "a"
        assert not await client.aexists(k)
        await client.aput(k, b"async bytes")
        assert await client.aexists(k)
        assert await client.aget(k) == b"async bytes"
        with pytest.raises(kvpool.Error) as ei:
            await client.aput(k, b"again")
        assert ei.value.status == kvpool.ERR_EXISTS
        await client.aput(k, b"replaced", upsert=True)
        assert await client.aget(k) == b"replaced"
        with pytest.raises(kvpool.Error) as ei:
            await client.aget(prefix + "missing")
        assert ei.value.status == kvpool.ERR_NOT_FOUND and prefix in str(ei.value)
        buf = bytearray(64)
        assert await client.aget_into(k, buf) == 8 and bytes(buf[:8]) == b"replaced"
        arrs = [np.full(n, n % 251, np.uint8) for n in (1, 1000, 300000)]
        keys = [f"{prefix}n{i}" for i in range(3)]
        assert await client.abatch_put(keys, arrs) == [0, 0, 0]
        assert await client.abatch_exists(keys + [prefix + "x"]) == [True] * 3 + [False]
        outs = [np.zeros_like(a) for a in arrs]
        assert await client.abatch_get_into(keys, outs) == [a.nbytes for a in arrs]
        assert all(np.array_equal(a, o) for a, o in zip(arrs, outs))
        # pointer pairs too; too small and missing come back per key
        small = np.zeros(10, np.uint8)
        res = await client.abatch_get_into([keys[2], prefix + "x"],
                                           [(small.ctypes.data, 10), (small.ctypes.data, 10)])
        assert res == [kvpool.ERR_BUFFER_TOO_SMALL, kvpool.ERR_NOT_FOUND]
        # a large object after small ones: aget grows its buffer and reads again
        big = np.random.default_rng(0).integers(0, 255, 5 << 20, dtype=np.uint8)
        await client.aput(prefix + "big", big)
        assert await client.aget(prefix + "big") == big.tobytes()
        # a failure on a queue worker: the status's text, not this thread's last error
        with pytest.raises(kvpool.Error):
            client.get(prefix + "sync-miss")
        with pytest.raises(kvpool.Error) as ei:
            await client.abatch_exists([k, ""])
        assert ei.value.status == kvpool.ERR_BAD_KEY and "sync-miss" not in str(ei.value)
        # bad input raises at the call, nothing submitted
        with pytest.raises(TypeError):
            await client.abatch_put([1], [b"x"])
        with pytest.raises(ValueError):
            await client.abatch_get_into([k, k], [bytearray(1)])

    run(main())


def test_more_than_the_queue_holds(client, prefix):
    """Beyond KVP_AQ_MAX_INFLIGHT batches in flight, the rest wait for room."""
    client.put(prefix + "k", b"v")

    async def main():
        n = 3000
        res = await asyncio.gather(*[client.aexists(prefix + ("k" if i % 2 else "x"))
                                     for i in range(n)])
        assert res == [bool(i % 2) for i in range(n)]

    run(main())


def test_cancel_and_several_loops(client, prefix):
    keys = [f"{prefix}{i}" for i in range(50)]
    client.batch_put(keys, [k.encode() for k in keys])

    async def cancelled():
        futs = [asyncio.ensure_future(client.aget(k)) for k in keys]
        for f in futs[::2]:
            f.cancel()
        done = await asyncio.gather(*futs, return_exceptions=True)
        for i, r in enumerate(done):
            if i % 2:
                assert r == keys[i].encode()
            else:
                assert isinstance(r, asyncio.CancelledError)

    run(cancelled())

    # one client, a loop in each of 4 threads: each completion reaches its own loop
    errors = []

    def thread_loop(t):
        try:
            async def main():
                for _ in range(5):
                    got = await asyncio.gather(*[client.aget(k) for k in keys])
                    assert got == [k.encode() for k in keys]
            asyncio.run(main())
        except Exception as e:
            errors.append(repr(e))

    ts = [threading.Thread(target=thread_loop, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_close_with_batches_in_flight(pool, prefix):
    c = kvpool.Client(pool.addr)
    c.put(prefix + "k", b"v" * 1000)

    async def main():
        futs = [asyncio.ensure_future(c.aget(prefix + "k")) for _ in range(200)]
        await asyncio.sleep(0)  # submitted
        c.close()
        res = await asyncio.gather(*futs, return_exceptions=True)
        for r in res:
            assert r == b"v" * 1000 or (isinstance(r, kvpool.Error)
                                        and r.status == kvpool.ERR_SHUTDOWN), r
        with pytest.raises(kvpool.Error):
            await c.aget(prefix + "k")

    run(main())
