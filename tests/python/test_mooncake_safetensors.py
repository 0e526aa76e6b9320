"""mooncake.store's save_tensor_to_safetensor / load_tensor_from_safetensor
(Mooncake's store_py.cpp at 3b5a594): the file's bytes as the safetensors
library writes them, the files it reads and refuses, and Mooncake's return
values (0, -1100, -600; a tensor or None)."""

import ctypes
import json
import logging
import struct

import pytest

torch = pytest.importorskip("torch")

from mooncake.store import MooncakeDistributedStore  # noqa: E402
from mooncake.store import _safetensors  # noqa: E402

OK, INVALID, FILE_NOT_FOUND = 0, -600, -1100


def raw(t):
    n = t.numel() * t.element_size()
    return ctypes.string_at(t.contiguous().data_ptr(), n) if n else b""


def same(a, b):
    return (a is not None and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
            and raw(a) == raw(b))


def st_file(header, data):
    """A safetensors file of this JSON header (unpadded) and byte buffer."""
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + data


def test_bytes_as_the_safetensors_library_writes_them(tmp_path):
    # the library's own test vector (bindings/python/tests/test_pt_comparison.py,
    # test_serialization): a 2x2 int32 zero tensor named "test"
    p = tmp_path / "z.safetensors"
    _safetensors.save({"test": torch.zeros((2, 2), dtype=torch.int32)}, str(p))
    assert p.read_bytes() == (
        b'@\x00\x00\x00\x00\x00\x00\x00{"test":{"dtype":"I32","shape":[2,2],'
        b'"data_offsets":[0,16]}}    ' + b"\x00" * 16)
    # two tensors and metadata: __metadata__ first, the wider dtype first, the data
    # back to back, the header padded to 8 bytes with spaces
    a = torch.tensor([1, 2, 3], dtype=torch.int16)
    b = torch.tensor([1.5, -2.0], dtype=torch.float64)
    _safetensors.save({"a": a, "b": b}, str(p), metadata={"m": "v"})
    blob = p.read_bytes()
    (n,) = struct.unpack_from("<Q", blob)
    assert n % 8 == 0
    hdr = blob[8:8 + n]
    assert hdr.rstrip(b" ") == (b'{"__metadata__":{"m":"v"},"b":{"dtype":"F64","shape":[2],'
                                b'"data_offsets":[0,16]},"a":{"dtype":"I16","shape":[3],'
                                b'"data_offsets":[16,22]}}')
    assert blob[8 + n:] == struct.pack("<2d", 1.5, -2.0) + struct.pack("<3h", 1, 2, 3)
    got = _safetensors.load(str(p))
    assert list(got) == ["b", "a"]  # in the order of their data
    assert same(got["a"], a) and same(got["b"], b)


