"""Mooncake's unified parallel tensor API: the _with_parallelism family (a mixin).

As Mooncake@3b5a594 has it (mooncake-integration/store/store_py_internal.h,
store_py_parallel_write.h, store_py_parallel_read.h; design in its
docs/source/design/store/unified-parallel-tensor-io.md), so that an object
written by either reads in the other:

Writes take a TensorParallelism (axes, each a ParallelAxis of kind tp / dp /
ep / pp, any case) or a writer_partition (any object with rank, size,
split_dim), never both:

- neither: the tensor as put_tensor stores it, under key;
- one TP axis: the tensor is rank's shard already; stored under
  "<key>_tp_<rank>" (the _with_tp key) with a header whose global shape is
  the shard's times size along split_dim, and a manifest under
  "<key>__parallelism_manifest" (the first write of it stays);
- several axes, one of them TP: the tensor is the full one; the TP rank's
  uniform shard of it is stored under "<key>__<axis>__<axis>..." (axes in
  the order dp, tp, ep, pp; each "<kind>_<rank>of<size>" then "_sd<split_dim>",
  "_eid<expert_id>", "_sid<stage_id>" for those set), plus the manifest;
- axes without TP: the tensor whole, under that key, with the axes in its
  header (no manifest);
- writer_partition: rank's uniform shard of the full tensor under
  "<key>__writer_<rank>of<size>_sd<split_dim>" and a manifest under
  "<key>__writer_manifest".

The _from forms read a tensor object ([header][data], what get_tensor_into
leaves) from host memory; with TP axes they store every TP rank's shard of it
(no manifest). A manifest is 96 bytes: magic u32 0x574d414e, version u16 1,
header_size u16 96, dtype i32, ndim i32, split_dim i32, shard_count i32,
reserved i32, 4 bytes of padding, global shape i64[8] (-1 past ndim).

Reads take a ReadTarget: "as_stored" without parallelism reads key as it is;
"shard" reads the object stored under the target's key when its header names
exactly those axes, else (with a TP axis) cuts the target shard out of the
stored TP shards, found through the manifest (any stored TP size whose shards
cover it) or under the target's own TP size; "full" joins the TP shards into
the full tensor (without parallelism: a writer_partition's shards, else key
as it is). Shards join by ranged reads (get_ranges) straight into the result.
Refusals are Mooncake's: -600 for a write, None for a read, each with a
warning on the "mooncake.store" logger naming the method and the reason.

Where kvpool differs: the _into reads take any host memory (Mooncake's only
memory registered with register_buffer; a registered buffer is still held
to its registration's end), and Mooncake's dummy client refuses the "full"
reads (kvpool's serves them). A _from write of a buffer whose tensor is
itself a shard (its local shape is not its global one) with TP axes is
refused: Mooncake would read past its data.
"""

import collections as _collections
import copy as _copy
import ctypes as _ctypes
import struct as _struct

import kvpool as _kvpool

from . import _tensor as T
from ._tensor_api import _as_list, _groups_differ, _put_code
from .codes import INVALID_PARAMS, OK
from .codes import to_mooncake as _code

_KIND_NUM = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}  # LayoutAxisKind, also the key order
_KIND_NAME = {v: k for k, v in _KIND_NUM.items()}
_AXIS_KIND_MAX = 4  # RESERVED: a header may name it, no request can

Axis = _collections.namedtuple("Axis", "kind rank size split_dim expert_id stage_id")

_MANIFEST = _struct.Struct("<IHHiiiii4x8q")
MANIFEST_MAGIC = 0x574D414E
MANIFEST_SIZE = _MANIFEST.size
assert MANIFEST_SIZE == 96

_DIRECT, _WRITER, _TP, _GENERIC = range(4)


class _Refused(Exception):
    """A request Mooncake refuses (-600 for a write, None for a read); the message says why."""


# ---- requests ----


def _indexed(config, i):
    """config for key i of a batch: group_ids [group_ids[i]] (Mooncake's
    MakeIndexedConfig), the rest as it is."""
    g = getattr(config, "group_ids", None)
    if g is None:
        return config
    c = _copy.copy(config)
    c.group_ids = [g[i]]
    return c

def _int(v, what):
    """pybind11's cast<int>: an int (or __index__) of 32 bits, else TypeError."""
    if isinstance(v, float):
        raise TypeError(f"{what} must be an int, got {v!r}")
    try:
        n = v.__index__()
    except (AttributeError, TypeError):
        raise TypeError(f"{what} must be an int, got {v!r}") from None
    if not -(1 << 31) <= n < (1 << 31):
        raise TypeError(f"{what} {n} is out of range of a C int")
    return n


def _opt_int(v, what):
    return None if v is None else _int(v, what)


def parse_axis(obj):
    """A ParallelAxis (or any object with kind, rank and size) as an Axis."""
    if not all(hasattr(obj, a) for a in ("kind", "rank", "size")):
        raise _Refused("ParallelAxis must provide kind, rank, and size")
    kind = obj.kind
    if not isinstance(kind, str):
        raise TypeError(f"ParallelAxis.kind must be str, got {kind!r}")
    k = kind.upper()
    if k not in ("TP", "DP", "EP", "PP"):
        raise _Refused(f"unsupported parallel axis kind: {kind}")
    return Axis(k.lower(), _int(obj.rank, "rank"), _int(obj.size, "size"),
                _opt_int(obj.split_dim, "split_dim"), _opt_int(obj.expert_id, "expert_id"),
                _opt_int(obj.stage_id, "stage_id"))


def parse_parallelism(obj):
    """A TensorParallelism as a tuple of Axis (None for None)."""
    if obj is None:
        return None
    if not hasattr(obj, "axes"):
        raise _Refused("TensorParallelism must provide axes")
    return tuple(parse_axis(a) for a in obj.axes)


