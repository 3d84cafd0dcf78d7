"""``client.dashboard_link`` and ``cluster.dashboard_link``: the scheduler's dashboard
as users open it (``shoal/dashboard/links.py``)."""

from __future__ import annotations

from typing import Any


def dashboard_link_for(scheduler_address: str, port: int, security: Any) -> str | None:
    """The link to the dashboard on ``port`` of the scheduler's host (None: no
    dashboard); a one-time login link when ``security`` holds a token."""
    if not port or not scheduler_address:
        return None
    from shoal.core.scheduler.model import parse_host
    from shoal.dashboard.links import dashboard_link

    token = getattr(security, "token", None)
    return dashboard_link(parse_host(scheduler_address), port, token)


def client_dashboard_link(client: Any) -> str | None:
    return dashboard_link_for(client.scheduler_address, client.dashboard_port, client.security)
