"""mooncake.store on kvpool: every method of the connector contract
(../shared/context/connector-contract.md) and Mooncake's return codes."""

import ctypes
import time

import numpy as np
import pytest

import conftest
import kvpool
from mooncake.store import MooncakeDistributedStore, ReplicateConfig, codes

OK, NOT_FOUND, INVALID, NO_HANDLE = 0, -704, -600, -200


def ptr(a):
    return a.ctypes.data


def test_codes_table_covers_every_status():
    assert set(codes.KVP_TO_MOONCAKE_NAME) == set(kvpool.STATUS)
    assert set(codes.KVP_TO_MOONCAKE_NAME.values()) <= set(codes.MOONCAKE)
    m = codes.KVP_TO_MOONCAKE
    assert m[kvpool.ERR_NOT_FOUND] == -704 and m[kvpool.ERR_POOL_FULL] == -200
    assert m[kvpool.ERR_INVALID_ARG] == -600 and m[kvpool.ERR_BUFFER_TOO_SMALL] == -600
    assert m[kvpool.ERR_EXISTS] == -705 and m[kvpool.OK] == 0
    assert codes.to_mooncake(1234) == 1234 and codes.to_mooncake(-999) == -1


def test_replicate_config_fields():
    c = ReplicateConfig()
    assert (c.replica_num, c.preferred_segment, c.preferred_segments) == (1, "", [])
    assert not c.with_soft_pin and not c.with_hard_pin and not c.prefer_alloc_in_same_node
    assert hasattr(c, "group_ids") and hasattr(c, "soft_pin_ttl_ms")
    c.replica_num = 2
    c.with_soft_pin = True
    assert "replica_num=2" in repr(c)
    with pytest.raises(TypeError):
        ReplicateConfig(no_such_field=1)


def test_setup_forms(pool):
    s = MooncakeDistributedStore()
    # 7 positional (vLLM, LMCache)
    assert s.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", pool.addr) == OK
    assert s.close() == OK
    # 8 positional + keywords (SGLang). In the TLS pass the credential binds its principal's
    # tenant ("default"): another tenant_id is refused there (test_tenant_id.py), so it names
    # that one
    tid = "default" if conftest.TLS_DIR else "t"
    assert s.setup("127.0.0.1", "http://meta", 16 << 20, 16 << 20, "rdma-less", "", pool.addr,
                   None, enable_ssd_offload=False, ssd_offload_path="", tenant_id=tid,
                   enable_client_http_server=False, client_http_port=9300) == OK
    assert s.get_hostname() != "" and s.get_hostname() != "127.0.0.1"  # its segment's name
    s.close()
    # keywords (vllm-ascend)
    assert s.setup(local_hostname="127.0.0.1:12345", metadata_server="P2PHANDSHAKE",
                   global_segment_size=8 << 20, local_buffer_size=0, protocol="tcp",
                   rdma_devices="", master_server_addr=pool.addr) == OK
    assert s.get_hostname().startswith("127.0.0.1:")
    s.close()
    # dict form with sizes as strings (vLLM, older)
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": "8MB", "local_buffer_size": "512MB",
                    "protocol": "tcp", "device_name": "", "master_server_address": pool.addr}) == OK
    assert s.put("setup@dict", b"v") == OK and s.get("setup@dict") == b"v"
    s.remove("setup@dict")
    s.close()
    # the dict by its keyword, as Mooncake's overload names it
    assert s.setup(config={"local_hostname": "127.0.0.1", "global_segment_size": 0,
                           "protocol": "tcp", "master_server_address": pool.addr}) == OK
    assert s.put("setup@kw", b"w") == OK and s.get("setup@kw") == b"w"
    s.remove("setup@kw")
    s.close()
    assert s.setup("127.0.0.1", config={"protocol": "tcp"}) == INVALID  # both forms
    assert s.setup(config="not a dict") == INVALID
    # setup twice replaces the client
    assert s.setup("127.0.0.1", "", 0, 16 << 20, "tcp", "", pool.addr) == OK
    assert s.setup("127.0.0.1", "", 0, 16 << 20, "tcp", "", pool.addr) == OK
    s.close()
    s.close()


