"""mooncake.store against Mooncake's binding at the snapshot kvpool follows:
the value types' names, members, numbers, defaults and exceptions, the
ReplicateConfig rules Mooncake's master applies to a put, get_into_ranges'
answer to lists of different lengths, and the mooncake.mooncake_config and
mooncake.async_store modules (docs/python.md)."""

import asyncio
import ctypes
import json
import logging
import re

import pytest

import kvpool
import mooncake.store as mstore
from mooncake.async_store import MooncakeDistributedStoreAsync
from mooncake.mooncake_config import MooncakeConfig
from mooncake.store import (ObjectDataType, ParallelAxis, QueryTaskResponse, ReadTarget,
                            ReplicaStatus, ReplicateConfig, SoftPinAction, TaskStatus, TaskType,
                            TensorParallelism)

OK, INVALID, DFS_UNAVAILABLE = 0, -600, -1601


# ---- 1. the names ----

@pytest.mark.parametrize("enum, members", [
    (SoftPinAction, {"PRESERVE": 0, "ENABLE": 1, "DISABLE": 2}),
    (ObjectDataType, {"UNKNOWN": 0, "KVCACHE": 1, "TENSOR": 2, "WEIGHT": 3, "SAMPLE": 4,
                      "ACTIVATION": 5, "GRADIENT": 6, "OPTIMIZER_STATE": 7, "METADATA": 8,
                      "GENERAL": 9}),
    (ReplicaStatus, {"UNDEFINED": 0, "INITIALIZED": 1, "PROCESSING": 2, "COMPLETE": 3,
                     "REMOVED": 4, "FAILED": 5}),
    (TaskType, {"REPLICA_COPY": 0, "REPLICA_MOVE": 1}),
    (TaskStatus, {"PENDING": 0, "PROCESSING": 1, "FAILED": 2, "SUCCESS": 3}),
])
def test_enum_members_and_numbers(enum, members):
    assert {k: v.value for k, v in enum.__members__.items()} == members
    for name, number in members.items():
        m = getattr(enum, name)
        assert (m.name, m.value, int(m)) == (name, number, number)
        assert enum(number) is m
        assert m != number  # pybind11's scoped enums equal only their own members
        assert str(m) == f"{enum.__name__}.{name}"
        assert repr(m) == f"<{enum.__name__}.{name}: {number}>"
    assert len({hash(m) for m in enum}) == len(members)


def test_exported_values_as_mooncake_exports_them():
    # export_values() of ObjectDataType, ReplicaStatus, TaskType, TaskStatus in that order:
    # TaskStatus's PROCESSING and FAILED replace ReplicaStatus's; SoftPinAction is not exported
    assert mstore.KVCACHE is ObjectDataType.KVCACHE and mstore.GENERAL is ObjectDataType.GENERAL
    assert mstore.COMPLETE is ReplicaStatus.COMPLETE and mstore.REMOVED is ReplicaStatus.REMOVED
    assert mstore.PROCESSING is TaskStatus.PROCESSING and mstore.FAILED is TaskStatus.FAILED
    assert mstore.REPLICA_MOVE is TaskType.REPLICA_MOVE and mstore.SUCCESS is TaskStatus.SUCCESS
    assert not hasattr(mstore, "ENABLE") and not hasattr(mstore, "PRESERVE")
    for name in ("SoftPinAction", "QueryTaskResponse", "ObjectDataType", "ReplicaStatus",
                 "TaskType", "TaskStatus", "ParallelAxis", "TensorParallelism", "ReadTarget"):
        assert name in mstore.__all__ and getattr(mstore, name).__doc__


def test_query_task_response_defaults_read_only():
    r = QueryTaskResponse()
    assert (r.id, r.type, r.status, r.created_at_ms_epoch, r.last_updated_at_ms_epoch,
            r.assigned_client, r.message) == ((0, 0), TaskType.REPLICA_COPY, TaskStatus.PENDING,
                                              0, 0, (0, 0), "")
    assert repr(r) == ('QueryTaskResponse(id=0-0, type=0, status=0, created_at=0, '
                       'last_updated_at=0, assigned_client=0-0, message="")')
    for field in ("id", "type", "status", "message", "assigned_client"):
        with pytest.raises(AttributeError):
            setattr(r, field, getattr(r, field))
    with pytest.raises(TypeError):
        QueryTaskResponse(message="x")  # Mooncake's constructor takes nothing