def validate(axes):
    """Mooncake's validate_parallelism_spec (axes required, not empty)."""
    if axes is None:
        raise _Refused("parallelism is required")
    if not axes:
        raise _Refused("parallelism axes cannot be empty")
    if len(axes) > T.MAX_AXES:
        raise _Refused("axis count exceeds max supported axes")
    seen = set()
    for a in axes:
        if a.size <= 0 or a.rank < 0 or a.rank >= a.size:
            raise _Refused(f"invalid rank/size for axis {a.kind}")
        if a.kind in seen:
            raise _Refused("duplicate axis kinds are not supported")
        seen.add(a.kind)
        if a.kind == "tp" and a.split_dim is None:
            raise _Refused("TP axis requires split_dim")
        if a.kind == "dp" and a.split_dim is not None:
            raise _Refused("DP axis must not provide split_dim")
        if a.kind == "ep" and a.expert_id is None:
            raise _Refused("EP axis requires expert_id")
        if a.kind == "ep" and a.split_dim is not None:
            raise _Refused("EP axis must not provide split_dim in this phase")
        if a.kind == "pp" and a.stage_id is None:
            raise _Refused("PP axis requires stage_id")
        if a.kind == "pp" and a.split_dim is not None:
            raise _Refused("PP axis must not provide split_dim")
    return axes


def parse_writer(obj):
    """A writer_partition as (rank, size, split_dim)."""
    if not all(hasattr(obj, a) for a in ("rank", "size", "split_dim")):
        raise _Refused("writer_partition must provide rank, size, and split_dim")
    rank, size, sd = (_int(obj.rank, "rank"), _int(obj.size, "size"),
                      _int(obj.split_dim, "split_dim"))
    if size <= 0 or rank < 0 or rank >= size or sd < 0:
        raise _Refused("invalid writer partition")
    return rank, size, sd


def resolve_write(parallelism, writer_partition):
    """(route, axes or (rank, size, split_dim) or None) of a write request."""
    if writer_partition is not None:
        if parallelism is not None:
            raise _Refused("writer_partition cannot be combined with parallelism")
        return _WRITER, parse_writer(writer_partition)
    if parallelism is None:
        return _DIRECT, None
    axes = validate(parse_parallelism(parallelism))
    return (_TP if any(a.kind == "tp" for a in axes) else _GENERIC), axes


def parse_target(obj):
    """A ReadTarget as (mode "as_stored" / "shard" / "full", axes or None)."""
    if obj is None:
        return "as_stored", None
    if not hasattr(obj, "mode") or not hasattr(obj, "parallelism"):
        raise _Refused("ReadTarget must provide mode and parallelism")
    mode = obj.mode
    if not isinstance(mode, str):
        raise TypeError(f"ReadTarget.mode must be str, got {mode!r}")
    m = mode.upper()
    if m not in ("AS_STORED", "SHARD", "FULL"):
        raise _Refused(f"Unsupported ReadTarget mode: {m}")
    return m.lower(), parse_parallelism(obj.parallelism)


# ---- keys ----

def canonical(axes):
    """The axes in Mooncake's canonical order: dp, tp, ep, pp (unknown kinds last)."""
    return tuple(sorted(axes, key=lambda a: _KIND_NUM.get(a.kind, _AXIS_KIND_MAX)))


def _legacy_tp(axes):
    return len(axes) == 1 and axes[0].kind == "tp"


def _suffix(a):
    s = f"{a.kind}_{a.rank}of{a.size}"
    if a.split_dim is not None:
        s += f"_sd{a.split_dim}"
    if a.expert_id is not None:
        s += f"_eid{a.expert_id}"
    if a.stage_id is not None:
        s += f"_sid{a.stage_id}"
    return s


def key_name(base, axes):
    """Mooncake's get_parallelism_key_name: "<key>_tp_<rank>" for one TP axis, else
    "<key>__<axis>__<axis>..." in canonical order."""
    if _legacy_tp(axes):
        return T.tp_key(base, axes[0].rank)
    return base + "".join("__" + _suffix(a) for a in canonical(axes))


def parallelism_manifest_key(base):
    return base + "__parallelism_manifest"


def writer_manifest_key(base):
    return base + "__writer_manifest"


def writer_key(base, rank, size, split_dim):
    return f"{base}__writer_{rank}of{size}_sd{split_dim}"


def _with_tp(axes, rank, size=None, split_dim=None):
    """axes with the TP axis's rank (and size, split_dim when given) replaced."""
    out = []
    for a in axes:
        if a.kind == "tp":
            a = a._replace(rank=rank)
            if size is not None:
                a = a._replace(size=size)
            if split_dim is not None:
                a = a._replace(split_dim=split_dim)
        out.append(a)
    return tuple(out)


def _tp_of(axes):
    return next((a for a in axes if a.kind == "tp"), None)


# ---- headers and manifests ----

