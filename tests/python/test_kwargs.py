"""Keyword arguments of the raw layer (kvpool._kvpool.Client and the module
functions) and of mooncake.store: a keyword call gives what the positional one
gives, and a wrong argument is a TypeError that says what was wrong."""

import numpy as np
import pytest

from kvpool import _kvpool


def ptr(a):
    return a.ctypes.data


def test_single_key_calls(client, prefix):
    r = client.raw
    k, k2 = prefix + "k", prefix + "k2"
    assert r.put(key=k, buffer=b"hello", config=None) == 0
    assert r.put(k2, b"hello") == 0
    assert r.get(key=k) == r.get(k2) == b"hello"
    assert r.get_size(key=k) == r.get_size(k) == 5
    assert r.is_exist(key=k) == r.is_exist(k) == 1
    out = bytearray(8)
    assert r.get_into(key=k, buffer=out) == 5 and bytes(out[:5]) == b"hello"
    src = np.frombuffer(b"from a pointer", dtype=np.uint8).copy()
    assert r.put_from(key=prefix + "p", ptr=ptr(src), size=src.nbytes, config=None) == 0
    dst = np.zeros(32, np.uint8)
    assert r.get_into_ptr(key=prefix + "p", ptr=ptr(dst), size=dst.nbytes) == src.nbytes
    assert dst[: src.nbytes].tobytes() == b"from a pointer"
    parts = [np.frombuffer(b"ab", np.uint8), np.frombuffer(b"cd", np.uint8)]
    assert r.put_parts(key=prefix + "parts", parts=parts, config=None) == 0
    assert r.get(prefix + "parts") == b"abcd"
    assert r.remove(key=k, force=False) == 0
    assert r.remove(k2, False) == 0
    assert r.is_exist(key=k) == r.is_exist(k2) == 0
    assert r.remove_by_regex(pattern="^" + prefix + "p", force=True) == 2
    assert r.list_keys(pattern="^" + prefix, max=10) == r.list_keys("^" + prefix, 10) == []


def test_batch_calls(client, prefix):
    r = client.raw
    keys = [f"{prefix}{i}" for i in range(3)]
    srcs = [np.arange(n, dtype=np.uint8) for n in (1, 100, 5000)]
    assert r.batch_put(keys=keys, buffers=srcs, config=None) == [0] * 3
    assert r.batch_exists(keys=keys) == r.batch_exists(keys) == ([1, 1, 1], 3)
    assert r.batch_exists_bools(keys=keys) == [True] * 3
    dsts = [np.zeros(a.nbytes, np.uint8) for a in srcs]
    assert r.batch_get_into(keys=keys, buffers=dsts) == [a.nbytes for a in srcs]
    assert all(np.array_equal(a, d) for a, d in zip(srcs, dsts))
    byptr = [np.zeros(a.nbytes, np.uint8) for a in srcs]
    assert r.batch_get_into_ptrs(keys=keys, ptrs=[ptr(d) for d in byptr],
                                 sizes=[d.nbytes for d in byptr]) == \
        r.batch_get_into_ptrs(keys, [ptr(d) for d in byptr], [d.nbytes for d in byptr])
    assert all(np.array_equal(a, d) for a, d in zip(srcs, byptr))
    handles = r.batch_get_buffer(keys=keys)
    assert [bytes(h) for h in handles] == [a.tobytes() for a in srcs]
    out = bytearray(4)
    assert r.get_ranges(ranges=[(keys[1], 10, out)]) == [4] and out == bytes(range(10, 14))
    assert r.batch_remove(keys=keys, force=True) == [0] * 3

    more = [prefix + "f0", prefix + "f1"]
    assert r.batch_put_from(keys=more, ptrs=[ptr(a) for a in srcs[:2]],
                            sizes=[a.nbytes for a in srcs[:2]], config=None) == [0, 0]
    assert r.batch_exists(more)[0] == [1, 1]
    multi = [prefix + "m"]
    halves = [srcs[2][:2500], srcs[2][2500:]]
    assert r.batch_put_multi(keys=multi, ptrs=[[ptr(h) for h in halves]],
                             sizes=[[h.nbytes for h in halves]], config=None) == [0]
    back = [np.zeros(2500, np.uint8), np.zeros(2500, np.uint8)]
    assert r.batch_get_into_multi(keys=multi, ptrs=[[ptr(b) for b in back]],
                                  sizes=[[b.nbytes for b in back]]) == [5000]
    assert np.array_equal(np.concatenate(back), srcs[2])
    assert r.batch_remove(more + multi) == [0] * 3