def test_parallel_axis_tensor_parallelism_read_target():
    a = ParallelAxis()
    assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == \
        ("", 0, 1, None, None, None)
    a.kind, a.rank, a.size, a.split_dim = "tp", 3, 4, 1
    a.split_dim = None
    assert (a.kind, a.rank, a.size, a.split_dim) == ("tp", 3, 4, None)
    for field, bad in (("rank", 1 << 31), ("rank", 1.0), ("size", "2"), ("kind", None),
                       ("split_dim", -(1 << 31) - 1)):
        with pytest.raises(TypeError):
            setattr(a, field, bad)
    assert a.rank == 3
    with pytest.raises(AttributeError):
        a.no_such_field = 1

    t = TensorParallelism()
    assert t.axes == []
    t.axes = [a]
    t.axes.append(ParallelAxis())  # a copy, as pybind11 converts a std::vector each read
    assert len(t.axes) == 1 and t.axes[0] is a
    with pytest.raises(TypeError):
        t.axes = [1]

    r = ReadTarget()
    assert (r.mode, r.parallelism) == ("as_stored", None)
    for given, read in (("FULL", "full"), ("Shard", "shard"), ("as_stored", "as_stored")):
        r.mode = given
        assert r.mode == read
    with pytest.raises(RuntimeError, match="Unsupported ReadTarget mode"):
        r.mode = "rows"
    assert r.mode == "as_stored"
    r.parallelism = t
    assert r.parallelism is t
    r.parallelism = None
    with pytest.raises(TypeError):
        r.parallelism = [a]


# ---- 2. ReplicateConfig ----

def test_replicate_config_defaults_and_conversions():
    c = ReplicateConfig()
    assert (c.replica_num, c.nof_replica_num, c.dfs_replica_num) == (1, 0, 0)
    assert c.soft_pin_action is SoftPinAction.PRESERVE and c.soft_pin_ttl_ms is None
    assert (c.with_hard_pin, c.prefer_alloc_in_same_node) == (False, False)
    assert (c.preferred_segments, c.preferred_nof_segments, c.preferred_segment) == ([], [], "")
    assert c.data_type is ObjectDataType.UNKNOWN and c.group_ids is None
    assert str(c) == ("ReplicateConfig: { replica_num: 1, nof_replica_num: 0, "
                      "dfs_replica_num: 0, soft_pin_action: PRESERVE, soft_pin_ttl_ms: default, "
                      "with_hard_pin: 0, preferred_segments: [], preferred_nof_segments: [], "
                      "prefer_alloc_in_same_node: 0, data_type: UNKNOWN }")

    c.soft_pin_ttl_ms = 1000
    assert c.soft_pin_ttl_ms == 1000
    c.soft_pin_ttl_ms = (1 << 64) - 1
    c.soft_pin_ttl_ms = None
    for field in ("soft_pin_ttl_ms", "replica_num", "nof_replica_num", "dfs_replica_num"):
        for bad in (-1, 1 << 64, 1.5, "3"):
            with pytest.raises(TypeError):
                setattr(c, field, bad)
    assert c.soft_pin_ttl_ms is None and c.replica_num == 1
    for field, bad in (("soft_pin_action", 1), ("data_type", 2), ("preferred_segments", "ab"),
                       ("preferred_segment", 5), ("group_ids", [1]), ("with_hard_pin", "yes")):
        with pytest.raises(TypeError):
            setattr(c, field, bad)
    with pytest.raises(AttributeError):
        c.host_id = "h"  # not bound in Mooncake's binding

    c.replica_num, c.nof_replica_num, c.dfs_replica_num = 3, 2, 1
    c.soft_pin_action, c.soft_pin_ttl_ms = SoftPinAction.ENABLE, 1500
    c.with_hard_pin = 1  # pybind11 converts anything with __bool__
    c.preferred_segments = ("a", "b")
    c.preferred_nof_segments = ["n"]
    c.preferred_segment = "p"
    c.data_type = ObjectDataType.KVCACHE
    c.group_ids = ["g1", ""]
    c.preferred_segments.append("lost")
    assert c.preferred_segments == ["a", "b"] and c.with_hard_pin is True
    assert str(c) == ("ReplicateConfig: { replica_num: 3, nof_replica_num: 2, "
                      "dfs_replica_num: 1, soft_pin_action: ENABLE, soft_pin_ttl_ms: 1500, "
                      "with_hard_pin: 1, preferred_segments: [a, b], preferred_segment "
                      "(deprecated): p, preferred_nof_segments: [n], "
                      "prefer_alloc_in_same_node: 0, data_type: KVCACHE, group_ids: [g1, ] }")
    # the older Mooncake's boolean, a view of soft_pin_action
    d = ReplicateConfig(with_soft_pin=True)
    assert d.soft_pin_action is SoftPinAction.ENABLE and d.with_soft_pin
    d.with_soft_pin = False
    assert d.soft_pin_action is SoftPinAction.PRESERVE