def shard_header(code, global_shape, local_shape, axes, nbytes):
    """The 304-byte header of a shard (layout SHARD) with these axes, in this order
    (Mooncake's build_shard_metadata_from_shapes)."""
    if not axes or len(axes) > T.MAX_AXES or len(global_shape) != len(local_shape):
        raise _Refused("bad shard layout")
    nd = len(local_shape)
    fields = []
    for i, a in enumerate(axes):
        extent = 0
        if a.split_dim is not None:
            if not 0 <= a.split_dim < nd:
                raise _Refused(f"split_dim {a.split_dim} out of range for {nd} dimensions")
            extent = local_shape[a.split_dim]
        r0 = 0
        if a.kind == "ep" and a.expert_id is not None:
            r0 = a.expert_id
        elif a.kind == "pp" and a.stage_id is not None:
            r0 = a.stage_id
        fields += [_KIND_NUM[a.kind], i, a.rank, a.size,
                   -1 if a.split_dim is None else a.split_dim, r0, extent]
    fields += [0] * (7 * (T.MAX_AXES - len(axes)))
    pad = [-1] * (T.MAX_DIMS - nd)
    try:
        return T._HDR.pack(T.MAGIC, T.VERSION, T.HEADER_SIZE, code, nd, T.LAYOUT_SHARD, 0,
                           T.HEADER_SIZE, nbytes, *(list(global_shape) + pad),
                           *(list(local_shape) + pad), len(axes), 0, *fields)
    except _struct.error as e:
        raise _Refused(f"shape does not fit the header: {e}") from None


def pack_manifest(global_shape, code, split_dim, count):
    """The 96-byte manifest of a sharded tensor (WriterShardManifest)."""
    try:
        return _MANIFEST.pack(MANIFEST_MAGIC, 1, MANIFEST_SIZE, code, len(global_shape),
                              split_dim, count, 0,
                              *(list(global_shape) + [-1] * (T.MAX_DIMS - len(global_shape))))
    except _struct.error as e:
        raise _Refused(f"shape does not fit the manifest: {e}") from None


def parse_manifest(buf):
    """(dtype code, global shape, split_dim, shard_count) of a manifest, or None."""
    if len(buf) < MANIFEST_SIZE:
        return None
    f = _MANIFEST.unpack_from(buf, 0)
    magic, version, hsize, code, ndim, sd, count = f[:7]
    if magic != MANIFEST_MAGIC or version != 1 or hsize != MANIFEST_SIZE or \
            not 0 <= ndim <= T.MAX_DIMS or count <= 0 or not 0 <= sd < ndim:
        return None
    shape = tuple(f[8:8 + ndim])
    if any(d < 0 for d in shape):
        return None
    return code, shape, sd, count


class Meta:
    """A validated tensor header (Mooncake's ParsedTensorMetadata)."""

    __slots__ = ("code", "shape", "gshape", "off", "nbytes", "layout", "axes")

    def __init__(self, buf, total):
        code, shape, off, nbytes, f = T.parse_header(buf, total)
        nd = len(shape)
        gshape = tuple(f[9:9 + nd])
        count = f[25]
        if count > T.MAX_AXES or any(d < 0 for d in gshape) or \
                any(d != -1 for d in f[9 + nd:17]) or any(d != -1 for d in f[17 + nd:25]):
            raise T.TensorError("bad tensor header: layout fields")
        axes = []
        for i in range(count):
            kind, _idx, rank, n, sd, r0, _r1 = f[27 + 7 * i:34 + 7 * i]
            if not 0 <= kind <= _AXIS_KIND_MAX or n <= 0 or not 0 <= rank < n or \
                    not -1 <= sd < nd:
                raise T.TensorError("bad tensor header: axis fields")
            axes.append((kind, rank, n, sd, r0))
        self.code, self.shape, self.gshape = code, shape, gshape
        self.off, self.nbytes, self.layout, self.axes = off, nbytes, f[5], axes

    def parallelism(self):
        """The axes a shard's header names, canonical (None for a full tensor)."""
        if self.layout != T.LAYOUT_SHARD:
            return None
        out = []
        for kind, rank, n, sd, r0 in self.axes:
            name = _KIND_NAME.get(kind)
            out.append(Axis(name, rank, n, sd if sd >= 0 else None,
                            r0 if name == "ep" else None, r0 if name == "pp" else None))
        return canonical(out)

    def tp(self):
        """(rank, count, split_dim) of the header's TP axis, or None."""
        return next(((r, n, sd) for kind, r, n, sd, _ in self.axes if kind == _KIND_NUM["tp"]),
                    None)


def matches(axes, meta):
    """Mooncake's parallelism_matches_metadata: the header names exactly these axes."""
    stored = meta.parallelism()
    if stored is None or len(stored) != len(axes):
        return False
    return all(s.kind is not None and s == r for s, r in zip(stored, canonical(axes)))


def _tp_compatible(axes, meta):
    """Mooncake's resolve_tp_compatible_parallelism_from_metadata followed by
    parallelism_specs_equal_by_kind(allow_tp_rank_mismatch): the same axes but for the
    TP rank (axes canonical)."""
    stored = meta.parallelism()
    if stored is None or len(stored) != len(axes) or any(s.kind is None for s in stored):
        return False
    for s, r in zip(stored, axes):
        if s.kind != r.kind:
            return False
        if r.kind == "tp":
            if (s.size, s.split_dim, s.expert_id, s.stage_id) != \
                    (r.size, r.split_dim, r.expert_id, r.stage_id):
                return False
        elif s != r:
            return False
    return True


def _uniform(dim, count):
    return dim >= 0 and count > 0 and dim % count == 0


# ---- reconstruction ----

Recon = _collections.namedtuple("Recon", "sources gshape split_dim code")


