"""Coverage-guided fuzzing (atheris, libFuzzer) of the request reader and the command layer, in process.

Each input is split by the fuzzer into a protocol choice, a chunk size and the
bytes of one connection. The bytes go through RequestReader in those chunks;
every command is dispatched on a real broker over a temporary database; every
reply is encoded (RESP2 or RESP3, as the session speaks) and parsed back with
the suite's strict parser (tests/support_resp.py). A crash is any exception other than
the reader's ProtocolError, and any reply that is `internal error` or a
rolled-back batch.

    pip install atheris
    python scripts/fuzz_atheris.py -atheris_runs=20000        # a bounded run
    python scripts/fuzz_atheris.py corpus/ -max_total_time=600 # longer, keeping a corpus

The options are libFuzzer's. tests/test_fuzz_commands.py runs it briefly
(EZRA_ATHERIS_RUNS) when atheris is installed.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import atheris

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

with atheris.instrument_imports(include=["ezra"]):
    from ezra import commands, errors
    from ezra.broker import Broker
    from ezra.config import parse_settings
    from ezra.protocol.resp import ErrorReply, encode
    from ezra.protocol.request_reader import ProtocolError, RequestReader
    from ezra.front.session import ServerState, Session
    from ezra.storage import open_database

from support_resp import Err, errors_in, parse_value  # noqa: E402  (tests/, after the path above)

SKIPPED = {b"BACKUP"}  # writes a file wherever it is told: not for random input
OPTION_WORDS = ["GROUP", "COUNT", "BLOCK", "NOACK", "CLAIM", "STREAMS", "IDS", "FAIL", "SILENT", "FATAL",
                "RETRYCOUNT", "FORCE", "JUSTID", "IDLE", "TIME", "LASTID", "MKSTREAM", "NOMKSTREAM", "FULL",
                "DELAY", "TTL", "IDMP", "IDMPAUTO", "MAXLEN", "MINID", "LIMIT", "~", "=", "KEEPREF", "DELREF", "ACKED",
                "ALL", "CREATE", "DESTROY",
                "SETNAME", "SETINFO", "AUTH", "VISIBILITY-TIMEOUT", "MAX-ATTEMPTS", "RETENTION", "BACKOFF",
                "EXPONENTIAL", "FIXED", "RELEASE-ON-DISCONNECT", "IDMP-DURATION", "IDMP-MAXSIZE", "DEFAULT",
                "STREAM", "GROUPS", "CONSUMERS", "HELP", ">", "0-0", "*", "-", "+", "::dead",
                "9223372036854775807", "9223372036854775808", "-1", "$",
                "\\x0D\\x0A", "*1\\x0D\\x0A"]  # CR LF: libFuzzer's dictionaries escape bytes as \\xNN


class Harness:
    """A broker over a temporary database, and a fresh session per input."""

    def __init__(self, data_dir: str):
        self.settings = parse_settings(["--data-dir", data_dir, "--port", "0", "--durability", "normal",
                                        "--visibility-timeout", "0.05", "--disk-reserve", "0"])
        self.broker = Broker(open_database(data_dir, 0), self.settings)
        self.state = ServerState(self.broker, self.settings)
        self.runs = 0

    def session(self):
        # A blocked read times out at once; there is nothing to flush to.
        return Session(self.state, "fuzz:1", SimpleNamespace(wait=lambda event, timeout: False, flush=lambda: None))

    def one_input(self, data: bytes) -> None:
        self.runs += 1
        chunk, payload = (data[0] % 64 + 1, data[1:]) if data else (1, b"")  # the first byte: chunk size
        reader = RequestReader(max_bulk_len=self.settings.max_task_size + 64 * 1024)
        session = self.session()
        try:
            for start in range(0, len(payload), chunk):
                commands = reader.take(payload[start:start + chunk])  # as the connection reads
                while commands and not session.closing:
                    for args in commands:
                        if session.closing:
                            break
                        self.run_command(session, args)
                    commands = reader.next_commands()
        except ProtocolError:
            pass  # a broken frame: the connection would be closed after its error
        finally:
            session.close()

    def run_command(self, session, args: list[bytes]) -> None:
        if args[0].upper() in SKIPPED:
            return
        reply = commands.dispatch(session, args)
        try:
            reply = commands.resolved(reply)  # a Deferred's or a Request's result
        except ErrorReply as exc:
            reply = exc
        wire = encode(reply, session.proto)
        parsed, end = parse_value(wire, 0, resp3=True)
        assert end == len(wire), f"{args[:4]!r}: bytes after the reply"
        for error in errors_in(parsed):
            text = error.message.decode("utf-8", "replace")
            if errors.INTERNAL.message in text or "storage error" in text:
                raise AssertionError(f"{args[:6]!r} answered {text}")
        assert not isinstance(parsed, Err) or isinstance(reply, ErrorReply)


SEEDS = [  # one connection each, as the server would receive it (after the chunk-size byte)
    [["XADD", "q", "*", "f", "v"], ["XREADGROUP", "GROUP", "g", "w", "COUNT", "2", "STREAMS", "q", ">"],
     ["XACK", "q", "g", "0-1"], ["XNACK", "q", "g", "FAIL", "IDS", "1", "0-1", "RETRYCOUNT", "2", "FORCE"]],
    [["XADD", "q", "DELAY", "0.01", "TTL", "5", "IDMP", "p", "i", "*", "f", "v"], ["XLEN", "q"],
     ["XRANGE", "q", "-", "+", "COUNT", "5"], ["XREVRANGE", "q::dead", "+", "-"]],
    [["XREADGROUP", "GROUP", "g", "w", "BLOCK", "1", "CLAIM", "0", "NOACK", "STREAMS", "q", "q2", ">", "0"],
     ["XPENDING", "q", "g"], ["XPENDING", "q", "g", "IDLE", "0", "-", "+", "10", "w"]],
    [["XCLAIM", "q", "g", "w2", "0", "0-1", "IDLE", "5", "RETRYCOUNT", "3", "JUSTID", "FORCE"],
     ["XAUTOCLAIM", "q", "g", "w2", "0", "0-0", "COUNT", "5", "JUSTID"], ["XDEL", "q", "0-1"]],
    [["XCFGSET", "q", "VISIBILITY-TIMEOUT", "1", "MAX-ATTEMPTS", "2", "BACKOFF", "EXPONENTIAL", "1", "5",
      "RETENTION", "FOREVER", "RELEASE-ON-DISCONNECT", "OFF"], ["XINFO", "STREAM", "q", "FULL", "COUNT", "2"],
     ["XINFO", "GROUPS", "q"], ["XINFO", "CONSUMERS", "q", "g"]],
    [["XACKDEL", "q", "g", "KEEPREF", "IDS", "1", "0-1"], ["XREQUEUE", "q", "ALL"],
     ["XREQUEUE", "q::dead", "IDS", "1", "0-1"], ["XGROUP", "CREATE", "q3", "g", "$", "MKSTREAM"]],
    [["HELLO", "3", "SETNAME", "x"], ["CLIENT", "SETINFO", "LIB-NAME", "x"], ["INFO", "queues"],
     ["COMMAND", "INFO", "xadd"], ["PING"], ["SELECT", "0"], ["GET", "k"], ["QUIT"]],
]


def seed_corpus(path: Path) -> None:
    path.mkdir()
    for n, connection in enumerate(SEEDS):
        frames = b"".join(b"*%d\r\n" % len(cmd) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a.encode()) for a in cmd)
                          for cmd in connection)
        (path / f"seed{n}").write_bytes(b"\x3f" + frames)
    (path / "inline").write_bytes(b"\x07PING\r\nXADD q * f \"v w\"\r\nXLEN q\n")


def dictionary(path: Path) -> None:
    """libFuzzer's dictionary: the command names and option words, so inputs reach past the parser."""
    names = [name.decode() for name in commands.COMMANDS]
    path.write_text("".join(f'"{word}"\n' for word in names + OPTION_WORDS))


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ezra-atheris-") as tmp:
        harness = Harness(os.path.join(tmp, "data"))
        argv = list(sys.argv)
        if not any(arg.startswith("-dict=") for arg in argv):
            dictionary(Path(tmp) / "words.dict")
            argv.append(f"-dict={tmp}/words.dict")
        if not any(arg.startswith("-max_len=") for arg in argv):
            argv.append("-max_len=4096")
        if all(arg.startswith("-") for arg in argv[1:]):  # no corpus given: start from valid frames
            seed_corpus(Path(tmp) / "corpus")
            argv.append(f"{tmp}/corpus")
        atheris.Setup(argv, harness.one_input)
        atheris.Fuzz()


if __name__ == "__main__":
    main()
