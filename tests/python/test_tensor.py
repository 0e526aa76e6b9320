"""mooncake.store's tensor API (put_tensor, get_tensor and their batch, _into,
_from, upsert, pub and _with_tp forms), its on-store format (Mooncake's
TensorMetadata header + bytes), and the rest of Mooncake's methods.

torch: Debian's python3-torch (deploy/install-deps.sh). Where the installer ran
(deploy/test.sh exports KVPOOL_TEST_REQUIRE_TORCH=1) a missing torch fails this
module; elsewhere it is skipped."""

import ctypes
import os
import struct

import pytest

try:
    import torch
except ImportError:
    if os.environ.get("KVPOOL_TEST_REQUIRE_TORCH"):
        raise
    pytest.skip("torch is not installed (deploy/install-deps.sh installs python3-torch)",
                allow_module_level=True)

from mooncake.store import MooncakeDistributedStore, ReplicateConfig
from mooncake.store import _tensor as T

OK, NOT_FOUND, INVALID = 0, -704, -600
HDR = 304

# Mooncake's MooncakeDistributedStore methods at Mooncake@3b5a594
# (mooncake-integration/store/store_py.cpp): every one is here, implemented or
# raising NotImplementedError naming itself.
MOONCAKE_METHODS = """_get_pyclient_capsule setup setup_dummy init_all mount_segment unmount_segment
allocate_and_mount_segment unmount_and_free_segment unmount_local_disk_segment alloc_from_mem_pool
get get_batch get_offload_rpc_read_count get_buffer batch_get_buffer remove remove_by_regex
remove_all batch_remove is_exist batch_is_exist close health_check get_size get_tensor_with_tp
batch_get_tensor_with_tp get_tensor put_tensor_with_tp batch_put_tensor_with_tp put_tensor
batch_get_tensor batch_put_tensor save_tensor_to_safetensor load_tensor_from_safetensor
pub_tensor batch_pub_tensor pub_tensor_with_tp batch_pub_tensor_with_tp get_tensor_into
batch_get_tensor_into get_tensor_into_cuda batch_get_tensor_into_cuda get_tensor_with_tp_into
batch_get_tensor_with_tp_into put_tensor_from batch_put_tensor_from put_tensor_with_tp_from
batch_put_tensor_with_tp_from upsert_tensor upsert_tensor_from batch_upsert_tensor_from
batch_upsert_tensor upsert_pub_tensor batch_upsert_pub_tensor get_tensor_with_parallelism
batch_get_tensor_with_parallelism get_tensor_with_parallelism_into
batch_get_tensor_with_parallelism_into put_tensor_with_parallelism
batch_put_tensor_with_parallelism put_tensor_with_parallelism_from
batch_put_tensor_with_parallelism_from upsert_tensor_with_parallelism
upsert_tensor_with_parallelism_from batch_upsert_tensor_with_parallelism_from
batch_upsert_tensor_with_parallelism upsert_from batch_upsert_from upsert upsert_parts
upsert_batch register_buffer unregister_buffer get_into get_into_ranges batch_get_into put_from
put_from_with_metadata batch_put_from put put_parts put_batch get_hostname
batch_put_from_multi_buffers batch_get_into_multi_buffers batch_get_session_start
batch_get_into_multi_buffer_ranges batch_get_session_end batch_put_session_start
batch_put_from_multi_buffer_ranges batch_put_session_end batch_put_session_revoke
get_replica_desc batch_get_replica_desc batch_replica_clear create_copy_task create_move_task
query_task""".split()


