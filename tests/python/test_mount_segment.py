"""Segments mounted at run time through mooncake.store: mount_segment (a file's
range), allocate_and_mount_segment (host memory), their unmounts with and
without a grace period, and the refusals. Against a real master; the bytes are
checked where they land (in the file) and where they come back (a get of
another client)."""

import ctypes
import os
import time

import pytest

import kvpool
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
from mooncake.store.codes import INTERNAL_ERROR, INVALID_PARAMS, MOONCAKE, OK

MiB = 1 << 20
NO_HANDLE = MOONCAKE["NO_AVAILABLE_HANDLE"]
ILLEGAL_CLIENT = MOONCAKE["ILLEGAL_CLIENT"]


def segments_of(addr):
    with kvpool.Client(addr) as c:
        return {s["name"]: s for s in c.stat()["segments"]}


def wait_gone(addr, sid, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sid not in segments_of(addr):
            return True
        time.sleep(0.05)
    return False


def pattern(i, n):
    head = f"<obj {i:04d}>".encode()
    return (head * (n // len(head) + 1))[:n]


@pytest.fixture
def bare_store(make_pool):
    """A store of a pool with no memory at all, contributing none at setup."""
    p = make_pool(segments=())
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", p.addr) == OK
    yield p, s
    s.close()


def test_allocate_and_mount_segment_serves_the_pool(bare_store, prefix):
    p, s = bare_store
    assert s.put(prefix + "before", b"x" * 1000) == NO_HANDLE  # no memory in the pool yet
    r = s.allocate_and_mount_segment(32 * MiB, "tcp", "cpu")
    assert r["ret"] == OK and len(r["segment_ids"]) == 1 and r["allocated_size"] == 32 * MiB
    sid = r["segment_ids"][0]
    seg = segments_of(p.addr)[sid]
    assert seg["size"] == 32 * MiB and seg["medium"] == "dram"
    keys = [f"{prefix}{i}" for i in range(64)]
    for i, k in enumerate(keys):
        assert s.put(k, pattern(i, 64 * 1024)) == OK
    # another client (its own connections) reads them back from the mounted segment
    with kvpool.Client(p.addr, transport="tcp") as c:
        for i, k in enumerate(keys):
            assert c.get(k) == pattern(i, 64 * 1024)
    assert s.get_replica_desc(keys[0])[0].is_memory_replica()
    # unmount_segment is for mount_segment's ids, unknown ids are refused
    assert s.unmount_segment([sid]) == INVALID_PARAMS
    assert s.unmount_and_free_segment(["127.0.0.1:1"]) == INVALID_PARAMS
    assert s.unmount_and_free_segment([sid]) == OK
    assert wait_gone(p.addr, sid)
    assert s.batch_is_exist(keys) == [0] * len(keys)  # without a grace they left with it
    assert s.unmount_and_free_segment([sid]) == INVALID_PARAMS  # once only
    assert s.put(prefix + "after", b"x") == NO_HANDLE


def test_mount_segment_maps_the_files_range(bare_store, prefix, tmp_path):
    p, s = bare_store
    path = tmp_path / "seg.bin"
    fill = b"\xa5" * 4096
    with open(path, "wb") as f:  # 4 KiB before the range, 4 MiB of range, 4 KiB after
        f.write(fill * (2 + 1024))
    os.chmod(path, 0o600)
    r = s.mount_segment(str(path), 4 * MiB, 4096, "tcp", "")
    assert r["ret"] == OK and len(r["segment_ids"]) == 1
    sid = r["segment_ids"][0]
    objs = {f"{prefix}{i}": pattern(i, 100 * 1024) for i in range(8)}
    for k, v in objs.items():
        assert s.put(k, v, ReplicateConfig(preferred_segment=sid)) == OK
    data = path.read_bytes()
    assert data[:4096] == fill and data[-4096:] == fill  # nothing outside the range
    for v in objs.values():  # each object's bytes are in the file, inside the range
        at = data.find(v)
        assert 4096 <= at and at + len(v) <= 4096 + 4 * MiB
    # a same-host client of another transport choice (auto) still reads them: the
    # range is not the whole file, so it is not handed over shm and tcp serves it
    with kvpool.Client(p.addr) as c:
        for k, v in objs.items():
            assert c.get(k) == v
        moved = c.metrics()["client"]
        assert moved["tcp"]["get"]["ops"] == len(objs) and moved["shm"]["get"]["ops"] == 0
    assert s.unmount_and_free_segment([sid]) == INVALID_PARAMS  # not an allocated one
    assert s.unmount_segment([sid]) == OK
    assert wait_gone(p.addr, sid)
    assert path.exists() and s.is_exist(next(iter(objs))) == 0


def test_unmount_with_a_grace_period_moves_the_objects(make_pool, prefix):
    p = make_pool(segments=("64MiB",))
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", p.addr) == OK
    try:
        sid = s.allocate_and_mount_segment(16 * MiB)["segment_ids"][0]
        keys = [f"{prefix}{i}" for i in range(32)]
        for i, k in enumerate(keys):
            assert s.put(k, pattern(i, 32 * 1024), ReplicateConfig(preferred_segment=sid)) == OK
        assert segments_of(p.addr)[sid]["size"] == 16 * MiB
        assert s.unmount_and_free_segment([sid], grace_period_seconds=10) == OK
        assert wait_gone(p.addr, sid)
        for i, k in enumerate(keys):  # moved to the other segment, byte-exact
            assert s.get(k) == pattern(i, 32 * 1024)
    finally:
        s.close()


def test_close_unmounts_what_was_mounted(make_pool, tmp_path):
    p = make_pool(segments=())
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", p.addr) == OK
    path = tmp_path / "seg.bin"
    path.write_bytes(b"\0" * (2 * MiB))
    os.chmod(path, 0o600)
    a = s.allocate_and_mount_segment(8 * MiB)["segment_ids"][0]
    b = s.mount_segment(str(path), 2 * MiB)["segment_ids"][0]  # the whole file
    assert {a, b} <= set(segments_of(p.addr))
    assert s.put("close@k", b"v" * 5000) == OK and s.get("close@k") == b"v" * 5000
    for k, seg in (("close@a", a), ("close@b", b)):
        assert s.put(k, k.encode() * 1000, ReplicateConfig(preferred_segment=seg)) == OK
    assert (k.encode() * 1000) in path.read_bytes()  # close@b is in the file
    with kvpool.Client(p.addr) as c:  # same host, auto: both handed over shm (whole file)
        assert c.get("close@a") == b"close@a" * 1000 and c.get("close@b") == b"close@b" * 1000
        moved = c.metrics()["client"]
        assert moved["shm"]["get"]["ops"] == 2 and moved["tcp"]["get"]["ops"] == 0
    assert s.close() == OK
    assert wait_gone(p.addr, a) and wait_gone(p.addr, b)


def test_refusals(bare_store, tmp_path):
    p, s = bare_store
    path = tmp_path / "seg.bin"
    path.write_bytes(b"\0" * (1 * MiB))
    os.chmod(path, 0o600)

    def mount(*a, **kw):
        r = s.mount_segment(*a, **kw)
        assert r["segment_ids"] == []
        return r["ret"]

    assert mount(str(tmp_path / "missing"), MiB) == INVALID_PARAMS
    assert mount(str(path), MiB, 100) == INVALID_PARAMS  # offset not page-aligned
    assert mount(str(path), MiB, 4096) == INVALID_PARAMS  # runs past the end
    assert mount(str(path), 2 * MiB) == INVALID_PARAMS
    assert mount(str(path), 0) == INVALID_PARAMS
    assert mount(str(path), MiB, 0, "tcp", "cuda:0") == INVALID_PARAMS  # host memory only
    assert mount(str(tmp_path), MiB) == INVALID_PARAMS  # a directory
    assert mount(42, MiB) == INVALID_PARAMS
    link = tmp_path / "link.bin"
    link.symlink_to(path)
    assert mount(str(link), MiB) == INVALID_PARAMS  # the file itself, not a link
    os.chmod(path, 0o644)  # others could read the segment: refused
    assert mount(str(path), MiB) == ILLEGAL_CLIENT
    a = s.allocate_and_mount_segment(0)
    assert a["ret"] == INVALID_PARAMS and a["segment_ids"] == [] and a["allocated_size"] == 0
    assert s.allocate_and_mount_segment("lots")["ret"] == INVALID_PARAMS
    assert s.unmount_segment("not-a-segment") == INVALID_PARAMS
    assert s.unmount_segment([1, 2]) == INVALID_PARAMS
    assert s.unmount_segment([], grace_period_seconds=-1) == INVALID_PARAMS
    assert s.unmount_segment([], grace_period_seconds=float("nan")) == INVALID_PARAMS
    assert s.unmount_segment([], grace_period_seconds="soon") == INVALID_PARAMS
    assert s.unmount_segment([], grace_period_seconds=float("inf")) == OK  # nothing named
    assert segments_of(p.addr) == {}  # nothing was left mounted
    unset = MooncakeDistributedStore()  # before setup
    assert unset.allocate_and_mount_segment(MiB)["ret"] == INTERNAL_ERROR
    os.chmod(path, 0o600)
    assert unset.mount_segment(str(path), MiB)["ret"] == INTERNAL_ERROR


def test_native_client_says_why(pool, tmp_path):
    path = tmp_path / "seg.bin"
    path.write_bytes(b"\0" * (1 * MiB))
    os.chmod(path, 0o640)
    with pytest.raises(kvpool.Error) as e:
        kvpool.Client(pool.addr, MiB, segment_file=str(path))
    assert e.value.status == kvpool.ERR_DENIED and "mode 0600" in str(e.value)
    os.chmod(path, 0o600)
    with pytest.raises(kvpool.Error) as e:
        kvpool.Client(pool.addr, 2 * MiB, segment_file=str(path))
    assert e.value.status == kvpool.ERR_INVALID_ARG and "runs past its end" in str(e.value)
    with pytest.raises(kvpool.Error) as e:
        kvpool.Client(pool.addr, 0, segment_file=str(path))
    assert e.value.status == kvpool.ERR_INVALID_ARG and "needs a segment_size" in str(e.value)
    with kvpool.Client(pool.addr, MiB, segment_file=str(path)) as c:
        assert c.segment_name in segments_of(pool.addr)
        c.put("native@file", b"z" * 3000, preferred_segment=c.segment_name)
        assert b"z" * 3000 in path.read_bytes()
        assert c.drain(5.0) == (1, 0)  # moved to the pool's other segment
        assert c.get("native@file") == b"z" * 3000


def test_corrupted_bytes_are_checksum_mismatch(bare_store, prefix, tmp_path, monkeypatch):
    """Mooncake's checksum diagnostics (MOONCAKE_STORE_CHECKSUM=1) are always on in kvpool:
    every object's CRC32C is checked on every read. A byte changed under the store (here in
    the file a segment maps) makes a read fail with CHECKSUM_MISMATCH (-801), never return
    the wrong bytes; the switch is accepted and changes nothing."""
    monkeypatch.setenv("MOONCAKE_STORE_CHECKSUM", "1")
    p, s = bare_store
    path = tmp_path / "seg.bin"
    with open(path, "wb") as f:
        f.write(b"\0" * (4 * MiB))
    os.chmod(path, 0o600)
    r = s.mount_segment(str(path), 4 * MiB, 0, "tcp", "")
    assert r["ret"] == OK
    v = pattern(3, 64 * 1024)
    assert s.put(prefix + "crc", v, ReplicateConfig(preferred_segment=r["segment_ids"][0])) == OK
    assert s.get(prefix + "crc") == v
    data = path.read_bytes()
    at = data.find(v)
    assert at >= 0
    with open(path, "r+b") as f:  # one byte of the object's, flipped
        f.seek(at + 1000)
        f.write(bytes([v[1000] ^ 0xFF]))
    reader = MooncakeDistributedStore()
    assert reader.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", p.addr) == OK
    try:
        buf = (ctypes.c_char * (64 * 1024))()
        ptr = ctypes.addressof(buf)
        assert reader.get(prefix + "crc") == b""  # Mooncake's answer for a failed get
        assert reader.register_buffer(ptr, len(buf)) == OK
        assert reader.get_into(prefix + "crc", ptr, len(buf)) == MOONCAKE["CHECKSUM_MISMATCH"]
        assert reader.unregister_buffer(ptr) == OK
        with kvpool.Client(p.addr, transport="tcp") as c:
            with pytest.raises(kvpool.Error) as e:
                c.get(prefix + "crc")
            assert e.value.status == kvpool.ERR_CHECKSUM
    finally:
        assert reader.close() == OK
