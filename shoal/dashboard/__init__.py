"""HTTP: the scheduler's web dashboard (pages, a JSON API, pushed updates), Prometheus
``/metrics``, the workers' HTTP ports and performance reports.

Importing this package imports no web framework: the server (``app.py``, aiohttp)
is imported only when a dashboard port is opened, so the scheduler and worker cores
never see it. One module per concern:

- ``auth``: one-time login links and session cookies (HMAC over the cluster token)
- ``links``: the dashboard's URL (the link template, the login link)
- ``api``: the JSON views of the scheduler's counters, each O(page)
- ``deltas``, ``lanes``, ``push``: the pushed updates, encoded once per tick
- ``app``: the aiohttp application (routes, auth, GET only)
- ``metrics``: Prometheus text for scheduler and worker; ``serve_metrics``: /metrics-only sites
- ``performance_report``: one self-contained HTML file of the work done in a block
"""