def test_setup_errors(pool):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "", 0, 0, "tcp", "", "127.0.0.1:1") == -900  # RPC_FAIL
    assert s.setup("127.0.0.1", "", "lots", 0, "tcp", "", pool.addr) == INVALID
    assert s.setup("127.0.0.1", "", -1, 0, "tcp", "", pool.addr) == INVALID
    assert s.setup(42, "", 0, 0, "tcp", "", pool.addr) == INVALID
    assert s.setup("127.0.0.1", "", 0, 0, "tcp", "", "no-port") == INVALID
    with pytest.raises(TypeError):  # an unknown keyword: SGLang retries without it
        s.setup("127.0.0.1", "", 0, 0, "tcp", "", pool.addr, no_such_kwarg=1)
    # calls before setup: -1 / b"" / lists of -1, never an exception
    assert s.put("k", b"v") == -1 and s.get("k") == b"" and s.is_exist("k") == -1
    assert s.batch_is_exist(["a", "b"]) == [-1, -1]
    assert s.batch_get_buffer(["a"]) == [None]
    assert s.get_hostname() == ""


def test_setup_dummy(pool):
    s = MooncakeDistributedStore()
    assert s.setup_dummy(64 << 20, 16 << 20, pool.addr) == OK
    assert s.put("dummy@k", b"v") == OK and s.get("dummy@k") == b"v"
    assert s.remove("dummy@k") == OK
    s.close()
    assert s.setup_dummy(-1, 0, pool.addr) == INVALID
    assert s.setup_dummy(0, 0, None) == INVALID


def test_put_get_is_exist_remove(store, prefix):
    k = prefix + "k"
    assert store.get(k) == b""  # miss
    assert store.is_exist(k) == 0
    assert store.put(k, b"value") == OK
    assert store.put(k, b"other") == OK  # an existing key: 0
    assert store.get(k) == b"value"
    assert store.is_exist(k) == 1
    assert store.get_size(k) == 5
    assert store.put(prefix + "np", np.arange(10, dtype=np.int64)) == OK
    assert store.get(prefix + "np") == np.arange(10, dtype=np.int64).tobytes()
    assert store.remove(k) == OK
    assert store.remove(k) == NOT_FOUND
    assert store.get_size(k) == NOT_FOUND


def test_batch_put_from_and_get_into(store, prefix):
    rng = np.random.default_rng(3)
    srcs = [rng.integers(0, 255, n, dtype=np.uint8) for n in (1, 4096, 100000)]
    keys = [f"{prefix}{i}" for i in range(3)]
    assert store.batch_is_exist(keys) == [0, 0, 0]
    assert store.batch_put_from(keys, [ptr(a) for a in srcs], [a.nbytes for a in srcs]) == [0] * 3
    assert store.batch_put_from(keys, [ptr(a) for a in srcs], [a.nbytes for a in srcs]) == [0] * 3
    assert store.batch_is_exist(keys + [prefix + "none"]) == [1, 1, 1, 0]
    dsts = [np.zeros(a.nbytes + 10, np.uint8) for a in srcs]
    res = store.batch_get_into(keys + [prefix + "none"],
                               [ptr(d) for d in dsts] + [ptr(dsts[0])],
                               [d.nbytes for d in dsts] + [dsts[0].nbytes])
    assert res == [a.nbytes for a in srcs] + [NOT_FOUND]  # true lengths, -704 on a miss
    for a, d in zip(srcs, dsts):
        assert np.array_equal(d[: a.nbytes], a)
    # a buffer too small: -600
    assert store.batch_get_into([keys[2]], [ptr(dsts[0])], [10]) == [INVALID]