def _pin(store, key):
    info = store._c.list_keys("^" + re.escape(key) + "$", 1)
    assert len(info) == 1, info
    return info[0]["pin"]


def test_replicate_config_rules_of_a_put(store, prefix):
    k = prefix + "k"

    def cfg(**f):
        c = ReplicateConfig()
        for name, v in f.items():
            setattr(c, name, v)
        return c

    enable = cfg(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=1000)
    assert store.put(k, b"soft", enable) == OK
    assert _pin(store, k) == kvpool.PIN_SOFT
    # a TTL without ENABLE: -600, and the object is left as it was
    assert store.upsert(k, b"preserve", cfg(soft_pin_ttl_ms=1000)) == INVALID
    assert store.upsert(k, b"disable", cfg(soft_pin_action=SoftPinAction.DISABLE,
                                           soft_pin_ttl_ms=1000)) == INVALID
    assert store.put(k, b"exists", cfg(soft_pin_ttl_ms=1)) == INVALID  # before the key's check
    assert store.get(k) == b"soft"
    assert store.upsert(k, b"plain") == OK
    assert store.upsert(k, b"off", cfg(soft_pin_action=SoftPinAction.DISABLE)) == OK
    assert store.get(k) == b"off" and _pin(store, k) == kvpool.PIN_NONE
    # ENABLE without a TTL: the default soft pin; over Mooncake's 24 h cap: -600
    assert store.put(prefix + "d", b"d", cfg(soft_pin_action=SoftPinAction.ENABLE)) == OK
    assert _pin(store, prefix + "d") == kvpool.PIN_SOFT
    assert store.put(prefix + "long", b"x", cfg(soft_pin_action=SoftPinAction.ENABLE,
                                                 soft_pin_ttl_ms=24 * 3600 * 1000 + 1)) == INVALID
    assert store.put(prefix + "day", b"x", cfg(soft_pin_action=SoftPinAction.ENABLE,
                                                soft_pin_ttl_ms=24 * 3600 * 1000)) == OK

    # replica counts as Mooncake's master (built without NoF, no DFS) refuses them
    refused = {"zero": (cfg(replica_num=0), INVALID),
               "nof": (cfg(nof_replica_num=1), INVALID),
               "nof_same_node": (cfg(nof_replica_num=1, prefer_alloc_in_same_node=True), INVALID),
               "dfs2": (cfg(dfs_replica_num=2), INVALID),
               "dfs_only": (cfg(replica_num=0, dfs_replica_num=1), INVALID),
               "dfs": (cfg(dfs_replica_num=1), DFS_UNAVAILABLE)}
    buf = ctypes.create_string_buffer(b"0123456789", 10)
    for name, (c, code) in refused.items():
        key = prefix + name
        assert store.put(key, b"x", c) == code, name
        assert store.put_from(key, ctypes.addressof(buf), 10, c) == code, name
        assert store.batch_put_from([key, key + "2"], [ctypes.addressof(buf)] * 2, [10, 10],
                                    c) == [code, code], name
        assert store.is_exist(key) == 0 and store.is_exist(key + "2") == 0
    # stored, not used: data_type, group_ids, preferred_nof_segments
    ok = cfg(data_type=ObjectDataType.TENSOR, group_ids=["g"], preferred_nof_segments=["n"])
    assert store.put(prefix + "typed", b"t", ok) == OK and store.get(prefix + "typed") == b"t"


# ---- 3. get_into_ranges ----

