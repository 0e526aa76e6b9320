"""asyncio on libkvpool's async queue (kvp_aq_*): what kvpool.Client.aget,
aput, aexists, abatch_get_into, ... run on.

Design: a batch is submitted to the queue (kvp_aq_put/get/exist through the
extension) and returns at once; its arrays stay owned by the extension until
the completion is reaped. The queue's eventfd is registered with each event
loop that submits (loop.add_reader); when it is readable the loop reaps every
completion and completes the futures: directly for its own, through
call_soon_threadsafe for a future of another loop. No thread per call: the
batches run on the queue's fixed worker threads, in any order.

A cancelled future only drops the result: the batch itself runs to its end
(its buffers stay referenced until then). More than AQ_MAX_INFLIGHT batches
in flight wait here, in order, for room.
"""

import asyncio
import collections
import threading
import weakref

from . import _kvpool

_TOO_MANY = _kvpool.STATUS["KVP_ERR_TOO_MANY"]
_TOO_SMALL = _kvpool.STATUS["KVP_ERR_BUFFER_TOO_SMALL"]
_SHUTDOWN = _kvpool.STATUS["KVP_ERR_SHUTDOWN"]


def _error(status, what):
    # The failing call ran on a queue worker, whose last-error text is not this
    # thread's: the message is the status's own text.
    return _kvpool.error(status, f"{what}: {_kvpool.strerror(status)}")


def _resolve(fut, value, exc):
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


class Queue:
    """One client's async queue; any number of event loops may use it."""

    def __init__(self, raw, workers=0):
        raw.aq_open(workers)
        self._raw = raw
        self._fd = raw.aq_fd()
        self._lock = threading.Lock()      # the backlog against concurrent reapers
        self._backlog = collections.deque()  # (method, args, future): waiting for room
        self._loops = weakref.WeakSet()    # loops our reader is registered with
        self._closed = False
        self._size_hint = 16384            # aget's first capacity: the last size read

    # ---- plumbing ----

    def _complete(self, fut, value=None, exc=None):
        loop = fut.get_loop()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is running:
            _resolve(fut, value, exc)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(_resolve, fut, value, exc)

    def _watch(self, loop):
        if loop not in self._loops:
            loop.add_reader(self._fd, self._on_readable)
            self._loops.add(loop)

    def _submit(self, method, *args):
        if self._closed:
            raise _kvpool.error(_SHUTDOWN, "the client is closed")
        loop = asyncio.get_running_loop()
        self._watch(loop)
        fut = loop.create_future()
        with self._lock:
            st = method(*args, fut) if not self._backlog else _TOO_MANY
            if st == _TOO_MANY:
                self._backlog.append((method, args, fut))
                return fut
        if st != 0:
            fut.set_exception(_error(st, "submit"))
        return fut

    def _drain_backlog(self):
        with self._lock:
            while self._backlog:
                method, args, fut = self._backlog[0]
                try:
                    st = method(*args, fut)
                except Exception as e:  # the client closed meanwhile
                    self._backlog.popleft()
                    self._complete(fut, exc=e)
                    continue
                if st == _TOO_MANY:
                    return
                self._backlog.popleft()
                if st != 0:
                    self._complete(fut, exc=_error(st, "submit"))

    def _on_readable(self):
        """The eventfd is readable: reap everything, complete the futures."""
        while True:
            try:
                done = self._raw.aq_reap(256)
            except _kvpool.Error:
                return
            for fut, _status, results in done:
                self._complete(fut, results)
            if len(done) < 256:
                break
        if self._backlog:
            self._drain_backlog()

    # ---- batches: futures of the per-key results ----

    def batch_put(self, keys, buffers, config=None):
        """-> future of [status] (buffers: buffer objects or (ptr, size) pairs)"""
        return self._submit(self._raw.aq_put, keys, buffers, config)

    def batch_get_into(self, keys, buffers):
        """-> future of [length or negative status]"""
        return self._submit(self._raw.aq_get, keys, buffers)

    def batch_exists(self, keys):
        """-> future of [1, 0 or negative status]"""
        return self._submit(self._raw.aq_exist, keys)

    async def get(self, key):
        """The object's bytes, read into a buffer sized by the last object read
        (grown and read again when too small). Raises Error on a miss."""
        cap = self._size_hint
        while True:
            r = await self._submit(self._raw.aq_get_bytes, key, cap)
            if isinstance(r, bytes):
                self._size_hint = max(4096, len(r))
                return r
            if r == _TOO_SMALL and cap < (1 << 40):
                cap *= 16
                continue
            raise _error(r, f"get {key}")

    def close(self):
        """Destroy the queue (waits for the batches running); futures not
        completed yet fail with Error(KVP_ERR_SHUTDOWN)."""
        if self._closed:
            return
        self._closed = True
        for loop in list(self._loops):
            if loop.is_closed():
                continue
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if loop is running or not loop.is_running():
                loop.remove_reader(self._fd)
            else:
                loop.call_soon_threadsafe(loop.remove_reader, self._fd)
        # the completions still waiting are theirs: deliver them first
        self._on_readable_quiet()
        left = self._raw.aq_close()
        with self._lock:
            left += [fut for _, _, fut in self._backlog]
            self._backlog.clear()
        for fut in left:
            self._complete(fut, exc=_kvpool.error(_SHUTDOWN, "the client was closed"))

    def _on_readable_quiet(self):
        try:
            for fut, _status, results in self._raw.aq_reap(256):
                self._complete(fut, results)
        except _kvpool.Error:
            pass