def test_get_into_put_from_put_parts(store, prefix):
    src = np.arange(1000, dtype=np.float16)
    assert store.put_from(prefix + "pf", ptr(src), src.nbytes) == OK
    assert store.put_from(prefix + "pf", ptr(src), src.nbytes) == OK
    dst = np.zeros_like(src)
    assert store.get_into(prefix + "pf", ptr(dst), dst.nbytes) == src.nbytes
    assert np.array_equal(src, dst)
    assert store.get_into(prefix + "none", ptr(dst), dst.nbytes) == NOT_FOUND
    assert store.get_into(prefix + "pf", ptr(dst), 8) == INVALID
    # LMCache: a 28-byte header and the KV bytes, one object
    header = np.frombuffer(bytes(range(28)), np.uint8)
    kv = np.random.default_rng(0).integers(0, 255, 5000, dtype=np.uint8)
    assert store.put_parts(prefix + "parts", header, memoryview(kv.tobytes())) == OK
    assert store.get(prefix + "parts") == header.tobytes() + kv.tobytes()
    assert store.put_parts(prefix + "parts", header) == OK  # exists: 0
    assert store.put_parts(prefix + "p2", "not a buffer") == INVALID
    assert store.put_parts(prefix + "p3") == INVALID


def test_multi_buffers(store, prefix):
    layers = [np.random.default_rng(i).integers(0, 255, 2048, dtype=np.uint8) for i in range(6)]
    keys = [prefix + "m0", prefix + "m1"]
    ptrs = [[ptr(a) for a in layers], [ptr(a) for a in layers[:2]]]
    sizes = [[a.nbytes for a in layers], [a.nbytes for a in layers[:2]]]
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0, 0]
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0, 0]  # exist: 0
    outs = [np.zeros(2048, np.uint8) for _ in range(6)]
    optrs = [[ptr(o) for o in outs]]
    osizes = [[o.nbytes for o in outs]]
    assert store.batch_get_into_multi_buffers(keys[:1], optrs, osizes) == [6 * 2048]
    assert all(np.array_equal(a, o) for a, o in zip(layers, outs))
    # too small: -600; missing: -704
    assert store.batch_get_into_multi_buffers(
        [keys[0], prefix + "none"], [[ptr(outs[0])], [ptr(outs[1])]], [[2048], [2048]],
        prefer_alloc_in_same_node=True) == [INVALID, NOT_FOUND]
    assert store.batch_get_into_multi_buffers(keys, [[0]], [[1]]) == [INVALID, INVALID]


def test_batch_get_buffer(store, prefix):
    a = np.arange(3000, dtype=np.int32)
    assert store.put(prefix + "g", a) == OK
    hs = store.batch_get_buffer([prefix + "g", prefix + "none"])
    h = hs[1] is None and hs[0]
    assert h and len(h) == a.nbytes and h.size() == a.nbytes and h.ptr() != 0
    assert np.array_equal(np.frombuffer(h, dtype=np.int32), a)
    assert bytes(memoryview(h)) == a.tobytes()
    # the memory is the handle's own, readable through ptr()
    assert ctypes.string_at(h.ptr(), 16) == a.tobytes()[:16]
    assert store.get_buffer(prefix + "none") is None
    assert store.get_batch([prefix + "g", prefix + "none"]) == [a.tobytes(), b""]
    assert store.put_batch([prefix + "pb1", prefix + "pb2"], [b"1", b"2"]) == OK
    assert store.get_batch([prefix + "pb1", prefix + "pb2"]) == [b"1", b"2"]


def test_register_buffer(store):
    a = np.zeros(1 << 20, np.uint8)
    assert store.register_buffer(ptr(a), a.nbytes) == OK
    assert store.register_buffer(ptr(a), a.nbytes) == -705  # overlap
    assert store.unregister_buffer(ptr(a)) == OK
    assert store.register_buffer(0, 10) == INVALID
    assert store.register_buffer(ptr(a), -1) == INVALID
    assert store.unregister_buffer("x") == INVALID


