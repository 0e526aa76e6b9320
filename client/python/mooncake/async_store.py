"""mooncake.async_store on kvpool: Mooncake's asyncio face of the store.

MooncakeDistributedStoreAsync is a MooncakeDistributedStore whose every method
NAME also answers as `async_NAME`, a coroutine function that runs NAME on the
event loop's default executor (a thread; kvpool's store releases the GIL in
its data calls, so they overlap) and returns what NAME returns:

    store = MooncakeDistributedStoreAsync()
    store.setup(...)
    await store.async_put("k", b"v")         # 0
    await store.async_get("k")               # b"v"

As in Mooncake, a wrapper is made on first use and kept on the instance; a
name without the async_ prefix, or whose method is missing or not callable,
raises AttributeError.
"""

import asyncio
import functools

from mooncake.store import MooncakeDistributedStore

__all__ = ["MooncakeDistributedStoreAsync"]

_PREFIX = "async_"


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    """A MooncakeDistributedStore with async_<method> coroutines (module doc)."""

    def __getattr__(self, name: str):
        # Called only for names the instance and class do not have.
        if not name.startswith(_PREFIX):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        target = name[len(_PREFIX):]
        if not hasattr(self, target):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}' "
                                 f"(nor '{target}')")
        method = getattr(self, target)
        if not callable(method):
            raise AttributeError(f"'{target}' is not callable")
        coro = self._make_async_wrapper(method)
        setattr(self, name, coro)  # later lookups find it without __getattr__
        return coro

    def _make_async_wrapper(self, sync_method):
        """A coroutine function running sync_method(*args, **kwargs) in the
        running loop's default executor."""
        @functools.wraps(sync_method)
        async def run_in_executor(*args, **kwargs):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, functools.partial(sync_method, *args,
                                                                      **kwargs))
        return run_in_executor
