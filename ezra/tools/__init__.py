"""The command-line programs besides the server, one module per subcommand:
entry.py dispatches `ezra <subcommand>`; backup.py is `ezra backup`, ping.py
`ezra ping`, inspector.py `ezra stats`, `ezra ls` and `ezra requeue`, and move.py
(with stream_copy.py, progress.py, carried_settings.py and carried_outcomes.py: results
and progress) `ezra export` and `ezra import`. A tool
talks to a running server over its port with ezra/adapters/client.py, or reads ezra.db
through storage (read-only, except `ezra import --data-dir`, which runs an
embedded server); each loads only what it needs, so a short-lived program starts
fast. The core never imports tools (ezra/__main__.py only calls entry.main); the
dashboard takes humanize.py (durations as people read them, a module that imports
nothing) from here.
"""