def test_module_functions():
    e = _kvpool.error(status=-5, message="full")
    assert e.status == -5 and e.name == "KVP_ERR_POOL_FULL" and str(e) == "full"
    assert _kvpool.strerror(status=-3) == _kvpool.strerror(-3) == "key not found"
    b = bytearray(16)
    assert _kvpool.buffer_info(obj=b, writable=True) == _kvpool.buffer_info(b, True)


def test_wrong_arguments_say_what(client, prefix):
    r = client.raw
    k = prefix + "k"
    cases = [
        (lambda: r.get(key=5), "a key must be str, not int"),
        (lambda: r.put(key=k, buffer=b"x", bogus=1), "'bogus' is an invalid keyword"),
        (lambda: r.put(k, b"x", key=k), "given by name ('key') and position (1)"),
        (lambda: r.put_from(k, ptr=1.5, size=3), "ptr must be an int, not float"),
        (lambda: r.put_from(k, ptr=4096, size="3"), "size must be an int, not str"),
        (lambda: r.batch_put(keys="abc", buffers=[b"x"]), "keys must be a list of str"),
        (lambda: r.batch_put(keys=[k, 5], buffers=[b"x", b"y"]), "keys[1]: a key must be str"),
        (lambda: r.batch_get_into(keys=[k], buffers=[b"read-only"]), "buffers[0] cannot be "
         "written"),
        (lambda: r.batch_put_from(keys=[k], ptrs=[4096], sizes=[None]),
         "sizes[0] must be an int, not NoneType"),
        (lambda: r.batch_put_multi(keys=[k], ptrs=[[4096]], sizes=[7]),
         "sizes[0] must be a list, not int"),
        (lambda: r.batch_put(keys=[k], buffers=[b"x"], config="c"), "config must be None or a "
         "6-tuple"),
        (lambda: r.batch_exists(), "missing required argument 'keys'"),
        (lambda: _kvpool.Client(segment_size=[1]), "segment_size must be an int, not list"),
    ]
    for fn, msg in cases:
        with pytest.raises(TypeError) as ei:
            fn()
        assert msg in str(ei.value), (msg, str(ei.value))
    # a later argument failing releases what the earlier ones exported
    ba = bytearray(b"resizable")
    with pytest.raises(TypeError):
        r.batch_put([k], [ba], "not a config")
    ba.extend(b" still")  # BufferError if the view were still exported


def test_mooncake_store_keywords(store, prefix):
    from mooncake.store import ReplicateConfig

    k = prefix + "k"
    assert store.put(key=k, value=b"v", config=ReplicateConfig()) == 0
    assert store.get(key=k) == store.get(k) == b"v"
    assert store.is_exist(key=k) == 1
    src = np.arange(64, dtype=np.uint8)
    keys = [prefix + "a", prefix + "b"]
    assert store.batch_put_from(keys=keys, buffer_ptrs=[ptr(src)] * 2, sizes=[64, 32],
                                config=ReplicateConfig(replica_num=1)) == [0, 0]
    dsts = [np.zeros(64, np.uint8) for _ in keys]
    assert store.batch_get_into(keys=keys, buffer_ptrs=[ptr(d) for d in dsts],
                                sizes=[64, 64]) == [64, 32]
    assert store.batch_get_into_multi_buffers(
        keys=keys, all_buffer_ptrs=[[ptr(d)] for d in dsts], all_sizes=[[64]] * 2,
        prefer_alloc_in_same_node=False) == [64, 32]
    assert store.batch_is_exist(keys=keys) == [1, 1]
    mk = [prefix + "m"]
    assert store.batch_put_from_multi_buffers(
        keys=mk, all_buffer_ptrs=[[ptr(src), ptr(src)]], all_sizes=[[8, 16]],
        config=ReplicateConfig()) == [0]
    assert store.get(mk[0]) == src[:8].tobytes() + src[:16].tobytes()
    assert store.remove_by_regex(regex_pattern="^" + prefix + "m$", force=True) == 1
    assert store.remove(key=k, force=True) == 0
