"""Every error text a client can see is in the catalogue (ezra/errors.py), and says what it said.

The rule is read from the source (ast), so it holds from now on: outside errors.py no string
literal, f-string or concatenation with one is handed to an error constructor (`errors.err`,
`CommandError`, `ErrorReply`, the catalogue's `_fixed`; the HTTP listener's `HttpError` and
`ClientInputError`) nor to `to_int`'s error argument.
A raise names its error instead (`raise errors.UNIQUE_TWICE`, `errors.unique_key_too_long(n, most)`).
Then the real server answers a sample of the moved texts, byte for byte, in RESP2 and RESP3,
and its HTTP listener shows its own on the error page.
"""

from __future__ import annotations

import ast
import html
import inspect
from pathlib import Path

import pytest

from ezra import errors
from support import RespConnection, http

PACKAGE = Path(__file__).resolve().parent.parent / "ezra"
CATALOGUE = PACKAGE / "errors.py"
# The calls that turn a text into an error a client receives; for to_int, its error argument.
ERROR_CONSTRUCTORS = {"err", "CommandError", "ErrorReply", "_fixed", "FixedError",
                      "HttpError", "_fixed_http", "FixedHttpError", "ClientInputError"}  # the HTTP listener's
TEXT_AFTER_FIRST = {"to_int"}


def called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def holds_text(node: ast.AST) -> bool:
    """A literal text is (part of) this expression: "...", f"...", "..." + x, "...".join(...)."""
    return any(isinstance(part, ast.JoinedStr) or (isinstance(part, ast.Constant) and isinstance(part.value, str))
               for part in ast.walk(node))


def inline_error_texts(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = called_name(node)
        if name in ERROR_CONSTRUCTORS:
            arguments = node.args
        elif name in TEXT_AFTER_FIRST:
            arguments = node.args[1:]
        else:
            continue
        arguments = [*arguments, *(keyword.value for keyword in node.keywords)]
        if any(holds_text(argument) for argument in arguments):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_no_error_text_is_written_outside_the_catalogue():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != CATALOGUE
             for hit in inline_error_texts(path)]
    assert not found, "error texts written inline; name them in ezra/errors.py:\n" + "\n".join(found)


