"""Mooncake's BufferPool on kvpool: leases of registered host memory for the pointer
calls (batch_put_from, batch_get_into, get_tensor_into), Mooncake's interface and
refusals (mooncake-integration/store/buffer_pool.cpp at the commit docs/python.md
names).

A pool draws first on a local buffer of the store's local_buffer_size bytes (one
anonymous mapping of its own, registered once: Mooncake's is the store's transfer
buffer, which kvpool does not have), then on overflow regions, each a mapping of its
own registered for as long as its lease lives. Together they hold at most max_bytes
(0: twice the local buffer) in at most max_regions leases. A lease's `buffer` is a
memoryview of exactly its size; the lease cannot be released while such a view lives
(RuntimeError), and one dropped with views alive gives its memory back only when the
last view goes, so a view never reads memory given to another lease.
"""

import bisect as _bisect
import ctypes as _ctypes
import mmap as _mmap
import threading as _threading
import time as _time
import weakref as _weakref

__all__ = ["BufferPool", "BufferLease", "BufferLeaseView", "RegisteredBufferPool",
           "RegisteredBufferLease", "RegisteredBufferLeaseView"]

_LOCAL_ALIGN = 64  # a local lease's address and size are multiples of this
_PAGE = _mmap.PAGESIZE
_SIZE_MAX = (1 << 64) - 1


def _size_arg(v, what):
    """A size_t argument as pybind takes one: an int in [0, 2^64) (TypeError else)."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _SIZE_MAX:
        raise TypeError(f"{what} must be an int in [0, 2^64), got {v!r}")
    return v


def _address(m):
    """The address of an mmap's first byte (no export of it is kept)."""
    probe = (_ctypes.c_char * 1).from_buffer(m)
    try:
        return _ctypes.addressof(probe)
    finally:
        del probe