def plan_cut(rec, t_start, t_ext):
    """Fragments that copy [t_start, t_start+t_ext) of the full tensor along split_dim
    out of rec's shards: ([(key, src offset, dst offset after the header, bytes)],
    target bytes). Raises _Refused as Mooncake's plan builder refuses."""
    g, sd = rec.gshape, rec.split_dim
    if not 0 <= sd < len(g) or t_start < 0 or t_ext < 0 or t_start + t_ext > g[sd]:
        raise _Refused("invalid target shard range")
    first = rec.sources[0][1]
    el = T._ITEMSIZE.get(first.code)
    if el is None:
        raise _Refused("invalid shard tensor dtype")
    before = 1
    for d in g[:sd]:
        before *= d
    after = 1
    for d in g[sd + 1:]:
        after *= d
    target_bytes = before * t_ext * after * el
    frags = []
    covered = [False] * t_ext
    for key, m in rec.sources:
        if len(m.shape) != len(g) or any(m.shape[d] != g[d] for d in range(len(g)) if d != sd):
            raise _Refused(f"shard shape mismatch for key {key}")
        tp = m.tp()
        if m.layout != T.LAYOUT_SHARD or tp is None:
            raise _Refused(f"missing TP shard metadata for key {key}")
        rank, count, tsd = tp
        if tsd != sd or not _uniform(g[sd], count):
            raise _Refused(f"invalid TP shard metadata for key {key}")
        s_start, s_ext = T.shard_range(g[sd], rank, count)
        if m.shape[sd] != s_ext:
            raise _Refused(f"shard extent mismatch for key {key}")
        lo, hi = max(s_start, t_start), min(s_start + s_ext, t_start + t_ext)
        if hi <= lo:
            continue
        n = hi - lo
        src_in, dst_in = lo - s_start, lo - t_start
        for i in range(dst_in, dst_in + n):
            covered[i] = True
        row = n * after * el
        if row == 0:
            continue
        for s in range(before):
            frags.append((key, m.off + (s * s_ext + src_in) * after * el,
                          (s * t_ext + dst_in) * after * el, row))
    if not all(covered):
        raise _Refused("shard extents do not cover reconstructed dimension")
    return frags, target_bytes


