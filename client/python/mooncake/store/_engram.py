"""Mooncake's EngramStore on kvpool: n-gram embedding tables kept in the store, one object
per head, rows read by id (mooncake-store/src/engram/engram_store.cpp and
mooncake-integration/store/engram_store_py.cpp at the commit docs/python.md names).

A layer's head h is the object "engram:l<layer>:h<h>": its table of vocab_size rows of
embedding_dim float32, row after row. populate() stores every head at once (refused when a
head's key exists: remove the layer first; what it stored is removed again when a head
fails); lookup(row_ids [B][L][H]) reads row row_ids[b][l][h] of head h into out[b, l, h]
with one ranged read of all of them (get_into_ranges: only those bytes cross the wire).
Refusals raise as Mooncake's binding does: ValueError for a bad config, RuntimeError for
the rest; a failed lookup leaves nothing half read. NumPy is imported on first use (the
store imports without it).
"""

__all__ = ["EngramStore", "EngramStoreConfig"]


class EngramStoreConfig:
    """Mooncake's EngramStoreConfig: table_vocab_sizes (one per head), embedding_dim."""

    def __init__(self):
        self.table_vocab_sizes = []
        self.embedding_dim = 0

    def __repr__(self):
        return (f"EngramStoreConfig(table_vocab_sizes={self.table_vocab_sizes!r}, "
                f"embedding_dim={self.embedding_dim!r})")


def _numpy():
    import numpy

    return numpy


def _ints(v, what):
    if isinstance(v, (bool, str, bytes)) or not hasattr(v, "__iter__"):
        raise ValueError(f"EngramStoreConfig.{what} must be a list of integers")
    out = []
    for x in v:
        if isinstance(x, bool) or not (isinstance(x, int) or hasattr(x, "__index__")):
            raise ValueError(f"EngramStoreConfig.{what} must be a list of integers")
        out.append(int(x))
    return out


class EngramStore:
    """EngramStore(layer_id, config, store=None): a layer's tables in a
    MooncakeDistributedStore (None: metadata only; populate, lookup and remove refuse)."""

    def __init__(self, layer_id, config, store=None):
        if isinstance(layer_id, bool) or not isinstance(layer_id, int):
            raise TypeError("layer_id must be an int")
        vocab = _ints(getattr(config, "table_vocab_sizes", None), "table_vocab_sizes")
        dim = getattr(config, "embedding_dim", None)
        if not vocab:
            raise ValueError("EngramStoreConfig.table_vocab_sizes must not be empty")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ValueError("EngramStoreConfig.embedding_dim must be positive")
        if any(v <= 0 for v in vocab):
            raise ValueError("EngramStoreConfig.table_vocab_sizes must contain only positive "
                             "values")
        if store is not None and not hasattr(store, "get_into_ranges"):
            raise RuntimeError("EngramStore store parameter must be a MooncakeDistributedStore")
        self._store = store
        self._vocab = vocab
        self._dim = dim
        self._keys = [f"engram:l{layer_id}:h{h}" for h in range(len(vocab))]

    def get_table_vocab_sizes(self):
        return list(self._vocab)

    def get_store_keys(self):
        return list(self._keys)

    def get_num_heads(self):
        return len(self._vocab)

    def get_embedding_dim(self):
        return self._dim

    def remove_from_store(self, force=False):
        """Remove the layer's head tables: how many were removed (missing ones are not
        counted). RuntimeError on any other failure, or without a store."""
        if self._store is None:
            raise RuntimeError("remove_from_store failed, rc=-600")
        removed, first = 0, 0
        for k in self._keys:
            rc = self._store.remove(k, bool(force))
            if rc == 0:
                removed += 1
            elif rc != -704 and first == 0:
                first = rc
        if first:
            raise RuntimeError(f"remove_from_store failed, rc={first}")
        return removed

    def populate(self, embedding_buffers):
        """Store every head's table: embedding_buffers[h] a float32 NumPy array of
        [vocab_size[h], embedding_dim]. RuntimeError: wrong count or shape, a head's key
        stored already, or a put failed (the heads it stored are removed again)."""
        if self._store is None:
            raise RuntimeError("populate failed")
        _np = _numpy()
        if len(embedding_buffers) != len(self._keys):
            raise RuntimeError("embedding_buffers size must match num_heads")
        arrays = []
        for h, buf in enumerate(embedding_buffers):
            if not isinstance(buf, _np.ndarray):
                raise RuntimeError("embedding_buffers must be NumPy arrays")
            arr = _np.ascontiguousarray(buf, dtype=_np.float32)
            if arr.ndim != 2:
                raise RuntimeError("each embedding buffer must be 2D [N_h, D]")
            if arr.shape != (self._vocab[h], self._dim):
                raise RuntimeError("embedding buffer shape does not match "
                                   "get_table_vocab_sizes()/get_embedding_dim()")
            arrays.append(arr)
        exist = self._store.batch_is_exist(self._keys)
        if len(exist) != len(self._keys) or any(e != 0 for e in exist):
            raise RuntimeError("populate failed: a head's key is stored already (or could "
                               "not be checked): remove the existing layer first")
        rcs = self._store.batch_put_from(self._keys, [a.ctypes.data for a in arrays],
                                         [a.nbytes for a in arrays])
        if len(rcs) != len(self._keys) or any(rc != 0 for rc in rcs):
            for k, rc in zip(self._keys, rcs):
                if rc == 0:  # roll back what this call stored
                    self._store.remove(k, True)
            raise RuntimeError("populate failed")

    def lookup(self, row_ids):
        """Embeddings by row id: row_ids [B][L][H] (nested lists or an int64-convertible
        array) -> float32 array [B, L, H, D]. RuntimeError: empty, ragged, a wrong head
        count, a row id out of its table, or a table missing."""
        if self._store is None:
            raise RuntimeError("EngramStore lookup failed")
        _np = _numpy()
        try:
            ids = _np.asarray(row_ids, dtype=_np.int64)
        except (ValueError, TypeError, OverflowError):
            raise RuntimeError("row_ids must be [B][L][H] integers") from None
        h_n = len(self._keys)
        if ids.ndim != 3 or ids.shape[0] == 0 or ids.shape[1] == 0:
            raise RuntimeError("row_ids must not be empty and must have shape [B, L, H]")
        if ids.shape[2] != h_n:
            raise RuntimeError("row_ids last dimension must match num_heads")
        b_n, l_n = ids.shape[0], ids.shape[1]
        out = _np.zeros((b_n, l_n, h_n, self._dim), dtype=_np.float32)
        flat = ids.reshape(-1, h_n)  # [token][head]
        vocab = _np.asarray(self._vocab, dtype=_np.int64)
        if (flat < 0).any() or (flat >= vocab).any():
            raise RuntimeError("EngramStore lookup failed: a row id is out of its table")
        row = self._dim * 4
        tokens = _np.arange(flat.shape[0], dtype=_np.int64)
        dst = [((tokens * h_n + h) * row).tolist() for h in range(h_n)]
        src = [(flat[:, h] * row).tolist() for h in range(h_n)]
        sizes = [[row] * flat.shape[0] for _ in range(h_n)]
        res = self._store.get_into_ranges([out.ctypes.data], [list(self._keys)], [dst], [src],
                                          [sizes])
        ok = (isinstance(res, list) and len(res) == 1 and len(res[0]) == h_n and
              all(len(r) == flat.shape[0] and all(n == row for n in r) for r in res[0]))
        if not ok:
            out.fill(0)
            raise RuntimeError("EngramStore lookup failed")
        return out