def raw(t):
    """A tensor's bytes, C order."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def same(a, b):
    return (a is not None and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
            and raw(a) == raw(b))


def sample(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).to(torch.bool)
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 8).to(dtype)
    return torch.randint(0, 120, shape, generator=g).to(dtype)


T._t()
DTYPES = sorted(T._TO_CODE, key=str)  # every dtype of this torch that the format holds
SHAPES = {"0d": (), "1d": (7,), "4d": (2, 3, 4, 5), "empty": (0, 3)}


def test_every_mooncake_method_exists_and_unsupported_ones_say_so(store):
    missing = [m for m in MOONCAKE_METHODS if not callable(getattr(store, m, None))]
    assert missing == []
    with pytest.raises(NotImplementedError, match="unmount_local_disk_segment"):
        store.unmount_local_disk_segment()
    with pytest.raises(NotImplementedError, match="_get_pyclient_capsule"):
        store._get_pyclient_capsule()
    for m in MOONCAKE_METHODS:
        assert getattr(MooncakeDistributedStore, m).__doc__, f"{m} has no docstring"


def test_header_layout_is_mooncakes():
    h = T.pack_header(T.dtype_code(torch.bfloat16), (4, 6), 48)
    assert len(h) == HDR == struct.calcsize("<IHHiiIIQQ8q8qII" + "iiiiiiq" * 4)
    magic, ver, hsize, dt, nd, layout, _, off, nbytes = struct.unpack_from("<IHHiiIIQQ", h)
    assert (magic, ver, hsize, dt, nd, layout, off, nbytes) == (0x4D4F4F4E, 1, 304, 12, 2, 0,
                                                                304, 48)
    assert h[:4] == b"NOOM"
    assert struct.unpack_from("<8q", h, 40) == (4, 6, -1, -1, -1, -1, -1, -1)  # global
    assert struct.unpack_from("<8q", h, 104) == (4, 6, -1, -1, -1, -1, -1, -1)  # local
    s = T.pack_header(6, (2, 3), 24, (8, 3), (3, 4, 0))  # int32 shard 3 of 4 along dim 0
    assert struct.unpack_from("<I", s, 16)[0] == 1  # SHARD
    assert struct.unpack_from("<II", s, 168) == (1, 0)  # axis_count
    assert struct.unpack_from("<iiiiiiq", s, 176) == (1, 0, 3, 4, 0, 0, 2)
    # Mooncake's numbers for its 15 dtypes
    for name, code in (("float32", 0), ("float64", 1), ("int8", 2), ("uint8", 3), ("int16", 4),
                       ("int32", 6), ("int64", 8), ("bool", 10), ("float16", 11),
                       ("bfloat16", 12)):
        assert T.dtype_code(getattr(torch, name)) == code


@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_round_trip_every_dtype(store, prefix, shape_name):
    shape = SHAPES[shape_name]
    for i, dt in enumerate(DTYPES):
        t = sample(dt, shape, i)
        k = f"{prefix}{dt}"
        assert store.put_tensor(k, t) == OK, dt
        blob = store.get(k)
        assert len(blob) == HDR + len(raw(t)) and blob[HDR:] == raw(t), dt  # small: data at 304
        assert struct.unpack_from("<i", blob, 8)[0] == T.dtype_code(dt)
        got = store.get_tensor(k)
        assert same(got, t), (dt, got)
    if "bfloat16" in str(DTYPES):
        assert torch.bfloat16 in DTYPES


def test_large_tensors_in_mooncake_layout_and_older_kvpool_layout_reads(store, prefix):
    """Every tensor is written as Mooncake writes it, its data at 304: an object read
    whole into a buffer stores back with put_tensor_from(key, ptr, 304 + nbytes)
    (Mooncake's test_tensor_api 05-08). An object of an older kvpool (data at 4096, zeros
    after the header) still reads, into a tensor (its header read first), by get_tensor
    and by the pointer form."""
    t = sample(torch.float32, (256, 256), 11)  # 256 KiB
    assert store.put_tensor(prefix + "big", t) == OK
    blob = store.get(prefix + "big")
    assert struct.unpack_from("<QQ", blob, 24) == (HDR, t.numel() * 4)
    assert len(blob) == HDR + t.numel() * 4 and blob[HDR:] == raw(t)
    mc = bytes(T.pack_header(T.dtype_code(torch.float32), (256, 256), t.numel() * 4,
                             data_offset=HDR)) + raw(t)
    assert blob == mc  # byte for byte Mooncake's object
    # Mooncake's round trip through a buffer
    buf = torch.zeros(HDR + t.numel() * 4, dtype=torch.uint8)
    assert store.register_buffer(buf.data_ptr(), buf.numel()) == OK
    assert torch.equal(store.get_tensor_into(prefix + "big", buf.data_ptr(), buf.numel()), t)
    assert store.put_tensor_from(prefix + "again", buf.data_ptr(), HDR + t.numel() * 4) == OK
    assert store.get(prefix + "again") == mc
    assert store.unregister_buffer(buf.data_ptr()) == OK
    # an older kvpool's layout of the same tensor, stored as raw bytes
    old = bytearray(T.pack_header(T.dtype_code(torch.float32), (256, 256), t.numel() * 4,
                                  data_offset=4096))
    old += bytes(4096 - HDR) + raw(t)
    assert store.put(prefix + "old", bytes(old)) == OK
    for k in ("big", "old"):
        dest = torch.zeros(256, 256)
        assert store.get_tensor_into(prefix + k, dest) is dest and torch.equal(dest, t), k
        assert same(store.get_tensor(prefix + k), t), k
        wide = torch.zeros(4096 + t.numel() * 4, dtype=torch.uint8)
        assert torch.equal(store.get_tensor_into(prefix + k, wide.data_ptr(), wide.numel()), t)
    got = store.batch_get_tensor_into([prefix + "old", prefix + "big", prefix + "none"],
                                      [torch.zeros(256, 256) for _ in range(3)])
    assert torch.equal(got[0], t) and torch.equal(got[1], t) and got[2] is None
    # a destination the object does not fit is still refused, old layout or not
    assert store.get_tensor_into(prefix + "old", torch.zeros(128, 256)) is None
    assert store.get_tensor_into_cuda(prefix + "old", torch.zeros(255, 256)) == INVALID


def test_non_contiguous_views_are_stored_contiguous(store, prefix):
    base = sample(torch.float32, (6, 8, 4), 3)
    views = {"T": base.transpose(0, 2), "step": base[::2, :, 1::2], "perm": base.permute(2, 0, 1)}
    for name, v in views.items():
        assert not v.is_contiguous()
        assert store.put_tensor(prefix + name, v) == OK
        got = store.get_tensor(prefix + name)
        assert got.is_contiguous() and torch.equal(got, v), name
    # a destination must be contiguous: refused, nothing written
    dest = torch.zeros(8, 6, 4).transpose(0, 1)
    assert store.get_tensor_into(prefix + "T", dest) is None
    assert store.get_tensor_into_cuda(prefix + "T", dest) == INVALID


def test_refused_tensors(store, prefix):
    q = torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.quint8)
    assert store.put_tensor(prefix + "q", q) == INVALID
    assert store.put_tensor(prefix + "9d", torch.zeros([1] * 9)) == INVALID
    assert store.put_tensor(prefix + "np", [1, 2, 3]) == INVALID
    assert store.is_exist(prefix + "q") == 0 and store.is_exist(prefix + "9d") == 0
    # an object that is not a tensor
    assert store.put(prefix + "bytes", b"x" * 400) == OK
    assert store.get_tensor(prefix + "bytes") is None
    # batch: bad lengths -> -600 for each key
    assert store.batch_put_tensor([prefix + "a", prefix + "b"], [torch.zeros(1)]) == [INVALID] * 2


def test_batch_calls_with_misses(store, prefix):
    ts = [sample(torch.float16, (3, 5), i) for i in range(3)]
    keys = [f"{prefix}{i}" for i in range(3)]
    assert store.batch_put_tensor(keys, ts) == [OK] * 3
    got = store.batch_get_tensor([keys[0], prefix + "missing", keys[2]])
    assert same(got[0], ts[0]) and got[1] is None and same(got[2], ts[2])
    dests = [torch.empty(3, 5, dtype=torch.float16) for _ in range(3)]
    got = store.batch_get_tensor_into([keys[1], prefix + "missing", keys[0]], dests)
    assert got[0] is dests[0] and got[1] is None and got[2] is dests[2]
    assert same(dests[0], ts[1]) and same(dests[2], ts[0])
    assert store.batch_get_tensor_into_cuda([keys[2], prefix + "nope"], dests[:2]) == \
        [3 * 5 * 2, NOT_FOUND]
    assert store.batch_pub_tensor([prefix + "p"], [ts[0]], ReplicateConfig(replica_num=1)) == [OK]
    assert same(store.get_tensor(prefix + "p"), ts[0])


def test_put_keeps_first_upsert_replaces(store, prefix):
    a, b = sample(torch.int32, (4,), 1), sample(torch.int32, (2, 2), 2)
    k = prefix + "k"
    assert store.put_tensor(k, a) == OK
    assert store.put_tensor(k, b) == OK  # exists: 0, object unchanged (Mooncake's convention)
    assert same(store.get_tensor(k), a)
    assert store.upsert_tensor(k, b) == OK
    assert same(store.get_tensor(k), b)
    assert store.batch_upsert_tensor([k, prefix + "new"], [a, b]) == [OK, OK]
    assert same(store.get_tensor(k), a) and same(store.get_tensor(prefix + "new"), b)
    assert store.upsert_pub_tensor(k, b, ReplicateConfig()) == OK
    assert same(store.get_tensor(k), b)
    assert store.batch_upsert_pub_tensor([k], [a]) == [OK] and same(store.get_tensor(k), a)


def test_get_into_tensor_is_zero_copy(store, prefix):
    t = sample(torch.float32, (64, 33), 5)
    assert store.put_tensor(prefix + "t", t) == OK
    dest = torch.zeros(64, 33)
    p = dest.data_ptr()
    assert store.get_tensor_into(prefix + "t", dest) is dest
    assert dest.data_ptr() == p and torch.equal(dest, t)
    assert store.get_tensor_into_cuda(prefix + "t", torch.zeros(64, 33)) == t.numel() * 4
    # wrong shape or dtype: refused (None / -600)
    assert store.get_tensor_into(prefix + "t", torch.zeros(33, 64)) is None
    assert store.get_tensor_into_cuda(prefix + "t", torch.zeros(64, 33, dtype=torch.int32)) == \
        INVALID
    assert store.get_tensor_into(prefix + "missing", dest) is None
    assert store.get_tensor_into_cuda(prefix + "missing", dest) == NOT_FOUND


def test_get_into_pointer_and_put_from(store, prefix):
    """Mooncake's pointer forms: the whole object (header + data) in the caller's buffer."""
    t = sample(torch.int64, (5, 7), 9)
    assert store.put_tensor(prefix + "t", t) == OK
    buf = torch.zeros(HDR + t.numel() * 8 + 100, dtype=torch.uint8)
    got = store.get_tensor_into(prefix + "t", buf.data_ptr(), buf.numel())
    assert torch.equal(got, t) and got.data_ptr() == buf.data_ptr() + HDR
    assert bytes(buf[:4].numpy()) == b"NOOM"
    small = torch.zeros(HDR + 8, dtype=torch.uint8)
    assert store.get_tensor_into(prefix + "t", small.data_ptr(), small.numel()) is None
    got = store.batch_get_tensor_into([prefix + "t", prefix + "miss"], [buf.data_ptr()] * 2,
                                      [buf.numel()] * 2)
    assert torch.equal(got[0], t) and got[1] is None
    # refused before any read, -600 per key as Mooncake: lists of different lengths, a
    # null pointer, a store not set up
    assert store.batch_get_tensor_into([prefix + "t", prefix + "miss"], [buf.data_ptr()],
                                       [buf.numel()]) == [INVALID, INVALID]
    assert store.batch_get_tensor_into([prefix + "t", prefix + "t"], [buf.data_ptr(), 0],
                                       [buf.numel()] * 2) == [INVALID, INVALID]
    assert MooncakeDistributedStore().batch_get_tensor_into(
        [prefix + "t"], [buf.data_ptr()], [buf.numel()]) == [INVALID]
    assert MooncakeDistributedStore().batch_get_tensor_with_tp_into(
        [prefix + "t"], [buf.data_ptr()], [buf.numel()], tp_size=2) == [None]
    # put_tensor_from: the buffer as get_tensor_into left it
    n = HDR + t.numel() * 8
    assert store.put_tensor_from(prefix + "copy", buf.data_ptr(), n) == OK
    assert same(store.get_tensor(prefix + "copy"), t)
    assert store.batch_put_tensor_from([prefix + "c2"], [buf.data_ptr()], [n]) == [OK]
    junk = torch.full((n,), 7, dtype=torch.uint8)
    assert store.put_tensor_from(prefix + "junk", junk.data_ptr(), n) == INVALID
    assert store.batch_put_tensor_from([prefix + "j1", prefix + "j2"],
                                       [buf.data_ptr(), junk.data_ptr()], [n, n]) == [INVALID] * 2
    assert store.is_exist(prefix + "junk") == 0 and store.is_exist(prefix + "j1") == 0
    # upsert from a buffer replaces
    u = sample(torch.int64, (5, 7), 10)
    assert store.put_tensor(prefix + "u", u) == OK
    assert store.upsert_tensor_from(prefix + "copy", buf.data_ptr(), n) == OK
    assert store.get_tensor_into(prefix + "u", buf.data_ptr(), buf.numel()) is not None
    assert store.batch_upsert_tensor_from([prefix + "copy"], [buf.data_ptr()], [n]) == [OK]
    assert same(store.get_tensor(prefix + "copy"), u)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_with_tp(store, prefix, tp):
    for split_dim in (0, 1):
        t = sample(torch.bfloat16, (16, 24, 3), tp + split_dim)
        k = f"{prefix}w{split_dim}"
        assert store.put_tensor_with_tp(k, t, tp_size=tp, split_dim=split_dim) == OK
        shards = t.chunk(tp, split_dim)
        for r in range(tp):
            got = store.get_tensor_with_tp(k, tp_rank=r, tp_size=tp, split_dim=split_dim)
            assert same(got, shards[r].contiguous()), (tp, split_dim, r)
        if tp > 1:
            assert store.is_exist(k) == 0 and store.is_exist(f"{k}_tp_{tp - 1}") == 1
            blob = store.get(f"{k}_tp_1")
            assert struct.unpack_from("<I", blob, 16)[0] == 1  # SHARD
            assert struct.unpack_from("<3q", blob, 40) == (16, 24, 3)  # the full shape
            assert struct.unpack_from("<iiiii", blob, 176) == (1, 0, 1, tp, split_dim)
            full = store.get_tensor_with_tp(k, tp_rank=None, tp_size=tp, split_dim=split_dim)
            assert same(full, t)
        else:
            assert store.is_exist(k) == 1
    # batch forms, a miss among them
    ts = [sample(torch.float32, (8, 2), i) for i in range(2)]
    keys = [prefix + "b0", prefix + "b1"]
    assert store.batch_put_tensor_with_tp(keys, ts, tp_size=tp) == [OK, OK]
    got = store.batch_get_tensor_with_tp(keys + [prefix + "zz"], tp_rank=tp - 1, tp_size=tp)
    assert same(got[0], ts[0].chunk(tp)[tp - 1].contiguous()) and got[2] is None
    buf = torch.zeros(HDR + 64, dtype=torch.uint8)
    got = store.get_tensor_with_tp_into(keys[1], buf.data_ptr(), buf.numel(), tp_rank=0,
                                        tp_size=tp)
    assert same(got, ts[1].chunk(tp)[0].contiguous())
    got = store.batch_get_tensor_with_tp_into(keys, [buf.data_ptr()], [buf.numel()])
    assert got == [INVALID, INVALID]  # list lengths differ: -600 per key, as Mooncake
    assert store.batch_pub_tensor_with_tp([prefix + "p"], [ts[0]], ReplicateConfig(),
                                          tp_size=tp) == [OK]
    assert store.pub_tensor_with_tp(prefix + "p1", ts[1], None, 0, tp, 0) == OK
    assert same(store.get_tensor_with_tp(prefix + "p1", None if tp > 1 else 0, tp), ts[1])


def test_with_tp_uneven_and_bad_split_refused(store, prefix):
    t = torch.arange(30, dtype=torch.float32).reshape(10, 3)
    assert store.put_tensor_with_tp(prefix + "u", t, tp_size=4, split_dim=0) == INVALID
    assert store.put_tensor_with_tp(prefix + "u", t, tp_size=2, split_dim=1) == INVALID
    assert store.put_tensor_with_tp(prefix + "u", t, tp_size=2, split_dim=2) == INVALID
    assert store.put_tensor_with_tp(prefix + "u", t, tp_size=2, split_dim=-1) == INVALID
    assert store.batch_is_exist([f"{prefix}u_tp_{r}" for r in range(4)]) == [0, 0, 0, 0]
    assert store.batch_put_tensor_with_tp([prefix + "v", prefix + "w"],
                                          [t, torch.zeros(4, 3)], tp_size=2) == [OK, OK]
    assert store.batch_put_tensor_with_tp([prefix + "x", prefix + "y"],
                                          [t, torch.zeros(3, 3)], tp_size=2) == [OK, INVALID]


def test_put_tensor_with_tp_from(store, prefix):
    t = sample(torch.int16, (8, 6), 4)
    assert store.put_tensor(prefix + "full", t) == OK
    buf = torch.zeros(HDR + t.numel() * 2, dtype=torch.uint8)
    assert store.get_tensor_into(prefix + "full", buf.data_ptr(), buf.numel()) is not None
    assert store.put_tensor_with_tp_from(prefix + "s", buf.data_ptr(), buf.numel(), 0, 2, 1) == OK
    assert same(store.get_tensor_with_tp(prefix + "s", 1, 2, 1), t.chunk(2, 1)[1].contiguous())
    assert store.batch_put_tensor_with_tp_from([prefix + "s2"], [buf.data_ptr()], [buf.numel()],
                                               tp_size=4) == [OK]
    assert same(store.get_tensor_with_tp(prefix + "s2", None, 4, 0), t)


def test_one_gib_tensor(make_pool):
    pool = make_pool(segments=("1100MiB",))
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "", 0, 16 << 20, "auto", "", pool.addr) == OK
    try:
        n = 1 << 30
        t = torch.empty(n, dtype=torch.uint8)
        t.view(torch.int64).copy_(torch.arange(n // 8, dtype=torch.int64))
        assert s.put_tensor("big", t.view(torch.int64).view(1 << 13, -1)) == OK
        dest = torch.zeros(1 << 13, n // 8 >> 13, dtype=torch.int64)
        p = dest.data_ptr()
        assert s.get_tensor_into("big", dest) is dest and dest.data_ptr() == p
        assert torch.equal(dest.view(-1), t.view(torch.int64))
        del dest
        got = s.get_tensor("big")
        assert got.shape == (1 << 13, n // 8 >> 13) and torch.equal(got.view(-1),
                                                                    t.view(torch.int64))
    finally:
        s.close()


def test_sglang_weight_connector_sequence(store, prefix):
    """SGLang's Mooncake weight connector: the trainer side puts each parameter of a
    state dict under "<model>/<name>" (batch_put_tensor), the engine side lists what
    is there (batch_is_exist), then loads each parameter into its preallocated
    tensor (batch_get_tensor_into with the parameter tensors), TP ranks reading
    their shard (get_tensor_with_tp)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    keys = [f"{prefix}model/{k}" for k in sd]
    assert store.batch_put_tensor(keys, list(sd.values())) == [OK] * len(sd)
    assert store.batch_is_exist(keys) == [1] * len(sd)
    engine = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    params = [p.data for p in engine.state_dict(keep_vars=True).values()]
    ptrs = [p.data_ptr() for p in params]
    got = store.batch_get_tensor_into(keys, params)
    assert all(g is p for g, p in zip(got, params))
    assert [p.data_ptr() for p in params] == ptrs
    for k, v in engine.state_dict().items():
        assert torch.equal(v, sd[k]), k
    x = torch.randn(4, 16)
    assert torch.equal(engine(x), model(x))
    w = sd["0.weight"]
    assert store.put_tensor_with_tp(f"{prefix}tp/0.weight", w, 0, 2, 0) == OK
    assert torch.equal(store.get_tensor_with_tp(f"{prefix}tp/0.weight", 1, 2, 0), w[16:])


