"""mooncake.store's _with_parallelism family (Mooncake's unified parallel tensor API,
client/python/mooncake/store/_parallel.py): the keys and bytes each write stores
(checked against headers and manifests built here from Mooncake's structs, so an
object written by either reads in the other), the reads of each ReadTarget, the
_into and _from forms, upserts, and the requests Mooncake refuses.

torch: as test_tensor.py (skipped without it unless KVPOOL_TEST_REQUIRE_TORCH)."""

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

from mooncake.store import ParallelAxis, ReadTarget, ReplicateConfig, TensorParallelism

OK, INVALID = 0, -600
F32, I16 = 0, 4  # Mooncake's TensorDtype numbers
DP, TP, EP, PP = 0, 1, 2, 3  # LayoutAxisKind


class Writer:
    """A writer_partition: any object with rank, size and split_dim (Mooncake's tests
    pass a dataclass)."""

    def __init__(self, rank, size, split_dim):
        self.rank, self.size, self.split_dim = rank, size, split_dim


def axis(kind, rank, size, split_dim=None, expert_id=None, stage_id=None):
    a = ParallelAxis()
    a.kind, a.rank, a.size, a.split_dim = kind, rank, size, split_dim
    a.expert_id, a.stage_id = expert_id, stage_id
    return a


def par(*axes):
    p = TensorParallelism()
    p.axes = list(axes)
    return p


def target(mode, parallelism=None):
    t = ReadTarget()
    t.mode, t.parallelism = mode, parallelism
    return t


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def header(code, gshape, lshape, axes, nbytes):
    """Mooncake's TensorMetadata (integration_utils.h), packed here field by field: axes
    [(kind, rank, size, split_dim or -1, reserved0)], layout SHARD when there are any."""
    nd = len(lshape)
    pad = [-1] * (8 - nd)
    h = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, code, nd, 1 if axes else 0, 0, 304, nbytes)
    h += struct.pack("<8q", *gshape, *pad) + struct.pack("<8q", *lshape, *pad)
    h += struct.pack("<II", len(axes), 0)
    for i, (kind, rank, size, sd, r0) in enumerate(axes):
        h += struct.pack("<iiiiiiq", kind, i, rank, size, sd, r0, lshape[sd] if sd >= 0 else 0)
    h += bytes(32 * (4 - len(axes)))
    assert len(h) == 304
    return h


def manifest(gshape, code, split_dim, count):
    """Mooncake's WriterShardManifest (store_py_internal.h): 28 bytes, 4 of padding, the
    global shape."""
    return struct.pack("<IHHiiiii4x8q", 0x574D414E, 1, 96, code, len(gshape), split_dim, count,
                       0, *gshape, *([-1] * (8 - len(gshape))))


def same(a, b):
    return a is not None and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and \
        raw(a) == raw(b)


def grid(*shape, dtype=torch.float32):
    n = 1
    for d in shape:
        n *= d
    return torch.arange(n, dtype=dtype).view(*shape).contiguous()


