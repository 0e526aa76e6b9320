"""kvpool.Client, the native API: every method, its errors, numpy buffers."""

import ctypes
import re

import numpy as np
import pytest

import kvpool
from kvpool import _kvpool


def test_status_table_matches_public_header():
    """kvpool.STATUS (from common/status_list.h) == client/include/kvpool_status.h."""
    import pathlib

    hdr = pathlib.Path(__file__).resolve().parents[2] / "client/include/kvpool_status.h"
    pairs = dict((n, int(v)) for n, v in re.findall(r"^\s*(KVP_\w+) = (-?\d+),", hdr.read_text(),
                                                    re.M))
    assert pairs == kvpool.STATUS
    assert kvpool.OK == 0 and kvpool.ERR_NOT_FOUND == -3 and kvpool.ERR_EXISTS == -4
    assert kvpool.STATUS_NAMES[-5] == "KVP_ERR_POOL_FULL"


def test_parse_size():
    assert kvpool.parse_size(4096) == 4096
    assert kvpool.parse_size("4GB") == 4 << 30
    assert kvpool.parse_size("512MB") == 512 << 20
    assert kvpool.parse_size("64MiB") == 64 << 20
    assert kvpool.parse_size("1.5 KB") == 1536
    assert kvpool.parse_size("1024") == 1024
    for bad in ("-1", "4XB", "", "GB"):
        with pytest.raises(ValueError):
            kvpool.parse_size(bad)
    with pytest.raises(ValueError):
        kvpool.parse_size(-1)
    with pytest.raises(TypeError):
        kvpool.parse_size(None)


def test_put_get_exists_remove(client, prefix):
    k = prefix + "a"
    assert not client.exists(k)
    client.put(k, b"hello")
    assert client.exists(k)
    assert client.get(k) == b"hello"
    assert client.size(k) == 5
    with pytest.raises(kvpool.Error) as ei:
        client.put(k, b"again")
    assert ei.value.status == kvpool.ERR_EXISTS and ei.value.name == "KVP_ERR_EXISTS"
    client.put(k, b"replaced!", upsert=True)
    assert client.get(k) == b"replaced!"
    client.remove(k)
    assert not client.exists(k)
    with pytest.raises(kvpool.Error) as ei:
        client.remove(k)
    assert ei.value.status == kvpool.ERR_NOT_FOUND


def test_get_miss_raises_with_message(client, prefix):
    with pytest.raises(kvpool.Error) as ei:
        client.get(prefix + "missing")
    e = ei.value
    assert e.status == kvpool.ERR_NOT_FOUND and e.name == "KVP_ERR_NOT_FOUND"
    assert "not found" in str(e) and prefix in str(e)
    assert isinstance(e, Exception)


def test_put_any_buffer_zero_copy_sources(client, prefix):
    a = np.arange(4096, dtype=np.float32)
    client.put(prefix + "np", a)
    client.put(prefix + "ba", bytearray(b"xyz"))
    client.put(prefix + "mv", memoryview(b"0123456789")[2:5])
    assert client.get(prefix + "np") == a.tobytes()
    assert client.get(prefix + "ba") == b"xyz"
    assert client.get(prefix + "mv") == b"234"
    # 2-D array, C order: the bytes in memory order
    m = np.arange(64, dtype=np.int16).reshape(8, 8)
    client.put(prefix + "2d", m)
    assert client.get(prefix + "2d") == m.tobytes()


def test_get_into_numpy_and_pointer(client, prefix):
    a = np.random.default_rng(1).integers(0, 255, 100000, dtype=np.uint8)
    client.put(prefix + "x", a)
    out = np.zeros(200000, dtype=np.uint8)
    assert client.get_into(prefix + "x", out) == a.size
    assert np.array_equal(out[: a.size], a) and not out[a.size:].any()
    out2 = np.zeros(a.size, dtype=np.uint8)
    assert client.get_into(prefix + "x", (out2.ctypes.data, out2.nbytes)) == a.size
    assert np.array_equal(out2, a)
    with pytest.raises(kvpool.Error) as ei:
        client.get_into(prefix + "x", np.zeros(10, np.uint8))
    assert ei.value.status == kvpool.ERR_BUFFER_TOO_SMALL


def test_put_from_pointer(client, prefix):
    buf = ctypes.create_string_buffer(b"raw memory", 10)
    client.put_from(prefix + "p", ctypes.addressof(buf), 10)
    assert client.get(prefix + "p") == b"raw memory"


