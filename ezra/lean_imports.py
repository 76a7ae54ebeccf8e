"""Keep the server's idle memory down: loguru without asyncio (and, through it, ssl); the
option parser's modules let go once the options are parsed.

loguru's `_asyncio_loop` module imports asyncio at import time, only so that
coroutine sinks can find their event loop. asyncio imports ssl, which loads
OpenSSL. With hmac and hashlib also imported only where used (AUTH, IDMPAUTO),
an idle server holds 6.4 MB less (34.3 -> 27.9 MB, bench footprint). EZRA logs
to stderr and never adds a coroutine sink, so the server installs a stand-in
for that module whose functions import asyncio when first called. Anything else
loguru might ask of the module loads the real one, so a newer loguru still works
(it then costs the memory again; tests/test_lean_imports.py notices).

decimal, which loguru imports for its file sinks only, gets a stand-in of the same
kind (0.3 MB: its C module). Once the server's options are parsed, the option
parser's modules are let go (forget_option_parser, below).
"""

from __future__ import annotations

import gc
import importlib
import sys
import types

LOGURU_ASYNCIO = "loguru._asyncio_loop"


class DeferredAsyncioLoop(types.ModuleType):
    """Stands in for loguru._asyncio_loop until asyncio is really needed."""

    @staticmethod
    def get_running_loop():
        import asyncio
        return asyncio.get_running_loop()

    @staticmethod
    def get_task_loop(task):
        return task.get_loop()

    def __getattr__(self, name: str):
        """A name this stand-in does not define: load loguru's own module and use it."""
        if name.startswith("__"):
            raise AttributeError(name)  # the import system asks for __path__ and such: not loguru
        real = sys.modules.get(LOGURU_ASYNCIO)
        if real is self or real is None:
            sys.modules.pop(LOGURU_ASYNCIO, None)
            real = importlib.import_module(LOGURU_ASYNCIO)
        value = getattr(real, name)
        setattr(self, name, value)  # found directly from now on
        return value


def defer_loguru_asyncio() -> None:
    """Call before loguru is first imported; a no-op if it was imported already."""
    if "loguru" in sys.modules:
        return
    sys.modules.setdefault(LOGURU_ASYNCIO, DeferredAsyncioLoop(LOGURU_ASYNCIO))
    defer_import("decimal")  # loguru's file sinks only (rotation sizes): the server logs to stderr


def defer_import(name: str) -> None:
    """Register a stand-in for module `name` that loads the real one on first use."""
    if name not in sys.modules:
        sys.modules[name] = Deferred(name)


# configargparse and what it alone loads: argparse (and its gettext), configparser, csv.
PARSER_MODULES = ("configargparse", "argparse", "gettext", "configparser", "csv", "_csv")


class Deferred(types.ModuleType):
    """Stands in for a module not loaded (or let go): loads it on first use.

    (importlib.util.LazyLoader does not do here: an `import` statement of a module
    already in sys.modules reads its __spec__, which makes a lazy module load.)
    """

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        real = sys.modules.get(self.__name__)
        if real is self or real is None:
            sys.modules.pop(self.__name__, None)
            real = importlib.import_module(self.__name__)
        return getattr(real, name)


def forget_option_parser() -> None:
    """Once the server's options are parsed, before gevent and the rest are imported: the
    parser and its modules (idle RSS 28.6 -> 27.8 MB) are freed, and the imports
    that follow reuse their memory. A later use of ezra.config's parser imports them again.
    """
    from . import config
    config.configargparse = Deferred("configargparse")
    for name in PARSER_MODULES:
        sys.modules.pop(name, None)
    gc.collect()  # the modules and the parser are cycles (functions -> globals -> functions)