def test_transfer_queue_style_client(store, prefix):
    """A TransferQueue-style client: per step, each field of a batch of samples is
    put as one tensor per sample ("<partition>/<field>/<index>"), consumers check
    which are ready, fetch the ready ones (misses None), then the partition is
    cleared (remove_by_regex) and its keys are gone."""
    part = f"{prefix}step7"
    fields = {"input_ids": torch.int64, "attention_mask": torch.bool, "logprobs": torch.float32}
    data = {f: [sample(dt, (5 + i,), i) for i in range(4)] for f, dt in fields.items()}
    for f, ts in data.items():
        keys = [f"{part}/{f}/{i}" for i in range(len(ts) - 1)]  # the last sample not yet produced
        assert store.batch_put_tensor(keys, ts[:-1]) == [OK] * len(keys)
    want = [f"{part}/{f}/{i}" for f in fields for i in range(4)]
    ready = store.batch_is_exist(want)
    assert ready == ([1, 1, 1, 0] * 3)
    got = store.batch_get_tensor(want)
    for j, (f, i) in enumerate((f, i) for f in fields for i in range(4)):
        if i == 3:
            assert got[j] is None
        else:
            assert same(got[j], data[f][i]), (f, i)
    assert store.remove_by_regex("^" + part + "/") == 9
    assert store.batch_is_exist(want) == [0] * 12


