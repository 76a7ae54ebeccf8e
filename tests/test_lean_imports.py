"""The server starts without OpenSSL or asyncio loaded (6 MB of idle memory), and loguru still works."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import ROOT


def run_python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            cwd=str(ROOT), timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_server_modules_load_neither_asyncio_nor_openssl():
    out = run_python("""
        from ezra.lean_imports import defer_loguru_asyncio
        defer_loguru_asyncio()
        import sys
        import ezra.app, ezra.server
        print(sorted(m for m in ("asyncio", "ssl", "_ssl", "_hashlib") if m in sys.modules))
    """)
    assert out.strip() == "[]", "something imports them again: the idle RSS grows by up to 6 MB"


def test_a_running_server_has_no_openssl_mapped(ezra_factory):
    server = ezra_factory()
    with server.client() as client:
        assert client.xadd("jobs", {"job": 1})
    with open(f"/proc/{server.proc.pid}/maps") as maps:
        mapped = maps.read()
    assert "libcrypto" not in mapped and "libssl" not in mapped


def test_coroutine_sinks_still_work_with_the_stand_in():
    out = run_python("""
        from ezra.lean_imports import defer_loguru_asyncio
        defer_loguru_asyncio()
        import asyncio
        from loguru import logger
        logger.remove()
        got = []

        async def sink(message):
            got.append(message.record["message"])

        async def main():
            logger.add(sink)
            logger.info("from a coroutine sink")
            await logger.complete()

        asyncio.run(main())
        print(got)
    """)
    assert out.strip() == "['from a coroutine sink']"


def test_a_name_the_stand_in_lacks_comes_from_loguru_itself():
    out = run_python("""
        from ezra.lean_imports import defer_loguru_asyncio
        defer_loguru_asyncio()
        import sys
        import loguru
        from loguru import _asyncio_loop
        assert "asyncio" not in sys.modules
        functions = _asyncio_loop.load_loop_functions()  # defined by loguru's module only
        print(len(functions), "asyncio" in sys.modules, type(sys.modules["loguru._asyncio_loop"]).__name__)
    """)
    assert out.split() == ["2", "True", "module"]


def test_no_stand_in_when_loguru_is_already_loaded():
    out = run_python("""
        import sys
        import loguru
        from ezra.lean_imports import defer_loguru_asyncio
        defer_loguru_asyncio()
        print(type(sys.modules["loguru._asyncio_loop"]).__name__)
    """)
    assert out.strip() == "module"