def test_files_the_library_refuses(tmp_path):
    good = {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    cases = {
        "short": b"\x01\x00\x00",
        "header past the end": struct.pack("<Q", 64) + b"{}",
        "header over 100 MB": struct.pack("<Q", 100_000_001) + b"{}",
        "not json": struct.pack("<Q", 4) + b"nope",
        "not an object": struct.pack("<Q", 2) + b"[]",
        "unknown dtype": st_file({"t": {"dtype": "X9", "shape": [2],
                                        "data_offsets": [0, 8]}}, b"\0" * 8),
        "size not numel*itemsize": st_file({"t": {"dtype": "F32", "shape": [3],
                                                  "data_offsets": [0, 8]}}, b"\0" * 8),
        "gap": st_file({"t": {"dtype": "F32", "shape": [2],
                              "data_offsets": [4, 12]}}, b"\0" * 12),
        "trailing bytes": st_file(good, b"\0" * 9),
        "truncated data": st_file(good, b"\0" * 7),
        "negative dim": st_file({"t": {"dtype": "F32", "shape": [-2],
                                       "data_offsets": [0, 8]}}, b"\0" * 8),
    }
    for why, blob in cases.items():
        p = tmp_path / "bad"
        p.write_bytes(blob)
        with pytest.raises(_safetensors.FormatError):
            _safetensors.load(str(p))
    p.write_bytes(st_file(good, struct.pack("<2f", 0.5, 4.0)))
    assert same(_safetensors.load(str(p))["t"], torch.tensor([0.5, 4.0]))


@pytest.mark.parametrize("t", [
    torch.tensor([1.0, 2.0, 3.0, 4.0]),
    torch.tensor([1, -2, 3], dtype=torch.int32),
    torch.tensor([True, False, True]),
    torch.arange(24, dtype=torch.float16).reshape(2, 3, 4),
    torch.arange(6, dtype=torch.bfloat16).reshape(3, 2).t(),  # not contiguous
    torch.tensor(7, dtype=torch.int64),  # 0-d
    torch.zeros((0, 3), dtype=torch.uint8),
], ids=["f32", "i32", "bool", "f16-3d", "bf16-t", "i64-0d", "u8-empty"])
def test_save_then_load_through_the_store(store, prefix, tmp_path, t):
    key = prefix + "st"
    assert store.put_tensor(key, t) == OK
    path = str(tmp_path / "t.safetensors")
    assert store.save_tensor_to_safetensor(key, path) == OK
    got = _safetensors.load(path)
    assert list(got) == [key] and same(got[key], t.contiguous())
    assert store.remove(key) == OK
    assert store.get_tensor(key) is None
    back = store.load_tensor_from_safetensor(key, path)
    assert same(back, t.contiguous())
    assert same(store.get_tensor(key), t.contiguous())


def test_save_refusals(store, prefix, tmp_path, monkeypatch):
    key = prefix + "s"
    assert store.save_tensor_to_safetensor(prefix + "none", str(tmp_path / "x")) == FILE_NOT_FOUND
    assert not (tmp_path / "x").exists()
    assert store.put(prefix + "bytes", b"not a tensor") == OK
    assert store.save_tensor_to_safetensor(prefix + "bytes", str(tmp_path / "x")) == FILE_NOT_FOUND
    assert store.put_tensor(key, torch.tensor([5.0, 6.0])) == OK
    assert store.save_tensor_to_safetensor(key, str(tmp_path)) == INVALID  # a directory
    assert store.save_tensor_to_safetensor(key, str(tmp_path / "no" / "f")) == INVALID
    # file_name None: the key is the file's name, in the working directory
    monkeypatch.chdir(tmp_path)
    assert store.save_tensor_to_safetensor(key) == OK
    assert same(_safetensors.load(str(tmp_path / key))[key], torch.tensor([5.0, 6.0]))
    assert MooncakeDistributedStore().save_tensor_to_safetensor(key) == INVALID  # not set up
    with pytest.raises(TypeError):
        store.save_tensor_to_safetensor(5)


def test_load_key_choice_and_refusals(store, prefix, tmp_path, caplog):
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3, 4], dtype=torch.int64)
    ka, kb = prefix + "a", prefix + "b"
    path = str(tmp_path / "two.safetensors")
    _safetensors.save({ka: a, kb: b}, path)  # b's data first (8-byte dtype)
    # the tensor named key, stored under key
    assert same(store.load_tensor_from_safetensor(ka, path), a)
    assert same(store.get_tensor(ka), a)
    assert store.get_tensor(kb) is None
    # a key the file lacks: its first tensor (by data), with a warning
    with caplog.at_level(logging.WARNING, logger="mooncake.store"):
        assert same(store.load_tensor_from_safetensor(prefix + "other", path), b)
    assert "not found in safetensor file" in caplog.text
    assert same(store.get_tensor(prefix + "other"), b)
    # key None: stored under the file's name
    assert same(store.load_tensor_from_safetensor(None, path), b)
    assert same(store.get_tensor(path), b)
    assert store.remove(path) == OK
    # None: no file, not a safetensors file, no tensor in it, not set up
    assert store.load_tensor_from_safetensor(prefix + "n", str(tmp_path / "missing")) is None
    (tmp_path / "junk").write_bytes(b"\xff" * 16)
    assert store.load_tensor_from_safetensor(prefix + "n", str(tmp_path / "junk")) is None
    (tmp_path / "empty").write_bytes(st_file({"__metadata__": {"k": "v"}}, b""))
    assert store.load_tensor_from_safetensor(prefix + "n", str(tmp_path / "empty")) is None
    assert store.get_tensor(prefix + "n") is None
    assert MooncakeDistributedStore().load_tensor_from_safetensor(ka, path) is None
    with pytest.raises(TypeError):  # file_name has no default, as in Mooncake
        store.load_tensor_from_safetensor(ka)


def test_tensor_gets_need_the_local_buffer(pool, prefix, store):
    # Mooncake reads get_tensor / batch_get_tensor through its local buffer (get_buffer):
    # with local_buffer_size 0 they answer None; put_tensor writes from the tensor's memory
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", pool.addr) == OK
    try:
        t = torch.arange(6, dtype=torch.float32)
        assert s.put_tensor(prefix + "t", t) == OK
        assert s.get_tensor(prefix + "t") is None
        assert s.batch_get_tensor([prefix + "t"]) == [None]
        assert same(store.get_tensor(prefix + "t"), t)
    finally:
        assert s.close() == OK
