"""EZRA: a persistent task queue that speaks the Redis protocol, stored in SQLite."""

__version__ = "0.1.0"