def test_put_configs(client, prefix):
    client.put(prefix + "soft", b"s", pin="soft", soft_pin_ttl_s=60)
    client.put(prefix + "hard", b"h", pin=kvpool.PIN_HARD)
    client.put(prefix + "local", b"l", preferred_segment=kvpool.SEGMENT_LOCAL)
    keys = {k["key"]: k for k in client.list_keys("^" + re.escape(prefix))}
    assert keys[prefix + "soft"]["pin"] == kvpool.PIN_SOFT
    assert keys[prefix + "hard"]["pin"] == kvpool.PIN_HARD
    with pytest.raises(ValueError):
        client.put(prefix + "bad", b"x", pin="sometimes")
    with pytest.raises(ValueError):
        client.put(prefix + "bad", b"x", replicas=0)
    # two replicas need two segments: one is all there is, so one is written
    client.put(prefix + "two", b"2", replicas=2)
    assert client.get(prefix + "two") == b"2"


def test_batch_put_get_exists_numpy(client, prefix):
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (1, 100, 4096, 65536)]
    keys = [f"{prefix}b{i}" for i in range(len(arrays))]
    assert client.batch_put(keys, arrays) == [0] * len(keys)
    assert client.batch_exists(keys + [prefix + "none"]) == [True] * len(keys) + [False]
    assert client.cached_prefix(keys + [prefix + "none"] + keys) == len(keys)
    outs = [np.zeros_like(a) for a in arrays]
    assert client.batch_get_into(keys, outs) == [a.nbytes for a in arrays]
    for a, o in zip(arrays, outs):
        assert np.array_equal(a, o)
    # per key: a miss and a too-small buffer do not raise
    res = client.batch_get_into([keys[3], prefix + "none", keys[2]],
                                [np.zeros(1, np.float32), bytearray(8), np.zeros(4096, np.float32)])
    assert res == [kvpool.ERR_BUFFER_TOO_SMALL, kvpool.ERR_NOT_FOUND, 4096 * 4]
    # existing keys: per-key EXISTS
    assert client.batch_put(keys[:2], arrays[:2]) == [kvpool.ERR_EXISTS] * 2
    assert client.batch_get(keys[:2] + [prefix + "none"]) == [arrays[0].tobytes(),
                                                              arrays[1].tobytes(), None]
    assert client.batch_remove(keys + [prefix + "none"]) == [0] * len(keys) + [kvpool.ERR_NOT_FOUND]
    assert client.batch_exists(keys) == [False] * len(keys)
    # a per-key failure raises, naming that key
    with pytest.raises(kvpool.Error) as ei:
        client.batch_exists([keys[0], ""])
    assert ei.value.status == kvpool.ERR_BAD_KEY and str(ei.value).startswith("exist '': ")


def test_batch_pointer_pairs(client, prefix):
    """(address, size) pairs, as torch tensors give them (t.data_ptr(), t.nbytes)."""
    src = [np.full(n, i + 1, np.uint8) for i, n in enumerate((10, 1000, 123457))]
    keys = [f"{prefix}p{i}" for i in range(3)]
    assert client.batch_put(keys, [(a.ctypes.data, a.nbytes) for a in src]) == [0, 0, 0]
    dst = [np.zeros_like(a) for a in src]
    assert client.batch_get_into(keys, [(d.ctypes.data, d.nbytes) for d in dst]) == [
        a.nbytes for a in src]
    assert all(np.array_equal(a, d) for a, d in zip(src, dst))
    # empty batches
    assert client.batch_put([], []) == []
    assert client.batch_get_into([], []) == []
    assert client.batch_exists([]) == []


def test_multi_buffers(client, prefix):
    layers = [np.random.default_rng(i).integers(0, 255, 4096 * (i + 1), dtype=np.uint8)
              for i in range(4)]
    assert client.batch_put_multi([prefix + "m"], [layers]) == [0]
    whole = np.concatenate(layers)
    assert client.get(prefix + "m") == whole.tobytes()
    outs = [np.zeros_like(a) for a in layers]
    assert client.batch_get_into_multi([prefix + "m"], [outs]) == [whole.size]
    assert all(np.array_equal(a, o) for a, o in zip(layers, outs))
    # pointer pairs, scattered into different-sized pieces
    d = np.zeros(whole.size, np.uint8)
    parts = [(d.ctypes.data, 1000), (d.ctypes.data + 1000, whole.size - 1000)]
    assert client.batch_get_into_multi([prefix + "m"], [parts]) == [whole.size]
    assert np.array_equal(d, whole)
    small = [np.zeros(100, np.uint8)]
    assert client.batch_get_into_multi([prefix + "m", prefix + "none"], [small, small]) == [
        kvpool.ERR_BUFFER_TOO_SMALL, kvpool.ERR_NOT_FOUND]


