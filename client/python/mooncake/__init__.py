"""mooncake: kvpool's stand-in for Mooncake's package, for mooncake.store.

pkgutil-style: the other `mooncake` directories on sys.path (a real Mooncake
installed too) are searched for what this one lacks (mooncake.engine, ...),
while mooncake.store is kvpool's when this directory comes first on the path.
"""

__path__ = __import__("pkgutil").extend_path(__path__, __name__)
