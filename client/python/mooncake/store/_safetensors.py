"""The safetensors file format, written and read without the safetensors package.

Mooncake's save_tensor_to_safetensor / load_tensor_from_safetensor call
safetensors.torch.save_file / load_file; this module does what those two do, so
kvpool's need no package beyond torch. The format (huggingface/safetensors,
README "Format"):

    8 bytes   N, the header's length, an unsigned 64-bit little-endian integer
    N bytes   a UTF-8 JSON object: {"NAME": {"dtype": "F32", "shape": [2, 3],
              "data_offsets": [BEGIN, END]}, ..., "__metadata__": {str: str}}
              (__metadata__ optional), offsets relative to the byte buffer
    the rest  the byte buffer: each tensor's elements, row-major, little-endian

Written as the Rust library writes it: the JSON compact, "__metadata__" first,
tensors ordered by dtype size (largest first) then name, laid out back to back
in that order, the header padded with spaces to a multiple of 8 bytes (so the
data starts 8-byte aligned). Read with the library's checks: N at most 100 MB
and within the file, the header a JSON object beginning with "{", a known
dtype, each tensor's bytes exactly numel * itemsize, and the tensors covering
the byte buffer with no gap, overlap or trailing byte.
"""

import ctypes as _ctypes
import json as _json
import struct as _struct

#: the library's limit on N (safetensors' MAX_HEADER_SIZE)
MAX_HEADER_SIZE = 100_000_000

# safetensors dtype name -> torch dtype attribute, in the library's Dtype order (its
# serializer sorts by it, larger last); names this torch lacks are skipped.
_DTYPES = [
    ("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"), ("F8_E5M2", "float8_e5m2"),
    ("F8_E4M3", "float8_e4m3fn"), ("I16", "int16"), ("U16", "uint16"), ("F16", "float16"),
    ("BF16", "bfloat16"), ("I32", "int32"), ("U32", "uint32"), ("F32", "float32"),
    ("C64", "complex64"), ("F64", "float64"), ("I64", "int64"), ("U64", "uint64"),
]


class FormatError(ValueError):
    """A file that is not a valid safetensors file."""


def _tables(torch):
    to_name, from_name, rank = {}, {}, {}
    for i, (name, attr) in enumerate(_DTYPES):
        dt = getattr(torch, attr, None)
        if isinstance(dt, torch.dtype):
            to_name[dt] = name
            from_name[name] = dt
            rank[name] = i
    return to_name, from_name, rank


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def save(tensors, path, metadata=None):
    """Write {name: CPU tensor} to path as a safetensors file (save_file's
    checks: str names, tensors on the CPU; a non-contiguous one is written
    contiguous). Raises OSError, TypeError or ValueError."""
    import torch

    to_name, _, rank = _tables(torch)
    items = []
    for name, t in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"tensor name {name!r} cannot be stored")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: not a torch.Tensor")
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype not in to_name:
            raise ValueError(f"{name}: dtype {t.dtype} has no safetensors name")
        items.append((name, t.contiguous()))
    items.sort(key=lambda it: (-rank[to_name[it[1].dtype]], it[0]))
    header = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata must map str to str")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, t in items:
        n = t.numel() * t.element_size()
        header[name] = {"dtype": to_name[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    hdr = _json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(path, "wb") as f:
        f.write(_struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for _name, t in items:
            n = t.numel() * t.element_size()
            if n:
                f.write(_ctypes.string_at(t.data_ptr(), n))


def load(path):
    """{name: CPU tensor} of the safetensors file at path, in the order of their
    data in the file. Raises OSError or FormatError."""
    import torch

    _, from_name, _ = _tables(torch)
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError("shorter than its 8-byte header length")
    (n,) = _struct.unpack_from("<Q", blob)
    if n > MAX_HEADER_SIZE:
        raise FormatError(f"header of {n} bytes (at most {MAX_HEADER_SIZE})")
    if 8 + n > len(blob):
        raise FormatError("header longer than the file")
    try:
        text = blob[8:8 + n].decode("utf-8")
        header = _json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError(f"header is not UTF-8 JSON: {e}") from None
    if not text.startswith("{") or not isinstance(header, dict):
        raise FormatError("header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is not None and (not isinstance(meta, dict)
                             or not all(isinstance(v, str) for v in meta.values())):
        raise FormatError("__metadata__ must map str to str")
    data = memoryview(blob)[8 + n:]
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise FormatError(f"{name}: not an object")
        dt = from_name.get(info.get("dtype"))
        shape, offs = info.get("shape"), info.get("data_offsets")
        if dt is None:
            raise FormatError(f"{name}: dtype {info.get('dtype')!r} unknown to this torch")
        if (not isinstance(shape, list) or not isinstance(offs, list) or len(offs) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                       for v in shape + offs)):
            raise FormatError(f"{name}: bad shape or data_offsets")
        begin, end = offs
        if end < begin or end - begin != _numel(shape) * torch.empty(0, dtype=dt).element_size():
            raise FormatError(f"{name}: data_offsets do not match dtype and shape")
        entries.append((begin, end, name, dt, shape))
    entries.sort(key=lambda e: (e[0], e[1]))
    pos = 0
    for begin, end, name, _dt, _shape in entries:
        if begin != pos:
            raise FormatError(f"{name}: data not contiguous with the tensor before it")
        pos = end
    if pos != len(data):
        raise FormatError(f"byte buffer of {len(data)} bytes, tensors cover {pos}")
    out = {}
    for begin, end, name, dt, shape in entries:
        t = torch.empty(shape, dtype=dt)
        if end > begin:
            _ctypes.memmove(t.data_ptr(), bytes(data[begin:end]), end - begin)
        out[name] = t
    return out
