"""mooncake.store's EngramStore (Mooncake's n-gram embedding tables in the store): a layer's
heads stored, rows read back exactly by id through one ranged read, its keys removed; each
refusal; a populate that fails half way leaves no head behind. Real master and segments on
127.0.0.1 (conftest's pool). Mooncake's own scripts/test_engram_store.py passes against it
too (docs/python.md)."""

import numpy as np
import pytest

from mooncake.store import EngramStore, EngramStoreConfig, MooncakeDistributedStore

OK = 0


def cfg(vocab, dim):
    c = EngramStoreConfig()
    c.table_vocab_sizes = list(vocab)
    c.embedding_dim = dim
    return c


def tables(store_or_vocab, dim, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((v, dim), dtype=np.float32) for v in store_or_vocab]


@pytest.fixture
def store(pool):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", pool.addr) == OK
    yield s
    s.close()


def test_rows_read_back_exactly(store):
    vocab, dim = (50, 7, 300), 16
    e = EngramStore(layer_id=9101, config=cfg(vocab, dim), store=store)
    assert e.get_store_keys() == ["engram:l9101:h0", "engram:l9101:h1", "engram:l9101:h2"]
    assert (e.get_num_heads(), e.get_embedding_dim(), e.get_table_vocab_sizes()) == \
        (3, dim, list(vocab))
    t = tables(vocab, dim)
    e.populate(t)
    for k, tab in zip(e.get_store_keys(), t):
        assert store.get(k) == tab.tobytes()  # a head is its table, row after row
    rng = np.random.default_rng(2)
    ids = np.stack([rng.integers(0, v, size=(2, 11)) for v in vocab], axis=-1)  # [B, L, H]
    out = e.lookup(ids)
    assert out.shape == (2, 11, 3, dim) and out.dtype == np.float32
    for b in range(2):
        for pos in range(11):
            for h in range(3):
                assert out[b, pos, h].tobytes() == t[h][ids[b, pos, h]].tobytes()
    assert np.array_equal(e.lookup(ids.tolist()), out)  # nested lists, the same rows
    assert e.remove_from_store() == 3
    assert e.remove_from_store() == 0  # gone: nothing more to remove
    assert store.batch_is_exist(e.get_store_keys()) == [0, 0, 0]


def test_refusals(store):
    with pytest.raises(ValueError):
        EngramStore(1, cfg([], 4))
    with pytest.raises(ValueError):
        EngramStore(1, cfg([3], 0))
    with pytest.raises(ValueError):
        EngramStore(1, cfg([3, -1], 4))
    meta = EngramStore(1, cfg([3, 4], 4))  # no store: metadata only
    assert meta.get_store_keys()[1] == "engram:l1:h1"
    for call in (lambda: meta.populate(tables([3, 4], 4)), lambda: meta.lookup([[[0, 0]]]),
                 lambda: meta.remove_from_store()):
        with pytest.raises(RuntimeError):
            call()
    e = EngramStore(9102, cfg([3, 4], 4), store)
    with pytest.raises(RuntimeError):
        e.lookup([[[0, 1]]])  # nothing stored yet
    with pytest.raises(RuntimeError):
        e.populate(tables([3, 5], 4))  # a table of the wrong shape
    with pytest.raises(RuntimeError):
        e.populate(tables([3], 4))  # too few heads
    assert store.batch_is_exist(e.get_store_keys()) == [0, 0]  # none of that stored anything
    e.populate(tables([3, 4], 4))
    with pytest.raises(RuntimeError):
        e.populate(tables([3, 4], 4))  # the layer exists: remove it first
    for bad in ([], [[]], [[[0]]], [[[3, 0]]], [[[0, -1]]], [[[0, 0], [0]]]):
        with pytest.raises(RuntimeError):
            e.lookup(bad)
    assert e.remove_from_store(force=True) == 2


def test_a_populate_that_fails_leaves_nothing(make_pool):
    pool = make_pool(segments=("16MiB",))
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", pool.addr) == OK
    try:
        dim = 1024  # 4 KiB rows: heads of 6, 6 and 20 MiB in a 16 MiB pool
        e = EngramStore(9103, cfg([1536, 1536, 5120], dim), s)
        with pytest.raises(RuntimeError):
            e.populate(tables([1536, 1536, 5120], dim))
        assert s.batch_is_exist(e.get_store_keys()) == [0, 0, 0]
        small = EngramStore(9104, cfg([256], dim), s)  # and the room is there again
        small.populate(tables([256], dim))
        assert small.remove_from_store() == 1
    finally:
        s.close()
