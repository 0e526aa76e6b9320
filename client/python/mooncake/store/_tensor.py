"""Mooncake's tensor API on kvpool: torch tensors stored as [header][bytes].

The on-store format is Mooncake's (mooncake-integration/integration_utils.h,
TensorMetadata), so that a tensor put by Mooncake's binding reads back here and
the other way round. docs/python.md, "The tensor API", has the layout; in short,
304 bytes, little-endian:

    TensorObjectHeader (40 B): magic u32 0x4d4f4f4e "NOOM", version u16 1,
        header_size u16 304, dtype i32 (Mooncake's TensorDtype), ndim i32,
        layout_kind u32 (0 full, 1 shard), reserved u32, data_offset u64 (304),
        data_bytes u64
    global_shape i64[8], local_shape i64[8] (dims past ndim: -1)
    axis_count u32, reserved u32, axes[4] of {kind i32 (1 = TP), axis_index i32,
        shard_rank i32, shard_count i32, split_dim i32, reserved i32,
        local split extent i64}

then data_bytes of the tensor's elements, C order. torch is imported on the
first tensor call, so `import mooncake.store` works without it.

Puts never copy the tensor's bytes on the Python side: the header and the
tensor's own memory go to the library as the two pieces of one object
(batch_put_multi), which reads host or CUDA memory. A non-contiguous tensor is
made contiguous first (one copy, as Mooncake does). Gets into a tensor scatter
the object over [a header scratch, the tensor's memory] (batch_get_into_multi):
the bytes land in the tensor, whose data pointer does not change.
"""

import ctypes as _ctypes
import logging as _logging
import struct as _struct
import warnings as _warnings

import kvpool as _kvpool

from .codes import INVALID_PARAMS, OK

_log = _logging.getLogger("mooncake.store")

MAGIC = 0x4D4F4F4E
VERSION = 1
HEADER_SIZE = 304
MAX_DIMS = 8
MAX_AXES = 4
LAYOUT_FULL, LAYOUT_SHARD = 0, 1
AXIS_TP = 1

# Every tensor is written as Mooncake writes it, its data right after the header (304),
# so an object read whole into a buffer (get_tensor_into's pointer form) stores back
# byte for byte with put_tensor_from(key, ptr, 304 + nbytes). kvpool once wrote tensors
# of 256 KiB or more with their data at PADDED_OFFSET (the header, then zeros); readers
# still accept any data_offset from 304 to PADDED_OFFSET, so those objects read too.
PADDED_OFFSET = 4096


def data_offset_for(nbytes):
    """Where kvpool writes the data of a tensor of nbytes: after the header (Mooncake's)."""
    return HEADER_SIZE


_HDR = _struct.Struct("<IHHiiIIQQ8q8qII" + "iiiiiiq" * MAX_AXES)
assert _HDR.size == HEADER_SIZE

# Mooncake's TensorDtype numbers (0..14), then kvpool's own for the dtypes Mooncake
# has no number for (Mooncake's reader refuses those objects: dtype >= NR_DTYPES).
_DTYPE_CODES = (
    ("float32", 0), ("float64", 1), ("int8", 2), ("uint8", 3), ("int16", 4),
    ("uint16", 5), ("int32", 6), ("uint32", 7), ("int64", 8), ("uint64", 9),
    ("bool", 10), ("float16", 11), ("bfloat16", 12), ("float8_e4m3fn", 13),
    ("float8_e5m2", 14),
    ("complex64", 64), ("complex128", 65), ("complex32", 66),
    ("float8_e4m3fnuz", 67), ("float8_e5m2fnuz", 68),
)
MOONCAKE_NR_DTYPES = 15

_torch = None
_TO_CODE = {}
_FROM_CODE = {}
_ITEMSIZE = {}


def _t():
    """torch, imported on first use; the dtype tables built from what it has."""
    global _torch
    if _torch is None:
        try:
            import torch
        except ImportError as e:
            raise ImportError("mooncake.store's tensor API needs torch "
                              "(Debian: python3-torch; pip: torch)") from e
        for name, code in _DTYPE_CODES:
            dt = getattr(torch, name, None)
            if isinstance(dt, torch.dtype) and dt not in _TO_CODE:
                try:
                    with _warnings.catch_warnings():  # "ComplexHalf support is experimental"
                        _warnings.simplefilter("ignore")
                        size = torch.empty(0, dtype=dt).element_size()
                except (RuntimeError, TypeError):  # a dtype this build cannot allocate
                    continue
                _TO_CODE[dt] = code
                _FROM_CODE[code] = dt
                _ITEMSIZE[code] = size
        _torch = torch
    return _torch