def test_remaining_methods(store, prefix):
    assert store.health_check() == 0
    assert store.upsert(prefix + "u", b"one") == OK and store.upsert(prefix + "u", b"two!") == OK
    assert store.get(prefix + "u") == b"two!"
    assert store.upsert_parts(prefix + "u", b"ab", b"cd") == OK and store.get(prefix + "u") == b"abcd"
    assert store.upsert_batch([prefix + "u", prefix + "v"], [b"x", b"yy"]) == OK
    assert store.get_batch([prefix + "u", prefix + "v"]) == [b"x", b"yy"]
    a = ctypes.create_string_buffer(b"0123456789", 10)
    assert store.upsert_from(prefix + "u", ctypes.addressof(a), 10) == OK
    assert store.batch_upsert_from([prefix + "v"], [ctypes.addressof(a)], [4]) == [OK]
    assert store.get(prefix + "u") == b"0123456789" and store.get(prefix + "v") == b"0123"
    meta = ctypes.create_string_buffer(b"HDR:", 4)
    assert store.put_from_with_metadata(prefix + "m", ctypes.addressof(a), ctypes.addressof(meta),
                                        10, 4) == OK
    assert store.get(prefix + "m") == b"HDR:0123456789"
    out = ctypes.create_string_buffer(16)
    res = store.get_into_ranges([ctypes.addressof(out)], [[prefix + "m", prefix + "zz"]],
                                [[[0, 8], [12]]], [[[4, 10], [0]]], [[[3, 2], [1]]])
    assert res[0][0] == [3, 2] and res[0][1][0] == NOT_FOUND
    assert out.raw[:3] == b"012" and out.raw[8:10] == b"67"
    desc = store.get_replica_desc(prefix + "m")
    assert len(desc) == 1 and desc[0].is_memory_replica() and not desc[0].is_disk_replica()
    assert desc[0].status == "COMPLETE" and desc[0]["size"] == 14
    assert store.get_replica_desc(prefix + "nope") == []
    assert store.batch_remove([prefix + "m", prefix + "nope"]) == [OK, NOT_FOUND]
    assert store.get_offload_rpc_read_count() == 0
    s = MooncakeDistributedStore()
    assert s.health_check() == 1
    assert s.put_tensor("k", torch.zeros(1)) < 0 and s.get_tensor("k") is None


