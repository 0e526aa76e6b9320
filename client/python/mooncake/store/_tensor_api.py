"""The tensor methods of MooncakeDistributedStore (a mixin; format in _tensor.py).

Return conventions are Mooncake's: puts 0 or a negative code (a key that exists:
0, as for the byte puts), gets a torch.Tensor or None, the *_into_cuda forms
bytes read or a negative code. A tensor this format cannot hold (a quantized
dtype, more than 8 dimensions, an uneven TP split) is -600 with a warning on the
"mooncake.store" logger naming the method and the reason.
"""

import struct as _struct
import threading as _threading

import kvpool as _kvpool

from . import _tensor as T
from .codes import INTERNAL_ERROR, INVALID_PARAMS, KVP_TO_MOONCAKE, MOONCAKE, OK
from .codes import to_mooncake as _code

_EXISTS = _kvpool.STATUS["KVP_ERR_EXISTS"]
_PENDING = _kvpool.STATUS["KVP_ERR_PENDING"]
_UNSUPPORTED = _kvpool.STATUS["KVP_ERR_UNSUPPORTED"]


def _put_code(st):
    """A put's kvpool status as Mooncake's code (the byte puts of __init__.py use it too).
    An existing key (or one another writer is putting) counts as stored, as Mooncake's
    OBJECT_ALREADY_EXISTS does for the connectors."""
    if st == 0 or st == _EXISTS or st == _PENDING:
        return OK
    if st == _UNSUPPORTED:  # a put's only UNSUPPORTED: a DFS replica and no DFS segment
        return MOONCAKE["DFS_SERVICE_UNAVAILABLE"]
    return KVP_TO_MOONCAKE.get(st, INTERNAL_ERROR)


def _struct_off(header):
    """The data_offset field of a header (a reread decides on it before validation)."""
    return _struct.unpack_from("<Q", header, 24)[0]


_tls = _threading.local()


def _read_scratch(n):
    """This thread's scratch for the header regions of n reads (4096 bytes each), kept
    between calls: a fresh one per call is an mmap'ed, page-faulted allocation of 256 KiB
    for 64 tensors. Reads only (what lands in it is overwritten by the next read; writes
    need zeros after their headers and make their own)."""
    s = getattr(_tls, "scratch", None)
    if s is None or len(s.buf) < n * T.PADDED_OFFSET:
        s = _tls.scratch = T.HeaderScratch(max(n, 64), T.PADDED_OFFSET)
    return s


def _chunks(n):
    step = _kvpool.MAX_BATCH
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def _groups_of(cfg):
    """A put config's group ids (its 8th item), or None."""
    return cfg[7] if cfg is not None and len(cfg) > 7 and cfg[7] is not None else None


def _regroup(cfg, owners):
    """cfg with group id owners[j] of its group ids for key j (the keys written for base
    key owners[j]: Mooncake's MakeIndexedConfig)."""
    g = _groups_of(cfg)
    return cfg if g is None else cfg[:7] + (tuple(g[i] for i in owners),) + cfg[8:]


def _groups_differ(config, n):
    """config's group_ids are not one per key of n: Mooncake's -600 for every key."""
    g = getattr(config, "group_ids", None)
    return g is not None and len(g) != n


def _chunked(call, keys, ptrs, sizes, *rest):
    """call(keys, ptrs, sizes, *rest) of the client, over slices of at most MAX_BATCH keys
    (and the lists parallel to them, a config's group ids too): the per-key results,
    concatenated in order."""
    out = []
    for lo, hi in _chunks(len(keys)):
        r = rest
        if rest and _groups_of(rest[0]) is not None:
            r = (_regroup(rest[0], range(lo, hi)),) + rest[1:]
        out += call(keys[lo:hi], ptrs[lo:hi], sizes[lo:hi], *r)
    return out


def _as_list(x, what):
    if isinstance(x, (str, bytes)) or not hasattr(x, "__len__"):
        raise TypeError(f"{what} must be a list")
    return list(x)