def test_the_scan_sees_each_way_of_writing_a_text_inline(tmp_path):
    """The check above cannot pass by missing a form: each of these is caught."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        'raise errors.err("plain")\n'
        'raise errors.err(f"formatted {x}")\n'
        'raise CommandError("NOAUTH " + why)\n'
        'raise ErrorReply(message="ERR keyword")\n'
        'value = to_int(arg, "an ERR text")\n'
        'raise HttpError("404 Not Found", f"nothing at {path}")\n'
        'raise errors.err(", ".join(names))\n'
        'raise errors.UNIQUE_TWICE\n'              # named: fine
        'raise errors.unique_key_too_long(n, 256)\n'  # a catalogue function: fine
        'value = to_int(arg, errors.NOT_INTEGER)\n'   # fine
    )
    hits = inline_error_texts(sample, tmp_path)
    assert [hit.split(":")[1] for hit in hits] == ["1", "2", "3", "4", "5", "6", "7"], hits


def test_every_fixed_error_keeps_a_redis_prefix():
    """Clients map the first word to an exception class: every fixed text starts with an upper-case code."""
    fixed = [value for value in vars(errors).values()
             if inspect.isclass(value) and issubclass(value, errors.CommandError) and hasattr(value, "message")]
    assert len(fixed) > 50  # the scan of the module found them
    for error in fixed:
        code = error.message.split(" ", 1)[0]
        assert code.isupper() and code.isalpha(), error.message


# A sample of the texts moved into the catalogue, each with a command that gets it before it
# changes anything. The expected bytes are written out here on purpose: the move kept them.
MOVED = [
    (["EXEC"], "-ERR EXEC without MULTI"),
    (["DISCARD"], "-ERR DISCARD without MULTI"),
    (["HELLO", "x"], "-ERR Protocol version is not an integer or out of range"),
    (["HELLO", "3", "BOGUS"], "-ERR Syntax error in HELLO option 'BOGUS'"),
    (["CLIENT", "SETNAME", "a b"], "-ERR Client names cannot contain spaces, newlines or special characters."),
    (["CLIENT", "SETINFO", "LIB-X", "v"], "-ERR Unrecognized option 'LIB-X'"),
    (["CLIENT", "ID", "x"], "-ERR wrong number of arguments for 'client|id' command"),
    (["XGROUP", "CREATE", "{q}"], "-ERR wrong number of arguments for 'xgroup|create' command"),
    (["XINFO", "TASKS", "{q}"], "-ERR wrong number of arguments for 'xinfo|tasks' command"),
    (["XINFO", "TASKS", "{q}", "sleeping"],
     "-ERR state must be one of available, delayed, in_flight, done, dead, waiting, unfinished"),
    (["XINFO", "QUEUES", "COUNT", "0"], "-ERR COUNT must be 1..1000"),
    (["XADD", "{q}", "IDMP", "p", "i", "IDMP", "p", "j", "*", "f", "v"],
     "-ERR IDMP/IDMPAUTO specified multiple times"),
    (["XADD", "{q}", "IDMPAUTO", "", "*", "f", "v"], "-ERR IDMPAUTO requires a non-empty producer ID"),
    (["XADD", "{q}", "IDMP", "p", "i", "5-1", "f", "v"], "-ERR IDMP/IDMPAUTO can be used only with auto-generated IDs"),
    (["XADD", "{q}", "ATTEMPTS", "x", "*", "f", "v"], "-ERR ATTEMPTS must be an integer from 0 to 2147483647"),
    (["XADD", "{q}", "UNIQUE", "k", "UNIQUE", "k", "*", "f", "v"], "-ERR UNIQUE specified multiple times"),
    (["XADD", "{q}", "UNIQUE", "k" * 300, "*", "f", "v"], "-ERR UNIQUE key is 300 bytes long; at most 256 bytes"),
    (["XADD", "{q}", "NAME", "a", "NAME", "b", "*", "f", "v"], "-ERR NAME specified multiple times"),
    (["XADD", "{q}", "NAME", "", "*", "f", "v"], "-ERR NAME requires a non-empty name"),
    (["XADD", "{q}", "NAME", "n" * 300, "*", "f", "v"], "-ERR NAME is 300 bytes long; at most 256 bytes"),
    (["XADD", "{q}", "FAILURE", "[]", "*", "f", "v"],
     '-ERR FAILURE must be a JSON object {"cause": text, "reason": text or null, "worker": text or null, '
     '"at": ms or null}, as ezra export writes it'),
    (["XADD", "{q}::dead", "DELAY", "5", "*", "f", "v"],
     "-ERR DELAY does not apply to a dead task (XADD on a ::dead queue): it is never delivered"),
    (["XADD", "{q}::dead", "MAXLEN", "~", "5", "*", "f", "v"],
     "-ERR MAXLEN/MINID trim a live queue's done tasks: they do not apply to a dead task (XADD on a ::dead queue)"),
    (["XADD", "q" * 300, "*", "f", "v"], "-ERR queue name is 300 bytes long; a new queue's name is at most 256 bytes"),
    (["XREADGROUP", "GROUP", "g", "w", "BLOCK", "x", "STREAMS", "{q}", ">"],
     "-ERR timeout is not an integer or out of range"),
    (["XREADGROUP", "GROUP", "g", "w" * 300, "STREAMS", "{q}", ">"],
     "-ERR consumer name is 300 bytes long; EZRA takes at most 256 (it is stored with every task the consumer holds)"),
    (["XNACK", "{q}", "g", "1-1", "REASON", "why"],
     "-ERR REASON needs XNACK's long form: XNACK queue group FAIL IDS numids id... REASON text"),
    (["XNACK", "{q}", "g", "FAIL", "IDS", "0", "1-1"], "-ERR numids must be a positive integer matching the ids given"),
    (["XNACK", "{q}", "g", "FAIL", "IDS", "1", "1-1", "RETRYCOUNT", "-1"], "-ERR RETRYCOUNT must be zero or positive"),
    (["XCLAIM", "{q}", "g", "w", "x", "1-1"], "-ERR Invalid min-idle-time argument for XCLAIM"),
    (["XCLAIM", "{q}", "g", "w", "0", "1-1", "IDLE", "x"], "-ERR Invalid IDLE option argument for XCLAIM"),
    (["XCLAIM", "{q}", "g", "w", "0", "1-1", "BOGUS"], "-ERR Unrecognized XCLAIM option 'BOGUS'"),
    (["XAUTOCLAIM", "{q}", "g", "w", "0", "0", "COUNT", "0"], "-ERR COUNT must be > 0"),
    (["XCFGSET", "{q}", "MAX-ATTEMPTS", "0"], "-ERR MAX-ATTEMPTS must be between 1 and 2147483647, got 0"),
    (["XCFGSET", "{q}", "IDMP-DURATION", "0"], "-ERR IDMP-DURATION must be between 1 and 86400 seconds, got 0"),
    (["XCFGSET", "{q}", "IDMP-MAXSIZE", "0"], "-ERR IDMP-MAXSIZE must be between 1 and 10000 entries, got 0"),
    (["XCFGSET", "{q}", "PAUSED", "2"], "-ERR PAUSED must be 1 (pause) or 0 (resume), got 2"),
    (["XCFGSET", "{q}", "BACKOFF", "EXPONENTIAL", "5", "1"], "-ERR BACKOFF EXPONENTIAL needs 0 < base <= max seconds"),
    (["XCFGSET", "{q}", "VISIBILITY-TIMEOUT", "x"], "-ERR value is not a valid number of seconds"),
    (["XSCHEDULE", "SET", "n", "{q}", "* * * * *", "FIELDS", "f"],
     "-ERR FIELDS takes field value pairs: at least one field, and a value for each"),
    (["XSCHEDULE", "SET", "n", "{q}", "* * * * *", "BOGUS", "FIELDS", "f", "v"],
     "-ERR unknown schedule option 'BOGUS': after the cron expression come TZ zone, SKIP-IF-UNFINISHED, "
     "SLOT-FIELD field, then FIELDS field value ..."),
    (["XSCHEDULE", "LIST", "x"], "-ERR wrong number of arguments for 'xschedule|list' command"),
]


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_the_server_answers_the_moved_texts_byte_for_byte(shared_server, queue, protocol):
    conn = RespConnection(shared_server.port)
    try:
        if protocol == 3:
            assert conn.call(["HELLO", "3"]).startswith(b"%")
        for command, expected in MOVED:
            args = [arg.replace("{q}", queue) for arg in command]
            assert conn.call(args) == expected.encode() + b"\r\n", args
        assert conn.call(["MULTI"]) == b"+OK\r\n"
        assert conn.call(["MULTI"]) == b"-ERR MULTI calls can not be nested\r\n"
        assert conn.call(["DISCARD"]) == b"+OK\r\n"
        dead_view = f"{queue}::dead"
        assert conn.call(["XCFGSET", dead_view, "PAUSED", "1"]) == (
            f"-ERR '{dead_view}' is the read-only dead-letter view of '{queue}': "
            "use XRANGE, XLEN, XDEL or XREQUEUE on it\r\n").encode()
        assert conn.call(["XLEN", queue]) == b":0\r\n", "none of the refused commands made the queue"
    finally:
        conn.close()


# The HTTP listener's texts moved the same way: (path, form body or None, status, the page's text).
MOVED_HTTP = [
    ("/nowhere", None, 404, "nothing at /nowhere"),
    ("/metrics", b"x=1", 405, "POST is not allowed on /metrics"),
    ("/?page=x", None, 400, "page must be a number"),
    ("/?page=0", None, 400, "pages start at 1"),
    ("/queue", None, 400, "missing name"),
    ("/queue?name=absent", None, 404, "no such queue"),
    ("/static/absent.js", None, 404, "no such file"),
    ("/queue/pause", b"name=absent&paused=1", 403, "missing or stale form token: reload the page and try again"),
]


def test_the_dashboard_shows_the_moved_texts(ezra_factory):
    server = ezra_factory("--http-port", "0")
    for path, form, status, message in MOVED_HTTP:
        got, _, body = http(server.http_url + path, form)
        assert (got, html.escape(message, quote=True) in body.decode()) == (status, True), (path, body[:300])