def dtype_code(dtype):
    """The header's dtype number for a torch dtype, or None when it has none."""
    _t()
    return _TO_CODE.get(dtype)


class TensorError(ValueError):
    """A tensor (or a stored object) this API cannot take; the message says why."""


def _tensor_info(t, what):
    """(contiguous tensor, dtype code, shape, nbytes) of a tensor to store."""
    torch = _t()
    if not isinstance(t, torch.Tensor):
        raise TensorError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TensorError(f"{what}: a {t.layout} tensor cannot be stored (dense tensors only)")
    code = _TO_CODE.get(t.dtype)
    if code is None:
        raise TensorError(f"{what}: dtype {t.dtype} has no number in the tensor format "
                          "(quantized dtypes cannot be stored)")
    if t.dim() > MAX_DIMS:
        raise TensorError(f"{what}: {t.dim()} dimensions, the format holds at most {MAX_DIMS}")
    if not t.is_contiguous():
        t = t.contiguous()
    return t, code, tuple(t.shape), t.numel() * t.element_size()


def _dest_info(t, method, key):
    """(dtype code, shape, nbytes) of a destination tensor; it must be contiguous. (The
    hot path of the _into gets: the message is only made for a refusal.)"""
    code = _TO_CODE.get(getattr(t, "dtype", None))
    if code is not None and type(t) is _torch.Tensor and t.is_contiguous() and \
            t.layout is _torch.strided:
        return code, tuple(t.shape), t.numel() * _ITEMSIZE[code]
    what = f"{method}: {key!r}"
    torch = _t()
    if not isinstance(t, torch.Tensor):
        raise TensorError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise TensorError(f"{what}: a destination tensor must be contiguous (bytes land "
                          "in its memory as they are stored)")
    code = _TO_CODE.get(t.dtype)
    if code is None or t.layout != torch.strided:
        raise TensorError(f"{what}: dtype {t.dtype} / layout {t.layout} cannot be read into")
    return code, tuple(t.shape), t.numel() * t.element_size()


def pack_header(code, local_shape, nbytes, global_shape=None, tp=None, data_offset=None):
    """The 304-byte header. tp: (shard_rank, shard_count, split_dim) for a shard;
    data_offset: where the data starts (None: data_offset_for(nbytes))."""
    if data_offset is None:
        data_offset = data_offset_for(nbytes)
    nd = len(local_shape)
    pad = [-1] * (MAX_DIMS - nd)
    loc = list(local_shape) + pad
    glob = list(global_shape if global_shape is not None else local_shape) + pad
    axes = [0] * (7 * MAX_AXES)
    if tp is not None:
        rank, count, split_dim = tp
        axes[0:7] = [AXIS_TP, 0, rank, count, split_dim, 0, local_shape[split_dim]]
    return _HDR.pack(MAGIC, VERSION, HEADER_SIZE, code, nd,
                     LAYOUT_SHARD if tp is not None else LAYOUT_FULL, 0, data_offset, nbytes,
                     *glob, *loc, 1 if tp is not None else 0, 0, *axes)


def parse_header(buf, total):
    """Validate a stored header (bytes-like, >= 304 bytes) against the object's
    length; return (dtype code, local shape, data offset, data bytes, fields).
    Raises TensorError saying what is wrong, as Mooncake's ValidateTensorMetadata
    refuses the same objects."""
    if total < HEADER_SIZE or len(buf) < HEADER_SIZE:
        raise TensorError(f"object of {total} bytes is shorter than a tensor header ({HEADER_SIZE})")
    f = _HDR.unpack_from(buf, 0)
    magic, version, hsize, code, ndim, layout, _res, off, nbytes = f[:9]
    if magic != MAGIC or version != VERSION or hsize != HEADER_SIZE:
        raise TensorError("not a tensor object (magic/version/header size differ)")
    if not 0 <= ndim <= MAX_DIMS or layout > LAYOUT_SHARD:
        raise TensorError(f"bad tensor header: ndim {ndim}, layout {layout}")
    if off < HEADER_SIZE or off > total or nbytes != total - off:
        raise TensorError(f"bad tensor header: data at {off}, {nbytes} bytes, object {total}")
    shape = tuple(f[9 + MAX_DIMS:9 + MAX_DIMS + ndim])
    _t()
    dt = _FROM_CODE.get(code)
    if dt is None:
        raise TensorError(f"dtype number {code} is not known to this torch")
    n = 1
    for d in shape:
        if d < 0:
            raise TensorError(f"bad tensor header: shape {shape}")
        n *= d
    if n * _ITEMSIZE[code] != nbytes:
        raise TensorError(f"bad tensor header: shape {shape} of {dt} is not {nbytes} bytes")
    return code, shape, off, nbytes, f