def test_get_into_ranges_lists_of_different_lengths(store, prefix):
    k1, k2 = prefix + "r1", prefix + "r2"
    d1, d2 = b"0123456789ABCDEF", b"abcdefghijklmnop"
    assert store.put(k1, d1) == OK and store.put(k2, d2) == OK
    buf = (ctypes.c_ubyte * 32)()
    p = ctypes.addressof(buf)
    ctypes.memset(buf, ord("_"), 32)

    # key 0's offsets differ in length: its ranges -600; key 1 is still read
    r = store.get_into_ranges([p], [[k1, k2]], [[[0], [8]]], [[[0, 1], [2]]], [[[4, 4], [3]]])
    assert r == [[[INVALID], [3]]]
    assert bytes(buf[8:11]) == d2[2:5] and bytes(buf[0:4]) == b"____"
    # Mooncake's own case: an empty key row keeps its (empty) shape
    r = store.get_into_ranges([p], [[k1, k2]], [[[0], []]], [[[0, 1], []]], [[[], []]])
    assert len(r) == 1 and len(r[0]) == 2 and r[0][0][0] < 0 and r[0][1] == []
    # a buffer whose key and offset lists differ: all its ranges -600
    r = store.get_into_ranges([p, p], [[k1, k2], [k1]], [[[0], [4]], [[12]]],
                              [[[0], [0]], [[0]]], [[[2], [2]], [[2], [9]]])
    assert r == [[[2], [2]], [[INVALID]]]
    assert bytes(buf[0:2]) == d1[:2] and bytes(buf[12:14]) == b"__"
    # the five top-level lists differ: the whole answer -600, shaped by keys and offsets
    r = store.get_into_ranges([p, p], [[k1], [k1, k2]], [[[0, 1]], [[0], [1]]], [[[0, 0]]],
                              [[[1, 1]]])
    assert r == [[[INVALID, INVALID]], [[INVALID], [INVALID]]]
    r = store.get_into_ranges([p, p], [[k1]], [[[0]]], [[[0]]], [[[1]]])
    assert r == [[[INVALID]], [[INVALID]]]
    # a null buffer: its ranges -600
    assert store.get_into_ranges([0], [[k1]], [[[0]]], [[[0]]], [[[1]]]) == [[[INVALID]]]


def test_get_into_ranges_bounds(store, prefix):
    k = prefix + "b"
    data = b"0123456789ABCDEF"
    assert store.put(k, data) == OK
    reg = (ctypes.c_ubyte * 32)()
    p = ctypes.addressof(reg)
    ctypes.memset(reg, ord("_"), 32)
    assert store.register_buffer(p, 32) == OK
    # past the object's end: -600 (Mooncake checks src_offset + size against its size);
    # kvpool's short read has written the one byte there is
    assert store.get_into_ranges([p], [[k]], [[[0]]], [[[len(data) - 1]]], [[[4]]]) == \
        [[[INVALID]]]
    assert bytes(reg[0:2]) == b"F_"
    reg[0] = ord("_")
    # past the registered buffer's end (from its start, and from inside it): -600, not written
    r = store.get_into_ranges([p, p + 8], [[k, k], [k]], [[[31], [29]], [[20]]],
                              [[[0], [0]], [[0]]], [[[4], [3]], [[5]]])
    assert r == [[[INVALID], [3]], [[INVALID]]]
    assert bytes(reg[29:32]) == data[:3] and bytes(reg[0:29]) == b"_" * 29
    # unregistered after unregister_buffer: no bound but the caller's
    assert store.unregister_buffer(p) == OK
    big = ctypes.create_string_buffer(64)
    assert store.get_into_ranges([ctypes.addressof(big)], [[k]], [[[40]]], [[[2]]], [[[4]]]) == \
        [[[4]]]
    assert big.raw[40:44] == data[2:6]


# ---- 4. mooncake.mooncake_config and mooncake.async_store ----