def test_each_write_route_stores_mooncakes_keys_and_bytes(store, prefix):
    t = grid(4, 6)
    # one TP axis: the tensor is rank 1's shard, stored under the _with_tp key
    shard = t.chunk(3, 1)[1].contiguous()
    assert store.put_tensor_with_parallelism(f"{prefix}a", shard,
                                             par(axis("tp", 1, 3, 1))) == OK
    assert store.get(f"{prefix}a_tp_1") == header(F32, (4, 6), (4, 2), [(TP, 1, 3, 1, 0)],
                                                  32) + raw(shard)
    assert store.get(f"{prefix}a__parallelism_manifest") == manifest((4, 6), F32, 1, 3)

    # several axes: the full tensor, rank 2's shard kept; the key in dp, tp, ep, pp order,
    # the header's axes in the request's order
    assert store.put_tensor_with_parallelism(
        f"{prefix}b", t, par(axis("TP", 2, 3, 1), axis("dp", 1, 2))) == OK
    assert store.get(f"{prefix}b__dp_1of2__tp_2of3_sd1") == header(
        F32, (4, 6), (4, 2), [(TP, 2, 3, 1, 0), (DP, 1, 2, -1, 0)], 32) + raw(t[:, 4:])
    assert store.get(f"{prefix}b__parallelism_manifest") == manifest((4, 6), F32, 1, 3)
    assert store.put_tensor_with_parallelism(
        f"{prefix}c", t, par(axis("pp", 1, 2, stage_id=7), axis("tp", 0, 2, 0))) == OK
    assert store.get(f"{prefix}c__tp_0of2_sd0__pp_1of2_sid7") == header(
        F32, (4, 6), (2, 6), [(PP, 1, 2, -1, 7), (TP, 0, 2, 0, 0)], 48) + raw(t[:2])

    # axes without TP: the tensor whole under their key, no manifest
    assert store.put_tensor_with_parallelism(f"{prefix}e", t,
                                             par(axis("ep", 1, 2, expert_id=5))) == OK
    assert store.get(f"{prefix}e__ep_1of2_eid5") == header(
        F32, (4, 6), (4, 6), [(EP, 1, 2, -1, 5)], 96) + raw(t)
    assert store.is_exist(f"{prefix}e__parallelism_manifest") == 0

    # a writer_partition: rank 1's shard of the full tensor, and the writer manifest
    assert store.put_tensor_with_parallelism(f"{prefix}w", t,
                                             writer_partition=Writer(1, 2, 0)) == OK
    assert store.get(f"{prefix}w__writer_1of2_sd0") == header(
        F32, (4, 6), (2, 6), [(TP, 1, 2, 0, 0)], 48) + raw(t[2:])
    assert store.get(f"{prefix}w__writer_manifest") == manifest((4, 6), F32, 0, 2)

    # neither: put_tensor's object
    assert store.put_tensor_with_parallelism(f"{prefix}d", t) == OK
    assert store.get(f"{prefix}d") == header(F32, (4, 6), (4, 6), [], 96) + raw(t)

    # batches: per key as the single forms, an entry None storing that key whole
    assert store.batch_put_tensor_with_parallelism(
        [f"{prefix}x", f"{prefix}y"], [t, t], [par(axis("dp", 0, 2), axis("tp", 1, 2, 1)),
                                               None]) == [OK, OK]
    assert store.get(f"{prefix}x__dp_0of2__tp_1of2_sd1")[304:] == raw(t[:, 3:])
    assert store.get(f"{prefix}y") == store.get(f"{prefix}d")


