"""The HTTP side of a server (--http-port): server.py is the listener (/healthz,
/metrics, the dashboard's pages and its static/ files), metrics.py the Prometheus
exposition, dashboard.py the HTML pages (task_page.py the page of one task); both read the broker's figures from one
snapshot (Admin.figures), as INFO does. These modules may import the core's
public pieces (lifecycle, storage, errors, gate, server, humanize); the core never
imports from here, except app.py, which starts the listener only when --http-port
is given (so prometheus_client is never loaded without it).
"""

import hashlib

# Bytes of a queue name that a label or a page shows: the broker's MAX_QUEUE_NAME, so every
# name a queue can be given today is shown whole. Longer ones (queues an older EZRA created)
# are cut and marked with a digest of the whole name, which keeps two such labels apart.
NAME_SHOWN = 256


def shown_name(name: bytes) -> bytes:
    """A queue name as /metrics and the dashboard show it: whole, or cut to NAME_SHOWN bytes."""
    if len(name) <= NAME_SHOWN:
        return name
    digest = hashlib.sha256(name).hexdigest()[:12]
    return name[:NAME_SHOWN] + f"…[{len(name)} bytes, sha256 {digest}]".encode()
