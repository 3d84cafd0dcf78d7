"""Opening and closing the scheduler's dashboard: the web framework is imported only
here, when a dashboard port is opened (``shoal/dashboard/app.py``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from shoal.server.monitor import Monitor

if TYPE_CHECKING:
    from shoal.server.scheduler import Scheduler

logger = logging.getLogger("shoal.scheduler")


async def start_dashboard(s: Scheduler) -> None:
    from shoal.core.scheduler.model import parse_host
    from shoal.dashboard.app import Dashboard
    from shoal.dashboard.links import parse_address

    assert s.dashboard_address is not None
    host, port = parse_address(s.dashboard_address, s.host)
    s.monitor = Monitor(s.traffic, s.loop_latency)
    s.monitor.start()
    s.dashboard = Dashboard(s, host, port, s.security.token)
    s.dashboard_port = await s.dashboard.start()
    logger.info("dashboard at http://%s:%d/status", parse_host(s.address), s.dashboard_port)


async def stop_dashboard(s: Scheduler) -> None:
    if s.monitor is not None:
        s.monitor.stop()
    if s.dashboard is not None:
        await s.dashboard.stop()
        s.dashboard = None