def test_mooncake_config_from_env_and_file(monkeypatch, tmp_path, caplog):
    for v in ("MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER", "MOONCAKE_GLOBAL_SEGMENT_SIZE",
              "MOONCAKE_LOCAL_BUFFER_SIZE", "MOONCAKE_PROTOCOL", "MOONCAKE_DEVICE",
              "MOONCAKE_LOCAL_HOSTNAME", "MOONCAKE_TE_META_DATA_SERVER",
              "MOONCAKE_OFFLOAD_ENABLED", "MOONCAKE_TENANT_ID", "MOONCAKE_CLIENT_HTTP_PORT",
              "MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_MASTER", "10.0.0.1:50051")
    c = MooncakeConfig.load_from_env()
    assert (c.local_hostname, c.metadata_server, c.global_segment_size, c.local_buffer_size,
            c.protocol, c.device_name, c.master_server_address) == \
        ("localhost", "P2PHANDSHAKE", 3355443200, 1 << 30, "tcp", "", "10.0.0.1:50051")
    assert (c.enable_ssd_offload, c.ssd_offload_path, c.tenant_id,
            c.enable_client_http_server, c.client_http_port) == (False, "", "default", False, 9300)
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "1.5 GB")
    monkeypatch.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "512k")
    monkeypatch.setenv("MOONCAKE_PROTOCOL", " RDMA ")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "Yes")
    monkeypatch.setenv("MOONCAKE_CLIENT_HTTP_PORT", "9400")
    c = MooncakeConfig.load_from_env()
    assert (c.global_segment_size, c.local_buffer_size, c.protocol, c.enable_ssd_offload,
            c.client_http_port) == (3 << 29, 512 << 10, "rdma", True, 9400)
    for bad_size in ("", "gb", "x"):
        monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", bad_size)
        with pytest.raises(ValueError):
            MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "-1")
    with pytest.raises(ValueError, match="non-negative"):
        MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "16mb")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "maybe")
    with pytest.raises(ValueError, match="Invalid boolean"):
        MooncakeConfig.load_from_env()

    f = tmp_path / "mooncake.json"
    f.write_text(json.dumps({"local_hostname": "n1", "metadata_server": "P2PHANDSHAKE",
                             "master_server_address": "m:1", "protocol": "Warp",
                             "global_segment_size": "2gb", "enable_ssd_offload": "off",
                             "tenant_id": None, "ssd_offload_path": 7}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(f))
    with caplog.at_level("WARNING", logger="mooncake.mooncake_config"):
        c = MooncakeConfig.load_from_env()  # the file wins over MOONCAKE_*
    assert "Unrecognised protocol 'warp'" in caplog.text
    assert (c.local_hostname, c.master_server_address, c.protocol, c.global_segment_size,
            c.local_buffer_size, c.enable_ssd_offload, c.tenant_id, c.ssd_offload_path) == \
        ("n1", "m:1", "warp", 2 << 30, 1 << 30, False, "default", "7")
    f.write_text(json.dumps({"local_hostname": "n1", "metadata_server": "P2PHANDSHAKE"}))
    with pytest.raises(ValueError, match="master_server_address"):
        MooncakeConfig.from_file(str(f))
    f.write_text(json.dumps({"local_hostname": " ", "metadata_server": "P2PHANDSHAKE",
                             "master_server_address": "m:1"}))
    with pytest.raises(ValueError, match="local_hostname"):
        MooncakeConfig.from_file(str(f))
    with pytest.raises(ValueError, match="Invalid protocol"):
        MooncakeConfig("h", "m", 0, 0, "  ", "", "a:1")


def test_async_store(pool, prefix):
    s = MooncakeDistributedStoreAsync()
    assert isinstance(s, mstore.MooncakeDistributedStore)
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", pool.addr) == OK
    try:
        async def main():
            keys = [f"{prefix}a{i}" for i in range(16)]
            codes = await asyncio.gather(*(s.async_put(k, k.encode()) for k in keys))
            got = await asyncio.gather(*(s.async_get(k) for k in keys))
            missing = await s.async_get_size(prefix + "none")
            return codes, got, missing, await s.async_remove(keys[0])
        codes, got, missing, removed = asyncio.run(main())
        assert codes == [OK] * 16 and got == [f"{prefix}a{i}".encode() for i in range(16)]
        assert missing == -704 and removed == OK
        assert s.__dict__["async_put"] is s.async_put  # made once, kept on the instance
        assert s.async_put.__name__ == "put"
        with pytest.raises(AttributeError, match="nor 'no_such'"):
            s.async_no_such
        with pytest.raises(AttributeError):
            s.put_everything
        s._not_callable = 3
        with pytest.raises(AttributeError, match="is not callable"):
            s.async__not_callable
        with pytest.raises(NotImplementedError):  # what the method raises, through the await
            asyncio.run(s.async_unmount_local_disk_segment())
    finally:
        assert s.close() == OK


# ---- init_all ----

def test_init_all(pool, prefix, monkeypatch):
    """Mooncake's init_all: setup with its fixed arguments and a segment of the size given;
    the master from MOONCAKE_MASTER; a second init is -600."""
    monkeypatch.setenv("MOONCAKE_MASTER", pool.addr)
    s = mstore.MooncakeDistributedStore()
    assert s.init_all("tcp", "", 32 << 20) == OK
    try:
        assert s.get_hostname().startswith("localhost:")
        assert s.put(prefix + "ia", b"init all") == OK
        assert s.get(prefix + "ia") == b"init all"
        assert [d["segment"] for d in s.get_replica_desc(prefix + "ia")] == [s.get_hostname()]
        assert s.init_all("tcp", "") == -600
        assert s.remove(prefix + "ia") == OK
    finally:
        assert s.close() == OK


# ---- alloc_from_mem_pool (Mooncake's dummy client) ----

def test_alloc_from_mem_pool(pool, prefix, store):
    d = mstore.MooncakeDistributedStore()
    assert d.alloc_from_mem_pool(4096) == 0  # not set up
    assert d.setup_dummy(0, 0, pool.addr) == OK
    try:
        assert d.alloc_from_mem_pool(0) == 0
        for bad in (-1, 1 << 64, 1.5, True, "8"):
            with pytest.raises(TypeError):
                d.alloc_from_mem_pool(bad)
        n = 3 << 20
        a, b = d.alloc_from_mem_pool(n), d.alloc_from_mem_pool(4096)
        assert a and b and a % 4096 == 0 and b % 4096 == 0
        assert b + 4096 <= a or a + n <= b  # two mappings
        assert ctypes.string_at(a, n) == bytes(n)  # zeroed
        data = bytes(range(256)) * 4096
        ctypes.memmove(a, data, len(data))
        assert d.register_buffer(a, n) == OK
        assert d.put_from(prefix + "m", a, len(data)) == OK
        assert store.get(prefix + "m") == data  # another store reads what it wrote
        ctypes.memset(a, 0, n)
        assert d.get_into(prefix + "m", a + 4096, n - 4096) == len(data)
        assert ctypes.string_at(a + 4096, len(data)) == data
        assert d.unregister_buffer(a) == OK
    finally:
        assert d.close() == OK
    assert ctypes.string_at(a + 4096, 16) == data[:16]  # still mapped after close
    assert store.alloc_from_mem_pool(4096) == 0  # a real client: 0, as Mooncake's


# ---- batch_replica_clear ----

def test_batch_replica_clear(make_pool, prefix):
    pool = make_pool(segments=("32MiB", "32MiB"), master_args=("--lease-ttl", "0"))
    s = mstore.MooncakeDistributedStore()
    assert s.batch_replica_clear([prefix + "a"]) == []  # not set up
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", pool.addr) == OK
    try:
        two = ReplicateConfig()
        two.replica_num = 2
        keys = [f"{prefix}k{i}" for i in range(3)]
        for k in keys:
            assert s.put(k, k.encode(), config=two) == OK
        segs = [d["segment"] for d in s.get_replica_desc(keys[0])]
        assert len(set(segs)) == 2 and all(segs)
        # no key, an empty key, a missing key, a key twice: each cleared key once
        assert s.batch_replica_clear([]) == []
        assert s.batch_replica_clear(["", prefix + "none", keys[1], keys[1]]) == [keys[1]]
        assert s.is_exist(keys[1]) == 0 and s.get(keys[1]) == b""
        # a segment holding no replica: nothing; one holding one of two: that replica goes,
        # the object stays readable from the other, whose bytes a second store reads
        assert s.batch_replica_clear(keys, segment_name="nowhere:1") == []
        assert s.batch_replica_clear([keys[0]], segment_name=segs[0]) == [keys[0]]
        assert [d["segment"] for d in s.get_replica_desc(keys[0])] == [segs[1]]
        assert s.batch_replica_clear([keys[0]], segment_name=segs[0]) == []  # none there now
        other = mstore.MooncakeDistributedStore()
        assert other.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", pool.addr) == OK
        try:
            assert other.get(keys[0]) == keys[0].encode()
        finally:
            assert other.close() == OK
        # a segment holding every replica: the object goes
        one = ReplicateConfig()
        one.preferred_segment = segs[1]
        assert s.put(prefix + "on1", b"x" * 100, config=one) == OK
        assert [d["segment"] for d in s.get_replica_desc(prefix + "on1")] == [segs[1]]
        assert s.batch_replica_clear([prefix + "on1", keys[0]], segs[1]) == [prefix + "on1",
                                                                             keys[0]]
        assert s.is_exist(prefix + "on1") == 0 and s.is_exist(keys[0]) == 0
        # every replica (segment_name ""): the rest, in the order asked
        assert s.put(keys[0], b"again", config=two) == OK
        assert s.batch_replica_clear([keys[2], keys[0]]) == [keys[2], keys[0]]
        assert [s.is_exist(k) for k in keys] == [0, 0, 0]
        for bad in ("k", [b"k"], [1]):
            with pytest.raises(TypeError):
                s.batch_replica_clear(bad)
        with pytest.raises(TypeError):
            s.batch_replica_clear([keys[0]], None)
    finally:
        assert s.close() == OK
    assert s.batch_replica_clear(keys) == []  # closed


# ---- local_buffer_size 0 (Mooncake's TestZeroLocalBufferSize) ----

def test_zero_local_buffer_size_refuses_the_byte_copying_calls(pool, prefix, store, caplog):
    s = mstore.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", pool.addr) == OK
    try:
        k = prefix + "z"
        assert store.put(k, b"stored") == OK  # by a store with a buffer
        with caplog.at_level(logging.WARNING, logger="mooncake.store"):
            assert s.put(prefix + "p", b"v") == INVALID
        assert "local_buffer_size 0" in caplog.text
        assert s.put_parts(prefix + "p", b"a", b"b") == INVALID
        assert s.put_batch([prefix + "p", prefix + "q"], [b"a", b"b"]) == INVALID
        assert s.upsert(k, b"new") == INVALID
        assert s.upsert_parts(k, b"n", b"w") == INVALID
        assert s.upsert_batch([k], [b"new"]) == INVALID
        assert [s.is_exist(x) for x in (prefix + "p", prefix + "q")] == [0, 0]
        assert s.get(k) == b"" and s.get_batch([k]) == [b""]
        assert s.get_buffer(k) is None and s.batch_get_buffer([k, k]) == [None, None]
        assert store.get(k) == b"stored"  # nothing was written
        # the calls on the caller's memory do not need the buffer
        buf = ctypes.create_string_buffer(64)
        ptr = ctypes.addressof(buf)
        assert s.get_into(k, ptr, 64) == 6 and buf.raw[:6] == b"stored"
        assert s.put_from(prefix + "f", ptr, 6) == OK and store.get(prefix + "f") == b"stored"
        assert s.batch_put_from([prefix + "g"], [ptr], [6]) == [OK]
        assert s.batch_get_into([prefix + "g"], [ptr + 8], [32]) == [6]
        assert s.get_size(k) == 6 and s.is_exist(k) == 1 and s.remove(prefix + "g") == OK
        # a dict without local_buffer_size gets Mooncake's default, a buffer; 0 refuses
        cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
               "global_segment_size": 0, "protocol": "tcp", "master_server_address": pool.addr}
        assert s.setup(cfg) == OK and s.get(k) == b"stored"
        assert s.setup(dict(cfg, local_buffer_size="0")) == OK and s.get(k) == b""
        assert s.setup(dict(cfg, local_buffer_size="1MB")) == OK
        assert s.put(prefix + "p", b"v") == OK and s.get(prefix + "p") == b"v"
    finally:
        assert s.close() == OK
    d = mstore.MooncakeDistributedStore()  # the dummy client's buffer too
    assert d.setup_dummy(0, 0, pool.addr) == OK
    try:
        assert d.put(prefix + "d", b"v") == INVALID and d.get(k) == b""
    finally:
        assert d.close() == OK
    assert d.setup_dummy(0, 1 << 20, pool.addr) == OK
    try:
        assert d.put(prefix + "d", b"v") == OK and d.get(prefix + "d") == b"v"
    finally:
        assert d.close() == OK
