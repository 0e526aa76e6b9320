"""Mooncake's public entry point for local-buffer pools: BufferPool (and its name
RegisteredBufferPool) of mooncake.store, on kvpool (mooncake/store/_buffer_pool.py)."""

from mooncake.store import BufferPool

RegisteredBufferPool = BufferPool

__all__ = ["BufferPool", "RegisteredBufferPool"]