def test_without_torch_the_byte_api_imports_and_tensor_calls_say_why(pool):
    """mooncake.store imports with no torch; a tensor call raises ImportError naming torch."""
    import subprocess
    import sys
    code = f"""
import sys
sys.modules["torch"] = None  # import torch -> ImportError
from mooncake.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", "", 0, 16 << 20, "auto", "", {pool.addr!r}) == 0
assert s.put("nt@k", b"abc") == 0 and s.get("nt@k") == b"abc"
try:
    s.put_tensor("nt@t", object())
except ImportError as e:
    assert "torch" in str(e), e
    print("ImportError:", e)
else:
    raise SystemExit("put_tensor without torch did not raise")
s.close()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "needs torch" in p.stdout


def test_threads_share_one_store(store, prefix):
    """Four threads read different tensors into their own destinations through one store
    at once (each thread has its own header scratch): every byte lands where it belongs."""
    import threading
    ts = [sample(torch.float32, (128, 512), 40 + i) for i in range(8)]  # 256 KiB: padded
    keys = [f"{prefix}{i}" for i in range(8)]
    assert store.batch_put_tensor(keys, ts) == [OK] * 8
    errors = []

    def reader(me):
        try:
            for it in range(20):
                order = [(me + it + j) % 8 for j in range(8)]
                dests = [torch.empty(128, 512) for _ in order]
                got = store.batch_get_tensor_into([keys[j] for j in order], dests)
                for j, d, g in zip(order, dests, got):
                    assert g is d and torch.equal(d, ts[j]), (me, it, j)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    th = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert errors == []


def test_codec_helpers_structured_object_store_uses(store, prefix):
    """_tensor_metadata_size, _serialize_tensor and _deserialize_tensor, as Mooncake's
    structured_object_store sizes and writes its tensor fields with them: the header and
    bytes they make are what put_tensor stores, and what get_tensor reads back."""
    import mooncake.store as ms

    assert ms._tensor_metadata_size() == HDR
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, ::2]  # not contiguous
    meta, ptr, nbytes, owner = ms._serialize_tensor(t)
    assert len(meta) == HDR and nbytes == 12 * 4 and owner.is_contiguous()
    assert struct.unpack_from("<QQ", meta, 24) == (HDR, nbytes)  # data offset, bytes
    payload = meta + ctypes.string_at(ptr, nbytes)
    assert store.put_tensor(prefix + "t", t) == OK
    assert store.get(prefix + "t") == payload  # byte for byte what put_tensor stores
    back = ms._deserialize_tensor(store.get(prefix + "t"))
    assert back.dtype == torch.float32 and torch.equal(back, t.contiguous())
    # from these bytes written by put_from, get_tensor reads the tensor
    buf = ctypes.create_string_buffer(payload, len(payload))
    assert store.put_from(prefix + "p", ctypes.addressof(buf), len(payload)) == OK
    assert torch.equal(store.get_tensor(prefix + "p"), t.contiguous())
    empty = ms._deserialize_tensor(ms._serialize_tensor(torch.empty(0, 3))[0])
    assert empty.shape == (0, 3)
    for bad in (b"", b"x" * HDR, payload[:-1]):
        with pytest.raises(ValueError):
            ms._deserialize_tensor(bad)
    with pytest.raises(ValueError):
        ms._serialize_tensor([1, 2, 3])