def test_get_ranges(client, prefix):
    data = bytes(range(256)) * 4
    client.put(prefix + "r", data)
    a, b = bytearray(16), np.zeros(100, np.uint8)
    res = client.get_ranges([(prefix + "r", 10, a), (prefix + "r", 1000, (b.ctypes.data, 100)),
                             (prefix + "r", 5000, bytearray(4)), (prefix + "none", 0, a)])
    assert res[:2] == [16, 24]
    assert res[2] == kvpool.ERR_OUT_OF_RANGE and res[3] == kvpool.ERR_NOT_FOUND
    assert bytes(a) == data[10:26] and bytes(b[:24]) == data[1000:]


def test_register_buffer(client):
    a = np.zeros(1 << 20, np.uint8)
    client.register_buffer(a)
    with pytest.raises(kvpool.Error) as ei:
        client.register_buffer(a.ctypes.data, a.nbytes)
    assert ei.value.status == kvpool.ERR_EXISTS
    client.unregister_buffer(a)
    b = bytearray(8192)
    addr, n = _kvpool.buffer_info(b)
    client.register_buffer(addr, n)
    client.unregister_buffer(addr)
    with pytest.raises(TypeError):
        client.register_buffer(12345)  # an address needs a size


def test_stat_list_keys_segment(pool, prefix):
    with kvpool.Client(pool.addr, segment_size="8MiB", transport="tcp", rpc_timeout_ms=5000) as c:
        assert re.match(r"^127\.0\.0\.1:\d+$", c.segment_name)
        c.put(prefix + "s", b"x" * 1000, preferred_segment=c.segment_name)
        st = c.stat()
        assert st["capacity"] >= (64 << 20) + (8 << 20)
        assert st["objects"] >= 1 and st["used"] >= 1000
        names = [s["name"] for s in st["segments"]]
        assert c.segment_name in names
        seg = next(s for s in st["segments"] if s["name"] == c.segment_name)
        assert seg["objects"] == 1 and seg["medium"] == "dram" and seg["draining"] is False
        ks = c.list_keys("^" + re.escape(prefix))
        assert [(k["key"], k["size"], k["complete"], k["replicas"]) for k in ks] == [
            (prefix + "s", 1000, True, 1)]
        assert c.get(prefix + "s") == b"x" * 1000
    with kvpool.Client(pool.addr) as c:
        assert c.segment_name is None
        assert not c.exists(prefix + "s")  # its segment left with it


def test_remove_all_and_regex(fresh_pool):
    with kvpool.Client(fresh_pool.addr) as c:
        for i in range(10):
            c.put(f"a/{i}", b"x")
            c.put(f"b/{i}", b"y")
        assert c.remove_by_regex("^a/[0-4]$") == 5
        assert c.remove_by_regex("^a/") == 5
        with pytest.raises(kvpool.Error) as ei:
            c.remove_by_regex("(")
        assert ei.value.status == kvpool.ERR_INVALID_ARG
        assert c.remove_all() == 10
        assert c.remove_all(force=True) == 0
        assert c.stat()["objects"] == 0


def test_close_and_context_manager(pool):
    c = kvpool.Client(pool.addr)
    assert not c.closed
    c.close()
    c.close()  # idempotent
    assert c.closed
    with pytest.raises(kvpool.Error) as ei:
        c.get("x")
    assert ei.value.status == kvpool.ERR_SHUTDOWN
    with pytest.raises(kvpool.Error):
        c.batch_put(["x"], [b"x"])
    with kvpool.Client(pool.addr) as c2:
        c2.exists("x")
    assert c2.closed


def test_connect_errors(pool):
    with pytest.raises(kvpool.Error) as ei:
        kvpool.Client("127.0.0.1:1", rpc_timeout_ms=500)
    assert ei.value.status == kvpool.ERR_CONNECT
    with pytest.raises(kvpool.Error) as ei:
        kvpool.Client("not an address")
    assert ei.value.status == kvpool.ERR_INVALID_ARG and "master address" in str(ei.value)
    with pytest.raises(kvpool.Error) as ei:
        kvpool.Client(pool.addr, transport="carrier-pigeon")
    assert "unknown transport" in str(ei.value)


