"""Each connector's call sequence on mooncake.store, replayed as the contract
(../shared/context/connector-contract.md) describes it: setup,
register_buffer, the batch_is_exist lookup, the puts and gets it uses
(multi-buffer ones included), remove_all, close. Host memory stands in for
GPU memory (the pointers are ints either way)."""

import hashlib

import numpy as np

from mooncake.store import MooncakeDistributedStore, ReplicateConfig

NUM_LAYERS, BLOCK, NUM_BLOCKS = 4, 4096, 16


class KVCache:
    """Per-layer KV tensors, as engines allocate them: one array per layer."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.layers = [rng.integers(0, 255, NUM_BLOCKS * BLOCK, dtype=np.uint8)
                       for _ in range(NUM_LAYERS)]

    def ptrs(self, block):
        return [layer.ctypes.data + block * BLOCK for layer in self.layers]

    def block(self, block):
        return b"".join(layer[block * BLOCK:(block + 1) * BLOCK].tobytes()
                        for layer in self.layers)

    def clear(self):
        for layer in self.layers:
            layer[:] = 0


def prefix_hit(res):
    n = 0
    for r in res:
        if r != 1:
            break
        n += 1
    return n


def test_vllm(make_pool):
    """V: 7 positional setup, GPU KV registered, lookup, multi-buffer put from a
    send thread and get from a receive thread, remove_all(force=True), close."""
    pool = make_pool()
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "",
                       pool.addr) == 0
    kv = KVCache(1)
    for layer in kv.layers:
        assert store.register_buffer(layer.ctypes.data, layer.nbytes) == 0
    keys = [f"kvprefix@llama@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"
            f"{hashlib.sha256(bytes([i])).digest()[:16].hex()}" for i in range(8)]
    assert prefix_hit(store.batch_is_exist(keys)) == 0
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    cfg.preferred_segment = store.get_hostname()
    ptrs = [kv.ptrs(b) for b in range(8)]
    sizes = [[BLOCK] * NUM_LAYERS for _ in range(8)]
    res = store.batch_put_from_multi_buffers(keys[:6], ptrs[:6], sizes[:6], cfg)
    assert res == [0] * 6
    assert prefix_hit(store.batch_is_exist(keys)) == 6
    expected = [kv.block(b) for b in range(6)]
    kv.clear()
    res = store.batch_get_into_multi_buffers(keys[:6], ptrs[:6], sizes[:6])
    assert res == [NUM_LAYERS * BLOCK] * 6
    assert [kv.block(b) for b in range(6)] == expected
    # a block that is not there: -704, the others still read
    res = store.batch_get_into_multi_buffers(keys[5:7], ptrs[5:7], sizes[5:7])
    assert res == [NUM_LAYERS * BLOCK, -704]
    for layer in kv.layers:
        assert store.unregister_buffer(layer.ctypes.data) == 0
    assert store.remove_all(True) == 6
    assert store.close() == 0


def test_vllm_old_dict_setup(make_pool):
    pool = make_pool()
    store = MooncakeDistributedStore()
    assert store.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                        "global_segment_size": "32MB", "local_buffer_size": "16MB",
                        "protocol": "tcp", "device_name": "",
                        "master_server_address": pool.addr}) == 0
    kv = KVCache(2)
    assert store.batch_put_from_multi_buffers(["old@0"], [kv.ptrs(0)], [[BLOCK] * NUM_LAYERS]) == [0]
    assert store.batch_is_exist(["old@0", "old@1"]) == [1, 0]
    assert store.close() == 0


def test_lmcache(make_pool):
    """L: setup, a pinned CPU pool registered, is_exist / batch_is_exist,
    local-first puts (get_hostname as preferred_segment), put_parts with a
    28-byte header, gets that reshape by the returned byte count,
    batch_get_buffer, close."""
    pool = make_pool()
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "",
                       pool.addr) == 0
    cpu_pool = np.zeros(8 << 20, np.uint8)
    assert store.register_buffer(cpu_pool.ctypes.data, cpu_pool.nbytes) == 0
    chunk = 64 << 10
    rng = np.random.default_rng(3)
    for i in range(4):
        cpu_pool[i * chunk:(i + 1) * chunk] = rng.integers(0, 255, chunk, dtype=np.uint8)
    keys = [f"llama@1@0@{hashlib.sha256(bytes([i])).hexdigest()}@bfloat16" for i in range(4)]
    assert store.batch_is_exist(keys) == [0, 0, 0, 0]
    assert store.is_exist(keys[0]) == 0
    cfg = ReplicateConfig()
    cfg.preferred_segment = store.get_hostname()
    ptrs = [cpu_pool.ctypes.data + i * chunk for i in range(4)]
    assert store.batch_put_from(keys[:3], ptrs[:3], [chunk] * 3, config=cfg) == [0, 0, 0]
    assert store.put_from(keys[3], ptrs[3], chunk, config=cfg) == 0
    header = np.arange(28, dtype=np.uint8)
    kvbytes = cpu_pool[:chunk]
    assert store.put_parts("llama@1@0@hdr@bfloat16", header, kvbytes, config=cfg) == 0
    assert store.is_exist(keys[0]) == 1
    expected = [cpu_pool[i * chunk:(i + 1) * chunk].copy() for i in range(4)]
    # read back into other slots of the pool: the byte count is the true length
    dst = 4 * chunk
    n = store.batch_get_into(keys, [cpu_pool.ctypes.data + dst + i * chunk for i in range(4)],
                             [chunk] * 4)
    assert n == [chunk] * 4
    for i in range(4):
        got = cpu_pool[dst + i * chunk: dst + i * chunk + n[i]]
        assert np.array_equal(got, expected[i])
    m = store.get_into("llama@1@0@hdr@bfloat16", cpu_pool.ctypes.data + dst, 2 * chunk)
    assert m == 28 + chunk
    assert np.array_equal(cpu_pool[dst:dst + 28], header)
    hs = store.batch_get_buffer(keys[:2] + ["llama@1@0@missing@bfloat16"])
    assert hs[2] is None
    assert [np.frombuffer(h, np.uint8).tobytes() for h in hs[:2]] == [e.tobytes()
                                                                     for e in expected[:2]]
    assert store.unregister_buffer(cpu_pool.ctypes.data) == 0
    assert store.close() == 0


def test_sglang(make_pool):
    """S: 8 positional + kwargs (retrying without unknown kwargs on TypeError),
    warm-up put/get, host pool registered, exists, puts (single and multi
    buffer), gets counted as res > 0, remove_all."""
    pool = make_pool()
    store = MooncakeDistributedStore()
    kwargs = {"enable_ssd_offload": False, "tenant_id": "default", "future_option": 1}
    args = ("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "", pool.addr, None)
    try:
        rc = store.setup(*args, **kwargs)
    except TypeError:
        kwargs.pop("future_option")
        rc = store.setup(*args, **kwargs)
    assert rc == 0
    warm = "warmup_key_" + "x" * 8
    assert store.put(warm, b"\x01" * 4096) == 0
    assert store.get(warm) == b"\x01" * 4096
    host = np.zeros(4 << 20, np.uint8)
    assert store.register_buffer(host.ctypes.data, host.nbytes) == 0
    page = 16 << 10
    host[: 8 * page] = np.random.default_rng(9).integers(0, 255, 8 * page, dtype=np.uint8)
    hashes = [hashlib.sha256(bytes([i])).hexdigest() for i in range(4)]
    kkeys = [f"{h}_0_k" for h in hashes]
    vkeys = [f"{h}_0_v" for h in hashes]
    assert store.batch_is_exist(kkeys + vkeys) == [0] * 8
    res = store.batch_put_from(kkeys, [host.ctypes.data + i * page for i in range(4)], [page] * 4)
    assert res == [0] * 4
    # MLA-style: one key from k and v halves
    res = store.batch_put_from_multi_buffers(
        vkeys, [[host.ctypes.data + (4 + i) * page, host.ctypes.data + i * page] for i in range(4)],
        [[page, page] for _ in range(4)])
    assert res == [0] * 4
    assert store.batch_is_exist(kkeys + vkeys) == [1] * 8
    out = 16 * page
    res = store.batch_get_into(kkeys, [host.ctypes.data + out + i * page for i in range(4)],
                               [page] * 4)
    assert sum(1 for r in res if r > 0) == 4
    assert np.array_equal(host[out:out + 4 * page], host[:4 * page])
    res = store.batch_get_into_multi_buffers(
        vkeys, [[host.ctypes.data + out + i * 2 * page] for i in range(4)], [[2 * page]] * 4)
    assert sum(1 for r in res if r > 0) == 4
    for i in range(4):
        got = host[out + i * 2 * page: out + (i + 1) * 2 * page]
        assert np.array_equal(got[:page], host[(4 + i) * page:(5 + i) * page])
        assert np.array_equal(got[page:], host[i * page:(i + 1) * page])
    assert store.remove_all() == 9
    assert store.batch_is_exist(kkeys) == [0] * 4
    assert store.close() == 0


def test_sglang_standalone_dummy(make_pool):
    """S standalone: the memory is a separate `kvpool serve`; the engine's store
    is a dummy client."""
    pool = make_pool()
    store = MooncakeDistributedStore()
    assert store.setup_dummy(64 << 20, 16 << 20, pool.addr) == 0
    a = np.arange(1024, dtype=np.uint8)
    assert store.batch_put_from(["dummy_0_k"], [a.ctypes.data], [a.nbytes]) == [0]
    b = np.zeros_like(a)
    assert store.batch_get_into(["dummy_0_k"], [b.ctypes.data], [b.nbytes]) == [1024]
    assert np.array_equal(a, b)
    assert store.remove_all() == 1
    assert store.close() == 0


def test_vllm_ascend(make_pool):
    """A: keyword setup, lookup, multi-buffer put and get of K and V caches."""
    pool = make_pool()
    store = MooncakeDistributedStore()
    assert store.setup(local_hostname="127.0.0.1", metadata_server="P2PHANDSHAKE",
                       global_segment_size=32 << 20, local_buffer_size=0, protocol="ascend",
                       rdma_devices="", master_server_addr=pool.addr) == 0
    kv = KVCache(4)
    keys = [f"qwen@pcp0@dcp0@head_or_tp_rank:0@pp_rank:0@group:0@cache_role:{role}"
            f"@cache_family:kv@{hashlib.md5(bytes([i])).hexdigest()}"
            for i in range(2) for role in ("k", "v")]
    assert store.batch_is_exist(keys) == [0] * 4
    ptrs = [kv.ptrs(i) for i in range(4)]
    sizes = [[BLOCK] * NUM_LAYERS] * 4
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0] * 4
    assert store.batch_is_exist(keys) == [1] * 4
    expected = [kv.block(i) for i in range(4)]
    kv.clear()
    assert store.batch_get_into_multi_buffers(keys, ptrs, sizes) == [NUM_LAYERS * BLOCK] * 4
    assert [kv.block(i) for i in range(4)] == expected
    assert store.remove_all() == 4
    assert store.close() == 0