class _Arena:
    """The local buffer: first-fit extents of one mapping, kept sorted by offset."""

    def __init__(self, size):
        self.size = size
        self.map = _mmap.mmap(-1, size, flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)
        self.base = _address(self.map)
        self.free = [(0, size)]  # (offset, length), sorted, never adjacent

    def take(self, n):
        n = -(-n // _LOCAL_ALIGN) * _LOCAL_ALIGN
        for i, (off, length) in enumerate(self.free):
            if length >= n:
                if length == n:
                    del self.free[i]
                else:
                    self.free[i] = (off + n, length - n)
                return self.base + off, n
        return None

    def give(self, ptr, n):
        off = ptr - self.base
        i = _bisect.bisect_left(self.free, (off, 0))
        if i < len(self.free) and self.free[i][0] == off + n:  # joins the next
            n += self.free[i][1]
            del self.free[i]
        if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == off:  # and the previous
            off, n = self.free[i - 1][0], self.free[i - 1][1] + n
            i -= 1
            del self.free[i]
        self.free.insert(i, (off, n))


class BufferLeaseView:
    """What a lease's buffer views: `buffer` is a memoryview of the lease's bytes. While
    one lives the lease cannot be released."""

    __slots__ = ("_array", "__weakref__")

    def __init__(self, lease):
        # a ctypes array over the lease's bytes: the memoryview's exporter, so that the
        # lease can tell whether any view of it is still alive (a weak reference to it)
        self._array = (_ctypes.c_ubyte * lease.size).from_address(lease.ptr)
        lease._views.append(_weakref.ref(self._array))

    @property
    def buffer(self):
        return memoryview(self._array).cast("B")


class BufferLease:
    """A lease of `size` bytes at `ptr` (registered with the store) from a BufferPool;
    `release()` or the end of a `with` block gives them back."""

    def __init__(self, pool, region, size):
        self._pool = pool
        self._region = region  # (kind, ptr, length, mapping or None)
        self._size = size
        self._views = []

    @property
    def ptr(self):
        if self._region is None:
            raise RuntimeError("buffer lease is closed")
        return self._region[1]

    @property
    def size(self):
        return self._size

    @property
    def buffer(self):
        if self._region is None:
            raise RuntimeError("buffer lease is closed")
        return BufferLeaseView(self).buffer

    def _exported(self):
        self._views = [r for r in self._views if r() is not None]
        return self._views

    def release(self):
        """Give the bytes back to the pool. RuntimeError while a view of them lives."""
        if self._region is None:
            return
        if self._exported():
            raise RuntimeError("cannot release buffer while exported views exist")
        region, self._region = self._region, None
        self._pool._give(region)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __del__(self):
        region, self._region = getattr(self, "_region", None), None
        if region is None or _weakref is None:  # (interpreter shutdown: nothing to give)
            return
        views = [r() for r in self._views]
        views = [a for a in views if a is not None]
        if not views:
            self._pool._give(region)
            return
        # views outlive the lease: the memory goes back when the last of them goes
        left = [len(views)]
        pool = self._pool

        def gone(_ref=None):
            left[0] -= 1
            if left[0] == 0:
                pool._give(region)
        for a in views:
            _weakref.finalize(a, gone)


class BufferPool:
    """Mooncake's BufferPool(store, max_bytes=0, min_size_class=65536,
    max_size_class=None, alignment=8 MiB, block_on_exhaustion=True,
    default_timeout=None, max_regions=None, prewarm_size=None, prewarm_count=0)."""

    def __init__(self, store, max_bytes=0, min_size_class=64 * 1024, max_size_class=None,
                 alignment=8 * 1024 * 1024, block_on_exhaustion=True, default_timeout=None,
                 max_regions=None, prewarm_size=None, prewarm_count=0):
        max_bytes = _size_arg(max_bytes, "max_bytes")
        min_size_class = _size_arg(min_size_class, "min_size_class")
        alignment = _size_arg(alignment, "alignment")
        _size_arg(prewarm_count, "prewarm_count")
        if store is None or not hasattr(store, "register_buffer") or \
                getattr(store, "_c", None) is None:
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        if min_size_class == 0 or alignment == 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        if alignment < _ctypes.sizeof(_ctypes.c_void_p) or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        local = getattr(store, "_buffer_size", 0)
        if not local:
            raise RuntimeError("BufferPool requires a store configured with a local buffer")
        self._store = store
        self._max_bytes = (2 * local if max_bytes == 0 else max(max_bytes, local))
        self._max_size_class = (self._max_bytes if max_size_class is None
                                else _size_arg(max_size_class, "max_size_class"))
        self._alignment = alignment
        self._block = bool(block_on_exhaustion)
        self._timeout = None if default_timeout is None else float(default_timeout)
        self._max_regions = None if max_regions is None else _size_arg(max_regions,
                                                                        "max_regions")
        self._cond = _threading.Condition()
        self._total = 0  # bytes leased
        self._leases = 0
        self._closed = False
        self._arena = _Arena(-(-local // _PAGE) * _PAGE)
        if store.register_buffer(self._arena.base, self._arena.size) != 0:
            raise RuntimeError("local buffer registration failed")
        # prewarm_size / prewarm_count: accepted, nothing to warm (as in Mooncake)

    def _room(self, n):
        if n > self._max_bytes - self._total:
            return False
        return self._max_regions is None or self._leases < self._max_regions

    def _take(self, n):
        """A region of n bytes, or None when there is none to take now (lock held)."""
        got = self._arena.take(n)
        if got is not None:
            return ("local", got[0], got[1], None)
        length = -(-(n + (self._alignment if self._alignment > _PAGE else 0)) // _PAGE) * _PAGE
        try:
            m = _mmap.mmap(-1, length, flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)
        except (OSError, OverflowError, ValueError):
            return None
        ptr = _address(m)
        ptr = -(-ptr // self._alignment) * self._alignment  # within the extra it mapped
        if self._store.register_buffer(ptr, n) != 0:
            m.close()
            raise RuntimeError("overflow buffer registration failed")
        return ("overflow", ptr, n, m)

    def acquire(self, size, block=None, timeout=None):
        """A BufferLease of size bytes. RuntimeError: larger than the pool, exhausted
        (block=False), timed out, or the pool closed."""
        size = _size_arg(size, "size")
        n = max(size, 1)
        if n > self._max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        wait = self._block if block is None else bool(block)
        t = self._timeout if timeout is None else float(timeout)
        if t is not None and t < 0:
            raise RuntimeError("timeout must be non-negative")
        deadline = None if t is None else _time.monotonic() + t
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("buffer pool is closed")
                region = self._take(n) if self._room(n) else None
                if region is not None:
                    self._total += region[2]
                    self._leases += 1
                    return BufferLease(self, region, size)
                if not wait:
                    raise RuntimeError("buffer pool is exhausted")
                if deadline is None:
                    self._cond.wait()
                else:
                    left = deadline - _time.monotonic()
                    if left <= 0:
                        raise RuntimeError("timed out waiting for buffer")
                    self._cond.wait(left)

    buffer = acquire

    def prewarm(self, size, count):
        """Accepted; nothing to warm (as in Mooncake)."""
        _size_arg(size, "size")
        _size_arg(count, "count")

    def _give(self, region):
        kind, ptr, n, m = region
        with self._cond:
            if kind == "local":
                self._arena.give(ptr, n)
            self._total -= n
            self._leases -= 1
            self._cond.notify_all()
        if m is not None:
            self._store.unregister_buffer(ptr)
            m.close()

    def close(self):
        """Close the pool. RuntimeError while a lease is held."""
        with self._cond:
            if self._closed:
                return
            if self._leases:
                raise RuntimeError("cannot close buffer pool with active leases")
            self._closed = True
            self._cond.notify_all()
        self._store.unregister_buffer(self._arena.base)


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
RegisteredBufferLeaseView = BufferLeaseView