def test_reads_of_each_target(store, prefix):
    t = grid(8, 12, 6)
    for r, s in enumerate(t.chunk(4, 1)):  # stored as 4 TP shards along dim 1
        assert store.put_tensor_with_parallelism(f"{prefix}t", s.contiguous(),
                                                 par(axis("tp", r, 4, 1))) == OK
    for r in range(4):  # the stored shards, and the _with_tp wrapper reads the same
        got = store.get_tensor_with_parallelism(f"{prefix}t",
                                                target("shard", par(axis("tp", r, 4, 1))))
        assert same(got, t.chunk(4, 1)[r].contiguous())
        assert same(store.get_tensor_with_tp(f"{prefix}t", r, 4, 1), got)
    for size in (1, 2, 3, 6, 12):  # another TP size: cut out of the stored ones
        for r in range(size):
            got = store.get_tensor_with_parallelism(
                f"{prefix}t", target("shard", par(axis("tp", r, size, 1))))
            assert same(got, t.chunk(size, 1)[r].contiguous()), (size, r)
        full = store.get_tensor_with_parallelism(
            f"{prefix}t", target("full", par(axis("tp", size - 1, size, 1))))
        assert same(full, t), size
    # a size that does not divide the dimension: nothing, but for Mooncake's last resort
    # of one TP axis, the _with_tp key of that rank as it is; another split_dim: nothing
    assert store.get_tensor_with_parallelism(
        f"{prefix}t", target("shard", par(axis("tp", 4, 5, 1)))) is None
    assert same(store.get_tensor_with_parallelism(
        f"{prefix}t", target("shard", par(axis("tp", 0, 5, 1)))), t.chunk(4, 1)[0].contiguous())
    assert store.get_tensor_with_parallelism(
        f"{prefix}t", target("full", par(axis("tp", 0, 4, 0)))) is None

    # several axes, written by each TP rank from the full tensor
    p = [par(axis("ep", 0, 2, expert_id=11), axis("tp", r, 2, 2)) for r in range(2)]
    for q in p:
        assert store.put_tensor_with_parallelism(f"{prefix}m", t, q) == OK
    got = store.batch_get_tensor_with_parallelism(
        [f"{prefix}m"] * 3, [target("full", p[1]),
                             target("shard", par(axis("tp", 3, 6, 2),
                                                 axis("ep", 0, 2, expert_id=11))),
                             target("shard", p[0])])
    assert same(got[0], t) and same(got[1], t[:, :, 3:4].contiguous())
    assert same(got[2], t[:, :, :3].contiguous())
    # other coordinates on a non-TP axis: not this tensor's shards
    assert store.get_tensor_with_parallelism(
        f"{prefix}m", target("shard", par(axis("ep", 1, 2, expert_id=11),
                                          axis("tp", 0, 2, 2)))) is None

    # writer partitions: "full" without parallelism joins them; a one-TP-axis shard
    # target finds each under its writer key
    for r in range(3):
        assert store.put_tensor_with_parallelism(f"{prefix}w", t,
                                                 writer_partition=Writer(r, 3, 2)) == OK
    assert same(store.get_tensor_with_parallelism(f"{prefix}w", target("full")), t)
    assert same(store.get_tensor_with_parallelism(
        f"{prefix}w", target("shard", par(axis("tp", 2, 3, 2)))), t[:, :, 4:].contiguous())

    # as stored: key as it is (also "full" when no writer manifest exists)
    assert store.put_tensor_with_parallelism(f"{prefix}p", t) == OK
    for tg in (None, target("as_stored"), target("full")):
        assert same(store.get_tensor_with_parallelism(f"{prefix}p", tg), t)
    assert store.batch_get_tensor_with_parallelism([f"{prefix}p", f"{prefix}none"])[1] is None


def test_into_forms_land_in_the_buffer(store, prefix):
    t = grid(6, 8)
    for r in range(2):
        assert store.put_tensor_with_parallelism(
            f"{prefix}k", t, par(axis("pp", 0, 2, stage_id=4), axis("tp", r, 2, 0))) == OK
    n = 304 + t.numel() * 4
    buf = (ctypes.c_ubyte * (4 * n))()
    base = ctypes.addressof(buf)
    assert store.register_buffer(base, 4 * n) == OK
    try:
        got = store.get_tensor_with_parallelism_into(
            f"{prefix}k", base, n, target("full", par(axis("tp", 1, 2, 0),
                                                      axis("pp", 0, 2, stage_id=4))))
        assert same(got, t)
        assert bytes(buf[:n]) == header(F32, (6, 8), (6, 8), [], t.numel() * 4) + raw(t)
        got[0, 0] = -1.0  # a view of the buffer
        assert struct.unpack_from("<f", bytes(buf[304:308]))[0] == -1.0
        # one byte short: nothing
        assert store.get_tensor_with_parallelism_into(
            f"{prefix}k", base, n - 1, target("full", par(axis("tp", 0, 2, 0),
                                                          axis("pp", 0, 2, stage_id=4)))) is None
        # a batch: a cut shard (its header names the target's axes), a stored one, a miss
        ptrs = [base + n, base + 2 * n, base + 3 * n]
        res = store.batch_get_tensor_with_parallelism_into(
            [f"{prefix}k", f"{prefix}k", f"{prefix}none"], ptrs, [n] * 3,
            [target("shard", par(axis("pp", 0, 2, stage_id=4), axis("tp", 2, 3, 0))),
             target("shard", par(axis("tp", 0, 2, 0), axis("pp", 0, 2, stage_id=4))), None])
        assert same(res[0], t[4:].contiguous()) and same(res[1], t[:3].contiguous())
        assert res[2] is None
        assert bytes(buf[n:n + 304]) == header(F32, (6, 8), (2, 8),
                                               [(PP, 0, 2, -1, 4), (TP, 2, 3, 0, 0)], 64)
        # past the registered buffer's end: refused
        assert store.get_tensor_with_parallelism_into(f"{prefix}k", base + 3 * n, n + 1,
                                                      target("shard", par(
                                                          axis("tp", 0, 2, 0),
                                                          axis("pp", 0, 2, stage_id=4)))) is None
        assert store.batch_get_tensor_with_parallelism_into([f"{prefix}k"], [base], []) == [None]
    finally:
        assert store.unregister_buffer(base) == OK


