"""mooncake: kvpool's stand-in for Mooncake's package, for mooncake.store.

pkgutil-style: the other `mooncake` directories on sys.path (a real Mooncake
installed too) are searched for what this one lacks (mooncake.engine, ...),
while mooncake.store is kvpool's when this directory comes first on the path.
"""

__path__ = __import__("pkgutil").extend_path(__path__, __name__)

__all__ = ["BufferPool", "RegisteredBufferPool"]


def __getattr__(name):
    """BufferPool and RegisteredBufferPool, as Mooncake's package exports them, imported
    on first use (so that `import mooncake` alone loads nothing of kvpool's)."""
    if name in __all__:
        from mooncake import buffer_pool

        return getattr(buffer_pool, name)
    raise AttributeError(f"module 'mooncake' has no attribute {name!r}")
