"""The `ezra` program: `ezra ping` (health check), `ezra backup` (hot backup), `ezra stats`,
`ezra ls` and `ezra requeue` (the inspector), `ezra export` and `ezra import` (to and from
Redis), else the server.

The binary, `python -m ezra` and the console script all start here. Subcommands
are dispatched before the server's option parser sees the arguments, so
`ezra ping` never imports gevent or opens the database.
"""

from __future__ import annotations

import sys

COMMANDS = ("ping", "backup", "stats", "ls", "requeue", "export", "import")


def main(argv: list[str] | None = None) -> None:
    """Run a subcommand (`ezra ping [options]`...) or the server (`ezra [options]`)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["ping"]:
        from .ping import main as ping
        sys.exit(ping(args[1:]))
    if args[:1] == ["backup"]:
        from .backup import backup_main  # a short-lived program of its own: no gevent, no server
        sys.exit(backup_main(args[1:]))
    if args[:1] and args[0] in ("export", "import"):
        from .move import SUBCOMMANDS as MOVES, run as run_move  # EZRA <-> Redis: no gevent unless --data-dir
        sys.exit(run_move(MOVES[args[0]], args[1:]))
    if args[:1] and args[0] in ("stats", "ls", "requeue"):
        from .inspector import SUBCOMMANDS, run  # over the server's port: no gevent, no database
        sys.exit(run(SUBCOMMANDS[args[0]], args[1:]))
    if args[:1] and not args[0].startswith("-"):
        print(unknown_command(args[0]), file=sys.stderr)
        sys.exit(2)  # as argparse exits on a usage error
    from ..lean_imports import defer_loguru_asyncio, forget_option_parser
    defer_loguru_asyncio()  # before app imports loguru: 6 MB less at idle
    from ..config import parse_settings
    settings = parse_settings(args)  # before app's imports, which then reuse the parser's memory
    forget_option_parser()
    from ..app import serve
    serve(settings)


def unknown_command(word: str) -> str:
    """The server takes only --options: a bare word is a mistyped command (`ezra stat`)."""
    import difflib  # here: the server never needs it
    near = difflib.get_close_matches(word, COMMANDS, n=1)
    hint = f"did you mean 'ezra {near[0]}'? " if near else ""
    return (f"ezra: unknown command {word!r}: {hint}the commands are {', '.join(COMMANDS)}, "
            "and the server itself takes only --options (ezra --help)")