def test_from_forms_and_upserts(store, prefix):
    t = grid(4, 6)
    assert store.put_tensor(f"{prefix}seed", t) == OK
    n = 304 + 96
    buf = ctypes.create_string_buffer(n)
    ptr = ctypes.addressof(buf)
    assert store.get_tensor_into(f"{prefix}seed", ptr, n) is not None
    # one TP axis from a full tensor object: every rank's shard, no manifest
    assert store.put_tensor_with_parallelism_from(f"{prefix}a", ptr, n,
                                                  par(axis("tp", 0, 2, 1))) == OK
    for r in range(2):
        assert store.get(f"{prefix}a_tp_{r}") == header(
            F32, (4, 6), (4, 3), [(TP, r, 2, 1, 0)], 48) + raw(t.chunk(2, 1)[r])
    assert store.is_exist(f"{prefix}a__parallelism_manifest") == 0
    # several axes: every TP rank under its own key
    assert store.batch_put_tensor_with_parallelism_from(
        [f"{prefix}b"], [ptr], [n], [par(axis("dp", 1, 2), axis("tp", 1, 3, 1))]) == [OK]
    for r in range(3):
        assert store.get(f"{prefix}b__dp_1of2__tp_{r}of3_sd1")[304:] == raw(t.chunk(3, 1)[r])
    # a writer partition: its shard and the manifest; no axes: the object as it is
    assert store.put_tensor_with_parallelism_from(f"{prefix}w", ptr, n,
                                                  writer_partition=Writer(0, 2, 0)) == OK
    assert store.get(f"{prefix}w__writer_0of2_sd0")[304:] == raw(t[:2])
    assert store.get(f"{prefix}w__writer_manifest") == manifest((4, 6), F32, 0, 2)
    assert store.put_tensor_with_parallelism_from(f"{prefix}e", ptr, n,
                                                  par(axis("ep", 0, 1, expert_id=3))) == OK
    assert store.get(f"{prefix}e__ep_0of1_eid3") == header(
        F32, (4, 6), (4, 6), [(EP, 0, 1, -1, 3)], 96) + raw(t)
    assert store.put_tensor_with_parallelism_from(f"{prefix}d", ptr, n) == OK
    assert store.get(f"{prefix}d") == store.get(f"{prefix}seed")

    # upserts replace shard and manifest; a put over an existing key keeps the old
    u = (t + 100).contiguous()
    p = par(axis("tp", 1, 2, 0))
    assert store.put_tensor_with_parallelism(f"{prefix}a", u.chunk(2, 0)[1].contiguous(),
                                             par(axis("tp", 1, 2, 1))) == OK  # exists: kept
    assert store.get(f"{prefix}a_tp_1")[304:] == raw(t.chunk(2, 1)[1])
    assert store.upsert_tensor_with_parallelism(f"{prefix}a", u[2:].contiguous(), p) == OK
    assert store.get(f"{prefix}a_tp_1") == header(F32, (4, 6), (2, 6), [(TP, 1, 2, 0, 0)],
                                                  48) + raw(u[2:])
    assert store.batch_upsert_tensor_with_parallelism(
        [f"{prefix}w", f"{prefix}w"], [u, u], writer_partitions=[Writer(0, 2, 0),
                                                                  Writer(1, 2, 0)]) == [OK, OK]
    assert same(store.get_tensor_with_parallelism(f"{prefix}w", target("full")), u)
    ctypes.memmove(ptr + 304, raw(u), 96)
    assert store.upsert_tensor_with_parallelism_from(f"{prefix}e", ptr, n,
                                                     par(axis("ep", 0, 1, expert_id=3))) == OK
    assert store.get(f"{prefix}e__ep_0of1_eid3")[304:] == raw(u)
    assert store.batch_upsert_tensor_with_parallelism_from(
        [f"{prefix}b"], [ptr], [n], [par(axis("dp", 1, 2), axis("tp", 0, 3, 1))]) == [OK]
    assert store.get(f"{prefix}b__dp_1of2__tp_2of3_sd1")[304:] == raw(u.chunk(3, 1)[2])
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    assert store.upsert_tensor_with_parallelism(f"{prefix}a", t[:2].contiguous(), p,
                                                config=cfg) == OK
    assert store.get(f"{prefix}a_tp_1")[304:] == raw(t[:2])