class TensorAPI:
    """Mooncake's put_tensor / get_tensor family (docs/python.md, "The tensor API")."""

    # ---- the writes every put form ends in ----

    def _write_cfg(self, config, upsert):
        cfg = self._cfg(config) or (1, None, _kvpool.PIN_NONE, 0, _kvpool.PUT_INSERT, None)
        if upsert:
            cfg = cfg[:4] + (_kvpool.PUT_UPSERT,) + cfg[5:]
        return cfg

    def _write_pieces(self, c, keys, headers, datas, cfg, upsert):
        """Store keys[i] as headers[i] (304 bytes) + datas[i] ((ptr, nbytes) of host or
        CUDA memory, or None for an empty tensor). -> [code]. One group id for several
        keys (one tensor's shards): each of them in that group."""
        n = len(keys)
        g = _groups_of(cfg)
        if g is not None and len(g) == 1 and n > 1:
            cfg = _regroup(cfg, [0] * n)
        offs = [T.data_offset_for(d[1]) if d is not None else T.HEADER_SIZE for d in datas]
        scratch = T.HeaderScratch(n, max(offs, default=T.HEADER_SIZE))
        ptrs, sizes = [], []
        for i in range(n):
            scratch.put(i, headers[i])
            d = datas[i]
            if d is None or d[1] == 0:
                ptrs.append([scratch.ptr(i)])
                sizes.append([offs[i]])
            else:
                ptrs.append([scratch.ptr(i), d[0]])
                sizes.append([offs[i], d[1]])
        conv = _code if upsert else _put_code
        return [conv(r) for r in _chunked(c.batch_put_multi, keys, ptrs, sizes, cfg)]

    def _put_tensors(self, method, keys, tensors, config=None, upsert=False):
        """Per key: 0 or a negative code. Bad lists: every key -600."""
        try:
            keys = _as_list(keys, "keys")
            tensors = _as_list(tensors, "tensors_list")
        except TypeError as e:
            T.log_refusal(method, e)
            return [INVALID_PARAMS] * (len(keys) if isinstance(keys, list) else 0)
        n = len(keys)
        if len(tensors) != n or _groups_differ(config, n):
            T.log_refusal(method, f"{n} keys but {len(tensors)} tensors (or group_ids)")
            return [INVALID_PARAMS] * n

        def run(c):
            cfg = self._write_cfg(config, upsert)
            res = [INVALID_PARAMS] * n
            idx, hdrs, datas, alive = [], [], [], []
            for i in range(n):
                try:
                    if not isinstance(keys[i], str):
                        raise T.TensorError(f"key {i} is not a str")
                    t, code, shape, nbytes = T._tensor_info(tensors[i], f"{method}: {keys[i]!r}")
                except T.TensorError as e:
                    T.log_refusal(method, e)
                    continue
                idx.append(i)
                alive.append(t)  # a contiguous copy lives until the put returns
                hdrs.append(T.pack_header(code, shape, nbytes))
                datas.append((t.data_ptr(), nbytes) if nbytes else None)
            if idx:
                got = self._write_pieces(c, [keys[i] for i in idx], hdrs, datas,
                                         _regroup(cfg, idx), upsert)
                for j, i in enumerate(idx):
                    res[i] = got[j]
            return res
        return self._call(run, lambda code: [code] * n)

    def _put_tp(self, method, base_keys, tensors, config, tp_size, split_dim, upsert=False):
        """Each tensor split into tp_size shards "<key>_tp_<r>"; per base key 0 or the
        first failing shard's code."""
        if isinstance(tp_size, int) and not isinstance(tp_size, bool) and tp_size <= 1:
            return self._put_tensors(method, base_keys, tensors, config, upsert)
        try:
            base_keys = _as_list(base_keys, "base_keys")
            tensors = _as_list(tensors, "tensors_list")
        except TypeError as e:
            T.log_refusal(method, e)
            return []
        n = len(base_keys)
        if len(tensors) != n or _groups_differ(config, n):
            T.log_refusal(method, f"{n} keys but {len(tensors)} tensors (or group_ids)")
            return [INVALID_PARAMS] * n

        def run(c):
            cfg = self._write_cfg(config, upsert)
            res = [INVALID_PARAMS] * n
            owners, keys, hdrs, datas, alive = [], [], [], [], []
            for i in range(n):
                try:
                    if not isinstance(base_keys[i], str):
                        raise T.TensorError(f"key {i} is not a str")
                    shards = T.split_tp(tensors[i], tp_size, split_dim,
                                        f"{method}: {base_keys[i]!r}")
                except T.TensorError as e:
                    T.log_refusal(method, e)
                    continue
                for r, (s, hdr, nbytes) in enumerate(shards):
                    owners.append(i)
                    keys.append(T.tp_key(base_keys[i], r))
                    hdrs.append(hdr)
                    datas.append((s.data_ptr(), nbytes) if nbytes else None)
                    alive.append(s)
                res[i] = OK
            if keys:
                got = self._write_pieces(c, keys, hdrs, datas, _regroup(cfg, owners), upsert)
                for i, r in zip(owners, got):
                    if r != OK and res[i] == OK:
                        res[i] = r
            return res
        return self._call(run, lambda code: [code] * n)

    def _put_from(self, method, keys, ptrs, sizes, config=None, upsert=False):
        """Buffers already laid out as [header][data]: checked, then stored as they are."""
        try:
            keys, ptrs, sizes = (_as_list(x, w) for x, w in
                                 ((keys, "keys"), (ptrs, "buffer_ptrs"), (sizes, "sizes")))
        except TypeError as e:
            T.log_refusal(method, e)
            return []
        n = len(keys)
        if len(ptrs) != n or len(sizes) != n or _groups_differ(config, n):
            T.log_refusal(method, "keys, buffer_ptrs, sizes (and group_ids) differ in length")
            return [INVALID_PARAMS] * n
        for i in range(n):
            try:
                if not isinstance(ptrs[i], int) or ptrs[i] == 0 or not isinstance(sizes[i], int):
                    raise T.TensorError(f"buffer {i}: a non-zero int address and an int size")
                T.parse_header(T.tensor_at(ptrs[i], T.HEADER_SIZE) if sizes[i] >= T.HEADER_SIZE
                               else b"", sizes[i])
            except T.TensorError as e:
                # Mooncake refuses the whole batch when one buffer is not a tensor object
                T.log_refusal(method, e)
                return [INVALID_PARAMS] * n
        conv = _code if upsert else _put_code

        def run(c):
            cfg = self._write_cfg(config, upsert)
            return [conv(r) for r in _chunked(c.batch_put_from, keys, ptrs, sizes, cfg)]
        return self._call(run, lambda code: [code] * n)

    # ---- reads ----

    def _get_tensors(self, method, keys):
        """[tensor or None]: each object read into memory of its own (a BufferHandle
        the tensor keeps alive), parsed, viewed as its dtype and shape: one copy."""
        try:
            keys = _as_list(keys, "keys")
        except TypeError as e:
            T.log_refusal(method, e)
            return []
        n = len(keys)
        if self._unbuffered(method):  # Mooncake reads them through get_buffer
            return [None] * n

        def run(c):
            T._t()
            out = [None] * n
            for lo, hi in _chunks(n):
                for i, h in enumerate(c.batch_get_buffer(keys[lo:hi]), lo):
                    if isinstance(h, int):
                        continue
                    try:
                        code, shape, off, nbytes, _ = T.parse_header(memoryview(h), len(h))
                    except T.TensorError as e:
                        T.log_refusal(method, f"{keys[i]!r}: {e}")
                        continue
                    out[i] = T.tensor_from_buffer(h, off, nbytes, code, shape)
            return out
        return self._call(run, lambda code: [None] * n)

    def _get_into_tensors(self, method, keys, tensors):
        """Per key: the payload's bytes read straight into tensors[i] (host or CUDA;
        its data pointer unchanged), or a negative code. The header goes to a
        scratch and must name the destination's dtype and shape (else -600; the
        bytes have landed in the tensor by then)."""
        try:
            keys = _as_list(keys, "keys")
            tensors = _as_list(tensors, "tensors")
        except TypeError as e:
            T.log_refusal(method, e)
            return []
        n = len(keys)
        if len(tensors) != n:
            T.log_refusal(method, f"{n} keys but {len(tensors)} tensors")
            return [INVALID_PARAMS] * n

        def run(c):
            res = [INVALID_PARAMS] * n
            scratch = _read_scratch(n)
            idx, want, ptrs, sizes = [], [], [], []
            for i in range(n):
                try:
                    if not isinstance(keys[i], str):
                        raise T.TensorError(f"key {i} is not a str")
                    code, shape, nbytes = T._dest_info(tensors[i], method, keys[i])
                except T.TensorError as e:
                    T.log_refusal(method, e)
                    continue
                idx.append(i)
                # the data offset kvpool and Mooncake write (an older kvpool's object,
                # with its data at 4096, is read again below)
                off = T.data_offset_for(nbytes)
                want.append((code, shape, off, nbytes))
                if nbytes:
                    ptrs.append([scratch.ptr(i), tensors[i].data_ptr()])
                    sizes.append([off, nbytes])
                else:
                    ptrs.append([scratch.ptr(i)])
                    sizes.append([off])
            got = _chunked(c.batch_get_into_multi, [keys[i] for i in idx], ptrs, sizes)
            # objects longer than the buffers: their headers alone, to learn where the
            # data starts (an older kvpool's, with it at 4096)
            longer = [j for j, r in enumerate(got) if r == _kvpool.ERR_BUFFER_TOO_SMALL]
            if longer:
                ranges = [(keys[idx[j]], 0, (scratch.ptr(idx[j]), T.HEADER_SIZE))
                          for j in longer]
                heads = []
                for lo in range(0, len(ranges), _kvpool.MAX_BATCH):
                    heads += c.get_ranges(ranges[lo:lo + _kvpool.MAX_BATCH])
                for j, r in zip(longer, heads):
                    if r == T.HEADER_SIZE:
                        got[j] = _struct_off(scratch.view(idx[j])) + want[j][3]
            again = []
            for j, i in enumerate(idx):
                r = got[j]
                if r != want[j][2] + want[j][3] and r >= T.HEADER_SIZE:  # not as kvpool writes
                    off = _struct_off(scratch.view(i))
                    if off != want[j][2] and T.HEADER_SIZE <= off <= T.PADDED_OFFSET and \
                            r == off + want[j][3]:
                        again.append(j)
            for j in set(longer) - set(again):  # no offset that fits: too small after all
                got[j] = _kvpool.ERR_BUFFER_TOO_SMALL
            if again:  # objects whose data starts elsewhere: scatter at their own offset
                redo = _chunked(
                    c.batch_get_into_multi, [keys[idx[j]] for j in again],
                    [ptrs[j] for j in again],
                    [[_struct_off(scratch.view(idx[j]))] + sizes[j][1:] for j in again])
                for j, r in zip(again, redo):
                    got[j] = r
            for j, i in enumerate(idx):
                r = got[j]
                if r < 0:
                    res[i] = _code(r)
                    continue
                try:
                    code, shape, _, nbytes, _ = T.parse_header(scratch.view(i), r)
                    if (code, shape) != want[j][:2]:
                        raise T.TensorError(f"{keys[i]!r} holds {T._FROM_CODE[code]} {shape}, "
                                            f"the destination is {tensors[i].dtype} "
                                            f"{tuple(tensors[i].shape)}")
                except T.TensorError as e:
                    T.log_refusal(method, e)
                    continue
                res[i] = nbytes
            return res
        return self._call(run, lambda code: [code] * n)

    def _get_into_ptrs(self, method, keys, ptrs, sizes):
        """Mooncake's _into form: object i (header + data) read into [ptrs[i],
        ptrs[i]+sizes[i]) of host memory; a tensor viewing the data there (no copy;
        the buffer must outlive it), or None."""
        try:
            keys, ptrs, sizes = (_as_list(x, w) for x, w in
                                 ((keys, "keys"), (ptrs, "buffer_ptrs"), (sizes, "sizes")))
        except TypeError as e:
            T.log_refusal(method, e)
            return []
        n = len(keys)
        if len(ptrs) != n or len(sizes) != n or any(p == 0 for p in ptrs):
            T.log_refusal(method, "keys, buffer_ptrs and sizes differ in length, or a null pointer")
            return [None] * n

        def run(c):
            T._t()
            out = [None] * n
            for i, r in enumerate(_chunked(c.batch_get_into_ptrs, keys, ptrs, sizes)):
                if r < 0:
                    continue
                try:
                    buf = T.tensor_at(ptrs[i], r)
                    code, shape, off, nbytes, _ = T.parse_header(buf, r)
                except T.TensorError as e:
                    T.log_refusal(method, f"{keys[i]!r}: {e}")
                    continue
                out[i] = T.tensor_from_buffer(buf, off, nbytes, code, shape)
            return out
        return self._call(run, lambda code: [None] * n)

    def _is_tensor(self, x):
        return isinstance(x, T._t().Tensor)

    # ---- Mooncake's methods: puts ----

    def put_tensor(self, key, tensor):
        """Store a torch tensor (any device the library reads; non-contiguous ones
        are made contiguous) as [304-byte header][bytes]. 0 (also when the key
        exists) or a negative code."""
        return self._put_tensors("put_tensor", [key], [tensor])[0]

    def batch_put_tensor(self, keys, tensors_list):
        """put_tensor per key, in one batch. [0 / negative] per key."""
        return self._put_tensors("batch_put_tensor", keys, tensors_list)

    def pub_tensor(self, key, tensor, config=None):
        """put_tensor with a ReplicateConfig. 0 or negative."""
        return self._put_tensors("pub_tensor", [key], [tensor], config)[0]

    def batch_pub_tensor(self, keys, tensors_list, config=None):
        """batch_put_tensor with a ReplicateConfig. [0 / negative] per key."""
        return self._put_tensors("batch_pub_tensor", keys, tensors_list, config)

    def upsert_tensor(self, key, tensor):
        """Store a tensor, replacing the key's object if it exists. 0 or negative."""
        return self._put_tensors("upsert_tensor", [key], [tensor], None, True)[0]

    def batch_upsert_tensor(self, keys, tensors_list):
        """upsert_tensor per key, in one batch. [0 / negative] per key."""
        return self._put_tensors("batch_upsert_tensor", keys, tensors_list, None, True)

    def upsert_pub_tensor(self, key, tensor, config=None):
        """upsert_tensor with a ReplicateConfig. 0 or negative."""
        return self._put_tensors("upsert_pub_tensor", [key], [tensor], config, True)[0]

    def batch_upsert_pub_tensor(self, keys, tensors_list, config=None):
        """batch_upsert_tensor with a ReplicateConfig. [0 / negative] per key."""
        return self._put_tensors("batch_upsert_pub_tensor", keys, tensors_list, config, True)

    def put_tensor_from(self, key, buffer_ptr, size):
        """Store [buffer_ptr, +size), already laid out as [header][data] (what
        get_tensor_into leaves in a buffer); the header is checked first. 0 or
        negative (-600: not a tensor object)."""
        r = self._put_from("put_tensor_from", [key], [buffer_ptr], [size])
        return r[0] if r else INVALID_PARAMS

    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes):
        """put_tensor_from per key. [0 / negative] per key; one buffer that is not a
        tensor object refuses the batch (-600 for every key), as in Mooncake."""
        return self._put_from("batch_put_tensor_from", keys, buffer_ptrs, sizes)

    def upsert_tensor_from(self, key, buffer_ptr, size):
        """put_tensor_from, replacing an existing object. 0 or negative."""
        r = self._put_from("upsert_tensor_from", [key], [buffer_ptr], [size], None, True)
        return r[0] if r else INVALID_PARAMS

    def batch_upsert_tensor_from(self, keys, buffer_ptrs, sizes):
        """batch_put_tensor_from, replacing existing objects. [0 / negative] per key."""
        return self._put_from("batch_upsert_tensor_from", keys, buffer_ptrs, sizes, None, True)

    # ---- gets ----

    def get_tensor(self, key):
        """The tensor stored under key (on the CPU, in memory of its own), or None
        (missing, or not a tensor object)."""
        r = self._get_tensors("get_tensor", [key])
        return r[0] if r else None

    def batch_get_tensor(self, keys):
        """[tensor or None] per key."""
        return self._get_tensors("batch_get_tensor", keys)

    def get_tensor_into(self, key, buffer_ptr, size=None):
        """Read key into memory the caller owns, without a copy in Python:

        - get_tensor_into(key, buffer_ptr, size) (Mooncake's form): the whole
          object, header included, lands in [buffer_ptr, +size) of host memory;
          returns a tensor viewing its data there (the buffer must outlive it),
          or None.
        - get_tensor_into(key, tensor) (kvpool's form): the data lands in the
          tensor's own memory (host or CUDA; data_ptr() unchanged), the header in
          a scratch; returns the same tensor, or None (missing; a stored dtype or
          shape other than the tensor's: a warning, and the bytes were written)."""
        if size is None and self._is_tensor(buffer_ptr):
            r = self._get_into_tensors("get_tensor_into", [key], [buffer_ptr])
            return buffer_ptr if r and r[0] >= 0 else None
        r = self._get_into_ptrs("get_tensor_into", [key], [buffer_ptr], [size])
        return r[0] if r else None

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes=None):
        """get_tensor_into per key, in one batch: (keys, buffer_ptrs, sizes) ->
        [tensor viewing the buffer, or None] (-600 per key, as Mooncake, for a
        store not set up, lists of different lengths or a null pointer);
        (keys, tensors) -> [the tensor, or None]."""
        tensor_type = T._t().Tensor
        if sizes is None and isinstance(buffer_ptrs, (list, tuple)) and buffer_ptrs and \
                all(isinstance(t, tensor_type) for t in buffer_ptrs):
            r = self._get_into_tensors("batch_get_tensor_into", keys, buffer_ptrs)
            if len(r) != len(buffer_ptrs):
                return [None] * len(r)
            return [t if x >= 0 else None for t, x in zip(buffer_ptrs, r)]
        refused = self._into_refused(keys, buffer_ptrs, sizes)
        if refused is not None:
            return refused
        return self._get_into_ptrs("batch_get_tensor_into", keys, buffer_ptrs, sizes)

    def _into_refused(self, keys, buffer_ptrs, sizes):
        """Mooncake's batch_get_tensor_into refuses a store not set up, lists of
        different lengths and a null pointer with -600 per key (not None): that
        list, or None when the call may go on."""
        try:
            n = len(keys)
            if self._c is None or len(buffer_ptrs) != n or len(sizes) != n or \
                    any(p == 0 for p in buffer_ptrs):
                T.log_refusal("batch_get_tensor_into", "not set up, keys, buffer_ptrs and "
                              "sizes differ in length, or a null pointer")
                return [INVALID_PARAMS] * n
        except TypeError:
            return None  # _get_into_ptrs refuses it
        return None

    def get_tensor_into_cuda(self, key, tensor):
        """The payload of key read into tensor (CUDA or host; its memory as it is):
        the bytes read, or a negative code (-704 missing, -600 dtype/shape differ).
        Mooncake needs a dummy client with CUDA IPC for this; kvpool reads device
        memory through the library's GPU path from any store."""
        r = self._get_into_tensors("get_tensor_into_cuda", [key], [tensor])
        return r[0] if r else INVALID_PARAMS

    def batch_get_tensor_into_cuda(self, keys, tensors_list):
        """get_tensor_into_cuda per key. [bytes read / negative] per key."""
        return self._get_into_tensors("batch_get_tensor_into_cuda", keys, tensors_list)

    # ---- tensor parallelism: "<key>_tp_<rank>" shards ----

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
        """Split tensor along split_dim into tp_size equal shards, stored as
        "<key>_tp_0" .. "<key>_tp_<tp_size-1>" (each a tensor object whose header
        records the full shape and its rank). tp_size <= 1: put_tensor(key). A
        dimension tp_size does not divide is refused (-600), as Mooncake does.
        tp_rank is accepted and not used (every shard is written). 0 or the first
        failing shard's code."""
        r = self._put_tp("put_tensor_with_tp", [key], [tensor], None, tp_size, split_dim)
        return r[0] if r else INVALID_PARAMS

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                 split_dim=0):
        """put_tensor_with_tp per key, in one batch. [0 / negative] per key."""
        return self._put_tp("batch_put_tensor_with_tp", base_keys, tensors_list, None, tp_size,
                            split_dim)

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
        """put_tensor_with_tp with a ReplicateConfig. 0 or negative."""
        r = self._put_tp("pub_tensor_with_tp", [key], [tensor], config, tp_size, split_dim)
        return r[0] if r else INVALID_PARAMS

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0,
                                 tp_size=1, split_dim=0):
        """batch_put_tensor_with_tp with a ReplicateConfig. [0 / negative] per key."""
        return self._put_tp("batch_pub_tensor_with_tp", base_keys, tensors_list, config,
                            tp_size, split_dim)

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        """Rank tp_rank's shard ("<key>_tp_<tp_rank>"), or None; tp_size <= 1:
        get_tensor(key). kvpool's addition: tp_rank=None reads all tp_size shards
        and concatenates them along split_dim (the full tensor), None if any is
        missing."""
        if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size <= 1:
            return self.get_tensor(key)
        if tp_rank is None:
            parts = self._get_tensors("get_tensor_with_tp",
                                      [T.tp_key(key, r) for r in range(tp_size)])
            if len(parts) != tp_size or any(p is None for p in parts):
                return None
            try:
                return T._t().cat(parts, dim=split_dim)
            except (RuntimeError, IndexError) as e:
                T.log_refusal("get_tensor_with_tp", f"{key!r}: shards do not join: {e}")
                return None
        return self.get_tensor(T.tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1):
        """[rank tp_rank's shard or None] per base key; tp_size <= 1: batch_get_tensor."""
        if not isinstance(tp_size, int) or tp_size <= 1:
            return self.batch_get_tensor(base_keys)
        try:
            keys = [T.tp_key(k, tp_rank) for k in _as_list(base_keys, "base_keys")]
        except TypeError as e:
            T.log_refusal("batch_get_tensor_with_tp", e)
            return []
        return self._get_tensors("batch_get_tensor_with_tp", keys)

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        """get_tensor_into of rank tp_rank's shard (tp_size <= 1: of key)."""
        if isinstance(tp_size, int) and tp_size > 1:
            key = T.tp_key(key, tp_rank)
        return self.get_tensor_into(key, buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1):
        """batch_get_tensor_into of rank tp_rank's shards (tp_size <= 1: of the keys)."""
        keys = list(base_keys) if isinstance(base_keys, (list, tuple)) else base_keys
        if self._c is None and isinstance(keys, list):
            return [None] * len(keys)  # Mooncake: None per key before setup
        if isinstance(tp_size, int) and tp_size > 1 and isinstance(keys, list):
            keys = [T.tp_key(k, tp_rank) for k in keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    def _tensors_from_buffers(self, method, ptrs, sizes):
        out = []
        for p, s in zip(ptrs, sizes):
            if not isinstance(p, int) or p == 0 or not isinstance(s, int) or s < T.HEADER_SIZE:
                raise T.TensorError("buffers must be non-zero int addresses with int sizes "
                                    f">= {T.HEADER_SIZE}")
            buf = T.tensor_at(p, s)
            code, shape, off, nbytes, _ = T.parse_header(buf, s)
            out.append(T.tensor_from_buffer(buf, off, nbytes, code, shape))
        return out

    def put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        """put_tensor_with_tp of the full tensor laid out as [header][data] at
        [buffer_ptr, +size) (host memory). 0 or negative."""
        r = self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size,
                                               split_dim)
        return r[0] if r else INVALID_PARAMS

    def batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                      split_dim=0):
        """put_tensor_with_tp_from per key. [0 / negative] per key."""
        method = "batch_put_tensor_with_tp_from"
        try:
            base_keys = _as_list(base_keys, "base_keys")
            ptrs = _as_list(buffer_ptrs, "buffer_ptrs")
            sizes = _as_list(sizes, "sizes")
            if len(ptrs) != len(base_keys) or len(sizes) != len(base_keys):
                raise T.TensorError("keys, buffer_ptrs and sizes differ in length")
            tensors = self._tensors_from_buffers(method, ptrs, sizes)
        except (TypeError, T.TensorError) as e:
            T.log_refusal(method, e)
            return [INVALID_PARAMS] * (len(base_keys) if isinstance(base_keys, list) else 0)
        if isinstance(tp_size, int) and tp_size <= 1:
            return self._put_tensors(method, base_keys, tensors)
        return self._put_tp(method, base_keys, tensors, None, tp_size, split_dim)
