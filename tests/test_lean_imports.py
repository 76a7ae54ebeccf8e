"""The server starts without OpenSSL or asyncio loaded (6 MB of idle memory), and loguru still works."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from support_servers import ROOT


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
        import ezra.app, ezra.front.server
        print(sorted(m for m in ("asyncio", "ssl", "_ssl", "_hashlib", "_decimal", "platform")
                      if m in sys.modules))
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


def test_the_option_parser_is_let_go_once_the_options_are_parsed():
    """ezra/tools/entry.py parses, then forgets the parser's modules before gevent is imported:
    idle RSS 28.6 -> 27.8 MB (BENCHMARKS.md, Footprint). They are freed, not just unlisted."""
    out = run_python("""
        import gc, sys, weakref
        from ezra.lean_imports import PARSER_MODULES, defer_loguru_asyncio, forget_option_parser
        defer_loguru_asyncio()
        from ezra.config import parse_settings
        settings = parse_settings(["--port", "0", "--queue", "emails MAX-ATTEMPTS 5"])
        modules = [weakref.ref(sys.modules[name]) for name in PARSER_MODULES if name in sys.modules]
        forget_option_parser()
        import ezra.app, ezra.front.server
        gc.collect()
        print(len(modules), sum(ref() is not None for ref in modules),
              sorted(name for name in PARSER_MODULES + ("difflib",) if name in sys.modules))
        print(settings.port, settings.queues)
        from ezra.config import build_parser  # a later parser imports them again
        print(build_parser().parse_args(["--port", "7"]).port)
    """)
    assert out.splitlines() == ["6 0 []", "0 ((b'emails', {'max_attempts': 5}),)", "7"]


def test_a_server_started_from_the_command_line_refuses_bad_options_as_before():
    """The options are parsed before the server's imports: errors still exit 2 with argparse's words."""
    result = subprocess.run([sys.executable, "-m", "ezra", "--port", "99999"], capture_output=True, text=True,
                            cwd=str(ROOT), timeout=60)
    assert result.returncode == 2
    assert "--port: must be 0..65535" in result.stderr


def test_file_sinks_still_work_with_decimal_deferred(tmp_path):
    """loguru's file sinks are what use decimal (their rotation): the stand-in loads it for them."""
    log = tmp_path / "ezra.log"
    out = run_python(f"""
        import sys
        from ezra.lean_imports import defer_loguru_asyncio
        defer_loguru_asyncio()
        import decimal
        from loguru import logger
        logger.remove()
        logger.add({str(log)!r}, rotation=decimal.Decimal(1000), format="{{message}}")
        logger.info("to a file")
        print(type(sys.modules["decimal"]).__name__, "_decimal" in sys.modules)
    """)
    assert out.split() == ["module", "True"]
    assert log.read_text() == "to a file\n"


def test_info_names_the_system_as_platform_does(ezra_factory):
    """INFO's os and python_version come from os.uname() and sys.version_info, not the platform module."""
    import platform
    server = ezra_factory()
    with server.client() as client:
        info = client.info("server")
    assert info["os"] == f"{platform.system()} {platform.release()} {platform.machine()}"
    assert str(info["python_version"]) == platform.python_version()