class ParallelAPI:
    """The _with_parallelism methods of MooncakeDistributedStore (module doc)."""

    # ---- reads of headers and manifests ----

    def _headers(self, c, keys):
        """[Meta or None] per key: each object's first 304 bytes, validated."""
        n = len(keys)
        scratch = T.HeaderScratch(n)
        ranges = [(k, 0, (scratch.ptr(i), T.HEADER_SIZE)) for i, k in enumerate(keys)]
        got = []
        for lo in range(0, n, _kvpool.MAX_BATCH):
            got += c.get_ranges(ranges[lo:lo + _kvpool.MAX_BATCH])
        out = []
        for i, r in enumerate(got):
            m = None
            if r == T.HEADER_SIZE:
                view = scratch.view(i)
                off, nbytes = _struct.unpack_from("<QQ", view, 24)
                try:
                    m = Meta(view, off + nbytes)
                except T.TensorError:
                    pass
            out.append(m)
        return out

    def _sources(self, c, keys):
        """[(key, Meta)] of every key, or None when one is missing or not a tensor."""
        metas = self._headers(c, keys)
        if any(m is None for m in metas):
            return None
        return list(zip(keys, metas))

    def _manifest(self, c, key):
        buf = _ctypes.create_string_buffer(MANIFEST_SIZE)
        r = c.get_ranges([(key, 0, (_ctypes.addressof(buf), MANIFEST_SIZE))])[0]
        return parse_manifest(buf.raw) if r == MANIFEST_SIZE else None

    # ---- what a read reconstructs from ----

    def _writer_recon(self, c, key):
        """A writer_partition's shards of key, or None (Mooncake's
        load_writer_shard_reconstruction)."""
        man = self._manifest(c, writer_manifest_key(key))
        if man is None:
            return None
        code, g, sd, count = man
        srcs = self._sources(c, [writer_key(key, r, count, sd) for r in range(count)])
        if srcs is None:
            return None
        for r, (_k, m) in enumerate(srcs):
            stored = m.parallelism()
            if stored is None or not _legacy_tp(stored) or \
                    (stored[0].rank, stored[0].size, stored[0].split_dim) != (r, count, sd):
                return None
        return Recon(srcs, g, sd, code)

    def _parallel_recon(self, c, key, axes):
        """The TP shards of key that a target with these axes is cut from, or None
        (Mooncake's load_parallelism_full_reconstruction_sources: the manifest's
        layout first, else the target's own TP size)."""
        tp = _tp_of(axes)
        if tp is None:
            return None
        can = canonical(axes)
        man = self._manifest(c, parallelism_manifest_key(key))
        if man is not None:
            code, g, sd, count = man
            if tp.split_dim == sd and _uniform(g[sd], tp.size) and _uniform(g[sd], count):
                shard_axes = [_with_tp(can, r, count) for r in range(count)]
                srcs = self._sources(c, [key_name(key, a) for a in shard_axes])
                if srcs is not None and all(_tp_compatible(a, m)
                                            for a, (_k, m) in zip(shard_axes, srcs)):
                    return Recon(srcs, g, sd, code)
        if _legacy_tp(can):
            first = self._headers(c, [key if tp.size <= 1 else T.tp_key(key, 0)])[0]
            stp = first.tp() if first is not None and first.layout == T.LAYOUT_SHARD else None
            if stp is None:
                return None
            _r, count, sd = stp
            g = first.gshape
            if tp.split_dim != sd or not _uniform(g[sd], tp.size) or not _uniform(g[sd], count):
                return None
            keys = [key if count <= 1 else T.tp_key(key, r) for r in range(count)]
            srcs = self._sources(c, keys)
            if srcs is None:
                return None
            for r, (_k, m) in enumerate(srcs):
                if m.layout != T.LAYOUT_SHARD or m.tp() != (r, count, sd):
                    return None
            return Recon(srcs, g, sd, first.code)
        shard_axes = [_with_tp(can, r) for r in range(tp.size)]
        srcs = self._sources(c, [key_name(key, a) for a in shard_axes])
        if srcs is None or not all(_tp_compatible(can, m) for _k, m in srcs):
            return None
        first = srcs[0][1]
        stp = first.tp()
        if stp is None or stp[2] != tp.split_dim or \
                not _uniform(first.gshape[stp[2]], tp.size):
            return None
        return Recon(srcs, first.gshape, stp[2], first.code)

    # ---- plans: (total length, [(key, src, dst offset in the buffer, bytes)], header) ----

    def _plan_whole(self, c, read_key, meta=None):
        """The object under read_key as it is stored."""
        if meta is None:
            meta = self._headers(c, [read_key])[0]
            if meta is None:
                raise _Refused(f"{read_key!r} is missing or not a tensor object")
        total = meta.off + meta.nbytes
        return total, [(read_key, 0, 0, total)], None

    def _plan_recon(self, rec, header_of):
        """A reconstruction of rec: header_of(rec) gives the range along split_dim
        [start, start + extent) to cut (all of it for the full tensor) and the header
        the result gets (_full_of, _shard_of)."""
        start, ext, header = header_of(rec)
        frags, nbytes = plan_cut(rec, start, ext)
        hdr = header(nbytes)
        return T.HEADER_SIZE + nbytes, [(k, s, T.HEADER_SIZE + d, n) for k, s, d, n in frags], hdr

    def _full_of(self, rec):
        g = rec.gshape
        return 0, g[rec.split_dim], lambda nbytes: T.pack_header(rec.code, g, nbytes)

    def _shard_of(self, axes):
        tp = _tp_of(axes)

        def of(rec):
            start, ext = T.shard_range(rec.gshape[rec.split_dim], tp.rank, tp.size)
            shape = list(rec.gshape)
            shape[rec.split_dim] = ext
            shard_header(rec.code, rec.gshape, shape, axes, 0)  # refuses what Mooncake refuses
            return start, ext, lambda nbytes: shard_header(rec.code, rec.gshape, shape, axes,
                                                           nbytes)
        return of

    def _plan(self, c, key, target, into):
        """The plan of a read of key for target (into: the _into form's routes)."""
        mode, axes = parse_target(target)
        if mode == "as_stored" and axes is None:
            return self._plan_whole(c, key)
        if mode == "full" and axes is None:
            rec = self._writer_recon(c, key)
            if rec is None:
                return None if not into else self._plan_whole(c, key)
            return self._plan_recon(rec, self._full_of)
        axes = validate(axes)
        if mode == "shard":
            read = self._resolve_shard(c, key, axes)
            if read is not None:
                return self._plan_whole(c, *read)
            if _tp_of(axes) is not None:
                rec = self._parallel_recon(c, key, axes)
                if rec is not None:
                    try:
                        return self._plan_recon(rec, self._shard_of(axes))
                    except _Refused:
                        if into:
                            raise
                if into or not _legacy_tp(axes):
                    raise _Refused(f"no shard of {key!r} for the target")
                return None  # the non-into form's last resort: the _with_tp key as it is
            raise _Refused(f"parallelism metadata mismatch for key {key!r}")
        if mode == "full":
            if _tp_of(axes) is None:
                raise _Refused("full reconstruction requires a TP axis")
            rec = self._parallel_recon(c, key, axes)
            if rec is None:
                raise _Refused(f"no TP shards of {key!r} to reconstruct from")
            return self._plan_recon(rec, self._full_of)
        raise _Refused("unsupported ReadTarget mode")

    def _resolve_shard(self, c, key, axes):
        """(read key, Meta) of the object stored for exactly these axes, or None: their
        own key, then (one TP axis) a writer_partition's shard key."""
        k = key_name(key, axes)
        m = self._headers(c, [k])[0]
        if m is not None and matches(axes, m):
            return k, m
        if _legacy_tp(axes):
            a = axes[0]
            k = writer_key(key, a.rank, a.size, a.split_dim if a.split_dim is not None else 0)
            m = self._headers(c, [k])[0]
            if m is not None:
                stored = m.parallelism()
                if stored is not None and _legacy_tp(stored) and matches(axes, m):
                    return k, m
        return None

    def _run(self, c, jobs):
        """Carry out plans: jobs [(plan, buffer address)]; per job True when every range
        read in full (its header then written at the buffer's start)."""
        ranges, owner = [], []
        for j, (plan, base) in enumerate(jobs):
            for k, s, d, n in plan[1]:
                if n:
                    ranges.append((k, s, (base + d, n)))
                    owner.append((j, n))
        ok = [True] * len(jobs)
        got = []
        for lo in range(0, len(ranges), _kvpool.MAX_BATCH):
            got += c.get_ranges(ranges[lo:lo + _kvpool.MAX_BATCH])
        for (j, n), r in zip(owner, got):
            if r != n:
                ok[j] = False
        for j, (plan, base) in enumerate(jobs):
            if ok[j] and plan[2] is not None:
                _ctypes.memmove(base, plan[2], T.HEADER_SIZE)
        return ok

    # ---- Mooncake's methods: reads ----

    def get_tensor_with_parallelism(self, key, target=None):
        """The tensor for a ReadTarget (None: as stored): "as_stored" reads key,
        "shard" the target's shard (stored, or cut out of the stored TP shards),
        "full" the full tensor joined from its TP or writer_partition shards.
        A tensor in memory of its own, or None."""
        r = self._get_par("get_tensor_with_parallelism", [key], [target])
        return r[0] if r else None

    def batch_get_tensor_with_parallelism(self, keys, targets=None):
        """get_tensor_with_parallelism per key; targets None reads each as stored
        (batch_get_tensor), else a list as long as keys ([None] * len(keys)
        otherwise). [tensor or None]."""
        method = "batch_get_tensor_with_parallelism"
        if targets is None:
            return self.batch_get_tensor(keys)
        try:
            keys = _as_list(keys, "keys")
        except TypeError as e:
            T.log_refusal(method, e)
            return []
        if not isinstance(targets, list) or len(targets) != len(keys):
            T.log_refusal(method, "targets must be a list as long as keys")
            return [None] * len(keys)
        return self._get_par(method, keys, targets)

    def _get_par(self, method, keys, targets):
        n = len(keys)

        def run(c):
            T._t()
            out = [None] * n
            for i in range(n):
                try:
                    plan = self._plan(c, keys[i], targets[i], False)
                except (_Refused, T.TensorError) as e:
                    T.log_refusal(method, f"{keys[i]!r}: {e}")
                    continue
                if plan is None:  # Mooncake's fallbacks to get_tensor
                    mode, axes = parse_target(targets[i])
                    out[i] = self.get_tensor(keys[i] if mode == "full" or axes[0].size <= 1
                                             else T.tp_key(keys[i], axes[0].rank))
                    continue
                raw = T._torch.empty(plan[0], dtype=T._torch.uint8)
                if self._run(c, [(plan, raw.data_ptr())])[0]:
                    out[i] = _tensor_over(raw.numpy(), plan[0], method, keys[i])
            return out
        return self._call(run, lambda code: [None] * n)

    def get_tensor_with_parallelism_into(self, key, buffer_ptr, size, target=None):
        """get_tensor_with_parallelism into [buffer_ptr, +size) of host memory:
        the object (header, then data) lands there, and the tensor returned views
        its data (the buffer must outlive it). None: missing, refused, or the
        buffer is too small."""
        r = self._get_par_into("get_tensor_with_parallelism_into", [key], [buffer_ptr], [size],
                               [target])
        return r[0] if r else None

    def batch_get_tensor_with_parallelism_into(self, keys, buffer_ptrs, sizes, targets=None):
        """get_tensor_with_parallelism_into per key, the ranges of all of them read
        in one batch. [tensor or None]; lists of different lengths: None each."""
        method = "batch_get_tensor_with_parallelism_into"
        try:
            keys, ptrs, sizes = (_as_list(x, w) for x, w in
                                 ((keys, "keys"), (buffer_ptrs, "buffer_ptrs"),
                                  (sizes, "sizes")))
        except TypeError as e:
            T.log_refusal(method, e)
            return []
        n = len(keys)
        if len(ptrs) != n or len(sizes) != n:
            T.log_refusal(method, "keys, buffer_ptrs, and sizes must have the same length")
            return [None] * n
        if targets is None:
            targets = [None] * n
        elif not isinstance(targets, list) or len(targets) != n:
            T.log_refusal(method, "targets must be a list as long as keys")
            return [None] * n
        return self._get_par_into(method, keys, ptrs, sizes, targets)

    def _get_par_into(self, method, keys, ptrs, sizes, targets):
        n = len(keys)

        def run(c):
            T._t()
            jobs, idx = [], []
            for i in range(n):
                try:
                    p, s = ptrs[i], sizes[i]
                    if isinstance(p, bool) or not isinstance(p, int) or p <= 0 or \
                            isinstance(s, bool) or not isinstance(s, int) or s < 0:
                        raise _Refused("a buffer needs a non-zero int address and an int size")
                    cap = self._capacity(p)
                    if cap is not None and s > cap:
                        raise _Refused("buffer range exceeds the registered buffer")
                    plan = self._plan(c, keys[i], targets[i], True)
                    if plan[0] > s:
                        raise _Refused(f"buffer too small: {plan[0]} bytes needed, {s} given")
                except (_Refused, T.TensorError) as e:
                    T.log_refusal(method, f"{keys[i]!r}: {e}")
                    continue
                jobs.append((plan, p))
                idx.append(i)
            out = [None] * n
            for (plan, p), i, ok in zip(jobs, idx, self._run(c, jobs)):
                if ok:
                    out[i] = _tensor_over(T.tensor_at(p, plan[0]), plan[0], method, keys[i])
            return out
        return self._call(run, lambda code: [None] * n)

    # ---- writes ----

    def _par_write(self, c, method, key, tensor, route, spec, cfg, upsert):
        """One write of a tensor for a resolved request (not _DIRECT): 0 or a code."""
        what = f"{method}: {key!r}"
        manifest = None
        if route == _WRITER:
            rank, count, sd = spec
            t, code, shape, _ = T._tensor_info(tensor, what)
            if sd >= len(shape) or not _uniform(shape[sd], count):
                raise _Refused(f"split_dim {sd} of shape {shape} does not split evenly over "
                               f"{count} (only uniform sharding is supported)")
            start, ext = T.shard_range(shape[sd], rank, count)
            s = t.narrow(sd, start, ext).contiguous()
            skey = writer_key(key, rank, count, sd)
            axes = (Axis("tp", rank, count, sd, None, None),)
            gshape = shape
            manifest = (writer_manifest_key(key), pack_manifest(shape, code, sd, count))
        elif route == _TP and len(spec) == 1:  # the tensor is rank's shard
            s, code, lshape, _ = T._tensor_info(tensor, what)
            tp = spec[0]
            if not 0 <= tp.split_dim < len(lshape):
                raise _Refused(f"split_dim {tp.split_dim} out of range for shape {lshape}")
            gshape = list(lshape)
            gshape[tp.split_dim] *= tp.size
            skey, axes = key_name(key, spec), spec
            manifest = (parallelism_manifest_key(key),
                        pack_manifest(gshape, code, tp.split_dim, tp.size))
        elif route == _TP:  # the full tensor: rank's shard of it
            t, code, gshape, _ = T._tensor_info(tensor, what)
            tp = _tp_of(spec)
            if not 0 <= tp.split_dim < len(gshape) or not _uniform(gshape[tp.split_dim],
                                                                   tp.size):
                raise _Refused(f"shape {gshape} does not split evenly along {tp.split_dim} "
                               f"over {tp.size} (only uniform sharding is supported)")
            start, ext = T.shard_range(gshape[tp.split_dim], tp.rank, tp.size)
            s = t.narrow(tp.split_dim, start, ext).contiguous()
            skey, axes = key_name(key, spec), spec
            manifest = (parallelism_manifest_key(key),
                        pack_manifest(gshape, code, tp.split_dim, tp.size))
        else:  # axes without TP: the tensor as it is, under their key
            s, code, gshape, _ = T._tensor_info(tensor, what)
            skey, axes = key_name(key, spec), spec
        nbytes = s.numel() * s.element_size()
        hdr = shard_header(code, gshape, tuple(s.shape), axes, nbytes)
        r = self._write_pieces(c, [skey], [hdr], [(s.data_ptr(), nbytes) if nbytes else None],
                               cfg, upsert)[0]
        if r != OK or manifest is None:
            return r
        return (_code if upsert else _put_code)(c.put(manifest[0], manifest[1], cfg))

    def _one_put(self, method, key, tensor, parallelism, config, writer_partition, upsert):
        try:
            route, spec = resolve_write(parallelism, writer_partition)
        except _Refused as e:
            T.log_refusal(method, e)
            return INVALID_PARAMS
        if self._c is None:
            T.log_refusal(method, "client not initialized")
            return INVALID_PARAMS
        if route == _DIRECT:
            return self._put_tensors(method, [key], [tensor], config, upsert)[0]

        def run(c):
            if not isinstance(key, str):
                raise TypeError("key must be str")
            try:
                return self._par_write(c, method, key, tensor, route, spec,
                                       self._write_cfg(config, upsert), upsert)
            except (_Refused, T.TensorError) as e:
                T.log_refusal(method, e)
                return INVALID_PARAMS
        return self._call(run, lambda code: code)

    def _par_write_from(self, c, method, key, ptr, size, route, spec, cfg, upsert):
        """One write of the tensor object at [ptr, +size) (route not _DIRECT)."""
        if isinstance(ptr, bool) or not isinstance(ptr, int) or ptr <= 0 or \
                isinstance(size, bool) or not isinstance(size, int) or size < T.HEADER_SIZE:
            raise _Refused("a tensor object buffer needs a non-zero address and >= 304 bytes")
        buf = T.tensor_at(ptr, size)
        m = Meta(buf, size)
        conv = _code if upsert else _put_code
        if route == _GENERIC:  # the data as it is, the header naming the axes
            hdr = shard_header(m.code, m.gshape, m.shape, spec, m.nbytes)
            return self._write_pieces(c, [key_name(key, spec)], [hdr],
                                      [(ptr + m.off, m.nbytes) if m.nbytes else None],
                                      cfg, upsert)[0]
        if m.shape != m.gshape:
            raise _Refused(f"the buffer holds a shard (shape {m.shape} of {m.gshape}), not a "
                           "full tensor")
        full = T.tensor_from_buffer(buf, m.off, m.nbytes, m.code, m.shape)
        if route == _WRITER:
            rank, count, sd = spec
            cuts = [(writer_key(key, rank, count, sd), (Axis("tp", rank, count, sd, None, None),),
                     sd, rank, count)]
        else:  # every TP rank's shard
            tp = _tp_of(spec)
            cuts = [(key_name(key, _with_tp(spec, r)), _with_tp(spec, r), tp.split_dim, r,
                     tp.size) for r in range(tp.size)]
        keys, hdrs, datas, alive = [], [], [], []
        for skey, axes, sd, rank, count in cuts:
            if not 0 <= sd < len(m.gshape) or not _uniform(m.gshape[sd], count):
                raise _Refused(f"shape {m.gshape} does not split evenly along {sd} over "
                               f"{count} (only uniform sharding is supported)")
            start, ext = T.shard_range(m.gshape[sd], rank, count)
            s = full.narrow(sd, start, ext).contiguous()
            nbytes = s.numel() * s.element_size()
            keys.append(skey)
            hdrs.append(shard_header(m.code, m.gshape, tuple(s.shape), axes, nbytes))
            datas.append((s.data_ptr(), nbytes) if nbytes else None)
            alive.append(s)
        res = self._write_pieces(c, keys, hdrs, datas, cfg, upsert)
        r = next((x for x in res if x != OK), OK)
        if r != OK or route != _WRITER:
            return r
        rank, count, sd = spec
        return conv(c.put(writer_manifest_key(key), pack_manifest(m.gshape, m.code, sd, count),
                          cfg))

    def _one_put_from(self, method, key, ptr, size, parallelism, config, writer_partition,
                      upsert):
        try:
            route, spec = resolve_write(parallelism, writer_partition)
        except _Refused as e:
            T.log_refusal(method, e)
            return INVALID_PARAMS
        if self._c is None:
            T.log_refusal(method, "client not initialized")
            return INVALID_PARAMS
        if route == _DIRECT:
            r = self._put_from(method, [key], [ptr], [size], config, upsert)
            return r[0] if r else INVALID_PARAMS

        def run(c):
            if not isinstance(key, str):
                raise TypeError("key must be str")
            try:
                T._t()
                return self._par_write_from(c, method, key, ptr, size, route, spec,
                                            self._write_cfg(config, upsert), upsert)
            except (_Refused, T.TensorError) as e:
                T.log_refusal(method, e)
                return INVALID_PARAMS
        return self._call(run, lambda code: code)

    def _batch_par(self, method, keys, values, parallelisms, writer_partitions, direct, one,
                   extra=None, config=None):
        """Mooncake's execute_batch_parallelism_write_requests: parallelisms or
        writer_partitions (lists as long as keys), never both; neither: direct()."""
        try:
            keys = _as_list(keys, "keys")
            values = _as_list(values, "values")
        except TypeError as e:
            T.log_refusal(method, e)
            return []
        n = len(keys)
        if parallelisms is not None and writer_partitions is not None:
            T.log_refusal(method, "writer_partitions cannot be combined with parallelisms")
            return [INVALID_PARAMS] * n
        if len(values) != n or (extra is not None and len(extra) != n):
            T.log_refusal(method, "values and keys must have the same length")
            return [INVALID_PARAMS] * n
        if _groups_differ(config, n):
            T.log_refusal(method, "group_ids size must match keys size")
            return [INVALID_PARAMS] * n
        if parallelisms is None and writer_partitions is None:
            return direct(keys, values)
        reqs = parallelisms if parallelisms is not None else writer_partitions
        if not isinstance(reqs, list) or len(reqs) != n:
            T.log_refusal(method, "parallelisms / writer_partitions must be a list as long "
                          "as keys")
            return [INVALID_PARAMS] * n
        par = parallelisms is not None
        return [one(i, keys[i], values[i], reqs[i] if par else None, None if par else reqs[i])
                for i in range(n)]

    def _batch_put(self, method, keys, tensors_list, parallelisms, config, writer_partitions,
                   upsert):
        def direct(ks, ts):
            if self._c is None:
                return [INVALID_PARAMS] * len(ks)
            return self._put_tensors(method, ks, ts, config, upsert)
        return self._batch_par(
            method, keys, tensors_list, parallelisms, writer_partitions, direct,
            lambda i, k, t, p, w: self._one_put(method, k, t, p, _indexed(config, i), w, upsert),
            config=config)

    def _batch_put_from(self, method, keys, buffer_ptrs, sizes, parallelisms, config,
                        writer_partitions, upsert):
        try:
            sizes = _as_list(sizes, "sizes")
        except TypeError as e:
            T.log_refusal(method, e)
            return []

        def direct(ks, ps):
            if self._c is None:
                return [INVALID_PARAMS] * len(ks)
            return self._put_from(method, ks, ps, sizes, config, upsert)
        return self._batch_par(
            method, keys, buffer_ptrs, parallelisms, writer_partitions, direct,
            lambda i, k, p, par, w: self._one_put_from(method, k, p, sizes[i], par,
                                                        _indexed(config, i), w, upsert),
            sizes, config)

    # ---- Mooncake's methods: writes ----

    def put_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                    writer_partition=None):
        """Store a tensor for a TensorParallelism or a writer_partition (module
        doc; neither: put_tensor, with config). 0, or a negative code (-600 for a
        refused request: both given, bad axes, a split that is not uniform)."""
        return self._one_put("put_tensor_with_parallelism", key, tensor, parallelism, config,
                             writer_partition, False)

    def batch_put_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                          config=None, writer_partitions=None):
        """put_tensor_with_parallelism per key: parallelisms or writer_partitions
        is a list as long as keys (an entry None: that key whole); neither: one
        batch_put_tensor. [0 / negative] per key; both, or a list of another
        length: -600 for every key."""
        return self._batch_put("batch_put_tensor_with_parallelism", keys, tensors_list,
                               parallelisms, config, writer_partitions, False)

    def put_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                         config=None, writer_partition=None):
        """put_tensor_with_parallelism of the tensor object at [buffer_ptr, +size)
        (host memory, laid out as get_tensor_into leaves it). With TP axes every
        TP rank's shard of it is stored (no manifest); with a writer_partition,
        that rank's shard and the manifest. 0 or negative."""
        return self._one_put_from("put_tensor_with_parallelism_from", key, buffer_ptr, size,
                                  parallelism, config, writer_partition, False)

    def batch_put_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes,
                                               parallelisms=None, config=None,
                                               writer_partitions=None):
        """put_tensor_with_parallelism_from per key (neither list: one
        batch_put_tensor_from). [0 / negative] per key."""
        return self._batch_put_from("batch_put_tensor_with_parallelism_from", keys, buffer_ptrs,
                                    sizes, parallelisms, config, writer_partitions, False)

    def upsert_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                       writer_partition=None):
        """put_tensor_with_parallelism, replacing what the keys hold (the shard
        and its manifest). 0 or negative."""
        return self._one_put("upsert_tensor_with_parallelism", key, tensor, parallelism, config,
                             writer_partition, True)

    def batch_upsert_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                             config=None, writer_partitions=None):
        """batch_put_tensor_with_parallelism, replacing. [0 / negative] per key."""
        return self._batch_put("batch_upsert_tensor_with_parallelism", keys, tensors_list,
                               parallelisms, config, writer_partitions, True)

    def upsert_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                            config=None, writer_partition=None):
        """put_tensor_with_parallelism_from, replacing. 0 or negative."""
        return self._one_put_from("upsert_tensor_with_parallelism_from", key, buffer_ptr, size,
                                  parallelism, config, writer_partition, True)

    def batch_upsert_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes,
                                                  parallelisms=None, config=None,
                                                  writer_partitions=None):
        """batch_put_tensor_with_parallelism_from, replacing. [0 / negative] per key."""
        return self._batch_put_from("batch_upsert_tensor_with_parallelism_from", keys,
                                    buffer_ptrs, sizes, parallelisms, config, writer_partitions,
                                    True)


def _tensor_over(buf, total, method, key):
    """The tensor a read left in buf (header, then data), viewing it; None if its
    header does not describe it."""
    try:
        code, shape, off, nbytes, _ = T.parse_header(buf, total)
    except T.TensorError as e:
        T.log_refusal(method, f"{key!r}: {e}")
        return None
    return T.tensor_from_buffer(buf, off, nbytes, code, shape)