def test_replicate_config_used(store, prefix):
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    cfg.with_soft_pin = True
    cfg.soft_pin_ttl_ms = 1500
    assert store.put(prefix + "soft", b"s", config=cfg) == OK
    hard = ReplicateConfig(with_hard_pin=True, preferred_segments=["nowhere:1"])
    assert store.put(prefix + "hard", b"h", hard) == OK
    local = ReplicateConfig(prefer_alloc_in_same_node=True)
    a = np.ones(100, np.uint8)
    assert store.batch_put_from([prefix + "l"], [ptr(a)], [100], config=local) == [0]
    assert store.put(prefix + "bad", b"x", config="not a config") == INVALID
    assert store.put(prefix + "bad", b"x", config=ReplicateConfig(replica_num=0)) == INVALID
    desc = store.batch_get_replica_desc([prefix + "soft", prefix + "none"])
    assert list(desc) == [prefix + "soft"] and desc[prefix + "soft"][0]["size"] == 1


def test_remove_all_counts(make_pool):
    p = make_pool()
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "", 0, 16 << 20, "tcp", "", p.addr) == OK
    for i in range(7):
        assert s.put(f"ra/{i}", b"x") == OK
    assert s.remove_by_regex("^ra/[01]$") == 2
    assert s.remove_all() == 5
    assert s.remove_all(force=True) == 0
    assert s.close() == OK


def test_pool_full_is_no_available_handle(make_pool):
    # A new master gives segments 2 s to come back before a put finds no room (the
    # client waits through it): both pools start now, so the two waits overlap.
    p = make_pool(segments=("1MiB",), master_args=("--lease-ttl", "0", "--no-eviction"))
    p2 = make_pool(segments=())
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "", 0, 16 << 20, "auto", "", p.addr) == OK
    blob = np.ones(400 << 10, np.uint8)
    res = s.batch_put_from([f"full{i}" for i in range(4)], [ptr(blob)] * 4, [blob.nbytes] * 4)
    assert res[:2] == [0, 0] and NO_HANDLE in res[2:], res
    assert s.put("huge", np.zeros(2 << 20, np.uint8)) == NO_HANDLE  # larger than any segment
    s.close()
    # no segment at all
    assert s.setup("127.0.0.1", "", 0, 16 << 20, "auto", "", p2.addr) == OK
    assert s.put("k", b"v") == NO_HANDLE
    s.close()


def test_bad_input_returns_invalid_params(store, prefix):
    k = prefix + "k"
    assert store.put(k, b"v") == OK
    I = INVALID
    assert store.put(123, b"x") == I
    assert store.put(k, 123) == I
    assert store.put("", b"x") == I
    assert store.put(prefix + "e", b"") == I
    assert store.get(None) == b""
    assert store.is_exist(5) == I
    assert store.batch_is_exist([k, 5]) == [I, I]
    assert store.batch_is_exist(None) == []
    assert store.batch_put_from([k], [0], [1]) == [I]
    assert store.batch_put_from([k, k], [1234], [1]) == [I, I]
    assert store.batch_put_from([k], [4096], [-1]) == [I]
    assert store.batch_put_from([k], ["x"], [1]) == [I]
    assert store.batch_get_into([k], [-1], [10]) == [I]
    assert store.batch_get_into([k], [None], [10]) == [I]
    assert store.batch_get_into([k, k], [1, 2], [3]) == [I, I]
    assert store.batch_get_into([k], [4096], [1.5]) == [I]
    assert store.batch_put_from_multi_buffers([k], [[1, 2]], [[1]]) == [I]
    assert store.batch_put_from_multi_buffers([k], [[]], [[]]) == [I]
    assert store.batch_put_from_multi_buffers([k], [1], [1]) == [I]
    assert store.batch_get_into_multi_buffers([k], [[0]], [[10]]) == [I]
    assert store.get_into(k, 0, 10) == I
    assert store.get_into(k, 4096, -3) == I
    assert store.put_from(k, -1, 1) == I
    assert store.remove(None) == I
    assert store.remove_by_regex(7) == I
    assert store.remove_by_regex("(") == I
    assert store.batch_get_buffer([1]) == [None]
    assert store.get(k) == b"v"  # the store still works