def test_bad_input_native(client, prefix):
    k = prefix + "k"
    client.put(k, b"v")
    cases = [
        (TypeError, lambda: client.put(123, b"x")),
        (TypeError, lambda: client.put(b"bytes-key", b"x")),
        (TypeError, lambda: client.put(k, "a str is not bytes")),
        (TypeError, lambda: client.put(k, 12)),
        (ValueError, lambda: client.put("nul\0key", b"x")),
        (TypeError, lambda: client.get(None)),
        (TypeError, lambda: client.get_into(k, b"read-only")),
        (TypeError, lambda: client.batch_put("not-a-list", [b"x"])),
        (TypeError, lambda: client.batch_put([k, 5], [b"x", b"y"])),
        (ValueError, lambda: client.batch_put([k, k], [b"x"])),
        (ValueError, lambda: client.batch_get_into([k], [bytearray(1), bytearray(1)])),
        (TypeError, lambda: client.batch_get_into([k], [b"read-only"])),
        (TypeError, lambda: client.batch_get_into([k], [object()])),
        (ValueError, lambda: client.batch_get_into([k], [(0, 10)])),
        (ValueError, lambda: client.batch_get_into([k], [(-5, 10)])),
        (ValueError, lambda: client.batch_get_into([k], [(4096, -1)])),
        (TypeError, lambda: client.batch_get_into([k], [("a", 10)])),
        (ValueError, lambda: client.batch_put([k], [np.zeros((4, 4))[:, 1]])),  # not contiguous
        (ValueError, lambda: client.put_from(k, 0, 10)),
        (ValueError, lambda: client.put_from(k, -1, 10)),
        (ValueError, lambda: client.put_from(k, 1 << 70, 10)),
        (TypeError, lambda: client.put_from(k, 1.5, 10)),
        (TypeError, lambda: client.batch_exists(None)),
        (TypeError, lambda: client.batch_exists("abc")),
        (TypeError, lambda: client.batch_exists([k, None])),
        (ValueError, lambda: client.register_buffer(0, 10)),
        (ValueError, lambda: client.batch_put_multi([k], [[], ])),
        (ValueError, lambda: client.batch_put_multi([k, k], [[b"x"]])),
        (TypeError, lambda: client.batch_put_multi([k], [b"x"])),
        (TypeError, lambda: client.get_ranges([(k, 0)])),
        (ValueError, lambda: client.get_ranges([(k, -1, bytearray(1))])),
        (ValueError, lambda: kvpool.Client(segment_size=-1)),
        (TypeError, lambda: kvpool.Client(segment_size=[1])),
    ]
    for exc, fn in cases:
        with pytest.raises(exc):
            fn()
    too_many = ["k"] * (kvpool.MAX_BATCH + 1)
    with pytest.raises(ValueError):
        client.batch_exists(too_many)
    # what the library refuses comes back as a status
    with pytest.raises(kvpool.Error) as ei:
        client.put("", b"x")
    assert ei.value.status == kvpool.ERR_BAD_KEY
    with pytest.raises(kvpool.Error) as ei:
        client.put(prefix + "empty", b"")
    assert ei.value.status == kvpool.ERR_INVALID_ARG
    assert client.batch_put(["", prefix + "ok"], [b"x", b"y"]) == [kvpool.ERR_BAD_KEY, 0]
    assert client.get(k) == b"v"  # still alive and well


def test_keys_list_mutated_meanwhile_is_safe(client, prefix):
    """The keys are copied before the GIL is released: mutating the caller's
    list from another thread cannot free a key under the call."""
    import threading

    keys = [f"{prefix}{i}" for i in range(2000)]
    stop = threading.Event()

    def mutate():
        while not stop.is_set():
            for i in range(len(keys)):
                keys[i] = f"{prefix}{i}" + ""

    t = threading.Thread(target=mutate)
    t.start()
    try:
        for _ in range(20):
            assert client.batch_exists(keys) == [False] * 2000
    finally:
        stop.set()
        t.join()


def test_error_is_raisable_and_constructible():
    e = _kvpool.error(kvpool.ERR_POOL_FULL, "custom")
    assert isinstance(e, kvpool.Error) and str(e) == "custom"
    assert e.status == -5 and e.name == "KVP_ERR_POOL_FULL"
    e2 = kvpool.Error("plain")
    assert e2.status == kvpool.ERR_INTERNAL
    assert _kvpool.strerror(-3) == "key not found"


def test_per_key_errors_name_the_key(client, prefix):
    """A per-key failure raises with that key and the status's text, not an
    earlier call's message left in the thread's last-error record."""
    with pytest.raises(kvpool.Error):
        client.get(prefix + "earlier-miss")
    with pytest.raises(kvpool.Error) as ei:
        client.batch_exists([prefix + "ok", ""])
    assert ei.value.status == kvpool.ERR_BAD_KEY
    assert "invalid key" in str(ei.value) and "earlier-miss" not in str(ei.value)