def test_objects_as_mooncake_writes_them_read(store, prefix):
    """Shards and a manifest put as raw bytes, as Mooncake's binding lays them out
    (int16, 2 of 3 along dim 0, keys of dp+tp): the full tensor and a cut shard."""
    t = grid(6, 5, dtype=torch.int16)
    for r in range(3):
        s = t[2 * r:2 * r + 2]
        assert store.put(f"{prefix}k__dp_0of1__tp_{r}of3_sd0", header(
            I16, (6, 5), (2, 5), [(DP, 0, 1, -1, 0), (TP, r, 3, 0, 0)], 20) + raw(s)) == OK
    assert store.put(f"{prefix}k__parallelism_manifest", manifest((6, 5), I16, 0, 3)) == OK
    full = store.get_tensor_with_parallelism(
        f"{prefix}k", target("full", par(axis("tp", 0, 3, 0), axis("dp", 0, 1))))
    assert same(full, t)
    got = store.get_tensor_with_parallelism(
        f"{prefix}k", target("shard", par(axis("dp", 0, 1), axis("tp", 1, 2, 0))))
    assert same(got, t[3:].contiguous())
    # a shard whose header names other axes than its key: not joined or cut; the non-into
    # shard read still returns the _with_tp key as it is (Mooncake's last resort)
    bad = header(I16, (6, 5), (2, 5), [(TP, 1, 3, 0, 0)], 20) + raw(t[:2])
    assert store.put(f"{prefix}bad_tp_0", bad) == OK
    tp0 = par(axis("tp", 0, 3, 0))
    assert store.get_tensor_with_parallelism(f"{prefix}bad", target("full", tp0)) is None
    assert same(store.get_tensor_with_parallelism(f"{prefix}bad", target("shard", tp0)), t[:2])
    buf = ctypes.create_string_buffer(len(bad))
    assert store.get_tensor_with_parallelism_into(f"{prefix}bad", ctypes.addressof(buf),
                                                  len(bad), target("shard", tp0)) is None