def tensor_from_buffer(obj, offset, nbytes, code, shape):
    """A tensor over obj's memory (no copy) at offset: obj is kept alive by it."""
    torch = _t()
    dt = _FROM_CODE[code]
    if nbytes == 0:
        return torch.empty(shape, dtype=dt)
    raw = torch.frombuffer(obj, dtype=torch.uint8, count=nbytes, offset=offset)
    return raw.view(dt).reshape(shape)


def metadata_size():
    """Mooncake's _tensor_metadata_size(): the bytes of a tensor object's header."""
    return HEADER_SIZE


def serialize(tensor):
    """Mooncake's _serialize_tensor(tensor): (header bytes, data pointer, data bytes, owner)
    of a dense tensor; the object is the header then the bytes at the pointer, which stay
    valid while owner lives (a contiguous copy when tensor was not contiguous). ValueError
    (TensorError) for a tensor the format cannot hold."""
    t, code, shape, nbytes = _tensor_info(tensor, "_serialize_tensor")
    return pack_header(code, shape, nbytes), t.data_ptr(), nbytes, t


def deserialize(payload):
    """Mooncake's _deserialize_tensor(payload): the tensor of a whole tensor object (header
    and data), in memory of its own. ValueError (TensorError) saying what is wrong with a
    payload that is not one."""
    buf = bytearray(payload)  # its own copy, writable (torch.frombuffer shares it)
    code, shape, off, nbytes, _ = parse_header(buf, len(buf))
    return tensor_from_buffer(buf, off, nbytes, code, shape)


def tensor_at(ptr, size):
    """(a ctypes array over [ptr, ptr+size) of host memory, for tensor_from_buffer)."""
    return (_ctypes.c_uint8 * size).from_address(ptr)


def shard_range(dim, rank, count):
    """Mooncake's calculate_shard_range: rank's [start, start+len) of dim over count."""
    start = dim * rank // count
    return start, dim * (rank + 1) // count - start


def tp_key(base, rank):
    """Mooncake's key of TP shard `rank`: "<key>_tp_<rank>"."""
    return f"{base}_tp_{rank}"


def split_tp(tensor, tp_size, split_dim, what):
    """The tp_size shards of a tensor along split_dim, each contiguous, with their
    headers. Mooncake stores only uniform splits: a dimension that tp_size does not
    divide is refused (TensorError), and so is a split_dim out of range (negative
    ones included, as Mooncake's validate_uniform_shard_request)."""
    t, code, shape, _ = _tensor_info(tensor, what)
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise TensorError(f"{what}: tp_size must be an int >= 1, got {tp_size!r}")
    if isinstance(split_dim, bool) or not isinstance(split_dim, int) or \
            not 0 <= split_dim < len(shape):
        raise TensorError(f"{what}: split_dim {split_dim!r} out of range for shape {shape}")
    if shape[split_dim] % tp_size != 0:
        raise TensorError(f"{what}: dimension {split_dim} of size {shape[split_dim]} does not "
                          f"split evenly over tp_size {tp_size} (Mooncake stores uniform "
                          "shards only)")
    out = []
    for r in range(tp_size):
        start, n = shard_range(shape[split_dim], r, tp_size)
        s = t.narrow(split_dim, start, n).contiguous()
        nbytes = s.numel() * s.element_size()
        out.append((s, pack_header(code, tuple(s.shape), nbytes, shape, (r, tp_size, split_dim)),
                    nbytes))
    return out


class HeaderScratch:
    """Host memory for n header regions of `slot` bytes each (the header, and the
    padding up to a data offset), addressable by the library (ptr(i))."""

    __slots__ = ("buf", "base", "slot")

    def __init__(self, n, slot=HEADER_SIZE):
        self.slot = slot
        self.buf = _ctypes.create_string_buffer(max(n, 1) * slot)
        self.base = _ctypes.addressof(self.buf)

    def ptr(self, i):
        return self.base + i * self.slot

    def put(self, i, header):
        _ctypes.memmove(self.base + i * self.slot, header, HEADER_SIZE)

    def view(self, i):
        return memoryview(self.buf)[i * self.slot:i * self.slot + HEADER_SIZE]


def log_refusal(method, err):
    _log.warning("%s: %s", method, err)
    return INVALID_PARAMS


__all__ = ["HEADER_SIZE", "MAGIC", "pack_header", "parse_header", "dtype_code", "TensorError",
           "tp_key", "split_tp", "shard_range", "OK", "_kvpool"]
