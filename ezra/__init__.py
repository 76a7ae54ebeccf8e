"""EZRA: a persistent task queue that speaks the Redis protocol, stored in SQLite.

Embedding: `from ezra import Server` (see ezra/embed.py); imported on first
use, so `import ezra` stays cheap.
"""

__version__ = "0.1.0"

__all__ = ["Server", "__version__"]


def __getattr__(name):
    if name == "Server":
        from .embed import Server
        return Server
    raise AttributeError(f"module 'ezra' has no attribute {name!r}")