def test_refusals(store, prefix):
    t = grid(2, 3)
    bad = [
        par(axis("dp", 0, 2, split_dim=0)),  # DP with split_dim
        par(axis("ep", 0, 2)),  # EP without expert_id
        par(axis("pp", 0, 2)),  # PP without stage_id
        par(axis("tp", 0, 2)),  # TP without split_dim
        par(axis("tp", 2, 2, 0)),  # rank >= size
        par(axis("tp", 0, 0, 0)),  # size 0
        par(axis("dp", 0, 1), axis("dp", 0, 1)),  # a kind twice
        par(axis("xp", 0, 1)),  # an unknown kind
        par(),  # no axes
        par(*[axis(k, 0, 1, expert_id=1, stage_id=1) for k in ("dp", "ep", "pp")],
            axis("tp", 0, 1, 0), axis("dp", 0, 1)),  # five axes
        par(axis("tp", 0, 2, 1), axis("dp", 0, 2)),  # 3 does not split over 2
        par(axis("tp", 0, 1, 2), axis("dp", 0, 2)),  # split_dim past the dimensions
    ]
    for p in bad:
        assert store.put_tensor_with_parallelism(f"{prefix}k", t, p) == INVALID
        assert store.upsert_tensor_with_parallelism(f"{prefix}k", t, p) == INVALID
    assert store.put_tensor_with_parallelism(f"{prefix}k", t, par(axis("tp", 0, 1, 0)),
                                             writer_partition=Writer(0, 1, 0)) == INVALID
    for w in (Writer(0, 2, 1), Writer(2, 2, 0), Writer(0, 1, 2), Writer(0, 1, -1)):
        assert store.put_tensor_with_parallelism(f"{prefix}k", t, writer_partition=w) == INVALID
    assert store.remove_by_regex("^" + prefix) == 0  # nothing was stored
    with pytest.raises(RuntimeError, match="Unsupported ReadTarget mode"):
        target("whole")

    # batches: both lists, lists of other lengths, a tuple where a list is due
    keys = [f"{prefix}a", f"{prefix}b"]
    one = par(axis("tp", 0, 1, 0))
    assert store.batch_put_tensor_with_parallelism(
        keys, [t, t], [one, one], writer_partitions=[Writer(0, 1, 0)] * 2) == [INVALID] * 2
    assert store.batch_put_tensor_with_parallelism(keys, [t], [one, one]) == [INVALID] * 2
    assert store.batch_put_tensor_with_parallelism(keys, [t, t], [one]) == [INVALID] * 2
    assert store.batch_put_tensor_with_parallelism(keys, [t, t], (one, one)) == [INVALID] * 2
    # one bad request in a batch refuses that key only
    assert store.batch_put_tensor_with_parallelism(
        keys, [t, t], [one, par(axis("tp", 0, 2, 1), axis("dp", 0, 2))]) == [OK, INVALID]
    assert store.get_tensor_with_parallelism(keys[0], target("shard", one)) is not None
    assert store.get_tensor_with_parallelism(keys[1], target("shard", one)) is None
    assert store.batch_get_tensor_with_parallelism(keys, [target("shard", one)]) == [None] * 2
    assert store.batch_get_tensor_with_parallelism_into(keys, [1, 1], [1, 1],
                                                        (None, None)) == [None] * 2

    # reads Mooncake refuses: as_stored with parallelism, full without a TP axis, bad axes
    assert store.put_tensor_with_parallelism(f"{prefix}e", t,
                                             par(axis("ep", 0, 1, expert_id=0))) == OK
    ep = par(axis("ep", 0, 1, expert_id=0))
    assert store.get_tensor_with_parallelism(f"{prefix}e", target("shard", ep)) is not None
    assert store.get_tensor_with_parallelism(f"{prefix}e", target("as_stored", ep)) is None
    assert store.get_tensor_with_parallelism(f"{prefix}e", target("full", ep)) is None
    assert store.get_tensor_with_parallelism(f"{prefix}e", target("shard", bad[0])) is None
    assert store.get_tensor_with_parallelism(f"{prefix}e", target("shard")) is None

    # _from: not a tensor object, a null pointer, a shard's object with TP axes
    junk = ctypes.create_string_buffer(400)
    assert store.put_tensor_with_parallelism_from(f"{prefix}f", ctypes.addressof(junk), 400,
                                                  one) == INVALID
    assert store.put_tensor_with_parallelism_from(f"{prefix}f", 0, 400, one) == INVALID
    assert store.put(f"{prefix}s", header(F32, (4, 3), (2, 3), [(TP, 0, 2, 0, 0)], 24)
                     + raw(grid(2, 3))) == OK
    sbuf = ctypes.create_string_buffer(328)
    assert store.get_into(f"{prefix}s", ctypes.addressof(sbuf), 328) == 328
    assert store.put_tensor_with_parallelism_from(f"{prefix}f", ctypes.addressof(sbuf), 328,
                                                  one) == INVALID
    assert store.is_exist(f"{prefix}f_tp_0") == 0


def test_not_set_up():
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    t = grid(2, 2)
    assert s.put_tensor_with_parallelism("k", t, par(axis("tp", 0, 1, 0))) == INVALID
    assert s.put_tensor_with_parallelism("k", t) == INVALID
    assert s.batch_upsert_tensor_with_parallelism(["k"], [t]) == [INVALID]
    assert s.get_tensor_with_parallelism("k", target("full")) is None
    assert s.batch_get_tensor_with_parallelism_into(["k"], [1], [400]) == [None]