def test_shared_by_tcp_and_auto_stores(pool, prefix):
    """A tcp store and an auto (shm) store see each other's objects."""
    a, b = MooncakeDistributedStore(), MooncakeDistributedStore()
    assert a.setup("127.0.0.1", "", 16 << 20, 16 << 20, "tcp", "", pool.addr) == OK
    assert b.setup("127.0.0.1", "", 0, 16 << 20, "auto", "", pool.addr) == OK
    data = np.random.default_rng(5).integers(0, 255, 3 << 20, dtype=np.uint8)
    cfg = ReplicateConfig(preferred_segment=a.get_hostname())
    assert a.put(prefix + "x", data, cfg) == OK
    out = np.zeros_like(data)
    assert b.get_into(prefix + "x", ptr(out), out.nbytes) == data.nbytes
    assert np.array_equal(out, data)
    assert a.get(prefix + "x") == data.tobytes()
    b.close()
    a.close()


def test_kvpool_mooncake_wins_and_real_mooncake_stays_reachable(tmp_path):
    """With kvpool's directory first on the path, mooncake.store is kvpool's even
    when a real Mooncake is installed later on the path, and that Mooncake's
    other modules (mooncake.engine) still import."""
    import os
    import subprocess
    import sys

    real = tmp_path / "site" / "mooncake"
    (real / "store").mkdir(parents=True)
    (real / "__init__.py").write_text("")
    (real / "store" / "__init__.py").write_text("raise ImportError('the real one')\n")
    (real / "engine.py").write_text("class TransferEngine: pass\n")
    ours = os.path.dirname(os.path.dirname(os.path.dirname(codes.__file__)))
    code = ("import mooncake.store, mooncake.engine; "
            "print(mooncake.store.MooncakeDistributedStore.__module__, "
            "mooncake.engine.TransferEngine.__name__)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ours, str(tmp_path / "site")]),
               PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["mooncake.store", "TransferEngine"]


def test_batch_remove_repeated_key(store, prefix):
    """A key named twice: its first place removes it, the later one is not found (as
    Mooncake answers); the other keys are each their own."""
    a, b = prefix + "a", prefix + "b"
    assert store.put(a, b"x") == OK and store.put(b, b"y") == OK
    assert store.batch_remove([a, b, a, prefix + "none"]) == [OK, OK, NOT_FOUND, NOT_FOUND]
    assert store.is_exist(a) == 0 and store.is_exist(b) == 0


def test_local_disk_replica(make_pool, tmp_path):
    """A replica on an SSD segment served from this store's own host is a local disk
    replica (Mooncake's copy on the client's disk); seen from a store of another host it
    is a disk replica only; a DRAM replica is neither."""
    pool = make_pool(segments=())
    ssd = conftest.Proc([pool.cli_bin, "--master", pool.addr, "serve", "--segment-size", "0",
                         "--ssd-path", str(tmp_path / "ssd.seg"), "--ssd-size", "64MiB",
                         "--ready-fd", "{fd}"])
    pool.segments.append(ssd)
    here, there = MooncakeDistributedStore(), MooncakeDistributedStore()
    assert here.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", pool.addr) == OK
    assert there.setup("192.0.2.7", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", pool.addr) == OK
    try:
        with kvpool.Client(pool.addr) as c:
            c.put("disk@k", b"on disk", medium="ssd")
        (d,) = here.get_replica_desc("disk@k")
        assert d.is_disk_replica() and d.is_local_disk_replica() and not d.is_memory_replica()
        (d,) = there.get_replica_desc("disk@k")
        assert d.is_disk_replica() and not d.is_local_disk_replica()
        assert there.get("disk@k") == b"on disk"
        pool.add_segment("16MiB")  # DRAM on this host: never a disk replica
        with kvpool.Client(pool.addr) as c:
            (dram,) = [g["name"] for g in c.stat()["segments"] if g["medium"] == "dram"]
        assert here.put("mem@k", b"in memory", ReplicateConfig(preferred_segment=dram)) == OK
        (d,) = here.get_replica_desc("mem@k")
        assert d.is_memory_replica() and not d.is_local_disk_replica()
    finally:
        here.close()
        there.close()


def test_host_mem_allocator(store, prefix):
    """MooncakeHostMemAllocator, as SGLang's standalone storage mode uses it: memory from
    alloc registered with a store carries a put and a get; free unmaps it (0), an address
    it did not give (or gave and freed) is -1."""
    from mooncake.store import MooncakeHostMemAllocator

    a = MooncakeHostMemAllocator()
    n = 1 << 20
    src, dst = a.alloc(n), a.alloc(n)
    assert src % 4096 == 0 and dst % 4096 == 0 and src != dst
    assert ctypes.string_at(src, 16) == bytes(16)  # zeroed
    data = np.random.default_rng(5).integers(0, 255, n, dtype=np.uint8).tobytes()
    ctypes.memmove(src, data, n)
    assert store.register_buffer(src, n) == OK and store.register_buffer(dst, n) == OK
    assert store.batch_put_from([prefix + "h"], [src], [n]) == [OK]
    assert store.batch_get_into([prefix + "h"], [dst], [n]) == [n]
    assert ctypes.string_at(dst, n) == data
    assert store.unregister_buffer(src) == OK and store.unregister_buffer(dst) == OK
    assert a.free(src) == 0 and a.free(dst) == 0
    assert a.free(src) == -1 and a.free(12345) == -1
    with pytest.raises(RuntimeError):
        a.alloc(0)


def test_client_http_server(pool, prefix):
    """setup(enable_client_http_server=True, client_http_port=P): the client's /metrics
    (Prometheus text, counting what the store did) and /health on P of its own host; other
    paths 404, other methods 405; a connection that trickles is closed within the deadline;
    close() stops it; a port that is no port is -600."""
    import socket
    import urllib.error
    import urllib.request

    from mooncake.store import _metrics_http

    port = conftest.free_port()
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", pool.addr,
                   enable_client_http_server=True, client_http_port=port) == OK
    base = f"http://127.0.0.1:{port}"
    try:
        assert s.put(prefix + "m", b"x" * 1000) == OK and s.get(prefix + "m") == b"x" * 1000
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        assert "kvpool_client_" in text and conftest.metric(
            text, "kvpool_client_master_rpc_calls_total", {"method": "put_start"}) >= 1
        with urllib.request.urlopen(base + "/health", timeout=10) as r:
            assert r.status == 200 and r.read() == b"ok\n"
        for path, method, want in (("/nope", "GET", 404), ("/metrics", "POST", 405)):
            req = urllib.request.Request(base + path, method=method, data=b"" if method ==
                                         "POST" else None)
            with pytest.raises(urllib.error.HTTPError) as ei:
                urllib.request.urlopen(req, timeout=10)
            assert ei.value.code == want
        # a head that trickles: cut at the deadline, whatever it sends
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as k:
            k.sendall(b"GET /metrics HTTP/1.1\r\n")
            while True:
                try:
                    k.sendall(b"X: y\r\n")
                    if k.recv(1, socket.MSG_DONTWAIT) == b"":
                        break
                except BlockingIOError:
                    pass
                except OSError:
                    break
                time.sleep(0.5)
        assert time.monotonic() - t0 < _metrics_http.HEAD_DEADLINE_S + 3
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        assert conftest.metric(text, "kvpool_client_http_refused_total",
                               {"reason": "deadline"}) == 1
    finally:
        s.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(base + "/health", timeout=5)
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", pool.addr,
                   enable_client_http_server=True, client_http_port=70000) == INVALID
