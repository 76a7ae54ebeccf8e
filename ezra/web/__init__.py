"""The HTTP side of a server (--http-port): server.py is the listener (/healthz,
/metrics, the dashboard's pages and its static/ files), metrics.py the Prometheus
exposition, dashboard.py the HTML pages; both read the broker's figures from one
snapshot (Broker.figures), as INFO does. These modules may import the core's
public pieces (lifecycle, storage, errors, gate, server, humanize); the core never
imports from here, except app.py, which starts the listener only when --http-port
is given (so prometheus_client is never loaded without it).
"""
